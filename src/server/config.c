/* config.c - load and validate the JSON config, then apply command-line flags.
 *
 * Validation is strict on purpose: a typo in a key name silently ignored is a
 * misconfigured production server, so unknown keys stop startup. */
#include "server/config.h"
#include "server/cli.h"
#include "engine/session.h" /* ENGINE_PREFIX_WAIT_DEFAULT */

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static void set_str(char **dst, const char *s)
{
    free(*dst);
    *dst = xstrdup(s);
}

void config_defaults(struct config *c)
{
    memset(c, 0, sizeof *c);
    c->host = strdup("127.0.0.1");
    c->port = 8080;
    c->context = 4096;
    c->queue_max = 64;
    c->max_batch_tokens = 2048;
    c->prefix_wait_tokens = ENGINE_PREFIX_WAIT_DEFAULT;
    c->kv_host_mib = -1;
    c->kv_block_size = FORWARD_KV_BLOCK_ROWS;
    c->queue_timeout_s = 600;
    c->request_timeout_s = 3600;
    c->drain_timeout_s = 30;
    c->request_memory_mib = 2048;
    c->json_max_elements = 100000;
    c->devices_auto = true;
    c->vram_elastic = true;
    c->vram_reserve_mib[0] = 0;
    c->n_vram_reserve = 1;
    c->vision = (struct vision_config){ .lazy = true, .idle_s = 900, .vram_mib = -1,
                                        .device = 0, .max_image_tokens = 1024,
                                        .max_images = 8,
                                        .embed_cache_entries = 64, .embed_cache_mib = 64 };
    c->http = (struct http_config){ .max_connections = 1000, .max_connections_per_ip = 128,
                                    .idle_timeout_s = 60 };
}

static void free_hosts(struct http_config *h)
{
    for (int i = 0; i < h->n_allowed_hosts; i++) free(h->allowed_hosts[i]);
    free(h->allowed_hosts);
    h->allowed_hosts = NULL;
    h->n_allowed_hosts = 0;
}

void config_free(struct config *c)
{
    free(c->host);
    free(c->model);
    free(c->mmproj);
    free(c->api_key);
    free(c->name);
    free_hosts(&c->http);
    for (int i = 0; i < c->n_cors_origins; i++) free(c->cors_origins[i]);
    memset(c, 0, sizeof *c);
}

/* "got ..." part of an error: the offending value, shortened. */
static void describe(const cJSON *v, char *out, size_t cap)
{
    char *s = cJSON_PrintUnformatted(v);
    if (!s) { snprintf(out, cap, "?"); return; }
    if (strlen(s) > 40) strcpy(s + 37, "...");
    snprintf(out, cap, "%s", s);
    free(s);
}

static int bad(char *err, size_t errlen, const char *path, const char *expected, const cJSON *v)
{
    char got[64];
    describe(v, got, sizeof got);
    snprintf(err, errlen, "config: %s: expected %s, got %s", path, expected, got);
    return TIDE_EINVAL;
}

/* Integer in [lo, hi]; JSON numbers with a fraction are rejected. */
static int get_int(const cJSON *v, const char *path, long lo, long hi, const char *expected,
                   long *out, char *err, size_t errlen)
{
    if (!cJSON_IsNumber(v)) return bad(err, errlen, path, expected, v);
    double d = v->valuedouble;
    if (d != floor(d) || d < (double)lo || d > (double)hi) return bad(err, errlen, path, expected, v);
    *out = (long)d;
    return 0;
}

