/* metrics.h - process-wide counters, gauges and histograms, rendered as Prometheus text 0.0.4.
 *
 * Updated from any thread (atomics / a small lock); metrics_render() runs on scrape and never
 * waits for the engine. Per-device memory series are a snapshot the engine thread publishes
 * after every change (metrics_publish_devices); the aggregate tide_expert_slots and
 * tide_expert_cache_bytes are computed from that same snapshot, so they always equal the sum
 * of the per-device series. Names and units: docs/METRICS.md. */
#ifndef TIDE_METRICS_H
#define TIDE_METRICS_H

#include "common.h"

#include <stdint.h>

void metrics_init(void);
/* One finished HTTP request: endpoint is the route path ("/v1/chat/completions", or
 * "other" for unknown paths). */
void metrics_request(const char *endpoint, int code);
void metrics_tokens(long prompt, long generated);
void metrics_running_add(int d);
void metrics_waiting_add(int d);
/* KV slots (sequences at once) held now and in all: tide_kv_slots_used, tide_kv_slots; idle slots
 * keeping rows for reuse and those rows: tide_kv_slots_cached, tide_kv_cached_rows. */
void metrics_kv_slots(int used, int total, int cached, long cached_rows);
/* The KV pool's blocks (engine_kv_stats) and the sequences paused for them: tide_kv_blocks*,
 * tide_kv_sequences_paused, tide_kv_preemptions_total. */
struct engine_kv_stats;
void metrics_kv_blocks(const struct engine_kv_stats *kv, uint64_t pauses_total);
/* Conversations parked in host RAM (engine/kv_park.h): tide_kv_parked_conversations, tide_kv_parked_bytes,
 * tide_kv_parked_budget_bytes, tide_kv_parked_total, tide_kv_restored_total,
 * tide_kv_restored_tokens_total, tide_kv_park_evicted_total (the engine's counts, published). */
/* Prefix rows shared between KV slots (engine/prefix_share.h): tide_kv_shared_tokens_total,
 * tide_kv_prefix_waits_total; and found in the KV blocks' prefix index (engine/prefix_cache.c):
 * tide_kv_block_cache_tokens_total, tide_kv_block_cache_evictions_total (the engine's counts,
 * published). */
void metrics_kv_shared(uint64_t tokens, uint64_t waits, uint64_t block_tokens, uint64_t block_evictions);
void metrics_kv_parked(int n, size_t bytes, size_t budget, uint64_t parked, uint64_t restored, uint64_t tokens,
                       uint64_t evicted);
/* Prompt tokens served from the prefix cache: tide_prompt_tokens_cached_total. */
void metrics_cached_tokens(long n);

/* Latency histograms, observed in seconds. */
enum metrics_hist {
    METRICS_TTFT,           /* tide_time_to_first_token_seconds */
    METRICS_E2E,            /* tide_request_duration_seconds (end-to-end) */
    METRICS_QUEUE,          /* tide_queue_time_seconds */
    METRICS_ITL,            /* tide_inter_token_latency_seconds */
    METRICS_VISION_LOAD,    /* tide_vision_load_seconds */
    METRICS_VISION_ENCODE,  /* tide_vision_encode_seconds */
    METRICS_HANDBACK,       /* tide_vram_handback_seconds */
    METRICS_REGROW,         /* tide_vram_regrow_seconds */
    METRICS_STEP_FORWARD,   /* tide_step_forward_seconds: a scheduler step's forward */
    METRICS_STEP_HOST,      /* tide_step_host_seconds: the rest of the step on the engine thread */
    METRICS_HIST_COUNT
};
void metrics_observe(enum metrics_hist h, double seconds);

/* Memory kinds of the device ledger (the same order as enum mem_kind in memory/device.h). */
enum metrics_mem_kind {
    METRICS_MEM_WEIGHTS, METRICS_MEM_KV, METRICS_MEM_WORKSPACE, METRICS_MEM_EXPERT_CACHE,
    METRICS_MEM_VISION, METRICS_MEM_KIND_COUNT
};

struct metrics_device {
    int index;
    const char *backend;            /* "cpu" | "cuda"; must be a string literal */
    uint64_t total_bytes, free_bytes, reserve_bytes;
    uint64_t used_bytes[METRICS_MEM_KIND_COUNT];
    uint64_t expert_slots, expert_slots_full;
    uint64_t expert_cache_bytes;
    uint64_t expert_hits, expert_misses, expert_bytes_copied;  /* counters, monotonic */
};

/* Replace the per-device snapshot (copied; n <= 16). */
void metrics_publish_devices(const struct metrics_device *d, int n);

/* Vision: state is one of "unloaded", "handback", "loading", "ready", "unloading", "regrow";
 * last_image_s_ago < 0 when no image was seen yet. */
void metrics_vision_state(const char *state);
void metrics_vision_last_image(double unix_time);   /* tide_vision_last_image_timestamp_seconds */
void metrics_vision_event(bool load);               /* tide_vision_loads_total / _unloads_total */
void metrics_vision_embed_cache(bool hit);          /* tide_vision_embed_cache_{hits,misses}_total */
/* A job's output channel holds this many unsent bytes (tide_output_buffer_peak_bytes: max). */
void metrics_output_held(size_t bytes);

/* The daemon's instance name (config `name`): tide_instance_info{instance_name="..."} 1.
 * Call before serving; copied. */
void metrics_set_instance(const char *name);

/* malloc'd text (caller frees), NULL on ENOMEM. */
char *metrics_render(void);

#endif
