/*
 * test_gguf.c — the GGUF reader and writer.
 *
 * Round trips through the writer and the reader (every value type at its
 * extremes, nested arrays, tensors of several types and two alignments),
 * the accessors' widening and error rules, every truncation of a small
 * file, hand-made corrupt files that must each fail with their specific
 * message, open errors, and misuse of the streaming writer.
 */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "test.h"

static char tmp_dir[] = "/tmp/test_gguf.XXXXXX";

typedef struct path_buf {
    char text[256];
} path_buf;

/* A file in this run's scratch directory. */
static path_buf tmp_path(const char *name) {
    path_buf p;
    snprintf(p.text, sizeof p.text, "%s/%s", tmp_dir, name);
    return p;
}

static uint8_t *read_bytes(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    rewind(f);
    uint8_t *bytes = malloc(*size ? *size : 1);
    if (bytes && fread(bytes, 1, *size, f) != *size) {
        free(bytes);
        bytes = NULL;
    }
    fclose(f);
    return bytes;
}

/* Save, free the writer and open the result (unlinked: the mapping stays). */
static gguf_file *save_and_open(gguf_writer *w) {
    path_buf p = tmp_path("round_trip.gguf");
    const char *path = p.text;
    moe_error err = {0};
    moe_status st = gguf_writer_save(w, path, &err);
    CHECKF(st == MOE_OK, "save: %s", err.message);
    gguf_writer_free(w);
    gguf_file *f = NULL;
    st = gguf_open(path, &f, &err);
    CHECKF(st == MOE_OK, "open: %s", err.message);
    unlink(path);
    return f;
}

/* Save, free the writer and return the file's bytes. */
static uint8_t *save_to_bytes(gguf_writer *w, size_t *size) {
    path_buf p = tmp_path("bytes.gguf");
    const char *path = p.text;
    moe_error err = {0};
    moe_status st = gguf_writer_save(w, path, &err);
    CHECKF(st == MOE_OK, "save: %s", err.message);
    gguf_writer_free(w);
    uint8_t *bytes = read_bytes(path, size);
    CHECK(bytes != NULL);
    unlink(path);
    return bytes;
}

static bool contains(const char *haystack, const char *needle) { return strstr(haystack, needle) != NULL; }

/* --- round trips ------------------------------------------------------------ */

typedef struct named_value {
    const char *key;
    gguf_value value;
} named_value;

static void test_scalars_round_trip(void) {
    const named_value cases[] = {
        {"u8.min", {.type = GGUF_TYPE_UINT8, .u64 = 0}},
        {"u8.max", {.type = GGUF_TYPE_UINT8, .u64 = UINT8_MAX}},
        {"i8.min", {.type = GGUF_TYPE_INT8, .i64 = INT8_MIN}},
        {"i8.max", {.type = GGUF_TYPE_INT8, .i64 = INT8_MAX}},
        {"u16.max", {.type = GGUF_TYPE_UINT16, .u64 = UINT16_MAX}},
        {"i16.min", {.type = GGUF_TYPE_INT16, .i64 = INT16_MIN}},
        {"i16.max", {.type = GGUF_TYPE_INT16, .i64 = INT16_MAX}},
        {"u32.max", {.type = GGUF_TYPE_UINT32, .u64 = UINT32_MAX}},
        {"i32.min", {.type = GGUF_TYPE_INT32, .i64 = INT32_MIN}},
        {"i32.max", {.type = GGUF_TYPE_INT32, .i64 = INT32_MAX}},
        {"u64.max", {.type = GGUF_TYPE_UINT64, .u64 = UINT64_MAX}},
        {"i64.min", {.type = GGUF_TYPE_INT64, .i64 = INT64_MIN}},
        {"i64.max", {.type = GGUF_TYPE_INT64, .i64 = INT64_MAX}},
        {"f32.max", {.type = GGUF_TYPE_FLOAT32, .f64 = FLT_MAX}},
        {"f32.tiny", {.type = GGUF_TYPE_FLOAT32, .f64 = -FLT_TRUE_MIN}},
        {"f32.inf", {.type = GGUF_TYPE_FLOAT32, .f64 = INFINITY}},
        {"f64.max", {.type = GGUF_TYPE_FLOAT64, .f64 = -DBL_MAX}},
        {"f64.tiny", {.type = GGUF_TYPE_FLOAT64, .f64 = DBL_TRUE_MIN}},
        {"f64.inf", {.type = GGUF_TYPE_FLOAT64, .f64 = -INFINITY}},
        {"bool.true", {.type = GGUF_TYPE_BOOL, .u64 = 1}},
        {"bool.false", {.type = GGUF_TYPE_BOOL, .u64 = 0}},
        {"typed.u32", {.type = GGUF_TYPE_UINT32, .u64 = 4000000000u}},
        {"typed.i32", {.type = GGUF_TYPE_INT32, .i64 = -2000000000}},
        {"typed.u64", {.type = GGUF_TYPE_UINT64, .u64 = 0x123456789abcdef0u}},
        {"typed.f32", {.type = GGUF_TYPE_FLOAT32, .f64 = 1e-6f}},
        {"typed.bool", {.type = GGUF_TYPE_BOOL, .u64 = 1}},
    };
    size_t n = sizeof cases / sizeof cases[0];
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    for (size_t i = 0; i < n - 5; i++) CHECK(gguf_writer_set_value(w, cases[i].key, &cases[i].value, &err) == MOE_OK);
    CHECK(gguf_writer_set_u32(w, "typed.u32", 4000000000u, &err) == MOE_OK);
    CHECK(gguf_writer_set_i32(w, "typed.i32", -2000000000, &err) == MOE_OK);
    CHECK(gguf_writer_set_u64(w, "typed.u64", 0x123456789abcdef0u, &err) == MOE_OK);
    CHECK(gguf_writer_set_f32(w, "typed.f32", 1e-6f, &err) == MOE_OK);
    CHECK(gguf_writer_set_bool(w, "typed.bool", true, &err) == MOE_OK);
    CHECK(gguf_writer_set_f32(w, "f32.nan", NAN, &err) == MOE_OK);
    gguf_file *f = save_and_open(w);
    if (!f) return;
    CHECK(f->version == 3 && f->n_kv == n + 1 && f->n_tensors == 0);
    for (size_t i = 0; i < n; i++) {
        const gguf_kv *kv = gguf_find(f, cases[i].key);
        CHECKF(kv && gguf_values_equal(&kv->value, &cases[i].value), "key %s", cases[i].key);
        CHECK(kv == &f->kv[i]); /* file order is insertion order */
    }
    float nan_back = 0;
    CHECK(gguf_get_f32(f, "f32.nan", &nan_back, &err) == MOE_OK && isnan(nan_back));
    gguf_close(f);
}

