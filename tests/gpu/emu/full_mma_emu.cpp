/* full_mma_emu.cpp - the vision encoder's f16 tensor-core attention (attn_full_mma_kernel<HD> of
 * src/engine/cuda/attention_full_mma.cuh, the real device code; TIDE_VISION_TC=1) run on the CPU:
 * the kernel was written without a GPU, and this is how its fragments, tiles, padding and online
 * softmax were checked (`make full-mma-emu`).
 *
 * g++ compiles attention_full_mma.cuh against the host stand-ins engine/cuda/common.cuh and
 * mma_16816.cuh here (threads, barriers, exchanged shuffles; the mma computed per lane from the
 * PTX fragment layouts, in double). The launch is cuda_attention_full_mma's (attention_full_mma.cu;
 * keep in step): grid (ceil(P / 64), n_head), 128 threads, A = n_head * head_dim, scale2 =
 * log2(e) / sqrt(head_dim) (72, not the padded 80). q, k, v, out are (P, A) as backend_i.attention_full
 * has them (backend.h; the CPU backend's cpu_attention_full reads the same layout), head h at
 * columns h * head_dim. Each case runs every CTA of the grid and compares with softmax(q k^T /
 * sqrt(head_dim)) v in double over the f16-rounded q, k, v (tide_f32_to_f16, as the kernel
 * rounds them): relative RMS over all outputs and the largest error over the largest output,
 * both under 1e-3 (the probabilities are rounded to f16 before P V, 2^-11 relative each; the
 * measured numbers are printed). Poison: the 64 rows past P of q, k and v are NaN (a key or
 * query row read past the end would show), out is a NaN pattern before the launch (every
 * output of rows < P must be written: no NaN may remain) and its 64 rows past P must keep the
 * pattern bit for bit (no store past the end); the kernel's static shared arrays (K's tile with
 * its padding to 80 for head 72, V^T's) are 0xff (NaN as f16) before every CTA (EMU_SHARED), so
 * a padding column not zeroed or a slot read before written turns the output NaN. Cases: head
 * 64, 72 and 80; P 1, 37, 64, 130 (partial query and key tiles, one tile, three) and 200 with
 * sharp scores (q scaled by 4, so the running max moves between key tiles and the rescale by
 * alpha matters); 3 heads (2 for the largest). What it cannot check: the real mma unit and its
 * rounding, shuffles, bank conflicts, speed (test-gpu's vision attention tests do). */
#include "emu_launch.h"
#include "engine/cuda/attention_full_mma.cuh"
#include <stdio.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double frand(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}
static double f16r(float x) { return tide_f16_to_f32(tide_f32_to_f16(x)); }

/* cuda_attention_full_mma's launch (attention_full_mma.cu), on the CPU */
template <int HD>
static void launch(const float *q, const float *k, const float *v, float *out, int P, int n_head)
{
    float scale2 = 1.4426950408889634f / sqrtf((float)HD);
    int A = n_head * HD;
    emu_dim grid = {(unsigned)((P + VA_ROWS - 1) / VA_ROWS), (unsigned)n_head, 1};
    emu_launch(grid, VA_THREADS, 0, [&] { attn_full_mma_kernel<HD>(q, k, v, out, P, A, scale2); });
}

static const uint32_t OUT_POISON = 0x7fabcdefu; /* a NaN */

template <int HD>
static bool run_case(int P, int n_head, double sharp)
{
    const int A = n_head * HD, R = P + 64; /* 64 poisoned rows past P */
    std::vector<float> q((size_t)R * A, NAN), k((size_t)R * A, NAN), v((size_t)R * A, NAN), out((size_t)R * A);
    for (size_t i = 0; i < (size_t)P * A; i++) {
        q[i] = (float)(frand() * 2.0 * sharp);
        k[i] = (float)(frand() * 2.0);
        v[i] = (float)frand();
    }
    for (float &o : out) memcpy(&o, &OUT_POISON, 4);
    launch<HD>(q.data(), k.data(), v.data(), out.data(), P, n_head);

    double se = 0, sr = 0, maxe = 0, maxr = 0;
    long unwritten = 0, past = 0;
    std::vector<double> s(P);
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < P; i++) {
            const float *qi = &q[(size_t)i * A + h * HD];
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < P; j++) {
                const float *kj = &k[(size_t)j * A + h * HD];
                double d = 0;
                for (int c = 0; c < HD; c++) d += f16r(qi[c]) * f16r(kj[c]);
                s[j] = d / sqrt((double)HD);
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < P; j++) sum += s[j] = exp(s[j] - mx);
            for (int c = 0; c < HD; c++) {
                double ref = 0;
                for (int j = 0; j < P; j++) ref += s[j] * f16r(v[(size_t)j * A + h * HD + c]);
                ref /= sum;
                float got = out[(size_t)i * A + h * HD + c];
                if (!isfinite(got)) {
                    unwritten++;
                    continue;
                }
                se += (got - ref) * (got - ref), sr += ref * ref;
                maxe = fmax(maxe, fabs(got - ref)), maxr = fmax(maxr, fabs(ref));
            }
        }
    for (size_t i = (size_t)P * A; i < out.size(); i++) past += memcmp(&out[i], &OUT_POISON, 4) != 0;
    double rms = sqrt(se / sr), rmax = maxe / maxr;
    bool ok = !unwritten && !past && rms < 1e-3 && rmax < 1e-3;
    printf("  head %2d  P %3d  heads %d  sharp %.0f: rel rms %.2e, max err / max %.2e  %s\n", HD, P, n_head, sharp,
           rms, rmax, ok ? "ok" : "FAIL");
    if (unwritten)
        printf("    %ld outputs of rows < P not written or not finite\n", unwritten);
    if (past)
        printf("    %ld outputs past row P written\n", past);
    return ok;
}

int main(void)
{
    int fails = 0;
    printf("full-mma-emu: attn_full_mma_kernel (TIDE_VISION_TC) on the CPU vs softmax attention in double\n");
    static const int Ps[] = {1, 37, 64, 130};
    for (int P : Ps) {
        fails += !run_case<64>(P, 3, 1);
        fails += !run_case<72>(P, 3, 1);
        fails += !run_case<80>(P, 3, 1);
    }
    fails += !run_case<64>(200, 2, 4);
    fails += !run_case<72>(200, 2, 4);
    fails += !run_case<80>(200, 2, 4);
    printf(fails ? "full-mma-emu: %d FAILED\n" : "full-mma-emu: all ok\n", fails);
    return fails != 0;
}
