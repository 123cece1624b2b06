/* expert_cache.c - slots, segments, LRU, shrink/grow with refill. */
#include "memory/expert_cache.h"
#include "memory/vmm.h"

#include <stdlib.h>
#include <string.h>

#define SLOT_ALIGN 256
#define AUTO_SEGMENTS 32                  /* a full cache is cut in about this many pieces */
#define AUTO_SEG_MAX ((size_t)64 << 20)   /* but no piece over 64 MiB */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t part_bytes(const struct tensor *t) { return t->row_bytes * t->ne[1]; }

void expert_cache_geometry(struct expert_cache *c, const struct model *m, uint32_t l0, uint32_t l1,
                           size_t seg_bytes_hint)
{
    c->m = m;
    c->l0 = l0;
    c->l1 = l1;
    c->n_expert = m->cfg.n_expert;
    c->slot_bytes = 0;
    c->n_routed_keys = 0;
    for (uint32_t l = l0; l < l1 && c->n_expert; l++) {
        if (model_expert_bytes(m, l))
            c->n_routed_keys += c->n_expert;
        struct expert_weights w;
        model_expert_host(m, l, 0, &w);
        size_t b = align_up(part_bytes(&w.gate), SLOT_ALIGN) + align_up(part_bytes(&w.up), SLOT_ALIGN) +
                   align_up(part_bytes(&w.down), SLOT_ALIGN);
        if (b > c->slot_bytes)
            c->slot_bytes = b;
    }
    size_t n_keys = c->n_routed_keys; /* slots beyond it would never be used */
    if (!c->slot_bytes || !n_keys) {
        c->slots_per_seg = 1;
        c->seg_bytes = 0;
        c->n_seg_max = 0;
        return;
    }
    size_t per;
    if (seg_bytes_hint) {
        per = seg_bytes_hint / c->slot_bytes;
    } else {
        per = (n_keys + AUTO_SEGMENTS - 1) / AUTO_SEGMENTS;
        if (per * c->slot_bytes > AUTO_SEG_MAX)
            per = AUTO_SEG_MAX / c->slot_bytes;
    }
    if (per < 1)
        per = 1;
    if (per > n_keys)
        per = n_keys;
    c->slots_per_seg = (int)per;
    c->seg_bytes = per * c->slot_bytes;
    c->n_seg_max = (int)((n_keys + per - 1) / per);
}

int expert_cache_slots(const struct expert_cache *c)
{
    size_t keys = c->n_routed_keys;
    size_t s = (size_t)c->n_seg * c->slots_per_seg;
    return (int)(s < keys ? s : keys);
}

size_t expert_cache_bytes(const struct expert_cache *c) { return (size_t)c->n_seg * c->seg_bytes; }

static int total_slots(const struct expert_cache *c) { return c->n_seg_max * c->slots_per_seg; }

