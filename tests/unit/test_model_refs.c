/* test_model_refs.c - tide's own trained vision tower (models/tide-shapes-mmproj.gguf)
 * against PyTorch: the reference image's embeddings, computed by scripts/train/train.py with
 * the f16-rounded weights the GGUF holds, stored by scripts/train/make_refs.py in
 * tests/model/vision_embd.bin. tide's CPU encoder must match them to a relative error below
 * 1e-3 (the issue-8 bar); the text side is checked through the HTTP API by
 * tests/model/test_model.py. Run from the repository root, as `make test` does. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vision/clip.h"
#include "vision/image.h"

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (run from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)len);
    cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

Test(model_refs, vision_embeddings_match_pytorch)
{
    size_t n;
    unsigned char *b = read_all("tests/model/vision_embd.bin", &n);
    int32_t w, h, nt, ne;
    memcpy(&w, b, 4);
    memcpy(&h, b + 4, 4);
    cr_assert(w > 0 && h > 0 && n >= 8 + (size_t)w * h * 3 + 8);
    const unsigned char *px = b + 8;
    memcpy(&nt, px + (size_t)w * h * 3, 4);
    memcpy(&ne, px + (size_t)w * h * 3 + 4, 4);
    const float *want = (const float *)(px + (size_t)w * h * 3 + 8);
    cr_assert_eq(n, 16 + (size_t)w * h * 3 + sizeof(float) * nt * ne);

    struct backend be;
    cr_assert_eq(backend_cpu_init(&be, 2), 0);
    struct clip_model *m;
    char err[256];
    cr_assert_eq(clip_load(&m, "models/tide-shapes-mmproj.gguf", NULL, &be, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(clip_n_tokens(m, w, h), nt);
    cr_assert_eq(clip_n_embd_out(m), ne);
    struct image_u8 img = {w, h, malloc((size_t)w * h * 3)};
    memcpy(img.rgb, px, (size_t)w * h * 3);
    struct image_f32 f;
    cr_assert_eq(clip_preprocess(m, &img, &f, err, sizeof err), 0, "%s", err);
    float *got = malloc(sizeof(float) * nt * ne);
    cr_assert_eq(clip_encode(m, &f, got, err, sizeof err), nt, "%s", err);

    /* relative error of the whole embedding (Frobenius), and the worst element against the
     * largest magnitude, both printed so the margin is visible */
    double d2 = 0, r2 = 0, worst = 0, amax = 0;
    for (int i = 0; i < nt * ne; i++) {
        double d = (double)got[i] - want[i];
        d2 += d * d;
        r2 += (double)want[i] * want[i];
        worst = fmax(worst, fabs(d));
        amax = fmax(amax, fabs(want[i]));
    }
    double rel = sqrt(d2 / r2);
    cr_log_info("vision embeddings vs PyTorch: relative error %.2e, worst element %.2e of max %.2f",
                rel, worst, amax);
    fprintf(stderr, "model_refs: vision embeddings (%d x %d) vs PyTorch: relative error %.2e, "
            "worst element %.2e (max |x| %.2f)\n", nt, ne, rel, worst, amax);
    cr_assert(rel < 1e-3, "relative error %.3e >= 1e-3", rel);
    cr_assert(worst / amax < 1e-3, "worst element %.3e of max %.3f", worst, amax);
    free(got);
    image_f32_free(&f);
    image_u8_free(&img);
    clip_free(m);
    backend_cpu_free(&be);
    free(b);
}
