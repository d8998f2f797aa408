/*
** hq/numerics.h -- element and scale conversions shared by the CPU reference and the CUDA kernels.
**
** Every rounding rule of every format lives here, once, as plain integer/IEEE-FP32 code that
** compiles both as C (host) and as CUDA (host + device). CPU and GPU therefore agree bit for bit
** by construction. Rules (../shared/FORMATS.md, TE numerics):
**   - FP8 casts are round-to-nearest-even with saturation to the finite range (satfinite):
**     |x| > max and +-Inf become +-max, NaN becomes NaN (0x7F).
**   - A scaling multiply is one FP32 multiply rounded to nearest, done before the cast.
**   - Division and reciprocal are IEEE RN FP32 (no fast math; build with -ffp-contract=off).
** Everything is `static inline`; nothing here allocates or has side effects.
*/
#ifndef HQ_NUMERICS_H
#define HQ_NUMERICS_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define HQ_HD __host__ __device__ __forceinline__
#else
#define HQ_HD static inline
#endif

/* --------------------------------------------------------------------------------------------
** Bit casts and RN arithmetic
*/
HQ_HD uint32_t hq_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

HQ_HD float hq_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/* One FP32 multiply / divide / add, rounded to nearest even, never contracted into an FMA. */
HQ_HD float hq_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

HQ_HD float hq_div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

HQ_HD float hq_add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/* Correctly rounded FP32 reciprocal (TE: __frcp_rn). */
HQ_HD float hq_rcp_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(x);
#else
  return 1.0f / x;
#endif
}

HQ_HD int hq_isnan(float x) { return (hq_f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }
HQ_HD int hq_isinf(float x) { return (hq_f32_bits(x) & 0x7fffffffu) == 0x7f800000u; }
HQ_HD float hq_fabs(float x) { return hq_bits_f32(hq_f32_bits(x) & 0x7fffffffu); }

/* max that ignores NaN operands (fmaxf semantics): NaN never enters an amax. */
HQ_HD float hq_fmax_nan_ignoring(float a, float b) {
  if (hq_isnan(b)) return a;
  if (hq_isnan(a)) return b;
  return a > b ? a : b;
}

/* --------------------------------------------------------------------------------------------
** BF16 / FP16 <-> FP32
*/
HQ_HD float hq_bf16_to_f32(uint16_t h) { return hq_bits_f32((uint32_t)h << 16); }

/* RNE; NaN stays a quiet NaN with its sign. */
HQ_HD uint16_t hq_f32_to_bf16(float x) {
  uint32_t u = hq_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

HQ_HD float hq_f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return hq_bits_f32(s | 0x7f800000u | (m << 13));   /* Inf / NaN */
  if (e == 0) {                                                     /* zero / subnormal */
    float v = hq_mul_rn((float)m, 5.9604644775390625e-08f);          /* m * 2^-24, exact */
    return s ? -v : v;
  }
  return hq_bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

/* RNE with overflow to Inf (IEEE conversion); NaN stays a quiet NaN. */
HQ_HD uint16_t hq_f32_to_f16(float x) {
  uint32_t u = hq_f32_bits(x);
  uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);             /* >= 65520: rounds to Inf */
  if (a < 0x38800000u) {                                           /* below 2^-14: subnormal */
    /* count 2^-24 steps: a * 2^24 is exact; round to nearest even integer */
    float q = hq_mul_rn(hq_bits_f32(a), 16777216.0f);
    float r = hq_add_rn(hq_add_rn(q, 8388608.0f), -8388608.0f);
    return (uint16_t)(s | (uint16_t)r);
  }
  a += 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(s | ((a - 0x38000000u) >> 13));
}

/* --------------------------------------------------------------------------------------------
** FP8 E4M3 / E5M2 (OCP). Encode: RNE, satfinite, NaN -> 0x7F. Decode: exact.
*/
#define HQ_E4M3_MAX 448.0f
#define HQ_E5M2_MAX 57344.0f
#define HQ_FP8_NAN 0x7Fu

/* Round |x| (FP32 bits `a`, not NaN, not above max) to a format with `mbits` mantissa bits and
   exponent bias `bias`; returns the magnitude code. Normal numbers round their mantissa with an
   integer RNE; values below the smallest normal count subnormal steps 2^(1-bias-mbits) with an
   exact power-of-two scale and an RNE integer rounding (the 2^23 trick). A subnormal that rounds
   up to the smallest normal yields exactly its code, by construction of the encoding. */
HQ_HD uint32_t hq_round_minifloat(uint32_t a, int mbits, int bias) {
  int e = (int)(a >> 23) - 127;
  if (e < 1 - bias) {
    /* a * 2^(bias - 1 + mbits): an exact power-of-two scaling into [0, 2^mbits] */
    float q = hq_mul_rn(hq_bits_f32(a), hq_bits_f32((uint32_t)(127 + bias - 1 + mbits) << 23));
    float r = hq_add_rn(hq_add_rn(q, 8388608.0f), -8388608.0f);
    return (uint32_t)r;
  }
  uint32_t shift = 23u - (uint32_t)mbits;
  uint32_t r = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
  return (r >> shift) - ((uint32_t)(127 - bias) << mbits);
}

HQ_HD uint8_t hq_f32_to_e4m3(float x) {
  uint32_t u = hq_f32_bits(x);
  uint32_t s = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)HQ_FP8_NAN;
  if (a > 0x43e00000u) return (uint8_t)(s | 0x7eu);                /* |x| > 448 (Inf too) */
  return (uint8_t)(s | hq_round_minifloat(a, 3, 7));
}

