/*
 * gguf_internal.h — what the reader, the accessors and the writer share.
 * Private to src/gguf.
 */
#ifndef MOE_GGUF_INTERNAL_H
#define MOE_GGUF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

/* Arrays may hold arrays; deeper nesting than this is refused by the reader
 * (it bounds the parser's recursion) and therefore by the writer too. No
 * real file nests at all. */
#define GGUF_MAX_ARRAY_DEPTH 8

/* The alignment key: a u32 power of two; absent means GGUF_DEFAULT_ALIGNMENT. */
#define GGUF_ALIGNMENT_KEY "general.alignment"

/* A little-endian unsigned integer of n <= 8 bytes; no alignment needed. */
static inline uint64_t gguf_load_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

static inline bool gguf_is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* True for a value type id the format defines (0..12). */
static inline bool gguf_type_is_valid(uint32_t type) { return type < GGUF_TYPE_COUNT; }

/* A scalar of `type` (not STRING or ARRAY) stored at p, widened into a
 * gguf_value as the reader represents it. */
gguf_value gguf_scalar_load(gguf_value_type type, const uint8_t *p);

/* Byte order of names: memcmp over the common prefix, then shorter first. */
int gguf_str_cmp(gguf_str a, gguf_str b);

/* Validate a tensor's shape for `type` and compute its size in bytes: n_dims
 * in 1..GGUF_MAX_DIMS, every ne in 1..INT64_MAX with a product that fits an
 * int64, a known type, ne[0] a multiple of its block size, a byte size that
 * fits a uint64. On failure returns false and writes the reason, one clause
 * without a trailing period, into why[why_size]. */
bool gguf_shape_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *nbytes, char *why,
                      size_t why_size);

#endif
