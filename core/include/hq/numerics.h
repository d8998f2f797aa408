/*
** hq/numerics.h -- the generic element codecs, shared by the CPU references and the CUDA kernels
** of every format (stock or third-party).
**
** What lives here is format-neutral: FP32 bit casts and IEEE round-to-nearest arithmetic, the
** f32 <-> bf16 / f16 conversions and the hp load/store helpers a plugin uses to read its input,
** the FP8 (E4M3, E5M2), E8M0 and FP4 (E2M1) element codecs, the scaled FP8 element cast, the
** cuBLAS swizzled scale-layout offset (HQ_SCALE_LAYOUT_SWIZZLED) and the random stream's
** per-operation offset (hq_rng_offset). Each is plain integer/FP32 code that compiles as C
** (host) and as CUDA (host + device), so a format's CPU reference and its kernels agree bit for
** bit by construction. The rules of a particular format (its scale from amax, block layouts,
** transforms, random streams) live with that format's plugin.
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

#include "hq/plugin.h"

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
   so the integer max of these over a set is the bits of its NaN-ignoring amax (docs/formats.md;
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

/* Exact; Inf and NaN keep their sign and payload (the mantissa bits move up 13 places). With
   no branch, for the kernels that convert every element of a 16-bit input: a half's exponent
   and mantissa bits a, shifted into an FP32's places, are its value times 2^-112; exponent 31
   (Inf, NaN) takes the FP32 exponent 255. On the host a normal half takes the biases'
   difference (112) in one integer add and a subnormal one, m * 2^-24, is (0.5 + m * 2^-24) -
   0.5, an FP32 subtraction of normal numbers, so the result stays exact where the calling
   process flushes subnormals (DAZ/FTZ; the core also clears those bits around its host work,
   docs/embedding.md). On a GPU, whose hq kernels are never built to flush, one multiply by 2^112
   rebiases both at once (faster there than the host's form). Branch-free because a branch
   per case (Inf/NaN, subnormal, normal) costs a kernel a divergent path per element.
   tests/test_numerics_fp8.c checks every pattern, also with the CPU flushing subnormals;
   tests/test_gpu_core.c the GPU's against the host's on every pattern. */
HQ_HD float hq_f16_to_f32(uint16_t h) {
  const uint32_t a = (uint32_t)(h & 0x7fffu) << 13;
#if defined(__CUDA_ARCH__)
  const uint32_t r = a >= 0x0f800000u ? a | 0x7f800000u
                                      : hq_f32_bits(hq_mul_rn(hq_bits_f32(a), 0x1p112f));
#else
  const float sub = hq_add_rn(hq_bits_f32(0x3f000000u | (h & 0x3ffu)), -0.5f);
  const uint32_t r = a < 0x00800000u   ? hq_f32_bits(sub)
                     : a >= 0x0f800000u ? a | 0x7f800000u
                                        : a + 0x38000000u;
#endif
  return hq_bits_f32(((uint32_t)(h & 0x8000u) << 16) | r);
}

/* hq_f16_to_f32 for a reader that never looks at a NaN's bits: the same FP32 for every h that
   is not a NaN, and a NaN for a NaN, whose sign and payload may differ (a GPU's convert
   instruction, one per element, gives its canonical NaN). The stock formats' quantize kernels
   read 16-bit inputs through it: every cast writes one fixed code for any NaN (FP8 0x7F, E2M1
   0x7) and no amax takes a NaN, so their bytes are the CPU reference's (the GPU tests quantize
   F16 NaNs of both signs). One instruction per element, where the branch-free form above takes
   several, so an F16 input reads as fast as a BF16 one; a reader of NaN bits (e.g. the identity
   format) keeps the branch-free form. */
