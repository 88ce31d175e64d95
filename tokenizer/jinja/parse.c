/* The parser: tokens into a syntax tree, by jinja2's grammar and precedence (or, and, not, comparisons,
 * + -, ~, * / // %, **, unary, postfix . [] (), filters | and tests is). */
#include <stdio.h>
#include <string.h>

#include "tokenizer/jinja/jinja.h"
#include "tokenizer/jinja/jinja_int.h"

struct parser {
    const struct jj_token *t;
    size_t i, n;
    struct jj_arena *a;
    char *err;
    size_t errlen;
    const char *name;
    int depth;
};

struct nlist {
    struct jj_node **v;
    int n, cap;
};

static int fail_at(struct parser *P, const struct jj_token *t, const char *fmt, const char *arg) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    snprintf(P->err, P->errlen, "%s:%d:%d: %s", P->name, t->line, t->col, msg);
    return -1;
}
#define FAIL(P, fmt, arg) (fail_at((P), (P)->t + (P)->i, (fmt), (arg)), (struct jj_node *)NULL)

static const struct jj_token *cur(struct parser *P) { return P->t + P->i; }
static int is_op(struct parser *P, const char *op) {
    const struct jj_token *t = cur(P);
    return t->kind == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}
static int is_name(struct parser *P, const char *nm) {
    const struct jj_token *t = cur(P);
    return t->kind == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n);
}
static int name_at(struct parser *P, size_t k, const char *nm) {
    const struct jj_token *t = P->t + k;
    return k < P->n && t->kind == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n);
}
static void next(struct parser *P) {
    if (P->i + 1 < P->n) P->i++;
}
static int expect_op(struct parser *P, const char *op) {
    if (!is_op(P, op)) return fail_at(P, cur(P), "expected '%s'", op);
    next(P);
    return 0;
}

static struct jj_node *node(struct parser *P, enum jj_nkind k, const struct jj_token *at) {
    struct jj_node *n = jj_alloc(P->a, sizeof *n);
    if (!n) return FAIL(P, "out of memory%s", NULL);
    n->kind = k, n->line = at->line, n->col = at->col;
    return n;
}

static int nl_push(struct parser *P, struct nlist *l, struct jj_node *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        struct jj_node **v = jj_alloc(P->a, (size_t)cap * sizeof *v);
        if (!v) return fail_at(P, cur(P), "out of memory%s", NULL);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = n;
    return 0;
}

static struct jj_node *parse_expr(struct parser *P, int with_cond);
static struct jj_node *parse_or(struct parser *P);
static struct jj_node *parse_unary(struct parser *P, int with_filter);
static struct jj_node *parse_primary(struct parser *P);
static struct jj_node *parse_postfix(struct parser *P, struct jj_node *n);

static int enter(struct parser *P) {
    if (++P->depth > TLLM_JINJA_MAX_DEPTH) return fail_at(P, cur(P), "nested too deeply%s", NULL);
    return 0;
}

/* (args, name=value, ...) after the '(' */
static int parse_args(struct parser *P, struct jj_node *call) {
    struct nlist pos = {0}, kwv = {0};
    const char **kw = NULL;
    size_t *kwl = NULL;
    int nkw = 0, capkw = 0;
    next(P); /* ( */
    while (!is_op(P, ")")) {
        if (pos.n + nkw && expect_op(P, ",")) return -1;
        if (is_op(P, ")")) break; /* a trailing comma */
        if (cur(P)->kind == T_NAME && P->i + 1 < P->n && P->t[P->i + 1].kind == T_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].p[0] == '=') {
            if (nkw == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                const char **k2 = jj_alloc(P->a, (size_t)capkw * sizeof *k2);
                size_t *l2 = jj_alloc(P->a, (size_t)capkw * sizeof *l2);
                if (!k2 || !l2) return fail_at(P, cur(P), "out of memory%s", NULL);
                if (nkw) memcpy(k2, kw, (size_t)nkw * sizeof *kw), memcpy(l2, kwl, (size_t)nkw * sizeof *kwl);
                kw = k2, kwl = l2;
            }
            kw[nkw] = cur(P)->p, kwl[nkw] = cur(P)->n;
            nkw++;
            next(P), next(P);
            struct jj_node *v = parse_expr(P, 1);
            if (!v || nl_push(P, &kwv, v)) return -1;
        } else {
            if (is_op(P, "*") || is_op(P, "**")) return fail_at(P, cur(P), "*args and **kwargs are not supported%s", NULL);
            if (nkw) return fail_at(P, cur(P), "a positional argument after a keyword argument%s", NULL);
            struct jj_node *v = parse_expr(P, 1);
            if (!v || nl_push(P, &pos, v)) return -1;
        }
    }
    next(P); /* ) */
    call->kids = pos.v, call->n_kids = pos.n;
    call->alt = kwv.v, call->n_alt = kwv.n;
    call->kw = kw, call->kw_len = kwl, call->n_kw = nkw;
    return 0;
}

