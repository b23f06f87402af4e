/*
 * quant.c — the table of element types and the entry points of quant.h.
 *
 * The table is indexed by GGML type id and lists every id GGUF defines with
 * its block geometry (from GGML's block structs), so any file can be
 * validated and inspected; formats moe.c computes with also carry their
 * kernels, which live in one file per family (see formats.h). Ids GGML has
 * retired (4, 5, 31..33, 36..38) have no entry.
 *
 * Activations are quantized to each format's dot_type the way GGML pairs
 * them (its vec_dot_type), so our dot products see the same inputs as
 * GGML's CPU backend.
 */
#include "quant/quant.h"

#include <math.h>
#include <stdalign.h>
#include <strings.h>

#include "quant/formats.h"

#define SIZE_ONLY(id, type_name, bsize, bbytes)                                 \
    [id] = {.type = id, .name = type_name, .block_size = bsize, .block_bytes = bbytes, \
            .dot_type = MOE_TYPE_COUNT}

#define WITH_KERNELS(id, type_name, bsize, bbytes, prefix, activations)         \
    [id] = {.type = id, .name = type_name, .block_size = bsize, .block_bytes = bbytes, \
            .dequantize = prefix##_dequantize, .quantize = prefix##_quantize,    \
            .dot_type = activations, .dot = prefix##_dot}

static const quant_format formats[MOE_TYPE_COUNT] = {
    WITH_KERNELS(MOE_TYPE_F32, "f32", 1, 4, f32, MOE_TYPE_F32),
    WITH_KERNELS(MOE_TYPE_F16, "f16", 1, 2, f16, MOE_TYPE_F32),
    WITH_KERNELS(MOE_TYPE_Q4_0, "q4_0", 32, 18, q4_0, MOE_TYPE_Q8_0),
    WITH_KERNELS(MOE_TYPE_Q4_1, "q4_1", 32, 20, q4_1, MOE_TYPE_Q8_1),
    WITH_KERNELS(MOE_TYPE_Q5_0, "q5_0", 32, 22, q5_0, MOE_TYPE_Q8_0),
    WITH_KERNELS(MOE_TYPE_Q5_1, "q5_1", 32, 24, q5_1, MOE_TYPE_Q8_1),
    WITH_KERNELS(MOE_TYPE_Q8_0, "q8_0", 32, 34, q8_0, MOE_TYPE_Q8_0),
    WITH_KERNELS(MOE_TYPE_Q8_1, "q8_1", 32, 36, q8_1, MOE_TYPE_Q8_1),
    SIZE_ONLY(MOE_TYPE_Q2_K, "q2_k", 256, 84),
    SIZE_ONLY(MOE_TYPE_Q3_K, "q3_k", 256, 110),
    WITH_KERNELS(MOE_TYPE_Q4_K, "q4_k", 256, 144, q4_k, MOE_TYPE_Q8_K),
    WITH_KERNELS(MOE_TYPE_Q5_K, "q5_k", 256, 176, q5_k, MOE_TYPE_Q8_K),
    WITH_KERNELS(MOE_TYPE_Q6_K, "q6_k", 256, 210, q6_k, MOE_TYPE_Q8_K),
    WITH_KERNELS(MOE_TYPE_Q8_K, "q8_k", 256, 292, q8_k, MOE_TYPE_Q8_K),
    SIZE_ONLY(MOE_TYPE_IQ2_XXS, "iq2_xxs", 256, 66),
    SIZE_ONLY(MOE_TYPE_IQ2_XS, "iq2_xs", 256, 74),
    SIZE_ONLY(MOE_TYPE_IQ3_XXS, "iq3_xxs", 256, 98),
    SIZE_ONLY(MOE_TYPE_IQ1_S, "iq1_s", 256, 50),
    WITH_KERNELS(MOE_TYPE_IQ4_NL, "iq4_nl", 32, 18, iq4_nl, MOE_TYPE_Q8_0),
    SIZE_ONLY(MOE_TYPE_IQ3_S, "iq3_s", 256, 110),
    SIZE_ONLY(MOE_TYPE_IQ2_S, "iq2_s", 256, 82),
    SIZE_ONLY(MOE_TYPE_IQ4_XS, "iq4_xs", 256, 136),
    SIZE_ONLY(MOE_TYPE_I8, "i8", 1, 1),
    SIZE_ONLY(MOE_TYPE_I16, "i16", 1, 2),
    SIZE_ONLY(MOE_TYPE_I32, "i32", 1, 4),
    SIZE_ONLY(MOE_TYPE_I64, "i64", 1, 8),
    SIZE_ONLY(MOE_TYPE_F64, "f64", 1, 8),
    SIZE_ONLY(MOE_TYPE_IQ1_M, "iq1_m", 256, 56),
    WITH_KERNELS(MOE_TYPE_BF16, "bf16", 1, 2, bf16, MOE_TYPE_F32),
    SIZE_ONLY(MOE_TYPE_TQ1_0, "tq1_0", 256, 54),
    SIZE_ONLY(MOE_TYPE_TQ2_0, "tq2_0", 256, 66),
    WITH_KERNELS(MOE_TYPE_MXFP4, "mxfp4", 32, 17, mxfp4, MOE_TYPE_Q8_0),
};

const quant_format *quant_format_of(uint32_t type) {
    if (type >= MOE_TYPE_COUNT || !formats[type].name) return NULL;
    return &formats[type];
}

const quant_format *quant_format_by_name(const char *name) {
    if (!name) return NULL;
    for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++)
        if (formats[t].name && strcasecmp(formats[t].name, name) == 0) return &formats[t];
    return NULL;
}

