/*
** fp8_cvt_cuda.h -- the FP8 element cast on the GPU, for the stock FP8 formats' kernels.
** Private to the stock plugins (not installed); device code only.
**
** hq_cuda_f32_to_fp8<ELEM>(v) returns exactly hq_f32_to_e4m3(v) / hq_f32_to_e5m2(v) of
** hq/numerics.h (the CPU reference's encoder). On chips with an FP8 convert instruction (sm_89
** and later: Hopper, Blackwell) it is cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32: round to nearest
** even, finite values and +-Inf beyond the range saturate to +-max, FP32 subnormals round like
** any other value (no flush: nvcc's default -ftz=false) -- the same rules as the integer encoder;
** a NaN, whose sign the instruction keeps, is forced to HQ_FP8_NAN (0x7F) as the encoder writes.
** Elsewhere, or when built with -DHQ_FP8_SW_CVT, it is the integer encoder itself. The GPU tests
** of every FP8 format compare the bytes with the CPU reference. Also here: the 8-element scaled
** cast every FP8 kernel makes (hq_cuda_cast8) and the 4x4 byte transpose of their register
** transposes (hq_cuda_transpose4x4).
*/
#ifndef HQ_FP8_CVT_CUDA_H
#define HQ_FP8_CVT_CUDA_H

#include "hq/numerics.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(HQ_FP8_SW_CVT)
#define HQ_FP8_HW_CVT 1
#else
#define HQ_FP8_HW_CVT 0
#endif

template <int ELEM> __device__ __forceinline__ uint8_t hq_cuda_f32_to_fp8(float v) {
#if HQ_FP8_HW_CVT
  unsigned short r;
  if (ELEM == HQ_E5M2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v));
  return hq_isnan(v) ? (uint8_t)HQ_FP8_NAN : (uint8_t)(r & 0xffu);
#else
  return ELEM == HQ_E5M2 ? hq_f32_to_e5m2(v) : hq_f32_to_e4m3(v);
#endif
}

/* Four casts packed into one word, byte k = RNE satfinite of x_k, NaN inputs left as the
   hardware writes them (sign kept, not HQ_FP8_NAN): the raw form, for callers whose values are
   never NaN (plugins/mx's FP6 casts); two convert instructions where the chip has them (their
   16-bit results joined into the word by the register pair move, no masks). */
template <int ELEM>
__device__ __forceinline__ uint32_t hq_cuda_f32x4_to_fp8_raw(float x0, float x1, float x2,
                                                            float x3) {
#if HQ_FP8_HW_CVT
  uint32_t w;
  if (ELEM == HQ_E5M2)
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(w) : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  else
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(w) : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return w;
#else
  return (uint32_t)hq_cuda_f32_to_fp8<ELEM>(x0) | (uint32_t)hq_cuda_f32_to_fp8<ELEM>(x1) << 8 |
         (uint32_t)hq_cuda_f32_to_fp8<ELEM>(x2) << 16 | (uint32_t)hq_cuda_f32_to_fp8<ELEM>(x3) << 24;
#endif
}

/* Four casts packed into one word, byte k = the cast of x_k: exactly the four bytes of
   hq_cuda_f32_to_fp8<ELEM>. The hardware keeps a NaN's sign; a byte is a NaN pattern
   (hq_fp8_code_special: with satfinite no finite or infinite input gives one) exactly when its
   input was NaN, and those bytes become HQ_FP8_NAN with no branch (hq_fp8_word_canon_nan: three
   integer instructions per word for E4M3; a branch to a byte loop would split the casts' code
   into blocks). */
template <int ELEM>
__device__ __forceinline__ uint32_t hq_cuda_f32x4_to_fp8(float x0, float x1, float x2, float x3) {
#if HQ_FP8_HW_CVT
  return hq_fp8_word_canon_nan(hq_cuda_f32x4_to_fp8_raw<ELEM>(x0, x1, x2, x3), ELEM);
#else
  return hq_cuda_f32x4_to_fp8_raw<ELEM>(x0, x1, x2, x3);
#endif
}

/* fp8(RN(x_k * scale_k)) of 8 elements (the CPU references' element cast: hq_fp8_quantize,
   hq_mxfp8_quantize, fp8_block's cast), four products per hq_cuda_f32x4_to_fp8. Byte k of .x /
   .y = element k / k + 4. hq_cuda_cast8 takes one scale for all 8. */
template <int ELEM>
__device__ __forceinline__ uint2 hq_cuda_cast8v(const float x[8], const float scale[8]) {
  float y[8];
#pragma unroll
  for (int k = 0; k < 8; k++) y[k] = hq_mul_rn(x[k], scale[k]);
  return make_uint2(hq_cuda_f32x4_to_fp8<ELEM>(y[0], y[1], y[2], y[3]),
                    hq_cuda_f32x4_to_fp8<ELEM>(y[4], y[5], y[6], y[7]));
}
template <int ELEM> __device__ __forceinline__ uint2 hq_cuda_cast8(const float x[8], float scale) {
  const float s[8] = {scale, scale, scale, scale, scale, scale, scale, scale};
  return hq_cuda_cast8v<ELEM>(x, s);
}

/* The 4x4 byte transpose of words a0..a3 (byte k of a_r = element (r, k)): out[k] holds byte k
   of every a_r, a_r's in its byte r. Eight byte permutes (the FP8 kernels' register
   transposes of 8x8 code blocks: four of these). */
__device__ __forceinline__ void hq_cuda_transpose4x4(uint32_t a0, uint32_t a1, uint32_t a2,
                                                     uint32_t a3, uint32_t out[4]) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

#endif /* HQ_FP8_CVT_CUDA_H */
