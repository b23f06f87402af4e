/*
 * gguf_access.c — looking things up in a parsed GGUF file (see gguf.h):
 * keys and tensors by name, typed getters with their widening rules, array
 * elements, and the type and shape facts the reader and the writer share.
 *
 * Keys and tensor names are found by binary search over the indices the
 * reader sorted while it checked them for duplicates.
 */
#include <assert.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "gguf/gguf_internal.h"

static const struct {
    const char *name;
    size_t size;
} value_types[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = {"uint8", 1},     [GGUF_TYPE_INT8] = {"int8", 1},
    [GGUF_TYPE_UINT16] = {"uint16", 2},   [GGUF_TYPE_INT16] = {"int16", 2},
    [GGUF_TYPE_UINT32] = {"uint32", 4},   [GGUF_TYPE_INT32] = {"int32", 4},
    [GGUF_TYPE_FLOAT32] = {"float32", 4}, [GGUF_TYPE_BOOL] = {"bool", 1},
    [GGUF_TYPE_STRING] = {"string", 0},   [GGUF_TYPE_ARRAY] = {"array", 0},
    [GGUF_TYPE_UINT64] = {"uint64", 8},   [GGUF_TYPE_INT64] = {"int64", 8},
    [GGUF_TYPE_FLOAT64] = {"float64", 8},
};

const char *gguf_value_type_name(gguf_value_type type) {
    return gguf_type_is_valid(type) ? value_types[type].name : "invalid";
}

size_t gguf_value_type_size(gguf_value_type type) {
    return gguf_type_is_valid(type) ? value_types[type].size : 0;
}

static bool is_signed_type(gguf_value_type type) {
    return type == GGUF_TYPE_INT8 || type == GGUF_TYPE_INT16 || type == GGUF_TYPE_INT32 || type == GGUF_TYPE_INT64;
}

static bool is_float_type(gguf_value_type type) { return type == GGUF_TYPE_FLOAT32 || type == GGUF_TYPE_FLOAT64; }

static bool is_integer_type(gguf_value_type type) {
    return is_signed_type(type) || type == GGUF_TYPE_UINT8 || type == GGUF_TYPE_UINT16 ||
           type == GGUF_TYPE_UINT32 || type == GGUF_TYPE_UINT64;
}

gguf_value gguf_scalar_load(gguf_value_type type, const uint8_t *p) {
    gguf_value v = {.type = type};
    uint64_t raw = gguf_load_le(p, (unsigned)gguf_value_type_size(type));
    switch (type) {
    case GGUF_TYPE_INT8: v.i64 = (int8_t)raw; break;
    case GGUF_TYPE_INT16: v.i64 = (int16_t)raw; break;
    case GGUF_TYPE_INT32: v.i64 = (int32_t)raw; break;
    case GGUF_TYPE_INT64: v.i64 = (int64_t)raw; break;
    case GGUF_TYPE_FLOAT32: {
        uint32_t bits = (uint32_t)raw;
        float f;
        memcpy(&f, &bits, sizeof f);
        v.f64 = f;
        break;
    }
    case GGUF_TYPE_FLOAT64: memcpy(&v.f64, &raw, sizeof v.f64); break;
    default: v.u64 = raw; break;
    }
    return v;
}

int gguf_str_cmp(gguf_str a, gguf_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.data, b.data, n) : 0;
    if (c != 0) return c;
    return (a.len > b.len) - (a.len < b.len);
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.data, cstr, n) == 0);
}

static bool arrays_equal(const gguf_array *a, const gguf_array *b) {
    if (a->type != b->type || a->n != b->n) return false;
    if (!a->items) return a->n == 0 || memcmp(a->data, b->data, a->n * gguf_value_type_size(a->type)) == 0;
    for (uint64_t i = 0; i < a->n; i++)
        if (!gguf_values_equal(&a->items[i], &b->items[i])) return false;
    return true;
}

bool gguf_values_equal(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_TYPE_STRING: return a->str.len == b->str.len && memcmp(a->str.data, b->str.data, a->str.len) == 0;
    case GGUF_TYPE_ARRAY: return arrays_equal(&a->arr, &b->arr);
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: return (isnan(a->f64) && isnan(b->f64)) || memcmp(&a->f64, &b->f64, sizeof a->f64) == 0;
    default: return a->u64 == b->u64;
    }
}

/* --- lookup ------------------------------------------------------------- */

