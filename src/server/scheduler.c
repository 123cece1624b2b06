/* scheduler.c - the engine thread, all of it: admission, steps, control jobs, timers, image
 * embedding and the published snapshot.
 *
 * The loop, between two steps (a step boundary): run the control jobs that arrived (POST
 * /v1/vram), run the timer when due (vision idle unload, a regrow that fell behind, a fresh
 * snapshot), admit queued jobs in arrival order while a KV slot is free (an image job makes
 * the encoder ready and embeds its images here: the caches hand VRAM back while the running
 * sequences wait at this boundary), then one engine_step over every running sequence, then
 * finish the jobs whose sequences ended. The running sequences stay in their KV slots across
 * everything that happens at a boundary, so they resume unchanged.
 *
 * It lives in server/ rather than engine/ because it knows jobs, the FIFO, the vision
 * lifecycle and the metrics; the engine it drives (engine/sequence.c) knows none of them. */
#include "server/runtime.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "vision/content_hash.h"
#include "vision/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_S 0.25 /* the timer: idle unload, regrow retries, snapshot */

/* A running job. Entries stay where they are while they run (the sequence reads cancel). */
struct running {
    bool used;
    struct job *j;
    struct gen_job *gj;
    struct engine_seq *q;
    bool image;              /* holds the vision encoder busy (vision_begin) */
};

struct scheduler {
    struct runtime *rt;
    pthread_t thread;
    struct running ent[FORWARD_MAX_SEQ];
    struct running *order[FORWARD_MAX_SEQ]; /* running entries in admission order */
    int n;
    double next_tick;
};

#define MIB_D ((double)(1 << 20))

void runtime_publish(struct runtime *rt)
{
    struct memory_plan *p = &rt->eng.mem;
    struct vram_snapshot s;
    memset(&s, 0, sizeof s);
    s.n = p->n_dev;
    struct metrics_device md[PLAN_MAX_DEVICES];
    for (int i = 0; i < p->n_dev; i++) {
        const struct device *d = &p->dev[i];
        const struct expert_cache *c = &p->cache[i];
        struct vram_dev_snap *x = &s.d[i];
        x->index = i;
        x->backend = d->kind == DEVICE_KIND_CUDA ? "cuda" : "cpu";
        x->total = d->total;
        x->free = device_free_bytes(d);
        x->reserve = d->reserve;
        memcpy(x->used, d->used, sizeof x->used);
        x->cache_bytes = expert_cache_bytes(c);
        x->cache_full_bytes = (size_t)c->n_seg_full * c->seg_bytes;
        x->slots = expert_cache_slots(c);
        int full = c->n_seg_full * c->slots_per_seg, keys = (int)c->n_routed_keys;
        x->slots_full = c->n_seg_max ? (full < keys ? full : keys) : 0;
        x->l0 = p->l0[i];
        x->l1 = p->l1[i];
        x->hits = c->hits;
        x->misses = c->misses;
        x->copied = c->bytes_copied;
        md[i] = (struct metrics_device){
            .index = i, .backend = x->backend, .total_bytes = x->total, .free_bytes = x->free,
            .reserve_bytes = x->reserve, .expert_slots = (uint64_t)x->slots,
            .expert_slots_full = (uint64_t)x->slots_full, .expert_cache_bytes = x->cache_bytes,
            .expert_hits = x->hits, .expert_misses = x->misses, .expert_bytes_copied = x->copied};
        for (int k = 0; k < MEM_KIND_COUNT; k++)
            md[i].used_bytes[k] = d->used[k];
    }
    memory_host_ram(&s.host_total, &s.host_free);
    s.host_experts = p->host_expert_bytes;
    s.seq_slots = rt->eng.n_slots;
    s.seq_running = rt->eng.n_slots - engine_free_slots(&rt->eng);
    for (int i = 0; i < rt->eng.n_slots; i++) {
        const struct kv_slot *k = &rt->eng.slots[i];
        if (k->busy)
            s.kv_running_rows += k->n_tokens;
        else if (k->n_tokens > 0) {
            s.kv_cached_slots++;
            s.kv_cached_rows += k->n_tokens;
        }
    }
    s.kv_rows_per_slot = rt->eng.n_ctx;
    s.kv_f16 = rt->eng.fw.kv_f16;
    engine_kv_stats(&rt->eng, &s.kv);
    s.kv_pauses_total = rt->eng.kv_pauses;
    s.kv_resumes_total = rt->eng.kv_resumes;
    const struct kv_park *kp = &rt->eng.park;
    s.parked = kp->n;
    s.parked_bytes = kp->used;
    s.parked_budget = kp->budget;
    s.parked_total = kp->n_parked;
    s.restored_total = kp->n_restored;
    s.restored_tokens_total = kp->tokens_restored;
    s.park_evicted_total = kp->n_evicted;
    s.shared_tokens_total = rt->eng.shared_tokens;
    s.prefix_waits_total = rt->eng.prefix_waits;
    s.block_cache_tokens_total = rt->eng.block_cache_tokens;
    s.block_cache_evictions_total = rt->eng.fw.kv.evicted;
    s.backend_failed = rt->eng.fw.backend_failed;
    snprintf(s.backend_err, sizeof s.backend_err, "%s", rt->eng.fw.backend_err);
    pthread_mutex_lock(&rt->snap_mu);
    s.vision_state = rt->vision ? vision_state_name(rt->vision->state) : "unloaded";
    s.vision_lazy = rt->snap.vision_lazy;
    s.vision_idle_s = rt->snap.vision_idle_s;
    s.last_image_unix = rt->vision ? rt->vision->last_image_unix : 0;
    rt->snap = s;
    pthread_mutex_unlock(&rt->snap_mu);
    metrics_publish_devices(md, s.n);
    metrics_kv_slots(s.seq_running, s.seq_slots, s.kv_cached_slots, s.kv_cached_rows);
    metrics_kv_parked(s.parked, s.parked_bytes, s.parked_budget, s.parked_total, s.restored_total,
                      s.restored_tokens_total, s.park_evicted_total);
    metrics_kv_shared(s.shared_tokens_total, s.prefix_waits_total, s.block_cache_tokens_total,
                      s.block_cache_evictions_total);
    metrics_kv_blocks(&s.kv, s.kv_pauses_total);
}

