#include "engine/load/hf_cache.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/json_util.h"

#define HF_MAX_ID 256 /* owner/name as the Hub allows them (96 + 96), with room for a revision */

char *tllm_hf_cache_dir(void) {
    const char *v;
    char buf[4096];
    if ((v = getenv("HF_HUB_CACHE")) && *v) return strdup(v);
    if ((v = getenv("HF_HOME")) && *v) snprintf(buf, sizeof buf, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(buf, sizeof buf, "%s/huggingface/hub", v);
    else if ((v = getenv("HOME")) && *v) snprintf(buf, sizeof buf, "%s/.cache/huggingface/hub", v);
    else return NULL;
    return strdup(buf);
}

/* Hub names: letters, digits, '-', '_', '.'; not starting with '.' (no "..", no hidden dirs). */
static int name_ok(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.'))
            return 0;
    }
    return 1;
}

int tllm_hf_is_repo_id(const char *s) {
    size_t len = strlen(s);
    if (len > HF_MAX_ID) return 0;
    const char *at = strchr(s, '@');
    const char *end = at ? at : s + len;
    const char *slash = memchr(s, '/', (size_t)(end - s));
    if (!slash || memchr(slash + 1, '/', (size_t)(end - slash - 1))) return 0;
    if (at && !name_ok(at + 1, strlen(at + 1))) return 0;
    return name_ok(s, (size_t)(slash - s)) && name_ok(slash + 1, (size_t)(end - slash - 1));
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The first line of a refs file (a commit hash), or 0 if it cannot be read or is not a name. */
static int read_ref(const char *path, char *out, size_t cap) {
    char *text;
    if (tllm_read_file(path, 4096, &text, NULL)) return 0; /* regular files only: a FIFO would block */
    snprintf(out, cap, "%s", text);
    free(text);
    out[strcspn(out, "\r\n")] = '\0';
    return name_ok(out, strlen(out));
}

int tllm_hf_cache_find(const char *spec, char **out) {
    *out = NULL;
    if (!tllm_hf_is_repo_id(spec)) return tllm_fail(TLLM_ERR_ARG, "%s: not a Hugging Face repo id (owner/name)", spec);
    char *cache = tllm_hf_cache_dir();
    if (!cache) return tllm_fail(TLLM_ERR_IO, "%s: no Hugging Face cache (HF_HOME and HOME are unset)", spec);
    char owner[128], name[128], rev[128] = "main", repo[4500], path[4700], commit[128];
    const char *slash = strchr(spec, '/'), *at = strchr(spec, '@');
    snprintf(owner, sizeof owner, "%.*s", (int)(slash - spec), spec);
    snprintf(name, sizeof name, "%.*s", (int)((at ? at : spec + strlen(spec)) - slash - 1), slash + 1);
    if (at) snprintf(rev, sizeof rev, "%s", at + 1);
    snprintf(repo, sizeof repo, "%s/models--%s--%s", cache, owner, name);
    int rc = TLLM_OK;
    if (!is_dir(repo)) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: not a directory, and not in the Hugging Face cache (no %s; nothing is downloaded: "
                                    "fetch it with `huggingface-cli download %.*s`)",
                       spec, repo, (int)(at ? at - spec : (long)strlen(spec)), spec);
        goto done;
    }
    snprintf(path, sizeof path, "%s/refs/%s", repo, rev);
    if (read_ref(path, commit, sizeof commit)) {
        snprintf(path, sizeof path, "%s/snapshots/%s", repo, commit);
    } else if (snprintf(path, sizeof path, "%s/snapshots/%s", repo, rev), is_dir(path)) {
        /* the revision is a snapshot's commit */
    } else if (!at) {
        /* no refs/main (a cache copied by hand): take the snapshot if there is exactly one */
        snprintf(path, sizeof path, "%s/snapshots", repo);
        DIR *d = opendir(path);
        int n = 0;
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (e->d_name[0] != '.' && n++ == 0) snprintf(commit, sizeof commit, "%.127s", e->d_name);
        if (d) closedir(d);
        if (n != 1) {
            rc = tllm_fail(TLLM_ERR_IO, "%s: %s has %s snapshot and no refs/main; name one as %s@<commit>", spec, repo,
                           n ? "more than one" : "no", spec);
            goto done;
        }
        snprintf(path, sizeof path, "%s/snapshots/%s", repo, commit);
    } else {
        rc = tllm_fail(TLLM_ERR_IO, "%s: revision '%s' is neither in %s/refs nor a snapshot", spec, rev, repo);
        goto done;
    }
    if (!is_dir(path)) {
        rc = tllm_fail(TLLM_ERR_IO, "%s: the cache names snapshot %s, which is missing (an interrupted download?)", spec,
                       path);
        goto done;
    }
    if (!(*out = strdup(path))) rc = tllm_fail(TLLM_ERR_NOMEM, "out of memory");
done:
    free(cache);
    return rc;
}
