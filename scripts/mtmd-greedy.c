/* mtmd-greedy.c - llama.cpp's greedy reply to a prompt with one image, for
 * scripts/check-mtmd-parity.sh: the text GGUF and mmproj given, the synthetic W x H image of
 * scripts/mtmd-embd.c at the first "<__media__>" of PROMPT (special tokens parsed, no BOS
 * added), evaluated by libmtmd's helper (the image between <|vision_start|> and <|vision_end|>,
 * M-RoPE positions), f32 KV cache, no flash attention; prints N greedy tokens' text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: mtmd-greedy MODEL MMPROJ W H PROMPT N\n");
        return 2;
    }
    int w = atoi(argv[3]), h = atoi(argv[4]), n_gen = atoi(argv[6]);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 512;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *lctx = llama_init_from_model(model, cp);
    struct mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = false;
    mp.warmup = false;
    mp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    mtmd_context *ctx = mtmd_init_from_file(argv[2], model, mp);
    if (!lctx || !ctx) return 1;
    unsigned char *rgb = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = (unsigned char)((x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255);
    mtmd_bitmap *bm = mtmd_bitmap_init((uint32_t)w, (uint32_t)h, rgb);
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    mtmd_input_text txt = {argv[5], strlen(argv[5]), false, true};
    const mtmd_bitmap *bms[1] = {bm};
    if (mtmd_tokenize(ctx, chunks, &txt, bms, 1)) return 1;
    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 512, true, &n_past)) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_batch b = llama_batch_init(1, 0, 1);
    for (int i = 0; i < n_gen; i++) {
        const float *lg = llama_get_logits_ith(lctx, -1);
        int best = 0;
        for (int t = 1; t < n_vocab; t++)
            if (lg[t] > lg[best]) best = t;
        if (llama_vocab_is_eog(vocab, best)) break;
        char piece[256];
        int k = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
        if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
        b.n_tokens = 1;
        b.token[0] = best;
        b.pos[0] = n_past++;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        if (llama_decode(lctx, b)) return 1;
    }
    printf("\n");
    llama_batch_free(b);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bm);
    mtmd_free(ctx);
    llama_free(lctx);
    llama_model_free(model);
    free(rgb);
    return 0;
}
