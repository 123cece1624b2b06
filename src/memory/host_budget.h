/* host_budget.h - a ceiling on host memory held for some purpose, charged before the memory
 * is allocated and released after it is freed.
 *
 * The daemon has one, request_budget (config request_memory_mib): request bodies, their
 * parse trees, the image bytes they carry and an image's decode are charged to it, so that a
 * burst of big requests is answered 503 + Retry-After instead of growing the process without
 * bound (issue 27 item 3). Lock-free: any thread may charge or release. */
#ifndef TIDE_MEMORY_HOST_BUDGET_H
#define TIDE_MEMORY_HOST_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

struct host_budget {
    atomic_size_t used;
    atomic_size_t peak;     /* most ever charged at once (metrics, tests) */
    atomic_size_t limit;    /* 0 = no ceiling */
    atomic_size_t refused;  /* charges refused */
};

/* Charge n bytes; false (nothing charged) when that would pass the limit. */
bool host_budget_charge(struct host_budget *b, size_t n);
void host_budget_release(struct host_budget *b, size_t n);

/* The daemon's budget for request memory. */
extern struct host_budget request_budget;

#endif
