/* test_gguf.c - GGUF reader/writer round trips, type conversions, corrupt-input
 * handling, and the model generator's output loading back. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/modelgen.h"
#include "engine/forward.h"

static void *small_file(size_t *size)
{
    struct gguf_writer *w = gguf_writer_new();
    cr_assert(w);
    gguf_w_u32(w, "a.u32", 7);
    gguf_w_str(w, "a.str", "hi");
    const char *ss[2] = {"x", "yz"};
    gguf_w_arr_str(w, "a.strs", ss, 2);
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = (float)i;
    uint64_t ne[1] = {32};
    gguf_w_tensor(w, "t", GGML_TYPE_F32, 1, ne, d);
    void *buf;
    cr_assert_eq(gguf_writer_to_memory(w, &buf, size), 0);
    gguf_writer_free(w);
    return buf;
}

Test(gguf, roundtrip_kv_and_tensors)
{
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_u32(w, "k.u32", 4000000000u);
    gguf_w_i32(w, "k.i32", -5);
    gguf_w_f32(w, "k.f32", 1.5f);
    gguf_w_bool(w, "k.bool", true);
    gguf_w_str(w, "k.str", "hello");
    const char *ss[3] = {"a", "", "ccc"};
    gguf_w_arr_str(w, "k.astr", ss, 3);
    int32_t ai[4] = {1, -2, 3, -4};
    gguf_w_arr_i32(w, "k.ai32", ai, 4);
    float af[2] = {0.25f, -8.0f};
    gguf_w_arr_f32(w, "k.af32", af, 2);
    float data[64 * 3];
    for (int i = 0; i < 64 * 3; i++) data[i] = sinf((float)i) * 2.0f;
    uint64_t ne[2] = {64, 3};
    uint32_t types[4] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0};
    const char *names[4] = {"t.f32", "t.f16", "t.bf16", "t.q8"};
    for (int t = 0; t < 4; t++) gguf_w_tensor(w, names[t], types[t], 2, ne, data);
    void *buf;
    size_t size;
    cr_assert_eq(gguf_writer_to_memory(w, &buf, &size), 0);
    gguf_writer_free(w);

    struct gguf_file g;
    char err[200];
    cr_assert_eq(gguf_open_memory(&g, buf, size, err, sizeof err), 0, "%s", err);
    cr_assert_eq(g.version, 3);
    cr_assert_eq(g.alignment, 32);
    uint32_t u;
    uint64_t u64;
    float f;
    bool b;
    struct gguf_str s;
    cr_assert_eq(gguf_get_u32(&g, "k.u32", &u), 0);
    cr_assert_eq(u, 4000000000u);
    cr_assert_eq(gguf_get_u64(&g, "k.u32", &u64), 0);
    cr_assert_eq(gguf_get_u32(&g, "k.i32", &u), TIDE_EFORMAT); /* negative */
    cr_assert_eq(gguf_find_kv(&g, "k.i32")->v.i64, -5);
    cr_assert_eq(gguf_get_f32(&g, "k.f32", &f), 0);
    cr_assert_eq(f, 1.5f);
    cr_assert_eq(gguf_get_bool(&g, "k.bool", &b), 0);
    cr_assert(b);
    cr_assert_eq(gguf_get_str(&g, "k.str", &s), 0);
    cr_assert(gguf_str_eq(s, "hello"));
    char *dup = gguf_dup_str(&g, "k.str");
    cr_assert_str_eq(dup, "hello");
    free(dup);
    cr_assert_eq(gguf_get_str(&g, "k.u32", &s), TIDE_EFORMAT);
    cr_assert_eq(gguf_get_u32(&g, "nope", &u), TIDE_ENOTFOUND);
    const struct gguf_kv *kv = gguf_find_kv(&g, "k.astr");
    cr_assert(kv && kv->type == GGUF_TYPE_ARRAY && kv->v.arr.type == GGUF_TYPE_STRING);
    cr_assert_eq(kv->v.arr.n, 3);
    cr_assert(gguf_str_eq(kv->v.arr.strs[0], "a"));
    cr_assert(gguf_str_eq(kv->v.arr.strs[1], ""));
    cr_assert(gguf_str_eq(kv->v.arr.strs[2], "ccc"));
    kv = gguf_find_kv(&g, "k.ai32");
    cr_assert_eq(kv->v.arr.n, 4);
    int32_t got[4];
    memcpy(got, kv->v.arr.data, 16);
    cr_assert_eq(got[3], -4);
    kv = gguf_find_kv(&g, "k.af32");
    float gf[2];
    memcpy(gf, kv->v.arr.data, 8);
    cr_assert_eq(gf[1], -8.0f);

    float tol[4] = {0, 2e-3f, 1.6e-2f, 2.0f / 127};
    for (int t = 0; t < 4; t++) {
        const struct gguf_tensor *gt = gguf_find_tensor(&g, names[t]);
        cr_assert(gt, "%s", names[t]);
        cr_assert_eq(gt->type, types[t]);
        cr_assert_eq(gt->n_dims, 2);
        cr_assert_eq(gt->ne[0], 64);
        cr_assert_eq(gt->ne[1], 3);
        cr_assert_eq(gt->ne[2], 1);
        cr_assert_eq(gt->nbytes, ggml_row_size(types[t], 64) * 3);
        cr_assert_eq(((uintptr_t)gt->data - (uintptr_t)buf) % 32, 0);
        float out[64 * 3];
        ggml_dequantize(types[t], gt->data, out, 64 * 3);
        for (int i = 0; i < 64 * 3; i++)
            cr_assert(fabsf(out[i] - data[i]) <= tol[t] * 1.01f, "%s[%d] %g vs %g", names[t], i, out[i], data[i]);
    }
    cr_assert_null(gguf_find_tensor(&g, "t.none"));
    gguf_close(&g);
    free(buf);
}

