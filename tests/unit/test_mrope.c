/* test_mrope.c - the Qwen-VL text side: M-RoPE (src/engine/mrope.c) and the qwen3vlmoe and qwen2vl
 * model files (modelgen's preset, model.c's loader). The section rules are llama.cpp's (ggml's rope
 * multi mode); the position ids of image tokens are mtmd's (t, row, column from the image's
 * start, the image advancing the position by max(nx, ny)). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/modelgen.h"
#include "engine/mrope.h"
#include "engine/backend.h"
#include "engine/forward.h"

/* Qwen3-VL-30B-A3B's sections (pairs of a 128-wide head), interleaved: t h w t h w ... for 60
 * pairs, then pair 60 and 63 are t (t's 24 reach pair 72) and 61, 62 the extra id. */
Test(mrope, qwen3vl_interleaved_sections)
{
    const uint32_t sec[4] = {24, 20, 20, 0};
    for (int i = 0; i < 60; i++)
        cr_assert_eq(mrope_section_of(sec, true, i), i % 3, "pair %d", i);
    cr_assert_eq(mrope_section_of(sec, true, 60), MROPE_T);
    cr_assert_eq(mrope_section_of(sec, true, 61), MROPE_E);
    cr_assert_eq(mrope_section_of(sec, true, 62), MROPE_E);
    cr_assert_eq(mrope_section_of(sec, true, 63), MROPE_T);
    /* Qwen2-VL's layout: the sections one after the other */
    const uint32_t q2[4] = {16, 24, 24, 0};
    cr_assert_eq(mrope_section_of(q2, false, 15), MROPE_T);
    cr_assert_eq(mrope_section_of(q2, false, 16), MROPE_H);
    cr_assert_eq(mrope_section_of(q2, false, 39), MROPE_H);
    cr_assert_eq(mrope_section_of(q2, false, 40), MROPE_W);
    cr_assert_eq(mrope_section_of(q2, false, 63), MROPE_W);
    /* the small preset's 16 pairs */
    const uint32_t small[4] = {6, 5, 5, 0};
    int want[16] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0};
    for (int i = 0; i < 16; i++)
        cr_assert_eq(mrope_section_of(small, true, i), want[i], "pair %d", i);
}

/* A unit vector in pair i turns by pos[section] * theta^(-2i/d); the same ids in every
 * section give plain NEOX rope at that position. */
Test(mrope, rotation_angles)
{
    enum { HD = 32, HALF = HD / 2, NH = 2 };
    const uint32_t sec[4] = {6, 5, 5, 0};
    const float theta = 5e6f;
    int32_t pos[2 * MROPE_N] = {7, 9, 12, 0, /* an image token */ 5, 5, 5, 5 /* a text token */};
    float v[2 * NH * HD];
    for (int i = 0; i < 2 * NH * HD; i++)
        v[i] = 0;
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HALF; i++)
                v[(t * NH + h) * HD + i] = 1.0f; /* x0 = 1, x1 = 0: the pair becomes (cos, sin) */
    mrope_rotate(v, 2, NH, HD, pos, theta, sec, true);
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HALF; i++) {
                int p = t == 1 ? 5 : (int[]){7, 9, 12}[i % 3];
                double a = p * pow(theta, -2.0 * i / HD);
                cr_assert_float_eq(v[(t * NH + h) * HD + i], cos(a), 1e-6, "t %d pair %d", t, i);
                cr_assert_float_eq(v[(t * NH + h) * HD + i + HALF], sin(a), 1e-6, "t %d pair %d", t, i);
            }
}

/* Two images of different sizes in one prompt: 3 text tokens, a 4x2 image (8 tokens), 2 text
 * tokens, a 3x5 image (15 tokens), 1 text token; the sequence's next position is 10. */
