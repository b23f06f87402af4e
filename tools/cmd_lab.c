/*
 * cmd_lab.c — `moe lab`: the kernel lab. The decode step's matrix kernels
 * on the GPU at Qwen3-30B-A3B's shapes, each first checked against the CPU
 * and then timed beside a pure read of the same bytes (src/cuda/lab.cu
 * says how), and the cost of a chain of dependent launches plain, in a
 * graph, and in a graph with programmatic dependent launch, and what a
 * kernel's code costs to fetch when the caches are cold. It answers
 * "how far from the memory system is each kernel, and why" with one
 * command; it needs a CUDA GPU.
 *
 * Weights are random valid blocks in GGUF layout: every 256 values of a
 * row are a chunk drawn from a pool that the format's reference quantizer
 * made from Gaussian values (as `moe synth` fills tensors: quantizing the
 * 311 M values of an output head for every type would take minutes).
 *
 * The check before timing: one launch on a fresh upload (cuda_test_gemv,
 * cuda_test_experts: outputs poisoned with NaN first) against the CPU's
 * dot product of each row with the input quantized to the format's dot
 * type (quant_format.dot), as tests/test_cuda_kernels.c does. The worst
 * |gpu - cpu| / sum |w x| over the rows must be at most 1e-5; a variant
 * past it is marked FAIL, not timed, and makes the exit status 1.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "common/error.h"
#include "common/median.h"
#include "common/progress.h"
#include "common/thread_pool.h"
#include "cuda/cuda_backend.h"
#include "quant/quant.h"

static const moe_type lab_types[] = {MOE_TYPE_Q4_K, MOE_TYPE_Q5_K, MOE_TYPE_Q6_K, MOE_TYPE_Q8_0, MOE_TYPE_Q4_0,
                                     MOE_TYPE_Q5_0, MOE_TYPE_IQ4_NL, MOE_TYPE_BF16, MOE_TYPE_F16, MOE_TYPE_F32};
enum { N_LAB_TYPES = sizeof lab_types / sizeof lab_types[0] };

typedef struct lab_args {
    moe_type types[N_LAB_TYPES]; /* distinct */
    int n_types, reps;
    bool json;
} lab_args;

#ifdef MOE_HAVE_CUDA

#define LAB_TOLERANCE 1e-5
#define LAB_BW_GIB 8.0 /* the read-bandwidth probe's buffer, as moe bench's default */

enum {
    POOL_CHUNKS = 4096,
    CHUNK = 256,     /* values per pool entry: a whole number of blocks of every type */
    CHECK_ROWS = 256, /* rows per task of the CPU check */
    N_EXPERTS = 128, TOP_K = 8, N_FF = 768, N_EMBD = 2048, /* Qwen3-30B-A3B */
    CHAIN_LAUNCHES = 1000,
    BW_RUNS = 10,
};

static const struct {
    const char *role;
    int rows, cols;
    bool stream; /* the rows streamed through shared memory (only where the type's rows can) */
} gemv_shapes[] = {{"q proj", 4096, 2048, false},
                   {"o proj", 2048, 4096, false},
                   {"output head", 151936, 2048, false},
                   {"output head, streamed", 151936, 2048, true}};
enum { N_SHAPES = sizeof gemv_shapes / sizeof gemv_shapes[0] };

/* ------------------------------------------------------------ random weights */

