/* mmq_mma.cu - prefill-size q8_0 / q4_0 products on the int8 tensor cores.
 *
 * y(rows, n) = W(rows, cols) x(cols, n) with x already quantised to q8_0-style int8 blocks
 * (quantize_q8_kernel in matmul.cu: the CPU backend's formula). The dp4a path (mmq.cuh)
 * handles 8 tokens per launch, so at prefill sizes it re-reads W n/8 times and does all the
 * integer work on the CUDA cores; here a CTA owns a 64-row x BN-token tile of y and walks K
 * (or a slice of K, see split-K below) in stages of 4 blocks of 32:
 *
 *   - each 32-wide K block is one mma.sync.m16n8k32.s8 per 16x8 sub-tile, its int32 result
 *     exactly the dp4a path's integer dot (same int8 operands, exact integer sums);
 *   - that int32 is scaled in registers by dw(row, block) * dx(token, block) and added to an
 *     f32 accumulator: the CPU's per-block term (dw * dx) * (float)dot, so only the order
 *     of the float sum over blocks differs from the other backends;
 *   - a ring of MQ_STAGES shared-memory stages is filled by cp.async, MQ_STAGES - 1 stages
 *     ahead of the MMAs (one CTA's K walk is a chain of memory latencies otherwise). The
 *     weight rows arrive raw, as contiguous 4-byte granules, and each stage is then unpacked
 *     once into the fragment layout below; the quantised activations (32-byte aligned
 *     blocks) are copied straight into theirs. A 34- or 18-byte block is only 2-byte
 *     aligned: the kernel can start a row's granules 2 bytes early and end one with a 2-byte
 *     partial copy, but cuda_matmul sends it only rows of a multiple of 4 bytes (an even
 *     number of blocks), where neither happens. On a tensor whose last row ended 2 bytes
 *     after a 4-byte boundary (65 rows of one q8_0 block) compute-sanitizer's memcheck
 *     failed the kernel, most likely on that partial granule's 4-byte source range.
 *
 * Fragment layout of m16n8k32 .s8 (PTX ISA, "Matrix Fragments for mma.m16n8k32"), with
 * g = lane / 4, t = lane % 4: A a0/a2 = row g, k words t / t+4 (4 int8 each), a1/a3 = the
 * same for row g+8; B b0/b1 = token g, k words t / t+4; C c0,c1 = row g, tokens 2t, 2t+1,
 * c2,c3 = row g+8. A thread thus reads words t and t+4 of a block: shared memory keeps each
 * block's 8 words in the order 0,4,1,5,2,6,3,7 so that both are one 8-byte load (the
 * weights are reordered when unpacked, the activations already by the quantiser).
 *
 * Split-K: a 64-token prefill chunk of a 2048-row product is only 32 CTAs of 64 x 64, a
 * quarter of the SMs. When the tiles alone give fewer than 2 CTAs an SM, K is cut into
 * slices (grid z); each slice writes its partial y to scratch and mmq_reduce_kernel adds
 * the slices in a fixed order (deterministic, unlike atomics). */
#include "engine/cuda/mma_q.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#define MQ_BM 64                  /* weight rows per CTA: 2 warps x 32 */
#define MQ_KB 4                   /* 32-blocks per stage */
#define MQ_LD (MQ_KB * 8 + 8)     /* words per unpacked row: 40 = 8 mod 32, so the 8-byte
                                     fragment loads of 16 lanes (4 rows x 4 t) hit 32 banks */
#define MQ_THREADS 128
#define MQ_STAGES 4               /* cp.async ring depth */
#define MQ_MAX_SPLIT 8

/* Smallest n sent here. Measured (H200, q8_0, the five Qwen3-30B-A3B shapes of bench_mmq):
 * at n = 16 this kernel beat the dp4a path on all five (1.04x on 768 x 2048 to 2.4x on
 * 2048 x 4096); at n = 8 (one dp4a launch) it lost on the three smaller ones (0.47-0.70x).
 * n = 9..15 was not measured (dp4a needs 2 launches there, as at 16). */
static int mmq_min_n = 16;
static int mmq_bn = 0;     /* 0: choose per launch; 16/32/64 forced (benchmarks) */
static int mmq_split = MQ_MAX_SPLIT; /* most K slices (benchmarks: 1 = no split-K) */

