/* http.c - libmicrohttpd glue: routing, limits, auth, error bodies, SSE streaming.
 *
 * Threading: one thread per connection (MHD_USE_THREAD_PER_CONNECTION). That is the
 * simplest correct scheme here: a handler may block while its job waits in the FIFO,
 * and an SSE reader may block on the job's condition variable (2 s at a time, sending a
 * keep-alive comment in between) without stalling other clients. The engine thread never
 * touches a connection. */
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct http_server {
    struct MHD_Daemon *d;
    const struct http_route *routes;
    int n_routes;
    void *app;
    char *api_key;
};

/* Per-request state (MHD's con_cls). */
struct req_state {
    char *body;
    size_t len, cap;
    bool too_big;
    const char *endpoint;     /* for metrics */
    struct job *job;          /* streaming: cancelled when the connection ends badly */
    struct MHD_Connection *conn;
};

void http_error(struct http_response *rs, int status, const char *type, const char *message,
                const char *param, const char *code)
{
    free(rs->body);
    rs->status = status;
    rs->body = openai_error_json(message, type, param, code);
    rs->content_type = "application/json";
}

const char *http_header(const struct http_request *rq, const char *name)
{
    return rq->conn ? MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name) : NULL;
}

bool http_client_gone(const struct http_request *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = { .fd = ci->connect_fd, .events = POLLRDHUP };
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static enum MHD_Result send_resp(struct MHD_Connection *c, struct req_state *st,
                                 struct http_response *rs, const char *allow)
{
    const char *body = rs->body ? rs->body : "";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(rs->body);
    rs->body = NULL;
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", rs->content_type ? rs->content_type : "application/json");
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (rs->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", rs->retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    metrics_request(st->endpoint, rs->status);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)rs->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void send_error(struct MHD_Connection *c, struct req_state *st, int status, const char *type,
                       const char *msg, const char *allow)
{
    struct http_response rs = { 0 };
    http_error(&rs, status, type, msg, NULL, NULL);
    send_resp(c, st, &rs, allow);
}

/* SSE reader: runs on the connection thread, blocks up to 2 s for job output. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req_state *st = cls;
    (void)pos;
    for (;;) {
        long n = job_read(st->job, buf, max, 2.0);
        if (n > 0) return n;
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        /* Nothing for 2 s (waiting in the queue, or a slow prompt): keep the client and
         * any proxy from timing out, and learn early that the client left. */
        static const char ka[] = ": keep-alive\n\n";
        if (max < sizeof ka - 1) continue;
        memcpy(buf, ka, sizeof ka - 1);
        return (ssize_t)(sizeof ka - 1);
    }
}

static bool key_ok(const char *want, const char *auth)
{
    /* The scheme name is case-insensitive (RFC 9110 11.1); the key itself is not. */
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) return false;
    const char *got = auth + 7;
    size_t lw = strlen(want), lg = strlen(got);
    /* Constant time over the expected key: no early exit on the first difference. */
    unsigned char diff = (unsigned char)(lw != lg);
    for (size_t i = 0; i < lw; i++) diff |= (unsigned char)(want[i] ^ (i < lg ? got[i] : 0));
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct http_server *s = cls;
    struct req_state *st = *con_cls;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st) return MHD_NO;
        st->conn = c;
        st->endpoint = "other";
        *con_cls = st;
        for (int i = 0; i < s->n_routes; i++)
            if (strcmp(s->routes[i].path, url) == 0) st->endpoint = s->routes[i].path;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > HTTP_MAX_BODY) {
            /* Answer before reading a byte of it. */
            send_error(c, st, 413, "invalid_request_error", "request body is larger than 32 MiB", NULL);
            return MHD_YES;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!st->too_big && st->len + *upload_size > HTTP_MAX_BODY) {
            st->too_big = true;
            free(st->body);
            st->body = NULL;
            st->len = st->cap = 0;
        }
        if (!st->too_big) {
            if (st->len + *upload_size + 1 > st->cap) {
                size_t nc = st->cap ? st->cap : 65536;
                while (nc < st->len + *upload_size + 1) nc *= 2;
                char *nb = realloc(st->body, nc);
                if (!nb) return MHD_NO;
                st->body = nb;
                st->cap = nc;
            }
            memcpy(st->body + st->len, upload, *upload_size);
            st->len += *upload_size;
            st->body[st->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->too_big) {
        send_error(c, st, 413, "invalid_request_error", "request body is larger than 32 MiB", NULL);
        return MHD_YES;
    }
    const struct http_route *route = NULL;
    char allow[64] = "";
    for (int i = 0; i < s->n_routes; i++) {
        if (strcmp(s->routes[i].path, url) != 0) continue;
        if (strcmp(s->routes[i].method, method) == 0) route = &s->routes[i];
        size_t l = strlen(allow);
        snprintf(allow + l, sizeof allow - l, "%s%s", l ? ", " : "", s->routes[i].method);
    }
    if (!route && allow[0]) {
        char m[128];
        snprintf(m, sizeof m, "method %s is not allowed on %s", method, url);
        send_error(c, st, 405, "invalid_request_error", m, allow);
        return MHD_YES;
    }
    if (!route) {
        char m[256];
        snprintf(m, sizeof m, "unknown path %.200s", url);
        send_error(c, st, 404, "invalid_request_error", m, NULL);
        return MHD_YES;
    }
    if (s->api_key && strncmp(url, "/v1/", 4) == 0 &&
        !key_ok(s->api_key, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
        struct http_response rs = { 0 };
        http_error(&rs, 401, "invalid_request_error", "invalid or missing API key", NULL, "invalid_api_key");
        send_resp(c, st, &rs, NULL);
        return MHD_YES;
    }
    if (strcmp(method, "POST") == 0) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        /* A prefix match alone would take application/json-patch+json or application/jsonx. */
        if (!ct || strncasecmp(ct, "application/json", 16) != 0 ||
            (ct[16] && ct[16] != ';' && ct[16] != ' ' && ct[16] != '\t')) {
            send_error(c, st, 415, "invalid_request_error", "Content-Type must be application/json", NULL);
            return MHD_YES;
        }
    }
    struct http_request rq = { method, url, st->body ? st->body : "", st->len, c };
    struct http_response rs = { .status = 200 };
    route->fn(s->app, &rq, &rs);
    if (!rs.stream) return send_resp(c, st, &rs, NULL);
    st->job = rs.stream;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, st, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    metrics_request(st->endpoint, 200);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct req_state *st = *con_cls;
    if (!st) return;
    if (st->job) {
        /* Anything but a clean finish means the client is gone: stop generating. */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) job_cancel(st->job);
        job_unref(st->job);
    }
    free(st->body);
    free(st);
    *con_cls = NULL;
}

int http_start(struct http_server **out, const char *host, int port, const struct http_route *routes,
               int n_routes, void *app, const char *api_key, char *err, size_t errlen)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g || !ai) {
        snprintf(err, errlen, "http: cannot resolve host %s: %s", host, gai_strerror(g));
        return TIDE_EINVAL;
    }
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) { freeaddrinfo(ai); return TIDE_ENOMEM; }
    s->routes = routes;
    s->n_routes = n_routes;
    s->app = app;
    s->api_key = api_key ? strdup(api_key) : NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                     MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, errlen, "http: cannot listen on %s:%d (in use or not permitted)", host, port);
        free(s->api_key);
        free(s);
        return TIDE_EIO;
    }
    *out = s;
    return 0;
}

void http_quiesce(struct http_server *s)
{
    if (s && s->d) MHD_quiesce_daemon(s->d);
}

void http_stop(struct http_server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    free(s->api_key);
    free(s);
}
