/* content_hash.h - the key for anything cached by content (image embeddings, and image
 * tokens in the batching prefix cache): SHA-256 of the bytes, from nettle.
 *
 * A 64-bit FNV-1a key let two different PNGs collide for 35 s of search on 2 cores (8 free
 * bytes in an ancillary chunk) and the second image got the first one's answer (issue 27
 * item 6). Finding two inputs with the same SHA-256 is not feasible. */
#ifndef TIDE_VISION_CONTENT_HASH_H
#define TIDE_VISION_CONTENT_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CONTENT_HASH_SIZE 32

void content_hash(const void *p, size_t n, uint8_t out[CONTENT_HASH_SIZE]);

#endif
