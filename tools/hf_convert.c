/*
 * hf_convert.c — Hugging Face checkpoint to GGUF (see the header).
 *
 * Three steps. The hyperparameters come from config.json, with
 * Transformers' own defaults for the keys a config may leave out. A plan
 * then lists every GGUF tensor as a stack of row ranges of checkpoint
 * tensors: the plain copies, the llama q/k reordering and the merging of
 * experts are all just a rule for which source row lands where, so no
 * tensor is ever assembled in memory in f32. Last the file is streamed:
 * each output row is its source row, copied when the types agree and
 * otherwise converted through f32 into the recipe's type.
 */
#include "hf_convert.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/progress.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "hf_tokenizer.h"
#include "model/model.h"
#include "quant/recipe.h"
#include "safetensors.h"

/* Rows per thread-pool task, as in quantize_model.c. */
#define ROWS_PER_TASK 16
#define NAME_MAX_LEN  160 /* the longest HF name built here is under 120 */

/* ------------------------------------------------------------ architectures */

/* What a Hugging Face class is beyond model.c's row for its GGUF arch: the
 * config keys its MoE sizes live under, and Transformers' defaults for the
 * keys a config.json may leave out. */
typedef struct hf_arch {
    const char *hf_name, *gguf_name;
    bool moe;
    const char *n_ff_expert_key; /* the config key of the expert FFN width */
    bool shared_expert;          /* Qwen2-MoE: a sigmoid-gated shared expert */
    bool always_norm_topk;       /* Mixtral renormalises; the others read norm_topk_prob */
    float rms_eps, rope_base;
    int n_ctx;
} hf_arch;

static const hf_arch hf_archs[] = {
    /* HF class               GGUF       MoE    expert FFN          shared renorm eps    base  ctx */
    {"LlamaForCausalLM", "llama", false, NULL, false, false, 1e-6f, 1e4f, 2048},
    {"MistralForCausalLM", "llama", false, NULL, false, false, 1e-6f, 1e4f, 131072},
    {"MixtralForCausalLM", "llama", true, "intermediate_size", false, true, 1e-5f, 1e6f, 131072},
    {"Qwen2ForCausalLM", "qwen2", false, NULL, false, false, 1e-6f, 1e4f, 32768},
    {"Qwen2MoeForCausalLM", "qwen2moe", true, "moe_intermediate_size", true, false, 1e-6f, 1e4f, 32768},
    {"Qwen3ForCausalLM", "qwen3", false, NULL, false, false, 1e-6f, 1e4f, 32768},
    {"Qwen3MoeForCausalLM", "qwen3moe", true, "moe_intermediate_size", false, false, 1e-6f, 1e4f, 32768},
    {"OlmoeForCausalLM", "olmoe", true, "intermediate_size", false, false, 1e-5f, 1e4f, 4096},
};

typedef enum rope_scaling_kind { SCALING_NONE, SCALING_LINEAR, SCALING_LLAMA3 } rope_scaling_kind;

typedef struct hparams {
    const hf_arch *arch;
    const arch_desc *desc; /* model.c's row: RoPE pairing, q/k norm, biases */
    int n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_vocab, n_ctx;
    int n_ff; /* intermediate_size (the expert width for Mixtral and OLMoE), 0 if absent */
    int n_experts, n_experts_used, n_ff_expert, n_ff_shared;
    bool norm_topk;
    bool tied; /* the output head is the embedding */
    float rms_eps, rope_base;
    rope_scaling_kind scaling;
    float factor, low_freq_factor, high_freq_factor; /* linear: factor; llama3: all three */
    int original_ctx;                                /* llama3 */
} hparams;

/* ------------------------------------------------------------ config.json */

typedef struct config_reader {
    json_t *root;
    const char *path;
    moe_error *err;
    moe_status status; /* the first failure; later reads return their fallback */
} config_reader;

#define REQUIRED INT64_MIN

