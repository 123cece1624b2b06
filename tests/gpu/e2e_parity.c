/* e2e_parity.c - end-to-end parity for the GPU test program: the same tiny generated model
 * through forward_eval on the CPU backend and on the CUDA backend (weights, KV and
 * activations in device memory, experts through an expert cache on the CUDA device).
 * Compares the prefill logits, then 24 greedy tokens and the logits at each step. */
#include "engine/backend.h"
#include "engine/backend_cuda.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/modelgen.h"
#include "memory/device.h"
#include "memory/expert_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gpu_e2e(struct backend cpu, struct backend gpu, const char *name, const char *preset, int type,
            double lim);

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Returns 1 on pass, 0 on fail (and prints the verdict line). */
int gpu_e2e(struct backend cpu, struct backend gpu, const char *name, const char *preset, int type,
            double lim)
{
    char path[64], err[256] = "";
    snprintf(path, sizeof path, "/tmp/tide-gpu-%d-%s.gguf", (int)getpid(), name);
    struct modelgen_options o = {.preset = preset, .out = path, .seed = 7, .type = type};
    struct model m;
    if (modelgen_write(&o, NULL, err, sizeof err) || model_load(&m, path, err, sizeof err)) {
        printf("FAIL %s (model: %s)\n", name, err);
        return 0;
    }
    const int n_ctx = 256, n_prompt = 100, n_gen = 24; /* prompt > one 64-token chunk */
    struct forward_state sc, sg;
    struct device dev;
    memset(&dev, 0, sizeof dev);
    dev.kind = DEVICE_KIND_CUDA;
    dev.be = gpu;
    dev.total = (size_t)8 << 30;
    dev.fail_kind = -1;
    struct expert_cache cache;
    bool have_cache = false;
    int rc = forward_init(&sc, &m, cpu, n_ctx);
    if (!rc && m.cfg.n_expert) {
        /* fewer segments than experts when possible, so misses and evictions happen too */
        rc = expert_cache_init(&cache, &dev, &m, 0, m.cfg.n_layer, 0, 1);
        have_cache = rc == 0;
    }
    struct forward_stage_spec sp = {.dev = &dev, .l0 = 0, .l1 = m.cfg.n_layer, .cache = have_cache ? &cache : NULL};
    if (!rc)
        rc = forward_init_stages(&sg, &m, n_ctx, FORWARD_DEFAULT_BATCH, &sp, 1);
    if (rc) {
        printf("FAIL %s (init: %s)\n", name, tide_strerror(rc));
        return 0;
    }
    int V = (int)m.cfg.n_vocab;
    int *tok = malloc(sizeof(int) * (n_prompt + n_gen));
    uint64_t s = 12345;
    for (int i = 0; i < n_prompt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int)((s >> 33) % (uint64_t)V);
    }
    int rc1 = forward_eval(&sc, tok, n_prompt, 0), rc2 = forward_eval(&sg, tok, n_prompt, 0);
    double e_prefill = rc1 || rc2 ? INFINITY : rel(sg.logits, sc.logits, V), e_worst = e_prefill;
    int same = 0, first_diff = -1;
    int tc = argmax(sc.logits, V), tg = argmax(sg.logits, V);
    for (int i = 0; i < n_gen && !rc1 && !rc2; i++) {
        if (tc == tg) same++;
        else if (first_diff < 0) first_diff = i;
        /* each side continues with its own token: greedy decoding as the daemon would do it */
        int pos = n_prompt + i;
        rc1 = forward_eval(&sc, &tc, 1, pos);
        rc2 = forward_eval(&sg, &tg, 1, pos);
        if (tc == tg) { /* logits are only comparable while the histories agree */
            double e = rel(sg.logits, sc.logits, V);
            if (e > e_worst) e_worst = e;
        }
        tc = argmax(sc.logits, V);
        tg = argmax(sg.logits, V);
    }
    char cerr[300] = "";
    int cuda_rc = backend_cuda_error(&gpu, cerr, sizeof cerr);
    bool ok = !rc1 && !rc2 && !cuda_rc && e_prefill < lim && e_worst < lim && same == n_gen;
    printf("%s %s (prefill %d tokens: logits rel err %.3g; %d/%d greedy tokens identical%s; worst step rel err %.3g; "
           "limit %.0e%s%s%s)\n",
           ok ? "PASS" : "FAIL", name, n_prompt, e_prefill, same, n_gen, first_diff >= 0 ? " (first differs at)" : "",
           e_worst, lim, have_cache ? "; experts via cache" : "", cuda_rc ? "; CUDA: " : "", cerr);
    if (rc1 || rc2)
        printf("  forward_eval: cpu %s, cuda %s\n", tide_strerror(rc1), tide_strerror(rc2));
    if (have_cache)
        printf("  expert cache: %d slots, %llu hits, %llu misses\n", expert_cache_slots(&cache),
               (unsigned long long)cache.hits, (unsigned long long)cache.misses);
    forward_free(&sg);
    forward_free(&sc);
    if (have_cache)
        expert_cache_free(&cache);
    free(tok);
    model_free(&m);
    unlink(path);
    return ok;
}
