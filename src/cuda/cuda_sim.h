/*
 * cuda_sim.h — a CPU simulator of the small part of CUDA the backend uses,
 * so its kernels and its decode step run (slowly) on machines without a
 * GPU. Built only with -DMOE_CUDA_SIM=ON (see CMakeLists.txt); the real
 * build never includes this file.
 *
 * Model: a kernel launch runs its blocks one after another; the threads of
 * a block are fibers (one stack each), switching only at __syncthreads,
 * __syncwarp and warp shuffles, which are barriers of the block or of the
 * warp. A warp's fibers run round-robin up to its next block barrier
 * before the next warp's do, and a cp.async copy lands only when its
 * thread waits for it (NaNs until then), so a stage read too early or
 * refilled too soon reads NaNs. Shared memory is therefore plain static storage
 * (`__shared__` is `static`: blocks never overlap) plus one dynamic buffer.
 * Atomics need no locking (fibers are not preemptive). A stream is a
 * queue that runs at once; capturing a stream records closures, and a
 * "graph" replays them. cudaGetDeviceCount reports one device only when
 * the environment has MOE_CUDA_SIM=1, so a simulator build still runs on
 * the CPU unless a test asks for the simulated GPU.
 *
 * What it cannot show: speed, races between warps that the fiber order
 * happens to serialise, memory-model subtleties, and anything about the
 * real compiler. It shows wrong indices, wrong staging, wrong reductions
 * and wrong orchestration, which is most of what goes wrong first.
 */
#ifndef MOE_CUDA_SIM_H
#define MOE_CUDA_SIM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "quant/block.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
/* CUDA's alignments: a 16-byte load from an address that is not a
 * multiple of 16 faults on the GPU, and under -fsanitize=alignment (the
 * CI's simulator build) it stops the simulator too. */
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(8) float2 { float x, y; };
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

/* ---------------------------------------------------------------- runtime API */

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
};
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
#define cudaStreamNonBlocking 1
typedef struct sim_stream *cudaStream_t;
typedef struct sim_event *cudaEvent_t;
typedef struct sim_graph *cudaGraph_t;
typedef struct sim_graph *cudaGraphExec_t;

struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount;
    int l2CacheSize;
    size_t sharedMemPerBlockOptin;
    size_t totalGlobalMem;
    int major, minor;
    int memoryClockRate, memoryBusWidth;
};

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T> cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
template <class T> cudaError_t cudaMallocHost(T **p, size_t bytes) { return cudaMallocHost((void **)p, bytes); }
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *dst, int v, size_t n);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
template <class F> cudaError_t cudaFuncSetAttribute(F *, cudaFuncAttribute, int) { return cudaSuccess; }
template <class F> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F *, int, size_t) {
    *n = 2;
    return cudaSuccess;
}
/* ---------------------------------------------------------------- execution */

extern dim3 sim_blockDim, sim_gridDim;
const dim3 &sim_thread_idx(void);
const dim3 &sim_block_idx(void);
#define threadIdx (sim_thread_idx())
#define blockIdx (sim_block_idx())
#define blockDim sim_blockDim
#define gridDim sim_gridDim

/* together: every block resident at once (a launch whose blocks meet at
 * grid barriers), block b starting a pass of the scheduler after block b -
 * 1, each with its own dynamic shared memory; such kernels keep no
 * `__shared__` variables (those are static here). Otherwise blocks run one
 * after another. */
void sim_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body, bool together = false);
void *sim_dyn_smem(void);
void sim_yield(void);
void sim_cp_async(void *smem, const void *gmem, bool valid);
void sim_cp_async_commit(void);
void sim_cp_async_wait(int pending);
void sim_cp_async_wait_all(void);
void sim_syncthreads(void);
void sim_syncwarp(void);
uint64_t sim_warp_exchange(uint64_t mine, int src_lane);

static inline void __syncthreads(void) { sim_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; sim_syncwarp(); }
static inline void __threadfence(void) {}

