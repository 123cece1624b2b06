/* kq_tile_emu.cpp - the device code of the k-quant tensor-core product (TIDE_KQ_MMA=1) run on
 * the CPU: mmq.cuh's quantize_q8_kernel<true>, and kq_mma_kernel.cuh's kq_xsum_kernel,
 * kq_mma_kernel (around mma_kq_tile.cuh's kqt_mainloop) and kq_reduce_kernel, the real files.
 * No GPU was there when they were written, and this is how they were checked (`make
 * kq-tile-emu`, part of `make test`).
 *
 * g++ compiles them against the host stand-ins engine/cuda/common.cuh and mma_q.cuh here
 * (threads for CUDA threads, barriers, exchanged shuffles; the MMAs exchanged through a warp's
 * slots and computed from the PTX fragment layouts; cp.async landing as late as
 * cp.async.wait_group allows, or at once) and runs every CTA of each launch (emu_launch.h).
 * The launches are cuda_kq_mma_matmul's, in its order, with its grids and arguments (copied
 * below: keep in step with mmq_kquant.cu): x quantised, the mins' block sums (not for q6_K),
 * the tile kernel into y (add: y += the tile) or, split-K, into the (slice, n, rows) partials,
 * then the fixed-order reduce into y (with add). Each case quantises W with tide's own
 * quantiser and checks:
 *   - xq, xd and xs bit for bit what quantize_q8_kernel<true> and the block sums must be
 *     (computed here on the host: f16-rounded scale, fragment word order);
 *   - y against the dequantised W (gguf.c) dotted in double with x as the tiles see it: the
 *     relative error must be float rounding (< 1e-5); with split-K each slice too, against its
 *     own super-blocks (so the slices sit where the reduce reads them, each with its K range);
 *   - every output written (y and the partials start NaN), nothing written around them (guard
 *     words), no CTA ending with a copy in flight;
 *   - the add form (y starts random y0; cp.async landing late) bit for bit y0 + the plain
 *     form's y (landing at once), without and with split-K: the tile's own add, or the
 *     reduce's.
 * Cases: each type, each tile width, row and token tails, split-K (a last slice shorter than
 * the others too), K of one super-block, and q6_K rows only 2-byte aligned (630-byte rows at a
 * 2-byte offset). What it cannot check: the real MMA unit, cp.async, bank conflicts and speed
 * (test-gpu does). */
#include "emu_launch.h"
#include "engine/cuda/mma_q.cuh"
/* mma_kq_tile.cuh's one asm statement is mma_s8_k16's MMA: it becomes the emulation (c, a0,
 * a1 and b are that function's parameters) */
#define asm(...) emu_k16(c, a0, a1, b)
#include "engine/cuda/kq_mma_kernel.cuh"
#undef asm
#include <atomic>
#include <stdio.h>

bool emu_cp_late;
thread_local std::vector<std::vector<emu_copy>> emu_groups;
thread_local std::vector<emu_copy> emu_open;
static std::atomic<int> left_in_flight; /* CTAs of kq_mma_kernel that ended with copies pending */

template <int T, int BN>
static void tiles(const uint8_t *W, size_t row_bytes, int rows, int nb, const int8_t *xq, const float *xd,
                  const float *xs, int n, int kps, int splits, float *out, bool add)
{
    /* launch<T, BN> */
    emu_dim grid = {(unsigned)((n + BN - 1) / BN), (unsigned)((rows + TILE_BM - 1) / TILE_BM), (unsigned)splits};
    emu_launch(grid, TILE_THREADS, sizeof(kqt_smem<T, BN>), [&] {
        emu_cp_reset();
        kq_mma_kernel<T, BN>(W, row_bytes, rows, nb, xq, xd, xs, n, kps, out, add);
        if (!emu_groups.empty() || !emu_open.empty())
            left_in_flight++;
    });
}

/* cuda_kq_mma_matmul after its plan (bn, kps, splits) and scratch (xq, xd, xs, part), in two
 * parts: x quantised into the scratch, then the product from it */
template <int T>
static void kq_quantize(const float *x, int n, int nb, int8_t *xq, float *xd, float *xs)
{
    int nblocks = n * nb;
    emu_launch({(unsigned)((nblocks + 7) / 8), 1, 1}, 256, 0, [&] { quantize_q8_kernel<true>(x, nblocks, xq, xd); });
    if (T != KQ_Q6_K) /* cuda_kq_xsum */
        emu_launch({(unsigned)((nblocks + 255) / 256), 1, 1}, 256, 0, [&] { kq_xsum_kernel(xq, xd, nblocks, xs); });
}

