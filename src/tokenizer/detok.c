/*
 * detok.c — token ids back to text.
 *
 * Every token's piece (the bytes it stands for) is computed once when the
 * vocabulary loads, so decoding is a table lookup and a copy. Pieces need
 * not be whole characters: byte-level BPE splits multi-byte characters
 * between tokens, and SentencePiece's byte fallback spells them as
 * <0xNN> tokens. The streaming detokenizer therefore passes bytes through a
 * UTF-8 validator that holds back an incomplete tail until the next piece
 * arrives, and replaces what can never become valid with U+FFFD.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */
#define SPACE_MARK "\xE2\x96\x81"  /* ▁ */

/* --- pieces ------------------------------------------------------------- */

/* The alphabet character of a byte-level token back to its byte: code
 * points below 324 cover the whole alphabet (256 + 68). */
#define ALPHABET_END 324

static void alphabet_inverse(int16_t byte_of_cp[ALPHABET_END]) {
    uint32_t cp_of_byte[256];
    bpe_byte_alphabet(cp_of_byte);
    for (int i = 0; i < ALPHABET_END; i++) byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of_byte[b]] = (int16_t)b;
}

/* A code point outside the alphabet (no such token in a sane vocabulary)
 * is kept as its UTF-8 rather than dropped; so is an invalid byte. */
static size_t piece_from_alphabet(const int16_t *byte_of_cp, const char *text, size_t len, char *out) {
    const uint8_t *s = (const uint8_t *)text;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int k = utf8_sequence(s + i, len - i);
        size_t step = k > 0 ? (size_t)k : 1;
        uint32_t cp = k == 1 ? s[i] : k == 2 ? (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F) : ALPHABET_END;
        if (cp < ALPHABET_END && byte_of_cp[cp] >= 0) {
            out[n++] = (char)byte_of_cp[cp];
        } else {
            memcpy(out + n, text + i, step);
            n += step;
        }
        i += step;
    }
    return n;
}

static size_t piece_from_spm(const char *text, size_t len, char *out) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (len - i >= 3 && memcmp(text + i, SPACE_MARK, 3) == 0) {
            out[n++] = ' ';
            i += 3;
        } else {
            out[n++] = text[i++];
        }
    }
    return n;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" to the byte; false for any other text. */
static bool parse_byte_token(const char *text, size_t len, uint8_t *byte) {
    if (len != 6 || memcmp(text, "<0x", 3) != 0 || text[5] != '>') return false;
    int hi = hex_digit(text[3]), lo = hex_digit(text[4]);
    if (hi < 0 || lo < 0) return false;
    *byte = (uint8_t)(hi * 16 + lo);
    return true;
}

static size_t piece_of(const tokenizer *tk, const int16_t *byte_of_cp, uint32_t id, char *out) {
    size_t len;
    const char *text = string_at(&tk->text, id, &len);
    uint8_t byte;
    switch (tk->type[id]) {
    case TOKEN_TYPE_NORMAL:
        return tk->model == TOKENIZER_MODEL_BPE ? piece_from_alphabet(byte_of_cp, text, len, out)
                                                : piece_from_spm(text, len, out);
    case TOKEN_TYPE_BYTE:
        if (parse_byte_token(text, len, &byte)) {
            out[0] = (char)byte;
            return 1;
        }
        break;
    default: break;
    }
    memcpy(out, text, len);
    return len;
}

/* No piece is longer than its text: alphabet characters and ▁ shrink to
 * one byte, everything else is copied. */
moe_status detok_build_pieces(tokenizer *tk, moe_error *err) {
    int16_t byte_of_cp[ALPHABET_END];
    alphabet_inverse(byte_of_cp);
    string_table *p = &tk->piece;
    p->n = tk->n_vocab;
    p->bytes = malloc(tk->text.off[tk->n_vocab] + 1);
    p->off = malloc(((size_t)tk->n_vocab + 1) * sizeof *p->off);
    if (!p->bytes || !p->off) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the token pieces");
    uint32_t at = 0;
    for (uint32_t id = 0; id < tk->n_vocab; id++) {
        p->off[id] = at;
        size_t n = piece_of(tk, byte_of_cp, id, p->bytes + at);
        if (n > tk->max_piece) tk->max_piece = n;
        at += (uint32_t)n;
    }
    p->off[tk->n_vocab] = at;
    return MOE_OK;
}

const char *tokenizer_piece(const tokenizer *tk, int32_t id, size_t *len) {
    assert(id >= 0 && (uint32_t)id < tk->n_vocab);
    return string_at(&tk->piece, (uint32_t)id, len);
}

/* --- the streaming detokenizer ------------------------------------------ */

struct tokenizer_detok {
    const tokenizer *tk;
    unsigned flags;
    bool strip_prefix; /* undo the dummy prefix at all */
    bool strip_next;   /* the next text piece loses a leading space */
    uint8_t held[4];   /* an incomplete UTF-8 sequence */
    size_t n_held;
    uint8_t *in; /* held bytes + one piece */
    char *out;   /* at most 3 bytes out per byte in (U+FFFD) */
};

