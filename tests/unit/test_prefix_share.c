/* test_prefix_share.c - a prompt's prefix from the other KV slots (engine/prefix_share.h): the
 * longest run held is copied; a prefilling sequence's longer shared prompt is waited for only
 * when it brings at least min_wait rows more; image rows match only the same image at the same
 * place; and forward_kv_clone's copied rows are the source's bytes, so the rows computed after
 * them and the logits equal a prompt computed alone, bit for bit (CPU backend). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/modelgen.h"
#include "engine/prefix_share.h"
#include "test_model.h"

static void ramp(int *ids, int n, int from)
{
    for (int i = 0; i < n; i++)
        ids[i] = from + i;
}

static struct prompt_rows run(const int *ids, int n) { return (struct prompt_rows){ids, n, NULL, 0}; }

Test(prefix_share, copies_the_longest_run_held)
{
    int q[200], a[200], b[200];
    ramp(q, 200, 1);
    ramp(a, 200, 1);
    ramp(b, 200, 1);
    b[120] = -5; /* b shares 120, a (40 rows held) 40 */
    struct share_source src[2] = {{.rows = run(a, 40)}, {.rows = run(b, 150)}};
    struct prompt_rows qr = run(q, 200);
    struct share_plan pl;
    prefix_share_plan(&qr, 199, 10, src, 2, 64, &pl);
    cr_assert_eq(pl.copy_from, 1);
    cr_assert_eq(pl.copy_len, 120);
    cr_assert_eq(pl.wait_on, -1);
    /* q already holds as much, or nearly (fewer rows than PREFIX_SHARE_MIN_COPY): nothing to copy */
    prefix_share_plan(&qr, 199, 120, src, 2, 64, &pl);
    cr_assert_eq(pl.copy_from, -1);
    cr_assert_eq(pl.copy_len, 0);
    prefix_share_plan(&qr, 199, 120 - PREFIX_SHARE_MIN_COPY + 1, src, 2, 64, &pl);
    cr_assert_eq(pl.copy_from, -1);
    prefix_share_plan(&qr, 199, 120 - PREFIX_SHARE_MIN_COPY, src, 2, 64, &pl);
    cr_assert(pl.copy_from == 1 && pl.copy_len == 120);
    /* the limit (the prompt's last row is always computed) */
    prefix_share_plan(&qr, 100, 0, src, 2, 64, &pl);
    cr_assert(pl.copy_from == 1 && pl.copy_len == 100, "%d %d", pl.copy_from, pl.copy_len);
}

Test(prefix_share, waits_for_a_prefilling_prompt_worth_min_wait_rows)
{
    int q[300], p[300];
    ramp(q, 300, 1);
    ramp(p, 300, 1);
    p[250] = -7; /* the pending prompt shares 250 rows; 30 computed so far */
    struct share_source src[1] = {{.rows = run(p, 30), .pending = run(p, 300)}};
    struct prompt_rows qr = run(q, 300);
    struct share_plan pl;
    prefix_share_plan(&qr, 299, 0, src, 1, 64, &pl);
    cr_assert(pl.wait_on == 0 && pl.wait_len == 250, "%d %d", pl.wait_on, pl.wait_len);
    cr_assert_eq(pl.copy_from, -1, "a wait copies nothing now");
    /* 200 computed: 50 more rows are not worth a wait of min_wait 64; 200 are copied now */
    src[0].rows = run(p, 200);
    prefix_share_plan(&qr, 299, 0, src, 1, 64, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_from == 0 && pl.copy_len == 200, "%d %d %d", pl.wait_on, pl.copy_from,
              pl.copy_len);
    /* ... but 50 are with min_wait 50 */
    prefix_share_plan(&qr, 299, 0, src, 1, 50, &pl);
    cr_assert(pl.wait_on == 0 && pl.copy_from == -1);
    /* the rows exist: copied */
    src[0].rows = run(p, 260);
    prefix_share_plan(&qr, 299, 0, src, 1, 64, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_from == 0 && pl.copy_len == 250);
    /* min_wait 0: never waits */
    src[0].rows = run(p, 30);
    prefix_share_plan(&qr, 299, 0, src, 1, 0, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_from == 0 && pl.copy_len == 30);
    /* a waiter (min_wait 1) waits for no rows too few to copy (PREFIX_SHARE_MIN_COPY) */
    prefix_share_plan(&qr, 299, 240, src, 1, 1, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_from == -1, "%d %d", pl.wait_on, pl.copy_from);
    prefix_share_plan(&qr, 299, 250 - PREFIX_SHARE_MIN_COPY, src, 1, 1, &pl);
    cr_assert(pl.wait_on == 0 && pl.wait_len == 250);
    /* a source with no pending prompt (a waiter, a decoding or finished sequence) is not waited on */
    src[0].pending = run(p, 0);
    prefix_share_plan(&qr, 299, 0, src, 1, 64, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_len == 30);
}

