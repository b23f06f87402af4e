/*
 * moe_ffn.cuh — the MoE half of a decode layer in one launch: the o
 * projection, the router, the routing and the routed experts' gate/up and
 * down, parted by grid barriers instead of four launches.
 *
 * Why (bench/decode-plan.md, facts 3 and 61): a matrix of a few MB does
 * not reach the read bandwidth in a launch of its own; every launch pays
 * a DRAM round trip and a ramp after the launch before has ended, because
 * its blocks cannot start beside that launch's. Here every block is
 * resident from the start (one a multiprocessor, all of its shared memory)
 * and the copy engine of each SM (cp.async.bulk) brings the block's rows
 * of every phase into shared memory as soon as they are known: the o and
 * router rows before the launch before has ended, the chosen experts'
 * gate/up and down rows together as soon as the block has routed. The
 * phases then multiply rows that are already there, and the down rows
 * arrive while gate/up is computed.
 *
 * Block b takes a contiguous share of each phase's rows: o's output rows,
 * the router's experts, the (slot, row) pairs of gate/up, and the output
 * rows of down (the k chosen experts' rows of each). The activations are
 * staged as the other kernels stage them (stage_act, stage_act_normed),
 * so the integer dot products are those of the CPU reference.
 *
 * Formats opt in with shared_units (q4_k.cu): how a unit is read from a
 * row in shared memory.
 */
#ifndef MOE_CUDA_MOE_FFN_CUH
#define MOE_CUDA_MOE_FFN_CUH

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"

template <class F>
struct shared_units {
    static constexpr bool value = false;
};

/* Block b's share [lo, hi) of n items over `blocks` blocks. */
__host__ __device__ inline void share_of(int b, int blocks, int n, int *lo, int *hi) {
    *lo = (int)((int64_t)b * n / blocks);
    *hi = (int)((int64_t)(b + 1) * n / blocks);
}

/* The largest share of n items over `blocks` blocks. */
__host__ __device__ inline int max_share(int n, int blocks) { return (n + blocks - 1) / blocks; }

enum {
    MOE_FFN_THREADS = 512, /* 16 warps: every row of a phase's share worked at once (moe_ffn_lanes) */
    GATE_UP_CHUNKS = 4,    /* gate/up rows arrive in parts: the first part's rows are worked on while the rest arrive */
    MOE_FFN_CTRL = 512     /* transaction barriers, the routing */
};

/* Lanes a row in a phase of `rows` rows (a block's share) of `units`
 * units each: as many as let every row be worked at once, no more than
 * the units. A block is alone on its multiprocessor: its few warps have
 * to hide the latency of the shared-memory reads by working side by side. */
__host__ __device__ inline int moe_ffn_lanes(int rows, int units) {
    int L = 32;
    while (L > 1 && (L / 2 >= units || (rows + 32 / L - 1) / (32 / L) > MOE_FFN_THREADS / 32)) L /= 2;
    return L;
}

/* Where each thing lives in a block's dynamic shared memory. */
struct moe_ffn_layout {
    size_t o, router, gate_up, down, act, xf, total;
    int o_rows, router_rows, pairs, down_rows; /* the largest shares */
};

__host__ __device__ inline moe_ffn_layout moe_ffn_layout_of(const moe_ffn_args &a, int blocks) {
    moe_ffn_layout l;
    const int k = a.route.k, R = a.gate.rows;
    l.o_rows = max_share(a.wo.rows, blocks);
    l.router_rows = max_share(a.router.rows, blocks);
    l.pairs = max_share(k * R, blocks);
    l.down_rows = max_share(a.down.rows, blocks);
    size_t at = MOE_FFN_CTRL;
    l.o = at, at += align16((size_t)l.o_rows * a.wo.row_stride);
    l.router = at, at += align16((size_t)l.router_rows * a.router.row_stride);
    l.gate_up = at, at += align16((size_t)2 * l.pairs * a.gate.row_stride);
    l.down = at, at += align16((size_t)k * l.down_rows * a.down.row_stride);
    int n = a.att.n > a.x_in.n ? a.att.n : a.x_in.n;
    if (k * R > n) n = k * R;
    l.act = at, at += gemv_smem(ACT_Q8K, n);
    l.xf = at, at += gemv_smem(ACT_F32, a.x_in.n);
    l.total = at;
    return l;
}

/* The block's transaction barriers: one a phase's copies, gate/up's one a part. */
enum { BAR_O, BAR_ROUTER, BAR_DOWN, BAR_GATE_UP, N_BARS = BAR_GATE_UP + GATE_UP_CHUNKS };

/* The block's control area: its transaction barriers, the routing. */
struct moe_ffn_ctrl {
    uint64_t bar[N_BARS];
    int ids[MAX_EXPERTS_USED];
    float w[MAX_EXPERTS_USED];
};

