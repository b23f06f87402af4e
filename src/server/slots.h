/*
 * slots.h — the server's generation slots and the bounded queue in front.
 *
 * A slot is one worker thread with one moe_session (its own KV cache and
 * sampler); all slots share one moe_model. A job goes to an idle slot, the
 * one whose last prompt shares the longest beginning with the new one (so
 * a conversation tends to come back to the slot that holds its cache), or
 * else waits in a FIFO queue of bounded length; when that is full the
 * submission is refused and the client gets a 503.
 */
#ifndef MOE_SERVER_SLOTS_H
#define MOE_SERVER_SLOTS_H

#include "moe.h"
#include "server/job.h"

typedef struct slot_pool slot_pool;

typedef enum slot_submit {
    SLOT_ACCEPTED,
    SLOT_QUEUE_FULL,
    SLOT_DRAINING, /* the pool is shutting down */
} slot_submit;

typedef struct slot_stats {
    int slots, busy, queued, queue_cap;
} slot_stats;

/* n_slots sessions made now (so a context too large for memory fails at
 * start, not at the first request), from params. */
moe_status slot_pool_new(moe_model *m, const moe_session_params *params, int n_slots, int queue_cap, slot_pool **out,
                         moe_error *err);

/* On SLOT_ACCEPTED the pool holds its own reference to j until j is done. */
slot_submit slot_pool_submit(slot_pool *p, job *j);

/* Positions each slot's context holds. */
int slot_pool_n_ctx(const slot_pool *p);

slot_stats slot_pool_stats(slot_pool *p);

/* Stop taking jobs, give the running and queued ones up to `seconds` to
 * finish, then cancel what is left (running ones stop at their next token
 * and send what they have; queued ones are answered 503) and wait for it. */
void slot_pool_drain(slot_pool *p, double seconds);

/* Drain without grace if not drained, stop the workers, free. */
void slot_pool_free(slot_pool *p);

#endif
