/*
 * safetensors.h — reading Hugging Face checkpoints in the safetensors format.
 *
 * A safetensors file, all integers little-endian:
 *   1. header length N (u64)
 *   2. N bytes of JSON: an object mapping each tensor name to
 *      {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}
 *      (offsets relative to the byte after the header), plus an optional
 *      "__metadata__" object of strings
 *   3. the tensor data, row-major, outermost dimension first
 *
 * A checkpoint is one file (model.safetensors) or several shards named by
 * model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
 * Every file is mapped read-only and validated before use: the header
 * length, the JSON, each dtype, shape and offset pair against the data that
 * follows (overflow-safe), and, for shards, that each tensor is where the
 * index says and in one shard only. A malformed checkpoint is one
 * MOE_ERR_FORMAT naming the file and the problem; nothing is copied.
 */
#ifndef MOE_TOOLS_SAFETENSORS_H
#define MOE_TOOLS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moe.h"
#include "quant/quant.h"

#define SAFETENSORS_MAX_DIMS 8

typedef struct st_tensor {
    char *name;
    char dtype[16]; /* as the file spells it: "BF16" */
    moe_type type;  /* F32, F16 or BF16; MOE_TYPE_COUNT for dtypes moe.c does not read */
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS]; /* outermost first, as PyTorch has it */
    uint64_t n_elements;
    const uint8_t *data; /* into the mapping; no alignment promised */
    uint64_t nbytes;
    const char *file; /* the file it is in, for messages */
    bool used;        /* free for the caller: the converter marks what it took */
} st_tensor;

typedef struct st_checkpoint st_checkpoint;

/* Open the checkpoint in directory `dir`: model.safetensors.index.json and
 * its shards when the index exists, else model.safetensors. */
moe_status safetensors_open_dir(const char *dir, st_checkpoint **out, moe_error *err);

/* One safetensors file already in memory (`size` bytes, kept alive by the
 * caller until safetensors_close), validated as a file on disk would be;
 * `name` stands for the file in messages. For the fuzzer and tests. */
moe_status safetensors_open_memory(const void *data, size_t size, const char *name, st_checkpoint **out,
                                   moe_error *err);

void safetensors_close(st_checkpoint *c);

/* NULL when absent. O(log n). */
st_tensor *safetensors_find(st_checkpoint *c, const char *name);

/* All tensors, sorted by name. */
st_tensor *safetensors_tensors(st_checkpoint *c, size_t *n);

/* True when `path` is one of the checkpoint's files (through any name). */
bool safetensors_holds_file(const st_checkpoint *c, const char *path);

#endif
