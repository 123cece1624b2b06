/* content_hash.c - SHA-256 content keys (nettle); see content_hash.h. */
#include "vision/content_hash.h"

#include <nettle/sha2.h>

void content_hash(const void *p, size_t n, uint8_t out[CONTENT_HASH_SIZE])
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, n, p);
    sha256_digest(&c, CONTENT_HASH_SIZE, out);
}
