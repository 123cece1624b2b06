/* mrope.h - multimodal rotary position embedding (M-RoPE) of the Qwen-VL text models.
 *
 * Every token has four position ids (time, height, width, extra). Rotation pair i of a head
 * (NEOX pairs: i and i + head_dim/2, frequency theta^(-2i/head_dim) as plain rope) turns by
 * the position id of the section it belongs to. rope.dimension_sections (4 counts of pairs)
 * says which: Qwen2-VL lays the sections out one after the other, Qwen3-VL interleaves them
 * (t h w t h w ..., each id while its count lasts; pairs beyond take the extra id).
 * A text token has the same id in all four sections, so its rotation is plain NEOX rope at
 * that position: only image tokens need these functions.
 *
 * Image tokens (a grid of nx by ny merged patches, row-major) at start position p take
 * (t, h, w, e) = (p, p + row, p + col, 0) and the image advances the next position by
 * max(nx, ny), as llama.cpp's mtmd does; text around it counts on from there. */
#ifndef TIDE_MROPE_H
#define TIDE_MROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { MROPE_T, MROPE_H, MROPE_W, MROPE_E, MROPE_N };

/* Which position id (MROPE_T..MROPE_E) rotates pair `pair` (0 <= pair < head_dim / 2). */
int mrope_section_of(const uint32_t sections[MROPE_N], bool interleaved, int pair);

/* Rotate n tokens of n_heads heads (vec: token-major, head_dim floats a head) in place;
 * pos[t * MROPE_N + s] is token t's id of section s. Angles in double, as the plain rope's. */
void mrope_rotate(float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                  const uint32_t sections[MROPE_N], bool interleaved);

/* The Qwen-VL ViT's 2-D rope: n tokens (patches) of n_heads heads rotated in place, token t at
 * patch row pos[2t] and column pos[2t + 1]. NEOX pairs (i, i + head_dim/2); the first head_dim/4
 * pairs turn by the row, the next head_dim/4 by the column, each quarter's pair j at frequency
 * theta^(-4j/head_dim) (llama.cpp's vision M-RoPE with sections [d/4, d/4]). Angles in double. */
void rope2d_rotate(float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta);

/* One image in a prompt: its tokens start at token index `at` and are nx * ny embeddings. */
struct mrope_image {
    uint32_t at;
    uint32_t nx, ny;
};

/* The position ids of a prompt of n_tokens tokens starting at position p0 (the sequence's next
 * position), with n_images images (sorted by `at`, not overlapping, inside the prompt):
 * pos[t * MROPE_N + s]. Returns the position the token after the prompt takes, or a negative
 * error code when an image does not fit. */
int64_t mrope_positions(uint32_t n_tokens, int64_t p0, const struct mrope_image *images, size_t n_images,
                        int32_t *pos);

#endif
