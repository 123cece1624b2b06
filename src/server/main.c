/* main.c - tide daemon entry: flags + config, HTTP up, model load, engine FIFO, signals.
 *
 * HTTP starts before the model loads so /health can answer 503 "loading"; inference
 * routes answer 503 until the engine is ready. SIGINT/SIGTERM are taken with sigwait()
 * in this thread so no work happens in a signal handler. */
#include "common.h"
#include "engine/session.h"
#include "server/config.h"
#include "server/fifo.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct app {
    struct config cfg;
    struct engine eng;
    struct fifo *_Atomic fifo;  /* NULL while loading */
    atomic_bool stopping;
    char model_id[256];
    long created;
};

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

static void h_health(void *ap, const struct http_request *rq, struct http_response *rs)
{
    struct app *a = ap;
    if (!atomic_load(&a->fifo)) {
        rs->status = 503;
        rs->body = dup_str("{\"status\":\"loading\"}");
    } else {
        rs->body = dup_str("{\"status\":\"ok\"}");
    }
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

static void generate(struct app *a, const struct http_request *rq, struct http_response *rs, bool chat)
{
    struct fifo *f = atomic_load(&a->fifo);
    if (!f || atomic_load(&a->stopping)) {
        http_error(rs, 503, "server_error", f ? "server is shutting down" : "model is loading", NULL, NULL);
        rs->retry_after = 1;
        return;
    }
    char msg[256];
    const char *param = NULL;
    struct oai_req *req;
    int rc = openai_parse(rq->body, rq->body_len, chat, a->model_id, &req, msg, sizeof msg, &param);
    if (rc) {
        http_error(rs, rc == TIDE_ENOMEM ? 500 : 400, rc == TIDE_ENOMEM ? "server_error" : "invalid_request_error",
                   msg, param, NULL);
        return;
    }
    bool stream = openai_req_stream(req);
    struct job *j = job_new(openai_run, req, openai_req_free);
    if (!j) { openai_req_free(req); http_error(rs, 500, "server_error", "out of memory", NULL, NULL); return; }
    rc = fifo_push(f, j);
    if (rc) {
        job_unref(j);
        http_error(rs, 503, "server_error", rc == TIDE_EFULL ? "queue is full, retry later" : "server is shutting down",
                   NULL, NULL);
        rs->retry_after = 1;
        return;
    }
    if (stream) { rs->stream = j; return; }
    /* Non-stream: wait here (this is a connection thread), watching for the client leaving. */
    while (!job_wait_done(j, 0.2)) {
        if (http_client_gone(rq)) job_cancel(j);
    }
    if (j->status == 499 || j->status == 503) {
        http_error(rs, 503, "server_error", atomic_load(&a->stopping) ? "server is shutting down" : "request canceled",
                   NULL, NULL);
    } else {
        rs->status = j->status;
        rs->body = dup_str(j->buf ? j->buf : "");
    }
    job_unref(j);
}

static void h_chat(void *ap, const struct http_request *rq, struct http_response *rs) { generate(ap, rq, rs, true); }
static void h_completions(void *ap, const struct http_request *rq, struct http_response *rs) { generate(ap, rq, rs, false); }

static const struct http_route routes[] = {
    { "GET", "/health", h_health },
    { "GET", "/v1/models", h_models },
    { "GET", "/metrics", h_metrics },
    { "POST", "/v1/chat/completions", h_chat },
    { "POST", "/v1/completions", h_completions },
};

static struct app app;

int main(int argc, char **argv)
{
    char err[512];
    struct app *a = &app;
    int rc = config_load(&a->cfg, argc, argv, err, sizeof err);
    if (rc) { fprintf(stderr, "%s\n", err); config_free(&a->cfg); return 2; }
    if (a->cfg.help) { fputs(config_usage(), stdout); config_free(&a->cfg); return 0; }
    if (a->cfg.version) { printf("tide %s\n", TIDE_VERSION); config_free(&a->cfg); return 0; }
    metrics_init();
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
    rc = http_start(&http, a->cfg.host, a->cfg.port, routes, (int)(sizeof routes / sizeof routes[0]), a,
                    a->cfg.api_key, err, sizeof err);
    if (rc) { tide_log("%s", err); config_free(&a->cfg); return 1; }

    tide_log("loading model %s (context %d, threads %d)", a->cfg.model, a->cfg.context, a->cfg.threads);
    double t0 = tide_now();
    struct engine_options eo = { a->cfg.model, a->cfg.context, a->cfg.threads };
    rc = engine_init(&a->eng, &eo, err, sizeof err);
    if (rc) {
        tide_log("cannot load model: %s", err[0] ? err : tide_strerror(rc));
        http_stop(http);
        config_free(&a->cfg);
        return 1;
    }
    tide_log("model %s ready in %.2f s (context %d)", a->model_id, tide_now() - t0, a->eng.n_ctx);
    {
        /* The memory plan. Until per-device budgets exist (src/memory) there is one CPU
         * device: weights stay in the mmapped file, the KV cache is allocated once. */
        const struct model_config *mc = &a->eng.model.cfg;
        tide_log("device 0: cpu, %s %u layers, %u experts (top %u), weights %.1f MiB mmapped, kv %.1f MiB",
                 model_arch_name(mc->arch), mc->n_layer, mc->n_expert, mc->n_expert_used,
                 (double)a->eng.model.gguf.size / (1 << 20),
                 (double)forward_kv_bytes(&a->eng.model, a->eng.n_ctx) / (1 << 20));
    }
    struct fifo *f = NULL;
    rc = fifo_create(&f, a->cfg.queue_max, &a->eng);
    if (rc) {
        tide_log("cannot start the engine thread: %s", tide_strerror(rc));
        http_stop(http);
        engine_free(&a->eng);
        config_free(&a->cfg);
        return 1;
    }
    atomic_store(&a->fifo, f);
    tide_log("listening on http://%s:%d", a->cfg.host, a->cfg.port);

    int sig = 0;
    sigwait(&sigs, &sig);
    tide_log("signal %d: shutting down", sig);
    atomic_store(&a->stopping, true);
    http_quiesce(http);
    fifo_stop(f);       /* cancels in-flight work; waiting handlers wake up */
    http_stop(http);    /* joins the connection threads */
    fifo_free(f);
    engine_free(&a->eng);
    config_free(&a->cfg);
    tide_log("bye");
    return 0;
}