/* A key's value, NULL when absent or null (configs write null for "unset"). */
static json_t *value_of(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static int read_int(config_reader *r, json_t *obj, const char *key, int64_t fallback, int64_t min, int64_t max) {
    json_t *v = value_of(obj, key);
    if (r->status != MOE_OK) return 0;
    if (!v) {
        if (fallback != REQUIRED) return (int)fallback;
        r->status = moe_error_set(r->err, MOE_ERR_NOT_FOUND, "%s: \"%s\" is missing", r->path, key);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        r->status = moe_error_set(r->err, MOE_ERR_FORMAT, "%s: \"%s\" must be an integer from %lld to %lld", r->path,
                                  key, (long long)min, (long long)max);
        return 0;
    }
    return (int)json_integer_value(v);
}

/* A positive, finite number (integer or real) or the fallback. */
static float read_positive(config_reader *r, json_t *obj, const char *key, float fallback) {
    json_t *v = value_of(obj, key);
    if (r->status != MOE_OK || !v) return fallback;
    double d = json_number_value(v);
    if (!json_is_number(v) || !(d > 0) || !isfinite((float)d)) {
        r->status = moe_error_set(r->err, MOE_ERR_FORMAT, "%s: \"%s\" must be a positive number", r->path, key);
        return fallback;
    }
    return (float)d;
}

static bool read_bool(config_reader *r, const char *key, bool fallback) {
    json_t *v = value_of(r->root, key);
    if (r->status != MOE_OK || !v) return fallback;
    if (!json_is_boolean(v))
        r->status = moe_error_set(r->err, MOE_ERR_FORMAT, "%s: \"%s\" must be true or false", r->path, key);
    return json_is_true(v);
}

static moe_status find_arch(config_reader *r, hparams *hp) {
    const char *name = json_string_value(json_array_get(json_object_get(r->root, "architectures"), 0));
    if (!name)
        return moe_error_set(r->err, MOE_ERR_FORMAT, "%s names no architecture (\"architectures\": [\"...\"])",
                             r->path);
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (strcmp(name, hf_archs[i].hf_name) == 0) {
            hp->arch = &hf_archs[i];
            hp->desc = model_arch_by_name(hf_archs[i].gguf_name);
            return MOE_OK;
        }
    return moe_error_set(r->err, MOE_ERR_UNSUPPORTED,
                         "architecture %.64s is not supported (moe convert reads LlamaForCausalLM, MistralForCausalLM, "
                         "MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
                         "Qwen3MoeForCausalLM and OlmoeForCausalLM)",
                         name);
}

/* Transformers 5 keeps rope_theta and the scaling in "rope_parameters";
 * earlier versions write "rope_theta" and "rope_scaling". Both are read. */
static void read_rope(config_reader *r, hparams *hp) {
    json_t *params = value_of(r->root, "rope_parameters");
    json_t *scaling = params ? params : value_of(r->root, "rope_scaling");
    hp->rope_base = read_positive(r, params ? params : r->root, "rope_theta", hp->arch->rope_base);
    const char *kind = json_string_value(value_of(scaling, "rope_type"));
    if (!kind) kind = json_string_value(value_of(scaling, "type"));
    if (!kind || strcmp(kind, "default") == 0) return;
    if (strcmp(kind, "linear") == 0) {
        hp->scaling = SCALING_LINEAR;
        hp->factor = read_positive(r, scaling, "factor", 1.0f);
    } else if (strcmp(kind, "llama3") == 0) {
        hp->scaling = SCALING_LLAMA3;
        hp->factor = read_positive(r, scaling, "factor", 8.0f);
        hp->low_freq_factor = read_positive(r, scaling, "low_freq_factor", 1.0f);
        hp->high_freq_factor = read_positive(r, scaling, "high_freq_factor", 4.0f);
        hp->original_ctx = read_int(r, scaling, "original_max_position_embeddings", 8192, 1, INT32_MAX);
        if (r->status == MOE_OK && !(hp->high_freq_factor > hp->low_freq_factor))
            r->status = moe_error_set(r->err, MOE_ERR_FORMAT,
                                      "%s: llama3 RoPE scaling needs high_freq_factor > "
                                      "low_freq_factor",
                                      r->path);
    } else if (r->status == MOE_OK) {
        r->status = moe_error_set(r->err, MOE_ERR_UNSUPPORTED,
                                  "%s: RoPE scaling \"%.32s\" is not supported (moe.c "
                                  "implements linear and llama3)",
                                  r->path, kind);
    }
}

/* moe.c attends over the whole context. A sliding window the model turns
 * on changes nothing for positions inside it, so the context is capped at
 * the window rather than the model refused. */
static void apply_sliding_window(config_reader *r, hparams *hp) {
    json_t *use = value_of(r->root, "use_sliding_window");
    int window = read_int(r, r->root, "sliding_window", 0, 0, INT32_MAX);
    if (window > 0 && (!use || json_is_true(use)) && window < hp->n_ctx) hp->n_ctx = window;
}

/* Qwen-MoE configs can make some layers dense; moe.c runs MoE stacks only. */
static void check_all_layers_sparse(config_reader *r, const hparams *hp) {
    int step = read_int(r, r->root, "decoder_sparse_step", 1, 1, INT32_MAX);
    json_t *dense = value_of(r->root, "mlp_only_layers");
    for (int l = 0; l < hp->n_layers && r->status == MOE_OK; l++) {
        bool listed = false;
        size_t i;
        json_t *v;
        json_array_foreach(dense, i, v) listed |= json_integer_value(v) == l;
        if (listed || (l + 1) % step != 0)
            r->status = moe_error_set(r->err, MOE_ERR_UNSUPPORTED,
                                      "%s: layer %d is dense (decoder_sparse_step / "
                                      "mlp_only_layers); moe.c runs models whose every layer is MoE",
                                      r->path, l);
    }
}

static void read_moe(config_reader *r, hparams *hp) {
    const hf_arch *a = hp->arch;
    /* Mixtral's key, which Transformers 5 also writes for Qwen3-MoE. */
    const char *count_key = value_of(r->root, "num_experts") ? "num_experts" : "num_local_experts";
    hp->n_experts = read_int(r, r->root, count_key, REQUIRED, 1, 4096);
    hp->n_experts_used = read_int(r, r->root, "num_experts_per_tok", REQUIRED, 1, hp->n_experts);
    hp->n_ff_expert = read_int(r, r->root, a->n_ff_expert_key, REQUIRED, 1, 1 << 20);
    if (a->shared_expert) hp->n_ff_shared = read_int(r, r->root, "shared_expert_intermediate_size", 0, 0, 1 << 20);
    hp->norm_topk = a->always_norm_topk || read_bool(r, "norm_topk_prob", false);
    check_all_layers_sparse(r, hp);
}

static void check_unsupported(config_reader *r) {
    const char *act = json_string_value(value_of(r->root, "hidden_act"));
    if (r->status == MOE_OK && act && strcmp(act, "silu") != 0)
        r->status = moe_error_set(r->err, MOE_ERR_UNSUPPORTED,
                                  "%s: hidden_act \"%.32s\" is not supported (moe.c's "
                                  "FFN is SwiGLU: silu)",
                                  r->path, act);
    if (r->status == MOE_OK && value_of(r->root, "clip_qkv"))
        r->status =
            moe_error_set(r->err, MOE_ERR_UNSUPPORTED, "%s: clip_qkv is set; moe.c does not clip q, k and v", r->path);
}

static void read_sizes(config_reader *r, hparams *hp) {
    json_t *c = r->root;
    hp->n_layers = read_int(r, c, "num_hidden_layers", REQUIRED, 1, 4096);
    hp->n_embd = read_int(r, c, "hidden_size", REQUIRED, 1, 1 << 20);
    hp->n_heads = read_int(r, c, "num_attention_heads", REQUIRED, 1, 4096);
    hp->n_kv_heads = read_int(r, c, "num_key_value_heads", hp->n_heads, 1, hp->n_heads);
    if (r->status == MOE_OK && !value_of(c, "head_dim") && hp->n_embd % hp->n_heads != 0)
        r->status = moe_error_set(r->err, MOE_ERR_FORMAT,
                                  "%s: hidden_size %d is not a multiple of %d heads and no "
                                  "head_dim is given",
                                  r->path, hp->n_embd, hp->n_heads);
    hp->head_dim = read_int(r, c, "head_dim", r->status == MOE_OK ? hp->n_embd / hp->n_heads : 0, 2, 1 << 16);
    hp->n_vocab = read_int(r, c, "vocab_size", REQUIRED, 1, 1 << 24);
    hp->n_ctx = read_int(r, c, "max_position_embeddings", hp->arch->n_ctx, 1, INT32_MAX);
    hp->n_ff = read_int(r, c, "intermediate_size", hp->arch->moe ? 0 : REQUIRED, 1, 1 << 20);
    hp->rms_eps = read_positive(r, c, "rms_norm_eps", hp->arch->rms_eps);
    if (r->status == MOE_OK && hp->n_heads % hp->n_kv_heads != 0)
        r->status = moe_error_set(r->err, MOE_ERR_FORMAT,
                                  "%s: %d attention heads are not a multiple of %d key/value "
                                  "heads",
                                  r->path, hp->n_heads, hp->n_kv_heads);
    if (r->status == MOE_OK && hp->head_dim % 2 != 0)
        r->status =
            moe_error_set(r->err, MOE_ERR_FORMAT, "%s: head_dim %d is odd; RoPE rotates pairs", r->path, hp->head_dim);
}

static moe_status read_hparams(const char *path, hparams *hp, json_t **root, moe_error *err) {
    json_error_t je;
    memset(hp, 0, sizeof *hp);
    *root = json_load_file(path, 0, &je);
    if (!*root)
        return moe_error_set(err,
                             json_error_code(&je) == json_error_cannot_open_file ? MOE_ERR_NOT_FOUND : MOE_ERR_FORMAT,
                             "%s: %s", path, je.text);
    config_reader r = {*root, path, err, MOE_OK};
    if (!json_is_object(*root)) return moe_error_set(err, MOE_ERR_FORMAT, "%s is not a JSON object", path);
    if ((r.status = find_arch(&r, hp)) != MOE_OK) return r.status;
    check_unsupported(&r);
    read_sizes(&r, hp);
    if (r.status == MOE_OK) read_rope(&r, hp);
    apply_sliding_window(&r, hp);
    if (r.status == MOE_OK && hp->arch->moe) read_moe(&r, hp);
    hp->tied = read_bool(&r, "tie_word_embeddings", false);
    return r.status;
}

/* ------------------------------------------------------------ the plan */

/* Rows [first_row, first_row + part_rows) of a checkpoint tensor, viewed as
 * rows of its innermost dimension. */
typedef struct row_source {
    const st_tensor *t;
    int64_t first_row;
} row_source;

/* One GGUF tensor: its rows are the parts' rows, stacked in order. */
typedef struct out_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3]; /* GGUF order: ne[0] is the row length */
    moe_type type;
    row_source *parts; /* [n_parts], owned */
    int n_parts;
    int64_t part_rows;
    int permute_heads; /* > 0: llama's pairing, reorder the rows of this many heads */
} out_tensor;

