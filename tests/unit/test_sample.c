/* test_sample.c - the sampler: greedy, top_k/top_p/min_p, seeding, penalties, logprobs. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine/sample.h"

#define NV 32

static void make_logits(float *l)
{
    /* distinct values with a clear maximum at id 7 */
    for (int i = 0; i < NV; i++)
        l[i] = (float)((i * 37) % NV) * 0.1f;
    l[7] = 5.0f;
}

static int sample_once(struct sampling_params *p)
{
    struct sampler s;
    float l[NV];
    make_logits(l);
    cr_assert_eq(sampler_init(&s, p, NV), 0);
    int id = sampler_sample(&s, l, NULL);
    sampler_free(&s);
    return id;
}

Test(sample, greedy_and_ties)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    cr_assert_eq(sample_once(&p), 7);

    struct sampler s;
    float l[NV] = {0};
    l[3] = 2.0f;
    l[9] = 2.0f;
    cr_assert_eq(sampler_init(&s, &p, NV), 0);
    cr_assert_eq(sampler_sample(&s, l, NULL), 3, "ties go to the lowest id");
    sampler_free(&s);
}

Test(sample, top_k_1_is_greedy)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_k = 1;
    for (uint64_t seed = 1; seed < 20; seed++) {
        p.seed = seed;
        cr_assert_eq(sample_once(&p), 7);
    }
}

static void draw_seq(uint64_t seed, int *out, int n)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 1.5f;
    p.seed = seed;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, NV), 0);
    for (int i = 0; i < n; i++) {
        float l[NV];
        for (int j = 0; j < NV; j++)
            l[j] = 0.01f * j; /* nearly flat: draws spread over the vocab */
        out[i] = sampler_sample(&s, l, NULL);
    }
    sampler_free(&s);
}

Test(sample, seeds)
{
    int a[64], b[64], c[64];
    draw_seq(42, a, 64);
    draw_seq(42, b, 64);
    draw_seq(43, c, 64);
    cr_assert(memcmp(a, b, sizeof(a)) == 0, "same seed, same sequence");
    cr_assert(memcmp(a, c, sizeof(a)) != 0, "different seeds differ");
    int z1[16], z2[16];
    draw_seq(0, z1, 16);
    draw_seq(0, z2, 16);
    cr_assert(memcmp(z1, z2, sizeof(z1)) == 0, "seed 0 is deterministic too");
}

Test(sample, top_p_tiny_is_argmax)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.top_p = 1e-6f;
    for (uint64_t seed = 1; seed < 20; seed++) {
        p.seed = seed;
        cr_assert_eq(sample_once(&p), 7);
    }
}

Test(sample, min_p)
{
    /* Two strong candidates, the rest far below: min_p 0.5 must keep only those two. */
    struct sampling_params p;
    sampling_params_default(&p);
    p.min_p = 0.5f;
    int seen2 = 0, seen5 = 0;
    for (uint64_t seed = 1; seed < 200; seed++) {
        p.seed = seed;
        struct sampler s;
        float l[NV];
        for (int i = 0; i < NV; i++)
            l[i] = 0.0f;
        l[2] = 6.0f;
        l[5] = 6.0f;
        cr_assert_eq(sampler_init(&s, &p, NV), 0);
        int id = sampler_sample(&s, l, NULL);
        sampler_free(&s);
        cr_assert(id == 2 || id == 5, "min_p let %d through", id);
        seen2 += id == 2;
        seen5 += id == 5;
    }
    cr_assert(seen2 > 0 && seen5 > 0);
}

Test(sample, penalties_change_argmax)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    p.presence_penalty = 2.0f;
    p.frequency_penalty = 1.0f;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, NV), 0);
    float l[NV] = {0};
    l[4] = 3.0f;
    l[6] = 2.0f;
    cr_assert_eq(sampler_sample(&s, l, NULL), 4);
    sampler_accept(&s, 4);
    float l2[NV] = {0};
    l2[4] = 3.0f;
    l2[6] = 2.0f;
    cr_assert_eq(sampler_sample(&s, l2, NULL), 6, "penalty must move the argmax");
    sampler_reset(&s, 1);
    float l3[NV] = {0};
    l3[4] = 3.0f;
    l3[6] = 2.0f;
    cr_assert_eq(sampler_sample(&s, l3, NULL), 4, "reset clears counts");
    sampler_free(&s);
}

Test(sample, logprobs)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.logprobs = true;
    p.top_logprobs = 5;
    p.temperature = 0.7f;
    p.presence_penalty = 1.0f;
    p.seed = 9;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, NV), 0);
    float l[NV];
    make_logits(l);
    struct token_logprob lp;
    int id = sampler_sample(&s, l, &lp);
    cr_assert_eq(lp.id, id);
    cr_assert(lp.logprob <= 0.0f);
    cr_assert_eq(lp.n_top, 5);
    cr_assert_eq(lp.top_ids[0], 7);
    double sum = 0;
    for (int i = 0; i < lp.n_top; i++) {
        sum += exp(lp.top_logprobs[i]);
        if (i)
            cr_assert(lp.top_logprobs[i] <= lp.top_logprobs[i - 1], "sorted descending");
    }
    cr_assert(sum <= 1.0 + 1e-5);
    /* the chosen logprob is under the raw softmax */
    float raw[NV];
    make_logits(raw);
    double z = 0;
    for (int i = 0; i < NV; i++)
        z += exp(raw[i]);
    cr_assert_float_eq(lp.logprob, (float)(raw[id] - log(z)), 1e-4);
    sampler_free(&s);
}
