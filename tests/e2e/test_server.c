/* test_server.c - end-to-end tests: start the real daemon (build/tide, or $TIDE_BIN) on a
 * free port with a temporary config, talk HTTP to it with libcurl, kill it at the end.
 * $TIDE_MODEL overrides the model path (default models/tide-moe.gguf). */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/modelgen.h"

static pid_t pid;
static int port;
static char cfg_path[64];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bind(s, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &l);
    close(s);
    return ntohs(a.sin_port);
}

struct buf { char *p; size_t n; };
static size_t sink(char *d, size_t sz, size_t nm, void *ud)
{
    struct buf *b = ud;
    b->p = realloc(b->p, b->n + sz * nm + 1);
    memcpy(b->p + b->n, d, sz * nm);
    b->n += sz * nm;
    b->p[b->n] = 0;
    return sz * nm;
}

/* One request; returns the status, *out the body (caller frees). */
static long req(const char *method, const char *path, const char *ctype, const char *body,
                const char *auth, char **out)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = { calloc(1, 1), 0 };
    struct curl_slist *h = NULL;
    if (ctype) { char x[128]; snprintf(x, sizeof x, "Content-Type: %s", ctype); h = curl_slist_append(h, x); }
    if (auth) { char x[256]; snprintf(x, sizeof x, "Authorization: Bearer %s", auth); h = curl_slist_append(h, x); }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (out) *out = b.p; else free(b.p);
    return code;
}

static long chat(const char *body, char **out)
{
    return req("POST", "/v1/chat/completions", "application/json", body, NULL, out);
}

static void start(const char *extra_cfg, const char *flag, const char *flagval)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    port = free_port();
    snprintf(cfg_path, sizeof cfg_path, "/tmp/tide-e2e-%d.json", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    fprintf(f, "{\"model\":\"%s\",\"context\":1024%s%s}", model, extra_cfg ? "," : "", extra_cfg ? extra_cfg : "");
    fclose(f);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        if (flag) execl(bin, bin, "--config", cfg_path, "--port", ps, flag, flagval, (char *)NULL);
        else execl(bin, bin, "--config", cfg_path, "--port", ps, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        if (req("GET", "/health", NULL, NULL, NULL, NULL) == 200) return;
        usleep(100000);
    }
    cr_assert_fail("daemon did not become healthy");
}

static void stop(void)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        double t0 = now();
        while (waitpid(pid, &st, WNOHANG) == 0) {
            if (now() - t0 > 10) { kill(pid, SIGKILL); waitpid(pid, &st, 0); cr_assert_fail("no exit after SIGTERM"); }
            usleep(50000);
        }
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status");
    }
    unlink(cfg_path);
    pid = 0;
}

static void start_default(void) { start(NULL, NULL, NULL); }
TestSuite(server, .init = start_default, .fini = stop, .timeout = 120);

static cJSON *parse(const char *s) { cJSON *j = cJSON_Parse(s); cr_assert(j, "not JSON: %s", s); return j; }
static const char *content_of(cJSON *j)
{
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    return cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")->valuestring;
}

#define HELLO "\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}]"

Test(server, chat_shape_and_usage)
{
    char *b;
    cr_assert_eq(chat("{\"model\":\"x\"," HELLO ",\"max_tokens\":8,\"temperature\":0}", &b), 200, "%s", b);
    cJSON *j = parse(b);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    cr_expect(strncmp(cJSON_GetObjectItem(j, "id")->valuestring, "chatcmpl-", 9) == 0);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "role")->valuestring, "assistant");
    const char *fr = cJSON_GetObjectItem(c, "finish_reason")->valuestring;
    cr_expect(!strcmp(fr, "stop") || !strcmp(fr, "length"));
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    int p = cJSON_GetObjectItem(u, "prompt_tokens")->valueint, n = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    cr_expect(p > 0 && n >= 1 && n <= 8);
    cr_expect_eq(cJSON_GetObjectItem(u, "total_tokens")->valueint, p + n);
    cJSON_Delete(j);
    free(b);
}