/* The phases' timeline marks (moe_ffn_phase; moe bench --profile shows
 * them in the rows of the launches they replace): ENTRY the phase
 * begins (o: the kernel's entry; the others: their grid barrier returned),
 * WAITED its input is there (o: the launch before has ended; router and
 * down: the activation is staged; gate/up: routed, the expert rows asked
 * for), STAGED its rows have arrived in shared memory (gate/up: thread
 * 0's part), WORKED it is done. */

/* Phase `done` is done in every block; phase `next` begins. */
__device__ __forceinline__ void next_phase(const moe_ffn_args &a, int done, int next) {
    trace_block_mark(a.trace[done], TRACE_WORKED);
    grid_sync(a.barrier, gridDim.x);
    trace_mark(a.trace[next], TRACE_ENTRY);
}

/* Rows [lo, hi) of m (expert e of a slab) to shared memory at dst. */
__device__ __forceinline__ unsigned copy_rows(uint8_t *dst, const dmat &m, int e, int lo, int hi, uint64_t *bar) {
    const unsigned bytes = (unsigned)((int64_t)(hi - lo) * m.row_stride);
    if (bytes) bulk_copy(dst, m.body + e * m.expert_stride + (int64_t)lo * m.row_stride, bytes, bar);
    return bytes;
}

__device__ __forceinline__ unsigned rows_bytes(const dmat &m, int lo, int hi) {
    return (unsigned)((int64_t)(hi - lo) * m.row_stride);
}

/* Thread 0: the o and router rows, issued before the launch's wait. */
__device__ __forceinline__ void fetch_dense(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                           moe_ffn_ctrl *c) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.wo.rows, &lo, &hi);
    mbar_expect(&c->bar[BAR_O], rows_bytes(a.wo, lo, hi));
    copy_rows(smem + l.o, a.wo, 0, lo, hi, &c->bar[BAR_O]);
    share_of(blockIdx.x, gridDim.x, a.router.rows, &lo, &hi);
    mbar_expect(&c->bar[BAR_ROUTER], rows_bytes(a.router, lo, hi));
    copy_rows(smem + l.router, a.router, 0, lo, hi, &c->bar[BAR_ROUTER]);
}

/* Part `part` of the block's gate/up pairs [lo, hi) (a pair is a slot and
 * a row; a run of one slot is contiguous in the slab): its pairs' range. */
__device__ __forceinline__ void gate_up_part(int part, int lo, int hi, int *p_lo, int *p_hi) {
    share_of(part, GATE_UP_CHUNKS, hi - lo, p_lo, p_hi);
    *p_lo += lo, *p_hi += lo;
}

/* The part of pair i (from the block's first) of n. */
__device__ __forceinline__ int part_of_pair(int i, int n) {
    int part = 0, lo, hi;
    for (; part < GATE_UP_CHUNKS - 1; part++) {
        share_of(part, GATE_UP_CHUNKS, n, &lo, &hi);
        if (i < hi) break;
    }
    return part;
}

/* One gate/up part's rows of the chosen experts. */
__device__ __forceinline__ void fetch_gate_up_part(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                                   moe_ffn_ctrl *c, int part) {
    const int R = a.gate.rows;
    int lo, hi, p_lo, p_hi;
    share_of(blockIdx.x, gridDim.x, a.route.k * R, &lo, &hi);
    gate_up_part(part, lo, hi, &p_lo, &p_hi);
    uint64_t *bar = &c->bar[BAR_GATE_UP + part];
    mbar_expect(bar, 2 * rows_bytes(a.gate, p_lo, p_hi));
    uint8_t *gate = smem + l.gate_up, *up = gate + (size_t)l.pairs * a.gate.row_stride;
    for (int p = p_lo; p < p_hi;) {
        const int j = p / R, r = p - j * R, end = min(p_hi, (j + 1) * R);
        const size_t at = (size_t)(p - lo) * a.gate.row_stride;
        copy_rows(gate + at, a.gate, c->ids[j], r, r + end - p, bar);
        copy_rows(up + at, a.up, c->ids[j], r, r + end - p, bar);
        p = end;
    }
}

/* Slot j's down rows of the block's output rows. Slot 0's lane announces
 * every slot's bytes: a copy may complete before that (the barrier's
 * byte count goes below zero for a while, which PTX allows). */
__device__ __forceinline__ void fetch_down_slot(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                                moe_ffn_ctrl *c, int j) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.down.rows, &lo, &hi);
    if (j == 0) mbar_expect(&c->bar[BAR_DOWN], a.route.k * rows_bytes(a.down, lo, hi));
    copy_rows(smem + l.down + (size_t)j * l.down_rows * a.down.row_stride, a.down, c->ids[j], lo, hi,
              &c->bar[BAR_DOWN]);
}

