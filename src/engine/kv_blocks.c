/* kv_blocks.c - the KV cache's block tables and free list (kv_blocks.h). */
#include "kv_blocks.h"
#include "../common.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix64(uint64_t x) /* a 64-bit finaliser (splitmix64's) */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- the prefix index: open addressing over the keys, removed entries marked -2 ---- */
static size_t index_home(const struct kv_blocks *kb, uint64_t key) { return (size_t)(key & (uint64_t)(kb->index_cap - 1)); }

static int32_t index_find(const struct kv_blocks *kb, uint64_t key)
{
    for (size_t i = index_home(kb, key), k = 0; k < (size_t)kb->index_cap; i = (i + 1) & (size_t)(kb->index_cap - 1), k++) {
        int32_t b = kb->index[i];
        if (b == -1)
            return -1;
        if (b >= 0 && kb->key[b] == key)
            return b;
    }
    return -1;
}

static void index_put(struct kv_blocks *kb, int32_t blk)
{
    size_t i = index_home(kb, kb->key[blk]);
    while (kb->index[i] >= 0)
        i = (i + 1) & (size_t)(kb->index_cap - 1);
    kb->index_dead -= kb->index[i] == -2;
    kb->index[i] = blk;
    kb->index_live++;
}

/* Removed entries only slow the probes: past a quarter of the table, it is built again. */
static void index_rebuild(struct kv_blocks *kb)
{
    for (int i = 0; i < kb->index_cap; i++)
        kb->index[i] = -1;
    kb->index_live = kb->index_dead = 0;
    for (int32_t b = 0; b < kb->n_blocks; b++)
        if (kb->key[b])
            index_put(kb, b);
}

/* Block blk leaves the index (its rows are about to change, or it is taken for other rows). */
static void unkey(struct kv_blocks *kb, int32_t blk)
{
    if (!kb->key || !kb->key[blk])
        return;
    for (size_t i = index_home(kb, kb->key[blk]);; i = (i + 1) & (size_t)(kb->index_cap - 1)) {
        if (kb->index[i] == -1)
            break; /* not indexed: a duplicate of an indexed block's rows never is */
        if (kb->index[i] == blk) {
            kb->index[i] = -2;
            kb->index_live--;
            kb->index_dead++;
            break;
        }
    }
    kb->key[blk] = 0;
    if (kb->index_dead > kb->index_cap / 4)
        index_rebuild(kb);
}

/* ---- the cached blocks: keyed, held by no table, least recently cached first ---- */
static void lru_push(struct kv_blocks *kb, int32_t b)
{
    kb->lru_prev[b] = kb->lru_tail;
    kb->lru_next[b] = -1;
    if (kb->lru_tail >= 0)
        kb->lru_next[kb->lru_tail] = b;
    else
        kb->lru_head = b;
    kb->lru_tail = b;
    kb->n_cached++;
}

static void lru_unlink(struct kv_blocks *kb, int32_t b)
{
    if (kb->lru_prev[b] >= 0)
        kb->lru_next[kb->lru_prev[b]] = kb->lru_next[b];
    else
        kb->lru_head = kb->lru_next[b];
    if (kb->lru_next[b] >= 0)
        kb->lru_prev[kb->lru_next[b]] = kb->lru_prev[b];
    else
        kb->lru_tail = kb->lru_prev[b];
    kb->n_cached--;
}

static int index_alloc(struct kv_blocks *kb)
{
    int cap = 16;
    while (cap < 2 * kb->n_blocks)
        cap *= 2;
    kb->index_cap = cap;
    kb->seed = mix64((uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)kb);
    kb->key = calloc((size_t)kb->n_blocks, sizeof(uint64_t));
    kb->parent = calloc((size_t)kb->n_blocks, sizeof(uint64_t));
    kb->vals = malloc(sizeof(uint64_t) * (size_t)kb->n_blocks * (size_t)kb->block_rows);
    kb->index = malloc(sizeof(int32_t) * (size_t)cap);
    kb->lru_prev = malloc(sizeof(int32_t) * (size_t)kb->n_blocks);
    kb->lru_next = malloc(sizeof(int32_t) * (size_t)kb->n_blocks);
    kb->chain = calloc((size_t)kb->n_slots * (size_t)kb->per_slot, sizeof(uint64_t));
    kb->n_keyed = calloc((size_t)kb->n_slots, sizeof(int));
    if (!kb->key || !kb->parent || !kb->vals || !kb->index || !kb->lru_prev || !kb->lru_next || !kb->chain ||
        !kb->n_keyed)
        return TIDE_ENOMEM;
    for (int i = 0; i < cap; i++)
        kb->index[i] = -1;
    kb->lru_head = kb->lru_tail = -1;
    return 0;
}

