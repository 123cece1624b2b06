/* test_sample_edits.c - the sampler's changes as backend_i.sample's sparse edits (sampler_edits)
 * and the backend's logprobs: the CPU slot (sample_rows_full) given a sampler's edits and u must
 * draw the host sampler's token and report its logprobs, bit for bit, step after step of a
 * sequence (the edits kept up to date by accept), with and without the end-of-generation ban
 * as MASK edits; a logit_bias naming an id twice keeps the sequence on the host. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "engine/sample_rows.h"

#define TEST_RAND_SEED 0x2545F4914F6CDD1Dull
#include "test_rand.h"
static float rnd_f(void) { return (float)(test_rand_u() * 2.0 - 1.0); }

/* backend_i.sample's row for s's next draw, as sequence.c builds it (u peeked, not taken), with
 * mask[0..n_mask) masked (the end-of-generation ban) in *buf. */
static struct sample_row row_for(struct sampler *s, const int *mask, int n_mask, struct sample_edit **buf, int *cap)
{
    const struct sampling_params *p = &s->p;
    struct sample_row r = {.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p};
    if (!(p->temperature > 0.0f))
        r = (struct sample_row){.temperature = 0.0f, .top_p = 1.0f};
    r.repetition_penalty = p->repetition_penalty;
    r.logprobs = p->logprobs;
    r.top_logprobs = p->top_logprobs;
    const struct sample_edit *ed;
    int ne = n_mask ? sampler_edits_masking(s, mask, n_mask, buf, cap, &ed) : sampler_edits(s, &ed);
    cr_assert_geq(ne, 0);
    r.edits = ed;
    r.n_edits = ne;
    if (p->temperature > 0.0f) {
        uint64_t keep = s->rng;
        r.u = sampler_next_uniform(s);
        s->rng = keep;
    }
    return r;
}

Test(sample_edits, backend_slot_is_the_host_sampler)
{
    enum { V = 3000, STEPS = 40 };
    static const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
    float *l = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int draws = 0, penalised = 0;
    for (int req = 0; req < 48; req++) {
        struct sampling_params p;
        sampling_params_default(&p);
        p.temperature = temps[req % 4];
        p.top_k = req % 5 == 1 ? 50 : 0;
        p.top_p = req % 3 == 1 ? 0.9f : 1.0f;
        p.presence_penalty = (float[]){0.0f, 0.8f, -0.5f, 2.0f}[(req / 4) % 4];
        p.frequency_penalty = (float[]){0.0f, 0.6f, 1.5f}[(req / 2) % 3];
        p.repetition_penalty = (float[]){1.0f, 1.2f, 0.9f}[req % 3];
        p.logprobs = req % 2 == 0;
        p.top_logprobs = (int[]){0, 3, 20}[req % 3];
        p.seed = 1000 + (uint64_t)req;
        struct logit_bias bias[4] = {{5, -100.0f}, {17, 4.0f}, {(int)(test_rand_next() % V), -2.5f}, {V - 1, 100.0f}};
        if (bias[2].id == 5 || bias[2].id == 17 || bias[2].id == V - 1)
            bias[2].id = 6;
        p.logit_bias = bias;
        p.n_logit_bias = req % 4 == 3 ? 0 : 1 + req % 4;
        struct sampler s;
        cr_assert_eq(sampler_init(&s, &p, V), 0);
        struct sample_edit *buf = NULL;
        int cap = 0, mask[3] = {2, 17, (int)(test_rand_next() % V)}; /* a leader, a biased one, any */
        int n_mask = req % 3 == 2 ? 3 : 0, mask_steps = req % 2 ? STEPS : 8; /* ignore_eos, min_tokens */
        int prompt[64];
        for (int i = 0; i < 64; i++)
            prompt[i] = (int)(test_rand_next() % 40); /* a small set: the replies repeat it */
        sampler_note_prompt(&s, prompt, 64);
        for (int t = 0; t < STEPS; t++) {
            for (int i = 0; i < V; i++)
                l[i] = rnd_f() * 3.0f;
            for (int i = 0; i < 40; i++)
                l[i] += 4.0f; /* the prompt's tokens lead, so the penalties decide draws */
            int nm = t < mask_steps ? n_mask : 0;
            struct sample_row r = row_for(&s, mask, nm, &buf, &cap);
            penalised += r.n_edits > 0;
            memcpy(a, l, sizeof(float) * V);
            memcpy(b, l, sizeof(float) * V);
            for (int i = 0; i < nm; i++) /* sampler_constrain's ban */
                b[mask[i]] = -INFINITY;
            int32_t got = -1;
            struct sample_logprob glp;
            cr_assert_eq(sample_rows_full(a, 1, V, &r, &got, &glp), 0);
            struct token_logprob hlp;
            int want = sampler_sample(&s, b, p.logprobs ? &hlp : NULL);
            cr_assert_eq(got, want, "request %d step %d: backend %d, host %d", req, t, got, want);
            cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "request %d step %d: the edited logits differ", req, t);
            if (p.logprobs) {
                cr_assert_eq(glp.id, want);
                cr_assert_eq(glp.logprob, hlp.logprob, "request %d step %d", req, t);
                cr_assert_eq(glp.n_top, hlp.n_top);
                for (int j = 0; j < hlp.n_top; j++) {
                    cr_assert_eq(glp.top_ids[j], hlp.top_ids[j]);
                    cr_assert_eq(glp.top_logprobs[j], hlp.top_logprobs[j]);
                }
            }
            cr_assert(t >= mask_steps || !nm || (want != mask[0] && want != mask[1] && want != mask[2]));
            sampler_accept(&s, want);
            draws++;
        }
        sampler_free(&s);
        free(buf);
    }
    cr_assert_gt(penalised, draws / 2, "the requests exercise the edits");
    free(l);
    free(a);
    free(b);
}

