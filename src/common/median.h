/*
 * median.h — the median every timing in moe.c reports (benchmarks, the
 * kernel lab, the GPU's stage profile and timeline).
 */
#ifndef MOE_COMMON_MEDIAN_H
#define MOE_COMMON_MEDIAN_H

/* The median of v[0..n), n > 0; sorts v in place (ascending), so v[0]
 * and v[n - 1] are then the minimum and the maximum. */
double median_sort(double *v, int n);

#endif
