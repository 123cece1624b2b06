/* test_kv_blocks.c - the KV pool's block tables (engine/kv_blocks.c): blocks taken as a slot's
 * rows grow and given back as they shrink, full blocks shared in place between slots, a shared
 * block copied before a slot writes into it, and the pool running out without changing anything. */
#include <criterion/criterion.h>
#include <string.h>

#include "common.h"
#include "engine/kv_blocks.h"

/* Every block is free or held, and refs counts the tables that hold it. */
static void check_counts(const struct kv_blocks *kb)
{
    int refs[256] = {0};
    for (int s = 0; s < kb->n_slots; s++)
        for (int i = 0; i < kb->held[s]; i++)
            refs[kv_blocks_table(kb, s)[i]]++;
    int free_ = 0;
    for (int b = 0; b < kb->n_blocks; b++) {
        cr_assert_eq(refs[b], kb->refs[b], "block %d: %d tables hold it, refs says %d", b, refs[b], kb->refs[b]);
        free_ += refs[b] == 0;
    }
    cr_assert_eq(free_, kb->n_free, "the free list holds every free block");
}

Test(kv_blocks, rows_take_blocks_as_they_grow_and_give_them_back)
{
    struct kv_blocks kb;
    cr_assert_eq(kv_blocks_init(&kb, 3, 100, 16, 9), 0);
    cr_assert_eq(kb.per_slot, 7, "100 positions in blocks of 16");
    struct kv_block_copy cp[2];
    int n_cp;
    cr_assert_eq(kv_blocks_need(&kb, 0, 0, 20), 2);
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 0, 20, cp, &n_cp), 0);
    cr_assert_eq(n_cp, 0);
    cr_assert_eq(kv_blocks_held(&kb, 0), 2);
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 20, 32, cp, &n_cp), 0, "rows 20..31 fall in block 1");
    cr_assert_eq(kv_blocks_held(&kb, 0), 2);
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 32, 33, cp, &n_cp), 0);
    cr_assert_eq(kv_blocks_held(&kb, 0), 3);
    cr_assert_eq(kv_blocks_reserve(&kb, 1, 0, 100, cp, &n_cp), TIDE_EFULL, "7 blocks wanted, 6 free: 3 of 9 are taken");
    cr_assert_eq(kv_blocks_held(&kb, 1), 0, "a refused reserve takes nothing");
    cr_assert_eq(kb.n_free, 6);
    kv_blocks_trim(&kb, 0, 17);
    cr_assert_eq(kv_blocks_held(&kb, 0), 2, "17 rows need 2 blocks");
    cr_assert_eq(kv_blocks_reserve(&kb, 1, 0, 100, cp, &n_cp), 0);
    cr_assert_eq(kv_blocks_used(&kb), 9);
    check_counts(&kb);
    kv_blocks_free(&kb);
}

Test(kv_blocks, shared_blocks_are_copied_before_a_slot_writes_into_them)
{
    struct kv_blocks kb;
    cr_assert_eq(kv_blocks_init(&kb, 3, 128, 16, 24), 0);
    struct kv_block_copy cp[2];
    int n_cp;
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 0, 50, cp, &n_cp), 0); /* blocks of rows 0-15, 16-31, 32-47, 48-49 */
    const int32_t *a = kv_blocks_table(&kb, 0), *b = kv_blocks_table(&kb, 1);
    cr_assert_eq(kv_blocks_share(&kb, 0, 1, 40, cp, &n_cp), 40);
    cr_assert_eq(kv_blocks_held(&kb, 1), 3);
    cr_assert(b[0] == a[0] && b[1] == a[1], "the two full blocks are slot 0's, in place");
    cr_assert_eq(n_cp, 1, "rows 32..39 are a partial block: copied");
    cr_assert(cp[0].src == a[2] && cp[0].dst == b[2] && b[2] != a[2]);
    cr_assert_eq(kv_blocks_shared(&kb), 2);
    check_counts(&kb);
    /* slot 1 writes from row 20: block 1 is shared, and rows 16..19 of it stay: a copy */
    int32_t before = b[1];
    cr_assert_eq(kv_blocks_need(&kb, 1, 20, 36), 1);
    cr_assert_eq(kv_blocks_reserve(&kb, 1, 20, 36, cp, &n_cp), 0);
    cr_assert_eq(n_cp, 1);
    cr_assert(cp[0].src == before && b[1] != before && a[1] == before, "slot 0 keeps its block");
    cr_assert_eq(b[0], a[0], "block 0 is still shared: slot 1 does not write there");
    /* a write that covers a shared block whole takes a fresh one, nothing copied */
    cr_assert_eq(kv_blocks_share(&kb, 0, 2, 32, cp, &n_cp), 32);
    cr_assert_eq(n_cp, 0, "32 rows are two whole blocks");
    cr_assert_eq(kv_blocks_reserve(&kb, 2, 16, 32, cp, &n_cp), 0);
    cr_assert_eq(n_cp, 0, "rows 16..31 overwritten whole: no copy");
    cr_assert_neq(kv_blocks_table(&kb, 2)[1], a[1]);
    check_counts(&kb);
    /* the source's blocks outlive its own trim while another table holds them */
    kv_blocks_trim(&kb, 0, 0);
    cr_assert_eq(kb.refs[b[0]], 2, "slots 1 and 2 still hold block 0");
    check_counts(&kb);
    kv_blocks_trim(&kb, 1, 0);
    kv_blocks_trim(&kb, 2, 0);
    cr_assert_eq(kb.n_free, 24, "every block back");
    kv_blocks_free(&kb);
}

