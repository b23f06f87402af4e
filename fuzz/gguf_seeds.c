/*
 * gguf_seeds.c — writes the seed corpus of fuzz_gguf into a directory:
 * small valid files made by our writer, covering every value type, nested
 * arrays, several tensor types and a non-default alignment, and a few
 * malformed ones derived from them. The output is committed under
 * fuzz/corpus/gguf; rerun this after a format change:
 *
 *   build-fuzz/fuzz/gguf_seeds fuzz/corpus/gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

static const char *out_dir;
static moe_error err;

static void die_on(moe_status st) {
    if (st == MOE_OK) return;
    fprintf(stderr, "gguf_seeds: %s\n", err.message);
    exit(1);
}

static const char *path_of(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    return path;
}

static void save(gguf_writer *w, const char *name) {
    die_on(gguf_writer_save(w, path_of(name), &err));
    gguf_writer_free(w);
}

static unsigned char *load(const char *name, size_t *size) {
    FILE *f = fopen(path_of(name), "rb");
    if (!f) exit(1);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    rewind(f);
    unsigned char *bytes = malloc(*size);
    if (!bytes || fread(bytes, 1, *size, f) != *size) exit(1);
    fclose(f);
    return bytes;
}

static void store(const char *name, const void *bytes, size_t size) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f || fwrite(bytes, 1, size, f) != size || fclose(f) != 0) exit(1);
}

static void add_tensor(gguf_writer *w, const char *name, moe_type type, uint32_t n_dims, const uint64_t *ne,
                       size_t nbytes) {
    static unsigned char data[4096];
    for (size_t i = 0; i < nbytes && i < sizeof data; i++) data[i] = (unsigned char)(i * 37 + 11);
    die_on(gguf_writer_add_tensor(w, name, type, n_dims, ne, data, &err));
}

static void write_metadata(void) {
    gguf_writer *w = gguf_writer_new();
    uint8_t u8s[] = {0, 255};
    int8_t i8s[] = {-128, 127};
    uint16_t u16s[] = {65535};
    int16_t i16s[] = {-32768};
    int32_t i32s[] = {-1, 2147483647};
    uint64_t u64s[] = {UINT64_MAX};
    int64_t i64s[] = {INT64_MIN};
    float f32s[] = {1.5f, -0.0f};
    double f64s[] = {3.25};
    uint8_t bools[] = {1, 0, 1};
    const char *strs[] = {"", "h\xc3\xa9llo", "token"};
    die_on(gguf_writer_set_str(w, "general.architecture", "qwen3moe", &err));
    die_on(gguf_writer_set_u32(w, "qwen3moe.block_count", 2, &err));
    die_on(gguf_writer_set_i32(w, "test.i32", -7, &err));
    die_on(gguf_writer_set_u64(w, "test.u64", 1ull << 40, &err));
    die_on(gguf_writer_set_f32(w, "test.f32", 1e-6f, &err));
    die_on(gguf_writer_set_bool(w, "test.bool", true, &err));
    die_on(gguf_writer_set_value(w, "test.u8", &(gguf_value){.type = GGUF_TYPE_UINT8, .u64 = 200}, &err));
    die_on(gguf_writer_set_value(w, "test.i64", &(gguf_value){.type = GGUF_TYPE_INT64, .i64 = -5}, &err));
    die_on(gguf_writer_set_value(w, "test.f64", &(gguf_value){.type = GGUF_TYPE_FLOAT64, .f64 = 0.1}, &err));
    die_on(gguf_writer_set_array(w, "arr.u8", GGUF_TYPE_UINT8, u8s, 2, &err));
    die_on(gguf_writer_set_array(w, "arr.i8", GGUF_TYPE_INT8, i8s, 2, &err));
    die_on(gguf_writer_set_array(w, "arr.u16", GGUF_TYPE_UINT16, u16s, 1, &err));
    die_on(gguf_writer_set_array(w, "arr.i16", GGUF_TYPE_INT16, i16s, 1, &err));
    die_on(gguf_writer_set_array(w, "arr.i32", GGUF_TYPE_INT32, i32s, 2, &err));
    die_on(gguf_writer_set_array(w, "arr.u64", GGUF_TYPE_UINT64, u64s, 1, &err));
    die_on(gguf_writer_set_array(w, "arr.i64", GGUF_TYPE_INT64, i64s, 1, &err));
    die_on(gguf_writer_set_array(w, "arr.f32", GGUF_TYPE_FLOAT32, f32s, 2, &err));
    die_on(gguf_writer_set_array(w, "arr.f64", GGUF_TYPE_FLOAT64, f64s, 1, &err));
    die_on(gguf_writer_set_array(w, "arr.bool", GGUF_TYPE_BOOL, bools, 3, &err));
    die_on(gguf_writer_set_array(w, "arr.empty", GGUF_TYPE_UINT32, NULL, 0, &err));
    die_on(gguf_writer_set_str_array(w, "arr.str", strs, 3, &err));
    gguf_value inner[2] = {
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_INT32, .n = 2, .data = i32s}},
        {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 0}},
    };
    gguf_value nested = {.type = GGUF_TYPE_ARRAY, .arr = {.type = GGUF_TYPE_ARRAY, .n = 2, .items = inner}};
    die_on(gguf_writer_set_value(w, "arr.nested", &nested, &err));
    save(w, "metadata.gguf");
}

static void write_tensors(void) {
    gguf_writer *w = gguf_writer_new();
    die_on(gguf_writer_set_str(w, "general.architecture", "qwen3moe", &err));
    add_tensor(w, "token_embd.weight", MOE_TYPE_F32, 2, (uint64_t[]){4, 3}, 48);
    add_tensor(w, "output_norm.weight", MOE_TYPE_F16, 1, (uint64_t[]){8}, 16);
    add_tensor(w, "blk.0.ffn_gate_exps.weight", MOE_TYPE_Q8_0, 3, (uint64_t[]){32, 2, 2}, 4 * 34);
    add_tensor(w, "blk.0.ffn_down_exps.weight", MOE_TYPE_Q4_0, 4, (uint64_t[]){32, 1, 2, 1}, 2 * 18);
    save(w, "tensors.gguf");
}

static void write_aligned(void) {
    gguf_writer *w = gguf_writer_new();
    die_on(gguf_writer_set_alignment(w, 64, &err));
    add_tensor(w, "blk.0.attn_q.weight", MOE_TYPE_Q4_K, 2, (uint64_t[]){256, 1}, 144);
    add_tensor(w, "blk.0.attn_norm.weight", MOE_TYPE_BF16, 1, (uint64_t[]){5}, 10);
    add_tensor(w, "blk.0.ffn_up_exps.weight", MOE_TYPE_MXFP4, 2, (uint64_t[]){32, 2}, 34);
    save(w, "aligned64.gguf");
}

static void write_minimal(void) {
    save(gguf_writer_new(), "empty.gguf");
}

/* Malformed files: each breaks one rule of an otherwise valid file. */
static void write_malformed(void) {
    size_t size;
    unsigned char *bytes = load("tensors.gguf", &size);
    store("bad_truncated.gguf", bytes, size / 2);
    unsigned char patched[4096];
    memcpy(patched, bytes, size);
    memcpy(patched, "GGML", 4);
    store("bad_magic.gguf", patched, size);
    memcpy(patched, bytes, size);
    patched[4] = 1;
    store("bad_version1.gguf", patched, size);
    memcpy(patched, bytes, size);
    patched[8] = 0xff; /* tensor count low byte */
    store("bad_tensor_count.gguf", patched, size);
    free(bytes);

    /* Arrays of arrays, 12 deep: each level is element type 9, count 1. */
    unsigned char bomb[24 + 8 + 1 + 4 + 12 * 12] = "GGUF\3\0\0\0"         /* version 3 */
                                                   "\0\0\0\0\0\0\0\0"     /* no tensors */
                                                   "\1\0\0\0\0\0\0\0"     /* one key */
                                                   "\1\0\0\0\0\0\0\0k"    /* named "k" */
                                                   "\11\0\0\0";             /* an array */
    for (int level = 0; level < 12; level++) memcpy(bomb + 37 + 12 * level, "\11\0\0\0\1\0\0\0\0\0\0\0", 12);
    store("bad_depth.gguf", bomb, sizeof bomb);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gguf_seeds DIR\n");
        return 2;
    }
    out_dir = argv[1];
    write_minimal();
    write_metadata();
    write_tensors();
    write_aligned();
    write_malformed();
    return 0;
}
