/*
 * slots.c — see slots.h.
 *
 * One mutex guards the pool: the queue, which job each slot has, the
 * slots' last prompts and the flags. Each worker waits on its own
 * condition variable for a job; the drain waits on `changed`, signalled
 * whenever a slot finishes one.
 */
#include "server/slots.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

typedef struct slot {
    slot_pool *pool;
    pthread_t thread;
    pthread_cond_t wake;
    job *job;           /* the job it runs; NULL when idle (under the pool lock) */
    char *last_prompt;  /* the prompt of its last job (under the pool lock) */
    uint64_t last_used; /* when it was last given a job, in submissions (under the pool lock) */
    /* the worker's own */
    moe_session *session;
} slot;

struct slot_pool {
    moe_model *model;
    moe_session_params params; /* n_ctx resolved */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    slot *slots;
    int n_slots, n_threads;
    uint64_t n_submitted;
    job **queue; /* ring of queue_cap */
    int queue_cap, queue_head, queue_len;
    bool draining, stopping;
    atomic_uint_fast64_t seeds; /* seeds for requests that name none */
};

/* ------------------------------------------------------------ sessions */

/* splitmix64 over a counter: distinct, well-mixed seeds from any thread. */
static uint64_t fresh_seed(slot_pool *p) {
    uint64_t z = atomic_fetch_add(&p->seeds, 0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static moe_status new_session(slot *s, moe_error *err) {
    return moe_session_new(s->pool->model, &s->pool->params, &s->session, err);
}

/* The slot's session, set to the request's sampling: a fresh sampler (the
 * request's seed, or a fresh one) over the cache the slot already holds, so
 * every request can reuse the prefix it shares with the slot's last one. */
static moe_session *slot_session(slot *s, const api_request *r, moe_error *err) {
    moe_sampling want = r->sampling;
    if (!r->has_seed) want.seed = fresh_seed(s->pool);
    return moe_session_set_sampling(s->session, &want, err) == MOE_OK ? s->session : NULL;
}

/* ------------------------------------------------------------ workers */

static void run_job(slot *s, job *j) {
    api_error e;
    if (atomic_load(&j->cancel) != JOB_GOING) {
        api_fail(&e, 503, "server_shutting_down", NULL, "the server is shutting down; the request was not run");
        job_fail(j, &e);
        return;
    }
    int32_t *ids;
    size_t n;
    if (!job_tokenize(j, s->pool->model, s->pool->params.n_ctx, &ids, &n)) return;
    moe_error err = {0};
    moe_session *session = slot_session(s, &j->req, &err);
    if (session) {
        job_run(j, session, ids, n);
    } else {
        api_fail(&e, 500, NULL, NULL, "cannot make a session: %s", err.message);
        job_fail(j, &e);
    }
    moe_free(ids);
}

static job *queue_pop(slot_pool *p) {
    job *j = p->queue[p->queue_head];
    p->queue_head = (p->queue_head + 1) % p->queue_cap;
    p->queue_len--;
    return j;
}

/* Finished with j: record its prompt for the next job's choice of slot. */
static void slot_done(slot *s, job *j) {
    char *prompt = strdup(j->prompt);
    if (prompt) free(s->last_prompt), s->last_prompt = prompt;
    s->job = NULL;
}

/* This slot's next job: the one assigned to it, or else the queue's
 * first; NULL when the pool stops. */
static job *next_job(slot *s) {
    slot_pool *p = s->pool;
    pthread_mutex_lock(&p->lock);
    while (!s->job && !p->stopping) {
        if (p->queue_len)
            s->job = queue_pop(p), s->last_used = ++p->n_submitted;
        else
            pthread_cond_wait(&s->wake, &p->lock);
    }
    job *j = s->job;
    pthread_mutex_unlock(&p->lock);
    return j;
}

static void *worker_main(void *arg) {
    slot *s = arg;
    slot_pool *p = s->pool;
    for (job *j; (j = next_job(s)) != NULL;) {
        run_job(s, j);
        pthread_mutex_lock(&p->lock);
        slot_done(s, j);
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
        job_done(j);
        job_release(j);
    }
    return NULL;
}

/* ------------------------------------------------------------ the pool */

static size_t common_prefix(const char *a, const char *b) {
    size_t n = 0;
    if (a)
        while (a[n] && a[n] == b[n])
            n++;
    return n;
}

/* The idle slot whose last prompt shares the most with j's, the least
 * recently used among equals (its cache is the least likely to be wanted
 * again); NULL if none is idle. */
static slot *best_idle_slot(slot_pool *p, const job *j) {
    slot *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < p->n_slots; i++) {
        slot *s = &p->slots[i];
        if (s->job) continue;
        size_t len = common_prefix(s->last_prompt, j->prompt);
        if (!best || len > best_len || (len == best_len && s->last_used < best->last_used)) best = s, best_len = len;
    }
    return best;
}

slot_submit slot_pool_submit(slot_pool *p, job *j) {
    pthread_mutex_lock(&p->lock);
    slot_submit result = SLOT_ACCEPTED;
    slot *s = p->draining ? NULL : best_idle_slot(p, j);
    if (p->draining) {
        result = SLOT_DRAINING;
    } else if (s) {
        s->job = j;
        s->last_used = ++p->n_submitted;
        pthread_cond_signal(&s->wake);
    } else if (p->queue_len < p->queue_cap) {
        p->queue[(p->queue_head + p->queue_len++) % p->queue_cap] = j;
    } else {
        result = SLOT_QUEUE_FULL;
    }
    if (result == SLOT_ACCEPTED) job_retain(j);
    pthread_mutex_unlock(&p->lock);
    return result;
}

int slot_pool_n_ctx(const slot_pool *p) { return p->params.n_ctx; }

slot_stats slot_pool_stats(slot_pool *p) {
    pthread_mutex_lock(&p->lock);
    slot_stats st = {p->n_slots, 0, p->queue_len, p->queue_cap};
    for (int i = 0; i < p->n_slots; i++)
        st.busy += p->slots[i].job != NULL;
    pthread_mutex_unlock(&p->lock);
    return st;
}

static bool pool_busy(const slot_pool *p) {
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].job) return true;
    return p->queue_len > 0;
}

