/*
 * block.h — the byte-level helpers every block layout in src/quant shares.
 * Private to src/quant.
 *
 * Quantized rows come straight from a memory-mapped file, so a block may sit
 * at any address and the host may be of either byte order. Block structs are
 * therefore made of byte arrays only (alignment 1, so a cast from any pointer
 * is valid) and multi-byte fields are read and written little-endian through
 * these helpers, which compile to plain loads and stores on x86 and ARM.
 *
 * The half-precision conversions live here as inline functions so the F16
 * and BF16 row kernels can inline (and vectorise) them; quant.h exports the
 * same conversions as fp16_to_f32 et al. for everyone else. The Q8_0 and
 * Q8_1 block structs live here too: several families' dot products read
 * them as activations.
 */
#ifndef MOE_QUANT_BLOCK_H
#define MOE_QUANT_BLOCK_H

#include <stdint.h>
#include <string.h>

static inline uint16_t block_load_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline void block_store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline uint32_t block_load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void block_store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline float block_bits_to_f32(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t block_f32_to_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* IEEE binary16 -> binary32, exact. A normal half moves its exponent from
 * bias 15 to bias 127 (add 112) with the mantissa shifted into place; an
 * infinity or NaN needs exponent 255 instead (add 224), keeping the payload.
 * A subnormal half is mantissa * 2^-24, which float arithmetic computes
 * exactly (a 10-bit integer times a power of two). A signalling NaN comes
 * out quiet, payload kept, as x86's F16C and GGML's software path do. */
static inline float block_fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t magnitude = (uint32_t)(h & 0x7fffu) << 13;
    if (exponent == 0) {
        const float value = (float)(h & 0x3ffu) * 0x1p-24f;
        return block_bits_to_f32(sign | block_f32_to_bits(value));
    }
    if (exponent == 0x1fu) {
        const uint32_t quiet = (h & 0x3ffu) ? 0x00400000u : 0u;
        return block_bits_to_f32(sign | quiet | (magnitude + (224u << 23)));
    }
    return block_bits_to_f32(sign | (magnitude + (112u << 23)));
}

/* Round the magnitude `mantissa` (an integer) right by `shift` bits to
 * nearest, ties to even. */
static inline uint32_t block_round_shift(uint32_t mantissa, unsigned shift) {
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t q = mantissa >> shift;
    if (rest > half || (rest == half && (q & 1u))) q++;
    return q;
}

/* IEEE binary32 -> binary16, round to nearest even. Every NaN becomes the
 * quiet NaN 0x7e00 with its sign, as in GGML's conversion; overflow goes to
 * infinity, tiny values to signed zero or a subnormal. A carry out of the mantissa while rounding lands in
 * the exponent, which is exactly the next binade (or infinity). */
static inline uint16_t block_f32_to_fp16(float f) {
    const uint32_t bits = block_f32_to_bits(f);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (abs >= 0x38800000u) /* >= 2^-14: a normal half */
        return (uint16_t)(sign | block_round_shift(abs - (112u << 23), 13));
    if (abs <= 0x33000000u) return sign; /* <= 2^-25: ties at 2^-25 go to even, zero */
    /* Subnormal half: the value in units of 2^-24, from the 24-bit significand. */
    const uint32_t exponent = abs >> 23;
    const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | block_round_shift(significand, 126u - exponent));
}

static inline float block_bf16_to_f32(uint16_t h) {
    return block_bits_to_f32((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest even; NaN is kept NaN by setting the
 * quiet bit (the truncated payload could be all zero, i.e. infinity). This is
 * GGML's conversion bit for bit. */
static inline uint16_t block_f32_to_bf16(float f) {
    const uint32_t bits = block_f32_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static inline float block_load_fp16(const uint8_t *p) {
    return block_fp16_to_f32(block_load_u16(p));
}

static inline void block_store_fp16(uint8_t *p, float f) {
    block_store_u16(p, block_f32_to_fp16(f));
}

/* Q8_0 and Q8_1, the activation formats of the 32-element families' dot
 * products; their layout is documented in q8_0.c. */
typedef struct block_q8_0 {
    uint8_t d[2];
    int8_t qs[32];
} block_q8_0;

typedef struct block_q8_1 {
    uint8_t d[2];
    uint8_t s[2];
    int8_t qs[32];
} block_q8_1;

#endif
