/* vmm.cu - src/memory/vmm.h on the CUDA driver's virtual memory API, reached through the
 * runtime's entry-point query so the binary never links libcuda (and starts without one).
 *
 * Why VMM rather than cudaMalloc/cudaFree per segment: a freed cudaMalloc block may come
 * back at another address, and every expert slot pointer would have to be rewritten;
 * with a reserved range the addresses are fixed for the life of the cache and only the
 * physical backing comes and goes. */
#include <cuda.h>
#include <cuda_runtime.h>

cudaError_t cuda_use_device(int dev); /* backend_cuda.cu */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common.h"
#include "memory/vmm.h"
}

struct drv {
    bool loaded;
    int status;   /* 0, or why not */
    char why[160];
    CUresult (*get_gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*err_str)(CUresult, const char **);
    CUresult (*dev_attr)(int *, CUdevice_attribute, CUdevice);
};

static struct drv D;

static bool sym(const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
        snprintf(D.why, sizeof D.why, "driver entry point %s: %s", name,
                 e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

static int load(void)
{
    if (D.loaded)
        return D.status;
    D.loaded = true;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(D.why, sizeof D.why, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none");
        (void)cudaGetLastError();
        return D.status = TIDE_EUNSUPPORTED;
    }
    bool ok = sym("cuMemGetAllocationGranularity", (void **)&D.get_gran) &&
              sym("cuMemAddressReserve", (void **)&D.reserve) && sym("cuMemAddressFree", (void **)&D.addr_free) &&
              sym("cuMemCreate", (void **)&D.create) && sym("cuMemRelease", (void **)&D.release) &&
              sym("cuMemMap", (void **)&D.map) && sym("cuMemUnmap", (void **)&D.unmap) &&
              sym("cuMemSetAccess", (void **)&D.set_access) && sym("cuGetErrorString", (void **)&D.err_str) &&
              sym("cuDeviceGetAttribute", (void **)&D.dev_attr);
    return D.status = ok ? 0 : TIDE_EUNSUPPORTED;
}

/* Checked driver call: logs call, file, line and the driver's message. */
static bool drv_ok(CUresult r, const char *call, const char *file, int line)
{
    if (r == CUDA_SUCCESS)
        return true;
    const char *s = NULL;
    if (D.err_str)
        D.err_str(r, &s);
    tide_log("vmm: %s failed at %s:%d: %s (%d)", call, file, line, s ? s : "?", (int)r);
    return false;
}
#define DRV(call) drv_ok((call), #call, __FILE__, __LINE__)

struct vmm_range {
    int dev;
    CUdeviceptr base;
    size_t stride, gran;
    int n_seg;
    CUmemGenericAllocationHandle *h;  /* (n_seg) */
    size_t *mapped;                   /* (n_seg) bytes mapped, 0 = unmapped */
};

static CUmemAllocationProp prop_for(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

extern "C" int vmm_available(int dev, char *why, size_t whylen)
{
    int rc = load();
    if (rc == 0) {
        int sup = 0;
        /* the primary context must exist before driver calls on this device */
        if (cuda_use_device(dev) != cudaSuccess || cudaFree(0) != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(D.why, sizeof D.why, "cannot initialise CUDA device %d", dev);
            rc = TIDE_EUNSUPPORTED;
        } else if (D.dev_attr(&sup, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS || !sup) {
            snprintf(D.why, sizeof D.why, "device %d does not support virtual memory management", dev);
            rc = TIDE_EUNSUPPORTED;
        }
    }
    if (rc && why && whylen)
        snprintf(why, whylen, "%s", D.why);
    return rc;
}

extern "C" size_t vmm_granularity(int dev)
{
    if (vmm_available(dev, NULL, 0))
        return 0;
    CUmemAllocationProp p = prop_for(dev);
    size_t g = 0;
    if (!DRV(D.get_gran(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        return 0;
    return g;
}

extern "C" int vmm_reserve(int dev, size_t seg_bytes, int n_seg, struct vmm_range **out)
{
    *out = NULL;
    char why[160];
    if (vmm_available(dev, why, sizeof why)) {
        tide_log("vmm: %s", why);
        return TIDE_EUNSUPPORTED;
    }
    if (n_seg <= 0 || seg_bytes == 0)
        return TIDE_EINVAL;
    size_t g = vmm_granularity(dev);
    if (!g)
        return TIDE_EINTERNAL;
    struct vmm_range *r = (struct vmm_range *)calloc(1, sizeof *r);
    if (!r)
        return TIDE_ENOMEM;
    r->dev = dev;
    r->gran = g;
    r->stride = (seg_bytes + g - 1) / g * g;
    r->n_seg = n_seg;
    r->h = (CUmemGenericAllocationHandle *)calloc((size_t)n_seg, sizeof *r->h);
    r->mapped = (size_t *)calloc((size_t)n_seg, sizeof *r->mapped);
    if (!r->h || !r->mapped) {
        free(r->h); free(r->mapped); free(r);
        return TIDE_ENOMEM;
    }
    if (!DRV(D.reserve(&r->base, r->stride * (size_t)n_seg, g, 0, 0))) {
        free(r->h); free(r->mapped); free(r);
        return TIDE_ENOMEM;
    }
    *out = r;
    return 0;
}

extern "C" void *vmm_base(const struct vmm_range *r) { return (void *)(uintptr_t)r->base; }
extern "C" size_t vmm_stride(const struct vmm_range *r) { return r->stride; }
extern "C" int vmm_segments(const struct vmm_range *r) { return r->n_seg; }
extern "C" bool vmm_is_mapped(const struct vmm_range *r, int i) { return i >= 0 && i < r->n_seg && r->mapped[i]; }

extern "C" int vmm_map_segment(struct vmm_range *r, int i, size_t bytes)
{
    if (i < 0 || i >= r->n_seg)
        return TIDE_EINVAL;
    if (r->mapped[i])
        return 0;
    size_t sz = bytes ? (bytes + r->gran - 1) / r->gran * r->gran : r->stride;
    if (sz > r->stride)
        return TIDE_EINVAL;
    CUmemAllocationProp p = prop_for(r->dev);
    CUmemGenericAllocationHandle h;
    CUresult cr = D.create(&h, sz, &p, 0);
    if (cr == CUDA_ERROR_OUT_OF_MEMORY)
        return TIDE_ENOMEM; /* no room is an answer, not a failure worth a log line */
    if (!DRV(cr))
        return TIDE_EINTERNAL;
    CUdeviceptr at = r->base + (CUdeviceptr)((size_t)i * r->stride);
    if (!DRV(D.map(at, sz, 0, h, 0))) {
        D.release(h);
        return TIDE_EINTERNAL;
    }
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = r->dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (!DRV(D.set_access(at, sz, &a, 1))) {
        D.unmap(at, sz);
        D.release(h);
        return TIDE_EINTERNAL;
    }
    r->h[i] = h;
    r->mapped[i] = sz;
    return 0;
}

extern "C" int vmm_unmap_segment(struct vmm_range *r, int i)
{
    if (i < 0 || i >= r->n_seg)
        return TIDE_EINVAL;
    if (!r->mapped[i])
        return 0;
    if (cuda_use_device(r->dev) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        tide_log("vmm: device %d: synchronise before unmap failed: %s", r->dev, cudaGetErrorString(cudaGetLastError()));
        return TIDE_EINTERNAL;
    }
    CUdeviceptr at = r->base + (CUdeviceptr)((size_t)i * r->stride);
    bool ok = DRV(D.unmap(at, r->mapped[i]));
    ok = DRV(D.release(r->h[i])) && ok; /* the memory goes back once both are done */
    r->mapped[i] = 0;
    r->h[i] = 0;
    return ok ? 0 : TIDE_EINTERNAL;
}

extern "C" void vmm_release(struct vmm_range *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_seg; i++)
        vmm_unmap_segment(r, i);
    DRV(D.addr_free(r->base, r->stride * (size_t)r->n_seg));
    free(r->h);
    free(r->mapped);
    free(r);
}
