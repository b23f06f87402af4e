/*
 * fuzz_chat_template.c — libFuzzer target for the chat templates
 * (src/tokenizer/chat_template.c): the family of a Jinja template source,
 * its default system message, and conversations rendered in each family.
 *
 * The first byte picks the family: bits 0-2 are 0 for the one detected in
 * the source, 1-4 for chatml, qwen3, llama3 and mistral, 5 for the one the
 * source names (chat_template_by_name), 6 for CHAT_TEMPLATE_NONE and 7 for
 * an unknown id; bit 3 asks for the generation prompt; bit 4 passes no
 * source (NULL) instead of the first field. The rest is split at NUL into
 * fields: the template source, then a message a field, its first byte the
 * role ('s', 'u', 'a'; any other an unknown role) and the rest its content.
 * An empty field is a message without content (NULL).
 *
 * A rendering must be, byte for byte, what a model of the families written
 * here from chat_template.h renders (qwen3 from the Jinja quoted in
 * chat_template.c, in Python's terms; llama3's trim with Python's isspace
 * taken from utf8proc's Unicode data), and a refusal must come exactly
 * where the model refuses, with *out NULL and a message. So chatml holds
 * every content verbatim and in order, chatml and qwen3 end with the
 * generation prompt when asked, mistral never has one. The default system
 * message must be the first literal between "<|im_start|>system" and
 * "<|im_end|>" in the source, the detected family the one its markers
 * name, and the names, role names and stop lists consistent.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/chat_template.h"

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) __builtin_trap();                                                                                 \
    } while (0)

enum { FAMILY_DETECTED, FAMILY_BY_NAME = 5, FAMILY_NONE, FAMILY_UNKNOWN };

static const chat_template_id unknown_id = (chat_template_id)99;
static const chat_role unknown_role = (chat_role)(CHAT_ROLE_ASSISTANT + 1);
static const char *const role_names[] = {"system", "user", "assistant"};

static bool family_known(chat_template_id id) { return id >= CHAT_TEMPLATE_CHATML && id <= CHAT_TEMPLATE_MISTRAL; }

static bool role_known(chat_role role) {
    return role == CHAT_ROLE_SYSTEM || role == CHAT_ROLE_USER || role == CHAT_ROLE_ASSISTANT;
}

/* The messages that say what is valid must list every family name. */
static bool lists_the_names(const char *message) {
    return message[0] && strstr(message, "chatml") && strstr(message, "qwen3") && strstr(message, "llama3") &&
           strstr(message, "mistral");
}

/* --- spans of text, in Python's terms -------------------------------------- */

typedef struct span {
    const char *start;
    size_t len;
} span;

static span whole(const char *s) { return (span){s, strlen(s)}; }

/* s.split(sep)[0] */
static span before_first(span s, const char *sep) {
    const char *hit = memmem(s.start, s.len, sep, strlen(sep));
    return hit ? (span){s.start, (size_t)(hit - s.start)} : s;
}

/* s.split(sep)[-1] */
static span after_last(span s, const char *sep) {
    const size_t sep_len = strlen(sep);
    for (const char *hit; (hit = memmem(s.start, s.len, sep, sep_len)) != NULL;)
        s = (span){hit + sep_len, s.len - (size_t)(hit - s.start) - sep_len};
    return s;
}

static span lstrip_newlines(span s) {
    while (s.len && s.start[0] == '\n')
        s.start++, s.len--;
    return s;
}

static span rstrip_newlines(span s) {
    while (s.len && s.start[s.len - 1] == '\n')
        s.len--;
    return s;
}

/* The length of a character Python's str.isspace() counts (bidirectional
 * class WS, B or S, or category Zs) at s[0..len), 0 for any other or for
 * bytes that are not valid UTF-8. */
