/* backend.h - the operations the forward pass needs, as a table of function pointers.
 *
 * The CPU backend (backend_cpu.c) and the CUDA backend fill the same slots; the forward
 * (forward_eval.c) calls only these, so switching a layer's device is switching a table.
 * Vectors are f32 in the backend's memory; matrices are struct tensor views of any
 * supported type (f32, f16, bf16, q8_0) dequantised on the fly. */
#ifndef TIDE_BACKEND_H
#define TIDE_BACKEND_H

#include "model.h"

/* One token's change to a row's logits before backend_i.sample draws (the host sampler's
 * logit_bias, repetition_penalty and presence/frequency penalties, sample.h, as a sparse list:
 * the sequence's biased, prompt and generated tokens only). Applied in this order to x = the
 * logit of id, each in float arithmetic as the host sampler does it:
 *   MASK: x = -inf before anything else, the logprobs included (sampler_constrain's
 *         end-of-generation ban while min_tokens or ignore_eos hold);
 *   BAN or MASK: x = -inf; else BIAS: x = x + bias;
 *   SEEN: x = x > 0 ? x / row.repetition_penalty : x * row.repetition_penalty;
 *   SUB: x = x - sub (sub = presence + frequency * count, computed by the host). */
enum { SAMPLE_EDIT_BIAS = 1, SAMPLE_EDIT_BAN = 2, SAMPLE_EDIT_SEEN = 4, SAMPLE_EDIT_SUB = 8, SAMPLE_EDIT_MASK = 16 };
struct sample_edit {
    int32_t id;          /* 0 <= id < n_vocab; an id appears at most once in a row's list */
    uint32_t what;       /* SAMPLE_EDIT_* flags */
    float bias;
    float sub;
};

#define SAMPLE_ROW_MAX_TOP 20 /* top_logprobs' bound (OpenAI's) */

/* What backend_i.sample brings back for a row with logprobs: log-softmax of the row's logits as
 * they came in (before the edits: they describe the model, not the sampling settings). */
struct sample_logprob {
    int32_t id;          /* the token drawn */
    float logprob;       /* its logprob */
    int32_t n_top;       /* = the row's top_logprobs (<= n_vocab) */
    int32_t top_ids[SAMPLE_ROW_MAX_TOP]; /* the n_top largest logits, descending, ties to the lower id */
    float top_logprobs[SAMPLE_ROW_MAX_TOP];
};

/* One row's parameters for backend_i.sample (a host array, one entry per row). Zeroed fields
 * past u mean no edits and no logprobs. */
struct sample_row {
    float temperature;   /* > 0 (a row with !(temperature > 0) is drawn as at FLT_MIN: its top logits
                            only; with u = 0, top_k/top_p/min_p off, that is the greedy choice) */
    int top_k;           /* <= 0: off */
    float top_p;         /* off unless 0 < top_p < 1 */
    float min_p;         /* <= 0: off */
    double u;            /* uniform in [0, 1), drawn by the host from the sequence's seeded RNG */
    const struct sample_edit *edits; /* (n_edits) host array, applied before the draw; NULL: none */
    int n_edits;
    float repetition_penalty;        /* SAMPLE_EDIT_SEEN's divisor / factor */
    bool logprobs;       /* bring back a struct sample_logprob for this row */
    int top_logprobs;    /* 0..SAMPLE_ROW_MAX_TOP */
};

/* One layer's (token, choice) pairs of a prefill chunk, grouped by expert (backend_i.moe_ffn_batch):
 * n tokens of k choices each are n * k pairs, sorted by expert; group g (one expert, ex[g]) owns
 * pairs [off[g], off[g+1]) (at least one). Pair p is token tok[p] with weight w[p]; every token
 * owns exactly k pairs. All arrays are host memory. */
struct moe_batch {
    int n, k;
    int n_group;
    const int *off;                  /* (n_group + 1), off[0] = 0, off[n_group] = n * k */
    const int *tok;                  /* (n * k) */
    const float *w;                  /* (n * k) */
    const struct expert_weights *ex; /* (n_group) views; only [g0, g1) are read by a call */
    int g0, g1;                      /* the groups this call computes */
};
/* The vision encoder's activations (backend_i.activate). */
enum act_kind { ACT_GELU, ACT_GELU_QUICK, ACT_SILU };

