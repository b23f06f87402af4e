/*
 * cmd_inspect.c — `moe inspect FILE`: what is inside a GGUF file.
 *
 * Prints the metadata (long arrays abbreviated), the tensor table, totals by
 * type and a paragraph on the architecture: its shape, parameter counts and
 * the weight bytes one decoded token reads — the number every decode speed
 * in moe.c is divided by. --json prints the same as one JSON object.
 */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gguf/gguf.h"

#define ARRAY_PREVIEW 8 /* elements shown of a long array unless --full */

/* ------------------------------------------------------------ model shape */

typedef struct model_shape {
    char arch[64];
    uint32_t n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff, n_ff_expert;
    uint32_t n_experts, n_experts_used, n_ctx;
    uint64_t vocab;
    uint64_t params, active_params; /* active: routed experts scaled by used/count */
    uint64_t bytes, bytes_per_token;
} model_shape;

static uint32_t arch_u32(const gguf_file *f, const char *arch, const char *suffix) {
    char key[160];
    uint32_t v = 0;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    gguf_get_u32(f, key, &v, NULL);
    return v;
}

/* Routed-expert tensors: merged "blk.N.ffn_*_exps.*" or per-expert
 * "blk.N.ffn_{gate,up,down}.E.weight". */
static bool is_routed_expert(gguf_str name) {
    char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(name.len < 255 ? name.len : 255), name.data);
    if (strstr(buf, "_exps.")) return true;
    int layer, expert, consumed = 0;
    char role[16];
    return sscanf(buf, "blk.%d.ffn_%15[a-z].%d.weight%n", &layer, role, &expert, &consumed) == 3 && consumed > 0;
}

/* Bytes a decoded token reads: all weights except the embedding table (one
 * row of it), with routed experts scaled by used/count. A tied head reads
 * the embedding table in full. */
static void count_weights(const gguf_file *f, model_shape *s) {
    double expert_share = s->n_experts ? (double)s->n_experts_used / s->n_experts : 1.0;
    bool has_head = gguf_find_tensor(f, "output.weight") != NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        uint64_t n = gguf_tensor_n_elements(t);
        s->params += n;
        s->bytes += t->nbytes;
        if (is_routed_expert(t->name)) {
            s->active_params += (uint64_t)(n * expert_share);
            s->bytes_per_token += (uint64_t)(t->nbytes * expert_share);
        } else if (gguf_str_eq(t->name, "token_embd.weight")) {
            s->active_params += t->ne[0];
            s->bytes_per_token += has_head ? t->nbytes / t->ne[1] : t->nbytes;
        } else {
            s->active_params += n;
            s->bytes_per_token += t->nbytes;
        }
    }
}

static void read_shape(const gguf_file *f, model_shape *s) {
    memset(s, 0, sizeof *s);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, NULL) == MOE_OK)
        snprintf(s->arch, sizeof s->arch, "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.data);
    const char *a = s->arch;
    s->n_layers = arch_u32(f, a, "block_count");
    s->n_embd = arch_u32(f, a, "embedding_length");
    s->n_heads = arch_u32(f, a, "attention.head_count");
    s->n_kv_heads = arch_u32(f, a, "attention.head_count_kv");
    s->head_dim = arch_u32(f, a, "attention.key_length");
    if (!s->head_dim && s->n_heads) s->head_dim = s->n_embd / s->n_heads;
    if (!s->n_kv_heads) s->n_kv_heads = s->n_heads;
    s->n_ff = arch_u32(f, a, "feed_forward_length");
    s->n_ff_expert = arch_u32(f, a, "expert_feed_forward_length");
    s->n_experts = arch_u32(f, a, "expert_count");
    s->n_experts_used = arch_u32(f, a, "expert_used_count");
    s->n_ctx = arch_u32(f, a, "context_length");
    const gguf_array *tokens;
    const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    if (gguf_get_array(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens, NULL) == MOE_OK) s->vocab = tokens->n;
    else if (embd && embd->n_dims == 2) s->vocab = embd->ne[1];
    count_weights(f, s);
}