static void test_strings_round_trip(void) {
    static const char embedded[] = {'a', '\0', 'b', '\xff', '\x01', '\n'};
    static const char utf8[] = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82";
    char all_bytes[256], long_str[5000];
    for (int i = 0; i < 256; i++) all_bytes[i] = (char)i;
    memset(long_str, 'x', sizeof long_str - 1);
    long_str[sizeof long_str - 1] = '\0';
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    CHECK(gguf_writer_set_str(w, "s.empty", "", &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "s.utf8", utf8, &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "s.long", long_str, &err) == MOE_OK);
    gguf_value v = {.type = GGUF_TYPE_STRING, .str = {sizeof embedded, embedded}};
    CHECK(gguf_writer_set_value(w, "s.embedded", &v, &err) == MOE_OK);
    v.str = (gguf_str){sizeof all_bytes, all_bytes};
    CHECK(gguf_writer_set_value(w, "s.all_bytes", &v, &err) == MOE_OK);
    gguf_file *f = save_and_open(w);
    if (!f) return;
    gguf_str s;
    CHECK(gguf_get_str(f, "s.empty", &s, &err) == MOE_OK && s.len == 0);
    CHECK(gguf_get_str(f, "s.utf8", &s, &err) == MOE_OK && gguf_str_eq(s, utf8));
    CHECK(gguf_get_str(f, "s.long", &s, &err) == MOE_OK && gguf_str_eq(s, long_str));
    CHECK(gguf_get_str(f, "s.embedded", &s, &err) == MOE_OK && s.len == sizeof embedded &&
          memcmp(s.data, embedded, sizeof embedded) == 0);
    CHECK(gguf_get_str(f, "s.all_bytes", &s, &err) == MOE_OK && s.len == 256 && memcmp(s.data, all_bytes, 256) == 0);
    gguf_close(f);
}

static void test_numeric_arrays_round_trip(void) {
    const uint8_t u8[] = {0, 1, 255};
    const int8_t i8[] = {INT8_MIN, -1, INT8_MAX};
    const uint16_t u16[] = {0, UINT16_MAX};
    const int16_t i16[] = {INT16_MIN, INT16_MAX};
    const uint32_t u32[] = {0, 7, UINT32_MAX};
    const int32_t i32[] = {INT32_MIN, 0, INT32_MAX};
    const uint64_t u64[] = {UINT64_MAX, 1};
    const int64_t i64[] = {INT64_MIN, INT64_MAX, -2};
    const float f32[] = {-FLT_MAX, FLT_TRUE_MIN, 0.5f, INFINITY};
    const double f64[] = {DBL_MAX, -DBL_TRUE_MIN, 0.1};
    const uint8_t bools[] = {1, 0, 0, 1, 1};
    const struct {
        const char *key;
        gguf_value_type type;
        const void *data;
        uint64_t n;
    } arrays[] = {
        {"a.u8", GGUF_TYPE_UINT8, u8, 3},       {"a.i8", GGUF_TYPE_INT8, i8, 3},
        {"a.u16", GGUF_TYPE_UINT16, u16, 2},    {"a.i16", GGUF_TYPE_INT16, i16, 2},
        {"a.u32", GGUF_TYPE_UINT32, u32, 3},    {"a.i32", GGUF_TYPE_INT32, i32, 3},
        {"a.u64", GGUF_TYPE_UINT64, u64, 2},    {"a.i64", GGUF_TYPE_INT64, i64, 3},
        {"a.f32", GGUF_TYPE_FLOAT32, f32, 4},   {"a.f64", GGUF_TYPE_FLOAT64, f64, 3},
        {"a.bool", GGUF_TYPE_BOOL, bools, 5},   {"a.empty", GGUF_TYPE_FLOAT32, NULL, 0},
    };
    size_t n = sizeof arrays / sizeof arrays[0];
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    for (size_t i = 0; i < n; i++)
        CHECK(gguf_writer_set_array(w, arrays[i].key, arrays[i].type, arrays[i].data, arrays[i].n, &err) == MOE_OK);
    gguf_file *f = save_and_open(w);
    if (!f) return;
    for (size_t i = 0; i < n; i++) {
        const gguf_array *a = NULL;
        CHECKF(gguf_get_array(f, arrays[i].key, arrays[i].type, &a, &err) == MOE_OK, "%s", err.message);
        if (!a) continue;
        CHECK(a->n == arrays[i].n && a->items == NULL);
        CHECKF(a->n == 0 || memcmp(a->data, arrays[i].data, a->n * gguf_value_type_size(a->type)) == 0, "%s",
               arrays[i].key);
    }
    const gguf_array *a;
    CHECK(gguf_get_array(f, "a.i8", GGUF_TYPE_INT8, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_i64(a, 0) == INT8_MIN && gguf_array_get_i64(a, 1) == -1 && gguf_array_get_f64(a, 2) == 127);
    CHECK(gguf_get_array(f, "a.u64", GGUF_TYPE_UINT64, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_u64(a, 0) == UINT64_MAX && gguf_array_get_u64(a, 1) == 1);
    CHECK(gguf_get_array(f, "a.i64", GGUF_TYPE_INT64, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_i64(a, 0) == INT64_MIN && gguf_array_get_i64(a, 1) == INT64_MAX);
    CHECK(gguf_get_array(f, "a.f32", GGUF_TYPE_FLOAT32, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_f64(a, 0) == -FLT_MAX && gguf_array_get_f64(a, 1) == FLT_TRUE_MIN);
    CHECK(gguf_array_get_f64(a, 3) == INFINITY);
    CHECK(gguf_get_array(f, "a.f64", GGUF_TYPE_FLOAT64, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_f64(a, 0) == DBL_MAX && gguf_array_get_f64(a, 2) == 0.1);
    CHECK(gguf_get_array(f, "a.u16", GGUF_TYPE_UINT16, &a, &err) == MOE_OK && gguf_array_get_u64(a, 1) == 65535);
    CHECK(gguf_get_array(f, "a.i16", GGUF_TYPE_INT16, &a, &err) == MOE_OK && gguf_array_get_i64(a, 0) == -32768);
    CHECK(gguf_get_array(f, "a.bool", GGUF_TYPE_BOOL, &a, &err) == MOE_OK);
    CHECK(gguf_array_get_u64(a, 0) == 1 && gguf_array_get_u64(a, 1) == 0 && gguf_array_get_u64(a, 4) == 1);
    gguf_close(f);
}

/* [[1, 2, 3], ["x", "", "\0y"], [], [[true], [[]]]] plus empty string and
 * array arrays, copied deeply: the source is overwritten before saving. */
static void test_nested_arrays_round_trip(void) {
    uint32_t numbers[] = {1, 2, 3};
    uint8_t truth[] = {1};
    char y[] = {'\0', 'y'};
    gguf_value strings[] = {
        {.type = GGUF_TYPE_STRING, .str = {1, "x"}},
        {.type = GGUF_TYPE_STRING, .str = {0, ""}},
        {.type = GGUF_TYPE_STRING, .str = {2, y}},
    };
    gguf_value empty_inner[] = {{.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 0}}};
    gguf_value deep[] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_BOOL, .n = 1, .data = truth}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 1, .items = empty_inner}},
    };
    gguf_value items[] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_UINT32, .n = 3, .data = numbers}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_STRING, .n = 3, .items = strings}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_INT8, .n = 0}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 2, .items = deep}},
    };
    gguf_value nested = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 4, .items = items}};
    gguf_value empty_strs = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_STRING, .n = 0}};
    gguf_value empty_arrs = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 0}};
    const char *tokens[] = {"<s>", "", "h\xc3\xa9", "\xe2\x96\x81the"};

    gguf_writer *w = gguf_writer_new();
    moe_error err;
    CHECK(gguf_writer_set_value(w, "nested", &nested, &err) == MOE_OK);
    CHECK(gguf_writer_set_value(w, "empty.strings", &empty_strs, &err) == MOE_OK);
    CHECK(gguf_writer_set_value(w, "empty.arrays", &empty_arrs, &err) == MOE_OK);
    CHECK(gguf_writer_set_str_array(w, "tokens", tokens, 4, &err) == MOE_OK);
    CHECK(gguf_writer_set_str_array(w, "tokens.none", NULL, 0, &err) == MOE_OK);
    CHECK(gguf_writer_set_str_array(w, "tokens.null", NULL, 2, &err) == MOE_ERR_INVALID_ARG);
    /* The writer must hold copies, not these. */
    numbers[0] = 99;
    y[1] = 'z';
    truth[0] = 0;
    gguf_file *f = save_and_open(w);
    if (!f) return;
    numbers[0] = 1;
    y[1] = 'y';
    truth[0] = 1;
    const gguf_array *a = NULL;
    CHECK(gguf_get_array(f, "nested", GGUF_TYPE_ARRAY, &a, &err) == MOE_OK);
    CHECK(a && gguf_values_equal(&gguf_find(f, "nested")->value, &nested));
    if (a && a->n == 4) CHECK(gguf_str_eq(gguf_array_get_str(&a->items[1].arr, 0), "x"));
    CHECK(gguf_get_array(f, "empty.strings", GGUF_TYPE_STRING, &a, &err) == MOE_OK && a->n == 0);
    CHECK(gguf_get_array(f, "empty.arrays", GGUF_TYPE_ARRAY, &a, &err) == MOE_OK && a->n == 0);
    CHECK(gguf_get_array(f, "tokens.none", GGUF_TYPE_STRING, &a, &err) == MOE_OK && a->n == 0);
    CHECK(gguf_get_array(f, "tokens", GGUF_TYPE_STRING, &a, &err) == MOE_OK && a->n == 4);
    for (uint64_t i = 0; a && i < a->n && i < 4; i++) CHECK(gguf_str_eq(gguf_array_get_str(a, i), tokens[i]));
    gguf_close(f);
}