/* Concatenate delta contents of an SSE body; checks [DONE] is last. */
static char *sse_text(const char *body, bool *usage_seen)
{
    char *text = calloc(1, strlen(body) + 1), *copy = strdup(body), *save, *last = NULL;
    *usage_seen = false;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (strncmp(l, "data: ", 6)) continue;
        last = l;
        if (!strcmp(l + 6, "[DONE]")) continue;
        cJSON *j = parse(l + 6);
        cr_expect_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
        if (cJSON_GetObjectItem(j, "usage")) *usage_seen = true;
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *ct = c ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content") : NULL;
        if (cJSON_IsString(ct)) strcat(text, ct->valuestring);
        cJSON_Delete(j);
    }
    cr_expect(last && !strcmp(last, "data: [DONE]"), "[DONE] is not last");
    free(copy);
    return text;
}

Test(server, greedy_reproducible_and_stream_matches)
{
    char *a, *b, *s;
    chat("{" HELLO ",\"max_tokens\":8,\"temperature\":0}", &a);
    chat("{" HELLO ",\"max_tokens\":8,\"temperature\":0}", &b);
    cJSON *ja = parse(a), *jb = parse(b);
    cr_expect_str_eq(content_of(ja), content_of(jb));
    cr_assert_eq(chat("{" HELLO ",\"max_tokens\":8,\"temperature\":0,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}", &s), 200);
    bool usage;
    char *t = sse_text(s, &usage);
    cr_expect_str_eq(t, content_of(ja));
    cr_expect(usage, "no usage chunk");
    cJSON_Delete(ja); cJSON_Delete(jb);
    free(a); free(b); free(s); free(t);
}

Test(server, max_tokens_one_is_length)
{
    char *b;
    chat("{" HELLO ",\"max_tokens\":1,\"temperature\":0}", &b);
    cJSON *j = parse(b);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_expect_str_eq(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
    cr_expect_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint, 1);
    cJSON_Delete(j); free(b);
}

Test(server, stop_string_not_in_output)
{
    char *b;
    chat("{" HELLO ",\"max_tokens\":16,\"temperature\":0}", &b);
    cJSON *j = parse(b);
    const char *t = content_of(j);
    /* Use a piece of the greedy output as the stop string. */
    if (strlen(t) >= 4) {
        char stop[8] = { 0 };
        memcpy(stop, t + strlen(t) / 2, 3);
        char body[512], *b2;
        snprintf(body, sizeof body, "{" HELLO ",\"max_tokens\":16,\"temperature\":0,\"stop\":[\"%s\"]}", stop);
        for (char *p = stop; *p; p++) cr_assert(*p != '"' && *p != '\\');
        chat(body, &b2);
        cJSON *j2 = parse(b2);
        cr_expect(strstr(content_of(j2), stop) == NULL, "stop %s in %s", stop, content_of(j2));
        cJSON_Delete(j2); free(b2);
    }
    cJSON_Delete(j); free(b);
}

Test(server, seed_reproducible)
{
    char *a, *b;
    const char *body = "{" HELLO ",\"max_tokens\":8,\"temperature\":1,\"seed\":42}";
    chat(body, &a);
    chat(body, &b);
    cJSON *ja = parse(a), *jb = parse(b);
    cr_expect_str_eq(content_of(ja), content_of(jb));
    cJSON_Delete(ja); cJSON_Delete(jb); free(a); free(b);
}

/* A sampled request is drawn on the backend (backend_i.sample) unless something needs the logits
 * on the host, as logprobs do; both draw by one definition from the seed's stream, so asking for
 * logprobs (or top_p / top_k / min_p cuts) does not change the text a seed gives. */
