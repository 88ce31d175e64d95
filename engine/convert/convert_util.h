/* Helpers shared by the checkpoint writers (quantize, synth). */
#ifndef TLLM_CONVERT_UTIL_H
#define TLLM_CONVERT_UTIL_H

#include <json-c/json.h>

#include "engine/load/config.h"

/* Create OUT_DIR, or accept an existing empty one (or a non-empty one with force). */
int tllm_prepare_out_dir(const char *dir, int force);
/* Copy the tokenizer and generation files that exist in `from` into `to`. */
int tllm_copy_aux_files(const char *from, const char *to);
/* Set "quantization" and "quantization_config" on a config object. */
void tllm_config_set_quantization(struct json_object *cfg, const struct tllm_quant_spec *dflt, const char *const *modules,
                                  const struct tllm_quant_spec *specs, int n);
/* Write a JSON object to DIR/NAME (pretty, atomically). */
int tllm_write_json(const char *dir, const char *name, struct json_object *o);

#endif
