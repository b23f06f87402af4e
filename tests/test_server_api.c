/*
 * test_server_api.c — the server's request layer (src/server/api.c):
 * OpenAI request bodies to validated requests, and the response shapes.
 */
#include <jansson.h>
#include <stdlib.h>

#include "server/api.h"
#include "test.h"

static const moe_sampling defaults = {.temperature = 0.8f,
                                      .top_k = 40,
                                      .top_p = 0.95f,
                                      .min_p = 0.05f,
                                      .repetition_penalty = 1,
                                      .penalty_last_n = 64,
                                      .seed = 7};

static int parse(api_kind kind, const char *body, api_request *r, api_error *e) {
    memset(e, 0, sizeof *e);
    return api_request_parse(kind, body, strlen(body), &defaults, r, e);
}

/* The body must be refused with a 400 naming param (NULL: none) and a
 * message containing `words`. */
static void check_refused(api_kind kind, const char *body, const char *param, const char *words) {
    api_request r;
    api_error e;
    CHECKF(parse(kind, body, &r, &e) < 0, "accepted: %s", body);
    CHECKF(e.status == 400, "%d for %s", e.status, body);
    CHECKF(strcmp(e.param, param ? param : "") == 0, "param '%s' for %s", e.param, body);
    CHECKF(strstr(e.message, words) != NULL, "message '%s' for %s", e.message, body);
}

static void test_chat_request_fields(void) {
    api_request r;
    api_error e;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
                       "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null}],\"max_tokens\":5,"
                       "\"max_completion_tokens\":9,\"temperature\":0,\"top_p\":0,\"top_k\":3.0,\"seed\":-1,"
                       "\"stop\":\"END\",\"n\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"logit_bias\":{\"1\":2}}";
    CHECK(parse(API_CHAT, body, &r, &e) == 0);
    CHECK(strcmp(r.model, "m") == 0);
    CHECK(r.n_messages == 3);
    CHECK(strcmp(r.messages[0].role, "system") == 0 && strcmp(r.messages[0].content, "Be brief.") == 0);
    CHECK(strcmp(r.messages[1].content, "a\nb") == 0);
    CHECK(strcmp(r.messages[2].role, "assistant") == 0 && strcmp(r.messages[2].content, "") == 0);
    CHECK(r.max_tokens == 9);
    CHECK(r.sampling.temperature == 0 && r.sampling.top_p > 0 && r.sampling.top_k == 3);
    CHECK(r.has_seed && r.sampling.seed == UINT64_MAX);
    CHECK(r.n_stop == 1 && strcmp(r.stop[0], "END") == 0);
    CHECK(r.stream && r.include_usage);
    api_request_free(&r);
}

static void test_defaults_and_nulls(void) {
    api_request r;
    api_error e;
    CHECK(parse(API_COMPLETION, "{\"prompt\":[\"hi\"],\"temperature\":null,\"stop\":null,\"seed\":null}", &r, &e) == 0);
    CHECK(strcmp(r.prompt, "hi") == 0);
    CHECK(r.sampling.temperature == defaults.temperature && r.sampling.top_k == defaults.top_k);
    CHECK(!r.has_seed && r.max_tokens == 0 && r.n_stop == 0 && !r.stream);
    CHECK(r.model == NULL);
    api_request_free(&r);
}

