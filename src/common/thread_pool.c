/* thread_pool.c — see thread_pool.h. */
#include "common/thread_pool.h"

#include "common/clock.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* How long a thread waits on a job (the workers for the next, the caller
 * for the workers) by polling before it sleeps on a condition variable: a
 * decode step is hundreds of short jobs, and waking a sleeping thread costs
 * tens of microseconds, more than many of the jobs. By the clock, not by
 * rounds: a pause instruction takes 3 to 140 cycles depending on the CPU. */
#define SPIN_SECONDS        300e-6
#define YIELD_AFTER_SECONDS 50e-6

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Polls until done(arg) or SPIN_SECONDS have passed; done's last answer.
 * After the first YIELD_AFTER_SECONDS it yields between polls: where
 * threads outnumber the cores (a server's sessions each have a pool) a
 * polling thread then gives its core to one with work, while the short
 * gaps of a decode step never pay for a system call. */
static bool spin_until(bool (*done)(void *), void *arg) {
    const double start = monotonic_seconds();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (done(arg)) return true;
            cpu_relax();
        }
        const double waited = monotonic_seconds() - start;
        if (waited > SPIN_SECONDS) return done(arg);
        if (waited > YIELD_AFTER_SECONDS) sched_yield();
    }
}

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
    _Atomic uint64_t generation; /* bumped per job (and to stop): a worker waits for it to change */
    _Atomic int busy_workers;    /* workers still on the current job */
    int sleeping_workers;        /* on job_ready; under lock */
    bool caller_sleeping;        /* on job_done; under lock */
    _Atomic bool stopping;
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

typedef struct generation_wait {
    thread_pool *pool;
    uint64_t seen;
} generation_wait;

static bool generation_moved(void *arg) {
    const generation_wait *w = arg;
    return atomic_load(&w->pool->generation) != w->seen;
}

static bool workers_done(void *arg) { return atomic_load(&((thread_pool *)arg)->busy_workers) == 0; }

/* A worker's wait for a generation other than `seen`: polled, then asleep. */
static uint64_t wait_for_job(thread_pool *pool, uint64_t seen) {
    if (spin_until(generation_moved, &(generation_wait){pool, seen})) return atomic_load(&pool->generation);
    pthread_mutex_lock(&pool->lock);
    pool->sleeping_workers++;
    while (atomic_load(&pool->generation) == seen) pthread_cond_wait(&pool->job_ready, &pool->lock);
    pool->sleeping_workers--;
    pthread_mutex_unlock(&pool->lock);
    return atomic_load(&pool->generation);
}

static void *worker_main(void *arg_ptr) {
    worker_arg arg = *(worker_arg *)arg_ptr;
    free(arg_ptr);
    thread_pool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stopping)) break;
        run_tasks(pool, arg.index);
        if (atomic_fetch_sub(&pool->busy_workers, 1) == 1) { /* the last: wake the caller if it sleeps */
            pthread_mutex_lock(&pool->lock);
            if (pool->caller_sleeping) pthread_cond_signal(&pool->job_done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
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

/* Publish a new generation and wake the workers that sleep. */
static void start_generation(thread_pool *pool) {
    atomic_fetch_add(&pool->generation, 1);
    pthread_mutex_lock(&pool->lock);
    if (pool->sleeping_workers > 0) pthread_cond_broadcast(&pool->job_ready);
    pthread_mutex_unlock(&pool->lock);
}

void thread_pool_free(thread_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stopping, true);
    start_generation(pool);
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
    if (pool->n_threads == 1 || n_tasks == 1) { /* nothing to share */
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    /* the job's fields are written before the generation that publishes them (seq_cst) */
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store(&pool->next_task, 0);
    atomic_store(&pool->busy_workers, pool->n_threads - 1);
    start_generation(pool);

    run_tasks(pool, 0);

    if (spin_until(workers_done, pool)) return;
    pthread_mutex_lock(&pool->lock);
    pool->caller_sleeping = true;
    while (atomic_load(&pool->busy_workers) > 0) pthread_cond_wait(&pool->job_done, &pool->lock);
    pool->caller_sleeping = false;
    pthread_mutex_unlock(&pool->lock);
}
