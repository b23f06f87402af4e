/*
 * api.c — see api.h.
 *
 * Field readers return 1 when the field holds a valid value (stored),
 * 0 when it is absent or null (left alone), -1 with *err filled when it is
 * of the wrong type or out of range.
 */
#include "server/api.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenAI allows 4 stop strings; a few more cost nothing. */
#define MAX_STOPS 16

/* The length of the valid UTF-8 sequence at s, 0 when there is none; as
 * strict as jansson (no overlong forms, surrogates or code points past
 * U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s) {
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (s[0] < 0x80) return 1;
    size_t n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (n == 0 || s[0] > 0xF4) return 0;
    uint32_t cp = s[0] & (0x3Fu >> (n - 1));
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    return cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : n;
}

int api_fail(api_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* Messages quote the request (jansson's "near '...'", a role), and
     * truncation can cut a character: keep them valid UTF-8, as JSON needs. */
    for (unsigned char *p = (unsigned char *)e->message; *p;) {
        size_t n = utf8_sequence(p);
        if (n == 0)
            *p++ = '?';
        else
            p += n;
    }
    return -1;
}

static int out_of_memory(api_error *e) { return api_fail(e, 500, NULL, NULL, "out of memory"); }

/* ------------------------------------------------------------ field readers */

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* The value of key, NULL when absent or null. */
static json_t *field(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int wrong_type(api_error *e, const char *name, const char *want, const json_t *v) {
    return api_fail(e, 400, "invalid_type", name, "'%s' must be %s, not %s", name, want, type_name(v));
}

static int get_number(const json_t *obj, const char *name, double min, double max, float *out, api_error *e) {
    json_t *v = field(obj, name);
    if (!v) return 0;
    if (!json_is_number(v)) return wrong_type(e, name, "a number", v);
    double d = json_number_value(v);
    if (!(d >= min && d <= max))
        return api_fail(e, 400, "invalid_value", name, "'%s' must be between %g and %g, not %g", name, min, max, d);
    *out = (float)d;
    return 1;
}

/* Integers may come as 3 or 3.0 (some clients write every number as a
 * double); 3.5 is refused. */
static int get_integer(const json_t *obj, const char *name, long long min, long long max, long long *out,
                       api_error *e) {
    json_t *v = field(obj, name);
    if (!v) return 0;
    long long n;
    if (json_is_integer(v)) {
        n = json_integer_value(v);
    } else {
        double d = json_is_real(v) ? json_real_value(v) : NAN;
        if (!(d == floor(d) && fabs(d) < 9e18)) return wrong_type(e, name, "an integer", v);
        n = (long long)d;
    }
    if (n < min || n > max)
        return api_fail(e, 400, "invalid_value", name, "'%s' must be between %lld and %lld, not %lld", name, min, max,
                        n);
    *out = n;
    return 1;
}

static int get_bool(const json_t *obj, const char *key, const char *name, bool *out, api_error *e) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return wrong_type(e, name, "a boolean", v);
    *out = json_is_true(v);
    return 1;
}

/* The parser refuses \u0000 (no JSON_ALLOW_NUL), so a string is a C string. */
static char *copy_string(const json_t *v) { return strndup(json_string_value(v), json_string_length(v)); }

static int get_string(const json_t *obj, const char *name, char **out, api_error *e) {
    json_t *v = field(obj, name);
    if (!v) return 0;
    if (!json_is_string(v)) return wrong_type(e, name, "a string", v);
    return (*out = copy_string(v)) ? 1 : out_of_memory(e);
}

/* ------------------------------------------------------------ messages and prompt */

/* Roles as the chat templates know them; OpenAI's "developer" is the newer
 * name of "system". */
static const char *chat_role(const char *role) {
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) return "system";
    if (strcmp(role, "user") == 0) return "user";
    if (strcmp(role, "assistant") == 0) return "assistant";
    return NULL;
}

/* A list of content parts: only text parts, joined by newlines (as vLLM
 * does). */
