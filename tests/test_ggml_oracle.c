/*
 * test_ggml_oracle.c — moe.c against llama.cpp's ggml, an implementation
 * nobody here wrote.
 *
 * ggml is loaded at run time from the prebuilt libggml-base.so that the npm
 * package @node-llama-cpp/linux-x64 ships (tests/oracle/package.json pins
 * it; .ci/run installs it). We call only plain C entry points with stable
 * signatures: dequantize_row_<t>, quantize_row_<t>_ref, the fp16/bf16 row
 * converters and the gguf_* reader/writer.
 *
 * What must hold:
 *   - blocks written by ggml's quantizers, and blocks of random bytes,
 *     dequantize bit for bit as ggml dequantizes them (a tensor written by
 *     another GGUF tool means the same numbers here);
 *   - our quantizers are at least as accurate as ggml's reference ones;
 *   - fp16/bf16 conversions agree on every input;
 *   - files our writer makes read back identically through ggml's GGUF
 *     reader, and files ggml's writer makes read identically through ours.
 *
 * Without the library the test reports itself skipped (exit 77), unless
 * MOE_REQUIRE_ORACLE=1 (CI sets it), when that is a failure.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test.h"

#ifndef MOE_ORACLE_LIB_DIR
#define MOE_ORACLE_LIB_DIR "."
#endif

static void *ggml;

static void *sym(const char *name) {
    void *p = dlsym(ggml, name);
    if (!p) fprintf(stderr, "  ggml has no symbol %s\n", name);
    return p;
}

/* ------------------------------------------------------------ random data */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rng_uniform(void) { return (rng_next() >> 11) * (1.0 / 9007199254740992.0); }

static float rng_gauss(void) {
    double u = rng_uniform() + 1e-300, v = rng_uniform();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Gaussian with 1% outliers ten times larger: the weights of real models. */
static void fill_weights(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_gauss() * (rng_uniform() < 0.01 ? 10.0f : 1.0f) * 0.05f;
}

/* ------------------------------------------------------------ formats */

typedef void (*ggml_dequantize_fn)(const void *, float *, int64_t);
typedef void (*ggml_quantize_fn)(const float *, void *, int64_t);

/* Where a block keeps its scales, so random blocks can be given finite
 * ones: kind 'h' an fp16, 'f' an f32, 'e' an E8M0 byte. */
typedef struct scale_field {
    int offset;
    char kind;
} scale_field;

typedef struct oracle_format {
    moe_type type;
    const char *ggml_name; /* the suffix of ggml's function names */
    scale_field scales[2];
    bool same_quantizer; /* our quantizer is ggml's reference algorithm */
} oracle_format;

static const oracle_format formats[] = {
    {MOE_TYPE_Q4_0, "q4_0", {{0, 'h'}, {-1, 0}}, true},
    {MOE_TYPE_Q4_1, "q4_1", {{0, 'h'}, {2, 'h'}}, true},
    {MOE_TYPE_Q5_0, "q5_0", {{0, 'h'}, {-1, 0}}, true},
    {MOE_TYPE_Q5_1, "q5_1", {{0, 'h'}, {2, 'h'}}, true},
    {MOE_TYPE_Q8_0, "q8_0", {{0, 'h'}, {-1, 0}}, true},
    {MOE_TYPE_Q4_K, "q4_K", {{0, 'h'}, {2, 'h'}}, true},
    {MOE_TYPE_Q5_K, "q5_K", {{0, 'h'}, {2, 'h'}}, true},
    {MOE_TYPE_Q6_K, "q6_K", {{208, 'h'}, {-1, 0}}, true},
    {MOE_TYPE_Q8_K, "q8_K", {{0, 'f'}, {-1, 0}}, true},
    /* IQ4_NL: our scale search tries more candidates than ggml's reference */
    {MOE_TYPE_IQ4_NL, "iq4_nl", {{0, 'h'}, {-1, 0}}, false},
    {MOE_TYPE_MXFP4, "mxfp4", {{0, 'e'}, {-1, 0}}, true},
};

static ggml_dequantize_fn ggml_dequantizer(const oracle_format *f) {
    char name[64];
    snprintf(name, sizeof name, "dequantize_row_%s", f->ggml_name);
    return (ggml_dequantize_fn)sym(name);
}

static ggml_quantize_fn ggml_quantizer(const oracle_format *f) {
    char name[64];
    snprintf(name, sizeof name, "quantize_row_%s_ref", f->ggml_name);
    return (ggml_quantize_fn)sym(name);
}

static double rel_rmse(const float *x, const float *y, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)x[i] * x[i];
    }
    return sqrt(num / den);
}