Test(server, seed_text_same_with_logprobs)
{
    static const char *cuts[] = {"", ",\"top_p\":0.9", ",\"top_k\":20,\"min_p\":0.05"};
    for (int c = 0; c < 3; c++) {
        char plain[512], with_lp[512], *a, *b;
        snprintf(plain, sizeof plain, "{" HELLO ",\"max_tokens\":24,\"temperature\":1,\"seed\":%d%s}", 11 + c, cuts[c]);
        snprintf(with_lp, sizeof with_lp, "{" HELLO ",\"max_tokens\":24,\"temperature\":1,\"seed\":%d%s,\"logprobs\":true}",
                 11 + c, cuts[c]);
        chat(plain, &a);
        chat(with_lp, &b);
        cJSON *ja = parse(a), *jb = parse(b);
        cr_expect_str_eq(content_of(ja), content_of(jb), "cuts %d: without logprobs %s, with %s", c, content_of(ja),
                         content_of(jb));
        cJSON_Delete(ja); cJSON_Delete(jb); free(a); free(b);
    }
}

/* With TIDE_DEVICE_SAMPLE_EXTRAS on (the default) the penalties, logit_bias, logprobs and the
 * end-of-generation ban of ignore_eos / min_tokens are applied by the backend's draw
 * (backend_i.sample's edits; here the CPU backend's slot); with it 0, by the host sampler. The
 * replies, logprobs included, must be the same byte for byte. */
Test(server, penalties_bias_logprobs_same_when_the_backend_draws, .timeout = 180)
{
    static const char *bodies[] = {
        "{" HELLO ",\"max_tokens\":24,\"temperature\":1,\"seed\":5,\"presence_penalty\":1.5,"
        "\"frequency_penalty\":0.7,\"logprobs\":true,\"top_logprobs\":4}",
        "{" HELLO ",\"max_tokens\":24,\"temperature\":0.8,\"top_p\":0.9,\"seed\":6,\"repetition_penalty\":1.3,"
        "\"logit_bias\":{\"5\":-100,\"17\":3.5}}",
        "{" HELLO ",\"max_tokens\":24,\"temperature\":0,\"frequency_penalty\":2,\"logprobs\":true,\"top_logprobs\":2}",
        "{" HELLO ",\"max_tokens\":40,\"temperature\":1.5,\"seed\":7,\"ignore_eos\":true,\"presence_penalty\":0.4,"
        "\"logprobs\":true,\"top_logprobs\":3}",
        "{" HELLO ",\"max_tokens\":30,\"temperature\":1.5,\"seed\":8,\"min_tokens\":20,\"logprobs\":true}",
    };
    enum { NB = 5 };
    char *host[NB];
    stop();
    setenv("TIDE_DEVICE_SAMPLE_EXTRAS", "0", 1);
    start(NULL, NULL, NULL);
    for (int i = 0; i < NB; i++) {
        char *b;
        cr_assert_eq(chat(bodies[i], &b), 200, "%s", b);
        cJSON *j = parse(b);
        host[i] = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "choices"));
        cJSON_Delete(j);
        free(b);
    }
    stop();
    setenv("TIDE_DEVICE_SAMPLE_EXTRAS", "1", 1);
    start(NULL, NULL, NULL);
    unsetenv("TIDE_DEVICE_SAMPLE_EXTRAS");
    for (int i = 0; i < NB; i++) {
        char *b;
        cr_assert_eq(chat(bodies[i], &b), 200, "%s", b);
        cJSON *j = parse(b);
        char *dev = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "choices"));
        cr_expect_str_eq(dev, host[i], "request %d: the host sampler gave %s", i, host[i]);
        free(dev);
        free(host[i]);
        cJSON_Delete(j);
        free(b);
    }
}

