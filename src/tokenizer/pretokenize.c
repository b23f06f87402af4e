/*
 * pretokenize.c — splitting text into pre-tokens, and NFC.
 *
 * A byte-level BPE vocabulary is trained on pieces cut by one regex, and
 * encoding must cut text the same way. The regexes below are the ones the
 * models' tokenizer.json files carry (GPT-2's is also its encoder.py's),
 * run by PCRE2 in UTF mode with Unicode properties (UCP), so \p{L}, \p{N}
 * and \s are Unicode's. Two deliberate details:
 *
 * - Llama-3 and Qwen2 write the contractions as (?i:'s|'t|...). Unicode
 *   case folding would let 's also match U+017F (long s) after the
 *   apostrophe; Hugging Face's JavaScript port and llama.cpp both spell the
 *   group out as ASCII [sS] classes, and so do we.
 * - Split semantics are "isolated": every match is a piece, and so is any
 *   text between matches (these regexes leave none for valid UTF-8, but
 *   invalid bytes never match under PCRE2_MATCH_INVALID_UTF and must still
 *   be encoded).
 *
 * \s follows PCRE2's Unicode definition (Z categories plus \h and \v), which
 * agrees with Hugging Face's Rust tokenizers (Oniguruma); JavaScript's \s
 * differs on U+0085, U+180E and U+FEFF.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/* Llama-3 (tiktoken's cl100k pattern): digits in groups of 1 to 3. */
#define LLAMA3_REGEX                                                                                                   \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"                           \
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen2 and Qwen3: as Llama-3 but every digit on its own. */
#define QWEN2_REGEX                                                                                                    \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"                                \
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Names as llama.cpp's converters write them. "default" is what a file
 * without the key gets; we give it GPT-2's regex, the original byte-level
 * pre-tokenizer. */
static const pretok_spec pretok_specs[] = {
    {"default", GPT2_REGEX, false, false, false},
    {"gpt2", GPT2_REGEX, false, false, false},
    {"olmo", GPT2_REGEX, false, false, false},
    {"qwen2", QWEN2_REGEX, true, false, false},
    {"llama-bpe", LLAMA3_REGEX, false, true, true},
    {"llama3", LLAMA3_REGEX, false, true, true},
    {"llama-v3", LLAMA3_REGEX, false, true, true},
};

const pretok_spec *pretok_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof pretok_specs / sizeof pretok_specs[0]; i++)
        if (strlen(pretok_specs[i].name) == len && memcmp(pretok_specs[i].name, name, len) == 0)
            return &pretok_specs[i];
    return NULL;
}

moe_status pretok_compile(tokenizer *tk, moe_error *err) {
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tk->pre->regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR why[256];
        pcre2_get_error_message(code, why, sizeof why);
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "pre-tokenizer '%s': PCRE2 cannot compile its regex: %s",
                             tk->pre->name, (const char *)why);
    }
    /* JIT makes splitting several times faster; where PCRE2 was built
     * without it, pcre2_match interprets the same pattern. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    tk->regex = re;
    return MOE_OK;
}

static moe_status append_bytes(grow_buf *out, const void *bytes, size_t n, moe_error *err) {
    if (n == 0) return MOE_OK;
    if (!grow_buf_reserve(out, out->len + n, 1))
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory normalising text");
    memcpy((char *)out->data + out->len, bytes, n);
    out->len += n;
    return MOE_OK;
}

/* NFC of one valid UTF-8 run; ASCII is already NFC and is copied. */
static moe_status append_nfc(grow_buf *out, const char *run, size_t n, bool ascii, moe_error *err) {
    if (ascii) return append_bytes(out, run, n, err);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t got =
        utf8proc_map((const utf8proc_uint8_t *)run, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (got < 0)
        return moe_error_set(err, got == UTF8PROC_ERROR_NOMEM ? MOE_ERR_NOMEM : MOE_ERR_INVALID_ARG,
                             "NFC normalisation failed: %s", utf8proc_errmsg(got));
    moe_status st = append_bytes(out, nfc, (size_t)got, err);
    free(nfc);
    return st;
}

/* Invalid bytes cannot be normalised; they are kept as they are (the BPE
 * encodes them as bytes) and the valid runs around them are normalised. */
moe_status pretok_nfc(const char *text, size_t len, grow_buf *out, moe_error *err) {
    const uint8_t *s = (const uint8_t *)text;
    out->len = 0;
    for (size_t i = 0; i < len;) {
        size_t start = i;
        bool ascii = true;
        int k;
        while (i < len && (k = utf8_sequence(s + i, len - i)) > 0) {
            ascii &= k == 1;
            i += (size_t)k;
        }
        moe_status st = append_nfc(out, text + start, i - start, ascii, err);
        if (st != MOE_OK) return st;
        if (i == len) break;
        k = utf8_sequence(s + i, len - i);
        size_t bad = k == 0 ? len - i : (size_t)-k;
        if ((st = append_bytes(out, text + i, bad, err)) != MOE_OK) return st;
        i += bad;
    }
    return MOE_OK;
}

moe_status pretok_encode(encode_state *es, const char *text, size_t len) {
    const tokenizer *tk = es->tk;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(tk->regex, NULL);
    if (!md) return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory splitting text");
    moe_status st = MOE_OK;
    size_t done = 0; /* the text before this is encoded */
    while (done < len && st == MOE_OK) {
        int rc = pcre2_match(tk->regex, (PCRE2_SPTR)text, len, done, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR why[256];
            pcre2_get_error_message(rc, why, sizeof why);
            st = moe_error_set(es->err, MOE_ERR_RANGE, "pre-tokenizer '%s' failed at byte %zu: %s", tk->pre->name, done,
                               (const char *)why);
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        /* None of the patterns matches the empty string; were one to, the
         * rest of the text would become one piece rather than a loop. */
        if (ov[1] == ov[0]) break;
        if (ov[0] > done) st = bpe_encode_piece(es, text + done, ov[0] - done);
        if (st == MOE_OK) st = bpe_encode_piece(es, text + ov[0], ov[1] - ov[0]);
        done = ov[1];
    }
    if (st == MOE_OK && done < len) st = bpe_encode_piece(es, text + done, len - done);
    pcre2_match_data_free(md);
    return st;
}
