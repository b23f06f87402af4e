/*
 * hf_convert.h — a Hugging Face checkpoint directory to a GGUF model.
 *
 * Reads config.json, the safetensors weights (one file or shards with an
 * index), tokenizer.json and tokenizer_config.json, and writes the GGUF
 * file src/model binds, with llama.cpp's key and tensor names:
 *
 *   HF class                  GGUF arch  notes
 *   LlamaForCausalLM          llama      q/k rows permuted (see below)
 *   MistralForCausalLM        llama      same
 *   MixtralForCausalLM        llama      + routed experts, top-k renormalised
 *   Qwen2ForCausalLM          qwen2      q/k/v biases
 *   Qwen2MoeForCausalLM       qwen2moe   + routed and gated shared expert
 *   Qwen3ForCausalLM          qwen3      per-head q/k RMSNorm
 *   Qwen3MoeForCausalLM       qwen3moe   + routed experts
 *   OlmoeForCausalLM          olmoe      q/k RMSNorm over the projection
 *
 * Transformers rotates the two halves of each head (NEOX pairing). GGUF's
 * llama architecture pairs adjacent dimensions instead, so for llama the
 * rows of q_proj and k_proj are reordered head by head, as llama.cpp's
 * converter does: GGUF row 2i is HF row i and row 2i+1 is HF row i + d/2.
 * The other architectures keep the NEOX pairing and their rows as they are.
 *
 * Routed experts come per expert (experts.E.gate_proj, Mixtral's w1/w3/w2)
 * or fused as Transformers 5 keeps them in memory (experts.gate_up_proj
 * [E, 2F, H] with the gate rows first, experts.down_proj [E, H, F]); both
 * become the merged 3-D tensors ffn_{gate,up,down}_exps.
 *
 * Every tensor's shape is checked against config.json, and every tensor of
 * the checkpoint must be used: one moe.c would ignore (an o_proj bias, a
 * dense layer in a MoE stack) means a model moe.c would run differently,
 * so it is an error naming the tensor, as are an unknown architecture and a
 * setting moe.c does not implement. Weights are read as F32, F16 or BF16
 * and written in the types the recipe chooses (quant/recipe.h), row by row
 * over a thread pool; the output is atomic (common/atomic_file.h).
 */
#ifndef MOE_TOOLS_HF_CONVERT_H
#define MOE_TOOLS_HF_CONVERT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "moe.h"
#include "quant/quant.h"

typedef struct hf_convert_options {
    const char *dir;               /* the checkpoint directory */
    const char *out_path;          /* the GGUF file, written atomically */
    const char *type;              /* a recipe name (quant/recipe.h); NULL: the checkpoint's own float type */
    int n_threads;                 /* <= 0: all online CPUs */
    bool show_progress;            /* a bar on stderr when it is a terminal */
    volatile sig_atomic_t *cancel; /* polled between tensors */
} hf_convert_options;

typedef struct hf_convert_report {
    char hf_arch[64];      /* "Qwen3MoeForCausalLM" */
    const char *gguf_arch; /* "qwen3moe" */
    const char *recipe;    /* the type written, e.g. "q4_k_m" */
    uint64_t n_tensors;
    uint64_t bytes_in, bytes_out; /* tensor data */
    uint64_t count_by_type[MOE_TYPE_COUNT];
} hf_convert_report;

moe_status hf_convert(const hf_convert_options *options, hf_convert_report *report, moe_error *err);

#endif
