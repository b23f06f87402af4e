/*
 * lab.cu — the kernel lab behind `moe lab`: the decode step's matrix
 * kernels timed on real shapes beside a pure read of the very same bytes,
 * and the cost of a chain of dependent launches.
 *
 * Why: a kernel's GB/s alone does not say what holds it back. The
 * pure-read kernels here walk a matrix the way the production kernel does
 * (the same grid of 256-thread blocks, the same lanes per row and rows per
 * warp, the same row loop, 16-byte loads of every body chunk of the rows it
 * visits, each with its block's meta where the format has one, at least as
 * many loads in flight per lane) but only XOR-fold what they load. The gap
 * between the two is the kernel's own cost (activation staging, arithmetic,
 * reductions); the gap between the read and the large-buffer bandwidth is
 * what the shape and the walk cost.
 *
 * Measuring DRAM, not L2: the weights are uploaded once through upload_rows
 * (the model's path, so the device layout is the production one) and copied
 * on the device until the copies hold at least LAB_SET_BYTES (4 x 60 MB;
 * the H200's L2 is 50 MB); launch i uses copy i mod copies. A timed run is
 * one replay of a CUDA graph of a batch of launches between two CUDA
 * events, divided by the launches, so a launch's time includes the gap
 * between kernels that the decode step's graph (without PDL) pays, and no
 * host launch overhead. Expert ids change every
 * launch (consecutive slices of shuffled permutations: distinct within a
 * launch, and no expert repeats in the launches just before) and are read
 * by the kernels from device memory.
 *
 * The launch chain: N launches of a kernel that reads what the previous
 * launch wrote, plain on a stream, replayed as one graph, and with
 * programmatic dependent launch inside a graph; then the same N links in
 * one cooperative kernel, parted by grid barriers. The last value written
 * proves the chain ran in order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cuda/kernels.cuh"

extern "C" {
#include "common/clock.h"
#include "common/median.h"
#include "cuda/cuda_backend.h"
#include "quant/quant.h"
}

enum { LAB_MIN_BATCH = 8, LAB_MAX_ALLOCS = 8 };
enum { KERNEL_GEMV, KERNEL_UP, KERNEL_DOWN }; /* as cuda_format.occupancy numbers them */
static const double LAB_SET_BYTES = 240e6;     /* 4 x 60 MB of copies: four times an H200's L2, and then some */
static const unsigned LAB_SENTINEL = 0x2545f491u; /* what a fold is never expected to equal */

/* ---------------------------------------------------------------- pure reads */

/* How a pure read walks a matrix: the production launch's lanes per row,
 * the 16-byte loads a lane keeps in flight (per matrix, for gate and up),
 * and the block geometry that maps a body chunk to its block's meta. */
struct read_plan {
    int lanes, depth;
    int chunks;     /* 16-byte body chunks of a row */
    int block_body; /* body bytes of a block */
    int meta;       /* meta bytes of a block: 0, 2 or 8 */
    unsigned *sink;
};

struct chunk {
    uint4 q;
    unsigned meta;
};

/* Chunk c of a row and, as the production loads do per unit, its block's
 * meta (at meta_off in the row's meta). */
__device__ __forceinline__ chunk load_chunk(const uint8_t *body_row, const uint8_t *meta_row, int c, int meta_off,
                                            const read_plan &p) {
    chunk k;
    k.q = ldg16(body_row + 16 * c);
    k.meta = 0;
    if (p.meta == 8) {
        const uint2 v = ldg8(meta_row + meta_off);
        k.meta = v.x ^ v.y;
    } else if (p.meta) {
        k.meta = ldg_u16(meta_row + meta_off);
    }
    return k;
}

__device__ __forceinline__ int meta_offset(int c, const read_plan &p) { return 16 * c / p.block_body * p.meta; }

__device__ __forceinline__ unsigned fold(const chunk &k) { return k.q.x ^ k.q.y ^ k.q.z ^ k.q.w ^ k.meta; }

/* What lane `sub` loads of row `row` of T experts (ids[j]; expert 0 when
 * ids is NULL), flattened into one stream of chunks as dot_terms flattens
 * units: D loads issued before the first is folded. */
template <int D>
__device__ __forceinline__ unsigned fold_terms(const dmat &m, int row, int T, const int *ids, const read_plan &p,
                                               int sub) {
    const int C = p.chunks, total = T * C;
    unsigned acc = 0;
    for (int t0 = sub; t0 < total; t0 += p.lanes * D) {
        chunk k[D];
#pragma unroll
        for (int i = 0; i < D; i++) {
            const int t = t0 + i * p.lanes;
            k[i] = chunk{uint4{0, 0, 0, 0}, 0};
            if (t < total) {
                const int j = t / C, e = ids ? ids[j] : 0;
                const int c = t - j * C;
                k[i] = load_chunk(m.body + e * m.expert_stride + (int64_t)row * m.row_stride,
                                  m.meta + e * m.meta_expert_stride + (int64_t)row * m.meta_row_stride, c,
                                  meta_offset(c, p), p);
            }
        }
#pragma unroll
        for (int i = 0; i < D; i++) acc ^= fold(k[i]);
    }
    return acc;
}

/* The gate and up rows of one FFN row, their loads issued together as
 * dot_units_pair issues them: D from each. */
template <int D>
__device__ __forceinline__ unsigned fold_pair(const uint8_t *gate_body, const uint8_t *gate_meta, const uint8_t *up_body,
                                              const uint8_t *up_meta, const read_plan &p, int sub) {
    unsigned acc = 0;
    for (int c0 = sub; c0 < p.chunks; c0 += p.lanes * D) {
        chunk g[D], u[D];
#pragma unroll
        for (int i = 0; i < D; i++) {
            const int c = c0 + i * p.lanes;
            g[i] = u[i] = chunk{uint4{0, 0, 0, 0}, 0};
            if (c < p.chunks) {
                const int meta_off = meta_offset(c, p);
                g[i] = load_chunk(gate_body, gate_meta, c, meta_off, p);
                u[i] = load_chunk(up_body, up_meta, c, meta_off, p);
            }
        }
#pragma unroll
        for (int i = 0; i < D; i++) acc ^= fold(g[i]) ^ fold(u[i]);
    }
    return acc;
}

/* gemv_kernel's walk over the rows of m, reading only. */
template <int D>
__global__ void __launch_bounds__(GEMV_THREADS) read_gemv_kernel(const dmat m, const read_plan p) {
    const int L = p.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    unsigned acc = 0;
    for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < m.rows; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        if (row < m.rows) acc ^= fold_terms<D>(m, row, 1, NULL, p, sub);
    }
    if (acc == LAB_SENTINEL) *p.sink = acc;
}

/* gemv_kernel's streamed rows (ROWS_STREAM): the same bulk copies, tile
 * by tile, and a word of each row folded. */
