/* gguf_write.c - the GGUF v3 writer (model tool, tests, fuzz seeds).
 *
 * Metadata and small tensors are built in memory. A tensor added with gguf_w_tensor_fill
 * is only described: its values come from a caller's fill function at write time, made
 * and quantised in chunks by several threads and streamed to the file, so a model of tens
 * of GB is written without holding it (the Qwen3-30B-A3B-shaped benchmark model). The
 * fill function is a pure function of the element index, so the bytes never depend on
 * the number of threads or the chunking. */
#include "gguf.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Growable byte buffer; on allocation failure it records oom and drops writes,
 * so the void-returning gguf_w_* calls report the failure at write time. */
struct buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};

static bool buf_reserve(struct buf *b, size_t need)
{
    if (b->oom) return false;
    if (need <= b->cap) return true;
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < need) nc *= 2;
    uint8_t *np = realloc(b->p, nc);
    if (!np) { b->oom = true; return false; }
    b->p = np;
    b->cap = nc;
    return true;
}

static void buf_put(struct buf *b, const void *d, size_t n)
{
    if (!buf_reserve(b, b->len + n)) return;
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void put_u32(struct buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void put_str(struct buf *b, const char *s)
{
    size_t n = strlen(s);
    put_u64(b, n);
    buf_put(b, s, n);
}
static void put_pad(struct buf *b, size_t align)
{
    static const uint8_t z[64];
    size_t pad = (align - b->len % align) % align;
    buf_put(b, z, pad);
}

#define GGUF_W_ALIGN 32
#define FILL_CHUNK (1u << 22) /* elements a thread makes at a time (a multiple of 256) */

struct wtensor {
    uint64_t off;       /* in the data section */
    size_t nbytes;
    size_t buf_off;     /* materialised: where its bytes are in data */
    uint32_t type;
    uint64_t nel;
    gguf_fill_fn fill;  /* f32 values, quantised here (NULL: materialised or raw) */
    gguf_raw_fn raw;    /* the stored bytes themselves */
    void *ctx;          /* owned copy of the caller's context */
};

struct gguf_writer {
    struct buf kv, info, data;
    uint64_t n_kv, n_tensors;
    struct wtensor *t;
    size_t t_cap;
    uint64_t data_len;  /* data section length so far (offsets, padding) */
    int threads;
    bool bad;
};

struct gguf_writer *gguf_writer_new(void)
{
    struct gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) return NULL;
    put_str(&w->kv, "general.alignment");
    put_u32(&w->kv, GGUF_TYPE_UINT32);
    put_u32(&w->kv, GGUF_W_ALIGN);
    w->n_kv = 1;
    return w;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->t[i].ctx);
    free(w->t);
    free(w->kv.p);
    free(w->info.p);
    free(w->data.p);
    free(w);
}

void gguf_writer_set_threads(struct gguf_writer *w, int n) { w->threads = n; }

static void kv_head(struct gguf_writer *w, const char *key, uint32_t type)
{
    put_str(&w->kv, key);
    put_u32(&w->kv, type);
    w->n_kv++;
}

void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v) { kv_head(w, key, GGUF_TYPE_UINT32); put_u32(&w->kv, v); }
void gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v) { kv_head(w, key, GGUF_TYPE_INT32); buf_put(&w->kv, &v, 4); }
void gguf_w_f32(struct gguf_writer *w, const char *key, float v) { kv_head(w, key, GGUF_TYPE_FLOAT32); buf_put(&w->kv, &v, 4); }
void gguf_w_bool(struct gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    kv_head(w, key, GGUF_TYPE_BOOL);
    buf_put(&w->kv, &b, 1);
}
void gguf_w_str(struct gguf_writer *w, const char *key, const char *v) { kv_head(w, key, GGUF_TYPE_STRING); put_str(&w->kv, v); }

void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    kv_head(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_STRING);
    put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&w->kv, v[i]);
}

void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    kv_head(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_INT32);
    put_u64(&w->kv, n);
    buf_put(&w->kv, v, n * 4);
}

void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    kv_head(w, key, GGUF_TYPE_ARRAY);
    put_u32(&w->kv, GGUF_TYPE_FLOAT32);
    put_u64(&w->kv, n);
    buf_put(&w->kv, v, n * 4);
}

