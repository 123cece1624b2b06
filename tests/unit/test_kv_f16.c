/* test_kv_f16.c - the f16 KV cache on the CPU backend: the rounding every backend stores
 * (nearest, ties to even, F16C and the portable form alike); the f16 attention against a
 * double-precision reference, bit for bit the f32 attention over the widened rows, on any
 * thread count and decoded alone; and a model's logits with an f16 cache near its f32 ones. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/cpu_f16.h"
#include "engine/forward.h"
#include "engine/modelgen.h"
#include "ref_attention.h"
#include "test_model.h"
#define TEST_RAND_SEED 0x2545f4914f6cdd1dULL
#include "test_rand.h"

static float bits_f(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

Test(kv_f16, rounding_is_nearest_even_and_the_same_in_both_forms)
{
    struct { float f; uint16_t h; } known[] = {
        {1.0f, 0x3c00},          {-2.0f, 0xc000},           {65504.0f, 0x7bff},       {65519.99f, 0x7bff},
        {65520.0f, 0x7c00},      {1e9f, 0x7c00},            {-INFINITY, 0xfc00},      {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},      {0x1.8p-24f, 0x0002},      {0x1p-14f, 0x0400},       {0x1.ffcp-15f, 0x0400},
        {1.0f + 0x1p-11f, 0x3c00}, /* a tie: to the even 1.0 */
        {1.0f + 0x3p-11f, 0x3c02}, /* a tie: to the even 1 + 2^-9 */
        {-0.0f, 0x8000},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint16_t h;
        cpu_f16_from_f32(&h, &known[i].f, 1);
        cr_assert_eq(cpu_f16_round(known[i].f), known[i].h, "%a: 0x%04x, want 0x%04x", known[i].f,
                     cpu_f16_round(known[i].f), known[i].h);
        cr_assert_eq(h, known[i].h, "%a (fast form): 0x%04x, want 0x%04x", known[i].f, h, known[i].h);
    }
    uint16_t nan;
    cpu_f16_from_f32(&nan, &(float){NAN}, 1);
    cr_assert(isnan(cpu_f16_widen(nan)) && isnan(cpu_f16_widen(cpu_f16_round(NAN))));
    /* random bit patterns (every exponent) in batches of 8 and tails: both forms agree, and
     * the result is a nearest f16 */
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N), *w = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++)
        x[i] = i % 3 ? bits_f((uint32_t)(test_rand_next() >> 32)) : frand() * 70000.0f;
    cpu_f16_from_f32(h, x, N - 3);
    h[N - 3] = cpu_f16_round(x[N - 3]), h[N - 2] = cpu_f16_round(x[N - 2]), h[N - 1] = cpu_f16_round(x[N - 1]);
    cpu_f16_to_f32(w, h, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(h[i], cpu_f16_round(x[i]), "%a: fast 0x%04x portable 0x%04x", x[i], h[i], cpu_f16_round(x[i]));
        cr_assert(memcmp(&w[i], &(float){cpu_f16_widen(h[i])}, 4) == 0 || isnan(w[i]), "widen 0x%04x", h[i]);
        if (isnan(x[i]) || fabsf(x[i]) >= 65520.0f)
            continue;
        /* no other f16 is nearer: the neighbours one step away are not */
        uint16_t up = (uint16_t)(h[i] + 1), dn = (uint16_t)(h[i] - 1);
        double e = fabs((double)w[i] - x[i]);
        if ((up & 0x7c00) != 0x7c00)
            cr_assert_leq(e, fabs((double)cpu_f16_widen(up) - x[i]), "%a -> 0x%04x", x[i], h[i]);
        if ((h[i] & 0x7fff) && (dn & 0x7c00) != 0x7c00)
            cr_assert_leq(e, fabs((double)cpu_f16_widen(dn) - x[i]), "%a -> 0x%04x", x[i], h[i]);
    }
    free(x);
    free(w);
    free(h);
}

