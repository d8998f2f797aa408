/*
** adamw_cuda.cu -- libhqtrain's AdamW step on a CUDA device (hq_adam_step's unfused path): one
** grid-stride pass over the masters that can also produce the write-back's per-tensor amax.
** Everything runs on the caller's stream.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "hq/adamw.h"
#include "hq/hq.h"
#include "adamw_cuda.h"

namespace {

/* AMAX: also the NaN-ignoring max |w| of the updated masters (the write-back's per-tensor amax,
   in the same pass): a max per thread, per warp, then one atomic per warp into both words. */
template <int DT, bool AMAX>
__global__ void adam_kernel(hq_adam_consts k, const void *__restrict__ g, float *__restrict__ w,
                            float *__restrict__ m, float *__restrict__ v, int64_t n,
                            unsigned int *__restrict__ amax_bits) {
  uint32_t mx = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float wi = hq_adam_at(&k, g, DT, w, m, v, i);
    if (AMAX) {
      const uint32_t b = hq_abs_bits_nonan(wi);
      mx = b > mx ? b : mx;
    }
  }
  if (AMAX) {
    mx = __reduce_max_sync(0xffffffffu, mx);
    if ((threadIdx.x & 31) == 0 && mx) {
      atomicMax(&amax_bits[0], mx);
      atomicMax(&amax_bits[1], mx);
    }
  }
}

template <int DT>
void launch_adam(unsigned blocks, cudaStream_t s, const hq_adam_consts &k, const void *g, float *w,
                 float *m, float *v, int64_t n, unsigned int *amax_bits) {
  if (amax_bits) adam_kernel<DT, true><<<blocks, 256, 0, s>>>(k, g, w, m, v, n, amax_bits);
  else adam_kernel<DT, false><<<blocks, 256, 0, s>>>(k, g, w, m, v, n, nullptr);
}

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

extern "C" int hqt_cuda_adam(void *stream, const hq_adam_consts *k, const void *grad, int gdtype,
                             float *w, float *m, float *v, int64_t n, unsigned int *amax_bits) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  if (amax_bits && (e = cudaMemsetAsync(amax_bits, 0, 2 * sizeof *amax_bits, s)) != cudaSuccess)
    return cuda_error(e, "cudaMemsetAsync of the amax", __LINE__);
  if (n <= 0) return HQ_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  if (gdtype == HQ_F32) launch_adam<HQ_F32>((unsigned)blocks, s, *k, grad, w, m, v, n, amax_bits);
  else if (gdtype == HQ_F16) launch_adam<HQ_F16>((unsigned)blocks, s, *k, grad, w, m, v, n, amax_bits);
  else launch_adam<HQ_BF16>((unsigned)blocks, s, *k, grad, w, m, v, n, amax_bits);
  if ((e = cudaGetLastError()) != cudaSuccess) return cuda_error(e, "adam kernel", __LINE__);
  return HQ_OK;
}
