/* phase_clock.h - where a forward step's time goes, phase by phase: profiling only, switched
 * on by TIDE_PHASE_CLOCK=1 (docs/CONFIG.md). Each mark waits for the backend (its sync op), so
 * a profiled step runs slower than a plain one and no recorded graph hides the phases (set
 * TIDE_NO_GRAPHS=1 for one-sequence decode): compare phases with each other. Every 200 steps of
 * a given row count the engine logs one line per count: milliseconds a step in each phase.
 * The engine thread's only. */
#ifndef TIDE_PHASE_CLOCK_H
#define TIDE_PHASE_CLOCK_H

#include "backend.h"

#include <stdbool.h>

enum phase {
    PHASE_EMBED,  /* the step's set-up: table sync, embeddings, hand-over between devices */
    PHASE_QKV,    /* attention norm, the q/k/v products and their biases, every layer */
    PHASE_ATTN,   /* head norms, rope, K/V into the slots, attention */
    PHASE_WO,     /* the output product and its residual */
    PHASE_FFN,    /* FFN norm, router, experts (or the dense FFN), shared expert */
    PHASE_LOGITS, /* output norm and head, greedy picks or draws, their download */
    PHASE_BOOK,   /* the expert cache's bookkeeping after the step */
    PHASE_N
};

/* TIDE_PHASE_CLOCK=1 (read once) */
bool phase_clock_on(void);
/* A step of n_rows rows begins: the backend is drained so the first phase starts clean. */
void phase_clock_start(const struct backend_i *B, void *ctx, int n_rows);
/* The time since the last mark (after the backend finishes) goes to phase p. */
void phase_clock_mark(const struct backend_i *B, void *ctx, enum phase p);
/* The step ends: its phases join its row count's totals (logged every 200 steps). */
void phase_clock_stop(void);

#endif