static void check_attention(int H, int HKV, int HD, int pos, int n)
{
    int ctx = pos + n;
    size_t qd = (size_t)H * HD, kvd = (size_t)HKV * HD;
    float *q = malloc(sizeof(float) * n * qd), *k = malloc(sizeof(float) * ctx * kvd);
    float *v = malloc(sizeof(float) * ctx * kvd), *att = malloc(sizeof(float) * H * ctx);
    float *kw = malloc(sizeof(float) * ctx * kvd), *vw = malloc(sizeof(float) * ctx * kvd);
    uint16_t *kh = malloc(sizeof(uint16_t) * ctx * kvd), *vh = malloc(sizeof(uint16_t) * ctx * kvd);
    float *out[3], *alone = malloc(sizeof(float) * n * qd), *f32 = malloc(sizeof(float) * n * qd);
    for (size_t i = 0; i < n * qd; i++)
        q[i] = 3.0f * frand();
    for (size_t i = 0; i < ctx * kvd; i++)
        k[i] = 2.0f * frand(), v[i] = frand();
    for (int threads = 1; threads <= 3; threads++) {
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, threads), 0);
        cr_assert(be.i->store_f16 && be.i->attention_f16);
        if (threads == 1) { /* the rows as the forward stores them, and their exact widening */
            be.i->store_f16(be.ctx, kh, k, ctx * kvd);
            be.i->store_f16(be.ctx, vh, v, ctx * kvd);
            cpu_f16_to_f32(kw, kh, ctx * kvd);
            cpu_f16_to_f32(vw, vh, ctx * kvd);
            be.i->attention(be.ctx, q, kw, vw, f32, att, n, pos, H, HKV, HD);
        }
        out[threads - 1] = malloc(sizeof(float) * n * qd);
        be.i->attention_f16(be.ctx, q, kh, vh, out[threads - 1], att, n, pos, H, HKV, HD);
        if (threads == 2)
            for (int t = 0; t < n; t++)
                be.i->attention_f16(be.ctx, q + t * qd, kh, vh, alone + t * qd, att, 1, pos + t, H, HKV, HD);
        backend_cpu_free(&be);
    }
    cr_assert(memcmp(out[0], f32, sizeof(float) * n * qd) == 0, "hd %d: f16 differs from f32 over the widened rows",
              HD);
    cr_assert(memcmp(out[0], out[1], sizeof(float) * n * qd) == 0, "hd %d: 1 and 2 threads differ", HD);
    cr_assert(memcmp(out[0], out[2], sizeof(float) * n * qd) == 0, "hd %d: 1 and 3 threads differ", HD);
    cr_assert(memcmp(out[0], alone, sizeof(float) * n * qd) == 0, "hd %d: prefill differs from decode alone", HD);
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD; i += 5) {
                float got = out[1][((size_t)t * H + h) * HD + i];
                /* against the rows it read, as tight as the f32 attention's own test */
                double ref = ref_attention(q, kw, vw, t, h, i, H, HKV, HD, pos);
                cr_assert_leq(fabs(got - ref), 1e-5 + 1e-5 * fabs(ref), "hd %d token %d head %d [%d]: %g vs %g", HD,
                              t, h, i, got, ref);
                /* against the f32 rows before rounding: f16's 2^-11 relative step, through the
                 * softmax of scores up to ~|q||k| */
                double ref32 = ref_attention(q, k, v, t, h, i, H, HKV, HD, pos);
                worst = fmax(worst, fabs(got - ref32));
            }
    cr_log_info("hd %d: f16 rows vs the f32 rows before rounding: max |diff| %.3g", HD, worst);
    cr_assert_leq(worst, 4e-3, "hd %d: f16 rows moved an output by %g", HD, worst); /* measured 2.7e-4..4.9e-4 */
    for (int i = 0; i < 3; i++)
        free(out[i]);
    free(q), free(k), free(v), free(att), free(kw), free(vw), free(kh), free(vh), free(alone), free(f32);
}

Test(kv_f16, attention_matches_double_reference_and_f32_over_widened_rows)
{
    check_attention(8, 2, 64, 40, 24);  /* the register-unrolled head_dim */
    check_attention(4, 4, 96, 70, 9);   /* twelve 8-lane chunks: the general loop and its tail */
    check_attention(6, 3, 128, 3, 33);  /* prefill from near position 0 */
}