static int join_parts(const json_t *parts, const char *name, char **out, api_error *e) {
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(parts, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            return api_fail(e, 400, "unsupported_value", name,
                            "'%s[%zu]' is not a text part: only {\"type\": \"text\", \"text\": ...} is supported", name,
                            i);
        if (!json_is_string(text))
            return api_fail(e, 400, "invalid_type", name, "'%s[%zu].text' must be a string", name, i);
        total += json_string_length(text) + 1;
    }
    char *s = malloc(total), *p = s;
    if (!s) return out_of_memory(e);
    json_array_foreach(parts, i, part) {
        json_t *text = json_object_get(part, "text");
        if (i) *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *p = '\0';
    *out = s;
    return 1;
}

/* An assistant turn may have no content (in OpenAI's API: it made tool calls). */
static int message_content(const json_t *content, bool assistant, const char *name, char **out, api_error *e) {
    if (!content || json_is_null(content)) {
        if (!assistant) return api_fail(e, 400, "missing_required_parameter", name, "'%s' is required", name);
        return (*out = strdup("")) ? 1 : out_of_memory(e);
    }
    if (json_is_string(content)) return (*out = copy_string(content)) ? 1 : out_of_memory(e);
    if (json_is_array(content)) return join_parts(content, name, out, e);
    return wrong_type(e, name, "a string or an array of text parts", content);
}

static int parse_message(const json_t *m, size_t i, moe_chat_message *out, api_error *e) {
    char name[64];
    snprintf(name, sizeof name, "messages[%zu]", i);
    if (!json_is_object(m)) return wrong_type(e, name, "an object", m);
    json_t *role = json_object_get(m, "role");
    snprintf(name, sizeof name, "messages[%zu].role", i);
    if (!role) return api_fail(e, 400, "missing_required_parameter", name, "'%s' is required", name);
    if (!json_is_string(role)) return wrong_type(e, name, "a string", role);
    const char *known = chat_role(json_string_value(role));
    if (!known)
        return api_fail(e, 400, "unsupported_value", name,
                        "'%s' is '%.40s': the roles supported are system, developer, user and assistant", name,
                        json_string_value(role));
    snprintf(name, sizeof name, "messages[%zu].content", i);
    char *content = NULL;
    bool assistant = strcmp(json_string_value(role), "assistant") == 0;
    if (message_content(json_object_get(m, "content"), assistant, name, &content, e) < 0) return -1;
    *out = (moe_chat_message){known, content};
    return 0;
}

static int parse_messages(const json_t *root, api_request *r, api_error *e) {
    json_t *v = field(root, "messages");
    if (!v) return api_fail(e, 400, "missing_required_parameter", "messages", "'messages' is required");
    if (!json_is_array(v)) return wrong_type(e, "messages", "an array", v);
    size_t n = json_array_size(v);
    if (n == 0) return api_fail(e, 400, "invalid_value", "messages", "'messages' is empty: a chat needs a message");
    if (!(r->messages = calloc(n, sizeof *r->messages))) return out_of_memory(e);
    for (; r->n_messages < n; r->n_messages++)
        if (parse_message(json_array_get(v, r->n_messages), r->n_messages, &r->messages[r->n_messages], e) < 0)
            return -1;
    return 0;
}

static int parse_prompt(const json_t *root, api_request *r, api_error *e) {
    json_t *v = field(root, "prompt");
    if (!v) return api_fail(e, 400, "missing_required_parameter", "prompt", "'prompt' is required");
    if (json_is_array(v)) {
        if (json_array_size(v) != 1 || !json_is_string(json_array_get(v, 0)))
            return api_fail(e, 400, "unsupported_value", "prompt",
                            "'prompt' must be a string or an array of one string: batches of prompts and token "
                            "arrays are not supported");
        v = json_array_get(v, 0);
    }
    if (!json_is_string(v)) return wrong_type(e, "prompt", "a string", v);
    return (r->prompt = copy_string(v)) ? 0 : out_of_memory(e);
}

/* ------------------------------------------------------------ the other fields */

static int parse_sampling(const json_t *root, api_request *r, api_error *e) {
    moe_sampling *s = &r->sampling;
    if (get_number(root, "temperature", 0, 2, &s->temperature, e) < 0 ||
        get_number(root, "top_p", 0, 1, &s->top_p, e) < 0 || get_number(root, "min_p", 0, 1, &s->min_p, e) < 0 ||
        get_number(root, "presence_penalty", -2, 2, &s->presence_penalty, e) < 0 ||
        get_number(root, "frequency_penalty", -2, 2, &s->frequency_penalty, e) < 0)
        return -1;
    /* OpenAI accepts top_p 0; the sampler wants p > 0, and the smallest p
     * keeps only the most likely token, which is what 0 asks for. */
    if (s->top_p < 1e-6f) s->top_p = 1e-6f;
    long long v;
    int got = get_integer(root, "top_k", 0, INT_MAX, &v, e);
    if (got < 0) return -1;
    if (got) s->top_k = (int)v;
    if ((got = get_integer(root, "seed", LLONG_MIN, LLONG_MAX, &v, e)) < 0) return -1;
    if (got) s->seed = (uint64_t)v, r->has_seed = true;
    return 0;
}

static int parse_limits(const json_t *root, api_request *r, api_error *e) {
    long long v;
    int got;
    /* max_completion_tokens is the newer name; it wins when both are given. */
    if ((got = get_integer(root, "max_tokens", 1, INT_MAX, &v, e)) < 0) return -1;
    if (got) r->max_tokens = (int)v;
    if ((got = get_integer(root, "max_completion_tokens", 1, INT_MAX, &v, e)) < 0) return -1;
    if (got) r->max_tokens = (int)v;
    if ((got = get_integer(root, "n", LLONG_MIN, LLONG_MAX, &v, e)) < 0) return -1;
    if (got && v != 1)
        return api_fail(e, 400, "unsupported_value", "n", "'n' must be 1 (one choice per request), not %lld", v);
    return 0;
}

static int add_stop(api_request *r, const json_t *s, const char *name, api_error *e) {
    if (!json_is_string(s)) return wrong_type(e, name, "a string", s);
    if (json_string_length(s) == 0) return api_fail(e, 400, "invalid_value", name, "'%s' is empty", name);
    return (r->stop[r->n_stop++] = copy_string(s)) ? 0 : out_of_memory(e);
}

static int parse_stop(const json_t *root, api_request *r, api_error *e) {
    json_t *v = field(root, "stop");
    if (!v) return 0;
    if (!json_is_string(v) && !json_is_array(v)) return wrong_type(e, "stop", "a string or an array of strings", v);
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > MAX_STOPS)
        return api_fail(e, 400, "invalid_value", "stop", "'stop' has %zu strings; at most %d are allowed", n,
                        MAX_STOPS);
    if (n == 0) return 0;
    if (!(r->stop = calloc(n, sizeof *r->stop))) return out_of_memory(e);
    if (json_is_string(v)) return add_stop(r, v, "stop", e);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "stop[%zu]", i);
        if (add_stop(r, json_array_get(v, i), name, e) < 0) return -1;
    }
    return 0;
}

