/* graph.cu - the CUDA backend's recorded steps (backend_i.graph_*), by CUDA graphs.
 *
 * Recording is stream capture of the op stream in thread-local mode. The copy stream is not
 * captured, so an upload inside a recording would not be replayed: callers upload before. A
 * workspace that would have to grow inside a recording cannot (the graph would keep pointing at
 * the old one), so cuda_scratch/cuda_sum_buf fail the recording instead (c->capture_rc). */
#include "engine/cuda/common.cuh"

#include <stdlib.h>

struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned long ws_gen; /* c->ws_gen when recorded */
};

int cuda_graph_begin(void *ctx)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!cuda_enter(c))
        return c->err;
    if (c->capturing)
        return TIDE_EINVAL;
    if (!CU(c, cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal)))
        return c->err;
    c->capturing = true;
    c->capture_rc = 0;
    return 0;
}

int cuda_graph_end(void *ctx, void **graph)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    *graph = NULL;
    if (!c->capturing)
        return TIDE_EINVAL;
    c->capturing = false;
    cuda_use_device(c->dev);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->st, &g);
    int rc = c->capture_rc;
    if (e != cudaSuccess && !rc) {
        /* a launch that broke the capture: the ops are not queued, but the backend is fine */
        tide_log("cuda: device %d: recording failed: %s", c->dev, cudaGetErrorString(e));
        rc = TIDE_EINTERNAL;
    }
    (void)cudaGetLastError();
    cudaGraphExec_t x = NULL;
    if (!rc && g) {
        e = cudaGraphInstantiateWithFlags(&x, g, 0);
        if (e != cudaSuccess) {
            tide_log("cuda: device %d: cudaGraphInstantiate: %s", c->dev, cudaGetErrorString(e));
            (void)cudaGetLastError();
            rc = TIDE_EINTERNAL;
            x = NULL;
        }
    }
    if (g)
        cudaGraphDestroy(g);
    struct cuda_graph *cg = NULL;
    if (!rc && !(cg = (struct cuda_graph *)malloc(sizeof *cg)))
        rc = TIDE_ENOMEM;
    if (rc) {
        if (x)
            cudaGraphExecDestroy(x);
        return rc;
    }
    cg->exec = x;
    cg->ws_gen = c->ws_gen;
    *graph = cg;
    return c->err;
}

int cuda_graph_launch(void *ctx, void *graph)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    struct cuda_graph *cg = (struct cuda_graph *)graph;
    if (!cuda_enter(c))
        return c->err;
    if (cg->ws_gen != c->ws_gen) /* it would use a freed workspace */
        return TIDE_ESTALE;
    return CU(c, cudaGraphLaunch(cg->exec, c->st)) ? 0 : c->err;
}

void cuda_graph_free(void *ctx, void *graph)
{
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    struct cuda_graph *cg = (struct cuda_graph *)graph;
    if (!cg)
        return;
    cuda_use_device(c->dev);
    cudaGraphExecDestroy(cg->exec);
    free(cg);
}

