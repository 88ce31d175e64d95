/* The thread pool with more threads than CPUs (a large -t, or other processes busy): every task still
 * runs on every thread, and the pool does not stall (before waits yielded and slept, 16 threads on 2
 * CPUs took tens of milliseconds a task, so this test's 4000 tasks ran past its ctest TIMEOUT). */
#include <stdatomic.h>
#include <stdlib.h>

#include "base/threadpool.h"
#include "tests/check.h"

#define THREADS 16
#define TASKS 4000

struct work {
    atomic_int runs[THREADS];
    atomic_int bad_nth;
};

static void task(void *arg, int ith, int nth) {
    struct work *w = arg;
    if (nth != THREADS) atomic_fetch_add(&w->bad_nth, 1);
    volatile double s = 0;
    for (int i = 0; i < 1000; i++) s += i * 0.5; /* a few microseconds, as a decode step's matmul slices */
    atomic_fetch_add(&w->runs[ith], 1);
}

int main(void) {
    CHECK(tllm_threadpool_start(THREADS) == 0 && tllm_threadpool_size() == THREADS, "start %d threads", THREADS);
    struct work *w = calloc(1, sizeof *w);
    for (int t = 0; t < TASKS; t++) tllm_parallel(task, w);
    int all = 1;
    for (int i = 0; i < THREADS; i++) all &= atomic_load(&w->runs[i]) == TASKS;
    CHECK(all && atomic_load(&w->bad_nth) == 0, "every task on every thread");
    tllm_threadpool_stop();
    CHECK(tllm_threadpool_size() == 1, "stopped");
    free(w);
    printf("%d tasks on %d threads, %d CPUs available\n", TASKS, THREADS, tllm_cpus_available());
    return check_done();
}
