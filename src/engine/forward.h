/* forward.h - one model's forward pass over one or more devices, with its KV cache.
 *
 * The layers are cut into stages, one per device: a stage holds its layers' resident weights
 * (attention, norms, router; the embeddings on the first stage, the output head on the last),
 * its part of the KV cache and its activation buffers, all in that device's memory and all
 * charged to its ledger. Activations cross devices between stages through a host buffer.
 * Experts are reached only through the stage's expert cache (memory/expert_cache.h); a stage
 * without one reads them straight from host RAM (the single-device test path).
 *
 * The KV cache has n_seq slots of up to n_ctx positions each: one per sequence that may run at
 * once. Its rows live in a pool of blocks (kv_blocks.h): paged, blocks of kv_block_rows positions
 * taken as a slot's rows grow and shared in place between slots, where every stage's backend has
 * attention_paged (forward_kv_paged_why); else one block of n_ctx positions per slot.
 * forward_eval_batch() runs one step over several sequences (each its slot, its positions, its
 * tokens: a decode token or a prompt chunk) with every product over all of the step's rows at
 * once and attention per sequence; forward_eval() is the one-sequence form (slot 0) that runs
 * n tokens at positions pos..pos+n-1 in chunks of up to max_batch and leaves the logits of
 * the last one in s->logits (host). */
#ifndef TIDE_FORWARD_H
#define TIDE_FORWARD_H

#include "backend.h"
#include "kv_blocks.h"

#define FORWARD_MAX_STAGES 16
#define FORWARD_MAX_SEQ 256 /* sequences a step may hold (KV slots at most) */

struct device;
struct expert_cache;

/* The KV cache's element type (config key kv_type, docs/CONFIG.md). KV_F32 is 0, so a zeroed
 * spec keeps an f32 cache. KV_AUTO is the config's default, resolved by the memory plan: f16 on
 * every backend, except where an architecture has no f16 form (forward.c). */
enum kv_type { KV_F32 = 0, KV_F16 = 1, KV_AUTO = 2 };

struct forward_stage_spec {
    struct device *dev;          /* NULL: allocate with be directly, weights used in place */
    struct backend be;           /* ignored when dev is set (dev->be is used) */
    uint32_t l0, l1;             /* layers [l0, l1) */
    struct expert_cache *cache;  /* NULL: experts from host RAM */
    enum kv_type kv_type;        /* the first stage's sets the whole state's (KV_F32 or KV_F16;
                                    forward_kv_f16_why can turn f16 into f32) */
    int kv_block_rows;           /* the first stage's: positions a KV block, a power of two (0: one
                                    block of n_ctx a slot; so is a model or backend that cannot page,
                                    forward_kv_paged_why) */
    int kv_blocks;               /* the first stage's: blocks in the pool when paged (0: n_seq slots' worth) */
};

/* Positions a KV block when the config does not say (vLLM's default block size too). */
#define FORWARD_KV_BLOCK_ROWS 16

/* The activation buffers that grow with the chunk: one set for a single token (decode),
 * one for max_batch tokens (prefill). */
#define FORWARD_N_BATCH_BUFS 12
struct stage_bufs {
    float *x, *xb, *xb2;         /* (batch, n_embd) */
    float *q, *att_out;          /* (batch, n_head*head_dim) */
    float *hb, *hb2;             /* (batch, max(n_ff, n_ff_exp)) */
    float *router;               /* (batch, n_expert) */
    float *moe_in, *moe_out;     /* (batch, n_embd) */
    float *k_new, *v_new;        /* (batch, n_head_kv*head_dim): a step of several sequences
                                    rotates its new K/V rows here before they go to each slot */
};

enum prefill_mode {
    PREFILL_NONE,        /* not set up yet: prompts run one token at a time */
    PREFILL_OWN,         /* its own buffer (workspace) */
    PREFILL_BORROW,      /* carved from the expert cache's tail segments for each chunk */
};

