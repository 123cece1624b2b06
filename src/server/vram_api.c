/* vram_api.c - the /v1/vram endpoints and the runtime snapshot. */
#include "server/vram_api.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "vision/vision.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB ((double)(1 << 20))

/* Used memory rounds up (a kind that holds anything shows at least 1 MiB), free rounds down:
 * "free_mib >= reserve_mib" in the reply then means it in bytes too. */
static double up_mib(size_t b) { return ceil((double)b / MIB); }
static double down_mib(size_t b) { return floor((double)b / MIB); }

void runtime_snapshot(struct runtime *rt, struct vram_snapshot *out)
{
    pthread_mutex_lock(&rt->snap_mu);
    *out = rt->snap;
    pthread_mutex_unlock(&rt->snap_mu);
    if (!out->vision_state)
        out->vision_state = "unloaded";
}

static char vram_instance[256];

void vram_set_instance(const char *name)
{
    snprintf(vram_instance, sizeof vram_instance, "%s", name ? name : "");
}

char *vram_render(const struct vram_snapshot *s, const char *status, const size_t *shortfall)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (vram_instance[0])
        cJSON_AddStringToObject(o, "instance", vram_instance);
    cJSON *devs = cJSON_AddArrayToObject(o, "devices");
    double t[12] = {0};
    for (int i = 0; i < s->n; i++) {
        const struct vram_dev_snap *x = &s->d[i];
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "index", x->index);
        cJSON_AddStringToObject(d, "backend", x->backend);
        double v[] = {down_mib(x->total), down_mib(x->free), up_mib(x->reserve), up_mib(x->used[MEM_WEIGHTS]),
                      up_mib(x->used[MEM_KV]), up_mib(x->cache_bytes), up_mib(x->cache_full_bytes),
                      (double)x->slots, (double)x->slots_full, up_mib(x->used[MEM_VISION]),
                      up_mib(x->used[MEM_WORKSPACE])};
        static const char *const names[] = {"total_mib", "free_mib", "reserve_mib", "weights_mib", "kv_mib",
                                            "expert_cache_mib", "expert_cache_full_mib", "expert_slots",
                                            "expert_slots_full", "vision_mib", "workspace_mib"};
        for (int k = 0; k < 11; k++) {
            cJSON_AddNumberToObject(d, names[k], v[k]);
            t[k] += v[k];
        }
        /* the KV cache's exact bytes on this device (its layers' part of every slot), and its
         * elements' type (kv_type: one for the whole cache) */
        cJSON_AddNumberToObject(d, "kv_bytes", (double)x->used[MEM_KV]);
        cJSON_AddStringToObject(d, "kv_type", s->kv_f16 ? "f16" : "f32");
        cJSON *ly = cJSON_AddArrayToObject(d, "layers");
        cJSON_AddItemToArray(ly, cJSON_CreateNumber(x->l0));
        cJSON_AddItemToArray(ly, cJSON_CreateNumber(x->l1));
        cJSON_AddNumberToObject(d, "expert_hits", (double)x->hits);
        cJSON_AddNumberToObject(d, "expert_misses", (double)x->misses);
        cJSON_AddItemToArray(devs, d);
    }
    cJSON *tot = cJSON_AddObjectToObject(o, "totals");
    static const char *const tnames[] = {"total_mib", "free_mib", "reserve_mib", "weights_mib", "kv_mib",
                                         "expert_cache_mib", "expert_cache_full_mib", "expert_slots",
                                         "expert_slots_full", "vision_mib", "workspace_mib"};
    for (int k = 0; k < 11; k++)
        cJSON_AddNumberToObject(tot, tnames[k], t[k]);
    /* the engine's KV slots: sequences running now, at most, the slots no sequence holds, and
     * idle slots holding rows a later prompt with the same prefix reuses (cached_tokens); rows
     * are token positions, rows_per_slot of them a slot (context) */
    cJSON *sq = cJSON_AddObjectToObject(o, "sequences");
    cJSON_AddNumberToObject(sq, "running", s->seq_running);
    cJSON_AddNumberToObject(sq, "slots", s->seq_slots);
    cJSON_AddNumberToObject(sq, "free", s->seq_slots - s->seq_running);
    cJSON_AddNumberToObject(sq, "cached", s->kv_cached_slots);
    cJSON_AddNumberToObject(sq, "rows_per_slot", s->kv_rows_per_slot);
    cJSON_AddNumberToObject(sq, "running_rows", (double)s->kv_running_rows);
    cJSON_AddNumberToObject(sq, "cached_rows", (double)s->kv_cached_rows);
    /* the KV pool's blocks (engine/kv_blocks.h): paged, blocks of block_rows positions taken as
     * sequences grow; else one block of rows_per_slot a slot */
    cJSON_AddBoolToObject(sq, "paged", s->kv.paged);
    cJSON_AddNumberToObject(sq, "block_rows", s->kv.block_rows);
    cJSON_AddNumberToObject(sq, "blocks", s->kv.blocks);
    cJSON_AddNumberToObject(sq, "blocks_running", s->kv.running);
    cJSON_AddNumberToObject(sq, "blocks_cached", s->kv.cached);
    cJSON_AddNumberToObject(sq, "blocks_free", s->kv.free);
    cJSON_AddNumberToObject(sq, "blocks_shared", s->kv.shared);
    cJSON_AddNumberToObject(sq, "paused", s->kv.paused);
    cJSON_AddNumberToObject(sq, "paused_total", (double)s->kv_pauses_total);
    /* conversations parked in host RAM when their slot was taken (engine/kv_park.h) */
    cJSON_AddNumberToObject(sq, "parked", s->parked);
    cJSON_AddNumberToObject(sq, "parked_mib", round((double)s->parked_bytes / 1048576.0 * 10) / 10);
    cJSON_AddNumberToObject(sq, "parked_budget_mib", round((double)s->parked_budget / 1048576.0 * 10) / 10);
    cJSON *vis = cJSON_AddObjectToObject(o, "vision");
    cJSON_AddStringToObject(vis, "state", s->vision_state ? s->vision_state : "unloaded");
    cJSON_AddBoolToObject(vis, "lazy", s->vision_lazy);
    cJSON_AddNumberToObject(vis, "idle_s", (double)s->vision_idle_s);
    if (s->last_image_unix > 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double ago = (double)now.tv_sec + now.tv_nsec * 1e-9 - s->last_image_unix;
        cJSON_AddNumberToObject(vis, "last_image_s_ago", round((ago > 0 ? ago : 0) * 10) / 10);
    } else {
        cJSON_AddNullToObject(vis, "last_image_s_ago");
    }
    cJSON *h = cJSON_AddObjectToObject(o, "host_ram");
    cJSON_AddNumberToObject(h, "total_mib", down_mib(s->host_total));
    cJSON_AddNumberToObject(h, "experts_mib", up_mib(s->host_experts));
    cJSON_AddNumberToObject(h, "free_mib", down_mib(s->host_free));
    if (status) {
        cJSON_AddStringToObject(o, "status", status);
        cJSON *sf = cJSON_AddArrayToObject(o, "shortfall_mib");
        for (int i = 0; i < s->n; i++)
            cJSON_AddItemToArray(sf, cJSON_CreateNumber(shortfall ? up_mib(shortfall[i]) : 0));
    }
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

