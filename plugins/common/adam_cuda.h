/*
** adam_cuda.h -- the AdamW step element by element on a CUDA device (hq_adam_elem per element,
** the CPU's rule), the one kernel both users launch: libhqtrain's unfused hq_adam_step
** (services/adamw_cuda.cu, optionally with the write-back's per-tensor amax) and a plugin whose
** fused write-back (HQ_CAP_FUSED_ADAM) splits the step off on a small tensor, where that
** write-back's few CTAs leave most SMs idle (fp8_block, fp8_tensor: the plugin's plain quantize
** then reads the new master: the same bits, one more read of the master). Private to
** the stock plugins and libhqtrain (not installed); host code of .cu files.
**
**   hq_cuda_adam_run(stream, k, kd, g, gdtype, w, m, v, n, amax_bits)
**       the step over w's n elements (kd: this step's constants on the device, read instead of k
**       when not NULL: a graph's replay), amax_bits NULL or two words zeroed by the caller that
**       receive max |w| of the new masters (NaN ignored, as float bits); queued on stream
**   hq_cuda_adam(adam, w, n, stream)   the same from a plugin's hq_adam_pass, no amax
**   hq_cuda_fused_adam_fills(device, ctas, per_sm)   whether a plugin's fused write-back of
**       that many CTAs fills the device, or should be split into the step and a plain quantize
**
** The grid is the CTAs the device holds at once (launch_cuda.h), each looping over the tensor;
** with the amax, each CTA reduces its maximum in registers and shared memory and sends it out in
** one atomicMax per word. Atomics on one address are serialised at the L2 cache, so their number
** has to stay near the number of resident CTAs: one per warp over a 16M-element master is half a
** million per word, which costs more than the step's own memory traffic.
*/
#ifndef HQ_ADAM_CUDA_H
#define HQ_ADAM_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include <hq/adamw.h>
#include <hq/numerics.h>
#include <hq/plugin.h>

#include "amax_cuda.h"
#include "launch_cuda.h"

constexpr int kHqAdamThreads = 256;

/* Four gradient elements from index i (a multiple of 4; g aligned for the vector load), as
   FP32 exactly as hq_load_hp converts them (the CPU step's values, NaN bits included). */
template <int DT>
__device__ __forceinline__ void hq_adam_load_g4(const void *g, int64_t i, float out[4]) {
  if (DT == HQ_F32) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(static_cast<const float *>(g) + i));
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  } else {
    const uint2 w = __ldg(reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(g) + i));
    const uint16_t h[4] = {(uint16_t)(w.x & 0xffffu), (uint16_t)(w.x >> 16),
                           (uint16_t)(w.y & 0xffffu), (uint16_t)(w.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; e++) out[e] = DT == HQ_F16 ? hq_f16_to_f32(h[e]) : hq_bf16_to_f32(h[e]);
  }
}

/* VEC: w, m, v 16-byte aligned and g aligned for 4 elements: the n / 4 groups of four by vector
   loads and stores, the last n % 4 elements by CTA 0. Otherwise element by element.
   AMAX: also the NaN-ignoring max |w| of the updated masters (the write-back's per-tensor amax,
   in the same pass). */
template <int DT, bool VEC, bool AMAX>
__global__ void __launch_bounds__(kHqAdamThreads)
    hq_adam_kernel(hq_adam_consts k, const hq_adam_consts *__restrict__ kd,
                   const void *__restrict__ g, float *__restrict__ w, float *__restrict__ m,
                   float *__restrict__ v, int64_t n, unsigned int *__restrict__ amax_bits) {
  if (kd) k = *kd; /* a graph's replay: this step's constants, written after the capture */
  uint32_t mx = 0;
  const int64_t stride = (int64_t)gridDim.x * kHqAdamThreads;
  const int64_t first = blockIdx.x * (int64_t)kHqAdamThreads + threadIdx.x;
  if (VEC) {
    const int64_t n4 = n / 4;
    for (int64_t q = first; q < n4; q += stride) {
      const int64_t i = 4 * q;
      float gg[4];
      hq_adam_load_g4<DT>(g, i, gg);
      float4 w4 = *reinterpret_cast<const float4 *>(w + i);
      float4 m4 = *reinterpret_cast<const float4 *>(m + i);
      float4 v4 = *reinterpret_cast<const float4 *>(v + i);
      float wv[4] = {w4.x, w4.y, w4.z, w4.w}, mv[4] = {m4.x, m4.y, m4.z, m4.w},
            vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        hq_adam_elem(&k, gg[e], &wv[e], &mv[e], &vv[e]);
        if (AMAX) {
          const uint32_t b = hq_abs_bits_nonan(wv[e]);
          mx = b > mx ? b : mx;
        }
      }
      *reinterpret_cast<float4 *>(w + i) = make_float4(wv[0], wv[1], wv[2], wv[3]);
      *reinterpret_cast<float4 *>(m + i) = make_float4(mv[0], mv[1], mv[2], mv[3]);
      *reinterpret_cast<float4 *>(v + i) = make_float4(vv[0], vv[1], vv[2], vv[3]);
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
      const float wi = hq_adam_at(&k, g, DT, w, m, v, 4 * n4 + threadIdx.x);
      if (AMAX) {
        const uint32_t b = hq_abs_bits_nonan(wi);
        mx = b > mx ? b : mx;
      }
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      const float wi = hq_adam_at(&k, g, DT, w, m, v, i);
      if (AMAX) {
        const uint32_t b = hq_abs_bits_nonan(wi);
        mx = b > mx ? b : mx;
      }
    }
  }
  if (AMAX)
    hq_cuda_cta_atomic_max(mx, reinterpret_cast<float *>(amax_bits),
                           reinterpret_cast<float *>(amax_bits + 1));
}

