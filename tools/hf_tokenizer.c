/*
 * hf_tokenizer.c — Hugging Face tokenizer.json to GGUF keys (see the header).
 *
 * tokenizer.json describes a pipeline (normaliser, pre-tokenizer, model,
 * decoder); GGUF names a tokenizer by two strings. The converter therefore
 * recognises the pipelines moe.c implements and refuses the rest, rather
 * than writing a file that would tokenize differently from the original:
 *
 *   byte-level BPE  pre-tokenizer ByteLevel (GPT-2's regex built in), or
 *                   Split(regex) + ByteLevel without its regex; the regex
 *                   names the pre-tokenizer; normaliser none, or NFC
 *                   exactly when the pre-tokenizer is qwen2
 *   SentencePiece   model with byte_fallback; spaces as ▁ through the
 *                   normaliser (Prepend ▁ + Replace " " -> ▁) or a
 *                   Metaspace pre-tokenizer that always prepends
 */
#include "hf_tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define SPACE_MARK "\xE2\x96\x81" /* ▁ */

/* Token types, as tokenizer.ggml.token_type stores them. */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER_DEFINED = 4, TYPE_UNUSED = 5, TYPE_BYTE = 6 };

/* The pre-tokenizer regexes as tokenizer.json files spell them, and what
 * the GGUF name implies in src/tokenizer (NFC, ignore_merges). GPT-2's is
 * also what a ByteLevel pre-tokenizer with use_regex applies itself. */
#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

static const struct {
    const char *regex, *name;
    bool nfc, ignore_merges;
} known_pre[] = {
    {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
                  "|\\s+(?!\\S)|\\s+",
     "qwen2", true, false},
    {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe", false, true},
    {GPT2_REGEX, "gpt2", false, false},
};

typedef struct hf_vocab {
    json_t *root, *config; /* owned */
    json_t *model, *vocab; /* borrowed from root */
    uint32_t n;
    uint32_t n_model; /* the model's vocabulary, 0: none given */
    const char **tokens; /* borrowed from root, or into pads */
    char *pads;
    int32_t *types;
    bool spm;
    const char *pre; /* byte-level: the GGUF pre-tokenizer name */
    const char **merges;
    char **merge_text; /* joined [left, right] merges, owned */
    size_t n_merges;
    float *scores;
    int64_t bos, eos, unk, pad; /* -1: none */
    int add_bos, add_eos;       /* -1: not said */
    bool add_space_prefix;
    const char *chat_template;
} hf_vocab;

/* --- JSON helpers ------------------------------------------------------- */

static moe_status load_json(const char *path, size_t flags, json_t **out, moe_error *err) {
    json_error_t je;
    *out = json_load_file(path, flags, &je);
    if (!*out)
        return moe_error_set(err, json_error_code(&je) == json_error_cannot_open_file ? MOE_ERR_IO : MOE_ERR_FORMAT,
                             "%s: %s (line %d, column %d)", path, je.text, je.line, je.column);
    if (!json_is_object(*out)) return moe_error_set(err, MOE_ERR_FORMAT, "%s: not a JSON object", path);
    return MOE_OK;
}

static const char *type_of(const json_t *obj) { return json_string_value(json_object_get(obj, "type")); }

static bool type_is(const json_t *obj, const char *type) {
    const char *t = type_of(obj);
    return t && strcmp(t, type) == 0;
}

/* A string without an embedded NUL (GGUF strings here are C strings). */
static const char *plain_string(const json_t *s) {
    const char *v = json_string_value(s);
    return v && strlen(v) == json_string_length(s) ? v : NULL;
}

/* The members of a "Sequence" step (under `list_key`), or the step alone;
 * none when there are more than `max` (no pipeline we support has). */
static size_t steps_of(json_t *step, const char *list_key, json_t **out, size_t max) {
    if (!json_is_object(step)) return 0;
    if (!type_is(step, "Sequence")) {
        out[0] = step;
        return 1;
    }
    json_t *list = json_object_get(step, list_key);
    size_t n = json_array_size(list);
    if (n > max) return 0;
    for (size_t i = 0; i < n; i++) out[i] = json_array_get(list, i);
    return n;
}

/* --- tokens ------------------------------------------------------------- */

static moe_status token_id(const json_t *value, const char *what, const char *text, int64_t *id, moe_error *err) {
    *id = json_is_integer(value) ? json_integer_value(value) : -1;
    if (*id < 0 || *id >= INT32_MAX)
        return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: %s '%.64s' has no valid id", what, text);
    return MOE_OK;
}

static moe_status count_tokens(hf_vocab *v, moe_error *err) {
    int64_t max = -1, id;
    const char *text;
    json_t *value;
    json_object_foreach(v->vocab, text, value) {
        moe_status st = token_id(value, "token", text, &id, err);
        if (st != MOE_OK) return st;
        if (id > max) max = id;
    }
    size_t i;
    json_array_foreach(json_object_get(v->root, "added_tokens"), i, value) {
        text = json_string_value(json_object_get(value, "content"));
        moe_status st = token_id(json_object_get(value, "id"), "added token", text ? text : "?", &id, err);
        if (st != MOE_OK) return st;
        if (id > max) max = id;
    }
    if (max < 0) return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: the vocabulary is empty");
    if (v->n_model && max >= v->n_model)
        return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json has ids up to %lld, but the model's vocabulary has "
                             "%u", (long long)max, v->n_model);
    v->n = v->n_model ? v->n_model : (uint32_t)max + 1;
    return MOE_OK;
}

