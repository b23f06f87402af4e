/*
 * merge.c — the merge loop of BPE, shared by both models.
 *
 * Byte-level BPE (merges ranked by their position in the merge list) and
 * SentencePiece-style BPE (merges ranked by the score of the merged token)
 * run the same loop: start from the smallest symbols, repeatedly merge the
 * best adjacent pair, stop when no pair merges. Only the ranking differs,
 * so it is a callback.
 *
 * Symbols form a doubly linked list over an array; candidates wait in a
 * binary min-heap. Merging never re-ranks the queue: a candidate whose
 * symbols changed since it was queued is recognised when it comes up (a
 * symbol was merged away, or the pair's length changed) and dropped. A
 * pre-token of k symbols costs O(k log k), so a 100 kB "word" is as fine
 * as a short one.
 */
#include <string.h>

#include "common/error.h"
#include "tokenizer/tokenizer_internal.h"

static bool queue_push(grow_buf *q, merge_candidate c) {
    if (!grow_buf_reserve(q, q->len + 1, sizeof c)) return false;
    merge_candidate *heap = q->data;
    size_t i = q->len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent].key <= c.key) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = c;
    return true;
}

static merge_candidate queue_pop(grow_buf *q) {
    merge_candidate *heap = q->data;
    merge_candidate top = heap[0], last = heap[--q->len];
    size_t n = q->len, i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap[child + 1].key < heap[child].key) child++;
        if (last.key <= heap[child].key) break;
        heap[i] = heap[child];
        i = child;
    }
    if (n > 0) heap[i] = last;
    return top;
}

/* Queue the pair (left, right) if the model merges it. */
static bool queue_pair(encode_state *es, const char *input, merge_rank_fn rank, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const merge_symbol *sym = es->symbols.data;
    uint32_t priority;
    int32_t result;
    if (!rank(es, input, &sym[left], &sym[right], &priority, &result)) return true;
    merge_candidate c = {
        .key = (uint64_t)priority << 32 | (uint32_t)left,
        .left = left,
        .right = right,
        .result = result,
        .len = sym[left].len + sym[right].len,
    };
    return queue_push(&es->queue, c);
}

/* One symbol per byte, or per UTF-8 character with each invalid byte on
 * its own (it can only become a byte-fallback token). */
static size_t symbols_split(encode_state *es, const char *input, size_t len, bool by_byte, merge_first_id_fn first_id) {
    merge_symbol *sym = es->symbols.data;
    size_t n = 0;
    for (size_t pos = 0; pos < len; n++) {
        int k = by_byte ? 1 : utf8_sequence((const uint8_t *)input + pos, len - pos);
        size_t step = k > 0 ? (size_t)k : 1;
        sym[n] = (merge_symbol){
            .id = first_id(es, input + pos, step),
            .prev = (int32_t)n - 1,
            .next = (int32_t)n + 1,
            .pos = (uint32_t)pos,
            .len = (uint32_t)step,
        };
        pos += step;
    }
    sym[n - 1].next = -1;
    return n;
}

static bool candidate_is_current(const merge_symbol *sym, const merge_candidate *c) {
    const merge_symbol *l = &sym[c->left], *r = &sym[c->right];
    return l->len > 0 && r->len > 0 && l->next == c->right && l->len + r->len == c->len;
}

/* The merged symbols become their tokens, or bytes when a symbol is no
 * token (a character outside the vocabulary). */
static moe_status symbols_emit(encode_state *es, const char *input) {
    moe_status st = MOE_OK;
    for (int32_t i = 0; i >= 0 && st == MOE_OK;) {
        const merge_symbol *s = &((const merge_symbol *)es->symbols.data)[i];
        st = s->id >= 0 ? encode_push(es, s->id) : encode_push_bytes(es, (const uint8_t *)input + s->pos, s->len);
        i = s->next;
    }
    return st;
}

moe_status merge_encode(encode_state *es, const char *input, size_t len, bool by_byte, merge_first_id_fn first_id,
                        merge_rank_fn rank) {
    if (len == 0) return MOE_OK;
    if (!grow_buf_reserve(&es->symbols, len, sizeof(merge_symbol)))
        return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory encoding a piece of %zu bytes", len);
    size_t n = symbols_split(es, input, len, by_byte, first_id);
    merge_symbol *sym = es->symbols.data;
    es->queue.len = 0;
    bool ok = true;
    for (size_t i = 1; i < n && ok; i++) ok = queue_pair(es, input, rank, (int32_t)i - 1, (int32_t)i);
    while (ok && es->queue.len > 0) {
        merge_candidate c = queue_pop(&es->queue);
        if (!candidate_is_current(sym, &c)) continue;
        merge_symbol *l = &sym[c.left], *r = &sym[c.right];
        l->id = c.result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        ok = queue_pair(es, input, rank, l->prev, c.left) && queue_pair(es, input, rank, c.left, l->next);
    }
    if (!ok) return moe_error_set(es->err, MOE_ERR_NOMEM, "out of memory encoding a piece of %zu bytes", len);
    return symbols_emit(es, input);
}
