/*
 * cli.h — what the subcommands of `moe` share.
 *
 * Each subcommand is `int cmd_<name>(int argc, char **argv)` with argv[0]
 * the subcommand's name; it returns the process exit status: 0 success,
 * 1 a failure (message printed), 2 a usage error.
 */
#ifndef MOE_TOOLS_CLI_H
#define MOE_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "moe.h"

int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_lab(int argc, char **argv);

/* Print "moe <command>: <message>" to stderr; returns 1 (the exit status). */
int cli_fail(const char *command, const moe_error *err);

/* Print a usage error and the hint to run --help; returns 2. */
int cli_usage_error(const char *command, const char *fmt, ...);

/* The whole of a file, NUL-terminated (len excludes the NUL); NULL when it
 * cannot be read. Free with free(). */
char *cli_read_file(const char *path, size_t *len);

/* Parse a decimal integer in [min, max]; false on garbage or overflow. */
bool cli_parse_int(const char *text, long min, long max, long *out);

/* A KV cache type by name, "f32" or "f16"; false for anything else. */
bool cli_parse_kv_type(const char *text, moe_kv_type *out);

#endif