/* Random bytes everywhere, then finite scales of a sane size. */
static void fill_random_blocks(const oracle_format *f, uint8_t *blocks, int64_t n_blocks, size_t block_bytes) {
    for (size_t i = 0; i < (size_t)n_blocks * block_bytes; i++) blocks[i] = (uint8_t)rng_next();
    for (int64_t b = 0; b < n_blocks; b++) {
        for (int s = 0; s < 2 && f->scales[s].offset >= 0; s++) {
            uint8_t *at = blocks + b * block_bytes + f->scales[s].offset;
            float scale = rng_gauss() * 0.01f;
            if (f->scales[s].kind == 'h') {
                uint16_t h = f32_to_fp16(scale);
                memcpy(at, &h, 2);
            } else if (f->scales[s].kind == 'f') {
                memcpy(at, &scale, 4);
            } else {
                *at = (uint8_t)(100 + rng_next() % 50); /* 2^-27 .. 2^22 */
            }
        }
    }
}

static int count_bit_differences(const float *a, const float *b, int64_t n) {
    int diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return diff;
}

enum { N_ELEMENTS = 256 * 64 };

static void check_format(const oracle_format *f) {
    const quant_format *q = quant_format_of(f->type);
    ggml_dequantize_fn g_dequantize = ggml_dequantizer(f);
    ggml_quantize_fn g_quantize = ggml_quantizer(f);
    CHECK(q && q->dequantize && q->quantize && g_dequantize && g_quantize);
    if (!q || !q->dequantize || !q->quantize || !g_dequantize || !g_quantize) return;

    int64_t n = N_ELEMENTS, n_blocks = n / q->block_size;
    size_t bytes = quant_row_bytes(f->type, n);
    float *x = malloc(n * sizeof *x), *ours = malloc(n * sizeof *ours), *theirs = malloc(n * sizeof *theirs);
    uint8_t *blocks = malloc(bytes), *ggml_blocks = malloc(bytes);
    fill_weights(x, n);

    /* 1. ggml's blocks, dequantized by both. */
    g_quantize(x, ggml_blocks, n);
    memcpy(blocks, ggml_blocks, bytes);
    g_dequantize(blocks, theirs, n);
    q->dequantize(blocks, ours, n);
    int diff = count_bit_differences(ours, theirs, n);
    CHECKF(diff == 0, "%s: %d of %lld values of ggml-quantized blocks dequantize differently", q->name, diff,
           (long long)n);
    double rmse_ggml = rel_rmse(x, theirs, n);

    /* 2. random blocks: every bit pattern of the quants and scales. */
    fill_random_blocks(f, blocks, n_blocks, q->block_bytes);
    g_dequantize(blocks, theirs, n);
    q->dequantize(blocks, ours, n);
    diff = count_bit_differences(ours, theirs, n);
    CHECKF(diff == 0, "%s: %d of %lld values of random blocks dequantize differently", q->name, diff, (long long)n);

    /* 3. our blocks mean the same to ggml, and are at least as accurate;
     * where we implement ggml's reference algorithm, they are its bytes. */
    q->quantize(x, blocks, n);
    if (f->same_quantizer) {
        int64_t differing = 0;
        for (int64_t b = 0; b < n_blocks; b++)
            differing += memcmp(blocks + b * q->block_bytes, ggml_blocks + b * q->block_bytes, q->block_bytes) != 0;
        CHECKF(differing == 0, "%s: %lld of %lld blocks differ from ggml's reference quantizer", q->name,
               (long long)differing, (long long)n_blocks);
    }
    g_dequantize(blocks, theirs, n);
    q->dequantize(blocks, ours, n);
    diff = count_bit_differences(ours, theirs, n);
    CHECKF(diff == 0, "%s: %d values of our blocks dequantize differently in ggml", q->name, diff);
    double rmse_ours = rel_rmse(x, ours, n);
    CHECKF(rmse_ours <= rmse_ggml * 1.02, "%s: our rel. RMSE %.5f vs ggml's reference %.5f", q->name, rmse_ours,
           rmse_ggml);
    printf("  %-7s rel. RMSE ours %.5f, ggml reference %.5f\n", q->name, rmse_ours, rmse_ggml);
    free(x);
    free(ours);
    free(theirs);
    free(blocks);
    free(ggml_blocks);
}

