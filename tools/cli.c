/* cli.c — see cli.h. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool cli_parse_kv_type(const char *text, moe_kv_type *out) {
    if (strcmp(text, "f32") == 0) *out = MOE_KV_F32;
    else if (strcmp(text, "f16") == 0) *out = MOE_KV_F16;
    else return false;
    return true;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 4096 > cap) {
            char *grown = realloc(buf, cap = (n + 4096) * 2);
            if (!grown) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
