/* mmq_mma.cu - prefill-size q8_0 / q4_0 products on the int8 tensor cores.
 *
 * y(rows, n) = W(rows, cols) x(cols, n) with x already quantised to q8_0-style int8 blocks
 * (quantize_q8_kernel in matmul.cu: the CPU backend's formula). The dp4a path (mmq.cuh)
 * handles 8 tokens per launch, so at prefill sizes it re-reads W n/8 times and does all the
 * integer work on the CUDA cores; here a CTA owns a 64-row x BN-token tile of y and walks K:
 *
 *   - each 32-wide K block is one mma.sync.m16n8k32.s8 per 16x8 sub-tile, its int32 result
 *     exactly the dp4a path's integer dot (same int8 operands, exact integer sums);
 *   - that int32 is scaled in registers by dw(row, block) * dx(token, block) and added to an
 *     f32 accumulator: the CPU's per-block term (dw * dx) * (float)dot, so only the order
 *     of the float sum over blocks differs from the other backends;
 *   - weights are staged through registers (34- and 18-byte blocks are only 2-byte aligned,
 *     too little for cp.async): the global loads of stage k+1 are issued before the MMAs of
 *     stage k and stored to shared memory after them; the activations (32-byte aligned
 *     blocks) come with cp.async into the other buffer meanwhile. One barrier per stage.
 *
 * Fragment layout of m16n8k32 .s8 (PTX ISA, "Matrix Fragments for mma.m16n8k32"), with
 * g = lane / 4, t = lane % 4: A a0/a2 = row g, k words t / t+4 (4 int8 each), a1/a3 = the
 * same for row g+8; B b0/b1 = token g, k words t / t+4; C c0,c1 = row g, tokens 2t, 2t+1,
 * c2,c3 = row g+8. A thread thus reads words t and t+4 of a block: shared memory keeps each
 * block's 8 words in the order 0,4,1,5,2,6,3,7 so that both are one 8-byte load (the
 * weights are reordered when stored, the activations already by the quantiser). */
#include "engine/cuda/mmq.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#define MQ_BM 64                  /* weight rows per CTA: 2 warps x 32 */
#define MQ_KB 4                   /* 32-blocks per stage */
#define MQ_LD (MQ_KB * 8 + 8)     /* words per staged row: 40 = 8 mod 32, so the 8-byte
                                     fragment loads of 16 lanes (4 rows x 4 t) hit 32 banks */
#define MQ_THREADS 128

static int mmq_min_n = 16; /* see cuda_matmul: where the MMQ path starts to win */
static int mmq_bn = 0;     /* 0: choose per launch; 16/32/64 forced (benchmarks) */

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

int cuda_mmq_min_n(void) { return mmq_min_n; }

