/*
 * chat_template.h — turning a conversation into the prompt text a chat
 * model was trained on.
 *
 * GGUF files carry the Hugging Face Jinja template (tokenizer.chat_template).
 * moe.c runs no Jinja: it recognises the template family from markers in
 * the source and renders that family in C, the output being, byte for byte,
 * what the official template renders for plain text messages with roles
 * system, user and assistant (no tools, no images). The families:
 *
 *   chatml   <|im_start|>{role}\n{content}<|im_end|>\n per message;
 *            generation prompt <|im_start|>assistant\n. Qwen 1.5 / 2 / 2.5
 *            (and OpenHermes-style models).
 *   qwen3    ChatML as Qwen3 renders it: an assistant turn that comes before
 *            the last user message loses its reasoning (everything up to
 *            the last </think>, and the newlines after it); an assistant
 *            turn after it keeps the reasoning as <think>\n...\n</think>\n\n
 *            when it has some or is the final message. Thinking is left on
 *            (the template's enable_thinking defaults to true): the model
 *            decides whether to think.
 *   llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
 *            with the content trimmed of surrounding whitespace; generation
 *            prompt <|start_header_id|>assistant<|end_header_id|>\n\n. This
 *            is Llama 3.0's template. Llama 3.1+ also open every prompt with
 *            a system header holding "Cutting Knowledge Date" and "Today
 *            Date" lines, which we leave out (so does llama.cpp's built-in).
 *   mistral  Mistral's "v1" instruct format (Mistral-7B-Instruct v0.1 and
 *            v0.2, Mixtral-8x7B-Instruct): " [INST] {user} [/INST]" and
 *            " {assistant}</s>"; a leading system message is merged into the
 *            first user message as "{system}\n\n{user}". After that optional
 *            system message the roles must alternate user, assistant, user,
 *            ...; anything else is an error, as in the official template.
 *            There is no generation prompt: a prompt ending in [/INST]
 *            already asks for the answer. Templates of the later v3 format
 *            (no space around [INST]) are recognised as mistral too and get
 *            v1 spacing.
 *
 * BOS: the official templates of Llama 3 and Mistral begin with bos_token.
 * The rendered text never contains it: the tokenizer adds BOS when the file
 * sets tokenizer.ggml.add_bos_token (TOKENIZER_ADD_SPECIAL), as Llama 3 and
 * Mistral files do, and a second BOS would be a token the model never saw
 * in training. The text does contain the other control tokens (<|im_end|>,
 * </s>, ...): encode it with TOKENIZER_PARSE_SPECIAL. Message content is
 * copied as it is, so a user who types "<|im_end|>" produces that control
 * token, as with llama.cpp and Hugging Face.
 *
 * Some ChatML templates (Qwen 1.5 / 2 / 2.5) insert a default system
 * message when the conversation has none; chat_template_default_system
 * reads it out of the template source so the caller can pass it as the
 * first message.
 */
#ifndef MOE_TOKENIZER_CHAT_TEMPLATE_H
#define MOE_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "moe.h"

typedef enum chat_role {
    CHAT_ROLE_SYSTEM,
    CHAT_ROLE_USER,
    CHAT_ROLE_ASSISTANT,
} chat_role;

typedef struct chat_message {
    chat_role role;
    const char *content; /* UTF-8, NUL-terminated */
} chat_message;

typedef enum chat_template_id {
    CHAT_TEMPLATE_NONE = 0, /* not recognised */
    CHAT_TEMPLATE_CHATML,
    CHAT_TEMPLATE_QWEN3,
    CHAT_TEMPLATE_LLAMA3,
    CHAT_TEMPLATE_MISTRAL,
} chat_template_id;

/* The family of a Jinja template source (the GGUF key
 * tokenizer.chat_template), by its markers: <|im_start|> is ChatML, and
 * qwen3 when the source also handles </think>; <|start_header_id|> is
 * llama3; [INST] is mistral. NULL or none of those: CHAT_TEMPLATE_NONE, with
 * err saying so and listing the names chat_template_by_name accepts. */
chat_template_id chat_template_detect(const char *source, moe_error *err);

/* The family of a name (a --chat-template override): chatml, qwen3, llama3
 * or mistral. Unknown: CHAT_TEMPLATE_NONE, with err listing the valid ones. */
chat_template_id chat_template_by_name(const char *name, moe_error *err);

/* "chatml", ...; "none" for CHAT_TEMPLATE_NONE and unknown values. */
const char *chat_template_name(chat_template_id id);

/* Renders msgs[0..n) into *out (malloc'd, NUL-terminated, the caller frees
 * it), followed by the generation prompt when add_generation_prompt (the
 * mistral family has none). MOE_ERR_INVALID_ARG for an unknown template or
 * role, a NULL content, an empty conversation, or (mistral) roles out of
 * order; MOE_ERR_NOMEM. On failure *out is NULL. */
moe_status chat_template_render(chat_template_id id, const chat_message *msgs, size_t n, bool add_generation_prompt,
                                char **out, moe_error *err);

/* The strings that end an assistant turn in this family, NULL-terminated:
 * stop when the model produces the token with this text (the tokenizer's
 * tokenizer_find gives its id) or, failing that, the text itself; also
 * stop at the model's EOS. An empty list for CHAT_TEMPLATE_NONE. */
const char *const *chat_template_stops(chat_template_id id);

/* The default system message a ChatML template inserts when the
 * conversation does not start with one, read from the template source:
 * the literal text between "<|im_start|>system\n" and "<|im_end|>" inside
 * a quoted string of the source. *out is a malloc'd copy, or NULL when the
 * template has none (or source is NULL). MOE_ERR_NOMEM only. */
moe_status chat_template_default_system(const char *source, char **out, moe_error *err);

/* "system", "user", "assistant". */
const char *chat_role_name(chat_role role);

/* The role named by an OpenAI-style "role" string; MOE_ERR_INVALID_ARG,
 * naming it, for anything else. */
moe_status chat_role_parse(const char *name, chat_role *role, moe_error *err);

#endif
