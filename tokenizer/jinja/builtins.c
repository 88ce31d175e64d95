/* The builtins chat templates call: filters (x | f), tests (x is t), the methods of str and dict, and
 * the globals (range, namespace, dict, raise_exception, strftime_now), each as jinja2 and Python
 * define them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer/jinja/jinja.h"
#include "tokenizer/jinja/render.h"

#define MAX_RANGE 100000 /* jinja2's sandbox refuses longer ranges */

enum {
    F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME,
    M_ITEMS, M_KEYS, M_VALUES, M_GET,
    M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_RSPLIT, M_STRIP, M_LSTRIP, M_RSTRIP, M_UPPER, M_LOWER, M_REPLACE,
    M_TITLE, M_CAPITALIZE, M_FIND, M_COUNT, M_JOIN, M_ISDIGIT, M_ISSPACE,
};
static const struct { const char *name; int id; int on; /* 0 global, 1 dict, 2 str */ } NAMES[] = {
    {"range", F_RANGE, 0}, {"namespace", F_NAMESPACE, 0}, {"dict", F_DICT, 0}, {"raise_exception", F_RAISE, 0},
    {"strftime_now", F_STRFTIME, 0},
    {"items", M_ITEMS, 1}, {"keys", M_KEYS, 1}, {"values", M_VALUES, 1}, {"get", M_GET, 1},
    {"startswith", M_STARTSWITH, 2}, {"endswith", M_ENDSWITH, 2}, {"split", M_SPLIT, 2}, {"rsplit", M_RSPLIT, 2},
    {"strip", M_STRIP, 2}, {"lstrip", M_LSTRIP, 2}, {"rstrip", M_RSTRIP, 2}, {"upper", M_UPPER, 2},
    {"lower", M_LOWER, 2}, {"replace", M_REPLACE, 2}, {"title", M_TITLE, 2}, {"capitalize", M_CAPITALIZE, 2},
    {"find", M_FIND, 2}, {"count", M_COUNT, 2}, {"join", M_JOIN, 2}, {"isdigit", M_ISDIGIT, 2},
    {"isspace", M_ISSPACE, 2},
};

static int eq(const char *p, size_t n, const char *s) { return n == strlen(s) && !memcmp(p, s, n); }

static int find_name(const char *name, size_t n, int on) {
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].on == on && eq(name, n, NAMES[i].name)) return NAMES[i].id;
    return 0;
}

int jj_global(struct jj_render *R, const char *name, size_t n, struct jj_val *out) {
    (void)R;
    int id = find_name(name, n, 0);
    if (!id) return 0;
    *out = (struct jj_val){.kind = JV_FUNC, .sub = id};
    return 1;
}

int jj_getattr(struct jj_render *R, const struct jj_node *at, struct jj_val obj, const char *name, size_t n,
               struct jj_val *out) {
    *out = (struct jj_val){.kind = JV_UNDEF, .u.s = {name, n}};
    int on = obj.kind == JV_DICT && !obj.sub ? 1 : obj.kind == JV_STR ? 2 : -1;
    int id = on > 0 ? find_name(name, n, on) : 0;
    if (id) {
        struct jj_val *self = jj_alloc(&R->a, sizeof *self);
        if (!self) return jj_nomem(R, at);
        *self = obj;
        *out = (struct jj_val){.kind = JV_FUNC, .sub = id, .u.self = self};
        return 0;
    }
    struct jj_val *v = obj.kind == JV_DICT ? jj_dict_get(obj.u.d, name, n) : NULL;
    if (v) *out = *v;
    else
        *out = jj_undefined_hint(R, "'%s' has no attribute '%.*s'", obj.kind == JV_NONE ? "None" : obj.kind == JV_DICT && !obj.sub ? "dict object" : jj_kind_name(obj),
                                 (int)(n > 60 ? 60 : n), name);
    return 0;
}

/* ---- arguments ---- */

/* the i-th positional argument or the keyword `kw`, else dflt */
static struct jj_val arg(const struct jj_args *a, int i, const char *kw, struct jj_val dflt) {
    if (i >= 0 && i < a->n) return a->v[i];
    for (int k = 0; kw && k < a->nkw; k++)
        if (eq(a->kw[k], a->kwl[k], kw)) return a->kwv[k];
    return dflt;
}
static const struct jj_val NONE = {.kind = JV_NONE};
static const struct jj_val UNDEF = {.kind = JV_UNDEF};

static int want_str(struct jj_render *R, const struct jj_node *at, struct jj_val v, const char *what) {
    if (v.kind == JV_STR) return 0;
    return jj_fail(R, at, "%s expects a string, not %s", what, jj_kind_name(v));
}

static int new_list(struct jj_render *R, const struct jj_node *at, struct jj_list **l, struct jj_val *out, int tuple) {
    if (!(*l = jj_alloc(&R->a, sizeof **l))) return jj_nomem(R, at);
    *out = (struct jj_val){.kind = JV_LIST, .sub = tuple, .u.l = *l};
    return 0;
}

