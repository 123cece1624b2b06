/* metrics.c - process-wide metrics, rendered as Prometheus text format 0.0.4.
 *
 * Writers are HTTP threads, the engine thread and the vision lifecycle; the reader is a scrape.
 * Plain counters and gauges are atomics. Each histogram has its own small mutex so that one
 * scrape sees buckets, _count and _sum from the same set of observations (promtool and
 * PromQL's histogram_quantile both assume _count == the +Inf bucket). The device snapshot is
 * copied under its mutex and everything derived from it (the aggregates included) is computed
 * from that one copy, so tide_expert_slots always equals the sum of tide_device_expert_slots.
 * No lock here is ever held while formatting text or while calling out, so a scrape never
 * waits on the engine and the engine never waits on a scrape for longer than a memcpy.
 * Names, units and buckets are documented in docs/METRICS.md. */
#include "server/metrics.h"
#include "memory/host_budget.h"
#include "engine/session.h" /* struct engine_kv_stats */

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- text builder ---------------------------------------------------------------------- */

struct sb { char *p; size_t n, cap; bool oom; };

static void sb_printf(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sb *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = true; return; }
        if ((size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t nc = b->cap * 2;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = nc;
    }
}

/* Label values may hold any UTF-8; the text format wants \\, \" and \n escaped. */
static void sb_label_value(struct sb *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\') sb_printf(b, "\\\\");
        else if (*s == '"') sb_printf(b, "\\\"");
        else if (*s == '\n') sb_printf(b, "\\n");
        else sb_printf(b, "%c", *s);
    }
}

/* Shortest text that reads back as the same double, so bucket bounds look like the ones
 * client libraries emit (0.005, not 0.0050000000000000001). */
static void fmt_double(char *out, size_t cap, double v)
{
    if (isnan(v)) { snprintf(out, cap, "NaN"); return; }
    if (isinf(v)) { snprintf(out, cap, v > 0 ? "+Inf" : "-Inf"); return; }
    /* Plain digits for every magnitude a latency, byte count or timestamp has here: %g would
     * write 60 as "6e+01" at precision 1. */
    double a = fabs(v);
    bool plain = a == 0 || (a >= 1e-4 && a < 1e15);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v && (!plain || !strchr(out, 'e'))) return;
    }
}