/* gguf_values_equal: types, strings, numeric arrays by their bytes,
 * nested arrays element by element, and any NaN equal to any NaN. */
static void test_values_equal(void) {
    const int16_t shorts[] = {-3, 4}, other[] = {-3, 5};
    gguf_value a = {.type = GGUF_TYPE_FLOAT32, .f64 = NAN}, b = {.type = GGUF_TYPE_FLOAT32, .f64 = -NAN};
    CHECK(gguf_values_equal(&a, &b));
    b.f64 = 1.0;
    CHECK(!gguf_values_equal(&a, &b));
    a.f64 = 1.0, a.type = GGUF_TYPE_FLOAT64;
    CHECK(!gguf_values_equal(&a, &b)); /* the same number as another type */
    gguf_value s = {.type = GGUF_TYPE_STRING, .str = {3, "abc"}}, t = {.type = GGUF_TYPE_STRING, .str = {3, "abd"}};
    CHECK(gguf_values_equal(&s, &s) && !gguf_values_equal(&s, &t));
    gguf_value x = {.type = GGUF_TYPE_ARRAY, .arr = {GGUF_TYPE_INT16, 2, shorts, NULL}};
    gguf_value y = {.type = GGUF_TYPE_ARRAY, .arr = {GGUF_TYPE_INT16, 2, other, NULL}};
    CHECK(!gguf_values_equal(&x, &y));
    y.arr.data = shorts;
    CHECK(gguf_values_equal(&x, &y));
    gguf_value outer_items[2] = {x, s}, other_items[2] = {x, t};
    gguf_value outer = {.type = GGUF_TYPE_ARRAY, .arr = {GGUF_TYPE_ARRAY, 2, NULL, outer_items}};
    gguf_value outer2 = {.type = GGUF_TYPE_ARRAY, .arr = {GGUF_TYPE_ARRAY, 2, NULL, other_items}};
    CHECK(!gguf_values_equal(&outer, &outer2));
    other_items[1] = s;
    CHECK(gguf_values_equal(&outer, &outer2));
}

/* Every key of a parsed file copied with set_value, the source closed
 * before the copy is saved: the quantizer's path. */
static void test_copy_from_reader(void) {
    const char *tokens[] = {"a", "bc", ""};
    int16_t shorts[] = {-3, 4};
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    CHECK(gguf_writer_set_str(w, "general.architecture", "qwen3moe", &err) == MOE_OK);
    CHECK(gguf_writer_set_alignment(w, 128, &err) == MOE_OK);
    CHECK(gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tokens, 3, &err) == MOE_OK);
    CHECK(gguf_writer_set_array(w, "shorts", GGUF_TYPE_INT16, shorts, 2, &err) == MOE_OK);
    CHECK(gguf_writer_set_f32(w, "eps", 1e-5f, &err) == MOE_OK);
    gguf_file *src = save_and_open(w);
    if (!src) return;
    w = gguf_writer_new();
    for (uint64_t i = 0; i < src->n_kv; i++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)src->kv[i].key.len, src->kv[i].key.data);
        CHECK(gguf_writer_set_value(w, key, &src->kv[i].value, &err) == MOE_OK);
    }
    size_t size;
    uint8_t *before = save_to_bytes(w, &size);
    /* Write the copy again after closing the source: nothing may point into it. */
    w = gguf_writer_new();
    for (uint64_t i = 0; i < src->n_kv; i++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)src->kv[i].key.len, src->kv[i].key.data);
        CHECK(gguf_writer_set_value(w, key, &src->kv[i].value, &err) == MOE_OK);
    }
    gguf_close(src);
    size_t size2;
    uint8_t *after = save_to_bytes(w, &size2);
    CHECK(before && after && size == size2 && memcmp(before, after, size) == 0);
    gguf_file *f = NULL;
    CHECK(gguf_open_memory(after, size2, &f, &err) == MOE_OK);
    if (f) {
        CHECK(f->alignment == 128 && f->n_kv == 5);
        gguf_str arch;
        CHECK(gguf_get_str(f, "general.architecture", &arch, &err) == MOE_OK && gguf_str_eq(arch, "qwen3moe"));
    }
    gguf_close(f);
    free(before);
    free(after);
}

/* --- tensors ------------------------------------------------------------- */

typedef struct tensor_spec {
    const char *name;
    moe_type type;
    uint32_t n_dims;
    uint64_t ne[4];
} tensor_spec;

