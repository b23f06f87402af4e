/*
 * tokenizer_internal.h — the tokenizer's data, shared by its source files.
 *
 *   tokenizer.c   loading and validating the vocabulary, accessors
 *   token_map.c   hash tables: token text -> id, (left, right) -> merge
 *   pretokenize.c pre-tokenizer regexes (PCRE2) and NFC (utf8proc)
 *   bpe.c         byte-level BPE: the GPT-2 byte alphabet, merges by rank
 *   spm.c         SentencePiece-style BPE: merges by score, byte fallback
 *   merge.c       the merge loop both models share (a priority queue)
 *   encode.c      the encoder: special tokens, then the model per fragment
 *   detok.c       pieces, the streaming detokenizer, whole decodes
 *   utf8.c        UTF-8 validation shared by NFC and the detokenizer
 */
#ifndef MOE_TOKENIZER_INTERNAL_H
#define MOE_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct pcre2_real_code_8 tokenizer_regex; /* pcre2_code with 8-bit code units */

/* Strings packed in one buffer: string i is bytes[off[i] .. off[i + 1]). */
typedef struct string_table {
    char *bytes;
    uint32_t *off; /* n + 1 entries */
    uint32_t n;
} string_table;

static inline const char *string_at(const string_table *t, uint32_t i, size_t *len) {
    *len = t->off[i + 1] - t->off[i];
    return t->bytes + t->off[i];
}

/* Open addressing, linear probing: slots hold token ids, -1 is empty. The
 * first of several tokens with the same text wins. */
typedef struct token_map {
    int32_t *slots;
    uint32_t mask; /* capacity - 1, capacity a power of two >= 2 n */
} token_map;

/* One merge: (left, right) -> result, with its rank (lower merges first). */
typedef struct merge_slot {
    uint64_t key; /* left << 32 | right; MERGE_EMPTY when free */
    int32_t rank;
    int32_t result;
} merge_slot;

typedef struct merge_map {
    merge_slot *slots;
    uint32_t mask;
} merge_map;

#define MERGE_EMPTY UINT64_MAX

typedef enum tokenizer_model {
    TOKENIZER_MODEL_BPE, /* "gpt2" */
    TOKENIZER_MODEL_SPM, /* "llama" */
} tokenizer_model;

/* A pre-tokenizer: its regex and what its tokenizer.json also does. */
typedef struct pretok_spec {
    const char *name;
    const char *regex;
    bool nfc;           /* normalise to NFC before splitting */
    bool ignore_merges; /* a pre-token that is a token is taken whole */
    bool add_bos;       /* the default of tokenizer.ggml.add_bos_token */
} pretok_spec;

/* First-byte buckets of the texts of tokens matched before the model runs
 * (control, unknown and user-defined), each bucket longest first. */
typedef struct special_index {
    uint32_t start[257]; /* bucket b is ids[start[b] .. start[b + 1]) */
    int32_t *ids;
} special_index;

struct tokenizer {
    tokenizer_model model;
    const pretok_spec *pre; /* BPE only */
    char pre_name[64];
    tokenizer_regex *regex; /* BPE only: compiled pre->regex */

    uint32_t n_vocab;
    string_table text;  /* token texts as stored */
    string_table piece; /* the bytes each token decodes to */
    uint8_t *type;      /* token_type per token */
    float *score;       /* SPM only */
    size_t max_text;    /* longest token text in bytes */
    size_t max_piece;   /* longest piece in bytes */

    token_map by_text; /* every token by its text */
    merge_map merges;  /* BPE only */
    /* The token of each byte: BPE its alphabet character, SPM <0xNN>; -1
     * when the vocabulary has none. */
    int32_t byte_token[256];
    char alpha[256][2]; /* BPE: each byte's alphabet character, UTF-8 */
    uint8_t alpha_len[256];
    special_index specials;

    int32_t bos, eos, eot, eom, unk, pad; /* -1: none */
    int32_t *eog;                         /* end-of-generation ids */
    size_t n_eog;
    bool add_bos, add_eos, add_space_prefix;
    bool spm_word_split; /* SPM: no normal token has a ▁ after another
                            character, so words merge independently */
};

/* A growable buffer of bytes or ids, for the encoder's scratch space. */
typedef struct grow_buf {
    void *data;
    size_t len, cap; /* in elements */
} grow_buf;

/* Make room for `need` elements of `elem` bytes; false when out of memory. */
bool grow_buf_reserve(grow_buf *b, size_t need, size_t elem);

