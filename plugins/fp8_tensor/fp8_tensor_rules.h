/*
** fp8_tensor_rules.h -- delayed scaling of the fp8_tensor plugin: the state of one slice, the
** amax accumulation and the end-of-step update (docs/formats.md, 3.5). One definition for the
** CPU reference (fp8_tensor.c) and the CUDA kernels (fp8_tensor.cu), so both write the same bits.
** Not installed.
**
** A slice (plugin.h, "State") is the core's amax of the slice -- history row 0, the accumulator
** every quantize of the step max-accumulates into, kept in the state's contiguous amax array so
** that one all-reduce covers every slice -- and L = amax_history_len floats of state:
**     state[0]       the scale the next quantizations use (initially 1)
**     state[i]       amax history row i, 1 <= i < L (initially 0; row L-1 is the newest)
*/
#ifndef HQ_FP8_TENSOR_RULES_H
#define HQ_FP8_TENSOR_RULES_H

#include <float.h>
#include <stdint.h>

#include "hq/numerics.h"

/* The longest amax history a slice keeps (amax_history_len's bound, as upstream); the CUDA update
   holds a thread's share of it in registers, so this bound sizes that share. */
#define FP8T_HISTORY_MAX 1024

/* Floats of state per slice: the scale and history rows 1 .. L-1. */
HQ_HD uint32_t fp8t_state_floats(int history_len) { return (uint32_t)history_len; }

/* The initial state: scale 1, history 0. */
HQ_HD void fp8t_state_init(float *state, int history_len) {
  state[0] = 1.0f;
  for (int i = 1; i < history_len; i++) state[i] = 0.0f;
}

/* scaled_max = max_fp8 * 2^-margin, exact for 0 <= margin <= 126 (2^-margin is a normal FP32
   number and so is the product). */
HQ_HD float fp8t_scaled_max(int elem, int margin) {
  return hq_mul_rn(hq_fp8_max(elem), hq_bits_f32((uint32_t)(127 - margin) << 23));
}

/* The amax accumulation of a quantize, on the FP32 bits as the kernels' atomicMax does it: a
   tensor amax a counts only when it is > 0 (so a NaN never enters), and then the larger bit
   pattern wins (for non-negative floats that is the larger value). */
HQ_HD uint32_t fp8t_amax_accumulate(uint32_t old_bits, float a) {
  const uint32_t b = hq_f32_bits(a);
  return a > 0.0f && b > old_bits ? b : old_bits;
}

/* The end-of-step update of one slice (TE's fused amax-and-scale update, delayed_scaling.cu
   kernel_bulk), with last = *amax0 (already reduced by the caller):
   1. roll, skipped when last == 0: row i <- row i+1 (i < L-1), row L-1 <- last, row 0 <- 0;
   2. amax = max over the rolled-in values -- rows 1 .. L-1 of the old history and last -- with
      NaN ignored (fmaxf), 0 when the roll was skipped (algo max); or last (most_recent);
   3. scale = RN(scaled_max / amax) when amax is finite and > 0, else the previous scale; a scale
      of Inf (a tiny amax) becomes FLT_MAX. */
/* Step 3 alone: the slice's new scale from the amax of step 2 and its previous scale (the GPU's
   block-parallel update rolls and reduces the history itself, then takes this). */
HQ_HD float fp8t_delayed_scale(float amax, float prev, float scaled_max) {
  float scale = prev;
  if (!hq_isnan(amax) && !hq_isinf(amax) && amax > 0.0f) scale = hq_div_rn(scaled_max, amax);
  if (hq_isinf(scale)) scale = FLT_MAX;
  return scale;
}

HQ_HD void fp8t_delayed_update(float *amax0, float *state, int history_len, int most_recent,
                               float scaled_max) {
  const float last = *amax0;
  float amax = 0.0f;
  if (last != 0.0f) {
    for (int i = 0; i < history_len; i++) {
      const float a = i < history_len - 1 ? state[i + 1] : last;
      amax = hq_fmax_nan_ignoring(amax, a);
      if (i > 0) state[i] = a;
    }
    *amax0 = 0.0f;
  }
  if (most_recent) amax = last;
  state[0] = fp8t_delayed_scale(amax, state[0], scaled_max);
}

#endif /* HQ_FP8_TENSOR_RULES_H */