Test(sample_edits, sparse_and_kept_up_to_date)
{
    struct sampling_params p;
    sampling_params_default(&p);
    struct sampler s;
    const struct sample_edit *ed;
    cr_assert_eq(sampler_init(&s, &p, 100), 0);
    int prompt[] = {3, 4, 3, 9};
    sampler_note_prompt(&s, prompt, 4);
    sampler_accept(&s, 3);
    cr_assert_eq(sampler_edits(&s, &ed), 0, "no penalty, no bias: no edits");
    sampler_free(&s);

    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.5f;
    struct logit_bias bias[] = {{4, -100.0f}, {50, 2.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    cr_assert_eq(sampler_init(&s, &p, 100), 0);
    cr_assert_eq(sampler_edits(&s, &ed), 2);
    sampler_note_prompt(&s, prompt, 4);
    cr_assert_eq(sampler_edits(&s, &ed), 4, "ids 4, 50, 3, 9");
    sampler_accept(&s, 3);
    sampler_accept(&s, 3);
    sampler_accept(&s, 77);
    int n = sampler_edits(&s, &ed);
    cr_assert_eq(n, 5);
    for (int j = 0; j < n; j++) {
        if (ed[j].id == 3) {
            cr_assert_eq(ed[j].what, SAMPLE_EDIT_SEEN | SAMPLE_EDIT_SUB);
            cr_assert_float_eq(ed[j].sub, 1.0f, 1e-6, "two of them at 0.5");
        }
        if (ed[j].id == 4)
            cr_assert_eq(ed[j].what, SAMPLE_EDIT_BAN | SAMPLE_EDIT_SEEN);
        if (ed[j].id == 50)
            cr_assert_eq(ed[j].what, SAMPLE_EDIT_BIAS);
    }
    struct sample_edit *buf = NULL;
    int cap = 0, eog[] = {4, 99};
    cr_assert_eq(sampler_edits_masking(&s, eog, 2, &buf, &cap, &ed), 6, "4 joins its edit, 99 is new");
    for (int j = 0; j < 6; j++)
        cr_assert_eq(!!(ed[j].what & SAMPLE_EDIT_MASK), ed[j].id == 4 || ed[j].id == 99, "id %d", ed[j].id);
    cr_assert_eq(sampler_edits(&s, &ed), 5, "the sampler's own list is untouched");
    cr_assert(!(ed[s.edit_of[4]].what & SAMPLE_EDIT_MASK));
    free(buf);
    sampler_reset(&s, 7); /* a new choice: the bias only */
    cr_assert_eq(sampler_edits(&s, &ed), 2);
    sampler_free(&s);
}

Test(sample_edits, duplicate_bias_stays_on_the_host)
{
    struct sampling_params p;
    sampling_params_default(&p);
    struct logit_bias bias[] = {{8, 1.0f}, {8, 2.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    struct sampler s;
    const struct sample_edit *ed;
    cr_assert_eq(sampler_init(&s, &p, 16), 0);
    cr_assert_eq(sampler_edits(&s, &ed), -1, "one edit cannot add two biases in turn");
    sampler_free(&s);
}
