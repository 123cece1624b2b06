/* attention.cu - causal attention of one query token over the KV cache, GQA, any length
 * (decode; a prefill chunk goes to attention_prefill.cu, see cuda_attention at the end).
 *
 * Split-K ("flash-decoding"): the n_keys = pos + 1 cached positions are cut into chunks, one
 * CTA per (kv head, chunk, group of up to 8 query heads). A CTA reads each K and V row of its
 * chunk once for all query heads that share that kv head, keeps the chunk's scores in shared
 * memory, and writes an unnormalised partial output with its running max and sum. A second
 * kernel merges the partials. The chunk length adapts so that a long context fills every SM
 * while a short one runs as a single chunk that writes the output directly (one launch).
 *
 * Memory per call: only the partials, n_head * n_chunks * (head_dim + 2) floats, from the
 * backend's stream-ordered scratch. The (n_head, n_ctx) att buffer of the interface is not
 * needed here and is left untouched. */
#include "engine/cuda/common.cuh"

#include <math.h>

#define ATT_WARPS 4
#define ATT_G 8          /* query heads per CTA */
#define ATT_MAX_CHUNK 1024

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

/* DPL = dims per lane in the score phase (head_dim <= 32 * DPL). at (attention_at): the query's
 * position is *at, and n_keys, chunk, n_chunks are worked out here from it and want; the grid
 * is sized for the longest context and CTAs past n_chunks have nothing to do. */
template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attn_chunk_kernel(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
                  float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml,
                  int n_keys, int n_head_kv, int group, int hd, int chunk, int n_chunks, float scale,
                  const int32_t *at, int want)
{
    if (at) {
        n_keys = *at + 1;
        att_split(n_keys, want, &chunk, &n_chunks);
        if ((int)blockIdx.y >= n_chunks)
            return;
    }
    extern __shared__ float sm[];
    constexpr int HDP = DPL * 32;
    float *qs = sm;                        /* (ATT_G, HDP), zero-padded */
    float *sc = qs + ATT_G * HDP;          /* (ATT_G, chunk) scores, then probabilities */
    float *ml = sc + ATT_G * chunk;        /* (ATT_G, 2) chunk max, chunk sum */
    int kvh = blockIdx.x, ci = blockIdx.y, g0 = blockIdx.z * ATT_G;
    int G = group - g0 < ATT_G ? group - g0 : ATT_G;
    int h0 = kvh * group + g0;             /* first query head of this CTA */
    int kvd = n_head_kv * hd;
    int t0 = ci * chunk, t1 = t0 + chunk < n_keys ? t0 + chunk : n_keys, len = t1 - t0;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    for (int i = tid; i < ATT_G * HDP; i += blockDim.x) {
        int g = i / HDP, d = i % HDP;
        qs[i] = g < G && d < hd ? q[(size_t)(h0 + g) * hd + d] : 0.0f;
    }
    __syncthreads();

    /* scores: one warp per key, lanes across the head dims; two keys per step so that two
     * K rows are in flight before the reductions */
    for (int j = warp; j < len; j += 2 * ATT_WARPS) {
        int j2 = j + ATT_WARPS;
        bool two = j2 < len; /* warp-uniform */
        const float *kr = kc + (size_t)(t0 + j) * kvd + (size_t)kvh * hd;
        const float *kr2 = kc + (size_t)(t0 + (two ? j2 : j)) * kvd + (size_t)kvh * hd;
        float k[DPL], k2[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = lane + 32 * i;
            k[i] = d < hd ? __ldg(kr + d) : 0.0f;
            k2[i] = d < hd ? __ldg(kr2 + d) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < ATT_G; g++) {
            if (g < G) {
                float p = 0.0f, p2 = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    float qv = qs[g * HDP + lane + 32 * i];
                    p = fmaf(k[i], qv, p);
                    p2 = fmaf(k2[i], qv, p2);
                }
                p = warp_sum(p);
                p2 = warp_sum(p2);
                if (lane == 0) {
                    sc[g * chunk + j] = p * scale;
                    if (two)
                        sc[g * chunk + j2] = p2 * scale;
                }
            }
        }
    }
    __syncthreads();

    /* softmax pieces per head: max, exp, sum */
    for (int g = warp; g < G; g += ATT_WARPS) {
        float m = -INFINITY;
        for (int j = lane; j < len; j += 32)
            m = fmaxf(m, sc[g * chunk + j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < len; j += 32) {
            float p = expf(sc[g * chunk + j] - m);
            sc[g * chunk + j] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            ml[2 * g] = m;
            ml[2 * g + 1] = l;
        }
    }
    __syncthreads();

    /* P V: one thread per head dim, all G heads at once so each V element is read once */
    for (int d = tid; d < hd; d += blockDim.x) {
        float acc[ATT_G];
#pragma unroll
        for (int g = 0; g < ATT_G; g++)
            acc[g] = 0.0f;
        const float *vr = vc + (size_t)t0 * kvd + (size_t)kvh * hd + d;
#pragma unroll 8
        for (int j = 0; j < len; j++) {
            float v = __ldg(vr + (size_t)j * kvd);
#pragma unroll
            for (int g = 0; g < ATT_G; g++)
                acc[g] = fmaf(sc[g * chunk + j], v, acc[g]);
        }
#pragma unroll
        for (int g = 0; g < ATT_G; g++) {
            if (g < G) {
                int h = h0 + g;
                if (n_chunks == 1)
                    out[(size_t)h * hd + d] = acc[g] / ml[2 * g + 1];
                else
                    part_o[((size_t)h * n_chunks + ci) * hd + d] = acc[g];
            }
        }
    }
    if (n_chunks > 1 && tid < G) {
        int h = h0 + tid;
        part_ml[((size_t)h * n_chunks + ci) * 2] = ml[2 * tid];
        part_ml[((size_t)h * n_chunks + ci) * 2 + 1] = ml[2 * tid + 1];
    }
}

