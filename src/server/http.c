/* http.c - libmicrohttpd glue: routing, limits, auth, error bodies, SSE streaming.
 *
 * Threading: MHD's internal polling threads (a pool of HTTP_POLLING_THREADS, each polling
 * its share of the connections with poll(), never epoll: see http_start) run every handler, with
 * MHD_ALLOW_SUSPEND_RESUME. Handlers never block on the engine: a
 * request that needs the engine queues a job and its connection is suspended; the job's
 * notify hook (output, start, finish, cancel; fifo.c calls it from the engine thread)
 * resumes it. SSE readers return what the job has, or suspend and return 0. One small
 * watch thread (every 50 ms) polls the sockets of suspended connections for a hang-up
 * (cancel: the engine stops at the next token), resumes idle streams every 2 s for a
 * `: keep-alive` comment, and enforces the queue/run timeouts. The engine thread never
 * touches a socket. */
#include "server/http.h"
#include "server/http_guard.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "memory/host_budget.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct req_state;

struct http_server {
    struct MHD_Daemon *d;
    const struct http_route *routes;
    int n_routes;
    void *app;
    char *api_key;
    char *instance;           /* X-Tide-Instance; NULL: none */
    char **hosts;             /* http_options.allowed_hosts, copied */
    int n_hosts;
    bool check_host;          /* listening on loopback, or hosts given */
    char **cors;              /* allowed browser origins ("*": any); none: no CORS at all */
    atomic_int n_cors;        /* published last: set after http_start, read by the pollers */
    double queue_s, run_s;    /* bounded waits; 0 = none */
    pthread_mutex_t mu;       /* guards the list; taken before any job's mu */
    struct req_state *head;   /* requests attached to a job */
    pthread_t watch;
    bool watching;
    atomic_bool stop;
    atomic_bool quiesced;     /* shutting down: streams cut short end with an error event */
};