static int parse_stream(const json_t *root, api_request *r, api_error *e) {
    if (get_bool(root, "stream", "stream", &r->stream, e) < 0) return -1;
    json_t *o = field(root, "stream_options");
    if (!o) return 0;
    if (!json_is_object(o)) return wrong_type(e, "stream_options", "an object", o);
    if (!r->stream)
        return api_fail(e, 400, "invalid_value", "stream_options",
                        "'stream_options' is only allowed when 'stream' is true");
    return get_bool(o, "include_usage", "stream_options.include_usage", &r->include_usage, e) < 0 ? -1 : 0;
}

static int parse_fields(const json_t *root, api_request *r, api_error *e) {
    if (get_string(root, "model", &r->model, e) < 0) return -1;
    if ((r->kind == API_CHAT ? parse_messages(root, r, e) : parse_prompt(root, r, e)) < 0) return -1;
    if (parse_sampling(root, r, e) < 0 || parse_limits(root, r, e) < 0 || parse_stop(root, r, e) < 0) return -1;
    return parse_stream(root, r, e);
}

int api_request_parse(api_kind kind, const char *body, size_t len, const moe_sampling *defaults, api_request *out,
                      api_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->sampling = *defaults;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root)
        return api_fail(err, 400, "invalid_json", NULL, "the body is not valid JSON: %s (line %d, column %d)",
                        jerr.text, jerr.line, jerr.column);
    int rc = json_is_object(root)
                 ? parse_fields(root, out, err)
                 : api_fail(err, 400, "invalid_type", NULL, "the body must be a JSON object, not %s", type_name(root));
    json_decref(root);
    if (rc < 0) api_request_free(out);
    return rc < 0 ? -1 : 0;
}

