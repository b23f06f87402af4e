/*
 * generate.c — the generation loop: prompt, then sample, feed, stream.
 *
 * Text reaches the callback through two filters: the streaming detokenizer
 * (whole UTF-8 sequences only) and the stop-string filter, which holds back
 * the tail of the text that could still grow into a stop string, so a stop
 * string is never shown in part.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "engine/engine_internal.h"

typedef struct text_filter {
    const moe_generate_params *params;
    char *pending; /* text received but not yet emitted */
    size_t len, cap;
    bool stopped;   /* a stop string was found */
    bool cancelled; /* the callback asked to stop */
} text_filter;

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(text_filter *f, size_t n) {
    if (n == 0) return;
    if (f->params->on_text && !f->params->on_text(f->pending, n, f->params->user)) f->cancelled = true;
    memmove(f->pending, f->pending + n, f->len - n);
    f->len -= n;
}

/* Length of the longest suffix of the pending text that is a proper prefix
 * of some stop string: those bytes must wait for the next token. */
static size_t held_back(const text_filter *f) {
    size_t hold = 0;
    for (size_t s = 0; s < f->params->n_stop; s++) {
        const char *stop = f->params->stop[s];
        size_t stop_len = strlen(stop);
        for (size_t k = stop_len - 1; k > hold && stop_len > 0; k--)
            if (k <= f->len && memcmp(f->pending + f->len - k, stop, k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Where the earliest stop string starts in the pending text, or -1. */
static long find_stop(const text_filter *f) {
    long first = -1;
    for (size_t s = 0; s < f->params->n_stop; s++) {
        size_t stop_len = strlen(f->params->stop[s]);
        if (stop_len == 0 || stop_len > f->len) continue;
        for (size_t at = 0; at + stop_len <= f->len; at++)
            if (memcmp(f->pending + at, f->params->stop[s], stop_len) == 0) {
                if (first < 0 || (long)at < first) first = (long)at;
                break;
            }
    }
    return first;
}

static int filter_push(text_filter *f, const char *text, size_t n) {
    if (f->len + n > f->cap) {
        size_t cap = (f->len + n) * 2 + 64;
        char *grown = realloc(f->pending, cap);
        if (!grown) return -1;
        f->pending = grown;
        f->cap = cap;
    }
    memcpy(f->pending + f->len, text, n);
    f->len += n;
    long stop = find_stop(f);
    if (stop >= 0) {
        f->len = (size_t)stop;
        f->stopped = true;
        emit(f, f->len);
        return 0;
    }
    emit(f, f->len - held_back(f));
    return 0;
}

typedef struct generation {
    moe_session *s;
    tokenizer_detok *detok;
    text_filter filter;
} generation;

/* Sample a token, stream its text; returns 1 to go on, 0 when finished, -1 on error. */
static int step(generation *g, const moe_generate_params *p, moe_generate_result *r, moe_error *err) {
    int32_t token;
    if (moe_session_sample(g->s, &token, err) != MOE_OK) return -1;
    r->n_generated++;
    if (moe_token_is_eog(g->s->model, token)) {
        r->finish = MOE_FINISH_STOP;
        return 0;
    }
    const char *text;
    size_t len;
    if (tokenizer_detok_push(g->detok, token, &text, &len, err) != MOE_OK) return -1;
    if (filter_push(&g->filter, text, len) != 0) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory"), -1;
    if (g->filter.stopped || g->filter.cancelled) {
        r->finish = g->filter.stopped ? MOE_FINISH_STOP : MOE_FINISH_CANCELLED;
        return 0;
    }
    bool out_of_tokens = p->max_tokens > 0 && r->n_generated >= p->max_tokens;
    if (out_of_tokens || moe_session_position(g->s) >= moe_session_n_ctx(g->s)) {
        r->finish = MOE_FINISH_LENGTH;
        return 0;
    }
    return moe_session_feed(g->s, &token, 1, err) == MOE_OK ? 1 : -1;
}

static void finish_text(generation *g) {
    const char *text;
    size_t len;
    if (g->filter.stopped || g->filter.cancelled) return;
    tokenizer_detok_flush(g->detok, &text, &len);
    if (len) filter_push(&g->filter, text, len);
    if (!g->filter.stopped) emit(&g->filter, g->filter.len);
}

moe_status moe_generate(moe_session *s, const int32_t *prompt, size_t n_prompt, const moe_generate_params *params,
                        moe_generate_result *result, moe_error *err) {
    moe_generate_params none = {0};
    const moe_generate_params *p = params ? params : &none;
    memset(result, 0, sizeof *result);
    result->n_prompt = (int)n_prompt;
    generation g = {.s = s, .filter = {.params = p}};
    moe_status st = tokenizer_detok_new(s->model->tok, 0, &g.detok, err);
    double start = seconds_now();
    if (st == MOE_OK) st = moe_session_feed(s, prompt, n_prompt, err);
    double prompt_done = seconds_now();
    result->prompt_seconds = prompt_done - start;
    int more = st == MOE_OK ? 1 : -1;
    while (more == 1) more = step(&g, p, result, err);
    if (more == 0) finish_text(&g);
    else st = err ? err->code : MOE_ERR_INVALID_ARG;
    result->generate_seconds = seconds_now() - prompt_done;
    tokenizer_detok_free(g.detok);
    free(g.filter.pending);
    return st;
}
