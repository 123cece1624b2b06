/* test_kv_park.c - conversation parking (engine/kv_park.h) on the CPU backend: parked rows come
 * back into another slot byte for byte, a prefix of them too; the budget holds (least recently
 * used dropped first, an over-long conversation kept from its start); an entry that extends
 * another replaces it; image rows and short conversations are not parked. Parking an f16 cache
 * (kv_park_f16) moves its rows as the f16 bytes they are. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/kv_park.h"
#include "engine/modelgen.h"
#include "test_model.h"

static struct model m;
static struct forward_state f;
static struct backend be;
static char path[96];

static void setup_kv(enum kv_type kv)
{
    test_model_load(&m, path, sizeof path, "kvpark", "moe", -1, 3);
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer, .kv_type = kv};
    cr_assert_eq(forward_init_stages(&f, &m, 128, 3, 64, &sp, 1), 0);
    cr_assert_eq(f.kv_f16, kv == KV_F16);
    cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
}

static void setup(void) { setup_kv(KV_F32); }
static void setup_f16(void) { setup_kv(KV_F16); }

static void teardown(void)
{
    forward_free(&f);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}

/* Runs tokens ids[0..n) into slot from position 0. */
static void fill(int slot, const int *ids, int n)
{
    struct forward_seq q = {.slot = slot, .pos = 0, .n = n, .tokens = ids};
    cr_assert_eq(forward_eval_batch(&f, &q, 1), 0);
}

static void tokens(int *ids, int n, int seed)
{
    for (int i = 0; i < n; i++)
        ids[i] = (int)((7u * (unsigned)seed + 11u * (unsigned)i + 1u) % m.cfg.n_vocab);
}

/* rows of token ids only (an -1 among them is an image row without a key) */
static int save(struct kv_park *p, int slot, const int *ids, int n)
{
    struct prompt_rows r = {ids, n, NULL, 0};
    return kv_park_save(p, &f, slot, &r);
}

static int find(const struct kv_park *p, const int *ids, int limit, int *len)
{
    struct prompt_rows q = {ids, limit, NULL, 0};
    return kv_park_find(p, &q, limit, len);
}

TestSuite(kv_park, .init = setup, .fini = teardown);
TestSuite(kv_park_f16, .init = setup_f16, .fini = teardown);

static void check_restored_rows(void)
{
    size_t rb = forward_kv_row_bytes(&f), el = f.kv_f16 ? sizeof(uint16_t) : sizeof(float);
    cr_assert_eq(rb, 2 * el * m.cfg.n_layer * m.cfg.n_head_kv * m.cfg.head_dim, "a position's bytes");
    struct kv_park p;
    kv_park_init(&p, 1 << 20, rb);
    int a[40], b[40];
    tokens(a, 40, 1);
    tokens(b, 40, 2);
    fill(0, a, 40);
    uint8_t *want = malloc(40 * rb), *got = malloc(40 * rb);
    cr_assert_eq(forward_kv_copy(&f, 0, 40, want, 40, true), 0);
    cr_assert_eq(save(&p, 0, a, 40), 0);
    cr_assert_eq(p.n, 1);
    fill(0, b, 40); /* the slot now holds another prompt */
    int len, i = find(&p, a, 39, &len);
    cr_assert(i == 0 && len == 39, "found %d, %d rows", i, len);
    /* all 40 rows into slot 1: the same bytes */
    cr_assert_eq(kv_park_restore(&p, &f, 0, 1, 0, 40), 0);
    cr_assert_eq(forward_kv_copy(&f, 1, 40, got, 40, true), 0);
    cr_assert_eq(memcmp(want, got, 40 * rb), 0);
    /* a prefix of 25 into slot 2: its rows are the first 25 of each layer's K and V */
    cr_assert_eq(kv_park_restore(&p, &f, 0, 2, 0, 25), 0);
    cr_assert_eq(forward_kv_copy(&f, 2, 25, got, 40, true), 0);
    size_t row = rb / 2 / m.cfg.n_layer; /* one position's K (or V) row of a layer, in bytes */
    for (uint32_t l = 0; l < m.cfg.n_layer; l++)
        for (int kv = 0; kv < 2; kv++) {
            size_t o = ((size_t)l * 2 + (size_t)kv) * 40 * row;
            cr_assert_eq(memcmp(want + o, got + o, 25 * row), 0, "layer %u %s", l, kv ? "V" : "K");
        }
    cr_assert_eq(p.n_restored, 2);
    cr_assert_eq(p.tokens_restored, 65);
    free(want);
    free(got);
    kv_park_free(&p);
}

