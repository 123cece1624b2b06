/* vision.c - the lazy lifecycle and the image-embedding cache. Engine thread only. */
#include "vision/vision.h"
#include "vision/content_hash.h"
#include "engine/backend_cuda.h"
#include "engine/gguf.h"
#include "vision/dynres.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const state_names[] = {"unloaded", "handback", "loading", "ready", "unloading", "regrow"};

const char *vision_state_name(enum vision_state s) { return state_names[s]; }

struct embed_entry {
    uint8_t key[CONTENT_HASH_SIZE]; /* SHA-256 of the image bytes */
    size_t n_bytes;           /* image bytes, part of the key */
    int n_tokens;
    int grid_w;               /* qwen3vl: tokens a grid row, else 0 */
    float *embd;              /* (n_tokens, row_floats) */
    struct embed_entry *prev, *next;
};

/* The GPU encoder's host copy of the weights: page-locked through the backend's host_alloc
 * (uploads then run at the bus's full speed), plain malloc where that fails. One block. */
struct host_copy_ctx {
    struct backend *be;
    void *p;
    bool pinned;
};
static struct host_copy_ctx host_ctx; /* one encoder per process */

static void *h_alloc(void *ud, size_t bytes)
{
    struct host_copy_ctx *c = ud;
    void *p = c->be->i->host_alloc ? c->be->i->host_alloc(c->be->ctx, bytes) : NULL;
    c->pinned = p != NULL;
    if (!p)
        p = malloc(bytes ? bytes : 1);
    c->p = p;
    return p;
}

static void h_free(void *ud, void *p)
{
    struct host_copy_ctx *c = ud;
    if (!p)
        return;
    if (p == c->p && c->pinned)
        c->be->i->host_free(c->be->ctx, p);
    else
        free(p);
    if (p == c->p)
        c->p = NULL;
}

/* cudaMalloc hands out whole 2 MiB pages for blocks this size and larger: the hand-back
 * must free the pages, not just the bytes the ledger counts. */
static size_t gpu_pages(size_t bytes) { return (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1); }

/* The encoder's allocations, charged to the vision device's ledger as "vision". */
#define VISION_MAX_BLOCKS 16
struct vision_alloc_ctx {
    struct device *dev;
    bool host;              /* GPU device: charge its ledger, compute from host memory */
    void *p[VISION_MAX_BLOCKS];
    size_t n[VISION_MAX_BLOCKS];
};
static struct vision_alloc_ctx alloc_ctx; /* one encoder per process */

static void *v_alloc(void *ud, size_t bytes)
{
    struct vision_alloc_ctx *c = ud;
    for (int i = 0; i < VISION_MAX_BLOCKS; i++)
        if (!c->p[i]) {
            void *p;
            if (c->host) {
                p = NULL;
                if (device_charge(c->dev, MEM_VISION, bytes) == 0 && !(p = malloc(bytes)))
                    device_uncharge(c->dev, MEM_VISION, bytes);
            } else {
                p = device_alloc(c->dev, MEM_VISION, bytes);
            }
            if (p) {
                c->p[i] = p;
                c->n[i] = bytes;
            }
            return p;
        }
    return NULL;
}

static void v_free(void *ud, void *p)
{
    struct vision_alloc_ctx *c = ud;
    for (int i = 0; i < VISION_MAX_BLOCKS; i++)
        if (p && c->p[i] == p) {
            if (c->host) {
                free(p);
                device_uncharge(c->dev, MEM_VISION, c->n[i]);
            } else {
                device_free(c->dev, MEM_VISION, p, c->n[i]);
            }
            c->p[i] = NULL;
            c->n[i] = 0;
        }
}

/* A failed CUDA call inside the encoder's ops (they return void): 0 or its code. */
static int backend_error(const struct vision_lifecycle *v, char *msg, size_t msglen)
{
    if (v->mem->dev[v->o.device].kind != DEVICE_KIND_CUDA || v->be != &v->mem->dev[v->o.device].be)
        return 0;
    int rc = backend_cuda_error(v->be, msg, msglen);
    return rc < 0 ? rc : 0;
}

