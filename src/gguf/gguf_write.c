/*
 * gguf_write.c — writing GGUF files (see gguf.h).
 *
 * The writer holds deep copies of the metadata and the tensor directory.
 * Writing begins by serialising header, metadata and directory into one
 * buffer, padded with zeros to the alignment; each tensor's data then
 * follows at its offset, in directory order, padded so the next one starts
 * aligned. The last tensor is padded too: GGML's reader, when it loads the
 * data section into memory instead of mapping it, reads the padded size.
 *
 * A file we write must read back with our own reader, so the writer refuses
 * what the reader refuses: bad shapes, duplicate names, bools other than 0
 * or 1, arrays nested too deep, a general.alignment that is not a uint32
 * power of two.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "gguf/gguf_internal.h"

#define GGUF_WRITE_VERSION 3
#define MAX_KEY_BYTES 65535 /* the spec's limit */
#define MAX_NAME_BYTES 63   /* GGML_MAX_NAME is 64 with the terminator */

typedef struct writer_kv {
    char *key;
    gguf_value value; /* owns its strings, packed data and items */
} writer_kv;

typedef struct writer_tensor {
    char *name;
    moe_type type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset;  /* in the data section; assigned when writing begins */
    const void *data; /* the caller's, or NULL when streamed */
} writer_tensor;

struct gguf_writer {
    uint32_t alignment;
    writer_kv *kv;
    size_t n_kv, cap_kv;
    writer_tensor *tensors;
    size_t n_tensors, cap_tensors;
    /* A stream is in progress while fd >= 0. */
    int fd;
    size_t next;      /* the tensor to write next */
    uint64_t written; /* bytes of the data section written so far */
};

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->fd = -1;
    return w;
}

static void value_free(gguf_value *v) {
    if (v->type == GGUF_TYPE_STRING) {
        free((void *)v->str.data);
    } else if (v->type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; v->arr.items && i < v->arr.n; i++) value_free(&v->arr.items[i]);
        free(v->arr.items);
        free((void *)v->arr.data);
    }
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->kv);
    free(w->tensors);
    free(w);
}

/* `items` with room for n + 1 elements of `size` bytes (capacity *cap), or
 * NULL when out of memory, leaving `items` as it was. */
static void *grow(void *items, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return items;
    size_t new_cap = *cap ? 2 * *cap : 16;
    if (new_cap > SIZE_MAX / size) return NULL;
    void *p = realloc(items, new_cap * size);
    if (p) *cap = new_cap;
    return p;
}

/* --- deep copies of values -------------------------------------------------- */

static moe_status copy_value(gguf_value *dst, const gguf_value *src, unsigned depth, moe_error *err);

/* A scalar must fit its declared type, so what we write reads back equal. */
static moe_status check_scalar(const gguf_value *v, moe_error *err) {
    static const struct { uint64_t max; int64_t min; } ranges[GGUF_TYPE_COUNT] = {
        [GGUF_TYPE_UINT8] = {UINT8_MAX, 0},      [GGUF_TYPE_UINT16] = {UINT16_MAX, 0},
        [GGUF_TYPE_UINT32] = {UINT32_MAX, 0},    [GGUF_TYPE_BOOL] = {1, 0},
        [GGUF_TYPE_INT8] = {INT8_MAX, INT8_MIN}, [GGUF_TYPE_INT16] = {INT16_MAX, INT16_MIN},
        [GGUF_TYPE_INT32] = {INT32_MAX, INT32_MIN},
    };
    bool is_signed = ranges[v->type].min < 0;
    if (ranges[v->type].max != 0 && !is_signed && v->u64 > ranges[v->type].max)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "value %" PRIu64 " does not fit %s", v->u64,
                             gguf_value_type_name(v->type));
    if (is_signed && (v->i64 < ranges[v->type].min || v->i64 > (int64_t)ranges[v->type].max))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "value %" PRId64 " does not fit %s", v->i64,
                             gguf_value_type_name(v->type));
    if (v->type == GGUF_TYPE_FLOAT32 && isfinite(v->f64) && fabs(v->f64) > FLT_MAX)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "value %g does not fit float32", v->f64);
    return MOE_OK;
}

