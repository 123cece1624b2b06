/* test_fifo.c - the queue and the live-job count the SIGTERM drain waits on (fifo_live,
 * fifo_wait_idle): a pushed job counts until it is finished, whether it ran, was cancelled in
 * the queue, or was dropped when the queue was freed; a refused push never counts. Jobs leave
 * the queue in arrival order, control jobs apart. */
#include <criterion/criterion.h>
#include <unistd.h>

#include "server/fifo.h"

Test(fifo, live_counts_until_finished_and_wait_idle_returns_then)
{
    struct fifo *f;
    cr_assert_eq(fifo_create(&f, 8), 0);
    cr_expect_eq(fifo_live(f), 0);
    cr_expect(fifo_wait_idle(f, 0.01), "an empty queue is idle");
    struct job *j[3];
    for (int i = 0; i < 3; i++) {
        j[i] = job_new(NULL, NULL, NULL);
        cr_assert_eq(fifo_push(f, j[i]), 0);
    }
    cr_expect_eq(fifo_live(f), 3);
    cr_expect_eq(fifo_waiting(f), 3);
    for (int i = 0; i < 3; i++) {
        struct job *p = fifo_pop(f);
        cr_assert_eq(p, j[i], "not in arrival order");
        job_start(p);
        cr_expect(!fifo_wait_idle(f, 0.01), "idle while job %d runs", i);
        job_finish(p, 200);
        job_finish(p, 500); /* a second finish does not count twice */
        job_unref(p);
        cr_expect_eq(fifo_live(f), 2 - i);
    }
    cr_expect(fifo_wait_idle(f, 1.0));
    cr_expect_null(fifo_pop(f));
    for (int i = 0; i < 3; i++)
        job_unref(j[i]);
    fifo_close(f);
    fifo_free(f);
}

Test(fifo, refused_control_and_dropped_jobs)
{
    struct fifo *f;
    cr_assert_eq(fifo_create(&f, 1), 0);
    struct job *a = job_new(NULL, NULL, NULL), *b = job_new(NULL, NULL, NULL), *c = job_new(NULL, NULL, NULL);
    cr_assert_eq(fifo_push(f, a), 0);
    cr_expect_eq(fifo_push(f, b), TIDE_EFULL);
    cr_expect_eq(fifo_live(f), 1, "a refused push counted");
    cr_assert_eq(fifo_push_control(f, c), 0);
    cr_expect_eq(fifo_pop_control(f), c, "the control job is apart from the queue");
    cr_expect_null(fifo_pop_control(f));
    job_unref(c);
    cr_expect(fifo_wait(f, 0.01), "open");
    fifo_close(f);
    cr_expect(!fifo_wait(f, 0.01), "closed");
    cr_expect_null(fifo_pop(f), "nothing leaves a closed queue");
    cr_expect_eq(fifo_push(f, b), TIDE_ECANCELED);
    fifo_free(f); /* a is dropped: 503, no longer live */
    cr_expect(a->done);
    cr_expect_eq(a->status, 503);
    struct job *js[] = {a, b, c};
    for (int i = 0; i < 3; i++) job_unref(js[i]);
}