static void family(struct sb *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* ---- requests, tokens, running/waiting ------------------------------------------------- */

/* Bounded: endpoints come from the route table plus "other", codes from a short list, so 128
 * series is far more than a real server makes; past it new pairs are dropped, not grown. */
#define MAX_REQ_SERIES 128

struct req_series { char endpoint[64]; int code; uint64_t n; };

static pthread_mutex_t req_mu = PTHREAD_MUTEX_INITIALIZER;
static struct req_series req[MAX_REQ_SERIES];
static int n_req;
static atomic_llong prompt_tokens, gen_tokens;
static atomic_int running, waiting;
static atomic_int kv_slots_used, kv_slots_total, kv_slots_cached;
static atomic_llong kv_cached_rows;
static atomic_llong cached_tokens;
/* conversation parking: the engine's counts as last published */
static atomic_int kv_parked;
static atomic_llong kv_parked_bytes, kv_parked_budget, kv_parked_total, kv_restored_total, kv_restored_tokens,
    kv_park_evicted;
static atomic_llong kv_shared_tokens, kv_prefix_waits, kv_block_cache_tokens, kv_block_cache_evictions;
static double start_unix;
/* Set once at start-up, before the first scrape (metrics_set_instance). */
static char instance_name[256];

void metrics_request(const char *endpoint, int code)
{
    if (!endpoint) endpoint = "other";
    pthread_mutex_lock(&req_mu);
    int i;
    for (i = 0; i < n_req; i++)
        if (req[i].code == code && strcmp(req[i].endpoint, endpoint) == 0) break;
    if (i == n_req && n_req < MAX_REQ_SERIES) {
        snprintf(req[i].endpoint, sizeof req[i].endpoint, "%s", endpoint);
        req[i].code = code;
        req[i].n = 0;
        n_req++;
    }
    if (i < n_req) req[i].n++;
    pthread_mutex_unlock(&req_mu);
}

void metrics_tokens(long prompt, long generated)
{
    /* Counters never go down: a failed request may report nothing, never less than nothing. */
    if (prompt > 0) atomic_fetch_add(&prompt_tokens, prompt);
    if (generated > 0) atomic_fetch_add(&gen_tokens, generated);
}

void metrics_running_add(int d) { atomic_fetch_add(&running, d); }
static atomic_int m_kv_blocks_total, m_kv_blocks_running, m_kv_blocks_cached, m_kv_blocks_free, m_kv_blocks_shared,
    m_kv_block_rows, m_kv_paused;
static atomic_llong m_kv_pauses_total;

void metrics_kv_blocks(const struct engine_kv_stats *kv, uint64_t pauses_total)
{
    atomic_store(&m_kv_block_rows, kv->block_rows);
    atomic_store(&m_kv_blocks_total, kv->blocks);
    atomic_store(&m_kv_blocks_running, kv->running);
    atomic_store(&m_kv_blocks_cached, kv->cached);
    atomic_store(&m_kv_blocks_free, kv->free);
    atomic_store(&m_kv_blocks_shared, kv->shared);
    atomic_store(&m_kv_paused, kv->paused);
    atomic_store(&m_kv_pauses_total, (long long)pauses_total);
}

void metrics_kv_slots(int used, int total, int cached, long cached_rows)
{
    atomic_store(&kv_slots_used, used);
    atomic_store(&kv_slots_total, total);
    atomic_store(&kv_slots_cached, cached);
    atomic_store(&kv_cached_rows, cached_rows);
}
void metrics_kv_parked(int n, size_t bytes, size_t budget, uint64_t parked, uint64_t restored, uint64_t tokens,
                       uint64_t evicted)
{
    atomic_store(&kv_parked, n);
    atomic_store(&kv_parked_bytes, (long long)bytes);
    atomic_store(&kv_parked_budget, (long long)budget);
    atomic_store(&kv_parked_total, (long long)parked);
    atomic_store(&kv_restored_total, (long long)restored);
    atomic_store(&kv_restored_tokens, (long long)tokens);
    atomic_store(&kv_park_evicted, (long long)evicted);
}
void metrics_kv_shared(uint64_t tokens, uint64_t waits, uint64_t block_tokens, uint64_t block_evictions)
{
    atomic_store(&kv_shared_tokens, (long long)tokens);
    atomic_store(&kv_prefix_waits, (long long)waits);
    atomic_store(&kv_block_cache_tokens, (long long)block_tokens);
    atomic_store(&kv_block_cache_evictions, (long long)block_evictions);
}
void metrics_cached_tokens(long n)
{
    if (n > 0) atomic_fetch_add(&cached_tokens, n);
}
void metrics_waiting_add(int d) { atomic_fetch_add(&waiting, d); }

/* ---- histograms ------------------------------------------------------------------------ */

#define MAX_BUCKETS 20

struct hist_def {
    const char *name, *help;
    int nb;
    double le[MAX_BUCKETS];   /* upper bounds, ascending; +Inf is implicit */
};

/* Bucket choice (docs/METRICS.md repeats it): each histogram spans from the fastest value a
 * CPU test box produces to the slowest a healthy server should ever show, with 2-2.5x steps
 * so histogram_quantile stays within a few tens of percent. */
static const struct hist_def hist_defs[METRICS_HIST_COUNT] = {
    [METRICS_TTFT] = {"tide_time_to_first_token_seconds",
        "Time from a request entering the queue to its first generated token (queue + prefill).", 14,
        {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160}},
    [METRICS_E2E] = {"tide_request_duration_seconds",
        "End-to-end time of a generation request, from entering the queue to its last token.", 15,
        {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200}},
    [METRICS_QUEUE] = {"tide_queue_time_seconds",
        "Time a generation request waited in the FIFO before the engine started it.", 15,
        {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}},
    [METRICS_ITL] = {"tide_inter_token_latency_seconds",
        "Time between two consecutive generated tokens of one request.", 16,
        {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
         0.25, 0.5, 1}},
    [METRICS_VISION_LOAD] = {"tide_vision_load_seconds",
        "Time to load the vision encoder after the expert caches handed memory back.", 13,
        {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60}},
    [METRICS_VISION_ENCODE] = {"tide_vision_encode_seconds",
        "Time to encode one image into embeddings (cache misses only).", 13,
        {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30}},
    [METRICS_HANDBACK] = {"tide_vram_handback_seconds",
        "Time for the expert caches to shrink and hand device memory back.", 14,
        {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}},
    [METRICS_REGROW] = {"tide_vram_regrow_seconds",
        "Time for the expert caches to grow back and refill the experts they held.", 15,
        {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}},
    [METRICS_STEP_FORWARD] = {"tide_step_forward_seconds",
        "Time of one scheduler step's forward over its running sequences (device work and the wait for its tokens or logits).", 16,
        {0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1}},
    [METRICS_STEP_HOST] = {"tide_step_host_seconds",
        "Time of one scheduler step outside its forward: planning rows, sampling on the host, text and stop strings, handing chunks to the replies.", 16,
        {0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1}},
};

struct hist {
    pthread_mutex_t mu;
    uint64_t n[MAX_BUCKETS + 1];  /* per bucket, not cumulative; [nb] is the +Inf overflow */
    uint64_t count;
    double sum;
};

static struct hist hists[METRICS_HIST_COUNT] = {
#define H PTHREAD_MUTEX_INITIALIZER
    {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H}, {.mu = H},
#undef H
};
_Static_assert(METRICS_HIST_COUNT == 10, "one initializer per histogram above");

void metrics_observe(enum metrics_hist h, double seconds)
{
    if ((unsigned)h >= METRICS_HIST_COUNT || isnan(seconds)) return;
    /* A clock step can make a difference negative; a negative latency means "instant". */
    if (seconds < 0) seconds = 0;
    const struct hist_def *d = &hist_defs[h];
    int b = 0;
    while (b < d->nb && seconds > d->le[b]) b++;   /* le is inclusive: v <= le */
    struct hist *x = &hists[h];
    pthread_mutex_lock(&x->mu);
    x->n[b]++;
    x->count++;
    x->sum += seconds;
    pthread_mutex_unlock(&x->mu);
}

static void render_hist(struct sb *b, enum metrics_hist h)
{
    const struct hist_def *d = &hist_defs[h];
    struct hist *x = &hists[h];
    uint64_t n[MAX_BUCKETS + 1], count;
    double sum;
    pthread_mutex_lock(&x->mu);
    memcpy(n, x->n, sizeof n);
    count = x->count;
    sum = x->sum;
    pthread_mutex_unlock(&x->mu);
    family(b, d->name, "histogram", d->help);
    uint64_t cum = 0;
    char v[40];
    for (int i = 0; i < d->nb; i++) {
        cum += n[i];
        fmt_double(v, sizeof v, d->le[i]);
        sb_printf(b, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", d->name, v, cum);
    }
    cum += n[d->nb];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", d->name, cum);
    fmt_double(v, sizeof v, sum);
    sb_printf(b, "%s_sum %s\n%s_count %" PRIu64 "\n", d->name, v, d->name, count);
}

/* ---- device snapshot ------------------------------------------------------------------- */

#define MAX_DEVICES 16

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct metrics_device devs[MAX_DEVICES];
static int n_devs;

void metrics_publish_devices(const struct metrics_device *d, int n)
{
    if (n < 0) n = 0;
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    pthread_mutex_lock(&dev_mu);
    if (n) memcpy(devs, d, (size_t)n * sizeof *d);
    n_devs = n;
    pthread_mutex_unlock(&dev_mu);
}

static const char *const mem_kind_names[METRICS_MEM_KIND_COUNT] = {
    [METRICS_MEM_WEIGHTS] = "weights", [METRICS_MEM_KV] = "kv",
    [METRICS_MEM_WORKSPACE] = "workspace", [METRICS_MEM_EXPERT_CACHE] = "expert_cache",
    [METRICS_MEM_VISION] = "vision",
};

/* One family with one u64 per device, read through an offset into struct metrics_device so
 * the eleven per-device families share one loop. */
static void render_per_device(struct sb *b, const struct metrics_device *d, int n, const char *name,
                              const char *type, const char *help, size_t off)
{
    family(b, name, type, help);
    for (int i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&d[i] + off, sizeof v);
        sb_printf(b, "%s{device=\"%d\"} %" PRIu64 "\n", name, d[i].index, v);
    }
}

static void render_devices(struct sb *b)
{
    struct metrics_device d[MAX_DEVICES];
    int n;
    pthread_mutex_lock(&dev_mu);
    n = n_devs;
    memcpy(d, devs, (size_t)n * sizeof *d);
    pthread_mutex_unlock(&dev_mu);

    uint64_t slots = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        slots += d[i].expert_slots;
        bytes += d[i].expert_cache_bytes;
    }
    family(b, "tide_expert_slots", "gauge", "Expert cache slots on all devices now (the sum of tide_device_expert_slots).");
    sb_printf(b, "tide_expert_slots %" PRIu64 "\n", slots);
    family(b, "tide_expert_cache_bytes", "gauge", "Bytes the expert caches hold now (the sum of tide_device_expert_cache_bytes).");
    sb_printf(b, "tide_expert_cache_bytes %" PRIu64 "\n", bytes);

    family(b, "tide_device_info", "gauge", "Constant 1 per device, naming its backend.");
    for (int i = 0; i < n; i++) {
        sb_printf(b, "tide_device_info{device=\"%d\",backend=\"", d[i].index);
        sb_label_value(b, d[i].backend ? d[i].backend : "unknown");
        sb_printf(b, "\"} 1\n");
    }
#define OFF(f) offsetof(struct metrics_device, f)
    render_per_device(b, d, n, "tide_device_expert_slots", "gauge",
                      "Expert cache slots the device has now.", OFF(expert_slots));
    render_per_device(b, d, n, "tide_device_expert_slots_full", "gauge",
                      "Expert cache slots the device has at its full start-up size.", OFF(expert_slots_full));
    render_per_device(b, d, n, "tide_device_expert_cache_bytes", "gauge",
                      "Bytes the device's expert cache holds now.", OFF(expert_cache_bytes));
    family(b, "tide_device_memory_bytes", "gauge", "Device memory in use, by kind.");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < METRICS_MEM_KIND_COUNT; k++)
            sb_printf(b, "tide_device_memory_bytes{device=\"%d\",kind=\"%s\"} %" PRIu64 "\n",
                      d[i].index, mem_kind_names[k], d[i].used_bytes[k]);
    render_per_device(b, d, n, "tide_device_memory_total_bytes", "gauge",
                      "Device memory budget.", OFF(total_bytes));
    render_per_device(b, d, n, "tide_device_memory_free_bytes", "gauge",
                      "Device memory not used by any kind.", OFF(free_bytes));
    render_per_device(b, d, n, "tide_device_reserve_bytes", "gauge",
                      "Memory the device keeps free on request (start-up or POST /v1/vram reserve).",
                      OFF(reserve_bytes));
    render_per_device(b, d, n, "tide_expert_cache_hits_total", "counter",
                      "Expert lookups served from the device's cache.", OFF(expert_hits));
    render_per_device(b, d, n, "tide_expert_cache_misses_total", "counter",
                      "Expert lookups that copied the expert from host RAM.", OFF(expert_misses));
    render_per_device(b, d, n, "tide_expert_cache_copied_bytes_total", "counter",
                      "Bytes copied from host RAM into the device's expert cache.",
                      OFF(expert_bytes_copied));
