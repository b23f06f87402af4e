/*
 * cmd_bench.c — `moe bench`: prompt processing and generation speed, each
 * beside its ceiling, shaped like llama-bench's table.
 *
 *   pp<P>  P prompt tokens from an empty context (on the GPU in batches
 *          through cuBLAS, src/cuda/prefill.cu, unless MOE_CUDA_PREFILL=0);
 *   tg<N>  N tokens generated greedily from an empty context; on the GPU
 *          the step's argmax feeds the next step on the device, so the
 *          figure is the engine's, with no host in the loop. With -d D
 *          (`tg<N> @ d<D>`, as llama-bench names it) the first D positions
 *          of the KV cache are filled first (once, by the prefill, untimed)
 *          and the N tokens are generated at positions D..D+N-1.
 *
 * Every figure is the median of -r repetitions after a warm-up, with the
 * spread (min..max); GPU times come from CUDA events. Beside decode: the
 * bytes a token reads (MEASURING.md: attention and norms, the router, the
 * k routed experts plus the shared one, the output head, one embedding
 * row, plus the KV cache read, averaged over the N positions), the GB/s
 * that makes, and that as a fraction of the read bandwidth this run
 * measured itself (a 16-byte-load read kernel over --bw-gib GiB, median of
 * 10 after warm-up). On the CPU no ceiling is measured, and the table says
 * so. Inputs are random token ids, never zeros.
 *
 * GPU memory: the device's bytes in use (cudaMemGetInfo, so device-wide)
 * are read before the upload and after every phase; the peak above the
 * first reading is reported beside the weights and the largest state (KV
 * cache and activations) the run made, and as a percentage of their sum:
 * what the runtime, graphs and libraries add on top.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/clock.h"
#include "common/median.h"
#include "cpu/cpu.h"
#include "cuda/cuda_backend.h"
#include "model/model.h"

enum { MAX_REPS = 100 };

typedef struct bench_args {
    const char *path;
    int p, n, depth, reps, threads; /* depth: KV positions filled before tg */
    bool json;
    moe_device device;
    double bw_gib;
    int profile_pos, profile_reps; /* --profile: stage table at this position; 0 reps: off */
    moe_kv_type kv_type;
} bench_args;

typedef struct stat3 {
    double median, min, max;
} stat3;

static stat3 stats(double *v, int n) {
    const double median = median_sort(v, n);
    stat3 s = {median, v[0], v[n - 1]};
    return s;
}

/* ------------------------------------------------------------ what a token reads */

static double matrix_bytes(const matrix *w) { return w->data ? (double)w->rows * w->row_bytes : 0; }
static double vec_bytes(const vec *v) { return v->data ? (double)v->n * 4 : 0; }
static double expert_bytes(const expert_set *e) { return (double)e->rows * e->row_bytes; }

typedef struct token_bytes {
    double attention, router, experts, head, embedding; /* weights a decoded token reads */
    double kv_per_position;                             /* KV cache bytes per cached position */
    double weights_total, params_total, params_active;
} token_bytes;

static token_bytes count_bytes(const model *m, moe_kv_type kv_type) {
    const model_config *c = &m->config;
    token_bytes b = {0};
    int k = c->n_experts ? c->n_experts_used : 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        double attn = matrix_bytes(&w->wq) + matrix_bytes(&w->wk) + matrix_bytes(&w->wv) + matrix_bytes(&w->wo) +
                      vec_bytes(&w->attn_norm) + vec_bytes(&w->ffn_norm) + vec_bytes(&w->bq) + vec_bytes(&w->bk) +
                      vec_bytes(&w->bv) + vec_bytes(&w->q_norm) + vec_bytes(&w->k_norm);
        b.attention += attn;
        b.params_active += (double)(w->wq.rows + w->wk.rows + w->wv.rows) * w->wq.cols + (double)w->wo.rows * w->wo.cols;
        if (c->n_experts) {
            double one = expert_bytes(&w->exp_gate) + expert_bytes(&w->exp_up) + expert_bytes(&w->exp_down);
            double shared = matrix_bytes(&w->sh_gate) + matrix_bytes(&w->sh_up) + matrix_bytes(&w->sh_down) +
                            vec_bytes(&w->sh_gate_inp);
            b.router += matrix_bytes(&w->router);
            b.experts += k * one + shared;
            b.weights_total += attn + matrix_bytes(&w->router) + c->n_experts * one + shared;
            double p_one = 3.0 * w->exp_gate.rows * w->exp_gate.cols;
            double p_sh = w->sh_gate.data ? 3.0 * w->sh_gate.rows * w->sh_gate.cols : 0;
            b.params_active += k * p_one + p_sh + (double)w->router.rows * w->router.cols;
            b.params_total += c->n_experts * p_one + p_sh + (double)w->router.rows * w->router.cols;
        } else {
            double ffn = matrix_bytes(&w->ffn_gate) + matrix_bytes(&w->ffn_up) + matrix_bytes(&w->ffn_down);
            b.experts += ffn;
            b.weights_total += attn + ffn;
            double p = 3.0 * w->ffn_gate.rows * w->ffn_gate.cols;
            b.params_active += p;
            b.params_total += p;
        }
        b.params_total += (double)(w->wq.rows + w->wk.rows + w->wv.rows) * w->wq.cols + (double)w->wo.rows * w->wo.cols;
    }
    b.head = matrix_bytes(&m->output) + vec_bytes(&m->output_norm);
    b.embedding = (double)m->token_embd.row_bytes;
    b.weights_total += matrix_bytes(&m->token_embd) + (c->tied_embeddings ? 0 : matrix_bytes(&m->output));
    double p_embd = (double)m->token_embd.rows * m->token_embd.cols;
    b.params_total += p_embd * (c->tied_embeddings ? 1 : 2);
    b.params_active += p_embd;
    b.kv_per_position = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * (kv_type == MOE_KV_F16 ? 2 : 4);
    return b;
}

