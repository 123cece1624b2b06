/* paged_attn_emu.cpp - the paged decode attention (attn_chunk_kernel<HDB, T, PAGED = true> of
 * src/engine/cuda/attention_chunk.cuh, the real device code, with attention.cuh's kv_page_row)
 * run on the CPU: the paged form was written without a GPU, and this is how its addressing was
 * checked (`make paged-attn-emu`).
 *
 * g++ compiles attention_chunk.cuh against the host stand-ins engine/cuda/common.cuh and
 * mma_q.cuh here (threads, barriers, exchanged shuffles; cp.async landing as late as
 * cp.async.wait_group allows, or at once). The cut (want, the chunk count for attention_at) is
 * attention.cu's own att_plan; the rest of attention_one's host part (vec, the grid, the merge)
 * is copied below (keep in step with attention.cu). Each case builds a block pool with the sequence's blocks at scrambled places
 * (the unused blocks NaN, so a row read through a wrong table entry shows), the contiguous cache
 * the same rows make, and runs the contiguous kernel (PAGED false, the default path) over the
 * copy and the paged one over the pool, every CTA of the grid, then the merge: the two outputs
 * must be bit for bit the same (attention.cu: "the results are its bits over the same rows"),
 * with no NaN, and within float rounding (< 2e-5 of the largest output) of softmax attention in
 * double. Cases: block_rows 16 (every 32-key tile spans two blocks), 32, 64, 128; f32 and f16
 * caches; head_dim 64, 80, 128, 256 (16-key tiles) and 50 (rows copied 4 bytes at a time);
 * several chunks and one; attention_at with 3 rows at positions read from memory, each through
 * its slot's table (stride apart) in a shared pool. What it cannot check: the real cp.async and
 * shuffles, speed (test-gpu's paged attention tests do). */
#include "emu_launch.h"
#include "engine/cuda/attention_chunk.cuh"
#include "ref_attention.h"
#include <stdio.h>

bool emu_cp_late;
thread_local std::vector<std::vector<emu_copy>> emu_groups;
thread_local std::vector<emu_copy> emu_open;