#undef OFF
}

/* ---- vision ---------------------------------------------------------------------------- */

static const char *const vision_states[] = {"unloaded", "handback", "loading", "ready",
                                            "unloading", "regrow"};
#define N_VISION_STATES ((int)(sizeof vision_states / sizeof vision_states[0]))

static atomic_int vision_state_idx;          /* index into vision_states; 0 = unloaded */
static _Atomic uint64_t last_image_bits;     /* a double's bits: no atomic double in C11 */
static atomic_ullong vision_loads, vision_unloads, embed_hits, embed_misses;

void metrics_vision_state(const char *state)
{
    for (int i = 0; state && i < N_VISION_STATES; i++)
        if (strcmp(state, vision_states[i]) == 0) { atomic_store(&vision_state_idx, i); return; }
    /* An unknown name is a caller bug; keep the last good state rather than a zero-hot gauge. */
}

void metrics_vision_last_image(double unix_time)
{
    uint64_t bits;
    memcpy(&bits, &unix_time, sizeof bits);
    atomic_store(&last_image_bits, bits);
}

void metrics_vision_event(bool load) { atomic_fetch_add(load ? &vision_loads : &vision_unloads, 1); }
void metrics_vision_embed_cache(bool hit) { atomic_fetch_add(hit ? &embed_hits : &embed_misses, 1); }

