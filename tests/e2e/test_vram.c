/* test_vram.c - end-to-end: elastic expert caches on CPU devices with enforced budgets,
 * GET/POST /v1/vram, the metrics that mirror them, and the lazy vision cycle. Starts the real
 * daemon ($TIDE_BIN, default build/tide) on the default model ($TIDE_MODEL) and mmproj
 * ($TIDE_MMPROJ, default models/tide-mmproj.gguf). */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The daemon under test, started and stopped by the shared harness (harness.c): it notices a
 * daemon that exits at start-up (its port taken, a bad config) instead of polling /health until
 * some other process answers there, and the daemon dies with a test that times out. */
static struct daemon dm;
static int port;

struct buf { char *p; size_t n; int chunks; };
static size_t sink(char *d, size_t sz, size_t nm, void *ud)
{
    struct buf *b = ud;
    b->p = realloc(b->p, b->n + sz * nm + 1);
    memcpy(b->p + b->n, d, sz * nm);
    b->n += sz * nm;
    b->p[b->n] = 0;
    __atomic_add_fetch(&b->chunks, 1, __ATOMIC_SEQ_CST);
    return sz * nm;
}

static long req_h(const char *method, const char *path, const char *body, const char *hdr, char **out, struct buf *sb)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = {calloc(1, 1), 0, 0}, *bp = sb ? sb : &b;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (hdr) h = curl_slist_append(h, hdr);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, bp);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (!sb && out) *out = b.p;
    else free(b.p);
    return code;
}
static long req(const char *method, const char *path, const char *body, char **out)
{
    return req_h(method, path, body, NULL, out, NULL);
}

static const char *mmproj_path(void)
{
    return getenv("TIDE_MMPROJ") ? getenv("TIDE_MMPROJ") : "models/tide-mmproj.gguf";
}

static void start_env(const char *cfg, const char *env)
{
    dm = (struct daemon){.env = env};
    e2e_start(&dm, cfg, NULL);
    port = dm.port;
}
static void start(const char *cfg) { start_env(cfg, NULL); }

/* SIGTERM; expects exit status 0 within 10 s. */
static void stop(void) { e2e_stop(&dm); }

/* A failed assertion skips stop(): never leave a daemon behind. */
static void reap(void)
{
    if (dm.pid > 0) {
        kill(dm.pid, SIGKILL);
        waitpid(dm.pid, NULL, 0);
        unlink(dm.cfg_path);
        dm.pid = 0;
    }
}
TestSuite(vram, .fini = reap);
TestSuite(vision, .fini = reap);

static cJSON *vram(void)
{
    char *b;
    cr_assert_eq(req("GET", "/v1/vram", NULL, &b), 200);
    cJSON *o = cJSON_Parse(b);
    cr_assert_not_null(o, "GET /v1/vram: %s", b);
    free(b);
    return o;
}

/* The vision state of a fresh GET /v1/vram (copied: nothing to free). */
static const char *vstate(cJSON *o);
static const char *vision_state_now(void)
{
    static char st[32];
    cJSON *o = vram();
    snprintf(st, sizeof st, "%s", vstate(o));
    cJSON_Delete(o);
    return st;
}

static double dnum(cJSON *o, int dev, const char *k)
{
    cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "devices"), dev);
    cJSON *v = cJSON_GetObjectItem(d, k);
    cr_assert(cJSON_IsNumber(v), "devices[%d].%s missing", dev, k);
    return v->valuedouble;
}

static const char *vstate(cJSON *o) { return cJSON_GetObjectItem(cJSON_GetObjectItem(o, "vision"), "state")->valuestring; }
static double total_slots(cJSON *o) { return cJSON_GetObjectItem(cJSON_GetObjectItem(o, "totals"), "expert_slots")->valuedouble; }

static char *content(const char *body)
{
    char *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", body, &b), 200, "chat: %s", b);
    cJSON *o = cJSON_Parse(b);
    cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    char *s = strdup(cJSON_GetObjectItem(m, "content")->valuestring);
    cJSON_Delete(o);
    free(b);
    return s;
}