static void test_refusals(void) {
    check_refused(API_CHAT, "{\"messages\": [", NULL, "not valid JSON");
    check_refused(API_CHAT, "", NULL, "not valid JSON");
    check_refused(API_CHAT, "[]", NULL, "must be a JSON object");
    check_refused(API_CHAT, "{}", "messages", "required");
    check_refused(API_CHAT, "{\"messages\":[]}", "messages", "empty");
    check_refused(API_CHAT, "{\"messages\":{}}", "messages", "must be an array");
    check_refused(API_CHAT, "{\"messages\":[1]}", "messages[0]", "must be an object");
    check_refused(API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "required");
    check_refused(API_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role", "tool");
    check_refused(API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required");
    check_refused(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                  "messages[0].content", "not a text part");
    const char *ok = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char body[256];
    struct {
        const char *field, *param, *words;
    } cases[] = {
        {"\"n\":2", "n", "must be 1"},
        {"\"temperature\":\"hot\"", "temperature", "must be a number, not a string"},
        {"\"temperature\":2.5", "temperature", "between 0 and 2"},
        {"\"top_p\":-0.1", "top_p", "between"},
        {"\"min_p\":true", "min_p", "must be a number"},
        {"\"presence_penalty\":3", "presence_penalty", "between -2 and 2"},
        {"\"top_k\":-1", "top_k", "between"},
        {"\"max_tokens\":0", "max_tokens", "between 1"},
        {"\"max_tokens\":2.5", "max_tokens", "must be an integer"},
        {"\"max_completion_tokens\":\"9\"", "max_completion_tokens", "must be an integer"},
        {"\"seed\":1e300", "seed", "must be an integer"},
        {"\"stop\":5", "stop", "string or an array"},
        {"\"stop\":[\"a\",\"\"]", "stop[1]", "empty"},
        {"\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\","
         "\"16\",\"17\"]",
         "stop", "at most 16"},
        {"\"stream\":\"yes\"", "stream", "must be a boolean"},
        {"\"stream_options\":{\"include_usage\":true}", "stream_options", "only allowed when 'stream' is true"},
        {"\"stream\":true,\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage", "boolean"},
        {"\"model\":5", "model", "must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "{%s,%s}", ok, cases[i].field);
        check_refused(API_CHAT, body, cases[i].param, cases[i].words);
    }
    check_refused(API_COMPLETION, "{}", "prompt", "required");
    check_refused(API_COMPLETION, "{\"prompt\":[1,2]}", "prompt", "token arrays are not supported");
    check_refused(API_COMPLETION, "{\"prompt\":5}", "prompt", "must be a string");
}

/* The text must be JSON with error.message, .type, .param, .code. */
static void test_error_json(void) {
    api_error e;
    api_fail(&e, 400, "invalid_value", "stop[1]", "'%s' is empty", "stop[1]");
    char *text = api_error_json(&e);
    json_t *v = json_loads(text, 0, NULL), *err = json_object_get(v, "error");
    CHECK(strcmp(json_string_value(json_object_get(err, "message")), "'stop[1]' is empty") == 0);
    CHECK(strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error") == 0);
    CHECK(strcmp(json_string_value(json_object_get(err, "param")), "stop[1]") == 0);
    CHECK(strcmp(json_string_value(json_object_get(err, "code")), "invalid_value") == 0);
    json_decref(v);
    free(text);
    api_fail(&e, 503, NULL, NULL, "busy");
    text = api_error_json(&e);
    v = json_loads(text, 0, NULL), err = json_object_get(v, "error");
    CHECK(strcmp(json_string_value(json_object_get(err, "type")), "server_error") == 0);
    CHECK(json_is_null(json_object_get(err, "param")) && json_is_null(json_object_get(err, "code")));
    json_decref(v);
    free(text);
}

/* Messages quote the body (jansson's "near '...'", a role cut to 40
 * bytes): whatever the bytes, the error must still encode as JSON. */
static void test_error_messages_stay_utf8(void) {
    const char *bodies[] = {
        "{\"a\": x\xc3",
        "{\"a\": \xff\xfe}",
        "{\"messages\": [tru\xe2\x82",
        "{\"messages\":[{\"role\":\"a\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
        "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9x\",\"content\":\"x\"}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        api_request r;
        api_error e;
        CHECK(parse(API_CHAT, bodies[i], &r, &e) < 0);
        char *text = api_error_json(&e);
        CHECKF(text != NULL, "no JSON for the error '%s'", e.message);
        free(text);
    }
}

static void test_response_shapes(void) {
    api_meta m = {.kind = API_CHAT, .id = "chatcmpl-x", .model = "tiny", .created = 42};
    char *text = api_response_json(&m, "hi\0there", 8, "length", (api_usage){3, 4, 1});
    json_t *v = json_loads(text, JSON_ALLOW_NUL, NULL);
    CHECK(strcmp(json_string_value(json_object_get(v, "object")), "chat.completion") == 0);
    json_t *choice = json_array_get(json_object_get(v, "choices"), 0);
    json_t *content = json_object_get(json_object_get(choice, "message"), "content");
    CHECK(json_string_length(content) == 8 && memcmp(json_string_value(content), "hi\0there", 8) == 0);
    CHECK(strcmp(json_string_value(json_object_get(choice, "finish_reason")), "length") == 0);
    json_t *usage = json_object_get(v, "usage");
    CHECK(json_integer_value(json_object_get(usage, "total_tokens")) == 7);
    CHECK(json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens")) == 1);
    json_decref(v);
    free(text);
    CHECK(api_response_json(&m, "\xff", 1, "stop", (api_usage){0}) == NULL); /* not UTF-8 */
}

static void test_stream_events(void) {
    api_meta chat = {.kind = API_CHAT, .id = "chatcmpl-x", .model = "tiny", .created = 42};
    api_meta cmpl = {.kind = API_COMPLETION, .id = "cmpl-x", .model = "tiny", .created = 42};
    char *start = api_stream_start(&chat), *delta = api_stream_delta(&cmpl, "ab", 2);
    CHECK(strncmp(start, "data: {", 7) == 0 && strstr(start, "\"role\":\"assistant\"") && strstr(start, "\n\n"));
    CHECK(strstr(delta, "\"text\":\"ab\"") && strstr(delta, "\"object\":\"text_completion\""));
    char *empty = api_stream_start(&cmpl);
    CHECK(strcmp(empty, "") == 0);
    api_usage u = {5, 6, 0};
    char *end = api_stream_end(&chat, "stop", &u);
    CHECK(strstr(end, "\"finish_reason\":\"stop\"") && strstr(end, "\"choices\":[],\"usage\""));
    size_t len = strlen(end);
    CHECK(len > 14 && strcmp(end + len - 14, "data: [DONE]\n\n") == 0);
    char *bare = api_stream_end(&chat, "length", NULL);
    CHECK(!strstr(bare, "usage"));
    free(start), free(delta), free(empty), free(end), free(bare);
}

int main(void) {
    RUN(test_chat_request_fields);
    RUN(test_defaults_and_nulls);
    RUN(test_refusals);
    RUN(test_error_json);
    RUN(test_error_messages_stay_utf8);
    RUN(test_response_shapes);
    RUN(test_stream_events);
    return test_summary();
}