static moe_status place_token(hf_vocab *v, int64_t id, const char *text, moe_error *err) {
    if (!text)
        return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: token %lld has no text, or a NUL byte in it",
                             (long long)id);
    if (v->tokens[id] && strcmp(v->tokens[id], text) != 0)
        return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: id %lld is both '%.64s' and '%.64s'", (long long)id,
                             v->tokens[id], text);
    v->tokens[id] = text;
    return MOE_OK;
}

/* Ids no token has get a placeholder, as llama.cpp's converter does. */
static moe_status fill_holes(hf_vocab *v, moe_error *err) {
    size_t holes = 0;
    for (uint32_t id = 0; id < v->n; id++) holes += !v->tokens[id];
    v->pads = malloc(holes * 20 + 1);
    if (!v->pads) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    char *at = v->pads;
    for (uint32_t id = 0; id < v->n; id++) {
        if (v->tokens[id]) continue;
        v->tokens[id] = at;
        v->types[id] = TYPE_UNUSED;
        at += sprintf(at, "[PAD%u]", id) + 1;
    }
    return MOE_OK;
}

static moe_status collect_tokens(hf_vocab *v, moe_error *err) {
    moe_status st = count_tokens(v, err);
    if (st != MOE_OK) return st;
    v->tokens = calloc(v->n, sizeof *v->tokens);
    v->types = malloc(v->n * sizeof *v->types);
    if (!v->tokens || !v->types) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for %u tokens", v->n);
    for (uint32_t id = 0; id < v->n; id++) v->types[id] = TYPE_NORMAL;
    const char *text;
    json_t *value;
    json_object_foreach(v->vocab, text, value) {
        if ((st = place_token(v, json_integer_value(value), text, err)) != MOE_OK) return st;
    }
    size_t i;
    json_array_foreach(json_object_get(v->root, "added_tokens"), i, value) {
        int64_t id = json_integer_value(json_object_get(value, "id"));
        if ((st = place_token(v, id, plain_string(json_object_get(value, "content")), err)) != MOE_OK) return st;
        v->types[id] = json_is_true(json_object_get(value, "special")) ? TYPE_CONTROL : TYPE_USER_DEFINED;
    }
    return fill_holes(v, err);
}

/* The id of a token by its text: added tokens first, then the vocabulary. */
static int64_t find_token(const hf_vocab *v, const char *text) {
    size_t i;
    json_t *value;
    json_array_foreach(json_object_get(v->root, "added_tokens"), i, value) {
        const char *content = json_string_value(json_object_get(value, "content"));
        if (content && strcmp(content, text) == 0) return json_integer_value(json_object_get(value, "id"));
    }
    json_t *id = json_object_get(v->vocab, text);
    return id ? json_integer_value(id) : -1;
}

