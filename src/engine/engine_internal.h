/*
 * engine_internal.h — what the public handles hold. Private to src/engine.
 */
#ifndef MOE_ENGINE_INTERNAL_H
#define MOE_ENGINE_INTERNAL_H

#include "cpu/cpu.h"
#include "model/model.h"
#include "moe.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

struct moe_model {
    model *weights;
    tokenizer *tok;
    moe_model_params params;
};

struct moe_session {
    moe_model *model;
    moe_session_params params;
    cpu_state *cpu;
    sampler sampler;
    float *logits; /* (n_vocab) of the last token fed */
    int32_t *tokens; /* (n_ctx) what the cache holds, by position */
    bool has_logits;
    int pos;
};

#endif
