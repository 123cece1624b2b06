/* prefix_cache.c - the engine's side of the KV blocks' prefix index (kv_blocks.h): full blocks of
 * computed rows are keyed as the steps complete them, and a new prompt maps the blocks whose rows
 * it shares into its slot instead of computing them again.
 *
 * A block's rows are named by their values (kv_blocks.h): a token row by its id, an image row by
 * its image's content hash, first row, row count and place in the image (prompt_rows.h's rule:
 * the same image at the same place). The chain stops at an image row without a key: nothing from
 * there on is ever matched. On the CPU a mapped block holds the bits the prompt would compute
 * (a row depends only on the rows before it), so a reply is unchanged by where its rows came
 * from. Only the engine thread runs this. */
#include "sequence_internal.h"

#include <stdlib.h>
#include <string.h>

/* Values of rows from..to-1 of r into out; returns how many rows have one (it stops at an image
 * row without a key). */
static int row_values(const struct prompt_rows *r, int from, int to, uint64_t *out)
{
    int im = 0;
    for (int k = from; k < to; k++) {
        if (r->ids[k] >= 0) {
            out[k - from] = kv_blocks_token_value(r->ids[k]);
            continue;
        }
        while (im < r->n_img && r->img[im].at + r->img[im].n <= k)
            im++;
        const struct row_image *x = im < r->n_img && r->img[im].at <= k ? &r->img[im] : NULL;
        if (!x || !x->keyed)
            return k - from;
        uint64_t key = 0;
        for (int b = 0; b < ROW_IMAGE_KEY_BYTES; b += 8) { /* the whole hash folded into 64 bits */
            uint64_t w;
            memcpy(&w, x->key + b, 8);
            key = key * 0x100000001b3ull ^ w;
        }
        out[k - from] = kv_blocks_image_row_value(key, x->at, x->n, k - x->at);
    }
    return to - from;
}

static bool indexed(const struct engine *e) { return !e->fw.kv.fixed && e->kv_share; }

void prefix_cache_key_slot(struct engine *e, int slot)
{
    struct kv_blocks *kb = &e->fw.kv;
    if (!indexed(e))
        return;
    struct kv_slot *s = &e->slots[slot];
    struct prompt_rows r = slot_rows(s);
    uint64_t vals[512];
    int br = kb->block_rows;
    if (br > (int)(sizeof vals / sizeof vals[0]))
        return;
    for (int j = kv_blocks_keyed(kb, slot); (j + 1) * br <= s->n_tokens && j < kv_blocks_held(kb, slot); j++) {
        if (row_values(&r, j * br, (j + 1) * br, vals) < br)
            return;
        kv_blocks_key(kb, slot, vals);
    }
}

int prefix_cache_adopt(struct engine *e, int slot, const struct prompt_rows *r, int limit, int keep)
{
    struct kv_blocks *kb = &e->fw.kv;
    if (!indexed(e))
        return keep;
    int br = kb->block_rows, n_blocks = (limit < r->n ? limit : r->n) / br;
    if (n_blocks * br <= keep)
        return keep;
    uint64_t *vals = malloc(sizeof(uint64_t) * (size_t)n_blocks * br);
    int32_t *found = malloc(sizeof(int32_t) * (size_t)n_blocks);
    int m = 0;
    if (vals && found) {
        n_blocks = row_values(r, 0, n_blocks * br, vals) / br;
        m = kv_blocks_match(kb, vals, n_blocks, found);
    }
    if (m * br > keep) {
        kv_blocks_adopt(kb, slot, found, m);
        if (e->slots[slot].tokens != r->ids)
            memcpy(e->slots[slot].tokens, r->ids, sizeof(int) * (size_t)(m * br));
        e->block_cache_tokens += (uint64_t)(m * br - keep);
        keep = m * br;
    }
    free(vals);
    free(found);
    return keep;
}
