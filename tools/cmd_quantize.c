/*
 * cmd_quantize.c — `moe quantize IN OUT TYPE`: re-quantize a model file.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common/error.h"
#include "quant/quantize_model.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static void print_help(void) {
    printf("usage: moe quantize [options] IN.gguf OUT.gguf TYPE\n\n"
           "Re-quantize a GGUF model. OUT is written atomically (a temp file, synced,\n"
           "then renamed): an error or Ctrl-C never leaves a partial OUT. IN is never\n"
           "modified and cannot be OUT.\n\n"
           "TYPE is a plain type or a mix:\n");
    for (int i = 0; quant_recipe_at(i); i++) printf(" %s", quant_recipe_at(i)->name);
    printf("\n\nRecipe: norms, biases and MoE routers stay F32; the output head gets Q6_K\n"
           "(Q8_0 for q8_0, unchanged for float types); the _m mixes give attn_v and\n"
           "ffn_down Q6_K in the first and last eighth of the layers and every third\n"
           "layer between; rows a type cannot hold fall back (Q4_K->Q5_0, Q5_K->Q5_1,\n"
           "Q6_K->Q8_0, others->F16). See src/quant/recipe.h.\n\n"
           "options:\n"
           "  -t, --threads N   worker threads (default: all CPUs)\n"
           "  -q, --quiet       no progress bar and no summary\n"
           "  -h, --help        this text\n");
}

static void print_report(const quantize_report *r) {
    fprintf(stderr, "%llu tensors (%llu re-quantized, %llu copied): %.2f MB -> %.2f MB\n",
            (unsigned long long)r->n_tensors, (unsigned long long)r->n_requantized,
            (unsigned long long)(r->n_tensors - r->n_requantized), r->bytes_in / 1e6, r->bytes_out / 1e6);
    for (int t = 0; t < MOE_TYPE_COUNT; t++)
        if (r->count_by_type[t])
            fprintf(stderr, "  %-8s %llu tensors\n", quant_format_of((uint32_t)t)->name,
                    (unsigned long long)r->count_by_type[t]);
}

int cmd_quantize(int argc, char **argv) {
    static const struct option long_options[] = {
        {"threads", required_argument, NULL, 't'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long threads = 0;
    bool quiet = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:qh", long_options, NULL)) != -1) {
        switch (c) {
        case 't':
            if (!cli_parse_int(optarg, 1, 1024, &threads))
                return cli_usage_error("quantize", "--threads wants a number from 1 to 1024, not '%s'", optarg);
            break;
        case 'q': quiet = true; break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("quantize", "unknown option");
        }
    }
    if (argc - optind != 3) return cli_usage_error("quantize", "expected IN OUT TYPE, got %d arguments", argc - optind);
    const char *in = argv[optind], *out = argv[optind + 1], *type = argv[optind + 2];
    const quant_recipe *recipe = quant_recipe_by_name(type);
    if (!recipe) return cli_usage_error("quantize", "unknown type '%s' (see the list in --help)", type);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    quantize_options opts = {.n_threads = (int)threads, .show_progress = !quiet, .cancel = &interrupted};
    quantize_report report;
    moe_error err = {0};
    if (quantize_model(in, out, recipe, &opts, &report, &err) != MOE_OK) return cli_fail("quantize", &err);
    if (!quiet) print_report(&report);
    return 0;
}
