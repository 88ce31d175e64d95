#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/threadpool.h"

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

/* Where a path's symlinks lead (a dangling one included: the file is made where it points) */
static char *follow_links(const char *path) {
    char *p = strdup(path);
    for (int hops = 0; p && hops < 40; hops++) {
        struct stat st;
        if (lstat(p, &st) != 0 || !S_ISLNK(st.st_mode)) return p;
        char target[PATH_MAX];
        ssize_t n = readlink(p, target, sizeof target - 1);
        if (n < 0) return p;
        target[n] = '\0';
        char *next;
        if (target[0] == '/') {
            next = strdup(target);
        } else { /* relative to the link's folder */
            char *slash = strrchr(p, '/');
            size_t dl = slash ? (size_t)(slash - p) + 1 : 0;
            next = malloc(dl + (size_t)n + 1);
            if (next) memcpy(next, p, dl), memcpy(next + dl, target, (size_t)n + 1);
        }
        free(p);
        p = next;
    }
    return p; /* a loop: the open below says so */
}

int cli_write_file(const char *path, const void *data, size_t n, char *err, size_t cap) {
    char *real = follow_links(path);
    if (!real) return snprintf(err, cap, "out of memory"), -1;
    struct stat st;
    int rc = 0;
    if (stat(real, &st) == 0 && !S_ISREG(st.st_mode)) { /* a device or a pipe: written to, never replaced */
        int fd = open(real, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            rc = -1, snprintf(err, cap, "%s: cannot open for writing: %s", path, errno == ENXIO ? "no process reads the FIFO" : strerror(errno));
        } else {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            for (size_t done = 0; done < n && !rc;) {
                ssize_t w = write(fd, (const char *)data + done, n - done);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) rc = -1, snprintf(err, cap, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "nothing written");
                else done += (size_t)w;
            }
            if (close(fd) != 0 && !rc) rc = -1, snprintf(err, cap, "%s: write failed: %s", path, strerror(errno));
        }
        free(real);
        return rc;
    }
    /* a regular file (or none yet): the whole new content or the old one, never a part */
    size_t len = strlen(real);
    char *tmp = malloc(len + 32);
    if (!tmp) {
        free(real);
        return snprintf(err, cap, "out of memory"), -1;
    }
    snprintf(tmp, len + 32, "%s.tmp%d", real, (int)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        rc = -1, snprintf(err, cap, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t w = fwrite(data, 1, n, fp);
        int bad = w != n || fflush(fp) != 0 || fsync(fileno(fp)) != 0;
        int e = errno;
        if (fclose(fp) != 0 && !bad) bad = 1, e = errno;
        if (bad) rc = -1, snprintf(err, cap, "%s: write failed: %s", path, strerror(e));
        else if (rename(tmp, real) != 0) rc = -1, snprintf(err, cap, "%s: cannot rename into place: %s", path, strerror(errno));
        if (rc) unlink(tmp);
    }
    free(tmp);
    free(real);
    return rc;
}

void cli_write_file_atomic(const char *path, const void *data, size_t n) {
    char err[PATH_MAX + 256];
    if (cli_write_file(path, data, n, err, sizeof err)) cli_die("%s", err);
}

ssize_t cli_getline(char **buf, size_t *cap, FILE *fp, size_t max, int stop_long, int *too_long, int *ended) {
    size_t len = 0; /* the line's bytes with its newline count against max, as they always have */
    int c = EOF, any = 0;
    *too_long = 0;
    if (ended) *ended = 0;
    while ((c = getc_unlocked(fp)) != EOF) {
        any = 1;
        if (len >= max) {
            *too_long = 1;
            if (stop_long) break;
        }
        if (c == '\n') {
            if (ended) *ended = 1;
            break;
        }
        if (*too_long) continue;
        if (len + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *nb = realloc(*buf, nc);
            if (!nb) cli_die("out of memory");
            *buf = nb;
            *cap = nc;
        }
        (*buf)[len++] = (char)c;
    }
    if (!any) return -1;
    if (*too_long) len = 0; /* nothing of a line that was refused is used */
    if (!*buf && !(*buf = malloc(*cap = 1))) cli_die("out of memory");
    (*buf)[len] = '\0';
    return (ssize_t)len;
}
