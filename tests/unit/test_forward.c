/* test_forward.c - the forward pass against an independent double-precision reference.
 *
 * Tiny models are built here with the GGUF writer (dense llama, Mixtral-style MoE,
 * qwen3moe with QK-norm and head_dim != n_embd/n_head, qwen2moe with q/k/v biases and a
 * sigmoid-gated shared expert, olmoe with q/k norms over the whole width, granitemoe with its
 * four scales, plus f16 and q8_0 variants), then
 * loaded with model_load and run through forward_eval on the CPU backend. The reference
 * below shares no code with the engine: it reads the same f32 arrays the writer got. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"

struct spec {
    const char *arch;
    int E, L, H, HKV, hd, F, NEXP, K, V;
    bool qk, key_len, norm;
    uint32_t type; /* matrices' storage type */
    int FS;        /* qwen2moe: the shared expert's width (and q/k/v biases); 0: none */
};
/* granitemoe's embedding, residual, attention and logit scales (written when ls != 0) */
struct scales { float es, rs, as, ls; };

/* All weights as f32 (after a round trip through the storage type, so the reference
 * sees exactly what the engine multiplies by). */
struct lw {
    float *an, *wq, *wk, *wv, *wo, *qn, *kn, *fn, *g, *u, *d, *gi;
    float *bq, *bk, *bv, *gis, *gs, *us, *ds; /* qwen2moe's biases and shared expert */
};
struct refm {
    struct spec s;
    struct scales g;
    float *emb, *onorm, *out;
    struct lw *l;
};

static uint64_t rs = 88172645463325252ULL;
static float frand(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rnd(size_t n, float scale, float bias)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = bias + scale * frand();
    return p;
}

/* Add a tensor and round-trip the data through its storage type in place. */
static void put(struct gguf_writer *w, const char *name, uint32_t type, int nd, uint64_t a,
                uint64_t b, uint64_t c, float *data)
{
    uint64_t ne[3] = {a, b, c};
    gguf_w_tensor(w, name, type, nd, ne, data);
    if (type != GGML_TYPE_F32) {
        size_t n = a * b * c;
        void *tmp = malloc(n * 4 + 64);
        ggml_quantize(type, data, tmp, n);
        ggml_dequantize(type, tmp, data, n);
        free(tmp);
    }
}

