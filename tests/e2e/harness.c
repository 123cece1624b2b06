/* harness.c - see harness.h. */
#include "harness.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double e2e_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int e2e_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bind(s, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &l);
    close(s);
    return ntohs(a.sin_port);
}

int e2e_connect(const struct daemon *d, const char *from)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return -1;
    if (from) {
        struct sockaddr_in b = { .sin_family = AF_INET };
        inet_pton(AF_INET, from, &b.sin_addr);
        if (bind(s, (struct sockaddr *)&b, sizeof b)) { close(s); return -1; }
    }
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)d->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { close(s); return -1; }
    return s;
}

/* e2e_raw and e2e_raw_stamped: with t_first, the socket asks for the kernel's receive time of
 * each segment (SO_TIMESTAMPNS) and *t_first gets the first one's. */
static char *raw_io(const struct daemon *d, const char *from, const void *bytes, size_t len, double timeout_s,
                    bool *closed, double *t_first)
{
    size_t cap = 65536, n = 0;
    char *resp = calloc(1, cap);
    if (closed) *closed = false;
    if (t_first) *t_first = 0;
    int s = e2e_connect(d, from);
    if (s < 0) return resp;
    int on = 1;
    if (t_first && setsockopt(s, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on)) {
        close(s);
        return resp;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = send(s, (const char *)bytes + off, len - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    for (;;) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0) break;
        if (n + 1 >= cap) resp = realloc(resp, cap *= 2);
        struct iovec io = { .iov_base = resp + n, .iov_len = cap - n - 1 };
        union { char b[CMSG_SPACE(sizeof(struct timespec))]; struct cmsghdr align; } ctl;
        struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b };
        ssize_t r = recvmsg(s, &m, 0);
        if (r <= 0) { if (closed) *closed = true; break; }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); t_first && !*t_first && c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                *t_first = ts.tv_sec + ts.tv_nsec * 1e-9;
            }
        n += (size_t)r;
    }
    resp[n] = 0;
    close(s);
    return resp;
}

char *e2e_raw(const struct daemon *d, const char *from, const void *bytes, size_t len, double timeout_s,
              bool *closed)
{
    return raw_io(d, from, bytes, len, timeout_s, closed, NULL);
}

char *e2e_raw_stamped(const struct daemon *d, const void *bytes, size_t len, double timeout_s, double *t_first)
{
    return raw_io(d, NULL, bytes, len, timeout_s, NULL, t_first);
}

int e2e_status(const char *resp)
{
    int code = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1) return 0;
    return code;
}

static int health(const struct daemon *d)
{
    const char rq[] = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    char *r = e2e_raw(d, NULL, rq, sizeof rq - 1, 2, NULL);
    int code = e2e_status(r);
    free(r);
    return code;
}

void e2e_start(struct daemon *d, const char *extra_cfg, const char *const *argv_extra)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    const char *model = getenv("TIDE_MODEL") ? getenv("TIDE_MODEL") : "models/tide-moe.gguf";
    d->port = e2e_free_port();
    snprintf(d->cfg_path, sizeof d->cfg_path, "/tmp/tide-e2e-%d-%d.json", (int)getpid(), d->port);
    FILE *f = fopen(d->cfg_path, "w");
    cr_assert(f, "cannot write %s", d->cfg_path);
    fprintf(f, "{\"model\":\"%s\",\"context\":1024,\"port\":%d%s%s}", model, d->port, extra_cfg ? "," : "",
            extra_cfg ? extra_cfg : "");
    fclose(f);
    const char *argv[16] = { bin, "--config", d->cfg_path };
    int argc = 3;
    for (int i = 0; argv_extra && argv_extra[i] && argc < 15; i++) argv[argc++] = argv_extra[i];
    d->pid = fork();
    if (d->pid == 0) {
        /* Never outlive the test: a failed or timed-out test ends without its .fini. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        if (d->env) putenv((char *)d->env);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        if (health(d) == 200) return;
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            cr_assert_fail("daemon exited at start-up (status %d), config %s", st, extra_cfg ? extra_cfg : "{}");
        }
        usleep(50000);
    }
    cr_assert_fail("daemon did not become healthy");
}

void e2e_stop(struct daemon *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        int st;
        double t0 = e2e_now();
        while (waitpid(d->pid, &st, WNOHANG) == 0) {
            if (e2e_now() - t0 > 10) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &st, 0);
                cr_assert_fail("no exit after SIGTERM");
            }
            usleep(20000);
        }
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon exit status %d", st);
    }
    unlink(d->cfg_path);
    d->pid = 0;
}
