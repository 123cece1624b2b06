/* kq_tile_emu.cpp - the k-quant tensor-core tiles (src/engine/cuda/mma_kq_tile.cuh, the real
 * file) run on the CPU: no GPU was there when they were written, and this is how their
 * arithmetic was checked (`make kq-tile-emu`, part of `make test`).
 *
 * g++ compiles mma_kq_tile.cuh against the host shims in this directory (engine/cuda/: threads
 * for CUDA threads, memory exchanges for the warps' MMAs, see mma_tile.cuh here), inside a copy
 * of mmq_kquant.cu's kq_mma_kernel (its epilogue without the add). Each case quantises W with
 * tide's own quantiser and x as quantize_q8_kernel<true> does (f16-rounded scale, fragment word
 * order), runs every CTA of the grid and every K slice, adds the slices, and compares with the
 * dequantised W (gguf.c) dotted in double with x as the tiles see it: the relative error must be
 * float rounding (< 1e-5). Cases: each type, each tile width, row and token tails, split-K, K of
 * one super-block, and q6_K rows only 2-byte aligned (630-byte rows at a 2-byte offset). What it
 * cannot check: the real MMA unit, cp.async, bank conflicts and speed (test-gpu does). */
#include "engine/cuda/mma_kq_tile.cuh"
#include <thread>
#include <vector>
#include <stdio.h>
#include <stdlib.h>

thread_local emu_idx threadIdx;
std::barrier<> *emu_cta_bar;
emu_warp *emu_warps;
struct dim3i { int x, y, z; };
static dim3i bidx;

template <int T, int BN>
static void kernel_thread(const uint8_t *W, size_t row_bytes, int rows, int nb, const int8_t *xq, const float *xd,
                          const float *xs, int n, int kps, float *out, kqt_smem<T, BN> &sm)
{
    int n0 = bidx.x * BN, m0 = bidx.y * TILE_BM;
    for (int rr = threadIdx.x; rr < TILE_BM; rr += TILE_THREADS)
        sm.wrow[rr] = m0 + rr < rows ? W + (size_t)(m0 + rr) * row_bytes : nullptr;
    for (int c = threadIdx.x; c < BN; c += TILE_THREADS)
        sm.xrow[c] = n0 + c < n ? n0 + c : -1;
    __syncthreads();
    int kt0 = bidx.z * kps;
    tile_acc<BN> acc;
    kqt_mainloop<T, BN>(sm, nb, xq, xd, xs, kt0, min(kps, nb / KQT_KB - kt0), acc);
    float *y = out + (size_t)bidx.z * n * rows;
    for (int i = 0; i < tile_acc<BN>::MI; i++)
        for (int j = 0; j < tile_acc<BN>::NJ; j++)
            for (int e = 0; e < 4; e++) {
                int r = m0 + tile_row(i, e), tk = n0 + tile_col<BN>(j, e);
                if (r < rows && tk < n)
                    y[(size_t)tk * rows + r] = acc.v[i][j][e];
            }
}

template <int T, int BN>
static void run(const uint8_t *W, size_t row_bytes, int rows, int nb, const int8_t *xq, const float *xd,
                const float *xs, int n, int kps, int splits, float *out)
{
    auto *sm = (kqt_smem<T, BN> *)aligned_alloc(64, (sizeof(kqt_smem<T, BN>) + 63) & ~(size_t)63);
    memset((void *)sm, 0xAB, sizeof *sm);
    std::barrier<> cta(TILE_THREADS);
    emu_cta_bar = &cta;
    std::vector<emu_warp> warps(8);
    for (int w = 0; w < 8; w++) warps[w].bar = new std::barrier<>(32);
    emu_warps = warps.data();
    for (int z = 0; z < splits; z++)
        for (int y = 0; y < (rows + TILE_BM - 1) / TILE_BM; y++)
            for (int x = 0; x < (n + BN - 1) / BN; x++) {
                bidx = {x, y, z};
                std::vector<std::thread> th;
                for (int t = 0; t < TILE_THREADS; t++)
                    th.emplace_back([&, t] { threadIdx.x = t; kernel_thread<T, BN>(W, row_bytes, rows, nb, xq, xd, xs, n, kps, out, *sm); });
                for (auto &h : th) h.join();
            }
    for (int w = 0; w < 8; w++) delete warps[w].bar;
    free(sm);
}

