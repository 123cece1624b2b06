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
 * summation order, so results agree to rounding (tested at 1e-4), not bit for bit. */
#include "engine/cuda/common.cuh"

#include <math.h>

#define FA_ROWS 64     /* query rows per CTA */
#define FA_BK 32       /* keys per tile */
#define FA_THREADS 256 /* = FA_ROWS / 2 row groups x 8 lanes */

/* NI: output dims per thread in P V, head_dim <= 8 * NI. */
template <int NI>
__global__ void __launch_bounds__(FA_THREADS)
attn_prefill_kernel(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
                    float *__restrict__ out, int n, int pos, int n_head_kv, int group, int gz, int bt, int hd,
                    float scale)
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
            bool ok = k0 + j < n_keys;
            size_t off = (size_t)(k0 + j) * kvd + (size_t)kvh * hd + d;
            ks[j * ld + d] = ok ? __ldg(kc + off) : 0.0f;
            vs[j * ld + d] = ok ? __ldg(vc + off) : 0.0f;
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

bool cuda_attention_prefill(struct cuda_ctx *c, const float *q, const float *k_cache, const float *v_cache,
                            float *out, int n, int pos, int n_head, int n_head_kv, int head_dim)
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
    int ni = (head_dim + 7) / 8;
    ni = ni <= 4 ? 4 : ni <= 8 ? 8 : ni <= 16 ? 16 : 32;
    size_t smem = ((size_t)(FA_ROWS + 2 * FA_BK) * (head_dim + 1) + (size_t)FA_ROWS * (FA_BK + 1)) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)ty, (unsigned)zgroups);
#define FA_LAUNCH(NI)                                                                                       \
    do {                                                                                                    \
        if (smem > 48 * 1024 &&                                                                             \
            !CU(c, cudaFuncSetAttribute(attn_prefill_kernel<NI>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)smem)))                                                        \
            return true; /* the error is kept in c */                                                     \
        attn_prefill_kernel<NI><<<grid, FA_THREADS, smem, c->st>>>(q, k_cache, v_cache, out, n, pos,         \
                                                                   n_head_kv, group, gz, bt, head_dim,      \
                                                                   scale);                                  \
    } while (0)
    switch (ni) {
    case 4: FA_LAUNCH(4); break;
    case 8: FA_LAUNCH(8); break;
    case 16: FA_LAUNCH(16); break;
    default: FA_LAUNCH(32); break;
    }
#undef FA_LAUNCH
    CU_LAUNCH(c, "attn_prefill_kernel");
    return true;
}
