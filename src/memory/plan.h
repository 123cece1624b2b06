/* plan.h - the devices of one daemon, how the model is laid out on them, and the elastic part.
 *
 * memory_plan_init creates the devices (budgets, backends), cuts the layers into one range per
 * device (layer_split), checks that resident weights + KV + workspace + the start-up reserve fit
 * every device, and creates an empty expert cache per device. The forward stages are then built
 * on those devices; anything else that must be resident from the start (an eager vision encoder)
 * is loaded; then memory_plan_size_caches gives each cache what its device has left: that is the
 * cache's full size. memory_plan_apply later shrinks or grows the caches so every device has
 * its reserve (plus any extra asked for, e.g. the vision hand-back) free. Engine thread only. */
#ifndef TIDE_PLAN_H
#define TIDE_PLAN_H

#include "engine/forward.h"
#include "memory/expert_cache.h"

#define PLAN_MAX_DEVICES FORWARD_MAX_STAGES
/* KV slots when the config leaves `parallel` automatic (before halving to fit) */
#define PLAN_AUTO_SEQ_CPU 4
/* The prefill chunk of CPU-only plans. 512, not FORWARD_DEFAULT_BATCH's 64: a chunk reads
 * every routed expert's weights once, so 64-token chunks read an MoE's experts 8 times for a
 * 512-token prompt, and each expert saw ~8 tokens (too few to fill the f16 and int8 tiles).
 * The cost: a decode step that shares a scheduler step with a prompt waits for a longer chunk
 * (max_batch_tokens caps it). The buffer is small (~18 MiB for the big preset). A CPU device
 * with a vram_mib budget (a small GPU's stand-in) keeps FORWARD_DEFAULT_BATCH (plan.c). */
#define PLAN_CPU_BATCH 512
#define PLAN_AUTO_SEQ_CUDA 16

struct plan_device_options {
    enum device_kind kind;
    int hw_index;            /* CUDA ordinal, -1 for cpu */
    long vram_mib;           /* -1: the whole device (cpu: the host's RAM) */
    long reserve_mib;        /* start-up reserve */
};

struct plan_options {
    int n_devices;           /* 0: auto (every CUDA GPU, else one CPU device) */
    struct plan_device_options dev[PLAN_MAX_DEVICES];
    double layer_split[PLAN_MAX_DEVICES];
    int n_layer_split;       /* 0: an even split */
    size_t segment_bytes;    /* 0: automatic */
    int n_threads;
    int n_ctx;
    int max_batch_cap;       /* rows a step may run (max_batch_tokens): the prefill chunk is never
                                larger; 0: no cap */
    int max_batch;           /* prefill chunk (0: FORWARD_CUDA_BATCH with a CUDA device, else
                                PLAN_CPU_BATCH) */
    int n_seq;               /* KV slots: sequences that run at once (0: automatic, see plan.c) */
    long kv_host_mib;        /* conversation parking in host RAM (engine/kv_park.h): MiB, 0 off,
                                -1 automatic (what the host holds beside the experts, at most 2048) */
    enum kv_type kv_type;    /* the KV cache's elements (config kv_type; KV_AUTO: see forward.h);
                                zeroed options keep f32 */
    int kv_block_rows;       /* positions a KV block (config kv_block_size); 0: one block of n_ctx a
                                sequence (zeroed options) */
    long kv_pool_tokens;     /* positions the paged pool holds (config kv_pool_tokens); 0: n_seq
                                sequences of n_ctx */
};

struct memory_plan {
    int n_dev;
    struct device dev[PLAN_MAX_DEVICES];
    struct expert_cache cache[PLAN_MAX_DEVICES];
    uint32_t l0[PLAN_MAX_DEVICES], l1[PLAN_MAX_DEVICES];
    struct forward_stage_spec spec[PLAN_MAX_DEVICES];  /* for forward_init_stages */
    size_t host_expert_bytes;  /* every expert of the model, in host RAM */
    size_t kv_host_bytes;      /* the parked conversations' budget in host RAM */
    struct model *pinned;      /* the model whose experts this plan pinned, or NULL */
    int max_batch;
    int n_seq;                 /* KV slots the devices hold (every device holds all of them) */
    enum kv_type kv_type;      /* KV_F16 or KV_F32: what the devices' KV caches hold */
    int kv_block_rows;         /* positions a KV block; 0: not paged (one block of n_ctx a sequence) */
    int kv_blocks;             /* blocks in the pool when paged */
    /* Segments a cache could not get back when it last grew (a device allocation failed):
     * it is below its target until memory_plan_retry_grow gets them. 0 when in step. */
    int grow_behind[PLAN_MAX_DEVICES];
};

/* m is written to only to pin its experts (page-locked mirrors) when a CUDA device exists. */
int memory_plan_init(struct memory_plan *p, const struct plan_options *o, struct model *m,
                     char *err, size_t errlen);
/* Give each cache what its device has left above its reserve (capped at every expert). */
int memory_plan_size_caches(struct memory_plan *p);
/* Resize every cache so device d has reserve + extra[d] bytes free (extra may be NULL).
 * Grows back at most to the full size. shortfall[d] (bytes) is what could not be freed.
 * Returns 0, or 1 when some device falls short. */
int memory_plan_apply(struct memory_plan *p, const size_t *extra, size_t *shortfall);
/* Devices whose cache is below its target because an allocation failed while growing. */
int memory_plan_behind(const struct memory_plan *p);
/* Try again to grow the caches that are behind (memory_plan_apply with the same extra);
 * the engine timer calls it. Returns the number of devices still behind. */
int memory_plan_retry_grow(struct memory_plan *p, const size_t *extra);
void memory_plan_free(struct memory_plan *p);

/* Host RAM from /proc/meminfo (0 when unknown). */
void memory_host_ram(size_t *total, size_t *available);

#endif