struct backend_i {
    const char *name;
    void *(*alloc)(void *ctx, size_t bytes);          /* device memory, NULL on failure */
    void (*free)(void *ctx, void *ptr);
    /* y(rows, n) = W x(cols, n): x and y are n vectors laid out one after another. */
    void (*matmul)(void *ctx, const struct tensor *w, const float *x, float *y, int n);
    /* y(rows, n) += W x: the residual add fused into the product that feeds it. Bit for bit
     * matmul into a temporary, then axpy(y, tmp, 1.0f) (a * x is exact for a = 1). NULL: the
     * caller does those two ops. */
    void (*matmul_add)(void *ctx, const struct tensor *w, const float *x, float *y, int n);
    /* y[m](rows_m, n) = w[m] x for m = 0..2, three products of one input (wq, wk, wv) in one
     * op: each output bit for bit its own matmul. The w[m] share x's width (cols). With norm
     * (else NULL), x is first normed as rmsnorm(x, norm, xn, cols, n, eps) does and the
     * products read xn (n, cols). NULL: the caller runs rmsnorm and three matmuls. */
    void (*matmul3)(void *ctx, const struct tensor *const w[3], const float *x, float *const y[3], int n,
                    const struct tensor *norm, float eps, float *xn);
    /* out = x / rms(x) * w, per vector of length dim, n vectors. */
    void (*rmsnorm)(void *ctx, const float *x, const struct tensor *w, float *out, int dim,
                    int n, float eps);
    /* Rotate n tokens of n_heads heads of head_dim, token t for position pos + t:
     * vec (n, n_heads*head_dim). */
    void (*rope)(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, float theta,
                 enum rope_kind kind);
    /* The attention's head norms and rope in one op, n tokens at positions pos..: q (n,
     * n_head*head_dim) and k (n, n_head_kv*head_dim) in place; each head rmsnormed by q_norm /
     * k_norm (head_dim weights; NULL: no norm, as llama) and then rotated. Bit for bit the
     * rmsnorm(q), rmsnorm(k), rope(q), rope(k) ops it stands for. NULL: the caller runs those. */
    void (*qk_norm_rope)(void *ctx, float *q, float *k, const struct tensor *q_norm,
                         const struct tensor *k_norm, int n, int n_head, int n_head_kv, int head_dim,
                         int pos, float theta, enum rope_kind kind, float eps);
    /* Causal attention for n query tokens at positions pos..pos+n-1: token t attends to kv
     * positions 0..pos+t. q, out (n, n_head*head_dim); k_cache/v_cache (n_ctx,
     * n_head_kv*head_dim) for this layer, rows 0..pos+n-1 already written; att scratch
     * (n_head, n_ctx) a backend may use. */
    void (*attention)(void *ctx, const float *q, const float *k_cache, const float *v_cache,
                      float *out, float *att, int n, int pos, int n_head, int n_head_kv,
                      int head_dim);
    /* gate = silu(gate) * up, n elements. */
    void (*swiglu)(void *ctx, float *gate, const float *up, int n);
    /* attention with gpt-oss's two extras. sinks (n_head floats in backend memory, or NULL):
     * head h's softmax denominator gains exp(sinks[h]), a logit whose value row is zero.
     * window > 0: the token at position p attends to kv positions max(0, p - window + 1)..p
     * only (a sliding-window layer). Otherwise as attention over the caches as attention_f16
     * (f16) and attention_paged (blocks, block_rows; NULL: contiguous) read them, where
     * attention_sinks_any_cache says the backend has those forms (else f32 contiguous only).
     * NULL where the backend has none. */
    void (*attention_sinks)(void *ctx, const float *q, const void *k_cache, const void *v_cache, bool f16,
                            const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos,
                            int n_head, int n_head_kv, int head_dim, const float *sinks, int window);
    bool attention_sinks_any_cache;
    /* Rope with a frequency per pair (kind's pairs: NEOX (i, i + head_dim/2), NORM (2i, 2i+1)): n tokens of n_heads
     * heads, token t at position pos + t, pair i turned by (pos + t) * freqs[i] (head_dim / 2
     * <= 256 floats in host memory, read when the op is queued: model.rope_freqs), and the
     * result scaled by mscale: rope scaling (gpt-oss's yarn, deepseek2's rope). NULL where the
     * backend has none. */
    void (*rope_freqs)(void *ctx, float *vec, int n, int n_heads, int head_dim, int pos, const float *freqs,
                       float mscale, enum rope_kind kind);
    /* M-RoPE (engine/mrope.h): n tokens of n_heads heads, token t's four position ids at
     * pos[4t..4t+3] (host memory), pairs per section in sections, interleaved (Qwen3-VL) or
     * not. NULL where the backend has none (CUDA: the forward then refuses such rows). */
    void (*rope_multi)(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta,
                       const uint32_t sections[4], bool interleaved);
    /* gpt-oss's clamped SwiGLU, n elements: with g = min(gate, limit) and u = clamp(up, -limit,
     * limit), gate = g * sigmoid(alpha * g) * (u + 1). NULL where the backend has none. */
    void (*swiglu_oai)(void *ctx, float *gate, const float *up, int n, float alpha, float limit);
    /* y += a * x */
    void (*axpy)(void *ctx, float *y, const float *x, float a, int n);
    /* y (n, dim) += s_t * x (n, dim), row t scaled by s_t = 1 / (1 + exp(-g[t])): a gate
     * computed on the device (g: n floats in backend memory), qwen2moe's shared expert. Row t
     * gets the bits of axpy(y_t, x_t, s_t). */
    void (*axpy_sigmoid)(void *ctx, float *y, const float *x, const float *g, int n, int dim);
    /* y[rows[i]] += w[i] * x[i] for i = 0..n-1 in that order: y (*, dim), x (n, dim); rows
     * (distinct) and w are host arrays. The same per-row result as an axpy per i. */
    void (*scatter_axpy)(void *ctx, float *y, const float *x, const int *rows, const float *w, int n,
                         int dim);
    /* row `id` of an embedding table (any type) as f32 into out. */
    void (*get_row)(void *ctx, const struct tensor *t, int id, float *out);
    /* out (n, ne0) = rows ids[0..n) of the table as get_row gives them (ids: a host array, valid
     * rows): a prompt's embeddings in a few launches instead of one a token. */
    void (*get_rows)(void *ctx, const struct tensor *t, const int *ids, int n, float *out);
    /* Host <-> device copies (plain memcpy on the CPU). upload may be asynchronous on a
     * copy stream but is ordered before any later op on this backend; pageable (malloc'ed)
     * src_host may be reused once it returns (CUDA stages such memory before returning), pinned
     * memory (host_alloc) only after a sync. download returns once the bytes are on the host. */
    void (*upload)(void *ctx, void *dst, const void *src_host, size_t bytes);
    void (*download)(void *ctx, void *dst_host, const void *src, size_t bytes);
    /* Device to device within this backend's memory (regions apart), ordered after the ops
     * queued before it and before those after: one sequence's KV rows into another's slot.
     * NULL: the caller goes through host memory (download, upload). */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* dst (n, dim) = src rows rows[0..n) (rows is a host array). */
    void (*gather_rows)(void *ctx, float *dst, const float *src, const int *rows, int n,
                        int dim);
    /* x[0..n) = 0 */
    void (*zero)(void *ctx, float *x, int n);
    /* Wait until every op queued on this backend has finished. */
    void (*sync)(void *ctx);
    /* One token's MoE FFN over its k chosen experts (views in this backend's memory, all
     * valid at once), weights w[0..k) (host array): y (n_embd) = sum over j = 0..k-1, in that
     * order, of w[j] * down_j(silu(gate_j x) * up_j x) - the same result as zero, then per
     * expert matmul, matmul, swiglu, matmul, axpy. hb, hb2 (n_ff_exp) and tmp (n_embd) are
     * scratch a backend may use. Returns 0, or TIDE_EUNSUPPORTED with nothing done (types or
     * shapes it does not fuse: the caller runs the per-expert ops), or another negative code.
     * x NULL is a probe: nothing runs, the answer says whether views of these types and
     * shapes would (ex may then be host views). NULL when the backend has no fused form.
     * add: y += that sum instead (the residual add fused in), bit for bit the sum into a
     * temporary, then axpy(y, tmp, 1.0f). */
    int (*moe_ffn)(void *ctx, const struct expert_weights *ex, const float *w, int k, const float *x,
                   float *y, float *hb, float *hb2, float *tmp, bool add);
    /* Top-k routing of n tokens from their router logits (n, n_expert), all in backend memory.
     * out (backend memory) receives sel (n, k) int32, each token's k experts in ascending
     * index order, then w (n, k) f32, their weights: softmax over all n_expert logits, the top
     * k kept (ties: the lower index), renormalised over the k when norm (Mixtral's softmax over
     * the selected logits). On a GPU this keeps the router logits on the device: only the
     * 2nk words of out travel, and a decode step whose experts are all resident needs none. */
    void (*route)(void *ctx, const float *logits, int n, int n_expert, int k, bool norm, int32_t *out);
    /* moe_ffn for one token whose experts are found on the device, without the host: table
     * (backend memory) holds, per expert of this layer, the addresses of its gate, up and down
     * data (3 pointers an expert, every one valid); routed is one token's route() output (k
     * ids, then k weights). shape gives the types and shapes (any expert of the layer). Same
     * arithmetic as moe_ffn with the same experts and weights, so the two are interchangeable
     * bit for bit. x NULL is a probe (as in moe_ffn). add as in moe_ffn. NULL when the backend
     * has no such form. */
    int (*moe_ffn_table)(void *ctx, const struct expert_weights *shape, const void *const *table,
                         const int32_t *routed, int k, const float *x, float *y, bool add);
    /* route() of n tokens' router logits (n, n_expert; backend memory) into routed (n rows of
     * 2k words: a row's k ids, then its k weights), then moe_ffn_table of each token from its
     * row: x, y (n, n_embd). One token: the same bits in routed and y as the two ops. Several
     * (a decode step of several sequences): the tokens are grouped by expert on the device, so
     * each chosen expert's weights are read once a step, with nothing waiting for the host;
     * routed is route()'s bits and y each token's moe_ffn up to summation order. Returns as
     * moe_ffn_table (x NULL: a probe). NULL where the backend has no table form. */
    int (*moe_ffn_table_route)(void *ctx, const struct expert_weights *shape, const void *const *table,
                               const float *logits, int n, int n_expert, bool norm, int32_t *routed, int k,
                               const float *x, float *y, bool add);
    /* Host memory that download fills at full speed (page-locked on a GPU), for the buffers a
     * step downloads every token; NULL on failure. NULL slots: plain malloc/free serve. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* Replayable recordings of queued work (CUDA graphs): the ops queued between graph_begin
     * and graph_end are recorded, not run; graph_end returns them as *graph (owned by the
     * caller, graph_free), and graph_launch queues one replay, with the same arguments the ops
     * were recorded with. What is recorded must not wait for the host (no download) nor need
     * a workspace larger than the ops last had (run them once outside a recording first).
     * After a failed recording nothing is left half-done: graph_end returns the error and the
     * backend queues ops again. NULL on backends without them (the CPU). */
    int (*graph_begin)(void *ctx);
    int (*graph_end)(void *ctx, void **graph);
    /* TIDE_ESTALE: a workspace the recording uses has been replaced since (grown by a larger
     * op): free it and record again. */
    int (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);
    /* Decode-row ops whose positions (or token id) are read from backend memory when they run,
     * not fixed when they are queued, so that one recorded decode step replays at every
     * position, and a step of n sequences (one new token each, each in its own KV slot) runs
     * in one launch or two instead of a few per sequence. at (n int32) and slot (n int32, or
     * NULL: all slot 0) are in backend memory; row r is at position at[r] in slot slot[r],
     * whose caches start slot[r] * slot_floats floats into k_cache / v_cache (caches (n_ctx,
     * kvd) a slot, kvd = n_head_kv*head_dim). One row: bit for bit the plain ops.
     * qk_norm_rope_at: qk_norm_rope of q (n, n_head*head_dim) and of k_new (n, kvd), row r at
     * position at[r], the rotated k rows stored to their slots' k_cache rows at[r] and v_new's
     * rows to v_cache. attention_at: attention of row r's query over its slot's k/v rows
     * 0..at[r] into out (n, n_head*head_dim); n_ctx bounds at[r]. get_row_at: get_row of row
     * *at. NULL where positions are plain arguments only (the CPU). A paged KV cache has its own
     * forms of the first two (qk_norm_rope_at_paged, attention_at_paged below). */
    void (*qk_norm_rope_at)(void *ctx, float *q, const float *k_new, const float *v_new, float *k_cache,
                            float *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_floats,
                            const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                            int head_dim, float theta, enum rope_kind kind, float eps);
    void (*attention_at)(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out, int n,
                         const int32_t *at, const int32_t *slot, size_t slot_floats, int n_ctx, int n_head,
                         int n_head_kv, int head_dim);
    void (*get_row_at)(void *ctx, const struct tensor *t, const int32_t *at, float *out);
    /* ---- the KV cache in f16 (forward_state.kv_f16, docs/DESIGN.md "Who owns which memory").
     * New K/V rows are computed in f32 and rounded to f16 as they are stored (to nearest, ties
     * to even: every backend stores the same bits); these ops read f16 rows, widen them (exact)
     * and compute as their f32 forms above: each is its f32 form over the widened cache, bit
     * for bit on the CPU, up to summation order on a GPU. NULL where the backend has no such
     * form: the forward keeps an f32 cache there. ---- */
    /* dst[0..n) = f16(src[0..n)) */
    void (*store_f16)(void *ctx, uint16_t *dst, const float *src, size_t n);
    void (*attention_f16)(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                          float *att, int n, int pos, int n_head, int n_head_kv, int head_dim);
    /* Causal attention over a paged KV cache (docs/DESIGN.md "KV blocks"): attention (f16:
     * attention_f16) of n query tokens at positions pos..pos+n-1 where the sequence's KV row p
     * is row p % block_rows of block blocks[p / block_rows]; block b's rows start
     * b * block_rows * kvd elements (float, or uint16_t f16 when f16) into k_pool / v_pool
     * (kvd = n_head_kv*head_dim). blocks (at least (pos+n-1)/block_rows + 1 entries) is in
     * backend memory, read when the op runs. block_rows is a power of two and a multiple of 16.
     * Bit for bit the contiguous op over the same rows. NULL where the backend has none: the
     * forward keeps one block per sequence there. */
    void (*attention_paged)(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                            const int32_t *blocks, int block_rows, float *out, float *att, int n, int pos,
                            int n_head, int n_head_kv, int head_dim);
    /* The decode rows' ops (qk_norm_rope_at, attention_at and their _f16 forms: positions from
     * at[], one launch for n sequences, recordable) over a paged KV cache: k_pool / v_pool are one
     * layer's blocks as attention_paged has them (f16: uint16_t elements, else float), and row r's
     * KV row p is row p % block_rows of block tables[slot[r] * table_stride + p / block_rows]
     * (slot NULL: every row reads the table at tables, a recorded one-sequence step's form).
     * tables (all slots' block tables, table_stride entries apart), at and slot are in backend
     * memory and read when the ops run, never when they are queued: a recorded step replays
     * with the tables as they are then (a sequence that has grown a block since included).
     * qk_norm_rope_at_paged stores row r's rotated k and its v into its row at[r] (which the
     * table must already map); attention_at_paged reads rows 0..at[r]. Otherwise as the
     * contiguous ops, and the same arithmetic (on a GPU: the same kernels and summation order
     * as over contiguous rows). NULL where the backend has none (the CPU: its paged steps run
     * attention_paged a sequence at a time). */
    void (*qk_norm_rope_at_paged)(void *ctx, float *q, const float *k_new, const float *v_new, void *k_pool,
                                  void *v_pool, bool f16, int n, const int32_t *at, const int32_t *slot,
                                  const int32_t *tables, int table_stride, int block_rows,
                                  const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                                  int head_dim, float theta, enum rope_kind kind, float eps);
    void (*attention_at_paged)(void *ctx, const float *q, const void *k_pool, const void *v_pool, bool f16,
                               float *out, int n, const int32_t *at, const int32_t *slot, const int32_t *tables,
                               int table_stride, int block_rows, int n_ctx, int n_head, int n_head_kv, int head_dim);
    /* slot_elems: elements (f16) from one slot's cache to the next */
    void (*qk_norm_rope_at_f16)(void *ctx, float *q, const float *k_new, const float *v_new, uint16_t *k_cache,
                                uint16_t *v_cache, int n, const int32_t *at, const int32_t *slot, size_t slot_elems,
                                const struct tensor *q_norm, const struct tensor *k_norm, int n_head, int n_head_kv,
                                int head_dim, float theta, enum rope_kind kind, float eps);
    void (*attention_at_f16)(void *ctx, const float *q, const uint16_t *k_cache, const uint16_t *v_cache, float *out,
                             int n, const int32_t *at, const int32_t *slot, size_t slot_elems, int n_ctx, int n_head,
                             int n_head_kv, int head_dim);
    /* One vector: xn = rmsnorm(x, norm, eps) (bit for bit the rmsnorm op) and y = W xn (the
     * matmul up to summation order), in one op: a decode layer's FFN norm and MoE router.
     * Returns 0, or TIDE_EUNSUPPORTED with nothing queued (types or sizes it does not fuse:
     * the caller runs the two ops). NULL where there is no such form. */
    int (*norm_matmul)(void *ctx, const struct tensor *w, const float *x, float *y, const struct tensor *norm,
                       float eps, float *xn);
    /* The MoE FFN of a prefill chunk's n tokens for one layer in a few launches, all experts'
     * token groups at once (see struct moe_batch): y (n, n_embd) = per token, the sum over its
     * k pairs in ascending pair order of w * down(silu(gate x) * up x) - what zero, then per
     * group gather_rows, matmul, matmul, swiglu, matmul, scatter_axpy compute, up to the order
     * in which a product sums its blocks (see the backend). add: y += that sum, bit for bit
     * the sum into a temporary, then axpy(y, tmp, 1.0f). x (n, n_embd) and y in backend
     * memory. A call covers groups [g0, g1) of b, whose views must be valid together; a layer
     * is a series of calls g0 = 0, then each call's g0 the last call's g1, up to g1 = n_group,
     * with no other op of this backend in between but upload (expert-cache misses). y is
     * written by the call that ends at n_group. x NULL is a probe (nothing runs; b->ex[0]
     * may be a host view): 0 when the types and shapes would run. Returns 0,
     * TIDE_EUNSUPPORTED (nothing done: the caller runs the per-expert ops) or another
     * negative code. NULL where the backend has no grouped form. */
    int (*moe_ffn_batch)(void *ctx, const struct moe_batch *b, const float *x, float *y, bool add);

