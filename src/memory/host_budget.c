/* host_budget.c - host memory ceilings; see host_budget.h. */
#include "memory/host_budget.h"

struct host_budget request_budget;

bool host_budget_charge(struct host_budget *b, size_t n)
{
    size_t lim = atomic_load(&b->limit), cur = atomic_load(&b->used);
    do {
        if (lim && (n > lim || cur > lim - n)) {
            atomic_fetch_add(&b->refused, 1);
            return false;
        }
    } while (!atomic_compare_exchange_weak(&b->used, &cur, cur + n));
    size_t now = cur + n, pk = atomic_load(&b->peak);
    while (now > pk && !atomic_compare_exchange_weak(&b->peak, &pk, now)) {}
    return true;
}

void host_budget_release(struct host_budget *b, size_t n)
{
    atomic_fetch_sub(&b->used, n);
}
