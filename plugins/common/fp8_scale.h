/*
** fp8_scale.h -- the FP8 scale-from-amax rule shared by the stock per-tensor (fp8_tensor) and
** block (fp8_block) FP8 formats. Private to the stock plugins (not installed); host + device.
*/
#ifndef HQ_FP8_SCALE_H
#define HQ_FP8_SCALE_H

#include "hq/numerics.h"

/* --------------------------------------------------------------------------------------------
** Per-tensor / per-block FP32 scale from an amax (TE compute_scale_from_amax, docs/formats.md):
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

#endif /* HQ_FP8_SCALE_H */
