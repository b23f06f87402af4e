/*
 * golden_check.c — a converted model against Hugging Face's own outputs.
 *
 * usage: golden_check MODEL.gguf FIXTURE_DIR MAX_REL [MAX_L2] [--greedy]
 *
 * FIXTURE_DIR holds reference.json and the logits Transformers computed
 * (tests/golden/make_fixtures.py). Through the public API only, for every
 * sequence of the fixture:
 *   - the text tokenizes to the reference ids (special tokens parsed, none
 *     added): the tokenizer conversion is right;
 *   - the logits of every position, teacher-forced, are within MAX_REL:
 *     max |moe - reference| / rms(reference row) at each position; and,
 *     given MAX_L2, their relative L2 error over all positions,
 *     ||moe - reference|| / ||reference||, is within it. A quantized model
 *     needs both: one token routed to other experts moves its position's
 *     logits a lot, which the max alone would have to allow everywhere;
 *   - with --greedy, greedy decoding (temperature 0, one token at a time
 *     through the KV cache) continues with the reference's 16 tokens. Where
 *     the reference's top two logits were closer than twice the error
 *     bound, either choice is right and the comparison of that sequence
 *     stops there.
 * Prints both errors and exits 0 when everything holds.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

typedef struct check {
    moe_model *model;
    const char *dir;
    double max_rel, max_l2;
    double worst;           /* the largest per-position relative error */
    double diff_ss, ref_ss; /* for the relative L2 error */
    int n_greedy, n_greedy_checked;
    int failures;
} check;

static float *read_floats(const char *path, size_t count) {
    FILE *f = fopen(path, "rb");
    float *data = malloc(count * sizeof *data);
    bool ok = f && data && fread(data, sizeof *data, count, f) == count && fgetc(f) == EOF;
    if (f) fclose(f);
    if (!ok) {
        fprintf(stderr, "golden_check: %s is not %zu float32 values\n", path, count);
        free(data);
        return NULL;
    }
    return data;
}

static int32_t *ids_of(json_t *array, size_t *n) {
    *n = json_array_size(array);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(array, i));
    return ids;
}

static void check_tokens(check *c, const char *text, const int32_t *want, size_t n_want, int seq) {
    int32_t *got = NULL;
    size_t n_got = 0;
    moe_error err = {0};
    if (moe_tokenize(c->model, text, strlen(text), false, true, &got, &n_got, &err) != MOE_OK) {
        fprintf(stderr, "  sequence %d: tokenize failed: %s\n", seq, err.message);
        c->failures++;
        return;
    }
    size_t same = 0;
    while (same < n_got && same < n_want && got[same] == want[same])
        same++;
    if (same != n_got || same != n_want) {
        fprintf(stderr, "  sequence %d: %zu tokens, the reference has %zu; they differ from token %zu on\n", seq, n_got,
                n_want, same);
        c->failures++;
    }
    moe_free(got);
}

/* The largest per-position relative error of n positions of logits; the
 * squared error and reference are added to c's sums. */
static double compare_logits(check *c, const float *got, const float *want, size_t n, int n_vocab, int *worst_pos) {
    double worst = 0;
    for (size_t p = 0; p < n; p++) {
        const float *g = got + p * n_vocab, *w = want + p * n_vocab;
        double ss = 0, max_diff = 0;
        for (int v = 0; v < n_vocab; v++) {
            double d = (double)g[v] - w[v];
            ss += (double)w[v] * w[v];
            c->diff_ss += d * d;
            max_diff = fmax(max_diff, fabs(d));
        }
        c->ref_ss += ss;
        double rel = max_diff / sqrt(ss / n_vocab);
        if (!(rel <= worst)) {
            worst = rel;
            *worst_pos = (int)p;
        }
    }
    return worst;
}

static moe_session *new_session(check *c, int n_ctx) {
    moe_session_params sp = moe_session_default_params();
    sp.n_ctx = n_ctx;
    sp.sampling.temperature = 0;
    moe_session *s = NULL;
    moe_error err = {0};
    if (moe_session_new(c->model, &sp, &s, &err) != MOE_OK) {
        fprintf(stderr, "golden_check: %s\n", err.message);
        c->failures++;
    }
    return s;
}

static void check_logits(check *c, moe_session *s, const int32_t *ids, size_t n, const char *file, int seq) {
    int n_vocab = moe_model_n_vocab(c->model);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    float *want = read_floats(path, n * (size_t)n_vocab), *got = malloc(n * (size_t)n_vocab * sizeof *got);
    moe_error err = {0};
    if (!want || !got || moe_session_feed_all_logits(s, ids, n, got, &err) != MOE_OK) {
        if (err.message[0]) fprintf(stderr, "  sequence %d: %s\n", seq, err.message);
        c->failures++;
    } else {
        int pos = 0;
        double rel = compare_logits(c, got, want, n, n_vocab, &pos);
        c->worst = fmax(c->worst, rel);
        if (!(rel <= c->max_rel)) {
            fprintf(stderr, "  sequence %d: position %d is off by %.3g of the logits' rms (bound %.3g)\n", seq, pos,
                    rel, c->max_rel);
            c->failures++;
        }
    }
    free(want);
    free(got);
}