template <int T>
static void kq_product(const uint8_t *W, size_t row_bytes, int rows, int nb, const int8_t *xq, const float *xd,
                       const float *xs, int n, float *y, bool add, int bn, int kps, int splits, float *part)
{
    float *out = splits > 1 ? part : y;
    bool tile_add = add && splits == 1;
    if (bn == 64)
        tiles<T, 64>(W, row_bytes, rows, nb, xq, xd, xs, n, kps, splits, out, tile_add);
    else if (bn == 32)
        tiles<T, 32>(W, row_bytes, rows, nb, xq, xd, xs, n, kps, splits, out, tile_add);
    else
        tiles<T, 16>(W, row_bytes, rows, nb, xq, xd, xs, n, kps, splits, out, tile_add);
    if (splits == 1)
        return;
    size_t total = (size_t)n * rows;
    emu_launch({(unsigned)((total + 255) / 256), 1, 1}, 256, 0, [&] { kq_reduce_kernel(part, splits, total, y, add); });
}

static uint64_t rs = 88172645463325252ull;
static float frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

#define GUARD 16
static const uint32_t GUARD_BITS = 0x7FA5A5A5u; /* a NaN nobody computes */

/* n floats between GUARD guard words on each side; the inside set to v */
struct guarded {
    std::vector<float> buf;
    float *p;
    guarded(size_t n, float v) : buf(n + 2 * GUARD, v)
    {
        float g;
        memcpy(&g, &GUARD_BITS, 4);
        std::fill(buf.begin(), buf.begin() + GUARD, g);
        std::fill(buf.end() - GUARD, buf.end(), g);
        p = buf.data() + GUARD;
    }
    int guards_hit() const
    {
        int bad = 0;
        for (int i = 0; i < GUARD; i++)
            bad += memcmp(&buf[i], &GUARD_BITS, 4) != 0, bad += memcmp(&buf[buf.size() - 1 - i], &GUARD_BITS, 4) != 0;
        return bad;
    }
};

