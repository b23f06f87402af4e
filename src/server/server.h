/*
 * server.h — the OpenAI-compatible HTTP server behind `moe serve`.
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions,
 * GET /v1/models, GET /health. How the threads divide the work is at the
 * top of server.c.
 */
#ifndef MOE_SERVER_SERVER_H
#define MOE_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "moe.h"

typedef struct server_config {
    const char *host;           /* address to listen on (numeric, or a name that resolves) */
    int port;                   /* 0: any free port (see server_port) */
    int parallel;               /* slots: generations at once */
    int queue;                  /* requests that may wait for a slot */
    size_t max_body;            /* bytes; a larger request body is a 413 */
    unsigned timeout;           /* seconds a connection may stay idle or stalled */
    double drain_seconds;       /* on shutdown, time running requests get to finish */
    const char *api_key;        /* NULL: no key needed */
    const char *chat_template;  /* NULL: the model's */
    const char *model_name;     /* the "model" of responses and /v1/models */
    bool log_json;              /* access log as JSON lines (else plain text) */
    moe_session_params session; /* each slot's context and batch, the default sampling */
} server_config;

typedef struct server server;

/* Listen and serve until server_stop. The model must outlive the server. */
moe_status server_start(const server_config *config, moe_model *model, server **out, moe_error *err);

int server_port(const server *s);
int server_n_ctx(const server *s);

/* Stop accepting connections, drain (see slot_pool_drain), give replies
 * being written a moment, close everything and free. */
void server_stop(server *s);

#endif
