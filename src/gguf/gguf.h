/*
 * gguf.h — reading and writing GGUF files (versions 2 and 3).
 *
 * A GGUF file, all integers little-endian:
 *   1. magic "GGUF" (4 bytes), version (u32), tensor count (u64), key/value
 *      count (u64)  [version 1 used u32 counts and is not supported]
 *   2. key/value pairs: key (string), value type (u32), value
 *      string = u64 length + bytes (no terminator)
 *      array  = element type (u32) + u64 count + elements (arrays may nest)
 *   3. tensor infos: name (string), n_dims (u32), ne[n_dims] (u64 each,
 *      innermost first), type (u32, a moe_type), offset (u64, relative to the
 *      start of the data section, a multiple of the alignment)
 *   4. padding to `general.alignment` (u32 key, default 32, a power of two)
 *   5. tensor data
 *
 * The reader maps the file and validates everything before anyone uses it:
 * every count, length and offset is checked against the bytes that remain,
 * with overflow-safe arithmetic; a malformed file is one MOE_ERR_FORMAT with
 * a message naming the byte offset and what was wrong. Strings and tensor
 * data point into the mapping; nothing is copied.
 *
 * Beyond the layout above the reader insists on: unique keys and tensor
 * names, bools stored as 0 or 1, arrays nested at most 8 deep, every
 * dimension > 0, ne[0] a multiple of the type's block size, and tensor data
 * inside the file without overlaps (tensors may lie in any order).
 */
#ifndef MOE_GGUF_H
#define MOE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moe.h"
#include "quant/quant.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef enum gguf_value_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT = 13,
} gguf_value_type;

/* A string inside the file: not NUL-terminated. */
typedef struct gguf_str {
    uint64_t len;
    const char *data;
} gguf_str;

typedef struct gguf_value gguf_value;

typedef struct gguf_array {
    gguf_value_type type; /* element type */
    uint64_t n;           /* element count */
    /* Numeric and bool elements: `data` points at n packed little-endian
     * elements in the file (possibly unaligned: read them with the
     * gguf_array_get_* helpers) and `items` is NULL. Strings and nested
     * arrays: `items` holds n parsed values and `data` is NULL. */
    const void *data;
    gguf_value *items;
} gguf_array;

struct gguf_value {
    gguf_value_type type;
    union {
        uint64_t u64; /* UINT8/16/32/64 and BOOL widen into u64 */
        int64_t i64;  /* INT8/16/32/64 widen into i64 */
        double f64;   /* FLOAT32/64 widen into f64 */
        gguf_str str;
        gguf_array arr;
    };
};

typedef struct gguf_kv {
    gguf_str key;
    gguf_value value;
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* innermost first; unused dims are 1 */
    moe_type type;
    uint64_t offset;  /* from the start of the data section */
    uint64_t nbytes;  /* size of the data, from type and shape */
    const void *data; /* into the mapping */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors; /* in file order */
    uint64_t alignment;
    uint64_t data_offset; /* start of the data section in the file */
    const uint8_t *base;  /* the whole file */
    uint64_t size;
    /* private */
    uint32_t *by_name;    /* tensor indices sorted by name, for lookup */
    uint32_t *kv_by_key;  /* kv indices sorted by key, for lookup */
    int fd;
    bool mapped;
} gguf_file;

/* Open and validate a file (read-only mmap). On failure *out is NULL and
 * err names the file and the problem. */
moe_status gguf_open(const char *path, gguf_file **out, moe_error *err);

/* Parse and validate a buffer the caller keeps alive until gguf_close. */
moe_status gguf_open_memory(const void *data, size_t size, gguf_file **out, moe_error *err);

void gguf_close(gguf_file *file);

/* --- metadata ----------------------------------------------------------- */

/* NULL when absent. O(log n). */
const gguf_kv *gguf_find(const gguf_file *file, const char *key);

/* Typed accessors. Integers accept any integer type (not bool) whose value
 * fits the requested type; floats accept FLOAT32 and FLOAT64. A missing key
 * returns MOE_ERR_NOT_FOUND, a wrong type MOE_ERR_TYPE (the message names
 * the key, the expected and the found type), a value that does not fit
 * MOE_ERR_RANGE (-1 as uint32, 2^40 as uint32, 1e300 as float32). */
