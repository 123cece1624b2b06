/* sequence_internal.h - what the sequence modules share: a running sequence (struct engine_seq)
 * and the views of rows that the prefix caches compare. sequence.c runs sequences;
 * seq_pool.c pauses and resumes them when the paged KV pool runs out. Not for other modules. */
#ifndef TIDE_SEQUENCE_INTERNAL_H
#define TIDE_SEQUENCE_INTERNAL_H

#include "session.h"
#include "json_guard.h"

#define SEQ_MAX_STOPS (JOB_MAX_STOP + 8)

struct engine_seq {
    struct gen_job *job;
    int slot;
    int *ids;                /* (n_prompt) prompt tokens; -1 for an image's rows */
    int n_prompt;
    int img_at[ENGINE_MAX_IMAGES]; /* first row of each image */
    struct row_image rimg[ENGINE_MAX_IMAGES]; /* the images' rows with their keys (prompt_rows.h) */
    int pos;                 /* rows of the slot that hold this sequence (prefill progress, then tokens) */
    int max_new;
    int n_choices, choice;
    int per;                 /* choices of each prompt (n_choices / prompts) */
    int **pids, *pn;         /* several prompts (job->n_prompts > 1): each one's tokens; ids is one of them */
    int n_prompts;
    const char *stops[SEQ_MAX_STOPS];
    int n_stop;
    bool pick_only;          /* greedy with nothing that needs the logits: the pick is made on the device */
    bool draw_on_device;     /* sampled with nothing else that needs the logits: drawn by backend_i.sample */
    struct sample_row draw;  /* its parameters; u drawn from smp for each step that brings logits */
    struct sample_logprob dlp; /* the device draw's logprobs (draw.logprobs) */
    struct sample_edit *eds; /* the sampler's edits with the end-of-generation ban (min_tokens, ignore_eos) */
    int cap_eds;
    float *prompt_logits;    /* (2, n_vocab) for the choices after the first (n > 1), else NULL: the
                                prompt's logits, then a copy a choice's first draw may change */
    /* the choice being generated */
    struct sampler smp;
    bool smp_ok;
    struct json_guard jg;
    struct utf8_stream u8;
    char *held;              /* decoded text not yet given to the callback */
    size_t n_held, cap;
    int t;                   /* tokens of this choice so far */
    int next;                /* the token the next step feeds (at pos), -1 while prefilling */
    int32_t *mpos;           /* (n_prompt, 4) M-RoPE ids when the model has them and the prompt
                                images, else NULL (plain rope at the KV position) */
    int rope_delta;          /* with mpos: a generated token's ids are its KV position + this */
    int32_t dpos[4];         /* the decode token's ids */
    bool waiting;            /* admitted, but its prefix rows are awaited from another slot: no rows
                                computed until they exist or their sequence goes (prefix_share.h) */
    int filled;              /* rows computed before the next decode row: n_prompt; after a pause in
                                generation, also the tokens generated so far (their ids are in the
                                slot's tokens), computed again (or restored) when it resumes */
    bool paused;             /* preempted: its blocks went back to the pool (seq_pool.c); it runs no
                                rows until it resumes */
    bool done;
    int rc;
    char err[400];
};

/* A slot's rows, and a sequence's prompt, as prompt_rows (prompt_rows.h). */
static inline struct prompt_rows slot_rows(const struct kv_slot *s)
{
    return (struct prompt_rows){s->tokens, s->n_tokens, s->img, s->n_img};
}
static inline struct prompt_rows seq_rows(const struct engine_seq *q)
{
    return (struct prompt_rows){q->ids, q->n_prompt, q->rimg, q->job->n_images};
}

/* ---- prefix_cache.c: the KV blocks' prefix index ---- */
/* Slot's full blocks of computed rows (its n_tokens) not keyed yet enter the index: after a step. */
void prefix_cache_key_slot(struct engine *e, int slot);
/* slot, holding rows 0..keep-1 of the run r (a prompt at admission; a paused sequence's rows when
 * it resumes), takes the longest run of r's whole blocks, at most limit rows, that the index
 * holds when it is longer (mapped in place, shared); returns the rows it holds now. */
int prefix_cache_adopt(struct engine *e, int slot, const struct prompt_rows *r, int limit, int keep);

/* ---- seq_pool.c: the paged KV pool under pressure ---- */
/* The blocks of the runs fs[0..n) (in[i]'s), taken before a step: where the pool runs out, idle
 * slots give theirs back first (least recently used first, parked when parking is on), then the
 * newest running sequence is paused. A paused run leaves the list: returns the runs kept. */
int seq_pool_reserve(struct engine *e, struct engine_seq *const *seqs, int n_seqs, struct engine_seq **in,
                     struct forward_seq *fs, int n);
/* Paused sequences of seqs[0..n) resume, oldest first, while the pool holds their rows. */
void seq_pool_resume(struct engine *e, struct engine_seq *const *seqs, int n);

#endif
