/* cpu_matmul.c — see cpu_matmul.h. */
#include "cpu/cpu_matmul.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"

/* Weight rows per task: enough to amortise the hand-out; small enough that a
 * 768-row expert matrix still spreads over 16+ threads. */
#define ROWS_PER_TASK 16

typedef struct quantize_job {
    const quant_format *fmt;
    const float *x;
    int64_t cols, stride;
    quantized_rows *q;
} quantize_job;

static void quantize_one(void *ctx, int64_t row, int worker) {
    quantize_job *job = ctx;
    job->fmt->quantize(job->x + row * job->stride, job->q->data + row * job->q->row_bytes, job->cols);
}

int cpu_quantize_rows(thread_pool *pool, quantized_rows *q, moe_type weight_type, const float *x, int64_t n_rows,
                      int64_t cols, int64_t stride) {
    const quant_format *dot = quant_format_of(quant_format_of(weight_type)->dot_type);
    size_t row_bytes = quant_row_bytes(dot->type, cols);
    size_t need = (size_t)n_rows * row_bytes;
    if (need > q->capacity) {
        uint8_t *grown = realloc(q->data, need);
        if (!grown) return -1;
        q->data = grown;
        q->capacity = need;
    }
    q->type = dot->type;
    q->n_rows = n_rows;
    q->cols = cols;
    q->row_bytes = row_bytes;
    quantize_job job = {dot, x, cols, stride, q};
    if (n_rows == 1) quantize_one(&job, 0, 0);
    else thread_pool_run(pool, n_rows, quantize_one, &job);
    return 0;
}

void quantized_rows_free(quantized_rows *q) {
    free(q->data);
    memset(q, 0, sizeof *q);
}

typedef struct matmul_job {
    const matrix *w;
    const quantized_rows *x;
    float *y;
    int64_t y_stride;
    quant_dot_fn dot;
    cpu_dot_rows_fn dot_rows; /* or NULL */
} matmul_job;

static void matmul_rows(void *ctx, int64_t task, int worker) {
    const matmul_job *job = ctx;
    const int64_t n = job->x->n_rows;
    const size_t x_bytes = job->x->row_bytes;
    int64_t r0 = task * ROWS_PER_TASK, r1 = r0 + ROWS_PER_TASK;
    if (r1 > job->w->rows) r1 = job->w->rows;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = job->w->data + (size_t)r * job->w->row_bytes;
        int64_t t = 0;
        for (float out[CPU_DOT_ROWS]; job->dot_rows && t + CPU_DOT_ROWS <= n; t += CPU_DOT_ROWS) {
            job->dot_rows(row, job->x->data + t * x_bytes, x_bytes, job->w->cols, out);
            for (int k = 0; k < CPU_DOT_ROWS; k++)
                job->y[(t + k) * job->y_stride + r] = out[k];
        }
        for (; t < n; t++)
            job->y[t * job->y_stride + r] = job->dot(row, job->x->data + t * x_bytes, job->w->cols);
    }
}

void cpu_matmul(thread_pool *pool, const matrix *w, const quantized_rows *x, float *y, int64_t y_stride) {
    matmul_job job = {w, x, y, y_stride, cpu_dot_kernel(w->type), cpu_dot_rows_kernel(w->type)};
    thread_pool_run(pool, (w->rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK, matmul_rows, &job);
}