static int get_bool(const cJSON *v, const char *path, bool *out, char *err, size_t errlen)
{
    if (!cJSON_IsBool(v)) return bad(err, errlen, path, "true or false", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_str(const cJSON *v, const char *path, bool nullable, char **out, char *err,
                   size_t errlen)
{
    if (nullable && cJSON_IsNull(v)) { set_str(out, NULL); return 0; }
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return bad(err, errlen, path, nullable ? "a non-empty string or null" : "a non-empty string", v);
    set_str(out, v->valuestring);
    return 0;
}

int config_kv_type(const char *name, int *out)
{
    if (strcmp(name, "f16") && strcmp(name, "f32"))
        return TIDE_EINVAL;
    *out = name[1] == '1' ? 16 : 32;
    return 0;
}

static int parse_devices(struct config *c, const cJSON *v, char *err, size_t errlen)
{
    if (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0) {
        c->devices_auto = true;
        c->n_devices = 0;
        return 0;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 || cJSON_GetArraySize(v) > CONFIG_MAX_DEVICES)
        return bad(err, errlen, "devices", "\"auto\" or a list of 1 to 16 devices", v);
    c->devices_auto = false;
    c->n_devices = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, v) {
        char path[64];
        int i = c->n_devices;
        struct device_config *dc = &c->devices[i];
        *dc = (struct device_config){ DEVICE_CPU, -1, -1 };
        snprintf(path, sizeof path, "devices[%d]", i);
        if (!cJSON_IsObject(d)) return bad(err, errlen, path, "an object", d);
        bool have_backend = false;
        const cJSON *f;
        cJSON_ArrayForEach(f, d) {
            char fp[96];
            snprintf(fp, sizeof fp, "%s.%s", path, f->string);
            long n;
            if (strcmp(f->string, "backend") == 0) {
                if (cJSON_IsString(f) && strcmp(f->valuestring, "cpu") == 0) dc->backend = DEVICE_CPU;
                else if (cJSON_IsString(f) && strcmp(f->valuestring, "cuda") == 0) dc->backend = DEVICE_CUDA;
                else return bad(err, errlen, fp, "\"cpu\" or \"cuda\"", f);
                have_backend = true;
            } else if (strcmp(f->string, "index") == 0) {
                if (get_int(f, fp, 0, 1023, "a non-negative integer", &n, err, errlen)) return TIDE_EINVAL;
                dc->index = (int)n;
            } else if (strcmp(f->string, "vram_mib") == 0) {
                if (cJSON_IsNull(f)) { dc->vram_mib = -1; continue; }
                if (get_int(f, fp, 1, 1L << 30, "a positive integer (MiB) or null", &n, err, errlen))
                    return TIDE_EINVAL;
                dc->vram_mib = n;
            } else {
                snprintf(err, errlen, "config: %s: unknown key (expected backend, index, vram_mib)", fp);
                return TIDE_EINVAL;
            }
        }
        if (!have_backend) {
            snprintf(err, errlen, "config: %s.backend: expected \"cpu\" or \"cuda\", got nothing", path);
            return TIDE_EINVAL;
        }
        c->n_devices++;
    }
    return 0;
}

static int parse_vision(struct config *c, const cJSON *v, char *err, size_t errlen)
{
    if (!cJSON_IsObject(v)) return bad(err, errlen, "vision", "an object", v);
    const cJSON *f;
    cJSON_ArrayForEach(f, v) {
        char fp[96];
        snprintf(fp, sizeof fp, "vision.%s", f->string);
        long n;
        struct vision_config *vc = &c->vision;
        if (strcmp(f->string, "lazy") == 0) {
            if (get_bool(f, fp, &vc->lazy, err, errlen)) return TIDE_EINVAL;
        } else if (strcmp(f->string, "idle_s") == 0) {
            if (get_int(f, fp, 0, 1L << 40, "a non-negative integer", &n, err, errlen)) return TIDE_EINVAL;
            vc->idle_s = n;
        } else if (strcmp(f->string, "vram_mib") == 0) {
            if (cJSON_IsNull(f)) { vc->vram_mib = -1; continue; }
            if (get_int(f, fp, 0, 1L << 30, "a non-negative integer (MiB) or null", &n, err, errlen))
                return TIDE_EINVAL;
            vc->vram_mib = n;
        } else if (strcmp(f->string, "device") == 0) {
            if (get_int(f, fp, 0, CONFIG_MAX_DEVICES - 1, "a device number 0..15", &n, err, errlen))
                return TIDE_EINVAL;
            vc->device = (int)n;
        } else if (strcmp(f->string, "max_image_tokens") == 0) {
            if (get_int(f, fp, 1, 1 << 20, "a positive integer", &n, err, errlen)) return TIDE_EINVAL;
            vc->max_image_tokens = (int)n;
        } else if (strcmp(f->string, "max_images") == 0) {
            if (get_int(f, fp, 0, CONFIG_MAX_IMAGES, "an integer 0..64", &n, err, errlen)) return TIDE_EINVAL;
            vc->max_images = (int)n;
        } else if (strcmp(f->string, "embed_cache_entries") == 0) {
            if (get_int(f, fp, 0, 1 << 20, "an integer 0..1048576", &n, err, errlen)) return TIDE_EINVAL;
            vc->embed_cache_entries = n;
        } else if (strcmp(f->string, "embed_cache_mib") == 0) {
            if (get_int(f, fp, 0, 1L << 20, "a non-negative integer (MiB)", &n, err, errlen)) return TIDE_EINVAL;
            vc->embed_cache_mib = n;
        } else {
            snprintf(err, errlen, "config: %s: unknown key (expected lazy, idle_s, vram_mib, device, "
                     "max_image_tokens, max_images, embed_cache_entries, embed_cache_mib)", fp);
            return TIDE_EINVAL;
        }
    }
    return 0;
}

/* "http": {"max_connections", "max_connections_per_ip", "idle_timeout_s", "allowed_hosts"} */
static int parse_http(struct config *c, const cJSON *v, char *err, size_t errlen)
{
    if (!cJSON_IsObject(v)) return bad(err, errlen, "http", "an object", v);
    struct http_config *h = &c->http;
    const cJSON *f;
    cJSON_ArrayForEach(f, v) {
        char fp[96];
        snprintf(fp, sizeof fp, "http.%s", f->string);
        long n;
        if (strcmp(f->string, "max_connections") == 0) {
            if (get_int(f, fp, 1, 1 << 20, "a positive integer", &n, err, errlen)) return TIDE_EINVAL;
            h->max_connections = n;
        } else if (strcmp(f->string, "max_connections_per_ip") == 0) {
            if (get_int(f, fp, 0, 1 << 20, "a non-negative integer (0 = no limit)", &n, err, errlen))
                return TIDE_EINVAL;
            h->max_connections_per_ip = n;
        } else if (strcmp(f->string, "idle_timeout_s") == 0) {
            if (get_int(f, fp, 0, 1 << 24, "a non-negative integer (seconds, 0 = never)", &n, err, errlen))
                return TIDE_EINVAL;
            h->idle_timeout_s = n;
        } else if (strcmp(f->string, "allowed_hosts") == 0) {
            free_hosts(h);
            if (cJSON_IsNull(f)) continue;
            int cnt = cJSON_GetArraySize(f);
            if (!cJSON_IsArray(f) || cnt > 256)
                return bad(err, errlen, fp, "null or a list of up to 256 host names", f);
            h->allowed_hosts = calloc((size_t)cnt + 1, sizeof *h->allowed_hosts);
            if (!h->allowed_hosts) return TIDE_ENOMEM;
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                char p[64];
                snprintf(p, sizeof p, "http.allowed_hosts[%d]", h->n_allowed_hosts);
                if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) > 253 ||
                    strpbrk(x->valuestring, " \t/@"))
                    return bad(err, errlen, p, "a host name without port, e.g. \"tide.lan\"", x);
                if (!(h->allowed_hosts[h->n_allowed_hosts] = strdup(x->valuestring))) return TIDE_ENOMEM;
                h->n_allowed_hosts++;
            }
        } else {
            snprintf(err, errlen, "config: %s: unknown key (expected max_connections, "
                     "max_connections_per_ip, idle_timeout_s, allowed_hosts)", fp);
            return TIDE_EINVAL;
        }
    }
    return 0;
}