__global__ void __launch_bounds__(GEMV_THREADS) read_stream_kernel(const gemv_args a, int act, unsigned *sink) {
    DYN_SMEM(uint8_t, smem);
    row_stream stream(a, smem, act);
    __syncthreads(); /* the stages' barriers initialised */
    const int r = threadIdx.x % stream.rows_per_tile;
    unsigned acc = 0;
    for (int i = 0; i < stream.n; i++) {
        const int row = stream.wait(i) + r;
        if (row < stream.total) acc ^= *(const unsigned *)stream.body(i, r);
        stream.release(i);
    }
    if (acc == LAB_SENTINEL) *sink = acc;
}

/* ffn_up_kernel's walk: row j * R + r is row r of the gate and up of expert ids[j]. */
template <int D>
__global__ void __launch_bounds__(GEMV_THREADS) read_up_kernel(const dmat gate, const dmat up, const int *ids,
                                                               int n_routed, const read_plan p) {
    const int L = p.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int R = gate.rows, total = n_routed * R;
    unsigned acc = 0;
    for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < total; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        if (row >= total) continue;
        const int j = row / R, r = row - j * R, e = ids[j];
        acc ^= fold_pair<D>(gate.body + e * gate.expert_stride + (int64_t)r * gate.row_stride,
                         gate.meta + e * gate.meta_expert_stride + (int64_t)r * gate.meta_row_stride,
                         up.body + e * up.expert_stride + (int64_t)r * up.row_stride,
                         up.meta + e * up.meta_expert_stride + (int64_t)r * up.meta_row_stride, p, sub);
    }
    if (acc == LAB_SENTINEL) *p.sink = acc;
}

/* ffn_down_kernel's walk: output row r reads row r of the n_routed experts. */
template <int D>
__global__ void __launch_bounds__(GEMV_THREADS) read_down_kernel(const dmat down, const int *ids, int n_routed,
                                                                 const read_plan p) {
    __shared__ int expert[MAX_EXPERTS_USED];
    const int L = p.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    if ((int)threadIdx.x < n_routed) expert[threadIdx.x] = ids[threadIdx.x];
    __syncthreads();
    unsigned acc = 0;
    for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < down.rows; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        if (row < down.rows) acc ^= fold_terms<D>(down, row, n_routed, expert, p, sub);
    }
    if (acc == LAB_SENTINEL) *p.sink = acc;
}

/* Loads in flight per lane: at least the distinct 16-byte chunks of the
 * `units` units a production lane has in flight (a unit is a block's body /
 * units bytes), rounded up to 2, 4 or 8, the depths the read kernels are
 * compiled for (so their registers, and with them their occupancy, follow
 * the depth instead of the largest one). */
static read_plan plan_for(const cuda_format *f, const dmat &m, int lanes, int units, unsigned *sink) {
    read_plan p;
    p.lanes = lanes;
    p.chunks = (int)(m.row_stride / 16);
    p.block_body = f->body;
    p.meta = f->meta;
    const int depth = (units * f->body + 16 * f->units - 1) / (16 * f->units);
    p.depth = depth <= 2 ? 2 : depth <= 4 ? 4 : 8;
    p.sink = sink;
    return p;
}

/* Calls launch(std::integral_constant<int, D>) for the plan's depth D. */
template <class Launch>
static void with_depth(const read_plan &p, Launch launch) {
    if (p.depth == 2) launch(std::integral_constant<int, 2>());
    else if (p.depth == 4) launch(std::integral_constant<int, 4>());
    else launch(std::integral_constant<int, 8>());
}

/* ---------------------------------------------------------------- the lab's device state */

/* What one measurement needs; lab_close releases all of it. */
struct lab_ctx {
    int n_sm;
    size_t smem_optin;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    unsigned *sink;
    void *allocs[LAB_MAX_ALLOCS];
    int n_allocs;
    moe_error *err;
};

static moe_status lab_alloc(lab_ctx *c, void **p, size_t bytes) {
    moe_error *err = c->err;
    if (c->n_allocs == LAB_MAX_ALLOCS) return moe_error_set(err, MOE_ERR_NOMEM, "lab: too many device buffers");
    CUDA_CHECK(cudaMalloc(p, bytes));
    c->allocs[c->n_allocs++] = *p;
    return MOE_OK;
}

static moe_status lab_open(lab_ctx *c, moe_error *err) {
    memset(c, 0, sizeof *c);
    c->err = err;
    if (!cuda_available()) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA GPU found");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    c->n_sm = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&c->start));
    CUDA_CHECK(cudaEventCreate(&c->stop));
    return lab_alloc(c, (void **)&c->sink, sizeof(unsigned));
}

static void lab_close(lab_ctx *c) {
    cudaDeviceSynchronize();
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    if (c->start) cudaEventDestroy(c->start);
    if (c->stop) cudaEventDestroy(c->stop);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
}

static uint64_t lab_rand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* n floats value(0), value(1), ... uploaded to a new device buffer. */
template <class Value>
static moe_status upload_values(lab_ctx *c, float **out, int n, Value value) {
    moe_error *err = c->err;
    float *host = (float *)malloc((size_t)n * sizeof(float));
    if (!host) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) host[i] = value(i);
    moe_status st = lab_alloc(c, (void **)out, (size_t)n * sizeof(float));
    cudaError_t e = st == MOE_OK ? cudaMemcpy(*out, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice) : cudaSuccess;
    free(host);
    if (st != MOE_OK) return st;
    CUDA_CHECK(e);
    return MOE_OK;
}

/* n floats in [-1, 1): the kernels' input. */
static moe_status upload_input(lab_ctx *c, float **out, int n, uint64_t seed) {
    return upload_values(c, out, n, [&](int) { return (float)((lab_rand(&seed) >> 40) * (2.0 / 16777216.0) - 1.0); });
}

/* ---------------------------------------------------------------- weights, in copies */

/* GGUF rows of n_experts matrices back to back (one matrix: n_experts 1). */
struct host_mat {
    int type, n_experts;
    int64_t rows, cols;
    const uint8_t *data;
};

/* The copies of everything one upload placed: copy i at base + i * stride. */
struct weight_copies {
    uint8_t *base;
    size_t stride;
    int n;
};

/* Launches per timed batch: one round of the copies, and enough to time. */
static int batch_of(const weight_copies &w) { return w.n > LAB_MIN_BATCH ? w.n : LAB_MIN_BATCH; }

static dmat on_copy(dmat m, const weight_copies &w, int i) {
    const size_t off = (size_t)i * w.stride;
    m.body += off;
    if (m.meta) m.meta += off;
    return m;
}

