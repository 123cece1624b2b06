/* test_metrics.c - /metrics text after known updates: every family has HELP and TYPE,
 * histogram buckets are cumulative and end in +Inf == _count, _sum adds up, the expert
 * aggregates equal the sum of the published devices, the vision state gauge is one-hot,
 * label values are escaped, concurrent writers lose nothing, and promtool (when installed)
 * reports no problem at all - not even a lint warning. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/metrics.h"

/* The value of the sample whose line starts with `series ` exactly (name plus labels);
 * NAN when there is none. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    return NAN;
}

static int count_lines_with_prefix(const char *text, const char *prefix)
{
    int k = 0;
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0) k++;
    return k;
}

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == 0)) return true;
    return false;
}

static void setup(void) { metrics_init(); }

TestSuite(metrics, .init = setup);

Test(metrics, every_sample_family_has_help_and_type)
{
    metrics_request("/v1/chat/completions", 200);
    char *t = metrics_render();
    cr_assert_not_null(t);
    /* Walk the samples: the family of each (name minus histogram suffixes) must have been
     * announced by "# TYPE" before it. */
    int samples = 0;
    for (const char *p = t; *p; ) {
        const char *e = strchr(p, '\n');
        cr_assert_not_null(e, "the text must end with a newline");
        if (*p != '#') {
            char name[128];
            size_t k = strcspn(p, "{ ");
            cr_assert_lt(k, sizeof name);
            memcpy(name, p, k);
            name[k] = 0;
            char fam[128];
            snprintf(fam, sizeof fam, "%s", name);
            static const char *const suf[] = {"_bucket", "_sum", "_count"};
            bool found = false;
            for (int s = -1; s < 3 && !found; s++) {
                snprintf(fam, sizeof fam, "%s", name);
                if (s >= 0) {
                    size_t fl = strlen(fam), sl = strlen(suf[s]);
                    if (fl <= sl || strcmp(fam + fl - sl, suf[s]) != 0) continue;
                    fam[fl - sl] = 0;
                }
                char help[160], type[160];
                snprintf(help, sizeof help, "# HELP %s ", fam);
                snprintf(type, sizeof type, "# TYPE %s ", fam);
                found = count_lines_with_prefix(t, help) == 1 && count_lines_with_prefix(t, type) == 1;
            }
            cr_expect(found, "no single HELP/TYPE pair for %s", name);
            cr_expect(strncmp(name, "tide_", 5) == 0, "%s lacks the tide_ prefix", name);
            samples++;
        }
        p = e + 1;
    }
    cr_expect_gt(samples, 50);
    free(t);
}

Test(metrics, requests_tokens_gauges)
{
    metrics_request("/v1/chat/completions", 200);
    metrics_request("/v1/chat/completions", 200);
    metrics_request("/v1/chat/completions", 400);
    metrics_request("other", 404);
    metrics_tokens(10, 5);
    metrics_tokens(3, 0);
    metrics_tokens(-4, -1);   /* ignored: counters never go down */
    metrics_running_add(1);
    metrics_waiting_add(3);
    metrics_waiting_add(-1);
    char *t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(sample(t, "tide_requests_total{endpoint=\"/v1/chat/completions\",code=\"200\"}"), 2);
    cr_expect_eq(sample(t, "tide_requests_total{endpoint=\"/v1/chat/completions\",code=\"400\"}"), 1);
    cr_expect_eq(sample(t, "tide_requests_total{endpoint=\"other\",code=\"404\"}"), 1);
    cr_expect_eq(sample(t, "tide_prompt_tokens_total"), 13);
    cr_expect_eq(sample(t, "tide_generation_tokens_total"), 5);
    cr_expect_eq(sample(t, "tide_requests_running"), 1);
    cr_expect_eq(sample(t, "tide_requests_waiting"), 2);
    cr_expect(has_line(t, "# TYPE tide_requests_total counter"));
    cr_expect(has_line(t, "tide_build_info{version=\"" TIDE_VERSION "\"} 1"));
    cr_expect_gt(sample(t, "tide_process_start_time_seconds"), 1.6e9);
    free(t);
}

/* The fleet identity is one info series; no other series carries it (summable counters). */
Test(metrics, instance_info_only_on_its_own_series)
{
    metrics_request("/v1/completions", 200);
    char *t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(count_lines_with_prefix(t, "tide_instance_info"), 0, "no name set, yet: %s", t);
    free(t);
    metrics_set_instance("host\"a:8080");
    t = metrics_render();
    metrics_set_instance(NULL);
    cr_assert_not_null(t);
    cr_expect_eq(sample(t, "tide_instance_info{instance_name=\"host\\\"a:8080\"}"), 1, "%s", t);
    cr_expect(has_line(t, "# TYPE tide_instance_info gauge"));
    cr_expect_eq(count_lines_with_prefix(t, "tide_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"), 1);
    const char *after = strchr(strstr(t, "tide_instance_info{"), '\n');
    cr_expect_null(strstr(after, "instance_name"), "instance_name on another series");
    free(t);
}