extern "C" int cuda_set_mmq_min_n(int n)
{
    int old = mmq_min_n;
    mmq_min_n = n;
    return old;
}

extern "C" int cuda_set_mmq_tile(int bn)
{
    int old = mmq_bn;
    mmq_bn = bn == 16 || bn == 32 || bn == 64 ? bn : 0;
    return old;
}

extern "C" int cuda_set_mmq_split(int max_splits)
{
    int old = mmq_split;
    mmq_split = max_splits >= 1 && max_splits <= MQ_MAX_SPLIT ? max_splits : MQ_MAX_SPLIT;
    return old;
}

int cuda_mmq_min_n(void) { return mmq_min_n; }

/* raw bytes of one row's stage, padded for the up-to-2-byte lead and to 16 */
template <int QT>
struct qfmt : qblock<QT> {
    static constexpr int RAW = (MQ_KB * qblock<QT>::BLK + 4 + 15) / 16 * 16;
};

template <int QT, int BN>
struct mq_smem {
    uint8_t raw[MQ_STAGES][MQ_BM * qfmt<QT>::RAW]; /* weight rows as copied */
    uint32_t xs[MQ_STAGES][BN * MQ_LD];            /* activations, fragment order */
    float xd[MQ_STAGES][BN * MQ_KB];
    uint32_t ws[MQ_BM * MQ_LD];                    /* the current stage's weights, unpacked */
    float wd[MQ_BM * MQ_KB];
};

/* grid (token tiles, row tiles, K slices of kps stages): consecutive CTAs share a weight
 * tile, so W comes from DRAM about once and the (small) quantised x stays in L2. out is y,
 * or with several slices the partials (slice, n, rows). BN = 16, 32 or 64 tokens. */