Test(kv_park, restored_rows_are_the_parked_bytes) { check_restored_rows(); }
Test(kv_park_f16, restored_rows_are_the_parked_f16_bytes) { check_restored_rows(); }

Test(kv_park, budget_lru_extension_and_limits)
{
    size_t rb = forward_kv_row_bytes(&f);
    struct kv_park p;
    kv_park_init(&p, 100 * rb, rb); /* room for 100 positions */
    int a[60], b[40], c[40], img[40];
    tokens(a, 60, 1);
    tokens(b, 40, 2);
    tokens(c, 40, 3);
    fill(0, a, 60);
    cr_assert_eq(save(&p, 0, a, 30), 0); /* a's first 30 */
    cr_assert_eq(save(&p, 0, a, 60), 0); /* extends it: replaces it */
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.used, 60 * rb);
    cr_assert_eq(save(&p, 0, a, 50), 0); /* already held in full: nothing new */
    cr_assert_eq(p.n, 1);
    fill(1, b, 40);
    cr_assert_eq(save(&p, 1, b, 40), 0); /* 100 positions: full */
    cr_assert_eq(p.n, 2);
    int len;
    find(&p, a, 59, &len); /* a is now the more recent: c evicts b */
    cr_assert_eq(kv_park_restore(&p, &f, 0, 2, 0, len), 0);
    fill(1, c, 40);
    cr_assert_eq(save(&p, 1, c, 40), 0);
    cr_assert_eq(p.n, 2);
    cr_assert_eq(p.n_evicted, 1);
    cr_assert(find(&p, b, 39, &len) < 0 || len == 0, "b should have been evicted (len %d)", len);
    cr_assert(find(&p, a, 59, &len) >= 0 && len == 59);
    cr_assert(p.used <= p.budget);
    /* too few rows, or image rows from the start: not parked */
    cr_assert_eq(save(&p, 1, c + 30, 10), 0);
    memcpy(img, c, sizeof img);
    img[5] = -1;
    save(&p, 1, img, 40); /* 5 rows before the image: under the minimum */
    cr_assert_eq(p.n, 2);
    /* a conversation longer than the whole budget keeps its first positions, as many as fit */
    kv_park_free(&p);
    kv_park_init(&p, 20 * rb, rb);
    cr_assert_eq(save(&p, 0, a, 60), 0);
    cr_assert(p.n == 1 && p.e[0].n == 20 && p.used == 20 * rb);
    kv_park_free(&p);
    /* image rows with their key are parked, and match the same image at the same place only */
    kv_park_free(&p);
    kv_park_init(&p, 100 * rb, rb);
    int v[40];
    tokens(v, 40, 4);
    for (int k = 10; k < 30; k++)
        v[k] = -1;
    struct row_image im = {.at = 10, .n = 20, .keyed = true};
    memset(im.key, 7, sizeof im.key);
    struct prompt_rows vr = {v, 40, &im, 1};
    cr_assert_eq(kv_park_save(&p, &f, 0, &vr), 0);
    cr_assert(p.n == 1 && p.e[0].n == 40 && p.e[0].n_img == 1);
    cr_assert(kv_park_find(&p, &vr, 39, &len) == 0 && len == 39);
    struct row_image other = im;
    other.key[31] ^= 1; /* another image of the same size */
    struct prompt_rows wr = {v, 40, &other, 1};
    cr_assert(kv_park_find(&p, &wr, 39, &len) == 0 && len == 10, "len %d", len);
    struct row_image moved = im;
    moved.at = 11; /* the same image one row later: its rows are other rows */
    struct prompt_rows mr = {v, 40, &moved, 1};
    cr_assert(kv_park_find(&p, &mr, 39, &len) == 0 && len == 10, "len %d", len);
    /* budget 0: off */
    kv_park_init(&p, 0, rb);
    cr_assert_eq(save(&p, 0, a, 60), 0);
    cr_assert_eq(p.n, 0);
    kv_park_free(&p);
}