static moe_status copy_str(gguf_value *dst, gguf_str s, moe_error *err) {
    if (!s.data && s.len) return moe_error_set(err, MOE_ERR_INVALID_ARG, "string of %" PRIu64 " bytes is NULL", s.len);
    if (s.len >= SIZE_MAX) return moe_error_set(err, MOE_ERR_NOMEM, "string of %" PRIu64 " bytes is too long", s.len);
    char *copy = malloc((size_t)s.len + 1);
    if (!copy) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for a string of %" PRIu64 " bytes", s.len);
    if (s.len) memcpy(copy, s.data, (size_t)s.len);
    copy[s.len] = '\0';
    dst->type = GGUF_TYPE_STRING;
    dst->str = (gguf_str){s.len, copy};
    return MOE_OK;
}

static moe_status copy_packed(gguf_array *dst, const gguf_array *src, moe_error *err) {
    uint64_t bytes;
    if (__builtin_mul_overflow(src->n, gguf_value_type_size(src->type), &bytes) || bytes > SIZE_MAX)
        return moe_error_set(err, MOE_ERR_NOMEM, "array of %" PRIu64 " elements is too large", src->n);
    if (bytes == 0) return MOE_OK;
    if (!src->data) return moe_error_set(err, MOE_ERR_INVALID_ARG, "array of %" PRIu64 " elements is NULL", src->n);
    uint8_t *copy = malloc((size_t)bytes);
    if (!copy) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for an array of %" PRIu64 " bytes", bytes);
    memcpy(copy, src->data, (size_t)bytes);
    dst->data = copy;
    dst->n = src->n;
    for (uint64_t i = 0; src->type == GGUF_TYPE_BOOL && i < src->n; i++)
        if (copy[i] > 1)
            return moe_error_set(err, MOE_ERR_INVALID_ARG, "bool array element %" PRIu64 " is %u, not 0 or 1", i,
                                 copy[i]);
    return MOE_OK;
}

static moe_status copy_items(gguf_array *dst, const gguf_array *src, unsigned depth, moe_error *err) {
    if (src->n == 0) return MOE_OK;
    if (!src->items) return moe_error_set(err, MOE_ERR_INVALID_ARG, "array of %" PRIu64 " elements is NULL", src->n);
    if (src->n > SIZE_MAX / sizeof *dst->items)
        return moe_error_set(err, MOE_ERR_NOMEM, "array of %" PRIu64 " elements is too large", src->n);
    /* Zeroed items own nothing, so a copy that fails half-way frees cleanly. */
    dst->items = calloc((size_t)src->n, sizeof *dst->items);
    if (!dst->items) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for %" PRIu64 " elements", src->n);
    dst->n = src->n;
    for (uint64_t i = 0; i < src->n; i++) {
        if (src->items[i].type != src->type)
            return moe_error_set(err, MOE_ERR_INVALID_ARG, "element %" PRIu64 " of an array of %s has type %s", i,
                                 gguf_value_type_name(src->type), gguf_value_type_name(src->items[i].type));
        moe_status st = copy_value(&dst->items[i], &src->items[i], depth, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* `depth` counts the arrays enclosing src, as in the reader. */
static moe_status copy_array(gguf_value *dst, const gguf_array *src, unsigned depth, moe_error *err) {
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "arrays nested more than %d deep", GGUF_MAX_ARRAY_DEPTH);
    if (!gguf_type_is_valid(src->type))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "invalid array element type %d", (int)src->type);
    dst->type = GGUF_TYPE_ARRAY;
    dst->arr = (gguf_array){.type = src->type};
    if (gguf_value_type_size(src->type)) return copy_packed(&dst->arr, src, err);
    return copy_items(&dst->arr, src, depth, err);
}

/* On failure dst may own part of the copy: value_free it either way. */
static moe_status copy_value(gguf_value *dst, const gguf_value *src, unsigned depth, moe_error *err) {
    *dst = (gguf_value){.type = GGUF_TYPE_UINT8}; /* owns nothing */
    if (!gguf_type_is_valid(src->type))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "invalid value type %d", (int)src->type);
    if (src->type == GGUF_TYPE_STRING) return copy_str(dst, src->str, err);
    if (src->type == GGUF_TYPE_ARRAY) return copy_array(dst, &src->arr, depth + 1, err);
    moe_status st = check_scalar(src, err);
    if (st == MOE_OK) *dst = *src;
    return st;
}