Test(kv_blocks, a_share_without_a_free_block_keeps_the_whole_blocks)
{
    struct kv_blocks kb;
    cr_assert_eq(kv_blocks_init(&kb, 2, 64, 16, 4), 0);
    struct kv_block_copy cp[2];
    int n_cp;
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 0, 64, cp, &n_cp), 0); /* the whole pool */
    cr_assert_eq(kv_blocks_share(&kb, 0, 1, 40, cp, &n_cp), 32, "no block for rows 32..39");
    cr_assert_eq(n_cp, 0);
    cr_assert_eq(kv_blocks_held(&kb, 1), 2);
    check_counts(&kb);
    kv_blocks_free(&kb);
}

Test(kv_blocks, the_fixed_form_is_one_block_a_slot)
{
    struct kv_blocks kb;
    cr_assert_eq(kv_blocks_init(&kb, 4, 100, 0, 0), 0);
    cr_assert(kb.fixed);
    cr_assert_eq(kb.block_rows, 100);
    for (int s = 0; s < 4; s++)
        cr_assert_eq(kv_blocks_table(&kb, s)[0], s);
    struct kv_block_copy cp[2];
    int n_cp;
    cr_assert_eq(kv_blocks_reserve(&kb, 2, 0, 100, cp, &n_cp), 0);
    kv_blocks_trim(&kb, 2, 0);
    cr_assert_eq(kv_blocks_table(&kb, 2)[0], 2, "never moves");
    cr_assert_eq(kv_blocks_share(&kb, 0, 1, 10, cp, &n_cp), TIDE_EUNSUPPORTED);
    kv_blocks_free(&kb);
    cr_assert_eq(kv_blocks_init(&kb, 2, 100, 24, 20), TIDE_EINVAL, "not a power of two");
    cr_assert_eq(kv_blocks_init(&kb, 2, 100, 16, 6), TIDE_EINVAL, "less than one context");
}

/* ---- the prefix index: keyed blocks outlive their tables ---- */

static void fill_vals(uint64_t *v, int n, int start)
{
    for (int i = 0; i < n; i++)
        v[i] = kv_blocks_token_value(start + i);
}

/* A pool of 16 blocks for 2 slots of 128 rows; slot 0 holds `rows` rows whose values are v
 * (token ids from start), its first two blocks keyed. */
static void two_keyed_blocks(struct kv_blocks *kb, uint64_t *v, int rows, int start)
{
    struct kv_block_copy cp[2];
    int n_cp;
    cr_assert_eq(kv_blocks_init(kb, 2, 128, 16, 16), 0);
    fill_vals(v, rows, start);
    cr_assert_eq(kv_blocks_reserve(kb, 0, 0, rows, cp, &n_cp), 0);
    kv_blocks_key(kb, 0, v);
    kv_blocks_key(kb, 0, v + 16);
}

