/* test_http.c - the HTTP front under hostile bytes (issue 27, items 2, 9, 10, 11), sent raw:
 *   - framing: every ambiguous body length is answered 400 and the connection closed
 *     (RFC 9112), so nothing can be smuggled behind a proxy, and nothing hangs;
 *   - Host: a daemon on loopback serves only loopback Host names or http.allowed_hosts
 *     (DNS rebinding), /health excepted;
 *   - /metrics needs the API key when one is set;
 *   - connection limits: idle connections from one address cannot lock another out, idle
 *     connections are closed after http.idle_timeout_s, a long request is not. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static struct daemon d;

static void start_default(void) { e2e_start(&d, NULL, NULL); }
static void stop(void) { e2e_stop(&d); }

static const char chat_body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}";

/* A chat POST with the given framing headers and raw body bytes; the response. */
static char *post(const char *headers, const char *body, double timeout_s, bool *closed)
{
    char *rq = NULL;
    int n = asprintf(&rq, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\n%s\r\n%s", headers, body);
    cr_assert(n > 0);
    char *r = e2e_raw(&d, NULL, rq, (size_t)n, timeout_s, closed);
    free(rq);
    return r;
}

/* 400 with an OpenAI error object, the connection closed, no second response (nothing
 * smuggled), and the daemon still healthy. */
static void expect_400(char *resp, bool closed, const char *what)
{
    cr_expect_eq(e2e_status(resp), 400, "%s: %.300s", what, resp);
    cr_expect(closed, "%s: connection left open", what);
    const char *body = strstr(resp, "\r\n\r\n");
    cJSON *j = body ? cJSON_Parse(body + 4) : NULL;
    cr_expect(j && cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message"), "%s: body %s", what,
              body ? body + 4 : "(none)");
    cJSON_Delete(j);
    const char *cl = strcasestr(resp, "\r\nContent-Length:");
    cr_expect(body && cl && strlen(body + 4) == strtoul(cl + 17, NULL, 10), "%s: more than one response: %s",
              what, resp);
    free(resp);
    char rq[] = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    char *h = e2e_raw(&d, NULL, rq, sizeof rq - 1, 5, NULL);
    cr_expect_eq(e2e_status(h), 200, "%s: /health after: %.200s", what, h);
    free(h);
}

/* ---- framing (item 9) ---- */
TestSuite(framing, .init = start_default, .fini = stop, .timeout = 60);

Test(framing, two_different_content_lengths)
{
    char h[160], b[512];
    /* The second request rides in the bytes one reading counts as body and the other not. */
    snprintf(h, sizeof h, "Content-Length: %zu\r\nContent-Length: %zu\r\n", strlen(chat_body),
             strlen(chat_body) + 60);
    snprintf(b, sizeof b, "%sGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: 0123456789\r\n\r\n", chat_body);
    bool closed;
    char *r = post(h, b, 5, &closed);
    expect_400(r, closed, "two Content-Length");
}

Test(framing, two_equal_content_lengths)
{
    char h[160];
    snprintf(h, sizeof h, "Content-Length: %zu\r\nContent-Length: %zu\r\n", strlen(chat_body), strlen(chat_body));
    bool closed;
    char *r = post(h, chat_body, 5, &closed);
    expect_400(r, closed, "two equal Content-Length");
}

static char *chunked(const char *body)
{
    char *s = NULL;
    cr_assert(asprintf(&s, "%zx\r\n%s\r\n0\r\n\r\n", strlen(body), body) > 0);
    return s;
}

Test(framing, gzip_chunked)
{
    char *b = chunked(chat_body);
    bool closed;
    double t0 = e2e_now();
    char *r = post("Transfer-Encoding: gzip, chunked\r\n", b, 5, &closed);
    cr_expect(e2e_now() - t0 < 3, "answered after %.1f s", e2e_now() - t0);
    expect_400(r, closed, "Transfer-Encoding: gzip, chunked");
    free(b);
}

Test(framing, transfer_encoding_not_chunked)
{
    bool closed;
    char *r = post("Transfer-Encoding: gzip\r\n", chat_body, 5, &closed);
    expect_400(r, closed, "Transfer-Encoding: gzip");
    r = post("Transfer-Encoding: chunked, identity\r\n", chat_body, 5, &closed);
    expect_400(r, closed, "Transfer-Encoding: chunked, identity");
}

Test(framing, two_transfer_encodings)
{
    char *b = chunked(chat_body);
    bool closed;
    char *r = post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b, 5, &closed);
    expect_400(r, closed, "two Transfer-Encoding");
    free(b);
}