/* --- keys --------------------------------------------------------------------- */

static writer_kv *find_kv(gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return &w->kv[i];
    return NULL;
}

/* Take ownership of *value under `key`, replacing an earlier value. */
static moe_status store_kv(gguf_writer *w, const char *key, gguf_value *value, moe_error *err) {
    writer_kv *kv = find_kv(w, key);
    if (kv) {
        value_free(&kv->value);
        kv->value = *value;
        return MOE_OK;
    }
    char *name = strdup(key);
    writer_kv *grown = grow(w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv);
    if (!name || !grown) {
        free(name);
        value_free(value);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for key '%s'", key);
    }
    w->kv = grown;
    w->kv[w->n_kv++] = (writer_kv){name, *value};
    return MOE_OK;
}

static void remove_kv(gguf_writer *w, const char *key) {
    writer_kv *kv = find_kv(w, key);
    if (!kv) return;
    free(kv->key);
    value_free(&kv->value);
    size_t i = (size_t)(kv - w->kv);
    memmove(kv, kv + 1, (w->n_kv - i - 1) * sizeof *kv);
    w->n_kv--;
}

moe_status gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment, moe_error *err) {
    if (!gguf_is_power_of_two(alignment))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "alignment %" PRIu32 " is not a power of two", alignment);
    if (w->fd >= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "cannot change the alignment while streaming");
    /* The key is written exactly when the alignment is not the default. */
    if (alignment == GGUF_DEFAULT_ALIGNMENT) {
        remove_kv(w, GGUF_ALIGNMENT_KEY);
    } else {
        gguf_value v = {.type = GGUF_TYPE_UINT32, .u64 = alignment};
        moe_status st = store_kv(w, GGUF_ALIGNMENT_KEY, &v, err);
        if (st != MOE_OK) return st;
    }
    w->alignment = alignment;
    return MOE_OK;
}

static moe_status set_kv(gguf_writer *w, const char *key, const gguf_value *v, moe_error *err) {
    size_t len = key ? strlen(key) : 0;
    if (len == 0 || len > MAX_KEY_BYTES)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "a key must be 1..%d bytes, not %zu", MAX_KEY_BYTES, len);
    if (strcmp(key, GGUF_ALIGNMENT_KEY) == 0) {
        if (v->type != GGUF_TYPE_UINT32 || v->u64 > UINT32_MAX)
            return moe_error_set(err, MOE_ERR_INVALID_ARG, GGUF_ALIGNMENT_KEY " must be a uint32, not %s",
                                 gguf_value_type_name(v->type));
        return gguf_writer_set_alignment(w, (uint32_t)v->u64, err);
    }
    gguf_value copy;
    moe_status st = copy_value(&copy, v, 0, err);
    if (st != MOE_OK) {
        value_free(&copy);
        moe_error_prefix(err, "key '%s'", key);
        return st;
    }
    return store_kv(w, key, &copy, err);
}

moe_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v, moe_error *err) {
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_UINT32, .u64 = v}, err);
}

moe_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v, moe_error *err) {
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_INT32, .i64 = v}, err);
}

moe_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v, moe_error *err) {
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_UINT64, .u64 = v}, err);
}

moe_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v, moe_error *err) {
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_FLOAT32, .f64 = v}, err);
}

moe_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v, moe_error *err) {
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_BOOL, .u64 = v}, err);
}

