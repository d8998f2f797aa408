/*
** hqi_cuda.h -- the functions that cross between libhqcore's C files and its CUDA files, declared
** once for both compilers: hq_internal.h includes it, and so does every .cu file of libhqcore.
*/
#ifndef HQI_CUDA_H
#define HQI_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Record a formatted message as the thread's last error; returns code (error.c). */
int hqi_error(int code, const char *fmt, ...) HQ_PRINTF(2, 3);

/* Stream-ordered device memory from hq's pool of `device` (device.c). */
int hqi_cuda_malloc(int device, size_t bytes, void *stream, void **out);
void hqi_cuda_free(int device, void *ptr, void *stream);

/* The workspace of the context a core-built call runs on: at least `bytes` on its device,
   allocated through its allocator at the first use and kept until hq_ctx_destroy or
   hq_device_trim. *out is NULL (and HQ_OK) when there is none to give: a call without a context,
   the host, an allocation that failed (recorded nowhere: the caller runs without) or a stream
   being captured into a CUDA graph (an allocation there would belong to the graph) (ctx.c). */
int hqi_call_workspace(const hq_call *call, size_t bytes, void **out);

/* The host service hq_host_api.lt_matmul: one cuBLASLt matmul on call->device / call->stream,
   with the runner's cached handle and plans and the context's workspace
   (gemm/cublaslt/runner.cu; without CUDA, gemm/cublaslt/cublaslt.c returns HQ_ENOTSUP). Errors
   name m, n, k and mm->what. */
int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm);

#ifdef __cplusplus
}
#endif
#endif
