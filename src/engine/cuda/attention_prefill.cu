/* attention_prefill.cu - causal attention for a chunk of n query tokens in one launch, GQA.
 *
 * Flash-style: a CTA takes a tile of query rows that share one kv head - FA_ROWS rows, each a
 * (token, query head) pair, bt tokens x gz heads of the group - and walks the keys 0..its last
 * token's position in tiles of FA_BK. Each K and V tile is read from global memory once into
 * shared memory for all rows of the CTA (all heads of the group and all tokens of the tile), and
 * the softmax is online: per row a running max m and sum l, the output rescaled by exp(m_old -
 * m_new) when the max grows, so no (rows, keys) score matrix is ever stored. The K/V rows of the
 * chunk are already in the cache; token t of the chunk (position pos + t) sees keys 0..pos + t.
 *
 * Threads: 256, thread (rg, cl) = (tid / 8, tid % 8) owns rows 2rg and 2rg+1 in both phases:
 * in Q K^T it computes their scores against keys cl, cl+8, cl+16, cl+24 of the tile, in P V
 * their output dims cl, cl+8, ... So the row statistics (m, l) live in the registers of the
 * 8 lanes of a row group, reduced with three shuffles, and need no shared memory.
 *
 * f32 throughout (the KV cache is f32): the scores are the CPU's dot products in another
 * summation order, so results agree to rounding (tested at 1e-4), not bit for bit.
 *
 * Head dims of 64 and 128 (every common model) take attn_prefill_mma_kernel below instead: the
 * same rows per CTA on the f16 tensor cores (f32 accumulators, f32 softmax), 4-5x the f32
 * kernel's speed on 512-token Qwen3-30B-A3B chunks (H200); q, K, V and the probabilities are rounded to f16
 * on the way in (2^-11 relative), so it agrees with the CPU to ~1e-3 (tested at 3e-3).
 * TIDE_ATTN_MMA=0 in the environment (or cuda_set_attn_mma(0)) keeps the f32 kernel.
 *
 * An f16 KV cache (backend_i.attention_f16): both kernels with T = __half, the rows widened as
 * they are read (exact), the rest as with f32 rows; the tensor-core form rounds them to f16
 * anyway, so there the cache's type changes nothing but the bytes read.
 *
 * A paged cache (backend_i.attention_paged): kc, vc are a layer's block pools and tab the
 * sequence's block table (common.cuh's kv_pages); a key row's address goes through the table
 * as the tile is loaded, and nothing else changes. tab NULL: the rows are contiguous. A flag, not
 * a template: the lookup is one cached load a row next to a tile's worth of products. */
#include "engine/cuda/attention.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Element offset of key p's row in the cache (contiguous) or pool (paged). */
__device__ __forceinline__ size_t key_row(const int32_t *tab, int shift, int p, size_t kvd)
{
    return (tab ? kv_page_row(tab, shift, p) : (size_t)p) * kvd;
}

#define FA_ROWS 64     /* query rows per CTA */
#define FA_BK 32       /* keys per tile */
#define FA_THREADS 256 /* = FA_ROWS / 2 row groups x 8 lanes */

