/* cpu_kernels.c — see cpu_kernels.h. */
#include "cpu/cpu_kernels.h"

quant_dot_fn cpu_dot_kernel(moe_type weight_type) { return quant_format_of(weight_type)->dot; }

const char *cpu_kernel_isa(void) { return "portable"; }
