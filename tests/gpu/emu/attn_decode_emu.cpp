/* attn_decode_emu.cpp - the split decode attention (src/engine/cuda/attention_decode.cuh, the
 * real device code of TIDE_DECODE_ATTN_SPLIT) run on the CPU: no GPU was there when it was
 * written, and this is how its index math was checked (`make decode-attn-emu`).
 *
 * g++ compiles attention_decode.cuh against the host stand-in engine/cuda/common.cuh here (host
 * threads for the CTA's 128 threads, a barrier for __syncthreads, warp shuffles exchanged; see
 * that file and emu_launch.h). cuda_attention_split's host part (the cut: want, pstride, the
 * grid, the merge launch) is copied below (keep in step with attention_decode.cu). Each case
 * fills q, the K and V caches (f32, or f16 bits) and runs the chunk kernel over every CTA of its
 * grid, then the merge, with out and the partials starting as NaN, and compares every output
 * with plain softmax attention in double over the same (f16-rounded) cache values: the largest
 * error relative to the output's largest value must be float rounding (< 2e-5), with no NaN.
 * Cases: head_dim 128 / 80 / 64 / 40 / 32 (the key split of the P V phase is 1, 1, 2, 3, 4; 80
 * and 40 leave threads out), groups of 1, 3, 8 and 12 query heads (12: a second, partial group
 * of 4), one key (no merge), 17 keys (a one-key tile), 33 chunks (the merge's second batch),
 * 2000 keys in 8 chunks of 16 tiles, and the attention_at form: 3 rows at positions read from
 * memory over scrambled slots, one row cut into a single chunk while the others are merged;
 * and attention_at of one row bit for bit the plain op at its position.
 * What it cannot check: the real shuffles, memory ordering on the GPU, speed (test-gpu does). */
#include "emu_launch.h"
#include "engine/cuda/attention_decode.cuh"
#include "ref_attention.h"
#include <stdio.h>

/* cuda_attention_split without the context: sm_count stands for the GPU's SMs */
template <typename T>
static void split_attention(const float *q, const T *kc, const T *vc, float *out, int pos, int n_head,
                            int n_head_kv, int head_dim, const int32_t *at, int n_ctx, int rows, const int32_t *slot,
                            size_t slot_elems, int sm_count, int *pstride_o)
{
    int group = n_head / n_head_kv, zgroups = (group + AD_G - 1) / AD_G;
    int per = n_head_kv * zgroups * rows;
    int want = (AD_PER_SM * (sm_count > 0 ? sm_count : 1) + per - 1) / per;
    int n_keys = at ? n_ctx : pos + 1, chunk, n_chunks;
    ad_split(n_keys, want, &chunk, &n_chunks);
    int pstride = at ? want : n_chunks;
    *pstride_o = pstride;
    std::vector<float> part;
    float *part_o = NULL, *part_ml = NULL;
    if (pstride > 1) {
        size_t po = (size_t)rows * n_head * pstride * head_dim;
        part.assign(po + (size_t)rows * n_head * pstride * 2, NAN);
        part_o = part.data();
        part_ml = part.data() + po;
    }
    int hdb = head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : 128;
    size_t smem = (size_t)ad_smem_floats(head_dim) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim);
    emu_dim grid = {(unsigned)n_head_kv, (unsigned)pstride, (unsigned)(zgroups * rows)};
    auto go = [&](auto kern) {
        emu_launch(grid, AD_THREADS, smem, [&] {
            kern(q, kc, vc, out, part_o, part_ml, pos + 1, n_head_kv, group, head_dim, want, zgroups, scale, at, slot,
                 slot_elems);
        });
    };
    switch (hdb) {
    case 32: go(attn_split_kernel<32, T>); break;
    case 64: go(attn_split_kernel<64, T>); break;
    default: go(attn_split_kernel<128, T>); break;
    }
    if (pstride == 1)
        return;
    emu_launch({(unsigned)(n_head * rows), 1, 1}, AD_MERGE, 0, [&] {
        attn_split_merge(part_o, part_ml, out, head_dim, pos + 1, want, pstride, at, n_head);
    });
}

