/* moe_group.cuh - moe_prefill.cu's tile and group records and mr_group_kernel (TIDE_MOE_ROWS_MMA:
 * a decode step's routed pairs grouped by expert on the device), moved here verbatim so that the
 * host emulation (tests/gpu/emu/moe_group_emu.cpp, `make moe-group-emu`) compiles this very code
 * with g++. moe_prefill.cu includes it inside its anonymous namespace, after common.cuh; it
 * includes nothing itself. */

struct mp_tile {
    int g, p0, cnt; /* group, its first pair in this tile, pairs (<= BN) */
};
struct mp_group {
    const uint8_t *w[3]; /* gate, up, down data */
};

#define MR_BN 16 /* pairs a tile: an expert has at most n pairs (a token picks it once) */

/* One CTA: the (token, choice) pairs of routed (n, 2k: k expert ids, then k weights' bits)
 * grouped by expert, tokens ascending within an expert: tok (P) each pair's token; tpos / tw
 * (n, k) each token's pairs' places in that order and weights, by ascending expert id; groups
 * (n_expert) the table's weights; tiles (n_expert, T) of MR_BN pairs. cnt / off: dynamic
 * shared memory of 2 * (n_expert + 1) ints. */
__global__ void mr_group_kernel(const int32_t *__restrict__ routed, int n, int k, int n_expert,
                                const void *const *__restrict__ table, int T, int *__restrict__ tok,
                                int *__restrict__ tpos, float *__restrict__ tw, mp_group *__restrict__ groups,
                                mp_tile *__restrict__ tiles)
{
    extern __shared__ int mr_sm[];
    int *cnt = mr_sm, *off = mr_sm + n_expert + 1;
    const int P = n * k;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int c = 0;
        for (int p = 0; p < P; p++)
            c += routed[(size_t)(p / k) * 2 * k + p % k] == e;
        cnt[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* n_expert <= 1024: a serial scan is a few microseconds at most */
        int o = 0;
        for (int e = 0; e < n_expert; e++) {
            off[e] = o;
            o += cnt[e];
        }
        off[n_expert] = o;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int o = off[e];
        for (int p = 0; p < P; p++) {
            int t = p / k, j = p % k;
            const int32_t *row = routed + (size_t)t * 2 * k;
            if (row[j] != e)
                continue;
            int rank = 0; /* this pair's place among the token's pairs by expert id */
            for (int i = 0; i < k; i++)
                rank += row[i] < e;
            tok[o] = t;
            tpos[(size_t)t * k + rank] = o;
            tw[(size_t)t * k + rank] = __int_as_float(row[k + j]);
            o++;
        }
        groups[e] = mp_group{{(const uint8_t *)table[3 * e], (const uint8_t *)table[3 * e + 1],
                              (const uint8_t *)table[3 * e + 2]}};
        for (int i = 0; i < T; i++) {
            int rem = cnt[e] - i * MR_BN;
            tiles[(size_t)e * T + i] = mp_tile{e, off[e] + i * MR_BN, rem <= 0 ? 0 : rem < MR_BN ? rem : MR_BN};
        }
    }
}
