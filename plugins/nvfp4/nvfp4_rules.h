/*
** nvfp4_rules.h -- the NVFP4 rules (global and block scales, element casts, the RHT, the
** Philox stream of stochastic rounding, buffer index functions), shared by the plugin's CPU
** reference and its CUDA kernels. Private to the plugin (not installed); host + device.
*/
#ifndef HQ_NVFP4_RULES_H
#define HQ_NVFP4_RULES_H

#include "hq/numerics.h"

/* --------------------------------------------------------------------------------------------
** NVFP4: E4M3 block scales, global scale, RHT, stochastic rounding (docs/formats.md); the E2M1
** element codecs (hq_e2m1_to_f32, hq_f32_to_e2m1, hq_f32_to_e2m1_sr) are generic and stay in
** hq/numerics.h.
*/

/*
** The rules, in TE's operation order (docs/formats.md and 9.3). A is the direction's global amax
** (max |x| with NaN ignored; with RHT the columnwise A is taken over the BF16-rounded transformed
** values), a_b a 16-element block's amax, x an element:
**   S_enc = min(RN(2688 / A), FLT_MAX); 1 if A == 0 or S_enc == 0   global_encode_scale
**   S_dec = RN(1 / S_enc)                                             global_decode_scale
**   m     = RN(S_enc * RN(1/6))                   (once per direction) block_scale_mult
**   sf    = E4M3_RNE_satfinite(min(RN(a_b * m), FLT_MAX))  (stored)    block_scale
**   enc   = min(RN(1 / RN(fp32(sf) * S_dec)), FLT_MAX); FLT_MAX if 0  encode_mult
**   q     = E2M1(RN(x * enc)), RNE-satfinite or stochastic             quantize, quantize_sr
**   x'    = RN(e2m1(q) * RN(RN(fp32(sf) * A) * RN(1/2688)))            decode_mult, dequantize
**   raw   = e2m1(q) * fp32(sf)  (exact; HQ_CALL_DEQ_RAW, a GEMM operand) raw_mult
**   f     = RN(A * RN(1/2688))  (the per-tensor factor, tensor_factor()) tensor_factor
** (function names without their hq_nvfp4_ prefix).
** The dequantizer uses A / 2688 (as TE's dequantize kernel and GEMM alpha do), not S_dec.
** Options (the _k functions take the scale type): scale_dtype = ue5m3 puts UE5M3 for E4M3 and
** 688128 = 6 * 114688 for 2688 (TE's UE5M3 prototype); global_scale = row takes A per stored
** row (TE's row-scaled NVFP4: a row of x rowwise, a column of x columnwise); global_scale =
** none makes S_enc = 1 and x' = RN(e2m1(q) * fp32(sf)).
*/
#define HQ_NVFP4_BLOCK 16
#define HQ_NVFP4_RHT_SIGNS 0xD7E8u          /* TE's fixed sign vector; bit i set: s_i = -1 */

/* --------------------------------------------------------------------------------------------
** UE5M3: an unsigned 8-bit float (no sign bit), 5 exponent bits with bias 15 and 3 mantissa
** bits; 0xFF is the one NaN and there is no Inf, so the top binade (codes 0xF8..0xFE) is finite:
** max 0xFE = 1.75 * 2^16 = 114688, smallest normal 2^-14 (0x08), subnormals m * 2^-17. The
** block scale of nvfp4's `scale_dtype = ue5m3` (TE's prototype kFloat8UE5M3; docs/formats.md).
** Kept here, apart from the generic codecs of hq/numerics.h: it is a scale type of this format.
*/
#define HQ_UE5M3_MAX 114688.0f
#define HQ_UE5M3_NAN 0xFFu

/* Decode, exact: m * 2^-17 for e = 0, (1 + m/8) * 2^(e-15) otherwise; 0xFF is NaN. */
HQ_HD float hq_ue5m3_to_f32(uint8_t q) {
  const uint32_t e = (uint32_t)q >> 3, m = q & 0x7u;
  if (q == HQ_UE5M3_NAN) return hq_bits_f32(0x7fc00000u);
  if (e == 0) return hq_mul_rn((float)m, 7.62939453125e-06f); /* m * 2^-17 */
  return hq_bits_f32(((e + 112u) << 23) | (m << 20));
}

