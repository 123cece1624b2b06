/* test_clip.c - src/vision's clip encoder (suite vision, beside test_vision.c's images): load
 * of a generated mmproj, allocator accounting against clip_estimate, finite deterministic
 * output of the right shape, one block against a naive double-precision reference that
 * shares no code with clip.c, and mmprojgen's output being deterministic. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "vision/clip.h"
#include "vision/image.h"
#include "vision/mmprojgen.h"

struct counting { size_t live, total; int fail_at, calls; };
static void *c_alloc(void *ud, size_t n)
{
    struct counting *c = ud;
    if (++c->calls == c->fail_at) return NULL;
    size_t *p = malloc(n + 16);
    if (!p) return NULL;
    p[0] = n;
    c->live += n;
    c->total += n;
    return (uint8_t *)p + 16;
}
static void c_free(void *ud, void *q)
{
    struct counting *c = ud;
    size_t *p = (size_t *)((uint8_t *)q - 16);
    c->live -= p[0];
    free(p);
}

static const char *gen(const char *tag, int type, bool cls, bool quick)
{
    static char path[8][128];
    static int k;
    char *p = path[k++ & 7];
    snprintf(p, 128, "/tmp/tide-test-mmproj-%d-%s.gguf", (int)getpid(), tag);
    struct mmprojgen_options o = {.out = p, .seed = 7, .type = type, .n_embd_text = 128,
                                  .class_token = cls, .quick_gelu = quick};
    char err[200];
    cr_assert_eq(mmprojgen_write(&o, err, sizeof err), 0, "%s", err);
    return p;
}

static struct image_f32 test_image(int S)
{
    uint8_t *rgb = malloc((size_t)S * 2 * S * 3);
    for (int i = 0; i < S * 2 * S; i++) {
        rgb[i * 3] = (uint8_t)(i * 7);
        rgb[i * 3 + 1] = (uint8_t)(i / 3);
        rgb[i * 3 + 2] = (uint8_t)(255 - i % 251);
    }
    struct image_u8 im = {2 * S, S, rgb};
    const uint8_t pad[3] = {122, 116, 104};
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    const float sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    struct image_f32 f;
    cr_assert_eq(image_preprocess_square(&im, S, pad, mean, sd, &f), 0);
    image_u8_free(&im);
    return f;
}

Test(vision, clip_load_encode)
{
    const char *path = gen("f16", -1, false, false);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    size_t wb, wsb;
    char err[256];
    cr_assert_eq(clip_estimate(path, 1024, &wb, &wsb, err, sizeof err), 0, "%s", err);
    cr_assert_eq(clip_estimate(path, 63, &wb, &wsb, err, sizeof err), TIDE_ERANGE);
    cr_assert(strstr(err, "64 tokens"), "%s", err);
    cr_assert_eq(clip_estimate(path, 0, &wb, &wsb, err, sizeof err), 0);
    struct clip_hparams hp;
    cr_assert_eq(clip_read_hparams(path, &hp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hp.n_patches, 64);
    cr_assert_eq(hp.n_embd_out, 128);
    cr_assert_eq(hp.n_mm_hidden, 128);
    struct counting cnt = {0};
    struct clip_alloc a = {c_alloc, c_free, &cnt};
    struct clip_model *m;
    cr_assert_eq(clip_load(&m, path, &a, &be, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cnt.live, wb + wsb, "allocated %zu, estimated %zu", cnt.live, wb + wsb);
    cr_assert_eq(m->hp.image_size, 64);
    cr_assert_eq(m->hp.n_patches, 64);
    cr_assert_eq(m->hp.n_layer_run, 2);
    cr_assert_eq(m->hp.act, CLIP_ACT_GELU);
    cr_assert_eq(m->hp.pad_rgb[0], 122);
    cr_assert_eq(m->hp.pad_rgb[1], 116);
    cr_assert_eq(m->hp.pad_rgb[2], 104);
    cr_assert_eq(clip_n_embd_out(m), 128);
    cr_assert_eq(clip_n_tokens(m, 4000, 300), 64);
    unlink(path);  /* the encoder no longer needs its file */

    struct image_u8 big = {640, 200, calloc(640 * 200, 3)};
    struct image_f32 f;
    cr_assert_eq(clip_preprocess(m, &big, &f, err, sizeof err), 0);
    cr_assert_eq(f.w, 64);
    image_f32_free(&f);
    image_u8_free(&big);

    f = test_image(64);
    float *o1 = malloc(sizeof(float) * 64 * 128), *o2 = malloc(sizeof(float) * 64 * 128);
    cr_assert_eq(clip_encode(m, &f, o1, err, sizeof err), 64, "%s", err);
    cr_assert_eq(clip_encode(m, &f, o2, err, sizeof err), 64);
    double ss = 0;
    for (int i = 0; i < 64 * 128; i++) {
        cr_assert(isfinite(o1[i]), "out[%d] = %f", i, o1[i]);
        ss += (double)o1[i] * o1[i];
    }
    cr_assert(!memcmp(o1, o2, sizeof(float) * 64 * 128), "encode is not deterministic");
    double rms = sqrt(ss / (64 * 128));
    cr_assert(rms > 0.05 && rms < 10, "output rms %f", rms);
    /* distinct patches give distinct tokens */
    cr_assert(memcmp(o1, o1 + 128 * 9, sizeof(float) * 128));
    struct image_f32 bad = {32, 32, f.data};
    cr_assert_eq(clip_encode(m, &bad, o2, err, sizeof err), TIDE_EINVAL);
    free(o1);
    free(o2);
    image_f32_free(&f);
    clip_free(m);
    cr_assert_eq(cnt.live, 0, "clip_free left %zu bytes", cnt.live);
    backend_cpu_free(&be);
}

