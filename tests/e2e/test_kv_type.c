/* test_kv_type.c - end-to-end: the KV cache's element type (config kv_type) and the KV pool as
 * /v1/vram and /metrics show it. The default (f16 on a CPU device) and "f32" both serve; /metrics
 * counts the f16 cache at half the f32 bytes and /v1/vram's kv_mib, kv_bytes and kv_type follow;
 * under a device budget the automatic parallel keeps twice the slots when the rows are half as
 * large. A kv_type that is neither is refused at start-up. After a request its slot is free and
 * keeps its rows for reuse (sequences.cached_rows, tide_kv_cached_rows). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "req_harness.h"

struct seen {
    double kv_bytes;  /* /metrics tide_device_memory_bytes{kind="kv"} */
    double kv_mib;    /* /v1/vram totals.kv_mib */
    double slots;     /* /v1/vram sequences.slots */
    double vram_kv_bytes; /* /v1/vram devices[0].kv_bytes */
    char kv_type[8];      /* /v1/vram devices[0].kv_type */
};

static struct seen serve_and_look(const char *cfg)
{
    harness_start(cfg);
    cJSON *chat = harness_post_ok("/v1/chat/completions",
                                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Count with me: one two\"}],"
                                  "\"max_tokens\":12,\"temperature\":0}");
    cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(chat, "choices"), 0), "message");
    cJSON *content = cJSON_GetObjectItem(msg, "content");
    cr_assert(cJSON_IsString(content) && content->valuestring[0], "%s: a reply with text", cfg);
    cJSON_Delete(chat);
    struct seen s = {0};
    struct harness_reply r = harness_req("GET", "/v1/vram", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cJSON *v = harness_json(&r);
    s.kv_mib = cJSON_GetObjectItem(cJSON_GetObjectItem(v, "totals"), "kv_mib")->valuedouble;
    s.slots = cJSON_GetObjectItem(cJSON_GetObjectItem(v, "sequences"), "slots")->valuedouble;
    cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(v, "devices"), 0);
    cJSON *kb = cJSON_GetObjectItem(d0, "kv_bytes"), *kt = cJSON_GetObjectItem(d0, "kv_type");
    cr_assert(cJSON_IsNumber(kb) && cJSON_IsString(kt), "/v1/vram devices[0] has kv_bytes and kv_type");
    s.vram_kv_bytes = kb->valuedouble;
    snprintf(s.kv_type, sizeof s.kv_type, "%s", kt->valuestring);
    cJSON_Delete(v);
    harness_reply_free(&r);
    r = harness_req("GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    const char *k = strstr(r.body, "tide_device_memory_bytes{device=\"0\",kind=\"kv\"} ");
    cr_assert_not_null(k, "/metrics has the KV bytes");
    s.kv_bytes = strtod(strchr(k, '}') + 2, NULL);
    harness_reply_free(&r);
    harness_stop();
    return s;
}

static void done(void) { harness_stop(); }

Test(kv_type, default_and_f32_both_serve_and_count_their_bytes, .fini = done, .timeout = 120)
{
    struct seen f16 = serve_and_look("\"parallel\":2");
    struct seen f32 = serve_and_look("\"parallel\":2,\"kv_type\":\"f32\"");
    struct seen f16x = serve_and_look("\"parallel\":2,\"kv_type\":\"f16\"");
    cr_assert_gt(f16.kv_bytes, 0);
    cr_expect_eq(f32.kv_bytes, 2 * f16.kv_bytes, "f32 %.0f bytes, default %.0f", f32.kv_bytes, f16.kv_bytes);
    cr_expect_eq(f16x.kv_bytes, f16.kv_bytes, "\"f16\" is the default on a CPU device");
    cr_expect_geq(f32.kv_mib, 2 * f16.kv_mib - 1, "/v1/vram kv_mib: f32 %.0f, f16 %.0f", f32.kv_mib, f16.kv_mib);
    cr_expect_leq(f32.kv_mib, 2 * f16.kv_mib, "/v1/vram kv_mib: f32 %.0f, f16 %.0f", f32.kv_mib, f16.kv_mib);
    cr_expect(f16.slots == 2 && f32.slots == 2);
    cr_expect_str_eq(f16.kv_type, "f16");
    cr_expect_str_eq(f32.kv_type, "f32");
    cr_expect_str_eq(f16x.kv_type, "f16");
    cr_expect_eq(f16.vram_kv_bytes, f16.kv_bytes, "/v1/vram kv_bytes %.0f, /metrics %.0f", f16.vram_kv_bytes,
                 f16.kv_bytes);
    cr_expect_eq(f32.vram_kv_bytes, f32.kv_bytes, "/v1/vram kv_bytes %.0f, /metrics %.0f", f32.vram_kv_bytes,
                 f32.kv_bytes);
}

