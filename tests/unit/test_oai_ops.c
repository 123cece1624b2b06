/* test_oai_ops.c - gpt-oss's CPU ops (backend_cpu_oai.c, through the backend table) against
 * their definitions computed here in double: attention with sinks and a sliding window, the
 * clamped SwiGLU, rope with a frequency per pair and a magnitude. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "engine/cpu_f16.h"

#include <string.h>

static float val(int i) { return (float)sin(1.7 * i + 0.3) * 1.5f; }

/* n tokens at positions pos.. of h heads (hkv KV heads) of d; sinks per head (or NULL); window w
 * (0: none), against the definition in double. The shapes pick the CPU's paths: head_dim 64 with
 * an even GQA group runs two heads at once in AVX-512 (where the CPU has it), an odd group one
 * head on the 16-row score tiles, other multiples of 8 the AVX2 loop, the rest the portable one. */
static void check_attention_shape(const float *sinks, int window, int h_, int hkv, int d, int n, int pos)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    int ctx = pos + n;
    float *q = malloc(sizeof(float) * n * h_ * d), *k = malloc(sizeof(float) * ctx * hkv * d);
    float *v = malloc(sizeof(float) * ctx * hkv * d), *out = malloc(sizeof(float) * n * h_ * d);
    float *att = malloc(sizeof(float) * h_ * ctx);
    double *s = malloc(sizeof(double) * ctx);
    for (int i = 0; i < n * h_ * d; i++) q[i] = val(i) * (d > 16 ? 0.4f : 1.0f);
    for (int i = 0; i < ctx * hkv * d; i++) k[i] = val(1000 + i), v[i] = val(2000 + i);
    be.i->attention_sinks(be.ctx, q, k, v, false, NULL, 0, out, att, n, pos, h_, hkv, d, sinks, window);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < h_; h++) {
            int p = pos + t, kh = h / (h_ / hkv), j0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            double mx = sinks ? sinks[h] : -INFINITY, z = 0;
            for (int j = j0; j <= p; j++) {
                double dd = 0;
                for (int i = 0; i < d; i++) dd += (double)q[(t * h_ + h) * d + i] * k[(j * hkv + kh) * d + i];
                s[j] = dd / sqrt(d);
                mx = fmax(mx, s[j]);
            }
            for (int j = j0; j <= p; j++) z += exp(s[j] - mx);
            if (sinks) z += exp(sinks[h] - mx); /* the sink: in the denominator, no value row */
            for (int i = 0; i < d; i++) {
                double o = 0;
                for (int j = j0; j <= p; j++) o += exp(s[j] - mx) / z * v[(j * hkv + kh) * d + i];
                cr_assert(fabs(out[(t * h_ + h) * d + i] - o) < 1e-5, "d %d window %d t %d h %d i %d: %g want %g", d,
                          window, t, h, i, out[(t * h_ + h) * d + i], o);
            }
        }
    free(q); free(k); free(v); free(out); free(att); free(s);
    backend_cpu_free(&be);
}

/* 4 heads (2 KV heads) of 8, 5 tokens at positions 7.. */
static void check_attention(const float *sinks, int window) { check_attention_shape(sinks, window, 4, 2, 8, 5, 7); }

Test(oai_ops, attention_with_sinks_and_window) { check_attention((const float[]){0.5f, -1.0f, 2.0f, 3.5f}, 3); }
Test(oai_ops, attention_window_without_sinks) { check_attention(NULL, 4); }
Test(oai_ops, attention_sinks_full_context) { check_attention((const float[]){1.0f, 1.0f, -2.0f, 0.0f}, 0); }

/* gpt-oss's head_dim 64 on every path, a prefill of 3 tokens and a decode token, windows that
 * start inside a 16-row tile and cover several, and none */