void runtime_vision_event(void *ud, const struct vision_lifecycle *v, enum vision_event ev)
{
    (void)ud;
    switch (ev) {
    case VISION_EV_STATE: metrics_vision_state(vision_state_name(v->state)); break;
    case VISION_EV_HANDBACK: metrics_observe(METRICS_HANDBACK, v->t_handback); break;
    case VISION_EV_LOAD:
        metrics_observe(METRICS_VISION_LOAD, v->t_load);
        metrics_vision_event(true);
        break;
    case VISION_EV_ENCODE: metrics_observe(METRICS_VISION_ENCODE, v->t_encode); break;
    case VISION_EV_UNLOAD: metrics_vision_event(false); break;
    case VISION_EV_REGROW: metrics_observe(METRICS_REGROW, v->count.last_regrow_s); break;
    case VISION_EV_CACHE_HIT: metrics_vision_embed_cache(true); break;
    case VISION_EV_CACHE_MISS: metrics_vision_embed_cache(false); break;
    case VISION_EV_IMAGE: metrics_vision_last_image(v->last_image_unix); break;
    }
}

/* The timer: the vision idle unload, another try for a cache whose regrow failed part way
 * (memory/plan.c), and a fresh snapshot for /v1/vram and /metrics. */
static void tick(struct runtime *rt)
{
    if (rt->vision)
        vision_tick(rt->vision);
    if (memory_plan_behind(&rt->eng.mem)) {
        size_t extra[PLAN_MAX_DEVICES] = {0};
        if (rt->vision)
            vision_lifecycle_extra(rt->vision, extra);
        memory_plan_retry_grow(&rt->eng.mem, extra);
    }
    runtime_publish(rt);
}

/* Control jobs (POST /v1/vram) at this boundary, in arrival order. */
static void run_controls(struct runtime *rt)
{
    struct job *j;
    while ((j = fifo_pop_control(rt->fifo))) {
        job_start(j);
        j->run(j, rt);
        if (!j->done)
            job_finish(j, 200);
        job_unref(j);
    }
}

