/* Status codes and the per-thread error message (SQLite style: functions return a
 * status, the message waits in tllm_errmsg() for whoever reports it). */
#ifndef TLLM_ERROR_H
#define TLLM_ERROR_H

#include "engine/tllm.h" /* enum tllm_status, tllm_errmsg */

/* Record a printf-style message for the current thread and return `status`,
 * so call sites read `return tllm_fail(TLLM_ERR_FORMAT, "...", ...);`. */
int tllm_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message with "context: " (used to add a file name). */
void tllm_errctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void tllm_clear_error(void);

#endif