int expert_cache_init(struct expert_cache *c, struct device *d, const struct model *m,
                      uint32_t l0, uint32_t l1, size_t seg_bytes_hint, int n_seg)
{
    memset(c, 0, sizeof *c);
    c->dev = d;
    c->staging_key = -1;
    expert_cache_geometry(c, m, l0, l1, seg_bytes_hint);
    if (!c->n_seg_max)
        return 0; /* dense model or no layers here: nothing to cache */
    if (d->vmm_granularity) {
        /* Segments are physical allocations in granularity units: widen each to a whole number
         * of units and fit as many slots as that holds. */
        size_t g = d->vmm_granularity, seg = align_up(c->seg_bytes, g), keys = c->n_routed_keys;
        c->slots_per_seg = (int)(seg / c->slot_bytes);
        c->seg_bytes = seg;
        c->n_seg_max = (int)((keys + c->slots_per_seg - 1) / c->slots_per_seg);
    }
    size_t n_keys = (size_t)(l1 - l0) * c->n_expert, n_slots = (size_t)total_slots(c);
    c->seg = calloc((size_t)c->n_seg_max, sizeof(void *));
    c->slot_of = malloc(n_keys * sizeof(int32_t));
    c->key_tick = calloc(n_keys, sizeof(uint64_t));
    c->slot_key = malloc(n_slots * sizeof(int32_t));
    c->slot_tick = calloc(n_slots, sizeof(uint64_t));
    if (!c->seg || !c->slot_of || !c->key_tick || !c->slot_key || !c->slot_tick) {
        expert_cache_free(c);
        return TIDE_ENOMEM;
    }
    memset(c->slot_of, 0xff, n_keys * sizeof(int32_t));
    memset(c->slot_key, 0xff, n_slots * sizeof(int32_t));
    if (d->vmm_granularity) {
        int rc = vmm_reserve(d->hw_index, c->seg_bytes, c->n_seg_max, &c->vmm);
        if (rc < 0) {
            expert_cache_free(c);
            return rc;
        }
    }
    c->staging = device_alloc(d, MEM_WORKSPACE, c->slot_bytes);
    if (!c->staging) {
        expert_cache_free(c);
        return TIDE_ERANGE;
    }
    size_t tb = expert_cache_table_bytes(c, d);
    if (tb) {
        c->table_host = calloc(n_keys * 3, sizeof(void *));
        c->table_dev = device_alloc(d, MEM_WORKSPACE, tb);
        if (!c->table_host || !c->table_dev) {
            expert_cache_free(c);
            return c->table_host ? TIDE_ERANGE : TIDE_ENOMEM;
        }
        c->table_dirty = true;
    }
    if (n_seg > c->n_seg_max)
        n_seg = c->n_seg_max;
    c->n_seg_full = c->n_seg_max; /* let resize grow as far as asked */
    int rc = expert_cache_resize(c, n_seg);
    if (rc < 0) {
        expert_cache_free(c);
        return rc;
    }
    c->n_seg_full = c->n_seg;
    return 0;
}

static void seg_release(struct expert_cache *c, int s)
{
    if (c->vmm) {
        vmm_unmap_segment(c->vmm, s);
        device_uncharge(c->dev, MEM_EXPERT_CACHE, c->seg_bytes);
    } else {
        device_free(c->dev, MEM_EXPERT_CACHE, c->seg[s], c->seg_bytes);
    }
    c->seg[s] = NULL;
}

static void *seg_acquire(struct expert_cache *c, int s)
{
    if (!c->vmm)
        return device_alloc(c->dev, MEM_EXPERT_CACHE, c->seg_bytes);
    if (device_charge(c->dev, MEM_EXPERT_CACHE, c->seg_bytes) < 0)
        return NULL;
    if (vmm_map_segment(c->vmm, s, c->seg_bytes) < 0) {
        device_uncharge(c->dev, MEM_EXPERT_CACHE, c->seg_bytes);
        return NULL;
    }
    return (uint8_t *)vmm_base(c->vmm) + (size_t)s * vmm_stride(c->vmm);
}

void expert_cache_free(struct expert_cache *c)
{
    if (c->seg)
        for (int s = 0; s < c->n_seg; s++)
            seg_release(c, s);
    if (c->vmm)
        vmm_release(c->vmm);
    if (c->staging)
        device_free(c->dev, MEM_WORKSPACE, c->staging, c->slot_bytes);
    if (c->table_dev)
        device_free(c->dev, MEM_WORKSPACE, c->table_dev, expert_cache_table_bytes(c, c->dev));
    free(c->table_host);
    free(c->seg);
    free(c->slot_of);
    free(c->key_tick);
    free(c->slot_key);
    free(c->slot_tick);
    memset(c, 0, sizeof *c);
}

static uint8_t *slot_ptr(const struct expert_cache *c, int slot)
{
    return (uint8_t *)c->seg[slot / c->slots_per_seg] + (size_t)(slot % c->slots_per_seg) * c->slot_bytes;
}

/* Views of the expert laid out at base; copies it there first when copy is set. */
static void place(struct expert_cache *c, uint32_t l, uint32_t e, uint8_t *base, bool copy,
                  struct expert_weights *out)
{
    struct expert_weights h;
    model_expert_host(c->m, l, e, &h);
    struct tensor *parts[3] = {&h.gate, &h.up, &h.down};
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        size_t b = part_bytes(parts[i]);
        if (copy) {
            c->dev->be.i->upload(c->dev->be.ctx, base + off, parts[i]->data, b);
            c->bytes_copied += b;
        }
        parts[i]->data = base + off;
        off += align_up(b, SLOT_ALIGN);
    }
    *out = h;
}

