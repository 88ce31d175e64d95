/* The files of batch generation (tllm generate --prompts FILE -o OUT): the prompt file read once
 * whatever it is (a regular file, a pipe, stdin as "-"), and the output: one writer at a time (a lock),
 * never the prompt file, never someone else's file unless --force, resumed where it stopped when it is
 * a regular file of our records, written straight through when it is a pipe or a device. Problems are
 * fatal here (only the CLI uses it): each message names the file. */
#ifndef TLLM_CLI_BATCH_IO_H
#define TLLM_CLI_BATCH_IO_H

#include <json-c/json.h>
#include <stdio.h>
#include <sys/types.h>

struct batch_in {
    FILE *fp;
    const char *name; /* the path, or "stdin" */
    int regular;      /* a regular file: counted first (for the progress line) */
    long total;       /* its lines (0 when not known: a pipe is read once) */
    int jsonl;        /* 1 JSONL, 0 plain text, -1 not known yet (no non-blank line read) */
    int stopped;      /* a line too long in a stream: nothing after it is read */
    long n_read;      /* lines read by batch_in_next (a UTF-8 byte order mark is taken off the first) */
    char *line;       /* the current line, NUL-terminated, its newline removed */
    size_t cap;
};

/* "-" is standard input. Opens without blocking on a FIFO, then reads normally. */
void batch_in_open(struct batch_in *in, const char *path);
/* The next line into in->line (length returned; -1 at the end). *too_long: the line was over the
 * limit and is not kept (in a stream, reading stops after it: in->stopped). */
ssize_t batch_in_next(struct batch_in *in, int *too_long);
void batch_in_close(struct batch_in *in);

struct batch_out {
    FILE *fp;
    const char *name;          /* the path, or "stdout" */
    int regular;               /* a regular file: locked, and resumed */
    struct json_object *done;  /* the ids (canonical JSON text) it already has records for */
    struct json_object *dups;  /* the lines (as text) it already has duplicate-id error records for: such a
                                  record does not answer its id, whose first line may still be unanswered */
};

/* path NULL: standard output. force: append to a regular file even if it holds lines that are not
 * tllm records (they are kept; nothing is trimmed). */
void batch_out_open(struct batch_out *out, const char *path, const struct batch_in *in, int force);
/* One record line, flushed; a failed write is fatal (nothing is lost silently). */
void batch_out_emit(struct batch_out *out, struct json_object *rec);
void batch_out_close(struct batch_out *out);

#endif