Test(server, completions_shape)
{
    char *b;
    cr_assert_eq(req("POST", "/v1/completions", "application/json",
                     "{\"prompt\":\"Once upon\",\"max_tokens\":4,\"temperature\":0}", NULL, &b), 200, "%s", b);
    cJSON *j = parse(b);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cr_expect(cJSON_IsString(cJSON_GetObjectItem(c, "text")));
    cr_expect(cJSON_GetObjectItem(j, "usage") != NULL);
    cJSON_Delete(j); free(b);
}

Test(server, health_and_models)
{
    char *b;
    cr_expect_eq(req("GET", "/health", NULL, NULL, NULL, &b), 200);
    cr_expect(strstr(b, "\"ok\""));
    free(b);
    cr_expect_eq(req("GET", "/v1/models", NULL, NULL, NULL, &b), 200);
    cJSON *j = parse(b);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "list");
    cr_expect(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "id")));
    cJSON_Delete(j); free(b);
}

static void expect_error(long code, long want, const char *body, const char *param)
{
    cr_expect_eq(code, want, "status %ld, want %ld: %s", code, want, body);
    cJSON *j = cJSON_Parse(body);
    cJSON *e = j ? cJSON_GetObjectItem(j, "error") : NULL;
    cr_expect(e && cJSON_IsString(cJSON_GetObjectItem(e, "message")), "not an error object: %s", body);
    if (e && param) {
        cJSON *p = cJSON_GetObjectItem(e, "param");
        cr_expect(cJSON_IsString(p) && !strcmp(p->valuestring, param), "param: %s", body);
    }
    cJSON_Delete(j);
}

Test(server, errors)
{
    char *b;
    { long code_ = req("GET", "/nope", NULL, NULL, NULL, &b); expect_error(code_, 404, b, NULL); free(b); }
    { long code_ = req("GET", "/v1/chat/completions", NULL, NULL, NULL, &b); expect_error(code_, 405, b, NULL); free(b); }
    { long code_ = req("POST", "/v1/chat/completions", "text/plain", "{}", NULL, &b); expect_error(code_, 415, b, NULL); free(b); }
    { long code_ = chat("{" HELLO ",\"temperature\":3}", &b); expect_error(code_, 400, b, "temperature"); free(b); }
    { long code_ = chat("{\"messages\":", &b); expect_error(code_, 400, b, NULL); free(b); }
    { long code_ = chat("{\"max_tokens\":3}", &b); expect_error(code_, 400, b, "messages"); free(b); }
    { long code_ = chat("{" HELLO ",\"top_logprobs\":3}", &b); expect_error(code_, 400, b, "top_logprobs"); free(b); }
    /* 33 MiB real body */
    size_t n = 33u << 20;
    char *big = malloc(n + 1);
    memset(big, ' ', n);
    big[0] = '{'; big[n - 1] = '}'; big[n] = 0;
    long c413 = chat(big, &b);
    expect_error(c413, 413, b, NULL);
    free(b); free(big);
}

Test(server, api_key)
{
    stop();
    start(NULL, "--api-key", "sekrit");
    char *b;
    { long code_ = req("GET", "/v1/models", NULL, NULL, NULL, &b); expect_error(code_, 401, b, NULL); free(b); }
    { long code_ = req("GET", "/v1/models", NULL, NULL, "wrong", &b); expect_error(code_, 401, b, NULL); free(b); }
    cr_expect_eq(req("GET", "/v1/models", NULL, NULL, "sekrit", &b), 200); free(b);
    cr_expect_eq(req("GET", "/health", NULL, NULL, NULL, &b), 200); free(b);
}

struct par { const char *body; long code; double t_end; int idx; };
static void *par_run(void *p)
{
    struct par *x = p;
    char *b;
    x->code = chat(x->body, &b);
    x->t_end = now();
    free(b);
    return NULL;
}

