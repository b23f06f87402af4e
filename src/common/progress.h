/*
 * progress.h — a one-line progress bar for long operations.
 *
 * Drawn on stderr only when stderr is a terminal (so logs and pipes stay
 * clean), redrawn at most ~10 times a second, safe to update from several
 * threads. Shows percentage, done/total in the caller's unit, rate and ETA.
 */
#ifndef MOE_COMMON_PROGRESS_H
#define MOE_COMMON_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct progress progress;

/* `label` is printed before the bar; `unit_scale`/`unit` format amounts, e.g.
 * 1e-6 and "MB" for a byte count. Returns NULL (a valid no-op bar) when
 * stderr is not a terminal or allocation fails. */
progress *progress_start(const char *label, uint64_t total, double unit_scale, const char *unit);
void progress_add(progress *p, uint64_t amount);
/* Draw the final state and a newline; frees p. */
void progress_finish(progress *p);

/* Force drawing even when stderr is not a terminal (tests). */
void progress_force_terminal(bool force);

#endif
