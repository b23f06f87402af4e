/*
 * chat_template.c — the chat template families of chat_template.h.
 *
 * Each family is a short renderer that appends to a growing string. The
 * comments quote the official Jinja where the C follows it closely; the
 * expected strings in tests/test_chat_template.c were worked out from the
 * same templates.
 */
#include "tokenizer/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define VALID_NAMES "chatml, qwen3, llama3, mistral"

/* ---------------------------------------------------------------- text */

/* A growing string. An allocation failure is remembered and reported once
 * at the end, so the renderers need not check every append. */
typedef struct text {
    char *data;
    size_t len, cap;
    bool failed;
} text;

static void text_append_n(text *t, const char *s, size_t n) {
    if (t->failed) return;
    if (n >= SIZE_MAX / 2 - t->len) {
        t->failed = true;
        return;
    }
    const size_t need = t->len + n + 1;
    if (need > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < need) cap *= 2;
        char *grown = realloc(t->data, cap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->data = grown;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void text_append(text *t, const char *s) {
    text_append_n(t, s, strlen(s));
}

/* ---------------------------------------------------------------- names */

static const char *const chatml_stops[] = {"<|im_end|>", NULL};
/* <|eom_id|> ends a Llama 3.1 turn that waits for a tool's answer. */
static const char *const llama3_stops[] = {"<|eot_id|>", "<|eom_id|>", NULL};
static const char *const mistral_stops[] = {"</s>", NULL};
static const char *const no_stops[] = {NULL};

static const struct family {
    const char *name;
    const char *const *stops;
} families[] = {
    [CHAT_TEMPLATE_NONE] = {"none", no_stops},
    [CHAT_TEMPLATE_CHATML] = {"chatml", chatml_stops},
    [CHAT_TEMPLATE_QWEN3] = {"qwen3", chatml_stops},
    [CHAT_TEMPLATE_LLAMA3] = {"llama3", llama3_stops},
    [CHAT_TEMPLATE_MISTRAL] = {"mistral", mistral_stops},
};

enum { N_FAMILIES = sizeof families / sizeof *families };

static bool family_known(chat_template_id id) {
    return id > CHAT_TEMPLATE_NONE && (size_t)id < N_FAMILIES;
}

const char *chat_template_name(chat_template_id id) {
    return family_known(id) ? families[id].name : families[CHAT_TEMPLATE_NONE].name;
}

const char *const *chat_template_stops(chat_template_id id) {
    return family_known(id) ? families[id].stops : no_stops;
}

chat_template_id chat_template_by_name(const char *name, moe_error *err) {
    for (size_t id = CHAT_TEMPLATE_NONE + 1; name && id < N_FAMILIES; id++)
        if (strcmp(name, families[id].name) == 0) return (chat_template_id)id;
    /* The name is cut short so that a long one cannot push the list out of the message. */
    moe_error_set(err, MOE_ERR_INVALID_ARG, "unknown chat template \"%.64s\"; the known ones are " VALID_NAMES,
                  name ? name : "(null)");
    return CHAT_TEMPLATE_NONE;
}

chat_template_id chat_template_detect(const char *source, moe_error *err) {
    if (!source) {
        moe_error_set(err, MOE_ERR_NOT_FOUND,
                      "the model has no chat template (tokenizer.chat_template); name one of " VALID_NAMES);
        return CHAT_TEMPLATE_NONE;
    }
    if (strstr(source, "<|im_start|>")) return strstr(source, "</think>") ? CHAT_TEMPLATE_QWEN3 : CHAT_TEMPLATE_CHATML;
    if (strstr(source, "<|start_header_id|>")) return CHAT_TEMPLATE_LLAMA3;
    if (strstr(source, "[INST]")) return CHAT_TEMPLATE_MISTRAL;
    moe_error_set(err, MOE_ERR_UNSUPPORTED,
                  "chat template not recognised: it has none of the markers <|im_start|> (ChatML), "
                  "<|start_header_id|> (Llama 3) and [INST] (Mistral); name one of " VALID_NAMES);
    return CHAT_TEMPLATE_NONE;
}

static const char *const role_names[] = {
    [CHAT_ROLE_SYSTEM] = "system",
    [CHAT_ROLE_USER] = "user",
    [CHAT_ROLE_ASSISTANT] = "assistant",
};

enum { N_ROLES = sizeof role_names / sizeof *role_names };

const char *chat_role_name(chat_role role) {
    return (unsigned)role < N_ROLES ? role_names[role] : "unknown";
}

moe_status chat_role_parse(const char *name, chat_role *role, moe_error *err) {
    for (unsigned r = 0; name && r < N_ROLES; r++)
        if (strcmp(name, role_names[r]) == 0) {
            *role = (chat_role)r;
            return MOE_OK;
        }
    return moe_error_set(err, MOE_ERR_INVALID_ARG, "unknown chat role \"%s\"; expected system, user or assistant",
                         name ? name : "(null)");
}

/* ---------------------------------------------------------------- chatml */

static void chatml_turn(text *t, chat_role role, const char *content) {
    text_append(t, "<|im_start|>");
    text_append(t, chat_role_name(role));
    text_append(t, "\n");
    text_append(t, content);
    text_append(t, "<|im_end|>\n");
}

/* {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' +
 * message['content'] + '<|im_end|>' + '\n'}}{% endfor %} */
static moe_status render_chatml(text *t, const chat_message *msgs, size_t n, moe_error *err) {
    for (size_t i = 0; i < n; i++) chatml_turn(t, msgs[i].role, msgs[i].content);
    return MOE_OK;
}

/* ---------------------------------------------------------------- qwen3 */

typedef struct span {
    const char *start;
    size_t len;
} span;

static span span_of(const char *s) {
    return (span){s, strlen(s)};
}

static const char *span_find_last(span s, const char *needle) {
    const size_t n = strlen(needle);
    for (size_t i = s.len; i >= n; i--)
        if (memcmp(s.start + i - n, needle, n) == 0) return s.start + i - n;
    return NULL;
}

static span strip_leading_newlines(span s) {
    while (s.len > 0 && s.start[0] == '\n') s.start++, s.len--;
    return s;
}

static span strip_trailing_newlines(span s) {
    while (s.len > 0 && s.start[s.len - 1] == '\n') s.len--;
    return s;
}

/* Qwen3's split of an assistant message that contains </think>:
 *   content   = content.split('</think>')[-1].lstrip('\n')
 *   reasoning = content.split('</think>')[0].rstrip('\n')
 *                      .split('<think>')[-1].lstrip('\n')
 * Without </think> the reasoning is empty and the content stays whole. */
static void qwen3_split(const char *message, span *reasoning, span *answer) {
    const span all = span_of(message);
    const char *first_close = strstr(message, "</think>");
    if (!first_close) {
        *reasoning = (span){message, 0};
        *answer = all;
        return;
    }
    const char *last_close = span_find_last(all, "</think>");
    const char *after = last_close + strlen("</think>");
    *answer = strip_leading_newlines((span){after, (size_t)(all.start + all.len - after)});
    span before = strip_trailing_newlines((span){message, (size_t)(first_close - message)});
    const char *open = span_find_last(before, "<think>");
    if (open) {
        const char *inside = open + strlen("<think>");
        before = (span){inside, (size_t)(before.start + before.len - inside)};
    }
    *reasoning = strip_leading_newlines(before);
}

static bool is_tool_response(const char *content) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    const size_t len = strlen(content);
    return strncmp(content, open, sizeof open - 1) == 0 && len >= sizeof close - 1 &&
           strcmp(content + len - (sizeof close - 1), close) == 0;
}

/* The index of the last user message that is not a wrapped tool response;
 * n - 1 when there is none (the template's initial value). */
static size_t qwen3_last_query(const chat_message *msgs, size_t n) {
    for (size_t i = n; i-- > 0;)
        if (msgs[i].role == CHAT_ROLE_USER && !is_tool_response(msgs[i].content)) return i;
    return n - 1;
}

/* {%- if loop.index0 > ns.last_query_index %}
 *     {%- if loop.last or (not loop.last and reasoning_content) %}
 *         '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n')
 *         + '\n</think>\n\n' + content.lstrip('\n')
 *     {%- else %} '<|im_start|>' + message.role + '\n' + content
 * {%- else %} '<|im_start|>' + message.role + '\n' + content
 * ... '<|im_end|>\n' */
static void qwen3_assistant_turn(text *t, const char *content, bool after_last_query, bool last) {
    span reasoning, answer;
    qwen3_split(content, &reasoning, &answer);
    text_append(t, "<|im_start|>assistant\n");
    if (after_last_query && (last || reasoning.len > 0)) {
        reasoning = strip_trailing_newlines(strip_leading_newlines(reasoning));
        text_append(t, "<think>\n");
        text_append_n(t, reasoning.start, reasoning.len);
        text_append(t, "\n</think>\n\n");
        answer = strip_leading_newlines(answer);
    }
    text_append_n(t, answer.start, answer.len);
    text_append(t, "<|im_end|>\n");
}

/* System and user messages are plain ChatML turns, wherever they are. */
static moe_status render_qwen3(text *t, const chat_message *msgs, size_t n, moe_error *err) {
    const size_t last_query = qwen3_last_query(msgs, n);
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == CHAT_ROLE_ASSISTANT)
            qwen3_assistant_turn(t, msgs[i].content, i > last_query, i == n - 1);
        else
            chatml_turn(t, msgs[i].role, msgs[i].content);
    }
    return MOE_OK;
}

