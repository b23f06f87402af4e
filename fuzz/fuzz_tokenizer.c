/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer (src/tokenizer).
 *
 * The first byte picks the mode.
 *
 * Below 0x80, the rest is text for a fixed byte-level BPE vocabulary built
 * once (gpt2 model, qwen2 pre-tokenizer, a few merges, control and
 * user-defined tokens, EOS added), and bits 0-2 of the first byte are the
 * flags: parse special, add special, and decode special for the streaming
 * detokenizer. The pieces of the ids must spell the input the way the
 * encoder promises to keep it: special tokens as their text and the text
 * between them in NFC (qwen2 normalises), invalid bytes as they were. So
 * for valid UTF-8, decode(encode(x)) is x, up to NFC. Any input must also
 * come out of the streaming detokenizer as valid UTF-8.
 *
 * 0x80 and above, the rest describes a vocabulary (see vocab_writer) that is
 * written as GGUF, read back and loaded: a malformed one must be refused
 * with a message, and one that loads must encode and decode the input, with
 * the same checks where it is byte-level and has every byte.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utf8proc.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) __builtin_trap();                                                                                 \
    } while (0)

static volatile uint64_t sink;

/* --- bytes and UTF-8 ------------------------------------------------------ */

typedef struct buf {
    char *data;
    size_t len, cap;
} buf;

static void put(buf *b, const void *s, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = 2 * (b->len + n) + 64;
        b->data = realloc(b->data, b->cap);
        REQUIRE(b->data);
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
}

/* The length of the valid UTF-8 character at s (n > 0 bytes), 0 when there
 * is none: written from the definition, not shared with the tokenizer. */
static size_t utf8_char(const uint8_t *s, size_t n) {
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = s[0] < 0x80             ? 1
                 : (s[0] & 0xE0) == 0xC0 ? 2
                 : (s[0] & 0xF0) == 0xE0 ? 3
                 : (s[0] & 0xF8) == 0xF0 ? 4
                                         : 0;
    if (len == 0 || len > n) return 0;
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    return cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : len;
}

static bool equal(const buf *b, const char *s, size_t n) {
    return b->len == n && (n == 0 || memcmp(b->data, s, n) == 0);
}

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k)
        if ((k = utf8_char((const uint8_t *)s + i, n - i)) == 0) return false;
    return true;
}

/* NFC of the valid runs of s; invalid bytes are kept. */
static void put_nfc(buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t end = i, k;
        while (end < n && (k = utf8_char((const uint8_t *)s + end, n - end)) > 0)
            end += k;
        if (end > i) {
            utf8proc_uint8_t *nfc = NULL;
            utf8proc_ssize_t got = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(end - i), &nfc,
                                                UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            REQUIRE(got >= 0);
            put(b, nfc, (size_t)got);
            free(nfc);
        }
        if (end < n) put(b, s + end, 1), end++;
        i = end;
    }
}

/* --- writing a vocabulary and loading it --------------------------------- */

/* Writes w (freed) to memory, reads it back and loads the tokenizer. The
 * GGUF side must work: only the vocabulary may be refused. */
static moe_status load(gguf_writer *w, tokenizer **tk, moe_error *err) {
    int fd = memfd_create("vocab", 0);
    REQUIRE(fd >= 0);
    REQUIRE(gguf_writer_begin(w, fd, err) == MOE_OK && gguf_writer_end(w, err) == MOE_OK);
    gguf_writer_free(w);
    off_t size = lseek(fd, 0, SEEK_END);
    void *bytes = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    REQUIRE(size > 0 && bytes != MAP_FAILED);
    gguf_file *f = NULL;
    REQUIRE(gguf_open_memory(bytes, (size_t)size, &f, err) == MOE_OK);
    moe_status st = tokenizer_load(f, tk, err); /* the tokenizer copies what it keeps */
    gguf_close(f);
    munmap(bytes, (size_t)size);
    close(fd);
    return st;
}

