/*
 * server.c — the HTTP side of `moe serve`, on libmicrohttpd.
 *
 * Threading model
 *
 *   - One libmicrohttpd polling thread (epoll) owns every socket. It reads
 *     requests, validates them (api.h), renders chat prompts, and writes
 *     replies: short work that never blocks. It never runs the model.
 *   - N slot workers (slots.h), one thread and one moe_session each, run
 *     the generations; they share the model's weights, which are
 *     read-only.
 *   - A request waiting for its generation is a suspended connection
 *     (MHD_suspend_connection): it costs no thread and no polling. The
 *     worker appends output to the job under the job's lock and resumes
 *     the connection (MHD_resume_connection may be called from any
 *     thread) when there is something to send: the whole reply, or for a
 *     stream each new event. A stream is a response-from-callback whose
 *     callback sends what the job holds and, once it has caught up,
 *     suspends the connection again.
 *   - Both suspend and resume are called holding the job's lock: that
 *     makes "nothing to send, so suspend" and "new output, so resume" free
 *     of lost wake-ups. Lock order: a job's lock, then libmicrohttpd's.
 *   - A suspended connection is invisible to libmicrohttpd (no timeout, no
 *     disconnect detection), so between tokens the worker polls the socket
 *     of a suspended connection for a hang-up (the socket stays open while
 *     suspended) and cancels the generation of a client that has gone.
 *     A connection that is not suspended is libmicrohttpd's: a failed
 *     write or a timeout ends the request, and the completion callback
 *     cancels the job.
 *   - Shutdown: stop listening (MHD_quiesce_daemon), answer new requests on
 *     open connections 503, let running and queued jobs finish within the
 *     drain time and cancel the rest, give replies still being written a
 *     moment, then stop libmicrohttpd. Every job is done by then, so no
 *     connection is left suspended (libmicrohttpd must not be stopped with
 *     one).
 */
#include "server/server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "server/api.h"
#include "server/job.h"
#include "server/slots.h"

/* A body over the limit is still read, and dropped, up to this size, so
 * that the client reads its 413 rather than a reset connection; past it
 * the connection is closed. */
#define DISCARD_LIMIT ((size_t)64 << 20)
/* On shutdown, how long replies still being written get once every
 * generation is done. */
#define WRITE_GRACE_SECONDS 2.0
/* Bytes of a stream libmicrohttpd asks the callback for at most. */
#define STREAM_BLOCK 16384

static const char JSON_TYPE[] = "application/json";

struct server {
    server_config cfg;
    moe_model *model;
    slot_pool *slots;
    struct MHD_Daemon *daemon;
    const char *const *chat_stops; /* NULL when the chat template is unusable */
    char chat_error[512];          /* why, then */
    long long started;             /* Unix seconds: the model's "created" */
    uint64_t id_key;               /* random, so ids differ between runs */
    atomic_uint_fast64_t n_ids;
    atomic_bool draining;
    atomic_int active; /* requests begun and not yet completed */
};

typedef enum route_id { ROUTE_CHAT, ROUTE_COMPLETION, ROUTE_MODELS, ROUTE_HEALTH } route_id;

typedef struct route {
    const char *path, *method;
    route_id id;
} route;

static const route routes[] = {
    {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/v1/completions", "POST", ROUTE_COMPLETION},
    {"/v1/models", "GET", ROUTE_MODELS},
    {"/health", "GET", ROUTE_HEALTH},
};

/* One HTTP request: libmicrohttpd's per-request context. */
typedef struct request {
    server *srv;
    struct MHD_Connection *conn;
    const route *route;
    char method[16], path[160]; /* printable ASCII copies, for messages and the log */
    double start;               /* monotonic seconds */
    char *body;
    size_t body_len, body_cap, received;
    api_error refusal;     /* status != 0: the answer, sent once the body is in */
    const char *header[2]; /* a header to send with the refusal: name, value */
    job *job;
    int status;      /* of the reply queued; 0 before */
    const char *end; /* how the request ended, for the log */
} request;

/* A copy with anything but printable ASCII as '?': request lines go into
 * JSON error messages and the log, which must stay valid UTF-8 and one
 * line. */
static void copy_printable(char *dst, size_t size, const char *src) {
    size_t i = 0;
    for (; src[i] && i + 1 < size; i++)
        dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[i] = '\0';
}

/* ------------------------------------------------------------ replies */

/* Queue a reply with body (malloc'd, taken; NULL when it could not be
 * made, which drops the connection). */
static enum MHD_Result reply(request *r, int status, char *body, const char *type, const char *const header[2]) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(strlen(body), body, free);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (header && header[0]) MHD_add_response_header(resp, header[0], header[1]);
    /* While draining, keep-alive clients should reconnect (and find the
     * listener gone) rather than send more here. */
    if (atomic_load(&r->srv->draining)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES) r->status = status;
    return ok;
}

