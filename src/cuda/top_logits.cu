/*
 * top_logits.cu — the largest logits of the last step, so that the host
 * samples from a few hundred candidates (sample.h, sampler_sample_top)
 * instead of copying and scanning every logit, which costs more than the
 * model's whole step.
 *
 * Each logit becomes a 64-bit key: its float bits mapped so that keys
 * order like the values, then the complement of its id. A larger key is a
 * larger logit or, among equal logits, the lower id (the sampler's
 * ranking), and no two keys are equal. -inf ("never") and the NaN and
 * +inf that mean a broken forward pass get key 0, none; the lowest id of
 * the latter is reported.
 *
 * One launch: every block selects the n largest keys of its slice of the
 * vocabulary, then the last block to finish (a ticket, as the router's)
 * selects the n largest of all the blocks' picks and gathers the logits
 * of the extra ids (the tokens the penalties change). The selection is a
 * radix select in shared memory from the top byte down: a histogram of
 * the next byte of the keys that still match, which byte holds the n-th
 * largest, until the keys matching the prefix are exactly those missing.
 */
#include <limits.h>
#include <stdlib.h>

#include "cuda/cuda_internal.h"

typedef unsigned long long top_key;

enum {
    TOP_THREADS = 256,     /* one histogram bin a thread */
    TOP_SMEM_KEYS = 12288, /* 96 KiB of keys: a block's slice, or all blocks' picks */
};

/* The result, laid out for one copy back of 8 + 8 n + 4 n_extra bytes:
 * [0] keys found, [1] lowest id of a NaN or +inf logit (INT_MAX: none),
 * then the n keys, then the extra ids' logits. */
struct top_result {
    int meta[2];
    top_key keys[CUDA_TOP_MAX];
    float extra_room[CUDA_TOP_EXTRA_MAX]; /* the extras start right after the n keys */
};

__device__ __forceinline__ float *extras_of(top_result *r, int n) { return (float *)(r->keys + n); }

struct top_scratch {
    top_key *part;    /* (TOP_SMEM_KEYS) every block's picks */
    top_result *out;  /* on the device */
    top_result *host; /* its pinned twin */
    int *extra_ids;   /* (CUDA_TOP_EXTRA_MAX) */
    int *bad;         /* the lowest bad id while the blocks run */
    unsigned *ticket;
};

/* -0 and +0 are one value to the sampler (ties broken by id): one key. */
__device__ __forceinline__ top_key key_of(float v, int id) {
    const unsigned bits = v == 0.0f ? 0u : __float_as_uint(v);
    const unsigned ordered = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
    return (top_key)ordered << 32 | (unsigned)~id;
}

static float value_of(top_key k) {
    const unsigned ordered = (unsigned)(k >> 32);
    const unsigned bits = ordered & 0x80000000u ? ordered & 0x7fffffffu : ~ordered;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static int32_t id_of(top_key k) { return (int32_t)~(unsigned)k; }

/* Shared state of one block's selection. */
struct top_select_smem {
    unsigned hist[TOP_THREADS];
    unsigned at_least[TOP_THREADS]; /* keys matching the prefix whose next byte is >= the bin */
    unsigned warp_total[TOP_THREADS / 32];
    int byte, missing, in_bin, count;
};

/* One pass's histogram of the next byte (at shift) of the keys matching
 * prefix. Keys of nearby values share their top bytes, so most of a pass
 * lands in a few bins: the lanes of a warp with the same byte add once. */
__device__ void byte_histogram(const top_key *keys, int m, top_key prefix, top_key mask, int shift,
                               top_select_smem *sm) {
    const int t = (int)threadIdx.x, lane = t & 31;
    for (int i0 = t - lane; i0 < m; i0 += TOP_THREADS) { /* whole warps: the match below needs every lane */
        const int i = i0 + lane;
        const top_key k = i < m ? keys[i] : 0;
        const bool counted = k != 0 && (k & mask) == prefix;
        const int byte = counted ? (int)((k >> shift) & 255) : -1 - lane; /* the others match no one */
        const unsigned same = __match_any_sync(FULL_MASK, byte);
        if (counted && lane == __ffs(same) - 1) atomicAdd(&sm->hist[byte], (unsigned)__popc(same));
    }
}

/* at_least[b] = hist[b] + hist[b + 1] + ...: a warp's 32 bins by
 * shuffles, then the totals of the warps above. */
__device__ void suffix_sums(top_select_smem *sm) {
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    unsigned v = sm->hist[t];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned above = __shfl_down_sync(FULL_MASK, v, off);
        if (lane + off < 32) v += above;
    }
    if (lane == 0) sm->warp_total[warp] = v;
    __syncthreads();
    for (int w = warp + 1; w < TOP_THREADS / 32; w++) v += sm->warp_total[w];
    sm->at_least[t] = v;
    __syncthreads();
}