/* NI: output dims per thread in P V, head_dim <= 8 * NI. */
template <int NI, typename T>
__global__ void __launch_bounds__(FA_THREADS)
attn_prefill_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                    float *__restrict__ out, int n, int pos, int n_head_kv, int group, int gz, int bt, int hd,
                    float scale, const int32_t *tab, int shift)
{
    extern __shared__ float sm[];
    const int ld = hd + 1;          /* padded row stride: the rows a warp reads fall in distinct banks */
    const int lp = FA_BK + 1;
    float *qs = sm;                 /* (FA_ROWS, ld) this CTA's queries */
    float *ks = qs + FA_ROWS * ld;  /* (FA_BK, ld) key tile */
    float *vs = ks + FA_BK * ld;    /* (FA_BK, ld) value tile */
    float *ps = vs + FA_BK * ld;    /* (FA_ROWS, lp) probabilities of the tile */
    int kvh = blockIdx.x, t0 = blockIdx.y * bt, g0 = blockIdx.z * gz;
    int G = group - g0 < gz ? group - g0 : gz;
    int nt = n - t0 < bt ? n - t0 : bt;
    int rows = nt * G; /* row r = (token t0 + r / G, head kvh * group + g0 + r % G) */
    size_t qd = (size_t)n_head_kv * group * hd, kvd = (size_t)n_head_kv * hd;
    int tid = threadIdx.x, rg = tid >> 3, cl = tid & 7;
    int r0 = 2 * rg, r1 = r0 + 1;

    for (int i = tid; i < FA_ROWS * hd; i += FA_THREADS) {
        int r = i / hd, d = i - r * hd;
        float v = 0.0f;
        if (r < rows)
            v = q[(size_t)(t0 + r / G) * qd + (size_t)(kvh * group + g0 + r % G) * hd + d];
        qs[r * ld + d] = v;
    }
    /* the last key each row may see; -1 for padding rows (they see none) */
    int qp0 = r0 < rows ? pos + t0 + r0 / G : -1;
    int qp1 = r1 < rows ? pos + t0 + r1 / G : -1;
    int n_keys = pos + t0 + nt;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o0[NI], o1[NI];
#pragma unroll
    for (int i = 0; i < NI; i++)
        o0[i] = o1[i] = 0.0f;

    for (int k0 = 0; k0 < n_keys; k0 += FA_BK) {
        __syncthreads(); /* the last tile's P V is done with ks, vs, ps (and qs is stored) */
        for (int i = tid; i < FA_BK * hd; i += FA_THREADS) {
            int j = i / hd, d = i - j * hd;
            /* keys past the chunk's last are zero, not whatever the cache holds there (a NaN
             * there times p = 0 would still be NaN) */
            bool ok = k0 + j < n_keys; /* (and a table has no entry past them) */
            size_t off = ok ? key_row(tab, shift, k0 + j, kvd) + (size_t)kvh * hd + d : 0;
            ks[j * ld + d] = ok ? kv_load(kc + off) : 0.0f;
            vs[j * ld + d] = ok ? kv_load(vc + off) : 0.0f;
        }
        __syncthreads();

        float s0[4], s1[4];
#pragma unroll
        for (int c = 0; c < 4; c++)
            s0[c] = s1[c] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < hd; d++) {
            float a = qs[r0 * ld + d], b = qs[r1 * ld + d];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float k = ks[(cl + 8 * c) * ld + d];
                s0[c] = fmaf(a, k, s0[c]);
                s1[c] = fmaf(b, k, s1[c]);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int j = k0 + cl + 8 * c;
            s0[c] = j <= qp0 ? s0[c] * scale : -INFINITY;
            s1[c] = j <= qp1 ? s1[c] * scale : -INFINITY;
            mx0 = fmaxf(mx0, s0[c]);
            mx1 = fmaxf(mx1, s1[c]);
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) { /* the 8 lanes of a row group are adjacent */
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
        }
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        /* a row that has seen no key yet keeps m = -inf: exp(-inf - -inf) would be NaN */
        float a0 = mn0 == -INFINITY ? 1.0f : expf(m0 - mn0);
        float a1 = mn1 == -INFINITY ? 1.0f : expf(m1 - mn1);
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float p0 = mn0 == -INFINITY ? 0.0f : expf(s0[c] - mn0);
            float p1 = mn1 == -INFINITY ? 0.0f : expf(s1[c] - mn1);
            ps[r0 * lp + cl + 8 * c] = p0;
            ps[r1 * lp + cl + 8 * c] = p1;
            sum0 += p0;
            sum1 += p1;
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            sum0 += __shfl_xor_sync(0xffffffffu, sum0, o);
            sum1 += __shfl_xor_sync(0xffffffffu, sum1, o);
        }
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            o0[i] *= a0;
            o1[i] *= a1;
        }
        __syncthreads(); /* ps complete (each row's P was written by its 8 lanes only, but be plain) */

        int jn = n_keys - k0 < FA_BK ? n_keys - k0 : FA_BK;
        for (int j = 0; j < jn; j++) {
            float p0 = ps[r0 * lp + j], p1 = ps[r1 * lp + j];
#pragma unroll
            for (int i = 0; i < NI; i++) {
                int d = cl + 8 * i;
                float v = 8 * NI == hd || d < hd ? vs[j * ld + d] : 0.0f;
                o0[i] = fmaf(p0, v, o0[i]);
                o1[i] = fmaf(p1, v, o1[i]);
            }
        }
    }

    if (r0 < rows) {
        float inv = 1.0f / l0;
        float *o = out + (size_t)(t0 + r0 / G) * qd + (size_t)(kvh * group + g0 + r0 % G) * hd;
#pragma unroll
        for (int i = 0; i < NI; i++)
            if (cl + 8 * i < hd)
                o[cl + 8 * i] = o0[i] * inv;
    }
    if (r1 < rows) {
        float inv = 1.0f / l1;
        float *o = out + (size_t)(t0 + r1 / G) * qd + (size_t)(kvh * group + g0 + r1 % G) * hd;
#pragma unroll
        for (int i = 0; i < NI; i++)
            if (cl + 8 * i < hd)
                o[cl + 8 * i] = o1[i] * inv;
    }
}