static void set_strings(gguf_writer *w, const char *key, const gguf_str *s, size_t n) {
    gguf_value *items = calloc(n + 1, sizeof *items);
    REQUIRE(items);
    for (size_t i = 0; i < n; i++)
        items[i] = (gguf_value){.type = GGUF_TYPE_STRING, .str = s[i]};
    gguf_value v = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_STRING, .n = n, .items = items}};
    moe_error err;
    REQUIRE(gguf_writer_set_value(w, key, &v, &err) == MOE_OK);
    free(items);
}

/* --- what an encoding must spell ------------------------------------------ */

static void put_text(buf *b, const char *s, size_t n, bool nfc) {
    if (nfc)
        put_nfc(b, s, n);
    else
        put(b, s, n);
}

/* Tokens the encoder matches in the text before the model runs. */
static bool is_special(const tokenizer *tk, int32_t id) {
    token_type type = tokenizer_token_type(tk, id);
    return type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN || type == TOKEN_TYPE_USER_DEFINED;
}

/* What tokenizer_encode(tk, text) (without BOS and EOS) must give when the
 * vocabulary is byte-level with a normal token for every byte, so that no
 * byte is lost. The special tokens are found leftmost and then longest
 * (control and unknown ones only when parsing special tokens, user-defined
 * ones always): their texts, each ended by a NUL, are the special tokens
 * among the ids. The pieces of the ids spell those texts and between them
 * the text as it was, in NFC for qwen2. */
typedef struct expected {
    buf text, specials;
} expected;

static void add_special_text(expected *e, const char *s, size_t n) {
    put(&e->text, s, n);
    put(&e->specials, s, n);
    put(&e->specials, "", 1);
}

static void expected_from(const tokenizer *tk, const char *text, size_t len, bool parse_special, expected *e) {
    uint32_t n_vocab = tokenizer_n_vocab(tk);
    int32_t *matched = malloc(n_vocab * sizeof *matched);
    REQUIRE(matched);
    size_t n_matched = 0, n;
    for (int32_t id = 0; (uint32_t)id < n_vocab; id++) {
        bool user = tokenizer_token_type(tk, id) == TOKEN_TYPE_USER_DEFINED;
        tokenizer_token_text(tk, id, &n);
        if (n > 0 && is_special(tk, id) && (parse_special || user)) matched[n_matched++] = id;
    }
    bool nfc = strcmp(tokenizer_pre_name(tk), "qwen2") == 0;
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        size_t best = 0;
        for (size_t k = 0; k < n_matched; k++) {
            const char *s = tokenizer_token_text(tk, matched[k], &n);
            if (n > best && n <= len - i && memcmp(text + i, s, n) == 0) best = n;
        }
        if (best == 0) {
            i++;
            continue;
        }
        put_text(&e->text, text + start, i - start, nfc);
        add_special_text(e, text + i, best);
        start = i += best;
    }
    put_text(&e->text, text + start, len - start, nfc);
    free(matched);
}

static void detok_stream(const tokenizer *tk, const int32_t *ids, size_t n, unsigned flags, buf *out) {
    tokenizer_detok *d = NULL;
    moe_error err;
    REQUIRE(tokenizer_detok_new(tk, flags, &d, &err) == MOE_OK);
    const char *bytes;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        REQUIRE(tokenizer_detok_push(d, ids[i], &bytes, &len, &err) == MOE_OK);
        put(out, bytes, len);
    }
    tokenizer_detok_flush(d, &bytes, &len);
    put(out, bytes, len);
    tokenizer_detok_free(d);
    REQUIRE(utf8_valid(out->data, out->len));
}

/* Encodes text and checks the ids: inside the vocabulary, as `e` says
 * (when given: NULL where the vocabulary may lose bytes), valid UTF-8 from
 * the streaming detokenizer, and, where e's text is valid UTF-8, that text
 * back from decoding with the special tokens rendered. */
