/* session.h - the engine as the server sees it: load a model, run generation jobs.
 *
 * Only the engine thread calls into it. A job carries its prompt (chat messages or a raw
 * prompt), sampling settings and a token callback; the callback runs on the engine thread for
 * every piece of text (complete UTF-8, never past a stop string) and returns nonzero to cancel.
 * Jobs run as sequences (sequence.c): engine_seq_start gives a job a KV slot, and each
 * engine_step runs one forward over all running sequences. engine_run is one job alone. */
#ifndef TIDE_SESSION_H
#define TIDE_SESSION_H

#include "forward.h"
#include "kv_park.h"
#include "memory/plan.h"
#include "sample.h"
#include "template.h"
#include "tokenizer.h"

struct engine_options {
    const char *model_path;
    int n_ctx;          /* context length (tokens) of each sequence */
    int n_seq;          /* sequences at once (KV slots); 0: automatic (memory/plan.c) */
    int n_threads;      /* 0 = all cores */
    struct plan_options plan;   /* devices, split, reserves (n_ctx/n_threads copied in) */
};

/* A KV slot: the rows one sequence writes, remembered after it ends so that a later prompt
 * with the same prefix skips those rows. */
struct kv_slot {
    int *tokens;        /* (n_ctx) token of each row held (-1: an image row) */
    int n_tokens;       /* rows held and known */
    struct row_image *img; /* (ENGINE_MAX_IMAGES) the images among the rows, keyed (prompt_rows.h) */
    int n_img;
    bool busy;          /* a running sequence owns it */
    struct engine_seq *seq; /* that sequence (NULL when free): its prompt tells what rows come next */
    uint64_t last_use;
};

struct engine {
    struct model model;
    struct tokenizer *tok;
    enum chat_template_kind tmpl;   /* the fallback format: its stop strings */
    struct chat_template chat;      /* the GGUF's template, rendered per job */
    struct memory_plan mem;     /* devices, ledgers, expert caches */
    unsigned slow_token_us;     /* test hook TIDE_FAULT_SLOW_TOKEN_MS; 0 in normal runs */
    long fail_step;             /* test hook TIDE_FAULT_ENGINE_STEP: steps until one fails; 0 = off */
    struct forward_state fw;
    int n_ctx;
    struct kv_slot *slots; /* (n_slots) */
    struct kv_park park;   /* conversations parked in host RAM when their slot is taken */
    int n_slots;
    uint64_t use_clock;
    int img_open, img_close;  /* vision marker tokens around an image, -1 when the vocab has none */
    double last_forward_s;    /* the last engine_step's forward (forward_eval_batch), seconds; 0 when
                                 it ran none */
    bool kv_share;            /* prompts take prefix rows from other slots (prefix_share.h); off:
                                 only their own slot's and parked ones */
    bool one_seq;             /* one sequence runs at a time (engine_can_admit), whatever the slots:
                                 TIDE_ONE_SEQUENCE=1 */
    int prefix_wait_tokens;   /* a new prompt waits for a prefilling sequence's rows when they bring at
                                 least this many rows more than it can copy now (prefix_share.h); 0: never */
    /* counters (engine thread writes, the snapshot reads) */
    uint64_t shared_tokens;   /* prompt rows copied from another slot instead of computed */
    uint64_t block_cache_tokens; /* prompt rows found in the KV blocks' prefix index (prefix_cache.c) */
    uint64_t prefix_waits;    /* sequences that waited for another's prefix rows */
    uint64_t kv_pauses;       /* sequences paused because the paged KV pool ran out (seq_pool.c) */
    uint64_t kv_resumes;      /* ... and resumed */
    uint64_t kv_reclaims;     /* idle slots whose blocks went back to the pool for a running sequence */
    int *eog_ids;             /* the vocabulary's end-of-generation ids, listed for the first draw on
                                 the device that bans them (sequence.c), or NULL */
    int n_eog;
};

enum finish_reason { FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_ERROR };

#define JOB_MAX_STOP 8
#define ENGINE_PREFIX_WAIT_DEFAULT 64 /* prefix_wait_tokens when the config does not say */

/* In a chat message's text, this marker stands for the next image of the job: the image's
 * embeddings go in at its place (wrapped in the vocabulary's vision markers when it has them). */
#define ENGINE_IMAGE_MARKER "\x01tide:image\x01"
#define ENGINE_MAX_IMAGES 64

struct gen_prompt {
    const char *text;       /* or NULL: */
    const int *ids;         /* token ids, used as given */
    int n_ids;
};

struct gen_image {
    const float *embd;  /* (n_tokens, n_embd), or rows of row_floats */
    int n_tokens;
    int row_floats;     /* floats a row (0: n_embd); wider rows carry deepstack features (qwen3vl) */
    int grid_w;         /* tokens a row of the image's grid (M-RoPE positions); 0: not a grid */
    bool keyed;         /* key set: the image's rows may be reused from a slot or host RAM */
    uint8_t key[ROW_IMAGE_KEY_BYTES]; /* content hash of the image's bytes */
};

