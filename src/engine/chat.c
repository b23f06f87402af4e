/*
 * chat.c — conversations rendered with the model's chat template.
 */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "engine/engine_internal.h"
#include "tokenizer/chat_template.h"

/* The template named, or else the one the file's tokenizer.chat_template
 * is recognised as. */
static moe_status pick_template(const moe_model *m, const char *name, chat_template_id *id, moe_error *err) {
    if (name) {
        *id = chat_template_by_name(name, err);
        return *id == CHAT_TEMPLATE_NONE ? err->code : MOE_OK;
    }
    gguf_str source;
    if (gguf_get_str(m->weights->file, "tokenizer.chat_template", &source, NULL) != MOE_OK)
        return moe_error_set(err, MOE_ERR_NOT_FOUND,
                             "the model has no chat template (tokenizer.chat_template); pass --chat-template "
                             "chatml, llama3 or mistral");
    char *text = strndup(source.data, source.len);
    if (!text) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    *id = chat_template_detect(text, err);
    free(text);
    if (*id == CHAT_TEMPLATE_NONE)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "the model's chat template is not one moe.c recognises; pass --chat-template chatml, "
                             "llama3 or mistral");
    return MOE_OK;
}

moe_status moe_chat_format(const moe_model *m, const char *template_name, const moe_chat_message *messages,
                           size_t n_messages, bool add_generation_prompt, char **out, moe_error *err) {
    *out = NULL;
    chat_template_id id;
    moe_status st = pick_template(m, template_name, &id, err);
    if (st != MOE_OK) return st;
    chat_message *msgs = calloc(n_messages ? n_messages : 1, sizeof *msgs);
    if (!msgs) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n_messages && st == MOE_OK; i++) {
        st = chat_role_parse(messages[i].role, &msgs[i].role, err);
        msgs[i].content = messages[i].content ? messages[i].content : "";
    }
    if (st == MOE_OK) st = chat_template_render(id, msgs, n_messages, add_generation_prompt, out, err);
    free(msgs);
    return st;
}

moe_status moe_chat_stops(const moe_model *m, const char *template_name, const char *const **stops, moe_error *err) {
    chat_template_id id;
    moe_status st = pick_template(m, template_name, &id, err);
    if (st == MOE_OK) *stops = chat_template_stops(id);
    return st;
}
