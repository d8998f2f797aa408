/*
** fp8_block_rules.h -- the FP8 block-scaling rules (block counts, scale shapes and index
** functions, the block scale), shared by the plugin's CPU reference and its CUDA kernels.
** Private to the plugin (not installed); host + device.
*/
#ifndef HQ_FP8_BLOCK_RULES_H
#define HQ_FP8_BLOCK_RULES_H

#include "hq/numerics.h"
#include "fp8_scale.h"

/* --------------------------------------------------------------------------------------------
** FP8 block scaling (docs/formats.md)
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
** GEMM-ready FP32 scale_inv layouts (docs/formats.md). Each function maps a logical element
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
/* (the scale buffers' padded dim 1 is hq_roundup(n, 4), hq/numerics.h) */

/* scale_inv shape [d0, d1] of one direction (colwise 0/1, two_d 0/1) of a [M, K] tensor, and the
   unpadded extent n1 <= d1 of dim 1 (entries [.][n1, d1) are padding). */
HQ_HD void hq_fp8b_scale_shape(int64_t M, int64_t K, int colwise, int two_d, int64_t *d0,
                               int64_t *d1, int64_t *n1) {
  /* docs/formats.md's uniform rule on the copy as the GEMM reads it, [outer, inner]: 1-D is
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

/* The block scale of docs/formats.md: value_for_inf is the max of the input dtype `src_dtype`
   (HQ_F32 / HQ_F16 / HQ_BF16), max_fp8 that of the element dtype `elem` (HQ_E4M3 / HQ_E5M2). */
HQ_HD float hq_fp8b_scale(float amax, int elem, int pow2, float epsilon, int src_dtype) {
  return hq_scale_from_amax(amax, hq_fp8_max(elem), pow2, epsilon, hq_hp_max(src_dtype));
}

#endif /* HQ_FP8_BLOCK_RULES_H */
