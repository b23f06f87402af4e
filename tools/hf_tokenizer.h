/*
 * hf_tokenizer.h — a Hugging Face tokenizer as GGUF tokenizer keys.
 *
 * Reads tokenizer.json (and, when given, tokenizer_config.json) and sets on
 * a gguf_writer the keys src/tokenizer reads, in llama.cpp's conventions:
 *
 *   tokenizer.ggml.model       "gpt2" for byte-level BPE, "llama" for
 *                              SentencePiece-style BPE (byte_fallback, ▁)
 *   tokenizer.ggml.pre         from the pre-tokenizer's regex: "qwen2",
 *                              "llama-bpe" or "gpt2" (byte-level only)
 *   tokenizer.ggml.tokens      every id, added tokens included; ids no
 *                              token has become "[PAD<id>]", type unused
 *   tokenizer.ggml.token_type  special added tokens control, other added
 *                              tokens user-defined, the unk token unknown,
 *                              <0xNN> byte (SentencePiece), else normal
 *   tokenizer.ggml.merges      "left right" (byte-level; both the string and
 *                              the [left, right] forms of tokenizer.json)
 *   tokenizer.ggml.scores      SentencePiece: the merge order as scores,
 *                              the token of merge r scoring -r
 *   tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token,
 *   add_eos_token, add_space_prefix, and tokenizer.chat_template
 *
 * What moe.c's tokenizer cannot reproduce is refused with one error naming
 * it: another model type, an unknown pre-tokenizer regex, a normaliser other
 * than the one the pre-tokenizer implies (NFC for qwen2 only).
 */
#ifndef MOE_TOOLS_HF_TOKENIZER_H
#define MOE_TOOLS_HF_TOKENIZER_H

#include "gguf/gguf.h"
#include "moe.h"

/* tokenizer_config_json may be NULL (then no special ids beyond the
 * model's unk token, no add_* flags and no chat template are written).
 * n_vocab is the model's vocabulary (its embedding rows), 0 when there is
 * no model: ids below it that no token has get placeholders too, as
 * llama.cpp's converter pads them, so every id the model can produce has a
 * token; a tokenizer with ids beyond it is refused. */
moe_status hf_tokenizer_to_gguf(const char *tokenizer_json, const char *tokenizer_config_json, uint32_t n_vocab,
                                gguf_writer *w, moe_error *err);

#endif
