/*
** cast_cuda.cu -- the trainer's FP32 <-> BF16 conversions on the GPU (cast_cuda.h), on the
** caller's stream: the bf16-direct run's operands (direct_cuda.cu) and --grad-dtype bf16's
** gradients around NCCL's BF16 reduce-scatter (dist.c). Each element goes through
** hq/numerics.h's hq_f32_to_bf16 and hq_bf16_to_f32, the functions the CPU paths call, so every
** path rounds by one rule. Grid-stride loops bound by memory (one read and one write of each
** element), four elements a thread where the buffers' alignment allows 16- and 8-byte accesses.
*/
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "hq/numerics.h"
#include "cast_cuda.h"

namespace {

constexpr int TPB = 256;

__global__ void __launch_bounds__(TPB) f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t k = (int64_t)blockIdx.x * TPB + threadIdx.x; k < n; k += (int64_t)gridDim.x * TPB)
    dst[k] = hq_f32_to_bf16(src[k]);
}

__global__ void __launch_bounds__(TPB) f32_to_bf16_x4(uint2 *dst, const float4 *src, int64_t n4) {
  for (int64_t k = (int64_t)blockIdx.x * TPB + threadIdx.x; k < n4;
       k += (int64_t)gridDim.x * TPB) {
    const float4 v = src[k];
    uint2 o;
    o.x = (uint32_t)hq_f32_to_bf16(v.x) | (uint32_t)hq_f32_to_bf16(v.y) << 16;
    o.y = (uint32_t)hq_f32_to_bf16(v.z) | (uint32_t)hq_f32_to_bf16(v.w) << 16;
    dst[k] = o;
  }
}

__global__ void __launch_bounds__(TPB) bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t k = (int64_t)blockIdx.x * TPB + threadIdx.x; k < n; k += (int64_t)gridDim.x * TPB)
    dst[k] = hq_bf16_to_f32(src[k]);
}

/* enough blocks to cover n, at most what a grid-stride loop needs to fill the GPU */
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + TPB - 1) / TPB;
  return (unsigned)(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

int launched(const char *what, char *err, size_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

}  // namespace

extern "C" int train_cuda_f32_to_bf16(void *stream, uint16_t *dst, const float *src, int64_t n,
                                      const char *what, char *err, size_t err_len) {
  if (n <= 0) return 0;
  if (n % 4 == 0 && !((uintptr_t)src & 15) && !((uintptr_t)dst & 7))
    f32_to_bf16_x4<<<grid_for(n / 4), TPB, 0, (cudaStream_t)stream>>>(
        (uint2 *)dst, (const float4 *)src, n / 4);
  else
    f32_to_bf16<<<grid_for(n), TPB, 0, (cudaStream_t)stream>>>(dst, src, n);
  return launched(what, err, err_len);
}

extern "C" int train_cuda_bf16_to_f32(void *stream, float *dst, const uint16_t *src, int64_t n,
                                      const char *what, char *err, size_t err_len) {
  if (n <= 0) return 0;
  bf16_to_f32<<<grid_for(n), TPB, 0, (cudaStream_t)stream>>>(dst, src, n);
  return launched(what, err, err_len);
}
