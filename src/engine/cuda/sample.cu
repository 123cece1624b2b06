/* sample.cu - backend_i.sample: a sampled token per row drawn on the device, so that a sampled
 * decode step brings back one int a row instead of each row's logits (151,936 floats for
 * Qwen3: at 32 sequences a 19 MB download and 32 host samplers in a row, ~100 ms a step).
 *
 * The definition is backend.h's; sample_rows.c is the same on the host, and test-gpu's
 * `sample` compares the two. One CTA of 1024 threads a row, and no sort: every step is a pass
 * over the row with a block reduction.
 *  - pass 1: the largest candidate (as an order-preserving integer key) and how many there are;
 *  - top_k: bisection on the key for the largest k with count(key >= k) >= top_k (32 passes);
 *  - top_p: bisection the same way on the weight above the key (32 passes);
 *  - the draw: each thread sums the kept weight of its own stretch of ids, an exclusive scan
 *    orders the stretches, and the one thread whose stretch holds r walks it id by id.
 * Weights are integers (2^-44 of the best's): the reductions are exact, so their order (which
 * is not the host's) changes nothing, and the same inputs always give the same id. Each pass
 * recomputes a weight from its logit (the same bits every time) instead of keeping a copy. */
#include "engine/cuda/common.cuh"

#include <float.h>
#include <math.h>
#include <string.h>

#define SAMPLE_THREADS 1024
#define SAMPLE_ROWS_MAX 64 /* rows whose parameters one launch takes by value */
#define W_ONE 0x1p44       /* sample_rows.h's SAMPLE_W_ONE */

struct sample_args {
    struct sample_row r[SAMPLE_ROWS_MAX];
};

/* A logit as a candidate (NaN and -inf are not), normalised as backend.h says (+inf ->
 * FLT_MAX, -0 -> +0), with its key: an unsigned integer in the floats' order. */
__device__ __forceinline__ bool candidate(float v, float &x, uint32_t &key)
{
    if (isnan(v) || v == -INFINITY)
        return false;
    if (v == INFINITY)
        v = FLT_MAX;
    uint32_t b = __float_as_uint(v);
    if (b == 0x80000000u)
        b = 0; /* -0 */
    x = __uint_as_float(b);
    key = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return true;
}