/* Describe a tensor (info entry, offset); NULL when the shape or type is refused. */
static struct wtensor *add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const uint64_t *ne)
{
    uint64_t nel = 1;
    if (n_dims < 1 || n_dims > 4 || !ggml_block_size(type) ||
        ne[0] % ggml_block_size(type)) {
        w->bad = true;
        return NULL;
    }
    for (uint32_t d = 0; d < n_dims; d++) nel *= ne[d];
    if (w->n_tensors == w->t_cap) {
        size_t nc = w->t_cap ? w->t_cap * 2 : 64;
        struct wtensor *nt = realloc(w->t, nc * sizeof(*nt));
        if (!nt) { w->data.oom = true; return NULL; }
        w->t = nt;
        w->t_cap = nc;
    }
    struct wtensor *t = &w->t[w->n_tensors];
    memset(t, 0, sizeof(*t));
    w->data_len += (GGUF_W_ALIGN - w->data_len % GGUF_W_ALIGN) % GGUF_W_ALIGN;
    t->off = w->data_len;
    t->type = type;
    t->nel = nel;
    t->nbytes = ggml_row_size(type, nel);
    put_str(&w->info, name);
    put_u32(&w->info, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(&w->info, ne[d]);
    put_u32(&w->info, type);
    put_u64(&w->info, t->off);
    return t;
}

void gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, const float *data)
{
    struct wtensor *t = add_tensor(w, name, type, n_dims, ne);
    if (!t || !buf_reserve(&w->data, w->data.len + t->nbytes)) return;
    t->buf_off = w->data.len;
    ggml_quantize(type, data, w->data.p + t->buf_off, t->nel);
    w->data.len += t->nbytes;
    w->data_len += t->nbytes;
    w->n_tensors++;
}

static void add_filled(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const uint64_t *ne, gguf_fill_fn fill, gguf_raw_fn raw, const void *ctx,
                       size_t ctx_size)
{
    struct wtensor *t = add_tensor(w, name, type, n_dims, ne);
    if (!t) return;
    if (!(t->ctx = malloc(ctx_size ? ctx_size : 1))) { w->data.oom = true; return; }
    if (ctx_size) memcpy(t->ctx, ctx, ctx_size);  /* ctx may be NULL when there is none */
    t->fill = fill;
    t->raw = raw;
    w->data_len += t->nbytes;
    w->n_tensors++;
}

void gguf_w_tensor_fill(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                        const uint64_t *ne, gguf_fill_fn fill, const void *ctx, size_t ctx_size)
{
    add_filled(w, name, type, n_dims, ne, fill, NULL, ctx, ctx_size);
}

void gguf_w_tensor_fill_raw(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, gguf_raw_fn raw, const void *ctx, size_t ctx_size)
{
    add_filled(w, name, type, n_dims, ne, NULL, raw, ctx, ctx_size);
}

/* ---- output: a FILE or a growing buffer ---- */
struct sink {
    FILE *f;
    struct buf *b;
    bool ok;
};

static void sink_put(struct sink *s, const void *p, size_t n)
{
    if (!s->ok || !n) return;
    if (s->f) s->ok = fwrite(p, 1, n, s->f) == n;
    else { buf_put(s->b, p, n); s->ok = !s->b->oom; }
}

static void sink_zeros(struct sink *s, size_t n)
{
    static const uint8_t z[64];
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        sink_put(s, z, k);
        n -= k;
    }
}

struct fill_job {
    const struct wtensor *t;
    uint64_t first, n;  /* elements */
    float *tmp;
    uint8_t *dst;
};

static void *fill_run(void *arg)
{
    struct fill_job *j = arg;
    if (j->t->raw) {
        j->t->raw(j->t->ctx, j->first, j->n, j->dst);
        return NULL;
    }
    j->t->fill(j->t->ctx, j->first, j->n, j->tmp);
    ggml_quantize(j->t->type, j->tmp, j->dst, j->n);
    return NULL;
}

