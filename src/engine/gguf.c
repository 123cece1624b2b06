/* gguf.c - GGUF v2/v3 reader (mmap or memory), plus ggml type helpers
 * (f16/bf16 conversion, block sizes and names). The blocks' (de)quantisers are
 * quants.c; the writer is gguf_write.c.
 *
 * The reader treats the file as hostile: every read goes through a bounds-checked
 * cursor, counts are compared against the bytes left before anything is allocated,
 * and size arithmetic is overflow-checked. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------- half / bfloat16 ---------------- */

float tide_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            man &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tide_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) /* inf / nan (keep nan quiet and non-zero) */
        return sign | 0x7c00 | (man ? (uint16_t)(0x200 | (man >> 13)) : 0);
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return sign | 0x7c00;
    if (e <= 0) { /* subnormal half or zero */
        if (e < -10)
            return sign;
        man |= 0x800000;
        int shift = 14 - e; /* 1..24 bits dropped */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return sign | (uint16_t)half; /* carry into exponent is correct */
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into exp, up to inf: correct IEEE behaviour */
    return sign | (uint16_t)h;
}

float tide_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tide_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---------------- types ---------------- */

uint32_t ggml_block_size(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: return 1;
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
    case GGML_TYPE_MXFP4: return 32;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_IQ4_XS: return QK_K;
    default: return 0;
    }
}

static size_t type_block_bytes(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: return 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2;
    case GGML_TYPE_Q8_0: return 34;
    case GGML_TYPE_Q4_0: return 18;
    case GGML_TYPE_Q5_0: return Q5_0_BYTES;
    case GGML_TYPE_Q5_1: return Q5_1_BYTES;
    case GGML_TYPE_MXFP4: return MXFP4_BYTES;
    case GGML_TYPE_Q4_K: return Q4_K_BYTES;
    case GGML_TYPE_Q5_K: return Q5_K_BYTES;
    case GGML_TYPE_Q6_K: return Q6_K_BYTES;
    case GGML_TYPE_IQ4_XS: return IQ4_XS_BYTES;
    default: return 0;
    }
}

size_t ggml_row_size(uint32_t type, uint64_t n)
{
    uint32_t bs = ggml_block_size(type);
    if (!bs || n % bs)
        return 0;
    return (size_t)(n / bs) * type_block_bytes(type);
}

const char *ggml_type_name(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: return "f32";
    case GGML_TYPE_F16: return "f16";
    case GGML_TYPE_BF16: return "bf16";
    case GGML_TYPE_Q8_0: return "q8_0";
    case GGML_TYPE_Q4_0: return "q4_0";
    case GGML_TYPE_Q5_0: return "q5_0";
    case GGML_TYPE_Q5_1: return "q5_1";
    case GGML_TYPE_MXFP4: return "mxfp4";
    case GGML_TYPE_Q4_K: return "q4_K";
    case GGML_TYPE_Q5_K: return "q5_K";
    case GGML_TYPE_Q6_K: return "q6_K";
    case GGML_TYPE_IQ4_XS: return "iq4_xs";
    default: return "unknown";
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---------------- reader ---------------- */

struct cur {
    const uint8_t *p;
    size_t pos, size;
    char *err;
    size_t errlen;
};

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return TIDE_EFORMAT;
}

static int take(struct cur *c, size_t n, const uint8_t **out, const char *what)
{
    if (n > c->size - c->pos)
        return fail(c->err, c->errlen, "gguf: truncated file reading %s at offset %zu", what, c->pos);
    *out = c->p + c->pos;
    c->pos += n;
    return 0;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
    const uint8_t *q = NULL;
    int rc = take(c, 4, &q, what);
    if (!rc) memcpy(v, q, 4);
    return rc;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
    const uint8_t *q = NULL;
    int rc = take(c, 8, &q, what);
    if (!rc) memcpy(v, q, 8);
    return rc;
}

static int rd_str(struct cur *c, struct gguf_str *s, const char *what)
{
    uint64_t len;
    const uint8_t *q = NULL;
    if (rd_u64(c, &len, what)) return TIDE_EFORMAT;
    if (len > c->size - c->pos)
        return fail(c->err, c->errlen, "gguf: %s length %llu beyond end of file", what, (unsigned long long)len);
    take(c, (size_t)len, &q, what);
    s->len = len;
    s->ptr = (const char *)q;
    return 0;
}

