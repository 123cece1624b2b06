/* sequence.c - running generations as sequences of one batched forward (engine thread only).
 *
 * A sequence is one job: its prompt as tokens, a KV slot, and per choice a sampler and the
 * text on its way out. engine_step runs one forward over every running sequence: each one's
 * decode token, then prompt chunks (chunked prefill) in admission order up to the step's row
 * budget, so a long prompt never stalls the streams. After the forward each sequence with
 * logits samples its next token (or takes the one its backend picked or drew: argmax,
 * backend_i.sample) and hands complete UTF-8 text to its job's callback, never past a stop
 * string: bytes that could still start a stop string are held back until they cannot.
 *
 * A sequence's rows do not depend on what else runs in its step (forward_eval_batch), nor does
 * where its token is drawn, so its output for a seed is the one it gets alone. */
#include "session.h"
#include "json_guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mrope.h"
#include "prefix_share.h"
#include "sequence_internal.h"

static bool step_fault(struct engine *e)
{
    if (e->fail_step <= 0 || --e->fail_step > 0)
        return false;
    tide_log("injected forward step failure (TIDE_FAULT_ENGINE_STEP)");
    return true;
}

int engine_free_slots(const struct engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_slots; i++)
        n += !e->slots[i].busy;
    return n;
}

/* The free slot whose rows share the longest prefix with q's prompt (ties: the least recently
 * used); *keep is that prefix, at most n - 1 so the last prompt token is evaluated again for
 * fresh logits. Image rows match the same image at the same place (prompt_rows.h). */
static int pick_slot(struct engine *e, const struct engine_seq *q, int *keep)
{
    int best = -1, best_keep = -1;
    struct prompt_rows qr = seq_rows(q);
    for (int i = 0; i < e->n_slots; i++) {
        struct kv_slot *s = &e->slots[i];
        if (s->busy)
            continue;
        struct prompt_rows sr = slot_rows(s);
        int k = prompt_rows_shared(&sr, &qr, q->n_prompt - 1);
        if (k > best_keep || (k == best_keep && s->last_use < e->slots[best].last_use)) {
            best = i;
            best_keep = k;
        }
    }
    *keep = best_keep;
    return best;
}

/* The other slots as prefix sources for q (prefix_share.h): each one's computed rows, and the
 * prompt its sequence computes while it is still prefilling (a waiter computes none). slot_of[i]
 * is source i's slot. */
static int share_sources(struct engine *e, const struct engine_seq *q, struct share_source *src, int *slot_of)
{
    int n = 0;
    for (int i = 0; i < e->n_slots && n < FORWARD_MAX_SEQ; i++) {
        const struct kv_slot *s = &e->slots[i];
        const struct engine_seq *o = s->seq;
        if (i == q->slot || (s->n_tokens <= 0 && !o))
            continue;
        src[n].rows = slot_rows(s);
        src[n].pending = (struct prompt_rows){0};
        if (o && !o->done && !o->waiting && !o->paused && o->pos < o->n_prompt)
            src[n].pending = seq_rows(o);
        slot_of[n++] = i;
    }
    return n;
}

/* q's prefix from the other slots, at admission and at every step while it waits: the rows
 * another slot holds beyond q's own are copied into q's slot on the device (cached_tokens), or q
 * waits for a prefilling sequence's rows. A failed copy only costs the recompute. */
static void share_prefix(struct engine *e, struct engine_seq *q)
{
    if (!e->kv_share) {
        q->waiting = false;
        return;
    }
    struct share_source src[FORWARD_MAX_SEQ];
    int slot_of[FORWARD_MAX_SEQ];
    int n = share_sources(e, q, src, slot_of);
    struct prompt_rows qr = seq_rows(q);
    struct share_plan pl;
    /* a wait starts for prefix_wait_tokens rows more; once waiting, q waits for every shared row
     * (the last chunk's too) while a sequence still computes them */
    int min_wait = e->prefix_wait_tokens > 0 && q->waiting ? 1 : e->prefix_wait_tokens;
    prefix_share_plan(&qr, q->n_prompt - 1, q->pos, src, n, min_wait, &pl);
    if (pl.wait_on >= 0 && !q->waiting)
        e->prefix_waits++;
    q->waiting = pl.wait_on >= 0;
    if (pl.copy_from < 0)
        return;
    /* the rows q's slot holds from there now: all of them, or (paged, the pool out of blocks for a
     * last partial block) its whole blocks */
    int got = forward_kv_clone(&e->fw, slot_of[pl.copy_from], q->slot, pl.copy_len);
    if (got < 0) {
        tide_log("prefix: %d rows not copied from slot %d: %s", pl.copy_len, slot_of[pl.copy_from], tide_strerror(got));
        return;
    }
    struct kv_slot *s = &e->slots[q->slot];
    memcpy(s->tokens, q->ids, sizeof(int) * (size_t)got); /* image rows: s->img holds q's keys */
    s->n_tokens = got;
    q->job->cached_tokens += got - q->pos;
    e->shared_tokens += (uint64_t)(got > q->pos ? got - q->pos : 0);
    q->pos = got;
}

