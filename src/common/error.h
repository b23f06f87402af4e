/*
 * error.h — filling in a moe_error.
 *
 * Library functions report failures by returning a moe_status and writing
 * one sentence into the caller's moe_error (which may be NULL when the caller
 * does not care). The sentence names what was wrong and what was expected.
 */
#ifndef MOE_COMMON_ERROR_H
#define MOE_COMMON_ERROR_H

#include "moe.h"

#if defined(__GNUC__)
#define MOE_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define MOE_PRINTF(fmt_index, first_arg)
#endif

/* Record `code` and a printf-style message in `err` (if not NULL); returns
 * `code` so a failing path can `return moe_error_set(err, ...)`. */
moe_status moe_error_set(moe_error *err, moe_status code, const char *fmt, ...) MOE_PRINTF(3, 4);

/* Prefix the message already in `err` with "<context>: " (keeps the code).
 * Used by callers that add where the failure happened, e.g. the file name. */
moe_status moe_error_prefix(moe_error *err, const char *fmt, ...) MOE_PRINTF(2, 3);

/* Reset to MOE_OK with an empty message. */
void moe_error_clear(moe_error *err);

#endif