/* The n largest non-zero keys of keys[0..m) (shared memory) to out[0..)
 * in no particular order; returns how many (fewer than n only when fewer
 * are non-zero). Every thread of the block calls it. */
__device__ int select_top(const top_key *keys, int m, int n, top_key *out, top_select_smem *sm) {
    const int t = (int)threadIdx.x;
    if (t == 0) sm->count = 0;
    __syncthreads();
    int valid = 0;
    for (int i = t; i < m; i += TOP_THREADS) valid += keys[i] != 0;
    atomicAdd(&sm->count, valid);
    __syncthreads();
    int missing = sm->count < n ? sm->count : n;
    const int found = missing;
    top_key prefix = 0, mask = 0;
    for (int shift = 56; shift >= 0 && missing > 0; shift -= 8) {
        sm->hist[t] = 0;
        __syncthreads();
        byte_histogram(keys, m, prefix, mask, shift, sm);
        __syncthreads();
        suffix_sums(sm);
        const unsigned above = t + 1 < TOP_THREADS ? sm->at_least[t + 1] : 0u;
        if (sm->at_least[t] >= (unsigned)missing && above < (unsigned)missing) {
            sm->byte = t;
            sm->missing = missing - (int)above;
            sm->in_bin = (int)sm->hist[t];
        }
        __syncthreads();
        prefix |= (top_key)sm->byte << shift;
        mask |= (top_key)255 << shift;
        missing = sm->missing;
        const bool whole_bin = sm->in_bin == missing;
        __syncthreads(); /* everyone has read byte and missing before the next pass */
        if (whole_bin) break;
    }
    /* prefix, its lower bytes 0, is the smallest key taken */
    if (t == 0) sm->count = 0;
    __syncthreads();
    for (int i = t; i < m && found > 0; i += TOP_THREADS) {
        const top_key k = keys[i];
        if (k != 0 && k >= prefix) out[atomicAdd(&sm->count, 1)] = k;
    }
    __syncthreads();
    return found;
}

__global__ void top_logits_kernel(const float *logits, int n_vocab, int slice, int n, top_scratch s, int n_extra) {
    DYN_SMEM(top_key, keys);
    __shared__ top_select_smem sm;
    __shared__ int last;
    const int t = (int)threadIdx.x;
    const int begin = (int)blockIdx.x * slice;
    const int m = n_vocab - begin < slice ? n_vocab - begin : slice;
    for (int i = t; i < m; i += TOP_THREADS) {
        const float v = logits[begin + i];
        if (isnan(v) || v == INFINITY) atomicMin(s.bad, begin + i);
        keys[i] = isnan(v) || v == INFINITY || v == -INFINITY ? 0 : key_of(v, begin + i);
    }
    __syncthreads();
    top_key *mine = s.part + (size_t)blockIdx.x * n;
    const int got = select_top(keys, m, n, mine, &sm);
    for (int i = got + t; i < n; i += TOP_THREADS) mine[i] = 0;
    if (!last_block(s.ticket, gridDim.x, &last)) return;
    const int total = (int)gridDim.x * n;
    for (int i = t; i < total; i += TOP_THREADS) keys[i] = __ldcg(s.part + i);
    __syncthreads();
    const int found = select_top(keys, total, n, s.out->keys, &sm);
    float *extra = extras_of(s.out, n);
    for (int i = t; i < n_extra; i += TOP_THREADS) extra[i] = logits[s.extra_ids[i]];
    if (t == 0) {
        s.out->meta[0] = found;
        s.out->meta[1] = atomicExch(s.bad, INT_MAX);
    }
}

/* A slice for each block such that neither a slice nor all blocks' picks
 * outgrow shared memory: about sqrt(n_vocab n) each. False when none fits. */
static bool plan(int n_vocab, int n, int *slice, int *blocks) {
    int s = n;
    while ((int64_t)s * s < (int64_t)n_vocab * n) s += TOP_THREADS;
    if (s > n_vocab) s = n_vocab;
    *slice = s;
    *blocks = (n_vocab + s - 1) / s;
    return s <= TOP_SMEM_KEYS && (int64_t)*blocks * n <= TOP_SMEM_KEYS;
}