template <int QT, int BN>
__global__ void __launch_bounds__(MQ_THREADS)
mmq_mma_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, const int8_t *__restrict__ xq,
               const float *__restrict__ xd, int n, int kps, float *__restrict__ out)
{
    constexpr int BLK = qfmt<QT>::BLK, RAW = qfmt<QT>::RAW;
    constexpr int NG = (MQ_KB * BLK + 2 + 3) / 4;   /* 4-byte granules a row's stage spans */
    constexpr int WN = BN / 2;                      /* tokens per warp */
    constexpr int NT = WN / 8;                      /* 8-token MMA tiles per warp */
    constexpr int WPT = MQ_BM * MQ_KB / MQ_THREADS; /* blocks each thread unpacks: 2 */
    constexpr int XPT = BN * MQ_KB * 2 / MQ_THREADS; /* 16-byte x chunks per thread: 1, 2, 4 */
    extern __shared__ __align__(16) uint8_t smem_raw[];
    mq_smem<QT, BN> &sm = *(mq_smem<QT, BN> *)smem_raw;

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp & 1, wn = warp >> 1;
    int n0 = blockIdx.x * BN, m0 = blockIdx.y * MQ_BM;
    int nkt_all = (nb + MQ_KB - 1) / MQ_KB;
    int kt0 = blockIdx.z * kps;
    int nkt = min(kps, nkt_all - kt0);
    size_t cols = (size_t)nb * QK;

    /* stage kt (relative to kt0) into ring slot s; an empty group past the end keeps the
     * wait counts uniform */
    auto issue = [&](int kt, int s) {
        if (kt < nkt) {
            int b0 = (kt0 + kt) * MQ_KB, len = min(MQ_KB, nb - b0) * BLK;
            for (int e = tid; e < MQ_BM * NG; e += MQ_THREADS) {
                int rr = e / NG, j = e - rr * NG, r = m0 + rr;
                const uint8_t *src = W;
                int bytes = 0;
                if (r < rows) {
                    const uint8_t *st = W + (size_t)r * row_bytes + (size_t)b0 * BLK;
                    int off = (int)((uintptr_t)st & 3);
                    int rem = off + len - 4 * j;
                    bytes = rem < 0 ? 0 : rem > 4 ? 4 : rem;
                    src = bytes ? st - off + 4 * j : W;
                }
                cp_async4(&sm.raw[s][rr * RAW + 4 * j], src, bytes);
            }
#pragma unroll
            for (int i = 0; i < XPT; i++) {
                int c = tid + i * MQ_THREADS, tok = c >> 3, kb = (c >> 1) & 3, half = c & 1;
                int tg = n0 + tok, b = b0 + kb;
                bool ok = tg < n && b < nb;
                const int8_t *src = ok ? xq + (size_t)tg * cols + (size_t)b * QK + half * 16 : xq;
                cp_async16(&sm.xs[s][tok * MQ_LD + kb * 8 + half * 4], src, ok ? 16 : 0);
            }
            for (int c = tid; c < BN * MQ_KB; c += MQ_THREADS) {
                int tok = c >> 2, kb = c & 3, tg = n0 + tok, b = b0 + kb;
                bool ok = tg < n && b < nb;
                cp_async4(&sm.xd[s][c], ok ? xd + (size_t)tg * nb + b : xd, ok ? 4 : 0);
            }
        }
        cp_async_commit();
    };

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc[i][j][k] = 0.0f;

#pragma unroll
    for (int s = 0; s < MQ_STAGES - 1; s++)
        issue(s, s);
    for (int kt = 0; kt < nkt; kt++) {
        int slot = kt % MQ_STAGES;
        cp_async_wait<MQ_STAGES - 2>(); /* this thread's copies of stage kt have landed */
        __syncthreads();                /* everyone's have; stage kt - 1 is fully consumed */
        issue(kt + MQ_STAGES - 1, (kt + MQ_STAGES - 1) % MQ_STAGES);
        int b0 = (kt0 + kt) * MQ_KB;
#pragma unroll
        for (int i = 0; i < WPT; i++) {
            int e = tid + i * MQ_THREADS, rr = e >> 2, kb = e & 3, r = m0 + rr;
            uint32_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float d = 0.0f; /* padding rows and blocks: zero quants and scale, terms of +0 */
            if (r < rows && b0 + kb < nb) {
                int off = (int)((uintptr_t)(W + (size_t)r * row_bytes + (size_t)b0 * BLK) & 3);
                d = unpack_block<QT>(&sm.raw[slot][rr * RAW + off + kb * BLK], q);
            }
            uint4 *dst = (uint4 *)&sm.ws[rr * MQ_LD + kb * 8];
            dst[0] = make_uint4(q[0], q[4], q[1], q[5]);
            dst[1] = make_uint4(q[2], q[6], q[3], q[7]);
            sm.wd[rr * MQ_KB + kb] = d;
        }
        __syncthreads(); /* the unpacked stage is complete */
        const uint32_t *xs = sm.xs[slot];
        const float *xdd = sm.xd[slot];
#pragma unroll
        for (int kb = 0; kb < MQ_KB; kb++) {
            uint32_t a[2][4];
            float dw[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = wm * 32 + i * 16 + g;
                uint2 lo = *(const uint2 *)&sm.ws[r * MQ_LD + kb * 8 + 2 * t];
                uint2 hi = *(const uint2 *)&sm.ws[(r + 8) * MQ_LD + kb * 8 + 2 * t];
                a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;
                dw[i][0] = sm.wd[r * MQ_KB + kb];
                dw[i][1] = sm.wd[(r + 8) * MQ_KB + kb];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int tb = wn * WN + j * 8;
                uint2 b = *(const uint2 *)&xs[(tb + g) * MQ_LD + kb * 8 + 2 * t];
                float dx0 = xdd[(tb + 2 * t) * MQ_KB + kb], dx1 = xdd[(tb + 2 * t + 1) * MQ_KB + kb];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int c[4];
                    mma_s8(c, a[i], b);
                    acc[i][j][0] += (dw[i][0] * dx0) * i2f_small(c[0]);
                    acc[i][j][1] += (dw[i][0] * dx1) * i2f_small(c[1]);
                    acc[i][j][2] += (dw[i][1] * dx0) * i2f_small(c[2]);
                    acc[i][j][3] += (dw[i][1] * dx1) * i2f_small(c[3]);
                }
            }
        }
    }
    cp_async_wait<0>(); /* nothing may land in shared memory after the CTA exits */

    float *y = out + (size_t)blockIdx.z * n * rows;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r0 = m0 + wm * 32 + i * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            int t0 = n0 + wn * WN + j * 8 + 2 * t, t1 = t0 + 1;
            if (t0 < n) {
                if (r0 < rows) y[(size_t)t0 * rows + r0] = acc[i][j][0];
                if (r1 < rows) y[(size_t)t0 * rows + r1] = acc[i][j][2];
            }
            if (t1 < n) {
                if (r0 < rows) y[(size_t)t1 * rows + r0] = acc[i][j][1];
                if (r1 < rows) y[(size_t)t1 * rows + r1] = acc[i][j][3];
            }
        }
    }
}