static bool wants_logits(const struct sampling_params *sp)
{
    const char *ha = getenv("TIDE_HOST_ARGMAX");
    return sp->temperature > 0.0f || sampler_needs_logits(sp) || (ha && ha[0] == '1');
}

/* The switch for draws on the device that need more than the plain draw (presence, frequency and
 * repetition penalties, logit_bias, logprobs, greedy with any of those): the host sampler's
 * changes go to backend_i.sample as a sparse list of edits (sampler_edits) and the logprobs come
 * back as top-N pairs. On by default since test-gpu's `sample_extras` passed on an H200;
 * TIDE_DEVICE_SAMPLE_EXTRAS=0 (or 1) overrides it. The default is this line: */
#define DEVICE_SAMPLE_EXTRAS_DEFAULT true /* sample_extras passed on an H200, 2026-12-05 */

static bool device_sample_extras(void)
{
    const char *v = getenv("TIDE_DEVICE_SAMPLE_EXTRAS");
    return v && v[0] ? v[0] == '1' : DEVICE_SAMPLE_EXTRAS_DEFAULT;
}

/* Whether a sequence's draws can be made by the last stage's backend (backend_i.sample, which
 * brings back one int a step instead of the logits): temperature sampling with nothing else that
 * reads the logits (sampler_needs_logits), or, with device_sample_extras, any request but those
 * with a grammar's per-step mask (JSON mode, json_schema: computed on the host); one
 * choice (the later ones start from the prompt's logits on the host), and a backend with the
 * slot. The host sampler draws by the same definition from the same u (sample_rows.c), so this
 * decides where a token is drawn, not which; and it depends on the request and the backend
 * only, never on what shares a step. TIDE_HOST_SAMPLE=1 keeps every draw on the host. */
static bool draws_on_device(const struct engine *e, const struct sampling_params *sp, int n_choices)
{
    const char *hs = getenv("TIDE_HOST_SAMPLE");
    const struct backend_i *B = e->fw.n_stage > 0 ? e->fw.stage[e->fw.n_stage - 1].be.i : NULL;
    if (n_choices != 1 || !B || !B->sample || (hs && hs[0] == '1'))
        return false;
    if (!sampler_needs_logits(sp))
        return sp->temperature > 0.0f; /* greedy alone is picked on the device (backend_i.argmax) */
    return device_sample_extras() && !sp->json_object;
}

/* The vocabulary's end-of-generation ids (tokenizer_is_eog), listed once; -1: out of memory. */
static int eog_ids(struct engine *e, const int **ids)
{
    if (!e->eog_ids) {
        int n = 0, V = (int)e->model.cfg.n_vocab;
        for (int id = 0; id < V; id++)
            n += tokenizer_is_eog(e->tok, id);
        if (!(e->eog_ids = malloc(sizeof(int) * (size_t)(n ? n : 1))))
            return -1;
        for (int id = 0; id < V; id++)
            if (tokenizer_is_eog(e->tok, id))
                e->eog_ids[e->n_eog++] = id;
    }
    *ids = e->eog_ids;
    return e->n_eog;
}

/* The edits of q's next draw on the device: the sampler's, with the end-of-generation ids
 * masked while sampler_constrain would ban them. -1: the host draws this one. */
static int draw_edits(struct engine *e, struct engine_seq *q, const struct sample_edit **ed)
{
    const struct sampling_params *sp = &q->job->sp;
    if (!sp->ignore_eos && q->t >= sp->min_tokens)
        return sampler_edits(&q->smp, ed);
    const int *eog = NULL;
    int n = eog_ids(e, &eog);
    return n < 0 ? -1 : sampler_edits_masking(&q->smp, eog, n, &q->eds, &q->cap_eds, ed);
}