/* Bytes of one decoded token at position t (it reads t + 1 cached positions). */
static double bytes_at(const token_bytes *b, int t) {
    return b->attention + b->router + b->experts + b->head + b->embedding + b->kv_per_position * (t + 1);
}

/* ------------------------------------------------------------ results */

typedef struct row {
    char test[32], variant[40];
    stat3 tps;           /* tokens per second */
    double bytes;        /* per token, decode only */
} row;

typedef struct report {
    char model_name[128], backend[160];
    token_bytes tb;
    double ceiling_gbps;  /* 0: not measured */
    stat3 ceiling;
    double bw_gib;
    double weights_gb, state_gb, device_used_gb; /* state_gb: the largest state */
    double base_used_gb, peak_gb;                /* in use before the upload; the most in use above it */
    double upload_s;
    row rows[8];
    int n_rows;
    char note[256];
#ifdef MOE_HAVE_CUDA
    cuda_stage_profile prof;
    cuda_timeline timeline;     /* of the middle layer, beside the profile */
    cuda_prefill_profile pf;    /* the prompt's phases, beside the profile */
    bool have_prof, have_pf;
#endif
} report;

#ifdef MOE_HAVE_CUDA
/* Where a decode step's time goes: per stage, summed over the layers. */
static void print_profile(const report *r) {
    const cuda_stage_profile *p = &r->prof;
    double bytes = 0;
    for (int k = 0; k < p->n_stages; k++) bytes += p->bytes[k];
    printf("\n### decode step by stage (no graph, an event after every stage; position %d, median of %d)\n\n", p->pos,
           p->reps);
    printf("| stage | launches | us/token | share | MB read | GB/s | of read BW | us/launch | in graph us/token | in "
           "graph us/launch |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int k = 0; k < p->n_stages; k++) {
        if (!p->launches[k]) continue;
        double gbps = p->us[k] > 0 ? p->bytes[k] / (p->us[k] * 1e-6) / 1e9 : 0;
        printf("| %s | %d | %.1f | %.1f%% | %.2f | %.0f | %.1f%% | %.2f | %.1f | %.2f |\n", p->names[k], p->launches[k],
               p->us[k], 100.0 * p->us[k] / p->total_us, p->bytes[k] / 1e6, gbps,
               r->ceiling_gbps > 0 ? 100.0 * gbps / r->ceiling_gbps : 0.0, p->us[k] / p->launches[k], p->graph_us[k],
               p->graph_us[k] / p->launches[k]);
    }
    double gbps = bytes / (p->total_us * 1e-6) / 1e9;
    printf("| **step** | | %.1f | 100%% | %.2f | %.0f | %.1f%% | | %.1f | |\n", p->total_us, bytes / 1e6, gbps,
           r->ceiling_gbps > 0 ? 100.0 * gbps / r->ceiling_gbps : 0.0, p->graph_total_us);
    double ideal = r->ceiling_gbps > 0 ? bytes / (r->ceiling_gbps * 1e9) * 1e6 : 0;
    printf("\nAt the measured read bandwidth the step's bytes take %.1f us; stages' times include the launch gap "
           "before each (no graph, no PDL). In graph: the step replayed as a CUDA graph with PDL (%d positions from %d, "
           "after an untimed step that captures it) less the same with the stage left out, medians of %d.\n",
           ideal, CUDA_PROFILE_SPAN, p->pos, p->graph_reps);
}

