/*
 * cpu_attention.h — a sequence's KV cache on the CPU and the causal
 * attention over it (GQA), for cpu_forward.c.
 *
 * The cache is [layer][position][kv_dim] in f32 or f16: an f16 cache holds
 * each key and value rounded to nearest even as it is appended, and the
 * attention reads them back widened to f32, so the GPU's f16 cache, which
 * rounds the same values the same way, can be held to it.
 *
 * The attention of a batch runs as tasks of (token, KV head, span of
 * positions): a task scores its span's keys against the KV head's G query
 * heads, so each cached row is read once for all G instead of G times, and
 * leaves per head the span's largest score m, the sum l of exp(score - m)
 * and the values weighted by those exps; a task per (token, query head) then
 * merges its spans (out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)),
 * unless the positions fit one span, whose tasks write the output.
 * Spans sit at fixed positions, so the sums do not depend on the batch or
 * the thread count, and a long context is spread over every thread even
 * for one token.
 */
#ifndef MOE_CPU_ATTENTION_H
#define MOE_CPU_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/thread_pool.h"
#include "model/model.h"
#include "moe.h"
#include "quant/quant.h"

typedef struct cpu_attention {
    int n_layers, n_ctx, n_heads, n_kv, hd, kv_dim;
    const quant_format *format; /* the cache's elements: f32 or f16 */
    quant_dot_fn key_dot;       /* the fastest dot of a cached key with a float query */
    quant_dequantize_fn widen;  /* an f16 value row to floats (NULL for f32) */
    uint8_t *k_cache, *v_cache; /* (n_layers, n_ctx, kv_dim) of `format` */
    int span, max_spans;        /* positions a span; spans of n_ctx */
    int group;                  /* tokens whose spans are held at once */
    float *span_out;            /* (group, n_heads, max_spans, hd): a span's weighted values */
    float *span_ml;             /* (group, n_heads, max_spans, 2): its m and l */
    float *scratch;             /* a worker's: G * span scores, G * hd sums, an f16 value row widened, G m and l */
    size_t scratch_floats;      /* a worker's, a multiple of a cache line */
} cpu_attention;

/* For the model of c, n_ctx positions, batches of up to max_batch tokens,
 * `workers` threads. false when out of memory (cpu_attention_free frees
 * what was made). */
bool cpu_attention_init(cpu_attention *a, const model_config *c, int n_ctx, int max_batch, int workers,
                        moe_kv_type kv_type);
void cpu_attention_free(cpu_attention *a);

/* Bytes of the K and V caches together. */
size_t cpu_attention_cache_bytes(const cpu_attention *a);

/* k and v of n tokens ((n, kv_dim) floats each) into layer l's cache at
 * positions pos..pos+n-1, in the cache's type. */
void cpu_attention_append(cpu_attention *a, int l, int pos, int n, const float *k, const float *v);

/* out (n, n_heads * hd) = the attention of q (the same shape) for the n
 * tokens at positions pos.. over layer l's cache, positions 0..pos+t for
 * token t (appended before). */
void cpu_attention_run(cpu_attention *a, thread_pool *pool, int l, int pos, int n, const float *q, float *out);

#endif