static void cancel_all(slot_pool *p) {
    for (int i = 0; i < p->n_slots; i++)
        if (p->slots[i].job) job_cancel_for(p->slots[i].job, JOB_CANCEL_SHUTDOWN);
    for (int i = 0; i < p->queue_len; i++)
        job_cancel_for(p->queue[(p->queue_head + i) % p->queue_cap], JOB_CANCEL_SHUTDOWN);
}

void slot_pool_drain(slot_pool *p, double seconds) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)seconds;
    deadline.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&p->lock);
    p->draining = true;
    while (pool_busy(p) && pthread_cond_timedwait(&p->changed, &p->lock, &deadline) != ETIMEDOUT)
        continue;
    cancel_all(p);
    while (pool_busy(p))
        pthread_cond_wait(&p->changed, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* Free what pool_new made; n_started workers are running. */
static void pool_destroy(slot_pool *p, int n_started) {
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    for (int i = 0; i < n_started; i++)
        pthread_cond_signal(&p->slots[i].wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->slots[i].thread, NULL);
    for (int i = 0; i < p->n_slots; i++) {
        moe_session_free(p->slots[i].session);
        free(p->slots[i].last_prompt);
        pthread_cond_destroy(&p->slots[i].wake);
    }
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->lock);
    free(p->slots);
    free(p->queue);
    free(p);
}

void slot_pool_free(slot_pool *p) {
    if (!p) return;
    slot_pool_drain(p, 0);
    pool_destroy(p, p->n_threads);
}

static bool init_sync(slot_pool *p) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) return false;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    bool ok = pthread_mutex_init(&p->lock, NULL) == 0 && pthread_cond_init(&p->changed, &attr) == 0;
    for (int i = 0; ok && i < p->n_slots; i++)
        ok = pthread_cond_init(&p->slots[i].wake, NULL) == 0;
    pthread_condattr_destroy(&attr);
    return ok;
}

/* Each slot's session (with the default sampling), then its thread. */
static moe_status start_slots(slot_pool *p, moe_error *err) {
    for (int i = 0; i < p->n_slots; i++) {
        slot *s = &p->slots[i];
        s->pool = p;
        moe_status st = new_session(s, err);
        if (st != MOE_OK) return st;
        p->params.n_ctx = moe_session_n_ctx(s->session);
    }
    for (; p->n_threads < p->n_slots; p->n_threads++)
        if (pthread_create(&p->slots[p->n_threads].thread, NULL, worker_main, &p->slots[p->n_threads]) != 0)
            return moe_error_set(err, MOE_ERR_NOMEM, "cannot start the slots' worker threads");
    return MOE_OK;
}

moe_status slot_pool_new(moe_model *m, const moe_session_params *params, int n_slots, int queue_cap, slot_pool **out,
                         moe_error *err) {
    *out = NULL;
    slot_pool *p = calloc(1, sizeof *p);
    if (!p) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    p->model = m;
    p->params = *params;
    p->n_slots = n_slots;
    p->queue_cap = queue_cap;
    p->seeds = params->sampling.seed;
    p->slots = calloc((size_t)n_slots, sizeof *p->slots);
    p->queue = calloc((size_t)(queue_cap > 0 ? queue_cap : 1), sizeof *p->queue);
    if (!p->slots || !p->queue || !init_sync(p)) {
        free(p->slots);
        free(p->queue);
        free(p);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    moe_status st = start_slots(p, err);
    if (st != MOE_OK) {
        pool_destroy(p, p->n_threads);
        return st;
    }
    *out = p;
    return MOE_OK;
}