Test(prefix_share, the_leader_goes_and_waiters_re_plan)
{
    /* three sequences admitted together with one 200-row prompt: the first computes, the others
     * wait on it; it is cancelled with 64 rows computed: the next plan copies those 64, and the
     * one after that waits on the first waiter, which now computes (no wait on a waiter) */
    int p[210];
    ramp(p, 210, 3);
    struct prompt_rows qr = run(p, 210);
    struct share_source src[2] = {{.rows = run(p, 0), .pending = run(p, 210)}, {.rows = run(p, 0)}};
    struct share_plan pl;
    prefix_share_plan(&qr, 209, 0, src, 2, 64, &pl);
    cr_assert(pl.wait_on == 0 && pl.wait_len == 209);
    /* the leader cancelled: its 64 rows stand, nothing pending */
    src[0] = (struct share_source){.rows = run(p, 64)};
    prefix_share_plan(&qr, 209, 0, src, 2, 64, &pl);
    cr_assert(pl.wait_on == -1 && pl.copy_from == 0 && pl.copy_len == 64);
    /* waiter 1 took them and computes: waiter 2 waits on it */
    src[1] = (struct share_source){.rows = run(p, 64), .pending = run(p, 210)};
    prefix_share_plan(&qr, 209, 0, src, 2, 64, &pl);
    cr_assert(pl.wait_on == 1 && pl.wait_len == 209, "%d %d", pl.wait_on, pl.wait_len);
}

Test(prefix_share, image_rows_match_the_same_image_only)
{
    int q[100], a[100];
    ramp(q, 100, 1);
    for (int i = 10; i < 30; i++)
        q[i] = -1; /* an image at rows 10..29 */
    memcpy(a, q, sizeof q);
    struct row_image iq = {.at = 10, .n = 20, .keyed = true}, ia = iq, ib = iq;
    memset(iq.key, 1, sizeof iq.key);
    memset(ia.key, 1, sizeof ia.key);
    memset(ib.key, 2, sizeof ib.key);
    struct prompt_rows qr = {q, 100, &iq, 1};
    struct share_source src[1] = {{.rows = {a, 90, &ia, 1}, .pending = {a, 100, &ia, 1}}};
    struct share_plan pl;
    prefix_share_plan(&qr, 99, 0, src, 1, 64, &pl);
    cr_assert(pl.copy_from == 0 && pl.copy_len == 90, "the same image: %d %d", pl.copy_from, pl.copy_len);
    src[0].rows.img = &ib; /* another image of the same size at the same place */
    src[0].pending.img = &ib;
    prefix_share_plan(&qr, 99, 0, src, 1, 5, &pl);
    cr_assert(pl.copy_from == -1 && pl.wait_on == -1, "another image: %d %d %d", pl.copy_from, pl.copy_len,
              pl.wait_on); /* the 10 text rows before it are fewer than PREFIX_SHARE_MIN_COPY */
    src[0].rows.img = &ia; /* a pending prompt with the same image is waited for */
    src[0].rows.n = 12;
    src[0].pending.img = &ia;
    prefix_share_plan(&qr, 99, 0, src, 1, 64, &pl);
    cr_assert(pl.wait_on == 0 && pl.wait_len == 99);
}

/* A random-weight model of preset in a forward state of 3 KV slots of 128 positions on the CPU
 * backend (spec: its KV type and blocks), with 50 prompt ids in ids. */
struct clone_fixture {
    char path[96];
    struct model m;
    struct backend be;
    struct forward_state f;
    int ids[50];
};

static void fixture_up(struct clone_fixture *x, const char *preset, enum kv_type kv, int block_rows)
{
    test_model_load(&x->m, x->path, sizeof x->path, "prefix", preset, -1, 5);
    cr_assert_eq(backend_cpu_init(&x->be, 1), 0);
    struct forward_stage_spec sp = {.be = x->be, .l0 = 0, .l1 = x->m.cfg.n_layer, .kv_type = kv,
                                    .kv_block_rows = block_rows};
    cr_assert_eq(forward_init_stages(&x->f, &x->m, 128, 3, 64, &sp, 1), 0);
    cr_assert_eq(forward_setup_prefill(&x->f, 0, PREFILL_OWN), 0);
    for (int i = 0; i < 50; i++)
        x->ids[i] = (int)((13u * (unsigned)i + 5u) % x->m.cfg.n_vocab);
}

static void fixture_down(struct clone_fixture *x)
{
    forward_free(&x->f);
    backend_cpu_free(&x->be);
    model_free(&x->m);
    unlink(x->path);
}