/* 30.5 B, 22.2 M, 512 K: parameters at a readable scale. */
static const char *count_text(double n, char *buf, size_t size) {
    if (n >= 1e9) snprintf(buf, size, "%.3f B", n / 1e9);
    else if (n >= 1e6) snprintf(buf, size, "%.2f M", n / 1e6);
    else snprintf(buf, size, "%.1f K", n / 1e3);
    return buf;
}

static void print_summary(const model_shape *s) {
    if (!s->arch[0]) {
        printf("No general.architecture key: not a model file, or one written without it.\n");
        return;
    }
    printf("%s: %u layers, hidden size %u, %u query heads and %u key/value heads of dimension %u", s->arch,
           s->n_layers, s->n_embd, s->n_heads, s->n_kv_heads, s->head_dim);
    if (s->n_experts)
        printf(", a mixture of %u experts with %u active per token (expert FFN width %u)", s->n_experts,
               s->n_experts_used, s->n_ff_expert ? s->n_ff_expert : s->n_ff);
    else if (s->n_ff)
        printf(", a dense FFN of width %u", s->n_ff);
    char total[32], active[32];
    printf(", context %u, vocabulary %" PRIu64 ". %s parameters (%s active per token), "
           "%.3f GB of weights; a decoded token reads %.3f GB of them.\n",
           s->n_ctx, s->vocab, count_text((double)s->params, total, sizeof total),
           count_text((double)s->active_params, active, sizeof active), s->bytes / 1e9, s->bytes_per_token / 1e9);
}

/* ------------------------------------------------------------ text output */

static void print_str(gguf_str s, size_t limit) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < limit; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    printf(s.len > limit ? "\"..." : "\"");
}

static void print_value(const gguf_value *v, bool full);

static void print_array(const gguf_array *a, bool full) {
    uint64_t shown = full || a->n <= ARRAY_PREVIEW ? a->n : ARRAY_PREVIEW;
    putchar('[');
    for (uint64_t i = 0; i < shown; i++) {
        if (i) printf(", ");
        if (a->type == GGUF_TYPE_STRING) print_str(gguf_array_get_str(a, i), full ? SIZE_MAX : 60);
        else if (a->type == GGUF_TYPE_ARRAY) print_value(&a->items[i], full);
        else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64) printf("%g", gguf_array_get_f64(a, i));
        else if (a->type == GGUF_TYPE_INT8 || a->type == GGUF_TYPE_INT16 || a->type == GGUF_TYPE_INT32 ||
                 a->type == GGUF_TYPE_INT64)
            printf("%" PRId64, gguf_array_get_i64(a, i));
        else if (a->type == GGUF_TYPE_BOOL) printf(gguf_array_get_u64(a, i) ? "true" : "false");
        else printf("%" PRIu64, gguf_array_get_u64(a, i));
    }
    if (shown < a->n) printf(", ... %" PRIu64 " more", a->n - shown);
    putchar(']');
}

static void print_value(const gguf_value *v, bool full) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        printf("%" PRIu64, v->u64); break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        printf("%" PRId64, v->i64); break;
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: printf("%g", v->f64); break;
    case GGUF_TYPE_BOOL: printf(v->u64 ? "true" : "false"); break;
    case GGUF_TYPE_STRING: print_str(v->str, full ? SIZE_MAX : 200); break;
    case GGUF_TYPE_ARRAY: print_array(&v->arr, full); break;
    default: printf("?"); break;
    }
}

static void type_label(const gguf_value *v, char *buf, size_t n) {
    if (v->type == GGUF_TYPE_ARRAY)
        snprintf(buf, n, "%s[%" PRIu64 "]", gguf_value_type_name(v->arr.type), v->arr.n);
    else
        snprintf(buf, n, "%s", gguf_value_type_name(v->type));
}

