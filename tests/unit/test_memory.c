/* test_memory.c - devices, ledgers and expert caches: budgets hold, shrink/grow move whole
 * segments, restore returns to exactly the start-up size, and the model's output does not
 * depend on how many experts are cached or how the layers are split across devices. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/modelgen.h"
#include "memory/plan.h"

#define MIB ((size_t)1 << 20)

static char model_path[64];
static struct model M;

static void setup_model(const char *preset)
{
    snprintf(model_path, sizeof model_path, "/tmp/tide-test-mem-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = preset, .out = model_path, .seed = 7, .type = -1};
    struct modelgen_summary sum;
    char err[256] = "";
    cr_assert_eq(modelgen_write(&o, &sum, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_load(&M, model_path, err, sizeof err), 0, "%s", err);
}

static void teardown_model(void)
{
    model_free(&M);
    unlink(model_path);
}

static void setup_moe(void) { setup_model("moe"); }

/* Sum of the ledger never over budget, the cache kind equal to live segments. */
static void check_invariants(const struct memory_plan *p)
{
    for (int d = 0; d < p->n_dev; d++) {
        const struct device *dv = &p->dev[d];
        const struct expert_cache *c = &p->cache[d];
        cr_assert_leq(device_used(dv), dv->total, "device %d over budget", d);
        cr_assert_eq(dv->used[MEM_EXPERT_CACHE], (size_t)c->n_seg * c->seg_bytes, "device %d cache bytes", d);
        cr_assert_eq(expert_cache_bytes(c), (size_t)c->n_seg * c->slots_per_seg * c->slot_bytes);
        cr_assert_leq(c->n_seg, c->n_seg_full);
        int live = 0;
        for (int s = 0; s < c->n_seg * c->slots_per_seg; s++)
            if (c->slot_key[s] >= 0) {
                live++;
                cr_assert_eq(c->slot_of[c->slot_key[s]], s, "slot table out of step");
            }
        cr_assert_leq(live, expert_cache_slots(c));
    }
}

static int plan_two(struct memory_plan *p, long mib0, long mib1, size_t seg)
{
    struct plan_options o = {.n_devices = 2, .n_layer_split = 2, .n_ctx = 256, .n_threads = 1, .segment_bytes = seg};
    o.dev[0] = (struct plan_device_options){DEVICE_KIND_CPU, -1, mib0, 0};
    o.dev[1] = (struct plan_device_options){DEVICE_KIND_CPU, -1, mib1, 0};
    o.layer_split[0] = 0.5;
    o.layer_split[1] = 0.5;
    char err[256] = "";
    int rc = memory_plan_init(p, &o, &M, err, sizeof err);
    if (rc) cr_log_info("plan: %s", err);
    return rc;
}

TestSuite(memory, .init = setup_moe, .fini = teardown_model);

Test(memory, ledger_refuses_over_budget)
{
    struct device d;
    cr_assert_eq(device_init_cpu(&d, 0, 1000, 1), 0);
    void *a = device_alloc(&d, MEM_KV, 600);
    cr_assert_not_null(a);
    cr_assert_null(device_alloc(&d, MEM_WEIGHTS, 401), "an allocation over the budget succeeded");
    void *b = device_alloc(&d, MEM_WEIGHTS, 400);
    cr_assert_not_null(b);
    cr_assert_eq(device_free_bytes(&d), 0);
    device_free(&d, MEM_KV, a, 600);
    cr_assert_eq(device_free_bytes(&d), 600);
    cr_assert_eq(d.used[MEM_KV], 0);
    device_free(&d, MEM_WEIGHTS, b, 400);
    device_free_all(&d);
}

Test(memory, startup_takes_what_is_left_and_never_more_than_all_experts)
{
    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 256, 256, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    for (int d = 0; d < 2; d++) {
        const struct expert_cache *c = &p.cache[d];
        cr_assert_eq(expert_cache_slots(c), (int)((c->l1 - c->l0) * c->n_expert), "roomy device holds every expert");
        cr_assert_gt(p.dev[d].used[MEM_WEIGHTS], 0);
        cr_assert_gt(p.dev[d].used[MEM_KV], 0);
    }
    cr_assert_eq(p.l0[1], p.l1[0]);
    cr_assert_eq(p.l1[1], M.cfg.n_layer);
    check_invariants(&p);
    forward_free(&fw);
    memory_plan_free(&p);
}