typedef struct planner {
    st_checkpoint *ckpt;
    const hparams *hp;
    out_tensor *t;
    int n, cap;
    st_tensor rope_freqs; /* generated (llama3 scaling); data owned */
    moe_error *err;
    moe_status status;
} planner;

static void format_shape(char *buf, size_t n, int n_dims, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < n_dims && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

/* The checkpoint tensor `name`, checked to have `shape` and a float dtype,
 * and marked used. NULL (and p->status set) when missing or wrong. */
static const st_tensor *take(planner *p, const char *name, int n_dims, const int64_t *shape) {
    if (p->status != MOE_OK) return NULL;
    st_tensor *t = safetensors_find(p->ckpt, name);
    if (!t) {
        p->status = moe_error_set(p->err, MOE_ERR_NOT_FOUND, "tensor %s is missing from the checkpoint", name);
        return NULL;
    }
    bool same = t->n_dims == n_dims;
    for (int i = 0; i < n_dims && same; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        format_shape(got, sizeof got, t->n_dims, t->shape);
        format_shape(want, sizeof want, n_dims, shape);
        p->status = moe_error_set(p->err, MOE_ERR_FORMAT, "tensor %s has shape %s, but config.json implies %s", name,
                                  got, want);
        return NULL;
    }
    if (t->type == MOE_TYPE_COUNT) {
        p->status = moe_error_set(p->err, MOE_ERR_UNSUPPORTED,
                                  "tensor %s has dtype %s; moe convert reads F32, F16 and "
                                  "BF16",
                                  name, t->dtype);
        return NULL;
    }
    t->used = true;
    return t;
}

static out_tensor *add_out(planner *p, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                           int n_parts) {
    if (p->status != MOE_OK) return NULL;
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        out_tensor *grown = realloc(p->t, (size_t)cap * sizeof *grown);
        if (!grown) return p->status = moe_error_set(p->err, MOE_ERR_NOMEM, "out of memory"), NULL;
        p->t = grown;
        p->cap = cap;
    }
    out_tensor *o = &p->t[p->n];
    *o = (out_tensor){.n_dims = n_dims,
                      .ne = {(uint64_t)ne0, (uint64_t)ne1, (uint64_t)ne2},
                      .n_parts = n_parts,
                      .part_rows = ne1 * ne2 / n_parts};
    snprintf(o->name, sizeof o->name, "%s", name);
    if (!(o->parts = calloc((size_t)n_parts, sizeof *o->parts)))
        return p->status = moe_error_set(p->err, MOE_ERR_NOMEM, "out of memory"), NULL;
    p->n++;
    return o;
}