_Static_assert(CONTENT_HASH_SIZE == ROW_IMAGE_KEY_BYTES, "an image row's key is the content hash");

/* An admitted job's images: the encoder made ready (hand-back, load) unless every image is in
 * the embedding cache, then each one embedded. */
static int embed_images(struct runtime *rt, struct job *j, struct gen_job *gj, char *err, size_t errlen)
{
    struct req_images im;
    openai_req_images(j->ud, &im);
    struct vision_lifecycle *v = rt->vision;
    if (!v) {
        snprintf(err, errlen, "%s", rt->vision_error[0] ? rt->vision_error
                                                        : "this server has no vision model: images need an mmproj "
                                                          "in the config");
        return TIDE_EUNSUPPORTED;
    }
    for (int i = 0; i < im.n; i++) {
        int nt = 0, gw = 0;
        int rc = vision_embed(v, im.bytes[i], im.len[i], &im.img[i], &im.embd[i], &nt, &gw, err, errlen);
        if (rc < 0)
            return rc;
        im.g[i] = (struct gen_image){.embd = im.embd[i], .n_tokens = nt, .row_floats = v->row_floats, .grid_w = gw,
                                     .keyed = true};
        /* the image's rows are reused from a slot or host RAM only for the same bytes
         * (prompt_rows.h); a SHA-256, as the embedding cache keys them */
        content_hash(im.bytes[i], im.len[i], im.g[i].key);
    }
    vision_touch(v); /* the idle timer counts from the end of the encode */
    gj->images = im.g;
    gj->n_images = im.n;
    return 0;
}

/* The job ended (rc 0) or failed: its reply, and everything it held. */
static void finish(struct scheduler *S, struct running *r, int rc, const char *err)
{
    struct runtime *rt = S->rt;
    if (r->image && rt->vision)
        vision_end(rt->vision);
    if (r->gj)
        metrics_cached_tokens(r->gj->cached_tokens);
    r->j->gen->end(r->j, rt, rc, err);
    if (!r->j->done)
        job_finish(r->j, rc < 0 ? 500 : 200);
    engine_seq_free(&rt->eng, r->q);
    if (r->q)
        metrics_running_add(-1);
    job_unref(r->j);
    memset(r, 0, sizeof *r);
}

/* Admit queued jobs in arrival order while a KV slot is free (and no sequence is paused for KV
 * blocks: engine_can_admit). */
static bool admit(struct scheduler *S)
{
    struct runtime *rt = S->rt;
    bool any = false;
    while (S->n < FORWARD_MAX_SEQ && engine_can_admit(&rt->eng)) {
        struct job *j = fifo_pop(rt->fifo);
        if (!j)
            break;
        any = true;
        metrics_observe(METRICS_QUEUE, tide_now() - j->t_enqueue);
        job_start(j);
        if (job_cancelled(j)) { /* the client left while waiting: do not spend the model on it */
            job_finish(j, 499);
            job_unref(j);
            continue;
        }
        struct running *r = NULL;
        for (int i = 0; i < FORWARD_MAX_SEQ && !r; i++)
            if (!S->ent[i].used)
                r = &S->ent[i];
        *r = (struct running){.used = true, .j = j};
        char err[640] = "";
        r->gj = j->gen->begin(j, rt);
        if (!r->gj) {
            if (!j->done)
                job_finish(j, 500);
            job_unref(j);
            memset(r, 0, sizeof *r);
            continue;
        }
        /* the job's own flag (an atomic int; the tokenizer and the step read it with an atomic load): they
         * see a hang-up or a shutdown as soon as it is set */
        r->gj->cancel = (const volatile int *)&j->cancel;
        int rc = 0;
        struct req_images im;
        openai_req_images(j->ud, &im);
        if (im.n) {
            if (rt->vision) {
                vision_begin(rt->vision);
                r->image = true;
            }
            rc = embed_images(rt, j, r->gj, err, sizeof err);
            runtime_publish(rt); /* the vision state a client reads next is this one */
        }
        if (rc == 0 && rt->eng.fw.backend_failed) { /* nothing can run: say why, at once */
            snprintf(err, sizeof err, "the backend failed earlier (%s): this daemon needs a restart",
                     rt->eng.fw.backend_err);
            rc = TIDE_EINTERNAL;
        }
        if (rc == 0)
            rc = engine_seq_start(&rt->eng, r->gj, &r->q, err, sizeof err);
        if (rc < 0) {
            finish(S, r, rc, err);
            continue;
        }
        metrics_running_add(1);
        S->order[S->n++] = r;
    }
    return any;
}

