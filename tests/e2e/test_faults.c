/* test_faults.c - end-to-end: injected faults (issue 7). Each starts the real daemon ($TIDE_BIN,
 * default build/tide) with one test hook armed through the environment and checks what a user
 * sees: the request gets an OpenAI error object, the expert caches come back to full
 * (GET /v1/vram), and the next request is served. The hooks (docs/SECURITY.md, "Injected
 * faults"): TIDE_FAULT_ALLOC (an allocation of one kind fails), TIDE_FAULT_ENGINE_STEP (a
 * forward step fails), TIDE_FAULT_SLOW_TOKEN_MS (tokens take at least that long), and
 * SIGTERM during streams (it drains; a second SIGTERM or drain_timeout_s cancels). On the default model every expert-cache segment holds one expert,
 * so the start-up sizing makes expert_slots_full expert_cache allocations and the n-th one
 * after those is the n-th of the first regrow. */
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

static pid_t pid;
static int port;
static char cfg_path[64], log_path[64];

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(s, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &l);
    close(s);
    return ntohs(a.sin_port);
}

struct buf { char *p; size_t n; int chunks; };
static size_t sink(char *d, size_t sz, size_t nm, void *ud)
{
    struct buf *b = ud;
    char *np = realloc(b->p, b->n + sz * nm + 1);
    if (!np) return 0;
    b->p = np;
    memcpy(b->p + b->n, d, sz * nm);
    b->n += sz * nm;
    b->p[b->n] = 0;
    __atomic_add_fetch(&b->chunks, 1, __ATOMIC_SEQ_CST);
    return sz * nm;
}

/* One request; the body goes to *out (malloc'd) or into sb when given. */
static long req_into(const char *method, const char *path, const char *body, char **out, struct buf *sb)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = {calloc(1, 1), 0, 0}, *bp = sb ? sb : &b;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
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
    return req_into(method, path, body, out, NULL);
}

static const char *mmproj_path(void)
{
    return getenv("TIDE_MMPROJ") ? getenv("TIDE_MMPROJ") : "models/tide-mmproj.gguf";
}

/* Start the daemon with cfg (JSON members) and env ("NAME=value" or NULL); its stderr goes to
 * log_path. Returns once /health answers 200, or the exit status when it exits first. */
static int launch(const char *cfg, const char *env)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    port = free_port();
    snprintf(cfg_path, sizeof cfg_path, "/tmp/tide-e2e-faults-%d.json", (int)getpid());
    snprintf(log_path, sizeof log_path, "/tmp/tide-e2e-faults-%d.log", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    fprintf(f, "{\"model\":\"%s\",\"context\":1024,\"port\":%d,\"mmproj\":null%s%s}", model, port, cfg[0] ? "," : "",
            cfg);
    fclose(f);
    pid = fork();
    if (pid == 0) {
        if (env) putenv((char *)env);
        freopen(log_path, "w", stderr);
        freopen("/dev/null", "w", stdout);
        execl(bin, bin, "--config", cfg_path, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            pid = 0;
            return st;
        }
        if (req("GET", "/health", NULL, NULL) == 200) return -1;
        usleep(50000);
    }
    cr_assert_fail("daemon did not become healthy (config %s)", cfg);
    return 0;
}
static void start(const char *cfg, const char *env) { cr_assert_eq(launch(cfg, env), -1, "daemon exited at start-up"); }

static char *log_text(void)
{
    FILE *f = fopen(log_path, "r");
    static char t[16384];
    size_t n = f ? fread(t, 1, sizeof t - 1, f) : 0;
    t[n] = 0;
    if (f) fclose(f);
    return t;
}

/* SIGTERM, wait, and return how long the exit took; the exit status must be 0. */
static double stop(void)
{
    double t0 = mono(), dt = 0;
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        waitpid(pid, &st, 0);
        dt = mono() - t0;
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status %d", st);
    }
    unlink(cfg_path);
    unlink(log_path);
    pid = 0;
    return dt;
}

static void reap(void)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        pid = 0;
    }
    unlink(cfg_path);
    unlink(log_path);
}
TestSuite(faults, .fini = reap);