/* The live slot to (re)use: a free one, else the least recently used. */
static int victim(const struct expert_cache *c)
{
    int n = (c->n_seg - c->n_borrowed) * c->slots_per_seg, best = -1;
    for (int s = 0; s < n; s++) {
        if (c->slot_key[s] < 0)
            return s;
        if (best < 0 || c->slot_tick[s] < c->slot_tick[best])
            best = s;
    }
    return best;
}

/* A use of key: the newest tick for it, and for its slot when it has one (LRU and refill
 * order). Lookups and the uses replayed after a table step (expert_cache_touch) alike. */
static void mark_used(struct expert_cache *c, int32_t key)
{
    c->tick++;
    c->key_tick[key] = c->tick;
    if (c->slot_of[key] >= 0)
        c->slot_tick[c->slot_of[key]] = c->tick;
}

int expert_cache_lookup(struct expert_cache *c, uint32_t l, uint32_t e, struct expert_weights *out)
{
    if (l < c->l0 || l >= c->l1 || e >= c->n_expert)
        return TIDE_EINVAL;
    int32_t key = (int32_t)((l - c->l0) * c->n_expert + e);
    mark_used(c, key);
    int s = c->slot_of[key];
    if (s >= 0) {
        c->hits++;
        place(c, l, e, slot_ptr(c, s), false, out);
        return 0;
    }
    c->misses++;
    if (c->n_seg - c->n_borrowed == 0) { /* no cache: carry it through the staging slot */
        bool have = c->staging_key == key;
        place(c, l, e, c->staging, !have, out);
        c->staging_key = key;
        return 0;
    }
    s = victim(c);
    if (c->slot_key[s] >= 0)
        c->slot_of[c->slot_key[s]] = -1;
    else
        c->n_live_keys++;
    c->table_dirty = true;
    c->slot_key[s] = key;
    c->slot_of[key] = s;
    c->slot_tick[s] = c->tick;
    place(c, l, e, slot_ptr(c, s), true, out);
    return 0;
}

static void evict_segment(struct expert_cache *c, int s)
{
    for (int i = s * c->slots_per_seg; i < (s + 1) * c->slots_per_seg; i++) {
        if (c->slot_key[i] >= 0) {
            c->slot_of[c->slot_key[i]] = -1;
            c->n_live_keys--;
            c->table_dirty = true;
        }
        c->slot_key[i] = -1;
        c->slot_tick[i] = 0;
    }
}

int expert_cache_borrow(struct expert_cache *c, const size_t *sizes, int n, void **out)
{
    if (c->n_borrowed)
        return TIDE_EINTERNAL;
    int s = c->n_seg - 1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t b = align_up(sizes[i], SLOT_ALIGN);
        if (b > c->seg_bytes || s < 0)
            return TIDE_ERANGE;
        if (off + b > c->seg_bytes) {
            if (--s < 0)
                return TIDE_ERANGE;
            off = 0;
        }
        out[i] = (uint8_t *)c->seg[s] + off;
        off += b;
    }
    c->n_borrowed = c->n_seg - s;
    for (int k = s; k < c->n_seg; k++)
        evict_segment(c, k);
    c->staging_key = -1;
    return 0;
}

void expert_cache_unborrow(struct expert_cache *c)
{
    /* the lent segments come back empty: misses refill them */
    c->n_borrowed = 0;
}

