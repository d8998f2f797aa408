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

/* Branch-free select: c ? a : b for c in {0, 1}, as mask arithmetic a compiler can vectorize. */
HQ_HD uint32_t hq_sel(uint32_t c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - c;
  return (a & m) | (b & ~m);
}

/* |x| as FP32 bits, NaN counted as 0. For non-NaN magnitudes the bit order is the numeric order,
   so the integer max of these over a set is the bits of its NaN-ignoring amax (FORMATS.md 0.4;
   the hq_fmax_nan_ignoring chain started at 0), Inf included: the branch-free block amax. */
HQ_HD uint32_t hq_abs_bits_nonan(float x) {
  uint32_t a = hq_f32_bits(x) & 0x7fffffffu;
  return hq_sel(a > 0x7f800000u, 0u, a);
}

/* x rounded up to a multiple of m (m > 0). */
HQ_HD int64_t hq_roundup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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

/* Encode, in branch-free form (vectorizable in the CPU loops, divergence-free on a GPU). The
   normal range rounds the FP32 mantissa to the FP8 width with an integer RNE on the bits (a carry
   into the exponent is the right result); below the smallest normal, |x| * 2^(bias-1+mbits) is
   exact and adding 2^23 rounds it to an integer with RNE, read back from the bits (|x| is clamped
   first so that this arithmetic stays small for inputs that take the other path); a subnormal
   that rounds up to the smallest normal yields exactly its code. Then saturation (|x| > max and
   Inf -> max) and NaN -> 0x7F. Verified against a brute-force nearest-code search
   (tests/test_numerics_fp8.c) and, over all 2^32 inputs, against the branching form. */
HQ_HD uint8_t hq_f32_to_e4m3(float x) {
  uint32_t u = hq_f32_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  uint32_t n = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  uint32_t small = a < 0x3c800000u;                                   /* below 2^-6 */
  uint32_t as = hq_sel(small, a, 0x3c800000u);
  uint32_t sub = hq_f32_bits(hq_add_rn(hq_mul_rn(hq_bits_f32(as), 512.0f), 8388608.0f)) -
                 0x4b000000u;
  uint32_t c = hq_sel(small, sub, n);
  c = hq_sel(a > 0x43e00000u, 0x7eu, c);                              /* > 448, Inf */
  return (uint8_t)hq_sel(a > 0x7f800000u, HQ_FP8_NAN, c | s);
}

