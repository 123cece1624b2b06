/* argmax.cu - backend_i.argmax: the greedy token picked on the device, so that a greedy
 * decode step brings back 4 bytes instead of the whole vocabulary's logits (151,936 floats
 * for Qwen3: a 608 KB download, a host copy and a host scan every token).
 *
 * The choice is sample.c's greedy rule: scanning from index 0, a value replaces the best only
 * when strictly larger, so ties keep the lowest index, NaN never wins, and a NaN at index 0
 * is never replaced. One CTA: at decode a vocabulary is a few hundred KB, which one SM reads
 * in a few microseconds, and one CTA needs no second pass to combine partial results. */
#include "engine/cuda/common.cuh"

#include <math.h>

#define ARGMAX_THREADS 1024

/* (v, i) beats (bv, bi): i valid, and bi not, or a larger value, or the same at a lower index */
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi)
{
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/* lane 0 ends with the warp's best (bv, bi) */
__device__ __forceinline__ void warp_argmax(float &bv, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *__restrict__ x, int n, int32_t *out)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    float bv = 0.0f;
    int bi = -1; /* -1: no non-NaN value seen */
    for (int i = threadIdx.x; i < n; i += blockDim.x) { /* ascending: strict > keeps the lowest */
        float v = __ldg(x + i);
        if (!isnan(v) && (bi < 0 || v > bv)) {
            bv = v;
            bi = i;
        }
    }
    warp_argmax(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = (blockDim.x + 31) >> 5;
        bv = lane < nw ? sv[lane] : 0.0f;
        bi = lane < nw ? si[lane] : -1;
        warp_argmax(bv, bi);
        if (lane == 0)
            out[0] = bi < 0 || isnan(x[0]) ? 0 : bi;
    }
}

void cuda_argmax(struct cuda_ctx *c, const float *x, int n, int32_t *out)
{
    if (c->err || n <= 0)
        return;
    argmax_kernel<<<1, ARGMAX_THREADS, 0, c->st>>>(x, n, out);
    CU_LAUNCH(c, "argmax_kernel");
}