/* str(v) as a new string value */
static int stringify(struct jj_render *R, const struct jj_node *at, struct jj_val v, struct jj_val *out) {
    if (v.kind == JV_STR) return *out = v, 0;
    struct tllm_buf b = {0};
    int rc = jj_to_str(v, &b) ? jj_nomem(R, at) : jj_new_str(R, at, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

/* ---- strings, by code point ---- */

static int py_space(utf8proc_int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the code point at p[i], its length in *len (a bad byte counts as itself) */
static utf8proc_int32_t cp_at(const char *p, size_t n, size_t i, size_t *len) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) k = 1, c = (unsigned char)p[i];
    *len = (size_t)k;
    return c;
}

/* is c one of chars' code points (whitespace when chars is NULL)? */
static int in_set(const struct jj_val *chars, utf8proc_int32_t c) {
    if (!chars) return py_space(c);
    size_t len;
    for (size_t k = 0; k < chars->u.s.n; k += len)
        if (cp_at(chars->u.s.p, chars->u.s.n, k, &len) == c) return 1;
    return 0;
}

/* strip: which 1 left, 2 right, 3 both; chars NULL for whitespace */
static struct jj_val strip(struct jj_val s, int which, const struct jj_val *chars) {
    const char *p = s.u.s.p;
    size_t b = 0, e = s.u.s.n, len;
    while ((which & 1) && b < e && in_set(chars, cp_at(p, e, b, &len))) b += len;
    while ((which & 2) && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
        if (!in_set(chars, cp_at(p, e, k, &len))) break;
        e = k;
    }
    return jj_str(p + b, e - b);
}

/* case mapping: 1 lower, 2 upper, 3 capitalize, 4 str.title(), 5 the title filter (words begin after
 * whitespace and - ( { [ <, as jinja2 splits them) */
static int recase(struct jj_render *R, const struct jj_node *at, struct jj_val s, int how, struct jj_val *out) {
    char *o = jj_alloc(&R->a, s.u.s.n * 2 + 8);
    if (!o) return jj_nomem(R, at);
    size_t k = 0, len;
    int first = 1, prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n; i += len) {
        utf8proc_int32_t c = cp_at(s.u.s.p, s.u.s.n, i, &len), d;
        if (how == 1) d = utf8proc_tolower(c);
        else if (how == 2) d = utf8proc_toupper(c);
        else if (how == 3) d = first ? utf8proc_toupper(c) : utf8proc_tolower(c);
        else if (how == 4) d = prev_cased ? utf8proc_tolower(c) : utf8proc_toupper(c);
        else d = first ? utf8proc_toupper(c) : utf8proc_tolower(c); /* 5: the title filter */
        first = how == 5 && (c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c));
        prev_cased = utf8proc_tolower(c) != c || utf8proc_toupper(c) != c || utf8proc_category(c) == UTF8PROC_CATEGORY_LL ||
                     utf8proc_category(c) == UTF8PROC_CATEGORY_LU;
        if (len == 1 && c >= 0x80) d = c; /* a stray byte stays itself */
        if (len == 1 && (unsigned char)s.u.s.p[i] >= 0x80) o[k++] = s.u.s.p[i];
        else k += (size_t)utf8proc_encode_char(d, (utf8proc_uint8_t *)o + k);
        if (k + 8 > s.u.s.n * 2 + 8) return jj_fail(R, at, "case mapping grew the string too much");
    }
    *out = jj_str(o, k);
    return 0;
}

static int str_find(struct jj_val h, struct jj_val x, size_t from) {
    for (size_t i = from; i + x.u.s.n <= h.u.s.n; i++)
        if (!memcmp(h.u.s.p + i, x.u.s.p, x.u.s.n)) return (int)i;
    return -1;
}

static int split(struct jj_render *R, const struct jj_node *at, struct jj_val s, struct jj_val sep, long long maxsplit,
                 int from_right, struct jj_val *out) {
    struct jj_list *l;
    if (new_list(R, at, &l, out, 0)) return -1;
    if (sep.kind == JV_NONE || sep.kind == JV_UNDEF) { /* runs of whitespace, no empty pieces */
        size_t i = 0, len;
        const char *p = s.u.s.p;
        size_t n = s.u.s.n;
        if (from_right && maxsplit >= 0) return jj_fail(R, at, "rsplit() with maxsplit on whitespace is not supported");
        while (i < n) {
            while (i < n && py_space(cp_at(p, n, i, &len))) i += len;
            if (i >= n) break;
            size_t b = i;
            if (maxsplit >= 0 && (long long)l->n >= maxsplit) {
                struct jj_val rest = strip(jj_str(p + b, n - b), 2, NULL);
                return jj_list_push(&R->a, l, rest) ? jj_nomem(R, at) : 0;
            }
            while (i < n && !py_space(cp_at(p, n, i, &len))) i += len;
            if (jj_list_push(&R->a, l, jj_str(p + b, i - b))) return jj_nomem(R, at);
        }
        return 0;
    }
    if (want_str(R, at, sep, "split()")) return -1;
    if (!sep.u.s.n) return jj_fail(R, at, "empty separator");
    if (from_right && maxsplit >= 0) { /* pieces from the right, kept in order */
        size_t end = s.u.s.n;
        long long cnt = 0;
        struct jj_list *rev;
        struct jj_val rv;
        if (new_list(R, at, &rev, &rv, 0)) return -1;
        while (cnt < maxsplit) {
            int pos = -1;
            for (size_t i = end >= sep.u.s.n ? end - sep.u.s.n + 1 : 0; i-- > 0;)
                if (!memcmp(s.u.s.p + i, sep.u.s.p, sep.u.s.n)) { pos = (int)i; break; }
            if (pos < 0) break;
            if (jj_list_push(&R->a, rev, jj_str(s.u.s.p + pos + sep.u.s.n, end - (size_t)pos - sep.u.s.n))) return jj_nomem(R, at);
            end = (size_t)pos;
            cnt++;
        }
        if (jj_list_push(&R->a, l, jj_str(s.u.s.p, end))) return jj_nomem(R, at);
        for (size_t i = rev->n; i-- > 0;)
            if (jj_list_push(&R->a, l, rev->v[i])) return jj_nomem(R, at);
        return 0;
    }
    size_t b = 0;
    for (int pos; (maxsplit < 0 || (long long)l->n < maxsplit) && (pos = str_find(s, sep, b)) >= 0;) {
        if (jj_list_push(&R->a, l, jj_str(s.u.s.p + b, (size_t)pos - b))) return jj_nomem(R, at);
        b = (size_t)pos + sep.u.s.n;
    }
    return jj_list_push(&R->a, l, jj_str(s.u.s.p + b, s.u.s.n - b)) ? jj_nomem(R, at) : 0;
}