static void render_vision(struct sb *b)
{
    int cur = atomic_load(&vision_state_idx);
    family(b, "tide_vision_state", "gauge", "Vision encoder lifecycle state: 1 for the current one.");
    for (int i = 0; i < N_VISION_STATES; i++)
        sb_printf(b, "tide_vision_state{state=\"%s\"} %d\n", vision_states[i], i == cur);
    uint64_t bits = atomic_load(&last_image_bits);
    double t;
    memcpy(&t, &bits, sizeof t);
    if (!(t > 0)) t = 0;   /* never seen (or a caller passed a negative): 0, as the docs say */
    char v[40];
    fmt_double(v, sizeof v, t);
    family(b, "tide_vision_last_image_timestamp_seconds", "gauge",
           "Unix time of the last request with an image; 0 before the first.");
    sb_printf(b, "tide_vision_last_image_timestamp_seconds %s\n", v);
    family(b, "tide_vision_loads_total", "counter", "Times the vision encoder was loaded.");
    sb_printf(b, "tide_vision_loads_total %llu\n", atomic_load(&vision_loads));
    family(b, "tide_vision_unloads_total", "counter", "Times the vision encoder was unloaded.");
    sb_printf(b, "tide_vision_unloads_total %llu\n", atomic_load(&vision_unloads));
    family(b, "tide_vision_embed_cache_hits_total", "counter",
           "Images whose embeddings came from the embedding cache.");
    sb_printf(b, "tide_vision_embed_cache_hits_total %llu\n", atomic_load(&embed_hits));
    family(b, "tide_vision_embed_cache_misses_total", "counter", "Images the encoder had to encode.");
    sb_printf(b, "tide_vision_embed_cache_misses_total %llu\n", atomic_load(&embed_misses));
}