static enum MHD_Result reply_error(request *r, const api_error *e, const char *const header[2]) {
    return reply(r, e->status, api_error_json(e), JSON_TYPE, header);
}

static enum MHD_Result reply_health(request *r) {
    slot_stats st = slot_pool_stats(r->srv->slots);
    char *body = NULL;
    if (asprintf(&body, "{\"status\":\"ok\",\"slots\":%d,\"busy\":%d,\"queued\":%d,\"queue\":%d,\"n_ctx\":%d}",
                 st.slots, st.busy, st.queued, st.queue_cap, slot_pool_n_ctx(r->srv->slots)) < 0)
        body = NULL;
    return reply(r, 200, body, JSON_TYPE, NULL);
}

/* ------------------------------------------------------------ streams */

/* libmicrohttpd wants more of the stream: the events the job holds, the
 * end when it is done, or else nothing yet (and the connection sleeps
 * until the worker wakes it). */
static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    ssize_t n = 0;
    pthread_mutex_lock(&j->lock);
    size_t ready = j->out_len - j->out_sent;
    if (ready) {
        n = (ssize_t)(ready < max ? ready : max);
        memcpy(buf, j->out + j->out_sent, (size_t)n);
        j->out_sent += (size_t)n;
    } else if (j->state == JOB_DONE) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        j->suspended = true;
        MHD_suspend_connection(j->conn);
    }
    pthread_mutex_unlock(&j->lock);
    return n;
}

static void release_events(void *cls) { job_release(cls); }

static enum MHD_Result reply_stream(request *r) {
    job *j = r->job;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, read_events, j, release_events);
    if (!resp) return MHD_NO;
    job_retain(j); /* the response's, released by release_events */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES) r->status = MHD_HTTP_OK;
    return ok;
}

static void log_access(const request *r, const job *j);

/* The job's hooks (called by the worker with the job's lock held). The
 * log line of a request that ended before its job (a client that went
 * away) is written when the job is done, with the job's final counts. */
static void wake_connection(job *j) {
    if (j->suspended) {
        j->suspended = false;
        MHD_resume_connection(j->conn);
    }
    if (j->state == JOB_DONE && j->orphan) {
        log_access(j->orphan, j);
        free(j->orphan);
        j->orphan = NULL;
    }
}

static bool connection_gone(job *j) {
    if (!j->suspended) return false; /* libmicrohttpd is watching it */
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(j->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return false;
    struct pollfd pfd = {.fd = info->connect_fd, .events = POLLRDHUP};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Called first when the job is submitted, then each time the worker wakes
 * the connection before a reply went out: reply once there is one. */
static enum MHD_Result reply_job(request *r) {
    job *j = r->job;
    pthread_mutex_lock(&j->lock);
    if (!j->streamed && j->state != JOB_DONE) {
        j->suspended = true;
        MHD_suspend_connection(r->conn);
        pthread_mutex_unlock(&j->lock);
        return MHD_YES;
    }
    bool streamed = j->streamed, failed = j->failed;
    api_error e = j->error;
    char *body = NULL;
    if (!streamed && !failed)
        body = api_response_json(&j->meta, j->out ? j->out : "", j->out_len, j->finish,
                                 (api_usage){j->n_prompt, j->n_generated, j->n_cached});
    pthread_mutex_unlock(&j->lock);
    if (streamed) return reply_stream(r);
    if (!failed && !body) api_fail(&e, 500, NULL, NULL, "cannot encode the reply (out of memory?)");
    return body ? reply(r, MHD_HTTP_OK, body, JSON_TYPE, NULL) : reply_error(r, &e, NULL);
}

/* ------------------------------------------------------------ generation requests */

/* ids like OpenAI's: a prefix and 24 letters and digits. */
static api_meta new_meta(server *srv, api_kind kind) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    api_meta m = {.kind = kind, .model = srv->cfg.model_name, .created = (long long)time(NULL)};
    uint64_t z = srv->id_key + atomic_fetch_add(&srv->n_ids, 1) * 0x9e3779b97f4a7c15ull;
    char tail[25];
    for (int half = 0; half < 2; half++) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        uint64_t v = z ^ (z >> 31);
        for (int i = 0; i < 12; i++, v /= 62)
            tail[half * 12 + i] = digits[v % 62];
    }
    tail[24] = '\0';
    snprintf(m.id, sizeof m.id, "%s-%s", kind == API_CHAT ? "chatcmpl" : "cmpl", tail);
    return m;
}

