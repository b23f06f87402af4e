/*
 * engine.c — models and sessions behind the public API (include/moe.h).
 *
 * A model couples the bound weights with the tokenizer of the same file. A
 * session owns a backend state (the KV cache and activations), the sampler
 * and the logits of the last position. The backend is chosen when the model
 * loads: CUDA for MOE_DEVICE_CUDA, or for MOE_DEVICE_AUTO when the build
 * has CUDA, the machine a GPU and the GPU kernels cover the model (head
 * size, experts per token); the CPU otherwise. Sessions then call
 * cpu_forward or cuda_forward, which take the same arguments.
 */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "engine/engine_internal.h"

/* A context the model was trained for can be huge (40k+ positions, GBs of
 * KV cache); without an explicit n_ctx a session takes at most this. */
#define DEFAULT_MAX_CTX 4096

void moe_free(void *p) { free(p); }

/* ------------------------------------------------------------ models */

moe_model_params moe_model_default_params(void) { return (moe_model_params){MOE_DEVICE_AUTO, 0}; }

moe_status moe_model_load(const char *path, const moe_model_params *params, moe_model **out, moe_error *err) {
    *out = NULL;
    moe_model_params p = params ? *params : moe_model_default_params();
    bool use_cuda = p.device == MOE_DEVICE_CUDA || (p.device == MOE_DEVICE_AUTO && cuda_available());
    moe_model *m = calloc(1, sizeof *m);
    if (!m) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    m->params = p;
    moe_status st = model_load(path, &m->weights, err);
    if (st == MOE_OK) {
        st = tokenizer_load(m->weights->file, &m->tok, err);
        if (st != MOE_OK) moe_error_prefix(err, "%s", path);
    }
    if (st == MOE_OK && tokenizer_n_vocab(m->tok) > (uint32_t)m->weights->config.n_vocab)
        st = moe_error_set(err, MOE_ERR_FORMAT, "%s: the vocabulary has %u tokens but the embedding only %d rows", path,
                           tokenizer_n_vocab(m->tok), m->weights->config.n_vocab);
    if (st == MOE_OK && use_cuda) {
        st = cuda_model_new(m->weights, &m->gpu, err);
        /* auto: a model the GPU kernels do not cover runs on the CPU */
        if (st == MOE_ERR_UNSUPPORTED && p.device == MOE_DEVICE_AUTO) st = MOE_OK;
    }
    if (st != MOE_OK) {
        moe_model_free(m);
        return st;
    }
    *out = m;
    return MOE_OK;
}

void moe_model_free(moe_model *m) {
    if (!m) return;
    tokenizer_free(m->tok);
    cuda_model_free(m->gpu);
    model_free(m->weights);
    free(m);
}

int moe_model_n_vocab(const moe_model *m) { return m->weights->config.n_vocab; }
int moe_model_n_ctx_train(const moe_model *m) { return m->weights->config.n_ctx_train; }
const char *moe_model_arch(const moe_model *m) { return m->weights->config.arch->name; }
const char *moe_model_device(const moe_model *m) { return m->gpu ? "cuda" : "cpu"; }

/* ------------------------------------------------------------ text */

moe_status moe_tokenize(const moe_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, size_t *n_ids, moe_error *err) {
    unsigned flags = (add_special ? TOKENIZER_ADD_SPECIAL : 0) | (parse_special ? TOKENIZER_PARSE_SPECIAL : 0);
    return tokenizer_encode(m->tok, text, len, flags, ids, n_ids, err);
}

const char *moe_token_piece(const moe_model *m, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= tokenizer_n_vocab(m->tok)) return NULL;
    return tokenizer_piece(m->tok, id, len);
}

bool moe_token_is_eog(const moe_model *m, int32_t id) { return tokenizer_is_eog(m->tok, id); }

/* ------------------------------------------------------------ sessions */

moe_session_params moe_session_default_params(void) {
    sampler_params s = sampler_params_default();
    return (moe_session_params){
        .n_ctx = 0,
        .n_batch = 256,
        .kv_type = MOE_KV_F32,
        .sampling = {s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty,
                     s.frequency_penalty, s.penalty_last_n, s.seed},
    };
}

static sampler_params to_sampler_params(const moe_sampling *s) {
    sampler_params p = sampler_params_default();
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.min_p = s->min_p;
    p.repetition_penalty = s->repetition_penalty;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.penalty_last_n = s->penalty_last_n;
    p.seed = s->seed;
    return p;
}

