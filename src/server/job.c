/*
 * job.c — see job.h.
 */
#include "server/job.h"

#include <stdlib.h>
#include <string.h>

job *job_new(api_request *req, char *prompt, const char *const *template_stops, const api_meta *meta) {
    size_t n_template = 0;
    while (template_stops && template_stops[n_template])
        n_template++;
    job *j = calloc(1, sizeof *j);
    const char **stops = calloc(req->n_stop + n_template + 1, sizeof *stops);
    if (!j || !stops || pthread_mutex_init(&j->lock, NULL) != 0) {
        free(j);
        free(stops);
        free(prompt);
        api_request_free(req);
        return NULL;
    }
    for (size_t i = 0; i < req->n_stop; i++)
        stops[j->n_stops++] = req->stop[i];
    for (size_t i = 0; i < n_template; i++)
        stops[j->n_stops++] = template_stops[i];
    j->refs = 1;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->meta = *meta;
    j->prompt = prompt;
    j->prompt_len = strlen(prompt);
    j->stops = stops;
    return j;
}

void job_retain(job *j) {
    pthread_mutex_lock(&j->lock);
    j->refs++;
    pthread_mutex_unlock(&j->lock);
}

void job_release(job *j) {
    pthread_mutex_lock(&j->lock);
    int left = --j->refs;
    pthread_mutex_unlock(&j->lock);
    if (left > 0) return;
    pthread_mutex_destroy(&j->lock);
    api_request_free(&j->req);
    free(j->prompt);
    free(j->stops);
    free(j->out);
    free(j);
}

void job_cancel_for(job *j, job_cancel why) {
    int going = JOB_GOING;
    atomic_compare_exchange_strong(&j->cancel, &going, (int)why);
}

/* ------------------------------------------------------------ output (lock held) */

static void wake(job *j) {
    if (j->wake) j->wake(j);
}

/* Append to out; what was sent already is dropped first. */
static bool append(job *j, const char *s, size_t len) {
    if (j->out_sent == j->out_len) j->out_len = j->out_sent = 0;
    if (j->out_len + len + 1 > j->out_cap) {
        size_t cap = (j->out_len + len + 1) * 2;
        char *grown = realloc(j->out, cap);
        if (!grown) return false;
        j->out = grown, j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, len);
    j->out_len += len;
    j->out[j->out_len] = '\0';
    return true;
}

/* Append an event made by api.h (and free it); false when it could not be made. */
static bool append_event(job *j, char *event) {
    bool ok = event && append(j, event, strlen(event));
    free(event);
    return ok;
}

static void fail_locked(job *j, const api_error *e) {
    if (j->streamed) {
        append_event(j, api_stream_error(e));
    } else {
        j->failed = true;
        j->error = *e;
    }
}

void job_fail(job *j, const api_error *e) {
    pthread_mutex_lock(&j->lock);
    fail_locked(j, e);
    pthread_mutex_unlock(&j->lock);
}

void job_done(job *j) {
    pthread_mutex_lock(&j->lock);
    j->state = JOB_DONE;
    wake(j);
    pthread_mutex_unlock(&j->lock);
}

/* ------------------------------------------------------------ running */

bool job_tokenize(job *j, const moe_model *m, int n_ctx, int32_t **ids, size_t *n) {
    moe_error err = {0};
    api_error e;
    const char *param = j->req.kind == API_CHAT ? "messages" : "prompt";
    *ids = NULL;
    if (moe_tokenize(m, j->prompt, j->prompt_len, true, true, ids, n, &err) != MOE_OK)
        api_fail(&e, err.code == MOE_ERR_NOMEM ? 500 : 400, NULL, param, "cannot tokenize the prompt: %s", err.message);
    else if (*n == 0)
        api_fail(&e, 400, "invalid_value", param, "the prompt is empty (it has no tokens)");
    else if (*n > (size_t)n_ctx)
        api_fail(&e, 400, "context_length_exceeded", param,
                 "the prompt has %zu tokens but the context holds %d (the server's --ctx-size)", *n, n_ctx);
    else
        return true;
    moe_free(*ids);
    *ids = NULL;
    job_fail(j, &e);
    return false;
}

/* The generated text as it becomes final: into the reply, or the stream
 * (whose connection is woken to send it). Whether the client is still
 * there is asked first, while its connection may still be asleep.
 * Returning false stops the generation. */
static bool on_text(const char *text, size_t len, void *user) {
    job *j = user;
    pthread_mutex_lock(&j->lock);
    if (j->client_gone && j->client_gone(j)) job_cancel_for(j, JOB_CANCEL_CLIENT);
    bool ok = j->req.stream ? append_event(j, api_stream_delta(&j->meta, text, len)) : append(j, text, len);
    if (!ok)
        api_fail(&j->error, 500, NULL, NULL, "cannot encode the generated text (out of memory?)");
    else if (j->req.stream)
        wake(j);
    bool going = ok && atomic_load(&j->cancel) == JOB_GOING;
    pthread_mutex_unlock(&j->lock);
    return going;
}

/* The positions s already holds that the prompt begins with; at least one
 * prompt token is always fed again, for fresh logits. */
static size_t cached_prefix(const moe_session *s, const int32_t *ids, size_t n) {
    int n_have;
    const int32_t *have = moe_session_tokens(s, &n_have);
    size_t k = 0;
    while (k < n && k < (size_t)n_have && have[k] == ids[k])
        k++;
    return k == n ? k - 1 : k;
}

static bool begin_stream(job *j) {
    pthread_mutex_lock(&j->lock);
    bool ok = append_event(j, api_stream_start(&j->meta));
    if (ok) {
        j->streamed = true;
        j->state = JOB_STREAMING;
        wake(j);
    }
    pthread_mutex_unlock(&j->lock);
    return ok;
}

static void finish(job *j, const moe_generate_result *r, size_t n_prompt) {
    j->n_prompt = (int)n_prompt;
    j->n_generated = r->n_generated;
    /* A generation cut short by shutdown is a reply cut at a limit. */
    j->finish = r->finish == MOE_FINISH_STOP ? "stop" : "length";
    if (r->finish == MOE_FINISH_CANCELLED && j->error.status) {
        fail_locked(j, &j->error); /* on_text could not encode the text */
        return;
    }
    api_usage usage = {j->n_prompt, j->n_generated, j->n_cached};
    if (j->req.stream && !append_event(j, api_stream_end(&j->meta, j->finish, j->req.include_usage ? &usage : NULL))) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        fail_locked(j, &e);
    }
}

void job_run(job *j, moe_session *s, const int32_t *ids, size_t n) {
    moe_error err = {0};
    size_t keep = cached_prefix(s, ids, n);
    j->n_cached = (int)keep;
    api_error e;
    if (moe_session_rewind(s, (int)keep, &err) != MOE_OK) {
        api_fail(&e, 500, NULL, NULL, "%s", err.message);
        job_fail(j, &e);
        return;
    }
    if (j->req.stream && !begin_stream(j)) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        job_fail(j, &e);
        return;
    }
    moe_generate_params gp = {
        .max_tokens = j->req.max_tokens, .stop = j->stops, .n_stop = j->n_stops, .on_text = on_text, .user = j};
    moe_generate_result r;
    moe_status st = moe_generate(s, ids + keep, n - keep, &gp, &r, &err);
    if (st != MOE_OK) {
        api_fail(&e, 500, NULL, NULL, "generation failed: %s", err.message);
        job_fail(j, &e);
        return;
    }
    pthread_mutex_lock(&j->lock);
    finish(j, &r, n);
    pthread_mutex_unlock(&j->lock);
}
