/*
 * cmd_run.c — `moe run`: generate text from a prompt, streamed to stdout,
 * with prompt and generation speed on stderr.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static bool print_text(const char *text, size_t len, void *user) {
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return !interrupted;
}

static void print_help(void) {
    printf("usage: moe run -m FILE -p TEXT [-n N] [options]\n\n"
           "Generate text after a prompt, streamed to stdout; prompt and generation speed\n"
           "go to stderr. The prompt is used as it is (no chat template: see moe chat).\n\n"
           "  -p, --prompt TEXT        the prompt\n"
           "  -f, --file FILE          read the prompt from a file\n"
           "  -n, --n-predict N        tokens to generate (default: 128; -1: until the context is full)\n"
           "  --no-special             do not recognise special tokens written in the prompt\n"
           "  -q, --quiet              no speed report\n"
           "  -h, --help               this text\n\n");
    model_options_print_help();
}

typedef struct run_args {
    model_options model;
    const char *prompt;
    char *prompt_owned;
    size_t prompt_len;
    long n_predict;
    bool parse_special, quiet;
} run_args;

static int parse(int argc, char **argv, run_args *a) {
    struct option options[MODEL_OPTIONS_COUNT + 7] = {
        {"prompt", required_argument, NULL, 'p'}, {"file", required_argument, NULL, 'f'},
        {"n-predict", required_argument, NULL, 'n'}, {"no-special", no_argument, NULL, 'S'},
        {"quiet", no_argument, NULL, 'q'}, {"help", no_argument, NULL, 'h'},
    };
    memcpy(options + 6, model_long_options, sizeof model_long_options);
    int c, handled;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:n:qh", options, NULL)) != -1) {
        if ((handled = model_options_parse(&a->model, "run", c, optarg)) != 0) {
            if (handled < 0) return 2;
            continue;
        }
        switch (c) {
        case 'p': a->prompt = optarg, a->prompt_len = strlen(optarg); break;
        case 'f':
            free(a->prompt_owned);
            if (!(a->prompt = a->prompt_owned = cli_read_file(optarg, &a->prompt_len))) {
                fprintf(stderr, "moe run: cannot read %s\n", optarg);
                return 1;
            }
            break;
        case 'n':
            if (!cli_parse_int(optarg, -1, 1 << 24, &a->n_predict))
                return cli_usage_error("run", "--n-predict wants a number >= -1, not '%s'", optarg);
            break;
        case 'S': a->parse_special = false; break;
        case 'q': a->quiet = true; break;
        case 'h': print_help(); return -1;
        default: return cli_usage_error("run", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
    if (!a->prompt || a->prompt_len == 0) return cli_usage_error("run", "the prompt is empty: pass -p TEXT or -f FILE");
    return 0;
}

static void report(const moe_generate_result *r, uint64_t seed) {
    fprintf(stderr, "\n\nprompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s (%.1f tok/s); seed %llu\n",
            r->n_prompt, r->prompt_seconds, r->prompt_seconds > 0 ? r->n_prompt / r->prompt_seconds : 0,
            r->n_generated, r->generate_seconds, r->generate_seconds > 0 ? r->n_generated / r->generate_seconds : 0,
            (unsigned long long)seed);
}

static int context_overflow(size_t n_ids, int n_ctx) {
    fprintf(stderr, "moe run: the prompt has %zu tokens but the context holds %d (raise --ctx-size)\n", n_ids, n_ctx);
    return 1;
}

static int generate(moe_model *m, const run_args *a) {
    moe_error err = {0};
    moe_session *s = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    moe_generate_result result;
    moe_generate_params gp = {.max_tokens = a->n_predict < 0 ? 0 : (int)a->n_predict, .on_text = print_text};
    int status = 0;
    if (moe_tokenize(m, a->prompt, a->prompt_len, true, a->parse_special, &ids, &n_ids, &err) != MOE_OK ||
        moe_session_new(m, &a->model.session, &s, &err) != MOE_OK)
        status = cli_fail("run", &err);
    else if (n_ids > (size_t)moe_session_n_ctx(s))
        status = context_overflow(n_ids, moe_session_n_ctx(s));
    else if (a->n_predict != 0 && moe_generate(s, ids, n_ids, &gp, &result, &err) != MOE_OK)
        status = cli_fail("run", &err);
    else if (a->n_predict != 0 && !a->quiet)
        report(&result, a->model.session.sampling.seed);
    moe_free(ids);
    moe_session_free(s);
    return status;
}

int cmd_run(int argc, char **argv) {
    run_args a = {.n_predict = 128, .parse_special = true};
    model_options_init(&a.model);
    int status = parse(argc, argv, &a);
    if (status == 0) {
        moe_model *m = model_options_load(&a.model, "run");
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        status = m ? generate(m, &a) : model_options_load_status(&a.model);
        moe_model_free(m);
    }
    free(a.prompt_owned);
    return status < 0 ? 0 : status;
}
