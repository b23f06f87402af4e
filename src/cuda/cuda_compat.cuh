/*
 * cuda_compat.cuh — what every .cu file of the CUDA backend includes first.
 *
 * Two builds share these sources:
 *  - the real one (nvcc, MOE_HAVE_CUDA): CUDA C++ for the GPU;
 *  - the simulator (MOE_CUDA_SIM, plain g++): the same kernels compiled as
 *    host C++ and run on the CPU by cuda_sim.h, one fiber per GPU thread,
 *    so the index arithmetic, the shared-memory staging, the warp
 *    reductions and the whole decode step can be checked against the CPU
 *    reference on a machine without a GPU. It is slow (tiny models only)
 *    and it proves nothing about speed, races the fiber order hides, or
 *    the real compiler; the GPU tests are still the judge.
 *
 * The kernels therefore use a small vocabulary that both builds define:
 * LAUNCH instead of <<<>>>, DYN_SMEM for dynamic shared memory, ldg16 for
 * 16-byte read-only loads, h2f / f2h_round for fp16, and the intrinsics
 * the simulator implements (__shfl_xor_sync, __dp4a, __byte_perm, __vsub4,
 * atomics, __threadfence, release/acquire atomics).
 *
 * Errors: CUDA_CHECK(call) turns a failed runtime call into a moe_status
 * with file, line and the error's name (cudaErrorMemoryAllocation ...) in
 * the caller's moe_error and returns it; the library never exits.
 */
#ifndef MOE_CUDA_COMPAT_CUH
#define MOE_CUDA_COMPAT_CUH

#include <stddef.h>
#include <stdint.h>

#ifdef MOE_CUDA_SIM
#include "cuda/cuda_sim.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#endif

extern "C" {
#include "common/clock.h"
#include "common/error.h"
}

/* ------------------------------------------------------------ errors */

/* Inside a function that returns moe_status and has `moe_error *err`. */
#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t cuda_check_e_ = (call);                                                               \
        if (cuda_check_e_ != cudaSuccess) {                                                               \
            (void)cudaGetLastError();                                                                     \
            return moe_error_set(err, cuda_check_e_ == cudaErrorMemoryAllocation ? MOE_ERR_NOMEM          \
                                                                                  : MOE_ERR_IO,           \
                                 "CUDA error %s (%s) at %s:%d in %s", cudaGetErrorName(cuda_check_e_),    \
                                 cudaGetErrorString(cuda_check_e_), __FILE__, __LINE__, #call);           \
        }                                                                                                 \
    } while (0)

/* ------------------------------------------------------------ launches */

#ifdef MOE_CUDA_SIM
/* The arguments are copied at the launch, as CUDA does (a graph replays
 * the copies). */
template <class K, class... A> void sim_launch_kernel(dim3 grid, dim3 block, size_t smem, K kernel, A... args) {
    sim_launch(grid, block, smem, [=]() { kernel(args...); });
}
#define LAUNCH(kernel_, grid_, block_, smem_, stream_, ...) \
    sim_launch_kernel(dim3(grid_), dim3(block_), (size_t)(smem_), kernel_, __VA_ARGS__)
#define LAUNCH_PDL(pdl_, kernel_, grid_, block_, smem_, stream_, ...) LAUNCH(kernel_, grid_, block_, smem_, stream_, __VA_ARGS__)
template <class K, class... A> void sim_launch_kernel_together(dim3 grid, dim3 block, size_t smem, K kernel, A... args) {
    sim_launch(grid, block, smem, [=]() { kernel(args...); }, true);
}
#define LAUNCH_PDL_RESIDENT(pdl_, kernel_, grid_, block_, smem_, stream_, ...) \
    sim_launch_kernel_together(dim3(grid_), dim3(block_), (size_t)(smem_), kernel_, __VA_ARGS__)
#define DYN_SMEM(type, name) type *name = (type *)sim_dyn_smem()
#else
#define LAUNCH(kernel_, grid_, block_, smem_, stream_, ...) kernel_<<<(grid_), (block_), (smem_), (stream_)>>>(__VA_ARGS__)
/* A launch that may overlap its predecessor (programmatic dependent launch):
 * the kernel must call pdl_wait() before it reads what earlier kernels wrote. */