/* Encode, round to nearest even with saturation to 114688 (Inf too); NaN -> 0xFF; zero and
   every negative value -> 0 (an unsigned scale: the block scales this encodes are >= 0). The
   arithmetic is hq_f32_to_e4m3's with this format's widths: an integer RNE of the FP32
   mantissa to 3 bits in the normal range, |x| * 2^17 rounded to an integer below 2^-14. */
HQ_HD uint8_t hq_f32_to_ue5m3(float x) {
  const uint32_t u = hq_f32_bits(x), a = u & 0x7fffffffu;
  uint32_t n = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (112u << 3);
  uint32_t small = a < 0x38800000u;                                   /* below 2^-14 */
  uint32_t as = hq_sel(small, a, 0x38800000u);
  uint32_t sub = hq_f32_bits(hq_add_rn(hq_mul_rn(hq_bits_f32(as), 131072.0f), 8388608.0f)) -
                 0x4b000000u;
  uint32_t c = hq_sel(small, sub, n);
  c = hq_sel(a > 0x47e00000u, 0xfeu, c);                              /* > 114688, Inf */
  c = hq_sel(u >> 31, 0u, c);                                         /* negative, -0 */
  return (uint8_t)hq_sel(a > 0x7f800000u, HQ_UE5M3_NAN, c);
}

/* --------------------------------------------------------------------------------------------
** The block scale type (option scale_dtype) and the global scale (option global_scale).
*/
#define HQ_NVFP4_SCALE_E4M3 0   /* E4M3 block scales, max 448 (NVFP4 as shipped) */
#define HQ_NVFP4_SCALE_UE5M3 1  /* UE5M3 block scales, max 114688 */
#define HQ_NVFP4_GLOBAL_TENSOR 0 /* one FP32 amax per direction */
#define HQ_NVFP4_GLOBAL_ROW 1    /* one FP32 amax per stored row: per row of x (rowwise), per
                                    column of x (columnwise) */
#define HQ_NVFP4_GLOBAL_NONE 2   /* none: S_enc = 1 (UE5M3 only) */

HQ_HD float hq_nvfp4_scale_to_f32(uint8_t sf, int kind) {
  return kind == HQ_NVFP4_SCALE_UE5M3 ? hq_ue5m3_to_f32(sf) : hq_e4m3_to_f32(sf);
}
HQ_HD uint8_t hq_nvfp4_scale_from_f32(float p, int kind) {
  return kind == HQ_NVFP4_SCALE_UE5M3 ? hq_f32_to_ue5m3(p) : hq_f32_to_e4m3(p);
}
/* 6 * the scale type's max: the numerator of S_enc (2688 for E4M3, 688128 for UE5M3), and
   RN(1 / that), the dequantizer's constant (the double quotient rounded once to FP32, as TE's
   (float)(1.0 / (6.0 * 448.0))). */
HQ_HD float hq_nvfp4_global_range(int kind) {
  return kind == HQ_NVFP4_SCALE_UE5M3 ? 688128.0f : 2688.0f;
}
HQ_HD float hq_nvfp4_global_range_rcp(int kind) {
  return kind == HQ_NVFP4_SCALE_UE5M3 ? (float)(1.0 / 688128.0) : (float)(1.0 / 2688.0);
}

/* Global encode scale S_enc from the amax A (>= 0) of a direction (global_scale = tensor) or of
   one stored row (global_scale = row): RN(range / A) clamped to FLT_MAX (as fminf: a NaN
   quotient also gives FLT_MAX); 1 when A == 0 or the quotient is 0 (A = Inf). With
   global_scale = none S_enc is 1 (TE's quantizer without an amax tensor). */