struct forward_stage {
    struct device *dev;
    struct backend be;
    uint32_t l0, l1;
    bool first, last;
    struct expert_cache *cache;
    struct model_layer *layers;  /* (l1-l0) resident weights, views into device memory */
    struct tensor tok_embd;      /* first stage: (n_embd, n_vocab) */
    struct tensor output_norm;   /* last stage: (n_embd) */
    struct tensor output;        /* last stage: (n_embd -> n_vocab) */
    void **owned;                /* device blocks this stage allocated, for free */
    size_t *owned_bytes;
    int *owned_kind;
    int n_owned, cap_owned;
    void *k_cache, *v_cache;     /* (l1-l0, kv.n_blocks, kv.block_rows, n_head_kv*head_dim) of float, or
                                    of f16 (uint16_t) when the state's kv_f16; MLA: v_cache is k_cache.
                                    Not paged: (l1-l0, n_seq, n_ctx, ...), block s being slot s */
    /* the buffers of the chunk being run: dec or pre below */
    float *x, *xb, *xb2, *q, *att_out, *hb, *hb2, *router, *moe_in, *moe_out, *k_new, *v_new;
    struct stage_bufs dec;       /* batch n_seq (a decode token per sequence), always there */
    struct stage_bufs pre;       /* batch max_batch: owned, or borrowed while a chunk runs */
    enum prefill_mode prefill;
    float *att;                  /* (n_head, n_ctx) */
    float *logits;               /* last stage: (n_seq, n_vocab), then n_seq int32 picks, then n_seq
                                    struct sample_logprob (backend_i.sample's) */
    /* backend_i.route output: a chunk's (n, 2 * n_expert_used) at 0, then a decode step's
     * per layer ((l1-l0), 2 * n_expert_used) after max_batch such rows */
    int32_t *route;
    bool table_ok;               /* the backend runs every layer's experts from a device table */
    bool from_table;             /* this decode step does: its experts are all resident */
    /* Recorded decode steps (backend_i.graph_*): a step from the table reads its position and
     * token from step_at, so one recording of the stage's layers replays at every position. */
    int32_t *step_at;            /* (2) position, token id: uploaded before each such step */
    float *kv_new;               /* (2, n_head_kv*head_dim) the step's new k and v rows */
    /* A decode step of several sequences (one token each): row r's position, then its slot,
     * uploaded before the step, read by qk_norm_rope_at / attention_at for all rows at once. */
    int32_t *rows_at;            /* (2, n_seq): positions, then slots */
    /* Paged: the block tables (kv.table, (n_seq, kv.per_slot)) in this stage's memory, where
     * attention_paged and the rows' _paged ops read them; each step uploads those of its slots'
     * tables that changed before its ops (forward_eval_batch), so a recorded step replays with
     * the current ones. */
    int32_t *kv_tables;
    bool rows;                   /* this step runs that way */
    void *graph;                 /* the recording, or NULL */
    int graph_slot;              /* the KV slot it was recorded for */
    bool graph_warm;             /* a step ran op by op since the workspaces last changed */
    bool graph_off;              /* not recordable here (no slots, failed once, TIDE_NO_GRAPHS) */
};

struct forward_state {
    const struct model *m;
    int n_ctx;
    bool kv_f16;         /* the KV cache holds f16 (new rows computed in f32, rounded as stored) */
    int n_seq;           /* KV slots: sequences that can run at once */
    struct kv_blocks kv; /* which pool blocks hold which slot's rows */
    int max_batch;       /* rows of a step: the prefill buffers' size (>= n_seq) */
    int n_stage;
    struct forward_stage stage[FORWARD_MAX_STAGES];
    /* host side */
    float *host_x;       /* (max_batch, n_embd) activations crossing devices */
    int32_t *host_route; /* (max(max_batch, n_layer), 2 * n_expert_used) route() output */
    int *moe_sel;        /* (max_batch, n_expert_used) chosen experts per token */
    float *moe_w;        /* (max_batch, n_expert_used) their weights */
    int *moe_tok;        /* (max_batch * n_expert_used) tokens routed to each expert, by expert */
    float *moe_tokw;     /* (max_batch * n_expert_used) their weights for it */
    int *moe_off;        /* (n_expert + 1) where each expert's tokens start in moe_tok */
    float *logits;       /* (n_seq, n_vocab) the logits a step asked for, one row a sequence */
    int *iota;           /* (max_batch) 0, 1, 2, ...: row lists for gather_rows */
    int32_t *kv_sent;    /* paged: (n_seq, kv.per_slot) the table entries every stage's kv_tables
                            holds (-2: not sent), so a step uploads only a table that changed */
    void (*logits_free)(void *ctx, void *p); /* set when logits came from a backend's host_alloc */
    void *logits_ctx;
    uint64_t n_expert_calls;
    /* A backend that failed keeps failing (a CUDA error is sticky: every later op and copy does
     * nothing): after each step every stage's backend is asked, and the first failure is kept
     * here; every later step returns TIDE_EINTERNAL at once. */
    bool backend_failed;
    char backend_err[256];
    bool decode_rows;           /* a decode step's sequences share the rows' ops (TIDE_DECODE_ROWS=0: off) */
    long fault_backend_steps;   /* test hook TIDE_FAULT_BACKEND_ERROR: steps until the backend
                                   "fails" as a sticky CUDA error would; 0 = off */
};