Test(gguf, f16_exact)
{
    /* every half value converts to float and back unchanged (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tide_f16_to_f32((uint16_t)h);
        uint16_t back = tide_f32_to_f16(f);
        if (isnan(f)) cr_assert(isnan(tide_f16_to_f32(back)));
        else cr_assert_eq(back, h, "h=%04x f=%g back=%04x", h, f, back);
    }
    cr_assert_eq(tide_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(tide_f16_to_f32(0x0001), ldexpf(1.0f, -24));
    cr_assert_eq(tide_f32_to_f16(65520.0f), 0x7c00);        /* rounds to inf */
    cr_assert_eq(tide_f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(tide_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie to even */
    cr_assert_eq(tide_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    cr_assert_eq(tide_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);       /* tie to even zero */
    cr_assert_eq(tide_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    cr_assert_eq(tide_f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(tide_f32_to_f16(1e-10f), 0);
}

Test(gguf, bf16_and_q)
{
    cr_assert_eq(tide_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(tide_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: even wins */
    cr_assert_eq(tide_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);
    cr_assert_eq(tide_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82);
    cr_assert(isnan(tide_bf16_to_f32(tide_f32_to_bf16(NAN))));
    /* q8_0 */
    float x[64], y[64];
    uint8_t q[68];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 30) * 0.1f;
    cr_assert_eq(ggml_quantize(GGML_TYPE_Q8_0, x, q, 64), 68);
    ggml_dequantize(GGML_TYPE_Q8_0, q, y, 64);
    for (int i = 0; i < 64; i++) cr_assert(fabsf(x[i] - y[i]) < 3.4f / 127 * 0.51f + 1e-3f);
    /* q4_0: hand-built block, d = 0.5, nibble n -> (n - 8) * 0.5 */
    uint8_t b4[18] = {0x00, 0x38};
    for (int j = 0; j < 16; j++) b4[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    ggml_dequantize(GGML_TYPE_Q4_0, b4, y, 32);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], (j - 8) * 0.5f);
        cr_assert_eq(y[16 + j], (15 - j - 8) * 0.5f);
    }
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q4_0, 64), 36);
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q8_0, 33), 0);
    cr_assert_str_eq(ggml_type_name(GGML_TYPE_BF16), "bf16");
}

static double rel_rms(const float *a, const float *b, int n)
{
    double e = 0, r = 0;
    for (int i = 0; i < n; i++) {
        e += (double)(a[i] - b[i]) * (a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(e / r);
}

Test(gguf, k_quants_round_trip_and_layout)
{
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[2 * Q6_K_BYTES];
    uint64_t st = 99;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(st >> 33) % 2001 - 1000) / 1000.0f * (1 + i / 64);
    }
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q4_K, 512), 2 * Q4_K_BYTES);
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q6_K, 256), Q6_K_BYTES);
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q4_K, 128), 0, "a row must be whole super-blocks");
    cr_assert_eq(ggml_quantize(GGML_TYPE_Q4_K, x, q, N), 2 * Q4_K_BYTES);
    ggml_dequantize(GGML_TYPE_Q4_K, q, y, N);
    double e4 = rel_rms(y, x, N);
    cr_assert(e4 < 0.08, "q4_K relative RMS error %g", e4);
    cr_assert_eq(ggml_quantize(GGML_TYPE_Q6_K, x, q, N), 2 * Q6_K_BYTES);
    ggml_dequantize(GGML_TYPE_Q6_K, q, y, N);
    double e6 = rel_rms(y, x, N);
    cr_assert(e6 < 0.02, "q6_K relative RMS error %g", e6);
    cr_assert(e6 < e4 / 2, "q6_K (%g) should be well under q4_K (%g)", e6, e4);

    /* q4_K by hand: d = 1, dmin = 0.5, sub-block 0 scale 2 min 1, sub-block 5 scale 33
     * (low nibble in byte 9, top bits in byte 1) min 17 (byte 9's high nibble, byte 5's top
     * bits); value 0 = nibble 3 (byte 16, low), value 160+1 = high nibble of byte 16+64+1. */
    uint8_t b[Q4_K_BYTES] = {0};
    b[0] = 0x00; b[1] = 0x3c; /* f16 1.0 */
    b[2] = 0x00; b[3] = 0x38; /* f16 0.5 */
    b[4 + 0] = 2; b[4 + 4] = 1;
    b[4 + 1] |= (uint8_t)((33 >> 4) << 6); b[4 + 9] = (uint8_t)((33 & 15) | ((17 & 15) << 4));
    b[4 + 5] |= (uint8_t)((17 >> 4) << 6);
    b[16] = 3;
    b[16 + 64 + 1] = (uint8_t)(7 << 4);
    float v[QK_K];
    ggml_dequantize(GGML_TYPE_Q4_K, b, v, QK_K);
    cr_assert_float_eq(v[0], 1.0f * 2 * 3 - 0.5f * 1, 1e-6);
    cr_assert_float_eq(v[1], -0.5f, 1e-6);
    cr_assert_float_eq(v[160 + 1], 1.0f * 33 * 7 - 0.5f * 17, 1e-6);

    /* q6_K by hand: d = 0.5, scale of values 64-79 (index 4) = -3; value 64 is the high
     * nibble of byte 0 plus bits 4-5 of qh[0]: 0xA | 2 << 4 = 42, minus 32 = 10. */
    uint8_t c6[Q6_K_BYTES] = {0};
    c6[208] = 0x00; c6[209] = 0x38;
    c6[192 + 4] = (uint8_t)(int8_t)-3;
    c6[0] = 0xA0;
    c6[128] = 2 << 4;
    ggml_dequantize(GGML_TYPE_Q6_K, c6, v, QK_K);
    cr_assert_float_eq(v[64], 0.5f * -3 * 10, 1e-6);
    cr_assert_float_eq(v[0], 0.0f, 1e-6, "value 0 has q 32-32 = 0 times scale 0");
}

