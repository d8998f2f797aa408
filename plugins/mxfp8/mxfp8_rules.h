/*
** mxfp8_rules.h -- the MXFP8 rules (scale code from a block amax, element cast, scale-buffer
** shapes and index functions), shared by the plugin's CPU reference and its CUDA kernels.
** Private to the plugin (not installed); host + device.
*/
#ifndef HQ_MXFP8_RULES_H
#define HQ_MXFP8_RULES_H

#include "hq/numerics.h"

/* --------------------------------------------------------------------------------------------
** MXFP8: E8M0 scales (docs/formats.md)
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
#define HQ_MXFP8_BLOCK 32

/* The E8M0 scale code of a block from its amax (max |x| with NaN ignored, Inf included):
   steps 2 and 3 of docs/formats.md. kind is the element hq_dtype, HQ_E4M3 or HQ_E5M2.
   hq_mxfp8_scale_t is step 2, the value the code rounds up (the CUDA kernels round it by
   mx_cvt_cuda.h's hq_cuda_e8m0_rp: the instruction on Blackwell, the same bits). */
HQ_HD float hq_mxfp8_scale_t(float amax, int kind) {
  return hq_mul_rn(amax, hq_rcp_rn(hq_fp8_max(kind)));
}
HQ_HD uint8_t hq_mxfp8_scale_code(float amax, int kind) {
  return hq_e8m0_from_f32_rp(hq_mxfp8_scale_t(amax, kind));
}

/* One element: q = fp8_rne_satfinite(RN(x * mult)) with mult = hq_e8m0_quant_mult(e), kind
   HQ_E4M3 or HQ_E5M2. NaN -> 0x7F; +-Inf -> +-max (its block has e = 0xFE). */
HQ_HD uint8_t hq_mxfp8_quantize(float x, float mult, int kind) {
  return hq_f32_to_fp8(hq_mul_rn(x, mult), kind);
}

/* One element back: RN(fp32(q) * 2^(e-127)), kind HQ_E4M3 or HQ_E5M2. */
HQ_HD float hq_mxfp8_dequantize(uint8_t q, uint8_t e, int kind) {
  return hq_mul_rn(hq_fp8_to_f32(q, kind), hq_e8m0_to_f32(e));
}

/* hq_mxfp8_dequantize by a shorter route (the CUDA dequantize's fast path), equal to it for every
   code that is neither NaN nor (E5M2) Inf, i.e. !hq_fp8_code_special(q, kind), and every
   e != 0xFF; scale_inv = hq_e8m0_to_f32(e). The code's sign bit and its 7 other bits shifted
   into an FP32 word give an FP32 value equal to the code's value times 2^-120 (E4M3) or 2^-112
   (E5M2) exactly -- a subnormal code lands on an FP32 subnormal with the same digits --; the
   multiply by 2^120 / 2^112 restores the code's value exactly, and the second multiply is the
   rule's own. tests/test_mxfp8_numerics.c checks every (q, e) pair. */
HQ_HD float hq_mxfp8_dequantize_fast(uint8_t q, float scale_inv, int kind) {
  const int e5 = kind == HQ_E5M2;
  const uint32_t w = ((uint32_t)(q & 0x80u) << 24) | ((uint32_t)(q & 0x7fu) << (e5 ? 21 : 20));
  return hq_mul_rn(hq_mul_rn(hq_bits_f32(w), e5 ? 0x1p112f : 0x1p120f), scale_inv);
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
     compact (swizzled = 0, HQ_SCALE_LAYOUT_OUTER_MAJOR): row-major [roundup(M,128)]
       [roundup(K/32,4)]: i * roundup(K/32,4) + kb
     swizzled (HQ_SCALE_LAYOUT_SWIZZLED): hq_swizzle_offset(r = i, c = kb, cols = K/32). */
HQ_HD int64_t hq_mxfp8_row_scale_idx(int64_t i, int64_t kb, int64_t K, int swizzled) {
  if (swizzled) return hq_swizzle_offset(i, kb, K / 32);
  return i * hq_mxfp8_row_scale_cols(K) + kb;
}

/* Byte offset, in the columnwise_scale_inv buffer of an [M, K] tensor, of the scale of M-block
   mb, column j (elements (32mb .. 32mb+31, j)).
     compact (swizzled = 0, HQ_SCALE_LAYOUT_BLOCK_MAJOR): row-major [roundup(M/32,4)]
       [roundup(K,128)]: mb * roundup(K,128) + j
     swizzled (HQ_SCALE_LAYOUT_SWIZZLED): the compact [M/32][K] matrix is used as its
       transpose, r = column j, c = M-block mb: hq_swizzle_offset(r = j, c = mb, cols = M/32). */
HQ_HD int64_t hq_mxfp8_col_scale_idx(int64_t mb, int64_t j, int64_t M, int64_t K, int swizzled) {
  if (swizzled) return hq_swizzle_offset(j, mb, M / 32);
  return mb * hq_mxfp8_col_scale_cols(K) + j;
}

/* Either scale buffer as one matrix whose rows run along M, [hq_mxfp8_scale_rows,
   hq_mxfp8_scale_cols] (padding included: the buffer's shape), one row per hq_mxfp8_scale_m_div
   rows of M; entry (a, b) is the rowwise scale of row a, K-block b, or the columnwise scale of
   M-block a, column b, at byte hq_mxfp8_scale_idx() in either layout. The compact layout stores
   it row-major, so a shard's first M / m_div rows concatenate along M into the whole tensor's;
   they are the FSDP form of a swizzled buffer (plugin ABI 2.4), which cannot be concatenated. */
HQ_HD int64_t hq_mxfp8_scale_m_div(int colwise) { return colwise ? HQ_MXFP8_BLOCK : 1; }
HQ_HD int64_t hq_mxfp8_scale_rows(int colwise, int64_t M) {
  return colwise ? hq_mxfp8_col_scale_rows(M) : hq_mxfp8_row_scale_rows(M);
}
HQ_HD int64_t hq_mxfp8_scale_cols(int colwise, int64_t K) {
  return colwise ? hq_mxfp8_col_scale_cols(K) : hq_mxfp8_row_scale_cols(K);
}
HQ_HD int64_t hq_mxfp8_scale_idx(int colwise, int64_t a, int64_t b, int64_t M, int64_t K,
                                 int swizzled) {
  return colwise ? hq_mxfp8_col_scale_idx(a, b, M, K, swizzled)
                 : hq_mxfp8_row_scale_idx(a, b, K, swizzled);
}

/* The FSDP form of a swizzled scale buffer: its first hq_mxfp8_form_rows rows of
   hq_mxfp8_scale_cols bytes, row-major (the padding rows are not in it). */
HQ_HD int64_t hq_mxfp8_form_rows(int colwise, int64_t M) {
  return M / hq_mxfp8_scale_m_div(colwise);
}
/* Entry (a, b) moved between the swizzled scale buffer swz of an [M, K] tensor and its form
   (`rows` rows of C bytes): to_form copies it into the form, else into the buffer, a padding
   row (a >= rows) getting 0. A permutation of bytes, so the host loop and the kernel give the
   same bytes. */
HQ_HD void hq_mxfp8_form_move(uint8_t *swz, uint8_t *form, int colwise, int64_t M, int64_t K,
                              int64_t rows, int64_t C, int64_t a, int64_t b, int to_form) {
  const int64_t at = hq_mxfp8_scale_idx(colwise, a, b, M, K, 1);
  if (to_form) form[a * C + b] = swz[at];
  else swz[at] = a < rows ? form[a * C + b] : (uint8_t)0;
}

#endif /* HQ_MXFP8_RULES_H */