const gguf_kv *gguf_find(const gguf_file *file, const char *key) {
    gguf_str want = {strlen(key), key};
    uint64_t lo = 0, hi = file->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_kv *kv = &file->kv[file->kv_by_key[mid]];
        int c = gguf_str_cmp(kv->key, want);
        if (c == 0) return kv;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *file, const char *name) {
    gguf_str want = {strlen(name), name};
    uint64_t lo = 0, hi = file->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_tensor *t = &file->tensors[file->by_name[mid]];
        int c = gguf_str_cmp(t->name, want);
        if (c == 0) return t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

uint64_t gguf_tensor_n_elements(const gguf_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

/* --- typed getters -------------------------------------------------------- */

/* "uint32" or "array of string": how a type mismatch names what it found. */
static void describe_type(const gguf_value *v, char *buf, size_t size) {
    if (v->type == GGUF_TYPE_ARRAY)
        snprintf(buf, size, "array of %s", gguf_value_type_name(v->arr.type));
    else
        snprintf(buf, size, "%s", gguf_value_type_name(v->type));
}

static moe_status type_mismatch(const char *key, const char *expected, const gguf_value *v, moe_error *err) {
    char found[48];
    describe_type(v, found, sizeof found);
    return moe_error_set(err, MOE_ERR_TYPE, "key '%s': expected %s, found %s", key, expected, found);
}

/* The value of `key`, or NULL (MOE_ERR_NOT_FOUND in err) when absent. */
static const gguf_value *find_value(const gguf_file *file, const char *key, moe_error *err) {
    const gguf_kv *kv = gguf_find(file, key);
    if (!kv) moe_error_set(err, MOE_ERR_NOT_FOUND, "key '%s' not found", key);
    return kv ? &kv->value : NULL;
}

/* An integer of any width and signedness, as a sign and a magnitude, so one
 * range check serves every getter. Both are written on every path (0 on an
 * error): GCC at -O3 cannot tell that an error's status is never MOE_OK and
 * took the getters' reads for uninitialised ones. */
static moe_status find_integer(const gguf_file *file, const char *key, const char *expected, bool *negative,
                               uint64_t *magnitude, moe_error *err) {
    *negative = false;
    *magnitude = 0;
    const gguf_value *v = find_value(file, key, err);
    if (!v) return MOE_ERR_NOT_FOUND;
    if (!is_integer_type(v->type)) return type_mismatch(key, expected, v, err);
    *negative = is_signed_type(v->type) && v->i64 < 0;
    /* The magnitude of INT64_MIN is 2^63: negate in unsigned arithmetic. */
    *magnitude = *negative ? 0 - (uint64_t)v->i64 : v->u64;
    return MOE_OK;
}

static moe_status out_of_range(const char *key, bool negative, uint64_t magnitude, const char *expected,
                               moe_error *err) {
    return moe_error_set(err, MOE_ERR_RANGE, "key '%s': value %s%" PRIu64 " does not fit in %s", key,
                         negative ? "-" : "", magnitude, expected);
}

moe_status gguf_get_u32(const gguf_file *file, const char *key, uint32_t *out, moe_error *err) {
    bool negative;
    uint64_t magnitude;
    moe_status st = find_integer(file, key, "uint32", &negative, &magnitude, err);
    if (st != MOE_OK) return st;
    if (negative || magnitude > UINT32_MAX) return out_of_range(key, negative, magnitude, "uint32", err);
    *out = (uint32_t)magnitude;
    return MOE_OK;
}

moe_status gguf_get_u64(const gguf_file *file, const char *key, uint64_t *out, moe_error *err) {
    bool negative;
    uint64_t magnitude;
    moe_status st = find_integer(file, key, "uint64", &negative, &magnitude, err);
    if (st != MOE_OK) return st;
    if (negative) return out_of_range(key, negative, magnitude, "uint64", err);
    *out = magnitude;
    return MOE_OK;
}

moe_status gguf_get_i64(const gguf_file *file, const char *key, int64_t *out, moe_error *err) {
    bool negative;
    uint64_t magnitude;
    moe_status st = find_integer(file, key, "int64", &negative, &magnitude, err);
    if (st != MOE_OK) return st;
    if (!negative && magnitude > INT64_MAX) return out_of_range(key, negative, magnitude, "int64", err);
    /* Back from sign and magnitude without overflowing at INT64_MIN. */
    *out = negative ? -(int64_t)(magnitude - 1) - 1 : (int64_t)magnitude;
    return MOE_OK;
}

moe_status gguf_get_f32(const gguf_file *file, const char *key, float *out, moe_error *err) {
    const gguf_value *v = find_value(file, key, err);
    if (!v) return MOE_ERR_NOT_FOUND;
    if (!is_float_type(v->type)) return type_mismatch(key, "float32", v, err);
    /* A finite float64 beyond float's range would silently become infinity. */
    if (isfinite(v->f64) && fabs(v->f64) > FLT_MAX)
        return moe_error_set(err, MOE_ERR_RANGE, "key '%s': value %g does not fit in float32", key, v->f64);
    *out = (float)v->f64;
    return MOE_OK;
}

moe_status gguf_get_bool(const gguf_file *file, const char *key, bool *out, moe_error *err) {
    const gguf_value *v = find_value(file, key, err);
    if (!v) return MOE_ERR_NOT_FOUND;
    if (v->type != GGUF_TYPE_BOOL) return type_mismatch(key, "bool", v, err);
    *out = v->u64 != 0;
    return MOE_OK;
}

moe_status gguf_get_str(const gguf_file *file, const char *key, gguf_str *out, moe_error *err) {
    const gguf_value *v = find_value(file, key, err);
    if (!v) return MOE_ERR_NOT_FOUND;
    if (v->type != GGUF_TYPE_STRING) return type_mismatch(key, "string", v, err);
    *out = v->str;
    return MOE_OK;
}

moe_status gguf_get_array(const gguf_file *file, const char *key, gguf_value_type elem, const gguf_array **out,
                          moe_error *err) {
    const gguf_value *v = find_value(file, key, err);
    if (!v) return MOE_ERR_NOT_FOUND;
    bool any = elem == GGUF_TYPE_COUNT;
    if (v->type != GGUF_TYPE_ARRAY || (!any && v->arr.type != elem)) {
        char expected[48];
        snprintf(expected, sizeof expected, "array of %s", any ? "any type" : gguf_value_type_name(elem));
        return type_mismatch(key, expected, v, err);
    }
    *out = &v->arr;
    return MOE_OK;
}

/* --- array elements --------------------------------------------------------- */

static gguf_value array_element(const gguf_array *arr, uint64_t i) {
    size_t size = gguf_value_type_size(arr->type);
    assert(size != 0 && i < arr->n);
    return gguf_scalar_load(arr->type, (const uint8_t *)arr->data + i * size);
}

uint64_t gguf_array_get_u64(const gguf_array *arr, uint64_t i) {
    assert(!is_float_type(arr->type));
    return array_element(arr, i).u64;
}

int64_t gguf_array_get_i64(const gguf_array *arr, uint64_t i) {
    assert(!is_float_type(arr->type));
    return array_element(arr, i).i64;
}

double gguf_array_get_f64(const gguf_array *arr, uint64_t i) {
    gguf_value v = array_element(arr, i);
    if (is_float_type(arr->type)) return v.f64;
    return is_signed_type(arr->type) ? (double)v.i64 : (double)v.u64;
}

gguf_str gguf_array_get_str(const gguf_array *arr, uint64_t i) {
    assert(arr->type == GGUF_TYPE_STRING && i < arr->n);
    return arr->items[i].str;
}

/* --- tensor shapes ------------------------------------------------------------ */

bool gguf_shape_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *nbytes, char *why,
                      size_t why_size) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        snprintf(why, why_size, "n_dims %" PRIu32 " is outside 1..%d", n_dims, GGUF_MAX_DIMS);
        return false;
    }
    /* GGML tolerates empty tensors, but no model has one, and refusing them
     * gives every tensor at least one byte of data, so the bounds and
     * overlap checks need no special case. */
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0) {
            snprintf(why, why_size, "dimension %" PRIu32 " is zero", d);
            return false;
        }
        if (__builtin_mul_overflow(n, ne[d], &n) || n > INT64_MAX) {
            snprintf(why, why_size, "element count overflows int64 at dimension %" PRIu32 " (ne = %" PRIu64 ")",
                     d, ne[d]);
            return false;
        }
    }
    const quant_format *format = quant_format_of(type);
    if (!format) {
        snprintf(why, why_size, "unknown tensor type id %" PRIu32, type);
        return false;
    }
    uint64_t block = (uint64_t)format->block_size;
    if (ne[0] % block != 0) {
        snprintf(why, why_size, "ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu64, ne[0],
                 format->name, block);
        return false;
    }
    /* n / block blocks cannot overflow; their bytes can. */
    if (__builtin_mul_overflow(n / block, (uint64_t)format->block_bytes, nbytes)) {
        snprintf(why, why_size, "byte size overflows uint64 (%" PRIu64 " elements of %s)", n, format->name);
        return false;
    }
    return true;
}
