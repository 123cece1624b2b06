/* config.h - daemon settings: JSON config file + command-line flags.
 *
 * config_load() fills struct config from defaults, then the file, then the flags
 * (flags win). Any problem gives a negative TIDE_E* code and ONE line in err naming
 * the key path and what was expected, e.g.
 *   config: vision.idle_s: expected a non-negative integer, got "abc" */
#ifndef TIDE_CONFIG_H
#define TIDE_CONFIG_H

#include "common.h"

#define CONFIG_MAX_DEVICES 16
#define CONFIG_MAX_CORS_ORIGINS 32
#define CONFIG_MAX_IMAGES 64 /* vision.max_images' ceiling: a request's image arrays (openai.c) */

enum device_backend { DEVICE_CPU, DEVICE_CUDA };

struct device_config {
    enum device_backend backend;
    int index;          /* -1 when not given */
    long vram_mib;      /* -1 when not given (whole device) */
};

struct vision_config {
    bool lazy;
    long idle_s;
    long vram_mib;      /* -1 = null: derived from the encoder */
    int device;
    int max_image_tokens;
    int max_images;
    long embed_cache_entries;   /* image embeddings kept (LRU) */
    long embed_cache_mib;
};

/* The "http" object (issue 27): connection limits and the Host names served. */
struct http_config {
    long max_connections;        /* open connections, all clients together */
    long max_connections_per_ip; /* from one address; 0 = no per-address limit */
    long idle_timeout_s;         /* a connection silent this long is closed; 0 = never */
    char **allowed_hosts;        /* Host names served besides loopback ones; NULL = null */
    int n_allowed_hosts;
};

struct config {
    char *host;
    int port;
    char *model;        /* absolute or relative to the current directory */
    char *mmproj;       /* NULL when null */
    int context;
    int threads;        /* 0 = all cores */
    char *api_key;      /* NULL: no key required */
    int queue_max;
    int parallel;          /* sequences running at once (KV slots); 0 = null: automatic (memory/plan.c) */
    int max_batch_tokens;  /* rows one scheduler step may run: decode tokens + prompt chunks */
    int prefix_wait_tokens; /* a prompt waits for a prefilling sequence's rows worth this many more (0: never) */
    int kv_host_mib;       /* conversations parked in host RAM (engine/kv_park.h); -1 = null: automatic */
    int kv_block_size;     /* positions a KV block (a power of two, 16..4096); 0: one block of context a
                              sequence (not paged) */
    long kv_pool_tokens;   /* positions the paged KV pool holds; 0 = null: parallel contexts' worth */
    int kv_type;           /* the KV cache's elements: 16 (f16), 32 (f32), 0 = null: f16 (f32 where the
                              model has no f16 form) */
    int queue_timeout_s;   /* a job still queued after this gets 503; 0 = no bound */
    int request_timeout_s; /* a job not done this long after it was queued gets 503; 0 = no bound */
    long request_memory_mib; /* bodies, parse trees, images, decodes of requests in flight; 0 = no bound */
    long json_max_elements;  /* JSON values in a request body; beyond: 413 */
    bool devices_auto;
    struct device_config devices[CONFIG_MAX_DEVICES];
    int n_devices;
    double layer_split[CONFIG_MAX_DEVICES];
    int n_layer_split;  /* 0 = null */
    bool vram_elastic;
    long vram_reserve_mib[CONFIG_MAX_DEVICES];
    int n_vram_reserve;
    struct vision_config vision;
    long segment_mib;   /* expert_cache.segment_mib; 0 = automatic */
    char *name;         /* instance identity (/v1/vram, /metrics); NULL: host:port */
    int drain_timeout_s; /* SIGTERM: finish running + queued work up to this long */
    struct http_config http;
    char *cors_origins[CONFIG_MAX_CORS_ORIGINS]; /* browser origins allowed cross-origin; "*" = any */
    int n_cors_origins; /* 0 (default): no CORS headers, preflights refused */
    bool help, version; /* --help / --version seen: main prints and returns */
};

/* Defaults only (no file). */
void config_defaults(struct config *c);
/* Parse JSON text into c (on top of what is there). */
int config_parse(struct config *c, const char *json, char *err, size_t errlen);
/* Full load: defaults, --config FILE (default config/tide.json), then flags. */
int config_load(struct config *c, int argc, char **argv, char *err, size_t errlen);
void config_free(struct config *c);
/* kv_type's value from its name ("f16" 16, "f32" 32): 0, or TIDE_EINVAL. */
int config_kv_type(const char *name, int *out);
const char *config_usage(void);
/* The instance identity: cfg->name, or "host:port" when it is null. */
void config_instance_name(const struct config *c, char *out, size_t cap);

#endif
