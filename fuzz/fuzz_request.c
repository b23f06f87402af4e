/*
 * fuzz_request.c — libFuzzer target for the server's request layer
 * (src/server/api.c): an OpenAI request body to a validated generation
 * request, and the responses made from one.
 *
 * The first byte picks the endpoint ('p': /v1/completions, anything else:
 * /v1/chat/completions); the rest is the body. A refused body must come
 * back as a 400 (or a 500 for out of memory) with a message, as error JSON
 * that parses. An accepted one must hold what the layer promises (known
 * roles, content and prompt present, sampling in range, stop strings
 * non-empty), and every response built from its text must be JSON that
 * parses back to the same text.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) __builtin_trap();                                                                                 \
    } while (0)

static const moe_sampling defaults = {.temperature = 0.8f,
                                      .top_k = 40,
                                      .top_p = 0.95f,
                                      .min_p = 0.05f,
                                      .repetition_penalty = 1,
                                      .penalty_last_n = 64,
                                      .seed = 1};

static void check_refusal(const api_error *e) {
    REQUIRE((e->status == 400 || e->status == 500) && e->message[0]);
    char *text = api_error_json(e);
    REQUIRE(text);
    json_t *v = json_loads(text, 0, NULL);
    REQUIRE(json_is_string(json_object_get(json_object_get(v, "error"), "message")));
    json_decref(v);
    free(text);
}

static bool known_role(const char *role) {
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0;
}

static void check_request(const api_request *r) {
    if (r->kind == API_CHAT) {
        REQUIRE(r->n_messages > 0 && !r->prompt);
        for (size_t i = 0; i < r->n_messages; i++)
            REQUIRE(known_role(r->messages[i].role) && r->messages[i].content);
    } else {
        REQUIRE(r->prompt && r->n_messages == 0);
    }
    const moe_sampling *s = &r->sampling;
    REQUIRE(s->temperature >= 0 && s->temperature <= 2 && s->top_p > 0 && s->top_p <= 1);
    REQUIRE(s->min_p >= 0 && s->min_p <= 1 && s->top_k >= 0 && r->max_tokens >= 0);
    REQUIRE(s->presence_penalty >= -2 && s->presence_penalty <= 2);
    REQUIRE(s->frequency_penalty >= -2 && s->frequency_penalty <= 2);
    REQUIRE(r->n_stop <= 16 && (r->stream || !r->include_usage));
    for (size_t i = 0; i < r->n_stop; i++)
        REQUIRE(r->stop[i][0]);
}

/* text as the content of a reply and of a stream delta: both must parse,
 * and the reply must carry text unchanged. */
static void check_responses(api_kind kind, const char *text) {
    api_meta m = {.kind = kind, .id = "x-1", .model = "m", .created = 1};
    size_t len = strlen(text);
    char *reply = api_response_json(&m, text, len, "stop", (api_usage){1, 2, 0});
    REQUIRE(reply);
    json_t *v = json_loads(reply, 0, NULL);
    json_t *choice = json_array_get(json_object_get(v, "choices"), 0);
    json_t *got = kind == API_CHAT ? json_object_get(json_object_get(choice, "message"), "content")
                                   : json_object_get(choice, "text");
    REQUIRE(json_string_length(got) == len && memcmp(json_string_value(got), text, len) == 0);
    json_decref(v);
    free(reply);
    char *delta = api_stream_delta(&m, text, len);
    REQUIRE(delta && strncmp(delta, "data: ", 6) == 0);
    v = json_loads(delta + 6, JSON_DISABLE_EOF_CHECK, NULL);
    REQUIRE(v);
    json_decref(v);
    free(delta);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    api_kind kind = data[0] == 'p' ? API_COMPLETION : API_CHAT;
    api_request r;
    api_error e = {0};
    if (api_request_parse(kind, (const char *)data + 1, size - 1, &defaults, &r, &e) != 0) {
        check_refusal(&e);
        return 0;
    }
    check_request(&r);
    check_responses(kind, kind == API_CHAT ? r.messages[r.n_messages - 1].content : r.prompt);
    api_request_free(&r);
    return 0;
}
