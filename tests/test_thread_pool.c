/*
 * test_thread_pool.c — the parallel-for pool: every task runs exactly once
 * per job, each on a worker index below the pool's size, whether the
 * workers were polling for the job (jobs back to back) or asleep (a pause
 * longer than their polling), and a pool frees cleanly in either state.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/thread_pool.h"
#include "test.h"

enum { MAX_TASKS = 4096 };

typedef struct job {
    _Atomic int runs[MAX_TASKS];
    _Atomic int bad_worker;
    int n_workers;
} job;

static void count_run(void *ctx, int64_t task, int worker) {
    job *j = ctx;
    atomic_fetch_add(&j->runs[task], 1);
    if (worker < 0 || worker >= j->n_workers) atomic_store(&j->bad_worker, 1);
}

static void pause_ms(int ms) {
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

/* n_jobs jobs of varied sizes on a pool of n_threads, with a pause of
 * pause_ms between jobs (0: back to back). */
static void check_jobs(int n_threads, int n_jobs, int pause) {
    thread_pool *pool = thread_pool_new(n_threads);
    CHECK(pool != NULL);
    if (!pool) return;
    job *j = calloc(1, sizeof *j);
    j->n_workers = thread_pool_size(pool);
    CHECK(j->n_workers == n_threads);
    int wrong = 0;
    for (int k = 0; k < n_jobs; k++) {
        const int n = 1 + (k * 977) % MAX_TASKS; /* 1 task (run inline) to MAX_TASKS */
        for (int i = 0; i < n; i++) atomic_store(&j->runs[i], 0);
        thread_pool_run(pool, n, count_run, j);
        for (int i = 0; i < n; i++) wrong += atomic_load(&j->runs[i]) != 1;
        if (pause) pause_ms(pause);
    }
    CHECKF(wrong == 0, "%d threads, pause %d ms: %d tasks did not run exactly once", n_threads, pause, wrong);
    CHECK(atomic_load(&j->bad_worker) == 0);
    thread_pool_run(pool, 0, count_run, j); /* nothing to do: returns at once */
    free(j);
    thread_pool_free(pool);
}

static void test_jobs_back_to_back(void) {
    for (int threads = 1; threads <= 8; threads *= 2) check_jobs(threads, 400, 0);
}

static void test_jobs_after_the_workers_slept(void) {
    for (int threads = 2; threads <= 4; threads *= 2) check_jobs(threads, 6, 30);
}

static void test_free_right_after_creation(void) {
    for (int i = 0; i < 20; i++) thread_pool_free(thread_pool_new(4));
    thread_pool_free(NULL);
}

int main(void) {
    RUN(test_jobs_back_to_back);
    RUN(test_jobs_after_the_workers_slept);
    RUN(test_free_right_after_creation);
    return test_summary();
}
