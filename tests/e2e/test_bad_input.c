/* test_bad_input.c - end-to-end bad-input battery (issue 7): every malformed, mistyped,
 * out-of-range or hostile request gets the exact 4xx with the OpenAI error object
 * {"error":{"message","type","param","code"}}, `param` naming the field where there is one,
 * and the daemon answers GET /health 200 right after (it did not crash or wedge).
 *
 * Each case is its own Criterion test with its own daemon (started like test_server.c:
 * build/tide or $TIDE_BIN, model models/tide-moe.gguf or $TIDE_MODEL), so one case that
 * kills the server cannot hide the next. The /v1/vram cases skip themselves while the
 * daemon has no such route (GET /v1/vram answers 404). */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* One request. ctype NULL sends no Content-Type at all (curl would otherwise add a form
 * type to a POST); body_len is explicit so bodies may hold NUL bytes; hdr is one extra
 * raw header line or NULL. Returns the status (0: no answer), *out the body. */
static long req(const char *method, const char *path, const char *ctype, const char *body,
                size_t body_len, const char *hdr, char **out)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = { calloc(1, 1), 0 };
    struct curl_slist *h = NULL;
    char x[160];
    snprintf(x, sizeof x, "Content-Type:%s%s", ctype ? " " : "", ctype ? ctype : "");
    h = curl_slist_append(h, x);
    h = curl_slist_append(h, "Expect:");
    if (hdr) h = curl_slist_append(h, hdr);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
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

static long health(void) { return req("GET", "/health", NULL, NULL, 0, NULL, NULL); }

static void start(const char *extra_cfg, const char *flag, const char *flagval)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    port = free_port();
    snprintf(cfg_path, sizeof cfg_path, "/tmp/tide-bad-%d.json", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    cr_assert(f, "cannot write %s", cfg_path);
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
        if (health() == 200) return;
        usleep(50000);
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
            usleep(20000);
        }
        /* A sanitizer report or a crash during the case shows up here. */
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status %d", st);
    }
    unlink(cfg_path);
    pid = 0;
}

static void start_default(void) { start(NULL, NULL, NULL); }
static void start_keyed(void) { start(NULL, "--api-key", "sekrit"); }

/* The whole contract of a rejected request: status, error object shape, param (NULL: must
 * be JSON null), code (NULL: null or any string), then a healthy server. */
static void check_error(long status, char *body, long want, const char *param, const char *code)
{
    cr_expect_eq(status, want, "status %ld, want %ld: %.300s", status, want, body ? body : "");
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    cr_expect(cJSON_IsObject(e), "not an error object: %.300s", body ? body : "");
    if (cJSON_IsObject(e)) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message"), *t = cJSON_GetObjectItemCaseSensitive(e, "type"),
              *p = cJSON_GetObjectItemCaseSensitive(e, "param"), *c = cJSON_GetObjectItemCaseSensitive(e, "code");
        cr_expect(cJSON_IsString(m) && m->valuestring[0], "message: %s", body);
        cr_expect(cJSON_IsString(t) && t->valuestring[0], "type: %s", body);
        if (param) cr_expect(cJSON_IsString(p) && !strcmp(p->valuestring, param), "param, want %s: %s", param, body);
        else cr_expect(cJSON_IsNull(p), "param, want null: %s", body);
        cr_expect(cJSON_IsNull(c) || cJSON_IsString(c), "code must be a string or null: %s", body);
        if (code) cr_expect(cJSON_IsString(c) && !strcmp(c->valuestring, code), "code, want %s: %s", code, body);
    }
    cJSON_Delete(j);
    free(body);
    cr_expect_eq(health(), 200, "GET /health after the bad request");
}

static void chat_bad(const char *json, size_t len, long want, const char *param)
{
    char *b = NULL;
    long s = req("POST", "/v1/chat/completions", "application/json", json, len, NULL, &b);
    check_error(s, b, want, param, NULL);
}

#define OK_MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
/* A chat body that is fine except for `extra` (a JSON member list, or empty). */
#define WITH(extra) "{" OK_MSG "," extra "}"

TestSuite(bad, .init = start_default, .fini = stop, .timeout = 60);

