/* main.c - tide daemon entry: flags + config, HTTP up, model load, the engine thread, signals.
 *
 * HTTP starts before the model loads so /health can answer 503 "loading"; inference
 * routes answer 503 until the engine is ready. SIGINT/SIGTERM are taken with sigwait()
 * in this thread so no work happens in a signal handler. SIGTERM drains first (GET /ready
 * turns 503, new work is refused, what was accepted finishes); SIGINT or a second signal
 * cancels at once. */
#include "common.h"
#include "engine/session.h"
#include "server/config.h"
#include "server/fifo.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/oai_fields.h"
#include "server/oai_tools.h"
#include "server/openai.h"
#include "server/recent.h"
#include "server/runtime.h"
#include "server/tokenize_api.h"
#include "server/ui.h"
#include "server/vram_api.h"
#include "memory/host_budget.h"
#include "vision/vision.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct app {
    struct config cfg;
    struct runtime rt;
    struct vision_lifecycle vis;
    struct fifo *_Atomic fifo;  /* NULL while loading */
    atomic_bool stopping;
    atomic_bool draining;       /* SIGTERM seen: finishing accepted work, refusing new */
    char model_id[256];
    long created;
};

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

/* A backend that failed (a sticky CUDA error): nothing it runs can be trusted until a restart. */
static bool backend_failed(struct app *a, char *why, size_t whylen)
{
    struct vram_snapshot s;
    runtime_snapshot(&a->rt, &s);
    if (s.backend_failed)
        snprintf(why, whylen, "the backend failed (%s): this daemon needs a restart", s.backend_err);
    return s.backend_failed;
}

static void h_health(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    char why[400];
    if (!atomic_load(&a->fifo)) {
        rs->status = 503;
        rs->body = dup_str("{\"status\":\"loading\"}");
    } else if (backend_failed(a, why, sizeof why)) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "error");
        cJSON_AddStringToObject(o, "reason", why);
        rs->status = 503;
        rs->body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    } else {
        rs->body = dup_str("{\"status\":\"ok\"}");
    }
}

/* Readiness, apart from liveness: a balancer or Kubernetes sends traffic only while this is
 * 200. Its own path (not /health?ready=1) so that probes, nginx and curl need no query
 * string and /health keeps its one meaning. */
static void h_ready(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    struct fifo *f = atomic_load(&a->fifo);
    const char *state = "ready", *reason = NULL;
    char why[400];
    if (!f) state = "loading", reason = "the model is loading";
    else if (backend_failed(a, why, sizeof why)) state = "error", reason = why;
    else if (atomic_load(&a->draining) || atomic_load(&a->stopping))
        state = "draining", reason = "the server is shutting down: finishing the requests it has";
    else if (fifo_waiting(f) >= a->cfg.queue_max)
        state = "queue_full", reason = "the queue is full";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", state);
    if (reason) {
        cJSON_AddStringToObject(o, "reason", reason);
        rs->status = 503;
        rs->retry_after = 1;
    }
    rs->body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
}

static void h_models(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    cJSON *o = cJSON_CreateObject(), *d;
    cJSON_AddStringToObject(o, "object", "list");
    d = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)a->created);
    cJSON_AddStringToObject(m, "owned_by", "tide");
    cJSON_AddItemToArray(d, m);
    rs->body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
}

