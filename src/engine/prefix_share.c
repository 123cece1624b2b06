/* prefix_share.c - reusing a prompt's prefix from the other KV slots (prefix_share.h). */
#include "prefix_share.h"

void prefix_share_plan(const struct prompt_rows *q, int limit, int have, const struct share_source *src, int n,
                       int min_wait, struct share_plan *out)
{
    *out = (struct share_plan){.copy_from = -1, .copy_len = 0, .wait_on = -1, .wait_len = 0};
    int best = have;
    for (int i = 0; i < n; i++) {
        int k = prompt_rows_shared(&src[i].rows, q, limit);
        if (k > best && k - have >= PREFIX_SHARE_MIN_COPY) {
            best = k;
            out->copy_from = i;
            out->copy_len = k;
        }
    }
    if (min_wait <= 0)
        return;
    int wait_best = best + min_wait - 1; /* a wait must bring at least min_wait rows more */
    for (int i = 0; i < n; i++) {
        if (src[i].pending.n <= 0)
            continue;
        int k = prompt_rows_shared(&src[i].pending, q, limit);
        if (k > wait_best && k - have >= PREFIX_SHARE_MIN_COPY) { /* rows that will be copied */
            wait_best = k;
            out->wait_on = i;
            out->wait_len = k;
        }
    }
    if (out->wait_on >= 0) { /* the rows come later, from there */
        out->copy_from = -1;
        out->copy_len = 0;
    }
}
