/* dynres.h - dynamic resolution for the Qwen-VL towers: the size an image is resized to
 * before the patch embedding, and the resize itself.
 *
 * The rules (llama.cpp's calc_size_preserved_ratio, itself Hugging Face's smart_resize):
 * align = patch * merge (32 for Qwen3-VL: 16-pixel patches merged 2x2), every side a multiple
 * of it, the aspect ratio kept as well as whole multiples allow:
 *   1. each side rounded to the nearest multiple (half away from zero), at least one align;
 *   2. over max_pixels: scale both sides by 1 / sqrt(w h / max_pixels), each side floored to
 *      a multiple (at least one align);
 *   3. else under min_pixels: scale by sqrt(min_pixels / (w h)), sides ceiled to a multiple.
 * tide's token budget (vision.max_image_tokens) lowers max_pixels to budget * align^2, and a
 * last rule makes it hold where the others cannot (a very long, thin image whose short side
 * is already one align): the longer side loses an align at a time until the image fits. So an
 * image is never refused: it is scaled into the budget. Arithmetic in float, as llama.cpp's
 * (Hugging Face's is double: a small image's token count can differ between the two). */
#ifndef TIDE_DYNRES_H
#define TIDE_DYNRES_H

struct dynres_rules {
    int patch;          /* the ViT's patch side in pixels */
    int merge;          /* the merger's side (2: 2x2 patches a token) */
    long min_pixels;    /* 0: no lower bound */
    long max_pixels;    /* 0: none but the budget */
    int max_tokens;     /* the budget in merged tokens (0: none) */
};

/* The resized size of a w x h image into *out_w x *out_h; returns the image's merged tokens
 * ((out_w / align) * (out_h / align)), or TIDE_EINVAL for a size or rule that is not positive. */
int dynres_size(const struct dynres_rules *r, int w, int h, int *out_w, int *out_h);

struct image_u8;
/* The image a Qwen-VL tower eats: dynres_size's size, and *sized the image resized to it the way
 * llama.cpp's mtmd does for these towers (image_resize_fit_bilinear: bilinear, aspect kept,
 * black bars where the rounded sides differ from it), or left empty (sized->rgb NULL) when the
 * image already has that size. Returns the merged tokens, or a negative TIDE_E* code. */
int dynres_resize(const struct dynres_rules *r, const struct image_u8 *img, struct image_u8 *sized,
                  int *out_w, int *out_h);

#endif
