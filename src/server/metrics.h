/* metrics.h - process-wide counters and gauges, rendered as Prometheus text 0.0.4.
 *
 * Updated from any thread (atomics / a small lock); metrics_render() runs on scrape. */
#ifndef TIDE_METRICS_H
#define TIDE_METRICS_H

#include "common.h"

void metrics_init(void);
/* One finished HTTP request: endpoint is the route path ("/v1/chat/completions", or
 * "other" for unknown paths). */
void metrics_request(const char *endpoint, int code);
void metrics_tokens(long prompt, long generated);
void metrics_running_add(int d);
void metrics_waiting_add(int d);
/* malloc'd text (caller frees), NULL on ENOMEM. */
char *metrics_render(void);

#endif
