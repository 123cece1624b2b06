/* kv_blocks.h - the KV cache's blocks: which block of the pool holds which rows of which slot.
 *
 * The KV cache is a pool of blocks of block_rows positions each (every layer's K and V rows of
 * those positions; the forward lays them out, forward.c). A KV slot (one sequence's place, see
 * session.h) holds a table of blocks: its row p is row p % block_rows of block
 * table[p / block_rows]. A slot holds blocks for the rows it has and no more, so short sequences
 * leave the rest of the pool to others, and a slot whose sequence ended keeps its blocks (its
 * rows serve a later prompt with the same prefix) until someone needs them.
 *
 * Blocks are shared in place: a prompt that shares another slot's full blocks maps them into its
 * own table (kv_blocks_share), each block counting the tables that hold it. A shared block is
 * read-only: before a slot writes rows into a block another table also holds, it gets a copy of
 * its own (copy on write: kv_blocks_reserve lists the copies the forward must make).
 *
 * The prefix index: a block whose rows are all computed is keyed by a hash chain of its rows (the
 * key of the block before it, then its rows' values: token ids, or an image row's key and place;
 * kv_blocks_key). When no table holds a keyed block any more it is not freed but cached: it stays
 * in the index, and a later prompt whose rows chain to the same key maps it into its own table
 * (kv_blocks_match, kv_blocks_adopt) instead of computing those rows again. Cached blocks count as
 * free: taking a block when no unkeyed one is left evicts the least recently cached. A match is
 * verified against the block's stored rows and parent key, so a hash collision never maps wrong
 * rows. A keyed block is never written again: a slot that would write into one (its own, rows past
 * what it keeps) gets a copy, as for a shared block, and the keyed one stays cached.
 *
 * Fixed form (block_rows == n_ctx): one block per slot, block s is slot s's and never moves; this
 * is the layout where a backend has no paged attention (CUDA without TIDE_CUDA_PAGED=1):
 * reserve, share and trim then do nothing, and there is no index. Only the engine thread uses it. */
#ifndef TIDE_KV_BLOCKS_H
#define TIDE_KV_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_blocks {
    int n_slots;        /* KV slots (sequences at once) */
    int n_ctx;          /* positions a slot holds at most */
    int block_rows;     /* positions a block: a power of two, or n_ctx (fixed) */
    int per_slot;       /* table entries a slot: n_ctx / block_rows, rounded up */
    int n_blocks;       /* blocks in the pool */
    bool fixed;         /* one block per slot, block s = slot s */
    int32_t *table;     /* (n_slots, per_slot) each slot's blocks in row order; -1: none */
    int *held;          /* (n_slots) entries of each table that hold a block (a prefix of it) */
    uint16_t *refs;     /* (n_blocks) tables that hold each block; 0: free */
    int32_t *free_list; /* (n_blocks) the free blocks without a key, a stack */
    int n_free;         /* blocks no table holds: the free list's and the cached ones */
    /* the prefix index (paged form only; all NULL in the fixed form) */
    uint64_t seed;      /* mixed into every key (per process) */
    uint64_t *key;      /* (n_blocks) chain key of the block's rows; 0: not keyed */
    uint64_t *parent;   /* (n_blocks) the key of the block before it in its chain (0: it is block 0) */
    uint64_t *vals;     /* (n_blocks, block_rows) the keyed block's row values, to verify a match */
    int32_t *index;     /* (index_cap) open addressing over key: a block, -1 empty, -2 removed */
    int index_cap, index_live, index_dead;
    int32_t *lru_prev, *lru_next; /* (n_blocks) the cached blocks, least recently cached first */
    int32_t lru_head, lru_tail;
    int n_cached;       /* keyed blocks no table holds (counted in n_free) */
    uint64_t *chain;    /* (n_slots, per_slot) each slot's keys of its blocks 0..n_keyed-1 */
    int *n_keyed;       /* (n_slots) leading blocks of each slot whose chain key is known */
    uint64_t evicted;   /* cached blocks taken for other rows (a counter) */
};

/* A block copy the forward must make before a step writes (copy on write), or to complete a
 * shared prefix's partial block: every layer's K and V rows of block src into block dst. */
struct kv_block_copy {
    int32_t src, dst;
};

/* block_rows 0 or >= n_ctx: the fixed form (n_blocks is then n_slots). Else block_rows must be a
 * power of two and n_blocks hold at least one slot's n_ctx rows. */