static const tensor_spec tensor_specs[] = {
    {"token_embd.weight", MOE_TYPE_F32, 2, {3, 5}},
    {"output_norm.weight", MOE_TYPE_F16, 1, {7}},
    {"blk.0.ffn_gate_exps.weight", MOE_TYPE_Q8_0, 3, {64, 3, 2}},
    {"blk.0.attn_q.weight", MOE_TYPE_Q4_K, 2, {512, 1}},
    {"blk.0.attn_norm.weight", MOE_TYPE_BF16, 4, {2, 3, 1, 2}},
    {"blk.0.ffn_down_exps.weight", MOE_TYPE_Q6_K, 3, {256, 2, 2}},
    {"a.i8", MOE_TYPE_I8, 1, {5}},
};
enum { N_SPECS = sizeof tensor_specs / sizeof tensor_specs[0] };

/* Bytes of a tensor, worked out here from the block geometry. */
static uint64_t spec_bytes(const tensor_spec *s) {
    const quant_format *q = quant_format_of(s->type);
    uint64_t rows = 1;
    for (uint32_t d = 1; d < s->n_dims; d++) rows *= s->ne[d];
    return s->ne[0] / (uint64_t)q->block_size * q->block_bytes * rows;
}

static bool all_zero(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

static void check_tensors_round_trip(uint32_t alignment) {
    uint8_t *data[N_SPECS];
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    CHECK(gguf_writer_set_alignment(w, alignment, &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "general.architecture", "qwen3moe", &err) == MOE_OK);
    srand(alignment);
    for (int i = 0; i < N_SPECS; i++) {
        const tensor_spec *s = &tensor_specs[i];
        data[i] = malloc(spec_bytes(s));
        for (uint64_t b = 0; b < spec_bytes(s); b++) data[i][b] = (uint8_t)(rand() | 1);
        CHECKF(gguf_writer_add_tensor(w, s->name, s->type, s->n_dims, s->ne, data[i], &err) == MOE_OK, "%s",
               err.message);
    }
    gguf_file *f = save_and_open(w);
    if (f) {
        CHECK(f->alignment == alignment && f->data_offset % alignment == 0 && f->n_tensors == N_SPECS);
        const gguf_kv *key = gguf_find(f, "general.alignment");
        if (alignment == 32) CHECK(key == NULL);
        else CHECK(key && key->value.type == GGUF_TYPE_UINT32 && key->value.u64 == alignment);
        uint64_t end = f->data_offset; /* where the previous tensor's data ended */
        for (int i = 0; i < N_SPECS; i++) {
            const tensor_spec *s = &tensor_specs[i];
            const gguf_tensor *t = gguf_find_tensor(f, s->name);
            CHECKF(t == &f->tensors[i], "%s", s->name);
            if (!t) continue;
            CHECK(t->type == s->type && t->n_dims == s->n_dims && t->nbytes == spec_bytes(s));
            for (uint32_t d = 0; d < 4; d++) CHECK(t->ne[d] == (d < s->n_dims ? s->ne[d] : 1));
            CHECK(t->offset % alignment == 0);
            CHECK((const uint8_t *)t->data == f->base + f->data_offset + t->offset);
            CHECK(memcmp(t->data, data[i], t->nbytes) == 0);
            CHECK(all_zero(f->base + end, f->data_offset + t->offset - end)); /* padding */
            end = f->data_offset + t->offset + t->nbytes;
        }
        /* The last tensor is padded too, so the file ends aligned. */
        CHECK(f->size % alignment == 0 && all_zero(f->base + end, f->size - end));
        CHECK(gguf_find_tensor(f, "missing") == NULL && gguf_find_tensor(f, "") == NULL);
    }
    gguf_close(f);
    for (int i = 0; i < N_SPECS; i++) free(data[i]);
}

static void test_tensors_round_trip_align32(void) { check_tensors_round_trip(32); }
static void test_tensors_round_trip_align64(void) { check_tensors_round_trip(64); }
static void test_tensors_round_trip_align1(void) { check_tensors_round_trip(1); }

/* 3000 tensors added in an order unlike their sorted names, each found. */
static void test_many_tensors_lookup(void) {
    enum { N = 3000 };
    static float values[N];
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.w", (i * 7919) % N);
        values[i] = (float)i;
        CHECK(gguf_writer_add_tensor(w, name, MOE_TYPE_F32, 1, (uint64_t[]){1}, &values[i], &err) == MOE_OK);
    }
    gguf_file *f = save_and_open(w);
    if (!f) return;
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.w", (i * 7919) % N);
        const gguf_tensor *t = gguf_find_tensor(f, name);
        CHECKF(t == &f->tensors[i], "%s", name);
        if (t) CHECK(memcmp(t->data, &values[i], 4) == 0);
    }
    CHECK(gguf_find_tensor(f, "blk.3000.w") == NULL && gguf_find_tensor(f, "blk.") == NULL);
    gguf_close(f);
}

/* --- accessors --------------------------------------------------------------- */