static void build(struct refm *r, const struct spec *s, const struct scales *g, const char *path)
{
    memset(r, 0, sizeof(*r));
    r->s = *s;
    if (g)
        r->g = *g;
    int E = s->E, qd = s->H * s->hd, kvd = s->HKV * s->hd;
    struct gguf_writer *w = gguf_writer_new();
    char k[128];
    gguf_w_str(w, "general.architecture", s->arch);
    gguf_w_str(w, "general.name", "test");
#define KU(suf, v) do { snprintf(k, sizeof(k), "%s." suf, s->arch); gguf_w_u32(w, k, v); } while (0)
    KU("embedding_length", E);
    KU("block_count", s->L);
    KU("attention.head_count", s->H);
    KU("attention.head_count_kv", s->HKV);
    KU("context_length", 128);
    if (s->key_len)
        KU("attention.key_length", s->hd);
    if (s->NEXP) {
        KU("expert_count", s->NEXP);
        KU("expert_used_count", s->K);
        /* llama, olmoe and granitemoe size their experts by feed_forward_length */
        if (strcmp(s->arch, "llama") && strcmp(s->arch, "olmoe") && strcmp(s->arch, "granitemoe"))
            KU("expert_feed_forward_length", s->F);
        else
            KU("feed_forward_length", s->F);
    } else {
        KU("feed_forward_length", s->F);
    }
    snprintf(k, sizeof(k), "%s.rope.freq_base", s->arch);
    gguf_w_f32(w, k, 10000.0f);
    snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", s->arch);
    gguf_w_f32(w, k, 1e-5f);
    if (s->FS)
        KU("expert_shared_feed_forward_length", s->FS);
#define KF(suf, v) do { snprintf(k, sizeof(k), "%s." suf, s->arch); gguf_w_f32(w, k, v); } while (0)
    if (r->g.ls) {
        KF("embedding_scale", r->g.es);
        KF("residual_scale", r->g.rs);
        KF("attention.scale", r->g.as);
        KF("logit_scale", r->g.ls);
    }
#undef KF
    bool fixed = !strcmp(s->arch, "olmoe") || !strcmp(s->arch, "granitemoe"); /* llama.cpp reads no key */
    if (s->NEXP && ((!s->norm && !s->FS) || fixed)) { /* qwen2moe files carry no such key: unnormalised by arch */
        snprintf(k, sizeof(k), "%s.expert_weights_norm", s->arch);
        gguf_w_bool(w, k, fixed ? !s->norm : false); /* olmoe, granitemoe: a key saying the opposite is ignored */
    }
    const char **toks = malloc(sizeof(char *) * s->V);
    char (*tb)[12] = malloc(12 * (size_t)s->V);
    for (int i = 0; i < s->V; i++) {
        snprintf(tb[i], 12, "t%d", i);
        toks[i] = tb[i];
    }
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, s->V);

    r->emb = rnd((size_t)E * s->V, 1.0f, 0);
    put(w, "token_embd.weight", GGML_TYPE_F32, 2, E, s->V, 1, r->emb);
    r->onorm = rnd(E, 0.2f, 1.0f);
    put(w, "output_norm.weight", GGML_TYPE_F32, 1, E, 1, 1, r->onorm);
    r->out = rnd((size_t)E * s->V, 0.3f, 0);
    put(w, "output.weight", s->type, 2, E, s->V, 1, r->out);
    r->l = calloc(s->L, sizeof(struct lw));
    float ws = 1.0f / sqrtf((float)E);
    for (int l = 0; l < s->L; l++) {
        struct lw *y = &r->l[l];
        char n[64];
#define P(f, nm, t, nd, a, b, c, sc, bi) do { y->f = rnd((size_t)(a) * (b) * (c), sc, bi); \
        snprintf(n, sizeof(n), "blk.%d." nm ".weight", l); put(w, n, t, nd, a, b, c, y->f); } while (0)
        P(an, "attn_norm", GGML_TYPE_F32, 1, E, 1, 1, 0.2f, 1.0f);
        P(wq, "attn_q", s->type, 2, E, qd, 1, ws * 2, 0);
        P(wk, "attn_k", s->type, 2, E, kvd, 1, ws * 2, 0);
        P(wv, "attn_v", s->type, 2, E, kvd, 1, ws, 0);
        P(wo, "attn_output", s->type, 2, qd, E, 1, ws, 0);
        bool qwen2 = !strcmp(s->arch, "qwen2moe"); /* its shared expert's gate and q/k/v biases */
        if (s->FS && qwen2) {
#define PB(f, nm, len) do { y->f = rnd((size_t)(len), 0.3f, 0); \
        snprintf(n, sizeof(n), "blk.%d." nm ".bias", l); put(w, n, GGML_TYPE_F32, 1, len, 1, 1, y->f); } while (0)
            PB(bq, "attn_q", qd);
            PB(bk, "attn_k", kvd);
            PB(bv, "attn_v", kvd);
