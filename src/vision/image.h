/* image.h - from an OpenAI image_url to the float tensor a vision encoder eats.
 *
 * Three steps, each usable alone:
 *   1. image_parse_url: a `data:image/...;base64,` URL to raw bytes (strict base64). http(s)
 *      and file URLs are refused (TIDE_EUNSUPPORTED) until a config allow-list exists.
 *   2. image_decode: PNG, JPEG, BMP or GIF (first frame) bytes to RGB8 via stb_image, within
 *      byte and pixel limits checked BEFORE the pixels are allocated; JPEG EXIF orientation
 *      is applied so the image is upright.
 *   3. preprocessing: fit-and-scale to a token budget, antialiased bicubic resize, pad to a
 *      square with the mean colour, normalise with the model's mean/std into f32 CHW; for
 *      the Qwen-VL towers llama.cpp's bilinear fit (image_resize_fit_bilinear).
 * Every function returns 0 or a negative TIDE_E* code with one line in err. */
#ifndef TIDE_VISION_IMAGE_H
#define TIDE_VISION_IMAGE_H

#include "../common.h"

/* Interleaved RGB, 8 bits per channel. */
struct image_u8 {
    int w, h;
    uint8_t *rgb;  /* (h, w, 3) owned, malloc */
};

/* Planar float image, the encoder's input. */
struct image_f32 {
    int w, h;
    float *data;   /* (3, h, w) CHW, owned, malloc */
};

struct host_budget;
struct image_limits {
    size_t max_bytes;     /* encoded bytes (after base64); 0 = no limit */
    uint64_t max_pixels;  /* w * h of the decoded image; 0 = no limit */
    /* NULL: none. Else the decoder's working memory is charged to it while it runs, and
     * the returned pixels (w * h * 3 bytes) stay charged: the caller releases them. */
    struct host_budget *budget;
};

/* Strict RFC 4648 base64: alphabet A-Z a-z 0-9 + /, length a multiple of 4, '=' only as
 * the last one or two characters, no whitespace. *out is malloc'd (free it). */
int image_base64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len,
                        char *err, size_t errlen);

/* Parse an image_url. data: URLs must be `data:image/<subtype>[;params];base64,<data>`;
 * http://, https:// and file:// give TIDE_EUNSUPPORTED ("refused unless allow-listed"),
 * anything else TIDE_EINVAL. max_bytes (0 = none) bounds the decoded size before decoding.
 * *bytes is malloc'd. */
int image_parse_url(const char *url, size_t len, size_t max_bytes, uint8_t **bytes,
                    size_t *n, char *err, size_t errlen);

/* Decode an encoded image into RGB8, EXIF orientation applied. lim may be NULL.
 * Decompression bombs are refused (TIDE_EFORMAT): a PNG whose IDAT is far bigger than its
 * header's rows can need, before any inflating; and any image whose decoding would allocate
 * more than its width x height can need, when it gets there. TIDE_EFULL: lim->budget had no
 * room (retry later). */
int image_decode(const uint8_t *bytes, size_t n, const struct image_limits *lim,
                 struct image_u8 *out, char *err, size_t errlen);
/* Most bytes the decoder held at once during this thread's last image_decode (tests). */
size_t image_last_decode_peak(void);

/* EXIF orientation (1..8) of a JPEG, 1 when the file has none or is not a JPEG. Only the
 * APP1 "Exif" segment's IFD0 tag 0x0112 is read; every offset is bounds-checked. */
int image_exif_orientation(const uint8_t *bytes, size_t n);

/* Apply EXIF orientation o (1..8) in place: 2 mirror, 3 rotate 180, 4 flip, 5 transpose,
 * 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise. */
int image_apply_orientation(struct image_u8 *img, int o);

/* Fit-and-scale for encoders that take any multiple of the patch size: the largest
 * (out_w, out_h), multiples of patch, aspect ratio kept (within rounding), never larger
 * than the image rounded up to one patch, with (out_w/patch)*(out_h/patch) <= max_tokens.
 * Big images are always downscaled, never refused. Returns the token count. */
int image_fit_budget(int w, int h, int patch, int max_tokens, int *out_w, int *out_h);

/* Resize to (w, h): separable bicubic (Keys, a = -0.5, as PIL and so Hugging Face's CLIP
 * preprocessing), the kernel widened by the downscale factor so a big photo shrinks
 * without aliasing. */
int image_resize(const struct image_u8 *src, int w, int h, struct image_u8 *dst);

/* Resize for the Qwen-VL towers, computing the pixels llama.cpp's mtmd computes for them (its
 * dyn_size preprocessor: bilinear, PAD_CEIL): the scale that fits src inside w x h keeping the
 * aspect ratio (float: min(w / src_w, h / src_h), each side ceil(side * scale), capped at w and
 * h), bilinear with the corners aligned and no antialiasing, in float, truncated to 8 bits;
 * then centred on a w x h canvas of pad_rgb (offsets (w - new_w) / 2, floored), so where the
 * rounded aspect ratio differs the image gets bars a few pixels wide rather than a stretch.
 * An image already w x h is copied. */
int image_resize_fit_bilinear(const struct image_u8 *src, int w, int h, const uint8_t pad_rgb[3],
                              struct image_u8 *dst);

/* Fixed-resolution preprocessing (LLaVA-1.5 `mlp` projector, as llama.cpp does it): scale
 * to fit inside size x size keeping the aspect ratio (ceil rounding), centre it on a
 * size x size canvas filled with pad_rgb, then normalise ((v/255 - mean) / std) to CHW. */
int image_preprocess_square(const struct image_u8 *src, int size, const uint8_t pad_rgb[3],
                            const float mean[3], const float std[3], struct image_f32 *out);

/* (v/255 - mean[c]) / std[c] into a new CHW image of the same size. */
int image_normalize(const struct image_u8 *src, const float mean[3], const float std[3],
                    struct image_f32 *out);

void image_u8_free(struct image_u8 *img);
void image_f32_free(struct image_f32 *img);

#endif
