/*
 * synth.c — a model with random but valid weights at the shapes of a real one.
 *
 * Until real weights are at hand, synthetic files are the benchmark and test
 * vehicle: the 30B-A3B preset has exactly the tensors, types and bytes of
 * Qwen3-30B-A3B, so decode speed measured on it is the speed on the real
 * model. Weights are drawn so activations stay bounded through every layer:
 * each matrix ~ N(0, 1/fan_in), the residual-writing projections (attn
 * output, FFN down) further scaled by 1/sqrt(2 * layers), norms 1.
 *
 * Quantized tensors are filled with blocks drawn from a pool of blocks
 * quantized from Gaussian data, so a 17 GB file takes seconds, not the hour
 * quantizing 30 B random floats would; every block is one the format's own
 * quantizer produced, hence finite and sane. Output is deterministic for a
 * seed, whatever the thread count.
 *
 * The vocabulary is byte-level BPE without merges: the 256 byte tokens,
 * ChatML's special tokens, and unused fillers up to the preset's size.
 */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/progress.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static const synth_preset presets[] = {
    /* name               arch        L   embd  H   KV  hd   ff     E    k  ffE   shared vocab   ctx    base */
    {"tiny", NULL, 2, 128, 4, 2, 32, 256, 8, 2, 64, 128, 512, 512, 10000.0f},
    {"small", NULL, 4, 256, 8, 4, 32, 512, 16, 4, 128, 256, 4096, 2048, 10000.0f},
    {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 128, 8, 768, 0, 151936, 40960, 1000000.0f},
    {"qwen1.5-moe-a2.7b", "qwen2moe", 24, 2048, 16, 16, 128, 5632, 60, 4, 1408, 5632, 151936, 8192, 1000000.0f},
    {"mixtral-8x7b", "llama", 32, 4096, 32, 8, 128, 14336, 8, 2, 14336, 0, 32000, 32768, 1000000.0f},
    {"olmoe-1b-7b", "olmoe", 16, 2048, 16, 16, 128, 1024, 64, 8, 1024, 0, 50304, 4096, 10000.0f},
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 0, 0, 0, 0, 151936, 40960, 1000000.0f},
    {"llama-3-8b", "llama", 32, 4096, 32, 8, 128, 14336, 0, 0, 0, 0, 128256, 8192, 500000.0f},
};

const synth_preset *synth_preset_at(int i) {
    if (i < 0 || (size_t)i >= sizeof presets / sizeof presets[0]) return NULL;
    return &presets[i];
}

const synth_preset *synth_preset_by_name(const char *name) {
    for (int i = 0; synth_preset_at(i); i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

/* ------------------------------------------------------------ the tensor plan */

typedef enum tensor_role { ROLE_NORM, ROLE_WEIGHT, ROLE_RESIDUAL_OUT, ROLE_EMBEDDING } tensor_role;

typedef struct planned_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    tensor_role role;
    moe_type type;
    float sigma;
} planned_tensor;

typedef struct plan {
    planned_tensor *t;
    int n, cap;
} plan;

static int plan_add(plan *p, const char *name, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                    tensor_role role) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 256;
        planned_tensor *grown = realloc(p->t, (size_t)p->cap * sizeof *grown);
        if (!grown) return -1;
        p->t = grown;
    }
    planned_tensor *t = &p->t[p->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
    t->role = role;
    return 0;
}