template <int T>
static int test(int cols, int rows, int n, int bn, int splits, size_t off)
{
    int nb = cols / QK, nblocks = n * nb;
    size_t rb = ggml_row_size(T, cols), total = (size_t)n * rows;
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
    if (!kqt_shape_ok(T, W, rb, nb)) {
        printf("type %d cols %d off %zu: kqt_shape_ok refuses it\n", T, cols, off);
        return 0;
    }
    for (auto &v : x) v = frand();
    /* what quantize_q8_kernel<true> and kq_xsum_kernel must give */
    std::vector<int8_t> wxq((size_t)n * cols);
    std::vector<float> wxd(nblocks), wxs(nblocks);
    for (int b = 0; b < nblocks; b++) {
        float amax = 0;
        for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[b * 32 + l]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        float ds = tide_f16_to_f32(tide_f32_to_f16(d));
        int sum = 0;
        for (int l = 0; l < 32; l++) {
            int q = (int)rintf(x[b * 32 + l] * id), w = l >> 2, pos = (w < 4 ? 2 * w : 2 * w - 7) * 4 + (l & 3);
            wxq[(size_t)b * 32 + pos] = (int8_t)q;
            xv[(size_t)b * 32 + l] = (float)q * ds;
            sum += q;
        }
        wxd[b] = ds;
        wxs[b] = ds * (float)sum;
    }
    /* the plan's K slices: kps super-blocks each, the last one possibly shorter */
    int nkt = nb / KQT_KB, kps = (nkt + splits - 1) / splits;
    splits = (nkt + kps - 1) / kps;
    /* the reference, per slice: ref[z][t * rows + r] */
    std::vector<double> ref((size_t)splits * total, 0.0);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                ref[(size_t)(c / QK_K / kps) * total + (size_t)t * rows + r] +=
                    (double)wd[(size_t)r * cols + c] * xv[(size_t)t * cols + c];

    /* the scratch as cuda_kq_mma_matmul carves it (NaN: a read of what nobody wrote shows) */
    std::vector<int8_t> xqbuf((size_t)n * cols + 16, (int8_t)0x55);
    int8_t *xq = xqbuf.data();
    guarded xd(nblocks, NAN), xs(nblocks, NAN);
    guarded part(splits > 1 ? (size_t)splits * total : 0, NAN);
    emu_cp_late = false;
    kq_quantize<T>(x.data(), n, nb, xq, xd.p, xs.p);
    int bad_q = memcmp(xq, wxq.data(), wxq.size()) != 0 || memcmp(xd.p, wxd.data(), nblocks * sizeof(float)) != 0;
    for (size_t i = wxq.size(); i < xqbuf.size(); i++) bad_q += xq[i] != 0x55;
    if (T != KQ_Q6_K)
        bad_q += memcmp(xs.p, wxs.data(), nblocks * sizeof(float)) != 0;
    int bad_w = xd.guards_hit() + xs.guards_hit(), bad_y = 0, bad_bits = 0;
    double e2 = 0, r2 = 0, se2 = 0, sr2 = 0;
    std::vector<float> yplain;
    for (int pass = 0; pass < 2; pass++) { /* plain with cp.async landing at once; add, landing late */
        bool add = pass == 1;
        emu_cp_late = add;
        guarded y(total, NAN);
        std::vector<float> y0(total);
        for (auto &v : y0) v = frand();
        if (add)
            memcpy(y.p, y0.data(), total * sizeof(float));
        std::fill(part.buf.begin() + GUARD, part.buf.end() - GUARD, NAN);
        kq_product<T>(W, rb, rows, nb, xq, xd.p, xs.p, n, y.p, add, bn, kps, splits, splits > 1 ? part.p : NULL);
        bad_w += y.guards_hit() + part.guards_hit();
        if (!add) {
            for (size_t i = 0; i < total; i++) {
                double rf = 0;
                for (int z = 0; z < splits; z++) rf += ref[(size_t)z * total + i];
                if (!(fabs(y.p[i] - rf) < 1e30)) bad_y++;
                e2 += (y.p[i] - rf) * (y.p[i] - rf), r2 += rf * rf;
                for (int z = 0; splits > 1 && z < splits; z++) {
                    double v = part.p[(size_t)z * total + i], rz = ref[(size_t)z * total + i];
                    if (!(fabs(v - rz) < 1e30)) bad_y++;
                    se2 += (v - rz) * (v - rz), sr2 += rz * rz;
                }
            }
            yplain.assign(y.p, y.p + total);
        } else {
            for (size_t i = 0; i < total; i++) {
                float want = y0[i] + yplain[i];
                bad_bits += memcmp(&y.p[i], &want, 4) != 0;
            }
        }
    }
    double e = sqrt(e2 / r2), se = splits > 1 ? sqrt(se2 / sr2) : 0;
    int stuck = left_in_flight.exchange(0);
    printf("type %d BN %d cols %d rows %d n %d splits %d (kps %d) off %zu: rel err %.3g", T, bn, cols, rows, n, splits,
           kps, off, e);
    if (splits > 1)
        printf(", slices %.3g", se);
    printf("%s%s%s%s%s\n", bad_y ? " NON-FINITE" : "", bad_q ? " X-QUANT-DIFFERS" : "", bad_w ? " GUARD-WRITTEN" : "",
           bad_bits ? " ADD-BITS-DIFFER" : "", stuck ? " COPIES-IN-FLIGHT" : "");
    return e < 1e-5 && se < 1e-5 && !bad_y && !bad_q && !bad_w && !bad_bits && !stuck;
}

int main()
{
    int ok = 1;
    ok &= test<KQ_Q4_K>(512, 130, 20, 16, 1, 0);
    ok &= test<KQ_Q4_K>(768, 128, 64, 64, 1, 0);
    ok &= test<KQ_Q4_K>(256, 70, 3, 32, 1, 0);    /* one super-block; mostly padding */
    ok &= test<KQ_Q4_K>(1280, 136, 21, 16, 3, 0); /* 5 super-blocks in slices of 2, 2, 1 */
    ok &= test<KQ_Q5_K>(512, 128, 33, 32, 2, 0);
    ok &= test<KQ_Q5_K>(1024, 200, 70, 64, 2, 8);
    ok &= test<KQ_Q6_K>(768, 140, 40, 64, 1, 2);  /* 630-byte rows at a 2-byte offset */
    ok &= test<KQ_Q6_K>(1024, 128, 16, 16, 2, 0);
    ok &= test<KQ_Q6_K>(768, 129, 17, 32, 1, 6);
    ok &= test<KQ_Q6_K>(1280, 131, 9, 16, 3, 2);  /* slices of 2, 2, 1 at a 2-byte offset */
    printf("%s\n", ok ? "ALL OK" : "FAILED");
    return !ok;
}