static void event(struct vision_lifecycle *v, enum vision_event ev)
{
    if (v->notify)
        v->notify(v->notify_ud, v, ev);
}

static void set_state(struct vision_lifecycle *v, enum vision_state s)
{
    v->state = s;
    event(v, VISION_EV_STATE);
}

/* Does the mmproj at path name this projector type? (false when unreadable: the clip path then
 * says why) */
static bool projector_is(const char *path, const char *type)
{
    struct gguf_file g;
    if (gguf_open(&g, path, NULL, 0))
        return false;
    struct gguf_str s;
    bool is = (!gguf_get_str(&g, "clip.projector_type", &s) || !gguf_get_str(&g, "clip.vision.projector_type", &s)) &&
              gguf_str_eq(s, type);
    gguf_close(&g);
    return is;
}

/* A Qwen-VL tower: on a CPU device (or a GPU's with TIDE_VISION_CPU=1) the CPU computes it
 * from host memory charged to the device; on a GPU it is uploaded from a host copy taken now
 * (pinned), so a cold image pays an upload, not a file read: of its f32 weights, or with
 * TIDE_VISION_TC=1 of the tensor-core layout (qwen3vl_load_tc: the products in q8_0 / f16).
 * The reserve is the weights as uploaded and the workspace of the largest image the budget
 * allows, from the header (on a GPU in whole 2 MiB pages), plus the scratch the tc layout's
 * quantised products take from the backend's pool. */
static int init_qwen3vl(struct vision_lifecycle *v, const struct vision_options *o, int n_embd_text, char *err,
                        size_t errlen)
{
    char e2[256] = "";
    struct qwen3vl_hparams hp;
    int rc = qwen3vl_read_hparams(o->mmproj, &hp, e2, sizeof e2);
    if (rc == 0)
        rc = qwen3vl_estimate(o->mmproj, o->max_image_tokens, &v->weights_bytes, &v->workspace_bytes, e2, sizeof e2);
    if (rc < 0) {
        snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
        return rc;
    }
    if (hp.n_embd_text != n_embd_text) {
        snprintf(err, errlen, "mmproj %s projects to width %d but the text model is %d wide", o->mmproj,
                 hp.n_embd_text, n_embd_text);
        return TIDE_EFORMAT;
    }
    struct device *dev = &v->mem->dev[o->device];
    const char *cpu_env = getenv("TIDE_VISION_CPU");
    bool gpu = dev->kind != DEVICE_KIND_CPU, cpu_encoder = gpu && cpu_env && cpu_env[0] && strcmp(cpu_env, "0");
    v->is_qwen3vl = true;
    v->qwenvl_kind = (int)hp.kind;
    v->n_deepstack = hp.n_deepstack;
    v->row_floats = n_embd_text * (1 + hp.n_deepstack);
    v->q3v_patches = qwen3vl_max_patches(&hp, o->max_image_tokens);
    if (!v->o.embed_cache_entries) v->o.embed_cache_entries = 64;
    if (!v->o.embed_cache_bytes) v->o.embed_cache_bytes = (size_t)64 << 20;
    v->be = &dev->be;
    size_t need = v->weights_bytes + v->workspace_bytes;
    if (gpu && !cpu_encoder) {
        alloc_ctx.dev = dev;
        alloc_ctx.host = false;
        host_ctx.be = v->be;
        struct clip_alloc ha = {h_alloc, h_free, &host_ctx};
        double t0 = tide_now();
        bool tc = qwen3vl_set_tc(-1);
        rc = tc ? qwen3vl_load_tc(o->mmproj, &ha, &v->q3v_host, e2, sizeof e2)
                : qwen3vl_load_with(o->mmproj, &ha, &v->q3v_host, e2, sizeof e2);
        if (rc < 0) {
            snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
            return rc;
        }
        size_t scratch = 0;
        if (tc) {
            v->weights_bytes = qwen3vl_weight_bytes_tc(&hp);
            scratch = qwen3vl_tc_scratch(v->q3v_host, v->be, v->q3v_patches);
            v->workspace_bytes += scratch;
        }
        need = gpu_pages(v->weights_bytes) + gpu_pages(v->workspace_bytes - scratch) +
               (scratch ? gpu_pages(scratch) : 0);
        tide_log("vision: the Qwen-VL tower runs on device %d (%s); host copy of its %s weights %.1f MiB (%s) in "
                 "%.1f ms", o->device, v->be->i->name, tc ? "tensor-core layout (TIDE_VISION_TC)" : "f32",
                 (double)v->weights_bytes / (1 << 20), host_ctx.pinned ? "pinned" : "pageable", (tide_now() - t0) * 1e3);
    } else if (cpu_encoder) {
        if ((rc = backend_cpu_init(&v->cpu_be, o->n_threads)) < 0) {
            snprintf(err, errlen, "vision: cpu backend: %s", tide_strerror(rc));
            return rc;
        }
        v->be = &v->cpu_be;
    }
    v->need[o->device] = o->vram_mib >= 0 ? (size_t)o->vram_mib << 20 : need;
    set_state(v, VISION_UNLOADED);
    return 0;
}