static void h_metrics(void *ap, const struct http_request *rq, struct http_response *rs)
{
    rs->body = metrics_render();
    rs->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

/* A non-streamed generation has finished (on the HTTP polling thread). */
static void generate_done(void *ap, struct job *j, struct http_response *rs)
{
    struct app *a = ap;
    if (j->status == 499 || j->status == 503) {
        http_error(rs, 503, "server_error", atomic_load(&a->stopping) ? "server is shutting down" : "request canceled",
                   NULL, NULL);
    } else {
        rs->status = j->status;
        rs->body = dup_str(j->buf ? j->buf : "");
    }
}

static void generate(struct app *a, const struct http_request *rq, struct http_response *rs, bool chat)
{
    struct fifo *f = atomic_load(&a->fifo);
    if (!f || atomic_load(&a->stopping) || atomic_load(&a->draining)) {
        http_error(rs, 503, "server_error", f ? "server is shutting down" : "model is loading", NULL, NULL);
        rs->retry_after = 1;
        return;
    }
    char why[400];
    if (backend_failed(a, why, sizeof why)) { /* another daemon of the fleet can answer */
        http_error(rs, 503, "server_error", why, NULL, "backend_failed");
        rs->retry_after = 1;
        return;
    }
    char msg[256];
    const char *param = NULL;
    struct oai_req *req;
    int rc = openai_parse(rq->body, rq->body_len, chat, a->model_id, &req, msg, sizeof msg, &param);
    if (rc == TIDE_EFULL) {
        /* request_budget has no room for it now (issue 27): come back later */
        http_error(rs, 503, "server_error", msg, param, NULL);
        rs->retry_after = 1;
        return;
    }
    if (rc) {
        http_error(rs, rc == TIDE_ENOMEM ? 500 : rc == TIDE_ERANGE ? 413 : 400,
                   rc == TIDE_ENOMEM ? "server_error" : "invalid_request_error", msg, param, NULL);
        return;
    }
    bool stream = openai_req_stream(req);
    struct job *j = job_new(NULL, req, openai_req_free);
    if (!j) { openai_req_free(req); http_error(rs, 500, "server_error", "out of memory", NULL, NULL); return; }
    j->gen = &openai_gen;
    rc = fifo_push(f, j);
    if (rc) {
        job_unref(j);
        http_error(rs, 503, "server_error", rc == TIDE_EFULL ? "queue is full, retry later" : "server is shutting down",
                   NULL, NULL);
        rs->retry_after = 1;
        return;
    }
    if (stream) rs->stream = j;
    else { rs->wait = j; rs->done = generate_done; } /* http.c suspends; no thread waits */
}

static void h_vram_get(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    if (!atomic_load(&a->fifo)) { http_error(rs, 503, "server_error", "model is loading", NULL, NULL); rs->retry_after = 1; return; }
    vram_get(&a->rt, rq, rs);
}

/* A browser page from another origin must not be able to take a user's VRAM: a request
 * carrying an Origin whose host is not the Host it was sent to is refused. */
static bool foreign_origin(const struct http_request *rq)
{
    const char *origin = http_header(rq, "Origin"), *host = http_header(rq, "Host");
    if (!origin || !strcmp(origin, "null"))
        return origin != NULL;
    const char *h = strstr(origin, "://");
    h = h ? h + 3 : origin;
    return !host || strcmp(h, host) != 0;
}

static void h_vram_post(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    if (!atomic_load(&a->fifo)) { http_error(rs, 503, "server_error", "model is loading", NULL, NULL); rs->retry_after = 1; return; }
    if (foreign_origin(rq)) {
        http_error(rs, 403, "invalid_request_error", "POST /v1/vram from a foreign Origin is refused", NULL, NULL);
        return;
    }
    vram_post(&a->rt, rq, rs);
}

/* The tokenizer is read-only once loaded: these answer on the HTTP thread (tokenize_api.h). */
static void h_tokenize(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    if (!atomic_load(&a->fifo)) { http_error(rs, 503, "server_error", "model is loading", NULL, NULL); rs->retry_after = 1; return; }
    tokenize_handle(a->rt.eng.tok, rq, rs);
}

static void h_detokenize(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    if (!atomic_load(&a->fifo)) { http_error(rs, 503, "server_error", "model is loading", NULL, NULL); rs->retry_after = 1; return; }
    detokenize_handle(a->rt.eng.tok, rq, rs);
}

static void h_chat(void *ap, const struct http_request *rq, struct http_response *rs) { generate(ap, rq, rs, true); }
static void h_completions(void *ap, const struct http_request *rq, struct http_response *rs) { generate(ap, rq, rs, false); }

static const struct http_route routes[] = {
    { "GET", "/", ui_handle },
    { "GET", "/health", h_health },
    { "GET", "/ready", h_ready },
    { "GET", "/v1/models", h_models },
    { "GET", "/metrics", h_metrics },
    { "POST", "/v1/chat/completions", h_chat },
    { "POST", "/v1/completions", h_completions },
    { "GET", "/v1/vram", h_vram_get },
    { "GET", "/v1/requests", recent_handle },
    { "POST", "/v1/vram", h_vram_post },
    { "POST", "/tokenize", h_tokenize },
    { "POST", "/detokenize", h_detokenize },
};

static void plan_from_config(const struct config *c, struct plan_options *po)
{
    memset(po, 0, sizeof *po);
    po->n_devices = c->devices_auto ? 0 : c->n_devices;
    po->kv_host_mib = c->kv_host_mib;
    po->kv_type = c->kv_type == 16 ? KV_F16 : c->kv_type == 32 ? KV_F32 : KV_AUTO;
    po->kv_block_rows = c->kv_block_size;
    po->kv_pool_tokens = c->kv_pool_tokens;
    po->max_batch_cap = c->max_batch_tokens;
    for (int i = 0; i < PLAN_MAX_DEVICES; i++) {
        po->dev[i].kind = DEVICE_KIND_CPU;
        po->dev[i].hw_index = -1;
        po->dev[i].vram_mib = -1;
        po->dev[i].reserve_mib = i < c->n_vram_reserve ? c->vram_reserve_mib[i] : 0;
    }
    for (int i = 0; i < po->n_devices; i++) {
        po->dev[i].kind = c->devices[i].backend == DEVICE_CUDA ? DEVICE_KIND_CUDA : DEVICE_KIND_CPU;
        po->dev[i].hw_index = c->devices[i].index;
        po->dev[i].vram_mib = c->devices[i].vram_mib;
    }
    po->n_layer_split = c->n_layer_split;
    for (int i = 0; i < c->n_layer_split; i++)
        po->layer_split[i] = c->layer_split[i];
    po->segment_bytes = (size_t)c->segment_mib << 20;
}

/* SIGTERM: finish what was accepted, up to drain_timeout_s, while new requests and GET /ready
 * answer 503. Returns early on a second stop signal (then the caller cancels at once). */
static void drain(struct app *a, struct fifo *f, const sigset_t *sigs)
{
    atomic_store(&a->draining, true);
    int limit = a->cfg.drain_timeout_s;
    tide_log("draining: %d request(s) to finish, up to %d s (another SIGTERM or SIGINT cancels them)",
             fifo_live(f), limit);
    double t_end = tide_now() + limit;
    while (!fifo_wait_idle(f, 0.1)) {
        struct timespec now = { 0, 0 };
        int sig = sigtimedwait(sigs, NULL, &now);
        if (sig > 0) { tide_log("signal %d while draining: cancelling", sig); return; }
        if (tide_now() >= t_end) {
            tide_log("drain: %d request(s) still running after %d s: cancelling", fifo_live(f), limit);
            return;
        }
    }
    tide_log("drained");
}

static struct app app;

/* The text model and the tower must be a pair: qwen3vlmoe's images need its own tower
 * (qwen3vl_merger: M-RoPE grids and deepstack features, as many as the text model adds),
 * qwen2vl's a qwen2vl_merger or qwen2.5vl_merger tower; those towers feed only their text
 * models. */
static int vision_pair_check(const struct model_config *c, struct vision_lifecycle *v, char *err, size_t errlen)
{
    int rc = 0;
    bool q3 = v->is_qwen3vl && v->qwenvl_kind == QWENVL_3, q2 = v->is_qwen3vl && v->qwenvl_kind != QWENVL_3;
    if (c->arch == ARCH_QWEN3VLMOE && !q3) {
        snprintf(err, errlen, "the qwen3vlmoe text model takes images from a qwen3vl_merger mmproj, not this one "
                 "(its projector is %s)", q2 ? "Qwen2-VL's" : "LLaVA's 'mlp'");
        rc = TIDE_EUNSUPPORTED;
    } else if (c->arch == ARCH_QWEN2VL && !q2) {
        snprintf(err, errlen, "the qwen2vl text model takes images from a qwen2vl_merger or qwen2.5vl_merger mmproj, "
                 "not this one (its projector is %s)", q3 ? "qwen3vl_merger" : "LLaVA's 'mlp'");
        rc = TIDE_EUNSUPPORTED;
    } else if (c->arch != ARCH_QWEN3VLMOE && q3) {
        snprintf(err, errlen, "a qwen3vl_merger mmproj feeds a qwen3vlmoe text model only (this one is %s)",
                 model_arch_name(c->arch));
        rc = TIDE_EUNSUPPORTED;
    } else if (c->arch != ARCH_QWEN2VL && q2) {
        snprintf(err, errlen, "a Qwen2-VL mmproj feeds a qwen2vl text model only (this one is %s)",
                 model_arch_name(c->arch));
        rc = TIDE_EUNSUPPORTED;
    } else if (q3 && (uint32_t)v->n_deepstack != c->n_deepstack) {
        snprintf(err, errlen, "the mmproj has %d deepstack layers, the text model adds %u", v->n_deepstack,
                 c->n_deepstack);
        rc = TIDE_EFORMAT;
    }
    if (rc)
        vision_free(v);
    return rc;
}

int main(int argc, char **argv)
{
    char err[512];
    struct app *a = &app;
    int rc = config_load(&a->cfg, argc, argv, err, sizeof err);
    if (rc) { fprintf(stderr, "%s\n", err); config_free(&a->cfg); return 2; }
    if (a->cfg.help) { fputs(config_usage(), stdout); config_free(&a->cfg); return 0; }
    if (a->cfg.version) { printf("tide %s\n", TIDE_VERSION); config_free(&a->cfg); return 0; }
    metrics_init();
    struct openai_image_limits il = {a->cfg.vision.max_images, (size_t)20 << 20, 50000000};
    openai_set_image_limits(&il);
    openai_set_json_max_elements(a->cfg.json_max_elements);
    atomic_store(&request_budget.limit, (size_t)a->cfg.request_memory_mib << 20);
    a->created = (long)time(NULL);
    const char *base = strrchr(a->cfg.model, '/');
    snprintf(a->model_id, sizeof a->model_id, "%s", base ? base + 1 : a->cfg.model);

    /* Block the stop signals in every thread; this one takes them with sigwait. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct http_server *http = NULL;
    const struct http_config *hc = &a->cfg.http;
    char instance[300];
    config_instance_name(&a->cfg, instance, sizeof instance);
    /* every copy of the name is written before the HTTP threads start: /health, /metrics and
     * /v1/vram answer while the model loads */
    metrics_set_instance(instance);
    vram_set_instance(instance);
    struct http_options ho = {
        .api_key = a->cfg.api_key, .max_connections = (unsigned)hc->max_connections,
        .max_connections_per_ip = (unsigned)hc->max_connections_per_ip, .idle_timeout_s = (unsigned)hc->idle_timeout_s,
        .allowed_hosts = (const char *const *)hc->allowed_hosts, .n_allowed_hosts = hc->n_allowed_hosts,
        .instance = instance, .queue_timeout_s = a->cfg.queue_timeout_s,
        .request_timeout_s = a->cfg.request_timeout_s};
    rc = http_start(&http, a->cfg.host, a->cfg.port, routes, (int)(sizeof routes / sizeof routes[0]), a,
                    &ho, err, sizeof err);
    if (rc) { tide_log("%s", err); config_free(&a->cfg); return 1; }
    if (http_set_cors(http, a->cfg.cors_origins, a->cfg.n_cors_origins)) {
        tide_log("out of memory");
        http_stop(http);
        config_free(&a->cfg);
        return 1;
    }

    tide_log("loading model %s (context %d, threads %d)", a->cfg.model, a->cfg.context, a->cfg.threads);
    double t0 = tide_now();
    struct engine_options eo = { .model_path = a->cfg.model, .n_ctx = a->cfg.context, .n_threads = a->cfg.threads,
                                 .n_seq = a->cfg.parallel };
    plan_from_config(&a->cfg, &eo.plan);
    struct runtime *rt = &a->rt;
    pthread_mutex_init(&rt->snap_mu, NULL);
    rt->cfg = &a->cfg;
    rc = engine_init(&rt->eng, &eo, err, sizeof err);
    if (rc) {
        tide_log("cannot start: %s", err[0] ? err : tide_strerror(rc));
        http_stop(http);
        config_free(&a->cfg);
        return 1;
    }
    rt->eng.prefix_wait_tokens = a->cfg.prefix_wait_tokens;
    struct memory_plan *mp = &rt->eng.mem;
    if (a->cfg.mmproj) {
        struct vision_options vo = {
            .mmproj = a->cfg.mmproj, .lazy = a->cfg.vision.lazy, .idle_s = (double)a->cfg.vision.idle_s,
            .device = a->cfg.vision.device, .vram_mib = a->cfg.vision.vram_mib,
            .max_image_tokens = a->cfg.vision.max_image_tokens, .n_threads = a->cfg.threads,
            .embed_cache_entries = (size_t)a->cfg.vision.embed_cache_entries,
            .embed_cache_bytes = (size_t)a->cfg.vision.embed_cache_mib << 20};
        rc = vision_init(&a->vis, &vo, mp, (int)rt->eng.model.cfg.n_embd, err, sizeof err);
        if (rc == 0)
            rc = vision_pair_check(&rt->eng.model.cfg, &a->vis, err, sizeof err);
        a->vis.notify = runtime_vision_event;
        if (rc) {
            /* Text still serves; image requests will say why vision is unavailable. */
            tide_log("vision disabled: %s", err);
            snprintf(rt->vision_error, sizeof rt->vision_error, "vision is unavailable: %s", err);
        } else {
            rt->vision = &a->vis;
            if (!vo.lazy) {
                rc = vision_ensure_ready(&a->vis, err, sizeof err);
                if (rc) tide_log("vision: eager load failed, will retry on the first image: %s", err);
            }
        }
    }
    pthread_mutex_lock(&rt->snap_mu);
    rt->snap.vision_lazy = a->cfg.vision.lazy;
    rt->snap.vision_idle_s = a->cfg.vision.idle_s;
    pthread_mutex_unlock(&rt->snap_mu);
    rc = engine_size_caches(&rt->eng);
    if (rc) {
        tide_log("cannot size the expert caches: %s", tide_strerror(rc));
        http_stop(http);
        engine_free(&rt->eng);
        config_free(&a->cfg);
        return 1;
    }
    tide_log("model %s ready in %.2f s (context %d, %d sequences at once, steps of up to %d tokens)", a->model_id,
             tide_now() - t0, rt->eng.n_ctx, rt->eng.n_slots,
             a->cfg.max_batch_tokens < forward_step_rows(&rt->eng.fw) ? a->cfg.max_batch_tokens
                                                                       : forward_step_rows(&rt->eng.fw));
    const struct model_config *mc = &rt->eng.model.cfg;
    tide_log("model: %s, %u layers, %u experts (top %u), experts %.1f MiB in host RAM", model_arch_name(mc->arch),
             mc->n_layer, mc->n_expert, mc->n_expert_used, (double)mp->host_expert_bytes / (1 << 20));
    for (int i = 0; i < mp->n_dev; i++) {
        const struct device *d = &mp->dev[i];
        const struct expert_cache *ec = &mp->cache[i];
        int keys = (int)ec->n_routed_keys;
        tide_log("device %d: %s, %.0f MiB: layers %u-%u, weights %.1f MiB, kv %.1f MiB, workspace %.1f MiB, "
                 "vision %.1f MiB, expert cache %.1f MiB = %d/%d experts (%d segments of %.2f MiB), free %.1f MiB",
                 i, d->kind == DEVICE_KIND_CUDA ? "cuda" : "cpu", (double)d->total / (1 << 20), ec->l0, ec->l1 - 1,
                 d->used[MEM_WEIGHTS] / 1048576.0, d->used[MEM_KV] / 1048576.0, d->used[MEM_WORKSPACE] / 1048576.0,
                 d->used[MEM_VISION] / 1048576.0, d->used[MEM_EXPERT_CACHE] / 1048576.0, expert_cache_slots(ec), keys,
                 ec->n_seg, ec->seg_bytes / 1048576.0, device_free_bytes(d) / 1048576.0);
    }
    runtime_publish(rt);
    openai_set_tokenizer(rt->eng.tok);
    char *chat_template = gguf_dup_str(&rt->eng.model.gguf, "tokenizer.chat_template");
    oai_tools_set_format(tool_format_detect(chat_template));   /* how the model writes tool calls */
    tide_log("tool calls: parsed in the %s format", tool_format_name(tool_format_detect(chat_template)));
    free(chat_template);
    struct fifo *f = NULL;
    rc = fifo_create(&f, a->cfg.queue_max);
    if (!rc) {
        rt->fifo = f;
        rc = scheduler_start(rt);
        if (rc) fifo_free(f);
    }
    if (rc) {
        tide_log("cannot start the engine thread: %s", tide_strerror(rc));
        http_stop(http);
        engine_free(&rt->eng);
        config_free(&a->cfg);
        return 1;
    }
    atomic_store(&a->fifo, f);
    tide_log("listening on http://%s:%d", a->cfg.host, a->cfg.port);

    int sig = 0;
    sigwait(&sigs, &sig);
    tide_log("signal %d: shutting down", sig);
    if (sig == SIGTERM) drain(a, f, &sigs);
    atomic_store(&a->stopping, true);
    http_quiesce(http);
    scheduler_stop(rt); /* cancels in-flight work, what was still queued gets 503 */
    http_stop(http);    /* wakes suspended connections, joins the polling and watch threads */
    fifo_free(f);       /* no HTTP thread can reach the queue now */
    if (rt->vision) vision_free(rt->vision);
    engine_free(&rt->eng);
    config_free(&a->cfg);
    tide_log("bye");
    return 0;
}