/* Checks that prompt n (of which the error names `which`, -1: the only one) fits the context with
 * max_tokens. */
static int prompt_fits(const struct engine *e, int n, int which, char *err, size_t errlen)
{
    char at[32] = "the prompt";
    if (which >= 0)
        snprintf(at, sizeof at, "prompt %d", which);
    if (n == 0 || n >= e->n_ctx) {
        snprintf(err, errlen, "%s is %d tokens; this server's context is %d tokens", at, n, e->n_ctx);
        return TIDE_ERANGE;
    }
    return 0;
}

/* q's prompt tokens, all of them when the job has several prompts (q->ids is then the first's);
 * job->prompt_tokens their sum. Each must fit the context with max_tokens. */
static int tokenize_prompts(struct engine *e, struct engine_seq *q, char *err, size_t errlen)
{
    struct gen_job *job = q->job;
    job->completion_tokens = 0;
    job->cached_tokens = 0;
    int k = job->n_prompts > 1 ? job->n_prompts : 1, sum = 0, rc = 0;
    if (k > 1 && (!(q->pids = calloc((size_t)k, sizeof *q->pids)) || !(q->pn = calloc((size_t)k, sizeof *q->pn))))
        return TIDE_ENOMEM;
    q->n_prompts = k > 1 ? k : 0;
    for (int p = 0; p < k && !rc; p++) {
        int *ids = NULL, n = 0;
        if (k > 1) { /* prompt p alone, as a one-prompt job */
            struct gen_job one = *job;
            one.prompts = NULL;
            one.n_prompts = 0;
            one.prompt = job->prompts[p].text;
            one.prompt_ids = job->prompts[p].ids;
            one.n_prompt_ids = job->prompts[p].n_ids;
            rc = engine_prompt_tokens(e, &one, &ids, &n, q->img_at);
        } else {
            rc = engine_prompt_tokens(e, job, &ids, &n, q->img_at);
        }
        if (rc < 0) {
            snprintf(err, errlen, "tokenize: %s", tide_strerror(rc));
            break;
        }
        if (k > 1) {
            q->pids[p] = ids;
            q->pn[p] = n;
        } else {
            q->ids = ids;
        }
        rc = prompt_fits(e, n, k > 1 ? p : -1, err, errlen);
        if (!rc && job->max_tokens > e->n_ctx - n) {
            char at[32] = "prompt";
            if (k > 1)
                snprintf(at, sizeof at, "prompt %d", p);
            snprintf(err, errlen, "%s (%d tokens) + max_tokens (%d) exceeds the context of %d tokens", at, n,
                     job->max_tokens, e->n_ctx);
            rc = TIDE_ERANGE;
        }
        sum += n;
    }
    if (k > 1 && !rc) {
        q->ids = q->pids[0];
        q->n_prompt = q->pn[0];
    } else if (!rc) {
        q->n_prompt = sum;
    }
    job->prompt_tokens = sum;
    return rc;
}

/* Set up choice c: its sampler seeded seed + c, empty text. */
static int begin_choice(struct engine_seq *q, uint32_t n_vocab)
{
    if (q->smp_ok)
        sampler_free(&q->smp);
    q->smp_ok = false;
    int rc = sampler_init(&q->smp, &q->job->sp, n_vocab);
    if (rc < 0)
        return rc;
    q->smp_ok = true;
    sampler_reset(&q->smp, q->job->sp.seed + (uint64_t)q->choice);
    sampler_note_prompt(&q->smp, q->ids, q->n_prompt); /* repetition_penalty counts the prompt too */
    json_guard_init(&q->jg, q->job->sp.grammar);
    memset(&q->u8, 0, sizeof q->u8);
    q->n_held = 0;
    q->t = 0;
    q->next = -1;
    q->filled = q->n_prompt;
    q->job->finish[q->choice] = FINISH_NONE;
    return 0;
}

