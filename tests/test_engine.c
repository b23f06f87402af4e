/*
 * test_engine.c — the public API (include/moe.h) on a synthetic model:
 * errors come back as codes and messages, sessions behave as documented.
 */
#include <stdlib.h>
#include <unistd.h>

#include "model/synth.h"
#include "moe.h"
#include "test.h"

static char model_path[256];
static moe_model *model;

static moe_session *new_session(int n_ctx, float temperature, uint64_t seed) {
    moe_session_params p = moe_session_default_params();
    p.n_ctx = n_ctx;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    moe_session *s = NULL;
    moe_error err = {0};
    CHECKF(moe_session_new(model, &p, &s, &err) == MOE_OK, "%s", err.message);
    /* every test after would dereference it: one clear failure, not a crash
     * (and main's cleanup never runs, so the model file goes here) */
    if (!s) {
        unlink(model_path);
        exit(1);
    }
    return s;
}

static void test_load_errors_are_codes(void) {
    moe_model *m = NULL;
    moe_error err = {0};
    CHECK(moe_model_load("/nonexistent/model.gguf", NULL, &m, &err) == MOE_ERR_IO && m == NULL);
    CHECK(strstr(err.message, "/nonexistent/model.gguf") != NULL);
    moe_model_params p = moe_model_default_params();
    p.device = MOE_DEVICE_CUDA;
    if (strcmp(moe_model_device(model), "cpu") == 0) /* AUTO found no GPU: CUDA must fail */
        CHECK(moe_model_load(model_path, &p, &m, &err) != MOE_OK && m == NULL);
}

static void test_model_facts(void) {
    CHECK(moe_model_n_vocab(model) == 512);
    CHECK(strcmp(moe_model_arch(model), "qwen3moe") == 0);
    CHECK(strcmp(moe_model_device(model), "cpu") == 0 || strcmp(moe_model_device(model), "cuda") == 0);
}

static void test_tokenize_and_pieces(void) {
    int32_t *ids;
    size_t n;
    moe_error err = {0};
    CHECK(moe_tokenize(model, "ab<|im_end|>", 12, true, true, &ids, &n, &err) == MOE_OK);
    CHECK(n == 3 && ids[0] == 'a' && ids[1] == 'b' && moe_token_is_eog(model, ids[2]));
    size_t len;
    const char *piece = moe_token_piece(model, 'a', &len);
    CHECK(piece && len == 1 && piece[0] == 'a');
    CHECK(moe_token_piece(model, 100000, &len) == NULL);
    moe_free(ids);
}

static void test_feed_and_logits(void) {
    moe_session *s = new_session(16, 0, 1);
    moe_error err = {0};
    CHECK(moe_session_logits(s) == NULL);
    int32_t ids[4] = {10, 20, 30, 40};
    float *all = malloc(4 * 512 * sizeof *all);
    CHECK(moe_session_feed_all_logits(s, ids, 4, all, &err) == MOE_OK);
    CHECK(moe_session_position(s) == 4);
    CHECK(memcmp(moe_session_logits(s), all + 3 * 512, 512 * sizeof(float)) == 0);
    /* the same tokens fed one by one give the same last logits */
    moe_session_reset(s);
    for (int i = 0; i < 4; i++) CHECK(moe_session_feed(s, &ids[i], 1, &err) == MOE_OK);
    const float *last = moe_session_logits(s);
    double worst = 0;
    for (int v = 0; v < 512; v++) worst = fmax(worst, fabs(last[v] - all[3 * 512 + v]));
    CHECKF(worst < 1e-4, "%g", worst);
    int n;
    const int32_t *held = moe_session_tokens(s, &n);
    CHECK(n == 4 && memcmp(held, ids, sizeof ids) == 0);
    free(all);
    moe_session_free(s);
}

/* An f16 cache: the logits within its rounding of an f32 cache's, and not
 * the same bits (the cache did hold f16); an unknown type is refused. */
static void test_f16_kv_cache(void) {
    moe_session_params p = moe_session_default_params();
    p.n_ctx = 16;
    moe_session *s32 = NULL, *s16 = NULL, *bad = NULL;
    moe_error err = {0};
    CHECKF(moe_session_new(model, &p, &s32, &err) == MOE_OK, "%s", err.message);
    p.kv_type = MOE_KV_F16;
    CHECKF(moe_session_new(model, &p, &s16, &err) == MOE_OK, "%s", err.message);
    int32_t ids[8] = {10, 20, 30, 40, 50, 60, 70, 80};
    CHECK(s32 && s16 && moe_session_feed(s32, ids, 8, &err) == MOE_OK && moe_session_feed(s16, ids, 8, &err) == MOE_OK);
    if (s32 && s16) {
        const float *a = moe_session_logits(s32), *b = moe_session_logits(s16);
        double num = 0, den = 0;
        for (int v = 0; v < 512; v++) num += (a[v] - b[v]) * (a[v] - b[v]), den += (double)a[v] * a[v];
        CHECKF(num > 0 && sqrt(num / den) < 1e-2, "f16 cache vs f32: relative L2 %g", sqrt(num / den));
    }
    p.kv_type = (moe_kv_type)7;
    CHECK(moe_session_new(model, &p, &bad, &err) == MOE_ERR_INVALID_ARG && bad == NULL);
    CHECKF(strstr(err.message, "KV cache type") != NULL, "%s", err.message);
    moe_session_free(s32);
    moe_session_free(s16);
}

