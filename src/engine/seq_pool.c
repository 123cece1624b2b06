/* seq_pool.c - running sequences when the paged KV pool runs out of blocks.
 *
 * A paged pool (kv_blocks.h) may hold fewer positions than parallel contexts (kv_pool_tokens),
 * so a step can find no free block for a sequence's next rows. Then, in this order:
 *   1. an idle slot (its sequence ended; its rows wait for a prompt with the same prefix) gives
 *      its blocks back, least recently used first, its rows parked in host RAM (kv_park.h) when
 *      parking is on;
 *   2. the newest running sequence pauses: its rows are parked the same way, its blocks go back,
 *      and it leaves the step. It keeps its slot, its sampler and the text it has sent.
 * A paused sequence resumes, oldest first, once the pool holds its rows and the next one: its
 * whole blocks still cached in the pool's prefix index are mapped back (prefix_cache.c), its
 * parked rows are copied back, and what is not there (parking off or evicted) is computed again
 * from its prompt and the tokens it had generated (their ids are in its slot's tokens), with no
 * logits asked on the way. On the CPU those rows are the same bits as before, and no sampler
 * draws during them, so the reply is the one it would have been without the pause. While one is
 * paused no new sequence is admitted (engine_can_admit), so a pause ends when older work ends.
 * Only the engine thread runs this. */
#include "sequence_internal.h"

#include <stdlib.h>
#include <string.h>

static bool paged(const struct engine *e) { return !e->fw.kv.fixed; }

/* Slot i's rows parked in host RAM (when parking is on and they are worth it), then its blocks
 * back to the pool; the slot then holds no rows. */
static void park_and_trim(struct engine *e, int i)
{
    struct kv_slot *s = &e->slots[i];
    if (s->n_tokens > 0) {
        struct prompt_rows sr = slot_rows(s);
        int rc = kv_park_save(&e->park, &e->fw, i, &sr);
        if (rc < 0)
            tide_log("kv park: slot %d's %d rows not parked: %s", i, s->n_tokens, tide_strerror(rc));
    }
    s->n_tokens = 0;
    forward_kv_trim(&e->fw, i, 0);
}

/* The least recently used idle slot holding blocks of its own gives them back. False: none. */
static bool reclaim_idle(struct engine *e)
{
    int best = -1;
    for (int i = 0; i < e->n_slots; i++)
        if (!e->slots[i].busy && kv_blocks_own(&e->fw.kv, i) > 0 &&
            (best < 0 || e->slots[i].last_use < e->slots[best].last_use))
            best = i;
    if (best < 0)
        return false;
    park_and_trim(e, best);
    e->kv_reclaims++;
    return true;
}

/* The sequence to pause so that q can have blocks: the newest running one that holds blocks of
 * its own, unless q is newer than it (then q itself waits). */
static struct engine_seq *victim(const struct engine *e, struct engine_seq *const *seqs, int n,
                                 struct engine_seq *q)
{
    for (int k = n - 1; k >= 0; k--) {
        struct engine_seq *v = seqs[k];
        if (v == q)
            return q;
        if (!v->done && !v->paused && v->slot >= 0 && kv_blocks_own(&e->fw.kv, v->slot) > 0)
            return v;
    }
    return q;
}

static void pause_seq(struct engine *e, struct engine_seq *q)
{
    if (q->pos > q->filled) /* generating: the tokens so far are computed again on resume */
        q->filled = q->pos;
    park_and_trim(e, q->slot);
    q->pos = 0;
    q->paused = true;
    q->waiting = false;
    e->kv_pauses++;
}

int seq_pool_reserve(struct engine *e, struct engine_seq *const *seqs, int n_seqs, struct engine_seq **in,
                     struct forward_seq *fs, int n)
{
    if (!paged(e))
        return n;
    bool drop[FORWARD_MAX_SEQ] = {false};
    for (int i = 0; i < n; i++) {
        struct engine_seq *q = in[i];
        while (!drop[i] && forward_kv_reserve(&e->fw, q->slot, fs[i].pos, fs[i].pos + fs[i].n) == TIDE_EFULL) {
            if (reclaim_idle(e))
                continue;
            struct engine_seq *v = victim(e, seqs, n_seqs, q);
            pause_seq(e, v);
            for (int j = 0; j < n; j++)
                drop[j] = drop[j] || in[j] == v;
        }
    }
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (!drop[i]) {
            in[kept] = in[i];
            fs[kept++] = fs[i];
        }
    return kept;
}

