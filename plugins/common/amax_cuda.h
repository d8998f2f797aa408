/*
** amax_cuda.h -- the per-tensor amax pass of the stock plugins' kernels (fp8_tensor's current
** scaling, nvfp4's global scales): max |x| over a whole tensor, NaN ignored, Inf counted -- the
** CPU reference's rule (hq_fmax_nan_ignoring) -- atomically maxed into one or two device floats
** that the caller zeroed on the stream. Private to the stock plugins (not installed).
**
** hq_cuda_amax<DT>(x, n, vec, t0, t1, stream): n elements, taken 8 at a time (the last n % 8
** by the first CTA, one each); vec: x 16-byte aligned (16-byte loads), else element loads. A
** read-only stream, so what bounds it is the bytes in flight: as many CTAs as are resident
** (launch_cuda.h, counted once per device), each thread with 4 independent 8-element loads in
** flight per step; the max is fmaxf(m, |v|) from 0 (IEEE maxNum drops a NaN operand: one
** instruction per element, never NaN); the CTA's maximum goes out in one atomicMax per target
** (bits of a non-negative float order like the values, so the result does not depend on the
** atomics' order).
** The pass walks the tensor backwards (8-element vector g of a thread's walk is vector n8 - 1 - g;
** a warp still reads 512 contiguous bytes), so that when it ends the L2 cache holds the head of
** the tensor, which the cast kernel after it in the same call reads first (the caches keep what
** was read last). HQ_AMAX_FORWARD=1 walks it forwards (for measuring).
*/
#ifndef HQ_AMAX_CUDA_H
#define HQ_AMAX_CUDA_H

#include <cuda_runtime.h>

#include "hp_load_cuda.h"
#include "launch_cuda.h"

constexpr int kHqAmaxThreads = 256;
#ifndef HQ_AMAX_FORWARD
#define HQ_AMAX_FORWARD 0
#endif

/* One step of an amax: CUDA's fmaxf is IEEE maxNum (a NaN operand gives the other one), so a
   chain started at 0 is max |x| with NaN ignored and Inf counted -- hq_fmax_nan_ignoring's rule,
   the CPU's amax (docs/formats.md) -- in one instruction per element. A partial maximum of a
   chain not started at 0 is NaN only when every element behind it is; every final chain must
   start at 0. The stock plugins' block and tensor amaxes all take it. */
__device__ __forceinline__ float hq_cuda_amax_step(float m, float x) { return fmaxf(m, fabsf(x)); }

template <int DT, bool VEC>
__global__ void __launch_bounds__(kHqAmaxThreads)
    hq_cuda_amax_kernel(const void *__restrict__ x, int64_t n, float *t0, float *t1) {
  const int64_t n8 = n / 8;
  float m = 0.0f;
  if (blockIdx.x == 0 && threadIdx.x < n % 8) m = fabsf(hq_load_hp(x, n8 * 8 + threadIdx.x, DT));
  const int64_t stride = (int64_t)gridDim.x * kHqAmaxThreads;
  int64_t g = (int64_t)blockIdx.x * kHqAmaxThreads + threadIdx.x;
  /* vector g of the walk: the tensor's vector n8 - 1 - g (backwards) */
  const int64_t last = HQ_AMAX_FORWARD ? 0 : n8 - 1, dir = HQ_AMAX_FORWARD ? 1 : -1;
  for (; g + 3 * stride < n8; g += 4 * stride) {
    float v[4][8];
#pragma unroll
    for (int u = 0; u < 4; u++)
      hq_cuda_load8<DT>(x, (last + dir * (g + u * stride)) * 8, VEC, v[u]);
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int e = 0; e < 8; e++) m = hq_cuda_amax_step(m, v[u][e]);
  }
  for (; g < n8; g += stride) {
    float v[8];
    hq_cuda_load8<DT>(x, (last + dir * g) * 8, VEC, v);
#pragma unroll
    for (int e = 0; e < 8; e++) m = hq_cuda_amax_step(m, v[e]);
  }
  __shared__ float warp_max[kHqAmaxThreads / 32];
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kHqAmaxThreads / 32 ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0 && m > 0.0f) {
      if (t0) atomicMax(reinterpret_cast<unsigned int *>(t0), __float_as_uint(m));
      if (t1) atomicMax(reinterpret_cast<unsigned int *>(t1), __float_as_uint(m));
    }
  }
}

template <int DT, bool VEC>
inline cudaError_t hq_cuda_amax_v(const void *x, int64_t n, float *t0, float *t1,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  int64_t resident = 0;
  const cudaError_t e =
      hq_cuda_resident<hq_cuda_amax_kernel<DT, VEC>>(kHqAmaxThreads, 0, &resident);
  if (e != cudaSuccess) return e;
  int64_t blocks = (n / 8 + kHqAmaxThreads - 1) / kHqAmaxThreads;
  if (blocks > resident) blocks = resident;
  if (blocks < 1) blocks = 1; /* a tail alone */
  hq_cuda_amax_kernel<DT, VEC><<<(unsigned)blocks, kHqAmaxThreads, 0, stream>>>(x, n, t0, t1);
  const cudaError_t l = cudaGetLastError();
  if (l != cudaSuccess) hq_cuda_resident_forget<hq_cuda_amax_kernel<DT, VEC>>();
  return l;
}

template <int DT>
inline cudaError_t hq_cuda_amax(const void *x, int64_t n, bool vec, float *t0, float *t1,
                                cudaStream_t stream) {
  return vec ? hq_cuda_amax_v<DT, true>(x, n, t0, t1, stream)
             : hq_cuda_amax_v<DT, false>(x, n, t0, t1, stream);
}

#endif /* HQ_AMAX_CUDA_H */