/* The loaded tower gone: an uploaded one gives its blocks back through v_free (the ledger),
 * a host one its charge. */
static void qwen3vl_unload(struct vision_lifecycle *v)
{
    if (!v->q3v)
        return;
    qwen3vl_free(v->q3v);
    v->q3v = NULL;
    if (!v->q3v_host)
        device_uncharge(&v->mem->dev[v->o.device], MEM_VISION, v->weights_bytes + v->workspace_bytes);
}

int vision_init(struct vision_lifecycle *v, const struct vision_options *o, struct memory_plan *mem,
                int n_embd_text, char *err, size_t errlen)
{
    memset(v, 0, sizeof *v);
    v->o = *o;
    v->mem = mem;
    v->n_embd_text = n_embd_text;
    if (o->device < 0 || o->device >= mem->n_dev) {
        snprintf(err, errlen, "vision.device %d: there are %d devices", o->device, mem->n_dev);
        return TIDE_EINVAL;
    }
    char e2[256] = "";
    v->row_floats = n_embd_text;
    if (projector_is(o->mmproj, "qwen3vl_merger") || projector_is(o->mmproj, "qwen2vl_merger") ||
        projector_is(o->mmproj, "qwen2.5vl_merger"))
        return init_qwen3vl(v, o, n_embd_text, err, errlen);
    int rc = clip_estimate(o->mmproj, 0, &v->weights_bytes, &v->workspace_bytes, e2, sizeof e2);
    if (rc < 0) {
        snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
        return rc;
    }
    struct clip_hparams hp;
    rc = clip_read_hparams(o->mmproj, &hp, e2, sizeof e2);
    if (rc < 0) {
        snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
        return rc;
    }
    if (hp.n_embd_out != n_embd_text) {
        snprintf(err, errlen, "mmproj %s projects to width %d but the text model is %d wide", o->mmproj,
                 hp.n_embd_out, n_embd_text);
        return TIDE_EFORMAT;
    }
    if (!v->o.embed_cache_entries) v->o.embed_cache_entries = 64;
    if (!v->o.embed_cache_bytes) v->o.embed_cache_bytes = (size_t)64 << 20;
    struct device *dev = &mem->dev[o->device];
    alloc_ctx.dev = dev;
    alloc_ctx.host = false;
    v->be = &dev->be;
    /* The reserve is what the encoder really takes: its weights and its workspace, plus the
     * allocator's headroom for the blocks (none on the CPU). vision.vram_mib overrides it. */
    size_t need = v->weights_bytes + v->workspace_bytes;
    const char *cpu_env = getenv("TIDE_VISION_CPU");
    bool cpu_encoder = dev->kind != DEVICE_KIND_CPU && cpu_env && cpu_env[0] && strcmp(cpu_env, "0");
    if (dev->kind != DEVICE_KIND_CPU && !cpu_encoder) {
        /* GPU encoder: weights and workspace in the GPU's memory, plus the scratch its
         * quantised products take from the backend's pool; the weights' host copy is taken
         * now, once, so a cold image pays an upload, not a file read. */
        size_t wb, wsb;
        rc = clip_estimate_on(o->mmproj, v->be, 0, &wb, &wsb, e2, sizeof e2);
        if (rc < 0) {
            snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
            return rc;
        }
        size_t scratch = wsb - v->workspace_bytes;
        v->workspace_bytes = wsb;
        need = gpu_pages(wb) + gpu_pages(wsb - scratch) + (scratch ? gpu_pages(scratch) : 0);
        host_ctx.be = v->be;
        struct clip_alloc ha = {h_alloc, h_free, &host_ctx};
        double t0 = tide_now();
        rc = clip_load_host(&v->host, o->mmproj, &ha, e2, sizeof e2);
        if (rc < 0) {
            snprintf(err, errlen, "mmproj %s: %s", o->mmproj, e2[0] ? e2 : tide_strerror(rc));
            return rc;
        }
        tide_log("vision: the encoder runs on device %d (%s); host copy of its weights %.1f MiB (%s) in %.1f ms",
                 o->device, v->be->i->name, (double)wb / (1 << 20), host_ctx.pinned ? "pinned" : "pageable",
                 (tide_now() - t0) * 1e3);
    } else if (cpu_encoder) {
        /* The CPU encoder on a GPU device (TIDE_VISION_CPU=1: a fallback and the benchmark's
         * baseline): the hand-back is real (the caches give the GPU memory back and the
         * ledger holds it while loaded) but the encoder computes from host memory. */
        alloc_ctx.host = true;
        rc = backend_cpu_init(&v->cpu_be, o->n_threads);
        if (rc < 0) {
            snprintf(err, errlen, "vision: cpu backend: %s", tide_strerror(rc));
            return rc;
        }
        v->be = &v->cpu_be;
        tide_log("vision: device %d is a GPU: its memory is reserved on it, the encoder runs on the CPU "
                 "(TIDE_VISION_CPU)", o->device);
    }
    v->need[o->device] = o->vram_mib >= 0 ? (size_t)o->vram_mib << 20 : need;
    set_state(v, VISION_UNLOADED);
    return 0;
}

