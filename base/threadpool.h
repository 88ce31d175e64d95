/* One process-wide pool of worker threads, created once and used by every parallel loop. The
 * calling thread takes part as thread 0. Waiting threads poll briefly between tasks (a decode step
 * issues hundreds of small parallel matmuls), then yield, then sleep, so more threads than free cores
 * slow a step down instead of stalling it. */
#ifndef TLLM_THREADPOOL_H
#define TLLM_THREADPOOL_H

/* Start n threads in all (n <= 0: the number of physical cores). Restarting with another n is allowed. */
int tllm_threadpool_start(int n);
void tllm_threadpool_stop(void);
/* Threads in the pool (1 when not started). */
int tllm_threadpool_size(void);
/* Physical cores of this machine (hyperthreads not counted). */
int tllm_physical_cores(void);
/* CPUs this process may run on (its affinity mask): more threads than this only wait for each other. */
int tllm_cpus_available(void);

/* Run fn(arg, ith, nth) on every thread and wait for all. Not reentrant. */
typedef void (*tllm_task_fn)(void *arg, int ith, int nth);
void tllm_parallel(tllm_task_fn fn, void *arg);

#endif
