/*
 * gguf_read.c — opening and validating GGUF files (see gguf.h).
 *
 * One pass over the bytes with a cursor that cannot move past the end: every
 * read asks for n bytes and fails, naming the offset, when fewer remain.
 * One small function per section, in file order: header, key/value pairs
 * (values recursive, array nesting bounded), tensor infos; then the checks
 * that need a whole section: unique keys, the alignment, the data section's
 * bounds, unique tensor names, overlaps.
 *
 * Memory stays proportional to the file size, whatever the file claims:
 * every count is checked against the bytes that remain before anything is
 * allocated for it. A key/value pair takes at least 13 bytes, a tensor info
 * 32, an array element its packed size (a string 8, a nested array 12), so
 * the parsed elements of all arrays together number at most size / 8.
 *
 * The file is mapped read-only and private; if another process truncates it
 * while it is open, touching the lost pages raises SIGBUS, as with any
 * mapping. Models are not rewritten in place, so we accept that.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "gguf/gguf_internal.h"

/* The smallest encodings, to bound counts by the bytes that remain. */
enum {
    MIN_KV_BYTES = 8 + 4 + 1,                  /* empty key, value type, a one-byte value */
    MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8, /* empty name, n_dims, one ne, type, offset */
    MIN_STRING_BYTES = 8,                      /* the length */
    MIN_ARRAY_BYTES = 4 + 8,                   /* element type, count */
};

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    moe_error *err;
} cursor;

/* What an empty buffer parses from, so the cursor never offsets NULL. */
static const uint8_t no_bytes[1];

static moe_status fail_at(moe_error *err, uint64_t offset, const char *fmt, ...) MOE_PRINTF(3, 4);