int kv_blocks_init(struct kv_blocks *kb, int n_slots, int n_ctx, int block_rows, int n_blocks)
{
    memset(kb, 0, sizeof *kb);
    if (n_slots < 1 || n_ctx < 1)
        return TIDE_EINVAL;
    kb->fixed = block_rows <= 0 || block_rows >= n_ctx;
    if (!kb->fixed && (block_rows & (block_rows - 1)))
        return TIDE_EINVAL;
    kb->n_slots = n_slots;
    kb->n_ctx = n_ctx;
    kb->block_rows = kb->fixed ? n_ctx : block_rows;
    kb->per_slot = kb->fixed ? 1 : (n_ctx + block_rows - 1) / block_rows;
    kb->n_blocks = kb->fixed ? n_slots : n_blocks;
    if (kb->n_blocks < kb->per_slot) /* the pool must hold one whole context */
        return TIDE_EINVAL;
    kb->table = malloc(sizeof(int32_t) * (size_t)n_slots * kb->per_slot);
    kb->held = calloc((size_t)n_slots, sizeof(int));
    kb->refs = calloc((size_t)kb->n_blocks, sizeof(uint16_t));
    kb->free_list = malloc(sizeof(int32_t) * (size_t)kb->n_blocks);
    if (!kb->table || !kb->held || !kb->refs || !kb->free_list) {
        kv_blocks_free(kb);
        return TIDE_ENOMEM;
    }
    memset(kb->table, 0xff, sizeof(int32_t) * (size_t)n_slots * kb->per_slot);
    if (kb->fixed) {
        for (int s = 0; s < n_slots; s++) {
            kb->table[s] = s;
            kb->held[s] = 1;
            kb->refs[s] = 1;
        }
        return 0;
    }
    for (int b = kb->n_blocks - 1; b >= 0; b--) /* block 0 is taken first */
        kb->free_list[kb->n_free++] = b;
    if (index_alloc(kb) < 0) {
        kv_blocks_free(kb);
        return TIDE_ENOMEM;
    }
    return 0;
}

void kv_blocks_free(struct kv_blocks *kb)
{
    free(kb->table);
    free(kb->held);
    free(kb->refs);
    free(kb->free_list);
    free(kb->key);
    free(kb->parent);
    free(kb->vals);
    free(kb->index);
    free(kb->lru_prev);
    free(kb->lru_next);
    free(kb->chain);
    free(kb->n_keyed);
    memset(kb, 0, sizeof *kb);
}

static int32_t *slot_table(struct kv_blocks *kb, int slot) { return kb->table + (size_t)slot * kb->per_slot; }

/* A block for new rows: an unkeyed free one, else the least recently cached one (evicted from the
 * index). The caller has checked n_free. */
static int32_t take(struct kv_blocks *kb)
{
    int32_t b;
    if (kb->n_free > kb->n_cached) {
        b = kb->free_list[kb->n_free - kb->n_cached - 1];
    } else {
        b = kb->lru_head;
        lru_unlink(kb, b);
        unkey(kb, b);
        kb->evicted++;
    }
    kb->n_free--;
    kb->refs[b] = 1;
    return b;
}

/* A table lets go of b: once none holds it, it is free, or cached while it is keyed. */
static void put(struct kv_blocks *kb, int32_t b)
{
    if (--kb->refs[b] > 0)
        return;
    if (kb->key && kb->key[b])
        lru_push(kb, b);
    else
        kb->free_list[kb->n_free - kb->n_cached] = b;
    kb->n_free++;
}

/* A table takes b (it may be cached: it leaves the cached list) */
static void hold(struct kv_blocks *kb, int32_t b)
{
    if (kb->refs[b]++ == 0) {
        lru_unlink(kb, b);
        kb->n_free--;
    }
}

/* A keyed block's rows are in the index: a slot never writes into one (it takes a copy), so a later
 * prompt still finds them. */
