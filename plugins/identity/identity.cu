/*
** identity.cu -- the identity format on a CUDA device: a device-to-device copy when the dtypes
** match, otherwise an element-wise conversion through hq/numerics.h (the same integer rounding
** code as the CPU path, so the bytes agree).
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "hq/numerics.h"
#include "hq/plugin.h"

namespace {

template <int ST, int DT>
__global__ void convert_kernel(void *__restrict__ dst, const void *__restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    hq_store_hp(dst, i, DT, hq_load_hp(src, i, ST));
}

template <int ST>
void launch(void *dst, int dt, const void *src, int64_t n, cudaStream_t stream) {
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  if (dt == HQ_F32) convert_kernel<ST, HQ_F32><<<(unsigned)blocks, 256, 0, stream>>>(dst, src, n);
  else if (dt == HQ_F16)
    convert_kernel<ST, HQ_F16><<<(unsigned)blocks, 256, 0, stream>>>(dst, src, n);
  else convert_kernel<ST, HQ_BF16><<<(unsigned)blocks, 256, 0, stream>>>(dst, src, n);
}

} // namespace

extern "C" int identity_cuda_convert(const hq_call *call, void *dst, int dt, const void *src,
                                     int st, int64_t n) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  cudaError_t e;
  if (dt == st) {
    e = cudaMemcpyAsync(dst, src, (size_t)n * (dt == HQ_F32 ? 4u : 2u), cudaMemcpyDeviceToDevice,
                        stream);
  } else {
    if (st == HQ_F32) launch<HQ_F32>(dst, dt, src, n, stream);
    else if (st == HQ_F16) launch<HQ_F16>(dst, dt, src, n, stream);
    else launch<HQ_BF16>(dst, dt, src, n, stream);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return call->host->error(HQ_EDEVICE, "%s:%d: identity conversion: %s", __FILE__, __LINE__,
                             cudaGetErrorString(e));
  return HQ_OK;
}
