/* test_batch.c - a batched step gives each sequence the bits it gets alone (CPU backend).
 *
 * Three prompts of different lengths run alone (one sequence, one prefill call, then greedy
 * decode steps), and then together through forward_eval_batch in one forward state with
 * several KV slots: prompt chunks of uneven sizes beside other sequences' decode rows, a step
 * larger than the buffers (cut by the forward), and decode steps of all three at once. Every
 * logits row the batch produces must equal the lone run's row bit for bit: this is what makes
 * a reply under load identical to the same request alone. Rows whose draw the backend makes
 * (forward_seq.draw, backend_i.sample) get the draw of their own logits, whatever shares the step.
 * With an f16 KV cache (the *_kv_f16 tests) the same holds: rows are rounded as they are stored,
 * whatever shares the step, and the attention reads them the same way in both. The *_paged_rows
 * tests give the paged state a CPU form of the decode rows' paged ops (which the CPU backend does
 * not have; CUDA does), so that the forward's way to them - each stage's copy of the block
 * tables, the rows' slots and positions - is checked here, bit for bit, as the GPU's kernels are
 * against it in test-gpu. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/modelgen.h"
#include "engine/sample.h"
#include "engine/sample_rows.h"
#include "test_model.h"

#define NSEQ 3
#define NDEC 5
static const int plen[NSEQ] = {9, 23, 5};

static int prompt_tok(int s, int i, uint32_t V) { return (int)((7u * (unsigned)s + 13u * (unsigned)i + 3u) % V); }

/* The paged decode rows' ops (backend.h) made of the CPU's own ops a row at a time, so their bits
 * are what the forward's per-sequence path computes: qk_norm_rope, the rows stored as store_run
 * stores them (f16: store_f16), attention_paged over the row's slot's table. All arrays are host
 * memory here (the CPU's backend memory). */
static const struct backend_i *twin_base; /* the CPU's table */
static int twin_rows;                     /* rows the twin ops have run */

static void twin_qk_norm_rope_at_paged(void *ctx, float *q, const float *k_new, const float *v_new, void *k_pool,
                                       void *v_pool, bool f16, int n, const int32_t *at, const int32_t *slot,
                                       const int32_t *tables, int table_stride, int block_rows,
                                       const struct tensor *q_norm, const struct tensor *k_norm, int n_head,
                                       int n_head_kv, int head_dim, float theta, enum rope_kind kind, float eps)
{
    size_t kvd = (size_t)n_head_kv * head_dim, qd = (size_t)n_head * head_dim, es = f16 ? 2 : 4;
    float *k = malloc(kvd * sizeof(float));
    for (int r = 0; r < n; r++) {
        const int32_t *tab = tables + (size_t)(slot ? slot[r] : 0) * table_stride;
        int p = at[r];
        memcpy(k, k_new + r * kvd, kvd * sizeof(float));
        twin_base->qk_norm_rope(ctx, q + r * qd, k, q_norm, k_norm, 1, n_head, n_head_kv, head_dim, p, theta, kind,
                                eps);
        size_t off = ((size_t)tab[p / block_rows] * block_rows + (size_t)(p % block_rows)) * kvd * es;
        if (f16) {
            twin_base->store_f16(ctx, (uint16_t *)((uint8_t *)k_pool + off), k, kvd);
            twin_base->store_f16(ctx, (uint16_t *)((uint8_t *)v_pool + off), v_new + r * kvd, kvd);
        } else {
            memcpy((uint8_t *)k_pool + off, k, kvd * sizeof(float));
            memcpy((uint8_t *)v_pool + off, v_new + r * kvd, kvd * sizeof(float));
        }
    }
    free(k);
}

static void twin_attention_at_paged(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                                    float *out, int n, const int32_t *at, const int32_t *slot, const int32_t *tables,
                                    int table_stride, int block_rows, int n_ctx, int n_head, int n_head_kv,
                                    int head_dim)
{
    size_t qd = (size_t)n_head * head_dim;
    float *att = malloc(sizeof(float) * n_head * n_ctx);
    for (int r = 0; r < n; r++)
        twin_base->attention_paged(ctx, q + r * qd, k_pool, v_pool, f16,
                                   tables + (size_t)(slot ? slot[r] : 0) * table_stride, block_rows, out + r * qd, att,
                                   1, at[r], n_head, n_head_kv, head_dim);
    free(att);
    twin_rows += n;
}

