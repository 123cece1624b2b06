/* runtime.h - what the engine thread owns, and the snapshot other threads read.
 *
 * The engine thread (server/scheduler.c) owns the engine (model, devices, expert caches, KV
 * slots) and the vision encoder; nothing else mutates them. After every change it calls
 * runtime_publish, which copies the per-device ledger, slots, sequences and vision state into
 * `snap` under a small lock and into the metrics; GET /v1/vram, /metrics and /health read only
 * that. */
#ifndef TIDE_RUNTIME_H
#define TIDE_RUNTIME_H

#include "engine/session.h"
#include "server/config.h"
#include "server/fifo.h"
#include "vision/vision.h"

#include <pthread.h>

struct vram_dev_snap {
    int index;
    const char *backend;
    size_t total, free, reserve;
    size_t used[MEM_KIND_COUNT];
    size_t cache_bytes, cache_full_bytes;
    int slots, slots_full;
    uint32_t l0, l1;
    uint64_t hits, misses, copied;
};

struct vram_snapshot {
    int n;
    struct vram_dev_snap d[PLAN_MAX_DEVICES];
    const char *vision_state;   /* string literal */
    bool vision_lazy;
    long vision_idle_s;
    double last_image_unix;     /* 0: none yet */
    size_t host_total, host_free, host_experts;
    int seq_running, seq_slots; /* sequences running now, and at most (KV slots) */
    int kv_cached_slots;        /* free slots whose rows a later prompt may reuse */
    long kv_running_rows;       /* KV rows (positions) the running sequences hold */
    long kv_cached_rows;        /* KV rows the cached slots keep for reuse */
    int kv_rows_per_slot;       /* context: rows a slot holds at most */
    bool kv_f16;                /* the KV cache's elements are f16 (else f32) */
    struct engine_kv_stats kv;  /* the KV pool's blocks (engine_kv_stats) */
    uint64_t kv_pauses_total, kv_resumes_total; /* sequences paused for KV blocks, and resumed */
    int parked;                 /* conversations parked in host RAM (engine/kv_park.h) */
    size_t parked_bytes, parked_budget;
    uint64_t parked_total, restored_total, restored_tokens_total, park_evicted_total;
    uint64_t shared_tokens_total, prefix_waits_total; /* prefix rows copied between slots, waits for them */
    uint64_t block_cache_tokens_total, block_cache_evictions_total; /* the KV blocks' prefix index */
    bool backend_failed;        /* a device's backend failed (sticky): the daemon is unhealthy */
    char backend_err[256];
};

struct vision_lifecycle;

struct scheduler;

struct runtime {
    struct engine eng;
    struct fifo *fifo;
    struct scheduler *sched;            /* the engine thread, once started */
    const struct config *cfg;
    struct vision_lifecycle *vision;    /* NULL without an mmproj */
    char vision_error[600];             /* why vision is off when an mmproj was named */
    pthread_mutex_t snap_mu;
    struct vram_snapshot snap;
};

/* Engine thread (scheduler.c): rebuild the snapshot and the device metrics from the live state. */
void runtime_publish(struct runtime *rt);
/* Any thread: a copy of the last snapshot. */
void runtime_snapshot(struct runtime *rt, struct vram_snapshot *out);

/* ---- the engine thread (scheduler.c) ---- */
/* Start it on rt (rt->fifo set): it admits queued jobs in arrival order into up to the engine's
 * KV slots of running sequences and steps them together (docs/DESIGN.md "One scheduler step"). */
int scheduler_start(struct runtime *rt);
/* Close the queue, cancel what runs (each reply ends with its error), join the thread. */
void scheduler_stop(struct runtime *rt);
/* The vision lifecycle's events into the metrics (vision_lifecycle.notify; ud unused). */
void runtime_vision_event(void *ud, const struct vision_lifecycle *v, enum vision_event ev);

#endif
