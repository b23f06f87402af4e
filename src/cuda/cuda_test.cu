/*
 * cuda_test.cu — single launches of the decode step's matrix kernels on
 * fresh device buffers, for tests/test_cuda_kernels.c: the weights go
 * through the same upload (and repacking) as a model's, outputs are
 * poisoned with NaN (0xff bytes) before the launch so an element a kernel
 * fails to write cannot pass.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
}

int cuda_test_div_magic(int t, int d) { return div_by_magic(t, d, div_magic(d)); }

typedef struct test_buffers {
    uint8_t *arena;
    void *ptrs[12];
    int n;
} test_buffers;

static moe_status dev_alloc(test_buffers *b, void **p, size_t bytes, moe_error *err) {
    CUDA_CHECK(cudaMalloc(p, bytes));
    b->ptrs[b->n++] = *p;
    return MOE_OK;
}

static void release(test_buffers *b) {
    cudaDeviceSynchronize();
    for (int i = 0; i < b->n; i++) cudaFree(b->ptrs[i]);
    if (b->arena) cudaFree(b->arena);
}

/* Upload n_mats slabs (each n_experts matrices, contiguous GGUF rows). */
static moe_status upload_slabs(test_buffers *b, int n_mats, const int *types, const void *const *data, const int *rows,
                               const int *cols, int n_experts, dmat *out, moe_error *err) {
    uploader u;
    memset(&u, 0, sizeof u);
    u.err = err;
    const uint8_t *srcs[2][256];
    if (n_experts > 256) return moe_error_set(err, MOE_ERR_RANGE, "at most 256 experts in a test");
    for (int pass = 0; pass < 2; pass++) {
        u.dry = pass == 0;
        u.used = 0;
        for (int i = 0; i < n_mats; i++) {
            size_t bytes = quant_row_bytes((moe_type)types[i], cols[i]) * (size_t)rows[i];
            for (int e = 0; e < n_experts; e++) srcs[i & 1][e] = (const uint8_t *)data[i] + e * bytes;
            if (upload_rows(&u, types[i], n_experts, srcs[i & 1], rows[i], cols[i], "test", &out[i]) != MOE_OK)
                return u.status;
        }
        if (pass == 0) {
            CUDA_CHECK(cudaMalloc(&b->arena, u.used));
            u.base = b->arena;
            u.staging_bytes = (size_t)16 << 20;
            u.staging = (uint8_t *)malloc(u.staging_bytes);
            if (!u.staging) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        }
    }
    free(u.staging);
    return MOE_OK;
}

static int test_grid(const cuda_format *f, int kernel, size_t smem, int rows, int lanes) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    return gemv_grid(prop.multiProcessorCount, f->occupancy(kernel, smem), rows, lanes, 0);
}

/* One block stages its input and copies the staged activation out, read
 * through act_view_of as the kernels read it. */
static __global__ void stage_kernel(int kind, const act_in in, bool full_norm, int8_t *codes, float *scales,
                                    int16_t *sums, float *norm_scale) {
    DYN_SMEM(uint8_t, smem);
    float s = 1.0f;
    if (full_norm) stage_act_normed(kind, in, smem, NULL, NULL);
    else s = stage_act(kind, in, smem);
    if (threadIdx.x == blockDim.x - 1) *norm_scale = s; /* the last warp: its scale is computed as the first's */
    const act_view v = act_view_of(kind, smem, in.n);
    const int per = kind == ACT_Q8K ? 256 : 32;
    for (int i = threadIdx.x; i < in.n; i += blockDim.x) {
        codes[i] = v.q[i];
        if (i % per == 0) scales[i / per] = v.d[i / per];
        if (kind == ACT_Q8K && i % 16 == 0) sums[i / 16] = v.s16[i / 16];
    }
}