/* One encode call: the output and scratch reused across fragments. */
typedef struct encode_state {
    const tokenizer *tk;
    moe_error *err;
    grow_buf ids;     /* int32_t: the output */
    grow_buf text;    /* char: a normalised or escaped fragment */
    grow_buf word;    /* char: a pre-token in the byte alphabet */
    grow_buf symbols; /* merge_symbol */
    grow_buf queue;   /* merge_candidate */
} encode_state;

/* Append one id / the byte-fallback ids of bytes (unk for a byte without
 * a token; an error when there is neither). */
moe_status encode_push(encode_state *es, int32_t id);
moe_status encode_push_bytes(encode_state *es, const uint8_t *bytes, size_t n);

/* merge.c: both models repeatedly merge the best adjacent pair of symbols,
 * a symbol being a run of the input that is (or may become) one token. */
typedef struct merge_symbol {
    int32_t id;         /* its token, -1 when the run is no token */
    int32_t prev, next; /* neighbours, -1 at the ends */
    uint32_t pos, len;  /* the run in the input; len 0: merged away */
} merge_symbol;

/* A possible merge of symbols left and right into token `result`. Lower
 * keys merge first: the model's priority in the high 32 bits, the left
 * symbol's index in the low ones, so ties go to the leftmost pair as in
 * every reference implementation. */
typedef struct merge_candidate {
    uint64_t key;
    int32_t left, right, result;
    uint32_t len; /* left + right bytes when queued: detects stale entries */
} merge_candidate;

/* The model's ranking of the pair (l, r), adjacent in `input`: true with
 * the priority (lower first) and the merged token, or false when the pair
 * does not merge. */
typedef bool (*merge_rank_fn)(const encode_state *es, const char *input, const merge_symbol *l, const merge_symbol *r,
                              uint32_t *priority, int32_t *result);

/* Split `len` bytes of input into symbols (one per byte when by_byte, else
 * one per UTF-8 character or invalid byte), with ids from first_id, merge
 * until no pair merges, and append the symbols' ids to es->ids (bytes for a
 * symbol that is no token). */
typedef int32_t (*merge_first_id_fn)(const encode_state *es, const char *s, size_t len);
moe_status merge_encode(encode_state *es, const char *input, size_t len, bool by_byte, merge_first_id_fn first_id,
                        merge_rank_fn rank);

/* token_map.c */
bool token_map_build(token_map *m, const string_table *texts);
int32_t token_map_find(const token_map *m, const string_table *texts, const char *s, size_t len);
void token_map_free(token_map *m);
bool merge_map_init(merge_map *m, size_t n);
/* false when (left, right) is already there: the earlier rank stays. */
bool merge_map_insert(merge_map *m, int32_t left, int32_t right, int32_t rank, int32_t result);
const merge_slot *merge_map_find(const merge_map *m, int32_t left, int32_t right);
void merge_map_free(merge_map *m);

/* utf8.c: the length of the sequence at s (n > 0 bytes available): > 0 a
 * complete valid sequence of that many bytes; 0 a valid but incomplete
 * prefix (needs more bytes); < 0 invalid, and -result bytes form the
 * maximal invalid subpart to replace with one U+FFFD. */
int utf8_sequence(const uint8_t *s, size_t n);
size_t utf8_encode(uint32_t cp, char out[4]);

/* pretokenize.c */
const pretok_spec *pretok_find(const char *name, size_t len);
moe_status pretok_compile(tokenizer *tk, moe_error *err);
/* NFC of the valid UTF-8 runs of text into out (invalid bytes copied). */
moe_status pretok_nfc(const char *text, size_t len, grow_buf *out, moe_error *err);
/* Split text with the regex and BPE-encode each piece, matched or not. */
moe_status pretok_encode(encode_state *es, const char *text, size_t len);

/* bpe.c: the GPT-2 byte alphabet; encoding one pre-token. */
void bpe_byte_alphabet(uint32_t cp_of_byte[256]);
moe_status bpe_encode_piece(encode_state *es, const char *piece, size_t len);

/* spm.c: encode one fragment of text; `prefix` prepends the ▁ of
 * add_space_prefix. */
moe_status spm_encode(encode_state *es, const char *text, size_t len, bool prefix);

/* detok.c: build tk->piece from tk->text (the model and types are set). */
moe_status detok_build_pieces(tokenizer *tk, moe_error *err);

#endif
