/*
 * tokenizer.h — text to token ids and back, from the vocabulary in a GGUF.
 *
 * The vocabulary is read from the keys llama.cpp's converters write:
 *
 *   tokenizer.ggml.model        "gpt2": byte-level BPE ranked by merges;
 *                               "llama": SentencePiece-style BPE ranked by
 *                               scores, with <0xNN> byte fallback
 *   tokenizer.ggml.pre          the pre-tokenizer of a "gpt2" vocabulary:
 *                               "qwen2", "llama-bpe" (aliases "llama3",
 *                               "llama-v3"), "gpt2", "olmo" or "default"
 *                               (both GPT-2's); absent means "default"
 *   tokenizer.ggml.tokens       string[n_vocab], the token texts
 *   tokenizer.ggml.token_type   int32[n_vocab]: 1 normal, 2 unknown,
 *                               3 control, 4 user-defined, 5 unused, 6 byte
 *                               (absent: all normal)
 *   tokenizer.ggml.merges       string[] "left right", rank = index ("gpt2")
 *   tokenizer.ggml.scores       float32[n_vocab] ("llama")
 *   tokenizer.ggml.{bos,eos,unknown,padding,eot,eom}_token_id
 *   tokenizer.ggml.add_bos_token, add_eos_token, add_space_prefix
 *
 * Everything is validated when loading (array lengths, token types, merges
 * that name tokens, every id against the vocabulary size); a problem is one
 * error naming the key. The loaded tokenizer owns copies of what it needs,
 * so the gguf_file may be closed afterwards, and it is immutable: any number
 * of threads may encode and decode with it at once.
 *
 * What the pre-tokenizer name implies, as in Hugging Face's tokenizer.json
 * files of those models: "qwen2" normalises text to NFC first; "llama-bpe"
 * looks a whole pre-token up in the vocabulary before merging
 * (ignore_merges) and adds BOS by default.
 */
#ifndef MOE_TOKENIZER_H
#define MOE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "moe.h"

typedef struct tokenizer tokenizer;

/* Token types, as stored in tokenizer.ggml.token_type. */
typedef enum token_type {
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
} token_type;

/* Read and validate the vocabulary of `file`. On failure *out is NULL. */
moe_status tokenizer_load(const gguf_file *file, tokenizer **out, moe_error *err);
void tokenizer_free(tokenizer *tk);

/* --- encoding ----------------------------------------------------------- */

enum {
    /* Prepend BOS and append EOS where the vocabulary asks for them
     * (tokenizer.ggml.add_bos_token / add_eos_token). */
    TOKENIZER_ADD_SPECIAL = 1u << 0,
    /* Recognise the text of control tokens (e.g. "<|im_start|>") in the
     * input. User-defined tokens are always recognised, as Hugging Face and
     * llama.cpp do; without this flag control tokens are plain text. */
    TOKENIZER_PARSE_SPECIAL = 1u << 1,
};

/* Encode `len` bytes of `text` (UTF-8; invalid bytes are kept and encoded
 * as bytes, never dropped). Special tokens are matched first, leftmost and
 * then longest; the text between them goes through normalisation, the
 * pre-tokenizer and the model. On success *ids is a malloc'd array of *n_ids
 * ids the caller frees (NULL when empty). Cost: linear in the text apart
 * from the merge loop, O(k log k) for a pre-token of k bytes. */
moe_status tokenizer_encode(const tokenizer *tk, const char *text, size_t len, unsigned flags, int32_t **ids,
                            size_t *n_ids, moe_error *err);

/* The text a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2") uses
 * for the token of one byte: GPT-2's alphabet, where printable bytes stand
 * for themselves and the others for code points from U+0100. Writes the
 * UTF-8 (no terminator) and returns its length. For tools that build
 * vocabularies. */
size_t tokenizer_byte_symbol(uint8_t byte, char out[4]);

/* --- the vocabulary ----------------------------------------------------- */