static struct jj_node *parse_filter_expr(struct parser *P, struct jj_node *n) {
    for (;;) {
        const struct jj_token *at = cur(P);
        if (is_op(P, "|")) {
            next(P);
            if (cur(P)->kind != T_NAME) return FAIL(P, "expected a filter name after '|'%s", NULL);
            struct jj_node *f = node(P, E_FILTER, at);
            if (!f) return NULL;
            f->name = cur(P)->p, f->name_len = cur(P)->n, f->a = n;
            next(P);
            if (is_op(P, "(") && parse_args(P, f)) return NULL;
            n = f;
        } else if (is_name(P, "is")) {
            next(P);
            struct jj_node *t = node(P, E_TEST, at);
            if (!t) return NULL;
            if (is_name(P, "not")) t->op = 1, next(P);
            if (cur(P)->kind != T_NAME) return FAIL(P, "expected a test name after 'is'%s", NULL);
            t->name = cur(P)->p, t->name_len = cur(P)->n, t->a = n;
            next(P);
            const struct jj_token *c = cur(P);
            if (is_op(P, "(")) {
                if (parse_args(P, t)) return NULL;
            } else if ((c->kind == T_NAME || c->kind == T_STR || c->kind == T_INT || c->kind == T_FLOAT ||
                        is_op(P, "(") || is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) return FAIL(P, "tests cannot be chained with 'is'%s", NULL);
                struct jj_node *arg = parse_primary(P);
                if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
                t->kids = jj_alloc(P->a, sizeof *t->kids);
                if (!t->kids) return FAIL(P, "out of memory%s", NULL);
                t->kids[0] = arg, t->n_kids = 1;
            }
            n = t;
        } else if (is_op(P, "(")) {
            struct jj_node *c2 = node(P, E_CALL, at);
            if (!c2) return NULL;
            c2->a = n, c2->line = n->line, c2->col = n->col;
            if (parse_args(P, c2)) return NULL;
            n = c2;
        } else {
            return n;
        }
    }
}

static struct jj_node *parse_subscript(struct parser *P, struct jj_node *obj, const struct jj_token *at) {
    next(P); /* [ */
    struct jj_node *parts[3] = {0};
    int is_slice = 0;
    if (is_op(P, ":")) {
        is_slice = 1;
    } else {
        if (!(parts[0] = parse_expr(P, 1))) return NULL;
        if (is_op(P, ",")) { /* a tuple key: x[a, b] */
            return FAIL(P, "tuple subscripts are not supported%s", NULL);
        }
        if (is_op(P, ":")) is_slice = 1;
    }
    if (is_slice) {
        next(P); /* the first : */
        if (!is_op(P, ":") && !is_op(P, "]") && !(parts[1] = parse_expr(P, 1))) return NULL;
        if (is_op(P, ":")) {
            next(P);
            if (!is_op(P, "]") && !(parts[2] = parse_expr(P, 1))) return NULL;
        }
    }
    if (expect_op(P, "]")) return NULL;
    struct jj_node *n = node(P, is_slice ? E_SLICE : E_ITEM, at);
    if (!n) return NULL;
    n->a = obj;
    if (is_slice) {
        n->kids = jj_alloc(P->a, 3 * sizeof *n->kids);
        if (!n->kids) return FAIL(P, "out of memory%s", NULL);
        memcpy(n->kids, parts, sizeof parts);
        n->n_kids = 3;
    } else {
        n->b = parts[0];
    }
    return n;
}

