/* emulate-f16x.c - what the CUDA wmma GEMM's f16 rounding of x alone does to batched logits.
 * test-gpu's batch_* tests (tests/gpu/test_batch.c) run three sequences' prompt chunks and
 * decode rows through forward_eval_batch on the CPU and on a GPU and compare the logits rows.
 * This runs the same schedule on the CPU backend twice: plain, and through a wrapper whose
 * matmul rounds x to f16 when the weights are f16/bf16 and a product has more than 8 rows (what
 * cuda/matmul.cu's wmma_gemm kernels do past MM_NT), with the fused slots off so that every
 * product goes through it. It prints the rows off by 1e-3 or more and the worst rel err: the
 * numbers the GPU test should see from that rounding alone (2026-12-05: gpt-oss 2.5e-3 here and
 * 2.45e-3 on the H200, row for row; deepseek2 1.2e-1 here, 3.3e-2 there, the same rows).
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc scripts/emulate-f16x.c build/libtide.a -lm -lpthread -o /tmp/emulate-f16x
 *   /tmp/emulate-f16x */
#include "engine/forward.h"
#include "engine/modelgen.h"
#include "engine/sample.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define NSEQ 3
#define NDEC 8
static struct backend_i wi;
static struct backend real;
static float *tmpx; static size_t tmpn;
static float r16(float v) { _Float16 h = (_Float16)v; return (float)h; }
static void wmatmul(void *ctx, const struct tensor *w, const float *x, float *y, int n)
{
    if ((w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16) && n > 8) {
        size_t k = (size_t)n * w->ne[0];
        if (k > tmpn) { tmpx = realloc(tmpx, k * sizeof(float)); tmpn = k; }
        for (size_t i = 0; i < k; i++) tmpx[i] = r16(x[i]);
        x = tmpx;
    }
    real.i->matmul(ctx, w, x, y, n);
}
static double relerr(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}
static void run(const char *preset, int type)
{
    char path[96], err[256] = "";
    snprintf(path, sizeof path, "/tmp/f16x-%d-%s.gguf", (int)getpid(), preset);
    struct modelgen_options o = {.preset = preset, .out = path, .seed = 7, .type = type};
    struct model m;
    if (modelgen_write(&o, NULL, err, sizeof err) || model_load(&m, path, err, sizeof err)) { printf("model: %s\n", err); return; }
    int V = (int)m.cfg.n_vocab;
    struct backend wb = {&wi, real.ctx};
    struct forward_state C, G;
    struct forward_stage_spec sc = {.be = real, .l0 = 0, .l1 = m.cfg.n_layer}, sg = {.be = wb, .l0 = 0, .l1 = m.cfg.n_layer};
    if (forward_init_stages(&C, &m, 256, 4, FORWARD_DEFAULT_BATCH, &sc, 1) || forward_setup_prefill(&C, 0, PREFILL_OWN) ||
        forward_init_stages(&G, &m, 256, 4, FORWARD_DEFAULT_BATCH, &sg, 1) || forward_setup_prefill(&G, 0, PREFILL_OWN)) { printf("init\n"); return; }
    const int plen[NSEQ] = {70, 9, 33}, slot[NSEQ] = {1, 3, 0};
    int ids[NSEQ][80], pos[NSEQ] = {0}, dec[NSEQ] = {0}, next[NSEQ] = {0};
    for (int s = 0; s < NSEQ; s++)
        for (int i = 0; i < plen[s]; i++) ids[s][i] = (int)((31u * (unsigned)s + 7u * (unsigned)i + 5u) % (unsigned)V);
    double worst = 0; int rows = 0, flips = 0;
    float *cl = malloc(sizeof(float) * V * NSEQ);
    for (int step = 0; step < 40; step++) {
        struct forward_seq qc[NSEQ], qg[NSEQ]; int who[NSEQ], nq = 0;
        for (int s = 0; s < NSEQ; s++) {
            if (pos[s] < plen[s]) {
                int k = 7 + 5 * s; if (pos[s] + k > plen[s]) k = plen[s] - pos[s];
                qc[nq] = (struct forward_seq){.slot = slot[s], .pos = pos[s], .n = k, .tokens = ids[s] + pos[s], .want_logits = pos[s] + k == plen[s]};
            } else if (dec[s] < NDEC) {
                qc[nq] = (struct forward_seq){.slot = slot[s], .pos = pos[s], .n = 1, .tokens = &next[s], .want_logits = true};
            } else continue;
            who[nq++] = s;
        }
        if (!nq) break;
        memcpy(qg, qc, sizeof qc);
        if (forward_eval_batch(&C, qc, nq) || forward_eval_batch(&G, qg, nq)) { printf("eval fail\n"); return; }
        for (int i = 0; i < nq; i++) if (qc[i].want_logits) memcpy(cl + (size_t)i * V, qc[i].logits, sizeof(float) * V);
        for (int i = 0; i < nq; i++) {
            int s = who[i]; bool decode = pos[s] >= plen[s]; pos[s] += qc[i].n;
            if (!qc[i].want_logits) continue;
            const float *c = cl + (size_t)i * V;
            double e = relerr(qg[i].logits, c, (size_t)V);
            if (e > worst) worst = e;
            flips += sampler_argmax(qg[i].logits, V) != sampler_argmax(c, V);
            if (e >= 1e-3) printf("  %s: step %d seq %d (%s, %d rows at %d, %d runs): rel err %.3g\n", preset, step, s, decode ? "decode" : "prompt end", qc[i].n, pos[s] - qc[i].n, nq, e);
            rows++;
            next[s] = sampler_argmax(c, V);
            if (decode) dec[s]++;
        }
    }
    printf("%s (type %d): %d logits rows, worst rel err %.3g, %d argmax flips (x rounded to f16 in products of > 8 rows)\n", preset, type, rows, worst, flips);
    forward_free(&C); forward_free(&G); model_free(&m); unlink(path); free(cl);
}
int main(void)
{
    if (backend_cpu_init(&real, 2)) return 1;
    wi = *real.i;
    wi.matmul = wmatmul; wi.matmul3 = NULL; wi.matmul_add = NULL; wi.norm_matmul = NULL; wi.moe_ffn_batch = NULL;
    run("moe", -1); run("qwen3moe", -1); run("gpt-oss", -1); run("deepseek2", -1);
    return 0;
}