/* Memory one stage needs, by ledger kind, before any expert cache. workspace holds the
 * decode buffers; prefill is what an own prefill buffer for max_batch tokens adds. */
struct forward_stage_bytes {
    size_t weights, kv, workspace, prefill;
};
void forward_stage_size(const struct model *m, int n_ctx, int n_seq, int max_batch, uint32_t l0, uint32_t l1,
                        bool first, bool last, enum kv_type kv, struct forward_stage_bytes *out);
/* NULL when model m's KV cache can be paged on backends be[0..n) (each has attention_paged, and the
 * model's attention reads the rows through it); else why each slot keeps one block of n_ctx:
 * deepseek2's MLA latent, a sink attention that reads one piece, a backend without the op, a CUDA
 * device with TIDE_CUDA_PAGED=0. */
const char *forward_kv_paged_why(const struct model *m, const struct backend *be, int n);
/* Whether CUDA devices take the paged KV cache (on unless TIDE_CUDA_PAGED=0 in the environment,
 * read once). on: 1 or 0 sets it (tests), -1 only reads it. Returns the previous value. */
int forward_set_cuda_paged(int on);
/* Bytes of a pool of `rows` positions over layers [l0, l1). */
size_t forward_kv_pool_bytes(const struct model *m, uint32_t l0, uint32_t l1, size_t rows, enum kv_type kv);
/* NULL when model m's KV cache can be f16 on backends be[0..n) (n 0: any that has the f16
 * ops); else why it stays f32 (deepseek2's latent, gpt-oss's sink attention, a head_dim the
 * f16 attention does not take, a backend without the f16 ops). */
const char *forward_kv_f16_why(const struct model *m, const struct backend *be, int n);

int forward_init_stages(struct forward_state *s, const struct model *m, int n_ctx, int n_seq, int max_batch,
                        const struct forward_stage_spec *sp, int n_stage);
/* One stage on backend be, weights in place: the simple single-device form. */
int forward_init(struct forward_state *s, const struct model *m, struct backend be, int n_ctx);
void forward_free(struct forward_state *s);
/* Give stage i its prefill buffer: its own (allocated now, through the device) or borrowed
 * from its expert cache for each chunk. Until then prompts run a token at a time. */
int forward_setup_prefill(struct forward_state *s, int i, enum prefill_mode mode);
/* Returns 0 and s->logits filled for the last token, or a negative code.
 * pos + n must be <= n_ctx. */
int forward_eval(struct forward_state *s, const int *tokens, int n, int pos);
/* The same with input embeddings (n, n_embd) in host memory instead of token ids (images). */
int forward_eval_embd(struct forward_state *s, const float *embd, int n, int pos);
/* forward_eval of one decode token that leaves only the greedy choice of its logits in *next
 * (sampler_argmax's rule). Where the last stage's backend has argmax the pick is made on the
 * device and s->logits is left stale: one int crosses to the host instead of n_vocab floats. */
int forward_eval_greedy(struct forward_state *s, int token, int pos, int *next);
/* KV bytes for n_ctx positions of all layers, in elements of type kv (KV_F32 or KV_F16). */
size_t forward_kv_bytes(const struct model *m, int n_ctx, enum kv_type kv);

