/* mkmodel.c - tide-mkmodel: command-line front end of the model generator
 * (src/engine/modelgen.c) and of the mmproj generator (src/vision/mmprojgen.c,
 * `--preset mmproj`). Writes a deterministic GGUF for a named preset. */
#include "engine/modelgen.h"
#include "engine/quant_mix.h"
#include "vision/mmprojgen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: tide-mkmodel --preset dense|moe|qwen3moe|qwen2moe|gpt-oss|olmoe|granitemoe|granitemoe-shared|deepseek2|qwen3vlmoe|qwen2vl|big|qwen3-30b-a3b|qwen3-vl-30b-a3b --out FILE [--seed N]\n"
            "       [--type f32|f16|bf16|q8_0|q4_0|q5_0|q5_1|q4_K|q5_K|q6_K|iq4_xs|mxfp4] [--down-type T]\n"
            "       [--mix Q4_K_M|Q5_K_M|Q6_K] [--layers N] [--embd N] [--heads N]\n"
            "       [--kv-heads N] [--head-dim N] [--ff N] [--experts N] [--experts-used N] [--threads N]\n"
            "       (--down-type: ffn_down and output.weight in T, e.g. q4_K with q6_K as in Q4_K_M)\n"
            "       (qwen3-30b-a3b: Qwen3-30B-A3B's shape in q8_0, ~32 GB, for benchmarks;\n"
            "       its matrices are made by --threads threads, default all CPUs)\n"
            "       tide-mkmodel --preset mmproj|mmproj-qwen3vl|mmproj-qwen3vl-30b|mmproj-qwen2vl|mmproj-qwen25vl --out FILE [--text-embd N] [--seed N]\n"
            "       [--type f32|f16|bf16|q8_0] [--layers N] [--embd N] [--heads N] [--ff N]\n"
            "       (a LLaVA-style vision tower; --text-embd is the text model's n_embd)\n");
}

int main(int argc, char **argv)
{
    struct modelgen_options o = {.preset = NULL, .out = NULL, .seed = 1, .type = -1};
    uint32_t text_embd = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        if (!v) { usage(); return 2; }
        i++;
        uint32_t u = (uint32_t)strtoul(v, NULL, 10);
        if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--out")) o.out = v;
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layers")) o.n_layer = u;
        else if (!strcmp(a, "--embd")) o.n_embd = u;
        else if (!strcmp(a, "--heads")) o.n_head = u;
        else if (!strcmp(a, "--kv-heads")) o.n_head_kv = u;
        else if (!strcmp(a, "--head-dim")) o.head_dim = u;
        else if (!strcmp(a, "--ff")) o.n_ff = u;
        else if (!strcmp(a, "--experts")) o.n_expert = u;
        else if (!strcmp(a, "--experts-used")) o.n_expert_used = u;
        else if (!strcmp(a, "--text-embd")) text_embd = u;
        else if (!strcmp(a, "--threads")) o.threads = (int)u;
        else if (!strcmp(a, "--type") || !strcmp(a, "--down-type")) {
            static const uint32_t known[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                             GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q4_K,
                                             GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
            int t = -1;
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                if (!strcmp(v, ggml_type_name(known[k]))) t = (int)known[k];
            if (t < 0) { fprintf(stderr, "tide-mkmodel: unknown type %s\n", v); return 2; }
            if (!strcmp(a, "--type")) o.type = t;
            else o.type_down = t;
        } else if (!strcmp(a, "--mix")) {
            if ((o.mix = quant_mix_parse(v)) < 0) { fprintf(stderr, "tide-mkmodel: unknown mix %s\n", v); return 2; }
        } else { fprintf(stderr, "tide-mkmodel: unknown option %s\n", a); usage(); return 2; }
    }
    if (!o.preset || !o.out) { usage(); return 2; }
    char err[256] = "";
    if (!strcmp(o.preset, "mmproj")) {
        struct mmprojgen_options m = {.out = o.out, .seed = o.seed, .type = o.type,
                                      .n_embd_text = text_embd, .n_embd = o.n_embd,
                                      .n_ff = o.n_ff, .n_head = o.n_head, .n_layer = o.n_layer};
        int rc = mmprojgen_write(&m, err, sizeof err);
        if (rc) {
            fprintf(stderr, "tide-mkmodel: %s (%s)\n", err, tide_strerror(rc));
            return 1;
        }
        printf("tide-mkmodel: %s preset 'mmproj' (text n_embd %u)\n", o.out,
               text_embd ? text_embd : 128);
        return 0;
    }
    if (!strcmp(o.preset, "mmproj-qwen3vl")) {
        struct mmprojgen_options m = {.out = o.out, .seed = o.seed, .type = o.type,
                                      .n_embd_text = text_embd, .n_embd = o.n_embd,
                                      .n_ff = o.n_ff, .n_head = o.n_head, .n_layer = o.n_layer};
        int rc = mmprojgen_write_qwen3vl(&m, 2, err, sizeof err);
        if (rc) {
            fprintf(stderr, "tide-mkmodel: %s (%s)\n", err, tide_strerror(rc));
            return 1;
        }
        printf("tide-mkmodel: %s preset 'mmproj-qwen3vl' (text n_embd %u)\n", o.out, text_embd ? text_embd : 96);
        return 0;
    }
    if (!strcmp(o.preset, "mmproj-qwen2vl") || !strcmp(o.preset, "mmproj-qwen25vl")) {
        bool q25 = !strcmp(o.preset, "mmproj-qwen25vl");
        struct mmprojgen_options m = {.out = o.out, .seed = o.seed, .type = o.type,
                                      .n_embd_text = text_embd, .n_embd = o.n_embd,
                                      .n_ff = o.n_ff, .n_head = o.n_head, .n_layer = o.n_layer};
        int rc = mmprojgen_write_qwen2vl(&m, q25, err, sizeof err);
        if (rc) {
            fprintf(stderr, "tide-mkmodel: %s (%s)\n", err, tide_strerror(rc));
            return 1;
        }
        printf("tide-mkmodel: %s preset '%s' (text n_embd %u)\n", o.out, o.preset, text_embd ? text_embd : 128);
        return 0;
    }
    if (!strcmp(o.preset, "mmproj-qwen3vl-30b")) { /* Qwen3-VL-30B-A3B's tower, real size */
        struct mmprojgen_options m = {.out = o.out, .seed = o.seed, .type = o.type};
        int rc = mmprojgen_write_qwen3vl_30b(&m, err, sizeof err);
        if (rc) {
            fprintf(stderr, "tide-mkmodel: %s (%s)\n", err, tide_strerror(rc));
            return 1;
        }
        printf("tide-mkmodel: %s preset 'mmproj-qwen3vl-30b' (text n_embd 2048)\n", o.out);
        return 0;
    }
    struct modelgen_summary s;
    int rc = modelgen_write(&o, &s, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tide-mkmodel: %s (%s)\n", err, tide_strerror(rc));
        return 1;
    }
    printf("tide-mkmodel: %s preset '%s': %llu params, vocab %u, %llu bytes\n", o.out, o.preset,
           (unsigned long long)s.n_params, s.n_vocab, (unsigned long long)s.n_bytes);
    return 0;
}
