/*
 * api.h — the OpenAI API's shapes: request bodies in, response bodies out.
 *
 * A pure layer between HTTP and the engine: JSON text to a validated
 * generation request, and results to the JSON (or server-sent event) text
 * a client expects. No sockets, no model, no threads: the fuzz target
 * (fuzz/fuzz_request.c) and the unit test drive it directly.
 *
 * Validation follows OpenAI's rules: unknown fields are ignored, a known
 * field of the wrong type or out of range is a 400 naming the field, and
 * null means "not given".
 */
#ifndef MOE_SERVER_API_H
#define MOE_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>

#include "moe.h"

typedef enum api_kind {
    API_CHAT,       /* POST /v1/chat/completions */
    API_COMPLETION, /* POST /v1/completions */
} api_kind;

/* An error in OpenAI's shape: {"error":{"message","type","param","code"}}. */
typedef struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error" */
    const char *code; /* a short machine-readable code, or NULL */
    char param[64];   /* the request field at fault, "" for none */
    char message[512];
} api_error;

/* Fill *e; param may be NULL. Returns -1, so a parser can `return api_fail(...)`. */
int api_fail(api_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A validated generation request; every string is owned by it. */
typedef struct api_request {
    api_kind kind;
    char *model;                /* the model the client named, NULL if none */
    moe_chat_message *messages; /* chat: roles are "system", "user" or "assistant" */
    size_t n_messages;
    char *prompt;   /* completion */
    int max_tokens; /* 0: until the context is full */
    moe_sampling sampling;
    bool has_seed; /* the client chose the seed (else sampling.seed is meaningless) */
    char **stop;
    size_t n_stop;
    bool stream, include_usage;
} api_request;

/* Parse and validate a request body. defaults gives the sampling settings
 * of fields the client leaves out. On success *out is filled (free it with
 * api_request_free) and 0 returned; else -1 with *err a 400. */
int api_request_parse(api_kind kind, const char *body, size_t len, const moe_sampling *defaults, api_request *out,
                      api_error *err);
void api_request_free(api_request *r);

/* What every response and chunk of one request repeats. */
typedef struct api_meta {
    api_kind kind;
    char id[48]; /* chatcmpl-... or cmpl-... */
    const char *model;
    long long created; /* Unix seconds */
} api_meta;

typedef struct api_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of the prompt's, found in the slot's cache (not recomputed) */
} api_usage;

/* The texts below are malloc'd, NUL-terminated, and NULL when out of
 * memory or when text is not valid UTF-8 (the engine emits only whole,
 * valid sequences, so that means a bug upstream, reported as a 500). */

/* {"error":{...}} */
char *api_error_json(const api_error *e);

/* A whole (non-streamed) chat.completion or text_completion. */
char *api_response_json(const api_meta *m, const char *text, size_t len, const char *finish, api_usage usage);

/* Server-sent events of a streamed response, each "data: {...}\n\n".
 * start: the chat's first chunk (the assistant role), "" for completions;
 * delta: one piece of text; end: the chunk with finish_reason, the usage
 * chunk when usage is not NULL, and "data: [DONE]". */
char *api_stream_start(const api_meta *m);
char *api_stream_delta(const api_meta *m, const char *text, size_t len);
char *api_stream_end(const api_meta *m, const char *finish, const api_usage *usage);

/* An error after the stream began: an error event, then [DONE]. */
char *api_stream_error(const api_error *e);

/* GET /v1/models: the one model served. */
char *api_models_json(const char *model, long long created);

#endif
