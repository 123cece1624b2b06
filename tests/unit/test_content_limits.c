/* test_content_limits.c - issue 27's content and memory items, below the HTTP layer: a
 * stream's output channel drops what its reader took, the image-embedding cache and the
 * content hash tell apart inputs an FNV-1a key confused, JSON strings keep NUL bytes, the
 * parse-tree and request-memory budgets refuse before allocating, and a PNG whose
 * compressed data is far more than its header's pixels need is refused undecoded. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/fifo.h"

/* A long stream read as it is written: the buffer holds only what is unread. Before issue 27
 * it held all 16 MiB until the job ended. */
Test(stream_buffer, drops_what_the_reader_took)
{
    struct job *j = job_new(NULL, NULL, NULL);
    cr_assert_not_null(j);
    char chunk[3000], got[4096];
    size_t written = 0, read_total = 0;
    unsigned sum_w = 0, sum_r = 0;
    for (int i = 0; written < ((size_t)16 << 20); i++) {
        for (size_t k = 0; k < sizeof chunk; k++) chunk[k] = (char)(i * 31 + k);
        for (size_t k = 0; k < sizeof chunk; k++) sum_w = sum_w * 131 + (unsigned char)chunk[k];
        cr_assert_eq(job_write(j, chunk, sizeof chunk), 0);
        written += sizeof chunk;
        /* the reader takes a bit less than was written, so something is always left over */
        long n = job_read(j, got, i % 3 ? sizeof got : 1000, 0);
        cr_assert_gt(n, 0);
        for (long k = 0; k < n; k++) sum_r = sum_r * 131 + (unsigned char)got[k];
        read_total += (size_t)n;
    }
    job_finish(j, 200);
    long n;
    while ((n = job_read(j, got, sizeof got, 0)) > 0) {
        for (long k = 0; k < n; k++) sum_r = sum_r * 131 + (unsigned char)got[k];
        read_total += (size_t)n;
    }
    cr_assert_eq(n, -1);
    cr_assert_eq(read_total, written, "every byte comes out");
    cr_assert_eq(sum_r, sum_w, "in order");
    /* high-water: bounded by the reader's backlog (a few KiB), not by the stream's 16 MiB */
    cr_assert_lt(j->held_peak, (size_t)64 << 10, "held %zu bytes", j->held_peak);
    cr_assert_leq(j->cap, (size_t)64 << 10, "buffer grew to %zu bytes", j->cap);
    job_unref(j);
}

/* The reader keeps up: the buffer never holds more than a few writes. */
Test(stream_buffer, stays_small_when_the_reader_keeps_up)
{
    struct job *j = job_new(NULL, NULL, NULL);
    char chunk[1500], got[4096];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < 20000; i++) {
        cr_assert_eq(job_write(j, chunk, sizeof chunk), 0);
        cr_assert_eq(job_read(j, got, sizeof got, 0), (long)sizeof chunk);
    }
    cr_assert_leq(j->held_peak, sizeof chunk, "held %zu bytes", j->held_peak);
    cr_assert_leq(j->cap, (size_t)4096);
    job_unref(j);
}

/* ---- images: decompression bombs and the request budget ---- */

#include "memory/host_budget.h"
#include "server/openai.h"
#include "vision/image.h"

struct bits { uint8_t *p; size_t n, cap; uint32_t acc; int nb; };

static void put_byte(struct bits *b, uint8_t v)
{
    if (b->n == b->cap) { b->cap = b->cap ? b->cap * 2 : 1024; b->p = realloc(b->p, b->cap); }
    b->p[b->n++] = v;
}
/* deflate packs bits LSB first; Huffman codes go in MSB of the code first */
static void put_bits(struct bits *b, uint32_t v, int n)
{
    for (int i = 0; i < n; i++) {
        b->acc |= ((v >> i) & 1u) << b->nb;
        if (++b->nb == 8) { put_byte(b, (uint8_t)b->acc); b->acc = 0; b->nb = 0; }
    }
}
static void put_code(struct bits *b, uint32_t code, int n)
{
    for (int i = n - 1; i >= 0; i--) put_bits(b, (code >> i) & 1u, 1);
}

/* A zlib stream of one fixed-Huffman block: a zero byte, then n_matches copies of 258 zeros
 * (13 bits each: a 1 KB stream inflates to 160 KB). */