static bool rows_twin; /* check_preset_paged: the batched state's backend has the twin ops */

/* block_rows > 0: the batched state's KV cache is paged in blocks of that many rows (kv_blocks.h),
 * where the model can page; the lone runs keep one block a slot. */
static void check_preset_paged(const char *preset, int type, enum kv_type kv, int block_rows)
{
    char path[96];
    struct model m;
    test_model_load(&m, path, sizeof path, "batch", preset, type, 7);
    uint32_t V = m.cfg.n_vocab;
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);

    /* alone: logits after each prompt and after each of NDEC greedy tokens */
    float *alone = malloc(sizeof(float) * V * NSEQ * (NDEC + 1));
    int toks[NSEQ][NDEC];
    for (int s = 0; s < NSEQ; s++) {
        struct forward_state f; /* forward_init's shape, with the KV type */
        struct forward_stage_spec sp1 = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer, .kv_type = kv};
        cr_assert_eq(forward_init_stages(&f, &m, 128, 1, FORWARD_DEFAULT_BATCH, &sp1, 1), 0);
        cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
        int ids[64];
        for (int i = 0; i < plen[s]; i++)
            ids[i] = prompt_tok(s, i, V);
        cr_assert_eq(forward_eval(&f, ids, plen[s], 0), 0);
        for (int d = 0; d <= NDEC; d++) {
            memcpy(alone + ((size_t)s * (NDEC + 1) + d) * V, f.logits, sizeof(float) * V);
            if (d == NDEC)
                break;
            toks[s][d] = sampler_argmax(f.logits, (int)V);
            cr_assert_eq(forward_eval(&f, &toks[s][d], 1, plen[s] + d), 0);
        }
        forward_free(&f);
    }

    /* together: 4 slots (one unused), steps of at most 16 rows from the prefill buffers */
    struct forward_state f;
    struct backend_i twin = *be.i;
    struct backend bb = be;
    if (rows_twin) {
        twin_base = be.i;
        twin_rows = 0;
        twin.qk_norm_rope_at_paged = twin_qk_norm_rope_at_paged;
        twin.attention_at_paged = twin_attention_at_paged;
        bb.i = &twin;
    }
    struct forward_stage_spec sp = {.be = bb, .l0 = 0, .l1 = m.cfg.n_layer, .kv_type = kv, .kv_block_rows = block_rows};
    cr_assert_eq(forward_init_stages(&f, &m, 128, 4, 16, &sp, 1), 0);
    bool can_page = !m.cfg.kv_lora_rank;
    cr_assert_eq(!f.kv.fixed, block_rows > 0 && can_page, "%s: paged %d", preset, !f.kv.fixed);
    /* deepseek2's latent cache stays f32 (forward_kv_f16_why) */
    cr_assert_eq(f.kv_f16, kv == KV_F16 && !m.cfg.kv_lora_rank, "%s: kv_f16 %d", preset, f.kv_f16);
    cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
    int slot[NSEQ] = {2, 0, 3}, pos[NSEQ] = {0}, dec[NSEQ] = {0}, checked = 0;
    int ids[NSEQ][64];
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < plen[s]; i++)
            ids[s][i] = prompt_tok(s, i, V);
    /* chunk sizes per step for each sequence while it prefills: uneven on purpose, and step 2
     * asks for more rows (7 + 11 + ...) than the 16 the buffers hold */
    const int chunk[NSEQ][6] = {{4, 5, 0, 0, 0, 0}, {6, 11, 6, 0, 0, 0}, {1, 1, 1, 1, 1, 0}};
    for (int step = 0; step < 12; step++) {
        struct forward_seq q[NSEQ];
        int who[NSEQ], nq = 0;
        for (int s = 0; s < NSEQ; s++) {
            if (pos[s] < plen[s]) {
                int k = chunk[s][step < 6 ? step : 5];
                if (k <= 0 || pos[s] + k > plen[s])
                    k = plen[s] - pos[s];
                q[nq] = (struct forward_seq){.slot = slot[s], .pos = pos[s], .n = k, .tokens = ids[s] + pos[s],
                                             .want_logits = pos[s] + k == plen[s]};
            } else if (dec[s] < NDEC) {
                q[nq] = (struct forward_seq){.slot = slot[s], .pos = pos[s], .n = 1, .tokens = &toks[s][dec[s]],
                                             .want_logits = true, .pick_only = s == 1};
            } else {
                continue;
            }
            who[nq++] = s;
        }
        if (!nq)
            break;
        cr_assert_eq(forward_eval_batch(&f, q, nq), 0, "step %d", step);
        for (int i = 0; i < nq; i++) {
            int s = who[i];
            bool decode = pos[s] >= plen[s];
            pos[s] += q[i].n;
            if (!q[i].want_logits)
                continue;
            int d = decode ? ++dec[s] : 0;
            const float *want = alone + ((size_t)s * (NDEC + 1) + d) * V;
            if (q[i].pick_only && !q[i].logits) {
                cr_assert_eq(q[i].pick, sampler_argmax(want, (int)V), "%s seq %d row %d: pick", preset, s, d);
            } else {
                cr_assert_not_null(q[i].logits);
                for (uint32_t v = 0; v < V; v++)
                    cr_assert(memcmp(&q[i].logits[v], &want[v], sizeof(float)) == 0,
                              "%s type %d seq %d row %d logit %u: batched %.9g alone %.9g", preset, type, s, d, v,
                              q[i].logits[v], want[v]);
            }
            checked++;
        }
    }
    cr_assert_eq(checked, NSEQ * (NDEC + 1), "every row compared");
    /* the steps of all three decode rows went through the rows' ops: 3 rows a layer a step */
    if (rows_twin)
        cr_assert_gt(twin_rows, 0, "the paged rows' ops ran");
    forward_free(&f);
    free(alone);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}