HQ_HD float hq_f16_to_f32_anynan(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return hq_f16_to_f32(h);
#endif
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

/* Element type selector: the FP8 element kinds are hq_dtype values (HQ_E4M3, HQ_E5M2), the one
   enum of hq/plugin.h. */
HQ_HD float hq_fp8_max(int dtype) { return dtype == HQ_E5M2 ? HQ_E5M2_MAX : HQ_E4M3_MAX; }
HQ_HD uint8_t hq_f32_to_fp8(float x, int dtype) {
  return dtype == HQ_E5M2 ? hq_f32_to_e5m2(x) : hq_f32_to_e4m3(x);
}
HQ_HD float hq_fp8_to_f32(uint8_t q, int dtype) {
  return dtype == HQ_E5M2 ? hq_e5m2_to_f32(q) : hq_e4m3_to_f32(q);
}

/* Quantize one element: q = fp8(RN(x * scale)). */
HQ_HD uint8_t hq_fp8_quantize(float x, float scale, int kind) {
  return hq_f32_to_fp8(hq_mul_rn(x, scale), kind);
}

/* The one NaN hq writes: arithmetic on NaN keeps the payload on x86 but canonicalizes it on a
   GPU, so every result that may be NaN is produced from this constant instead. */
#define HQ_F32_NAN_BITS 0x7fc00000u

/* An FP8 code that is not a finite number: NaN (E4M3 S.1111.111; E5M2 S.11111.xx, xx != 0) or
   E5M2 Inf (S.11111.00). No finite value, and no +-Inf under the saturating casts above, encodes
   to one; so after a cast it marks exactly the NaN inputs. */
HQ_HD int hq_fp8_code_special(uint8_t q, int kind) {
  return kind == HQ_E5M2 ? (q & 0x7cu) == 0x7cu : (q & 0x7fu) == 0x7fu;
}

/* Nonzero when any of the 4 codes packed in w is special (hq_fp8_code_special), by one word
   test: a code's 7 low bits masked to the special pattern, plus one at the pattern's lowest bit,
   carry into bit 7 of the byte only for the pattern itself, and never into the next byte. */
HQ_HD uint32_t hq_fp8_word_special(uint32_t w, int kind) {
  return kind == HQ_E5M2 ? ((w & 0x7c7c7c7cu) + 0x04040404u) & 0x80808080u
                         : ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

/* w with every special code (hq_fp8_code_special) among its 4 bytes replaced by HQ_FP8_NAN and
   the others kept, with no branch: hq_fp8_word_special marks the special bytes in their bit 7.
   E4M3: a special byte's 7 low bits are already 0x7F, so clearing its bit 7 makes HQ_FP8_NAN;
   E5M2: the marks spread to whole-byte masks (bit 7 -> 0xFF, no carry between bytes) select
   0x7F there. */
HQ_HD uint32_t hq_fp8_word_canon_nan(uint32_t w, int kind) {
  const uint32_t s = hq_fp8_word_special(w, kind);
  if (kind != HQ_E5M2) return w & ~s;
  const uint32_t m = (s >> 7) * 0xffu;
  return (w & ~m) | (HQ_FP8_NAN * 0x01010101u & m);
}

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

/* x and y stored as the 16-bit dtype `dtype` (2: F16, else BF16) by hq_store_hp's rule, packed
   as two consecutive elements: x in the low half, the memory order of a little-endian word. The
   vector stores of the kernels that write 16-bit outputs take it, one rule with the scalar. */
HQ_HD uint32_t hq_pack2_hp16(float x, float y, int dtype) {
  if (dtype == 2) return (uint32_t)hq_f32_to_f16(x) | (uint32_t)hq_f32_to_f16(y) << 16;
  return (uint32_t)hq_f32_to_bf16(x) | (uint32_t)hq_f32_to_bf16(y) << 16;
}

/* Largest finite value of a high-precision dtype (FP8-block's value_for_inf). */
HQ_HD float hq_hp_max(int dtype) {
  if (dtype == 2) return 65504.0f;
  if (dtype == 3) return hq_bits_f32(0x7f7f0000u);                 /* BF16 max 0x1.FEp127 */
  return FLT_MAX;
}

/* --------------------------------------------------------------------------------------------
** The cuBLAS "swizzled" block-scale layout (VEC32_UE8M0 for MXFP8, VEC16_UE4M3 for NVFP4;
** docs/formats.md). S[r][c] is a logical scale matrix: r runs along the GEMM operand's
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
** E8M0: unsigned power-of-two scales 2^(e-127) (OCP MX). There is no zero; 0xFF is NaN.
*/
#define HQ_E8M0_NAN 0xFFu

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

/* --------------------------------------------------------------------------------------------
** FP4 E2M1 elements (OCP MX / NVFP4): codes 0..15, sign in bit 3.
*/
#define HQ_E2M1_MAX 6.0f

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

/* The same code as hq_f32_to_e2m1(x) for every x that is not NaN, in the form GPU kernels run
   fast: two FP32 adds and one min per value, no comparison. FP32 holds the integers of
   [2^23, 2^24) with spacing 1 and those of [2^24, 2^25) with spacing 2, so with C = 2^24 - 4
   and y = |x| the two sums
     p1 = RN(2y + C - 2), p2 = RN(y + C)
   round onto the E2M1 grid, ties to even (the parity of a sum's last mantissa bit is that of
   the E2M1 code's mantissa bit):
     y <= 2:      p1 = 2^24 - 6 + RNE(2y)          (step 0.5: codes 0..4)
     2 <= y < 4:  p2 = 2^24 - 4 + RNE(y)           (step 1: codes 4, 5; 3.5 ties up to 2^24)
     4 <= y:      p2 = 2^24 + 2 * RNE((y - 4) / 2)  (step 2: codes 6, 7, then beyond)
   and the bit pattern of each is HQ_E2M1_BIAS_BITS (0x4b7ffffa, the bits of 2^24 - 6) + the
   code. 2y + C - 2 >= y + C exactly when y >= 2, and rounding is monotonic, so min(p1, p2) is p1
   up to 2 and p2 from 2 on: the code; a last min with 2^24 + 2 (code 7) saturates (|x| > 5,
   Inf; 2y may overflow to Inf, p2 is then the smaller). 2y is exact, so a fused multiply-add
   gives the same p1. hq_e2m1_biased_bits_lt7(|x|) is that min (without the saturation) as bit
   patterns, which a kernel can pack and then subtract the bias once per word.
   tests/test_nvfp4_numerics.c checks it against hq_f32_to_e2m1 on every FP32 value below 32
   and a sweep of the rest. */
#define HQ_E2M1_BIAS_BITS 0x4b7ffffau /* the bits of 2^24 - 6: code 0 */
#define HQ_E2M1_SUM1 16777210.0f      /* 2^24 - 6: p1 = RN(2y + HQ_E2M1_SUM1) */
#define HQ_E2M1_SUM2 16777212.0f      /* 2^24 - 4: p2 = RN(y + HQ_E2M1_SUM2) */
#define HQ_E2M1_SAT_BITS 0x4b800001u  /* the bits of 2^24 + 2: code 7 */
/* min(p1, p2) as bit patterns (positive floats order like their bits: one integer min) for
   y = |x| not NaN: HQ_E2M1_BIAS_BITS + the code for y < 7, where p2 <= 2^24 + 2 (code 7) and
   the saturation never acts -- a kernel that has bounded a whole block (every
   |x * enc| <= RN(amax * enc) < 7, rounding being monotonic) saves it; from 7 on a pattern
   above HQ_E2M1_SAT_BITS (Inf's for Inf), which hq_e2m1_code_nonan clips. */
HQ_HD uint32_t hq_e2m1_biased_bits_lt7(float y) {
#if defined(__CUDA_ARCH__)
  return min(hq_f32_bits(__fmaf_rn(y, 2.0f, HQ_E2M1_SUM1)),
             hq_f32_bits(__fadd_rn(y, HQ_E2M1_SUM2)));
#else
  const uint32_t p1 = hq_f32_bits(hq_add_rn(hq_mul_rn(y, 2.0f), HQ_E2M1_SUM1));
  const uint32_t p2 = hq_f32_bits(hq_add_rn(y, HQ_E2M1_SUM2));
  return p1 < p2 ? p1 : p2;
#endif
}
HQ_HD uint32_t hq_e2m1_code_nonan(float x) {
  const uint32_t b = hq_e2m1_biased_bits_lt7(hq_fabs(x));
  return ((b < HQ_E2M1_SAT_BITS ? b : HQ_E2M1_SAT_BITS) - HQ_E2M1_BIAS_BITS) |
         ((hq_f32_bits(x) >> 28) & 8u);
}

/* FP32 -> E2M1 code with stochastic rounding, from 8 random bits r8 (bits 7..0). This is the
   rule of TE's software fallback (docs/formats.md), hq's definition on every device:
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

/* hq_f32_to_e2m1_sr's magnitude code of a = |x| < 8 (not NaN) in fewer operations, for a
   kernel that has bounded a whole block (every |x * enc| <= RN(amax * enc) < 8), plus
   HQ_E2M1_BIAS_BITS (a kernel packs the biased codes and subtracts the bias once per word).
   x's sign is ignored: a kernel passes its signed product, whose exponent bits are a's, and
   |x| costs no instruction where it is an operand of the multiply-add (making |x| first, to
   take its bits, would cost one per value).
   f is u * 2^-125 (u = r8 / 256), the float of bits r8 << 16 (a byte permute puts the random
   byte there; r8 * 2^-133 exactly, subnormal for r8 < 128, the gradual underflow making it one
   linear scale). step(a), the rule's 0.5 / 1 / 2 below 6 and 2 on [6, 8), is half the power of
   two of a's binade, at least 0.5, so S = 2^125 * step(a) = max(2^124 * E, 2^124) with E that
   power of two: its exponent bits plus 124, at least those of 2^124 (one integer add-and-max,
   no overflow for a < 8); f * S = u * step(a) is exact, so t = RN(a + u * step(a)) is one fused
   multiply-add (t < 10). t then goes onto the E2M1 grid toward zero, the rule's
   floor(t / step(t)) * step(t), by hq_e2m1_biased_bits_lt7's two sums rounded toward zero instead
   of to nearest: RZ(2t + 2^24 - 6) (step 0.5, up to 2) and RZ(t + 2^24 - 4) (step 1 below 4,
   step 2 from 4 on), whose smaller one (the first up to t = 2, the second from 2 on) has the bits
   HQ_E2M1_BIAS_BITS + the code; a min with 2^24 + 2 saturates (t >= 8: the rule's a >= 6 gives
   7 whatever r8). Per value: two integer operations for S, three FP32 operations, one
   three-input integer min. The host runs the same sums, each rounding toward zero taken from
   the rounded-to-nearest sum r (r - c is exact: both are integers of [2^23, 2^25) at most 20
   apart), one step down where r > x + c. */
HQ_HD float hq_add_rz_big(float x, float c) { /* RZ(x + c), x >= 0, 2^23 <= x + c < 2^25 */
#if defined(__CUDA_ARCH__)
  return __fadd_rz(x, c);
#else
  const float r = hq_add_rn(x, c);
  return hq_add_rn(r, -c) > x ? hq_bits_f32(hq_f32_bits(r) - 1u) : r;
#endif
}
HQ_HD uint32_t hq_e2m1_sr_biased_lt8(float x, float f) { /* a = |x|: x's sign is ignored */
  const uint32_t e = hq_f32_bits(x) & 0x7f800000u; /* a's exponent bits, with no |x| made */
#if defined(__CUDA_ARCH__)
  const float S = hq_bits_f32(__viaddmax_u32(e, 0x3e000000u, 0x7d800000u));
  const float t = __fmaf_rn(f, S, fabsf(x)); /* |x|: an operand modifier of the multiply-add */
  return __vimin3_u32(hq_f32_bits(__fmaf_rz(t, 2.0f, HQ_E2M1_SUM1)),
                      hq_f32_bits(__fadd_rz(t, HQ_E2M1_SUM2)), HQ_E2M1_SAT_BITS);
#else
  const uint32_t sb = e + 0x3e000000u;
  const float S = hq_bits_f32(sb > 0x7d800000u ? sb : 0x7d800000u);
  const float t = hq_add_rn(hq_fabs(x), hq_mul_rn(f, S));
  const uint32_t p1 = hq_f32_bits(hq_add_rz_big(hq_mul_rn(t, 2.0f), HQ_E2M1_SUM1));
  const uint32_t p2 = hq_f32_bits(hq_add_rz_big(t, HQ_E2M1_SUM2));
  const uint32_t m = p1 < p2 ? p1 : p2;
  return m < HQ_E2M1_SAT_BITS ? m : HQ_E2M1_SAT_BITS;
#endif
}
/* The code itself from the random byte r8: tests/test_nvfp4_numerics.c checks it against
   hq_f32_to_e2m1_sr on every FP32 value below 8 for two r8 and on a sweep of them for every
   r8. */
HQ_HD uint32_t hq_e2m1_sr_code_lt8(float a, uint32_t r8) {
  return hq_e2m1_sr_biased_lt8(a, hq_bits_f32((r8 & 0xffu) << 16)) - HQ_E2M1_BIAS_BITS;
}

/* --------------------------------------------------------------------------------------------
** Small OCP floats without Inf or NaN ("fn"): FP6 E3M2 / E2M3 (MXFP6) and, by the same generic
** rule, E2M1. A code of 1 + eb + mb bits holds the sign in its top bit, eb exponent bits (bias
** 2^(eb-1) - 1; exponent 0 is subnormal) and mb mantissa bits; every exponent is finite.
** Generic in (eb, mb) so that one definition serves every width; tests/test_mx_numerics.c checks
** each code point against ml_dtypes (float4_e2m1fn, float6_e3m2fn, float6_e2m3fn) and the generic
** E2M1 casts against hq_f32_to_e2m1 / hq_f32_to_e2m1_sr.
*/
#define HQ_E3M2_MAX 28.0f
#define HQ_E2M3_MAX 7.5f

/* code -> FP32, exact. Subnormal codes are m * 2^(1 - bias - mb), an exact FP32 multiply. */
HQ_HD float hq_fpx_to_f32(uint32_t code, int eb, int mb) {
  const uint32_t bias = (1u << (eb - 1)) - 1u, m = code & ((1u << mb) - 1u);
  const uint32_t e = (code >> mb) & ((1u << eb) - 1u);
  const uint32_t s = ((code >> (eb + mb)) & 1u) << 31;
  const float sub = hq_mul_rn((float)m, hq_bits_f32((128u - bias - (uint32_t)mb) << 23));
  const uint32_t mag = e ? ((e + 127u - bias) << 23) | (m << (23 - mb)) : hq_f32_bits(sub);
  return hq_bits_f32(s | mag);
}

/* FP32 -> code, round to nearest even with saturation to +-max (|x| beyond max and +-Inf give
   +-max); NaN gives +max (as hq_f32_to_e2m1). The sign bit is x's (-0.0 keeps it). Below the
   smallest normal 2^(1-bias), |x| * 2^(bias-1+mb) (exact) is rounded to an integer by the add of
   2^23 (RNE): the subnormal code, or the first normal one when it rounds up. Above, the FP32
   mantissa is rounded to mb bits on the bit pattern (a carry moves into the exponent) and the
   exponent rebiased. torchao's _f32_to_floatx_unpacked computes the same codes for every
   non-NaN input. */
HQ_HD uint32_t hq_f32_to_fpx(float x, int eb, int mb) {
  const uint32_t bias = (1u << (eb - 1)) - 1u, maxc = (1u << (eb + mb)) - 1u;
  const uint32_t u = hq_f32_bits(x), a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return maxc;
  uint32_t c;
  if (a < ((128u - bias) << 23)) {
    const float v = hq_mul_rn(hq_bits_f32(a), hq_bits_f32((126u + bias + (uint32_t)mb) << 23));
    c = (uint32_t)hq_add_rn(v, 8388608.0f) - 8388608u;
  } else {
    const uint32_t sh = 23u - (uint32_t)mb;
    const uint32_t t = a + ((1u << (sh - 1u)) - 1u) + ((a >> sh) & 1u);
    c = (t >> sh) - ((127u - bias) << mb);
  }
  if (c > maxc) c = maxc;
  return c | ((u >> 31) << (eb + mb));
}

/* FP32 -> code with stochastic rounding from 8 random bits r8, the rule of hq_f32_to_e2m1_sr for
   any width: u = r8 / 256, a = |x|, step(v) the code spacing at v (2^(1-bias-mb) below the
   smallest normal, else 2^(floor(log2 v) - mb)); t = RN(a + u * step(a)) (u * step exact), the
   code of t truncated onto the grid, saturated to max; sign of x; NaN -> +max. */
HQ_HD uint32_t hq_f32_to_fpx_sr(float x, int eb, int mb, uint32_t r8) {
  const uint32_t bias = (1u << (eb - 1)) - 1u, maxc = (1u << (eb + mb)) - 1u;
  const uint32_t u = hq_f32_bits(x), a = u & 0x7fffffffu, emin = 128u - bias;
  if (a > 0x7f800000u) return maxc;
  uint32_t ea = a >> 23;
  ea = ea < emin ? emin : ea > 250u ? 250u : ea; /* beyond 2^123 everything saturates anyway */
  const float step = hq_bits_f32((ea - (uint32_t)mb) << 23);
  const float t =
      hq_add_rn(hq_bits_f32(a), hq_mul_rn(hq_mul_rn((float)(r8 & 0xffu), 0.00390625f), step));
  const uint32_t tb = hq_f32_bits(t);
  uint32_t c;
  if (tb < (emin << 23))
    c = (uint32_t)hq_mul_rn(t, hq_bits_f32((126u + bias + (uint32_t)mb) << 23));
  else
    c = (tb >> (23 - mb)) - ((127u - bias) << mb);
  if (c > maxc) c = maxc;
  return c | ((u >> 31) << (eb + mb));
}

/* The FP6 element types of MXFP6 by their packed dtype: HQ_E3M2X4 (max 28) or HQ_E2M3X4 (max
   7.5); codes 0..63, sign in bit 5. */
HQ_HD int hq_fp6_ebits(int kind) { return kind == HQ_E3M2X4 ? 3 : 2; }
HQ_HD float hq_fp6_to_f32(uint32_t code, int kind) {
  return hq_fpx_to_f32(code, hq_fp6_ebits(kind), 5 - hq_fp6_ebits(kind));
}
HQ_HD uint32_t hq_f32_to_fp6(float x, int kind) {
  return hq_f32_to_fpx(x, hq_fp6_ebits(kind), 5 - hq_fp6_ebits(kind));
}
HQ_HD uint32_t hq_f32_to_fp6_sr(float x, int kind, uint32_t r8) {
  return hq_f32_to_fpx_sr(x, hq_fp6_ebits(kind), 5 - hq_fp6_ebits(kind), r8);
}

/* Packing of FP6 codes, four in three bytes (HQ_E3M2X4 / HQ_E2M3X4): element n of a row sits at
   bits 6n .. 6n+5 of the row's little-endian bit stream, as E2M1X2 puts element 2i in the low
   nibble. Group g = elements 4g .. 4g+3 (codes c0..c3) is bytes 3g .. 3g+2:
     b0 = c0 | c1 << 6,  b1 = c1 >> 2 | c2 << 4,  b2 = c2 >> 4 | c3 << 2   (each mod 256)
   i.e. the 24-bit little-endian word c0 | c1 << 6 | c2 << 12 | c3 << 18 (docs/formats.md). */
HQ_HD uint32_t hq_fp6_pack4(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  return (c0 & 63u) | (c1 & 63u) << 6 | (c2 & 63u) << 12 | (c3 & 63u) << 18;
}
HQ_HD uint32_t hq_fp6_code(const uint8_t *row, int64_t n) {
  const uint8_t *g = row + (n >> 2) * 3;
  const uint32_t w = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16;
  return (w >> (6 * (n & 3))) & 63u;
}

/* HQ_I4X2 (hq/plugin.h): two signed 4-bit integers per byte, element 2i in the low nibble and
   2i+1 in the high nibble, two's complement (-8..7). pack stores the low 4 bits of each value;
   get sign-extends element i of a packed row p. */
HQ_HD uint8_t hq_i4x2_pack(int lo, int hi) {
  return (uint8_t)(((unsigned)lo & 0xFu) | (((unsigned)hi & 0xFu) << 4));
}
HQ_HD int hq_i4x2_get(const uint8_t *p, int64_t i) {
  const int v = (p[i >> 1] >> ((i & 1) * 4)) & 0xF;
  return v - ((v & 8) << 1);
}

/* --------------------------------------------------------------------------------------------
** The random stream's per-operation offset (hq_call.offset; docs/embedding.md, section 11): the
** one rule the core applies on the host and a kernel applies on the device when a graph replay
** supplies the step (hq_call.offset_dev, ABI 2.6), so both give the same offset.
*/
/* SplitMix64's output function: a bijection whose outputs of nearby inputs look unrelated. */
HQ_HD uint64_t hq_splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* The offset of the count-th operation (from 0) since the context's step was set to `step`, of
   the role whose key is role_key (hq_call.role_key). */
HQ_HD uint64_t hq_rng_offset(uint64_t step, uint64_t role_key, uint64_t count) {
  return hq_splitmix64(role_key ^ hq_splitmix64(step ^ hq_splitmix64(count)));
}

#endif /* HQ_NUMERICS_H */