/* --- the kind of tokenizer ---------------------------------------------- */

static bool is_spm_normalizer(json_t *normalizer, bool *prefix) {
    json_t *steps[8];
    size_t n = steps_of(normalizer, "normalizers", steps, 8);
    bool replaces = false;
    for (size_t i = 0; i < n; i++) {
        const char *prepend = json_string_value(json_object_get(steps[i], "prepend"));
        json_t *pattern = json_object_get(steps[i], "pattern");
        const char *from = json_string_value(json_object_get(pattern, "String"));
        const char *to = json_string_value(json_object_get(steps[i], "content"));
        if (type_is(steps[i], "Prepend") && prepend && strcmp(prepend, SPACE_MARK) == 0)
            *prefix = true;
        else if (type_is(steps[i], "Replace") && from && to && !strcmp(from, " ") && !strcmp(to, SPACE_MARK))
            replaces = true;
        else
            return false;
    }
    return replaces;
}

/* A Metaspace pre-tokenizer that prepends ▁ to every segment, as the
 * legacy normaliser does; "first" (only at the very start) is not what
 * src/tokenizer implements. */
static bool is_spm_metaspace(json_t *pre, bool *prefix) {
    const char *replacement = json_string_value(json_object_get(pre, "replacement"));
    if (!type_is(pre, "Metaspace") || !replacement || strcmp(replacement, SPACE_MARK) != 0) return false;
    const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
    *prefix = scheme ? strcmp(scheme, "always") == 0 : json_is_true(json_object_get(pre, "add_prefix_space"));
    return !scheme || strcmp(scheme, "first") != 0;
}

static moe_status detect_spm(hf_vocab *v, moe_error *err) {
    json_t *normalizer = json_object_get(v->root, "normalizer");
    json_t *pre = json_object_get(v->root, "pre_tokenizer");
    bool by_normalizer =
        json_is_object(normalizer) && !json_is_object(pre) && is_spm_normalizer(normalizer, &v->add_space_prefix);
    bool by_metaspace = !json_is_object(normalizer) && is_spm_metaspace(pre, &v->add_space_prefix);
    if (!by_normalizer && !by_metaspace)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "tokenizer.json: a byte_fallback BPE whose spaces are not written as U+2581 by the "
                             "Prepend/Replace normaliser or an always-prepending Metaspace is not supported");
    v->spm = true;
    return MOE_OK;
}

/* A Split that keeps matches and the text between them as pieces, which
 * is what src/tokenizer does with the regex. */
static bool is_isolated_split(json_t *split) {
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    return behavior && strcmp(behavior, "Isolated") == 0 && !json_is_true(json_object_get(split, "invert"));
}

/* The pre-tokenizer's name from its Split regex (or GPT-2's built-in one). */
static moe_status detect_pre_name(hf_vocab *v, json_t **steps, size_t n, moe_error *err) {
    const char *regex = NULL;
    bool byte_level_regex = false;
    for (size_t i = 0; i < n; i++) {
        if (type_is(steps[i], "ByteLevel")) {
            byte_level_regex = !json_is_false(json_object_get(steps[i], "use_regex"));
            if (json_is_true(json_object_get(steps[i], "add_prefix_space")))
                return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                     "tokenizer.json: ByteLevel add_prefix_space is not supported");
        } else if (type_is(steps[i], "Split") && !regex && is_isolated_split(steps[i])) {
            regex = json_string_value(json_object_get(json_object_get(steps[i], "pattern"), "Regex"));
        } else {
            return moe_error_set(err, MOE_ERR_UNSUPPORTED, "tokenizer.json: pre-tokenizer step '%s' is not supported",
                                 type_of(steps[i]) ? type_of(steps[i]) : "?");
        }
    }
    if (regex && byte_level_regex)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "tokenizer.json: a Split followed by ByteLevel's own regex is not supported");
    if (!regex) regex = GPT2_REGEX;
    for (size_t i = 0; i < sizeof known_pre / sizeof known_pre[0]; i++) {
        if (strcmp(regex, known_pre[i].regex) != 0) continue;
        v->pre = known_pre[i].name;
        bool nfc = type_is(json_object_get(v->root, "normalizer"), "NFC");
        bool ignore_merges = json_is_true(json_object_get(v->model, "ignore_merges"));
        if (nfc != known_pre[i].nfc || ignore_merges != known_pre[i].ignore_merges)
            return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                 "tokenizer.json: pre-tokenizer %s with NFC %s and ignore_merges %s is not supported "
                                 "(moe.c's %s implies NFC %s, ignore_merges %s)",
                                 v->pre, nfc ? "on" : "off", ignore_merges ? "on" : "off", v->pre,
                                 known_pre[i].nfc ? "on" : "off", known_pre[i].ignore_merges ? "on" : "off");
        return MOE_OK;
    }
    return moe_error_set(err, MOE_ERR_UNSUPPORTED, "tokenizer.json: unknown pre-tokenizer regex '%.200s'", regex);
}