static void test_accessors(void) {
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    uint32_t u32s[] = {1, 2};
    gguf_writer_set_value(w, "u8", &(gguf_value){.type = GGUF_TYPE_UINT8, .u64 = 200}, &err);
    gguf_writer_set_value(w, "i8.neg", &(gguf_value){.type = GGUF_TYPE_INT8, .i64 = -5}, &err);
    gguf_writer_set_value(w, "i64.min", &(gguf_value){.type = GGUF_TYPE_INT64, .i64 = INT64_MIN}, &err);
    gguf_writer_set_value(w, "f64.big", &(gguf_value){.type = GGUF_TYPE_FLOAT64, .f64 = 1e300}, &err);
    gguf_writer_set_value(w, "f64.half", &(gguf_value){.type = GGUF_TYPE_FLOAT64, .f64 = 0.5}, &err);
    gguf_writer_set_i32(w, "i32.pos", 70000, &err);
    gguf_writer_set_u64(w, "u64.max", UINT64_MAX, &err);
    gguf_writer_set_u64(w, "u64.big", 1ull << 32, &err);
    gguf_writer_set_str(w, "name", "qwen", &err);
    gguf_writer_set_bool(w, "flag", true, &err);
    gguf_writer_set_array(w, "list", GGUF_TYPE_UINT32, u32s, 2, &err);
    gguf_file *f = save_and_open(w);
    if (!f) return;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    bool flag = false;
    gguf_str s;
    const gguf_array *a = NULL;

    /* Widening: any integer whose value fits. */
    CHECK(gguf_get_u32(f, "u8", &u32, &err) == MOE_OK && u32 == 200);
    CHECK(gguf_get_u64(f, "u8", &u64, &err) == MOE_OK && u64 == 200);
    CHECK(gguf_get_i64(f, "u8", &i64, &err) == MOE_OK && i64 == 200);
    CHECK(gguf_get_u32(f, "i32.pos", &u32, &err) == MOE_OK && u32 == 70000);
    CHECK(gguf_get_i64(f, "i8.neg", &i64, &err) == MOE_OK && i64 == -5);
    CHECK(gguf_get_i64(f, "i64.min", &i64, &err) == MOE_OK && i64 == INT64_MIN);
    CHECK(gguf_get_u64(f, "u64.max", &u64, &err) == MOE_OK && u64 == UINT64_MAX);
    CHECK(gguf_get_f32(f, "f64.half", &f32, &err) == MOE_OK && f32 == 0.5f);
    CHECK(gguf_get_bool(f, "flag", &flag, &err) == MOE_OK && flag);
    CHECK(gguf_get_array(f, "list", GGUF_TYPE_COUNT, &a, &err) == MOE_OK && a->n == 2);

    /* Values that do not fit. */
    CHECK(gguf_get_u32(f, "i8.neg", &u32, &err) == MOE_ERR_RANGE && contains(err.message, "-5"));
    CHECK(gguf_get_u64(f, "i8.neg", &u64, &err) == MOE_ERR_RANGE);
    CHECK(gguf_get_u32(f, "u64.big", &u32, &err) == MOE_ERR_RANGE && contains(err.message, "u64.big"));
    CHECK(gguf_get_i64(f, "u64.max", &i64, &err) == MOE_ERR_RANGE && contains(err.message, "int64"));
    CHECK(gguf_get_u32(f, "i64.min", &u32, &err) == MOE_ERR_RANGE);
    CHECK(gguf_get_f32(f, "f64.big", &f32, &err) == MOE_ERR_RANGE && contains(err.message, "float32"));

    /* Wrong types: the message names key, expected and found type. */
    CHECK(gguf_get_u32(f, "name", &u32, &err) == MOE_ERR_TYPE);
    CHECKF(contains(err.message, "'name'") && contains(err.message, "uint32") && contains(err.message, "string"), "%s",
           err.message);
    CHECK(gguf_get_f32(f, "u8", &f32, &err) == MOE_ERR_TYPE && contains(err.message, "float32") &&
          contains(err.message, "uint8"));
    CHECK(gguf_get_bool(f, "u8", &flag, &err) == MOE_ERR_TYPE && contains(err.message, "bool"));
    CHECK(gguf_get_u32(f, "flag", &u32, &err) == MOE_ERR_TYPE && contains(err.message, "bool"));
    CHECK(gguf_get_str(f, "list", &s, &err) == MOE_ERR_TYPE && contains(err.message, "array of uint32"));
    CHECK(gguf_get_array(f, "list", GGUF_TYPE_STRING, &a, &err) == MOE_ERR_TYPE);
    CHECKF(contains(err.message, "'list'") && contains(err.message, "expected array of string") &&
           contains(err.message, "found array of uint32"), "%s", err.message);
    CHECK(gguf_get_array(f, "name", GGUF_TYPE_COUNT, &a, &err) == MOE_ERR_TYPE && contains(err.message, "string"));

    /* Missing keys, with and without an error report. */
    CHECK(gguf_get_u32(f, "nope", &u32, &err) == MOE_ERR_NOT_FOUND && contains(err.message, "'nope'"));
    CHECK(gguf_get_str(f, "nope", &s, NULL) == MOE_ERR_NOT_FOUND);
    CHECK(gguf_find(f, "nope") == NULL && gguf_find(f, "") == NULL && gguf_find(f, "u8") != NULL);
    CHECK(strcmp(gguf_value_type_name(GGUF_TYPE_FLOAT64), "float64") == 0);
    CHECK(strcmp(gguf_value_type_name(GGUF_TYPE_COUNT), "invalid") == 0);
    CHECK(gguf_value_type_size(GGUF_TYPE_INT16) == 2 && gguf_value_type_size(GGUF_TYPE_STRING) == 0);
    gguf_close(f);
}

/* --- every truncation -------------------------------------------------------- */

/* A small file with keys (arrays included) and 3 tensors, the last a
 * multiple of the alignment long so the file ends with its last byte:
 * every shorter prefix is then missing something. */
static uint8_t *small_file(size_t *size) {
    const char *strs[] = {"a", "", "xyz"};
    int32_t ints[] = {-1, 2, 3};
    gguf_value inner = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_INT32, .n = 3, .data = ints}};
    gguf_value nested = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 1, .items = &inner}};
    static uint8_t data[64];
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    gguf_writer_set_str(w, "general.architecture", "qwen3moe", &err);
    gguf_writer_set_u32(w, "qwen3moe.block_count", 1, &err);
    gguf_writer_set_str_array(w, "tokens", strs, 3, &err);
    gguf_writer_set_value(w, "nested", &nested, &err);
    gguf_writer_set_bool(w, "flag", false, &err);
    gguf_writer_add_tensor(w, "a", MOE_TYPE_F16, 1, (uint64_t[]){3}, data, &err);
    gguf_writer_add_tensor(w, "b", MOE_TYPE_Q8_0, 1, (uint64_t[]){32}, data, &err);
    gguf_writer_add_tensor(w, "c", MOE_TYPE_F32, 2, (uint64_t[]){4, 4}, data, &err);
    return save_to_bytes(w, size);
}

static void test_every_truncation_fails(void) {
    size_t size = 0;
    uint8_t *bytes = small_file(&size);
    if (!bytes) return;
    gguf_file *f = NULL;
    moe_error err;
    CHECK(gguf_open_memory(bytes, size, &f, &err) == MOE_OK);
    if (f) CHECK(f->data_offset + f->tensors[2].offset + f->tensors[2].nbytes == size);
    gguf_close(f);
    int failures = 0;
    for (size_t len = 0; len < size; len++) {
        /* An exact-size copy, so AddressSanitizer sees any read past it. */
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, bytes, len);
        f = NULL;
        moe_status st = gguf_open_memory(cut, len, &f, &err);
        if (st != MOE_ERR_FORMAT || f != NULL || !contains(err.message, "offset")) {
            if (failures++ < 5) CHECKF(0, "cut at %zu: status %d, message '%s'", len, st, err.message);
            gguf_close(f);
        }
        free(cut);
    }
    CHECK(failures == 0);
    free(bytes);
}

/* --- corrupt files, built by hand ----------------------------------------------- */

typedef struct bytes {
    uint8_t data[4096];
    size_t len;
} bytes;

static void put_raw(bytes *b, const void *p, size_t n) {
    if (b->len + n > sizeof b->data) abort();
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void put_u32(bytes *b, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put_raw(b, le, 4);
}

static void put_u64(bytes *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(bytes *b, const char *s) {
    put_u64(b, strlen(s));
    put_raw(b, s, strlen(s));
}

static bytes header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bytes b = {.len = 0};
    put_raw(&b, "GGUF", 4);
    put_u32(&b, version);
    put_u64(&b, n_tensors);
    put_u64(&b, n_kv);
    return b;
}

static void put_kv_u32(bytes *b, const char *key, uint32_t v) {
    put_str(b, key);
    put_u32(b, GGUF_TYPE_UINT32);
    put_u32(b, v);
}

static void put_info(bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset) {
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, offset);
}

/* Pad to 32 and append n data bytes. */
static void put_data(bytes *b, size_t n) {
    while (b->len % 32) put_raw(b, "", 1);
    for (size_t i = 0; i < n; i++) put_raw(b, "\x5a", 1);
}