static uint64_t rs = 88172645463325252ull;
static float frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

template <int T, int BN>
static int test(int cols, int rows, int n, int splits, size_t off)
{
    int nb = cols / 32;
    size_t rb = ggml_row_size(T, cols);
    std::vector<float> wf((size_t)rows * cols), wd((size_t)rows * cols), x((size_t)n * cols), xv((size_t)n * cols);
    for (auto &v : wf) v = frand() * 0.05f;
    /* a few large values, so that q4_K's mins and q6_K's negative scales show up */
    for (int i = 0; i < rows * cols / 97; i++) {
        frand();
        wf[(size_t)(rs % wf.size())] = frand();
    }
    std::vector<uint8_t> wbuf(rb * rows + 16);
    uint8_t *W = wbuf.data() + off; /* the vector's data is 16-byte aligned; off shifts it */
    for (int r = 0; r < rows; r++) {
        ggml_quantize(T, wf.data() + (size_t)r * cols, W + r * rb, cols);
        ggml_dequantize(T, W + r * rb, wd.data() + (size_t)r * cols, cols);
    }
    for (auto &v : x) v = frand();
    std::vector<int8_t> xq((size_t)n * cols);
    std::vector<float> xd((size_t)n * nb), xs((size_t)n * nb);
    for (int b = 0; b < n * nb; b++) { /* quantize_q8_kernel<true> */
        float amax = 0;
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[b * 32 + l]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        float ds = tide_f16_to_f32(tide_f32_to_f16(d));
        int sum = 0;
        for (int l = 0; l < 32; l++) {
            int q = (int)rintf(x[b * 32 + l] * id), w = l >> 2, pos = (w < 4 ? 2 * w : 2 * w - 7) * 4 + (l & 3);
            xq[(size_t)b * 32 + pos] = (int8_t)q;
            xv[(size_t)b * 32 + l] = (float)q * ds;
            sum += q;
        }
        xd[b] = ds;
        xs[b] = ds * (float)sum;
    }
    int nkt = nb / 8, kps = (nkt + splits - 1) / splits;
    splits = (nkt + kps - 1) / kps;
    std::vector<float> out((size_t)splits * n * rows, NAN), y((size_t)n * rows);
    run<T, BN>(W, rb, rows, nb, xq.data(), xd.data(), xs.data(), n, kps, splits, out.data());
    double e2 = 0, r2 = 0;
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0;
            for (int c = 0; c < cols; c++) ref += (double)wd[(size_t)r * cols + c] * xv[(size_t)t * cols + c];
            float s = 0;
            for (int z = 0; z < splits; z++) s += out[(size_t)z * n * rows + (size_t)t * rows + r];
            if (!(fabs(s - ref) < 1e30)) bad++;
            e2 += (s - ref) * (s - ref), r2 += ref * ref;
        }
    double e = sqrt(e2 / r2);
    printf("type %d BN %d cols %d rows %d n %d splits %d off %zu: rel err %.3g%s\n", T, BN, cols, rows, n, splits, off, e,
           bad ? " NON-FINITE" : "");
    return e < 1e-5 && !bad;
}

int main()
{
    int ok = 1;
    ok &= test<KQ_Q4_K, 16>(512, 130, 20, 1, 0);
    ok &= test<KQ_Q4_K, 64>(768, 128, 64, 1, 0);
    ok &= test<KQ_Q4_K, 32>(256, 70, 3, 1, 0);   /* one super-block; mostly padding */
    ok &= test<KQ_Q5_K, 32>(512, 128, 33, 2, 0);
    ok &= test<KQ_Q5_K, 64>(1024, 200, 70, 2, 8);
    ok &= test<KQ_Q6_K, 64>(768, 140, 40, 1, 2); /* 630-byte rows at a 2-byte offset */
    ok &= test<KQ_Q6_K, 16>(1024, 128, 16, 2, 0);
    ok &= test<KQ_Q6_K, 32>(768, 129, 17, 1, 6);
    printf("%s\n", ok ? "ALL OK" : "FAILED");
    return !ok;
}
