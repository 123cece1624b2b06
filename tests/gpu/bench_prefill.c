/* bench_prefill.c - a 512-token prompt through the real forward (forward_eval) on the GPU, on a
 * Qwen3-30B-A3B-shaped model (48 layers, n_embd 2048, 32 q / 4 kv heads of 128, 128 experts of
 * 768, 8 used, vocab 151936) in q8_0 with random weights, every tensor and expert resident in
 * device memory (a stage without a device uses its tensors in place; no expert cache).
 *
 * Four ways, same prompt:
 *   per-token  64-token chunks, rope/attention issued once per token and one axpy per routed
 *              token, as the forward did before the chunk ops (a wrapper splits the chunk ops
 *              into those per-token calls, which launch exactly the old kernels);
 *   chunk-64   the chunk ops, 64-token chunks (FORWARD_DEFAULT_BATCH);
 *   chunk-512  the chunk ops, FORWARD_CUDA_BATCH-token chunks, the experts op by op (per
 *              expert: gather, 3 matmuls, swiglu, scatter_axpy);
 *   grouped    the same chunks with the experts in the grouped op (backend_i.moe_ffn_batch:
 *              a few launches a layer; the CUDA default now).
 * Prints ms per prompt, backend op calls by kind (a matmul of n tokens is n/8 launches more on
 * the current kernels, so calls are a lower bound on launches) and the logits' difference to
 * the per-token run; then the last way once more with a sync around every op, for the time
 * each kind of op takes (launch gaps included; the sum is above the plain run's).
 * TIDE_BENCH_PREFILL_WAY=0..3 runs one way alone (for a profiler). TIDE_BENCH_PREFILL_TYPE=q4_K
 * (or q5_K, q6_K, q4_0) makes every matrix that type instead of q8_0: with TIDE_KQ_MMA=1 the
 * k-quants' prefill runs the int8 tensor-core tiles (mmq_kquant.cu), dense and grouped; without
 * it, W widened to f16 and the experts op by op (the grouped way then equals the one before). */
#include "engine/backend.h"
#include "engine/backend_cuda.h"
#include "engine/forward.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "gpu_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TIDE_CUDA
enum { C_MM_DENSE, C_MM_EXPERT, C_ROPE, C_ATT, C_AXPY, C_SCATTER, C_GATHER, C_MOE_BATCH, C_OTHER, C_N };
static const char *cname[C_N] = {"matmul(dense)", "matmul(expert)", "rope", "attention", "axpy",
                                 "scatter_axpy", "gather", "moe_ffn_batch", "other"};
static unsigned long calls[C_N];
static double secs[C_N]; /* with timed: wall time of each kind, a sync on either side of each call */
static bool per_token, timed;
static int n_ff_exp;
static double t_op;

static void op_begin(void)
{
    if (timed) {
        gpu.i->sync(gpu.ctx);
        t_op = now_s();
    }
}
static void op_end(int kind)
{
    if (timed) {
        gpu.i->sync(gpu.ctx);
        secs[kind] += now_s() - t_op;
    }
}
#define OP(kind, call) (calls[kind]++, op_begin(), (call), op_end(kind))

