/*
 * tokenizer_conformance.c — moe.c's tokenizer against a real one.
 *
 * usage: tokenizer_conformance NAME TOKENIZER_JSON CONFIG_JSON CORPUS_JSON
 *                              ORACLE_JSON SCRATCH_DIR [BENCH_TEXT]
 *
 * Converts a Hugging Face tokenizer to a GGUF vocabulary with
 * tools/hf_tokenizer.c (what `moe convert` uses), loads it, and for every
 * corpus case requires: the ids equal the oracle's (an independent
 * implementation, run by tests/oracle/tokenize.mjs; special tokens in the
 * text parsed, no BOS/EOS added), and decoding them gives back the text
 * byte for byte (its NFC form for a tokenizer that normalises). With
 * BENCH_TEXT it also times encoding 1 MiB made of copies of that file.
 * Exit status 0 when every case passes.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

#define MAX_REPORTED 8 /* failing cases printed in full */

static int fail(const char *what, const moe_error *err) {
    fprintf(stderr, "tokenizer_conformance: %s: %s\n", what, err->message);
    return 1;
}

/* Print a case's text with control characters escaped, cut at 100 bytes. */
static void print_text(const char *s, size_t len) {
    for (size_t i = 0; i < len && i < 100; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\r')
            fputs("\\r", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    if (len > 100) fputs("...", stderr);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", ids[i]);
    fputs(n > 24 ? " ...\n" : "\n", stderr);
}

static bool same_ids(const int32_t *ours, size_t n, const json_t *theirs) {
    if (json_array_size(theirs) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(theirs, i)) != ours[i]) return false;
    return true;
}

typedef struct counts {
    size_t cases, ids_ok, round_trip_ok, reported;
} counts;

static void check_case(const tokenizer *tk, size_t index, const json_t *text, const json_t *expected_ids,
                       const json_t *expected_text, counts *c) {
    const char *s = json_string_value(text);
    size_t len = json_string_length(text);
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t back_len = 0;
    moe_error err = {0};
    bool ids_ok = false, trip_ok = false;
    if (tokenizer_encode(tk, s, len, TOKENIZER_PARSE_SPECIAL, &ids, &n, &err) == MOE_OK) {
        ids_ok = same_ids(ids, n, expected_ids);
        if (tokenizer_decode(tk, ids, n, TOKENIZER_DECODE_SPECIAL | TOKENIZER_DECODE_STRIP_PREFIX, &back, &back_len,
                             &err) == MOE_OK)
            trip_ok = back_len == json_string_length(expected_text) &&
                      memcmp(back, json_string_value(expected_text), back_len) == 0;
    }
    c->ids_ok += ids_ok;
    c->round_trip_ok += trip_ok;
    if ((!ids_ok || !trip_ok) && c->reported++ < MAX_REPORTED) {
        fprintf(stderr, "  case %zu \"", index);
        print_text(s, len);
        fprintf(stderr, "\":%s%s%s\n", ids_ok ? "" : " ids differ", trip_ok ? "" : " round trip differs",
                err.message[0] ? err.message : "");
        if (!ids_ok) {
            print_ids("moe.c ", ids, n);
            int32_t theirs[24];
            size_t m = json_array_size(expected_ids);
            for (size_t i = 0; i < m && i < 24; i++)
                theirs[i] = (int32_t)json_integer_value(json_array_get(expected_ids, i));
            print_ids("oracle", theirs, m < 24 ? m : 24);
        }
        if (!trip_ok && back) {
            fputs("    decoded: \"", stderr);
            print_text(back, back_len);
            fputs("\"\n", stderr);
        }
    }
    free(ids);
    free(back);
}

/* Encode 1 MiB of copies of the bench text and report the rate. */
static int bench(const char *name, const tokenizer *tk, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tokenizer_conformance: cannot open %s\n", path);
        return 1;
    }
    char sample[1 << 16];
    size_t n = fread(sample, 1, sizeof sample, f);
    fclose(f);
    size_t size = 1 << 20;
    char *text = malloc(size);
    if (!text || n == 0) {
        free(text);
        return 1;
    }
    for (size_t at = 0; at < size; at += n) memcpy(text + at, sample, at + n <= size ? n : size - at);
    int32_t *ids;
    size_t n_ids;
    moe_error err = {0};
    double t0 = monotonic_seconds();
    moe_status st = tokenizer_encode(tk, text, size, 0, &ids, &n_ids, &err);
    double dt = monotonic_seconds() - t0;
    free(text);
    if (st != MOE_OK) return fail("bench", &err);
    printf("%s: encoded 1 MiB of English in %.1f ms (%zu tokens, %.1f MB/s)\n", name, dt * 1e3, n_ids, size / dt / 1e6);
    free(ids);
    return 0;
}

static tokenizer *convert_and_load(const char *name, const char *json_path, const char *config_path,
                                   const char *scratch) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.gguf", scratch, name);
    moe_error err = {0};
    gguf_writer *w = gguf_writer_new();
    gguf_file *file = NULL;
    tokenizer *tk = NULL;
    if (!w) return NULL;
    if (hf_tokenizer_to_gguf(json_path, config_path, 0, w, &err) != MOE_OK)
        fail("converting", &err);
    else if (gguf_writer_save(w, path, &err) != MOE_OK)
        fail("writing the GGUF", &err);
    else if (gguf_open(path, &file, &err) != MOE_OK)
        fail("reading the GGUF back", &err);
    else {
        double t0 = monotonic_seconds();
        if (tokenizer_load(file, &tk, &err) != MOE_OK)
            fail("loading the vocabulary", &err);
        else
            printf("%s: %s/%s vocabulary of %u tokens loaded in %.0f ms\n", name, tokenizer_model_name(tk),
                   tokenizer_pre_name(tk), tokenizer_n_vocab(tk), (monotonic_seconds() - t0) * 1e3);
    }
    gguf_close(file);
    gguf_writer_free(w);
    return tk;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 8) {
        fprintf(stderr, "usage: %s NAME TOKENIZER_JSON CONFIG_JSON CORPUS_JSON ORACLE_JSON SCRATCH_DIR [BENCH_TEXT]\n",
                argv[0]);
        return 2;
    }
    const char *name = argv[1];
    json_error_t je;
    json_t *corpus = json_load_file(argv[4], 0, &je), *oracle = json_load_file(argv[5], 0, &je);
    json_t *all_ids = json_object_get(oracle, "ids"), *texts = json_object_get(oracle, "expected_text");
    tokenizer *tk = convert_and_load(name, argv[2], argv[3], argv[6]);
    int status = 1;
    if (!json_is_array(corpus) || json_array_size(all_ids) != json_array_size(corpus) ||
        json_array_size(texts) != json_array_size(corpus)) {
        fprintf(stderr, "tokenizer_conformance: corpus %s and oracle output %s do not match\n", argv[4], argv[5]);
    } else if (tk) {
        counts c = {.cases = json_array_size(corpus)};
        for (size_t i = 0; i < c.cases; i++)
            check_case(tk, i, json_array_get(corpus, i), json_array_get(all_ids, i), json_array_get(texts, i), &c);
        printf("%s: ids identical in %zu/%zu cases, decode(encode(x)) exact in %zu/%zu\n", name, c.ids_ok, c.cases,
               c.round_trip_ok, c.cases);
        status = c.ids_ok == c.cases && c.round_trip_ok == c.cases ? 0 : 1;
        if (argc == 8 && bench(name, tk, argv[7]) != 0) status = 1;
    }
    tokenizer_free(tk);
    json_decref(corpus);
    json_decref(oracle);
    return status;
}