/* The file must be refused as a format error whose message holds `word`
 * and names an offset. */
static void expect_format(const bytes *b, const char *word, const char *label) {
    uint8_t *copy = malloc(b->len ? b->len : 1);
    memcpy(copy, b->data, b->len);
    gguf_file *f = NULL;
    moe_error err = {0};
    moe_status st = gguf_open_memory(copy, b->len, &f, &err);
    CHECKF(st == MOE_ERR_FORMAT && f == NULL, "%s: status %d", label, st);
    CHECKF(contains(err.message, word) && contains(err.message, "offset"), "%s: '%s' lacks '%s'", label, err.message,
           word);
    gguf_close(f);
    free(copy);
}

/* A valid file with one F32 tensor [8], to corrupt one field at a time. */
static bytes one_tensor_file(uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset, size_t data) {
    bytes b = header(3, 1, 0);
    put_info(&b, "t", n_dims, ne, type, offset);
    put_data(&b, data);
    return b;
}

static void test_corrupt_header(void) {
    bytes b = header(3, 0, 0);
    memcpy(b.data, "GGML", 4);
    expect_format(&b, "magic", "bad magic");
    b = header(1, 0, 0);
    expect_format(&b, "version 1", "version 1");
    b = header(4, 0, 0);
    expect_format(&b, "version 4", "version 4");
    b = header(0x03000000u, 0, 0);
    expect_format(&b, "big-endian", "big-endian file");
    b = header(3, UINT64_MAX / 2, 0);
    expect_format(&b, "tensor count", "huge tensor count");
    b = header(3, 0, 1ull << 40);
    expect_format(&b, "key/value count", "huge kv count");
    b = header(3, 0, 0);
    b.len = 20;
    expect_format(&b, "key/value count", "header cut short");
    b.len = 0;
    expect_format(&b, "magic", "empty input");
}

static void test_corrupt_metadata(void) {
    bytes b = header(3, 0, 1);
    put_u64(&b, 1000); /* key length past the end */
    put_raw(&b, "abcde", 5);
    expect_format(&b, "key length 1000", "key past EOF");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_STRING);
    put_u64(&b, 1ull << 62);
    expect_format(&b, "string length", "string past EOF");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, 13);
    put_u32(&b, 0);
    expect_format(&b, "value type 13", "invalid value type");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_ARRAY);
    put_u32(&b, 42);
    put_u64(&b, 0);
    expect_format(&b, "array element type 42", "invalid array element type");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_ARRAY);
    put_u32(&b, GGUF_TYPE_UINT32);
    put_u64(&b, 1ull << 60);
    put_u32(&b, 7);
    expect_format(&b, "array length", "huge array count");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_ARRAY);
    put_u32(&b, GGUF_TYPE_STRING);
    put_u64(&b, 3); /* 3 strings need 24 bytes; 16 remain */
    put_u64(&b, 0);
    put_u64(&b, 0);
    expect_format(&b, "array length 3", "string array count");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_ARRAY);
    for (int level = 0; level < 200; level++) {
        put_u32(&b, GGUF_TYPE_ARRAY);
        put_u64(&b, 1);
    }
    expect_format(&b, "nested", "depth bomb");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_BOOL);
    put_raw(&b, "\2", 1);
    expect_format(&b, "bool value 2", "bool 2");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_ARRAY);
    put_u32(&b, GGUF_TYPE_BOOL);
    put_u64(&b, 3);
    put_raw(&b, "\1\0\3", 3);
    expect_format(&b, "bool array element 2", "bool array 3");

    b = header(3, 0, 2);
    put_kv_u32(&b, "dup", 1);
    put_kv_u32(&b, "dup", 2);
    expect_format(&b, "duplicate key 'dup'", "duplicate key");

    b = header(3, 0, 1);
    put_str(&b, "k");
    put_u32(&b, GGUF_TYPE_UINT64);
    put_u32(&b, 1); /* 4 of its 8 bytes */
    expect_format(&b, "truncated", "scalar cut short");
}

static void test_corrupt_alignment(void) {
    bytes b = header(3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, GGUF_TYPE_STRING);
    put_str(&b, "64");
    expect_format(&b, "general.alignment has type string", "alignment type");

    b = header(3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, GGUF_TYPE_UINT64);
    put_u64(&b, 64);
    expect_format(&b, "expected uint32", "alignment u64");

    b = header(3, 0, 1);
    put_kv_u32(&b, "general.alignment", 48);
    expect_format(&b, "power of two", "alignment 48");

    b = header(3, 0, 1);
    put_kv_u32(&b, "general.alignment", 0);
    expect_format(&b, "power of two", "alignment 0");
}

static void test_corrupt_tensors(void) {
    bytes b = one_tensor_file(0, NULL, MOE_TYPE_F32, 0, 32);
    expect_format(&b, "n_dims 0", "n_dims 0");
    b = one_tensor_file(5, (uint64_t[]){1, 1, 1, 1, 1}, MOE_TYPE_F32, 0, 32);
    expect_format(&b, "n_dims 5", "n_dims 5");
    b = one_tensor_file(1, (uint64_t[]){8}, 77, 0, 32);
    expect_format(&b, "unknown tensor type id 77", "type 77");
    b = one_tensor_file(1, (uint64_t[]){8}, 4, 0, 32);
    expect_format(&b, "unknown tensor type id 4", "removed type 4");
    b = one_tensor_file(1, (uint64_t[]){8}, MOE_TYPE_F32, 16, 64);
    expect_format(&b, "not a multiple of the alignment 32", "misaligned offset");
    b = one_tensor_file(1, (uint64_t[]){1000}, MOE_TYPE_F32, 0, 32);
    expect_format(&b, "past the end of the file", "tensor past EOF");
    b = one_tensor_file(1, (uint64_t[]){8}, MOE_TYPE_F32, UINT64_MAX - 31, 32);
    expect_format(&b, "past the end of the file", "offset overflow");
    b = one_tensor_file(1, (uint64_t[]){8}, MOE_TYPE_F32, 0, 31);
    expect_format(&b, "past the end of the file", "one byte short");
    b = one_tensor_file(2, (uint64_t[]){1ull << 32, 1ull << 32}, MOE_TYPE_F32, 0, 32);
    expect_format(&b, "overflow", "ne product overflow");
    b = one_tensor_file(1, (uint64_t[]){UINT64_MAX}, MOE_TYPE_I8, 0, 32);
    expect_format(&b, "overflow", "ne beyond int64");
    b = one_tensor_file(1, (uint64_t[]){1ull << 62}, MOE_TYPE_F64, 0, 32);
    expect_format(&b, "byte size overflows", "byte size overflow");
    b = one_tensor_file(2, (uint64_t[]){8, 0}, MOE_TYPE_F32, 0, 32);
    expect_format(&b, "dimension 1 is zero", "zero dimension");
    b = one_tensor_file(1, (uint64_t[]){33}, MOE_TYPE_Q8_0, 0, 64);
    expect_format(&b, "block size 32", "ne[0] not a block multiple");

    b = header(3, 2, 0);
    put_info(&b, "same", 1, (uint64_t[]){8}, MOE_TYPE_F32, 0);
    put_info(&b, "same", 1, (uint64_t[]){8}, MOE_TYPE_F32, 32);
    put_data(&b, 64);
    expect_format(&b, "duplicate tensor name 'same'", "duplicate name");

    b = header(3, 2, 0);
    put_info(&b, "a", 1, (uint64_t[]){16}, MOE_TYPE_F32, 32);
    put_info(&b, "b", 1, (uint64_t[]){16}, MOE_TYPE_F32, 0); /* 64 bytes: runs into a */
    put_data(&b, 96);
    expect_format(&b, "overlaps", "overlapping tensors");

    b = header(3, 1, 1);
    put_kv_u32(&b, "general.alignment", 64);
    put_info(&b, "t", 1, (uint64_t[]){8}, MOE_TYPE_F32, 32);
    put_data(&b, 128);
    expect_format(&b, "alignment 64", "offset misaligned for 64");

    b = header(3, 1, 0);
    put_info(&b, "tensor.t", 1, (uint64_t[]){8}, MOE_TYPE_F32, 0);
    b.len -= 4; /* the offset field cut short (the count check still passes) */
    expect_format(&b, "tensor offset", "info cut short");
}