static uint8_t *zlib_zeros(size_t n_matches, size_t *len)
{
    struct bits b = {0};
    put_byte(&b, 0x78);
    put_byte(&b, 0x01);
    put_bits(&b, 1, 1);            /* BFINAL */
    put_bits(&b, 1, 2);            /* fixed Huffman */
    put_code(&b, 0x30, 8);         /* literal 0 */
    for (size_t i = 0; i < n_matches; i++) {
        put_code(&b, 0xC5, 8);     /* length 258 (symbol 285) */
        put_code(&b, 0, 5);        /* distance 1 */
    }
    put_code(&b, 0, 7);            /* end of block */
    if (b.nb) put_byte(&b, (uint8_t)b.acc);
    uint64_t total = 1 + n_matches * 258;
    uint32_t adler = (uint32_t)((total % 65521) << 16 | 1);
    for (int i = 3; i >= 0; i--) put_byte(&b, (uint8_t)(adler >> (8 * i)));
    *len = b.n;
    return b.p;
}

static void put_chunk(struct bits *o, const char *type, const uint8_t *d, size_t n)
{
    for (int i = 3; i >= 0; i--) put_byte(o, (uint8_t)(n >> (8 * i)));
    for (int i = 0; i < 4; i++) put_byte(o, (uint8_t)type[i]);
    for (size_t i = 0; i < n; i++) put_byte(o, d[i]);
    for (int i = 0; i < 4; i++) put_byte(o, 0);   /* CRC: stb does not check it */
}

/* An RGB PNG that claims w x h and carries the given zlib stream as its IDAT. */
static uint8_t *png_with_idat(int w, int h, const uint8_t *z, size_t zn, size_t *len)
{
    struct bits o = {0};
    const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    for (int i = 0; i < 8; i++) put_byte(&o, sig[i]);
    uint8_t ihdr[13] = {0, 0, (uint8_t)(w >> 8), (uint8_t)w, 0, 0, (uint8_t)(h >> 8), (uint8_t)h, 8, 2, 0, 0, 0};
    put_chunk(&o, "IHDR", ihdr, sizeof ihdr);
    put_chunk(&o, "IDAT", z, zn);
    put_chunk(&o, "IEND", NULL, 0);
    *len = o.n;
    return o.p;
}

/* Issue 27: a 1x1 PNG with 2 MB of IDAT inflated to 2 GiB. This one (333 MB) is refused
 * before stb runs. */
Test(image_bomb, idat_far_past_the_header_is_refused_uninflated)
{
    size_t zn, n;
    uint8_t *z = zlib_zeros(((size_t)2 << 20) * 8 / 13, &zn);   /* 2 MB, inflates to 333 MB */
    uint8_t *png = png_with_idat(1, 1, z, zn, &n);
    struct image_u8 img;
    char err[256] = "";
    cr_assert_eq(image_decode(png, n, NULL, &img, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "decompression bomb"), "%s", err);
    cr_assert_eq(image_last_decode_peak(), 0, "nothing was inflated");
    free(z);
    free(png);
}

/* A bomb small enough to pass the IDAT check (64x64 claimed, 14 MB inflated from 90 KB): stb
 * stops when its buffers pass what a 64x64 image can need. */
Test(image_bomb, inflating_past_the_header_stops_at_the_cap)
{
    size_t zn, n;
    uint8_t *z = zlib_zeros(55000, &zn);
    uint8_t *png = png_with_idat(64, 64, z, zn, &n);
    struct image_u8 img;
    char err[256] = "";
    cr_assert_eq(image_decode(png, n, NULL, &img, err, sizeof err), TIDE_EFORMAT, "%s", err);
    cr_assert(strstr(err, "inflates past"), "%s", err);
    size_t peak = image_last_decode_peak();
    cr_assert_lt(peak, (size_t)2 << 20, "decoder held %zu bytes", peak);
    free(z);
    free(png);
}

/* An honest image of the same claimed size still decodes, charged to a budget while it runs
 * (the pixels stay charged); with no room in the budget it is TIDE_EFULL, nothing leaks. */
Test(image_bomb, honest_png_decodes_within_budget)
{
    size_t zn, n;
    /* 64 rows of (filter 0 + 192 zero bytes) = 12352 bytes: 1 + 47 * 258 + 225 literals */
    struct bits b = {0};
    put_byte(&b, 0x78); put_byte(&b, 0x01);
    put_bits(&b, 1, 1); put_bits(&b, 1, 2);
    for (int i = 0; i < 226; i++) put_code(&b, 0x30, 8);
    for (int i = 0; i < 47; i++) { put_code(&b, 0xC5, 8); put_code(&b, 0, 5); }
    put_code(&b, 0, 7);
    if (b.nb) put_byte(&b, (uint8_t)b.acc);
    for (int i = 0; i < 4; i++) put_byte(&b, 0);
    zn = b.n;
    uint8_t *png = png_with_idat(64, 64, b.p, zn, &n);
    struct host_budget budget = {0};
    atomic_store(&budget.limit, (size_t)4 << 20);
    struct image_limits lim = {0, 0, &budget};
    struct image_u8 img;
    char err[256] = "";
    cr_assert_eq(image_decode(png, n, &lim, &img, err, sizeof err), 0, "%s", err);
    cr_assert_eq(img.w, 64);
    cr_assert_eq(atomic_load(&budget.used), (size_t)64 * 64 * 3, "the pixels stay charged");
    cr_assert_gt(atomic_load(&budget.peak), (size_t)64 * 64 * 3, "the decode was charged");
    host_budget_release(&budget, (size_t)64 * 64 * 3);
    image_u8_free(&img);
    atomic_store(&budget.limit, (size_t)8192);
    cr_assert_eq(image_decode(png, n, &lim, &img, err, sizeof err), TIDE_EFULL, "%s", err);
    cr_assert_eq(atomic_load(&budget.used), 0, "a refused decode leaves nothing charged");
    free(b.p);
    free(png);
}

