/* Which model a command runs: -m as given (a directory, or a Hugging Face repo id found in the local
 * hub cache), else $TLLM_MODEL, else the demo model that ships in the repository. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/base/error.h"
#include "engine/load/hf_cache.h"

#ifndef TLLM_DEMO_MODEL_DIR
#define TLLM_DEMO_MODEL_DIR "models/tllm-man-demo"
#endif
#define DEMO_REL "models/tllm-man-demo"

static char resolved[PATH_MAX + 256]; /* >= PATH_MAX, as realpath() needs */

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The demo model beside the binary (build/tllm -> ../models, an install's bin/tllm -> ../share/tllm),
 * so a moved clone still finds it; then where the source tree was at build time. */
static const char *demo_dir(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        static const char *const rel[] = {"../" DEMO_REL, "../share/tllm/" DEMO_REL};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", exe, rel[i]);
            if (is_dir(path) && realpath(path, resolved)) return resolved;
        }
    }
    return is_dir(TLLM_DEMO_MODEL_DIR) ? TLLM_DEMO_MODEL_DIR : NULL;
}

static const char *from_spec(const char *spec, const char *origin) {
    if (is_dir(spec) || !tllm_hf_is_repo_id(spec)) return spec; /* the loader names what is wrong */
    char *snap;
    if (tllm_hf_cache_find(spec, &snap)) {
        if (origin) cli_die("%s: %s", origin, tllm_errmsg());
        cli_die_lib();
    }
    snprintf(resolved, sizeof resolved, "%s", snap);
    free(snap);
    return resolved;
}

const char *cli_model_dir(const char *arg) {
    if (arg) return from_spec(arg, NULL);
    const char *env = getenv("TLLM_MODEL");
    if (env && *env) {
        const char *dir = from_spec(env, "TLLM_MODEL");
        fprintf(stderr, "tllm: model %s (from TLLM_MODEL)\n", env);
        return dir;
    }
    const char *demo = demo_dir();
    if (!demo)
        cli_die("no model given: use -m DIR (or -m owner/name from the Hugging Face cache, or set TLLM_MODEL); "
                "the bundled demo model (%s) is not there", DEMO_REL);
    fprintf(stderr,
            "tllm: using the bundled demo model %s, a small man-page assistant, not a general one "
            "(-m DIR, -m owner/name or TLLM_MODEL for a real Qwen2 checkpoint)\n",
            demo);
    return demo;
}
