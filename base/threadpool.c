#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "base/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

#include <sched.h>

/* A wait polls (a decode step is hundreds of tasks of a few microseconds), then yields the core,
 * then sleeps: with more threads than free cores (a large -t, or other processes busy) a thread
 * that only polled would hold the core that the thread it waits for needs. */
#define SPIN_POLLS 4000   /* pause-and-check rounds before yielding (tens of microseconds) */
#define SPIN_ITERS 200000 /* rounds in all, yielding after SPIN_POLLS, before a thread sleeps */
#define MAX_THREADS 1024

static struct {
    int n;
    pthread_t tid[MAX_THREADS];
    atomic_uint generation; /* bumped for every task */
    atomic_int pending;     /* workers still running the current task */
    atomic_int quit;
    tllm_task_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_int sleepers;
    pthread_cond_t done;       /* the caller sleeps on it when the workers take long */
    atomic_int caller_asleep;
    unsigned start_generation; /* the generation before any task of this pool: workers start from it */
} pool = {.n = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker(void *p) {
    int ith = (int)(intptr_t)p;
    unsigned seen = pool.start_generation; /* not a fresh load: a task may already be published */
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen && !atomic_load(&pool.quit)) {
            if (++spins < SPIN_ITERS) {
                if (spins < SPIN_POLLS) cpu_relax();
                else sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.quit))
                pthread_cond_wait(&pool.wake, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        if (atomic_load(&pool.quit)) return NULL;
        seen++; /* exactly one task per generation: the caller waits for all before the next */
        pool.fn(pool.arg, ith, pool.n);
        /* the last one out wakes the caller if it went to sleep (it sets the flag, then looks at
         * pending, under the lock: so it either sees 0 or is woken) */
        if (atomic_fetch_sub(&pool.pending, 1) == 1 && atomic_load(&pool.caller_asleep)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

int tllm_physical_cores(void) {
    /* count distinct (package, core) pairs */
    int pairs[4096][2], n = 0;
    for (int cpu = 0; cpu < 4096; cpu++) {
        char path[128];
        int ids[2];
        const char *f[2] = {"physical_package_id", "core_id"};
        int ok = 1;
        for (int k = 0; k < 2 && ok; k++) {
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, f[k]);
            FILE *fp = fopen(path, "r");
            ok = fp && fscanf(fp, "%d", &ids[k]) == 1;
            if (fp) fclose(fp);
        }
        if (!ok) break;
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = pairs[i][0] == ids[0] && pairs[i][1] == ids[1];
        if (!dup) {
            pairs[n][0] = ids[0];
            pairs[n][1] = ids[1];
            n++;
        }
    }
    if (n > 0) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

int tllm_threadpool_start(int n) {
    if (n <= 0) n = tllm_physical_cores();
    if (n > MAX_THREADS) n = MAX_THREADS;
    tllm_threadpool_stop();
    atomic_store(&pool.quit, 0);
    pool.n = n;
    pool.start_generation = atomic_load(&pool.generation);
    for (int i = 1; i < n; i++)
        if (pthread_create(&pool.tid[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            pool.n = i;
            tllm_threadpool_stop();
            return tllm_fail(TLLM_ERR_NOMEM, "cannot start thread %d of %d", i, n);
        }
    return TLLM_OK;
}

void tllm_threadpool_stop(void) {
    if (pool.n <= 1) {
        pool.n = 1;
        return;
    }
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.quit, 1);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    for (int i = 1; i < pool.n; i++) pthread_join(pool.tid[i], NULL);
    pool.n = 1;
}

int tllm_threadpool_size(void) { return pool.n; }

void tllm_parallel(tllm_task_fn fn, void *arg) {
    if (pool.n <= 1) {
        fn(arg, 0, 1);
        return;
    }
    pool.fn = fn;
    pool.arg = arg;
    atomic_store(&pool.pending, pool.n - 1);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mu);
    }
    fn(arg, 0, pool.n);
    for (int spins = 0; atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_POLLS) {
            cpu_relax();
        } else if (spins < SPIN_ITERS) {
            sched_yield();
        } else {
            pthread_mutex_lock(&pool.mu);
            atomic_store(&pool.caller_asleep, 1);
            while (atomic_load(&pool.pending) > 0) pthread_cond_wait(&pool.done, &pool.mu);
            atomic_store(&pool.caller_asleep, 0);
            pthread_mutex_unlock(&pool.mu);
        }
    }
}

int tllm_cpus_available(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}