/* ---- JSON: the parse tree is bounded before cJSON builds it ---- */

static int parse_body(const char *body, size_t len, char *msg, size_t msglen)
{
    struct oai_req *r = NULL;
    const char *param;
    int rc = openai_parse(body, len, false, "m", &r, msg, msglen, &param);
    openai_req_free(r);
    return rc;
}

Test(json_bound, too_many_values_refused_before_parsing)
{
    /* {"prompt":"hi","stop":[1,1,1,...]}: 200k numbers in 400 KB */
    size_t n = 200000, len = 0;
    char *body = malloc(n * 2 + 64);
    len += (size_t)sprintf(body, "{\"prompt\":\"hi\",\"x\":[");
    for (size_t i = 0; i < n; i++) { body[len++] = '1'; body[len++] = ','; }
    body[len - 1] = ']';
    body[len++] = '}';
    char msg[256] = "";
    size_t used0 = atomic_load(&request_budget.used);
    cr_assert_eq(parse_body(body, len, msg, sizeof msg), TIDE_ERANGE);
    cr_assert(strstr(msg, "json_max_elements"), "%s", msg);
    cr_assert_eq(atomic_load(&request_budget.used), used0);
    /* commas inside strings are text, not values */
    char *s = malloc(n + 64);
    int k = sprintf(s, "{\"prompt\":\"");
    memset(s + k, ',', n);
    k += (int)n;
    k += sprintf(s + k, "\",\"max_tokens\":1}");
    cr_assert_eq(parse_body(s, (size_t)k, msg, sizeof msg), 0, "%s", msg);
    free(s);
    free(body);
}

Test(json_bound, deep_nesting_refused)
{
    char body[1024];
    int k = sprintf(body, "{\"prompt\":\"hi\",\"x\":");
    for (int i = 0; i < 200; i++) body[k++] = '[';
    for (int i = 0; i < 200; i++) body[k++] = ']';
    body[k++] = '}';
    char msg[256] = "";
    cr_assert_eq(parse_body(body, (size_t)k, msg, sizeof msg), TIDE_EINVAL);
    cr_assert(strstr(msg, "nested too deeply"), "%s", msg);
}

/* Past the request budget: TIDE_EFULL (the daemon answers 503 + Retry-After), and every
 * charge is given back when the request is freed. */
Test(json_bound, request_budget_refuses_then_releases)
{
    const char *body = "{\"prompt\":\"hello\",\"max_tokens\":4}";
    char msg[256] = "";
    atomic_store(&request_budget.limit, (size_t)16);
    cr_assert_eq(parse_body(body, strlen(body), msg, sizeof msg), TIDE_EFULL);
    cr_assert(strstr(msg, "request_memory_mib"), "%s", msg);
    atomic_store(&request_budget.limit, (size_t)1 << 20);
    struct oai_req *r = NULL;
    const char *param;
    cr_assert_eq(openai_parse(body, strlen(body), false, "m", &r, msg, sizeof msg, &param), 0, "%s", msg);
    cr_assert_gt(atomic_load(&request_budget.used), 0, "a parsed request is charged");
    openai_req_free(r);
    cr_assert_eq(atomic_load(&request_budget.used), 0, "and released when freed");
    atomic_store(&request_budget.limit, 0);
}

/* ---- content keys ---- */

#include "vision/content_hash.h"

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < CONTENT_HASH_SIZE; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

/* SHA-256 (FIPS 180-2 test vectors), so the key is what it says. */
Test(content_hash, is_sha256)
{
    uint8_t d[CONTENT_HASH_SIZE];
    char h[2 * CONTENT_HASH_SIZE + 1];
    content_hash("abc", 3, d);
    hex(d, h);
    cr_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    content_hash("", 0, d);
    hex(d, h);
    cr_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
