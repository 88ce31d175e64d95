/* JSON Schema -> a grammar whose sentences are JSON texts the schema accepts (what constrained
 * decoding samples from: OpenAI's response_format json_schema, tools' parameters, --json-schema).
 *
 * Supported: type (one or a list), properties, required, additionalProperties, items, minItems,
 * maxItems, enum, const, anyOf / oneOf (as anyOf: the branches a schema offers are meant to be
 * apart), allOf of one schema, $ref to "#" or within the document ("#/$defs/Name",
 * "#/definitions/Name", recursive ones too), string minLength / maxLength / pattern / format (date,
 * time, date-time, uuid; other formats are annotations and left alone), integer and number minimum /
 * maximum where they are integers on an integer. Annotations (title, description, default, examples,
 * $schema, $id, $comment, ...) are ignored. Any other keyword is refused with its name and where it is.
 *
 * The grammar may be narrower than the schema, never wider: properties come in the schema's order,
 * an object that declares properties gets no others unless additionalProperties says so with a
 * schema of its own, numbers have at most 16 digits before and after the point, and whitespace is
 * "", " " or a newline and up to 20 spaces or tabs (a model that pads forever cannot). */
#ifndef TLLM_JSON_SCHEMA_H
#define TLLM_JSON_SCHEMA_H

#include <json-c/json.h>

#include "engine/grammar/grammar.h"

/* Nesting of the schema itself, at most */
#ifndef TLLM_SCHEMA_MAX_DEPTH
#define TLLM_SCHEMA_MAX_DEPTH 64
#endif

/* schema NULL: any JSON object (response_format json_object). Errors name `what` and the keyword's
 * place: "response_format.json_schema.schema: properties.age: 'multipleOf' is not supported". */
int tllm_schema_grammar(struct json_object *schema, const char *what, struct tllm_grammar **out);

/* The same from the schema's JSON text (a parse error names `what` too) */
int tllm_schema_grammar_text(const char *text, const char *what, struct tllm_grammar **out);

/* OpenAI's response_format object `rf` (named `what` in messages): {"type": "text"} (*out stays NULL),
 * {"type": "json_object"} (any JSON object; llama-server's "schema" beside the type is followed when
 * given) or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (no schema: any
 * object). */
int tllm_response_format_grammar(struct json_object *rf, const char *what, struct tllm_grammar **out);

/* Tool calls as Qwen's templates ask for them: one (or, when parallel, one or more, a newline apart)
 * "<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>", NAME one of tools' functions (only
 * `name` when given), ARGS following that function's parameters schema. tools: the request's array.
 * rf (a response_format object, or NULL): the answer may instead be JSON in that format (tool_choice
 * auto with a response_format: call, or answer as asked). */
int tllm_schema_tool_grammar(struct json_object *tools, const char *name, int parallel, struct json_object *rf,
                             const char *what, struct tllm_grammar **out);

#endif
