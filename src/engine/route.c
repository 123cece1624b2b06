/* route.c - top-k MoE routing on the host: the CPU backend's route slot. */
#include "route.h"

#include <math.h>
#include <stddef.h>

/* The CUDA kernel (cuda/moe.cu route_kernel) follows this step for step: selection by
 * repeated arg-max (ties -> lower index), exponentials in double, then the k chosen sorted by
 * index. The sort does not change a sum: the per-expert path visits experts in index order. */
#define ROUTE_MAX_K 64
void route_topk(const float *logits, int n, int n_expert, int k, bool norm, int32_t *out)
{
    if (k < 1 || k > ROUTE_MAX_K || k > n_expert)
        return;
    int32_t *sel_all = out;
    float *w_all = (float *)(out + (size_t)n * k);
    for (int t = 0; t < n; t++) {
        const float *lg = logits + (size_t)t * n_expert;
        int sel[ROUTE_MAX_K] = {0};
        double w[ROUTE_MAX_K];
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_expert; e++) {
                bool used = false;
                for (int i = 0; i < j; i++)
                    if (sel[i] == e) { used = true; break; }
                if (!used && (best < 0 || lg[e] > lg[best]))
                    best = e;
            }
            sel[j] = best;
        }
        float mx = lg[sel[0]]; /* the largest logit */
        double all = 0.0, top = 0.0;
        for (int e = 0; e < n_expert; e++)
            all += exp((double)lg[e] - mx);
        for (int j = 0; j < k; j++) {
            w[j] = (double)(float)exp((double)lg[sel[j]] - mx);
            top += w[j];
        }
        double z = norm ? top : all;
        for (int j = 1; j < k; j++) { /* insertion sort by expert index */
            int e = sel[j], i = j;
            double wj = w[j];
            for (; i > 0 && sel[i - 1] > e; i--)
                sel[i] = sel[i - 1], w[i] = w[i - 1];
            sel[i] = e, w[i] = wj;
        }
        for (int j = 0; j < k; j++) {
            sel_all[(size_t)t * k + j] = sel[j];
            w_all[(size_t)t * k + j] = (float)(w[j] / z);
        }
    }
}