static void w_matmul(void *c, const struct tensor *w, const float *x, float *y, int n)
{
    bool ex = (int)w->ne[0] == n_ff_exp || (int)w->ne[1] == n_ff_exp;
    OP(ex ? C_MM_EXPERT : C_MM_DENSE, gpu.i->matmul(c, w, x, y, n));
}
static void w_rmsnorm(void *c, const float *x, const struct tensor *w, float *o, int dim, int n, float eps)
{
    OP(C_OTHER, gpu.i->rmsnorm(c, x, w, o, dim, n, eps));
}
static void w_rope(void *c, float *v, int n, int nh, int hd, int pos, float th, enum rope_kind k)
{
    for (int t = 0; t < (per_token ? n : 1); t++) {
        if (per_token)
            OP(C_ROPE, gpu.i->rope(c, v + (size_t)t * nh * hd, 1, nh, hd, pos + t, th, k));
        else
            OP(C_ROPE, gpu.i->rope(c, v, n, nh, hd, pos, th, k));
    }
}
static void w_attention(void *c, const float *q, const float *kc, const float *vc, float *o, float *att, int n,
                        int pos, int nh, int nkv, int hd)
{
    size_t qd = (size_t)nh * hd;
    for (int t = 0; t < (per_token ? n : 1); t++) {
        if (per_token)
            OP(C_ATT, gpu.i->attention(c, q + t * qd, kc, vc, o + t * qd, att, 1, pos + t, nh, nkv, hd));
        else
            OP(C_ATT, gpu.i->attention(c, q, kc, vc, o, att, n, pos, nh, nkv, hd));
    }
}
static void w_swiglu(void *c, float *g, const float *u, int n)
{
    OP(C_OTHER, gpu.i->swiglu(c, g, u, n));
}
static void w_axpy(void *c, float *y, const float *x, float a, int n)
{
    OP(C_AXPY, gpu.i->axpy(c, y, x, a, n));
}
static void w_scatter(void *c, float *y, const float *x, const int *rows, const float *w, int n, int dim)
{
    if (!per_token) {
        OP(C_SCATTER, gpu.i->scatter_axpy(c, y, x, rows, w, n, dim));
        return;
    }
    for (int i = 0; i < n; i++)
        w_axpy(c, y + (size_t)rows[i] * dim, x + (size_t)i * dim, w[i], dim);
}
static void w_get_row(void *c, const struct tensor *t, int id, float *out)
{
    OP(C_OTHER, gpu.i->get_row(c, t, id, out));
}
static void w_gather(void *c, float *d, const float *s, const int *rows, int n, int dim)
{
    OP(C_GATHER, gpu.i->gather_rows(c, d, s, rows, n, dim));
}
static void w_zero(void *c, float *x, int n)
{
    OP(C_OTHER, gpu.i->zero(c, x, n));
}
static int w_moe_batch(void *c, const struct moe_batch *b, const float *x, float *y, bool add)
{
    int rc;
    if (!x)
        return gpu.i->moe_ffn_batch(c, b, x, y, add); /* a probe: no op */
    OP(C_MOE_BATCH, rc = gpu.i->moe_ffn_batch(c, b, x, y, add));
    return rc;
}

