/*
** fp8_block_gemm.h -- the fp8_block module's own GEMM on a device (fp8_block_gemm.cu), as
** fp8_block.c's gemm op calls it.
*/
#ifndef HQ_FP8_BLOCK_GEMM_H
#define HQ_FP8_BLOCK_GEMM_H

#include <stdint.h>

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CTA makes an FP8B_GEMM_TILE square of D, the grid's x over m, its y (at most 65535) over n. */
#define FP8B_GEMM_TILE 32

/* One k-contiguous operand: codes [outer, k] bytes (16-byte aligned, k % 16 == 0), scale_inv
   indexed as a rowwise storage of [outer, k] (hq_fp8b_row1d_index / hq_fp8b_row2d_index). */
typedef struct fp8b_gemm_operand {
  const uint8_t *q;
  const float *scale;
  hq_dtype elem; /* HQ_E4M3 or HQ_E5M2 */
  int two_d;
} fp8b_gemm_operand;

/* p's D = alpha * sum over 128-blocks of k of (sa * sb) * (the block's FP8 product) (+ beta * D)
   (+ bias), one launch on call->stream. */
int fp8b_cuda_gemm(const hq_call *call, const hq_gemm_problem *p, const fp8b_gemm_operand *a,
                   const fp8b_gemm_operand *b);

#ifdef __cplusplus
}
#endif

#endif