/* one case: with at == NULL one row at pos (slot 0); else rows at at[r] over slot[r] */
template <typename T>
static int test(const char *what, int hd, int n_head, int n_head_kv, int pos, int sm_count, int rows = 1,
                const int32_t *at = NULL, const int32_t *slot = NULL, int n_ctx = 0, int n_slots = 1)
{
    int group = n_head / n_head_kv;
    int ctx = at ? n_ctx : pos + 1;
    size_t kvd = (size_t)n_head_kv * hd, slot_elems = (size_t)ctx * kvd, qd = (size_t)n_head * hd;
    T *kc = (T *)aligned_alloc(64, (slot_elems * n_slots * sizeof(T) + 63) & ~(size_t)63);
    T *vc = (T *)aligned_alloc(64, (slot_elems * n_slots * sizeof(T) + 63) & ~(size_t)63);
    float *q = (float *)aligned_alloc(64, (rows * qd * sizeof(float) + 63) & ~(size_t)63);
    float *out = (float *)aligned_alloc(64, (rows * qd * sizeof(float) + 63) & ~(size_t)63);
    /* keys with a spread of scores (a few large ones), values of varied size */
    for (size_t i = 0; i < slot_elems * n_slots; i++) {
        kc[i] = to_cache<T>((float)(frand() * (i % 97 == 3 ? 3.0 : 1.0)));
        vc[i] = to_cache<T>((float)frand());
    }
    for (size_t i = 0; i < rows * qd; i++) q[i] = (float)frand() * 2.0f;
    for (size_t i = 0; i < rows * qd; i++) out[i] = NAN;
    int pstride;
    split_attention<T>(q, kc, vc, out, pos, n_head, n_head_kv, hd, at, n_ctx, rows, slot, slot_elems, sm_count,
                       &pstride);
    float scale = 1.0f / sqrtf((float)hd);
    double maxerr = 0, maxref = 0;
    long nan = 0;
    for (int r = 0; r < rows; r++) {
        int nk = at ? at[r] + 1 : pos + 1;
        size_t base = at && slot ? (size_t)slot[r] * slot_elems : 0;
        for (int h = 0; h < n_head; h++) {
            int kvh = h / group;
            const float *qh = q + r * qd + (size_t)h * hd;
            double ref[REF_MAX_HD];
            ref_attention_head(qh, kc + base, vc + base, nk, kvd, kvh, hd, scale, ref);
            for (int i = 0; i < hd; i++) {
                double o = ref[i];
                float got = out[r * qd + (size_t)h * hd + i];
                if (std::isnan(got)) { nan++; continue; }
                maxerr = fmax(maxerr, fabs(got - o));
                maxref = fmax(maxref, fabs(o));
            }
        }
    }
    double rel = maxerr / maxref;
    bool ok = nan == 0 && rel < 2e-5;
    printf("%-34s %s hd %3d heads %2d/%d rows %d keys %4d chunks a row <= %2d: max err %.3g, NaN %ld  %s\n", what,
           sizeof(T) == 2 ? "f16" : "f32", hd, n_head, n_head_kv, rows, at ? n_ctx : pos + 1, pstride, rel, nan,
           ok ? "ok" : "BAD");
    fflush(stdout);
    free(kc); free(vc); free(q); free(out);
    return ok ? 0 : 1;
}

/* attention_at of one row at pos (grid sized for n_ctx) against the plain op at pos: the same
 * cut of the same keys, so the same bits (test-gpu decode_attn_split's one-row claim) */
template <typename T>
static int same_bits(int hd, int n_head, int n_head_kv, int pos, int n_ctx, int sm_count)
{
    size_t kvd = (size_t)n_head_kv * hd, qd = (size_t)n_head * hd;
    T *kc = (T *)aligned_alloc(64, (n_ctx * kvd * sizeof(T) + 63) & ~(size_t)63);
    T *vc = (T *)aligned_alloc(64, (n_ctx * kvd * sizeof(T) + 63) & ~(size_t)63);
    float *q = (float *)aligned_alloc(64, (qd * sizeof(float) + 63) & ~(size_t)63);
    float *o1 = (float *)aligned_alloc(64, (qd * sizeof(float) + 63) & ~(size_t)63);
    float *o2 = (float *)aligned_alloc(64, (qd * sizeof(float) + 63) & ~(size_t)63);
    for (size_t i = 0; i < n_ctx * kvd; i++) kc[i] = to_cache<T>((float)frand()), vc[i] = to_cache<T>((float)frand());
    for (size_t i = 0; i < qd; i++) q[i] = (float)frand() * 2.0f, o1[i] = o2[i] = NAN;
    int ps1, ps2;
    const int32_t at[1] = {pos};
    split_attention<T>(q, kc, vc, o1, pos, n_head, n_head_kv, hd, NULL, 0, 1, NULL, 0, sm_count, &ps1);
    split_attention<T>(q, kc, vc, o2, 0, n_head, n_head_kv, hd, at, n_ctx, 1, NULL, 0, sm_count, &ps2);
    long diff = 0, nan = 0;
    for (size_t i = 0; i < qd; i++) diff += memcmp(&o1[i], &o2[i], 4) != 0, nan += std::isnan(o2[i]);
    bool ok = diff == 0 && nan == 0;
    printf("attention_at one row vs plain     %s hd %3d keys %4d of %4d, chunks %d / grid %d: differing %ld, NaN %ld  %s\n",
           sizeof(T) == 2 ? "f16" : "f32", hd, pos + 1, n_ctx, ps1, ps2, diff, nan, ok ? "ok" : "BAD");
    free(kc); free(vc); free(q); free(o1); free(o2);
    return ok ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    bad += test<float>("513 keys, 33 chunks (2 merge batches)", 128, 32, 4, 512, 132);
    bad += test<__half>("group 12: a partial second group", 64, 12, 1, 100, 8);
    bad += test<float>("one key: no merge", 80, 6, 2, 0, 132);
    bad += test<float>("17 keys: a one-key tile", 40, 4, 2, 16, 2);
    bad += test<__half>("2000 keys, 8 chunks of 16 tiles", 32, 8, 2, 1999, 4);
    bad += test<float>("group 1, 70 keys", 96, 4, 4, 69, 3);
    const int32_t at[3] = {5, 300, 47}, slot[3] = {2, 0, 1};
    bad += test<float>("attention_at: rows, slots", 64, 8, 2, 0, 16, 3, at, slot, 320, 3);
    bad += test<__half>("attention_at: rows, slots", 128, 16, 2, 0, 24, 3, at, slot, 320, 3);
    bad += test<float>("attention_at: no slots", 80, 3, 1, 0, 4, 3, at, NULL, 301, 1);
    bad += same_bits<float>(128, 32, 4, 200, 2048, 132);
    bad += same_bits<__half>(64, 16, 2, 20, 500, 16);
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}
