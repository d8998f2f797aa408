/*
** mx_cvt_cuda.h -- the conversions Blackwell has as single instructions and Hopper does not:
** FP32 pairs to FP4 E2M1 (nvfp4's elements) and FP32 to E8M0 rounded up (mxfp8's block scales).
** Private to the stock plugins (not installed); device code only.
**
** The instructions exist on the family-specific targets of Blackwell and later (nvcc's
** sm_100f / sm_100a and their kin: __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000; the build's default
** gencode has sm_100f when nvcc knows it, m4/hq_cuda.m4). Every function below returns exactly
** the bits of the hq/numerics.h rule named beside it, which the CPU reference runs; elsewhere
** (sm_90, generic sm_100, or -DHQ_MX_SW_CVT) each is that rule itself.
**
** - cvt.rn.satfinite.e2m1x2.f32: round to nearest even, finite values beyond 6 and +-Inf
**   saturate to +-6, the sign kept on values that round to zero (code 0x8 for them and -0):
**   hq_f32_to_e2m1. The kernels give it only finite values below 7 in magnitude (nvfp4's fast
**   form: a block holding a NaN or an Inf, or one whose amax times its multiplier reaches 7,
**   takes the rule itself), so no NaN convention is relied on.
** - cvt.rp.satfinite.ue8m0x2.f32: round toward +Inf onto the powers of two 2^-127 .. 2^127,
**   FP32 subnormals kept (no .ftz), +Inf saturating to 0xFE, NaN to 0xFF:
**   hq_e8m0_from_f32_rp.
**
** HQ_MX_CVT_PAIRS says whether the nvfp4 kernels encode their round-to-nearest blocks through
** hq_cuda_f32x8_to_e2m1 (the instruction's form: a product per element, a convert per pair) or
** through the two-sum form of numerics.h (hq_e2m1_biased_bits_lt7, Hopper's fastest). It is 1
** where the instruction exists; -DHQ_MX_CVT_PAIRS=1 selects the pair form on any chip with the
** software rule in place of the instruction, so that a Hopper run of the GPU tests checks
** everything of that form but the instruction itself (scripts/gpu-check.sh --mx-pairs).
** Stochastic rounding keeps its fast form everywhere: Blackwell's cvt.rs draws on the random
** bits in its own way, not as hq's rule (hq_f32_to_e2m1_sr: one random byte per element, u =
** r8 / 256 of a step) does.
*/
#ifndef HQ_MX_CVT_CUDA_H
#define HQ_MX_CVT_CUDA_H

#include <stdint.h>

#include "hq/numerics.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && !defined(HQ_MX_SW_CVT)
#define HQ_MX_HW_CVT 1
#else
#define HQ_MX_HW_CVT 0
#endif

#ifndef HQ_MX_CVT_PAIRS
#define HQ_MX_CVT_PAIRS HQ_MX_HW_CVT
#endif

/* Eight FP32 values to E2M1 codes, element k in nibble k of the word: hq_f32_to_e2m1 of each. */
__device__ __forceinline__ uint32_t hq_cuda_f32x8_to_e2m1(const float x[8]) {
#if HQ_MX_HW_CVT
  uint32_t w;
  asm("{\n.reg .b8 b0, b1, b2, b3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b2, %6, %5;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b3, %8, %7;\n"
      "mov.b32 %0, {b0, b1, b2, b3};\n}"
      : "=r"(w)
      : "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]), "f"(x[4]), "f"(x[5]), "f"(x[6]), "f"(x[7]));
  return w;
#else
  uint32_t w = 0u;
#pragma unroll
  for (int k = 0; k < 8; k++) w |= hq_f32_to_e2m1(x[k]) << (4 * k);
  return w;
#endif
}

/* A non-negative FP32 value to its E8M0 code rounded toward +Inf: hq_e8m0_from_f32_rp. */
__device__ __forceinline__ uint8_t hq_cuda_e8m0_rp(float t) {
#if HQ_MX_HW_CVT
  unsigned short r;
  asm("cvt.rp.satfinite.ue8m0x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(t));
  return (uint8_t)(r & 0xffu);
#else
  return hq_e8m0_from_f32_rp(t);
#endif
}

#endif /* HQ_MX_CVT_CUDA_H */