static const char *TEXT = "{\"messages\":[{\"role\":\"user\",\"content\":\"Count with me: one two\"}],\"max_tokens\":16,\"temperature\":0}";
#define TWO_DEV "\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":64},{\"backend\":\"cpu\",\"vram_mib\":48}],\"layer_split\":[0.5,0.5]"

Test(vram, reserve_shrinks_both_devices_restore_returns_to_full, .timeout = 60)
{
    start(TWO_DEV);
    char *t0 = content(TEXT);
    cJSON *v0 = vram();
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(v0, "devices")), 2);
    char body[128];
    long r[2];
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(dnum(v0, d, "expert_slots"), dnum(v0, d, "expert_slots_full"));
        r[d] = (long)(dnum(v0, d, "free_mib") + dnum(v0, d, "expert_cache_mib") / 2 + 1);
    }
    snprintf(body, sizeof body, "{\"reserve_mib\":[%ld,%ld]}", r[0], r[1]);
    char *b;
    cr_assert_eq(req("POST", "/v1/vram", body, &b), 200, "%s", b);
    cJSON *v1 = cJSON_Parse(b);
    free(b);
    cr_assert_str_eq(cJSON_GetObjectItem(v1, "status")->valuestring, "ok");
    for (int d = 0; d < 2; d++) {
        cr_assert_lt(dnum(v1, d, "expert_slots"), dnum(v0, d, "expert_slots"), "device %d slots did not drop", d);
        cr_assert_geq(dnum(v1, d, "free_mib"), r[d], "device %d free below its reserve", d);
        cr_assert_eq(dnum(v1, d, "reserve_mib"), r[d]);
    }
    char *t1 = content(TEXT);
    /* a bare integer is device 0; device 1 keeps its reserve */
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":0}", &b), 200);
    cJSON *v2 = cJSON_Parse(b);
    free(b);
    cr_assert_eq(dnum(v2, 0, "expert_slots"), dnum(v0, 0, "expert_slots_full"));
    cr_assert_eq(dnum(v2, 1, "expert_slots"), dnum(v1, 1, "expert_slots"));
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":null}", &b), 200);
    free(b);
    cJSON *v3 = vram();
    for (int d = 0; d < 2; d++)
        cr_assert_eq(dnum(v3, d, "expert_slots"), dnum(v0, d, "expert_slots_full"), "device %d not back to full", d);
    char *t2 = content(TEXT);
    cr_assert(t0[0], "empty output");
    cr_assert_str_eq(t0, t1, "output changed with a smaller cache");
    cr_assert_str_eq(t0, t2, "output changed after restore");
    /* more than the cache can give */
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":[64,48]}", &b), 200);
    cJSON *v4 = cJSON_Parse(b);
    free(b);
    cr_assert_str_eq(cJSON_GetObjectItem(v4, "status")->valuestring, "partial");
    cJSON *sf = cJSON_GetObjectItem(v4, "shortfall_mib");
    cr_assert_gt(cJSON_GetArrayItem(sf, 0)->valuedouble, 0);
    cr_assert_eq(dnum(v4, 0, "expert_slots"), 0);
    char *t3 = content(TEXT);
    cr_assert_str_eq(t0, t3, "output changed with no cache at all");
    free(t0); free(t1); free(t2); free(t3);
    cJSON_Delete(v0); cJSON_Delete(v1); cJSON_Delete(v2); cJSON_Delete(v3); cJSON_Delete(v4);
    stop();
}

static double metric(const char *text, const char *name)
{
    char pat[160];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(text, pat);
    cr_assert_not_null(p, "metric %s missing", name);
    return atof(p + strlen(pat));
}

