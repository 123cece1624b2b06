/* kv_park.c - conversation parking in host RAM (kv_park.h). */
#include "kv_park.h"
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#define KV_PARK_MIN_TOKENS 16

void kv_park_init(struct kv_park *p, size_t budget, size_t row_bytes)
{
    memset(p, 0, sizeof *p);
    p->budget = row_bytes ? budget : 0;
    p->row_bytes = row_bytes;
    p->min_tokens = KV_PARK_MIN_TOKENS;
}

static void drop(struct kv_park *p, int i)
{
    p->used -= (size_t)p->e[i].n * p->row_bytes;
    free(p->e[i].tokens);
    free(p->e[i].img);
    free(p->e[i].rows);
    p->e[i] = p->e[--p->n];
}

void kv_park_free(struct kv_park *p)
{
    while (p->n)
        drop(p, p->n - 1);
    free(p->e);
    memset(p, 0, sizeof *p);
}

struct prompt_rows kv_park_rows(const struct kv_park *p, int i)
{
    const struct kv_park_entry *en = &p->e[i];
    return (struct prompt_rows){en->tokens, en->n, en->img, en->n_img};
}

int kv_park_save(struct kv_park *p, struct forward_state *fw, int slot, const struct prompt_rows *r)
{
    if (!p->budget)
        return 0;
    int m = prompt_rows_known(r); /* up to the first image row without a key */
    if ((size_t)m * p->row_bytes > p->budget)
        m = (int)(p->budget / p->row_bytes); /* what the budget holds: the start of the conversation */
    if (m < p->min_tokens)
        return 0;
    struct prompt_rows cut = *r;
    cut.n = m;
    for (int i = 0; i < p->n; i++) {
        struct prompt_rows er = kv_park_rows(p, i);
        int k = prompt_rows_shared(&er, &cut, m);
        if (k == m) { /* already held, in full */
            p->e[i].last_use = ++p->clock;
            return 0;
        }
        if (k == p->e[i].n) /* this one extends entry i: i goes */
            drop(p, i--);
    }
    size_t bytes = (size_t)m * p->row_bytes;
    while (p->used + bytes > p->budget && p->n) { /* least recently used first */
        int lru = 0;
        for (int i = 1; i < p->n; i++)
            if (p->e[i].last_use < p->e[lru].last_use)
                lru = i;
        drop(p, lru);
        p->n_evicted++;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 8;
        struct kv_park_entry *ne = realloc(p->e, sizeof *ne * (size_t)cap);
        if (!ne)
            return TIDE_ENOMEM;
        p->e = ne;
        p->cap = cap;
    }
    int ni = 0;
    while (ni < r->n_img && r->img[ni].at < m)
        ni++;
    struct kv_park_entry en = {.tokens = malloc(sizeof(int) * (size_t)m), .rows = malloc(bytes), .n = m,
                               .img = malloc(sizeof(struct row_image) * (size_t)(ni ? ni : 1)), .n_img = ni};
    int rc = en.tokens && en.rows && en.img ? 0 : TIDE_ENOMEM;
    if (rc == 0) {
        memcpy(en.tokens, r->ids, sizeof(int) * (size_t)m);
        if (ni) /* r->img may be NULL when there are none */
            memcpy(en.img, r->img, sizeof(struct row_image) * (size_t)ni);
        rc = forward_kv_copy(fw, slot, m, en.rows, m, true);
    }
    if (rc < 0) {
        free(en.tokens);
        free(en.img);
        free(en.rows);
        return rc;
    }
    en.last_use = ++p->clock;
    p->e[p->n++] = en;
    p->used += bytes;
    p->n_parked++;
    return 0;
}

int kv_park_find(const struct kv_park *p, const struct prompt_rows *q, int limit, int *len)
{
    int best = -1, best_k = 0;
    for (int i = 0; i < p->n; i++) {
        struct prompt_rows er = kv_park_rows(p, i);
        int k = prompt_rows_shared(&er, q, limit);
        if (k > best_k) {
            best = i;
            best_k = k;
        }
    }
    *len = best_k;
    return best;
}

int kv_park_restore(struct kv_park *p, struct forward_state *fw, int i, int slot, int from, int len)
{
    if (i < 0 || i >= p->n || len < 0 || len > p->e[i].n || from < 0 || from > len)
        return TIDE_EINVAL;
    struct kv_park_entry *en = &p->e[i];
    int rc = forward_kv_copy_rows(fw, slot, from, len, en->rows, en->n, false);
    if (rc < 0)
        return rc;
    en->last_use = ++p->clock;
    p->n_restored++;
    p->tokens_restored += (uint64_t)(len - from);
    return 0;
}