Test(server, queue_full_503)
{
    stop();
    start("\"queue_max\":1,\"parallel\":1", NULL, NULL);
    /* 8 clients at once against 1 running + 1 waiting slot: some must be turned away. */
    struct par ps[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        ps[i] = (struct par){ "{" HELLO ",\"max_tokens\":500,\"temperature\":0}", 0, 0, i };
        pthread_create(&th[i], NULL, par_run, &ps[i]);
        usleep(5000);
    }
    /* While one runs and one waits, readiness says so (a balancer stops sending here). */
    char *r = NULL;
    long rc = 0;
    for (int i = 0; i < 100; i++) {
        free(r);
        r = NULL;
        rc = req("GET", "/ready", NULL, NULL, NULL, &r);
        if (rc == 503) break;
        usleep(10000);
    }
    cr_expect_eq(rc, 503, "GET /ready with the queue full: %s", r);
    cr_expect(r && strstr(r, "\"status\":\"queue_full\""), "%s", r);
    free(r);
    int n503 = 0, n200 = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        n503 += ps[i].code == 503;
        n200 += ps[i].code == 200;
    }
    cr_expect(n503 >= 1, "no 503 with queue_max 1 (200s: %d)", n200);
    cr_expect(n200 >= 1);
    cr_expect_eq(req("GET", "/ready", NULL, NULL, NULL, &r), 200, "GET /ready once idle: %s", r);
    cr_expect(strstr(r, "\"status\":\"ready\""), "%s", r);
    free(r);
}

/* Bounded waits: a request stuck behind a long one in the queue gets a 503 naming what it
 * waited for, after about queue_timeout_s, while the long one still completes. */
Test(server, queue_timeout_503, .timeout = 90)
{
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "10", 1); /* the long request ahead takes >= 9 s anywhere */
    start("\"queue_timeout_s\":1,\"request_timeout_s\":0,\"parallel\":1", NULL, NULL); /* one at a time */
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    struct par a = { "{" HELLO ",\"max_tokens\":900,\"temperature\":0}", 0, 0, 0 };
    pthread_t th;
    pthread_create(&th, NULL, par_run, &a);
    usleep(300000);
    char *b;
    double t0 = now();
    long code = chat("{" HELLO ",\"max_tokens\":1}", &b);
    double dt = now() - t0;
    pthread_join(th, NULL);
    cr_expect_eq(code, 503, "%s", b);
    cr_expect(strstr(b, "timed out after 1 s waiting in the queue") != NULL, "%s", b);
    cr_expect(dt >= 0.9 && dt < 3.0, "answered after %.2f s", dt);
    cr_expect_eq(a.code, 200, "the long request ahead was hurt");
    free(b);
}

/* A stream that runs past request_timeout_s ends with an error event and [DONE]. */
Test(server, request_timeout_stream_error_event, .timeout = 90)
{
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "10", 1); /* 600 tokens take >= 6 s on any machine */
    start("\"request_timeout_s\":1", NULL, NULL);
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    char *b;
    double t0 = now();
    long code = chat("{" HELLO ",\"max_tokens\":600,\"temperature\":0,\"stream\":true}", &b);
    double dt = now() - t0;
    cr_expect_eq(code, 200);
    const char *e = strstr(b, "data: {\"error\"");
    cr_expect(e != NULL, "no error event: %.300s", b);
    cr_expect(e && strstr(e, "timed out after 1 s waiting for the engine") != NULL, "%.300s", e ? e : b);
    size_t n = strlen(b);
    cr_expect(n >= 14 && strcmp(b + n - 14, "data: [DONE]\n\n") == 0, "stream does not end with [DONE]");
    cr_expect(dt < 4.0, "ended after %.2f s", dt);
    free(b);
}

/* The request id ends in the server's accept counter (8 hex digits), taken just before the
 * request enters the FIFO: the order the server admitted requests in. */
static void *par_run_seq(void *p)
{
    struct par *x = p;
    char *b;
    x->code = chat(x->body, &b);
    x->t_end = now();
    const char *id = strstr(b, "\"id\":\"chatcmpl-");
    x->idx = -1;
    if (id) {
        const char *q = strchr(id + 16, '"');
        if (q && q - id >= 24) x->idx = (int)strtol(q - 8, NULL, 16);
    }
    free(b);
    return NULL;
}

