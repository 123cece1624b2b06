/* req_harness.c - see harness.h. */
#include "req_harness.h"

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

struct harness_reply harness_req(const char *method, const char *path, const char *const *hdrs, const char *body)
{
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct buf b = { calloc(1, 1), 0 }, h = { calloc(1, 1), 0 };
    struct curl_slist *hl = NULL;
    if (!strcmp(method, "POST")) hl = curl_slist_append(hl, "Content-Type: application/json");
    for (int i = 0; hdrs && hdrs[i]; i++) hl = curl_slist_append(hl, hdrs[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    struct harness_reply r = { 0 };
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    r.body = b.p; /* after the transfer: sink reallocs them */
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
    port = free_port();
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
