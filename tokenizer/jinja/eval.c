/* The evaluator: statements write text, expressions make values, with jinja2's scoping (a for loop's
 * body is a fresh scope on every iteration; if does not make one; a macro sees the template's top
 * level), its undefined values (falsy, print as nothing, an error to look into), and the filters,
 * tests, methods and globals in builtins.c. */
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/jinja/render.h"
#include "tokenizer/jinja/jinja.h"
#include "tokenizer/jinja/jinja_int.h"

struct tllm_jinja {
    struct jj_arena a; /* the tree, the tokens, the source copy */
    struct jj_node *root;
    char *name;
};

int jj_fail(struct jj_render *R, const struct jj_node *at, const char *fmt, ...) {
    if (R->failed) return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(R->err, sizeof R->err, "%s:%d:%d: %s", R->name, at ? at->line : 0, at ? at->col : 0, msg);
    R->failed = 1;
    return -1;
}

int jj_nomem(struct jj_render *R, const struct jj_node *at) {
    if (R->failed) return -1; /* a failure reported as NULL by a helper: the first message stands */
    R->nomem = 1;
    return jj_fail(R, at, "out of memory (the template's limit is %u MiB)", (unsigned)(TLLM_JINJA_MAX_MEMORY >> 20));
}

static int emit(struct jj_render *R, const struct jj_node *at, const char *p, size_t n) {
    if (R->out->len + n > TLLM_JINJA_MAX_OUTPUT)
        return jj_fail(R, at, "the rendering is longer than %u MiB", (unsigned)(TLLM_JINJA_MAX_OUTPUT >> 20));
    if (tllm_buf_append(R->out, p, n)) return jj_nomem(R, at);
    return 0;
}

int jj_charge(struct jj_render *R, const struct jj_node *at, size_t bytes) {
    R->steps += (long)(bytes / 256);
    if (R->steps > TLLM_JINJA_MAX_STEPS) return jj_fail(R, at, "the template ran longer than %ld steps", (long)TLLM_JINJA_MAX_STEPS);
    return 0;
}

/* ---- scopes ---- */
struct jj_frame {
    struct jj_frame *parent;
    struct jj_dict vars;
};