static void check_encode(const tokenizer *tk, const char *text, size_t len, unsigned flags, unsigned decode_flags,
                         const expected *e) {
    const buf *want = e ? &e->text : NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    moe_error err;
    moe_status st = tokenizer_encode(tk, text, len, flags, &ids, &n, &err);
    /* The one refusal: a byte without a token, and no unknown token. */
    REQUIRE(st == MOE_OK || (st == MOE_ERR_UNSUPPORTED && !want && tokenizer_unk(tk) < 0));
    buf pieces = {0}, found = {0}, stream = {0};
    for (size_t i = 0; i < n; i++) {
        REQUIRE(ids[i] >= 0 && (uint32_t)ids[i] < tokenizer_n_vocab(tk));
        size_t piece_len;
        const char *piece = tokenizer_piece(tk, ids[i], &piece_len);
        put(&pieces, piece, piece_len);
        if (is_special(tk, ids[i])) put(&found, piece, piece_len), put(&found, "", 1);
    }
    if (e) REQUIRE(equal(want, pieces.data, pieces.len) && equal(&e->specials, found.data, found.len));
    detok_stream(tk, ids, n, decode_flags, &stream);
    if (want && utf8_valid(want->data, want->len)) {
        char *decoded = NULL;
        size_t decoded_len = 0;
        REQUIRE(tokenizer_decode(tk, ids, n, TOKENIZER_DECODE_SPECIAL, &decoded, &decoded_len, &err) == MOE_OK);
        REQUIRE(equal(want, decoded, decoded_len) && decoded[decoded_len] == '\0');
        if (decode_flags & TOKENIZER_DECODE_SPECIAL) REQUIRE(equal(want, stream.data, stream.len));
        free(decoded);
    }
    free(pieces.data);
    free(found.data);
    free(stream.data);
    free(ids);
}

/* --- mode 1: the fixed vocabulary ----------------------------------------- */

static const struct {
    const char *text;
    token_type type;
} specials[] = {
    {"<|endoftext|>", TOKEN_TYPE_CONTROL}, {"<|im_start|>", TOKEN_TYPE_CONTROL}, {"<|im_end|>", TOKEN_TYPE_CONTROL},
    {"<|im", TOKEN_TYPE_CONTROL},          {"<think>", TOKEN_TYPE_USER_DEFINED}, {"</think>", TOKEN_TYPE_USER_DEFINED},
};

/* Merges as raw bytes (written in the byte alphabet), each side a byte or
 * an earlier result: words, spaces, newlines, characters of 2 and 3 bytes,
 * one across a character boundary (e + the first byte of U+0301), and "<|",
 * the start of the control tokens. */
static const char *const merges[][2] = {
    {" ", "t"}, {"h", "e"},       {" t", "he"},  {"i", "n"},       {"\n", "\n"},         {" ", " "}, {"'", "s"},
    {"<", "|"}, {"\xC3", "\xA9"}, {"e", "\xCC"}, {"\xE4", "\xB8"}, {"\xE4\xB8", "\xAD"}, {"1", "2"},
};

enum { N_MERGES = sizeof merges / sizeof merges[0], N_SPECIALS = sizeof specials / sizeof specials[0] };

static tokenizer *fixed;

/* raw bytes in the byte alphabet (at most 2 bytes each) */
static gguf_str alphabet(char *out, const char *raw, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += tokenizer_byte_symbol((uint8_t)raw[i], out + len);
    return (gguf_str){len, out};
}

