#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/error.h"
#include "engine/base/threadpool.h"

void cli_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tllm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void cli_die_lib(void) { cli_die("%s", tllm_errmsg()); }

int cli_threads(int n) {
    int cpus = tllm_cpus_available();
    if (n <= cpus) return n;
    static int said;
    if (!said++) fprintf(stderr, "tllm: -t %d: this process may use %d CPUs; running %d threads\n", n, cpus, cpus);
    return cpus;
}

long cli_int(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0')
        cli_die("%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi) cli_die("%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
    return v;
}

double cli_double(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0') cli_die("%s: '%s' is not a number", flag, s);
    if (!(v >= lo && v <= hi)) cli_die("%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    return v;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cli_die("%s needs a value", argv[*i]);
    return argv[++*i];
}

int32_t *cli_parse_ids(const char *flag, const char *s, int *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) cli_die("out of memory");
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0'))
            cli_die("%s: '%s' is not a comma-separated list of token ids", flag, s);
        ids[k++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (k == 0) cli_die("%s: no token ids given", flag);
    *n = k;
    return ids;
}

void cli_write_file_atomic(const char *path, const void *data, size_t n) {
    size_t len = strlen(path);
    char *tmp = malloc(len + 16);
    if (!tmp) cli_die("out of memory");
    snprintf(tmp, len + 16, "%s.tmp%d", path, (int)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) cli_die("%s: cannot create: %s", tmp, strerror(errno));
    size_t w = fwrite(data, 1, n, fp);
    if (w != n || fflush(fp) != 0 || fclose(fp) != 0) {
        unlink(tmp);
        cli_die("%s: write failed: %s", path, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        cli_die("%s: cannot rename into place: %s", path, strerror(errno));
    }
    free(tmp);
}

ssize_t cli_getline(char **buf, size_t *cap, FILE *fp, size_t max, int *too_long) {
    size_t len = 0;
    int c = EOF, any = 0;
    *too_long = 0;
    while ((c = getc_unlocked(fp)) != EOF) {
        any = 1;
        if (len >= max) {
            *too_long = 1;
        } else {
            if (len + 2 > *cap) {
                size_t nc = *cap ? *cap * 2 : 256;
                char *nb = realloc(*buf, nc);
                if (!nb) cli_die("out of memory");
                *buf = nb;
                *cap = nc;
            }
            (*buf)[len++] = (char)c;
        }
        if (c == '\n') break;
    }
    if (!any) return -1;
    if (*too_long) len = 0; /* nothing of a line that was refused is used */
    if (!*buf && !(*buf = malloc(*cap = 1))) cli_die("out of memory");
    (*buf)[len] = '\0';
    return (ssize_t)len;
}
