/* device.c - budgets and the per-device ledger. */
#include "memory/device.h"
#include "engine/backend_cuda.h"
#include "memory/vmm.h"

#include <stdio.h>
#include <string.h>

/* What the CUDA context, cuBLAS-free kernels' launch state and the driver keep for
 * themselves on a GPU used whole: left out of the budget. */
#define CUDA_CONTEXT_MARGIN ((size_t)512 << 20)

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

int device_init_cuda(struct device *d, int index, int hw_index, size_t budget, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->index = index;
    d->kind = DEVICE_KIND_CUDA;
    d->hw_index = hw_index;
    d->fail_kind = -1;
    int rc = backend_cuda_init(&d->be, hw_index, err, errlen);
    if (rc < 0)
        return rc;
    size_t fr = 0, tot = 0;
    if (cuda_mem_info(hw_index, &fr, &tot) == 0) {
        size_t avail = fr > CUDA_CONTEXT_MARGIN ? fr - CUDA_CONTEXT_MARGIN : 0;
        if (!budget || budget > avail) {
            if (budget)
                tide_log("device %d: cuda:%d has %.0f MiB free, budget lowered from %.0f MiB", index, hw_index,
                         (double)avail / (1 << 20), (double)budget / (1 << 20));
            budget = avail;
        }
    }
    d->total = budget;
    char why[200] = "";
    if (vmm_available(hw_index, why, sizeof why) == 0)
        d->vmm_granularity = vmm_granularity(hw_index);
    else
        tide_log("device %d: no CUDA VMM (%s): expert segments are plain allocations", index, why);
    return 0;
}

void device_free_all(struct device *d)
{
    if (d->be.i && d->kind == DEVICE_KIND_CPU)
        backend_cpu_free(&d->be);
    else if (d->be.i && d->kind == DEVICE_KIND_CUDA)
        backend_cuda_free(&d->be);
    memset(d, 0, sizeof *d);
}

static bool fault_fires(struct device *d, enum mem_kind k, size_t bytes)
{
    if (d->fail_after > 0 && (d->fail_kind < 0 || d->fail_kind == (int)k) && --d->fail_after == 0) {
        tide_log("device %d: injected allocation failure (%s, %zu bytes)", d->index, mem_kind_name(k), bytes);
        return true;
    }
    return false;
}

int device_charge(struct device *d, enum mem_kind k, size_t bytes)
{
    if (k >= MEM_KIND_COUNT || bytes > device_free_bytes(d) || fault_fires(d, k, bytes))
        return TIDE_ERANGE;
    d->used[k] += bytes;
    return 0;
}

void device_uncharge(struct device *d, enum mem_kind k, size_t bytes)
{
    d->used[k] = d->used[k] >= bytes ? d->used[k] - bytes : 0;
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
    if (fault_fires(d, k, bytes))
        return NULL;
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
