/* req_harness.h - shared end-to-end harness for new e2e suites: start the real daemon (build/tide,
 * or $TIDE_BIN) on a free port with a temporary config (model models/tide-moe.gguf, or
 * $TIDE_MODEL), talk HTTP to it with libcurl (headers in and out), stop it with SIGTERM and
 * check it exits 0. */
#ifndef TIDE_E2E_REQ_HARNESS_H
#define TIDE_E2E_REQ_HARNESS_H

#include <cjson/cJSON.h>

/* extra_cfg: more JSON members for the config object ("\"k\":v,..."), or NULL. */
void harness_start(const char *extra_cfg);
void harness_stop(void);

struct harness_reply {
    long status;
    char *body;      /* NUL-terminated */
    size_t len;      /* body bytes (a body may hold NUL bytes) */
    char *headers;   /* the response's header lines as received */
};
/* One request; hdrs: extra header lines (NULL-terminated list) or NULL. Frees nothing of the
 * caller's; harness_reply_free frees the reply. A POST gets Content-Type: application/json. */
struct harness_reply harness_req(const char *method, const char *path, const char *const *hdrs, const char *body);
/* The same with an explicit body length (a body with NUL bytes, or a large one). */
struct harness_reply harness_req_len(const char *method, const char *path, const char *const *hdrs, const char *body,
                                     size_t body_len);
void harness_reply_free(struct harness_reply *r);
/* The value of the first "key":"..." after from, unescaped into a malloc'd buffer with its
 * length (cJSON would stop at a \u0000); NULL when there is none. *end: just past it. */
char *harness_json_string(const char *from, const char *key, size_t *len, const char **end);
/* The body parsed (asserts it is JSON); caller deletes. */
cJSON *harness_json(const struct harness_reply *r);
/* POST body to path, assert 200 and return the reply parsed (caller deletes). */
cJSON *harness_post_ok(const char *path, const char *body);
/* POST body to path and expect a 400 in OpenAI's error shape whose param is param and whose
 * message contains word (when not NULL). */
void harness_expect_400(const char *path, const char *body, const char *param, const char *word);
/* The value of a response header (case-insensitive name), malloc'd, or NULL. */
char *harness_header(const struct harness_reply *r, const char *name);

#endif