static struct jj_node *parse_postfix(struct parser *P, struct jj_node *n) {
    for (;;) {
        const struct jj_token *at = cur(P);
        if (is_op(P, ".")) {
            next(P);
            const struct jj_token *t = cur(P);
            struct jj_node *m;
            if (t->kind == T_NAME) {
                if (!(m = node(P, E_ATTR, at))) return NULL;
                m->name = t->p, m->name_len = t->n;
            } else if (t->kind == T_INT) { /* x.0 is x[0] */
                if (!(m = node(P, E_ITEM, at)) || !(m->b = node(P, E_LIT, t))) return NULL;
                m->b->lit = jj_int(t->i);
            } else {
                return FAIL(P, "expected a name after '.'%s", NULL);
            }
            m->a = n;
            next(P);
            n = m;
        } else if (is_op(P, "[")) {
            if (!(n = parse_subscript(P, n, at))) return NULL;
        } else if (is_op(P, "(")) {
            struct jj_node *c = node(P, E_CALL, at);
            if (!c) return NULL;
            c->a = n, c->line = n->line, c->col = n->col;
            if (parse_args(P, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

/* [a, b], (a, b), {k: v}: items until the closer, a trailing comma allowed */
static struct jj_node *parse_seq(struct parser *P, enum jj_nkind k, const char *close, const struct jj_token *at) {
    struct jj_node *n = node(P, k, at);
    struct nlist items = {0}, vals = {0};
    if (!n) return NULL;
    next(P);
    while (!is_op(P, close)) {
        if (items.n && expect_op(P, ",")) return NULL;
        if (is_op(P, close)) break;
        struct jj_node *e = parse_expr(P, 1);
        if (!e || nl_push(P, &items, e)) return NULL;
        if (k == E_DICT) {
            if (expect_op(P, ":")) return NULL;
            struct jj_node *v = parse_expr(P, 1);
            if (!v || nl_push(P, &vals, v)) return NULL;
        }
        if (k == E_TUPLE && items.n == 1 && is_op(P, close)) { /* (x) is x */
            next(P);
            return items.v[0];
        }
    }
    next(P);
    n->kids = items.v, n->n_kids = items.n, n->alt = vals.v, n->n_alt = vals.n;
    return n;
}

static struct jj_node *parse_primary(struct parser *P) {
    const struct jj_token *t = cur(P);
    struct jj_node *n;
    if (enter(P)) return NULL;
    if (t->kind == T_NAME) {
        if (!(n = node(P, E_LIT, t))) return NULL;
#define KW(s) (t->n == strlen(s) && !memcmp(t->p, s, t->n))
        if (KW("true") || KW("True")) n->lit = jj_bool(1);
        else if (KW("false") || KW("False")) n->lit = jj_bool(0);
        else if (KW("none") || KW("None")) n->lit.kind = JV_NONE;
        else n->kind = E_NAME, n->name = t->p, n->name_len = t->n;
#undef KW
        next(P);
    } else if (t->kind == T_STR) {
        if (!(n = node(P, E_LIT, t))) return NULL;
        n->lit = jj_str(t->p, t->n);
        next(P);
        if (cur(P)->kind == T_STR) { /* adjacent literals join */
            struct tllm_buf b = {0};
            int bad = tllm_buf_append(&b, t->p, t->n) != 0;
            for (; cur(P)->kind == T_STR; next(P)) bad |= tllm_buf_append(&b, cur(P)->p, cur(P)->n) != 0;
            char *s = bad ? NULL : jj_strdup(P->a, b.data, b.len);
            size_t len = b.len;
            tllm_buf_free(&b);
            if (!s) return FAIL(P, "out of memory%s", NULL);
            n->lit = jj_str(s, len);
        }
    } else if (t->kind == T_INT || t->kind == T_FLOAT) {
        if (!(n = node(P, E_LIT, t))) return NULL;
        if (t->kind == T_INT) n->lit = jj_int(t->i);
        else n->lit.kind = JV_FLOAT, n->lit.u.f = t->f;
        next(P);
    } else if (is_op(P, "(")) {
        n = parse_seq(P, E_TUPLE, ")", t);
    } else if (is_op(P, "[")) {
        n = parse_seq(P, E_LIST, "]", t);
    } else if (is_op(P, "{")) {
        n = parse_seq(P, E_DICT, "}", t);
    } else {
        n = FAIL(P, t->kind == T_VAR_END || t->kind == T_BLOCK_END || t->kind == T_EOF ? "expected an expression%s"
                                                                                         : "unexpected token%s",
                 NULL);
    }
    P->depth--;
    return n;
}

static struct jj_node *parse_unary(struct parser *P, int with_filter) {
    const struct jj_token *at = cur(P);
    struct jj_node *n;
    if (enter(P)) return NULL;
    if (is_op(P, "-") || is_op(P, "+")) {
        enum jj_nkind k = is_op(P, "-") ? E_NEG : E_POS;
        next(P);
        struct jj_node *x = parse_unary(P, 0);
        if (!x || !(n = node(P, k, at))) return NULL;
        n->a = x;
    } else if (!(n = parse_primary(P))) {
        return NULL;
    }
    if (!(n = parse_postfix(P, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(P, n))) return NULL;
    P->depth--;
    return n;
}

static struct jj_node *binary(struct parser *P, int op, struct jj_node *l, struct jj_node *r,
                              const struct jj_token *at) {
    if (!l || !r) return NULL;
    struct jj_node *n = node(P, op ? E_BIN : E_AND, at);
    if (!n) return NULL;
    n->op = op, n->a = l, n->b = r;
    return n;
}

static struct jj_node *parse_pow(struct parser *P) {
    struct jj_node *l = parse_unary(P, 1);
    while (l && is_op(P, "**")) {
        const struct jj_token *at = cur(P);
        next(P);
        l = binary(P, OP_POW, l, parse_unary(P, 1), at);
    }
    return l;
}

static struct jj_node *parse_math2(struct parser *P) {
    struct jj_node *l = parse_pow(P);
    for (;;) {
        const struct jj_token *at = cur(P);
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
                 : is_op(P, "%") ? OP_MOD : 0;
        if (!l || !op) return l;
        next(P);
        l = binary(P, op, l, parse_pow(P), at);
    }
}

static struct jj_node *parse_concat(struct parser *P) {
    struct jj_node *l = parse_math2(P);
    while (l && is_op(P, "~")) {
        const struct jj_token *at = cur(P);
        next(P);
        l = binary(P, OP_CONCAT, l, parse_math2(P), at);
    }
    return l;
}

static struct jj_node *parse_math1(struct parser *P) {
    struct jj_node *l = parse_concat(P);
    for (;;) {
        const struct jj_token *at = cur(P);
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : 0;
        if (!l || !op) return l;
        next(P);
        l = binary(P, op, l, parse_concat(P), at);
    }
}

static struct jj_node *parse_compare(struct parser *P) {
    struct jj_node *l = parse_math1(P);
    for (;;) {
        const struct jj_token *at = cur(P);
        int op = is_op(P, "==") ? OP_EQ : is_op(P, "!=") ? OP_NE : is_op(P, "<") ? OP_LT : is_op(P, "<=") ? OP_LE
                 : is_op(P, ">") ? OP_GT : is_op(P, ">=") ? OP_GE : is_name(P, "in") ? OP_IN : 0;
        if (!op && is_name(P, "not") && name_at(P, P->i + 1, "in")) {
            op = OP_NOTIN;
            next(P);
        }
        if (!l || !op) return l;
        next(P);
        l = binary(P, op, l, parse_math1(P), at);
    }
}

static struct jj_node *parse_not(struct parser *P) {
    if (is_name(P, "not")) {
        const struct jj_token *at = cur(P);
        next(P);
        if (enter(P)) return NULL;
        struct jj_node *x = parse_not(P), *n;
        P->depth--;
        if (!x || !(n = node(P, E_NOT, at))) return NULL;
        n->a = x;
        return n;
    }
    return parse_compare(P);
}

static struct jj_node *parse_and(struct parser *P) {
    struct jj_node *l = parse_not(P);
    while (l && is_name(P, "and")) {
        const struct jj_token *at = cur(P);
        next(P);
        l = binary(P, 0, l, parse_not(P), at);
    }
    return l;
}

static struct jj_node *parse_or(struct parser *P) {
    struct jj_node *l = parse_and(P);
    while (l && is_name(P, "or")) {
        const struct jj_token *at = cur(P);
        next(P);
        struct jj_node *r = parse_and(P), *n;
        if (!r || !(n = node(P, E_OR, at))) return NULL;
        n->a = l, n->b = r;
        l = n;
    }
    return l;
}

static struct jj_node *parse_expr(struct parser *P, int with_cond) {
    if (enter(P)) return NULL;
    struct jj_node *e = parse_or(P);
    while (e && with_cond && is_name(P, "if")) {
        const struct jj_token *at = cur(P);
        next(P);
        struct jj_node *n = node(P, E_COND, at);
        if (!n || !(n->b = parse_or(P))) return NULL;
        n->a = e;
        if (is_name(P, "else")) {
            next(P);
            if (!(n->c = parse_expr(P, 1))) return NULL;
        }
        e = n;
    }
    P->depth--;
    return e;
}

/* a, b = ... or a bare expression list (an implicit tuple) */
static struct jj_node *parse_tuple_expr(struct parser *P) {
    const struct jj_token *at = cur(P);
    struct jj_node *e = parse_expr(P, 1);
    if (!e || !is_op(P, ",")) return e;
    struct nlist items = {0};
    if (nl_push(P, &items, e)) return NULL;
    while (is_op(P, ",")) {
        next(P);
        if (cur(P)->kind == T_BLOCK_END || cur(P)->kind == T_VAR_END) break;
        if (!(e = parse_expr(P, 1)) || nl_push(P, &items, e)) return NULL;
    }
    struct jj_node *t = node(P, E_TUPLE, at);
    if (!t) return NULL;
    t->kids = items.v, t->n_kids = items.n;
    return t;
}

/* ---- statements ---- */

static int parse_body(struct parser *P, const char *const *until, struct nlist *out);

static int expect_end(struct parser *P) {
    if (cur(P)->kind != T_BLOCK_END) return fail_at(P, cur(P), "expected '%%}'%s", NULL);
    next(P);
    return 0;
}

/* {% NAME %} closing a block: checks the name, consumes the tag */
static int close_tag(struct parser *P, const char *name) {
    if (!is_name(P, name)) return fail_at(P, cur(P), "expected '%s'", name);
    next(P);
    return expect_end(P);
}

/* {% else %} BODY (optional) into n's else body, then {% END %} */
static int else_and_end(struct parser *P, struct jj_node *n, const char *end) {
    if (is_name(P, "else")) {
        const char *until[] = {end, NULL};
        struct nlist alt = {0};
        next(P);
        if (expect_end(P) || parse_body(P, until, &alt)) return -1;
        n->alt = alt.v, n->n_alt = alt.n;
    }
    return close_tag(P, end);
}

static int parse_targets(struct parser *P, struct jj_node *n) {
    int cap = 0;
    do {
        if (n->n_kw) next(P); /* , */
        if (cur(P)->kind != T_NAME) return fail_at(P, cur(P), "expected a variable name%s", NULL);
        if (n->n_kw == cap) {
            cap = cap ? cap * 2 : 2;
            const char **k = jj_alloc(P->a, (size_t)cap * sizeof *k);
            size_t *l = jj_alloc(P->a, (size_t)cap * sizeof *l);
            if (!k || !l) return fail_at(P, cur(P), "out of memory%s", NULL);
            if (n->n_kw) memcpy(k, n->kw, (size_t)n->n_kw * sizeof *k), memcpy(l, n->kw_len, (size_t)n->n_kw * sizeof *l);
            n->kw = k, n->kw_len = l;
        }
        n->kw[n->n_kw] = cur(P)->p, n->kw_len[n->n_kw] = cur(P)->n;
        n->n_kw++;
        next(P);
    } while (is_op(P, ","));
    return 0;
}

static struct jj_node *parse_stmt(struct parser *P) {
    const struct jj_token *at = cur(P); /* the name after {% */
    struct jj_node *n;
    if (at->kind != T_NAME) return FAIL(P, "expected a tag name after '{%%'%s", NULL);
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(at->n < 31 ? at->n : 31), at->p);
    next(P);
    if (!strcmp(tag, "if") || !strcmp(tag, "elif")) {
        static const char *const until[] = {"elif", "else", "endif", NULL};
        if (!(n = node(P, N_IF, at)) || !(n->a = parse_expr(P, 1)) || expect_end(P)) return NULL;
        struct nlist body = {0}, alt = {0};
        if (parse_body(P, until, &body)) return NULL;
        n->kids = body.v, n->n_kids = body.n;
        if (is_name(P, "elif")) {
            struct jj_node *e = parse_stmt(P); /* consumes through endif */
            if (!e || nl_push(P, &alt, e)) return NULL;
            n->alt = alt.v, n->n_alt = alt.n;
            return n;
        }
        return else_and_end(P, n, "endif") ? NULL : n;
    }
    if (!strcmp(tag, "for")) {
        static const char *const until[] = {"else", "endfor", NULL};
        if (!(n = node(P, N_FOR, at))) return NULL;
        int paren = is_op(P, "(");
        if (paren) next(P);
        if (parse_targets(P, n) || (paren && expect_op(P, ")"))) return NULL;
        if (!is_name(P, "in")) return FAIL(P, "expected 'in'%s", NULL);
        next(P);
        if (!(n->a = parse_expr(P, 0))) return NULL;
        if (is_name(P, "if")) {
            next(P);
            if (!(n->b = parse_expr(P, 0))) return NULL;
        }
        if (is_name(P, "recursive")) return FAIL(P, "recursive loops are not supported%s", NULL);
        struct nlist body = {0};
        if (expect_end(P) || parse_body(P, until, &body)) return NULL;
        n->kids = body.v, n->n_kids = body.n;
        return else_and_end(P, n, "endfor") ? NULL : n;
    }
    if (!strcmp(tag, "set")) {
        if (!(n = node(P, N_SET, at))) return NULL;
        if (cur(P)->kind == T_NAME && P->i + 2 < P->n && P->t[P->i + 1].kind == T_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].p[0] == '.') { /* ns.attr = value */
            n->op = 1;
            n->name = cur(P)->p, n->name_len = cur(P)->n;
            next(P), next(P);
            if (cur(P)->kind != T_NAME) return FAIL(P, "expected an attribute name%s", NULL);
            n->kw = jj_alloc(P->a, sizeof *n->kw);
            n->kw_len = jj_alloc(P->a, sizeof *n->kw_len);
            if (!n->kw || !n->kw_len) return FAIL(P, "out of memory%s", NULL);
            n->kw[0] = cur(P)->p, n->kw_len[0] = cur(P)->n, n->n_kw = 1;
            next(P);
        } else if (parse_targets(P, n)) {
            return NULL;
        }
        if (cur(P)->kind == T_BLOCK_END) { /* {% set x %}...{% endset %} */
            static const char *const until[] = {"endset", NULL};
            struct nlist body = {0};
            if (n->op || n->n_kw != 1) return FAIL(P, "a block set takes one variable name%s", NULL);
            n->kind = N_SETBLOCK;
            if (expect_end(P) || parse_body(P, until, &body)) return NULL;
            n->kids = body.v, n->n_kids = body.n;
            return close_tag(P, "endset") ? NULL : n;
        }
        if (expect_op(P, "=") || !(n->a = parse_tuple_expr(P)) || expect_end(P)) return NULL;
        return n;
    }
    if (!strcmp(tag, "macro")) {
        static const char *const until[] = {"endmacro", NULL};
        if (!(n = node(P, N_MACRO, at))) return NULL;
        if (cur(P)->kind != T_NAME) return FAIL(P, "expected the macro's name%s", NULL);
        n->name = cur(P)->p, n->name_len = cur(P)->n;
        next(P);
        if (!is_op(P, "(")) return FAIL(P, "expected '(' after the macro's name%s", NULL);
        /* parameters: names, some with = default; kept as a call's arguments would be */
        struct jj_node params = {0};
        if (parse_args(P, &params)) return NULL;
        for (int i = 0; i < params.n_kids; i++)
            if (params.kids[i]->kind != E_NAME) return FAIL(P, "a macro parameter must be a name%s", NULL);
        n->kids = params.kids, n->n_kids = params.n_kids;
        n->kw = params.kw, n->kw_len = params.kw_len, n->n_kw = params.n_kw;
        n->alt = params.alt, n->n_alt = params.n_alt;
        struct nlist body = {0};
        if (expect_end(P) || parse_body(P, until, &body)) return NULL;
        n->a = node(P, N_BLOCK, at);
        if (!n->a) return NULL;
        n->a->kids = body.v, n->a->n_kids = body.n;
        return close_tag(P, "endmacro") ? NULL : n;
    }
    if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!(n = node(P, tag[0] == 'b' ? N_BREAK : N_CONTINUE, at)) || expect_end(P)) return NULL;
        return n;
    }
    if (!strcmp(tag, "generation")) { /* transformers' assistant-mask marker: renders its body */
        static const char *const until[] = {"endgeneration", NULL};
        struct nlist body = {0};
        if (!(n = node(P, N_BLOCK, at)) || expect_end(P) || parse_body(P, until, &body)) return NULL;
        n->kids = body.v, n->n_kids = body.n;
        return close_tag(P, "endgeneration") ? NULL : n;
    }
    fail_at(P, at, "unknown or unsupported tag '%s'", tag);
    return NULL;
}

static int parse_body(struct parser *P, const char *const *until, struct nlist *out) {
    if (enter(P)) return -1;
    for (;;) {
        const struct jj_token *t = cur(P);
        if (t->kind == T_EOF) {
            if (until) {
                const char *end = until[0];
                for (int k = 0; until[k]; k++)
                    if (!strncmp(until[k], "end", 3)) end = until[k];
                return fail_at(P, t, "missing '{%% %s %%}' at the end of the template", end);
            }
            break;
        }
        struct jj_node *n = NULL;
        if (t->kind == T_TEXT) {
            if (!(n = node(P, N_TEXT, t))) return -1;
            n->name = t->p, n->name_len = t->n;
            next(P);
        } else if (t->kind == T_VAR_BEGIN) {
            next(P);
            if (!(n = node(P, N_OUTPUT, t)) || !(n->a = parse_tuple_expr(P))) return -1;
            if (cur(P)->kind != T_VAR_END) return fail_at(P, cur(P), "expected '}}'%s", NULL);
            next(P);
        } else if (t->kind == T_BLOCK_BEGIN) {
            const struct jj_token *nm = t + 1;
            if (until && nm->kind == T_NAME)
                for (int k = 0; until[k]; k++)
                    if (nm->n == strlen(until[k]) && !memcmp(nm->p, until[k], nm->n)) {
                        next(P); /* leave the closing tag's name current */
                        P->depth--;
                        return 0;
                    }
            next(P);
            if (nm->kind == T_NAME && ((nm->n >= 3 && !memcmp(nm->p, "end", 3)) ||
                                       (nm->n == 4 && (!memcmp(nm->p, "elif", 4) || !memcmp(nm->p, "else", 4))))) {
                snprintf(P->err, P->errlen, "%s:%d:%d: unexpected '%.*s'", P->name, nm->line, nm->col,
                         (int)(nm->n < 40 ? nm->n : 40), nm->p);
                return -1;
            }
            if (!(n = parse_stmt(P))) return -1;
        } else {
            return fail_at(P, t, "unexpected token%s", NULL);
        }
        if (nl_push(P, out, n)) return -1;
    }
    P->depth--;
    return 0;
}

int jj_parse(const struct jj_tokens *toks, struct jj_arena *a, struct jj_node **root, char *err, size_t errlen,
             const char *name) {
    struct parser P = {.t = toks->v, .n = toks->n, .a = a, .err = err, .errlen = errlen, .name = name};
    struct nlist body = {0};
    if (parse_body(&P, NULL, &body)) return -1;
    struct jj_node *r = node(&P, N_BLOCK, toks->v);
    if (!r) return -1;
    r->kids = body.v, r->n_kids = body.n;
    *root = r;
    return 0;
}
