/* http.h - the HTTP front: libmicrohttpd, a route table, body limits, API key, and
 * OpenAI-shaped error replies. Handlers run on MHD's one polling thread and must not
 * block: they answer at once, or queue a job and hand it back (stream or wait) so that
 * http.c suspends the connection until the job has something to say. */
#ifndef TIDE_HTTP_H
#define TIDE_HTTP_H

#include "common.h"
#include "server/fifo.h"

#define HTTP_MAX_BODY (32u * 1024 * 1024)

struct MHD_Connection;
struct sockaddr;

struct http_request {
    const char *method, *path;
    const char *body;         /* NUL-terminated, body_len bytes */
    size_t body_len;
    struct MHD_Connection *conn;
};

struct http_response {
    int status;               /* default 200 */
    char *body;               /* malloc'd; freed by http.c */
    const char *content_type; /* default application/json */
    int retry_after;          /* >0: Retry-After header */
    struct job *stream;       /* set: SSE response read from this job (http.c takes the ref) */
    /* set: wait (suspended, not blocking) until this job is done, then call done() to fill
     * the response; http.c takes the ref, cancels it when the client leaves */
    struct job *wait;
    void (*done)(void *app, struct job *j, struct http_response *rs);
};

typedef void (*http_handler_fn)(void *app, const struct http_request *rq, struct http_response *rs);

struct http_route {
    const char *method, *path;
    http_handler_fn fn;
};

/* What http_start takes besides the address and routes (zeroes: no key, MHD's defaults). */
struct http_options {
    const char *api_key;            /* NULL: no key; else the /v1/ paths and /metrics need it */
    unsigned max_connections;       /* 0: libmicrohttpd's default */
    unsigned max_connections_per_ip; /* 0: no per-address limit */
    unsigned idle_timeout_s;        /* 0: never */
    /* Host names served besides loopback ones. NULL: the Host is checked only when the
     * daemon listens on loopback (DNS rebinding); set: always. /health is never checked. */
    const char *const *allowed_hosts;
    int n_allowed_hosts;
    bool no_listen;                 /* no socket: connections come from http_add_connection */
    /* Every response carries `X-Tide-Instance: instance` (which daemon of a fleet answered);
     * NULL: none. Set here, before the polling threads serve the first request (/health while
     * the model loads): a setter after http_start wrote it under a running reader. */
    const char *instance;
    /* Bounded waits: a job still queued after queue_timeout_s, or not done request_timeout_s
     * after it was queued, is cancelled and answered 503 (a stream ends with an error event).
     * 0 = no bound. Read by the watch thread, which http_start starts. */
    double queue_timeout_s, request_timeout_s;
};

struct http_server;
int http_start(struct http_server **out, const char *host, int port, const struct http_route *routes,
               int n_routes, void *app, const struct http_options *opt, char *err, size_t errlen);
/* Serve one connected socket (with no_listen: the fuzzer's socketpairs); MHD owns fd after. */
int http_add_connection(struct http_server *s, int fd, const struct sockaddr *addr, unsigned addrlen);
/* CORS: the browser origins allowed to call (copied; "*" allows any). Call before requests
 * come (right after http_start); with none, no CORS header is sent and preflights get 403. */
int http_set_cors(struct http_server *s, char *const *origins, int n);
/* Stop accepting new connections (SIGTERM, first step). */
void http_quiesce(struct http_server *s);
/* Close everything; in-flight handlers must have been woken (jobs cancelled) first. */
void http_stop(struct http_server *s);
/* A request header, NULL when absent. */
const char *http_header(const struct http_request *rq, const char *name);
/* True when the client closed its side (handlers poll this while waiting). */
bool http_client_gone(const struct http_request *rq);
/* Fill rs with an OpenAI error object. */
void http_error(struct http_response *rs, int status, const char *type, const char *message,
                const char *param, const char *code);

#endif
