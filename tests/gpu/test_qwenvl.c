/* test_qwenvl.c - the Qwen-VL models on the GPU: M-RoPE (backend_i.rope_multi, interleaved as
 * qwen3vlmoe's and in sections as qwen2vl's) and the ViT's 2-D rope (backend_i.rope_2d) against
 * the CPU backend's; the qwen3vlmoe and qwen2vl presets end to end with M-RoPE ids
 * (e2e_parity.c's run with gpu_e2e_mrope); the three towers (qwen3vl_merger, qwen2vl_merger,
 * qwen2.5vl_merger) uploaded to the GPU against the same tower on the CPU, image embeddings
 * (deepstack features included) within 1e-3 relative RMS, and in the tensor-core layout
 * (TIDE_VISION_TC: qwenvl_encode_tc) within its products' class; the tensor-core
 * attention_full against the CPU's (vision_attention_tc); with --bench the
 * Qwen3-VL-30B-A3B-sized tower on a 1024x768 image, the switch off and on. */
#include "gpu_test.h"
#include "engine/backend_cuda.h"
#include "engine/mrope.h"
#include "vision/mmprojgen.h"
#include "vision/qwen3vl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpu_e2e(struct backend cpu, struct backend gpu, const char *name, const char *preset, int type, double lim);
extern int gpu_e2e_mrope;

static bool wanted(const char *only, const char *name) { return !only || strstr(name, only); }

/* ---- the ropes ---- */

/* n tokens of n_heads heads of hd, their ids those of a prompt with a w x h image at token 3
 * (distinct ids in every section); the GPU's rotation against the CPU's */
static void check_rope_multi(const char *name, int n, int n_heads, int hd, const uint32_t sec[4], bool interleaved)
{
    int32_t *pos = malloc(sizeof(int32_t) * 4 * (size_t)n);
    struct mrope_image im = {.at = 3, .nx = 6, .ny = (uint32_t)(n - 8) / 6};
    mrope_positions((uint32_t)n, 100, &im, 1, pos);
    size_t len = (size_t)n * n_heads * hd;
    float *v = rand_vec(len, 1.0f), *dv = dev_put(v, sizeof(float) * len);
    cpu.i->rope_multi(cpu.ctx, v, n, n_heads, hd, pos, 1e6f, sec, interleaved);
    gpu.i->rope_multi(gpu.ctx, dv, n, n_heads, hd, pos, 1e6f, sec, interleaved);
    float *got = dev_get(dv, len);
    double e = relerr(got, v, len);
    verdict(name, e < 1e-6, "relerr %.2e", e);
    gpu.i->free(gpu.ctx, dv);
    free(v), free(got), free(pos);
}

static void check_rope_2d(const char *name, int n, int n_heads, int hd)
{
    int32_t *pos = malloc(sizeof(int32_t) * 2 * (size_t)n);
    for (int i = 0; i < n; i++) /* a 2x2-block order over a grid 32 patches wide */
        pos[2 * i] = (i / 4) / 16 * 2 + (i % 4) / 2, pos[2 * i + 1] = (i / 4) % 16 * 2 + i % 2;
    size_t len = (size_t)n * n_heads * hd;
    float *v = rand_vec(len, 1.0f), *dv = dev_put(v, sizeof(float) * len);
    cpu.i->rope_2d(cpu.ctx, v, n, n_heads, hd, pos, 10000.0f);
    gpu.i->rope_2d(gpu.ctx, dv, n, n_heads, hd, pos, 10000.0f);
    float *got = dev_get(dv, len);
    double e = relerr(got, v, len);
    verdict(name, e < 1e-6, "relerr %.2e", e);
    gpu.i->free(gpu.ctx, dv);
    free(v), free(got), free(pos);
}

/* ---- the towers ---- */

/* an 8-bit RGB test picture: gradients, a bright square and a little noise */
static uint8_t *picture(int w, int h)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    uint32_t s = 7;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            s = s * 1664525u + 1013904223u;
            bool sq = x > w / 4 && x < w / 2 && y > h / 3 && y < 2 * h / 3;
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(sq ? 230 : 255 * x / w);
            p[1] = (uint8_t)(sq ? 40 : 255 * y / h);
            p[2] = (uint8_t)((x * 7 + y * 3 + (s >> 28)) & 255);
        }
    return rgb;
}