/* A matrix [rows, cols] as GGUF [cols, rows]; permute_heads as in out_tensor. */
static void map_matrix(planner *p, const char *gguf, const char *hf, int64_t rows, int64_t cols, int permute_heads) {
    const st_tensor *t = take(p, hf, 2, (int64_t[]){rows, cols});
    out_tensor *o = t ? add_out(p, gguf, 2, cols, rows, 1, 1) : NULL;
    if (!o) return;
    o->parts[0] = (row_source){t, 0};
    o->permute_heads = permute_heads;
}

/* A vector [n]; as_row takes a [1, n] matrix (a Linear with one output)
 * as the vector. */
static void map_vector(planner *p, const char *gguf, const char *hf, int64_t n, bool as_row) {
    const st_tensor *t = as_row ? take(p, hf, 2, (int64_t[]){1, n}) : take(p, hf, 1, (int64_t[]){n});
    out_tensor *o = t ? add_out(p, gguf, 1, n, 1, 1, 1) : NULL;
    if (o) o->parts[0] = (row_source){t, 0};
}

/* Per-expert names: Transformers' own, then Mixtral's. */
static const char *const expert_names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
static const char *const gguf_expert_roles[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

static void map_experts_split(planner *p, int l, const char *prefix, int naming) {
    const hparams *hp = p->hp;
    char gguf[64], hf[NAME_MAX_LEN];
    for (int role = 0; role < 3; role++) {
        bool down = role == 2;
        int64_t rows = down ? hp->n_embd : hp->n_ff_expert, cols = down ? hp->n_ff_expert : hp->n_embd;
        snprintf(gguf, sizeof gguf, "blk.%d.%s.weight", l, gguf_expert_roles[role]);
        out_tensor *o = add_out(p, gguf, 3, cols, rows, hp->n_experts, hp->n_experts);
        for (int e = 0; o && e < hp->n_experts; e++) {
            snprintf(hf, sizeof hf, "%s.experts.%d.%s.weight", prefix, e, expert_names[naming][role]);
            o->parts[e] = (row_source){take(p, hf, 2, (int64_t[]){rows, cols}), 0};
        }
    }
}

/* Transformers 5's fused experts: gate_up_proj [E, 2F, H] holds each
 * expert's gate rows, then its up rows; down_proj is [E, H, F]. */
static void map_experts_fused(planner *p, int l, const char *prefix) {
    const hparams *hp = p->hp;
    int64_t n_exp = hp->n_experts, ff = hp->n_ff_expert, d = hp->n_embd;
    char gguf[64], hf[NAME_MAX_LEN];
    snprintf(hf, sizeof hf, "%s.experts.gate_up_proj", prefix);
    const st_tensor *gate_up = take(p, hf, 3, (int64_t[]){n_exp, 2 * ff, d});
    snprintf(hf, sizeof hf, "%s.experts.down_proj", prefix);
    const st_tensor *down = take(p, hf, 3, (int64_t[]){n_exp, d, ff});
    for (int role = 0; role < 3 && p->status == MOE_OK; role++) {
        snprintf(gguf, sizeof gguf, "blk.%d.%s.weight", l, gguf_expert_roles[role]);
        out_tensor *o =
            role == 2 ? add_out(p, gguf, 3, ff, d, n_exp, (int)n_exp) : add_out(p, gguf, 3, d, ff, n_exp, (int)n_exp);
        for (int64_t e = 0; o && e < n_exp; e++)
            o->parts[e] = role == 2 ? (row_source){down, e * d} : (row_source){gate_up, e * 2 * ff + role * ff};
    }
}

/* The MoE block of layer l: the router under "mlp" (or Mixtral's
 * "block_sparse_moe"), its experts split or fused, the shared expert. */
static void map_moe(planner *p, int l) {
    const hparams *hp = p->hp;
    static const char *const blocks[] = {"mlp", "block_sparse_moe"};
    char prefix[64], hf[NAME_MAX_LEN], gguf[64];
    int block = 0;
    for (int i = 1; i >= 0; i--) {
        snprintf(hf, sizeof hf, "model.layers.%d.%s.gate.weight", l, blocks[i]);
        if (safetensors_find(p->ckpt, hf)) block = i;
    }
    snprintf(prefix, sizeof prefix, "model.layers.%d.%s", l, blocks[block]);
    snprintf(hf, sizeof hf, "%s.gate.weight", prefix);
    snprintf(gguf, sizeof gguf, "blk.%d.ffn_gate_inp.weight", l);
    map_matrix(p, gguf, hf, hp->n_experts, hp->n_embd, 0);
    int naming = -1;
    for (int i = 1; i >= 0; i--) {
        snprintf(hf, sizeof hf, "%s.experts.0.%s.weight", prefix, expert_names[i][0]);
        if (safetensors_find(p->ckpt, hf)) naming = i;
    }
    snprintf(hf, sizeof hf, "%s.experts.gate_up_proj", prefix);
    if (naming >= 0)
        map_experts_split(p, l, prefix, naming);
    else if (safetensors_find(p->ckpt, hf))
        map_experts_fused(p, l, prefix);
    else if (p->status == MOE_OK)
        p->status = moe_error_set(p->err, MOE_ERR_NOT_FOUND,
                                  "the experts of layer %d are missing (no %s.experts.0.%s"
                                  ".weight, nor Transformers 5's fused %s)",
                                  l, prefix, expert_names[0][0], hf);
    if (hp->n_ff_shared == 0) return;
    static const char *const shared[3][2] = {
        {"ffn_gate_shexp", "gate_proj"}, {"ffn_up_shexp", "up_proj"}, {"ffn_down_shexp", "down_proj"}};
    for (int role = 0; role < 3; role++) {
        bool down = role == 2;
        snprintf(hf, sizeof hf, "%s.shared_expert.%s.weight", prefix, shared[role][1]);
        snprintf(gguf, sizeof gguf, "blk.%d.%s.weight", l, shared[role][0]);
        map_matrix(p, gguf, hf, down ? hp->n_embd : hp->n_ff_shared, down ? hp->n_ff_shared : hp->n_embd, 0);
    }
    snprintf(hf, sizeof hf, "%s.shared_expert_gate.weight", prefix);
    snprintf(gguf, sizeof gguf, "blk.%d.ffn_gate_inp_shexp.weight", l);
    map_vector(p, gguf, hf, hp->n_embd, true);
}

static void map_dense_ffn(planner *p, int l) {
    const hparams *hp = p->hp;
    static const char *const roles[3][2] = {
        {"ffn_gate", "gate_proj"}, {"ffn_up", "up_proj"}, {"ffn_down", "down_proj"}};
    char hf[NAME_MAX_LEN], gguf[64];
    for (int role = 0; role < 3; role++) {
        bool down = role == 2;
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.%s.weight", l, roles[role][1]);
        snprintf(gguf, sizeof gguf, "blk.%d.%s.weight", l, roles[role][0]);
        map_matrix(p, gguf, hf, down ? hp->n_embd : hp->n_ff, down ? hp->n_ff : hp->n_embd, 0);
    }
}

static void map_attention(planner *p, int l) {
    const hparams *hp = p->hp;
    const arch_desc *desc = hp->desc;
    int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim, kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    bool norm_pairs = desc->rope == ROPE_NORM;
    char hf[NAME_MAX_LEN], gguf[64];
#define MAP(kind, gguf_role, hf_role, ...)                                                                             \
    (snprintf(gguf, sizeof gguf, "blk.%d." gguf_role, l), snprintf(hf, sizeof hf, "model.layers.%d." hf_role, l),      \
     map_##kind(p, gguf, hf, __VA_ARGS__))
    MAP(vector, "attn_norm.weight", "input_layernorm.weight", hp->n_embd, false);
    MAP(matrix, "attn_q.weight", "self_attn.q_proj.weight", q_dim, hp->n_embd, norm_pairs ? hp->n_heads : 0);
    MAP(matrix, "attn_k.weight", "self_attn.k_proj.weight", kv_dim, hp->n_embd, norm_pairs ? hp->n_kv_heads : 0);
    MAP(matrix, "attn_v.weight", "self_attn.v_proj.weight", kv_dim, hp->n_embd, 0);
    MAP(matrix, "attn_output.weight", "self_attn.o_proj.weight", hp->n_embd, q_dim, 0);
    if (desc->qkv_bias) {
        MAP(vector, "attn_q.bias", "self_attn.q_proj.bias", q_dim, false);
        MAP(vector, "attn_k.bias", "self_attn.k_proj.bias", kv_dim, false);
        MAP(vector, "attn_v.bias", "self_attn.v_proj.bias", kv_dim, false);
    }
    if (desc->qk_norm != QK_NORM_NONE) {
        bool full = desc->qk_norm == QK_NORM_FULL;
        MAP(vector, "attn_q_norm.weight", "self_attn.q_norm.weight", full ? q_dim : hp->head_dim, false);
        MAP(vector, "attn_k_norm.weight", "self_attn.k_norm.weight", full ? kv_dim : hp->head_dim, false);
    }
    MAP(vector, "ffn_norm.weight", "post_attention_layernorm.weight", hp->n_embd, false);
#undef MAP
}

/* Llama 3's RoPE scaling as per-dimension frequency divisors, the way
 * llama.cpp stores it (rope_freqs.weight): long wavelengths are slowed by
 * `factor`, short ones kept, and the band between blended smoothly. */
static void make_rope_freqs(planner *p) {
    const hparams *hp = p->hp;
    int n = hp->head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) {
        p->status = moe_error_set(p->err, MOE_ERR_NOMEM, "out of memory");
        return;
    }
    double low_wavelen = hp->original_ctx / hp->low_freq_factor, high_wavelen = hp->original_ctx / hp->high_freq_factor;
    for (int i = 0; i < n; i++) {
        double wavelen = 2 * M_PI * pow(hp->rope_base, 2.0 * i / hp->head_dim);
        double smooth =
            (hp->original_ctx / wavelen - hp->low_freq_factor) / (hp->high_freq_factor - hp->low_freq_factor);
        f[i] = wavelen < high_wavelen  ? 1.0f
               : wavelen > low_wavelen ? hp->factor
                                       : (float)(1.0 / ((1 - smooth) / hp->factor + smooth));
    }
    p->rope_freqs = (st_tensor){.name = (char *)"rope_freqs (generated)",
                                .type = MOE_TYPE_F32,
                                .n_dims = 1,
                                .shape = {n},
                                .n_elements = (uint64_t)n,
                                .data = (const uint8_t *)f,
                                .nbytes = (uint64_t)n * 4};
    out_tensor *o = add_out(p, "rope_freqs.weight", 1, n, 1, 1, 1);
    if (o) o->parts[0] = (row_source){&p->rope_freqs, 0};
}

/* Every checkpoint tensor must have found a place: one left over is a part
 * of the model moe.c would not compute. */
static void check_all_used(planner *p) {
    size_t n;
    const st_tensor *all = safetensors_tensors(p->ckpt, &n);
    for (size_t i = 0; i < n && p->status == MOE_OK; i++) {
        const char *name = all[i].name;
        size_t len = strlen(name);
        bool ignorable = (len >= 21 && strcmp(name + len - 21, "rotary_emb.inv_freq") == 0) ||
                         (p->hp->tied && strcmp(name, "lm_head.weight") == 0);
        if (!all[i].used && !ignorable)
            p->status = moe_error_set(p->err, MOE_ERR_UNSUPPORTED,
                                      "tensor %s (in %s) has no place in a %s model: the "
                                      "checkpoint uses a feature moe.c does not implement",
                                      name, all[i].file, p->hp->arch->hf_name);
    }
}

static moe_status build_plan(planner *p) {
    const hparams *hp = p->hp;
    map_matrix(p, "token_embd.weight", "model.embed_tokens.weight", hp->n_vocab, hp->n_embd, 0);
    if (hp->scaling == SCALING_LLAMA3) make_rope_freqs(p);
    for (int l = 0; l < hp->n_layers && p->status == MOE_OK; l++) {
        map_attention(p, l);
        if (hp->n_experts)
            map_moe(p, l);
        else
            map_dense_ffn(p, l);
    }
    map_vector(p, "output_norm.weight", "model.norm.weight", hp->n_embd, false);
    if (!hp->tied) map_matrix(p, "output.weight", "lm_head.weight", hp->n_vocab, hp->n_embd, 0);
    check_all_used(p);
    return p->status;
}

static void free_plan(planner *p) {
    for (int i = 0; i < p->n; i++)
        free(p->t[i].parts);
    free(p->t);
    free((void *)p->rope_freqs.data);
}

/* ------------------------------------------------------------ metadata */

typedef struct meta_writer {
    gguf_writer *w;
    const char *arch;
    moe_error *err;
    moe_status status;
} meta_writer;

static const char *arch_key(const meta_writer *m, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", m->arch, suffix);
    return buf;
}

static void meta_u32(meta_writer *m, const char *suffix, int v) {
    char key[128];
    if (m->status == MOE_OK)
        m->status = gguf_writer_set_u32(m->w, arch_key(m, suffix, key, sizeof key), (uint32_t)v, m->err);
}

static void meta_f32(meta_writer *m, const char *suffix, float v) {
    char key[128];
    if (m->status == MOE_OK) m->status = gguf_writer_set_f32(m->w, arch_key(m, suffix, key, sizeof key), v, m->err);
}

static void meta_hparams(meta_writer *m, const hparams *hp) {
    meta_u32(m, "block_count", hp->n_layers);
    meta_u32(m, "context_length", hp->n_ctx);
    meta_u32(m, "embedding_length", hp->n_embd);
    if (hp->n_ff > 0) meta_u32(m, "feed_forward_length", hp->n_ff);
    meta_u32(m, "attention.head_count", hp->n_heads);
    meta_u32(m, "attention.head_count_kv", hp->n_kv_heads);
    meta_u32(m, "attention.key_length", hp->head_dim);
    meta_u32(m, "attention.value_length", hp->head_dim);
    meta_u32(m, "rope.dimension_count", hp->head_dim);
    meta_f32(m, "rope.freq_base", hp->rope_base);
    meta_f32(m, "attention.layer_norm_rms_epsilon", hp->rms_eps);
    if (hp->scaling == SCALING_LINEAR) {
        char key[128];
        if (m->status == MOE_OK)
            m->status = gguf_writer_set_str(m->w, arch_key(m, "rope.scaling.type", key, sizeof key), "linear", m->err);
        meta_f32(m, "rope.scaling.factor", hp->factor);
    }
    if (hp->n_experts == 0) return;
    meta_u32(m, "expert_count", hp->n_experts);
    meta_u32(m, "expert_used_count", hp->n_experts_used);
    meta_u32(m, "expert_feed_forward_length", hp->n_ff_expert);
    if (hp->n_ff_shared > 0) meta_u32(m, "expert_shared_feed_forward_length", hp->n_ff_shared);
    /* Always written: the architectures' defaults differ (model.c's table)
     * and the checkpoint's config is what the model was trained with. */
    char key[128];
    if (m->status == MOE_OK)
        m->status =
            gguf_writer_set_bool(m->w, arch_key(m, "expert_weights_norm", key, sizeof key), hp->norm_topk, m->err);
}

/* general.name: the config's _name_or_path, else the directory's name. */
static void model_name(json_t *config, const char *dir, char *out, size_t n) {
    const char *name = json_string_value(value_of(config, "_name_or_path"));
    if (name && name[0]) {
        snprintf(out, n, "%s", name);
        return;
    }
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(out, n, "%.*s", (int)(len - start), dir + start);
}

static moe_status write_metadata(gguf_writer *w, const hparams *hp, json_t *config, const char *dir,
                                 const quant_recipe *recipe, moe_error *err) {
    char name[256], tok[4096], tok_config[4096];
    model_name(config, dir, name, sizeof name);
    moe_status st = gguf_writer_set_str(w, "general.architecture", hp->arch->gguf_name, err);
    if (st == MOE_OK) st = gguf_writer_set_str(w, "general.name", name, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "general.file_type", recipe->file_type, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    meta_writer m = {w, hp->arch->gguf_name, err, st};
    meta_hparams(&m, hp);
    if (m.status != MOE_OK) return m.status;
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    snprintf(tok_config, sizeof tok_config, "%s/tokenizer_config.json", dir);
    FILE *probe = fopen(tok_config, "r");
    if (probe) fclose(probe);
    return hf_tokenizer_to_gguf(tok, probe ? tok_config : NULL, (uint32_t)hp->n_vocab, w, err);
}

/* ------------------------------------------------------------ writing */

typedef struct row_job {
    const out_tensor *t;
    int64_t row_len, n_rows;
    size_t out_row_bytes;
    uint8_t *out;
    float **scratch; /* one f32 row per worker */
    progress *bar;
} row_job;

/* Where output row r comes from. Llama's pairing puts HF row i of a head
 * at 2i (first half) or 2(i - d/2) + 1 (second half); inverted here. */
static const uint8_t *source_row(const out_tensor *t, int64_t r, int64_t row_len, const st_tensor **src) {
    int64_t part = r / t->part_rows, local = r % t->part_rows;
    if (t->permute_heads > 0) {
        int64_t head_dim = t->part_rows / t->permute_heads, i = local % head_dim;
        local = local - i + (i % 2) * (head_dim / 2) + i / 2;
    }
    *src = t->parts[part].t;
    return (*src)->data + (size_t)(t->parts[part].first_row + local) * quant_row_bytes((*src)->type, row_len);
}

static void convert_rows(void *ctx, int64_t task, int worker) {
    row_job *job = ctx;
    const quant_format *to = quant_format_of(job->t->type);
    int64_t end = (task + 1) * ROWS_PER_TASK < job->n_rows ? (task + 1) * ROWS_PER_TASK : job->n_rows;
    uint64_t bytes_in = 0;
    for (int64_t r = task * ROWS_PER_TASK; r < end; r++) {
        const st_tensor *src;
        const uint8_t *row = source_row(job->t, r, job->row_len, &src);
        uint8_t *dst = job->out + (size_t)r * job->out_row_bytes;
        if (src->type == job->t->type) {
            memcpy(dst, row, job->out_row_bytes);
        } else {
            quant_format_of(src->type)->dequantize(row, job->scratch[worker], job->row_len);
            to->quantize(job->scratch[worker], dst, job->row_len);
        }
        bytes_in += quant_row_bytes(src->type, job->row_len);
    }
    progress_add(job->bar, bytes_in);
}

typedef struct writer_state {
    thread_pool *pool;
    float **scratch;
    uint8_t *buffer;
    progress *bar;
} writer_state;

static uint64_t out_bytes(const out_tensor *t) {
    return quant_row_bytes(t->type, (int64_t)t->ne[0]) * t->ne[1] * t->ne[2];
}

static moe_status alloc_writer(writer_state *s, const planner *p, int n_threads, moe_error *err) {
    uint64_t widest = 0, largest = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->t[i].ne[0] > widest) widest = p->t[i].ne[0];
        if (out_bytes(&p->t[i]) > largest) largest = out_bytes(&p->t[i]);
    }
    s->pool = thread_pool_new(n_threads);
    s->buffer = malloc(largest ? largest : 1);
    s->scratch = s->pool ? calloc((size_t)thread_pool_size(s->pool), sizeof *s->scratch) : NULL;
    if (!s->buffer || !s->scratch)
        return moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate %llu bytes for the largest tensor",
                             (unsigned long long)largest);
    for (int i = 0; i < thread_pool_size(s->pool); i++)
        if (!(s->scratch[i] = malloc(widest * sizeof(float))))
            return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    return MOE_OK;
}