static struct jj_frame *frame_new(struct jj_render *R, struct jj_frame *parent) {
    struct jj_frame *f = jj_alloc(&R->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static int frame_set(struct jj_render *R, struct jj_frame *f, const char *name, size_t n, struct jj_val v,
                     const struct jj_node *at) {
    if (jj_dict_set(&R->a, &f->vars, jj_str(name, n), v)) return jj_nomem(R, at);
    return 0;
}

static struct jj_val lookup(struct jj_render *R, struct jj_frame *f, const char *name, size_t n) {
    for (; f; f = f->parent) {
        struct jj_val *v = jj_dict_get(&f->vars, name, n);
        if (v) return *v;
    }
    struct jj_val g;
    if (jj_global(R, name, n, &g)) return g;
    return (struct jj_val){.kind = JV_UNDEF, .u.s = {name, n}};
}

/* ---- expressions ---- */

int jj_eval(struct jj_render *R, struct jj_frame *f, const struct jj_node *e, struct jj_val *out);

struct jj_val jj_undefined_hint(struct jj_render *R, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *p = jj_strdup(&R->a, msg, strlen(msg));
    return (struct jj_val){.kind = JV_UNDEF, .sub = p != NULL, .u.s = {p, p ? strlen(p) : 0}};
}

int jj_undefined_error(struct jj_render *R, const struct jj_node *at, struct jj_val v) {
    if (v.sub && v.u.s.p) return jj_fail(R, at, "%s", v.u.s.p);
    if (v.u.s.p) return jj_fail(R, at, "'%.*s' is undefined", (int)(v.u.s.n > 80 ? 80 : v.u.s.n), v.u.s.p);
    return jj_fail(R, at, "a value is undefined");
}

static int checked_int(struct jj_render *R, const struct jj_node *at, int ovf, long long r, struct jj_val *out) {
    if (ovf) return jj_fail(R, at, "integer overflow");
    *out = jj_int(r);
    return 0;
}

static int is_num(struct jj_val v) { return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT; }
static int is_intlike(struct jj_val v) { return v.kind == JV_BOOL || v.kind == JV_INT; }
static long long ival(struct jj_val v) { return v.kind == JV_INT ? v.u.i : v.u.b; }
static double fval(struct jj_val v) { return v.kind == JV_FLOAT ? v.u.f : (double)ival(v); }

/* Python's ordering for numbers, strings and sequences; -2 where it has none */
int jj_compare(struct jj_val a, struct jj_val b) {
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return (ival(a) > ival(b)) - (ival(a) < ival(b));
        double x = fval(a), y = fval(b);
        return (x > y) - (x < y);
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        return c ? (c > 0) - (c < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jj_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return jj_compare(a.u.l->v[i], b.u.l->v[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    return -2;
}

int jj_contains(struct jj_render *R, const struct jj_node *at, struct jj_val hay, struct jj_val x, int *res) {
    switch (hay.kind) {
    case JV_STR:
        if (x.kind != JV_STR) return jj_fail(R, at, "'in <string>' requires a string, not %s", jj_kind_name(x));
        if (jj_charge(R, at, hay.u.s.n)) return -1;
        if (!x.u.s.n) return *res = 1, 0;
        *res = 0;
        for (size_t i = 0; i + x.u.s.n <= hay.u.s.n && !*res; i++)
            *res = !memcmp(hay.u.s.p + i, x.u.s.p, x.u.s.n);
        return 0;
    case JV_LIST:
        *res = 0;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++) *res = jj_equal(hay.u.l->v[i], x);
        return 0;
    case JV_DICT: *res = jj_dict_find(hay.u.d, x) != NULL; return 0;
    case JV_UNDEF: *res = 0; return 0;
    default: return jj_fail(R, at, "argument of type '%s' is not iterable", jj_kind_name(hay));
    }
}

int jj_new_str(struct jj_render *R, const struct jj_node *at, const char *p, size_t n, struct jj_val *out) {
    char *s = jj_strdup(&R->a, p, n);
    if (!s) return jj_nomem(R, at);
    *out = jj_str(s, n);
    return 0;
}

static int binop(struct jj_render *R, const struct jj_node *e, struct jj_val a, struct jj_val b, struct jj_val *out) {
    int op = e->op;
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">",
                                        ">=", "in", "not in"};
    if (op == OP_EQ || op == OP_NE) {
        *out = jj_bool(jj_equal(a, b) == (op == OP_EQ));
        return 0;
    }
    if (op == OP_IN || op == OP_NOTIN) {
        int r;
        if (jj_contains(R, e, b, a, &r)) return -1;
        *out = jj_bool(r == (op == OP_IN));
        return 0;
    }
    if (op == OP_CONCAT) {
        struct tllm_buf s = {0};
        if (a.kind == JV_STR && b.kind == JV_STR && a.u.s.n + b.u.s.n > TLLM_JINJA_MAX_OUTPUT)
            return jj_fail(R, e, "a string longer than %u MiB", (unsigned)(TLLM_JINJA_MAX_OUTPUT >> 20));
        int rc = jj_to_str(a, &s) || jj_to_str(b, &s) || tllm_buf_append(&s, "", 0);
        rc = rc ? jj_nomem(R, e) : jj_new_str(R, e, s.data, s.len, out);
        tllm_buf_free(&s);
        return rc;
    }
    if (a.kind == JV_UNDEF) return jj_undefined_error(R, e, a);
    if (b.kind == JV_UNDEF) return jj_undefined_error(R, e, b);
    if (op >= OP_LT && op <= OP_GE) {
        int c = jj_compare(a, b);
        if (c == -2)
            return jj_fail(R, e, "'%s' not supported between '%s' and '%s'", names[op], jj_kind_name(a), jj_kind_name(b));
        *out = jj_bool(op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        long long r = 0;
        if (is_intlike(a) && is_intlike(b) && op != OP_DIV) {
            long long x = ival(a), y = ival(b);
            switch (op) {
            case OP_ADD: { int ovf = __builtin_add_overflow(x, y, &r); return checked_int(R, e, ovf, r, out); }
            case OP_SUB: { int ovf = __builtin_sub_overflow(x, y, &r); return checked_int(R, e, ovf, r, out); }
            case OP_MUL: { int ovf = __builtin_mul_overflow(x, y, &r); return checked_int(R, e, ovf, r, out); }
            case OP_FLOORDIV: case OP_MOD:
                if (!y) return jj_fail(R, e, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return jj_fail(R, e, "integer overflow");
                {
                    long long q = x / y, m = x % y;
                    if (m && ((m < 0) != (y < 0))) q--, m += y;
                    *out = jj_int(op == OP_MOD ? m : q);
                }
                return 0;
            case OP_POW:
                if (y >= 0) { /* by squaring: 1 ** 10**18 takes 60 steps, not 10**18 */
                    long long base = x;
                    r = 1;
                    for (long long k = y; k; k >>= 1) {
                        if ((k & 1) && __builtin_mul_overflow(r, base, &r)) return jj_fail(R, e, "integer overflow");
                        if ((k >> 1) && __builtin_mul_overflow(base, base, &base)) return jj_fail(R, e, "integer overflow");
                    }
                    *out = jj_int(r);
                    return 0;
                }
                break;
            }
        }
        double x = fval(a), y = fval(b), z;
        switch (op) {
        case OP_ADD: z = x + y; break;
        case OP_SUB: z = x - y; break;
        case OP_MUL: z = x * y; break;
        case OP_DIV:
            if (y == 0) return jj_fail(R, e, "division by zero");
            z = x / y;
            break;
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) return jj_fail(R, e, "float division or modulo by zero");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            z = op == OP_MOD ? m : (x - m) / y;
            break;
        }
        default: z = pow(x, y); break;
        }
        *out = (struct jj_val){.kind = JV_FLOAT, .u.f = z};
        return 0;
    }
    if (op == OP_ADD && a.kind == JV_STR && b.kind == JV_STR) {
        if (a.u.s.n + b.u.s.n > TLLM_JINJA_MAX_OUTPUT)
            return jj_fail(R, e, "a string longer than %u MiB", (unsigned)(TLLM_JINJA_MAX_OUTPUT >> 20));
        char *s = jj_alloc(&R->a, a.u.s.n + b.u.s.n + 1);
        if (!s) return jj_nomem(R, e);
        memcpy(s, a.u.s.p, a.u.s.n), memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
        *out = jj_str(s, a.u.s.n + b.u.s.n);
        return 0;
    }
    if (op == OP_ADD && a.kind == JV_LIST && b.kind == JV_LIST && a.sub == b.sub) {
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!l) return jj_nomem(R, e);
        for (size_t i = 0; i < a.u.l->n + b.u.l->n; i++)
            if (jj_list_push(&R->a, l, i < a.u.l->n ? a.u.l->v[i] : b.u.l->v[i - a.u.l->n])) return jj_nomem(R, e);
        *out = (struct jj_val){.kind = JV_LIST, .sub = a.sub, .u.l = l};
        return 0;
    }
    if (op == OP_MUL && ((a.kind == JV_STR && is_intlike(b)) || (b.kind == JV_STR && is_intlike(a)))) {
        struct jj_val s = a.kind == JV_STR ? a : b;
        long long k = a.kind == JV_STR ? ival(b) : ival(a);
        if (k <= 0 || !s.u.s.n) return *out = jj_str("", 0), 0;
        if ((unsigned long long)k > TLLM_JINJA_MAX_OUTPUT / s.u.s.n) return jj_fail(R, e, "the repeated string is too long");
        char *p = jj_alloc(&R->a, s.u.s.n * (size_t)k + 1);
        if (!p) return jj_nomem(R, e);
        for (long long i = 0; i < k; i++) memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        *out = jj_str(p, s.u.s.n * (size_t)k);
        return 0;
    }
    if (op == OP_MUL && ((a.kind == JV_LIST && is_intlike(b)) || (b.kind == JV_LIST && is_intlike(a)))) {
        struct jj_val l = a.kind == JV_LIST ? a : b;
        long long k = a.kind == JV_LIST ? ival(b) : ival(a);
        struct jj_list *r = jj_alloc(&R->a, sizeof *r);
        if (!r) return jj_nomem(R, e);
        if (k > 0 && l.u.l->n && (unsigned long long)k > (TLLM_JINJA_MAX_OUTPUT / 8) / l.u.l->n)
            return jj_fail(R, e, "the repeated list is too long");
        for (long long i = 0; i < k; i++)
            for (size_t j = 0; j < l.u.l->n; j++)
                if (jj_list_push(&R->a, r, l.u.l->v[j])) return jj_nomem(R, e);
        *out = (struct jj_val){.kind = JV_LIST, .sub = l.sub, .u.l = r};
        return 0;
    }
    if (op == OP_MOD && a.kind == JV_STR) return jj_fail(R, e, "'%%' string formatting is not supported");
    return jj_fail(R, e, "unsupported operand types for %s: '%s' and '%s'", names[op], jj_kind_name(a), jj_kind_name(b));
}

/* Python's slice indices for a sequence of n items */
static void slice_indices(long long n, const struct jj_val *sv, long long *start, long long *stop, long long *step) {
    *step = sv[2].kind == JV_INT ? sv[2].u.i : 1;
    long long lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    if (sv[0].kind == JV_INT) {
        *start = sv[0].u.i < 0 ? sv[0].u.i + n : sv[0].u.i;
        *start = *start < lo ? lo : *start > hi ? hi : *start;
    } else {
        *start = *step < 0 ? hi : lo;
    }
    if (sv[1].kind == JV_INT) {
        *stop = sv[1].u.i < 0 ? sv[1].u.i + n : sv[1].u.i;
        *stop = *stop < lo ? lo : *stop > hi ? hi : *stop;
    } else {
        *stop = *step < 0 ? lo : hi;
    }
}

/* byte offsets of each code point of s (n + 1 entries) */
size_t *jj_cp_offsets(struct jj_render *R, struct jj_val s, size_t *ncp) {
    if (jj_charge(R, NULL, s.u.s.n)) return NULL;
    size_t n = jj_utf8_len(s.u.s.p, s.u.s.n);
    size_t *o = jj_alloc(&R->a, (n + 1) * sizeof *o);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.p[i] & 0xC0) != 0x80) o[k++] = i;
    o[n] = s.u.s.n;
    *ncp = n;
    return o;
}

