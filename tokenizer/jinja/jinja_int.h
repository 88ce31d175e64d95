/* The interpreter's insides: an arena, values, the syntax tree. Shared by lex/parse/value/eval. */
#ifndef TLLM_JINJA_INT_H
#define TLLM_JINJA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* ---- arena: every parse and every rendering allocates from one, freed at once ---- */
struct jj_chunk;
struct jj_arena {
    struct jj_chunk *head;
    size_t total, limit;
};
void *jj_alloc(struct jj_arena *a, size_t n); /* zeroed; NULL past the limit or out of memory */
char *jj_strdup(struct jj_arena *a, const char *s, size_t n);
void jj_arena_free(struct jj_arena *a);

/* ---- values (passed by value; lists and dicts by reference) ---- */
enum jj_kind { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_MACRO, JV_FUNC };
struct jj_list;
struct jj_dict;
struct jj_node;
struct jj_val {
    enum jj_kind kind;
    int sub; /* JV_LIST: 1 for a tuple; JV_DICT: 1 for a namespace; JV_FUNC: the builtin's id */
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;                       /* JV_STR; JV_UNDEF: the name that was undefined (may be NULL) */
        struct jj_list *l;
        struct jj_dict *d;
        const struct jj_node *m;   /* JV_MACRO */
        struct jj_val *self;       /* JV_FUNC: a method's object (NULL for a global function) */
    } u;
};
struct jj_list {
    struct jj_val *v;
    size_t n, cap;
};
struct jj_dict {
    struct jj_val *k, *v;
    size_t n, cap;
};

/* ---- the syntax tree ---- */
enum jj_nkind {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG, E_POS, E_NOT, E_AND, E_OR,
    E_COND, E_LIST, E_TUPLE, E_DICT,
};
/* binary operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE,
       OP_GT, OP_GE, OP_IN, OP_NOTIN };

struct jj_node {
    enum jj_nkind kind;
    int op;        /* E_BIN: OP_*; E_TEST: 1 when negated; N_SET: 1 for a namespace attribute target */
    int line, col;
    const char *name; /* E_NAME/E_ATTR/E_FILTER/E_TEST/N_MACRO/N_SET: the name; N_TEXT: the text */
    size_t name_len;
    struct jj_val lit;                 /* E_LIT */
    struct jj_node *a, *b, *c;         /* operands; N_IF/N_FOR: a = condition/iterable, b = loop filter */
    struct jj_node **kids;             /* bodies, arguments, items, dict keys */
    int n_kids;
    struct jj_node **alt;              /* N_IF/N_FOR: the else body; E_DICT: values; calls: keyword values */
    int n_alt;
    const char **kw; size_t *kw_len;   /* calls, filters, macros: keyword names (alt holds the values);
                                          N_FOR/N_SET: the target names (n_kw of them) */
    int n_kw;
};

/* ---- lexer ---- */
enum jj_tok { T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
struct jj_token {
    enum jj_tok kind;
    int line, col;
    const char *p; /* T_TEXT/T_NAME/T_OP: into the source or the arena; T_STR: unescaped, in the arena */
    size_t n;
    long long i;
    double f;
};
struct jj_tokens {
    struct jj_token *v;
    size_t n, cap;
};
/* Split a template into tokens, whitespace control applied. Errors into err (NAME:LINE:COL: ...). */
int jj_lex(const char *src, size_t len, struct jj_arena *a, struct jj_tokens *out, char *err, size_t errlen,
           const char *name);

/* the parser: the template's statements (kids of one N_BLOCK) */
int jj_parse(const struct jj_tokens *toks, struct jj_arena *a, struct jj_node **root, char *err, size_t errlen,
             const char *name);

/* ---- values ---- */
struct jj_val jj_str(const char *p, size_t n);
struct jj_val jj_int(long long i);
struct jj_val jj_bool(int b);
int jj_truthy(struct jj_val v);
int jj_equal(struct jj_val a, struct jj_val b);
int jj_list_push(struct jj_arena *a, struct jj_list *l, struct jj_val v);
int jj_dict_set(struct jj_arena *a, struct jj_dict *d, struct jj_val k, struct jj_val v);
struct jj_val *jj_dict_get(const struct jj_dict *d, const char *key, size_t n);
struct jj_val *jj_dict_find(const struct jj_dict *d, struct jj_val k);
/* str() as Python writes it (repr inside containers) */
int jj_to_str(struct jj_val v, struct tllm_buf *b);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys) */
int jj_to_json(struct jj_val v, int indent, int sort_keys, struct tllm_buf *b, int depth);
/* float as Python's repr writes it */
void jj_float_repr(double f, char out[40]);
const char *jj_kind_name(struct jj_val v);
size_t jj_utf8_len(const char *p, size_t n);

#endif
