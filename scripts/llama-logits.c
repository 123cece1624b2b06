/* llama-logits.c - llama.cpp's step-0 logits for scripts/check-llama-parity.sh: load MODEL with
 * libllama (CPU), run PROMPT as one batch (tokenised as llama-simple does: the vocabulary's
 * special tokens, parsed specials) with an f32 KV cache and no flash attention, and print the N most likely next tokens as one JSON object
 * {"piece": logprob, ...} (log-softmax of the last position's logits), for comparison with
 * tide's /v1/completions top_logprobs. Built by the script against a llama.cpp build:
 *   cc -O2 scripts/llama-logits.c -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama
 * Not part of tide's build. Usage: llama-logits MODEL PROMPT [N [G]]
 * With G > 0 it prints instead PROMPT and the G greedy tokens after it, as llama-simple does,
 * but with the f32 KV cache: the greedy reference where llama-simple's f16 cache flips a near tie
 * (deepseek2's preset: tide and this agree on 24 tokens, llama-simple differs from token 16,
 * whose top two are 0.022 apart). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)level, (void)text, (void)ud;
}

/* The piece as a JSON string body: quotes, backslashes and control bytes escaped. */
static void json_piece(const char *p, int n)
{
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [N]\n", argv[0]);
        return 2;
    }
    int top = argc > 3 ? atoi(argv[3]) : 20, greedy = argc > 4 ? atoi(argv[4]) : 0;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const char *prompt = argv[2];
    int n = -llama_tokenize(vocab, prompt, (int32_t)strlen(prompt), NULL, 0, true, true);
    llama_token *toks = malloc(sizeof(llama_token) * (size_t)n);
    if (!toks || llama_tokenize(vocab, prompt, (int32_t)strlen(prompt), toks, n, true, true) < 0)
        return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n + 8 + (uint32_t)(greedy > 0 ? greedy : 0);
    cp.n_batch = (uint32_t)n;
    /* an f32 KV cache and no flash attention (llama.cpp's defaults are f16 K/V and, on the
     * CPU, flash attention, which rounds Q to f16: 1-2e-3 apart on these logprobs; tide keeps
     * q, K and V in f32): the comparison is then of the models' arithmetic */
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx || llama_decode(ctx, llama_batch_get_one(toks, n)) != 0)
        return 1;
    const float *lg = llama_get_logits_ith(ctx, -1);
    int V = llama_vocab_n_tokens(vocab);
    if (greedy > 0) { /* the prompt, then each step's argmax piece (the first of equal logits) */
        fputs(prompt, stdout);
        for (int s = 0; s < greedy; s++) {
            llama_token b = 0;
            for (int i = 1; i < V; i++)
                if (lg[i] > lg[b])
                    b = i;
            if (llama_vocab_is_eog(vocab, b))
                break;
            char piece[256];
            int len = llama_token_to_piece(vocab, b, piece, sizeof piece, 0, true);
            fwrite(piece, 1, len > 0 ? (size_t)len : 0, stdout);
            if (llama_decode(ctx, llama_batch_get_one(&b, 1)) != 0)
                return 1;
            lg = llama_get_logits_ith(ctx, -1);
        }
        putchar('\n');
        return 0;
    }
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < V; i++)
        z += exp(lg[i] - mx);
    double lz = mx + log(z);
    if (V <= 0)
        return 1;
    char *used = calloc((size_t)V, 1);
    printf("{");
    for (int k = 0; k < top && k < V; k++) {
        int b = -1;
        for (int i = 0; i < V; i++)
            if (!used[i] && (b < 0 || lg[i] > lg[b]))
                b = i;
        used[b] = 1;
        char piece[256];
        int len = llama_token_to_piece(vocab, b, piece, sizeof piece, 0, true);
        printf("%s\"", k ? "," : "");
        json_piece(piece, len > 0 ? len : 0);
        printf("\":%.9g", lg[b] - lz);
    }
    printf("}\n");
    free(used);
    free(toks);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