/* One sequence's part of a step of forward_eval_batch. */
struct forward_seq {
    int slot;            /* its KV slot, 0..n_seq-1 */
    int pos;             /* position of its first row here; rows 0..pos-1 of the slot are its past */
    int n;               /* rows this step (>= 1): a decode token, or a prompt chunk */
    const int *tokens;   /* (n) token ids, or NULL: */
    const float *embd;   /* (n, n_embd) input embeddings in host memory (an image's rows) */
    int embd_stride;     /* floats from one embd row to the next (0: n_embd); a wider row carries
                            the model's deepstack features after its embedding (qwen3vlmoe: slice k
                            added to the hidden state after layer k, docs/DESIGN.md "Qwen3-VL") */
    const int32_t *mpos; /* (n, 4) M-RoPE position ids of the rows (host), or NULL: plain rope at
                            pos.. (rows with them take the op-by-op path; backend_i.rope_multi) */
    bool want_logits;    /* the logits of its last row are wanted */
    bool pick_only;      /* ... only their greedy choice: made on the device where it can be */
    const struct sample_row *draw; /* ... only a draw with these parameters (u included), made by the
                                      last stage's backend_i.sample: set only where it has that slot */
    struct sample_logprob *logprob; /* with draw->logprobs: where the draw's logprobs go (host) */
    /* out, when want_logits: */
    const float *logits; /* (n_vocab) host, valid until the next step; NULL when only pick was made */
    int pick;            /* the greedy choice (sampler_argmax's rule) when pick_only, the draw when draw,
                            else -1 */
};
/* One step over n_seq sequences (distinct slots): every product runs once over all their rows,
 * attention per sequence over its own slot. Each row's result is what it would be in a step of
 * its own on the CPU backend (bit for bit), and up to a product's summation order on a GPU.
 * Steps larger than the bound buffers allow are cut into several, in order. */
int forward_eval_batch(struct forward_state *s, struct forward_seq *seqs, int n_seq);
/* Rows a step may hold without being cut: n_seq always; max_batch where the prefill buffers
 * are bound (own, or borrowed when the cache can lend them). */
int forward_step_rows(const struct forward_state *s);
/* Bytes of KV one token position holds over every layer (K and V, in the cache's type). */
size_t forward_kv_row_bytes(const struct forward_state *s);
/* Slot `slot`'s KV rows from..n-1, every layer, to host memory (save) or back from it: host holds
 * host_n >= n positions (host_n * forward_kv_row_bytes bytes), layer by layer, each layer's K
 * rows (host_n, kvd) then its V rows, in the cache's type (the bytes the device holds); rows
 * from..n-1 of each are copied (a restore keeps the slot's rows before from). A save returns
 * with the bytes on the host; a restore is ordered before the next step's ops. */
int forward_kv_copy_rows(struct forward_state *s, int slot, int from, int n, void *host, int host_n, bool save);
/* forward_kv_copy_rows of rows 0..n-1 */
static inline int forward_kv_copy(struct forward_state *s, int slot, int n, void *host, int host_n, bool save)
{
    return forward_kv_copy_rows(s, slot, 0, n, host, host_n, save);
}
/* Slot src's KV rows 0..n-1, every layer, K and V, become slot dst's rows 0..n-1: one sequence's
 * computed prefix reused by another. Paged, src's full blocks are shared in place (read-only) and
 * a last partial one is copied; else the rows are copied on the device (backend_i.copy; through
 * host memory where a backend has none). Ordered after the steps that wrote src, before the next
 * step. Returns the rows dst now holds from src (n; fewer, a whole number of blocks, when the
 * pool has no block for the partial one), or a negative code. */
int forward_kv_clone(struct forward_state *s, int src, int dst, int n);
/* Makes slot's rows from..to-1 writable (rows before from kept): blocks taken from the pool, a
 * shared block it writes into copied first. TIDE_EFULL, nothing changed, when the pool has too
 * few free blocks (kv_blocks_need says how many). Steps do this themselves; the scheduler does it
 * first to choose whom to pause when the pool runs out. */
int forward_kv_reserve(struct forward_state *s, int slot, int from, int to);
/* Slot keeps rows 0..rows-1; blocks past them go back to the pool. */
void forward_kv_trim(struct forward_state *s, int slot, int rows);

/* Prefill chunk: the CPU's default, and the one when any stage is on a CUDA device. A GPU
 * runs every op of a chunk in a handful of launches whatever n, so a longer chunk divides
 * the launches (and the expert fetches) of a prompt; the CPU gains nothing past 64. */
#define FORWARD_DEFAULT_BATCH 64
#define FORWARD_CUDA_BATCH 512

#endif