/* The text the model continues: the chat rendered with its template, or
 * the completion's prompt (taken from req). NULL with *e filled. */
static char *render_prompt(server *srv, api_request *req, api_error *e) {
    if (req->kind == API_COMPLETION) {
        char *prompt = req->prompt;
        req->prompt = NULL;
        return prompt;
    }
    if (!srv->chat_stops) {
        api_fail(e, 500, NULL, NULL, "chat is unavailable: %s", srv->chat_error);
        return NULL;
    }
    char *text = NULL, *copy = NULL;
    moe_error err = {0};
    if (moe_chat_format(srv->model, srv->cfg.chat_template, req->messages, req->n_messages, true, &text, &err) !=
        MOE_OK)
        api_fail(e, err.code == MOE_ERR_NOMEM ? 500 : 400, "invalid_value", "messages", "%s", err.message);
    else if (!(copy = strdup(text)))
        api_fail(e, 500, NULL, NULL, "out of memory");
    moe_free(text);
    return copy;
}

static void refuse_busy(const server *srv, api_error *e) {
    slot_stats st = slot_pool_stats(srv->slots);
    api_fail(e, 503, "server_busy", NULL,
             "the server is busy: all %d slots are generating and the queue of %d is full (--parallel, --queue); "
             "retry later",
             st.slots, st.queue_cap);
}

static enum MHD_Result submit(request *r, api_kind kind) {
    server *srv = r->srv;
    api_request req;
    api_error e;
    int parsed = api_request_parse(kind, r->body ? r->body : "", r->body_len, &srv->cfg.session.sampling, &req, &e);
    free(r->body);
    r->body = NULL;
    if (parsed < 0) return reply_error(r, &e, NULL);
    char *prompt = render_prompt(srv, &req, &e);
    if (!prompt) {
        api_request_free(&req);
        return reply_error(r, &e, NULL);
    }
    api_meta meta = new_meta(srv, kind);
    job *j = job_new(&req, prompt, kind == API_CHAT ? srv->chat_stops : NULL, &meta);
    if (!j) return reply_error(r, (api_fail(&e, 500, NULL, NULL, "out of memory"), &e), NULL);
    j->conn = r->conn;
    j->wake = wake_connection;
    j->client_gone = connection_gone;
    slot_submit placed = slot_pool_submit(srv->slots, j);
    if (placed == SLOT_ACCEPTED) {
        r->job = j;
        return reply_job(r);
    }
    job_release(j);
    if (placed == SLOT_QUEUE_FULL)
        refuse_busy(srv, &e);
    else
        api_fail(&e, 503, "server_shutting_down", NULL, "the server is shutting down");
    return reply_error(r, &e, NULL);
}

/* ------------------------------------------------------------ requests */

/* Compares in time that depends on the key's length only, never on where
 * a guess first goes wrong. */
static bool same_secret(const char *key, const char *given) {
    size_t n = strlen(key), m = strlen(given);
    unsigned char diff = n != m;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}

static bool authorized(const server *srv, struct MHD_Connection *c, api_error *e) {
    if (!srv->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return api_fail(e, 401, "invalid_api_key", NULL, "no API key: send the header 'Authorization: Bearer KEY'"),
               false;
    if (!same_secret(srv->cfg.api_key, h + 7))
        return api_fail(e, 401, "invalid_api_key", NULL, "the API key is not the one this server was given"), false;
    return true;
}

static unsigned long long content_length(struct MHD_Connection *c) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return v ? strtoull(v, NULL, 10) : 0;
}

static bool expects_continue(struct MHD_Connection *c) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return v && strcasecmp(v, "100-continue") == 0;
}

static void refuse_too_large(request *r) {
    api_fail(&r->refusal, 413, "request_too_large", NULL,
             "the request body is larger than the limit of %zu bytes (--max-body)", r->srv->cfg.max_body);
}

