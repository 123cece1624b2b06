/* image.c - data URLs, base64, stb_image decoding, EXIF orientation, resize (bicubic; bilinear for
 * the Qwen-VL towers), normalise.
 * See image.h for the contract. */
#include "image.h"
#include "memory/host_budget.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* stb_image from Debian's libstb-dev, compiled here as static functions: no link flag is
 * needed and nothing clashes with libstb.so should anything else link it. Only the four
 * formats the API promises are compiled in (less parser surface for untrusted input). */
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_MAX_DIMENSIONS (1 << 16)

/* Every allocation stb makes goes through stb_mem_*: while image_decode runs they are capped
 * at what the header's width x height can need (stb's PNG reader inflates the whole IDAT
 * stream into a buffer it doubles without bound, so a 1x1 image with 2 MB of IDAT became
 * 2 GiB: issue 27 item 3), and charged to the caller's budget. Per thread: HTTP threads
 * decode at the same time. */
static _Thread_local struct {
    size_t live, peak, cap;         /* cap 0: none */
    struct host_budget *budget;     /* NULL: none */
    bool over_cap, over_budget;
} stb_mem;
#define STB_MEM_HDR 16              /* the size, before the block; keeps 16-byte alignment */

static bool stb_mem_take(size_t n)
{
    if (stb_mem.cap && (n > stb_mem.cap || stb_mem.live > stb_mem.cap - n)) { stb_mem.over_cap = true; return false; }
    if (stb_mem.budget && !host_budget_charge(stb_mem.budget, n)) { stb_mem.over_budget = true; return false; }
    stb_mem.live += n;
    if (stb_mem.live > stb_mem.peak) stb_mem.peak = stb_mem.live;
    return true;
}

static void stb_mem_give(size_t n)
{
    stb_mem.live -= n;
    if (stb_mem.budget) host_budget_release(stb_mem.budget, n);
}

/* stb's blocks start zeroed: on a corrupt JPEG stb 2.27 can read decoder state (Huffman
 * tables a stream never defined) and buffers before writing them, so whatever an earlier
 * request left in freed heap would reach this image's pixels, and its decode would depend on
 * that history (fuzz_image met a report that did not reproduce alone: see fuzz/ubsan.supp). */
static void *stb_mem_malloc(size_t n)
{
    if (n > SIZE_MAX - STB_MEM_HDR || !stb_mem_take(n)) return NULL;
    char *p = calloc(1, n + STB_MEM_HDR);
    if (!p) { stb_mem_give(n); return NULL; }
    memcpy(p, &n, sizeof n);
    return p + STB_MEM_HDR;
}

static void stb_mem_free(void *q)
{
    if (!q) return;
    char *p = (char *)q - STB_MEM_HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    stb_mem_give(n);
    free(p);
}