static void test_formats_match_ggml(void) {
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) check_format(&formats[i]);
}

/* ------------------------------------------------------------ fp16 / bf16 */

static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

static void test_half_conversions_match_ggml(void) {
    void (*fp16_to_fp32_row)(const uint16_t *, float *, int64_t) = sym("ggml_fp16_to_fp32_row");
    void (*fp32_to_fp16_row)(const float *, uint16_t *, int64_t) = sym("ggml_fp32_to_fp16_row");
    void (*bf16_to_fp32_row)(const uint16_t *, float *, int64_t) = sym("ggml_bf16_to_fp32_row");
    void (*fp32_to_bf16_row)(const float *, uint16_t *, int64_t) = sym("ggml_fp32_to_bf16_row_ref");
    CHECK(fp16_to_fp32_row && fp32_to_fp16_row && bf16_to_fp32_row && fp32_to_bf16_row);
    if (!fp16_to_fp32_row || !fp32_to_fp16_row || !bf16_to_fp32_row || !fp32_to_bf16_row) return;

    enum { N = 65536 };
    static uint16_t halves[N], theirs16[N];
    static float theirs[N], floats[N];
    for (int i = 0; i < N; i++) halves[i] = (uint16_t)i;
    int bad = 0;
    fp16_to_fp32_row(halves, theirs, N);
    for (int i = 0; i < N; i++) bad += !same_float(fp16_to_f32(halves[i]), theirs[i]);
    CHECKF(bad == 0, "%d fp16 patterns widen differently", bad);
    bad = 0;
    bf16_to_fp32_row(halves, theirs, N);
    for (int i = 0; i < N; i++) bad += !same_float(bf16_to_f32(halves[i]), theirs[i]);
    CHECKF(bad == 0, "%d bf16 patterns widen differently", bad);

    /* Narrowing: random bit patterns (every exponent, NaNs and infinities
     * included) plus values straddling the fp16 rounding boundaries. */
    for (int i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)rng_next();
        memcpy(&floats[i], &bits, 4);
        if (i % 4 == 0) floats[i] = (float)ldexp(rng_gauss(), (int)(rng_next() % 40) - 28);
    }
    fp32_to_fp16_row(floats, theirs16, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        uint16_t ours = f32_to_fp16(floats[i]);
        bool both_nan = isnan(fp16_to_f32(ours)) && isnan(fp16_to_f32(theirs16[i]));
        bad += ours != theirs16[i] && !both_nan;
    }
    CHECKF(bad == 0, "%d floats narrow to fp16 differently", bad);
    fp32_to_bf16_row(floats, theirs16, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        uint16_t ours = f32_to_bf16(floats[i]);
        bool both_nan = isnan(bf16_to_f32(ours)) && isnan(bf16_to_f32(theirs16[i]));
        bad += ours != theirs16[i] && !both_nan;
    }
    CHECKF(bad == 0, "%d floats narrow to bf16 differently", bad);
}

/* ------------------------------------------------------------ GGUF both ways */

struct ggml_gguf_init_params {
    bool no_alloc;
    void **ctx;
};

struct ggml_init_params {
    size_t mem_size;
    void *mem_buffer;
    bool no_alloc;
};

