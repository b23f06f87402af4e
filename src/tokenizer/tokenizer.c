/*
 * tokenizer.c — loading a vocabulary from GGUF metadata (see tokenizer.h).
 *
 * Loading copies the token texts into one buffer, checks every key it uses
 * against the vocabulary, and builds what encoding needs: the text -> id
 * table, the merge table, the token of each byte, the special tokens by
 * first byte, and each token's decoded piece.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <assert.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

#define KEY_PREFIX "tokenizer.ggml."
/* Bounded length when quoting a file's string in a message. */
#define QUOTE_MAX 64
#define QUOTE(s) (int)((s).len < QUOTE_MAX ? (s).len : QUOTE_MAX), (s).data

/* --- model and pre-tokenizer ------------------------------------------- */

static moe_status load_model(tokenizer *tk, const gguf_file *f, moe_error *err) {
    gguf_str model;
    moe_status st = gguf_get_str(f, KEY_PREFIX "model", &model, err);
    if (st != MOE_OK) return st;
    if (gguf_str_eq(model, "gpt2"))
        tk->model = TOKENIZER_MODEL_BPE;
    else if (gguf_str_eq(model, "llama"))
        tk->model = TOKENIZER_MODEL_SPM;
    else
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             KEY_PREFIX "model is '%.*s'; supported are 'gpt2' (byte-level BPE) and 'llama' "
                                        "(SentencePiece-style BPE)",
                             QUOTE(model));
    gguf_str pre = {.len = 7, .data = "default"};
    if (gguf_find(f, KEY_PREFIX "pre") && (st = gguf_get_str(f, KEY_PREFIX "pre", &pre, err)) != MOE_OK) return st;
    snprintf(tk->pre_name, sizeof tk->pre_name, "%.*s", QUOTE(pre));
    /* SentencePiece vocabularies have no pre-tokenizer; llama.cpp ignores
     * the key for them and so do we. */
    if (tk->model == TOKENIZER_MODEL_SPM) return MOE_OK;
    tk->pre = pretok_find(pre.data, pre.len);
    if (!tk->pre)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             KEY_PREFIX "pre is '%.*s', a pre-tokenizer moe.c does not know (known: default, gpt2, "
                                        "olmo, qwen2, llama-bpe, llama3, llama-v3)",
                             QUOTE(pre));
    return MOE_OK;
}

/* --- tokens, types, scores ---------------------------------------------- */

static moe_status load_tokens(tokenizer *tk, const gguf_file *f, moe_error *err) {
    const gguf_array *arr;
    moe_status st = gguf_get_array(f, KEY_PREFIX "tokens", GGUF_TYPE_STRING, &arr, err);
    if (st != MOE_OK) return st;
    if (arr->n == 0) return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "tokens is empty");
    if (arr->n > INT32_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, KEY_PREFIX "tokens has %llu entries; the limit is %d",
                             (unsigned long long)arr->n, INT32_MAX);
    uint64_t total = 0;
    for (uint64_t i = 0; i < arr->n; i++) total += gguf_array_get_str(arr, i).len;
    if (total >= UINT32_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, KEY_PREFIX "tokens holds %llu bytes of text; the limit is 4 GiB",
                             (unsigned long long)total);
    tk->n_vocab = (uint32_t)arr->n;
    string_table *t = &tk->text;
    t->n = tk->n_vocab;
    t->bytes = malloc(total + 1);
    t->off = malloc(((size_t)t->n + 1) * sizeof *t->off);
    tk->type = malloc(t->n);
    if (!t->bytes || !t->off || !tk->type) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the vocabulary");
    uint32_t at = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        gguf_str s = gguf_array_get_str(arr, i);
        t->off[i] = at;
        memcpy(t->bytes + at, s.data, s.len);
        at += (uint32_t)s.len;
        if (s.len > tk->max_text) tk->max_text = s.len;
    }
    t->off[t->n] = at;
    return MOE_OK;
}