/* The GPU's load path (a host copy, then clip_upload) run on the CPU backend, where upload is
 * a memcpy: the same embeddings bit for bit as clip_load, the same allocator sizes as the
 * estimate, and the host copy itself refuses to encode. */
Test(vision, clip_upload_matches_load)
{
    const char *types[] = {"up-f16", "up-q8"};
    for (int ti = 0; ti < 2; ti++) {
        const char *path = gen(types[ti], ti ? GGML_TYPE_Q8_0 : -1, ti == 1, ti == 1);
        struct backend be;
        cr_assert_eq(backend_cpu_init(&be, 2), 0);
        char err[256];
        size_t wb, wsb, wb2, wsb2;
        cr_assert_eq(clip_estimate(path, 0, &wb, &wsb, err, sizeof err), 0, "%s", err);
        cr_assert_eq(clip_estimate_on(path, &be, 0, &wb2, &wsb2, err, sizeof err), 0, "%s", err);
        cr_assert_eq(wb2, wb);
        cr_assert_eq(wsb2, wsb, "the CPU backend takes no device scratch");
        struct clip_model *ref, *host, *up;
        cr_assert_eq(clip_load(&ref, path, NULL, &be, err, sizeof err), 0, "%s", err);
        struct counting hc = {0}, dc = {0};
        struct clip_alloc ha = {c_alloc, c_free, &hc}, da = {c_alloc, c_free, &dc};
        cr_assert_eq(clip_load_host(&host, path, &ha, err, sizeof err), 0, "%s", err);
        cr_assert_eq(hc.live, wb, "host copy %zu, weights %zu", hc.live, wb);
        unlink(path);
        cr_assert_eq(clip_upload(&up, host, &da, &be, err, sizeof err), 0, "%s", err);
        cr_assert_eq(dc.live, wb + wsb, "uploaded %zu, estimated %zu", dc.live, wb + wsb);
        struct image_f32 f = test_image(64);
        int N = ref->hp.n_patches, T = ref->hp.n_embd_out;
        float *o1 = malloc(sizeof(float) * N * T), *o2 = malloc(sizeof(float) * N * T);
        cr_assert_eq(clip_encode(ref, &f, o1, err, sizeof err), N, "%s", err);
        cr_assert_eq(clip_encode(up, &f, o2, err, sizeof err), N, "%s", err);
        cr_assert(!memcmp(o1, o2, sizeof(float) * N * T), "%s: upload path differs from load",
                  types[ti]);
        cr_assert_eq(clip_encode(host, &f, o2, err, sizeof err), TIDE_EINVAL);
        /* the host copy is the source of every later load: still intact after a load + free */
        clip_free(up);
        cr_assert_eq(dc.live, 0);
        cr_assert_eq(clip_upload(&up, host, &da, &be, err, sizeof err), 0, "%s", err);
        cr_assert_eq(clip_encode(up, &f, o2, err, sizeof err), N);
        cr_assert(!memcmp(o1, o2, sizeof(float) * N * T));
        clip_free(up);
        /* allocation failure on upload: clean error, nothing left */
        for (int at = 1; at <= 2; at++) {
            struct counting fc = {.fail_at = at};
            struct clip_alloc fa = {c_alloc, c_free, &fc};
            cr_assert_eq(clip_upload(&up, host, &fa, &be, err, sizeof err), TIDE_ENOMEM);
            cr_assert_null(up);
            cr_assert_eq(fc.live, 0);
        }
        free(o1), free(o2);
        image_f32_free(&f);
        clip_free(host);
        cr_assert_eq(hc.live, 0);
        clip_free(ref);
        backend_cpu_free(&be);
    }
}

