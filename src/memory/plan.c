/* plan.c - devices, layer split, start-up sizing and the reserve rule. */
#include "memory/plan.h"
#include "engine/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

void memory_host_ram(size_t *total, size_t *available)
{
    *total = *available = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total = (size_t)kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *available = (size_t)kb * 1024;
    }
    fclose(f);
}

/* Cut n_layer into n ranges by share (largest remainder), every device at least one layer
 * when there are enough layers. */
static void split_layers(uint32_t n_layer, int n, const double *share, int n_share, uint32_t *l0, uint32_t *l1)
{
    double w[PLAN_MAX_DEVICES], sum = 0;
    for (int i = 0; i < n; i++) {
        w[i] = n_share ? (i < n_share ? share[i] : 0) : 1.0;
        sum += w[i];
    }
    uint32_t cnt[PLAN_MAX_DEVICES], given = 0;
    double rem[PLAN_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        double x = sum > 0 ? n_layer * w[i] / sum : 0;
        cnt[i] = (uint32_t)x;
        rem[i] = x - cnt[i];
        given += cnt[i];
    }
    while (given < n_layer) { /* hand out the rest by largest remainder */
        int b = 0;
        for (int i = 1; i < n; i++)
            if (rem[i] > rem[b]) b = i;
        cnt[b]++;
        rem[b] = -1;
        given++;
    }
    uint32_t at = 0;
    for (int i = 0; i < n; i++) {
        l0[i] = at;
        at += cnt[i];
        l1[i] = at;
    }
}

static void fault_hook(struct memory_plan *p)
{
    /* TIDE_FAULT_ALLOC="device:kind:n" makes the n-th allocation of that kind on that device
     * fail once (kind: weights|kv|workspace|expert_cache|vision|any). Tests only. */
    const char *f = getenv("TIDE_FAULT_ALLOC");
    if (!f)
        return;
    int dev, n;
    char kind[32];
    if (sscanf(f, "%d:%31[a-z_]:%d", &dev, kind, &n) != 3 || dev < 0 || dev >= p->n_dev || n < 1)
        return;
    p->dev[dev].fail_after = n;
    p->dev[dev].fail_kind = -1;
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        if (!strcmp(kind, mem_kind_name(k)))
            p->dev[dev].fail_kind = k;
    tide_log("fault injection armed: device %d, %s allocation #%d fails", dev, kind, n);
}