moe_status tokenizer_detok_new(const tokenizer *tk, unsigned flags, tokenizer_detok **out, moe_error *err) {
    *out = NULL;
    tokenizer_detok *d = calloc(1, sizeof *d);
    size_t cap = tk->max_piece + sizeof d->held;
    if (d) {
        d->in = malloc(cap);
        d->out = malloc(3 * cap);
    }
    if (!d || !d->in || !d->out) {
        tokenizer_detok_free(d);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for a detokenizer");
    }
    d->tk = tk;
    d->flags = flags;
    d->strip_prefix =
        (flags & TOKENIZER_DECODE_STRIP_PREFIX) && tk->model == TOKENIZER_MODEL_SPM && tk->add_space_prefix;
    d->strip_next = d->strip_prefix;
    *out = d;
    return MOE_OK;
}

void tokenizer_detok_free(tokenizer_detok *d) {
    if (!d) return;
    free(d->in);
    free(d->out);
    free(d);
}

/* Validate held bytes + piece into d->out; keep an incomplete tail. */
static size_t detok_assemble(tokenizer_detok *d, const char *piece, size_t len) {
    memcpy(d->in, d->held, d->n_held);
    memcpy(d->in + d->n_held, piece, len);
    size_t n = d->n_held + len, out = 0;
    d->n_held = 0;
    for (size_t i = 0; i < n;) {
        int k = utf8_sequence(d->in + i, n - i);
        if (k == 0) { /* incomplete: at most 3 bytes, wait for more */
            d->n_held = n - i;
            memcpy(d->held, d->in + i, d->n_held);
            break;
        }
        if (k > 0) {
            memcpy(d->out + out, d->in + i, (size_t)k);
            out += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(d->out + out, REPLACEMENT, 3);
            out += 3;
            i += (size_t)-k;
        }
    }
    return out;
}

static bool is_special_type(uint8_t type) {
    return type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN || type == TOKEN_TYPE_UNUSED;
}

moe_status tokenizer_detok_push(tokenizer_detok *d, int32_t id, const char **out, size_t *out_len, moe_error *err) {
    *out = d->out;
    *out_len = 0;
    if (id < 0 || (uint32_t)id >= d->tk->n_vocab)
        return moe_error_set(err, MOE_ERR_RANGE, "token id %d is outside the vocabulary of %u tokens", id,
                             d->tk->n_vocab);
    uint8_t type = d->tk->type[id];
    size_t len;
    const char *piece = tokenizer_piece(d->tk, id, &len);
    if (type == TOKEN_TYPE_NORMAL || type == TOKEN_TYPE_BYTE) {
        if (d->strip_next && len > 0 && piece[0] == ' ') {
            piece++;
            len--;
        }
        d->strip_next = false;
    } else {
        /* The encoder starts a new fragment, with its own prefix space,
         * after every special or user-defined token. */
        d->strip_next = d->strip_prefix;
        if (is_special_type(type) && !(d->flags & TOKENIZER_DECODE_SPECIAL)) len = 0;
    }
    *out_len = detok_assemble(d, piece, len);
    return MOE_OK;
}

void tokenizer_detok_flush(tokenizer_detok *d, const char **out, size_t *out_len) {
    *out = d->out;
    *out_len = 0;
    if (d->n_held > 0) {
        memcpy(d->out, REPLACEMENT, 3);
        *out_len = 3;
    }
    d->n_held = 0;
    d->strip_next = d->strip_prefix;
}

/* --- whole sequences ---------------------------------------------------- */

static moe_status append(grow_buf *b, const char *s, size_t n, moe_error *err) {
    if (!grow_buf_reserve(b, b->len + n + 1, 1)) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory decoding");
    memcpy((char *)b->data + b->len, s, n);
    b->len += n;
    ((char *)b->data)[b->len] = '\0';
    return MOE_OK;
}

moe_status tokenizer_decode(const tokenizer *tk, const int32_t *ids, size_t n_ids, unsigned flags, char **out,
                            size_t *out_len, moe_error *err) {
    *out = NULL;
    *out_len = 0;
    tokenizer_detok *d;
    moe_status st = tokenizer_detok_new(tk, flags, &d, err);
    if (st != MOE_OK) return st;
    grow_buf text = {0};
    const char *bytes;
    size_t n;
    st = append(&text, "", 0, err);
    for (size_t i = 0; i < n_ids && st == MOE_OK; i++) {
        st = tokenizer_detok_push(d, ids[i], &bytes, &n, err);
        if (st == MOE_OK) st = append(&text, bytes, n, err);
    }
    if (st == MOE_OK) {
        tokenizer_detok_flush(d, &bytes, &n);
        st = append(&text, bytes, n, err);
    }
    tokenizer_detok_free(d);
    if (st != MOE_OK) {
        free(text.data);
        return st;
    }
    *out = text.data;
    *out_len = text.len;
    return MOE_OK;
}