moe_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *v, moe_error *err) {
    if (!v) return moe_error_set(err, MOE_ERR_INVALID_ARG, "key '%s': NULL string", key ? key : "(null)");
    return set_kv(w, key, &(gguf_value){.type = GGUF_TYPE_STRING, .str = {strlen(v), v}}, err);
}

moe_status gguf_writer_set_array(gguf_writer *w, const char *key, gguf_value_type elem, const void *data,
                                 uint64_t n, moe_error *err) {
    if (gguf_value_type_size(elem) == 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "key '%s': gguf_writer_set_array takes numeric or bool "
                             "elements, not %s", key ? key : "(null)", gguf_value_type_name(elem));
    gguf_value v = {.type = GGUF_TYPE_ARRAY, .arr = {.type = elem, .n = n, .data = data}};
    return set_kv(w, key, &v, err);
}

moe_status gguf_writer_set_str_array(gguf_writer *w, const char *key, const char *const *strs, uint64_t n,
                                     moe_error *err) {
    if (n && !strs)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "key '%s': NULL array of %" PRIu64 " strings", key, n);
    if (n > SIZE_MAX / sizeof(gguf_value))
        return moe_error_set(err, MOE_ERR_NOMEM, "key '%s': %" PRIu64 " strings are too many", key, n);
    gguf_value *items = n ? malloc((size_t)n * sizeof *items) : NULL;
    if (n && !items) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for %" PRIu64 " strings", n);
    moe_status st = MOE_OK;
    for (uint64_t i = 0; i < n && st == MOE_OK; i++) {
        if (!strs[i]) st = moe_error_set(err, MOE_ERR_INVALID_ARG, "key '%s': string %" PRIu64 " is NULL", key, i);
        else items[i] = (gguf_value){.type = GGUF_TYPE_STRING, .str = {strlen(strs[i]), strs[i]}};
    }
    gguf_value v = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_STRING, .n = n, .items = items}};
    if (st == MOE_OK) st = set_kv(w, key, &v, err);
    free(items);
    return st;
}

moe_status gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v, moe_error *err) {
    if (!v) return moe_error_set(err, MOE_ERR_INVALID_ARG, "key '%s': NULL value", key ? key : "(null)");
    return set_kv(w, key, v, err);
}

/* --- tensors -------------------------------------------------------------------- */

moe_status gguf_writer_add_tensor(gguf_writer *w, const char *name, moe_type type, uint32_t n_dims,
                                  const uint64_t *ne, const void *data, moe_error *err) {
    if (w->fd >= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "cannot add tensors while streaming");
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > MAX_NAME_BYTES)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "tensor name '%s' must be 1..%d bytes, not %zu",
                             name ? name : "(null)", MAX_NAME_BYTES, len);
    if (!ne) return moe_error_set(err, MOE_ERR_INVALID_ARG, "tensor '%s': NULL shape", name);
    writer_tensor t = {.type = type, .n_dims = n_dims, .data = data, .ne = {1, 1, 1, 1}};
    for (uint32_t d = 0; d < n_dims && d < GGUF_MAX_DIMS; d++) t.ne[d] = ne[d];
    char why[256];
    if (!gguf_shape_bytes(type, n_dims, t.ne, &t.nbytes, why, sizeof why))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "tensor '%s': %s", name, why);
    t.name = strdup(name);
    writer_tensor *grown = grow(w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors);
    if (!t.name || !grown) {
        free(t.name);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for tensor '%s'", name);
    }
    w->tensors = grown;
    w->tensors[w->n_tensors++] = t;
    return MOE_OK;
}