static bool is_integer_type(gguf_value_type type) {
    return type <= GGUF_TYPE_INT32 || type == GGUF_TYPE_UINT64 || type == GGUF_TYPE_INT64;
}

/* Absent: every token is normal, as llama.cpp assumes. */
static moe_status load_types(tokenizer *tk, const gguf_file *f, moe_error *err) {
    memset(tk->type, TOKEN_TYPE_NORMAL, tk->n_vocab);
    if (!gguf_find(f, KEY_PREFIX "token_type")) return MOE_OK;
    const gguf_array *arr;
    moe_status st = gguf_get_array(f, KEY_PREFIX "token_type", GGUF_TYPE_COUNT, &arr, err);
    if (st != MOE_OK) return st;
    if (!is_integer_type(arr->type))
        return moe_error_set(err, MOE_ERR_TYPE, KEY_PREFIX "token_type: expected an integer array, found %s",
                             gguf_value_type_name(arr->type));
    if (arr->n != tk->n_vocab)
        return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "token_type has %llu entries for %u tokens",
                             (unsigned long long)arr->n, tk->n_vocab);
    for (uint32_t i = 0; i < tk->n_vocab; i++) {
        int64_t type = gguf_array_get_i64(arr, i);
        if (type < TOKEN_TYPE_NORMAL || type > TOKEN_TYPE_BYTE)
            return moe_error_set(err, MOE_ERR_FORMAT,
                                 KEY_PREFIX "token_type[%u] is %lld; token types are 1 (normal) to 6 (byte)", i,
                                 (long long)type);
        tk->type[i] = (uint8_t)type;
    }
    return MOE_OK;
}

static moe_status load_scores(tokenizer *tk, const gguf_file *f, moe_error *err) {
    const gguf_array *arr;
    moe_status st = gguf_get_array(f, KEY_PREFIX "scores", GGUF_TYPE_FLOAT32, &arr, err);
    if (st != MOE_OK) return st;
    if (arr->n != tk->n_vocab)
        return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "scores has %llu entries for %u tokens",
                             (unsigned long long)arr->n, tk->n_vocab);
    tk->score = malloc((size_t)tk->n_vocab * sizeof *tk->score);
    if (!tk->score) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the token scores");
    for (uint32_t i = 0; i < tk->n_vocab; i++) {
        tk->score[i] = (float)gguf_array_get_f64(arr, i);
        if (isnan(tk->score[i])) return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "scores[%u] is NaN", i);
    }
    return MOE_OK;
}

/* --- merges ------------------------------------------------------------- */

/* One "left right" merge: both sides and their concatenation must be
 * tokens (Hugging Face refuses such a file too). The split is at the first
 * space after the first byte, as llama.cpp splits, so a left side of " "
 * still parses. */
static moe_status add_merge(tokenizer *tk, gguf_str m, int32_t rank, char *joined, moe_error *err) {
    const char *space = m.len > 1 ? memchr(m.data + 1, ' ', m.len - 1) : NULL;
    if (!space)
        return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "merges[%d] '%.*s' is not two tokens and a space", rank,
                             QUOTE(m));
    size_t left_len = (size_t)(space - m.data), right_len = m.len - left_len - 1;
    int32_t left = token_map_find(&tk->by_text, &tk->text, m.data, left_len);
    int32_t right = token_map_find(&tk->by_text, &tk->text, space + 1, right_len);
    memcpy(joined, m.data, left_len);
    memcpy(joined + left_len, space + 1, right_len);
    int32_t result = token_map_find(&tk->by_text, &tk->text, joined, left_len + right_len);
    const char *missing = left < 0 ? "left side" : right < 0 ? "right side" : "merged text";
    if (left < 0 || right < 0 || result < 0)
        return moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "merges[%d] '%.*s': the %s is not a token", rank, QUOTE(m),
                             missing);
    /* A repeated pair keeps its first (better) rank, as in llama.cpp. */
    merge_map_insert(&tk->merges, left, right, rank, result);
    return MOE_OK;
}

