/* test_config.c - config loading: defaults, valid files, one-line errors naming the
 * key path, and command-line flags overriding keys. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "server/config.h"

static int parse(const char *json, struct config *c, char *err)
{
    config_defaults(c);
    return config_parse(c, json, err, 256);
}

Test(config, valid_file)
{
    struct config c;
    char err[256] = "";
    int rc = parse("{\"host\":\"0.0.0.0\",\"port\":9000,\"model\":\"m.gguf\",\"mmproj\":null,"
                   "\"context\":2048,\"threads\":4,\"api_key\":\"k\",\"queue_max\":3,"
                   "\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":96},{\"backend\":\"cuda\",\"index\":0}],"
                   "\"layer_split\":[0.6,0.4],\"vram_elastic\":false,\"vram_reserve_mib\":[1,2],"
                   "\"vision\":{\"lazy\":false,\"idle_s\":5,\"vram_mib\":null,\"device\":1,"
                   "\"max_image_tokens\":256,\"max_images\":2}}", &c, err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_str_eq(c.host, "0.0.0.0");
    cr_expect_eq(c.port, 9000);
    cr_expect_eq(c.context, 2048);
    cr_expect_eq(c.queue_max, 3);
    cr_expect_str_eq(c.api_key, "k");
    cr_expect(!c.devices_auto);
    cr_expect_eq(c.n_devices, 2);
    cr_expect_eq(c.devices[0].vram_mib, 96);
    cr_expect_eq(c.devices[1].backend, DEVICE_CUDA);
    cr_expect_eq(c.n_layer_split, 2);
    cr_expect_eq(c.n_vram_reserve, 2);
    cr_expect(!c.vision.lazy);
    cr_expect_eq(c.vision.idle_s, 5);
    cr_expect_eq(c.vision.max_images, 2);
    config_free(&c);
}

Test(config, defaults)
{
    struct config c;
    config_defaults(&c);
    cr_expect_str_eq(c.host, "127.0.0.1");
    cr_expect_eq(c.port, 8080);
    cr_expect_eq(c.context, 4096);
    cr_expect_eq(c.queue_max, 64);
    cr_expect_eq(c.queue_timeout_s, 600);
    cr_expect_eq(c.request_timeout_s, 3600);
    cr_expect(c.devices_auto && c.vram_elastic && c.vision.lazy);
    cr_expect_eq(c.vision.idle_s, 900);
    cr_expect_eq(c.prefix_wait_tokens, 64);
    config_free(&c);
}

static void expect_err(const char *json, const char *want)
{
    struct config c;
    char err[256] = "";
    int rc = parse(json, &c, err);
    cr_expect(rc < 0, "accepted %s", json);
    cr_expect(strstr(err, want) != NULL, "error \"%s\" lacks \"%s\"", err, want);
    cr_expect(strchr(err, '\n') == NULL, "more than one line: %s", err);
    config_free(&c);
}

Test(config, errors_name_the_key)
{
    expect_err("{\"vision\":{\"idle_s\":\"abc\"}}", "config: vision.idle_s: expected a non-negative integer, got \"abc\"");
    expect_err("{\"prot\":1}", "config: prot: unknown key");
    expect_err("{\"port\":70000}", "config: port:");
    expect_err("{\"port\":\"80\"}", "config: port:");
    expect_err("{\"context\":1.5}", "config: context:");
    expect_err("{\"queue_max\":0}", "config: queue_max:");
    expect_err("{\"queue_timeout_s\":-1}", "config: queue_timeout_s:");
    expect_err("{\"request_timeout_s\":\"60\"}", "config: request_timeout_s:");
    expect_err("{\"api_key\":5}", "config: api_key:");
    expect_err("{\"devices\":\"gpu\"}", "config: devices:");
    expect_err("{\"devices\":[{\"backend\":\"tpu\"}]}", "config: devices[0].backend:");
    expect_err("{\"devices\":[{\"backend\":\"cpu\",\"vram_mib\":-1}]}", "config: devices[0].vram_mib:");
    expect_err("{\"devices\":[{\"backend\":\"cpu\",\"colour\":1}]}", "config: devices[0].colour: unknown key");
    expect_err("{\"layer_split\":[0.5,\"x\"]}", "config: layer_split[1]:");
    expect_err("{\"vram_reserve_mib\":[-3]}", "config: vram_reserve_mib[0]:");
    expect_err("{\"vram_elastic\":1}", "config: vram_elastic:");
    expect_err("{\"vision\":{\"lazy\":\"yes\"}}", "config: vision.lazy:");
    expect_err("{\"vision\":{\"zoom\":1}}", "config: vision.zoom: unknown key");
    expect_err("{\"model\":", "config:");
    expect_err("{\"cors_origins\":\"*\"}", "config: cors_origins:");
    expect_err("{\"cors_origins\":[\"https://a.example/path\"]}", "config: cors_origins[0]:");
    expect_err("{\"cors_origins\":[\"*\",\"a.example\"]}", "config: cors_origins[1]:");
    expect_err("{\"prefix_wait_tokens\":-1}", "config: prefix_wait_tokens: expected a non-negative integer");
    struct config c;
    char err[256] = "";
    cr_expect_eq(parse("{\"prefix_wait_tokens\":0}", &c, err), 0, "%s", err);
    cr_expect_eq(c.prefix_wait_tokens, 0);
    config_free(&c);
}

Test(config, cors_origins)
{
    struct config c;
    char err[256] = "";
    cr_assert_eq(parse("{}", &c, err), 0);
    cr_expect_eq(c.n_cors_origins, 0, "none allowed by default");
    config_free(&c);
    cr_assert_eq(parse("{\"cors_origins\":[\"https://app.example:8443\",\"*\"]}", &c, err), 0, "%s", err);
    cr_expect_eq(c.n_cors_origins, 2);
    cr_expect_str_eq(c.cors_origins[0], "https://app.example:8443");
    cr_expect_str_eq(c.cors_origins[1], "*");
    config_free(&c);
}

Test(config, flags_override)
{
    char path[] = "/tmp/tide-cfg-XXXXXX";
    int fd = mkstemp(path);
    const char *j = "{\"host\":\"127.0.0.1\",\"port\":1234,\"model\":\"a.gguf\",\"api_key\":null}";
    cr_assert(write(fd, j, strlen(j)) == (ssize_t)strlen(j));
    close(fd);
    char *argv[] = { "tide", "--config", path, "--port", "4321", "--host", "0.0.0.0", "--model", "b.gguf",
                     "--api-key", "k2", "--threads", "3", "--mmproj", "p.gguf", NULL };
    struct config c;
    char err[256] = "";
    int rc = config_load(&c, 15, argv, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(c.port, 4321);
    cr_expect_str_eq(c.host, "0.0.0.0");
    cr_expect_str_eq(c.model, "b.gguf");
    cr_expect_str_eq(c.api_key, "k2");
    cr_expect_str_eq(c.mmproj, "p.gguf");
    cr_expect_eq(c.threads, 3);
    config_free(&c);
    char *bad[] = { "tide", "--config", path, "--port", "x", NULL };
    cr_expect_lt(config_load(&c, 5, bad, err, sizeof err), 0);
    cr_expect(strstr(err, "--port") != NULL, "%s", err);
    config_free(&c);
    char *unk[] = { "tide", "--colour", "x", NULL };
    cr_expect_lt(config_load(&c, 3, unk, err, sizeof err), 0);
    config_free(&c);
    char *missing[] = { "tide", "--config", "/nonexistent/tide.json", NULL };
    cr_expect_lt(config_load(&c, 3, missing, err, sizeof err), 0);
    cr_expect(strstr(err, "/nonexistent/tide.json") != NULL, "%s", err);
    config_free(&c);
    unlink(path);
}

/* Writes json to a temp file; path receives its name. */
static void temp_config(char *path, const char *json)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert(write(fd, json, strlen(json)) == (ssize_t)strlen(json));
    close(fd);
}

