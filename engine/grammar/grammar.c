/* Grammar rules and their parse-stack states (grammar.h). */
#include "engine/grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* An element: its kind in the top two bits, its argument (a set or a rule) below */
enum { GE_END = 0, GE_ALT = 1, GE_SET = 2, GE_REF = 3 };
#define GE(kind, arg) ((uint32_t)(kind) << 30 | (uint32_t)(arg))
#define GE_KIND(e) ((e) >> 30)
#define GE_ARG(e) ((e) & 0x3fffffffu)

struct brule {
    uint32_t *el; /* alternatives separated by GE_ALT, no GE_END yet */
    int n, cap;
    int chain_k;  /* o_k of a bounded repeat (tllm_gram_repeat: "" | x o_(k-1)), else 0 */
};

struct tllm_gram_builder {
    struct brule *rules;
    int n_rules, cap_rules;
    uint8_t (*sets)[32];
    int n_sets, cap_sets;
    long n_elems;
    int failed; /* out of memory or past TLLM_GRAMMAR_MAX_ELEMS */
};

struct tllm_grammar {
    uint32_t *el;         /* [n_el] every rule's elements, each rule ended by GE_END */
    int n_el;
    int *alts;            /* the first element of each alternative, rule by rule */
    int *alt_off;         /* [n_rules + 1] rule r's alternatives: alts[alt_off[r] .. alt_off[r+1]) */
    int n_rules;
    uint8_t (*sets)[32];  /* [n_sets] the byte sets GE_SET elements name */
    int root;
    int refs;             /* holders (tllm_grammar_ref); atomic: a server's threads share grammars */
    /* counted repeats, for tllm_gram_mask_key (NULL when the grammar has none): */
    int32_t *run;         /* [n_el] at a reference to a rule that reads at least a byte: how many equal
                           * references follow from here (x{min}'s copies), else 0 */
    int32_t *chain_k;     /* [n_el] in rule o_k of x{0,max}'s chain: k (o_(k-1) is laid out just before,
                           * CHAIN_RULE_LEN elements earlier), else 0 */
};
/* a chain rule's elements: GE_ALT, x, o_(k-1), GE_END */
#define CHAIN_RULE_LEN 4

int tllm_gram_builder_init(struct tllm_gram_builder **out) {
    *out = calloc(1, sizeof **out);
    return *out ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
}

void tllm_gram_builder_free(struct tllm_gram_builder *b) {
    if (!b) return;
    for (int i = 0; i < b->n_rules; i++) free(b->rules[i].el);
    free(b->rules);
    free(b->sets);
    free(b);
}

static int grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

int tllm_gram_rule(struct tllm_gram_builder *b) {
    if (b->failed || b->n_rules >= TLLM_GRAMMAR_MAX_ELEMS / 2 ||
        grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules)) {
        b->failed = 1;
        return -1;
    }
    b->rules[b->n_rules] = (struct brule){0};
    return b->n_rules++;
}

static void push(struct tllm_gram_builder *b, int r, uint32_t e) {
    if (b->failed || r < 0 || r >= b->n_rules) {
        b->failed = 1;
        return;
    }
    struct brule *x = &b->rules[r];
    if (++b->n_elems > TLLM_GRAMMAR_MAX_ELEMS || grow((void **)&x->el, &x->cap, x->n + 1, sizeof *x->el)) {
        b->failed = 1;
        return;
    }
    x->el[x->n++] = e;
}

void tllm_gram_set(struct tllm_gram_builder *b, int r, const uint8_t set[32]) {
    /* consecutive equal sets (a string's characters) share one entry */
    if (!b->failed && !(b->n_sets && !memcmp(b->sets[b->n_sets - 1], set, 32))) {
        if (b->n_sets >= (1 << 24) || grow((void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets)) {
            b->failed = 1;
            return;
        }
        memcpy(b->sets[b->n_sets++], set, 32);
    }
    if (!b->failed) push(b, r, GE(GE_SET, b->n_sets - 1));
}

void tllm_gram_range(struct tllm_gram_builder *b, int r, unsigned char lo, unsigned char hi) {
    uint8_t set[32] = {0};
    for (unsigned c = lo; c <= hi; c++) tllm_gram_set_add(set, c);
    tllm_gram_set(b, r, set);
}

void tllm_gram_byte(struct tllm_gram_builder *b, int r, unsigned char c) { tllm_gram_range(b, r, c, c); }

void tllm_gram_lit(struct tllm_gram_builder *b, int r, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) tllm_gram_byte(b, r, (unsigned char)s[i]);
}

