/*
 * cuda_sim.cu — the CPU simulator behind cuda_sim.h (simulator builds only;
 * empty for nvcc).
 *
 * Fibers: each simulated thread has its own stack, entered once through
 * makecontext/swapcontext and afterwards switched with _setjmp/_longjmp,
 * which (unlike swapcontext) makes no system call. Fibers persist across
 * blocks and launches: fiber i runs thread i of every block.
 */
#ifdef MOE_CUDA_SIM
#include "cuda/cuda_sim.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

extern "C" {
#include "common/clock.h"
}

dim3 sim_blockDim, sim_gridDim;

enum { SIM_STACK = 256 * 1024, SIM_MAX_THREADS = 1024, SIM_MAX_FIBERS = 16384, SIM_SMEM = 232448 };
enum { SIM_STUCK_PASSES = 1000 }; /* passes without progress that make a deadlock */

struct sim_copy {
    void *dst;
    unsigned char bytes[16];
    int group;
};

struct sim_fiber {
    jmp_buf jb;
    ucontext_t uc;
    char *stack;
    dim3 tid, bid;
    int block; /* its block among those running together */
    bool done;
    std::vector<sim_copy> copies; /* cp.async copies not yet landed, oldest first */
    int open_group;               /* the group the next copy joins (cp_async_commit closes it) */
};

struct sim_barrier {
    int arrived, live;
    unsigned gen;
};

/* What runs now: `n_blocks` blocks of `block_threads` threads; fiber
 * b * block_threads + t is thread t of block b. */
static sim_fiber *fibers[SIM_MAX_FIBERS];
static int n_fibers, block_threads;
static sim_fiber *cur;
static jmp_buf sched_jb;
static std::function<void()> *cur_body;
static std::vector<sim_barrier> block_bars, warp_bars; /* [block], [block * 32 + warp] */
static std::vector<uint64_t> warp_slots;               /* [fiber] */
static std::vector<unsigned char *> dyn_smem;          /* [block] */

const dim3 &sim_thread_idx(void) { return cur->tid; }

/* cp.async: the destination holds NaNs (all ones) from the issue until
 * the thread waits for the copy's group, so a kernel that reads a stage
 * before waiting for it, or refills a buffer other warps still read,
 * reads them. The source is read at the issue (the kernels copy
 * read-only data). */
void sim_cp_async(void *smem, const void *gmem, bool valid) {
    memset(smem, 0xff, 16);
    sim_copy c;
    c.dst = smem, c.group = cur->open_group;
    if (valid) memcpy(c.bytes, gmem, 16);
    else memset(c.bytes, 0, 16);
    cur->copies.push_back(c);
}
void sim_cp_async_commit(void) { cur->open_group++; }
void sim_cp_async_wait(int pending) {
    std::vector<sim_copy> &q = cur->copies;
    size_t landed = 0;
    while (landed < q.size() && q[landed].group < cur->open_group - pending) {
        memcpy(q[landed].dst, q[landed].bytes, 16);
        landed++;
    }
    q.erase(q.begin(), q.begin() + (long)landed);
}
void sim_cp_async_wait_all(void) {
    sim_cp_async_commit();
    sim_cp_async_wait(0);
}
const dim3 &sim_block_idx(void) { return cur->bid; }
void *sim_dyn_smem(void) { return dyn_smem[cur->block]; }

static int linear_tid(const sim_fiber *f) {
    return (int)(f->tid.x + sim_blockDim.x * (f->tid.y + sim_blockDim.y * f->tid.z));
}
static sim_barrier *warp_bar_of(const sim_fiber *f) { return &warp_bars[f->block * 32 + linear_tid(f) / 32]; }

static void yield_to_scheduler(void) {
    if (_setjmp(cur->jb) == 0) _longjmp(sched_jb, 1);
}
void sim_yield(void) { yield_to_scheduler(); }

static unsigned long releases; /* barriers released and fibers ended: what lets a waiting fiber on */

static void barrier_release_if_complete(sim_barrier *b) {
    if (b->arrived > 0 && b->arrived >= b->live) {
        b->arrived = 0;
        b->gen++;
        releases++;
    }
}