static void cache_drop(struct vision_lifecycle *v, struct embed_entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else v->cache_head = e->next;
    if (e->next) e->next->prev = e->prev;
    v->cache_entries--;
    v->cache_bytes -= (size_t)e->n_tokens * v->row_floats * sizeof(float);
    free(e->embd);
    free(e);
}

void vision_free(struct vision_lifecycle *v)
{
    if (v->clip)
        clip_free(v->clip);
    if (v->host)
        clip_free(v->host);
    qwen3vl_unload(v);
    qwen3vl_free(v->q3v_host);
    while (v->cache_head)
        cache_drop(v, v->cache_head);
    if (v->cpu_be.i)
        backend_cpu_free(&v->cpu_be);
    memset(v, 0, sizeof *v);
}

void vision_lifecycle_extra(const struct vision_lifecycle *v, size_t *extra)
{
    /* Only while the encoder is on its way in: once loaded it is in the ledger itself. */
    if (v->state == VISION_HANDBACK || v->state == VISION_LOADING)
        for (int i = 0; i < v->mem->n_dev; i++)
            extra[i] += v->need[i];
}

/* Caches back to what the reserves allow, the encoder gone. */
static void regrow(struct vision_lifecycle *v)
{
    set_state(v, VISION_REGROW);
    double t0 = tide_now();
    memory_plan_apply(v->mem, NULL, NULL);
    v->count.last_regrow_s = tide_now() - t0;
    v->count.regrows++;
    event(v, VISION_EV_REGROW);
    set_state(v, VISION_UNLOADED);
}