void tllm_gram_ref(struct tllm_gram_builder *b, int r, int rule) {
    if (rule < 0) b->failed = 1;
    else push(b, r, GE(GE_REF, rule));
}

void tllm_gram_alt(struct tllm_gram_builder *b, int r) { push(b, r, GE(GE_ALT, 0)); }

int tllm_gram_repeat(struct tllm_gram_builder *b, int x, int min, int max) {
    if (x < 0 || min < 0 || (max >= 0 && max < min)) return -1;
    int tail = tllm_gram_rule(b); /* what may follow the min required copies */
    if (max < 0) {                /* tail ::= x tail | "" */
        tllm_gram_ref(b, tail, x);
        tllm_gram_ref(b, tail, tail);
        tllm_gram_alt(b, tail);
    } else { /* o_k ::= "" | x o_(k-1), built from o_0 up */
        for (int k = 1; k <= max - min && !b->failed; k++) {
            int o = tllm_gram_rule(b); /* o_k: the rule just after o_(k-1), every o of the same elements */
            if (o >= 0) b->rules[o].chain_k = k;
            tllm_gram_alt(b, o);
            tllm_gram_ref(b, o, x);
            tllm_gram_ref(b, o, tail);
            tail = o;
        }
    }
    if (min == 0) return b->failed ? -1 : tail;
    int r = tllm_gram_rule(b);
    for (int i = 0; i < min; i++) tllm_gram_ref(b, r, x);
    tllm_gram_ref(b, r, tail);
    return b->failed ? -1 : r;
}

struct tllm_grammar *tllm_grammar_ref(struct tllm_grammar *g) {
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

void tllm_grammar_free(struct tllm_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    free(g->el);
    free(g->alts);
    free(g->alt_off);
    free(g->sets);
    free(g->run);
    free(g->chain_k);
    free(g);
}

/* Left recursion: rule r reaches itself through references that come before any byte. */
static int left_recursive(const struct tllm_grammar *g, const uint8_t *nullable, int r, uint8_t *mark) {
    if (mark[r] == 1) return 1;
    if (mark[r] == 2) return 0;
    mark[r] = 1;
    for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
        for (int p = g->alts[a]; GE_KIND(g->el[p]) == GE_REF; p++) {
            int x = (int)GE_ARG(g->el[p]);
            if (left_recursive(g, nullable, x, mark)) return 1;
            if (!nullable[x]) break;
        }
    mark[r] = 2;
    return 0;
}

/* g->run, g->chain_k (left NULL when no repeat is long enough to matter); -1 out of memory */
static int counted_repeats(struct tllm_grammar *g, const struct tllm_gram_builder *b, const uint8_t *nullable) {
    int any = 0;
    for (int r = 0; r < b->n_rules && !any; r++) any = b->rules[r].chain_k > 1;
    for (int e = 0; e + 2 < g->n_el && !any; e++)
        any = GE_KIND(g->el[e]) == GE_REF && g->el[e + 1] == g->el[e] && g->el[e + 2] == g->el[e];
    if (!any) return 0;
    g->run = calloc((size_t)g->n_el + 1, sizeof *g->run);
    g->chain_k = calloc((size_t)g->n_el + 1, sizeof *g->chain_k);
    if (!g->run || !g->chain_k) return -1;
    for (int e = g->n_el - 1; e >= 0; e--)
        if (GE_KIND(g->el[e]) == GE_REF && !nullable[GE_ARG(g->el[e])]) g->run[e] = g->el[e + 1] == g->el[e] ? g->run[e + 1] + 1 : 1;
    for (int r = 0, e = 0; r < b->n_rules; r++) {
        int len = b->rules[r].n + 1; /* with its GE_END */
        /* o_k is "" | x o_(k-1), o_(k-1) the rule before, and its x reads a byte (a string's character: else
         * o_k's texts need not be longer) */
        const uint32_t *el = b->rules[r].el;
        int k = b->rules[r].chain_k;
        int ok = k > 1 && b->rules[r].n + 1 == CHAIN_RULE_LEN && GE_KIND(el[0]) == GE_ALT && GE_KIND(el[1]) == GE_REF &&
                 GE_KIND(el[2]) == GE_REF && (int)GE_ARG(el[2]) == r - 1 && !nullable[GE_ARG(el[1])];
        for (int i = 0; i < len; i++, e++)
            if (ok) g->chain_k[e] = k;
    }
    return 0;
}

int tllm_gram_build(struct tllm_gram_builder *b, int root, struct tllm_grammar **out) {
    *out = NULL;
    struct tllm_grammar *g = NULL;
    int rc = TLLM_OK;
    if (b->failed || root < 0 || root >= b->n_rules) {
        rc = tllm_fail(TLLM_ERR_LIMIT, "the grammar is too large (more than %d elements)", TLLM_GRAMMAR_MAX_ELEMS);
        goto done;
    }
    if (!(g = calloc(1, sizeof *g))) goto nomem;
    long n_el = 0, n_alts = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_el += b->rules[r].n + 1;
        n_alts++;
        for (int i = 0; i < b->rules[r].n; i++) n_alts += GE_KIND(b->rules[r].el[i]) == GE_ALT;
    }
    g->n_rules = b->n_rules, g->n_el = (int)n_el, g->root = root, g->refs = 1;
    g->el = malloc((size_t)(n_el + 1) * sizeof *g->el);
    g->alts = malloc((size_t)n_alts * sizeof *g->alts);
    g->alt_off = malloc((size_t)(b->n_rules + 1) * sizeof *g->alt_off);
    g->sets = malloc((size_t)(b->n_sets ? b->n_sets : 1) * sizeof *g->sets);
    if (!g->el || !g->alts || !g->alt_off || !g->sets) goto nomem;
    if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
    int p = 0, a = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->alt_off[r] = a;
        g->alts[a++] = p;
        for (int i = 0; i < b->rules[r].n; i++) {
            uint32_t e = b->rules[r].el[i];
            g->el[p++] = e;
            if (GE_KIND(e) == GE_ALT) g->alts[a++] = p;
        }
        g->el[p++] = GE(GE_END, 0);
    }
    g->alt_off[b->n_rules] = a;
    /* nullable rules (to a fixed point), then no rule may begin with itself */
    uint8_t *nullable = calloc((size_t)g->n_rules, 1), *mark = calloc((size_t)g->n_rules, 1);
    if (!nullable || !mark) {
        free(nullable), free(mark);
        goto nomem;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (int x = g->alt_off[r]; x < g->alt_off[r + 1] && !nullable[r]; x++) {
                int q = g->alts[x];
                while (GE_KIND(g->el[q]) == GE_REF && nullable[GE_ARG(g->el[q])]) q++;
                if (GE_KIND(g->el[q]) == GE_END || GE_KIND(g->el[q]) == GE_ALT) nullable[r] = 1, changed = 1;
            }
        }
    }
    int bad = -1;
    for (int r = 0; r < g->n_rules && bad < 0; r++)
        if (left_recursive(g, nullable, r, mark)) bad = r;
    if (bad < 0 && counted_repeats(g, b, nullable)) {
        free(nullable), free(mark);
        goto nomem;
    }
    free(nullable), free(mark);
    if (bad >= 0) {
        rc = tllm_fail(TLLM_ERR_FORMAT, "grammar rule %d refers to itself before reading anything (left recursion)", bad);
        goto done;
    }
    *out = g, g = NULL;
    goto done;
