/* fuzz_tokenizer.c - libFuzzer target for tokenizer_encode and the streaming detokenizer
 * on the default model's real BPE vocabulary (models/tide-moe.gguf, or $TIDE_MODEL; `make
 * fuzz` generates it). Arbitrary bytes, including invalid UTF-8 and special-token text, go
 * in both with and without special-token parsing; every id that comes out must map back to
 * bytes. */
#include "engine/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct gguf_file g;
static struct tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    char err[256];
    if (gguf_open(&g, path, err, sizeof err) || tokenizer_load(&tok, &g, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    for (int special = 0; special < 2; special++) {
        int *ids = NULL, n = 0;
        if (tokenizer_encode(tok, text, size, special, NULL, &ids, &n) == 0) {
            struct utf8_stream us;
            memset(&us, 0, sizeof us);
            char piece[256], flush[16];
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || (uint32_t)ids[i] >= tokenizer_n_vocab(tok)) abort();
                int l = tokenizer_token_bytes(tok, ids[i], piece, sizeof piece);
                if (l < 0) abort();
                /* Exactly the documented len + 8, so ASan holds the function to it. */
                char *out = malloc((size_t)l + 8);
                if (!out) abort();
                utf8_stream_feed(&us, piece, (size_t)l, out);
                free(out);
            }
            utf8_stream_flush(&us, flush);
        }
        free(ids);
    }
    free(text);
    return 0;
}
