/* fuzz_kv_blocks.c - libFuzzer target for the KV pool's block tables (src/engine/kv_blocks.h).
 *
 * The input is a program of operations on a small pool (4 slots of 128 positions in blocks of 16,
 * 8..39 blocks): take blocks and write rows (kv_blocks_reserve, then the copies it asks for and
 * the rows written), keep fewer rows (kv_blocks_trim), and take another slot's rows
 * (kv_blocks_share), key a slot's next full block (kv_blocks_key, the rows' tags as their values),
 * and take the longest run of another slot's rows that the prefix index holds (kv_blocks_match,
 * kv_blocks_adopt). Every block holds a tag per row, and a shadow says which tag each slot's
 * row must read. After every operation: each slot reads its own rows' tags through its table
 * (so no write ever reached a block another slot reads: copy on write, and an adopted block
 * holds the rows it was matched for), every block's count is the number of tables that hold it,
 * the free list and the cached list hold exactly the blocks no table holds (the cached ones keyed),
 * a keyed block's rows are the ones it was keyed with (never written since), and a refused
 * reserve changed nothing. */
#include "common.h"
#include "engine/kv_blocks.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 4
#define CTX 128
#define BR 16

static void check(const struct kv_blocks *kb, const int32_t *tags, int shadow[SLOTS][CTX], const int *valid,
                  const int32_t *keyed_tags)
{
    int refs[64] = {0};
    for (int s = 0; s < SLOTS; s++) {
        const int32_t *t = kv_blocks_table(kb, s);
        if (kb->held[s] < 0 || kb->held[s] > kb->per_slot)
            abort();
        for (int i = 0; i < kb->per_slot; i++) {
            if (i < kb->held[s]) {
                if (t[i] < 0 || t[i] >= kb->n_blocks)
                    abort();
                refs[t[i]]++;
            } else if (t[i] != -1) {
                abort();
            }
        }
        if (kv_blocks_for(kb, valid[s]) > kb->held[s])
            abort(); /* a slot's valid rows are backed */
        for (int r = 0; r < valid[s]; r++)
            if (tags[t[r / BR] * BR + r % BR] != shadow[s][r])
                abort(); /* another slot wrote into this one's rows */
    }
    int free_ = 0;
    for (int b = 0; b < kb->n_blocks; b++) {
        if (refs[b] != kb->refs[b])
            abort();
        free_ += refs[b] == 0;
    }
    if (free_ != kb->n_free)
        abort();
    for (int i = 0; i < kb->n_free - kb->n_cached; i++)
        if (kb->refs[kb->free_list[i]] != 0 || kb->key[kb->free_list[i]])
            abort();
    int n_lru = 0;
    for (int32_t b = kb->lru_head; b >= 0; b = kb->lru_next[b], n_lru++)
        if (kb->refs[b] != 0 || !kb->key[b] || n_lru > kb->n_blocks)
            abort();
    if (n_lru != kb->n_cached)
        abort();
    for (int b = 0; b < kb->n_blocks; b++)
        if (kb->key[b] && memcmp(tags + b * BR, keyed_tags + b * BR, sizeof(int32_t) * BR))
            abort(); /* a keyed block was written */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct kv_blocks kb;
    int n_blocks = 8 + data[0] % 32;
    if (kv_blocks_init(&kb, SLOTS, CTX, BR, n_blocks) != 0)
        abort();
    int32_t *tags = calloc((size_t)n_blocks * BR, sizeof(int32_t));
    int32_t *before = malloc(sizeof(int32_t) * SLOTS * kb.per_slot);
    int32_t *keyed_tags = calloc((size_t)n_blocks * BR, sizeof(int32_t)); /* each block's tags when keyed */
    static int shadow[SLOTS][CTX];
    int valid[SLOTS] = {0}, next_tag = 1;
    if (!tags || !before || !keyed_tags)
        abort();
    for (size_t i = 1; i + 3 < size; i += 4) {
        int op = data[i] % 5, s = data[i + 1] % SLOTS, a = data[i + 2] % (CTX + 1), b = data[i + 3] % (CTX + 1);
        struct kv_block_copy cp[2];
        int n_cp = 0;
        if (op == 0) { /* write rows from..to, from within what the slot holds */
            int from = valid[s] ? a % (valid[s] + 1) : 0, to = from + b % (CTX - from + 1);
            memcpy(before, kb.table, sizeof(int32_t) * SLOTS * kb.per_slot);
            int free_before = kb.n_free, rc = kv_blocks_reserve(&kb, s, from, to, cp, &n_cp);
            if (rc == TIDE_EFULL) {
                if (memcmp(before, kb.table, sizeof(int32_t) * SLOTS * kb.per_slot) || kb.n_free != free_before ||
                    kv_blocks_need(&kb, s, from, to) <= kb.n_free)
                    abort();
            } else if (rc != 0) {
                abort();
            } else {
                for (int c = 0; c < n_cp; c++) /* the device copies the forward makes */
                    memcpy(tags + cp[c].dst * BR, tags + cp[c].src * BR, sizeof(int32_t) * BR);
                const int32_t *t = kv_blocks_table(&kb, s);
                for (int r = from; r < to; r++) {
                    tags[t[r / BR] * BR + r % BR] = next_tag;
                    shadow[s][r] = next_tag++;
                }
                valid[s] = to;
            }
        } else if (op == 1) { /* keep fewer rows */
            int rows = valid[s] ? a % (valid[s] + 1) : 0;
            kv_blocks_trim(&kb, s, rows);
            valid[s] = rows;
        } else if (op == 3) { /* slot s keys its next full block of rows */
            int j = kv_blocks_keyed(&kb, s);
            if ((j + 1) * BR <= valid[s]) {
                uint64_t v[BR];
                for (int r = 0; r < BR; r++)
                    v[r] = kv_blocks_token_value(shadow[s][j * BR + r]);
                kv_blocks_key(&kb, s, v);
                int32_t blk = kv_blocks_table(&kb, s)[j];
                if (kv_blocks_keyed(&kb, s) != j + 1)
                    abort();
                if (kb.key[blk])
                    memcpy(keyed_tags + blk * BR, tags + blk * BR, sizeof(int32_t) * BR);
            }
        } else if (op == 4) { /* slot s takes the rows of slot d's prompt that the index holds */
            int d = (s + 1 + b % (SLOTS - 1)) % SLOTS, nb = valid[d] / BR;
            uint64_t v[CTX];
            int32_t found[CTX / BR];
            for (int r = 0; r < nb * BR; r++)
                v[r] = kv_blocks_token_value(shadow[d][r]);
            int m = kv_blocks_match(&kb, v, nb, found);
            if (m < 0 || m > nb)
                abort();
            if (m > 0 && a % 2) {
                kv_blocks_adopt(&kb, s, found, m);
                memcpy(shadow[s], shadow[d], sizeof(int) * (size_t)(m * BR));
                valid[s] = m * BR;
                if (kv_blocks_keyed(&kb, s) != m || kb.held[s] != m)
                    abort();
            }
        } else { /* slot s takes slot d's first rows */
            int d = (s + 1 + b % (SLOTS - 1)) % SLOTS, n = valid[d] ? a % (valid[d] + 1) : 0;
            int got = kv_blocks_share(&kb, d, s, n, cp, &n_cp);
            if (got < 0 || got > n || (got != n && got != n / BR * BR))
                abort();
            for (int c = 0; c < n_cp; c++)
                memcpy(tags + cp[c].dst * BR, tags + cp[c].src * BR, sizeof(int32_t) * BR);
            memcpy(shadow[s], shadow[d], sizeof(int) * (size_t)got);
            valid[s] = got;
        }
        check(&kb, tags, shadow, valid, keyed_tags);
    }
    free(tags);
    free(before);
    free(keyed_tags);
    kv_blocks_free(&kb);
    return 0;
}
