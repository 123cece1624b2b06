/* test_http_guard.c - the Host rules against DNS rebinding (issue 27): which Host values a
 * daemon on loopback serves, and when its listening address counts as loopback. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "server/http_guard.h"

static bool ok(const char *host) { return http_guard_host_allowed(host, NULL, 0); }

Test(http_guard, loopback_names)
{
    cr_expect(ok("localhost"));
    cr_expect(ok("LocalHost:8080"));
    cr_expect(ok("localhost."));
    cr_expect(ok("127.0.0.1"));
    cr_expect(ok("127.0.0.1:8080"));
    cr_expect(ok("127.45.6.7:1"));
    cr_expect(ok("[::1]"));
    cr_expect(ok("[::1]:8080"));
    cr_expect(ok("[0:0:0:0:0:0:0:1]:80"));
}

Test(http_guard, other_names_refused)
{
    cr_expect(!ok(NULL));
    cr_expect(!ok(""));
    cr_expect(!ok("evil.example"));
    cr_expect(!ok("evil.example:8080"));
    cr_expect(!ok("localhost.evil.example"));
    cr_expect(!ok("127.0.0.1.evil.example"));
    cr_expect(!ok("10.0.0.1"));
    cr_expect(!ok("0x7f.0.0.1"));      /* no numeric tricks */
    cr_expect(!ok("2130706433"));
    cr_expect(!ok("[::2]:80"));
    cr_expect(!ok("[::1"));
    cr_expect(!ok("localhost:"));
    cr_expect(!ok("localhost:80x"));
    cr_expect(!ok("localhost:80:80"));
    cr_expect(!ok("[::1]x"));
}

Test(http_guard, allowed_list)
{
    const char *const list[] = { "tide.lan", "Box.Example.", "[fe80::1]" };
    cr_expect(http_guard_host_allowed("tide.lan", list, 3));
    cr_expect(http_guard_host_allowed("TIDE.lan:8080", list, 3));
    cr_expect(http_guard_host_allowed("box.example", list, 3));
    cr_expect(http_guard_host_allowed("[fe80::1]:8080", list, 3));
    cr_expect(http_guard_host_allowed("localhost", list, 3), "loopback names stay allowed");
    cr_expect(!http_guard_host_allowed("tide.lan.evil", list, 3));
    cr_expect(!http_guard_host_allowed("evil.example", list, 3));
    const char *const any[] = { "*" };
    cr_expect(http_guard_host_allowed("anything.example:1", any, 1));
    cr_expect(!http_guard_host_allowed("bad:port", any, 1), "still a well-formed Host");
}

Test(http_guard, loopback_listen_address)
{
    struct sockaddr_in a = { .sin_family = AF_INET };
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_expect(http_guard_addr_is_loopback((struct sockaddr *)&a));
    inet_pton(AF_INET, "127.9.9.9", &a.sin_addr);
    cr_expect(http_guard_addr_is_loopback((struct sockaddr *)&a));
    inet_pton(AF_INET, "0.0.0.0", &a.sin_addr);
    cr_expect(!http_guard_addr_is_loopback((struct sockaddr *)&a));
    inet_pton(AF_INET, "192.168.1.2", &a.sin_addr);
    cr_expect(!http_guard_addr_is_loopback((struct sockaddr *)&a));
    struct sockaddr_in6 b = { .sin6_family = AF_INET6 };
    inet_pton(AF_INET6, "::1", &b.sin6_addr);
    cr_expect(http_guard_addr_is_loopback((struct sockaddr *)&b));
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &b.sin6_addr);
    cr_expect(http_guard_addr_is_loopback((struct sockaddr *)&b));
    inet_pton(AF_INET6, "::", &b.sin6_addr);
    cr_expect(!http_guard_addr_is_loopback((struct sockaddr *)&b));
}