static int plan_layer(plan *p, const synth_preset *ps, const arch_desc *arch, int l) {
    char n[64];
    int q = ps->n_heads * ps->head_dim, kv = ps->n_kv_heads * ps->head_dim, err = 0;
#define T(role_name, dims, a, b, c, role) (snprintf(n, sizeof n, "blk.%d." role_name, l), err |= plan_add(p, n, dims, a, b, c, role))
    T("attn_norm.weight", 1, ps->n_embd, 1, 1, ROLE_NORM);
    T("attn_q.weight", 2, ps->n_embd, q, 1, ROLE_WEIGHT);
    T("attn_k.weight", 2, ps->n_embd, kv, 1, ROLE_WEIGHT);
    T("attn_v.weight", 2, ps->n_embd, kv, 1, ROLE_WEIGHT);
    if (arch->qkv_bias) {
        T("attn_q.bias", 1, q, 1, 1, ROLE_WEIGHT);
        T("attn_k.bias", 1, kv, 1, 1, ROLE_WEIGHT);
        T("attn_v.bias", 1, kv, 1, 1, ROLE_WEIGHT);
    }
    if (arch->qk_norm != QK_NORM_NONE) {
        bool full = arch->qk_norm == QK_NORM_FULL;
        T("attn_q_norm.weight", 1, full ? q : ps->head_dim, 1, 1, ROLE_NORM);
        T("attn_k_norm.weight", 1, full ? kv : ps->head_dim, 1, 1, ROLE_NORM);
    }
    T("attn_output.weight", 2, q, ps->n_embd, 1, ROLE_RESIDUAL_OUT);
    T("ffn_norm.weight", 1, ps->n_embd, 1, 1, ROLE_NORM);
    if (ps->n_experts == 0) {
        T("ffn_gate.weight", 2, ps->n_embd, ps->n_ff, 1, ROLE_WEIGHT);
        T("ffn_up.weight", 2, ps->n_embd, ps->n_ff, 1, ROLE_WEIGHT);
        T("ffn_down.weight", 2, ps->n_ff, ps->n_embd, 1, ROLE_RESIDUAL_OUT);
    } else {
        T("ffn_gate_inp.weight", 2, ps->n_embd, ps->n_experts, 1, ROLE_WEIGHT);
        T("ffn_gate_exps.weight", 3, ps->n_embd, ps->n_ff_expert, ps->n_experts, ROLE_WEIGHT);
        T("ffn_up_exps.weight", 3, ps->n_embd, ps->n_ff_expert, ps->n_experts, ROLE_WEIGHT);
        T("ffn_down_exps.weight", 3, ps->n_ff_expert, ps->n_embd, ps->n_experts, ROLE_RESIDUAL_OUT);
        if (ps->n_ff_shared) {
            T("ffn_gate_inp_shexp.weight", 1, ps->n_embd, 1, 1, ROLE_WEIGHT);
            T("ffn_gate_shexp.weight", 2, ps->n_embd, ps->n_ff_shared, 1, ROLE_WEIGHT);
            T("ffn_up_shexp.weight", 2, ps->n_embd, ps->n_ff_shared, 1, ROLE_WEIGHT);
            T("ffn_down_shexp.weight", 2, ps->n_ff_shared, ps->n_embd, 1, ROLE_RESIDUAL_OUT);
        }
    }
#undef T
    return err;
}

static int build_plan(plan *p, const synth_preset *ps, const arch_desc *arch, const quant_recipe *recipe) {
    int err = plan_add(p, "token_embd.weight", 2, ps->n_embd, ps->n_vocab, 1, ROLE_EMBEDDING);
    for (int l = 0; l < ps->n_layers && !err; l++) err = plan_layer(p, ps, arch, l);
    err |= plan_add(p, "output_norm.weight", 1, ps->n_embd, 1, 1, ROLE_NORM);
    err |= plan_add(p, "output.weight", 2, ps->n_embd, ps->n_vocab, 1, ROLE_WEIGHT);
    if (err) return -1;
    float residual_scale = 1.0f / sqrtf(2.0f * ps->n_layers);
    for (int i = 0; i < p->n; i++) {
        planned_tensor *t = &p->t[i];
        t->type = quant_recipe_choose(recipe, t->name, t->n_dims, t->ne, (uint32_t)ps->n_layers);
        t->sigma = t->role == ROLE_EMBEDDING ? 1.0f : 1.0f / sqrtf((float)t->ne[0]);
        if (t->role == ROLE_RESIDUAL_OUT) t->sigma *= residual_scale;
    }
    return 0;
}