static size_t space_at(const char *s, size_t len) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &cp);
    if (n <= 0) return 0;
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    const bool space = p->bidi_class == UTF8PROC_BIDI_CLASS_WS || p->bidi_class == UTF8PROC_BIDI_CLASS_B ||
                       p->bidi_class == UTF8PROC_BIDI_CLASS_S || p->category == UTF8PROC_CATEGORY_ZS;
    return space ? (size_t)n : 0;
}

/* Jinja's trim (str.strip()); invalid UTF-8 stops it like any other
 * character that is not a space. */
static span trim(span s) {
    for (size_t n; s.len && (n = space_at(s.start, s.len)) > 0;)
        s.start += n, s.len -= n;
    for (bool more = true; more;) {
        more = false;
        for (size_t n = 1; n <= 4 && n <= s.len && !more; n++)
            if (space_at(s.start + s.len - n, n) == n) s.len -= n, more = true;
    }
    return s;
}

/* --- the model of the families ------------------------------------------- */

static char *append_span(char *at, span s) {
    memcpy(at, s.start, s.len);
    return at + s.len;
}

static char *append(char *at, const char *s) { return append_span(at, whole(s)); }

static char *chatml_turn(char *at, chat_role role, span content) {
    at = append(append(append(at, "<|im_start|>"), role_names[role]), "\n");
    return append(append_span(at, content), "<|im_end|>\n");
}

/* Python's content.startswith('<tool_response>') and content.endswith('</tool_response>') */
static bool wraps_tool_response(const char *content) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    const size_t len = strlen(content);
    return strncmp(content, open, strlen(open)) == 0 && len >= strlen(close) &&
           strcmp(content + len - strlen(close), close) == 0;
}

/* Qwen3's template: system and user messages as ChatML; an assistant
 * message split at </think> into reasoning and answer, the reasoning shown
 * after the last user message (the last that is not a wrapped tool
 * response) when the turn is the last one or has some. */
static char *qwen3(char *at, const chat_message *msgs, size_t n) {
    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;)
        if (msgs[i].role == CHAT_ROLE_USER && !wraps_tool_response(msgs[i].content)) {
            last_query = i;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        span content = whole(msgs[i].content), reasoning = {content.start, 0};
        if (msgs[i].role != CHAT_ROLE_ASSISTANT) {
            at = chatml_turn(at, msgs[i].role, content);
            continue;
        }
        if (strstr(msgs[i].content, "</think>")) {
            reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(content, "</think>")), "<think>"));
            content = lstrip_newlines(after_last(content, "</think>"));
        }
        at = append(at, "<|im_start|>assistant\n");
        if (i > last_query && (i == n - 1 || reasoning.len > 0)) {
            at = append_span(append(at, "<think>\n"), lstrip_newlines(rstrip_newlines(reasoning)));
            at = append(at, "\n</think>\n\n");
            content = lstrip_newlines(content);
        }
        at = append(append_span(at, content), "<|im_end|>\n");
    }
    return at;
}

/* " [INST] {user} [/INST]" and " {assistant}</s>", alternating after an
 * optional system message that opens the first user message; NULL for
 * roles out of that order. */
static char *mistral(char *at, const chat_message *msgs, size_t n) {
    const char *system = msgs[0].role == CHAT_ROLE_SYSTEM ? msgs[0].content : NULL;
    for (size_t i = system ? 1 : 0, turn = 0; i < n; i++, turn++) {
        const bool answer = turn % 2 == 1;
        if (msgs[i].role != (answer ? CHAT_ROLE_ASSISTANT : CHAT_ROLE_USER)) return NULL;
        if (answer) {
            at = append(append(append(at, " "), msgs[i].content), "</s>");
            continue;
        }
        at = append(at, " [INST] ");
        if (turn == 0 && system) at = append(append(at, system), "\n\n");
        at = append(append(at, msgs[i].content), " [/INST]");
    }
    return at;
}

/* What chat_template_render must give, written into want (room for every
 * content once and 64 bytes a turn and for the generation prompt): its
 * end, or NULL where it must refuse. */