/* llama-server's spellings override their keys; --flag=value works too. */
Test(config, llama_server_flags)
{
    char path[] = "/tmp/tide-cfg-XXXXXX";
    temp_config(path, "{\"model\":\"a.gguf\",\"context\":512,\"parallel\":2,\"name\":\"file\","
                      "\"drain_timeout_s\":7}");
    char *argv[] = { "tide", "--config", path, "-c", "1024", "-np", "4", "-t", "2", "--metrics", "-m", "b.gguf",
                     "--name=gpu1", "--drain-timeout", "9", "--port=0", NULL };
    struct config c;
    char err[256] = "";
    cr_assert_eq(config_load(&c, 16, argv, err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.context, 1024);
    cr_expect_eq(c.parallel, 4);
    cr_expect_eq(c.threads, 2);
    cr_expect_str_eq(c.model, "b.gguf");
    cr_expect_str_eq(c.name, "gpu1");
    cr_expect_eq(c.drain_timeout_s, 9);
    cr_expect_eq(c.port, 0);
    config_free(&c);
    char *long_forms[] = { "tide", "--config", path, "--ctx-size", "2048", "--parallel", "3", "--threads", "1",
                           "--model", "c.gguf", NULL };
    cr_assert_eq(config_load(&c, 11, long_forms, err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.context, 2048);
    cr_expect_eq(c.parallel, 3);
    cr_expect_eq(c.threads, 1);
    cr_expect_str_eq(c.model, "c.gguf");
    config_free(&c);
    /* without flags the file's values stand */
    char *plain[] = { "tide", "--config", path, NULL };
    cr_assert_eq(config_load(&c, 3, plain, err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.context, 512);
    cr_expect_eq(c.parallel, 2);
    cr_expect_str_eq(c.name, "file");
    cr_expect_eq(c.drain_timeout_s, 7);
    config_free(&c);
    unlink(path);
}

/* A llama-server flag tide lacks and an unknown flag each stop start-up with one line naming it;
 * bad values name the flag and the range. */
Test(config, flags_refused_by_name)
{
    static const char *const llama[] = { "-ngl", "--n-gpu-layers", "--flash-attn", "-fa", "--cont-batching",
                                         "--jinja", "--chat-template", "-b", "-ub", "--mlock" };
    struct config c;
    char err[256];
    for (size_t i = 0; i < sizeof llama / sizeof llama[0]; i++) {
        char *argv[] = { "tide", (char *)llama[i], "1", NULL };
        err[0] = 0;
        cr_expect_eq(config_load(&c, 3, argv, err, sizeof err), TIDE_EINVAL, "%s", llama[i]);
        char want[96];
        snprintf(want, sizeof want, "config: %s: a llama-server flag tide does not have", llama[i]);
        cr_expect(strstr(err, want) == err, "%s -> %s", llama[i], err);
        cr_expect_null(strchr(err, '\n'));
        config_free(&c);
    }
    char *unk[] = { "tide", "--ctx", "5", NULL };
    cr_expect_eq(config_load(&c, 3, unk, err, sizeof err), TIDE_EINVAL);
    cr_expect_str_eq(err, "config: --ctx: unknown flag (see --help)");
    config_free(&c);
    char *bad_np[] = { "tide", "-np", "0", NULL };
    cr_expect_eq(config_load(&c, 3, bad_np, err, sizeof err), TIDE_EINVAL);
    cr_expect(strstr(err, "--parallel: expected an integer 1..") != NULL, "%s", err);
    config_free(&c);
    char *no_val[] = { "tide", "-c", NULL };
    cr_expect_eq(config_load(&c, 2, no_val, err, sizeof err), TIDE_EINVAL);
    cr_expect_str_eq(err, "config: -c: expected a value");
    config_free(&c);
    char *metrics_val[] = { "tide", "--metrics=1", NULL };
    cr_expect_eq(config_load(&c, 2, metrics_val, err, sizeof err), TIDE_EINVAL);
    cr_expect_str_eq(err, "config: --metrics: takes no value");
    config_free(&c);
    char *help[] = { "tide", "--help", NULL };
    cr_expect_eq(config_load(&c, 2, help, err, sizeof err), 0);
    cr_expect(c.help);
    config_free(&c);
    const char *u = config_usage();
    static const char *const listed[] = { "--ctx-size", "-np, --parallel", "-t, --threads", "--metrics",
                                          "--api-key", "--host", "--port", "-m, --model", "--mmproj", "--name" };
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++)
        cr_expect(strstr(u, listed[i]) != NULL, "--help lacks %s", listed[i]);
}

/* parallel, name and drain_timeout_s: defaults, types, and the host:port identity. */
Test(config, fleet_keys)
{
    struct config c;
    char err[256] = "";
    config_defaults(&c);
    cr_expect_eq(c.parallel, 0);
    cr_expect_null(c.name);
    cr_expect_eq(c.drain_timeout_s, 30);
    char id[64];
    config_instance_name(&c, id, sizeof id);
    cr_expect_str_eq(id, "127.0.0.1:8080");
    config_free(&c);
    cr_assert_eq(parse("{\"parallel\":null,\"name\":\"gpu0\",\"drain_timeout_s\":0}", &c, err), 0, "%s", err);
    config_instance_name(&c, id, sizeof id);
    cr_expect_str_eq(id, "gpu0");
    cr_expect_eq(c.drain_timeout_s, 0);
    config_free(&c);
    cr_expect_lt(parse("{\"parallel\":0}", &c, err), 0);
    cr_expect(strstr(err, "config: parallel: expected null or an integer 1..256") == err, "%s", err);
    config_free(&c);
    cr_expect_lt(parse("{\"name\":\"\"}", &c, err), 0);
    cr_expect(strstr(err, "config: name:") == err, "%s", err);
    config_free(&c);
    cr_expect_lt(parse("{\"drain_timeout_s\":-1}", &c, err), 0);
    cr_expect(strstr(err, "config: drain_timeout_s:") == err, "%s", err);
    config_free(&c);
}

/* The "http" object (issue 27): connection limits and allowed Host names. */
Test(config, http_limits)
{
    struct config c;
    char err[256] = "";
    config_defaults(&c);
    cr_expect_eq(c.http.max_connections, 1000);
    cr_expect_eq(c.http.max_connections_per_ip, 128);
    cr_expect_eq(c.http.idle_timeout_s, 60);
    cr_expect_null(c.http.allowed_hosts);
    int rc = config_parse(&c, "{\"http\":{\"max_connections\":50,\"max_connections_per_ip\":0,"
                              "\"idle_timeout_s\":5,\"allowed_hosts\":[\"tide.lan\",\"10.0.0.2\"]}}", err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(c.http.max_connections, 50);
    cr_expect_eq(c.http.max_connections_per_ip, 0);
    cr_expect_eq(c.http.idle_timeout_s, 5);
    cr_assert_eq(c.http.n_allowed_hosts, 2);
    cr_expect_str_eq(c.http.allowed_hosts[0], "tide.lan");
    cr_expect_str_eq(c.http.allowed_hosts[1], "10.0.0.2");
    config_free(&c);
    expect_err("{\"http\":{\"max_connections\":0}}", "config: http.max_connections: expected a positive integer, got 0");
    expect_err("{\"http\":{\"max_connections_per_ip\":\"8\"}}", "config: http.max_connections_per_ip:");
    expect_err("{\"http\":{\"idle_timeout_s\":-1}}", "config: http.idle_timeout_s:");
    expect_err("{\"http\":{\"allowed_hosts\":\"tide.lan\"}}", "config: http.allowed_hosts:");
    expect_err("{\"http\":{\"allowed_hosts\":[\"ok\",\"http://x/\"]}}", "config: http.allowed_hosts[1]:");
    expect_err("{\"http\":{\"allowed_hosts\":[\"\"]}}", "config: http.allowed_hosts[0]:");
    expect_err("{\"http\":{\"timeout\":1}}", "config: http.timeout: unknown key");
    expect_err("{\"http\":[]}", "config: http: expected an object");
}

/* kv_type: null (the default: f16), "f16", "f32", and --kv-type. */
Test(config, kv_type)
{
    struct config c;
    char err[256] = "";
    config_defaults(&c);
    cr_expect_eq(c.kv_type, 0);
    config_free(&c);
    cr_assert_eq(parse("{\"kv_type\":\"f32\"}", &c, err), 0, "%s", err);
    cr_expect_eq(c.kv_type, 32);
    config_free(&c);
    cr_assert_eq(parse("{\"kv_type\":\"f16\"}", &c, err), 0, "%s", err);
    cr_expect_eq(c.kv_type, 16);
    config_free(&c);
    cr_assert_eq(parse("{\"kv_type\":null}", &c, err), 0, "%s", err);
    cr_expect_eq(c.kv_type, 0);
    config_free(&c);
    cr_expect_lt(parse("{\"kv_type\":\"q8_0\"}", &c, err), 0);
    cr_expect(strstr(err, "config: kv_type: expected \"f16\", \"f32\" or null") == err, "%s", err);
    config_free(&c);
    char *flag[] = { "tide", "--kv-type", "f32", NULL };
    cr_assert_eq(config_load(&c, 3, flag, err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.kv_type, 32);
    config_free(&c);
    char *bad[] = { "tide", "--kv-type=bf16", NULL };
    cr_expect_eq(config_load(&c, 2, bad, err, sizeof err), TIDE_EINVAL);
    cr_expect_str_eq(err, "config: --kv-type: expected f16 or f32, got \"bf16\"");
    config_free(&c);
    cr_expect(strstr(config_usage(), "--kv-type") != NULL);
}
