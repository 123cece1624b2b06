/* f16_tile_emu.cpp - the f16 / bf16 tensor-core tile (src/engine/cuda/gemm_f16_mma.cuh, the real
 * file) run on the CPU: no GPU was there when it was written, and this is how its index math was
 * checked (`make f16-tile-emu`).
 *
 * g++ compiles gemm_f16_mma.cuh against the host shim engine/cuda/mma_f16.cuh here (threads for
 * CUDA threads, warp exchanges for ldmatrix and the MMAs, cp.async landing late or at once; see
 * that file), inside a copy of gemm_f16_mma.cu's kernel (blockIdx to the tile's origin and K
 * slice) and its fixed-order split-K reduce. Each case rounds W and x with tide's own f16 / bf16
 * conversions (as fm_convert_kernel rounds x), pads W's rows with NaN past cols, starts shared
 * memory and y (without add) as NaN, runs every CTA of the grid and every K slice, and compares
 * with the rounded operands' product in double (+ y0 with add): the relative error must be float
 * rounding (< 1e-5), with no NaN, no misaligned or stray ldmatrix row and no bank conflict. Cases:
 * both types, both tile widths, K not a multiple of the 32-wide stage, one row, rows and tokens
 * past whole tiles, split-K with a short last slice, add. What it cannot check: the real MMA unit,
 * the real cp.async, timing and speed (test-gpu matmul_f16_mma and bench_f16_mma do). */
#include "engine/cuda/gemm_f16_mma.cuh"
#include <thread>
#include <stdio.h>
#include <stdlib.h>

thread_local emu_idx threadIdx;
std::barrier<> *emu_cta_bar;
emu_warp *emu_warps;
bool emu_cp_late;
thread_local std::vector<std::vector<emu_copy>> emu_groups;
thread_local std::vector<emu_copy> emu_open;
const uint8_t *emu_smem_lo, *emu_smem_hi;
std::atomic<long> emu_conflicts, emu_phases, emu_bad_addr;

/* gemm_f16_mma_kernel for CTA (bx, by, bz), thread threadIdx.x */
template <typename T, int BN>
static void kernel_thread(fm_smem<BN> &sm, const uint16_t *W, size_t ldw, int rows, int cols, const uint16_t *x16,
                          int n, int kps, float *out, bool add, int bx, int by, int bz)
{
    int nkt_all = (cols + FM_BK - 1) / FM_BK, kt0 = bz * kps;
    fm_tile<T, BN>(sm, W, ldw, rows, cols, x16, n, by * FM_BM, bx * BN, kt0, min(kps, nkt_all - kt0),
                   out + (size_t)bz * n * rows, add);
    emu_groups.clear();
}

template <typename T, int BN>
static void run(const uint16_t *W, size_t ldw, int rows, int cols, const uint16_t *x16, int n, int kps, int splits,
                float *out, bool add)
{
    auto *sm = (fm_smem<BN> *)aligned_alloc(128, (sizeof(fm_smem<BN>) + 127) & ~(size_t)127);
    emu_smem_lo = (const uint8_t *)sm;
    emu_smem_hi = emu_smem_lo + sizeof(fm_smem<BN>);
    std::barrier<> cta(FM_THREADS);
    emu_cta_bar = &cta;
    std::vector<emu_warp> warps(FM_THREADS / 32);
    for (auto &w : warps) w.bar = new std::barrier<>(32);
    emu_warps = warps.data();
    for (int z = 0; z < splits; z++)
        for (int y = 0; y < (rows + FM_BM - 1) / FM_BM; y++)
            for (int x = 0; x < (n + BN - 1) / BN; x++) {
                memset((void *)sm, 0xFF, sizeof *sm); /* 0xFFFF: a NaN in f16 and bf16 */
                std::vector<std::thread> th;
                for (int t = 0; t < FM_THREADS; t++)
                    th.emplace_back([&, t] {
                        threadIdx.x = t;
                        kernel_thread<T, BN>(*sm, W, ldw, rows, cols, x16, n, kps, out, add, x, y, z);
                    });
                for (auto &h : th) h.join();
            }
    for (auto &w : warps) delete w.bar;
    free(sm);
}

