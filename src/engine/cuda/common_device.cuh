/* common_device.cuh - the device helpers every CUDA source of the backend shares (warp
 * reductions, dp4a dots, element dequantisation, the rms scale, the q8 quantiser), the tail of
 * common.cuh moved here verbatim so that the host emulations (tests/gpu/emu/, whose
 * engine/cuda/common.cuh stands in for the CUDA side) compile this very code with g++.
 * Included by common.cuh, which every .cu includes. */
#ifndef TIDE_CUDA_COMMON_DEVICE_CUH
#define TIDE_CUDA_COMMON_DEVICE_CUH

/* ---- device helpers ---- */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* acc + the dot of four int8x4 words w with the 16 int8 of x (dp4a, in w's order): the int8
 * block dots of mmq.cuh, kquant.cuh and qblock.cu are built from it, so they add in one order. */
__device__ __forceinline__ int dp4a_dot4(const int *w, int4 x, int acc)
{
    acc = __dp4a(w[0], x.x, acc);
    acc = __dp4a(w[1], x.y, acc);
    acc = __dp4a(w[2], x.z, acc);
    return __dp4a(w[3], x.w, acc);
}

/* The dot of eight int8x4 words w with a 32-value int8 block held as two int4, a then c. */
__device__ __forceinline__ int dp4a_dot8(const int *w, int4 a, int4 c)
{
    return dp4a_dot4(w + 4, c, dp4a_dot4(w, a, 0));
}

/* The sum of a 32-value int8 block held as a then c (dp4a against all-ones words). Written
 * out with one scalar word: dp4a_dot4 over an array of ones gives the same instructions but
 * another register numbering, and so another ptxas schedule. */
__device__ __forceinline__ int dp4a_sum32(int4 a, int4 c)
{
    const int ones = 0x01010101;
    int sx = __dp4a(ones, a.x, 0);
    sx = __dp4a(ones, a.y, sx);
    sx = __dp4a(ones, a.z, sx);
    sx = __dp4a(ones, a.w, sx);
    sx = __dp4a(ones, c.x, sx);
    sx = __dp4a(ones, c.y, sx);
    sx = __dp4a(ones, c.z, sx);
    return __dp4a(ones, c.w, sx);
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* The KV cache's elements, f32 or f16 (backend_i's f16 cache ops): stored from f32 (f16 rounded
 * to nearest even, the CPU's cpu_f16_round), read as f32 (exact). kv_load4: 4 elements from p,
 * 16-byte (f32) or 8-byte (f16) aligned. */
__device__ __forceinline__ float kv_load(const float *p) { return __ldg(p); }
__device__ __forceinline__ float kv_load(const __half *p)
{
    return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}
__device__ __forceinline__ float4 kv_load4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ float4 kv_load4(const __half *p)
{
    uint2 u = __ldg((const uint2 *)p);
    float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void kv_store(float *p, float x) { *p = x; }
__device__ __forceinline__ void kv_store(__half *p, float x) { *p = __float2half_rn(x); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Element i of a k-quant row (256-value super-blocks; layouts in kquant.cuh / gguf.c). */
__device__ __forceinline__ float kq_elem(uint32_t type, const uint8_t *row, int i)
{
    int j = (i & 255) >> 5, l = i & 31; /* sub-block of 32 and the value in it */
    if (type == 14) { /* Q6_K: 210 bytes */
        const uint8_t *b = row + (size_t)(i >> 8) * 210;
        int hh = j >> 2, sub = j & 3;
        uint8_t lo = b[64 * hh + 32 * (sub & 1) + l], hi = b[128 + 32 * hh + l];
        int q = (((sub & 2) ? lo >> 4 : lo & 15) | (((hi >> (2 * sub)) & 3) << 4)) - 32;
        float d = f16_bits_to_f32((uint16_t)(b[208] | (b[209] << 8)));
        return d * (float)(int8_t)b[192 + 8 * hh + 2 * sub + (l >> 4)] * (float)q;
    }
    /* Q4_K (144 bytes) / Q5_K (176): f16 d, f16 dmin, 12 scale bytes, [32 fifth-bit bytes], nibbles */
    const uint8_t *b = row + (size_t)(i >> 8) * (type == 12 ? 144 : 176), *s = b + 4;
    int sc, mn;
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    uint8_t qb = b[(type == 12 ? 16 : 48) + 32 * (j >> 1) + l];
    int q = (j & 1) ? qb >> 4 : qb & 15;
    if (type == 13)
        q |= ((b[16 + l] >> j) & 1) << 4;
    float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8))), dmin = f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8)));
    return d * (float)sc * (float)q - dmin * (float)mn;
}

/* gguf.c's fixed tables of the 4-bit non-linear types (quants.c: iq4nl_values, and MXFP4's
 * e2m1 codes doubled, so that they are integers) */