static int replace(struct jj_render *R, const struct jj_node *at, struct jj_val s, struct jj_val old, struct jj_val new,
                   long long count, struct jj_val *out) {
    if (want_str(R, at, old, "replace()") || want_str(R, at, new, "replace()")) return -1;
    struct tllm_buf b = {0};
    int bad = 0;
    size_t i = 0;
    long long done = 0;
    if (!old.u.s.n) { /* Python inserts new between every character */
        size_t len;
        for (; i <= s.u.s.n && (count < 0 || done < count); done++) {
            bad |= tllm_buf_append(&b, new.u.s.p, new.u.s.n);
            if (i == s.u.s.n) { i++; break; }
            cp_at(s.u.s.p, s.u.s.n, i, &len);
            bad |= tllm_buf_append(&b, s.u.s.p + i, len);
            i += len;
        }
        if (i < s.u.s.n) bad |= tllm_buf_append(&b, s.u.s.p + i, s.u.s.n - i);
    } else {
        for (int pos; (count < 0 || done < count) && (pos = str_find(s, old, i)) >= 0; done++) {
            bad |= tllm_buf_append(&b, s.u.s.p + i, (size_t)pos - i) | tllm_buf_append(&b, new.u.s.p, new.u.s.n);
            i = (size_t)pos + old.u.s.n;
            if (b.len > TLLM_JINJA_MAX_OUTPUT) break;
        }
        bad |= tllm_buf_append(&b, s.u.s.p + i, s.u.s.n - i);
    }
    int rc = bad || b.len > TLLM_JINJA_MAX_OUTPUT ? jj_fail(R, at, "replace() made too long a string")
                                                  : jj_new_str(R, at, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

static int affix(struct jj_render *R, const struct jj_node *at, struct jj_val s, struct jj_val x, int end, int *res) {
    *res = 0;
    if (x.kind == JV_LIST && x.sub) {
        for (size_t i = 0; i < x.u.l->n && !*res; i++)
            if (affix(R, at, s, x.u.l->v[i], end, res)) return -1;
        return 0;
    }
    if (want_str(R, at, x, end ? "endswith()" : "startswith()")) return -1;
    *res = x.u.s.n <= s.u.s.n && !memcmp(s.u.s.p + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
    return 0;
}

static int join(struct jj_render *R, const struct jj_node *at, struct jj_list *items, struct jj_val sep,
                struct jj_val attr, struct jj_val *out) {
    struct tllm_buf b = {0};
    int bad = 0;
    for (size_t i = 0; i < items->n && !R->failed; i++) {
        struct jj_val v = items->v[i];
        if (attr.kind == JV_STR && jj_getattr(R, at, v, attr.u.s.p, attr.u.s.n, &v)) break;
        if (i) bad |= tllm_buf_append(&b, sep.u.s.p, sep.u.s.n);
        bad |= jj_to_str(v, &b);
    }
    int rc = R->failed ? -1 : bad ? jj_nomem(R, at) : jj_new_str(R, at, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

static int json_of(struct jj_render *R, const struct jj_node *at, struct jj_val v, int indent, int sort_keys,
                   struct jj_val *out) {
    struct tllm_buf b = {0};
    int rc = jj_to_json(v, indent, sort_keys, &b, 0);
    if (rc == 1) rc = jj_fail(R, at, "tojson: a value of type %s cannot be written as JSON", v.kind == JV_UNDEF ? "Undefined" : jj_kind_name(v));
    else if (rc) rc = jj_nomem(R, at);
    else rc = jj_new_str(R, at, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

static int items_of(struct jj_render *R, const struct jj_node *at, struct jj_val d, struct jj_val *out) {
    struct jj_list *l;
    if (new_list(R, at, &l, out, 0)) return -1;
    if (d.kind == JV_UNDEF) return 0;
    if (d.kind != JV_DICT) return jj_fail(R, at, "items() of a %s, which is not a mapping", jj_kind_name(d));
    for (size_t i = 0; i < d.u.d->n; i++) {
        struct jj_list *p;
        struct jj_val pv;
        if (new_list(R, at, &p, &pv, 1) || jj_list_push(&R->a, p, d.u.d->k[i]) || jj_list_push(&R->a, p, d.u.d->v[i]) ||
            jj_list_push(&R->a, l, pv))
            return R->failed ? -1 : jj_nomem(R, at);
    }
    return 0;
}

static int new_namespace(struct jj_render *R, const struct jj_node *at, const struct jj_args *a, int ns, struct jj_val *out) {
    struct jj_dict *d = jj_alloc(&R->a, sizeof *d);
    if (!d) return jj_nomem(R, at);
    for (int i = 0; i < a->n; i++) {
        if (a->v[i].kind != JV_DICT) return jj_fail(R, at, "%s() takes a mapping or keyword arguments", ns ? "namespace" : "dict");
        for (size_t k = 0; k < a->v[i].u.d->n; k++)
            if (jj_dict_set(&R->a, d, a->v[i].u.d->k[k], a->v[i].u.d->v[k])) return jj_nomem(R, at);
    }
    for (int k = 0; k < a->nkw; k++)
        if (jj_dict_set(&R->a, d, jj_str(a->kw[k], a->kwl[k]), a->kwv[k])) return jj_nomem(R, at);
    *out = (struct jj_val){.kind = JV_DICT, .sub = ns, .u.d = d};
    return 0;
}

static int int_arg(struct jj_render *R, const struct jj_node *at, struct jj_val v, const char *what, long long *out) {
    if (v.kind == JV_INT || v.kind == JV_BOOL) return *out = v.kind == JV_INT ? v.u.i : v.u.b, 0;
    return jj_fail(R, at, "%s expects an integer, not %s", what, jj_kind_name(v));
}

int jj_call_builtin(struct jj_render *R, const struct jj_node *at, struct jj_val fn, const struct jj_args *a,
                    struct jj_val *out) {
    struct jj_val self = fn.u.self ? *fn.u.self : NONE;
    if (self.kind == JV_STR && jj_charge(R, at, self.u.s.n)) return -1;
    long long n1 = 0, n2 = 0;
    int r;
    switch (fn.sub) {
    case F_RANGE: {
        long long start = 0, stop = 0, step = 1;
        if (a->n < 1 || a->n > 3) return jj_fail(R, at, "range() takes 1 to 3 arguments");
        if (int_arg(R, at, a->v[0], "range()", &stop)) return -1;
        if (a->n >= 2) {
            start = stop;
            if (int_arg(R, at, a->v[1], "range()", &stop)) return -1;
        }
        if (a->n == 3 && int_arg(R, at, a->v[2], "range()", &step)) return -1;
        if (!step) return jj_fail(R, at, "range() step must not be zero");
        double count = ceil(((double)stop - (double)start) / (double)step);
        if (count > MAX_RANGE) return jj_fail(R, at, "range() of more than %d items", MAX_RANGE);
        struct jj_list *l;
        if (new_list(R, at, &l, out, 0)) return -1;
        for (long long i = start; step > 0 ? i < stop : i > stop; i += step)
            if (jj_list_push(&R->a, l, jj_int(i))) return jj_nomem(R, at);
        return 0;
    }
    case F_NAMESPACE: return new_namespace(R, at, a, 1, out);
    case F_DICT: return new_namespace(R, at, a, 0, out);
    case F_RAISE: {
        struct jj_val m = arg(a, 0, NULL, jj_str("", 0));
        struct tllm_buf b = {0};
        int bad = jj_to_str(m, &b);
        jj_fail(R, at, "the template raised an error: %.300s", bad || !b.data ? "" : b.data);
        tllm_buf_free(&b);
        return -1;
    }
    case F_STRFTIME: {
        struct jj_val f = arg(a, 0, NULL, UNDEF);
        if (want_str(R, at, f, "strftime_now()")) return -1;
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f.u.s.n < 255 ? f.u.s.n : 255), f.u.s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        return jj_new_str(R, at, buf, n, out);
    }
    case M_ITEMS: return items_of(R, at, self, out);
    case M_KEYS: case M_VALUES: {
        struct jj_list *l;
        if (new_list(R, at, &l, out, 0)) return -1;
        for (size_t i = 0; i < self.u.d->n; i++)
            if (jj_list_push(&R->a, l, fn.sub == M_KEYS ? self.u.d->k[i] : self.u.d->v[i])) return jj_nomem(R, at);
        return 0;
    }
    case M_GET: {
        struct jj_val *v = jj_dict_find(self.u.d, arg(a, 0, NULL, NONE));
        *out = v ? *v : arg(a, 1, NULL, NONE);
        return 0;
    }
    case M_STARTSWITH: case M_ENDSWITH:
        if (affix(R, at, self, arg(a, 0, NULL, UNDEF), fn.sub == M_ENDSWITH, &r)) return -1;
        *out = jj_bool(r);
        return 0;
    case M_SPLIT: case M_RSPLIT: {
        struct jj_val ms = arg(a, 1, "maxsplit", jj_int(-1));
        if (int_arg(R, at, ms, "split()", &n1)) return -1;
        return split(R, at, self, arg(a, 0, "sep", NONE), n1, fn.sub == M_RSPLIT, out);
    }
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        struct jj_val c = arg(a, 0, NULL, NONE);
        if (c.kind != JV_NONE && want_str(R, at, c, "strip()")) return -1;
        *out = strip(self, fn.sub == M_STRIP ? 3 : fn.sub == M_LSTRIP ? 1 : 2, c.kind == JV_STR ? &c : NULL);
        return 0;
    }
    case M_UPPER: return recase(R, at, self, 2, out);
    case M_LOWER: return recase(R, at, self, 1, out);
    case M_TITLE: return recase(R, at, self, 4, out);
    case M_CAPITALIZE: return recase(R, at, self, 3, out);
    case M_REPLACE:
        if (int_arg(R, at, arg(a, 2, "count", jj_int(-1)), "replace()", &n1)) return -1;
        return replace(R, at, self, arg(a, 0, NULL, UNDEF), arg(a, 1, NULL, UNDEF), n1, out);
    case M_FIND: case M_COUNT: {
        struct jj_val x = arg(a, 0, NULL, UNDEF);
        if (want_str(R, at, x, fn.sub == M_FIND ? "find()" : "count()")) return -1;
        if (fn.sub == M_FIND) {
            int pos = str_find(self, x, 0);
            *out = jj_int(pos < 0 ? -1 : (long long)jj_utf8_len(self.u.s.p, (size_t)pos));
            return 0;
        }
        n2 = 0;
        if (!x.u.s.n) n2 = (long long)jj_utf8_len(self.u.s.p, self.u.s.n) + 1;
        else
            for (int pos = 0; (pos = str_find(self, x, (size_t)pos)) >= 0; pos += (int)x.u.s.n) n2++;
        *out = jj_int(n2);
        return 0;
    }
    case M_JOIN: {
        struct jj_list *items;
        if (jj_iterate(R, at, arg(a, 0, NULL, UNDEF), &items)) return -1;
        return join(R, at, items, self, NONE, out);
    }
    case M_ISDIGIT: case M_ISSPACE: {
        size_t len;
        r = self.u.s.n > 0;
        for (size_t i = 0; i < self.u.s.n && r; i += len) {
            utf8proc_int32_t c = cp_at(self.u.s.p, self.u.s.n, i, &len);
            r = fn.sub == M_ISSPACE ? py_space(c) : utf8proc_category(c) == UTF8PROC_CATEGORY_ND;
        }
        *out = jj_bool(r);
        return 0;
    }
    }
    return jj_fail(R, at, "not a function");
}

/* ---- tests ---- */

int jj_test(struct jj_render *R, const struct jj_node *at, struct jj_val v, const struct jj_args *a, int *res) {
    const char *t = at->name;
    size_t n = at->name_len;
    struct jj_val x = arg(a, 0, NULL, UNDEF);
    if (eq(t, n, "defined")) *res = v.kind != JV_UNDEF;
    else if (eq(t, n, "undefined")) *res = v.kind == JV_UNDEF;
    else if (eq(t, n, "none")) *res = v.kind == JV_NONE;
    else if (eq(t, n, "boolean")) *res = v.kind == JV_BOOL;
    else if (eq(t, n, "true")) *res = v.kind == JV_BOOL && v.u.b;
    else if (eq(t, n, "false")) *res = v.kind == JV_BOOL && !v.u.b;
    else if (eq(t, n, "integer")) *res = v.kind == JV_INT;
    else if (eq(t, n, "float")) *res = v.kind == JV_FLOAT;
    else if (eq(t, n, "number")) *res = v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
    else if (eq(t, n, "string")) *res = v.kind == JV_STR;
    else if (eq(t, n, "mapping")) *res = v.kind == JV_DICT && !v.sub;
    else if (eq(t, n, "sequence")) *res = v.kind == JV_STR || v.kind == JV_LIST || (v.kind == JV_DICT && !v.sub) || v.kind == JV_UNDEF;
    else if (eq(t, n, "iterable")) *res = v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF;
    else if (eq(t, n, "callable")) *res = v.kind == JV_MACRO || v.kind == JV_FUNC;
    else if (eq(t, n, "odd") || eq(t, n, "even") || eq(t, n, "divisibleby")) { /* value % d, numbers of any kind */
        struct jj_val d = t[0] == 'd' ? x : jj_int(2);
        int vi = v.kind == JV_INT || v.kind == JV_BOOL, di = d.kind == JV_INT || d.kind == JV_BOOL;
        if (!(vi || v.kind == JV_FLOAT) || !(di || d.kind == JV_FLOAT))
            return jj_fail(R, at, "the %.*s test needs numbers, not %s", (int)n, t, jj_kind_name(vi || v.kind == JV_FLOAT ? d : v));
        double dv = d.kind == JV_FLOAT ? d.u.f : (double)(d.kind == JV_INT ? d.u.i : d.u.b);
        if (dv == 0) return jj_fail(R, at, "modulo by zero");
        double r;
        if (vi && di) {
            long long p = v.kind == JV_INT ? v.u.i : v.u.b, q = d.kind == JV_INT ? d.u.i : d.u.b;
            r = (q == -1) ? 0 : (double)(((p % q) + q) % q);
        } else {
            double p = v.kind == JV_FLOAT ? v.u.f : (double)(v.kind == JV_INT ? v.u.i : v.u.b);
            r = fmod(p, dv);
            if (r != 0 && ((r < 0) != (dv < 0))) r += dv;
        }
        *res = t[0] == 'o' ? r == 1 : r == 0;
    } else if (eq(t, n, "eq") || eq(t, n, "equalto") || eq(t, n, "==") || eq(t, n, "sameas")) *res = jj_equal(v, x);
    else if (eq(t, n, "ne") || eq(t, n, "!=")) *res = !jj_equal(v, x);
    else if (eq(t, n, "lt") || eq(t, n, "le") || eq(t, n, "gt") || eq(t, n, "ge") || eq(t, n, "lessthan") ||
             eq(t, n, "greaterthan")) {
        int c = jj_compare(v, x);
        if (c == -2) return jj_fail(R, at, "cannot order %s and %s", jj_kind_name(v), jj_kind_name(x));
        *res = t[0] == 'l' ? (t[1] == 'e' && n == 2 ? c <= 0 : c < 0) : (t[1] == 'e' && n == 2 ? c >= 0 : c > 0);
    } else if (eq(t, n, "in")) {
        return jj_contains(R, at, x, v, res);
    } else if (eq(t, n, "lower") || eq(t, n, "upper")) { /* str(v).islower(): some cased letter, none of the other case */
        struct jj_val sv;
        if (stringify(R, at, v, &sv)) return -1;
        int cased = 0, other = 0;
        size_t len;
        for (size_t i = 0; i < sv.u.s.n; i += len) {
            utf8proc_int32_t c = cp_at(sv.u.s.p, sv.u.s.n, i, &len);
            utf8proc_category_t cat = utf8proc_category(c);
            int up = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT, low = cat == UTF8PROC_CATEGORY_LL;
            if (up || low) {
                if ((t[0] == 'u') == up) cased = 1;
                else other = 1;
            }
        }
        *res = cased && !other;
    } else {
        return jj_fail(R, at, "no test named '%.*s'", (int)(n > 40 ? 40 : n), t);
    }
    return 0;
}

/* ---- filters ---- */

/* for select/reject/selectattr/rejectattr: the test named by args[first] with the rest as its arguments */
static int apply_test(struct jj_render *R, const struct jj_node *at, struct jj_val v, const struct jj_args *a, int first,
                      int *res) {
    if (a->n <= first) return *res = jj_truthy(v), 0;
    struct jj_val name = a->v[first];
    if (want_str(R, at, name, "the test name")) return -1;
    struct jj_node tn = *at;
    tn.name = name.u.s.p, tn.name_len = name.u.s.n;
    struct jj_args ta = {.n = a->n - first - 1, .v = a->v + first + 1};
    return jj_test(R, &tn, v, &ta, res);
}

/* item.attr, where attr may be dotted ("function.name") */
static int attr_path(struct jj_render *R, const struct jj_node *at, struct jj_val v, struct jj_val attr, struct jj_val *out) {
    if (attr.kind == JV_INT) return jj_getitem(R, at, v, attr, out);
    if (want_str(R, at, attr, "the attribute")) return -1;
    const char *p = attr.u.s.p, *e = p + attr.u.s.n;
    while (1) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        size_t len = d ? (size_t)(d - p) : (size_t)(e - p);
        if (v.kind == JV_UNDEF) return *out = v, 0;
        if (jj_getitem(R, at, v, jj_str(p, len), &v)) return -1;
        if (!d) break;
        p = d + 1;
    }
    *out = v;
    return 0;
}

static int html_escape(struct jj_render *R, const struct jj_node *at, struct jj_val s, struct jj_val *out) {
    struct tllm_buf b = {0};
    int bad = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        bad |= c == '&' ? tllm_buf_puts(&b, "&amp;") : c == '<' ? tllm_buf_puts(&b, "&lt;") : c == '>' ? tllm_buf_puts(&b, "&gt;")
               : c == '"' ? tllm_buf_puts(&b, "&#34;") : c == '\'' ? tllm_buf_puts(&b, "&#39;") : tllm_buf_append(&b, &c, 1);
    }
    int rc = bad ? jj_nomem(R, at) : jj_new_str(R, at, b.data ? b.data : "", b.len, out);
    tllm_buf_free(&b);
    return rc;
}

/* a stable merge sort of (key, item) pairs; *bad when two keys have no order */
static void merge_sort(struct jj_val *p, struct jj_val *tmp, size_t n, int desc, int *bad) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(p, tmp, h, desc, bad);
    merge_sort(p + 2 * h, tmp, n - h, desc, bad);
    size_t i = 0, j = h, k = 0;
    while (i < h || j < n) {
        int take_right = 0;
        if (i < h && j < n) {
            int c = jj_compare(p[2 * j], p[2 * i]);
            if (c == -2) *bad = 1, c = 0;
            take_right = desc ? c > 0 : c < 0;
        } else {
            take_right = i >= h;
        }
        size_t s = take_right ? j++ : i++;
        tmp[2 * k] = p[2 * s], tmp[2 * k + 1] = p[2 * s + 1];
        k++;
    }
    memcpy(p, tmp, 2 * n * sizeof *p);
}

int jj_filter(struct jj_render *R, const struct jj_node *at, struct jj_val v, const struct jj_args *a, struct jj_val *out) {
    const char *f = at->name;
    size_t n = at->name_len;
    struct jj_list *items, *l;
    if (v.kind == JV_STR && jj_charge(R, at, v.u.s.n)) return -1;
    if (eq(f, n, "default") || eq(f, n, "d")) {
        int boolean = jj_truthy(arg(a, 1, "boolean", jj_bool(0)));
        *out = v.kind == JV_UNDEF || (boolean && !jj_truthy(v)) ? arg(a, 0, "default_value", jj_str("", 0)) : v;
        return 0;
    }
    if (eq(f, n, "safe")) return *out = v, 0;
    if (eq(f, n, "tojson")) {
        struct jj_val ind = arg(a, 0, "indent", NONE), sk = arg(a, -1, "sort_keys", jj_bool(0));
        if (arg(a, -1, "separators", NONE).kind != JV_NONE) return jj_fail(R, at, "tojson: separators are not supported");
        long long indent = -1;
        if (ind.kind != JV_NONE && int_arg(R, at, ind, "tojson's indent", &indent)) return -1;
        if (indent > 64) return jj_fail(R, at, "tojson: indent %lld is too large", indent);
        return json_of(R, at, v, (int)indent, jj_truthy(sk), out);
    }
    /* an undefined value reads as an empty string or an empty sequence, as jinja2's Undefined does, except where
     * a number is needed */
    if (v.kind == JV_UNDEF && (eq(f, n, "abs") || eq(f, n, "int") || eq(f, n, "float"))) return jj_undefined_error(R, at, v);
    if (eq(f, n, "length") || eq(f, n, "count")) {
        if (v.kind == JV_STR) *out = jj_int((long long)jj_utf8_len(v.u.s.p, v.u.s.n));
        else if (v.kind == JV_LIST) *out = jj_int((long long)v.u.l->n);
        else if (v.kind == JV_DICT) *out = jj_int((long long)v.u.d->n);
        else if (v.kind == JV_UNDEF) *out = jj_int(0);
        else return jj_fail(R, at, "object of type '%s' has no len()", jj_kind_name(v));
        return 0;
    }
    if (eq(f, n, "string")) return stringify(R, at, v, out);
    if (eq(f, n, "trim") || eq(f, n, "lower") || eq(f, n, "upper") || eq(f, n, "capitalize") || eq(f, n, "title")) {
        struct jj_val s;
        if (stringify(R, at, v, &s)) return -1;
        if (f[0] == 't' && f[1] == 'r') {
            struct jj_val c = arg(a, 0, "chars", NONE);
            if (c.kind != JV_NONE && want_str(R, at, c, "trim")) return -1;
            *out = strip(s, 3, c.kind == JV_STR ? &c : NULL);
            return 0;
        }
        return recase(R, at, s, f[0] == 'l' ? 1 : f[0] == 'u' ? 2 : f[0] == 'c' ? 3 : 5, out);
    }
    if (eq(f, n, "items")) return items_of(R, at, v, out);
    if (eq(f, n, "first") || eq(f, n, "last")) {
        if (jj_iterate(R, at, v, &items)) return -1;
        *out = !items->n ? (struct jj_val){.kind = JV_UNDEF} : items->v[f[0] == 'f' ? 0 : items->n - 1];
        return 0;
    }
    if (eq(f, n, "join")) {
        struct jj_val sep = arg(a, 0, "d", jj_str("", 0));
        if (want_str(R, at, sep, "join's separator") || jj_iterate(R, at, v, &items)) return -1;
        return join(R, at, items, sep, arg(a, 1, "attribute", NONE), out);
    }
    if (eq(f, n, "list")) {
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        for (size_t i = 0; i < items->n; i++)
            if (jj_list_push(&R->a, l, items->v[i])) return jj_nomem(R, at);
        return 0;
    }
    if (eq(f, n, "reverse")) {
        if (v.kind == JV_STR) {
            size_t ncp;
            size_t *off = jj_cp_offsets(R, v, &ncp);
            char *p = jj_alloc(&R->a, v.u.s.n + 1);
            if (!off || !p) return jj_nomem(R, at);
            size_t k = 0;
            for (size_t i = ncp; i-- > 0;) memcpy(p + k, v.u.s.p + off[i], off[i + 1] - off[i]), k += off[i + 1] - off[i];
            *out = jj_str(p, k);
            return 0;
        }
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        for (size_t i = items->n; i-- > 0;)
            if (jj_list_push(&R->a, l, items->v[i])) return jj_nomem(R, at);
        return 0;
    }
    if (eq(f, n, "select") || eq(f, n, "reject") || eq(f, n, "selectattr") || eq(f, n, "rejectattr")) {
        int attr = f[n - 4] == 'a', keep = f[0] == 's';
        if (attr && a->n < 1) return jj_fail(R, at, "%.*s needs an attribute name", (int)n, f);
        if (!jj_truthy(v)) return new_list(R, at, &l, out, 0); /* jinja2: "if value:" before iterating */
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        for (size_t i = 0; i < items->n; i++) {
            struct jj_val x = items->v[i];
            int r;
            if (attr && attr_path(R, at, x, a->v[0], &x)) return -1;
            if (apply_test(R, at, x, a, attr, &r)) return -1;
            if (r == keep && jj_list_push(&R->a, l, items->v[i])) return jj_nomem(R, at);
        }
        return 0;
    }
    if (eq(f, n, "map")) {
        if (!jj_truthy(v)) return new_list(R, at, &l, out, 0);
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        struct jj_val attr = arg(a, -1, "attribute", UNDEF), dflt = arg(a, -1, "default", UNDEF);
        if (attr.kind == JV_UNDEF && (a->n < 1 || a->v[0].kind != JV_STR))
            return jj_fail(R, at, "map needs a filter name or attribute=");
        for (size_t i = 0; i < items->n; i++) {
            struct jj_val x;
            if (attr.kind != JV_UNDEF) {
                if (attr_path(R, at, items->v[i], attr, &x)) return -1;
                if (x.kind == JV_UNDEF) x = dflt;
            } else {
                struct jj_node fn = *at;
                fn.name = a->v[0].u.s.p, fn.name_len = a->v[0].u.s.n;
                struct jj_args fa = {.n = a->n - 1, .v = a->v + 1, .nkw = a->nkw, .kwv = a->kwv, .kw = a->kw, .kwl = a->kwl};
                if (jj_filter(R, &fn, items->v[i], &fa, &x)) return -1;
            }
            if (jj_list_push(&R->a, l, x)) return jj_nomem(R, at);
        }
        return 0;
    }
    if (eq(f, n, "unique")) {
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        for (size_t i = 0; i < items->n; i++) {
            int seen = 0;
            for (size_t k = 0; k < l->n && !seen; k++) seen = jj_equal(l->v[k], items->v[i]);
            if (!seen && jj_list_push(&R->a, l, items->v[i])) return jj_nomem(R, at);
        }
        return 0;
    }
    if (eq(f, n, "sort")) {
        struct jj_val rev = arg(a, 0, "reverse", jj_bool(0)), attr = arg(a, 2, "attribute", NONE);
        int fold = !jj_truthy(arg(a, 1, "case_sensitive", jj_bool(0)));
        if (jj_iterate(R, at, v, &items) || new_list(R, at, &l, out, 0)) return -1;
        struct jj_val *pairs = jj_alloc(&R->a, (items->n + 1) * 2 * sizeof *pairs);
        if (!pairs) return jj_nomem(R, at);
        for (size_t i = 0; i < items->n; i++) {
            pairs[2 * i] = items->v[i];
            if (attr.kind != JV_NONE && attr_path(R, at, items->v[i], attr, &pairs[2 * i])) return -1;
            if (fold && pairs[2 * i].kind == JV_STR && recase(R, at, pairs[2 * i], 1, &pairs[2 * i])) return -1;
            pairs[2 * i + 1] = items->v[i];
        }
        struct jj_val *tmp = jj_alloc(&R->a, (items->n + 1) * 2 * sizeof *tmp);
        if (!tmp) return jj_nomem(R, at);
        int bad = 0;
        merge_sort(pairs, tmp, items->n, jj_truthy(rev), &bad);
        if (bad) return jj_fail(R, at, "sort: the items cannot be ordered");
        for (size_t i = 0; i < items->n; i++)
            if (jj_list_push(&R->a, l, pairs[2 * i + 1])) return jj_nomem(R, at);
        return 0;
    }
    if (eq(f, n, "int") || eq(f, n, "float")) {
        int is_int = f[0] == 'i';
        struct jj_val d = arg(a, 0, "default", is_int ? jj_int(0) : (struct jj_val){.kind = JV_FLOAT, .u.f = 0});
        if (v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT) {
            double x = v.kind == JV_FLOAT ? v.u.f : (double)(v.kind == JV_INT ? v.u.i : v.u.b);
            if (is_int) *out = v.kind == JV_FLOAT ? (isfinite(x) && fabs(x) < 9.2e18 ? jj_int((long long)x) : d)
                                                  : jj_int(v.kind == JV_INT ? v.u.i : v.u.b);
            else *out = (struct jj_val){.kind = JV_FLOAT, .u.f = x};
            return 0;
        }
        if (v.kind == JV_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.p);
            char *end;
            if (is_int) {
                long long x = strtoll(buf, &end, 10);
                *out = end != buf && !*end ? jj_int(x) : d;
            } else {
                double x = strtod(buf, &end);
                *out = end != buf && !*end ? (struct jj_val){.kind = JV_FLOAT, .u.f = x} : d;
            }
            return 0;
        }
        *out = d;
        return 0;
    }
    if (eq(f, n, "abs")) {
        if (v.kind == JV_INT) return v.u.i == INT64_MIN ? jj_fail(R, at, "integer overflow") : (*out = jj_int(v.u.i < 0 ? -v.u.i : v.u.i), 0);
        if (v.kind == JV_FLOAT) return *out = (struct jj_val){.kind = JV_FLOAT, .u.f = fabs(v.u.f)}, 0;
        if (v.kind == JV_BOOL) return *out = jj_int(v.u.b), 0;
        return jj_fail(R, at, "abs of a %s", jj_kind_name(v));
    }
    if (eq(f, n, "replace")) {
        struct jj_val s;
        long long count = -1;
        if (stringify(R, at, v, &s) || int_arg(R, at, arg(a, 2, "count", jj_int(-1)), "replace's count", &count)) return -1;
        return replace(R, at, s, arg(a, 0, "old", UNDEF), arg(a, 1, "new", UNDEF), count, out);
    }
    if (eq(f, n, "e") || eq(f, n, "escape")) {
        struct jj_val s;
        return stringify(R, at, v, &s) || html_escape(R, at, s, out);
    }
    return jj_fail(R, at, "no filter named '%.*s'", (int)(n > 40 ? 40 : n), f);
}