/* ------------------------------------------------------------ random data */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float gaussian(uint64_t *state) {
    double u = ((splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double v = (splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

enum { POOL_BLOCKS = 4096, FILL_CHUNK = 1 << 16 /* blocks per task */ };

/* Blocks of one type quantized from N(0, sigma): what tensors are filled
 * from. Blocks of 1 element (float types) make a pool of 4096 values. */
typedef struct block_pool {
    moe_type type;
    float sigma;
    size_t block_bytes;
    uint8_t *blocks;
} block_pool;

static int pool_fill(block_pool *pool, moe_type type, float sigma, uint64_t seed) {
    const quant_format *f = quant_format_of(type);
    pool->type = type;
    pool->sigma = sigma;
    pool->block_bytes = f->block_bytes;
    free(pool->blocks);
    pool->blocks = malloc(POOL_BLOCKS * f->block_bytes);
    float *values = malloc((size_t)f->block_size * sizeof *values);
    if (!pool->blocks || !values) {
        free(values);
        return -1;
    }
    for (int b = 0; b < POOL_BLOCKS; b++) {
        for (int64_t i = 0; i < f->block_size; i++) values[i] = gaussian(&seed) * sigma;
        f->quantize(values, pool->blocks + (size_t)b * f->block_bytes, f->block_size);
    }
    free(values);
    return 0;
}

typedef struct fill_job {
    const block_pool *pool;
    uint8_t *out;
    uint64_t n_blocks;
    uint64_t seed;
} fill_job;

static void fill_chunk(void *ctx, int64_t chunk, int worker) {
    const fill_job *job = ctx;
    uint64_t state = job->seed ^ ((uint64_t)chunk * 0xD1B54A32D192ED03ull);
    uint64_t first = (uint64_t)chunk * FILL_CHUNK, end = first + FILL_CHUNK;
    if (end > job->n_blocks) end = job->n_blocks;
    for (uint64_t b = first; b < end; b++) {
        uint64_t pick = splitmix64(&state) % POOL_BLOCKS;
        memcpy(job->out + b * job->pool->block_bytes, job->pool->blocks + pick * job->pool->block_bytes,
               job->pool->block_bytes);
    }
}

/* Norms are exactly 1 (plus nothing random: they only rescale). */
static void fill_ones(uint8_t *out, const planned_tensor *t) {
    float *values = (float *)out;
    for (uint64_t i = 0; i < t->ne[0]; i++) values[i] = 1.0f;
}

/* ------------------------------------------------------------ vocabulary */

static const char *special_tokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static moe_status write_vocabulary(gguf_writer *w, int n_vocab, moe_error *err) {
    int n_special = (int)(sizeof special_tokens / sizeof special_tokens[0]);
    if (n_vocab < 256 + n_special)
        return moe_error_set(err, MOE_ERR_RANGE, "vocabulary of %d is below the %d byte and special tokens", n_vocab,
                             256 + n_special);
    char **tokens = calloc((size_t)n_vocab, sizeof *tokens);
    int32_t *types = calloc((size_t)n_vocab, sizeof *types);
    moe_status st = tokens && types ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_vocab && st == MOE_OK; i++) {
        char buf[32];
        if (i < 256) buf[tokenizer_byte_symbol((uint8_t)i, buf)] = '\0';
        else if (i < 256 + n_special) snprintf(buf, sizeof buf, "%s", special_tokens[i - 256]);
        else snprintf(buf, sizeof buf, "<|unused_%d|>", i);
        types[i] = i < 256 ? 1 : i < 256 + n_special ? 3 : 5; /* normal, control, unused */
        if (!(tokens[i] = strdup(buf))) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    if (st == MOE_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", err);
    if (st == MOE_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2", err);
    if (st == MOE_OK) st = gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens, (uint64_t)n_vocab, err);
    if (st == MOE_OK) st = gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)n_vocab, err);
    if (st == MOE_OK) st = gguf_writer_set_str_array(w, "tokenizer.ggml.merges", NULL, 0, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + 2, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 256, err);
    if (st == MOE_OK) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false, err);
    if (st == MOE_OK)
        st = gguf_writer_set_str(w, "tokenizer.chat_template",
                                 "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                                 err);
    for (int i = 0; tokens && i < n_vocab; i++) free(tokens[i]);
    free(tokens);
    free(types);
    return st;
}

/* ------------------------------------------------------------ metadata */

static moe_status write_hparams(gguf_writer *w, const synth_preset *ps, const char *arch, const quant_recipe *recipe,
                                moe_error *err) {
    char key[128], name[128];
    moe_status st = MOE_OK;
#define U32(suffix, v) (snprintf(key, sizeof key, "%s.%s", arch, suffix), st = st ? st : gguf_writer_set_u32(w, key, (uint32_t)(v), err))
#define F32(suffix, v) (snprintf(key, sizeof key, "%s.%s", arch, suffix), st = st ? st : gguf_writer_set_f32(w, key, v, err))
    snprintf(name, sizeof name, "moe.c synthetic %s (%s)", ps->name, recipe->name);
    st = gguf_writer_set_str(w, "general.architecture", arch, err);
    if (st == MOE_OK) st = gguf_writer_set_str(w, "general.name", name, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "general.file_type", recipe->file_type, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    U32("block_count", ps->n_layers);
    U32("context_length", ps->n_ctx);
    U32("embedding_length", ps->n_embd);
    U32("feed_forward_length", ps->n_ff);
    U32("attention.head_count", ps->n_heads);
    U32("attention.head_count_kv", ps->n_kv_heads);
    U32("attention.key_length", ps->head_dim);
    U32("attention.value_length", ps->head_dim);
    U32("rope.dimension_count", ps->head_dim);
    F32("rope.freq_base", ps->rope_base);
    F32("attention.layer_norm_rms_epsilon", 1e-6f);
    if (ps->n_experts) {
        U32("expert_count", ps->n_experts);
        U32("expert_used_count", ps->n_experts_used);
        U32("expert_feed_forward_length", ps->n_ff_expert);
        if (ps->n_ff_shared) U32("expert_shared_feed_forward_length", ps->n_ff_shared);
    }
#undef U32
#undef F32
    return st;
}

/* ------------------------------------------------------------ writing */

static moe_status write_tensors(gguf_writer *w, const plan *p, const synth_options *a, moe_error *err) {
    uint64_t total = 0, largest = 0;
    for (int i = 0; i < p->n; i++) {
        uint64_t bytes = quant_row_bytes(p->t[i].type, (int64_t)p->t[i].ne[0]) * p->t[i].ne[1] * p->t[i].ne[2];
        total += bytes;
        if (bytes > largest) largest = bytes;
    }
    uint8_t *buffer = malloc(largest);
    thread_pool *pool = thread_pool_new(a->n_threads);
    block_pool blocks = {.type = MOE_TYPE_COUNT};
    progress *bar = !a->show_progress ? NULL : progress_start("writing", total, 1e-9, "GB");
    moe_status st = buffer && pool ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate %llu bytes",
                                                              (unsigned long long)largest);
    for (int i = 0; i < p->n && st == MOE_OK; i++) {
        const planned_tensor *t = &p->t[i];
        const quant_format *f = quant_format_of(t->type);
        uint64_t n_blocks = t->ne[0] * t->ne[1] * t->ne[2] / (uint64_t)f->block_size;
        if (t->role == ROLE_NORM) {
            fill_ones(buffer, t);
        } else {
            if (blocks.type != t->type || blocks.sigma != t->sigma)
                if (pool_fill(&blocks, t->type, t->sigma, a->seed + (uint64_t)i) != 0)
                    st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
            fill_job job = {&blocks, buffer, n_blocks, a->seed * 31 + (uint64_t)i};
            if (st == MOE_OK) thread_pool_run(pool, (int64_t)((n_blocks + FILL_CHUNK - 1) / FILL_CHUNK), fill_chunk, &job);
        }
        if (st == MOE_OK) st = gguf_writer_write_tensor(w, buffer, n_blocks * f->block_bytes, err);
        progress_add(bar, n_blocks * f->block_bytes);
        if (st == MOE_OK && a->cancel && *a->cancel) st = moe_error_set(err, MOE_ERR_INTERRUPTED, "interrupted; no output was written");
    }
    progress_finish(bar);
    free(blocks.blocks);
    thread_pool_free(pool);
    free(buffer);
    return st == MOE_OK ? gguf_writer_end(w, err) : st;
}

static moe_status synth_checked(const synth_options *a, moe_error *err) {
    const arch_desc *arch = model_arch_by_name(a->arch);
    plan p = {0};
    gguf_writer *w = gguf_writer_new();
    atomic_file out = {.fd = -1};
    moe_status st = w && build_plan(&p, a->preset, arch, a->recipe) == 0 ? MOE_OK
                                                                          : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) st = write_hparams(w, a->preset, a->arch, a->recipe, err);
    if (st == MOE_OK) st = write_vocabulary(w, a->preset->n_vocab, err);
    for (int i = 0; i < p.n && st == MOE_OK; i++)
        st = gguf_writer_add_tensor(w, p.t[i].name, p.t[i].type, p.t[i].n_dims, p.t[i].ne, NULL, err);
    if (st == MOE_OK) st = atomic_file_open(&out, a->out_path, err);
    if (st == MOE_OK) {
        st = gguf_writer_begin(w, out.fd, err);
        if (st == MOE_OK) st = write_tensors(w, &p, a, err);
        if (st == MOE_OK) st = atomic_file_commit(&out, err);
        else atomic_file_abort(&out);
    }
    free(p.t);
    gguf_writer_free(w);
    return st;
}

static bool is_moe_arch(const char *arch) { return strstr(arch, "moe") != NULL || strcmp(arch, "llama") == 0; }

/* The preset fitted to the architecture: the tiny presets drop their
 * experts for dense architectures and their shared expert for all but
 * qwen2moe (which also uses as many KV heads as query heads). */
static moe_status resolve(const synth_options *in, synth_options *out, synth_preset *fitted, moe_error *err) {
    *out = *in;
    *fitted = *in->preset;
    if (!out->arch) out->arch = in->preset->arch ? in->preset->arch : "qwen3moe";
    if (!model_arch_by_name(out->arch))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "unknown architecture '%s'", out->arch);
    if (in->preset->arch && strcmp(in->preset->arch, out->arch) != 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "preset %s is a %s model, not %s", in->preset->name,
                             in->preset->arch, out->arch);
    if (!in->preset->arch) {
        bool qwen2moe = strcmp(out->arch, "qwen2moe") == 0;
        if (!is_moe_arch(out->arch) || (strcmp(out->arch, "llama") == 0 && !in->llama_experts)) fitted->n_experts = 0;
        if (!qwen2moe) fitted->n_ff_shared = 0;
        if (qwen2moe) fitted->n_kv_heads = fitted->n_heads;
    }
    out->preset = fitted;
    return MOE_OK;
}

moe_status synth_model(const synth_options *options, moe_error *err) {
    synth_options resolved;
    synth_preset fitted;
    moe_status st = resolve(options, &resolved, &fitted, err);
    return st == MOE_OK ? synth_checked(&resolved, err) : st;
}
