/* forward_kv.c - moving KV rows: a slot's rows to host memory and back (parking), one slot's
 * rows becoming another's (prefix sharing), and the pool's blocks taken and given back as a
 * slot's rows grow and shrink (kv_blocks.h says what a block is and who holds it). */
#include "forward.h"
#include "forward_internal.h"

#include <stdlib.h>
#include <string.h>

size_t forward_kv_row_bytes(const struct forward_state *s)
{
    return kv_parts(s->m) * kv_pos_bytes(s) * s->m->cfg.n_layer;
}

/* bytes from `from` to `to` in one stage's device memory: its backend's copy, or through host
 * memory (bounce, at least bytes) where the backend has none. */
static void dev_copy(const struct forward_stage *st, void *to, const void *from, size_t bytes, void *bounce)
{
    const struct backend_i *B = st->be.i;
    if (B->copy) {
        B->copy(st->be.ctx, to, from, bytes);
    } else {
        B->download(st->be.ctx, bounce, from, bytes);
        B->upload(st->be.ctx, to, bounce, bytes);
    }
}

/* Every layer's K and V rows 0..rows-1 of block cp[i].src into block cp[i].dst, on each stage's
 * device (through host memory where a backend has no copy). */
static int copy_blocks(struct forward_state *s, const struct kv_block_copy *cp, int n_cp, int rows)
{
    if (n_cp <= 0 || rows <= 0)
        return 0;
    size_t block = (size_t)s->kv.block_rows * kv_pos_bytes(s), bytes = (size_t)rows * kv_pos_bytes(s);
    size_t parts = kv_parts(s->m);
    void *bounce = NULL;
    for (int i = 0; i < s->n_stage; i++) {
        struct forward_stage *st = &s->stage[i];
        const struct backend_i *B = st->be.i;
        if (!B->copy && !bounce && !(bounce = malloc(bytes)))
            return TIDE_ENOMEM;
        for (uint32_t l = st->l0; l < st->l1; l++)
            for (size_t p = 0; p < parts; p++)
                for (int c = 0; c < n_cp; c++) {
                    uint8_t *base = kv_layer(s, st, p ? st->v_cache : st->k_cache, l);
                    dev_copy(st, base + (size_t)cp[c].dst * block, base + (size_t)cp[c].src * block, bytes, bounce);
                }
    }
    free(bounce);
    return 0;
}

int forward_kv_reserve(struct forward_state *s, int slot, int from, int to)
{
    struct kv_block_copy cp[2];
    int n_cp = 0, rc = kv_blocks_reserve(&s->kv, slot, from, to, cp, &n_cp);
    return rc < 0 ? rc : copy_blocks(s, cp, n_cp, s->kv.block_rows);
}

void forward_kv_trim(struct forward_state *s, int slot, int rows) { kv_blocks_trim(&s->kv, slot, rows); }

int forward_kv_copy_rows(struct forward_state *s, int slot, int from, int n, void *host, int host_n, bool save)
{
    if (slot < 0 || slot >= s->n_seq || n < 0 || n > s->n_ctx || host_n < n || from < 0 || from > n)
        return TIDE_EINVAL;
    if (!save) { /* the rows restored must be the slot's own blocks */
        int rc = forward_kv_reserve(s, slot, from, n);
        if (rc < 0)
            return rc;
    } else if (kv_blocks_for(&s->kv, n) > kv_blocks_held(&s->kv, slot)) {
        return TIDE_EINVAL; /* the slot does not hold those rows */
    }
    /* in bytes: the rows travel in the cache's type, f16 or f32; a run of rows in one block a copy */
    size_t rb = kv_pos_bytes(s), hpart = (size_t)host_n * rb, parts = kv_parts(s->m);
    for (int i = 0; i < s->n_stage; i++) {
        struct forward_stage *st = &s->stage[i];
        for (uint32_t l = st->l0; l < st->l1; l++)
            for (size_t p = 0; p < parts; p++) {
                void *cache = p ? st->v_cache : st->k_cache;
                uint8_t *h = (uint8_t *)host + ((size_t)l * parts + p) * hpart;
                for (int r = from, k; r < n; r += k) {
                    k = kv_run(s, r, n - r);
                    void *dev = kv_row(s, st, cache, l, slot, r);
                    if (save)
                        st->be.i->download(st->be.ctx, h + (size_t)r * rb, dev, (size_t)k * rb);
                    else
                        st->be.i->upload(st->be.ctx, dev, h + (size_t)r * rb, (size_t)k * rb);
                }
            }
    }
    return 0;
}

int forward_kv_clone(struct forward_state *s, int src, int dst, int n)
{
    if (src < 0 || src >= s->n_seq || dst < 0 || dst >= s->n_seq || n < 0 || n > s->n_ctx)
        return TIDE_EINVAL;
    if (src == dst || n == 0)
        return n;
    if (!s->kv.fixed) { /* paged: the full blocks shared in place, a partial last one copied */
        struct kv_block_copy cp[2];
        int n_cp = 0, rows = kv_blocks_share(&s->kv, src, dst, n, cp, &n_cp);
        if (rows < 0)
            return rows;
        int rc = copy_blocks(s, cp, n_cp, s->kv.block_rows);
        if (rc < 0) { /* the partial block's rows are not there: keep the whole blocks only */
            kv_blocks_trim(&s->kv, dst, n / s->kv.block_rows * s->kv.block_rows);
            return n / s->kv.block_rows * s->kv.block_rows;
        }
        return rows;
    }
    /* one block a slot: rows 0..n-1 of src's block into dst's */
    struct kv_block_copy whole = {kv_blocks_table(&s->kv, src)[0], kv_blocks_table(&s->kv, dst)[0]};
    int rc = copy_blocks(s, &whole, 1, n);
    return rc < 0 ? rc : n;
}