/* An 8 MiB device (models/tide-moe.gguf, context 1024): four f32 slots do not fit beside the
 * weights, workspace and the expert cache's staging slot, so automatic parallel halves to 2;
 * four f16 slots do. */
Test(kv_type, automatic_parallel_holds_twice_the_slots_in_f16, .fini = done, .timeout = 120)
{
    const char *dev = "\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":8}]";
    char cfg[256];
    struct seen f16 = serve_and_look(dev);
    snprintf(cfg, sizeof cfg, "%s,\"kv_type\":\"f32\"", dev);
    struct seen f32 = serve_and_look(cfg);
    cr_expect_eq(f16.slots, 2 * f32.slots, "slots: f16 %.0f, f32 %.0f", f16.slots, f32.slots);
    cr_expect_eq(f16.kv_bytes, f32.kv_bytes, "the same KV bytes hold twice the slots");
}

Test(kv_type, an_unknown_type_stops_start_up_naming_the_key, .timeout = 30)
{
    const char *bin = getenv("TIDE_BIN") ? getenv("TIDE_BIN") : "build/tide";
    char path[64], log[64];
    snprintf(path, sizeof path, "/tmp/tide-e2e-kvtype-%d.json", (int)getpid());
    snprintf(log, sizeof log, "/tmp/tide-e2e-kvtype-%d.log", (int)getpid());
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"model\":\"models/tide-moe.gguf\",\"kv_type\":\"q8_0\",\"port\":0}");
    fclose(f);
    pid_t p = fork();
    if (p == 0) {
        freopen(log, "w", stderr);
        execl(bin, bin, "--config", path, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 127, "start-up refused");
    char buf[4096] = "";
    f = fopen(log, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    cr_expect(strstr(buf, "kv_type: expected \"f16\", \"f32\" or null") != NULL, "stderr: %s", buf);
    unlink(path);
    unlink(log);
}

static double metric(const char *text, const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(text, key);
    cr_assert_not_null(at, "/metrics has %s", name);
    return strtod(at + strlen(key), NULL);
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    cr_assert(cJSON_IsNumber(v), "sequences.%s is a number", key);
    return v->valuedouble;
}

/* The KV pool after requests: the slots are free again, the ones that served keep their rows
 * (prompt and reply but the last token, which was never fed back) for a later prompt, and
 * /metrics says the same as /v1/vram. */
Test(kv_pool, idle_slots_keep_their_rows_and_both_endpoints_say_so, .fini = done, .timeout = 60)
{
    harness_start("\"parallel\":3,\"context\":512");
    long rows = 0, last = 0;
    const char *asks[] = {"Count with me: one two", "Name three shapes, please."};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                 "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true}", asks[i]);
        cJSON *c = harness_post_ok("/v1/chat/completions", body);
        cJSON *u = cJSON_GetObjectItem(c, "usage");
        last = (long)num(u, "prompt_tokens") + (long)num(u, "completion_tokens") - 1;
        rows += last;
        cJSON_Delete(c);
    }
    struct harness_reply r = harness_req("GET", "/v1/vram", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cJSON *v = harness_json(&r);
    harness_reply_free(&r);
    const cJSON *sq = cJSON_GetObjectItem(v, "sequences");
    cr_expect_eq(num(sq, "slots"), 3);
    cr_expect_eq(num(sq, "running"), 0);
    cr_expect_eq(num(sq, "free"), 3);
    cr_expect_eq(num(sq, "rows_per_slot"), 512);
    cr_expect_eq(num(sq, "running_rows"), 0);
    /* the second prompt shares the template's head with the first: it may take the first's slot
     * (keeping only its own rows there) or a fresh one */
    double cached = num(sq, "cached"), cached_rows = num(sq, "cached_rows");
    cr_expect(cached >= 1 && cached <= 2, "cached slots %.0f", cached);
    cr_expect_eq(cached_rows, cached == 2 ? rows : last, "cached rows %.0f in %.0f slots (requests: %ld, last %ld)",
                 cached_rows, cached, rows, last);
    r = harness_req("GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_expect_eq(metric(r.body, "tide_kv_slots_cached"), cached);
    cr_expect_eq(metric(r.body, "tide_kv_cached_rows"), cached_rows);
    cr_expect_eq(metric(r.body, "tide_kv_slots_used"), 0);
    harness_reply_free(&r);
    cJSON_Delete(v);
    harness_stop();
}