static void check_preset_kv(const char *preset, int type, enum kv_type kv) { check_preset_paged(preset, type, kv, 0); }
static void check_preset(const char *preset, int type) { check_preset_kv(preset, type, KV_F32); }

/* A paged KV cache (blocks of 16 rows: the 23-row prompt and its decode rows cross two block
 * boundaries, the slots' blocks interleave in the pool) gives the same bits. */
Test(batch, moe_f16_paged_batched_equals_alone) { check_preset_paged("moe", -1, KV_F32, 16); }
Test(batch, qwen3moe_f16_kv_f16_paged_batched_equals_alone) { check_preset_paged("qwen3moe", -1, KV_F16, 16); }
Test(batch, qwen2moe_q8_0_kv_f16_paged_batched_equals_alone) { check_preset_paged("qwen2moe", GGML_TYPE_Q8_0, KV_F16, 16); }
Test(batch, dense_f32_paged_batched_equals_alone) { check_preset_paged("dense", GGML_TYPE_F32, KV_F32, 32); }
Test(batch, deepseek2_paged_keeps_one_block_a_slot) { check_preset_paged("deepseek2", -1, KV_F32, 16); }
/* the decode steps of several sequences through qk_norm_rope_at_paged / attention_at_paged */
Test(batch, moe_f16_paged_rows_batched_equals_alone)
{
    rows_twin = true;
    check_preset_paged("moe", -1, KV_F32, 16);
}
Test(batch, qwen3moe_f16_kv_f16_paged_rows_batched_equals_alone)
{
    rows_twin = true;
    check_preset_paged("qwen3moe", -1, KV_F16, 16);
}