/* Every format error: "offset N: <what was wrong>". */
static moe_status fail_at(moe_error *err, uint64_t offset, const char *fmt, ...) {
    char what[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return moe_error_set(err, MOE_ERR_FORMAT, "offset %" PRIu64 ": %s", offset, what);
}

/* Up to 64 bytes of a key or name from the file, fit for a message: bytes
 * other than printable ASCII become '?', so a hostile file cannot send
 * control codes to a terminal. */
typedef struct printable {
    char text[72];
} printable;

static printable show(gguf_str s) {
    printable p;
    uint64_t n = s.len < 64 ? s.len : 64;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.data[i];
        p.text[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    strcpy(p.text + n, s.len > n ? "..." : "");
    return p;
}

/* Where a string that points into the file starts (its length field). */
static uint64_t str_offset(const gguf_file *f, gguf_str s) {
    return (uint64_t)((const uint8_t *)s.data - f->base) - MIN_STRING_BYTES;
}

/* --- the cursor ----------------------------------------------------------- */

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

/* n bytes for `what`, or NULL (error set) when fewer remain. */
static const uint8_t *take(cursor *c, uint64_t n, const char *what) {
    if (n > remaining(c)) {
        fail_at(c->err, c->pos, "%s needs %" PRIu64 " bytes but only %" PRIu64 " remain (truncated file?)", what,
                n, remaining(c));
        return NULL;
    }
    const uint8_t *p = c->base + c->pos;
    c->pos += n;
    return p;
}

static moe_status read_u32(cursor *c, const char *what, uint32_t *out) {
    const uint8_t *p = take(c, 4, what);
    if (!p) return MOE_ERR_FORMAT;
    *out = (uint32_t)gguf_load_le(p, 4);
    return MOE_OK;
}

static moe_status read_u64(cursor *c, const char *what, uint64_t *out) {
    const uint8_t *p = take(c, 8, what);
    if (!p) return MOE_ERR_FORMAT;
    *out = gguf_load_le(p, 8);
    return MOE_OK;
}

/* A string: u64 length, then the bytes, which stay in the file. */
static moe_status read_str(cursor *c, const char *what, gguf_str *out) {
    uint64_t at = c->pos, len;
    moe_status st = read_u64(c, what, &len);
    if (st != MOE_OK) return st;
    if (len > remaining(c))
        return fail_at(c->err, at, "%s length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes remain)",
                       what, len, remaining(c));
    out->len = len;
    out->data = (const char *)c->base + c->pos;
    c->pos += len;
    return MOE_OK;
}

static moe_status read_type(cursor *c, const char *what, gguf_value_type *out) {
    uint64_t at = c->pos;
    uint32_t type;
    moe_status st = read_u32(c, what, &type);
    if (st != MOE_OK) return st;
    if (!gguf_type_is_valid(type))
        return fail_at(c->err, at, "invalid %s %" PRIu32 " (valid: 0..%d)", what, type, GGUF_TYPE_COUNT - 1);
    *out = (gguf_value_type)type;
    return MOE_OK;
}

/* --- header ------------------------------------------------------------- */

/* A count of records that each take at least `min_bytes`: more than the rest
 * of the file can hold is a lie, and the indices are 32-bit. */
static moe_status check_count(cursor *c, uint64_t at, const char *what, uint64_t count, uint64_t min_bytes) {
    uint64_t limit = remaining(c) / min_bytes;
    if (limit > UINT32_MAX) limit = UINT32_MAX;
    if (count <= limit) return MOE_OK;
    return fail_at(c->err, at,
                   "%s count %" PRIu64 " is impossible: the %" PRIu64 " bytes that follow hold at most %" PRIu64, what,
                   count, remaining(c), limit);
}

static moe_status parse_header(cursor *c, gguf_file *f) {
    const uint8_t *m = take(c, 4, "the magic");
    if (!m) return MOE_ERR_FORMAT;
    if (memcmp(m, GGUF_MAGIC, 4) != 0)
        return fail_at(c->err, 0, "bad magic %02x %02x %02x %02x, expected 47 47 55 46 (\"GGUF\"): not a GGUF file",
                       m[0], m[1], m[2], m[3]);
    moe_status st = read_u32(c, "the version", &f->version);
    if (st != MOE_OK) return st;
    if (f->version < 2 || f->version > 3) {
        /* GGUF 3 allows big-endian files; their version reads byte-swapped. */
        bool swapped = f->version == 0x02000000u || f->version == 0x03000000u;
        return fail_at(c->err, 4, "version %" PRIu32 " is not supported (only 2 and 3)%s", f->version,
                       swapped ? "; the file looks big-endian" : f->version == 1 ? "; re-convert the model" : "");
    }
    uint64_t counts_at = c->pos;
    st = read_u64(c, "the tensor count", &f->n_tensors);
    if (st == MOE_OK) st = read_u64(c, "the key/value count", &f->n_kv);
    if (st == MOE_OK) st = check_count(c, counts_at + 8, "key/value", f->n_kv, MIN_KV_BYTES);
    if (st == MOE_OK) st = check_count(c, counts_at, "tensor", f->n_tensors, MIN_TENSOR_INFO_BYTES);
    return st;
}

/* --- key/value pairs ------------------------------------------------------ */

static moe_status parse_value(cursor *c, gguf_value_type type, unsigned depth, gguf_value *v);

/* Numeric and bool elements stay in the file, packed; bools must be 0 or 1. */
static moe_status take_packed(cursor *c, uint64_t n, gguf_array *arr) {
    uint64_t at = c->pos;
    const uint8_t *p = take(c, n * gguf_value_type_size(arr->type), "array elements");
    if (!p) return MOE_ERR_FORMAT;
    for (uint64_t i = 0; arr->type == GGUF_TYPE_BOOL && i < n; i++)
        if (p[i] > 1)
            return fail_at(c->err, at + i, "bool array element %" PRIu64 " is %u, not 0 or 1", i, p[i]);
    arr->data = p;
    arr->n = n;
    return MOE_OK;
}

/* Strings and nested arrays are parsed into items, zeroed first so that
 * gguf_close can free a half-parsed array. */
static moe_status parse_items(cursor *c, uint64_t n, unsigned depth, gguf_array *arr) {
    if (n == 0) return MOE_OK;
    arr->items = calloc(n, sizeof *arr->items);
    if (!arr->items)
        return moe_error_set(c->err, MOE_ERR_NOMEM, "out of memory for an array of %" PRIu64 " elements", n);
    arr->n = n;
    for (uint64_t i = 0; i < n; i++) {
        moe_status st = parse_value(c, arr->type, depth, &arr->items[i]);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* An array: element type, count, elements. `depth` counts the arrays that
 * enclose the elements, this one included. */
static moe_status parse_array(cursor *c, unsigned depth, gguf_array *arr) {
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return fail_at(c->err, c->pos, "arrays nested more than %d deep", GGUF_MAX_ARRAY_DEPTH);
    moe_status st = read_type(c, "array element type", &arr->type);
    if (st != MOE_OK) return st;
    uint64_t at = c->pos, n;
    st = read_u64(c, "the array length", &n);
    if (st != MOE_OK) return st;
    size_t size = gguf_value_type_size(arr->type);
    uint64_t min = size ? size : arr->type == GGUF_TYPE_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (n > remaining(c) / min)
        return fail_at(c->err, at, "array length %" PRIu64 " is impossible: the %" PRIu64
                       " bytes that follow hold at most %" PRIu64 " %s elements",
                       n, remaining(c), remaining(c) / min, gguf_value_type_name(arr->type));
    return size ? take_packed(c, n, arr) : parse_items(c, n, depth, arr);
}

static moe_status parse_value(cursor *c, gguf_value_type type, unsigned depth, gguf_value *v) {
    v->type = type;
    if (type == GGUF_TYPE_STRING) return read_str(c, "string", &v->str);
    if (type == GGUF_TYPE_ARRAY) return parse_array(c, depth + 1, &v->arr);
    uint64_t at = c->pos;
    const uint8_t *p = take(c, gguf_value_type_size(type), "the value");
    if (!p) return MOE_ERR_FORMAT;
    *v = gguf_scalar_load(type, p);
    if (type == GGUF_TYPE_BOOL && v->u64 > 1) return fail_at(c->err, at, "bool value %u is not 0 or 1", p[0]);
    return MOE_OK;
}

static moe_status parse_kvs(cursor *c, gguf_file *f) {
    if (f->n_kv == 0) return MOE_OK;
    f->kv = calloc(f->n_kv, sizeof *f->kv);
    if (!f->kv) return moe_error_set(c->err, MOE_ERR_NOMEM, "out of memory for %" PRIu64 " keys", f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        gguf_value_type type = GGUF_TYPE_UINT8; /* read_type sets it on MOE_OK; GCC -O3 cannot see that */
        moe_status st = read_str(c, "key", &kv->key);
        if (st == MOE_OK) st = read_type(c, "value type", &type);
        if (st == MOE_OK) st = parse_value(c, type, 0, &kv->value);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* --- sorted indices --------------------------------------------------------- */

/* Pointers to the n records at base (`stride` bytes apart) in the order of
 * `compare`; NULL when out of memory. The caller frees it. */
static const void **sort_records(const void *base, size_t stride, uint64_t n,
                                 int (*compare)(const void *, const void *)) {
    const void **order = malloc(n * sizeof *order);
    if (!order) return NULL;
    for (uint64_t i = 0; i < n; i++) order[i] = (const char *)base + i * stride;
    qsort(order, n, sizeof *order, compare);
    return order;
}

static int compare_keys(const void *a, const void *b) {
    const gguf_kv *x = *(const void *const *)a, *y = *(const void *const *)b;
    return gguf_str_cmp(x->key, y->key);
}

static int compare_names(const void *a, const void *b) {
    const gguf_tensor *x = *(const void *const *)a, *y = *(const void *const *)b;
    return gguf_str_cmp(x->name, y->name);
}

static int compare_offsets(const void *a, const void *b) {
    const gguf_tensor *x = *(const void *const *)a, *y = *(const void *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Sort keys for lookup; neighbours that are equal are duplicates, reported
 * at the later one. */
static moe_status index_keys(gguf_file *f, moe_error *err) {
    if (f->n_kv == 0) return MOE_OK;
    const void **order = sort_records(f->kv, sizeof *f->kv, f->n_kv, compare_keys);
    f->kv_by_key = malloc(f->n_kv * sizeof *f->kv_by_key);
    moe_status st = order && f->kv_by_key ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; st == MOE_OK && i < f->n_kv; i++) {
        const gguf_kv *kv = order[i];
        f->kv_by_key[i] = (uint32_t)(kv - f->kv);
        const gguf_kv *prev = i > 0 ? order[i - 1] : NULL;
        if (prev && gguf_str_cmp(prev->key, kv->key) == 0) {
            const gguf_kv *first = prev < kv ? prev : kv, *second = prev < kv ? kv : prev;
            st = fail_at(err, str_offset(f, second->key), "duplicate key '%s' (first at offset %" PRIu64 ")",
                         show(kv->key).text, str_offset(f, first->key));
        }
    }
    free(order);
    return st;
}

static moe_status index_names(gguf_file *f, moe_error *err) {
    if (f->n_tensors == 0) return MOE_OK;
    const void **order = sort_records(f->tensors, sizeof *f->tensors, f->n_tensors, compare_names);
    f->by_name = malloc(f->n_tensors * sizeof *f->by_name);
    moe_status st = order && f->by_name ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; st == MOE_OK && i < f->n_tensors; i++) {
        const gguf_tensor *t = order[i];
        f->by_name[i] = (uint32_t)(t - f->tensors);
        const gguf_tensor *prev = i > 0 ? order[i - 1] : NULL;
        if (prev && gguf_str_cmp(prev->name, t->name) == 0) {
            const gguf_tensor *first = prev < t ? prev : t, *second = prev < t ? t : prev;
            st = fail_at(err, str_offset(f, second->name), "duplicate tensor name '%s' (first at offset %" PRIu64 ")",
                         show(t->name).text, str_offset(f, first->name));
        }
    }
    free(order);
    return st;
}

/* --- alignment and tensor infos ----------------------------------------------- */

static moe_status read_alignment(gguf_file *f, moe_error *err) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, GGUF_ALIGNMENT_KEY);
    if (!kv) return MOE_OK;
    uint64_t at = str_offset(f, kv->key);
    if (kv->value.type != GGUF_TYPE_UINT32)
        return fail_at(err, at, GGUF_ALIGNMENT_KEY " has type %s, expected uint32",
                       gguf_value_type_name(kv->value.type));
    if (!gguf_is_power_of_two(kv->value.u64))
        return fail_at(err, at, GGUF_ALIGNMENT_KEY " %" PRIu64 " is not a power of two", kv->value.u64);
    f->alignment = kv->value.u64;
    return MOE_OK;
}

/* name, n_dims, ne[n_dims], type, offset. */
static moe_status parse_tensor_info(cursor *c, const gguf_file *f, gguf_tensor *t) {
    uint64_t at = c->pos;
    moe_status st = read_str(c, "tensor name", &t->name);
    if (st == MOE_OK) st = read_u32(c, "tensor n_dims", &t->n_dims);
    if (st != MOE_OK) return st;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail_at(c->err, c->pos - 4, "tensor '%s': n_dims %" PRIu32 " is outside 1..%d", show(t->name).text,
                       t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; st == MOE_OK && d < t->n_dims; d++) st = read_u64(c, "tensor dimension", &t->ne[d]);
    uint32_t type;
    if (st == MOE_OK) st = read_u32(c, "tensor type", &type);
    if (st == MOE_OK) st = read_u64(c, "tensor offset", &t->offset);
    if (st != MOE_OK) return st;
    char why[256];
    if (!gguf_shape_bytes(type, t->n_dims, t->ne, &t->nbytes, why, sizeof why))
        return fail_at(c->err, at, "tensor '%s': %s", show(t->name).text, why);
    t->type = (moe_type)type;
    if (t->offset % f->alignment != 0)
        return fail_at(c->err, at, "tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                       show(t->name).text, t->offset, f->alignment);
    return MOE_OK;
}

static moe_status parse_tensor_infos(cursor *c, gguf_file *f) {
    if (f->n_tensors == 0) return MOE_OK;
    f->tensors = calloc(f->n_tensors, sizeof *f->tensors);
    if (!f->tensors)
        return moe_error_set(c->err, MOE_ERR_NOMEM, "out of memory for %" PRIu64 " tensors", f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        moe_status st = parse_tensor_info(c, f, &f->tensors[i]);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* --- layout ------------------------------------------------------------------- */

/* The data section starts at the first multiple of the alignment after the
 * directory; every tensor must lie inside the file. A file without tensors
 * may end before that padding. */
static moe_status place_tensors(cursor *c, gguf_file *f) {
    uint64_t start;
    if (__builtin_add_overflow(c->pos, f->alignment - 1, &start))
        return fail_at(c->err, c->pos, "the data section start overflows");
    f->data_offset = start & ~(f->alignment - 1);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t begin, end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, t->nbytes, &end) || end > f->size)
            return fail_at(c->err, str_offset(f, t->name),
                           "tensor '%s': %" PRIu64 " bytes at data offset %" PRIu64
                           " run past the end of the file (data starts at %" PRIu64 ", file size %" PRIu64 ")",
                           show(t->name).text, t->nbytes, t->offset, f->data_offset, f->size);
        t->data = f->base + begin;
    }
    return MOE_OK;
}

static moe_status check_overlaps(gguf_file *f, moe_error *err) {
    if (f->n_tensors < 2) return MOE_OK;
    const void **order = sort_records(f->tensors, sizeof *f->tensors, f->n_tensors, compare_offsets);
    if (!order) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    moe_status st = MOE_OK;
    for (uint64_t i = 1; st == MOE_OK && i < f->n_tensors; i++) {
        const gguf_tensor *prev = order[i - 1], *t = order[i];
        /* Both lie inside the file, so the sum cannot overflow. */
        if (prev->offset + prev->nbytes > t->offset)
            st = fail_at(err, f->data_offset + t->offset,
                         "tensor '%s' (data offset %" PRIu64 ") overlaps tensor '%s' (data offset %" PRIu64
                         ", %" PRIu64 " bytes)",
                         show(t->name).text, t->offset, show(prev->name).text, prev->offset, prev->nbytes);
    }
    free(order);
    return st;
}

/* --- open and close ------------------------------------------------------------ */

static moe_status parse(cursor *c, gguf_file *f) {
    moe_status st = parse_header(c, f);
    if (st == MOE_OK) st = parse_kvs(c, f);
    if (st == MOE_OK) st = index_keys(f, c->err);
    if (st == MOE_OK) st = read_alignment(f, c->err);
    if (st == MOE_OK) st = parse_tensor_infos(c, f);
    if (st == MOE_OK) st = place_tensors(c, f);
    if (st == MOE_OK) st = index_names(f, c->err);
    if (st == MOE_OK) st = check_overlaps(f, c->err);
    return st;
}

moe_status gguf_open_memory(const void *data, size_t size, gguf_file **out, moe_error *err) {
    *out = NULL;
    if (!data && size != 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "gguf_open_memory: NULL data of %zu bytes", size);
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    f->fd = -1;
    f->base = size ? data : no_bytes;
    f->size = size;
    cursor c = {.base = f->base, .size = size, .err = err};
    moe_status st = parse(&c, f);
    if (st != MOE_OK) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return MOE_OK;
}

/* Map a regular file; an empty one gives base NULL, size 0, which the parser
 * then rejects as too short. */
static moe_status map_file(int fd, const char *path, const void **base, uint64_t *size, moe_error *err) {
    struct stat info;
    if (fstat(fd, &info) != 0) return moe_error_set(err, MOE_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (S_ISDIR(info.st_mode)) return moe_error_set(err, MOE_ERR_IO, "%s: is a directory, not a GGUF file", path);
    if (!S_ISREG(info.st_mode)) return moe_error_set(err, MOE_ERR_IO, "%s: not a regular file", path);
    *base = NULL;
    *size = (uint64_t)info.st_size;
    if (*size == 0) return MOE_OK;
    if (*size > SIZE_MAX)
        return moe_error_set(err, MOE_ERR_IO, "%s: too large to map (%" PRIu64 " bytes)", path, *size);
    void *p = mmap(NULL, (size_t)*size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return moe_error_set(err, MOE_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    *base = p;
    return MOE_OK;
}

moe_status gguf_open(const char *path, gguf_file **out, moe_error *err) {
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; regular files,
     * the only kind we go on to map, ignore it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return moe_error_set(err, MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    const void *base = NULL;
    uint64_t size = 0;
    moe_status st = map_file(fd, path, &base, &size, err);
    if (st == MOE_OK) {
        st = gguf_open_memory(base, (size_t)size, out, err);
        if (st != MOE_OK) {
            moe_error_prefix(err, "%s", path);
            if (base) munmap((void *)base, (size_t)size);
        }
    }
    if (st != MOE_OK) {
        close(fd);
        return st;
    }
    (*out)->fd = fd;
    (*out)->mapped = base != NULL;
    return MOE_OK;
}

static void free_items(gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY || !v->arr.items) return;
    for (uint64_t i = 0; i < v->arr.n; i++) free_items(&v->arr.items[i]);
    free(v->arr.items);
}

void gguf_close(gguf_file *file) {
    if (!file) return;
    for (uint64_t i = 0; file->kv && i < file->n_kv; i++) free_items(&file->kv[i].value);
    free(file->kv);
    free(file->kv_by_key);
    free(file->tensors);
    free(file->by_name);
    if (file->mapped) munmap((void *)file->base, (size_t)file->size);
    if (file->fd >= 0) close(file->fd);
    free(file);
}