int memory_plan_init(struct memory_plan *p, const struct plan_options *o, struct model *m,
                     char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    size_t host_total, host_avail;
    memory_host_ram(&host_total, &host_avail);
    for (uint32_t l = 0; l < m->cfg.n_layer && m->cfg.n_expert; l++)
        p->host_expert_bytes += model_expert_bytes(m, l) * m->cfg.n_expert;
    /* The experts are read from the mapped file; the host must be able to keep them all. */
    if (host_total && p->host_expert_bytes > host_total) {
        snprintf(err, errlen, "the model's experts need %.0f MiB of host RAM but this host has %.0f MiB",
                 (double)p->host_expert_bytes / MIB, (double)host_total / MIB);
        return TIDE_ERANGE;
    }
    /* Parked conversations (engine/kv_park.h) live in host RAM beside the experts, with a margin
     * left free for everything else: an explicit budget the RAM cannot hold is refused. */
    if (o->kv_host_mib != 0 && host_total) {
        size_t margin = host_total / 16 > ((size_t)512 << 20) ? host_total / 16 : (size_t)512 << 20;
        size_t room = host_total > p->host_expert_bytes + margin ? host_total - p->host_expert_bytes - margin : 0;
        if (o->kv_host_mib < 0) {
            p->kv_host_bytes = room < ((size_t)2048 << 20) ? room : (size_t)2048 << 20;
        } else if ((size_t)o->kv_host_mib << 20 > room) {
            snprintf(err, errlen,
                     "kv_host_mib %ld MiB does not fit this host's %.0f MiB of RAM beside the model's experts "
                     "(%.0f MiB) and a %.0f MiB margin: at most %.0f MiB (or 0 to turn parking off)",
                     o->kv_host_mib, (double)host_total / MIB, (double)p->host_expert_bytes / MIB, (double)margin / MIB,
                     (double)room / MIB);
            return TIDE_ERANGE;
        } else {
            p->kv_host_bytes = (size_t)o->kv_host_mib << 20;
        }
    } else if (o->kv_host_mib > 0) {
        p->kv_host_bytes = (size_t)o->kv_host_mib << 20; /* host RAM unknown: as asked */
    }
    /* "auto": every CUDA GPU, else one CPU device (and the log says why) */
    struct plan_device_options autodev[PLAN_MAX_DEVICES];
    int n = o->n_devices;
    const struct plan_device_options *dv = o->dev;
    if (!n) {
        char why[256] = "";
        int ng = cuda_device_count(why, sizeof why);
        if (ng > PLAN_MAX_DEVICES) ng = PLAN_MAX_DEVICES;
        if (ng > (int)m->cfg.n_layer) ng = (int)m->cfg.n_layer;
        for (int i = 0; i < ng; i++)
            autodev[i] = (struct plan_device_options){DEVICE_KIND_CUDA, i, -1, o->dev[i].reserve_mib};
        if (ng <= 0) {
            tide_log("devices auto: no CUDA device (%s); using one CPU device", why[0] ? why : "none found");
            autodev[0] = (struct plan_device_options){DEVICE_KIND_CPU, -1, -1, o->dev[0].reserve_mib};
            ng = 1;
        }
        n = ng;
        dv = autodev;
    }
    if (n > PLAN_MAX_DEVICES || (uint32_t)n > m->cfg.n_layer) {
        snprintf(err, errlen, "%d devices for %u layers: every device needs at least one layer", n, m->cfg.n_layer);
        return TIDE_EINVAL;
    }
    bool cuda_stage = false;
    for (int i = 0; i < n; i++)
        cuda_stage |= dv[i].kind == DEVICE_KIND_CUDA;
    /* Parking copies a slot's rows to host RAM while the other sequences wait at the step
     * boundary; from a GPU that is a device-to-host copy of the rows (~0.2 MB a token of a
     * Qwen3-30B-A3B) not yet measured against the recompute it saves, so null means off there
     * until it is (docs/CONFIG.md); an explicit budget turns it on. */
    if (o->kv_host_mib < 0 && cuda_stage && p->kv_host_bytes) {
        tide_log("conversation parking: off by default with a CUDA device (set kv_host_mib to turn it on)");
        p->kv_host_bytes = 0;
    }
    /* CPU devices on the host's RAM take PLAN_CPU_BATCH-row chunks; one with a vram_mib budget
     * (a stand-in for a small GPU) keeps FORWARD_DEFAULT_BATCH rows, so that its budget goes to
     * the expert cache and a prefill buffer of its own stays as small as before */
    bool budgeted = false;
    for (int i = 0; i < n; i++)
        budgeted |= dv[i].kind == DEVICE_KIND_CPU && dv[i].vram_mib >= 0;
    p->max_batch = o->max_batch > 0 ? o->max_batch
                   : cuda_stage     ? FORWARD_CUDA_BATCH
                   : budgeted       ? FORWARD_DEFAULT_BATCH
                                    : PLAN_CPU_BATCH;
    if (o->max_batch_cap > 0 && p->max_batch > o->max_batch_cap) /* a bigger buffer would never fill */
        p->max_batch = o->max_batch_cap;
    p->n_seq = o->n_seq > 0 ? o->n_seq : cuda_stage ? PLAN_AUTO_SEQ_CUDA : PLAN_AUTO_SEQ_CPU;
    if (p->n_seq > FORWARD_MAX_SEQ)
        p->n_seq = FORWARD_MAX_SEQ;
    if (p->max_batch < p->n_seq)
        p->max_batch = p->n_seq;
    split_layers(m->cfg.n_layer, n, o->layer_split, o->n_layer_split, p->l0, p->l1);
    for (int i = 0; i < n; i++) {
        if (p->l1[i] == p->l0[i]) {
            snprintf(err, errlen, "layer_split gives device %d no layers", i);
            return TIDE_EINVAL;
        }
    }
    size_t budgets[PLAN_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        const struct plan_device_options *d = &dv[i];
        size_t budget;
        int rc;
        if (d->kind == DEVICE_KIND_CUDA) {
            char e2[256] = "";
            budget = d->vram_mib >= 0 ? (size_t)d->vram_mib * MIB : 0;
            rc = device_init_cuda(&p->dev[i], i, d->hw_index >= 0 ? d->hw_index : 0, budget, e2, sizeof e2);
            if (rc < 0) {
                snprintf(err, errlen, "device %d: %s", i, e2[0] ? e2 : tide_strerror(rc));
                memory_plan_free(p);
                return rc;
            }
            budget = p->dev[i].total;
        } else {
            budget = d->vram_mib >= 0 ? (size_t)d->vram_mib * MIB : host_total;
            rc = device_init_cpu(&p->dev[i], i, budget, o->n_threads);
            if (rc < 0) {
                snprintf(err, errlen, "device %d: cpu backend: %s", i, tide_strerror(rc));
                memory_plan_free(p);
                return rc;
            }
        }
        p->n_dev = i + 1;
        p->dev[i].reserve = p->dev[i].reserve_startup = (size_t)(d->reserve_mib > 0 ? d->reserve_mib : 0) * MIB;
        budgets[i] = budget;
    }
    /* The KV cache's type: f16 unless asked for f32, or the model or a device cannot take it;
     * counted at that size from here on (so an f16 cache fits twice the slots). */
    struct backend bes[PLAN_MAX_DEVICES];
    for (int i = 0; i < n; i++)
        bes[i] = p->dev[i].be;
    enum kv_type want = o->kv_type == KV_AUTO ? KV_F16 : o->kv_type;
    const char *why = want == KV_F16 ? forward_kv_f16_why(m, bes, n) : NULL;
    p->kv_type = why ? KV_F32 : want;
    /* Paged KV (kv_blocks.h) where the model and every backend can read blocks: the pool is
     * kv_pool_tokens positions, or n_seq contexts' worth; else one block of n_ctx a sequence. */
    const char *why_paged = o->kv_block_rows > 0 ? forward_kv_paged_why(m, bes, n) : "kv_block_size is 0";
    if (o->kv_block_rows > 0 && !why_paged && o->kv_block_rows < o->n_ctx) {
        p->kv_block_rows = o->kv_block_rows;
        int per_seq = (o->n_ctx + p->kv_block_rows - 1) / p->kv_block_rows;
        long pool = o->kv_pool_tokens > 0 ? o->kv_pool_tokens / p->kv_block_rows : (long)per_seq * p->n_seq;
        if (pool < per_seq) {
            snprintf(err, errlen, "kv_pool_tokens %ld holds less than one context of %d tokens", o->kv_pool_tokens,
                     o->n_ctx);
            memory_plan_free(p);
            return TIDE_EINVAL;
        }
        p->kv_blocks = pool > INT32_MAX / 2 ? INT32_MAX / 2 : (int)pool;
    } else if (o->kv_pool_tokens > 0) {
        snprintf(err, errlen, "kv_pool_tokens needs the paged KV cache, which this server cannot use: %s",
                 why_paged ? why_paged : "kv_block_size is not below the context");
        memory_plan_free(p);
        return TIDE_EINVAL;
    }
    /* KV slots: as many as asked; automatic: PLAN_AUTO_SEQ_*, halved while they would not fit
     * some device. Every device holds every slot (its layers' part). */
    for (int i = 0; i < n; i++) {
        const struct plan_device_options *d = &dv[i];
        size_t budget = budgets[i];
        struct forward_stage_bytes sb;
        struct expert_cache g;
        memset(&g, 0, sizeof g);
        expert_cache_geometry(&g, m, p->l0[i], p->l1[i], o->segment_bytes);
        size_t cache_ws = g.slot_bytes + expert_cache_table_bytes(&g, &p->dev[i]); /* staging slot, table */
        forward_stage_size(m, o->n_ctx, p->n_seq, p->max_batch, p->l0[i], p->l1[i], i == 0, i == n - 1, p->kv_type,
                           &sb);
        if (p->kv_block_rows) { /* the pool, not the slots: n_seq contexts' worth unless kv_pool_tokens */
            if (o->kv_pool_tokens <= 0)
                p->kv_blocks = p->n_seq * ((o->n_ctx + p->kv_block_rows - 1) / p->kv_block_rows);
            sb.kv = forward_kv_pool_bytes(m, p->l0[i], p->l1[i], (size_t)p->kv_blocks * p->kv_block_rows, p->kv_type);
        }
        size_t need = sb.weights + sb.kv + sb.workspace + cache_ws + p->dev[i].reserve;
        if (o->n_seq <= 0 && p->n_seq > 1 && need > budget) {
            p->n_seq /= 2;
            i = -1; /* every device again with fewer slots */
            continue;
        }
        if (need > budget) {
            snprintf(err, errlen,
                     "device %d (%s, %.0f MiB): layers %u-%u need %.1f MiB (weights %.1f, kv %.1f for %d sequences of "
                     "%d tokens, workspace %.1f) plus a %.0f MiB reserve; lower context or parallel, or give it more "
                     "memory",
                     i, d->kind == DEVICE_KIND_CPU ? "cpu" : "cuda", (double)budget / MIB, p->l0[i], p->l1[i] - 1,
                     (double)(need - p->dev[i].reserve) / MIB, (double)sb.weights / MIB, (double)sb.kv / MIB,
                     p->n_seq, o->n_ctx, (double)(sb.workspace + cache_ws) / MIB, (double)p->dev[i].reserve / MIB);
            memory_plan_free(p);
            return TIDE_ERANGE;
        }
    }
    if (p->kv_block_rows)
        tide_log("KV cache: paged, %d blocks of %d positions (%ld positions), up to %d sequences of %d",
                 p->kv_blocks, p->kv_block_rows, (long)p->kv_blocks * p->kv_block_rows, p->n_seq, o->n_ctx);
    else if (o->kv_block_rows > 0)
        tide_log("KV cache: one block of %d positions a sequence (%s)", o->n_ctx,
                 why_paged ? why_paged : "kv_block_size is not below the context");
    size_t kv_all = p->kv_block_rows ? forward_kv_bytes(m, 1, p->kv_type) * p->kv_blocks * p->kv_block_rows
                                     : forward_kv_bytes(m, o->n_ctx, p->kv_type) * p->n_seq;
    tide_log("KV cache: %s, %d slots of %d positions, %.1f MiB in all%s%s%s", p->kv_type == KV_F16 ? "f16" : "f32",
             p->n_seq, o->n_ctx, (double)kv_all / MIB,
             why ? " (" : "", why ? why : "",
             why ? ")" : "");
    fault_hook(p);
    bool any_cuda = false;
    for (int i = 0; i < n; i++)
        any_cuda |= p->dev[i].kind == DEVICE_KIND_CUDA;
    if (any_cuda && m->cfg.n_expert) {
        /* Misses copy experts host -> GPU on the copy stream: from page-locked memory that is
         * asynchronous and runs at full bus speed; from the mapping it would be staged. */
        if (model_pin_experts(m, cuda_host_alloc, cuda_host_free) == 0)
            p->pinned = m;
        else
            tide_log("could not pin %.0f MiB of experts; misses copy from the mapped file",
                     (double)p->host_expert_bytes / MIB);
    }
    for (int i = 0; i < n; i++) {
        int rc = expert_cache_init(&p->cache[i], &p->dev[i], m, p->l0[i], p->l1[i], o->segment_bytes, 0);
        if (rc < 0) {
            snprintf(err, errlen, "device %d: expert cache: %s", i,
                     rc == TIDE_ERANGE ? "its staging slot could not be allocated" : tide_strerror(rc));
            memory_plan_free(p);
            return rc;
        }
        p->spec[i] = (struct forward_stage_spec){.dev = &p->dev[i], .l0 = p->l0[i], .l1 = p->l1[i],
                                                 .cache = m->cfg.n_expert ? &p->cache[i] : NULL,
                                                 .kv_type = p->kv_type, .kv_block_rows = p->kv_block_rows,
                                                 .kv_blocks = p->kv_blocks};
    }
    return 0;
}

