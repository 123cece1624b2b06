/* attention.cu - causal attention of one query token over the KV cache, GQA, any length
 * (decode; a prefill chunk goes to attention_prefill.cu, see cuda_attention at the end).
 *
 * Split-K ("flash-decoding"): the n_keys = pos + 1 cached positions are cut into chunks, one
 * CTA per (kv head, chunk, group of up to 8 query heads), and a second kernel merges the
 * CTAs' unnormalised partial outputs by their maxima and sums. The chunk length adapts so
 * that a long context fills every SM while a short one runs as a single chunk that writes
 * the output directly (one launch).
 *
 * At short contexts the op is latency-bound, not bandwidth-bound (513 keys of Qwen3-30B are
 * 2 MB over 68 CTAs), so a CTA is built to make as few dependent global round trips as it
 * can: it walks its chunk in tiles of TK keys (32; 16 at head_dim 256), and each tile's K and
 * V rows (V does not depend on the scores) go into shared memory by cp.async in one batch,
 * the query rows with the first tile. Two tile buffers: the next tile is in flight while the
 * current one is computed, so a chunk of one or two tiles costs one round trip. Then, from
 * shared memory only:
 *   - scores: one thread per (key, head), lanes on consecutive keys, each a whole dot of its
 *     K row with its head's q (no cross-lane reduction for the dot);
 *   - online softmax per head: the tile's max and sum over the lanes of that head's keys
 *     (shuffles within a warp segment), the running max / sum kept in registers, the factor
 *     that rescales the previous tiles' accumulators handed to the P V threads;
 *   - P V: one thread per head dim for all 8 heads at once (each V element read once), the
 *     tile's keys split between the threads that share a dim when head_dim <= 128, their
 *     sums added once at the end.
 *
 * Shared memory: 70 KB a CTA at head_dim 128, 73 KB at 256 (opted into above 48 KB), so
 * three CTAs an SM on the H200; 256 threads of at most 80 registers.
 *
 * An f16 cache (attention_f16, attention_at_f16): the same kernels with T = __half; a tile's
 * rows are read with plain loads (8 bytes, 4 elements, a load) and widened into the same f32
 * tiles, so everything after the copy is the f32 form's. cp.async copies bytes and cannot
 * widen, so the next tile's loads go to registers before the current tile is computed and are
 * widened into its buffer after it: the same one round trip in flight as the f32 form. (f16
 * tiles in shared memory would halve its traffic too - not done yet.)
 *
 * Memory per call: only the partials, n_head * n_chunks * (head_dim + 2) floats, from the
 * backend's stream-ordered scratch. The (n_head, n_ctx) att buffer of the interface is not
 * needed here and is left untouched. */
#include "engine/cuda/common.cuh"
#include "engine/cuda/mma_q.cuh" /* cp.async helpers */

extern "C" {
#include "engine/backend_cuda.h" /* cuda_set_attn_mma */
}

#include <math.h>

#define ATT_THREADS 256
#define ATT_G 8          /* query heads per CTA */
#define ATT_STAGES 2     /* K/V tile buffers */
#define ATT_MIN_CTAS 3   /* resident CTAs an SM (caps registers at 80 a thread) */
#define ATT_MAX_CHUNK 1024
#define MERGE_THREADS 256
#define MERGE_BATCH 8    /* chunks a merge thread has in flight at once */

/* How n_keys keys are cut: chunks of *chunk keys, *n_chunks of them, aiming at `want` chunks
 * (see attention_one). On the device too, for attention_at, so both cut the same way. */
__host__ __device__ inline void att_split(int n_keys, int want, int *chunk_o, int *n_chunks_o)
{
    int chunk = (n_keys + want - 1) / want;
    chunk = (chunk + 31) & ~31;
    if (chunk < 32) chunk = 32;
    if (chunk > ATT_MAX_CHUNK) chunk = ATT_MAX_CHUNK;
    int n_chunks = (n_keys + chunk - 1) / chunk;
    if (n_chunks > ATT_MAX_CHUNK) { /* over 1M keys: longer chunks rather than more of them */
        chunk = (n_keys + ATT_MAX_CHUNK - 1) / ATT_MAX_CHUNK;
        chunk = (chunk + 31) & ~31;
        n_chunks = (n_keys + chunk - 1) / chunk;
    }
    *chunk_o = chunk;
    *n_chunks_o = n_chunks;
}