/* One pass of upload_rows over the matrices (dry: only adds up bytes). */
static moe_status upload_pass(uploader *u, const host_mat *mats, int n, dmat *out) {
    for (int i = 0; i < n; i++) {
        const size_t bytes = quant_row_bytes((moe_type)mats[i].type, mats[i].cols) * (size_t)mats[i].rows;
        const uint8_t **srcs = (const uint8_t **)malloc((size_t)mats[i].n_experts * sizeof *srcs);
        if (!srcs) return u->status = moe_error_set(u->err, MOE_ERR_NOMEM, "out of memory");
        for (int e = 0; e < mats[i].n_experts; e++) srcs[e] = mats[i].data + (size_t)e * bytes;
        moe_status st = upload_rows(u, mats[i].type, mats[i].n_experts, srcs, mats[i].rows, mats[i].cols, "lab", &out[i]);
        free(srcs);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* Upload the matrices once the model's way, then copy them on the device
 * until the copies hold LAB_SET_BYTES; out[] describes copy 0. */
static moe_status upload_copies(lab_ctx *c, const host_mat *mats, int n, dmat *out, weight_copies *w) {
    moe_error *err = c->err;
    uploader u;
    memset(&u, 0, sizeof u);
    u.err = err;
    u.dry = true;
    if (upload_pass(&u, mats, n, out) != MOE_OK) return u.status;
    w->stride = (u.used + 255) & ~(size_t)255;
    w->n = (int)ceil(LAB_SET_BYTES / (double)w->stride);
    if (w->n < 1) w->n = 1;
    moe_status st = lab_alloc(c, (void **)&w->base, w->stride * w->n);
    if (st != MOE_OK) return st;
    u.dry = false;
    u.used = 0;
    u.base = w->base;
    u.staging_bytes = (size_t)64 << 20;
    u.staging = (uint8_t *)malloc(u.staging_bytes);
    if (!u.staging) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    st = upload_pass(&u, mats, n, out);
    free(u.staging);
    if (st != MOE_OK) return st;
    for (int i = 1; i < w->n; i++)
        CUDA_CHECK(cudaMemcpy(w->base + (size_t)i * w->stride, w->base, w->stride, cudaMemcpyDeviceToDevice));
    return MOE_OK;
}

static double dmat_bytes(const dmat &m) { return (double)m.rows * (double)(m.row_stride + m.meta_row_stride); }

/* ---------------------------------------------------------------- timing */

/* The production launch's grid, as cuda_forward.cu sizes it (gemv_grid). */
static int grid_for(const lab_ctx *c, const cuda_format *f, int kernel, size_t smem, int rows, int lanes) {
    return gemv_grid(c->n_sm, f->occupancy(kernel, smem), rows, lanes, c->n_sm * 32);
}

/* Median microseconds per launch over `reps` replays of a CUDA graph of
 * `batch` launches (as the decode step runs them: no host launch gaps),
 * after one warm-up replay. launch(i) enqueues launch number i, so the
 * copy and the ids change from launch to launch. */
template <class Launch>
static moe_status time_batches(lab_ctx *c, int batch, int reps, Launch launch, double *median_us) {
    moe_error *err = c->err;
    double per[CUDA_LAB_MAX_REPS];
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < batch; i++) launch(i);
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    for (int r = -1; r < reps && e == cudaSuccess; r++) {
        float ms = 0;
        if ((e = cudaEventRecord(c->start, c->stream)) == cudaSuccess && (e = cudaGraphLaunch(exec, c->stream)) == cudaSuccess &&
            (e = cudaEventRecord(c->stop, c->stream)) == cudaSuccess && (e = cudaEventSynchronize(c->stop)) == cudaSuccess)
            e = cudaEventElapsedTime(&ms, c->start, c->stop);
        if (r >= 0) per[r] = ms * 1e3 / batch;
    }
    cudaGraphExecDestroy(exec);
    CUDA_CHECK(e);
    *median_us = median_sort(per, reps);
    return MOE_OK;
}

/* Blocks per SM of the pure read of `kernel` at the plan's depth: the
 * comparison is fair only when it is at least the production kernel's. */
static int read_occupancy(const read_plan &p, int kernel) {
    int n = 0;
    with_depth(p, [&](auto d) {
        constexpr int D = decltype(d)::value;
        cudaError_t e = kernel == KERNEL_GEMV ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, read_gemv_kernel<D>, GEMV_THREADS, 0)
                        : kernel == KERNEL_UP ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, read_up_kernel<D>, GEMV_THREADS, 0)
                                              : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, read_down_kernel<D>, GEMV_THREADS, 0);
        if (e != cudaSuccess) n = 0;
    });
    return n;
}

/* The production launch and its pure read, as the record reports them. */
static void describe(cuda_lab_timing *out, const cuda_format *f, int kernel, size_t smem, int grid, int lanes,
                     const read_plan &p, const weight_copies &wc, double bytes) {
    out->bytes = bytes;
    out->grid = grid;
    out->lanes = lanes;
    out->occupancy = f->occupancy(kernel, smem);
    out->read_occupancy = read_occupancy(p, kernel);
    out->depth = p.depth;
    out->copies = wc.n;
    out->batch = batch_of(wc);
}

static moe_status check_reps(int reps, moe_error *err) {
    if (reps < 1 || reps > CUDA_LAB_MAX_REPS)
        return moe_error_set(err, MOE_ERR_RANGE, "repetitions must be 1..%d, not %d", CUDA_LAB_MAX_REPS, reps);
    return MOE_OK;
}

/* ---------------------------------------------------------------- gemv */

static moe_status lab_gemv(lab_ctx *c, const cuda_format *f, int rows, int cols, const void *w, int reps, bool stream,
                           cuda_lab_timing *out) {
    moe_error *err = c->err;
    const host_mat hm = {f->type, 1, rows, cols, (const uint8_t *)w};
    dmat m;
    weight_copies wc;
    float *x = NULL, *y = NULL;
    moe_status st = upload_copies(c, &hm, 1, &m, &wc);
    if (st == MOE_OK) st = upload_input(c, &x, cols, 0x9e3779b97f4a7c15ull);
    if (st == MOE_OK) st = lab_alloc(c, (void **)&y, (size_t)rows * sizeof(float));
    if (st != MOE_OK) return st;
    /* as cuda_forward.cu's gemv(): one segment, no norm, no epilogue */
    gemv_args a;
    memset(&a, 0, sizeof a);
    a.in = act_in{x, NULL, 0.0f, cols};
    a.seg[0].out = y;
    a.n_seg = 1;
    a.seg_end[0] = rows;
    a.lanes = pick_lanes(m.units, f->n);
    a.epilogue = EPI_NONE;
    size_t smem = gemv_smem(f->act, cols);
    int grid;
    /* the rows streamed as cuda_forward.cu's gemv() streams them */
    a.stages = stream ? gemv_stream_stages(m, a.lanes, f->n, f->act, c->smem_optin, 0) : 0;
    if (stream && !a.stages) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "lab: %s rows cannot stream", f->name);
    if (a.stages) {
        gemv_stream_launch(m, a.lanes, f->act, a.stages, c->n_sm, &smem, &grid);
        CUDA_CHECK(cudaFuncSetAttribute(read_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CHECK(cuda_allow_stream_smem(c->smem_optin));
    } else {
        grid = grid_for(c, f, KERNEL_GEMV, smem, rows, a.lanes);
        CUDA_CHECK(cuda_allow_smem_all(smem > 48 * 1024 ? (int)smem : 48 * 1024));
    }
    const read_plan p = plan_for(f, m, a.lanes, f->n, c->sink);
    describe(out, f, KERNEL_GEMV, smem, grid, a.lanes, p, wc, dmat_bytes(m));
    out->stages = a.stages;
    st = time_batches(c, out->batch, reps, [&](int i) {
        a.seg[0].w = on_copy(m, wc, i % wc.n);
        f->gemv(&a, grid, smem, c->stream, false);
    }, &out->us);
    if (st != MOE_OK) return st;
    return time_batches(c, out->batch, reps, [&](int i) {
        a.seg[0].w = on_copy(m, wc, i % wc.n);
        if (a.stages) LAUNCH_PDL(false, read_stream_kernel, grid, GEMV_THREADS, smem, c->stream, a, f->act, c->sink);
        else
            with_depth(p, [&](auto d) {
                LAUNCH_PDL(false, read_gemv_kernel<decltype(d)::value>, grid, GEMV_THREADS, 0, c->stream, a.seg[0].w, p);
            });
    }, &out->read_us);
}

moe_status cuda_lab_gemv(moe_type type, int rows, int cols, const void *w, int reps, bool stream, cuda_lab_timing *out,
                         moe_error *err) {
    memset(out, 0, sizeof *out);
    const cuda_format *f = cuda_format_of(type);
    if (!f) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d", (int)type);
    if (check_reps(reps, err) != MOE_OK) return MOE_ERR_RANGE;
    lab_ctx c;
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK) st = lab_gemv(&c, f, rows, cols, w, reps, stream, out);
    lab_close(&c);
    return st;
}