Test(framing, content_length_and_transfer_encoding)
{
    char h[160];
    char *b = chunked(chat_body);
    snprintf(h, sizeof h, "Content-Length: %zu\r\nTransfer-Encoding: chunked\r\n", strlen(b));
    bool closed;
    char *r = post(h, b, 5, &closed);
    expect_400(r, closed, "Content-Length and Transfer-Encoding");
    free(b);
}

Test(framing, transfer_encoding_on_http10)
{
    char *b = chunked(chat_body), *rq = NULL;
    int n = asprintf(&rq, "POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n%s", b);
    bool closed;
    char *r = e2e_raw(&d, NULL, rq, (size_t)n, 5, &closed);
    expect_400(r, closed, "HTTP/1.0 with Transfer-Encoding");
    free(rq);
    free(b);
}

Test(framing, space_before_colon)
{
    char h[160];
    snprintf(h, sizeof h, "Content-Length : %zu\r\n", strlen(chat_body));
    bool closed;
    char *r = post(h, chat_body, 5, &closed);
    expect_400(r, closed, "Content-Length with a space before the colon");
}

Test(framing, host_missing_or_repeated)
{
    const char no_host[] = "GET /v1/models HTTP/1.1\r\n\r\n";
    bool closed;
    char *r = e2e_raw(&d, NULL, no_host, sizeof no_host - 1, 5, &closed);
    expect_400(r, closed, "HTTP/1.1 without Host");
    const char two[] = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n";
    r = e2e_raw(&d, NULL, two, sizeof two - 1, 5, &closed);
    expect_400(r, closed, "two Host headers");
}

/* A chunk size past 64 bits: libmicrohttpd answers 413 itself, at once (not a hang). */
Test(framing, chunk_size_overflow)
{
    bool closed;
    double t0 = e2e_now();
    char *r = post("Transfer-Encoding: chunked\r\n", "ffffffffffffffffff\r\n{\"messages\":[]}", 5, &closed);
    int st = e2e_status(r);
    cr_expect(st == 400 || st == 413, "status %d: %.200s", st, r);
    cr_expect(closed, "connection left open");
    cr_expect(e2e_now() - t0 < 3, "answered after %.1f s", e2e_now() - t0);
    free(r);
}

/* What stays accepted: one Content-Length, or chunked alone (any case). */
Test(framing, well_framed_requests_served)
{
    char h[96];
    snprintf(h, sizeof h, "Content-Length: %zu\r\nConnection: close\r\n", strlen(chat_body));
    char *r = post(h, chat_body, 30, NULL);
    cr_expect_eq(e2e_status(r), 200, "%.300s", r);
    free(r);
    char *b = chunked(chat_body);
    r = post("Transfer-Encoding: Chunked\r\nConnection: close\r\n", b, 30, NULL);
    cr_expect_eq(e2e_status(r), 200, "%.300s", r);
    free(r);
    free(b);
}

/* ---- Host (item 10) ---- */
TestSuite(host, .init = start_default, .fini = stop, .timeout = 60);

static char *get(const char *path, const char *host, const char *extra)
{
    char *rq = NULL;
    int n = asprintf(&rq, "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", path, host, extra ? extra : "");
    char *r = e2e_raw(&d, NULL, rq, (size_t)n, 10, NULL);
    free(rq);
    return r;
}

static void expect_host_refused(char *r, const char *what)
{
    cr_expect_eq(e2e_status(r), 403, "%s: %.300s", what, r);
    const char *body = strstr(r, "\r\n\r\n");
    cJSON *j = body ? cJSON_Parse(body + 4) : NULL;
    cJSON *code = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code");
    cr_expect(cJSON_IsString(code) && !strcmp(code->valuestring, "host_not_allowed"), "%s: %s", what,
              body ? body + 4 : "(none)");
    cJSON_Delete(j);
    free(r);
}

