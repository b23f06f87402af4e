/*
 * cmd_logits.c — `moe logits`: the logits of every position of a token
 * sequence, teacher-forced. The tool every correctness check uses: its
 * --out file is raw little-endian float32, positions x vocabulary.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"

#define TOP_SHOWN 5

static void print_help(void) {
    printf("usage: moe logits -m FILE --tokens 1,2,3 [--out FILE] [options]\n\n"
           "Run the tokens through the model at once (teacher forcing) and print, for\n"
           "each position, the most likely next tokens. With --out, write every logit\n"
           "as raw little-endian float32, positions x vocabulary.\n\n"
           "  --tokens LIST      comma-separated token ids (see moe tokenize --ids)\n"
           "  --out FILE         write the logits here\n"
           "  --device, --threads, --batch-size, --ctx-size, -m: as for moe run\n"
           "  -h, --help         this text\n");
}

/* "1,2,3" -> ids; false on anything else. */
static bool parse_tokens(const char *text, int32_t **ids, size_t *n) {
    size_t cap = 16, count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    const char *p = text;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) break;
        if (count == cap && !(out = realloc(out, (cap *= 2) * sizeof *out))) break;
        out[count++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == '\0') {
            *ids = out, *n = count;
            return count > 0;
        }
    }
    free(out);
    return false;
}

static void print_top(const moe_model *m, const float *logits, int n_vocab, int position, int32_t token) {
    int best[TOP_SHOWN];
    int found = 0;
    for (int v = 0; v < n_vocab; v++) {
        int at = found < TOP_SHOWN ? found++ : TOP_SHOWN;
        while (at > 0 && logits[v] > logits[best[at - 1]]) {
            if (at < TOP_SHOWN) best[at] = best[at - 1];
            at--;
        }
        if (at < TOP_SHOWN) best[at] = v;
    }
    printf("%5d %7d ->", position, token);
    for (int i = 0; i < found; i++) {
        size_t len;
        const char *piece = moe_token_piece(m, best[i], &len);
        printf("  %d '%.*s' %.3f", best[i], (int)(len > 16 ? 16 : len), piece, logits[best[i]]);
    }
    putchar('\n');
}

static int write_logits(const char *path, const float *logits, size_t count) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(logits, sizeof(float), count, f) != count || fclose(f) != 0) {
        fprintf(stderr, "moe logits: cannot write %s: %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    return 0;
}

static int run(moe_model *m, model_options *mo, const int32_t *ids, size_t n, const char *out_path) {
    int n_vocab = moe_model_n_vocab(m);
    if (mo->session.n_ctx <= 0) mo->session.n_ctx = (int)n;
    moe_session *s = NULL;
    moe_error err = {0};
    float *logits = malloc(n * (size_t)n_vocab * sizeof *logits);
    int status = 0;
    if (!logits) status = fprintf(stderr, "moe logits: out of memory for %zu x %d logits\n", n, n_vocab) > 0;
    else if (moe_session_new(m, &mo->session, &s, &err) != MOE_OK ||
             moe_session_feed_all_logits(s, ids, n, logits, &err) != MOE_OK)
        status = cli_fail("logits", &err);
    if (status == 0) {
        for (size_t i = 0; i < n; i++) print_top(m, logits + i * (size_t)n_vocab, n_vocab, (int)i, ids[i]);
        if (out_path) status = write_logits(out_path, logits, n * (size_t)n_vocab);
    }
    moe_session_free(s);
    free(logits);
    return status;
}

int cmd_logits(int argc, char **argv) {
    struct option options[MODEL_OPTIONS_COUNT + 4] = {
        {"tokens", required_argument, NULL, 'T'},
        {"out", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
    };
    memcpy(options + 3, model_long_options, sizeof model_long_options);
    model_options mo;
    model_options_init(&mo);
    const char *out_path = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int c, handled;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:o:h", options, NULL)) != -1) {
        if ((handled = model_options_parse(&mo, "logits", c, optarg)) != 0) {
            if (handled < 0) return free(ids), 2;
            continue;
        }
        switch (c) {
        case 'T':
            free(ids);
            if (!parse_tokens(optarg, &ids, &n))
                return cli_usage_error("logits", "--tokens wants comma-separated ids like 1,2,3, not '%s'", optarg);
            break;
        case 'o': out_path = optarg; break;
        case 'h': print_help(); return free(ids), 0;
        default: return free(ids), cli_usage_error("logits", "unknown option");
        }
    }
    if (!ids) return cli_usage_error("logits", "no tokens: pass --tokens 1,2,3");
    moe_model *m = model_options_load(&mo, "logits");
    int status = m ? run(m, &mo, ids, n, out_path) : model_options_load_status(&mo);
    moe_model_free(m);
    free(ids);
    return status;
}