static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Skip one value of type t (used for nested arrays, which we keep opaque). */
static int skip_value(struct cur *c, uint32_t t, int depth)
{
    const uint8_t *q = NULL;
    if (depth > 8) return fail(c->err, c->errlen, "gguf: arrays nested too deeply");
    if (t == GGUF_TYPE_STRING) {
        struct gguf_str s;
        return rd_str(c, &s, "string");
    }
    if (t == GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t n;
        if (rd_u32(c, &et, "array type") || rd_u64(c, &n, "array length")) return TIDE_EFORMAT;
        size_t es = scalar_size(et);
        if (es) {
            if (n > (c->size - c->pos) / es) return fail(c->err, c->errlen, "gguf: array beyond end of file");
            return take(c, (size_t)n * es, &q, "array");
        }
        if (et != GGUF_TYPE_STRING && et != GGUF_TYPE_ARRAY)
            return fail(c->err, c->errlen, "gguf: unknown array element type %u", et);
        if (n > (c->size - c->pos) / 8) return fail(c->err, c->errlen, "gguf: array beyond end of file");
        for (uint64_t i = 0; i < n; i++)
            if (skip_value(c, et, depth + 1)) return TIDE_EFORMAT;
        return 0;
    }
    size_t es = scalar_size(t);
    if (!es) return fail(c->err, c->errlen, "gguf: unknown value type %u", t);
    return take(c, es, &q, "value");
}

static int parse_kv(struct gguf_file *g, struct cur *c, struct gguf_kv *kv, size_t *pool_used, size_t pool_cap)
{
    if (rd_str(c, &kv->key, "key") || rd_u32(c, &kv->type, "value type")) return TIDE_EFORMAT;
    const uint8_t *q = NULL;
    uint32_t t = kv->type;
    switch (t) {
    case GGUF_TYPE_STRING: return rd_str(c, &kv->v.str, "string value");
    case GGUF_TYPE_ARRAY: {
        uint32_t et;
        uint64_t n;
        if (rd_u32(c, &et, "array type") || rd_u64(c, &n, "array length")) return TIDE_EFORMAT;
        kv->v.arr.type = et;
        kv->v.arr.n = n;
        kv->v.arr.data = c->p + c->pos;
        kv->v.arr.strs = NULL;
        if (et == GGUF_TYPE_STRING) {
            /* each string costs >= 8 bytes, so this bounds the pool by file size */
            if (n > (c->size - c->pos) / 8 || n > pool_cap - *pool_used)
                return fail(c->err, c->errlen, "gguf: string array '%.*s' beyond end of file", (int)kv->key.len, kv->key.ptr);
            struct gguf_str *s = g->str_pool + *pool_used;
            for (uint64_t i = 0; i < n; i++)
                if (rd_str(c, &s[i], "array string")) return TIDE_EFORMAT;
            kv->v.arr.strs = s;
            *pool_used += (size_t)n;
            return 0;
        }
        if (et == GGUF_TYPE_ARRAY) {
            if (n > (c->size - c->pos) / 12) return fail(c->err, c->errlen, "gguf: array beyond end of file");
            for (uint64_t i = 0; i < n; i++)
                if (skip_value(c, et, 1)) return TIDE_EFORMAT;
            return 0;
        }
        size_t es = scalar_size(et);
        if (!es) return fail(c->err, c->errlen, "gguf: key '%.*s': unknown array element type %u", (int)kv->key.len, kv->key.ptr, et);
        if (n > (c->size - c->pos) / es)
            return fail(c->err, c->errlen, "gguf: array '%.*s' beyond end of file", (int)kv->key.len, kv->key.ptr);
        return take(c, (size_t)n * es, &q, "array");
    }
    default: break;
    }
    size_t es = scalar_size(t);
    if (!es) return fail(c->err, c->errlen, "gguf: key '%.*s': unknown value type %u", (int)kv->key.len, kv->key.ptr, t);
    if (take(c, es, &q, "value")) return TIDE_EFORMAT;
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: kv->v.u64 = q[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)q[0]; break;
    case GGUF_TYPE_UINT16: kv->v.u64 = rd16(q); break;
    case GGUF_TYPE_INT16: kv->v.i64 = (int16_t)rd16(q); break;
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, q, 4); kv->v.u64 = v; break; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, q, 4); kv->v.i64 = v; break; }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, q, 4); kv->v.f64 = v; break; }
    case GGUF_TYPE_UINT64: memcpy(&kv->v.u64, q, 8); break;
    case GGUF_TYPE_INT64: memcpy(&kv->v.i64, q, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&kv->v.f64, q, 8); break;
    }
    return 0;
}

