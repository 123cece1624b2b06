/* moe_group_emu.cpp - mr_group_kernel (src/engine/cuda/moe_group.cuh, the real device code of
 * TIDE_MOE_ROWS_MMA's grouping of a decode step's routed pairs by expert) run on the CPU: no GPU
 * was there when it was written, and this is how it was checked (`make moe-group-emu`).
 *
 * g++ compiles moe_group.cuh against the host stand-in engine/cuda/common.cuh here (the CTA's
 * 256 threads as host threads, a barrier for __syncthreads; emu_launch.h). Each case routes n
 * tokens to k distinct experts each (random, or skewed so that one expert takes every token and
 * needs two tiles), launches the kernel as cuda_moe_rows_grouped does (one CTA of 256 threads,
 * 2 (n_expert + 1) ints of shared memory, T = ceil(n / 16)), with every output starting as a
 * sentinel, and checks against a host grouping: tok lists each expert's tokens in ascending
 * order, experts ascending; every (token, choice) pair lands exactly once, tpos giving each
 * token's pairs in ascending expert order and tw their weights; groups hold the table's three
 * pointers of each expert; each expert's T tiles start at its first pair, 16 apart, and their
 * counts cover its pairs exactly (empty tiles count 0). Cases: one token, 17 tokens (two tiles),
 * more experts than threads (300, 1024), one expert with k = 1. */
#include "emu_launch.h"
#include "engine/cuda/moe_group.cuh"
#include <stdio.h>
#include <algorithm>

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(uint64_t n) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) % n; }

static int test(int n, int k, int n_expert, bool skew)
{
    std::vector<int32_t> routed((size_t)n * 2 * k);
    for (int t = 0; t < n; t++) {
        std::vector<int> pick;
        if (skew) pick.push_back(n_expert / 2); /* every token: two tiles of that expert */
        while ((int)pick.size() < k) {
            int e = (int)rnd(n_expert);
            if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        std::swap(pick[0], pick[rnd(k)]); /* the router's order is not the experts' */
        for (int j = 0; j < k; j++) {
            routed[(size_t)t * 2 * k + j] = pick[j];
            float w = (float)(rnd(1000) + 1) / 1000.0f;
            memcpy(&routed[(size_t)t * 2 * k + k + j], &w, 4);
        }
    }
    std::vector<const void *> table(3 * (size_t)n_expert);
    for (size_t i = 0; i < table.size(); i++) table[i] = (const void *)(uintptr_t)(0x10000 + 256 * i);
    int T = (n + MR_BN - 1) / MR_BN, P = n * k;
    std::vector<int> tok(P + 8, -7), tpos((size_t)n * k, -7);
    std::vector<float> tw((size_t)n * k, NAN);
    std::vector<mp_group> groups(n_expert, mp_group{{NULL, NULL, NULL}});
    std::vector<mp_tile> tiles((size_t)n_expert * T, mp_tile{-7, -7, -7});
    emu_launch({1, 1, 1}, 256, sizeof(int) * 2 * (size_t)(n_expert + 1), [&] {
        mr_group_kernel(routed.data(), n, k, n_expert, table.data(), T, tok.data(), tpos.data(), tw.data(),
                        groups.data(), tiles.data());
    });
    /* the host grouping */
    long bad = 0;
    std::vector<int> want_tok, first(n_expert + 1), pair_at((size_t)n * k, -1), cnt(n_expert, 0);
    for (int e = 0; e < n_expert; e++) {
        first[e] = (int)want_tok.size();
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (routed[(size_t)t * 2 * k + j] == e) {
                    pair_at[(size_t)t * k + j] = (int)want_tok.size();
                    want_tok.push_back(t);
                    cnt[e]++;
                }
    }
    first[n_expert] = P;
    for (int p = 0; p < P; p++) bad += tok[p] != want_tok[p];
    for (int p = P; p < P + 8; p++) bad += tok[p] != -7; /* nothing past the pairs */
    std::vector<int> seen(P, 0);
    for (int t = 0; t < n; t++) {
        /* the token's pairs by ascending expert id */
        std::vector<int> js(k);
        for (int j = 0; j < k; j++) js[j] = j;
        const int32_t *row = &routed[(size_t)t * 2 * k];
        std::sort(js.begin(), js.end(), [&](int a, int b) { return row[a] < row[b]; });
        for (int i = 0; i < k; i++) {
            int o = tpos[(size_t)t * k + i], j = js[i];
            float w;
            memcpy(&w, &row[k + j], 4);
            bad += o != pair_at[(size_t)t * k + j];
            bad += memcmp(&tw[(size_t)t * k + i], &w, 4) != 0;
            if (o >= 0 && o < P) seen[o]++;
        }
    }
    for (int p = 0; p < P; p++) bad += seen[p] != 1;
    for (int e = 0; e < n_expert; e++) {
        for (int i = 0; i < 3; i++) bad += groups[e].w[i] != table[3 * e + i];
        int covered = 0;
        for (int i = 0; i < T; i++) {
            const mp_tile &tl = tiles[(size_t)e * T + i];
            int want_cnt = std::min(std::max(cnt[e] - i * MR_BN, 0), MR_BN);
            bad += tl.g != e || tl.p0 != first[e] + i * MR_BN || tl.cnt != want_cnt;
            covered += tl.cnt;
        }
        bad += covered != cnt[e];
    }
    printf("n %3d k %d experts %4d%s tiles a expert %d: mismatches %ld  %s\n", n, k, n_expert, skew ? " skewed" : "", T,
           bad, bad ? "BAD" : "ok");
    fflush(stdout);
    return bad ? 1 : 0;
}

int main(void)
{
    int bad = 0;
    bad += test(1, 8, 128, false);
    bad += test(17, 8, 128, true);  /* one expert with 17 pairs: two tiles */
    bad += test(40, 4, 300, false); /* more experts than threads */
    bad += test(5, 1, 1, false);    /* one expert */
    bad += test(64, 8, 1024, true);
    bad += test(33, 6, 60, true);
    printf("%s\n", bad ? "FAILED" : "all cases agree");
    return bad ? 1 : 0;
}
