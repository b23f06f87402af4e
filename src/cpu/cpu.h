/*
 * cpu.h — the CPU backend: the reference forward pass, and a usable engine.
 *
 * A cpu_state holds what a sequence needs besides the weights: the KV cache
 * in f32 or f16 with the attention over it (cpu_attention.h) and the
 * activation buffers of a batch.
 * cpu_forward runs a batch of tokens at consecutive positions: every weight
 * matrix is applied to the whole batch at once (prefill), and a batch of
 * one is decode. Accumulation is f32 (double where a long sum needs it);
 * activations are quantized to 8 bits exactly where the weight format's dot
 * product wants it, the same for any batch size, so a prompt processed at
 * once and token by token give the same logits.
 */
#ifndef MOE_CPU_H
#define MOE_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "moe.h"

typedef struct cpu_state cpu_state;

typedef struct cpu_state_params {
    int n_ctx;           /* positions the KV cache holds */
    int max_batch;       /* tokens per internal step (larger inputs are processed in steps) */
    int n_threads;       /* <= 0: all CPUs */
    moe_kv_type kv_type; /* the cache's elements */
} cpu_state_params;

moe_status cpu_state_new(const model *m, const cpu_state_params *p, cpu_state **out, moe_error *err);
void cpu_state_free(cpu_state *s);

/* Process tokens[0..n) at positions pos..pos+n-1; positions below pos must
 * already be in the cache. Logits (n_vocab floats each) of every position go
 * to logits[i * n_vocab] when all_logits, else only the last position's to
 * logits[0]. logits may be NULL when none are wanted. */
moe_status cpu_forward(cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                       moe_error *err);

int cpu_state_n_ctx(const cpu_state *s);

#endif