Test(batch, moe_f16_batched_equals_alone) { check_preset("moe", -1); }
Test(batch, moe_f16_kv_f16_batched_equals_alone) { check_preset_kv("moe", -1, KV_F16); }
Test(batch, qwen3moe_f16_kv_f16_batched_equals_alone) { check_preset_kv("qwen3moe", -1, KV_F16); }
Test(batch, qwen2moe_q8_0_kv_f16_batched_equals_alone) { check_preset_kv("qwen2moe", GGML_TYPE_Q8_0, KV_F16); }
Test(batch, olmoe_f16_kv_f16_batched_equals_alone) { check_preset_kv("olmoe", -1, KV_F16); }
Test(batch, deepseek2_kv_f16_keeps_f32_batched_equals_alone) { check_preset_kv("deepseek2", -1, KV_F16); }
Test(batch, qwen3moe_f16_batched_equals_alone) { check_preset("qwen3moe", -1); }
Test(batch, qwen2moe_f16_batched_equals_alone) { check_preset("qwen2moe", -1); }
Test(batch, olmoe_f16_batched_equals_alone) { check_preset("olmoe", -1); }
Test(batch, granitemoe_f16_batched_equals_alone) { check_preset("granitemoe", -1); }
Test(batch, granitemoe_shared_f16_batched_equals_alone) { check_preset("granitemoe-shared", -1); }
Test(batch, deepseek2_f16_batched_equals_alone) { check_preset("deepseek2", -1); }
Test(batch, moe_q8_0_batched_equals_alone) { check_preset("moe", GGML_TYPE_Q8_0); }
Test(batch, dense_f32_batched_equals_alone) { check_preset("dense", GGML_TYPE_F32); }

Test(batch, rejects_shared_slot_and_overflow)
{
    char path[96];
    struct model m;
    test_model_load(&m, path, sizeof path, "batch-bad", "moe", -1, 7);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_state f;
    struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer};
    cr_assert_eq(forward_init_stages(&f, &m, 32, 2, 8, &sp, 1), 0);
    int t = 1;
    struct forward_seq two[2] = {{.slot = 1, .pos = 0, .n = 1, .tokens = &t}, {.slot = 1, .pos = 0, .n = 1, .tokens = &t}};
    cr_assert_eq(forward_eval_batch(&f, two, 2), TIDE_EINVAL, "two sequences in one slot");
    struct forward_seq past = {.slot = 0, .pos = 32, .n = 1, .tokens = &t};
    cr_assert_eq(forward_eval_batch(&f, &past, 1), TIDE_ERANGE, "past the context");
    struct forward_seq noslot = {.slot = 2, .pos = 0, .n = 1, .tokens = &t};
    cr_assert_eq(forward_eval_batch(&f, &noslot, 1), TIDE_ERANGE, "a slot that does not exist");
    forward_free(&f);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}

/* A step of three prompts: one drawn by the backend, one greedy, one wanting its logits; then
 * the drawn one beside a greedy one only (nothing comes back but ids); then two draws with edits
 * and logprobs around a greedy row. The draw is the host form's on the row's logits alone, and
 * the greedy pick the argmax of its own. */
