/* Values: the arena they live in, equality and truth as Python has them, str()/repr() and
 * json.dumps(ensure_ascii=False) as Python writes them (transformers' tojson). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja/jinja_int.h"

struct jj_chunk {
    struct jj_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jj_alloc(struct jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    struct jj_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (a->total + cap > a->limit) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head, c->used = 0, c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *jj_strdup(struct jj_arena *a, const char *s, size_t n) {
    char *p = jj_alloc(a, n + 1);
    if (p) memcpy(p, s, n), p[n] = '\0';
    return p;
}

void jj_arena_free(struct jj_arena *a) {
    for (struct jj_chunk *c = a->head, *nx; c; c = nx) nx = c->next, free(c);
    a->head = NULL, a->total = 0;
}

struct jj_val jj_str(const char *p, size_t n) { return (struct jj_val){.kind = JV_STR, .u.s = {p, n}}; }
struct jj_val jj_int(long long i) { return (struct jj_val){.kind = JV_INT, .u.i = i}; }
struct jj_val jj_bool(int b) { return (struct jj_val){.kind = JV_BOOL, .u.b = !!b}; }

int jj_truthy(struct jj_val v) {
    switch (v.kind) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.sub == 1 || v.u.d->n != 0; /* a namespace is an object: always true */
    default: return 1;
    }
}

static int is_num(struct jj_val v) { return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT; }
static double num(struct jj_val v) {
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : (double)v.u.b;
}

int jj_equal(struct jj_val a, struct jj_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT)
            return (a.kind == JV_INT ? a.u.i : a.u.b) == (b.kind == JV_INT ? b.u.i : b.u.b);
        return num(a) == num(b);
    }
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.sub != b.sub) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jj_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.sub || b.sub) return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct jj_val *o = jj_dict_find(b.u.d, a.u.d->k[i]);
            if (!o || !jj_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.sub == b.sub && a.u.self == b.u.self;
    default: return 0;
    }
}

int jj_list_push(struct jj_arena *a, struct jj_list *l, struct jj_val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jj_val *nv = jj_alloc(a, cap * sizeof *nv);
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv, l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

struct jj_val *jj_dict_find(const struct jj_dict *d, struct jj_val k) {
    for (size_t i = 0; i < d->n; i++)
        if (jj_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

struct jj_val *jj_dict_get(const struct jj_dict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n)) return &d->v[i];
    return NULL;
}

int jj_dict_set(struct jj_arena *a, struct jj_dict *d, struct jj_val k, struct jj_val v) {
    struct jj_val *o = jj_dict_find(d, k);
    if (o) {
        *o = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct jj_val *nk = jj_alloc(a, cap * sizeof *nk), *nv = jj_alloc(a, cap * sizeof *nv);
        if (!nk || !nv) return -1;
        if (d->n) memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k, d->v[d->n] = v, d->n++;
    return 0;
}

size_t jj_utf8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

const char *jj_kind_name(struct jj_val v) {
    static const char *const names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                        "macro", "function"};
    if (v.kind == JV_LIST && v.sub) return "tuple";
    if (v.kind == JV_DICT && v.sub) return "Namespace";
    return names[v.kind];
}

void jj_float_repr(double f, char out[40]) {
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f > 0 ? "inf" : "-inf"); return; }
    /* the shortest digits that read back as f, laid out as Python's repr: fixed for 1e-4 <= |f| < 1e16 */
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *p = e + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp < -4 || exp >= 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        *o++ = '0', *o++ = '.';
        for (int i = 0; i < -exp - 1; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp + 1) {
            memcpy(o, digits + exp + 1, (size_t)(nd - exp - 1));
            o += nd - exp - 1;
        } else {
            *o++ = '0';
        }
    }
    *o = '\0';
}

/* Python's repr of a str: single quotes unless the text has ' and no " */
static int put_repr_str(struct tllm_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    int rc = tllm_buf_append(b, &q, 1);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '\\') rc = tllm_buf_puts(b, "\\\\");
        else if (c == (unsigned char)q) rc = tllm_buf_puts(b, q == '\'' ? "\\'" : "\\\"");
        else if (c == '\n') rc = tllm_buf_puts(b, "\\n");
        else if (c == '\r') rc = tllm_buf_puts(b, "\\r");
        else if (c == '\t') rc = tllm_buf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", c), rc = tllm_buf_puts(b, esc);
        else rc = tllm_buf_append(b, s + i, 1);
    }
    return rc ? rc : tllm_buf_append(b, &q, 1);
}