static char *render_model(chat_template_id id, const chat_message *msgs, size_t n, bool generation_prompt, char *want) {
    if (!family_known(id) || n == 0) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!role_known(msgs[i].role) || !msgs[i].content) return NULL;
    char *at = want;
    switch (id) {
    case CHAT_TEMPLATE_QWEN3: at = qwen3(at, msgs, n); break;
    case CHAT_TEMPLATE_MISTRAL: at = mistral(at, msgs, n); break;
    case CHAT_TEMPLATE_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            at = append(append(append(at, "<|start_header_id|>"), role_names[msgs[i].role]), "<|end_header_id|>\n\n");
            at = append(append_span(at, trim(whole(msgs[i].content))), "<|eot_id|>");
        }
        break;
    default:
        for (size_t i = 0; i < n; i++)
            at = chatml_turn(at, msgs[i].role, whole(msgs[i].content));
    }
    if (at && generation_prompt && id != CHAT_TEMPLATE_MISTRAL)
        at = append(at, id == CHAT_TEMPLATE_LLAMA3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                                                   : "<|im_start|>assistant\n");
    return at;
}

/* --- the checks ------------------------------------------------------------ */

static void check_render(chat_template_id id, const chat_message *msgs, size_t n, bool generation_prompt, char *want) {
    const char *want_end = render_model(id, msgs, n, generation_prompt, want);
    char *out = (char *)"untouched";
    moe_error err = {0};
    const moe_status status = chat_template_render(id, msgs, n, generation_prompt, &out, &err);
    if (!want_end) {
        REQUIRE(status == MOE_ERR_INVALID_ARG && err.code == status && err.message[0] && out == NULL);
        return;
    }
    const size_t want_len = (size_t)(want_end - want);
    REQUIRE(status == MOE_OK && out && strlen(out) == want_len && memcmp(out, want, want_len) == 0);
    free(out);
}

/* <|im_start|> is ChatML (qwen3 with </think>), then <|start_header_id|>
 * llama3, then [INST] mistral. */
static chat_template_id detect_model(const char *source) {
    if (!source) return CHAT_TEMPLATE_NONE;
    if (strstr(source, "<|im_start|>")) return strstr(source, "</think>") ? CHAT_TEMPLATE_QWEN3 : CHAT_TEMPLATE_CHATML;
    if (strstr(source, "<|start_header_id|>")) return CHAT_TEMPLATE_LLAMA3;
    if (strstr(source, "[INST]")) return CHAT_TEMPLATE_MISTRAL;
    return CHAT_TEMPLATE_NONE;
}

/* None of the markers, or no source, is an error that lists the names. */
static chat_template_id check_detect(const char *source) {
    moe_error err = {0};
    const chat_template_id id = chat_template_detect(source, &err);
    REQUIRE(id == detect_model(source));
    if (id == CHAT_TEMPLATE_NONE) REQUIRE(err.code != MOE_OK && lists_the_names(err.message));
    return id;
}

/* A family's name gives it back; anything else is an error listing them. */
static chat_template_id check_by_name(const char *name) {
    moe_error err = {0};
    const chat_template_id id = chat_template_by_name(name, &err);
    if (id == CHAT_TEMPLATE_NONE)
        REQUIRE(err.code == MOE_ERR_INVALID_ARG && lists_the_names(err.message));
    else
        REQUIRE(family_known(id) && strcmp(chat_template_name(id), name) == 0);
    return id;
}

/* A family's name gives it back, other ids are "none"; a family ends a turn
 * on at least one non-empty string, the others on none. */
static void check_name_and_stops(chat_template_id id) {
    moe_error err = {0};
    const char *name = chat_template_name(id);
    REQUIRE(family_known(id) ? chat_template_by_name(name, &err) == id : strcmp(name, "none") == 0);
    const char *const *stops = chat_template_stops(id);
    size_t n = 0;
    while (stops[n])
        REQUIRE(stops[n++][0]);
    REQUIRE(family_known(id) ? n > 0 : n == 0);
}