#define LAUNCH_PDL(pdl_, kernel_, grid_, block_, smem_, stream_, ...)                       \
    do {                                                                                     \
        cudaLaunchConfig_t cfg_ = {};                                                        \
        cudaLaunchAttribute attr_[1];                                                        \
        cfg_.gridDim = dim3(grid_);                                                          \
        cfg_.blockDim = dim3(block_);                                                        \
        cfg_.dynamicSmemBytes = (smem_);                                                     \
        cfg_.stream = (stream_);                                                             \
        attr_[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;                    \
        attr_[0].val.programmaticStreamSerializationAllowed = (pdl_) ? 1 : 0;                \
        cfg_.attrs = attr_;                                                                  \
        cfg_.numAttrs = 1;                                                                   \
        cudaLaunchKernelEx(&cfg_, kernel_, __VA_ARGS__);                                     \
    } while (0)
/* A launch whose blocks meet at grid barriers (grid_sync): the caller has
 * checked that every block can be resident at once. */
#define LAUNCH_PDL_RESIDENT LAUNCH_PDL
#define DYN_SMEM(type, name)                        \
    extern __shared__ __align__(16) uint8_t dyn_smem_[]; \
    type *name = (type *)dyn_smem_
#endif

/* ------------------------------------------------------------ device helpers */

#ifdef MOE_CUDA_SIM
static inline float h2f(uint16_t h) { return block_fp16_to_f32(h); }
static inline float f2h_round(float f) { return block_fp16_to_f32(block_f32_to_fp16(f)); }
static inline uint16_t f2h(float f) { return block_f32_to_fp16(f); }
static inline uint4 ldg16(const void *p) { return *(const uint4 *)p; }
static inline uint2 ldg8(const void *p) { return *(const uint2 *)p; }
static inline uint16_t ldg_u16(const void *p) { return *(const uint16_t *)p; }
static inline void prefetch_l2(const void *p) { (void)p; }
/* dp4a of unsigned bytes a with signed bytes b */
static inline int dp4a_u8s8(unsigned a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline void add_release_gpu(unsigned *p, unsigned v) { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
static inline unsigned load_acquire_gpu(const unsigned *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline unsigned add_acq_rel_gpu(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
static inline void pin_reg(unsigned &v) { (void)v; }
static inline void pdl_wait(void) {}
static inline void pdl_launch_dependents(void) {}
static inline void cp_async16(void *smem, const void *gmem, bool valid) { sim_cp_async(smem, gmem, valid); }
static inline void cp_async_commit(void) { sim_cp_async_commit(); }
template <int PENDING> static inline void cp_async_wait(void) { sim_cp_async_wait(PENDING); }
static inline void cp_async_wait_all(void) { sim_cp_async_wait_all(); }
static inline uint64_t add_acq_rel_gpu64(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
static inline uint64_t load_acquire_gpu64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
/* A spinning thread lets the others run (fibers switch only when asked). */
static inline void spin_pause(void) { sim_yield(); }
/* Bulk copies complete at once. A barrier's 64 bits hold what the
 * hardware's does: the bytes still to land, the arrivals still due, the
 * arrivals a phase, and the phases completed (their parity is what a wait
 * asks for). A wait on a phase that cannot complete (bytes announced and
 * never copied) aborts; one that waits for other threads' arrivals lets
 * them run. */
struct sim_mbar {
    int32_t tx;
    uint8_t due, count;
    uint16_t phases;
};
static_assert(sizeof(sim_mbar) == sizeof(uint64_t), "a barrier is 64 bits");
static inline sim_mbar *sim_mbar_of(uint64_t *bar) { return (sim_mbar *)bar; }
static inline void sim_mbar_settle(sim_mbar *m) {
    if (m->due == 0 && m->tx == 0) m->phases++, m->due = m->count;
}
static inline void mbar_init(uint64_t *bar, unsigned count = 1) {
    *sim_mbar_of(bar) = sim_mbar{0, (uint8_t)count, (uint8_t)count, 0};
}
static inline void mbar_arrive(uint64_t *bar) {
    sim_mbar *m = sim_mbar_of(bar);
    m->due--;
    sim_mbar_settle(m);
}
static inline void mbar_expect(uint64_t *bar, unsigned bytes) {
    sim_mbar *m = sim_mbar_of(bar);
    m->tx += (int32_t)bytes;
    m->due--;
    sim_mbar_settle(m);
}
static inline void bulk_copy(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    memcpy(smem, gmem, bytes);
    sim_mbar *m = sim_mbar_of(bar);
    m->tx -= (int32_t)bytes;
    sim_mbar_settle(m);
}
static inline void mbar_wait(uint64_t *bar, unsigned parity = 0) {
    const sim_mbar *m = sim_mbar_of(bar);
    while ((m->phases & 1u) == parity) {
        if (m->tx != 0) {
            fprintf(stderr, "cuda_sim: %d bytes of a transaction barrier never copied\n", (int)m->tx);
            abort();
        }
        sim_yield();
    }
}
#else
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float f2h_round(float f) { return __half2float(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
/* Weights are read once per token and never written by a kernel: the
 * non-coherent path, and no L1 allocation (nothing reuses them). An L2
 * evict-first policy on these loads measured no faster in the decode step
 * and halved the Q6_K head's speed in `moe lab`. */
__device__ __forceinline__ uint4 ldg16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldg8(const void *p) { return __ldg((const uint2 *)p); }
__device__ __forceinline__ uint16_t ldg_u16(const void *p) { return __ldg((const unsigned short *)p); }
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
/* dp4a of unsigned bytes a with signed bytes b */
__device__ __forceinline__ int dp4a_u8s8(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* A reduction that releases this thread's earlier writes at GPU scope, and
 * a load that acquires at GPU scope: a barrier's arrival and its spin. */
__device__ __forceinline__ void add_release_gpu(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* Both at once, returning the old value: a ticket. */
__device__ __forceinline__ unsigned add_acq_rel_gpu(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
/* v is computed before this point: an empty asm that reads and writes it,
 * kept in order with the other volatile asm (pdl_wait), so that work on a
 * kernel's first loads is done before its wait rather than after it. */
__device__ __forceinline__ void pin_reg(unsigned &v) { asm volatile("" : "+r"(v)); }
/* Programmatic dependent launch: no-ops when the launch did not ask for it. */
__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents(void) { asm volatile("griddepcontrol.launch_dependents;"); }
/* 16 bytes from global to shared memory without a register (cp.async.cg),
 * zeros when !valid (gmem must still be a valid address); done for every
 * thread's copies at cp_async_wait_all. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* Pipelines: the copies issued since the last commit are a group; wait
 * until at most PENDING of the newest groups are still in flight. */
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}
/* The same on 64 bits: grid_sync's ticket. */
__device__ __forceinline__ uint64_t add_acq_rel_gpu64(uint64_t *p, uint64_t v) {
    uint64_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}
__device__ __forceinline__ uint64_t load_acquire_gpu64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void spin_pause(void) {}
/* Bulk copies from global to shared memory by the copy engine of the SM
 * (cp.async.bulk, sm_90), counted by a transaction barrier in shared
 * memory: one thread initialises it (mbar_init, then a block barrier),
 * announces the bytes (mbar_expect, before the copies) and issues them;
 * every thread that reads the copies waits (mbar_wait). A barrier used
 * again waits for the parity of its use: 0, 1, 0, ... Addresses and
 * sizes: multiples of 16. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count = 1) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* One of the `count` arrivals a phase of a barrier without transactions
 * waits for (a consumer done with what the phase guarded). */
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem), b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
                 "l"(gmem), "r"(bytes), "r"(b)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity = 0) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
}
/* c += A B on tensor cores, A 16 x 16 and B 16 x 8 bf16 as the PTX
 * fragments (the simulator's twin in cuda_sim.h spells out the layout). */
__device__ __forceinline__ void mma_bf16_m16n8k16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#define FULL_MASK 0xffffffffu

/* The two fp16 values of a 32-bit word, the low one first. */
static __device__ __forceinline__ float2 h2f2(unsigned bits) {
    return make_float2(h2f((uint16_t)bits), h2f((uint16_t)(bits >> 16)));
}

/* Where a format's load() reads a unit's bytes: the weights in global
 * memory (ldg16), or a copy of them in shared memory (gemv_kernel's rows
 * streamed in by bulk copies), which the non-coherent global loads cannot
 * address. */
struct from_global {
    static __device__ __forceinline__ uint4 u4(const void *p) { return ldg16(p); }
    static __device__ __forceinline__ uint2 u8(const void *p) { return ldg8(p); }
    static __device__ __forceinline__ uint16_t u16(const void *p) { return ldg_u16(p); }
};
struct from_shared {
    static __device__ __forceinline__ uint4 u4(const void *p) { return *(const uint4 *)p; }
    static __device__ __forceinline__ uint2 u8(const void *p) { return *(const uint2 *)p; }
    static __device__ __forceinline__ uint16_t u16(const void *p) { return *(const uint16_t *)p; }
};

/* ------------------------------------------------------------ timeline marks */

/* The timeline of one layer inside the graph (cuda_timeline_layer, moe
 * bench --profile): thread 0 of each block of a traced launch records the
 * GPU's global nanosecond timer at these points, block b's at
 * trace[b * TRACE_POINTS + point]. Every other launch has trace NULL: one
 * uniform branch on a kernel argument. */
enum { TRACE_ENTRY, TRACE_WAITED, TRACE_STAGED, TRACE_WORKED, TRACE_EXIT, TRACE_POINTS };

#ifdef MOE_CUDA_SIM
static inline uint64_t global_ns(void) { return (uint64_t)(monotonic_seconds() * 1e9); }
#else
__device__ __forceinline__ uint64_t global_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

__device__ __forceinline__ void trace_mark(uint64_t *trace, int point) {
    if (trace && threadIdx.x == 0) trace[(blockIdx.y * gridDim.x + blockIdx.x) * TRACE_POINTS + point] = global_ns();
}

/* The same once every thread of the block is there (a barrier, traced
 * launches only: the branch is uniform). */
__device__ __forceinline__ void trace_block_mark(uint64_t *trace, int point) {
    if (!trace) return;
    __syncthreads();
    trace_mark(trace, point);
}

/* Sum over the `width` lanes of each aligned group (width a power of two
 * <= 32); every lane of the warp must call it. */
__device__ __forceinline__ float group_sum(float v, int width) {
    for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

/* The last block to arrive at `counter` returns true (and resets it for
 * the next launch); the writes of every block before are visible to it.
 * No fences: the block barrier orders the block's writes before thread 0's
 * ticket, whose release makes them visible with it and whose acquire
 * orders the last block's reads after all of them (PTX's memory model, as
 * the release/acquire grid barrier of `moe lab`, 0.3 us a link cheaper
 * than the fenced one). */
__device__ __forceinline__ bool last_block(unsigned *counter, unsigned n_blocks, int *flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned ticket = add_acq_rel_gpu(counter, 1u);
        *flag = ticket == n_blocks - 1;
        if (*flag) *counter = 0;
    }
    __syncthreads();
    return *flag != 0;
}

/* Every block of a launch whose blocks are all resident meets here (a
 * launch of at most one block a multiprocessor that fits one). The
 * counter only grows, over barriers and launches of the same grid size:
 * a block's ticket says which barrier it arrived at (no block arrives at
 * the next before every block has arrived at this one), and it leaves once
 * the count reaches that barrier's end. One atomic round trip, no reset by
 * a last block; 64 bits never wrap. */
__device__ __forceinline__ void grid_sync(uint64_t *counter, unsigned n_blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint64_t end = (add_acq_rel_gpu64(counter, 1) / n_blocks + 1) * n_blocks;
        while (load_acquire_gpu64(counter) < end) spin_pause();
    }
    __syncthreads();
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits16) { return __int_as_float((int)(bits16 << 16)); }

#endif
