/* attention_decode.cuh - the device code of attention_decode.cu (the split decode attention
 * and its log-sum-exp merge; see that file for the design), moved here verbatim so that the
 * host emulation (tests/gpu/emu/attn_decode_emu.cpp, `make decode-attn-emu`) compiles this
 * very code with g++. */
#ifndef TIDE_CUDA_ATTENTION_DECODE_CUH
#define TIDE_CUDA_ATTENTION_DECODE_CUH

#include "engine/cuda/common.cuh"

#define AD_THREADS 128
#define AD_TK 16     /* keys a tile, and the shortest chunk */
#define AD_G 8       /* query heads a CTA */
#define AD_PER_SM 4  /* CTAs an SM the cut aims at (register-bound: 128 threads of <= 128 regs) */
#define AD_MERGE 128 /* threads of a merge CTA */
#define AD_BATCH 8   /* chunks a merge thread has in flight at once */

/* n_keys cut into *n_chunks chunks of *chunk keys: a multiple of the tile, at least one tile,
 * and long enough that there are at most `want` chunks (chunk >= n_keys / want). On the device
 * too (attention_at), so the grid, the chunk kernel and the merge cut alike. */
__host__ __device__ inline void ad_split(int n_keys, int want, int *chunk_o, int *n_chunks_o)
{
    int chunk = (n_keys + want - 1) / want;
    chunk = (chunk + AD_TK - 1) / AD_TK * AD_TK;
    if (chunk < AD_TK)
        chunk = AD_TK;
    *chunk_o = chunk;
    *n_chunks_o = (n_keys + chunk - 1) / chunk;
}

/* Shared-memory row strides in floats: V rows hd; K and q rows padded so that their stride in
 * 16-byte units is odd (the lanes of a score phase read 8 consecutive rows without conflicts). */
__host__ __device__ inline int ad_ks(int hd) { return (hd / 4) % 2 ? hd : hd + 4; }
/* the K and V tile, or at the end the per-split P V sums that reuse them */
__host__ __device__ inline int ad_tile_floats(int hd)
{
    int t = AD_TK * (ad_ks(hd) + hd);
    return t > AD_G * AD_THREADS ? t : AD_G * AD_THREADS;
}
__host__ __device__ inline int ad_smem_floats(int hd)
{
    return AD_G * ad_ks(hd) + ad_tile_floats(hd) + AD_TK * AD_G + 3 * AD_G;
}