moe_status moe_session_new(moe_model *m, const moe_session_params *params, moe_session **out, moe_error *err) {
    *out = NULL;
    moe_session *s = calloc(1, sizeof *s);
    if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    s->model = m;
    s->params = params ? *params : moe_session_default_params();
    if (s->params.n_ctx <= 0) {
        int train = m->weights->config.n_ctx_train;
        s->params.n_ctx = train < DEFAULT_MAX_CTX ? train : DEFAULT_MAX_CTX;
    }
    if (s->params.n_batch <= 0) s->params.n_batch = 256;
    int n_vocab = m->weights->config.n_vocab;
    sampler_params sp = to_sampler_params(&s->params.sampling);
    moe_status st = sampler_init(&s->sampler, &sp, n_vocab, err);
    if (st == MOE_OK && s->params.kv_type != MOE_KV_F32 && s->params.kv_type != MOE_KV_F16)
        st = moe_error_set(err, MOE_ERR_INVALID_ARG, "unknown KV cache type %d (f32 or f16)", (int)s->params.kv_type);
    if (st == MOE_OK && m->gpu) {
        cuda_options o = cuda_default_options();
        o.kv_f16 = s->params.kv_type == MOE_KV_F16;
        st = cuda_state_new(m->gpu, s->params.n_ctx, &o, &s->gpu, err);
    } else if (st == MOE_OK) {
        cpu_state_params p = {.n_ctx = s->params.n_ctx,
                              .max_batch = s->params.n_batch,
                              .n_threads = m->params.n_threads,
                              .kv_type = s->params.kv_type};
        st = cpu_state_new(m->weights, &p, &s->cpu, err);
    }
    if (st == MOE_OK && (!(s->logits = malloc((size_t)n_vocab * sizeof(float))) ||
                         !(s->tokens = malloc((size_t)s->params.n_ctx * sizeof *s->tokens))))
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st != MOE_OK) {
        moe_session_free(s);
        return st;
    }
    *out = s;
    return MOE_OK;
}

void moe_session_free(moe_session *s) {
    if (!s) return;
    cpu_state_free(s->cpu);
    cuda_state_free(s->gpu);
    sampler_free(&s->sampler);
    free(s->logits);
    free(s->tokens);
    free(s);
}

static moe_status check_room(const moe_session *s, size_t n, moe_error *err) {
    if (n == 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "no tokens to feed");
    if ((uint64_t)s->pos + n > (uint64_t)s->params.n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE,
                             "%zu tokens do not fit: %d of the context's %d positions are used (%d free)", n, s->pos,
                             s->params.n_ctx, s->params.n_ctx - s->pos);
    return MOE_OK;
}

/* The GPU keeps the logits: sampling usually needs only their top. */
moe_status moe_session_feed(moe_session *s, const int32_t *ids, size_t n, moe_error *err) {
    moe_status st = check_room(s, n, err);
    if (st == MOE_OK)
        st = s->gpu ? cuda_forward(s->gpu, ids, (int)n, s->pos, NULL, false, err)
                    : cpu_forward(s->cpu, ids, (int)n, s->pos, s->logits, false, err);
    if (st != MOE_OK) return st;
    memcpy(s->tokens + s->pos, ids, n * sizeof *ids);
    s->pos += (int)n;
    s->has_logits = true;
    s->logits_on_host = !s->gpu;
    return MOE_OK;
}

moe_status moe_session_feed_all_logits(moe_session *s, const int32_t *ids, size_t n, float *logits, moe_error *err) {
    moe_status st = check_room(s, n, err);
    if (st == MOE_OK)
        st = s->gpu ? cuda_forward(s->gpu, ids, (int)n, s->pos, logits, true, err)
                    : cpu_forward(s->cpu, ids, (int)n, s->pos, logits, true, err);
    if (st != MOE_OK) return st;
    size_t vocab = (size_t)s->model->weights->config.n_vocab;
    memcpy(s->logits, logits + (n - 1) * vocab, vocab * sizeof(float));
    memcpy(s->tokens + s->pos, ids, n * sizeof *ids);
    s->pos += (int)n;
    s->has_logits = true;
    s->logits_on_host = true;
    return MOE_OK;
}

