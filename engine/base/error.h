/* Status codes and the per-thread error message (SQLite style: functions return a
 * status, the message waits in tllm_errmsg() for whoever reports it). */
#ifndef TLLM_ERROR_H
#define TLLM_ERROR_H

enum tllm_status {
    TLLM_OK = 0,
    TLLM_ERR_IO,          /* a file could not be opened, read or mapped */
    TLLM_ERR_FORMAT,      /* a file's contents are malformed or inconsistent */
    TLLM_ERR_UNSUPPORTED, /* well-formed, but something this engine does not do */
    TLLM_ERR_ARG,         /* a bad argument from the caller / command line */
    TLLM_ERR_NOMEM,       /* an allocation failed or a size is past our limits */
    TLLM_ERR_LIMIT,       /* context full, or another run-time limit reached */
};

/* Record a printf-style message for the current thread and return `status`,
 * so call sites read `return tllm_fail(TLLM_ERR_FORMAT, "...", ...);`. */
int tllm_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *tllm_errmsg(void);

/* Prefix the current message with "context: " (used to add a file name). */
void tllm_errctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void tllm_clear_error(void);

#endif