/* How encode_tower runs a tower: tc 0 (the f32 layout), 1 (TIDE_VISION_TC=1's tensor-core
 * layout: the file's q8_0 / f16 kept, else f16) or 2 (TIDE_VISION_TC=f16's: every product f16),
 * the CUDA attention_full's switch set with it; lim: the relative RMS allowed against the CPU;
 * reps > 0: also the warm encode time; vs_cpu false (the benchmark): no CPU run; ref (optional):
 * embeddings to report the relative RMS against (the benchmark's f32 GPU run); keep (optional):
 * the GPU's embeddings handed back (malloc'ed). */
struct tower_run {
    int tc;
    double lim;
    int reps;
    bool vs_cpu;
    const float *ref;
    float **keep;
};

/* Encode a w x h picture with the tower in `file` on the CPU (qwen3vl_load, the CPU backend's
 * ops) and uploaded to the GPU; relative RMS < r->lim over every output float (deepstack
 * features included); the device memory is exactly the estimate (the layout's weights and
 * the workspace) and comes back. */
static void encode_tower(const char *name, const char *file, int w, int h, const struct tower_run *r)
{
    char err[300] = "";
    struct qwen3vl_tower *tc = NULL, *host = NULL, *tg = NULL;
    struct clip_alloc pa = {pinned_alloc, pinned_free, NULL};
    int old_tc = qwen3vl_set_tc(r->tc), old_att = cuda_set_vision_tc(r->tc != 0);
    double t0 = now_s();
    int rc = r->tc ? qwen3vl_load_tc(file, &pa, &host, err, sizeof err) : qwen3vl_load_with(file, &pa, &host, err, sizeof err);
    double t_load = now_s() - t0;
    if (!rc && r->vs_cpu)
        rc = qwen3vl_load(file, &tc, err, sizeof err);
    if (rc) {
        printf("FAIL %s (load: %s)\n", name, err);
        n_fail++;
        qwen3vl_free(tc), qwen3vl_free(host);
        qwen3vl_set_tc(old_tc), cuda_set_vision_tc(old_att);
        return;
    }
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(host);
    int a = hp->patch * hp->merge, n_patch = (w / hp->patch) * (h / hp->patch), n_tok = (w / a) * (h / a);
    int row = hp->n_embd_text * (1 + hp->n_deepstack);
    size_t wbytes = r->tc ? qwen3vl_weight_bytes_tc(hp) : qwen3vl_weight_bytes(hp);
    struct dev_count cnt = {0};
    struct clip_alloc da = {dev_count_alloc, dev_count_free, &cnt};
    t0 = now_s();
    rc = qwen3vl_upload(&tg, host, &da, &gpu, n_patch, err, sizeof err);
    gpu.i->sync(gpu.ctx);
    double t_up = now_s() - t0;
    if (rc) {
        printf("FAIL %s (upload: %s)\n", name, err);
        n_fail++;
        qwen3vl_free(tc), qwen3vl_free(host);
        qwen3vl_set_tc(old_tc), cuda_set_vision_tc(old_att);
        return;
    }
    bool sizes = cnt.live == wbytes + qwen3vl_workspace_bytes(hp, n_patch);
    uint8_t *rgb = picture(w, h);
    size_t nout = (size_t)n_tok * row;
    float *oc = malloc(sizeof(float) * nout), *og = malloc(sizeof(float) * nout), *og2 = malloc(sizeof(float) * nout);
    t0 = now_s();
    int rcc = r->vs_cpu ? qwen3vl_encode(tc, &cpu, rgb, w, h, oc, err, sizeof err) : 0;
    double t_cpu = now_s() - t0;
    t0 = now_s();
    int rcg = qwen3vl_encode(tg, &cpu, rgb, w, h, og, err, sizeof err); /* the uploaded tower takes its own */
    double t_cold = now_s() - t0, t_warm = 0;
    for (int i = 0; i < r->reps; i++) {
        t0 = now_s();
        qwen3vl_encode(tg, NULL, rgb, w, h, og2, err, sizeof err);
        double t = now_s() - t0;
        t_warm = i == 0 || t < t_warm ? t : t_warm;
    }
    char ce[300] = "";
    int cerr = backend_cuda_error(&gpu, ce, sizeof ce);
    /* a larger image than the workspace was made for is refused, nothing written */
    uint8_t *big = picture(w + a, h);
    int rcb = qwen3vl_encode(tg, NULL, big, w + a, h, og2, err, sizeof err);
    double e = rcc || rcg || cerr ? INFINITY : r->vs_cpu ? relerr(og, oc, nout) : 0, ed = 0;
    if (hp->n_deepstack && r->vs_cpu) { /* the deepstack columns alone */
        double num = 0, den = 0;
        for (int k = 0; k < n_tok; k++)
            for (int c = hp->n_embd_text; c < row; c++) {
                double d = (double)og[(size_t)k * row + c] - oc[(size_t)k * row + c];
                num += d * d, den += (double)oc[(size_t)k * row + c] * oc[(size_t)k * row + c];
            }
        ed = den > 0 ? sqrt(num / den) : INFINITY;
    }
    qwen3vl_free(tg);
    printf("  %s: %dx%d image, %d patches, %d tokens x %d floats; weights %.1f MiB (%s), workspace %.1f MiB; host "
           "load (pinned) %.1f ms, upload %.1f ms; encode cpu %.1f ms, gpu cold %.1f ms%s",
           name, w, h, n_patch, n_tok, row, wbytes / 1048576.0,
           r->tc == 2 ? "tc, f16" : r->tc ? "tc" : "f32", qwen3vl_workspace_bytes(hp, n_patch) / 1048576.0,
           t_load * 1e3, t_up * 1e3, t_cpu * 1e3, t_cold * 1e3, r->reps ? "" : "\n");
    if (r->reps)
        printf(", warm %.1f ms\n", t_warm * 1e3);
    if (cerr)
        printf("  %s: CUDA error %s\n", name, ce);
    if (hp->n_deepstack && r->vs_cpu)
        printf("  %s: deepstack features alone relerr %.2e\n", name, ed);
    if (r->ref)
        printf("  %s: relative RMS against the f32 layout's GPU embeddings %.2e\n", name,
               cerr ? INFINITY : relerr(og, r->ref, nout));
    if (!sizes)
        printf("  %s: allocated %zu bytes, estimated %zu + %zu\n", name, cnt.peak, wbytes,
               qwen3vl_workspace_bytes(hp, n_patch));
    if (rcb != TIDE_ERANGE)
        printf("  %s: an image over the workspace gave %d, not TIDE_ERANGE\n", name, rcb);
    verdict(name, e < r->lim && ed < r->lim && sizes && cnt.live == 0 && rcb == TIDE_ERANGE, "relerr %.2e", e);
    if (r->keep)
        *r->keep = og;
    else
        free(og);
    free(rgb), free(big), free(oc), free(og2);
    qwen3vl_free(host);
    qwen3vl_free(tc);
    qwen3vl_set_tc(old_tc), cuda_set_vision_tc(old_att);
}