/* out[h] = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c, one CTA per query head. */
__global__ void attn_merge_kernel(const float *__restrict__ part_o, const float *__restrict__ part_ml,
                                  float *__restrict__ out, int hd, int n_chunks, const int32_t *at, int want)
{
    if (at) { /* attention_at: one chunk means the chunk kernel wrote out itself */
        int chunk;
        att_split(*at + 1, want, &chunk, &n_chunks);
        if (n_chunks == 1)
            return;
    }
    __shared__ float wgt[ATT_MAX_CHUNK];
    __shared__ float inv_l;
    int h = blockIdx.x;
    const float *ml = part_ml + (size_t)h * n_chunks * 2;
    if (threadIdx.x < 32) {
        float M = -INFINITY;
        for (int c = threadIdx.x; c < n_chunks; c += 32)
            M = fmaxf(M, ml[2 * c]);
        M = warp_max(M);
        float L = 0.0f;
        for (int c = threadIdx.x; c < n_chunks; c += 32) {
            float e = expf(ml[2 * c] - M);
            wgt[c] = e;
            L += e * ml[2 * c + 1];
        }
        L = warp_sum(L);
        if (threadIdx.x == 0)
            inv_l = 1.0f / L;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int c = 0; c < n_chunks; c++)
            o = fmaf(wgt[c], part_o[((size_t)h * n_chunks + c) * hd + d], o);
        out[(size_t)h * hd + d] = o * inv_l;
    }
}

/* at NULL: the query at position pos. at set (attention_at): at *at, below n_ctx, read when
 * the kernels run; pos is then unused but for the shape check. */