/* Make a filled tensor's bytes, nthr chunks at a time, and stream them out. */
static int emit_filled(struct sink *s, const struct wtensor *t, int nthr)
{
    size_t cbytes = ggml_row_size(t->type, FILL_CHUNK);
    struct fill_job *jobs = calloc((size_t)nthr, sizeof(*jobs));
    pthread_t *th = calloc((size_t)nthr, sizeof(*th));
    uint8_t *out = malloc(cbytes * (size_t)nthr);
    float *tmp = t->raw ? NULL : malloc(sizeof(float) * FILL_CHUNK * (size_t)nthr);
    int rc = (jobs && th && out && (tmp || t->raw)) ? 0 : TIDE_ENOMEM;
    for (uint64_t at = 0; !rc && at < t->nel;) {
        int k = 0;
        for (; k < nthr && at < t->nel; k++) {
            uint64_t n = t->nel - at < FILL_CHUNK ? t->nel - at : FILL_CHUNK;
            jobs[k] = (struct fill_job){t, at, n, tmp ? tmp + (size_t)k * FILL_CHUNK : NULL, out + (size_t)k * cbytes};
            at += n;
        }
        int started = 0;
        for (int i = 1; i < k; i++, started++)
            if (pthread_create(&th[i], NULL, fill_run, &jobs[i])) break;
        fill_run(&jobs[0]);
        for (int i = started + 1; i < k; i++) fill_run(&jobs[i]); /* threads refused: do it here */
        for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < k; i++) sink_put(s, jobs[i].dst, ggml_row_size(t->type, jobs[i].n));
        if (!s->ok) rc = TIDE_EIO;
    }
    free(jobs);
    free(th);
    free(out);
    free(tmp);
    return rc;
}

static int emit(struct gguf_writer *w, struct sink *s)
{
    if (w->bad) return TIDE_EINVAL;
    if (w->kv.oom || w->info.oom || w->data.oom) return TIDE_ENOMEM;
    struct buf h = {0};
    buf_put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, w->n_tensors);
    put_u64(&h, w->n_kv);
    buf_put(&h, w->kv.p, w->kv.len);
    buf_put(&h, w->info.p, w->info.len);
    put_pad(&h, GGUF_W_ALIGN);
    if (h.oom) { free(h.p); return TIDE_ENOMEM; }
    sink_put(s, h.p, h.len);
    free(h.p);
    int nthr = w->threads > 0 ? w->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthr < 1) nthr = 1;
    if (nthr > 256) nthr = 256;
    uint64_t at = 0;
    int rc = 0;
    for (uint64_t i = 0; !rc && i < w->n_tensors && s->ok; i++) {
        const struct wtensor *t = &w->t[i];
        sink_zeros(s, (size_t)(t->off - at));
        if (t->fill || t->raw) rc = emit_filled(s, t, nthr);
        else sink_put(s, w->data.p + t->buf_off, t->nbytes);
        at = t->off + t->nbytes;
    }
    sink_zeros(s, (size_t)((GGUF_W_ALIGN - at % GGUF_W_ALIGN) % GGUF_W_ALIGN));
    if (!rc && !s->ok) rc = s->f ? TIDE_EIO : TIDE_ENOMEM;
    return rc;
}

int gguf_writer_to_memory(struct gguf_writer *w, void **out, size_t *size)
{
    struct buf b = {0};
    struct sink s = {.b = &b, .ok = true};
    int rc = emit(w, &s);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    *size = b.len;
    return 0;
}

/* Written beside the target, then renamed over it: a daemon that has the old file mapped keeps
 * its pages (the old inode lives on until unmapped) instead of dying of SIGBUS when the file is
 * truncated under it, as `make` rewriting the default models next to a running daemon did. */
int gguf_writer_write(struct gguf_writer *w, const char *path)
{
    if (w->bad) return TIDE_EINVAL;
    if (w->kv.oom || w->info.oom || w->data.oom) return TIDE_ENOMEM;
    size_t pl = strlen(path) + 32;
    char *tmp = malloc(pl);
    if (!tmp) return TIDE_ENOMEM;
    snprintf(tmp, pl, "%s.part-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(tmp);
        return TIDE_EIO;
    }
    struct sink s = {.f = f, .ok = true};
    int rc = emit(w, &s);
    if (fclose(f) != 0 && !rc) rc = TIDE_EIO;
    if (!rc && rename(tmp, path) != 0) rc = TIDE_EIO;
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}