/* Where the batched prefill's time goes, phase by phase. */
static void print_prefill_profile(const report *r) {
    const cuda_prefill_profile *p = &r->pf;
    printf("\n### batched prefill by phase (%d tokens, the stream synchronised after every phase of every layer)\n\n",
           p->tokens);
    printf("| phase | ms | share | GEMM calls |\n| --- | ---: | ---: | ---: |\n");
    for (int k = 0; k < CUDA_PF_COUNT; k++)
        if (p->ms[k] > 0)
            printf("| %s | %.2f | %.1f%% | %d |\n", p->names[k], p->ms[k], 100.0 * p->ms[k] / p->total_ms, p->calls[k]);
    printf("| **prompt** | %.2f | 100%% | |\n\nEach phase's wall time from the end of the one before, the host's "
           "submission of its launches and calls included; the synchronisations make the whole slower than pp%d.\n",
           p->total_ms, p->tokens);
}

/* One layer's launches inside the graph, from the GPU timer's marks. */
static void print_timeline(const report *r) {
    const cuda_timeline *t = &r->timeline;
    printf("\n### layer %d inside the graph (position %d, median of %d replays; us from the first return of the "
           "layer's first wait)\n\n",
           t->layer, t->pos, t->reps);
    printf("| stage | blocks | first start | last start | waits return | input staged (median, last) | work done "
           "(median, last) | done |\n");
    printf("| --- | ---: | ---: | ---: | --- | --- | --- | ---: |\n");
    for (int i = 0; i < t->n; i++) {
        const cuda_timeline_stage *g = &t->stages[i];
        printf("| %s | %d | %.2f | %.2f | %.2f .. %.2f | %.2f, %.2f | %.2f, %.2f | %.2f |\n", r->prof.names[g->stage],
               g->blocks, g->entry_first, g->entry_last, g->waited_first, g->waited_last, g->staged_median,
               g->staged_last, g->worked_median, g->worked_last, g->done);
    }
    printf("\nMarks by thread 0 of each block (work done: after a block barrier in the matrix products, thread 0's "
           "own in the attention and the router; input staged for gate/up: routed, its input staged before the wait); "
           "done: the last block's work or epilogue (the attention's merge). Timer steps of %.0f ns seen.\n",
           t->resolution_ns);
}
#endif

static void print_markdown(const report *r, const bench_args *a) {
    printf("| model | size | params | backend | test | t/s | spread | ms/token | GB/token | GB/s | of read BW |\n");
    printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < r->n_rows; i++) {
        const row *w = &r->rows[i];
        printf("| %s | %.2f GB | %.2f B (%.2f B active) | %s | %s%s%s | %.1f | %.1f..%.1f | %.3f |", r->model_name,
               r->tb.weights_total / 1e9, r->tb.params_total / 1e9, r->tb.params_active / 1e9, r->backend, w->test,
               w->variant[0] ? " " : "", w->variant, w->tps.median, w->tps.min, w->tps.max, 1e3 / w->tps.median);
        if (w->bytes > 0) {
            double gbps = w->bytes * w->tps.median / 1e9;
            printf(" %.3f | %.0f |", w->bytes / 1e9, gbps);
            if (r->ceiling_gbps > 0) printf(" %.1f%% |\n", 100.0 * gbps / r->ceiling_gbps);
            else printf(" n/a |\n");
        } else {
            printf(" | | |\n");
        }
    }
    printf("\n");
    if (r->ceiling_gbps > 0)
        printf("Read bandwidth (ceiling): %.0f GB/s, median of 10 runs of a 16-byte-load read kernel over %.1f GiB "
               "(spread %.0f..%.0f).\n",
               r->ceiling_gbps, r->bw_gib, r->ceiling.min, r->ceiling.max);
    else
        printf("Read bandwidth: not measured on the CPU; the GB/s column is what decode reads.\n");
    printf("A decoded token reads %.3f GB of weights: attention and norms %.1f MB, router %.1f MB, experts %.1f MB, "
           "head %.1f MB; plus %.1f KB of KV cache per cached position.\n",
           (bytes_at(&r->tb, -1)) / 1e9, r->tb.attention / 1e6, r->tb.router / 1e6, r->tb.experts / 1e6,
           r->tb.head / 1e6, r->tb.kv_per_position / 1e3);
    if (r->weights_gb > 0)
        printf("GPU memory: weights %.2f GB, KV cache and activations %.2f GB; the device had %.2f GB in use at the "
               "end (upload %.1f s). Peak %.2f GB in use above the %.2f GB before the upload: %.1f%% of weights + KV "
               "cache + activations.\n",
               r->weights_gb, r->state_gb, r->device_used_gb, r->upload_s, r->peak_gb, r->base_used_gb,
               100.0 * r->peak_gb / (r->weights_gb + r->state_gb));
    printf("Repetitions: %d after a warm-up; t/s is the median, spread min..max.%s%s\n", a->reps, r->note[0] ? " " : "",
           r->note);
}