/* Per-request state (MHD's con_cls). */
struct req_state {
    char *body;
    size_t len, cap;          /* cap bytes are charged to request_budget */
    bool too_big;
    uint64_t seen;            /* body bytes received, kept or not */
    bool close;               /* answer with Connection: close (bad framing) */
    bool over_budget;         /* request_budget had no room for the body: 503 */
    const char *endpoint;     /* for metrics */
    struct job *job;          /* stream or wait: cancelled when the connection ends badly */
    struct MHD_Connection *conn;
    struct http_server *srv;
    void (*done)(void *app, struct job *j, struct http_response *rs); /* wait jobs */
    struct req_state *prev, *next;
    /* guarded by job->mu: */
    bool suspended, ka_due, tmo_sent, shut_sent;
    char tmo[96];             /* set: the job timed out; this is what it waited for */
    double t_out;             /* last bytes handed to MHD (keep-alive clock) */
    int fd;
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

/* Free the request body and give its memory back to the request budget. */
static void body_drop(struct req_state *st)
{
    free(st->body);
    host_budget_release(&request_budget, st->cap);
    st->body = NULL;
    st->len = st->cap = 0;
}

/* The request's Origin when the config allows it cross-origin, else NULL. */
static const char *cors_origin(const struct http_server *s, struct MHD_Connection *c)
{
    const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    int n = atomic_load(&s->n_cors);
    for (int i = 0; o && i < n; i++)
        if (!strcmp(s->cors[i], "*") || !strcmp(s->cors[i], o)) return o;
    return NULL;
}

/* Access-Control-Allow-Origin on every answer to an allowed origin (the browser then lets the
 * page read it); Vary, since the header depends on the Origin sent. */
static void add_cors(const struct http_server *s, struct MHD_Connection *c, struct MHD_Response *r)
{
    const char *o = cors_origin(s, c);
    if (!o) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", o);
    MHD_add_response_header(r, "Vary", "Origin");
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
    if (st->srv->instance) MHD_add_response_header(r, "X-Tide-Instance", st->srv->instance);
    if (st->close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    add_cors(st->srv, c, r);
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

/* job->notify: wake the connection if it sleeps (called with job->mu held). */
static void wake(void *arg)
{
    struct req_state *st = arg;
    if (st->suspended) {
        st->suspended = false;
        MHD_resume_connection(st->conn);
    }
}

static void attach(struct req_state *st, struct job *j)
{
    st->job = j;
    st->t_out = tide_now();
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&st->srv->mu);
    st->next = st->srv->head;
    if (st->next) st->next->prev = st;
    st->srv->head = st;
    pthread_mutex_unlock(&st->srv->mu);
    pthread_mutex_lock(&j->mu);
    j->notify = wake;
    j->notify_arg = st;
    pthread_mutex_unlock(&j->mu);
}

static void detach(struct req_state *st)
{
    struct http_server *s = st->srv;
    pthread_mutex_lock(&s->mu);
    if (st->prev) st->prev->next = st->next;
    else if (s->head == st) s->head = st->next;
    if (st->next) st->next->prev = st->prev;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&st->job->mu);
    st->job->notify = NULL;
    pthread_mutex_unlock(&st->job->mu);
}

/* SSE reader, on the polling thread: hand over what the job has; with nothing, suspend and
 * return 0 (the documented way; wake() or the watch thread resumes). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req_state *st = cls;
    struct job *j = st->job;
    (void)pos;
    ssize_t r;
    pthread_mutex_lock(&j->mu);
    if (st->tmo_sent || st->shut_sent) {
        r = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (st->tmo[0]) {
        char *e = openai_error_json(st->tmo, "server_error", NULL, "timeout");
        int n = snprintf(buf, max, "data: %s\n\ndata: [DONE]\n\n", e ? e : "{}");
        free(e);
        st->tmo_sent = true;
        r = n > 0 && (size_t)n < max ? n : MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->rd < j->len) {
        r = (ssize_t)job_take_locked(j, buf, max);
    } else if (!st->shut_sent && atomic_load(&st->srv->quiesced) &&
               (j->done ? j->status == 499 || j->status == 503 : job_cancelled(j))) {
        /* Cut short by the shutdown (a finished or failed job wrote its own end): say so. */
        char *e = openai_error_json("server is shutting down", "server_error", NULL, "shutdown");
        int n = snprintf(buf, max, "data: %s\n\ndata: [DONE]\n\n", e ? e : "{}");
        free(e);
        st->shut_sent = true;
        r = n > 0 && (size_t)n < max ? n : MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->done || job_cancelled(j)) {
        r = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (st->ka_due && max >= 14) {
        /* Waiting in the queue or on a slow prompt: keep the client and proxies patient. */
        memcpy(buf, ": keep-alive\n\n", 14);
        r = 14;
    } else {
        st->suspended = true;
        MHD_suspend_connection(st->conn);
        r = 0;
    }
    st->ka_due = false;
    if (r > 0) st->t_out = tide_now();
    pthread_mutex_unlock(&j->mu);
    return r;
}