static int compare_names(const void *a, const void *b) {
    const writer_tensor *x = *(const writer_tensor *const *)a, *y = *(const writer_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Sorted, so 20k tensors cost n log n, not n^2. */
static moe_status check_unique_names(const gguf_writer *w, moe_error *err) {
    if (w->n_tensors < 2) return MOE_OK;
    const writer_tensor **order = malloc(w->n_tensors * sizeof *order);
    if (!order) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < w->n_tensors; i++) order[i] = &w->tensors[i];
    qsort(order, w->n_tensors, sizeof *order, compare_names);
    moe_status st = MOE_OK;
    for (size_t i = 1; i < w->n_tensors && st == MOE_OK; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            st = moe_error_set(err, MOE_ERR_INVALID_ARG, "duplicate tensor name '%s'", order[i]->name);
    free(order);
    return st;
}

static uint64_t padding(uint64_t pos, uint64_t alignment) { return (alignment - pos % alignment) % alignment; }

/* Each tensor starts at the first multiple of the alignment after the last. */
static moe_status assign_offsets(gguf_writer *w, moe_error *err) {
    uint64_t pos = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        writer_tensor *t = &w->tensors[i];
        t->offset = pos;
        if (__builtin_add_overflow(pos, t->nbytes, &pos) ||
            __builtin_add_overflow(pos, padding(pos, w->alignment), &pos))
            return moe_error_set(err, MOE_ERR_RANGE, "tensor data exceeds 2^64 bytes at tensor '%s'", t->name);
    }
    return MOE_OK;
}

/* --- serialising the directory ---------------------------------------------------- */

/* A growing byte buffer that remembers running out of memory, so the
 * serialiser checks once at the end instead of after every field. */
typedef struct buffer {
    uint8_t *bytes;
    size_t len, cap;
    bool failed;
} buffer;

static void put(buffer *b, const void *p, uint64_t n) {
    if (b->failed || n == 0) return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *grown = realloc(b->bytes, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->bytes = grown;
        b->cap = cap;
    }
    memcpy(b->bytes + b->len, p, (size_t)n);
    b->len += (size_t)n;
}

static void put_le(buffer *b, uint64_t v, unsigned n) {
    uint8_t le[8];
    for (unsigned i = 0; i < n; i++) le[i] = (uint8_t)(v >> 8 * i);
    put(b, le, n);
}

static void put_str(buffer *b, const char *s, uint64_t len) {
    put_le(b, len, 8);
    put(b, s, len);
}

static void put_value(buffer *b, const gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_STRING: put_str(b, v->str.data, v->str.len); break;
    case GGUF_TYPE_ARRAY:
        put_le(b, v->arr.type, 4);
        put_le(b, v->arr.n, 8);
        if (v->arr.items)
            for (uint64_t i = 0; i < v->arr.n; i++) put_value(b, &v->arr.items[i]);
        else
            put(b, v->arr.data, v->arr.n * gguf_value_type_size(v->arr.type));
        break;
    case GGUF_TYPE_FLOAT32: {
        float f = (float)v->f64;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        put_le(b, bits, 4);
        break;
    }
    case GGUF_TYPE_FLOAT64: {
        uint64_t bits;
        memcpy(&bits, &v->f64, sizeof bits);
        put_le(b, bits, 8);
        break;
    }
    default: /* integers and bool: the low bytes of the two's complement */
        put_le(b, v->u64, (unsigned)gguf_value_type_size(v->type));
        break;
    }
}

static void put_directory(buffer *b, const gguf_writer *w) {
    put(b, GGUF_MAGIC, 4);
    put_le(b, GGUF_WRITE_VERSION, 4);
    put_le(b, w->n_tensors, 8);
    put_le(b, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(b, w->kv[i].key, strlen(w->kv[i].key));
        put_le(b, w->kv[i].value.type, 4);
        put_value(b, &w->kv[i].value);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        put_str(b, t->name, strlen(t->name));
        put_le(b, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) put_le(b, t->ne[d], 8);
        put_le(b, (uint32_t)t->type, 4);
        put_le(b, t->offset, 8);
    }
    static const uint8_t zeros[64];
    for (uint64_t n = padding(b->len, w->alignment); n > 0;) {
        uint64_t chunk = n < sizeof zeros ? n : sizeof zeros;
        put(b, zeros, chunk);
        n -= chunk;
    }
}

/* --- writing ------------------------------------------------------------------------- */

