/*
 * fixture_model.c — writes a tiny Qwen3-MoE-shaped GGUF for end-to-end tests.
 *
 * usage: fixture_model OUT.gguf [f32|f16|bf16]
 *
 * Four layers, hidden 256, 8 experts of width 256 (2 active), vocabulary
 * 512: the tensor names, shapes and keys of a real qwen3moe file at a size
 * the test suite can quantize in a blink. Weights are seeded Gaussian noise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

enum { N_LAYERS = 4, N_EMBD = 256, N_HEADS = 4, N_KV_HEADS = 2, HEAD_DIM = 64, N_EXPERTS = 8, N_FF = 256, N_VOCAB = 512 };

static uint32_t seed = 12345;

static float noise(void) {
    /* sum of uniforms: roughly Gaussian, reproducible, no libm */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        seed = seed * 1664525u + 1013904223u;
        s += (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return s * 0.1f;
}

static moe_type weight_type = MOE_TYPE_F32;
static gguf_writer *w;
static int failures;
/* tensor data the writer points at until it saves */
static void *buffers[64];
static int n_buffers;

static void add(const char *name, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2, float fill) {
    uint64_t ne[3] = {ne0, ne1, ne2}, n = ne0 * ne1 * ne2;
    moe_type type = n_dims == 1 ? MOE_TYPE_F32 : weight_type;
    const quant_format *fmt = quant_format_of(type);
    float *values = malloc(n * sizeof *values);
    void *data = malloc(quant_row_bytes(type, (int64_t)ne0) * (n / ne0));
    for (uint64_t i = 0; i < n; i++) values[i] = fill != 0 ? fill : noise();
    fmt->quantize(values, data, (int64_t)n);
    moe_error err = {0};
    if (gguf_writer_add_tensor(w, name, type, n_dims, ne, data, &err) != MOE_OK) {
        fprintf(stderr, "fixture_model: %s\n", err.message);
        failures++;
    }
    free(values);
    buffers[n_buffers++] = data;
}

static void add_layer(int l) {
    char name[64];
#define LAYER(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, l), name)
    add(LAYER("attn_norm.weight"), 1, N_EMBD, 1, 1, 1.0f);
    add(LAYER("attn_q.weight"), 2, N_EMBD, N_HEADS * HEAD_DIM, 1, 0);
    add(LAYER("attn_k.weight"), 2, N_EMBD, N_KV_HEADS * HEAD_DIM, 1, 0);
    add(LAYER("attn_v.weight"), 2, N_EMBD, N_KV_HEADS * HEAD_DIM, 1, 0);
    add(LAYER("attn_q_norm.weight"), 1, HEAD_DIM, 1, 1, 1.0f);
    add(LAYER("attn_k_norm.weight"), 1, HEAD_DIM, 1, 1, 1.0f);
    add(LAYER("attn_output.weight"), 2, N_HEADS * HEAD_DIM, N_EMBD, 1, 0);
    add(LAYER("ffn_norm.weight"), 1, N_EMBD, 1, 1, 1.0f);
    add(LAYER("ffn_gate_inp.weight"), 2, N_EMBD, N_EXPERTS, 1, 0);
    add(LAYER("ffn_gate_exps.weight"), 3, N_EMBD, N_FF, N_EXPERTS, 0);
    add(LAYER("ffn_up_exps.weight"), 3, N_EMBD, N_FF, N_EXPERTS, 0);
    add(LAYER("ffn_down_exps.weight"), 3, N_FF, N_EMBD, N_EXPERTS, 0);
#undef LAYER
}

static void set_keys(void) {
    gguf_writer_set_str(w, "general.architecture", "qwen3moe", NULL);
    gguf_writer_set_str(w, "general.name", "moe.c test fixture", NULL);
    gguf_writer_set_u32(w, "qwen3moe.block_count", N_LAYERS, NULL);
    gguf_writer_set_u32(w, "qwen3moe.context_length", 512, NULL);
    gguf_writer_set_u32(w, "qwen3moe.embedding_length", N_EMBD, NULL);
    gguf_writer_set_u32(w, "qwen3moe.feed_forward_length", N_FF * 2, NULL);
    gguf_writer_set_u32(w, "qwen3moe.expert_feed_forward_length", N_FF, NULL);
    gguf_writer_set_u32(w, "qwen3moe.attention.head_count", N_HEADS, NULL);
    gguf_writer_set_u32(w, "qwen3moe.attention.head_count_kv", N_KV_HEADS, NULL);
    gguf_writer_set_u32(w, "qwen3moe.attention.key_length", HEAD_DIM, NULL);
    gguf_writer_set_u32(w, "qwen3moe.attention.value_length", HEAD_DIM, NULL);
    gguf_writer_set_u32(w, "qwen3moe.expert_count", N_EXPERTS, NULL);
    gguf_writer_set_u32(w, "qwen3moe.expert_used_count", 2, NULL);
    gguf_writer_set_f32(w, "qwen3moe.rope.freq_base", 1000000.0f, NULL);
    gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f, NULL);
    const char *tokens[N_VOCAB];
    char storage[N_VOCAB][8];
    for (int i = 0; i < N_VOCAB; i++) {
        snprintf(storage[i], sizeof storage[i], "t%d", i);
        tokens[i] = storage[i];
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tokens, N_VOCAB, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: fixture_model OUT.gguf [f32|f16|bf16]\n");
        return 2;
    }
    if (argc == 3) {
        const quant_format *f = quant_format_by_name(argv[2]);
        if (!f || (f->type != MOE_TYPE_F32 && f->type != MOE_TYPE_F16 && f->type != MOE_TYPE_BF16)) {
            fprintf(stderr, "fixture_model: type must be f32, f16 or bf16\n");
            return 2;
        }
        weight_type = f->type;
    }
    w = gguf_writer_new();
    set_keys();
    add("token_embd.weight", 2, N_EMBD, N_VOCAB, 1, 0);
    for (int l = 0; l < N_LAYERS; l++) add_layer(l);
    add("output_norm.weight", 1, N_EMBD, 1, 1, 1.0f);
    add("output.weight", 2, N_EMBD, N_VOCAB, 1, 0);
    moe_error err = {0};
    if (failures || gguf_writer_save(w, argv[1], &err) != MOE_OK) {
        fprintf(stderr, "fixture_model: %s\n", err.message);
        return 1;
    }
    gguf_writer_free(w);
    for (int i = 0; i < n_buffers; i++) free(buffers[i]);
    return 0;
}