/* The towers' files: kind 3 (qwen3vl_merger, deepstack after blocks 1 and 2), 2 (qwen2vl), 25
 * (qwen2.5vl); type -1: f16; D, F 0: mmprojgen's 64 and 128 */
struct tower_file { const char *name, *file; int kind, w, h, type; uint32_t D, F; };

static bool write_file(const struct tower_file *v)
{
    char err[200];
    struct mmprojgen_options o = {.out = v->file, .seed = 3, .type = v->type, .n_embd = v->D, .n_ff = v->F};
    int rc = v->kind == 3 ? mmprojgen_write_qwen3vl(&o, 2, err, sizeof err)
                          : mmprojgen_write_qwen2vl(&o, v->kind == 25, err, sizeof err);
    if (rc) {
        printf("FAIL %s (mmprojgen: %s)\n", v->name, err);
        n_fail++;
    }
    return rc == 0;
}

static void test_towers(void)
{
    struct tower_file v[] = {
        /* 64x48 on the 8x8 table: the table interpolated (rows squeezed); deepstack after 1, 2 */
        {"qwenvl_encode qwen3vl", "/tmp/tide-gpu-q3v.gguf", 3, 96, 48, -1, 0, 0},
        {"qwenvl_encode qwen3vl f32", "/tmp/tide-gpu-q3v-f32.gguf", 3, 64, 80, GGML_TYPE_F32, 0, 0},
        {"qwenvl_encode qwen3vl q8_0", "/tmp/tide-gpu-q3v-q8.gguf", 3, 64, 64, GGML_TYPE_Q8_0, 0, 0},
        {"qwenvl_encode qwen2vl", "/tmp/tide-gpu-q2v.gguf", 2, 80, 64, -1, 0, 0},
        /* 224x168: 8x6 merged tokens, 112-pixel windows of 4x4: four windows, two of them cut */
        {"qwenvl_encode qwen25vl", "/tmp/tide-gpu-q25v.gguf", 25, 224, 168, -1, 0, 0},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!write_file(&v[i]))
            continue;
        struct tower_run r = {.tc = 0, .lim = 1e-3, .reps = 3, .vs_cpu = true};
        encode_tower(v[i].name, v[i].file, v[i].w, v[i].h, &r);
        remove(v[i].file);
    }
}