static uint64_t rs = 88172645463325252ull;
static double frand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (double)(rs >> 11) / 9007199254740992.0 * 2 - 1; }

template <typename T>
static uint16_t to_bits(float v) { return std::is_same<T, __half>::value ? tide_f32_to_f16(v) : tide_f32_to_bf16(v); }
template <typename T>
static float from_bits(uint16_t h) { return std::is_same<T, __half>::value ? tide_f16_to_f32(h) : tide_bf16_to_f32(h); }

/* one product: cols, rows, n, W row pad, tile width, K slices of kps stages (splits follows), add */
template <typename T, int BN>
static int test(int cols, int rows, int n, int pad, int kps, bool add, bool late)
{
    size_t ldw = (size_t)cols + pad, ny = (size_t)n * rows;
    int nkt = (cols + FM_BK - 1) / FM_BK, splits = (nkt + kps - 1) / kps;
    std::vector<uint16_t> W(ldw * rows, 0xFFFF), x16((size_t)n * cols);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) W[r * ldw + k] = to_bits<T>((float)(frand() / sqrt((double)cols)));
    for (auto &v : x16) v = to_bits<T>((float)frand());
    std::vector<float> y0(ny), y(ny), part((size_t)splits * ny, NAN);
    for (auto &v : y0) v = (float)frand();
    y = add ? y0 : std::vector<float>(ny, NAN);
    emu_cp_late = late;
    bool one = splits == 1;
    run<T, BN>(W.data(), ldw, rows, cols, x16.data(), n, kps, splits, one ? y.data() : part.data(), add && one);
    if (!one) /* fm_reduce_kernel */
        for (size_t i = 0; i < ny; i++) {
            float s = part[i];
            for (int z = 1; z < splits; z++) s += part[(size_t)z * ny + i];
            y[i] = add ? y[i] + s : s;
        }
    double num = 0, den = 0;
    long nan = 0;
    for (int tk = 0; tk < n; tk++)
        for (int r = 0; r < rows; r++) {
            double ref = add ? y0[(size_t)tk * rows + r] : 0;
            for (int k = 0; k < cols; k++)
                ref += (double)from_bits<T>(W[r * ldw + k]) * from_bits<T>(x16[(size_t)tk * cols + k]);
            float got = y[(size_t)tk * rows + r];
            if (std::isnan(got)) { nan++; continue; }
            num += (got - ref) * (got - ref);
            den += ref * ref;
        }
    double rel = sqrt(num / den);
    bool ok = nan == 0 && rel < 1e-5;
    printf("%s cols %4d rows %4d n %3d pad %2d tile %3d splits %d x %2d stages add %d cp.async %s: rel err %.3g, "
           "NaN %ld  %s\n", std::is_same<T, __half>::value ? "f16 " : "bf16", cols, rows, n, pad, BN, splits, kps,
           (int)add, late ? "late " : "early", rel, nan, ok ? "ok" : "BAD");
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    bad += test<__half, 64>(40, 70, 65, 8, 2, false, true);       /* K of 1.25 stages, NaN row pad */
    bad += test<__half, 128>(136, 129, 130, 0, 5, true, true);    /* rows and tokens one past a tile */
    bad += test<__half, 64>(136, 129, 130, 0, 5, false, false);
    bad += test<__half, 64>(520, 200, 70, 16, 5, true, false);    /* split-K 4 x 5 stages, last 2 */
    bad += test<__nv_bfloat16, 64>(520, 200, 70, 16, 6, false, true); /* split 3 x 6, last 5 */
    bad += test<__half, 64>(24, 1, 64, 0, 1, false, true);        /* one row, K under a stage */
    bad += test<__nv_bfloat16, 128>(264, 140, 200, 0, 9, true, true);
    long ph = emu_phases, cf = emu_conflicts, ba = emu_bad_addr;
    printf("ldmatrix phases %ld, with bank conflicts %ld, misaligned or outside shared memory %ld\n", ph, cf, ba);
    bad += cf != 0 || ba != 0;
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}