Test(mrope, positions_two_images)
{
    struct mrope_image im[2] = {{.at = 3, .nx = 4, .ny = 2}, {.at = 13, .nx = 3, .ny = 5}};
    enum { N = 3 + 8 + 2 + 15 + 1 };
    int32_t pos[N * MROPE_N];
    int64_t next = mrope_positions(N, 10, im, 2, pos);
    /* text 10, 11, 12; image A at 13 spans max(4, 2) = 4: text 17, 18; image B at 19 spans
     * max(3, 5) = 5; the last text token 24; the next position 25 */
    cr_assert_eq(next, 25);
    int32_t want[N][4] = {
        {10, 10, 10, 10}, {11, 11, 11, 11}, {12, 12, 12, 12},
        {13, 13, 13, 0}, {13, 13, 14, 0}, {13, 13, 15, 0}, {13, 13, 16, 0},
        {13, 14, 13, 0}, {13, 14, 14, 0}, {13, 14, 15, 0}, {13, 14, 16, 0},
        {17, 17, 17, 17}, {18, 18, 18, 18},
        {19, 19, 19, 0}, {19, 19, 20, 0}, {19, 19, 21, 0},
        {19, 20, 19, 0}, {19, 20, 20, 0}, {19, 20, 21, 0},
        {19, 21, 19, 0}, {19, 21, 20, 0}, {19, 21, 21, 0},
        {19, 22, 19, 0}, {19, 22, 20, 0}, {19, 22, 21, 0},
        {19, 23, 19, 0}, {19, 23, 20, 0}, {19, 23, 21, 0},
        {24, 24, 24, 24},
    };
    for (int t = 0; t < N; t++)
        for (int s = 0; s < MROPE_N; s++)
            cr_assert_eq(pos[t * MROPE_N + s], want[t][s], "token %d section %d: %d, want %d", t, s,
                         pos[t * MROPE_N + s], want[t][s]);
    /* an image past the prompt's end, or two that overlap, is an error */
    struct mrope_image past = {.at = 25, .nx = 3, .ny = 2};
    cr_assert_lt(mrope_positions(N, 0, &past, 1, pos), 0);
    struct mrope_image overlap[2] = {{.at = 0, .nx = 2, .ny = 2}, {.at = 3, .nx = 1, .ny = 1}};
    cr_assert_lt(mrope_positions(N, 0, overlap, 2, pos), 0);
    /* text only: the usual positions */
    cr_assert_eq(mrope_positions(4, 2, NULL, 0, pos), 6);
    cr_assert_eq(pos[3 * MROPE_N + MROPE_W], 5);
}

enum { N_TOK = 6 };

/* A preset written and loaded, and with run its forward on the CPU backend with the logits of
 * tokens 40..45 at positions 0.. under plain rope: the set-up the tests below share. */
struct preset_run {
    char path[64];
    struct model m;
    struct modelgen_summary s;
    bool run;
    struct backend be;
    struct forward_state f;
    int toks[N_TOK];
    float *plain;
    int32_t ids[N_TOK * 4]; /* the rows' M-RoPE ids (ids_plain, ids_grid) */
};