struct gen_job {
    /* input: either messages (chat) or prompt (raw completion) */
    const struct chat_message *messages;
    int n_messages;
    const char *prompt;
    const char *tools_json;   /* chat: the request's tools array as JSON text for the template, or NULL */
    const char *assistant_prefix; /* chat: text after the rendered prompt, the reply's forced opening
                                     (a tool call's "<tool_call>\n"), or NULL */
    const int *prompt_ids;  /* set: the raw prompt as token ids, used as given (no BOS added) */
    int n_prompt_ids;
    /* /v1/completions with several prompts (n_prompts > 1; prompt and prompt_ids above are then
     * unused): prompt p's choices are p * (n / n_prompts) .. (p + 1) * (n / n_prompts) - 1, the
     * OpenAI order, run one prompt after another in the job's sequence. */
    const struct gen_prompt *prompts;
    int n_prompts;
    struct sampling_params sp;
    int max_tokens;     /* -1: until the context is full */
    const char *stop[JOB_MAX_STOP];
    int n_stop;
    int n;              /* choices, run one after another in the job's sequence (over all prompts) */
    const struct gen_image *images;  /* one per ENGINE_IMAGE_MARKER, in order */
    int n_images;
    /* on_text(ud, choice, text, len, lp): lp is NULL unless sp.logprobs; the logprob
     * refers to the token that completed this text. Return nonzero to cancel. */
    int (*on_text)(void *ud, int choice, const char *text, size_t len,
                   const struct token_logprob *lp);
    void *ud;
    /* Called on the engine thread at every token boundary (between two forward steps) when
     * not NULL: where control work such as a cache resize runs without changing the output. */
    void (*boundary)(void *ud);
    /* Checked before every token when not NULL: nonzero stops the job (client gone). */
    const volatile int *cancel;
    /* output */
    int prompt_tokens;
    int cached_tokens;                   /* of prompt_tokens, rows its KV slot already held */
    int completion_tokens;               /* over all choices */
    enum finish_reason finish[16];       /* per choice (n <= 16) */
};

/* Loads the model, lays it out on the devices (forward stages), but leaves the expert caches
 * empty: call engine_size_caches once everything else resident (an eager encoder) is loaded. */
int engine_init(struct engine *e, const struct engine_options *o, char *err, size_t errlen);
int engine_size_caches(struct engine *e);
void engine_free(struct engine *e);
/* Count the prompt tokens a job would use (for validation before queueing); <0 on error. */
int engine_count_prompt(struct engine *e, const struct gen_job *job);
/* The job's prompt as tokens (malloc'd): template, tokenizer, the images' rows as -1 with
 * img_at[i] the first row of image i (ENGINE_MAX_IMAGES at most). */
int engine_prompt_tokens(struct engine *e, const struct gen_job *job, int **ids, int *n, int *img_at);
/* Run a job alone, start to end. 0 on success, TIDE_ECANCELED when the callback asked to
 * stop, TIDE_ERANGE when the prompt does not fit the context (err says so), other negatives
 * on failure. */
int engine_run(struct engine *e, struct gen_job *job, char *err, size_t errlen);

/* ---- sequences (sequence.c) ---- */
struct engine_seq;
/* Tokenise the job's prompt, check that it fits, and give it the free KV slot whose rows share
 * the longest prefix with it; a longer prefix parked in host RAM or held by another slot (a
 * running sequence's computed rows too) is copied in; and when a sequence still prefilling
 * shares prefix_wait_tokens more, the new one waits for those rows (prefix_share.h). The rows
 * not computed are job->cached_tokens. TIDE_EFULL: no slot is free. Errors as engine_run's,
 * err saying why. */
int engine_seq_start(struct engine *e, struct gen_job *job, struct engine_seq **out, char *err, size_t errlen);
/* One forward over the running sequences seqs[0..n) (in admission order): a decode row for each
 * one that is generating, then prompt chunks up to max_rows rows in all; then each sequence with
 * logits samples and hands its text to its job. A cancelled job's sequence ends first. Returns
 * 0, or the forward's error (every sequence of that step then ends with it). */
int engine_step(struct engine *e, struct engine_seq *const *seqs, int n, int max_rows);
/* True when q has ended: *rc 0, or why it failed (*err says so, or is empty). */
bool engine_seq_done(const struct engine_seq *q, int *rc, const char **err);
/* Give the slot of q, which has ended, back now (its rows stay there for a later prompt with the
 * same prefix); q itself stays readable (engine_seq_done) until engine_seq_free. */
void engine_seq_release(struct engine *e, struct engine_seq *q);
/* Release q and its slot (its rows stay there for a later prompt with the same prefix). */
void engine_seq_free(struct engine *e, struct engine_seq *q);
int engine_free_slots(const struct engine *e);
/* The KV pool as the page and /metrics show it (seq_pool.c): blocks of block_rows positions (one
 * block a slot of context positions when not paged), those the running sequences' slots hold,
 * those only idle slots hold (rows kept for a later prompt), the free ones, those that more than
 * one slot holds in place, and the sequences paused for blocks now. */
struct engine_kv_stats {
    int block_rows, blocks, running, cached, free, shared, paused;
    bool paged;
};
void engine_kv_stats(const struct engine *e, struct engine_kv_stats *out);
/* Whether a new sequence may start now: a slot is free and no sequence is paused for KV blocks
 * (seq_pool.c: paused ones go first). */
bool engine_can_admit(const struct engine *e);

#endif
