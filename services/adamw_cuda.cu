/*
** adamw_cuda.cu -- libhqtrain's AdamW step on a CUDA device (hq_adam_step's unfused path): the
** element-wise step of plugins/common/adam_cuda.h (one grid-stride pass over the masters that
** can also produce the write-back's per-tensor amax), which the stock plugins' split write-back
** launches too. Everything runs on the caller's stream.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "hq/adamw.h"
#include "hq/hq.h"
#include "adamw_cuda.h"
#include "adam_cuda.h"

namespace {

int cuda_error(cudaError_t e, const char *what, int line) {
  cudaGetLastError(); /* clear it: the next call must not see this one's failure */
  return hq_set_error(HQ_EDEVICE, "%s:%d: %s: %s", __FILE__, line, what, cudaGetErrorString(e));
}

} // namespace

extern "C" int hqt_cuda_enter(int device, int *saved) {
  *saved = -1;
  if (device < 0) return HQ_OK;
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDevice", __LINE__);
  *saved = cur;
  if (cur != device && (e = cudaSetDevice(device)) != cudaSuccess)
    return cuda_error(e, "cudaSetDevice", __LINE__);
  return HQ_OK;
}

extern "C" void hqt_cuda_leave(int saved) {
  int cur = -1;
  if (saved < 0) return;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != saved) cudaSetDevice(saved);
}

extern "C" int hqt_cuda_adam(void *stream, const hq_adam_consts *k, const hq_adam_consts *k_dev,
                             const void *grad, int gdtype, float *w, float *m, float *v, int64_t n,
                             unsigned int *amax_bits, int zeroed) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  /* zeroed by a kernel, not a memset: a kernel node costs half a memset node in a graph */
  if (amax_bits && !zeroed &&
      (e = hq_cuda_zero_words(amax_bits, amax_bits + 1, nullptr, s)) != cudaSuccess)
    return cuda_error(e, "zeroing the amax", __LINE__);
  if ((e = hq_cuda_adam_run(s, *k, k_dev, grad, gdtype, w, m, v, n, amax_bits)) != cudaSuccess)
    return cuda_error(e, "adam kernel", __LINE__);
  return HQ_OK;
}
