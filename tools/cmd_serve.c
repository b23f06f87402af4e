/*
 * cmd_serve.c — `moe serve`: the OpenAI-compatible HTTP server
 * (src/server). This file is the command line and the process's life:
 * options, model, signals; SIGINT or SIGTERM drains and exits 0.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_model.h"
#include "server/server.h"

typedef struct serve_args {
    model_options model;
    server_config server;
    char *alias_owned;
} serve_args;

static void print_help(void) {
    printf("usage: moe serve -m FILE [options]\n\n"
           "An OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
           "GET /v1/models and GET /health. Requests run in --parallel slots, each with its own\n"
           "context of --ctx-size positions; up to --queue more wait, and past that a request\n"
           "gets a 503. One access-log line per request goes to stderr. SIGINT or SIGTERM stops\n"
           "accepting, lets running requests finish (cancelling them after --drain-timeout)\n"
           "and exits 0. The sampling options below are the defaults for requests that do\n"
           "not set their own.\n\n"
           "  --host ADDR              address to listen on (default: 127.0.0.1)\n"
           "  --port N                 port (default: 8080; 0: any free port, printed at start)\n"
           "  --parallel N             requests generated at once, one slot each (default: 1)\n"
           "  --queue N                requests that may wait for a slot (default: 64)\n"
           "  --max-body BYTES         largest request body (default: 1048576)\n"
           "  --timeout SECONDS        close connections idle or stalled this long (default: 60)\n"
           "  --drain-timeout SECONDS  on shutdown, time requests get to finish (default: 10)\n"
           "  --api-key KEY            require 'Authorization: Bearer KEY' (default: $MOE_API_KEY)\n"
           "  --chat-template NAME     chatml, llama3 or mistral instead of the file's\n"
           "  --alias NAME             the model name clients see (default: the file's name)\n"
           "  --log-format text|json   access log format (default: text)\n"
           "  -h, --help               this text\n\n"
           "With --threads unset, each slot gets an equal share of the CPUs.\n\n");
    model_options_print_help();
}

enum {
    OPT_HOST = 2000,
    OPT_PORT,
    OPT_PARALLEL,
    OPT_QUEUE,
    OPT_MAX_BODY,
    OPT_TIMEOUT,
    OPT_DRAIN,
    OPT_API_KEY,
    OPT_TEMPLATE,
    OPT_ALIAS,
    OPT_LOG_FORMAT,
};

static const struct option serve_options[] = {
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"parallel", required_argument, NULL, OPT_PARALLEL},
    {"queue", required_argument, NULL, OPT_QUEUE},
    {"max-body", required_argument, NULL, OPT_MAX_BODY},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"drain-timeout", required_argument, NULL, OPT_DRAIN},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"chat-template", required_argument, NULL, OPT_TEMPLATE},
    {"alias", required_argument, NULL, OPT_ALIAS},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"help", no_argument, NULL, 'h'},
};
#define SERVE_OPTIONS_COUNT (sizeof serve_options / sizeof serve_options[0])

/* An integer option in [min, max], or a usage error (-1). */
static int int_option(const char *name, const char *arg, long min, long max, long *out) {
    if (cli_parse_int(arg, min, max, out)) return 0;
    cli_usage_error("serve", "--%s wants a number from %ld to %ld, not '%s'", name, min, max, arg);
    return -1;
}

static int parse_option(serve_args *a, int c, const char *arg) {
    server_config *s = &a->server;
    long v = 0;
    int rc = 0;
    switch (c) {
    case OPT_HOST: s->host = arg; break;
    case OPT_PORT: rc = int_option("port", arg, 0, 65535, &v), s->port = (int)v; break;
    case OPT_PARALLEL: rc = int_option("parallel", arg, 1, 256, &v), s->parallel = (int)v; break;
    case OPT_QUEUE: rc = int_option("queue", arg, 0, 100000, &v), s->queue = (int)v; break;
    case OPT_MAX_BODY: rc = int_option("max-body", arg, 1024, 1L << 30, &v), s->max_body = (size_t)v; break;
    case OPT_TIMEOUT: rc = int_option("timeout", arg, 1, 86400, &v), s->timeout = (unsigned)v; break;
    case OPT_DRAIN: rc = int_option("drain-timeout", arg, 0, 3600, &v), s->drain_seconds = (double)v; break;
    case OPT_API_KEY: s->api_key = arg; break;
    case OPT_TEMPLATE: s->chat_template = arg; break;
    case OPT_ALIAS: s->model_name = arg; break;
    case OPT_LOG_FORMAT:
        if (strcmp(arg, "text") != 0 && strcmp(arg, "json") != 0)
            return cli_usage_error("serve", "--log-format wants text or json, not '%s'", arg), -1;
        s->log_json = strcmp(arg, "json") == 0;
        break;
    case 'h': print_help(); return 1;
    default: return cli_usage_error("serve", "unknown option"), -1;
    }
    return rc;
}