static void shape_text(const gguf_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    for (uint32_t d = 0; d < t->n_dims && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, d ? " x %" PRIu64 : "%" PRIu64, t->ne[d]);
}

static void print_text(const char *path, const gguf_file *f, const model_shape *s, bool full) {
    printf("%s: GGUF v%u, %" PRIu64 " bytes, %" PRIu64 " keys, %" PRIu64 " tensors, alignment %" PRIu64
           ", data at %" PRIu64 "\n\n", path, f->version, f->size, f->n_kv, f->n_tensors, f->alignment, f->data_offset);
    print_summary(s);
    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        char label[48];
        type_label(&f->kv[i].value, label, sizeof label);
        printf("  %-44.*s %-14s ", (int)f->kv[i].key.len, f->kv[i].key.data, label);
        print_value(&f->kv[i].value, full);
        putchar('\n');
    }
    printf("\ntensors:\n  %-40s %-7s %-26s %14s %14s\n", "name", "type", "shape", "bytes", "offset");
    uint64_t count[MOE_TYPE_COUNT] = {0}, bytes[MOE_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char shape[96];
        shape_text(t, shape, sizeof shape);
        printf("  %-40.*s %-7s %-26s %14" PRIu64 " %14" PRIu64 "\n", (int)t->name.len, t->name.data,
               quant_format_of(t->type)->name, shape, t->nbytes, t->offset);
        count[t->type]++;
        bytes[t->type] += t->nbytes;
    }
    printf("\ntotals by type:\n");
    for (int t = 0; t < MOE_TYPE_COUNT; t++)
        if (count[t])
            printf("  %-7s %6" PRIu64 " tensors %16" PRIu64 " bytes %6.2f%%\n", quant_format_of((uint32_t)t)->name,
                   count[t], bytes[t], s->bytes ? 100.0 * bytes[t] / s->bytes : 0.0);
}

/* ------------------------------------------------------------ JSON output */

static json_t *json_of_str(gguf_str s) { return json_stringn_nocheck(s.data, s.len); }

static json_t *json_of_value(const gguf_value *v, bool full);

static json_t *json_of_array(const gguf_array *a, bool full) {
    uint64_t shown = full || a->n <= ARRAY_PREVIEW ? a->n : ARRAY_PREVIEW;
    json_t *items = json_array();
    for (uint64_t i = 0; i < shown; i++) {
        json_t *item;
        if (a->type == GGUF_TYPE_STRING) item = json_of_str(gguf_array_get_str(a, i));
        else if (a->type == GGUF_TYPE_ARRAY) item = json_of_value(&a->items[i], full);
        else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64) item = json_real(gguf_array_get_f64(a, i));
        else if (a->type == GGUF_TYPE_BOOL) item = json_boolean(gguf_array_get_u64(a, i));
        else if (a->type == GGUF_TYPE_UINT64) item = json_integer((json_int_t)gguf_array_get_u64(a, i));
        else item = json_integer(gguf_array_get_i64(a, i));
        json_array_append_new(items, item);
    }
    if (shown == a->n) return items;
    return json_pack("{s:s, s:I, s:o}", "element_type", gguf_value_type_name(a->type), "count", (json_int_t)a->n,
                     "first", items);
}

static json_t *json_of_value(const gguf_value *v, bool full) {
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        return json_integer((json_int_t)v->u64);
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return json_integer(v->i64);
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: return json_real(v->f64);
    case GGUF_TYPE_BOOL: return json_boolean(v->u64);
    case GGUF_TYPE_STRING: return json_of_str(v->str);
    case GGUF_TYPE_ARRAY: return json_of_array(&v->arr, full);
    default: return json_null();
    }
}

static json_t *json_of_tensor(const gguf_tensor *t) {
    json_t *shape = json_array();
    for (uint32_t d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer((json_int_t)t->ne[d]));
    return json_pack("{s:o, s:s, s:o, s:I, s:I}", "name", json_of_str(t->name), "type",
                     quant_format_of(t->type)->name, "shape", shape, "bytes", (json_int_t)t->nbytes, "offset",
                     (json_int_t)t->offset);
}