static cJSON *vram(void)
{
    char *b;
    cr_assert_eq(req("GET", "/v1/vram", NULL, &b), 200);
    cJSON *o = cJSON_Parse(b);
    cr_assert_not_null(o, "GET /v1/vram: %s", b);
    free(b);
    return o;
}
static double slots(cJSON *o, const char *k) { return cJSON_GetObjectItem(cJSON_GetObjectItem(o, "totals"), k)->valuedouble; }
static double slots_now(void)
{
    cJSON *o = vram();
    double s = slots(o, "expert_slots");
    cJSON_Delete(o);
    return s;
}
static const char *vision_state_now(void)
{
    static char st[32];
    cJSON *o = vram();
    snprintf(st, sizeof st, "%s", cJSON_GetObjectItem(cJSON_GetObjectItem(o, "vision"), "state")->valuestring);
    cJSON_Delete(o);
    return st;
}
/* Poll until the caches are at full (at most s seconds); returns the last slot count. */
static double wait_full(double full, double s)
{
    double got = slots_now();
    for (double t0 = mono(); got != full && mono() - t0 < s; got = slots_now()) usleep(50000);
    return got;
}

/* An OpenAI error object with this code (NULL: any) whose message contains what. */
static void expect_error(const char *body, const char *code, const char *what)
{
    cJSON *o = cJSON_Parse(body);
    cr_assert_not_null(o, "not JSON: %s", body);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    cr_assert(cJSON_IsObject(e), "no error object: %s", body);
    cJSON *m = cJSON_GetObjectItem(e, "message"), *t = cJSON_GetObjectItem(e, "type");
    cr_assert(cJSON_IsString(m) && strstr(m->valuestring, what), "message: %s", body);
    cr_assert(cJSON_IsString(t) && !strcmp(t->valuestring, "server_error"), "type: %s", body);
    if (code) {
        cJSON *c = cJSON_GetObjectItem(e, "code");
        cr_assert(cJSON_IsString(c) && !strcmp(c->valuestring, code), "code: %s", body);
    }
    cJSON_Delete(o);
}

static const char *TEXT = "{\"messages\":[{\"role\":\"user\",\"content\":\"Count with me: one two\"}],\"max_tokens\":16,\"temperature\":0}";
#define HELLO "\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}]"

static char *content(void)
{
    char *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", TEXT, &b), 200, "chat: %s", b);
    cJSON *o = cJSON_Parse(b);
    cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    char *s = strdup(cJSON_GetObjectItem(m, "content")->valuestring);
    cJSON_Delete(o);
    free(b);
    return s;
}

static char *image_body(unsigned char red)
{
    int w = 8, h = 8;
    size_t row = ((size_t)w * 3 + 3) & ~(size_t)3, n = 54 + row * h;
    unsigned char *bmp = calloc(1, n);
    bmp[0] = 'B'; bmp[1] = 'M';
    uint32_t v32 = (uint32_t)n;
    memcpy(bmp + 2, &v32, 4);
    bmp[10] = 54; bmp[14] = 40;
    memcpy(bmp + 18, &w, 4);
    memcpy(bmp + 22, &h, 4);
    bmp[26] = 1; bmp[28] = 24;
    for (int i = 54; i < (int)n; i++) bmp[i] = (unsigned char)(i * 7 + red);
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
             "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/bmp;base64,%s\"}}]}],\"max_tokens\":4}",
             b64);
    free(b64);
    free(bmp);
    return body;
}

#define DEV64 "\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":64}]"

/* Restore (reserve_mib null) meets a failing segment allocation half way: a 500 that says so,
 * then the engine timer grows the rest, and text is token-identical. */