/* The tensor-core layout (TIDE_VISION_TC) against the CPU's f32 tower. Tolerances of the
 * products' class: f16 (weights and x rounded to f16, f16 attention: each ~2^-11 relative;
 * 4.4e-4 measured for the f16 weights alone through the CPU backend, test_qwen3vl_tc.c) 5e-3;
 * q8_0 (x quantised to int8 blocks, as llama.cpp's q8_0 products: 1.07e-2 through the CPU
 * backend) 3e-2. The towers 128 wide keep q8_0 (rows of 128: the int8 mma path); 64 wide, q8_0
 * goes f16. 16x12 merged tokens: products of n >= 16 (the mma kernels), attention over 768
 * patches; qwen25vl: 224x168, its windows of 64 patches and its full blocks. */
static void test_towers_tc(void)
{
    struct { struct tower_file f; int tc; double lim; } v[] = {
        {{"qwenvl_encode_tc qwen3vl f16", "/tmp/tide-gpu-q3v-tc.gguf", 3, 256, 192, -1, 128, 256}, 1, 5e-3},
        {{"qwenvl_encode_tc qwen3vl f32 file", "/tmp/tide-gpu-q3v-tc-f32.gguf", 3, 96, 48, GGML_TYPE_F32, 0, 0}, 1, 5e-3},
        {{"qwenvl_encode_tc qwen3vl q8_0", "/tmp/tide-gpu-q3v-tc-q8.gguf", 3, 256, 192, GGML_TYPE_Q8_0, 128, 256}, 1, 3e-2},
        {{"qwenvl_encode_tc qwen3vl q8_0 as f16", "/tmp/tide-gpu-q3v-tc-q8f.gguf", 3, 256, 192, GGML_TYPE_Q8_0, 128, 256}, 2, 5e-3},
        {{"qwenvl_encode_tc qwen2vl", "/tmp/tide-gpu-q2v-tc.gguf", 2, 256, 192, -1, 128, 256}, 1, 5e-3},
        {{"qwenvl_encode_tc qwen25vl", "/tmp/tide-gpu-q25v-tc.gguf", 25, 224, 168, -1, 0, 0}, 1, 5e-3},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!write_file(&v[i].f))
            continue;
        struct tower_run r = {.tc = v[i].tc, .lim = v[i].lim, .reps = 3, .vs_cpu = true};
        encode_tower(v[i].f.name, v[i].f.file, v[i].f.w, v[i].f.h, &r);
        remove(v[i].f.file);
    }
}

