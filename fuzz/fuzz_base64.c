/* fuzz_base64.c - libFuzzer target for the image_url parser and its strict base64 decoder
 * (src/vision/image.h): any string must give bytes or one error line; whatever decodes must
 * re-encode to exactly the input (strict RFC 4648 admits one spelling per byte string). */
#include "vision/image.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static size_t encode(const uint8_t *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = B64[v >> 18 & 63];
        out[o++] = B64[v >> 12 & 63];
        out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    uint8_t *out = NULL;
    size_t n = 0;
    err[0] = 0;
    int rc = image_base64_decode((const char *)data, size, &out, &n, err, sizeof err);
    if (rc) {
        if (!err[0]) abort();
    } else {
        char *re = malloc(n / 3 * 4 + 8);
        if (!re) abort();
        size_t rl = encode(out, n, re);
        if (rl != size || memcmp(re, data, size)) abort();
        free(re);
        free(out);
    }
    /* The same bytes as an image_url: the scheme checks and the media-type parse. */
    out = NULL;
    err[0] = 0;
    rc = image_parse_url((const char *)data, size, 1 << 20, &out, &n, err, sizeof err);
    if (rc) {
        if (!err[0]) abort();
    } else {
        if (n > (1 << 20)) abort();
        free(out);
    }
    return 0;
}