HQ_HD uint8_t hq_f32_to_e5m2(float x) {
  uint32_t u = hq_f32_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  uint32_t n = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
  uint32_t small = a < 0x38800000u;                                   /* below 2^-14 */
  uint32_t as = hq_sel(small, a, 0x38800000u);
  uint32_t sub = hq_f32_bits(hq_add_rn(hq_mul_rn(hq_bits_f32(as), 65536.0f), 8388608.0f)) -
                 0x4b000000u;
  uint32_t c = hq_sel(small, sub, n);
  c = hq_sel(a > 0x47600000u, 0x7bu, c);                              /* > 57344, Inf */
  return (uint8_t)hq_sel(a > 0x7f800000u, HQ_FP8_NAN, c | s);
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
** The cuBLAS "swizzled" block-scale layout (VEC32_UE8M0 for MXFP8, VEC16_UE4M3 for NVFP4;
** FORMATS.md 2.4). S[r][c] is a logical scale matrix: r runs along the GEMM operand's
** non-contracted dimension, c over the contracted dimension's blocks; `cols` is its column count
** (rounded up to a multiple of 4 here). It is padded to [roundup(rows, 128), roundup(cols, 4)] and
** cut into 128x4 tiles of 512 bytes stored in row-major tile order; inside a tile the 128 rows of
** 4 bytes are stored in the order 0, 32, 64, 96, 1, 33, 65, 97, ..., 31, 63, 95, 127. Offset:
**   ((r/128) * (Cp/4) + c/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + c%4,   Cp = roundup(cols,4)
*/
HQ_HD int64_t hq_swizzle_offset(int64_t r, int64_t c, int64_t cols) {
  int64_t tiles_c = hq_roundup(cols, 4) / 4;
  return ((r / 128) * tiles_c + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

/* --------------------------------------------------------------------------------------------
** MXFP8: E8M0 scales (FORMATS.md 2.2)                         [filled by the mxfp8 plugin work]
**
** One E8M0 scale per 32 elements (1x32 rowwise, 32x1 columnwise, or 32x32 in 2-D mode). A code
** e (0..254) stands for scale_inv = 2^(e-127); 0xFF is NaN; there is no zero. TE's rule, not
** OCP's floor rule: the scale is rounded UP from amax/max_norm, so elements never saturate.
**   t = RN(amax * RN(1/max_norm))               (one FP32 multiply)
**   e = E8M0 code of t rounded toward +Inf       (cvt.rp.satfinite.ue8m0; 0 -> 0, Inf -> 0xFE,
**                                                 NaN -> 0xFF)
**   q = fp8_rne_satfinite(RN(x * 2^(127-e)))     (the multiply is exact but for FP32 underflow)
**   x' = RN(fp32(q) * 2^(e-127))                 (dequantize)
*/
#define HQ_E8M0_NAN 0xFFu
#define HQ_MXFP8_BLOCK 32

/* Decode: 2^(e-127). e = 0 is the FP32 subnormal 2^-127 (bits 0x00400000), e = 0xFF is NaN. */
HQ_HD float hq_e8m0_to_f32(uint8_t e) {
  if (e == 0xFFu) return hq_bits_f32(0x7fc00000u);
  if (e == 0) return hq_bits_f32(0x00400000u);
  return hq_bits_f32((uint32_t)e << 23);
}

/* Encode a non-negative FP32 value to E8M0 rounding toward +Inf with saturation to the finite
   range (cvt.rp.satfinite.ue8m0x2.f32): NaN -> 0xFF; +-Inf -> 0xFE; +-0 -> 0x00; otherwise the
   biased FP32 exponent, plus one when the mantissa is not zero -- except at 0xFE (saturation) and
   for FP32 subnormals <= 2^-127 (mantissa <= 0x400000), which are code 0 = 2^-127 already.
   The sign is ignored (amax-derived inputs are never negative). */
HQ_HD uint8_t hq_e8m0_from_f32_rp(float t) {
  uint32_t a = hq_f32_bits(t) & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)HQ_E8M0_NAN;
  if (a == 0x7f800000u) return 0xFEu;
  uint32_t e = a >> 23, m = a & 0x7fffffu;
  if (m != 0 && e != 0xFEu && !(e == 0 && m <= 0x400000u)) e++;
  return (uint8_t)e;
}

/* The encode multiplier 2^(127-e) (TE exp2f_rcp): bits (254-e) << 23 for e < 254; e = 254 gives
   the FP32 subnormal 2^-127; e = 0xFF gives NaN. */
HQ_HD float hq_e8m0_quant_mult(uint8_t e) {
  if (e == 0xFFu) return hq_bits_f32(0x7fc00000u);
  if (e == 0xFEu) return hq_bits_f32(0x00400000u);
  return hq_bits_f32((254u - (uint32_t)e) << 23);
}

/* The E8M0 scale code of a block from its amax (max |x| with NaN ignored, Inf included):
   steps 2 and 3 of FORMATS.md 2.2. kind is HQ_FP8_E4M3 or HQ_FP8_E5M2. */
HQ_HD uint8_t hq_mxfp8_scale_code(float amax, int kind) {
  float t = hq_mul_rn(amax, hq_rcp_rn(hq_fp8_max(kind)));
  return hq_e8m0_from_f32_rp(t);
}

/* One element: q = fp8_rne_satfinite(RN(x * mult)) with mult = hq_e8m0_quant_mult(e). NaN -> 0x7F;
   +-Inf -> +-max (its block has e = 0xFE). */
HQ_HD uint8_t hq_mxfp8_quantize(float x, float mult, int kind) {
  return hq_f32_to_fp8(hq_mul_rn(x, mult), kind);
}

/* One element back: RN(fp32(q) * 2^(e-127)). */
HQ_HD float hq_mxfp8_dequantize(uint8_t q, uint8_t e, int kind) {
  return hq_mul_rn(hq_fp8_to_f32(q, kind), hq_e8m0_to_f32(e));
}

/* Shapes of the scale buffers of an [M, K] tensor (M % 32 == 0, K % 32 == 0), the same for the
   compact and the swizzled layout:
     rowwise  scale_inv            [roundup(M, 128), roundup(K/32, 4)]
     columnwise columnwise_scale_inv [roundup(M/32, 4), roundup(K, 128)] */
HQ_HD int64_t hq_mxfp8_row_scale_rows(int64_t M) { return hq_roundup(M, 128); }
HQ_HD int64_t hq_mxfp8_row_scale_cols(int64_t K) { return hq_roundup(K / 32, 4); }
HQ_HD int64_t hq_mxfp8_col_scale_rows(int64_t M) { return hq_roundup(M / 32, 4); }
HQ_HD int64_t hq_mxfp8_col_scale_cols(int64_t K) { return hq_roundup(K, 128); }

/* Byte offset, in the rowwise scale_inv buffer of an [M, K] tensor, of the scale of row i, K-block
   kb (elements (i, 32kb .. 32kb+31)).
     compact (swizzled = 0): row-major [roundup(M,128)][roundup(K/32,4)]: i * roundup(K/32,4) + kb
     swizzled: hq_swizzle_offset(r = i, c = kb, cols = K/32). */
HQ_HD int64_t hq_mxfp8_row_scale_idx(int64_t i, int64_t kb, int64_t K, int swizzled) {
  if (swizzled) return hq_swizzle_offset(i, kb, K / 32);
  return i * hq_mxfp8_row_scale_cols(K) + kb;
}

/* Byte offset, in the columnwise_scale_inv buffer of an [M, K] tensor, of the scale of M-block
   mb, column j (elements (32mb .. 32mb+31, j)).
     compact (swizzled = 0): row-major [roundup(M/32,4)][roundup(K,128)]: mb * roundup(K,128) + j
     swizzled: the compact [M/32][K] matrix is used as its transpose, r = column j, c = M-block mb:
       hq_swizzle_offset(r = j, c = mb, cols = M/32). */
HQ_HD int64_t hq_mxfp8_col_scale_idx(int64_t mb, int64_t j, int64_t M, int64_t K, int swizzled) {
  if (swizzled) return hq_swizzle_offset(j, mb, M / 32);
  return mb * hq_mxfp8_col_scale_cols(K) + j;
}

/* --------------------------------------------------------------------------------------------
** NVFP4: E2M1 elements, E4M3 block scales, global scale, RHT, stochastic rounding (FORMATS.md 3)
**                                                             [filled by the nvfp4 plugin work]
*/

/*
** The rules, in TE's operation order (FORMATS.md 3.3 and 9.3). A is the direction's global amax
** (max |x| with NaN ignored; with RHT the columnwise A is taken over the BF16-rounded transformed
** values), a_b a 16-element block's amax, x an element:
**   S_enc = min(RN(2688 / A), FLT_MAX); 1 if A == 0 or S_enc == 0   global_encode_scale
**   S_dec = RN(1 / S_enc)                                             global_decode_scale
**   m     = RN(S_enc * RN(1/6))                   (once per direction) block_scale_mult
**   sf    = E4M3_RNE_satfinite(min(RN(a_b * m), FLT_MAX))  (stored)    block_scale
**   enc   = min(RN(1 / RN(fp32(sf) * S_dec)), FLT_MAX); FLT_MAX if 0  encode_mult
**   q     = E2M1(RN(x * enc)), RNE-satfinite or stochastic             quantize, quantize_sr
**   x'    = RN(e2m1(q) * RN(RN(fp32(sf) * A) * RN(1/2688)))            decode_mult, dequantize
** (function names without their hq_nvfp4_ prefix).
** The dequantizer uses A / 2688 (as TE's dequantize kernel and GEMM alpha do), not S_dec.
*/
#define HQ_E2M1_MAX 6.0f
#define HQ_NVFP4_BLOCK 16
#define HQ_NVFP4_RHT_SIGNS 0xD7E8u          /* TE's fixed sign vector; bit i set: s_i = -1 */

/* E2M1 code (bits 3..0: sign, 2 exponent bits, 1 mantissa bit; bias 1) -> FP32, exact.
   Magnitudes of codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Code 8 is -0.0. */
HQ_HD float hq_e2m1_to_f32(uint32_t code) {
  uint32_t m = code & 7u, e = m >> 1;
  uint32_t bits = e ? (((e + 126u) << 23) | ((m & 1u) << 22)) : ((m & 1u) ? 0x3f000000u : 0u);
  return hq_bits_f32(bits | ((code & 8u) << 28));
}

/* FP32 -> E2M1 code, round to nearest even with saturation (cvt.rn.satfinite.e2m1x2.f32).
   Each comparison below is one decision boundary: the midpoints 0.25, 1.25, 2.5, 5 lie between
   an even and an odd code and tie down to the even one (strict >); 0.75, 1.75, 3.5 tie up to
   the even one (>=). |x| > 5 and +-Inf give +-6; NaN gives +6 (0x7). The sign bit is x's sign
   bit, so -0.0 and negative values that round to zero give 0x8 (IEEE conversion; TE's Python
   reference writes 0x0 for an input of exactly -0.0, the only difference). The comparisons run
   on the FP32 bit patterns, which order like the values for non-negative numbers. */
HQ_HD uint32_t hq_f32_to_e2m1(float x) {
  uint32_t u = hq_f32_bits(x), a = u & 0x7fffffffu;
  uint32_t c = (uint32_t)(a > 0x3e800000u) + (uint32_t)(a >= 0x3f400000u) +
               (uint32_t)(a > 0x3fa00000u) + (uint32_t)(a >= 0x3fe00000u) +
               (uint32_t)(a > 0x40200000u) + (uint32_t)(a >= 0x40600000u) +
               (uint32_t)(a > 0x40a00000u);
  uint32_t s = a > 0x7f800000u ? 0u : (u >> 28) & 8u;
  return c | s;
}

/* FP32 -> E2M1 code with stochastic rounding, from 8 random bits r8 (bits 7..0). This is the
   rule of TE's software fallback (FORMATS.md 3.6), hq's definition on every device:
     u = r8 / 256; a = |x|; step(v) = 0.5 if v < 2, 1 if v < 4, else 2;
     t = RN(a + u * step(a)); q = min(floor(t / step(t)) * step(t), 6), with the sign bit of x;
     NaN -> +6 (0x7); |x| >= 6 and Inf -> +-6.
   u * step(a) and t / step(t) (done as t * (1/step(t))) are exact; only the add rounds. For
   a < 6, t < 8, so n = floor(t / step(t)) <= 3 and the min never acts; the code of n * step(t)
   is n + 2 * log2(2 * step(t)) (E2M1 counts steps of 0.5 below 2, of 1 in [2, 4), of 2 above).
   Written with masks instead of branches so that it vectorizes. */
HQ_HD uint32_t hq_f32_to_e2m1_sr(float x, uint32_t r8) {
  uint32_t u = hq_f32_bits(x), ab = u & 0x7fffffffu, s = (u >> 28) & 8u;
  uint32_t big = 0u - (uint32_t)(ab >= 0x40c00000u);  /* |x| >= 6, Inf, NaN: code 7 */
  uint32_t nan = 0u - (uint32_t)(ab > 0x7f800000u);   /* NaN: +6 */
  float a = hq_bits_f32(ab & ~big);
  uint32_t ea = (uint32_t)(a >= 2.0f) + (uint32_t)(a >= 4.0f);
  float step = hq_bits_f32(0x3f000000u + (ea << 23));                /* 0.5, 1, 2 */
  float t = hq_add_rn(a, hq_mul_rn(hq_mul_rn((float)(int32_t)(r8 & 0xffu), 0.00390625f), step));
  uint32_t et = (uint32_t)(t >= 2.0f) + (uint32_t)(t >= 4.0f);
  /* t * 2, 1 or 0.5, truncated (a signed conversion vectorizes; the value is in [0, 4)) */
  uint32_t n = (uint32_t)(int32_t)hq_mul_rn(t, hq_bits_f32(0x40000000u - (et << 23)));
  uint32_t c = ((n + 2u * et) & ~big) | (7u & big);
  return ((s | c) & ~nan) | (7u & nan);
}

/* Global encode scale S_enc from the direction's amax A (>= 0): RN(448*6 / A) clamped to
   FLT_MAX (as fminf: a NaN quotient also gives FLT_MAX); 1 when A == 0 or the quotient is 0
   (A = Inf). */
HQ_HD float hq_nvfp4_global_encode_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  float s = hq_div_rn(2688.0f, amax);
  if (!(s <= FLT_MAX)) s = FLT_MAX;
  if (s == 0.0f) return 1.0f;
  return s;
}

/* Global decode scale S_dec = RN(1 / S_enc) (TE: 1.0f / S_enc, or 1.0 / S_enc in double rounded
   to float: the same value). */
HQ_HD float hq_nvfp4_global_decode_scale(float s_enc) { return hq_rcp_rn(s_enc); }

/* The per-direction multiplier m = RN(S_enc * RN(1/6)) of the block scale rule. */
HQ_HD float hq_nvfp4_block_scale_mult(float s_enc) { return hq_mul_rn(s_enc, hq_rcp_rn(6.0f)); }

/* The stored E4M3 block scale sf = E4M3_RNE_satfinite(min(RN(a_b * m), FLT_MAX)). */
HQ_HD uint8_t hq_nvfp4_block_scale(float block_amax, float m) {
  float p = hq_mul_rn(block_amax, m);
  if (p > FLT_MAX) p = FLT_MAX;
  return hq_f32_to_e4m3(p);
}

/* The block's encode multiplier enc = min(RN(1 / RN(fp32(sf) * S_dec)), FLT_MAX); FLT_MAX when
   the product is 0 (a zero or tiny block: its codes may saturate but dequantize to 0). */
HQ_HD float hq_nvfp4_encode_mult(uint8_t sf, float s_dec) {
  float d = hq_mul_rn(hq_e4m3_to_f32(sf), s_dec);
  if (d == 0.0f) return FLT_MAX;
  float e = hq_div_rn(1.0f, d);
  return e < FLT_MAX ? e : FLT_MAX;
}

/* One element: q = E2M1_RNE_satfinite(RN(x * enc)), or with stochastic rounding from r8. */
HQ_HD uint32_t hq_nvfp4_quantize(float x, float enc) { return hq_f32_to_e2m1(hq_mul_rn(x, enc)); }
HQ_HD uint32_t hq_nvfp4_quantize_sr(float x, float enc, uint32_t r8) {
  return hq_f32_to_e2m1_sr(hq_mul_rn(x, enc), r8);
}

/* Dequantize multiplier of a block: RN(RN(fp32(sf) * A) * RN(1/2688)) (TE dequantize_nvfp4:
   scale * amax * (float)(1.0 / (6.0 * 448.0)), left to right); an element is then
   RN(e2m1(q) * mult). */
HQ_HD float hq_nvfp4_decode_mult(uint8_t sf, float amax) {
  return hq_mul_rn(hq_mul_rn(hq_e4m3_to_f32(sf), amax), (float)(1.0 / 2688.0));
}
HQ_HD float hq_nvfp4_dequantize(uint32_t code, float decode_mult) {
  return hq_mul_rn(hq_e2m1_to_f32(code), decode_mult);
}

/* max |v_i| over n values, NaN ignored, +-Inf counted (FORMATS.md 0.4): a max over the FP32 bit
   patterns of |v_i| (as signed integers: they are below 2^31), which order like the values;
   NaN patterns count as 0. */
HQ_HD float hq_nvfp4_amax(const float *v, int64_t n) {
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t b = hq_abs_bits_nonan(v[i]);
    mx = b > mx ? b : mx;
  }
  return hq_bits_f32(mx);
}

/* RN to BF16 and back: hq_bf16_to_f32(hq_f32_to_bf16(x)), without branches (NaN stays a quiet
   NaN with its sign). */
HQ_HD float hq_nvfp4_bf16_round(float x) {
  uint32_t u = hq_f32_bits(x);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return hq_bits_f32((u & 0x7fffffffu) > 0x7f800000u ? ((u & 0xffff0000u) | 0x00400000u) : r);
}

/* The 16-point random Hadamard transform of one group g (16 values along M, i.e. 16 consecutive
   rows of one column of x), y = g * diag(s) * H16 / 4 with H16[r][c] = (-1)^popcount(r & c) and
   s_i = -1 where bit i of sign_mask is set (FORMATS.md 3.5). hq's fixed FP32 evaluation order,
   which every CPU and GPU implementation follows (TE's tensor-core accumulation order is
   unspecified, so TE's bits are not reproducible here):
     0. v_i = RN_bf16(g_i)            (BF16 inputs are unchanged; f32/f16 are rounded to BF16)
     1. v_i = -v_i where bit i is set (exact: the sign bit flips)
     2. butterfly stages h = 1, 2, 4, 8 in this order; in each, for i = 0..15 with (i & h) == 0:
        (v_i, v_{i+h}) = (RN(v_i + v_{i+h}), RN(v_i - v_{i+h}))
     3. v_i = RN(v_i * 0.25)
     4. v_i = RN_bf16(v_i)            (the BF16 the columnwise amax and quantization see)
   In exact arithmetic the matrix diag(s) H16 / 4 is orthogonal; its inverse is its transpose
   H16 diag(s) / 4. A NaN input makes NaN outputs whose sign and payload are not defined (they
   differ between compilers and devices); any NaN is ignored by amax and quantizes to +6, so the
   quantized bytes do not depend on them. */
HQ_HD void hq_nvfp4_rht16(float v[16], uint32_t sign_mask) {
  for (int i = 0; i < 16; i++)
    v[i] = hq_bits_f32(hq_f32_bits(hq_nvfp4_bf16_round(v[i])) ^ (((sign_mask >> i) & 1u) << 31));
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; i++) {
      if (i & h) continue;
      float a = v[i], b = v[i + h];
      v[i] = hq_add_rn(a, b);
      v[i + h] = hq_add_rn(a, -b);
    }
  }
  for (int i = 0; i < 16; i++) v[i] = hq_nvfp4_bf16_round(hq_mul_rn(v[i], 0.25f));
}