HQ_HD uint8_t hq_f32_to_e5m2(float x) {
  uint32_t u = hq_f32_bits(x);
  uint32_t s = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)HQ_FP8_NAN;
  if (a > 0x47600000u) return (uint8_t)(s | 0x7bu);                /* |x| > 57344 (Inf too) */
  return (uint8_t)(s | hq_round_minifloat(a, 2, 15));
}

HQ_HD float hq_e4m3_to_f32(uint8_t q) {
  uint32_t s = (uint32_t)(q & 0x80u) << 24;
  uint32_t e = (q >> 3) & 0xfu, m = q & 0x7u;
  if (e == 0xfu && m == 0x7u) return hq_bits_f32(s | 0x7fc00000u);
  if (e == 0) {
    float v = hq_mul_rn((float)m, 0.001953125f);                    /* m * 2^-9 */
    return s ? -v : v;
  }
  return hq_bits_f32(s | ((e + 120u) << 23) | (m << 20));
}

HQ_HD float hq_e5m2_to_f32(uint8_t q) {
  uint32_t s = (uint32_t)(q & 0x80u) << 24;
  uint32_t e = (q >> 2) & 0x1fu, m = q & 0x3u;
  if (e == 0x1fu) return hq_bits_f32(s | 0x7f800000u | (m << 21));  /* Inf / NaN */
  if (e == 0) {
    float v = hq_mul_rn((float)m, 1.52587890625e-05f);              /* m * 2^-16 */
    return s ? -v : v;
  }
  return hq_bits_f32(s | ((e + 112u) << 23) | (m << 21));
}

/* Element type selector shared by the FP8 formats. */
typedef enum hq_fp8_kind { HQ_FP8_E4M3 = 0, HQ_FP8_E5M2 = 1 } hq_fp8_kind;

HQ_HD float hq_fp8_max(int kind) { return kind == HQ_FP8_E5M2 ? HQ_E5M2_MAX : HQ_E4M3_MAX; }
HQ_HD uint8_t hq_f32_to_fp8(float x, int kind) {
  return kind == HQ_FP8_E5M2 ? hq_f32_to_e5m2(x) : hq_f32_to_e4m3(x);
}
HQ_HD float hq_fp8_to_f32(uint8_t q, int kind) {
  return kind == HQ_FP8_E5M2 ? hq_e5m2_to_f32(q) : hq_e4m3_to_f32(q);
}