bool quant_is_supported(moe_type type) {
    const quant_format *f = quant_format_of((uint32_t)type);
    return f && f->dequantize && f->quantize && f->dot;
}

size_t quant_row_bytes(moe_type type, int64_t n) {
    const quant_format *f = quant_format_of((uint32_t)type);
    if (!f || n < 0 || n % f->block_size != 0) return 0;
    const uint64_t blocks = (uint64_t)(n / f->block_size);
    if (blocks > SIZE_MAX / f->block_bytes) return 0;
    return (size_t)blocks * f->block_bytes;
}

/* quant_dot_f32 quantizes DOT_CHUNK activations at a time into a stack
 * buffer. The chunk is a multiple of every block size (1, 32, 256), so only
 * the last chunk of a row can be short, and it is still whole blocks. Every
 * activation format takes at most 2 bytes per element (Q8_1, the largest,
 * 36 bytes per 32), which sizes the buffer: 8 KiB. */
enum { DOT_CHUNK = 4096, DOT_CHUNK_BYTES = 2 * DOT_CHUNK };

/* Chunk results are added in double: a row of millions of elements then
 * loses no more than one chunk's float rounding. Unsupported types and n
 * that is not whole blocks give NaN rather than a plausible number. */
float quant_dot_f32(moe_type type, const void *weights, const float *x, int64_t n) {
    if (!quant_is_supported(type)) return NAN;
    const quant_format *w = quant_format_of((uint32_t)type);
    const quant_format *a = quant_format_of((uint32_t)w->dot_type);
    if (n < 0 || n % w->block_size != 0 || n % a->block_size != 0) return NAN;
    alignas(64) unsigned char buffer[DOT_CHUNK_BYTES];
    const unsigned char *wrow = weights;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += DOT_CHUNK) {
        const int64_t len = n - i < DOT_CHUNK ? n - i : DOT_CHUNK;
        const void *act = x + i;
        if (a->type != MOE_TYPE_F32) {
            a->quantize(x + i, buffer, len);
            act = buffer;
        }
        sum += w->dot(wrow, act, len);
        wrow += quant_row_bytes(type, len);
    }
    return (float)sum;
}