/* ---------------------------------------------------------------- routed experts */

/* Expert ids of n launches, k each: consecutive k-slices of shuffled
 * permutations of 0..n_experts-1, or (neighbours) of 0..n_experts-1 in
 * order, so that a launch's experts lie side by side in the slab. */
static void expert_sequence(int *ids, int *perm, int n_launches, int k, int n_experts, bool neighbours, uint64_t seed) {
    const int slices = n_experts / k;
    int used = slices;
    for (int i = 0; i < n_experts; i++) perm[i] = i;
    for (int l = 0; l < n_launches; l++) {
        if (used == slices) {
            for (int i = n_experts - 1; i > 0 && !neighbours; i--) {
                int j = (int)(lab_rand(&seed) % (uint64_t)(i + 1)), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            used = 0;
        }
        memcpy(ids + (size_t)l * k, perm + (size_t)used++ * k, (size_t)k * sizeof(int));
    }
}

/* Device ids of n_launches launches (see expert_sequence). */
static moe_status upload_ids(lab_ctx *c, int **out, int n_launches, int k, int n_experts, bool neighbours) {
    moe_error *err = c->err;
    int *ids = (int *)malloc((size_t)n_launches * k * sizeof(int)), *perm = (int *)malloc((size_t)n_experts * sizeof(int));
    moe_status st = ids && perm ? lab_alloc(c, (void **)out, (size_t)n_launches * k * sizeof(int))
                                : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaSuccess;
    if (st == MOE_OK) {
        expert_sequence(ids, perm, n_launches, k, n_experts, neighbours, 0x5851f42d4c957f2dull);
        e = cudaMemcpy(*out, ids, (size_t)n_launches * k * sizeof(int), cudaMemcpyHostToDevice);
    }
    free(ids);
    free(perm);
    if (st != MOE_OK) return st;
    CUDA_CHECK(e);
    return MOE_OK;
}

/* The routed-expert shape and its device buffers. */
struct expert_run {
    const cuda_format *f;
    int k, n_ff, n_embd, reps, lanes_shift;
    dmat gate, up, down;
    weight_copies wc;
    const int *ids; /* k per launch */
    float *x, *h, *route_w, *residual;
};

/* ffn_up as cuda_forward.cu's ffn_up() launches it, routed experts only. */
static moe_status time_up(lab_ctx *c, const expert_run &r, cuda_lab_timing *out) {
    const cuda_format *f = r.f;
    ffn_up_args a;
    memset(&a, 0, sizeof a);
    a.in = act_in{r.x, NULL, 0.0f, r.n_embd};
    a.n_routed = r.k;
    a.h = r.h;
    a.h_shared_off = r.k * r.n_ff;
    a.lanes = up_lanes(f, r.gate.units, r.lanes_shift);
    const size_t smem = gemv_smem(f->act, r.n_embd);
    const int grid = grid_for(c, f, KERNEL_UP, smem, r.k * r.n_ff, a.lanes);
    const read_plan p = plan_for(f, r.gate, a.lanes, up_units(f), c->sink);
    describe(out, f, KERNEL_UP, smem, grid, a.lanes, p, r.wc, r.k * (dmat_bytes(r.gate) + dmat_bytes(r.up)));
    moe_status st = time_batches(c, out->batch, r.reps, [&](int i) {
        a.gate = on_copy(r.gate, r.wc, i % r.wc.n);
        a.up = on_copy(r.up, r.wc, i % r.wc.n);
        a.ids = r.ids + (size_t)i * r.k;
        f->up(&a, grid, smem, c->stream, false);
    }, &out->us);
    if (st != MOE_OK) return st;
    const int k = r.k;
    return time_batches(c, out->batch, r.reps, [&](int i) {
        with_depth(p, [&](auto d) {
            LAUNCH_PDL(false, read_up_kernel<decltype(d)::value>, grid, GEMV_THREADS, 0, c->stream,
                       on_copy(r.gate, r.wc, i % r.wc.n), on_copy(r.up, r.wc, i % r.wc.n), r.ids + (size_t)i * k, k, p);
        });
    }, &out->read_us);
}

/* ffn_down as cuda_forward.cu's ffn_down() launches it, routed experts only. */
static moe_status time_down(lab_ctx *c, const expert_run &r, cuda_lab_timing *out) {
    const cuda_format *f = r.f;
    ffn_down_args a;
    memset(&a, 0, sizeof a);
    a.in = act_in{r.h, NULL, 0.0f, r.k * r.n_ff};
    a.n_routed = r.k;
    a.route_w = r.route_w;
    a.routed_act_stride = r.n_ff;
    a.x = r.residual;
    a.lanes = down_lanes(f, r.k * r.down.units, r.lanes_shift);
    const size_t smem = gemv_smem(f->act, r.k * r.n_ff);
    const int grid = grid_for(c, f, KERNEL_DOWN, smem, r.n_embd, a.lanes);
    const read_plan p = plan_for(f, r.down, a.lanes, f->n, c->sink);
    describe(out, f, KERNEL_DOWN, smem, grid, a.lanes, p, r.wc, r.k * dmat_bytes(r.down));
    moe_status st = time_batches(c, out->batch, r.reps, [&](int i) {
        a.down = on_copy(r.down, r.wc, i % r.wc.n);
        a.ids = r.ids + (size_t)i * r.k;
        f->down(&a, grid, smem, c->stream, false);
    }, &out->us);
    if (st != MOE_OK) return st;
    const int k = r.k;
    return time_batches(c, out->batch, r.reps, [&](int i) {
        with_depth(p, [&](auto d) {
            LAUNCH_PDL(false, read_down_kernel<decltype(d)::value>, grid, GEMV_THREADS, 0, c->stream,
                       on_copy(r.down, r.wc, i % r.wc.n), r.ids + (size_t)i * k, k, p);
        });
    }, &out->read_us);
}

static moe_status lab_experts(lab_ctx *c, expert_run *r, int n_experts, bool neighbours, const void *gate,
                              const void *up, const void *down, cuda_lab_timing *up_out, cuda_lab_timing *down_out) {
    moe_error *err = c->err;
    const int t = r->f->type;
    const host_mat mats[3] = {{t, n_experts, r->n_ff, r->n_embd, (const uint8_t *)gate},
                              {t, n_experts, r->n_ff, r->n_embd, (const uint8_t *)up},
                              {t, n_experts, r->n_embd, r->n_ff, (const uint8_t *)down}};
    dmat m[3];
    int *ids = NULL;
    moe_status st = upload_copies(c, mats, 3, m, &r->wc);
    if (st != MOE_OK) return st;
    r->gate = m[0], r->up = m[1], r->down = m[2];
    if ((st = upload_ids(c, &ids, (r->reps + 1) * batch_of(r->wc), r->k, n_experts, neighbours)) != MOE_OK) return st;
    r->ids = ids;
    if ((st = upload_input(c, &r->x, r->n_embd, 0x2545f4914f6cdd1dull)) != MOE_OK ||
        (st = upload_input(c, &r->route_w, r->k, 0xda942042e4dd58b5ull)) != MOE_OK ||
        (st = lab_alloc(c, (void **)&r->h, (size_t)r->k * r->n_ff * sizeof(float))) != MOE_OK ||
        (st = lab_alloc(c, (void **)&r->residual, (size_t)r->n_embd * sizeof(float))) != MOE_OK)
        return st;
    CUDA_CHECK(cudaMemset(r->residual, 0, (size_t)r->n_embd * sizeof(float)));
    const size_t smem = gemv_smem(r->f->act, r->k * r->n_ff > r->n_embd ? r->k * r->n_ff : r->n_embd);
    CUDA_CHECK(cuda_allow_smem_all(smem > 48 * 1024 ? (int)smem : 48 * 1024));
    if ((st = time_up(c, *r, up_out)) != MOE_OK) return st; /* also leaves h finite for down */
    return time_down(c, *r, down_out);
}

moe_status cuda_lab_experts(moe_type type, int n_experts, int k, bool neighbours, int lanes_shift, int n_ff, int n_embd,
                            const void *gate, const void *up, const void *down, int reps, cuda_lab_timing *up_out,
                            cuda_lab_timing *down_out, moe_error *err) {
    memset(up_out, 0, sizeof *up_out);
    memset(down_out, 0, sizeof *down_out);
    const cuda_format *f = cuda_format_of(type);
    if (!f) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d", (int)type);
    if (check_reps(reps, err) != MOE_OK) return MOE_ERR_RANGE;
    if (k < 1 || k > MAX_EXPERTS_USED || k > n_experts)
        return moe_error_set(err, MOE_ERR_RANGE, "%d experts a token of %d (at most %d)", k, n_experts, MAX_EXPERTS_USED);
    expert_run r;
    memset(&r, 0, sizeof r);
    r.f = f, r.k = k, r.n_ff = n_ff, r.n_embd = n_embd, r.reps = reps, r.lanes_shift = lanes_shift;
    lab_ctx c;
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK) st = lab_experts(&c, &r, n_experts, neighbours, gate, up, down, up_out, down_out);
    lab_close(&c);
    return st;
}