typedef struct ggml_api {
    void *(*gguf_init_from_file)(const char *, struct ggml_gguf_init_params);
    void *(*gguf_init_empty)(void);
    void (*gguf_free)(void *);
    int64_t (*gguf_get_n_kv)(const void *);
    const char *(*gguf_get_key)(const void *, int64_t);
    int (*gguf_get_kv_type)(const void *, int64_t);
    int (*gguf_get_arr_type)(const void *, int64_t);
    size_t (*gguf_get_arr_n)(const void *, int64_t);
    const void *(*gguf_get_arr_data)(const void *, int64_t);
    const char *(*gguf_get_arr_str)(const void *, int64_t, size_t);
    const void *(*gguf_get_val_data)(const void *, int64_t);
    const char *(*gguf_get_val_str)(const void *, int64_t);
    int64_t (*gguf_get_n_tensors)(const void *);
    const char *(*gguf_get_tensor_name)(const void *, int64_t);
    int (*gguf_get_tensor_type)(const void *, int64_t);
    size_t (*gguf_get_tensor_offset)(const void *, int64_t);
    size_t (*gguf_get_data_offset)(const void *);
    size_t (*gguf_get_alignment)(const void *);
    void (*gguf_set_val_u32)(void *, const char *, uint32_t);
    void (*gguf_set_val_f32)(void *, const char *, float);
    void (*gguf_set_val_str)(void *, const char *, const char *);
    void (*gguf_set_val_bool)(void *, const char *, bool);
    void (*gguf_set_arr_data)(void *, const char *, int, const void *, size_t);
    void (*gguf_set_arr_str)(void *, const char *, const char **, size_t);
    void (*gguf_add_tensor)(void *, const void *);
    bool (*gguf_write_to_file)(const void *, const char *, bool);
    void *(*ggml_init)(struct ggml_init_params);
    void (*ggml_free)(void *);
    void *(*ggml_new_tensor_2d)(void *, int, int64_t, int64_t);
    void *(*ggml_set_name)(void *, const char *);
    void *(*ggml_get_data)(const void *);
} ggml_api;

static bool load_api(ggml_api *g) {
#define LOAD(name) (g->name = (__typeof__(g->name))sym(#name)) != NULL
    return LOAD(gguf_init_from_file) && LOAD(gguf_init_empty) && LOAD(gguf_free) && LOAD(gguf_get_n_kv) &&
           LOAD(gguf_get_key) && LOAD(gguf_get_kv_type) && LOAD(gguf_get_arr_type) && LOAD(gguf_get_arr_n) &&
           LOAD(gguf_get_arr_data) && LOAD(gguf_get_arr_str) && LOAD(gguf_get_val_data) && LOAD(gguf_get_val_str) &&
           LOAD(gguf_get_n_tensors) && LOAD(gguf_get_tensor_name) && LOAD(gguf_get_tensor_type) &&
           LOAD(gguf_get_tensor_offset) && LOAD(gguf_get_data_offset) && LOAD(gguf_get_alignment) &&
           LOAD(gguf_set_val_u32) && LOAD(gguf_set_val_f32) && LOAD(gguf_set_val_str) && LOAD(gguf_set_val_bool) &&
           LOAD(gguf_set_arr_data) && LOAD(gguf_set_arr_str) && LOAD(gguf_add_tensor) &&
           LOAD(gguf_write_to_file) && LOAD(ggml_init) && LOAD(ggml_free) && LOAD(ggml_new_tensor_2d) &&
           LOAD(ggml_set_name) && LOAD(ggml_get_data);
#undef LOAD
}

static char scratch_path[256];

static const char *scratch(const char *name) {
    snprintf(scratch_path, sizeof scratch_path, "/tmp/moe_oracle_%ld_%s", (long)getpid(), name);
    return scratch_path;
}