static moe_status load_merges(tokenizer *tk, const gguf_file *f, moe_error *err) {
    const gguf_array *arr;
    moe_status st = gguf_get_array(f, KEY_PREFIX "merges", GGUF_TYPE_STRING, &arr, err);
    if (st != MOE_OK) return st;
    if (arr->n > INT32_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, KEY_PREFIX "merges has %llu entries; the limit is %d",
                             (unsigned long long)arr->n, INT32_MAX);
    char *joined = malloc(2 * tk->max_text + 1);
    if (!joined || !merge_map_init(&tk->merges, arr->n)) {
        free(joined);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the merges");
    }
    for (uint64_t i = 0; i < arr->n && st == MOE_OK; i++) {
        gguf_str m = gguf_array_get_str(arr, i);
        /* A side longer than any token cannot name one. */
        st = m.len > 2 * tk->max_text + 1
                 ? moe_error_set(err, MOE_ERR_FORMAT, KEY_PREFIX "merges[%llu] is longer than two tokens",
                                 (unsigned long long)i)
                 : add_merge(tk, m, (int32_t)i, joined, err);
    }
    free(joined);
    return st;
}

/* --- special ids and flags ---------------------------------------------- */

static moe_status load_id(const tokenizer *tk, const gguf_file *f, const char *key, int32_t *id, moe_error *err) {
    if (!gguf_find(f, key)) return MOE_OK;
    int64_t v;
    moe_status st = gguf_get_i64(f, key, &v, err);
    if (st != MOE_OK) return st;
    if (v < 0 || v >= tk->n_vocab)
        return moe_error_set(err, MOE_ERR_RANGE, "%s is %lld, outside the vocabulary of %u tokens", key, (long long)v,
                             tk->n_vocab);
    *id = (int32_t)v;
    return MOE_OK;
}

