/*
 * cpu_matmul.h — weight matrix times a batch of activation rows.
 *
 * Activations are quantized once per row to the weight format's dot type
 * (Q8_0, Q8_1, Q8_K or f32), then every weight row is dotted with every
 * activation row. Work is split over weight rows so each row is read from
 * memory once per batch, whatever the batch size: decode is bound by reading
 * the weights, and prefill reuses each row across the batch while it is in
 * cache.
 */
#ifndef MOE_CPU_MATMUL_H
#define MOE_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "common/thread_pool.h"
#include "model/model.h"

/* Activation rows quantized for one weight type. */
typedef struct quantized_rows {
    moe_type type;    /* the dot type */
    int64_t n_rows, cols;
    size_t row_bytes;
    uint8_t *data;    /* n_rows * row_bytes; or the float rows themselves */
    size_t capacity;
} quantized_rows;

/* Quantize n_rows rows of `cols` floats (row stride `stride`) for weights of
 * type `weight_type`, in parallel. Grows q->data as needed. */
int cpu_quantize_rows(thread_pool *pool, quantized_rows *q, moe_type weight_type, const float *x, int64_t n_rows,
                      int64_t cols, int64_t stride);
void quantized_rows_free(quantized_rows *q);

/* y[t * y_stride + r] = dot(w row r, activation row t) for r < w->rows,
 * t < x->n_rows. */
void cpu_matmul(thread_pool *pool, const matrix *w, const quantized_rows *x, float *y, int64_t y_stride);

#endif
