/*
 * cublas_sim.h — the few cuBLAS calls of the batched prefill (prefill.cu)
 * for the CPU simulator of the GPU (cuda_sim.h), so that CI runs the
 * prefill's host side and kernels too: GemmEx and GemmGroupedBatchedEx on
 * bf16 or f32 column-major operands, summed in float as CUBLAS_COMPUTE_32F
 * does, the output f32 or bf16 (rounded to nearest even). Streams run at
 * once in the simulator, so a call is its product, done on return.
 */
#ifndef MOE_CUBLAS_SIM_H
#define MOE_CUBLAS_SIM_H

#include "cuda/dequant.cuh" /* f32_to_bf16_bits; bf16_bits_to_f32 from cuda_compat.cuh */

#define CUBLAS_VERSION 130100 /* as the CUDA 13 the real build uses: it has the grouped call */

typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef struct cublas_sim_handle *cublasHandle_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (cublasHandle_t)malloc(1);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
static inline const char *cublasGetStatusName(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}

/* Element (i, j) of a column-major matrix of `type` at p, leading dimension ld. */
static inline float cublas_sim_at(const void *p, cudaDataType_t type, int64_t i, int64_t j, int ld) {
    const int64_t at = i + j * ld;
    return type == CUDA_R_32F ? ((const float *)p)[at] : bf16_bits_to_f32(((const uint16_t *)p)[at]);
}

static inline void cublas_sim_put(void *p, cudaDataType_t type, int64_t at, float v) {
    if (type == CUDA_R_32F) ((float *)p)[at] = v;
    else ((uint16_t *)p)[at] = f32_to_bf16_bits(v);
}

/* C = alpha op(A) op(B) + beta C: op(A) m x k, op(B) k x n, C m x n. */
static inline cublasStatus_t cublas_sim_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                             float alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                                             cudaDataType_t bt, int ldb, float beta, void *C, cudaDataType_t ct,
                                             int ldc) {
    if ((at != CUDA_R_32F && at != CUDA_R_16BF) || bt != at || (ct != CUDA_R_32F && ct != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++)
                acc += (ta == CUBLAS_OP_N ? cublas_sim_at(A, at, i, p, lda) : cublas_sim_at(A, at, p, i, lda)) *
                       (tb == CUBLAS_OP_N ? cublas_sim_at(B, bt, p, j, ldb) : cublas_sim_at(B, bt, j, p, ldb));
            const float old = beta != 0.0f ? beta * cublas_sim_at(C, ct, i, j, ldc) : 0.0f;
            cublas_sim_put(C, ct, i + (int64_t)j * ldc, alpha * acc + old);
        }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
    return cublas_sim_gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, C, ct,
                           ldc);
}

/* As cuBLAS: group i's parameters for each of its group_size[i] problems. */
static inline cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t, const cublasOperation_t ta[], const cublasOperation_t tb[], const int m[], const int n[],
    const int k[], const void *alpha, const void *const A[], cudaDataType_t at, const int lda[], const void *const B[],
    cudaDataType_t bt, const int ldb[], const void *beta, void *const C[], cudaDataType_t ct, const int ldc[],
    int group_count, const int group_size[], cublasComputeType_t) {
    if (ct != at) return CUBLAS_STATUS_NOT_SUPPORTED; /* as cuBLAS: no bf16 x bf16 -> f32 */
    for (int g = 0, idx = 0; g < group_count; g++)
        for (int p = 0; p < group_size[g]; p++, idx++) {
            const cublasStatus_t st =
                cublas_sim_gemm(ta[g], tb[g], m[g], n[g], k[g], ((const float *)alpha)[g], A[idx], at, lda[g], B[idx],
                                bt, ldb[g], ((const float *)beta)[g], C[idx], ct, ldc[g]);
            if (st != CUBLAS_STATUS_SUCCESS) return st;
        }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
