/*
 * cmd_synth.c — `moe synth`: write a model with random weights at the
 * shapes of a real one (src/model/synth.c does the work).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/synth.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static void print_help(void) {
    printf("usage: moe synth [options] [--arch ARCH] [--preset PRESET] [--type TYPE] OUT.gguf\n\n"
           "Write a model with random but valid weights at the shapes of a real one: the\n"
           "benchmark and test vehicle until real weights are at hand. Weights keep\n"
           "activations bounded through every layer; the vocabulary is byte-level BPE with\n"
           "ChatML's special tokens. TYPE is a `moe quantize` type (q4_k: every weight\n"
           "matrix Q4_K, the output head Q6_K, norms and routers F32).\n\n"
           "presets (architecture):\n");
    for (int i = 0; synth_preset_at(i); i++) {
        const synth_preset *p = synth_preset_at(i);
        printf("  %-20s %-9s %2d layers, hidden %4d, %3d experts (top %d), vocabulary %d\n", p->name,
               p->arch ? p->arch : "any", p->n_layers, p->n_embd, p->n_experts, p->n_experts_used, p->n_vocab);
    }
    printf("\narchitectures: llama qwen2 qwen3 qwen2moe qwen3moe olmoe; with the tiny presets\n"
           "dense architectures drop the experts, and llama keeps them with --mixtral.\n\n"
           "options:\n"
           "  --arch ARCH        architecture (default: the preset's)\n"
           "  --preset NAME      shapes (default: tiny)\n"
           "  --type TYPE        weight type or mix (default: f32)\n"
           "  --mixtral          llama with experts (tiny presets)\n"
           "  --seed N           random seed (default: 1)\n"
           "  -t, --threads N    worker threads (default: all CPUs)\n"
           "  -q, --quiet        no progress bar\n"
           "  -h, --help         this text\n");
}

static int parse(int argc, char **argv, synth_options *o) {
    static const struct option long_options[] = {
        {"arch", required_argument, NULL, 'a'}, {"preset", required_argument, NULL, 'p'},
        {"type", required_argument, NULL, 'T'}, {"seed", required_argument, NULL, 's'},
        {"mixtral", no_argument, NULL, 'm'},    {"threads", required_argument, NULL, 't'},
        {"quiet", no_argument, NULL, 'q'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:qh", long_options, NULL)) != -1) {
        switch (c) {
        case 'a': o->arch = optarg; break;
        case 'p':
            if (!(o->preset = synth_preset_by_name(optarg))) return cli_usage_error("synth", "unknown preset '%s'", optarg);
            break;
        case 'T':
            if (!(o->recipe = quant_recipe_by_name(optarg))) return cli_usage_error("synth", "unknown type '%s'", optarg);
            break;
        case 's':
            if (!cli_parse_int(optarg, 0, 2147483647L, &v)) return cli_usage_error("synth", "bad seed '%s'", optarg);
            o->seed = (uint64_t)v;
            break;
        case 'm': o->llama_experts = true; break;
        case 't':
            if (!cli_parse_int(optarg, 1, 1024, &v)) return cli_usage_error("synth", "bad thread count '%s'", optarg);
            o->n_threads = (int)v;
            break;
        case 'q': o->show_progress = false; break;
        case 'h': print_help(); return -1;
        default: return cli_usage_error("synth", "unknown option");
        }
    }
    if (argc - optind != 1) return cli_usage_error("synth", "expected one OUT path, got %d arguments", argc - optind);
    o->out_path = argv[optind];
    return 0;
}

int cmd_synth(int argc, char **argv) {
    synth_options o = {.preset = synth_preset_by_name("tiny"), .recipe = quant_recipe_by_name("f32"), .seed = 1,
                       .show_progress = true, .cancel = &interrupted};
    int status = parse(argc, argv, &o);
    if (status) return status < 0 ? 0 : status;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    moe_error err = {0};
    if (synth_model(&o, &err) != MOE_OK) return cli_fail("synth", &err);
    return 0;
}