static void print_json(const report *r, const bench_args *a) {
    printf("{\"model\": \"%s\", \"backend\": \"%s\", \"weights_bytes\": %.0f, \"params\": %.0f, \"params_active\": %.0f,\n",
           r->model_name, r->backend, r->tb.weights_total, r->tb.params_total, r->tb.params_active);
    if (r->ceiling_gbps > 0)
        printf(" \"read_bandwidth_gbps\": %.1f, \"read_bandwidth_min\": %.1f, \"read_bandwidth_max\": %.1f,\n",
               r->ceiling_gbps, r->ceiling.min, r->ceiling.max);
    else
        printf(" \"read_bandwidth_gbps\": null,\n");
    printf(" \"bandwidth_buffer_gib\": %.1f, \"repetitions\": %d,\n", r->bw_gib, a->reps);
    printf(" \"gpu_weights_gb\": %.3f, \"gpu_state_gb\": %.3f, \"gpu_used_gb\": %.3f,\n", r->weights_gb, r->state_gb,
           r->device_used_gb);
    printf(" \"gpu_base_used_gb\": %.3f, \"gpu_peak_gb\": %.3f, \"gpu_peak_fraction\": %.4f, \"depth\": %d,\n \"tests\": [\n",
           r->base_used_gb, r->peak_gb,
           r->weights_gb + r->state_gb > 0 ? r->peak_gb / (r->weights_gb + r->state_gb) : 0.0, a->depth);
    for (int i = 0; i < r->n_rows; i++) {
        const row *w = &r->rows[i];
        double gbps = w->bytes * w->tps.median / 1e9;
        printf("  {\"test\": \"%s\", \"variant\": \"%s\", \"tps_median\": %.3f, \"tps_min\": %.3f, \"tps_max\": %.3f", w->test,
               w->variant, w->tps.median, w->tps.min, w->tps.max);
        if (w->bytes > 0)
            printf(", \"bytes_per_token\": %.0f, \"gbps\": %.1f, \"fraction_of_read_bw\": %.4f", w->bytes, gbps,
                   r->ceiling_gbps > 0 ? gbps / r->ceiling_gbps : 0.0);
        printf("}%s\n", i + 1 < r->n_rows ? "," : "");
    }
    printf(" ]}\n");
}

/* ------------------------------------------------------------ runs */

static void random_tokens(int32_t *ids, int n, int vocab, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
}

static double mean_decode_bytes(const token_bytes *tb, int first, int n) {
    double sum = 0;
    for (int t = first; t < first + n; t++) sum += bytes_at(tb, t);
    return sum / n;
}

static void add_row(report *r, const char *test, const char *variant, double *tps, int reps, double bytes) {
    row *w = &r->rows[r->n_rows++];
    snprintf(w->test, sizeof w->test, "%s", test);
    snprintf(w->variant, sizeof w->variant, "%s", variant);
    w->tps = stats(tps, reps);
    w->bytes = bytes;
}

/* The tg test name: tgN, or tgN @ dD after a filled cache. */
static void tg_name(const bench_args *a, char *out, size_t len) {
    if (a->depth > 0) snprintf(out, len, "tg%d @ d%d", a->n, a->depth);
    else snprintf(out, len, "tg%d", a->n);
}

#ifdef MOE_HAVE_CUDA
/* The device's bytes in use now: the largest seen, and the peak above the
 * reading before the upload. */
static void note_memory(report *r) {
    moe_error err = {0};
    size_t used = 0, total = 0;
    if (cuda_memory_info(&used, &total, &err) != MOE_OK) return;
    if (used / 1e9 > r->device_used_gb) r->device_used_gb = used / 1e9;
    if (used / 1e9 - r->base_used_gb > r->peak_gb) r->peak_gb = used / 1e9 - r->base_used_gb;
}

static void note_state(report *r, const cuda_state *s) {
    if (cuda_state_bytes(s) / 1e9 > r->state_gb) r->state_gb = cuda_state_bytes(s) / 1e9;
    note_memory(r);
}

/* "CUDA (NVIDIA H200)" becomes "CUDA (NVIDIA H200, note)". */
static void append_backend_note(report *r, const char *note) {
    size_t n = strlen(r->backend);
    if (n > 0 && r->backend[n - 1] == ')') snprintf(r->backend + n - 1, sizeof r->backend - (n - 1), ", %s)", note);
}