Test(batch, backend_draws_are_the_rows_own)
{
    char path[96];
    struct model m;
    test_model_load(&m, path, sizeof path, "batch-draw", "moe", -1, 7);
    int V = (int)m.cfg.n_vocab;
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    int ids[NSEQ][64];
    float *alone = malloc(sizeof(float) * (size_t)V * NSEQ);
    for (int s = 0; s < NSEQ; s++) {
        struct forward_state f;
        cr_assert_eq(forward_init(&f, &m, be, 64), 0);
        for (int i = 0; i < plen[s]; i++)
            ids[s][i] = prompt_tok(s, i, (uint32_t)V);
        cr_assert_eq(forward_eval(&f, ids[s], plen[s], 0), 0);
        memcpy(alone + (size_t)s * V, f.logits, sizeof(float) * (size_t)V);
        forward_free(&f);
    }
    struct sample_row draw = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .u = 0.37};
    for (int round = 0; round < 2; round++) {
        struct forward_state f;
        struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer};
        cr_assert_eq(forward_init_stages(&f, &m, 64, NSEQ, 64, &sp, 1), 0);
        cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
        struct forward_seq q[NSEQ];
        for (int s = 0; s < NSEQ; s++)
            q[s] = (struct forward_seq){.slot = s, .pos = 0, .n = plen[s], .tokens = ids[s], .want_logits = true,
                                        .pick_only = s == 1, .draw = s == 0 ? &draw : NULL};
        int n = round == 0 ? NSEQ : 2; /* round 1: no row needs its logits on the host */
        cr_assert_eq(forward_eval_batch(&f, q, n), 0);
        int32_t want = -1;
        cr_assert_eq(sample_rows(alone, 1, V, &draw, &want), 0);
        cr_expect_eq(q[0].pick, want, "round %d: the backend drew %d, the host form %d", round, q[0].pick, want);
        cr_expect_null(q[0].logits);
        cr_expect_eq(q[1].pick, sampler_argmax(alone + V, V), "round %d: greedy pick", round);
        if (n == NSEQ) {
            cr_expect_eq(q[2].pick, -1);
            cr_assert_not_null(q[2].logits);
            cr_expect_eq(memcmp(q[2].logits, alone + 2 * (size_t)V, sizeof(float) * (size_t)V), 0);
        }
        forward_free(&f);
        draw.u = 0.91;
    }
    /* round 3: rows 0 and 2 drawn with edits (penalties, a bias, a mask) and logprobs on either
     * side of a greedy row (two backend_i.sample calls): each row's id and logprob record are
     * those of its own logits (sample_rows_full, the host sampler's arithmetic) */
    struct sample_edit ed0[] = {{.id = 3, .what = SAMPLE_EDIT_SUB, .sub = 1.5f},
                                {.id = 9, .what = SAMPLE_EDIT_BIAS | SAMPLE_EDIT_SEEN, .bias = 2.0f},
                                {.id = 11, .what = SAMPLE_EDIT_MASK}};
    struct sample_edit ed2[] = {{.id = 5, .what = SAMPLE_EDIT_BAN}};
    struct sample_row dr[3] = {{.temperature = 1.0f, .top_p = 1.0f, .u = 0.42, .edits = ed0, .n_edits = 3,
                                .repetition_penalty = 1.3f, .logprobs = true, .top_logprobs = 3},
                               {.temperature = 1.0f},
                               {.temperature = 0.0f, .top_p = 1.0f, .edits = ed2, .n_edits = 1, .logprobs = true,
                                .top_logprobs = 20}};
    {
        struct forward_state f;
        struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer};
        cr_assert_eq(forward_init_stages(&f, &m, 64, NSEQ, 64, &sp, 1), 0);
        cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
        struct forward_seq q[NSEQ];
        struct sample_logprob got[3] = {{0}};
        for (int s = 0; s < NSEQ; s++)
            q[s] = (struct forward_seq){.slot = s, .pos = 0, .n = plen[s], .tokens = ids[s], .want_logits = true,
                                        .pick_only = s == 1, .draw = s == 1 ? NULL : &dr[s], .logprob = &got[s]};
        cr_assert_eq(forward_eval_batch(&f, q, NSEQ), 0);
        for (int s = 0; s < NSEQ; s += 2) {
            float *l = malloc(sizeof(float) * (size_t)V);
            memcpy(l, alone + (size_t)s * V, sizeof(float) * (size_t)V);
            int32_t want = -1;
            struct sample_logprob wl;
            cr_assert_eq(sample_rows_full(l, 1, V, &dr[s], &want, &wl), 0);
            cr_expect_eq(q[s].pick, want, "row %d: the backend drew %d, the host form %d", s, q[s].pick, want);
            cr_expect_eq(got[s].id, want);
            cr_expect_eq(got[s].logprob, wl.logprob, "row %d: the drawn token's logprob", s);
            cr_assert_eq(got[s].n_top, s ? 20 : 3);
            for (int j = 0; j < got[s].n_top; j++)
                cr_expect(got[s].top_ids[j] == wl.top_ids[j] && got[s].top_logprobs[j] == wl.top_logprobs[j],
                          "row %d: top %d", s, j);
            free(l);
        }
        cr_expect_eq(q[1].pick, sampler_argmax(alone + V, V), "greedy pick between two draws");
        forward_free(&f);
    }
    free(alone);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}
/* gpt-oss: sliding-window layers (window 4, shorter than every prompt here but one), sinks,
 * biases and the clamped SwiGLU; MXFP4 experts as its released files have them */
