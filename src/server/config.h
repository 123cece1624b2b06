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

struct config {
    char *host;
    int port;
    char *model;        /* absolute or relative to the current directory */
    char *mmproj;       /* NULL when null */
    int context;
    int threads;        /* 0 = all cores */
    char *api_key;      /* NULL: no key required */
    int queue_max;
    int queue_timeout_s;   /* a job still queued after this gets 503; 0 = no bound */
    int request_timeout_s; /* a job not done this long after it was queued gets 503; 0 = no bound */
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
const char *config_usage(void);

#endif
