/* test_sample.c - the sampler: greedy, top_k/top_p/min_p, seeding, penalties, logprobs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "engine/sample_rows.h"

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

/* The reference's pieces: candidates by value (ties by id) and sample.c's xorshift64* stream,
 * restated. */
struct ref_vi { float v; int id; };
static int ref_cmp(const void *a, const void *b)
{
    const struct ref_vi *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static double ref_uniform(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}
/* A temperature draw is backend_i.sample's (sample_rows.c, itself checked against a sorting
 * reference in test_sample_rows.c) with u the next number of the seed's stream: a sequence draws
 * the same token whether its backend draws it or the host does (with logprobs, penalties...).
 * Qwen3's vocabulary size, three logit shapes, the usual settings. */
Test(sample, temperature_draw_is_the_backend_draw, .timeout = 120)
{
    enum { V = 151936, DRAWS = 8 };
    float *l = malloc(sizeof(float) * V), *work = malloc(sizeof(float) * V);
    struct { float temp, top_p, min_p; int top_k; } set[] = {
        {1.0f, 1.0f, 0, 0}, {0.7f, 0.9f, 0, 0}, {1.5f, 1.0f, 0.05f, 0}, {1.0f, 1.0f, 0, 40},
        {2.0f, 0.999f, 0, 0}, {1.0f, 1.0f, 0, 100000}, {0.6f, 0.95f, 0.02f, 20},
    };
    uint64_t g = 12345;
    for (int shape = 0; shape < 3; shape++) {
        /* 0: a few strong tokens; 1: flat, all within 2; 2: one token above a crowd */
        for (int i = 0; i < V; i++)
            l[i] = (float)(ref_uniform(&g) * (shape == 1 ? 2.0 : shape == 2 ? 1.0 : 6.0)) +
                   (shape == 0 && i % 9973 == 0 ? 14.0f : 0);
        if (shape == 2) l[777] = 13.5f;
        for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
            struct sampling_params p;
            sampling_params_default(&p);
            p.temperature = set[k].temp, p.top_p = set[k].top_p, p.min_p = set[k].min_p;
            p.top_k = set[k].top_k, p.seed = 1000 + k;
            struct sampler s;
            cr_assert_eq(sampler_init(&s, &p, V), 0);
            uint64_t rng = p.seed;
            for (int d = 0; d < DRAWS; d++) {
                memcpy(work, l, sizeof(float) * V);
                int got = sampler_sample(&s, work, NULL);
                struct sample_row r = {.temperature = p.temperature, .top_k = p.top_k, .top_p = p.top_p,
                                       .min_p = p.min_p, .u = ref_uniform(&rng)};
                int32_t want = -1;
                cr_assert_eq(sample_rows(l, 1, V, &r, &want), 0);
                cr_assert_eq(got, want, "shape %d setting %zu draw %d: sampler %d, backend_i.sample's %d", shape, k,
                             d, got, want);
            }
            sampler_free(&s);
        }
    }
    free(l); free(work);
}

/* top_logprobs comes from one pass now; it must list what a full sort lists, ties by id. */
Test(sample, top_logprobs_match_a_full_sort)
{
    enum { V = 5000 };
    float l[V];
    uint64_t g = 99;
    for (int i = 0; i < V; i++) l[i] = (float)(int)(ref_uniform(&g) * 50) * 0.25f;  /* many ties */
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0, p.logprobs = true, p.top_logprobs = SAMPLE_MAX_TOP_LOGPROBS;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, V), 0);
    struct token_logprob lp;
    float work[V];
    memcpy(work, l, sizeof l);
    sampler_sample(&s, work, &lp);
    struct ref_vi c[V];
    for (int i = 0; i < V; i++) c[i] = (struct ref_vi){ l[i], i };
    qsort(c, V, sizeof(*c), ref_cmp);
    cr_assert_eq(lp.n_top, SAMPLE_MAX_TOP_LOGPROBS);
    for (int j = 0; j < lp.n_top; j++)
        cr_assert_eq(lp.top_ids[j], c[j].id, "rank %d: %d, full sort %d", j, lp.top_ids[j], c[j].id);
    sampler_free(&s);
}

/* logit_bias: -100 bans the greedy pick (even when it is the only finite one left), +x adds. */
Test(sample, logit_bias_bans_and_adds)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    struct logit_bias ban[] = {{7, -100.0f}}, lift[] = {{3, 10.0f}};
    p.logit_bias = ban;
    p.n_logit_bias = 1;
    int id = sample_once(&p);
    cr_expect_neq(id, 7, "banned token chosen");
    p.logit_bias = lift;
    cr_expect_eq(sample_once(&p), 3, "+10 makes id 3 (logit %.1f) the best", (double)((3 * 37) % NV) * 0.1);
    p.temperature = 1; /* sampled: a banned token never comes */
    p.logit_bias = ban;
    for (uint64_t seed = 1; seed < 200; seed++) {
        p.seed = seed;
        cr_assert_neq(sample_once(&p), 7);
    }
}

/* repetition_penalty (llama.cpp / vLLM): a seen token's positive logit is divided, a negative
 * one multiplied; prompt tokens count, and a fresh sampler_reset forgets them. */
Test(sample, repetition_penalty_divides_and_multiplies)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    struct sampler s;
    cr_assert_eq(sampler_init(&s, &p, 4), 0);
    float l[4] = {3.0f, 2.0f, -1.0f, -1.5f};
    int prompt[] = {0, 2, -1};   /* -1: an image position, skipped */
    sampler_note_prompt(&s, prompt, 3);
    cr_expect_eq(sampler_sample(&s, l, NULL), 1, "3/2 = 1.5 < 2: id 1 wins");
    cr_expect_float_eq(l[0], 1.5f, 1e-6, "positive divided");
    cr_expect_float_eq(l[2], -2.0f, 1e-6, "negative multiplied");
    cr_expect_float_eq(l[3], -1.5f, 1e-6, "unseen untouched");
    sampler_accept(&s, 1); /* generated tokens count too */
    float m[4] = {3.0f, 2.0f, -1.0f, -1.5f};
    sampler_sample(&s, m, NULL);
    cr_expect_float_eq(m[1], 1.0f, 1e-6);
    sampler_reset(&s, 1);
    float k[4] = {3.0f, 2.0f, -1.0f, -1.5f};
    cr_expect_eq(sampler_sample(&s, k, NULL), 0, "reset forgets the prompt");
    sampler_free(&s);
}

/* What makes the device-side argmax shortcut invalid: every setting that reads the logits. */
Test(sample, needs_logits)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    cr_expect(!sampler_needs_logits(&p));
    struct sampling_params q = p;
    q.repetition_penalty = 1.1f;
    cr_expect(sampler_needs_logits(&q));
    q = p, q.min_tokens = 1;
    cr_expect(sampler_needs_logits(&q));
    q = p, q.ignore_eos = true;
    cr_expect(sampler_needs_logits(&q));
    struct logit_bias b = {1, 1.0f};
    q = p, q.logit_bias = &b, q.n_logit_bias = 1;
    cr_expect(sampler_needs_logits(&q));
}