/* One prompt through a model with an f32 and with an f16 cache: the logits stay close. */
Test(kv_f16, logits_near_the_f32_cache)
{
    char path[96];
    struct model m;
    test_model_load(&m, path, sizeof path, "kvf16", "qwen3moe", -1, 11);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    cr_assert_null(forward_kv_f16_why(&m, &be, 1));
    uint32_t V = m.cfg.n_vocab;
    float *lg[2];
    int ids[48];
    for (int i = 0; i < 48; i++)
        ids[i] = (int)((5u * (unsigned)i + 2u) % V);
    for (int kv = 0; kv < 2; kv++) {
        struct forward_state f;
        struct forward_stage_spec sp = {.be = be, .l0 = 0, .l1 = m.cfg.n_layer, .kv_type = kv ? KV_F16 : KV_F32};
        cr_assert_eq(forward_init_stages(&f, &m, 64, 1, 16, &sp, 1), 0);
        cr_assert_eq(f.kv_f16, kv == 1);
        cr_assert_eq(forward_setup_prefill(&f, 0, PREFILL_OWN), 0);
        cr_assert_eq(forward_eval(&f, ids, 40, 0), 0); /* prefill in chunks of 16, */
        for (int t = 40; t < 48; t++)                  /* then decode steps */
            cr_assert_eq(forward_eval(&f, &ids[t], 1, t), 0);
        lg[kv] = malloc(sizeof(float) * V);
        memcpy(lg[kv], f.logits, sizeof(float) * V);
        forward_free(&f);
    }
    double worst = 0, scale = 0;
    for (uint32_t v = 0; v < V; v++) {
        worst = fmax(worst, fabs((double)lg[0][v] - lg[1][v]));
        scale = fmax(scale, fabs((double)lg[0][v]));
    }
    cr_log_info("qwen3moe logits, f16 vs f32 cache: max |diff| %.3g, largest |logit| %.3g", worst, scale);
    cr_assert_gt(worst, 0.0, "the f16 cache changed nothing: was it used?");
    cr_assert_leq(worst, 2e-3 * scale, "logits moved by %g (largest %g)", worst, scale); /* measured 2.8e-3 of 10.1 */
    free(lg[0]);
    free(lg[1]);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}

/* Models whose attention has no f16 form on a device keep f32, asked or not, and say why:
 * deepseek2's MLA anywhere, gpt-oss's sink attention on a backend whose attention_sinks reads f32
 * only (CUDA's; here a CPU twin that says so). On the CPU itself gpt-oss takes the f16 cache. */
Test(kv_f16, models_without_an_f16_attention_keep_f32)
{
    static const char *const presets[] = {"deepseek2", "gpt-oss", "gpt-oss"};
    static const char *const why[] = {"MLA", "sink", NULL};
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct backend_i f32_sinks = *be.i; /* a backend like CUDA's: sink attention over f32 rows only */
    f32_sinks.attention_sinks_any_cache = false;
    for (int i = 0; i < 3; i++) {
        char path[96];
        struct model m;
        test_model_load(&m, path, sizeof path, "kvf16", presets[i], -1, 3);
        struct backend b = be;
        if (i == 1)
            b.i = &f32_sinks;
        const char *w = forward_kv_f16_why(&m, &b, 1);
        if (why[i])
            cr_assert(w && strstr(w, why[i]), "%s: %s", presets[i], w ? w : "(null)");
        else
            cr_assert_null(w, "%s on the CPU: %s", presets[i], w);
        struct forward_state f;
        struct forward_stage_spec sp = {.be = b, .l0 = 0, .l1 = m.cfg.n_layer, .kv_type = KV_F16};
        cr_assert_eq(forward_init_stages(&f, &m, 64, 2, 16, &sp, 1), 0);
        cr_expect_eq(f.kv_f16, !why[i], "%s (case %d)", presets[i], i);
        cr_expect_eq(forward_kv_row_bytes(&f), forward_kv_bytes(&m, 1, why[i] ? KV_F32 : KV_F16), "%s (case %d): rows",
                     presets[i], i);
        forward_free(&f);
        model_free(&m);
        unlink(path);
    }
    backend_cpu_free(&be);
}