__device__ __forceinline__ float key_value(uint32_t key)
{
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/* sample_rows.c's weight(): the same double arithmetic, term by term (below -32 the weight
 * rounds to 0 whatever exp() gives) */
__device__ __forceinline__ uint64_t weight(float x, float m, float t)
{
    double d = ((double)x - (double)m) / (double)t;
    return d < -32.0 ? 0 : (uint64_t)rint(exp(d) * W_ONE);
}

/* Block-wide sum / max, the result in every thread. sh: 33 words of shared memory. */
__device__ uint64_t block_sum(uint64_t v, uint64_t *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads(); /* every thread has read the last result out of sh */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : 0;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

__device__ uint64_t block_max(uint64_t v, uint64_t *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t ov = __shfl_down_sync(0xffffffffu, v, o);
        v = ov > v ? ov : v;
    }
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) {
            uint64_t ov = __shfl_down_sync(0xffffffffu, v, o);
            v = ov > v ? ov : v;
        }
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* The sum of v over threads below this one (in threadIdx order); *total the whole block's. */
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t *sh, uint64_t *total)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint64_t inc = v; /* inclusive within the warp */
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += up;
    }
    __syncthreads();
    if (lane == 31)
        sh[warp] = inc;
    __syncthreads();
    if (warp == 0) { /* the warps' totals, scanned in place */
        uint64_t w = lane < nw ? sh[lane] : 0, wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            uint64_t up = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o)
                wi += up;
        }
        if (lane < nw)
            sh[lane] = wi - w; /* exclusive */
        if (lane == 31)
            sh[32] = wi;
    }
    __syncthreads();
    *total = sh[32];
    return sh[warp] + inc - v;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *__restrict__ logits, int n_vocab, sample_args a, int32_t *out)
{
    __shared__ uint64_t sh[33];
    const float *l = logits + (size_t)blockIdx.x * n_vocab;
    const struct sample_row p = a.r[blockIdx.x];
    const int tid = threadIdx.x, nt = blockDim.x;
    float x;
    uint32_t key;

    /* the largest candidate and the count */
    uint64_t kmax = 0, cnt = 0;
    for (int i = tid; i < n_vocab; i += nt)
        if (candidate(__ldg(l + i), x, key)) {
            cnt++;
            kmax = key > kmax ? key : kmax;
        }
    cnt = block_sum(cnt, sh);
    kmax = block_max(kmax, sh);
    if (cnt == 0) { /* nothing to draw (the whole block leaves here) */
        if (tid == 0)
            out[blockIdx.x] = 0;
        return;
    }
    const float m = key_value((uint32_t)kmax);
    const float t = p.temperature > 0.0f ? p.temperature : FLT_MIN;
    uint64_t tau = 0; /* kept: key >= tau */

    /* top_k: the largest lo with count(key >= lo) >= top_k; hi always fails it */
    if (p.top_k > 0 && (uint64_t)p.top_k < cnt) {
        uint64_t lo = 0, hi = kmax + 1;
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2, c = 0;
            for (int i = tid; i < n_vocab; i += nt)
                c += candidate(__ldg(l + i), x, key) && key >= mid;
            if (block_sum(c, sh) >= (uint64_t)p.top_k)
                lo = mid;
            else
                hi = mid;
        }
        tau = lo;
    }

    /* top_p: the largest lo >= tau whose weight above reaches top_p of the kept weight */
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        uint64_t s1 = 0;
        for (int i = tid; i < n_vocab; i += nt)
            if (candidate(__ldg(l + i), x, key) && key >= tau)
                s1 += weight(x, m, t);
        s1 = block_sum(s1, sh);
        const double target = (double)p.top_p * (double)s1;
        uint64_t lo = tau, hi = kmax + 1;
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2, s = 0;
            for (int i = tid; i < n_vocab; i += nt)
                if (candidate(__ldg(l + i), x, key) && key >= mid)
                    s += weight(x, m, t);
            if ((double)block_sum(s, sh) >= target)
                lo = mid;
            else
                hi = mid;
        }
        tau = lo;
    }

    /* min_p, then the draw: this thread's stretch of ids [i0, i1) */
    const double w_min = p.min_p > 0.0f ? (double)(p.min_p < 1.0f ? p.min_p : 1.0f) * W_ONE : 0.0;
    const int stretch = (n_vocab + nt - 1) / nt;
    const int i0 = tid * stretch < n_vocab ? tid * stretch : n_vocab;
    const int i1 = i0 + stretch < n_vocab ? i0 + stretch : n_vocab;
    uint64_t part = 0, total;
    for (int i = i0; i < i1; i++)
        if (candidate(__ldg(l + i), x, key) && key >= tau) {
            uint64_t w = weight(x, m, t);
            if ((double)w >= w_min)
                part += w;
        }
    const uint64_t before = block_exclusive_scan(part, sh, &total);
    const double u = p.u >= 0.0 ? p.u : 0.0, rs = u * (double)total;
    uint64_t r = rs < (double)total ? (uint64_t)rs : total - 1;
    if (r >= total)
        r = total - 1;
    if (part > 0 && before <= r && r - before < part) { /* exactly one thread: its stretch holds r */
        uint64_t acc = before;
        for (int i = i0; i < i1; i++)
            if (candidate(__ldg(l + i), x, key) && key >= tau) {
                uint64_t w = weight(x, m, t);
                if ((double)w < w_min)
                    continue;
                acc += w;
                if (acc > r) {
                    out[blockIdx.x] = i;
                    break;
                }
            }
    }
}

void cuda_sample(struct cuda_ctx *c, const float *logits, int n, int n_vocab, const struct sample_row *rows,
                 int32_t *out)
{
    if (c->err || n <= 0 || n_vocab <= 0)
        return;
    for (int r0 = 0; r0 < n; r0 += SAMPLE_ROWS_MAX) {
        int k = n - r0 < SAMPLE_ROWS_MAX ? n - r0 : SAMPLE_ROWS_MAX;
        sample_args a;
        memcpy(a.r, rows + r0, sizeof(struct sample_row) * (size_t)k);
        sample_kernel<<<k, SAMPLE_THREADS, 0, c->st>>>(logits + (size_t)r0 * n_vocab, n_vocab, a, out + r0);
        if (!CU_LAUNCH(c, "sample_kernel"))
            return;
    }
}