/* Keys per tile for a head-dim bucket: one per lane up to 128 dims; 16 at 256 so that two
 * tile buffers stay near 75 KB. Chunks are multiples of 32, so of the tile too. */
__host__ __device__ constexpr int att_tile(int hdb) { return hdb > 128 ? 16 : 32; }

/* Shared-memory row strides in floats: V rows hd rounded up to 4 (16-byte cp.async, float4
 * reads); K and q rows padded so that the stride in 16-byte units is odd: 8 lanes reading
 * 16 bytes each from 8 consecutive rows (one LDS.128 phase) then use 8 disjoint bank quads. */
__host__ __device__ inline int att_hd4(int hd) { return (hd + 3) & ~3; }
__host__ __device__ inline int att_ks(int hd) { return (att_hd4(hd) / 4) % 2 ? att_hd4(hd) : att_hd4(hd) + 4; }
/* the tile buffers, or at the end the per-split P V sums that reuse them */
__host__ __device__ inline int att_stage_floats(int hd, int tk)
{
    int st = ATT_STAGES * tk * (att_ks(hd) + att_hd4(hd));
    return st > ATT_G * ATT_THREADS ? st : ATT_G * ATT_THREADS;
}
__host__ __device__ inline int att_smem_floats(int hd, int tk)
{
    return ATT_G * att_ks(hd) + att_stage_floats(hd, tk) + tk * ATT_G + 3 * ATT_G;
}

/* HDB: head-dim bucket (hd <= HDB; the dot loops unroll to it). at (attention_at): the query's
 * position is *at, and n_keys, chunk, n_chunks are worked out here from it and want; the grid
 * is sized for the longest context and CTAs past n_chunks have nothing to do. attention_at's
 * rows: grid.z is (row, group of heads), zgroups groups a row; row r is the query at q + r qd,
 * at position at[r], over the caches of slot slot[r] (slot_floats apart; slot NULL: slot 0),
 * its partials in its own part_o / part_ml rows (sized for the grid's chunks). vec: hd % 4 == 0
 * and q, kc, vc 16-byte aligned, so rows are copied in 16-byte pieces (else 4-byte ones). T:
 * the cache's elements, float or __half (slot_floats then counts halves). */
