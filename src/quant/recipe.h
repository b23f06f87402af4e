/*
 * recipe.h — which type each tensor of a model gets when it is quantized.
 *
 * A recipe is named like llama.cpp's file types so users can carry their
 * habits over: a plain type ("q4_k", "q8_0", "bf16", ...) or a mix
 * ("q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s"). The rules, applied in order:
 *
 *   1. Vectors (1-D tensors: norms, biases) and the MoE routers
 *      (ffn_gate_inp*) stay F32: they are tiny and routing is sensitive.
 *   2. The output head (output.weight) gets Q6_K for every quantized recipe
 *      except q8_0 (Q8_0) and the float ones (their own type): the head is
 *      read once per token and its errors land directly on the logits.
 *   3. Mixes "_m": attn_v and ffn_down (routed, shared or dense) get Q6_K in
 *      the layers that matter most: the first and last eighth of the stack
 *      and every third layer in between (llama.cpp's use_more_bits rule).
 *      "_s" mixes use the base type there.
 *   4. Everything else gets the base type.
 *   5. A row length the chosen type cannot hold (K-quants need multiples of
 *      256, the 32-blocks multiples of 32) falls back: Q4_K -> Q5_0,
 *      Q5_K -> Q5_1, Q6_K -> Q8_0, 32-block types -> F16, and F32 when
 *      even that does not fit.
 */
#ifndef MOE_QUANT_RECIPE_H
#define MOE_QUANT_RECIPE_H

#include <stdint.h>

#include "quant/quant.h"

typedef struct quant_recipe {
    const char *name;  /* "q4_k_m" */
    moe_type base;     /* the type of most weight matrices */
    moe_type more_bits; /* rule 3, or MOE_TYPE_COUNT for none */
    uint32_t file_type; /* llama.cpp's general.file_type id */
} quant_recipe;

/* The recipe of a name (case-insensitive), NULL when unknown. */
const quant_recipe *quant_recipe_by_name(const char *name);

/* Every recipe, for --help: returns the i-th or NULL past the end. */
const quant_recipe *quant_recipe_at(int i);

/* The type for a tensor: `name` as in GGUF ("blk.3.attn_v.weight"), n_dims
 * and ne as stored, n_layers the model's block count (0 if unknown). */
moe_type quant_recipe_choose(const quant_recipe *recipe, const char *name, uint32_t n_dims,
                             const uint64_t *ne, uint32_t n_layers);

#endif
