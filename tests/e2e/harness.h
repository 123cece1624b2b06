/* harness.h - start and stop one tide daemon for an e2e test, and talk raw HTTP to it.
 *
 * For tests that need the bytes on the wire (framing, Host, connection limits): curl would
 * fix up what they send on purpose. The daemon is $TIDE_BIN (default build/tide) with model
 * $TIDE_MODEL (default models/tide-moe.gguf), context 1024, on a free loopback port. */
#ifndef TIDE_E2E_HARNESS_H
#define TIDE_E2E_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct daemon {
    pid_t pid;
    int port;
    char cfg_path[64];
    const char *env;  /* set before e2e_start: one "NAME=value" for the daemon (fault hooks) */
};

/* Start with extra top-level config JSON members (NULL: none) and optional extra argv
 * (NULL-terminated, may be NULL); waits for /health 200 (Criterion assert on failure). */
void e2e_start(struct daemon *d, const char *extra_cfg, const char *const *argv_extra);
/* SIGTERM, wait up to 10 s; expects exit status 0. */
void e2e_stop(struct daemon *d);
/* A TCP connection to the daemon from local address from (NULL: the kernel's choice, e.g.
 * "127.0.0.2" for a second loopback client). -1 on failure. */
int e2e_connect(const struct daemon *d, const char *from);
/* Send len bytes on a new connection, then read until the server closes or timeout_s has
 * passed without a byte. Returns the malloc'd NUL-terminated response ("" for none); *closed
 * (if not NULL) says whether the server closed the connection. */
char *e2e_raw(const struct daemon *d, const char *from, const void *bytes, size_t len, double timeout_s,
              bool *closed);
/* e2e_raw from the kernel's choice of address, and *t_first: when the response's first byte
 * reached this host (the kernel's receive stamp, CLOCK_REALTIME seconds; 0: none). The order in
 * which the daemon sent two replies, however late this process runs to read them. */
char *e2e_raw_stamped(const struct daemon *d, const void *bytes, size_t len, double timeout_s, double *t_first);
/* The status code of the first response in resp (0: none). */
int e2e_status(const char *resp);
/* Seconds on the monotonic clock. */
double e2e_now(void);
/* A loopback port free right now (bound, read, closed). */
int e2e_free_port(void);

#endif