/* Continue greedily from the fed sequence, token by token. */
static void check_greedy(check *c, moe_session *s, json_t *greedy, json_t *margins, double rms, int seq) {
    moe_error err = {0};
    for (size_t i = 0; i < json_array_size(greedy); i++) {
        int32_t want = (int32_t)json_integer_value(json_array_get(greedy, i)), got;
        c->n_greedy++;
        if (moe_session_sample(s, &got, &err) != MOE_OK) {
            fprintf(stderr, "  sequence %d: sampling failed: %s\n", seq, err.message);
            c->failures++;
            return;
        }
        if (got != want) {
            double margin = json_number_value(json_array_get(margins, i));
            if (margin < 2 * c->max_rel * rms) return; /* a near tie: both answers are right */
            fprintf(stderr, "  sequence %d: greedy token %zu is %d, the reference's is %d (margin %.3g)\n", seq, i, got,
                    want, margin);
            c->failures++;
            return;
        }
        c->n_greedy_checked++;
        if (moe_session_feed(s, &got, 1, &err) != MOE_OK) {
            fprintf(stderr, "  sequence %d: %s\n", seq, err.message);
            c->failures++;
            return;
        }
    }
}

static void check_sequence(check *c, json_t *seq_json, int seq, bool greedy) {
    size_t n;
    int32_t *ids = ids_of(json_object_get(seq_json, "ids"), &n);
    json_t *cont = json_object_get(seq_json, "greedy");
    const char *text = json_string_value(json_object_get(seq_json, "text"));
    const char *file = json_string_value(json_object_get(seq_json, "logits"));
    if (!ids || n == 0 || !text || !file || !json_is_array(cont)) {
        fprintf(stderr, "golden_check: sequence %d of reference.json is incomplete\n", seq);
        c->failures++;
        free(ids);
        return;
    }
    check_tokens(c, text, ids, n, seq);
    moe_session *s = new_session(c, (int)(n + json_array_size(cont) + 1));
    if (s) check_logits(c, s, ids, n, file, seq);
    if (s && greedy)
        check_greedy(c, s, cont, json_object_get(seq_json, "greedy_margins"),
                     json_number_value(json_object_get(seq_json, "logits_rms")), seq);
    moe_session_free(s);
    free(ids);
}

static int run(check *c, json_t *ref, bool greedy) {
    json_t *seqs = json_object_get(ref, "sequences"), *seq;
    size_t i;
    if (json_integer_value(json_object_get(ref, "n_vocab")) != moe_model_n_vocab(c->model)) {
        fprintf(stderr, "golden_check: the model has %d logits, the reference %lld\n", moe_model_n_vocab(c->model),
                (long long)json_integer_value(json_object_get(ref, "n_vocab")));
        return 1;
    }
    json_array_foreach(seqs, i, seq) check_sequence(c, seq, (int)i, greedy);
    double l2 = sqrt(c->diff_ss / c->ref_ss);
    printf("max |dlogit|/rms %.2e (bound %.2g), relative L2 %.2e", c->worst, c->max_rel, l2);
    if (c->max_l2 > 0) printf(" (bound %.2g)", c->max_l2);
    if (c->max_l2 > 0 && !(l2 <= c->max_l2)) {
        fprintf(stderr, "  the relative L2 error %.3g exceeds its bound %.3g\n", l2, c->max_l2);
        c->failures++;
    }
    if (greedy) printf(", greedy %d/%d tokens equal", c->n_greedy_checked, c->n_greedy);
    printf("\n");
    return c->failures ? 1 : 0;
}

int main(int argc, char **argv) {
    bool greedy = argc >= 5 && strcmp(argv[argc - 1], "--greedy") == 0;
    int n_bounds = argc - 3 - greedy;
    if (argc < 4 || n_bounds < 1 || n_bounds > 2) {
        fprintf(stderr, "usage: golden_check MODEL.gguf FIXTURE_DIR MAX_REL [MAX_L2] [--greedy]\n");
        return 2;
    }
    check c = {.dir = argv[2], .max_rel = atof(argv[3]), .max_l2 = n_bounds == 2 ? atof(argv[4]) : 0};
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.json", c.dir);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    if (!ref) {
        fprintf(stderr, "golden_check: %s: %s\n", path, je.text);
        return 1;
    }
    moe_model_params mp = moe_model_default_params();
    mp.device = MOE_DEVICE_CPU;
    mp.n_threads = 2;
    moe_error err = {0};
    int status = 1;
    if (moe_model_load(argv[1], &mp, &c.model, &err) != MOE_OK)
        fprintf(stderr, "golden_check: %s\n", err.message);
    else
        status = run(&c, ref, greedy);
    moe_model_free(c.model);
    json_decref(ref);
    return status;
}