static int cmp_tick_desc(const void *a, const void *b, void *ctx)
{
    const uint64_t *t = ctx;
    uint64_t x = t[*(const int32_t *)a], y = t[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Fill empty live slots with evicted experts, most recently used first, then with experts
 * never used yet, in layer order. So a cache grown to hold every expert holds every expert
 * before the first token (no cold misses, and a decode step may run from the device table),
 * and a smaller one starts with the early layers' experts instead of nothing. */
static void refill(struct expert_cache *c)
{
    size_t n_keys = (size_t)(c->l1 - c->l0) * c->n_expert;
    int32_t *cand = malloc(n_keys * sizeof(int32_t));
    if (!cand)
        return; /* refill is an optimisation: misses will bring them back */
    size_t nc = 0;
    for (size_t k = 0; k < n_keys; k++)
        if (c->slot_of[k] < 0 && c->key_tick[k])
            cand[nc++] = (int32_t)k;
    qsort_r(cand, nc, sizeof(int32_t), cmp_tick_desc, c->key_tick);
    for (size_t k = 0; k < n_keys; k++) /* (not the keys of a dense layer: it has no experts) */
        if (c->slot_of[k] < 0 && !c->key_tick[k] && model_expert_bytes(c->m, c->l0 + (uint32_t)(k / c->n_expert)))
            cand[nc++] = (int32_t)k;
    int n = c->n_seg * c->slots_per_seg;
    size_t next = 0;
    for (int s = 0; s < n && next < nc; s++) {
        if (c->slot_key[s] >= 0)
            continue;
        int32_t key = cand[next++];
        struct expert_weights w;
        place(c, c->l0 + (uint32_t)key / c->n_expert, (uint32_t)key % c->n_expert, slot_ptr(c, s), true, &w);
        c->slot_key[s] = key;
        c->slot_of[key] = s;
        c->slot_tick[s] = c->key_tick[key];
        c->n_live_keys++;
        c->table_dirty = true;
    }
    free(cand);
}

int expert_cache_resize(struct expert_cache *c, int n_seg)
{
    if (n_seg < 0)
        n_seg = 0;
    if (n_seg > c->n_seg_full)
        n_seg = c->n_seg_full;
    bool grew = false;
    while (c->n_seg > n_seg) { /* shrink: drop the tail segment and its experts */
        int s = c->n_seg - 1;
        evict_segment(c, s);
        seg_release(c, s);
        c->n_seg = s;
    }
    while (c->n_seg < n_seg) {
        void *p = seg_acquire(c, c->n_seg);
        if (!p)
            break;
        c->seg[c->n_seg++] = p;
        grew = true;
    }
    if (grew) {
        refill(c);
        /* the refill copies run on the device's copy stream; wait for them, so a regrow is
         * done (and its time honest) when this returns - the next step would wait anyway */
        c->dev->be.i->sync(c->dev->be.ctx);
    }
    c->staging_key = -1;
    return c->n_seg;
}

size_t expert_cache_table_bytes(const struct expert_cache *g, const struct device *d)
{
    if (!d->be.i || !d->be.i->moe_ffn_table || !g->n_seg_max)
        return 0;
    return (size_t)(g->l1 - g->l0) * g->n_expert * 3 * sizeof(void *);
}

bool expert_cache_complete(const struct expert_cache *c)
{
    return c->table_dev && c->n_borrowed == 0 && c->n_live_keys == c->n_routed_keys;
}

int expert_cache_sync_table(struct expert_cache *c)
{
    if (!c->table_dev)
        return TIDE_EUNSUPPORTED;
    if (!c->table_dirty)
        return 0;
    size_t n_keys = (size_t)(c->l1 - c->l0) * c->n_expert;
    for (size_t k = 0; k < n_keys; k++) {
        const void **t = c->table_host + 3 * k;
        int s = c->slot_of[k];
        if (s < 0) {
            t[0] = t[1] = t[2] = NULL;
            continue;
        }
        struct expert_weights w;
        place(c, c->l0 + (uint32_t)(k / c->n_expert), (uint32_t)(k % c->n_expert), slot_ptr(c, s), false, &w);
        t[0] = w.gate.data, t[1] = w.up.data, t[2] = w.down.data;
    }
    /* the upload is queued after every op already queued (which may still read the old
     * table) and before any later one */
    c->dev->be.i->upload(c->dev->be.ctx, c->table_dev, c->table_host, n_keys * 3 * sizeof(void *));
    c->table_dirty = false;
    return 0;
}

const void *const *expert_cache_table(const struct expert_cache *c, uint32_t l)
{
    return (const void *const *)c->table_dev + (size_t)(l - c->l0) * c->n_expert * 3;
}

void expert_cache_touch(struct expert_cache *c, uint32_t l, uint32_t e)
{
    if (l < c->l0 || l >= c->l1 || e >= c->n_expert)
        return;
    int32_t key = (int32_t)((l - c->l0) * c->n_expert + e);
    if (c->slot_of[key] < 0)
        return;
    mark_used(c, key);
    c->hits++;
}
