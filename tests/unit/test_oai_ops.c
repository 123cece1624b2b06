/* test_oai_ops.c - gpt-oss's CPU ops (backend_cpu_oai.c, through the backend table) against
 * their definitions computed here in double: attention with sinks and a sliding window, the
 * clamped SwiGLU, rope with a frequency per pair and a magnitude. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "engine/backend.h"

static float val(int i) { return (float)sin(1.7 * i + 0.3) * 1.5f; }

/* n tokens at positions pos.. of 4 heads (2 KV heads) of 8; sinks per head; window w. */
static void check_attention(const float *sinks, int window)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    enum { H = 4, HKV = 2, D = 8, CTX = 12, N = 5, POS = 7 };
    float q[N * H * D], k[CTX * HKV * D], v[CTX * HKV * D], out[N * H * D], att[H * CTX];
    for (int i = 0; i < N * H * D; i++) q[i] = val(i);
    for (int i = 0; i < CTX * HKV * D; i++) k[i] = val(1000 + i), v[i] = val(2000 + i);
    be.i->attention_sinks(be.ctx, q, k, v, out, att, N, POS, H, HKV, D, sinks, window);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            int p = POS + t, kh = h / (H / HKV), j0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            double s[CTX], mx = sinks ? sinks[h] : -INFINITY, z = 0;
            for (int j = j0; j <= p; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)q[(t * H + h) * D + i] * k[(j * HKV + kh) * D + i];
                s[j] = d / sqrt(D);
                mx = fmax(mx, s[j]);
            }
            for (int j = j0; j <= p; j++) z += exp(s[j] - mx);
            if (sinks) z += exp(sinks[h] - mx); /* the sink: in the denominator, no value row */
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int j = j0; j <= p; j++) o += exp(s[j] - mx) / z * v[(j * HKV + kh) * D + i];
                cr_assert(fabs(out[(t * H + h) * D + i] - o) < 1e-5, "t %d h %d i %d: %g want %g", t, h, i,
                          out[(t * H + h) * D + i], o);
            }
        }
    backend_cpu_free(&be);
}

Test(oai_ops, attention_with_sinks_and_window) { check_attention((const float[]){0.5f, -1.0f, 2.0f, 3.5f}, 3); }
Test(oai_ops, attention_window_without_sinks) { check_attention(NULL, 4); }
Test(oai_ops, attention_sinks_full_context) { check_attention((const float[]){1.0f, 1.0f, -2.0f, 0.0f}, 0); }

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
    be.i->rope_freqs(be.ctx, y, N, H, D, POS, f, m);
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