static uint64_t next_random(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return ((next_random(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static float gaussian(uint64_t *s) {
    double u = uniform(s), v = uniform(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Chunks of CHUNK values quantized by the format's reference quantizer. */
typedef struct weight_pool {
    moe_type type;
    size_t chunk_bytes;
    uint8_t *chunks;
} weight_pool;

static bool pool_make(weight_pool *p, moe_type type, uint64_t *rng) {
    const quant_format *f = quant_format_of(type);
    float values[CHUNK];
    p->type = type;
    p->chunk_bytes = quant_row_bytes(type, CHUNK);
    p->chunks = malloc(POOL_CHUNKS * p->chunk_bytes);
    if (!p->chunks) return false;
    for (int c = 0; c < POOL_CHUNKS; c++) {
        for (int i = 0; i < CHUNK; i++) values[i] = gaussian(rng) * 0.02f; /* about a trained model's weights */
        f->quantize(values, p->chunks + (size_t)c * p->chunk_bytes, CHUNK);
    }
    return true;
}

/* n_values (a multiple of CHUNK) of weights, GGUF layout; NULL when out of memory. */
static uint8_t *pool_draw(const weight_pool *p, int64_t n_values, uint64_t *rng) {
    const int64_t n = n_values / CHUNK;
    uint8_t *w = malloc((size_t)n * p->chunk_bytes);
    for (int64_t c = 0; w && c < n; c++)
        memcpy(w + (size_t)c * p->chunk_bytes, p->chunks + (next_random(rng) % POOL_CHUNKS) * p->chunk_bytes,
               p->chunk_bytes);
    return w;
}

static float *gaussian_vector(int n, uint64_t *rng) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; v && i < n; i++) v[i] = gaussian(rng);
    return v;
}

/* ------------------------------------------------------------ the CPU reference */

/* x quantized to the format's dot type, as the GPU stages it. */
static void *quantize_input(moe_type type, const float *x, int n) {
    const quant_format *a = quant_format_of(quant_format_of(type)->dot_type);
    void *xq = malloc(quant_row_bytes(a->type, n));
    if (xq) a->quantize(x, xq, n);
    return xq;
}

/* The CPU's dot of one weight row with xq, and sum |w x| (dequantized, in
 * double) in *mag; deq is scratch of n floats. */
static float cpu_row(const quant_format *f, const uint8_t *row, const void *xq, const float *x, int n, float *deq,
                     double *mag) {
    f->dequantize(row, deq, n);
    double m = 0;
    for (int i = 0; i < n; i++) m += fabs((double)deq[i] * x[i]);
    *mag = m;
    return f->dot(row, xq, n);
}

static double ratio_of(double diff, double mag) {
    double r = mag > 0 ? diff / mag : diff;
    return isnan(r) ? INFINITY : r;
}

typedef struct gemv_check {
    const quant_format *f;
    const uint8_t *w;
    size_t row_bytes;
    int rows, cols;
    const float *x, *gpu;
    const void *xq;
    float *deq;    /* cols floats per worker */
    double *worst; /* per task */
} gemv_check;

static void check_task(void *ctx, int64_t task, int worker) {
    const gemv_check *g = ctx;
    float *deq = g->deq + (size_t)worker * g->cols;
    double worst = 0;
    for (int r = (int)task * CHECK_ROWS; r < g->rows && r < (task + 1) * CHECK_ROWS; r++) {
        double mag;
        float ref = cpu_row(g->f, g->w + (size_t)r * g->row_bytes, g->xq, g->x, g->cols, deq, &mag);
        double ratio = ratio_of(fabs((double)g->gpu[r] - ref), mag);
        if (ratio > worst) worst = ratio;
    }
    g->worst[task] = worst;
}

/* Worst |gpu - cpu| / sum |w x| of y = W x over the rows, x Gaussian. */
static moe_status check_gemv(moe_type type, int rows, int cols, const uint8_t *w, bool stream, thread_pool *pool,
                             uint64_t *rng, double *worst, moe_error *err) {
    const int tasks = (rows + CHECK_ROWS - 1) / CHECK_ROWS;
    gemv_check g = {quant_format_of(type), w, quant_row_bytes(type, cols), rows, cols, NULL, NULL, NULL, NULL, NULL};
    float *x = gaussian_vector(cols, rng), *y = malloc((size_t)rows * sizeof *y);
    g.deq = malloc((size_t)thread_pool_size(pool) * cols * sizeof *g.deq);
    g.worst = malloc((size_t)tasks * sizeof *g.worst);
    moe_status st = x && y && g.deq && g.worst ? cuda_test_gemv(type, rows, cols, w, x, y, stream, err)
                                               : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    void *xq = st == MOE_OK ? quantize_input(type, x, cols) : NULL;
    if (st == MOE_OK && !xq) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) {
        g.x = x, g.gpu = y, g.xq = xq;
        thread_pool_run(pool, tasks, check_task, &g);
        *worst = 0;
        for (int t = 0; t < tasks; t++)
            if (g.worst[t] > *worst) *worst = g.worst[t];
    }
    free(x), free(y), free(xq), free(g.deq), free(g.worst);
    return st;
}

/* The routed experts in GGUF layout: n_experts slabs back to back. */
typedef struct expert_weights {
    moe_type type;
    uint8_t *gate, *up, *down;
    size_t gate_bytes, down_bytes; /* of one expert */
} expert_weights;

static double silu(double g) { return g / (1.0 + exp(-g)); }
static double silu_slope(double g) {
    double s = 1.0 / (1.0 + exp(-g));
    return s * (1.0 + g * (1.0 - s));
}

/* h = silu(G x) * (U x) of the k experts: the error of each h against the
 * CPU's, over the sum |w x| of gate and up carried through SwiGLU to first
 * order (|silu'(g) u| sum|g x| + |silu(g)| sum|u x|). */
static double worst_up(const expert_weights *ew, const int32_t *ids, const float *x, const float *h, float *deq) {
    const quant_format *f = quant_format_of(ew->type);
    const size_t row_bytes = quant_row_bytes(ew->type, N_EMBD);
    void *xq = quantize_input(ew->type, x, N_EMBD);
    double worst = xq ? 0 : INFINITY;
    for (int j = 0; xq && j < TOP_K; j++)
        for (int r = 0; r < N_FF; r++) {
            const size_t at = (size_t)ids[j] * ew->gate_bytes + (size_t)r * row_bytes;
            double mag_g, mag_u;
            double g = cpu_row(f, ew->gate + at, xq, x, N_EMBD, deq, &mag_g);
            double u = cpu_row(f, ew->up + at, xq, x, N_EMBD, deq, &mag_u);
            double bound = fabs(silu_slope(g) * u) * mag_g + fabs(silu(g)) * mag_u;
            double ratio = ratio_of(fabs(h[j * N_FF + r] - silu(g) * u), bound);
            if (ratio > worst) worst = ratio;
        }
    free(xq);
    return worst;
}

/* y = y0 + sum_j w_j D_{ids[j]} h_j on the GPU's own h: the error of y - y0
 * over sum_j w_j sum |d h|. */
static double worst_down(const expert_weights *ew, const int32_t *ids, const float *weights, const float *h,
                         const float *y0, const float *y, float *deq) {
    const quant_format *f = quant_format_of(ew->type);
    const size_t row_bytes = quant_row_bytes(ew->type, N_FF);
    void *hq[TOP_K];
    bool ok = true;
    for (int j = 0; j < TOP_K; j++) ok &= (hq[j] = quantize_input(ew->type, h + j * N_FF, N_FF)) != NULL;
    double worst = ok ? 0 : INFINITY;
    for (int r = 0; ok && r < N_EMBD; r++) {
        double want = 0, mag = 0;
        for (int j = 0; j < TOP_K; j++) {
            double m;
            want += weights[j] * cpu_row(f, ew->down + (size_t)ids[j] * ew->down_bytes + (size_t)r * row_bytes, hq[j],
                                         h + j * N_FF, N_FF, deq, &m);
            mag += fabs(weights[j]) * m;
        }
        double ratio = ratio_of(fabs(((double)y[r] - y0[r]) - want), mag);
        if (ratio > worst) worst = ratio;
    }
    for (int j = 0; j < TOP_K; j++) free(hq[j]);
    return worst;
}

/* Both expert kernels once on the GPU (cuda_test_experts) against the CPU. */
static moe_status check_experts(const expert_weights *ew, int lanes_shift, uint64_t *rng, double *worst_h,
                                double *worst_y, moe_error *err) {
    int32_t ids[TOP_K];
    float weights[TOP_K];
    for (int j = 0; j < TOP_K; j++) { /* distinct: expert j of every N_EXPERTS / TOP_K, shifted at random */
        ids[j] = (int32_t)(j * (N_EXPERTS / TOP_K) + next_random(rng) % (N_EXPERTS / TOP_K));
        weights[j] = (float)(0.1 + uniform(rng));
    }
    float *x = gaussian_vector(N_EMBD, rng), *y0 = gaussian_vector(N_EMBD, rng);
    float *y = malloc(N_EMBD * sizeof *y), *h = malloc(TOP_K * N_FF * sizeof *h);
    float *deq = malloc(N_EMBD * sizeof *deq);
    const cuda_test_expert_io io = {ew->type, ew->type, N_EXPERTS, TOP_K,       N_FF, N_EMBD, ew->gate, ew->up,
                                    ew->down, ids,      weights,   NULL,  0, lanes_shift, x, y0, h, y};
    moe_status st = x && y0 && y && h && deq ? cuda_test_experts(&io, err)
                                             : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) {
        *worst_h = worst_up(ew, ids, x, h, deq);
        *worst_y = worst_down(ew, ids, weights, h, y0, y, deq);
    }
    free(x), free(y0), free(y), free(h), free(deq);
    return st;
}

/* ------------------------------------------------------------ results */

typedef struct lab_row {
    const char *type;
    char what[64]; /* the matrix, or the expert kernel */
    double check;  /* worst |gpu - cpu| / sum |w x| */
    bool failed;   /* over the tolerance: not timed */
    cuda_lab_timing t;
} lab_row;

enum { N_CHAINS = 3, N_TOPS = 5, TOP_VOCAB = 151936, N_CODES = 3, N_Q4K_VARIANTS = 3 };

/* The stagings of the decode step (kernels.cuh) at Qwen3-30B-A3B's sizes:
 * the residual behind a norm as the matrix products and ffn_up stage it,
 * the attention's output and ffn_down's eight hidden states without one,
 * and the floor under each size. */
static const struct {
    moe_type dot;
    int how, n;
    const char *what;
} stage_rows[] = {
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_PRODUCTS, 2048, "q|k|v, head"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_NORMED, 2048, "ffn_up"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_LOADS, 2048, "floor"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_PLAIN, 4096, "o"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_LOADS, 4096, "floor"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_PLAIN, 6144, "ffn_down, 8 x 768"},
    {MOE_TYPE_Q8_K, CUDA_LAB_STAGE_LOADS, 6144, "floor"},
    {MOE_TYPE_Q8_0, CUDA_LAB_STAGE_PRODUCTS, 2048, "q|k|v, head"},
    {MOE_TYPE_Q8_0, CUDA_LAB_STAGE_NORMED, 2048, "ffn_up"},
    {MOE_TYPE_F32, CUDA_LAB_STAGE_PRODUCTS, 2048, "router"},
    {MOE_TYPE_F32, CUDA_LAB_STAGE_NORMED, 2048, "ffn_up"},
};
enum { N_STAGES = sizeof stage_rows / sizeof stage_rows[0] };
static const char *const stage_ways[CUDA_LAB_STAGE_WAYS] = {"x * w, scale apart", "full norm", "no norm",
                                                            "first loads + barrier"};

/* The sampling rows: the top n logits (and n_extra penalised) to the host,
 * n = 0: all of them. */
typedef struct top_row {
    const char *what;
    int n, n_extra;
    double us;
} top_row;

typedef struct chain_row {
    const char *what;
    int blocks, threads;
    cuda_lab_chain c;
} chain_row;

typedef struct lab_report {
    char device[256];
    int n_sm, reps;
    double bw_median, bw_min, bw_max;
    lab_row gemv[N_LAB_TYPES * N_SHAPES], experts[2 * (N_LAB_TYPES + N_Q4K_VARIANTS)];
    int n_gemv, n_experts;
    chain_row chains[N_CHAINS];
    top_row tops[N_TOPS];
    cuda_lab_code codes[N_CODES];
    cuda_lab_stage stages[N_STAGES];
    int failures;
} lab_report;

static double gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }

static void print_timing_md(const lab_report *r, const lab_row *w) {
    if (w->failed) { /* not timed: no bytes, no figures */
        printf("| %s | %s | | **FAIL** %.2g | | | | | | | | | |\n", w->type, w->what, w->check);
        return;
    }
    const double k = gbps(w->t.bytes, w->t.us), rd = gbps(w->t.bytes, w->t.read_us);
    char streamed[32] = "";
    if (w->t.stages) snprintf(streamed, sizeof streamed, ", %d tiles", w->t.stages);
    printf("| %s | %s | %.2f | %.1e | %d x %d%s | %d | %.1f | %.0f | %.1f | %.0f | %.1f%% | %.1f%% | %.1f%% |\n",
           w->type, w->what, w->t.bytes / 1e6, w->check, w->t.grid, w->t.lanes, streamed, w->t.copies, w->t.us, k,
           w->t.read_us, rd, rd > 0 ? 100 * k / rd : 0, 100 * k / r->bw_median, 100 * rd / r->bw_median);
}

static void print_table_md(const lab_report *r, const lab_row *rows, int n, const char *what, const char *kernel) {
    printf("| type | %s | MB | check | grid x lanes | copies | %s us | %s GB/s | read us | read GB/s | %s / read | "
           "%s of BW | read of BW |\n",
           what, kernel, kernel, kernel, kernel);
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++) print_timing_md(r, &rows[i]);
}