Test(vram, metrics_aggregate_equals_per_device_and_vram, .timeout = 60)
{
    start(TWO_DEV);
    free(content(TEXT));
    char *b;
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":[62,0]}", &b), 200);
    free(b);
    cJSON *v = vram();
    char *m;
    cr_assert_eq(req("GET", "/metrics", NULL, &m), 200);
    double agg = metric(m, "tide_expert_slots");
    double d0 = metric(m, "tide_device_expert_slots{device=\"0\"}");
    double d1 = metric(m, "tide_device_expert_slots{device=\"1\"}");
    cr_assert_eq(agg, d0 + d1, "aggregate %g != %g + %g", agg, d0, d1);
    cr_assert_eq(agg, total_slots(v));
    cr_assert_eq(d0, dnum(v, 0, "expert_slots"));
    double bytes = metric(m, "tide_expert_cache_bytes");
    cr_assert_eq(bytes, metric(m, "tide_device_expert_cache_bytes{device=\"0\"}") +
                            metric(m, "tide_device_expert_cache_bytes{device=\"1\"}"));
    free(m);
    cJSON_Delete(v);
    stop();
}

struct stream_arg { struct buf b; long code; };
static void *stream_thread(void *p)
{
    struct stream_arg *a = p;
    a->code = req_h("POST", "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell a long story\"}],\"max_tokens\":600,"
                    "\"temperature\":0,\"stream\":true}", NULL, NULL, &a->b);
    return NULL;
}

/* The concatenated delta contents of an SSE body. */
static char *sse_text(const char *s)
{
    size_t cap = strlen(s) + 1, n = 0;
    char *out = calloc(1, cap);
    for (const char *p = strstr(s, "data: "); p; p = strstr(p + 1, "data: ")) {
        cJSON *o = cJSON_Parse(p + 6);
        if (!o) continue;
        cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
        cJSON *c = cJSON_GetObjectItem(d, "content");
        if (cJSON_IsString(c)) {
            size_t l = strlen(c->valuestring);
            memcpy(out + n, c->valuestring, l);
            n += l;
        }
        cJSON_Delete(o);
    }
    return out;
}

Test(vram, reserve_during_a_stream_keeps_its_tokens, .timeout = 120)
{
    start("\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":64}]");
    struct stream_arg a1 = {{calloc(1, 1), 0, 0}, 0}, a2 = {{calloc(1, 1), 0, 0}, 0};
    pthread_t t;
    pthread_create(&t, NULL, stream_thread, &a1); /* undisturbed */
    pthread_join(t, NULL);
    cJSON *v0 = vram();
    char body[64];
    snprintf(body, sizeof body, "{\"reserve_mib\":%ld}", (long)(dnum(v0, 0, "free_mib") + 3));
    pthread_create(&t, NULL, stream_thread, &a2);
    while (__atomic_load_n(&a2.b.chunks, __ATOMIC_SEQ_CST) < 3) usleep(1000);
    char *b;
    cr_assert_eq(req("POST", "/v1/vram", body, &b), 200, "%s", b);
    cJSON *v1 = cJSON_Parse(b);
    free(b);
    int mid = __atomic_load_n(&a2.b.chunks, __ATOMIC_SEQ_CST);
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":null}", NULL), 200);
    pthread_join(t, NULL);
    cr_assert_eq(a1.code, 200);
    cr_assert_eq(a2.code, 200);
    cr_assert_lt(dnum(v1, 0, "expert_slots"), dnum(v0, 0, "expert_slots"));
    char *s1 = sse_text(a1.b.p), *s2 = sse_text(a2.b.p);
    cr_assert_gt(strlen(s1), 0);
    cr_assert_str_eq(s1, s2, "the stream changed when the cache shrank under it");
    cr_assert(strstr(a2.b.p, "data: [DONE]"));
    cr_log_info("reserve landed after %d of %d chunks", mid, a2.b.chunks);
    cr_assert_lt(mid, a2.b.chunks, "the reserve was applied only after the stream ended");
    free(s1); free(s2); free(a1.b.p); free(a2.b.p);
    cJSON_Delete(v0); cJSON_Delete(v1);
    stop();
}