Test(memory, too_small_a_device_is_a_clear_error)
{
    struct memory_plan p;
    struct plan_options o = {.n_devices = 1, .n_ctx = 4096, .n_threads = 1};
    o.dev[0] = (struct plan_device_options){DEVICE_KIND_CPU, -1, 2, 0};
    char err[256] = "";
    cr_assert_eq(memory_plan_init(&p, &o, &M, err, sizeof err), TIDE_ERANGE);
    cr_assert(strstr(err, "device 0") && strstr(err, "kv"), "message: %s", err);
}

/* Greedy tokens from a fixed prompt with the plan's stages. */
static void greedy(struct forward_state *fw, int *out, int n)
{
    int prompt[5] = {1, 50, 60, 70, 80};
    cr_assert_eq(forward_eval(fw, prompt, 5, 0), 0);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (uint32_t v = 1; v < M.cfg.n_vocab; v++)
            if (fw->logits[v] > fw->logits[best]) best = (int)v;
        out[i] = best;
        cr_assert_eq(forward_eval(fw, &best, 1, 5 + i), 0);
    }
}

Test(memory, output_does_not_depend_on_cache_size_or_split)
{
    /* reference: one stage, experts straight from host RAM */
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_state ref;
    cr_assert_eq(forward_init(&ref, &M, be, 256), 0);
    int want[12], got[12];
    greedy(&ref, want, 12);
    float ref_logits0[1024];
    int V = (int)M.cfg.n_vocab;
    memcpy(ref_logits0, ref.logits, sizeof(float) * (size_t)V);

    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 256, 256, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    for (int d = 0; d < 2; d++) /* batched prefill, like the reference */
        cr_assert_eq(forward_setup_prefill(&fw, d, PREFILL_OWN), 0);
    int full[2] = {p.cache[0].n_seg, p.cache[1].n_seg};
    for (int round = 0; round < 4; round++) {
        /* full cache, one segment, none at all (staging slot), full again */
        int segs = round == 1 ? 1 : round == 2 ? 0 : 1 << 20;
        for (int d = 0; d < 2; d++)
            expert_cache_resize(&p.cache[d], segs);
        check_invariants(&p);
        greedy(&fw, got, 12);
        for (int i = 0; i < 12; i++)
            cr_assert_eq(got[i], want[i], "round %d token %d: %d vs %d", round, i, got[i], want[i]);
        for (int v = 0; v < V; v++)
            cr_assert_eq(fw.logits[v], ref_logits0[v], "logit %d differs bitwise (round %d)", v, round);
    }
    cr_assert_eq(p.cache[0].n_seg, full[0]);
    cr_assert_gt(p.cache[0].misses, 0);
    cr_assert_gt(p.cache[0].hits, 0);
    forward_free(&fw);
    memory_plan_free(&p);
    forward_free(&ref);
    backend_cpu_free(&be);
}

Test(memory, reserve_shrinks_by_segments_and_restore_refills)
{
    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 64, 64, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    int out[4];
    greedy(&fw, out, 4); /* touch some experts */
    int slots_full[2] = {expert_cache_slots(&p.cache[0]), expert_cache_slots(&p.cache[1])};
    size_t shortfall[2];
    for (int d = 0; d < 2; d++)
        p.dev[d].reserve = device_free_bytes(&p.dev[d]) + p.cache[d].seg_bytes * 3 / 2;
    cr_assert_eq(memory_plan_apply(&p, NULL, shortfall), 0);
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(expert_cache_slots(&p.cache[d]), slots_full[d] - 2 * p.cache[d].slots_per_seg,
                     "device %d: a 1.5-segment reserve frees exactly two segments", d);
        cr_assert_geq(device_free_bytes(&p.dev[d]), p.dev[d].reserve);
        cr_assert_eq(shortfall[d], 0);
    }
    check_invariants(&p);
    /* more than the cache can give: partial, with the shortfall */
    p.dev[0].reserve = p.dev[0].total;
    cr_assert_eq(memory_plan_apply(&p, NULL, shortfall), 1);
    cr_assert_eq(p.cache[0].n_seg, 0);
    cr_assert_eq(shortfall[0], p.dev[0].total - device_free_bytes(&p.dev[0]));
    cr_assert_eq(shortfall[1], 0);
    /* restore */
    for (int d = 0; d < 2; d++)
        p.dev[d].reserve = p.dev[d].reserve_startup;
    uint64_t copied = p.cache[0].bytes_copied;
    cr_assert_eq(memory_plan_apply(&p, NULL, shortfall), 0);
    for (int d = 0; d < 2; d++)
        cr_assert_eq(expert_cache_slots(&p.cache[d]), slots_full[d]);
    cr_assert_gt(p.cache[0].bytes_copied, copied, "regrow refilled the experts it held");
    uint64_t misses = p.cache[0].misses;
    greedy(&fw, out, 1);
    cr_assert_eq(p.cache[0].misses, misses, "the refilled experts hit");
    check_invariants(&p);
    forward_free(&fw);
    memory_plan_free(&p);
}

