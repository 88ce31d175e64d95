/* JSON Schema patterns as grammar rules over a string's JSON text (regex.h). */
#include "engine/grammar/regex.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

/* A character class: ASCII members, and whether characters past ASCII belong */
struct cls {
    uint8_t ascii[16];
    int high;
};

#define TLLM_STR_(x) #x
#define TLLM_STR(x) TLLM_STR_(x)

struct rx {
    struct tllm_gram_builder *b;
    const char *p;
    size_t i, n;
    int depth;
    int utf8;          /* the multibyte character rule, made on first use */
    char err[128];
};

static void cls_add(struct cls *c, unsigned ch) { c->ascii[ch >> 3] |= (uint8_t)(1u << (ch & 7)); }
static int cls_has(const struct cls *c, unsigned ch) { return c->ascii[ch >> 3] >> (ch & 7) & 1; }
static void cls_range(struct cls *c, unsigned lo, unsigned hi) {
    for (unsigned ch = lo; ch <= hi; ch++) cls_add(c, ch);
}

static int fail(struct rx *x, const char *what) {
    if (!x->err[0]) snprintf(x->err, sizeof x->err, "%s at offset %zu", what, x->i);
    return -1;
}

static int utf8_rule(struct rx *x) {
    if (!x->utf8) x->utf8 = tllm_gram_utf8_multibyte(x->b);
    return x->utf8;
}

static void hex_digit(struct tllm_gram_builder *b, int r, unsigned v) {
    uint8_t set[32] = {0};
    const char *lo = "0123456789abcdef", *up = "0123456789ABCDEF";
    tllm_gram_set_add(set, (unsigned char)lo[v & 15]);
    tllm_gram_set_add(set, (unsigned char)up[v & 15]);
    tllm_gram_set(b, r, set);
}

/* One character of the class, written as JSON writes it inside a string */
static int cls_rule(struct rx *x, const struct cls *c) {
    struct tllm_gram_builder *b = x->b;
    int r = tllm_gram_rule(b), n_alt = 0;
    uint8_t plain[32] = {0};
    int any_plain = 0;
    for (unsigned ch = 0x20; ch < 0x80; ch++)
        if (cls_has(c, ch) && ch != '"' && ch != '\\') tllm_gram_set_add(plain, ch), any_plain = 1;
    if (any_plain) tllm_gram_set(b, r, plain), n_alt++;
    for (unsigned ch = 0; ch < 0x80; ch++) {
        if (!cls_has(c, ch) || (ch >= 0x20 && ch != '"' && ch != '\\')) continue;
        if (n_alt++) tllm_gram_alt(b, r);
        static const char short_esc[] = {['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f', ['\r'] = 'r', ['"'] = '"', ['\\'] = '\\'};
        tllm_gram_byte(b, r, '\\');
        if (ch < sizeof short_esc && short_esc[ch]) tllm_gram_byte(b, r, (unsigned char)short_esc[ch]);
        else {
            tllm_gram_lit(b, r, "u00", 3);
            hex_digit(b, r, ch >> 4);
            hex_digit(b, r, ch & 15);
        }
    }
    if (c->high) {
        if (n_alt++) tllm_gram_alt(b, r);
        tllm_gram_ref(b, r, utf8_rule(x));
    }
    if (!n_alt) tllm_gram_set(b, r, (uint8_t[32]){0}); /* an empty class: nothing matches */
    return r;
}

int tllm_regex_json_char(struct tllm_gram_builder *b) {
    int r = tllm_gram_rule(b);
    uint8_t plain[32] = {0}, esc[32] = {0};
    for (unsigned ch = 0x20; ch < 0x80; ch++)
        if (ch != '"' && ch != '\\') tllm_gram_set_add(plain, ch);
    for (const char *e = "\"\\/bfnrt"; *e; e++) tllm_gram_set_add(esc, (unsigned char)*e);
    tllm_gram_set(b, r, plain);
    tllm_gram_alt(b, r);
    tllm_gram_byte(b, r, '\\');
    tllm_gram_set(b, r, esc);
    tllm_gram_alt(b, r);
    tllm_gram_lit(b, r, "\\u", 2);
    for (int k = 0; k < 4; k++) {
        uint8_t hex[32] = {0};
        for (const char *h = "0123456789abcdefABCDEF"; *h; h++) tllm_gram_set_add(hex, (unsigned char)*h);
        tllm_gram_set(b, r, hex);
    }
    tllm_gram_alt(b, r);
    tllm_gram_ref(b, r, tllm_gram_utf8_multibyte(b));
    return r;
}

/* \d \w \s and their negations; *unicode: the class has members past ASCII in Python's re (the
 * validator most schemas meet), so a negation must not claim those characters */
static int class_escape(char e, struct cls *c, int *unicode) {
    struct cls t = {0};
    switch (e | 0x20) {
    case 'd': cls_range(&t, '0', '9'); break;
    case 'w':
        cls_range(&t, '0', '9'), cls_range(&t, 'a', 'z'), cls_range(&t, 'A', 'Z'), cls_add(&t, '_');
        break;
    case 's': for (const char *s = " \t\n\r\f\v"; *s; s++) cls_add(&t, (unsigned char)*s); break;
    default: return 0;
    }
    if (unicode) *unicode = 1;
    if (e >= 'a') {
        for (int k = 0; k < 16; k++) c->ascii[k] |= t.ascii[k];
    } else {
        for (int k = 0; k < 16; k++) c->ascii[k] |= (uint8_t)~t.ascii[k];
    }
    return 1;
}

static int hexval(int ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : -1;
}

/* One escaped character after the backslash (not a class escape): its code, or -1 with the error set */
static int escape_char(struct rx *x, int in_class) {
    char e = x->p[x->i++];
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'b':
        if (in_class) return '\b';
        x->i--;
        return fail(x, "\\b (a word boundary) is not supported");
    case 'x':
    case 'u': {
        int len = e == 'x' ? 2 : 4, v = 0;
        for (int k = 0; k < len; k++) {
            int h = x->i < x->n ? hexval((unsigned char)x->p[x->i]) : -1;
            if (h < 0) return fail(x, "a bad hexadecimal escape");
            v = v * 16 + h, x->i++;
        }
        if (v >= 0x80) return fail(x, "an escape past ASCII is not supported");
        return v;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9')) {
            x->i--;
            return fail(x, e >= '1' && e <= '9' ? "backreferences are not supported" : "an unknown escape");
        }
        if ((unsigned char)e >= 0x80) {
            x->i--;
            return fail(x, "an escaped character past ASCII");
        }
        return (unsigned char)e;
    }
}

