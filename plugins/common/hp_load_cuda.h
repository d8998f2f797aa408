/*
** hp_load_cuda.h -- reading a high-precision input in the stock plugins' kernels. Private to the
** stock plugins (not installed); device code only.
**
** hq_cuda_load8<DT>(x, i, v): the 8 consecutive elements of x (dtype DT: HQ_F32, HQ_F16,
** HQ_BF16) starting at element index i, as FP32 (exact). With vec, one 16-byte load (bf16/f16) or
** two (f32) through the read-only cache: i must be a multiple of 8 and x 16-byte aligned.
** Without, element loads (any alignment). hq_cuda_hp16_to_f32<DT>(h): one 16-bit element's
** bits as FP32 (the conversion every 16-bit read of the stock kernels uses; an F16 NaN comes out
** as some NaN, whose bits no output of theirs depends on).
**
** hq_cuda_absmax2<DT>(a, b), hq_cuda_absmax_tree<DT, N>(w), hq_cuda_lane_amax<DT>(m, hi),
** hq_cuda_words_amax<DT, N>(w): the amax of 16-bit elements from their packed words, two per
** instruction, NaN ignored as the stock plugins' amax rule wants (or propagated, NANP, and read
** by hq_cuda_lane_abs, to find the blocks that hold a NaN).
**
** hq_cuda_row_col<SMALL>(e, K, &i, &j): row i and column j of flat element index e in a
** row-major tensor of K columns; SMALL (every index below 2^32) divides in 32 bits, which costs
** far less than a 64-bit division in a kernel whose per-element work is a few instructions.
*/
#ifndef HQ_HP_LOAD_CUDA_H
#define HQ_HP_LOAD_CUDA_H

#include "hq/numerics.h"

/* One 16-bit element's bits h (DT: HQ_F16 or HQ_BF16) as FP32, exact; an F16 NaN as some NaN
   (hq_f16_to_f32_anynan: one convert instruction; no output of the stock formats depends on a
   NaN's bits). */
template <int DT> __device__ __forceinline__ float hq_cuda_hp16_to_f32(uint32_t h) {
  return DT == HQ_F16 ? hq_f16_to_f32_anynan((uint16_t)h) : hq_bf16_to_f32((uint16_t)h);
}

/* max(|a|, |b|) of each 16-bit lane of two words of DT (HQ_BF16 or HQ_F16), two elements per
   instruction (PTX max.xorsign.abs): a NaN operand is ignored as by fmaxf (IEEE maxNum; NaN only
   where both are), or with NANP propagated (max.NaN: NaN where either is); the lanes' sign bits
   are meaningless (hq_cuda_lane_amax clears them). */
template <int DT, bool NANP = false>
__device__ __forceinline__ uint32_t hq_cuda_absmax2(uint32_t a, uint32_t b) {
  uint32_t d;
  if (NANP && DT == HQ_BF16)
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else if (NANP)
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else if (DT == HQ_BF16)
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else
    asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

/* hq_cuda_absmax2<DT, NANP> over N words (N a power of 2) as a tree: log2(N) dependent steps,
   not N - 1. */
template <int DT, int N, bool NANP = false>
__device__ __forceinline__ uint32_t hq_cuda_absmax_tree(const uint32_t w[N]) {
  uint32_t m[N / 2];
#pragma unroll
  for (int e = 0; e < N / 2; e++) m[e] = hq_cuda_absmax2<DT, NANP>(w[2 * e], w[2 * e + 1]);
#pragma unroll
  for (int n = N / 4; n >= 1; n /= 2)
#pragma unroll
    for (int e = 0; e < n; e++) m[e] = hq_cuda_absmax2<DT, NANP>(m[2 * e], m[2 * e + 1]);
  return m[0];
}

/* |lane hi| (0: the low half) of a packed pair as FP32, a NaN kept (NaN-propagating chains). */
template <int DT> __device__ __forceinline__ float hq_cuda_lane_abs(uint32_t m, int hi) {
  return hq_cuda_hp16_to_f32<DT>((hi ? m >> 16 : m) & 0x7fffu);
}

/* Lane hi (0: the low half) of a chain of hq_cuda_absmax2 as FP32: max |x| over the elements
   behind it with NaN ignored, 0 when all of them are NaN -- the value of a chain of fmaxf(m,
   fabsf(x)) started at 0 over the same elements (the stock plugins' amax rule). */
template <int DT> __device__ __forceinline__ float hq_cuda_lane_amax(uint32_t m, int hi) {
  return fmaxf(0.0f, hq_cuda_lane_abs<DT>(m, hi));
}

/* That amax over both halves of N words (N a power of 2): hq_cuda_absmax_tree, then its lanes. */
template <int DT, int N> __device__ __forceinline__ float hq_cuda_words_amax(const uint32_t w[N]) {
  const uint32_t m = hq_cuda_absmax_tree<DT, N>(w);
  return fmaxf(hq_cuda_lane_amax<DT>(m, 0), hq_cuda_lane_amax<DT>(m, 1));
}

template <int DT>
__device__ __forceinline__ void hq_cuda_load8(const void *__restrict__ x, int64_t i, bool vec,
                                              float v[8]) {
  if (!vec) {
    for (int k = 0; k < 8; k++) v[k] = hq_load_hp(x, i + k, DT);
  } else if (DT == HQ_F32) {
    const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(x) + i);
    float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
    uint4 w = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(x) + i));
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    for (int k = 0; k < 4; k++) {
      v[2 * k] = hq_cuda_hp16_to_f32<DT>(u[k] & 0xffffu);
      v[2 * k + 1] = hq_cuda_hp16_to_f32<DT>(u[k] >> 16);
    }
  }
}

template <bool SMALL>
__device__ __forceinline__ void hq_cuda_row_col(int64_t e, int64_t K, int64_t *i, int64_t *j) {
  if (SMALL) {
    const uint32_t u = (uint32_t)e, k32 = (uint32_t)K, r = u / k32;
    *i = r;
    *j = u - r * k32;
  } else {
    *i = e / K;
    *j = e - *i * K;
  }
}

#endif /* HQ_HP_LOAD_CUDA_H */