Test(metrics, label_values_are_escaped)
{
    metrics_request("/a\"b\\c\nd", 500);
    char *t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(sample(t, "tide_requests_total{endpoint=\"/a\\\"b\\\\c\\nd\",code=\"500\"}"), 1, "%s", t);
    free(t);
}

/* Parses the histogram `name` out of t and checks its shape; returns _count. */
static double check_histogram(const char *t, const char *name, double want_sum)
{
    char pre[160];
    snprintf(pre, sizeof pre, "%s_bucket{le=\"", name);
    size_t n = strlen(pre);
    double last_le = -INFINITY, last = 0;
    int buckets = 0;
    bool inf = false;
    for (const char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, pre, n) != 0) continue;
        cr_assert(!inf, "%s: a bucket after +Inf", name);
        double le = strncmp(p + n, "+Inf", 4) == 0 ? INFINITY : strtod(p + n, NULL);
        cr_expect_gt(le, last_le, "%s: le not ascending", name);
        const char *v = strstr(p, "} ");
        cr_assert_not_null(v);
        double c = strtod(v + 2, NULL);
        cr_expect_geq(c, last, "%s: buckets not cumulative", name);
        last = c;
        last_le = le;
        inf = isinf(le);
        buckets++;
    }
    cr_expect(inf, "%s: no +Inf bucket", name);
    cr_expect_geq(buckets, 10, "%s: too few buckets", name);
    char s[160];
    snprintf(s, sizeof s, "%s_count", name);
    double count = sample(t, s);
    cr_expect_eq(count, last, "%s: _count != +Inf bucket", name);
    snprintf(s, sizeof s, "%s_sum", name);
    cr_expect(fabs(sample(t, s) - want_sum) < 1e-9, "%s: _sum %g, want %g", name, sample(t, s), want_sum);
    return count;
}