/* The routing warp, once routed: its lanes ask for the chosen experts'
 * rows side by side, gate/up's parts first. */
__device__ __forceinline__ void fetch_experts(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                              moe_ffn_ctrl *c) {
    const int lane = threadIdx.x & 31;
    if (lane < GATE_UP_CHUNKS) fetch_gate_up_part(a, smem, l, c, lane);
    else if (lane - GATE_UP_CHUNKS < a.route.k) fetch_down_slot(a, smem, l, c, lane - GATE_UP_CHUNKS);
}

/* One row's partial dot product over this lane's units (sub, sub + L, ...)
 * of a row in shared memory, against the staged activation at act_off. */
template <class F>
__device__ __forceinline__ float shared_row_dot(const uint8_t *row, int U, const act_view &av, int act_off, int L,
                                                int sub) {
    float acc = 0.0f;
    for (int u = sub; u < U; u += L) acc += F::dot(shared_units<F>::load(row, u), av, act_off, u);
    return acc;
}

/* finish(i, sum) for each of n rows of L lanes (every lane of the warp
 * calls dot and the group sum; lane 0 of a row's group calls finish). */
template <class Dot, class Finish>
__device__ __forceinline__ void for_rows(int n, int L, Dot dot, Finish finish) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = 32 / L, sub = lane & (L - 1);
    const int nw = blockDim.x >> 5;
    for (int base = warp * G; base < n; base += nw * G) {
        const int i = base + lane / L;
        float acc = i < n ? dot(i, sub) : 0.0f;
        acc = group_sum(acc, L);
        if (i < n && sub == 0) finish(i, acc);
    }
}

/* x[rows of the block] += Wo att */
template <class F>
__device__ __forceinline__ void o_phase(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l, moe_ffn_ctrl *c) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.wo.rows, &lo, &hi);
    stage_act(F::ACT, a.att, smem + l.act);
    const act_view av = act_view_of(F::ACT, smem + l.act, a.att.n);
    mbar_wait(&c->bar[BAR_O]);
    trace_mark(a.trace[PHASE_O], TRACE_STAGED);
    const uint8_t *rows = smem + l.o;
    for_rows(
        hi - lo, a.o_lanes,
        [&](int i, int sub) { return shared_row_dot<F>(rows + (size_t)i * a.wo.row_stride, a.wo.units, av, 0, a.o_lanes, sub); },
        [&](int i, float acc) { a.x[lo + i] += acc; });
}

/* The router's logits of the block's experts, from the normalised x in
 * f32; x normalised and quantized for the experts too. */
template <class F>
__device__ __forceinline__ void router_phase(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                             moe_ffn_ctrl *c) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.router.rows, &lo, &hi);
    float *xf = (float *)(smem + l.xf);
    stage_f32_normed(a.x_in, xf, NULL, NULL, (float *)(smem + l.xf + act_bytes(ACT_F32, a.x_in.n)));
    stage_act(F::ACT, act_in{xf, NULL, 0.0f, a.x_in.n}, smem + l.act); /* the same values, from shared memory */
    trace_mark(a.trace[PHASE_ROUTER], TRACE_WAITED);
    mbar_wait(&c->bar[BAR_ROUTER]);
    trace_mark(a.trace[PHASE_ROUTER], TRACE_STAGED);
    const int n = a.x_in.n;
    for_rows(
        hi - lo, 32,
        [&](int i, int sub) {
            const float *w = (const float *)(smem + l.router + (size_t)i * a.router.row_stride);
            float acc = 0.0f;
            for (int j = sub * 4; j < n; j += 128) {
                const float4 v = *(const float4 *)(w + j), x = *(const float4 *)(xf + j);
                acc += v.x * x.x + v.y * x.y + v.z * x.z + v.w * x.w;
            }
            return acc;
        },
        [&](int i, float acc) { a.logits[lo + i] = acc; });
}

/* h[pair] = silu(gate . x) * (up . x) for the block's pairs */
template <class F>
__device__ __forceinline__ void gate_up_phase(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                              moe_ffn_ctrl *c) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.route.k * a.gate.rows, &lo, &hi);
    const act_view av = act_view_of(F::ACT, smem + l.act, a.x_in.n);
    const uint8_t *gate = smem + l.gate_up, *up = gate + (size_t)l.pairs * a.gate.row_stride;
    const int L = a.up_lanes, U = a.gate.units;
    for (int base = (threadIdx.x >> 5) * (32 / L); base < hi - lo; base += (blockDim.x >> 5) * (32 / L)) {
        const int i = base + (threadIdx.x & 31) / L, sub = threadIdx.x & (L - 1);
        float g = 0.0f, u = 0.0f;
        if (i < hi - lo) {
            mbar_wait(&c->bar[BAR_GATE_UP + part_of_pair(i, hi - lo)]);
            trace_mark(a.trace[PHASE_GATE_UP], TRACE_STAGED);
            g = shared_row_dot<F>(gate + (size_t)i * a.gate.row_stride, U, av, 0, L, sub);
            u = shared_row_dot<F>(up + (size_t)i * a.gate.row_stride, U, av, 0, L, sub);
        }
        g = group_sum(g, L);
        u = group_sum(u, L);
        if (i < hi - lo && sub == 0) a.h[lo + i] = g / (1.0f + expf(-g)) * u; /* cpu_swiglu */
    }
}