static void *stb_mem_realloc(void *q, size_t n)
{
    if (!q) return stb_mem_malloc(n);
    char *p = (char *)q - STB_MEM_HDR;
    size_t old;
    memcpy(&old, p, sizeof old);
    if (n > SIZE_MAX - STB_MEM_HDR || (n > old && !stb_mem_take(n - old))) return NULL;
    char *np = realloc(p, n + STB_MEM_HDR);
    if (!np) { if (n > old) stb_mem_give(n - old); return NULL; }
    if (n < old) stb_mem_give(old - n);
    else memset(np + STB_MEM_HDR + old, 0, n - old); /* the grown part zeroed too */
    memcpy(np, &n, sizeof n);
    return np + STB_MEM_HDR;
}
#define STBI_MALLOC(sz) stb_mem_malloc(sz)
#define STBI_REALLOC(p, sz) stb_mem_realloc(p, sz)
#define STBI_FREE(p) stb_mem_free(p)
/* Declared-but-unused stb functions are reported at the end of the file, so this one
 * stays off for the whole file. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop


/* ---- base64 ---- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int image_base64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len,
                        char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    if (len == 0) return tide_fail(TIDE_EFORMAT, err, errlen, "base64 data is empty");
    if (len % 4) return tide_fail(TIDE_EFORMAT, err, errlen,
                             "base64 length %zu is not a multiple of 4", len);
    size_t pad = 0;
    if (in[len - 1] == '=') pad++;
    if (in[len - 2] == '=') pad++;
    size_t n = len / 4 * 3 - pad;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return tide_fail(TIDE_ENOMEM, err, errlen, "out of memory decoding %zu bytes", n);
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        bool last = i + 4 == len;
        int v[4];
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)in[i + k];
            if (c == '=' && last && k >= 4 - (int)pad) { v[k] = 0; continue; }
            v[k] = b64_value(c);
            if (v[k] < 0) {
                free(buf);
                if (c == '=')
                    return tide_fail(TIDE_EFORMAT, err, errlen,
                                "base64 padding '=' at offset %zu is not at the end", i + k);
                return tide_fail(TIDE_EFORMAT, err, errlen,
                            "invalid base64 character 0x%02x at offset %zu", c, i + k);
            }
        }
        uint32_t q = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        /* Canonical encodings only: the bits the padding drops must be zero. */
        if (last && ((pad == 1 && (q & 0xff)) || (pad == 2 && (q & 0xffff)))) {
            free(buf);
            return tide_fail(TIDE_EFORMAT, err, errlen, "base64 padding leaves non-zero bits");
        }
        size_t take = last ? 3 - pad : 3;
        for (size_t k = 0; k < take; k++) buf[o++] = (uint8_t)(q >> (16 - 8 * k));
    }
    *out = buf;
    *out_len = o;
    return 0;
}

/* ---- URLs ---- */

int image_parse_url(const char *url, size_t len, size_t max_bytes, uint8_t **bytes,
                    size_t *n, char *err, size_t errlen)
{
    *bytes = NULL;
    *n = 0;
    static const char *refused[] = {"http://", "https://", "file://"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        size_t l = strlen(refused[i]);
        if (len >= l && !strncasecmp(url, refused[i], l))
            return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                        "%.*s image URLs are refused (only data: URLs are accepted unless "
                        "an allow-list enables them)", (int)(l - 3), refused[i]);
    }
    if (len < 5 || strncasecmp(url, "data:", 5))
        return tide_fail(TIDE_EINVAL, err, errlen,
                    "image_url must be a data: URL (data:image/png;base64,...)");
    const char *comma = memchr(url, ',', len);
    if (!comma) return tide_fail(TIDE_EINVAL, err, errlen, "data: URL has no ',' before the data");
    const char *meta = url + 5;
    size_t mlen = (size_t)(comma - meta);
    const char *semi = memchr(meta, ';', mlen);
    size_t tlen = semi ? (size_t)(semi - meta) : mlen;   /* the media type proper */
    if (tlen <= 6 || strncasecmp(meta, "image/", 6))
        return tide_fail(TIDE_EINVAL, err, errlen,
                    "data: URL media type must be image/<type>, got '%.*s'", (int)tlen, meta);
    if (mlen < 7 + 7 || strncasecmp(comma - 7, ";base64", 7))
        return tide_fail(TIDE_EINVAL, err, errlen, "data: URL must be base64-encoded (;base64,)");
    const char *data = comma + 1;
    size_t dlen = len - (size_t)(data - url);
    if (max_bytes && dlen / 4 * 3 > max_bytes + 2)
        return tide_fail(TIDE_ERANGE, err, errlen,
                    "image is about %zu bytes, over the %zu byte limit", dlen / 4 * 3, max_bytes);
    char e2[160];
    int rc = image_base64_decode(data, dlen, bytes, n, e2, sizeof e2);
    if (rc) return tide_fail(rc, err, errlen, "data: URL: %s", e2);
    if (max_bytes && *n > max_bytes) {
        free(*bytes);
        *bytes = NULL;
        return tide_fail(TIDE_ERANGE, err, errlen, "image is %zu bytes, over the %zu byte limit",
                    *n, max_bytes);
    }
    return 0;
}

