/* The state of one rendering, shared by the evaluator (eval.c) and the builtins (builtins.c). */
#ifndef TLLM_JINJA_RENDER_H
#define TLLM_JINJA_RENDER_H

#include "tokenizer/jinja/jinja_int.h"

struct jj_frame;
struct jj_render {
    struct jj_arena a;
    struct tllm_buf *out; /* where text goes (swapped while a macro or a block set captures) */
    const char *name;     /* the template's, for messages */
    struct jj_frame *root;
    long steps;
    int depth;            /* macro calls */
    int ctl;              /* 1 break, 2 continue */
    int failed, nomem;
    char err[512];
};

/* a call's arguments: n positional, then nkw keyword (names kw[i] of kwl[i] bytes) */
struct jj_args {
    int n, nkw;
    struct jj_val *v, *kwv;
    const char **kw;
    size_t *kwl;
};

/* eval.c */
int jj_fail(struct jj_render *R, const struct jj_node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int jj_nomem(struct jj_render *R, const struct jj_node *at);
/* work on a long string counts as steps (a step per 256 bytes), so repeating it is bounded too */
int jj_charge(struct jj_render *R, const struct jj_node *at, size_t bytes);
/* an undefined value whose use fails with this message */
struct jj_val jj_undefined_hint(struct jj_render *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jj_undefined_error(struct jj_render *R, const struct jj_node *at, struct jj_val v);
int jj_compare(struct jj_val a, struct jj_val b); /* -1 0 1, or -2 where Python has no order */
int jj_contains(struct jj_render *R, const struct jj_node *at, struct jj_val hay, struct jj_val x, int *res);
int jj_new_str(struct jj_render *R, const struct jj_node *at, const char *p, size_t n, struct jj_val *out);
size_t *jj_cp_offsets(struct jj_render *R, struct jj_val s, size_t *ncp);
int jj_getitem(struct jj_render *R, const struct jj_node *at, struct jj_val obj, struct jj_val key, struct jj_val *out);
int jj_iterate(struct jj_render *R, const struct jj_node *at, struct jj_val v, struct jj_list **out);
int jj_call_macro(struct jj_render *R, const struct jj_node *at, const struct jj_node *m, const struct jj_args *a,
                  struct jj_val *out);

/* builtins.c */
int jj_global(struct jj_render *R, const char *name, size_t n, struct jj_val *out); /* 1 when it exists */
int jj_getattr(struct jj_render *R, const struct jj_node *at, struct jj_val obj, const char *name, size_t n,
               struct jj_val *out);
int jj_call_builtin(struct jj_render *R, const struct jj_node *at, struct jj_val fn, const struct jj_args *a,
                    struct jj_val *out);
int jj_filter(struct jj_render *R, const struct jj_node *at, struct jj_val in, const struct jj_args *a,
              struct jj_val *out);
int jj_test(struct jj_render *R, const struct jj_node *at, struct jj_val in, const struct jj_args *a, int *res);

#endif