static int parse_root(struct config *c, const cJSON *root, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) return bad(err, errlen, "(top level)", "an object", root);
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        const char *k = f->string;
        long n;
        int rc = 0;
        if (strcmp(k, "host") == 0) rc = get_str(f, k, false, &c->host, err, errlen);
        else if (strcmp(k, "model") == 0) rc = get_str(f, k, false, &c->model, err, errlen);
        else if (strcmp(k, "mmproj") == 0) rc = get_str(f, k, true, &c->mmproj, err, errlen);
        else if (strcmp(k, "api_key") == 0) rc = get_str(f, k, true, &c->api_key, err, errlen);
        else if (strcmp(k, "port") == 0) {
            /* 0 is allowed: the kernel picks a free port (tests). */
            rc = get_int(f, k, 0, 65535, "a port number 0..65535", &n, err, errlen);
            if (!rc) c->port = (int)n;
        } else if (strcmp(k, "context") == 0) {
            rc = get_int(f, k, 16, 1 << 24, "an integer of at least 16 (tokens)", &n, err, errlen);
            if (!rc) c->context = (int)n;
        } else if (strcmp(k, "threads") == 0) {
            rc = get_int(f, k, 0, 4096, "a non-negative integer (0 = all cores)", &n, err, errlen);
            if (!rc) c->threads = (int)n;
        } else if (strcmp(k, "queue_max") == 0) {
            rc = get_int(f, k, 1, 1 << 20, "a positive integer", &n, err, errlen);
            if (!rc) c->queue_max = (int)n;
        } else if (strcmp(k, "parallel") == 0) {
            if (cJSON_IsNull(f)) { c->parallel = 0; continue; }
            rc = get_int(f, k, 1, 256, "null or an integer 1..256 (sequences running at once)", &n, err, errlen);
            if (!rc) c->parallel = (int)n;
        } else if (strcmp(k, "kv_host_mib") == 0) {
            if (cJSON_IsNull(f)) { c->kv_host_mib = -1; continue; }
            rc = get_int(f, k, 0, 1 << 24, "null or a non-negative integer (MiB of host RAM for parked conversations; 0 = off)",
                         &n, err, errlen);
            if (!rc) c->kv_host_mib = (int)n;
        } else if (strcmp(k, "kv_block_size") == 0) {
            rc = get_int(f, k, 0, 4096, "0 or a power of two 16..4096 (positions a KV block; 0 = one block a sequence)",
                         &n, err, errlen);
            if (!rc && n && (n < 16 || (n & (n - 1))))
                rc = bad(err, errlen, k, "0 or a power of two 16..4096 (positions a KV block; 0 = one block a sequence)", f);
            if (!rc) c->kv_block_size = (int)n;
        } else if (strcmp(k, "kv_pool_tokens") == 0) {
            if (cJSON_IsNull(f)) { c->kv_pool_tokens = 0; continue; }
            rc = get_int(f, k, 1, 1L << 30, "null or a positive integer (positions the paged KV pool holds)", &n, err,
                         errlen);
            if (!rc) c->kv_pool_tokens = (long)n;
        } else if (strcmp(k, "kv_type") == 0) {
            if (cJSON_IsNull(f)) { c->kv_type = 0; continue; }
            rc = config_kv_type(cJSON_IsString(f) ? f->valuestring : "", &c->kv_type);
            if (rc) rc = bad(err, errlen, k, "\"f16\", \"f32\" or null", f);
        } else if (strcmp(k, "max_batch_tokens") == 0) {
            rc = get_int(f, k, 1, 1 << 20, "a positive integer (tokens one step may run)", &n, err, errlen);
            if (!rc) c->max_batch_tokens = (int)n;
        } else if (strcmp(k, "prefix_wait_tokens") == 0) {
            rc = get_int(f, k, 0, 1 << 20,
                         "a non-negative integer (prompt rows worth waiting for from a prefilling sequence; 0 = never wait)",
                         &n, err, errlen);
            if (!rc) c->prefix_wait_tokens = (int)n;
        } else if (strcmp(k, "queue_timeout_s") == 0 || strcmp(k, "request_timeout_s") == 0) {
            rc = get_int(f, k, 0, 1 << 24, "a non-negative integer (seconds, 0 = no bound)", &n, err, errlen);
            if (!rc) *(k[0] == 'q' ? &c->queue_timeout_s : &c->request_timeout_s) = (int)n;
        } else if (strcmp(k, "name") == 0) rc = get_str(f, k, true, &c->name, err, errlen);
        else if (strcmp(k, "drain_timeout_s") == 0) {
            rc = get_int(f, k, 0, 1 << 24, "a non-negative integer (seconds)", &n, err, errlen);
            if (!rc) c->drain_timeout_s = (int)n;
        } else if (strcmp(k, "request_memory_mib") == 0) {
            rc = get_int(f, k, 0, 1 << 30, "a non-negative integer (MiB, 0 = no bound)", &n, err, errlen);
            if (!rc) c->request_memory_mib = n;
        } else if (strcmp(k, "json_max_elements") == 0) {
            rc = get_int(f, k, 100, 1 << 30, "an integer of at least 100", &n, err, errlen);
            if (!rc) c->json_max_elements = n;
        } else if (strcmp(k, "devices") == 0) rc = parse_devices(c, f, err, errlen);
        else if (strcmp(k, "layer_split") == 0) {
            if (cJSON_IsNull(f)) { c->n_layer_split = 0; continue; }
            if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) < 1 || cJSON_GetArraySize(f) > CONFIG_MAX_DEVICES)
                return bad(err, errlen, k, "null or a list of 1 to 16 numbers", f);
            int i = 0;
            double sum = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                char p[48];
                snprintf(p, sizeof p, "layer_split[%d]", i);
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || !isfinite(x->valuedouble))
                    return bad(err, errlen, p, "a non-negative number", x);
                c->layer_split[i++] = x->valuedouble;
                sum += x->valuedouble;
            }
            if (sum <= 0) return bad(err, errlen, k, "shares that add up to more than 0", f);
            c->n_layer_split = i;
        } else if (strcmp(k, "vram_elastic") == 0) rc = get_bool(f, k, &c->vram_elastic, err, errlen);
        else if (strcmp(k, "vram_reserve_mib") == 0) {
            if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > CONFIG_MAX_DEVICES)
                return bad(err, errlen, k, "a list of up to 16 non-negative integers (MiB)", f);
            int i = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                char p[48];
                snprintf(p, sizeof p, "vram_reserve_mib[%d]", i);
                if (get_int(x, p, 0, 1L << 30, "a non-negative integer (MiB)", &n, err, errlen))
                    return TIDE_EINVAL;
                c->vram_reserve_mib[i++] = n;
            }
            c->n_vram_reserve = i;
        } else if (strcmp(k, "cors_origins") == 0) {
            if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > CONFIG_MAX_CORS_ORIGINS)
                return bad(err, errlen, k, "a list of up to 32 origins (\"https://host:port\", or \"*\")", f);
            for (int i = 0; i < c->n_cors_origins; i++) free(c->cors_origins[i]);
            c->n_cors_origins = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                char p[48];
                snprintf(p, sizeof p, "cors_origins[%d]", c->n_cors_origins);
                /* An origin is scheme://host[:port]: no path, and so no '/' after the "//" */
                const char *o = cJSON_IsString(x) ? x->valuestring : NULL, *h = o ? strstr(o, "://") : NULL;
                if (!o || (strcmp(o, "*") && (!h || h == o || !h[3] || strchr(h + 3, '/'))))
                    return bad(err, errlen, p, "an origin like \"https://example.com\" (no path) or \"*\"", x);
                if (!(c->cors_origins[c->n_cors_origins] = strdup(o))) return TIDE_ENOMEM;
                c->n_cors_origins++;
            }
        } else if (strcmp(k, "vision") == 0) rc = parse_vision(c, f, err, errlen);
        else if (strcmp(k, "http") == 0) rc = parse_http(c, f, err, errlen);
        else if (strcmp(k, "expert_cache") == 0) {
            if (!cJSON_IsObject(f)) return bad(err, errlen, k, "an object", f);
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                if (strcmp(x->string, "segment_mib") == 0) {
                    if (cJSON_IsNull(x)) { c->segment_mib = 0; continue; }
                    if (get_int(x, "expert_cache.segment_mib", 1, 1 << 20, "a positive integer (MiB) or null", &n,
                                err, errlen))
                        return TIDE_EINVAL;
                    c->segment_mib = n;
                } else {
                    snprintf(err, errlen, "config: expert_cache.%s: unknown key (expected segment_mib)", x->string);
                    return TIDE_EINVAL;
                }
            }
        } else {
            snprintf(err, errlen, "config: %s: unknown key", k);
            return TIDE_EINVAL;
        }
        if (rc) return rc;
    }
    if (c->n_layer_split && !c->devices_auto && c->n_layer_split != c->n_devices) {
        snprintf(err, errlen, "config: layer_split: expected one share per device (%d), got %d",
                 c->n_devices, c->n_layer_split);
        return TIDE_EINVAL;
    }
    return 0;
}

