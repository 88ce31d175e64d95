/* Which model a command runs (engine/load/model_path.h decides), and the line on stderr that says
 * where it came from when -m was not given. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "base/error.h"
#include "engine/load/model_path.h"

const char *cli_model_dir(const char *arg) {
    static char *resolved;
    char *old = resolved; /* arg may be the last result */
    enum tllm_model_origin origin;
    if (tllm_model_locate(arg, &resolved, &origin)) cli_die_lib();
    free(old);
    if (origin == TLLM_MODEL_ENV) fprintf(stderr, "tllm: model %s (from TLLM_MODEL)\n", getenv("TLLM_MODEL"));
    if (origin == TLLM_MODEL_DEMO)
        fprintf(stderr,
                "tllm: using the bundled demo model %s, a small man-page assistant, not a general one "
                "(-m DIR, -m owner/name or TLLM_MODEL for a real Qwen2 checkpoint)\n",
                resolved);
    return resolved;
}