int kv_blocks_init(struct kv_blocks *kb, int n_slots, int n_ctx, int block_rows, int n_blocks);
void kv_blocks_free(struct kv_blocks *kb);
/* Slot `slot`'s table (per_slot entries). */
static inline const int32_t *kv_blocks_table(const struct kv_blocks *kb, int slot)
{
    return kb->table + (size_t)slot * kb->per_slot;
}
/* Blocks needed to hold rows 0..rows-1. */
static inline int kv_blocks_for(const struct kv_blocks *kb, int rows)
{
    return kb->fixed ? (rows > 0) : (rows + kb->block_rows - 1) / kb->block_rows;
}
/* Free blocks that slot needs before it can write rows from..to-1 (its rows before `from` are
 * kept): new blocks past its table, plus a copy of a shared or keyed block it would write into. */
int kv_blocks_need(const struct kv_blocks *kb, int slot, int from, int to);
/* Makes slot's table hold rows 0..to-1 with the blocks that rows from..to-1 go into its own
 * (from <= what the slot holds): new blocks from the free list, and for a block it shares, a
 * private copy (listed in cp, *n_cp of them, at most 2; the caller copies them before writing).
 * TIDE_EFULL with nothing changed when the free blocks are too few. */
int kv_blocks_reserve(struct kv_blocks *kb, int slot, int from, int to, struct kv_block_copy *cp, int *n_cp);
/* Slot keeps rows 0..rows-1: the blocks past those go back (free once no table holds them). */
void kv_blocks_trim(struct kv_blocks *kb, int slot, int rows);
/* Slot dst takes src's rows 0..n-1 in place of its own: src's full blocks among them are mapped
 * into dst's table (shared, read-only); a last partial block is a new block of dst's, listed in
 * cp (one copy) for the caller to fill from src's. Returns the rows dst now holds from src: n, or
 * n rounded down to a block when no block is free for the partial one. Not in the fixed form
 * (TIDE_EUNSUPPORTED: the caller copies rows between the slots' blocks instead). */
int kv_blocks_share(struct kv_blocks *kb, int src, int dst, int n, struct kv_block_copy *cp, int *n_cp);
/* ---- the prefix index ---- */
/* The value of a token row (ids >= 0) for the chain; image rows use kv_blocks_image_row_value. */
static inline uint64_t kv_blocks_token_value(int id) { return (uint64_t)(uint32_t)id; }
/* The value of row `row` of an image (key: its content hash's first 8 bytes as a number, with
 * the image's first row and row count): never equal to a token's value. */
uint64_t kv_blocks_image_row_value(uint64_t key, int at, int n, int row);
/* Leading blocks of slot's table whose chain keys are known (keyed, or matched to a keyed one). */
static inline int kv_blocks_keyed(const struct kv_blocks *kb, int slot) { return kb->n_keyed ? kb->n_keyed[slot] : 0; }
/* Slot's block kv_blocks_keyed(slot) holds rows whose values are vals (block_rows of them), all
 * computed: its chain key is now known, and the block enters the index (unless a block with
 * those rows is already there: then only the chain goes on). Nothing in the fixed form. */
void kv_blocks_key(struct kv_blocks *kb, int slot, const uint64_t *vals);
/* How many leading blocks of a run of rows with values vals (n_blocks * block_rows of them) the
 * index holds, at most n_blocks; found[i] the block holding block i's rows. */
int kv_blocks_match(const struct kv_blocks *kb, const uint64_t *vals, int n_blocks, int32_t *found);
/* Slot's table becomes found[0..m) (shared in place, read-only, as kv_blocks_share maps them): its
 * own blocks go back (cached when keyed). The slot then holds rows 0..m*block_rows-1. */
void kv_blocks_adopt(struct kv_blocks *kb, int slot, const int32_t *found, int m);

/* Blocks that some table holds, and those held by more than one table. */
int kv_blocks_used(const struct kv_blocks *kb);
int kv_blocks_shared(const struct kv_blocks *kb);
/* Blocks slot's table holds. */
static inline int kv_blocks_held(const struct kv_blocks *kb, int slot) { return kb->held[slot]; }
/* Blocks that only this slot's table holds (what trimming it to 0 frees). */
int kv_blocks_own(const struct kv_blocks *kb, int slot);

#endif
