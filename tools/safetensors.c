/* safetensors.c — see safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

/* The format's own limit on the JSON header (safetensors refuses larger). */
#define MAX_HEADER_BYTES (100u << 20)

typedef struct st_file {
    char *path;
    const uint8_t *base;
    uint64_t size;
    dev_t dev;
    ino_t ino;
    bool mapped; /* false for a caller's buffer (safetensors_open_memory) */
} st_file;

struct st_checkpoint {
    st_file *files;
    size_t n_files;
    st_tensor *tensors; /* sorted by name once every file is read */
    size_t n_tensors, cap_tensors;
};

static const struct {
    const char *name;
    unsigned bytes;
    moe_type type;
} dtypes[] = {
    {"F32", 4, MOE_TYPE_F32},    {"F16", 2, MOE_TYPE_F16},       {"BF16", 2, MOE_TYPE_BF16},
    {"F64", 8, MOE_TYPE_COUNT},  {"I64", 8, MOE_TYPE_COUNT},     {"U64", 8, MOE_TYPE_COUNT},
    {"I32", 4, MOE_TYPE_COUNT},  {"U32", 4, MOE_TYPE_COUNT},     {"I16", 2, MOE_TYPE_COUNT},
    {"U16", 2, MOE_TYPE_COUNT},  {"I8", 1, MOE_TYPE_COUNT},      {"U8", 1, MOE_TYPE_COUNT},
    {"BOOL", 1, MOE_TYPE_COUNT}, {"F8_E4M3", 1, MOE_TYPE_COUNT}, {"F8_E5M2", 1, MOE_TYPE_COUNT},
};

/* ------------------------------------------------------------ files */

static moe_status check_length(const char *path, uint64_t size, moe_error *err) {
    if (size < 8)
        return moe_error_set(err, MOE_ERR_FORMAT,
                             "%s is truncated: %llu bytes, but a safetensors file starts with "
                             "an 8-byte header length",
                             path, (unsigned long long)size);
    return MOE_OK;
}

static moe_status check_size(const char *path, int fd, struct stat *s, moe_error *err) {
    if (fstat(fd, s) != 0) return moe_error_set(err, MOE_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(s->st_mode)) return moe_error_set(err, MOE_ERR_IO, "%s is not a regular file", path);
    return check_length(path, (uint64_t)s->st_size, err);
}

static moe_status map_file(const char *path, st_file *f, moe_error *err) {
    char *name = strdup(path);
    if (!name) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat s;
    moe_status st = fd >= 0 ? check_size(path, fd, &s, err)
                            : moe_error_set(err, MOE_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (st == MOE_OK) {
        void *p = mmap(NULL, (size_t)s.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            st = moe_error_set(err, MOE_ERR_IO, "cannot map %s: %s", path, strerror(errno));
        else
            *f = (st_file){
                .path = name, .base = p, .size = (uint64_t)s.st_size, .dev = s.st_dev, .ino = s.st_ino, .mapped = true};
    }
    if (fd >= 0) close(fd);
    if (st != MOE_OK) free(name);
    return st;
}

static uint64_t read_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------ the header */

static st_tensor *new_tensor(st_checkpoint *c, moe_error *err) {
    if (c->n_tensors == c->cap_tensors) {
        size_t cap = c->cap_tensors ? c->cap_tensors * 2 : 256;
        st_tensor *grown = realloc(c->tensors, cap * sizeof *grown);
        if (!grown) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory"), NULL;
        c->tensors = grown;
        c->cap_tensors = cap;
    }
    st_tensor *t = &c->tensors[c->n_tensors];
    memset(t, 0, sizeof *t);
    return t;
}

static moe_status parse_dtype(const st_file *f, const char *name, json_t *entry, st_tensor *t, unsigned *bytes,
                              moe_error *err) {
    const char *dtype = json_string_value(json_object_get(entry, "dtype"));
    if (!dtype) return moe_error_set(err, MOE_ERR_FORMAT, "%s: tensor %s has no dtype string", f->path, name);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype, dtypes[i].name) == 0) {
            snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
            t->type = dtypes[i].type;
            *bytes = dtypes[i].bytes;
            return MOE_OK;
        }
    return moe_error_set(err, MOE_ERR_FORMAT, "%s: tensor %s has unknown dtype \"%.16s\"", f->path, name, dtype);
}

