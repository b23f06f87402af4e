/*
 * cmd_perplexity.c — `moe perplexity`: how well a model predicts a text.
 *
 * The text is tokenized once (no BOS unless the vocabulary asks for one)
 * and cut into non-overlapping windows of --ctx tokens; each window is
 * processed from an empty cache and every position but the window's first
 * is scored: the negative log-likelihood of the next token. Perplexity is
 * exp(mean NLL) over all scored positions. This is the recipe the demo
 * model's PyTorch evaluation uses (training/README.md), so the two compare
 * directly; it differs from llama.cpp's, which scores only the second half
 * of each window.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "common/progress.h"

static void print_help(void) {
    printf("usage: moe perplexity -m FILE -f TEXT [--ctx N] [options]\n\n"
           "Perplexity of the model on a text file: windows of N tokens, every position\n"
           "after a window's first scored; prints the running value and the final one\n"
           "with the mean negative log-likelihood and the tokens scored.\n\n"
           "  -f, --file FILE    the text\n"
           "  --ctx N            window length in tokens (default: 256)\n"
           "  --max-windows N    stop after N windows (default: all)\n"
           "  -h, --help         this text\n\n");
    model_options_print_help();
}

/* -log softmax(logits)[target], in double. */
static double nll(const float *logits, int n_vocab, int32_t target) {
    float max = logits[0];
    for (int v = 1; v < n_vocab; v++)
        if (logits[v] > max) max = logits[v];
    double sum = 0;
    for (int v = 0; v < n_vocab; v++) sum += exp((double)logits[v] - max);
    return log(sum) + max - logits[target];
}

typedef struct totals {
    double nll;
    long scored;
} totals;

static moe_status score_window(moe_session *s, const int32_t *ids, int n, float *logits, int n_vocab, totals *t,
                               moe_error *err) {
    moe_session_reset(s);
    moe_status st = moe_session_feed_all_logits(s, ids, (size_t)n, logits, err);
    for (int i = 0; st == MOE_OK && i + 1 < n; i++) {
        t->nll += nll(logits + (size_t)i * n_vocab, n_vocab, ids[i + 1]);
        t->scored++;
    }
    return st;
}

static int evaluate(moe_model *m, model_options *mo, const char *text, size_t len, long ctx, long max_windows) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    moe_error err = {0};
    if (moe_tokenize(m, text, len, true, false, &ids, &n_ids, &err) != MOE_OK) return cli_fail("perplexity", &err);
    long n_windows = (long)(n_ids / (size_t)ctx);
    if (max_windows > 0 && n_windows > max_windows) n_windows = max_windows;
    if (n_windows == 0) {
        fprintf(stderr, "moe perplexity: the text has %zu tokens, fewer than one window of %ld\n", n_ids, ctx);
        moe_free(ids);
        return 1;
    }
    mo->session.n_ctx = (int)ctx;
    int n_vocab = moe_model_n_vocab(m);
    moe_session *s = NULL;
    float *logits = malloc((size_t)ctx * n_vocab * sizeof *logits);
    totals t = {0};
    int status = 0;
    if (!logits || moe_session_new(m, &mo->session, &s, &err) != MOE_OK) status = cli_fail("perplexity", &err);
    progress *bar = status ? NULL : progress_start("perplexity", (uint64_t)n_windows, 1, "windows");
    for (long w = 0; status == 0 && w < n_windows; w++) {
        if (score_window(s, ids + w * ctx, (int)ctx, logits, n_vocab, &t, &err) != MOE_OK) status = cli_fail("perplexity", &err);
        progress_add(bar, 1);
    }
    progress_finish(bar);
    if (status == 0)
        printf("perplexity %.4f  (mean NLL %.5f over %ld tokens, %ld windows of %ld)\n", exp(t.nll / t.scored),
               t.nll / t.scored, t.scored, n_windows, ctx);
    moe_session_free(s);
    free(logits);
    moe_free(ids);
    return status;
}

int cmd_perplexity(int argc, char **argv) {
    struct option options[MODEL_OPTIONS_COUNT + 5] = {
        {"file", required_argument, NULL, 'f'},
        {"ctx", required_argument, NULL, 'c'},
        {"max-windows", required_argument, NULL, 'W'},
        {"help", no_argument, NULL, 'h'},
    };
    memcpy(options + 4, model_long_options, sizeof model_long_options);
    model_options mo;
    model_options_init(&mo);
    const char *file = NULL;
    long ctx = 256, max_windows = 0;
    int c, handled;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:h", options, NULL)) != -1) {
        if ((handled = model_options_parse(&mo, "perplexity", c, optarg)) != 0) {
            if (handled < 0) return 2;
            continue;
        }
        switch (c) {
        case 'f': file = optarg; break;
        case 'c':
            if (!cli_parse_int(optarg, 2, 1 << 20, &ctx)) return cli_usage_error("perplexity", "bad --ctx '%s'", optarg);
            break;
        case 'W':
            if (!cli_parse_int(optarg, 1, 1L << 30, &max_windows))
                return cli_usage_error("perplexity", "bad --max-windows '%s'", optarg);
            break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("perplexity", "unknown option");
        }
    }
    if (!file) return cli_usage_error("perplexity", "no text: pass -f FILE");
    size_t len = 0;
    char *text = cli_read_file(file, &len);
    if (!text) return fprintf(stderr, "moe perplexity: cannot read %s\n", file), 1;
    moe_model *m = model_options_load(&mo, "perplexity");
    int status = m ? evaluate(m, &mo, text, len, ctx, max_windows) : model_options_load_status(&mo);
    moe_model_free(m);
    free(text);
    return status;
}