static void free_writer(writer_state *s) {
    for (int i = 0; s->scratch && i < thread_pool_size(s->pool); i++)
        free(s->scratch[i]);
    free(s->scratch);
    free(s->buffer);
    thread_pool_free(s->pool);
}

static moe_status write_tensors(writer_state *s, const planner *p, gguf_writer *w, const hf_convert_options *o,
                                hf_convert_report *report, moe_error *err) {
    for (int i = 0; i < p->n; i++) {
        if (o->cancel && *o->cancel)
            return moe_error_set(err, MOE_ERR_INTERRUPTED, "interrupted; no output was written");
        const out_tensor *t = &p->t[i];
        row_job job = {.t = t,
                       .row_len = (int64_t)t->ne[0],
                       .n_rows = (int64_t)(t->ne[1] * t->ne[2]),
                       .out_row_bytes = quant_row_bytes(t->type, (int64_t)t->ne[0]),
                       .out = s->buffer,
                       .scratch = s->scratch,
                       .bar = s->bar};
        thread_pool_run(s->pool, (job.n_rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK, convert_rows, &job);
        moe_status st = gguf_writer_write_tensor(w, s->buffer, out_bytes(t), err);
        if (st != MOE_OK) return st;
        report->bytes_out += out_bytes(t);
        report->count_by_type[t->type]++;
    }
    report->n_tensors = (uint64_t)p->n;
    return gguf_writer_end(w, err);
}

/* Types by the recipe; the directory goes to the writer. */
static moe_status assign_types(planner *p, gguf_writer *w, const quant_recipe *recipe, hf_convert_report *report,
                               moe_error *err) {
    for (int i = 0; i < p->n; i++) {
        out_tensor *t = &p->t[i];
        t->type = quant_recipe_choose(recipe, t->name, t->n_dims, t->ne, (uint32_t)p->hp->n_layers);
        moe_status st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, NULL, err);
        if (st != MOE_OK) return st;
        for (int j = 0; j < t->n_parts; j++)
            report->bytes_in += (uint64_t)t->part_rows * quant_row_bytes(t->parts[j].t->type, (int64_t)t->ne[0]);
    }
    return MOE_OK;
}

