/* quantize_model.c — see quantize_model.h. */
#include "quant/quantize_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/progress.h"
#include "common/thread_pool.h"
#include "gguf/gguf.h"

/* Rows per thread-pool task: large enough to amortise the hand-out, small
 * enough that a 2048-row tensor still spreads over many threads. */
#define ROWS_PER_TASK 16

typedef struct convert_job {
    const gguf_tensor *src;
    moe_type dst_type;
    int64_t row_len;
    size_t src_row_bytes, dst_row_bytes;
    int64_t n_rows;
    uint8_t *dst;
    float **scratch; /* one f32 row per worker */
    progress *bar;
} convert_job;

static void convert_rows(void *ctx, int64_t task, int worker) {
    convert_job *job = ctx;
    const quant_format *from = quant_format_of(job->src->type);
    const quant_format *to = quant_format_of(job->dst_type);
    float *row = job->scratch[worker];
    int64_t end = (task + 1) * ROWS_PER_TASK;
    if (end > job->n_rows) end = job->n_rows;
    for (int64_t r = task * ROWS_PER_TASK; r < end; r++) {
        const uint8_t *src = (const uint8_t *)job->src->data + (size_t)r * job->src_row_bytes;
        from->dequantize(src, row, job->row_len);
        to->quantize(row, job->dst + (size_t)r * job->dst_row_bytes, job->row_len);
    }
    progress_add(job->bar, (uint64_t)(end - task * ROWS_PER_TASK) * job->src_row_bytes);
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return false;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static moe_status check_convertible(const gguf_tensor *t, moe_type to, moe_error *err) {
    if (t->type == to) return MOE_OK;
    if (!quant_is_supported(t->type))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "tensor %.*s has type %s, which moe.c cannot dequantize",
                             (int)t->name.len, t->name.data, quant_format_of(t->type)->name);
    return MOE_OK;
}

/* Copy the input's keys, then stamp the new file type. */
static moe_status copy_metadata(const gguf_file *in, gguf_writer *w, const quant_recipe *recipe, moe_error *err) {
    char key[512];
    for (uint64_t i = 0; i < in->n_kv; i++) {
        const gguf_kv *kv = &in->kv[i];
        if (kv->key.len >= sizeof key)
            return moe_error_set(err, MOE_ERR_RANGE, "metadata key longer than %zu bytes", sizeof key - 1);
        memcpy(key, kv->key.data, kv->key.len);
        key[kv->key.len] = '\0';
        moe_status st = gguf_writer_set_value(w, key, &kv->value, err);
        if (st != MOE_OK) return st;
    }
    moe_status st = gguf_writer_set_u32(w, "general.file_type", recipe->file_type, err);
    if (st == MOE_OK) st = gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    return st;
}

static uint32_t block_count_of(const gguf_file *in) {
    gguf_str arch;
    uint32_t n = 0;
    char key[128];
    if (gguf_get_str(in, "general.architecture", &arch, NULL) != MOE_OK || arch.len > 64) return 0;
    snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.data);
    gguf_get_u32(in, key, &n, NULL);
    return n;
}

