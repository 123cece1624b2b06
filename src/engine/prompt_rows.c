/* prompt_rows.c - comparing KV row runs for the prefix caches (prompt_rows.h). */
#include "prompt_rows.h"

#include <string.h>

/* The image of r holding row k, or NULL; *i is a cursor (images are sorted, rows visited in
 * ascending order). */
static const struct row_image *image_at(const struct prompt_rows *r, int k, int *i)
{
    while (*i < r->n_img && r->img[*i].at + r->img[*i].n <= k)
        (*i)++;
    if (*i < r->n_img && r->img[*i].at <= k)
        return &r->img[*i];
    return NULL;
}

int prompt_rows_shared(const struct prompt_rows *a, const struct prompt_rows *b, int limit)
{
    int end = a->n < b->n ? a->n : b->n;
    if (limit < end)
        end = limit;
    int k = 0, ia = 0, ib = 0;
    while (k < end) {
        if (a->ids[k] >= 0 || b->ids[k] >= 0) {
            if (a->ids[k] != b->ids[k])
                break;
            k++;
            continue;
        }
        const struct row_image *x = image_at(a, k, &ia), *y = image_at(b, k, &ib);
        if (!x || !y || !x->keyed || !y->keyed || x->at != y->at || x->n != y->n ||
            memcmp(x->key, y->key, ROW_IMAGE_KEY_BYTES))
            break;
        int stop = x->at + x->n; /* the same image at the same place: all of its rows */
        while (k < end && k < stop && a->ids[k] < 0 && b->ids[k] < 0)
            k++;
    }
    return k;
}

int prompt_rows_known(const struct prompt_rows *r)
{
    int i = 0;
    for (int k = 0; k < r->n; k++) {
        if (r->ids[k] >= 0)
            continue;
        const struct row_image *x = image_at(r, k, &i);
        if (!x || !x->keyed)
            return k;
    }
    return r->n;
}