static moe_status detect_kind(hf_vocab *v, moe_error *err) {
    if (!type_is(v->model, "BPE"))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported (only BPE)",
                             type_of(v->model) ? type_of(v->model) : "?");
    if (json_is_true(json_object_get(v->model, "byte_fallback"))) return detect_spm(v, err);
    json_t *steps[8];
    size_t n = steps_of(json_object_get(v->root, "pre_tokenizer"), "pretokenizers", steps, 8);
    bool byte_level = false;
    for (size_t i = 0; i < n; i++) byte_level |= type_is(steps[i], "ByteLevel");
    if (!byte_level)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "tokenizer.json: a BPE that is neither byte-level nor SentencePiece-style (byte_fallback) "
                             "is not supported");
    json_t *normalizer = json_object_get(v->root, "normalizer");
    if (json_is_object(normalizer) && !type_is(normalizer, "NFC"))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "tokenizer.json: normalizer '%s' is not supported",
                             type_of(normalizer) ? type_of(normalizer) : "?");
    return detect_pre_name(v, steps, n, err);
}

static void assign_types(hf_vocab *v) {
    for (uint32_t id = 0; v->spm && id < v->n; id++) {
        const char *t = v->tokens[id];
        if (v->types[id] == TYPE_NORMAL && strlen(t) == 6 && !strncmp(t, "<0x", 3) && t[5] == '>')
            v->types[id] = TYPE_BYTE;
    }
    const char *unk = json_string_value(json_object_get(v->model, "unk_token"));
    int64_t id = unk ? find_token(v, unk) : -1;
    if (id >= 0) {
        v->types[id] = TYPE_UNKNOWN;
        v->unk = id;
    }
}

/* --- merges and scores -------------------------------------------------- */

/* A merge as "left right": the old string form as it is, the [left, right]
 * form joined (left must not contain a space after its first byte, or the
 * split would be ambiguous). */
static moe_status merge_string(hf_vocab *v, size_t i, json_t *m, moe_error *err) {
    if (json_is_string(m)) {
        const char *s = plain_string(m);
        v->merges[i] = s;
        if (s && s[0] && strchr(s + 1, ' ')) return MOE_OK;
    } else if (json_array_size(m) == 2) {
        const char *l = plain_string(json_array_get(m, 0)), *r = plain_string(json_array_get(m, 1));
        if (l && r && !(l[0] && strchr(l + 1, ' '))) {
            size_t ll = strlen(l), rl = strlen(r);
            char *s = v->merge_text[i] = malloc(ll + rl + 2);
            if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the merges");
            memcpy(s, l, ll);
            s[ll] = ' ';
            memcpy(s + ll + 1, r, rl + 1);
            v->merges[i] = s;
            return MOE_OK;
        }
    }
    return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: merge %zu is neither \"left right\" nor [left, right]",
                         i);
}

