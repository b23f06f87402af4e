/*
 * sample.h — turning one row of logits into the next token.
 *
 * A sampler holds its parameters, a seeded random generator and the recent
 * token history the penalties need. Each call to sampler_sample runs the
 * same chain, in this order:
 *
 *   1. penalties    repetition (CTRL / llama.cpp), presence and frequency
 *                   (OpenAI) on the tokens of the last penalty_last_n
 *   2. top-k        keep the k largest logits
 *   3. temperature  divide the logits by T
 *   4. softmax      weights exp((logit - max) / T)
 *   5. top-p        keep the smallest prefix, by falling probability, whose
 *                   mass is >= p
 *   6. min-p        drop tokens whose probability is < min_p * the largest
 *   7. draw         one token in proportion to the weights that remain
 *
 * Why this order: penalties change what the model said, so every filter
 * must see their result. Top-k is unaffected by temperature (dividing by T
 * keeps the ranking) and goes first because it shrinks the work of every
 * later stage. Top-p and min-p come after temperature so that p and min_p
 * describe the distribution the token is actually drawn from; this is the
 * order of Hugging Face transformers and vLLM. (llama.cpp's default chain
 * applies temperature last, so its top-p measures mass at T = 1: the same
 * p keeps more tokens there when T < 1 and fewer when T > 1.)
 *
 * temperature == 0 is greedy: after the penalties, the largest logit wins,
 * the lowest token id among equals; the filters cannot change that result
 * and are skipped. Every ranking in the chain breaks ties by lower id.
 *
 * Reproducibility: the same parameters, seed, history and logits give the
 * same token on every machine. The generator is xoshiro256** seeded through
 * splitmix64 (Blackman and Vigna, https://prng.di.unimi.it), the exponential
 * is our own (libm's expf differs between C libraries in the last bit), and
 * every sum runs in a fixed order in double precision. This assumes IEEE-754
 * arithmetic without fused multiply-adds (GCC's default in ISO C mode; the
 * source disables contraction for clang).
 *
 * Logits: -inf is allowed and means "never this token". NaN and +inf are
 * rejected: they mean the forward pass broke, and sampling from them would
 * hide that. Every logit being -inf is rejected too (nothing to draw).
 */
#ifndef MOE_SAMPLE_H
#define MOE_SAMPLE_H

#include <stdint.h>

#include "moe.h"

typedef struct sampler_params {
    float temperature;        /* >= 0; 0 = greedy */
    int32_t top_k;            /* >= 0; 0 = off */
    float top_p;              /* in (0, 1]; 1 = off */
    float min_p;              /* in [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off. A seen token's logit is divided
                                 by it when positive, multiplied when not */
    float presence_penalty;   /* subtracted once from each seen token; 0 = off */
    float frequency_penalty;  /* subtracted once per occurrence; 0 = off */
    int32_t penalty_last_n;   /* the window "seen" refers to, in accepted
                                 tokens; 0 turns all three penalties off */
    uint64_t seed;
} sampler_params;

/* A candidate token: its id and, depending on the stage, its logit or its
 * unnormalised weight. */
typedef struct sampler_candidate {
    int32_t id;
    float value;
} sampler_candidate;

typedef struct sampler {
    sampler_params params;
    int32_t n_vocab;
    uint64_t rng[4];              /* xoshiro256** state */
    int32_t *counts;              /* (n_vocab) occurrences of each token in the window */
    int32_t *window;              /* (penalty_last_n) ring of the last accepted tokens */
    int32_t window_len;           /* tokens in the ring, <= penalty_last_n */
    int32_t window_next;          /* ring slot the next accepted token goes to */
    float *weights;               /* (n_vocab) the candidates' weights in one call */
    int32_t *ids;                 /* (n_vocab) their token ids, once filtered */
    sampler_candidate *pairs;     /* (n_vocab) top-k's heap, top-p's edge bucket */
    float last_prob;              /* see sampler_last_prob */
    moe_error error;              /* why the last failing call failed */
} sampler;

/* Every stage off, T = 1: the model's own distribution, seed 0. */
sampler_params sampler_params_default(void);

/* Checks the parameters (each bad one gets a message naming the field, the
 * value and the allowed range) and allocates O(n_vocab + penalty_last_n)
 * memory. On failure nothing is left to free. */
moe_status sampler_init(sampler *s, const sampler_params *params, int32_t n_vocab, moe_error *err);
void sampler_free(sampler *s);

/* Records a token in the penalty window (prompt tokens and generated ones
 * alike). MOE_ERR_RANGE, with s->error filled in, if the token is not in
 * [0, n_vocab). */
moe_status sampler_accept(sampler *s, int32_t token);

/* Back to the state sampler_init left: empty history, generator reseeded. */
void sampler_reset(sampler *s);

/* Picks the next token from logits[n_vocab]. The penalties are applied to
 * logits in place (so afterwards they hold what the filters saw); nothing
 * else in logits changes. Returns the token id, or a negative moe_status
 * (MOE_ERR_FORMAT for a NaN or +inf logit or no finite logit) with
 * s->error saying which. Does not accept the token: call sampler_accept.
 * Cost: a few passes over n_vocab plus a sort of at most the candidates
 * near the top-p boundary. */
int32_t sampler_sample(sampler *s, float *logits);

/* ---- sampling from the top of the logits
 *
 * A GPU holds the logits; copying all of them to the host and scanning
 * them there costs more than the model's step. When the chain only ever
 * looks at the largest few (greedy, or top-k), the device can find those
 * and sampler_sample_top finishes the chain on them: the same token, the
 * same probability and the same generator state as sampler_sample on every
 * logit. The penalised tokens come along separately, as a penalty may move
 * any of them into the top or out of it. */

/* How many of the largest logits sampler_sample_top needs: 1 (greedy) or
 * top_k, plus one per token in the penalty window while a penalty is on.
 * 0 when the chain needs every logit (a temperature > 0 without top-k:
 * its softmax spans the vocabulary). */
int32_t sampler_top_needed(const sampler *s);

/* The distinct tokens the penalties will change, to ids (room for
 * penalty_last_n), in window order; their count, 0 with no penalty on. */
int32_t sampler_penalized_tokens(sampler *s, int32_t *ids);

/* sampler_sample from part of the logits: top[0..n_top) are the n_top
 * largest (in any order, distinct ids; fewer only when every other logit is
 * -inf), penalized_logits[i] the logit of the i-th token
 * sampler_penalized_tokens names (called just before, on the same window).
 * With n_top >= sampler_top_needed(s) > 0, returns what sampler_sample
 * would; errors as it does. Does not accept the token. */
int32_t sampler_sample_top(sampler *s, const sampler_candidate *top, int32_t n_top, const float *penalized_logits);

/* The probability the last sampled token had in the distribution it was
 * drawn from, after every filter (1 for greedy). */
float sampler_last_prob(const sampler *s);

/* log softmax(logits)[token] at temperature 1 over the whole vocabulary:
 * the model's own log-probability of the token, what OpenAI's logprobs
 * report. Pass the logits sampler_sample left to include the penalties.
 * -inf for a token whose logit is -inf. */
float sampler_logprob(const float *logits, int32_t n_vocab, int32_t token);

#endif
