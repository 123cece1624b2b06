/* prefix_share.h - where a new prompt's KV prefix comes from among the other KV slots: copied
 * now from rows some slot already holds, or, when a running sequence is still prefilling a
 * longer shared prefix, waited for until those rows exist (so N prompts with one system prompt
 * compute it once).
 *
 * Pure decisions over row runs (prompt_rows.h, so image rows match only the same image at the
 * same place); sequence.c gathers the sources and does the copies. A source is one slot: the
 * rows it holds and has computed (a free slot's leftovers, a running or prefilling sequence's
 * rows so far) and, when its sequence is computing its prompt, that prompt (the rows it will
 * hold). A waiting sequence is never a source of pending rows, so nobody waits on a waiter:
 * waits cannot form a cycle, and a wait ends as soon as its rows exist or the sequence
 * computing them goes (the next decision then copies what exists, waits on another, or
 * computes). */
#ifndef TIDE_PREFIX_SHARE_H
#define TIDE_PREFIX_SHARE_H

#include "prompt_rows.h"

/* Fewer rows than this beyond what a prompt holds are not worth a copy (a chat template's opening
 * that every prompt shares): computed instead. */
#define PREFIX_SHARE_MIN_COPY 16

struct share_source {
    struct prompt_rows rows;    /* rows held and computed */
    struct prompt_rows pending; /* the prompt its sequence is computing (n 0: none) */
};

struct share_plan {
    int copy_from, copy_len;    /* copy source copy_from's rows 0..copy_len-1 now (-1, 0: nothing
                                   better than the rows q has) */
    int wait_on, wait_len;      /* or wait until source wait_on holds rows 0..wait_len-1 (-1: no wait) */
};

/* The plan for prompt q, which holds rows 0..have-1 already and may take at most limit rows
 * (its length - 1: its last token is computed for fresh logits) from n sources. It waits when
 * a pending prompt shares at least min_wait rows more than the best it can copy now (min_wait
 * <= 0: never); otherwise it copies the longest run held (ties: the first source) when it brings
 * PREFIX_SHARE_MIN_COPY rows or more. A sequence
 * already waiting asks again with min_wait 1: it waits for all the shared rows. */
void prefix_share_plan(const struct prompt_rows *q, int limit, int have, const struct share_source *src, int n,
                       int min_wait, struct share_plan *out);

#endif