/* The inverse transform, applied when a columnwise RHT copy is dequantized: the RHT matrix
   diag(s) H16 / 4 is orthogonal, so its inverse is its transpose H16 diag(s) / 4. Fixed FP32
   order: the butterfly stages 1, 2, 4, 8 with RN adds, the exact * 0.25, then the sign flip (no
   BF16 rounding: the result is the dequantized value). */
HQ_HD void hq_nvfp4_rht16_inverse(float v[16], uint32_t sign_mask) {
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; i++) {
      if (i & h) continue;
      float a = v[i], b = v[i + h];
      v[i] = hq_add_rn(a, b);
      v[i + h] = hq_add_rn(a, -b);
    }
  }
  for (int i = 0; i < 16; i++)
    v[i] = hq_bits_f32(hq_f32_bits(hq_mul_rn(v[i], 0.25f)) ^ (((sign_mask >> i) & 1u) << 31));
}

/* hq_nvfp4_rht16 of 16 groups at once: v[16 * i + l] is element i of group l. Every group goes
   through exactly the operations of hq_nvfp4_rht16, in its order (the same bits); the groups are
   independent lanes, which lets a CPU compiler vectorize across them. */
#if defined(__cplusplus)
#define HQ_NVFP4_RESTRICT __restrict__
#else
#define HQ_NVFP4_RESTRICT restrict
#endif
HQ_HD void hq_nvfp4_bfly16(float *HQ_NVFP4_RESTRICT p, float *HQ_NVFP4_RESTRICT q) {
  for (int l = 0; l < 16; l++) {
    float a = p[l], b = q[l];
    p[l] = hq_add_rn(a, b);
    q[l] = hq_add_rn(a, -b);
  }
}
HQ_HD void hq_nvfp4_rht16x16(float v[256], uint32_t sign_mask) {
  for (int i = 0; i < 16; i++) {
    uint32_t flip = ((sign_mask >> i) & 1u) << 31;
    for (int l = 0; l < 16; l++)
      v[16 * i + l] = hq_bits_f32(hq_f32_bits(hq_nvfp4_bf16_round(v[16 * i + l])) ^ flip);
  }
  for (int h = 1; h < 16; h <<= 1)
    for (int i = 0; i < 16; i++)
      if (!(i & h)) hq_nvfp4_bfly16(v + 16 * i, v + 16 * (i + h));
  for (int k = 0; k < 256; k++) v[k] = hq_nvfp4_bf16_round(hq_mul_rn(v[k], 0.25f));
}

/* Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32 with 10 rounds): one block of 4
   random words from a 128-bit counter and a 64-bit key. A round maps (c0, c1, c2, c3) to
   (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)); the key is bumped by
   (W0, W1) between rounds. */
#define HQ_PHILOX_M0 0xD2511F53u
#define HQ_PHILOX_M1 0xCD9E8D57u
#define HQ_PHILOX_W0 0x9E3779B9u
#define HQ_PHILOX_W1 0xBB67AE85u
HQ_HD void hq_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += HQ_PHILOX_W0;
      k1 += HQ_PHILOX_W1;
    }
    uint64_t p0 = (uint64_t)HQ_PHILOX_M0 * c0, p1 = (uint64_t)HQ_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* Random bits for stochastic rounding of one 16-element block: ONE Philox4x32-10 call per
   (direction, block, call offset), independent of any thread mapping:
     key     = { seed & 0xffffffff, seed >> 32 }
     counter = { block & 0xffffffff, ((block >> 32) & 0x7fffffff) | colwise << 31,
                 offset & 0xffffffff, offset >> 32 }
   where colwise is 0 for the rowwise copy and 1 for the columnwise copy, and block is the
   block's index in its direction's stored data: rowwise i*(K/16) + k/16, columnwise
   k*(M/16) + i/16 (element (i, k) of the [M, K] tensor). Element e = 0..15 of the block (its
   position along the block: k % 16 rowwise, i % 16 columnwise) uses the 8 bits
   hq_nvfp4_sr_byte(out, e) = (out[e / 4] >> (8 * (e % 4))) & 0xff, as u = byte / 256. */