static int parse(struct gguf_file *g, const void *buf, size_t size, char *err, size_t errlen)
{
    g->base = buf;
    g->size = size;
    if (err && errlen) err[0] = 0;
    struct cur c = {buf, 0, size, err, errlen};
    const uint8_t *q = NULL;
    if (size < 4 || take(&c, 4, &q, "magic") || memcmp(q, "GGUF", 4))
        return fail(err, errlen, "gguf: bad magic (not a GGUF file)");
    if (rd_u32(&c, &g->version, "version")) return TIDE_EFORMAT;
    if (g->version != 2 && g->version != 3)
        return fail(err, errlen, "gguf: unsupported version %u", g->version);
    if (rd_u64(&c, &g->n_tensors, "tensor count") || rd_u64(&c, &g->n_kv, "kv count")) return TIDE_EFORMAT;
    /* a kv is >= 12 bytes, a tensor info >= 28: reject counts the file cannot hold */
    if (g->n_kv > (size - c.pos) / 12)
        return fail(err, errlen, "gguf: kv count %llu too large for file", (unsigned long long)g->n_kv);
    if (g->n_tensors > (size - c.pos) / 28)
        return fail(err, errlen, "gguf: tensor count %llu too large for file", (unsigned long long)g->n_tensors);
    size_t pool_cap = (size - c.pos) / 8, pool_used = 0;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    /* worst case: the rest of the file is string-array entries; count them first instead */
    size_t n_strs = 0;
    {
        /* pre-pass over the kvs to size the string pool exactly */
        struct cur c2 = c;
        char dummy[8];
        c2.err = dummy;
        c2.errlen = sizeof dummy;
        for (uint64_t i = 0; i < g->n_kv; i++) {
            struct gguf_str k;
            uint32_t t, et;
            uint64_t n;
            if (rd_str(&c2, &k, "key") || rd_u32(&c2, &t, "type")) break;
            if (t == GGUF_TYPE_ARRAY) {
                size_t save = c2.pos;
                if (rd_u32(&c2, &et, "t") || rd_u64(&c2, &n, "n")) break;
                if (et == GGUF_TYPE_STRING && n <= pool_cap) n_strs += (size_t)n;
                c2.pos = save;
                if (skip_value(&c2, GGUF_TYPE_ARRAY, 0)) break;
            } else if (skip_value(&c2, t, 0)) {
                break;
            }
        }
        if (n_strs > pool_cap) n_strs = pool_cap;
    }
    g->str_pool = calloc(n_strs ? n_strs : 1, sizeof(*g->str_pool));
    if (!g->kv || !g->tensors || !g->str_pool) {
        free(g->kv); free(g->tensors); free(g->str_pool);
        g->kv = NULL; g->tensors = NULL; g->str_pool = NULL;
        return TIDE_ENOMEM;
    }
    int rc;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(g, &c, &g->kv[i], &pool_used, n_strs))) goto bad;
    g->alignment = 32;
    const struct gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32 || al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1))) {
            rc = fail(err, errlen, "gguf: bad general.alignment");
            goto bad;
        }
        g->alignment = (size_t)al->v.u64;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if ((rc = rd_str(&c, &t->name, "tensor name")) || (rc = rd_u32(&c, &t->n_dims, "tensor dims"))) goto bad;
        const char *nm = t->name.ptr;
        int nl = (int)(t->name.len > 200 ? 200 : t->name.len);
        if (t->n_dims < 1 || t->n_dims > 4) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' has %u dims", nl, nm, t->n_dims);
            goto bad;
        }
        uint64_t nel = 1;
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if ((rc = rd_u64(&c, &t->ne[d], "tensor shape"))) goto bad;
            if (t->ne[d] == 0 || nel > (UINT64_MAX >> 1) / t->ne[d]) {
                rc = fail(err, errlen, "gguf: tensor '%.*s' has a bad shape", nl, nm);
                goto bad;
            }
            nel *= t->ne[d];
        }
        if ((rc = rd_u32(&c, &t->type, "tensor type")) || (rc = rd_u64(&c, &t->offset, "tensor offset"))) goto bad;
        if (!ggml_block_size(t->type)) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' has unknown type %u", nl, nm, t->type);
            goto bad;
        }
        if (t->ne[0] % ggml_block_size(t->type)) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' row not a multiple of the block size", nl, nm);
            goto bad;
        }
        uint64_t blocks = nel / ggml_block_size(t->type);
        size_t bb = type_block_bytes(t->type);
        if (blocks > SIZE_MAX / bb) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' too large", nl, nm);
            goto bad;
        }
        t->nbytes = (size_t)blocks * bb;
        if (t->offset % g->alignment) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' offset not aligned", nl, nm);
            goto bad;
        }
    }
    size_t data_off = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
    if (data_off > size && g->n_tensors) {
        rc = fail(err, errlen, "gguf: data section beyond end of file");
        goto bad;
    }
    g->data_offset = data_off;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        size_t avail = size >= data_off ? size - data_off : 0;
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            rc = fail(err, errlen, "gguf: tensor '%.*s' data beyond end of file",
                      (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr);
            goto bad;
        }
        t->data = g->base + data_off + t->offset;
    }
    return 0;