static __constant__ int8_t qb_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
static __constant__ int8_t qb_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4's e8m0 exponent as the scale of the doubled table: 2^(e - 128) (quants.c mxfp4_scale) */
__device__ __forceinline__ float qb_mxfp4_scale(uint8_t e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* Element i of a q5_0 (6), q5_1 (7), iq4_xs (23) or MXFP4 (39) row (layouts: quants.c). */
__device__ __forceinline__ float qb_elem(uint32_t type, const uint8_t *row, int i)
{
    int j = i & 31, lo = j & 15, hi = j >> 4;
    if (type == 23) { /* iq4_xs: 136-byte super-blocks of 8 sub-blocks */
        const uint8_t *b = row + (size_t)(i >> 8) * 136;
        int sb = (i & 255) >> 5, sh = b[2] | (b[3] << 8);
        int ls = (((b[4 + sb / 2] >> (4 * (sb % 2))) & 15) | (((sh >> (2 * sb)) & 3) << 4)) - 32;
        uint8_t q = b[8 + 16 * sb + lo];
        float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        return d * (float)ls * (float)qb_iq4nl[hi ? q >> 4 : q & 15];
    }
    if (type == 39) { /* MXFP4: 17 bytes */
        const uint8_t *b = row + (size_t)(i >> 5) * 17;
        uint8_t q = b[1 + lo];
        return (float)qb_mxfp4[hi ? q >> 4 : q & 15] * qb_mxfp4_scale(b[0]);
    }
    bool q51 = type == 7; /* q5_0: 22 bytes f16 d, u32 qh, nibbles; q5_1: 24, f16 d, f16 m first */
    const uint8_t *b = row + (size_t)(i >> 5) * (q51 ? 24 : 22), *p = b + (q51 ? 4 : 2);
    uint32_t qh = p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
    uint8_t qb = p[4 + lo];
    int q = (hi ? qb >> 4 : qb & 15) | (int)(((qh >> j) & 1) << 4);
    float d = f16_bits_to_f32((uint16_t)(b[0] | (b[1] << 8)));
    return q51 ? (float)q * d + f16_bits_to_f32((uint16_t)(b[2] | (b[3] << 8))) : (float)(q - 16) * d;
}

/* Element i of a row of any supported type (slow path: norms, embeddings, fallbacks). */
__device__ __forceinline__ float row_elem(uint32_t type, const uint8_t *row, int i)
{
    switch (type) {
    case 0: /* F32 */
        return ((const float *)row)[i];
    case 1: /* F16 */
        return f16_bits_to_f32(((const uint16_t *)row)[i]);
    case 30: /* BF16 */
        return bf16_bits_to_f32(((const uint16_t *)row)[i]);
    case 8: { /* Q8_0: 34-byte blocks, f16 scale then 32 int8 */
        const uint8_t *b = row + (size_t)(i / QK) * 34;
        uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
        return f16_bits_to_f32(d) * (float)(int8_t)b[2 + i % QK];
    }
    case 2: { /* Q4_0: 18-byte blocks, f16 scale, low nibbles = 0..15, high = 16..31 */
        const uint8_t *b = row + (size_t)(i / QK) * 18;
        uint16_t d = (uint16_t)(b[0] | (b[1] << 8));
        int j = i % QK;
        uint8_t q = b[2 + (j & 15)];
        int v = j < 16 ? (q & 15) : (q >> 4);
        return f16_bits_to_f32(d) * (float)(v - 8);
    }
    case 12: case 13: case 14: /* Q4_K, Q5_K, Q6_K */
        return kq_elem(type, row, i);
    case 6: case 7: case 23: case 39: /* q5_0, q5_1, iq4_xs, MXFP4 */
        return qb_elem(type, row, i);
    default:
        return 0.0f;
    }
}

/* The block size rmsnorm runs a vector of dim with: the reduction order, and so the bits,
 * depend on it, and the kernels that norm on the way (qk_norm_rope_kernel,
 * mmvq_fused3_kernel) must reduce as rmsnorm_kernel does. */
static inline int norm_block(int dim) { return dim <= 32 ? 32 : dim <= 128 ? 128 : 256; }

/* The CTA's total of each thread's ss, in one fixed order (warp sums, then warp 0 over those):
 * every kernel that norms reduces through here, so their scales agree to the bit. Every
 * thread calls it; red is 32 shared floats, free again after the call returns. */
__device__ __forceinline__ float block_sum(float ss, float *red)
{
    ss = warp_sum(ss);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0)
        red[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0)
            red[0] = t;
    }
    __syncthreads();
    float total = red[0];
    __syncthreads(); /* everyone has read red[0] before red is written again */
    return total;
}

/* rms_scale over values the threads already hold: v[k] is element k * stride + threadIdx.x
 * (stride = blockDim.x), none past cols; the same f32 per-thread sum and block_sum. */
template <int N>
__device__ __forceinline__ float rms_scale_held(const float (&v)[N], int cols, int stride, float eps, float *red)
{
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < N; k++)
        if (k * stride + (int)threadIdx.x < cols)
            ss = fmaf(v[k], v[k], ss);
    return 1.0f / sqrtf(block_sum(ss, red) / (float)cols + eps);
}

/* 1 / sqrt(mean(v^2) + eps) as rmsnorm_kernel computes it: f32 sum of squares per thread
 * (stride blockDim), reduced across the CTA through red (32 shared floats). Every thread of
 * the CTA calls it; a second call needs a __syncthreads() first (red is reused). */
__device__ __forceinline__ float rms_scale(const float *v, int dim, float eps, float *red)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss = fmaf(v[i], v[i], ss);
    return 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
}

/* Element e of a vector quantised to q8 blocks of 32 (one warp holds a block: lane = e % 32):
 * the scale from the block's largest magnitude, as quantize_q8_kernel does. */
__device__ __forceinline__ void quantize_q8_elem(float v, int e, int8_t *xq, float *xd)
{
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[e] = (int8_t)__float2int_rn(v * id);
    if ((threadIdx.x & 31) == 0)
        xd[e / QK] = __half2float(__float2half_rn(d));
}

#endif
