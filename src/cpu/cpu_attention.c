/* cpu_attention.c — see cpu_attention.h. */
#include "cpu/cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_ops.h"

/* Spans are at least this many positions, and a context has at most
 * SPANS_MAX of them (a longer span instead): enough tasks to spread one
 * token's long context over the threads, few partial results to merge. */
enum { SPAN_MIN = 256, SPANS_MAX = 32, GROUP_TOKENS = 16 };

static float *alloc_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* Floats rounded up to whole 64-byte cache lines. */
static size_t line_floats(size_t n) { return (n + 15) / 16 * 16; }

bool cpu_attention_init(cpu_attention *a, const model_config *c, int n_ctx, int max_batch, int workers,
                        moe_kv_type kv_type) {
    memset(a, 0, sizeof *a);
    a->n_layers = c->n_layers;
    a->n_ctx = n_ctx;
    a->n_heads = c->n_heads;
    a->n_kv = c->n_kv_heads;
    a->hd = c->head_dim;
    a->kv_dim = c->n_kv_heads * c->head_dim;
    const moe_type type = kv_type == MOE_KV_F16 ? MOE_TYPE_F16 : MOE_TYPE_F32;
    a->format = quant_format_of(type);
    a->key_dot = cpu_dot_kernel(type);
    a->widen = type == MOE_TYPE_F16 ? cpu_f16_to_f32_kernel() : NULL;
    const int by_count = (n_ctx + SPANS_MAX - 1) / SPANS_MAX;
    a->span = by_count > SPAN_MIN ? by_count : SPAN_MIN;
    a->max_spans = (n_ctx + a->span - 1) / a->span;
    a->group = max_batch < GROUP_TOKENS ? max_batch : GROUP_TOKENS;
    const size_t parts = (size_t)a->group * a->n_heads * a->max_spans;
    const size_t cache = cpu_attention_cache_bytes(a) / 2;
    a->k_cache = calloc(cache ? cache : 1, 1);
    a->v_cache = calloc(cache ? cache : 1, 1);
    a->span_out = alloc_floats(parts * a->hd);
    a->span_ml = alloc_floats(parts * 2);
    /* a worker's scratch on cache lines of its own: sums written by two
     * workers into one line would make them take turns on it */
    const int G = a->n_heads / a->n_kv;
    a->scratch_floats = line_floats((size_t)G * a->span) + line_floats((size_t)G * a->hd) + line_floats(a->hd) +
                        line_floats(2 * (size_t)G);
    a->scratch = aligned_alloc(64, (size_t)workers * a->scratch_floats * sizeof(float));
    return a->k_cache && a->v_cache && a->span_out && a->span_ml && a->scratch;
}

void cpu_attention_free(cpu_attention *a) {
    free(a->k_cache);
    free(a->v_cache);
    free(a->span_out);
    free(a->span_ml);
    free(a->scratch);
    memset(a, 0, sizeof *a);
}

size_t cpu_attention_cache_bytes(const cpu_attention *a) {
    return 2 * (size_t)a->n_layers * a->n_ctx * a->kv_dim * a->format->block_bytes;
}

/* The cache's row of position `pos` in layer l (kv_dim elements). */
static uint8_t *cache_row(const cpu_attention *a, uint8_t *cache, int l, int pos) {
    return cache + ((size_t)l * a->n_ctx + (size_t)pos) * a->kv_dim * a->format->block_bytes;
}

void cpu_attention_append(cpu_attention *a, int l, int pos, int n, const float *k, const float *v) {
    a->format->quantize(k, cache_row(a, a->k_cache, l, pos), (int64_t)n * a->kv_dim);
    a->format->quantize(v, cache_row(a, a->v_cache, l, pos), (int64_t)n * a->kv_dim);
}

typedef struct attention_job {
    cpu_attention *a;
    int layer, pos;  /* the batch's first position */
    int t0, n_spans; /* the group's first token; spans of its last */
    const float *q;
    float *out;
} attention_job;

/* Where (token tl of the group, head h, span sp) keeps its partial result. */
static size_t part_index(const cpu_attention *a, int tl, int h, int sp) {
    return ((size_t)tl * a->n_heads + h) * a->max_spans + sp;
}

/* One (token, KV head, span): the G query heads' partial results over the
 * span's positions, summed in the worker's scratch and then stored: into
 * the output (divided by l) when the context is one span, else for the
 * merge. A span past the token's last position is empty (l = 0). */
