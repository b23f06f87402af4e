/*
 * quant.h — tensor element types and the per-format kernels of the CPU.
 *
 * Type ids are GGML's (they are what GGUF files store), so a file written by
 * any GGUF tool names its tensor types with these numbers. The table in
 * quant.c knows the block geometry of every id GGUF defines, so any file can
 * be validated and inspected; the formats moe.c computes with also carry
 * kernels (see quant_format.dequantize et al.). A format's kernels live in
 * one file per family, named after it (q4_k.c, q8_0.c, ...), whose opening
 * comment documents the block layout.
 *
 * Rows: every kernel works on a row of n elements, n a multiple of the
 * format's block_size; a row of n elements occupies
 * n / block_size * block_bytes bytes.
 */
#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum moe_type {
    MOE_TYPE_F32 = 0,
    MOE_TYPE_F16 = 1,
    MOE_TYPE_Q4_0 = 2,
    MOE_TYPE_Q4_1 = 3,
    /* 4 and 5 were Q4_2 and Q4_3, removed from GGML */
    MOE_TYPE_Q5_0 = 6,
    MOE_TYPE_Q5_1 = 7,
    MOE_TYPE_Q8_0 = 8,
    MOE_TYPE_Q8_1 = 9,
    MOE_TYPE_Q2_K = 10,
    MOE_TYPE_Q3_K = 11,
    MOE_TYPE_Q4_K = 12,
    MOE_TYPE_Q5_K = 13,
    MOE_TYPE_Q6_K = 14,
    MOE_TYPE_Q8_K = 15,
    MOE_TYPE_IQ2_XXS = 16,
    MOE_TYPE_IQ2_XS = 17,
    MOE_TYPE_IQ3_XXS = 18,
    MOE_TYPE_IQ1_S = 19,
    MOE_TYPE_IQ4_NL = 20,
    MOE_TYPE_IQ3_S = 21,
    MOE_TYPE_IQ2_S = 22,
    MOE_TYPE_IQ4_XS = 23,
    MOE_TYPE_I8 = 24,
    MOE_TYPE_I16 = 25,
    MOE_TYPE_I32 = 26,
    MOE_TYPE_I64 = 27,
    MOE_TYPE_F64 = 28,
    MOE_TYPE_IQ1_M = 29,
    MOE_TYPE_BF16 = 30,
    /* 31..33 were interleaved Q4_0 layouts, removed from GGML */
    MOE_TYPE_TQ1_0 = 34,
    MOE_TYPE_TQ2_0 = 35,
    /* 36..38 were interleaved IQ4_NL layouts, removed from GGML */
    MOE_TYPE_MXFP4 = 39,
    MOE_TYPE_COUNT = 40,
} moe_type;

/* Kernels of one format. `n` is the number of elements, a multiple of
 * block_size. Pointers to quantized data need no particular alignment. */
typedef void (*quant_dequantize_fn)(const void *src, float *dst, int64_t n);
typedef void (*quant_quantize_fn)(const float *src, void *dst, int64_t n);
/* Dot product of a weight row with an activation row that was quantized to
 * the format's dot_type (a float row when dot_type is MOE_TYPE_F32). */
typedef float (*quant_dot_fn)(const void *weights, const void *activations, int64_t n);

typedef struct quant_format {
    moe_type type;
    const char *name;        /* lower case, as GGML prints it: "q4_K" is "q4_k" */
    int64_t block_size;      /* elements per block */
    size_t block_bytes;      /* bytes per block */
    /* The rest is NULL / MOE_TYPE_COUNT for types we only know the size of. */
    quant_dequantize_fn dequantize;
    quant_quantize_fn quantize; /* reference quality, deterministic */
    moe_type dot_type;          /* what activations are quantized to for `dot` */
    quant_dot_fn dot;
} quant_format;

/* The format of a type id, or NULL when the id is not one GGUF defines. */
const quant_format *quant_format_of(uint32_t type);

/* Look up by name, case-insensitive ("Q4_K", "q4_k", "bf16"); NULL if none. */
const quant_format *quant_format_by_name(const char *name);

/* True when moe.c has kernels for the type (dequantize, quantize, dot). */
bool quant_is_supported(moe_type type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or the type is unknown. */
size_t quant_row_bytes(moe_type type, int64_t n);

/* Dot product against a float activation row: quantizes the activations to
 * the format's dot_type (in blocks on the stack) and calls its dot kernel.
 * NaN when the type has no kernels or n is not a multiple of block_size. */
float quant_dot_f32(moe_type type, const void *weights, const float *x, int64_t n);

/* Half-precision conversions shared by every family (exact, round to
 * nearest even, NaN and infinity preserved). */
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

#endif