static int parse_class(struct rx *x, struct cls *c) { /* after '[' */
    int neg = 0, unicode = 0, first = 1;
    if (x->i < x->n && x->p[x->i] == '^') neg = 1, x->i++;
    for (;;) {
        if (x->i >= x->n) return fail(x, "an unclosed [");
        char ch = x->p[x->i];
        if (ch == ']' && !first) break;
        first = 0;
        int lo;
        if (ch == '\\') {
            x->i++;
            if (x->i >= x->n) return fail(x, "a pattern ending in \\");
            if (class_escape(x->p[x->i], c, &unicode)) {
                x->i++;
                continue;
            }
            if ((lo = escape_char(x, 1)) < 0) return -1;
        } else if ((unsigned char)ch >= 0x80) {
            return fail(x, "a character past ASCII in a class is not supported");
        } else {
            lo = (unsigned char)ch, x->i++;
        }
        int hi = lo;
        if (x->i + 1 < x->n && x->p[x->i] == '-' && x->p[x->i + 1] != ']') {
            x->i++;
            char h = x->p[x->i];
            if (h == '\\') {
                x->i++;
                if (x->i >= x->n) return fail(x, "a pattern ending in \\");
                if ((hi = escape_char(x, 1)) < 0) return -1;
            } else if ((unsigned char)h >= 0x80) {
                return fail(x, "a character past ASCII in a class is not supported");
            } else {
                hi = (unsigned char)h, x->i++;
            }
            if (hi < lo) return fail(x, "a range out of order");
        }
        cls_range(c, (unsigned)lo, (unsigned)hi);
    }
    x->i++; /* ']' */
    if (neg) {
        for (int k = 0; k < 16; k++) c->ascii[k] = (uint8_t)~c->ascii[k];
        c->high = !unicode;
    }
    return 0;
}

static int parse_alt(struct rx *x);

static int parse_atom(struct rx *x) {
    char ch = x->p[x->i];
    struct cls c = {0};
    switch (ch) {
    case '(': {
        x->i++;
        if (x->i < x->n && x->p[x->i] == '?') {
            if (x->i + 1 < x->n && x->p[x->i + 1] == ':') x->i += 2;
            else return fail(x, "lookaround and named groups are not supported");
        }
        if (++x->depth > 100) return fail(x, "groups nested too deep");
        int r = parse_alt(x);
        x->depth--;
        if (r < 0) return -1;
        if (x->i >= x->n || x->p[x->i] != ')') return fail(x, "an unclosed (");
        x->i++;
        return r;
    }
    case '[':
        x->i++;
        if (parse_class(x, &c)) return -1;
        return cls_rule(x, &c);
    case '.':
        x->i++;
        cls_range(&c, 0, 0x7f);
        c.ascii['\n' >> 3] &= (uint8_t)~(1u << ('\n' & 7));
        c.ascii['\r' >> 3] &= (uint8_t)~(1u << ('\r' & 7));
        c.high = 1;
        return cls_rule(x, &c);
    case '\\': {
        x->i++;
        if (x->i >= x->n) return fail(x, "a pattern ending in \\");
        if (class_escape(x->p[x->i], &c, NULL)) {
            x->i++;
            return cls_rule(x, &c);
        }
        int v = escape_char(x, 0);
        if (v < 0) return -1;
        cls_add(&c, (unsigned)v);
        return cls_rule(x, &c);
    }
    case '^':
    case '$': return fail(x, "an anchor inside the pattern is not supported");
    case '*':
    case '+':
    case '?': return fail(x, "nothing to repeat");
    default:
        if ((unsigned char)ch >= 0x80) { /* a whole UTF-8 character, as it is */
            int len = tllm_utf8_valid_len((const unsigned char *)x->p + x->i, x->n - x->i);
            if (len <= 0) return fail(x, "a malformed UTF-8 character");
            int r = tllm_gram_rule(x->b);
            tllm_gram_lit(x->b, r, x->p + x->i, (size_t)len);
            x->i += (size_t)len;
            return r;
        }
        x->i++;
        cls_add(&c, (unsigned char)ch);
        return cls_rule(x, &c);
    }
}

