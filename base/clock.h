/* Time and memory, for reports and profiles. */
#ifndef TLLM_CLOCK_H
#define TLLM_CLOCK_H

#include <stddef.h>

/* Seconds on a monotonic clock. */
double tllm_now(void);
/* Peak resident memory of the process, bytes. */
size_t tllm_peak_rss(void);

#endif
