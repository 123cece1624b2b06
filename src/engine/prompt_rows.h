/* prompt_rows.h - a run of KV rows as the prefix caches compare them (a slot's rows, a parked
 * conversation's, a new prompt's): token ids, and image rows (id -1) keyed by their image's
 * content hash and place. Two runs share a row when both hold the same token there, or both
 * hold the same row of the same image (same key) starting at the same row: then the KV rows
 * are the same, since everything before them is too. An image row without a key never matches. */
#ifndef TIDE_PROMPT_ROWS_H
#define TIDE_PROMPT_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#define ROW_IMAGE_KEY_BYTES 32 /* SHA-256 of the image's bytes (vision/content_hash.h) */

struct row_image {
    int at, n;              /* rows at..at+n-1 are this image's */
    bool keyed;             /* key is set */
    uint8_t key[ROW_IMAGE_KEY_BYTES];
};

struct prompt_rows {
    const int *ids;         /* (n) token ids, -1 for image rows */
    int n;
    const struct row_image *img; /* (n_img) by ascending at */
    int n_img;
};

/* Rows a and b share from row 0, at most limit. */
int prompt_rows_shared(const struct prompt_rows *a, const struct prompt_rows *b, int limit);
/* Rows of r from row 0 up to its first image row that has no key (all of them: r->n). */
int prompt_rows_known(const struct prompt_rows *r);

#endif