static moe_status collect_merges(hf_vocab *v, moe_error *err) {
    json_t *merges = json_object_get(v->model, "merges");
    if (!json_is_array(merges)) return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: model.merges is missing");
    v->n_merges = json_array_size(merges);
    v->merges = calloc(v->n_merges + 1, sizeof *v->merges);
    v->merge_text = calloc(v->n_merges + 1, sizeof *v->merge_text);
    if (!v->merges || !v->merge_text) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the merges");
    for (size_t i = 0; i < v->n_merges; i++) {
        moe_status st = merge_string(v, i, json_array_get(merges, i), err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* SentencePiece merges by score: the token merge r produces scores -r, so
 * the score order is the merge order. Tokens no merge produces rank after
 * every merge, in id order (SentencePiece's own order). */
static moe_status derive_scores(hf_vocab *v, moe_error *err) {
    moe_status st = collect_merges(v, err);
    if (st != MOE_OK) return st;
    v->scores = malloc(v->n * sizeof *v->scores);
    bool *scored = calloc(v->n, 1);
    if (!v->scores || !scored) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the scores");
    for (uint32_t id = 0; st == MOE_OK && id < v->n; id++) v->scores[id] = -(float)(v->n_merges + id);
    for (size_t r = 0; st == MOE_OK && r < v->n_merges; r++) {
        /* merge_string made sure of the space. */
        const char *m = v->merges[r], *space = strchr(m + 1, ' ');
        char *joined = malloc(strlen(m));
        if (!joined) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the scores");
            break;
        }
        memcpy(joined, m, (size_t)(space - m));
        strcpy(joined + (space - m), space + 1);
        json_t *id = json_object_get(v->vocab, joined);
        if (!id)
            st = moe_error_set(err, MOE_ERR_FORMAT, "tokenizer.json: merge %zu makes '%.64s', not a token", r, joined);
        else if (!scored[json_integer_value(id)]) {
            scored[json_integer_value(id)] = true;
            v->scores[json_integer_value(id)] = -(float)r;
        }
        free(joined);
    }
    free(scored);
    return st;
}

/* --- tokenizer_config.json and the post-processor ----------------------- */

/* "bos_token": "<s>" or {"content": "<s>", ...} or null. */
static moe_status config_token(hf_vocab *v, const char *key, int64_t *id, moe_error *err) {
    json_t *value = json_object_get(v->config, key);
    if (json_is_object(value)) value = json_object_get(value, "content");
    const char *text = json_string_value(value);
    if (!text) return MOE_OK;
    *id = find_token(v, text);
    if (*id < 0)
        return moe_error_set(err, MOE_ERR_FORMAT, "tokenizer_config.json: %s '%.64s' is not a token", key, text);
    return MOE_OK;
}

static void config_flag(const hf_vocab *v, const char *key, int *flag) {
    json_t *value = json_object_get(v->config, key);
    if (json_is_boolean(value)) *flag = json_is_true(value);
}

/* Newer files say whether BOS/EOS are added only through the template of
 * a TemplateProcessing post-processor: a special token first / last. */
static void post_processor_flags(hf_vocab *v) {
    json_t *steps[8];
    size_t n = steps_of(json_object_get(v->root, "post_processor"), "processors", steps, 8);
    for (size_t i = 0; i < n; i++) {
        json_t *single = json_object_get(steps[i], "single");
        size_t len = json_array_size(single);
        if (!type_is(steps[i], "TemplateProcessing") || len == 0) continue;
        json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
        json_t *last = json_object_get(json_array_get(single, len - 1), "SpecialToken");
        const char *first_text = json_string_value(json_object_get(first, "id"));
        if (v->add_bos < 0) v->add_bos = first != NULL;
        if (first_text && v->bos < 0) v->bos = find_token(v, first_text);
        if (v->add_eos < 0) v->add_eos = len > 1 && last != NULL;
    }
}

static moe_status read_config(hf_vocab *v, moe_error *err) {
    moe_status st = MOE_OK;
    if (v->config) {
        const char *keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
        int64_t *ids[] = {&v->bos, &v->eos, &v->unk, &v->pad};
        for (size_t i = 0; i < 4 && st == MOE_OK; i++) st = config_token(v, keys[i], ids[i], err);
        config_flag(v, "add_bos_token", &v->add_bos);
        config_flag(v, "add_eos_token", &v->add_eos);
        json_t *tmpl = json_object_get(v->config, "chat_template");
        size_t i;
        json_t *named;
        /* Some configs carry a list of named templates: take "default". */
        json_array_foreach(tmpl, i, named) {
            const char *name = json_string_value(json_object_get(named, "name"));
            if (name && strcmp(name, "default") == 0) tmpl = json_object_get(named, "template");
        }
        v->chat_template = plain_string(tmpl);
    }
    post_processor_flags(v);
    return st;
}

/* --- writing ------------------------------------------------------------ */

static moe_status write_ids(const hf_vocab *v, gguf_writer *w, moe_error *err) {
    const char *keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
    const int64_t ids[] = {v->bos, v->eos, v->unk, v->pad};
    moe_status st = MOE_OK;
    for (size_t i = 0; i < 4 && st == MOE_OK; i++)
        if (ids[i] >= 0) st = gguf_writer_set_u32(w, keys[i], (uint32_t)ids[i], err);
    if (st == MOE_OK && v->add_bos >= 0) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err);
    if (st == MOE_OK && v->add_eos >= 0) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos, err);
    return st;
}

static moe_status write_keys(const hf_vocab *v, gguf_writer *w, moe_error *err) {
    moe_status st = gguf_writer_set_str(w, "tokenizer.ggml.model", v->spm ? "llama" : "gpt2", err);
    if (st == MOE_OK && !v->spm) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre, err);
    if (st == MOE_OK) st = gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", v->tokens, v->n, err);
    if (st == MOE_OK) st = gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types, v->n, err);
    if (st == MOE_OK && v->spm)
        st = gguf_writer_set_array(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v->scores, v->n, err);
    if (st == MOE_OK && v->spm)
        st = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix, err);
    if (st == MOE_OK && !v->spm)
        st = gguf_writer_set_str_array(w, "tokenizer.ggml.merges", v->merges, v->n_merges, err);
    if (st == MOE_OK) st = write_ids(v, w, err);
    if (st == MOE_OK && v->chat_template) st = gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template, err);
    return st;
}

