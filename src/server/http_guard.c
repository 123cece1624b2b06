/* http_guard.c - framing and Host checks run before any handler (see http_guard.h).
 *
 * libmicrohttpd parses the request, but leniently: with two Content-Length headers it uses
 * one, "Transfer-Encoding: gzip, chunked" makes it read until the client closes, a header
 * name with a space before the colon is kept as another header. A proxy in front may pick
 * the other reading, and the bytes it thinks are a second request then reach tide as part of
 * the first (or the reverse). RFC 9112 says a server must answer such requests 400 and close;
 * http.c does that on the handler's first call, before reading a byte of the body. */
#include "server/http_guard.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

struct framing {
    int content_length, transfer_encoding, host;
    const char *te;
    bool bad_name;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct framing *f = cls;
    (void)kind;
    if (!key) return MHD_YES;
    if (!strcasecmp(key, "Content-Length")) f->content_length++;
    else if (!strcasecmp(key, "Transfer-Encoding")) { f->transfer_encoding++; f->te = value; }
    else if (!strcasecmp(key, "Host")) f->host++;
    if (!key[0] || strpbrk(key, " \t")) f->bad_name = true;
    return MHD_YES;
}

const char *http_guard_framing(struct MHD_Connection *c, const char *version)
{
    struct framing f = { 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &f);
    bool http10 = version && !strcmp(version, "HTTP/1.0");
    if (f.bad_name) return "malformed header field name (whitespace before the colon)";
    if (f.content_length > 1) return "more than one Content-Length header";
    if (f.transfer_encoding > 1) return "more than one Transfer-Encoding header";
    if (f.transfer_encoding && f.content_length) return "both Content-Length and Transfer-Encoding";
    if (f.transfer_encoding && http10) return "Transfer-Encoding is not allowed in HTTP/1.0";
    /* Only chunked alone: any other coding (gzip, chunked) is one tide cannot undo, and a
     * list not ending in chunked has no length at all. */
    if (f.transfer_encoding && (!f.te || strcasecmp(f.te, "chunked") != 0))
        return "unsupported Transfer-Encoding (only chunked is accepted)";
    if (!http10 && f.host != 1) return f.host ? "more than one Host header" : "missing Host header";
    return NULL;
}

bool http_guard_addr_is_loopback(const struct sockaddr *sa)
{
    if (!sa) return false;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

/* The host part of a Host value into out (lower case, no port, no brackets, no trailing dot).
 * False when it is malformed: an empty name, a port that is not digits, unbalanced brackets. */
static bool host_name(const char *host, char *out, size_t cap, bool *bracketed)
{
    const char *end;
    *bracketed = host[0] == '[';
    if (*bracketed) {
        const char *close = strchr(host, ']');
        if (!close) return false;
        end = close + 1;
        host++;
        if ((size_t)(close - host) >= cap) return false;
        memcpy(out, host, (size_t)(close - host));
        out[close - host] = 0;
    } else {
        end = strchr(host, ':');
        if (!end) end = host + strlen(host);
        if ((size_t)(end - host) >= cap) return false;
        memcpy(out, host, (size_t)(end - host));
        out[end - host] = 0;
    }
    if (*end == ':') {
        end++;
        if (!*end) return false;
        for (; *end; end++)
            if (!isdigit((unsigned char)*end)) return false;
    } else if (*end) {
        return false;
    }
    size_t n = strlen(out);
    if (n && out[n - 1] == '.' && !*bracketed) out[--n] = 0;
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
    return n > 0;
}

bool http_guard_host_allowed(const char *host, const char *const *allowed, int n_allowed)
{
    char name[256];
    bool bracketed;
    if (!host || !host_name(host, name, sizeof name, &bracketed)) return false;
    struct in_addr a4;
    struct in6_addr a6;
    if (bracketed) {
        if (inet_pton(AF_INET6, name, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)) return true;
    } else if (!strcmp(name, "localhost")) {
        return true;
    } else if (inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) {
        return true; /* inet_pton takes dotted quads only: no 0x7f.1 or 2130706433 */
    }
    for (int i = 0; i < n_allowed; i++) {
        const char *w = allowed[i];
        if (!strcmp(w, "*")) return true;
        size_t wl = strlen(w);
        if (wl > 2 && w[0] == '[' && w[wl - 1] == ']') { w++; wl -= 2; } /* "[fe80::1]" */
        else if (wl && w[wl - 1] == '.') wl--;                           /* "tide.lan." */
        if (wl == strlen(name) && !strncasecmp(w, name, wl)) return true;
    }
    return false;
}