void bench_prefill(void)
{
    const int L = 48, E = 2048, H = 32, KV = 4, HD = 128, NE = 128, K = 8, F = 768, V = 151936;
    const int QD = H * HD, KVD = KV * HD, N = 512, NCTX = 1024;
    uint32_t T = GGML_TYPE_Q8_0;
    const char *tenv = getenv("TIDE_BENCH_PREFILL_TYPE");
    static const uint32_t alt[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q4_0};
    for (int i = 0; tenv && i < 4; i++)
        if (!strcmp(tenv, ggml_type_name(alt[i])))
            T = alt[i];
    /* tensors start at multiples of lcm(block bytes, 256): the fill pattern's blocks stay whole
     * in every tensor (4352 for q8_0's 34-byte blocks), and every tensor is 256-byte aligned */
    size_t bb = ggml_row_size(T, ggml_block_size(T)), ALIGN = 256;
    while (ALIGN % bb)
        ALIGN += 256;
    size_t rb_e = ggml_row_size(T, E), rb_q = ggml_row_size(T, QD), rb_f = ggml_row_size(T, F);
    /* the q8_0 tensors in one buffer: per layer wq wk wv wo, gate/up/down of all experts; then
     * tok_embd and output */
    size_t sz[7] = {rb_e * QD, rb_e * KVD, rb_e * KVD, rb_q * E, rb_e * F * NE, rb_e * F * NE, rb_f * E * NE};
    size_t per_layer = 0;
    for (int i = 0; i < 7; i++)
        per_layer += (sz[i] + ALIGN - 1) / ALIGN * ALIGN;
    size_t emb = (rb_e * V + ALIGN - 1) / ALIGN * ALIGN, total = per_layer * L + 2 * emb;
    uint8_t *w = gpu.i->alloc(gpu.ctx, total);
    float *f32 = gpu.i->alloc(gpu.ctx, ((size_t)E * NE * L + E) * sizeof(float)); /* routers, then ones */
    if (!w || !f32) {
        verdict("bench_prefill", false, "alloc of %.1f GB failed", total / 1e9);
        return;
    }
    float *wf = rand_vec((size_t)E * 64, 0.03f);
    struct tensor th = make_tensor(T, E, 64, wf);
    fill_repeat(w, total, th.data, th.row_bytes * 64);
    float *rf = rand_vec((size_t)E * NE * L, 0.05f), *ones = malloc(E * sizeof(float));
    for (int i = 0; i < E; i++) ones[i] = 1.0f;
    gpu.i->upload(gpu.ctx, f32, rf, (size_t)E * NE * L * sizeof(float));
    gpu.i->upload(gpu.ctx, f32 + (size_t)E * NE * L, ones, E * sizeof(float));
    const float *onesd = f32 + (size_t)E * NE * L;

    struct model m;
    memset(&m, 0, sizeof m);
    m.cfg = (struct model_config){.arch = ARCH_QWEN3MOE, .n_vocab = V, .n_embd = E, .n_layer = L, .n_head = H,
                                  .n_head_kv = KV, .head_dim = HD, .n_ff = 0, .n_ff_exp = F, .n_expert = NE,
                                  .n_expert_used = K, .expert_weights_norm = true, .rope_theta = 1e6f,
                                  .rms_eps = 1e-6f, .rope = ROPE_NEOX, .n_ctx_train = 40960};
    m.layers = calloc(L, sizeof(struct model_layer));
    struct gguf_tensor *gt = calloc((size_t)L * 3, sizeof(struct gguf_tensor));
    struct tensor nw = {GGML_TYPE_F32, {E, 1}, onesd, (size_t)E * 4};
    struct tensor hn = {GGML_TYPE_F32, {HD, 1}, onesd, (size_t)HD * 4};
    uint8_t *p = w;
#define NEXT(i) (p += (sz[i] + ALIGN - 1) / ALIGN * ALIGN, p - (sz[i] + ALIGN - 1) / ALIGN * ALIGN)
    for (int l = 0; l < L; l++) {
        struct model_layer *ly = &m.layers[l];
        ly->attn_norm = ly->ffn_norm = nw;
        ly->q_norm = ly->k_norm = hn;
        ly->wq = (struct tensor){T, {E, QD}, NEXT(0), rb_e};
        ly->wk = (struct tensor){T, {E, KVD}, NEXT(1), rb_e};
        ly->wv = (struct tensor){T, {E, KVD}, NEXT(2), rb_e};
        ly->wo = (struct tensor){T, {QD, E}, NEXT(3), rb_q};
        ly->ffn_gate_inp = (struct tensor){GGML_TYPE_F32, {E, NE}, f32 + (size_t)l * E * NE, (size_t)E * 4};
        struct gguf_tensor *g = &gt[3 * l];
        g[0] = (struct gguf_tensor){.n_dims = 3, .ne = {E, F, NE, 1}, .type = T, .data = NEXT(4), .nbytes = sz[4]};
        g[1] = (struct gguf_tensor){.n_dims = 3, .ne = {E, F, NE, 1}, .type = T, .data = NEXT(5), .nbytes = sz[5]};
        g[2] = (struct gguf_tensor){.n_dims = 3, .ne = {F, E, NE, 1}, .type = T, .data = NEXT(6), .nbytes = sz[6]};
        ly->gate_exps = &g[0];
        ly->up_exps = &g[1];
        ly->down_exps = &g[2];
    }
#undef NEXT
    m.tok_embd = (struct tensor){T, {E, V}, p, rb_e};
    m.output = (struct tensor){T, {E, V}, p + emb, rb_e};
    m.output_norm = nw;

    struct backend_i wrap = *gpu.i;
    wrap.matmul = w_matmul; wrap.rmsnorm = w_rmsnorm; wrap.rope = w_rope; wrap.attention = w_attention;
    wrap.swiglu = w_swiglu; wrap.axpy = w_axpy; wrap.scatter_axpy = w_scatter; wrap.get_row = w_get_row;
    wrap.gather_rows = w_gather; wrap.zero = w_zero;
    wrap.matmul_add = NULL; wrap.qk_norm_rope = NULL; wrap.matmul3 = NULL; /* the unfused ops, each timed */
    struct forward_stage_spec sp = {.be = {&wrap, gpu.ctx}, .l0 = 0, .l1 = L};
    int *tok = malloc(N * sizeof(int));
    uint64_t s = 777;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int)((s >> 33) % (uint64_t)V);
    }
    static const struct { const char *name; bool per_token; int batch; bool grouped; } way[] = {
        {"per-token, 64-token chunks (before)", true, FORWARD_DEFAULT_BATCH, false},
        {"chunk ops, 64-token chunks", false, FORWARD_DEFAULT_BATCH, false},
        {"chunk ops, 512-token chunks", false, FORWARD_CUDA_BATCH, false},
        {"512-token chunks, grouped experts", false, FORWARD_CUDA_BATCH, true},
    };
    n_ff_exp = F;
    float *ref = malloc((size_t)V * sizeof(float));
    double t_first = 0, t_last = 0, t_experts = 0; /* the last: chunk-512 with the per-expert ops */
    bool ok = true;
    printf("  prefill of %d tokens at pos 0, Qwen3-30B-A3B shape, %s, all resident (%.1f GB)%s:\n", N, ggml_type_name(T),
           total / 1e9, cuda_set_kq_mma(-1) ? ", k-quant tiles on (TIDE_KQ_MMA)" : "");
    /* TIDE_BENCH_PREFILL_WAY=i runs way i alone, without the timed pass (a profiler's run) */
    const char *only_env = getenv("TIDE_BENCH_PREFILL_WAY");
    int only = only_env ? atoi(only_env) : -1;
    for (int wi = 0; wi < 5 && ok; wi++) {
        if (only >= 0 && wi != only)
            continue;
        if (wi == 4) { /* the last way again, each op timed alone: where the time goes */
            timed = true;
            wi = 3;
        }
        wrap.moe_ffn_batch = way[wi].grouped && gpu.i->moe_ffn_batch ? w_moe_batch : NULL;
        struct forward_state fs;
        per_token = way[wi].per_token;
        int rc = forward_init_stages(&fs, &m, NCTX, 1, way[wi].batch, &sp, 1);
        if (!rc) rc = forward_setup_prefill(&fs, 0, PREFILL_OWN);
        if (rc) {
            printf("  %s: init: %s\n", way[wi].name, tide_strerror(rc));
            ok = false;
            break;
        }
        if (!timed)
            rc = forward_eval(&fs, tok, N, 0); /* warm-up */
        double best = 1e9;
        unsigned long c0[C_N];
        uint64_t x0 = 0;
        for (int r = 0; r < (timed ? 1 : 2) && !rc; r++) {
            memcpy(c0, calls, sizeof c0);
            memset(secs, 0, sizeof secs);
            x0 = fs.n_expert_calls;
            double t0 = now_s();
            rc = forward_eval(&fs, tok, N, 0); /* ends with the logits downloaded: synchronous */
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        if (rc) {
            printf("  %s: forward_eval: %s\n", way[wi].name, tide_strerror(rc));
            ok = false;
        } else {
            double e = 0;
            if (wi == 0 || only >= 0) memcpy(ref, fs.logits, (size_t)V * sizeof(float));
            else e = relerr(fs.logits, ref, V);
            unsigned long tot = 0;
            for (int k = 0; k < C_N; k++) tot += calls[k] - c0[k];
            printf("  %-36s %9.1f ms (%6.0f tok/s); op calls %lu:", way[wi].name, best * 1e3, N / best, tot);
            for (int k = 0; k < C_N; k++) printf(" %s %lu", cname[k], calls[k] - c0[k]);
            printf("; expert calls %llu; logits rel err vs first %.3g%s\n",
                   (unsigned long long)(fs.n_expert_calls - x0), e, isfinite(fs.logits[0]) ? "" : " (NaN)");
            ok = isfinite(fs.logits[0]) && isfinite(e);
            if (wi == 0) t_first = best;
            if (wi == 2) t_experts = best;
            if (!timed) t_last = best;
        }
        forward_free(&fs);
        if (timed) {
            double sum = 0;
            printf("  where the %.0f ms of the last way go, each op synchronised alone (%.1f ms in all):\n   ",
                   t_last * 1e3, best * 1e3);
            for (int k = 0; k < C_N; k++) {
                printf(" %s %.1f ms", cname[k], secs[k] * 1e3);
                sum += secs[k];
            }
            printf("; host (routing, downloads, launch gaps) %.1f ms\n", (best - sum) * 1e3);
            timed = false;
            break;
        }
    }
    gpu.i->free(gpu.ctx, w); gpu.i->free(gpu.ctx, f32);
    free(wf); free((void *)th.data); free(rf); free(ones); free(m.layers); free(gt); free(tok); free(ref);
    if (t_last > 0)
        printf("  grouped experts vs per-expert ops (512-token chunks): %.2fx\n", t_experts / t_last);
    verdict("bench_prefill", ok, "speed-up %.1fx", t_last > 0 ? t_first / t_last : 0);
}
#endif