/* ---------------------------------------------------------------- launch chains */

/* One link: reads what the previous link wrote (cells[from]) and writes
 * the next value to cells[from ^ 1]. Every thread reads; one writes. */
__global__ void chain_kernel(int *cells, int from) {
    pdl_wait();
    pdl_launch_dependents();
    const int v = __ldcg(cells + from);
    if (blockIdx.x == 0 && threadIdx.x == 0) cells[from ^ 1] = v + 1;
    else if (v < 0) cells[2] = v; /* never (the values count up from 0): keeps every thread's read */
}

static void enqueue_chain(const lab_ctx *c, int *cells, int launches, int blocks, int threads, bool pdl) {
    for (int i = 0; i < launches; i++) {
        if (pdl) {
            LAUNCH_PDL(true, chain_kernel, blocks, threads, 0, c->stream, cells, i & 1);
        } else {
            LAUNCH(chain_kernel, blocks, threads, 0, c->stream, cells, i & 1);
        }
    }
}

/* The same chain inside one kernel whose blocks are all resident (a
 * cooperative launch): the links are parted by grid-wide barriers instead
 * of launches, what a persistent decode step would pay per phase. The
 * arrival count only grows: barrier i waits for (i + 1) x blocks. Two
 * barriers: FENCED, full fences around a relaxed atomic and a volatile
 * spin; ACQ_REL, one release reduction and acquire loads (PTX's memory
 * model: the block barrier before it orders the block's writes, the
 * release makes them visible with the arrival, no fence instruction). */
enum { BARRIER_FENCED, BARRIER_ACQ_REL };

template <int KIND>
__device__ __forceinline__ void grid_barrier(unsigned *arrived, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (KIND == BARRIER_FENCED) {
            __threadfence();
            atomicAdd(arrived, 1u);
            while (*(volatile unsigned *)arrived < target) {
            }
            __threadfence();
        } else {
            add_release_gpu(arrived, 1u);
            while (load_acquire_gpu(arrived) < target) {
            }
        }
    }
    __syncthreads();
}

template <int KIND>
__global__ void barrier_chain_kernel(int *cells, unsigned *arrived, int links) {
    for (int i = 0; i < links; i++) {
        const int v = __ldcg(cells + (i & 1));
        if (blockIdx.x == 0 && threadIdx.x == 0) cells[(i & 1) ^ 1] = v + 1;
        else if (v < 0) cells[2] = v; /* never: keeps every thread's read */
        grid_barrier<KIND>(arrived, (unsigned)(i + 1) * gridDim.x);
    }
}

enum { CHAIN_PLAIN, CHAIN_GRAPH, CHAIN_GRAPH_PDL, CHAIN_BARRIER, CHAIN_BARRIER_ACQ_REL };

/* The barrier chain needs every block resident at once, and a GPU: the
 * simulator runs blocks one after another (the lab does not run there). */
