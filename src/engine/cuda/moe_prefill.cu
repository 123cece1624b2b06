/* moe_prefill.cu - a prefill chunk's MoE FFN for one layer in a handful of launches
 * (backend_i.moe_ffn_batch), instead of ~6 launches per used expert.
 *
 * The forward sorts the chunk's (token, choice) pairs by expert; each expert's run of pairs is
 * a group. One call (all its groups' weights valid at once) queues:
 *   1. (first call of a layer) the chunk's n input rows quantised once to int8 blocks - the
 *      per-expert path quantises each expert's gathered copy of the same rows, to the same
 *      values (the quantiser works per 32-block of one row);
 *   2. one grouped gate+up product: a CTA owns one tile of <= BN pairs of one group and 32
 *      features, i.e. 32 gate rows and the same 32 up rows interleaved by 8 so that one
 *      m16n8k32 fragment holds gate (rows g) and up (rows g + 8) of the same feature in the
 *      same thread; its epilogue writes silu(gate) * up per pair row (the gather happens in
 *      the activation load: a tile's columns read the quantised rows of its pairs' tokens);
 *   3. the swiglu rows quantised (the down product's input, as matmul would quantise them);
 *   4. one grouped down product into one f32 row per pair;
 *   5. (last call) the combine: per token, its k pair rows summed in ascending pair order,
 *      w * row each, as zero + scatter_axpy per expert add them (no atomics: the order is
 *      fixed, so the result does not depend on scheduling), optionally into the residual.
 *
 * The products use the int8 tensor-core scheme of mmq_mma.cu (its kernel is the model for
 * this one: same stage ring, fragment layout and per-block term (dw * dx) * dot) but never
 * split K: each output element adds its blocks in K order. So the result is bit for bit
 * matmul's with the tensor-core kernel at every n and no split-K (cuda_set_mmq_min_n(1),
 * cuda_set_mmq_split(1)); with the defaults matmul may split K or use dp4a for small groups,
 * which sums in another order (f32 rounding differences only). Since a tile's arithmetic
 * does not depend on the tile width or on which other groups share the launch, the output
 * does not depend on how the forward splits a layer's groups into calls (the cache size). */
#include "engine/cuda/mma_q.cuh"

extern "C" {
#include "engine/backend_cuda.h"
}

#include <stdlib.h>
#include <string.h>