/* q5_K (type 13): the size, a round trip between q4_K's and q6_K's error, and the fifth bit's
 * place by hand: bit j of byte 16 + l is value 32 j + l's. */
Test(gguf, q5_K_round_trip_and_layout)
{
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[2 * Q5_K_BYTES];
    uint64_t st = 99;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(st >> 33) % 2001 - 1000) / 1000.0f * (1 + i / 64);
    }
    cr_assert_eq(ggml_row_size(GGML_TYPE_Q5_K, 512), 2 * Q5_K_BYTES);
    cr_assert_str_eq(ggml_type_name(GGML_TYPE_Q5_K), "q5_K");
    cr_assert_eq(ggml_quantize(GGML_TYPE_Q5_K, x, q, N), 2 * Q5_K_BYTES);
    ggml_dequantize(GGML_TYPE_Q5_K, q, y, N);
    double e5 = rel_rms(y, x, N);
    uint8_t q4[2 * Q4_K_BYTES];
    ggml_quantize(GGML_TYPE_Q4_K, x, q4, N);
    ggml_dequantize(GGML_TYPE_Q4_K, q4, y, N);
    double e4 = rel_rms(y, x, N);
    cr_assert(e5 < e4 * 0.7, "q5_K (%g) should be well under q4_K (%g)", e5, e4);

    uint8_t b[Q5_K_BYTES] = {0};
    b[1] = 0x3c; /* d = 1 */
    b[4 + 3] = 2; /* sub-block 3: scale 2, min 0 */
    b[16 + 5] = 1 << 3; /* value 96 + 5: fifth bit */
    b[48 + 32 + 5] = 0x90; /* ... and high nibble 9 of byte 32 + 5 (values 96..127) */
    float v[QK_K];
    ggml_dequantize(GGML_TYPE_Q5_K, b, v, QK_K);
    cr_assert_float_eq(v[96 + 5], 2.0f * (16 + 9), 1e-6);
    cr_assert_float_eq(v[64 + 5], 0.0f, 1e-6, "sub-block 2 has scale 0");
}

/* modelgen's type_down (tide-mkmodel --down-type): a Q4_K_M-like mix, ffn_down and output in
 * q6_K and the rest in q4_K, that loads; a type it cannot write is refused */
Test(gguf, modelgen_down_type_mix)
{
    char path[64], err[200] = "";
    snprintf(path, sizeof path, "/tmp/tide-test-mix-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "moe", .out = path, .seed = 3, .type = GGML_TYPE_Q4_K,
                                 .type_down = GGML_TYPE_Q6_K, .n_embd = 256, .n_ff = 256, .n_layer = 1};
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    static const struct { const char *name; uint32_t type; } want[] = {
        {"token_embd.weight", GGML_TYPE_Q4_K},         {"output.weight", GGML_TYPE_Q6_K},
        {"blk.0.attn_q.weight", GGML_TYPE_Q4_K},       {"blk.0.ffn_gate_exps.weight", GGML_TYPE_Q4_K},
        {"blk.0.ffn_down_exps.weight", GGML_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, want[i].name);
        cr_assert(t && t->type == want[i].type, "%s", want[i].name);
    }
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    model_free(&m);
    o.type_down = 99; /* no such type */
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), TIDE_EINVAL);
    unlink(path);
}

