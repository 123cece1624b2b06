/* vision.h - the lazy vision lifecycle: the encoder costs no device memory until an image
 * arrives, and gives it back to the expert caches when images stop.
 *
 *   unloaded -> handback -> loading -> ready -> (idle_s without images) -> unloading -> regrow
 *   -> unloaded
 *
 * vision_ensure_ready (engine thread, an image request at the head of the FIFO) asks every
 * device for its hand-back reserve (the caches shrink by whole segments), loads the encoder
 * into the freed memory, and is then ready to encode. vision_tick (engine thread timer)
 * unloads after idle_s and regrows the caches to their full start-up size, keeping any
 * reserve set through /v1/vram. A failure anywhere puts the caches back and leaves text
 * serving. The state machine lives here and nowhere else. */
#ifndef TIDE_VISION_H
#define TIDE_VISION_H

#include "memory/plan.h"
#include "vision/clip.h"
#include "vision/qwen3vl.h"

enum vision_state { VISION_UNLOADED, VISION_HANDBACK, VISION_LOADING, VISION_READY, VISION_UNLOADING,
                    VISION_REGROW };

struct vision_options {
    const char *mmproj;
    bool lazy;
    double idle_s;
    int device;               /* the device the encoder runs on */
    long vram_mib;            /* -1: derived from the mmproj */
    int max_image_tokens;
    int n_threads;
    size_t embed_cache_entries;
    size_t embed_cache_bytes;
};

struct embed_entry;

/* What happened, for whoever watches (the server's metrics): vision_lifecycle.notify is called
 * on the engine thread right after each, with the counters already updated. */
enum vision_event { VISION_EV_STATE, VISION_EV_HANDBACK, VISION_EV_LOAD, VISION_EV_ENCODE, VISION_EV_UNLOAD,
                    VISION_EV_REGROW, VISION_EV_CACHE_HIT, VISION_EV_CACHE_MISS, VISION_EV_IMAGE };
struct vision_counters {
    uint64_t handbacks, loads, encodes, unloads, regrows, cache_hits, cache_misses;
    double last_regrow_s;         /* seconds of the last regrow (t_handback, t_load, t_encode below) */
};

struct vision_lifecycle {
    struct vision_options o;
    enum vision_state state;
    struct memory_plan *mem;      /* not owned */
    int n_embd_text;
    size_t need[PLAN_MAX_DEVICES];/* hand-back reserve per device */
    size_t weights_bytes, workspace_bytes;
    struct clip_model *clip;      /* NULL unless loaded */
    struct backend *be;           /* where the encoder computes (not owned) */
    struct backend cpu_be;        /* owned when a GPU's encoder runs on the CPU (TIDE_VISION_CPU=1) */
    struct clip_model *host;      /* GPU encoder: the weights' host copy (pinned), from init on */
    /* a Qwen-VL tower (mmproj projector qwen3vl_merger, qwen2vl_merger or qwen2.5vl_merger,
     * qwen3vl.h): on a CPU device (or TIDE_VISION_CPU=1) loaded into host memory charged to the
     * device's ledger as vision; on a GPU uploaded from q3v_host, the
     * f32 weights' host copy taken at init. NULL unless loaded. clip is then unused. */
    bool is_qwen3vl;
    int qwenvl_kind;              /* enum qwenvl_kind when is_qwen3vl */
    struct qwen3vl_tower *q3v;
    struct qwen3vl_tower *q3v_host;
    long q3v_patches;             /* the largest image the budget allows, in patches */
    int n_deepstack;              /* qwen3vl: deepstack features a row carries */
    int row_floats;               /* floats an image token's row: n_embd_text * (1 + n_deepstack) */
    double last_image;            /* tide_now() of the last image request; 0 = none */
    bool busy;                    /* an image request is running: no idle unload under it */
    double last_image_unix;
    /* embedding cache: LRU list of image hash -> embeddings */
    struct embed_entry *cache_head;
    size_t cache_entries, cache_bytes;
    /* test hook: TIDE_FAULT_VISION=load fails the next encoder load */
    bool fail_load;
    /* stats */
    double t_handback, t_load;    /* seconds of the last hand-back / load */
    double t_encode;              /* seconds of the last encode (cache misses only) */
    struct vision_counters count;
    void (*notify)(void *ud, const struct vision_lifecycle *v, enum vision_event ev); /* NULL: none */
    void *notify_ud;
};

const char *vision_state_name(enum vision_state s);
/* Reads the mmproj header (sizes only) and checks it fits the text model. */
int vision_init(struct vision_lifecycle *v, const struct vision_options *o, struct memory_plan *mem,
                int n_embd_text, char *err, size_t errlen);
void vision_free(struct vision_lifecycle *v);
/* Extra free bytes per device the caches must leave while the encoder is being brought in. */
void vision_lifecycle_extra(const struct vision_lifecycle *v, size_t *extra);
/* Engine thread: make the encoder ready (hand-back + load when needed). On failure the caches
 * are back and err says why. */
int vision_ensure_ready(struct vision_lifecycle *v, char *err, size_t errlen);
/* Engine thread: embeddings for one image (n_tokens rows of row_floats), malloc'd into *out;
 * *grid_w (when not NULL): tokens a row of the image's grid (qwen3vl), else 0.
 * Looks in the embedding cache first, keyed by the SHA-256 of bytes (a hit needs no encoder
 * and does not wake it). img: the decoded bytes, or NULL / no pixels: decoded here on a miss. */
int vision_embed(struct vision_lifecycle *v, const uint8_t *bytes, size_t n_bytes, const struct image_u8 *img,
                 float **out, int *n_tokens, int *grid_w, char *err, size_t errlen);
/* Token count an image will take (without encoding). */
int vision_n_tokens(const struct vision_lifecycle *v, int w, int h);
/* Mark an image request (resets the idle timer) and look the image up in the cache. */
void vision_touch(struct vision_lifecycle *v);
/* An image request starts / ends: no idle unload between the two, and the idle time counts
 * from the end. */
void vision_begin(struct vision_lifecycle *v);
void vision_end(struct vision_lifecycle *v);
bool vision_cached(struct vision_lifecycle *v, const uint8_t *bytes, size_t n_bytes);
/* Engine thread timer: unload + regrow once idle_s passed without an image. Returns true when
 * the state changed. */
bool vision_tick(struct vision_lifecycle *v);

#endif