Test(faults, regrow_allocation_failure_on_restore, .timeout = 60)
{
    /* the probe: how many segments the start-up sizing allocates */
    start(DEV64, NULL);
    double full = slots_now();
    stop();
    cr_assert_geq(full, 16, "the default model should have at least 16 experts");
    static char env[64];
    snprintf(env, sizeof env, "TIDE_FAULT_ALLOC=0:expert_cache:%d", (int)full + 8);
    start(DEV64, env);
    char *t0 = content(), *b;
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":[64]}", &b), 200, "%s", b);
    free(b);
    cr_assert_eq(slots_now(), 0, "the reserve did not empty the cache");
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":null}", &b), 500, "%s", b);
    expect_error(b, "regrow_failed", "could not grow back");
    free(b);
    cr_assert(strstr(log_text(), "injected allocation failure (expert_cache"), "%s", log_text());
    cr_assert(strstr(log_text(), "segments (a device allocation failed)"), "%s", log_text());
    cr_assert_eq(wait_full(full, 5), full, "the caches did not come back to full after the failed regrow");
    cr_assert(strstr(log_text(), "expert cache back at"), "%s", log_text());
    char *t1 = content();
    cr_assert_str_eq(t0, t1, "output changed after the failed regrow");
    cr_assert_eq(req("POST", "/v1/vram", "{\"reserve_mib\":null}", &b), 200, "%s", b); /* and restore answers ok */
    cr_assert(strstr(b, "\"status\":\"ok\""), "%s", b);
    free(b);
    free(t0);
    free(t1);
    stop();
}

/* The vision idle unload regrows the caches; a segment allocation fails during that regrow.
 * No request is waiting on it: the caches must still come back to full, and images and text
 * keep working. vision.vram_mib 60 makes the hand-back take most of the cache. */
Test(faults, regrow_allocation_failure_after_vision_unload, .timeout = 90)
{
    if (access(mmproj_path(), R_OK)) cr_skip_test("no mmproj at %s", mmproj_path());
    static char cfg[512], env[64];
    snprintf(cfg, sizeof cfg, DEV64 ",\"mmproj\":\"%s\",\"vision\":{\"lazy\":true,\"idle_s\":1,\"vram_mib\":60}",
             mmproj_path());
    start(cfg, NULL);
    double full = slots_now();
    stop();
    snprintf(env, sizeof env, "TIDE_FAULT_ALLOC=0:expert_cache:%d", (int)full + 3);
    start(cfg, env);
    char *img = image_body(5), *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", img, &b), 200, "%s", b);
    free(b);
    double ready = slots_now();
    cr_assert_leq(ready, full - 6, "the hand-back did not shrink the cache (%g of %g)", ready, full);
    for (int i = 0; i < 100 && strcmp(vision_state_now(), "unloaded"); i++) usleep(100000);
    cr_assert_str_eq(vision_state_now(), "unloaded");
    cr_assert_eq(wait_full(full, 5), full, "the caches did not come back to full after the failed regrow");
    cr_assert(strstr(log_text(), "injected allocation failure (expert_cache"), "the hook did not fire: %s", log_text());
    cr_assert(strstr(log_text(), "segments (a device allocation failed)"), "%s", log_text());
    free(content());
    char *img2 = image_body(77);
    cr_assert_eq(req("POST", "/v1/chat/completions", img2, &b), 200, "image after the failed regrow: %s", b);
    free(b);
    free(img);
    free(img2);
    stop();
}

/* KV and workspace are allocated once, at start-up, for the whole context (forward.c
 * stage_init): nothing on a device grows per request (a prompt's prefill buffers borrow
 * expert-cache segments, no allocation). So the KV failure point is start-up: the daemon
 * must refuse to start with one line saying so, and exit 1, not crash. */