/* ---- request memory (request_budget, config request_memory_mib) ------------------------ */

static atomic_size_t output_peak;

void metrics_output_held(size_t bytes)
{
    size_t cur = atomic_load(&output_peak);
    while (bytes > cur && !atomic_compare_exchange_weak(&output_peak, &cur, bytes)) {}
}

static void render_request_memory(struct sb *b)
{
    family(b, "tide_output_buffer_peak_bytes", "gauge",
           "Most bytes one job's output channel has held unsent at once since start.");
    sb_printf(b, "tide_output_buffer_peak_bytes %zu\n", atomic_load(&output_peak));
    family(b, "tide_request_memory_bytes", "gauge",
           "Host memory held for requests in flight (bodies, parse trees, images, decodes).");
    sb_printf(b, "tide_request_memory_bytes %zu\n", atomic_load(&request_budget.used));
    family(b, "tide_request_memory_limit_bytes", "gauge", "request_memory_mib in bytes; 0 = no bound.");
    sb_printf(b, "tide_request_memory_limit_bytes %zu\n", atomic_load(&request_budget.limit));
    family(b, "tide_request_memory_refused_total", "counter",
           "Allocations refused for want of request memory (each answered 503).");
    sb_printf(b, "tide_request_memory_refused_total %zu\n", atomic_load(&request_budget.refused));
}

/* ---- init and render ------------------------------------------------------------------- */