static bool keyed(const struct kv_blocks *kb, int32_t b) { return kb->key && kb->key[b]; }

/* The table entries a write of rows from..to-1 touches: first..last-1 (first may be below
 * from's block when the slot holds fewer rows than from: the blocks between are new too). */
static void write_span(const struct kv_blocks *kb, int slot, int from, int to, int *first, int *last)
{
    int fb = from / kb->block_rows, held = kb->held[slot];
    *first = held < fb ? held : fb;
    *last = kv_blocks_for(kb, to);
}

int kv_blocks_need(const struct kv_blocks *kb, int slot, int from, int to)
{
    if (kb->fixed || to <= from)
        return 0;
    const int32_t *t = kv_blocks_table(kb, slot);
    int first, last, n = 0;
    write_span(kb, slot, from, to, &first, &last);
    for (int i = first; i < last; i++)
        n += i >= kb->held[slot] || kb->refs[t[i]] > 1 || keyed(kb, t[i]);
    return n;
}

int kv_blocks_reserve(struct kv_blocks *kb, int slot, int from, int to, struct kv_block_copy *cp, int *n_cp)
{
    *n_cp = 0;
    if (slot < 0 || slot >= kb->n_slots || from < 0 || to > kb->n_ctx || from > to)
        return TIDE_EINVAL;
    if (kb->fixed || to == from)
        return 0;
    if (kv_blocks_need(kb, slot, from, to) > kb->n_free)
        return TIDE_EFULL;
    int32_t *t = slot_table(kb, slot);
    int first, last, br = kb->block_rows;
    write_span(kb, slot, from, to, &first, &last);
    if (kb->n_keyed[slot] > first) /* the blocks written from here on get new chain keys */
        kb->n_keyed[slot] = first;
    for (int i = first; i < last; i++) {
        if (i >= kb->held[slot]) {
            t[i] = take(kb);
            kb->held[slot] = i + 1;
        } else if (kb->refs[t[i]] > 1 || keyed(kb, t[i])) { /* shared or indexed: the slot writes into a copy */
            int32_t nb = take(kb);
            if (i * br < from || (i + 1) * br > to) /* rows of the block outside the write stay */
                cp[(*n_cp)++] = (struct kv_block_copy){t[i], nb};
            put(kb, t[i]);
            t[i] = nb;
        }
    }
    return 0;
}

void kv_blocks_trim(struct kv_blocks *kb, int slot, int rows)
{
    if (kb->fixed || slot < 0 || slot >= kb->n_slots)
        return;
    int32_t *t = slot_table(kb, slot);
    int keep = kv_blocks_for(kb, rows < 0 ? 0 : rows);
    int whole = (rows < 0 ? 0 : rows) / kb->block_rows;
    if (kb->n_keyed[slot] > whole) /* a block the slot keeps only part of will be written again */
        kb->n_keyed[slot] = whole;
    for (int i = keep; i < kb->held[slot]; i++) {
        put(kb, t[i]);
        t[i] = -1;
    }
    if (kb->held[slot] > keep)
        kb->held[slot] = keep;
}

int kv_blocks_share(struct kv_blocks *kb, int src, int dst, int n, struct kv_block_copy *cp, int *n_cp)
{
    *n_cp = 0;
    if (kb->fixed)
        return TIDE_EUNSUPPORTED;
    if (src < 0 || src >= kb->n_slots || dst < 0 || dst >= kb->n_slots || n < 0 || n > kb->n_ctx)
        return TIDE_EINVAL;
    int br = kb->block_rows, full = n / br, part = n % br;
    if (full + (part > 0) > kb->held[src])
        return TIDE_EINVAL; /* src does not hold those rows */
    if (src == dst)
        return n;
    int32_t *ts = slot_table(kb, src), *td = slot_table(kb, dst);
    for (int i = 0; i < full; i++) /* counted first: a block both tables hold is never freed here */
        kb->refs[ts[i]]++;
    kv_blocks_trim(kb, dst, 0);
    for (int i = 0; i < full; i++)
        td[i] = ts[i];
    kb->held[dst] = full;
    kb->n_keyed[dst] = kb->n_keyed[src] < full ? kb->n_keyed[src] : full; /* the same rows: the same keys */
    memcpy(kb->chain + (size_t)dst * kb->per_slot, kb->chain + (size_t)src * kb->per_slot,
           sizeof(uint64_t) * (size_t)kb->n_keyed[dst]);
    if (part && kb->n_free > 0) {
        td[full] = take(kb);
        kb->held[dst] = full + 1;
        cp[(*n_cp)++] = (struct kv_block_copy){ts[full], td[full]};
        return n;
    }
    return full * br;
}

