/* test_route.c - host top-k routing (backend_i.route's contract): the chosen experts and their
 * order, ties, and the two weight rules, against a plain reference written here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/route.h"

/* Reference: sort all experts by (logit desc, index asc), take k, then sort those by index. */
static void reference(const float *lg, int ne, int k, bool norm, int *sel, float *w)
{
    int *ord = malloc(sizeof(int) * ne);
    for (int e = 0; e < ne; e++) ord[e] = e;
    for (int i = 1; i < ne; i++) /* insertion sort, stable by index on ties */
        for (int j = i; j > 0 && lg[ord[j]] > lg[ord[j - 1]]; j--) {
            int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
        }
    double mx = lg[ord[0]], all = 0, top = 0;
    for (int e = 0; e < ne; e++) all += exp(lg[e] - mx);
    for (int j = 0; j < k; j++) top += exp(lg[ord[j]] - mx);
    for (int j = 0; j < k; j++) sel[j] = ord[j];
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && sel[j] < sel[j - 1]; j--) {
            int t = sel[j]; sel[j] = sel[j - 1]; sel[j - 1] = t;
        }
    for (int j = 0; j < k; j++) w[j] = (float)(exp(lg[sel[j]] - mx) / (norm ? top : all));
    free(ord);
}

Test(route, topk_in_index_order_with_ties_and_both_weight_rules)
{
    static const int cfg[][3] = {{8, 2, 5}, {128, 8, 9}, {60, 4, 3}, {16, 16, 2}};
    unsigned seed = 7;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int ne = cfg[c][0], k = cfg[c][1], n = cfg[c][2];
        for (int norm = 0; norm < 2; norm++) {
            float *lg = malloc(sizeof(float) * n * ne);
            for (int i = 0; i < n * ne; i++)
                lg[i] = (float)(rand_r(&seed) % 2000) / 250.0f - 4.0f; /* coarse values: many ties */
            lg[ne - 1] = lg[ne / 2] = lg[1] = 9.0f; /* token 0: a three-way tie at the top */
            int32_t *out = malloc(sizeof(int32_t) * 2 * n * k);
            memset(out, 0xff, sizeof(int32_t) * 2 * n * k);
            route_topk(lg, n, ne, k, norm, out);
            const float *w = (const float *)(out + (size_t)n * k);
            for (int t = 0; t < n; t++) {
                int rs[64];
                float rw[64];
                reference(lg + (size_t)t * ne, ne, k, norm, rs, rw);
                double sum = 0;
                for (int j = 0; j < k; j++) {
                    cr_assert_eq(out[t * k + j], rs[j], "ne %d k %d token %d choice %d: expert %d, want %d", ne, k, t,
                                 j, out[t * k + j], rs[j]);
                    cr_assert_float_eq(w[t * k + j], rw[j], 1e-6, "weight %d of token %d", j, t);
                    sum += w[t * k + j];
                }
                if (norm)
                    cr_assert_float_eq(sum, 1.0, 1e-5, "renormalised weights sum to 1");
            }
            if (k == 2) /* the tie on token 0: 1 and ne/2 win over ne-1 */
                cr_assert(out[0] == 1 && out[1] == ne / 2, "tie: the lower indices win (%d, %d)", out[0], out[1]);
            free(lg);
            free(out);
        }
    }
}

Test(route, k_out_of_range_leaves_out_untouched)
{
    float lg[4] = {1, 2, 3, 4};
    int32_t out[16];
    memset(out, 0x5a, sizeof out);
    route_topk(lg, 1, 4, 5, true, out);
    route_topk(lg, 1, 4, 0, true, out);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(out[i], 0x5a5a5a5a);
}
