/* curl_harness.c - the shared end-to-end test harness; see harness.h. */
#include "curl_harness.h"

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

int ch_port(void) { return port; }

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

static size_t sink(char *d, size_t sz, size_t nm, void *ud)
{
    struct ch_reply *r = ud;
    char *nb = realloc(r->body, r->len + sz * nm + 1);
    if (!nb) return 0;
    r->body = nb;
    memcpy(r->body + r->len, d, sz * nm);
    r->len += sz * nm;
    r->body[r->len] = 0;
    return sz * nm;
}

static size_t header_sink(char *d, size_t sz, size_t nm, void *ud)
{
    struct ch_reply *r = ud;
    size_t n = sz * nm;
    if (n > 12 && strncasecmp(d, "Retry-After:", 12) == 0) {
        size_t i = 12;
        while (i < n && d[i] == ' ') i++;
        size_t k = 0;
        while (i < n && d[i] != '\r' && d[i] != '\n' && k + 1 < sizeof r->retry_after) r->retry_after[k++] = d[i++];
        r->retry_after[k] = 0;
    }
    return n;
}

struct ch_reply ch_request(const char *method, const char *path, const char *body, size_t body_len,
                             const char *hdr)
{
    struct ch_reply r = { 0, calloc(1, 1), 0, "" };
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
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
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_sink);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return r;
}

struct ch_reply ch_post(const char *path, const char *json)
{
    return ch_request("POST", path, json, strlen(json), NULL);
}

void ch_reply_free(struct ch_reply *r)
{
    free(r->body);
    r->body = NULL;
}

void ch_start(const char *extra_cfg)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    port = free_port();
    snprintf(cfg_path, sizeof cfg_path, "/tmp/tide-e2e-h-%d.json", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    cr_assert(f, "cannot write %s", cfg_path);
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
        struct ch_reply r = ch_request("GET", "/health", NULL, 0, NULL);
        long st = r.status;
        ch_reply_free(&r);
        if (st == 200) return;
        usleep(50000);
    }
    cr_assert_fail("daemon did not become healthy");
}

void ch_stop(void)
{
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st;
        double t0 = now();
        while (waitpid(pid, &st, WNOHANG) == 0) {
            if (now() - t0 > 10) { kill(pid, SIGKILL); waitpid(pid, &st, 0); cr_assert_fail("no exit after SIGTERM"); }
            usleep(20000);
        }
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status %d", st);
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

char *ch_json_string(const char *from, const char *key, size_t *len, const char **end)
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
