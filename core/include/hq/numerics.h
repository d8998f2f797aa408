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

/* Dequantize one element: x = RN(fp32(q) * scale_inv). */
HQ_HD float hq_fp8_dequantize(uint8_t q, float scale_inv, int kind) {
  return hq_mul_rn(hq_fp8_to_f32(q, kind), scale_inv);
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

/* Branch-free select: c ? a : b for c in {0, 1}, as mask arithmetic a compiler can vectorize. */
HQ_HD uint32_t hq_mxfp8_sel(uint32_t c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - c;
  return (a & m) | (b & ~m);
}

/* The FP8 casts of hq_f32_to_e4m3 / hq_f32_to_e5m2 (RNE, satfinite, NaN -> 0x7F) in branch-free
   form, for the vectorizable hot loops of the block quantizers; bit-identical to those for every
   FP32 input (verified over all 2^32 inputs; tests/test_mxfp8_numerics.c sweeps a subset). The
   normal range rounds the mantissa with an integer RNE; below the smallest normal,
   |y| * 2^(bias-1+mbits) is exact and adding 2^23 rounds it to an integer RNE, read back from the
   bits (|y| is clamped first so that this arithmetic stays small for inputs that take the other
   path). */
HQ_HD uint8_t hq_mxfp8_cast_e4m3(float y) {
  uint32_t u = hq_f32_bits(y), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  uint32_t n = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  uint32_t small = a < 0x3c800000u;                                   /* below 2^-6 */
  uint32_t as = hq_mxfp8_sel(small, a, 0x3c800000u);
  uint32_t sub = hq_f32_bits(hq_add_rn(hq_mul_rn(hq_bits_f32(as), 512.0f), 8388608.0f)) -
                 0x4b000000u;
  uint32_t c = hq_mxfp8_sel(small, sub, n);
  c = hq_mxfp8_sel(a > 0x43e00000u, 0x7eu, c);                        /* > 448, Inf */
  return (uint8_t)hq_mxfp8_sel(a > 0x7f800000u, HQ_FP8_NAN, c | s);
}

HQ_HD uint8_t hq_mxfp8_cast_e5m2(float y) {
  uint32_t u = hq_f32_bits(y), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  uint32_t n = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
  uint32_t small = a < 0x38800000u;                                   /* below 2^-14 */
  uint32_t as = hq_mxfp8_sel(small, a, 0x38800000u);
  uint32_t sub = hq_f32_bits(hq_add_rn(hq_mul_rn(hq_bits_f32(as), 65536.0f), 8388608.0f)) -
                 0x4b000000u;
  uint32_t c = hq_mxfp8_sel(small, sub, n);
  c = hq_mxfp8_sel(a > 0x47600000u, 0x7bu, c);                        /* > 57344, Inf */
  return (uint8_t)hq_mxfp8_sel(a > 0x7f800000u, HQ_FP8_NAN, c | s);
}

/* |x| as FP32 bits with NaN counted as 0: for amax over a block as an integer max (|x| bits
   order like the values), equal to the hq_fmax_nan_ignoring chain started at 0. */
HQ_HD uint32_t hq_mxfp8_absbits_nonan(float x) {
  uint32_t a = hq_f32_bits(x) & 0x7fffffffu;
  return hq_mxfp8_sel(a > 0x7f800000u, 0u, a);
}

/* One element back: RN(fp32(q) * 2^(e-127)). */
HQ_HD float hq_mxfp8_dequantize(uint8_t q, uint8_t e, int kind) {
  return hq_mul_rn(hq_fp8_to_f32(q, kind), hq_e8m0_to_f32(e));
}

HQ_HD int64_t hq_mxfp8_roundup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Shapes of the scale buffers of an [M, K] tensor (M % 32 == 0, K % 32 == 0), the same for the
   compact and the swizzled layout:
     rowwise  scale_inv            [roundup(M, 128), roundup(K/32, 4)]
     columnwise columnwise_scale_inv [roundup(M/32, 4), roundup(K, 128)] */
HQ_HD int64_t hq_mxfp8_row_scale_rows(int64_t M) { return hq_mxfp8_roundup(M, 128); }
HQ_HD int64_t hq_mxfp8_row_scale_cols(int64_t K) { return hq_mxfp8_roundup(K / 32, 4); }
HQ_HD int64_t hq_mxfp8_col_scale_rows(int64_t M) { return hq_mxfp8_roundup(M / 32, 4); }
HQ_HD int64_t hq_mxfp8_col_scale_cols(int64_t K) { return hq_mxfp8_roundup(K, 128); }

/* The cuBLAS "swizzled" scale layout (VEC32_UE8M0, FORMATS.md 2.4). S[r][c] is a logical scale
   matrix: r runs along the GEMM operand's non-contracted dimension, c over the contracted
   dimension's blocks; `cols` is its column count (unpadded or padded: it is rounded up to a
   multiple of 4 here). It is padded to [roundup(rows, 128), roundup(cols, 4)] and cut into 128x4
   tiles of 512 bytes stored in row-major tile order; inside a tile the 128 rows of 4 bytes are
   stored in the order 0, 32, 64, 96, 1, 33, 65, 97, ..., 31, 63, 95, 127. Byte offset of S[r][c]:
     ((r/128) * (Cp/4) + c/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + c%4,   Cp = roundup(cols,4). */
HQ_HD int64_t hq_mxfp8_swizzle_idx(int64_t r, int64_t c, int64_t cols) {
  int64_t tiles_c = hq_mxfp8_roundup(cols, 4) / 4;
  return ((r / 128) * tiles_c + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

/* Byte offset, in the rowwise scale_inv buffer of an [M, K] tensor, of the scale of row i, K-block
   kb (elements (i, 32kb .. 32kb+31)).
     compact (swizzled = 0): row-major [roundup(M,128)][roundup(K/32,4)]: i * roundup(K/32,4) + kb
     swizzled: hq_mxfp8_swizzle_idx(r = i, c = kb, cols = K/32). */
HQ_HD int64_t hq_mxfp8_row_scale_idx(int64_t i, int64_t kb, int64_t K, int swizzled) {
  if (swizzled) return hq_mxfp8_swizzle_idx(i, kb, K / 32);
  return i * hq_mxfp8_row_scale_cols(K) + kb;
}

/* Byte offset, in the columnwise_scale_inv buffer of an [M, K] tensor, of the scale of M-block
   mb, column j (elements (32mb .. 32mb+31, j)).
     compact (swizzled = 0): row-major [roundup(M/32,4)][roundup(K,128)]: mb * roundup(K,128) + j
     swizzled: the compact [M/32][K] matrix is used as its transpose, r = column j, c = M-block mb:
       hq_mxfp8_swizzle_idx(r = j, c = mb, cols = M/32). */
HQ_HD int64_t hq_mxfp8_col_scale_idx(int64_t mb, int64_t j, int64_t M, int64_t K, int swizzled) {
  if (swizzled) return hq_mxfp8_swizzle_idx(j, mb, M / 32);
  return mb * hq_mxfp8_col_scale_cols(K) + j;
}

/* --------------------------------------------------------------------------------------------
** NVFP4: E2M1 elements, E4M3 block scales, global scale, RHT, stochastic rounding (FORMATS.md 3)
**                                                             [filled by the nvfp4 plugin work]
*/

/* --------------------------------------------------------------------------------------------
** FP8 block scaling (FORMATS.md 4)                        [filled by the fp8_block plugin work]
*/

#endif /* HQ_NUMERICS_H */