/* 4 elements of a cache row as they travel in registers: f32 16 bytes, f16 8 bytes */
template <typename T> struct ad_raw { typedef float4 t; };
template <> struct ad_raw<__half> { typedef uint2 t; };
__device__ __forceinline__ float4 ad_load(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ uint2 ad_load(const __half *p) { return __ldg((const uint2 *)p); }
__device__ __forceinline__ float4 ad_widen(float4 v) { return v; }
__device__ __forceinline__ float4 ad_widen(uint2 u)
{
    float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* grid (n_head_kv, pstride, zgroups * rows). Row r: the query at q + r qd; with at, at position
 * at[r] over slot slot[r]'s caches (slot_elems apart; NULL: slot 0), else n_keys keys. Its
 * partials: part_o (rows, n_head, pstride, hd), part_ml (rows, n_head, pstride, 2); pstride is
 * the grid's chunk count (>= the row's). HDB: a bound on hd (the dot loop unrolls to it). */
template <int HDB, typename T>
__global__ void __launch_bounds__(AD_THREADS)
attn_split_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                  float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml, int n_keys,
                  int n_head_kv, int group, int hd, int want, int zgroups, float scale, const int32_t *at,
                  const int32_t *slot, size_t slot_elems)
{
    constexpr int PF = AD_TK * (HDB / 4) / AD_THREADS > 0 ? AD_TK * (HDB / 4) / AD_THREADS : 1;
    typedef typename ad_raw<T>::t raw;
    const int pstride = gridDim.y, n_head = n_head_kv * group;
    int zg = blockIdx.z, row = zg / zgroups;
    zg -= row * zgroups;
    const size_t qd = (size_t)n_head * hd;
    q += row * qd;
    out += row * qd;
    part_o += (size_t)row * n_head * pstride * hd;
    part_ml += (size_t)row * n_head * pstride * 2;
    if (at) {
        n_keys = at[row] + 1;
        if (slot) {
            kc += (size_t)slot[row] * slot_elems;
            vc += (size_t)slot[row] * slot_elems;
        }
    }
    int chunk, n_chunks;
    ad_split(n_keys, want, &chunk, &n_chunks);
    const int ci = blockIdx.y;
    if (ci >= n_chunks)
        return;
    extern __shared__ __align__(16) float sm[];
    const int ks = ad_ks(hd), n4 = hd >> 2, tid = threadIdx.x;
    float *qs = sm;                          /* (AD_G, ks) query rows */
    float *kt = qs + AD_G * ks;              /* (AD_TK, ks) K tile */
    float *vt = kt + AD_TK * ks;             /* (AD_TK, hd) V tile */
    float *red = kt;                         /* (nsplit, AD_G, hd) at the end */
    float *ps = kt + ad_tile_floats(hd);     /* (AD_TK, AD_G) the tile's probabilities */
    float *al = ps + AD_TK * AD_G;           /* (AD_G) rescale of the earlier tiles */
    float *ml = al + AD_G;                   /* (AD_G, 2) chunk max, chunk sum */
    const int kvh = blockIdx.x, g0 = zg * AD_G;
    const int G = group - g0 < AD_G ? group - g0 : AD_G;
    const int h0 = kvh * group + g0;
    const size_t kvd = (size_t)n_head_kv * hd;
    const int t0 = ci * chunk, len = t0 + chunk < n_keys ? chunk : n_keys - t0;
    const int n_tiles = (len + AD_TK - 1) / AD_TK;
    const T *kb = kc + (size_t)t0 * kvd + (size_t)kvh * hd;
    const T *vb = vc + (size_t)t0 * kvd + (size_t)kvh * hd;

    /* tile `tile`'s K and V rows into registers (piece i = tid + p * AD_THREADS is row i / n4,
     * columns 4 (i % n4) ..), then from there into the shared tile */
    raw pk[PF], pv[PF];
    auto fetch = [&](int tile) {
        int r0 = tile * AD_TK, tl = len - r0 < AD_TK ? len - r0 : AD_TK;
        const T *kg = kb + (size_t)r0 * kvd, *vg = vb + (size_t)r0 * kvd;
#pragma unroll
        for (int p = 0; p < PF; p++) {
            int i = tid + p * AD_THREADS, r = i / n4, c = (i - r * n4) * 4;
            if (i < tl * n4) {
                pk[p] = ad_load(kg + r * kvd + c);
                pv[p] = ad_load(vg + r * kvd + c);
            }
        }
    };
    auto put = [&](int tile) {
        int tl = len - tile * AD_TK < AD_TK ? len - tile * AD_TK : AD_TK;
#pragma unroll
        for (int p = 0; p < PF; p++) {
            int i = tid + p * AD_THREADS, r = i / n4, c = (i - r * n4) * 4;
            if (i < tl * n4) {
                *(float4 *)(kt + r * ks + c) = ad_widen(pk[p]);
                *(float4 *)(vt + r * hd + c) = ad_widen(pv[p]);
            }
        }
    };
    fetch(0);
    {
        const float *qg = q + (size_t)h0 * hd;
        for (int i = tid; i < G * n4; i += AD_THREADS) {
            int g = i / n4, c = (i - g * n4) * 4;
            *(float4 *)(qs + g * ks + c) = __ldg((const float4 *)(qg + g * hd + c));
        }
    }
    put(0);

    /* score phase: key j of the tile, head g (16 lanes a head: g is half-warp-uniform) */
    const int j = tid % AD_TK, g = tid / AD_TK;
    float M = -INFINITY, L = 0.0f;
    /* P V phase: head dim d, key split sp (keys sp, sp + nsplit, ...) */
    const int nsplit = AD_THREADS / hd, d = tid % hd, sp = tid / hd;
    float acc[AD_G];
#pragma unroll
    for (int k = 0; k < AD_G; k++)
        acc[k] = 0.0f;

    for (int t = 0; t < n_tiles; t++) {
        __syncthreads(); /* tile t is in shared memory */
        if (t + 1 < n_tiles)
            fetch(t + 1); /* in flight during this tile's work; put() after it */
        const int tl = len - t * AD_TK < AD_TK ? len - t * AD_TK : AD_TK;
        float s = -INFINITY;
        if (g < G && j < tl) {
            const float4 *kr = (const float4 *)(kt + j * ks), *qr = (const float4 *)(qs + g * ks);
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
#pragma unroll
            for (int i = 0; i < HDB / 4; i += 2) {
                if (i < n4) {
                    float4 k4 = kr[i], q4 = qr[i];
                    a.x = fmaf(k4.x, q4.x, a.x);
                    a.y = fmaf(k4.y, q4.y, a.y);
                    a.z = fmaf(k4.z, q4.z, a.z);
                    a.w = fmaf(k4.w, q4.w, a.w);
                }
                if (i + 1 < n4) {
                    float4 k4 = kr[i + 1], q4 = qr[i + 1];
                    b.x = fmaf(k4.x, q4.x, b.x);
                    b.y = fmaf(k4.y, q4.y, b.y);
                    b.z = fmaf(k4.z, q4.z, b.z);
                    b.w = fmaf(k4.w, q4.w, b.w);
                }
            }
            s = (((a.x + b.x) + (a.y + b.y)) + ((a.z + b.z) + (a.w + b.w))) * scale;
        }
        float m = s;
#pragma unroll
        for (int o = AD_TK / 2; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float mn = fmaxf(M, m);
        /* heads past G (a partial group) have no keys: no NaN from -inf - -inf */
        float p = g < G && j < tl ? expf(s - mn) : 0.0f;
        float r = g < G ? expf(M - mn) : 1.0f; /* 0 on the first tile */
        float l = p;
#pragma unroll
        for (int o = AD_TK / 2; o > 0; o >>= 1)
            l += __shfl_xor_sync(0xffffffffu, l, o);
        L = L * r + l;
        M = mn;
        ps[j * AD_G + g] = p;
        if (j == 0)
            al[g] = r;
        __syncthreads();
        if (sp < nsplit) {
            const float4 *a4 = (const float4 *)al, *p4 = (const float4 *)ps;
            float4 ra = a4[0], rb = a4[1];
            acc[0] *= ra.x; acc[1] *= ra.y; acc[2] *= ra.z; acc[3] *= ra.w;
            acc[4] *= rb.x; acc[5] *= rb.y; acc[6] *= rb.z; acc[7] *= rb.w;
            const float *vr = vt + d;
#pragma unroll 4
            for (int k = sp; k < tl; k += nsplit) {
                float v = vr[k * hd];
                float4 pa = p4[2 * k], pb = p4[2 * k + 1];
                acc[0] = fmaf(pa.x, v, acc[0]);
                acc[1] = fmaf(pa.y, v, acc[1]);
                acc[2] = fmaf(pa.z, v, acc[2]);
                acc[3] = fmaf(pa.w, v, acc[3]);
                acc[4] = fmaf(pb.x, v, acc[4]);
                acc[5] = fmaf(pb.y, v, acc[5]);
                acc[6] = fmaf(pb.z, v, acc[6]);
                acc[7] = fmaf(pb.w, v, acc[7]);
            }
        }
        __syncthreads(); /* the tile, ps and al are read: the next tile may overwrite them */
        if (t + 1 < n_tiles)
            put(t + 1);
    }

    /* the key splits' sums, added in split order (red reuses the tile: synced above) */
    if (sp < nsplit) {
#pragma unroll
        for (int k = 0; k < AD_G; k++)
            if (k < G)
                red[(sp * AD_G + k) * hd + d] = acc[k];
    }
    if (g < G && j == 0) {
        ml[2 * g] = M;
        ml[2 * g + 1] = L;
    }
    __syncthreads();
    for (int i = tid; i < G * hd; i += AD_THREADS) {
        int gg = i / hd, dd = i - gg * hd, h = h0 + gg;
        float o = 0.0f;
        for (int s2 = 0; s2 < nsplit; s2++)
            o += red[(s2 * AD_G + gg) * hd + dd];
        if (n_chunks == 1)
            out[(size_t)h * hd + dd] = o / ml[2 * gg + 1];
        else
            part_o[((size_t)h * pstride + ci) * hd + dd] = o;
    }
    if (n_chunks > 1 && tid < G) {
        int h = h0 + tid;
        part_ml[((size_t)h * pstride + ci) * 2] = ml[2 * tid];
        part_ml[((size_t)h * pstride + ci) * 2 + 1] = ml[2 * tid + 1];
    }
}

/* out[h] = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c, one CTA a (row, head). A thread
 * takes 4 consecutive dims (one float4) and the chunks c = s, s + ns, ...; AD_BATCH of them are
 * loaded at once and folded in with a running max, then the slices are combined through shared
 * memory (attention.cu's merge, on 128 threads). Rows whose cut is one chunk were written by
 * the chunk kernel: nothing to do. */
__global__ void __launch_bounds__(AD_MERGE)
attn_split_merge(const float *__restrict__ part_o, const float *__restrict__ part_ml, float *__restrict__ out,
                 int hd, int n_keys, int want, int pstride, const int32_t *at, int n_head)
{
    int h = blockIdx.x, row = h / n_head;
    h -= row * n_head;
    if (at)
        n_keys = at[row] + 1;
    int chunk, n_chunks;
    ad_split(n_keys, want, &chunk, &n_chunks);
    if (n_chunks == 1)
        return;
    part_o += (size_t)row * n_head * pstride * hd;
    part_ml += (size_t)row * n_head * pstride * 2;
    out += (size_t)row * n_head * hd;
    __shared__ __align__(16) float so[AD_MERGE * 4]; /* (ns, hd) slice outputs */
    __shared__ float smax[AD_MERGE], ssum[AD_MERGE];
    const int nu = hd / 4, u = threadIdx.x % nu, s = threadIdx.x / nu, ns = AD_MERGE / nu;
    const float *ml = part_ml + (size_t)h * pstride * 2;
    const float *po = part_o + (size_t)h * pstride * hd + u * 4;
    if (s < ns) {
        float M = -INFINITY, L = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int c0 = s; c0 < n_chunks; c0 += AD_BATCH * ns) {
            float m[AD_BATCH], l[AD_BATCH];
            float4 v[AD_BATCH];
#pragma unroll
            for (int k = 0; k < AD_BATCH; k++) {
                int c = c0 + k * ns;
                bool in = c < n_chunks;
                m[k] = in ? ml[2 * c] : -INFINITY;
                l[k] = in ? ml[2 * c + 1] : 0.0f;
                v[k] = in ? *(const float4 *)(po + (size_t)c * hd) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            float mn = M;
#pragma unroll
            for (int k = 0; k < AD_BATCH; k++)
                mn = fmaxf(mn, m[k]);
            float r = expf(M - mn); /* 0 on the first batch: c0 < n_chunks, so mn is finite */
            L *= r;
            o.x *= r; o.y *= r; o.z *= r; o.w *= r;
#pragma unroll
            for (int k = 0; k < AD_BATCH; k++) {
                float e = expf(m[k] - mn);
                L = fmaf(e, l[k], L);
                o.x = fmaf(e, v[k].x, o.x);
                o.y = fmaf(e, v[k].y, o.y);
                o.z = fmaf(e, v[k].z, o.z);
                o.w = fmaf(e, v[k].w, o.w);
            }
            M = mn;
        }
        *(float4 *)(so + s * hd + u * 4) = o;
        if (u == 0) {
            smax[s] = M;
            ssum[s] = L;
        }
    }
    __syncthreads();
    const int nsl = ns < n_chunks ? ns : n_chunks; /* slices that saw a chunk */
    float M = -INFINITY;
    for (int k = 0; k < nsl; k++)
        M = fmaxf(M, smax[k]);
    float L = 0.0f;
    for (int k = 0; k < nsl; k++)
        L = fmaf(expf(smax[k] - M), ssum[k], L);
    for (int i = threadIdx.x; i < hd; i += AD_MERGE) {
        float o = 0.0f;
        for (int k = 0; k < nsl; k++)
            o = fmaf(expf(smax[k] - M), so[k * hd + i], o);
        out[(size_t)h * hd + i] = o / L;
    }
}
#endif
