/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader and writer.
 *
 * Every input goes through gguf_open_memory. A rejected input must come
 * back as a format error (or out of memory) with a message. An accepted one
 * is walked the way callers walk files: every key, every array element
 * (nested arrays included), lookups by each key and name, the typed getters,
 * and the first and last byte of every tensor's data, so that under
 * AddressSanitizer anything the reader let through that points outside the
 * input crashes here. Then the writer copies the file (every value through
 * gguf_writer_set_value, every tensor's data) and the copy must read back
 * with the same keys, values, shapes and bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf/gguf.h"

static volatile uint64_t sink;

#define REQUIRE(cond)                                                                                           \
    do {                                                                                                        \
        if (!(cond)) __builtin_trap();                                                                          \
    } while (0)

static void touch_value(const gguf_value *v);

static void touch_str(gguf_str s) {
    if (s.len) sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
}

static void touch_array(const gguf_array *a) {
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->items) touch_value(&a->items[i]);
        else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64) sink += gguf_array_get_f64(a, i) > 0;
        else sink += gguf_array_get_u64(a, i) + (uint64_t)gguf_array_get_i64(a, i);
    }
}

static void touch_value(const gguf_value *v) {
    if (v->type == GGUF_TYPE_STRING) touch_str(v->str);
    else if (v->type == GGUF_TYPE_ARRAY) touch_array(&v->arr);
    else sink += v->u64;
}

/* A copy of s as a C string, or NULL when it holds a NUL (no C caller can
 * name it). The caller frees. */
static char *c_string(gguf_str s) {
    if (memchr(s.data, '\0', s.len)) return NULL;
    char *c = malloc(s.len + 1);
    REQUIRE(c);
    memcpy(c, s.data, s.len);
    c[s.len] = '\0';
    return c;
}

static void exercise_getters(const gguf_file *f, const char *key) {
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    gguf_str s;
    const gguf_array *a;
    moe_error err;
    sink += gguf_get_u32(f, key, &u32, &err) + gguf_get_u64(f, key, &u64, &err) + gguf_get_i64(f, key, &i64, &err);
    sink += gguf_get_f32(f, key, &f32, &err) + gguf_get_bool(f, key, &b, &err) + gguf_get_str(f, key, &s, &err);
    sink += gguf_get_array(f, key, GGUF_TYPE_COUNT, &a, &err) + gguf_get_array(f, key, GGUF_TYPE_STRING, &a, &err);
}

static void walk(const gguf_file *f) {
    for (uint64_t i = 0; i < f->n_kv; i++) {
        touch_str(f->kv[i].key);
        touch_value(&f->kv[i].value);
        char *key = c_string(f->kv[i].key);
        if (!key) continue;
        REQUIRE(gguf_find(f, key) == &f->kv[i]);
        exercise_getters(f, key);
        free(key);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *p = t->data;
        REQUIRE(t->nbytes > 0 && gguf_tensor_n_elements(t) > 0);
        sink += p[0] + p[t->nbytes - 1];
        char *name = c_string(t->name);
        if (!name) continue;
        REQUIRE(gguf_find_tensor(f, name) == t);
        free(name);
    }
}

/* --- the writer round trip ------------------------------------------------- */

/* Keys and names a C caller cannot spell, or that GGML would refuse, are
 * beyond what the writer takes: such files are not copied. Nor are files
 * with a huge alignment: the reader takes general.alignment = 2^31 in a
 * file without tensors, but the copy would be 2 GiB of padding. */
static bool writable(const gguf_file *f) {
    if (f->alignment > 4096) return false;
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key.len == 0 || f->kv[i].key.len > 65535 || memchr(f->kv[i].key.data, '\0', f->kv[i].key.len))
            return false;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].name.len == 0 || f->tensors[i].name.len > 63 ||
            memchr(f->tensors[i].name.data, '\0', f->tensors[i].name.len))
            return false;
    return true;
}

static void write_copy(const gguf_file *f, gguf_writer *w, int fd) {
    moe_error err;
    REQUIRE(gguf_writer_set_alignment(w, (uint32_t)f->alignment, &err) == MOE_OK);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        char *key = c_string(f->kv[i].key);
        REQUIRE(gguf_writer_set_value(w, key, &f->kv[i].value, &err) == MOE_OK);
        free(key);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char *name = c_string(t->name);
        REQUIRE(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, NULL, &err) == MOE_OK);
        free(name);
    }
    REQUIRE(gguf_writer_begin(w, fd, &err) == MOE_OK);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        REQUIRE(gguf_writer_write_tensor(w, f->tensors[i].data, f->tensors[i].nbytes, &err) == MOE_OK);
    REQUIRE(gguf_writer_end(w, &err) == MOE_OK);
}

static void check_copy(const gguf_file *f, const gguf_file *g) {
    REQUIRE(g->alignment == f->alignment && g->n_tensors == f->n_tensors);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        char *key = c_string(f->kv[i].key);
        const gguf_kv *kv = gguf_find(g, key);
        /* An explicit general.alignment of 32 is implied, not written. */
        REQUIRE(kv ? gguf_values_equal(&kv->value, &f->kv[i].value) : strcmp(key, "general.alignment") == 0);
        free(key);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *a = &f->tensors[i], *b = &g->tensors[i];
        REQUIRE(a->name.len == b->name.len && memcmp(a->name.data, b->name.data, a->name.len) == 0);
        REQUIRE(a->type == b->type && a->n_dims == b->n_dims && memcmp(a->ne, b->ne, sizeof a->ne) == 0);
        REQUIRE(a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0);
    }
}

static void round_trip(const gguf_file *f) {
    if (!writable(f)) return;
    int fd = memfd_create("gguf", 0);
    REQUIRE(fd >= 0);
    gguf_writer *w = gguf_writer_new();
    REQUIRE(w);
    write_copy(f, w, fd);
    gguf_writer_free(w);
    off_t size = lseek(fd, 0, SEEK_END);
    REQUIRE(size > 0);
    void *copy = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    REQUIRE(copy != MAP_FAILED);
    gguf_file *g = NULL;
    moe_error err;
    REQUIRE(gguf_open_memory(copy, (size_t)size, &g, &err) == MOE_OK);
    check_copy(f, g);
    gguf_close(g);
    munmap(copy, (size_t)size);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    moe_error err = {0};
    moe_status st = gguf_open_memory(data, size, &f, &err);
    if (st != MOE_OK) {
        REQUIRE(f == NULL && (st == MOE_ERR_FORMAT || st == MOE_ERR_NOMEM) && err.code == st);
        REQUIRE(err.message[0] != '\0');
        return 0;
    }
    walk(f);
    round_trip(f);
    gguf_close(f);
    return 0;
}
