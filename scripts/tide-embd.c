/* tide-embd.c - tide's Qwen-VL image embedding of the synthetic image scripts/mtmd-embd.c
 * makes (same pixels), for scripts/check-mtmd-parity.sh: prints the tokens' count and width,
 * then every float, one per line, computed as the daemon does (the resize rules within a budget
 * of MAX_TOKENS merged tokens, 0 or absent: the tower's own, the resize where one is needed,
 * the CPU backend's ops). With TIDE_EMBD_PPM=FILE in the environment it also writes the image it
 * encodes (after the resize) there as a binary PPM, for the script to hand to libmtmd. Built
 * against build/libtide.a by the script. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "vision/dynres.h"
#include "vision/image.h"
#include "vision/qwen3vl.h"

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: tide-embd MMPROJ W H [MAX_TOKENS]\n");
        return 2;
    }
    int w = atoi(argv[2]), h = atoi(argv[3]);
    char err[256] = "";
    struct qwen3vl_tower *t;
    if (qwen3vl_load(argv[1], &t, err, sizeof err)) {
        fprintf(stderr, "tide-embd: %s\n", err);
        return 1;
    }
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(t);
    unsigned char *rgb = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = (unsigned char)((x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255);
    struct image_u8 img = {w, h, rgb}, sized;
    struct dynres_rules rules = qwen3vl_rules(hp, argc == 5 ? atoi(argv[4]) : 0);
    int n = dynres_resize(&rules, &img, &sized, &w, &h), e = hp->n_embd_text * (1 + hp->n_deepstack);
    if (n < 0) {
        fprintf(stderr, "tide-embd: resize: %d\n", n);
        return 1;
    }
    if (sized.rgb) {
        free(rgb);
        rgb = sized.rgb;
    }
    const char *ppm = getenv("TIDE_EMBD_PPM");
    if (ppm) {
        FILE *f = fopen(ppm, "wb");
        if (!f || fprintf(f, "P6\n%d %d\n255\n", w, h) < 0 || fwrite(rgb, 3, (size_t)w * h, f) != (size_t)w * h ||
            fclose(f)) {
            fprintf(stderr, "tide-embd: cannot write %s\n", ppm);
            return 1;
        }
    }
    float *out = malloc(sizeof(float) * (size_t)n * e);
    struct backend be; /* the daemon's path: the CPU backend's ops */
    if (backend_cpu_init(&be, 2) || qwen3vl_encode(t, &be, rgb, w, h, out, err, sizeof err)) {
        fprintf(stderr, "tide-embd: %s\n", err);
        return 1;
    }
    printf("%d %d\n", n, e);
    for (size_t k = 0; k < (size_t)n * e; k++)
        printf("%.9g\n", out[k]);
    free(out);
    free(rgb);
    backend_cpu_free(&be);
    qwen3vl_free(t);
    return 0;
}
