/*
 * clock.h — the monotonic clock every timing in moe.c reads (benchmarks,
 * progress bars, the server's deadlines and statistics).
 */
#ifndef MOE_COMMON_CLOCK_H
#define MOE_COMMON_CLOCK_H

/* Seconds on CLOCK_MONOTONIC: only differences mean anything. */
double monotonic_seconds(void);

#endif