/* One test per case: NAME, raw body (a literal; may hold NUL bytes), expected param. */
#define BAD(name, lit, param) \
    Test(bad, name) { chat_bad(lit, sizeof(lit) - 1, 400, param); }

/* ---- the body is not a JSON object ---- */
BAD(empty_body, "", NULL)
BAD(malformed_json, "{\"messages\":", NULL)
BAD(not_json, "hello", NULL)
BAD(json_array, "[]", NULL)
BAD(json_string, "\"hi\"", NULL)
BAD(json_null, "null", NULL)
BAD(json_number, "42", NULL)
BAD(trailing_garbage, WITH("\"max_tokens\":1") "garbage", NULL)
BAD(two_objects, WITH("\"max_tokens\":1") "{}", NULL)

/* ---- messages ---- */
BAD(missing_messages, "{\"max_tokens\":3}", "messages")
BAD(empty_messages, "{\"messages\":[]}", "messages")
BAD(messages_object, "{\"messages\":{}}", "messages")
BAD(messages_string, "{\"messages\":\"hi\"}", "messages")
BAD(messages_null, "{\"messages\":null}", "messages")
BAD(message_not_object, "{\"messages\":[1]}", "messages")
BAD(missing_role, "{\"messages\":[{\"content\":\"hi\"}]}", "messages")
BAD(unknown_role, "{\"messages\":[{\"role\":\"bot\",\"content\":\"hi\"}]}", "messages")
BAD(role_number, "{\"messages\":[{\"role\":1,\"content\":\"hi\"}]}", "messages")
BAD(role_empty, "{\"messages\":[{\"role\":\"\",\"content\":\"hi\"}]}", "messages")
BAD(content_number, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages")
BAD(content_object, "{\"messages\":[{\"role\":\"user\",\"content\":{}}]}", "messages")
BAD(user_content_missing, "{\"messages\":[{\"role\":\"user\"}]}", "messages")
BAD(user_content_null, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages")
BAD(part_not_object, "{\"messages\":[{\"role\":\"user\",\"content\":[\"hi\"]}]}", "messages")
BAD(part_no_type, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"hi\"}]}]}", "messages")
BAD(part_unknown_type, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\",\"text\":\"hi\"}]}]}", "messages")
BAD(part_text_number, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}", "messages")
/* Images: invalid either way, before and after vision lands. */
BAD(image_bad_base64, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
    "\"image_url\":{\"url\":\"data:image/png;base64,!!!notbase64\"}}]}]}", "messages")
BAD(image_file_url, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
    "\"image_url\":{\"url\":\"file:///etc/passwd\"}}]}]}", "messages")

/* ---- wrong types and out-of-range values, one field at a time ---- */
BAD(model_number, WITH("\"model\":5"), "model")
BAD(model_array, WITH("\"model\":[\"x\"]"), "model")
BAD(stream_string, WITH("\"stream\":\"yes\""), "stream")
BAD(stream_number, WITH("\"stream\":1"), "stream")
BAD(stream_options_string, WITH("\"stream\":true,\"stream_options\":\"x\""), "stream_options")
BAD(include_usage_string, WITH("\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}"),
    "stream_options.include_usage")
BAD(max_tokens_string, WITH("\"max_tokens\":\"8\""), "max_tokens")
BAD(max_tokens_zero, WITH("\"max_tokens\":0"), "max_tokens")
BAD(max_tokens_negative, WITH("\"max_tokens\":-1"), "max_tokens")
BAD(max_tokens_fraction, WITH("\"max_tokens\":1.5"), "max_tokens")
BAD(max_tokens_huge, WITH("\"max_tokens\":1e10"), "max_tokens")
BAD(max_completion_tokens_string, WITH("\"max_completion_tokens\":\"8\""), "max_completion_tokens")
BAD(max_completion_tokens_zero, WITH("\"max_completion_tokens\":0"), "max_completion_tokens")
BAD(temperature_string, WITH("\"temperature\":\"hot\""), "temperature")
BAD(temperature_too_high, WITH("\"temperature\":2.5"), "temperature")
BAD(temperature_negative, WITH("\"temperature\":-0.1"), "temperature")
BAD(temperature_overflow, WITH("\"temperature\":1e999"), "temperature")
BAD(top_p_zero, WITH("\"top_p\":0"), "top_p")
BAD(top_p_too_high, WITH("\"top_p\":1.01"), "top_p")
BAD(top_p_bool, WITH("\"top_p\":true"), "top_p")
BAD(top_k_negative, WITH("\"top_k\":-1"), "top_k")
BAD(top_k_fraction, WITH("\"top_k\":2.5"), "top_k")
BAD(top_k_string, WITH("\"top_k\":\"40\""), "top_k")
BAD(min_p_too_high, WITH("\"min_p\":1.5"), "min_p")
BAD(min_p_string, WITH("\"min_p\":\"0.1\""), "min_p")
BAD(seed_string, WITH("\"seed\":\"42\""), "seed")
BAD(seed_fraction, WITH("\"seed\":4.2"), "seed")
BAD(seed_out_of_int64, WITH("\"seed\":1e300"), "seed")
BAD(stop_number, WITH("\"stop\":5"), "stop")
BAD(stop_object, WITH("\"stop\":{}"), "stop")
BAD(stop_entry_number, WITH("\"stop\":[\"a\",1]"), "stop")
BAD(stop_too_many, WITH("\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]"), "stop")
BAD(n_zero, WITH("\"n\":0"), "n")
BAD(n_too_high, WITH("\"n\":17"), "n")
BAD(n_string, WITH("\"n\":\"2\""), "n")
BAD(presence_penalty_too_high, WITH("\"presence_penalty\":2.5"), "presence_penalty")
BAD(presence_penalty_string, WITH("\"presence_penalty\":\"1\""), "presence_penalty")
BAD(frequency_penalty_too_low, WITH("\"frequency_penalty\":-2.5"), "frequency_penalty")
BAD(frequency_penalty_array, WITH("\"frequency_penalty\":[1]"), "frequency_penalty")
BAD(logprobs_string, WITH("\"logprobs\":\"yes\""), "logprobs")
BAD(logprobs_number, WITH("\"logprobs\":1"), "logprobs")
BAD(top_logprobs_without_logprobs, WITH("\"top_logprobs\":3"), "top_logprobs")
BAD(top_logprobs_too_high, WITH("\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs")
BAD(top_logprobs_string, WITH("\"logprobs\":true,\"top_logprobs\":\"3\""), "top_logprobs")
BAD(response_format_string, WITH("\"response_format\":\"json_object\""), "response_format")
BAD(response_format_no_type, WITH("\"response_format\":{}"), "response_format")
BAD(response_format_unknown, WITH("\"response_format\":{\"type\":\"yaml\"}"), "response_format")

/* ---- bytes JSON forbids, which cJSON alone would let through truncated (param: the
 * top-level field they are in, issue 27) ---- */
BAD(invalid_utf8, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfe" "b\"}]}", "messages")
BAD(overlong_utf8, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xc0\xaf" "b\"}]}", "messages")
BAD(utf8_surrogate, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xed\xa0\x80" "b\"}]}", "messages")
BAD(truncated_utf8, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xe2\x82\"}]}", "messages")
BAD(lone_surrogate_escape, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\ud800b\"}]}", NULL)
BAD(raw_nul_in_content, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}", "messages")
BAD(nul_escape_in_content, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "messages")
BAD(raw_control_in_content, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\x01" "b\"}]}", "messages")

/* ---- legacy /v1/completions ---- */
static void completions_bad(const char *json, const char *param)
{
    char *b = NULL;
    long s = req("POST", "/v1/completions", "application/json", json, strlen(json), NULL, &b);
    check_error(s, b, 400, param, NULL);
}
Test(bad, completions_prompt_missing) { completions_bad("{\"max_tokens\":1}", "prompt"); }
Test(bad, completions_prompt_number) { completions_bad("{\"prompt\":5}", "prompt"); }
Test(bad, completions_echo) { completions_bad("{\"prompt\":\"a\",\"echo\":\"yes\"}", "echo"); }
Test(bad, completions_logprobs_too_high) { completions_bad("{\"prompt\":\"a\",\"logprobs\":6}", "logprobs"); }
/* invalid UTF-8 is refused at the door, naming its field (issue 27) */
Test(bad, completions_prompt_invalid_utf8) { completions_bad("{\"max_tokens\":1,\"prompt\":\"ab\xc3(\"}", "prompt"); }
Test(bad, completions_stop_invalid_utf8) { completions_bad("{\"prompt\":\"a\",\"stop\":[\"x\",\"\xff\"]}", "stop"); }

/* 100000 '[' must fail at the nesting limit (128, counted before cJSON parses), not on the
 * connection thread's stack. */
Test(bad, deep_nesting_array)
{
    size_t n = 100000;
    char *s = malloc(n + 1);
    memset(s, '[', n);
    s[n] = 0;
    chat_bad(s, n, 400, NULL);
    free(s);
}

Test(bad, deep_nesting_in_field)
{
    /* A valid request with 5000 nested objects in an ignored field: still over the limit. */
    size_t depth = 5000;
    char *s = malloc(depth * 6 + 64), *p = s;
    p += sprintf(p, "{" OK_MSG ",\"x\":");
    for (size_t i = 0; i < depth; i++) p += sprintf(p, "{\"a\":");
    p += sprintf(p, "1");
    for (size_t i = 0; i < depth; i++) *p++ = '}';
    *p++ = '}';
    chat_bad(s, (size_t)(p - s), 400, NULL);
    free(s);
}

Test(bad, prompt_longer_than_context)
{
    /* The daemon runs with a 1024-token context; 3000 words cannot fit. */
    size_t n = 3000;
    char *s = malloc(n * 6 + 128), *p = s;
    p += sprintf(p, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "word ");
    p += sprintf(p, "\"}],\"max_tokens\":1}");
    char *b = NULL;
    long st = req("POST", "/v1/chat/completions", "application/json", s, (size_t)(p - s), NULL, &b);
    check_error(st, b, 400, "messages", "context_length_exceeded");
    free(s);
}

Test(bad, max_tokens_over_context)
{
    char *b = NULL;
    const char *body = WITH("\"max_tokens\":5000");
    long st = req("POST", "/v1/chat/completions", "application/json", body, strlen(body), NULL, &b);
    check_error(st, b, 400, "messages", "context_length_exceeded");
}

Test(bad, completions_prompt_over_context)
{
    size_t n = 3000;
    char *s = malloc(n * 6 + 64), *p = s;
    p += sprintf(p, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "word ");
    p += sprintf(p, "\",\"max_tokens\":1}");
    char *b = NULL;
    long st = req("POST", "/v1/completions", "application/json", s, (size_t)(p - s), NULL, &b);
    check_error(st, b, 400, "prompt", "context_length_exceeded");
    free(s);
}

/* ---- HTTP level: content type, method, path, size ---- */
static void http_bad(const char *method, const char *path, const char *ctype, const char *body, long want)
{
    char *b = NULL;
    long s = req(method, path, ctype, body, body ? strlen(body) : 0, NULL, &b);
    check_error(s, b, want, NULL, NULL);
}
Test(bad, content_type_text_plain) { http_bad("POST", "/v1/chat/completions", "text/plain", WITH("\"max_tokens\":1"), 415); }
Test(bad, content_type_missing) { http_bad("POST", "/v1/chat/completions", NULL, WITH("\"max_tokens\":1"), 415); }
Test(bad, content_type_form) { http_bad("POST", "/v1/chat/completions", "application/x-www-form-urlencoded", WITH("\"max_tokens\":1"), 415); }
Test(bad, content_type_json_prefix) { http_bad("POST", "/v1/chat/completions", "application/jsonx", WITH("\"max_tokens\":1"), 415); }
Test(bad, completions_text_plain) { http_bad("POST", "/v1/completions", "text/plain", "{\"prompt\":\"a\"}", 415); }
Test(bad, method_get_chat) { http_bad("GET", "/v1/chat/completions", NULL, NULL, 405); }
Test(bad, method_delete_health) { http_bad("DELETE", "/health", NULL, NULL, 405); }
Test(bad, method_put_models) { http_bad("PUT", "/v1/models", "application/json", "{}", 405); }
Test(bad, method_post_metrics) { http_bad("POST", "/metrics", "application/json", "{}", 405); }
Test(bad, unknown_path) { http_bad("GET", "/v1/nope", NULL, NULL, 404); }
Test(bad, unknown_path_trailing_slash) { http_bad("POST", "/v1/chat/completions/", "application/json", "{}", 404); }
Test(bad, unknown_path_traversal) { http_bad("GET", "/v1/../../etc/passwd", NULL, NULL, 404); }

/* The charset parameter is legal: the content-type check must not refuse it. */
Test(bad, content_type_with_charset_accepted)
{
    char *b = NULL;
    const char *body = WITH("\"max_tokens\":1,\"temperature\":0");
    cr_expect_eq(req("POST", "/v1/chat/completions", "application/json; charset=utf-8", body, strlen(body), NULL, &b),
                 200, "%s", b);
    free(b);
}

/* Declares 32 GiB, sends one byte: the answer must come without the daemon waiting for (or
 * buffering) the rest. A raw socket, because curl would wait on Expect: 100-continue. */
Test(bad, body_over_limit_declared)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    cr_assert(connect(s, (struct sockaddr *)&a, sizeof a) == 0);
    struct timeval tv = { 10, 0 };
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *h = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                    "Content-Type: application/json\r\nContent-Length: 34359738368\r\n\r\n{";
    cr_assert(send(s, h, strlen(h), MSG_NOSIGNAL) == (ssize_t)strlen(h));
    double t0 = now();
    char resp[8192];
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(s, resp + n, sizeof resp - 1 - n, 0);
        if (r <= 0) break;
        n += (size_t)r;
        resp[n] = 0;
        char *hb = strstr(resp, "\r\n\r\n");
        if (hb && strchr(hb, '}') && strstr(hb, "}}")) break;   /* the whole error object */
    }
    resp[n] = 0;
    close(s);
    cr_expect(now() - t0 < 5, "413 took %.1f s", now() - t0);
    cr_assert(strncmp(resp, "HTTP/1.1 413", 12) == 0, "response: %.200s", resp);
    char *hb = strstr(resp, "\r\n\r\n");
    cr_assert(hb);
    check_error(413, strdup(hb + 4), 413, NULL, NULL);
}

/* No Content-Length at all (chunked): the limit must hold while reading, too. */
struct feed { size_t left; };
static size_t feed_read(char *d, size_t sz, size_t nm, void *ud)
{
    struct feed *f = ud;
    size_t n = sz * nm < f->left ? sz * nm : f->left;
    memset(d, ' ', n);
    f->left -= n;
    return n;
}
Test(bad, body_over_limit_chunked)
{
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", port);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Transfer-Encoding: chunked");
    h = curl_slist_append(h, "Expect:");
    struct feed f = { (33u << 20) };
    struct buf b = { calloc(1, 1), 0 };
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, feed_read);
    curl_easy_setopt(c, CURLOPT_READDATA, &f);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    cr_expect_eq(rc, CURLE_OK, "curl: %s", curl_easy_strerror(rc));
    check_error(code, b.p, 413, NULL, NULL);
}

