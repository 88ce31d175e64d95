#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define TLLM_ERRMSG_MAX 1024

static _Thread_local char errmsg[TLLM_ERRMSG_MAX];

int tllm_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return status;
}

void tllm_errctx(const char *fmt, ...) {
    char old[TLLM_ERRMSG_MAX];
    memcpy(old, errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    /* append ": old", truncating */
    size_t pos = k < 0 ? 0 : (size_t)k;
    const char *src[2] = {": ", old};
    for (int s = 0; s < 2; s++)
        for (const char *p = src[s]; *p && pos + 1 < sizeof errmsg; p++) errmsg[pos++] = *p;
    if (pos < sizeof errmsg) errmsg[pos] = '\0';
}

const char *tllm_errmsg(void) { return errmsg; }

void tllm_clear_error(void) { errmsg[0] = '\0'; }
