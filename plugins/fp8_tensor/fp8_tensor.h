/*
** fp8_tensor.h -- shared between the fp8_tensor plugin's CPU reference (fp8_tensor.c) and its
** CUDA kernels (fp8_tensor.cu). Not installed.
*/
#ifndef HQ_FP8_TENSOR_H
#define HQ_FP8_TENSOR_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp8t_cfg {
  int kind;          /* HQ_FP8_E4M3 / HQ_FP8_E5M2 */
  int delayed;       /* scaling = delayed */
  int pow2;          /* power_2_scales */
  float epsilon;     /* amax_epsilon */
  int history_len;   /* amax_history_len (delayed) */
  int margin;        /* margin (delayed) */
  int algo_max;      /* amax_compute_algo = max (delayed) */
} fp8t_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, amax. */
enum { FP8T_DATA = 0, FP8T_SCALE_INV = 1, FP8T_AMAX = 2 };

/* GPU quantize of src into row ([M,K]) and/or col ([K,M]) bytes, one amax pass and one fused
   cast(+transpose) pass on call->stream. scale_inv/amax of each present storage are written.
   Any pointer of an absent direction is NULL. */
int fp8t_cuda_quantize(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src,
                       uint8_t *row, uint8_t *col, float *scale_inv, float *amax,
                       float *col_scale_inv, float *col_amax);
/* GPU dequantize: q is [M,K] (transposed == 0) or [K,M] (transposed == 1). */
int fp8t_cuda_dequantize(const fp8t_cfg *cfg, const hq_call *call, const uint8_t *q,
                         int transposed, const float *scale_inv, hq_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
