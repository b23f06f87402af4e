/*
 * atomic_file.h — write a file so that a crash never leaves it half-written.
 *
 * Data goes to "<path>.tmp.<pid>" in the same directory; commit fsyncs it,
 * renames it over <path> and fsyncs the directory, so a reader sees either
 * the old file or the complete new one. abort (or a Ctrl-C handled through
 * atomic_file_remove_pending) deletes the temp file.
 */
#ifndef MOE_COMMON_ATOMIC_FILE_H
#define MOE_COMMON_ATOMIC_FILE_H

#include "moe.h"

typedef struct atomic_file {
    int fd;              /* write here; -1 once committed or aborted */
    char *path;          /* the final name */
    char *temp_path;     /* where the bytes go until commit */
} atomic_file;

moe_status atomic_file_open(atomic_file *f, const char *path, moe_error *err);
moe_status atomic_file_commit(atomic_file *f, moe_error *err);
void atomic_file_abort(atomic_file *f);

/* Async-signal-safe: unlink the temp file of the atomic file opened most
 * recently and not yet committed or aborted. For SIGINT/SIGTERM handlers. */
void atomic_file_remove_pending(void);

#endif