Test(memory, random_reserves_restores_and_requests_keep_the_invariants)
{
    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 48, 40, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    int full[2] = {expert_cache_slots(&p.cache[0]), expert_cache_slots(&p.cache[1])};
    int want[3], got[3];
    greedy(&fw, want, 3);
    uint64_t r = 12345;
    for (int step = 0; step < 200; step++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int op = (int)((r >> 33) % 4), d = (int)((r >> 40) % 2);
        size_t shortfall[2];
        if (op == 0) { /* a reserve anywhere from 0 to the whole device */
            p.dev[d].reserve = (size_t)((r >> 20) % (p.dev[d].total + 1));
            int rc = memory_plan_apply(&p, NULL, shortfall);
            cr_assert(rc == 0 || rc == 1);
            if (rc == 0)
                cr_assert_geq(device_free_bytes(&p.dev[d]), p.dev[d].reserve);
        } else if (op == 1) { /* restore */
            p.dev[0].reserve = p.dev[1].reserve = 0;
            cr_assert_eq(memory_plan_apply(&p, NULL, shortfall), 0);
            cr_assert_eq(expert_cache_slots(&p.cache[0]), full[0]);
            cr_assert_eq(expert_cache_slots(&p.cache[1]), full[1]);
        } else if (op == 2) { /* an extra hand-back, as vision asks */
            size_t extra[2] = {0, 0};
            extra[d] = (size_t)((r >> 24) % (4 * MIB));
            memory_plan_apply(&p, extra, shortfall);
        } else if (step % 10 == 0) { /* a request */
            greedy(&fw, got, 3);
            for (int i = 0; i < 3; i++)
                cr_assert_eq(got[i], want[i], "step %d: output changed with the cache", step);
        }
        check_invariants(&p);
    }
    forward_free(&fw);
    memory_plan_free(&p);
}

Test(memory, injected_allocation_failure_leaves_the_cache_consistent)
{
    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 64, 64, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    int full = expert_cache_slots(&p.cache[0]);
    p.dev[0].reserve = p.dev[0].total; /* give all back */
    size_t sf[2];
    memory_plan_apply(&p, NULL, sf);
    p.dev[0].reserve = 0;
    p.dev[0].fail_after = 3; /* the third segment allocation of the regrow fails */
    p.dev[0].fail_kind = MEM_EXPERT_CACHE;
    memory_plan_apply(&p, NULL, sf);
    cr_assert_lt(expert_cache_slots(&p.cache[0]), full, "regrow stopped at the failure");
    check_invariants(&p);
    memory_plan_apply(&p, NULL, sf); /* the next attempt completes */
    cr_assert_eq(expert_cache_slots(&p.cache[0]), full);
    int out[2];
    greedy(&fw, out, 2);
    forward_free(&fw);
    memory_plan_free(&p);
}

