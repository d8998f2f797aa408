/*
** lt_names.h -- what the cuBLASLt provider and its runner both say about element dtypes and
** scale modes: their names in messages and which elements are FP8, one definition for both (the
** runner is CUDA C++, the provider C); and the runner's HQ_GEMM_AUTOTUNE setting, parsed here so
** that a CPU test checks the rule the runner applies.
*/
#ifndef HQ_GEMM_LT_NAMES_H
#define HQ_GEMM_LT_NAMES_H

#include "hq/plugin.h"

/* Whether element dtype t is an FP8 one (E4M3 or E5M2). An int, so that the C provider passes
   an hq_dtype and the C++ runner an int or an hq_dtype alike. */
static inline int hq_lt_is_fp8(int t) { return t == HQ_E4M3 || t == HQ_E5M2; }

/* An element's name: e2m1 for one FP4 element (hq_dtype_name says e2m1x2, the packed byte), e3m2
   and e2m3 for one FP6 element, int4 for one packed 4-bit integer. */
static inline const char *hq_lt_elem_name(int t) {
  switch (t) {
  case HQ_E4M3: return "e4m3";
  case HQ_E5M2: return "e5m2";
  case HQ_E2M1X2: return "e2m1";
  case HQ_E3M2X4: return "e3m2";
  case HQ_E2M3X4: return "e2m3";
  case HQ_I4X2: return "int4";
  case HQ_I8: return "int8";
  case HQ_BF16: return "bf16";
  case HQ_F16: return "f16";
  case HQ_F32: return "f32";
  default: return "?";
  }
}

/* A scale mode's name (HQ_SCALE_*), as cuBLASLt's scale modes are called, in lower case. */
static inline const char *hq_lt_scale_name(uint32_t m) {
  switch (m) {
  case HQ_SCALE_NONE: return "none";
  case HQ_SCALE_TENSOR_F32: return "tensor_f32";
  case HQ_SCALE_VEC16_UE4M3: return "vec16_ue4m3";
  case HQ_SCALE_VEC32_UE8M0: return "vec32_ue8m0";
  case HQ_SCALE_OUTER_VEC_F32: return "outer_vec_f32";
  case HQ_SCALE_VEC128_F32: return "vec128_f32";
  case HQ_SCALE_BLK128X128_F32: return "blk128x128_f32";
  default: return "other";
  }
}

/* The value of HQ_GEMM_AUTOTUNE (NULL: unset): 0 (unset, empty or "0": the heuristic's first
   algorithm), 1 ("1": time the heuristic's candidates at a plan's first call and keep the
   fastest), -1 for anything else (the runner refuses it, naming the variable and the value,
   rather than guess what was meant). */
static inline int hq_lt_autotune_parse(const char *v) {
  if (!v || !v[0] || (v[0] == '0' && !v[1])) return 0;
  if (v[0] == '1' && !v[1]) return 1;
  return -1;
}

#endif