/* ---- API key (daemon started with --api-key sekrit) ---- */
TestSuite(bad_key, .init = start_keyed, .fini = stop, .timeout = 60);

static void key_bad(const char *method, const char *path, const char *hdr)
{
    char *b = NULL;
    const char *body = strcmp(method, "POST") ? NULL : WITH("\"max_tokens\":1");
    long s = req(method, path, body ? "application/json" : NULL, body, body ? strlen(body) : 0, hdr, &b);
    check_error(s, b, 401, NULL, "invalid_api_key");
}
Test(bad_key, missing) { key_bad("GET", "/v1/models", NULL); }
Test(bad_key, wrong) { key_bad("GET", "/v1/models", "Authorization: Bearer wrong!"); }
Test(bad_key, prefix_of_key) { key_bad("GET", "/v1/models", "Authorization: Bearer sekri"); }
Test(bad_key, key_plus_suffix) { key_bad("GET", "/v1/models", "Authorization: Bearer sekrit2"); }
Test(bad_key, empty) { key_bad("GET", "/v1/models", "Authorization: Bearer "); }
Test(bad_key, basic_scheme) { key_bad("GET", "/v1/models", "Authorization: Basic sekrit"); }
Test(bad_key, no_scheme) { key_bad("GET", "/v1/models", "Authorization: sekrit"); }
Test(bad_key, chat_without_key) { key_bad("POST", "/v1/chat/completions", NULL); }
Test(bad_key, completions_wrong_key) { key_bad("POST", "/v1/completions", "Authorization: Bearer nope"); }