__device__ __forceinline__ void cp_async16(void *smem, const void *g, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(void *smem, const void *g, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* c = A(16x32) B(32x8), int8 in, int32 out, from zero: one K block's integer dots */
__device__ __forceinline__ void mma_s8(int c[4], const uint32_t a[4], uint2 b)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}

/* Exact int32 -> f32 for |v| < 2^22 (a block dot is at most 32 * 127 * 128 < 2^19) with an
 * integer add and a float subtract: I2F issues at a quarter of the FP32 rate on sm_90 and
 * would be the busiest pipe here. */
__device__ __forceinline__ float i2f_small(int v)
{
    return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

/* One weight block, loaded with aligned 32-bit loads (W is 4-byte aligned, a block 2-byte):
 * a = the block's address rounded down to 4; when the block starts 2 bytes past a, its
 * quants are words 1..N of a (whole words), else the bytes 2.. of words 0..N (a funnel
 * shift by 16). Word N is read as two 16-bit halves so that no byte outside the block is
 * read past its end (the word before it, for an odd start, is in the previous block). */
template <int QT>
struct wblock {
    static constexpr int BLK = QT == 8 ? 34 : 18, NW = QT == 8 ? 8 : 4;
    uint32_t w[NW + 1];
    bool odd;

    __device__ __forceinline__ void load(const uint8_t *p)
    {
        uintptr_t ua = (uintptr_t)p;
        odd = (ua & 2) != 0;
        const uint8_t *a = (const uint8_t *)(ua & ~(uintptr_t)3);
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = __ldg((const uint32_t *)a + i);
        uint32_t lo = __ldg((const uint16_t *)(a + 4 * NW));
        uint32_t hi = odd ? __ldg((const uint16_t *)(a + 4 * NW + 2)) : 0u;
        w[NW] = lo | (hi << 16);
    }
    __device__ __forceinline__ void zero()
    {
        odd = false;
#pragma unroll
        for (int i = 0; i <= NW; i++)
            w[i] = 0;
    }
    /* the scale and the 8 int8x4 words of quants, in element order */
    __device__ __forceinline__ float unpack(uint32_t q[8]) const
    {
        uint32_t u[NW];
#pragma unroll
        for (int i = 0; i < NW; i++)
            u[i] = odd ? w[i + 1] : __funnelshift_r(w[i], w[i + 1], 16);
        if (QT == 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[i] = u[i];
        } else {
            int wq[8];
            unpack_q4(u, wq);
#pragma unroll
            for (int i = 0; i < 8; i++)
                q[i] = (uint32_t)wq[i];
        }
        uint16_t d = (uint16_t)(odd ? w[0] >> 16 : w[0] & 0xFFFFu);
        return f16_bits_to_f32(d);
    }
};

/* grid (token tiles, row tiles): consecutive CTAs share a weight tile, so W comes from
 * DRAM about once and the (small) quantised x stays in L2. BN = 16, 32 or 64 tokens. */
template <int QT, int BN>
__global__ void __launch_bounds__(MQ_THREADS)
mmq_mma_kernel(const uint8_t *__restrict__ W, size_t row_bytes, int rows, int nb, const int8_t *__restrict__ xq,
               const float *__restrict__ xd, int n, float *__restrict__ y)
{
    constexpr int WN = BN / 2;      /* tokens per warp */
    constexpr int NT = WN / 8;      /* 8-token MMA tiles per warp */
    constexpr int WPT = MQ_BM * MQ_KB / MQ_THREADS; /* weight blocks per thread per stage: 2 */
    constexpr int XPT = BN * MQ_KB * 2 / MQ_THREADS; /* 16-byte x chunks per thread: 1, 2, 4 */
    __shared__ __align__(16) uint32_t Ws[2][MQ_BM * MQ_LD];
    __shared__ __align__(16) uint32_t Xs[2][BN * MQ_LD];
    __shared__ __align__(16) float Wd[2][MQ_BM * MQ_KB];
    __shared__ __align__(16) float Xd[2][BN * MQ_KB];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp & 1, wn = warp >> 1;
    int n0 = blockIdx.x * BN, m0 = blockIdx.y * MQ_BM;
    int nkt = (nb + MQ_KB - 1) / MQ_KB;
    size_t cols = (size_t)nb * QK;

    wblock<QT> wb[WPT];
    auto load_w = [&](int kt) {
#pragma unroll
        for (int i = 0; i < WPT; i++) {
            int e = tid + i * MQ_THREADS, r = m0 + (e >> 2), b = kt * MQ_KB + (e & 3);
            if (r < rows && b < nb)
                wb[i].load(W + (size_t)r * row_bytes + (size_t)b * wblock<QT>::BLK);
            else
                wb[i].zero(); /* zero quants and scale: the padded terms add +0 */
        }
    };
    auto store_w = [&](int buf) {
#pragma unroll
        for (int i = 0; i < WPT; i++) {
            int e = tid + i * MQ_THREADS, rr = e >> 2, kb = e & 3;
            uint32_t q[8];
            float d = wb[i].unpack(q);
            uint4 *dst = (uint4 *)&Ws[buf][rr * MQ_LD + kb * 8];
            dst[0] = make_uint4(q[0], q[4], q[1], q[5]);
            dst[1] = make_uint4(q[2], q[6], q[3], q[7]);
            Wd[buf][rr * MQ_KB + kb] = d;
        }
    };
    auto load_x = [&](int kt, int buf) {
#pragma unroll
        for (int i = 0; i < XPT; i++) {
            int c = tid + i * MQ_THREADS, tok = c >> 3, kb = (c >> 1) & 3, half = c & 1;
            int tg = n0 + tok, b = kt * MQ_KB + kb;
            bool ok = tg < n && b < nb;
            const int8_t *src = ok ? xq + (size_t)tg * cols + (size_t)b * QK + half * 16 : xq;
            cp_async16(&Xs[buf][tok * MQ_LD + kb * 8 + half * 4], src, ok);
        }
#pragma unroll
        for (int c = tid; c < BN * MQ_KB; c += MQ_THREADS) {
            int tok = c >> 2, kb = c & 3, tg = n0 + tok, b = kt * MQ_KB + kb;
            bool ok = tg < n && b < nb;
            cp_async4(&Xd[buf][c], ok ? xd + (size_t)tg * nb + b : xd, ok);
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

    load_x(0, 0);
    load_w(0);
    store_w(0);
    for (int kt = 0; kt < nkt; kt++) {
        int buf = kt & 1;
        bool more = kt + 1 < nkt;
        cp_async_wait_all();
        __syncthreads(); /* stage kt visible; everyone is done reading buf ^ 1 (stage kt - 1) */
        if (more) {
            load_x(kt + 1, buf ^ 1);
            load_w(kt + 1); /* in flight during the MMAs below */
        }
        const uint32_t *ws = Ws[buf], *xs = Xs[buf];
        const float *wd = Wd[buf], *xdd = Xd[buf];
#pragma unroll
        for (int kb = 0; kb < MQ_KB; kb++) {
            uint32_t a[2][4];
            float dw[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = wm * 32 + i * 16 + g;
                uint2 lo = *(const uint2 *)&ws[r * MQ_LD + kb * 8 + 2 * t];
                uint2 hi = *(const uint2 *)&ws[(r + 8) * MQ_LD + kb * 8 + 2 * t];
                a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;
                dw[i][0] = wd[r * MQ_KB + kb];
                dw[i][1] = wd[(r + 8) * MQ_KB + kb];
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
        if (more)
            store_w(buf ^ 1); /* buf ^ 1 was last read in stage kt - 1, before the barrier */
    }

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

template <int QT, int BN>
static bool launch(struct cuda_ctx *c, const uint8_t *W, size_t row_bytes, int rows, int nb, const int8_t *xq,
                   const float *xd, int n, float *y)
{
    dim3 grid((unsigned)((n + BN - 1) / BN), (unsigned)((rows + MQ_BM - 1) / MQ_BM));
    mmq_mma_kernel<QT, BN><<<grid, MQ_THREADS, 0, c->st>>>(W, row_bytes, rows, nb, xq, xd, n, y);
    return CU_LAUNCH(c, "mmq_mma_kernel");
}

/* Tile width: the widest that still gives ~2 CTAs per SM (a 64-token chunk of a 4096-row
 * product is only 64 CTAs of 64 x 64), never wider than n needs. */
static int pick_bn(struct cuda_ctx *c, int rows, int n)
{
    if (mmq_bn)
        return mmq_bn;
    int rt = (rows + MQ_BM - 1) / MQ_BM;
    int bn = n > 32 ? 64 : n > 16 ? 32 : 16;
    while (bn > 16 && (long)rt * ((n + bn - 1) / bn) < 2L * c->sm_count)
        bn /= 2;
    return bn;
}

bool cuda_mmq_mma(struct cuda_ctx *c, uint32_t type, const uint8_t *W, size_t row_bytes, int rows, int nb,
                  const int8_t *xq, const float *xd, int n, float *y)
{
    int bn = pick_bn(c, rows, n);
    if (type == GGML_TYPE_Q8_0)
        return bn == 64   ? launch<8, 64>(c, W, row_bytes, rows, nb, xq, xd, n, y)
               : bn == 32 ? launch<8, 32>(c, W, row_bytes, rows, nb, xq, xd, n, y)
                          : launch<8, 16>(c, W, row_bytes, rows, nb, xq, xd, n, y);
    return bn == 64   ? launch<2, 64>(c, W, row_bytes, rows, nb, xq, xd, n, y)
           : bn == 32 ? launch<2, 32>(c, W, row_bytes, rows, nb, xq, xd, n, y)
                      : launch<2, 16>(c, W, row_bytes, rows, nb, xq, xd, n, y);
}