static tokenizer *fixed_vocabulary(void) {
    enum { N = 256 + N_MERGES + N_SPECIALS };
    static char text[N][32], merge_text[N_MERGES][32];
    gguf_str tokens[N], merge_strs[N_MERGES];
    int32_t types[N];
    size_t n = 0;
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        types[n] = TOKEN_TYPE_NORMAL;
        tokens[n] = alphabet(text[n], &byte, 1);
        n++;
    }
    for (int i = 0; i < N_MERGES; i++) {
        char joined[16];
        size_t l = strlen(merges[i][0]), r = strlen(merges[i][1]);
        memcpy(joined, merges[i][0], l);
        memcpy(joined + l, merges[i][1], r);
        types[n] = TOKEN_TYPE_NORMAL;
        tokens[n] = alphabet(text[n], joined, l + r);
        n++;
        gguf_str left = alphabet(merge_text[i], merges[i][0], l);
        merge_text[i][left.len] = ' ';
        gguf_str right = alphabet(merge_text[i] + left.len + 1, merges[i][1], r);
        merge_strs[i] = (gguf_str){left.len + 1 + right.len, merge_text[i]};
    }
    int32_t eos = (int32_t)n;
    for (int i = 0; i < N_SPECIALS; i++) {
        types[n] = specials[i].type;
        tokens[n++] = (gguf_str){strlen(specials[i].text), specials[i].text};
    }
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    REQUIRE(w && gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", &err) == MOE_OK);
    REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2", &err) == MOE_OK);
    set_strings(w, "tokenizer.ggml.tokens", tokens, n);
    set_strings(w, "tokenizer.ggml.merges", merge_strs, N_MERGES);
    REQUIRE(gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n, &err) == MOE_OK);
    REQUIRE(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, &err) == MOE_OK);
    REQUIRE(gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", true, &err) == MOE_OK);
    tokenizer *tk = NULL;
    REQUIRE(load(w, &tk, &err) == MOE_OK);
    return tk;
}

static void fuzz_fixed(uint8_t mode, const char *text, size_t len) {
    bool parse_special = mode & 1, add_special = mode & 2;
    expected want = {0};
    expected_from(fixed, text, len, parse_special, &want);
    if (add_special) add_special_text(&want, specials[0].text, strlen(specials[0].text)); /* EOS */
    unsigned flags = (parse_special ? TOKENIZER_PARSE_SPECIAL : 0) | (add_special ? TOKENIZER_ADD_SPECIAL : 0);
    check_encode(fixed, text, len, flags, mode & 4 ? TOKENIZER_DECODE_SPECIAL : 0, &want);
    free(want.text.data);
    free(want.specials.data);
}

/* --- mode 2: a vocabulary from the input ---------------------------------- */

/* The next span of p up to a NUL (consumed) or the end. */
static gguf_str section(const char **p, const char *end) {
    const char *nul = memchr(*p, '\0', (size_t)(end - *p));
    gguf_str s = {(uint64_t)((nul ? nul : end) - *p), *p};
    *p = nul ? nul + 1 : end;
    return s;
}

/* s split at '\n' into *n strings (none when s is empty); the caller frees. */
static gguf_str *lines(gguf_str s, size_t extra, size_t *n) {
    gguf_str *out = calloc(s.len + extra + 1, sizeof *out);
    REQUIRE(out);
    *n = 0;
    for (const char *p = s.data, *end = s.data + s.len; s.len && p <= end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        out[(*n)++] = (gguf_str){(uint64_t)(stop - p), p};
        p = stop + 1;
    }
    return out;
}

static const char *const models[] = {"gpt2", "llama", NULL, "bert"};
static const char *const pres[] = {NULL, "default", "gpt2", "olmo", "qwen2", "llama-bpe", "llama3", "llama-v3", "x"};
static const char *const id_keys[] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",     "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
};
static const char *const flag_keys[] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                        "tokenizer.ggml.add_space_prefix"};