Test(memory, prefill_borrowing_cache_segments_gives_the_same_output)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_state ref;
    cr_assert_eq(forward_init(&ref, &M, be, 256), 0);
    int want[6], got[6];
    greedy(&ref, want, 6);
    struct memory_plan p;
    cr_assert_eq(plan_two(&p, 64, 64, 0), 0);
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, 256, p.n_seq, p.max_batch, p.spec, p.n_dev), 0);
    cr_assert_eq(memory_plan_size_caches(&p), 0);
    size_t ws0 = p.dev[0].used[MEM_WORKSPACE];
    for (int d = 0; d < 2; d++)
        cr_assert_eq(forward_setup_prefill(&fw, d, PREFILL_BORROW), 0);
    cr_assert_eq(p.dev[0].used[MEM_WORKSPACE], ws0, "borrowing took new memory");
    greedy(&fw, got, 6); /* the 5-token prompt runs as one borrowed chunk */
    for (int i = 0; i < 6; i++)
        cr_assert_eq(got[i], want[i], "token %d differs when prefill borrows the cache", i);
    cr_assert_eq(p.cache[0].n_borrowed, 0, "segments not returned after the chunk");
    check_invariants(&p);
    /* with no live segment there is nothing to borrow: token at a time, same output */
    for (int d = 0; d < 2; d++)
        expert_cache_resize(&p.cache[d], 0);
    greedy(&fw, got, 6);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(got[i], want[i]);
    /* an own buffer is charged to the workspace */
    cr_assert_eq(forward_setup_prefill(&fw, 0, PREFILL_OWN), 0);
    cr_assert_eq(fw.stage[0].prefill, PREFILL_OWN);
    cr_assert_gt(p.dev[0].used[MEM_WORKSPACE], ws0, "an own prefill buffer is not in the ledger");
    check_invariants(&p);
    forward_free(&fw);
    memory_plan_free(&p);
    forward_free(&ref);
    backend_cpu_free(&be);
}

/* A chunk longer than the borrowed segments can hold (CUDA's 512) is halved until its buffers
 * fit, rather than falling back to a token at a time; the logits are those of own buffers
 * with the chunk it ran (256). */
Test(memory, a_long_chunk_borrows_half_when_segments_are_small)
{
    const int n_ctx = 512, n = 300;
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_state ref;
    struct forward_stage_spec rsp = {.be = be, .l0 = 0, .l1 = M.cfg.n_layer};
    cr_assert_eq(forward_init_stages(&ref, &M, n_ctx, 1, 256, &rsp, 1), 0);
    cr_assert_eq(forward_setup_prefill(&ref, 0, PREFILL_OWN), 0);
    const struct model_config *c = &M.cfg;
    size_t w = c->n_embd;
    size_t dims[] = {(size_t)c->n_head * c->head_dim, c->n_ff_exp, c->n_expert};
    for (int i = 0; i < 3; i++)
        if (dims[i] > w) w = dims[i];
    struct device dev;
    cr_assert_eq(device_init_cpu(&dev, 0, (size_t)1 << 30, 1), 0);
    struct expert_cache cache;
    /* segments that hold the widest buffer of a 256-token chunk but not of a 512-token one */
    cr_assert_eq(expert_cache_init(&cache, &dev, &M, 0, c->n_layer, 384 * w * sizeof(float), 1 << 20), 0);
    cr_assert(cache.seg_bytes >= 256 * w * sizeof(float) && cache.seg_bytes < 512 * w * sizeof(float),
              "segment of %zu bytes for a widest row of %zu floats", cache.seg_bytes, w);
    struct forward_stage_spec sp = {.dev = &dev, .l0 = 0, .l1 = c->n_layer, .cache = &cache};
    struct forward_state fw;
    cr_assert_eq(forward_init_stages(&fw, &M, n_ctx, 1, 512, &sp, 1), 0);
    cr_assert_eq(forward_setup_prefill(&fw, 0, PREFILL_BORROW), 0);
    int tok[300];
    for (int i = 0; i < n; i++)
        tok[i] = (int)((i * 37u + 11) % c->n_vocab);
    cr_assert_eq(forward_eval(&ref, tok, n, 0), 0);
    cr_assert_eq(forward_eval(&fw, tok, n, 0), 0);
    /* chunks of 256 and 44: at most every expert of every layer twice (a token at a time
     * would be n_expert_used per token and layer) */
    cr_assert_leq(fw.n_expert_calls, 2ull * c->n_expert * c->n_layer, "%llu expert calls",
                  (unsigned long long)fw.n_expert_calls);
    cr_assert_eq(memcmp(fw.logits, ref.logits, sizeof(float) * c->n_vocab), 0, "logits differ from own-buffer 256-token chunks");
    forward_free(&fw);
    expert_cache_free(&cache);
    device_free_all(&dev);
    forward_free(&ref);
    backend_cpu_free(&be);
}