static moe_status check_resident(lab_ctx *c, int blocks, int threads) {
#ifdef MOE_CUDA_SIM
    (void)blocks, (void)threads;
    return moe_error_set(c->err, MOE_ERR_UNSUPPORTED, "grid barriers need a GPU");
#else
    moe_error *err = c->err;
    int per_sm = 0, cooperative = 0, n_sm = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_chain_kernel<BARRIER_FENCED>, threads, 0));
    if (!cooperative || blocks > per_sm * n_sm)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "%d blocks of %d threads cannot all be resident", blocks, threads);
    return MOE_OK;
#endif
}

/* One run of the whole chain, the way `how` says (exec: its graph). */
static cudaError_t launch_chain(lab_ctx *c, int *cells, int how, cudaGraphExec_t exec, int links, int blocks,
                                int threads) {
    if (how == CHAIN_GRAPH || how == CHAIN_GRAPH_PDL) return cudaGraphLaunch(exec, c->stream);
    if (how == CHAIN_PLAIN) {
        enqueue_chain(c, cells, links, blocks, threads, false);
        return cudaGetLastError();
    }
#ifdef MOE_CUDA_SIM
    return cudaErrorInvalidValue; /* check_resident refused it */
#else
    unsigned *arrived = (unsigned *)(cells + 3);
    void *args[] = {&cells, &arrived, &links};
    const void *kernel = how == CHAIN_BARRIER ? (const void *)barrier_chain_kernel<BARRIER_FENCED>
                                              : (const void *)barrier_chain_kernel<BARRIER_ACQ_REL>;
    return cudaLaunchCooperativeKernel(kernel, blocks, threads, args, 0, c->stream);
#endif
}

/* Median microseconds per link of the chain run the way `how` says, over
 * reps runs after a warm-up; the chain's last value must be its length. */
static moe_status run_chain(lab_ctx *c, int *cells, int how, cudaGraphExec_t exec, int links, int blocks, int threads,
                            int reps, double *us) {
    moe_error *err = c->err;
    double per[CUDA_LAB_MAX_REPS];
    for (int r = -1; r < reps; r++) {
        CUDA_CHECK(cudaMemsetAsync(cells, 0, 4 * sizeof(int), c->stream));
        CUDA_CHECK(cudaEventRecord(c->start, c->stream));
        CUDA_CHECK(launch_chain(c, cells, how, exec, links, blocks, threads));
        CUDA_CHECK(cudaEventRecord(c->stop, c->stream));
        CUDA_CHECK(cudaEventSynchronize(c->stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, c->start, c->stop));
        if (r >= 0) per[r] = ms * 1e3 / links;
    }
    *us = median_sort(per, reps);
    int last = -1;
    CUDA_CHECK(cudaMemcpy(&last, cells + (links & 1), sizeof last, cudaMemcpyDeviceToHost));
    if (last != links)
        return moe_error_set(err, MOE_ERR_IO, "the chain of %d links (%d x %d threads) ended at %d", links, blocks,
                             threads, last);
    return MOE_OK;
}

static moe_status time_chain(lab_ctx *c, int *cells, int how, int links, int blocks, int threads, int reps,
                             double *us) {
    moe_error *err = c->err;
    if (how == CHAIN_BARRIER || how == CHAIN_BARRIER_ACQ_REL) {
        moe_status st = check_resident(c, blocks, threads);
        return st == MOE_OK ? run_chain(c, cells, how, NULL, links, blocks, threads, reps, us) : st;
    }
    if (how == CHAIN_PLAIN) return run_chain(c, cells, how, NULL, links, blocks, threads, reps, us);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    enqueue_chain(c, cells, links, blocks, threads, how == CHAIN_GRAPH_PDL);
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    moe_status st = run_chain(c, cells, how, exec, links, blocks, threads, reps, us);
    cudaGraphExecDestroy(exec);
    return st;
}

moe_status cuda_lab_launch_chain(int launches, int blocks, int threads, int reps, cuda_lab_chain *out, moe_error *err) {
    memset(out, 0, sizeof *out);
    if (check_reps(reps, err) != MOE_OK) return MOE_ERR_RANGE;
    if (launches < 1 || blocks < 1 || threads < 32 || threads > 1024 || threads % 32)
        return moe_error_set(err, MOE_ERR_RANGE, "a chain of %d launches of %d x %d threads", launches, blocks, threads);
    lab_ctx c;
    int *cells = NULL;
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK) st = lab_alloc(&c, (void **)&cells, 4 * sizeof(int)); /* two links' cells, a sink, arrivals */
    if (st == MOE_OK) st = time_chain(&c, cells, CHAIN_PLAIN, launches, blocks, threads, reps, &out->plain_us);
    if (st == MOE_OK) st = time_chain(&c, cells, CHAIN_GRAPH, launches, blocks, threads, reps, &out->graph_us);
    if (st == MOE_OK) st = time_chain(&c, cells, CHAIN_GRAPH_PDL, launches, blocks, threads, reps, &out->pdl_us);
    if (st == MOE_OK) st = time_chain(&c, cells, CHAIN_BARRIER, launches, blocks, threads, reps, &out->barrier_us);
    if (st == MOE_OK)
        st = time_chain(&c, cells, CHAIN_BARRIER_ACQ_REL, launches, blocks, threads, reps, &out->acq_rel_barrier_us);
    lab_close(&c);
    return st;
}

/* ---------------------------------------------------------------- code fetch */

/* KB kilobytes of straight-line code, one 16-byte FFMA an instruction in
 * eight independent chains (issue, not latency, paces them), run by one
 * warp: ns[0] gets the time from its first instruction to its last. In
 * the decode step each layer's weights stream through L2 and evict the
 * code of the layer before, and code run by one block (a last block's
 * merge) or one warp (ffn_up's routing) is fetched by it alone. */
template <int KB>
__global__ void code_kernel(float *out, uint64_t *ns) {
    const uint64_t t0 = global_ns();
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = out[i];
#ifdef MOE_CUDA_SIM
    for (int i = 0; i < KB * 64; i++) x[i & 7] = fmaf(x[i & 7], 1.0001f, 0.5f);
#else
#pragma unroll
    for (int i = 0; i < KB * 64; i++) asm volatile("fma.rn.f32 %0, %0, 0f3F800347, 0f3F000000;" : "+f"(x[i & 7]));
#endif
    const uint64_t t1 = global_ns();
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) sum += x[i];
    if (threadIdx.x == 0) out[8] = sum, ns[0] = t1 - t0;
}

/* What stands between two layers' uses of a kernel's code: a sweep of L2
 * (every block reads its share of n 16-byte words) and other code through
 * every multiprocessor's instruction caches (FLUSH_KB on each). */
enum { FLUSH_KB = 128, SWEEP_BYTES = 256 << 20 };

__global__ void sweep_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = ldg16(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == LAB_SENTINEL) *sink = acc;
}

