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
**
** Blocks are 1x128 / 128x1 (1-D) or 128x128 (2-D) over the logical [M, K]; partial blocks at the
** bottom/right edges cover only their in-bounds elements. Per block:
**   amax  = max |x| in FP32, NaN elements ignored (Inf counts);
**   scale = hq_scale_from_amax(amax, max_fp8, pow2, epsilon, value_for_inf = max of the INPUT
**           dtype: BF16 0x1.FEp127, FP16 65504, FP32 FLT_MAX) -- pow2 turns the BF16/FP32
**           fallback into 2^127;
**   scale_inv = RN(1/scale) (TE's 1-D kernel divides in double and rounds to FP32, its 2-D kernel
**           divides in FP32: both are the correctly rounded reciprocal, since a double quotient of
**           FP32 operands rounds innocuously to FP32);
**   q = RNE_satfinite(RN(x * scale)), x ~ q * scale_inv.
**
** GEMM-ready FP32 scale_inv layouts (FORMATS.md 4.3). Each function maps a logical element
** (m, k) of [M, K] to the index of its block's scale_inv in that buffer; padding is only ever in
** dim 1, up to a multiple of 4 floats (16 bytes), and holds zeros in hq's buffers.
**   rowwise    1-D  [ceil(K/128), r4(M)]           entry [k/128][m]    (M contiguous)
**   rowwise    2-D  [ceil(M/128), r4(ceil(K/128))] entry [m/128][k/128]
**   columnwise 1-D  [ceil(M/128), r4(K)]           entry [m/128][k]
**   columnwise 2-D  [ceil(K/128), r4(ceil(M/128))] entry [k/128][m/128]
** (the columnwise data itself is [K, M]: element (m, k) at k*M + m.)
*/
#define HQ_FP8B_BLOCK 128

/* ceil(n / 128): blocks covering n elements. */
HQ_HD int64_t hq_fp8b_nblocks(int64_t n) { return (n + HQ_FP8B_BLOCK - 1) / HQ_FP8B_BLOCK; }
/* n rounded up to a multiple of 4 (the scale buffers' padded dim 1). */
HQ_HD int64_t hq_fp8b_pad4(int64_t n) { return (n + 3) & ~(int64_t)3; }

/* scale_inv shape [d0, d1] of one direction (colwise 0/1, two_d 0/1) of a [M, K] tensor, and the
   unpadded extent n1 <= d1 of dim 1 (entries [.][n1, d1) are padding). */
HQ_HD void hq_fp8b_scale_shape(int64_t M, int64_t K, int colwise, int two_d, int64_t *d0,
                               int64_t *d1, int64_t *n1) {
  /* FORMATS.md 4.3's uniform rule on the copy as the GEMM reads it, [outer, inner]: 1-D is
     [inner blocks, r4(outer)], 2-D is [outer blocks, r4(inner blocks)]. */
  int64_t outer = colwise ? K : M, inner = colwise ? M : K;
  *d0 = two_d ? hq_fp8b_nblocks(outer) : hq_fp8b_nblocks(inner);
  *n1 = two_d ? hq_fp8b_nblocks(inner) : outer;
  *d1 = hq_fp8b_pad4(*n1);
}

/* rowwise 1-D: [ceil(K/128), r4(M)], entry [k/128][m]. */
HQ_HD int64_t hq_fp8b_row1d_index(int64_t m, int64_t k, int64_t M) {
  return (k / HQ_FP8B_BLOCK) * hq_fp8b_pad4(M) + m;
}
/* rowwise 2-D: [ceil(M/128), r4(ceil(K/128))], entry [m/128][k/128]. */
HQ_HD int64_t hq_fp8b_row2d_index(int64_t m, int64_t k, int64_t K) {
  return (m / HQ_FP8B_BLOCK) * hq_fp8b_pad4(hq_fp8b_nblocks(K)) + k / HQ_FP8B_BLOCK;
}
/* columnwise 1-D: [ceil(M/128), r4(K)], entry [m/128][k]. */
HQ_HD int64_t hq_fp8b_col1d_index(int64_t m, int64_t k, int64_t K) {
  return (m / HQ_FP8B_BLOCK) * hq_fp8b_pad4(K) + k;
}
/* columnwise 2-D: [ceil(K/128), r4(ceil(M/128))], entry [k/128][m/128]. */
HQ_HD int64_t hq_fp8b_col2d_index(int64_t m, int64_t k, int64_t M) {
  return (k / HQ_FP8B_BLOCK) * hq_fp8b_pad4(hq_fp8b_nblocks(M)) + m / HQ_FP8B_BLOCK;
}
/* The one of the four above that a direction uses. */
HQ_HD int64_t hq_fp8b_scale_index(int64_t m, int64_t k, int64_t M, int64_t K, int colwise,
                                  int two_d) {
  if (two_d) return colwise ? hq_fp8b_col2d_index(m, k, M) : hq_fp8b_row2d_index(m, k, K);
  return colwise ? hq_fp8b_col1d_index(m, k, K) : hq_fp8b_row1d_index(m, k, M);
}

/* Block amax as integer bits: |x|'s FP32 bits, or 0 for NaN. For non-NaN magnitudes the bit
   order is the numeric order, so the max of these over a block is the bits of its NaN-ignoring
   amax (hq_fmax_nan_ignoring over hq_fabs), Inf included; a branch-free, vectorisable form. */
HQ_HD uint32_t hq_fp8b_abs_bits(float x) {
  uint32_t a = hq_f32_bits(x) & 0x7fffffffu;
  return a > 0x7f800000u ? 0u : a;
}

/* The block scale of FORMATS.md 4.2: value_for_inf is the max of the input dtype `src_dtype`
   (HQ_F32 / HQ_F16 / HQ_BF16), max_fp8 that of the element kind (HQ_FP8_E4M3 / HQ_FP8_E5M2). */
HQ_HD float hq_fp8b_scale(float amax, int kind, int pow2, float epsilon, int src_dtype) {
  return hq_scale_from_amax(amax, hq_fp8_max(kind), pow2, epsilon, hq_hp_max(src_dtype));
}

#endif /* HQ_NUMERICS_H */