int engine_seq_start(struct engine *e, struct gen_job *job, struct engine_seq **out, char *err, size_t errlen)
{
    *out = NULL;
    if (job->n_images > ENGINE_MAX_IMAGES) {
        snprintf(err, errlen, "at most %d images per request", ENGINE_MAX_IMAGES);
        return TIDE_EINVAL;
    }
    struct engine_seq *q = calloc(1, sizeof *q);
    if (!q)
        return TIDE_ENOMEM;
    q->job = job;
    q->slot = -1;
    int rc = tokenize_prompts(e, q, err, errlen);
    if (rc < 0)
        goto fail;
    int n = q->n_prompt;
    q->max_new = job->max_tokens < 0 ? e->n_ctx - n : job->max_tokens;
    if (e->model.cfg.rope_sections[0] && job->n_images > 0 && q->n_prompts == 0) {
        /* M-RoPE: each image a grid of its own ids, the text after it counting on from the
         * image's start + max(grid sides) (mrope.h); generated tokens continue that count */
        struct mrope_image mi[ENGINE_MAX_IMAGES];
        for (int i = 0; i < job->n_images; i++) {
            int gw = job->images[i].grid_w > 0 ? job->images[i].grid_w : job->images[i].n_tokens;
            mi[i] = (struct mrope_image){.at = (uint32_t)q->img_at[i], .nx = (uint32_t)gw,
                                         .ny = (uint32_t)(job->images[i].n_tokens / gw)};
        }
        int64_t next = -1;
        if ((q->mpos = malloc(sizeof(int32_t) * 4 * (size_t)n)))
            next = mrope_positions((uint32_t)n, 0, mi, (size_t)job->n_images, q->mpos);
        if (next < 0) {
            snprintf(err, errlen, "image positions: %s", q->mpos ? "an image's grid does not fit its rows" : "out of memory");
            rc = q->mpos ? TIDE_EINVAL : TIDE_ENOMEM;
            goto fail;
        }
        q->rope_delta = (int)(next - n);
    }
    for (int i = 0; i < job->n_images; i++)
        q->rimg[i] = (struct row_image){.at = q->img_at[i], .n = job->images[i].n_tokens, .keyed = job->images[i].keyed};
    for (int i = 0; i < job->n_images; i++)
        if (job->images[i].keyed)
            memcpy(q->rimg[i].key, job->images[i].key, ROW_IMAGE_KEY_BYTES);
    int keep = 0;
    q->slot = pick_slot(e, q, &keep);
    if (q->slot < 0) {
        snprintf(err, errlen, "no free sequence slot");
        rc = TIDE_EFULL;
        goto fail;
    }
    struct kv_slot *s = &e->slots[q->slot];
    /* The slot's rows past the shared prefix are about to be overwritten: park them in host RAM
     * first; and a parked conversation that shares more of this prompt comes back instead of
     * being computed again (kv_park.h). A failed park or restore only costs the recompute. */
    if (s->n_tokens > keep) {
        struct prompt_rows sr = slot_rows(s);
        rc = kv_park_save(&e->park, &e->fw, q->slot, &sr);
        if (rc < 0)
            tide_log("kv park: slot %d's %d rows not parked: %s", q->slot, s->n_tokens, tide_strerror(rc));
    }
    forward_kv_trim(&e->fw, q->slot, keep); /* blocks past the kept rows go back to the pool */
    struct prompt_rows qr = seq_rows(q);
    keep = prefix_cache_adopt(e, q->slot, &qr, n - 1, keep); /* whole blocks an earlier request computed */
    int plen = 0, pi = kv_park_find(&e->park, &qr, n - 1, &plen);
    if (pi >= 0 && plen > keep) {
        rc = kv_park_restore(&e->park, &e->fw, pi, q->slot, keep, plen);
        if (rc == 0) {
            memcpy(s->tokens, q->ids, sizeof(int) * (size_t)plen);
            keep = plen;
        } else {
            tide_log("kv park: %d rows not restored: %s", plen, tide_strerror(rc));
        }
    }
    rc = 0;
    /* the slot's images are the prompt's: those among the rows kept match them, and the steps
     * write the rest */
    s->n_img = job->n_images;
    memcpy(s->img, q->rimg, sizeof(struct row_image) * (size_t)job->n_images);
    s->busy = true;
    s->seq = q;
    s->last_use = ++e->use_clock;
    s->n_tokens = keep;
    q->pos = keep;
    job->cached_tokens = keep;
    share_prefix(e, q); /* more from another slot, now or once a prefilling sequence has it */
    q->n_choices = job->n < 1 ? 1 : job->n > 16 ? 16 : job->n;
    q->per = q->n_prompts > 1 ? q->n_choices / q->n_prompts : q->n_choices;
    if (q->per < 1 || q->per * (q->n_prompts > 1 ? q->n_prompts : 1) != q->n_choices) {
        snprintf(err, errlen, "%d choices do not divide among %d prompts", q->n_choices, q->n_prompts);
        rc = TIDE_EINVAL;
        goto fail;
    }
    for (int i = 0; i < job->n_stop && i < JOB_MAX_STOP; i++)
        if (job->stop[i] && job->stop[i][0])
            q->stops[q->n_stop++] = job->stop[i];
    if (job->messages)
        for (const char *const *st = template_stop_strings(e->tmpl); st && *st && q->n_stop < SEQ_MAX_STOPS; st++)
            q->stops[q->n_stop++] = *st;
    q->pick_only = !wants_logits(&job->sp);
    q->cap = 4096;
    q->held = malloc(q->cap);
    if (!q->held || (q->per > 1 && !(q->prompt_logits = malloc(2 * sizeof(float) * e->model.cfg.n_vocab)))) {
        rc = TIDE_ENOMEM;
        goto fail;
    }
    if (q->per > 1)
        q->pick_only = false; /* the later choices start from the prompt's logits */
    q->draw_on_device = draws_on_device(e, &job->sp, q->per);
    q->draw = (struct sample_row){.temperature = job->sp.temperature, .top_k = job->sp.top_k,
                                  .top_p = job->sp.top_p, .min_p = job->sp.min_p,
                                  .repetition_penalty = job->sp.repetition_penalty,
                                  .logprobs = job->sp.logprobs, .top_logprobs = job->sp.top_logprobs};
    if (!(job->sp.temperature > 0.0f)) /* greedy: the draw at u = 0 with nothing cut is the argmax */
        q->draw = (struct sample_row){.temperature = 0.0f, .top_p = 1.0f, .u = 0.0,
                                      .repetition_penalty = job->sp.repetition_penalty,
                                      .logprobs = job->sp.logprobs, .top_logprobs = job->sp.top_logprobs};
    rc = begin_choice(q, e->model.cfg.n_vocab);
    if (rc < 0)
        goto fail;
    *out = q;
    return 0;
fail:
    if (!err[0])
        snprintf(err, errlen, "%s", tide_strerror(rc));
    engine_seq_free(e, q);
    return rc;
}

