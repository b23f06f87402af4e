/*
 * model.c — the architecture table, hyperparameters and tensor binding.
 *
 * Tensor names and metadata keys are llama.cpp's GGUF conventions, so files
 * converted by other tools load here. Every tensor's type and shape is
 * checked against the hyperparameters before use; a mismatch is one error
 * naming the tensor, the expected and the found shape.
 */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static const arch_desc arch_table[] = {
    /* name        rope       q/k norm          qkv bias  renormalise top-k */
    {"llama", ROPE_NORM, QK_NORM_NONE, false, true}, /* also Mixtral */
    {"qwen2", ROPE_NEOX, QK_NORM_NONE, true, false},
    {"qwen3", ROPE_NEOX, QK_NORM_PER_HEAD, false, false},
    {"qwen2moe", ROPE_NEOX, QK_NORM_NONE, true, false},
    {"qwen3moe", ROPE_NEOX, QK_NORM_PER_HEAD, false, true},
    {"olmoe", ROPE_NEOX, QK_NORM_FULL, false, false},
};

const arch_desc *model_arch_by_name(const char *name) {
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch_table[i].name, name) == 0) return &arch_table[i];
    return NULL;
}

/* ------------------------------------------------------------ hyperparameters */

typedef struct key_reader {
    const gguf_file *file;
    const char *arch;
    moe_error *err;
    moe_status status; /* first failure; later reads are skipped */
} key_reader;

static void arch_key(const key_reader *r, const char *suffix, char *key, size_t n) {
    snprintf(key, n, "%s.%s", r->arch, suffix);
}

/* A required integer key in [min, max]. */
static int read_int(key_reader *r, const char *suffix, int min, int max) {
    char key[160];
    uint32_t v = 0;
    if (r->status != MOE_OK) return 0;
    arch_key(r, suffix, key, sizeof key);
    r->status = gguf_get_u32(r->file, key, &v, r->err);
    if (r->status == MOE_OK && (v < (uint32_t)min || v > (uint32_t)max))
        r->status = moe_error_set(r->err, MOE_ERR_RANGE, "%s is %u, expected %d to %d", key, v, min, max);
    return (int)v;
}

/* An optional integer key: `fallback` when absent. */
static int read_int_or(key_reader *r, const char *suffix, int fallback, int max) {
    char key[160];
    arch_key(r, suffix, key, sizeof key);
    return gguf_find(r->file, key) ? read_int(r, suffix, 0, max) : fallback;
}

static float read_float_or(key_reader *r, const char *suffix, float fallback) {
    char key[160];
    float v = fallback;
    if (r->status != MOE_OK) return fallback;
    arch_key(r, suffix, key, sizeof key);
    if (gguf_find(r->file, key)) r->status = gguf_get_f32(r->file, key, &v, r->err);
    return v;
}

static bool read_bool_or(key_reader *r, const char *suffix, bool fallback) {
    char key[160];
    bool v = fallback;
    if (r->status != MOE_OK) return fallback;
    arch_key(r, suffix, key, sizeof key);
    if (gguf_find(r->file, key)) r->status = gguf_get_bool(r->file, key, &v, r->err);
    return v;
}

static moe_status read_rope_scaling(key_reader *r, model_config *c) {
    char key[160];
    gguf_str type = {0, NULL};
    c->rope_freq_scale = 1.0f;
    arch_key(r, "rope.scaling.type", key, sizeof key);
    if (!gguf_find(r->file, key) || gguf_get_str(r->file, key, &type, r->err) != MOE_OK) return r->status;
    if (gguf_str_eq(type, "none")) return MOE_OK;
    if (!gguf_str_eq(type, "linear"))
        return r->status = moe_error_set(r->err, MOE_ERR_UNSUPPORTED, "RoPE scaling '%.*s' is not supported (%s)",
                                         (int)type.len, type.data, "moe.c supports none and linear");
    float factor = read_float_or(r, "rope.scaling.factor", 1.0f);
    if (factor <= 0) return r->status = moe_error_set(r->err, MOE_ERR_RANGE, "rope.scaling.factor must be > 0");
    c->rope_freq_scale = 1.0f / factor;
    return r->status;
}

static void read_moe_config(key_reader *r, model_config *c) {
    c->n_experts = read_int_or(r, "expert_count", 0, 4096);
    if (c->n_experts == 0) return;
    c->n_experts_used = read_int(r, "expert_used_count", 1, c->n_experts);
    c->n_ff_expert = read_int_or(r, "expert_feed_forward_length", c->n_ff, 1 << 20);
    c->n_ff_shared = read_int_or(r, "expert_shared_feed_forward_length", 0, 1 << 20);
    c->norm_topk = read_bool_or(r, "expert_weights_norm", c->arch->norm_topk_default);
    c->expert_weights_scale = read_float_or(r, "expert_weights_scale", 1.0f);
    c->gating = read_int_or(r, "expert_gating_func", 1, 2) == 2 ? GATING_SIGMOID : GATING_SOFTMAX;
}