/* ---- the tensor-core form: 64 query rows x 64-key tiles, 4 warps of 16 rows ----
 *
 * S = Q K^T and O += P V as mma.sync m16n8k16 (f16 in, f32 out). Fragment layout (PTX ISA,
 * "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4: A a0 = (row g, k 2t..2t+1),
 * a1 = (row g+8, same k), a2/a3 = the same rows at k + 8; B b0 = (k 2t..2t+1, column g),
 * b1 = k + 8; C c0,c1 = (row g, columns 2t, 2t+1), c2,c3 = row g+8. A warp's S accumulators
 * for keys 16kk..16kk+15 are then exactly its A fragment of P for that k step (FlashAttention-2's
 * register reuse), so P never goes through shared memory. K is kept [key][d] and V transposed
 * [d][key] in shared memory, both as f16 with rows padded to 4 mod 32 words, so every B
 * fragment is one conflict-free 32-bit load. Q's fragments stay in registers. */
#define TA_ROWS 64
#define TA_BK 64
#define TA_THREADS 128
/* the grid is cut as attn_prefill_kernel's (FA_ROWS rows a CTA), a warp takes 16 of them */
static_assert(TA_ROWS == FA_ROWS && TA_ROWS == 16 * (TA_THREADS / 32), "rows per CTA");

static int attn_mma_on = -1; /* -1: TIDE_ATTN_MMA not read yet */

extern "C" int cuda_set_attn_mma(int on)
{
    if (attn_mma_on < 0) {
        const char *e = getenv("TIDE_ATTN_MMA");
        attn_mma_on = !(e && !strcmp(e, "0"));
    }
    int old = attn_mma_on;
    if (on >= 0)
        attn_mma_on = on != 0;
    return old;
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b)
{
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* d += A(16x16) B(16x8), f16 in, f32 accumulate */
__device__ __forceinline__ void mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* grid and rows as attn_prefill_kernel's (row r = token t0 + r / G, head kvh * group + g0 +
 * r % G); scale2 = scale * log2(e), the softmax taken in base 2. */
template <int HD, typename T>
__global__ void __launch_bounds__(TA_THREADS)
attn_prefill_mma_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                        float *__restrict__ out, int n, int pos, int n_head_kv, int group, int gz, int bt,
                        float scale2, const int32_t *tab, int shift)
{
    constexpr int KS = HD / 16;     /* k steps of Q K^T */
    constexpr int DT = HD / 8;      /* 8-wide output column tiles */
    constexpr int NT = TA_BK / 8;   /* 8-key score tiles */
    constexpr int KLD = HD + 8;     /* halves a key row of ks: HD / 2 + 4 words */
    constexpr int VLD = TA_BK + 8;  /* halves a d row of vt: 36 words */
    __shared__ __align__(16) __half ks[TA_BK * KLD];
    __shared__ __align__(16) __half vt[HD * VLD];
    int kvh = blockIdx.x, t0 = blockIdx.y * bt, g0 = blockIdx.z * gz;
    int G = group - g0 < gz ? group - g0 : gz;
    int nt = n - t0 < bt ? n - t0 : bt;
    int rows = nt * G;
    size_t qd = (size_t)n_head_kv * group * HD, kvd = (size_t)n_head_kv * HD;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int rr[2] = {warp * 16 + g, warp * 16 + g + 8}; /* this thread's rows: c0/c1 and c2/c3 */
    int qp[2];                                      /* the last key each may see (-1: padding) */
    const float *qr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bool ok = rr[h] < rows;
        qp[h] = ok ? pos + t0 + rr[h] / G : -1;
        qr[h] = ok ? q + (size_t)(t0 + rr[h] / G) * qd + (size_t)(kvh * group + g0 + rr[h] % G) * HD : nullptr;
    }
    uint32_t qa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; k++)
