/*
 * weight_blocks.h — the block layouts of the weight formats, one
 * definition for their files in src/quant (quantizing, dequantizing, dot
 * products) and for the CPU's x86 kernels. What each byte holds (which
 * weight a nibble or bit carries, how the scales decode) is documented in
 * the opening comment of the file named beside the struct. Byte arrays
 * only, as block.h explains, with each size asserted against GGML's.
 */
#ifndef MOE_QUANT_WEIGHT_BLOCKS_H
#define MOE_QUANT_WEIGHT_BLOCKS_H

#include <stdint.h>

#include "quant/k_quant.h"

/* The 32-weight families: 16 bytes of nibbles each, 2 weights a byte. */

typedef struct block_q4_0 { /* q4_0.c */
    uint8_t d[2];
    uint8_t qs[16];
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");

typedef struct block_q4_1 { /* q4_0.c */
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qs[16];
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");

typedef struct block_q5_0 { /* q5_0.c */
    uint8_t d[2];
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_0;
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");

typedef struct block_q5_1 { /* q5_0.c */
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_1;
_Static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");

typedef struct block_iq4_nl { /* iq4_nl.c */
    uint8_t d[2];
    uint8_t qs[16];
} block_iq4_nl;
_Static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");

typedef struct block_mxfp4 { /* mxfp4.c */
    uint8_t e;
    uint8_t qs[16];
} block_mxfp4;
_Static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block is 17 bytes");

/* The K-quants' super-blocks of QK_K weights. */

typedef struct block_q4_k { /* q4_k.c */
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_BYTES];
    uint8_t qs[QK_K / 2];
} block_q4_k;
_Static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");

typedef struct block_q5_k { /* q5_k.c */
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_BYTES];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_k;
_Static_assert(sizeof(block_q5_k) == 176, "Q5_K block is 176 bytes");

typedef struct block_q6_k { /* q6_k.c */
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint8_t d[2];
} block_q6_k;
_Static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");

#endif