#undef PB
        }
        bool full = !strcmp(s->arch, "olmoe"); /* one norm over all heads */
        if (s->qk) {
            P(qn, "attn_q_norm", GGML_TYPE_F32, 1, full ? qd : s->hd, 1, 1, 0.2f, 1.0f);
            P(kn, "attn_k_norm", GGML_TYPE_F32, 1, full ? kvd : s->hd, 1, 1, 0.2f, 1.0f);
        }
        P(fn, "ffn_norm", GGML_TYPE_F32, 1, E, 1, 1, 0.2f, 1.0f);
        if (s->NEXP) {
            P(gi, "ffn_gate_inp", GGML_TYPE_F32, 2, E, s->NEXP, 1, ws * 3, 0);
            P(g, "ffn_gate_exps", s->type, 3, E, s->F, s->NEXP, ws, 0);
            P(u, "ffn_up_exps", s->type, 3, E, s->F, s->NEXP, ws, 0);
            P(d, "ffn_down_exps", s->type, 3, s->F, E, s->NEXP, 1.0f / sqrtf((float)s->F), 0);
            if (s->FS) {
                if (qwen2)
                    P(gis, "ffn_gate_inp_shexp", GGML_TYPE_F32, 1, E, 1, 1, ws * 2, 0);
                P(gs, "ffn_gate_shexp", s->type, 2, E, s->FS, 1, ws, 0);
                P(us, "ffn_up_shexp", s->type, 2, E, s->FS, 1, ws, 0);
                P(ds, "ffn_down_shexp", s->type, 2, s->FS, E, 1, 1.0f / sqrtf((float)s->FS), 0);
            }
        } else {
            P(g, "ffn_gate", s->type, 2, E, s->F, 1, ws, 0);
            P(u, "ffn_up", s->type, 2, E, s->F, 1, ws, 0);
            P(d, "ffn_down", s->type, 2, s->F, E, 1, 1.0f / sqrtf((float)s->F), 0);
        }
    }
    cr_assert_eq(gguf_writer_write(w, path), 0);
    gguf_writer_free(w);
    free(toks);
    free(tb);
}

static void refm_free(struct refm *r)
{
    free(r->emb); free(r->onorm); free(r->out);
    for (int l = 0; l < r->s.L; l++) {
        struct lw *y = &r->l[l];
        free(y->an); free(y->wq); free(y->wk); free(y->wv); free(y->wo); free(y->qn);
        free(y->kn); free(y->fn); free(y->g); free(y->u); free(y->d); free(y->gi);
        free(y->bq); free(y->bk); free(y->bv); free(y->gis); free(y->gs); free(y->us); free(y->ds);
    }
    free(r->l);
}

/* ---- reference forward, double precision ---- */

static void rnorm(const double *x, const float *w, double *o, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) o[i] = x[i] * sc * w[i];
}
static void mv(const float *W, const double *x, double *y, int cols, int rows)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}
static void rrope(double *v, int hd, int pos, bool neox)
{
    for (int i = 0; i < hd / 2; i++) {
        double a = pos * pow(10000.0, -2.0 * i / hd);
        int i0 = neox ? i : 2 * i, i1 = neox ? i + hd / 2 : 2 * i + 1;
        double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cos(a) - x1 * sin(a);
        v[i1] = x0 * sin(a) + x1 * cos(a);
    }
}

struct refstate { double *kc, *vc; }; /* (L, 128, kvd) */