Test(gguf, every_truncation_fails)
{
    size_t size;
    uint8_t *buf = small_file(&size);
    struct gguf_file g;
    char err[200];
    cr_assert_eq(gguf_open_memory(&g, buf, size, err, sizeof err), 0, "%s", err);
    gguf_close(&g);
    /* the data section is the last 128 bytes; any shorter prefix must fail cleanly */
    for (size_t n = 0; n < size; n++) {
        uint8_t *cp = malloc(n ? n : 1);
        memcpy(cp, buf, n);
        err[0] = 0;
        int rc = gguf_open_memory(&g, cp, n, err, sizeof err);
        cr_assert_eq(rc, TIDE_EFORMAT, "prefix %zu accepted", n);
        cr_assert(strncmp(err, "gguf: ", 6) == 0, "prefix %zu: no message", n);
        free(cp);
    }
    free(buf);
}

static int open_patched(const uint8_t *buf, size_t size, size_t at, const void *patch, size_t n,
                        char *err, size_t errlen)
{
    uint8_t *cp = malloc(size);
    memcpy(cp, buf, size);
    memcpy(cp + at, patch, n);
    struct gguf_file g;
    int rc = gguf_open_memory(&g, cp, size, err, errlen);
    if (rc == 0) gguf_close(&g);
    free(cp);
    return rc;
}

static size_t find(const uint8_t *buf, size_t size, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= size; i++)
        if (!memcmp(buf + i, s, n)) return i;
    cr_assert_fail("pattern %s missing", s);
    return 0;
}

