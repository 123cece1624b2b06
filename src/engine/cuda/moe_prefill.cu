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
 * The products walk K with mma_tile.cuh's tile_mainloop, as mmq_mma.cu's dense kernel does,
 * but never split K: each output element adds its blocks in K order. So the result is bit
 * for bit matmul's with the tensor-core kernel at every n and no split-K
 * (cuda_set_mmq_min_n(1), cuda_set_mmq_split(1)); with the defaults matmul may split K or
 * use dp4a for small groups, which sums in another order (f32 rounding differences only).
 * Since a tile's arithmetic does not depend on the tile width or on which other groups share
 * the launch, the output does not depend on how the forward splits a layer's groups into
 * calls (the cache size).
 *
 * k-quant experts (q4_K / q5_K / q6_K; down may differ from gate and up, as in Q4_K_M) are
 * grouped too unless TIDE_KQ_MMA=0 (mmq_kquant.cu): the
 * same kernels with mma_kq_tile.cuh's kqt_mainloop, which also needs each x block's
 * dx * sum(codes) for the mins (cuda_kq_xsum after each quantisation); they are bit for bit
 * the dense k-quant kernel without split-K, as above. */
#include "engine/cuda/mmq_kquant.cuh"

#include <type_traits>

extern "C" {
#include "engine/backend_cuda.h"
}

#include <stdlib.h>
#include <string.h>