Test(server, fifo_order)
{
    /* Each request takes >= 300 ms (the slow-token hook), so the ~300 ms between finishes
     * dwarfs the client threads' scheduling noise on a loaded machine. The order checked is
     * the server's own admission order (from the ids), not the client threads' start order,
     * which a loaded machine can swap. */
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "25", 1);
    start("\"parallel\":1", NULL, NULL); /* one at a time: finishes in admission order */
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    struct par ps[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        ps[i] = (struct par){ "{" HELLO ",\"max_tokens\":12,\"temperature\":0}", 0, 0, i };
        pthread_create(&th[i], NULL, par_run_seq, &ps[i]);
        usleep(100000);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ps[i].code, 200);
        cr_assert(ps[i].idx >= 0, "request %d: no id counter in the reply", i);
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            if (ps[i].idx < ps[j].idx)
                cr_expect(ps[i].t_end < ps[j].t_end, "admitted %d before %d but finished after it",
                          ps[i].idx, ps[j].idx);
}

static size_t abort_after_data(char *d, size_t sz, size_t nm, void *ud)
{
    int *seen = ud;
    if (strstr(d, "\"content\"") && ++*seen >= 2) return 0;   /* abort the transfer */
    return sz * nm;
}

Test(server, disconnect_cancels)
{
    /* 900 tokens take >= 18 s at the hook's 20 ms a token, so a follow-up answered within
     * 10 s proves the dropped stream was cancelled, on a machine of any speed */
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "20", 1);
    start(NULL, NULL, NULL);
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", port);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    int seen = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{" HELLO ",\"max_tokens\":900,\"temperature\":0,\"stream\":true}");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, abort_after_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &seen);
    curl_easy_perform(c);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    double t0 = now();
    char *b;
    cr_expect_eq(chat("{" HELLO ",\"max_tokens\":2,\"temperature\":0}", &b), 200);
    free(b);
    cr_expect(now() - t0 < 10, "follow-up took %.1f s: the aborted stream kept running", now() - t0);
}

/* JSON mode: with response_format json_object every reply that stops is one JSON object (the
 * same prompt and seeds without it give text that is not), and one cut by max_tokens is the
 * start of one. */
Test(server, json_object_replies_parse_as_json)
{
    int objects = 0, plain_json = 0;
    for (int seed = 1; seed <= 6; seed++) {
        char body[512], *b;
        for (int mode = 0; mode < 2; mode++) {
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Reply in JSON: what shape is red?\"}],"
                     "\"max_tokens\":64,\"temperature\":1,\"seed\":%d%s}", seed,
                     mode ? ",\"response_format\":{\"type\":\"json_object\"}" : "");
            cr_assert_eq(chat(body, &b), 200, "%s", b);
            cJSON *o = cJSON_Parse(b);
            cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            const char *text = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring;
            const char *fin = cJSON_GetObjectItem(c0, "finish_reason")->valuestring;
            cJSON *j = cJSON_Parse(text);
            bool is_obj = j && cJSON_IsObject(j);
            if (mode) {
                if (!strcmp(fin, "stop")) {
                    cr_expect(is_obj, "seed %d: JSON mode reply %s is not a JSON object", seed, text);
                    objects += is_obj;
                } else {
                    cr_expect(text[strspn(text, " \t\r\n")] == '{', "seed %d: cut reply %s", seed, text);
                }
            } else {
                plain_json += is_obj;
            }
            cJSON_Delete(j);
            cJSON_Delete(o);
            free(b);
        }
    }
    cr_expect_gt(objects, 0, "no JSON mode reply finished within 64 tokens");
    cr_expect_eq(plain_json, 0, "the model writes JSON objects unasked: the test shows nothing");
    char *b;
    cr_expect_eq(chat("{" HELLO ",\"max_tokens\":2,\"response_format\":{\"type\":\"json_object\"}}", &b), 200);
    cJSON *o = cJSON_Parse(b);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    const char *text = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring;
    cr_expect(strchr("{ \t\r\n", text[0]) && text[0], "a two-token JSON reply starts with %s", text);
    cJSON_Delete(o);
    free(b);
}

