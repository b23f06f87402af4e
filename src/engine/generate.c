/*
 * generate.c — the generation loop: prompt, then sample, feed, stream.
 *
 * Text reaches the callback through two filters: the streaming detokenizer
 * (whole UTF-8 sequences only) and the stop-string filter (stop_filter.h).
 */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "engine/engine_internal.h"
#include "engine/stop_filter.h"

typedef struct generation {
    moe_session *s;
    tokenizer_detok *detok;
    stop_filter filter;
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
    if (stop_filter_push(&g->filter, text, len) != MOE_OK) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory"), -1;
    if (g->filter.state != STOP_FILTER_GOING) {
        r->finish = g->filter.state == STOP_FILTER_STOPPED ? MOE_FINISH_STOP : MOE_FINISH_CANCELLED;
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
    if (g->filter.state != STOP_FILTER_GOING) return;
    tokenizer_detok_flush(g->detok, &text, &len);
    if (len) stop_filter_push(&g->filter, text, len);
    stop_filter_finish(&g->filter);
}

moe_status moe_generate(moe_session *s, const int32_t *prompt, size_t n_prompt, const moe_generate_params *params,
                        moe_generate_result *result, moe_error *err) {
    moe_generate_params none = {0};
    const moe_generate_params *p = params ? params : &none;
    memset(result, 0, sizeof *result);
    result->n_prompt = (int)n_prompt;
    generation g = {.s = s};
    stop_filter_init(&g.filter, p->stop, p->n_stop, p->on_text, p->user);
    moe_status st = tokenizer_detok_new(s->model->tok, 0, &g.detok, err);
    double start = monotonic_seconds();
    if (st == MOE_OK) st = moe_session_feed(s, prompt, n_prompt, err);
    double prompt_done = monotonic_seconds();
    result->prompt_seconds = prompt_done - start;
    int more = st == MOE_OK ? 1 : -1;
    while (more == 1) more = step(&g, p, result, err);
    if (more == 0) finish_text(&g);
    else st = err ? err->code : MOE_ERR_INVALID_ARG;
    result->generate_seconds = monotonic_seconds() - prompt_done;
    tokenizer_detok_free(g.detok);
    stop_filter_free(&g.filter);
    return st;
}