Test(gguf, corrupt_inputs)
{
    size_t size;
    uint8_t *buf = small_file(&size);
    char err[200];
    cr_assert_eq(open_patched(buf, size, 0, "GGUX", 4, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "magic"), "%s", err);
    uint32_t v9 = 9;
    cr_assert_eq(open_patched(buf, size, 4, &v9, 4, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "version"), "%s", err);
    uint64_t huge = UINT64_MAX / 2;
    cr_assert_eq(open_patched(buf, size, 8, &huge, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "tensor count"), "%s", err);
    cr_assert_eq(open_patched(buf, size, 16, &huge, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "kv count"), "%s", err);
    /* the string array's element count */
    size_t at = find(buf, size, "a.strs") + 6 + 4 + 4;
    cr_assert_eq(open_patched(buf, size, at, &huge, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "a.strs"), "%s", err);
    /* a key length past the end */
    cr_assert_eq(open_patched(buf, size, find(buf, size, "a.u32") - 8, &huge, 8, err, sizeof err), TIDE_EFORMAT);
    /* an unknown value type */
    uint32_t bad = 99;
    cr_assert_eq(open_patched(buf, size, find(buf, size, "a.u32") + 5, &bad, 4, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "unknown value type"), "%s", err);
    /* tensor info "t": name len(8) "t" n_dims(4) ne(8) type(4) offset(8) */
    static const uint8_t pat[13] = {1, 0, 0, 0, 0, 0, 0, 0, 't', 1, 0, 0, 0};
    const uint8_t *hit = memmem(buf, size, pat, sizeof pat);
    cr_assert(hit);
    size_t ti = (size_t)(hit - buf) + 9;
    cr_assert_eq(open_patched(buf, size, ti + 12, &bad, 4, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "unknown type"), "%s", err);
    uint64_t off = 1u << 20;
    cr_assert_eq(open_patched(buf, size, ti + 16, &off, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert_str_eq(err, "gguf: tensor 't' data beyond end of file");
    off = 4;
    cr_assert_eq(open_patched(buf, size, ti + 16, &off, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "aligned"), "%s", err);
    uint32_t dims = 5;
    cr_assert_eq(open_patched(buf, size, ti, &dims, 4, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "dims"), "%s", err);
    uint64_t ne0 = 1ull << 40;
    cr_assert_eq(open_patched(buf, size, ti + 4, &ne0, 8, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "beyond end"), "%s", err);
    free(buf);
}

Test(gguf, file_io)
{
    char path[] = "/tmp/tide-test-gguf-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    struct gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    cr_assert_eq(gguf_writer_write(w, path), 0);
    gguf_writer_free(w);
    struct gguf_file g;
    char err[200];
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(g.n_tensors, 0);
    cr_assert_eq(g.n_kv, 2);
    gguf_close(&g);
    unlink(path);
    cr_assert_eq(gguf_open(&g, "/nonexistent/x.gguf", err, sizeof err), TIDE_ENOTFOUND);
}

Test(gguf, modelgen_presets_load)
{
    const char *ps[8] = {"dense", "moe", "qwen3moe", "qwen2moe", "gpt-oss", "olmoe", "granitemoe", "granitemoe-shared"};
    for (int i = 0; i < 8; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/tide-test-mg-%d-%s.gguf", (int)getpid(), ps[i]);
        struct modelgen_options o = {.preset = ps[i], .out = path, .seed = 3, .type = -1};
        char err[200] = "";
        struct modelgen_summary s;
        cr_assert_eq(modelgen_write(&o, &s, err, sizeof err), 0, "%s", err);
        struct gguf_file g;
        cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
        char *arch = gguf_dup_str(&g, "general.architecture");
        cr_assert(arch);
        char key[96];
        uint32_t n_embd, n_layer;
        snprintf(key, sizeof key, "%s.embedding_length", arch);
        cr_assert_eq(gguf_get_u32(&g, key, &n_embd), 0);
        snprintf(key, sizeof key, "%s.block_count", arch);
        cr_assert_eq(gguf_get_u32(&g, key, &n_layer), 0);
        const struct gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens");
        cr_assert(tok && tok->v.arr.n == s.n_vocab);
        cr_assert(gguf_str_eq(tok->v.arr.strs[tok->v.arr.n - 1], "<|im_end|>"));
        cr_assert(gguf_str_eq(tok->v.arr.strs['A'], "A"));
        cr_assert(gguf_str_eq(tok->v.arr.strs[' '], "\xc4\xa0")); /* U+0120 */
        const struct gguf_kv *mg = gguf_find_kv(&g, "tokenizer.ggml.merges");
        cr_assert(mg && mg->v.arr.n == s.n_vocab - 259);
        const struct gguf_tensor *te = gguf_find_tensor(&g, "token_embd.weight");
        cr_assert(te && te->ne[0] == n_embd && te->ne[1] == s.n_vocab);
        snprintf(key, sizeof key, "blk.%u.attn_norm.weight", n_layer - 1);
        cr_assert(gguf_find_tensor(&g, key));
        if (i > 0) {
            const struct gguf_tensor *ex = gguf_find_tensor(&g, "blk.0.ffn_down_exps.weight");
            cr_assert(ex && ex->n_dims == 3 && ex->ne[1] == n_embd && ex->ne[2] == 8);
        }
        free(arch);
        gguf_close(&g);
        unlink(path);
    }
}

/* Filled tensors (gguf_write.c): values made at write time by threads. */
static void fill_ramp(const void *ctx, uint64_t first, uint64_t n, float *dst)
{
    float scale = *(const float *)ctx;
    for (uint64_t i = 0; i < n; i++) dst[i] = scale * (float)((first + i) % 1000) - 1.0f;
}

static void raw_q8(const void *ctx, uint64_t first, uint64_t n, void *dst)
{
    (void)ctx;
    uint8_t *d = dst;
    for (uint64_t b = first / 32; b < (first + n) / 32; b++, d += 34) {
        d[0] = 0x00, d[1] = 0x3c; /* f16 1.0 */
        for (int j = 0; j < 32; j++) d[2 + j] = (uint8_t)((b + (uint64_t)j) % 200);
    }
}

static void *filled_file(int threads, size_t *size)
{
    struct gguf_writer *w = gguf_writer_new();
    gguf_writer_set_threads(w, threads);
    float small[64];
    for (int i = 0; i < 64; i++) small[i] = (float)i;
    float scale = 0.002f;
    uint64_t ne_small[1] = {64}, ne_big[2] = {1024, 9000}, ne_q[2] = {96, 3};
    gguf_w_tensor(w, "small", GGML_TYPE_F32, 1, ne_small, small);
    /* 9.2M values: more than two 4M-value chunks, so threads meet at chunk edges */
    gguf_w_tensor_fill(w, "big", GGML_TYPE_F16, 2, ne_big, fill_ramp, &scale, sizeof scale);
    gguf_w_tensor_fill_raw(w, "q", GGML_TYPE_Q8_0, 2, ne_q, raw_q8, NULL, 0);
    gguf_w_tensor(w, "after", GGML_TYPE_F32, 1, ne_small, small);
    void *buf = NULL;
    cr_assert_eq(gguf_writer_to_memory(w, &buf, size), 0);
    gguf_writer_free(w);
    return buf;
}

Test(gguf, filled_tensors_any_thread_count)
{
    size_t n1, n4;
    uint8_t *a = filled_file(1, &n1), *b = filled_file(4, &n4);
    cr_assert_eq(n1, n4);
    cr_assert(memcmp(a, b, n1) == 0, "bytes depend on the thread count");
    struct gguf_file g;
    char err[200];
    cr_assert_eq(gguf_open_memory(&g, a, n1, err, sizeof err), 0, "%s", err);
    const struct gguf_tensor *big = gguf_find_tensor(&g, "big"), *q = gguf_find_tensor(&g, "q");
    const struct gguf_tensor *after = gguf_find_tensor(&g, "after");
    cr_assert(big && q && after);
    cr_assert_eq(big->nbytes, 1024 * 9000 * 2);
    const uint64_t at[4] = {0, 4194303, 4194304, 1024 * 9000 - 1};
    for (int i = 0; i < 4; i++) {
        const uint8_t *p = (const uint8_t *)big->data + at[i] * 2;
        float want = 0.002f * (float)(at[i] % 1000) - 1.0f;
        cr_assert_float_eq(tide_f16_to_f32((uint16_t)(p[0] | p[1] << 8)), want, 1e-3, "element %llu",
                           (unsigned long long)at[i]);
    }
    uint8_t want_q[9 * 34];
    raw_q8(NULL, 0, 96 * 3, want_q);
    cr_assert_eq(q->nbytes, sizeof want_q);
    cr_assert(memcmp(q->data, want_q, sizeof want_q) == 0);
    cr_assert_float_eq(((const float *)after->data)[63], 63.0f, 0);
    gguf_close(&g);
    free(a);
    free(b);
}

Test(gguf, modelgen_qwen3_30b_preset)
{
    /* the benchmark preset, shrunk except for its vocabulary and head_dim (256 / 2 heads) */
    char path[64];
    snprintf(path, sizeof path, "/tmp/tide-test-mg-%d-30b.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "qwen3-30b-a3b", .out = path, .seed = 1, .type = -1,
                                 .n_layer = 1, .n_embd = 256, .n_head = 2, .n_head_kv = 1,
                                 .n_expert = 4, .n_expert_used = 2, .n_ff = 64, .threads = 2};
    char err[200] = "";
    struct modelgen_summary s;
    cr_assert_eq(modelgen_write(&o, &s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.n_vocab, 151936);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.arch, ARCH_QWEN3MOE);
    cr_assert_eq(m.cfg.n_vocab, 151936);
    cr_assert_eq(m.cfg.n_embd, 256);
    cr_assert_eq(m.cfg.n_head, 2);
    cr_assert_eq(m.cfg.n_expert, 4);
    cr_assert_eq(m.cfg.head_dim, 128);
    cr_assert_float_eq(m.cfg.rope_theta, 1e6f, 1);
    model_free(&m);
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    const struct gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens");
    cr_assert(gguf_str_eq(tok->v.arr.strs[151935], "<|tide_pad_151935|>"));
    uint32_t eos;
    cr_assert_eq(gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &eos), 0);
    cr_assert(gguf_str_eq(tok->v.arr.strs[eos], "<|im_end|>"));
    /* q8_0 weights made directly, with the std the small presets use: 1/sqrt(n_embd) */
    const struct gguf_tensor *te = gguf_find_tensor(&g, "token_embd.weight");
    cr_assert(te && te->type == GGML_TYPE_Q8_0 && te->ne[0] == 256 && te->ne[1] == 151936);
    const struct gguf_tensor *tq = gguf_find_tensor(&g, "blk.0.attn_q.weight");
    cr_assert(tq && tq->type == GGML_TYPE_Q8_0 && tq->ne[0] == 256 && tq->ne[1] == 256);
    static float w[256 * 256];
    double ss = 0, sum = 0;
    ggml_dequantize(GGML_TYPE_Q8_0, tq->data, w, 256 * 256);
    for (int i = 0; i < 256 * 256; i++) ss += (double)w[i] * w[i], sum += w[i];
    double sd = sqrt(ss / (256 * 256));
    cr_assert(sd > 0.95 / 16 && sd < 1.05 / 16, "std %g", sd);
    cr_assert(fabs(sum / (256 * 256)) < 0.05 / 16, "mean %g", sum / (256 * 256));
    gguf_close(&g);
    unlink(path);
}

/* Rewriting a model file that a process has mapped (make regenerating the default models beside
 * a running daemon) must not pull the pages from under it: the writer renames a new file over
 * the old one, so the old mapping keeps its bytes. Before, the file was truncated in place and
 * touching the mapping afterwards was SIGBUS (this test then crashes). */
Test(gguf, rewriting_a_mapped_model_leaves_the_mapping_whole)
{
    char path[64], err[200] = "";
    snprintf(path, sizeof path, "/tmp/tide-test-remap-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "moe", .out = path, .seed = 3, .type = -1, .threads = 1};
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    unsigned sum0 = 0, sum1 = 0;
    for (size_t i = 0; i < g.size; i++)
        sum0 += ((const uint8_t *)g.map)[i];
    o.seed = 4; /* other bytes, same size */
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    for (size_t i = 0; i < g.size; i++)
        sum1 += ((const uint8_t *)g.map)[i];
    cr_expect_eq(sum0, sum1, "the mapped bytes changed under the reader");
    gguf_close(&g);
    char part[96];
    snprintf(part, sizeof part, "%s.part-%d", path, (int)getpid());
    cr_expect_neq(access(part, F_OK), 0, "a .part file was left behind");
    unlink(path);
}

/* qwen2moe as llama.cpp names and shapes it (src/models/qwen2moe.cpp there): q/k/v biases, a
 * shared expert of its own width and its 1-D gate; then what the loader makes of it. */
Test(gguf, modelgen_qwen2moe_preset)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/tide-test-mg-%d-q2m.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "qwen2moe", .out = path, .seed = 1, .type = -1, .threads = 1};
    char err[200] = "";
    struct modelgen_summary s;
    cr_assert_eq(modelgen_write(&o, &s, err, sizeof err), 0, "%s", err);
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    uint32_t v;
    cr_assert_eq(gguf_get_u32(&g, "qwen2moe.expert_feed_forward_length", &v), 0);
    cr_assert_eq(v, 64);
    cr_assert_eq(gguf_get_u32(&g, "qwen2moe.expert_shared_feed_forward_length", &v), 0);
    cr_assert_eq(v, 256);
    cr_assert_eq(gguf_get_u32(&g, "qwen2moe.expert_used_count", &v), 0);
    cr_assert_eq(v, 4);
    struct { const char *name; uint32_t nd; uint64_t a, b, c; } want[] = {
        {"blk.0.attn_q.bias", 1, 128, 1, 1},          {"blk.0.attn_k.bias", 1, 64, 1, 1},
        {"blk.0.attn_v.bias", 1, 64, 1, 1},           {"blk.3.ffn_gate_inp_shexp.weight", 1, 128, 1, 1},
        {"blk.3.ffn_gate_shexp.weight", 2, 128, 256, 1}, {"blk.3.ffn_up_shexp.weight", 2, 128, 256, 1},
        {"blk.3.ffn_down_shexp.weight", 2, 256, 128, 1}, {"blk.3.ffn_gate_exps.weight", 3, 128, 64, 8},
        {"blk.3.ffn_down_exps.weight", 3, 64, 128, 8},   {"blk.0.attn_q.weight", 2, 128, 128, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, want[i].name);
        cr_assert(t, "%s missing", want[i].name);
        cr_assert(t->n_dims == want[i].nd && t->ne[0] == want[i].a && t->ne[1] == want[i].b && t->ne[2] == want[i].c,
                  "%s: %u dims [%llu, %llu, %llu]", want[i].name, t->n_dims, (unsigned long long)t->ne[0],
                  (unsigned long long)t->ne[1], (unsigned long long)t->ne[2]);
    }
    cr_assert_eq(gguf_find_tensor(&g, "blk.0.attn_q.bias")->type, GGML_TYPE_F32);
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.arch, ARCH_QWEN2MOE);
    cr_assert_str_eq(model_arch_name(m.cfg.arch), "qwen2moe");
    cr_assert_eq(m.cfg.n_ff_exp, 64);
    cr_assert_eq(m.cfg.n_ff_shexp, 256);
    cr_assert_eq(m.cfg.head_dim, 32);
    cr_assert_eq(m.cfg.rope, ROPE_NEOX);
    cr_assert(!m.cfg.expert_weights_norm, "qwen2moe's top-k weights are not renormalised");
    cr_assert(m.layers[0].bq.data && m.layers[0].bk.data && m.layers[0].bv.data);
    cr_assert(m.layers[3].ffn_gate_inp_shexp.data && m.layers[3].ffn_down_shexp.data);
    cr_assert(!m.layers[0].q_norm.data);
    /* the shared expert is not one of the cached experts: an expert is gate + up + down of 64 */
    cr_assert_eq(model_expert_bytes(&m, 0), 3 * 128 * 64 * 2);
    /* it is a resident weight of its layer: a stage of layer 3 alone counts every f16 matrix
     * (wq, wo 128x128; wk, wv 128x64; the shared expert 3 x 128x256) and the f32 vectors and
     * router (2 norms and the shared gate of 128, biases 128 + 64 + 64, router 128x8) */
    struct forward_stage_bytes sb;
    forward_stage_size(&m, 64, 1, 8, 3, 4, false, false, KV_F32, &sb);
    size_t f16 = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256), f32 = 4 * (3 * 128 + 256 + 128 * 8);
    cr_assert_eq(sb.weights, f16 + f32, "stage weights %zu, want %zu", sb.weights, f16 + f32);
    model_free(&m);
    unlink(path);
}

