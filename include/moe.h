/*
 * moe.h — the public C API of moe.c.
 *
 * moe.c runs Mixture-of-Experts language models stored as GGUF files. This
 * header is the whole public surface; it grows with the engine. Every call
 * that can fail returns a moe_status and, where it takes a moe_error, fills
 * in a human-readable message. The library never exits the process.
 */
#ifndef MOE_H
#define MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 1
#define MOE_VERSION_PATCH 0
#define MOE_VERSION_STRING "0.1.0"

typedef enum moe_status {
    MOE_OK = 0,
    MOE_ERR_IO = -1,          /* open/read/write/mmap failed */
    MOE_ERR_FORMAT = -2,      /* malformed or truncated input */
    MOE_ERR_UNSUPPORTED = -3, /* valid input we do not handle (type, arch) */
    MOE_ERR_NOMEM = -4,       /* allocation failed */
    MOE_ERR_INVALID_ARG = -5, /* caller passed something out of contract */
    MOE_ERR_NOT_FOUND = -6,   /* a named key, tensor or file is missing */
    MOE_ERR_TYPE = -7,        /* a value has a different type than asked */
    MOE_ERR_RANGE = -8,       /* a value or size exceeds a limit */
    MOE_ERR_INTERRUPTED = -9, /* cancelled by the user (Ctrl-C) */
} moe_status;

/* An error report: the status plus one sentence that names the thing that
 * was wrong and, where there is one, the limit or the expectation. */
typedef struct moe_error {
    moe_status code;
    char message[512];
} moe_error;

/* Short name of a status ("format error"), never NULL. */
const char *moe_status_name(moe_status status);

/* Free memory the library returned (token arrays, rendered text). */
void moe_free(void *p);

/* ================================================================ models
 *
 * A model is a GGUF file mapped into memory (weights are never copied),
 * its architecture bound, and its tokenizer. One model serves any number of
 * sessions; a model is read-only after loading, so sessions on different
 * threads may share it.
 */
typedef struct moe_model moe_model;

typedef enum moe_device {
    MOE_DEVICE_AUTO, /* CUDA when built in and a GPU is present, else CPU */
    MOE_DEVICE_CPU,
    MOE_DEVICE_CUDA,
} moe_device;

typedef struct moe_model_params {
    moe_device device;
    int n_threads; /* CPU threads; <= 0: all CPUs */
} moe_model_params;

moe_model_params moe_model_default_params(void);
moe_status moe_model_load(const char *path, const moe_model_params *params, moe_model **out, moe_error *err);
void moe_model_free(moe_model *model);

int moe_model_n_vocab(const moe_model *model);
int moe_model_n_ctx_train(const moe_model *model);
const char *moe_model_arch(const moe_model *model);
const char *moe_model_device(const moe_model *model); /* "cpu" or "cuda" */

/* ================================================================ text */

/* Token ids of `text` (len bytes). add_special adds BOS/EOS as the
 * vocabulary asks; parse_special recognises special tokens written in the
 * text ("<|im_start|>"). *ids is freed with moe_free. */
moe_status moe_tokenize(const moe_model *model, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, size_t *n_ids, moe_error *err);

/* The bytes a token stands for (not NUL-terminated; may be a partial UTF-8
 * sequence). NULL for an id outside the vocabulary. */
const char *moe_token_piece(const moe_model *model, int32_t id, size_t *len);

/* True for the tokens that end a generation (EOS, end of turn). */
bool moe_token_is_eog(const moe_model *model, int32_t id);

typedef struct moe_chat_message {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
} moe_chat_message;

/* Render a conversation with a chat template: `template_name` (chatml,
 * llama3, mistral) or NULL for the one the file names. *out is freed with
 * moe_free. */
moe_status moe_chat_format(const moe_model *model, const char *template_name, const moe_chat_message *messages,
                           size_t n_messages, bool add_generation_prompt, char **out, moe_error *err);

/* The strings that end an assistant turn in that template (NULL-terminated
 * list, owned by the library): pass them as stop strings. */
moe_status moe_chat_stops(const moe_model *model, const char *template_name, const char *const **stops,
                          moe_error *err);