/* the byte offset of code point k of s (its length when k is the count) */
static size_t cp_byte(struct jj_val s, size_t k) {
    size_t i = 0;
    for (; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.p[i] & 0xC0) != 0x80 && k-- == 0) return i;
    return s.u.s.n;
}

static int do_slice(struct jj_render *R, const struct jj_node *e, struct jj_val obj, const struct jj_val *sv,
                    struct jj_val *out) {
    for (int i = 0; i < 3; i++)
        if (sv[i].kind != JV_INT && sv[i].kind != JV_NONE && sv[i].kind != JV_UNDEF)
            return jj_fail(R, e, "slice indices must be integers or none");
    if (sv[2].kind == JV_INT && sv[2].u.i == 0) return jj_fail(R, e, "slice step cannot be zero");
    long long start, stop, step;
    if (obj.kind == JV_LIST) {
        slice_indices((long long)obj.u.l->n, sv, &start, &stop, &step);
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!l) return jj_nomem(R, e);
        for (long long i = start; step > 0 ? i < stop : i > stop; i += step)
            if (jj_list_push(&R->a, l, obj.u.l->v[i])) return jj_nomem(R, e);
        *out = (struct jj_val){.kind = JV_LIST, .sub = obj.sub, .u.l = l};
        return 0;
    }
    if (obj.kind == JV_STR && (sv[2].kind != JV_INT || sv[2].u.i == 1)) { /* contiguous: two offsets, no table */
        if (jj_charge(R, e, obj.u.s.n)) return -1;
        slice_indices((long long)jj_utf8_len(obj.u.s.p, obj.u.s.n), sv, &start, &stop, &step);
        if (stop <= start) return *out = jj_str("", 0), 0;
        size_t b = cp_byte(obj, (size_t)start), end = cp_byte(obj, (size_t)stop);
        *out = jj_str(obj.u.s.p + b, end - b);
        return 0;
    }
    if (obj.kind == JV_STR) {
        size_t ncp;
        size_t *off = jj_cp_offsets(R, obj, &ncp);
        if (!off) return jj_nomem(R, e);
        slice_indices((long long)ncp, sv, &start, &stop, &step);
        char *p = jj_alloc(&R->a, obj.u.s.n + 1);
        if (!p) return jj_nomem(R, e);
        size_t k = 0;
        for (long long i = start; step > 0 ? i < stop : i > stop; i += step) {
            size_t b = off[i], len = off[i + 1] - b;
            memcpy(p + k, obj.u.s.p + b, len);
            k += len;
        }
        *out = jj_str(p, k);
        return 0;
    }
    if (obj.kind == JV_UNDEF) return jj_undefined_error(R, e, obj);
    return jj_fail(R, e, "'%s' object cannot be sliced", jj_kind_name(obj));
}

