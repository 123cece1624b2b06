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
 * recomputes a weight from its logit (the same bits every time) instead of keeping a copy.
 *
 * Before the draw, prep_kernel (one CTA a row) applies the row's MASK edits (the end-of-generation
 * ban), takes the logprobs of the row then (the host's raw logits) and applies the row's other edits (sample_edit: logit_bias, repetition and presence/frequency
 * penalties, a sparse list from the host sampler uploaded once a call through pinned staging)
 * in place, keeping each edited logit's old value; after it, finish_kernel writes the drawn
 * token's logprob from its old value. The logprobs: lse = mx + log(sum exp(x - mx)) in double
 * (a block reduction: the sum's order is not the host's, ~1e-12 apart), and the top N (<= 20) as
 * N block-wide maxima of (logit's order key, ~id), each below the last: descending, ties to the
 * lower id, as the host's insertion. The edits are float operations with rounding spelled out
 * (__fdiv_rn and friends), so that no contraction into an FMA makes them differ from the host. */
#include "engine/cuda/common.cuh"

#include <float.h>
#include <math.h>
#include <string.h>

#define SAMPLE_THREADS 1024
#define SAMPLE_ROWS_MAX 64 /* rows whose parameters one launch takes by value */
#define W_ONE 0x1p44       /* sample_rows.h's SAMPLE_W_ONE */

struct sample_args {
    struct sample_row r[SAMPLE_ROWS_MAX]; /* (edits: a host pointer, not read here) */
    int e0[SAMPLE_ROWS_MAX];              /* the row's first edit in the call's list */
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

/* Block-wide sum (MAX false) or max of v, the result in every thread: shuffles down each
 * warp, then warp 0 over the warps' results. sh: 33 words of shared memory. The one order of
 * block_sum, block_max and block_sum_d. */
template <bool MAX, typename T>
__device__ __forceinline__ T block_reduce(T v, T *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        T ov = __shfl_down_sync(0xffffffffu, v, o);
        v = MAX ? (ov > v ? ov : v) : v + ov;
    }
    __syncthreads(); /* every thread has read the last result out of sh */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : (T)0;
        for (int o = 16; o > 0; o >>= 1) {
            T ov = __shfl_down_sync(0xffffffffu, v, o);
            v = MAX ? (ov > v ? ov : v) : v + ov;
        }
        if (lane == 0)
            sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

__device__ uint64_t block_sum(uint64_t v, uint64_t *sh) { return block_reduce<false>(v, sh); }
__device__ uint64_t block_max(uint64_t v, uint64_t *sh) { return block_reduce<true>(v, sh); }
__device__ double block_sum_d(double v, double *sh) { return block_reduce<false>(v, sh); }

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

/* The order key of any logit but NaN (which gets 0, below every key): -0 reads as +0, the
 * infinities stay (logprobs rank the logits as they came in). */
__device__ __forceinline__ uint32_t order_key(float v)
{
    if (isnan(v))
        return 0;
    uint32_t b = __float_as_uint(v);
    if (b == 0x80000000u)
        b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* One CTA a row: its logprobs (lse kept for finish_kernel), then its edits in place. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    prep_kernel(float *__restrict__ logits, int n_vocab, sample_args a, const struct sample_edit *__restrict__ edits,
                float *__restrict__ old, double *__restrict__ lse_out, struct sample_logprob *__restrict__ lp)
{
    __shared__ uint64_t sh[33];
    __shared__ double shd[33];
    float *l = logits + (size_t)blockIdx.x * n_vocab;
    const struct sample_row &p = a.r[blockIdx.x];
    const int tid = threadIdx.x, nt = blockDim.x;
    if (p.logprobs && p.n_edits > 0) { /* the mask comes before the logprobs, as on the host */
        for (int j = tid; j < p.n_edits; j += nt) {
            const struct sample_edit e = edits[a.e0[blockIdx.x] + j];
            if ((e.what & SAMPLE_EDIT_MASK) && e.id >= 0 && e.id < n_vocab)
                l[e.id] = -INFINITY;
        }
        __syncthreads();
    }
    if (p.logprobs) {
        uint64_t kmax = 0;
        for (int i = tid; i < n_vocab; i += nt) {
            uint64_t k = order_key(l[i]);
            kmax = k > kmax ? k : kmax;
        }
        kmax = block_max(kmax, sh);
        /* the host's mx: the first largest, NaN never (unless all are: then this is wrong, as
         * the host's answer is NaN anyway) */
        const float mx = kmax ? key_value((uint32_t)kmax) : 0.0f;
        double sum = 0.0;
        for (int i = tid; i < n_vocab; i += nt)
            sum += exp((double)l[i] - (double)mx);
        const double lse = (double)mx + log(block_sum_d(sum, shd));
        int k = p.top_logprobs < 0 ? 0 : p.top_logprobs > SAMPLE_ROW_MAX_TOP ? SAMPLE_ROW_MAX_TOP : p.top_logprobs;
        k = k > n_vocab ? n_vocab : k;
        uint64_t below = ~0ull; /* the last one taken */
        for (int j = 0; j < k; j++) {
            uint64_t best = 0;
            for (int i = tid; i < n_vocab; i += nt) {
                uint64_t ck = ((uint64_t)order_key(l[i]) << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
                if (ck < below && ck > best)
                    best = ck;
            }
            best = block_max(best, sh);
            below = best;
            if (tid == 0) {
                int id = (int)(0xffffffffu - (uint32_t)(best & 0xffffffffu));
                lp[blockIdx.x].top_ids[j] = id;
                lp[blockIdx.x].top_logprobs[j] = (float)((double)l[id] - lse);
            }
        }
        if (tid == 0) {
            lp[blockIdx.x].n_top = k;
            lse_out[blockIdx.x] = lse;
        }
        __syncthreads(); /* every read of the row as it came in is done */
    }
    const float rp = p.repetition_penalty;
    for (int j = tid; j < p.n_edits; j += nt) {
        const struct sample_edit e = edits[a.e0[blockIdx.x] + j];
        if (e.id < 0 || e.id >= n_vocab)
            continue;
        float x = l[e.id];
        old[a.e0[blockIdx.x] + j] = x;
        if (e.what & (SAMPLE_EDIT_BAN | SAMPLE_EDIT_MASK))
            x = -INFINITY;
        else if (e.what & SAMPLE_EDIT_BIAS)
            x = __fadd_rn(x, e.bias);
        if (e.what & SAMPLE_EDIT_SEEN)
            x = x > 0.0f ? __fdiv_rn(x, rp) : __fmul_rn(x, rp);
        if (e.what & SAMPLE_EDIT_SUB)
            x = __fsub_rn(x, e.sub);
        l[e.id] = x;
    }
}

/* One CTA a row with logprobs: the drawn token's, from its logit as it came in. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    finish_kernel(const float *__restrict__ logits, int n_vocab, sample_args a,
                  const struct sample_edit *__restrict__ edits, const float *__restrict__ old,
                  const double *__restrict__ lse, const int32_t *__restrict__ out, struct sample_logprob *__restrict__ lp)
{
    __shared__ float raw_edited;
    __shared__ int edited;
    const struct sample_row &p = a.r[blockIdx.x];
    if (!p.logprobs)
        return;
    const int id = out[blockIdx.x];
    if (threadIdx.x == 0)
        edited = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < p.n_edits; j += blockDim.x)
        if (edits[a.e0[blockIdx.x] + j].id == id) { /* ids are unique: one writer */
            raw_edited = old[a.e0[blockIdx.x] + j];
            edited = 1;
        }
    __syncthreads();
    if (threadIdx.x == 0) {
        float raw = edited ? raw_edited : logits[(size_t)blockIdx.x * n_vocab + id];
        lp[blockIdx.x].id = id;
        lp[blockIdx.x].logprob = (float)((double)raw - lse[blockIdx.x]);
    }
}

/* Device room for a call (bytes: its edits, their old values, its rows' lse), and pinned
 * staging for its edits (host_bytes) at c->smp_host_at. The staging is a ring: a call's edits
 * go after the last call's, whose upload may not have run yet (several calls in a step: no
 * wait); only when the ring is full does the host wait for the uploads so far. The device
 * buffer is reused by every call: its copy and kernels are stream-ordered after the last one's. */
static bool sample_buffers(struct cuda_ctx *c, size_t bytes, size_t host_bytes)
{
    if (c->capturing) /* never: the logits' ops are not recorded (forward_eval.c step_logits) */
        return false;
    if (!c->ev_smp && !CU(c, cudaEventCreateWithFlags(&c->ev_smp, cudaEventDisableTiming)))
        return false;
    if (bytes > c->smp_n) {
        if (c->smp_dev && !CU(c, cudaFreeAsync(c->smp_dev, c->st)))
            return false;
        c->smp_dev = NULL;
        c->smp_n = 0;
        if (!CU(c, cudaMallocAsync(&c->smp_dev, bytes + bytes / 2, c->st)))
            return false;
        c->smp_n = bytes + bytes / 2;
    }
    if (c->smp_host_at + host_bytes <= c->smp_host_n)
        return true;
    if (!CU(c, cudaEventSynchronize(c->ev_smp))) /* every upload from the ring has run */
        return false;
    c->smp_host_at = 0;
    if (host_bytes <= c->smp_host_n)
        return true;
    if (c->smp_host)
        cudaFreeHost(c->smp_host);
    c->smp_host = NULL;
    c->smp_host_n = 0;
    size_t want = 4 * host_bytes > (256u << 10) ? 4 * host_bytes : (256u << 10);
    if (!CU(c, cudaHostAlloc(&c->smp_host, want, cudaHostAllocDefault)))
        return false;
    c->smp_host_n = want;
    return true;
}

void cuda_sample(struct cuda_ctx *c, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                 struct sample_logprob *lp)
{
    if (c->err || n <= 0 || n_vocab <= 0)
        return;
    size_t n_ed = 0;
    bool any_lp = false;
    for (int i = 0; i < n; i++) {
        n_ed += rows[i].edits && rows[i].n_edits > 0 ? (size_t)rows[i].n_edits : 0;
        any_lp = any_lp || (rows[i].logprobs && lp);
    }
    /* device layout: the edits, their old values, then the rows' lse (8-aligned) */
    size_t ed_b = sizeof(struct sample_edit) * n_ed, old_b = sizeof(float) * n_ed;
    size_t lse_at = (ed_b + old_b + 7) / 8 * 8, all_b = lse_at + sizeof(double) * (size_t)n;
    struct sample_edit *ed_d = NULL;
    float *old_d = NULL;
    double *lse_d = NULL;
    if (n_ed > 0 || any_lp) {
        if (!sample_buffers(c, all_b, ed_b)) {
            if (!c->err)
                cuda_fail(c, cudaErrorMemoryAllocation, "sample_buffers", __FILE__, __LINE__);
            return;
        }
        ed_d = (struct sample_edit *)c->smp_dev;
        old_d = (float *)((char *)c->smp_dev + ed_b);
        lse_d = (double *)((char *)c->smp_dev + lse_at);
        if (n_ed > 0) { /* into the ring's free part, then one copy */
            struct sample_edit *stage = (struct sample_edit *)((char *)c->smp_host + c->smp_host_at);
            size_t at = 0;
            for (int i = 0; i < n; i++)
                if (rows[i].edits && rows[i].n_edits > 0) {
                    memcpy(stage + at, rows[i].edits, sizeof(struct sample_edit) * (size_t)rows[i].n_edits);
                    at += (size_t)rows[i].n_edits;
                }
            c->smp_host_at += (ed_b + 15) / 16 * 16;
            if (!CU(c, cudaMemcpyAsync(ed_d, stage, ed_b, cudaMemcpyHostToDevice, c->st)) ||
                !CU(c, cudaEventRecord(c->ev_smp, c->st)))
                return;
        }
    }
    size_t e_at = 0;
    for (int r0 = 0; r0 < n; r0 += SAMPLE_ROWS_MAX) {
        int k = n - r0 < SAMPLE_ROWS_MAX ? n - r0 : SAMPLE_ROWS_MAX;
        sample_args a;
        bool prep = false, with_lp = false;
        memcpy(a.r, rows + r0, sizeof(struct sample_row) * (size_t)k);
        for (int i = 0; i < k; i++) {
            if (!a.r[i].edits)
                a.r[i].n_edits = 0;
            if (!lp)
                a.r[i].logprobs = false;
            a.e0[i] = (int)e_at;
            e_at += a.r[i].n_edits > 0 ? (size_t)a.r[i].n_edits : 0;
            prep = prep || a.r[i].n_edits > 0 || a.r[i].logprobs;
            with_lp = with_lp || a.r[i].logprobs;
        }
        float *l = logits + (size_t)r0 * n_vocab;
        if (prep) {
            prep_kernel<<<k, SAMPLE_THREADS, 0, c->st>>>(l, n_vocab, a, ed_d, old_d, lse_d + r0, lp ? lp + r0 : NULL);
            if (!CU_LAUNCH(c, "sample prep_kernel"))
                return;
        }
        sample_kernel<<<k, SAMPLE_THREADS, 0, c->st>>>(l, n_vocab, a, out + r0);
        if (!CU_LAUNCH(c, "sample_kernel"))
            return;
        if (with_lp) {
            finish_kernel<<<k, SAMPLE_THREADS, 0, c->st>>>(l, n_vocab, a, ed_d, old_d, lse_d + r0, out + r0, lp + r0);
            if (!CU_LAUNCH(c, "sample finish_kernel"))
                return;
        }
    }
}
