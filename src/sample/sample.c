/*
 * sample.c — the sampling chain of sample.h.
 *
 * The candidates of one call live in two parallel arrays, s->weights and
 * s->ids. Without top-k the whole vocabulary is the first candidate set,
 * in order, so no ids are stored (a set's ids pointer is NULL) and the
 * weights come out of one vectorised pass over the logits. Top-k instead
 * picks k (id, logit) pairs with a heap and puts them in rank order, the
 * order sampler_sample_top gives the same pairs found elsewhere (on the
 * GPU), so both draw the same token. The filters compact the arrays in
 * place. Top-p avoids sorting the vocabulary: a histogram of the weights'
 * bit patterns finds the bucket where the running mass crosses p, and only
 * that bucket is sorted.
 */
#include "sample/sample.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* A fused multiply-add rounds once where a*b+c rounds twice; letting the
 * compiler fuse on some machines and not on others would change the bits
 * of the weights. GCC does not fuse in ISO C mode (-std=c17). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum {
    VOCAB_MAX = 1 << 30, /* keeps every index and index + LANES in int32_t */
    PENALTY_WINDOW_MAX = 1 << 20,
    /* Top-p buckets: a weight's float bits, counted down from those of 1.0,
     * shifted right by 17 give 64 buckets per factor of two; 2048 buckets
     * reach down to 2^-32, and everything smaller shares the last one. */
    TOP_P_BUCKET_SHIFT = 17,
    TOP_P_BUCKETS = 2048,
};

/* ---------------------------------------------------------------- generator */

static uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* splitmix64: spreads one 64-bit seed over the generator's 256-bit state,
 * as xoshiro's authors recommend (a state of all zeros would be stuck). */
static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t state[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) state[i] = splitmix64_next(&seed);
}

/* xoshiro256** 1.0. */
static uint64_t rng_next(uint64_t s[4]) {
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1): the top 53 bits, exactly representable. */
static double rng_uniform(uint64_t s[4]) {
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------- weights */

/* Four lanes of IEEE single precision through GCC/clang vector extensions:
 * one SSE register on baseline x86-64, one NEON register on arm64 (GCC
 * splits wider vectors lane by lane there). Each lane computes what a
 * scalar loop would, so no result depends on the machine's vector width. */
enum { LANES = 4 };
typedef float f32_lanes __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t i32_lanes __attribute__((vector_size(LANES * sizeof(int32_t))));

/* w[j] = e^((x[j] - max_logit) * inv_t), for x[j] <= max_logit, from IEEE
 * adds and multiplies only: libm's expf may differ between C libraries in
 * the last bit, this gives every machine the same bits. e^v = 2^k e^r with
 * k the integer nearest v / ln2 and |r| <= ln2 / 2 (ln2 split in two so
 * that k ln2 is exact), e^r by its Taylor series to r^7 (truncation < 1e-8),
 * 2^k from its bit pattern; over [-87, 0] the relative error is < 1.1e-7
 * (measured against double exp). The argmax gets exactly 1. v < -87 gets 0:
 * e^v would be below FLT_MIN, under 1e-37 of the argmax's weight, and 0
 * keeps subnormals (and flush-to-zero modes) out. NaN and -inf get 0 too. */
static void weights_of(const float x[LANES], float max_logit, float inv_t, float w[LANES]) {
    f32_lanes v;
    memcpy(&v, x, sizeof v);
    v = (v - max_logit) * inv_t;
    const i32_lanes live = v >= -87.0f;
    v = (f32_lanes)((i32_lanes)v & live); /* dead lanes compute e^0, masked below */
    const float round_magic = 0x1.8p23f;   /* adding it rounds to an integer */
    const f32_lanes k = (v * 1.44269504f + round_magic) - round_magic;
    const f32_lanes r = (v - k * 0.693145751953125f) - k * 1.42860677e-6f;
    const f32_lanes high = 1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)));
    const f32_lanes p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * high)));
    const i32_lanes scale = (__builtin_convertvector(k, i32_lanes) + 127) << 23;
    const i32_lanes bits = (i32_lanes)(p * (f32_lanes)scale) & live;
    memcpy(w, &bits, sizeof bits);
}