static moe_status make_scratch(top_scratch **out, moe_error *err) {
    top_scratch *s = (top_scratch *)calloc(1, sizeof *s);
    if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    *out = s;
    const size_t bytes = TOP_SMEM_KEYS * sizeof(top_key) + sizeof(top_result) + CUDA_TOP_EXTRA_MAX * sizeof(int) +
                         2 * sizeof(int);
    uint8_t *p;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    s->part = (top_key *)p;
    s->out = (top_result *)(s->part + TOP_SMEM_KEYS);
    s->extra_ids = (int *)(s->out + 1);
    s->bad = s->extra_ids + CUDA_TOP_EXTRA_MAX;
    s->ticket = (unsigned *)(s->bad + 1);
    CUDA_CHECK(cudaMallocHost(&s->host, sizeof *s->host));
    const int init[2] = {INT_MAX, 0}; /* bad, ticket */
    CUDA_CHECK(cudaMemcpy(s->bad, init, sizeof init, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaFuncSetAttribute(top_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    TOP_SMEM_KEYS * (int)sizeof(top_key)));
    return MOE_OK;
}

void cuda_top_scratch_free(top_scratch *s) {
    if (!s) return;
    cudaFree(s->part);
    if (s->host) cudaFreeHost(s->host);
    free(s);
}

void cuda_top_free(cuda_state *st) {
    cuda_top_scratch_free(st->top);
    st->top = NULL;
}

static int by_rank(const void *pa, const void *pb) {
    const sampler_candidate *a = (const sampler_candidate *)pa, *b = (const sampler_candidate *)pb;
    if (a->value != b->value) return a->value < b->value ? 1 : -1;
    return (a->id > b->id) - (a->id < b->id);
}

moe_status cuda_top_logits_at(top_scratch **scratch, const float *logits, int n_vocab, cudaStream_t stream, int n,
                             const int32_t *extra, int n_extra, sampler_candidate *top, int *n_found,
                             float *extra_logits, moe_error *err) {
    int slice, blocks;
    if (n < 1 || n > CUDA_TOP_MAX || n_extra < 0 || n_extra > CUDA_TOP_EXTRA_MAX || !plan(n_vocab, n, &slice, &blocks))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "the GPU selects 1..%d top logits and %d extra (asked %d, %d)",
                             CUDA_TOP_MAX, CUDA_TOP_EXTRA_MAX, n, n_extra);
    for (int i = 0; i < n_extra; i++)
        if (extra[i] < 0 || extra[i] >= n_vocab)
            return moe_error_set(err, MOE_ERR_RANGE, "token id %d is outside the vocabulary of %d", extra[i], n_vocab);
    moe_status status = *scratch ? MOE_OK : make_scratch(scratch, err);
    if (status != MOE_OK) return status;
    const top_scratch *s = *scratch;
    if (n_extra)
        CUDA_CHECK(cudaMemcpyAsync(s->extra_ids, extra, (size_t)n_extra * sizeof(int), cudaMemcpyHostToDevice, stream));
    const size_t smem = (size_t)(slice > blocks * n ? slice : blocks * n) * sizeof(top_key);
    LAUNCH(top_logits_kernel, blocks, TOP_THREADS, smem, stream, logits, n_vocab, slice, n, *s, n_extra);
    CUDA_CHECK(cudaGetLastError());
    const size_t back = offsetof(top_result, keys) + (size_t)n * sizeof(top_key) + (size_t)n_extra * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(s->host, s->out, back, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const top_result *r = s->host;
    if (r->meta[1] != INT_MAX)
        return moe_error_set(err, MOE_ERR_FORMAT, "the logit of token %d is NaN or +inf", r->meta[1]);
    for (int i = 0; i < r->meta[0]; i++) top[i] = sampler_candidate{id_of(r->keys[i]), value_of(r->keys[i])};
    if (n_extra) memcpy(extra_logits, r->keys + n, (size_t)n_extra * sizeof(float));
    qsort(top, (size_t)r->meta[0], sizeof *top, by_rank);
    *n_found = r->meta[0];
    return MOE_OK;
}

moe_status cuda_top_logits(cuda_state *st, int n, const int32_t *extra, int n_extra, sampler_candidate *top,
                           int *n_found, float *extra_logits, moe_error *err) {
    return cuda_top_logits_at(&st->top, st->logits, st->m->config.n_vocab, st->stream, n, extra, n_extra, top, n_found,
                      extra_logits, err);
}

moe_status cuda_last_logits(cuda_state *st, float *out, moe_error *err) {
    CUDA_CHECK(cudaMemcpyAsync(out, st->logits, (size_t)st->m->config.n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                               st->stream));
    CUDA_CHECK(cudaStreamSynchronize(st->stream));
    return MOE_OK;
}

moe_status cuda_test_top_logits(const float *logits, int n_vocab, int n, const int32_t *extra, int n_extra,
                                sampler_candidate *top, int *n_found, float *extra_logits, moe_error *err) {
    float *d = NULL;
    top_scratch *scratch = NULL;
    CUDA_CHECK(cudaMalloc(&d, (size_t)n_vocab * sizeof(float)));
    moe_status st = MOE_OK;
    if (cudaMemcpy(d, logits, (size_t)n_vocab * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        st = moe_error_set(err, MOE_ERR_IO, "copying the logits to the GPU failed");
    /* twice: the second call finds the ticket and the NaN flag reset by the first */
    for (int rep = 0; rep < 2 && st == MOE_OK; rep++)
        st = cuda_top_logits_at(&scratch, d, n_vocab, 0, n, extra, n_extra, top, n_found, extra_logits, err);
    cuda_top_scratch_free(scratch);
    cudaFree(d);
    return st;
}
