/*
 * job.h — one generation request on its way through the server: what the
 * HTTP side (server.c) and a slot's worker thread (slots.c) share.
 *
 * The HTTP side makes a job from a validated request and its rendered
 * prompt, hands it to the slots and waits. The worker that runs it
 * appends output under the job's lock and calls the wake hook whenever
 * there is something new: the whole reply when it is done, or each new
 * server-sent event of a stream. A job is reference counted (the
 * connection, the worker and a streaming response each hold one), so
 * whichever side finishes last frees it.
 */
#ifndef MOE_SERVER_JOB_H
#define MOE_SERVER_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "moe.h"
#include "server/api.h"

typedef enum job_state {
    JOB_WAITING,   /* queued, or tokenizing: nothing to send yet */
    JOB_STREAMING, /* the stream began: events accumulate in out */
    JOB_DONE,      /* finished (job_done): out holds the text (or the last events), or failed is set */
} job_state;

typedef enum job_cancel {
    JOB_GOING,           /* not cancelled */
    JOB_CANCEL_CLIENT,   /* the client went away: stop, nobody reads the rest */
    JOB_CANCEL_SHUTDOWN, /* the server is stopping: stop and send what there is */
} job_cancel;

typedef struct job job;

struct job {
    pthread_mutex_t lock;
    int refs; /* under lock */

    /* fixed when made */
    api_request req;
    api_meta meta;
    char *prompt; /* the text to tokenize: rendered chat, or the completion prompt */
    size_t prompt_len;
    const char **stops; /* the request's stop strings, then the chat template's */
    size_t n_stops;

    /* results, under lock */
    job_state state;
    bool streamed; /* the stream began (a 200 with events), so errors go in the stream */
    bool failed;   /* before a stream began: the reply is this error */
    api_error error;
    char *out; /* the reply text, or the events not yet sent */
    size_t out_len, out_cap, out_sent;
    int n_prompt, n_cached, n_generated;
    const char *finish; /* "stop" or "length" */

    atomic_int cancel; /* a job_cancel, read by the worker between tokens */

    /* the HTTP side's: hooks called with the lock held, and their data */
    void (*wake)(job *j);
    bool (*client_gone)(job *j);
    void *conn;
    bool suspended;
    void *orphan; /* the request, when it ended before the job: logged once the job is done */
};

/* A job holding one reference. Takes req's contents and prompt (malloc'd)
 * whether it succeeds or not; template_stops (may be NULL) must outlive it.
 * NULL when out of memory. */
job *job_new(api_request *req, char *prompt, const char *const *template_stops, const api_meta *meta);
void job_retain(job *j);
void job_release(job *j);

void job_cancel_for(job *j, job_cancel why);

/* --- what a worker does with a job */

/* The prompt's tokens (*ids freed with moe_free), checked against the
 * context; false when the job cannot run (it is then failed and done). */
bool job_tokenize(job *j, const moe_model *m, int n_ctx, int32_t **ids, size_t *n);

/* Generate into the job from session s, reusing the prefix of ids that s
 * already holds. */
void job_run(job *j, moe_session *s, const int32_t *ids, size_t n);

/* Fail the job: the reply is this error, or a begun stream gets it as an
 * event. */
void job_fail(job *j, const api_error *e);

/* The worker is finished with j (and its slot is free again, so that a
 * client that sends its next request on receiving this reply finds it
 * free): the reply may go. */
void job_done(job *j);

#endif
