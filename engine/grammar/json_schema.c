/* JSON Schema -> grammar (json_schema.h). */
#include "engine/grammar/json_schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/json_util.h"
#include "engine/grammar/regex.h"

#define STR_(x) #x
#define STR(x) STR_(x)

struct sref {
    char *ptr; /* "#/$defs/Name" */
    int rule;
};

struct sc {
    struct tllm_gram_builder *b;
    struct json_object *root;
    const char *what;
    char path[256]; /* where in the schema, for messages: "properties.age" */
    int depth;
    int ws, value, string, number, integer, jchar; /* shared rules, made on first use (0: not yet) */
    struct sref *refs;
    int n_refs;
    int failed; /* a message is recorded */
};

static int err(struct sc *c, const char *fmt, const char *arg) {
    if (!c->failed) {
        char m[200];
        snprintf(m, sizeof m, fmt, arg);
        tllm_fail(TLLM_ERR_UNSUPPORTED, "%s: %s%s%s", c->what, c->path, c->path[0] ? ": " : "", m);
        c->failed = 1;
    }
    return -1;
}

/* ---- the shared pieces ---- */

static int ws_rule(struct sc *c) { /* "" | " " | "\n" [ \t]{0,20} */
    if (c->ws) return c->ws;
    struct tllm_gram_builder *b = c->b;
    int indent = tllm_gram_rule(b);
    uint8_t set[32] = {0};
    tllm_gram_set_add(set, ' '), tllm_gram_set_add(set, '\t');
    tllm_gram_set(b, indent, set);
    int r = tllm_gram_rule(b);
    tllm_gram_alt(b, r);
    tllm_gram_byte(b, r, ' ');
    tllm_gram_alt(b, r);
    tllm_gram_byte(b, r, '\n');
    tllm_gram_ref(b, r, tllm_gram_repeat(b, indent, 0, 20));
    return c->ws = r;
}

static int jchar_rule(struct sc *c) {
    if (!c->jchar) c->jchar = tllm_regex_json_char(c->b);
    return c->jchar;
}

static int string_body(struct sc *c, int min, int max) {
    int r = tllm_gram_rule(c->b);
    tllm_gram_byte(c->b, r, '"');
    tllm_gram_ref(c->b, r, tllm_gram_repeat(c->b, jchar_rule(c), min, max));
    tllm_gram_byte(c->b, r, '"');
    return r;
}

static int string_rule(struct sc *c) {
    if (!c->string) c->string = string_body(c, 0, -1);
    return c->string;
}

static int digits(struct sc *c, int min, int max) {
    int d = tllm_gram_rule(c->b);
    tllm_gram_range(c->b, d, '0', '9');
    return tllm_gram_repeat(c->b, d, min, max);
}

static int integer_rule(struct sc *c) { /* -?(0|[1-9][0-9]{0,15}) */
    if (c->integer) return c->integer;
    struct tllm_gram_builder *b = c->b;
    int mag = tllm_gram_rule(b);
    tllm_gram_byte(b, mag, '0');
    tllm_gram_alt(b, mag);
    tllm_gram_range(b, mag, '1', '9');
    tllm_gram_ref(b, mag, digits(c, 0, 15));
    int sign = tllm_gram_rule(b);
    tllm_gram_alt(b, sign);
    tllm_gram_byte(b, sign, '-');
    int r = tllm_gram_rule(b);
    tllm_gram_ref(b, r, sign);
    tllm_gram_ref(b, r, mag);
    return c->integer = r;
}

static int fraction_rule(struct sc *c) { /* ("." [0-9]{1,16})? */
    int r = tllm_gram_rule(c->b);
    tllm_gram_alt(c->b, r);
    tllm_gram_byte(c->b, r, '.');
    tllm_gram_ref(c->b, r, digits(c, 1, 16));
    return r;
}

static int number_rule(struct sc *c) { /* integer fraction? ([eE][-+]?[0-9]{1,3})? */
    if (c->number) return c->number;
    struct tllm_gram_builder *b = c->b;
    int ex = tllm_gram_rule(b);
    tllm_gram_alt(b, ex);
    uint8_t e[32] = {0}, pm[32] = {0};
    tllm_gram_set_add(e, 'e'), tllm_gram_set_add(e, 'E');
    tllm_gram_set_add(pm, '+'), tllm_gram_set_add(pm, '-');
    tllm_gram_set(b, ex, e);
    int sign = tllm_gram_rule(b);
    tllm_gram_alt(b, sign);
    tllm_gram_set(b, sign, pm);
    tllm_gram_ref(b, ex, sign);
    tllm_gram_ref(b, ex, digits(c, 1, 3));
    int r = tllm_gram_rule(b);
    tllm_gram_ref(b, r, integer_rule(c));
    tllm_gram_ref(b, r, fraction_rule(c));
    tllm_gram_ref(b, r, ex);
    return c->number = r;
}

