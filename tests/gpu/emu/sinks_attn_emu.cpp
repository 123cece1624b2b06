/* sinks_attn_emu.cpp - gpt-oss's sink and sliding-window attention (attention_sinks_kernel<T,
 * PAGED> of src/engine/cuda/attention_sinks.cuh, the real device code, with attention.cuh's
 * kv_page_row) run on the CPU: its f16 and paged forms were written without a GPU, and this is how
 * they were checked (`make sinks-attn-emu`).
 *
 * Each case fills a contiguous cache and a block pool with the same rows (the pool's blocks at
 * scrambled places, the unused blocks and the rows past the last key NaN, so a row read through a
 * wrong table entry or past the window shows), runs every CTA of oai_ops.cu's launch (the same
 * grid, threads and dynamic shared memory: keep in step with sinks_launch) over both, and checks:
 * the paged output is bit for bit the contiguous one (the same arithmetic over the same rows), no
 * output is NaN, and both are within float rounding (< 2e-5 of the largest output) of attention
 * in double with the sink's logit in the softmax's denominator and the window's first row where
 * the kernel's contract (backend.h, attention_sinks) says. Cases: gpt-oss's heads (64 of 64, 8 KV
 * heads) with its 128-row window and without, a window of 1, sinks off, a prefill chunk of
 * several tokens, f32 and f16, block_rows 16 and 64, and deepseek2's 576-wide MLA rows (no sink,
 * no window). What it cannot check: speed, and the real shuffles (test-gpu's attention_sinks
 * tests do). */
#include "emu_launch.h"
#include "engine/cuda/attention_sinks.cuh"
#include "ref_attention.h"
#include <stdio.h>

/* oai_ops.cu's sinks_launch without the context */
template <typename T, bool PAGED>
static void launch(const float *q, const T *k, const T *v, float *out, int n, int pos, int n_head, int n_head_kv,
                   int hd, const float *sinks, int window, const int32_t *tab, int shift)
{
    unsigned grid = (unsigned)(((size_t)n * n_head + SINK_WARPS - 1) / SINK_WARPS);
    size_t sm = sizeof(float) * SINK_WARPS * (size_t)hd;
    emu_launch({grid, 1, 1}, SINK_WARPS * 32, sm, [&] {
        attention_sinks_kernel<T, PAGED>(q, k, v, out, n, pos, n_head, n_head_kv, hd, sinks, window, tab, shift);
    });
}