Test(kv_blocks, keyed_blocks_stay_cached_and_a_later_prompt_maps_them)
{
    struct kv_blocks kb;
    uint64_t v[48];
    two_keyed_blocks(&kb, v, 40, 100);
    int32_t first = kv_blocks_table(&kb, 0)[0], second = kv_blocks_table(&kb, 0)[1];
    cr_assert_eq(kv_blocks_keyed(&kb, 0), 2);
    kv_blocks_trim(&kb, 0, 0); /* the request ended and its slot was taken */
    cr_assert_eq(kb.n_cached, 2, "its two full blocks are cached, not freed");
    cr_assert_eq(kb.n_free, 16, "cached blocks still count as free");
    check_counts(&kb);
    int32_t found[3];
    cr_assert_eq(kv_blocks_match(&kb, v, 3, found), 2, "the third block was never full");
    cr_assert(found[0] == first && found[1] == second);
    kv_blocks_adopt(&kb, 1, found, 2);
    cr_assert_eq(kv_blocks_held(&kb, 1), 2);
    cr_assert_eq(kv_blocks_keyed(&kb, 1), 2);
    cr_assert_eq(kb.n_cached, 0);
    check_counts(&kb);
    /* the chain: a prompt that differs in its first block shares none of the second */
    uint64_t w[32];
    memcpy(w, v, sizeof w);
    w[3] = kv_blocks_token_value(7);
    cr_assert_eq(kv_blocks_match(&kb, w, 2, found), 0);
    memcpy(w, v, sizeof w);
    w[31] = kv_blocks_token_value(7);
    cr_assert_eq(kv_blocks_match(&kb, w, 2, found), 1, "the same first block, another second");
    /* a match is checked against the stored rows: a block whose rows are not the prompt's (as a
     * hash collision would give) is never mapped */
    kb.vals[(size_t)first * 16 + 5] ^= 1;
    cr_assert_eq(kv_blocks_match(&kb, v, 2, found), 0);
    kb.vals[(size_t)first * 16 + 5] ^= 1;
    kv_blocks_free(&kb);
}

Test(kv_blocks, a_keyed_block_is_copied_before_its_slot_writes_into_it)
{
    struct kv_blocks kb;
    struct kv_block_copy cp[2];
    int n_cp;
    uint64_t v[32];
    two_keyed_blocks(&kb, v, 32, 0);
    int32_t second = kv_blocks_table(&kb, 0)[1];
    kv_blocks_trim(&kb, 0, 20); /* another prompt shares 20 rows: block 1 is kept, rows 20.. are its own */
    cr_assert_eq(kv_blocks_keyed(&kb, 0), 1);
    cr_assert_eq(kv_blocks_need(&kb, 0, 20, 21), 1, "a copy of the keyed block");
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 20, 21, cp, &n_cp), 0);
    cr_assert_eq(n_cp, 1, "rows 16..19 copied into the slot's new block");
    cr_assert(cp[0].src == second && cp[0].dst == kv_blocks_table(&kb, 0)[1]);
    cr_assert_eq(kb.n_cached, 1, "the keyed block is cached, its rows unchanged");
    int32_t found[2];
    cr_assert_eq(kv_blocks_match(&kb, v, 2, found), 2, "the first prompt's rows are all still found");
    cr_assert_eq(found[1], second);
    /* the same for a block another table maps from the index: slot 1 keeps its rows and key */
    kv_blocks_adopt(&kb, 1, found, 1);
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 10, 11, cp, &n_cp), 0);
    cr_assert_eq(n_cp, 1, "slot 0 writes into a copy, rows 0..9 copied");
    cr_assert_eq(kv_blocks_match(&kb, v, 1, found), 1);
    cr_assert_eq(found[0], kv_blocks_table(&kb, 1)[0]);
    check_counts(&kb);
    kv_blocks_free(&kb);
}

Test(kv_blocks, cached_blocks_are_evicted_least_recently_cached_first)
{
    struct kv_blocks kb;
    cr_assert_eq(kv_blocks_init(&kb, 3, 64, 16, 4), 0);
    struct kv_block_copy cp[2];
    int n_cp;
    uint64_t a[16], b[16];
    fill_vals(a, 16, 0);
    fill_vals(b, 16, 500);
    cr_assert_eq(kv_blocks_reserve(&kb, 0, 0, 16, cp, &n_cp), 0);
    kv_blocks_key(&kb, 0, a);
    cr_assert_eq(kv_blocks_reserve(&kb, 1, 0, 16, cp, &n_cp), 0);
    kv_blocks_key(&kb, 1, b);
    kv_blocks_trim(&kb, 0, 0); /* a cached first, then b */
    kv_blocks_trim(&kb, 1, 0);
    cr_assert_eq(kb.n_cached, 2);
    cr_assert_eq(kv_blocks_reserve(&kb, 2, 0, 48, cp, &n_cp), 0, "2 free blocks and 1 cached one taken");
    cr_assert_eq(kb.evicted, 1);
    int32_t found[1];
    cr_assert_eq(kv_blocks_match(&kb, a, 1, found), 0, "the older one went");
    cr_assert_eq(kv_blocks_match(&kb, b, 1, found), 1);
    cr_assert_eq(kv_blocks_reserve(&kb, 2, 48, 64, cp, &n_cp), 0, "the last one goes too");
    cr_assert_eq(kv_blocks_match(&kb, b, 1, found), 0);
    cr_assert_eq(kb.n_free, 0);
    check_counts(&kb);
    kv_blocks_free(&kb);
}