static void barrier_wait(sim_barrier *b) {
    unsigned gen = b->gen;
    b->arrived++;
    barrier_release_if_complete(b);
    while (b->gen == gen) yield_to_scheduler();
}

void sim_syncthreads(void) { barrier_wait(&block_bars[cur->block]); }
void sim_syncwarp(void) { barrier_wait(warp_bar_of(cur)); }

uint64_t sim_warp_exchange(uint64_t mine, int src_lane) {
    const int warp = linear_tid(cur) / 32, first = cur->block * block_threads + warp * 32;
    warp_slots[first + (linear_tid(cur) & 31)] = mine;
    barrier_wait(warp_bar_of(cur));
    uint64_t got = warp_slots[first + (src_lane & 31)];
    barrier_wait(warp_bar_of(cur));
    return got;
}

static void fiber_main(void) {
    sim_fiber *self = cur;
    if (_setjmp(self->jb) == 0) _longjmp(sched_jb, 1);
    for (;;) {
        (*cur_body)();
        self = cur;
        if (!self->copies.empty()) {
            fprintf(stderr, "cuda_sim: a thread ended with %zu cp.async copies it never waited for\n", self->copies.size());
            abort();
        }
        self->done = true;
        releases++;
        sim_barrier *b = &block_bars[self->block], *w = warp_bar_of(self);
        b->live--;
        barrier_release_if_complete(b);
        w->live--;
        barrier_release_if_complete(w);
        yield_to_scheduler();
    }
}

static void ensure_fibers(int n) {
    while (n_fibers < n) {
        sim_fiber *f = new sim_fiber();
        f->stack = (char *)malloc(SIM_STACK);
        if (!f->stack) {
            fprintf(stderr, "cuda_sim: out of memory for fiber stacks\n");
            abort();
        }
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = SIM_STACK;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, fiber_main, 0);
        cur = f;
        static ucontext_t here;
        if (_setjmp(sched_jb) == 0) swapcontext(&here, &f->uc);
        fibers[n_fibers++] = f;
    }
}

/* ---------------------------------------------------------------- streams, graphs */

struct sim_graph {
    std::vector<std::function<void()>> ops;
};
static bool capturing;
static sim_graph *capture;

/* Fibers lo .. hi - 1 (a warp) round-robin for as long as they get on:
 * until a round releases no barrier, when every one of them waits for
 * another warp (a block barrier, a spin) or has ended. A warp thus runs
 * ahead of the others up to its next block barrier, as a GPU's warps may,
 * and a kernel that refills shared memory other warps still read without
 * a barrier between shows it. Returns how many have not ended. */
static int run_warp(int lo, int hi) {
    for (unsigned long before = releases - 1; before != releases;) {
        before = releases;
        for (int i = lo; i < hi; i++) {
            if (fibers[i]->done) continue;
            cur = fibers[i];
            if (_setjmp(sched_jb) == 0) _longjmp(cur->jb, 1);
        }
    }
    int left = 0;
    for (int i = lo; i < hi; i++) left += !fibers[i]->done;
    return left;
}