int jj_getitem(struct jj_render *R, const struct jj_node *e, struct jj_val obj, struct jj_val key, struct jj_val *out) {
    *out = (struct jj_val){.kind = JV_UNDEF};
    switch (obj.kind) {
    case JV_UNDEF: return jj_undefined_error(R, e, obj);
    case JV_DICT: {
        struct jj_val *v = jj_dict_find(obj.u.d, key);
        if (v) *out = *v;
        else if (key.kind == JV_STR) return jj_getattr(R, e, obj, key.u.s.p, key.u.s.n, out);
        return 0;
    }
    case JV_LIST:
        if (is_intlike(key)) {
            long long i = ival(key), n = (long long)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) *out = obj.u.l->v[i];
            else *out = jj_undefined_hint(R, "%s object has no element %lld", obj.sub ? "tuple" : "list", ival(key));
        }
        return 0;
    case JV_STR:
        if (is_intlike(key)) { /* the i-th code point, walked to (no table of offsets for one index) */
            if (jj_charge(R, e, obj.u.s.n)) return -1;
            size_t ncp = jj_utf8_len(obj.u.s.p, obj.u.s.n);
            long long i = ival(key);
            if (i < 0) i += (long long)ncp;
            if (i >= 0 && i < (long long)ncp) {
                size_t b = cp_byte(obj, (size_t)i), end = cp_byte(obj, (size_t)i + 1);
                *out = jj_str(obj.u.s.p + b, end - b);
            }
        } else if (key.kind == JV_STR) {
            return jj_getattr(R, e, obj, key.u.s.p, key.u.s.n, out);
        }
        return 0;
    default: return 0;
    }
}

static int eval_args(struct jj_render *R, struct jj_frame *f, const struct jj_node *e, struct jj_args *a) {
    memset(a, 0, sizeof *a);
    a->n = e->n_kids, a->nkw = e->n_kw;
    a->v = jj_alloc(&R->a, (size_t)(e->n_kids + e->n_kw + 1) * sizeof *a->v);
    if (!a->v) return jj_nomem(R, e);
    a->kwv = a->v + e->n_kids;
    a->kw = e->kw, a->kwl = e->kw_len;
    for (int i = 0; i < e->n_kids; i++)
        if (jj_eval(R, f, e->kids[i], &a->v[i])) return -1;
    for (int i = 0; i < e->n_kw; i++)
        if (jj_eval(R, f, e->alt[i], &a->kwv[i])) return -1;
    return 0;
}

static int exec_body(struct jj_render *R, struct jj_frame *f, struct jj_node *const *kids, int n);

