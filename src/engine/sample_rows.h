/* sample_rows.h - backend_i.sample on the host: the CPU backend's slot, and the reference the
 * CUDA form is tested against. The semantics are backend_i.sample's (backend.h). */
#ifndef TIDE_SAMPLE_ROWS_H
#define TIDE_SAMPLE_ROWS_H

#include "backend.h"

/* The fixed-point scale of a weight: the largest candidate weighs 2^44. */
#define SAMPLE_W_ONE 0x1p44

/* Bytes of scratch sample_row_draw needs for a row of n_vocab ids. */
size_t sample_row_scratch_bytes(int n_vocab);
/* The draw from one row of n_vocab logits with p, in scratch of sample_row_scratch_bytes: the
 * host sampler's temperature draw (sample.c) is this, so that a seed draws the same token
 * whether the backend or the host samples. */
int32_t sample_row_draw(const float *logits, int n_vocab, const struct sample_row *p, void *scratch);
/* out[i] = the draw from row i of logits (n, n_vocab) with rows[i] (its edits and logprobs are not
 * read: sample_rows_full does those). Returns 0, or TIDE_ENOMEM (scratch) with out untouched. */
int sample_rows(const float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out);
/* A row's edits (backend.h: struct sample_edit, p->edits) applied to its logits in place. */
void sample_row_edit(float *logits, int n_vocab, const struct sample_row *p);
/* lp = the log-softmax record of raw (n_vocab logits as they came in) for the drawn id with the
 * top k (clamped to 0..SAMPLE_ROW_MAX_TOP and n_vocab): the host sampler's logprobs. */
void sample_row_logprobs(const float *raw, int n_vocab, int chosen, int k, struct sample_logprob *lp);
/* backend_i.sample on the host, all of it (the CPU backend's slot): per row the MASK edits, the
 * logprobs of the logits then (row.logprobs), the other edits in place, then the draw. Returns 0, or
 * TIDE_ENOMEM (scratch) with out untouched. */
int sample_rows_full(float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out,
                     struct sample_logprob *lp);

#endif
