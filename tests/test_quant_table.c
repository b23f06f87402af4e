/*
 * test_quant_table.c — the type table of quant.c: every GGML id with its
 * name and block geometry, lookups by id and by name, which types have
 * kernels and what their activations are quantized to, and quant_row_bytes
 * at its edges.
 *
 * The expected geometry is written out here from GGML's block structs
 * (ggml-common.h), e.g. Q3_K = hmask[32] + qs[64] + scales[12] + fp16 d =
 * 110 bytes per 256, TQ1_0 = qs[48] + qh[4] + fp16 d = 54.
 */
#include <stdint.h>

#include "quant/quant.h"
#include "test.h"

typedef struct expected_type {
    uint32_t id;
    const char *name;
    int64_t block_size;
    size_t block_bytes;
    bool supported;
    moe_type dot_type; /* only read when supported */
} expected_type;

static const expected_type expected[] = {
    {0, "f32", 1, 4, true, MOE_TYPE_F32},
    {1, "f16", 1, 2, true, MOE_TYPE_F32},
    {2, "q4_0", 32, 18, true, MOE_TYPE_Q8_0},
    {3, "q4_1", 32, 20, true, MOE_TYPE_Q8_1},
    {6, "q5_0", 32, 22, true, MOE_TYPE_Q8_0},
    {7, "q5_1", 32, 24, true, MOE_TYPE_Q8_1},
    {8, "q8_0", 32, 34, true, MOE_TYPE_Q8_0},
    {9, "q8_1", 32, 36, true, MOE_TYPE_Q8_1},
    {10, "q2_k", 256, 84, false, 0},
    {11, "q3_k", 256, 110, false, 0},
    {12, "q4_k", 256, 144, true, MOE_TYPE_Q8_K},
    {13, "q5_k", 256, 176, true, MOE_TYPE_Q8_K},
    {14, "q6_k", 256, 210, true, MOE_TYPE_Q8_K},
    {15, "q8_k", 256, 292, true, MOE_TYPE_Q8_K},
    {16, "iq2_xxs", 256, 66, false, 0},
    {17, "iq2_xs", 256, 74, false, 0},
    {18, "iq3_xxs", 256, 98, false, 0},
    {19, "iq1_s", 256, 50, false, 0},
    {20, "iq4_nl", 32, 18, true, MOE_TYPE_Q8_0},
    {21, "iq3_s", 256, 110, false, 0},
    {22, "iq2_s", 256, 82, false, 0},
    {23, "iq4_xs", 256, 136, false, 0},
    {24, "i8", 1, 1, false, 0},
    {25, "i16", 1, 2, false, 0},
    {26, "i32", 1, 4, false, 0},
    {27, "i64", 1, 8, false, 0},
    {28, "f64", 1, 8, false, 0},
    {29, "iq1_m", 256, 56, false, 0},
    {30, "bf16", 1, 2, true, MOE_TYPE_F32},
    {34, "tq1_0", 256, 54, false, 0},
    {35, "tq2_0", 256, 66, false, 0},
    {39, "mxfp4", 32, 17, true, MOE_TYPE_Q8_0},
};
enum { N_EXPECTED = sizeof expected / sizeof expected[0] };

static const uint32_t retired_ids[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 1000, UINT32_MAX};

static void test_every_id(void) {
    for (int i = 0; i < N_EXPECTED; i++) {
        const expected_type *e = &expected[i];
        const quant_format *f = quant_format_of(e->id);
        CHECKF(f != NULL, "id %u", e->id);
        if (!f) continue;
        CHECKF(f->type == (moe_type)e->id, "id %u has type %d", e->id, (int)f->type);
        CHECKF(strcmp(f->name, e->name) == 0, "id %u is named %s, expected %s", e->id, f->name, e->name);
        CHECKF(f->block_size == e->block_size, "%s block_size %lld", e->name, (long long)f->block_size);
        CHECKF(f->block_bytes == e->block_bytes, "%s block_bytes %zu", e->name, f->block_bytes);
        CHECKF(quant_is_supported((moe_type)e->id) == e->supported, "%s supported", e->name);
    }
}

static void test_retired_and_out_of_range_ids(void) {
    for (size_t i = 0; i < sizeof retired_ids / sizeof retired_ids[0]; i++) {
        CHECKF(quant_format_of(retired_ids[i]) == NULL, "id %u", retired_ids[i]);
        CHECKF(!quant_is_supported((moe_type)retired_ids[i]), "id %u", retired_ids[i]);
        CHECKF(quant_row_bytes((moe_type)retired_ids[i], 32) == 0, "id %u", retired_ids[i]);
    }
    CHECK(quant_format_of(MOE_TYPE_COUNT) == NULL);
    CHECK(!quant_is_supported((moe_type)-1));
    CHECK(quant_row_bytes((moe_type)-1, 32) == 0);
    /* Exactly the expected ids are known. */
    int known = 0;
    for (uint32_t id = 0; id < 256; id++) known += quant_format_of(id) != NULL;
    CHECKF(known == N_EXPECTED, "%d ids known", known);
}