/* {% set x %}...{% endset %} and macro bodies: the body's output as a string */
static int capture(struct jj_render *R, struct jj_frame *f, const struct jj_node *body, struct jj_val *out) {
    struct tllm_buf b = {0}, *saved = R->out;
    R->out = &b;
    int rc = exec_body(R, f, body->kids, body->n_kids);
    R->out = saved;
    if (!rc) rc = jj_new_str(R, body, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

int jj_call_macro(struct jj_render *R, const struct jj_node *at, const struct jj_node *m, const struct jj_args *a,
                  struct jj_val *out) {
    int np = m->n_kids + m->n_kw; /* parameters: plain names, then those with defaults */
    if (a->n > np)
        return jj_fail(R, at, "macro '%.*s' takes at most %d arguments (%d given)", (int)m->name_len, m->name, np, a->n);
    if (R->depth >= TLLM_JINJA_MAX_DEPTH) return jj_fail(R, at, "macro calls nested deeper than %d", TLLM_JINJA_MAX_DEPTH);
    struct jj_frame *f = frame_new(R, R->root);
    if (!f) return jj_nomem(R, at);
    for (int i = 0; i < np; i++) {
        const char *pn = i < m->n_kids ? m->kids[i]->name : m->kw[i - m->n_kids];
        size_t pl = i < m->n_kids ? m->kids[i]->name_len : m->kw_len[i - m->n_kids];
        struct jj_val v = {.kind = JV_UNDEF, .u.s = {pn, pl}};
        int given = 0;
        if (i < a->n) v = a->v[i], given = 1;
        for (int k = 0; k < a->nkw; k++)
            if (a->kwl[k] == pl && !memcmp(a->kw[k], pn, pl)) {
                if (given) return jj_fail(R, at, "macro got two values for '%.*s'", (int)pl, pn);
                v = a->kwv[k], given = 1;
            }
        if (!given && i >= m->n_kids && jj_eval(R, f, m->alt[i - m->n_kids], &v)) return -1;
        if (frame_set(R, f, pn, pl, v, at)) return -1;
    }
    for (int k = 0; k < a->nkw; k++) {
        int known = 0;
        for (int i = 0; i < np && !known; i++) {
            size_t pl = i < m->n_kids ? m->kids[i]->name_len : m->kw_len[i - m->n_kids];
            const char *pn = i < m->n_kids ? m->kids[i]->name : m->kw[i - m->n_kids];
            known = a->kwl[k] == pl && !memcmp(a->kw[k], pn, pl);
        }
        if (!known)
            return jj_fail(R, at, "macro '%.*s' has no parameter '%.*s'", (int)m->name_len, m->name, (int)a->kwl[k], a->kw[k]);
    }
    R->depth++;
    int rc = capture(R, f, m->a, out);
    R->depth--;
    return rc;
}

int jj_eval(struct jj_render *R, struct jj_frame *f, const struct jj_node *e, struct jj_val *out) {
    if (++R->steps > TLLM_JINJA_MAX_STEPS) return jj_fail(R, e, "the template ran longer than %ld steps", (long)TLLM_JINJA_MAX_STEPS);
    struct jj_val a, b;
    switch (e->kind) {
    case E_LIT: *out = e->lit; return 0;
    case E_NAME: *out = lookup(R, f, e->name, e->name_len); return 0;
    case E_ATTR:
        if (jj_eval(R, f, e->a, &a)) return -1;
        if (a.kind == JV_UNDEF) return jj_undefined_error(R, e, a);
        return jj_getattr(R, e, a, e->name, e->name_len, out);
    case E_ITEM:
        if (jj_eval(R, f, e->a, &a) || jj_eval(R, f, e->b, &b)) return -1;
        return jj_getitem(R, e, a, b, out);
    case E_SLICE: {
        struct jj_val sv[3] = {{.kind = JV_NONE}, {.kind = JV_NONE}, {.kind = JV_NONE}};
        if (jj_eval(R, f, e->a, &a)) return -1;
        for (int i = 0; i < 3; i++)
            if (e->kids[i] && jj_eval(R, f, e->kids[i], &sv[i])) return -1;
        return do_slice(R, e, a, sv, out);
    }
    case E_CALL: {
        struct jj_args args;
        if (jj_eval(R, f, e->a, &a) || eval_args(R, f, e, &args)) return -1;
        if (a.kind == JV_MACRO) return jj_call_macro(R, e, a.u.m, &args, out);
        if (a.kind == JV_FUNC) return jj_call_builtin(R, e, a, &args, out);
        if (a.kind == JV_UNDEF) return jj_undefined_error(R, e, a);
        return jj_fail(R, e, "'%s' object is not callable", jj_kind_name(a));
    }
    case E_FILTER: {
        struct jj_args args;
        if (jj_eval(R, f, e->a, &a) || eval_args(R, f, e, &args)) return -1;
        return jj_filter(R, e, a, &args, out);
    }
    case E_TEST: {
        struct jj_args args;
        if (jj_eval(R, f, e->a, &a) || eval_args(R, f, e, &args)) return -1;
        int r;
        if (jj_test(R, e, a, &args, &r)) return -1;
        *out = jj_bool(r != e->op);
        return 0;
    }
    case E_BIN:
        if (jj_eval(R, f, e->a, &a) || jj_eval(R, f, e->b, &b)) return -1;
        return binop(R, e, a, b, out);
    case E_NEG: case E_POS:
        if (jj_eval(R, f, e->a, &a)) return -1;
        if (a.kind == JV_FLOAT) *out = (struct jj_val){.kind = JV_FLOAT, .u.f = e->kind == E_NEG ? -a.u.f : a.u.f};
        else if (is_intlike(a)) {
            if (e->kind == E_NEG && ival(a) == INT64_MIN) return jj_fail(R, e, "integer overflow");
            *out = jj_int(e->kind == E_NEG ? -ival(a) : ival(a));
        } else if (a.kind == JV_UNDEF) return jj_undefined_error(R, e, a);
        else return jj_fail(R, e, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', jj_kind_name(a));
        return 0;
    case E_NOT:
        if (jj_eval(R, f, e->a, &a)) return -1;
        *out = jj_bool(!jj_truthy(a));
        return 0;
    case E_AND: case E_OR:
        if (jj_eval(R, f, e->a, &a)) return -1;
        if (jj_truthy(a) == (e->kind == E_OR)) return *out = a, 0;
        return jj_eval(R, f, e->b, out);
    case E_COND:
        if (jj_eval(R, f, e->b, &b)) return -1;
        if (jj_truthy(b)) return jj_eval(R, f, e->a, out);
        if (e->c) return jj_eval(R, f, e->c, out);
        *out = (struct jj_val){.kind = JV_UNDEF};
        return 0;
    case E_LIST: case E_TUPLE: {
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!l) return jj_nomem(R, e);
        for (int i = 0; i < e->n_kids; i++)
            if (jj_eval(R, f, e->kids[i], &a) || jj_list_push(&R->a, l, a)) return R->failed ? -1 : jj_nomem(R, e);
        *out = (struct jj_val){.kind = JV_LIST, .sub = e->kind == E_TUPLE, .u.l = l};
        return 0;
    }
    case E_DICT: {
        struct jj_dict *d = jj_alloc(&R->a, sizeof *d);
        if (!d) return jj_nomem(R, e);
        for (int i = 0; i < e->n_kids; i++) {
            if (jj_eval(R, f, e->kids[i], &a) || jj_eval(R, f, e->alt[i], &b)) return -1;
            if (jj_dict_set(&R->a, d, a, b)) return jj_nomem(R, e);
        }
        *out = (struct jj_val){.kind = JV_DICT, .u.d = d};
        return 0;
    }
    default: return jj_fail(R, e, "not an expression");
    }
}

/* ---- statements ---- */

int jj_iterate(struct jj_render *R, const struct jj_node *at, struct jj_val v, struct jj_list **out) {
    static struct jj_list empty;
    switch (v.kind) {
    case JV_LIST: *out = v.u.l; return 0;
    case JV_UNDEF: *out = &empty; return 0;
    case JV_DICT: {
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!l) return jj_nomem(R, at);
        for (size_t i = 0; i < v.u.d->n; i++)
            if (jj_list_push(&R->a, l, v.u.d->k[i])) return jj_nomem(R, at);
        *out = l;
        return 0;
    }
    case JV_STR: {
        size_t ncp;
        size_t *off = jj_cp_offsets(R, v, &ncp);
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!off || !l) return jj_nomem(R, at);
        for (size_t i = 0; i < ncp; i++)
            if (jj_list_push(&R->a, l, jj_str(v.u.s.p + off[i], off[i + 1] - off[i]))) return jj_nomem(R, at);
        *out = l;
        return 0;
    }
    default: return jj_fail(R, at, "'%s' object is not iterable", jj_kind_name(v));
    }
}