static int parse_count(struct rx *x, long *v) {
    if (x->i >= x->n || x->p[x->i] < '0' || x->p[x->i] > '9') return 0;
    *v = 0;
    while (x->i < x->n && x->p[x->i] >= '0' && x->p[x->i] <= '9') {
        *v = *v * 10 + (x->p[x->i++] - '0');
        if (*v > 1000000) *v = 1000000;
    }
    return 1;
}

static int parse_repeat(struct rx *x) {
    int a = parse_atom(x);
    if (a < 0) return -1;
    while (x->i < x->n) {
        long lo, hi;
        char q = x->p[x->i];
        size_t at = x->i;
        if (q == '*') lo = 0, hi = -1, x->i++;
        else if (q == '+') lo = 1, hi = -1, x->i++;
        else if (q == '?') lo = 0, hi = 1, x->i++;
        else if (q == '{') {
            x->i++;
            if (!parse_count(x, &lo)) { /* not a quantifier: a literal '{' next time round */
                x->i = at;
                return a;
            }
            hi = lo;
            if (x->i < x->n && x->p[x->i] == ',') {
                x->i++;
                if (!parse_count(x, &hi)) hi = -1;
            }
            if (x->i >= x->n || x->p[x->i] != '}') {
                x->i = at;
                return a;
            }
            x->i++;
            if (hi >= 0 && hi < lo) return fail(x, "a repetition {n,m} with m < n");
            if (lo > TLLM_REGEX_MAX_REPEAT || hi > TLLM_REGEX_MAX_REPEAT) return fail(x, "a repetition count above " TLLM_STR(TLLM_REGEX_MAX_REPEAT));
        } else {
            return a;
        }
        if (x->i < x->n && x->p[x->i] == '?') x->i++; /* lazy: the same strings */
        if (x->i < x->n && x->p[x->i] == '+') return fail(x, "possessive quantifiers are not supported");
        a = tllm_gram_repeat(x->b, a, (int)lo, (int)hi);
        if (a < 0) return fail(x, "the pattern is too large");
    }
    return a;
}

static int parse_concat(struct rx *x) {
    int r = tllm_gram_rule(x->b);
    while (x->i < x->n && x->p[x->i] != '|' && x->p[x->i] != ')') {
        int a = parse_repeat(x);
        if (a < 0) return -1;
        tllm_gram_ref(x->b, r, a);
    }
    return r;
}

static int parse_alt(struct rx *x) {
    int r = tllm_gram_rule(x->b);
    for (int first = 1;; first = 0) {
        int c = parse_concat(x);
        if (c < 0) return -1;
        if (!first) tllm_gram_alt(x->b, r);
        tllm_gram_ref(x->b, r, c);
        if (x->i < x->n && x->p[x->i] == '|') x->i++;
        else return r;
    }
}

int tllm_regex_rule(struct tllm_gram_builder *b, const char *pattern, int *rule) {
    struct rx x = {.b = b, .p = pattern, .n = strlen(pattern)};
    int head = x.n && pattern[0] == '^', tail = 0;
    if (x.n > (size_t)head && pattern[x.n - 1] == '$') { /* an unescaped $ at the end */
        size_t bs = 0;
        while (bs + 2 <= x.n && pattern[x.n - 2 - bs] == '\\') bs++;
        tail = bs % 2 == 0;
    }
    x.i = (size_t)head;
    x.n -= (size_t)tail;
    int body = parse_alt(&x);
    if (body >= 0 && x.i < x.n) body = fail(&x, "an unmatched )");
    if (body < 0) return tllm_fail(TLLM_ERR_UNSUPPORTED, "pattern: %s", x.err);
    int r = tllm_gram_rule(b), any = -1;
    if (!head || !tail) any = tllm_gram_repeat(b, tllm_regex_json_char(b), 0, -1);
    if (!head) tllm_gram_ref(b, r, any);
    tllm_gram_ref(b, r, body);
    if (!tail) tllm_gram_ref(b, r, any);
    *rule = r;
    return TLLM_OK;
}
