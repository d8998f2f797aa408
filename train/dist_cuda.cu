/*
** dist_cuda.cu -- --grad-dtype bf16 on GPUs (dist_cuda.h): the conversions around NCCL's BF16
** reduce-scatter, on the caller's stream. Each element goes through hq/numerics.h's own
** hq_f32_to_bf16 and hq_bf16_to_f32, the functions the CPU path calls, so both paths round by one
** rule. Plain grid-stride loops: the conversions are bound by memory, one read and one write of
** each element.
*/
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "hq/numerics.h"
#include "dist_cuda.h"

namespace {

constexpr int TPB = 256;

__global__ void __launch_bounds__(TPB) f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t k = (int64_t)blockIdx.x * TPB + threadIdx.x; k < n; k += (int64_t)gridDim.x * TPB)
    dst[k] = hq_f32_to_bf16(src[k]);
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
                                      char *err, size_t err_len) {
  if (n <= 0) return 0;
  f32_to_bf16<<<grid_for(n), TPB, 0, (cudaStream_t)stream>>>(dst, src, n);
  return launched("rounding the gradient to BF16 on the GPU", err, err_len);
}

extern "C" int train_cuda_bf16_to_f32(void *stream, float *dst, const uint16_t *src, int64_t n,
                                      char *err, size_t err_len) {
  if (n <= 0) return 0;
  bf16_to_f32<<<grid_for(n), TPB, 0, (cudaStream_t)stream>>>(dst, src, n);
  return launched("widening the BF16 gradient to FP32 on the GPU", err, err_len);
}