/* Decide every tensor's type and lay out the output directory. */
static moe_status plan_tensors(const gguf_file *in, gguf_writer *w, const quant_recipe *recipe, moe_type *types,
                               moe_error *err) {
    uint32_t n_layers = block_count_of(in);
    char name[512];
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const gguf_tensor *t = &in->tensors[i];
        if (t->name.len >= sizeof name)
            return moe_error_set(err, MOE_ERR_RANGE, "tensor name longer than %zu bytes", sizeof name - 1);
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = '\0';
        types[i] = quant_recipe_choose(recipe, name, t->n_dims, t->ne, n_layers);
        moe_status st = check_convertible(t, types[i], err);
        if (st == MOE_OK) st = gguf_writer_add_tensor(w, name, types[i], t->n_dims, t->ne, NULL, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

typedef struct converter {
    thread_pool *pool;
    float **scratch;
    uint8_t *buffer;
    size_t buffer_size;
    progress *bar;
    const quantize_options *opts;
} converter;

static moe_status write_tensor(converter *c, gguf_writer *w, const gguf_tensor *t, moe_type to, moe_error *err) {
    int64_t row_len = (int64_t)t->ne[0];
    int64_t n_rows = (int64_t)(gguf_tensor_n_elements(t) / t->ne[0]);
    uint64_t out_bytes = (uint64_t)n_rows * quant_row_bytes(to, row_len);
    if (t->type == to) {
        progress_add(c->bar, t->nbytes);
        return gguf_writer_write_tensor(w, t->data, t->nbytes, err);
    }
    if (out_bytes > c->buffer_size) {
        uint8_t *grown = realloc(c->buffer, out_bytes);
        if (!grown) return moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate %llu bytes", (unsigned long long)out_bytes);
        c->buffer = grown;
        c->buffer_size = out_bytes;
    }
    convert_job job = {
        .src = t, .dst_type = to, .row_len = row_len,
        .src_row_bytes = quant_row_bytes(t->type, row_len), .dst_row_bytes = quant_row_bytes(to, row_len),
        .n_rows = n_rows, .dst = c->buffer, .scratch = c->scratch, .bar = c->bar,
    };
    thread_pool_run(c->pool, (n_rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK, convert_rows, &job);
    return gguf_writer_write_tensor(w, c->buffer, out_bytes, err);
}

static moe_status alloc_scratch(converter *c, const gguf_file *in, moe_error *err) {
    uint64_t widest = 0;
    for (uint64_t i = 0; i < in->n_tensors; i++)
        if (in->tensors[i].ne[0] > widest) widest = in->tensors[i].ne[0];
    int n = thread_pool_size(c->pool);
    c->scratch = calloc((size_t)n, sizeof *c->scratch);
    if (!c->scratch) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if (!(c->scratch[i] = malloc(widest * sizeof(float))))
            return moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate a row of %llu floats", (unsigned long long)widest);
    return MOE_OK;
}

static void free_converter(converter *c) {
    if (c->scratch)
        for (int i = 0; i < thread_pool_size(c->pool); i++) free(c->scratch[i]);
    free(c->scratch);
    free(c->buffer);
    thread_pool_free(c->pool);
}

static moe_status write_all(const gguf_file *in, gguf_writer *w, const moe_type *types, converter *c,
                            quantize_report *report, moe_error *err) {
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        if (c->opts->cancel && *c->opts->cancel)
            return moe_error_set(err, MOE_ERR_INTERRUPTED, "interrupted; no output was written");
        const gguf_tensor *t = &in->tensors[i];
        moe_status st = write_tensor(c, w, t, types[i], err);
        if (st != MOE_OK) return st;
        report->n_requantized += t->type != types[i];
        report->bytes_in += t->nbytes;
        report->bytes_out += quant_row_bytes(types[i], (int64_t)t->ne[0]) * (gguf_tensor_n_elements(t) / t->ne[0]);
        report->count_by_type[types[i]]++;
    }
    report->n_tensors = in->n_tensors;
    return gguf_writer_end(w, err);
}

static moe_status quantize_open_file(const gguf_file *in, const char *out_path, const quant_recipe *recipe,
                                     const quantize_options *opts, quantize_report *report, moe_error *err) {
    gguf_writer *w = gguf_writer_new();
    moe_type *types = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *types);
    converter c = {.pool = thread_pool_new(opts->n_threads), .opts = opts};
    atomic_file out = {.fd = -1};
    moe_status st = MOE_OK;
    if (!w || !types || !c.pool) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) st = gguf_writer_set_alignment(w, (uint32_t)in->alignment, err);
    if (st == MOE_OK) st = copy_metadata(in, w, recipe, err);
    if (st == MOE_OK) st = plan_tensors(in, w, recipe, types, err);
    if (st == MOE_OK) st = alloc_scratch(&c, in, err);
    if (st == MOE_OK) st = atomic_file_open(&out, out_path, err);
    if (st == MOE_OK) {
        uint64_t total = in->size - in->data_offset;
        c.bar = opts->show_progress ? progress_start("quantizing", total, 1e-6, "MB") : NULL;
        st = gguf_writer_begin(w, out.fd, err);
        if (st == MOE_OK) st = write_all(in, w, types, &c, report, err);
        progress_finish(c.bar);
        if (st == MOE_OK) st = atomic_file_commit(&out, err);
        else atomic_file_abort(&out);
    }
    if (c.pool) free_converter(&c);
    free(types);
    gguf_writer_free(w);
    return st;
}

moe_status quantize_model(const char *in_path, const char *out_path, const quant_recipe *recipe,
                          const quantize_options *opts, quantize_report *report, moe_error *err) {
    memset(report, 0, sizeof *report);
    if (strcmp(in_path, out_path) == 0 || same_file(in_path, out_path))
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "refusing to overwrite the input %s: choose another output path",
                             in_path);
    gguf_file *in = NULL;
    moe_status st = gguf_open(in_path, &in, err);
    if (st != MOE_OK) return st;
    st = quantize_open_file(in, out_path, recipe, opts, report, err);
    gguf_close(in);
    return st;
}