static void test_context_overflow_is_refused_whole(void) {
    moe_session *s = new_session(8, 0, 1);
    moe_error err = {0};
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(moe_session_feed(s, ids, 6, &err) == MOE_OK);
    CHECK(moe_session_feed(s, ids, 3, &err) == MOE_ERR_RANGE);
    CHECKF(strstr(err.message, "2 free") != NULL, "%s", err.message);
    CHECK(moe_session_position(s) == 6);
    CHECK(moe_session_feed(s, ids, 0, &err) == MOE_ERR_INVALID_ARG);
    int32_t bad = 512;
    CHECK(moe_session_feed(s, &bad, 1, &err) == MOE_ERR_RANGE);
    moe_session_free(s);
}

static void test_rewind_keeps_the_prefix(void) {
    moe_session *a = new_session(32, 0, 1), *b = new_session(32, 0, 1);
    moe_error err = {0};
    int32_t ids[6] = {5, 6, 7, 8, 9, 10}, other[2] = {99, 98};
    CHECK(moe_session_feed(a, ids, 6, &err) == MOE_OK);
    CHECK(moe_session_rewind(a, 4, &err) == MOE_OK && moe_session_logits(a) == NULL);
    CHECK(moe_session_feed(a, other, 2, &err) == MOE_OK);
    CHECK(moe_session_feed(b, ids, 4, &err) == MOE_OK && moe_session_feed(b, other, 2, &err) == MOE_OK);
    CHECK(memcmp(moe_session_logits(a), moe_session_logits(b), 512 * sizeof(float)) == 0);
    CHECK(moe_session_rewind(a, 7, &err) == MOE_ERR_RANGE);
    moe_session_free(a);
    moe_session_free(b);
}

static void sample_sequence(uint64_t seed, float temp, int32_t *out, int n) {
    moe_session *s = new_session(64, temp, seed);
    moe_error err = {0};
    int32_t token = 1;
    CHECK(moe_session_sample(s, &token, &err) == MOE_ERR_INVALID_ARG); /* nothing fed yet */
    token = 1;
    for (int i = 0; i < n; i++) {
        CHECK(moe_session_feed(s, &token, 1, &err) == MOE_OK);
        CHECK(moe_session_sample(s, &token, &err) == MOE_OK);
        out[i] = token;
    }
    moe_session_free(s);
}

static void test_sampling_is_reproducible(void) {
    int32_t a[20], b[20], c[20];
    sample_sequence(7, 1.0f, a, 20);
    sample_sequence(7, 1.0f, b, 20);
    sample_sequence(8, 1.0f, c, 20);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
}

/* The next token from the GPU's top logits (moe_session_sample's device
 * path, when the model runs there) against the host's sampler on all the
 * logits (which reading moe_session_logits first forces), step by step
 * for chains the device serves (greedy and top-k, with penalties) and one
 * it does not (the whole vocabulary). On the CPU both take the host path. */
static void test_sampling_on_the_device_equals_the_host(void) {
    moe_sampling chains[3];
    for (int c = 0; c < 3; c++) chains[c] = moe_session_default_params().sampling;
    chains[0].temperature = 0.0f, chains[0].repetition_penalty = 1.5f;
    chains[1].temperature = 0.9f, chains[1].top_k = 40, chains[1].top_p = 0.9f, chains[1].min_p = 0.02f;
    chains[1].frequency_penalty = 0.7f;
    chains[2].temperature = 1.0f, chains[2].top_k = 0;
    for (int c = 0; c < 3; c++) {
        moe_session *dev = new_session(64, 1.0f, 11), *host = new_session(64, 1.0f, 11);
        moe_error err = {0};
        CHECK(moe_session_set_sampling(dev, &chains[c], &err) == MOE_OK);
        CHECK(moe_session_set_sampling(host, &chains[c], &err) == MOE_OK);
        int32_t token = 'a';
        for (int i = 0; i < 24; i++) {
            CHECK(moe_session_feed(dev, &token, 1, &err) == MOE_OK && moe_session_feed(host, &token, 1, &err) == MOE_OK);
            int32_t from_host = -1;
            CHECK(moe_session_logits(host) != NULL);
            CHECK(moe_session_sample(dev, &token, &err) == MOE_OK && moe_session_sample(host, &from_host, &err) == MOE_OK);
            CHECKF(token == from_host, "chain %d step %d: %d on the device, %d on the host", c, i, token, from_host);
        }
        CHECK(memcmp(moe_session_logits(dev), moe_session_logits(host), 512 * sizeof(float)) == 0);
        moe_session_free(dev);
        moe_session_free(host);
    }
}