/* Legacy /v1/completions logprobs: parallel arrays, one entry per completion token, the greedy
 * token the most likely of its alternatives, offsets counting up through the text. */
Test(server, completions_logprobs_have_the_legacy_shape)
{
    char *b;
    cr_assert_eq(req("POST", "/v1/completions", "application/json",
                     "{\"prompt\":\"The red square\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":3}", NULL, &b), 200);
    cJSON *o = cJSON_Parse(b);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
    cr_assert(cJSON_IsObject(lp), "logprobs is not an object: %s", b);
    int n = (int)cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valuedouble;
    cJSON *tokens = cJSON_GetObjectItem(lp, "tokens"), *lps = cJSON_GetObjectItem(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs"), *offs = cJSON_GetObjectItem(lp, "text_offset");
    cr_assert_eq(cJSON_GetArraySize(tokens), n);
    cr_assert_eq(cJSON_GetArraySize(lps), n);
    cr_assert_eq(cJSON_GetArraySize(tops), n);
    cr_assert_eq(cJSON_GetArraySize(offs), n);
    double prev_off = -1;
    for (int i = 0; i < n; i++) {
        double l = cJSON_GetArrayItem(lps, i)->valuedouble, off = cJSON_GetArrayItem(offs, i)->valuedouble;
        cr_assert_leq(l, 0.0);
        cr_assert_gt(off, prev_off, "text_offset not increasing at %d", i);
        prev_off = off;
        cJSON *top = cJSON_GetArrayItem(tops, i), *t;
        cr_assert(cJSON_GetArraySize(top) >= 1 && cJSON_GetArraySize(top) <= 3, "top_logprobs[%d] has %d", i,
                  cJSON_GetArraySize(top));
        cJSON_ArrayForEach(t, top) cr_assert_leq(t->valuedouble, l + 1e-6, "greedy token %d is not the most likely", i);
    }
    cJSON_Delete(o);
    free(b);
}

/* One request with a client-side timeout (the client hangs up after ms); returns the body. */
static char *post_with_timeout(const char *body, long ms)
{
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", port);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    struct buf b = { calloc(1, 1), 0 };
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_perform(c);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return b.p;
}

/* A client that hangs up on a non-streamed request (its connection is suspended, so only the
 * watch thread can see it) stops the generation: the next request is not stuck behind it. */
Test(server, disconnect_cancels_non_stream)
{
    /* >= 4.5 s of generation at 5 ms a token, against a 2 s bound for the follow-up */
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "5", 1);
    start(NULL, NULL, NULL);
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    free(post_with_timeout("{" HELLO ",\"max_tokens\":900,\"temperature\":0}", 400));
    double t0 = now();
    char *b;
    cr_expect_eq(chat("{" HELLO ",\"max_tokens\":2,\"temperature\":0}", &b), 200);
    free(b);
    cr_expect(now() - t0 < 2.0, "follow-up took %.1f s: the abandoned request kept running", now() - t0);
}

/* A stream waiting in the queue gets `: keep-alive` comments (about every 2 s). */
Test(server, queued_stream_keep_alive, .timeout = 60)
{
    stop();
    setenv("TIDE_FAULT_SLOW_TOKEN_MS", "5", 1); /* the request ahead takes >= 4.5 s anywhere */
    start("\"parallel\":1", NULL, NULL); /* one at a time, so the second one queues */
    unsetenv("TIDE_FAULT_SLOW_TOKEN_MS");
    struct par a = { "{" HELLO ",\"max_tokens\":900,\"temperature\":0}", 0, 0, 0 };
    pthread_t th;
    pthread_create(&th, NULL, par_run, &a);
    usleep(300000);
    char *b = post_with_timeout("{" HELLO ",\"max_tokens\":2,\"stream\":true}", 2800);
    pthread_join(th, NULL);
    cr_expect(strstr(b, ": keep-alive\n\n") != NULL, "no keep-alive while queued: %.200s", b);
    free(b);
}

/* ---- the model's own chat template (docs/TEMPLATES.md): a GGUF whose Jinja template renders
 * tools and tool calls, and raises for one message, so the fallback answers that one. ---- */
static char tpl_model[64];
static const char TOOL_TEMPLATE[] =
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "{{ t.function.parameters | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.name == 'fail' %}{{ raise_exception('refused') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }}"
    " {{ c.function.arguments }}{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static void start_template_model(void)
{
    snprintf(tpl_model, sizeof tpl_model, "/tmp/tide-e2e-tpl-%d.gguf", (int)getpid());
    struct modelgen_options o = {.preset = "moe", .out = tpl_model, .seed = 1, .type = -1, .chat_template = TOOL_TEMPLATE};
    char err[256];
    cr_assert_eq(modelgen_write(&o, NULL, err, sizeof err), 0, "%s", err);
    setenv("TIDE_MODEL", tpl_model, 1);
    start(NULL, NULL, NULL);
    unsetenv("TIDE_MODEL");
}
static void stop_template_model(void) { stop(); unlink(tpl_model); }
TestSuite(template, .init = start_template_model, .fini = stop_template_model, .timeout = 120);

static int prompt_tokens(const char *body)
{
    char *b;
    long code = chat(body, &b);
    cr_assert_eq(code, 200, "%ld: %s", code, b);
    cJSON *j = parse(b);
    cJSON *pt = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens");
    cr_assert(cJSON_IsNumber(pt), "no usage.prompt_tokens: %s", b);
    int n = pt->valueint;
    cJSON_Delete(j);
    free(b);
    return n;
}

#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_shape_count\"," \
              "\"parameters\":{\"type\":\"object\",\"properties\":{\"colour\":{\"type\":\"string\"}}}}}]"

Test(template, tools_and_tool_turns_reach_the_prompt)
{
    const char *user = "{\"role\":\"user\",\"content\":\"How many red?\"}";
    char plain[512], with_tools[1024], round_trip[2048];
    snprintf(plain, sizeof plain, "{\"messages\":[%s],\"max_tokens\":1}", user);
    snprintf(with_tools, sizeof with_tools, "{\"messages\":[%s]," TOOLS ",\"max_tokens\":1}", user);
    snprintf(round_trip, sizeof round_trip,
             "{\"messages\":[%s,{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_shape_count\",\"arguments\":"
             "\"{\\\"colour\\\":\\\"red\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"3\"}],"
             TOOLS ",\"max_tokens\":1}", user);
    int n_plain = prompt_tokens(plain), n_tools = prompt_tokens(with_tools), n_trip = prompt_tokens(round_trip);
    /* the tools block adds the function's name and schema; the call and its result add more */
    cr_expect_gt(n_tools, n_plain + 20, "tools did not reach the prompt: %d vs %d tokens", n_tools, n_plain);
    cr_expect_gt(n_trip, n_tools + 20, "the tool call and result did not reach the prompt: %d vs %d", n_trip, n_tools);
}

Test(template, a_failing_template_falls_back_and_still_answers)
{
    /* the template raises for a message named 'fail'; the built-in ChatML then renders the text
     * the template renders for the same message without the name: the same token count */
    int n_fail = prompt_tokens("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\",\"name\":\"fail\"}],\"max_tokens\":1}");
    int n_ok = prompt_tokens("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1}");
    cr_expect_eq(n_fail, n_ok, "fallback prompt %d tokens, template prompt %d", n_fail, n_ok);
}
