/*
 * cmd_convert.c — `moe convert DIR OUT.gguf`: a Hugging Face checkpoint to
 * a GGUF model (the work is in hf_convert.c).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hf_convert.h"
#include "quant/recipe.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static void print_help(void) {
    printf("usage: moe convert [options] DIR OUT.gguf\n\n"
           "Convert a Hugging Face checkpoint directory (config.json, model.safetensors\n"
           "or shards with model.safetensors.index.json, tokenizer.json and\n"
           "tokenizer_config.json) to a GGUF model. Architectures: LlamaForCausalLM,\n"
           "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM,\n"
           "Qwen3ForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM. Weights may be F32,\n"
           "F16 or BF16. OUT is written atomically: an error or Ctrl-C never leaves a\n"
           "partial file.\n\n"
           "options:\n"
           "  --type TYPE       the weight type (default: the checkpoint's own, f32, f16\n"
           "                    or bf16, so nothing is rounded); any type of moe quantize:\n"
           "                   ");
    for (int i = 0; quant_recipe_at(i); i++)
        printf(" %s", quant_recipe_at(i)->name);
    printf("\n"
           "  -t, --threads N   worker threads (default: all CPUs)\n"
           "  -q, --quiet       no progress bar and no summary\n"
           "  -h, --help        this text\n");
}

static void print_report(const hf_convert_report *r, const char *out) {
    fprintf(stderr, "%s (%s) -> %s %s: %llu tensors, %.2f MB -> %.2f MB\n", r->hf_arch, r->gguf_arch, out, r->recipe,
            (unsigned long long)r->n_tensors, r->bytes_in / 1e6, r->bytes_out / 1e6);
    for (int t = 0; t < MOE_TYPE_COUNT; t++)
        if (r->count_by_type[t])
            fprintf(stderr, "  %-8s %llu tensors\n", quant_format_of((uint32_t)t)->name,
                    (unsigned long long)r->count_by_type[t]);
}

int cmd_convert(int argc, char **argv) {
    static const struct option long_options[] = {
        {"type", required_argument, NULL, 'T'},
        {"threads", required_argument, NULL, 't'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    hf_convert_options o = {.show_progress = true, .cancel = &interrupted};
    long threads = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:qh", long_options, NULL)) != -1) {
        switch (c) {
        case 'T':
            if (!quant_recipe_by_name(optarg))
                return cli_usage_error("convert", "unknown type '%s' (see the list in --help)", optarg);
            o.type = optarg;
            break;
        case 't':
            if (!cli_parse_int(optarg, 1, 1024, &threads))
                return cli_usage_error("convert", "--threads wants a number from 1 to 1024, not '%s'", optarg);
            break;
        case 'q': o.show_progress = false; break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("convert", "unknown option");
        }
    }
    if (argc - optind != 2) return cli_usage_error("convert", "expected DIR OUT.gguf, got %d arguments", argc - optind);
    o.dir = argv[optind];
    o.out_path = argv[optind + 1];
    o.n_threads = (int)threads;

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    hf_convert_report report;
    moe_error err = {0};
    if (hf_convert(&o, &report, &err) != MOE_OK) return cli_fail("convert", &err);
    if (o.show_progress) print_report(&report, o.out_path);
    return 0;
}
