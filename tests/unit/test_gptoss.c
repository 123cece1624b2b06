/* test_gptoss.c - the gpt-oss forward (sinks, a window of 4 on layers 0 and 2, every bias, the
 * clamped SwiGLU, yarn rope) against llama.cpp's numbers, recorded once, so that CI, which has
 * no llama.cpp, still sees a change to the architecture's arithmetic.
 *
 * The model is `tide-mkmodel --preset gpt-oss --type f32 --seed 1` (modelgen is deterministic:
 * the same options give the same bytes). The numbers are libllama's (llama.cpp 3f545be, CPU, f32
 * KV cache, no flash attention; our client scripts/llama-logits.c extended to greedy steps) for
 * the prompt "The red square and the blue circle are", tokens below as both tokenisers give
 * them: the five most likely next tokens and their log-probabilities after the prompt and after
 * each of three greedy tokens. tide agreed within 3.8e-6 when recorded (docs/BENCHMARKS.md).
 * A change to the preset's weights or keys needs them recorded again. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/modelgen.h"

struct top { int id; float lp; };

static const int prompt[] = {84, 261, 327, 415, 282, 280, 313, 366, 332};
static const struct top want[4][5] = {
    {{63, -1.5212336f}, {722, -2.4981270f}, {155, -2.7369290f}, {140, -2.8086205f}, {416, -2.8130551f}},
    {{276, -2.1670454f}, {456, -2.2802256f}, {696, -2.3379887f}, {328, -2.3794506f}, {561, -2.4451969f}},
    {{111, -0.5349100f}, {562, -1.9578960f}, {325, -2.7601640f}, {748, -3.1016958f}, {533, -3.3588102f}},
    {{556, -2.5067487f}, {16, -2.6520095f}, {247, -2.7849699f}, {325, -2.9673086f}, {590, -3.0866023f}},
};

Test(gptoss, forward_matches_llama_cpp_recorded_logprobs)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/tide-test-oss-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "gpt-oss", .out = path, .seed = 1, .type = GGML_TYPE_F32, .threads = 1};
    char err[256] = "";
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    struct forward_state f;
    cr_assert_eq(forward_init(&f, &m, be, 64), 0);
    int n = (int)(sizeof prompt / sizeof prompt[0]), V = (int)m.cfg.n_vocab;
    cr_assert_eq(forward_eval(&f, prompt, n, 0), 0);
    for (int step = 0; step < 4; step++) {
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, f.logits[v]);
        for (int v = 0; v < V; v++) z += exp(f.logits[v] - mx);
        for (int r = 0; r < 5; r++) {
            const struct top *w = &want[step][r];
            double lp = f.logits[w->id] - mx - log(z);
            cr_assert(fabs(lp - w->lp) < 1e-4, "step %d rank %d token %d: logprob %.7f, llama.cpp %.7f", step, r,
                      w->id, lp, w->lp);
        }
        int best = 0;
        for (int v = 1; v < V; v++)
            if (f.logits[v] > f.logits[best]) best = v;
        cr_assert_eq(best, want[step][0].id, "step %d: greedy token %d, llama.cpp %d", step, best, want[step][0].id);
        if (step < 3)
            cr_assert_eq(forward_eval(&f, &best, 1, n + step), 0);
    }
    forward_free(&f);
    backend_cpu_free(&be);
    model_free(&m);
    unlink(path);
}
