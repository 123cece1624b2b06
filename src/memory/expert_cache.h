/* expert_cache.h - one device's cache of MoE experts, the only way the forward reaches them.
 *
 * A slot holds one expert of one layer (its gate, up and down matrices, in the file's types).
 * Slots come in segments: whole allocations of slots_per_seg slots each, charged to the
 * device ledger as expert_cache. Shrinking frees whole tail segments (evicting their experts);
 * growing allocates them again and refills them with the experts that were evicted, most
 * recently used first. Replacement is LRU over the live slots. A miss copies the expert from
 * host RAM into a slot and the device computes on that copy, so results never depend on the
 * cache size. With zero live slots a single staging slot (workspace) carries each expert.
 * Engine thread only. */
#ifndef TIDE_EXPERT_CACHE_H
#define TIDE_EXPERT_CACHE_H

#include "engine/model.h"
#include "memory/device.h"

struct vmm_range;

struct expert_cache {
    struct device *dev;
    const struct model *m;
    uint32_t l0, l1;            /* layers [l0, l1) live on this device */
    uint32_t n_expert;
    size_t slot_bytes;          /* largest expert of these layers, 256-byte aligned */
    size_t part_off[3];         /* gate, up, down offsets inside a slot, per the largest layer */
    int slots_per_seg;
    size_t seg_bytes;           /* slots_per_seg * slot_bytes */
    int n_seg_max;              /* segments that would hold every expert of these layers */
    int n_seg_full;             /* start-up size: what restore grows back to */
    int n_seg;                  /* live segments: seg[0..n_seg) are allocated */
    void **seg;                 /* (n_seg_max) */
    int32_t *slot_of;           /* ((l1-l0) * n_expert) -> live slot, or -1 */
    int32_t *slot_key;          /* (n_seg_max * slots_per_seg) -> (l - l0) * n_expert + e, or -1 */
    uint64_t *slot_tick;        /* (n_seg_max * slots_per_seg) last use, for LRU */
    uint64_t *key_tick;         /* ((l1-l0) * n_expert) last use of each expert, for refill order */
    uint64_t tick;
    struct vmm_range *vmm;      /* CUDA with VMM: seg[i] = base + i * stride, mapped on demand */
    void *staging;              /* one slot, workspace: used only while n_seg == 0 */
    int32_t staging_key;
    int n_borrowed;             /* tail segments lent as prefill scratch right now */
    uint64_t hits, misses, bytes_copied;
    size_t n_live_keys;         /* experts that have a live slot */
    size_t n_routed_keys;       /* the experts of these layers: keys of layers that have experts
                                 * (deepseek2's leading dense layers have none) */
    /* The device's view of the slots, for backends that run a decode step's experts without
     * the host (backend_i.moe_ffn_table): per expert of these layers, the device addresses of
     * its gate, up and down data (NULL when it has no slot). Rebuilt and uploaded by
     * expert_cache_sync_table when a slot changed since the last upload. */
    const void **table_host;    /* ((l1-l0) * n_expert * 3) */
    void *table_dev;            /* the same in device memory (workspace), or NULL */
    bool table_dirty;
};

/* Sizing only: slot and segment bytes for layers [l0, l1). seg_bytes_hint 0 = automatic
 * (see docs/DESIGN.md). Fills slot_bytes, slots_per_seg, seg_bytes, n_seg_max. */
void expert_cache_geometry(struct expert_cache *c, const struct model *m, uint32_t l0, uint32_t l1,
                           size_t seg_bytes_hint);
/* Geometry + tables + the staging slot + up to n_seg segments (capped at n_seg_max).
 * n_seg_full becomes the number actually allocated. */
int expert_cache_init(struct expert_cache *c, struct device *d, const struct model *m,
                      uint32_t l0, uint32_t l1, size_t seg_bytes_hint, int n_seg);
void expert_cache_free(struct expert_cache *c);
/* Views of expert e of layer l in device memory (copying it in on a miss). The views stay
 * valid until the next lookup or resize on this cache. */
int expert_cache_lookup(struct expert_cache *c, uint32_t l, uint32_t e, struct expert_weights *out);
/* Shrink or grow to n_seg live segments (clamped to [0, n_seg_full]). Growing stops early
 * when the device has no room; returns the live segment count or a negative code. */
int expert_cache_resize(struct expert_cache *c, int n_seg);
/* Lend the tail live segments as scratch for one prefill chunk: n blocks of sizes[i] bytes,
 * each inside one segment, into out[i]. Their experts are evicted and the segments leave the
 * LRU until expert_cache_unborrow (the ledger does not change: the memory stays the cache's).
 * TIDE_ERANGE when the live segments cannot hold the blocks. */
int expert_cache_borrow(struct expert_cache *c, const size_t *sizes, int n, void **out);
void expert_cache_unborrow(struct expert_cache *c);
/* Device bytes of the expert table on device d (0 when its backend has no use for one). */
size_t expert_cache_table_bytes(const struct expert_cache *geometry, const struct device *d);
/* True when every expert of these layers has a live slot (none can miss) and the device table
 * exists: a decode step may then run its experts from the table, with no lookups. */
bool expert_cache_complete(const struct expert_cache *c);
/* Bring the device table up to date (an upload only when a slot changed); 0 or a negative
 * code. Then expert_cache_table(c, l) is layer l's part: n_expert entries of 3 pointers. */
int expert_cache_sync_table(struct expert_cache *c);
const void *const *expert_cache_table(const struct expert_cache *c, uint32_t l);
/* Count a use of resident expert e of layer l that ran from the table: a hit, and its LRU
 * and refill order as a lookup would have left them. */
void expert_cache_touch(struct expert_cache *c, uint32_t l, uint32_t e);
int expert_cache_slots(const struct expert_cache *c);
size_t expert_cache_bytes(const struct expert_cache *c);

#endif