void api_request_free(api_request *r) {
    free(r->model);
    for (size_t i = 0; i < r->n_messages; i++)
        free((char *)r->messages[i].content);
    free(r->messages);
    free(r->prompt);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ responses */

/* The text of v, compact, and v released. */
static char *dump(json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

/* "data: <v>\n\n", and v released. */
static char *event(json_t *v) {
    char *json = dump(v), *s = NULL;
    if (json && asprintf(&s, "data: %s\n\n", json) < 0) s = NULL;
    free(json);
    return s;
}

static json_t *error_object(const api_error *e) {
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type", e->type, "param",
                     e->param[0] ? e->param : NULL, "code", e->code);
}

char *api_error_json(const api_error *e) { return dump(error_object(e)); }

static json_t *usage_object(api_usage u) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", u.prompt_tokens, "completion_tokens",
                     u.completion_tokens, "total_tokens", u.prompt_tokens + u.completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u.cached_tokens);
}

/* [choice], or NULL when choice is (out of memory). */
static json_t *one(json_t *choice) { return choice ? json_pack("[o]", choice) : NULL; }

/* id, object, created, model, choices, and usage when given; choices and
 * usage are stolen. NULL when either part could not be made. */
static json_t *envelope(const api_meta *m, const char *object, json_t *choices, json_t *usage) {
    json_t *v = choices ? json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", m->id, "object", object, "created",
                                    (json_int_t)m->created, "model", m->model, "choices", choices)
                        : NULL;
    if (usage && v && json_object_set_new(v, "usage", usage) != 0)
        json_decref(v), v = NULL;
    else if (usage && !v)
        json_decref(usage);
    return v;
}

char *api_response_json(const api_meta *m, const char *text, size_t len, const char *finish, api_usage usage) {
    json_t *content = json_stringn(text, len), *choice;
    if (!content) return NULL;
    if (m->kind == API_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content",
                           content, "logprobs", "finish_reason", finish);
    else
        choice = json_pack("{s:o, s:i, s:n, s:s}", "text", content, "index", 0, "logprobs", "finish_reason", finish);
    const char *object = m->kind == API_CHAT ? "chat.completion" : "text_completion";
    return dump(choice ? envelope(m, object, one(choice), usage_object(usage)) : NULL);
}

static const char *chunk_object(const api_meta *m) {
    return m->kind == API_CHAT ? "chat.completion.chunk" : "text_completion";
}

/* A chunk's one choice: the chat's delta (stolen) or the completion's text. */
static json_t *chunk_choice(const api_meta *m, json_t *delta, json_t *text, const char *finish) {
    if (m->kind == API_CHAT)
        return json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta, "logprobs", "finish_reason", finish);
    return json_pack("{s:o, s:i, s:n, s:s?}", "text", text, "index", 0, "logprobs", "finish_reason", finish);
}

char *api_stream_start(const api_meta *m) {
    if (m->kind != API_CHAT) return strdup("");
    json_t *delta = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    return event(delta ? envelope(m, chunk_object(m), one(chunk_choice(m, delta, NULL, NULL)), NULL) : NULL);
}

char *api_stream_delta(const api_meta *m, const char *text, size_t len) {
    json_t *content = json_stringn(text, len);
    if (!content) return NULL;
    json_t *choice = m->kind == API_CHAT ? chunk_choice(m, json_pack("{s:o}", "content", content), NULL, NULL)
                                         : chunk_choice(m, NULL, content, NULL);
    return event(envelope(m, chunk_object(m), one(choice), NULL));
}

char *api_stream_end(const api_meta *m, const char *finish, const api_usage *usage) {
    json_t *choice = m->kind == API_CHAT ? chunk_choice(m, json_object(), NULL, finish)
                                         : chunk_choice(m, NULL, json_string(""), finish);
    char *last = event(envelope(m, chunk_object(m), one(choice), NULL));
    char *tally = usage ? event(envelope(m, chunk_object(m), json_array(), usage_object(*usage))) : strdup("");
    char *s = NULL;
    if (last && tally && asprintf(&s, "%s%sdata: [DONE]\n\n", last, tally) < 0) s = NULL;
    free(last);
    free(tally);
    return s;
}

char *api_stream_error(const api_error *e) {
    char *ev = event(error_object(e)), *s = NULL;
    if (ev && asprintf(&s, "%sdata: [DONE]\n\n", ev) < 0) s = NULL;
    free(ev);
    return s;
}

char *api_models_json(const char *model, long long created) {
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model, "object", "model",
                          "created", (json_int_t)created, "owned_by", "moe.c"));
}
