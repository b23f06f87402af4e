/*
 * spm.c — SentencePiece-style BPE (tokenizer.ggml.model "llama").
 *
 * SentencePiece writes a space as "▁" (U+2581) and, with add_dummy_prefix
 * (tokenizer.ggml.add_space_prefix), puts one in front of the text so a
 * word is the same token at the start as after a space. There is no
 * pre-tokenizer: the fragment starts as one symbol per UTF-8 character, and
 * the adjacent pair whose concatenation is the highest-scoring token merges
 * first (ties leftmost), as llama.cpp's SPM tokenizer does. A character
 * that is not a token comes out as its <0xNN> byte tokens.
 *
 * Only normal tokens are merged into: control and user-defined tokens are
 * matched in the text before the model runs, and must not appear because
 * their text happens to be spelled out.
 *
 * Without a pre-tokenizer a fragment can be a whole document, and one
 * merge queue over a million symbols is slow (cache misses at every level
 * of the heap). SentencePiece vocabularies split at whitespace have no
 * token in which a ▁ follows another character, so no merge can cross the
 * point before such a ▁: the fragment is then merged word by word, with
 * exactly the result of merging it whole (tk->spm_word_split).
 */
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

#define SPACE_MARK "\xE2\x96\x81"
#define SPACE_MARK_LEN 3

static int32_t normal_token(const tokenizer *tk, const char *s, size_t len) {
    int32_t id = token_map_find(&tk->by_text, &tk->text, s, len);
    return id >= 0 && tk->type[id] == TOKEN_TYPE_NORMAL ? id : -1;
}

static int32_t spm_first_id(const encode_state *es, const char *s, size_t len) { return normal_token(es->tk, s, len); }

/* The queue merges the lowest key first; the highest score must win. The
 * float's bits become an order-preserving unsigned integer (negative
 * floats reversed), and that is inverted. */
static uint32_t score_priority(float score) {
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ~u;
}

static bool spm_rank(const encode_state *es, const char *input, const merge_symbol *l, const merge_symbol *r,
                     uint32_t *priority, int32_t *result) {
    size_t len = (size_t)l->len + r->len;
    if (len > es->tk->max_text) return false;
    int32_t id = normal_token(es->tk, input + l->pos, len);
    if (id < 0) return false;
    *priority = score_priority(es->tk->score[id]);
    *result = id;
    return true;
}

/* Spaces become ▁, and a ▁ goes in front with add_space_prefix. */
static moe_status spm_escape(encode_state *es, const char *text, size_t len, bool prefix) {
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t need = len + spaces * (SPACE_MARK_LEN - 1) + (prefix ? SPACE_MARK_LEN : 0);
    if (!grow_buf_reserve(&es->text, need, 1))
        return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory encoding %zu bytes of text", len);
    char *out = es->text.data;
    size_t n = 0;
    if (prefix) {
        memcpy(out, SPACE_MARK, SPACE_MARK_LEN);
        n = SPACE_MARK_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(out + n, SPACE_MARK, SPACE_MARK_LEN);
            n += SPACE_MARK_LEN;
        } else {
            out[n++] = text[i];
        }
    }
    es->text.len = n;
    return MOE_OK;
}

static bool is_mark_at(const char *s, size_t i) { return memcmp(s + i, SPACE_MARK, SPACE_MARK_LEN) == 0; }

/* The end of the word starting at `start`: the next ▁ after a character
 * that is not ▁ (a run of ▁ stays with the word it precedes). */
static size_t word_end(const char *s, size_t len, size_t start) {
    for (size_t i = start + 1; i + SPACE_MARK_LEN <= len; i++)
        if (is_mark_at(s, i) && !(i >= start + SPACE_MARK_LEN && is_mark_at(s, i - SPACE_MARK_LEN))) return i;
    return len;
}

moe_status spm_encode(encode_state *es, const char *text, size_t len, bool prefix) {
    moe_status st = spm_escape(es, text, len, prefix);
    const char *s = es->text.data;
    size_t n = es->text.len;
    if (st != MOE_OK || !es->tk->spm_word_split)
        return st != MOE_OK ? st : merge_encode(es, s, n, false, spm_first_id, spm_rank);
    for (size_t start = 0; start < n && st == MOE_OK;) {
        size_t end = word_end(s, n, start);
        st = merge_encode(es, s + start, end - start, false, spm_first_id, spm_rank);
        start = end;
    }
    return st;
}