Test(bad_key, right_key_and_open_health)
{
    char *b = NULL;
    cr_expect_eq(req("GET", "/v1/models", NULL, NULL, 0, "Authorization: Bearer sekrit", &b), 200, "%s", b);
    free(b);
    /* RFC 9110: the scheme name is case-insensitive. */
    cr_expect_eq(req("GET", "/v1/models", NULL, NULL, 0, "Authorization: bearer sekrit", &b), 200, "%s", b);
    free(b);
    cr_expect_eq(health(), 200, "/health needs no key");
}

/* ---- POST /v1/vram (SPEC: 400 for negative, non-integer, boolean, too many values; 409
 * when vram_elastic is false). Skips while the route does not exist. ---- */
static void skip_without_vram(void)
{
    if (req("GET", "/v1/vram", NULL, NULL, 0, NULL, NULL) != 404) return;
    stop();   /* a skipped test runs no .fini: the daemon would outlive the suite */
    cr_skip_test("no /v1/vram in this build");
}
static void vram_bad(const char *json, long want, const char *param)
{
    skip_without_vram();
    char *b = NULL;
    long s = req("POST", "/v1/vram", "application/json", json, strlen(json), NULL, &b);
    check_error(s, b, want, param, NULL);
}
TestSuite(bad_vram, .init = start_default, .fini = stop, .timeout = 60);
Test(bad_vram, negative) { vram_bad("{\"reserve_mib\":[-1]}", 400, "reserve_mib"); }
Test(bad_vram, negative_bare) { vram_bad("{\"reserve_mib\":-5}", 400, "reserve_mib"); }
Test(bad_vram, fraction) { vram_bad("{\"reserve_mib\":[1.5]}", 400, "reserve_mib"); }
Test(bad_vram, boolean) { vram_bad("{\"reserve_mib\":[true]}", 400, "reserve_mib"); }
Test(bad_vram, boolean_bare) { vram_bad("{\"reserve_mib\":false}", 400, "reserve_mib"); }
Test(bad_vram, string) { vram_bad("{\"reserve_mib\":\"100\"}", 400, "reserve_mib"); }
Test(bad_vram, object) { vram_bad("{\"reserve_mib\":{}}", 400, "reserve_mib"); }
Test(bad_vram, too_many_values) { vram_bad("{\"reserve_mib\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}", 400, "reserve_mib"); }
Test(bad_vram, overflow) { vram_bad("{\"reserve_mib\":[1e300]}", 400, "reserve_mib"); }
Test(bad_vram, missing_field) { vram_bad("{}", 400, "reserve_mib"); }
Test(bad_vram, not_object) { vram_bad("[0]", 400, NULL); }
Test(bad_vram, malformed) { vram_bad("{\"reserve_mib\":", 400, NULL); }
Test(bad_vram, wrong_content_type)
{
    skip_without_vram();
    char *b = NULL;
    long s = req("POST", "/v1/vram", "text/plain", "{\"reserve_mib\":null}", 20, NULL, &b);
    check_error(s, b, 415, NULL, NULL);
}
Test(bad_vram, wrong_method)
{
    skip_without_vram();
    char *b = NULL;
    long s = req("DELETE", "/v1/vram", NULL, NULL, 0, NULL, &b);
    check_error(s, b, 405, NULL, NULL);
}

/* Its own suite: a test-level .init runs after the suite's, which would start two daemons. */
static void start_rigid(void) { start("\"vram_elastic\":false", NULL, NULL); }
TestSuite(bad_vram_rigid, .init = start_rigid, .fini = stop, .timeout = 60);
Test(bad_vram_rigid, not_elastic_409)
{
    vram_bad("{\"reserve_mib\":[0]}", 409, NULL);
}
