/*
** small_gemm_cuda.h -- the epilogue of the stock modules' small GEMM kernels (nvfp4's and
** fp8_block's): D's square tile from the accumulators a CTA left in shared memory. Private to
** the stock plugins (not installed); device code only.
**
** hq_small_gemm_store<DT, TILE, THREADS>(cs, ld, i0, j0, m, n, d, alpha, beta, bias, bias_dtype,
** factor): D row-major [n, m] (D[j * m + i], i over A's rows, j over B's) in DT (HQ_F32 or
** HQ_BF16) gets factor(alpha * cs[jj * ld + ii], i, j) + beta * D + bias[i] for the tile's
** elements inside m x n, each rounded once by hq_store_hp's rule. Where every row of D starts
** at a multiple of 4 elements (m % 4 == 0, D 16-byte aligned in F32, 8 in BF16), a thread takes
** 4 consecutive elements of a row with one load of cs and one store of D: a small GEMM's call
** is bound by its instruction count, and the scalar loop spent most of its epilogue's on
** per-element indices. Otherwise each element alone, any m and alignment.
*/
#ifndef HQ_SMALL_GEMM_CUDA_H
#define HQ_SMALL_GEMM_CUDA_H

#include <stdint.h>

#include "hq/numerics.h"

/* One element's value before D's rounding. */
template <typename F>
__device__ __forceinline__ float hq_small_gemm_out(float acc, float alpha, float beta, float d,
                                                   const void *bias, int bias_dtype, int64_t i,
                                                   int64_t j, const F &factor) {
  float o = factor(alpha * acc, i, j);
  if (beta != 0.0f) o = o + beta * d;
  if (bias) o = o + hq_load_hp(bias, i, bias_dtype);
  return o;
}

/* cs: ld floats per row of B (ld % 4 == 0, cs 16-byte aligned); i0, j0: the tile's first row of
   A and of B; factor(o, i, j): a per-row or per-column factor of the format (the identity for
   none), applied to alpha times the accumulator. Called by every thread of the CTA after the
   barrier that publishes cs. */
template <int DT, int TILE, int THREADS, typename F>
__device__ __forceinline__ void hq_small_gemm_store(const float *cs, int ld, int64_t i0,
                                                    int64_t j0, int64_t m, int64_t n, void *d,
                                                    float alpha, float beta, const void *bias,
                                                    int bias_dtype, const F &factor) {
  static_assert(DT == HQ_F32 || DT == HQ_BF16, "D is F32 or BF16");
  static_assert(TILE % 4 == 0, "a row of the tile is whole groups of 4");
  constexpr int kGroups = TILE / 4;
  const uintptr_t align = DT == HQ_F32 ? 15 : 7;
  if (m % 4 == 0 && ((uintptr_t)d & align) == 0) {
    /* consecutive threads on consecutive groups of a row of D (its contiguous index) */
#pragma unroll 1
    for (int e = threadIdx.x; e < TILE * kGroups; e += THREADS) {
      const int ii = 4 * (e % kGroups), jj = e / kGroups;
      const int64_t i = i0 + ii, j = j0 + jj;
      if (i >= m || j >= n) continue; /* m % 4 == 0: the group is in or out whole */
      const int64_t at = j * m + i;
      const float4 c = *reinterpret_cast<const float4 *>(cs + jj * ld + ii);
      float dv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (beta != 0.0f) {
        if (DT == HQ_F32) {
          const float4 v = *reinterpret_cast<const float4 *>((const float *)d + at);
          dv[0] = v.x, dv[1] = v.y, dv[2] = v.z, dv[3] = v.w;
        } else {
          const uint2 v = *reinterpret_cast<const uint2 *>((const uint16_t *)d + at);
          dv[0] = hq_bf16_to_f32((uint16_t)v.x), dv[1] = hq_bf16_to_f32((uint16_t)(v.x >> 16));
          dv[2] = hq_bf16_to_f32((uint16_t)v.y), dv[3] = hq_bf16_to_f32((uint16_t)(v.y >> 16));
        }
      }
      const float cv[4] = {c.x, c.y, c.z, c.w};
      float o[4];
#pragma unroll
      for (int q = 0; q < 4; q++)
        o[q] = hq_small_gemm_out(cv[q], alpha, beta, dv[q], bias, bias_dtype, i + q, j, factor);
      if (DT == HQ_F32)
        *reinterpret_cast<float4 *>((float *)d + at) = make_float4(o[0], o[1], o[2], o[3]);
      else
        *reinterpret_cast<uint2 *>((uint16_t *)d + at) =
            make_uint2(hq_pack2_hp16(o[0], o[1], DT), hq_pack2_hp16(o[2], o[3], DT));
    }
    return;
  }
  /* consecutive threads on consecutive elements of a row of D */
#pragma unroll 1
  for (int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
    const int ii = e % TILE, jj = e / TILE;
    const int64_t i = i0 + ii, j = j0 + jj;
    if (i >= m || j >= n) continue;
    const int64_t at = j * m + i;
    const float dv = beta != 0.0f ? hq_load_hp(d, at, DT) : 0.0f;
    hq_store_hp(d, at, DT,
                hq_small_gemm_out(cs[jj * ld + ii], alpha, beta, dv, bias, bias_dtype, i, j,
                                  factor));
  }
}

#endif /* HQ_SMALL_GEMM_CUDA_H */
