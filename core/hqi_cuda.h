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

/* The core's kernels (core/cuda/kernels.cu; without CUDA, device.c's stubs return HQ_ENOTSUP).
   hqi_cuda_convert: n elements between high-precision dtypes (a copy when they match).
   hqi_cuda_nonfinite: out[0] += the number of NaN/Inf among n elements, out[1] = min(out[1],
   the index of the first); out is device memory the caller initialised ({0, UINT64_MAX}).
   hqi_cuda_transpose: dst[c][r] = src[r][c] for a [rows, cols] block of elem_bytes-byte
   elements (leading dimensions in elements). */
int hqi_cuda_convert(void *stream, void *dst, int dt, const void *src, int st, int64_t n);
int hqi_cuda_nonfinite(void *stream, const void *data, int dtype, int64_t n,
                       unsigned long long *out);
/* *out (device memory) = max |x| of the n elements of data (dtype HQ_F32, HQ_F16 or HQ_BF16),
   NaN ignored; 0 for n = 0. */
int hqi_cuda_amax(void *stream, const void *data, int dtype, int64_t n, float *out);
int hqi_cuda_transpose(void *stream, void *dst, int64_t dld, const void *src, int64_t sld,
                       int64_t rows, int64_t cols, int elem_bytes);
/* *dst (device memory) = value, in stream order (one thread: no pageable copy, so that it may
   precede a graph replay that reads it). */
int hqi_cuda_set_u64(void *stream, uint64_t *dst, uint64_t value);
/* n 4-byte words at dst (device memory, 4-byte aligned) zeroed by one CTA, in stream order: for
   the few words of an amax or a small buffer, where a memset node would cost a replayed graph
   about twice a kernel node. */
int hqi_cuda_zero_words(void *stream, void *dst, int64_t n);

/* The host service hq_host_api.lt_matmul: one cuBLASLt matmul on call->device / call->stream,
   with the runner's cached handle and plans and the context's workspace
   (gemm/cublaslt/runner.cu; without CUDA, gemm/cublaslt/cublaslt.c returns HQ_ENOTSUP). Errors
   name m, n, k and mm->what. */
int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm);

#ifdef __cplusplus
}
#endif
#endif
