/* kv_blocks.c - the KV cache's block tables and free list (kv_blocks.h). */
#include "kv_blocks.h"
#include "../common.h"

#include <stdlib.h>
#include <string.h>

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
    return 0;
}

void kv_blocks_free(struct kv_blocks *kb)
{
    free(kb->table);
    free(kb->held);
    free(kb->refs);
    free(kb->free_list);
    memset(kb, 0, sizeof *kb);
}

static int32_t *slot_table(struct kv_blocks *kb, int slot) { return kb->table + (size_t)slot * kb->per_slot; }

static int32_t take(struct kv_blocks *kb)
{
    int32_t b = kb->free_list[--kb->n_free];
    kb->refs[b] = 1;
    return b;
}

static void put(struct kv_blocks *kb, int32_t b)
{
    if (--kb->refs[b] == 0)
        kb->free_list[kb->n_free++] = b;
}

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
        n += i >= kb->held[slot] || kb->refs[t[i]] > 1;
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
    for (int i = first; i < last; i++) {
        if (i >= kb->held[slot]) {
            t[i] = take(kb);
            kb->held[slot] = i + 1;
        } else if (kb->refs[t[i]] > 1) { /* shared: this slot writes into a copy of its own */
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