static void attend_span(void *ctx, int64_t task, int worker) {
    const attention_job *job = ctx;
    cpu_attention *a = job->a;
    const int G = a->n_heads / a->n_kv, hd = a->hd, span = a->span;
    const int sp = (int)(task % job->n_spans), g = (int)(task / job->n_spans % a->n_kv);
    const int tl = (int)(task / job->n_spans / a->n_kv), t = job->t0 + tl;
    const int p0 = sp * span, p1 = job->pos + t + 1 < p0 + span ? job->pos + t + 1 : p0 + span;
    const size_t head_off = (size_t)g * hd * a->format->block_bytes;
    const float *q = job->q + (size_t)t * a->n_heads * hd + (size_t)g * G * hd;
    float *scores = a->scratch + (size_t)worker * a->scratch_floats;
    float *sums = scores + line_floats((size_t)G * span), *row = sums + line_floats((size_t)G * hd);
    float *m = row + line_floats(hd), *l = m + G;
    for (int hh = 0; hh < G; hh++) m[hh] = -INFINITY, l[hh] = 0.0f;
    if (p0 < p1) {
        const float scale = 1.0f / sqrtf((float)hd);
        for (int p = p0; p < p1; p++) {
            const uint8_t *key = cache_row(a, a->k_cache, job->layer, p) + head_off;
            for (int hh = 0; hh < G; hh++) scores[hh * span + p - p0] = a->key_dot(key, q + hh * hd, hd) * scale;
        }
        for (int hh = 0; hh < G; hh++) l[hh] = (float)cpu_softmax_unnormalised(scores + hh * span, p1 - p0, &m[hh]);
        memset(sums, 0, (size_t)G * hd * sizeof *sums);
        for (int p = p0; p < p1; p++) {
            const uint8_t *cached = cache_row(a, a->v_cache, job->layer, p) + head_off;
            const float *value = (const float *)cached;
            if (a->widen) a->widen(cached, row, hd), value = row;
            for (int hh = 0; hh < G; hh++) {
                const float w = scores[hh * span + p - p0];
                for (int i = 0; i < hd; i++) sums[hh * hd + i] += w * value[i];
            }
        }
    }
    for (int hh = 0; hh < G; hh++) {
        const int h = g * G + hh;
        if (job->n_spans == 1) { /* the whole context: never empty */
            const float inv = (float)(1.0 / l[hh]);
            float *out = job->out + (size_t)t * a->n_heads * hd + (size_t)h * hd;
            for (int i = 0; i < hd; i++) out[i] = sums[hh * hd + i] * inv;
            continue;
        }
        float *ml = a->span_ml + 2 * part_index(a, tl, h, sp);
        ml[0] = m[hh], ml[1] = l[hh];
        if (p0 < p1) memcpy(a->span_out + part_index(a, tl, h, sp) * hd, sums + hh * hd, (size_t)hd * sizeof *sums);
    }
}

/* One (token, query head): its spans merged in the worker's scratch, then
 * stored as its output. */
static void merge_spans(void *ctx, int64_t task, int worker) {
    const attention_job *job = ctx;
    const cpu_attention *a = job->a;
    const int tl = (int)(task / a->n_heads), h = (int)(task % a->n_heads), hd = a->hd;
    const float *ml = a->span_ml + 2 * part_index(a, tl, h, 0), *acc = a->span_out + part_index(a, tl, h, 0) * hd;
    float M = -INFINITY;
    for (int sp = 0; sp < job->n_spans; sp++) M = ml[2 * sp] > M ? ml[2 * sp] : M;
    double L = 0;
    float *sums = a->scratch + (size_t)worker * a->scratch_floats;
    memset(sums, 0, (size_t)hd * sizeof *sums);
    for (int sp = 0; sp < job->n_spans; sp++) {
        if (ml[2 * sp + 1] == 0.0f) continue; /* empty */
        const float f = expf(ml[2 * sp] - M);
        L += (double)ml[2 * sp + 1] * f;
        for (int i = 0; i < hd; i++) sums[i] += f * acc[(size_t)sp * hd + i];
    }
    const float inv = (float)(1.0 / L);
    float *out = job->out + (size_t)(job->t0 + tl) * a->n_heads * hd + (size_t)h * hd;
    for (int i = 0; i < hd; i++) out[i] = sums[i] * inv;
}

void cpu_attention_run(cpu_attention *a, thread_pool *pool, int l, int pos, int n, const float *q, float *out) {
    attention_job job = {.a = a, .layer = l, .pos = pos, .q = q, .out = out};
    for (job.t0 = 0; job.t0 < n; job.t0 += a->group) {
        const int tokens = n - job.t0 < a->group ? n - job.t0 : a->group;
        job.n_spans = (pos + job.t0 + tokens + a->span - 1) / a->span;
        thread_pool_run(pool, (int64_t)tokens * a->n_kv * job.n_spans, attend_span, &job);
        if (job.n_spans > 1) thread_pool_run(pool, (int64_t)tokens * a->n_heads, merge_spans, &job);
    }
}
