/* backend_cuda_none.c - the CUDA entry points for a build without nvcc: no device exists,
 * and every call says so, so the daemon links and runs the same code paths on any machine.
 * The Makefile compiles this file only when there are no .cu objects to link. */
#include "engine/backend_cuda.h"
#include "memory/vmm.h"

#include <stdio.h>

static const char no_cuda[] = "tide was built without CUDA (nvcc not found at build time)";

int cuda_device_count(char *why, size_t whylen)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", no_cuda);
    return 0;
}

int cuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return TIDE_EUNSUPPORTED;
}

int backend_cuda_init(struct backend *b, int device_index, char *err, size_t errlen)
{
    (void)b;
    if (err && errlen)
        snprintf(err, errlen, "cuda device %d: %s", device_index, no_cuda);
    return TIDE_EUNSUPPORTED;
}

void backend_cuda_free(struct backend *b) { (void)b; }
int cuda_set_decode_opt(int which, int on) { (void)which; (void)on; return 0; }

int backend_cuda_error(const struct backend *b, char *msg, size_t msglen)
{
    (void)b; (void)msg; (void)msglen;
    return TIDE_EUNSUPPORTED;
}

void *cuda_host_alloc(size_t bytes) { (void)bytes; return NULL; }
void cuda_host_free(void *p) { (void)p; }
int cuda_set_f16_mma(int on) { (void)on; return 0; }
int cuda_set_f16_mma_tile(int bn, int max_splits) { (void)bn; (void)max_splits; return 0; }
int cuda_set_mmq_min_n(int n) { (void)n; return 0; }
int cuda_set_mmq_tile(int bn) { (void)bn; return 0; }
int cuda_set_mmq_split(int max_splits) { (void)max_splits; return 0; }
int cuda_set_moe_grouped(int on) { (void)on; return 0; }
int cuda_set_moe_rows_mma(int on) { (void)on; return 0; }
int cuda_set_attn_mma(int on) { (void)on; return 0; }
int cuda_set_vision_tc(int on) { (void)on; return 0; }
int cuda_set_kq_mma(int on) { (void)on; return 0; }
int cuda_kq_mma_takes(uint32_t type, int cols, int n) { (void)type; (void)cols; (void)n; return 0; }

int vmm_available(int dev, char *why, size_t whylen)
{
    (void)dev;
    if (why && whylen)
        snprintf(why, whylen, "%s", no_cuda);
    return TIDE_EUNSUPPORTED;
}
size_t vmm_granularity(int dev) { (void)dev; return 0; }
int vmm_reserve(int dev, size_t seg_bytes, int n_seg, struct vmm_range **out)
{
    (void)dev; (void)seg_bytes; (void)n_seg;
    *out = NULL;
    return TIDE_EUNSUPPORTED;
}
void vmm_release(struct vmm_range *r) { (void)r; }
void *vmm_base(const struct vmm_range *r) { (void)r; return NULL; }
size_t vmm_stride(const struct vmm_range *r) { (void)r; return 0; }
int vmm_segments(const struct vmm_range *r) { (void)r; return 0; }
bool vmm_is_mapped(const struct vmm_range *r, int i) { (void)r; (void)i; return false; }
int vmm_map_segment(struct vmm_range *r, int i, size_t bytes) { (void)r; (void)i; (void)bytes; return TIDE_EUNSUPPORTED; }
int vmm_unmap_segment(struct vmm_range *r, int i) { (void)r; (void)i; return TIDE_EUNSUPPORTED; }
