/* A JSON Schema `pattern` (the ECMA-262 regular expressions schemas use) as grammar rules over the
 * string's JSON text: the rule spells a matching string's characters as they appear between the
 * quotes, escaped where JSON needs it (`"` as \", a newline as \n).
 *
 * The subset: literals, `.`, classes `[a-z_]` and `[^...]` over ASCII (anything past ASCII only as
 * "everything not listed" in a negated class or `.`), `\d \w \s \D \W \S`, escapes, groups `(...)`
 * and `(?:...)`, alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms read as greedy: the
 * language is the same), and `^` / `$` at the ends. A pattern is a search, as in JSON Schema: without
 * `^` anything may come before, without `$` anything after. Refused, with what was found: lookaround,
 * backreferences, `\b`, flags, and anchors inside the expression. */
#ifndef TLLM_REGEX_H
#define TLLM_REGEX_H

#include "engine/grammar/grammar.h"

/* Counted repetition past this is refused ({n,m} with m above it) */
#ifndef TLLM_REGEX_MAX_REPEAT
#define TLLM_REGEX_MAX_REPEAT 1000
#endif

/* *rule: the string body's rule. Fails with "pattern: ... at offset N". */
int tllm_regex_rule(struct tllm_gram_builder *b, const char *pattern, int *rule);

/* The rule for one character of a JSON string as a model writes it: ASCII printable but `"` and `\`,
 * an escape (\" \\ \/ \b \f \n \r \t \uXXXX) or a UTF-8 character past ASCII. */
int tllm_regex_json_char(struct tllm_gram_builder *b);

#endif