/* Prompt processing: the prompt at positions 0.., reps times after a warm-up. */
static int bench_cuda_pp(cuda_state *s, const bench_args *a, report *r, const int32_t *prompt) {
    moe_error err = {0};
    double tps[MAX_REPS];
    float ms = 0;
    for (int i = -1; i < a->reps; i++) {
        if (cuda_prefill_timed(s, prompt, a->p, &ms, &err) != MOE_OK) return cli_fail("bench", &err);
        if (i >= 0) tps[i] = a->p / (ms * 1e-3);
        note_memory(r);
    }
    char test[32];
    snprintf(test, sizeof test, "pp%d", a->p);
    add_row(r, test, cuda_prefill_batched(s, a->p) ? "(batched, bf16 GEMMs)" : "(token by token)", tps, a->reps, 0);
    if (a->profile_reps > 0 && cuda_prefill_batched(s, a->p)) {
        if (cuda_prefill_profile_run(s, prompt, a->p, &r->pf, &err) != MOE_OK) return cli_fail("bench", &err);
        r->have_pf = true;
    }
    return 0;
}

/* Generation at positions depth.., the cache below filled once first. */
static int bench_cuda_tg(cuda_state *s, const bench_args *a, report *r, const int32_t *prompt, const char *variant,
                         bool first) {
    moe_error err = {0};
    double tps[MAX_REPS];
    float ms = 0;
    if (a->depth > 0 && cuda_prefill_timed(s, prompt, a->depth, &ms, &err) != MOE_OK) return cli_fail("bench", &err);
    int32_t *out = malloc((size_t)a->n * sizeof *out);
    if (!out) return cli_fail("bench", &(moe_error){MOE_ERR_NOMEM, "out of memory"});
    int status = 0;
    for (int i = -1; i < a->reps && status == 0; i++) {
        if (cuda_decode_greedy(s, prompt[0], a->depth, a->n, out, &ms, &err) != MOE_OK) status = cli_fail("bench", &err);
        else if (i >= 0) tps[i] = a->n / (ms * 1e-3);
    }
    note_memory(r);
    if (status == 0) {
        char test[32];
        tg_name(a, test, sizeof test);
        add_row(r, test, variant, tps, a->reps, mean_decode_bytes(&r->tb, a->depth, a->n));
        int distinct = 0; /* the greedy text is not one token repeated: the step really ran */
        for (int i = 1; i < a->n; i++) distinct += out[i] != out[0];
        if (first)
            snprintf(r->note, sizeof r->note, "Greedy tokens of the last tg run: %d %d %d %d ... (%d of %d differ from the first).",
                     out[0], a->n > 1 ? out[1] : -1, a->n > 2 ? out[2] : -1, a->n > 3 ? out[3] : -1, distinct, a->n);
    }
    free(out);
    return status;
}

/* The environment's options (MOE_CUDA_*) with graph and PDL set, and the cache's type. */
static cuda_options options_with(const bench_args *a, bool graph, bool pdl) {
    cuda_options o = cuda_default_options();
    o.graph = graph;
    o.pdl = pdl;
    o.kv_f16 = a->kv_type == MOE_KV_F16;
    return o;
}

/* The stage profile at a filled cache (--profile). */
static int bench_cuda_profile(cuda_model *g, const bench_args *a, report *r, const int32_t *prompt) {
    moe_error err = {0};
    cuda_options o = options_with(a, false, false);
    cuda_state *s = NULL;
    int status = 0;
    if (cuda_state_new(g, a->profile_pos + CUDA_PROFILE_SPAN, &o, &s, &err) != MOE_OK) return cli_fail("bench", &err);
    note_state(r, s);
    if ((a->profile_pos > 0 && cuda_decode_greedy(s, prompt[0], 0, a->profile_pos, NULL, NULL, &err) != MOE_OK) ||
        cuda_profile_step(s, prompt[0], a->profile_pos, a->profile_reps, &r->prof, &err) != MOE_OK)
        status = cli_fail("bench", &err);
    else
        r->have_prof = true;
    note_memory(r);
    cuda_state_free(s);
    return status;
}

/* The middle layer's timeline inside the graph, with the default options
 * (graph and PDL), at the profile's position. */