template <int KB>
static moe_status time_code(lab_ctx *c, int reps, const uint4 *sweep, float *x, uint64_t *ns, cuda_lab_code *out) {
    moe_error *err = c->err;
    double hot[CUDA_LAB_MAX_REPS], cold[CUDA_LAB_MAX_REPS];
    for (int r = -1; r < reps; r++) { /* r = -1: loads the module's code once */
        LAUNCH(sweep_kernel, 4 * c->n_sm, 512, 0, c->stream, sweep, (size_t)SWEEP_BYTES / 16, c->sink);
        LAUNCH(code_kernel<FLUSH_KB>, 2 * c->n_sm, 32, 0, c->stream, x, ns + 2);
        LAUNCH(code_kernel<KB>, 1, 32, 0, c->stream, x, ns);
        LAUNCH(code_kernel<KB>, 1, 32, 0, c->stream, x, ns + 1);
        CUDA_CHECK(cudaGetLastError());
        uint64_t t[2];
        CUDA_CHECK(cudaMemcpyAsync(t, ns, sizeof t, cudaMemcpyDeviceToHost, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (r >= 0) cold[r] = t[0] * 1e-3, hot[r] = t[1] * 1e-3;
    }
    out->kb = KB;
    out->sweep_mb = SWEEP_BYTES >> 20;
    out->flush_kb = FLUSH_KB;
    out->cold_us = median_sort(cold, reps);
    out->hot_us = median_sort(hot, reps);
    return MOE_OK;
}

moe_status cuda_lab_code_fetch(int kb, int reps, cuda_lab_code *out, moe_error *err) {
    memset(out, 0, sizeof *out);
    if (check_reps(reps, err) != MOE_OK) return MOE_ERR_RANGE;
    auto time = kb == 4 ? time_code<4> : kb == 16 ? time_code<16> : kb == 64 ? time_code<64> : nullptr;
    if (!time) return moe_error_set(err, MOE_ERR_RANGE, "lab: code of %d KB (4, 16 or 64)", kb);
    lab_ctx c;
    uint4 *sweep = NULL;
    float *x = NULL;
    uint64_t *ns = NULL;
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK) st = lab_alloc(&c, (void **)&sweep, SWEEP_BYTES);
    if (st == MOE_OK) st = lab_alloc(&c, (void **)&x, 9 * sizeof(float));
    if (st == MOE_OK) st = lab_alloc(&c, (void **)&ns, 3 * sizeof(uint64_t));
    if (st == MOE_OK && (cudaMemset(sweep, 0, SWEEP_BYTES) != cudaSuccess || cudaMemset(x, 0, 9 * sizeof(float)) != cudaSuccess))
        st = moe_error_set(err, MOE_ERR_IO, "lab: clearing the code-fetch buffers failed");
    if (st == MOE_OK) st = time(&c, reps, sweep, x, ns, out);
    lab_close(&c);
    return st;
}

/* ---------------------------------------------------------------- staging */

enum { LAB_MAX_SMS = 1024 }; /* the blocks of one probe, one an SM */

/* One launch of n_sm blocks, each staging an activation of n values as
 * the decode step's kernels do after their wait (kernels.cuh), timed by
 * every block from a barrier at its entry to the staging's last barrier:
 * the products' staging (x * w, the RMS scale apart), ffn_up's (the full
 * norm), none (no norm), or the floor under them (its first chunk's loads
 * and one barrier). */
template <int KIND, int HOW>
__global__ void __launch_bounds__(GEMV_THREADS) stage_probe_kernel(const act_in in, uint64_t *ns, unsigned *sink) {
    DYN_SMEM(uint8_t, smem);
    __syncthreads();
    const uint64_t t0 = global_ns();
    float kept = 1.0f;
    if (HOW == CUDA_LAB_STAGE_PRODUCTS) kept = stage_act(KIND, in, smem);
    else if (HOW == CUDA_LAB_STAGE_NORMED) stage_act_normed(KIND, in, smem, NULL, NULL);
    else if (HOW == CUDA_LAB_STAGE_PLAIN) kept = stage_act(KIND, act_in{in.src, NULL, in.eps, in.n}, smem);
    else {
        float v[8], w[8];
        load_chunk(in, threadIdx.x >> 5, v, w);
#pragma unroll
        for (int k = 0; k < 8; k++) kept += v[k] * w[k];
        __syncthreads();
    }
    const uint64_t t1 = global_ns();
    if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
    if (__float_as_uint(kept) == LAB_SENTINEL) *sink = smem[threadIdx.x & 15]; /* keeps the staging */
}

/* The decode's input as it finds it: x just written (in L2), the norm's
 * weights read (prefetched into L2 before the wait). */
__global__ void stage_input_kernel(float *x, const float *norm, int n, unsigned *sink) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        x[i] = 0.5f + (float)((i * 2654435761u) >> 20) * 0x1.0p-12f - (i & 1);
        acc += norm[i];
    }
    if (__float_as_uint(acc) == LAB_SENTINEL) *sink = 1;
}

typedef void (*probe_kernel)(const act_in, uint64_t *, unsigned *);

template <int KIND>
static probe_kernel probe_of(int how) {
    static const probe_kernel ways[CUDA_LAB_STAGE_WAYS] = {
        stage_probe_kernel<KIND, CUDA_LAB_STAGE_PRODUCTS>, stage_probe_kernel<KIND, CUDA_LAB_STAGE_NORMED>,
        stage_probe_kernel<KIND, CUDA_LAB_STAGE_PLAIN>, stage_probe_kernel<KIND, CUDA_LAB_STAGE_LOADS>};
    return ways[how];
}

/* The probe of activation kind `kind` staged `how`. */
static probe_kernel probe_for(int kind, int how) {
    return kind == ACT_Q8K ? probe_of<ACT_Q8K>(how) : kind == ACT_Q80 ? probe_of<ACT_Q80>(how) : probe_of<ACT_F32>(how);
}

/* One probe after its input: cold runs first sweep L2 and every
 * multiprocessor's instruction caches, as a layer of the decode step does
 * between two runs of a kernel. The median and the largest of the blocks'
 * times to *median_us and *last_us. */