static int put_val(struct jj_val v, struct tllm_buf *b, int repr, int depth) {
    char tmp[48];
    if (depth > 100) return tllm_buf_puts(b, "...");
    switch (v.kind) {
    case JV_UNDEF: return repr ? tllm_buf_puts(b, "Undefined") : tllm_buf_append(b, "", 0);
    case JV_NONE: return tllm_buf_puts(b, "None");
    case JV_BOOL: return tllm_buf_puts(b, v.u.b ? "True" : "False");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", v.u.i); return tllm_buf_puts(b, tmp);
    case JV_FLOAT: jj_float_repr(v.u.f, tmp); return tllm_buf_puts(b, tmp);
    case JV_STR: return repr ? put_repr_str(b, v.u.s.p, v.u.s.n) : tllm_buf_append(b, v.u.s.p, v.u.s.n);
    case JV_LIST: {
        int rc = tllm_buf_puts(b, v.sub ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n && !rc; i++)
            rc = (i ? tllm_buf_puts(b, ", ") : 0) || put_val(v.u.l->v[i], b, 1, depth + 1);
        if (!rc && v.sub && v.u.l->n == 1) rc = tllm_buf_puts(b, ",");
        return rc ? rc : tllm_buf_puts(b, v.sub ? ")" : "]");
    }
    case JV_DICT: {
        int rc = tllm_buf_puts(b, v.sub ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n && !rc; i++)
            rc = (i ? tllm_buf_puts(b, ", ") : 0) || put_val(v.u.d->k[i], b, 1, depth + 1) || tllm_buf_puts(b, ": ") ||
                 put_val(v.u.d->v[i], b, 1, depth + 1);
        return rc ? rc : tllm_buf_puts(b, v.sub ? "}>" : "}");
    }
    case JV_MACRO: return tllm_buf_puts(b, "<Macro>");
    default: return tllm_buf_puts(b, "<function>");
    }
}

int jj_to_str(struct jj_val v, struct tllm_buf *b) { return put_val(v, b, 0, 0); }

static int put_json_str(struct tllm_buf *b, const char *s, size_t n) {
    int rc = tllm_buf_puts(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc && c < 0x20) snprintf(u, sizeof u, "\\u%04x", c), esc = u;
        if (!esc) continue;
        rc = tllm_buf_append(b, s + run, i - run) || tllm_buf_puts(b, esc);
        run = i + 1;
    }
    return rc ? rc : tllm_buf_append(b, s + run, n - run) || tllm_buf_puts(b, "\"");
}

static int newline_indent(struct tllm_buf *b, int indent, int level) {
    if (tllm_buf_puts(b, "\n")) return -1;
    for (int i = 0; i < indent * level; i++)
        if (tllm_buf_append(b, " ", 1)) return -1;
    return 0;
}

static int key_cmp(const void *x, const void *y) {
    const struct jj_val *a = *(struct jj_val *const *)x, *b = *(struct jj_val *const *)y;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

/* returns 0, -1 (out of memory), or 1 (a value JSON cannot hold: the caller names it) */
int jj_to_json(struct jj_val v, int indent, int sort_keys, struct tllm_buf *b, int depth) {
    char tmp[48];
    if (depth > 100) return 1;
    switch (v.kind) {
    case JV_NONE: return tllm_buf_puts(b, "null");
    case JV_BOOL: return tllm_buf_puts(b, v.u.b ? "true" : "false");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", v.u.i); return tllm_buf_puts(b, tmp);
    case JV_FLOAT:
        if (isnan(v.u.f)) return tllm_buf_puts(b, "NaN");
        if (isinf(v.u.f)) return tllm_buf_puts(b, v.u.f > 0 ? "Infinity" : "-Infinity");
        jj_float_repr(v.u.f, tmp);
        return tllm_buf_puts(b, tmp);
    case JV_STR: return put_json_str(b, v.u.s.p, v.u.s.n);
    case JV_LIST: {
        if (!v.u.l->n) return tllm_buf_puts(b, "[]");
        if (tllm_buf_puts(b, "[")) return -1;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && tllm_buf_puts(b, indent >= 0 ? "," : ", ")) return -1;
            if (indent >= 0 && newline_indent(b, indent, depth + 1)) return -1;
            int rc = jj_to_json(v.u.l->v[i], indent, sort_keys, b, depth + 1);
            if (rc) return rc;
        }
        if (indent >= 0 && newline_indent(b, indent, depth)) return -1;
        return tllm_buf_puts(b, "]");
    }
    case JV_DICT: {
        const struct jj_dict *d = v.u.d;
        if (!d->n) return tllm_buf_puts(b, "{}");
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].kind != JV_STR) return 1; /* keys from templates are strings in practice */
        const struct jj_val **order = malloc(d->n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < d->n; i++) order[i] = &d->k[i];
        if (sort_keys) qsort(order, d->n, sizeof *order, key_cmp);
        int rc = tllm_buf_puts(b, "{");
        for (size_t i = 0; i < d->n && !rc; i++) {
            size_t k = (size_t)(order[i] - d->k);
            if (i && tllm_buf_puts(b, indent >= 0 ? "," : ", ")) rc = -1;
            else if (indent >= 0 && newline_indent(b, indent, depth + 1)) rc = -1;
            else if (put_json_str(b, d->k[k].u.s.p, d->k[k].u.s.n) || tllm_buf_puts(b, ": ")) rc = -1;
            else rc = jj_to_json(d->v[k], indent, sort_keys, b, depth + 1);
        }
        free(order);
        if (rc) return rc;
        if (indent >= 0 && newline_indent(b, indent, depth)) return -1;
        return tllm_buf_puts(b, "}");
    }
    default: return 1;
    }
}