static moe_status write_all(int fd, const void *data, uint64_t n, moe_error *err) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n < (1u << 30) ? (size_t)n : (1u << 30);
        ssize_t k = write(fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return moe_error_set(err, MOE_ERR_IO, "write failed: %s", k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (uint64_t)k;
    }
    return MOE_OK;
}

static moe_status write_zeros(int fd, uint64_t n, moe_error *err) {
    static const uint8_t zeros[4096];
    moe_status st = MOE_OK;
    while (n > 0 && st == MOE_OK) {
        uint64_t chunk = n < sizeof zeros ? n : sizeof zeros;
        st = write_all(fd, zeros, chunk, err);
        n -= chunk;
    }
    return st;
}

moe_status gguf_writer_begin(gguf_writer *w, int fd, moe_error *err) {
    if (w->fd >= 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_begin: a stream is already in progress");
    if (fd < 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_begin: bad file descriptor %d", fd);
    moe_status st = check_unique_names(w, err);
    if (st == MOE_OK) st = assign_offsets(w, err);
    if (st != MOE_OK) return st;
    buffer b = {0};
    put_directory(&b, w);
    if (b.failed) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the GGUF header");
    else st = write_all(fd, b.bytes, b.len, err);
    free(b.bytes);
    if (st != MOE_OK) return st;
    w->fd = fd;
    w->next = 0;
    w->written = 0;
    return MOE_OK;
}

moe_status gguf_writer_write_tensor(gguf_writer *w, const void *data, uint64_t nbytes, moe_error *err) {
    if (w->fd < 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_write_tensor: no stream in progress "
                             "(gguf_writer_begin not called, or the stream ended)");
    if (w->next == w->n_tensors)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_write_tensor: all %zu tensors were already written",
                             w->n_tensors);
    const writer_tensor *t = &w->tensors[w->next];
    if (nbytes != t->nbytes)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "tensor '%s' takes %" PRIu64 " bytes, got %" PRIu64, t->name,
                             t->nbytes, nbytes);
    if (!data) return moe_error_set(err, MOE_ERR_INVALID_ARG, "tensor '%s': NULL data", t->name);
    moe_status st = write_zeros(w->fd, t->offset - w->written, err);
    if (st == MOE_OK) st = write_all(w->fd, data, nbytes, err);
    if (st != MOE_OK) {
        w->fd = -1; /* the file is incomplete: no further writes make sense */
        return st;
    }
    w->written = t->offset + nbytes;
    w->next++;
    return MOE_OK;
}

moe_status gguf_writer_end(gguf_writer *w, moe_error *err) {
    if (w->fd < 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_end: no stream in progress");
    if (w->next < w->n_tensors)
        return moe_error_set(err, MOE_ERR_INVALID_ARG,
                             "gguf_writer_end: only %zu of %zu tensors were written, '%s' is next", w->next,
                             w->n_tensors, w->tensors[w->next].name);
    moe_status st = write_zeros(w->fd, padding(w->written, w->alignment), err);
    w->fd = -1;
    return st;
}

moe_status gguf_writer_save(gguf_writer *w, const char *path, moe_error *err) {
    if (w->fd >= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_writer_save: a stream is in progress");
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].data)
            return moe_error_set(err, MOE_ERR_INVALID_ARG, "%s: tensor '%s' has no data (it was added for streaming)",
                                 path, w->tensors[i].name);
    atomic_file file;
    moe_status st = atomic_file_open(&file, path, err);
    if (st != MOE_OK) return st;
    st = gguf_writer_begin(w, file.fd, err);
    for (size_t i = 0; i < w->n_tensors && st == MOE_OK; i++)
        st = gguf_writer_write_tensor(w, w->tensors[i].data, w->tensors[i].nbytes, err);
    if (st == MOE_OK) st = gguf_writer_end(w, err);
    if (st != MOE_OK) {
        w->fd = -1;
        moe_error_prefix(err, "%s", path);
        atomic_file_abort(&file);
        return st;
    }
    return atomic_file_commit(&file, err);
}
