/*
 * formats.h — the kernels of each format family, as quant.c's table binds
 * them. Private to src/quant; everyone else goes through quant.h.
 *
 * Naming: <format>_dequantize, <format>_quantize, <format>_dot, with the
 * signatures of quant_dequantize_fn, quant_quantize_fn and quant_dot_fn.
 */
#ifndef MOE_QUANT_FORMATS_H
#define MOE_QUANT_FORMATS_H

#include "quant/quant.h"

#define QUANT_FAMILY(prefix)                                                   \
    void prefix##_dequantize(const void *src, float *dst, int64_t n);          \
    void prefix##_quantize(const float *src, void *dst, int64_t n);            \
    float prefix##_dot(const void *weights, const void *activations, int64_t n);

/* float.c */
QUANT_FAMILY(f32)
QUANT_FAMILY(f16)
QUANT_FAMILY(bf16)
/* q8_0.c: Q8_0 and its activation twin Q8_1 */
QUANT_FAMILY(q8_0)
QUANT_FAMILY(q8_1)
/* q4_0.c: Q4_0 and Q4_1 */
QUANT_FAMILY(q4_0)
QUANT_FAMILY(q4_1)
/* q5_0.c: Q5_0 and Q5_1 */
QUANT_FAMILY(q5_0)
QUANT_FAMILY(q5_1)
/* iq4_nl.c */
QUANT_FAMILY(iq4_nl)
/* mxfp4.c */
QUANT_FAMILY(mxfp4)
/* q8_k.c: the activation format of the K-quant dot products */
QUANT_FAMILY(q8_k)
/* q4_k.c, q5_k.c, q6_k.c */
QUANT_FAMILY(q4_k)
QUANT_FAMILY(q5_k)
QUANT_FAMILY(q6_k)

#undef QUANT_FAMILY

#endif