/* --------------------------------------------------------------------------------------------
** Per-tensor / per-block FP32 scale from an amax (TE compute_scale_from_amax, FORMATS.md 1.4):
**   amax < eps -> eps; amax Inf/NaN/0 -> 1; scale = RN(max_fp8 / amax); Inf -> value_for_inf;
**   pow2: clear the mantissa (rounds the scale down to a power of two).
*/
HQ_HD float hq_scale_from_amax(float amax, float max_fp8, int pow2, float epsilon,
                               float value_for_inf) {
  if (amax < epsilon) amax = epsilon;
  if (hq_isinf(amax) || hq_isnan(amax) || amax == 0.0f) return 1.0f;
  float scale = hq_div_rn(max_fp8, amax);
  if (hq_isinf(scale)) scale = value_for_inf;
  if (pow2) scale = hq_bits_f32(hq_f32_bits(scale) & 0xff800000u);
  return scale;
}

/* Quantize one element: q = fp8(RN(x * scale)). */
HQ_HD uint8_t hq_fp8_quantize(float x, float scale, int kind) {
  return hq_f32_to_fp8(hq_mul_rn(x, scale), kind);
}

/* The one NaN hq writes: arithmetic on NaN keeps the payload on x86 but canonicalizes it on a
   GPU, so every result that may be NaN is produced from this constant instead. */
#define HQ_F32_NAN_BITS 0x7fc00000u

/* Dequantize one element: x = RN(fp32(q) * scale_inv); a NaN code gives HQ_F32_NAN_BITS. */
HQ_HD float hq_fp8_dequantize(uint8_t q, float scale_inv, int kind) {
  float v = hq_fp8_to_f32(q, kind);
  if (hq_isnan(v)) return hq_bits_f32(HQ_F32_NAN_BITS);
  return hq_mul_rn(v, scale_inv);
}

/* --------------------------------------------------------------------------------------------
** Reading and writing high-precision elements by dtype code (HQ_F32 = 1, HQ_F16 = 2,
** HQ_BF16 = 3, as in hq/plugin.h).
*/
HQ_HD float hq_load_hp(const void *p, int64_t i, int dtype) {
  if (dtype == 1) return ((const float *)p)[i];
  if (dtype == 2) return hq_f16_to_f32(((const uint16_t *)p)[i]);
  return hq_bf16_to_f32(((const uint16_t *)p)[i]);
}

HQ_HD void hq_store_hp(void *p, int64_t i, int dtype, float v) {
  if (dtype == 1) ((float *)p)[i] = v;
  else if (dtype == 2) ((uint16_t *)p)[i] = hq_f32_to_f16(v);
  else ((uint16_t *)p)[i] = hq_f32_to_bf16(v);
}

/* Largest finite value of a high-precision dtype (FP8-block's value_for_inf). */
HQ_HD float hq_hp_max(int dtype) {
  if (dtype == 2) return 65504.0f;
  if (dtype == 3) return hq_bits_f32(0x7f7f0000u);                 /* BF16 max 0x1.FEp127 */
  return FLT_MAX;
}

/* --------------------------------------------------------------------------------------------
** MXFP8: E8M0 scales (FORMATS.md 2.2)                         [filled by the mxfp8 plugin work]
*/

/* --------------------------------------------------------------------------------------------
** NVFP4: E2M1 elements, E4M3 block scales, global scale, RHT, stochastic rounding (FORMATS.md 3)
**                                                             [filled by the nvfp4 plugin work]
*/

/* --------------------------------------------------------------------------------------------
** FP8 block scaling (FORMATS.md 4)                        [filled by the fp8_block plugin work]
*/

#endif /* HQ_NUMERICS_H */