static moe_status parse_shape(const st_file *f, const char *name, json_t *entry, st_tensor *t, moe_error *err) {
    json_t *shape = json_object_get(entry, "shape"), *dim;
    size_t i;
    if (!json_is_array(shape) || json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return moe_error_set(err, MOE_ERR_FORMAT, "%s: tensor %s has no shape array of at most %d dimensions", f->path,
                             name, SAFETENSORS_MAX_DIMS);
    t->n_dims = (int)json_array_size(shape);
    t->n_elements = 1;
    json_array_foreach(shape, i, dim) {
        json_int_t v = json_is_integer(dim) ? json_integer_value(dim) : -1;
        if (v < 0 || __builtin_mul_overflow(t->n_elements, (uint64_t)v, &t->n_elements))
            return moe_error_set(err, MOE_ERR_FORMAT,
                                 "%s: tensor %s has a bad dimension %zu (want an integer >= 0, "
                                 "with a product that fits 64 bits)",
                                 f->path, name, i);
        t->shape[i] = v;
    }
    return MOE_OK;
}

static moe_status parse_offsets(const st_file *f, const char *name, json_t *entry, uint64_t data_size, st_tensor *t,
                                unsigned elem_bytes, uint64_t *begin, moe_error *err) {
    json_t *offsets = json_object_get(entry, "data_offsets");
    json_t *b = json_array_get(offsets, 0), *e = json_array_get(offsets, 1);
    if (json_array_size(offsets) != 2 || !json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return moe_error_set(err, MOE_ERR_FORMAT,
                             "%s: tensor %s needs data_offsets [begin, end] with 0 <= begin <= end", f->path, name);
    uint64_t start = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (__builtin_mul_overflow(t->n_elements, (uint64_t)elem_bytes, &t->nbytes) || end - start != t->nbytes)
        return moe_error_set(err, MOE_ERR_FORMAT, "%s: tensor %s spans %llu bytes, but %llu elements of %s take %llu",
                             f->path, name, (unsigned long long)(end - start), (unsigned long long)t->n_elements,
                             t->dtype, (unsigned long long)t->nbytes);
    if (end > data_size)
        return moe_error_set(err, MOE_ERR_FORMAT,
                             "%s: tensor %s ends at byte %llu of the data, but the file holds %llu "
                             "(truncated?)",
                             f->path, name, (unsigned long long)end, (unsigned long long)data_size);
    *begin = start;
    return MOE_OK;
}

static moe_status parse_entry(st_checkpoint *c, const st_file *f, const char *name, json_t *entry, const uint8_t *data,
                              uint64_t data_size, moe_error *err) {
    if (!json_is_object(entry))
        return moe_error_set(err, MOE_ERR_FORMAT, "%s: header entry %s is not an object", f->path, name);
    st_tensor *t = new_tensor(c, err);
    if (!t) return MOE_ERR_NOMEM;
    unsigned elem_bytes = 0;
    uint64_t begin = 0;
    moe_status st = parse_dtype(f, name, entry, t, &elem_bytes, err);
    if (st == MOE_OK) st = parse_shape(f, name, entry, t, err);
    if (st == MOE_OK) st = parse_offsets(f, name, entry, data_size, t, elem_bytes, &begin, err);
    if (st == MOE_OK && !(t->name = strdup(name))) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st != MOE_OK) return st;
    t->data = data + begin;
    t->file = f->path;
    c->n_tensors++;
    return MOE_OK;
}

/* Read the tensor table of file f into c. */
static moe_status parse_header(st_checkpoint *c, const st_file *f, moe_error *err) {
    uint64_t n = read_u64_le(f->base);
    if (n > f->size - 8 || n > MAX_HEADER_BYTES)
        return moe_error_set(err, MOE_ERR_FORMAT,
                             "%s: header length %llu exceeds the file's %llu bytes (or the 100 MB "
                             "limit): not a safetensors file, or truncated",
                             f->path, (unsigned long long)n, (unsigned long long)f->size);
    json_error_t je;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) return moe_error_set(err, MOE_ERR_FORMAT, "%s: bad JSON header: %s", f->path, je.text);
    moe_status st = json_is_object(root)
                        ? MOE_OK
                        : moe_error_set(err, MOE_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
    const uint8_t *data = f->base + 8 + n;
    uint64_t data_size = f->size - 8 - n;
    const char *name;
    json_t *entry;
    json_object_foreach(root, name, entry) {
        if (st != MOE_OK) break;
        if (strcmp(name, "__metadata__") != 0) st = parse_entry(c, f, name, entry, data, data_size, err);
    }
    json_decref(root);
    return st;
}

static moe_status add_file(st_checkpoint *c, const char *path, moe_error *err) {
    st_file *grown = realloc(c->files, (c->n_files + 1) * sizeof *grown);
    if (!grown) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    c->files = grown;
    moe_status st = map_file(path, &c->files[c->n_files], err);
    if (st != MOE_OK) return st;
    c->n_files++;
    return parse_header(c, &c->files[c->n_files - 1], err);
}

/* ------------------------------------------------------------ lookup */

static int compare_tensors(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static moe_status sort_tensors(st_checkpoint *c, moe_error *err) {
    if (c->n_tensors) qsort(c->tensors, c->n_tensors, sizeof *c->tensors, compare_tensors);
    for (size_t i = 1; i < c->n_tensors; i++)
        if (strcmp(c->tensors[i - 1].name, c->tensors[i].name) == 0)
            return moe_error_set(err, MOE_ERR_FORMAT, "tensor %s appears in both %s and %s", c->tensors[i].name,
                                 c->tensors[i - 1].file, c->tensors[i].file);
    return MOE_OK;
}

st_tensor *safetensors_find(st_checkpoint *c, const char *name) {
    st_tensor key = {.name = (char *)name};
    return c->n_tensors ? bsearch(&key, c->tensors, c->n_tensors, sizeof key, compare_tensors) : NULL;
}

st_tensor *safetensors_tensors(st_checkpoint *c, size_t *n) {
    *n = c->n_tensors;
    return c->tensors;
}

bool safetensors_holds_file(const st_checkpoint *c, const char *path) {
    struct stat s;
    if (stat(path, &s) != 0) return false;
    for (size_t i = 0; i < c->n_files; i++)
        if (c->files[i].dev == s.st_dev && c->files[i].ino == s.st_ino) return true;
    return false;
}

/* ------------------------------------------------------------ opening */

void safetensors_close(st_checkpoint *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_tensors; i++)
        free(c->tensors[i].name);
    free(c->tensors);
    for (size_t i = 0; i < c->n_files; i++) {
        if (c->files[i].mapped) munmap((void *)c->files[i].base, (size_t)c->files[i].size);
        free(c->files[i].path);
    }
    free(c->files);
    free(c);
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A shard name from the index: a plain file name in the checkpoint's own
 * directory, never a path that could lead out of it. */
static bool plain_file_name(const char *name) { return name[0] != '\0' && name[0] != '.' && strchr(name, '/') == NULL; }

static moe_status open_shards(st_checkpoint *c, const char *dir, const char *index_path, json_t *map, moe_error *err) {
    const char *tensor;
    json_t *file;
    json_t *seen = json_object();
    moe_status st = seen ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    json_object_foreach(map, tensor, file) {
        const char *name = json_string_value(file);
        if (st != MOE_OK) break;
        if (!name || !plain_file_name(name))
            st = moe_error_set(err, MOE_ERR_FORMAT, "%s: tensor %s maps to a bad shard name (want a file name in %s)",
                               index_path, tensor, dir);
        else if (!json_object_get(seen, name)) {
            char *path = join_path(dir, name);
            st = !path ? moe_error_set(err, MOE_ERR_NOMEM, "out of memory") : add_file(c, path, err);
            free(path);
            if (st == MOE_OK && json_object_set_new(seen, name, json_true()) != 0)
                st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        }
    }
    json_decref(seen);
    return st;
}

/* Each tensor the index names must be in the shard it names. */
static moe_status check_index(st_checkpoint *c, const char *index_path, json_t *map, moe_error *err) {
    const char *tensor;
    json_t *file;
    json_object_foreach(map, tensor, file) {
        const st_tensor *t = safetensors_find(c, tensor);
        const char *slash = t ? strrchr(t->file, '/') : NULL;
        const char *shard = slash ? slash + 1 : t ? t->file : NULL;
        if (!t || strcmp(shard, json_string_value(file)) != 0)
            return moe_error_set(err, MOE_ERR_FORMAT, "%s names tensor %s in %s, but that shard does not hold it",
                                 index_path, tensor, json_string_value(file));
    }
    return MOE_OK;
}

static moe_status open_index(st_checkpoint *c, const char *dir, const char *index_path, moe_error *err) {
    json_error_t je;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return moe_error_set(err, MOE_ERR_FORMAT, "%s: %s (line %d)", index_path, je.text, je.line);
    json_t *map = json_object_get(root, "weight_map");
    moe_status st =
        json_is_object(map) && json_object_size(map) > 0
            ? MOE_OK
            : moe_error_set(err, MOE_ERR_FORMAT, "%s has no weight_map object naming the shards", index_path);
    if (st == MOE_OK) st = open_shards(c, dir, index_path, map, err);
    if (st == MOE_OK) st = sort_tensors(c, err);
    if (st == MOE_OK) st = check_index(c, index_path, map, err);
    json_decref(root);
    return st;
}

moe_status safetensors_open_dir(const char *dir, st_checkpoint **out, moe_error *err) {
    *out = NULL;
    char *index = join_path(dir, "model.safetensors.index.json"), *single = join_path(dir, "model.safetensors");
    st_checkpoint *c = calloc(1, sizeof *c);
    moe_status st = index && single && c ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) {
        if (access(index, F_OK) == 0)
            st = open_index(c, dir, index, err);
        else if (access(single, F_OK) == 0) {
            st = add_file(c, single, err);
            if (st == MOE_OK) st = sort_tensors(c, err);
        } else
            st = moe_error_set(err, MOE_ERR_NOT_FOUND,
                               "%s has neither model.safetensors nor "
                               "model.safetensors.index.json",
                               dir);
    }
    free(index);
    free(single);
    if (st != MOE_OK) {
        safetensors_close(c);
        return st;
    }
    *out = c;
    return MOE_OK;
}

moe_status safetensors_open_memory(const void *data, size_t size, const char *name, st_checkpoint **out,
                                   moe_error *err) {
    *out = NULL;
    st_checkpoint *c = calloc(1, sizeof *c);
    st_file *f = calloc(1, sizeof *f);
    char *path = strdup(name);
    if (!c || !f || !path) {
        free(c);
        free(f);
        free(path);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    *f = (st_file){.path = path, .base = data, .size = size};
    c->files = f;
    c->n_files = 1;
    moe_status st = check_length(name, size, err);
    if (st == MOE_OK) st = parse_header(c, f, err);
    if (st == MOE_OK) st = sort_tensors(c, err);
    if (st != MOE_OK) {
        safetensors_close(c);
        return st;
    }
    *out = c;
    return MOE_OK;
}