/* x[rows of the block] += sum_j w_j D_{id_j} h_j: each output row's k
 * expert rows as one stream of units (as ffn_down_kernel). */
template <class F>
__device__ __forceinline__ void down_phase(const moe_ffn_args &a, uint8_t *smem, const moe_ffn_layout &l,
                                           moe_ffn_ctrl *c) {
    int lo, hi;
    share_of(blockIdx.x, gridDim.x, a.down.rows, &lo, &hi);
    const int k = a.route.k, U = a.down.units, total = k * U;
    const act_in h = {a.h, NULL, 0.0f, k * a.down.cols};
    stage_act<true>(F::ACT, h, smem + l.act);
    const act_view av = act_view_of(F::ACT, smem + l.act, h.n);
    trace_mark(a.trace[PHASE_DOWN], TRACE_WAITED);
    mbar_wait(&c->bar[BAR_DOWN]);
    trace_mark(a.trace[PHASE_DOWN], TRACE_STAGED);
    const size_t expert_rows = (size_t)l.down_rows * a.down.row_stride;
    for_rows(
        hi - lo, a.down_lanes,
        [&](int i, int sub) {
            const uint8_t *row = smem + l.down + (size_t)i * a.down.row_stride;
            float acc = 0.0f;
            for (int t = sub; t < total; t += a.down_lanes) {
                const int j = div_by_magic(t, U, a.down.units_magic), u = t - j * U;
                acc += c->w[j] * F::dot(shared_units<F>::load(row + j * expert_rows, u), av, j * a.down.cols, u);
            }
            return acc;
        },
        [&](int i, float acc) { a.x[lo + i] += acc; });
}

template <class F>
__global__ void __launch_bounds__(MOE_FFN_THREADS, 1) moe_ffn_kernel(const moe_ffn_args a) {
    DYN_SMEM(uint8_t, smem);
    const moe_ffn_layout l = moe_ffn_layout_of(a, gridDim.x);
    moe_ffn_ctrl *c = (moe_ffn_ctrl *)smem;
    trace_mark(a.trace[PHASE_O], TRACE_ENTRY);
    if (threadIdx.x == 0) {
        for (int i = 0; i < N_BARS; i++) mbar_init(&c->bar[i]);
        fetch_dense(a, smem, l, c); /* weights never depend on the launch before */
    }
    __syncthreads();
    pdl_wait();
    trace_mark(a.trace[PHASE_O], TRACE_WAITED);
    o_phase<F>(a, smem, l, c);
    next_phase(a, PHASE_O, PHASE_ROUTER);
    router_phase<F>(a, smem, l, c);
    next_phase(a, PHASE_ROUTER, PHASE_GATE_UP);
    if (threadIdx.x < 32) {
        route_warp(a.route, c->w, c->ids);
        if (blockIdx.x == 0 && threadIdx.x < a.route.k)
            a.route_ids[threadIdx.x] = c->ids[threadIdx.x], a.route_w[threadIdx.x] = c->w[threadIdx.x];
        __syncwarp();
        fetch_experts(a, smem, l, c);
    }
    __syncthreads();
    trace_mark(a.trace[PHASE_GATE_UP], TRACE_WAITED);
    gate_up_phase<F>(a, smem, l, c);
    next_phase(a, PHASE_GATE_UP, PHASE_DOWN);
    pdl_launch_dependents(); /* only now: every block is resident, none can be kept out */
    down_phase<F>(a, smem, l, c);
    trace_block_mark(a.trace[PHASE_DOWN], TRACE_WORKED);
}

template <class F>
static void launch_moe_ffn_as(const moe_ffn_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    LAUNCH_PDL_RESIDENT(pdl, moe_ffn_kernel<F>, grid, MOE_FFN_THREADS, smem, st, *a);
}

template <class F>
static int moe_ffn_occupancy(size_t smem) {
    int n = 0;
    if (cudaFuncSetAttribute(moe_ffn_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, moe_ffn_kernel<F>, MOE_FFN_THREADS, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* The table entry's: formats without shared_units have none. */
template <class F>
constexpr moe_ffn_fn moe_ffn_of() {
    if constexpr (shared_units<F>::value) return moe_ffn_fn{launch_moe_ffn_as<F>, moe_ffn_occupancy<F>};
    else return moe_ffn_fn{nullptr, nullptr};
}

#endif