HQ_HD float hq_nvfp4_global_encode_scale_k(float amax, int kind) {
  if (amax == 0.0f) return 1.0f;
  float s = hq_div_rn(hq_nvfp4_global_range(kind), amax);
  if (!(s <= FLT_MAX)) s = FLT_MAX;
  if (s == 0.0f) return 1.0f;
  return s;
}
HQ_HD float hq_nvfp4_global_encode_scale(float amax) {
  return hq_nvfp4_global_encode_scale_k(amax, HQ_NVFP4_SCALE_E4M3);
}

/* Global decode scale S_dec = RN(1 / S_enc) (TE: 1.0f / S_enc, or 1.0 / S_enc in double rounded
   to float: the same value). */
HQ_HD float hq_nvfp4_global_decode_scale(float s_enc) { return hq_rcp_rn(s_enc); }

/* The per-direction (per-row with global_scale = row) multiplier m = RN(S_enc * RN(1/6)) of
   the block scale rule. */
HQ_HD float hq_nvfp4_block_scale_mult(float s_enc) { return hq_mul_rn(s_enc, hq_rcp_rn(6.0f)); }

/* The stored block scale sf = SCALE_RNE_satfinite(min(RN(a_b * m), FLT_MAX)), SCALE the
   option's scale type. */
HQ_HD uint8_t hq_nvfp4_block_scale_k(float block_amax, float m, int kind) {
  float p = hq_mul_rn(block_amax, m);
  if (p > FLT_MAX) p = FLT_MAX;
  return hq_nvfp4_scale_from_f32(p, kind);
}
HQ_HD uint8_t hq_nvfp4_block_scale(float block_amax, float m) {
  return hq_nvfp4_block_scale_k(block_amax, m, HQ_NVFP4_SCALE_E4M3);
}

/* The block's encode multiplier enc = min(RN(1 / RN(fp32(sf) * S_dec)), FLT_MAX); FLT_MAX when
   the product is 0 (a zero or tiny block: its codes may saturate but dequantize to 0). */
HQ_HD float hq_nvfp4_encode_mult_k(uint8_t sf, float s_dec, int kind) {
  float d = hq_mul_rn(hq_nvfp4_scale_to_f32(sf, kind), s_dec);
  /* 0 and NaN (the NaN scale codes) take FLT_MAX, what the reciprocal below gives a NaN too;
     said here, a kernel's threads of those codes take no out-of-line reciprocal */
  if (d == 0.0f || d != d) return FLT_MAX;
  /* RN(1 / d) by the correctly rounded reciprocal: the IEEE quotient 1 / d, the same bits (the
     device's reciprocal sequence is shorter than its division's) */
  float e = hq_rcp_rn(d);
  return e < FLT_MAX ? e : FLT_MAX;
}
HQ_HD float hq_nvfp4_encode_mult(uint8_t sf, float s_dec) {
  return hq_nvfp4_encode_mult_k(sf, s_dec, HQ_NVFP4_SCALE_E4M3);
}

/* hq_nvfp4_encode_mult_k by a table of one S_dec (a stored row's, with global_scale = row),
   for kernels that make many blocks under it: every positive finite scale value is 2^k * y_g
   with y_g = 1 + g/8 (g = 0..7; E4M3 and UE5M3 subnormals too: m * 2^-9 is 2^k * 1, 1.5, 1.25
   or 1.75), and while every product and quotient of the rule stays an FP32 normal, scaling by
   2^k commutes with both roundings: RN(2^k y_g S_dec) = 2^k RN(y_g S_dec) and
   RN(1 / (2^k D)) = 2^-k RN(1 / D). So enc = 2^-k * tab[g] with tab[g] =
   hq_nvfp4_encode_mult_k(code of y_g, S_dec) (hq_nvfp4_encode_table), the same bits as the
   rule, when S_dec is in [2^-100, 2^100] (hq_nvfp4_encode_table_ok): scale values lie in
   [2^-17, 2^17), so the products in [2^-117, 2^118) and their reciprocals are normal and below
   FLT_MAX. A code whose value is 0 or not positive gets the rule. tests/test_nvfp4_numerics.c
   compares it with the rule for every code and scale type over S_dec of every binade of the
   range and its edges. */
