/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader that
 * `moe convert` uses (tools/safetensors.c): the 8-byte header length, the
 * JSON header, and each tensor's dtype, shape and data offsets.
 *
 * Every input is one model.safetensors in memory (safetensors_open_memory).
 * A rejected input must come back as a format error (or out of memory) with
 * a message. An accepted one must hold what the reader promises: names
 * sorted and unique, each found by name, the element count the product of
 * the shape, the byte count that times the dtype's size, and the data inside
 * the input after the header. Its first and last byte are read, so that
 * under AddressSanitizer anything pointing outside the input crashes here.
 */
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

static volatile uint64_t sink;

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) __builtin_trap();                                                                                 \
    } while (0)

/* The size of an element of the dtype, checked independently of the
 * reader's table; 0 for a name the format does not have. */
static unsigned dtype_bytes(const char *dtype) {
    static const struct {
        const char *name;
        unsigned bytes;
    } sizes[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4},  {"U32", 4},     {"F16", 2},     {"BF16", 2},
        {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(dtype, sizes[i].name) == 0) return sizes[i].bytes;
    return 0;
}

static void check_tensor(st_checkpoint *c, const st_tensor *t, const uint8_t *data, const uint8_t *end) {
    REQUIRE(t->name && safetensors_find(c, t->name) == t);
    REQUIRE(t->n_dims >= 0 && t->n_dims <= SAFETENSORS_MAX_DIMS);
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) {
        REQUIRE(t->shape[d] >= 0);
        n *= (uint64_t)t->shape[d]; /* no overflow: the reader checked, and n_elements is compared */
    }
    unsigned bytes = dtype_bytes(t->dtype);
    REQUIRE(bytes > 0 && n == t->n_elements && t->nbytes / bytes == n && t->nbytes % bytes == 0);
    bool readable = strcmp(t->dtype, "F32") == 0 || strcmp(t->dtype, "F16") == 0 || strcmp(t->dtype, "BF16") == 0;
    REQUIRE(readable == (t->type != MOE_TYPE_COUNT));
    REQUIRE(t->data >= data && t->data <= end && t->nbytes <= (uint64_t)(end - t->data));
    if (t->nbytes) sink += t->data[0] + t->data[t->nbytes - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_checkpoint *c = NULL;
    moe_error err = {0};
    moe_status st = safetensors_open_memory(data, size, "fuzz.safetensors", &c, &err);
    if (st != MOE_OK) {
        REQUIRE(c == NULL && (st == MOE_ERR_FORMAT || st == MOE_ERR_NOMEM) && err.code == st);
        REQUIRE(err.message[0] != '\0');
        return 0;
    }
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--)
        header = header << 8 | data[i];
    const uint8_t *tensor_data = data + 8 + header, *end = data + size;
    size_t n;
    const st_tensor *all = safetensors_tensors(c, &n);
    for (size_t i = 0; i < n; i++) {
        check_tensor(c, &all[i], tensor_data, end);
        if (i > 0) REQUIRE(strcmp(all[i - 1].name, all[i].name) < 0);
    }
    REQUIRE(!safetensors_find(c, "__metadata__"));
    safetensors_close(c);
    return 0;
}