/* The blocks `bids` at once, a warp after another (run_warp). */
static void run_blocks(const std::vector<dim3> &bids, int n, std::function<void()> &body) {
    const int nb = (int)bids.size(), total = nb * n;
    if (total > SIM_MAX_FIBERS) {
        fprintf(stderr, "cuda_sim: %d blocks of %d threads at once\n", nb, n);
        abort();
    }
    ensure_fibers(total);
    cur_body = &body;
    block_threads = n;
    block_bars.assign(nb, sim_barrier{0, n, 0});
    warp_bars.assign((size_t)nb * 32, sim_barrier{0, 0, 0});
    warp_slots.assign(total, 0);
    while ((int)dyn_smem.size() < nb) dyn_smem.push_back((unsigned char *)aligned_alloc(16, SIM_SMEM));
    for (int b = 0; b < nb; b++)
        for (int w = 0; w < (n + 31) / 32; w++) warp_bars[b * 32 + w].live = n - 32 * w < 32 ? n - 32 * w : 32;
    for (int i = 0; i < total; i++) {
        sim_fiber *f = fibers[i];
        const int t = i % n;
        f->done = false;
        f->open_group = 0;
        f->block = i / n;
        f->bid = bids[i / n];
        f->tid = dim3(t % sim_blockDim.x, (t / sim_blockDim.x) % sim_blockDim.y, t / (sim_blockDim.x * sim_blockDim.y));
    }
    /* Block b starts at pass b, as a GPU hands out blocks over time: a
     * block that reads what others write without waiting for them reads
     * it before they have run. Passes over every started warp that release
     * nothing and end no fiber, once all have started, leave every thread
     * waiting for another (spinning, say): a deadlock on a GPU too. */
    for (int remaining = total, stuck = 0, started = 1; remaining > 0; started += started < nb) {
        const unsigned long before = releases;
        remaining = (nb - started) * n;
        for (int b = 0; b < started; b++)
            for (int w = b * n; w < (b + 1) * n; w += 32) remaining += run_warp(w, w + 32 < (b + 1) * n ? w + 32 : (b + 1) * n);
        stuck = releases == before && started == nb ? stuck + 1 : 0;
        if (stuck == SIM_STUCK_PASSES) {
            fprintf(stderr, "cuda_sim: every thread of the launch waits for another (a deadlock)\n");
            abort();
        }
    }
}

static void run_kernel(dim3 grid, dim3 block, std::function<void()> &body, bool together) {
    int n = (int)(block.x * block.y * block.z);
    if (n > SIM_MAX_THREADS) {
        fprintf(stderr, "cuda_sim: block of %d threads\n", n);
        abort();
    }
    sim_gridDim = grid;
    sim_blockDim = block;
    std::vector<dim3> bids;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                bids.push_back(dim3(x, y, z));
                if (!together) {
                    run_blocks(bids, n, body);
                    bids.clear();
                }
            }
    if (together) run_blocks(bids, n, body);
}

void sim_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body, bool together) {
    if (smem > SIM_SMEM) {
        fprintf(stderr, "cuda_sim: %zu bytes of dynamic shared memory\n", smem);
        abort();
    }
    if (capturing) {
        capture->ops.push_back([=]() mutable { run_kernel(grid, block, body, together); });
        return;
    }
    run_kernel(grid, block, body, together);
}

static void enqueue(std::function<void()> op) {
    if (capturing) capture->ops.push_back(op);
    else op();
}

const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation"
                                          : e == cudaErrorNoDevice          ? "cudaErrorNoDevice"
                                                                             : "cudaErrorInvalidValue";
}
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "simulated error"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) {
    const char *on = getenv("MOE_CUDA_SIM");
    *n = on && on[0] == '1' ? 1 : 0;
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "moe.c CUDA simulator (CPU)");
    /* MOE_SIM_SMS: more multiprocessors make the kernels split work the
     * way they do on a real GPU (attention over several splits and their
     * merge); 4 keeps the simulation quick and is the fewest that fit the
     * one-launch FFN of the small-256 test model in shared memory. */
    const char *sms = getenv("MOE_SIM_SMS");
    p->multiProcessorCount = sms && atoi(sms) > 0 ? atoi(sms) : 4;
    p->l2CacheSize = 1 << 20;
    p->sharedMemPerBlockOptin = SIM_SMEM;
    p->totalGlobalMem = (size_t)8 << 30;
    p->major = 9;
    return cudaSuccess;
}
static size_t allocated;
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = (size_t)8 << 30;
    *free_bytes = *total_bytes - allocated;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    size_t rounded = (bytes + 255) / 256 * 256 + 256;
    *p = aligned_alloc(256, rounded);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xA5, rounded); /* garbage, like fresh device memory */
    allocated += rounded;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t) {
    if (capturing) enqueue([=]() { memmove(dst, src, n); });
    else memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *dst, int v, size_t n) { memset(dst, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t) {
    enqueue([=]() { memset(dst, v, n); });
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)0x1; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
struct sim_event {
    double t;
};
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new sim_event{0}; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    enqueue([=]() { e->t = 1e3 * monotonic_seconds(); });
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)(b->t - a->t); return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    capture = new sim_graph();
    capturing = true;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    capturing = false;
    *g = capture;
    capture = NULL;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = new sim_graph(*g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    for (auto &op : e->ops) op();
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
#endif