static int lit_rule(struct sc *c, const char *s) {
    int r = tllm_gram_rule(c->b);
    tllm_gram_lit(c->b, r, s, strlen(s));
    return r;
}

/* open ws body close */
static int bracketed(struct sc *c, char open, int body, char close) {
    int r = tllm_gram_rule(c->b);
    tllm_gram_byte(c->b, r, (unsigned char)open);
    tllm_gram_ref(c->b, r, ws_rule(c));
    tllm_gram_ref(c->b, r, body);
    tllm_gram_byte(c->b, r, (unsigned char)close);
    return r;
}

/* An object's member: key ws ":" ws value ws */
static int member_rule(struct sc *c, int key, int value) {
    struct tllm_gram_builder *b = c->b;
    int ws = ws_rule(c), r = tllm_gram_rule(b);
    tllm_gram_ref(b, r, key);
    tllm_gram_ref(b, r, ws);
    tllm_gram_byte(b, r, ':');
    tllm_gram_ref(b, r, ws);
    tllm_gram_ref(b, r, value);
    tllm_gram_ref(b, r, ws);
    return r;
}

/* "{" ws [ member ("," ws member)* ] "}" */
static int free_object(struct sc *c, int value) {
    struct tllm_gram_builder *b = c->b;
    int ws = ws_rule(c);
    int member = member_rule(c, string_rule(c), value);
    int more = tllm_gram_rule(b);
    tllm_gram_byte(b, more, ',');
    tllm_gram_ref(b, more, ws);
    tllm_gram_ref(b, more, member);
    int body = tllm_gram_rule(b);
    tllm_gram_alt(b, body);
    tllm_gram_ref(b, body, member);
    tllm_gram_ref(b, body, tllm_gram_repeat(b, more, 0, -1));
    return bracketed(c, '{', body, '}');
}

/* "[" ws [ item ws ("," ws item ws){min-1,max-1} ] "]" */
static int array_of(struct sc *c, int item, int min, int max) {
    struct tllm_gram_builder *b = c->b;
    int ws = ws_rule(c);
    int more = tllm_gram_rule(b);
    tllm_gram_byte(b, more, ',');
    tllm_gram_ref(b, more, ws);
    tllm_gram_ref(b, more, item);
    tllm_gram_ref(b, more, ws);
    int body = tllm_gram_rule(b);
    if (min == 0) tllm_gram_alt(b, body);
    if (max != 0) {
        tllm_gram_ref(b, body, item);
        tllm_gram_ref(b, body, ws);
        tllm_gram_ref(b, body, tllm_gram_repeat(b, more, min > 0 ? min - 1 : 0, max > 0 ? max - 1 : -1));
    }
    return bracketed(c, '[', body, ']');
}

static int any_value(struct sc *c) {
    if (c->value) return c->value;
    struct tllm_gram_builder *b = c->b;
    int r = c->value = tllm_gram_rule(b); /* recursive: made before its parts */
    int parts[] = {free_object(c, r), array_of(c, r, 0, -1), string_rule(c), number_rule(c),
                   lit_rule(c, "true"), lit_rule(c, "false"), lit_rule(c, "null")};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        if (i) tllm_gram_alt(b, r);
        tllm_gram_ref(b, r, parts[i]);
    }
    return r;
}

