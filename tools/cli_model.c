/* cli_model.c — see cli_model.h. */
#include "cli_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

enum {
    OPT_MODEL = 'm',
    OPT_DEVICE = 1000,
    OPT_THREADS,
    OPT_CTX,
    OPT_BATCH,
    OPT_CACHE_TYPE,
    OPT_TEMP,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_MIN_P,
    OPT_REPEAT,
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_REPEAT_LAST_N,
    OPT_SEED,
};

const struct option model_long_options[MODEL_OPTIONS_COUNT] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"ctx-size", required_argument, NULL, OPT_CTX},
    {"batch-size", required_argument, NULL, OPT_BATCH},
    {"cache-type", required_argument, NULL, OPT_CACHE_TYPE},
    {"temp", required_argument, NULL, OPT_TEMP},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"min-p", required_argument, NULL, OPT_MIN_P},
    {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
    {"presence-penalty", required_argument, NULL, OPT_PRESENCE},
    {"frequency-penalty", required_argument, NULL, OPT_FREQUENCY},
    {"repeat-last-n", required_argument, NULL, OPT_REPEAT_LAST_N},
    {"seed", required_argument, NULL, OPT_SEED},
};

/* The demo model that ships in the source tree (models/), used when neither
 * -m nor $MOE_MODEL names one. */
#ifndef MOE_DEFAULT_MODEL
#define MOE_DEFAULT_MODEL NULL
#endif

void model_options_init(model_options *o) {
    o->model_path = getenv("MOE_MODEL");
    if (!o->model_path) o->model_path = MOE_DEFAULT_MODEL;
    o->model = moe_model_default_params();
    o->session = moe_session_default_params();
    /* The library's sampler defaults are neutral (no filters); the command
     * line uses the settings people expect from llama.cpp, and a fresh seed
     * unless --seed is given. */
    moe_sampling *s = &o->session.sampling;
    s->temperature = 0.8f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->min_p = 0.05f;
    s->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
}

static bool parse_float(const char *text, float min, float max, float *out) {
    char *end;
    float v = strtof(text, &end);
    if (end == text || *end != '\0' || !(v >= min && v <= max)) return false;
    *out = v;
    return true;
}

static int parse_device(model_options *o, const char *command, const char *arg) {
    if (strcmp(arg, "cpu") == 0) o->model.device = MOE_DEVICE_CPU;
    else if (strcmp(arg, "cuda") == 0) o->model.device = MOE_DEVICE_CUDA;
    else if (strcmp(arg, "auto") == 0) o->model.device = MOE_DEVICE_AUTO;
    else return cli_usage_error(command, "--device wants cpu, cuda or auto, not '%s'", arg), -1;
    return 1;
}

int model_options_parse(model_options *o, const char *command, int c, const char *arg) {
    moe_sampling *s = &o->session.sampling;
    long v = 0;
    bool ok = true;
    switch (c) {
    case OPT_MODEL: o->model_path = arg; return 1;
    case OPT_DEVICE: return parse_device(o, command, arg);
    case OPT_THREADS: ok = cli_parse_int(arg, 1, 1024, &v), o->model.n_threads = (int)v; break;
    case OPT_CTX: ok = cli_parse_int(arg, 1, 1 << 24, &v), o->session.n_ctx = (int)v; break;
    case OPT_BATCH: ok = cli_parse_int(arg, 1, 1 << 16, &v), o->session.n_batch = (int)v; break;
    case OPT_CACHE_TYPE: ok = cli_parse_kv_type(arg, &o->session.kv_type); break;
    case OPT_TEMP: ok = parse_float(arg, 0, 100, &s->temperature); break;
    case OPT_TOP_K: ok = cli_parse_int(arg, 0, 1 << 24, &v), s->top_k = (int)v; break;
    case OPT_TOP_P: ok = parse_float(arg, 1e-6f, 1, &s->top_p); break;
    case OPT_MIN_P: ok = parse_float(arg, 0, 1, &s->min_p); break;
    case OPT_REPEAT: ok = parse_float(arg, 1e-3f, 100, &s->repetition_penalty); break;
    case OPT_PRESENCE: ok = parse_float(arg, -2, 2, &s->presence_penalty); break;
    case OPT_FREQUENCY: ok = parse_float(arg, -2, 2, &s->frequency_penalty); break;
    case OPT_REPEAT_LAST_N: ok = cli_parse_int(arg, 0, 1 << 20, &v), s->penalty_last_n = (int)v; break;
    case OPT_SEED: ok = cli_parse_int(arg, 0, 0x7fffffffL, &v), s->seed = (uint64_t)v; break;
    default: return 0;
    }
    if (!ok) {
        for (int i = 0; i < MODEL_OPTIONS_COUNT; i++)
            if (model_long_options[i].val == c)
                return cli_usage_error(command, "bad value '%s' for --%s", arg, model_long_options[i].name), -1;
    }
    return 1;
}

void model_options_print_help(void) {
    printf("model:\n"
           "  -m, --model FILE         the GGUF model (default: $MOE_MODEL, else the shipped\n"
           "                           demo model models/moe-demo-q8_0.gguf)\n"
           "  --device cpu|cuda|auto   where to run (default: auto)\n"
           "  --threads N              CPU threads (default: all)\n"
           "  --ctx-size N             context positions (default: the model's, at most 4096)\n"
           "  --batch-size N           prompt tokens per step (default: 256)\n"
           "  --cache-type f32|f16     the KV cache's elements; f16 halves its memory and what a\n"
           "                           token reads of it (default: f32)\n"
           "sampling:\n"
           "  --temp T                 temperature, 0 = greedy (default: 0.8)\n"
           "  --top-k K                keep the K most likely tokens, 0 = off (default: 40)\n"
           "  --top-p P                nucleus sampling, 1 = off (default: 0.95)\n"
           "  --min-p P                drop tokens below P x the top probability (default: 0.05)\n"
           "  --repeat-penalty R       penalise recent tokens, 1 = off (default: 1)\n"
           "  --presence-penalty P     OpenAI presence penalty (default: 0)\n"
           "  --frequency-penalty F    OpenAI frequency penalty (default: 0)\n"
           "  --repeat-last-n N        tokens the penalties look back over (default: 64)\n"
           "  --seed N                 random seed: the same seed gives the same text\n");
}

moe_model *model_options_load(const model_options *o, const char *command) {
    if (!o->model_path) {
        cli_usage_error(command, "no model: pass -m FILE (or set MOE_MODEL)");
        return NULL;
    }
    moe_model *m;
    moe_error err = {0};
    if (moe_model_load(o->model_path, &o->model, &m, &err) != MOE_OK) {
        cli_fail(command, &err);
        return NULL;
    }
    return m;
}

int model_options_load_status(const model_options *o) { return o->model_path ? 1 : 2; }
