/*
 * prefill.h — the batched prefill (prefill.cu) as cuda_forward.cu calls it:
 * a prompt's tokens run through each layer together, the matrix products
 * as tensor-core GEMMs, instead of one decode step per token.
 */
#ifndef MOE_CUDA_PREFILL_H
#define MOE_CUDA_PREFILL_H

#include "cuda/cuda_internal.h"

/* cuda_forward's contract for n >= 1 tokens at positions pos..pos+n-1:
 * the KV cache of those positions filled, logits of every position
 * (all_logits) or of the last (logits may be NULL). Inputs are checked by
 * the caller. */
moe_status cuda_prefill(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                        moe_error *err);

/* Frees the prefill's scratch of a state (cuda_state_free). */
void cuda_prefill_free(cuda_state *s);

#endif