static moe_status write_file(planner *p, gguf_writer *w, const hf_convert_options *o, hf_convert_report *report,
                             moe_error *err) {
    writer_state s = {0};
    atomic_file out = {.fd = -1};
    moe_status st = alloc_writer(&s, p, o->n_threads, err);
    if (st == MOE_OK) st = atomic_file_open(&out, o->out_path, err);
    if (st == MOE_OK) {
        s.bar = o->show_progress ? progress_start("converting", report->bytes_in, 1e-6, "MB") : NULL;
        st = gguf_writer_begin(w, out.fd, err);
        if (st == MOE_OK) st = write_tensors(&s, p, w, o, report, err);
        progress_finish(s.bar);
        if (st == MOE_OK)
            st = atomic_file_commit(&out, err);
        else
            atomic_file_abort(&out);
    }
    free_writer(&s);
    return st;
}

/* ------------------------------------------------------------ the whole */

/* The recipe asked for, or the checkpoint's own float type. */
static moe_status choose_recipe(const hf_convert_options *o, st_checkpoint *ckpt, const quant_recipe **out,
                                moe_error *err) {
    const char *name = o->type;
    if (!name) {
        const st_tensor *embd = safetensors_find(ckpt, "model.embed_tokens.weight");
        name = !embd || embd->type == MOE_TYPE_F32 ? "f32" : embd->type == MOE_TYPE_F16 ? "f16" : "bf16";
    }
    *out = quant_recipe_by_name(name);
    return *out ? MOE_OK : moe_error_set(err, MOE_ERR_INVALID_ARG, "unknown type '%s'", name);
}

