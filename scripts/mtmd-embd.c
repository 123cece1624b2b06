/* mtmd-embd.c - llama.cpp's image embedding of a synthetic image, for
 * scripts/check-mtmd-parity.sh: the text GGUF and mmproj given, an image W x H (resized by
 * libmtmd as it sees fit, within MAX_TOKENS image tokens when given) whose pixel
 * (x, y) channel c is (x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255 (tide's side,
 * scripts/tide-embd.c, makes the same), encoded by libmtmd (CPU, f32 attention, no flash
 * attention); prints the tokens' count and width, then every float, one per line. With
 * MTMD_EMBD_PPM=FILE in the environment the image is that binary PPM instead (W and H are
 * then ignored). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "mtmd.h"

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: mtmd-embd MODEL MMPROJ W H [MAX_TOKENS]\n");
        return 2;
    }
    int w = atoi(argv[3]), h = atoi(argv[4]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    struct mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.warmup = false;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_threads = 2;
    if (argc == 6 && atoi(argv[5]) > 0) cp.image_max_tokens = atoi(argv[5]);
    mtmd_context *ctx = mtmd_init_from_file(argv[2], model, cp);
    if (!ctx) return 1;
    const char *ppm = getenv("MTMD_EMBD_PPM");
    FILE *pf = ppm ? fopen(ppm, "rb") : NULL;
    if (ppm && (!pf || fscanf(pf, "P6 %d %d 255", &w, &h) != 2 || fgetc(pf) != '\n')) {
        fprintf(stderr, "mtmd-embd: cannot read %s\n", ppm);
        return 1;
    }
    unsigned char *rgb = malloc((size_t)w * h * 3);
    if (pf) {
        size_t got = fread(rgb, 3, (size_t)w * h, pf);
        fclose(pf);
        if (got != (size_t)w * h) return 1;
    } else
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                rgb[((size_t)y * w + x) * 3 + c] = (unsigned char)((x * 37 + y * 91 + c * 53 + (x * y) % 17) & 255);
    mtmd_bitmap *bm = mtmd_bitmap_init((uint32_t)w, (uint32_t)h, rgb);
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    char prompt[64];
    snprintf(prompt, sizeof prompt, "%s", mtmd_default_marker());
    mtmd_input_text txt = {prompt, strlen(prompt), false, true};
    const mtmd_bitmap *bms[1] = {bm};
    if (mtmd_tokenize(ctx, chunks, &txt, bms, 1)) return 1;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *ch = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(ch) != MTMD_INPUT_CHUNK_TYPE_IMAGE) continue;
        if (mtmd_encode_chunk(ctx, ch)) return 1;
        size_t n = mtmd_input_chunk_get_n_tokens(ch);
        int e = llama_model_n_embd_inp(model);
        const float *v = mtmd_get_output_embd(ctx);
        printf("%zu %d\n", n, e);
        for (size_t k = 0; k < n * (size_t)e; k++) printf("%.9g\n", v[k]);
        break;
    }
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bm);
    mtmd_free(ctx);
    llama_model_free(model);
    free(rgb);
    return 0;
}