static void print_occupancy_warnings(const lab_row *rows, int n) {
    for (int i = 0; i < n; i++)
        if (!rows[i].failed && rows[i].t.read_occupancy < rows[i].t.occupancy)
            printf("Warning: %s %s: the pure read fits %d blocks per SM, the kernel %d; its grid takes more than one "
                   "wave and the read is slowed.\n",
                   rows[i].type, rows[i].what, rows[i].t.read_occupancy, rows[i].t.occupancy);
}

static void print_stages_md(const lab_report *r) {
    printf("\n### Staging: one block an SM stages the decode step's activations\n\n");
    printf("| input of | dot type | values | staged as | cold us | cold, last block | hot us | hot, last block |\n");
    printf("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < N_STAGES; i++) {
        const cuda_lab_stage *g = &r->stages[i];
        printf("| %s | %s | %d | %s | %.2f | %.2f | %.2f | %.2f |\n", stage_rows[i].what, quant_format_of(g->dot)->name,
               g->n, stage_ways[g->how], g->cold_us, g->cold_last_us, g->hot_us, g->hot_last_us);
    }
    printf("\nStaging rows: every block's time on the GPU's clock from a barrier at its entry to the staging's last "
           "barrier, the input just written by the launch before (in L2) and the norm's weights read by it; the "
           "median block and the last, medians of %d. Cold: after the code rows' L2 sweep and code on every "
           "multiprocessor, as in the decode step; hot: the same launch again. The codes are held to the CPU's bit "
           "for bit by test_stage_exact.\n",
           r->reps);
}