Test(vram, bad_reserves_are_400_and_change_nothing, .timeout = 60)
{
    start(TWO_DEV);
    cJSON *v0 = vram();
    const char *bad[] = {"{\"reserve_mib\":[-5]}", "{\"reserve_mib\":[1.5]}", "{\"reserve_mib\":true}",
                         "{\"reserve_mib\":[true]}", "{\"reserve_mib\":[1,2,3]}", "{\"reserve_mib\":\"8\"}",
                         "{\"reserve_mib\":{}}", "{}", "[]", "not json", "{\"reserve\":[1]}", "{\"reserve_mib\":-1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *b;
        cr_assert_eq(req("POST", "/v1/vram", bad[i], &b), 400, "%s answered: %s", bad[i], b);
        cJSON *e = cJSON_Parse(b);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")), "%s", b);
        cJSON_Delete(e);
        free(b);
    }
    cr_assert_eq(req_h("POST", "/v1/vram", "{\"reserve_mib\":[1]}", "Origin: http://evil.example", NULL, NULL), 403);
    cJSON *v1 = vram();
    cr_assert_eq(total_slots(v1), total_slots(v0));
    cr_assert_eq(req("GET", "/health", NULL, NULL), 200);
    cJSON_Delete(v0);
    cJSON_Delete(v1);
    stop();
    start(TWO_DEV ",\"vram_elastic\":false");
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":[1]}", NULL), 409);
    stop();
}

/* ---- lazy vision ---- */

/* A w x h 24-bit BMP of one colour as a chat request body with a data URL. */
static char *image_body_of(int w, int h, unsigned char red)
{
    size_t row = ((size_t)w * 3 + 3) & ~(size_t)3, n = 54 + row * h;
    unsigned char *bmp = calloc(1, n);
    bmp[0] = 'B'; bmp[1] = 'M';
    uint32_t v32 = (uint32_t)n;
    memcpy(bmp + 2, &v32, 4);
    bmp[10] = 54; bmp[14] = 40;
    memcpy(bmp + 18, &w, 4);
    memcpy(bmp + 22, &h, 4);
    bmp[26] = 1; bmp[28] = 24;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            unsigned char *p = bmp + 54 + y * row + 3 * x;
            p[0] = (unsigned char)(x * 255 / w); p[1] = 30; p[2] = red;
        }
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *b64 = malloc(n / 3 * 4 + 8);
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = bmp[i] << 16 | (i + 1 < n ? bmp[i + 1] << 8 : 0) | (i + 2 < n ? bmp[i + 2] : 0);
        b64[k++] = t[v >> 18 & 63];
        b64[k++] = t[v >> 12 & 63];
        b64[k++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        b64[k++] = i + 2 < n ? t[v & 63] : '=';
    }
    b64[k] = 0;
    size_t cap = k + 512;
    char *body = malloc(cap);
    snprintf(body, cap,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is this?\"},"
             "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/bmp;base64,%s\"}}]}],\"max_tokens\":8,"
             "\"temperature\":0}", b64);
    free(b64);
    free(bmp);
    return body;
}
static char *image_body(void) { return image_body_of(8, 8, 220); }

static double prompt_tokens(const char *reply)
{
    cJSON *o = cJSON_Parse(reply);
    cr_assert_not_null(o, "%s", reply);
    double v = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valuedouble;
    cJSON_Delete(o);
    return v;
}

static char vis_cfg[512];
static const char *vision_cfg(long mib, bool lazy, int idle)
{
    snprintf(vis_cfg, sizeof vis_cfg,
             "\"mmproj\":\"%s\",\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":%ld}],\"vision\":{\"lazy\":%s,\"idle_s\":%d}",
             mmproj_path(), mib, lazy ? "true" : "false", idle);
    return vis_cfg;
}