Test(metrics, histograms_cumulative_count_sum)
{
    metrics_observe(METRICS_ITL, 0.004);
    metrics_observe(METRICS_ITL, 0.005);   /* le is inclusive: lands in le="0.005" */
    metrics_observe(METRICS_ITL, 0.02);
    metrics_observe(METRICS_ITL, 5000);    /* only in +Inf */
    metrics_observe(METRICS_ITL, -1);      /* clock step: counted as 0 */
    metrics_observe(METRICS_ITL, NAN);     /* ignored */
    metrics_observe(METRICS_E2E, 90);
    metrics_observe(METRICS_REGROW, 0.0003);
    metrics_observe(METRICS_STEP_FORWARD, 0.03);
    metrics_observe(METRICS_STEP_HOST, 0.00004);
    char *t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(check_histogram(t, "tide_inter_token_latency_seconds", 5000.029), 5);
    cr_expect_eq(sample(t, "tide_inter_token_latency_seconds_bucket{le=\"0.001\"}"), 1);
    cr_expect_eq(sample(t, "tide_inter_token_latency_seconds_bucket{le=\"0.005\"}"), 3);
    cr_expect_eq(sample(t, "tide_inter_token_latency_seconds_bucket{le=\"0.02\"}"), 4);
    cr_expect_eq(sample(t, "tide_inter_token_latency_seconds_bucket{le=\"1\"}"), 4);
    cr_expect_eq(check_histogram(t, "tide_request_duration_seconds", 90), 1);
    cr_expect_eq(sample(t, "tide_request_duration_seconds_bucket{le=\"60\"}"), 0);
    cr_expect_eq(sample(t, "tide_request_duration_seconds_bucket{le=\"120\"}"), 1);
    cr_expect_eq(check_histogram(t, "tide_vram_regrow_seconds", 0.0003), 1);
    cr_expect_eq(check_histogram(t, "tide_step_forward_seconds", 0.03), 1);
    cr_expect_eq(sample(t, "tide_step_forward_seconds_bucket{le=\"0.02\"}"), 0);
    cr_expect_eq(sample(t, "tide_step_forward_seconds_bucket{le=\"0.03\"}"), 1);
    cr_expect_eq(check_histogram(t, "tide_step_host_seconds", 0.00004), 1);
    cr_expect_eq(sample(t, "tide_step_host_seconds_bucket{le=\"5e-05\"}"), 1);
    static const char *const names[] = {
        "tide_time_to_first_token_seconds", "tide_queue_time_seconds", "tide_vision_load_seconds",
        "tide_vision_encode_seconds", "tide_vram_handback_seconds"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_expect_eq(check_histogram(t, names[i], 0), 0);
    free(t);
}

static struct metrics_device dev(int i, uint64_t slots, uint64_t bytes)
{
    return (struct metrics_device){
        .index = i, .backend = "cpu", .total_bytes = 256u << 20, .free_bytes = 10u << 20,
        .reserve_bytes = (uint64_t)i << 20, .used_bytes = {100u << 20, 20u << 20, 8u << 20, bytes, 0},
        .expert_slots = slots, .expert_slots_full = slots + 7, .expert_cache_bytes = bytes,
        .expert_hits = 1000 + i, .expert_misses = 50 + i, .expert_bytes_copied = 12345678901ull + i};
}

Test(metrics, device_aggregates_equal_sum_of_devices)
{
    char *t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(sample(t, "tide_expert_slots"), 0, "no devices published yet");
    free(t);

    struct metrics_device d[3] = {dev(0, 40, 40u << 20), dev(1, 24, 24u << 20), dev(2, 9, 9u << 20)};
    metrics_publish_devices(d, 3);
    t = metrics_render();
    cr_assert_not_null(t);
    cr_expect_eq(sample(t, "tide_expert_slots"), 73);
    cr_expect_eq(sample(t, "tide_expert_cache_bytes"), 73u << 20);
    double per = 0, per_b = 0;
    for (int i = 0; i < 3; i++) {
        char s[128];
        snprintf(s, sizeof s, "tide_device_expert_slots{device=\"%d\"}", i);
        per += sample(t, s);
        snprintf(s, sizeof s, "tide_device_expert_cache_bytes{device=\"%d\"}", i);
        per_b += sample(t, s);
        snprintf(s, sizeof s, "tide_device_expert_slots_full{device=\"%d\"}", i);
        cr_expect_eq(sample(t, s), d[i].expert_slots + 7);
        snprintf(s, sizeof s, "tide_device_memory_bytes{device=\"%d\",kind=\"expert_cache\"}", i);
        cr_expect_eq(sample(t, s), d[i].expert_cache_bytes);
        snprintf(s, sizeof s, "tide_device_memory_bytes{device=\"%d\",kind=\"weights\"}", i);
        cr_expect_eq(sample(t, s), 100u << 20);
        snprintf(s, sizeof s, "tide_device_reserve_bytes{device=\"%d\"}", i);
        cr_expect_eq(sample(t, s), (double)((uint64_t)i << 20));
        snprintf(s, sizeof s, "tide_expert_cache_misses_total{device=\"%d\"}", i);
        cr_expect_eq(sample(t, s), 50 + i);
        snprintf(s, sizeof s, "tide_expert_cache_copied_bytes_total{device=\"%d\"}", i);
        cr_expect_eq(sample(t, s), 12345678901.0 + i);
    }
    cr_expect_eq(per, sample(t, "tide_expert_slots"));
    cr_expect_eq(per_b, sample(t, "tide_expert_cache_bytes"));
    cr_expect_eq(count_lines_with_prefix(t, "tide_device_memory_bytes{"), 15);
    cr_expect(has_line(t, "tide_device_info{device=\"1\",backend=\"cpu\"} 1"));
    free(t);

    /* A later, smaller snapshot replaces the old one: device 2 disappears. */
    metrics_publish_devices(d, 1);
    t = metrics_render();
    cr_expect_eq(sample(t, "tide_expert_slots"), 40);
    cr_expect(isnan(sample(t, "tide_device_expert_slots{device=\"2\"}")));
    free(t);
}

static void expect_one_hot(const char *t, const char *want)
{
    static const char *const st[] = {"unloaded", "handback", "loading", "ready", "unloading", "regrow"};
    double sum = 0;
    for (int i = 0; i < 6; i++) {
        char s[96];
        snprintf(s, sizeof s, "tide_vision_state{state=\"%s\"}", st[i]);
        double v = sample(t, s);
        cr_expect_eq(v, strcmp(st[i], want) == 0 ? 1 : 0, "%s = %g while %s", st[i], v, want);
        sum += v;
    }
    cr_expect_eq(sum, 1);
}

Test(metrics, vision_state_one_hot_and_counters)
{
    char *t = metrics_render();
    expect_one_hot(t, "unloaded");
    cr_expect_eq(sample(t, "tide_vision_last_image_timestamp_seconds"), 0);
    free(t);
    static const char *const cycle[] = {"handback", "loading", "ready", "unloading", "regrow", "unloaded"};
    for (int i = 0; i < 6; i++) {
        metrics_vision_state(cycle[i]);
        t = metrics_render();
        expect_one_hot(t, cycle[i]);
        free(t);
    }
    metrics_vision_state("ready");
    metrics_vision_state("bogus");   /* ignored */
    metrics_vision_event(true);
    metrics_vision_event(true);
    metrics_vision_event(false);
    metrics_vision_embed_cache(true);
    metrics_vision_embed_cache(false);
    metrics_vision_embed_cache(false);
    metrics_vision_last_image(1764700000.25);
    t = metrics_render();
    expect_one_hot(t, "ready");
    cr_expect_eq(sample(t, "tide_vision_loads_total"), 2);
    cr_expect_eq(sample(t, "tide_vision_unloads_total"), 1);
    cr_expect_eq(sample(t, "tide_vision_embed_cache_hits_total"), 1);
    cr_expect_eq(sample(t, "tide_vision_embed_cache_misses_total"), 2);
    cr_expect_eq(sample(t, "tide_vision_last_image_timestamp_seconds"), 1764700000.25);
    free(t);
}

#define WRITERS 4
#define PER_WRITER 20000

static void *writer(void *arg)
{
    for (int i = 0; i < PER_WRITER; i++) {
        metrics_observe(METRICS_ITL, 0.01);
        metrics_tokens(1, 1);
        metrics_request("/v1/completions", 200);
        struct metrics_device d[2] = {dev(0, (uint64_t)i, (uint64_t)i << 10),
                                      dev(1, (uint64_t)i * 2, (uint64_t)i << 11)};
        if (i % 64 == 0) metrics_publish_devices(d, 2);
    }
    return NULL;
}

Test(metrics, concurrent_writers_and_scrapes)
{
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++) pthread_create(&th[i], NULL, writer, NULL);
    /* Scrape while they write: every render must be internally consistent. */
    for (int k = 0; k < 50; k++) {
        char *t = metrics_render();
        cr_assert_not_null(t);
        double c = sample(t, "tide_inter_token_latency_seconds_count");
        cr_expect_eq(c, sample(t, "tide_inter_token_latency_seconds_bucket{le=\"+Inf\"}"));
        double agg = sample(t, "tide_expert_slots");
        double s0 = sample(t, "tide_device_expert_slots{device=\"0\"}");
        double s1 = sample(t, "tide_device_expert_slots{device=\"1\"}");
        if (!isnan(s0)) cr_expect_eq(agg, s0 + s1, "aggregate from another snapshot");
        free(t);
    }
    for (int i = 0; i < WRITERS; i++) pthread_join(th[i], NULL);
    char *t = metrics_render();
    cr_expect_eq(sample(t, "tide_inter_token_latency_seconds_count"), WRITERS * PER_WRITER);
    cr_expect_eq(sample(t, "tide_generation_tokens_total"), WRITERS * PER_WRITER);
    cr_expect_eq(sample(t, "tide_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"),
                 WRITERS * PER_WRITER);
    free(t);
}