/* Route, method, key and declared size; anything wrong goes in r->refusal. */
static void screen(request *r, struct MHD_Connection *c) {
    server *srv = r->srv;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !r->route; i++)
        if (strcmp(r->path, routes[i].path) == 0) r->route = &routes[i];
    if (atomic_load(&srv->draining)) {
        api_fail(&r->refusal, 503, "server_shutting_down", NULL, "the server is shutting down");
    } else if (!r->route) {
        api_fail(&r->refusal, 404, "unknown_url", NULL,
                 "no endpoint %s %s: this server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models "
                 "and GET /health",
                 r->method, r->path);
    } else if (strcmp(r->method, r->route->method) != 0) {
        api_fail(&r->refusal, 405, "method_not_allowed", NULL, "%s takes %s, not %s", r->path, r->route->method,
                 r->method);
        r->header[0] = MHD_HTTP_HEADER_ALLOW, r->header[1] = r->route->method;
    } else if (r->route->id != ROUTE_HEALTH && !authorized(srv, c, &r->refusal)) {
        r->header[0] = MHD_HTTP_HEADER_WWW_AUTHENTICATE, r->header[1] = "Bearer";
    } else if (content_length(c) > srv->cfg.max_body) {
        refuse_too_large(r);
    }
}

static enum MHD_Result begin(server *srv, struct MHD_Connection *c, const char *url, const char *method, void **ctx) {
    request *r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->srv = srv;
    r->conn = c;
    r->start = monotonic_seconds();
    copy_printable(r->method, sizeof r->method, method);
    copy_printable(r->path, sizeof r->path, url);
    atomic_fetch_add(&srv->active, 1);
    *ctx = r;
    screen(r, c);
    /* A refused client waiting for "100 Continue" is answered now, and so
     * is one whose body would be too large even to read and drop. */
    if (r->refusal.status && (expects_continue(c) || content_length(c) > DISCARD_LIMIT))
        return reply_error(r, &r->refusal, r->header);
    return MHD_YES;
}

static enum MHD_Result take_body(request *r, const char *data, size_t *size) {
    size_t n = *size;
    *size = 0;
    r->received += n;
    if (r->received > DISCARD_LIMIT) return MHD_NO;
    if (r->refusal.status) return MHD_YES;
    if (r->received > r->srv->cfg.max_body) {
        refuse_too_large(r);
        free(r->body);
        r->body = NULL;
        r->body_len = 0;
        return MHD_YES;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = (r->body_len + n + 1) * 2;
        char *grown = realloc(r->body, cap);
        if (!grown) return MHD_NO;
        r->body = grown, r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    return MHD_YES;
}

/* The whole request is in: answer it. */
static enum MHD_Result serve(request *r) {
    if (r->refusal.status) return reply_error(r, &r->refusal, r->header);
    switch (r->route->id) {
    case ROUTE_CHAT: return submit(r, API_CHAT);
    case ROUTE_COMPLETION: return submit(r, API_COMPLETION);
    case ROUTE_MODELS:
        return reply(r, MHD_HTTP_OK, api_models_json(r->srv->cfg.model_name, r->srv->started), JSON_TYPE, NULL);
    case ROUTE_HEALTH: return reply_health(r);
    }
    return MHD_NO;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **ctx) {
    request *r = *ctx;
    if (!r) return begin(cls, c, url, method, ctx);
    if (r->status) { /* answered early: drop whatever else comes */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) return take_body(r, upload, upload_size);
    if (r->job) return reply_job(r);
    return serve(r);
}

/* ------------------------------------------------------------ completion and the log */

static const char *ending(enum MHD_RequestTerminationCode toe) {
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK: return "ok";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return "timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return "shutdown";
    default: return "aborted";
    }
}

/* One line per request on stderr: method, path, status, tokens (prompt,
 * of them reused from the slot's cache, completion; j's, with its lock
 * held), milliseconds and how the connection ended. */