void metrics_init(void)
{
    /* Resets everything: main calls it once at start-up, tests call it between cases. */
    pthread_mutex_lock(&req_mu);
    n_req = 0;
    pthread_mutex_unlock(&req_mu);
    atomic_store(&prompt_tokens, 0);
    atomic_store(&gen_tokens, 0);
    atomic_store(&running, 0);
    atomic_store(&waiting, 0);
    metrics_kv_slots(0, 0, 0, 0);
    atomic_store(&cached_tokens, 0);
    metrics_kv_parked(0, 0, 0, 0, 0, 0, 0);
    metrics_kv_shared(0, 0, 0, 0);
    for (int h = 0; h < METRICS_HIST_COUNT; h++) {
        pthread_mutex_lock(&hists[h].mu);
        memset(hists[h].n, 0, sizeof hists[h].n);
        hists[h].count = 0;
        hists[h].sum = 0;
        pthread_mutex_unlock(&hists[h].mu);
    }
    metrics_publish_devices(NULL, 0);
    atomic_store(&vision_state_idx, 0);
    atomic_store(&last_image_bits, 0);
    atomic_store(&vision_loads, 0);
    atomic_store(&vision_unloads, 0);
    atomic_store(&embed_hits, 0);
    atomic_store(&embed_misses, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    start_unix = (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void metrics_set_instance(const char *name)
{
    snprintf(instance_name, sizeof instance_name, "%s", name ? name : "");
}

char *metrics_render(void)
{
    struct sb b = {malloc(16384), 0, 16384, false};
    if (!b.p) return NULL;
    b.p[0] = 0;

    family(&b, "tide_build_info", "gauge", "Constant 1, labelled with the tide version.");
    sb_printf(&b, "tide_build_info{version=\"");
    sb_label_value(&b, TIDE_VERSION);
    sb_printf(&b, "\"} 1\n");
    char v[40];
    fmt_double(v, sizeof v, start_unix);
    if (instance_name[0]) {
        /* The identity as one info series, not a label on every series: counters stay
         * summable across a fleet, and a join on it names the daemon. */
        family(&b, "tide_instance_info", "gauge", "Constant 1, labelled with this daemon's instance name.");
        sb_printf(&b, "tide_instance_info{instance_name=\"");
        sb_label_value(&b, instance_name);
        sb_printf(&b, "\"} 1\n");
    }
    family(&b, "tide_process_start_time_seconds", "gauge", "Unix time the daemon started.");
    sb_printf(&b, "tide_process_start_time_seconds %s\n", v);

    /* Copy the table out so formatting happens without req_mu held. */
    struct req_series rc[MAX_REQ_SERIES];   /* 9 KiB: fine on an HTTP thread's stack */
    pthread_mutex_lock(&req_mu);
    int nr = n_req;
    memcpy(rc, req, (size_t)nr * sizeof *rc);
    pthread_mutex_unlock(&req_mu);
    family(&b, "tide_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int i = 0; i < nr; i++) {
        sb_printf(&b, "tide_requests_total{endpoint=\"");
        sb_label_value(&b, rc[i].endpoint);
        sb_printf(&b, "\",code=\"%d\"} %" PRIu64 "\n", rc[i].code, rc[i].n);
    }

    family(&b, "tide_requests_running", "gauge", "Requests the engine is generating for now.");
    sb_printf(&b, "tide_requests_running %d\n", atomic_load(&running));
    family(&b, "tide_requests_waiting", "gauge", "Requests waiting in the FIFO.");
    sb_printf(&b, "tide_requests_waiting %d\n", atomic_load(&waiting));
    family(&b, "tide_prompt_tokens_total", "counter", "Prompt tokens processed.");
    sb_printf(&b, "tide_prompt_tokens_total %lld\n", atomic_load(&prompt_tokens));
    family(&b, "tide_generation_tokens_total", "counter", "Tokens generated.");
    sb_printf(&b, "tide_generation_tokens_total %lld\n", atomic_load(&gen_tokens));
    family(&b, "tide_prompt_tokens_cached_total", "counter",
           "Prompt tokens whose KV rows were reused from an earlier request (prefix cache).");
    sb_printf(&b, "tide_prompt_tokens_cached_total %lld\n", atomic_load(&cached_tokens));
    family(&b, "tide_kv_slots", "gauge", "KV slots: sequences that can run at once.");
    sb_printf(&b, "tide_kv_slots %d\n", atomic_load(&kv_slots_total));
    family(&b, "tide_kv_slots_used", "gauge", "KV slots held by running sequences.");
    sb_printf(&b, "tide_kv_slots_used %d\n", atomic_load(&kv_slots_used));
    family(&b, "tide_kv_slots_cached", "gauge",
           "Idle KV slots keeping the rows of an ended request for a later prompt that shares its prefix.");
    sb_printf(&b, "tide_kv_slots_cached %d\n", atomic_load(&kv_slots_cached));
    family(&b, "tide_kv_cached_rows", "gauge", "KV rows (token positions) the idle slots keep for reuse.");
    sb_printf(&b, "tide_kv_cached_rows %lld\n", atomic_load(&kv_cached_rows));
    family(&b, "tide_kv_block_rows", "gauge", "Token positions a KV block holds (context when the pool is not paged).");
    sb_printf(&b, "tide_kv_block_rows %d\n", atomic_load(&m_kv_block_rows));
    family(&b, "tide_kv_blocks", "gauge", "KV blocks in the pool, by state: held by running sequences, kept only by "
           "idle slots for prefix reuse, free.");
    sb_printf(&b, "tide_kv_blocks{state=\"running\"} %d\n", atomic_load(&m_kv_blocks_running));
    sb_printf(&b, "tide_kv_blocks{state=\"cached\"} %d\n", atomic_load(&m_kv_blocks_cached));
    sb_printf(&b, "tide_kv_blocks{state=\"free\"} %d\n", atomic_load(&m_kv_blocks_free));
    family(&b, "tide_kv_blocks_shared", "gauge", "KV blocks held by more than one sequence's table (a shared prefix, in place).");
    sb_printf(&b, "tide_kv_blocks_shared %d\n", atomic_load(&m_kv_blocks_shared));
    family(&b, "tide_kv_sequences_paused", "gauge", "Sequences paused because the KV pool ran out of blocks.");
    sb_printf(&b, "tide_kv_sequences_paused %d\n", atomic_load(&m_kv_paused));
    family(&b, "tide_kv_preemptions_total", "counter", "Sequences paused because the KV pool ran out of blocks "
           "(each resumes with the same output).");
    sb_printf(&b, "tide_kv_preemptions_total %lld\n", atomic_load(&m_kv_pauses_total));
    family(&b, "tide_kv_parked_conversations", "gauge", "Conversations whose KV rows are parked in host RAM.");
    sb_printf(&b, "tide_kv_parked_conversations %d\n", atomic_load(&kv_parked));
    family(&b, "tide_kv_parked_bytes", "gauge", "Host RAM held by parked conversations.");
    sb_printf(&b, "tide_kv_parked_bytes %lld\n", atomic_load(&kv_parked_bytes));
    family(&b, "tide_kv_parked_budget_bytes", "gauge", "Host RAM parked conversations may hold (kv_host_mib).");
    sb_printf(&b, "tide_kv_parked_budget_bytes %lld\n", atomic_load(&kv_parked_budget));
    family(&b, "tide_kv_parked_total", "counter", "Conversations parked in host RAM when their KV slot was taken.");
    sb_printf(&b, "tide_kv_parked_total %lld\n", atomic_load(&kv_parked_total));
    family(&b, "tide_kv_restored_total", "counter", "Parked conversations copied back into a KV slot.");
    sb_printf(&b, "tide_kv_restored_total %lld\n", atomic_load(&kv_restored_total));
    family(&b, "tide_kv_restored_tokens_total", "counter",
           "Prompt tokens whose KV rows came back from host RAM instead of being computed.");
    sb_printf(&b, "tide_kv_restored_tokens_total %lld\n", atomic_load(&kv_restored_tokens));
    family(&b, "tide_kv_park_evicted_total", "counter", "Parked conversations dropped to stay within the budget.");
    sb_printf(&b, "tide_kv_park_evicted_total %lld\n", atomic_load(&kv_park_evicted));
    family(&b, "tide_kv_shared_tokens_total", "counter",
           "Prompt tokens whose KV rows were copied from another KV slot (a running sequence's too) instead of "
           "being computed.");
    sb_printf(&b, "tide_kv_shared_tokens_total %lld\n", atomic_load(&kv_shared_tokens));
    family(&b, "tide_kv_prefix_waits_total", "counter",
           "Prompts that waited for another sequence to compute their shared prefix (prefix_wait_tokens).");
    sb_printf(&b, "tide_kv_prefix_waits_total %lld\n", atomic_load(&kv_prefix_waits));
    family(&b, "tide_kv_block_cache_tokens_total", "counter",
           "KV rows found in the pool's prefix index (whole blocks an earlier request computed, or a paused "
           "request its own, mapped in place) instead of being computed.");
    sb_printf(&b, "tide_kv_block_cache_tokens_total %lld\n", atomic_load(&kv_block_cache_tokens));
    family(&b, "tide_kv_block_cache_evictions_total", "counter",
           "Cached KV blocks (reusable rows no sequence holds) taken for other rows, least recently cached first.");
    sb_printf(&b, "tide_kv_block_cache_evictions_total %lld\n", atomic_load(&kv_block_cache_evictions));

    for (int h = 0; h < METRICS_HIST_COUNT; h++) render_hist(&b, (enum metrics_hist)h);
    render_devices(&b);
    render_vision(&b);
    render_request_memory(&b);

    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}