int vision_ensure_ready(struct vision_lifecycle *v, char *err, size_t errlen)
{
    if (v->state == VISION_READY)
        return 0;
    const char *fault = getenv("TIDE_FAULT_VISION");
    set_state(v, VISION_HANDBACK);
    double t0 = tide_now();
    size_t extra[PLAN_MAX_DEVICES] = {0}, shortfall[PLAN_MAX_DEVICES] = {0};
    vision_lifecycle_extra(v, extra);
    int rc = memory_plan_apply(v->mem, extra, shortfall);
    v->t_handback = tide_now() - t0;
    v->count.handbacks++;
    event(v, VISION_EV_HANDBACK);
    if (rc < 0) {
        snprintf(err, errlen, "vision hand-back failed: %s", tide_strerror(rc));
        regrow(v);
        return rc;
    }
    set_state(v, VISION_LOADING);
    t0 = tide_now();
    struct clip_alloc a = {v_alloc, v_free, &alloc_ctx};
    char e2[256] = "";
    if (fault && !strcmp(fault, "load")) {
        rc = TIDE_ENOMEM;
        snprintf(e2, sizeof e2, "injected encoder load failure (TIDE_FAULT_VISION=load)");
    } else if (v->q3v_host) { /* a GPU: weights and workspace from its memory, one upload */
        rc = qwen3vl_upload(&v->q3v, v->q3v_host, &a, v->be, v->q3v_patches, e2, sizeof e2);
        if (rc == 0) {
            v->be->i->sync(v->be->ctx);
            if ((rc = backend_error(v, e2, sizeof e2)) < 0) {
                qwen3vl_free(v->q3v);
                v->q3v = NULL;
            }
        }
    } else if (v->is_qwen3vl) {
        /* host memory, charged to the device's ledger first (the hand-back made the room) */
        struct device *dev = &v->mem->dev[v->o.device];
        size_t b = v->weights_bytes + v->workspace_bytes;
        rc = device_charge(dev, MEM_VISION, b);
        if (rc == 0 && (rc = qwen3vl_load(v->o.mmproj, &v->q3v, e2, sizeof e2)) < 0)
            device_uncharge(dev, MEM_VISION, b);
    } else {
        rc = v->host ? clip_upload(&v->clip, v->host, &a, v->be, e2, sizeof e2)
                     : clip_load(&v->clip, v->o.mmproj, &a, v->be, e2, sizeof e2);
        if (rc == 0 && v->host) {
            /* the load is over when the weights are on the device (and the timing says so) */
            v->be->i->sync(v->be->ctx);
            rc = backend_error(v, e2, sizeof e2);
            if (rc < 0) {
                clip_free(v->clip);
                v->clip = NULL;
            }
        }
    }
    if (rc < 0) {
        v->clip = NULL;
        snprintf(err, errlen, "cannot load the vision encoder: %s%s", e2[0] ? e2 : tide_strerror(rc),
                 shortfall[v->o.device] ? " (the device could not free enough memory)" : "");
        tide_log("vision: %s", err);
        regrow(v);
        return rc;
    }
    if (!v->is_qwen3vl && clip_n_embd_out(v->clip) != v->n_embd_text) {
        snprintf(err, errlen, "mmproj projects to %d but the text model is %d wide", clip_n_embd_out(v->clip),
                 v->n_embd_text);
        clip_free(v->clip);
        v->clip = NULL;
        regrow(v);
        return TIDE_EFORMAT;
    }
    v->t_load = tide_now() - t0;
    v->count.loads++;
    event(v, VISION_EV_LOAD);
    set_state(v, VISION_READY);
    tide_log("vision: encoder ready (hand-back %.1f ms, load %.1f ms, %.1f MiB)", v->t_handback * 1e3,
             v->t_load * 1e3, (double)v->mem->dev[v->o.device].used[MEM_VISION] / (1 << 20));
    return 0;
}