Test(host, foreign_host_refused)
{
    expect_host_refused(get("/v1/models", "evil.example", NULL), "GET /v1/models");
    expect_host_refused(get("/v1/models", "evil.example:8080", NULL), "with a port");
    expect_host_refused(get("/", "evil.example", NULL), "the UI page");
    expect_host_refused(get("/metrics", "evil.example", NULL), "/metrics");
    /* The report: Host and Origin both evil.example passed the Origin check of POST /v1/vram. */
    const char body[] = "{\"reserve_mib\":[0]}";
    char *rq = NULL;
    int n = asprintf(&rq, "POST /v1/vram HTTP/1.1\r\nHost: evil.example\r\nOrigin: http://evil.example\r\n"
                          "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    char *r = e2e_raw(&d, NULL, rq, (size_t)n, 10, NULL);
    free(rq);
    expect_host_refused(r, "POST /v1/vram");
}

Test(host, loopback_names_served)
{
    char h[64];
    const char *names[] = { "localhost", "LOCALHOST:1", "127.0.0.1", "127.1.2.3:80", "[::1]", NULL };
    for (int i = 0; names[i]; i++) {
        char *r = get("/v1/models", names[i], NULL);
        cr_expect_eq(e2e_status(r), 200, "Host %s: %.200s", names[i], r);
        free(r);
    }
    snprintf(h, sizeof h, "127.0.0.1:%d", d.port);
    char *r = get("/v1/models", h, NULL);
    cr_expect_eq(e2e_status(r), 200, "Host %s: %.200s", h, r);
    free(r);
}

Test(host, health_open_to_any_host)
{
    char *r = get("/health", "evil.example", NULL);
    cr_expect_eq(e2e_status(r), 200, "%.200s", r);
    free(r);
}

static void start_listed(void) { e2e_start(&d, "\"http\":{\"allowed_hosts\":[\"tide.lan\"]}", NULL); }
Test(host, allowed_hosts_served, .init = start_listed)
{
    char *r = get("/v1/models", "tide.lan:8080", NULL);
    cr_expect_eq(e2e_status(r), 200, "%.200s", r);
    free(r);
    r = get("/v1/models", "localhost", NULL);
    cr_expect_eq(e2e_status(r), 200, "%.200s", r);
    free(r);
    expect_host_refused(get("/v1/models", "evil.example", NULL), "not listed");
}

/* ---- /metrics behind the API key (item 11) ---- */
static void start_keyed(void)
{
    const char *const argv[] = { "--api-key", "sekrit", NULL };
    e2e_start(&d, NULL, argv);
}
TestSuite(metrics_key, .init = start_keyed, .fini = stop, .timeout = 60);

Test(metrics_key, metrics_needs_the_key)
{
    char *r = get("/metrics", "localhost", NULL);
    cr_expect_eq(e2e_status(r), 401, "%.300s", r);
    cr_expect(strstr(r, "invalid_api_key") != NULL, "%.300s", r);
    free(r);
    r = get("/metrics", "localhost", "Authorization: Bearer wrong\r\n");
    cr_expect_eq(e2e_status(r), 401, "%.300s", r);
    free(r);
    r = get("/metrics", "localhost", "Authorization: Bearer sekrit\r\n");
    cr_expect_eq(e2e_status(r), 200, "%.300s", r);
    cr_expect(strstr(r, "# TYPE") != NULL, "no metrics: %.300s", r);
    free(r);
    r = get("/health", "localhost", NULL);
    cr_expect_eq(e2e_status(r), 200, "/health stays open: %.300s", r);
    free(r);
}

/* ---- connection limits (item 2) ---- */
TestSuite(limits, .fini = stop, .timeout = 60);

/* The report: 1,100 idle connections from one client held all of libmicrohttpd's 1,020, and a
 * new client waited for the 600 s timeout. With the default config, another address
 * (127.0.0.2, loopback too) is served at once. */
Test(limits, idle_flood_from_one_address, .init = start_default)
{
    enum { FLOOD = 1100 };
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < FLOOD + 64) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < FLOOD + 64) cr_skip_test("open file limit %ld is below %d", (long)rl.rlim_cur, FLOOD + 64);
    static int fds[FLOOD];
    int opened = 0;
    for (int i = 0; i < FLOOD; i++)
        if ((fds[i] = e2e_connect(&d, "127.0.0.1")) >= 0) opened++;
    cr_expect_gt(opened, 1020, "only %d connections opened", opened);
    usleep(200000); /* let the daemon accept what it will */
    const char rq[] = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    double t0 = e2e_now();
    char *r = e2e_raw(&d, "127.0.0.2", rq, sizeof rq - 1, 5, NULL);
    cr_expect_eq(e2e_status(r), 200, "another client, after %.1f s: %.200s", e2e_now() - t0, r);
    cr_expect(e2e_now() - t0 < 3, "served after %.1f s", e2e_now() - t0);
    free(r);
    for (int i = 0; i < FLOOD; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* http.idle_timeout_s: a connection that sends nothing is closed after it. */
static void start_short_idle(void) { e2e_start(&d, "\"http\":{\"idle_timeout_s\":1}", NULL); }
/* ...with every token 50 ms slow (session.c's fault hook): a stream of 60 takes 3 s or more. */
static void start_short_idle_slow(void)
{
    d.env = "TIDE_FAULT_SLOW_TOKEN_MS=50";
    /* one sequence at a time: the second request waits, suspended, behind the first */
    e2e_start(&d, "\"http\":{\"idle_timeout_s\":1},\"parallel\":1", NULL);
}
Test(limits, idle_connection_closed, .init = start_short_idle)
{
    int s = e2e_connect(&d, NULL);
    cr_assert_geq(s, 0);
    double t0 = e2e_now();
    char c;
    ssize_t r = recv(s, &c, 1, 0); /* blocks until the server closes */
    double waited = e2e_now() - t0;
    close(s);
    cr_expect_eq(r, 0, "recv %zd", r);
    cr_expect(waited > 0.5 && waited < 4, "closed after %.2f s (idle timeout 1 s)", waited);
}

/* ...but a request that takes longer than the idle timeout is not cut: a stream of 60 slow
 * tokens, and a non-streamed request waiting behind it (its connection suspended, then resumed). */
struct longreq { bool stream; char *resp; double took; };
static void *long_request(void *p)
{
    struct longreq *a = p;
    char *rq = NULL;
    char body[256];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"tell a story\"}],"
             "\"max_tokens\":%d,\"temperature\":0%s}", a->stream ? 60 : 4, a->stream ? ",\"stream\":true" : "");
    int n = asprintf(&rq, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(body), body);
    double t0 = e2e_now();
    a->resp = e2e_raw(&d, NULL, rq, (size_t)n, 30, NULL);
    a->took = e2e_now() - t0;
    free(rq);
    return NULL;
}
Test(limits, long_request_outlives_idle_timeout, .init = start_short_idle_slow)
{
    struct longreq a[2] = { { .stream = true }, { .stream = false } };
    pthread_t th[2];
    double t0 = e2e_now();
    pthread_create(&th[0], NULL, long_request, &a[0]);
    usleep(100000);
    pthread_create(&th[1], NULL, long_request, &a[1]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    double took = e2e_now() - t0;
    cr_expect_eq(e2e_status(a[0].resp), 200, "stream: %.200s", a[0].resp);
    cr_expect(strstr(a[0].resp, "data: [DONE]") != NULL, "stream cut short (%.1f s): ...%s", took,
              a[0].resp + (strlen(a[0].resp) > 200 ? strlen(a[0].resp) - 200 : 0));
    cr_expect_eq(e2e_status(a[1].resp), 200, "waiting request: %.200s", a[1].resp);
    cr_expect(strstr(a[1].resp, "\"chat.completion\"") != NULL, "waiting request: %.300s", a[1].resp);
    cr_expect_gt(a[1].took, 1.5, "the waiting request waited only %.1f s: the test proves nothing", a[1].took);
    cr_log_info("a stream of 60 tokens (50 ms each) and a request behind it, 1 s idle timeout: %.1f s (stream %.1f s, the other %.1f s)", took,
                a[0].took, a[1].took);
    free(a[0].resp);
    free(a[1].resp);
}
