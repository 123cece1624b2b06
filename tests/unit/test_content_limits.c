/* test_content_limits.c - issue 27's content and memory items, below the HTTP layer: a
 * stream's output channel drops what its reader took, the image-embedding cache and the
 * content hash tell apart inputs an FNV-1a key confused, JSON strings keep NUL bytes, the
 * parse-tree and request-memory budgets refuse before allocating, and a PNG whose
 * compressed data is far more than its header's pixels need is refused undecoded. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/fifo.h"

/* A long stream read as it is written: the buffer holds only what is unread. Before issue 27
 * it held all 16 MiB until the job ended. */
Test(stream_buffer, drops_what_the_reader_took)
{
    struct job *j = job_new(NULL, NULL, NULL);
    cr_assert_not_null(j);
    char chunk[3000], got[4096];
    size_t written = 0, read_total = 0;
    unsigned sum_w = 0, sum_r = 0;
    for (int i = 0; written < ((size_t)16 << 20); i++) {
        for (size_t k = 0; k < sizeof chunk; k++) chunk[k] = (char)(i * 31 + k);
        for (size_t k = 0; k < sizeof chunk; k++) sum_w = sum_w * 131 + (unsigned char)chunk[k];
        cr_assert_eq(job_write(j, chunk, sizeof chunk), 0);
        written += sizeof chunk;
        /* the reader takes a bit less than was written, so something is always left over */
        long n = job_read(j, got, i % 3 ? sizeof got : 1000, 0);
        cr_assert_gt(n, 0);
        for (long k = 0; k < n; k++) sum_r = sum_r * 131 + (unsigned char)got[k];
        read_total += (size_t)n;
    }
    job_finish(j, 200);
    long n;
    while ((n = job_read(j, got, sizeof got, 0)) > 0) {
        for (long k = 0; k < n; k++) sum_r = sum_r * 131 + (unsigned char)got[k];
        read_total += (size_t)n;
    }
    cr_assert_eq(n, -1);
    cr_assert_eq(read_total, written, "every byte comes out");
    cr_assert_eq(sum_r, sum_w, "in order");
    /* high-water: bounded by the reader's backlog (a few KiB), not by the stream's 16 MiB */
    cr_assert_lt(j->held_peak, (size_t)64 << 10, "held %zu bytes", j->held_peak);
    cr_assert_leq(j->cap, (size_t)64 << 10, "buffer grew to %zu bytes", j->cap);
    job_unref(j);
}

/* The reader keeps up: the buffer never holds more than a few writes. */
Test(stream_buffer, stays_small_when_the_reader_keeps_up)
{
    struct job *j = job_new(NULL, NULL, NULL);
    char chunk[1500], got[4096];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < 20000; i++) {
        cr_assert_eq(job_write(j, chunk, sizeof chunk), 0);
        cr_assert_eq(job_read(j, got, sizeof got, 0), (long)sizeof chunk);
    }
    cr_assert_leq(j->held_peak, sizeof chunk, "held %zu bytes", j->held_peak);
    cr_assert_leq(j->cap, (size_t)4096);
    job_unref(j);
}
