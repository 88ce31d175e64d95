/* Small json-c helpers that turn a missing or mistyped field into a tllm error naming
 * the file and the key. */
#ifndef TLLM_JSON_UTIL_H
#define TLLM_JSON_UTIL_H

#include <json-c/json.h>
#include <stdint.h>

/* Parse a whole file (at most max_bytes) into a JSON value. */
int tllm_json_load_file(const char *path, size_t max_bytes, struct json_object **out);

/* Parse `len` bytes of text; the whole text must be one JSON value. */
int tllm_json_parse(const char *text, size_t len, struct json_object **out, const char *what);

/* Integer field `key` of `obj` in [lo, hi]. Missing: *out = dflt if `optional`, else an error. */
int tllm_json_int(const struct json_object *obj, const char *key, int64_t lo, int64_t hi, int optional,
                  int64_t dflt, int64_t *out, const char *file);
int tllm_json_num(const struct json_object *obj, const char *key, double lo, double hi, int optional,
                  double dflt, double *out, const char *file);
int tllm_json_bool(const struct json_object *obj, const char *key, int optional, int dflt, int *out,
                   const char *file);
/* Borrowed string, or NULL when absent (error when present and not a string). */
int tllm_json_str(const struct json_object *obj, const char *key, const char **out, const char *file);

/* Read a whole file into a NUL-terminated heap buffer (refusing more than max_bytes). */
int tllm_read_file(const char *path, size_t max_bytes, char **out, size_t *len);

#endif
