#include "base/clock.h"

#include <sys/resource.h>
#include <time.h>

double tllm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

size_t tllm_peak_rss(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (size_t)u.ru_maxrss * 1024;
}