bad:
    free(g->kv);
    free(g->tensors);
    free(g->str_pool);
    g->kv = NULL;
    g->tensors = NULL;
    g->str_pool = NULL;
    return rc;
}

int gguf_open_memory(struct gguf_file *g, const void *buf, size_t size, char *err, size_t errlen)
{
    memset(g, 0, sizeof(*g));
    return parse(g, buf, size, err, errlen);
}

int gguf_open(struct gguf_file *g, const char *path, char *err, size_t errlen)
{
    memset(g, 0, sizeof(*g));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err && errlen) snprintf(err, errlen, "gguf: cannot open %s: %s", path, strerror(errno));
        return errno == ENOENT ? TIDE_ENOTFOUND : TIDE_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0) {
        close(fd);
        if (err && errlen) snprintf(err, errlen, "gguf: %s is empty or unreadable", path);
        return TIDE_EFORMAT;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        if (err && errlen) snprintf(err, errlen, "gguf: mmap %s: %s", path, strerror(errno));
        return TIDE_EIO;
    }
    g->map = m;
    int rc = parse(g, m, (size_t)st.st_size, err, errlen);
    if (rc) {
        munmap(m, (size_t)st.st_size);
        g->map = NULL;
    }
    return rc;
}

void gguf_close(struct gguf_file *g)
{
    if (!g) return;
    if (g->map) munmap(g->map, g->size);
    free(g->kv);
    free(g->tensors);
    free(g->str_pool);
    memset(g, 0, sizeof(*g));
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv && gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

static bool is_signed(uint32_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}
static bool is_unsigned(uint32_t t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

int gguf_get_u64(const struct gguf_file *g, const char *key, uint64_t *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return TIDE_ENOTFOUND;
    if (is_unsigned(kv->type)) { *out = kv->v.u64; return 0; }
    if (is_signed(kv->type) && kv->v.i64 >= 0) { *out = (uint64_t)kv->v.i64; return 0; }
    return TIDE_EFORMAT;
}

int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = gguf_get_u64(g, key, &v);
    if (rc) return rc;
    if (v > UINT32_MAX) return TIDE_EFORMAT;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const struct gguf_file *g, const char *key, float *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return TIDE_ENOTFOUND;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) *out = (float)kv->v.f64;
    else if (is_unsigned(kv->type)) *out = (float)kv->v.u64;
    else if (is_signed(kv->type)) *out = (float)kv->v.i64;
    else return TIDE_EFORMAT;
    return 0;
}

int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return TIDE_ENOTFOUND;
    if (kv->type != GGUF_TYPE_BOOL) return TIDE_EFORMAT;
    *out = kv->v.u64 != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return TIDE_ENOTFOUND;
    if (kv->type != GGUF_TYPE_STRING) return TIDE_EFORMAT;
    *out = kv->v.str;
    return 0;
}

char *gguf_dup_str(const struct gguf_file *g, const char *key)
{
    struct gguf_str s;
    if (gguf_get_str(g, key, &s)) return NULL;
    char *r = malloc((size_t)s.len + 1);
    if (!r) return NULL;
    memcpy(r, s.ptr, (size_t)s.len);
    r[s.len] = 0;
    return r;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors && gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}
