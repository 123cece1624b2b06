/* fuzz_http.c - libFuzzer target for the HTTP front (issue 27): raw request bytes through
 * libmicrohttpd's parser into tide's access handler (src/server/http.c: framing and Host
 * checks, body limits, API key, routing, error replies) and on to openai_parse.
 *
 * One MHD daemon without a listening socket serves the whole run, with an API key and an
 * allowed-hosts list so that every check is live. Each input is written to one end of a
 * socketpair whose other end is handed to MHD (http_add_connection, as if accepted from
 * 127.0.0.1); the write side is then shut, and the reply read until MHD closes. Handlers
 * answer at once (no engine): the chat and completion routes validate the body and answer
 * 400 or 200, so a crash or a leak in tide's request path is what this finds. */
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void h_health(void *app, const struct http_request *rq, struct http_response *rs)
{
    rs->body = strdup("{\"status\":\"ok\"}");
}

static void h_metrics(void *app, const struct http_request *rq, struct http_response *rs)
{
    rs->body = metrics_render();
    rs->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

static void generate(const struct http_request *rq, struct http_response *rs, bool chat)
{
    char msg[256];
    const char *param = NULL;
    struct oai_req *req = NULL;
    if (openai_parse(rq->body, rq->body_len, chat, "fuzz-model", &req, msg, sizeof msg, &param)) {
        http_error(rs, 400, "invalid_request_error", msg, param, NULL);
        return;
    }
    openai_req_free(req);
    rs->body = strdup("{\"object\":\"chat.completion\"}");
}
static void h_chat(void *app, const struct http_request *rq, struct http_response *rs) { generate(rq, rs, true); }
static void h_completions(void *app, const struct http_request *rq, struct http_response *rs) { generate(rq, rs, false); }

static const struct http_route routes[] = {
    { "GET", "/health", h_health },
    { "GET", "/metrics", h_metrics },
    { "POST", "/v1/chat/completions", h_chat },
    { "POST", "/v1/completions", h_completions },
};

static struct http_server *server(void)
{
    static struct http_server *s;
    if (s) return s;
    metrics_init();
    static const char *const hosts[] = { "fuzz.example" };
    struct http_options o = { .api_key = "k", .max_connections = 64, .max_connections_per_ip = 16,
                              .idle_timeout_s = 2, .allowed_hosts = hosts, .n_allowed_hosts = 1,
                              .no_listen = true };
    char err[256];
    if (http_start(&s, "127.0.0.1", 0, routes, (int)(sizeof routes / sizeof routes[0]), NULL, &o, err,
                   sizeof err))
        abort();
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_server *s = server();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return 0;
    struct sockaddr_in peer = { .sin_family = AF_INET, .sin_port = htons(40000),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (http_add_connection(s, sv[1], (struct sockaddr *)&peer, sizeof peer)) {
        close(sv[0]);
        return 0; /* MHD closed sv[1] */
    }
    for (size_t off = 0; off < size;) {
        ssize_t w = send(sv[0], data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    /* Drain the replies until MHD closes its end. A request that never gets an answer nor a
     * close is a hang: libFuzzer's -timeout (10 s in `make fuzz`) reports it. */
    char buf[65536];
    for (;;) {
        struct pollfd p = { .fd = sv[0], .events = POLLIN };
        if (poll(&p, 1, -1) < 0) break;
        if (recv(sv[0], buf, sizeof buf, 0) <= 0) break;
    }
    close(sv[0]);
    return 0;
}