/* y[i] = sum over the slices of part[slice][i], slices in order */
__global__ void mmq_reduce_kernel(const float *__restrict__ part, int splits, size_t total, float *__restrict__ y)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    float s = part[i];
    for (int z = 1; z < splits; z++)
        s += part[(size_t)z * total + i];
    y[i] = s;
}

struct mq_plan {
    int bn, splits, kps;
};

/* Tile width: the narrowest that holds n (at most 64). Slices of K when the tiles leave SMs
 * idle, up to ~2 CTAs an SM (2 of the 60-90 KB CTAs fit on one), at least 2 stages each.
 * Measured on the H200 (q8_0, 2048-768 cols): split-K took 32-96-CTA products 1.4-3.4x
 * faster, but made 256-CTA ones (4096 x 2048 and 768 x 2048 at n = 512) 4-20% slower, the
 * partial sums' traffic outweighing the second CTA an SM. */
static mq_plan plan(struct cuda_ctx *c, int rows, int nb, int n)
{
    mq_plan p;
    p.bn = mmq_bn ? mmq_bn : n > 32 ? 64 : n > 16 ? 32 : 16;
    int nkt = (nb + MQ_KB - 1) / MQ_KB;
    long ctas = (long)((rows + MQ_BM - 1) / MQ_BM) * ((n + p.bn - 1) / p.bn);
    long want = 2L * c->sm_count;
    int s = ctas >= c->sm_count ? 1 : (int)((want + ctas - 1) / ctas);
    int smax = nkt / 2 > 1 ? nkt / 2 : 1;
    s = s < smax ? s : smax;
    s = s < mmq_split ? s : mmq_split;
    p.kps = (nkt + s - 1) / s;
    p.splits = (nkt + p.kps - 1) / p.kps;
    return p;
}

size_t cuda_mmq_scratch(struct cuda_ctx *c, int rows, int nb, int n)
{
    mq_plan p = plan(c, rows, nb, n);
    return p.splits > 1 ? (size_t)p.splits * n * rows * sizeof(float) : 0;
}

template <int QT, int BN>
static bool launch(struct cuda_ctx *c, const mq_plan &p, const uint8_t *W, size_t row_bytes, int rows, int nb,
                   const int8_t *xq, const float *xd, int n, float *out)
{
    /* over 48 KB of dynamic shared memory needs the opt-in, once per device */
    static uint64_t opted; /* bit dev: done (only the engine thread launches) */
    size_t smem = sizeof(mq_smem<QT, BN>);
    if (c->dev < 64 && !(opted >> c->dev & 1)) {
        if (!CU(c, cudaFuncSetAttribute(mmq_mma_kernel<QT, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem)))
            return false;
        opted |= 1ull << c->dev;
    }
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((rows + MQ_BM - 1) / MQ_BM), (unsigned)p.splits);
    mmq_mma_kernel<QT, BN><<<grid, MQ_THREADS, smem, c->st>>>(W, row_bytes, rows, nb, xq, xd, n, p.kps, out);
    return CU_LAUNCH(c, "mmq_mma_kernel");
}

bool cuda_mmq_mma(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int nb,
                  const int8_t *xq, const float *xd, int n, float *y, float *part)
{
    mq_plan p = plan(c, rows, nb, n);
    float *out = p.splits > 1 ? part : y;
    bool ok;
    if (type == GGML_TYPE_Q8_0)
        ok = p.bn == 64   ? launch<8, 64>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
             : p.bn == 32 ? launch<8, 32>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
                          : launch<8, 16>(c, p, W, row_bytes, rows, nb, xq, xd, n, out);
    else
        ok = p.bn == 64   ? launch<2, 64>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
             : p.bn == 32 ? launch<2, 32>(c, p, W, row_bytes, rows, nb, xq, xd, n, out)
                          : launch<2, 16>(c, p, W, row_bytes, rows, nb, xq, xd, n, out);
    if (!ok || p.splits == 1)
        return ok;
    size_t total = (size_t)n * rows;
    mmq_reduce_kernel<<<(unsigned)((total + 255) / 256), 256, 0, c->st>>>(part, p.splits, total, y);
    return CU_LAUNCH(c, "mmq_reduce_kernel");
}