/* The shapes that are right still open: the checks above are not just
 * refusing everything. */
static void test_hand_made_valid(void) {
    bytes b = one_tensor_file(1, (uint64_t[]){8}, MOE_TYPE_F32, 0, 32);
    gguf_file *f = NULL;
    moe_error err;
    CHECKF(gguf_open_memory(b.data, b.len, &f, &err) == MOE_OK, "%s", err.message);
    if (f) CHECK(f->n_tensors == 1 && f->tensors[0].nbytes == 32 && f->data_offset == 64);
    gguf_close(f);

    /* Version 2 reads the same; tensors may lie in any order, back to back. */
    b = header(2, 2, 0);
    put_info(&b, "second", 1, (uint64_t[]){8}, MOE_TYPE_F32, 32);
    put_info(&b, "first", 1, (uint64_t[]){16}, MOE_TYPE_F16, 0);
    put_data(&b, 64);
    f = NULL;
    CHECKF(gguf_open_memory(b.data, b.len, &f, &err) == MOE_OK, "%s", err.message);
    if (f) CHECK(f->version == 2 && gguf_find_tensor(f, "first") == &f->tensors[1]);
    gguf_close(f);

    /* A file without tensors may end before the padding of its data section. */
    b = header(3, 0, 1);
    put_kv_u32(&b, "k", 5);
    f = NULL;
    CHECKF(gguf_open_memory(b.data, b.len, &f, &err) == MOE_OK, "%s", err.message);
    gguf_close(f);
}

/* --- open errors ---------------------------------------------------------------- */

static void test_open_errors(void) {
    gguf_file *f = (gguf_file *)1;
    moe_error err;
    path_buf missing_path = tmp_path("missing.gguf"), empty_path = tmp_path("empty.gguf");
    path_buf bad_path = tmp_path("bad.gguf"), fifo_path = tmp_path("fifo.gguf");
    const char *missing = missing_path.text, *empty = empty_path.text, *bad = bad_path.text, *fifo = fifo_path.text;
    CHECK(gguf_open(missing, &f, &err) == MOE_ERR_IO && f == NULL);
    CHECKF(contains(err.message, missing), "%s", err.message);

    CHECK(gguf_open(tmp_dir, &f, &err) == MOE_ERR_IO && f == NULL);
    CHECKF(contains(err.message, tmp_dir) && contains(err.message, "directory"), "%s", err.message);

    FILE *file = fopen(empty, "wb");
    if (file) fclose(file);
    CHECK(gguf_open(empty, &f, &err) == MOE_ERR_FORMAT && f == NULL);
    CHECKF(contains(err.message, empty) && contains(err.message, "offset 0"), "%s", err.message);

    file = fopen(bad, "wb");
    if (file) {
        fwrite("GGUF\1\0\0\0", 1, 8, file);
        fclose(file);
    }
    CHECK(gguf_open(bad, &f, &err) == MOE_ERR_FORMAT && f == NULL);
    CHECKF(contains(err.message, bad) && contains(err.message, "version 1"), "%s", err.message);
    CHECK(gguf_open(bad, &f, NULL) == MOE_ERR_FORMAT);

    /* A FIFO is refused at once instead of blocking for a writer. */
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(gguf_open(fifo, &f, &err) == MOE_ERR_IO && f == NULL && contains(err.message, "regular file"));
    unlink(empty);
    unlink(bad);
    unlink(fifo);
}

/* --- the writer ----------------------------------------------------------------- */

