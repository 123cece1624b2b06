/* device.c - budgets and the per-device ledger. */
#include "memory/device.h"

#include <string.h>

static const char *const kind_names[MEM_KIND_COUNT] = {
    "weights", "kv", "workspace", "expert_cache", "vision",
};

const char *mem_kind_name(enum mem_kind k) { return k < MEM_KIND_COUNT ? kind_names[k] : "?"; }

int device_init_cpu(struct device *d, int index, size_t budget, int n_threads)
{
    memset(d, 0, sizeof *d);
    d->index = index;
    d->kind = DEVICE_KIND_CPU;
    d->hw_index = -1;
    d->total = budget;
    d->fail_kind = -1;
    return backend_cpu_init(&d->be, n_threads);
}

void device_free_all(struct device *d)
{
    if (d->be.i && d->kind == DEVICE_KIND_CPU)
        backend_cpu_free(&d->be);
    memset(d, 0, sizeof *d);
}

size_t device_used(const struct device *d)
{
    size_t s = 0;
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        s += d->used[k];
    return s;
}

size_t device_free_bytes(const struct device *d)
{
    size_t u = device_used(d);
    return u < d->total ? d->total - u : 0;
}

void *device_alloc(struct device *d, enum mem_kind k, size_t bytes)
{
    if (!bytes || k >= MEM_KIND_COUNT || bytes > device_free_bytes(d))
        return NULL;
    if (d->fail_after > 0 && (d->fail_kind < 0 || d->fail_kind == (int)k)) {
        if (--d->fail_after == 0) {
            tide_log("device %d: injected allocation failure (%s, %zu bytes)", d->index,
                     mem_kind_name(k), bytes);
            return NULL;
        }
    }
    void *p = d->be.i->alloc(d->be.ctx, bytes);
    if (p)
        d->used[k] += bytes;
    return p;
}

void device_free(struct device *d, enum mem_kind k, void *p, size_t bytes)
{
    if (!p)
        return;
    d->be.i->free(d->be.ctx, p);
    d->used[k] = d->used[k] >= bytes ? d->used[k] - bytes : 0;
}

void *device_upload_new(struct device *d, enum mem_kind k, const void *src, size_t bytes)
{
    void *p = device_alloc(d, k, bytes);
    if (p)
        d->be.i->upload(d->be.ctx, p, src, bytes);
    return p;
}
