/* error.c — see error.h. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *moe_status_name(moe_status status) {
    switch (status) {
    case MOE_OK: return "ok";
    case MOE_ERR_IO: return "I/O error";
    case MOE_ERR_FORMAT: return "format error";
    case MOE_ERR_UNSUPPORTED: return "unsupported";
    case MOE_ERR_NOMEM: return "out of memory";
    case MOE_ERR_INVALID_ARG: return "invalid argument";
    case MOE_ERR_NOT_FOUND: return "not found";
    case MOE_ERR_TYPE: return "type mismatch";
    case MOE_ERR_RANGE: return "out of range";
    case MOE_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown error";
}

moe_status moe_error_set(moe_error *err, moe_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

moe_status moe_error_prefix(moe_error *err, const char *fmt, ...) {
    if (!err) return MOE_OK;
    char prefix[256], old[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    /* the old message is cut, not the prefix, when both do not fit */
    snprintf(err->message, sizeof err->message, "%s: %.*s", prefix, (int)(sizeof old - strlen(prefix) - 3), old);
    return err->code;
}

void moe_error_clear(moe_error *err) {
    if (!err) return;
    err->code = MOE_OK;
    err->message[0] = '\0';
}