moe_status cuda_test_stage(moe_type dot_type, const float *x, const float *norm, float eps, int n, bool full_norm,
                           int8_t *codes, float *scales, int16_t *sums, float *norm_scale, moe_error *err) {
    const int kind = dot_type == MOE_TYPE_Q8_K ? ACT_Q8K : ACT_Q80, per = kind == ACT_Q8K ? 256 : 32;
    const size_t smem = gemv_smem(kind, n);
    if ((dot_type != MOE_TYPE_Q8_K && dot_type != MOE_TYPE_Q8_0) || n <= 0 || n % per || smem > 48 * 1024)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "stage test: %d values as type %d", n, (int)dot_type);
    const bool has_sums = kind == ACT_Q8K && sums;
    test_buffers b;
    memset(&b, 0, sizeof b);
    float *dx = NULL, *dnorm = NULL, *dscales = NULL, *dnorm_scale = NULL;
    int8_t *dcodes = NULL;
    int16_t *dsums = NULL;
    moe_status st = dev_alloc(&b, (void **)&dx, (size_t)n * 4, err);
    if (st == MOE_OK && norm) st = dev_alloc(&b, (void **)&dnorm, (size_t)n * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dcodes, (size_t)n, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dscales, (size_t)n / per * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dsums, (size_t)n / 16 * 2, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dnorm_scale, 4, err);
    if (st == MOE_OK) {
        cudaError_t e = cudaMemcpy(dx, x, (size_t)n * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess && norm) e = cudaMemcpy(dnorm, norm, (size_t)n * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemset(dcodes, 0xff, (size_t)n);
        if (e == cudaSuccess) e = cudaMemset(dscales, 0xff, (size_t)n / per * 4);
        if (e == cudaSuccess) e = cudaMemset(dsums, 0xff, (size_t)n / 16 * 2);
        if (e == cudaSuccess) {
            LAUNCH(stage_kernel, 1, GEMV_THREADS, smem, 0, kind, act_in{dx, dnorm, eps, n}, full_norm, dcodes, dscales, dsums,
                   dnorm_scale);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaMemcpy(codes, dcodes, (size_t)n, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(scales, dscales, (size_t)n / per * 4, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess && has_sums) e = cudaMemcpy(sums, dsums, (size_t)n / 16 * 2, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(norm_scale, dnorm_scale, 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = moe_error_set(err, MOE_ERR_IO, "stage test (%d values): %s", n, cudaGetErrorName(e));
        }
    }
    release(&b);
    return st;
}

bool cuda_test_expert_codes(moe_type type) {
    const cuda_format *f = cuda_format_of(type);
    return f && f->expert_codes();
}

bool cuda_test_gemv_streams(moe_type type, int cols) {
    const cuda_format *f = cuda_format_of(type);
    cudaDeviceProp prop;
    if (!f || cols % f->block || cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
    /* the rows' layout as the upload makes it (cuda_model.cu), at an aligned address */
    const int blocks = cols / f->block;
    dmat w;
    memset(&w, 0, sizeof w);
    w.rows = 1, w.cols = cols, w.units = blocks * f->units;
    w.row_stride = (int64_t)align16((size_t)blocks * f->body), w.meta_row_stride = (int64_t)blocks * f->meta;
    return gemv_stream_stages(w, pick_lanes(w.units, f->n), f->n, f->act, prop.sharedMemPerBlockOptin, 0) > 0;
}

moe_status cuda_test_gemv(moe_type type, int rows, int cols, const void *w, const float *x, float *y, bool stream,
                          moe_error *err) {
    const cuda_format *f = cuda_format_of(type);
    if (!f) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d", (int)type);
    test_buffers b;
    memset(&b, 0, sizeof b);
    dmat m;
    int t = type;
    float *dx = NULL, *dy = NULL;
    moe_status st = upload_slabs(&b, 1, &t, &w, &rows, &cols, 1, &m, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dx, (size_t)cols * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dy, (size_t)rows * 4, err);
    if (st == MOE_OK) {
        gemv_args a;
        memset(&a, 0, sizeof a);
        a.in = act_in{dx, NULL, 0.0f, cols};
        a.seg[0].w = m;
        a.seg[0].out = dy;
        a.n_seg = 1;
        a.seg_end[0] = rows;
        a.lanes = pick_lanes(m.units, f->n);
        size_t smem = gemv_smem(f->act, cols);
        int grid = test_grid(f, 0, smem, rows, a.lanes);
        size_t optin = 0;
        if (stream) {
            /* the rows through shared memory: every shape that can, each
             * block with more than twice as many tiles as stages where the
             * rows allow, so that every stage is refilled and waited for at
             * both parities; 2 stages (the fewest) for rows of 4 n + 3 */
            cudaDeviceProp prop;
            cudaGetDeviceProperties(&prop, 0);
            optin = prop.sharedMemPerBlockOptin;
            a.stages = gemv_stream_stages(m, a.lanes, f->n, f->act, optin, 1);
            if (a.stages && rows % 4 == 3) a.stages = 2;
            smem = gemv_stream_layout_of(m, a.lanes, f->act, cols, a.stages).total;
            const int tiles = (rows + gemv_tile_rows(a.lanes) - 1) / gemv_tile_rows(a.lanes);
            grid = tiles / (2 * a.stages + 1) > 1 ? tiles / (2 * a.stages + 1) : 1;
        }
        cudaError_t e = cudaMemcpy(dx, x, (size_t)cols * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemset(dy, 0xff, (size_t)rows * 4);
        if (e == cudaSuccess && stream) e = a.stages ? cuda_allow_stream_smem(optin) : cudaErrorInvalidValue;
        else if (e == cudaSuccess) e = cuda_allow_smem_all((int)smem > 48 * 1024 ? (int)smem : 48 * 1024);
        if (e == cudaSuccess) {
            f->gemv(&a, grid, smem, 0, false);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaMemcpy(y, dy, (size_t)rows * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = moe_error_set(err, MOE_ERR_IO, "gemv test (%s, %d x %d): %s", f->name, rows, cols, cudaGetErrorName(e));
        }
    }
    release(&b);
    return st;
}

/* Lets its dependent launch at once, then, after `ns`, writes the true ids
 * over the wrong ones at ids: ffn_down launched behind it reads the wrong
 * ids before its wait (its guess) and must correct them after it. */
static __global__ void late_ids_kernel(int *ids, const int *truth, int k, uint64_t ns) {
    pdl_launch_dependents();
    const uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
    if ((int)threadIdx.x < k) ids[threadIdx.x] = truth[threadIdx.x];
}

/* ffn_down on stream st behind late_ids_kernel, its ids at dids wrong (each
 * the next expert) until that launch ends; the true ones from dtruth. */
static cudaError_t down_behind_late_ids(const cuda_format *fd, const ffn_down_args *da, int grid, size_t smem,
                                        int *dids, int *dtruth, const int32_t *ids, int k, int n_experts,
                                        cudaStream_t st) {
    int wrong[MAX_EXPERTS_USED];
    for (int j = 0; j < k; j++) wrong[j] = (ids[j] + 1) % n_experts;
    cudaError_t e = cudaMemcpy(dtruth, ids, (size_t)k * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(dids, wrong, (size_t)k * 4, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
    LAUNCH(late_ids_kernel, 1, 32, 0, st, dids, dtruth, k, (uint64_t)50000);
    fd->down(da, grid, smem, st, true);
    return cudaGetLastError();
}

moe_status cuda_test_experts(const cuda_test_expert_io *io, moe_error *err) {
    const cuda_format *f = cuda_format_of(io->type), *fd = cuda_format_of(io->down_type);
    if (!f || !fd)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d or %d", (int)io->type,
                             (int)io->down_type);
    const int k = io->k, n_ff = io->n_ff, n_embd = io->n_embd, n_experts = io->n_experts;
    if (k > MAX_EXPERTS_USED) return moe_error_set(err, MOE_ERR_RANGE, "k = %d > %d", k, MAX_EXPERTS_USED);
    test_buffers b;
    memset(&b, 0, sizeof b);
    dmat m[3];
    int types[3] = {io->type, io->type, io->down_type}, rows[3] = {n_ff, n_ff, n_embd}, cols[3] = {n_embd, n_embd, n_ff};
    const void *data[3] = {io->gate, io->up, io->down};
    float *dx = NULL, *dh = NULL, *dy = NULL, *dw = NULL, *dlogits = NULL;
    int *dids = NULL, *dtruth = NULL;
    cudaStream_t stream = NULL;
    moe_status st = upload_slabs(&b, 3, types, data, rows, cols, n_experts, m, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dx, (size_t)n_embd * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dh, (size_t)k * n_ff * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dy, (size_t)n_embd * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dw, (size_t)k * 4, err);
    if (st == MOE_OK) st = dev_alloc(&b, (void **)&dids, (size_t)k * 4, err);
    if (st == MOE_OK && io->logits) st = dev_alloc(&b, (void **)&dlogits, (size_t)n_experts * 4, err);
    if (st == MOE_OK && !io->logits) st = dev_alloc(&b, (void **)&dtruth, (size_t)k * 4, err);
    if (st == MOE_OK) {
        const route_spec route = {dlogits, n_experts, k, io->sigmoid, 1, 1.0f};
        ffn_up_args ua;
        memset(&ua, 0, sizeof ua);
        ua.in = act_in{dx, NULL, 0.0f, n_embd};
        ua.gate = m[0], ua.up = m[1], ua.n_routed = k, ua.ids = dids, ua.h = dh;
        if (io->logits) ua.route = route, ua.route_ids = dids, ua.route_w = dw; /* ffn_down reads what ffn_up routed */
        ua.h_shared_off = k * n_ff;
        ua.lanes = up_lanes(f, m[0].units, io->lanes_shift);
        size_t su = gemv_smem(f->act, n_embd);
        ffn_down_args da;
        memset(&da, 0, sizeof da);
        da.in = act_in{dh, NULL, 0.0f, k * n_ff};
        da.down = m[2], da.n_routed = k, da.ids = dids, da.route_w = dw, da.routed_act_stride = n_ff, da.x = dy;
        da.lanes = down_lanes(fd, k * m[2].units, io->lanes_shift);
        size_t sd = gemv_smem(fd->act, k * n_ff);
        size_t most = su > sd ? su : sd;
        cudaError_t e = cudaMemcpy(dx, io->x, (size_t)n_embd * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(dy, io->y0, (size_t)n_embd * 4, cudaMemcpyHostToDevice);
        if (io->logits) { /* routed on the GPU: expert 0 and NaN weights unless ffn_up publishes its routing */
            if (e == cudaSuccess) e = cudaMemset(dw, 0xff, (size_t)k * 4);
            if (e == cudaSuccess) e = cudaMemset(dids, 0, (size_t)k * 4);
            if (e == cudaSuccess) e = cudaMemcpy(dlogits, io->logits, (size_t)n_experts * 4, cudaMemcpyHostToDevice);
        } else {
            if (e == cudaSuccess) e = cudaMemcpy(dw, io->weights, (size_t)k * 4, cudaMemcpyHostToDevice);
            if (e == cudaSuccess) e = cudaMemcpy(dids, io->ids, (size_t)k * 4, cudaMemcpyHostToDevice);
        }
        if (e == cudaSuccess) e = cudaMemset(dh, 0xff, (size_t)k * n_ff * 4);
        if (e == cudaSuccess) e = cuda_allow_smem_all((int)most > 48 * 1024 ? (int)most : 48 * 1024);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) {
            f->up(&ua, test_grid(f, 1, su, k * n_ff, ua.lanes), su, 0, false);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaMemcpy(io->h, dh, (size_t)k * n_ff * 4, cudaMemcpyDeviceToHost);
        const int down_grid = test_grid(fd, 2, sd, n_embd, da.lanes);
        if (e == cudaSuccess && io->logits) {
            fd->down(&da, down_grid, sd, stream, false);
            e = cudaGetLastError();
        } else if (e == cudaSuccess) { /* given ids: also the path of a wrong guess */
            e = down_behind_late_ids(fd, &da, down_grid, sd, dids, dtruth, io->ids, k, n_experts, stream);
        }
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e == cudaSuccess) e = cudaMemcpy(io->y, dy, (size_t)n_embd * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = moe_error_set(err, MOE_ERR_IO, "expert test (%s/%s): %s", f->name, fd->name, cudaGetErrorName(e));
        }
    }
    release(&b);
    if (stream) cudaStreamDestroy(stream);
    return st;
}