Test(oai_ops, attention_sinks_head_dim_64_on_every_path)
{
    static const float sinks[8] = {0.5f, -1.0f, 2.0f, 3.5f, 0.0f, -4.0f, 1.25f, 6.0f};
    static const int shapes[][3] = {{8, 2, 64}, {6, 2, 64}, {4, 4, 64}, {4, 2, 24}, {4, 2, 12}}; /* heads, KV heads, d */
    static const int windows[] = {0, 1, 37, 128};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
            check_attention_shape(sinks, windows[w], shapes[i][0], shapes[i][1], shapes[i][2], 3, 70);
            check_attention_shape(sinks, windows[w], shapes[i][0], shapes[i][1], shapes[i][2], 1, 93);
            check_attention_shape(NULL, windows[w], shapes[i][0], shapes[i][1], shapes[i][2], 1, 93);
        }
}

Test(oai_ops, swiglu_oai_clamps)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    float g[6] = {-3.0f, 0.5f, 6.9f, 9.0f, 20.0f, -9.0f}, u[6] = {1.0f, -8.0f, 2.0f, 9.0f, -0.5f, 0.25f};
    float want[6];
    for (int i = 0; i < 6; i++) {
        double x = fmin(g[i], 7.0), y = fmax(-7.0, fmin(u[i], 7.0));
        want[i] = (float)(x / (1 + exp(-1.702 * x)) * (y + 1));
    }
    be.i->swiglu_oai(be.ctx, g, u, 6, 1.702f, 7.0f);
    for (int i = 0; i < 6; i++)
        cr_assert(fabsf(g[i] - want[i]) <= 1e-5f * fmaxf(1.0f, fabsf(want[i])), "%d: %g want %g", i, g[i], want[i]);
    backend_cpu_free(&be);
}

Test(oai_ops, rope_freqs_turns_neox_pairs_and_scales)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    enum { H = 2, D = 8, N = 3, POS = 5 };
    float x[N * H * D], y[N * H * D], f[D / 2] = {1.0f, 0.3f, 0.01f, 0.002f}, m = 1.35f;
    for (int i = 0; i < N * H * D; i++) x[i] = y[i] = val(i);
    be.i->rope_freqs(be.ctx, y, N, H, D, POS, f, m, ROPE_NEOX);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                const float *a = x + (t * H + h) * D;
                double th = (double)(POS + t) * f[i];
                double w0 = m * (a[i] * cos(th) - a[i + D / 2] * sin(th)), w1 = m * (a[i] * sin(th) + a[i + D / 2] * cos(th));
                cr_assert(fabs(y[(t * H + h) * D + i] - w0) < 1e-5 && fabs(y[(t * H + h) * D + i + D / 2] - w1) < 1e-5,
                          "t %d h %d pair %d", t, h, i);
            }
    backend_cpu_free(&be);
}

/* deepseek2's rope: NORM pairs (2i, 2i + 1) turned by the table's frequencies. */
Test(oai_ops, rope_freqs_turns_norm_pairs)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    enum { H = 2, D = 8, N = 3, POS = 5 };
    float x[N * H * D], y[N * H * D], f[D / 2] = {1.0f, 0.3f, 0.01f, 0.002f}, m = 0.8f;
    for (int i = 0; i < N * H * D; i++) x[i] = y[i] = val(i);
    be.i->rope_freqs(be.ctx, y, N, H, D, POS, f, m, ROPE_NORM);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                const float *a = x + (t * H + h) * D + 2 * i;
                const float *b = y + (t * H + h) * D + 2 * i;
                double th = (double)(POS + t) * f[i];
                double w0 = m * (a[0] * cos(th) - a[1] * sin(th)), w1 = m * (a[0] * sin(th) + a[1] * cos(th));
                cr_assert(fabs(b[0] - w0) < 1e-5 && fabs(b[1] - w1) < 1e-5, "t %d h %d pair %d", t, h, i);
            }
    backend_cpu_free(&be);
}

/* The f16 and paged caches (gpt-oss's slots when kv_type is f16 and kv_block_size pages them):
 * f16 rows give the bits of the f32 op over the same rows widened, and rows in blocks of 16
 * spread over a pool (a permuted table with gaps) the bits of the same rows one after another,
 * with sinks and windows, on each path of check_attention_shape's shapes and at MLA's width. */
