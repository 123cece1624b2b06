/* kv_park.h - conversation parking: the KV rows of prompts that lost their slot, kept in host
 * RAM up to a budget, and copied back into a slot when a later prompt shares their prefix.
 *
 * A KV slot keeps its rows after its sequence ends, for the next prompt that shares the prefix;
 * but there are only `parallel` slots, and any other prompt that takes the slot overwrites them.
 * Before that happens the slot's rows are parked here (engine_seq_start): the tokens and, per
 * layer, their K and V rows. When a prompt arrives whose prefix a parked conversation shares
 * further than any free slot does, the parked rows are copied into the slot instead of being
 * computed again (a copy of n positions against a prefill of n tokens: docs/BENCHMARKS.md).
 * Entries are evicted least recently used first; an entry whose rows extend another's
 * replaces it. Image rows are parked with their image's key (prompt_rows.h), so a conversation
 * about an image comes back only for a prompt with the same image at the same place; an image
 * row without a key ends the entry. Only the engine thread uses it. */
#ifndef TIDE_KV_PARK_H
#define TIDE_KV_PARK_H

#include "../common.h"
#include "prompt_rows.h"

struct forward_state;

struct kv_park_entry {
    int *tokens;            /* (n) the rows' token ids (-1: an image row) */
    int n;
    struct row_image *img;  /* (n_img) the images among the rows, with their keys */
    int n_img;
    void *rows;             /* n * row_bytes: forward_kv_copy's layout (the cache's type) */
    uint64_t last_use;
};

struct kv_park {
    size_t budget;          /* bytes of rows at most; 0: parking off */
    size_t used;            /* bytes of rows held */
    size_t row_bytes;       /* KV bytes of one position, every layer */
    int min_tokens;         /* shorter conversations are not worth a copy: not parked */
    struct kv_park_entry *e;
    int n, cap;
    uint64_t clock;
    /* counters (engine thread writes, others read them racily as gauges and totals) */
    uint64_t n_parked, n_restored, tokens_restored, n_evicted;
};

void kv_park_init(struct kv_park *p, size_t budget, size_t row_bytes);
void kv_park_free(struct kv_park *p);
/* Park slot's rows, described by r (cut at the first image row without a key, and to what the
 * budget holds). Nothing happens when parking is off, the rows are too few, or an entry
 * already holds them (it is then the most recent). Returns 0 or a negative code (nothing
 * parked). */
int kv_park_save(struct kv_park *p, struct forward_state *fw, int slot, const struct prompt_rows *r);
/* The entry sharing the longest prefix with q, at most limit rows; *len that prefix. -1 when
 * none shares a row. */
int kv_park_find(const struct kv_park *p, const struct prompt_rows *q, int limit, int *len);
/* Entry i's rows as prompt_rows */
struct prompt_rows kv_park_rows(const struct kv_park *p, int i);
/* Copy entry i's rows from..len-1 into slot, whose rows 0..from-1 are the entry's already (the
 * prefix index's, or its own); the entry becomes the most recent. */
int kv_park_restore(struct kv_park *p, struct forward_state *fw, int i, int slot, int from, int len);

#endif