static moe_status logits_to_host(moe_session *s, moe_error *err) {
    if (s->logits_on_host) return MOE_OK;
    moe_status st = cuda_last_logits(s->gpu, s->logits, err);
    s->logits_on_host = st == MOE_OK;
    return st;
}

const float *moe_session_logits(moe_session *s) {
    return s->has_logits && logits_to_host(s, NULL) == MOE_OK ? s->logits : NULL;
}

/* The next token from the GPU's largest logits (sample.h,
 * sampler_sample_top): the token the whole row would give, for a few
 * kilobytes instead of n_vocab floats and a scan of them. MOE_ERR_UNSUPPORTED
 * when the sampler needs every logit or more than the GPU selects;
 * MOE_ERR_FORMAT for a NaN or +inf logit (the host names it). */
static moe_status sample_on_gpu(moe_session *s, int32_t *token, moe_error *err) {
    const int32_t need = sampler_top_needed(&s->sampler);
    if (need <= 0 || need > CUDA_TOP_MAX || s->sampler.window_len > CUDA_TOP_EXTRA_MAX) return MOE_ERR_UNSUPPORTED;
    const int32_t n_pen = sampler_penalized_tokens(&s->sampler, s->penalized);
    int n_top = 0;
    moe_error quiet;
    moe_status st = cuda_top_logits(s->gpu, need, s->penalized, n_pen, s->top, &n_top, s->penalized_logits, &quiet);
    if (st == MOE_ERR_UNSUPPORTED || st == MOE_ERR_FORMAT) return st;
    if (st != MOE_OK) return moe_error_set(err, st, "%s", quiet.message);
    const int32_t id = sampler_sample_top(&s->sampler, s->top, n_top, s->penalized_logits);
    if (id < 0) return moe_error_set(err, s->sampler.error.code, "%s", s->sampler.error.message);
    *token = id;
    return sampler_accept(&s->sampler, id);
}

moe_status moe_session_sample(moe_session *s, int32_t *token, moe_error *err) {
    if (!s->has_logits) return moe_error_set(err, MOE_ERR_INVALID_ARG, "nothing to sample from: feed tokens first");
    if (!s->logits_on_host) {
        moe_status st = sample_on_gpu(s, token, err);
        if (st != MOE_ERR_UNSUPPORTED && st != MOE_ERR_FORMAT) return st;
        if ((st = logits_to_host(s, err)) != MOE_OK) return st;
    }
    size_t vocab = (size_t)s->model->weights->config.n_vocab;
    /* The sampler edits logits in place; keep the session's copy intact so
     * moe_session_logits stays what the model produced. */
    float *work = malloc(vocab * sizeof *work);
    if (!work) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    memcpy(work, s->logits, vocab * sizeof *work);
    int32_t id = sampler_sample(&s->sampler, work);
    free(work);
    if (id < 0) return moe_error_set(err, s->sampler.error.code, "%s", s->sampler.error.message);
    *token = id;
    return sampler_accept(&s->sampler, id);
}

moe_status moe_session_set_sampling(moe_session *s, const moe_sampling *sampling, moe_error *err) {
    sampler fresh;
    sampler_params p = to_sampler_params(sampling);
    moe_status st = sampler_init(&fresh, &p, s->model->weights->config.n_vocab, err);
    if (st != MOE_OK) return st; /* the old sampler stays as it was */
    sampler_free(&s->sampler);
    s->sampler = fresh;
    s->params.sampling = *sampling;
    return MOE_OK;
}

void moe_session_reset(moe_session *s) {
    s->pos = 0;
    s->has_logits = false;
    sampler_reset(&s->sampler);
}

moe_status moe_session_rewind(moe_session *s, int n_keep, moe_error *err) {
    if (n_keep < 0 || n_keep > s->pos)
        return moe_error_set(err, MOE_ERR_RANGE, "cannot keep %d positions of %d", n_keep, s->pos);
    /* The cache is indexed by position: entries past n_keep are simply
     * overwritten by the next feed. */
    s->pos = n_keep;
    s->has_logits = false;
    return MOE_OK;
}

const int32_t *moe_session_tokens(const moe_session *s, int *n) {
    *n = s->pos;
    return s->tokens;
}

int moe_session_position(const moe_session *s) { return s->pos; }
int moe_session_n_ctx(const moe_session *s) { return s->params.n_ctx; }