static int assign(struct jj_render *R, struct jj_frame *f, const struct jj_node *s, struct jj_val v) {
    if (s->n_kw == 1) return frame_set(R, f, s->kw[0], s->kw_len[0], v, s);
    struct jj_list *items;
    if (v.kind == JV_UNDEF || v.kind == JV_NONE || v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL)
        return jj_fail(R, s, "cannot unpack a '%s' into %d names", jj_kind_name(v), s->n_kw);
    if (jj_iterate(R, s, v, &items)) return -1;
    if (items->n != (size_t)s->n_kw)
        return jj_fail(R, s, "cannot unpack %zu values into %d names", items->n, s->n_kw);
    for (int i = 0; i < s->n_kw; i++)
        if (frame_set(R, f, s->kw[i], s->kw_len[i], items->v[i], s)) return -1;
    return 0;
}

/* jinja2's loop object: one per loop, its fields updated as the loop advances */
static int loop_update(struct jj_render *R, const struct jj_node *at, struct jj_dict *d, struct jj_list *items, size_t i) {
    long long n = (long long)items->n, k = (long long)i;
    struct { const char *name; struct jj_val v; } kv[] = {
        {"index", jj_int(k + 1)}, {"index0", jj_int(k)}, {"revindex", jj_int(n - k)}, {"revindex0", jj_int(n - k - 1)},
        {"first", jj_bool(k == 0)}, {"last", jj_bool(k == n - 1)}, {"length", jj_int(n)},
        {"previtem", k > 0 ? items->v[k - 1] : (struct jj_val){.kind = JV_UNDEF}},
        {"nextitem", k + 1 < n ? items->v[k + 1] : (struct jj_val){.kind = JV_UNDEF}},
    };
    for (size_t j = 0; j < sizeof kv / sizeof kv[0]; j++)
        if (jj_dict_set(&R->a, d, jj_str(kv[j].name, strlen(kv[j].name)), kv[j].v)) return jj_nomem(R, at);
    return 0;
}