HQ_HD void hq_nvfp4_sr_bits(uint64_t seed, uint64_t offset, uint32_t colwise, uint64_t block,
                            uint32_t out[4]) {
  uint32_t key[2], ctr[4];
  key[0] = (uint32_t)seed;
  key[1] = (uint32_t)(seed >> 32);
  ctr[0] = (uint32_t)block;
  ctr[1] = ((uint32_t)(block >> 32) & 0x7fffffffu) | ((colwise & 1u) << 31);
  ctr[2] = (uint32_t)offset;
  ctr[3] = (uint32_t)(offset >> 32);
  hq_philox4x32_10(ctr, key, out);
}
HQ_HD uint32_t hq_nvfp4_sr_byte(const uint32_t bits[4], int e) {
  return (bits[e >> 2] >> (8 * (e & 3))) & 0xffu;
}

/* Layouts (FORMATS.md 3.2, 3.7, 2.4). Element (i, k) of the logical [M, K] tensor:
   - rowwise data [M, K/2]: byte i*(K/2) + k/2, low nibble when k is even;
   - columnwise data [K, M/2] (transposed): byte k*(M/2) + i/2, low nibble when i is even;
   - rowwise scale_inv [roundup(M,128), roundup(K/16,4)]: entry S[i][k/16];
   - columnwise scale_inv [roundup(K,128), roundup(M/16,4)]: entry S[k][i/16].
   A scale matrix S[r][b] of a direction whose stored data has rows of C elements has
   ld = roundup(C/16, 4) entries per row; its byte offset is
     compact:  r * ld + b
     swizzled: ((r/128) * (ld/4) + b/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + b%4
   (cuBLAS's 128x4 tiles, tile-row-major; NVFP4 uses it as "row" scaling for both copies).
   Every entry outside the logical [R, C/16] (the padding) is zero. */