Test(faults, kv_and_workspace_allocation_failure_at_start_up, .timeout = 60)
{
    /* workspace #1 is the expert cache's staging slot, #2 the first forward buffer */
    static const char *const envs[] = {"TIDE_FAULT_ALLOC=0:kv:1", "TIDE_FAULT_ALLOC=0:kv:2",
                                       "TIDE_FAULT_ALLOC=0:workspace:2", "TIDE_FAULT_ALLOC=0:weights:3",
                                       "TIDE_FAULT_ALLOC=0:workspace:1"};
    static const char *const says[] = {"cannot start: forward state for 1024 tokens: a device allocation",
                                       "cannot start: forward state for 1024 tokens: a device allocation",
                                       "cannot start: forward state for 1024 tokens: a device allocation",
                                       "cannot start: forward state for 1024 tokens: a device allocation",
                                       "cannot start: device 0: expert cache: its staging slot could not be allocated"};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        int st = launch(DEV64, envs[i]);
        cr_assert_neq(st, -1, "%s: the daemon started", envs[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: exit status %d (crashed?)", envs[i], st);
        const char *log = log_text();
        cr_assert(strstr(log, "injected allocation failure"), "%s: %s", envs[i], log);
        cr_assert(strstr(log, says[i]), "%s: %s", envs[i], log);
        unlink(cfg_path);
        unlink(log_path);
    }
}

/* A backend that fails for good (a CUDA error is sticky: every later op does nothing) in the
 * middle of a reply: that reply is a 500 error object naming it, not a 200 made of stale logits;
 * GET /health and /ready turn 503 with the reason, and later requests get 503 (the balancer
 * sends them elsewhere) instead of garbage (issue 27 item 7). TIDE_FAULT_BACKEND_ERROR=n makes
 * the backend fail after the n-th forward step, on any device kind. */
Test(faults, sticky_backend_failure_turns_the_daemon_unhealthy, .timeout = 60)
{
    start(DEV64, "TIDE_FAULT_BACKEND_ERROR=4");
    char *b;
    cr_assert_eq(req("GET", "/health", NULL, &b), 200, "%s", b);
    free(b);
    cr_assert_eq(req("POST", "/v1/chat/completions", TEXT, &b), 500, "%s", b);
    expect_error(b, NULL, "the backend failed");
    free(b);
    cr_assert_eq(req("GET", "/health", NULL, &b), 503, "%s", b);
    cr_assert(strstr(b, "\"status\":\"error\"") && strstr(b, "injected backend failure"), "%s", b);
    free(b);
    cr_assert_eq(req("GET", "/ready", NULL, &b), 503, "%s", b);
    cr_assert(strstr(b, "\"status\":\"error\""), "%s", b);
    free(b);
    cr_assert_eq(req("POST", "/v1/chat/completions", TEXT, &b), 503, "%s", b);
    expect_error(b, "backend_failed", "needs a restart");
    free(b);
    stop();
}

/* A client that hangs up during a long prefill does not hold the engine (issue 27 item 4): the
 * prompt runs in chunks, one a step, and the job's cancel flag is checked before every step. One
 * sequence at a time, 64-token chunks (max_batch_tokens: the CPU's prefill buffer is 512 rows)
 * and every step at least 20 ms (the slow-step hook), so the ~8,000-token prompt's ~125 chunks
 * would hold the engine 2.5 s or more; the client leaves after 0.3 s and the
 * next request, queued behind it, must be answered well before that. */
Test(faults, hang_up_during_a_long_prefill_frees_the_engine, .timeout = 60)
{
    start("\"context\":16384,\"parallel\":1,\"max_batch_tokens\":64", "TIDE_FAULT_SLOW_TOKEN_MS=20");
    size_t words = 6000, cap = words * 8 + 256;
    char *body = malloc(cap);
    size_t n = (size_t)snprintf(body, cap, "{\"prompt\":\"");
    for (size_t i = 0; i < words; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s ", i % 3 ? "river" : "stone");
    n += (size_t)snprintf(body + n, cap - n, "\",\"max_tokens\":4,\"stream\":true}");
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n", n);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(write(fd, head, (size_t)hl), hl);
    cr_assert_eq(write(fd, body, n), (ssize_t)n);
    usleep(300000);
    close(fd); /* gone in the middle of the prefill */
    double t0 = mono();
    char *b;
    cr_assert_eq(req("POST", "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":2}", &b), 200, "%s", b);
    double dt = mono() - t0;
    free(b);
    free(body);
    cr_expect_lt(dt, 1.5, "the next request waited %.2f s behind a prefill whose client left", dt);
    stop();
}

/* A forward step fails (as a backend failure would): the prompt's prefill, then a decode step
 * in the middle of a stream. */
Test(faults, failing_engine_step, .timeout = 60)
{
    start(DEV64, "TIDE_FAULT_ENGINE_STEP=1");
    cJSON *v0 = vram();
    double full = slots(v0, "expert_slots_full");
    cJSON_Delete(v0);
    char *b;
    cr_assert_eq(req("POST", "/v1/chat/completions", TEXT, &b), 500, "%s", b);
    expect_error(b, NULL, "prefill");
    free(b);
    cr_assert_eq(slots_now(), full, "caches not at full after the failed step");
    char *t0 = content(), *t1 = content();
    cr_assert(t0[0]);
    cr_assert_str_eq(t0, t1, "output after the failure is not stable");
    stop();

    /* step 1 is the prefill; step 6 is the fifth generated token's forward */
    start(DEV64, "TIDE_FAULT_ENGINE_STEP=6");
    struct buf sb = {calloc(1, 1), 0, 0};
    long code = req_into("POST", "/v1/chat/completions",
                         "{" HELLO ",\"max_tokens\":64,\"temperature\":0,\"stream\":true}", NULL, &sb);
    cr_assert_eq(code, 200);
    const char *e = strstr(sb.p, "data: {\"error\"");
    cr_assert_not_null(e, "no error event: %s", sb.p);
    cr_assert(strstr(sb.p, "\"content\"") && strstr(sb.p, "\"content\"") < e, "no text before the error: %s", sb.p);
    cr_assert(strstr(e, "forward at position") && strstr(e, "server_error"), "%s", e);
    cr_assert(sb.n >= 14 && !strcmp(sb.p + sb.n - 14, "data: [DONE]\n\n"), "stream does not end with [DONE]: %s", sb.p);
    free(sb.p);
    cr_assert_eq(slots_now(), full);
    char *t2 = content();
    cr_assert_str_eq(t0, t2, "output after a failed stream differs");
    free(t0); free(t1); free(t2);
    stop();
}

static double waiting(void)
{
    char *m;
    cr_assert_eq(req("GET", "/metrics", NULL, &m), 200);
    const char *p = strstr(m, "\ntide_requests_waiting ");
    double v = p ? atof(p + strlen("\ntide_requests_waiting ")) : -1;
    free(m);
    return v;
}

struct stream_arg { const char *body; struct buf b; long code; };
static void *stream_thread(void *p)
{
    struct stream_arg *a = p;
    a->code = req_into("POST", "/v1/chat/completions", a->body, NULL, &a->b);
    return NULL;
}

/* SIGTERM drains: GET /ready turns 503 "draining" at once, a new request gets 503, the running
 * stream and the two requests queued behind it finish whole (no error, [DONE]), and the daemon
 * exits 0 once they are done. */
Test(faults, sigterm_drains_running_and_queued, .timeout = 60)
{
    /* one sequence at a time, so the other two queue behind the first */
    start(DEV64 ",\"drain_timeout_s\":30,\"parallel\":1", "TIDE_FAULT_SLOW_TOKEN_MS=4"); /* 150 tokens >= 0.6 s each */
    const char *body = "{" HELLO ",\"max_tokens\":150,\"temperature\":0,\"stream\":true}";
    const char *plain = "{" HELLO ",\"max_tokens\":150,\"temperature\":0}";
    struct stream_arg a[3] = {{body, {calloc(1, 1), 0, 0}, 0}, {body, {calloc(1, 1), 0, 0}, 0},
                              {plain, {calloc(1, 1), 0, 0}, 0}};
    pthread_t th[3];
    pthread_create(&th[0], NULL, stream_thread, &a[0]);
    for (int i = 0; i < 200 && !strstr(a[0].b.p, "\"content\""); i++) usleep(10000);
    cr_assert(strstr(a[0].b.p, "\"content\""), "the first stream did not start");
    pthread_create(&th[1], NULL, stream_thread, &a[1]);
    pthread_create(&th[2], NULL, stream_thread, &a[2]);
    for (int i = 0; i < 250 && waiting() < 2; i++) usleep(10000);
    cr_assert_eq(waiting(), 2, "the two requests are not queued");
    double t0 = mono();
    kill(pid, SIGTERM);
    usleep(50000);
    char *r = NULL;
    cr_expect_eq(req("GET", "/ready", NULL, &r), 503, "GET /ready while draining: %s", r);
    cr_expect(r && strstr(r, "\"status\":\"draining\"") && strstr(r, "\"reason\""), "%s", r);
    free(r);
    r = NULL;
    cr_expect_eq(req("POST", "/v1/chat/completions", plain, &r), 503, "a new request while draining: %s", r);
    cr_expect(r && strstr(r, "shutting down"), "%s", r);
    free(r);
    int st;
    waitpid(pid, &st, 0);
    pid = 0;
    double dt = mono() - t0;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d after the drain", st);
    cr_expect(strstr(log_text(), "drained"), "no 'drained' in the log: %s", log_text());
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        const char *p = a[i].b.p;
        cr_expect_eq(a[i].code, 200, "stream %d", i);
        cr_expect_null(strstr(p, "\"error\""), "stream %d cut by the drain: %.300s", i, p);
        cr_expect(a[i].b.n >= 14 && !strcmp(p + a[i].b.n - 14, "data: [DONE]\n\n"), "stream %d does not end with [DONE]", i);
    }
    cr_expect_eq(a[2].code, 200, "queued request: %s", a[2].b.p);
    cr_expect(strstr(a[2].b.p, "\"completion_tokens\":150"), "queued request not whole: %.300s", a[2].b.p);
    cr_expect_lt(dt, 20.0, "the drain took %.2f s", dt);
    for (int i = 0; i < 3; i++) free(a[i].b.p);
    stop();
}

/* A second SIGTERM during the drain (or drain_timeout_s running out) cancels at once: the
 * stream running and the one queued behind it end with an error event and [DONE], a queued
 * non-streamed request gets a 503 error object, and the daemon exits 0 within a few seconds. */
static void cancel_during_drain(bool second_signal)
{
    start(second_signal ? DEV64 ",\"parallel\":1" : DEV64 ",\"drain_timeout_s\":1,\"parallel\":1",
          "TIDE_FAULT_SLOW_TOKEN_MS=20"); /* 900 tokens would take >= 18 s */
    const char *body = "{" HELLO ",\"max_tokens\":900,\"temperature\":0,\"stream\":true}";
    const char *plain = "{" HELLO ",\"max_tokens\":900,\"temperature\":0}";
    struct stream_arg a[3] = {{body, {calloc(1, 1), 0, 0}, 0}, {body, {calloc(1, 1), 0, 0}, 0},
                              {plain, {calloc(1, 1), 0, 0}, 0}};
    pthread_t th[3];
    pthread_create(&th[0], NULL, stream_thread, &a[0]);
    for (int i = 0; i < 200 && !strstr(a[0].b.p, "\"content\""); i++) usleep(20000);
    cr_assert(strstr(a[0].b.p, "\"content\""), "the first stream did not start");
    pthread_create(&th[1], NULL, stream_thread, &a[1]);
    pthread_create(&th[2], NULL, stream_thread, &a[2]);
    for (int i = 0; i < 250 && waiting() < 2; i++) usleep(20000); /* both queued behind the first */
    cr_assert_eq(waiting(), 2, "the two requests are not queued");
    double dt;
    if (second_signal) {
        kill(pid, SIGTERM); /* drains... */
        usleep(300000);
        dt = stop();        /* ...and the second SIGTERM cancels */
    } else {
        dt = stop() - 1.0;  /* the drain gives up after drain_timeout_s */
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    cr_expect_lt(dt, 5.0, "exit took %.2f s after the cancel", dt);
    for (int i = 0; i < 2; i++) {
        const char *p = a[i].b.p;
        cr_expect_eq(a[i].code, 200, "stream %d", i);
        const char *e = strstr(p, "data: {\"error\"");
        cr_expect(e && strstr(e, "server is shutting down"), "stream %d: no shutdown error event: %.400s", i, p);
        cr_expect(a[i].b.n >= 14 && !strcmp(p + a[i].b.n - 14, "data: [DONE]\n\n"), "stream %d does not end with [DONE]: %.400s",
                  i, p + (a[i].b.n > 400 ? a[i].b.n - 400 : 0));
    }
    cr_expect_eq(a[2].code, 503, "queued request: %s", a[2].b.p);
    cr_expect(strstr(a[2].b.p, "\"error\"") && strstr(a[2].b.p, "shutting down"), "%s", a[2].b.p);
    for (int i = 0; i < 3; i++) free(a[i].b.p);
}

Test(faults, second_sigterm_cancels_the_drain, .timeout = 60) { cancel_during_drain(true); }
Test(faults, drain_timeout_cancels, .timeout = 60) { cancel_during_drain(false); }