/* ---------------------------------------------------------------- llama3 */

/* The length of the UTF-8 whitespace character at s[0..len), or 0. The set
 * is Python's str.isspace(), which Jinja's trim filter (str.strip) uses:
 * \t \n \v \f \r, \x1c-\x1f, space, U+0085, U+00A0, U+1680, U+2000-U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000. */
static size_t whitespace_at(const unsigned char *s, size_t len) {
    if (len >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x20))) return 1;
    if (len >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (len < 3) return 0;
    const uint32_t c = (uint32_t)s[0] << 16 | (uint32_t)s[1] << 8 | s[2];
    if (c == 0xE19A80 || (c >= 0xE28080 && c <= 0xE2808A) || c == 0xE280A8 || c == 0xE280A9 || c == 0xE280AF ||
        c == 0xE2819F || c == 0xE38080)
        return 3;
    return 0;
}

/* Whether a whitespace character ends exactly at s[len); its length. */
static size_t whitespace_before(const unsigned char *s, size_t len) {
    for (size_t width = 1; width <= 3 && width <= len; width++)
        if (whitespace_at(s + len - width, width) == width) return width;
    return 0;
}

static span trim(const char *content) {
    const unsigned char *s = (const unsigned char *)content;
    size_t len = strlen(content), width;
    while ((width = whitespace_at(s, len)) > 0) s += width, len -= width;
    while ((width = whitespace_before(s, len)) > 0) len -= width;
    return (span){(const char *)s, len};
}