static void print_markdown(const lab_report *r) {
    printf("## moe lab: %s (%d SMs)\n\n", r->device, r->n_sm);
    printf("Read bandwidth (BW): %.0f GB/s, median of %d runs of a 16-byte-load read kernel over %.1f GiB (spread "
           "%.0f..%.0f).\n\n",
           r->bw_median, BW_RUNS, LAB_BW_GIB, r->bw_min, r->bw_max);
    printf("### GEMV (gemv_kernel, no norm, no epilogue) beside a pure read of the same bytes\n\n");
    print_table_md(r, r->gemv, r->n_gemv, "matrix (rows x cols)", "gemv");
    printf("\n### Routed experts by id (%d experts, %d a token; gate/up %d x %d, down %d x %d)\n\n", N_EXPERTS, TOP_K,
           N_FF, N_EMBD, N_EMBD, N_FF);
    print_table_md(r, r->experts, r->n_experts, "kernel", "kernel");
    printf("\n### A chain of %d dependent launches (each reads what the one before wrote)\n\n", CHAIN_LAUNCHES);
    printf("| kernel | blocks x threads | plain stream us/launch | one graph us/launch | graph + PDL us/launch | one "
           "kernel, grid barriers us/link | the same, release/acquire barriers us/link |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < N_CHAINS; i++) {
        const chain_row *c = &r->chains[i];
        printf("| %s | %d x %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", c->what, c->blocks, c->threads, c->c.plain_us,
               c->c.graph_us, c->c.pdl_us, c->c.barrier_us, c->c.acq_rel_barrier_us);
    }
    printf("\n### Code fetch: one warp through straight-line code, its caches cold and hot\n\n");
    printf("| code KB | cold us | hot us | cold - hot, ns per KB |\n| ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < N_CODES; i++) {
        const cuda_lab_code *c = &r->codes[i];
        printf("| %d | %.2f | %.2f | %.0f |\n", c->kb, c->cold_us, c->hot_us, 1e3 * (c->cold_us - c->hot_us) / c->kb);
    }
    printf("\nCode rows: 16-byte FFMAs in eight independent chains, timed on the GPU's clock from the first to the "
           "last; cold: after a %d MB read through L2 and %d KB of other code on every multiprocessor (what a layer "
           "of the decode step puts between two runs of a kernel), hot: the same launch again. Medians of %d.\n",
           r->codes[0].sweep_mb, r->codes[0].flush_kb, r->reps);
    print_stages_md(r);
    printf("\n### Sampling: what a token pays to bring logits to the host (%d logits)\n\n", TOP_VOCAB);
    printf("| what | top n | penalised | us per token |\n| --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < N_TOPS; i++)
        printf("| %s | %d | %d | %.1f |\n", r->tops[i].what, r->tops[i].n, r->tops[i].n_extra, r->tops[i].us);
    printf("\nSampling rows: cuda_top_logits (one launch, the copies back, a stream sync) or, for every logit, "
           "the copy and the sync; the median on the host's clock of %d calls after a warm-up.\n", r->reps);
    printf("\nTimes: median of %d replays after a warm-up replay of a CUDA graph of max(copies, 8) launches, "
           "between two CUDA events, divided by its launches, so a launch's time includes the graph's gap before the "
           "next kernel (no PDL). Each launch reads the next of `copies` copies of the weights (at least "
           "240 MB in all; an H200's L2 is 50 MB) and, for the experts, %d new ids from device memory (scattered as "
           "a token's are; \"neighbouring\": adjacent in the slab, a new group each launch). The pure read "
           "has the kernel's grid, lanes per row and rows per warp, and 16-byte loads of every body chunk (with its "
           "block's meta) of the same rows, only XOR-folded; \"N tiles\": the kernel streams its rows through shared "
           "memory by bulk copies, N tiles of a row group a warp in flight (the decode step's way with MOE_CUDA_STREAM_MB), "
           "and its pure read copies the same tiles and folds a word of each row. check: worst |gpu - cpu| / sum |w x| over the rows "
           "(ffn_up: of h, the sums of gate and up carried through SwiGLU; ffn_down: of the residual's increment, on "
           "the GPU's own h); over %.0e the variant fails and is not timed. The launch chain times one run of the "
           "whole chain, divided by its launches (median of %d); the grid-barrier columns are one cooperative kernel "
           "doing the same links with every block resident, a barrier between links: fences around an atomic add "
           "and a spin, or a release add and acquire loads.\n",
           r->reps, TOP_K, LAB_TOLERANCE, r->reps);
    print_occupancy_warnings(r->gemv, r->n_gemv);
    print_occupancy_warnings(r->experts, r->n_experts);
}

static json_t *json_of_row(const lab_report *r, const lab_row *w) {
    json_t *o = json_pack("{s:s, s:s, s:f, s:f, s:s}", "type", w->type, "what", w->what, "bytes", w->t.bytes, "check",
                          isfinite(w->check) ? w->check : -1.0, "status", w->failed ? "FAIL" : "ok");
    if (w->failed) return o;
    const double k = gbps(w->t.bytes, w->t.us), rd = gbps(w->t.bytes, w->t.read_us);
    json_object_update_new(
        o, json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "us", w->t.us, "gbps", k,
                     "read_us", w->t.read_us, "read_gbps", rd, "fraction_of_read", rd > 0 ? k / rd : 0.0,
                     "fraction_of_bw", k / r->bw_median, "read_fraction_of_bw", rd / r->bw_median, "grid", w->t.grid,
                     "lanes", w->t.lanes, "blocks_per_sm", w->t.occupancy, "read_blocks_per_sm", w->t.read_occupancy,
                     "read_depth", w->t.depth, "copies", w->t.copies, "batch", w->t.batch));
    json_object_set_new(o, "stages", json_integer(w->t.stages));
    return o;
}

static json_t *json_of_rows(const lab_report *r, const lab_row *rows, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_of_row(r, &rows[i]));
    return a;
}