/* 0: go on; 1: done (help printed); 2: usage error. */
static int parse(int argc, char **argv, serve_args *a) {
    struct option options[SERVE_OPTIONS_COUNT + MODEL_OPTIONS_COUNT + 1];
    memcpy(options, serve_options, sizeof serve_options);
    memcpy(options + SERVE_OPTIONS_COUNT, model_long_options, sizeof model_long_options);
    memset(&options[SERVE_OPTIONS_COUNT + MODEL_OPTIONS_COUNT], 0, sizeof options[0]);
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", options, NULL)) != -1) {
        if ((rc = model_options_parse(&a->model, "serve", c, optarg)) == 0)
            rc = parse_option(a, c, optarg);
        else
            rc = rc < 0 ? -1 : 0;
        if (rc) return rc < 0 ? 2 : 1;
    }
    if (optind < argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    if (a->server.api_key && !a->server.api_key[0]) a->server.api_key = NULL;
    return 0;
}

/* The model's name for clients: the file name without directory or .gguf. */
static char *default_alias(const char *path) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".gguf") == 0) len -= 5;
    return strndup(base, len);
}

/* Each slot's share of the CPUs, unless --threads says otherwise. */
static void share_cpus(serve_args *a) {
    if (a->model.model.n_threads > 0) return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long share = (cpus > 0 ? cpus : 1) / a->server.parallel;
    a->model.model.n_threads = share > 0 ? (int)share : 1;
}

/* Serve until SIGINT or SIGTERM. The signals are blocked before any thread
 * starts, so every thread inherits the mask and only sigwait sees them. */
static int serve(moe_model *m, serve_args *a) {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    a->server.session = a->model.session;
    server *srv = NULL;
    moe_error err = {0};
    if (server_start(&a->server, m, &srv, &err) != MOE_OK) return cli_fail("serve", &err);
    bool v6 = strchr(a->server.host, ':') != NULL; /* an IPv6 address goes in brackets in a URL */
    fprintf(stderr, "moe serve: listening on http://%s%s%s:%d (model %s, %d slot%s of %d positions%s, queue %d)\n",
            v6 ? "[" : "", a->server.host, v6 ? "]" : "", server_port(srv), a->server.model_name, a->server.parallel,
            a->server.parallel == 1 ? "" : "s", server_n_ctx(srv),
            a->server.session.kv_type == MOE_KV_F16 ? " in an f16 KV cache" : "", a->server.queue);
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "moe serve: %s: draining (up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            a->server.drain_seconds);
    server_stop(srv);
    fprintf(stderr, "moe serve: stopped\n");
    return 0;
}

int cmd_serve(int argc, char **argv) {
    serve_args a = {.server = {.host = "127.0.0.1",
                               .port = 8080,
                               .parallel = 1,
                               .queue = 64,
                               .max_body = 1 << 20,
                               .timeout = 60,
                               .drain_seconds = 10,
                               .api_key = getenv("MOE_API_KEY")}};
    model_options_init(&a.model);
    int status = parse(argc, argv, &a);
    if (status) return status == 1 ? 0 : status;
    share_cpus(&a);
    moe_model *m = model_options_load(&a.model, "serve");
    if (!m) return model_options_load_status(&a.model);
    if (!a.server.model_name) a.server.model_name = a.alias_owned = default_alias(a.model.model_path);
    status = a.server.model_name ? serve(m, &a) : (fprintf(stderr, "moe serve: out of memory\n"), 1);
    free(a.alias_owned);
    moe_model_free(m);
    return status;
}