/* One step over the running sequences, then the jobs whose sequences ended are finished. */
static void step(struct scheduler *S)
{
    struct runtime *rt = S->rt;
    struct engine_seq *qs[FORWARD_MAX_SEQ];
    for (int i = 0; i < S->n; i++)
        qs[i] = S->order[i]->q;
    int rows = rt->cfg->max_batch_tokens;
    int cap = forward_step_rows(&rt->eng.fw);
    double t0 = tide_now();
    if (engine_step(&rt->eng, qs, S->n, rows < cap ? rows : cap) < 0 && rt->eng.fw.backend_failed) {
        tide_log("the backend failed: %s; the daemon reports itself unhealthy (GET /health 503) until restarted",
                 rt->eng.fw.backend_err);
        runtime_publish(rt);
    }
    /* The counts a client reads after its reply (expert hits and misses, parking, the slots its
     * sequence held) include its request: the ended sequences give their slots back, the
     * snapshot is published once, and only then do the replies go out. */
    bool ended = false;
    for (int i = 0; i < S->n; i++)
        if (engine_seq_done(S->order[i]->q, NULL, NULL)) {
            engine_seq_release(&rt->eng, S->order[i]->q);
            ended = true;
        }
    if (ended)
        runtime_publish(rt);
    int k = 0;
    for (int i = 0; i < S->n; i++) {
        struct running *r = S->order[i];
        int rc;
        const char *err;
        if (engine_seq_done(r->q, &rc, &err))
            finish(S, r, rc, err);
        else
            S->order[k++] = r;
    }
    S->n = k;
    /* where a step's time goes: the forward, and the engine thread's work around it */
    double fw = rt->eng.last_forward_s;
    if (fw > 0) {
        metrics_observe(METRICS_STEP_FORWARD, fw);
        metrics_observe(METRICS_STEP_HOST, tide_now() - t0 - fw);
    }
}

static void *engine_main(void *arg)
{
    struct scheduler *S = arg;
    struct runtime *rt = S->rt;
    S->next_tick = tide_now() + TICK_S;
    while (!fifo_closed(rt->fifo)) {
        run_controls(rt);
        if (tide_now() >= S->next_tick) {
            tick(rt);
            S->next_tick = tide_now() + TICK_S;
        }
        if (admit(S))
            runtime_publish(rt);
        if (!S->n) {
            double wait = S->next_tick - tide_now();
            fifo_wait(rt->fifo, wait > 0.001 ? wait : 0.001);
            continue;
        }
        step(S);
    }
    /* Closed: what runs ends now, each reply with its error event (streams) or 503. */
    for (int i = 0; i < S->n; i++) {
        job_cancel(S->order[i]->j);
        finish(S, S->order[i], TIDE_ECANCELED, "server is shutting down");
    }
    S->n = 0;
    run_controls(rt);
    return NULL;
}

int scheduler_start(struct runtime *rt)
{
    struct scheduler *S = calloc(1, sizeof *S);
    if (!S)
        return TIDE_ENOMEM;
    S->rt = rt;
    if (pthread_create(&S->thread, NULL, engine_main, S) != 0) {
        free(S);
        return TIDE_EINTERNAL;
    }
    rt->sched = S;
    return 0;
}

void scheduler_stop(struct runtime *rt)
{
    struct scheduler *S = rt->sched;
    if (!S)
        return;
    fifo_close(rt->fifo);
    pthread_join(S->thread, NULL);
    fifo_drop_queued(rt->fifo); /* never ran: 503, so their readers wake before http_stop */
    free(S);
    rt->sched = NULL;
}