Test(vision, lazy_cycle_hands_back_and_regrows_exactly, .timeout = 120)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    char *img = image_body();
    /* probe: how big are the model's parts on a roomy device */
    start(vision_cfg(512, true, 60));
    cJSON *p0 = vram();
    char *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    free(b);
    cJSON *p1 = vram();
    double vis = dnum(p1, 0, "vision_mib"), cache_all = dnum(p0, 0, "expert_cache_mib");
    double fixed = dnum(p0, 0, "total_mib") - dnum(p0, 0, "free_mib") - cache_all;
    cr_assert_gt(vis, 0, "vision_mib not reported while loaded");
    stop();
    long budget = (long)(fixed + vis + cache_all / 2 + 1);
    start(vision_cfg(budget, false, 1));
    cJSON *e0 = vram();
    cr_assert_str_eq(vstate(e0), "ready");
    double eager = total_slots(e0);
    stop();
    start(vision_cfg(budget, true, 3));
    cJSON *l0 = vram();
    cr_assert_str_eq(vstate(l0), "unloaded");
    double lazy = total_slots(l0);
    cr_assert_gt(lazy, eager, "lazy boot %g slots vs eager %g", lazy, eager);
    char *t0 = content(TEXT);
    req("GET", "/health", NULL, NULL);
    req("GET", "/metrics", NULL, NULL);
    cJSON *l1 = vram();
    cr_assert_str_eq(vstate(l1), "unloaded", "text/health/metrics woke the encoder");
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    cJSON *ir = cJSON_Parse(b);
    free(b);
    double pt = cJSON_GetObjectItem(cJSON_GetObjectItem(ir, "usage"), "prompt_tokens")->valuedouble;
    cJSON *l2 = vram();
    cr_assert_str_eq(vstate(l2), "ready");
    cr_assert_lt(total_slots(l2), lazy, "no hand-back");
    char *t1 = content(TEXT);
    cr_assert_str_eq(t0, t1, "text changed while the encoder is loaded");
    for (int i = 0; i < 150 && strcmp(vision_state_now(), "unloaded"); i++) usleep(100000);
    cJSON *l3 = vram();
    cr_assert_str_eq(vstate(l3), "unloaded", "encoder still loaded after idle_s");
    cr_assert_eq(total_slots(l3), lazy, "caches not regrown to the lazy-boot count");
    cr_assert_eq(dnum(l3, 0, "vision_mib"), 0);
    char *t2 = content(TEXT);
    cr_assert_str_eq(t0, t2, "text changed after the unload");
    /* the same image again is cached: answered without waking the encoder, same tokens */
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200);
    cJSON *ir2 = cJSON_Parse(b);
    free(b);
    cr_assert_str_eq(vision_state_now(), "unloaded", "a cached image woke the encoder");
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(ir2, "usage"), "prompt_tokens")->valuedouble, pt);
    stop();
    free(t0); free(t1); free(t2); free(img);
    cJSON *all[] = {p0, p1, e0, l0, l1, l2, l3, ir, ir2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cJSON_Delete(all[i]);
}

/* The reserve an operator set is theirs: loading and unloading the encoder (the one model this
 * daemon loads and drops at run time) never hands it out or forgets it. */
Test(vision, a_user_reserve_survives_the_encoder_load_and_unload, .timeout = 120)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    char *img = image_body_of(8, 8, 40), *b;
    start(vision_cfg(512, true, 60));
    cJSON *p0 = vram();
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    free(b);
    cJSON *p1 = vram();
    double vis = dnum(p1, 0, "vision_mib"), cache_all = dnum(p0, 0, "expert_cache_mib");
    double fixed = dnum(p0, 0, "total_mib") - dnum(p0, 0, "free_mib") - cache_all;
    stop();
    start(vision_cfg((long)(fixed + vis + cache_all / 2 + 1), true, 2));
    cJSON *l0 = vram();
    double full = total_slots(l0);
    char body[96];
    long reserve = (long)(dnum(l0, 0, "free_mib") + dnum(l0, 0, "expert_cache_mib") / 4 + 1);
    snprintf(body, sizeof body, "{\"reserve_mib\":[%ld]}", reserve);
    cr_assert_eq(req("POST", "/v1/vram", body, &b), 200, "%s", b);
    free(b);
    cJSON *r0 = vram();
    double reserved = total_slots(r0);
    cr_assert_lt(reserved, full, "the reserve did not shrink the cache");
    cr_assert_geq(dnum(r0, 0, "free_mib"), reserve);
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    free(b);
    cJSON *r1 = vram();
    cr_assert_str_eq(vstate(r1), "ready");
    cr_assert_lt(total_slots(r1), reserved, "the encoder was given the operator's reserve");
    for (int i = 0; i < 150 && strcmp(vision_state_now(), "unloaded"); i++) usleep(100000);
    cJSON *r2 = vram();
    cr_assert_str_eq(vstate(r2), "unloaded");
    cr_assert_eq(total_slots(r2), reserved, "after the unload the cache grew into the reserve");
    cr_assert_geq(dnum(r2, 0, "free_mib"), reserve);
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":null}", &b), 200, "%s", b);
    free(b);
    cJSON *r3 = vram();
    cr_assert_eq(total_slots(r3), full, "restore did not return to the start-up slots");
    stop();
    free(img);
    cJSON *all[] = {p0, p1, l0, r0, r1, r2, r3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cJSON_Delete(all[i]);
}