Test(oai_ops, attention_sinks_f16_and_paged_caches_give_the_contiguous_f32_bits)
{
    static const float sinks[8] = {0.5f, -1.0f, 2.0f, 3.5f, 0.0f, -4.0f, 1.25f, 6.0f};
    /* heads, KV heads, d; 576: deepseek2's MLA rows, the widest head the op takes (its f16 rows
     * are widened into stack buffers of that size) */
    static const int shapes[][3] = {{8, 2, 64}, {6, 2, 64}, {4, 2, 24}, {4, 2, 12}, {2, 1, 576}};
    static const int calls[][3] = {{3, 70, 0}, {3, 70, 37}, {1, 93, 0}, {1, 93, 20}}; /* n, pos, window */
    enum { BR = 16, NB = 6, POOL = 11 };                                               /* rows a block, blocks, pool */
    static const int32_t table[NB] = {7, 2, 10, 0, 5, 8};
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int h_ = shapes[i][0], hkv = shapes[i][1], d = shapes[i][2], kvd = hkv * d, ctx = NB * BR;
        size_t qn = (size_t)3 * h_ * d;
        float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * ctx * kvd), *v = malloc(sizeof(float) * ctx * kvd);
        float *kp = calloc((size_t)POOL * BR * kvd, sizeof(float)), *vp = calloc((size_t)POOL * BR * kvd, sizeof(float));
        uint16_t *k16 = malloc(2 * (size_t)ctx * kvd), *v16 = malloc(2 * (size_t)ctx * kvd);
        uint16_t *kp16 = calloc((size_t)POOL * BR * kvd, 2), *vp16 = calloc((size_t)POOL * BR * kvd, 2);
        float *want = malloc(sizeof(float) * qn), *got = malloc(sizeof(float) * qn), *att = malloc(sizeof(float) * h_ * ctx);
        for (size_t j = 0; j < qn; j++) q[j] = val((int)j) * 0.4f;
        for (int j = 0; j < ctx * kvd; j++) k[j] = val(1000 + j), v[j] = val(2000 + j);
        cpu_f16_from_f32(k16, k, (size_t)ctx * kvd);
        cpu_f16_from_f32(v16, v, (size_t)ctx * kvd);
        for (int b = 0; b < NB; b++) { /* the sequence's block b is pool block table[b] */
            size_t to = (size_t)table[b] * BR * kvd, from = (size_t)b * BR * kvd, m = (size_t)BR * kvd;
            memcpy(kp + to, k + from, sizeof(float) * m);
            memcpy(vp + to, v + from, sizeof(float) * m);
            memcpy(kp16 + to, k16 + from, 2 * m);
            memcpy(vp16 + to, v16 + from, 2 * m);
        }
        float *kw = malloc(sizeof(float) * ctx * kvd), *vw = malloc(sizeof(float) * ctx * kvd); /* f16, widened */
        cpu_f16_to_f32(kw, k16, (size_t)ctx * kvd);
        cpu_f16_to_f32(vw, v16, (size_t)ctx * kvd);
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            int n = calls[c][0], pos = calls[c][1], w = calls[c][2];
            size_t on = (size_t)n * h_ * d;
            be.i->attention_sinks(be.ctx, q, k, v, false, NULL, 0, want, att, n, pos, h_, hkv, d, sinks, w);
            be.i->attention_sinks(be.ctx, q, kp, vp, false, table, BR, got, att, n, pos, h_, hkv, d, sinks, w);
            cr_assert_arr_eq(got, want, sizeof(float) * on, "f32 paged, heads %d/%d d %d n %d window %d", h_, hkv, d, n, w);
            be.i->attention_sinks(be.ctx, q, kw, vw, false, NULL, 0, want, att, n, pos, h_, hkv, d, sinks, w);
            be.i->attention_sinks(be.ctx, q, k16, v16, true, NULL, 0, got, att, n, pos, h_, hkv, d, sinks, w);
            cr_assert_arr_eq(got, want, sizeof(float) * on, "f16, heads %d/%d d %d n %d window %d", h_, hkv, d, n, w);
            be.i->attention_sinks(be.ctx, q, kp16, vp16, true, table, BR, got, att, n, pos, h_, hkv, d, sinks, w);
            cr_assert_arr_eq(got, want, sizeof(float) * on, "f16 paged, heads %d/%d d %d n %d window %d", h_, hkv, d, n, w);
        }
        free(q); free(k); free(v); free(kp); free(vp); free(k16); free(v16); free(kp16); free(vp16);
        free(want); free(got); free(att); free(kw); free(vw);
    }
    backend_cpu_free(&be);
}

