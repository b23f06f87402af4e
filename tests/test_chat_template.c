/*
 * test_chat_template.c — chat templates: exact prompts for multi-turn
 * conversations with and without a system message in every family,
 * detection from excerpts of real templates (tests/data/chat_templates),
 * names, stop strings and the errors.
 *
 * The expected strings are what the official Jinja templates render for
 * the same messages, less the leading bos_token (see chat_template.h). The
 * ChatML, Llama 3 and Mistral ones for the six-message conversation are
 * also the outputs llama.cpp's test-chat-template records for it.
 */
#include <stdlib.h>

#include "test.h"
#include "tokenizer/chat_template.h"

#define S CHAT_ROLE_SYSTEM
#define U CHAT_ROLE_USER
#define A CHAT_ROLE_ASSISTANT

/* llama.cpp's test conversation: note the spaces around the second answer. */
static const chat_message conversation[] = {
    {S, "You are a helpful assistant"}, {U, "Hello"},   {A, "Hi there"},
    {U, "Who are you"},                 {A, "   I am an assistant   "},
    {U, "Another question"},
};
enum { N_CONVERSATION = sizeof conversation / sizeof *conversation };

/* The same without the system message. */
static const chat_message *const no_system = conversation + 1;
enum { N_NO_SYSTEM = N_CONVERSATION - 1 };

/* Renders and compares, printing both on a mismatch. */
static void check_render(chat_template_id id, const chat_message *msgs, size_t n, bool generation_prompt,
                         const char *expected) {
    char *out = NULL;
    moe_error err = {0};
    const moe_status status = chat_template_render(id, msgs, n, generation_prompt, &out, &err);
    CHECKF(status == MOE_OK, "%s: %s", chat_template_name(id), err.message);
    if (status != MOE_OK) return;
    CHECKF(strcmp(out, expected) == 0, "%s:\n--- got\n%s\n--- expected\n%s\n---", chat_template_name(id), out,
           expected);
    free(out);
}

static void test_chatml(void) {
    check_render(CHAT_TEMPLATE_CHATML, conversation, N_CONVERSATION, true,
                 "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi there<|im_end|>\n"
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
                 "<|im_start|>user\nAnother question<|im_end|>\n"
                 "<|im_start|>assistant\n");
    check_render(CHAT_TEMPLATE_CHATML, no_system, N_NO_SYSTEM, false,
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi there<|im_end|>\n"
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
                 "<|im_start|>user\nAnother question<|im_end|>\n");
}

