/* bench-sampler.c - the host sampler's time per token at temperature 1 (top_k, top_p, min_p
 * off) over a Qwen3-sized vocabulary of logits: an argument S spreads them uniformly over S
 * units (small: a flat distribution; large: a peaked one), gS draws them from a Gaussian of
 * standard deviation S (what a random-weight model's output head gives).
 * Built and run by scripts/bench-sampler.sh. */
#define _POSIX_C_SOURCE 200809L
#include "engine/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    enum { V = 151936, N = 50 };
    float *l = malloc(sizeof(float) * V), *w = malloc(sizeof(float) * V);
    if (!l || !w)
        return 1;
    for (int a = 1; a < argc; a++) {
        bool gauss = argv[a][0] == 'g';
        double spread = atof(argv[a] + gauss);
        srand(1);
        for (int i = 0; i < V; i++) {
            double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0);
            l[i] = (float)(gauss ? spread * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v)
                                 : spread * rand() / (double)RAND_MAX);
        }
        struct sampling_params p;
        sampling_params_default(&p);
        p.seed = 7;
        struct sampler s;
        if (sampler_init(&s, &p, V) < 0)
            return 1;
        long check = 0;
        double t0 = now_s();
        for (int i = 0; i < N; i++) {
            memcpy(w, l, sizeof(float) * V);
            check += sampler_sample(&s, w, NULL);
        }
        printf("%-8s %5.1f: %.3f ms a token (sum of ids %ld)\n", gauss ? "gaussian" : "uniform", spread,
               (now_s() - t0) / N * 1e3, check);
        sampler_free(&s);
    }
    free(l);
    free(w);
    return 0;
}