Test(batch, gptoss_f16_batched_equals_alone) { check_preset("gpt-oss", -1); }
/* and its caches on the CPU as any model's: f16, paged, both (the sink attention reads them) */
Test(batch, gptoss_f16_paged_batched_equals_alone) { check_preset_paged("gpt-oss", -1, KV_F32, 16); }
Test(batch, gptoss_f16_kv_f16_batched_equals_alone) { check_preset_kv("gpt-oss", -1, KV_F16); }
Test(batch, gptoss_mxfp4_kv_f16_paged_batched_equals_alone) { check_preset_paged("gpt-oss", GGML_TYPE_MXFP4, KV_F16, 16); }
Test(batch, gptoss_mxfp4_batched_equals_alone) { check_preset("gpt-oss", GGML_TYPE_MXFP4); }
/* beside a device whose sink attention reads a slot's f32 rows in one piece, gpt-oss keeps one
 * block a slot and says why; beside a CUDA device (whose sink kernel reads f16 and paged rows)
 * it pages and takes f16 unless TIDE_CUDA_PAGED=0 */
Test(batch, gptoss_pages_only_where_every_device_sink_attention_can)
{
    char path[96];
    struct model m;
    test_model_load(&m, path, sizeof path, "batch-why", "gpt-oss", -1, 5);
    struct backend cpu;
    cr_assert_eq(backend_cpu_init(&cpu, 1), 0);
    struct backend_i f32_sinks = *cpu.i;
    f32_sinks.attention_sinks_any_cache = false;
    struct backend be[2] = {cpu, {&f32_sinks, cpu.ctx}};
    cr_assert_null(forward_kv_paged_why(&m, be, 1), "the CPU pages gpt-oss");
    const char *why = forward_kv_paged_why(&m, be, 2);
    cr_assert(why && strstr(why, "sink"), "%s", why ? why : "(null)");
    struct backend_i cuda_like = *cpu.i;
    cuda_like.name = "cuda";
    struct backend bc[2] = {cpu, {&cuda_like, cpu.ctx}};
    int old = forward_set_cuda_paged(1);
    cr_assert_null(forward_kv_paged_why(&m, bc, 2), "a CUDA device's sink attention pages gpt-oss");
    cr_assert_null(forward_kv_f16_why(&m, bc, 2), "and reads f16 rows");
    forward_set_cuda_paged(0);
    why = forward_kv_f16_why(&m, bc, 2);
    cr_assert(why && strstr(why, "TIDE_CUDA_PAGED=0"), "%s", why ? why : "(null)");
    cr_assert_not_null(forward_kv_paged_why(&m, bc, 2));
    forward_set_cuda_paged(old);
    backend_cpu_free(&cpu);
    model_free(&m);
    unlink(path);
}

/* A CUDA device pages its KV cache unless TIDE_CUDA_PAGED=0 (forward_set_cuda_paged), and the
 * reason names the switch when it is off. */
Test(batch, cuda_pages_unless_switched_off)
{
    struct model m;
    memset(&m, 0, sizeof m); /* llama, no layers: nothing in the model keeps it from paging */
    struct backend cpu;
    cr_assert_eq(backend_cpu_init(&cpu, 1), 0);
    struct backend_i cuda_like = *cpu.i; /* a backend named "cuda" with attention_paged */
    cuda_like.name = "cuda";
    struct backend be[2] = {cpu, {&cuda_like, cpu.ctx}};
    int old = forward_set_cuda_paged(0);
    cr_assert_null(forward_kv_paged_why(&m, be, 1), "the CPU pages");
    const char *why = forward_kv_paged_why(&m, be, 2);
    cr_assert(why && strstr(why, "TIDE_CUDA_PAGED=0"), "%s", why ? why : "(null)");
    forward_set_cuda_paged(1);
    cr_assert_null(forward_kv_paged_why(&m, be, 2), "with the switch on CUDA pages too");
    cuda_like.attention_paged = NULL;
    cr_assert_not_null(forward_kv_paged_why(&m, be, 2), "not without the op");
    forward_set_cuda_paged(old);
    backend_cpu_free(&cpu);
}
