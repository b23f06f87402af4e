/*
 * test_sample.c — the sampler: each stage of the chain against a hand-made
 * or brute-force answer, the distribution of draws, reproducibility, bad
 * logits and bad parameters, and the time one draw takes on a 152k
 * vocabulary (printed, not checked).
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/clock.h"
#include "sample/sample.h"
#include "test.h"

/* Test data from an integer generator, so the logits are the same bits on
 * every machine (libm is not involved). */
static uint64_t test_rng_state = 88172645463325252ULL;

static uint64_t test_rng_next(void) {
    test_rng_state ^= test_rng_state << 13;
    test_rng_state ^= test_rng_state >> 7;
    test_rng_state ^= test_rng_state << 17;
    return test_rng_state;
}

/* Uniform in [lo, hi), exactly a multiple of 2^-24 of the range. */
static float test_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(test_rng_next() >> 40) * 0x1.0p-24f;
}

/* Standard normal by Box-Muller (uses libm: only for the timing data and
 * the brute-force comparison, whose answers are computed from the same
 * values). */
static float test_normal(void) {
    const double u1 = ((double)(test_rng_next() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = (double)(test_rng_next() >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static sampler make_sampler(sampler_params params, int32_t n_vocab) {
    sampler s;
    moe_error err = {0};
    const moe_status status = sampler_init(&s, &params, n_vocab, &err);
    CHECKF(status == MOE_OK, "%s", err.message);
    return s;
}

/* logits[i] = log(probs[i]): softmax at T = 1 gives back probs. */
static void logits_from_probs(const double *probs, float *logits, int n) {
    for (int i = 0; i < n; i++) logits[i] = (float)log(probs[i]);
}

static void test_greedy_picks_argmax_lowest_id_on_ties(void) {
    sampler_params params = sampler_params_default();
    params.temperature = 0.0f;
    sampler s = make_sampler(params, 6);
    float logits[6] = {0.5f, 2.0f, -1.0f, 3.0f, 3.0f, -INFINITY};
    CHECK(sampler_sample(&s, logits) == 3);
    CHECK(sampler_last_prob(&s) == 1.0f);
    float flat[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    CHECK(sampler_sample(&s, flat) == 0);
    sampler_free(&s);
}

static void test_top_k_1_equals_greedy(void) {
    enum { N = 5000 };
    static float logits[N];
    sampler_params params = sampler_params_default();
    params.top_k = 1;
    params.temperature = 1.5f;
    sampler s = make_sampler(params, N);
    params.temperature = 0.0f;
    sampler greedy = make_sampler(params, N);
    for (int round = 0; round < 50; round++) {
        /* Coarse values, so ties for the maximum happen. */
        for (int i = 0; i < N; i++) logits[i] = (float)(int)test_uniform(0.0f, 40.0f);
        const int32_t expected = sampler_sample(&greedy, logits);
        CHECKF(sampler_sample(&s, logits) == expected, "round %d", round);
        CHECK(sampler_last_prob(&s) == 1.0f);
    }
    sampler_free(&s);
    sampler_free(&greedy);
}

/* Pearson's statistic of draws from logits against expected probabilities. */
static double chi_square(sampler *s, const float *logits, const double *expected, int n, int draws) {
    int counts[16] = {0};
    float work[16];
    for (int d = 0; d < draws; d++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        const int32_t t = sampler_sample(s, work);
        if (t >= 0 && t < n) counts[t]++;
    }
    double chi2 = 0.0;
    for (int i = 0; i < n; i++) {
        const double e = expected[i] * draws;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi2;
}

static void softmax_at(const float *logits, double temperature, double *probs, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += probs[i] = exp(logits[i] / temperature);
    for (int i = 0; i < n; i++) probs[i] /= total;
}

/* 200k draws; 5 degrees of freedom, whose 99.9% quantile is 20.5. The
 * statistic against the wrong temperature shows the test can fail. */
static void test_draws_follow_the_softmax(void) {
    enum { N = 6, DRAWS = 200000 };
    const float logits[N] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f};
    double at_1[N], at_07[N];
    softmax_at(logits, 1.0, at_1, N);
    softmax_at(logits, 0.7, at_07, N);

    sampler_params params = sampler_params_default();
    params.seed = 7;
    sampler s = make_sampler(params, N);
    const double chi2 = chi_square(&s, logits, at_1, N, DRAWS);
    CHECKF(chi2 < 20.5, "chi-square %.2f at T = 1", chi2);
    sampler_free(&s);

    params.temperature = 0.7f;
    s = make_sampler(params, N);
    const double chi2_07 = chi_square(&s, logits, at_07, N, DRAWS);
    CHECKF(chi2_07 < 20.5, "chi-square %.2f at T = 0.7", chi2_07);
    sampler_reset(&s);
    const double wrong = chi_square(&s, logits, at_1, N, DRAWS);
    CHECKF(wrong > 1000.0, "chi-square %.2f of T = 0.7 draws against T = 1", wrong);
    sampler_free(&s);
}

/* Draws many times with the given parameters; every token must be in
 * `kept` and come with last_prob == probs[t] / (mass of kept), and every
 * kept token must turn up. */
static void check_kept_set(sampler_params params, const double *probs, int n, const int *kept, const char *what) {
    float logits[16] = {0}, work[16];
    logits_from_probs(probs, logits, n);
    double mass = 0.0;
    for (int i = 0; i < n; i++) mass += kept[i] ? probs[i] : 0.0;
    sampler s = make_sampler(params, n);
    int seen[16] = {0};
    for (int d = 0; d < 4000; d++) {
        memcpy(work, logits, sizeof work);
        const int32_t t = sampler_sample(&s, work);
        if (t < 0 || t >= n) {
            CHECKF(0, "%s: sampled %d", what, t);
            break;
        }
        seen[t] = 1;
        CHECKF(kept[t], "%s: drew token %d, which should have been filtered out", what, t);
        CHECKF(fabs(sampler_last_prob(&s) - probs[t] / mass) < 1e-5, "%s: token %d prob %.6f, expected %.6f", what,
               t, sampler_last_prob(&s), probs[t] / mass);
    }
    for (int i = 0; i < n; i++) CHECKF(seen[i] == kept[i], "%s: token %d kept %d, seen %d", what, i, kept[i], seen[i]);
    sampler_free(&s);
}

/* By falling probability: 1 (0.40), 2 (0.25), 3 (0.20), 4 (0.10), 0 (0.05). */
static void test_top_p_keeps_the_smallest_prefix(void) {
    const double probs[5] = {0.05, 0.40, 0.25, 0.20, 0.10};
    sampler_params params = sampler_params_default();
    params.top_p = 0.6f; /* 0.40 < 0.6 <= 0.65 */
    check_kept_set(params, probs, 5, (const int[]){0, 1, 1, 0, 0}, "top_p 0.6");
    params.top_p = 0.66f; /* 0.65 < 0.66 <= 0.85 */
    check_kept_set(params, probs, 5, (const int[]){0, 1, 1, 1, 0}, "top_p 0.66");
    params.top_p = 0.3f; /* the first alone already has 0.40 */
    check_kept_set(params, probs, 5, (const int[]){0, 1, 0, 0, 0}, "top_p 0.3");
    params.top_p = 0.96f; /* 0.95 < 0.96: everything */
    check_kept_set(params, probs, 5, (const int[]){1, 1, 1, 1, 1}, "top_p 0.96");
}

static void test_top_k_keeps_the_k_most_likely(void) {
    const double probs[5] = {0.05, 0.40, 0.25, 0.20, 0.10};
    sampler_params params = sampler_params_default();
    params.top_k = 3;
    check_kept_set(params, probs, 5, (const int[]){0, 1, 1, 1, 0}, "top_k 3");
}

static void test_min_p_drops_tokens_below_the_fraction_of_the_best(void) {
    const double probs[5] = {0.5, 0.3, 0.1, 0.06, 0.04};
    sampler_params params = sampler_params_default();
    params.min_p = 0.15f; /* threshold 0.075: keeps 0.5, 0.3, 0.1 */
    check_kept_set(params, probs, 5, (const int[]){1, 1, 1, 0, 0}, "min_p 0.15");
    params.min_p = 0.19f; /* threshold 0.095 */
    params.top_p = 0.7f;  /* top-p first: 0.5 + 0.3 */
    check_kept_set(params, probs, 5, (const int[]){1, 1, 0, 0, 0}, "top_p 0.7 then min_p");
}

/* Top-p over a large vocabulary, where the bucketed selection matters,
 * against a full sort computed here. */
static int compare_weights_desc(const void *pa, const void *pb) {
    const double *a = pa, *b = pb; /* {weight, id} pairs */
    if (a[0] != b[0]) return a[0] < b[0] ? 1 : -1;
    return a[1] < b[1] ? -1 : 1;
}

static void test_top_p_matches_a_full_sort_on_a_large_vocabulary(void) {
    enum { N = 50000 };
    const float temperature = 0.8f, top_p = 0.9f;
    float *logits = malloc(N * sizeof *logits), *work = malloc(N * sizeof *work);
    double *pairs = malloc(2 * N * sizeof *pairs);
    char *kept = calloc(N, 1);
    double *weight = malloc(N * sizeof *weight);
    for (int i = 0; i < N; i++) logits[i] = 2.0f * test_normal();
    float max_logit = logits[0];
    for (int i = 1; i < N; i++) max_logit = fmaxf(max_logit, logits[i]);
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        weight[i] = exp(((double)logits[i] - max_logit) / temperature);
        total += weight[i];
        pairs[2 * i] = weight[i];
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, N, 2 * sizeof *pairs, compare_weights_desc);
    double mass = 0.0;
    int n_kept = 0;
    while (mass < top_p * total) {
        kept[(int)pairs[2 * n_kept + 1]] = 1;
        mass += pairs[2 * n_kept++];
    }

    sampler_params params = sampler_params_default();
    params.temperature = temperature;
    params.top_p = top_p;
    sampler s = make_sampler(params, N);
    int outside = 0, bad_prob = 0;
    for (int d = 0; d < 3000; d++) {
        memcpy(work, logits, N * sizeof *work);
        const int32_t t = sampler_sample(&s, work);
        if (t < 0 || !kept[t]) {
            outside++;
            continue;
        }
        if (fabs(sampler_last_prob(&s) / (weight[t] / mass) - 1.0) > 1e-4) bad_prob++;
    }
    CHECKF(outside == 0, "%d of 3000 draws outside the %d-token nucleus", outside, n_kept);
    CHECKF(bad_prob == 0, "%d draws with a probability unlike the full sort's", bad_prob);
    sampler_free(&s);
    free(logits);
    free(work);
    free(pairs);
    free(kept);
    free(weight);
}

/* Window of 4 after accepting 0 2 4 2 7: token 0 has left it, 2 is there
 * twice, 4 and 7 once. */
static void test_penalties_change_exactly_the_seen_tokens(void) {
    enum { N = 10 };
    const float original[N] = {1.0f, -2.0f, 3.0f, 0.5f, -0.5f, 2.0f, 0.0f, -1.5f, 4.0f, 1.5f};
    sampler_params params = sampler_params_default();
    params.temperature = 0.0f;
    params.repetition_penalty = 1.3f;
    params.presence_penalty = 0.4f;
    params.frequency_penalty = 0.25f;
    params.penalty_last_n = 4;
    sampler s = make_sampler(params, N);
    const int32_t history[] = {0, 2, 4, 2, 7};
    for (size_t i = 0; i < sizeof history / sizeof *history; i++) CHECK(sampler_accept(&s, history[i]) == MOE_OK);

    float logits[N];
    memcpy(logits, original, sizeof logits);
    CHECK(sampler_sample(&s, logits) == 8);
    const int counts[N] = {0, 0, 2, 0, 1, 0, 0, 1, 0, 0};
    for (int t = 0; t < N; t++) {
        if (!counts[t]) {
            CHECKF(logits[t] == original[t], "token %d changed: %g -> %g", t, original[t], logits[t]);
            continue;
        }
        const float l = original[t];
        const float repeated = l > 0.0f ? l / 1.3f : l * 1.3f;
        const float expected = repeated - ((float)counts[t] * 0.25f + 0.4f);
        CHECKF(logits[t] == expected, "token %d: %.9g, expected %.9g", t, logits[t], expected);
    }
    /* The same numbers worked by hand: 3 / 1.3 - 0.9, -0.5 * 1.3 - 0.65, -1.5 * 1.3 - 0.65. */
    CHECK_NEAR(logits[2], 1.4076923, 1e-5);
    CHECK_NEAR(logits[4], -1.3, 1e-5);
    CHECK_NEAR(logits[7], -2.6, 1e-5);

    sampler_reset(&s);
    memcpy(logits, original, sizeof logits);
    sampler_sample(&s, logits);
    CHECK(memcmp(logits, original, sizeof logits) == 0);
    sampler_free(&s);
}

static void test_repetition_penalty_can_change_the_winner(void) {
    sampler_params params = sampler_params_default();
    params.temperature = 0.0f;
    params.repetition_penalty = 2.0f;
    sampler s = make_sampler(params, 3);
    float logits[3] = {1.0f, 3.0f, 2.0f};
    CHECK(sampler_accept(&s, 1) == MOE_OK);
    CHECK(sampler_sample(&s, logits) == 2); /* 3 / 2 = 1.5 < 2 */
    sampler_free(&s);
}

static void fill_fixed_logits(float *logits, int n) {
    test_rng_state = 0x243F6A8885A308D3ULL;
    for (int i = 0; i < n; i++) logits[i] = test_uniform(-6.0f, 6.0f);
}

static void generate(sampler *s, const float *logits, float *work, int n, int32_t *out, int count) {
    for (int i = 0; i < count; i++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        out[i] = sampler_sample(s, work);
        sampler_accept(s, out[i] >= 0 ? out[i] : 0);
    }
}

static void test_same_seed_same_tokens_different_seed_different(void) {
    enum { N = 1000, COUNT = 200 };
    static float logits[N], work[N];
    int32_t a[COUNT], b[COUNT], c[COUNT], d[COUNT];
    fill_fixed_logits(logits, N);
    sampler_params params = sampler_params_default();
    params.temperature = 0.9f;
    params.top_p = 0.95f;
    params.repetition_penalty = 1.1f;
    params.seed = 42;
    sampler s = make_sampler(params, N);
    generate(&s, logits, work, N, a, COUNT);
    sampler_reset(&s);
    generate(&s, logits, work, N, b, COUNT);
    sampler_free(&s);
    s = make_sampler(params, N);
    generate(&s, logits, work, N, c, COUNT);
    sampler_free(&s);
    params.seed = 43;
    s = make_sampler(params, N);
    generate(&s, logits, work, N, d, COUNT);
    sampler_free(&s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) == 0);
    int differ = 0;
    for (int i = 0; i < COUNT; i++) differ += a[i] != d[i];
    CHECKF(differ > COUNT / 2, "seeds 42 and 43 differ in only %d of %d tokens", differ, COUNT);
}

/* The tokens one seed gives on the machine this test was written on: any
 * machine that disagrees breaks the promise of sample.h. (They
 * changed once, when the top-k candidates were put in rank order.) */
static void test_seeded_tokens_are_the_same_on_every_machine(void) {
    enum { N = 1000, COUNT = 12 };
    static float logits[N], work[N];
    int32_t got[COUNT];
    const int32_t expected[COUNT] = {911, 22, 450, 561, 264, 439, 109, 487, 40, 326, 303, 400};
    fill_fixed_logits(logits, N);
    sampler_params params = sampler_params_default();
    params.temperature = 0.8f;
    params.top_k = 200;
    params.top_p = 0.9f;
    params.min_p = 0.01f;
    params.frequency_penalty = 0.5f;
    params.seed = 20240601;
    sampler s = make_sampler(params, N);
    generate(&s, logits, work, N, got, COUNT);
    sampler_free(&s);
    for (int i = 0; i < COUNT; i++) CHECKF(got[i] == expected[i], "token %d: %d, expected %d", i, got[i], expected[i]);
}

/* The n largest logits by the chain's ranking (larger, then lower id), by
 * brute force, as a GPU's top list would hand them over. */
static int32_t brute_top(const float *logits, int32_t n_vocab, int32_t n, sampler_candidate *top) {
    int32_t found = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        int32_t at = found < n ? found++ : n;
        while (at > 0 && (logits[i] > top[at - 1].value)) {
            if (at < n) top[at] = top[at - 1];
            at--;
        }
        if (at < n) top[at] = (sampler_candidate){i, logits[i]};
    }
    return found;
}

/* sampler_sample_top on the top logits and the penalised tokens' logits
 * against sampler_sample on all of them: the same tokens, probabilities
 * and generator, step after step, for greedy and top-k chains with and
 * without penalties that push tokens down or pull them up, filters on,
 * and logits with ties and -inf. */
static void test_sampling_from_the_top_equals_sampling_from_all(void) {
    enum { N = 3000, STEPS = 150, CASES = 6 };
    static float logits[N], work[N], pen_logits[N];
    static sampler_candidate top[N];
    static int32_t pen_ids[N];
    sampler_params cases[CASES];
    for (int c = 0; c < CASES; c++) cases[c] = sampler_params_default();
    cases[0].temperature = 0.0f;
    cases[1].temperature = 0.0f, cases[1].repetition_penalty = 1.3f;
    cases[2].temperature = 0.8f, cases[2].top_k = 40, cases[2].top_p = 0.95f, cases[2].min_p = 0.05f;
    cases[3].temperature = 1.1f, cases[3].top_k = 200, cases[3].frequency_penalty = 0.4f, cases[3].penalty_last_n = 32;
    cases[4].temperature = 0.7f, cases[4].top_k = 7, cases[4].repetition_penalty = 0.5f,
    cases[4].presence_penalty = -1.5f; /* seen tokens climb */
    cases[5].temperature = 2.0f, cases[5].top_k = 1;
    for (int c = 0; c < CASES; c++) {
        cases[c].seed = 1000 + (uint64_t)c;
        sampler full = make_sampler(cases[c], N), part = make_sampler(cases[c], N);
        for (int step = 0; step < STEPS; step++) {
            for (int i = 0; i < N; i++) logits[i] = (float)(int)test_uniform(-8.0f, 8.0f) * 0.5f; /* many ties */
            for (int i = 0; i < N; i += 17) logits[i] = -INFINITY;
            memcpy(work, logits, sizeof logits);
            const int32_t expected = sampler_sample(&full, work);
            const int32_t need = sampler_top_needed(&part);
            CHECKF(need > 0 && need <= N, "case %d: need %d", c, need);
            const int32_t n_top = brute_top(logits, N, need, top);
            const int32_t n_pen = sampler_penalized_tokens(&part, pen_ids);
            for (int32_t i = 0; i < n_pen; i++) pen_logits[i] = logits[pen_ids[i]];
            const int32_t got = sampler_sample_top(&part, top, n_top, pen_logits);
            CHECKF(got == expected, "case %d step %d: %d from the top, %d from all", c, step, got, expected);
            CHECKF(sampler_last_prob(&part) == sampler_last_prob(&full), "case %d step %d: probability %g vs %g", c,
                   step, sampler_last_prob(&part), sampler_last_prob(&full));
            if (got != expected || got < 0) break;
            sampler_accept(&full, got);
            sampler_accept(&part, got);
        }
        sampler_free(&full);
        sampler_free(&part);
    }
    sampler_params off = sampler_params_default();
    sampler s = make_sampler(off, N);
    CHECK(sampler_top_needed(&s) == 0); /* T = 1 without top-k: the softmax spans every token */
    sampler_free(&s);
}

static void test_sampling_from_the_top_rejects_bad_logits(void) {
    sampler_params params = sampler_params_default();
    params.top_k = 2;
    sampler s = make_sampler(params, 5);
    sampler_candidate bad[2] = {{3, NAN}, {1, 2.0f}};
    CHECK(sampler_sample_top(&s, bad, 2, NULL) == MOE_ERR_FORMAT);
    CHECKF(strstr(s.error.message, "token 3 is NaN") != NULL, "%s", s.error.message);
    CHECK(sampler_sample_top(&s, bad, 0, NULL) == MOE_ERR_FORMAT); /* nothing finite */
    CHECKF(strstr(s.error.message, "-inf") != NULL, "%s", s.error.message);
    sampler_free(&s);
}

static void test_bad_logits(void) {
    sampler_params params = sampler_params_default();
    sampler s = make_sampler(params, 5);
    float nan_logits[5] = {0.0f, 1.0f, 2.0f, NAN, 1.0f};
    CHECK(sampler_sample(&s, nan_logits) == MOE_ERR_FORMAT);
    CHECKF(strstr(s.error.message, "token 3") && strstr(s.error.message, "NaN"), "%s", s.error.message);
    float inf_logits[5] = {0.0f, INFINITY, 2.0f, 1.0f, 1.0f};
    CHECK(sampler_sample(&s, inf_logits) == MOE_ERR_FORMAT);
    CHECKF(strstr(s.error.message, "token 1") && strstr(s.error.message, "+inf"), "%s", s.error.message);
    float none[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_sample(&s, none) == MOE_ERR_FORMAT);
    CHECKF(strstr(s.error.message, "-inf") != NULL, "%s", s.error.message);

    /* -inf masks a token, even the one that would otherwise be the best. */
    int drawn_masked = 0;
    for (int d = 0; d < 2000; d++) {
        float masked[5] = {0.0f, -INFINITY, 0.5f, -INFINITY, 0.2f};
        const int32_t t = sampler_sample(&s, masked);
        drawn_masked += t == 1 || t == 3 || t < 0;
    }
    CHECK(drawn_masked == 0);
    sampler_free(&s);

    params.temperature = 0.0f;
    s = make_sampler(params, 5);
    CHECK(sampler_sample(&s, nan_logits) == MOE_ERR_FORMAT);
    float masked[5] = {0.0f, -INFINITY, 0.5f, -INFINITY, 0.2f};
    CHECK(sampler_sample(&s, masked) == 2);
    sampler_free(&s);
}

static void check_rejected(sampler_params params, int32_t n_vocab, const char *field) {
    sampler s;
    moe_error err = {0};
    CHECKF(sampler_init(&s, &params, n_vocab, &err) == MOE_ERR_INVALID_ARG, "%s accepted", field);
    CHECKF(strstr(err.message, field) != NULL, "message for %s: %s", field, err.message);
    sampler_free(&s); /* harmless after a failed init */
}

static void test_bad_parameters_are_rejected_by_name(void) {
    const sampler_params ok = sampler_params_default();
    sampler_params p = ok;
    p.temperature = -0.1f;
    check_rejected(p, 10, "temperature");
    p.temperature = NAN;
    check_rejected(p, 10, "temperature");
    p = ok;
    p.top_k = -1;
    check_rejected(p, 10, "top_k");
    p = ok;
    p.top_p = 0.0f;
    check_rejected(p, 10, "top_p");
    p.top_p = 1.5f;
    check_rejected(p, 10, "top_p");
    p = ok;
    p.min_p = -0.1f;
    check_rejected(p, 10, "min_p");
    p.min_p = 1.1f;
    check_rejected(p, 10, "min_p");
    p = ok;
    p.repetition_penalty = 0.0f;
    check_rejected(p, 10, "repetition_penalty");
    p = ok;
    p.presence_penalty = INFINITY;
    check_rejected(p, 10, "presence_penalty");
    p = ok;
    p.frequency_penalty = NAN;
    check_rejected(p, 10, "frequency_penalty");
    p = ok;
    p.penalty_last_n = -1;
    check_rejected(p, 10, "penalty_last_n");
    check_rejected(ok, 0, "vocabulary size");
}

static void test_accept_rejects_tokens_outside_the_vocabulary(void) {
    sampler s = make_sampler(sampler_params_default(), 10);
    CHECK(sampler_accept(&s, -1) == MOE_ERR_RANGE);
    CHECK(sampler_accept(&s, 10) == MOE_ERR_RANGE);
    CHECKF(strstr(s.error.message, "10") != NULL, "%s", s.error.message);
    CHECK(sampler_accept(&s, 9) == MOE_OK);
    sampler_free(&s);
}

static void test_logprob_is_the_log_softmax(void) {
    const float logits[5] = {1.0f, -2.0f, 3.5f, 0.0f, -INFINITY};
    double probs[4];
    softmax_at(logits, 1.0, probs, 4);
    for (int t = 0; t < 4; t++) CHECK_NEAR(sampler_logprob(logits, 5, t), log(probs[t]), 1e-6);
    CHECK(sampler_logprob(logits, 5, 4) == -INFINITY);
    CHECK(isnan(sampler_logprob(logits, 5, 5)));
}

static int compare_doubles(const void *pa, const void *pb) {
    const double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

/* The median of 101 draws: shared machines make the mean noisy. */
static void time_one(const char *what, sampler_params params, const float *logits, float *work, int n) {
    enum { REPEAT = 101 };
    double spent[REPEAT];
    sampler s = make_sampler(params, n);
    for (int r = 0; r < REPEAT; r++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        const double start = monotonic_seconds();
        CHECK(sampler_sample(&s, work) >= 0);
        spent[r] = monotonic_seconds() - start;
    }
    qsort(spent, REPEAT, sizeof *spent, compare_doubles);
    printf("  %-44s %8.1f us per sample (median)\n", what, spent[REPEAT / 2] * 1e6);
    sampler_free(&s);
}

/* Qwen's vocabulary; logits N(0, sd^2): sd 2 is a flat, uncertain step
 * (the 0.9 nucleus holds thousands of tokens), sd 4 a confident one. */
static void test_timing_on_a_152k_vocabulary(void) {
    enum { N = 151936 };
    float *logits = malloc(N * sizeof *logits), *work = malloc(N * sizeof *work);
    const float spreads[2] = {2.0f, 4.0f};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++) logits[i] = spreads[k] * test_normal();
        printf("  logits N(0, %g^2) over %d tokens:\n", spreads[k], N);
        sampler_params params = sampler_params_default();
        params.top_p = 0.9f;
        time_one("k=0 p=0.9 T=1", params, logits, work, N);
        params.temperature = 0.7f;
        time_one("k=0 p=0.9 T=0.7", params, logits, work, N);
        params.top_k = 40;
        time_one("k=40 p=0.9 T=0.7", params, logits, work, N);
        params = sampler_params_default();
        time_one("T=1, no filters", params, logits, work, N);
        params.temperature = 0.0f;
        time_one("greedy", params, logits, work, N);
    }
    free(logits);
    free(work);
}

int main(void) {
    RUN(test_greedy_picks_argmax_lowest_id_on_ties);
    RUN(test_top_k_1_equals_greedy);
    RUN(test_draws_follow_the_softmax);
    RUN(test_top_p_keeps_the_smallest_prefix);
    RUN(test_top_k_keeps_the_k_most_likely);
    RUN(test_min_p_drops_tokens_below_the_fraction_of_the_best);
    RUN(test_top_p_matches_a_full_sort_on_a_large_vocabulary);
    RUN(test_penalties_change_exactly_the_seen_tokens);
    RUN(test_repetition_penalty_can_change_the_winner);
    RUN(test_same_seed_same_tokens_different_seed_different);
    RUN(test_seeded_tokens_are_the_same_on_every_machine);
    RUN(test_sampling_from_the_top_equals_sampling_from_all);
    RUN(test_sampling_from_the_top_rejects_bad_logits);
    RUN(test_bad_logits);
    RUN(test_bad_parameters_are_rejected_by_name);
    RUN(test_accept_rejects_tokens_outside_the_vocabulary);
    RUN(test_logprob_is_the_log_softmax);
    RUN(test_timing_on_a_152k_vocabulary);
    return test_summary();
}