nomem:
    rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
done:
    tllm_grammar_free(g);
    tllm_gram_builder_free(b);
    return rc;
}

/* ---- states ---- */

void tllm_gram_state_free(struct tllm_gram_state *st) {
    free(st->w);
    free(st->seen);
    memset(st, 0, sizeof *st);
}

static int state_reserve(struct tllm_gram_state *st, int words) {
    if (grow((void **)&st->w, &st->cap, words, sizeof *st->w)) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    return TLLM_OK;
}

int tllm_gram_state_copy(struct tllm_gram_state *dst, const struct tllm_gram_state *src) {
    if (state_reserve(dst, src->n_words ? src->n_words : 1)) return TLLM_ERR_NOMEM;
    if (src->n_words) memcpy(dst->w, src->w, (size_t)src->n_words * sizeof *src->w);
    dst->n_words = src->n_words, dst->n_stacks = src->n_stacks;
    return TLLM_OK;
}

int tllm_gram_accepting(const struct tllm_gram_state *st) {
    for (int i = 0; i < st->n_words; i += 1 + (int)st->w[i])
        if (st->w[i] == 0) return 1;
    return 0;
}

/* Add one stack, unless the set holds it already or is full */
static int add_stack(struct tllm_gram_state *out, const uint32_t *stk, int len) {
    for (int i = 0; i < out->n_words; i += 1 + (int)out->w[i])
        if ((int)out->w[i] == len && !memcmp(out->w + i + 1, stk, (size_t)len * sizeof *stk)) return TLLM_OK;
    if (out->n_stacks >= TLLM_GRAMMAR_MAX_STACKS) return TLLM_OK;
    if (state_reserve(out, out->n_words + 1 + len)) return TLLM_ERR_NOMEM;
    out->w[out->n_words] = (uint32_t)len;
    memcpy(out->w + out->n_words + 1, stk, (size_t)len * sizeof *stk);
    out->n_words += 1 + len;
    out->n_stacks++;
    return TLLM_OK;
}