HQ_HD int64_t hq_nvfp4_scale_rows(int64_t rows) { return hq_roundup(rows, 128); }
HQ_HD int64_t hq_nvfp4_scale_cols(int64_t cols) { return hq_roundup(cols / 16, 4); }

HQ_HD int64_t hq_nvfp4_scale_offset(int64_t r, int64_t b, int64_t cols, int swizzle) {
  if (swizzle) return hq_swizzle_offset(r, b, cols / 16);
  return r * hq_nvfp4_scale_cols(cols) + b;
}

HQ_HD int64_t hq_nvfp4_row_data_index(int64_t i, int64_t k, int64_t K) {
  return i * (K / 2) + k / 2;
}
HQ_HD int64_t hq_nvfp4_col_data_index(int64_t i, int64_t k, int64_t M) {
  return k * (M / 2) + i / 2;
}
HQ_HD int64_t hq_nvfp4_row_scale_index(int64_t i, int64_t k, int64_t K, int swizzle) {
  return hq_nvfp4_scale_offset(i, k / 16, K, swizzle);
}
HQ_HD int64_t hq_nvfp4_col_scale_index(int64_t i, int64_t k, int64_t M, int swizzle) {
  return hq_nvfp4_scale_offset(k, i / 16, M, swizzle);
}

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