#define HQ_NVFP4_E4M3_ONE_CODE 0x38u /* E4M3 1.0; + g: 1 + g/8 */
HQ_HD int hq_nvfp4_encode_table_ok(float s_dec) {
  return s_dec >= 0x1p-100f && s_dec <= 0x1p100f;
}
HQ_HD float hq_nvfp4_encode_table(int g, float s_dec) {
  return hq_nvfp4_encode_mult_k((uint8_t)(HQ_NVFP4_E4M3_ONE_CODE + (uint32_t)g), s_dec,
                                HQ_NVFP4_SCALE_E4M3);
}
HQ_HD float hq_nvfp4_encode_mult_tab(uint8_t sf, const float tab[8], float s_dec, int kind) {
  const float v = hq_nvfp4_scale_to_f32(sf, kind);
  if (!(v > 0.0f)) return hq_nvfp4_encode_mult_k(sf, s_dec, kind);
  const uint32_t b = hq_f32_bits(v); /* normal: exponent field b >> 23 in [110, 143] */
  return hq_mul_rn(tab[(b >> 20) & 7u], hq_bits_f32((254u - (b >> 23)) << 23));
}

/* One element: q = E2M1_RNE_satfinite(RN(x * enc)), or with stochastic rounding from r8. */
HQ_HD uint32_t hq_nvfp4_quantize(float x, float enc) { return hq_f32_to_e2m1(hq_mul_rn(x, enc)); }
HQ_HD uint32_t hq_nvfp4_quantize_sr(float x, float enc, uint32_t r8) {
  return hq_f32_to_e2m1_sr(hq_mul_rn(x, enc), r8);
}

/* Dequantize multiplier of a block: RN(RN(fp32(sf) * A) * RN(1/range)) (TE dequantize_nvfp4:
   scale * amax * (float)(1.0 / (6.0 * 448.0)), left to right; TE's UE5M3 prototype puts
   114688 for 448); an element is then RN(e2m1(q) * mult). A is the direction's amax, or the
   stored row's with global_scale = row. With global_scale = none the multiplier is fp32(sf)
   (hq_nvfp4_raw_mult_k). */
HQ_HD float hq_nvfp4_decode_mult_k(uint8_t sf, float amax, int kind) {
  return hq_mul_rn(hq_mul_rn(hq_nvfp4_scale_to_f32(sf, kind), amax),
                   hq_nvfp4_global_range_rcp(kind));
}
HQ_HD float hq_nvfp4_decode_mult(uint8_t sf, float amax) {
  return hq_nvfp4_decode_mult_k(sf, amax, HQ_NVFP4_SCALE_E4M3);
}
HQ_HD float hq_nvfp4_dequantize(uint32_t code, float decode_mult) {
  return hq_mul_rn(hq_e2m1_to_f32(code), decode_mult);
}

/* The RAW value of an element (HQ_CALL_DEQ_RAW, what a GEMM multiplies): e2m1(q) * fp32(sf),
   i.e. hq_nvfp4_dequantize(code, hq_nvfp4_raw_mult(sf)) -- no global amax, no inverse RHT. The
   product is exact in FP32 and in BF16: e2m1 magnitudes have at most 2 significant bits, E4M3
   scales at most 4, so a raw value has at most 6 significant bits, and its magnitude is 0 or in
   [2^-10, 2688] (0.5 * 2^-9 .. 6 * 448). */
HQ_HD float hq_nvfp4_raw_mult(uint8_t sf) { return hq_e4m3_to_f32(sf); }
/* ... of either scale type: with UE5M3 scales (4 significant bits, 2^-17 .. 114688) a raw value
   also has at most 6 significant bits, magnitudes 0 or 2^-18 .. 688128: exact in BF16. */
HQ_HD float hq_nvfp4_raw_mult_k(uint8_t sf, int kind) { return hq_nvfp4_scale_to_f32(sf, kind); }