static int bench_cuda_timeline(cuda_model *g, const model *m, const bench_args *a, report *r, const int32_t *prompt) {
    moe_error err = {0};
    cuda_options o = options_with(a, true, true);
    cuda_state *s = NULL;
    int status = 0;
    if (cuda_state_new(g, a->profile_pos + 1, &o, &s, &err) != MOE_OK) return cli_fail("bench", &err);
    if ((a->profile_pos > 0 && cuda_decode_greedy(s, prompt[0], 0, a->profile_pos, NULL, NULL, &err) != MOE_OK) ||
        cuda_timeline_layer(s, prompt[0], a->profile_pos, m->config.n_layers / 2, a->profile_reps, &r->timeline,
                            &err) != MOE_OK)
        status = cli_fail("bench", &err);
    cuda_state_free(s);
    return status;
}

static int bench_cuda(const model *m, const bench_args *a, report *r, const int32_t *prompt) {
    moe_error err = {0};
    double gbps[16];
    size_t bw_bytes = (size_t)(a->bw_gib * (double)(1ull << 30));
    if (cuda_read_bandwidth(bw_bytes, 10, gbps, &err) != MOE_OK) return cli_fail("bench", &err);
    r->ceiling = stats(gbps, 10);
    r->ceiling_gbps = r->ceiling.median;
    r->bw_gib = a->bw_gib;
    size_t used = 0, total = 0;
    if (cuda_memory_info(&used, &total, &err) != MOE_OK) return cli_fail("bench", &err);
    r->base_used_gb = used / 1e9;
    cuda_model *g = NULL;
    double t0 = monotonic_seconds();
    if (cuda_model_new(m, &g, &err) != MOE_OK) return cli_fail("bench", &err);
    r->upload_s = monotonic_seconds() - t0;
    snprintf(r->backend, sizeof r->backend, "CUDA (%s)", cuda_model_device_name(g));
    if (a->kv_type == MOE_KV_F16) append_backend_note(r, "f16 KV");
    r->weights_gb = cuda_model_bytes(g) / 1e9;
    note_memory(r);
    const int n_ctx = (a->p > a->depth + a->n ? a->p : a->depth + a->n) + 8;
    const struct {
        const char *name;
        cuda_options o;
    } variants[] = {{"(graph+PDL)", options_with(a, true, true)},
                    {"(graph)", options_with(a, true, false)},
                    {"(no graph)", options_with(a, false, false)}};
    int status = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0] && status == 0; v++) {
        cuda_state *s = NULL;
        if (cuda_state_new(g, n_ctx, &variants[v].o, &s, &err) != MOE_OK) {
            status = cli_fail("bench", &err);
            break;
        }
        note_state(r, s);
        if (v == 0 && cuda_state_one_launch_ffn(s)) append_backend_note(r, "one-launch FFN");
        if (v == 0 && a->p > 0) status = bench_cuda_pp(s, a, r, prompt); /* default variant only: 3 would triple the run */
        if (status == 0 && a->n > 0) status = bench_cuda_tg(s, a, r, prompt, variants[v].name, v == 0);
        cuda_state_free(s);
    }
    if (status == 0 && a->profile_reps > 0) status = bench_cuda_profile(g, a, r, prompt);
    if (status == 0 && a->profile_reps > 0) status = bench_cuda_timeline(g, m, a, r, prompt);
    cuda_model_free(g);
    return status;
}
#endif

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy generation of n tokens at positions from..; tokens per second. */
static moe_status cpu_generate(cpu_state *s, int32_t tok, int from, int n, int vocab, float *logits, double *tps,
                               moe_error *err) {
    double t0 = monotonic_seconds();
    for (int t = from; t < from + n; t++) {
        moe_status st = cpu_forward(s, &tok, 1, t, logits, false, err);
        if (st != MOE_OK) return st;
        tok = argmax(logits, vocab);
    }
    *tps = n / (monotonic_seconds() - t0);
    return MOE_OK;
}