/* forward_kv_clone on the CPU backend: rows 0..n-1 of every layer's K and V copied between
 * slots; the prompt's rest computed after them gives the logits of the prompt computed alone */
Test(prefix_share, cloned_rows_compute_the_same_logits)
{
    struct clone_fixture x;
    fixture_up(&x, "moe", KV_F32, 0);
    int *ids = x.ids;
    uint32_t V = x.m.cfg.n_vocab;
    float *want = malloc(sizeof(float) * V);
    struct forward_seq a = {.slot = 0, .pos = 0, .n = 50, .tokens = ids, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&x.f, &a, 1), 0);
    memcpy(want, a.logits, sizeof(float) * V);
    cr_assert_eq(forward_kv_clone(&x.f, 0, 2, 30), 30, "the rows slot 2 holds from slot 0");
    size_t rb = forward_kv_row_bytes(&x.f);
    char *r0 = malloc(30 * rb), *r2 = malloc(30 * rb);
    cr_assert_eq(forward_kv_copy(&x.f, 0, 30, (float *)r0, 30, true), 0);
    cr_assert_eq(forward_kv_copy(&x.f, 2, 30, (float *)r2, 30, true), 0);
    cr_assert_eq(memcmp(r0, r2, 30 * rb), 0, "the copied rows are the source's bytes");
    struct forward_seq b = {.slot = 2, .pos = 30, .n = 20, .tokens = ids + 30, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&x.f, &b, 1), 0);
    cr_assert_eq(memcmp(want, b.logits, sizeof(float) * V), 0, "the same logits, bit for bit");
    cr_assert_eq(forward_kv_clone(&x.f, 0, 3, 1), TIDE_EINVAL, "slot 3 of 3");
    free(want);
    free(r0);
    free(r2);
    fixture_down(&x);
}

/* The same on a paged cache (blocks of 16 rows, f16): slot 2 takes slot 0's first 40 rows with
 * its two whole blocks in place (the same blocks in both tables) and the partial third copied;
 * computing the rest gives slot 0's logits bit for bit. Then slot 2 writes from row 20, inside
 * a shared block: it gets a copy of its own (copy on write), and slot 0's rows do not change. */
Test(prefix_share, paged_blocks_shared_in_place_and_copied_on_write)
{
    struct clone_fixture x;
    fixture_up(&x, "qwen3moe", KV_F16, 16);
    cr_assert(!x.f.kv.fixed, "the CPU backend pages");
    int *ids = x.ids;
    uint32_t V = x.m.cfg.n_vocab;
    float *want = malloc(sizeof(float) * V);
    struct forward_seq a = {.slot = 0, .pos = 0, .n = 50, .tokens = ids, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&x.f, &a, 1), 0);
    memcpy(want, a.logits, sizeof(float) * V);
    size_t rb = forward_kv_row_bytes(&x.f);
    char *r0 = malloc(50 * rb), *r0b = malloc(50 * rb);
    cr_assert_eq(forward_kv_copy(&x.f, 0, 50, r0, 50, true), 0);
    cr_assert_eq(forward_kv_clone(&x.f, 0, 2, 40), 40);
    const int32_t *t0 = kv_blocks_table(&x.f.kv, 0), *t2 = kv_blocks_table(&x.f.kv, 2);
    cr_assert(t2[0] == t0[0] && t2[1] == t0[1] && t2[2] != t0[2], "two blocks in place, the third a copy");
    cr_assert_eq(kv_blocks_shared(&x.f.kv), 2);
    struct forward_seq b = {.slot = 2, .pos = 40, .n = 10, .tokens = ids + 40, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&x.f, &b, 1), 0);
    cr_assert_eq(memcmp(want, b.logits, sizeof(float) * V), 0, "the same logits, bit for bit");
    int32_t shared1 = t2[1];
    struct forward_seq c = {.slot = 2, .pos = 20, .n = 30, .tokens = ids + 20, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&x.f, &c, 1), 0);
    cr_assert_eq(memcmp(want, c.logits, sizeof(float) * V), 0, "computed again from row 20: the same logits");
    cr_assert(t2[1] != shared1 && t0[1] == shared1 && t2[0] == t0[0], "slot 2 wrote into a copy of block 1");
    cr_assert_eq(forward_kv_copy(&x.f, 0, 50, r0b, 50, true), 0);
    cr_assert_eq(memcmp(r0, r0b, 50 * rb), 0, "slot 0's rows did not change");
    forward_kv_trim(&x.f, 2, 0);
    forward_kv_trim(&x.f, 0, 0);
    cr_assert_eq(x.f.kv.n_free, x.f.kv.n_blocks, "every block back in the pool");
    free(want);
    free(r0);
    free(r0b);
    fixture_down(&x);
}
