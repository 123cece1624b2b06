/* fifo.c - the bounded FIFO of jobs and their output channels. HTTP threads queue jobs and
 * read their output; the engine thread (scheduler.c) takes them in arrival order. */
#include "server/fifo.h"
#include "server/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fifo {
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* the engine thread waits here for work */
    struct job *head, *tail;
    int n, max;
    int live;                        /* pushed, not finished (fifo_live) */
    pthread_cond_t idle_cv;          /* signalled when live drops to 0 */
    bool stop;
    struct job *ctl_head, *ctl_tail; /* control jobs: run at the next step boundary */
};

struct job *job_new(job_run_fn run, void *ud, void (*free_ud)(void *))
{
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancel, 0);
    j->run = run;
    j->ud = ud;
    j->free_ud = free_ud;
    j->status = 200;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

void job_ref(struct job *j) { atomic_fetch_add(&j->refs, 1); }

void job_unref(struct job *j)
{
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    if (j->free_ud) j->free_ud(j->ud);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->buf);
    free(j);
}

void job_cancel(struct job *j)
{
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&j->mu);
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
}

bool job_cancelled(const struct job *j) { return atomic_load(&j->cancel) != 0; }

int job_write(struct job *j, const char *data, size_t len)
{
    pthread_mutex_lock(&j->mu);
    if (j->len + len + 1 > j->cap) {
        size_t nc = j->cap ? j->cap : 4096;
        while (nc < j->len + len + 1) nc *= 2;
        char *nb = realloc(j->buf, nc);
        if (!nb) { pthread_mutex_unlock(&j->mu); return TIDE_ENOMEM; }
        j->buf = nb;
        j->cap = nc;
    }
    memcpy(j->buf + j->len, data, len);
    j->len += len;
    j->buf[j->len] = 0;
    if (j->len > j->held_peak) {
        j->held_peak = j->len;
        metrics_output_held(j->len);
    }
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void fifo_job_ended(struct fifo *f);

void job_finish(struct job *j, int status)
{
    pthread_mutex_lock(&j->mu);
    /* Only the first finish of a queued job ends a live one (fifo_live). */
    struct fifo *owner = j->done ? NULL : j->owner;
    j->owner = NULL;
    j->status = status;
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
    if (owner) fifo_job_ended(owner);
}

static void deadline(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long ns = ts->tv_nsec + (long)((s - (long)s) * 1e9);
    ts->tv_sec += (time_t)s + ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

size_t job_take_locked(struct job *j, char *out, size_t max)
{
    size_t n = j->len - j->rd;
    if (n > max) n = max;
    memcpy(out, j->buf + j->rd, n);
    j->rd += n;
    /* Drop what the reader has taken, or a long stream holds its whole output until it
     * ends (issue 27: 42.5 MiB for n = 16 with logprobs). Moving the unread tail down only
     * once it is at most half the buffer keeps the copying linear in the output. */
    if (j->rd == j->len) {
        j->len = j->rd = 0;
    } else if (j->rd >= j->len - j->rd) {
        memmove(j->buf, j->buf + j->rd, j->len - j->rd);
        j->len -= j->rd;
        j->rd = 0;
    }
    if (j->buf) j->buf[j->len] = 0;
    return n;
}

long job_read(struct job *j, char *out, size_t max, double timeout_s)
{
    struct timespec ts;
    deadline(&ts, timeout_s);
    pthread_mutex_lock(&j->mu);
    while (j->rd == j->len && !j->done && !job_cancelled(j)) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    long r;
    if (j->rd < j->len) {
        r = (long)job_take_locked(j, out, max);
    } else if (j->done || job_cancelled(j)) {
        r = -1;
    } else {
        r = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return r;
}

bool job_wait_done(struct job *j, double timeout_s)
{
    struct timespec ts;
    deadline(&ts, timeout_s);
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    bool d = j->done;
    pthread_mutex_unlock(&j->mu);
    return d;
}

void job_start(struct job *j)
{
    pthread_mutex_lock(&j->mu);
    j->started = true;
    pthread_cond_broadcast(&j->cv);
    if (j->notify) j->notify(j->notify_arg);
    pthread_mutex_unlock(&j->mu);
}

int fifo_create(struct fifo **out, int queue_max)
{
    struct fifo *f = calloc(1, sizeof *f);
    if (!f) return TIDE_ENOMEM;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    pthread_cond_init(&f->idle_cv, NULL);
    f->max = queue_max;
    *out = f;
    return 0;
}

struct job *fifo_pop_control(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    struct job *j = f->ctl_head;
    if (j) {
        f->ctl_head = j->next;
        if (!f->ctl_head) f->ctl_tail = NULL;
    }
    pthread_mutex_unlock(&f->mu);
    return j;
}

struct job *fifo_pop(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    struct job *j = f->stop ? NULL : f->head;
    if (j) {
        f->head = j->next;
        if (!f->head) f->tail = NULL;
        f->n--;
    }
    pthread_mutex_unlock(&f->mu);
    if (j) metrics_waiting_add(-1);
    return j;
}

bool fifo_wait(struct fifo *f, double timeout_s)
{
    struct timespec ts;
    deadline(&ts, timeout_s);
    pthread_mutex_lock(&f->mu);
    while (!f->head && !f->ctl_head && !f->stop)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT) break;
    bool open = !f->stop;
    pthread_mutex_unlock(&f->mu);
    return open;
}

bool fifo_closed(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    bool c = f->stop;
    pthread_mutex_unlock(&f->mu);
    return c;
}

void fifo_close(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

int fifo_push(struct fifo *f, struct job *j)
{
    pthread_mutex_lock(&f->mu);
    if (f->stop) { pthread_mutex_unlock(&f->mu); return TIDE_ECANCELED; }
    if (f->n >= f->max) { pthread_mutex_unlock(&f->mu); return TIDE_EFULL; }
    job_ref(j);
    j->next = NULL;
    j->owner = f;
    j->t_enqueue = tide_now();
    if (f->tail) f->tail->next = j;
    else f->head = j;
    f->tail = j;
    f->n++;
    f->live++;
    metrics_waiting_add(1);
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

int fifo_push_control(struct fifo *f, struct job *j)
{
    pthread_mutex_lock(&f->mu);
    if (f->stop) { pthread_mutex_unlock(&f->mu); return TIDE_ECANCELED; }
    job_ref(j);
    j->control = true;
    j->next = NULL;
    j->t_enqueue = tide_now();
    if (f->ctl_tail) f->ctl_tail->next = j;
    else f->ctl_head = j;
    f->ctl_tail = j;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

int fifo_waiting(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->n;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void fifo_job_ended(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    if (f->live > 0 && --f->live == 0) pthread_cond_broadcast(&f->idle_cv);
    pthread_mutex_unlock(&f->mu);
}

int fifo_live(struct fifo *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->live;
    pthread_mutex_unlock(&f->mu);
    return n;
}

bool fifo_wait_idle(struct fifo *f, double timeout_s)
{
    struct timespec ts;
    deadline(&ts, timeout_s > 0 ? timeout_s : 0);
    pthread_mutex_lock(&f->mu);
    while (f->live > 0) {
        if (pthread_cond_timedwait(&f->idle_cv, &f->mu, &ts) == ETIMEDOUT) break;
    }
    bool idle = f->live == 0;
    pthread_mutex_unlock(&f->mu);
    return idle;
}

void fifo_drop_queued(struct fifo *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    struct job *q = f->head, *ctl = f->ctl_head;
    f->head = f->tail = f->ctl_head = f->ctl_tail = NULL;
    f->n = 0;
    pthread_mutex_unlock(&f->mu);
    /* Queued jobs never ran: tell their readers and drop the queue's references. */
    while (q) {
        struct job *nx = q->next;
        job_cancel(q);
        job_finish(q, 503);
        metrics_waiting_add(-1);
        job_unref(q);
        q = nx;
    }
    while (ctl) {
        struct job *nx = ctl->next;
        job_finish(ctl, 503);
        job_unref(ctl);
        ctl = nx;
    }
}

void fifo_free(struct fifo *f)
{
    if (!f) return;
    fifo_drop_queued(f); /* nothing, after fifo_drop_queued */
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    pthread_cond_destroy(&f->idle_cv);
    free(f);
}