static int exec_for(struct jj_render *R, struct jj_frame *f, const struct jj_node *s) {
    struct jj_val it;
    struct jj_list *items;
    if (jj_eval(R, f, s->a, &it) || jj_iterate(R, s, it, &items)) return -1;
    if (s->b) { /* {% for x in xs if cond %}: filtered first, so loop.length counts what runs */
        struct jj_list *kept = jj_alloc(&R->a, sizeof *kept);
        if (!kept) return jj_nomem(R, s);
        for (size_t i = 0; i < items->n; i++) {
            if (++R->steps > TLLM_JINJA_MAX_STEPS)
                return jj_fail(R, s, "the template ran longer than %ld steps", (long)TLLM_JINJA_MAX_STEPS);
            struct jj_frame *g = frame_new(R, f);
            struct jj_val c;
            if (!g) return jj_nomem(R, s);
            if (assign(R, g, s, items->v[i]) || jj_eval(R, g, s->b, &c)) return -1;
            if (jj_truthy(c) && jj_list_push(&R->a, kept, items->v[i])) return jj_nomem(R, s);
        }
        items = kept;
    }
    /* The body's scope starts empty on every iteration (what it sets does not last into the next); the
     * frame's storage is reused, as nothing keeps a reference to a frame. */
    struct jj_frame *g = frame_new(R, f);
    struct jj_dict *loop = jj_alloc(&R->a, sizeof *loop);
    if (!g || !loop) return jj_nomem(R, s);
    for (size_t i = 0; i < items->n; i++) {
        if (++R->steps > TLLM_JINJA_MAX_STEPS)
            return jj_fail(R, s, "the template ran longer than %ld steps", (long)TLLM_JINJA_MAX_STEPS);
        g->vars.n = 0;
        if (assign(R, g, s, items->v[i]) || loop_update(R, s, loop, items, i) ||
            frame_set(R, g, "loop", 4, (struct jj_val){.kind = JV_DICT, .u.d = loop}, s))
            return -1;
        if (exec_body(R, g, s->kids, s->n_kids)) return -1;
        if (R->ctl == 1) {
            R->ctl = 0;
            break;
        }
        R->ctl = 0;
    }
    if (!items->n && s->n_alt) return exec_body(R, f, s->alt, s->n_alt);
    return 0;
}

static int exec_stmt(struct jj_render *R, struct jj_frame *f, const struct jj_node *s) {
    if (++R->steps > TLLM_JINJA_MAX_STEPS) return jj_fail(R, s, "the template ran longer than %ld steps", (long)TLLM_JINJA_MAX_STEPS);
    struct jj_val v;
    switch (s->kind) {
    case N_TEXT: return emit(R, s, s->name, s->name_len);
    case N_OUTPUT: {
        if (jj_eval(R, f, s->a, &v)) return -1;
        if (v.kind == JV_STR) return emit(R, s, v.u.s.p, v.u.s.n);
        struct tllm_buf b = {0};
        int rc = jj_to_str(v, &b) ? jj_nomem(R, s) : emit(R, s, b.data ? b.data : "", b.len);
        tllm_buf_free(&b);
        return rc;
    }
    case N_IF:
        if (jj_eval(R, f, s->a, &v)) return -1;
        return jj_truthy(v) ? exec_body(R, f, s->kids, s->n_kids) : exec_body(R, f, s->alt, s->n_alt);
    case N_FOR: return exec_for(R, f, s);
    case N_SET:
        if (jj_eval(R, f, s->a, &v)) return -1;
        if (s->op) { /* ns.attr = v */
            struct jj_val ns = lookup(R, f, s->name, s->name_len);
            if (ns.kind != JV_DICT || !ns.sub)
                return jj_fail(R, s, "cannot assign an attribute of '%.*s', which is not a namespace", (int)s->name_len, s->name);
            if (jj_dict_set(&R->a, ns.u.d, jj_str(s->kw[0], s->kw_len[0]), v)) return jj_nomem(R, s);
            return 0;
        }
        return assign(R, f, s, v);
    case N_SETBLOCK: {
        struct jj_node body = *s;
        body.kind = N_BLOCK;
        if (capture(R, f, &body, &v)) return -1;
        return frame_set(R, f, s->kw[0], s->kw_len[0], v, s);
    }
    case N_MACRO: return frame_set(R, f, s->name, s->name_len, (struct jj_val){.kind = JV_MACRO, .u.m = s}, s);
    case N_BREAK: R->ctl = 1; return 0;
    case N_CONTINUE: R->ctl = 2; return 0;
    case N_BLOCK: return exec_body(R, f, s->kids, s->n_kids);
    default: return jj_fail(R, s, "not a statement");
    }
}