/* The exact JSON text of a value (const, enum) */
static int json_lit(struct sc *c, struct json_object *v) {
    size_t n;
    const char *s = json_object_to_json_string_length(v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
    int r = tllm_gram_rule(c->b);
    tllm_gram_lit(c->b, r, s, n);
    return r;
}

/* ---- integer ranges, as digit strings ---- */

/* digit strings of length n, each at least s (dir > 0) or at most s (dir < 0) */
static int bound_digits(struct sc *c, const char *s, int n, int dir) {
    struct tllm_gram_builder *b = c->b;
    int r = tllm_gram_rule(b);
    if (n == 0) return r;
    tllm_gram_byte(b, r, (unsigned char)s[0]);
    tllm_gram_ref(b, r, bound_digits(c, s + 1, n - 1, dir));
    if (dir > 0 ? s[0] < '9' : s[0] > '0') {
        tllm_gram_alt(b, r);
        if (dir > 0) tllm_gram_range(b, r, (unsigned char)(s[0] + 1), '9');
        else tllm_gram_range(b, r, '0', (unsigned char)(s[0] - 1));
        tllm_gram_ref(b, r, digits(c, n - 1, n - 1));
    }
    return r;
}

/* digit strings of length n from lo to hi (both n long) */
static int same_len_range(struct sc *c, const char *lo, const char *hi, int n) {
    struct tllm_gram_builder *b = c->b;
    int r = tllm_gram_rule(b);
    if (n == 0) return r;
    if (lo[0] == hi[0]) {
        tllm_gram_byte(b, r, (unsigned char)lo[0]);
        tllm_gram_ref(b, r, same_len_range(c, lo + 1, hi + 1, n - 1));
        return r;
    }
    tllm_gram_byte(b, r, (unsigned char)lo[0]);
    tllm_gram_ref(b, r, bound_digits(c, lo + 1, n - 1, 1));
    if (lo[0] + 1 <= hi[0] - 1) {
        tllm_gram_alt(b, r);
        tllm_gram_range(b, r, (unsigned char)(lo[0] + 1), (unsigned char)(hi[0] - 1));
        tllm_gram_ref(b, r, digits(c, n - 1, n - 1));
    }
    tllm_gram_alt(b, r);
    tllm_gram_byte(b, r, (unsigned char)hi[0]);
    tllm_gram_ref(b, r, bound_digits(c, hi + 1, n - 1, -1));
    return r;
}

#define MAX_MAG 9999999999999999LL /* 16 digits: the integers numbers are written with */

/* The magnitudes lo..hi (0 <= lo <= hi <= MAX_MAG) written without leading zeros, as alternatives of r */
static void magnitudes(struct sc *c, int r, long long lo, long long hi, int *n_alt) {
    long long p = 1;
    for (int len = 1; len <= 16 && lo <= hi; len++, p *= 10) {
        long long top = p * 10 - 1, from = lo > (len == 1 ? 0 : p) ? lo : (len == 1 ? 0 : p);
        long long to = hi < top ? hi : top;
        if (from > to) continue;
        char a[20], z[20];
        snprintf(a, sizeof a, "%lld", from);
        snprintf(z, sizeof z, "%lld", to);
        if ((*n_alt)++) tllm_gram_alt(c->b, r);
        tllm_gram_ref(c->b, r, same_len_range(c, a, z, len));
    }
}

/* Integers lo..hi (either may be unbounded: has_lo / has_hi 0) */
static int int_range(struct sc *c, int has_lo, long long lo, int has_hi, long long hi) {
    if (!has_lo) lo = -MAX_MAG;
    if (!has_hi) hi = MAX_MAG;
    if (lo > hi) return err(c, "%sminimum is above maximum: no integer fits", "");
    int r = tllm_gram_rule(c->b), n = 0;
    if (lo < 0) { /* "-" and the magnitudes max(1,-hi) .. -lo */
        int neg = tllm_gram_rule(c->b), k = 0;
        magnitudes(c, neg, hi < 0 ? -hi : 1, -lo, &k);
        tllm_gram_byte(c->b, r, '-');
        tllm_gram_ref(c->b, r, neg);
        n++;
    }
    if (hi >= 0) {
        int pos = tllm_gram_rule(c->b), k = 0;
        magnitudes(c, pos, lo > 0 ? lo : 0, hi, &k);
        if (n++) tllm_gram_alt(c->b, r);
        tllm_gram_ref(c->b, r, pos);
    }
    return r;
}

/* ---- the schema walk ---- */

static int compile(struct sc *c, struct json_object *s);

static int path_push(struct sc *c, const char *seg, int idx) {
    size_t n = strlen(c->path);
    char tmp[96];
    if (idx >= 0) snprintf(tmp, sizeof tmp, "%s[%d]", seg, idx);
    else snprintf(tmp, sizeof tmp, "%s", seg);
    snprintf(c->path + n, sizeof c->path - n, "%s%s", n && seg[0] != '[' ? "." : "", tmp);
    return (int)n;
}

static int sub(struct sc *c, struct json_object *s, const char *seg, int idx) {
    int n = path_push(c, seg, idx);
    int r = compile(c, s);
    c->path[n] = 0;
    return r;
}

static int resolve_ref(struct sc *c, const char *ref) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ptr, ref)) return c->refs[i].rule;
    if (ref[0] != '#') return err(c, "$ref '%s' is outside this document (only \"#...\" is followed)", ref);
    struct json_object *t = c->root;
    const char *p = ref + 1;
    while (*p == '/') { /* a JSON pointer: segments with ~1 for / and ~0 for ~ */
        p++;
        char seg[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof seg) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) seg[k++] = p[1] == '0' ? '~' : '/', p += 2;
            else seg[k++] = *p++;
        }
        seg[k] = 0;
        struct json_object *next = NULL;
        if (json_object_is_type(t, json_type_object)) json_object_object_get_ex(t, seg, &next);
        else if (json_object_is_type(t, json_type_array)) {
            char *end;
            long i = strtol(seg, &end, 10);
            if (*seg && !*end && i >= 0 && (size_t)i < json_object_array_length(t)) next = json_object_array_get_idx(t, (size_t)i);
        }
        if (!next) return err(c, "$ref '%s' points at nothing", ref);
        t = next;
    }
    if (*p) return err(c, "$ref '%s' is not a JSON pointer", ref);
    struct sref *nr = realloc(c->refs, (size_t)(c->n_refs + 1) * sizeof *nr);
    char *dup = strdup(ref);
    if (!nr || !dup) {
        free(dup);
        if (nr) c->refs = nr;
        return err(c, "%sout of memory", "");
    }
    c->refs = nr;
    int r = tllm_gram_rule(c->b); /* before the body: the body may refer back to it */
    c->refs[c->n_refs++] = (struct sref){dup, r};
    char saved[sizeof c->path];
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref);
    int body = compile(c, t);
    memcpy(c->path, saved, sizeof saved);
    if (body < 0) return -1;
    tllm_gram_ref(c->b, r, body);
    return r;
}

