/* test_mla.c - deepseek2's forward (forward_mla.c and the layer around it) against a double
 * reference on tide-mkmodel's deepseek2 preset in f32.
 *
 * The reference runs MLA in its plain, unabsorbed form: each head's keys and values are expanded
 * from the cached latent (k_nope = attn_k_b^T latent, v = attn_v_b latent), q.k over the head's
 * mla_k = nope + rope widths times mla_kq_mscale^2 / sqrt(mla_k), NORM rope on the last n_rot of q
 * and on the shared key part. The forward runs the absorbed form (one KV head of the latent and the
 * roped part, q absorbed through attn_k_b, attn_v_b after the attention): the two agree only if
 * the absorption, the V copy, the scale correction and the rope pairs are right. Layer 0 is dense,
 * the rest route softmax top-2 without renormalising and add two ungated shared experts. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/modelgen.h"

#define NTOK 12 /* the prompt: 9 in one chunk, then 3 decode steps */
#define NPRE 9

static const float *rowp(const struct tensor *t, uint64_t r)
{
    return (const float *)((const uint8_t *)t->data + r * t->row_bytes);
}

/* y[rows] = W x, W a (cols, rows) f32 tensor from row r0 */
static void mv(const struct tensor *w, uint64_t r0, const double *x, double *y, int cols, int rows)
{
    for (int r = 0; r < rows; r++) {
        const float *wr = rowp(w, r0 + (uint64_t)r);
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += wr[c] * x[c];
        y[r] = s;
    }
}

static void rms(const double *x, const struct tensor *w, double *o, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double k = 1.0 / sqrt(ss / n + eps);
    const float *g = rowp(w, 0);
    for (int i = 0; i < n; i++)
        o[i] = x[i] * k * g[i];
}