/* n query tokens at positions pos..pos+n-1 over pos+n cached rows */
template <typename T>
static int test(const char *what, int n, int pos, int n_head, int n_head_kv, int hd, bool with_sinks, int window,
                int block_rows)
{
    int shift = 0;
    while ((1 << shift) < block_rows) shift++;
    int ctx = pos + n, nbs = (ctx + block_rows - 1) / block_rows, pool_blocks = nbs + 4;
    size_t kvd = (size_t)n_head_kv * hd, qd = (size_t)n_head * hd, bsz = (size_t)block_rows * kvd;
    T nan = to_cache<T>(NAN);
    T *kp = alloc<T>(pool_blocks * bsz), *vp = alloc<T>(pool_blocks * bsz);
    T *kc = alloc<T>((size_t)nbs * bsz), *vc = alloc<T>((size_t)nbs * bsz);
    for (size_t i = 0; i < pool_blocks * bsz; i++) kp[i] = vp[i] = nan;
    for (size_t i = 0; i < nbs * bsz; i++) kc[i] = vc[i] = nan; /* rows past ctx: never read */
    std::vector<int32_t> perm(pool_blocks);
    for (int i = 0; i < pool_blocks; i++) perm[i] = i;
    for (int i = pool_blocks - 1; i > 0; i--) std::swap(perm[i], perm[rnd(i + 1)]);
    std::vector<int32_t> tab(perm.begin(), perm.begin() + nbs);
    for (int p = 0; p < ctx; p++)
        for (size_t i = 0; i < kvd; i++) {
            T kv = to_cache<T>((float)(frand() * (rnd(97) == 3 ? 3.0 : 1.0))), vv = to_cache<T>((float)frand());
            kc[p * kvd + i] = kv;
            vc[p * kvd + i] = vv;
            size_t pr = ((size_t)tab[p >> shift] << shift) | (size_t)(p & (block_rows - 1));
            kp[pr * kvd + i] = kv;
            vp[pr * kvd + i] = vv;
        }
    float *q = alloc<float>(n * qd), *oc = alloc<float>(n * qd), *op = alloc<float>(n * qd);
    std::vector<float> sinks(n_head);
    for (size_t i = 0; i < n * qd; i++) q[i] = (float)frand() * 2.0f;
    for (int h = 0; h < n_head; h++) sinks[h] = (float)frand() * 4.0f; /* some above the scores' max */
    for (size_t i = 0; i < n * qd; i++) oc[i] = op[i] = NAN;
    const float *sk = with_sinks ? sinks.data() : NULL;
    launch<T, false>(q, kc, vc, oc, n, pos, n_head, n_head_kv, hd, sk, window, NULL, 0);
    launch<T, true>(q, kp, vp, op, n, pos, n_head, n_head_kv, hd, sk, window, tab.data(), shift);
    long diff = 0, nanc = 0;
    double maxerr = 0, maxref = 0, scale = 1.0 / sqrt((double)hd);
    int group = n_head / n_head_kv;
    for (int t = 0; t < n; t++) {
        int p = pos + t, t0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + t * qd + (size_t)h * hd;
            size_t kh = (size_t)(h / group) * hd;
            std::vector<double> s(p + 1);
            double m = with_sinks ? sinks[h] : -INFINITY, l = 0;
            for (int r = t0; r <= p; r++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * from_cache(kc[r * kvd + kh + i]);
                m = fmax(m, s[r] = d * scale);
            }
            if (with_sinks) l = exp(sinks[h] - m);
            for (int r = t0; r <= p; r++) l += s[r] = exp(s[r] - m);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int r = t0; r <= p; r++) o += s[r] * from_cache(vc[r * kvd + kh + i]);
                o /= l;
                size_t at = t * qd + (size_t)h * hd + i;
                diff += memcmp(&oc[at], &op[at], 4) != 0;
                if (std::isnan(op[at]) || std::isnan(oc[at])) { nanc++; continue; }
                maxerr = fmax(maxerr, fmax(fabs(oc[at] - o), fabs(op[at] - o)));
                maxref = fmax(maxref, fabs(o));
            }
        }
    }
    double rel = maxerr / maxref;
    bool ok = diff == 0 && nanc == 0 && rel < 2e-5;
    printf("%-24s %s n %2d pos %4d heads %2d/%d hd %3d %s window %3d block %2d: paged vs contiguous differing %ld, "
           "NaN %ld, vs double %.2g  %s\n", what, sizeof(T) == 2 ? "f16" : "f32", n, pos, n_head, n_head_kv, hd,
           with_sinks ? "sinks" : "     ", window, block_rows, diff, nanc, rel, ok ? "ok" : "BAD");
    fflush(stdout);
    free(kp); free(vp); free(kc); free(vc); free(q); free(oc); free(op);
    return ok ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    bad += test<float>("gpt-oss decode, window", 1, 300, 64, 8, 64, true, 128, 16);
    bad += test<__half>("gpt-oss decode, window", 1, 300, 64, 8, 64, true, 128, 16);
    bad += test<__half>("gpt-oss decode, full", 1, 200, 64, 8, 64, true, 0, 64);
    bad += test<__half>("prefill chunk, window", 9, 40, 8, 2, 64, true, 37, 16);
    bad += test<float>("window of 1", 3, 50, 4, 2, 64, true, 1, 16);
    bad += test<__half>("no sinks, window", 5, 70, 4, 2, 32, false, 3, 16);
    bad += test<__half>("first rows, sinks", 4, 0, 4, 1, 128, true, 0, 16);
    bad += test<float>("MLA rows (576)", 2, 77, 4, 1, 576, false, 0, 16);
    bad += test<__half>("MLA rows (576)", 1, 40, 2, 1, 576, false, 0, 64);
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}
