/*
 * engine_internal.h — what the public handles hold. Private to src/engine.
 */
#ifndef MOE_ENGINE_INTERNAL_H
#define MOE_ENGINE_INTERNAL_H

#include "cpu/cpu.h"
#include "cuda/cuda_backend.h"
#include "model/model.h"
#include "moe.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

struct moe_model {
    model *weights;
    tokenizer *tok;
    moe_model_params params;
    cuda_model *gpu; /* the weights on the GPU, or NULL: the CPU runs the model */
};

struct moe_session {
    moe_model *model;
    moe_session_params params;
    cpu_state *cpu;  /* exactly one of cpu and gpu is set */
    cuda_state *gpu;
    sampler sampler;
    float *logits; /* (n_vocab) of the last token fed, once on the host */
    int32_t *tokens; /* (n_ctx) what the cache holds, by position */
    bool has_logits;
    bool logits_on_host; /* false while only the GPU holds them: sampling reads its top few */
    int pos;
    /* moe_session_sample's scratch for the GPU's top logits */
    sampler_candidate top[CUDA_TOP_MAX + 1];
    int32_t penalized[CUDA_TOP_EXTRA_MAX + 1];
    float penalized_logits[CUDA_TOP_EXTRA_MAX + 1];
};

#endif