/* NORM pairs (2i, 2i + 1) of v[0..d) turned by pos * freqs[i], times mscale */
static void rope_norm(double *v, int d, int pos, const float *freqs, double mscale)
{
    for (int i = 0; i < d / 2; i++) {
        double a = pos * (double)freqs[i], c = cos(a) * mscale, s = sin(a) * mscale;
        double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

static double silu(double x) { return x / (1 + exp(-x)); }

/* x += down(silu(gate xn) * up xn) */
static void ffn(const struct tensor *g, const struct tensor *u, const struct tensor *d, const double *xn, double *x,
                double scale, int E, int F)
{
    double *a = malloc(sizeof(double) * F), *b = malloc(sizeof(double) * F), *o = malloc(sizeof(double) * E);
    mv(g, 0, xn, a, E, F);
    mv(u, 0, xn, b, E, F);
    for (int i = 0; i < F; i++)
        a[i] = silu(a[i]) * b[i];
    mv(d, 0, a, o, F, E);
    for (int i = 0; i < E; i++)
        x[i] += scale * o[i];
    free(a), free(b), free(o);
}

/* The reference's logits after each of the NTOK tokens (ref[t * V ..]). */
static void reference(const struct model *m, const int *tok, double *ref)
{
    const struct model_config *c = &m->cfg;
    int E = (int)c->n_embd, H = (int)c->n_head, L = (int)c->n_layer, V = (int)c->n_vocab;
    int kvl = (int)c->kv_lora_rank, rot = (int)c->n_rot, mk = (int)c->mla_k, nope = mk - rot, mv_ = (int)c->mla_v;
    double eps = c->rms_eps, kq = (double)c->mla_kq_mscale * c->mla_kq_mscale / sqrt((double)mk);
    double *lat = calloc((size_t)L * NTOK * kvl, sizeof(double)), *kpe = calloc((size_t)L * NTOK * rot, sizeof(double));
    double x[512], xn[512], q[1024], kv[1024], att[1024], o[512], lg[64], sc[NTOK];
    cr_assert(E <= 512 && H * mk <= 1024 && kvl + rot <= 1024 && H * mv_ <= 1024 && (int)c->n_expert <= 64);
    for (int t = 0; t < NTOK; t++) {
        const float *e = rowp(&m->tok_embd, (uint64_t)tok[t]);
        for (int i = 0; i < E; i++)
            x[i] = e[i];
        for (int l = 0; l < L; l++) {
            const struct model_layer *Y = &m->layers[l];
            rms(x, &Y->attn_norm, xn, E, eps);
            mv(&Y->wq, 0, xn, q, E, H * mk);
            mv(&Y->wkv_a_mqa, 0, xn, kv, E, kvl + rot);
            double *lt = lat + ((size_t)l * NTOK + t) * kvl, *kp = kpe + ((size_t)l * NTOK + t) * rot;
            rms(kv, &Y->kv_a_norm, lt, kvl, eps);
            memcpy(kp, kv + kvl, sizeof(double) * rot);
            rope_norm(kp, rot, t, m->rope_freqs, c->rope_mscale);
            for (int h = 0; h < H; h++) {
                double *qh = q + h * mk;
                rope_norm(qh + nope, rot, t, m->rope_freqs, c->rope_mscale);
                double mx = -1e300, z = 0;
                for (int j = 0; j <= t; j++) { /* head h's key j: its k_nope from the latent */
                    const double *lj = lat + ((size_t)l * NTOK + j) * kvl, *pj = kpe + ((size_t)l * NTOK + j) * rot;
                    double s = 0;
                    for (int i = 0; i < nope; i++) {
                        double k = 0;
                        for (int r = 0; r < kvl; r++) /* wk_b head h: row r (of kvl), column i */
                            k += rowp(&Y->wk_b, (uint64_t)h * kvl + r)[i] * lj[r];
                        s += qh[i] * k;
                    }
                    for (int i = 0; i < rot; i++)
                        s += qh[nope + i] * pj[i];
                    sc[j] = s * kq;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= t; j++)
                    z += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < mv_; d++)
                    att[h * mv_ + d] = 0;
                for (int j = 0; j <= t; j++) {
                    const double *lj = lat + ((size_t)l * NTOK + j) * kvl;
                    double v[256];
                    mv(&Y->wv_b, (uint64_t)h * mv_, lj, v, kvl, mv_);
                    for (int d = 0; d < mv_; d++)
                        att[h * mv_ + d] += sc[j] / z * v[d];
                }
            }
            mv(&Y->wo, 0, att, o, H * mv_, E);
            for (int i = 0; i < E; i++)
                x[i] += o[i];
            rms(x, &Y->ffn_norm, xn, E, eps);
            if ((uint32_t)l < c->n_dense_lead) {
                ffn(&Y->ffn_gate, &Y->ffn_up, &Y->ffn_down, xn, x, 1.0, E, (int)c->n_ff);
                continue;
            }
            int ne = (int)c->n_expert;
            mv(&Y->ffn_gate_inp, 0, xn, lg, E, ne);
            double mx = lg[0], z = 0;
            for (int i = 1; i < ne; i++)
                mx = lg[i] > mx ? lg[i] : mx;
            for (int i = 0; i < ne; i++)
                z += (lg[i] = exp(lg[i] - mx));
            for (uint32_t k = 0; k < c->n_expert_used; k++) { /* top-k of the softmax, not renormalised */
                int b = 0;
                for (int i = 1; i < ne; i++)
                    b = lg[i] > lg[b] ? i : b;
                struct expert_weights ew;
                model_expert_host(m, (uint32_t)l, (uint32_t)b, &ew);
                ffn(&ew.gate, &ew.up, &ew.down, xn, x, lg[b] / z, E, (int)c->n_ff_exp);
                lg[b] = -1;
            }
            ffn(&Y->ffn_gate_shexp, &Y->ffn_up_shexp, &Y->ffn_down_shexp, xn, x, 1.0, E, (int)c->n_ff_shexp);
        }
        rms(x, &m->output_norm, xn, E, eps);
        mv(&m->output, 0, xn, ref + (size_t)t * V, E, V);
    }
    free(lat);
    free(kpe);
}

static double rel_err(const float *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

Test(mla, deepseek2_f32_matches_the_unabsorbed_reference, .timeout = 60)
{
    char path[96], err[256] = "";
    snprintf(path, sizeof path, "/tmp/tide-test-mla-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "deepseek2", .out = path, .seed = 3, .type = GGML_TYPE_F32, .threads = 1};
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert(m.cfg.mla_kq_mscale > 1.2f, "the preset's yarn scale correction is in play");
    int V = (int)m.cfg.n_vocab, tok[NTOK];
    for (int i = 0; i < NTOK; i++)
        tok[i] = (int)((37u * (unsigned)i + 11u) % (unsigned)V);
    double *ref = malloc(sizeof(double) * (size_t)V * NTOK);
    reference(&m, tok, ref);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    struct forward_state f;
    cr_assert_eq(forward_init(&f, &m, be, 64), 0);
    cr_assert_eq(forward_eval(&f, tok, NPRE, 0), 0);
    double e = rel_err(f.logits, ref + (size_t)(NPRE - 1) * V, V);
    cr_expect_lt(e, 1e-4, "prefill's last logits: relative RMS %g", e);
    for (int t = NPRE; t < NTOK; t++) {
        cr_assert_eq(forward_eval(&f, tok + t, 1, t), 0);
        e = rel_err(f.logits, ref + (size_t)t * V, V);
        cr_expect_lt(e, 1e-4, "decode at %d: relative RMS %g", t, e);
    }
    forward_free(&f);
    backend_cpu_free(&be);
    free(ref);
    model_free(&m);
    unlink(path);
}

/* A header of V2-Lite's MLA form with one key changed (or added): what DeepSeek-V2 and V3 add is
 * refused by the key's name before any tensor is read. */
static void refused_with(const char *key, uint32_t u, float f, int kv_len, const char *want)
{
    char path[96], err[256] = "";
    snprintf(path, sizeof path, "/tmp/tide-test-mla-hdr-%d.gguf", (int)getpid());
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "deepseek2");
    const struct { const char *k; uint32_t v; } keys[] = {
        {"deepseek2.embedding_length", 128}, {"deepseek2.block_count", 27}, {"deepseek2.attention.head_count", 4},
        {"deepseek2.attention.head_count_kv", 1}, {"deepseek2.feed_forward_length", 256},
        {"deepseek2.expert_count", 8}, {"deepseek2.expert_used_count", 2},
        {"deepseek2.expert_feed_forward_length", 64}, {"deepseek2.attention.kv_lora_rank", 64},
        {"deepseek2.attention.key_length_mla", 48}, {"deepseek2.attention.value_length_mla", 32},
        {"deepseek2.rope.dimension_count", 16}, {"deepseek2.leading_dense_block_count", 1},
        {"deepseek2.expert_shared_count", 2}, {"deepseek2.vocab_size", 50},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        gguf_w_u32(w, keys[i].k, keys[i].v);
    gguf_w_u32(w, "deepseek2.attention.key_length", (uint32_t)kv_len);
    if (key && f != 0)
        gguf_w_f32(w, key, f);
    else if (key)
        gguf_w_u32(w, key, u);
    cr_assert_eq(gguf_writer_write(w, path), 0);
    gguf_writer_free(w);
    struct model m;
    int rc = model_load(&m, path, err, sizeof err);
    cr_assert_lt(rc, 0, "%s: refused", want);
    cr_assert(strstr(err, want) != NULL, "message: %s", err);
    unlink(path);
}

Test(mla, deepseek2_refusals_name_the_key)
{
    refused_with("deepseek2.attention.q_lora_rank", 1536, 0, 80, "q_lora_rank 1536");
    refused_with("deepseek2.expert_gating_func", 2, 0, 80, "expert_gating_func 2");
    refused_with("deepseek2.expert_weights_scale", 0, 2.5f, 80, "expert_weights_scale 2.5");
    refused_with(NULL, 0, 0, 192, "not the converter's MLA form"); /* key_length of the unabsorbed heads */
}