static void preset_open(struct preset_run *r, const char *preset, const char *tag, int seed, int type, bool run)
{
    char err[200] = "";
    snprintf(r->path, sizeof r->path, "/tmp/tide-test-%s-%d.gguf", tag, (int)getpid());
    struct modelgen_options o = {.preset = preset, .out = r->path, .seed = (uint64_t)seed, .type = type, .threads = 1};
    cr_assert_eq(modelgen_write(&o, &r->s, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_load(&r->m, r->path, err, sizeof err), 0, "%s", err);
    r->run = run;
    if (!run)
        return;
    cr_assert_eq(backend_cpu_init(&r->be, 1), 0);
    cr_assert_eq(forward_init(&r->f, &r->m, r->be, 64), 0);
    for (int t = 0; t < N_TOK; t++)
        r->toks[t] = 40 + t;
    r->plain = malloc(sizeof(float) * r->m.cfg.n_vocab);
    cr_assert_eq(forward_eval(&r->f, r->toks, N_TOK, 0), 0);
    memcpy(r->plain, r->f.logits, sizeof(float) * r->m.cfg.n_vocab);
}

static void preset_close(struct preset_run *r)
{
    if (r->run) {
        free(r->plain);
        forward_free(&r->f);
        backend_cpu_free(&r->be);
    }
    model_free(&r->m);
    unlink(r->path);
}

/* every row's four ids its position (a text token's) */
static void ids_plain(int32_t *ids)
{
    for (int t = 0; t < N_TOK * 4; t++)
        ids[t] = t / 4;
}

/* an image's ids: a 3x2 grid at 0 (t 0, h 0..1, w 0..2) */
static void ids_grid(int32_t *ids)
{
    for (int t = 0; t < N_TOK; t++) {
        ids[t * 4 + 0] = 0;
        ids[t * 4 + 1] = t / 3;
        ids[t * 4 + 2] = t % 3;
        ids[t * 4 + 3] = 0;
    }
}

/* What both forward tests start with: the preset's forward over the tokens with M-RoPE ids
 * equal to their positions gives plain rope's logits bit for bit, and with an image grid's
 * ids other logits. Returns the batch entry as it was last run (the grid ids, its logits). */
static struct forward_seq plain_then_grid(struct preset_run *r)
{
    uint32_t V = r->m.cfg.n_vocab;
    ids_plain(r->ids);
    struct forward_seq q = {.slot = 0, .pos = 0, .n = N_TOK, .tokens = r->toks, .mpos = r->ids, .want_logits = true};
    cr_assert_eq(forward_eval_batch(&r->f, &q, 1), 0);
    cr_assert_eq(memcmp(q.logits, r->plain, sizeof(float) * V), 0, "M-RoPE with equal ids is plain rope");
    ids_grid(r->ids);
    cr_assert_eq(forward_eval_batch(&r->f, &q, 1), 0);
    cr_assert_neq(memcmp(q.logits, r->plain, sizeof(float) * V), 0, "grid ids rotate differently");
    return q;
}

/* Qwen-VL's vision tokens at the end of the preset's vocabulary */
static void has_vision_tokens(const struct preset_run *r)
{
    const struct gguf_kv *tok = gguf_find_kv(&r->m.gguf, "tokenizer.ggml.tokens");
    const char *vis[3] = {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"};
    for (int i = 0; i < 3; i++)
        cr_assert(gguf_str_eq(tok->v.arr.strs[r->s.n_vocab - 3 + i], vis[i]), "%s", vis[i]);
}

/* The qwen3vlmoe preset as llama.cpp reads it (src/models/qwen3vlmoe.cpp there): qwen3moe's
 * tensors, rope.dimension_sections and n_deepstack_layers, Qwen-VL's vision tokens. */
Test(mrope, qwen3vlmoe_preset_loads)
{
    struct preset_run r;
    preset_open(&r, "qwen3vlmoe", "q3vl", 1, -1, false);
    const struct model_config *c = &r.m.cfg;
    cr_assert_eq(c->arch, ARCH_QWEN3VLMOE);
    cr_assert_str_eq(model_arch_name(c->arch), "qwen3vlmoe");
    cr_assert_eq(c->rope, ROPE_NEOX);
    cr_assert_eq(c->rope_sections[0], 6);
    cr_assert_eq(c->rope_sections[1], 5);
    cr_assert_eq(c->rope_sections[2], 5);
    cr_assert_eq(c->rope_sections[3], 0);
    cr_assert_eq(c->n_deepstack, 2);
    cr_assert_eq(c->rope_theta, 5e6f);
    cr_assert(c->expert_weights_norm);
    cr_assert(r.m.layers[0].q_norm.data && r.m.layers[0].k_norm.data, "QK-norm as qwen3moe");
    cr_assert_eq(c->n_vocab, r.s.n_vocab);
    has_vision_tokens(&r);
    preset_close(&r);
}

/* The forward's hooks on the qwen3vlmoe preset (engine/forward_eval.c): rows given M-RoPE ids
 * that are all the KV position give plain rope's logits bit for bit (the op-by-op path with
 * backend_i.rope_multi against the usual one); input rows wider than n_embd add their slices
 * to the first n_deepstack layers' outputs: zero slices change nothing, others change the
 * logits; and ids of an image grid change them too. */
Test(mrope, forward_hooks_on_the_preset)
{
    struct preset_run r;
    preset_open(&r, "qwen3vlmoe", "q3vl-fw", 2, GGML_TYPE_F32, true);
    enum { E = 96 };
    uint32_t V = r.m.cfg.n_vocab;
    float *got = malloc(sizeof(float) * V);
    plain_then_grid(&r);
    /* embedding rows: the tokens' own, then two deepstack slices */
    static float rows[N_TOK * 3 * E];
    memset(rows, 0, sizeof rows);
    const struct tensor *te = &r.m.tok_embd;
    for (int t = 0; t < N_TOK; t++)
        ggml_dequantize(te->type, (const uint8_t *)te->data + (size_t)r.toks[t] * te->row_bytes,
                        rows + (size_t)t * 3 * E, E);
    ids_plain(r.ids);
    struct forward_seq qe = {.slot = 0, .pos = 0, .n = N_TOK, .embd = rows, .embd_stride = 3 * E, .mpos = r.ids,
                             .want_logits = true};
    cr_assert_eq(forward_eval_batch(&r.f, &qe, 1), 0);
    cr_assert_eq(memcmp(qe.logits, r.plain, sizeof(float) * V), 0, "zero deepstack slices add nothing");
    for (int t = 0; t < N_TOK; t++)
        rows[(size_t)t * 3 * E + 2 * E + 5] = 3.0f; /* slice 2: after layer 1 */
    cr_assert_eq(forward_eval_batch(&r.f, &qe, 1), 0);
    memcpy(got, qe.logits, sizeof(float) * V);
    cr_assert_neq(memcmp(got, r.plain, sizeof(float) * V), 0, "a deepstack slice reaches the logits");
    qe.embd_stride = E - 1;
    cr_assert_eq(forward_eval_batch(&r.f, &qe, 1), TIDE_EINVAL);
    free(got);
    preset_close(&r);
}

/* The qwen2vl preset as llama.cpp reads it (src/models/qwen2vl.cpp there): Qwen2 dense with
 * q/k/v biases, rope.dimension_sections laid one after the other, no deepstack, Qwen-VL's
 * vision tokens. */
Test(mrope, qwen2vl_preset_loads)
{
    struct preset_run r;
    preset_open(&r, "qwen2vl", "q2vl", 1, -1, false);
    const struct model_config *c = &r.m.cfg;
    cr_assert_eq(c->arch, ARCH_QWEN2VL);
    cr_assert_str_eq(model_arch_name(c->arch), "qwen2vl");
    cr_assert_eq(c->rope, ROPE_NEOX);
    uint32_t want[4] = {4, 6, 6, 0};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(c->rope_sections[i], want[i], "section %d", i);
    cr_assert_not(c->rope_sections_interleaved);
    cr_assert_eq(c->n_deepstack, 0);
    cr_assert_eq(c->n_expert, 0);
    cr_assert_eq(c->n_ff, 256);
    cr_assert_eq(c->rope_theta, 1e6f);
    cr_assert(r.m.layers[0].bq.data && r.m.layers[0].bk.data && r.m.layers[0].bv.data, "q/k/v biases");
    cr_assert_null(r.m.layers[0].q_norm.data);
    has_vision_tokens(&r);
    preset_close(&r);
}

/* On the qwen2vl preset the forward's M-RoPE rows follow the file's section layout: equal ids
 * are plain rope bit for bit, an image grid's ids change the logits, and the same grid read as
 * interleaved sections (qwen3vlmoe's layout) gives other logits again. */
Test(mrope, qwen2vl_forward_takes_sections_in_order)
{
    struct preset_run r;
    preset_open(&r, "qwen2vl", "q2vl-fw", 2, GGML_TYPE_F32, true);
    uint32_t V = r.m.cfg.n_vocab;
    float *grid = malloc(sizeof(float) * V);
    struct forward_seq q = plain_then_grid(&r);
    memcpy(grid, q.logits, sizeof(float) * V);
    r.m.cfg.rope_sections_interleaved = true;
    cr_assert_eq(forward_eval_batch(&r.f, &q, 1), 0);
    cr_assert_neq(memcmp(q.logits, grid, sizeof(float) * V), 0, "the layout of the sections matters");
    free(grid);
    preset_close(&r);
}

/* qwen2vl is dense in llama.cpp: a file of it with experts is refused by name. */
Test(mrope, qwen2vl_with_experts_is_refused)
{
    char path[64], err[200] = "";
    snprintf(path, sizeof path, "/tmp/tide-test-q2vl-moe-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "qwen2vl", .out = path, .seed = 1, .type = -1, .threads = 1,
                                 .n_expert = 4, .n_expert_used = 2};
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    struct model m;
    cr_assert_eq(model_load(&m, path, err, sizeof err), TIDE_EUNSUPPORTED);
    cr_assert(strstr(err, "qwen2vl with experts"), "%s", err);
    unlink(path);
}