/* The keywords understood; any other is refused unless it is an annotation */
static const char *const known_kw[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                       "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength",
                                       "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                       "exclusiveMaximum", "$defs", "definitions", "uniqueItems", NULL};
static const char *const annotation_kw[] = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "readOnly", "writeOnly", "deprecated", "contentMediaType",
                                            "contentEncoding", "discriminator", "nullable", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int get_count(struct sc *c, struct json_object *s, const char *key, long *v) {
    struct json_object *o;
    *v = -1;
    if (!json_object_object_get_ex(s, key, &o)) return 0;
    if (!json_object_is_type(o, json_type_int) || json_object_get_int64(o) < 0)
        return err(c, "'%s' must be a non-negative integer", key);
    int64_t x = json_object_get_int64(o);
    if (x > TLLM_REGEX_MAX_REPEAT) return err(c, "'%s' above " STR(TLLM_REGEX_MAX_REPEAT) " is not supported", key);
    *v = (long)x;
    return 0;
}

/* An integer bound: 1 and *v when present; -1 when present but not an integer of at most 16 digits */
static int get_bound(struct sc *c, struct json_object *s, const char *key, long long *v) {
    struct json_object *o;
    if (!json_object_object_get_ex(s, key, &o)) return 0;
    double d = json_object_get_double(o);
    if (!(json_object_is_type(o, json_type_int) || json_object_is_type(o, json_type_double)) || d != floor(d) ||
        fabs(d) > (double)MAX_MAG)
        return err(c, "'%s' is supported only as an integer of at most 16 digits", key);
    *v = json_object_is_type(o, json_type_int) ? json_object_get_int64(o) : (long long)d;
    return 1;
}

static int compile_object(struct sc *c, struct json_object *s) {
    struct tllm_gram_builder *b = c->b;
    struct json_object *props = NULL, *req = NULL, *addl = NULL;
    json_object_object_get_ex(s, "properties", &props);
    json_object_object_get_ex(s, "required", &req);
    json_object_object_get_ex(s, "additionalProperties", &addl);
    if (props && !json_object_is_type(props, json_type_object)) return err(c, "'%s' must be an object", "properties");
    if (req && !json_object_is_type(req, json_type_array)) return err(c, "'%s' must be an array", "required");
    int n_props = props ? json_object_object_length(props) : 0;
    int n_req = req ? (int)json_object_array_length(req) : 0;
    for (int i = 0; i < n_req; i++) {
        struct json_object *k = json_object_array_get_idx(req, (size_t)i);
        if (!json_object_is_type(k, json_type_string)) return err(c, "'%s' must list strings", "required");
        struct json_object *d;
        if (!props || !json_object_object_get_ex(props, json_object_get_string(k), &d))
            return err(c, "required property '%s' is not in properties", json_object_get_string(k));
    }
    int addl_rule = -1; /* the value rule of other keys, or -1: none */
    if (addl && json_object_is_type(addl, json_type_object)) addl_rule = sub(c, addl, "additionalProperties", -1);
    else if (addl && !json_object_is_type(addl, json_type_boolean)) return err(c, "'%s' must be a schema or a boolean", "additionalProperties");
    else if (!n_props && (!addl || json_object_get_boolean(addl))) addl_rule = any_value(c);
    if (c->failed) return -1;
    if (!n_props) return addl_rule >= 0 ? free_object(c, addl_rule) : lit_rule(c, "{}"); /* no keys at all */
    /* properties in order, each optional one may be left out: a_i = the members from i on with none
     * written yet, m_i = the same after one was (so each begins with a comma) */
    int ws = ws_rule(c);
    int *a = malloc((size_t)(n_props + 1) * sizeof *a), *m = malloc((size_t)(n_props + 1) * sizeof *m);
    int *kv = malloc((size_t)n_props * sizeof *kv);
    char *opt = calloc((size_t)n_props, 1);
    if (!a || !m || !kv || !opt) {
        free(a), free(m), free(kv), free(opt);
        return err(c, "%sout of memory", "");
    }
    int i = 0;
    json_object_object_foreach(props, key, val) {
        int ok = 0;
        for (int k = 0; k < n_req; k++) ok |= !strcmp(json_object_get_string(json_object_array_get_idx(req, (size_t)k)), key);
        opt[i] = !ok;
        char seg[96];
        snprintf(seg, sizeof seg, "properties.%s", key);
        int v = sub(c, val, seg, -1);
        if (v < 0) break;
        struct json_object *ks = json_object_new_string(key);
        kv[i] = member_rule(c, json_lit(c, ks), v);
        json_object_put(ks);
        i++;
    }
    int r = -1;
    if (!c->failed) {
        /* the end: other keys when allowed */
        a[n_props] = tllm_gram_rule(b);
        m[n_props] = tllm_gram_rule(b);
        if (addl_rule >= 0) {
            int extra = member_rule(c, string_rule(c), addl_rule);
            tllm_gram_alt(b, a[n_props]);
            tllm_gram_ref(b, a[n_props], extra);
            tllm_gram_ref(b, a[n_props], m[n_props]);
            tllm_gram_alt(b, m[n_props]);
            tllm_gram_byte(b, m[n_props], ',');
            tllm_gram_ref(b, m[n_props], ws);
            tllm_gram_ref(b, m[n_props], extra);
            tllm_gram_ref(b, m[n_props], m[n_props]);
        }
        for (int k = n_props - 1; k >= 0; k--) {
            a[k] = tllm_gram_rule(b);
            tllm_gram_ref(b, a[k], kv[k]);
            tllm_gram_ref(b, a[k], m[k + 1]);
            if (opt[k]) {
                tllm_gram_alt(b, a[k]);
                tllm_gram_ref(b, a[k], a[k + 1]);
            }
            m[k] = tllm_gram_rule(b);
            tllm_gram_byte(b, m[k], ',');
            tllm_gram_ref(b, m[k], ws);
            tllm_gram_ref(b, m[k], kv[k]);
            tllm_gram_ref(b, m[k], m[k + 1]);
            if (opt[k]) {
                tllm_gram_alt(b, m[k]);
                tllm_gram_ref(b, m[k], m[k + 1]);
            }
        }
        r = bracketed(c, '{', a[0], '}');
    }
    free(a), free(m), free(kv), free(opt);
    return c->failed ? -1 : r;
}

#define DATE_MD "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"

static int compile_string(struct sc *c, struct json_object *s) {
    long min, max;
    struct json_object *pat = NULL, *fmt = NULL;
    if (get_count(c, s, "minLength", &min) || get_count(c, s, "maxLength", &max)) return -1;
    json_object_object_get_ex(s, "pattern", &pat);
    json_object_object_get_ex(s, "format", &fmt);
    const char *p = pat ? json_object_get_string(pat) : NULL;
    if (pat && !json_object_is_type(pat, json_type_string)) return err(c, "'%s' must be a string", "pattern");
    if (!p && fmt && json_object_is_type(fmt, json_type_string)) {
        static const char *const fmts[][2] = {
            /* each month's days (February's 29th left out: a valid date without knowing leap years) */
            {"date", "^[0-9]{4}-" DATE_MD "$"},
            {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
            {"date-time", "^[0-9]{4}-" DATE_MD "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                          "(\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
            {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        };
        for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++)
            if (!strcmp(json_object_get_string(fmt), fmts[i][0])) p = fmts[i][1];
    }
    if (!p) return min <= 0 && max < 0 ? string_rule(c) : string_body(c, min > 0 ? (int)min : 0, (int)max);
    if (min >= 0 || max >= 0) return err(c, "minLength or maxLength together with %s is not supported", pat ? "pattern" : "format");
    int body;
    if (tllm_regex_rule(c->b, p, &body)) {
        char m[200];
        snprintf(m, sizeof m, "%s", tllm_errmsg());
        return err(c, "%s", m);
    }
    int r = tllm_gram_rule(c->b);
    tllm_gram_byte(c->b, r, '"');
    tllm_gram_ref(c->b, r, body);
    tllm_gram_byte(c->b, r, '"');
    return r;
}

static int compile_numeric(struct sc *c, struct json_object *s, int integer) {
    long long lo = 0, hi = 0, x;
    int has_lo = 0, has_hi = 0, k;
    if ((k = get_bound(c, s, "minimum", &x)) < 0) return -1;
    if (k) has_lo = 1, lo = x;
    if ((k = get_bound(c, s, "maximum", &x)) < 0) return -1;
    if (k) has_hi = 1, hi = x;
    struct json_object *o;
    if (json_object_object_get_ex(s, "exclusiveMinimum", &o)) {
        if (!integer) return err(c, "'%s' is supported on integers only", "exclusiveMinimum");
        if ((k = get_bound(c, s, "exclusiveMinimum", &x)) < 0) return -1;
        if (!has_lo || x + 1 > lo) lo = x + 1;
        has_lo = 1;
    }
    if (json_object_object_get_ex(s, "exclusiveMaximum", &o)) {
        if (!integer) return err(c, "'%s' is supported on integers only", "exclusiveMaximum");
        if ((k = get_bound(c, s, "exclusiveMaximum", &x)) < 0) return -1;
        if (!has_hi || x - 1 < hi) hi = x - 1;
        has_hi = 1;
    }
    if (!has_lo && !has_hi) return integer ? integer_rule(c) : number_rule(c);
    if (integer) return int_range(c, has_lo, lo, has_hi, hi);
    /* a number between integer bounds, lo >= 0: an integer part in [lo, hi) with a fraction, or hi */
    if (!has_lo || lo < 0) return err(c, "%sminimum and maximum on a number are supported from a minimum of 0 up", "");
    if (has_hi && hi < lo) return err(c, "%sminimum is above maximum: no number fits", "");
    int r = tllm_gram_rule(c->b);
    if (!has_hi || hi > lo) {
        tllm_gram_ref(c->b, r, int_range(c, 1, lo, has_hi, has_hi ? hi - 1 : 0));
        tllm_gram_ref(c->b, r, fraction_rule(c));
    }
    if (has_hi) {
        if (!has_hi || hi > lo) tllm_gram_alt(c->b, r);
        tllm_gram_ref(c->b, r, int_range(c, 1, hi, 1, hi));
    }
    return r;
}

static int compile_type(struct sc *c, struct json_object *s, const char *t) {
    if (!strcmp(t, "object")) return compile_object(c, s);
    if (!strcmp(t, "string")) return compile_string(c, s);
    if (!strcmp(t, "integer")) return compile_numeric(c, s, 1);
    if (!strcmp(t, "number")) return compile_numeric(c, s, 0);
    if (!strcmp(t, "boolean")) {
        int r = lit_rule(c, "true");
        tllm_gram_alt(c->b, r);
        tllm_gram_lit(c->b, r, "false", 5);
        return r;
    }
    if (!strcmp(t, "null")) return lit_rule(c, "null");
    if (!strcmp(t, "array")) {
        struct json_object *items = NULL;
        long min, max;
        if (get_count(c, s, "minItems", &min) || get_count(c, s, "maxItems", &max)) return -1;
        if (min > 0 && max >= 0 && max < min) return err(c, "%smaxItems is below minItems", "");
        json_object_object_get_ex(s, "items", &items);
        if (items && json_object_is_type(items, json_type_array)) return err(c, "'%s' as an array (tuples) is not supported", "items");
        int item = items ? sub(c, items, "items", -1) : any_value(c);
        if (item < 0) return -1;
        return array_of(c, item, min > 0 ? (int)min : 0, (int)max);
    }
    return err(c, "unknown type '%s'", t);
}

static int alternatives(struct sc *c, struct json_object *list, const char *kw) {
    if (!json_object_is_type(list, json_type_array) || !json_object_array_length(list))
        return err(c, "'%s' must be a non-empty array", kw);
    int r = tllm_gram_rule(c->b);
    for (size_t i = 0; i < json_object_array_length(list); i++) {
        int x = sub(c, json_object_array_get_idx(list, i), kw, (int)i);
        if (x < 0) return -1;
        if (i) tllm_gram_alt(c->b, r);
        tllm_gram_ref(c->b, r, x);
    }
    return r;
}

static int compile(struct sc *c, struct json_object *s) {
    if (c->failed) return -1;
    if (json_object_is_type(s, json_type_boolean)) {
        if (json_object_get_boolean(s)) return any_value(c);
        return err(c, "%sthe schema false accepts nothing", "");
    }
    if (!json_object_is_type(s, json_type_object)) return err(c, "%sa schema must be an object or a boolean", "");
    if (++c->depth > TLLM_SCHEMA_MAX_DEPTH) return err(c, "%sthe schema is nested too deep", "");
    int r = -1;
    json_object_object_foreach(s, key, v) {
        (void)v;
        if (!in_list(known_kw, key) && !in_list(annotation_kw, key) && strncmp(key, "x-", 2)) {
            r = err(c, "'%s' is not supported", key);
            goto out;
        }
    }
    struct json_object *o, *t = NULL;
    if (json_object_object_get_ex(s, "uniqueItems", &o) && json_object_get_boolean(o)) {
        r = err(c, "'%s' is not supported", "uniqueItems");
        goto out;
    }
    if (json_object_object_get_ex(s, "$ref", &o)) {
        r = json_object_is_type(o, json_type_string) ? resolve_ref(c, json_object_get_string(o))
                                                     : err(c, "'%s' must be a string", "$ref");
        goto out;
    }
    if (json_object_object_get_ex(s, "const", &o)) {
        r = json_lit(c, o);
        goto out;
    }
    if (json_object_object_get_ex(s, "enum", &o)) {
        if (!json_object_is_type(o, json_type_array) || !json_object_array_length(o)) {
            r = err(c, "'%s' must be a non-empty array", "enum");
            goto out;
        }
        r = tllm_gram_rule(c->b);
        for (size_t i = 0; i < json_object_array_length(o); i++) {
            if (i) tllm_gram_alt(c->b, r);
            tllm_gram_ref(c->b, r, json_lit(c, json_object_array_get_idx(o, i)));
        }
        goto out;
    }
    if (json_object_object_get_ex(s, "anyOf", &o) || json_object_object_get_ex(s, "oneOf", &o)) {
        r = alternatives(c, o, json_object_object_get_ex(s, "anyOf", NULL) ? "anyOf" : "oneOf");
        goto out;
    }
    if (json_object_object_get_ex(s, "allOf", &o)) {
        if (!json_object_is_type(o, json_type_array) || json_object_array_length(o) != 1) {
            r = err(c, "'%s' is supported with one schema only", "allOf");
            goto out;
        }
        r = sub(c, json_object_array_get_idx(o, 0), "allOf", 0);
        goto out;
    }
    json_object_object_get_ex(s, "type", &t);
    if (!t) { /* the type from the keywords, else anything */
        const char *guess = json_object_object_get_ex(s, "properties", NULL) ? "object"
                            : json_object_object_get_ex(s, "items", NULL) ? "array"
                            : json_object_object_get_ex(s, "pattern", NULL) ? "string"
                                                                             : NULL;
        r = guess ? compile_type(c, s, guess) : any_value(c);
    } else if (json_object_is_type(t, json_type_string)) {
        r = compile_type(c, s, json_object_get_string(t));
    } else if (json_object_is_type(t, json_type_array) && json_object_array_length(t)) {
        r = tllm_gram_rule(c->b);
        for (size_t i = 0; i < json_object_array_length(t) && !c->failed; i++) {
            struct json_object *ti = json_object_array_get_idx(t, i);
            if (!json_object_is_type(ti, json_type_string)) {
                r = err(c, "'%s' must name types", "type");
                goto out;
            }
            int x = compile_type(c, s, json_object_get_string(ti));
            if (i) tllm_gram_alt(c->b, r);
            tllm_gram_ref(c->b, r, x);
        }
    } else {
        r = err(c, "'%s' must be a string or a list of them", "type");
    }
out:
    c->depth--;
    return c->failed ? -1 : r;
}

static void sc_free(struct sc *c) {
    for (int i = 0; i < c->n_refs; i++) free(c->refs[i].ptr);
    free(c->refs);
}

static int finish(struct sc *c, int root, struct tllm_grammar **out) {
    int rc;
    if (c->failed) rc = TLLM_ERR_UNSUPPORTED, tllm_gram_builder_free(c->b);
    else if ((rc = tllm_gram_build(c->b, root, out))) tllm_errctx("%s", c->what);
    sc_free(c);
    return rc;
}

int tllm_schema_grammar(struct json_object *schema, const char *what, struct tllm_grammar **out) {
    *out = NULL;
    struct sc c = {.root = schema, .what = what};
    if (tllm_gram_builder_init(&c.b)) return TLLM_ERR_NOMEM;
    int root = schema ? compile(&c, schema) : free_object(&c, any_value(&c));
    return finish(&c, root, out);
}

static int format_schema(struct json_object *rf, const char *what, struct json_object **schema, char *where, size_t cap);

int tllm_schema_grammar_text(const char *text, const char *what, struct tllm_grammar **out) {
    struct json_object *schema = NULL;
    *out = NULL;
    int rc = tllm_json_parse(text, strlen(text), &schema, what);
    if (!rc) rc = tllm_schema_grammar(schema, what, out);
    json_object_put(schema);
    return rc;
}

int tllm_schema_tool_grammar(struct json_object *tools, const char *name, int parallel, struct json_object *rf,
                             const char *what, struct tllm_grammar **out) {
    *out = NULL;
    struct json_object *schema = NULL;
    char where[160];
    int with_format = rf ? format_schema(rf, "response_format", &schema, where, sizeof where) : 0;
    if (with_format < 0) return TLLM_ERR_ARG;
    struct sc c = {.root = tools, .what = what};
    if (tllm_gram_builder_init(&c.b)) return TLLM_ERR_NOMEM;
    struct tllm_gram_builder *b = c.b;
    int calls = tllm_gram_rule(b), n = 0;
    for (size_t i = 0; tools && i < json_object_array_length(tools) && !c.failed; i++) {
        struct json_object *fn = NULL, *nm = NULL, *params = NULL;
        json_object_object_get_ex(json_object_array_get_idx(tools, i), "function", &fn);
        if (!json_object_object_get_ex(fn, "name", &nm)) continue;
        if (name && strcmp(name, json_object_get_string(nm))) continue;
        json_object_object_get_ex(fn, "parameters", &params);
        c.root = params;
        snprintf(c.path, sizeof c.path, "tools[%zu].function.parameters", i);
        int args = params ? compile(&c, params) : free_object(&c, any_value(&c));
        c.path[0] = 0;
        if (args < 0) break;
        for (int k = 0; k < c.n_refs; k++) free(c.refs[k].ptr); /* refs are per function */
        c.n_refs = 0;
        /* {"name": "NAME", "arguments": ARGS} */
        int members = tllm_gram_rule(b), ws = ws_rule(&c);
        tllm_gram_ref(b, members, member_rule(&c, lit_rule(&c, "\"name\""), json_lit(&c, nm)));
        tllm_gram_byte(b, members, ',');
        tllm_gram_ref(b, members, ws);
        tllm_gram_ref(b, members, member_rule(&c, lit_rule(&c, "\"arguments\""), args));
        int call = bracketed(&c, '{', members, '}');
        if (n++) tllm_gram_alt(b, calls);
        tllm_gram_ref(b, calls, call);
    }
    if (!c.failed && !n) err(&c, name ? "no function named '%s' among the tools" : "%sno tools to call", name ? name : "");
    int block = tllm_gram_rule(b);
    tllm_gram_lit(b, block, "<tool_call>\n", 12);
    tllm_gram_ref(b, block, calls);
    tllm_gram_lit(b, block, "\n</tool_call>", 13);
    int root = tllm_gram_rule(b);
    tllm_gram_ref(b, root, block);
    if (parallel) {
        int more = tllm_gram_rule(b);
        tllm_gram_byte(b, more, '\n');
        tllm_gram_ref(b, more, block);
        tllm_gram_ref(b, root, tllm_gram_repeat(b, more, 0, -1));
    }
    if (with_format && !c.failed) { /* or an answer in the format */
        for (int k = 0; k < c.n_refs; k++) free(c.refs[k].ptr);
        c.n_refs = 0;
        c.root = schema, c.what = where, c.path[0] = 0;
        int answer = schema ? compile(&c, schema) : free_object(&c, any_value(&c));
        tllm_gram_alt(b, root);
        tllm_gram_ref(b, root, answer);
    }
    return finish(&c, root, out);
}

/* response_format's schema: 1 and *schema (NULL: any object) with *where its place, 0 for text, < 0 on
 * an error */
static int format_schema(struct json_object *rf, const char *what, struct json_object **schema, char *where, size_t cap) {
    struct json_object *t = NULL, *js = NULL;
    *schema = NULL;
    if (!json_object_is_type(rf, json_type_object) || !json_object_object_get_ex(rf, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return tllm_fail(TLLM_ERR_ARG, "%s: must be an object with a string 'type'", what), -1;
    const char *type = json_object_get_string(t);
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) {
        json_object_object_get_ex(rf, "schema", schema);
        snprintf(where, cap, "%s.schema", what);
        return 1;
    }
    if (strcmp(type, "json_schema"))
        return tllm_fail(TLLM_ERR_ARG, "%s: type '%.40s' is not one of text, json_object, json_schema", what, type), -1;
    if (!json_object_object_get_ex(rf, "json_schema", &js) || !json_object_is_type(js, json_type_object))
        return tllm_fail(TLLM_ERR_ARG, "%s: 'json_schema' must be an object holding the 'schema'", what), -1;
    json_object_object_get_ex(js, "schema", schema);
    snprintf(where, cap, "%s.json_schema.schema", what);
    return 1;
}

int tllm_response_format_grammar(struct json_object *rf, const char *what, struct tllm_grammar **out) {
    *out = NULL;
    struct json_object *schema;
    char where[160];
    int k = format_schema(rf, what, &schema, where, sizeof where);
    if (k <= 0) return k < 0 ? TLLM_ERR_ARG : TLLM_OK;
    return tllm_schema_grammar(schema, where, out);
}