static int exec_body(struct jj_render *R, struct jj_frame *f, struct jj_node *const *kids, int n) {
    for (int i = 0; i < n && !R->ctl; i++)
        if (exec_stmt(R, f, kids[i])) return -1;
    return 0;
}

/* ---- the variables, from JSON ---- */

static int from_json(struct jj_render *R, struct json_object *o, struct jj_val *out, int depth) {
    if (depth > 200) return jj_fail(R, NULL, "the variables are nested deeper than 200");
    switch (json_object_get_type(o)) {
    case json_type_null: *out = (struct jj_val){.kind = JV_NONE}; return 0;
    case json_type_boolean: *out = jj_bool(json_object_get_boolean(o)); return 0;
    case json_type_int: *out = jj_int((long long)json_object_get_int64(o)); return 0;
    case json_type_double: *out = (struct jj_val){.kind = JV_FLOAT, .u.f = json_object_get_double(o)}; return 0;
    case json_type_string: *out = jj_str(json_object_get_string(o), (size_t)json_object_get_string_len(o)); return 0;
    case json_type_array: {
        struct jj_list *l = jj_alloc(&R->a, sizeof *l);
        if (!l) return jj_nomem(R, NULL);
        for (size_t i = 0; i < json_object_array_length(o); i++) {
            struct jj_val v;
            if (from_json(R, json_object_array_get_idx(o, i), &v, depth + 1)) return -1;
            if (jj_list_push(&R->a, l, v)) return jj_nomem(R, NULL);
        }
        *out = (struct jj_val){.kind = JV_LIST, .u.l = l};
        return 0;
    }
    case json_type_object: {
        struct jj_dict *d = jj_alloc(&R->a, sizeof *d);
        if (!d) return jj_nomem(R, NULL);
        json_object_object_foreach(o, k, v) {
            struct jj_val x;
            if (from_json(R, v, &x, depth + 1)) return -1;
            if (jj_dict_set(&R->a, d, jj_str(k, strlen(k)), x)) return jj_nomem(R, NULL);
        }
        *out = (struct jj_val){.kind = JV_DICT, .u.d = d};
        return 0;
    }
    }
    return jj_fail(R, NULL, "a variable of an unknown JSON type");
}

/* ---- the public entry points ---- */

int tllm_jinja_parse(const char *text, size_t len, const char *name, struct tllm_jinja **out) {
    *out = NULL;
    struct tllm_jinja *t = calloc(1, sizeof *t);
    if (!t) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    t->a.limit = TLLM_JINJA_MAX_MEMORY;
    char err[512] = "";
    struct jj_tokens toks = {0};
    char *src = jj_strdup(&t->a, text, len);
    t->name = jj_strdup(&t->a, name ? name : "template", strlen(name ? name : "template"));
    if (!src || !t->name) {
        jj_arena_free(&t->a);
        free(t);
        return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    if (jj_lex(src, len, &t->a, &toks, err, sizeof err, t->name) || jj_parse(&toks, &t->a, &t->root, err, sizeof err, t->name)) {
        jj_arena_free(&t->a);
        free(t);
        return tllm_fail(TLLM_ERR_FORMAT, "%s", err[0] ? err : "the template could not be parsed");
    }
    *out = t;
    return TLLM_OK;
}

int tllm_jinja_render(const struct tllm_jinja *t, struct json_object *vars, struct tllm_buf *out) {
    struct jj_render R = {.out = out, .name = t->name};
    R.a.limit = TLLM_JINJA_MAX_MEMORY;
    int rc = -1;
    if ((R.root = frame_new(&R, NULL))) {
        rc = 0;
        if (vars && json_object_is_type(vars, json_type_object)) {
            json_object_object_foreach(vars, k, v) {
                struct jj_val x;
                if ((rc = from_json(&R, v, &x, 0))) break;
                if ((rc = frame_set(&R, R.root, k, strlen(k), x, NULL))) break;
            }
        }
        if (!rc) rc = exec_body(&R, R.root, t->root->kids, t->root->n_kids);
        if (!rc && !out->data && tllm_buf_append(out, "", 0)) rc = jj_nomem(&R, NULL);
    } else {
        R.nomem = 1;
    }
    jj_arena_free(&R.a);
    if (!rc) return TLLM_OK;
    if (R.nomem && !R.failed) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return tllm_fail(R.nomem ? TLLM_ERR_NOMEM : TLLM_ERR_ARG, "%s", R.err);
}

void tllm_jinja_free(struct tllm_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->a);
    free(t);
}