static int bench_cpu(const model *m, const bench_args *a, report *r, const int32_t *prompt) {
    moe_error err = {0};
    const int n_ctx = (a->p > a->depth + a->n ? a->p : a->depth + a->n) + 8, vocab = m->config.n_vocab;
    int batch = a->depth < 512 ? a->depth : 512; /* the depth fill's batch, unless the prompt's is larger */
    if (a->p > batch) batch = a->p;
    cpu_state *s = NULL;
    cpu_state_params p = {
        .n_ctx = n_ctx, .max_batch = batch > 0 ? batch : 1, .n_threads = a->threads, .kv_type = a->kv_type};
    if (cpu_state_new(m, &p, &s, &err) != MOE_OK) return cli_fail("bench", &err);
    snprintf(r->backend, sizeof r->backend, a->kv_type == MOE_KV_F16 ? "CPU (f16 KV)" : "CPU");
    float *logits = malloc((size_t)vocab * sizeof *logits);
    double tps[MAX_REPS];
    int status = logits ? 0 : cli_fail("bench", &(moe_error){MOE_ERR_NOMEM, "out of memory"});
    if (status == 0 && a->p > 0) {
        for (int i = -1; i < a->reps && status == 0; i++) {
            double t0 = monotonic_seconds();
            if (cpu_forward(s, prompt, a->p, 0, logits, false, &err) != MOE_OK) status = cli_fail("bench", &err);
            else if (i >= 0) tps[i] = a->p / (monotonic_seconds() - t0);
        }
        char test[32];
        snprintf(test, sizeof test, "pp%d", a->p);
        if (status == 0) add_row(r, test, "", tps, a->reps, 0);
    }
    if (status == 0 && a->n > 0 && a->depth > 0 && cpu_forward(s, prompt, a->depth, 0, NULL, false, &err) != MOE_OK)
        status = cli_fail("bench", &err);
    for (int i = -1; i < a->reps && status == 0 && a->n > 0; i++) {
        double t;
        if (cpu_generate(s, prompt[0], a->depth, a->n, vocab, logits, &t, &err) != MOE_OK) status = cli_fail("bench", &err);
        else if (i >= 0) tps[i] = t;
    }
    if (status == 0 && a->n > 0) {
        char test[32];
        tg_name(a, test, sizeof test);
        add_row(r, test, "", tps, a->reps, mean_decode_bytes(&r->tb, a->depth, a->n));
    }
    free(logits);
    cpu_state_free(s);
    return status;
}

/* ------------------------------------------------------------ the command */

static void print_help(void) {
    printf("usage: moe bench -m FILE [-p 512] [-n 128] [-d 0] [-r 5] [-o md|json] [--device auto|cpu|cuda]\n\n"
           "Prompt processing (ppP) and generation (tgN) speed, llama-bench style, each\n"
           "figure the median of R repetitions after a warm-up with its spread. Decode\n"
           "also shows the bytes a token reads, the GB/s that is, and (on the GPU) that\n"
           "as a fraction of the read bandwidth measured in the same run; on the GPU, the\n"
           "peak device memory beside the weights, KV cache and activations.\n\n"
           "  -m, --model FILE   the GGUF model\n"
           "  -p, --prompt N     prompt tokens (default 512; 0: skip)\n"
           "  -n, --gen N        generated tokens (default 128; 0: skip)\n"
           "  -d, --depth D      fill D positions of the KV cache first, then generate after\n"
           "                     them: tgN @ dD (default 0)\n"
           "  -r, --reps R       repetitions (default 5)\n"
           "  -o, --output F     md (default) or json\n"
           "  --device D         auto (default), cpu or cuda\n"
           "  --threads N        CPU threads (default: all)\n"
           "  --cache-type T     the KV cache's elements: f32 (default) or f16 (half the\n"
           "                     bytes a cached position, counted so in the bytes a token reads)\n"
           "  --bw-gib G         size of the read-bandwidth probe buffer (default 8)\n"
           "  --profile[=POS]    (GPU) also time each stage of a decode step at position POS\n"
           "                     (default 512): launch by launch, an event between stages, and\n"
           "                     inside the CUDA graph, each stage left out in turn; and the\n"
           "                     middle layer's launches block by block inside the graph;\n"
           "                     with -p, the batched prefill's time phase by phase\n"
           "  --profile-reps R   repetitions of the profiled step (default 50)\n");
}