template <class T> static inline T sim_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = sim_warp_exchange(bits, src);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    int lane = (int)(threadIdx.x & 31);
    (void)width;
    return sim_shfl(v, lane ^ mask);
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    int lane = (int)(threadIdx.x & 31);
    return sim_shfl(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, int delta, int width = 32) {
    int lane = (int)(threadIdx.x & 31);
    int src = (lane & (width - 1)) + delta < width ? lane + delta : lane;
    return sim_shfl(v, src);
}

/* redux.sync: v folded over the warp by `keep` (the value to keep of two) */
template <class Keep> static inline unsigned sim_warp_reduce(unsigned v, Keep keep) {
    const int lane = (int)(threadIdx.x & 31);
    for (int off = 16; off > 0; off >>= 1) v = keep(v, sim_shfl(v, lane ^ off));
    return v;
}
static inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    return sim_warp_reduce(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
static inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    return sim_warp_reduce(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}

/* The lanes whose v equals this lane's: every lane posts its value, the
 * warp meets, every lane reads all 32 (two warp barriers, not 32 shuffles). */
template <class T> static inline unsigned __match_any_sync(unsigned, T v) {
    static T posted[32][32]; /* [warp][lane]: blocks run one at a time */
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    posted[warp][lane] = v;
    sim_syncwarp();
    unsigned same = 0;
    for (int src = 0; src < 32; src++) same |= (posted[warp][src] == v ? 1u : 0u) << src;
    sim_syncwarp();
    return same;
}

/* ---------------------------------------------------------------- intrinsics */

template <class T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <class T> static inline T atomicMin(T *p, T v) { T old = *p; *p = v < old ? v : old; return old; }
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline int __float2int_rn(float f) { return (int)nearbyintf(f); }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
/* Two 16-bit halves of a times bytes 0, 1 (lo) or 2, 3 (hi) of b, signed. */
static inline int __dp2a_lo(int a, int b, int c) { return c + (int16_t)a * (int8_t)b + (int16_t)(a >> 16) * (int8_t)(b >> 8); }
static inline int __dp2a_hi(int a, int b, int c) {
    return c + (int16_t)a * (int8_t)(b >> 16) + (int16_t)(a >> 16) * (int8_t)(b >> 24);
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
    return r;
}

/* mma.sync.m16n8k16 with bf16 operands and f32 sums: c += A B for the
 * warp's 16 x 16 A and 16 x 8 B held as PTX fragments (lane 4 g + t: a[0]
 * row g, columns 2t and 2t + 1 (low half first), a[1] row g + 8, a[2] and
 * a[3] the same 8 columns on; b[0] rows 2t and 2t + 1 of column g, b[1] 8
 * rows on; c rows g and g + 8, columns 2t and 2t + 1). Every lane posts its
 * fragments, the warp meets, each lane sums its four outputs. */
static inline void mma_bf16_m16n8k16(float c[4], const unsigned a[4], const unsigned b[2]) {
    static unsigned posted[32][32][6]; /* [warp][lane]: blocks run one at a time */
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    unsigned *mine = posted[warp][lane];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0], mine[5] = b[1];
    sim_syncwarp();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        const unsigned *p = posted[warp][l];
        for (int h = 0; h < 2; h++) {
            const int k = 2 * t + h;
            A[g][k] = __uint_as_float(p[0] >> (16 * h) << 16), A[g + 8][k] = __uint_as_float(p[1] >> (16 * h) << 16);
            A[g][k + 8] = __uint_as_float(p[2] >> (16 * h) << 16);
            A[g + 8][k + 8] = __uint_as_float(p[3] >> (16 * h) << 16);
            B[k][g] = __uint_as_float(p[4] >> (16 * h) << 16), B[k + 8][g] = __uint_as_float(p[5] >> (16 * h) << 16);
        }
    }
    sim_syncwarp();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        for (int k = 0; k < 16; k++) c[i] += A[row][k] * B[k][col];
    }
}

#endif