void seq_pool_resume(struct engine *e, struct engine_seq *const *seqs, int n)
{
    if (!paged(e))
        return;
    for (int i = 0; i < n; i++) {
        struct engine_seq *q = seqs[i];
        if (!q->paused || q->done)
            continue;
        int need = kv_blocks_for(&e->fw.kv, q->filled + 1);
        while (e->fw.kv.n_free < need && reclaim_idle(e))
            ;
        if (e->fw.kv.n_free < need)
            return; /* a younger one does not pass an older one */
        q->paused = false;
        e->kv_resumes++;
        /* its parked rows back where they are still parked: a generation's from its slot's tokens,
         * a prompt's from the prompt (whose last row is computed again for its logits) */
        struct kv_slot *s = &e->slots[q->slot];
        struct prompt_rows r = q->filled > q->n_prompt ? (struct prompt_rows){s->tokens, q->filled, s->img, s->n_img}
                                                       : seq_rows(q);
        int limit = q->filled > q->n_prompt ? q->filled : q->n_prompt - 1, plen = 0;
        /* its whole blocks may still be cached in the pool (prefix_cache.c): mapped back, no copy */
        q->pos = prefix_cache_adopt(e, q->slot, &r, limit, 0);
        int pi = kv_park_find(&e->park, &r, limit, &plen);
        if (pi >= 0 && plen > q->pos) {
            int rc = kv_park_restore(&e->park, &e->fw, pi, q->slot, q->pos, plen);
            if (rc == 0) {
                if (q->filled == q->n_prompt) /* the prompt's rows: the slot's tokens record them */
                    memcpy(s->tokens, q->ids, sizeof(int) * (size_t)plen);
                q->pos = plen;
            } else {
                tide_log("kv park: %d rows of a paused sequence not restored: %s", plen, tide_strerror(rc));
            }
        }
        s->n_tokens = q->pos;
    }
}

bool engine_can_admit(const struct engine *e)
{
    int free_slots = engine_free_slots(e);
    if (free_slots == 0 || (e->one_seq && free_slots < e->n_slots))
        return false;
    for (int i = 0; paged(e) && i < e->n_slots; i++)
        if (e->slots[i].busy && e->slots[i].seq && e->slots[i].seq->paused && !e->slots[i].seq->done)
            return false;
    return true;
}

void engine_kv_stats(const struct engine *e, struct engine_kv_stats *out)
{
    const struct kv_blocks *kb = &e->fw.kv;
    memset(out, 0, sizeof *out);
    out->paged = !kb->fixed;
    out->block_rows = kb->block_rows;
    out->blocks = kb->n_blocks;
    out->free = kb->n_free - kb->n_cached; /* cached blocks are free to take, but hold reusable rows */
    out->shared = kv_blocks_shared(kb);
    int used = kv_blocks_used(kb);
    if (kb->fixed) { /* a slot's block: running while a sequence holds it, cached while it keeps rows */
        for (int i = 0; i < e->n_slots; i++) {
            out->running += e->slots[i].busy;
            out->cached += !e->slots[i].busy && e->slots[i].n_tokens > 0;
        }
        out->free = kb->n_blocks - out->running - out->cached;
        return;
    }
    /* the blocks some running sequence's table holds; the rest of the used ones only idle slots hold */
    int running = 0;
    uint8_t *mark = calloc((size_t)kb->n_blocks, 1);
    for (int i = 0; mark && i < e->n_slots; i++) {
        if (!e->slots[i].busy)
            continue;
        out->paused += e->slots[i].seq && e->slots[i].seq->paused && !e->slots[i].seq->done;
        const int32_t *t = kv_blocks_table(kb, i);
        for (int k = 0; k < kb->held[i]; k++)
            if (!mark[t[k]]) {
                mark[t[k]] = 1;
                running++;
            }
    }
    free(mark);
    out->running = running;
    out->cached = used - running + kb->n_cached;
}
