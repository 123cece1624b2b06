/* dynres.c - the Qwen-VL towers' resize rules (see dynres.h). */
#include "dynres.h"

#include "../common.h"
#include "image.h"

#include <math.h>

/* In float, as llama.cpp computes them: in double a small image's sides can land on the other
 * side of a multiple (20x90 at align 16 becomes 32x96 in double, 32x112 in float: 12 tokens
 * against llama.cpp's 14), and the token count is what the embeddings are compared on. */
static long round_to(float x, long f) { return (long)roundf(x / (float)f) * f; }
static long floor_to(float x, long f) { return (long)floorf(x / (float)f) * f; }
static long ceil_to(float x, long f) { return (long)ceilf(x / (float)f) * f; }

int dynres_size(const struct dynres_rules *r, int w, int h, int *out_w, int *out_h)
{
    if (w <= 0 || h <= 0 || r->patch <= 0 || r->merge <= 0 || r->min_pixels < 0 || r->max_pixels < 0 ||
        r->max_tokens < 0)
        return TIDE_EINVAL;
    long a = (long)r->patch * r->merge;
    long max_px = r->max_pixels;
    if (r->max_tokens > 0 && (max_px == 0 || (long)r->max_tokens * a * a < max_px))
        max_px = (long)r->max_tokens * a * a;
    long min_px = r->min_pixels;
    if (max_px > 0 && min_px > max_px)
        min_px = max_px; /* a budget below the model's minimum wins */
    long wb = round_to((float)w, a), hb = round_to((float)h, a);
    if (wb < a) wb = a;
    if (hb < a) hb = a;
    if (max_px > 0 && wb * hb > max_px) {
        float beta = sqrtf((float)h * (float)w / (float)max_px);
        hb = floor_to((float)h / beta, a);
        wb = floor_to((float)w / beta, a);
        if (hb < a) hb = a;
        if (wb < a) wb = a;
    } else if (min_px > 0 && wb * hb < min_px) {
        float beta = sqrtf((float)min_px / ((float)h * (float)w));
        hb = ceil_to((float)h * beta, a);
        wb = ceil_to((float)w * beta, a);
    }
    /* never over the budget: the longer side gives way (one align a side is one token) */
    while (max_px > 0 && wb * hb > max_px && (wb > a || hb > a)) {
        if (wb >= hb)
            wb -= a;
        else
            hb -= a;
    }
    if (wb > 1 << 30 || hb > 1 << 30)
        return TIDE_EINVAL;
    *out_w = (int)wb;
    *out_h = (int)hb;
    return (int)((wb / a) * (hb / a));
}

int dynres_resize(const struct dynres_rules *r, const struct image_u8 *img, struct image_u8 *sized,
                  int *out_w, int *out_h)
{
    static const uint8_t black[3] = {0, 0, 0}; /* llama.cpp's pad colour for these towers */
    sized->w = sized->h = 0;
    sized->rgb = NULL;
    int n = dynres_size(r, img->w, img->h, out_w, out_h);
    if (n <= 0 || (*out_w == img->w && *out_h == img->h))
        return n;
    int rc = image_resize_fit_bilinear(img, *out_w, *out_h, black, sized);
    return rc < 0 ? rc : n;
}