int cmd_bench(int argc, char **argv) {
    bench_args a = {.p = 512, .n = 128, .reps = 5, .device = MOE_DEVICE_AUTO, .bw_gib = 8.0, .profile_pos = 512};
    int profile_reps = 50;
    bool profile = false;
    static const struct option options[] = {
        {"model", required_argument, NULL, 'm'}, {"prompt", required_argument, NULL, 'p'},
        {"gen", required_argument, NULL, 'n'},   {"reps", required_argument, NULL, 'r'},
        {"output", required_argument, NULL, 'o'}, {"device", required_argument, NULL, 'D'},
        {"threads", required_argument, NULL, 't'}, {"bw-gib", required_argument, NULL, 'B'},
        {"profile", optional_argument, NULL, 'P'}, {"profile-reps", required_argument, NULL, 'R'},
        {"depth", required_argument, NULL, 'd'},  {"cache-type", required_argument, NULL, 'K'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    a.path = getenv("MOE_MODEL");
    int c;
    long v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:d:r:o:h", options, NULL)) != -1) {
        switch (c) {
        case 'm': a.path = optarg; break;
        case 'p':
            if (!cli_parse_int(optarg, 0, 1 << 20, &v)) return cli_usage_error("bench", "bad -p '%s'", optarg);
            a.p = (int)v;
            break;
        case 'n':
            if (!cli_parse_int(optarg, 0, 1 << 20, &v)) return cli_usage_error("bench", "bad -n '%s'", optarg);
            a.n = (int)v;
            break;
        case 'd':
            if (!cli_parse_int(optarg, 0, 1 << 20, &v)) return cli_usage_error("bench", "bad -d '%s'", optarg);
            a.depth = (int)v;
            break;
        case 'r':
            if (!cli_parse_int(optarg, 1, MAX_REPS, &v)) return cli_usage_error("bench", "-r wants 1..%d", MAX_REPS);
            a.reps = (int)v;
            break;
        case 'o':
            if (strcmp(optarg, "md") && strcmp(optarg, "json")) return cli_usage_error("bench", "-o wants md or json");
            a.json = strcmp(optarg, "json") == 0;
            break;
        case 'D':
            if (!strcmp(optarg, "cpu")) a.device = MOE_DEVICE_CPU;
            else if (!strcmp(optarg, "cuda")) a.device = MOE_DEVICE_CUDA;
            else if (!strcmp(optarg, "auto")) a.device = MOE_DEVICE_AUTO;
            else return cli_usage_error("bench", "--device wants auto, cpu or cuda");
            break;
        case 't':
            if (!cli_parse_int(optarg, 1, 1024, &v)) return cli_usage_error("bench", "bad --threads '%s'", optarg);
            a.threads = (int)v;
            break;
        case 'B': {
            char *end;
            a.bw_gib = strtod(optarg, &end);
            if (*end || !(a.bw_gib >= 0.0625 && a.bw_gib <= 64)) return cli_usage_error("bench", "--bw-gib wants 0.0625..64");
            break;
        }
        case 'P':
            profile = true;
            if (optarg) {
                if (!cli_parse_int(optarg, 0, 1 << 20, &v)) return cli_usage_error("bench", "bad --profile '%s'", optarg);
                a.profile_pos = (int)v;
            }
            break;
        case 'R':
            if (!cli_parse_int(optarg, 1, 1000, &v)) return cli_usage_error("bench", "--profile-reps wants 1..1000");
            profile_reps = (int)v;
            break;
        case 'K':
            if (!cli_parse_kv_type(optarg, &a.kv_type))
                return cli_usage_error("bench", "--cache-type wants f32 or f16, not '%s'", optarg);
            break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("bench", "unknown option");
        }
    }
    if (profile) a.profile_reps = profile_reps;
    if (!a.path) return cli_usage_error("bench", "no model: pass -m FILE");
    if (a.p == 0 && a.n == 0) return cli_usage_error("bench", "nothing to measure: -p and -n are both 0");
    if (a.depth > 0 && a.n == 0) return cli_usage_error("bench", "-d fills the cache for the tg test, but -n is 0");
    moe_error err = {0};
    model *m = NULL;
    if (model_load(a.path, &m, &err) != MOE_OK) return cli_fail("bench", &err);
    report *r = calloc(1, sizeof *r);
    const int n_prompt = a.p > a.depth ? (a.p > 1 ? a.p : 1) : (a.depth > 1 ? a.depth : 1); /* pp, and the depth fill */
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    random_tokens(prompt, n_prompt, m->config.n_vocab, 42);
    r->tb = count_bytes(m, a.kv_type);
    gguf_str name = {0, NULL};
    if (gguf_get_str(m->file, "general.name", &name, NULL) == MOE_OK)
        snprintf(r->model_name, sizeof r->model_name, "%.*s", (int)(name.len < 120 ? name.len : 120), name.data);
    else
        snprintf(r->model_name, sizeof r->model_name, "%s", m->config.arch->name);
    bool gpu = a.device == MOE_DEVICE_CUDA || (a.device == MOE_DEVICE_AUTO && cuda_available());
    int status;
    if (gpu) {
#ifdef MOE_HAVE_CUDA
        status = bench_cuda(m, &a, r, prompt);
#else
        moe_error e = {MOE_ERR_UNSUPPORTED, "this build of moe.c has no CUDA backend (use --device cpu)"};
        status = cli_fail("bench", &e);
#endif
    } else {
        status = bench_cpu(m, &a, r, prompt);
    }
    if (status == 0) {
        if (a.json) print_json(r, &a);
        else print_markdown(r, &a);
#ifdef MOE_HAVE_CUDA
        if (!a.json && r->have_pf) print_prefill_profile(r);
        if (!a.json && r->have_prof) print_profile(r), print_timeline(r);
#endif
    }
    free(prompt);
    free(r);
    model_free(m);
    return status;
}
