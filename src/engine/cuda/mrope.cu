/* mrope.cu - M-RoPE (engine/mrope.h) on the GPU: the qwen3vlmoe / qwen2vl text models' rope
 * whose pairs take their angle from one of a token's four position ids (interleaved or in
 * sections), and the Qwen-VL ViT's 2-D rope (a head's first quarter of pairs by the patch's
 * row, the second by its column). The position ids come from host memory (the CPU form reads
 * them in place): M-RoPE's travel in the launch's parameters, 64 tokens a launch, so a decode
 * step neither waits for the GPU nor copies; the 2-D rope's (thousands of patches, once a
 * block) are copied into the backend's stream-ordered scratch, which waits for the stream.
 * Angles in double as the CPU's, so the rotations agree to the last bit or two (the GPU
 * contracts x0 * cs - x1 * sn into an FMA). */
#include "engine/cuda/mrope.cuh"

#include <string.h>

struct mrope_sec {
    uint32_t s[4];
};

/* mrope_section_of (mrope.c) on the device: which of the four ids turns pair `pair` */
__device__ __forceinline__ int section_of(const mrope_sec &sec, int interleaved, int pair)
{
    uint32_t total = sec.s[0] + sec.s[1] + sec.s[2] + sec.s[3];
    if (total == 0)
        return 0;
    uint32_t s = (uint32_t)pair % total;
    if (interleaved) {
        if (s % 3 == 1 && s < 3 * sec.s[1]) return 1;
        if (s % 3 == 2 && s < 3 * sec.s[2]) return 2;
        if (s % 3 == 0 && s < 3 * sec.s[0]) return 0;
        return 3;
    }
    if (s < sec.s[0]) return 0;
    if (s < sec.s[0] + sec.s[1]) return 1;
    if (s < sec.s[0] + sec.s[1] + sec.s[2]) return 2;
    return 3;
}

__device__ __forceinline__ void turn(float *v, int i, int half, double a)
{
    float cs = (float)cos(a), sn = (float)sin(a);
    float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * cs - x1 * sn;
    v[i + half] = x0 * sn + x1 * cs;
}

#define MROPE_LAUNCH 64 /* tokens whose ids one launch carries */
struct mrope_ids {
    int32_t id[MROPE_LAUNCH * 4];
};

/* grid (pairs of all heads / 128, n <= MROPE_LAUNCH): token blockIdx.y, its ids pos.id[4t..] */
__global__ void rope_multi_kernel(float *vec, const mrope_ids pos, int n_heads, int head_dim, float theta,
                                  mrope_sec sec, int interleaved)
{
    int half = head_dim / 2, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= half * n_heads)
        return;
    int t = blockIdx.y, i = idx % half, h = idx / half;
    double a = pos.id[t * 4 + section_of(sec, interleaved, i)] * pow((double)theta, -2.0 * i / head_dim);
    turn(vec + ((size_t)t * n_heads + h) * head_dim, i, half, a);
}

/* the same grid; pos (n, 2): row, column */
__global__ void rope_2d_kernel(float *vec, const int32_t *__restrict__ pos, int n_heads, int head_dim, float theta)
{
    int half = head_dim / 2, quarter = head_dim / 4, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= half * n_heads)
        return;
    int t = blockIdx.y, i = idx % half, h = idx / half;
    int j = i < quarter ? i : i - quarter;
    double a = pos[(size_t)t * 2 + (i < quarter ? 0 : 1)] * pow((double)theta, -4.0 * j / head_dim);
    turn(vec + ((size_t)t * n_heads + h) * head_dim, i, half, a);
}

/* The ids into the scratch (stream-ordered; a pageable source is staged before the call
 * returns, so the caller may reuse it), then the kernel over tokens in chunks of 65535. */
static const int32_t *ids_on_device(struct cuda_ctx *c, const int32_t *pos, size_t n_ints)
{
    int32_t *d = (int32_t *)cuda_scratch(c, sizeof(int32_t) * n_ints);
    if (!d) {
        cuda_fail(c, cudaErrorMemoryAllocation, "rope position ids (scratch)", __FILE__, __LINE__);
        return NULL;
    }
    if (!CU(c, cudaMemcpyAsync(d, pos, sizeof(int32_t) * n_ints, cudaMemcpyHostToDevice, c->st)))
        return NULL;
    return d;
}

void cu_rope_multi(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                   const uint32_t sections[4], bool interleaved)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int work = n_heads * (head_dim / 2);
    if (!cuda_enter(c) || work <= 0 || n <= 0)
        return;
    mrope_sec sec = {{sections[0], sections[1], sections[2], sections[3]}};
    for (int t0 = 0; t0 < n; t0 += MROPE_LAUNCH) {
        int k = n - t0 < MROPE_LAUNCH ? n - t0 : MROPE_LAUNCH;
        mrope_ids ids;
        memcpy(ids.id, pos + (size_t)t0 * 4, sizeof(int32_t) * 4 * (size_t)k);
        dim3 grid((unsigned)((work + 127) / 128), (unsigned)k);
        rope_multi_kernel<<<grid, 128, 0, c->st>>>(vec + (size_t)t0 * n_heads * head_dim, ids, n_heads, head_dim, theta,
                                                   sec, interleaved);
        if (!CU_LAUNCH(c, "rope_multi_kernel"))
            return;
    }
}

void cu_rope_2d(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int work = n_heads * (head_dim / 2);
    if (!cuda_enter(c) || work <= 0 || n <= 0)
        return;
    const int32_t *d = ids_on_device(c, pos, (size_t)n * 2);
    if (!d)
        return;
    for (int t0 = 0; t0 < n; t0 += 65535) {
        int k = n - t0 < 65535 ? n - t0 : 65535;
        dim3 grid((unsigned)((work + 127) / 128), (unsigned)k);
        rope_2d_kernel<<<grid, 128, 0, c->st>>>(vec + (size_t)t0 * n_heads * head_dim, d + (size_t)t0 * 2, n_heads,
                                                head_dim, theta);
        if (!CU_LAUNCH(c, "rope_2d_kernel"))
            return;
    }
}