/* ---- the tensor-core attention (attention_full_mma.cu) ---- */

/* The GPU's attention_full with TIDE_VISION_TC on (the f16 tensor-core kernel) against the CPU
 * backend's f32 one: q, k, v rounded to f16 and the probabilities too, f32 sums; relative RMS
 * under 3e-3 (the causal tensor-core kernel's bound, attention_prefill.cu). bench: the time of
 * one call with the switch off (attention_full_kernel) and on, no CPU. */
static void check_attention_tc(int P, int n_head, int d, bool bench)
{
    size_t n = (size_t)P * n_head * d, wsf = attention_full_ws_floats(P, d);
    float *q = rand_vec(n, 1.0f), *k = rand_vec(n, 1.0f), *v = rand_vec(n, 1.0f);
    float *dq = dev_put(q, sizeof(float) * n), *dk = dev_put(k, sizeof(float) * n), *dv = dev_put(v, sizeof(float) * n);
    float *dout = dev_put(NULL, sizeof(float) * n), *dws = dev_put(NULL, sizeof(float) * wsf);
    char name[96];
    int old = cuda_set_vision_tc(1);
    if (bench) {
        double t[2];
        for (int on = 0; on < 2; on++) {
            cuda_set_vision_tc(on);
            gpu.i->attention_full(gpu.ctx, dq, dk, dv, dout, P, n_head, d, dws); /* warm-up */
            gpu.i->sync(gpu.ctx);
            double t0 = now_s();
            for (int r = 0; r < 5; r++)
                gpu.i->attention_full(gpu.ctx, dq, dk, dv, dout, P, n_head, d, dws);
            gpu.i->sync(gpu.ctx);
            t[on] = (now_s() - t0) / 5;
        }
        double flop = 4.0 * P * (double)P * d * n_head;
        printf("  bench_qwenvl attention_full P=%d heads=%d d=%d: f32 kernel %.3f ms, tensor cores %.3f ms "
               "(%.1f TFLOP/s at %.2f GFLOP)\n", P, n_head, d, t[0] * 1e3, t[1] * 1e3, flop / t[1] * 1e-12, flop * 1e-9);
    } else {
        float *ref = malloc(sizeof(float) * n), *ws = malloc(sizeof(float) * wsf);
        cpu.i->attention_full(cpu.ctx, q, k, v, ref, P, n_head, d, ws);
        dev_poison(dout, sizeof(float) * n);
        gpu.i->attention_full(gpu.ctx, dq, dk, dv, dout, P, n_head, d, dws);
        float *got = dev_get(dout, n);
        snprintf(name, sizeof name, "vision_attention_tc P=%d heads=%d d=%d", P, n_head, d);
        double e = relerr(got, ref, n);
        verdict(name, e < 3e-3, "relerr %.2e", e);
        free(ref), free(ws), free(got);
    }
    cuda_set_vision_tc(old);
    gpu.i->free(gpu.ctx, dq), gpu.i->free(gpu.ctx, dk), gpu.i->free(gpu.ctx, dv);
    gpu.i->free(gpu.ctx, dout), gpu.i->free(gpu.ctx, dws);
    free(q), free(k), free(v);
}

static void test_attention_tc(void)
{
    /* Qwen3-VL's heads (72: padded to 80 for the k steps), Qwen2.5-VL's (80), CLIP-L's (64);
     * P not a multiple of the 64-row tiles; 3072: a 1024x768 image (4 heads keep the CPU's
     * reference short; the heads are independent CTAs) */
    check_attention_tc(100, 16, 72, false);
    check_attention_tc(100, 16, 80, false);
    check_attention_tc(1024, 16, 72, false);
    check_attention_tc(1024, 16, 80, false);
    check_attention_tc(3000, 4, 72, false);
    check_attention_tc(3072, 4, 80, false);
    check_attention_tc(577, 16, 64, false);
    check_attention_tc(64, 16, 80, false); /* one qwen25vl window */
}