int kv_blocks_used(const struct kv_blocks *kb)
{
    int n = 0;
    for (int b = 0; b < kb->n_blocks; b++)
        n += kb->refs[b] > 0;
    return n;
}

int kv_blocks_shared(const struct kv_blocks *kb)
{
    int n = 0;
    for (int b = 0; b < kb->n_blocks; b++)
        n += kb->refs[b] > 1;
    return n;
}

int kv_blocks_own(const struct kv_blocks *kb, int slot)
{
    const int32_t *t = kv_blocks_table(kb, slot);
    int n = 0;
    for (int i = 0; i < kb->held[slot]; i++)
        n += kb->refs[t[i]] == 1;
    return n;
}

/* ---- the prefix index ---- */
uint64_t kv_blocks_image_row_value(uint64_t key, int at, int n, int row)
{
    uint64_t v = mix64(key ^ mix64(((uint64_t)(uint32_t)at << 32) | (uint32_t)n) ^ (uint64_t)(uint32_t)row);
    return v | (1ull << 63); /* token values are below 2^32 */
}

/* The chain key of a block of rows vals that follows the block keyed parent (0 at row 0); never 0. */
static uint64_t chain_key(const struct kv_blocks *kb, uint64_t parent, const uint64_t *vals)
{
    uint64_t h = mix64(kb->seed ^ parent);
    for (int r = 0; r < kb->block_rows; r++)
        h = mix64(h ^ vals[r]) + 0x9e3779b97f4a7c15ull;
    return h ? h : 1;
}

void kv_blocks_key(struct kv_blocks *kb, int slot, const uint64_t *vals)
{
    if (kb->fixed || slot < 0 || slot >= kb->n_slots)
        return;
    int j = kb->n_keyed[slot];
    if (j >= kb->held[slot])
        return;
    uint64_t *chain = kb->chain + (size_t)slot * kb->per_slot;
    uint64_t parent = j ? chain[j - 1] : 0, key = chain_key(kb, parent, vals);
    int32_t b = slot_table(kb, slot)[j];
    chain[j] = key;
    kb->n_keyed[slot] = j + 1;
    if (kb->key[b] == key)
        return; /* adopted from the index, or keyed before */
    unkey(kb, b);
    if (index_find(kb, key) >= 0)
        return; /* another block holds these rows already: it stays the indexed one */
    kb->key[b] = key;
    kb->parent[b] = parent;
    memcpy(kb->vals + (size_t)b * kb->block_rows, vals, sizeof(uint64_t) * (size_t)kb->block_rows);
    index_put(kb, b);
}

int kv_blocks_match(const struct kv_blocks *kb, const uint64_t *vals, int n_blocks, int32_t *found)
{
    if (kb->fixed)
        return 0;
    uint64_t parent = 0;
    int m = 0, br = kb->block_rows;
    for (; m < n_blocks && m < kb->per_slot; m++) {
        const uint64_t *v = vals + (size_t)m * br;
        uint64_t key = chain_key(kb, parent, v);
        int32_t b = index_find(kb, key);
        if (b < 0 || kb->parent[b] != parent || memcmp(kb->vals + (size_t)b * br, v, sizeof(uint64_t) * (size_t)br))
            break;
        found[m] = b;
        parent = key;
    }
    return m;
}

void kv_blocks_adopt(struct kv_blocks *kb, int slot, const int32_t *found, int m)
{
    if (kb->fixed || slot < 0 || slot >= kb->n_slots || m <= 0)
        return;
    for (int i = 0; i < m; i++) /* held first: a block the slot has already is never let go here */
        hold(kb, found[i]);
    kv_blocks_trim(kb, slot, 0);
    int32_t *t = slot_table(kb, slot);
    uint64_t *chain = kb->chain + (size_t)slot * kb->per_slot;
    for (int i = 0; i < m; i++) {
        t[i] = found[i];
        chain[i] = kb->key[found[i]];
    }
    kb->held[slot] = m;
    kb->n_keyed[slot] = m;
}
