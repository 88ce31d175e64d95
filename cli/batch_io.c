#include "cli/batch_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/prompt_line.h"
#include "base/json_util.h"

/* Opens path for `flags` without blocking in open() (a FIFO with no writer or no reader), then makes
 * the descriptor blocking again for the reads and writes. -1 with errno on failure. */
static int open_unblocked(const char *path, int flags, mode_t mode) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
    if (fd >= 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    return fd;
}

/* 1, 0 or -1 (blank) for the format a line says: JSONL when its first non-blank byte is '{' */
static int line_format(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    return *p ? *p == '{' : -1;
}

/* A UTF-8 byte order mark (Windows editors, PowerShell's Out-File) starting the file is no part of its
 * first line: JSONL would be taken for text with it */
static ssize_t skip_bom(char *line, ssize_t n) {
    if (n < 3 || memcmp(line, "\xef\xbb\xbf", 3)) return n;
    memmove(line, line + 3, (size_t)n - 2); /* with the NUL */
    return n - 3;
}

void batch_in_open(struct batch_in *in, const char *path) {
    memset(in, 0, sizeof *in);
    in->jsonl = -1;
    if (!strcmp(path, "-")) {
        in->fp = stdin, in->name = "stdin";
    } else {
        in->name = path;
        int fd = open_unblocked(path, O_RDONLY, 0);
        if (fd < 0 || !(in->fp = fdopen(fd, "rb"))) cli_die("%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(in->fp), &st) != 0) cli_die("%s: cannot stat: %s", in->name, strerror(errno));
    if (S_ISDIR(st.st_mode)) cli_die("%s: is a directory, not a prompt file", in->name);
    in->regular = S_ISREG(st.st_mode);
    if (!in->regular) return; /* a pipe or a device is read once, as it comes */
    off_t start = ftello(in->fp);
    ssize_t n;
    int too_long;
    while ((n = cli_getline(&in->line, &in->cap, in->fp, CLI_MAX_PROMPT_LINE, 0, &too_long, NULL)) != -1) {
        if (!in->total++) skip_bom(in->line, n);
        if (in->jsonl < 0 && !too_long) in->jsonl = line_format(in->line);
    }
    if (ferror(in->fp) || fseeko(in->fp, start, SEEK_SET) != 0) cli_die("%s: read error: %s", in->name, strerror(errno));
}

ssize_t batch_in_next(struct batch_in *in, int *too_long) {
    if (in->stopped) return -1;
    ssize_t n = cli_getline(&in->line, &in->cap, in->fp, CLI_MAX_PROMPT_LINE, !in->regular, too_long, NULL);
    if (n < 0 && ferror(in->fp)) cli_die("%s: read error: %s", in->name, strerror(errno));
    if (n >= 0 && *too_long && !in->regular) in->stopped = 1;
    if (n >= 0 && !in->n_read++) n = skip_bom(in->line, n);
    if (n >= 0 && !*too_long) {
        while (n > 0 && in->line[n - 1] == '\r') in->line[--n] = '\0';
        if (in->jsonl < 0) in->jsonl = line_format(in->line);
    }
    return n;
}

void batch_in_close(struct batch_in *in) {
    if (in->fp && in->fp != stdin) fclose(in->fp);
    free(in->line);
    memset(in, 0, sizeof *in);
}

/* A line of ours: a JSON object with an id and a text or an error. 1: it answers its id (into
 * out->done); 2: a duplicate-id error record (its line into out->dups); 0: not ours */
static int take_record(struct batch_out *out, const char *line, size_t n) {
    struct json_object *o = NULL, *v, *at;
    if (tllm_json_parse(line, n, &o, "record") || !json_object_is_type(o, json_type_object) ||
        !json_object_object_get_ex(o, "id", &v) ||
        !(json_object_object_get_ex(o, "text", NULL) || json_object_object_get_ex(o, "error", NULL))) {
        json_object_put(o);
        return 0;
    }
    int dup = json_object_object_get_ex(o, "duplicate_of", NULL) && json_object_object_get_ex(o, "line", &at);
    if (dup) json_object_object_add(out->dups, json_object_to_json_string_ext(at, JSON_C_TO_STRING_PLAIN), NULL);
    else json_object_object_add(out->done, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN), NULL);
    json_object_put(o);
    return dup ? 2 : 1;
}

/* How every record line starts, the id first ({"id":, blanks allowed between): what an interrupted
 * write of one leaves, however short */
static int starts_like_record(const char *line, size_t n) {
    static const char head[] = "{\"id\":";
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof head - 1; i++) {
        if ((line[i] == ' ' || line[i] == '\t') && (k == 1 || k == 5 || k == 6)) continue;
        if (line[i] != head[k++]) return 0;
    }
    return 1;
}