/* A file with every kind of value and three tensors, written by us. */
static gguf_writer *build_our_file(uint8_t *q4k_data, size_t q4k_bytes, float *f32_data) {
    gguf_writer *w = gguf_writer_new();
    static const int32_t ints[] = {-1, 0, 7, INT32_MAX};
    static const float reals[] = {0.5f, -2.25f, 1e-20f};
    static const char *const strs[] = {"alpha", "", "ünïcödé ✓", "a\nb"};
    gguf_writer_set_alignment(w, 64, NULL);
    gguf_writer_set_str(w, "general.architecture", "qwen3moe", NULL);
    gguf_writer_set_u32(w, "qwen3moe.block_count", 48, NULL);
    gguf_writer_set_i32(w, "test.i32", -123456, NULL);
    gguf_writer_set_u64(w, "test.u64", UINT64_C(1) << 40, NULL);
    gguf_writer_set_f32(w, "test.f32", 1e-6f, NULL);
    gguf_writer_set_bool(w, "test.bool", true, NULL);
    gguf_writer_set_array(w, "test.arr_i32", GGUF_TYPE_INT32, ints, 4, NULL);
    gguf_writer_set_array(w, "test.arr_f32", GGUF_TYPE_FLOAT32, reals, 3, NULL);
    gguf_writer_set_str_array(w, "test.arr_str", strs, 4, NULL);
    uint64_t ne_q[2] = {512, 4}, ne_f[2] = {7, 3};
    gguf_writer_add_tensor(w, "blk.0.ffn_down.weight", MOE_TYPE_Q4_K, 2, ne_q, q4k_data, NULL);
    gguf_writer_add_tensor(w, "odd.f32", MOE_TYPE_F32, 2, ne_f, f32_data, NULL);
    gguf_writer_add_tensor(w, "token_embd.weight", MOE_TYPE_Q4_K, 2, ne_q, q4k_data, NULL);
    (void)q4k_bytes;
    return w;
}

static void test_ggml_reads_our_files(void) {
    ggml_api g;
    if (!load_api(&g)) {
        CHECK(!"ggml's gguf API is missing");
        return;
    }
    size_t q_bytes = quant_row_bytes(MOE_TYPE_Q4_K, 512) * 4;
    uint8_t *q = malloc(q_bytes);
    float x[2048], f32[21];
    fill_weights(x, 2048);
    fill_weights(f32, 21);
    quant_format_of(MOE_TYPE_Q4_K)->quantize(x, q, 2048);
    gguf_writer *w = build_our_file(q, q_bytes, f32);
    const char *path = scratch("ours.gguf");
    moe_error err = {0};
    CHECKF(gguf_writer_save(w, path, &err) == MOE_OK, "%s", err.message);
    gguf_writer_free(w);

    gguf_file *ours = NULL;
    CHECKF(gguf_open(path, &ours, &err) == MOE_OK, "%s", err.message);
    void *theirs = g.gguf_init_from_file(path, (struct ggml_gguf_init_params){true, NULL});
    CHECK(theirs != NULL);
    if (ours && theirs) {
        CHECK(g.gguf_get_n_kv(theirs) == (int64_t)ours->n_kv);
        CHECK(g.gguf_get_alignment(theirs) == 64);
        CHECK(g.gguf_get_data_offset(theirs) == ours->data_offset);
        for (uint64_t i = 0; i < ours->n_kv && (int64_t)i < g.gguf_get_n_kv(theirs); i++) {
            CHECK(gguf_str_eq(ours->kv[i].key, g.gguf_get_key(theirs, (int64_t)i)));
            CHECK(g.gguf_get_kv_type(theirs, (int64_t)i) == (int)ours->kv[i].value.type);
        }
        CHECK(g.gguf_get_n_tensors(theirs) == (int64_t)ours->n_tensors);
        for (uint64_t i = 0; i < ours->n_tensors && (int64_t)i < g.gguf_get_n_tensors(theirs); i++) {
            CHECK(gguf_str_eq(ours->tensors[i].name, g.gguf_get_tensor_name(theirs, (int64_t)i)));
            CHECK(g.gguf_get_tensor_type(theirs, (int64_t)i) == (int)ours->tensors[i].type);
            CHECK(g.gguf_get_tensor_offset(theirs, (int64_t)i) == ours->tensors[i].offset);
        }
        int64_t id = -1;
        for (int64_t i = 0; i < g.gguf_get_n_kv(theirs); i++)
            if (strcmp(g.gguf_get_key(theirs, i), "test.arr_str") == 0) id = i;
        CHECK(id >= 0 && g.gguf_get_arr_n(theirs, id) == 4 && strcmp(g.gguf_get_arr_str(theirs, id, 2), "ünïcödé ✓") == 0);
    }
    if (theirs) g.gguf_free(theirs);
    gguf_close(ours);
    unlink(path);
    free(q);
}

