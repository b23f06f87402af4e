/*
 * encode.c — text to token ids.
 *
 * First the special tokens: the text is scanned for the texts of control,
 * unknown and user-defined tokens, leftmost match first and, among those
 * starting at one byte, the longest (Hugging Face's added-token splitter
 * does the same). Each token found is emitted as itself; the fragments of
 * plain text between them go through the model: SentencePiece-style BPE
 * directly (every fragment gets the dummy-prefix space, as both Hugging
 * Face's per-segment normaliser and llama.cpp do), byte-level BPE after
 * optional NFC and the pre-tokenizer regex.
 */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

bool grow_buf_reserve(grow_buf *b, size_t need, size_t elem) {
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2 / elem) return false;
        cap *= 2;
    }
    void *p = realloc(b->data, cap * elem);
    if (!p) return false;
    b->data = p;
    b->cap = cap;
    return true;
}

moe_status encode_push(encode_state *es, int32_t id) {
    if (!grow_buf_reserve(&es->ids, es->ids.len + 1, sizeof(int32_t)))
        return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory after %zu tokens", es->ids.len);
    ((int32_t *)es->ids.data)[es->ids.len++] = id;
    return MOE_OK;
}

moe_status encode_push_bytes(encode_state *es, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = es->tk->byte_token[bytes[i]];
        if (id < 0) id = es->tk->unk;
        if (id < 0)
            return moe_error_set(es->err, MOE_ERR_UNSUPPORTED,
                                 "byte 0x%02X has no token in the vocabulary, and there is no unknown token", bytes[i]);
        moe_status st = encode_push(es, id);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* The special token whose text starts `s` (longest first), or -1. Control
 * and unknown tokens count only when parsing special tokens. */
static int32_t special_at(const tokenizer *tk, const char *s, size_t n, bool parse_special, size_t *match_len) {
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = tk->specials.start[b]; k < tk->specials.start[b + 1]; k++) {
        int32_t id = tk->specials.ids[k];
        if (!parse_special && tk->type[id] != TOKEN_TYPE_USER_DEFINED) continue;
        size_t len;
        const char *text = string_at(&tk->text, (uint32_t)id, &len);
        if (len <= n && memcmp(text, s, len) == 0) {
            *match_len = len;
            return id;
        }
    }
    return -1;
}

static moe_status encode_fragment(encode_state *es, const char *text, size_t len) {
    const tokenizer *tk = es->tk;
    if (len == 0) return MOE_OK;
    if (tk->model == TOKENIZER_MODEL_SPM) return spm_encode(es, text, len, tk->add_space_prefix);
    if (tk->pre->nfc) {
        moe_status st = pretok_nfc(text, len, &es->text, es->err);
        if (st != MOE_OK) return st;
        text = es->text.data;
        len = es->text.len;
    }
    return pretok_encode(es, text, len);
}

static moe_status encode_text(encode_state *es, const char *text, size_t len, bool parse_special) {
    const tokenizer *tk = es->tk;
    size_t start = 0; /* the plain text not yet encoded starts here */
    for (size_t i = 0; i < len;) {
        size_t match_len;
        uint8_t b = (uint8_t)text[i];
        int32_t id = tk->specials.start[b] == tk->specials.start[b + 1]
                         ? -1
                         : special_at(tk, text + i, len - i, parse_special, &match_len);
        if (id < 0) {
            i++;
            continue;
        }
        moe_status st = encode_fragment(es, text + start, i - start);
        if (st == MOE_OK) st = encode_push(es, id);
        if (st != MOE_OK) return st;
        i += match_len;
        start = i;
    }
    return encode_fragment(es, text + start, len - start);
}

moe_status tokenizer_encode(const tokenizer *tk, const char *text, size_t len, unsigned flags, int32_t **ids,
                            size_t *n_ids, moe_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "tokenizer_encode: text is NULL");
    /* Positions inside a piece are 32-bit. */
    if (len > INT32_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, "a text of %zu bytes is longer than the tokenizer's limit of %d", len,
                             INT32_MAX);
    encode_state es = {.tk = tk, .err = err};
    bool add_special = flags & TOKENIZER_ADD_SPECIAL;
    moe_status st = MOE_OK;
    if (add_special && tk->add_bos && tk->bos >= 0) st = encode_push(&es, tk->bos);
    if (st == MOE_OK) st = encode_text(&es, text, len, flags & TOKENIZER_PARSE_SPECIAL);
    if (st == MOE_OK && add_special && tk->add_eos && tk->eos >= 0) st = encode_push(&es, tk->eos);
    free(es.text.data);
    free(es.word.data);
    free(es.symbols.data);
    free(es.queue.data);
    if (st != MOE_OK) {
        free(es.ids.data);
        return st;
    }
    *ids = es.ids.data;
    *n_ids = es.ids.len;
    return MOE_OK;
}
