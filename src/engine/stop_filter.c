/* stop_filter.c — see stop_filter.h. */
#include "engine/stop_filter.h"

#include <stdlib.h>
#include <string.h>

void stop_filter_init(stop_filter *f, const char *const *stops, size_t n_stops, moe_text_callback emit, void *user) {
    *f = (stop_filter){.stops = stops, .n_stops = stops ? n_stops : 0, .emit = emit, .user = user};
}

void stop_filter_free(stop_filter *f) {
    free(f->pending);
    f->pending = NULL;
}

static void pass_on(stop_filter *f, size_t n) {
    if (n == 0) return;
    if (f->emit && !f->emit(f->pending, n, f->user)) f->state = STOP_FILTER_CANCELLED;
    memmove(f->pending, f->pending + n, f->len - n);
    f->len -= n;
}

/* Length of the longest tail of the pending text that is a proper prefix of
 * a stop string: those bytes must wait for more text. */
static size_t undecided_tail(const stop_filter *f) {
    size_t hold = 0;
    for (size_t s = 0; s < f->n_stops; s++) {
        size_t stop_len = strlen(f->stops[s]);
        for (size_t k = stop_len ? stop_len - 1 : 0; k > hold; k--)
            if (k <= f->len && memcmp(f->pending + f->len - k, f->stops[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Where the earliest stop string starts in the pending text, or -1. */
static long earliest_stop(const stop_filter *f) {
    long first = -1;
    for (size_t s = 0; s < f->n_stops; s++) {
        size_t stop_len = strlen(f->stops[s]);
        if (stop_len == 0) continue;
        for (size_t at = 0; at + stop_len <= f->len; at++)
            if (memcmp(f->pending + at, f->stops[s], stop_len) == 0) {
                if (first < 0 || (long)at < first) first = (long)at;
                break;
            }
    }
    return first;
}

moe_status stop_filter_push(stop_filter *f, const char *text, size_t len) {
    if (f->state != STOP_FILTER_GOING || len == 0) return MOE_OK;
    if (f->len + len > f->cap) {
        size_t cap = (f->len + len) * 2 + 64;
        char *grown = realloc(f->pending, cap);
        if (!grown) return MOE_ERR_NOMEM;
        f->pending = grown;
        f->cap = cap;
    }
    memcpy(f->pending + f->len, text, len);
    f->len += len;
    long stop = earliest_stop(f);
    if (stop >= 0) {
        f->len = (size_t)stop;
        pass_on(f, f->len);
        if (f->state == STOP_FILTER_GOING) f->state = STOP_FILTER_STOPPED;
        return MOE_OK;
    }
    pass_on(f, f->len - undecided_tail(f));
    return MOE_OK;
}

void stop_filter_finish(stop_filter *f) {
    if (f->state == STOP_FILTER_GOING) pass_on(f, f->len);
}
