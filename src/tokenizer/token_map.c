/*
 * token_map.c — the tokenizer's two hash tables.
 *
 * Vocabularies have ~150k tokens and ~150k-280k merges, and the encoder
 * looks up a merge for every adjacent pair it considers, so both lookups
 * are hashed. Both tables use open addressing with linear probing at a
 * load factor of at most 1/2, built once at load time and read-only after.
 * Merges are keyed by the pair of token ids, not by strings: the encoder
 * works on ids, so a lookup is one multiply and a compare.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

/* FNV-1a: short keys (token texts average under 8 bytes), no alignment
 * requirements, and good enough spread for linear probing. */
static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3u;
    }
    return h ^ (h >> 32);
}

/* Fibonacci hashing of the id pair. */
static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15u;
    return key ^ (key >> 29);
}

/* A power of two at least twice n (a half-full table keeps probes short);
 * 0 when that does not fit 32 bits (over 2^30 entries), which callers
 * refuse rather than loop doubling a wrapped capacity. */
static uint32_t capacity_for(size_t n) {
    if (n > (size_t)1 << 30) return 0;
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

bool token_map_build(token_map *m, const string_table *texts) {
    uint32_t cap = capacity_for(texts->n);
    m->slots = cap ? malloc((size_t)cap * sizeof *m->slots) : NULL;
    if (!m->slots) return false;
    memset(m->slots, 0xFF, (size_t)cap * sizeof *m->slots); /* all -1 */
    m->mask = cap - 1;
    for (uint32_t id = 0; id < texts->n; id++) {
        size_t len;
        const char *s = string_at(texts, id, &len);
        if (token_map_find(m, texts, s, len) >= 0) continue; /* first wins */
        uint32_t i = (uint32_t)hash_bytes(s, len) & m->mask;
        while (m->slots[i] >= 0) i = (i + 1) & m->mask;
        m->slots[i] = (int32_t)id;
    }
    return true;
}

int32_t token_map_find(const token_map *m, const string_table *texts, const char *s, size_t len) {
    for (uint32_t i = (uint32_t)hash_bytes(s, len) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        size_t id_len;
        const char *text = string_at(texts, (uint32_t)id, &id_len);
        if (id_len == len && memcmp(text, s, len) == 0) return id;
    }
}

bool merge_map_init(merge_map *m, size_t n) {
    uint32_t cap = capacity_for(n);
    m->slots = cap ? malloc((size_t)cap * sizeof *m->slots) : NULL;
    if (!m->slots) return false;
    for (uint32_t i = 0; i < cap; i++) m->slots[i].key = MERGE_EMPTY;
    m->mask = cap - 1;
    return true;
}

static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t)(uint32_t)left << 32 | (uint32_t)right; }

bool merge_map_insert(merge_map *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = pair_key(left, right);
    uint32_t i = (uint32_t)hash_pair(key) & m->mask;
    for (; m->slots[i].key != MERGE_EMPTY; i = (i + 1) & m->mask)
        if (m->slots[i].key == key) return false;
    m->slots[i] = (merge_slot){.key = key, .rank = rank, .result = result};
    return true;
}

const merge_slot *merge_map_find(const merge_map *m, int32_t left, int32_t right) {
    uint64_t key = pair_key(left, right);
    for (uint32_t i = (uint32_t)hash_pair(key) & m->mask;; i = (i + 1) & m->mask) {
        const merge_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == MERGE_EMPTY) return NULL;
    }
}

void token_map_free(token_map *m) {
    free(m->slots);
    m->slots = NULL;
}

void merge_map_free(merge_map *m) {
    free(m->slots);
    m->slots = NULL;
}
