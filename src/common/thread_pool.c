/* thread_pool.c — see thread_pool.h. */
#include "common/thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct thread_pool {
    int n_threads;
    pthread_t *threads; /* n_threads - 1 workers; the caller is worker 0 */
    pthread_mutex_t lock;
    pthread_cond_t job_ready;
    pthread_cond_t job_done;
    /* the current job */
    thread_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    _Atomic int64_t next_task;
    uint64_t generation; /* bumped per job so sleeping workers see a new one */
    int busy_workers;
    bool stopping;
};

typedef struct worker_arg {
    thread_pool *pool;
    int index;
} worker_arg;

static void run_tasks(thread_pool *pool, int worker) {
    for (;;) {
        int64_t task = atomic_fetch_add(&pool->next_task, 1);
        if (task >= pool->n_tasks) return;
        pool->fn(pool->ctx, task, worker);
    }
}

static void *worker_main(void *arg_ptr) {
    worker_arg arg = *(worker_arg *)arg_ptr;
    free(arg_ptr);
    thread_pool *pool = arg.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stopping && pool->generation == seen) pthread_cond_wait(&pool->job_ready, &pool->lock);
        if (pool->stopping) break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        run_tasks(pool, arg.index);
        pthread_mutex_lock(&pool->lock);
        if (--pool->busy_workers == 0) pthread_cond_signal(&pool->job_done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

thread_pool *thread_pool_new(int n_threads) {
    if (n_threads <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online > 0 ? (int)online : 1;
    }
    thread_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        free(pool);
        return NULL;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->job_ready, NULL);
    pthread_cond_init(&pool->job_done, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (worker_arg){pool, i};
        if (!arg || pthread_create(&pool->threads[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i; /* run with the workers we have */
            break;
        }
    }
    return pool;
}

void thread_pool_free(thread_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->job_ready);
    pthread_cond_destroy(&pool->job_done);
    free(pool->threads);
    free(pool);
}

int thread_pool_size(const thread_pool *pool) { return pool->n_threads; }

void thread_pool_run(thread_pool *pool, int64_t n_tasks, thread_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store(&pool->next_task, 0);
    pool->busy_workers = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->lock);

    run_tasks(pool, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->busy_workers > 0) pthread_cond_wait(&pool->job_done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
