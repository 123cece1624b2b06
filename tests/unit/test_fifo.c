/* test_fifo.c - the live-job count the SIGTERM drain waits on (fifo_live, fifo_wait_idle):
 * a pushed job counts until it is finished, whether it ran, was cancelled in the queue, or
 * was dropped by fifo_stop; a refused push never counts. */
#include <criterion/criterion.h>
#include <unistd.h>

#include "server/fifo.h"

static void run_slow(struct job *j, void *ctx)
{
    (void)ctx;
    usleep(100000);
    job_write(j, "x", 1);
}

Test(fifo, live_counts_until_finished_and_wait_idle_returns_then)
{
    struct fifo *f;
    cr_assert_eq(fifo_create(&f, 8, NULL), 0);
    cr_expect_eq(fifo_live(f), 0);
    cr_expect(fifo_wait_idle(f, 0.01), "an empty queue is idle");
    struct job *j[3];
    for (int i = 0; i < 3; i++) {
        j[i] = job_new(run_slow, NULL, NULL);
        cr_assert_eq(fifo_push(f, j[i]), 0);
    }
    cr_expect_eq(fifo_live(f), 3);
    cr_expect(!fifo_wait_idle(f, 0.05), "idle while three 0.1 s jobs are queued");
    cr_expect(fifo_wait_idle(f, 5.0), "not idle after the three jobs");
    cr_expect_eq(fifo_live(f), 0);
    for (int i = 0; i < 3; i++) {
        cr_expect(j[i]->done && j[i]->status == 200 && j[i]->len == 1, "job %d did not run whole", i);
        job_unref(j[i]);
    }
    fifo_stop(f);
    fifo_free(f);
}

Test(fifo, refused_cancelled_and_stopped_jobs_leave_the_count)
{
    struct fifo *f;
    cr_assert_eq(fifo_create(&f, 1, NULL), 0);
    struct job *a = job_new(run_slow, NULL, NULL), *b = job_new(run_slow, NULL, NULL),
               *c = job_new(run_slow, NULL, NULL);
    cr_assert_eq(fifo_push(f, a), 0);
    usleep(20000); /* a runs; b waits; c is refused (queue_max 1) */
    cr_assert_eq(fifo_push(f, b), 0);
    cr_expect_eq(fifo_push(f, c), TIDE_EFULL);
    cr_expect_eq(fifo_live(f), 2, "a refused push counted");
    job_cancel(b); /* cancelled while queued: finished 499 without running */
    cr_expect(fifo_wait_idle(f, 5.0));
    cr_expect_eq(b->status, 499);
    struct job *d = job_new(run_slow, NULL, NULL), *e = job_new(run_slow, NULL, NULL);
    cr_assert_eq(fifo_push(f, d), 0);
    usleep(20000);
    cr_assert_eq(fifo_push(f, e), 0);
    cr_expect_eq(fifo_live(f), 2);
    fifo_stop(f); /* d cancelled while running, e dropped from the queue (503) */
    cr_expect_eq(fifo_live(f), 0);
    cr_expect(fifo_wait_idle(f, 0));
    cr_expect_eq(e->status, 503);
    struct job *js[] = {a, b, c, d, e};
    for (int i = 0; i < 5; i++) job_unref(js[i]);
    fifo_free(f);
}