/* The raw value by a shorter route (the CUDA dequantize's fast path), equal to
   hq_nvfp4_dequantize(q, hq_nvfp4_raw_mult(sf)) for every code q (bits 0..3 of `code`; higher
   bits ignored) and every scale whose fp32(sf) = sf_val is not NaN: the code's sign bit moved to
   bit 31 and its 3 magnitude bits to bits 22..24 make an FP32 value equal to the E2M1 value
   times 2^-126 exactly (the code 0.5 lands on the FP32 subnormal 2^-127); times 2^126 it is the
   E2M1 value, exactly, and the second multiply is the rule's. tests/test_nvfp4_numerics.c checks
   every (code, scale) pair. */
HQ_HD float hq_nvfp4_raw_fast(uint32_t code, float sf_val) {
  const uint32_t w = ((code & 8u) << 28) | ((code & 7u) << 22);
  return hq_mul_rn(hq_mul_rn(hq_bits_f32(w), 0x1p126f), sf_val);
}

/* The per-tensor factor of a storage (tensor_factor(): the global decode scale that multiplies
   every raw value), from its amax A: the decode multiplier hq_nvfp4_decode_mult gives a block
   whose scale is 1.0 (E4M3 code 0x38), RN(A * RN(1/2688)). The same function, so the same
   constant and order, as the dequantizer; but the dequantizer rounds RN(fp32(sf) * A) first,
   so RN(raw * factor) equals the dequantized value bit for bit only where fp32(sf) is a power
   of two (and sf * A neither overflows nor underflows); elsewhere they differ by a few ulps. */
#define HQ_NVFP4_E4M3_ONE 0x38u
#define HQ_NVFP4_UE5M3_ONE 0x78u /* 1.0 as UE5M3: e = 15, m = 0 */
HQ_HD float hq_nvfp4_tensor_factor_k(float amax, int kind) {
  return hq_nvfp4_decode_mult_k(
      (uint8_t)(kind == HQ_NVFP4_SCALE_UE5M3 ? HQ_NVFP4_UE5M3_ONE : HQ_NVFP4_E4M3_ONE), amax,
      kind);
}
HQ_HD float hq_nvfp4_tensor_factor(float amax) {
  return hq_nvfp4_tensor_factor_k(amax, HQ_NVFP4_SCALE_E4M3);
}

/* max |v_i| over n values, NaN ignored, +-Inf counted (docs/formats.md): a max over the FP32 bit
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
   s_i = -1 where bit i of sign_mask is set (nvfp4's `rht = true`; the storage's descriptor says
   transform HQ_TRANSFORM_RHT16 with the mask as transform_param; docs/formats.md 5.3 has worked
   examples). hq's fixed FP32 evaluation order, the one definition of these bits, which every
   CPU and GPU implementation follows (TE's tensor-core accumulation order is unspecified, so
   TE's bits are not reproducible here):
     0. v_i = RN_bf16(g_i)            (BF16 inputs are unchanged; f32/f16 are rounded to BF16)
     1. v_i = -v_i where bit i is set (exact: the sign bit flips)
     2. butterfly stages h = 1, 2, 4, 8 in this order; in each, for i = 0..15 with (i & h) == 0:
        (v_i, v_{i+h}) = (RN(v_i + v_{i+h}), RN(v_i - v_{i+h}))
     3. v_i = RN(v_i * 0.25)          (exact unless |v_i| / 4 falls below 2^-126, FP32's
                                       subnormal range, where RN rounds it; the CUDA kernel
                                       folds this step into its block multipliers and makes
                                       every block where that could change a byte by these
                                       steps as written)
     4. v_i = RN_bf16(v_i)            (the BF16 the columnwise amax and quantization see)
   In exact arithmetic the matrix diag(s) H16 / 4 is orthogonal; its inverse is its transpose
   H16 diag(s) / 4 (hq_nvfp4_rht16_inverse, for dequantize). So a GEMM multiplies two RHT copies
   made with the same mask in the transformed domain, where the product over M is unchanged, and
   the raw dequantize (HQ_CALL_DEQ_RAW) stays there. A NaN input makes NaN outputs whose sign
   and payload are not defined (they differ between compilers and devices); any NaN is ignored
   by amax and quantizes to +6, so the quantized bytes do not depend on them. */
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
   (W0, W1) between rounds. hq_philox_round_keys makes the ten rounds' keys once (round r's
   (k0 + r*W0, k1 + r*W1) mod 2^32 in rk[2r], rk[2r+1]) and hq_philox4x32_10_rk runs the rounds
   from them: a caller drawing many blocks under one key (the CUDA kernels, where they are
   kernel parameters) bumps no key per block; hq_philox4x32_10 is the two in a row. */