int config_parse(struct config *c, const char *json, char *err, size_t errlen)
{
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        char near[24] = "";
        if (at) snprintf(near, sizeof near, "%.20s", at);
        for (char *p = near; *p; p++) if (*p == '\n' || *p == '\r') *p = ' ';
        snprintf(err, errlen, "config: (file): expected valid JSON, got a syntax error near \"%s\"", near);
        return TIDE_EFORMAT;
    }
    int rc = parse_root(c, root, err, errlen);
    cJSON_Delete(root);
    return rc;
}

static int read_file(const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "config: cannot open %s: %s", path, strerror(errno));
        return TIDE_EIO;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return TIDE_ENOMEM;
    buf[len] = 0;
    *out = buf;
    return 0;
}

const char *config_usage(void) { return cli_usage(); }

void config_instance_name(const struct config *c, char *out, size_t cap)
{
    if (c->name) snprintf(out, cap, "%s", c->name);
    else snprintf(out, cap, "%s:%d", c->host ? c->host : "", c->port);
}

int config_load(struct config *c, int argc, char **argv, char *err, size_t errlen)
{
    config_defaults(c);
    const char *file = "config/tide.json";
    /* First pass: find --config, --help, --version, and reject unknown flags early. */
    int rc = cli_scan(argc, argv, &file, &c->help, &c->version, err, errlen);
    if (rc) return rc;
    if (c->help || c->version) return 0;
    char *text = NULL;
    rc = read_file(file, &text, err, errlen);
    if (rc) return rc;
    rc = config_parse(c, text, err, errlen);
    free(text);
    if (rc) return rc;
    if ((rc = cli_apply(c, argc, argv, err, errlen))) return rc;
    if (!c->model) {
        snprintf(err, errlen, "config: model: expected a path to a GGUF file, got nothing");
        return TIDE_EINVAL;
    }
    if (!c->host || !c->host[0]) {
        snprintf(err, errlen, "config: host: expected a non-empty string");
        return TIDE_EINVAL;
    }
    /* Relative model paths resolve against the current directory: fopen does that already,
     * so the path is kept as given (log lines then show what the user wrote). */
    return 0;
}
