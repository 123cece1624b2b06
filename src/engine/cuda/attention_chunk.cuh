/* attention_chunk.cuh - the device code of attention.cu (the split-K decode attention's chunk
 * kernel, contiguous and paged, and its merge; see that file for the design), moved here verbatim
 * so that the host emulation (tests/gpu/emu/paged_attn_emu.cpp, `make paged-attn-emu`) compiles
 * this very code with g++. */
#ifndef TIDE_CUDA_ATTENTION_CHUNK_CUH
#define TIDE_CUDA_ATTENTION_CHUNK_CUH

#include "engine/cuda/attention.cuh"
#include "engine/cuda/mma_q.cuh" /* cp.async helpers */

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

/* A call's cut (attention_one; the CPU emulator of the paged kernel runs the same): aim for as
 * many CTAs per SM as are resident at once, over all (kv head, chunk, group) triples:
 * ATT_MIN_CTAS, what the registers allow (__launch_bounds__) and, at head_dim 128 and 256,
 * shared memory too (3 x 73 KB of sm_90's 228 KB). A long context is then one wave of CTAs
 * that each keep a tile in flight, not a wave and a tail. Depends only on the shape, so
 * attention_at and attention cut the same way. *want_o: the chunks aimed at (the kernels'
 * want); at (attention_at, rows at positions below n_ctx): the grid's chunks; else n_keys'. */
inline void att_plan(int sm_count, int n_head_kv, int zgroups, int rows, bool at, int n_ctx, int n_keys,
                     int *want_o, int *chunk_o, int *n_chunks_o)
{
    int per_sm = ATT_MIN_CTAS;
    int per_chunk = n_head_kv * zgroups;
    int want = (per_sm * sm_count + per_chunk - 1) / per_chunk;
    if (rows > 1) /* the rows fill the SMs too: fewer chunks each (one row cuts as before) */
        want = (want + rows - 1) / rows;
    if (at) {
        /* the largest chunk and chunk count any position below n_ctx can need (chunk grows
         * with the keys; the count stays under want until chunks reach their cap) */
        att_split(n_ctx, want, chunk_o, n_chunks_o);
        int cap = (n_ctx + ATT_MAX_CHUNK - 1) / ATT_MAX_CHUNK;
        *n_chunks_o = *n_chunks_o > want ? *n_chunks_o : want;
        *n_chunks_o = *n_chunks_o > cap ? *n_chunks_o : cap;
    } else {
        att_split(n_keys, want, chunk_o, n_chunks_o);
    }
    *want_o = want;
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
 * the cache's elements, float or __half (slot_floats then counts halves). PAGED: kc, vc are a
 * layer's block pools and key p's row is found through the sequence's block table (pg.tables,
 * or with at and slot, slot[r]'s table pg.stride entries on; attention.cuh's kv_pages): only the
 * address of each row changes, so the contiguous form (PAGED false) is compiled as before. */
template <int HDB, typename T, bool PAGED>
__global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_CTAS)
attn_chunk_kernel(const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                  float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml,
                  int n_keys, int n_head_kv, int group, int hd, int chunk, int n_chunks, float scale,
                  const int32_t *at, int want, bool vec, int zgroups, const int32_t *slot, size_t slot_floats,
                  kv_pages pg)
{
    constexpr int TK = att_tile(HDB);
    int zg = blockIdx.z;
    const int32_t *tab = pg.tables; /* PAGED: this query's sequence's block table */
    if (at) {
        int row = (int)blockIdx.z / zgroups;
        zg -= row * zgroups;
        size_t qd = (size_t)n_head_kv * group * hd, pr = (size_t)n_head_kv * group * gridDim.y;
        q += row * qd;
        out += row * qd;
        part_o += row * pr * hd;
        part_ml += row * pr * 2;
        if (slot && PAGED) {
            tab += (size_t)slot[row] * pg.stride;
        } else if (slot) {
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
    /* the chunk's first K and V rows (PAGED: the head's column in the pool; rows by roff) */
    const T *kb = kc + (PAGED ? 0 : (size_t)t0 * kvd) + (size_t)kvh * hd;
    const T *vb = vc + (PAGED ? 0 : (size_t)t0 * kvd) + (size_t)kvh * hd;
    /* a tile's rows: key t0 + r0 + r is at tile_base(kb or vb, r0) + roff(r0, r) elements (K and V
     * rows share the layout); contiguous, the expressions the kernel had before paging */
    auto tile_base = [&](const T *b, int r0) -> const T * {
        if constexpr (PAGED)
            return b;
        else
            return b + (size_t)r0 * kvd;
    };
    auto roff = [&](int r0, int r) -> size_t {
        if constexpr (PAGED)
            return kv_page_row(tab, pg.shift, t0 + r0 + r) * kvd;
        else
            return r * kvd;
    };

    /* hd % 4 != 0: the pad columns of the q and K rows (contiguous, same stride) read as
     * zeros by the float4 dots; written once, the copies never touch them */
    if (hd4 != hd)
        for (int i = tid; i < (ATT_G + ATT_STAGES * TK) * (hd4 - hd); i += ATT_THREADS)
            qs[i / (hd4 - hd) * ks + hd + i % (hd4 - hd)] = 0.0f;

    /* every K and V row of tile `tile` into buffer `stage`, all in flight at once */
    auto load_tile = [&](int tile, int stage) {
        int r0 = tile * TK, tl = len - r0 < TK ? len - r0 : TK;
        float *kd = kt + stage * TK * ks, *vd = vt + stage * TK * hd4;
        const T *kg = tile_base(kb, r0), *vg = tile_base(vb, r0);
        if constexpr (sizeof(T) == 2) { /* f16: widened on the way (plain loads, see the top) */
            if (vec) {
                int n4 = hd >> 2;
                for (int i = tid; i < tl * n4; i += ATT_THREADS) {
                    int r = i / n4, c = (i - r * n4) * 4;
                    size_t o = roff(r0, r) + c;
                    *(float4 *)(kd + r * ks + c) = kv_load4(kg + o);
                    *(float4 *)(vd + r * hd4 + c) = kv_load4(vg + o);
                }
            } else {
                for (int i = tid; i < tl * hd; i += ATT_THREADS) {
                    int r = i / hd, c = i - r * hd;
                    size_t o = roff(r0, r) + c;
                    kd[r * ks + c] = kv_load(kg + o);
                    vd[r * hd4 + c] = kv_load(vg + o);
                }
            }
        } else if (vec) {
            int n4 = hd >> 2;
            for (int i = tid; i < tl * n4; i += ATT_THREADS) {
                int r = i / n4, c = (i - r * n4) * 4;
                size_t o = roff(r0, r) + c;
                cp_async16(kd + r * ks + c, kg + o, 16);
                cp_async16(vd + r * hd4 + c, vg + o, 16);
            }
        } else {
            for (int i = tid; i < tl * hd; i += ATT_THREADS) {
                int r = i / hd, c = i - r * hd;
                size_t o = roff(r0, r) + c;
                cp_async4(kd + r * ks + c, kg + o, 4);
                cp_async4(vd + r * hd4 + c, vg + o, 4);
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
            const T *kg = tile_base(kb, r0), *vg = tile_base(vb, r0);
#pragma unroll
            for (int p = 0; p < PF; p++) {
                int i = tid + p * ATT_THREADS, r = i / n4, c = (i - r * n4) * 4;
                if (i < tl * n4) {
                    size_t o = roff(r0, r) + c;
                    pk[p] = __ldg((const uint2 *)(kg + o));
                    pv[p] = __ldg((const uint2 *)(vg + o));
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
#endif
