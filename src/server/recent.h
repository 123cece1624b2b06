/* recent.h - the last finished generation requests (GET /v1/requests, the page at GET /):
 * when, which endpoint, prompt/completion tokens, latency and status. Counts only, never text. */
#ifndef TIDE_RECENT_H
#define TIDE_RECENT_H

#include "server/http.h"

#include <stdbool.h>

#define RECENT_MAX 32

/* One finished request (any thread). latency_s is from enqueue to the end. */
void recent_add(bool chat, bool stream, int images, long prompt_tokens, long completion_tokens,
                double latency_s, int status);
/* {"requests":[...]} newest first, malloc'd; NULL when out of memory. */
char *recent_json(void);
/* GET /v1/requests: recent_json() as the reply. */
void recent_handle(void *app, const struct http_request *rq, struct http_response *rs);

#endif