static int is_item(uint32_t e) { return GE_KIND(e) == GE_SET || GE_KIND(e) == GE_REF; }

/* stk[0..len) with references on top replaced by each alternative of their rule, until every stack
 * added has a byte set on top (or is empty: a finished parse). buf has TLLM_GRAMMAR_MAX_DEPTH + 1 room. */
/* The stacks with a reference on top that one advance has expanded (by a 64-bit hash of their
 * positions): a stack reached again through other empty alternatives expands to what it did the first
 * time, so it is skipped. Without this, nested optional parts (the pattern "(x?)?)?..." or a schema's
 * chain of optional properties) expand along every combination of their empty choices: 2^n paths. */
#define SEEN_SLOTS 4096
struct seen {
    uint64_t h[SEEN_SLOTS];     /* 0: empty */
    int used[SEEN_SLOTS / 2];   /* the slots filled, to empty them after the step */
    int n;
};

/* The scratch of the state being written (made on first use, emptied by seen_done) */
static struct seen *seen_of(struct tllm_gram_state *out) {
    if (!out->seen) out->seen = calloc(1, sizeof(struct seen));
    return out->seen;
}

static void seen_done(struct seen *sn) {
    for (int i = 0; i < sn->n; i++) sn->h[sn->used[i]] = 0;
    sn->n = 0;
}

/* 1 when the stack is new (now recorded); 0 when it was expanded already, or the table is full (the
 * expansion stops there: a grammar that needs more in one step is refused that way) */
static int first_visit(struct seen *sn, const uint32_t *stk, int len) {
    if (sn->n >= SEEN_SLOTS / 2) return 0;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)len;
    for (int i = 0; i < len; i++) h = (h ^ stk[i]) * 0x100000001b3ull, h ^= h >> 32;
    if (!h) h = 1;
    for (int i = (int)(h & (SEEN_SLOTS - 1));; i = (i + 1) & (SEEN_SLOTS - 1)) {
        if (sn->h[i] == h) return 0;
        if (!sn->h[i]) {
            sn->h[i] = h;
            sn->used[sn->n++] = i;
            return 1;
        }
    }
}

static int expand(const struct tllm_grammar *g, uint32_t *stk, int len, struct tllm_gram_state *out, int guard,
                  struct seen *sn) {
    if (len == 0 || GE_KIND(g->el[stk[len - 1]]) == GE_SET) return add_stack(out, stk, len);
    if (guard > TLLM_GRAMMAR_MAX_DEPTH || !first_visit(sn, stk, len)) return TLLM_OK;
    uint32_t top = stk[len - 1];
    int r = (int)GE_ARG(g->el[top]), blen = len - 1;
    if (is_item(g->el[top + 1])) stk[blen++] = top + 1; /* where to go on after the rule; none at a rule's end */
    for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
        int rc, first = g->alts[a];
        if (!is_item(g->el[first])) rc = expand(g, stk, blen, out, guard + 1, sn);
        else if (blen >= TLLM_GRAMMAR_MAX_DEPTH) rc = TLLM_OK; /* too deep: this way is dropped */
        else {
            stk[blen] = (uint32_t)first;
            rc = expand(g, stk, blen + 1, out, guard + 1, sn);
        }
        if (rc) return rc;
    }
    stk[len - 1] = top; /* as it came: a caller's later alternatives read the stack below its own top */
    return TLLM_OK;
}

int tllm_gram_start(const struct tllm_grammar *g, struct tllm_gram_state *st) {
    st->n_words = st->n_stacks = 0;
    struct seen *sn = seen_of(st);
    if (!sn) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    uint32_t buf[TLLM_GRAMMAR_MAX_DEPTH + 1];
    int rc = TLLM_OK;
    for (int a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        int first = g->alts[a];
        if (!is_item(g->el[first])) rc = add_stack(st, buf, 0);
        else {
            buf[0] = (uint32_t)first;
            rc = expand(g, buf, 1, st, 0, sn);
        }
        if (rc) break;
    }
    seen_done(sn);
    return rc;
}