#pragma unroll
        for (int f = 0; f < 4; f++) { /* a0: row 0, d; a1: row 1, d; a2 / a3: d + 8 */
            const float *p = qr[f & 1];
            float2 v = p ? *(const float2 *)(p + k * 16 + 2 * t + (f >> 1) * 8) : make_float2(0.0f, 0.0f);
            qa[k][f] = pack_half2(v.x, v.y);
        }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this thread's share of the row sum */
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    int n_keys = pos + t0 + nt;

    for (int k0 = 0; k0 < n_keys; k0 += TA_BK) {
        __syncthreads(); /* the last tile's P V is done with ks and vt */
        /* K: a warp reads whole key rows (d fastest); V: consecutive keys of one d quad, so the
         * transposed f16 stores of a warp fill consecutive halves. Keys past the chunk's last
         * are zero, not whatever the cache holds (NaN times p = 0 is NaN). */
        for (int i = tid; i < TA_BK * HD / 4; i += TA_THREADS) {
            int j = i / (HD / 4), d4 = (i % (HD / 4)) * 4;
            float4 kv = k0 + j < n_keys ? kv_load4(kc + key_row(tab, shift, k0 + j, kvd) + (size_t)kvh * HD + d4)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(uint2 *)&ks[j * KLD + d4] = make_uint2(pack_half2(kv.x, kv.y), pack_half2(kv.z, kv.w));
            int jv = i % TA_BK, dv = (i / TA_BK) * 4;
            float4 vv = k0 + jv < n_keys ? kv_load4(vc + key_row(tab, shift, k0 + jv, kvd) + (size_t)kvh * HD + dv)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vt[(dv + 0) * VLD + jv] = __float2half_rn(vv.x);
            vt[(dv + 1) * VLD + jv] = __float2half_rn(vv.y);
            vt[(dv + 2) * VLD + jv] = __float2half_rn(vv.z);
            vt[(dv + 3) * VLD + jv] = __float2half_rn(vv.w);
        }
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const uint32_t *kr = (const uint32_t *)&ks[(j * 8 + g) * KLD];
#pragma unroll
            for (int k = 0; k < KS; k++)
                mma_f16(s[j], qa[k], kr[k * 8 + t], kr[k * 8 + 4 + t]);
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1);
                s[j][e] = key <= qp[e >> 1] ? s[j][e] * scale2 : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float alpha[2], mn[2];