static void test_set_sampling_keeps_the_cache(void) {
    int32_t fresh[8], reused[8];
    sample_sequence(21, 1.0f, fresh, 8);
    moe_session *s = new_session(64, 0.3f, 5);
    moe_error err = {0};
    int32_t token = 1;
    CHECK(moe_session_feed(s, &token, 1, &err) == MOE_OK);
    moe_sampling sampling = moe_session_default_params().sampling;
    sampling.temperature = 1.0f;
    sampling.seed = 21;
    CHECK(moe_session_set_sampling(s, &sampling, &err) == MOE_OK);
    CHECK(moe_session_position(s) == 1 && moe_session_logits(s) != NULL);
    for (int i = 0; i < 8; i++) {
        CHECK(moe_session_sample(s, &token, &err) == MOE_OK);
        reused[i] = token;
        CHECK(moe_session_feed(s, &token, 1, &err) == MOE_OK);
    }
    CHECK(memcmp(fresh, reused, sizeof fresh) == 0);
    sampling.top_p = 2.0f;
    CHECK(moe_session_set_sampling(s, &sampling, &err) == MOE_ERR_INVALID_ARG);
    CHECK(moe_session_sample(s, &token, &err) == MOE_OK); /* the old sampler still works */
    moe_session_free(s);
}

typedef struct collected {
    char text[4096];
    size_t len;
    int calls, stop_after;
} collected;

static bool collect(const char *text, size_t len, void *user) {
    collected *c = user;
    if (c->len + len < sizeof c->text) memcpy(c->text + c->len, text, len), c->len += len;
    return ++c->calls != c->stop_after;
}

static void test_generate(void) {
    moe_session *s = new_session(64, 0.8f, 3);
    moe_error err = {0};
    int32_t prompt[3] = {'H', 'i', '!'};
    collected got = {0};
    moe_generate_params gp = {.max_tokens = 10, .on_text = collect, .user = &got};
    moe_generate_result r;
    CHECK(moe_generate(s, prompt, 3, &gp, &r, &err) == MOE_OK);
    CHECK(r.n_prompt == 3 && r.n_generated >= 1 && r.n_generated <= 10);
    CHECK(r.finish == (r.n_generated == 10 ? MOE_FINISH_LENGTH : MOE_FINISH_STOP));
    moe_session_reset(s);
    collected cut = {.stop_after = 1};
    gp.user = &cut;
    gp.max_tokens = 50;
    CHECK(moe_generate(s, prompt, 3, &gp, &r, &err) == MOE_OK);
    CHECK(r.finish == MOE_FINISH_CANCELLED || r.finish == MOE_FINISH_STOP);
    CHECK(cut.calls <= 1);
    /* generation stops when the context is full */
    moe_session *tiny = new_session(6, 0.8f, 3);
    gp.user = &got;
    gp.max_tokens = 0;
    CHECK(moe_generate(tiny, prompt, 3, &gp, &r, &err) == MOE_OK);
    CHECK(moe_session_position(tiny) <= 6);
    int32_t long_prompt[7] = {1, 2, 3, 4, 5, 6, 7};
    moe_session_reset(tiny);
    CHECK(moe_generate(tiny, long_prompt, 7, &gp, &r, &err) == MOE_ERR_RANGE);
    moe_session_free(tiny);
    moe_session_free(s);
}

static void test_chat_format(void) {
    moe_chat_message msgs[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *text = NULL;
    moe_error err = {0};
    CHECK(moe_chat_format(model, NULL, msgs, 2, true, &text, &err) == MOE_OK);
    CHECKF(text && strstr(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "%s", text ? text : "");
    moe_free(text);
    CHECK(moe_chat_format(model, "nonsense", msgs, 2, true, &text, &err) != MOE_OK);
    moe_chat_message bad_role = {"wizard", "x"};
    CHECK(moe_chat_format(model, NULL, &bad_role, 1, true, &text, &err) != MOE_OK);
}

int main(void) {
    snprintf(model_path, sizeof model_path, "/tmp/moe_test_engine_%ld.gguf", (long)getpid());
    synth_options o = {.preset = synth_preset_by_name("tiny"), .arch = "qwen3moe",
                       .recipe = quant_recipe_by_name("q8_0"), .out_path = model_path, .seed = 11};
    moe_error err = {0};
    if (synth_model(&o, &err) != MOE_OK || moe_model_load(model_path, NULL, &model, &err) != MOE_OK) {
        fprintf(stderr, "cannot make the test model: %s\n", err.message);
        return 1;
    }
    RUN(test_load_errors_are_codes);
    RUN(test_model_facts);
    RUN(test_tokenize_and_pieces);
    RUN(test_feed_and_logits);
    RUN(test_f16_kv_cache);
    RUN(test_context_overflow_is_refused_whole);
    RUN(test_rewind_keeps_the_prefix);
    RUN(test_sampling_is_reproducible);
    RUN(test_sampling_on_the_device_equals_the_host);
    RUN(test_set_sampling_keeps_the_cache);
    RUN(test_generate);
    RUN(test_chat_format);
    moe_model_free(model);
    unlink(model_path);
    return test_summary();
}
