/* bench-sampler.c - the host sampler's time per token at temperature 1 (top_k, top_p, min_p
 * off) over a Qwen3-sized vocabulary of logits spread uniformly over SPREAD units: a small
 * spread is a flat distribution (a random-weight model), a large one a peaked one.
 * Built and run by scripts/bench-sampler.sh. */
#define _POSIX_C_SOURCE 200809L
#include "engine/sample.h"

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
        double spread = atof(argv[a]);
        srand(1);
        for (int i = 0; i < V; i++)
            l[i] = (float)(spread * rand() / (double)RAND_MAX);
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
        printf("spread %5.1f: %.3f ms a token (sum of ids %ld)\n", spread, (now_s() - t0) / N * 1e3, check);
        sampler_free(&s);
    }
    free(l);
    free(w);
    return 0;
}
