/*
 * thread_pool.h — a fixed set of worker threads that run parallel-for jobs.
 *
 * thread_pool_run(pool, n_tasks, fn, ctx) calls fn(ctx, task, worker) once
 * for every task in [0, n_tasks), spread over the workers and the calling
 * thread (which is worker 0), and returns when all are done. Tasks are
 * handed out through an atomic counter, so uneven tasks balance themselves.
 * One job at a time per pool. Between jobs the workers poll for the next
 * for a fraction of a millisecond, then sleep: a decode step is hundreds of
 * jobs of microseconds, which waking sleeping threads would dominate.
 */
#ifndef MOE_COMMON_THREAD_POOL_H
#define MOE_COMMON_THREAD_POOL_H

#include <stdint.h>

typedef struct thread_pool thread_pool;
typedef void (*thread_pool_fn)(void *ctx, int64_t task, int worker);

/* n_threads counts the caller; <= 0 means the number of online CPUs. */
thread_pool *thread_pool_new(int n_threads);
void thread_pool_free(thread_pool *pool);
int thread_pool_size(const thread_pool *pool);
void thread_pool_run(thread_pool *pool, int64_t n_tasks, thread_pool_fn fn, void *ctx);

#endif
