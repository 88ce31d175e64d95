#include "engine/load/model_path.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "engine/load/hf_cache.h"

#ifndef TLLM_DEMO_MODEL_DIR
#define TLLM_DEMO_MODEL_DIR TLLM_DEMO_REL /* where the source tree was at build time */
#endif
#ifndef TLLM_INSTALL_DEMO_DIR
#define TLLM_INSTALL_DEMO_DIR "/usr/local/share/tllm/" TLLM_DEMO_REL /* where `cmake --install` puts it */
#endif

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The demo model beside the binary (build/tllm -> ../models, an install's bin/tllm -> ../share/tllm),
 * so a moved clone or a relocated install still finds it; then where it was installed and where the
 * source tree was at build time. */
static char *demo_dir(void) {
    char exe[PATH_MAX], resolved[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        static const char *const rel[] = {"../" TLLM_DEMO_REL, "../share/tllm/" TLLM_DEMO_REL};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", exe, rel[i]);
            if (is_dir(path) && realpath(path, resolved)) return strdup(resolved);
        }
    }
    if (is_dir(TLLM_INSTALL_DEMO_DIR)) return strdup(TLLM_INSTALL_DEMO_DIR);
    return is_dir(TLLM_DEMO_MODEL_DIR) ? strdup(TLLM_DEMO_MODEL_DIR) : NULL;
}

static int present(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int from_spec(const char *spec, char **dir) {
    if (present(spec) || !tllm_hf_is_repo_id(spec)) { /* a directory or a GGUF file; else the loader names what is wrong */
        *dir = strdup(spec);
        return *dir ? TLLM_OK : tllm_fail(TLLM_ERR_NOMEM, "out of memory");
    }
    return tllm_hf_cache_find(spec, dir);
}

int tllm_model_locate(const char *spec, char **dir, enum tllm_model_origin *origin) {
    *dir = NULL;
    if (spec) {
        *origin = TLLM_MODEL_GIVEN;
        return from_spec(spec, dir);
    }
    const char *env = getenv("TLLM_MODEL");
    if (env && *env) {
        *origin = TLLM_MODEL_ENV;
        int rc = from_spec(env, dir);
        if (rc) tllm_errctx("TLLM_MODEL");
        return rc;
    }
    *origin = TLLM_MODEL_DEMO;
    if (!(*dir = demo_dir()))
        return tllm_fail(TLLM_ERR_ARG,
                         "no model given: use -m DIR (or -m owner/name from the Hugging Face cache, or set TLLM_MODEL); "
                         "the bundled demo model (%s) is not there", TLLM_DEMO_REL);
    return TLLM_OK;
}