uint32_t tokenizer_n_vocab(const tokenizer *tk);
/* "gpt2" or "llama", and the pre-tokenizer name as the file spelled it. */
const char *tokenizer_model_name(const tokenizer *tk);
const char *tokenizer_pre_name(const tokenizer *tk);

/* Special ids, -1 when the vocabulary has none. */
int32_t tokenizer_bos(const tokenizer *tk);
int32_t tokenizer_eos(const tokenizer *tk);
int32_t tokenizer_eot(const tokenizer *tk);
int32_t tokenizer_unk(const tokenizer *tk);
int32_t tokenizer_pad(const tokenizer *tk);
bool tokenizer_add_bos(const tokenizer *tk);

/* End of generation: EOS, EOT, EOM, and the control tokens that end a turn
 * in the common chat formats (<|im_end|>, <|eot_id|>, <|endoftext|>, ...):
 * files often name only one of a model's stop tokens. */
bool tokenizer_is_eog(const tokenizer *tk, int32_t id);

/* Type of a token; id must be < n_vocab. */
token_type tokenizer_token_type(const tokenizer *tk, int32_t id);

/* The id of the token whose text is exactly `text`, or -1. */
int32_t tokenizer_find(const tokenizer *tk, const char *text, size_t len);

/* The token's text as stored in the vocabulary (byte-level alphabet, ▁);
 * id must be < n_vocab. Not NUL-terminated; lives as long as tk. */
const char *tokenizer_token_text(const tokenizer *tk, int32_t id, size_t *len);

/* The raw bytes a token decodes to: byte-level BPE maps its alphabet back
 * to bytes, SentencePiece maps ▁ to a space and <0xNN> to the byte;
 * control, unknown, user-defined and unused tokens give their text. A piece
 * may be part of a UTF-8 sequence. id must be < n_vocab. */
const char *tokenizer_piece(const tokenizer *tk, int32_t id, size_t *len);

/* --- decoding ----------------------------------------------------------- */

enum {
    /* Render control, unknown and unused tokens as their text (otherwise
     * they decode to nothing). User-defined tokens are always rendered. */
    TOKENIZER_DECODE_SPECIAL = 1u << 0,
    /* Undo the space a SentencePiece vocabulary prepends (add_space_prefix)
     * at the start of a text and after each special token, so decoding a
     * whole encoded text gives it back. Leave it off when decoding a
     * continuation, e.g. tokens generated after a prompt. */
    TOKENIZER_DECODE_STRIP_PREFIX = 1u << 1,
};

/* A streaming detokenizer: pieces go in token by token, and what comes out
 * is always valid UTF-8. An incomplete trailing sequence is held back until
 * a later token completes it; bytes that cannot be part of valid UTF-8
 * become U+FFFD (one per maximal invalid subpart, as WHATWG decoders do). */
typedef struct tokenizer_detok tokenizer_detok;

moe_status tokenizer_detok_new(const tokenizer *tk, unsigned flags, tokenizer_detok **out, moe_error *err);
void tokenizer_detok_free(tokenizer_detok *d);

/* Decode one token: *out and *out_len receive the bytes ready now (maybe none),
 * valid until the next call on d. An id >= n_vocab is MOE_ERR_RANGE. */
moe_status tokenizer_detok_push(tokenizer_detok *d, int32_t id, const char **out, size_t *out_len, moe_error *err);

/* End of the stream: a held-back incomplete sequence comes out as U+FFFD.
 * The detokenizer is then ready for a new text (flags as at creation). */
void tokenizer_detok_flush(tokenizer_detok *d, const char **out, size_t *out_len);

/* Decode a whole sequence into a malloc'd, NUL-terminated string. */
moe_status tokenizer_decode(const tokenizer *tk, const int32_t *ids, size_t n_ids, unsigned flags, char **out,
                            size_t *out_len, moe_error *err);

#endif