/* Segments device d can hold while keeping want bytes free, counting its live ones. */
static int fit_segments(const struct memory_plan *p, int d, size_t want)
{
    const struct device *dv = &p->dev[d];
    const struct expert_cache *c = &p->cache[d];
    if (!c->seg_bytes)
        return 0;
    size_t other = device_used(dv) - dv->used[MEM_EXPERT_CACHE];
    if (other + want >= dv->total)
        return 0;
    size_t room = dv->total - other - want;
    /* live segments are already in used[EXPERT_CACHE]; what fits is computed from scratch */
    return (int)(room / c->seg_bytes);
}

int memory_plan_size_caches(struct memory_plan *p)
{
    for (int d = 0; d < p->n_dev; d++) {
        struct expert_cache *c = &p->cache[d];
        if (!c->n_seg_max)
            continue;
        int n = fit_segments(p, d, p->dev[d].reserve);
        if (n > c->n_seg_max)
            n = c->n_seg_max;
        c->n_seg_full = c->n_seg_max;
        int rc = expert_cache_resize(c, n);
        if (rc < 0)
            return rc;
        c->n_seg_full = c->n_seg;
    }
    return 0;
}

int memory_plan_apply(struct memory_plan *p, const size_t *extra, size_t *shortfall)
{
    int partial = 0;
    for (int d = 0; d < p->n_dev; d++) {
        struct expert_cache *c = &p->cache[d];
        size_t want = p->dev[d].reserve + (extra ? extra[d] : 0);
        if (c->n_seg_max) {
            int n = fit_segments(p, d, want);
            int rc = expert_cache_resize(c, n);
            if (rc < 0)
                return rc;
            /* resize stops at the first segment it cannot allocate: the cache is then behind */
            int target = n < c->n_seg_full ? n : c->n_seg_full, behind = rc < target ? target - rc : 0;
            if (behind && !p->grow_behind[d])
                tide_log("device %d: expert cache grew to %d of %d segments (a device allocation failed); "
                         "retrying on the engine timer", d, rc, target);
            else if (!behind && p->grow_behind[d])
                tide_log("device %d: expert cache back at %d segments", d, rc);
            p->grow_behind[d] = behind;
        }
        size_t fr = device_free_bytes(&p->dev[d]);
        size_t s = fr >= want ? 0 : want - fr;
        if (shortfall)
            shortfall[d] = s;
        if (s)
            partial = 1;
    }
    return partial;
}

int memory_plan_behind(const struct memory_plan *p)
{
    int n = 0;
    for (int d = 0; d < p->n_dev; d++)
        n += p->grow_behind[d] > 0;
    return n;
}

int memory_plan_retry_grow(struct memory_plan *p, const size_t *extra)
{
    if (!memory_plan_behind(p))
        return 0;
    memory_plan_apply(p, extra, NULL);
    return memory_plan_behind(p);
}

void memory_plan_free(struct memory_plan *p)
{
    if (p->pinned)
        model_unpin_experts(p->pinned, cuda_host_free);
    for (int d = 0; d < PLAN_MAX_DEVICES; d++) {
        if (p->cache[d].dev)
            expert_cache_free(&p->cache[d]);
        if (p->dev[d].be.i)
            device_free_all(&p->dev[d]);
    }
    memset(p, 0, sizeof *p);
}
