/*
 * cli_model.h — the options every generating command shares: the model,
 * device, threads, context and sampling flags, parsed in one place.
 */
#ifndef MOE_TOOLS_CLI_MODEL_H
#define MOE_TOOLS_CLI_MODEL_H

#include <getopt.h>
#include <stdbool.h>

#include "moe.h"

typedef struct model_options {
    const char *model_path;
    moe_model_params model;
    moe_session_params session;
} model_options;

/* Long options of model_options, to append to a command's own; their
 * `val`s are >= 1000 so they never clash with short options (but 'm'). */
#define MODEL_OPTIONS_COUNT 15
extern const struct option model_long_options[MODEL_OPTIONS_COUNT];

/* Defaults: the model path from $MOE_MODEL or NULL. */
void model_options_init(model_options *o);

/* Handle one getopt result `c` with `arg`: 1 handled, 0 not ours, -1 a
 * usage error (printed). */
int model_options_parse(model_options *o, const char *command, int c, const char *arg);

/* The help text of these options. */
void model_options_print_help(void);

/* Load the model named by -m, with one clear error. NULL on failure. */
moe_model *model_options_load(const model_options *o, const char *command);

/* The exit status after model_options_load failed: 2 when no model was
 * named (a usage error), else 1. */
int model_options_load_status(const model_options *o);

#endif