static moe_status convert(const hf_convert_options *o, hparams *hp, json_t **config, st_checkpoint **ckpt, planner *p,
                          gguf_writer *w, hf_convert_report *report, moe_error *err) {
    char path[4096];
    const quant_recipe *recipe = NULL;
    snprintf(path, sizeof path, "%s/config.json", o->dir);
    moe_status st = read_hparams(path, hp, config, err);
    if (st == MOE_OK) st = safetensors_open_dir(o->dir, ckpt, err);
    if (st == MOE_OK && safetensors_holds_file(*ckpt, o->out_path))
        st = moe_error_set(err, MOE_ERR_INVALID_ARG, "refusing to overwrite the checkpoint's own %s", o->out_path);
    if (st == MOE_OK) st = choose_recipe(o, *ckpt, &recipe, err);
    if (st != MOE_OK) return st;
    snprintf(report->hf_arch, sizeof report->hf_arch, "%s", hp->arch->hf_name);
    report->gguf_arch = hp->arch->gguf_name;
    report->recipe = recipe->name;
    *p = (planner){.ckpt = *ckpt, .hp = hp, .err = err};
    st = build_plan(p);
    if (st == MOE_OK) st = write_metadata(w, hp, *config, o->dir, recipe, err);
    if (st == MOE_OK) st = assign_types(p, w, recipe, report, err);
    if (st == MOE_OK) st = write_file(p, w, o, report, err);
    return st;
}

moe_status hf_convert(const hf_convert_options *o, hf_convert_report *report, moe_error *err) {
    memset(report, 0, sizeof *report);
    hparams hp;
    json_t *config = NULL;
    st_checkpoint *ckpt = NULL;
    planner p = {0};
    gguf_writer *w = gguf_writer_new();
    moe_status st =
        w ? convert(o, &hp, &config, &ckpt, &p, w, report, err) : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    free_plan(&p);
    gguf_writer_free(w);
    safetensors_close(ckpt);
    json_decref(config);
    return st;
}
