/* The lexer: template text into TEXT runs and the tokens inside {{ }} and {% %}, with jinja2's
 * whitespace control as transformers configures it (trim_blocks, lstrip_blocks; "-" strips, "+" keeps). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja/jinja_int.h"

struct lexer {
    const char *s;
    size_t n, i;
    int line, col; /* of s[i] */
    struct jj_arena *a;
    struct jj_tokens *out;
    char *err;
    size_t errlen;
    const char *name;
};

static int fail(struct lexer *L, int line, int col, const char *msg) {
    snprintf(L->err, L->errlen, "%s:%d:%d: %s", L->name, line, col, msg);
    return -1;
}

static void advance(struct lexer *L, size_t k) {
    for (; k && L->i < L->n; k--, L->i++) {
        if (L->s[L->i] == '\n') L->line++, L->col = 1;
        else L->col++;
    }
}

static int push(struct lexer *L, struct jj_token t) {
    struct jj_tokens *o = L->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        struct jj_token *v = jj_alloc(L->a, cap * sizeof *v);
        if (!v) return fail(L, t.line, t.col, "out of memory");
        if (o->n) memcpy(v, o->v, o->n * sizeof *v);
        o->v = v, o->cap = cap;
    }
    o->v[o->n++] = t;
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int put_utf8(char *o, unsigned long cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63)), o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int hexval(char c) {
    return is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A string literal as Python reads it: the usual escapes, \xHH, \uHHHH, \UHHHHHHHH; others kept. */
static int lex_string(struct lexer *L) {
    int line = L->line, col = L->col;
    char q = L->s[L->i];
    size_t j = L->i + 1;
    while (j < L->n && L->s[j] != q) j += L->s[j] == '\\' ? 2 : 1;
    if (j >= L->n) return fail(L, line, col, "unterminated string");
    char *o = jj_alloc(L->a, j - L->i + 1);
    if (!o) return fail(L, line, col, "out of memory");
    size_t k = 0;
    for (size_t i = L->i + 1; i < j; i++) {
        char c = L->s[i];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        c = L->s[++i];
        int nhex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (nhex) {
            unsigned long cp = 0;
            int ok = i + nhex < j;
            for (int d = 1; ok && d <= nhex; d++) {
                int h = hexval(L->s[i + d]);
                if (h < 0) ok = 0;
                else cp = cp * 16 + (unsigned long)h;
            }
            if (!ok || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
                return fail(L, line, col, "bad \\x, \\u or \\U escape in a string");
            /* the escape's own bytes (2 + nhex) always hold its UTF-8 (at most 4) */
            k += (size_t)put_utf8(o + k, cp);
            i += (size_t)nhex;
            continue;
        }
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case 'a': o[k++] = '\a'; break;
        case '0': o[k++] = '\0'; break;
        case '\\': case '\'': case '"': o[k++] = c; break;
        case '\n': break; /* a line continuation */
        default: o[k++] = '\\', o[k++] = c; break;
        }
    }
    o[k] = '\0';
    int rc = push(L, (struct jj_token){.kind = T_STR, .line = line, .col = col, .p = o, .n = k});
    advance(L, j + 1 - L->i);
    return rc;
}

static int lex_number(struct lexer *L) {
    int line = L->line, col = L->col;
    size_t j = L->i;
    int is_float = 0;
    while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_')) j++;
    if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
        is_float = 1;
        for (j++; j < L->n && (is_digit(L->s[j]) || L->s[j] == '_');) j++;
    }
    if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
        size_t e = j + 1;
        if (e < L->n && (L->s[e] == '+' || L->s[e] == '-')) e++;
        if (e < L->n && is_digit(L->s[e])) {
            is_float = 1;
            for (j = e; j < L->n && is_digit(L->s[j]);) j++;
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t i = L->i; i < j; i++)
        if (L->s[i] != '_') {
            if (k + 1 >= sizeof buf) return fail(L, line, col, "number too long");
            buf[k++] = L->s[i];
        }
    buf[k] = '\0';
    struct jj_token t = {.kind = is_float ? T_FLOAT : T_INT, .line = line, .col = col};
    char *end;
    if (is_float) t.f = strtod(buf, &end);
    else {
        unsigned long long u = strtoull(buf, &end, 10);
        if (k > 18 && (u > (unsigned long long)INT64_MAX || k > 19)) return fail(L, line, col, "integer too large");
        t.i = (long long)u;
    }
    advance(L, j - L->i);
    return push(L, t);
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(", ")", "[",
                                  "]", "{", "}", ",", ".", ":", "|", "=", "<", ">", NULL};

/* Inside {{ }} or {% %}: tokens until the closing delimiter (only where brackets are balanced). */
static int lex_tag(struct lexer *L, int is_block, int *trim_after, int *ended_newline) {
    int depth = 0;
    char close = is_block ? '%' : '}';
    for (;;) {
        while (L->i < L->n && is_space(L->s[L->i])) advance(L, 1);
        if (L->i >= L->n)
            return fail(L, L->line, L->col, depth ? "unclosed bracket" : is_block ? "unclosed {% tag" : "unclosed {{ tag");
        const char *p = L->s + L->i;
        size_t rest = L->n - L->i;
        int line = L->line, col = L->col;
        if (depth == 0) {
            int minus = rest >= 3 && p[0] == '-' && p[1] == close && p[2] == '}';
            int plus = is_block && rest >= 3 && p[0] == '+' && p[1] == close && p[2] == '}';
            if (minus || plus || (rest >= 2 && p[0] == close && p[1] == '}')) {
                if (push(L, (struct jj_token){.kind = is_block ? T_BLOCK_END : T_VAR_END, .line = line, .col = col}))
                    return -1;
                advance(L, minus || plus ? 3 : 2);
                *trim_after = minus;
                *ended_newline = 0;
                if (!minus && !plus && is_block && L->i < L->n && L->s[L->i] == '\n') { /* trim_blocks */
                    advance(L, 1);
                    *ended_newline = 1;
                }
                return 0;
            }
        }
        if (*p == '\'' || *p == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        if (is_digit(*p)) {
            if (lex_number(L)) return -1;
            continue;
        }
        if (is_name0(*p)) {
            size_t j = 1;
            while (j < rest && (is_name0(p[j]) || is_digit(p[j]))) j++;
            if (push(L, (struct jj_token){.kind = T_NAME, .line = line, .col = col, .p = p, .n = j})) return -1;
            advance(L, j);
            continue;
        }
        const char *op = NULL;
        for (int k = 0; OPS[k]; k++)
            if (rest >= strlen(OPS[k]) && !memcmp(p, OPS[k], strlen(OPS[k]))) {
                op = OPS[k];
                break;
            }
        if (!op) {
            char msg[64];
            snprintf(msg, sizeof msg, "unexpected character '%c'", *p);
            return fail(L, line, col, msg);
        }
        if (*op == '(' || *op == '[' || *op == '{') depth++;
        if (*op == ')' || *op == ']' || *op == '}') {
            if (depth == 0) return fail(L, line, col, "unbalanced bracket");
            depth--;
        }
        if (push(L, (struct jj_token){.kind = T_OP, .line = line, .col = col, .p = op, .n = strlen(op)})) return -1;
        advance(L, strlen(op));
    }
}

int jj_lex(const char *src, size_t len, struct jj_arena *a, struct jj_tokens *out, char *err, size_t errlen,
           const char *name) {
    struct lexer L = {.s = src, .n = len, .line = 1, .col = 1, .a = a, .out = out, .err = err, .errlen = errlen,
                      .name = name};
    int strip_next = 0;    /* the previous tag ended with "-": strip the text's leading whitespace */
    int line_starting = 1; /* the text begins a line (for lstrip_blocks) */
    while (L.i < L.n) {
        /* the text up to the next tag opener */
        size_t j = L.i;
        int kind = 0; /* 1 {{, 2 {%, 3 {# */
        for (; j + 1 < L.n; j++)
            if (L.s[j] == '{' && (L.s[j + 1] == '{' || L.s[j + 1] == '%' || L.s[j + 1] == '#')) {
                kind = L.s[j + 1] == '{' ? 1 : L.s[j + 1] == '%' ? 2 : 3;
                break;
            }
        if (!kind) j = L.n;
        size_t tb = L.i, te = j;
        if (strip_next)
            while (tb < te && is_space(L.s[tb])) tb++;
        char sign = kind && j + 2 < L.n ? L.s[j + 2] : 0;
        if (kind && sign == '-') {
            while (te > tb && is_space(L.s[te - 1])) te--;
        } else if (kind && sign != '+' && kind != 1) { /* lstrip_blocks */
            size_t l = te;
            while (l > L.i && L.s[l - 1] != '\n') l--;
            if (l > L.i || line_starting) {
                size_t w = l;
                while (w < te && is_space(L.s[w])) w++;
                if (w == te && l < te) te = l;
            }
        }
        if (te > tb) {
            /* line and column of the text's start */
            struct lexer M = L;
            advance(&M, tb - L.i);
            if (push(&L, (struct jj_token){.kind = T_TEXT, .line = M.line, .col = M.col, .p = L.s + tb, .n = te - tb}))
                return -1;
        }
        advance(&L, j - L.i);
        if (!kind) break;
        int line = L.line, col = L.col;
        advance(&L, 2 + (sign == '-' || sign == '+'));
        if (kind == 3) { /* a comment */
            size_t k = L.i;
            while (k + 1 < L.n && !(L.s[k] == '#' && L.s[k + 1] == '}')) k++;
            if (k + 1 >= L.n) return fail(&L, line, col, "unclosed comment");
            int minus = k > L.i && L.s[k - 1] == '-';
            int plus = k > L.i && L.s[k - 1] == '+';
            advance(&L, k + 2 - L.i);
            strip_next = minus;
            line_starting = 0;
            if (!minus && !plus && L.i < L.n && L.s[L.i] == '\n') advance(&L, 1), line_starting = 1;
            continue;
        }
        /* {% raw %} ... {% endraw %}: the text between, verbatim */
        if (kind == 2) {
            size_t k = L.i;
            while (k < L.n && is_space(L.s[k])) k++;
            if (L.n - k >= 3 && !memcmp(L.s + k, "raw", 3) && (k + 3 >= L.n || !is_name0(L.s[k + 3]))) {
                size_t e = k + 3;
                while (e < L.n && is_space(L.s[e])) e++;
                int rminus = e < L.n && L.s[e] == '-';
                if (rminus) e++;
                if (L.n - e < 2 || L.s[e] != '%' || L.s[e + 1] != '}') return fail(&L, line, col, "bad raw tag");
                e += 2;
                size_t body = e;
                if (rminus) while (body < L.n && is_space(L.s[body])) body++;
                else if (body < L.n && L.s[body] == '\n') body++;
                const char *end = NULL;
                for (size_t q = body; q + 1 < L.n && !end; q++) {
                    if (L.s[q] != '{' || L.s[q + 1] != '%') continue;
                    size_t r = q + 2;
                    if (r < L.n && (L.s[r] == '-' || L.s[r] == '+')) r++;
                    while (r < L.n && is_space(L.s[r])) r++;
                    if (L.n - r >= 6 && !memcmp(L.s + r, "endraw", 6)) end = L.s + q;
                }
                if (!end) return fail(&L, line, col, "{% raw %} without {% endraw %}");
                size_t be = (size_t)(end - L.s);
                int eminus = be + 2 < L.n && L.s[be + 2] == '-';
                size_t bt = be;
                if (eminus) while (bt > body && is_space(L.s[bt - 1])) bt--;
                else { /* lstrip_blocks before {% endraw %} */
                    size_t l = bt;
                    while (l > body && L.s[l - 1] != '\n') l--;
                    size_t w = l;
                    while (w < bt && is_space(L.s[w])) w++;
                    if (w == bt && (l > body)) bt = l;
                }
                if (bt > body && push(&L, (struct jj_token){.kind = T_TEXT, .line = line, .col = col, .p = L.s + body,
                                                             .n = bt - body}))
                    return -1;
                size_t close = be + 2;
                while (close + 1 < L.n && !(L.s[close] == '%' && L.s[close + 1] == '}')) close++;
                if (close + 1 >= L.n) return fail(&L, line, col, "unclosed endraw tag");
                int cminus = L.s[close - 1] == '-', cplus = L.s[close - 1] == '+';
                advance(&L, close + 2 - L.i);
                strip_next = cminus;
                line_starting = 0;
                if (!cminus && !cplus && L.i < L.n && L.s[L.i] == '\n') advance(&L, 1), line_starting = 1;
                continue;
            }
        }
        if (push(&L, (struct jj_token){.kind = kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = line, .col = col}))
            return -1;
        if (lex_tag(&L, kind == 2, &strip_next, &line_starting)) return -1;
    }
    return push(&L, (struct jj_token){.kind = T_EOF, .line = L.line, .col = L.col});
}
