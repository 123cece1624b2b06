/* session.h - the engine as the server sees it: load a model, run one generation job.
 *
 * Only the engine thread calls engine_run(). A job carries its prompt (chat messages or
 * a raw prompt), sampling settings and a token callback; the callback runs on the engine
 * thread for every piece of text (complete UTF-8, never past a stop string) and returns
 * nonzero to cancel. */
#ifndef TIDE_SESSION_H
#define TIDE_SESSION_H

#include "forward.h"
#include "sample.h"
#include "template.h"
#include "tokenizer.h"

struct engine_options {
    const char *model_path;
    int n_ctx;          /* context length (tokens) */
    int n_threads;      /* 0 = all cores */
};

struct engine {
    struct model model;
    struct tokenizer *tok;
    enum chat_template_kind tmpl;
    struct backend be;
    struct forward_state fw;
    int n_ctx;
    int *tokens;        /* (n_ctx) tokens now in the KV cache, for prefix reuse */
    int n_tokens;
};

enum finish_reason { FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_ERROR };

#define JOB_MAX_STOP 8

struct gen_job {
    /* input: either messages (chat) or prompt (raw completion) */
    const struct chat_message *messages;
    int n_messages;
    const char *prompt;
    struct sampling_params sp;
    int max_tokens;     /* -1: until the context is full */
    const char *stop[JOB_MAX_STOP];
    int n_stop;
    int n;              /* choices, run one after another */
    /* on_text(ud, choice, text, len, lp): lp is NULL unless sp.logprobs; the logprob
     * refers to the token that completed this text. Return nonzero to cancel. */
    int (*on_text)(void *ud, int choice, const char *text, size_t len,
                   const struct token_logprob *lp);
    void *ud;
    /* Checked before every token when not NULL: nonzero stops the job (client gone). */
    const volatile int *cancel;
    /* output */
    int prompt_tokens;
    int completion_tokens;               /* over all choices */
    enum finish_reason finish[16];       /* per choice (n <= 16) */
};

int engine_init(struct engine *e, const struct engine_options *o, char *err, size_t errlen);
void engine_free(struct engine *e);
/* Count the prompt tokens a job would use (for validation before queueing); <0 on error. */
int engine_count_prompt(struct engine *e, const struct gen_job *job);
/* Run a job. 0 on success, TIDE_ECANCELED when the callback asked to stop, TIDE_ERANGE
 * when the prompt does not fit the context (err says so), other negatives on failure. */
int engine_run(struct engine *e, struct gen_job *job, char *err, size_t errlen);

#endif
