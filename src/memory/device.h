/* device.h - a compute device: a backend, a memory budget, and the ledger of what uses it.
 *
 * Every byte of device memory is taken with device_alloc and given back with device_free,
 * charged to one kind (weights, kv, workspace, expert_cache, vision). The ledger refuses an
 * allocation that would take the sum over the budget, so a "cpu" device with a vram_mib
 * behaves exactly like a GPU of that size: that is how CI tests hand-back and regrow.
 * Only the engine thread allocates; other threads read published snapshots instead. */
#ifndef TIDE_DEVICE_H
#define TIDE_DEVICE_H

#include "engine/backend.h"

enum mem_kind { MEM_WEIGHTS, MEM_KV, MEM_WORKSPACE, MEM_EXPERT_CACHE, MEM_VISION, MEM_KIND_COUNT };

enum device_kind { DEVICE_KIND_CPU, DEVICE_KIND_CUDA };

struct device {
    int index;                  /* position in the devices list (the API's device number) */
    enum device_kind kind;
    int hw_index;               /* CUDA ordinal; -1 for cpu */
    struct backend be;          /* owned */
    size_t total;               /* budget in bytes */
    size_t used[MEM_KIND_COUNT];
    size_t reserve;             /* bytes the operator wants kept free (start-up or POST /v1/vram) */
    size_t reserve_startup;
    /* Test hook: when > 0, the fail_after-th next allocation (of fail_kind) fails once, then
     * the hook disarms. Set from TIDE_FAULT_ALLOC (see memory/plan.c); never in normal runs. */
    int fail_after;
    int fail_kind;              /* -1: any kind */
    size_t vmm_granularity;     /* cuda with VMM: expert segments are mapped in these units; 0 otherwise */
};

const char *mem_kind_name(enum mem_kind k);
/* A CPU device with budget bytes, its backend on n_threads threads (0 = all cores). */
int device_init_cpu(struct device *d, int index, size_t budget, int n_threads);
/* A CUDA device (ordinal hw_index) with budget bytes; budget 0 = what the GPU has free now,
 * less a margin for the CUDA context. Fails with the reason in err when there is no GPU. */
int device_init_cuda(struct device *d, int index, int hw_index, size_t budget, char *err, size_t errlen);
void device_free_all(struct device *d);
/* Ledger only, for memory the device maps itself (VMM segments): the same budget check as
 * device_alloc (and the same fault hook). */
int device_charge(struct device *d, enum mem_kind k, size_t bytes);
void device_uncharge(struct device *d, enum mem_kind k, size_t bytes);
size_t device_used(const struct device *d);
size_t device_free_bytes(const struct device *d);
/* NULL when the budget would be exceeded or the backend has no memory. bytes 0 -> NULL. */
void *device_alloc(struct device *d, enum mem_kind k, size_t bytes);
void device_free(struct device *d, enum mem_kind k, void *p, size_t bytes);
/* Copy host bytes into a fresh allocation of kind k; NULL on failure. */
void *device_upload_new(struct device *d, enum mem_kind k, const void *src, size_t bytes);

#endif
