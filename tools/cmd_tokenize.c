/*
 * cmd_tokenize.c — `moe tokenize`: the token ids (and pieces) of a text.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"

static void print_help(void) {
    printf("usage: moe tokenize -m FILE (-p TEXT | -f TEXTFILE) [--ids] [options]\n\n"
           "Print the tokens of a text with the model's tokenizer: one line per token,\n"
           "id and piece; with --ids only the ids, comma-separated (the form\n"
           "`moe logits --tokens` takes).\n\n"
           "  -m, --model FILE   the GGUF model (default: $MOE_MODEL)\n"
           "  -p, --prompt TEXT  the text\n"
           "  -f, --file FILE    read the text from a file\n"
           "  --ids              only the ids\n"
           "  --no-bos           do not add the BOS token even if the vocabulary asks\n"
           "  --no-special       treat special tokens written in the text as plain text\n"
           "  -h, --help         this text\n");
}

/* A piece as a quoted string with escapes, so whitespace shows. */
static void print_piece(const char *piece, size_t len) {
    putchar('\'');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)piece[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\'' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('\'');
}

static void print_tokens(const moe_model *m, const int32_t *ids, size_t n, bool ids_only) {
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? ",%d" : "%d", ids[i]);
            continue;
        }
        size_t len;
        const char *piece = moe_token_piece(m, ids[i], &len);
        printf("%6d ", ids[i]);
        print_piece(piece, len);
        putchar('\n');
    }
    if (ids_only) putchar('\n');
}

int cmd_tokenize(int argc, char **argv) {
    static const struct option options[] = {
        {"model", required_argument, NULL, 'm'}, {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},  {"ids", no_argument, NULL, 'i'},
        {"no-bos", no_argument, NULL, 'B'},      {"no-special", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    model_options mo;
    model_options_init(&mo);
    const char *text = NULL, *file = NULL;
    bool ids_only = false, add_special = true, parse_special = true;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:f:h", options, NULL)) != -1) {
        switch (c) {
        case 'm': mo.model_path = optarg; break;
        case 'p': text = optarg; break;
        case 'f': file = optarg; break;
        case 'i': ids_only = true; break;
        case 'B': add_special = false; break;
        case 'S': parse_special = false; break;
        case 'h': print_help(); return 0;
        default: return cli_usage_error("tokenize", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("tokenize", "unexpected argument '%s'", argv[optind]);
    if (!text == !file) return cli_usage_error("tokenize", "pass exactly one of -p TEXT and -f FILE");
    size_t len = text ? strlen(text) : 0;
    char *owned = file ? cli_read_file(file, &len) : NULL;
    if (file && !owned) return fprintf(stderr, "moe tokenize: cannot read %s\n", file), 1;
    mo.model.device = MOE_DEVICE_CPU;
    moe_model *m = model_options_load(&mo, "tokenize");
    int status = m ? 1 : model_options_load_status(&mo);
    int32_t *ids = NULL;
    size_t n = 0;
    moe_error err = {0};
    if (m && moe_tokenize(m, owned ? owned : text, len, add_special, parse_special, &ids, &n, &err) != MOE_OK)
        cli_fail("tokenize", &err);
    else if (m) {
        print_tokens(m, ids, n, ids_only);
        status = 0;
    }
    moe_free(ids);
    moe_model_free(m);
    free(owned);
    return status;
}