Test(vision, injected_load_failure_restores_the_caches, .timeout = 60)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    char *img = image_body();
    start_env(vision_cfg(64, true, 60), "TIDE_FAULT_VISION=load");
    cJSON *v0 = vram();
    char *t0 = content(TEXT), *b;
    long code = req("POST", "/v1/chat/completions", img, &b);
    cr_assert_eq(code, 500, "%s", b);
    cr_assert(strstr(b, "vision encoder"), "%s", b);
    free(b);
    cJSON *v1 = vram();
    cr_assert_str_eq(vstate(v1), "unloaded");
    cr_assert_eq(total_slots(v1), total_slots(v0), "caches not restored after the failure");
    char *t1 = content(TEXT);
    cr_assert_str_eq(t0, t1);
    free(t0); free(t1); free(img);
    cJSON_Delete(v0); cJSON_Delete(v1);
    stop();
}

Test(vision, images_without_an_mmproj_are_a_clear_400, .timeout = 30)
{
    start("\"mmproj\":null");
    char *img = image_body(), *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 400, "%s", b);
    cr_assert(strstr(b, "mmproj"), "%s", b);
    free(b);
    free(img);
    stop();
}

Test(vision, big_image_is_scaled_to_the_budget_not_refused, .timeout = 60)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    start(vision_cfg(64, true, 60));
    char *small = image_body_of(8, 8, 10), *big = image_body_of(640, 640, 20), *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", small, &b), 200, "%s", b);
    double ps = prompt_tokens(b);
    free(b);
    /* 640x640 is 100 times the encoder's 64x64 input: fitted, same token count */
    cr_assert_eq(req("POST", "/v1/chat/completions", big, &b), 200, "%s", b);
    cr_assert_eq(prompt_tokens(b), ps, "a big image took a different number of tokens");
    free(b);
    free(small);
    free(big);
    stop();
}

/* A chat request on its own connection; t_reply: when its reply reached this host, stamped by
 * the kernel (harness.h e2e_raw_stamped). */