/* One launch of the kernel chosen by VEC and AMAX over as many CTAs as the device holds at once
   (fewer when the tensor has less work than that). */
template <int DT, bool VEC, bool AMAX>
inline cudaError_t hq_adam_launch(cudaStream_t s, const hq_adam_consts &k,
                                  const hq_adam_consts *kd, const void *g, float *w, float *m,
                                  float *v, int64_t n, unsigned int *amax_bits) {
  int64_t resident = 0;
  cudaError_t e = hq_cuda_resident<hq_adam_kernel<DT, VEC, AMAX>>(kHqAdamThreads, 0, &resident);
  if (e != cudaSuccess) return e;
  const int64_t items = VEC ? n / 4 : n;
  int64_t blocks = (items + kHqAdamThreads - 1) / kHqAdamThreads;
  if (blocks > resident) blocks = resident;
  if (blocks < 1) blocks = 1; /* a tail alone */
  hq_adam_kernel<DT, VEC, AMAX><<<(unsigned)blocks, kHqAdamThreads, 0, s>>>(k, kd, g, w, m, v,
                                                                            n, amax_bits);
  e = cudaGetLastError();
  if (e != cudaSuccess) hq_cuda_resident_forget<hq_adam_kernel<DT, VEC, AMAX>>();
  return e;
}

template <int DT>
inline cudaError_t hq_adam_launch_dt(cudaStream_t s, const hq_adam_consts &k,
                                     const hq_adam_consts *kd, const void *g, float *w, float *m,
                                     float *v, int64_t n, unsigned int *amax_bits) {
  const uintptr_t ga = DT == HQ_F32 ? 15u : 7u; /* a float4 or four 16-bit elements */
  const bool vec = !((uintptr_t)g & ga) && !(((uintptr_t)w | (uintptr_t)m | (uintptr_t)v) & 15u);
  if (vec)
    return amax_bits ? hq_adam_launch<DT, true, true>(s, k, kd, g, w, m, v, n, amax_bits)
                     : hq_adam_launch<DT, true, false>(s, k, kd, g, w, m, v, n, nullptr);
  return amax_bits ? hq_adam_launch<DT, false, true>(s, k, kd, g, w, m, v, n, amax_bits)
                   : hq_adam_launch<DT, false, false>(s, k, kd, g, w, m, v, n, nullptr);
}

static inline cudaError_t hq_cuda_adam_run(cudaStream_t s, const hq_adam_consts &k,
                                           const hq_adam_consts *kd, const void *g, int gdtype,
                                           float *w, float *m, float *v, int64_t n,
                                           unsigned int *amax_bits) {
  if (n <= 0) return cudaSuccess;
  if (gdtype == HQ_F32) return hq_adam_launch_dt<HQ_F32>(s, k, kd, g, w, m, v, n, amax_bits);
  if (gdtype == HQ_F16) return hq_adam_launch_dt<HQ_F16>(s, k, kd, g, w, m, v, n, amax_bits);
  return hq_adam_launch_dt<HQ_BF16>(s, k, kd, g, w, m, v, n, amax_bits);
}

static inline cudaError_t hq_cuda_adam(const hq_adam_pass *adam, float *w, int64_t n,
                                       cudaStream_t stream) {
  return hq_cuda_adam_run(stream, adam->k, hq_adam_pass_k_dev(adam), adam->grad,
                          (int)adam->grad_dtype, w, adam->m, adam->v, n, nullptr);
}

/* Whether a plugin's fused write-back of `ctas` CTAs fills one wave of the device's SMs at
   `per_sm` CTAs each. A fused kernel steps each thread's elements in sequence, so below that its
   time is those threads' latency while most SMs idle, and the caller splits the step off
   (hq_cuda_adam over every SM, then its plain quantize of the new master: the same bits). An
   unknown SM count answers true: the fused kernel is correct at any size. */
static inline bool hq_cuda_fused_adam_fills(int device, int64_t ctas, int per_sm) {
  const int sms = hq_cuda_device_sms(device);
  return sms <= 0 || ctas >= (int64_t)sms * per_sm;
}

#endif /* HQ_ADAM_CUDA_H */
