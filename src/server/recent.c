/* recent.c - a fixed ring of the last RECENT_MAX finished generation requests, under a lock. */
#include "server/recent.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <time.h>

struct entry {
    double unix_time, latency_s;
    long prompt_tokens, completion_tokens;
    int images, status;
    bool chat, stream;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry ring[RECENT_MAX];
static unsigned long n_added; /* ring[(n_added - 1) % RECENT_MAX] is the newest */

void recent_add(bool chat, bool stream, int images, long prompt_tokens, long completion_tokens,
                double latency_s, int status)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct entry e = { ts.tv_sec + ts.tv_nsec * 1e-9, latency_s, prompt_tokens, completion_tokens,
                       images, status, chat, stream };
    pthread_mutex_lock(&mu);
    ring[n_added++ % RECENT_MAX] = e;
    pthread_mutex_unlock(&mu);
}

char *recent_json(void)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "requests");
    pthread_mutex_lock(&mu);
    unsigned long n = n_added < RECENT_MAX ? n_added : RECENT_MAX;
    for (unsigned long i = 0; i < n && a; i++) {
        const struct entry *e = &ring[(n_added - 1 - i) % RECENT_MAX];
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "time", e->unix_time);
        cJSON_AddStringToObject(r, "endpoint", e->chat ? "/v1/chat/completions" : "/v1/completions");
        cJSON_AddBoolToObject(r, "stream", e->stream);
        cJSON_AddNumberToObject(r, "images", e->images);
        cJSON_AddNumberToObject(r, "prompt_tokens", e->prompt_tokens);
        cJSON_AddNumberToObject(r, "completion_tokens", e->completion_tokens);
        cJSON_AddNumberToObject(r, "latency_ms", (long)(e->latency_s * 1000 + 0.5));
        cJSON_AddNumberToObject(r, "status", e->status);
        cJSON_AddItemToArray(a, r);
    }
    pthread_mutex_unlock(&mu);
    char *s = a ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

void recent_handle(void *app, const struct http_request *rq, struct http_response *rs)
{
    rs->body = recent_json();
    if (!rs->body) http_error(rs, 500, "server_error", tide_strerror(TIDE_ENOMEM), NULL, NULL);
}
