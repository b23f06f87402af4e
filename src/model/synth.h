/*
 * synth.h — models with random but valid weights at real shapes.
 *
 * The benchmark and test vehicle until real weights are at hand (see
 * synth.c for how the weights are drawn). `moe synth` is a thin wrapper.
 */
#ifndef MOE_MODEL_SYNTH_H
#define MOE_MODEL_SYNTH_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "moe.h"
#include "quant/recipe.h"

typedef struct synth_preset {
    const char *name;
    const char *arch; /* NULL: any architecture (the tiny presets) */
    int n_layers, n_embd, n_heads, n_kv_heads, head_dim;
    int n_ff, n_experts, n_experts_used, n_ff_expert, n_ff_shared;
    int n_vocab, n_ctx;
    float rope_base;
} synth_preset;

const synth_preset *synth_preset_by_name(const char *name);
const synth_preset *synth_preset_at(int i); /* NULL past the end */

typedef struct synth_options {
    const synth_preset *preset;
    const char *arch;           /* NULL: the preset's (qwen3moe for tiny ones) */
    bool llama_experts;         /* llama with the tiny presets: Mixtral-style MoE */
    const quant_recipe *recipe; /* types, as `moe quantize` chooses them */
    const char *out_path;       /* written atomically */
    uint64_t seed;
    int n_threads;              /* <= 0: all CPUs */
    bool show_progress;
    volatile sig_atomic_t *cancel; /* polled between tensors */
} synth_options;

moe_status synth_model(const synth_options *options, moe_error *err);

#endif