Test(vision, clip_load_failures)
{
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 1), 0);
    char err[256] = "";
    struct clip_model *m = (struct clip_model *)1;
    cr_assert_lt(clip_load(&m, "/nonexistent/mmproj.gguf", NULL, &be, err, sizeof err), 0);
    cr_assert_null(m);
    cr_assert(strstr(err, "/nonexistent/mmproj.gguf"), "%s", err);

    /* allocation failure: clean error, nothing left allocated */
    const char *path = gen("fail", -1, false, false);
    for (int at = 1; at <= 2; at++) {
        struct counting cnt = {.fail_at = at};
        struct clip_alloc a = {c_alloc, c_free, &cnt};
        cr_assert_eq(clip_load(&m, path, &a, &be, err, sizeof err), TIDE_ENOMEM);
        cr_assert_eq(cnt.live, 0);
        cr_assert(strstr(err, "allocate"), "%s", err);
    }
    /* truncated file */
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    fp = fopen(path, "wb");
    fwrite(buf, 1, (size_t)n / 2, fp);
    fclose(fp);
    cr_assert_lt(clip_load(&m, path, NULL, &be, err, sizeof err), 0);
    free(buf);
    /* another projector type */
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "clip.projector_type", "ldp");
    cr_assert_eq(gguf_writer_write(w, path), 0);
    gguf_writer_free(w);
    cr_assert_eq(clip_load(&m, path, NULL, &be, err, sizeof err), TIDE_EUNSUPPORTED);
    cr_assert(strstr(err, "ldp"), "%s", err);
    size_t wb, wsb;
    cr_assert_eq(clip_estimate(path, 0, &wb, &wsb, err, sizeof err), TIDE_EUNSUPPORTED);
    unlink(path);
    backend_cpu_free(&be);
}

/* Naive reference of one pre-norm ViT block in double, weights dequantised from the
 * loaded model's own copies (so only the arithmetic is compared). */
static double *deq(const struct tensor *t)
{
    size_t n = (size_t)t->ne[0] * t->ne[1];
    float *f = malloc(sizeof(float) * n);
    for (uint64_t r = 0; r < t->ne[1]; r++)
        ggml_dequantize(t->type, (const uint8_t *)t->data + r * t->row_bytes, f + r * t->ne[0],
                        t->ne[0]);
    double *d = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

static void ref_linear(const struct tensor *t, const float *b, const double *x, double *y, int P)
{
    double *w = deq(t);
    int in = (int)t->ne[0], out = (int)t->ne[1];
    for (int p = 0; p < P; p++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < in; i++) s += w[(size_t)o * in + i] * x[(size_t)p * in + i];
            y[(size_t)p * out + o] = s;
        }
    free(w);
}

static void ref_ln(const double *x, double *y, const float *w, const float *b, int P, int D,
                   double eps)
{
    for (int p = 0; p < P; p++) {
        double mu = 0, var = 0;
        for (int i = 0; i < D; i++) mu += x[p * D + i];
        mu /= D;
        for (int i = 0; i < D; i++) var += (x[p * D + i] - mu) * (x[p * D + i] - mu);
        var /= D;
        for (int i = 0; i < D; i++)
            y[p * D + i] = (x[p * D + i] - mu) / sqrt(var + eps) * (w ? w[i] : 1) + (b ? b[i] : 0);
    }
}