static void test_writer_keys(void) {
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    CHECK(gguf_writer_set_u32(w, "k", 1, &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "other", "x", &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "k", "replaced", &err) == MOE_OK);
    CHECK(gguf_writer_set_u32(w, "general.alignment", 64, &err) == MOE_OK);
    CHECK(gguf_writer_set_str(w, "general.alignment", "64", &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_u32(w, "general.alignment", 48, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_alignment(w, 0, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_u32(w, "", 1, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_u32(w, NULL, 1, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_value(w, "bad.bool", &(gguf_value){.type = GGUF_TYPE_BOOL, .u64 = 2}, &err) ==
          MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_value(w, "bad.u8", &(gguf_value){.type = GGUF_TYPE_UINT8, .u64 = 256}, &err) ==
          MOE_ERR_INVALID_ARG);
    CHECKF(contains(err.message, "bad.u8") && contains(err.message, "256"), "%s", err.message);
    CHECK(gguf_writer_set_value(w, "bad.i16", &(gguf_value){.type = GGUF_TYPE_INT16, .i64 = -40000}, &err) ==
          MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_value(w, "bad.type", &(gguf_value){.type = GGUF_TYPE_COUNT}, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_array(w, "bad.elem", GGUF_TYPE_STRING, NULL, 0, &err) == MOE_ERR_INVALID_ARG);
    uint8_t not_bools[] = {0, 7};
    CHECK(gguf_writer_set_array(w, "bad.bools", GGUF_TYPE_BOOL, not_bools, 2, &err) == MOE_ERR_INVALID_ARG);
    gguf_value mixed[] = {{.type = GGUF_TYPE_STRING, .str = {1, "a"}}, {.type = GGUF_TYPE_UINT8}};
    gguf_value bad_items = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_STRING, .n = 2, .items = mixed}};
    CHECK(gguf_writer_set_value(w, "bad.items", &bad_items, &err) == MOE_ERR_INVALID_ARG);
    /* Nesting: 8 arrays deep is the limit, 9 is refused. */
    gguf_value levels[9];
    for (int i = 0; i < 9; i++) {
        levels[i] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = i > 0}};
        if (i > 0) levels[i].arr.items = &levels[i - 1];
    }
    CHECK(gguf_writer_set_value(w, "deep.8", &levels[7], &err) == MOE_OK);
    CHECK(gguf_writer_set_value(w, "deep.9", &levels[8], &err) == MOE_ERR_INVALID_ARG);
    CHECK(contains(err.message, "nested"));

    gguf_file *f = save_and_open(w);
    if (!f) return;
    CHECK(f->n_kv == 4 && f->alignment == 64);
    gguf_str s;
    CHECK(gguf_get_str(f, "k", &s, &err) == MOE_OK && gguf_str_eq(s, "replaced"));
    CHECK(gguf_find(f, "k") == &f->kv[0]);
    CHECK(gguf_find(f, "bad.u8") == NULL && gguf_find(f, "deep.8") != NULL);
    gguf_close(f);

    /* Back to the default alignment: the key goes. */
    w = gguf_writer_new();
    CHECK(gguf_writer_set_alignment(w, 256, &err) == MOE_OK);
    CHECK(gguf_writer_set_alignment(w, 32, &err) == MOE_OK);
    f = save_and_open(w);
    if (f) CHECK(f->n_kv == 0 && f->alignment == 32 && f->size == 32);
    gguf_close(f);
}

static void test_writer_tensor_errors(void) {
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    float data[64] = {0};
    char long_name[65];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    CHECK(gguf_writer_add_tensor(w, "t", MOE_TYPE_F32, 0, (uint64_t[]){1}, data, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "t", MOE_TYPE_F32, 5, (uint64_t[]){1, 1, 1, 1, 1}, data, &err) ==
          MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "t", MOE_TYPE_F32, 1, (uint64_t[]){0}, data, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "t", (moe_type)77, 1, (uint64_t[]){8}, data, &err) == MOE_ERR_INVALID_ARG);
    CHECK(contains(err.message, "77"));
    CHECK(gguf_writer_add_tensor(w, "t", MOE_TYPE_Q4_0, 1, (uint64_t[]){48}, data, &err) == MOE_ERR_INVALID_ARG);
    CHECK(contains(err.message, "block size"));
    CHECK(gguf_writer_add_tensor(w, long_name, MOE_TYPE_F32, 1, (uint64_t[]){1}, data, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, NULL, MOE_TYPE_F32, 1, (uint64_t[]){1}, data, &err) == MOE_ERR_INVALID_ARG);
    long_name[63] = '\0';
    CHECK(gguf_writer_add_tensor(w, long_name, MOE_TYPE_F32, 1, (uint64_t[]){1}, data, &err) == MOE_OK);
    CHECK(gguf_writer_add_tensor(w, "streamed", MOE_TYPE_F32, 1, (uint64_t[]){4}, NULL, &err) == MOE_OK);

    /* save needs every tensor's data, and leaves nothing behind when refused. */
    path_buf refused = tmp_path("refused.gguf"), dup = tmp_path("dup.gguf");
    const char *path = refused.text;
    CHECK(gguf_writer_save(w, path, &err) == MOE_ERR_INVALID_ARG && contains(err.message, "streamed"));
    CHECK(access(path, F_OK) != 0);

    CHECK(gguf_writer_add_tensor(w, "streamed", MOE_TYPE_F32, 1, (uint64_t[]){4}, data, &err) == MOE_OK);
    int fd = open(dup.text, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(gguf_writer_begin(w, fd, &err) == MOE_ERR_INVALID_ARG && contains(err.message, "duplicate tensor name"));
    close(fd);
    unlink(dup.text);
    gguf_writer_free(w);
}

static void test_streaming_misuse(void) {
    gguf_writer *w = gguf_writer_new();
    moe_error err;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[4] = {9, 10, 11, 12};
    CHECK(gguf_writer_add_tensor(w, "a", MOE_TYPE_F32, 1, (uint64_t[]){8}, NULL, &err) == MOE_OK);
    CHECK(gguf_writer_add_tensor(w, "b", MOE_TYPE_F32, 2, (uint64_t[]){2, 2}, NULL, &err) == MOE_OK);
    CHECK(gguf_writer_write_tensor(w, a, sizeof a, &err) == MOE_ERR_INVALID_ARG); /* before begin */
    CHECK(gguf_writer_end(w, &err) == MOE_ERR_INVALID_ARG);

    path_buf p = tmp_path("stream.gguf");
    const char *path = p.text;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(gguf_writer_begin(w, fd, &err) == MOE_OK);
    CHECK(gguf_writer_begin(w, fd, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "c", MOE_TYPE_F32, 1, (uint64_t[]){8}, a, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_set_alignment(w, 64, &err) == MOE_ERR_INVALID_ARG);
    CHECK(gguf_writer_write_tensor(w, a, sizeof a - 4, &err) == MOE_ERR_INVALID_ARG); /* wrong size */
    CHECKF(contains(err.message, "'a'") && contains(err.message, "32"), "%s", err.message);
    CHECK(gguf_writer_write_tensor(w, a, sizeof a, &err) == MOE_OK);
    CHECK(gguf_writer_end(w, &err) == MOE_ERR_INVALID_ARG); /* b not written yet */
    CHECK(contains(err.message, "1 of 2"));
    CHECK(gguf_writer_write_tensor(w, b, sizeof b, &err) == MOE_OK);
    CHECK(gguf_writer_write_tensor(w, b, sizeof b, &err) == MOE_ERR_INVALID_ARG); /* one too many */
    CHECK(gguf_writer_end(w, &err) == MOE_OK);
    CHECK(gguf_writer_end(w, &err) == MOE_ERR_INVALID_ARG);
    close(fd);

    gguf_file *f = NULL;
    CHECKF(gguf_open(path, &f, &err) == MOE_OK, "%s", err.message);
    if (f) {
        const gguf_tensor *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b");
        CHECK(ta && tb && memcmp(ta->data, a, sizeof a) == 0 && memcmp(tb->data, b, sizeof b) == 0);
    }
    gguf_close(f);

    /* A write error ends the stream with MOE_ERR_IO. */
    fd = open(path, O_RDONLY);
    CHECK(gguf_writer_begin(w, fd, &err) == MOE_ERR_IO);
    close(fd);
    unlink(path);
    gguf_writer_free(w);
}

int main(void) {
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_scalars_round_trip);
    RUN(test_strings_round_trip);
    RUN(test_numeric_arrays_round_trip);
    RUN(test_nested_arrays_round_trip);
    RUN(test_values_equal);
    RUN(test_copy_from_reader);
    RUN(test_tensors_round_trip_align32);
    RUN(test_tensors_round_trip_align64);
    RUN(test_tensors_round_trip_align1);
    RUN(test_many_tensors_lookup);
    RUN(test_accessors);
    RUN(test_every_truncation_fails);
    RUN(test_corrupt_header);
    RUN(test_corrupt_metadata);
    RUN(test_corrupt_alignment);
    RUN(test_corrupt_tensors);
    RUN(test_hand_made_valid);
    RUN(test_open_errors);
    RUN(test_writer_keys);
    RUN(test_writer_tensor_errors);
    RUN(test_streaming_misuse);
    rmdir(tmp_dir);
    return test_summary();
}
