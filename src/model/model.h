/*
 * model.h — a model as plain data: its description, hyperparameters and
 * weights bound by name from a GGUF file.
 *
 * Everything that differs between the architectures moe.c runs is in two
 * places: a row of the architecture table (model.c: RoPE pairing, q/k norm,
 * biases, routing defaults) and the hyperparameters read from the file. The
 * backends read a `model` and never look at the architecture name.
 *
 * Shapes follow GGUF: a matrix of `rows` outputs by `cols` inputs is stored
 * row-major, each row `row_bytes` long in the tensor's own quant type. All
 * weight pointers point into the memory-mapped file; only vectors stored in
 * a type other than f32 are converted (and owned) here.
 */
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "moe.h"
#include "quant/quant.h"

typedef enum rope_style {
    ROPE_NORM, /* rotate adjacent pairs (2i, 2i+1): llama.cpp's llama layout */
    ROPE_NEOX, /* rotate (i, i + n_rot/2): Qwen, OLMoE, GPT-NeoX */
} rope_style;

typedef enum qk_norm_kind {
    QK_NORM_NONE,
    QK_NORM_PER_HEAD, /* RMSNorm of each head's q and k (Qwen3, Qwen3-MoE) */
    QK_NORM_FULL,     /* RMSNorm over the whole q and k projections (OLMoE) */
} qk_norm_kind;

typedef enum gating_func {
    GATING_SOFTMAX,
    GATING_SIGMOID,
} gating_func;

/* What an architecture is, beyond its numbers. */
typedef struct arch_desc {
    const char *name; /* general.architecture */
    rope_style rope;
    qk_norm_kind qk_norm;
    bool qkv_bias;          /* Qwen2 family: biases on q, k, v */
    bool norm_topk_default; /* renormalise the top-k weights to sum to 1 */
} arch_desc;

typedef struct model_config {
    const arch_desc *arch;
    int n_layers;
    int n_embd;
    int n_heads, n_kv_heads;
    int head_dim;       /* key and value head dimension */
    int n_rot;          /* dimensions RoPE rotates (<= head_dim) */
    int n_vocab;
    int n_ctx_train;
    int n_ff;           /* dense FFN width (dense models) */
    int n_experts, n_experts_used; /* 0 for dense models */
    int n_ff_expert;
    int n_ff_shared;    /* shared expert width, 0 when none */
    float rms_eps;
    float rope_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    gating_func gating;
    bool norm_topk;
    float expert_weights_scale; /* multiplies the routing weights */
    bool tied_embeddings;
} model_config;

/* A 2-D weight (or one expert of a 3-D one): rows x cols. */
typedef struct matrix {
    const uint8_t *data;
    moe_type type;
    int64_t rows, cols;
    size_t row_bytes;
} matrix;

/* The routed experts of one projection: n matrices of one shape and type,
 * from a merged 3-D tensor or from per-expert tensors. */
typedef struct expert_set {
    moe_type type;
    int64_t rows, cols;
    size_t row_bytes;
    const uint8_t **data; /* [n_experts] */
} expert_set;

typedef struct vec {
    const float *data;
    int64_t n;
} vec;

typedef struct layer_weights {
    vec attn_norm;     /* (n_embd) */
    matrix wq;         /* (n_heads*head_dim, n_embd) */
    matrix wk, wv;     /* (n_kv_heads*head_dim, n_embd) */
    vec bq, bk, bv;    /* biases or {NULL, 0} */
    vec q_norm, k_norm; /* (head_dim) per head, or (n_heads*head_dim) full */
    matrix wo;         /* (n_embd, n_heads*head_dim) */
    vec ffn_norm;      /* (n_embd) */
    /* dense FFN */
    matrix ffn_gate, ffn_up; /* (n_ff, n_embd) */
    matrix ffn_down;         /* (n_embd, n_ff) */
    /* MoE */
    matrix router;           /* (n_experts, n_embd), f32 in practice */
    expert_set exp_gate, exp_up; /* each (n_ff_expert, n_embd) */
    expert_set exp_down;         /* each (n_embd, n_ff_expert) */
    matrix sh_gate, sh_up, sh_down; /* shared expert, data NULL when none */
    vec sh_gate_inp;         /* (n_embd): sigmoid gate of the shared expert */
} layer_weights;

typedef struct model {
    model_config config;
    gguf_file *file;      /* owns the mapping every weight points into */
    matrix token_embd;    /* (n_vocab, n_embd) */
    vec output_norm;      /* (n_embd) */
    matrix output;        /* (n_vocab, n_embd); token_embd when tied */
    vec rope_freqs;       /* optional per-dimension frequency factors */
    layer_weights *layers; /* [n_layers] */
    /* private: vectors converted to f32, expert pointer arrays */
    void **owned;
    int n_owned, cap_owned;
} model;

/* Bind a model to an opened file (takes ownership of `file` on success).
 * Errors name the missing key or tensor and the expected shape. */
moe_status model_load_from_gguf(gguf_file *file, model **out, moe_error *err);
moe_status model_load(const char *path, model **out, moe_error *err);
void model_free(model *m);

/* The description of an architecture name, NULL when moe.c does not run it. */
const arch_desc *model_arch_by_name(const char *name);

#endif
