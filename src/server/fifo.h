/* fifo.h - the bounded job queue, the engine thread, and per-job output channels.
 *
 * HTTP threads create a job, push it, and read its output channel; only the engine
 * thread runs jobs (job->run). A job is refcounted: the queue/engine holds one ref, the
 * HTTP side another; whoever drops the last frees it. */
#ifndef TIDE_FIFO_H
#define TIDE_FIFO_H

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

struct job;
typedef void (*job_run_fn)(struct job *j, void *engine_ctx);

struct job {
    atomic_int refs;
    atomic_int cancel;        /* set by the HTTP side (disconnect) or shutdown */
    job_run_fn run;           /* engine thread */
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
};

struct job *job_new(job_run_fn run, void *ud, void (*free_ud)(void *));
void job_ref(struct job *j);
void job_unref(struct job *j);
void job_cancel(struct job *j);
bool job_cancelled(const struct job *j);
/* Engine side: append output; finish with an HTTP status. */
int job_write(struct job *j, const char *data, size_t len);
void job_finish(struct job *j, int status);
/* HTTP side: wait up to timeout_s for output or completion; copies up to max bytes.
 * Returns bytes copied (>0), 0 on timeout with nothing new, -1 when done and drained. */
long job_read(struct job *j, char *out, size_t max, double timeout_s);
/* With j->mu held and j->rd < j->len: copy up to max unread bytes out and drop them from
 * the buffer (streams: memory stays bounded by what the reader has not taken yet). */
size_t job_take_locked(struct job *j, char *out, size_t max);
/* Wait until done (or timeout); returns true when done. */
bool job_wait_done(struct job *j, double timeout_s);

struct fifo;
int fifo_create(struct fifo **out, int queue_max, void *engine_ctx);
/* Takes a reference on success. TIDE_EFULL when queue_max jobs are waiting; TIDE_ECANCELED
 * after shutdown began. */
int fifo_push(struct fifo *f, struct job *j);
int fifo_waiting(struct fifo *f);
/* Control jobs skip the generation queue: the engine runs them before the next queued job,
 * or at the next token boundary of the running one (fifo_run_control). */
int fifo_push_control(struct fifo *f, struct job *j);
/* Engine thread only: run the pending control jobs now. */
void fifo_run_control(struct fifo *f);
/* tick(engine_ctx) runs on the engine thread every interval_s while idle, after each job and
 * whenever the running job calls fifo_tick (timers such as the vision idle unload). */
void fifo_set_tick(struct fifo *f, void (*tick)(void *engine_ctx), double interval_s);
void fifo_tick(struct fifo *f);
/* Stop: refuse new jobs, cancel the running and queued ones, join the engine thread. */
void fifo_stop(struct fifo *f);
/* Free after fifo_stop, once no HTTP thread can call fifo_push any more. */
void fifo_free(struct fifo *f);

#endif