/* A role's name gives it back; an unknown role's name is refused. */
static void check_role_name(chat_role role) {
    chat_role parsed = CHAT_ROLE_SYSTEM;
    moe_error err = {0};
    if (role_known(role))
        REQUIRE(chat_role_parse(chat_role_name(role), &parsed, &err) == MOE_OK && parsed == role &&
                strcmp(chat_role_name(role), role_names[role]) == 0);
    else
        REQUIRE(chat_role_parse(chat_role_name(role), &parsed, &err) == MOE_ERR_INVALID_ARG && err.message[0]);
}

/* Whether s holds none of chars. */
static bool none_of(span s, const char *chars) {
    for (size_t i = 0; i < s.len; i++)
        if (strchr(chars, s.start[i])) return false;
    return true;
}

/* The first text of the source between "<|im_start|>system" and a newline
 * (real, or escaped in a Jinja string) and the next "<|im_end|>" that is a
 * literal: not empty, no quote, brace, '+' or backslash. */
static span default_system_model(const char *source) {
    static const char marker[] = "<|im_start|>system", end_marker[] = "<|im_end|>";
    for (const char *at = source; at && *at; at++) {
        if (strncmp(at, marker, strlen(marker)) != 0) continue;
        const char *start = at + strlen(marker);
        if (*start == '\n')
            start += 1;
        else if (strncmp(start, "\\n", 2) == 0)
            start += 2;
        else
            continue;
        const char *end = strstr(start, end_marker);
        if (!end) break; /* nor after a later marker */
        const span text = {start, (size_t)(end - start)};
        if (text.len > 0 && none_of(text, "'\"{}+\\")) return text;
    }
    return (span){NULL, 0};
}

static void check_default_system(const char *source) {
    const span want = default_system_model(source);
    char *got = (char *)"untouched";
    moe_error err = {0};
    REQUIRE(chat_template_default_system(source, &got, &err) == MOE_OK);
    if (want.start)
        REQUIRE(got && strlen(got) == want.len && memcmp(got, want.start, want.len) == 0);
    else
        REQUIRE(got == NULL);
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    /* The fields as C strings: the copy ends the last one with a NUL. */
    char *fields = malloc(size);
    chat_message *msgs = calloc(size, sizeof *msgs);
    REQUIRE(fields && msgs);
    memcpy(fields, data + 1, size - 1);
    fields[size - 1] = '\0';
    size_t n = 0, content_len = 0;
    for (char *field = fields + strlen(fields) + 1; field < fields + size; field += strlen(field) + 1) {
        const char role = field[0];
        msgs[n].role = role == 's'   ? CHAT_ROLE_SYSTEM
                       : role == 'u' ? CHAT_ROLE_USER
                       : role == 'a' ? CHAT_ROLE_ASSISTANT
                                     : unknown_role;
        msgs[n].content = role ? field + 1 : NULL;
        content_len += strlen(field);
        check_role_name(msgs[n++].role);
    }

    const char *source = data[0] & 16 ? NULL : fields;
    const chat_template_id detected = check_detect(source), named = check_by_name(source);
    check_default_system(source);
    const int family = data[0] & 7;
    const chat_template_id id = family == FAMILY_DETECTED  ? detected
                                : family == FAMILY_BY_NAME ? named
                                : family == FAMILY_NONE    ? CHAT_TEMPLATE_NONE
                                : family == FAMILY_UNKNOWN ? unknown_id
                                                           : (chat_template_id)family;
    check_name_and_stops(id);
    char *want = malloc(content_len + 64 * (n + 1));
    REQUIRE(want);
    check_render(id, msgs, n, data[0] & 8, want);
    free(want);
    free(msgs);
    free(fields);
    return 0;
}