static moe_status read_config(const gguf_file *f, const arch_desc *arch, model_config *c, moe_error *err) {
    key_reader r = {f, arch->name, err, MOE_OK};
    memset(c, 0, sizeof *c);
    c->arch = arch;
    c->n_layers = read_int(&r, "block_count", 1, 4096);
    c->n_embd = read_int(&r, "embedding_length", 1, 1 << 20);
    c->n_heads = read_int(&r, "attention.head_count", 1, 4096);
    c->n_kv_heads = read_int_or(&r, "attention.head_count_kv", c->n_heads, c->n_heads);
    c->head_dim = read_int_or(&r, "attention.key_length", c->n_heads ? c->n_embd / c->n_heads : 0, 1 << 16);
    c->n_rot = read_int_or(&r, "rope.dimension_count", c->head_dim, c->head_dim);
    c->n_ctx_train = read_int_or(&r, "context_length", 4096, 1 << 30);
    c->n_ff = read_int_or(&r, "feed_forward_length", 0, 1 << 20);
    c->rms_eps = read_float_or(&r, "attention.layer_norm_rms_epsilon", 1e-6f);
    c->rope_base = read_float_or(&r, "rope.freq_base", 10000.0f);
    c->expert_weights_scale = 1.0f;
    read_moe_config(&r, c);
    if (r.status == MOE_OK) read_rope_scaling(&r, c);
    if (r.status != MOE_OK) return r.status;
    if (c->n_heads % c->n_kv_heads != 0)
        return moe_error_set(err, MOE_ERR_FORMAT, "%d query heads are not a multiple of %d key/value heads", c->n_heads,
                             c->n_kv_heads);
    if (c->n_rot % 2 != 0) return moe_error_set(err, MOE_ERR_FORMAT, "RoPE dimension %d is odd", c->n_rot);
    int value_dim = read_int_or(&r, "attention.value_length", c->head_dim, 1 << 16);
    if (value_dim != c->head_dim)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "value head dimension %d differs from key dimension %d",
                             value_dim, c->head_dim);
    return r.status;
}

/* ------------------------------------------------------------ tensor binding */

typedef struct binder {
    model *m;
    moe_error *err;
    moe_status status;
} binder;

