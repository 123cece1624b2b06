/* req_harness.c - see req_harness.h. */
#include "req_harness.h"
#include "harness.h" /* e2e_now, e2e_free_port */

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t pid;
static int port;
static char cfg_path[64];

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

struct harness_reply harness_req(const char *method, const char *path, const char *const *hdrs, const char *body)
{
    return harness_req_len(method, path, hdrs, body, body ? strlen(body) : 0);
}

struct harness_reply harness_req_len(const char *method, const char *path, const char *const *hdrs, const char *body,
                                     size_t body_len)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = { calloc(1, 1), 0 }, h = { calloc(1, 1), 0 };
    struct curl_slist *hl = NULL;
    if (!strcmp(method, "POST")) hl = curl_slist_append(hl, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Expect:"); /* no 100-continue round trip for large bodies */
    for (int i = 0; hdrs && hdrs[i]; i++) hl = curl_slist_append(hl, hdrs[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    struct harness_reply r = { 0 };
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    r.body = b.p; /* after the transfer: sink reallocs them */
    r.len = b.n;
    r.headers = h.p;
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return r;
}

void harness_reply_free(struct harness_reply *r)
{
    free(r->body);
    free(r->headers);
    r->body = r->headers = NULL;
}

cJSON *harness_json(const struct harness_reply *r)
{
    cJSON *j = cJSON_Parse(r->body);
    cr_assert(j, "not JSON (status %ld): %s", r->status, r->body);
    return j;
}

cJSON *harness_post_ok(const char *path, const char *body)
{
    struct harness_reply r = harness_req("POST", path, NULL, body);
    cr_assert_eq(r.status, 200, "%s %s: %ld %s", path, body, r.status, r.body);
    cJSON *j = harness_json(&r);
    harness_reply_free(&r);
    return j;
}

void harness_expect_400(const char *path, const char *body, const char *param, const char *word)
{
    struct harness_reply r = harness_req("POST", path, NULL, body);
    cr_expect_eq(r.status, 400, "%s: %ld %s", body, r.status, r.body);
    cJSON *j = harness_json(&r), *e = cJSON_GetObjectItem(j, "error");
    cJSON *p = cJSON_GetObjectItem(e, "param"), *m = cJSON_GetObjectItem(e, "message");
    cr_expect(cJSON_IsString(p) && !strcmp(p->valuestring, param), "%s: param is not %s: %s", body, param, r.body);
    if (word) cr_expect(cJSON_IsString(m) && strstr(m->valuestring, word), "%s: message does not name %s", body, word);
    cJSON_Delete(j);
    harness_reply_free(&r);
}

char *harness_header(const struct harness_reply *r, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = r->headers; l && *l;) {
        const char *e = strstr(l, "\r\n");
        if (!e) e = l + strlen(l);
        if ((size_t)(e - l) > nl && !strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ') v++;
            return strndup(v, (size_t)(e - v));
        }
        l = *e ? e + 2 : e;
    }
    return NULL;
}

void harness_start(const char *extra_cfg)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    port = e2e_free_port();
    snprintf(cfg_path, sizeof cfg_path, "/tmp/tide-e2e-h%d.json", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    fprintf(f, "{\"model\":\"%s\",\"context\":1024%s%s}", model, extra_cfg ? "," : "", extra_cfg ? extra_cfg : "");
    fclose(f);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        execl(bin, bin, "--config", cfg_path, "--port", ps, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        struct harness_reply r = harness_req("GET", "/health", NULL, NULL);
        harness_reply_free(&r);
        if (r.status == 200) return;
        usleep(100000);
    }
    cr_assert_fail("daemon did not become healthy");
}

void harness_stop(void)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        double t0 = e2e_now();
        while (waitpid(pid, &st, WNOHANG) == 0) {
            if (e2e_now() - t0 > 10) { kill(pid, SIGKILL); waitpid(pid, &st, 0); cr_assert_fail("no exit after SIGTERM"); }
            usleep(50000);
        }
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status");
    }
    unlink(cfg_path);
    pid = 0;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

char *harness_json_string(const char *from, const char *key, size_t *len, const char **end)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(from, pat);
    if (!p) return NULL;
    p += strlen(pat);
    char *out = malloc(strlen(p) + 1);
    size_t n = 0;
    while (*p && *p != '"') {
        if (*p != '\\') { out[n++] = *p++; continue; }
        p++;
        char c = *p++;
        if (c == 'u') {
            int cp = hex4(p);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(p + 2) - 0xDC00);
                p += 6;
            }
            if (cp < 0x80) out[n++] = (char)cp;
            else if (cp < 0x800) { out[n++] = (char)(0xC0 | cp >> 6); out[n++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) {
                out[n++] = (char)(0xE0 | cp >> 12); out[n++] = (char)(0x80 | (cp >> 6 & 63)); out[n++] = (char)(0x80 | (cp & 63));
            } else {
                out[n++] = (char)(0xF0 | cp >> 18); out[n++] = (char)(0x80 | (cp >> 12 & 63));
                out[n++] = (char)(0x80 | (cp >> 6 & 63)); out[n++] = (char)(0x80 | (cp & 63));
            }
        } else {
            out[n++] = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
        }
    }
    out[n] = 0;
    *len = n;
    if (end) *end = *p ? p + 1 : p;
    return out;
}