/* scale_inv shape [d0, d1] of one direction (colwise 0/1, two_d 0/1) of a [M, K] tensor, and the
   unpadded extent n1 <= d1 of dim 1 (entries [.][n1, d1) are padding). */
HQ_HD void hq_fp8b_scale_shape(int64_t M, int64_t K, int colwise, int two_d, int64_t *d0,
                               int64_t *d1, int64_t *n1) {
  /* FORMATS.md 4.3's uniform rule on the copy as the GEMM reads it, [outer, inner]: 1-D is
     [inner blocks, r4(outer)], 2-D is [outer blocks, r4(inner blocks)]. */
  int64_t outer = colwise ? K : M, inner = colwise ? M : K;
  *d0 = two_d ? hq_fp8b_nblocks(outer) : hq_fp8b_nblocks(inner);
  *n1 = two_d ? hq_fp8b_nblocks(inner) : outer;
  *d1 = hq_roundup(*n1, 4);
}

/* rowwise 1-D: [ceil(K/128), r4(M)], entry [k/128][m]. */
HQ_HD int64_t hq_fp8b_row1d_index(int64_t m, int64_t k, int64_t M) {
  return (k / HQ_FP8B_BLOCK) * hq_roundup(M, 4) + m;
}
/* rowwise 2-D: [ceil(M/128), r4(ceil(K/128))], entry [m/128][k/128]. */
HQ_HD int64_t hq_fp8b_row2d_index(int64_t m, int64_t k, int64_t K) {
  return (m / HQ_FP8B_BLOCK) * hq_roundup(hq_fp8b_nblocks(K), 4) + k / HQ_FP8B_BLOCK;
}
/* columnwise 1-D: [ceil(M/128), r4(K)], entry [m/128][k]. */
HQ_HD int64_t hq_fp8b_col1d_index(int64_t m, int64_t k, int64_t K) {
  return (m / HQ_FP8B_BLOCK) * hq_roundup(K, 4) + k;
}
/* columnwise 2-D: [ceil(K/128), r4(ceil(M/128))], entry [k/128][m/128]. */
HQ_HD int64_t hq_fp8b_col2d_index(int64_t m, int64_t k, int64_t M) {
  return (k / HQ_FP8B_BLOCK) * hq_roundup(hq_fp8b_nblocks(M), 4) + m / HQ_FP8B_BLOCK;
}
/* The one of the four above that a direction uses. */
HQ_HD int64_t hq_fp8b_scale_index(int64_t m, int64_t k, int64_t M, int64_t K, int colwise,
                                  int two_d) {
  if (two_d) return colwise ? hq_fp8b_col2d_index(m, k, M) : hq_fp8b_row2d_index(m, k, K);
  return colwise ? hq_fp8b_col1d_index(m, k, K) : hq_fp8b_row1d_index(m, k, M);
}

/* The block scale of FORMATS.md 4.2: value_for_inf is the max of the input dtype `src_dtype`
   (HQ_F32 / HQ_F16 / HQ_BF16), max_fp8 that of the element kind (HQ_FP8_E4M3 / HQ_FP8_E5M2). */
HQ_HD float hq_fp8b_scale(float amax, int kind, int pow2, float epsilon, int src_dtype) {
  return hq_scale_from_amax(amax, hq_fp8_max(kind), pow2, epsilon, hq_hp_max(src_dtype));
}

#endif /* HQ_NUMERICS_H */
