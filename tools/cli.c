/* cli.c — see cli.h. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int cli_fail(const char *command, const moe_error *err) {
    fprintf(stderr, "moe %s: %s\n", command, err->message[0] ? err->message : moe_status_name(err->code));
    return 1;
}

int cli_usage_error(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moe %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'moe %s --help' for usage.\n", command);
    va_end(ap);
    return 2;
}

bool cli_parse_int(const char *text, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}