static void test_we_read_ggml_files(void) {
    ggml_api g;
    if (!load_api(&g)) {
        CHECK(!"ggml's gguf API is missing");
        return;
    }
    void *ctx = g.ggml_init((struct ggml_init_params){16 << 20, NULL, false});
    void *gg = g.gguf_init_empty();
    static const int16_t shorts[] = {-3, 4, 32767};
    static const char *strs[] = {"x", "yz"};
    g.gguf_set_val_str(gg, "general.architecture", "llama");
    g.gguf_set_val_u32(gg, "llama.block_count", 2);
    g.gguf_set_val_f32(gg, "llama.rope.freq_base", 500000.0f);
    g.gguf_set_val_bool(gg, "test.flag", true);
    g.gguf_set_arr_data(gg, "test.shorts", GGUF_TYPE_INT16, shorts, 3);
    g.gguf_set_arr_str(gg, "test.strs", strs, 2);

    /* one tensor per format, quantized by ggml */
    size_t n_formats = sizeof formats / sizeof formats[0];
    float x[4 * 256];
    for (size_t i = 0; i < n_formats; i++) {
        if (formats[i].type == MOE_TYPE_Q8_K) continue; /* an activation type, never in files */
        void *t = g.ggml_new_tensor_2d(ctx, (int)formats[i].type, 256, 4);
        char name[64];
        snprintf(name, sizeof name, "tensor.%s", formats[i].ggml_name);
        g.ggml_set_name(t, name);
        fill_weights(x, 1024);
        ggml_quantizer(&formats[i])(x, g.ggml_get_data(t), 1024);
        g.gguf_add_tensor(gg, t);
    }
    const char *path = scratch("theirs.gguf");
    CHECK(g.gguf_write_to_file(gg, path, false));

    gguf_file *f = NULL;
    moe_error err = {0};
    CHECKF(gguf_open(path, &f, &err) == MOE_OK, "%s", err.message);
    if (f) {
        uint32_t blocks = 0;
        float base = 0;
        bool flag = false;
        const gguf_array *arr;
        CHECK(gguf_get_u32(f, "llama.block_count", &blocks, NULL) == MOE_OK && blocks == 2);
        CHECK(gguf_get_f32(f, "llama.rope.freq_base", &base, NULL) == MOE_OK && base == 500000.0f);
        CHECK(gguf_get_bool(f, "test.flag", &flag, NULL) == MOE_OK && flag);
        CHECK(gguf_get_array(f, "test.shorts", GGUF_TYPE_INT16, &arr, NULL) == MOE_OK && arr->n == 3 &&
              gguf_array_get_i64(arr, 0) == -3 && gguf_array_get_i64(arr, 2) == 32767);
        CHECK(gguf_get_array(f, "test.strs", GGUF_TYPE_STRING, &arr, NULL) == MOE_OK && arr->n == 2 &&
              gguf_str_eq(gguf_array_get_str(arr, 1), "yz"));
        float ours[1024], theirs[1024];
        for (size_t i = 0; i < n_formats; i++) {
            if (formats[i].type == MOE_TYPE_Q8_K) continue;
            char name[64];
            snprintf(name, sizeof name, "tensor.%s", formats[i].ggml_name);
            const gguf_tensor *t = gguf_find_tensor(f, name);
            CHECKF(t && t->type == formats[i].type, "%s", name);
            if (!t) continue;
            quant_format_of(t->type)->dequantize(t->data, ours, 1024);
            ggml_dequantizer(&formats[i])(t->data, theirs, 1024);
            CHECKF(count_bit_differences(ours, theirs, 1024) == 0, "%s read from ggml's file", name);
        }
    }
    gguf_close(f);
    g.gguf_free(gg);
    g.ggml_free(ctx);
    unlink(path);
}

int main(void) {
    const char *dir = getenv("MOE_ORACLE_LIB_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libggml-base.so", dir ? dir : MOE_ORACLE_LIB_DIR);
    ggml = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!ggml) {
        const char *required = getenv("MOE_REQUIRE_ORACLE");
        fprintf(stderr, "cannot load ggml (%s): run 'npm ci --prefix tests/oracle'\n", dlerror());
        if (required && strcmp(required, "1") == 0) return 1;
        printf("skipped: the ggml oracle is not installed\n");
        return 77;
    }
    RUN(test_formats_match_ggml);
    RUN(test_half_conversions_match_ggml);
    RUN(test_ggml_reads_our_files);
    RUN(test_we_read_ggml_files);
    return test_summary();
}
