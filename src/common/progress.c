/* progress.c — see progress.h. */
#include "common/progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

struct progress {
    char label[64];
    const char *unit;
    double unit_scale;
    uint64_t total;
    _Atomic uint64_t done;
    double start_s;
    double last_draw_s;
    pthread_mutex_t draw_lock;
};

static bool force_terminal;

void progress_force_terminal(bool force) { force_terminal = force; }

progress *progress_start(const char *label, uint64_t total, double unit_scale, const char *unit) {
    if (!force_terminal && !isatty(STDERR_FILENO)) return NULL;
    progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->unit = unit;
    p->unit_scale = unit_scale;
    p->total = total ? total : 1;
    p->start_s = p->last_draw_s = monotonic_seconds();
    pthread_mutex_init(&p->draw_lock, NULL);
    return p;
}

static void draw(progress *p, uint64_t done, double now) {
    enum { WIDTH = 30 };
    double frac = (double)done / (double)p->total;
    if (frac > 1) frac = 1;
    char bar[WIDTH + 1];
    int filled = (int)(frac * WIDTH);
    memset(bar, '#', (size_t)filled);
    memset(bar + filled, '.', (size_t)(WIDTH - filled));
    bar[WIDTH] = '\0';
    double elapsed = now - p->start_s;
    double rate = elapsed > 0 ? done * p->unit_scale / elapsed : 0;
    double eta = (frac > 0 && frac < 1) ? elapsed * (1 - frac) / frac : 0;
    fprintf(stderr, "\r%s [%s] %5.1f%% %.1f/%.1f %s  %.1f %s/s  ETA %.0fs ", p->label, bar, frac * 100,
            done * p->unit_scale, p->total * p->unit_scale, p->unit, rate, p->unit, eta);
    fflush(stderr);
}

void progress_add(progress *p, uint64_t amount) {
    if (!p) return;
    uint64_t done = atomic_fetch_add(&p->done, amount) + amount;
    double now = monotonic_seconds();
    if (now - p->last_draw_s < 0.1 || pthread_mutex_trylock(&p->draw_lock) != 0) return;
    p->last_draw_s = now;
    draw(p, done, now);
    pthread_mutex_unlock(&p->draw_lock);
}

void progress_finish(progress *p) {
    if (!p) return;
    draw(p, atomic_load(&p->done), monotonic_seconds());
    fputc('\n', stderr);
    pthread_mutex_destroy(&p->draw_lock);
    free(p);
}