static void check_block(const char *tag, int type, bool cls, bool quick, double tol)
{
    const char *path = gen(tag, type, cls, quick);
    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 3), 0);
    struct clip_model *m;
    char err[256];
    cr_assert_eq(clip_load(&m, path, NULL, &be, err, sizeof err), 0, "%s", err);
    unlink(path);
    const struct clip_hparams *hp = &m->hp;
    const int P = hp->n_pos, D = hp->n_embd, F = hp->n_ff, H = hp->n_head, d = hp->head_dim;
    cr_assert_eq(hp->has_class, cls);
    cr_assert_eq(hp->act, quick ? CLIP_ACT_GELU_QUICK : CLIP_ACT_GELU);
    float *x = malloc(sizeof(float) * P * D);
    double *xd = malloc(sizeof(double) * P * D), *hn = malloc(sizeof(double) * P * D);
    double *q = malloc(sizeof(double) * P * D), *k = malloc(sizeof(double) * P * D);
    double *v = malloc(sizeof(double) * P * D), *att = malloc(sizeof(double) * P * D);
    double *f = malloc(sizeof(double) * P * F), *y = malloc(sizeof(double) * P * D);
    for (int i = 0; i < P * D; i++) {
        x[i] = (float)sin(i * 0.37) * 1.5f + (float)((i * 13) % 7) * 0.1f;
        xd[i] = x[i];
    }
    for (int il = 0; il < hp->n_layer_run; il++) {
        const struct clip_layer *ly = &m->layers[il];
        ref_ln(xd, hn, ly->ln1_w, ly->ln1_b, P, D, hp->eps);
        ref_linear(&ly->q, ly->q_b, hn, q, P);
        ref_linear(&ly->k, ly->k_b, hn, k, P);
        ref_linear(&ly->v, ly->v_b, hn, v, P);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < P; i++) {
                double s[P], mx = -1e300, sum = 0;
                for (int j = 0; j < P; j++) {
                    double dot = 0;
                    for (int c = 0; c < d; c++) dot += q[i * D + h * d + c] * k[j * D + h * d + c];
                    s[j] = dot / sqrt((double)d);
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j < P; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                for (int c = 0; c < d; c++) {
                    double o = 0;
                    for (int j = 0; j < P; j++) o += s[j] / sum * v[j * D + h * d + c];
                    att[i * D + h * d + c] = o;
                }
            }
        ref_linear(&ly->o, ly->o_b, att, y, P);
        for (int i = 0; i < P * D; i++) xd[i] += y[i];
        ref_ln(xd, hn, ly->ln2_w, ly->ln2_b, P, D, hp->eps);
        ref_linear(&ly->up, ly->up_b, hn, f, P);
        for (int i = 0; i < P * F; i++) {
            double u = f[i];
            f[i] = quick ? u / (1 + exp(-1.702 * u))
                         : 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
        }
        ref_linear(&ly->down, ly->down_b, f, y, P);
        for (int i = 0; i < P * D; i++) xd[i] += y[i];

        cr_assert_eq(clip_run_block(m, il, x, P), 0);
        double maxd = 0, maxv = 0;
        for (int i = 0; i < P * D; i++) {
            maxd = fmax(maxd, fabs(x[i] - xd[i]));
            maxv = fmax(maxv, fabs(xd[i]));
        }
        cr_assert(maxd <= tol * fmax(1.0, maxv), "%s block %d: max diff %g (max |x| %g)", tag,
                  il, maxd, maxv);
        for (int i = 0; i < P * D; i++) xd[i] = x[i];  /* next block from the same input */
    }
    cr_assert_eq(clip_run_block(m, hp->n_layer_run, x, P), TIDE_EINVAL);
    free(x); free(xd); free(hn); free(q); free(k); free(v); free(att); free(f); free(y);
    clip_free(m);
    backend_cpu_free(&be);
}

Test(vision, clip_block_matches_reference_f32) { check_block("f32", GGML_TYPE_F32, false, false, 1e-4); }
Test(vision, clip_block_matches_reference_f16_class_quick)
{
    check_block("f16c", GGML_TYPE_F16, true, true, 1e-4);
}
Test(vision, clip_block_matches_reference_q8) { check_block("q8", GGML_TYPE_Q8_0, false, false, 5e-2); }

Test(vision, mmprojgen_deterministic)
{
    const char *a = gen("da", -1, false, false), *b = gen("db", -1, false, false);
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        cr_assert_eq(ca, cb);
    } while (ca != EOF);
    fclose(fa);
    fclose(fb);
    unlink(a);
    unlink(b);
}
