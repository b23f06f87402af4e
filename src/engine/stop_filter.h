/*
 * stop_filter.h — stop strings over streamed text.
 *
 * Generated text arrives piece by piece; a stop string may straddle pieces.
 * The filter passes text on as soon as it is certain not to be part of a
 * stop string, holds back the tail that could still grow into one, and on a
 * match passes on only the text before it. The stop string itself is never
 * shown, not even in part.
 */
#ifndef MOE_ENGINE_STOP_FILTER_H
#define MOE_ENGINE_STOP_FILTER_H

#include <stdbool.h>
#include <stddef.h>

#include "moe.h"

typedef enum stop_filter_state {
    STOP_FILTER_GOING,
    STOP_FILTER_STOPPED,   /* a stop string was found */
    STOP_FILTER_CANCELLED, /* the callback returned false */
} stop_filter_state;

typedef struct stop_filter {
    const char *const *stops;
    size_t n_stops;
    moe_text_callback emit; /* may be NULL */
    void *user;
    char *pending; /* received, not yet passed on */
    size_t len, cap;
    stop_filter_state state;
} stop_filter;

void stop_filter_init(stop_filter *f, const char *const *stops, size_t n_stops, moe_text_callback emit, void *user);
void stop_filter_free(stop_filter *f);

/* Add text; passes on what is final. MOE_ERR_NOMEM on allocation failure. */
moe_status stop_filter_push(stop_filter *f, const char *text, size_t len);

/* The generation ended: pass on whatever is held back (unless stopped). */
void stop_filter_finish(stop_filter *f);

#endif
