/*
 * quantize_model.h — re-quantize a whole GGUF model file.
 *
 * Every key of the input is carried across (general.file_type and
 * general.quantization_version are updated); each tensor gets the type its
 * recipe chooses (recipe.h). Tensors already of that type are copied byte
 * for byte; the rest are dequantized to f32 row by row and quantized again,
 * rows spread over a thread pool. Output is atomic: nothing appears at the
 * output path until the whole file is written and synced, and a failure or
 * cancellation leaves no temp file behind. The input is never modified; an
 * output path naming the input file (even through another name) is refused.
 */
#ifndef MOE_QUANT_QUANTIZE_MODEL_H
#define MOE_QUANT_QUANTIZE_MODEL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "moe.h"
#include "quant/recipe.h"

typedef struct quantize_options {
    int n_threads;                  /* <= 0: all online CPUs */
    bool show_progress;             /* a bar on stderr when it is a terminal */
    volatile sig_atomic_t *cancel;  /* polled; nonzero stops with MOE_ERR_INTERRUPTED */
} quantize_options;

typedef struct quantize_report {
    uint64_t n_tensors;
    uint64_t n_requantized; /* the others were copied as they were */
    uint64_t bytes_in;      /* tensor data */
    uint64_t bytes_out;
    uint64_t count_by_type[MOE_TYPE_COUNT]; /* tensors of each output type */
} quantize_report;

moe_status quantize_model(const char *in_path, const char *out_path, const quant_recipe *recipe,
                          const quantize_options *opts, quantize_report *report, moe_error *err);

#endif