static moe_status load_special_ids(tokenizer *tk, const gguf_file *f, moe_error *err) {
    const struct {
        const char *key;
        int32_t *id;
    } ids[] = {
        {KEY_PREFIX "bos_token_id", &tk->bos},     {KEY_PREFIX "eos_token_id", &tk->eos},
        {KEY_PREFIX "eot_token_id", &tk->eot},     {KEY_PREFIX "eom_token_id", &tk->eom},
        {KEY_PREFIX "unknown_token_id", &tk->unk}, {KEY_PREFIX "padding_token_id", &tk->pad},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        moe_status st = load_id(tk, f, ids[i].key, ids[i].id, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static moe_status load_flag(const gguf_file *f, const char *key, bool *flag, moe_error *err) {
    return gguf_find(f, key) ? gguf_get_bool(f, key, flag, err) : MOE_OK;
}

/* Defaults as llama.cpp's: SentencePiece adds BOS and the dummy prefix,
 * byte-level BPE neither, except that Llama-3's pre-tokenizer adds BOS. */
static moe_status load_flags(tokenizer *tk, const gguf_file *f, moe_error *err) {
    bool spm = tk->model == TOKENIZER_MODEL_SPM;
    tk->add_bos = spm || tk->pre->add_bos;
    tk->add_space_prefix = spm;
    moe_status st = load_flag(f, KEY_PREFIX "add_bos_token", &tk->add_bos, err);
    if (st == MOE_OK) st = load_flag(f, KEY_PREFIX "add_eos_token", &tk->add_eos, err);
    /* Only SentencePiece prepends a space; byte-level BPE ignores the key,
     * as llama.cpp does. */
    if (st == MOE_OK && spm) st = load_flag(f, KEY_PREFIX "add_space_prefix", &tk->add_space_prefix, err);
    return st;
}

/* --- indexes ------------------------------------------------------------ */

static void index_bytes(tokenizer *tk) {
    uint32_t cp_of_byte[256];
    bpe_byte_alphabet(cp_of_byte);
    for (int b = 0; b < 256; b++) {
        char text[8];
        size_t len;
        if (tk->model == TOKENIZER_MODEL_BPE) {
            tk->alpha_len[b] = (uint8_t)utf8_encode(cp_of_byte[b], tk->alpha[b]);
            memcpy(text, tk->alpha[b], tk->alpha_len[b]);
            len = tk->alpha_len[b];
        } else {
            len = (size_t)snprintf(text, sizeof text, "<0x%02X>", b);
        }
        tk->byte_token[b] = token_map_find(&tk->by_text, &tk->text, text, len);
    }
}

typedef struct special_entry {
    uint8_t first;
    uint32_t len;
    int32_t id;
} special_entry;

/* By first byte, then longest first, then lowest id. */
static int special_entry_cmp(const void *a, const void *b) {
    const special_entry *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool is_matched_type(uint8_t type) {
    return type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN || type == TOKEN_TYPE_USER_DEFINED;
}

static moe_status index_specials(tokenizer *tk, moe_error *err) {
    size_t n = 0;
    for (uint32_t id = 0; id < tk->n_vocab; id++)
        n += is_matched_type(tk->type[id]) && tk->text.off[id + 1] > tk->text.off[id];
    special_entry *entries = malloc((n ? n : 1) * sizeof *entries);
    tk->specials.ids = malloc((n ? n : 1) * sizeof *tk->specials.ids);
    if (!entries || !tk->specials.ids) {
        free(entries);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the special tokens");
    }
    n = 0;
    for (uint32_t id = 0; id < tk->n_vocab; id++) {
        size_t len;
        const char *text = string_at(&tk->text, id, &len);
        if (is_matched_type(tk->type[id]) && len > 0)
            entries[n++] = (special_entry){.first = (uint8_t)text[0], .len = (uint32_t)len, .id = (int32_t)id};
    }
    qsort(entries, n, sizeof *entries, special_entry_cmp);
    memset(tk->specials.start, 0, sizeof tk->specials.start);
    for (size_t i = 0; i < n; i++) {
        tk->specials.ids[i] = entries[i].id;
        tk->specials.start[entries[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++) tk->specials.start[b + 1] += tk->specials.start[b];
    free(entries);
    return MOE_OK;
}

/* Whether a normal token has a ▁ right after a character other than ▁:
 * only then can a merge cross the start of a word (see spm.c). */
static bool spm_tokens_cross_words(const tokenizer *tk) {
    static const char mark[] = "\xE2\x96\x81";
    for (uint32_t id = 0; id < tk->n_vocab; id++) {
        size_t len;
        const char *t = string_at(&tk->text, id, &len);
        for (size_t i = 1; tk->type[id] == TOKEN_TYPE_NORMAL && i + 3 <= len; i++)
            if (memcmp(t + i, mark, 3) == 0 && !(i >= 3 && memcmp(t + i - 3, mark, 3) == 0)) return true;
    }
    return false;
}

/* Control tokens that end a turn in the common chat formats. */
static const char *const eog_texts[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
};

static void add_eog(tokenizer *tk, int32_t id) {
    if (id < 0) return;
    for (size_t i = 0; i < tk->n_eog; i++)
        if (tk->eog[i] == id) return;
    tk->eog[tk->n_eog++] = id;
}

static moe_status index_eog(tokenizer *tk, moe_error *err) {
    size_t n_texts = sizeof eog_texts / sizeof eog_texts[0];
    tk->eog = malloc((3 + n_texts) * sizeof *tk->eog);
    if (!tk->eog) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    add_eog(tk, tk->eos);
    add_eog(tk, tk->eot);
    add_eog(tk, tk->eom);
    for (size_t i = 0; i < n_texts; i++) {
        int32_t id = tokenizer_find(tk, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && tk->type[id] == TOKEN_TYPE_CONTROL) add_eog(tk, id);
    }
    return MOE_OK;
}

/* --- load and free ------------------------------------------------------ */

static moe_status load_all(tokenizer *tk, const gguf_file *f, moe_error *err) {
    moe_status st = load_model(tk, f, err);
    if (st == MOE_OK) st = load_tokens(tk, f, err);
    if (st == MOE_OK) st = load_types(tk, f, err);
    if (st == MOE_OK && !token_map_build(&tk->by_text, &tk->text))
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the vocabulary index");
    if (st == MOE_OK) st = tk->model == TOKENIZER_MODEL_SPM ? load_scores(tk, f, err) : load_merges(tk, f, err);
    if (st == MOE_OK) st = load_special_ids(tk, f, err);
    if (st == MOE_OK) st = load_flags(tk, f, err);
    if (st != MOE_OK) return st;
    index_bytes(tk);
    tk->spm_word_split = tk->model == TOKENIZER_MODEL_SPM && !spm_tokens_cross_words(tk);
    st = index_specials(tk, err);
    if (st == MOE_OK) st = index_eog(tk, err);
    if (st == MOE_OK) st = detok_build_pieces(tk, err);
    if (st == MOE_OK && tk->model == TOKENIZER_MODEL_BPE) st = pretok_compile(tk, err);
    return st;
}

moe_status tokenizer_load(const gguf_file *file, tokenizer **out, moe_error *err) {
    *out = NULL;
    tokenizer *tk = calloc(1, sizeof *tk);
    if (!tk) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the tokenizer");
    tk->bos = tk->eos = tk->eot = tk->eom = tk->unk = tk->pad = -1;
    moe_status st = load_all(tk, file, err);
    if (st != MOE_OK) {
        tokenizer_free(tk);
        return st;
    }
    *out = tk;
    return MOE_OK;
}

static void string_table_free(string_table *t) {
    free(t->bytes);
    free(t->off);
}

void tokenizer_free(tokenizer *tk) {
    if (!tk) return;
    pcre2_code_free(tk->regex);
    string_table_free(&tk->text);
    string_table_free(&tk->piece);
    free(tk->type);
    free(tk->score);
    token_map_free(&tk->by_text);
    merge_map_free(&tk->merges);
    free(tk->specials.ids);
    free(tk->eog);
    free(tk);
}

/* --- accessors ---------------------------------------------------------- */

uint32_t tokenizer_n_vocab(const tokenizer *tk) { return tk->n_vocab; }
const char *tokenizer_model_name(const tokenizer *tk) { return tk->model == TOKENIZER_MODEL_BPE ? "gpt2" : "llama"; }
const char *tokenizer_pre_name(const tokenizer *tk) { return tk->pre_name; }
int32_t tokenizer_bos(const tokenizer *tk) { return tk->bos; }
int32_t tokenizer_eos(const tokenizer *tk) { return tk->eos; }
int32_t tokenizer_eot(const tokenizer *tk) { return tk->eot; }
int32_t tokenizer_unk(const tokenizer *tk) { return tk->unk; }
int32_t tokenizer_pad(const tokenizer *tk) { return tk->pad; }
bool tokenizer_add_bos(const tokenizer *tk) { return tk->add_bos; }
token_type tokenizer_token_type(const tokenizer *tk, int32_t id) {
    assert(id >= 0 && (uint32_t)id < tk->n_vocab);
    return (token_type)tk->type[id];
}

bool tokenizer_is_eog(const tokenizer *tk, int32_t id) {
    for (size_t i = 0; i < tk->n_eog; i++)
        if (tk->eog[i] == id) return true;
    return false;
}

int32_t tokenizer_find(const tokenizer *tk, const char *text, size_t len) {
    return token_map_find(&tk->by_text, &tk->text, text, len);
}

const char *tokenizer_token_text(const tokenizer *tk, int32_t id, size_t *len) {
    assert(id >= 0 && (uint32_t)id < tk->n_vocab);
    return string_at(&tk->text, (uint32_t)id, len);
}