/* The watch thread: hang-ups, keep-alives and timeouts of suspended connections. */
static void *watch_main(void *arg)
{
    struct http_server *s = arg;
    while (!atomic_load(&s->stop)) {
        usleep(50000);
        double now = tide_now();
        pthread_mutex_lock(&s->mu);
        for (struct req_state *st = s->head; st; st = st->next) {
            struct job *j = st->job;
            bool cancel = false;
            pthread_mutex_lock(&j->mu);
            if (st->suspended && !j->done) {
                struct pollfd p = { .fd = st->fd, .events = POLLRDHUP };
                if (st->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
                    cancel = true; /* the client left: the engine stops at its next token */
                double lim = j->started ? s->run_s : s->queue_s;
                if (!cancel && !st->tmo[0] && lim > 0 && now - j->t_enqueue > lim) {
                    snprintf(st->tmo, sizeof st->tmo, "timed out after %g s waiting %s", lim,
                             j->started ? "for the engine to finish the request" : "in the queue");
                    cancel = true;
                }
                if (!cancel && !st->done && now - st->t_out >= 2.0) {
                    st->ka_due = true;
                    wake(st);
                }
            }
            pthread_mutex_unlock(&j->mu);
            if (cancel) job_cancel(j); /* notify resumes it */
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* A wait job's connection came back (or never slept): answer when it is done. */
static enum MHD_Result finish_wait(struct http_server *s, struct MHD_Connection *c, struct req_state *st)
{
    struct job *j = st->job;
    pthread_mutex_lock(&j->mu);
    if (!j->done && !st->tmo[0]) {
        st->suspended = true;
        MHD_suspend_connection(c);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    struct http_response rs = { .status = 200 };
    if (st->tmo[0]) http_error(&rs, 503, "server_error", st->tmo, NULL, "timeout");
    else st->done(s->app, j, &rs);
    st->done = NULL;
    return send_resp(c, st, &rs, NULL);
}

/* A CORS preflight (OPTIONS on a known path): 204 with the Allow-* headers for an allowed
 * origin, 403 and no CORS header for any other. It needs no API key: browsers send none. */
static void preflight(struct MHD_Connection *c, struct req_state *st, const char *allow)
{
    if (!cors_origin(st->srv, c)) {
        send_error(c, st, 403, "invalid_request_error",
                   "cross-origin requests from this Origin are not allowed (config: cors_origins)", NULL);
        return;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return;
    char methods[80];
    snprintf(methods, sizeof methods, "%s, OPTIONS", allow);
    const char *hdrs = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    add_cors(st->srv, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs && hdrs[0] ? hdrs : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    metrics_request(st->endpoint, 204);
    MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
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
    if (st && st->done) return finish_wait(s, c, st);
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st) return MHD_NO;
        st->conn = c;
        st->srv = s;
        st->fd = -1;
        st->endpoint = "other";
        *con_cls = st;
        for (int i = 0; i < s->n_routes; i++)
            if (strcmp(s->routes[i].path, url) == 0) st->endpoint = s->routes[i].path;
        /* Headers are in, no byte of the body read: refuse what a proxy could read otherwise. */
        const char *bad_framing = http_guard_framing(c, version);
        if (bad_framing) {
            st->close = true;
            send_error(c, st, 400, "invalid_request_error", bad_framing, NULL);
            return MHD_YES;
        }
        /* DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends
         * Host: evil.example. /health stays open to any Host: health checkers send what they
         * like, and it tells nothing. */
        if (s->check_host && strcmp(url, "/health") != 0 &&
            !http_guard_host_allowed(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
                                     (const char *const *)s->hosts, s->n_hosts)) {
            struct http_response rs = { 0 };
            st->close = true;
            http_error(&rs, 403, "invalid_request_error",
                       "Host is not served here (a loopback name, or one in http.allowed_hosts)", NULL,
                       "host_not_allowed");
            send_resp(c, st, &rs, NULL);
            return MHD_YES;
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > HTTP_MAX_BODY) {
            /* Answer before reading a byte of it. */
            send_error(c, st, 413, "invalid_request_error", "request body is larger than 32 MiB", NULL);
            return MHD_YES;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        /* Only a chunked body can pass the limit here (a Content-Length over it was answered
         * 413 before the body). MHD takes no answer in mid-body, so the rest is read and
         * dropped, and answered 413 at its end; but only up to twice the limit: past that
         * the connection is closed, or a client could keep the reading going for ever. */
        st->seen += *upload_size;
        if (st->seen > 2 * (uint64_t)HTTP_MAX_BODY) {
            tide_log("http: chunked request body over 64 MiB, connection closed");
            metrics_request(st->endpoint, 413);
            return MHD_NO;
        }
        if (!st->too_big && st->len + *upload_size > HTTP_MAX_BODY) {
            st->too_big = true;
            body_drop(st);
        }
        if (!st->too_big && !st->over_budget) {
            if (st->len + *upload_size + 1 > st->cap) {
                size_t nc = st->cap ? st->cap : 65536;
                while (nc < st->len + *upload_size + 1) nc *= 2;
                /* the body is charged to the request budget before it is allocated */
                if (!host_budget_charge(&request_budget, nc - st->cap)) {
                    st->over_budget = true;
                    body_drop(st);
                    *upload_size = 0;
                    return MHD_YES;
                }
                char *nb = realloc(st->body, nc);
                if (!nb) { host_budget_release(&request_budget, nc - st->cap); return MHD_NO; }
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
    if (st->over_budget) {
        struct http_response rs = { 0 };
        http_error(&rs, 503, "server_error", "server is out of request memory (request_memory_mib), retry later",
                   NULL, NULL);
        rs.retry_after = 1;
        send_resp(c, st, &rs, NULL);
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
    if (strcmp(method, "OPTIONS") == 0 && allow[0]) {
        preflight(c, st, allow);
        return MHD_YES;
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
    if (s->api_key && (strncmp(url, "/v1/", 4) == 0 || strcmp(url, "/metrics") == 0) &&
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
    body_drop(st);   /* handlers keep what they need (parsed): not held while queued */
    if (rs.wait) {
        st->done = rs.done;
        attach(st, rs.wait);
        return finish_wait(s, c, st);
    }
    if (!rs.stream) return send_resp(c, st, &rs, NULL);
    attach(st, rs.stream);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, st, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    if (s->instance) MHD_add_response_header(r, "X-Tide-Instance", s->instance);
    add_cors(s, c, r);
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
        detach(st);
        /* Anything but a clean finish means the client is gone: stop generating. */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) job_cancel(st->job);
        job_unref(st->job);
    }
    body_drop(st);
    free(st);
    *con_cls = NULL;
}

/* Polling threads, each with its share of the connections. One would do
 * for the JSON, but an image request decodes its image in the handler (up to the pixel limit,
 * a second or so): with a few threads that stalls only the connections on its thread. */
#define HTTP_POLLING_THREADS 4

static void free_server(struct http_server *s)
{
    pthread_mutex_destroy(&s->mu);
    for (int i = 0; i < s->n_hosts; i++) free(s->hosts[i]);
    free(s->hosts);
    free(s->api_key);
    free(s->instance);
    for (char **o = s->cors; o && *o; o++) free(*o);
    free(s->cors);
    free(s);
}

int http_start(struct http_server **out, const char *host, int port, const struct http_route *routes,
               int n_routes, void *app, const struct http_options *opt, char *err, size_t errlen)
{
    static const struct http_options none = { 0 };
    if (!opt) opt = &none;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    if (!opt->no_listen) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        int g = getaddrinfo(host, ps, &hints, &ai);
        if (g || !ai) {
            snprintf(err, errlen, "http: cannot resolve host %s: %s", host, gai_strerror(g));
            return TIDE_EINVAL;
        }
    }
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) { if (ai) freeaddrinfo(ai); return TIDE_ENOMEM; }
    s->routes = routes;
    s->n_routes = n_routes;
    s->app = app;
    s->api_key = opt->api_key ? strdup(opt->api_key) : NULL;
    /* fixed before any thread of ours or MHD's reads them */
    s->instance = opt->instance ? strdup(opt->instance) : NULL;
    s->queue_s = opt->queue_timeout_s;
    s->run_s = opt->request_timeout_s;
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->stop, false);
    atomic_init(&s->quiesced, false);
    if (opt->n_allowed_hosts > 0) {
        s->hosts = calloc((size_t)opt->n_allowed_hosts, sizeof *s->hosts);
        for (int i = 0; s->hosts && i < opt->n_allowed_hosts; i++)
            if ((s->hosts[s->n_hosts] = strdup(opt->allowed_hosts[i]))) s->n_hosts++;
        if (s->n_hosts != opt->n_allowed_hosts) { free_server(s); if (ai) freeaddrinfo(ai); return TIDE_ENOMEM; }
    }
    s->check_host = opt->allowed_hosts || (ai && http_guard_addr_is_loopback(ai->ai_addr));
    /* poll(), not epoll: with epoll, MHD_quiesce_daemon (SIGTERM's drain) races the polling
     * threads for removing the listen socket from their epoll sets, and the loser's epoll_ctl
     * gets ENOENT, which libmicrohttpd 0.9.75 answers with MHD_PANIC: "Failed to remove listen
     * FD from epoll set", the process aborted instead of exiting 0 (seen once in CI's
     * test_batching.py; an open libmicrohttpd defect). With poll() the drain wakes each thread
     * through its inter-thread channel instead. The pool keeps each thread's set small. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES ? MHD_USE_POLL : 0);
    if (ai && ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* The fuzzer's mode: a thread per added connection, polling level-triggered, which sees
     * the client's EOF after a partial request at once (edge-triggered epoll waits for the
     * idle timeout), and never misses a socket added from another thread. */
    if (opt->no_listen)
        flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                MHD_ALLOW_SUSPEND_RESUME | MHD_USE_NO_LISTEN_SOCKET;
    /* Connection limits (issue 27): without them 1,100 idle sockets from one client took all
     * of MHD's 1,020 and held them for its 600 s timeout. An option left 0 is not passed.
     * A suspended connection (queued, or waiting on the engine) has no idle clock, and MHD
     * restarts the clock when it resumes, so the idle timeout never cuts a live request. */
    struct MHD_OptionItem lim[4];
    int nl = 0;
    if (opt->max_connections)
        lim[nl++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_LIMIT, opt->max_connections, NULL };
    if (opt->max_connections_per_ip)
        lim[nl++] = (struct MHD_OptionItem){ MHD_OPTION_PER_IP_CONNECTION_LIMIT, opt->max_connections_per_ip, NULL };
    lim[nl++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_TIMEOUT, opt->idle_timeout_s, NULL };
    lim[nl] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai ? ai->ai_addr : NULL,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_THREAD_POOL_SIZE, opt->no_listen ? 0u : (unsigned)HTTP_POLLING_THREADS,
                            MHD_OPTION_ARRAY, lim,
                            MHD_OPTION_END);
    if (ai) freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, errlen, "http: cannot listen on %s:%d (in use or not permitted)", host, port);
        free_server(s);
        return TIDE_EIO;
    }
    s->watching = pthread_create(&s->watch, NULL, watch_main, s) == 0;
    if (!s->watching) {
        snprintf(err, errlen, "http: cannot start the watch thread");
        MHD_stop_daemon(s->d);
        free_server(s);
        return TIDE_ENOMEM;
    }
    *out = s;
    return 0;
}

int http_add_connection(struct http_server *s, int fd, const struct sockaddr *addr, unsigned addrlen)
{
    return MHD_add_connection(s->d, fd, addr, (socklen_t)addrlen) == MHD_YES ? 0 : TIDE_EIO;
}

int http_set_cors(struct http_server *s, char *const *origins, int n)
{
    s->cors = calloc((size_t)n + 1, sizeof *s->cors); /* NULL-terminated */
    if (!s->cors) return TIDE_ENOMEM;
    for (int i = 0; i < n; i++)
        if (!(s->cors[i] = strdup(origins[i]))) return TIDE_ENOMEM; /* http_stop frees them */
    atomic_store(&s->n_cors, n);
    return 0;
}

void http_quiesce(struct http_server *s)
{
    if (!s) return;
    atomic_store(&s->quiesced, true);
    if (s->d) MHD_quiesce_daemon(s->d);
}

void http_stop(struct http_server *s)
{
    if (!s) return;
    atomic_store(&s->stop, true);
    if (s->watching) pthread_join(s->watch, NULL);
    /* MHD must not be stopped with suspended connections: wake them all (their jobs are
     * cancelled by now, so each answers and ends). */
    pthread_mutex_lock(&s->mu);
    for (struct req_state *st = s->head; st; st = st->next) {
        pthread_mutex_lock(&st->job->mu);
        wake(st);
        pthread_mutex_unlock(&st->job->mu);
    }
    pthread_mutex_unlock(&s->mu);
    /* Let them write their last bytes (an answer, a stream's error event and [DONE]) before
     * the connections are closed: at most 3 s, a client that does not read is cut off. */
    for (int i = 0; i < 300; i++) {
        pthread_mutex_lock(&s->mu);
        bool any = s->head != NULL;
        pthread_mutex_unlock(&s->mu);
        if (!any) break;
        usleep(10000);
    }
    if (s->d) MHD_stop_daemon(s->d);
    free_server(s);
}
