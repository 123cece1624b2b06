/* vmm.h - device memory in segments that can really be handed back to the GPU and mapped
 * again at the same address (the CUDA driver's virtual memory management).
 *
 * One range = one reserved stretch of device virtual addresses, cut into n_seg slots of
 * stride bytes. Each mapped slot is its own physical allocation (cuMemCreate), so
 * vmm_unmap_segment() returns exactly that memory to the driver (cudaMemGetInfo's free grows
 * by it) while every other segment, and every pointer into it, stays valid; mapping the slot
 * again puts fresh memory back at the same addresses. The driver entry points come from the
 * runtime (cudaGetDriverEntryPointByVersion): libcuda is never linked, so a machine without
 * a driver just reports VMM as unavailable. Built without CUDA, every call returns
 * TIDE_EUNSUPPORTED. Engine thread only. */
#ifndef TIDE_VMM_H
#define TIDE_VMM_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vmm_range;

/* 0 when the driver supports VMM on device dev (why says otherwise). */
int vmm_available(int dev, char *why, size_t whylen);
/* Minimum physical allocation size on dev (2 MiB on current GPUs); 0 on failure. */
size_t vmm_granularity(int dev);
/* Reserve n_seg slots of seg_bytes each (rounded up to the granularity) on device dev.
 * Nothing is mapped yet. 0 or a negative TIDE_E* code; the reason goes to the log. */
int vmm_reserve(int dev, size_t seg_bytes, int n_seg, struct vmm_range **out);
/* Unmaps every segment and frees the reservation. */
void vmm_release(struct vmm_range *r);
/* Base address of the range; segment i starts at base + i * stride. */
void *vmm_base(const struct vmm_range *r);
size_t vmm_stride(const struct vmm_range *r);
int vmm_segments(const struct vmm_range *r);
bool vmm_is_mapped(const struct vmm_range *r, int i);
/* Physical memory for slot i (bytes rounded up to the granularity, at most the stride;
 * 0 = the whole stride), mapped read-write. TIDE_ENOMEM when the GPU has no room. */
int vmm_map_segment(struct vmm_range *r, int i, size_t bytes);
/* Unmap slot i and release its physical memory. Waits for the device first, so work still
 * queued that reads the segment finishes before the memory goes. */
int vmm_unmap_segment(struct vmm_range *r, int i);

#ifdef __cplusplus
}
#endif

#endif