void vram_get(struct runtime *rt, const struct http_request *rq, struct http_response *rs)
{
    struct vram_snapshot s;
    runtime_snapshot(rt, &s);
    rs->body = vram_render(&s, NULL, NULL);
    if (!rs->body)
        http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
}

static int reserve_value(const cJSON *v, long *out)
{
    if (cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    if (!cJSON_IsNumber(v) || cJSON_IsBool(v))
        return -1;
    double d = v->valuedouble;
    if (d < 0 || d != floor(d) || d > 1e9)
        return -1;
    *out = (long)d;
    return 0;
}

int vram_parse_reserve(const char *body, size_t len, int n_dev, bool *set, long *mib, char *msg,
                       size_t msglen, const char **param)
{
    *param = "reserve_mib";
    for (int i = 0; i < n_dev; i++) {
        set[i] = false;
        mib[i] = 0;
    }
    cJSON *o = cJSON_ParseWithLength(body, len);
    int rc = TIDE_EINVAL;
    if (!o || !cJSON_IsObject(o)) {
        snprintf(msg, msglen, "body must be a JSON object like {\"reserve_mib\": [1024]}");
        *param = NULL;
        goto out;
    }
    for (cJSON *k = o->child; k; k = k->next)
        if (strcmp(k->string, "reserve_mib")) {
            snprintf(msg, msglen, "unknown field '%s' (expected reserve_mib)", k->string);
            *param = NULL;
            goto out;
        }
    cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "reserve_mib");
    if (!r) {
        snprintf(msg, msglen, "reserve_mib is required: a list of MiB per device, an integer, or null");
        goto out;
    }
    if (cJSON_IsNull(r)) { /* restore every device */
        for (int i = 0; i < n_dev; i++) {
            set[i] = true;
            mib[i] = -1;
        }
        rc = 0;
        goto out;
    }
    if (cJSON_IsArray(r)) {
        int n = cJSON_GetArraySize(r);
        if (n > n_dev) {
            snprintf(msg, msglen, "reserve_mib has %d values but there %s %d device%s", n, n_dev == 1 ? "is" : "are",
                     n_dev, n_dev == 1 ? "" : "s");
            goto out;
        }
        int i = 0;
        for (cJSON *v = r->child; v; v = v->next, i++) {
            if (reserve_value(v, &mib[i])) {
                snprintf(msg, msglen, "reserve_mib[%d] must be a non-negative integer (MiB) or null", i);
                goto out;
            }
            set[i] = true;
        }
        rc = 0;
        goto out;
    }
    if (reserve_value(r, &mib[0]) || cJSON_IsNull(r)) {
        snprintf(msg, msglen, "reserve_mib must be a list of non-negative integers (MiB), an integer, or null");
        goto out;
    }
    set[0] = true;
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

struct vram_req {
    bool set[PLAN_MAX_DEVICES];
    long mib[PLAN_MAX_DEVICES];
};

/* Engine thread: apply the new reserves, reply with the view after the resize. */
static void vram_run(struct job *j, void *ctx)
{
    struct runtime *rt = ctx;
    struct vram_req *vr = j->ud;
    struct memory_plan *p = &rt->eng.mem;
    double t0 = tide_now();
    size_t before = 0, after = 0;
    uint64_t copied = 0;
    for (int i = 0; i < p->n_dev; i++) {
        before += expert_cache_bytes(&p->cache[i]);
        copied -= p->cache[i].bytes_copied;
        if (vr->set[i])
            p->dev[i].reserve = vr->mib[i] < 0 ? p->dev[i].reserve_startup : (size_t)vr->mib[i] << 20;
    }
    size_t shortfall[PLAN_MAX_DEVICES] = {0}, extra[PLAN_MAX_DEVICES] = {0};
    if (rt->vision)
        vision_lifecycle_extra(rt->vision, extra);
    int rc = memory_plan_apply(p, extra, shortfall);
    for (int i = 0; i < p->n_dev; i++) {
        after += expert_cache_bytes(&p->cache[i]);
        copied += p->cache[i].bytes_copied;
    }
    double dt = tide_now() - t0;
    if (after < before) metrics_observe(METRICS_HANDBACK, dt);
    else if (after > before) metrics_observe(METRICS_REGROW, dt);
    tide_log("vram: reserve applied in %.1f ms, expert cache %.1f -> %.1f MiB%s, %.1f MiB of experts copied back",
             dt * 1e3, before / MIB, after / MIB, rc == 1 ? " (partial)" : "", copied / MIB);
    runtime_publish(rt);
    struct vram_snapshot s;
    runtime_snapshot(rt, &s);
    if (rc >= 0 && memory_plan_behind(p)) {
        /* A cache could not grow back (a device allocation failed): say so; the engine timer
         * keeps trying, and GET /v1/vram shows the slots come back. */
        char msg[256];
        int d = 0;
        while (d < p->n_dev && !p->grow_behind[d]) d++;
        snprintf(msg, sizeof msg, "the expert cache of device %d could not grow back: a device allocation failed "
                 "(%d segments missing); the reserve is applied and the engine retries every 0.25 s", d,
                 p->grow_behind[d]);
        char *e = openai_error_json(msg, "server_error", NULL, "regrow_failed");
        if (e) {
            job_write(j, e, strlen(e));
            free(e);
            job_finish(j, 500);
            return;
        }
    }
    char *body = rc < 0 ? NULL : vram_render(&s, rc == 1 ? "partial" : "ok", shortfall);
    if (!body) {
        const char *e = "{\"error\":{\"message\":\"resize failed\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        job_write(j, e, strlen(e));
        job_finish(j, 500);
        return;
    }
    job_write(j, body, strlen(body));
    free(body);
    job_finish(j, 200);
}

/* The resize ran (its reply is the job's output); a client that left gets nothing. */
static void vram_done(void *app, struct job *j, struct http_response *rs)
{
    (void)app;
    rs->status = j->status;
    rs->body = strdup(j->buf ? j->buf : "");
}

void vram_post(struct runtime *rt, const struct http_request *rq, struct http_response *rs)
{
    if (!rt->cfg->vram_elastic) {
        http_error(rs, 409, "invalid_request_error", "vram_elastic is false in the config: the caches cannot resize",
                   NULL, NULL);
        return;
    }
    struct vram_req *vr = calloc(1, sizeof *vr);
    if (!vr) {
        http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
        return;
    }
    char msg[200];
    const char *param = NULL;
    if (vram_parse_reserve(rq->body, rq->body_len, rt->eng.mem.n_dev, vr->set, vr->mib, msg, sizeof msg, &param)) {
        free(vr);
        http_error(rs, 400, "invalid_request_error", msg, param, NULL);
        return;
    }
    struct job *j = job_new(vram_run, vr, free);
    if (!j) {
        free(vr);
        http_error(rs, 500, "server_error", "out of memory", NULL, NULL);
        return;
    }
    if (fifo_push_control(rt->fifo, j)) {
        job_unref(j);
        http_error(rs, 503, "server_error", "server is shutting down", NULL, NULL);
        return;
    }
    rs->wait = j; /* http.c answers with vram_done once the engine ran it; no thread waits */
    rs->done = vram_done;
}