/* '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' +
 * message['content'] | trim + '<|eot_id|>' */
static moe_status render_llama3(text *t, const chat_message *msgs, size_t n, moe_error *err) {
    for (size_t i = 0; i < n; i++) {
        const span content = trim(msgs[i].content);
        text_append(t, "<|start_header_id|>");
        text_append(t, chat_role_name(msgs[i].role));
        text_append(t, "<|end_header_id|>\n\n");
        text_append_n(t, content.start, content.len);
        text_append(t, "<|eot_id|>");
    }
    return MOE_OK;
}

/* ---------------------------------------------------------------- mistral */

/* {%- if message['role'] == 'user' %}
 *     {%- if loop.first and system_message is defined %}
 *         {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
 *     {%- else %} {{- ' [INST] ' + message['content'] + ' [/INST]' }}
 * {%- elif message['role'] == 'assistant' %} {{- ' ' + message['content'] + eos_token}} */
static moe_status render_mistral(text *t, const chat_message *msgs, size_t n, moe_error *err) {
    const bool has_system = msgs[0].role == CHAT_ROLE_SYSTEM;
    const size_t first = has_system ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        const chat_role expected = (i - first) % 2 == 0 ? CHAT_ROLE_USER : CHAT_ROLE_ASSISTANT;
        if (msgs[i].role != expected)
            return moe_error_set(err, MOE_ERR_INVALID_ARG,
                                 "mistral chat template: message %zu is %s where %s was expected; after an optional "
                                 "first system message the roles must alternate user, assistant, user, ...",
                                 i, chat_role_name(msgs[i].role), chat_role_name(expected));
        if (expected == CHAT_ROLE_ASSISTANT) {
            text_append(t, " ");
            text_append(t, msgs[i].content);
            text_append(t, "</s>");
            continue;
        }
        text_append(t, " [INST] ");
        if (i == first && has_system) {
            text_append(t, msgs[0].content);
            text_append(t, "\n\n");
        }
        text_append(t, msgs[i].content);
        text_append(t, " [/INST]");
    }
    return MOE_OK;
}

