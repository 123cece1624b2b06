/* fifo.h - the bounded job queue and per-job output channels.
 *
 * HTTP threads create a job, push it, and read its output channel; the engine thread
 * (server/scheduler.c) takes jobs from the queue in arrival order and is the only one that
 * runs them: a control job through job->run, a generation through job->gen. A job is
 * refcounted: the queue/engine holds one ref, the HTTP side another; whoever drops the last
 * frees it. */
#ifndef TIDE_FIFO_H
#define TIDE_FIFO_H

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

struct job;
typedef void (*job_run_fn)(struct job *j, void *engine_ctx);

struct gen_job;
/* A generation's two ends, both on the engine thread: begin gives the scheduler the job's
 * gen_job (NULL: nothing to run, the reply is already written); end writes the reply once it
 * finished (rc 0) or failed (rc < 0, err says why) and finishes the job. */
struct job_gen {
    struct gen_job *(*begin)(struct job *j, void *engine_ctx);
    void (*end)(struct job *j, void *engine_ctx, int rc, const char *err);
};

struct job {
    atomic_int refs;
    atomic_int cancel;        /* set by the HTTP side (disconnect) or shutdown */
    job_run_fn run;           /* engine thread: a control job's work */
    const struct job_gen *gen;/* engine thread: a generation's (run is NULL) */
    void *ud;                 /* owner data (the parsed request) */
    void (*free_ud)(void *ud);
    struct job *next;         /* queue link */
    double t_enqueue;
    /* output channel */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf;
    size_t len, cap, rd;      /* rd: bytes already taken by the reader */
    size_t held_peak;         /* most bytes buf ever held unread or unsent (tests, issue 27) */
    bool started;             /* the engine picked it up */
    bool control;             /* a control job (POST /v1/vram): jumps the queue */
    bool done;
    int status;               /* HTTP status of the finished job (200 unless failed) */
    /* Called with mu held after every change a reader may wait for (output, start, finish,
     * cancel): http.c resumes the suspended connection from here. Set/cleared under mu. */
    void (*notify)(void *arg);
    void *notify_arg;
    struct fifo *owner;       /* set by fifo_push: job_finish tells it one live job fewer */
};

struct job *job_new(job_run_fn run, void *ud, void (*free_ud)(void *));
void job_ref(struct job *j);
void job_unref(struct job *j);
void job_cancel(struct job *j);
bool job_cancelled(const struct job *j);
/* Engine side: append output; finish with an HTTP status. */
int job_write(struct job *j, const char *data, size_t len);
void job_finish(struct job *j, int status);
/* Engine side: the job was taken from the queue (readers may now stop counting queue time). */
void job_start(struct job *j);
/* HTTP side: wait up to timeout_s for output or completion; copies up to max bytes.
 * Returns bytes copied (>0), 0 on timeout with nothing new, -1 when done and drained. */
long job_read(struct job *j, char *out, size_t max, double timeout_s);
/* With j->mu held and j->rd < j->len: copy up to max unread bytes out and drop them from
 * the buffer (streams: memory stays bounded by what the reader has not taken yet). */
size_t job_take_locked(struct job *j, char *out, size_t max);
/* Wait until done (or timeout); returns true when done. */
bool job_wait_done(struct job *j, double timeout_s);

struct fifo;
int fifo_create(struct fifo **out, int queue_max);
/* Takes a reference on success. TIDE_EFULL when queue_max jobs are waiting; TIDE_ECANCELED
 * after shutdown began. */
int fifo_push(struct fifo *f, struct job *j);
int fifo_waiting(struct fifo *f);
/* Control jobs skip the generation queue: the engine runs them at its next step boundary. */
int fifo_push_control(struct fifo *f, struct job *j);
/* Engine thread: the next control job, or the next generation job (arrival order), or NULL.
 * The caller owns the queue's reference. */
struct job *fifo_pop_control(struct fifo *f);
struct job *fifo_pop(struct fifo *f);
/* Engine thread: wait up to timeout_s for a job (either kind) or the close; false once closed. */
bool fifo_wait(struct fifo *f, double timeout_s);
bool fifo_closed(struct fifo *f);
/* Refuse new jobs and wake the engine thread (which then cancels what runs and returns). */
void fifo_close(struct fifo *f);
/* Live generation jobs: pushed and not yet finished (queued + running). The drain on
 * SIGTERM waits for this to reach 0; it counts at the queue's edges (fifo_push, job_finish)
 * so it holds whatever the engine thread does between them. */
int fifo_live(struct fifo *f);
/* Wait until fifo_live is 0, at most timeout_s; true when it is. */
bool fifo_wait_idle(struct fifo *f, double timeout_s);
/* After the engine thread returned: finish what is still queued with 503 (the queue stays
 * closed: pushes are refused). */
void fifo_drop_queued(struct fifo *f);
/* Free, once no HTTP thread can reach the queue any more (after http_stop). */
void fifo_free(struct fifo *f);

#endif
