/* ref_attention.h - the double-precision reference of causal attention that the CPU backend's
 * attention tests (test_cpu_attention.c, test_kv_f16.c) check their kernels against. */
#ifndef TIDE_TEST_REF_ATTENTION_H
#define TIDE_TEST_REF_ATTENTION_H

#include <math.h>
#include <stdlib.h>

/* Output element i of head h for query token t at position pos + t: softmax(q k^T / sqrt(HD))
 * v over positions 0..pos + t, in double. q (n, H * HD), k and v (positions, HKV * HD) f32
 * rows; head h reads KV head h / (H / HKV). */
static inline double ref_attention(const float *q, const float *k, const float *v, int t, int h, int i, int H, int HKV,
                                   int HD, int pos)
{
    int kvh = h / (H / HKV), last = pos + t;
    double mx = -INFINITY, sum = 0, o = 0, *s = malloc(sizeof(double) * (size_t)(last + 1));
    for (int p = 0; p <= last; p++) {
        s[p] = 0;
        for (int e = 0; e < HD; e++)
            s[p] += (double)q[((size_t)t * H + h) * HD + e] * k[((size_t)p * HKV + kvh) * HD + e];
        s[p] /= sqrt((double)HD);
        mx = fmax(mx, s[p]);
    }
    for (int p = 0; p <= last; p++)
        sum += exp(s[p] - mx);
    for (int p = 0; p <= last; p++)
        o += exp(s[p] - mx) / sum * v[((size_t)p * HKV + kvh) * HD + i];
    free(s);
    return o;
}

#endif