static f32_lanes lanes_of(float x) {
    f32_lanes v;
    for (int j = 0; j < LANES; j++) v[j] = x;
    return v;
}

/* The lanes of block `base` of an array of n floats; the last, partial
 * block is copied into pad and filled up with `fill`. */
static const float *lanes_at(const float *x, size_t n, size_t base, float fill, float pad[LANES]) {
    if (n - base >= LANES) return x + base;
    for (size_t j = 0; j < LANES; j++) pad[j] = base + j < n ? x[base + j] : fill;
    return pad;
}

/* Whether any of the lanes is set, without a movemask instruction. */
static bool any_lane(i32_lanes mask) {
    uint64_t half[sizeof mask / sizeof(uint64_t)];
    memcpy(half, &mask, sizeof half);
    uint64_t any = 0;
    for (size_t j = 0; j < sizeof half / sizeof *half; j++) any |= half[j];
    return any != 0;
}

/* ---------------------------------------------------------------- setup */

sampler_params sampler_params_default(void) {
    return (sampler_params){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
    };
}

/* The comparisons are written so that NaN fails them. */
static moe_status check_params(const sampler_params *p, int32_t n_vocab, moe_error *err) {
    const moe_status bad = MOE_ERR_INVALID_ARG;
    if (n_vocab <= 0 || n_vocab > VOCAB_MAX)
        return moe_error_set(err, bad, "sampler: the vocabulary size must be in [1, %d], got %d", VOCAB_MAX, n_vocab);
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return moe_error_set(err, bad, "sampler: temperature must be finite and >= 0 (0 = greedy), got %g",
                             p->temperature);
    if (p->top_k < 0) return moe_error_set(err, bad, "sampler: top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return moe_error_set(err, bad, "sampler: top_p must be in (0, 1] (1 = off), got %g", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return moe_error_set(err, bad, "sampler: min_p must be in [0, 1] (0 = off), got %g", p->min_p);
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return moe_error_set(err, bad, "sampler: repetition_penalty must be finite and > 0 (1 = off), got %g",
                             p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return moe_error_set(err, bad, "sampler: presence_penalty must be finite, got %g", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return moe_error_set(err, bad, "sampler: frequency_penalty must be finite, got %g", p->frequency_penalty);
    if (p->penalty_last_n < 0 || p->penalty_last_n > PENALTY_WINDOW_MAX)
        return moe_error_set(err, bad, "sampler: penalty_last_n must be in [0, %d] (0 = off), got %d",
                             PENALTY_WINDOW_MAX, p->penalty_last_n);
    return MOE_OK;
}

moe_status sampler_init(sampler *s, const sampler_params *params, int32_t n_vocab, moe_error *err) {
    memset(s, 0, sizeof *s);
    const moe_status status = check_params(params, n_vocab, err);
    if (status != MOE_OK) return status;
    s->params = *params;
    s->n_vocab = n_vocab;
    const size_t n = (size_t)n_vocab;
    s->counts = calloc(n, sizeof *s->counts);
    s->weights = malloc(n * sizeof *s->weights);
    s->ids = malloc(n * sizeof *s->ids);
    s->pairs = malloc(n * sizeof *s->pairs);
    if (params->penalty_last_n > 0) s->window = malloc((size_t)params->penalty_last_n * sizeof *s->window);
    if (!s->counts || !s->weights || !s->ids || !s->pairs || (params->penalty_last_n > 0 && !s->window)) {
        sampler_free(s);
        return moe_error_set(err, MOE_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d tokens", n_vocab);
    }
    rng_seed(s->rng, params->seed);
    return MOE_OK;
}

void sampler_free(sampler *s) {
    free(s->counts);
    free(s->window);
    free(s->weights);
    free(s->ids);
    free(s->pairs);
    memset(s, 0, sizeof *s);
}

/* The window is a ring: while it fills, slots [0, window_len) are in use;
 * once full, window_next is the oldest token, the one to evict. */
moe_status sampler_accept(sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab)
        return moe_error_set(&s->error, MOE_ERR_RANGE, "sampler: token %d is outside the vocabulary [0, %d)", token,
                             s->n_vocab);
    const int32_t capacity = s->params.penalty_last_n;
    if (capacity == 0) return MOE_OK;
    if (s->window_len == capacity)
        s->counts[s->window[s->window_next]]--;
    else
        s->window_len++;
    s->window[s->window_next] = token;
    s->counts[token]++;
    s->window_next = (s->window_next + 1) % capacity;
    return MOE_OK;
}

void sampler_reset(sampler *s) {
    for (int32_t i = 0; i < s->window_len; i++) s->counts[s->window[i]] = 0;
    s->window_len = 0;
    s->window_next = 0;
    s->last_prob = 0.0f;
    moe_error_clear(&s->error);
    rng_seed(s->rng, s->params.seed);
}

float sampler_last_prob(const sampler *s) {
    return s->last_prob;
}

/* ---------------------------------------------------------------- penalties */

/* logit' = (logit > 0 ? logit / r : logit * r) - (count * frequency + presence) */
static float penalize(float logit, int32_t count, const sampler_params *p) {
    const float r = p->repetition_penalty;
    const float repeated = logit > 0.0f ? logit / r : logit * r;
    return repeated - ((float)count * p->frequency_penalty + p->presence_penalty);
}

static bool penalties_on(const sampler_params *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* A token may sit in the window many times but is penalised once: its count
 * is negated while it is listed and restored afterwards. O(window). */
int32_t sampler_penalized_tokens(sampler *s, int32_t *ids) {
    if (!penalties_on(&s->params)) return 0;
    int32_t n = 0;
    for (int32_t i = 0; i < s->window_len; i++) {
        const int32_t token = s->window[i];
        if (s->counts[token] <= 0) continue;
        ids[n++] = token;
        s->counts[token] = -s->counts[token];
    }
    for (int32_t i = 0; i < n; i++) s->counts[ids[i]] = -s->counts[ids[i]];
    return n;
}

/* s->ids is free scratch until the candidates are gathered. */
static void apply_penalties(sampler *s, float *logits) {
    const int32_t n = sampler_penalized_tokens(s, s->ids);
    for (int32_t i = 0; i < n; i++) {
        const int32_t token = s->ids[i];
        logits[token] = penalize(logits[token], s->counts[token], &s->params);
    }
}

/* ---------------------------------------------------------------- candidates */

/* Names the first NaN or +inf logit. */
static moe_status report_bad_logit(sampler *s, const float *logits) {
    int32_t i = 0;
    while (i < s->n_vocab - 1 && !isnan(logits[i]) && logits[i] != INFINITY) i++;
    return moe_error_set(&s->error, MOE_ERR_FORMAT, "sampler: the logit of token %d is %s", i,
                         isnan(logits[i]) ? "NaN" : "+inf");
}

/* The argmax, lowest id among equals; a negative status for a NaN or +inf
 * logit or when every logit is -inf. One pass, lane by lane: each lane
 * keeps its maximum and the first index holding it (only a strictly
 * greater value replaces it) and notes NaNs; the lanes are merged at the
 * end. A +inf would be the maximum, so it is caught there. */
static int32_t scan_logits(sampler *s, const float *logits) {
    const size_t n = (size_t)s->n_vocab;
    f32_lanes max_lanes = lanes_of(-INFINITY);
    i32_lanes index = {0}, at_max = {0}, nan = {0};
    for (int j = 0; j < LANES; j++) index[j] = j;
    float pad[LANES];
    for (size_t base = 0; base < n; base += LANES, index += LANES) {
        f32_lanes v;
        memcpy(&v, lanes_at(logits, n, base, -INFINITY, pad), sizeof v);
        nan |= v != v;
        const i32_lanes greater = v > max_lanes;
        max_lanes = (f32_lanes)(((i32_lanes)v & greater) | ((i32_lanes)max_lanes & ~greater));
        at_max = (index & greater) | (at_max & ~greater);
    }
    int32_t best = -1;
    float max_logit = -INFINITY;
    for (int j = 0; j < LANES; j++) {
        if (nan[j] || max_lanes[j] == INFINITY) return report_bad_logit(s, logits);
        const bool better = max_lanes[j] > max_logit || (max_lanes[j] == max_logit && at_max[j] < best);
        if (max_lanes[j] != -INFINITY && better) {
            max_logit = max_lanes[j];
            best = at_max[j];
        }
    }
    if (best < 0)
        return moe_error_set(&s->error, MOE_ERR_FORMAT, "sampler: all %d logits are -inf, no token can be drawn",
                             s->n_vocab);
    return best;
}

/* The ranking of the whole chain: a larger value first, then a lower id. */
static bool ranks_below(sampler_candidate a, sampler_candidate b) {
    return a.value < b.value || (a.value == b.value && a.id > b.id);
}

static int compare_by_rank(const void *pa, const void *pb) {
    const sampler_candidate *a = pa, *b = pb;
    if (ranks_below(*a, *b)) return 1;
    return ranks_below(*b, *a) ? -1 : 0;
}

/* Min-heap under ranks_below: the root is the weakest of the k kept. */
static void heap_sift_up(sampler_candidate *h, size_t i) {
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!ranks_below(h[i], h[parent])) break;
        const sampler_candidate t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

static void heap_sift_down(sampler_candidate *h, size_t n, size_t i) {
    for (;;) {
        size_t weakest = i;
        const size_t left = 2 * i + 1, right = left + 1;
        if (left < n && ranks_below(h[left], h[weakest])) weakest = left;
        if (right < n && ranks_below(h[right], h[weakest])) weakest = right;
        if (weakest == i) return;
        const sampler_candidate t = h[i];
        h[i] = h[weakest];
        h[weakest] = t;
        i = weakest;
    }
}

/* Offers token id with logit x to a heap of at most k. */
static void top_k_offer(sampler_candidate *heap, size_t *n, size_t k, int32_t id, float x) {
    if (x == -INFINITY) return;
    if (*n < k) {
        heap[*n] = (sampler_candidate){id, x};
        heap_sift_up(heap, (*n)++);
    } else if (x > heap[0].value) {
        heap[0] = (sampler_candidate){id, x};
        heap_sift_down(heap, *n, 0);
    }
}

/* The k best finite logits into s->pairs in O(n_vocab log k), one pass.
 * Ids arrive in increasing order, so a newcomer equal to the root ranks
 * below it and is rightly refused by the strict comparison. Once the heap
 * is full, most logits are below its root: four at a time are skipped
 * with one vector comparison. Returns the count. */
static size_t gather_top_k(sampler *s, const float *logits, size_t k) {
    sampler_candidate *heap = s->pairs;
    const size_t n_vocab = (size_t)s->n_vocab;
    size_t n = 0;
    for (size_t base = 0; base < n_vocab; base += LANES) {
        const size_t end = n_vocab - base < LANES ? n_vocab : base + LANES;
        if (n == k && end - base == LANES) {
            f32_lanes v;
            memcpy(&v, logits + base, sizeof v);
            if (!any_lane(v > heap[0].value)) continue;
        }
        for (size_t i = base; i < end; i++) top_k_offer(heap, &n, k, (int32_t)i, logits[i]);
    }
    return n;
}

/* The candidates of one call: w[i] is the weight of token ids[i], or of
 * token i while ids is NULL. A weight of 0 (a -inf or far-below logit)
 * means "not a candidate": every stage skips it. */
typedef struct candidate_set {
    int32_t *ids;
    float *w;
    size_t n;
} candidate_set;

static int32_t candidate_id(const candidate_set *c, size_t i) {
    return c->ids ? c->ids[i] : (int32_t)i;
}

/* Temperature and softmax: w[i] = weights_of(x[i]) for i < n. x may be w. */
static void softmax_weights(const float *x, float *w, size_t n, float max_logit, float inv_t) {
    float pad[LANES], out[LANES];
    for (size_t base = 0; base < n; base += LANES) {
        if (n - base >= LANES) {
            weights_of(x + base, max_logit, inv_t, w + base);
            continue;
        }
        weights_of(lanes_at(x, n, base, max_logit, pad), max_logit, inv_t, out);
        memcpy(w + base, out, (n - base) * sizeof *w);
    }
}

/* The first min(n, k) of the n pairs in s->pairs, by rank, as a candidate
 * set of logits. Rank order makes the set's order independent of how the
 * pairs were found (a heap over the whole vocabulary, or a GPU's top list
 * for sampler_sample_top), and so is every later sum and the draw. */
static candidate_set ranked_set(sampler *s, size_t n, size_t k) {
    qsort(s->pairs, n, sizeof *s->pairs, compare_by_rank);
    if (n > k) n = k;
    for (size_t i = 0; i < n; i++) {
        s->ids[i] = s->pairs[i].id;
        s->weights[i] = s->pairs[i].value;
    }
    return (candidate_set){s->ids, s->weights, n};
}

/* ---------------------------------------------------------------- filters */

/* Positive floats order like their bit patterns, so the distance from the
 * bits of 1.0 ranks a weight in (0, 1] without a logarithm; bucket 0 holds
 * the largest weights. */
static uint32_t top_p_bucket(float w) {
    uint32_t bits;
    memcpy(&bits, &w, sizeof bits);
    const uint32_t b = (UINT32_C(0x3F800000) - bits) >> TOP_P_BUCKET_SHIFT;
    return b < TOP_P_BUCKETS - 1 ? b : TOP_P_BUCKETS - 1;
}

/* The bucket where the running mass, taken from the top bucket down,
 * reaches target; *above gets the mass of the buckets before it. The total
 * is the sum of the bucket masses in this same order, so the running sum
 * reaches it exactly: the crossing exists, *above < target and the bucket
 * is not empty. */
static uint32_t top_p_edge(const double *mass, double p, double *above, double *target) {
    double total = 0.0;
    for (uint32_t b = 0; b < TOP_P_BUCKETS; b++) total += mass[b];
    *target = p * total;
    double running = 0.0;
    uint32_t edge = 0;
    while (edge < TOP_P_BUCKETS - 1 && running + mass[edge] < *target) running += mass[edge++];
    *above = running;
    return edge;
}

/* Moves candidate i to the kept arrays (bucket above the edge) or to the
 * edge bucket's pairs. Branch-free: both stores happen, the counts decide
 * which stick. */
static void top_p_place(sampler *s, const candidate_set *c, size_t i, uint32_t edge, size_t *kept, size_t *n_edge) {
    const float w = c->w[i];
    const uint32_t b = top_p_bucket(w);
    const int32_t id = candidate_id(c, i);
    s->ids[*kept] = id;
    s->weights[*kept] = w;
    *kept += w > 0.0f && b < edge;
    s->pairs[*n_edge] = (sampler_candidate){id, w};
    *n_edge += w > 0.0f && b == edge;
}

/* Keeps the smallest prefix, by rank, whose weight is >= p of the total.
 * Buckets wholly above the edge bucket are kept unsorted; only the edge
 * bucket (weights within 1.1% of each other) is sorted, in s->pairs, to
 * find where the prefix ends inside it. The collecting pass skips four
 * weights at a time when all are below the edge bucket, as most are when
 * the model is confident. */
static candidate_set top_p_filter(sampler *s, candidate_set c, double p) {
    double mass[TOP_P_BUCKETS] = {0}; /* 16 KiB */
    for (size_t i = 0; i < c.n; i++) mass[top_p_bucket(c.w[i])] += c.w[i];
    double kept_mass, target;
    const uint32_t edge = top_p_edge(mass, p, &kept_mass, &target);

    /* Bucket <= edge means bits > floor, as bits fall with the bucket. */
    const int32_t floor_bits = edge == TOP_P_BUCKETS - 1 ? 0 : 0x3F800000 - (int32_t)((edge + 1) << TOP_P_BUCKET_SHIFT);
    size_t kept = 0, n_edge = 0, i = 0;
    for (; i + LANES <= c.n; i += LANES) {
        i32_lanes bits;
        memcpy(&bits, c.w + i, sizeof bits);
        if (!any_lane(bits > floor_bits)) continue;
        for (size_t j = i; j < i + LANES; j++) top_p_place(s, &c, j, edge, &kept, &n_edge);
    }
    for (; i < c.n; i++) top_p_place(s, &c, i, edge, &kept, &n_edge);

    qsort(s->pairs, n_edge, sizeof *s->pairs, compare_by_rank);
    for (size_t j = 0; j < n_edge && kept_mass < target; j++, kept++) {
        s->ids[kept] = s->pairs[j].id;
        s->weights[kept] = s->pairs[j].value;
        kept_mass += s->pairs[j].value;
    }
    return (candidate_set){s->ids, s->weights, kept};
}

/* Drops weights below min_p times the largest, which is exactly 1 (see
 * weights_of: the argmax survives top-k and top-p, ranking first). */
static candidate_set min_p_filter(sampler *s, candidate_set c, float min_p) {
    size_t kept = 0;
    for (size_t i = 0; i < c.n; i++) {
        s->ids[kept] = candidate_id(&c, i);
        s->weights[kept] = c.w[i];
        kept += c.w[i] >= min_p;
    }
    return (candidate_set){s->ids, s->weights, kept};
}

/* Inverse-CDF draw over the weights in array order. Four running sums
 * make the total (one would be a chain of dependent adds); the order is
 * fixed, so the result is too. Should rounding leave the walk's running
 * sum a hair short of u at the end, the last candidate with a weight is
 * the one; a weight-0 index is never chosen, as it does not move the sum. */
static int32_t draw(sampler *s, candidate_set c) {
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = 0;
    for (; i + 4 <= c.n; i += 4)
        for (int j = 0; j < 4; j++) part[j] += c.w[i + j];
    for (; i < c.n; i++) part[0] += c.w[i];
    const double total = (part[0] + part[1]) + (part[2] + part[3]);
    const double u = rng_uniform(s->rng) * total;
    double running = 0.0;
    size_t last = 0;
    for (i = 0; i < c.n; i++) {
        running += c.w[i];
        if (c.w[i] > 0.0f) last = i;
        if (u < running) break;
    }
    if (i == c.n) i = last;
    s->last_prob = (float)(c.w[i] / total);
    return candidate_id(&c, i);
}

/* ---------------------------------------------------------------- the chain */

/* Temperature, softmax, the filters and the draw on candidate set c, whose
 * weights come from the logits x (x[i] for c's entry i; x may be c.w). */
static int32_t draw_from(sampler *s, const float *x, candidate_set c, float max_logit) {
    const sampler_params *p = &s->params;
    /* A temperature so small that 1/T overflows acts as the smallest one
     * that does not: still only the argmax has weight. */
    const float inv_t = fminf(1.0f / p->temperature, FLT_MAX);
    softmax_weights(x, c.w, c.n, max_logit, inv_t);
    if (p->top_p < 1.0f) c = top_p_filter(s, c, p->top_p);
    if (p->min_p > 0.0f) c = min_p_filter(s, c, p->min_p);
    return draw(s, c);
}

static bool top_k_on(const sampler *s) {
    return s->params.top_k > 0 && s->params.top_k < s->n_vocab;
}

int32_t sampler_sample(sampler *s, float *logits) {
    apply_penalties(s, logits);
    const int32_t best = scan_logits(s, logits);
    if (best < 0) return best;
    if (s->params.temperature == 0.0f) {
        s->last_prob = 1.0f;
        return best;
    }
    if (!top_k_on(s))
        return draw_from(s, logits, (candidate_set){NULL, s->weights, (size_t)s->n_vocab}, logits[best]);
    const candidate_set c = ranked_set(s, gather_top_k(s, logits, (size_t)s->params.top_k), (size_t)s->params.top_k);
    return draw_from(s, c.w, c, logits[best]);
}

/* ---------------------------------------------------------------- from the top logits */

int32_t sampler_top_needed(const sampler *s) {
    int32_t k;
    if (s->params.temperature == 0.0f) k = 1;
    else if (top_k_on(s)) k = s->params.top_k;
    else return 0;
    /* Each penalised token may leave the top or enter it: with window_len
     * more, the top holds k tokens the penalties leave alone. */
    const int32_t changed = penalties_on(&s->params) ? s->window_len : 0;
    return k < s->n_vocab - changed ? k + changed : s->n_vocab;
}

/* Offers one of sampler_sample_top's logits to s->pairs. */
static moe_status offer_logit(sampler *s, size_t *n, int32_t id, float logit) {
    if (isnan(logit) || logit == INFINITY)
        return moe_error_set(&s->error, MOE_ERR_FORMAT, "sampler: the logit of token %d is %s", id,
                             isnan(logit) ? "NaN" : "+inf");
    if (logit != -INFINITY) s->pairs[(*n)++] = (sampler_candidate){id, logit};
    return MOE_OK;
}

int32_t sampler_sample_top(sampler *s, const sampler_candidate *top, int32_t n_top, const float *penalized_logits) {
    const sampler_params *p = &s->params;
    const int32_t n_pen = sampler_penalized_tokens(s, s->ids);
    size_t n = 0;
    moe_status st = MOE_OK;
    for (int32_t i = 0; i < n_pen && st == MOE_OK; i++) {
        const int32_t id = s->ids[i];
        st = offer_logit(s, &n, id, penalize(penalized_logits[i], s->counts[id], p)); /* as apply_penalties */
    }
    for (int32_t i = 0; i < n_top && st == MOE_OK; i++)
        if (n_pen == 0 || s->counts[top[i].id] == 0) st = offer_logit(s, &n, top[i].id, top[i].value);
    if (st != MOE_OK) return st;
    if (n == 0)
        return moe_error_set(&s->error, MOE_ERR_FORMAT, "sampler: all %d logits are -inf, no token can be drawn",
                             s->n_vocab);
    const size_t k = p->temperature == 0.0f ? 1 : top_k_on(s) ? (size_t)p->top_k : n;
    const candidate_set c = ranked_set(s, n, k);
    if (p->temperature == 0.0f) {
        s->last_prob = 1.0f;
        return c.ids[0];
    }
    return draw_from(s, c.w, c, c.w[0]);
}

float sampler_logprob(const float *logits, int32_t n_vocab, int32_t token) {
    if (token < 0 || token >= n_vocab) return NAN;
    float max_logit = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] > max_logit) max_logit = logits[i];
    if (max_logit == -INFINITY) return -INFINITY;
    const size_t n = (size_t)n_vocab;
    float pad[LANES], w[LANES];
    double sum = 0.0;
    for (size_t base = 0; base < n; base += LANES) {
        weights_of(lanes_at(logits, n, base, -INFINITY, pad), max_logit, 1.0f, w);
        for (size_t j = 0; j < LANES; j++) sum += w[j];
    }
    return (float)(((double)logits[token] - max_logit) - log(sum));
}