static void *own(binder *b, size_t bytes) {
    model *m = b->m;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

static const gguf_tensor *find(binder *b, const char *name, bool required) {
    if (b->status != MOE_OK) return NULL;
    const gguf_tensor *t = gguf_find_tensor(b->m->file, name);
    if (!t && required) b->status = moe_error_set(b->err, MOE_ERR_NOT_FOUND, "tensor %s is missing", name);
    return t;
}

static bool check_shape(binder *b, const char *name, const gguf_tensor *t, uint32_t n_dims, int64_t ne0, int64_t ne1,
                        int64_t ne2) {
    int64_t want[3] = {ne0, ne1, ne2};
    bool ok = t->n_dims == n_dims;
    for (uint32_t d = 0; d < n_dims && ok; d++) ok = (int64_t)t->ne[d] == want[d];
    if (!ok)
        b->status = moe_error_set(b->err, MOE_ERR_FORMAT,
                                  "tensor %s has shape [%llu, %llu, %llu] (%u dims), expected [%lld, %lld, %lld] (%u)",
                                  name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                                  (unsigned long long)t->ne[2], t->n_dims, (long long)ne0, (long long)ne1,
                                  (long long)ne2, n_dims);
    return ok;
}

static bool check_computable(binder *b, const char *name, moe_type type) {
    if (quant_is_supported(type)) return true;
    b->status = moe_error_set(b->err, MOE_ERR_UNSUPPORTED, "tensor %s has type %s, which moe.c cannot compute with",
                              name, quant_format_of(type)->name);
    return false;
}

/* A rows x cols matrix (GGUF ne = [cols, rows]). */
static matrix bind_matrix(binder *b, const char *name, int64_t rows, int64_t cols, bool required) {
    matrix mat = {0};
    const gguf_tensor *t = find(b, name, required);
    if (!t || !check_shape(b, name, t, 2, cols, rows, 1) || !check_computable(b, name, t->type)) return mat;
    mat.data = t->data;
    mat.type = t->type;
    mat.rows = rows;
    mat.cols = cols;
    mat.row_bytes = quant_row_bytes(t->type, cols);
    return mat;
}

/* A vector, converted to f32 when stored otherwise. */
static vec bind_vec(binder *b, const char *name, int64_t n, bool required) {
    vec v = {NULL, 0};
    const gguf_tensor *t = find(b, name, required);
    if (!t || !check_shape(b, name, t, 1, n, 1, 1) || !check_computable(b, name, t->type)) return v;
    if (t->type == MOE_TYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        v.data = t->data;
    } else {
        float *copy = own(b, (size_t)n * sizeof(float));
        if (!copy) {
            b->status = moe_error_set(b->err, MOE_ERR_NOMEM, "out of memory converting %s", name);
            return v;
        }
        quant_format_of(t->type)->dequantize(t->data, copy, n);
        v.data = copy;
    }
    v.n = n;
    return v;
}

static void name_of(char *buf, size_t n, int layer, const char *role) { snprintf(buf, n, "blk.%d.%s", layer, role); }

/* Routed experts: the merged 3-D tensor "blk.L.<role>_exps.weight", or the
 * older per-expert tensors "blk.L.<role>.E.weight". */
static expert_set bind_experts(binder *b, int layer, const char *role, int64_t rows, int64_t cols) {
    int n = b->m->config.n_experts;
    expert_set set = {0};
    char name[128];
    snprintf(name, sizeof name, "blk.%d.%s_exps.weight", layer, role);
    const uint8_t **data = own(b, (size_t)n * sizeof *data);
    if (!data) {
        b->status = moe_error_set(b->err, MOE_ERR_NOMEM, "out of memory");
        return set;
    }
    const gguf_tensor *merged = find(b, name, false);
    if (merged) {
        if (!check_shape(b, name, merged, 3, cols, rows, n) || !check_computable(b, name, merged->type)) return set;
        set.type = merged->type;
        set.row_bytes = quant_row_bytes(merged->type, cols);
        for (int e = 0; e < n; e++) data[e] = (const uint8_t *)merged->data + (size_t)e * set.row_bytes * rows;
    } else {
        for (int e = 0; e < n && b->status == MOE_OK; e++) {
            snprintf(name, sizeof name, "blk.%d.%s.%d.weight", layer, role, e);
            matrix one = bind_matrix(b, name, rows, cols, true);
            if (e > 0 && one.data && one.type != set.type)
                b->status = moe_error_set(b->err, MOE_ERR_UNSUPPORTED, "experts of blk.%d.%s mix types", layer, role);
            set.type = one.type;
            set.row_bytes = one.row_bytes;
            data[e] = one.data;
        }
        if (b->status == MOE_ERR_NOT_FOUND)
            moe_error_set(b->err, MOE_ERR_NOT_FOUND, "tensor blk.%d.%s_exps.weight (or per-expert blk.%d.%s.E.weight) is missing",
                          layer, role, layer, role);
    }
    set.rows = rows;
    set.cols = cols;
    set.data = data;
    return set;
}

static void bind_attention(binder *b, int l, layer_weights *w) {
    const model_config *c = &b->m->config;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char name[128];
#define NAME(role) (name_of(name, sizeof name, l, role), name)
    w->attn_norm = bind_vec(b, NAME("attn_norm.weight"), c->n_embd, true);
    w->wq = bind_matrix(b, NAME("attn_q.weight"), q_dim, c->n_embd, true);
    w->wk = bind_matrix(b, NAME("attn_k.weight"), kv_dim, c->n_embd, true);
    w->wv = bind_matrix(b, NAME("attn_v.weight"), kv_dim, c->n_embd, true);
    w->wo = bind_matrix(b, NAME("attn_output.weight"), c->n_embd, q_dim, true);
    bool bias = c->arch->qkv_bias;
    w->bq = bind_vec(b, NAME("attn_q.bias"), q_dim, bias);
    w->bk = bind_vec(b, NAME("attn_k.bias"), kv_dim, bias);
    w->bv = bind_vec(b, NAME("attn_v.bias"), kv_dim, bias);
    if (c->arch->qk_norm != QK_NORM_NONE) {
        bool full = c->arch->qk_norm == QK_NORM_FULL;
        w->q_norm = bind_vec(b, NAME("attn_q_norm.weight"), full ? q_dim : c->head_dim, true);
        w->k_norm = bind_vec(b, NAME("attn_k_norm.weight"), full ? kv_dim : c->head_dim, true);
    }
#undef NAME
}

static void bind_ffn(binder *b, int l, layer_weights *w) {
    const model_config *c = &b->m->config;
    char name[128];
#define NAME(role) (name_of(name, sizeof name, l, role), name)
    w->ffn_norm = bind_vec(b, NAME("ffn_norm.weight"), c->n_embd, true);
    if (c->n_experts == 0) {
        w->ffn_gate = bind_matrix(b, NAME("ffn_gate.weight"), c->n_ff, c->n_embd, true);
        w->ffn_up = bind_matrix(b, NAME("ffn_up.weight"), c->n_ff, c->n_embd, true);
        w->ffn_down = bind_matrix(b, NAME("ffn_down.weight"), c->n_embd, c->n_ff, true);
        return;
    }
    w->router = bind_matrix(b, NAME("ffn_gate_inp.weight"), c->n_experts, c->n_embd, true);
    w->exp_gate = bind_experts(b, l, "ffn_gate", c->n_ff_expert, c->n_embd);
    w->exp_up = bind_experts(b, l, "ffn_up", c->n_ff_expert, c->n_embd);
    w->exp_down = bind_experts(b, l, "ffn_down", c->n_embd, c->n_ff_expert);
    if (c->n_ff_shared > 0) {
        w->sh_gate = bind_matrix(b, NAME("ffn_gate_shexp.weight"), c->n_ff_shared, c->n_embd, true);
        w->sh_up = bind_matrix(b, NAME("ffn_up_shexp.weight"), c->n_ff_shared, c->n_embd, true);
        w->sh_down = bind_matrix(b, NAME("ffn_down_shexp.weight"), c->n_embd, c->n_ff_shared, true);
        w->sh_gate_inp = bind_vec(b, NAME("ffn_gate_inp_shexp.weight"), c->n_embd, false);
    }
#undef NAME
}

static moe_status bind_all(binder *b) {
    model *m = b->m;
    model_config *c = &m->config;
    const gguf_tensor *embd = find(b, "token_embd.weight", true);
    if (!embd) return b->status;
    if (embd->n_dims != 2 || embd->ne[0] != (uint64_t)c->n_embd || embd->ne[1] == 0 || embd->ne[1] > (1u << 24))
        return moe_error_set(b->err, MOE_ERR_FORMAT, "tensor token_embd.weight has shape [%llu, %llu], expected [%d, vocabulary]",
                             (unsigned long long)embd->ne[0], (unsigned long long)embd->ne[1], c->n_embd);
    c->n_vocab = (int)embd->ne[1];
    m->token_embd = bind_matrix(b, "token_embd.weight", c->n_vocab, c->n_embd, true);
    m->output_norm = bind_vec(b, "output_norm.weight", c->n_embd, true);
    c->tied_embeddings = gguf_find_tensor(m->file, "output.weight") == NULL;
    m->output = c->tied_embeddings ? m->token_embd : bind_matrix(b, "output.weight", c->n_vocab, c->n_embd, true);
    m->rope_freqs = bind_vec(b, "rope_freqs.weight", c->n_rot / 2, false);
    m->layers = own(b, (size_t)c->n_layers * sizeof *m->layers);
    if (!m->layers) return moe_error_set(b->err, MOE_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers && b->status == MOE_OK; l++) {
        bind_attention(b, l, &m->layers[l]);
        bind_ffn(b, l, &m->layers[l]);
    }
    return b->status;
}

static moe_status check_arch(const gguf_file *f, const arch_desc **out, moe_error *err) {
    gguf_str name;
    moe_status st = gguf_get_str(f, "general.architecture", &name, err);
    if (st != MOE_OK) return st;
    char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)(name.len < 63 ? name.len : 63), name.data);
    *out = model_arch_by_name(buf);
    if (!*out)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "architecture '%s' is not supported (moe.c runs llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe)",
                             buf);
    return MOE_OK;
}

moe_status model_load_from_gguf(gguf_file *file, model **out, moe_error *err) {
    *out = NULL;
    const arch_desc *arch;
    moe_status st = check_arch(file, &arch, err);
    model *m = st == MOE_OK ? calloc(1, sizeof *m) : NULL;
    if (st == MOE_OK && !m) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) {
        m->file = file;
        st = read_config(file, arch, &m->config, err);
    }
    if (st == MOE_OK) {
        binder b = {m, err, MOE_OK};
        st = bind_all(&b);
    }
    if (st != MOE_OK) {
        if (m) m->file = NULL; /* the caller keeps the file on failure */
        model_free(m);
        return st;
    }
    *out = m;
    return MOE_OK;
}

moe_status model_load(const char *path, model **out, moe_error *err) {
    gguf_file *f;
    moe_status st = gguf_open(path, &f, err);
    if (st != MOE_OK) return st;
    st = model_load_from_gguf(f, out, err);
    if (st != MOE_OK) {
        gguf_close(f);
        moe_error_prefix(err, "%s", path);
    }
    return st;
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    gguf_close(m->file);
    free(m);
}
