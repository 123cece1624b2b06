/* gguf.h - read GGUF v3 files (mmap) and write them (for the model tool and tests).
 *
 * The reader never trusts the file: every length and offset is checked against the
 * mapping before use, so a truncated or corrupt file is TIDE_EFORMAT with a message,
 * never a crash. Strings point into the mapping and are NOT NUL-terminated.
 * Tensor dims follow ggml: ne[0] is the contiguous (innermost) dimension. */
#ifndef TIDE_GGUF_H
#define TIDE_GGUF_H

#include "../common.h"

enum gguf_value_type {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

/* ggml tensor types (numbering as in ggml, so files and other tools agree). */
enum ggml_type {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_IQ4_XS = 23, GGML_TYPE_BF16 = 30, GGML_TYPE_MXFP4 = 39,
};
#define QK_K 256        /* values per k-quant super-block */
#define Q4_K_BYTES 144  /* f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles */
#define Q5_K_BYTES 176  /* as q4_K, then 32 bytes of fifth bits before the 128 bytes of nibbles */
#define Q6_K_BYTES 210  /* 128 low nibbles, 64 high 2-bit pairs, 16 int8 scales, f16 d */
#define IQ4_XS_BYTES 136 /* f16 d, u16 high scale bits, 4 bytes low scale bits, 128 bytes of nibbles */
#define Q5_0_BYTES 22   /* f16 d, u32 fifth bits, 16 bytes of nibbles (32 values) */
#define Q5_1_BYTES 24   /* f16 d, f16 m, u32 fifth bits, 16 bytes of nibbles */
#define MXFP4_BYTES 17  /* e8m0 shared exponent, 16 bytes of fp4 (e2m1) nibbles */

struct gguf_str {
    uint64_t len;
    const char *ptr; /* into the mapping (reader) or caller memory (writer) */
};

struct gguf_kv {
    struct gguf_str key;
    uint32_t type;          /* enum gguf_value_type */
    union {
        uint64_t u64;       /* every unsigned int type, and bool */
        int64_t i64;        /* every signed int type */
        double f64;         /* float32 and float64 */
        struct gguf_str str;
        struct {
            uint32_t type;  /* element type */
            uint64_t n;     /* element count */
            const uint8_t *data;           /* first element in the mapping */
            const struct gguf_str *strs;   /* string arrays: n entries, indexed at parse */
        } arr;
    } v;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];         /* unused dims are 1 */
    uint32_t type;          /* enum ggml_type */
    uint64_t offset;        /* relative to the data section */
    const void *data;       /* into the mapping */
    size_t nbytes;
};

struct gguf_file {
    void *map;              /* whole file, read-only (NULL for gguf_open_memory) */
    size_t size;
    const uint8_t *base;    /* start of the bytes (map or the caller's buffer) */
    uint32_t version;
    uint64_t n_kv, n_tensors;
    struct gguf_kv *kv;             /* owned */
    struct gguf_tensor *tensors;    /* owned */
    struct gguf_str *str_pool;      /* owned: storage for arr.strs */
    size_t alignment;
    size_t data_offset;     /* start of the tensor data section */
};

/* Map and parse PATH. On failure returns a negative code and writes a one-line reason
 * into err (may be NULL). */
int gguf_open(struct gguf_file *g, const char *path, char *err, size_t errlen);
/* Parse a caller-owned buffer (tests, fuzzers); the buffer must outlive g. */
int gguf_open_memory(struct gguf_file *g, const void *buf, size_t size, char *err, size_t errlen);
void gguf_close(struct gguf_file *g);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key);
/* Typed getters: 0, TIDE_ENOTFOUND when absent, TIDE_EFORMAT when the type does not fit
 * (any integer type converts to an integer getter when the value is in range). */
int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf_file *g, const char *key, uint64_t *out);
int gguf_get_f32(const struct gguf_file *g, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out);
/* NUL-terminated copy (malloc) of a string value, or NULL. */
char *gguf_dup_str(const struct gguf_file *g, const char *key);
bool gguf_str_eq(struct gguf_str s, const char *c);

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/* Bytes of a row of n elements of type (n must be a multiple of the block size);
 * 0 for an unsupported type. */
size_t ggml_row_size(uint32_t type, uint64_t n);
uint32_t ggml_block_size(uint32_t type);
const char *ggml_type_name(uint32_t type);
/* Dequantise n elements (multiple of the block size) into dst (quants.c). */
void ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n);
/* Quantise n floats into dst (any type above; quants.c). Returns bytes written, 0 for an
 * unknown type or n not a multiple of the block size. */
size_t ggml_quantize(uint32_t type, const float *src, void *dst, uint64_t n);
float tide_f16_to_f32(uint16_t h);
uint16_t tide_f32_to_f16(float f);
float tide_bf16_to_f32(uint16_t h);
uint16_t tide_f32_to_bf16(float f);

/* ---- writer (gguf_write.c): build in memory, then write the file in one go ---- */
struct gguf_writer;
struct gguf_writer *gguf_writer_new(void);
void gguf_writer_free(struct gguf_writer *w);
void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v);
void gguf_w_f32(struct gguf_writer *w, const char *key, float v);
void gguf_w_bool(struct gguf_writer *w, const char *key, bool v);
void gguf_w_str(struct gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
/* Add a tensor from f32 data, stored as type (converted/quantised by the writer).
 * ne[0] innermost; n_dims 1..4. The data is copied. */
void gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                   const uint64_t *ne, const float *data);
/* A tensor whose values are made at write time: fill(ctx, first, n, dst) writes elements
 * [first, first + n) (flat index, ne[0] innermost) as f32 into dst. It is called from
 * several threads at once and must depend only on its arguments; ctx_size bytes of ctx
 * are copied. For models too large to hold in memory (gguf_write.c streams them). */
typedef void (*gguf_fill_fn)(const void *ctx, uint64_t first, uint64_t n, float *dst);
void gguf_w_tensor_fill(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                        const uint64_t *ne, gguf_fill_fn fill, const void *ctx, size_t ctx_size);
/* The same with the stored bytes made directly: raw(ctx, first, n, dst) writes elements
 * [first, first + n) (whole blocks) in the tensor's type into dst. */
typedef void (*gguf_raw_fn)(const void *ctx, uint64_t first, uint64_t n, void *dst);
void gguf_w_tensor_fill_raw(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const uint64_t *ne, gguf_raw_fn raw, const void *ctx, size_t ctx_size);
/* Threads that make filled tensors (0, the default: one per online CPU). */
void gguf_writer_set_threads(struct gguf_writer *w, int n);
int gguf_writer_write(struct gguf_writer *w, const char *path);
/* Serialise to a malloc'd buffer (tests, fuzz seeds). */
int gguf_writer_to_memory(struct gguf_writer *w, void **buf, size_t *size);

#endif