/* ================================================================ sessions
 *
 * A session is one sequence: its KV cache, position and sampler. Not
 * thread-safe; use one session per thread.
 */
typedef struct moe_session moe_session;

typedef struct moe_sampling {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int penalty_last_n;       /* tokens the penalties look back over */
    uint64_t seed;
} moe_sampling;

/* The KV cache's element type. f16 halves the cache's memory and the bytes
 * a decode step reads from it (7% faster at 4096 positions on a GPU); its
 * keys and values are rounded to f16 as they are cached, so logits differ
 * from an f32 cache's by that rounding (both devices round alike). */
typedef enum moe_kv_type {
    MOE_KV_F32,
    MOE_KV_F16,
} moe_kv_type;

typedef struct moe_session_params {
    int n_ctx;           /* positions; <= 0: the model's training context, at most 4096 */
    int n_batch;         /* prompt tokens per forward step */
    moe_kv_type kv_type; /* MOE_KV_F32 by default */
    moe_sampling sampling;
} moe_session_params;

moe_session_params moe_session_default_params(void);
moe_status moe_session_new(moe_model *model, const moe_session_params *params, moe_session **out, moe_error *err);
void moe_session_free(moe_session *session);

/* Run tokens at the next positions; the logits of the last are then
 * available. A batch that would overflow the context is refused whole. */
moe_status moe_session_feed(moe_session *session, const int32_t *ids, size_t n_ids, moe_error *err);

/* Like feed, and write the logits of every one of the n_ids positions to
 * logits[i * n_vocab] (teacher forcing). */
moe_status moe_session_feed_all_logits(moe_session *session, const int32_t *ids, size_t n_ids, float *logits,
                                       moe_error *err);

/* Logits (n_vocab) after the last token fed; NULL before any (or when
 * copying them from the GPU, where they stay until asked for, fails). */
const float *moe_session_logits(moe_session *session);

/* Sample the next token from the current logits and count it in the
 * penalty history (it is not fed: call moe_session_feed with it). */
moe_status moe_session_sample(moe_session *session, int32_t *token, moe_error *err);

/* Forget the sequence: position 0, empty history, sampler reseeded. */
void moe_session_reset(moe_session *session);

/* Sample from now on with these settings: the sampler starts afresh (seeded
 * with sampling->seed, empty penalty history); the cache is kept, so a new
 * request can still reuse the prefix the session holds. */
moe_status moe_session_set_sampling(moe_session *session, const moe_sampling *sampling, moe_error *err);

/* Keep only the first n_keep positions (n_keep <= position): the cache
 * after them is dropped, so a new continuation can be fed. Logits are
 * unavailable until the next feed. This is how a conversation reuses the
 * cache of the turns it already processed. */
moe_status moe_session_rewind(moe_session *session, int n_keep, moe_error *err);

/* The tokens at positions 0..position-1. */
const int32_t *moe_session_tokens(const moe_session *session, int *n);

int moe_session_position(const moe_session *session);
int moe_session_n_ctx(const moe_session *session);

/* ================================================================ generation */

typedef enum moe_finish_reason {
    MOE_FINISH_STOP,      /* an end-of-generation token or a stop string */
    MOE_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    MOE_FINISH_CANCELLED, /* the callback returned false */
} moe_finish_reason;

/* Receives generated text as it becomes final: whole UTF-8 sequences, with
 * anything that could still become a stop string held back. Return false
 * to stop. */
typedef bool (*moe_text_callback)(const char *text, size_t len, void *user);

typedef struct moe_generate_params {
    int max_tokens;              /* <= 0: until the context is full */
    const char *const *stop;     /* stop strings (not emitted), may be NULL */
    size_t n_stop;
    moe_text_callback on_text;   /* may be NULL */
    void *user;
} moe_generate_params;

typedef struct moe_generate_result {
    int n_prompt, n_generated;
    moe_finish_reason finish;
    double prompt_seconds, generate_seconds;
} moe_generate_result;

/* Feed the prompt tokens after what the session holds, then sample and feed
 * until a stop condition. */
moe_status moe_generate(moe_session *session, const int32_t *prompt, size_t n_prompt,
                        const moe_generate_params *params, moe_generate_result *result, moe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MOE_H */