/* Rename one tensor in a GGUF file in place (same length, so the file stays valid): the
 * loader then sees a file without `from`. */
static void rename_tensor(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    char *b = malloc((size_t)n);
    fseek(f, 0, SEEK_SET);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    size_t lf = strlen(from);
    cr_assert_eq(strlen(to), lf);
    long at = -1;
    for (long i = 0; i + (long)lf <= n && at < 0; i++)
        if (memcmp(b + i, from, lf) == 0)
            at = i;
    cr_assert(at >= 0, "%s not in the file", from);
    fseek(f, at, SEEK_SET);
    fwrite(to, 1, lf, f);
    fclose(f);
    free(b);
}

/* gpt-oss as llama.cpp names and shapes it (src/models/openai-moe.cpp there): biases on
 * q/k/v/o, the router and every expert, a sink per head, post_attention_norm as the FFN's
 * norm, the sliding window; then what the loader makes of it, and a file missing one of the
 * required tensors refused by name. */
Test(gguf, modelgen_gptoss_preset)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/tide-test-mg-%d-oss.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "gpt-oss", .out = path, .seed = 1, .type = GGML_TYPE_MXFP4, .threads = 1};
    char err[200] = "";
    struct modelgen_summary s;
    cr_assert_eq(modelgen_write(&o, &s, err, sizeof err), 0, "%s", err);
    struct gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err, sizeof err), 0, "%s", err);
    uint32_t v;
    cr_assert_eq(gguf_get_u32(&g, "gpt-oss.expert_feed_forward_length", &v), 0);
    cr_assert_eq(v, 64);
    cr_assert_eq(gguf_get_u32(&g, "gpt-oss.attention.sliding_window", &v), 0);
    cr_assert_eq(v, 4);
    struct { const char *name; uint32_t nd; uint64_t a, b, c; uint32_t type; } want[] = {
        {"blk.0.attn_q.bias", 1, 256, 1, 1, GGML_TYPE_F32},       {"blk.0.attn_output.bias", 1, 128, 1, 1, GGML_TYPE_F32},
        {"blk.0.attn_sinks.weight", 1, 4, 1, 1, GGML_TYPE_F32},   {"blk.0.post_attention_norm.weight", 1, 128, 1, 1, GGML_TYPE_F32},
        {"blk.3.ffn_gate_inp.bias", 1, 8, 1, 1, GGML_TYPE_F32},   {"blk.3.ffn_gate_exps.bias", 2, 64, 8, 1, GGML_TYPE_F32},
        {"blk.3.ffn_up_exps.bias", 2, 64, 8, 1, GGML_TYPE_F32},   {"blk.3.ffn_down_exps.bias", 2, 128, 8, 1, GGML_TYPE_F32},
        {"blk.3.ffn_gate_exps.weight", 3, 128, 64, 8, GGML_TYPE_MXFP4},
        {"blk.3.ffn_down_exps.weight", 3, 64, 128, 8, GGML_TYPE_MXFP4},
        {"blk.0.attn_q.weight", 2, 128, 256, 1, GGML_TYPE_Q8_0}, {"blk.0.attn_output.weight", 2, 256, 128, 1, GGML_TYPE_Q8_0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, want[i].name);
        cr_assert(t, "%s missing", want[i].name);
        cr_assert(t->n_dims == want[i].nd && t->ne[0] == want[i].a && t->ne[1] == want[i].b && t->ne[2] == want[i].c,
                  "%s: %u dims [%llu, %llu, %llu]", want[i].name, t->n_dims, (unsigned long long)t->ne[0],
                  (unsigned long long)t->ne[1], (unsigned long long)t->ne[2]);
        cr_assert_eq(t->type, want[i].type, "%s: type %u", want[i].name, t->type);
    }
    cr_assert_null(gguf_find_tensor(&g, "blk.0.ffn_norm.weight"));
    gguf_close(&g);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.arch, ARCH_GPTOSS);
    cr_assert_str_eq(model_arch_name(m.cfg.arch), "gpt-oss");
    cr_assert_eq(m.cfg.head_dim, 64);
    cr_assert_eq(m.cfg.rope, ROPE_NEOX);
    cr_assert(m.cfg.expert_weights_norm, "gpt-oss weighs by the softmax over the chosen experts");
    /* llama.cpp's pattern 2: even layers windowed, odd ones full */
    cr_assert_eq(model_layer_window(&m.cfg, 0), 4);
    cr_assert_eq(model_layer_window(&m.cfg, 1), 0);
    cr_assert_eq(model_layer_window(&m.cfg, 2), 4);
    cr_assert_eq(model_layer_window(&m.cfg, 3), 0);
    cr_assert(m.layers[0].bo.data && m.layers[0].attn_sinks.data && m.layers[3].down_exps_b.data);
    cr_assert(m.layers[0].ffn_norm.data, "post_attention_norm is the FFN's norm");
    /* yarn, factor 32 over 4096 at base 150000, head_dim 64: llama.cpp's correction dims are
     * pairs 8 and 18, so pairs 0-8 keep their frequency, 18 on are 32 times slower, and q and k
     * are scaled by 1 + 0.1 ln 32 */
    cr_assert_not_null(m.rope_freqs);
    cr_assert_float_eq(m.cfg.rope_mscale, 1.0f + 0.1f * logf(32.0f), 1e-6f);
    for (int i = 0; i < 32; i++) {
        double base = pow(150000.0, -2.0 * i / 64), want = i <= 8 ? base : i >= 18 ? base / 32 : 0;
        if (want != 0)
            cr_assert(fabs(m.rope_freqs[i] - want) <= 1e-6 * want, "pair %d: %g, want %g", i, m.rope_freqs[i], want);
        else
            cr_assert(m.rope_freqs[i] < base && m.rope_freqs[i] > base / 32, "pair %d ramps", i);
    }
    /* the expert biases are the layer's, not the cached expert's: gate + up + down in MXFP4 */
    cr_assert_eq(model_expert_bytes(&m, 0), (3 * 128 * 64 / 32) * 17);
    model_free(&m);

    rename_tensor(path, "blk.1.attn_sinks.weight", "blk.1.attn_sinkz.weight");
    cr_assert_eq(model_load(&m, path, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "missing tensor blk.1.attn_sinks.weight"), "message: %s", err);
    rename_tensor(path, "blk.1.attn_sinkz.weight", "blk.1.attn_sinks.weight");
    rename_tensor(path, "blk.2.ffn_up_exps.bias", "blk.2.ffn_up_exps.biaz");
    cr_assert_eq(model_load(&m, path, err, sizeof err), TIDE_EFORMAT);
    cr_assert(strstr(err, "missing tensor blk.2.ffn_up_exps.bias"), "message: %s", err);
    unlink(path);
}