/* The records already there (their ids into out->done). A last line without its newline is a record
 * whose newline is then added, or the start of one that an interruption cut short, which is trimmed
 * when every line before it is a record; anything else that is not a record refuses the file unless
 * forced, and then nothing of it is cut (ours start on a line of their own). */
static void resume_scan(struct batch_out *out, int force) {
    FILE *fp = out->fp;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int too_long, ended;
    long lineno = 0, foreign = 0;
    off_t good_end = 0;
    enum { WHOLE, TRIM, NEWLINE } last = WHOLE;
    while ((n = cli_getline(&line, &cap, fp, CLI_MAX_PROMPT_LINE, 0, &too_long, &ended)) != -1) {
        lineno++;
        int ours = !too_long && take_record(out, line, (size_t)n);
        if (!ended && ours) last = NEWLINE;
        else if (!ended && !foreign && !too_long && starts_like_record(line, (size_t)n)) last = TRIM;
        else if (!ours && !foreign++ && !force)
            cli_die("%s: line %ld is not a tllm record: not a file tllm generate wrote? (--force appends to it anyway)",
                    out->name, lineno);
        else if (!ended) last = NEWLINE;
        if (!ended) break;
        good_end = ftello(fp);
    }
    free(line);
    if (ferror(fp)) cli_die("%s: read error: %s", out->name, strerror(errno));
    if (last == TRIM) {
        if (ftruncate(fileno(fp), good_end) != 0) cli_die("%s: cannot trim the torn last line: %s", out->name, strerror(errno));
    } else if (last == NEWLINE) {
        if (fseeko(fp, 0, SEEK_END) != 0 || fputc('\n', fp) == EOF) cli_die("%s: write failed: %s", out->name, strerror(errno));
    }
    if (fseeko(fp, 0, SEEK_END) != 0) cli_die("%s: cannot seek: %s", out->name, strerror(errno));
}

void batch_out_open(struct batch_out *out, const char *path, const struct batch_in *in, int force) {
    memset(out, 0, sizeof *out);
    out->done = json_object_new_object();
    out->dups = json_object_new_object();
    if (!path) {
        out->fp = stdout, out->name = "stdout";
        return;
    }
    out->name = path;
    struct stat st, ist;
    int exists = stat(path, &st) == 0; /* through symlinks: -o LINK writes where it points */
    if (exists && !S_ISREG(st.st_mode)) {
        /* a pipe, a terminal, /dev/null: written straight through, nothing to resume from */
        int fd = open_unblocked(path, O_WRONLY, 0);
        if (fd < 0 && errno == ENXIO) cli_die("%s: a FIFO that no process is reading", path);
        if (fd < 0 || !(out->fp = fdopen(fd, "wb"))) cli_die("%s: cannot open for writing: %s", path, strerror(errno));
        return;
    }
    int fd = open_unblocked(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) cli_die("%s: cannot open for writing: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) cli_die("%s: not a regular file", path);
    if (fstat(fileno(in->fp), &ist) == 0 && ist.st_dev == st.st_dev && ist.st_ino == st.st_ino)
        cli_die("%s: -o is the prompt file itself (the answers go to another file)", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        cli_die("%s: %s", path, errno == EWOULDBLOCK ? "another tllm generate is writing to it" : strerror(errno));
    if (!(out->fp = fdopen(fd, "r+b"))) cli_die("%s: cannot open for writing: %s", path, strerror(errno));
    out->regular = 1;
    resume_scan(out, force);
}

void batch_out_emit(struct batch_out *out, struct json_object *rec) {
    fputs(json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN), out->fp);
    fputc('\n', out->fp);
    if (fflush(out->fp) != 0 || ferror(out->fp)) cli_die("%s: write failed: %s", out->name, strerror(errno));
}

void batch_out_close(struct batch_out *out) {
    json_object_put(out->done);
    json_object_put(out->dups);
    if (out->fp && out->fp != stdout && fclose(out->fp) != 0) cli_die("%s: write failed: %s", out->name, strerror(errno));
    memset(out, 0, sizeof *out);
}