static void ref_step(const struct refm *r, struct refstate *st, int tok, int pos, double *logits)
{
    const struct spec *s = &r->s;
    int E = s->E, hd = s->hd, qd = s->H * hd, kvd = s->HKV * hd, F = s->F;
    bool neox = strcmp(s->arch, "llama") != 0 && strcmp(s->arch, "granitemoe") != 0;
    bool full = !strcmp(s->arch, "olmoe");
    const struct scales *g = &r->g;
    double es = g->ls ? g->es : 1, rs = g->ls ? g->rs : 1, as = g->ls ? g->as : 1 / sqrt((double)hd);
    double x[256], xb[256], q[256], o[256], t2[256], h1[256], h2[256], acc[256], rl[64], tmpf[256];
    for (int i = 0; i < E; i++) x[i] = r->emb[(size_t)tok * E + i] * es;
    for (int l = 0; l < s->L; l++) {
        const struct lw *y = &r->l[l];
        double *kc = st->kc + (size_t)l * 128 * kvd, *vc = st->vc + (size_t)l * 128 * kvd;
        rnorm(x, y->an, xb, E);
        mv(y->wq, xb, q, E, qd);
        mv(y->wk, xb, kc + (size_t)pos * kvd, E, kvd);
        mv(y->wv, xb, vc + (size_t)pos * kvd, E, kvd);
        for (int i = 0; y->bq && i < qd; i++) q[i] += y->bq[i];
        for (int i = 0; y->bk && i < kvd; i++) {
            kc[(size_t)pos * kvd + i] += y->bk[i];
            vc[(size_t)pos * kvd + i] += y->bv[i];
        }
        if (s->qk && full) { /* olmoe: q and k each normed as one vector */
            rnorm(q, y->qn, tmpf, qd);
            memcpy(q, tmpf, sizeof(double) * qd);
            rnorm(kc + (size_t)pos * kvd, y->kn, tmpf, kvd);
            memcpy(kc + (size_t)pos * kvd, tmpf, sizeof(double) * kvd);
        }
        for (int h = 0; h < s->H; h++) {
            if (s->qk && !full) { double tmp[64]; rnorm(q + h * hd, y->qn, tmp, hd); memcpy(q + h * hd, tmp, sizeof(double) * hd); }
            rrope(q + h * hd, hd, pos, neox);
        }
        for (int h = 0; h < s->HKV; h++) {
            double *kh = kc + (size_t)pos * kvd + h * hd;
            if (s->qk && !full) { double tmp[64]; rnorm(kh, y->kn, tmp, hd); memcpy(kh, tmp, sizeof(double) * hd); }
            rrope(kh, hd, pos, neox);
        }
        for (int h = 0; h < s->H; h++) {
            int g = h / (s->H / s->HKV);
            double sc[128], mx = -1e300, sum = 0;
            for (int t = 0; t <= pos; t++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += q[h * hd + i] * kc[(size_t)t * kvd + g * hd + i];
                sc[t] = d * as;
                if (sc[t] > mx) mx = sc[t];
            }
            for (int t = 0; t <= pos; t++) { sc[t] = exp(sc[t] - mx); sum += sc[t]; }
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int t = 0; t <= pos; t++) a += sc[t] / sum * vc[(size_t)t * kvd + g * hd + i];
                o[h * hd + i] = a;
            }
        }
        mv(y->wo, o, t2, qd, E);
        for (int i = 0; i < E; i++) x[i] += rs * t2[i];
        rnorm(x, y->fn, xb, E);
        memset(acc, 0, sizeof(acc));
        if (!s->NEXP) {
            mv(y->g, xb, h1, E, F);
            mv(y->u, xb, h2, E, F);
            for (int i = 0; i < F; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h2[i];
            mv(y->d, h1, acc, F, E);
        } else {
            mv(y->gi, xb, rl, E, s->NEXP);
            double mx = -1e300, z = 0, p[64];
            for (int e = 0; e < s->NEXP; e++) if (rl[e] > mx) mx = rl[e];
            for (int e = 0; e < s->NEXP; e++) { p[e] = exp(rl[e] - mx); z += p[e]; }
            for (int e = 0; e < s->NEXP; e++) p[e] /= z;
            int sel[8]; double ws = 0;
            bool used[64] = {0};
            for (int j = 0; j < s->K; j++) {
                int b = -1;
                for (int e = 0; e < s->NEXP; e++) if (!used[e] && (b < 0 || rl[e] > rl[b])) b = e;
                used[b] = true; sel[j] = b; ws += p[b];
            }
            for (int j = 0; j < s->K; j++) {
                int e = sel[j];
                double wgt = s->norm ? p[e] / ws : p[e];
                mv(y->g + (size_t)e * E * F, xb, h1, E, F);
                mv(y->u + (size_t)e * E * F, xb, h2, E, F);
                for (int i = 0; i < F; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h2[i];
                mv(y->d + (size_t)e * E * F, h1, t2, F, E);
                for (int i = 0; i < E; i++) acc[i] += wgt * t2[i];
            }
            if (s->FS) { /* the shared expert, scaled by its sigmoid gate (qwen2moe) or not */
                double gv = 1e300; /* sigmoid 1: no gate */
                if (y->gis)
                    mv(y->gis, xb, &gv, E, 1);
                mv(y->gs, xb, h1, E, s->FS);
                mv(y->us, xb, h2, E, s->FS);
                for (int i = 0; i < s->FS; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h2[i];
                mv(y->ds, h1, t2, s->FS, E);
                for (int i = 0; i < E; i++) acc[i] += t2[i] / (1 + exp(-gv));
            }
        }
        for (int i = 0; i < E; i++) x[i] += rs * acc[i];
    }
    rnorm(x, r->onorm, xb, E);
    mv(r->out, xb, logits, E, s->V);
    for (int i = 0; g->ls && i < s->V; i++) logits[i] /= g->ls;
}

static double rel_err(const float *a, const double *b, int n)
{
    double md = 0, mb = 1e-9;
    for (int i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return md / mb;
}

static void run_case_scaled(const struct spec *s, const struct scales *g, double tol)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/tide-test-fwd-%d.gguf", (int)getpid());
    struct refm r;
    build(&r, s, g, path);
    struct model m;
    char err[256] = "";
    int rc = model_load(&m, path, err, sizeof(err));
    cr_assert_eq(rc, 0, "model_load: %s", err);
    cr_assert_eq((int)m.cfg.head_dim, s->hd);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    struct forward_state f, f2;
    cr_assert_eq(forward_init(&f, &m, be, 64), 0);
    cr_assert_eq(forward_init(&f2, &m, be, 64), 0);
    int kvd = s->HKV * s->hd;
    struct refstate st = {calloc((size_t)s->L * 128 * kvd, sizeof(double)),
                          calloc((size_t)s->L * 128 * kvd, sizeof(double))};
    double *ref = malloc(sizeof(double) * s->V);
    int prompt[6] = {1, 7, 3, 11, 2, 9};
    for (int i = 0; i < 6; i++)
        ref_step(&r, &st, prompt[i], i, ref);
    cr_assert_eq(forward_eval(&f, prompt, 6, 0), 0);
    double e = rel_err(f.logits, ref, s->V);
    cr_assert(e < tol, "%s prefill rel err %g", s->arch, e);
    /* token by token must agree with the one-call prefill */
    for (int i = 0; i < 6; i++)
        cr_assert_eq(forward_eval(&f2, prompt + i, 1, i), 0);
    for (int i = 0; i < s->V; i++)
        cr_assert(fabsf(f.logits[i] - f2.logits[i]) <= 1e-4f * (1 + fabsf(f.logits[i])),
                  "batched vs single differ at %d: %g vs %g", i, f.logits[i], f2.logits[i]);
    int next[3] = {5, 13, 4};
    for (int j = 0; j < 3; j++) {
        ref_step(&r, &st, next[j], 6 + j, ref);
        cr_assert_eq(forward_eval(&f, next + j, 1, 6 + j), 0);
        e = rel_err(f.logits, ref, s->V);
        cr_assert(e < tol, "%s decode %d rel err %g", s->arch, j, e);
    }
    cr_assert_eq(forward_eval(&f, prompt, 1, 64), TIDE_ERANGE);
    if (s->NEXP)
        cr_assert(f.n_expert_calls > 0);
    free(ref); free(st.kc); free(st.vc);
    forward_free(&f);
    forward_free(&f2);
    backend_cpu_free(&be);
    model_free(&m);
    refm_free(&r);
    unlink(path);
}

static void run_case(const struct spec *s, double tol) { run_case_scaled(s, NULL, tol); }

Test(forward, llama_dense_f32)
{
    struct spec s = {"llama", 64, 2, 4, 2, 16, 96, 0, 0, 50, false, false, true, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

Test(forward, mixtral_moe_f32)
{
    struct spec s = {"llama", 64, 2, 4, 2, 16, 64, 8, 2, 50, false, false, true, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

Test(forward, qwen3moe_qknorm_f32)
{
    struct spec s = {"qwen3moe", 64, 2, 4, 2, 24, 32, 8, 2, 50, true, true, true, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

Test(forward, qwen3moe_unnormalised_f32)
{
    struct spec s = {"qwen3moe", 64, 1, 4, 1, 24, 32, 8, 3, 50, true, true, false, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

/* top-k weights not renormalised (the loader ignores expert_weights_norm for qwen2moe: the
 * file below says nothing, as converted ones do); head_dim n_embd / n_head */
Test(forward, qwen2moe_shared_expert_f32)
{
    struct spec s = {"qwen2moe", 64, 2, 4, 2, 16, 32, 8, 3, 50, false, false, false, GGML_TYPE_F32, 96};
    run_case(&s, 1e-4);
}

Test(forward, qwen2moe_shared_expert_q8_0)
{
    struct spec s = {"qwen2moe", 64, 2, 4, 1, 16, 32, 8, 2, 64, false, false, false, GGML_TYPE_Q8_0, 64};
    run_case(&s, 3e-2);
}

/* olmoe: q and k each rmsnormed over their whole width (not per head), softmax top-k weights
 * not renormalised whatever the file says, experts sized by feed_forward_length */
Test(forward, olmoe_whole_width_qk_norm_f32)
{
    struct spec s = {"olmoe", 64, 2, 4, 4, 16, 32, 8, 2, 50, true, false, false, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

Test(forward, olmoe_q8_0)
{
    struct spec s = {"olmoe", 64, 2, 4, 4, 16, 32, 8, 3, 64, true, false, false, GGML_TYPE_Q8_0, 0};
    run_case(&s, 3e-2);
}

/* granitemoe: embeddings x es, q.k x as, each block's output x rs before its residual add,
 * logits / ls (granite-3.0-1b-a400m's values), normal rope, renormalised top-k */
Test(forward, granitemoe_scales_f32)
{
    struct spec s = {"granitemoe", 64, 2, 4, 2, 16, 32, 8, 2, 50, false, false, true, GGML_TYPE_F32, 0};
    struct scales g = {12.0f, 0.22f, 0.015625f, 6.0f};
    run_case_scaled(&s, &g, 1e-4);
}

Test(forward, granitemoe_q8_0)
{
    struct spec s = {"granitemoe", 64, 2, 4, 1, 16, 32, 8, 2, 64, false, false, true, GGML_TYPE_Q8_0, 0};
    struct scales g = {3.0f, 0.5f, 0.1f, 2.0f};
    run_case_scaled(&s, &g, 3e-2);
}

Test(forward, qwen3_dense_f32)
{
    struct spec s = {"qwen3", 64, 2, 4, 2, 16, 96, 0, 0, 50, true, false, true, GGML_TYPE_F32, 0};
    run_case(&s, 1e-4);
}

Test(forward, llama_f16)
{
    struct spec s = {"llama", 64, 2, 4, 2, 16, 96, 0, 0, 50, false, false, true, GGML_TYPE_F16, 0};
    run_case(&s, 1e-4);
}

Test(forward, llama_q8_0)
{
    /* the engine quantises activations to q8 too, so the bound is looser */
    struct spec s = {"llama", 64, 2, 4, 2, 16, 96, 8, 2, 64, false, false, true, GGML_TYPE_Q8_0, 0};
    run_case(&s, 3e-2);
}

Test(forward, mixtral_q4_K)
{
    /* k-quant rows are whole 256-value super-blocks: every matrix here is 256 wide. The
     * reference multiplies by the dequantised weights; the engine also quantises the
     * activations to int8 (cpu_quant.c), so the bound is q8_0's. */
    struct spec s = {"llama", 256, 2, 4, 2, 64, 256, 8, 2, 64, false, false, true, GGML_TYPE_Q4_K, 0};
    run_case(&s, 3e-2);
}

Test(forward, mixtral_q5_K)
{
    struct spec s = {"llama", 256, 2, 4, 2, 64, 256, 8, 2, 64, false, false, true, GGML_TYPE_Q5_K, 0};
    run_case(&s, 3e-2);
}

Test(forward, mixtral_q6_K)
{
    struct spec s = {"llama", 256, 2, 4, 2, 64, 256, 8, 2, 64, false, false, true, GGML_TYPE_Q6_K, 0};
    run_case(&s, 3e-2);
}

Test(forward, mixtral_iq4_xs)
{
    /* measured 0.047 at prefill: this random model's iq4_xs weights (a coarse non-linear
     * 4-bit grid from our plain quantiser) amplify the activation rounding more than the
     * k-quants' do; its dot products alone are as close as q4_K's (test_quants.c) */
    struct spec s = {"llama", 256, 2, 4, 2, 64, 256, 8, 2, 64, false, false, true, GGML_TYPE_IQ4_XS, 0};
    run_case(&s, 8e-2);
}

/* the 32-value block types on the q8_0 case's shape */
Test(forward, llama_q5_0_q5_1_q4_0_mxfp4)
{
    uint32_t t[] = {GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_0, GGML_TYPE_MXFP4};
    for (int i = 0; i < 4; i++) {
        struct spec s = {"llama", 64, 2, 4, 2, 16, 96, 8, 2, 64, false, false, true, t[i], 0};
        run_case(&s, 3e-2);
    }
}

Test(forward, bad_shape_is_eformat)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/tide-test-bad-%d.gguf", (int)getpid());
    /* attn_q with 63 rows where the config says 64 */
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.embedding_length", 64);
    gguf_w_u32(w, "llama.block_count", 1);
    gguf_w_u32(w, "llama.attention.head_count", 4);
    gguf_w_u32(w, "llama.feed_forward_length", 96);
    gguf_w_u32(w, "llama.vocab_size", 50);
    float *z = calloc(64 * 96, sizeof(float));
    uint64_t ne[2] = {64, 50};
    gguf_w_tensor(w, "token_embd.weight", GGML_TYPE_F32, 2, ne, z);
    ne[1] = 1;
    gguf_w_tensor(w, "output_norm.weight", GGML_TYPE_F32, 1, ne, z);
    gguf_w_tensor(w, "blk.0.attn_norm.weight", GGML_TYPE_F32, 1, ne, z);
    ne[1] = 63; /* wrong */
    gguf_w_tensor(w, "blk.0.attn_q.weight", GGML_TYPE_F32, 2, ne, z);
    cr_assert_eq(gguf_writer_write(w, path), 0);
    gguf_writer_free(w);
    free(z);
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_load(&m, path, err, sizeof(err)), TIDE_EFORMAT);
    cr_assert(strstr(err, "blk.0.attn_q.weight") != NULL, "message: %s", err);
    unlink(path);
}

/* A qwen2moe file without its shared expert (no width key, no feed_forward_length): a clear
 * error at load naming the key, as llama.cpp also refuses it. */
Test(forward, qwen2moe_without_shared_expert_is_refused)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/tide-test-q2m-%d.gguf", (int)getpid());
    struct spec s = {"qwen2moe", 64, 1, 4, 2, 16, 32, 8, 2, 50, false, false, false, GGML_TYPE_F32, 0};
    struct refm r;
    build(&r, &s, NULL, path);
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_load(&m, path, err, sizeof(err)), TIDE_EFORMAT);
    cr_assert(strstr(err, "qwen2moe.expert_shared_feed_forward_length") != NULL, "message: %s", err);
    refm_free(&r);
    unlink(path);
}

/* GraniteMoeShared: an ungated shared expert (expert_shared_feed_forward_length wide) added to the
 * routed experts' sum, the residual scale over both */
Test(forward, granitemoe_shared_expert_f32)
{
    struct spec s = {"granitemoe", 64, 2, 4, 2, 16, 32, 8, 2, 50, false, false, true, GGML_TYPE_F32, 96};
    struct scales g = {12.0f, 0.22f, 0.015625f, 6.0f};
    run_case_scaled(&s, &g, 1e-4);
}

/* granitemoe: a file without logit_scale (llama.cpp requires it) is refused at load, the error
 * naming the key; olmoe without its q/k norms names the missing tensor */
Test(forward, granitemoe_and_olmoe_refusals_name_the_key)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/tide-test-gr-%d.gguf", (int)getpid());
    struct spec s = {"granitemoe", 64, 1, 4, 2, 16, 32, 8, 2, 50, false, false, true, GGML_TYPE_F32, 0};
    struct refm r;
    struct model m;
    char err[256] = "";
    build(&r, &s, NULL, path);
    cr_assert_eq(model_load(&m, path, err, sizeof(err)), TIDE_EFORMAT);
    cr_assert(strstr(err, "granitemoe.logit_scale") != NULL, "message: %s", err);
    refm_free(&r);
    struct spec o = {"olmoe", 64, 1, 4, 4, 16, 32, 8, 2, 50, false, false, false, GGML_TYPE_F32, 0};
    build(&r, &o, NULL, path);
    cr_assert_eq(model_load(&m, path, err, sizeof(err)), TIDE_EFORMAT);
    cr_assert(strstr(err, "blk.0.attn_q_norm.weight") != NULL, "message: %s", err);
    refm_free(&r);
    unlink(path);
}