/* A long window spreads the heads over the threads: the same bits as one thread (each head is
 * computed whole by one thread either way), and a prefill's tokens the bits each gets decoded
 * alone at its position. */
Test(oai_ops, attention_sinks_threads_same_bits)
{
    enum { H = 8, HKV = 2, D = 64, CTX = 100, N = 2, POS = 90 };
    static float q[N * H * D], k[CTX * HKV * D], v[CTX * HKV * D], o1[N * H * D], o2[N * H * D], att[H * CTX];
    float sinks[H];
    for (int i = 0; i < N * H * D; i++) q[i] = val(i) * 0.3f;
    for (int i = 0; i < CTX * HKV * D; i++) k[i] = val(5000 + i) * 0.3f, v[i] = val(9000 + i);
    for (int h = 0; h < H; h++) sinks[h] = val(77 + h);
    struct backend b1, b2;
    cr_assert_eq(backend_cpu_init(&b1, 1), 0);
    cr_assert_eq(backend_cpu_init(&b2, 2), 0);
    for (int window = 0; window <= 80; window += 80) {
        b1.i->attention_sinks(b1.ctx, q, k, v, false, NULL, 0, o1, att, N, POS, H, HKV, D, sinks, window);
        b2.i->attention_sinks(b2.ctx, q, k, v, false, NULL, 0, o2, att, N, POS, H, HKV, D, sinks, window);
        cr_assert_arr_eq(o1, o2, sizeof o1, "window %d", window);
        for (int t = 0; t < N; t++) {
            float one[H * D];
            b2.i->attention_sinks(b2.ctx, q + t * H * D, k, v, false, NULL, 0, one, att, 1, POS + t, H, HKV, D, sinks, window);
            cr_assert_arr_eq(one, o1 + t * H * D, sizeof one, "window %d token %d alone", window, t);
        }
    }
    backend_cpu_free(&b1);
    backend_cpu_free(&b2);
}

/* No sinks and no window is the plain causal attention: forward_mla.c takes it for MLA rows wider
 * than 256 (V2-Lite's one KV head of 576, its V the K rows). */
Test(oai_ops, attention_sinks_without_sinks_or_window_is_the_attention)
{
    enum { H = 4, HKV = 1, D = 576, CTX = 40, N = 3, POS = 37 };
    static float q[N * H * D], k[CTX * HKV * D], o1[N * H * D], o2[N * H * D], att[H * CTX];
    for (int i = 0; i < N * H * D; i++) q[i] = val(i) * 0.05f;
    for (int i = 0; i < CTX * HKV * D; i++) k[i] = val(3000 + i);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    be.i->attention(be.ctx, q, k, k, o1, att, N, POS, H, HKV, D);
    be.i->attention_sinks(be.ctx, q, k, k, false, NULL, 0, o2, att, N, POS, H, HKV, D, NULL, 0);
    for (int i = 0; i < N * H * D; i++)
        cr_assert(fabsf(o1[i] - o2[i]) <= 1e-5f * fmaxf(1.0f, fabsf(o1[i])), "%d: %g vs %g", i, o2[i], o1[i]);
    backend_cpu_free(&be);
}