#define HQ_PHILOX_M0 0xD2511F53u
#define HQ_PHILOX_M1 0xCD9E8D57u
#define HQ_PHILOX_W0 0x9E3779B9u
#define HQ_PHILOX_W1 0xBB67AE85u
HQ_HD void hq_philox_round_keys(const uint32_t key[2], uint32_t rk[20]) {
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    rk[2 * r] = k0;
    rk[2 * r + 1] = k1;
    k0 += HQ_PHILOX_W0;
    k1 += HQ_PHILOX_W1;
  }
}
HQ_HD void hq_philox4x32_10_rk(const uint32_t ctr[4], const uint32_t rk[20], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)HQ_PHILOX_M0 * c0, p1 = (uint64_t)HQ_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ rk[2 * r];
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ rk[2 * r + 1];
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
HQ_HD void hq_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t rk[20];
  hq_philox_round_keys(key, rk);
  hq_philox4x32_10_rk(ctr, rk, out);
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
   hq_nvfp4_sr_byte(out, e) = (out[e / 4] >> (8 * (e % 4))) & 0xff, as u = byte / 256.
   hq_nvfp4_sr_keys makes the seed's round keys once, hq_nvfp4_sr_bits_rk draws from them. */
HQ_HD void hq_nvfp4_sr_keys(uint64_t seed, uint32_t rk[20]) {
  uint32_t key[2];
  key[0] = (uint32_t)seed;
  key[1] = (uint32_t)(seed >> 32);
  hq_philox_round_keys(key, rk);
}
HQ_HD void hq_nvfp4_sr_bits_rk(const uint32_t rk[20], uint64_t offset, uint32_t colwise,
                               uint64_t block, uint32_t out[4]) {
  uint32_t ctr[4];
  ctr[0] = (uint32_t)block;
  ctr[1] = ((uint32_t)(block >> 32) & 0x7fffffffu) | ((colwise & 1u) << 31);
  ctr[2] = (uint32_t)offset;
  ctr[3] = (uint32_t)(offset >> 32);
  hq_philox4x32_10_rk(ctr, rk, out);
}
/* the same from the seed */
HQ_HD void hq_nvfp4_sr_bits(uint64_t seed, uint64_t offset, uint32_t colwise, uint64_t block,
                            uint32_t out[4]) {
  uint32_t rk[20];
  hq_nvfp4_sr_keys(seed, rk);
  hq_nvfp4_sr_bits_rk(rk, offset, colwise, block, out);
}
HQ_HD uint32_t hq_nvfp4_sr_byte(const uint32_t bits[4], int e) {
  return (bits[e >> 2] >> (8 * (e & 3))) & 0xffu;
}

/* Layouts (docs/formats.md). Element (i, k) of the logical [M, K] tensor:
   - rowwise data [M, K/2]: byte i*(K/2) + k/2, low nibble when k is even;
   - columnwise data [K, M/2] (transposed): byte k*(M/2) + i/2, low nibble when i is even;
   - rowwise scale_inv [roundup(M,128), roundup(K/16,4)]: entry S[i][k/16];
   - columnwise scale_inv [roundup(K,128), roundup(M/16,4)]: entry S[k][i/16].
   A scale matrix S[r][b] of a direction whose stored data has rows of C elements has
   ld = roundup(C/16, 4) entries per row; its byte offset is
     compact (HQ_SCALE_LAYOUT_OUTER_MAJOR, swizzle = 0):  r * ld + b
     swizzled (HQ_SCALE_LAYOUT_SWIZZLED, swizzle = 1):
               ((r/128) * (ld/4) + b/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + b%4
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

#endif /* HQ_NVFP4_RULES_H */