    /* ---- the vision encoder's ops (src/vision/clip.c). Vectors f32 in backend memory. ---- */
    /* y (n, dim) = (x - mean) / sqrt(var + eps) * w + b, per row (LayerNorm with bias; w or b
     * NULL: 1 or 0). y may be x. */
    void (*layernorm)(void *ctx, const float *x, float *y, const float *w, const float *b, int n, int dim,
                      float eps);
    /* y (n, dim) += b (dim), every row (the text forward uses it too: qwen2moe's q/k/v biases) */
    void (*add_bias)(void *ctx, float *y, const float *b, int n, int dim);
    /* x[0..n) = act(x[0..n)); GELU is the tanh approximation (as ggml_gelu) */
    void (*activate)(void *ctx, float *x, size_t n, enum act_kind act);
    /* Full bidirectional attention over one sequence of P tokens (no mask): q, k, v, out (P,
     * n_head*head_dim), softmax(q k^T / sqrt(head_dim)) v per head. ws: scratch in backend
     * memory of attention_full_ws_floats(P, head_dim) floats. */
    void (*attention_full)(void *ctx, const float *q, const float *k, const float *v, float *out, int P,
                           int n_head, int head_dim, float *ws);
    /* The Qwen-VL ViT's 2-D rope (engine/mrope.h rope2d_rotate): n patches of n_heads heads of
     * head_dim in vec (backend memory), patch t at row pos[2t], column pos[2t+1] (host memory).
     * NULL where the backend has none. */
    void (*rope_2d)(void *ctx, float *vec, int n, int n_heads, int head_dim, const int32_t *pos, float theta);
    /* Bytes of device memory a matmul of w over n vectors takes beyond x and y (a backend's
     * own stream-ordered scratch), so a caller can reserve it; NULL: none. */
    size_t (*matmul_scratch)(void *ctx, const struct tensor *w, int n);
    /* out[0] (backend memory) = the index of the largest of x[0..n): the sampler's greedy rule
     * (sampler_argmax: ties to the lowest index, NaN never chosen unless at index 0, where it
     * is never replaced), so a greedy step brings back one int instead of the logits. */
    void (*argmax)(void *ctx, const float *x, int n, int32_t *out);
    /* A sampled draw from each of n rows of logits, on the device, so that a sampled decode step
     * brings back one int a row: logits (n, n_vocab) and out (n int32) in backend memory, rows[n]
     * a host array. The CPU form (sample_rows.c, also the reference) and the CUDA form
     * (cuda/sample.cu) agree exactly on this definition, per row:
     *  1. Candidates: every id whose logit is not NaN and not -inf (neither is ever drawn); +inf
     *     reads as FLT_MAX and -0 as +0. No candidate: out = 0.
     *  2. m = the largest candidate logit. Each candidate's weight is an integer,
     *     W = (uint64_t)rint(exp(((double)x - (double)m) / (double)temperature) * 0x1p44)
     *     (the softmax's numerator in units of 2^-44 of the largest, which has W = 2^44): every sum
     *     below is an exact integer sum, the same in any order, and so the same on every backend
     *     (a token of probability under ~2^-45 of the best's has W = 0 and is never drawn).
     *  3. top_k (0 < top_k < candidates): keep logits >= the top_k-th largest candidate logit
     *     (counted with repeats: every tie of the threshold is kept, so more than top_k may stay).
     *  4. top_p (0 < top_p < 1), over the kept set K of mass S1 = sum of its W: keep logits >= the
     *     largest kept logit v such that M(v) = the sum of W over kept logits >= v satisfies
     *     (double)M(v) >= (double)top_p * (double)S1 (all ties of v kept).
     *  5. min_p (> 0): keep only W with (double)W >= (double)min_p * 0x1p44 (p >= min_p * p_max).
     *  6. The draw: S = the sum of W kept, r = (uint64_t)(u * (double)S) (u < 0 or NaN reads as 0;
     *     r capped at S - 1); walking the kept ids in ascending id order adding W, the first id
     *     whose running sum exceeds r.
     * Reproducible: the same rows and u give the same ids on a backend (no atomics, no order
     * that depends on timing); across backends only a libm exp() that differs in the last bit
     * can move a W by one unit (draws near a boundary, about 1e-12 of them). n_vocab <= 2^19, so
     * that S fits 63 bits.
     * Before step 1 a row's edits (struct sample_edit) change its logits in place; with
     * row.logprobs, lp[i] (backend memory, n records; NULL when no row has logprobs) gets the
     * log-softmax of the row as it came in: logprob = (float)((double)x - lse) with
     * lse = mx + log(sum of exp((double)x - mx)) in double (the order of that sum is the
     * backend's: within ~1e-6 of the host's), top_ids by the logits' order. NULL: no such form. */
    void (*sample)(void *ctx, float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                   struct sample_logprob *lp);
};

/* attention_full's ws: four (P, head_dim) head buffers and the (P, P) score table, each
 * rounded to 16 floats (64 bytes). */
static inline size_t attention_full_ws_floats(int P, int head_dim)
{
    size_t hd = ((size_t)P * head_dim + 15) / 16 * 16, pp = ((size_t)P * P + 15) / 16 * 16;
    return 4 * hd + pp;
}

struct backend {
    const struct backend_i *i;
    void *ctx;
};

/* CPU backend using n_threads worker threads for matmul (0 = all cores). */
int backend_cpu_init(struct backend *b, int n_threads);
void backend_cpu_free(struct backend *b);

#endif