/*
 * The vocabulary an input describes:
 *   byte 0  bits 0-1 the model (gpt2, llama, absent, bert); bit 2: the 256
 *           byte tokens come first (gpt2's alphabet or <0xNN>); bits 3-5:
 *           token_type, scores and merges are written
 *   byte 1  the pre-tokenizer: absent, one of the seven names, unknown
 *   byte 2  bits 0-5: which special ids are written; bit 6: as int32 (else
 *           uint32); bit 7: add_bos_token as a uint32 (a type error)
 *   byte 3  bits 0-2: which of add_bos, add_eos, add_space_prefix are
 *           written; bits 3-5 their values; bits 6-7: encode with parse
 *           special and add special
 * then sections split at NUL: the tokens and the merges, one per line; one
 * byte per token for its type (the byte itself) and score (the byte as
 * int8, 127 as NaN); one byte per special id (+256 with the byte tokens;
 * 255 is one past the vocabulary, 254 is -1).
 */
static gguf_writer *vocab_writer(const char *data, size_t size) {
    static char byte_text[2][256][8];
    static gguf_str byte_tokens[2][256];
    if (!byte_tokens[0][0].data)
        for (int b = 0; b < 256; b++) {
            byte_tokens[0][b] = (gguf_str){tokenizer_byte_symbol((uint8_t)b, byte_text[0][b]), byte_text[0][b]};
            byte_tokens[1][b] = (gguf_str){(uint64_t)snprintf(byte_text[1][b], 8, "<0x%02X>", b), byte_text[1][b]};
        }
    uint8_t head[4] = {0};
    memcpy(head, data, size < 4 ? size : 4);
    const char *p = data + (size < 4 ? size : 4), *end = data + size;
    int model = head[0] & 3;
    size_t base = head[0] & 4 ? 256 : 0;
    gguf_str tokens_text = section(&p, end), merges_text = section(&p, end);
    gguf_str types_text = section(&p, end), scores_text = section(&p, end), ids_text = section(&p, end);

    size_t n_fuzz, n_merges;
    gguf_str *tokens = lines(tokens_text, base, &n_fuzz), *merge_lines = lines(merges_text, 0, &n_merges);
    memmove(tokens + base, tokens, n_fuzz * sizeof *tokens);
    memcpy(tokens, byte_tokens[model == 1], base * sizeof *tokens);
    size_t n = base + n_fuzz;
    int32_t *types = calloc(n + 1, sizeof *types);
    float *scores = calloc(n + 1, sizeof *scores);
    REQUIRE(types && scores);
    for (size_t i = 0; i < n; i++) {
        size_t k = i - base;
        types[i] = i < base             ? (model == 1 ? TOKEN_TYPE_BYTE : TOKEN_TYPE_NORMAL)
                   : k < types_text.len ? (uint8_t)types_text.data[k]
                                        : TOKEN_TYPE_NORMAL;
        int8_t s = i >= base && k < scores_text.len ? (int8_t)scores_text.data[k] : 0;
        scores[i] = s == 127 ? NAN : s;
    }

    gguf_writer *w = gguf_writer_new();
    moe_error err;
    REQUIRE(w);
    if (models[model]) REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.model", models[model], &err) == MOE_OK);
    if (pres[head[1] % 9]) REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.pre", pres[head[1] % 9], &err) == MOE_OK);
    set_strings(w, "tokenizer.ggml.tokens", tokens, n);
    if (head[0] & 8)
        REQUIRE(gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n, &err) == MOE_OK);
    if (head[0] & 16)
        REQUIRE(gguf_writer_set_array(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n, &err) == MOE_OK);
    if (head[0] & 32) set_strings(w, "tokenizer.ggml.merges", merge_lines, n_merges);
    for (size_t i = 0; i < 6; i++) {
        if (!(head[2] >> i & 1)) continue;
        uint8_t b = i < ids_text.len ? (uint8_t)ids_text.data[i] : 0;
        int64_t id = b == 255 ? (int64_t)n : b == 254 ? -1 : (int64_t)(b + base);
        REQUIRE((head[2] & 64 ? gguf_writer_set_i32(w, id_keys[i], (int32_t)id, &err)
                              : gguf_writer_set_u32(w, id_keys[i], (uint32_t)id, &err)) == MOE_OK);
    }
    for (size_t i = 0; i < 3; i++)
        if (head[3] >> i & 1) REQUIRE(gguf_writer_set_bool(w, flag_keys[i], head[3] >> (i + 3) & 1, &err) == MOE_OK);
    if (head[2] & 128) REQUIRE(gguf_writer_set_u32(w, flag_keys[0], 1, &err) == MOE_OK);
    free(tokens);
    free(merge_lines);
    free(types);
    free(scores);
    return w;
}

