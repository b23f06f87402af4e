/*
 * test_stop_filter.c — stop strings over text that arrives in pieces.
 */
#include <stdlib.h>

#include "engine/stop_filter.h"
#include "test.h"

typedef struct sink {
    char text[512];
    size_t len;
    int calls;
    int cancel_after; /* 0: never */
} sink;

static bool collect(const char *text, size_t len, void *user) {
    sink *s = user;
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->text[s->len] = '\0';
    return ++s->calls != s->cancel_after;
}

/* Feed `pieces` (NULL-terminated) through a filter with `stops`; returns
 * what came out and the final state. */
static stop_filter_state run(const char *const *stops, size_t n_stops, const char *const *pieces, sink *out) {
    stop_filter f;
    stop_filter_init(&f, stops, n_stops, collect, out);
    for (size_t i = 0; pieces[i]; i++) CHECK(stop_filter_push(&f, pieces[i], strlen(pieces[i])) == MOE_OK);
    stop_filter_finish(&f);
    stop_filter_state state = f.state;
    stop_filter_free(&f);
    return state;
}

static void test_no_stops_passes_everything_at_once(void) {
    const char *pieces[] = {"Hello", ", ", "world", NULL};
    sink out = {0};
    CHECK(run(NULL, 0, pieces, &out) == STOP_FILTER_GOING);
    CHECK(strcmp(out.text, "Hello, world") == 0);
    CHECK(out.calls == 3);
}

static void test_stop_split_across_pieces(void) {
    const char *stops[] = {"<|im_end|>"};
    const char *pieces[] = {"The answer", " is 4<|im", "_e", "nd|> and more", NULL};
    sink out = {0};
    CHECK(run(stops, 1, pieces, &out) == STOP_FILTER_STOPPED);
    CHECKF(strcmp(out.text, "The answer is 4") == 0, "got '%s'", out.text);
}

static void test_false_start_is_released(void) {
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"ST", "OR", "Y ST", NULL}; /* "STORY ST": "ST" at the end is held, then flushed */
    sink out = {0};
    CHECK(run(stops, 1, pieces, &out) == STOP_FILTER_GOING);
    CHECKF(strcmp(out.text, "STORY ST") == 0, "got '%s'", out.text);
}

static void test_held_back_while_undecided(void) {
    const char *stops[] = {"\n\nUser:"};
    stop_filter f;
    sink out = {0};
    stop_filter_init(&f, stops, 1, collect, &out);
    stop_filter_push(&f, "Fine.\n", 6);
    CHECKF(strcmp(out.text, "Fine.") == 0, "the newline could start the stop string; got '%s'", out.text);
    stop_filter_push(&f, "\nUs", 3);
    CHECK(strcmp(out.text, "Fine.") == 0);
    stop_filter_push(&f, "e", 1); /* "\n\nUse" no longer... still a prefix of "\n\nUser:" */
    CHECK(strcmp(out.text, "Fine.") == 0);
    stop_filter_push(&f, "d", 1); /* "\n\nUsed" is not */
    CHECKF(strcmp(out.text, "Fine.\n\nUsed") == 0, "got '%s'", out.text);
    stop_filter_free(&f);
}

static void test_earliest_of_several_stops(void) {
    const char *stops[] = {"END", "</s>", "##"};
    const char *pieces[] = {"a</s>b ## END", NULL};
    sink out = {0};
    CHECK(run(stops, 3, pieces, &out) == STOP_FILTER_STOPPED);
    CHECK(strcmp(out.text, "a") == 0);
}

static void test_stop_at_very_start(void) {
    const char *stops[] = {"<|eot_id|>"};
    const char *pieces[] = {"<|eot_id|>", "ignored", NULL};
    sink out = {0};
    CHECK(run(stops, 1, pieces, &out) == STOP_FILTER_STOPPED);
    CHECK(out.len == 0 && out.calls == 0);
}

static void test_callback_cancels(void) {
    const char *pieces[] = {"one ", "two ", "three", NULL};
    sink out = {.cancel_after = 2};
    CHECK(run(NULL, 0, pieces, &out) == STOP_FILTER_CANCELLED);
    CHECK(strcmp(out.text, "one two ") == 0);
}

static void test_empty_stop_string_is_ignored(void) {
    const char *stops[] = {""};
    const char *pieces[] = {"text", NULL};
    sink out = {0};
    CHECK(run(stops, 1, pieces, &out) == STOP_FILTER_GOING);
    CHECK(strcmp(out.text, "text") == 0);
}

int main(void) {
    RUN(test_no_stops_passes_everything_at_once);
    RUN(test_stop_split_across_pieces);
    RUN(test_false_start_is_released);
    RUN(test_held_back_while_undecided);
    RUN(test_earliest_of_several_stops);
    RUN(test_stop_at_very_start);
    RUN(test_callback_cancels);
    RUN(test_empty_stop_string_is_ignored);
    return test_summary();
}