static void test_llama3_trims_the_content(void) {
    check_render(CHAT_TEMPLATE_LLAMA3, conversation, N_CONVERSATION, true,
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(CHAT_TEMPLATE_LLAMA3, no_system, 3, false,
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>");
    /* Jinja's trim is Python's str.strip(): Unicode spaces go too (U+00A0,
     * U+3000, U+2029) and so do \x1c-\x1f, but not the spaces inside. */
    const chat_message unicode[] = {{U, "\xC2\xA0 \tHi\xE3\x80\x80there \xE2\x80\xA9\x1F\r\n"}};
    check_render(CHAT_TEMPLATE_LLAMA3, unicode, 1, false,
                 "<|start_header_id|>user<|end_header_id|>\n\nHi\xE3\x80\x80there<|eot_id|>");
    const chat_message blank[] = {{U, " \n "}};
    check_render(CHAT_TEMPLATE_LLAMA3, blank, 1, false, "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

/* Mistral's v1 template: the system message opens the first [INST]; the
 * generation prompt flag changes nothing. */
static void test_mistral_merges_the_system_message(void) {
    static const char with_system[] = " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s>"
                                       " [INST] Who are you [/INST]    I am an assistant   </s>"
                                       " [INST] Another question [/INST]";
    check_render(CHAT_TEMPLATE_MISTRAL, conversation, N_CONVERSATION, true, with_system);
    check_render(CHAT_TEMPLATE_MISTRAL, conversation, N_CONVERSATION, false, with_system);
    check_render(CHAT_TEMPLATE_MISTRAL, no_system, N_NO_SYSTEM, true,
                 " [INST] Hello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s>"
                 " [INST] Another question [/INST]");
    check_render(CHAT_TEMPLATE_MISTRAL, conversation, 1, true, "");
}

static void check_render_fails(chat_template_id id, const chat_message *msgs, size_t n, const char *needle) {
    char *out = (char *)"untouched";
    moe_error err = {0};
    CHECKF(chat_template_render(id, msgs, n, true, &out, &err) == MOE_ERR_INVALID_ARG, "rendered: %s",
           out ? out : "(null)");
    CHECK(out == NULL);
    CHECKF(strstr(err.message, needle) != NULL, "message: %s", err.message);
}

static void test_mistral_rejects_roles_out_of_order(void) {
    const chat_message two_users[] = {{U, "a"}, {U, "b"}};
    check_render_fails(CHAT_TEMPLATE_MISTRAL, two_users, 2, "message 1 is user where assistant was expected");
    const chat_message late_system[] = {{U, "a"}, {A, "b"}, {S, "c"}};
    check_render_fails(CHAT_TEMPLATE_MISTRAL, late_system, 3, "message 2 is system");
    const chat_message starts_with_assistant[] = {{S, "s"}, {A, "a"}};
    check_render_fails(CHAT_TEMPLATE_MISTRAL, starts_with_assistant, 2, "message 1 is assistant");
}

/* Qwen3 drops the reasoning of assistant turns before the last user
 * message and shows it (an empty block if there is none) in the final
 * assistant turn after it. */
static void test_qwen3_thinking(void) {
    const chat_message history[] = {
        {S, "You are a helpful assistant"},
        {U, "Hello"},
        {A, "<think>\nThe user greets me.\n</think>\n\nHi there"},
        {U, "Who are you"},
    };
    check_render(CHAT_TEMPLATE_QWEN3, history, 4, true,
                 "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi there<|im_end|>\n"
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n");

    const chat_message answered[] = {
        {U, "Hello"},
        {A, "<think>\nplan\n</think>\n\nHi there"},
        {U, "Who are you"},
        {A, "\nI am Qwen."},
    };
    check_render(CHAT_TEMPLATE_QWEN3, answered, 4, false,
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi there<|im_end|>\n"
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n<think>\n\n</think>\n\nI am Qwen.<|im_end|>\n");

    const chat_message reasoned[] = {
        {U, "Who are you"},
        {A, "<think>\n\nI should introduce myself.\n\n</think>\n\nI am Qwen."},
    };
    check_render(CHAT_TEMPLATE_QWEN3, reasoned, 2, false,
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n<think>\nI should introduce myself.\n</think>\n\nI am Qwen.<|im_end|>\n");

    /* Python's split: the answer follows the last </think>; the reasoning
     * is what precedes the first one, after the last <think> before it.
     * After the last query, a turn that is not the last keeps its reasoning
     * only if it has some; a user message that only wraps a tool response
     * is not a query. */
    const chat_message odd[] = {
        {U, "q1"},
        {A, "x<think>a\n</think>b</think>\n\nc"},
        {U, "q2"},
        {A, "plain"},
        {A, "<think>t</think>thought"},
        {U, "<tool_response>\n42\n</tool_response>"},
        {A, "<think>r</think>done"},
    };
    check_render(CHAT_TEMPLATE_QWEN3, odd, 7, false,
                 "<|im_start|>user\nq1<|im_end|>\n"
                 "<|im_start|>assistant\nc<|im_end|>\n"
                 "<|im_start|>user\nq2<|im_end|>\n"
                 "<|im_start|>assistant\nplain<|im_end|>\n"
                 "<|im_start|>assistant\n<think>\nt\n</think>\n\nthought<|im_end|>\n"
                 "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                 "<|im_start|>assistant\n<think>\nr\n</think>\n\ndone<|im_end|>\n");

    /* No user message at all: no assistant turn counts as after it. */
    const chat_message no_query[] = {{S, "s"}, {A, "<think>r</think>a"}};
    check_render(CHAT_TEMPLATE_QWEN3, no_query, 2, false,
                 "<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");

    check_render(CHAT_TEMPLATE_QWEN3, no_system, N_NO_SYSTEM, true,
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi there<|im_end|>\n"
                 "<|im_start|>user\nWho are you<|im_end|>\n"
                 "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
                 "<|im_start|>user\nAnother question<|im_end|>\n"
                 "<|im_start|>assistant\n");
}

static char *read_template(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat_templates/%s", MOE_TEST_DATA_DIR, name);
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    const size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void check_detect(const char *file, chat_template_id expected) {
    char *source = read_template(file);
    if (!source) return;
    moe_error err = {0};
    const chat_template_id got = chat_template_detect(source, &err);
    CHECKF(got == expected, "%s: detected %s, expected %s (%s)", file, chat_template_name(got),
           chat_template_name(expected), err.message);
    free(source);
}

static void test_detection_from_real_templates(void) {
    check_detect("qwen2-instruct.jinja", CHAT_TEMPLATE_CHATML);
    check_detect("qwen2.5-instruct.jinja", CHAT_TEMPLATE_CHATML);
    check_detect("qwen3.jinja", CHAT_TEMPLATE_QWEN3);
    check_detect("llama-3.1-instruct.jinja", CHAT_TEMPLATE_LLAMA3);
    check_detect("mistral-7b-instruct-v0.2.jinja", CHAT_TEMPLATE_MISTRAL);
}

static void test_unknown_and_missing_templates(void) {
    char *gemma = read_template("gemma-7b-it.jinja");
    moe_error err = {0};
    CHECK(chat_template_detect(gemma, &err) == CHAT_TEMPLATE_NONE);
    CHECK(err.code == MOE_ERR_UNSUPPORTED);
    CHECKF(strstr(err.message, "chatml, qwen3, llama3, mistral") != NULL, "%s", err.message);
    free(gemma);

    moe_error missing = {0};
    CHECK(chat_template_detect(NULL, &missing) == CHAT_TEMPLATE_NONE);
    CHECK(missing.code == MOE_ERR_NOT_FOUND);
    CHECKF(strstr(missing.message, "tokenizer.chat_template") != NULL, "%s", missing.message);

    char *out = NULL;
    moe_error render = {0};
    CHECK(chat_template_render(CHAT_TEMPLATE_NONE, conversation, 2, true, &out, &render) == MOE_ERR_INVALID_ARG);
    CHECK(out == NULL);
}

static void test_names(void) {
    const chat_template_id all[] = {CHAT_TEMPLATE_CHATML, CHAT_TEMPLATE_QWEN3, CHAT_TEMPLATE_LLAMA3,
                                    CHAT_TEMPLATE_MISTRAL};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        moe_error err = {0};
        CHECK(chat_template_by_name(chat_template_name(all[i]), &err) == all[i]);
    }
    moe_error err = {0};
    CHECK(chat_template_by_name("vicuna", &err) == CHAT_TEMPLATE_NONE);
    CHECK(err.code == MOE_ERR_INVALID_ARG);
    CHECKF(strstr(err.message, "\"vicuna\"") && strstr(err.message, "chatml, qwen3, llama3, mistral"), "%s",
           err.message);
    CHECK(chat_template_by_name(NULL, &err) == CHAT_TEMPLATE_NONE);
    CHECK(strcmp(chat_template_name((chat_template_id)99), "none") == 0);

    /* A name longer than the message still leaves room for the list (found
     * by fuzz_chat_template: it used to be cut off). */
    char long_name[sizeof err.message + 1];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    CHECK(chat_template_by_name(long_name, &err) == CHAT_TEMPLATE_NONE);
    CHECKF(strstr(err.message, "\"xxxx") && strstr(err.message, "chatml, qwen3, llama3, mistral"), "%s", err.message);
}

static void test_stop_strings(void) {
    CHECK(strcmp(chat_template_stops(CHAT_TEMPLATE_CHATML)[0], "<|im_end|>") == 0);
    CHECK(chat_template_stops(CHAT_TEMPLATE_CHATML)[1] == NULL);
    CHECK(strcmp(chat_template_stops(CHAT_TEMPLATE_QWEN3)[0], "<|im_end|>") == 0);
    CHECK(strcmp(chat_template_stops(CHAT_TEMPLATE_LLAMA3)[0], "<|eot_id|>") == 0);
    CHECK(strcmp(chat_template_stops(CHAT_TEMPLATE_LLAMA3)[1], "<|eom_id|>") == 0);
    CHECK(strcmp(chat_template_stops(CHAT_TEMPLATE_MISTRAL)[0], "</s>") == 0);
    CHECK(chat_template_stops(CHAT_TEMPLATE_NONE)[0] == NULL);
}

static void check_default_system(const char *file, const char *expected) {
    char *source = read_template(file);
    char *system;
    moe_error err = {0};
    CHECK(chat_template_default_system(source, &system, &err) == MOE_OK);
    if (!expected)
        CHECKF(system == NULL, "%s: %s", file, system);
    else
        CHECKF(system && strcmp(system, expected) == 0, "%s: %s", file, system ? system : "(null)");
    free(system);
    free(source);
}

/* Qwen 2 and 2.5 insert a default system message; given it as the first
 * message, the ChatML renderer reproduces their prompt. */
static void test_default_system_message(void) {
    check_default_system("qwen2.5-instruct.jinja",
                         "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    check_default_system("qwen2-instruct.jinja", "You are a helpful assistant.");
    check_default_system("qwen3.jinja", NULL);
    check_default_system("llama-3.1-instruct.jinja", NULL);
    char *none = (char *)"untouched";
    CHECK(chat_template_default_system(NULL, &none, NULL) == MOE_OK && none == NULL);

    const chat_message with_default[] = {
        {S, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
        {U, "Hello"},
    };
    check_render(CHAT_TEMPLATE_CHATML, with_default, 2, true,
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\n");
}

static void test_bad_conversations(void) {
    const chat_message null_content[] = {{U, "a"}, {A, NULL}};
    check_render_fails(CHAT_TEMPLATE_CHATML, null_content, 2, "message 1 has no content");
    const chat_message bad_role[] = {{(chat_role)7, "a"}};
    check_render_fails(CHAT_TEMPLATE_LLAMA3, bad_role, 1, "unknown role");
    check_render_fails(CHAT_TEMPLATE_QWEN3, conversation, 0, "at least one message");
}

static void test_roles(void) {
    chat_role role = CHAT_ROLE_SYSTEM;
    CHECK(chat_role_parse("assistant", &role, NULL) == MOE_OK && role == CHAT_ROLE_ASSISTANT);
    CHECK(chat_role_parse("user", &role, NULL) == MOE_OK && role == CHAT_ROLE_USER);
    moe_error err = {0};
    CHECK(chat_role_parse("tool", &role, &err) == MOE_ERR_INVALID_ARG);
    CHECKF(strstr(err.message, "\"tool\"") != NULL, "%s", err.message);
    CHECK(strcmp(chat_role_name(CHAT_ROLE_SYSTEM), "system") == 0);
}

int main(void) {
    RUN(test_chatml);
    RUN(test_llama3_trims_the_content);
    RUN(test_mistral_merges_the_system_message);
    RUN(test_mistral_rejects_roles_out_of_order);
    RUN(test_qwen3_thinking);
    RUN(test_detection_from_real_templates);
    RUN(test_unknown_and_missing_templates);
    RUN(test_names);
    RUN(test_stop_strings);
    RUN(test_default_system_message);
    RUN(test_bad_conversations);
    RUN(test_roles);
    return test_summary();
}