/* Every token's text, piece and type, and lookups by text. */
static void walk_vocabulary(const tokenizer *tk) {
    uint32_t n = tokenizer_n_vocab(tk);
    REQUIRE(n > 0);
    for (int32_t id = 0; (uint32_t)id < n; id++) {
        size_t len, piece_len;
        const char *text = tokenizer_token_text(tk, id, &len);
        const char *piece = tokenizer_piece(tk, id, &piece_len);
        if (len) sink += (uint8_t)text[0] + (uint8_t)text[len - 1];
        if (piece_len) sink += (uint8_t)piece[0] + (uint8_t)piece[piece_len - 1];
        int32_t found = tokenizer_find(tk, text, len);
        REQUIRE(found >= 0 && found <= id);
        sink += tokenizer_token_type(tk, id) + tokenizer_is_eog(tk, id);
    }
    int32_t special[] = {tokenizer_bos(tk), tokenizer_eos(tk), tokenizer_eot(tk), tokenizer_unk(tk), tokenizer_pad(tk)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        REQUIRE(special[i] >= -1 && special[i] < (int64_t)n);
    sink += strlen(tokenizer_model_name(tk)) + strlen(tokenizer_pre_name(tk));
}

/* Whether nothing can be lost: byte-level, with a normal token per byte. */
static bool every_byte(const tokenizer *tk) {
    if (strcmp(tokenizer_model_name(tk), "gpt2") != 0) return false;
    for (int b = 0; b < 256; b++) {
        char text[4];
        int32_t id = tokenizer_find(tk, text, tokenizer_byte_symbol((uint8_t)b, text));
        if (id < 0 || tokenizer_token_type(tk, id) != TOKEN_TYPE_NORMAL) return false;
    }
    return true;
}

static void fuzz_vocabulary(const char *data, size_t size) {
    tokenizer *tk = NULL;
    moe_error err = {0};
    moe_status st = load(vocab_writer(data, size), &tk, &err);
    if (st != MOE_OK) {
        REQUIRE(tk == NULL && err.code == st && err.message[0] != '\0');
        return;
    }
    walk_vocabulary(tk);
    /* The input is text as good as any: it holds the token texts. What the
     * pieces must spell is known without BOS and EOS, when nothing is lost. */
    uint8_t mode = size > 3 ? (uint8_t)data[3] : 0;
    bool parse_special = mode & 64, add_special = mode & 128;
    expected want = {0};
    bool known = !add_special && every_byte(tk);
    if (known) expected_from(tk, data, size, parse_special, &want);
    unsigned flags = (parse_special ? TOKENIZER_PARSE_SPECIAL : 0) | (add_special ? TOKENIZER_ADD_SPECIAL : 0);
    check_encode(tk, data, size, flags, TOKENIZER_DECODE_SPECIAL | TOKENIZER_DECODE_STRIP_PREFIX, known ? &want : NULL);
    free(want.text.data);
    free(want.specials.data);
    tokenizer_free(tk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fixed) fixed = fixed_vocabulary();
    if (size == 0) return 0;
    if (data[0] < 0x80)
        fuzz_fixed(data[0], (const char *)data + 1, size - 1);
    else
        fuzz_vocabulary((const char *)data + 1, size - 1);
    return 0;
}