/* Qwen3-VL: the image resized by the dynamic-resolution rules within the token budget
 * (dynres.h; bilinear as llama.cpp's mtmd where a resize is needed), then encoded: nt rows of row_floats, the grid
 * gw tokens wide. *t0: when the encode began. */
static int embed_qwen3vl(struct vision_lifecycle *v, const struct image_u8 *img, float **emb, int *nt, int *gw,
                         double *t0, char *err, size_t errlen)
{
    const struct qwen3vl_hparams *hp = qwen3vl_hparams_of(v->q3v);
    struct dynres_rules r = qwen3vl_rules(hp, v->o.max_image_tokens);
    int w = 0, h = 0;
    struct image_u8 sized;
    int n = dynres_resize(&r, img, &sized, &w, &h);
    if (n == TIDE_EINVAL) {
        snprintf(err, errlen, "image %dx%d: no size fits", img->w, img->h);
        return TIDE_EINVAL;
    }
    if (n < 0) {
        snprintf(err, errlen, "image resize to %dx%d: %s", w, h, tide_strerror(n));
        return n;
    }
    const struct image_u8 *in = sized.rgb ? &sized : img;
    *emb = malloc((size_t)n * v->row_floats * sizeof(float));
    if (!*emb) {
        image_u8_free(&sized);
        return TIDE_ENOMEM;
    }
    *t0 = tide_now();
    int rc = qwen3vl_encode(v->q3v, v->be, in->rgb, w, h, *emb, err, errlen);
    image_u8_free(&sized);
    if (rc < 0) {
        free(*emb);
        *emb = NULL;
        return rc;
    }
    *nt = n;
    *gw = w / (hp->patch * hp->merge);
    return 0;
}

static struct embed_entry *cache_find(struct vision_lifecycle *v, const uint8_t *bytes, size_t n)
{
    uint8_t key[CONTENT_HASH_SIZE];
    content_hash(bytes, n, key);
    for (struct embed_entry *e = v->cache_head; e; e = e->next)
        if (e->n_bytes == n && memcmp(e->key, key, sizeof key) == 0) {
            if (e != v->cache_head) { /* move to front: most recently used */
                e->prev->next = e->next;
                if (e->next) e->next->prev = e->prev;
                e->prev = NULL;
                e->next = v->cache_head;
                v->cache_head->prev = e;
                v->cache_head = e;
            }
            return e;
        }
    return NULL;
}

bool vision_cached(struct vision_lifecycle *v, const uint8_t *bytes, size_t n_bytes)
{
    return cache_find(v, bytes, n_bytes) != NULL;
}

void vision_touch(struct vision_lifecycle *v)
{
    v->last_image = tide_now();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v->last_image_unix = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    event(v, VISION_EV_IMAGE);
}

void vision_begin(struct vision_lifecycle *v)
{
    vision_touch(v);
    v->busy = true;
}

void vision_end(struct vision_lifecycle *v)
{
    v->busy = false;
    vision_touch(v); /* idle counts from the end of the last image request */
}

int vision_n_tokens(const struct vision_lifecycle *v, int w, int h)
{
    if (v->q3v) {
        struct dynres_rules r = qwen3vl_rules(qwen3vl_hparams_of(v->q3v), v->o.max_image_tokens);
        int ow, oh;
        return dynres_size(&r, w, h, &ow, &oh);
    }
    return v->clip ? clip_n_tokens(v->clip, w, h) : -1;
}