struct req_arg { const char *body; long code; double t_reply; int done; };
static void *req_thread(void *p)
{
    struct req_arg *a = p;
    size_t n = strlen(a->body), cap = n + 256;
    char *rq = malloc(cap);
    int len = snprintf(rq, cap, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       n, a->body);
    char *resp = e2e_raw_stamped(&dm, rq, (size_t)len, 60, &a->t_reply);
    a->code = e2e_status(resp);
    free(resp);
    free(rq);
    __atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static double busy(void)
{
    char *m;
    req("GET", "/metrics", NULL, &m);
    double v = metric(m, "tide_requests_running") + metric(m, "tide_requests_waiting");
    free(m);
    return v;
}

Test(vision, text_queued_behind_an_image_is_answered_after_it, .timeout = 60)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    /* The order is the one in which the daemon sent the replies: the kernel's receive stamp of
     * each reply's first byte (a non-streamed reply goes out whole when its request ends). The
     * client threads' own clocks, read after each reply, swapped the two when this process ran
     * late on a loaded machine and woke both readers at once (1 run in 20 with the test's
     * processes paused at random for up to 0.5 s). Every token takes >= 10 ms, so the text
     * (16 tokens, admitted after the image) ends >= 80 ms after the image's 8 tokens. */
    start_env(vision_cfg(64, true, 60), "TIDE_FAULT_SLOW_TOKEN_MS=10");
    char *img = image_body_of(32, 32, 99);
    struct req_arg ai = {img, 0, 0, 0}, at = {TEXT, 0, 0, 0};
    pthread_t ti, tt;
    pthread_create(&ti, NULL, req_thread, &ai);
    /* the image is queued or running before the text is sent */
    while (busy() < 1 && !__atomic_load_n(&ai.done, __ATOMIC_SEQ_CST)) usleep(500);
    pthread_create(&tt, NULL, req_thread, &at);
    pthread_join(ti, NULL);
    pthread_join(tt, NULL);
    cr_assert_eq(ai.code, 200);
    cr_assert_eq(at.code, 200);
    cr_assert(ai.t_reply > 0 && at.t_reply > 0, "no receive stamps");
    cr_log_info("text reply %.0f ms after the image's", (at.t_reply - ai.t_reply) * 1e3);
    cr_assert_leq(ai.t_reply, at.t_reply, "the text request behind the image was answered first");
    free(img);
    stop();
}

Test(vision, images_around_the_idle_unload_all_succeed, .timeout = 90)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    start(vision_cfg(64, true, 1));
    cJSON *v0 = vram();
    double full = total_slots(v0);
    for (int i = 0; i < 6; i++) {
        usleep(900000 + 50000 * i); /* land before, at and after the 1 s unload */
        char *img = image_body_of(16, 16, (unsigned char)(40 * i + 1)), *b;
        cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "image %d: %s", i, b);
        free(b);
        free(img);
    }
    for (int i = 0; i < 50 && strcmp(vision_state_now(), "unloaded"); i++) usleep(100000);
    cJSON *v1 = vram();
    cr_assert_str_eq(vstate(v1), "unloaded");
    cr_assert_eq(total_slots(v1), full);
    cJSON_Delete(v0);
    cJSON_Delete(v1);
    stop();
}

Test(vision, injected_vision_allocation_failure_restores_the_caches, .timeout = 60)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    char *img = image_body_of(8, 8, 77), *b;
    start_env(vision_cfg(64, true, 60), "TIDE_FAULT_ALLOC=0:vision:1");
    cJSON *v0 = vram();
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 500, "%s", b);
    cr_assert(strstr(b, "vision encoder"), "%s", b);
    free(b);
    cJSON *v1 = vram();
    cr_assert_str_eq(vstate(v1), "unloaded");
    cr_assert_eq(total_slots(v1), total_slots(v0));
    cr_assert_eq(dnum(v1, 0, "vision_mib"), 0, "a partly loaded encoder was left behind");
    /* the hook fired once: the next image loads */
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    free(b);
    free(content(TEXT)); /* text still serves */
    cJSON_Delete(v0);
    cJSON_Delete(v1);
    free(img);
    stop();
}

Test(vision, corrupt_mmproj_keeps_text_serving_and_says_why, .timeout = 30)
{
    /* this process's own file: two runs of the suite at once (helpers, CI) never rewrite or
     * remove each other's */
    char bad[64];
    snprintf(bad, sizeof bad, "/tmp/tide-e2e-bad-mmproj-%d.gguf", (int)getpid());
    FILE *f = fopen(bad, "w");
    fputs("GGUF this is not a model", f);
    fclose(f);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "\"mmproj\":\"%s\"", bad);
    start(cfg);
    unlink(bad); /* read (and refused) at start-up */
    char *t = content(TEXT), *img = image_body(), *b;
    cr_assert(t[0]);
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 400, "%s", b);
    cr_assert(strstr(b, "mmproj"), "%s", b);
    free(b); free(img); free(t);
    stop();
}