/* attention_one without the context (sm_count stands for the GPU's SMs) */
template <typename T>
static void attention_one(const float *q, const T *k_cache, const T *v_cache, float *out, int pos, int n_head,
                          int n_head_kv, int head_dim, const int32_t *at, int n_ctx, int rows, const int32_t *slot,
                          size_t slot_floats, kv_pages pg, int sm_count, int *chunks_o)
{
    int n_keys = pos + 1, group = n_head / n_head_kv;
    int zgroups = (group + ATT_G - 1) / ATT_G;
    int hdb = head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
    size_t smem = (size_t)att_smem_floats(head_dim, att_tile(hdb)) * sizeof(float);
    int want, chunk, n_chunks;
    att_plan(sm_count, n_head_kv, zgroups, rows, at != NULL, n_ctx, n_keys, &want, &chunk, &n_chunks);
    *chunks_o = n_chunks;
    std::vector<float> ws;
    float *part_o = NULL, *part_ml = NULL;
    if (n_chunks > 1 || at) {
        size_t po = (size_t)rows * n_head * n_chunks * head_dim;
        ws.assign(po + (size_t)rows * n_head * n_chunks * 2 + 4, NAN);
        part_o = (float *)(((uintptr_t)ws.data() + 15) & ~(uintptr_t)15);
        part_ml = part_o + po;
    }
    bool vec = head_dim % 4 == 0 && (((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0;
    float scale = 1.0f / sqrtf((float)head_dim);
    emu_dim grid = {(unsigned)n_head_kv, (unsigned)n_chunks, (unsigned)(zgroups * rows)};
    auto go = [&](auto kern) {
        emu_launch(grid, ATT_THREADS, smem, [&] {
            emu_cp_reset();
            kern(q, k_cache, v_cache, out, part_o, part_ml, n_keys, n_head_kv, group, head_dim, chunk, n_chunks,
                 scale, at, want, vec, zgroups, slot, slot_floats, pg);
        });
    };
#define ATT_GO(D)                                                              \
    do {                                                                       \
        if (pg.tables) go(attn_chunk_kernel<D, T, true>);                     \
        else go(attn_chunk_kernel<D, T, false>);                              \
    } while (0)
    switch (hdb) {
    case 32: ATT_GO(32); break;
    case 64: ATT_GO(64); break;
    case 128: ATT_GO(128); break;
    default: ATT_GO(256); break;
    }
#undef ATT_GO
    if (n_chunks == 1 && !at)
        return;
    emu_launch({(unsigned)(n_head * rows), 1, 1}, MERGE_THREADS, 0, [&] {
        if (head_dim % 4 == 0)
            attn_merge_kernel<4>(part_o, part_ml, out, head_dim, n_chunks, at, want, n_head);
        else
            attn_merge_kernel<1>(part_o, part_ml, out, head_dim, n_chunks, at, want, n_head);
    });
}

/* one case: rows queries (at NULL: one at pos); sequence r has at[r] + 1 rows (pos + 1), its
 * blocks at scrambled places of one pool */
template <typename T>
static int test(const char *what, int hd, int n_head, int n_head_kv, int block_rows, int pos, int sm_count,
                bool late, int rows = 1, const int32_t *at = NULL, int n_ctx = 0)
{
    int shift = 0;
    while ((1 << shift) < block_rows) shift++;
    int ctx = at ? n_ctx : pos + 1;
    int nbs = (ctx + block_rows - 1) / block_rows; /* blocks a sequence's table holds */
    int stride = nbs + 3;                          /* table entries from one slot to the next */
    int pool_blocks = rows * nbs + 5;
    size_t kvd = (size_t)n_head_kv * hd, qd = (size_t)n_head * hd, bsz = (size_t)block_rows * kvd;
    T *kp = alloc<T>(pool_blocks * bsz), *vp = alloc<T>(pool_blocks * bsz);
    T nan = to_cache<T>(NAN);
    for (size_t i = 0; i < pool_blocks * bsz; i++) kp[i] = vp[i] = nan;
    std::vector<int32_t> perm(pool_blocks), tables((size_t)rows * stride, -1);
    for (int i = 0; i < pool_blocks; i++) perm[i] = i;
    for (int i = pool_blocks - 1; i > 0; i--) std::swap(perm[i], perm[rnd(i + 1)]);
    /* the contiguous caches: slot r's rows slot_floats apart, the same values */
    size_t slot_floats = (size_t)ctx * kvd;
    T *kc = alloc<T>(rows * slot_floats), *vc = alloc<T>(rows * slot_floats);
    for (int r = 0; r < rows; r++) {
        int used = at ? at[r] + 1 : pos + 1;
        for (int b = 0; b < nbs; b++) tables[(size_t)r * stride + b] = perm[r * nbs + b];
        for (int p = 0; p < ctx; p++)
            for (size_t i = 0; i < kvd; i++) {
                T kv = to_cache<T>((float)(frand() * (rnd(97) == 3 ? 3.0 : 1.0))), vv = to_cache<T>((float)frand());
                if (p >= used) kv = vv = nan; /* past the row's keys: never read */
                kc[r * slot_floats + p * kvd + i] = kv;
                vc[r * slot_floats + p * kvd + i] = vv;
                size_t pr = ((size_t)tables[(size_t)r * stride + (p >> shift)] << shift) | (size_t)(p & (block_rows - 1));
                kp[pr * kvd + i] = kv;
                vp[pr * kvd + i] = vv;
            }
    }
    float *q = alloc<float>(rows * qd), *oc = alloc<float>(rows * qd), *op = alloc<float>(rows * qd);
    for (size_t i = 0; i < rows * qd; i++) q[i] = (float)frand() * 2.0f;
    for (size_t i = 0; i < rows * qd; i++) oc[i] = op[i] = NAN;
    std::vector<int32_t> slot(rows);
    for (int r = 0; r < rows; r++) slot[r] = r;
    if (rows > 1) std::swap(slot[0], slot[rows - 1]); /* row 0 reads the last slot */
    /* the at rows as attention_at sees them: row r at at[slot[r]] */
    std::vector<int32_t> atr(rows);
    for (int r = 0; r < rows; r++) atr[r] = at ? at[slot[r]] : pos;
    emu_cp_late = late;
    int nch;
    attention_one<T>(q, kc, vc, oc, pos, n_head, n_head_kv, hd, at ? atr.data() : NULL, n_ctx, rows,
                     at ? slot.data() : NULL, slot_floats, kv_pages{}, sm_count, &nch);
    kv_pages pg = {tables.data(), at ? stride : 0, shift};
    attention_one<T>(q, kp, vp, op, pos, n_head, n_head_kv, hd, at ? atr.data() : NULL, n_ctx, rows,
                     at ? slot.data() : NULL, 0, pg, sm_count, &nch);
    long diff = 0, nanc = 0;
    double maxerr = 0, maxref = 0;
    int group = n_head / n_head_kv;
    float scale = 1.0f / sqrtf((float)hd);
    for (int r = 0; r < rows; r++) {
        int nk = atr[r] + 1;
        const T *K = kc + (size_t)slot[r] * slot_floats, *V = vc + (size_t)slot[r] * slot_floats;
        if (!at) K = kc, V = vc;
        for (int h = 0; h < n_head; h++) {
            int kvh = h / group;
            const float *qh = q + r * qd + (size_t)h * hd;
            double ref[REF_MAX_HD];
            ref_attention_head(qh, K, V, nk, kvd, kvh, hd, scale, ref);
            for (int i = 0; i < hd; i++) {
                double o = ref[i];
                size_t at_i = r * qd + (size_t)h * hd + i;
                diff += memcmp(&oc[at_i], &op[at_i], 4) != 0;
                if (std::isnan(op[at_i]) || std::isnan(oc[at_i])) { nanc++; continue; }
                maxerr = fmax(maxerr, fabs(op[at_i] - o));
                maxref = fmax(maxref, fabs(o));
            }
        }
    }
    double rel = maxerr / maxref;
    bool ok = diff == 0 && nanc == 0 && rel < 2e-5;
    printf("%-26s %s hd %3d heads %2d/%d block %3d rows %d keys %4d chunks %2d cp.async %s: paged vs contiguous "
           "differing %ld, NaN %ld, vs double %.2g  %s\n", what, sizeof(T) == 2 ? "f16" : "f32", hd, n_head, n_head_kv,
           block_rows, rows, ctx, nch, late ? "late " : "early", diff, nanc, rel, ok ? "ok" : "BAD");
    fflush(stdout);
    free(kp); free(vp); free(kc); free(vc); free(q); free(oc); free(op);
    return ok ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    bad += test<float>("tiles span 2 blocks", 128, 16, 2, 16, 300, 8, true);
    bad += test<__half>("f16 (register prefetch)", 128, 16, 2, 16, 300, 8, true);
    bad += test<float>("one chunk of 2 blocks", 64, 8, 4, 16, 30, 132, false);
    bad += test<__half>("block 64, group 12", 80, 12, 1, 64, 200, 6, true);
    bad += test<float>("hd 256: 16-key tiles", 256, 4, 2, 16, 100, 4, true);
    bad += test<float>("hd 50: 4-byte copies", 50, 6, 3, 128, 260, 5, true);
    bad += test<__half>("hd 50: f16 element loads", 50, 6, 3, 16, 95, 5, false);
    const int32_t at[3] = {40, 130, 7};
    bad += test<float>("attention_at, 3 slots", 64, 8, 2, 16, 0, 16, true, 3, at, 150);
    bad += test<__half>("attention_at, 3 slots", 128, 8, 2, 32, 0, 8, true, 3, at, 150);
    bad += test<float>("attention_at, block 128", 80, 4, 2, 128, 0, 3, false, 3, at, 140);
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}