static json_t *json_of_shape(const model_shape *s) {
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I}",
                     "architecture", s->arch, "layers", s->n_layers, "hidden", s->n_embd, "heads", s->n_heads,
                     "kv_heads", s->n_kv_heads, "head_dim", s->head_dim, "ffn", s->n_ff, "expert_ffn",
                     s->n_ff_expert, "experts", s->n_experts, "experts_used", s->n_experts_used, "context", s->n_ctx,
                     "vocab", (json_int_t)s->vocab, "params", (json_int_t)s->params, "active_params",
                     (json_int_t)s->active_params, "weight_bytes", (json_int_t)s->bytes, "bytes_per_token",
                     (json_int_t)s->bytes_per_token);
}

static int print_json(const char *path, const gguf_file *f, const model_shape *s, bool full) {
    json_t *metadata = json_object(), *tensors = json_array(), *totals = json_object();
    for (uint64_t i = 0; i < f->n_kv; i++) {
        char key[1024];
        snprintf(key, sizeof key, "%.*s", (int)f->kv[i].key.len, f->kv[i].key.data);
        json_object_set_new(metadata, key, json_of_value(&f->kv[i].value, full));
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const char *type = quant_format_of(t->type)->name;
        json_array_append_new(tensors, json_of_tensor(t));
        json_t *total = json_object_get(totals, type);
        if (!total) json_object_set_new(totals, type, total = json_pack("{s:I, s:I}", "tensors", 0, "bytes", 0));
        json_object_set_new(total, "tensors", json_integer(json_integer_value(json_object_get(total, "tensors")) + 1));
        json_object_set_new(total, "bytes", json_integer(json_integer_value(json_object_get(total, "bytes")) +
                                                         (json_int_t)t->nbytes));
    }
    json_t *root = json_pack("{s:s, s:I, s:i, s:I, s:I, s:o, s:o, s:o, s:o}", "path", path, "size",
                             (json_int_t)f->size, "version", f->version, "alignment", (json_int_t)f->alignment,
                             "data_offset", (json_int_t)f->data_offset, "model", json_of_shape(s), "metadata",
                             metadata, "tensors", tensors, "totals", totals);
    if (!root) {
        fprintf(stderr, "moe inspect: cannot build the JSON document\n");
        return 1;
    }
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    putchar('\n');
    json_decref(root);
    return 0;
}

/* ------------------------------------------------------------ command */

static void print_help(void) {
    printf("usage: moe inspect [options] FILE.gguf\n\n"
           "Show a GGUF file: a summary of the architecture (shape, parameters, the\n"
           "weight bytes a decoded token reads), the metadata (long arrays abbreviated),\n"
           "the tensor table (name, type, shape, bytes, offset) and totals by type.\n"
           "The file is validated first; a malformed file is one error, exit status 1.\n\n"
           "options:\n"
           "  --json      one JSON object instead of text\n"
           "  --full      print arrays and strings in full\n"
           "  -h, --help  this text\n");
}

int cmd_inspect(int argc, char **argv) {
    static const struct option long_options[] = {
        {"json", no_argument, NULL, 'j'},
        {"full", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false, full = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'f': full = true; break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("inspect", "unknown option");
        }
    }
    if (argc - optind != 1) return cli_usage_error("inspect", "expected one FILE, got %d arguments", argc - optind);
    const char *path = argv[optind];
    gguf_file *f;
    moe_error err = {0};
    if (gguf_open(path, &f, &err) != MOE_OK) return cli_fail("inspect", &err);
    model_shape shape;
    read_shape(f, &shape);
    int status = 0;
    if (json) status = print_json(path, f, &shape, full);
    else print_text(path, f, &shape, full);
    gguf_close(f);
    return status;
}
