/* metrics.c - minimal Prometheus metrics: requests by endpoint and code, tokens,
 * running/waiting gauges. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SERIES 128

struct series { char endpoint[48]; int code; unsigned long n; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct series req[MAX_SERIES];
static int n_req;
static atomic_long prompt_tokens, gen_tokens;
static atomic_int running, waiting;

void metrics_init(void)
{
    pthread_mutex_lock(&mu);
    n_req = 0;
    pthread_mutex_unlock(&mu);
    atomic_store(&prompt_tokens, 0);
    atomic_store(&gen_tokens, 0);
    atomic_store(&running, 0);
    atomic_store(&waiting, 0);
}

void metrics_request(const char *endpoint, int code)
{
    pthread_mutex_lock(&mu);
    int i;
    for (i = 0; i < n_req; i++)
        if (req[i].code == code && strcmp(req[i].endpoint, endpoint) == 0) break;
    if (i == n_req && n_req < MAX_SERIES) {
        snprintf(req[i].endpoint, sizeof req[i].endpoint, "%s", endpoint);
        req[i].code = code;
        req[i].n = 0;
        n_req++;
    }
    if (i < n_req) req[i].n++;
    pthread_mutex_unlock(&mu);
}

void metrics_tokens(long prompt, long generated)
{
    atomic_fetch_add(&prompt_tokens, prompt);
    atomic_fetch_add(&gen_tokens, generated);
}

void metrics_running_add(int d) { atomic_fetch_add(&running, d); }
void metrics_waiting_add(int d) { atomic_fetch_add(&waiting, d); }

char *metrics_render(void)
{
    size_t cap = 4096 + MAX_SERIES * 128;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t n = 0;
#define P(...) (n += (size_t)snprintf(out + n, cap - n, __VA_ARGS__))
    P("# HELP tide_requests_total HTTP requests answered, by endpoint and status code.\n");
    P("# TYPE tide_requests_total counter\n");
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_req; i++)
        P("tide_requests_total{endpoint=\"%s\",code=\"%d\"} %lu\n", req[i].endpoint, req[i].code,
          req[i].n);
    pthread_mutex_unlock(&mu);
    P("# HELP tide_prompt_tokens_total Prompt tokens processed.\n");
    P("# TYPE tide_prompt_tokens_total counter\n");
    P("tide_prompt_tokens_total %ld\n", atomic_load(&prompt_tokens));
    P("# HELP tide_generation_tokens_total Tokens generated.\n");
    P("# TYPE tide_generation_tokens_total counter\n");
    P("tide_generation_tokens_total %ld\n", atomic_load(&gen_tokens));
    P("# HELP tide_requests_running Requests the engine is generating for now.\n");
    P("# TYPE tide_requests_running gauge\n");
    P("tide_requests_running %d\n", atomic_load(&running));
    P("# HELP tide_requests_waiting Requests waiting in the FIFO.\n");
    P("# TYPE tide_requests_waiting gauge\n");
    P("tide_requests_waiting %d\n", atomic_load(&waiting));
#undef P
    return out;
}