namespace { /* internal linkage: the helpers mirror mmq_mma.cu's, which are local to it */

#include "engine/cuda/moe_group.cuh" /* mp_tile, mp_group, MR_BN, mr_group_kernel */

/* grid (tiles, row tiles). GATED: rows = n_ff features, K = n_embd; column c of a tile reads the
 * quantised input row of its pair's token (tok), and out = h (pairs, rows) = silu(gate) * up:
 * a CTA's 128 weight rows are 64 features' gate and up rows, interleaved by 8 (local rows
 * 16s..16s+7 gate rows of features m0 + 8s.., 16s+8.. their up rows) so that one thread's
 * c0/c1 and c2/c3 are the gate and up of the same feature. Else the down product: rows =
 * n_embd, K = n_ff, column c reads quantised h row p0 + c, and out = (pairs, rows).
 * Consecutive CTAs are consecutive tiles: a group's tiles (which share its weight tile) run
 * together, so each weight tile comes from DRAM about once. */
/* QT: 8 (q8_0), 2 (q4_0) or a k-quant type (KQ_Q4_K ..: the k-quant tiles, xs their x block
 * sums); the shared memory of either kind of tile */
template <int QT, int BN>
using mp_smem = std::conditional_t<kq_type(QT), kqt_smem<QT, BN>, tile_smem<QT, BN>>;

template <int QT, int BN, bool GATED>
__global__ void __launch_bounds__(TILE_THREADS, 2)
moe_mma_kernel(const mp_tile *__restrict__ tiles, const mp_group *__restrict__ groups, size_t row_bytes, int rows,
               int nb, const int *__restrict__ tok, const int8_t *__restrict__ xq, const float *__restrict__ xd,
               const float *__restrict__ xs, float *__restrict__ out)
{
    extern __shared__ __align__(16) uint8_t smem_raw[];
    mp_smem<QT, BN> &sm = *(mp_smem<QT, BN> *)smem_raw;
    const mp_tile tl = tiles[blockIdx.x];
    if (tl.cnt <= 0) /* a decode step's tile list (cuda_moe_rows_grouped) has a tile per expert, used or not */
        return;
    int m0 = blockIdx.y * (GATED ? TILE_BM / 2 : TILE_BM); /* first feature / output row */
    for (int rr = threadIdx.x; rr < TILE_BM; rr += TILE_THREADS) {
        int r = GATED ? m0 + (rr >> 4) * 8 + (rr & 7) : m0 + rr;
        const uint8_t *base = groups[tl.g].w[GATED ? (rr >> 3) & 1 : 2];
        sm.wrow[rr] = r < rows ? base + (size_t)r * row_bytes : nullptr;
    }
    for (int c = threadIdx.x; c < BN; c += TILE_THREADS)
        sm.xrow[c] = c < tl.cnt ? (GATED ? tok[tl.p0 + c] : tl.p0 + c) : -1;
    __syncthreads();
    tile_acc<BN> acc;
    if constexpr (kq_type(QT))
        kqt_mainloop<QT, BN>(sm, nb, xq, xd, xs, 0, nb / KQT_KB, acc);
    else
        tile_mainloop<QT, BN>(sm, nb, xq, xd, 0, nb / TILE_KB, acc);

#pragma unroll
    for (int i = 0; i < tile_acc<BN>::MI; i++)
#pragma unroll
        for (int j = 0; j < tile_acc<BN>::NJ; j++) {
            int c0 = tile_col<BN>(j, 0), c1 = c0 + 1;
            if (GATED) { /* c0/c1: gate of feature f, c2/c3: its up (local row + 8) */
                int lr = tile_row(i, 0), f = m0 + (lr >> 4) * 8 + (lr & 7);
                if (f < rows) {
                    float g0 = acc.v[i][j][0], g1 = acc.v[i][j][1];
                    /* swiglu_kernel's expression */
                    if (c0 < tl.cnt) out[(size_t)(tl.p0 + c0) * rows + f] = g0 / (1.0f + expf(-g0)) * acc.v[i][j][2];
                    if (c1 < tl.cnt) out[(size_t)(tl.p0 + c1) * rows + f] = g1 / (1.0f + expf(-g1)) * acc.v[i][j][3];
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = m0 + tile_row(i, e), cc = tile_col<BN>(j, e);
                    if (r < rows && cc < tl.cnt)
                        out[(size_t)(tl.p0 + cc) * rows + r] = acc.v[i][j][e];
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
 * one type, whole blocks, K of both products whole tile stages (tile_shape_ok); or, with the
 * k-quant tiles on, k-quant gate and up of one type and a k-quant down, whole super-blocks
 * (kqt_shape_ok). */
bool shape_ok(const struct expert_weights *e)
{
    uint32_t T = e->gate.type, TD = e->down.type;
    bool kq = cuda_kq_mma_on() && kq_type(T) && kq_type(TD);
    if ((!kq && ((T != GGML_TYPE_Q8_0 && T != GGML_TYPE_Q4_0) || TD != T)) || e->up.type != T)
        return false;
    int64_t E = e->gate.ne[0], F = e->gate.ne[1];
    if (E <= 0 || F <= 0 || E % QK || F % QK || e->up.ne[0] != E || e->up.ne[1] != F || e->down.ne[0] != F ||
        e->down.ne[1] != E)
        return false;
    if (kq)
        return kqt_shape_ok((int)T, e->gate.data, e->gate.row_bytes, (int)(E / QK)) &&
               kqt_shape_ok((int)T, e->up.data, e->up.row_bytes, (int)(E / QK)) &&
               kqt_shape_ok((int)TD, e->down.data, e->down.row_bytes, (int)(F / QK));
    size_t blk = T == GGML_TYPE_Q8_0 ? 34 : 18;
    return e->gate.row_bytes == (size_t)(E / QK) * blk && e->up.row_bytes == e->gate.row_bytes &&
           e->down.row_bytes == (size_t)(F / QK) * blk && tile_shape_ok(e->gate.data, e->gate.row_bytes, (int)(E / QK)) &&
           tile_shape_ok(e->up.data, e->up.row_bytes, (int)(E / QK)) &&
           tile_shape_ok(e->down.data, e->down.row_bytes, (int)(F / QK));
}

bool same_layout(const struct expert_weights *a, const struct expert_weights *b)
{
    const struct tensor *ta[3] = {&a->gate, &a->up, &a->down}, *tb[3] = {&b->gate, &b->up, &b->down};
    for (int m = 0; m < 3; m++)
        if (ta[m]->type != tb[m]->type || ta[m]->ne[0] != tb[m]->ne[0] || ta[m]->ne[1] != tb[m]->ne[1] ||
            ta[m]->row_bytes != tb[m]->row_bytes || ((uintptr_t)tb[m]->data & 7))
            return false;
    return true;
}

size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The scratch of one layer's calls, carved the same way by every call (sizes depend only on
 * n, k, n_group and the shape): quantised input, swiglu rows, their quantised form, the
 * per-pair down rows, then the host-built arguments. */
struct mp_layout {
    size_t xq, xd, xs, h, hq, hd, hs, yrow, tok, tpos, tw, groups, tiles, total;
    int max_tiles;
};

mp_layout layout(int n, int k, int n_group, int E, int F)
{
    mp_layout L;
    size_t P = (size_t)n * k, o = 0;
    L.max_tiles = (int)(P / 16) + n_group; /* the narrowest tiles (16) of every group */
    L.xq = o; o += al256((size_t)n * E);
    L.xd = o; o += al256((size_t)n * (E / QK) * sizeof(float));
    L.xs = o; o += al256((size_t)n * (E / QK) * sizeof(float)); /* k-quant tiles: x's block sums */
    L.h = o; o += al256(P * F * sizeof(float));
    L.hq = o; o += al256(P * F);
    L.hd = o; o += al256(P * (F / QK) * sizeof(float));
    L.hs = o; o += al256(P * (F / QK) * sizeof(float));
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
            size_t row_bytes, int rows, int nb, const int *tok, const int8_t *xq, const float *xd, const float *xs,
            float *out)
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
    moe_mma_kernel<QT, BN, GATED><<<grid, TILE_THREADS, smem, c->st>>>(tiles, groups, row_bytes, rows, nb, tok, xq, xd,
                                                                       xs, out);
    return CU_LAUNCH(c, "moe_mma_kernel");
}

template <bool GATED>
bool product(struct cuda_ctx *c, uint32_t type, int bn, int n_tiles, int row_tiles, const mp_tile *tiles,
             const mp_group *groups, size_t row_bytes, int rows, int nb, const int *tok, const int8_t *xq,
             const float *xd, const float *xs, float *out)
{
#define MP_LAUNCH(QT, BN) \
    launch<QT, BN, GATED>(c, n_tiles, row_tiles, tiles, groups, row_bytes, rows, nb, tok, xq, xd, xs, out)
#define MP_TYPE(QT) return bn == 64 ? MP_LAUNCH(QT, 64) : bn == 32 ? MP_LAUNCH(QT, 32) : MP_LAUNCH(QT, 16)
    switch (type) {
    case GGML_TYPE_Q8_0: MP_TYPE(8);
    case GGML_TYPE_Q4_K: MP_TYPE(KQ_Q4_K);
    case GGML_TYPE_Q5_K: MP_TYPE(KQ_Q5_K);
    case GGML_TYPE_Q6_K: MP_TYPE(KQ_Q6_K);
    default: MP_TYPE(2);
    }
#undef MP_TYPE
#undef MP_LAUNCH
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
    uint32_t type = e0->gate.type, type_d = e0->down.type;
    /* q4_K / q5_K tiles also read x's block sums (their mins) */
    bool sums = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
    bool sums_d = type_d == GGML_TYPE_Q4_K || type_d == GGML_TYPE_Q5_K;
    mp_layout L = layout(n, k, ng, E, F);
    uint8_t *ws = (uint8_t *)cuda_scratch(c, L.total);
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;

    /* tiles of this call's groups: BN 64 when they average 48 pairs or more, 32 from 24, else
     * 16 (the width changes no result, only how much padding a tile computes) */
    int pairs = b->off[g1] - b->off[g0];
    int bn = pairs >= 48 * (g1 - g0) ? 64 : pairs >= 24 * (g1 - g0) ? 32 : 16;
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
    float *xs = (float *)(ws + L.xs), *hs = (float *)(ws + L.hs);
    float *yrow = (float *)(ws + L.yrow);
    const mp_tile *tiles = (const mp_tile *)(ws + L.tiles);
    const mp_group *groups = (const mp_group *)(ws + L.groups);
    const int *tokd = (const int *)(ws + L.tok);
    int nbE = E / QK, nbF = F / QK;
    size_t p0 = (size_t)b->off[g0];
    ok = (!first || (quantize(c, x, n * nbE, xq, xd) && (!sums || cuda_kq_xsum(c, xq, xd, n * nbE, xs)))) &&
         product<true>(c, type, bn, n_tiles, (F + TILE_BM / 2 - 1) / (TILE_BM / 2), tiles, groups, e0->gate.row_bytes, F,
                       nbE, tokd, xq, xd, xs, h) &&
         quantize(c, h + p0 * F, pairs * nbF, hq + p0 * F, hd + p0 * nbF) &&
         (!sums_d || cuda_kq_xsum(c, hq + p0 * F, hd + p0 * nbF, pairs * nbF, hs + p0 * nbF)) &&
         product<false>(c, type_d, bn, n_tiles, (E + TILE_BM - 1) / TILE_BM, tiles, groups, e0->down.row_bytes, E, nbF,
                        tokd, hq, hd, hs, yrow);
    if (ok && g1 == ng) {
        mp_combine_kernel<<<(unsigned)n, 256, 0, c->st>>>(yrow, (const int *)(ws + L.tpos), (const float *)(ws + L.tw),
                                                          k, E, y, add);
        ok = CU_LAUNCH(c, "mp_combine_kernel");
    }
    return ok ? 0 : c->err;
}

/* ---- a decode step's MoE on the same tiles, grouped on the device (TIDE_MOE_ROWS_MMA=1) ----
 *
 * moe_rows.cu's kernels dot each expert row with a step's few tokens on the CUDA cores, at ~1.5
 * TB/s on one H200 (bench_moe_rows: 170 / 372 us a layer at 8 / 32 tokens). Here the step's
 * routing (already on the device) is turned into moe_ffn_batch's arguments by one small kernel,
 * and the prefill's grouped tensor-core products stream each chosen expert's weights through
 * cp.async stages as they do for a prompt: no wait for the host, the same launches whatever the
 * routing. The tile list has ceil(n / 16) tiles of 16 pairs for every expert; those of experts
 * nobody chose (and the tails past an expert's pairs) have no pairs and return at once.
 * A token's pairs are combined in ascending expert order, as moe_ffn_batch's and the CPU's.
 * On unless TIDE_MOE_ROWS_MMA=0 (or cuda_set_moe_rows_mma(0)): it passed test-gpu moe_rows_mma on an
 * H100, and the daemon's 8- and 32-client runs there were measured with it on. Alone, bench_moe_rows
 * put it behind moe_rows.cu at 8 rows (193 against 174 us a layer), even at 32, ahead at 64. */

namespace {

int rows_mma_on = -1;

bool rows_mma(void)
{
    if (rows_mma_on < 0) {
        const char *e = getenv("TIDE_MOE_ROWS_MMA");
        rows_mma_on = !(e && !strcmp(e, "0"));
    }
    return rows_mma_on != 0;
}

} // namespace

extern "C" int cuda_set_moe_rows_mma(int on)
{
    int old = rows_mma();
    if (on >= 0)
        rows_mma_on = on != 0;
    return old;
}

int cuda_moe_rows_grouped(struct cuda_ctx *c, const struct expert_weights *shape, const void *const *table,
                          const int32_t *routed, int n, int k, int n_expert, const float *x, float *y, bool add)
{
    /* the weights are the table's (expert cache slots, 256-byte aligned), not the shape's view's */
    struct expert_weights sh = *shape;
    sh.gate.data = sh.up.data = sh.down.data = NULL;
    if (!rows_mma() || !shape_ok(&sh) || n < 1 || k < 1 || n_expert < 1 || n_expert > 1024)
        return TIDE_EUNSUPPORTED;
    if (!x)
        return 0;
    if (c->err)
        return c->err;
    int E = (int)shape->gate.ne[0], F = (int)shape->gate.ne[1], T = (n + MR_BN - 1) / MR_BN;
    uint32_t type = shape->gate.type, type_d = shape->down.type;
    bool sums = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
    bool sums_d = type_d == GGML_TYPE_Q4_K || type_d == GGML_TYPE_Q5_K;
    /* moe_ffn_batch's layout with a group per expert, then this tile list in place of its own */
    mp_layout L = layout(n, k, n_expert, E, F);
    size_t tiles_at = L.total, total = tiles_at + al256((size_t)n_expert * T * sizeof(mp_tile));
    uint8_t *ws = (uint8_t *)cuda_scratch(c, total);
    if (!ws)
        return c->err ? c->err : TIDE_ENOMEM;
    int8_t *xq = (int8_t *)(ws + L.xq), *hq = (int8_t *)(ws + L.hq);
    float *xd = (float *)(ws + L.xd), *h = (float *)(ws + L.h), *hd = (float *)(ws + L.hd);
    float *xs = (float *)(ws + L.xs), *hs = (float *)(ws + L.hs), *yrow = (float *)(ws + L.yrow);
    int *tok = (int *)(ws + L.tok), *tpos = (int *)(ws + L.tpos);
    float *tw = (float *)(ws + L.tw);
    mp_group *groups = (mp_group *)(ws + L.groups);
    mp_tile *tiles = (mp_tile *)(ws + tiles_at);
    int P = n * k, nbE = E / QK, nbF = F / QK, n_tiles = n_expert * T;
    mr_group_kernel<<<1, 256, sizeof(int) * 2 * (size_t)(n_expert + 1), c->st>>>(routed, n, k, n_expert, table, T, tok,
                                                                                 tpos, tw, groups, tiles);
    bool ok = CU_LAUNCH(c, "mr_group_kernel") && quantize(c, x, n * nbE, xq, xd) &&
              (!sums || cuda_kq_xsum(c, xq, xd, n * nbE, xs)) &&
              product<true>(c, type, MR_BN, n_tiles, (F + TILE_BM / 2 - 1) / (TILE_BM / 2), tiles, groups,
                            shape->gate.row_bytes, F, nbE, tok, xq, xd, xs, h) &&
              quantize(c, h, P * nbF, hq, hd) && (!sums_d || cuda_kq_xsum(c, hq, hd, P * nbF, hs)) &&
              product<false>(c, type_d, MR_BN, n_tiles, (E + TILE_BM - 1) / TILE_BM, tiles, groups,
                             shape->down.row_bytes, E, nbF, tok, hq, hd, hs, yrow);
    if (ok) {
        mp_combine_kernel<<<(unsigned)n, 256, 0, c->st>>>(yrow, tpos, tw, k, E, y, add);
        ok = CU_LAUNCH(c, "mp_combine_kernel");
    }
    return ok ? 0 : c->err;
}
