/* http_guard.h - checks a request passes before any handler sees it (issue 27):
 *   - framing (RFC 9112): one unambiguous body length, so that a proxy in front of tide and
 *     tide itself can never disagree on where a request ends (request smuggling);
 *   - Host (DNS rebinding): a daemon on loopback answers only requests addressed to a
 *     loopback name, or to a name the operator listed.
 * The Host rules are pure functions (unit tests); the framing rules read MHD's parsed headers
 * (e2e tests send the raw bytes). */
#ifndef TIDE_HTTP_GUARD_H
#define TIDE_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct MHD_Connection;

/* NULL when the request's framing is unambiguous, else why not (the 400's message): more
 * than one Content-Length, Transfer-Encoding other than exactly "chunked", both headers,
 * Transfer-Encoding on HTTP/1.0, whitespace in a header name, no or several Host headers on
 * HTTP/1.1. version is the request line's ("HTTP/1.1"). */
const char *http_guard_framing(struct MHD_Connection *c, const char *version);

/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104: the listening address is loopback. */
bool http_guard_addr_is_loopback(const struct sockaddr *sa);

/* Whether a Host header value (with or without :port) may be served: a loopback name
 * (localhost, 127.x.y.z, [::1]) or, case-insensitively, one of allowed ("*" allows all).
 * NULL or malformed hosts are refused. */
bool http_guard_host_allowed(const char *host, const char *const *allowed, int n_allowed);

#endif
