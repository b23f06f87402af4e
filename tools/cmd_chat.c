/*
 * cmd_chat.c — `moe chat`: an interactive, multi-turn conversation.
 *
 * Each turn renders the whole conversation with the chat template,
 * tokenizes it, and feeds only what the session's cache does not already
 * hold (the common prefix with the tokens fed so far is kept), so a long
 * conversation does not re-process its history every turn.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_model.h"

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

typedef struct conversation {
    moe_chat_message *messages;
    char **owned; /* contents we allocated, parallel to messages */
    size_t n, cap;
} conversation;

static int conversation_add(conversation *c, const char *role, char *content) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        moe_chat_message *m = realloc(c->messages, cap * sizeof *m);
        if (m) c->messages = m;
        char **o = realloc(c->owned, cap * sizeof *o);
        if (o) c->owned = o;
        if (!m || !o) return -1;
        c->cap = cap;
    }
    c->messages[c->n] = (moe_chat_message){role, content};
    c->owned[c->n++] = content;
    return 0;
}

static void conversation_clear(conversation *c, size_t keep) {
    while (c->n > keep) free(c->owned[--c->n]);
}

typedef struct reply {
    char *text;
    size_t len, cap;
} reply;

static bool on_text(const char *text, size_t len, void *user) {
    reply *r = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *grown = realloc(r->text, cap);
        if (!grown) return false;
        r->text = grown, r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = '\0';
    return !interrupted;
}

typedef struct chat_args {
    model_options model;
    const char *template_name, *system;
    long max_tokens;
} chat_args;

/* Tokenize the rendered conversation and rewind the session to the longest
 * prefix it already holds; *ids gets the tokens still to feed. */
static moe_status new_tokens(moe_model *m, moe_session *s, const char *text, int32_t **ids, size_t *n, moe_error *err) {
    moe_status st = moe_tokenize(m, text, strlen(text), true, true, ids, n, err);
    if (st != MOE_OK) return st;
    int cached;
    const int32_t *have = moe_session_tokens(s, &cached);
    size_t common = 0;
    while (common < *n && (int)common < cached && have[common] == (*ids)[common]) common++;
    if (common == *n && common > 0) common--; /* feed at least one token for fresh logits */
    memmove(*ids, *ids + common, (*n - common) * sizeof **ids);
    *n -= common;
    return moe_session_rewind(s, (int)common, err);
}

/* One assistant turn: render, feed what is new, stream the reply. */
static moe_status take_turn(moe_model *m, moe_session *s, const chat_args *a, conversation *c, moe_error *err) {
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *const *stops = NULL;
    reply r = {0};
    moe_status st = moe_chat_format(m, a->template_name, c->messages, c->n, true, &text, err);
    if (st == MOE_OK) st = moe_chat_stops(m, a->template_name, &stops, err);
    if (st == MOE_OK) st = new_tokens(m, s, text, &ids, &n_ids, err);
    size_t n_stops = 0;
    while (stops && stops[n_stops]) n_stops++;
    moe_generate_params gp = {.max_tokens = (int)a->max_tokens, .stop = stops, .n_stop = n_stops,
                              .on_text = on_text, .user = &r};
    moe_generate_result result;
    if (st == MOE_OK) st = moe_generate(s, ids, n_ids, &gp, &result, err);
    printf("\n");
    if (st == MOE_OK && result.finish == MOE_FINISH_LENGTH) fprintf(stderr, "[reply cut at the token limit]\n");
    if (st == MOE_OK && conversation_add(c, "assistant", r.text ? r.text : strdup("")) != 0)
        st = MOE_ERR_NOMEM;
    else if (st != MOE_OK)
        free(r.text);
    moe_free(ids);
    moe_free(text);
    return st;
}

static char *read_line(bool prompt) {
    if (prompt) fputs("> ", stdout), fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = getline(&line, &cap, stdin);
    if (len < 0) {
        free(line);
        return NULL;
    }
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    return line;
}

static int chat_loop(moe_model *m, moe_session *s, const chat_args *a) {
    conversation c = {0};
    bool tty = isatty(STDIN_FILENO);
    size_t base = 0;
    if (a->system && conversation_add(&c, "system", strdup(a->system)) == 0) base = 1;
    if (tty) fprintf(stderr, "moe chat: type a message; /reset starts over, /exit or Ctrl-D ends.\n");
    int status = 0;
    for (char *line; (line = read_line(tty)) != NULL;) {
        if (strcmp(line, "/exit") == 0) {
            free(line);
            break;
        }
        if (strcmp(line, "/reset") == 0 || line[0] == '\0') {
            if (line[0]) conversation_clear(&c, base), moe_session_reset(s);
            free(line);
            continue;
        }
        moe_error err = {0};
        interrupted = 0;
        if (conversation_add(&c, "user", line) != 0 || take_turn(m, s, a, &c, &err) != MOE_OK) {
            status = cli_fail("chat", &err);
            break;
        }
    }
    conversation_clear(&c, 0);
    free(c.messages);
    free(c.owned);
    return status;
}

static void print_help(void) {
    printf("usage: moe chat -m FILE [options]\n\n"
           "An interactive conversation using the model's chat template. Lines from stdin\n"
           "are user turns; replies stream to stdout. /reset starts over, /exit or Ctrl-D\n"
           "ends; Ctrl-C stops the reply being written.\n\n"
           "  --system TEXT            a system message\n"
           "  --chat-template NAME     chatml, llama3 or mistral instead of the file's\n"
           "  -n, --n-predict N        longest reply in tokens (default: 1024)\n"
           "  -h, --help               this text\n\n");
    model_options_print_help();
}

static int parse(int argc, char **argv, chat_args *a) {
    struct option options[MODEL_OPTIONS_COUNT + 5] = {
        {"system", required_argument, NULL, 's'}, {"chat-template", required_argument, NULL, 'T'},
        {"n-predict", required_argument, NULL, 'n'}, {"help", no_argument, NULL, 'h'},
    };
    memcpy(options + 4, model_long_options, sizeof model_long_options);
    int c, handled;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:h", options, NULL)) != -1) {
        if ((handled = model_options_parse(&a->model, "chat", c, optarg)) != 0) {
            if (handled < 0) return 2;
            continue;
        }
        switch (c) {
        case 's': a->system = optarg; break;
        case 'T': a->template_name = optarg; break;
        case 'n':
            if (!cli_parse_int(optarg, 1, 1 << 24, &a->max_tokens))
                return cli_usage_error("chat", "--n-predict wants a positive number, not '%s'", optarg);
            break;
        case 'h': print_help(); return -1;
        default: return cli_usage_error("chat", "unknown option");
        }
    }
    if (optind < argc) return cli_usage_error("chat", "unexpected argument '%s'", argv[optind]);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    chat_args a = {.max_tokens = 1024};
    model_options_init(&a.model);
    int status = parse(argc, argv, &a);
    if (status) return status < 0 ? 0 : status;
    moe_model *m = model_options_load(&a.model, "chat");
    if (!m) return model_options_load_status(&a.model);
    moe_session *s = NULL;
    moe_error err = {0};
    const char *const *stops;
    /* Check the template before the first turn, so a bad one is one error. */
    if (moe_chat_stops(m, a.template_name, &stops, &err) != MOE_OK ||
        moe_session_new(m, &a.model.session, &s, &err) != MOE_OK) {
        status = cli_fail("chat", &err);
    } else {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        status = chat_loop(m, s, &a);
    }
    moe_session_free(s);
    moe_model_free(m);
    return status;
}
