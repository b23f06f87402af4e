/* recipe.c — see recipe.h for the rules. */
#include "quant/recipe.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* general.file_type ids, as llama.cpp numbers them (llama_ftype). */
enum {
    FILE_TYPE_ALL_F32 = 0,
    FILE_TYPE_F16 = 1,
    FILE_TYPE_Q4_0 = 2,
    FILE_TYPE_Q4_1 = 3,
    FILE_TYPE_Q8_0 = 7,
    FILE_TYPE_Q5_0 = 8,
    FILE_TYPE_Q5_1 = 9,
    FILE_TYPE_Q4_K_S = 14,
    FILE_TYPE_Q4_K_M = 15,
    FILE_TYPE_Q5_K_S = 16,
    FILE_TYPE_Q5_K_M = 17,
    FILE_TYPE_Q6_K = 18,
    FILE_TYPE_IQ4_NL = 25,
    FILE_TYPE_BF16 = 32,
    FILE_TYPE_MXFP4_MOE = 38,
};

#define NONE MOE_TYPE_COUNT
static const quant_recipe recipes[] = {
    {"f32", MOE_TYPE_F32, NONE, FILE_TYPE_ALL_F32},
    {"f16", MOE_TYPE_F16, NONE, FILE_TYPE_F16},
    {"bf16", MOE_TYPE_BF16, NONE, FILE_TYPE_BF16},
    {"q8_0", MOE_TYPE_Q8_0, NONE, FILE_TYPE_Q8_0},
    {"q6_k", MOE_TYPE_Q6_K, NONE, FILE_TYPE_Q6_K},
    {"q5_k_m", MOE_TYPE_Q5_K, MOE_TYPE_Q6_K, FILE_TYPE_Q5_K_M},
    {"q5_k_s", MOE_TYPE_Q5_K, NONE, FILE_TYPE_Q5_K_S},
    {"q5_k", MOE_TYPE_Q5_K, NONE, FILE_TYPE_Q5_K_S},
    {"q5_1", MOE_TYPE_Q5_1, NONE, FILE_TYPE_Q5_1},
    {"q5_0", MOE_TYPE_Q5_0, NONE, FILE_TYPE_Q5_0},
    {"q4_k_m", MOE_TYPE_Q4_K, MOE_TYPE_Q6_K, FILE_TYPE_Q4_K_M},
    {"q4_k_s", MOE_TYPE_Q4_K, NONE, FILE_TYPE_Q4_K_S},
    {"q4_k", MOE_TYPE_Q4_K, NONE, FILE_TYPE_Q4_K_S},
    {"q4_1", MOE_TYPE_Q4_1, NONE, FILE_TYPE_Q4_1},
    {"q4_0", MOE_TYPE_Q4_0, NONE, FILE_TYPE_Q4_0},
    {"iq4_nl", MOE_TYPE_IQ4_NL, NONE, FILE_TYPE_IQ4_NL},
    {"mxfp4", MOE_TYPE_MXFP4, NONE, FILE_TYPE_MXFP4_MOE},
};
#undef NONE

const quant_recipe *quant_recipe_by_name(const char *name) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (strcasecmp(recipes[i].name, name) == 0) return &recipes[i];
    return NULL;
}

const quant_recipe *quant_recipe_at(int i) {
    if (i < 0 || (size_t)i >= sizeof recipes / sizeof recipes[0]) return NULL;
    return &recipes[i];
}

static bool is_float_type(moe_type t) {
    return t == MOE_TYPE_F32 || t == MOE_TYPE_F16 || t == MOE_TYPE_BF16;
}

/* "blk.<n>." prefix -> n, or -1. */
static int layer_of(const char *name) {
    int layer, consumed = 0;
    if (sscanf(name, "blk.%d.%n", &layer, &consumed) == 1 && consumed > 0) return layer;
    return -1;
}

/* The part after "blk.<n>." (or the whole name), e.g. "ffn_down_exps.weight". */
static const char *role_of(const char *name) {
    if (layer_of(name) < 0) return name;
    const char *dot = strchr(name + 4, '.');
    return dot ? dot + 1 : name;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* llama.cpp's use_more_bits: first and last eighth, every third between. */
static bool layer_wants_more_bits(int layer, uint32_t n_layers) {
    if (n_layers == 0 || layer < 0) return false;
    int n = (int)n_layers;
    return layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
}

static moe_type fallback_for_row(moe_type t, uint64_t row) {
    while (quant_row_bytes(t, (int64_t)row) == 0) {
        switch (t) {
        case MOE_TYPE_Q4_K: t = MOE_TYPE_Q5_0; break;
        case MOE_TYPE_Q5_K: t = MOE_TYPE_Q5_1; break;
        case MOE_TYPE_Q6_K: t = MOE_TYPE_Q8_0; break;
        case MOE_TYPE_F16:
        case MOE_TYPE_BF16:
        case MOE_TYPE_F32: return MOE_TYPE_F32;
        default: t = MOE_TYPE_F16; break;
        }
    }
    return t;
}

moe_type quant_recipe_choose(const quant_recipe *recipe, const char *name, uint32_t n_dims,
                             const uint64_t *ne, uint32_t n_layers) {
    const char *role = role_of(name);
    if (n_dims < 2 || starts_with(role, "ffn_gate_inp")) return MOE_TYPE_F32;

    moe_type chosen = recipe->base;
    if (strcmp(name, "output.weight") == 0) {
        if (!is_float_type(recipe->base) && recipe->base != MOE_TYPE_Q8_0) chosen = MOE_TYPE_Q6_K;
    } else if (recipe->more_bits != MOE_TYPE_COUNT &&
               (starts_with(role, "attn_v.") || starts_with(role, "ffn_down")) &&
               layer_wants_more_bits(layer_of(name), n_layers)) {
        chosen = recipe->more_bits;
    }
    return fallback_for_row(chosen, ne[0]);
}
