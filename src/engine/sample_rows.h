/* sample_rows.h - backend_i.sample on the host: the CPU backend's slot, and the reference the
 * CUDA form is tested against. The semantics are backend_i.sample's (backend.h). */
#ifndef TIDE_SAMPLE_ROWS_H
#define TIDE_SAMPLE_ROWS_H

#include "backend.h"

/* The fixed-point scale of a weight: the largest candidate weighs 2^44. */
#define SAMPLE_W_ONE 0x1p44

/* out[i] = the draw from row i of logits (n, n_vocab) with rows[i]. Returns 0, or TIDE_ENOMEM
 * (scratch) with out untouched. */
int sample_rows(const float *logits, int n, int n_vocab, const struct sample_row *rows, int32_t *out);

#endif
