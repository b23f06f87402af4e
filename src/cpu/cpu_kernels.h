/*
 * cpu_kernels.h — the fastest dot product this CPU has for each format.
 *
 * The portable kernels are quant_format.dot (src/quant); where the CPU has
 * AVX2 or AVX-512 (checked once, at run time), faster twins replace them.
 * Every fast kernel is tested against the portable one on random rows.
 */
#ifndef MOE_CPU_KERNELS_H
#define MOE_CPU_KERNELS_H

#include "quant/quant.h"

/* The dot kernel for weights of `weight_type` against activations quantized
 * to its dot_type. Never NULL for a supported type. */
quant_dot_fn cpu_dot_kernel(moe_type weight_type);

/* "avx512", "avx2" or "portable": what cpu_dot_kernel picks from. */
const char *cpu_kernel_isa(void);

#endif