static void attention_one(struct cuda_ctx *c, const float *q, const float *k_cache, const float *v_cache,
                          float *out, int pos, int n_head, int n_head_kv, int head_dim, const int32_t *at = NULL,
                          int n_ctx = 0)
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
    /* aim for ~4 CTAs per SM over all (kv head, chunk, group) triples: the score phase is
     * latency-bound per warp, so it needs many warps resident */
    int per_chunk = n_head_kv * zgroups;
    int want = (4 * c->sm_count + per_chunk - 1) / per_chunk;
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
        size_t po = (size_t)n_head * n_chunks * head_dim;
        float *ws = (float *)cuda_scratch(c, (po + (size_t)n_head * n_chunks * 2) * sizeof(float));
        if (!ws)
            return;
        part_o = ws;            /* (n_head, n_chunks, head_dim) */
        part_ml = ws + po;      /* (n_head, n_chunks, 2) */
    }
    int dpl = (head_dim + 31) / 32;
    dpl = dpl <= 1 ? 1 : dpl <= 2 ? 2 : dpl <= 4 ? 4 : 8;
    size_t smem = ((size_t)ATT_G * dpl * 32 + (size_t)ATT_G * chunk + 2 * ATT_G) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim);
    dim3 grid((unsigned)n_head_kv, (unsigned)n_chunks, (unsigned)zgroups);
#define ATT_LAUNCH(D)                                                                                 \
    do {                                                                                              \
        if (smem > 48 * 1024 &&                                                                       \
            !CU(c, cudaFuncSetAttribute(attn_chunk_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)smem)))                                                  \
            return;                                                                                   \
        attn_chunk_kernel<D><<<grid, ATT_WARPS * 32, smem, c->st>>>(q, k_cache, v_cache, out, part_o,  \
                                                                    part_ml, n_keys, n_head_kv, group,  \
                                                                    head_dim, chunk, n_chunks, scale,   \
                                                                    at, want);                          \
    } while (0)
    switch (dpl) {
    case 1: ATT_LAUNCH(1); break;
    case 2: ATT_LAUNCH(2); break;
    case 4: ATT_LAUNCH(4); break;
    default: ATT_LAUNCH(8); break;
    }
#undef ATT_LAUNCH
    if (!CU_LAUNCH(c, "attn_chunk_kernel") || (n_chunks == 1 && !at))
        return;
    attn_merge_kernel<<<n_head, 128, 0, c->st>>>(part_o, part_ml, out, head_dim, n_chunks, at, want);
    CU_LAUNCH(c, "attn_merge_kernel");
}

void cuda_attention_at(struct cuda_ctx *c, const float *q, const float *k_cache, const float *v_cache, float *out,
                       const int32_t *at, int n_ctx, int n_head, int n_head_kv, int head_dim)
{
    if (!c->err && n_ctx > 0)
        attention_one(c, q, k_cache, v_cache, out, n_ctx - 1, n_head, n_head_kv, head_dim, at, n_ctx);
}

/* A chunk of n tokens: the tiled kernel (attention_prefill.cu, one launch) or the split-K
 * decode kernel once per token, whichever a cost model from the H200's timings says is faster
 * (bench_attention, bench_attention_prefill): the tiled kernel takes ~7 us a 32-key tile on a
 * CTA, ~2 CTAs an SM at once, and its CTAs split only the queries, so a short chunk deep in a
 * long context leaves most SMs idle while a few CTAs walk every key; the decode kernel spreads
 * the keys over the SMs at ~8 us + ~4 ns a key per token. */
void cuda_attention(struct cuda_ctx *c, const float *q, const float *k_cache, const float *v_cache,
                    float *out, int n, int pos, int n_head, int n_head_kv, int head_dim)
{
    if (c->err || n <= 0)
        return;
    if (n > 1 && n_head_kv > 0 && n_head >= n_head_kv) {
        double ctas = (double)n_head_kv * ceil((double)n * (n_head / n_head_kv) / 64.0);
        double waves = ctas / (2.0 * (c->sm_count > 0 ? c->sm_count : 1));
        double t_tiled = (waves < 1.0 ? 1.0 : waves) * ceil((pos + n) / 32.0) * 7.0;
        double t_token = n * (8.0 + 0.004 * (pos + n / 2.0));
        if (t_tiled <= t_token &&
            cuda_attention_prefill(c, q, k_cache, v_cache, out, n, pos, n_head, n_head_kv, head_dim))
            return;
    }
    size_t qd = (size_t)n_head * head_dim;
    for (int t = 0; t < n && !c->err; t++)
        attention_one(c, q + t * qd, k_cache, v_cache, out + t * qd, pos + t, n_head, n_head_kv, head_dim);
}
