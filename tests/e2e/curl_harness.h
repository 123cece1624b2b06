/* curl_harness.h - what an end-to-end test needs to drive a real daemon: start one on a free
 * port with extra config keys, send requests with explicit body lengths and headers, read
 * JSON string values with their exact bytes, stop it and check it exited cleanly.
 * (New e2e files use this; the older ones still carry their own copies.) */
#ifndef TIDE_E2E_CURL_HARNESS_H
#define TIDE_E2E_CURL_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

struct ch_reply {
    long status;            /* 0: no answer */
    char *body;             /* NUL-terminated, malloc'd */
    size_t len;
    char retry_after[16];   /* the Retry-After header's value, "" when absent */
};

/* Start build/tide ($TIDE_BIN) on models/tide-moe.gguf ($TIDE_MODEL) with extra_cfg (JSON
 * members, may be NULL) added to the config; waits for /health 200 (asserts). */
void ch_start(const char *extra_cfg);
/* SIGTERM, then checks the daemon exited 0 within 10 s. */
void ch_stop(void);
int ch_port(void);
/* One request; body_len explicit; hdr one extra header line or NULL. */
struct ch_reply ch_request(const char *method, const char *path, const char *body, size_t body_len,
                             const char *hdr);
struct ch_reply ch_post(const char *path, const char *json);
void ch_reply_free(struct ch_reply *r);
/* The value of the first "key":"..." after from, unescaped into a malloc'd buffer with its
 * length (cJSON would stop at a \u0000); NULL when there is none. *end: just past it. */
char *ch_json_string(const char *from, const char *key, size_t *len, const char **end);

#endif