static moe_status run_probe(lab_ctx *c, probe_kernel probe, const act_in &in, float *x, size_t smem, bool cold,
                            const uint4 *sweep, float *code_x, uint64_t *ns, double *median_us, double *last_us) {
    moe_error *err = c->err;
    if (cold) {
        LAUNCH(sweep_kernel, 4 * c->n_sm, 512, 0, c->stream, sweep, (size_t)SWEEP_BYTES / 16, c->sink);
        LAUNCH(code_kernel<FLUSH_KB>, 2 * c->n_sm, 32, 0, c->stream, code_x, ns + c->n_sm);
    }
    LAUNCH(stage_input_kernel, 4, 256, 0, c->stream, x, in.norm, in.n, c->sink);
    LAUNCH(probe, c->n_sm, GEMV_THREADS, smem, c->stream, in, ns, c->sink);
    CUDA_CHECK(cudaGetLastError());
    uint64_t t[LAB_MAX_SMS];
    CUDA_CHECK(cudaMemcpyAsync(t, ns, (size_t)c->n_sm * sizeof *t, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    double us[LAB_MAX_SMS];
    *last_us = 0;
    for (int b = 0; b < c->n_sm; b++) {
        us[b] = t[b] * 1e-3;
        if (us[b] > *last_us) *last_us = us[b];
    }
    *median_us = median_sort(us, c->n_sm);
    return MOE_OK;
}

static moe_status time_staging(lab_ctx *c, int kind, int how, int n, int reps, cuda_lab_stage *out) {
    moe_error *err = c->err;
    const size_t smem = gemv_smem(kind, n);
    float *x = NULL, *norm = NULL, *code_x = NULL;
    uint4 *sweep = NULL;
    uint64_t *ns = NULL;
    moe_status st = lab_alloc(c, (void **)&x, (size_t)n * sizeof(float));
    if (st == MOE_OK) st = upload_values(c, &norm, n, [](int i) { return 1.0f + 0.25f * (float)((i * 40503u) % 7) / 7; });
    if (st == MOE_OK) st = lab_alloc(c, (void **)&sweep, SWEEP_BYTES);
    if (st == MOE_OK) st = lab_alloc(c, (void **)&code_x, 9 * sizeof(float));
    if (st == MOE_OK) st = lab_alloc(c, (void **)&ns, 2 * (size_t)c->n_sm * sizeof(uint64_t));
    if (st != MOE_OK) return st;
    CUDA_CHECK(cudaMemset(sweep, 0, SWEEP_BYTES));
    CUDA_CHECK(cudaMemset(code_x, 0, 9 * sizeof(float)));
    const probe_kernel probe = probe_for(kind, how);
    CUDA_CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const act_in in = {x, norm, 1e-6f, n};
    double cold[CUDA_LAB_MAX_REPS], cold_last[CUDA_LAB_MAX_REPS], hot[CUDA_LAB_MAX_REPS], hot_last[CUDA_LAB_MAX_REPS];
    for (int r = -1; r < reps && st == MOE_OK; r++) { /* r = -1: loads the module's code once */
        double m, l;
        st = run_probe(c, probe, in, x, smem, true, sweep, code_x, ns, &m, &l);
        if (st == MOE_OK && r >= 0) cold[r] = m, cold_last[r] = l;
        if (st == MOE_OK) st = run_probe(c, probe, in, x, smem, false, sweep, code_x, ns, &m, &l);
        if (st == MOE_OK && r >= 0) hot[r] = m, hot_last[r] = l;
    }
    if (st != MOE_OK) return st;
    out->cold_us = median_sort(cold, reps), out->cold_last_us = median_sort(cold_last, reps);
    out->hot_us = median_sort(hot, reps), out->hot_last_us = median_sort(hot_last, reps);
    return MOE_OK;
}

moe_status cuda_lab_staging(moe_type dot, int how, int n, int reps, cuda_lab_stage *out, moe_error *err) {
    memset(out, 0, sizeof *out);
    out->dot = dot, out->how = how, out->n = n;
    if (check_reps(reps, err) != MOE_OK) return MOE_ERR_RANGE;
    const int kind = dot == MOE_TYPE_Q8_K ? ACT_Q8K : dot == MOE_TYPE_Q8_0 ? ACT_Q80 : ACT_F32;
    const int per = kind == ACT_Q8K ? 256 : 32;
    if ((dot != MOE_TYPE_Q8_K && dot != MOE_TYPE_Q8_0 && dot != MOE_TYPE_F32) || how < 0 ||
        how >= CUDA_LAB_STAGE_WAYS || n <= 0 || n % per || gemv_smem(kind, n) > 48 * 1024)
        return moe_error_set(err, MOE_ERR_RANGE, "lab: staging %d values as %s, way %d", n,
                             quant_format_of(dot) ? quant_format_of(dot)->name : "an unknown type", how);
    lab_ctx c;
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK && c.n_sm > LAB_MAX_SMS)
        st = moe_error_set(err, MOE_ERR_UNSUPPORTED, "lab: %d SMs (at most %d)", c.n_sm, LAB_MAX_SMS);
    if (st == MOE_OK) st = time_staging(&c, kind, how, n, reps, out);
    lab_close(&c);
    return st;
}

/* ---------------------------------------------------------------- the device */

moe_status cuda_lab_device(char *name, size_t len, int *n_sm, moe_error *err) {
    if (!cuda_available()) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA GPU found");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    snprintf(name, len, "%s", prop.name);
    *n_sm = prop.multiProcessorCount;
    return MOE_OK;
}

/* ---------------------------------------------------------------- sampling */

/* Logits spread like a model's: 4 x (a sum of 4 uniforms - 2). */
static moe_status upload_logits(lab_ctx *c, float **out, int n) {
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    return upload_values(c, out, n, [&](int) {
        float v = 0;
        for (int j = 0; j < 4; j++) v += (float)(lab_rand(&rng) >> 40) * 0x1.0p-24f;
        return 4.0f * (v - 2.0f);
    });
}

moe_status cuda_lab_top_logits(int n_vocab, int n, int n_extra, int reps, double *us, moe_error *err) {
    if (reps < 1 || reps > CUDA_LAB_MAX_REPS || n_vocab < 1 || n < 0 || n_extra < 0 || n_extra > CUDA_TOP_EXTRA_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, "lab: top logits of %d (%d extra, %d reps)", n, n_extra, reps);
    sampler_candidate top[CUDA_TOP_MAX];
    float extra_logits[CUDA_TOP_EXTRA_MAX];
    int32_t extra[CUDA_TOP_EXTRA_MAX];
    for (int i = 0; i < n_extra; i++) extra[i] = (int32_t)((i * 2654435761u) % (unsigned)n_vocab);
    float *host = (float *)malloc((size_t)n_vocab * sizeof(float)); /* where every logit goes (n = 0) */
    if (!host) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    lab_ctx c;
    top_scratch *scratch = NULL;
    float *logits = NULL;
    double per[CUDA_LAB_MAX_REPS];
    moe_status st = lab_open(&c, err);
    if (st == MOE_OK) st = upload_logits(&c, &logits, n_vocab);
    int found = 0;
    for (int r = -1; r < reps && st == MOE_OK; r++) { /* r = -1: the warm-up makes the scratch */
        const double t0 = 1e6 * monotonic_seconds();
        if (n > 0)
            st = cuda_top_logits_at(&scratch, logits, n_vocab, c.stream, n, extra, n_extra, top, &found, extra_logits,
                                    err);
        else if (cudaMemcpyAsync(host, logits, (size_t)n_vocab * sizeof(float), cudaMemcpyDeviceToHost, c.stream) !=
                     cudaSuccess ||
                 cudaStreamSynchronize(c.stream) != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_IO, "lab: copying the logits back failed");
        if (r >= 0) per[r] = 1e6 * monotonic_seconds() - t0;
    }
    if (st == MOE_OK) *us = median_sort(per, reps);
    cuda_top_scratch_free(scratch);
    lab_close(&c);
    free(host);
    return st;
}