static void print_json(const lab_report *r) {
    json_t *chains = json_array();
    for (int i = 0; i < N_CHAINS; i++) {
        const chain_row *c = &r->chains[i];
        json_array_append_new(chains, json_pack("{s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "kernel", c->what,
                                                "blocks", c->blocks, "threads", c->threads, "launches", CHAIN_LAUNCHES,
                                                "plain_us", c->c.plain_us, "graph_us", c->c.graph_us, "graph_pdl_us",
                                                c->c.pdl_us, "grid_barrier_us", c->c.barrier_us,
                                                "acq_rel_barrier_us", c->c.acq_rel_barrier_us));
    }
    json_t *tops = json_array();
    for (int i = 0; i < N_TOPS; i++)
        json_array_append_new(tops, json_pack("{s:s, s:i, s:i, s:i, s:f}", "what", r->tops[i].what, "vocab", TOP_VOCAB,
                                              "top", r->tops[i].n, "penalised", r->tops[i].n_extra, "us",
                                              r->tops[i].us));
    json_t *codes = json_array();
    for (int i = 0; i < N_CODES; i++)
        json_array_append_new(codes, json_pack("{s:i, s:f, s:f}", "kb", r->codes[i].kb, "cold_us", r->codes[i].cold_us,
                                               "hot_us", r->codes[i].hot_us));
    json_t *stages = json_array();
    for (int i = 0; i < N_STAGES; i++) {
        const cuda_lab_stage *g = &r->stages[i];
        json_array_append_new(stages, json_pack("{s:s, s:s, s:i, s:s, s:f, s:f, s:f, s:f}", "input_of", stage_rows[i].what,
                                                "dot_type", quant_format_of(g->dot)->name, "values", g->n, "staged_as",
                                                stage_ways[g->how], "cold_us", g->cold_us, "cold_last_us",
                                                g->cold_last_us, "hot_us", g->hot_us, "hot_last_us", g->hot_last_us));
    }
    json_t *root = json_pack("{s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:o, s:o, s:o, s:o, s:o, s:o}", "device", r->device, "sms",
                             r->n_sm, "repetitions", r->reps, "read_bandwidth_gbps", r->bw_median,
                             "read_bandwidth_min", r->bw_min, "read_bandwidth_max", r->bw_max, "bandwidth_buffer_gib",
                             LAB_BW_GIB, "tolerance", LAB_TOLERANCE, "gemv", json_of_rows(r, r->gemv, r->n_gemv),
                             "experts", json_of_rows(r, r->experts, r->n_experts), "launch_chain", chains,
                             "sampling", tops, "code_fetch", codes, "staging", stages);
    json_dumpf(root, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    printf("\n");
    json_decref(root);
}

/* ------------------------------------------------------------ the runs */

static moe_status measure_bandwidth(lab_report *r, moe_error *err) {
    double runs[BW_RUNS];
    moe_status st = cuda_read_bandwidth((size_t)(LAB_BW_GIB * (double)(1ull << 30)), BW_RUNS, runs, err);
    if (st != MOE_OK) return st;
    r->bw_median = median_sort(runs, BW_RUNS);
    r->bw_min = runs[0];
    r->bw_max = runs[BW_RUNS - 1];
    return MOE_OK;
}

/* Mark a row failed (and count it) when its check is over the tolerance. */
static bool judge(lab_report *r, lab_row *w, double check) {
    w->check = check;
    w->failed = !(check <= LAB_TOLERANCE);
    r->failures += w->failed;
    return !w->failed;
}

static moe_status measure_gemv(lab_report *r, const weight_pool *pool, int shape, thread_pool *threads, uint64_t *rng,
                               moe_error *err) {
    const int rows = gemv_shapes[shape].rows, cols = gemv_shapes[shape].cols;
    const bool stream = gemv_shapes[shape].stream;
    if (stream && !cuda_test_gemv_streams(pool->type, cols)) return MOE_OK;
    lab_row *w = &r->gemv[r->n_gemv++];
    w->type = quant_format_of(pool->type)->name;
    snprintf(w->what, sizeof w->what, "%d x %d (%s)", rows, cols, gemv_shapes[shape].role);
    uint8_t *weights = pool_draw(pool, (int64_t)rows * cols, rng);
    if (!weights) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for %s %s", w->type, w->what);
    double check = 0;
    moe_status st = check_gemv(pool->type, rows, cols, weights, stream, threads, rng, &check, err);
    if (st == MOE_OK && judge(r, w, check))
        st = cuda_lab_gemv(pool->type, rows, cols, weights, r->reps, stream, &w->t, err);
    free(weights);
    return st;
}

/* A way to time the expert kernels besides the decode's own (Q4_K only):
 * neighbours, each launch's experts side by side in the slab rather than
 * scattered as a token's ids are (the addressing's cost: DRAM pages, TLB);
 * lanes_shift, fewer lanes a row than the decode picks (more rows a warp,
 * more loads a lane in flight). */
typedef struct expert_variant {
    bool neighbours;
    int lanes_shift;
} expert_variant;

/* The two expert kernels' rows. */
static moe_status measure_experts_as(lab_report *r, const weight_pool *pool, uint64_t *rng, expert_variant v,
                                     moe_error *err) {
    expert_weights ew = {pool->type, NULL, NULL, NULL, quant_row_bytes(pool->type, N_EMBD) * N_FF,
                         quant_row_bytes(pool->type, N_FF) * N_EMBD};
    lab_row *up = &r->experts[r->n_experts++], *down = &r->experts[r->n_experts++];
    up->type = down->type = quant_format_of(pool->type)->name;
    char how[40] = "";
    if (v.neighbours) snprintf(how, sizeof how, ", neighbouring experts");
    if (v.lanes_shift) snprintf(how, sizeof how, ", 1/%d of the lanes", 1 << v.lanes_shift);
    snprintf(up->what, sizeof up->what, "ffn_up (gate + up + SwiGLU)%s", how);
    snprintf(down->what, sizeof down->what, "ffn_down (weighted, + residual)%s", how);
    const int64_t values = (int64_t)N_EXPERTS * N_FF * N_EMBD;
    ew.gate = pool_draw(pool, values, rng);
    ew.up = pool_draw(pool, values, rng);
    ew.down = pool_draw(pool, values, rng);
    double check_h = 0, check_y = 0;
    moe_status st = ew.gate && ew.up && ew.down ? check_experts(&ew, v.lanes_shift, rng, &check_h, &check_y, err)
                                                : moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the experts");
    const bool up_ok = st == MOE_OK && judge(r, up, check_h), down_ok = st == MOE_OK && judge(r, down, check_y);
    if (up_ok && down_ok) /* one launch times both: a failure of either leaves both untimed */
        st = cuda_lab_experts(pool->type, N_EXPERTS, TOP_K, v.neighbours, v.lanes_shift, N_FF, N_EMBD, ew.gate, ew.up,
                              ew.down, r->reps, &up->t, &down->t, err);
    free(ew.gate), free(ew.up), free(ew.down);
    return st;
}

static moe_status measure_experts(lab_report *r, const weight_pool *pool, uint64_t *rng, moe_error *err) {
    const expert_variant q4_k[N_Q4K_VARIANTS] = {{true, 0}, {false, 1}, {false, 2}};
    moe_status st = measure_experts_as(r, pool, rng, (expert_variant){false, 0}, err);
    for (int i = 0; i < N_Q4K_VARIANTS && st == MOE_OK && pool->type == MOE_TYPE_Q4_K; i++)
        st = measure_experts_as(r, pool, rng, q4_k[i], err);
    return st;
}

static moe_status measure_chains(lab_report *r, moe_error *err) {
    const chain_row shapes[N_CHAINS] = {{"tiny", 1, 32, {0, 0, 0, 0, 0}},
                                        {"3 blocks per SM", 3 * r->n_sm, 256, {0, 0, 0, 0, 0}},
                                        {"1 block per SM (a persistent step's shape)", r->n_sm, 512, {0, 0, 0, 0, 0}}};
    for (int i = 0; i < N_CHAINS; i++) {
        r->chains[i] = shapes[i];
        moe_status st = cuda_lab_launch_chain(CHAIN_LAUNCHES, shapes[i].blocks, shapes[i].threads, r->reps,
                                              &r->chains[i].c, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static moe_status measure_codes(lab_report *r, moe_error *err) {
    const int kbs[N_CODES] = {4, 16, 64};
    for (int i = 0; i < N_CODES; i++) {
        moe_status st = cuda_lab_code_fetch(kbs[i], r->reps, &r->codes[i], err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static moe_status measure_stages(lab_report *r, moe_error *err) {
    for (int i = 0; i < N_STAGES; i++) {
        moe_status st = cuda_lab_staging(stage_rows[i].dot, stage_rows[i].how, stage_rows[i].n, r->reps, &r->stages[i], err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static moe_status measure_tops(lab_report *r, moe_error *err) {
    const top_row rows[N_TOPS] = {{"greedy", 1, 0, 0},
                                  {"top-k 40", 40, 0, 0},
                                  {"top-k 40, 64 tokens penalised", 104, 64, 0},
                                  {"top-k 512", 512, 0, 0},
                                  {"every logit", 0, 0, 0}};
    for (int i = 0; i < N_TOPS; i++) {
        r->tops[i] = rows[i];
        moe_status st = cuda_lab_top_logits(TOP_VOCAB, rows[i].n, rows[i].n_extra, r->reps, &r->tops[i].us, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* Every variant of one weight type: the three matrices, then the experts. */
static moe_status measure_type(lab_report *r, moe_type type, thread_pool *threads, progress *bar, uint64_t *rng,
                               moe_error *err) {
    weight_pool pool;
    if (!pool_make(&pool, type, rng)) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    moe_status st = MOE_OK;
    for (int s = 0; s < N_SHAPES && st == MOE_OK; s++) {
        st = measure_gemv(r, &pool, s, threads, rng, err);
        progress_add(bar, 1);
    }
    if (st == MOE_OK) st = measure_experts(r, &pool, rng, err);
    progress_add(bar, 1);
    free(pool.chunks);
    return st;
}

static int run_lab(const lab_args *a) {
    moe_error err = {0};
    lab_report *r = calloc(1, sizeof *r);
    thread_pool *threads = thread_pool_new(0);
    if (!r || !threads) {
        free(r), thread_pool_free(threads);
        return cli_fail("lab", &(moe_error){MOE_ERR_NOMEM, "out of memory"});
    }
    r->reps = a->reps;
    uint64_t rng = 0x243F6A8885A308D3ull;
    moe_status st = cuda_lab_device(r->device, sizeof r->device, &r->n_sm, &err);
    progress *bar = st == MOE_OK ? progress_start("moe lab", (uint64_t)a->n_types * (N_SHAPES + 1) + 3, 1, "steps") : NULL;
    if (st == MOE_OK) st = measure_bandwidth(r, &err);
    for (int t = 0; t < a->n_types && st == MOE_OK; t++) st = measure_type(r, a->types[t], threads, bar, &rng, &err);
    if (st == MOE_OK) st = measure_chains(r, &err);
    if (st == MOE_OK) st = measure_tops(r, &err);
    if (st == MOE_OK) st = measure_codes(r, &err);
    if (st == MOE_OK) st = measure_stages(r, &err);
    progress_add(bar, 3);
    progress_finish(bar);
    int status = st == MOE_OK ? 0 : cli_fail("lab", &err);
    if (status == 0) {
        if (a->json) print_json(r);
        else print_markdown(r);
        if (r->failures) {
            fprintf(stderr, "moe lab: %d variant(s) failed the check against the CPU (tolerance %.0e) and were not timed\n",
                    r->failures, LAB_TOLERANCE);
            status = 1;
        }
    }
    thread_pool_free(threads);
    free(r);
    return status;
}

#endif /* MOE_HAVE_CUDA */

/* ------------------------------------------------------------ the command */

static void print_help(void) {
    printf("usage: moe lab [--type T[,T...]] [-r REPS] [-o md|json]\n\n"
           "The kernel lab (needs a CUDA GPU): the decode step's matrix kernels at\n"
           "Qwen3-30B-A3B's shapes, each checked against the CPU first and then timed beside\n"
           "a pure read of the same bytes walked the same way, both as GB/s and as a\n"
           "fraction of the read bandwidth measured in the same run:\n"
           "  - gemv_kernel on 4096 x 2048, 2048 x 4096 and the 151936 x 2048 output head,\n"
           "    the head also with its rows streamed through shared memory by bulk\n"
           "    copies where the type's rows allow (the decode step's way with\n"
           "    MOE_CUDA_STREAM_MB=N: products of N MB or more);\n"
           "  - ffn_up and ffn_down on 128 experts (gate/up 768 x 2048, down 2048 x 768),\n"
           "    8 of them a launch by ids in device memory that change every launch\n"
           "    (for Q4_K also 8 experts adjacent in the slab, to weigh the addressing,\n"
           "    and a half and a quarter of the decode's lanes per row);\n"
           "  - a chain of 1000 dependent launches (1 x 32, 3 blocks per SM x 256 and\n"
           "    1 per SM x 512 threads): plain on a stream, as one graph, as a graph with\n"
           "    PDL, and as one resident kernel whose links are parted by grid barriers;\n"
           "  - sampling: the top 1, 40, 104 (64 penalised) and 512 of 151936 logits\n"
           "    brought to the host (cuda_top_logits), beside copying all of them;\n"
           "  - code fetch: one warp through 4, 16 and 64 KB of straight-line code with\n"
           "    L2 and the instruction caches cold (as each layer of the decode step\n"
           "    leaves them for the next) and hot;\n"
           "  - staging: one block an SM staging the decode step's activations (the\n"
           "    residual behind a norm as the matrix products and ffn_up stage it, the\n"
           "    attention's output, ffn_down's hidden states) as Q8_K, Q8_0 and f32,\n"
           "    beside the floor of their first loads and a barrier, cold and hot.\n"
           "Weights are copied on the GPU until the copies exceed four times its L2 and\n"
           "every launch reads the next copy, so the figures are DRAM's. A variant whose\n"
           "worst |gpu - cpu| / sum |w x| is over 1e-5 is marked FAIL, is not timed, and\n"
           "makes the exit status 1.\n\n"
           "  --type T[,T...]   weight types (default: all of them:\n"
           "                    q4_k q5_k q6_k q8_0 q4_0 q5_0 iq4_nl bf16 f16 f32)\n"
           "  -r, --reps R      timed batches per variant, median reported (default 20)\n"
           "  -o, --output F    md (default) or json\n"
           "  -h, --help        this text\n");
}

static bool is_lab_type(moe_type t) {
    for (int i = 0; i < N_LAB_TYPES; i++)
        if (lab_types[i] == t) return true;
    return false;
}

/* "q4_k,q8_0" into a->types; false (after a usage message) on a bad name. */
static bool parse_types(const char *list, lab_args *a) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    a->n_types = 0;
    char *save = NULL;
    for (char *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const quant_format *f = quant_format_by_name(name);
        if (!f || !is_lab_type(f->type)) {
            cli_usage_error("lab", "--type: '%s' is not one of q4_k q5_k q6_k q8_0 q4_0 q5_0 iq4_nl bf16 f16 f32", name);
            return false;
        }
        for (int i = 0; i < a->n_types; i++)
            if (a->types[i] == f->type) {
                cli_usage_error("lab", "--type: '%s' is listed twice", name);
                return false;
            }
        a->types[a->n_types++] = f->type;
    }
    if (a->n_types == 0) cli_usage_error("lab", "--type wants at least one type");
    return a->n_types > 0;
}

int cmd_lab(int argc, char **argv) {
    lab_args a = {.reps = 20};
    for (int i = 0; i < N_LAB_TYPES; i++) a.types[a.n_types++] = lab_types[i];
    static const struct option options[] = {
        {"type", required_argument, NULL, 'T'}, {"reps", required_argument, NULL, 'r'},
        {"output", required_argument, NULL, 'o'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    long v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:o:h", options, NULL)) != -1) {
        switch (c) {
        case 'T':
            if (!parse_types(optarg, &a)) return 2;
            break;
        case 'r':
            if (!cli_parse_int(optarg, 1, 1000, &v)) return cli_usage_error("lab", "-r wants 1..1000");
            a.reps = (int)v;
            break;
        case 'o':
            if (strcmp(optarg, "md") && strcmp(optarg, "json")) return cli_usage_error("lab", "-o wants md or json");
            a.json = strcmp(optarg, "json") == 0;
            break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("lab", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("lab", "unexpected argument '%s'", argv[optind]);
#ifdef MOE_HAVE_CUDA
    if (!cuda_available())
        return cli_fail("lab", &(moe_error){MOE_ERR_UNSUPPORTED, "no CUDA GPU found: the kernel lab measures a GPU"});
    return run_lab(&a);
#else
    return cli_fail("lab", &(moe_error){MOE_ERR_UNSUPPORTED, "this build of moe.c has no CUDA backend: the kernel lab "
                                                             "measures a GPU"});
#endif
}