static void hf_vocab_free(hf_vocab *v) {
    for (size_t i = 0; v->merge_text && i < v->n_merges; i++) free(v->merge_text[i]);
    free(v->merge_text);
    free(v->merges);
    free(v->scores);
    free(v->tokens);
    free(v->types);
    free(v->pads);
    json_decref(v->root);
    json_decref(v->config);
}

static moe_status convert(hf_vocab *v, const char *tokenizer_json, const char *config_json, gguf_writer *w,
                          moe_error *err) {
    moe_status st = load_json(tokenizer_json, 0, &v->root, err);
    /* Configs say model_max_length = 1e30 as an integer literal, which
     * jansson refuses as an integer; nothing read from them is a number. */
    if (st == MOE_OK && config_json) st = load_json(config_json, JSON_DECODE_INT_AS_REAL, &v->config, err);
    if (st != MOE_OK) return st;
    v->model = json_object_get(v->root, "model");
    v->vocab = json_object_get(v->model, "vocab");
    if (!json_is_object(v->vocab))
        return moe_error_set(err, MOE_ERR_FORMAT, "%s: model.vocab is missing", tokenizer_json);
    st = detect_kind(v, err);
    if (st == MOE_OK) st = collect_tokens(v, err);
    if (st == MOE_OK) {
        assign_types(v);
        st = v->spm ? derive_scores(v, err) : collect_merges(v, err);
    }
    if (st == MOE_OK) st = read_config(v, err);
    if (st == MOE_OK) st = write_keys(v, w, err);
    return st;
}

moe_status hf_tokenizer_to_gguf(const char *tokenizer_json, const char *tokenizer_config_json, uint32_t n_vocab,
                                gguf_writer *w, moe_error *err) {
    hf_vocab v = {.n_model = n_vocab, .bos = -1, .eos = -1, .unk = -1, .pad = -1, .add_bos = -1, .add_eos = -1};
    moe_status st = convert(&v, tokenizer_json, tokenizer_config_json, w, err);
    hf_vocab_free(&v);
    return st;
}
