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

/* The instance configuration: only what quantize() needs. dequantize() reads the element dtype
   and the order from the storage (hq_storage.desc), never from here. */
typedef struct fp8t_cfg {
  hq_dtype elem;     /* dtype: HQ_E4M3 or HQ_E5M2 */
  int pow2;          /* power_2_scales */
  float epsilon;     /* amax_epsilon */
  int delayed;       /* scaling = delayed (fp8_tensor_rules.h) */
  int history_len;   /* amax_history_len */
  int most_recent;   /* amax_compute_algo = most_recent */
  int margin;        /* margin */
} fp8t_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, amax. */
enum { FP8T_DATA = 0, FP8T_SCALE_INV = 1, FP8T_AMAX = 2 };

/* GPU amax: out[0] (rowwise) and out[1] (columnwise), device memory, = max |x| of src (NaN
   ignored) for each direction in dirs and 0 for the others; on call->stream, no sync. */
int fp8t_cuda_amax(const hq_call *call, const hq_tensor *src, uint32_t dirs, float *out);

/* GPU quantize of src into row ([M,K]) and/or col ([K,M]) bytes on call->stream: an amax pass
   (skipped when `given` is not NULL) and one fused cast(+transpose) pass. given: NULL, or the
   caller's amaxes (device memory), given[0] used for the rowwise and given[1] for the columnwise
   direction (fp8t_one_amax() when both are made). scale_inv/amax of each present storage are
   written. Any pointer of an absent direction is NULL.
   Delayed scaling (state not NULL, given NULL): no amax pass; the cast uses the scale state[0],
   and each block max-accumulates its max|x| into the storage's amax and into *state_amax
   (fp8t_amax_accumulate, as atomicMax on the bits).
   adam (delayed scaling only, src the FP32 master): the fused optimizer step, applied to each
   element as it is read (master, m, v written back) before the cast of its new value.
   copy (an F32 src, no adam; NULL: none): every element also stored in copy_dt (HQ_BF16 /
   HQ_F16) at copy [M,K], by hq_store_hp's rule (ABI 2.6 copy_out). */
int fp8t_cuda_quantize(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src,
                       const float *given, uint8_t *row, uint8_t *col, float *scale_inv,
                       float *amax, float *col_scale_inv, float *col_amax, const float *state,
                       float *state_amax, const hq_adam_pass *adam, void *copy, int copy_dt);

/* GPU end-of-step update of n delayed-scaling slices (fp8t_delayed_update's rule, a block each):
   amax[i] and state + i * history_len, device memory, on call->stream. */
int fp8t_cuda_update_state(const hq_call *call, int64_t n, float *amax, float *state,
                           int history_len, int most_recent, float scaled_max);

/* GPU dequantize: q is [M,K] (transposed == 0) or [K,M] (transposed == 1) of element dtype elem
   (HQ_E4M3 / HQ_E5M2). raw: the raw values (HQ_CALL_DEQ_RAW), fp8t_raw() of each code;
   otherwise hq_fp8_dequantize() with *scale_inv (device memory). fout (ABI 2.3, raw only; NULL:
   none): *fout = RN(m * *scale_inv), m = *call->factor_in or call->factor_mul, written by the
   kernel's first thread. */
int fp8t_cuda_dequantize(hq_dtype elem, const hq_call *call, const uint8_t *q, int transposed,
                         const float *scale_inv, int raw, float *fout, hq_tensor *dst);

/* GPU tensor_factor: *out = *scale_inv, both device memory, a device-to-device copy on
   call->stream. */
int fp8t_cuda_factor(const hq_call *call, const float *scale_inv, float *out);

#ifdef __cplusplus
}
#endif

#include "hq/numerics.h"

/* The one amax of a quantize call (both directions of one call share one scale_inv and amax)
   from the caller's amaxes a[0] (rowwise) and a[1] (columnwise): the rowwise direction alone
   uses a[0], the columnwise direction alone a[1], both together max(a[0], a[1]) (NaN ignored,
   as in amax() itself), so that neither direction saturates below its own amax. From amax() the
   two are equal and this is that value. Reads only the entries it uses. Host and device. */
HQ_HD float fp8t_one_amax(uint32_t dirs, const float *a) {
  if (dirs == HQ_ROWWISE) return a[0];
  if (dirs == HQ_COLWISE) return a[1];
  return hq_fmax_nan_ignoring(a[0], a[1]);
}

/* The raw value of one code (HQ_CALL_DEQ_RAW): the FP8 element value itself, without the
   per-tensor scale_inv; a NaN code gives HQ_F32_NAN_BITS, as hq_fp8_dequantize() does. So
   hq_fp8_dequantize(q, scale_inv, elem) == RN(fp8t_raw(q, elem) * scale_inv) bit for bit for
   every other code (it is the one multiply of the dequantize, same operands), and NaN for a NaN
   code. Every value is exact in BF16: E4M3 and E5M2
   carry at most 4 significant bits, exponents 2^-16 .. 2^15, and Inf / NaN exist in BF16.
   Host and device. */
HQ_HD float fp8t_raw(uint8_t q, int elem) {
  float v = hq_fp8_to_f32(q, elem);
  return hq_isnan(v) ? hq_bits_f32(HQ_F32_NAN_BITS) : v;
}

#endif