void engine_seq_release(struct engine *e, struct engine_seq *q)
{
    if (!q || q->slot < 0)
        return;
    e->slots[q->slot].busy = false;
    e->slots[q->slot].seq = NULL;
    e->slots[q->slot].last_use = ++e->use_clock;
    q->slot = -1;
}

void engine_seq_free(struct engine *e, struct engine_seq *q)
{
    if (!q)
        return;
    engine_seq_release(e, q);
    if (q->smp_ok)
        sampler_free(&q->smp);
    if (q->pids) {
        for (int i = 0; i < q->n_prompts; i++)
            free(q->pids[i]);
        free(q->pids);
        free(q->pn);
    } else {
        free(q->ids);
    }
    free(q->prompt_logits);
    free(q->held);
    free(q->mpos);
    free(q->eds);
    free(q);
}

bool engine_seq_done(const struct engine_seq *q, int *rc, const char **err)
{
    if (rc)
        *rc = q->rc;
    if (err)
        *err = q->err;
    return q->done;
}

static void seq_fail(struct engine *e, struct engine_seq *q, int rc, const char *why)
{
    q->done = true;
    q->rc = rc;
    if (why && !q->err[0])
        snprintf(q->err, sizeof q->err, "%s", why);
    if (q->slot >= 0 && rc != TIDE_ECANCELED) { /* a cancel comes between steps: the rows stand */
        e->slots[q->slot].n_tokens = 0; /* what the slot holds is no longer known */
        forward_kv_trim(&e->fw, q->slot, 0);
    }
}

/* Length of the longest suffix of buf[0..len) that is a proper prefix of a stop string:
 * those bytes must wait for the next token before they can be emitted. */