namespace { /* internal linkage: the helpers mirror mmq_mma.cu's, which are local to it */

#define MP_BM 64              /* weight rows per CTA (gate+up: 32 features x 2) */
#define MP_KB 4               /* 32-blocks per stage */
#define MP_LD (MP_KB * 8 + 8) /* words per unpacked row (bank-conflict-free fragment loads) */
#define MP_THREADS 128
#define MP_STAGES 4

struct mp_tile {
    int g, p0, cnt; /* group, its first pair in this tile, pairs (<= BN) */
};
struct mp_group {
    const uint8_t *w[3]; /* gate, up, down data */
};

template <int QT>
struct qfmt : qblock<QT> {
    static constexpr int RAW = (MP_KB * qblock<QT>::BLK + 4 + 15) / 16 * 16;
};

template <int QT, int BN>
struct mp_smem {
    uint8_t raw[MP_STAGES][MP_BM * qfmt<QT>::RAW];
    uint32_t xs[MP_STAGES][BN * MP_LD];
    float xd[MP_STAGES][BN * MP_KB];
    uint32_t ws[MP_BM * MP_LD];
    float wd[MP_BM * MP_KB];
    const uint8_t *wrow[MP_BM]; /* this CTA's weight rows (NULL: padding) */
    int xrow[BN];               /* the activation row of each column (-1: padding) */
};

/* grid (tiles, row tiles). GATED: rows = n_ff features, K = n_embd; column c of a tile reads the
 * quantised input row of its pair's token (tok), and out = h (pairs, rows) = silu(gate) * up.
 * Else the down product: rows = n_embd, K = n_ff, column c reads quantised h row p0 + c, and
 * out = (pairs, rows). Consecutive CTAs are consecutive tiles: a group's tiles (which share
 * its weight tile) run together, so each weight tile comes from DRAM about once. */
template <int QT, int BN, bool GATED>
__global__ void __launch_bounds__(MP_THREADS)
moe_mma_kernel(const mp_tile *__restrict__ tiles, const mp_group *__restrict__ groups, size_t row_bytes, int rows,
               int nb, const int *__restrict__ tok, const int8_t *__restrict__ xq, const float *__restrict__ xd,
               float *__restrict__ out)
{
    constexpr int BLK = qfmt<QT>::BLK, RAW = qfmt<QT>::RAW;
    constexpr int NG = (MP_KB * BLK + 2 + 3) / 4;
    constexpr int WN = BN / 2;
    constexpr int NT = WN / 8;
    constexpr int WPT = MP_BM * MP_KB / MP_THREADS;
    constexpr int XPT = BN * MP_KB * 2 / MP_THREADS;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    mp_smem<QT, BN> &sm = *(mp_smem<QT, BN> *)smem_raw;

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int wm = warp & 1, wn = warp >> 1;
    const mp_tile tl = tiles[blockIdx.x];
    int m0 = blockIdx.y * (GATED ? MP_BM / 2 : MP_BM); /* first feature / output row */
    int nkt = (nb + MP_KB - 1) / MP_KB;
    size_t cols = (size_t)nb * QK;

    for (int rr = tid; rr < MP_BM; rr += MP_THREADS) {
        /* gate+up: local rows 16s..16s+7 are gate rows of features m0 + 8s.., 16s+8.. the up rows */
        int r = GATED ? m0 + (rr >> 4) * 8 + (rr & 7) : m0 + rr;
        const uint8_t *base = groups[tl.g].w[GATED ? (rr >> 3) & 1 : 2];
        sm.wrow[rr] = r < rows ? base + (size_t)r * row_bytes : nullptr;
    }
    for (int c = tid; c < BN; c += MP_THREADS)
        sm.xrow[c] = c < tl.cnt ? (GATED ? tok[tl.p0 + c] : tl.p0 + c) : -1;
    __syncthreads();

    auto issue = [&](int kt, int s) {
        if (kt < nkt) {
            int b0 = kt * MP_KB, len = min(MP_KB, nb - b0) * BLK;
            for (int e = tid; e < MP_BM * NG; e += MP_THREADS) {
                int rr = e / NG, j = e - rr * NG;
                const uint8_t *wr = sm.wrow[rr], *src = (const uint8_t *)xq; /* any valid address: 0 bytes */
                int bytes = 0;
                if (wr) {
                    const uint8_t *st = wr + (size_t)b0 * BLK;
                    int off = (int)((uintptr_t)st & 3);
                    int rem = off + len - 4 * j;
                    bytes = rem < 0 ? 0 : rem > 4 ? 4 : rem;
                    src = bytes ? st - off + 4 * j : src;
                }
                cp_async4(&sm.raw[s][rr * RAW + 4 * j], src, bytes);
            }
#pragma unroll
            for (int i = 0; i < XPT; i++) {
                int c = tid + i * MP_THREADS, col = c >> 3, kb = (c >> 1) & 3, half = c & 1;
                int xr = sm.xrow[col], b = b0 + kb;
                bool ok = xr >= 0 && b < nb;
                const int8_t *src = ok ? xq + (size_t)xr * cols + (size_t)b * QK + half * 16 : xq;
                cp_async16(&sm.xs[s][col * MP_LD + kb * 8 + half * 4], src, ok ? 16 : 0);
            }
            for (int c = tid; c < BN * MP_KB; c += MP_THREADS) {
                int col = c >> 2, kb = c & 3, xr = sm.xrow[col], b = b0 + kb;
                bool ok = xr >= 0 && b < nb;
                cp_async4(&sm.xd[s][c], ok ? xd + (size_t)xr * nb + b : xd, ok ? 4 : 0);
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
    for (int s = 0; s < MP_STAGES - 1; s++)
        issue(s, s);
    for (int kt = 0; kt < nkt; kt++) {
        int slot = kt % MP_STAGES;
        cp_async_wait<MP_STAGES - 2>();
        __syncthreads();
        issue(kt + MP_STAGES - 1, (kt + MP_STAGES - 1) % MP_STAGES);
        int b0 = kt * MP_KB;
#pragma unroll
        for (int i = 0; i < WPT; i++) {
            int e = tid + i * MP_THREADS, rr = e >> 2, kb = e & 3;
            const uint8_t *wr = sm.wrow[rr];
            uint32_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float d = 0.0f; /* padding rows and blocks: terms of +0 */
            if (wr && b0 + kb < nb) {
                int off = (int)((uintptr_t)(wr + (size_t)b0 * BLK) & 3);
                d = unpack_block<QT>(&sm.raw[slot][rr * RAW + off + kb * BLK], q);
            }
            uint4 *dst = (uint4 *)&sm.ws[rr * MP_LD + kb * 8];
            dst[0] = make_uint4(q[0], q[4], q[1], q[5]);
            dst[1] = make_uint4(q[2], q[6], q[3], q[7]);
            sm.wd[rr * MP_KB + kb] = d;
        }
        __syncthreads();
        const uint32_t *xs = sm.xs[slot];
        const float *xdd = sm.xd[slot];
#pragma unroll
        for (int kb = 0; kb < MP_KB; kb++) {
            uint32_t a[2][4];
            float dw[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = wm * 32 + i * 16 + g;
                uint2 lo = *(const uint2 *)&sm.ws[r * MP_LD + kb * 8 + 2 * t];
                uint2 hi = *(const uint2 *)&sm.ws[(r + 8) * MP_LD + kb * 8 + 2 * t];
                a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;
                dw[i][0] = sm.wd[r * MP_KB + kb];
                dw[i][1] = sm.wd[(r + 8) * MP_KB + kb];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int tb = wn * WN + j * 8;
                uint2 b = *(const uint2 *)&xs[(tb + g) * MP_LD + kb * 8 + 2 * t];
                float dx0 = xdd[(tb + 2 * t) * MP_KB + kb], dx1 = xdd[(tb + 2 * t + 1) * MP_KB + kb];
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
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            int t0 = wn * WN + j * 8 + 2 * t, t1 = t0 + 1;
            if (GATED) { /* c0/c1: gate of feature f, c2/c3: its up (local row + 8) */
                int f = m0 + (wm * 2 + i) * 8 + g;
                if (f < rows) {
                    float g0 = acc[i][j][0], g1 = acc[i][j][1];
                    /* swiglu_kernel's expression */
                    if (t0 < tl.cnt) out[(size_t)(tl.p0 + t0) * rows + f] = g0 / (1.0f + expf(-g0)) * acc[i][j][2];
                    if (t1 < tl.cnt) out[(size_t)(tl.p0 + t1) * rows + f] = g1 / (1.0f + expf(-g1)) * acc[i][j][3];
                }
            } else {
                int r0 = m0 + wm * 32 + i * 16 + g, r1 = r0 + 8;
                if (t0 < tl.cnt) {
                    if (r0 < rows) out[(size_t)(tl.p0 + t0) * rows + r0] = acc[i][j][0];
                    if (r1 < rows) out[(size_t)(tl.p0 + t0) * rows + r1] = acc[i][j][2];
                }
                if (t1 < tl.cnt) {
                    if (r0 < rows) out[(size_t)(tl.p0 + t1) * rows + r0] = acc[i][j][1];
                    if (r1 < rows) out[(size_t)(tl.p0 + t1) * rows + r1] = acc[i][j][3];
                }
            }
        }
    }
}

/* y[t] (=, or += with add) sum over j of tw[t k + j] * rows[tpos[t k + j]], j ascending, from 0:
 * scatter_axpy_kernel's expression onto a zeroed row, then axpy_kernel's y + 1.0f * sum. */
__global__ void mp_combine_kernel(const float *__restrict__ rows, const int *__restrict__ tpos,
                                  const float *__restrict__ tw, int k, int dim, float *y, bool add)
{
    int t = blockIdx.x;
    const int *pp = tpos + (size_t)t * k;
    const float *ww = tw + (size_t)t * k;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += ww[j] * rows[(size_t)pp[j] * dim + i];
        float *o = y + (size_t)t * dim + i;
        *o = add ? *o + s : s;
    }
}

/* cuda_set_moe_grouped; -1: not set yet, then TIDE_MOE_GROUPED=0 in the environment turns the
 * grouped op off (the daemon's before/after benchmark in one build) */
int grouped_on = -1;

bool grouped(void)
{
    if (grouped_on < 0) {
        const char *e = getenv("TIDE_MOE_GROUPED");
        grouped_on = !(e && !strcmp(e, "0"));
    }
    return grouped_on != 0;
}

/* The shapes and types the kernels take: q8_0 / q4_0 gate, up (E -> F) and down (F -> E), all
 * one type, whole blocks, rows a multiple of 4 bytes (the 4-byte granule copies). */
bool shape_ok(const struct expert_weights *e)
{
    uint32_t T = e->gate.type;
    if ((T != GGML_TYPE_Q8_0 && T != GGML_TYPE_Q4_0) || e->up.type != T || e->down.type != T)
        return false;
    int64_t E = e->gate.ne[0], F = e->gate.ne[1];
    if (E <= 0 || F <= 0 || E % QK || F % QK || e->up.ne[0] != E || e->up.ne[1] != F || e->down.ne[0] != F ||
        e->down.ne[1] != E)
        return false;
    size_t blk = T == GGML_TYPE_Q8_0 ? 34 : 18;
    return e->gate.row_bytes == (size_t)(E / QK) * blk && e->up.row_bytes == e->gate.row_bytes &&
           e->down.row_bytes == (size_t)(F / QK) * blk && e->gate.row_bytes % 4 == 0 && e->down.row_bytes % 4 == 0;
}

bool same_layout(const struct expert_weights *a, const struct expert_weights *b)
{
    const struct tensor *ta[3] = {&a->gate, &a->up, &a->down}, *tb[3] = {&b->gate, &b->up, &b->down};
    for (int m = 0; m < 3; m++)
        if (ta[m]->type != tb[m]->type || ta[m]->ne[0] != tb[m]->ne[0] || ta[m]->ne[1] != tb[m]->ne[1] ||
            ta[m]->row_bytes != tb[m]->row_bytes || ((uintptr_t)tb[m]->data & 3))
            return false;
    return true;
}

size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The scratch of one layer's calls, carved the same way by every call (sizes depend only on
 * n, k, n_group and the shape): quantised input, swiglu rows, their quantised form, the
 * per-pair down rows, then the host-built arguments. */
struct mp_layout {
    size_t xq, xd, h, hq, hd, yrow, tok, tpos, tw, groups, tiles, total;
    int max_tiles;
};

mp_layout layout(int n, int k, int n_group, int E, int F)
{
    mp_layout L;
    size_t P = (size_t)n * k, o = 0;
    L.max_tiles = (int)(P / 16) + n_group; /* the narrowest tiles (16) of every group */
    L.xq = o; o += al256((size_t)n * E);
    L.xd = o; o += al256((size_t)n * (E / QK) * sizeof(float));
    L.h = o; o += al256(P * F * sizeof(float));
    L.hq = o; o += al256(P * F);
    L.hd = o; o += al256(P * (F / QK) * sizeof(float));
    L.yrow = o; o += al256(P * E * sizeof(float));
    L.tok = o; o += al256(P * sizeof(int));
    L.tpos = o; o += al256(P * sizeof(int));
    L.tw = o; o += al256(P * sizeof(float));
    L.groups = o; o += al256((size_t)n_group * sizeof(mp_group));
    L.tiles = o; o += al256((size_t)L.max_tiles * sizeof(mp_tile));
    L.total = o;
    return L;
}

template <int QT, int BN, bool GATED>
bool launch(struct cuda_ctx *c, int n_tiles, int row_tiles, const mp_tile *tiles, const mp_group *groups,
            size_t row_bytes, int rows, int nb, const int *tok, const int8_t *xq, const float *xd, float *out)
{
    static uint64_t opted; /* bit dev: the > 48 KB shared memory opt-in done (engine thread only) */
    size_t smem = sizeof(mp_smem<QT, BN>);
    if (c->dev < 64 && !(opted >> c->dev & 1)) {
        if (!CU(c, cudaFuncSetAttribute(moe_mma_kernel<QT, BN, GATED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem)))
            return false;
        opted |= 1ull << c->dev;
    }
    dim3 grid((unsigned)n_tiles, (unsigned)row_tiles);
    moe_mma_kernel<QT, BN, GATED><<<grid, MP_THREADS, smem, c->st>>>(tiles, groups, row_bytes, rows, nb, tok, xq, xd,
                                                                       out);
    return CU_LAUNCH(c, "moe_mma_kernel");
}

template <bool GATED>
bool product(struct cuda_ctx *c, uint32_t type, int bn, int n_tiles, int row_tiles, const mp_tile *tiles,
             const mp_group *groups, size_t row_bytes, int rows, int nb, const int *tok, const int8_t *xq,
             const float *xd, float *out)
{
    if (type == GGML_TYPE_Q8_0)
        return bn == 32 ? launch<8, 32, GATED>(c, n_tiles, row_tiles, tiles, groups, row_bytes, rows, nb, tok, xq, xd, out)
                        : launch<8, 16, GATED>(c, n_tiles, row_tiles, tiles, groups, row_bytes, rows, nb, tok, xq, xd, out);
    return bn == 32 ? launch<2, 32, GATED>(c, n_tiles, row_tiles, tiles, groups, row_bytes, rows, nb, tok, xq, xd, out)
                    : launch<2, 16, GATED>(c, n_tiles, row_tiles, tiles, groups, row_bytes, rows, nb, tok, xq, xd, out);
}

bool quantize(struct cuda_ctx *c, const float *x, int nblocks, int8_t *xq, float *xd)
{
    if (nblocks <= 0)
        return true;
    quantize_q8_kernel<true><<<(unsigned)((nblocks + 7) / 8), 256, 0, c->st>>>(x, nblocks, xq, xd);
    return CU_LAUNCH(c, "quantize_q8_kernel");
}

} // namespace

extern "C" int cuda_set_moe_grouped(int on)
{
    int old = grouped();
    grouped_on = on != 0;
    return old;
}

int cuda_moe_ffn_batch(struct cuda_ctx *c, const struct moe_batch *b, const float *x, float *y, bool add)
{
    if (!b || !b->ex || !b->off || b->n < 1 || b->k < 1 || b->n_group < 1)
        return TIDE_EINVAL;
    if (!grouped() || !shape_ok(&b->ex[x ? b->g0 : 0]))
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0;
    if (c->err)
        return c->err;
    int n = b->n, k = b->k, ng = b->n_group, g0 = b->g0, g1 = b->g1;
    size_t P = (size_t)n * k;
    if (g0 < 0 || g1 <= g0 || g1 > ng || !b->tok || !b->w || b->off[0] != 0 || (size_t)b->off[ng] != P)
        return TIDE_EINVAL;
    const struct expert_weights *e0 = &b->ex[g0];
    for (int g = g0; g < g1; g++)
        if (!same_layout(e0, &b->ex[g]) || b->off[g + 1] <= b->off[g])
            return g == g0 && b->off[g + 1] > b->off[g] ? TIDE_EUNSUPPORTED : TIDE_EINVAL;
    int E = (int)e0->gate.ne[0], F = (int)e0->gate.ne[1];
    uint32_t type = e0->gate.type;
    mp_layout L = layout(n, k, ng, E, F);
    uint8_t *ws = (uint8_t *)cuda_scratch(c, L.total);
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;

    /* tiles of this call's groups: BN 32 when they average 24 pairs or more, else 16 (the
     * width changes no result, only how much padding a tile computes) */
    int pairs = b->off[g1] - b->off[g0];
    int bn = pairs >= 24 * (g1 - g0) ? 32 : 16;
    int n_tiles = 0;
    for (int g = g0; g < g1; g++)
        n_tiles += (b->off[g + 1] - b->off[g] + bn - 1) / bn;
    if (n_tiles > L.max_tiles)
        return TIDE_EINTERNAL;
    /* host-built arguments, one copy on the op stream: the pageable source is staged before
     * cudaMemcpyAsync returns, so it is freed at once, and stream order keeps the device copy
     * from being overwritten before earlier kernels (a previous call) have read it */
    bool first = g0 == 0;
    size_t a0 = first ? L.tok : L.groups, abytes = L.total - a0;
    uint8_t *hbuf = (uint8_t *)calloc(1, abytes);
    if (!hbuf)
        return TIDE_ENOMEM;
    if (first) {
        int *tok = (int *)(hbuf + (L.tok - a0)), *tpos = (int *)(hbuf + (L.tpos - a0));
        float *tw = (float *)(hbuf + (L.tw - a0));
        int *fill = (int *)calloc((size_t)n, sizeof(int));
        if (!fill) {
            free(hbuf);
            return TIDE_ENOMEM;
        }
        memcpy(tok, b->tok, P * sizeof(int));
        bool ok = true;
        for (size_t p = 0; p < P && ok; p++) { /* each token's pairs in ascending pair order */
            int t = b->tok[p];
            ok = t >= 0 && t < n && fill[t] < k;
            if (ok) {
                tpos[(size_t)t * k + fill[t]] = (int)p;
                tw[(size_t)t * k + fill[t]++] = b->w[p];
            }
        }
        free(fill);
        if (!ok) {
            free(hbuf);
            return TIDE_EINVAL;
        }
    }
    mp_group *grp = (mp_group *)(hbuf + (L.groups - a0));
    mp_tile *til = (mp_tile *)(hbuf + (L.tiles - a0));
    for (int g = g0, i = 0; g < g1; g++) {
        grp[g] = mp_group{{(const uint8_t *)b->ex[g].gate.data, (const uint8_t *)b->ex[g].up.data,
                           (const uint8_t *)b->ex[g].down.data}};
        for (int p = b->off[g]; p < b->off[g + 1]; p += bn)
            til[i++] = mp_tile{g, p, b->off[g + 1] - p < bn ? b->off[g + 1] - p : bn};
    }
    bool ok = CU(c, cudaMemcpyAsync(ws + a0, hbuf, abytes, cudaMemcpyHostToDevice, c->st));
    free(hbuf);
    if (!ok)
        return c->err;

    int8_t *xq = (int8_t *)(ws + L.xq), *hq = (int8_t *)(ws + L.hq);
    float *xd = (float *)(ws + L.xd), *h = (float *)(ws + L.h), *hd = (float *)(ws + L.hd);
    float *yrow = (float *)(ws + L.yrow);
    const mp_tile *tiles = (const mp_tile *)(ws + L.tiles);
    const mp_group *groups = (const mp_group *)(ws + L.groups);
    const int *tokd = (const int *)(ws + L.tok);
    int nbE = E / QK, nbF = F / QK;
    size_t p0 = (size_t)b->off[g0];
    ok = (!first || quantize(c, x, n * nbE, xq, xd)) &&
         product<true>(c, type, bn, n_tiles, (F + MP_BM / 2 - 1) / (MP_BM / 2), tiles, groups, e0->gate.row_bytes, F,
                       nbE, tokd, xq, xd, h) &&
         quantize(c, h + p0 * F, pairs * nbF, hq + p0 * F, hd + p0 * nbF) &&
         product<false>(c, type, bn, n_tiles, (E + MP_BM - 1) / MP_BM, tiles, groups, e0->down.row_bytes, E, nbF,
                        tokd, hq, hd, yrow);
    if (ok && g1 == ng) {
        mp_combine_kernel<<<(unsigned)n, 256, 0, c->st>>>(yrow, (const int *)(ws + L.tpos), (const float *)(ws + L.tw),
                                                          k, E, y, add);
        ok = CU_LAUNCH(c, "mp_combine_kernel");
    }
    return ok ? 0 : c->err;
}