int tllm_gram_advance(const struct tllm_grammar *g, const struct tllm_gram_state *st, unsigned char c,
                      struct tllm_gram_state *out) {
    out->n_words = out->n_stacks = 0;
    struct seen *sn = seen_of(out);
    if (!sn) return tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    int rc = TLLM_OK;
    uint32_t buf[TLLM_GRAMMAR_MAX_DEPTH + 1];
    for (int i = 0; i < st->n_words; i += 1 + (int)st->w[i]) {
        int len = (int)st->w[i];
        if (!len) continue;
        uint32_t top = st->w[i + len], e = g->el[top];
        if (!tllm_gram_set_has(g->sets[GE_ARG(e)], c)) continue;
        memcpy(buf, st->w + i + 1, (size_t)(len - 1) * sizeof *buf);
        int blen = len - 1;
        if (is_item(g->el[top + 1])) buf[blen++] = top + 1;
        if ((rc = expand(g, buf, blen, out, 0, sn))) break;
    }
    seen_done(sn);
    return rc;
}

/* Where position e goes in a mask key: a run of references (x{min}) with more than keep still to come, or
 * a chain rule o_k (x{0,max}) with k > keep, moved to where keep remain */
static uint32_t key_position(const struct tllm_grammar *g, uint32_t e, int keep) {
    if (g->run[e] > keep) return e + (uint32_t)(g->run[e] - keep);
    if (g->chain_k[e] > keep) return e - (uint32_t)((g->chain_k[e] - keep) * CHAIN_RULE_LEN);
    return e;
}

int tllm_gram_mask_key(const struct tllm_grammar *g, const struct tllm_gram_state *st, int max_len,
                       struct tllm_gram_state *out) {
    if (!g->run) return 0;
    int keep = max_len + 1, moved = 0;
    for (int i = 0; i < st->n_words && !moved; i += 1 + (int)st->w[i])
        for (int k = 1; k <= (int)st->w[i] && !moved; k++) moved = key_position(g, st->w[i + k], keep) != st->w[i + k];
    if (!moved) return 0;
    out->n_words = out->n_stacks = 0;
    uint32_t buf[TLLM_GRAMMAR_MAX_DEPTH + 1];
    for (int i = 0; i < st->n_words; i += 1 + (int)st->w[i]) {
        int len = (int)st->w[i];
        for (int k = 0; k < len; k++) buf[k] = key_position(g, st->w[i + 1 + k], keep);
        if (add_stack(out, buf, len)) return -1;
    }
    return 1;
}

int tllm_gram_match(const struct tllm_grammar *g, const char *text, size_t n) {
    struct tllm_gram_state a = {0}, b = {0};
    int ok = !tllm_gram_start(g, &a);
    for (size_t i = 0; ok && i < n; i++) {
        ok = !tllm_gram_advance(g, &a, (unsigned char)text[i], &b) && b.n_stacks > 0;
        struct tllm_gram_state t = a;
        a = b, b = t;
    }
    ok = ok && tllm_gram_accepting(&a);
    tllm_gram_state_free(&a);
    tllm_gram_state_free(&b);
    return ok;
}

int tllm_gram_utf8_multibyte(struct tllm_gram_builder *b) {
    /* exactly the well-formed sequences (no overlongs, no surrogates, nothing past U+10FFFF) */
    static const unsigned char seq[][4][2] = {
        {{0xc2, 0xdf}, {0x80, 0xbf}},
        {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}},
        {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}},
        {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
    };
    int r = tllm_gram_rule(b);
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        if (i) tllm_gram_alt(b, r);
        for (int k = 0; k < 4 && seq[i][k][0]; k++) tllm_gram_range(b, r, seq[i][k][0], seq[i][k][1]);
    }
    return r;
}

int tllm_gram_byte_classes(const struct tllm_grammar *g, uint8_t cls[256]) {
    /* refine one class of all bytes by each set in turn: bytes end in one class when no set tells
     * them apart */
    int n = 1;
    memset(cls, 0, 256);
    int map[512];
    for (int e = 0; e < g->n_el; e++) {
        if (GE_KIND(g->el[e]) != GE_SET) continue;
        const uint8_t *set = g->sets[GE_ARG(g->el[e])];
        for (int i = 0; i < 2 * n; i++) map[i] = -1;
        int m = 0;
        for (int b = 0; b < 256; b++) {
            int k = cls[b] * 2 + tllm_gram_set_has(set, (unsigned)b);
            if (map[k] < 0) map[k] = m++;
            cls[b] = (uint8_t)map[k];
        }
        n = m;
        if (n == 256) break;
    }
    return n;
}