template <int HDB, typename T>
__global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_CTAS)
attn_chunk_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                  float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml,
                  int n_keys, int n_head_kv, int group, int hd, int chunk, int n_chunks, float scale,
                  const int32_t *at, int want, bool vec, int zgroups, const int32_t *slot, size_t slot_floats)
{
    constexpr int TK = att_tile(HDB);
    int zg = blockIdx.z;
    if (at) {
        int row = (int)blockIdx.z / zgroups;
        zg -= row * zgroups;
        size_t qd = (size_t)n_head_kv * group * hd, pr = (size_t)n_head_kv * group * gridDim.y;
        q += row * qd;
        out += row * qd;
        part_o += row * pr * hd;
        part_ml += row * pr * 2;
        if (slot) {
            kc += (size_t)slot[row] * slot_floats;
            vc += (size_t)slot[row] * slot_floats;
        }
        n_keys = at[row] + 1;
        att_split(n_keys, want, &chunk, &n_chunks);
        if ((int)blockIdx.y >= n_chunks)
            return;
    }
    extern __shared__ __align__(16) float sm[];
    const int hd4 = att_hd4(hd), ks = att_ks(hd);
    float *qs = sm;                                    /* (ATT_G, ks) query rows */
    float *kt = qs + ATT_G * ks;                       /* (ATT_STAGES, TK, ks) K tiles */
    float *vt = kt + ATT_STAGES * TK * ks;             /* (ATT_STAGES, TK, hd4) V tiles */
    float *red = kt;                                   /* (nsplit, ATT_G, hd) at the end */
    float *ps = kt + att_stage_floats(hd, TK);         /* (TK, ATT_G) the tile's probabilities */
    float *al = ps + TK * ATT_G;                       /* (ATT_G) rescale of the earlier tiles */
    float *ml = al + ATT_G;                            /* (ATT_G, 2) chunk max, chunk sum */
    const int kvh = blockIdx.x, ci = blockIdx.y, g0 = zg * ATT_G;
    const int G = group - g0 < ATT_G ? group - g0 : ATT_G;
    const int h0 = kvh * group + g0;                   /* first query head of this CTA */
    const size_t kvd = (size_t)n_head_kv * hd;
    const int t0 = ci * chunk, len = t0 + chunk < n_keys ? chunk : n_keys - t0;
    const int n_tiles = (len + TK - 1) / TK;
    const int tid = threadIdx.x;
    const T *kb = kc + (size_t)t0 * kvd + (size_t)kvh * hd; /* the chunk's first K row */
    const T *vb = vc + (size_t)t0 * kvd + (size_t)kvh * hd;

    /* hd % 4 != 0: the pad columns of the q and K rows (contiguous, same stride) read as
     * zeros by the float4 dots; written once, the copies never touch them */
    if (hd4 != hd)
        for (int i = tid; i < (ATT_G + ATT_STAGES * TK) * (hd4 - hd); i += ATT_THREADS)
            qs[i / (hd4 - hd) * ks + hd + i % (hd4 - hd)] = 0.0f;

    /* every K and V row of tile `tile` into buffer `stage`, all in flight at once */
    auto load_tile = [&](int tile, int stage) {
        int r0 = tile * TK, tl = len - r0 < TK ? len - r0 : TK;
        float *kd = kt + stage * TK * ks, *vd = vt + stage * TK * hd4;
        const T *kg = kb + (size_t)r0 * kvd, *vg = vb + (size_t)r0 * kvd;
        if constexpr (sizeof(T) == 2) { /* f16: widened on the way (plain loads, see the top) */
            if (vec) {
                int n4 = hd >> 2;
                for (int i = tid; i < tl * n4; i += ATT_THREADS) {
                    int r = i / n4, c = (i - r * n4) * 4;
                    *(float4 *)(kd + r * ks + c) = kv_load4(kg + r * kvd + c);
                    *(float4 *)(vd + r * hd4 + c) = kv_load4(vg + r * kvd + c);
                }
            } else {
                for (int i = tid; i < tl * hd; i += ATT_THREADS) {
                    int r = i / hd, c = i - r * hd;
                    kd[r * ks + c] = kv_load(kg + r * kvd + c);
                    vd[r * hd4 + c] = kv_load(vg + r * kvd + c);
                }
            }
        } else if (vec) {
            int n4 = hd >> 2;
            for (int i = tid; i < tl * n4; i += ATT_THREADS) {
                int r = i / n4, c = (i - r * n4) * 4;
                cp_async16(kd + r * ks + c, kg + r * kvd + c, 16);
                cp_async16(vd + r * hd4 + c, vg + r * kvd + c, 16);
            }
        } else {
            for (int i = tid; i < tl * hd; i += ATT_THREADS) {
                int r = i / hd, c = i - r * hd;
                cp_async4(kd + r * ks + c, kg + r * kvd + c, 4);
                cp_async4(vd + r * hd4 + c, vg + r * kvd + c, 4);
            }
        }
    };
    /* f16 rows 16-byte aligned (vec): the register prefetch described at the top. PF: the
     * (row, 4 columns) pieces of a tile a thread carries, at most */
    constexpr int PF = (TK * (HDB / 4) + ATT_THREADS - 1) / ATT_THREADS;
    const bool pf = sizeof(T) == 2 && vec;
    uint2 pk[PF], pv[PF];
    auto fetch = [&](int tile) {
        if constexpr (sizeof(T) == 2) {
            int r0 = tile * TK, tl = len - r0 < TK ? len - r0 : TK, n4 = hd >> 2;
            const T *kg = kb + (size_t)r0 * kvd, *vg = vb + (size_t)r0 * kvd;
#pragma unroll
            for (int p = 0; p < PF; p++) {
                int i = tid + p * ATT_THREADS, r = i / n4, c = (i - r * n4) * 4;
                if (i < tl * n4) {
                    pk[p] = __ldg((const uint2 *)(kg + r * kvd + c));
                    pv[p] = __ldg((const uint2 *)(vg + r * kvd + c));
                }
            }
        }
    };
    auto put = [&](int tile, int stage) {
        if constexpr (sizeof(T) == 2) {
            int r0 = tile * TK, tl = len - r0 < TK ? len - r0 : TK, n4 = hd >> 2;
            float *kd = kt + stage * TK * ks, *vd = vt + stage * TK * hd4;
#pragma unroll
            for (int p = 0; p < PF; p++) {
                int i = tid + p * ATT_THREADS, r = i / n4, c = (i - r * n4) * 4;
                if (i < tl * n4) {
                    float2 a = __half22float2(*(const __half2 *)&pk[p].x), b = __half22float2(*(const __half2 *)&pk[p].y);
                    *(float4 *)(kd + r * ks + c) = make_float4(a.x, a.y, b.x, b.y);
                    a = __half22float2(*(const __half2 *)&pv[p].x), b = __half22float2(*(const __half2 *)&pv[p].y);
                    *(float4 *)(vd + r * hd4 + c) = make_float4(a.x, a.y, b.x, b.y);
                }
            }
        }
    };
    {
        const float *qg = q + (size_t)h0 * hd;
        if (vec) {
            int n4 = hd >> 2;
            for (int i = tid; i < G * n4; i += ATT_THREADS) {
                int g = i / n4, c = (i - g * n4) * 4;
                cp_async16(qs + g * ks + c, qg + g * hd + c, 16);
            }
        } else {
            for (int i = tid; i < G * hd; i += ATT_THREADS) {
                int g = i / hd, c = i - g * hd;
                cp_async4(qs + g * ks + c, qg + g * hd + c, 4);
            }
        }
        load_tile(0, 0);
        cp_async_commit();
    }

    /* score phase: this thread's key j of the tile and head g; a head's TK keys are TK
     * consecutive lanes of one warp (g < ATT_G is warp-uniform). M, L: head g's running max
     * and sum over the tiles so far, the same in every lane of its segment. */
    const int j = tid % TK, g = tid / TK;
    float M = -INFINITY, L = 0.0f;
    /* P V phase: this thread's head dim d and key split sp (keys sp, sp + nsplit, ...) */
    const int nsplit = ATT_THREADS / hd, d = tid % hd, sp = tid / hd;
    float acc[ATT_G];
#pragma unroll
    for (int k = 0; k < ATT_G; k++)
        acc[k] = 0.0f;

    for (int t = 0; t < n_tiles; t++) {
        if (t + 1 < n_tiles) { /* the buffer it fills was last read before the previous sync */
            if (pf)
                fetch(t + 1); /* to registers: put() below, after this tile's work */
            else
                load_tile(t + 1, (t + 1) % ATT_STAGES);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int stage = t % ATT_STAGES, tl = len - t * TK < TK ? len - t * TK : TK;
        if (g < ATT_G) {
            float s = -INFINITY;
            if (g < G && j < tl) {
                const float4 *kr = (const float4 *)(kt + (stage * TK + j) * ks);
                const float4 *qr = (const float4 *)(qs + g * ks);
                /* two float4 accumulators: 8 independent FMA chains */
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
#pragma unroll
                for (int i = 0; i < HDB / 4; i += 2) {
                    if (i < hd4 / 4) {
                        float4 k4 = kr[i], q4 = qr[i];
                        a.x = fmaf(k4.x, q4.x, a.x);
                        a.y = fmaf(k4.y, q4.y, a.y);
                        a.z = fmaf(k4.z, q4.z, a.z);
                        a.w = fmaf(k4.w, q4.w, a.w);
                    }
                    if (i + 1 < hd4 / 4) {
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
            for (int o = TK / 2; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            float mn = fmaxf(M, m);
            /* heads past G (a partial group) have no keys: no NaN from -inf - -inf */
            float p = g < G && j < tl ? expf(s - mn) : 0.0f;
            float r = g < G ? expf(M - mn) : 1.0f; /* 0 on the first tile */
            float l = p;
#pragma unroll
            for (int o = TK / 2; o > 0; o >>= 1)
                l += __shfl_xor_sync(0xffffffffu, l, o);
            L = L * r + l;
            M = mn;
            ps[j * ATT_G + g] = p;
            if (j == 0)
                al[g] = r;
        }
        __syncthreads();
        if (sp < nsplit) {
            const float4 *a4 = (const float4 *)al, *p4 = (const float4 *)ps;
            float4 ra = a4[0], rb = a4[1];
            acc[0] *= ra.x; acc[1] *= ra.y; acc[2] *= ra.z; acc[3] *= ra.w;
            acc[4] *= rb.x; acc[5] *= rb.y; acc[6] *= rb.z; acc[7] *= rb.w;
            const float *vr = vt + stage * TK * hd4 + d;
#pragma unroll 4
            for (int k = sp; k < tl; k += nsplit) {
                float v = vr[k * hd4];
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
        if (pf && t + 1 < n_tiles) /* the buffer was last read before this iteration's first sync */
            put(t + 1, (t + 1) % ATT_STAGES);
        __syncthreads(); /* before the next load refills this tile's buffer (pf: the next tile is in) */
    }

    /* the key splits' sums, added in split order */
    if (sp < nsplit) {
#pragma unroll
        for (int k = 0; k < ATT_G; k++)
            if (k < G)
                red[(sp * ATT_G + k) * hd + d] = acc[k];
    }
    if (g < G && j == 0) {
        ml[2 * g] = M;
        ml[2 * g + 1] = L;
    }
    __syncthreads();
    for (int i = tid; i < G * hd; i += ATT_THREADS) {
        int gg = i / hd, dd = i - gg * hd, h = h0 + gg;
        float o = 0.0f;
        for (int s2 = 0; s2 < nsplit; s2++)
            o += red[(s2 * ATT_G + gg) * hd + dd];
        if (n_chunks == 1)
            out[(size_t)h * hd + dd] = o / ml[2 * gg + 1];
        else
            part_o[((size_t)h * n_chunks + ci) * hd + dd] = o;
    }
    if (n_chunks > 1 && tid < G) {
        int h = h0 + tid;
        part_ml[((size_t)h * n_chunks + ci) * 2] = ml[2 * tid];
        part_ml[((size_t)h * n_chunks + ci) * 2 + 1] = ml[2 * tid + 1];
    }
}

/* out[h] = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c, one CTA per query head. A thread
 * takes W consecutive dims (W = 4: one float4) and a slice of the chunks (c = s, s + ns, ...),
 * MERGE_BATCH of them loaded at once and folded in with a running max; the slices' (max, sum,
 * output) are then combined through shared memory. Few dependent loads even for 1024 chunks. */
template <int W>
__global__ void __launch_bounds__(MERGE_THREADS)
attn_merge_kernel(const float *__restrict__ part_o, const float *__restrict__ part_ml, float *__restrict__ out,
                  int hd, int n_chunks, const int32_t *at, int want, int n_head)
{
    int h = blockIdx.x;
    if (at) { /* attention_at: one chunk means the chunk kernel wrote out itself */
        int row = h / n_head, chunk;
        h -= row * n_head;
        part_o += (size_t)row * n_head * n_chunks * hd; /* the rows' partials as the chunk kernel laid them */
        part_ml += (size_t)row * n_head * n_chunks * 2;
        out += (size_t)row * n_head * hd;
        att_split(at[row] + 1, want, &chunk, &n_chunks);
        if (n_chunks == 1)
            return;
    }
    __shared__ __align__(16) float so[MERGE_THREADS * W]; /* (ns, hd) slice outputs */
    __shared__ float smax[MERGE_THREADS], ssum[MERGE_THREADS]; /* (ns) slice max, sum */
    const int nu = hd / W, u = threadIdx.x % nu, s = threadIdx.x / nu, ns = MERGE_THREADS / nu;
    const float *ml = part_ml + (size_t)h * n_chunks * 2;
    const float *po = part_o + (size_t)h * n_chunks * hd + u * W;
    if (s < ns) {
        float M = -INFINITY, L = 0.0f, o[W];
#pragma unroll
        for (int w = 0; w < W; w++)
            o[w] = 0.0f;
        for (int c0 = s; c0 < n_chunks; c0 += MERGE_BATCH * ns) {
            float m[MERGE_BATCH], l[MERGE_BATCH], v[MERGE_BATCH][W];
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++) {
                int c = c0 + k * ns;
                bool in = c < n_chunks;
                m[k] = in ? ml[2 * c] : -INFINITY;
                l[k] = in ? ml[2 * c + 1] : 0.0f;
                if constexpr (W == 4) {
                    float4 x = in ? *(const float4 *)(po + (size_t)c * hd) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    v[k][0] = x.x;
                    v[k][1] = x.y;
                    v[k][2] = x.z;
                    v[k][3] = x.w;
                } else {
#pragma unroll
                    for (int w = 0; w < W; w++)
                        v[k][w] = in ? po[(size_t)c * hd + w] : 0.0f;
                }
            }
            float mn = M;
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++)
                mn = fmaxf(mn, m[k]);
            float r = expf(M - mn); /* 0 on the first batch: c0 < n_chunks, so mn is finite */
            L *= r;
#pragma unroll
            for (int w = 0; w < W; w++)
                o[w] *= r;
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++) {
                float e = expf(m[k] - mn);
                L = fmaf(e, l[k], L);
#pragma unroll
                for (int w = 0; w < W; w++)
                    o[w] = fmaf(e, v[k][w], o[w]);
            }
            M = mn;
        }
#pragma unroll
        for (int w = 0; w < W; w++)
            so[s * hd + u * W + w] = o[w];
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
    for (int i = threadIdx.x; i < hd; i += MERGE_THREADS) {
        float o = 0.0f;
        for (int k = 0; k < nsl; k++)
            o = fmaf(expf(smax[k] - M), so[k * hd + i], o);
        out[(size_t)h * hd + i] = o / L;
    }
}

/* at NULL: the query at position pos. at set (attention_at): rows queries, row r at at[r], below
 * n_ctx, read when the kernels run, over slot slot[r]'s caches; pos is then unused but for the
 * shape check. */
static void attention_one(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                          float *out, int pos, int n_head, int n_head_kv, int head_dim, const int32_t *at = NULL,
                          int n_ctx = 0, int rows = 1, const int32_t *slot = NULL, size_t slot_floats = 0)
{
    if (c->err)
        return;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || head_dim <= 0 || head_dim > 256 || pos < 0) {
        cuda_fail(c, cudaErrorInvalidValue, "attention (shape: need n_head % n_head_kv == 0, head_dim <= 256)",
                  __FILE__, __LINE__);
        return;
    }
    int n_keys = pos + 1, group = n_head / n_head_kv;
    int zgroups = (group + ATT_G - 1) / ATT_G;
    int hdb = head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
    size_t smem = (size_t)att_smem_floats(head_dim, att_tile(hdb)) * sizeof(float);
    /* aim for as many CTAs per SM as are resident at once, over all (kv head, chunk, group)
     * triples: ATT_MIN_CTAS, what the registers allow (__launch_bounds__) and, at head_dim 128
     * and 256, shared memory too (3 x 73 KB of sm_90's 228 KB). A long context is then one
     * wave of CTAs that each keep a tile in flight, not a wave and a tail. Depends only on
     * the shape, so attention_at and attention cut the same way. */
    int per_sm = ATT_MIN_CTAS;
    int per_chunk = n_head_kv * zgroups;
    int want = (per_sm * c->sm_count + per_chunk - 1) / per_chunk;
    if (rows > 1) /* the rows fill the SMs too: fewer chunks each (one row cuts as before) */
        want = (want + rows - 1) / rows;
    int chunk, n_chunks;
    if (at) {
        /* the largest chunk and chunk count any position below n_ctx can need (chunk grows
         * with the keys; the count stays under want until chunks reach their cap) */
        att_split(n_ctx, want, &chunk, &n_chunks);
        int cap = (n_ctx + ATT_MAX_CHUNK - 1) / ATT_MAX_CHUNK;
        n_chunks = n_chunks > want ? n_chunks : want;
        n_chunks = n_chunks > cap ? n_chunks : cap;
    } else {
        att_split(n_keys, want, &chunk, &n_chunks);
    }
    float *part_o = NULL, *part_ml = NULL;
    if (n_chunks > 1 || at) {
        size_t po = (size_t)rows * n_head * n_chunks * head_dim;
        float *ws = (float *)cuda_scratch(c, (po + (size_t)rows * n_head * n_chunks * 2) * sizeof(float));
        if (!ws)
            return;
        part_o = ws;            /* (rows, n_head, n_chunks, head_dim) */
        part_ml = ws + po;      /* (rows, n_head, n_chunks, 2) */
    }
    /* (an f16 cache's rows are 8-byte aligned wherever the f32 rows would be 16-byte aligned) */
    bool vec = head_dim % 4 == 0 && (((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0;
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)n_chunks, (unsigned)(zgroups * rows));
#define ATT_LAUNCH_T(D, T)                                                                               \
    do {                                                                                                 \
        if (smem > 48 * 1024 &&                                                                          \
            !CU(c, cudaFuncSetAttribute(attn_chunk_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)smem)))                                                     \
            return;                                                                                      \
        attn_chunk_kernel<D, T><<<grid, ATT_THREADS, smem, c->st>>>(                                     \
            q, (const T *)k_cache, (const T *)v_cache, out, part_o, part_ml, n_keys, n_head_kv, group, head_dim, \
            chunk, n_chunks, scale, at, want, vec, zgroups, slot, slot_floats);                          \
    } while (0)
#define ATT_LAUNCH(D)                     \
    do {                                  \
        if (f16)                          \
            ATT_LAUNCH_T(D, __half);      \
        else                              \
            ATT_LAUNCH_T(D, float);       \
    } while (0)
    switch (hdb) {
    case 32: ATT_LAUNCH(32); break;
    case 64: ATT_LAUNCH(64); break;
    case 128: ATT_LAUNCH(128); break;
    default: ATT_LAUNCH(256); break;
    }
#undef ATT_LAUNCH
#undef ATT_LAUNCH_T
    if (!CU_LAUNCH(c, "attn_chunk_kernel") || (n_chunks == 1 && !at))
        return;
    if (head_dim % 4 == 0) /* part_o rows then start 16-byte aligned (the scratch is) */
        attn_merge_kernel<4><<<n_head * rows, MERGE_THREADS, 0, c->st>>>(part_o, part_ml, out, head_dim, n_chunks, at,
                                                                        want, n_head);
    else
        attn_merge_kernel<1><<<n_head * rows, MERGE_THREADS, 0, c->st>>>(part_o, part_ml, out, head_dim, n_chunks, at,
                                                                        want, n_head);
    CU_LAUNCH(c, "attn_merge_kernel");
}

void cuda_attention_at(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                       float *out, int n, const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx,
                       int n_head, int n_head_kv, int head_dim)
{
    if (!c->err && n_ctx > 0 && n > 0)
        attention_one(c, q, k_cache, v_cache, f16, out, n_ctx - 1, n_head, n_head_kv, head_dim, at, n_ctx, n, slot,
                      slot_floats);
}

/* A chunk of n tokens: the tiled kernel (attention_prefill.cu, one launch) or the split-K
 * decode kernel once per token, whichever a cost model from the H200's timings says is faster
 * (bench_attention, bench_attention_prefill): the tiled kernel takes ~7 us a 32-key tile on a
 * CTA, ~2 CTAs an SM at once, and its CTAs split only the queries, so a short chunk deep in a
 * long context leaves most SMs idle while a few CTAs walk every key; the decode kernel spreads
 * the keys over the SMs at ~8.2 us + ~1.8 ns a key per token (the tiled decode kernel above:
 * 15.4 us at 4096 keys, 65.7 at 32768, 32 query / 4 kv heads of 128; it was 8 us + 4 ns). */
void cuda_attention(struct cuda_ctx *c, const float *q, const void *k_cache, const void *v_cache, bool f16,
                    float *out, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    if (c->err || n <= 0)
        return;
    if (n > 1 && n_head_kv > 0 && n_head >= n_head_kv) {
        double ctas = (double)n_head_kv * ceil((double)n * (n_head / n_head_kv) / 64.0);
        double waves = ctas / (2.0 * (c->sm_count > 0 ? c->sm_count : 1));
        /* the f16 tensor-core form (attention_prefill.cu, head_dim 64 / 128): ~6.5 us a 64-key
         * tile (512 queries at pos 3584: 0.375 ms; at 31744: 3.52 ms) */
        bool tc = (head_dim == 64 || head_dim == 128) && cuda_set_attn_mma(-1);
        double t_tiled = (waves < 1.0 ? 1.0 : waves) * (tc ? ceil((pos + n) / 64.0) * 6.5 : ceil((pos + n) / 32.0) * 7.0);
        double t_token = n * (8.2 + 0.00176 * (pos + n / 2.0));
        if (t_tiled <= t_token &&
            cuda_attention_prefill(c, q, k_cache, v_cache, f16, out, n, pos, n_head, n_head_kv, head_dim))
            return;
    }
    size_t qd = (size_t)n_head * head_dim;
    for (int t = 0; t < n && !c->err; t++)
        attention_one(c, q + t * qd, k_cache, v_cache, f16, out + t * qd, pos + t, n_head, n_head_kv, head_dim);
}