int vision_embed(struct vision_lifecycle *v, const uint8_t *bytes, size_t n_bytes, const struct image_u8 *img,
                 float **out, int *n_tokens, int *grid_w, char *err, size_t errlen)
{
    size_t row = (size_t)v->row_floats * sizeof(float);
    int gw = 0;
    if (grid_w)
        *grid_w = 0;
    struct embed_entry *e = cache_find(v, bytes, n_bytes);
    if (e)
        v->count.cache_hits++;
    else
        v->count.cache_misses++;
    event(v, e ? VISION_EV_CACHE_HIT : VISION_EV_CACHE_MISS);
    if (e) {
        *out = malloc((size_t)e->n_tokens * row);
        if (!*out) return TIDE_ENOMEM;
        memcpy(*out, e->embd, (size_t)e->n_tokens * row);
        *n_tokens = e->n_tokens;
        if (grid_w)
            *grid_w = e->grid_w;
        return 0;
    }
    int rc = vision_ensure_ready(v, err, errlen);
    if (rc < 0) return rc;
    /* Queued requests keep only the compressed bytes (checked when they arrived): decode
     * them now, one image at a time, and drop the pixels once preprocessed. */
    struct image_u8 decoded = {0};
    if (!img || !img->rgb) {
        rc = image_decode(bytes, n_bytes, NULL, &decoded, err, errlen);
        if (rc < 0) return rc;
        img = &decoded;
    }
    float *emb = NULL;
    int nt;
    double t0;
    if (v->q3v) {
        rc = embed_qwen3vl(v, img, &emb, &nt, &gw, &t0, err, errlen);
        image_u8_free(&decoded);
        if (rc < 0) return rc;
    } else {
        struct image_f32 pre;
        memset(&pre, 0, sizeof pre);
        rc = clip_preprocess(v->clip, img, &pre, err, errlen);
        nt = clip_n_tokens(v->clip, img->w, img->h);
        image_u8_free(&decoded);
        if (rc < 0) return rc;
        emb = malloc((size_t)nt * row);
        if (!emb) {
            image_f32_free(&pre);
            return TIDE_ENOMEM;
        }
        t0 = tide_now();
        rc = clip_encode(v->clip, &pre, emb, err, errlen);
        image_f32_free(&pre);
    }
    if (rc >= 0) {
        char e2[320] = "";
        int brc = backend_error(v, e2, sizeof e2);
        if (brc < 0) {
            snprintf(err, errlen, "vision encoder on device %d: %s", v->o.device, e2);
            rc = brc;
        }
    }
    if (rc < 0) {
        free(emb);
        return rc;
    }
    v->t_encode = tide_now() - t0;
    v->count.encodes++;
    event(v, VISION_EV_ENCODE);
    tide_log("vision: encoded %d tokens in %.1f ms on %s", nt, v->t_encode * 1e3, v->be->i->name);
    *out = emb;
    *n_tokens = nt;
    if (grid_w)
        *grid_w = gw;
    /* keep a copy, evicting least recently used entries over the limits */
    size_t b = (size_t)nt * row;
    if (b <= v->o.embed_cache_bytes && v->o.embed_cache_entries) {
        while (v->cache_head && (v->cache_entries + 1 > v->o.embed_cache_entries ||
                                 v->cache_bytes + b > v->o.embed_cache_bytes)) {
            struct embed_entry *last = v->cache_head;
            while (last->next) last = last->next;
            cache_drop(v, last);
        }
        struct embed_entry *ne = calloc(1, sizeof *ne);
        float *copy = ne ? malloc(b) : NULL;
        if (ne && copy) {
            memcpy(copy, emb, b);
            content_hash(bytes, n_bytes, ne->key);
            ne->n_bytes = n_bytes;
            ne->n_tokens = nt;
            ne->grid_w = gw;
            ne->embd = copy;
            ne->next = v->cache_head;
            if (v->cache_head) v->cache_head->prev = ne;
            v->cache_head = ne;
            v->cache_entries++;
            v->cache_bytes += b;
        } else {
            free(ne);
            free(copy);
        }
    }
    return 0;
}

bool vision_tick(struct vision_lifecycle *v)
{
    if (v->state != VISION_READY || !v->o.lazy || v->busy)
        return false;
    if (tide_now() - v->last_image < v->o.idle_s)
        return false;
    set_state(v, VISION_UNLOADING);
    qwen3vl_unload(v);
    clip_free(v->clip);
    v->clip = NULL;
    v->count.unloads++;
    event(v, VISION_EV_UNLOAD);
    regrow(v);
    tide_log("vision: encoder unloaded after %.0f s without images; caches regrown", v->o.idle_s);
    return true;
}
