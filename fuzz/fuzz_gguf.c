/* fuzz_gguf.c - libFuzzer target for the GGUF reader (src/engine/gguf.h) on a memory buffer:
 * the header, every key/value and tensor record, then the getters and lookups the model
 * loader uses, over whatever the parse accepted. The input is copied to an exact-size heap
 * buffer so ASan catches any read past the end of the "file". */
#include "engine/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct gguf_file g;
    char err[256];
    if (gguf_open_memory(&g, buf, size, err, sizeof err) == 0) {
        char key[128];
        for (uint64_t i = 0; i < g.n_kv; i++) {
            const struct gguf_kv *kv = &g.kv[i];
            size_t kl = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
            memcpy(key, kv->key.ptr, kl);
            key[kl] = 0;
            uint32_t u32; uint64_t u64; float f; bool b; struct gguf_str s;
            gguf_get_u32(&g, key, &u32);
            gguf_get_u64(&g, key, &u64);
            gguf_get_f32(&g, key, &f);
            gguf_get_bool(&g, key, &b);
            gguf_get_str(&g, key, &s);
            free(gguf_dup_str(&g, key));
            if (kv->type == GGUF_TYPE_ARRAY && kv->v.arr.type == GGUF_TYPE_STRING && kv->v.arr.n)
                (void)kv->v.arr.strs[kv->v.arr.n - 1].len;
        }
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const struct gguf_tensor *t = &g.tensors[i];
            char name[128];
            size_t nl = t->name.len < sizeof name - 1 ? (size_t)t->name.len : sizeof name - 1;
            memcpy(name, t->name.ptr, nl);
            name[nl] = 0;
            gguf_find_tensor(&g, name);
            /* The loader trusts data + nbytes: touch both ends. */
            if (t->nbytes) {
                volatile uint8_t x = ((const uint8_t *)t->data)[0];
                x = ((const uint8_t *)t->data)[t->nbytes - 1];
                (void)x;
            }
        }
        gguf_close(&g);
    }
    free(buf);
    return 0;
}
