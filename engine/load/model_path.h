/* Which model to load: a directory as given, a Hugging Face repo id found in the local hub cache,
 * else $TLLM_MODEL, else the demo model that ships with tllm. */
#ifndef TLLM_MODEL_PATH_H
#define TLLM_MODEL_PATH_H

enum tllm_model_origin {
    TLLM_MODEL_GIVEN, /* spec as given */
    TLLM_MODEL_ENV,   /* $TLLM_MODEL */
    TLLM_MODEL_DEMO,  /* the bundled demo model */
};

/* The model directory for spec (NULL: not given) into *dir (heap). A directory is returned as it is
 * (the loader names what is wrong with it); a repo id ("owner/name[@rev]") not in the cache, or no
 * model at all, fails with a message. */
int tllm_model_locate(const char *spec, char **dir, enum tllm_model_origin *origin);

/* The path the demo model is looked for under (for messages): "models/tllm-man-demo" */
#define TLLM_DEMO_REL "models/tllm-man-demo"

#endif