/* A supported format's kernels are all there, its activations are a
 * supported format that can quantize, and activation blocks line up with
 * weight blocks (quant_dot_f32 and the dot kernels rely on it). */
static void test_kernels_and_dot_types(void) {
    for (int i = 0; i < N_EXPECTED; i++) {
        const expected_type *e = &expected[i];
        const quant_format *f = quant_format_of(e->id);
        if (!f) continue;
        if (!e->supported) {
            CHECKF(!f->dequantize && !f->quantize && !f->dot, "%s has kernels", e->name);
            CHECKF(f->dot_type == MOE_TYPE_COUNT, "%s dot_type %d", e->name, (int)f->dot_type);
            continue;
        }
        CHECKF(f->dequantize && f->quantize && f->dot, "%s lacks a kernel", e->name);
        CHECKF(f->dot_type == e->dot_type, "%s dot_type %d", e->name, (int)f->dot_type);
        const quant_format *a = quant_format_of(f->dot_type);
        CHECKF(a && a->quantize, "%s activations", e->name);
        if (a) CHECKF(a->block_size == f->block_size, "%s activation blocks", e->name);
    }
}

static void test_by_name(void) {
    for (int i = 0; i < N_EXPECTED; i++)
        CHECKF(quant_format_by_name(expected[i].name) == quant_format_of(expected[i].id), "%s",
               expected[i].name);
    CHECK(quant_format_by_name("Q4_K") == quant_format_of(MOE_TYPE_Q4_K));
    CHECK(quant_format_by_name("q4_K") == quant_format_of(MOE_TYPE_Q4_K));
    CHECK(quant_format_by_name("BF16") == quant_format_of(MOE_TYPE_BF16));
    CHECK(quant_format_by_name("MxFp4") == quant_format_of(MOE_TYPE_MXFP4));
    CHECK(quant_format_by_name("IQ4_NL") == quant_format_of(MOE_TYPE_IQ4_NL));
    CHECK(quant_format_by_name(NULL) == NULL);
    CHECK(quant_format_by_name("") == NULL);
    CHECK(quant_format_by_name("q4_2") == NULL);
    CHECK(quant_format_by_name("q4_0 ") == NULL);
    CHECK(quant_format_by_name("q4") == NULL);
    CHECK(quant_format_by_name("f32x") == NULL);
}

static void test_row_bytes(void) {
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, 0) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, 32) == 18);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, 4096) == 128 * 18);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, 33) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, 16) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, -32) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_K, 256) == 144);
    CHECK(quant_row_bytes(MOE_TYPE_Q4_K, 128) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_Q2_K, 512) == 168);
    CHECK(quant_row_bytes(MOE_TYPE_F32, 3) == 12);
    CHECK(quant_row_bytes(MOE_TYPE_F32, -1) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_MXFP4, 64) == 34);
    CHECK(quant_row_bytes(MOE_TYPE_F32, INT64_MIN) == 0);
    /* The largest rows: bytes that fit size_t come back exactly, the rest 0. */
    CHECK(quant_row_bytes(MOE_TYPE_I8, INT64_MAX) == (size_t)INT64_MAX);
    CHECK(quant_row_bytes(MOE_TYPE_I16, INT64_MAX) == (size_t)INT64_MAX * 2);
    CHECK(quant_row_bytes(MOE_TYPE_F64, INT64_MAX) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_F32, (int64_t)1 << 62) == 0);
    CHECK(quant_row_bytes(MOE_TYPE_F32, ((int64_t)1 << 62) - 1) == SIZE_MAX - 3);
    const int64_t q4_blocks = INT64_MAX / 32;
    CHECK(quant_row_bytes(MOE_TYPE_Q4_0, q4_blocks * 32) == (size_t)q4_blocks * 18);
    const int64_t q8k_blocks = INT64_MAX / 256;
    CHECK(quant_row_bytes(MOE_TYPE_Q8_K, q8k_blocks * 256) == (size_t)q8k_blocks * 292);
}

static void test_dot_f32_refuses_bad_input(void) {
    const float x[64] = {0};
    const unsigned char w[64 * 4] = {0};
    CHECK(isnan(quant_dot_f32(MOE_TYPE_Q2_K, w, x, 256)));
    CHECK(isnan(quant_dot_f32((moe_type)4, w, x, 32)));
    CHECK(isnan(quant_dot_f32(MOE_TYPE_Q4_0, w, x, 48)));
    CHECK(isnan(quant_dot_f32(MOE_TYPE_Q4_0, w, x, -32)));
    CHECK(quant_dot_f32(MOE_TYPE_Q4_0, w, x, 0) == 0.0f);
    CHECK(quant_dot_f32(MOE_TYPE_F32, w, x, 64) == 0.0f);
}

int main(void) {
    RUN(test_every_id);
    RUN(test_retired_and_out_of_range_ids);
    RUN(test_kernels_and_dot_types);
    RUN(test_by_name);
    RUN(test_row_bytes);
    RUN(test_dot_f32_refuses_bad_input);
    return test_summary();
}