moe_status gguf_get_u32(const gguf_file *file, const char *key, uint32_t *out, moe_error *err);
moe_status gguf_get_u64(const gguf_file *file, const char *key, uint64_t *out, moe_error *err);
moe_status gguf_get_i64(const gguf_file *file, const char *key, int64_t *out, moe_error *err);
moe_status gguf_get_f32(const gguf_file *file, const char *key, float *out, moe_error *err);
moe_status gguf_get_bool(const gguf_file *file, const char *key, bool *out, moe_error *err);
moe_status gguf_get_str(const gguf_file *file, const char *key, gguf_str *out, moe_error *err);
/* An array whose elements have type `elem` (GGUF_TYPE_COUNT: any). */
moe_status gguf_get_array(const gguf_file *file, const char *key, gguf_value_type elem,
                          const gguf_array **out, moe_error *err);

/* Element i of a numeric/bool array, widened; i must be < arr->n. The
 * integer getters take integer and bool arrays (the other signedness comes
 * back as two's complement), get_f64 takes any numeric array. */
uint64_t gguf_array_get_u64(const gguf_array *arr, uint64_t i);
int64_t gguf_array_get_i64(const gguf_array *arr, uint64_t i);
double gguf_array_get_f64(const gguf_array *arr, uint64_t i);
/* Element i of a string array. */
gguf_str gguf_array_get_str(const gguf_array *arr, uint64_t i);

bool gguf_str_eq(gguf_str s, const char *cstr);
/* Two values alike: the same type and the same strings, numbers and
 * array elements. Float scalars compare by their bits, but any NaN equals
 * any NaN (a signalling NaN may come back quiet: float32 passes through a
 * double). */
bool gguf_values_equal(const gguf_value *a, const gguf_value *b);
const char *gguf_value_type_name(gguf_value_type type);
size_t gguf_value_type_size(gguf_value_type type); /* 0 for STRING and ARRAY */

/* --- tensors ------------------------------------------------------------ */

/* NULL when absent. O(log n). */
const gguf_tensor *gguf_find_tensor(const gguf_file *file, const char *name);
uint64_t gguf_tensor_n_elements(const gguf_tensor *t);

/* --- writing -------------------------------------------------------------
 *
 * Build the metadata and the tensor directory in memory, then write. Files
 * are version 3 with the alignment set (default 32; written as
 * general.alignment when not the default). Tensor data can be attached up
 * front (gguf_writer_add_tensor with data) and written by gguf_writer_save,
 * or streamed tensor by tensor, in directory order, after gguf_writer_begin:
 * the quantizer and converter produce data one tensor at a time and never
 * hold a whole model.
 */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
moe_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment, moe_error *err);

/* Set a key, replacing an earlier value of the same key. Strings are copied.
 * general.alignment is the alignment itself: setting it (a uint32 power of
 * two, any other type is refused) is gguf_writer_set_alignment. */
moe_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, moe_error *err);
moe_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, moe_error *err);
moe_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, moe_error *err);
moe_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v, moe_error *err);
moe_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, moe_error *err);
moe_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, moe_error *err);
/* A numeric or bool array of n packed little-endian elements of `elem`. */
moe_status gguf_writer_set_array(gguf_writer *w, const char *key, gguf_value_type elem,
                                 const void *data, uint64_t n, moe_error *err);
moe_status gguf_writer_set_str_array(gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n, moe_error *err);
/* Any value as the reader parsed it (nested arrays included): deep copy.
 * This is how the quantizer carries every key of its input across. */
moe_status gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v, moe_error *err);

/* Append a tensor to the directory. `data` (nbytes from type and shape) may
 * be NULL when the data will be streamed; otherwise the writer keeps the
 * pointer, not a copy, until gguf_writer_save. Names must be unique (checked
 * when writing begins) and at most 63 bytes (GGML's limit). */
moe_status gguf_writer_add_tensor(gguf_writer *w, const char *name, moe_type type, uint32_t n_dims,
                                  const uint64_t *ne, const void *data, moe_error *err);

/* Streaming: header, metadata and directory, then each tensor in order.
 * Misuse (a wrong size, one tensor too many, end before the last) is
 * MOE_ERR_INVALID_ARG and changes nothing; a write error ends the stream.
 * The fd stays the caller's: end does not sync or close it. */
moe_status gguf_writer_begin(gguf_writer *w, int fd, moe_error *err);
moe_status gguf_writer_write_tensor(gguf_writer *w, const void *data, uint64_t nbytes, moe_error *err);
moe_status gguf_writer_end(gguf_writer *w, moe_error *err);

/* All at once to `path`, atomically (temp file, fsync, rename): every tensor
 * must have been added with data. */
moe_status gguf_writer_save(gguf_writer *w, const char *path, moe_error *err);

#endif
