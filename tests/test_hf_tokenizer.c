/*
 * test_hf_tokenizer.c — tools/hf_tokenizer.c on small tokenizer.json files.
 *
 * The real tokenizers go through tests/tokenizer_conformance.sh; these pin
 * what they do not exercise: ids without a token, both merge forms, the
 * forms of tokenizer_config.json values, the post-processor's BOS, and the
 * pipelines the converter must refuse.
 */
#include <stdlib.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "hf_tokenizer.h"
#include "test.h"

/* Write `text` to a new temporary file; the caller unlinks path. */
static void write_temp(char *path, const char *text) {
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    size_t len = strlen(text);
    CHECK(write(fd, text, len) == (ssize_t)len);
    close(fd);
}

/* Convert, save and read back; NULL when conversion fails (err says why). */
static gguf_file *convert_sized(const char *json, const char *config, uint32_t n_vocab, moe_error *err) {
    char json_path[] = "/tmp/test_hf_json_XXXXXX", config_path[] = "/tmp/test_hf_config_XXXXXX";
    char gguf_path[] = "/tmp/test_hf_gguf_XXXXXX";
    write_temp(json_path, json);
    if (config) write_temp(config_path, config);
    write_temp(gguf_path, "");
    gguf_writer *w = gguf_writer_new();
    gguf_file *file = NULL;
    moe_status st = hf_tokenizer_to_gguf(json_path, config ? config_path : NULL, n_vocab, w, err);
    if (st == MOE_OK) st = gguf_writer_save(w, gguf_path, err);
    if (st == MOE_OK) st = gguf_open(gguf_path, &file, err);
    gguf_writer_free(w);
    unlink(json_path);
    if (config) unlink(config_path);
    unlink(gguf_path);
    return st == MOE_OK ? file : NULL;
}

static gguf_file *convert(const char *json, const char *config, moe_error *err) {
    return convert_sized(json, config, 0, err);
}

static bool str_is(const gguf_file *f, const char *key, const char *want) {
    gguf_str s;
    return gguf_get_str(f, key, &s, NULL) == MOE_OK && gguf_str_eq(s, want);
}

static int64_t int_of(const gguf_file *f, const char *key) {
    int64_t v = -1;
    gguf_get_i64(f, key, &v, NULL);
    return v;
}

static const gguf_array *array_of(const gguf_file *f, const char *key) {
    const gguf_array *arr = NULL;
    gguf_get_array(f, key, GGUF_TYPE_COUNT, &arr, NULL);
    return arr;
}

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\\\p{L}+| ?\\\\p{N}+| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+(?!\\\\S)|\\\\s+"

/* Ids 0-4 in the vocabulary, 6 an added special token, 7 an added plain
 * one: id 5 has no token. Merges in both forms. */
static const char byte_level_json[] =
    "{\"added_tokens\": [{\"id\": 6, \"content\": \"<|end|>\", \"special\": true},"
    "                    {\"id\": 7, \"content\": \"<tool>\", \"special\": false}],"
    " \"normalizer\": null,"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|end|>\"}},"
    "                      {\"Sequence\": {\"id\": \"A\"}}]},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3, \"\\u0120ab\": 4},"
    "           \"merges\": [\"a b\", [\"\\u0120\", \"ab\"]]}}";

static void test_byte_level(void) {
    moe_error err = {0};
    const char *config = "{\"eos_token\": {\"content\": \"<|end|>\", \"lstrip\": false}, \"model_max_length\": "
                         "1000000000000000019884624838656, \"chat_template\": [{\"name\": \"tool_use\", \"template\": "
                         "\"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}";
    gguf_file *f = convert(byte_level_json, config, &err);
    CHECKF(f, "%s", err.message);
    if (!f) return;
    CHECK(str_is(f, "tokenizer.ggml.model", "gpt2"));
    CHECK(str_is(f, "tokenizer.ggml.pre", "gpt2"));
    const gguf_array *tokens = array_of(f, "tokenizer.ggml.tokens"), *types = array_of(f, "tokenizer.ggml.token_type");
    const gguf_array *merges = array_of(f, "tokenizer.ggml.merges");
    CHECK(tokens && tokens->n == 8 && types && types->n == 8);
    CHECK(gguf_str_eq(gguf_array_get_str(tokens, 5), "[PAD5]") && gguf_array_get_i64(types, 5) == 5);
    CHECK(gguf_str_eq(gguf_array_get_str(tokens, 6), "<|end|>") && gguf_array_get_i64(types, 6) == 3);
    CHECK(gguf_str_eq(gguf_array_get_str(tokens, 7), "<tool>") && gguf_array_get_i64(types, 7) == 4);
    CHECK(gguf_array_get_i64(types, 2) == 1);
    CHECK(merges && merges->n == 2 && gguf_str_eq(gguf_array_get_str(merges, 1), "\xC4\xA0 ab"));
    CHECK(int_of(f, "tokenizer.ggml.eos_token_id") == 6);
    /* No bos_token in the config: BOS from the post-processor's template. */
    CHECK(int_of(f, "tokenizer.ggml.bos_token_id") == 6);
    bool add_bos = false;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, NULL) == MOE_OK && add_bos);
    CHECK(str_is(f, "tokenizer.chat_template", "D"));
    gguf_close(f);
}

