/* argmax.c - the greedy rule (sample.h: sampler_argmax), on its own: the forward and the CPU
 * backend use it, and a program that runs forwards without a sampler (the GPU tests) then does
 * not link the sampler's grammar and tokenizer. */
#include "sample.h"

int sampler_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) /* strict: ties keep the lowest id */
            best = i;
    return best;
}