#pragma unroll
        for (int h = 0; h < 2; h++) { /* the 4 lanes of a row are adjacent */
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            mn[h] = fmaxf(m[h], mx[h]);
            /* a row that has seen no key yet keeps m = -inf: exp(-inf - -inf) would be NaN */
            alpha[h] = mn[h] == -INFINITY ? 1.0f : exp2f(m[h] - mn[h]);
            m[h] = mn[h];
            l[h] *= alpha[h];
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = mn[e >> 1] == -INFINITY ? 0.0f : exp2f(s[j][e] - mn[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= alpha[0], o[d][1] *= alpha[0];
            o[d][2] *= alpha[1], o[d][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < TA_BK / 16; kk++) {
            uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                              pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const uint32_t *vr = (const uint32_t *)&vt[(d * 8 + g) * VLD];
                mma_f16(o[d], pa, vr[kk * 8 + t], vr[kk * 8 + 4 + t]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        if (rr[h] >= rows)
            continue;
        float inv = 1.0f / l[h];
        float *orow = out + (size_t)(t0 + rr[h] / G) * qd + (size_t)(kvh * group + g0 + rr[h] % G) * HD;
#pragma unroll
        for (int d = 0; d < DT; d++)
            *(float2 *)(orow + d * 8 + 2 * t) = make_float2(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
    }
}

bool cuda_attention_prefill(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                            float *out, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    return cuda_attention_prefill_pg(c, q, k_cache, v_cache, f16, out, n, pos, n_head, n_head_kv, head_dim, kv_pages{});
}

bool cuda_attention_prefill_pg(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache,
                               bool f16, float *out, int n, int pos, int n_head, int n_head_kv, int head_dim,
                               kv_pages pg)
{
    if (c->err || n <= 0 || pos < 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 ||
        head_dim > 256)
        return false;
    int group = n_head / n_head_kv;
    int gz = group < FA_ROWS ? group : FA_ROWS; /* heads per CTA */
    int bt = FA_ROWS / gz;                      /* tokens per CTA */
    int zgroups = (group + gz - 1) / gz;
    long ty = ((long)n + bt - 1) / bt;
    if (ty > 65535 || zgroups > 65535)
        return false;
    if (cuda_set_attn_mma(-1) && (head_dim == 64 || head_dim == 128)) {
        float scale2 = 1.4426950408889634f / sqrtf((float)head_dim);
        dim3 grid((unsigned)n_head_kv, (unsigned)ty, (unsigned)zgroups);
        const __half *kh = (const __half *)k_cache, *vh = (const __half *)v_cache;
        const float *kf = (const float *)k_cache, *vf = (const float *)v_cache;
        if (head_dim == 128 && f16)
            attn_prefill_mma_kernel<128, __half>
                <<<grid, TA_THREADS, 0, c->st>>>(q, kh, vh, out, n, pos, n_head_kv, group, gz, bt, scale2, pg.tables,
                                                  pg.shift);
        else if (head_dim == 128)
            attn_prefill_mma_kernel<128, float>
                <<<grid, TA_THREADS, 0, c->st>>>(q, kf, vf, out, n, pos, n_head_kv, group, gz, bt, scale2, pg.tables,
                                                  pg.shift);
        else if (f16)
            attn_prefill_mma_kernel<64, __half>
                <<<grid, TA_THREADS, 0, c->st>>>(q, kh, vh, out, n, pos, n_head_kv, group, gz, bt, scale2, pg.tables,
                                                  pg.shift);
        else
            attn_prefill_mma_kernel<64, float>
                <<<grid, TA_THREADS, 0, c->st>>>(q, kf, vf, out, n, pos, n_head_kv, group, gz, bt, scale2, pg.tables,
                                                  pg.shift);
        CU_LAUNCH(c, "attn_prefill_mma_kernel");
        return true;
    }
    int ni = (head_dim + 7) / 8;
    ni = ni <= 4 ? 4 : ni <= 8 ? 8 : ni <= 16 ? 16 : 32;
    size_t smem = ((size_t)(FA_ROWS + 2 * FA_BK) * (head_dim + 1) + (size_t)FA_ROWS * (FA_BK + 1)) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)ty, (unsigned)zgroups);
#define FA_LAUNCH_T(NI, T)                                                                                     \
    do {                                                                                                       \
        if (smem > 48 * 1024 &&                                                                                \
            !CU(c, cudaFuncSetAttribute(attn_prefill_kernel<NI, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)smem)))                                                           \
            return true; /* the error is kept in c */                                                        \
        attn_prefill_kernel<NI, T><<<grid, FA_THREADS, smem, c->st>>>(                                         \
            q, (const T *)k_cache, (const T *)v_cache, out, n, pos, n_head_kv, group, gz, bt, head_dim, scale,   \
            pg.tables, pg.shift);                                                                              \
    } while (0)
#define FA_LAUNCH(NI)                  \
    do {                               \
        if (f16)                       \
            FA_LAUNCH_T(NI, __half);   \
        else                           \
            FA_LAUNCH_T(NI, float);    \
    } while (0)
    switch (ni) {
    case 4: FA_LAUNCH(4); break;
    case 8: FA_LAUNCH(8); break;
    case 16: FA_LAUNCH(16); break;
    default: FA_LAUNCH(32); break;
    }
#undef FA_LAUNCH
#undef FA_LAUNCH_T
    CU_LAUNCH(c, "attn_prefill_kernel");
    return true;
}
