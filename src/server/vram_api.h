/* vram_api.h - GET and POST /v1/vram: the per-device memory view and the reserve control.
 *
 * GET answers from the published snapshot and never waits for the engine. POST validates the
 * body on the HTTP thread, then runs as a control job on the engine thread at the next token
 * boundary (a generation in flight pauses for the resize and resumes unchanged). */
#ifndef TIDE_VRAM_API_H
#define TIDE_VRAM_API_H

#include "server/http.h"
#include "server/runtime.h"

/* The GET body (malloc'd JSON); status/shortfall added when shortfall is not NULL. */
/* The instance name every /v1/vram answer carries as "instance" (copied; before serving). */
void vram_set_instance(const char *name);
char *vram_render(const struct vram_snapshot *s, const char *status, const size_t *shortfall);
void vram_get(struct runtime *rt, const struct http_request *rq, struct http_response *rs);
void vram_post(struct runtime *rt, const struct http_request *rq, struct http_response *rs);
/* Parse a POST body into reserves for n_dev devices: set[i] says whether device i changes;
 * MiB values in mib[i] (-1 = back to the start-up reserve). 0, or TIDE_EINVAL with msg and
 * *param the field at fault (NULL when the body itself is). */
int vram_parse_reserve(const char *body, size_t len, int n_dev, bool *set, long *mib, char *msg,
                       size_t msglen, const char **param);

#endif