static size_t stop_holdback(const char *buf, size_t len, const char *const *stops, int n_stop)
{
    size_t hold = 0;
    for (int s = 0; s < n_stop; s++) {
        size_t sl = strlen(stops[s]);
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(buf + len - k, stops[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Earliest match of any stop string in buf, or -1. */
static long stop_find(const char *buf, size_t len, const char *const *stops, int n_stop)
{
    long best = -1;
    for (int s = 0; s < n_stop; s++) {
        const char *p = memmem(buf, len, stops[s], strlen(stops[s]));
        if (p && (best < 0 || p - buf < best))
            best = p - buf;
    }
    return best;
}

/* Choice q->choice ended with fin: record it, and start the next choice from the prompt's
 * logits (returns true: sample again now) or finish the sequence. */
static bool end_choice(struct engine *e, struct engine_seq *q, enum finish_reason fin)
{
    q->job->finish[q->choice] = fin;
    if (++q->choice >= q->n_choices) {
        q->done = true;
        return false;
    }
    if (q->n_prompts > 1 && q->choice % q->per == 0) { /* the next prompt: prefill it after what it shares */
        int p = q->choice / q->per, n = q->pn[p];
        struct kv_slot *s = &e->slots[q->slot];
        int keep = 0;
        while (keep < s->n_tokens && keep < n - 1 && s->tokens[keep] == q->pids[p][keep])
            keep++;
        q->ids = q->pids[p];
        q->n_prompt = n;
        q->pos = keep;
        s->n_tokens = keep;
        forward_kv_trim(&e->fw, q->slot, keep);
        q->job->cached_tokens += keep;
        q->max_new = q->job->max_tokens < 0 ? e->n_ctx - n : q->job->max_tokens;
        int rc = begin_choice(q, e->model.cfg.n_vocab);
        if (rc < 0)
            seq_fail(e, q, rc, "sampler");
        return false; /* the steps prefill it, then sample */
    }
    int rc = begin_choice(q, e->model.cfg.n_vocab);
    if (rc < 0) {
        seq_fail(e, q, rc, "sampler");
        return false;
    }
    q->pos = q->n_prompt; /* the next choice overwrites the last one's rows */
    e->slots[q->slot].n_tokens = q->n_prompt;
    forward_kv_trim(&e->fw, q->slot, q->n_prompt);
    return true;
}

/* Sample the next token of q's choice from logits (or take pick, the device's greedy choice),
 * give its text to the job and decide what comes next. */
static void take_token(struct engine *e, struct engine_seq *q, float *logits, int pick,
                       const struct sample_logprob *dlp)
{
    struct gen_job *job = q->job;
    uint32_t n_vocab = e->model.cfg.n_vocab;
    for (;;) {
        struct token_logprob lp;
        if (logits) /* the grammar mask (json_object, json_schema) and the end-of-text ban */
            sampler_constrain(&q->smp, &q->jg, e->tok, q->t, logits);
        int id = pick >= 0 ? pick : sampler_sample(&q->smp, logits, job->sp.logprobs ? &lp : NULL);
        if (pick >= 0 && dlp) { /* drawn on the device with its logprobs */
            lp.id = id;
            lp.logprob = dlp->logprob;
            lp.n_top = dlp->n_top;
            for (int j = 0; j < dlp->n_top && j < SAMPLE_MAX_TOP_LOGPROBS; j++) {
                lp.top_ids[j] = dlp->top_ids[j];
                lp.top_logprobs[j] = dlp->top_logprobs[j];
            }
        }
        pick = -1;
        dlp = NULL;
        sampler_accept(&q->smp, id);
        job->completion_tokens++;
        q->t++;
        bool eog = tokenizer_is_eog(e->tok, id);
        char piece[256];
        int plen = 0;
        if (!eog) {
            plen = tokenizer_token_bytes(e->tok, id, piece, sizeof piece);
            if (plen < 0)
                plen = 0;
            if (plen > (int)sizeof piece)
                plen = sizeof piece;
        }
        if (q->n_held + 3 * (size_t)plen + 16 > q->cap) {
            size_t nc = 2 * (q->n_held + 3 * (size_t)plen + 16);
            char *nh = realloc(q->held, nc);
            if (!nh) {
                seq_fail(e, q, TIDE_ENOMEM, "out of memory");
                return;
            }
            q->held = nh;
            q->cap = nc;
        }
        if (job->sp.json_object && !eog)
            json_guard_feed(&q->jg, piece, (size_t)plen); /* sampler_constrain let only valid ones through */
        q->n_held += utf8_stream_feed(&q->u8, piece, (size_t)plen, q->held + q->n_held);
        if (eog)
            q->n_held += utf8_stream_flush(&q->u8, q->held + q->n_held);
        long at = q->t >= job->sp.min_tokens ? stop_find(q->held, q->n_held, q->stops, q->n_stop) : -1;
        size_t emit = q->n_held;
        if (at >= 0)
            emit = (size_t)at;
        else if (!eog)
            emit = q->n_held - stop_holdback(q->held, q->n_held, q->stops, q->n_stop);
        if (job->on_text(job->ud, q->choice, q->held, emit, job->sp.logprobs ? &lp : NULL)) {
            seq_fail(e, q, TIDE_ECANCELED, NULL);
            return;
        }
        memmove(q->held, q->held + emit, q->n_held - emit);
        q->n_held -= emit;
        enum finish_reason fin = FINISH_NONE;
        if (eog || at >= 0)
            fin = FINISH_STOP;
        else if (q->t >= q->max_new || q->pos >= e->n_ctx)
            fin = FINISH_LENGTH; /* no forward for a token nobody will use */
        if (fin == FINISH_NONE) {
            q->next = id;
            return;
        }
        if (fin == FINISH_LENGTH && q->n_held > 0) {
            /* out of tokens: what was held back for a stop string that never came is text */
            q->n_held += utf8_stream_flush(&q->u8, q->held + q->n_held);
            if (job->on_text(job->ud, q->choice, q->held, q->n_held, NULL)) {
                seq_fail(e, q, TIDE_ECANCELED, NULL);
                return;
            }
            q->n_held = 0;
        }
        if (!end_choice(e, q, fin))
            return;
        logits = q->prompt_logits + n_vocab; /* the next choice draws from the prompt's logits */
        memcpy(logits, q->prompt_logits, sizeof(float) * n_vocab);
    }
}

/* The rows q runs this step, at most budget of them: its decode token, or its next prompt
 * chunk (tokens, or one image's rows, up to the end of the run). 0 when it has none. */
static int plan_rows(const struct engine *e, struct engine_seq *q, int budget, struct forward_seq *f)
{
    const struct gen_job *job = q->job;
    *f = (struct forward_seq){.slot = q->slot, .pos = q->pos};
    if (q->pos >= q->filled) {
        f->n = 1;
        f->tokens = &q->next;
        if (q->mpos) {
            for (int k = 0; k < 4; k++)
                q->dpos[k] = q->pos + q->rope_delta;
            f->mpos = q->dpos;
        }
        f->want_logits = true;
        f->pick_only = q->pick_only;
        return 1;
    }
    int p = q->pos, end = p;
    if (p >= q->n_prompt) { /* resumed after a pause: the tokens it had generated, computed again */
        const int *had = e->slots[q->slot].tokens;
        end = q->mpos ? p + 1 : (q->filled - p < budget ? q->filled : p + budget); /* M-RoPE: a row a step */
        f->tokens = had + p;
        f->n = end - p;
        if (q->mpos) {
            for (int k = 0; k < 4; k++)
                q->dpos[k] = p + q->rope_delta;
            f->mpos = q->dpos;
        }
        return f->n; /* no logits: the token after them is known (q->next) */
    }
    if (q->ids[p] >= 0) {
        while (end < q->n_prompt && q->ids[end] >= 0 && end - p < budget)
            end++;
        f->tokens = q->ids + p;
    } else {
        int img = 0;
        while (img + 1 < job->n_images && q->img_at[img + 1] <= p)
            img++;
        while (end < q->n_prompt && q->ids[end] < 0 && end - q->img_at[img] < job->images[img].n_tokens &&
               end - p < budget)
            end++;
        int row = job->images[img].row_floats ? job->images[img].row_floats : (int)e->model.cfg.n_embd;
        f->embd = job->images[img].embd + (size_t)(p - q->img_at[img]) * row;
        f->embd_stride = row;
    }
    if (q->mpos)
        f->mpos = q->mpos + (size_t)p * 4;
    f->n = end - p;
    f->want_logits = end == q->n_prompt && q->filled == q->n_prompt; /* a resumed generation's prompt: none */
    f->pick_only = q->pick_only && q->per == 1;
    return f->n;
}

int engine_step(struct engine *e, struct engine_seq *const *seqs, int n, int max_rows)
{
    struct forward_seq fs[FORWARD_MAX_SEQ];
    struct engine_seq *in[FORWARD_MAX_SEQ];
    int nf = 0, rows = 0;
    if (max_rows < n)
        max_rows = n;
    for (int i = 0; i < n; i++) { /* cancelled ones leave before any work */
        struct engine_seq *q = seqs[i];
        if (!q->done && q->job->cancel && __atomic_load_n(q->job->cancel, __ATOMIC_RELAXED)) /* set by the HTTP watch thread */
            seq_fail(e, q, TIDE_ECANCELED, NULL);
    }
    seq_pool_resume(e, seqs, n); /* paused ones come back while the pool holds them, oldest first */
    for (int i = 0; i < n; i++) /* waiters: the rows exist now, or their sequence went (prefix_share.h) */
        if (!seqs[i]->done && !seqs[i]->paused && seqs[i]->waiting)
            share_prefix(e, seqs[i]);
    /* decode rows first: every stream advances each step; then prompt chunks in admission order */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n && nf < FORWARD_MAX_SEQ; i++) {
            struct engine_seq *q = seqs[i];
            if (q->done || q->waiting || q->paused || (pass == 0) != (q->pos >= q->filled) || rows >= max_rows)
                continue;
            int k = plan_rows(e, q, max_rows - rows, &fs[nf]);
            if (k > 0) {
                in[nf++] = q;
                rows += k;
            }
        }
    /* their blocks (paged): where the pool runs out, a sequence pauses and leaves the step, before
     * any draw takes a number from its sampler */
    nf = seq_pool_reserve(e, seqs, n, in, fs, nf);
    for (int i = 0; i < nf; i++) {
        struct engine_seq *q = in[i];
        const struct sample_edit *ed;
        int ne = q->draw_on_device && fs[i].want_logits ? draw_edits(e, q, &ed) : -1;
        if (ne >= 0) { /* else the host samples its logits */
            if (q->draw.temperature > 0.0f) /* one u a draw, as the host sampler */
                q->draw.u = sampler_next_uniform(&q->smp);
            q->draw.edits = ed;
            q->draw.n_edits = ne;
            fs[i].draw = &q->draw;
            fs[i].logprob = &q->dlp;
        }
    }
    e->last_forward_s = 0;
    if (!nf)
        return 0;
    double t_fw = tide_now();
    if (e->slow_token_us)
        usleep(e->slow_token_us); /* test hook, see engine_init */
    int rc = step_fault(e) ? TIDE_EINTERNAL : forward_eval_batch(&e->fw, fs, nf);
    e->last_forward_s = tide_now() - t_fw;
    if (rc < 0) {
        const char *be = e->fw.backend_failed ? e->fw.backend_err : NULL;
        for (int i = 0; i < nf; i++) {
            char why[400];
            if (in[i]->pos < in[i]->n_prompt)
                snprintf(why, sizeof why, "prefill: %s%s%s", tide_strerror(rc), be ? ": the backend failed: " : "",
                         be ? be : "");
            else
                snprintf(why, sizeof why, "forward at position %d: %s%s%s", in[i]->pos, tide_strerror(rc),
                         be ? ": the backend failed: " : "", be ? be : "");
            seq_fail(e, in[i], rc, why);
        }
        return rc;
    }
    uint32_t n_vocab = e->model.cfg.n_vocab;
    for (int i = 0; i < nf; i++) {
        struct engine_seq *q = in[i];
        struct kv_slot *s = &e->slots[q->slot];
        bool prefill = q->pos < q->n_prompt;
        if (prefill)
            memcpy(s->tokens + q->pos, q->ids + q->pos, sizeof(int) * (size_t)fs[i].n);
        else if (q->pos >= q->filled)
            s->tokens[q->pos] = q->next; /* (a resumed generation's rows hold their tokens already) */
        q->pos += fs[i].n;
        s->n_tokens = q->pos;
        prefix_cache_key_slot(e, q->slot);
        if (!fs[i].want_logits)
            continue;
        float *logits = (float *)fs[i].logits;
        if (prefill && q->prompt_logits)
            memcpy(q->prompt_logits, logits, sizeof(float) * n_vocab);
        take_token(e, q, logits, fs[i].pick, fs[i].draw && fs[i].draw->logprobs ? &q->dlp : NULL);
    }
    return 0;
}