/* Qwen3-VL-30B-A3B's tower (27 blocks of 1152, q8_0 in the file; ffn_down f16, its rows of
 * 4304 not whole q8_0 blocks) on a 1024x768 image (the dynres size of it: 1024x768, 3072
 * patches, 768 tokens): the GPU's load, upload and encode times in the f32 layout (the default)
 * and with TIDE_VISION_TC=1 and =f16, their embeddings against the f32 layout's (the CPU would
 * take minutes; qwenvl_encode(_tc) check the numbers), and the attention alone, switch off and
 * on. The encode's arithmetic: products 2.72 TFLOP, attention 1.17 TFLOP (docs/VISION.md). */
static void bench_tower(void)
{
    const char *file = "/tmp/tide-gpu-q3v-30b.gguf";
    struct mmprojgen_options o = {.out = file, .seed = 5, .type = GGML_TYPE_Q8_0};
    char err[200];
    double t0 = now_s();
    if (mmprojgen_write_qwen3vl_30b(&o, err, sizeof err)) {
        printf("FAIL bench_qwenvl (mmprojgen: %s)\n", err);
        n_fail++;
        return;
    }
    printf("  bench_qwenvl: the Qwen3-VL-30B-A3B-sized tower written in %.1f s\n", now_s() - t0);
    check_attention_tc(3072, 16, 72, true);
    float *ref = NULL;
    struct tower_run off = {.tc = 0, .lim = 1e-3, .reps = 3, .vs_cpu = false, .keep = &ref};
    encode_tower("bench_qwenvl qwen3vl-30b 1024x768", file, 1024, 768, &off);
    struct tower_run on = {.tc = 1, .lim = 1e-3, .reps = 3, .vs_cpu = false, .ref = ref};
    encode_tower("bench_qwenvl qwen3vl-30b 1024x768 TIDE_VISION_TC=1", file, 1024, 768, &on);
    on.tc = 2;
    encode_tower("bench_qwenvl qwen3vl-30b 1024x768 TIDE_VISION_TC=f16", file, 1024, 768, &on);
    free(ref);
    remove(file);
}

void test_qwenvl(const char *only, bool bench)
{
    static const uint32_t q3[4] = {24, 20, 20, 0}, q2[4] = {16, 24, 24, 0}, small[4] = {6, 5, 5, 0};
    if (wanted(only, "qwenvl_rope_multi")) {
        check_rope_multi("qwenvl_rope_multi interleaved 24,20,20 hd 128", 70, 8, 128, q3, true);
        check_rope_multi("qwenvl_rope_multi sections 16,24,24 hd 128", 70, 4, 128, q2, false);
        /* sections over fewer pairs than a head has: they repeat (llama.cpp's sector) */
        check_rope_multi("qwenvl_rope_multi interleaved 6,5,5 hd 64", 33, 3, 64, small, true);
        check_rope_multi("qwenvl_rope_multi sections 6,5,5 hd 64", 33, 3, 64, small, false);
    }
    if (wanted(only, "qwenvl_rope_2d")) {
        check_rope_2d("qwenvl_rope_2d hd 72 (Qwen3-VL)", 3072, 16, 72);
        check_rope_2d("qwenvl_rope_2d hd 80 (Qwen2.5-VL)", 100, 16, 80);
    }
    /* the text models with M-RoPE ids: greedy tokens and logits, GPU against CPU */
    gpu_e2e_mrope = 1;
    if (wanted(only, "e2e_mrope_qwen3vlmoe") && !gpu_e2e(cpu, gpu, "e2e_mrope_qwen3vlmoe", "qwen3vlmoe", -1, 1e-3))
        n_fail++;
    if (wanted(only, "e2e_mrope_qwen2vl") && !gpu_e2e(cpu, gpu, "e2e_mrope_qwen2vl", "qwen2vl", -1, 1e-3))
        n_fail++;
    gpu_e2e_mrope = 0;
    if (wanted(only, "qwenvl_encode"))
        test_towers();
    if (wanted(only, "qwenvl_encode_tc"))
        test_towers_tc();
    if (wanted(only, "vision_attention_tc"))
        test_attention_tc();
    if (bench && wanted(only, "bench_qwenvl"))
        bench_tower();
}