static void log_access(const request *r, const job *j) {
    int tokens[3] = {j ? j->n_prompt : 0, j ? j->n_cached : 0, j ? j->n_generated : 0};
    double ms = (monotonic_seconds() - r->start) * 1e3;
    char stamp[32], status[8] = "-";
    time_t t = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    if (r->status) snprintf(status, sizeof status, "%d", r->status);
    if (!r->srv->cfg.log_json) {
        fprintf(stderr, "%s %s %s %s prompt=%d cached=%d completion=%d %.1fms %s\n", stamp, r->method, r->path, status,
                tokens[0], tokens[1], tokens[2], ms, r->end);
        return;
    }
    json_t *line =
        json_pack("{s:s, s:s, s:s, s:o, s:i, s:i, s:i, s:f, s:s}", "time", stamp, "method", r->method, "path", r->path,
                  "status", r->status ? json_integer(r->status) : json_null(), "prompt_tokens", tokens[0],
                  "cached_tokens", tokens[1], "completion_tokens", tokens[2], "ms", ms, "end", r->end);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    if (text) fprintf(stderr, "%s\n", text);
    free(text);
    json_decref(line);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe) {
    server *srv = cls;
    request *r = *ctx;
    if (!r) return;
    *ctx = NULL;
    free(r->body);
    r->body = NULL;
    r->end = ending(toe);
    job *j = r->job;
    if (j && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) job_cancel_for(j, JOB_CANCEL_CLIENT);
    if (j) pthread_mutex_lock(&j->lock);
    bool orphaned = j && j->state != JOB_DONE;
    if (orphaned)
        j->orphan = r;
    else
        log_access(r, j);
    if (j) {
        j->conn = NULL;
        j->suspended = false;
        pthread_mutex_unlock(&j->lock);
        job_release(j);
    }
    if (!orphaned) free(r);
    atomic_fetch_sub(&srv->active, 1);
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    fputs("moe serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ------------------------------------------------------------ start and stop */

/* The chat template's stop strings; a model without a usable template
 * still serves completions (chat requests then get the reason), unless
 * the template was named on the command line. */
static moe_status check_chat_template(server *srv, moe_error *err) {
    moe_error e = {0};
    if (moe_chat_stops(srv->model, srv->cfg.chat_template, &srv->chat_stops, &e) == MOE_OK) return MOE_OK;
    srv->chat_stops = NULL;
    if (srv->cfg.chat_template) return moe_error_set(err, e.code, "%s", e.message);
    snprintf(srv->chat_error, sizeof srv->chat_error, "%s", e.message);
    fprintf(stderr, "moe serve: warning: /v1/chat/completions is unavailable: %s\n", e.message);
    return MOE_OK;
}

static moe_status listen_http(server *srv, moe_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", srv->cfg.port);
    int rc = getaddrinfo(srv->cfg.host, port, &hints, &ai);
    if (rc != 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "cannot resolve --host %s: %s", srv->cfg.host, gai_strerror(rc));
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    /* The logger goes first, so that it gets the messages about the other options. */
    srv->daemon =
        MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, on_access, srv, MHD_OPTION_EXTERNAL_LOGGER,
                         log_mhd, srv, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                         srv->cfg.timeout, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->daemon)
        return moe_error_set(err, MOE_ERR_IO, "cannot listen on %s port %d (the reason is above)", srv->cfg.host,
                             srv->cfg.port);
    return MOE_OK;
}

moe_status server_start(const server_config *config, moe_model *model, server **out, moe_error *err) {
    *out = NULL;
    server *srv = calloc(1, sizeof *srv);
    if (!srv) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    srv->cfg = *config;
    srv->model = model;
    srv->started = (long long)time(NULL);
    if (getrandom(&srv->id_key, sizeof srv->id_key, 0) != (ssize_t)sizeof srv->id_key)
        srv->id_key = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    moe_status st = check_chat_template(srv, err);
    if (st == MOE_OK) st = slot_pool_new(model, &config->session, config->parallel, config->queue, &srv->slots, err);
    if (st == MOE_OK) st = listen_http(srv, err);
    if (st != MOE_OK) {
        slot_pool_free(srv->slots);
        free(srv);
        return st;
    }
    *out = srv;
    return MOE_OK;
}

int server_port(const server *srv) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : srv->cfg.port;
}

int server_n_ctx(const server *srv) { return slot_pool_n_ctx(srv->slots); }

static void wait_for_replies(server *srv, double seconds) {
    double until = monotonic_seconds() + seconds;
    while (atomic_load(&srv->active) > 0 && monotonic_seconds() < until)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
}

void server_stop(server *srv) {
    atomic_store(&srv->draining, true);
    MHD_socket listener = MHD_quiesce_daemon(srv->daemon);
    if (listener != MHD_INVALID_SOCKET) close(listener);
    slot_pool_drain(srv->slots, srv->cfg.drain_seconds);
    wait_for_replies(srv, WRITE_GRACE_SECONDS);
    MHD_stop_daemon(srv->daemon);
    slot_pool_free(srv->slots);
    free(srv);
}