/* ---------------------------------------------------------------- render */

static moe_status check_messages(const chat_message *msgs, size_t n, moe_error *err) {
    if (n == 0 || !msgs) return moe_error_set(err, MOE_ERR_INVALID_ARG, "a conversation needs at least one message");
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)msgs[i].role >= N_ROLES)
            return moe_error_set(err, MOE_ERR_INVALID_ARG, "message %zu has an unknown role (%d)", i,
                                 (int)msgs[i].role);
        if (!msgs[i].content) return moe_error_set(err, MOE_ERR_INVALID_ARG, "message %zu has no content", i);
    }
    return MOE_OK;
}

static const char *generation_prompt(chat_template_id id) {
    switch (id) {
    case CHAT_TEMPLATE_CHATML:
    case CHAT_TEMPLATE_QWEN3: return "<|im_start|>assistant\n";
    case CHAT_TEMPLATE_LLAMA3: return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    default: return "";
    }
}

moe_status chat_template_render(chat_template_id id, const chat_message *msgs, size_t n, bool add_generation_prompt,
                                char **out, moe_error *err) {
    *out = NULL;
    if (!family_known(id))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "chat template %d is not one of " VALID_NAMES, (int)id);
    moe_status status = check_messages(msgs, n, err);
    if (status != MOE_OK) return status;
    text t = {0};
    text_append(&t, ""); /* an empty rendering is still a string */
    switch (id) {
    case CHAT_TEMPLATE_QWEN3: status = render_qwen3(&t, msgs, n, err); break;
    case CHAT_TEMPLATE_LLAMA3: status = render_llama3(&t, msgs, n, err); break;
    case CHAT_TEMPLATE_MISTRAL: status = render_mistral(&t, msgs, n, err); break;
    default: status = render_chatml(&t, msgs, n, err); break;
    }
    if (add_generation_prompt) text_append(&t, generation_prompt(id));
    if (status == MOE_OK && t.failed)
        status = moe_error_set(err, MOE_ERR_NOMEM, "out of memory rendering a %zu-message conversation", n);
    if (status != MOE_OK) {
        free(t.data);
        return status;
    }
    *out = t.data;
    return MOE_OK;
}

/* ---------------------------------------------------------------- default system */

moe_status chat_template_default_system(const char *source, char **out, moe_error *err) {
    static const char marker[] = "<|im_start|>system", end_marker[] = "<|im_end|>";
    *out = NULL;
    for (const char *at = source ? strstr(source, marker) : NULL; at; at = strstr(at + 1, marker)) {
        const char *start = at + sizeof marker - 1;
        /* The newline is an escape inside a Jinja string, or a real one in
         * template text outside the tags. */
        if (strncmp(start, "\\n", 2) == 0)
            start += 2;
        else if (*start == '\n')
            start += 1;
        else
            continue;
        const char *end = strstr(start, end_marker);
        if (!end) break;
        const size_t len = (size_t)(end - start);
        /* Quotes, braces, '+' or escapes mean an expression, not a literal. */
        if (len == 0 || strcspn(start, "'\"{}+\\") < len) continue;
        char *copy = malloc(len + 1);
        if (!copy) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory copying a default system message");
        memcpy(copy, start, len);
        copy[len] = '\0';
        *out = copy;
        return MOE_OK;
    }
    return MOE_OK;
}
