/* atomic_file.c — see atomic_file.h. */

#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"

/* The temp path a signal handler should remove; a copy owned here, because
 * the handler cannot take locks or follow pointers that may be freed. */
static char pending_temp[4096];
static volatile sig_atomic_t pending_set;

moe_status atomic_file_open(atomic_file *f, const char *path, moe_error *err) {
    f->fd = -1;
    f->path = strdup(path);
    size_t n = strlen(path) + 32;
    f->temp_path = malloc(n);
    if (!f->path || !f->temp_path) {
        free(f->path);
        free(f->temp_path);
        return moe_error_set(err, MOE_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(f->temp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->temp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        moe_status st = moe_error_set(err, MOE_ERR_IO, "cannot create %s: %s", f->temp_path, strerror(errno));
        free(f->path);
        free(f->temp_path);
        return st;
    }
    if (strlen(f->temp_path) < sizeof pending_temp) {
        pending_set = 0;
        memcpy(pending_temp, f->temp_path, strlen(f->temp_path) + 1);
        pending_set = 1;
    }
    return MOE_OK;
}

static void release(atomic_file *f) {
    if (pending_set && strcmp(pending_temp, f->temp_path) == 0) pending_set = 0;
    free(f->path);
    free(f->temp_path);
    f->path = f->temp_path = NULL;
    f->fd = -1;
}

static void fsync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int dir = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync(dir); /* best effort: some file systems refuse directory fsync */
        close(dir);
    }
    free(copy);
}

moe_status atomic_file_commit(atomic_file *f, moe_error *err) {
    moe_status st = MOE_OK;
    if (fsync(f->fd) != 0)
        st = moe_error_set(err, MOE_ERR_IO, "cannot sync %s: %s", f->temp_path, strerror(errno));
    if (close(f->fd) != 0 && st == MOE_OK)
        st = moe_error_set(err, MOE_ERR_IO, "cannot close %s: %s", f->temp_path, strerror(errno));
    f->fd = -1;
    if (st == MOE_OK && rename(f->temp_path, f->path) != 0)
        st = moe_error_set(err, MOE_ERR_IO, "cannot rename %s to %s: %s", f->temp_path, f->path, strerror(errno));
    if (st == MOE_OK)
        fsync_parent_dir(f->path);
    else
        unlink(f->temp_path);
    release(f);
    return st;
}

void atomic_file_abort(atomic_file *f) {
    if (!f->temp_path) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->temp_path);
    release(f);
}

void atomic_file_remove_pending(void) {
    if (pending_set) unlink(pending_temp);
}
