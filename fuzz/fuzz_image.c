/* fuzz_image.c - libFuzzer target for image decode and preprocessing (src/vision/image.h):
 * any bytes must either decode within the daemon's limits (20 MiB, 50 Mpixel, as main.c sets
 * them) or give one error line; a decoded image then goes through the same preprocessing the
 * encoders use (fit to a token budget, resize, square pad + normalise), never a crash or leak. */
#include "vision/image.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A smaller pixel limit than the daemon's keeps each run fast; the checks are the same. */
    struct image_limits lim = {(size_t)20 << 20, 4000000, NULL};
    struct image_u8 img;
    char err[256];
    err[0] = 0;
    int rc = image_decode(data, size, &lim, &img, err, sizeof err);
    if (rc) {
        if (!err[0]) abort();   /* errors must say why */
        return 0;
    }
    if (img.w <= 0 || img.h <= 0 || !img.rgb) abort();
    int ow, oh;
    int tokens = image_fit_budget(img.w, img.h, 14, 64, &ow, &oh);
    if (tokens > 0) {
        if (tokens > 64 || ow % 14 || oh % 14) abort();
        struct image_u8 small;
        if (image_resize(&img, ow, oh, &small) == 0) {
            static const float mean[3] = {0.48f, 0.46f, 0.41f}, sd[3] = {0.27f, 0.26f, 0.28f};
            struct image_f32 f;
            if (image_normalize(&small, mean, sd, &f) == 0) image_f32_free(&f);
            image_u8_free(&small);
        }
    }
    static const uint8_t pad[3] = {122, 116, 104};
    static const float mean[3] = {0.5f, 0.5f, 0.5f}, sd[3] = {0.5f, 0.5f, 0.5f};
    struct image_f32 sq;
    if (image_preprocess_square(&img, 28, pad, mean, sd, &sq) == 0) {
        if (sq.w != 28 || sq.h != 28) abort();
        image_f32_free(&sq);
    }
    image_u8_free(&img);
    return 0;
}