static const char spm_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
    "                    {\"id\": 1, \"content\": \"<s>\", \"special\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    "                  {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"pre_tokenizer\": null,"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,"
    "           \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0x41>\": 2, \"\\u2581\": 3, \"a\": 4, \"\\u2581a\": 5, "
    "\"aa\": 6},"
    "           \"merges\": [\"a a\", \"\\u2581 a\"]}}";

static void test_sentencepiece(void) {
    moe_error err = {0};
    gguf_file *f = convert(spm_json, "{\"bos_token\": \"<s>\", \"add_bos_token\": true}", &err);
    CHECKF(f, "%s", err.message);
    if (!f) return;
    CHECK(str_is(f, "tokenizer.ggml.model", "llama"));
    CHECK(gguf_find(f, "tokenizer.ggml.pre") == NULL && gguf_find(f, "tokenizer.ggml.merges") == NULL);
    const gguf_array *types = array_of(f, "tokenizer.ggml.token_type"), *scores = array_of(f, "tokenizer.ggml.scores");
    CHECK(types && gguf_array_get_i64(types, 0) == 2 && gguf_array_get_i64(types, 1) == 3);
    CHECK(gguf_array_get_i64(types, 2) == 6 && gguf_array_get_i64(types, 4) == 1);
    /* aa (merge 0) scores above ▁a (merge 1); tokens no merge makes rank
     * below every merge. */
    CHECK(scores && gguf_array_get_f64(scores, 6) == 0.0 && gguf_array_get_f64(scores, 5) == -1.0);
    CHECK(gguf_array_get_f64(scores, 4) < -1.0);
    CHECK(int_of(f, "tokenizer.ggml.unknown_token_id") == 0 && int_of(f, "tokenizer.ggml.bos_token_id") == 1);
    bool prefix = false;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &prefix, NULL) == MOE_OK && prefix);
    gguf_close(f);
}

/* The byte-level file with one substring replaced. */
static char *variant(const char *from, const char *to) {
    static char buf[4096];
    const char *at = strstr(byte_level_json, from);
    CHECK(at != NULL);
    if (!at) return strcpy(buf, byte_level_json);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - byte_level_json), byte_level_json, to, at + strlen(from));
    return buf;
}

static void check_refused(const char *json, const char *config, moe_status want, const char *needle) {
    moe_error err = {0};
    gguf_file *f = convert(json, config, &err);
    CHECKF(!f && err.code == want && strstr(err.message, needle), "code %d, \"%s\"; want %d with \"%s\"", err.code,
           err.message, want, needle);
    gguf_close(f);
}

static void check_refused_sized(const char *json, uint32_t n_vocab, const char *needle) {
    moe_error err = {0};
    gguf_file *f = convert_sized(json, NULL, n_vocab, &err);
    CHECKF(!f && err.code == MOE_ERR_FORMAT && strstr(err.message, needle), "code %d, \"%s\"", err.code, err.message);
    gguf_close(f);
}

static void test_refusals(void) {
    check_refused(variant("\"type\": \"BPE\"", "\"type\": \"WordPiece\""), NULL, MOE_ERR_UNSUPPORTED, "'WordPiece'");
    const char *split =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"\\\\p{L}+\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}";
    check_refused(variant("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}", split), NULL,
                  MOE_ERR_UNSUPPORTED, "unknown pre-tokenizer regex '\\p{L}+'");
    check_refused(variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}"), NULL, MOE_ERR_UNSUPPORTED,
                  "NFC on");
    check_refused(variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}"), NULL,
                  MOE_ERR_UNSUPPORTED, "'Lowercase'");
    check_refused(variant("\"a\": 0", "\"a\": 0, \"c\": 2"), NULL, MOE_ERR_FORMAT, "id 2 is both");
    check_refused(variant("\"a b\"", "\"a\""), NULL, MOE_ERR_FORMAT, "merge 0");
    check_refused(byte_level_json, "{\"eos_token\": \"<nope>\"}", MOE_ERR_FORMAT, "'<nope>'");
    check_refused("{\"model\": ", NULL, MOE_ERR_FORMAT, "line 1");
    char metaspace[4096];
    snprintf(metaspace, sizeof metaspace, "%s", spm_json);
    char *normalizer = strstr(metaspace, "\"normalizer\"");
    const char *first = "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
                        "\"\\u2581\", \"prepend_scheme\": \"first\"},";
    const char *rest = strstr(spm_json, "\"model\"");
    snprintf(normalizer, sizeof metaspace - (size_t)(normalizer - metaspace), "%s %s", first, rest);
    check_refused(metaspace, NULL, MOE_ERR_UNSUPPORTED, "Metaspace");

    moe_error err = {0};
    gguf_writer *w = gguf_writer_new();
    CHECK(hf_tokenizer_to_gguf("/nonexistent/tokenizer.json", NULL, 0, w, &err) == MOE_ERR_IO);
    CHECK(strstr(err.message, "/nonexistent/tokenizer.json") != NULL);
    gguf_writer_free(w);
}

/* A model with more embedding rows than the tokenizer has ids gets the
 * rest as placeholders; one with fewer is refused. */
static void test_model_vocabulary(void) {
    moe_error err = {0};
    gguf_file *f = convert_sized(byte_level_json, NULL, 11, &err);
    CHECKF(f, "%s", err.message);
    const gguf_array *tokens = f ? array_of(f, "tokenizer.ggml.tokens") : NULL;
    const gguf_array *types = f ? array_of(f, "tokenizer.ggml.token_type") : NULL;
    CHECK(tokens && tokens->n == 11 && types && types->n == 11);
    if (tokens && types && tokens->n == 11)
        CHECK(gguf_str_eq(gguf_array_get_str(tokens, 10), "[PAD10]") && gguf_array_get_i64(types, 10) == 5);
    gguf_close(f);
    check_refused_sized(byte_level_json, 7, "ids up to 7, but the model's vocabulary has 7");
}

int main(void) {
    RUN(test_byte_level);
    RUN(test_model_vocabulary);
    RUN(test_sentencepiece);
    RUN(test_refusals);
    return test_summary();
}