/* ---- EXIF ---- */

static uint32_t rd16(const uint8_t *p, bool le) { return le ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
static uint32_t rd32(const uint8_t *p, bool le)
{
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Orientation from a TIFF block (the body of an Exif APP1 after "Exif\0\0"). */
static int tiff_orientation(const uint8_t *t, size_t n)
{
    if (n < 8) return 1;
    bool le;
    if (t[0] == 'I' && t[1] == 'I') le = true;
    else if (t[0] == 'M' && t[1] == 'M') le = false;
    else return 1;
    if (rd16(t + 2, le) != 42) return 1;
    uint32_t ifd = rd32(t + 4, le);
    if (ifd > n - 2) return 1;
    uint32_t count = rd16(t + ifd, le);
    for (uint32_t i = 0; i < count; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        if (e + 12 > n) return 1;
        if (rd16(t + e, le) != 0x0112) continue;
        uint32_t type = rd16(t + e + 2, le), cnt = rd32(t + e + 4, le);
        if (type != 3 || cnt != 1) return 1;   /* SHORT, one value, stored inline */
        uint32_t v = rd16(t + e + 8, le);
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

int image_exif_orientation(const uint8_t *b, size_t n)
{
    if (n < 4 || b[0] != 0xFF || b[1] != 0xD8) return 1;
    size_t p = 2;
    /* Walk the marker segments up to the start of scan; Exif sits in one of them. */
    while (p + 4 <= n) {
        if (b[p] != 0xFF) return 1;
        uint8_t m = b[p + 1];
        if (m == 0xFF) { p++; continue; }             /* fill byte */
        if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) { p += 2; continue; }
        if (m == 0xDA || m == 0xD9) return 1;         /* scan data / end: no Exif */
        size_t seg = rd16(b + p + 2, false);
        if (seg < 2 || p + 2 + seg > n) return 1;
        const uint8_t *body = b + p + 4;
        size_t blen = seg - 2;
        if (m == 0xE1 && blen >= 6 && !memcmp(body, "Exif\0\0", 6))
            return tiff_orientation(body + 6, blen - 6);
        p += 2 + seg;
    }
    return 1;
}

int image_apply_orientation(struct image_u8 *img, int o)
{
    if (o < 1 || o > 8) return TIDE_EINVAL;
    if (o == 1) return 0;
    int W = img->w, H = img->h;
    bool swap = o >= 5;
    int ow = swap ? H : W, oh = swap ? W : H;
    uint8_t *dst = malloc((size_t)ow * oh * 3);
    if (!dst) return TIDE_ENOMEM;
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            int sx, sy; /* source pixel shown at (x, y) once upright */
            switch (o) {
            case 2: sx = W - 1 - x; sy = y; break;
            case 3: sx = W - 1 - x; sy = H - 1 - y; break;
            case 4: sx = x; sy = H - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = H - 1 - x; break;
            case 7: sx = W - 1 - y; sy = H - 1 - x; break;
            default: sx = W - 1 - y; sy = x; break;   /* 8 */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, img->rgb + ((size_t)sy * W + sx) * 3, 3);
        }
    free(img->rgb);
    img->rgb = dst;
    img->w = ow;
    img->h = oh;
    return 0;
}

/* ---- decode ---- */

static const char *sniff(const uint8_t *b, size_t n)
{
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return "PNG";
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "JPEG";
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
    if (n >= 6 && (!memcmp(b, "GIF87a", 6) || !memcmp(b, "GIF89a", 6))) return "GIF";
    return NULL;
}

/* A PNG's IDAT chunks hold the zlib stream of its rows: for the size in its header, every
 * encoder writes at most about the raw size (stored blocks, or fixed Huffman codes at 9 bits
 * a byte). Far more than that is a decompression bomb: refuse it before inflating a byte.
 * Returns false with *idat (bytes found) and *raw (the rows' size) set. */
static bool png_idat_plausible(const uint8_t *b, size_t n, size_t *idat, uint64_t *raw)
{
    *idat = 0;
    *raw = 0;
    if (n < 33 || memcmp(b + 12, "IHDR", 4)) return true;   /* stb says what is wrong */
    uint64_t w = (uint64_t)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19];
    uint64_t h = (uint64_t)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
    unsigned depth = b[24], type = b[25];
    unsigned ch = type == 2 ? 3 : type == 4 ? 2 : type == 6 ? 4 : 1;
    if (w > (1u << 16) || h > (1u << 16)) return true;     /* stb refuses those itself */
    /* rows of filter byte + pixels; Adam7 interlacing adds at most a row per pass */
    *raw = (h + 7) * (1 + (w * ch * depth + 7) / 8 + 7);
    for (size_t i = 8; i + 12 <= n;) {
        size_t len = (size_t)b[i] << 24 | (size_t)b[i + 1] << 16 | (size_t)b[i + 2] << 8 | b[i + 3];
        if (!memcmp(b + i + 4, "IDAT", 4)) *idat += len;
        if (len > n - i - 12) break;
        i += 12 + len;
    }
    return *idat <= 2 * *raw + 65536;
}

/* Debian's stb_image 2.27 trusts a DHT segment's 16 symbol counts: a table of more than 256
 * symbols runs past its size[257] and values[256] arrays (found by fuzz/fuzz_image.c under
 * UBSan; stb 2.28 added the check). stb reads DHT segments from stbi_info on, so before it
 * sees a JPEG, walk every marker segment (skipping entropy-coded data, where 0xFF is
 * followed by 0x00 or a restart marker) and refuse any table whose counts add up past 256. */
static bool jpeg_tables_ok(const uint8_t *b, size_t n)
{
    size_t i = 2;
    while (i + 4 <= n) {
        if (b[i] != 0xFF) { i++; continue; }
        uint8_t m = b[i + 1];
        if (m == 0xFF) { i++; continue; }
        if (m == 0x00 || m == 0x01 || (m >= 0xD0 && m <= 0xD8)) { i += 2; continue; }
        if (m == 0xD9) return true;
        size_t len = (size_t)b[i + 2] << 8 | b[i + 3];
        if (m == 0xC4) {
            size_t p = i + 4, end = i + 2 + len > n ? n : i + 2 + len;
            while (p < end) {
                unsigned total = 0;
                for (size_t k = 1; k <= 16 && p + k < n; k++) total += b[p + k];
                if (total > 256) return false;
                p += 17 + total;
            }
        }
        i += 2 + len;
    }
    return true;
}

int image_decode(const uint8_t *bytes, size_t n, const struct image_limits *lim,
                 struct image_u8 *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (lim && lim->max_bytes && n > lim->max_bytes)
        return tide_fail(TIDE_ERANGE, err, errlen, "image is %zu bytes, over the %zu byte limit", n,
                    lim->max_bytes);
    const char *fmt = sniff(bytes, n);
    if (!fmt)
        return tide_fail(TIDE_EUNSUPPORTED, err, errlen,
                    "not a PNG, JPEG, BMP or GIF image (%zu bytes)", n);
    if (n > INT32_MAX) return tide_fail(TIDE_ERANGE, err, errlen, "image is too large");
    if (fmt[0] == 'J' && !jpeg_tables_ok(bytes, n))
        return tide_fail(TIDE_EFORMAT, err, errlen, "cannot decode JPEG image: a Huffman table has more than 256 symbols");
    int w, h, comp;
    size_t idat;
    uint64_t raw;
    if (fmt[0] == 'P' && !png_idat_plausible(bytes, n, &idat, &raw))
        return tide_fail(TIDE_EFORMAT, err, errlen, "PNG image data is %zu bytes compressed, more than the %llu bytes "
                    "of rows its header declares can need (a decompression bomb?)", idat, (unsigned long long)raw);
    struct host_budget *budget = lim ? lim->budget : NULL;
    memset(&stb_mem, 0, sizeof stb_mem);
    stb_mem.budget = budget;
    /* Header only first: refuse a decompression bomb before allocating its pixels. */
    if (!stbi_info_from_memory(bytes, (int)n, &w, &h, &comp))
        return tide_fail(stb_mem.over_budget ? TIDE_EFULL : TIDE_EFORMAT, err, errlen, "cannot decode %s image: %s", fmt,
                    stb_mem.over_budget ? "no request memory left for it now, retry later" : stbi_failure_reason());
    if (w <= 0 || h <= 0)   /* stb takes a BMP with height 0 */
        return tide_fail(TIDE_EFORMAT, err, errlen, "cannot decode %s image: it is %dx%d", fmt, w, h);
    if (lim && lim->max_pixels && (uint64_t)w * (uint64_t)h > lim->max_pixels)
        return tide_fail(TIDE_ERANGE, err, errlen, "image is %dx%d = %llu pixels, over the %llu limit",
                    w, h, (unsigned long long)w * h, (unsigned long long)lim->max_pixels);
    /* What decoding a w x h image can take, the worst format (16-bit RGBA PNG: inflated rows,
     * the image, its 8-bit and RGB conversions; JPEG's planes and coefficients; GIF's three
     * frames) with room to spare: the inflated bytes can never run far past the header. */
    stb_mem.cap = n + (size_t)w * h * 32 + ((size_t)w + h) * 64 + ((size_t)1 << 20);
    uint8_t *px = stbi_load_from_memory(bytes, (int)n, &w, &h, &comp, 3);
    size_t peak = stb_mem.peak;
    if (!px) {
        bool over_cap = stb_mem.over_cap, over_budget = stb_mem.over_budget;
        memset(&stb_mem, 0, sizeof stb_mem);
        stb_mem.peak = peak;
        if (over_cap)
            return tide_fail(TIDE_EFORMAT, err, errlen, "cannot decode %s image: its data inflates past what a %dx%d "
                        "image can need (a decompression bomb?)", fmt, w, h);
        if (over_budget)
            return tide_fail(TIDE_EFULL, err, errlen, "no request memory left to decode a %dx%d image now, retry later", w, h);
        return tide_fail(TIDE_EFORMAT, err, errlen, "cannot decode %s image: %s", fmt, stbi_failure_reason());
    }
    /* Copy into malloc memory so callers free with free()/image_u8_free like the rest; with a
     * budget the copy is charged before it is made, and stays charged (image.h). */
    size_t bytes_rgb = (size_t)w * h * 3;
    if (budget && !host_budget_charge(budget, bytes_rgb)) {
        stbi_image_free(px);
        memset(&stb_mem, 0, sizeof stb_mem);
        stb_mem.peak = peak;
        return tide_fail(TIDE_EFULL, err, errlen, "no request memory left to decode a %dx%d image now, retry later", w, h);
    }
    out->rgb = malloc(bytes_rgb);
    if (!out->rgb) {
        if (budget) host_budget_release(budget, bytes_rgb);
        stbi_image_free(px);
        memset(&stb_mem, 0, sizeof stb_mem);
        return tide_fail(TIDE_ENOMEM, err, errlen, "out of memory for a %dx%d image", w, h);
    }
    memcpy(out->rgb, px, bytes_rgb);
    stbi_image_free(px);
    memset(&stb_mem, 0, sizeof stb_mem);
    stb_mem.peak = peak;
    out->w = w;
    out->h = h;
    if (fmt[0] == 'J') {
        int rc = image_apply_orientation(out, image_exif_orientation(bytes, n));
        if (rc) {
            image_u8_free(out);
            return tide_fail(rc, err, errlen, "cannot apply EXIF orientation: %s", tide_strerror(rc));
        }
    }
    return 0;
}

size_t image_last_decode_peak(void) { return stb_mem.peak; }

/* ---- fit-and-scale, resize, normalise ---- */

int image_fit_budget(int w, int h, int patch, int max_tokens, int *out_w, int *out_h)
{
    if (w <= 0 || h <= 0 || patch <= 0 || max_tokens <= 0) return TIDE_EINVAL;
    /* Start from the image rounded up to whole patches; never enlarge past that. */
    int gx = (w + patch - 1) / patch, gy = (h + patch - 1) / patch;
    if ((int64_t)gx * gy > max_tokens) {
        /* Every grid whose other side is the floor or ceiling of the exact aspect ratio
         * (so the shape is off by less than one patch), walked along both sides: keep the
         * one with the most tokens within the budget, the smaller aspect error on a tie. */
        double r = (double)gy / gx;
        int bx = 1, by = 1;
        int64_t best = 0;
        double best_e = 1e30;
        for (int side = 0; side < 2; side++) {
            int lim = side ? gy : gx;
            for (int a = 1; a <= lim; a++) {
                double other = side ? a / r : a * r;
                for (int k = 0; k < 2; k++) {
                    int b = k ? (int)ceil(other) : (int)floor(other);
                    int cx = side ? b : a, cy = side ? a : b;
                    if (cx < 1 || cy < 1 || cx > gx || cy > gy) continue;
                    int64_t t = (int64_t)cx * cy;
                    if (t > max_tokens) continue;
                    double e = fabs(log(((double)cy / cx) / r));
                    if (t > best || (t == best && e < best_e)) {
                        best = t; best_e = e; bx = cx; by = cy;
                    }
                }
            }
        }
        gx = bx;
        gy = by;
    }
    *out_w = gx * patch;
    *out_h = gy * patch;
    return gx * gy;
}

struct contrib { int start, n; float *w; };

/* Keys' cubic kernel with a = -0.5 (what PIL's BICUBIC and so Hugging Face's CLIP
 * preprocessing use), radius 2. */
static double cubic(double t)
{
    const double a = -0.5;
    t = fabs(t);
    if (t < 1.0) return ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
    if (t < 2.0) return (((t - 5.0) * t + 8.0) * t - 4.0) * a;
    return 0.0;
}

/* For each of dst_n output samples, the source samples it averages and their weights.
 * When shrinking, the kernel is stretched by the scale factor (antialiasing). */
static struct contrib *make_contribs(int src_n, int dst_n, float **pool)
{
    double scale = (double)src_n / dst_n;
    double fscale = scale > 1.0 ? scale : 1.0;
    double support = 2.0 * fscale;
    int maxn = (int)ceil(support) * 2 + 1;
    struct contrib *c = malloc(sizeof *c * (size_t)dst_n);
    *pool = malloc(sizeof(float) * (size_t)dst_n * maxn);
    if (!c || !*pool) { free(c); free(*pool); *pool = NULL; return NULL; }
    for (int i = 0; i < dst_n; i++) {
        double center = (i + 0.5) * scale - 0.5;
        int lo = (int)floor(center - support) + 1, hi = (int)ceil(center + support) - 1;
        if (lo < 0) lo = 0;
        if (hi > src_n - 1) hi = src_n - 1;
        if (hi - lo + 1 > maxn) hi = lo + maxn - 1;
        c[i].start = lo;
        c[i].w = *pool + (size_t)i * maxn;
        double sum = 0;
        int n = 0;
        for (int j = lo; j <= hi; j++) {
            double wt = cubic((j - center) / fscale);
            c[i].w[n++] = (float)wt;
            sum += wt;
        }
        if (fabs(sum) < 1e-12) { /* degenerate: nearest sample */
            int j = (int)lround(center);
            c[i].start = j < 0 ? 0 : j >= src_n ? src_n - 1 : j;
            c[i].w[0] = 1.0f;
            n = 1;
            sum = 1;
        }
        for (int k = 0; k < n; k++) c[i].w[k] = (float)(c[i].w[k] / sum);
        c[i].n = n;
    }
    return c;
}

int image_resize(const struct image_u8 *src, int w, int h, struct image_u8 *dst)
{
    memset(dst, 0, sizeof *dst);
    if (w <= 0 || h <= 0 || src->w <= 0 || src->h <= 0) return TIDE_EINVAL;
    float *px = NULL, *py = NULL;
    struct contrib *cx = make_contribs(src->w, w, &px), *cy = make_contribs(src->h, h, &py);
    float *tmp = malloc(sizeof(float) * (size_t)src->h * w * 3); /* (src h, w, 3) */
    dst->rgb = malloc((size_t)w * h * 3);
    int rc = 0;
    if (!cx || !cy || !tmp || !dst->rgb) { rc = TIDE_ENOMEM; goto out; }
    for (int y = 0; y < src->h; y++) {
        const uint8_t *row = src->rgb + (size_t)y * src->w * 3;
        for (int x = 0; x < w; x++) {
            float a[3] = {0, 0, 0};
            for (int k = 0; k < cx[x].n; k++) {
                const uint8_t *p = row + (size_t)(cx[x].start + k) * 3;
                for (int c = 0; c < 3; c++) a[c] += cx[x].w[k] * p[c];
            }
            memcpy(tmp + ((size_t)y * w + x) * 3, a, sizeof a);
        }
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float a[3] = {0, 0, 0};
            for (int k = 0; k < cy[y].n; k++) {
                const float *p = tmp + ((size_t)(cy[y].start + k) * w + x) * 3;
                for (int c = 0; c < 3; c++) a[c] += cy[y].w[k] * p[c];
            }
            for (int c = 0; c < 3; c++) {
                float v = roundf(a[c]);
                dst->rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    dst->w = w;
    dst->h = h;
out:
    free(cx); free(cy); free(px); free(py); free(tmp);
    if (rc) { free(dst->rgb); dst->rgb = NULL; }
    return rc;
}

/* Output index i's two source taps (clamped to n) and the second's weight, at ratio r. */
static void aligned_taps(int i, float r, int n, int *i0, int *i1, float *f)
{
    float p = (float)i * r;
    *i0 = (int)p;
    if (*i0 > n - 1) *i0 = n - 1;
    *i1 = *i0 + 1 > n - 1 ? n - 1 : *i0 + 1;
    *f = p - (float)*i0;
}

/* Bilinear with the corners aligned (output x samples source x * (src_w - 1) / (w - 1)), no
 * antialiasing, every step in float and the result truncated to 8 bits: the arithmetic of
 * llama.cpp's mtmd for the Qwen-VL towers, so that the same image gives the same pixels (and
 * so the same embeddings). Float on purpose, not double: a truncation boundary lands where
 * theirs does. Writes w * h * 3 bytes. */
static void resize_bilinear_aligned(const struct image_u8 *src, int w, int h, uint8_t *out)
{
    float rx = w > 1 ? (float)(src->w - 1) / (float)(w - 1) : 0.0f;
    float ry = h > 1 ? (float)(src->h - 1) / (float)(h - 1) : 0.0f;
    for (int y = 0; y < h; y++) {
        int y0, y1, x0, x1;
        float fy, fx;
        aligned_taps(y, ry, src->h, &y0, &y1, &fy);
        for (int x = 0; x < w; x++) {
            aligned_taps(x, rx, src->w, &x0, &x1, &fx);
            const uint8_t *p00 = src->rgb + ((size_t)y0 * src->w + x0) * 3, *p10 = src->rgb + ((size_t)y0 * src->w + x1) * 3;
            const uint8_t *p01 = src->rgb + ((size_t)y1 * src->w + x0) * 3, *p11 = src->rgb + ((size_t)y1 * src->w + x1) * 3;
            for (int c = 0; c < 3; c++) {
                float top = (float)p00[c] + ((float)p10[c] - (float)p00[c]) * fx;
                float bottom = (float)p01[c] + ((float)p11[c] - (float)p01[c]) * fx;
                float v = top + (bottom - top) * fy;
                out[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
            }
        }
    }
}

int image_resize_fit_bilinear(const struct image_u8 *src, int w, int h, const uint8_t pad_rgb[3],
                              struct image_u8 *dst)
{
    memset(dst, 0, sizeof *dst);
    if (w <= 0 || h <= 0 || src->w <= 0 || src->h <= 0) return TIDE_EINVAL;
    dst->rgb = malloc((size_t)w * h * 3);
    if (!dst->rgb) return TIDE_ENOMEM;
    dst->w = w;
    dst->h = h;
    if (src->w == w && src->h == h) {
        memcpy(dst->rgb, src->rgb, (size_t)w * h * 3);
        return 0;
    }
    /* the scale that fits both sides, in float, sides ceiled and capped at the target */
    float scale = fminf((float)w / (float)src->w, (float)h / (float)src->h);
    int nw = (int)ceilf((float)src->w * scale), nh = (int)ceilf((float)src->h * scale);
    nw = nw < 1 ? 1 : nw > w ? w : nw;
    nh = nh < 1 ? 1 : nh > h ? h : nh;
    uint8_t *fit = dst->rgb;
    if (nw != w || nh != h) {
        fit = malloc((size_t)nw * nh * 3);
        if (!fit) {
            image_u8_free(dst);
            return TIDE_ENOMEM;
        }
    }
    resize_bilinear_aligned(src, nw, nh, fit);
    if (fit != dst->rgb) {
        for (size_t i = 0; i < (size_t)w * h; i++) memcpy(dst->rgb + i * 3, pad_rgb, 3);
        int ox = (w - nw) / 2, oy = (h - nh) / 2;
        for (int y = 0; y < nh; y++)
            memcpy(dst->rgb + ((size_t)(y + oy) * w + ox) * 3, fit + (size_t)y * nw * 3, (size_t)nw * 3);
        free(fit);
    }
    return 0;
}

int image_normalize(const struct image_u8 *src, const float mean[3], const float std[3],
                    struct image_f32 *out)
{
    memset(out, 0, sizeof *out);
    size_t np = (size_t)src->w * src->h;
    out->data = malloc(sizeof(float) * np * 3);
    if (!out->data) return TIDE_ENOMEM;
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < np; i++)
            out->data[c * np + i] = (src->rgb[i * 3 + c] / 255.0f - mean[c]) / std[c];
    out->w = src->w;
    out->h = src->h;
    return 0;
}

int image_preprocess_square(const struct image_u8 *src, int size, const uint8_t pad_rgb[3],
                            const float mean[3], const float std[3], struct image_f32 *out)
{
    memset(out, 0, sizeof *out);
    if (size <= 0 || src->w <= 0 || src->h <= 0) return TIDE_EINVAL;
    if (src->w == size && src->h == size) return image_normalize(src, mean, std, out);
    float scale = fminf((float)size / src->w, (float)size / src->h);
    int nw = (int)ceilf(src->w * scale), nh = (int)ceilf(src->h * scale);
    nw = nw < 1 ? 1 : nw > size ? size : nw;
    nh = nh < 1 ? 1 : nh > size ? size : nh;
    struct image_u8 fit, canvas = {.w = size, .h = size};
    int rc = image_resize(src, nw, nh, &fit);
    if (rc) return rc;
    canvas.rgb = malloc((size_t)size * size * 3);
    if (!canvas.rgb) { image_u8_free(&fit); return TIDE_ENOMEM; }
    for (size_t i = 0; i < (size_t)size * size; i++) memcpy(canvas.rgb + i * 3, pad_rgb, 3);
    int ox = (size - nw) / 2, oy = (size - nh) / 2;
    for (int y = 0; y < nh; y++)
        memcpy(canvas.rgb + ((size_t)(y + oy) * size + ox) * 3, fit.rgb + (size_t)y * nw * 3,
               (size_t)nw * 3);
    image_u8_free(&fit);
    rc = image_normalize(&canvas, mean, std, out);
    image_u8_free(&canvas);
    return rc;
}

void image_u8_free(struct image_u8 *img)
{
    free(img->rgb);
    img->rgb = NULL;
    img->w = img->h = 0;
}

void image_f32_free(struct image_f32 *img)
{
    free(img->data);
    img->data = NULL;
    img->w = img->h = 0;
}
