/*
** device.c -- the core's few CUDA runtime calls (device query, memory, copies, streams).
** Built without CUDA, every device path reports HQ_ENOTSUP and hq_device_count() is 0.
*/
#include "config.h"
#include "hq_internal.h"

#include <string.h>

#ifdef HQ_HAVE_CUDA
#include <cuda_runtime.h>

#define HQ_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess)                                                                  \
      return hqi_error(HQ_EDEVICE, "%s:%d: %s failed: %s", __FILE__, __LINE__, #expr,        \
                       cudaGetErrorString(err_));                                             \
  } while (0)

int hq_built_with_cuda(void) { return 1; }

int hq_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no device" error */
    return 0;
  }
  return n;
}

int hq_device_info(int device, char *name, size_t name_len, int *arch) {
  struct cudaDeviceProp prop;
  HQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (name && name_len) {
    strncpy(name, prop.name, name_len - 1);
    name[name_len - 1] = '\0';
  }
  if (arch) *arch = prop.major * 10 + prop.minor;
  return HQ_OK;
}

int hqi_cuda_arch(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

int hqi_cuda_set_device(int device) {
  HQ_CUDA_CHECK(cudaSetDevice(device));
  return HQ_OK;
}

int hqi_cuda_malloc(int device, size_t bytes, void *stream, void **out) {
  (void)stream;
  *out = NULL;
  HQ_CUDA_CHECK(cudaSetDevice(device));
  HQ_CUDA_CHECK(cudaMalloc(out, bytes ? bytes : 1));
  return HQ_OK;
}

void hqi_cuda_free(int device, void *ptr, void *stream) {
  (void)stream;
  if (!ptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);
}

int hqi_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                    void *stream) {
  if (bytes == 0) return HQ_OK;
  enum cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_device < 0 && src_device < 0) kind = cudaMemcpyHostToHost;
  HQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)stream));
  return HQ_OK;
}

int hqi_cuda_sync(void *stream) {
  HQ_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return HQ_OK;
}

#else /* !HQ_HAVE_CUDA */

static int no_cuda(void) {
  return hqi_error(HQ_ENOTSUP, "this libhqcore was built without CUDA (configure --with-cuda)");
}

int hq_built_with_cuda(void) { return 0; }
int hq_device_count(void) { return 0; }
int hq_device_info(int device, char *name, size_t name_len, int *arch) {
  (void)device; (void)name; (void)name_len; (void)arch;
  return no_cuda();
}
int hqi_cuda_arch(int device) { (void)device; return 0; }
int hqi_cuda_set_device(int device) { (void)device; return no_cuda(); }
int hqi_cuda_malloc(int device, size_t bytes, void *stream, void **out) {
  (void)device; (void)bytes; (void)stream;
  *out = NULL;
  return no_cuda();
}
void hqi_cuda_free(int device, void *ptr, void *stream) { (void)device; (void)ptr; (void)stream; }
int hqi_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                    void *stream) {
  (void)dst; (void)dst_device; (void)src; (void)src_device; (void)bytes; (void)stream;
  return no_cuda();
}
int hqi_cuda_sync(void *stream) { (void)stream; return no_cuda(); }

#endif
