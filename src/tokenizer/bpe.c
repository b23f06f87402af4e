/*
 * bpe.c — byte-level BPE (tokenizer.ggml.model "gpt2").
 *
 * GPT-2 made BPE work on bytes without a byte ever being unknown: every
 * byte is drawn as one printable Unicode character, and the vocabulary and
 * merges are written in that alphabet (a space is "Ġ", U+0120). A
 * pre-token starts as one symbol per byte, the symbol being the token of
 * its character; merges then apply lowest rank first (ties leftmost), each
 * turning a pair of token ids into the merged token's id.
 *
 * Vocabularies with ignore_merges (Llama-3) first look the whole pre-token
 * up: tiktoken, which those vocabularies come from, takes a piece that is
 * itself a token as it is, and merging could split it differently.
 */
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

/* Printable Latin-1 bytes stand for themselves; the other 68 (controls,
 * space, DEL, NBSP, soft hyphen) take the code points from U+0100 up, in
 * byte order. */
void bpe_byte_alphabet(uint32_t cp_of_byte[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = printable ? b : next++;
    }
}

size_t tokenizer_byte_symbol(uint8_t byte, char out[4]) {
    uint32_t cp_of_byte[256];
    bpe_byte_alphabet(cp_of_byte);
    return utf8_encode(cp_of_byte[byte], out);
}

static int32_t bpe_first_id(const encode_state *es, const char *s, size_t len) {
    return es->tk->byte_token[(uint8_t)s[0]];
}

static bool bpe_rank(const encode_state *es, const char *input, const merge_symbol *l, const merge_symbol *r,
                     uint32_t *priority, int32_t *result) {
    if (l->id < 0 || r->id < 0) return false;
    const merge_slot *m = merge_map_find(&es->tk->merges, l->id, r->id);
    /* Special and user-defined tokens come only from matching their text. */
    if (!m || es->tk->type[m->result] != TOKEN_TYPE_NORMAL) return false;
    *priority = (uint32_t)m->rank;
    *result = m->result;
    return true;
}

/* The normal token whose text is the whole piece in the byte alphabet,
 * -1 when there is none, -2 when out of memory. */
static int32_t bpe_whole_piece(encode_state *es, const char *piece, size_t len) {
    const tokenizer *tk = es->tk;
    if (len > tk->max_text) return -1; /* each byte is 1 or 2 bytes of text */
    if (!grow_buf_reserve(&es->word, 2 * len, 1)) return -2;
    char *w = es->word.data;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)piece[i];
        memcpy(w + n, tk->alpha[b], tk->alpha_len[b]);
        n += tk->alpha_len[b];
    }
    int32_t id = token_map_find(&tk->by_text, &tk->text, w, n);
    return id >= 0 && tk->type[id] == TOKEN_TYPE_NORMAL ? id : -1;
}

moe_status bpe_encode_piece(encode_state *es, const char *piece, size_t len) {
    if (es->tk->pre->ignore_merges) {
        int32_t id = bpe_whole_piece(es, piece, len);
        if (id == -2) return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory encoding a piece of %zu bytes", len);
        if (id >= 0) return encode_push(es, id);
    }
    return merge_encode(es, piece, len, true, bpe_first_id, bpe_rank);
}