Test(metrics, promtool_reports_nothing)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP metrics::promtool_reports_nothing: promtool not installed "
                        "(scripts/install-deps.sh installs Debian's prometheus)\n");
        cr_skip_test("promtool not installed");
    }
    metrics_request("/v1/chat/completions", 200);
    metrics_request("other", 404);
    metrics_tokens(7, 3);
    for (int h = 0; h < METRICS_HIST_COUNT; h++) metrics_observe((enum metrics_hist)h, 0.3 * (h + 1));
    struct metrics_device d[2] = {dev(0, 40, 40u << 20), dev(1, 24, 24u << 20)};
    metrics_publish_devices(d, 2);
    metrics_vision_state("loading");
    metrics_vision_last_image(1764700000.5);
    metrics_set_instance("gpu0.example:8080");
    char *t = metrics_render();
    metrics_set_instance(NULL);
    cr_assert_not_null(t);
    char in[] = "/tmp/tide-metrics-XXXXXX";
    int fd = mkstemp(in);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, t, strlen(t)), (ssize_t)strlen(t));
    close(fd);
    char cmd[128], out[4096] = "";
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", in);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    unlink(in);
    cr_expect_eq(rc, 0, "promtool exit %d: %s", rc, out);
    cr_expect_eq(n, 0, "promtool said: %s", out);
    free(t);
}
