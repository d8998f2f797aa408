/*
** nvfp4.h -- shared between the nvfp4 plugin's CPU reference (nvfp4.c) and its future CUDA
** kernels. Not installed. The numeric rules are in nvfp4_rules.h.
*/
#ifndef HQ_NVFP4_H
#define HQ_NVFP4_H

#include <stdint.h>

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The instance configuration. It decides what quantize() makes; dequantize() never reads it:
   every layout fact of a storage is in its hq_storage.desc (a storage may come from a
   differently configured instance). */
typedef struct nvfp4_cfg {
  int rht;                 /* 16-point RHT on the columnwise copy */
  uint32_t rht_sign_mask;  /* bit i set: sign s_i = -1 */
  int sr;                  /* stochastic rounding, both directions */
  uint64_t seed;           /* 0: the context's seed (hq_call.seed) */
  int block_2d;            /* 16x16 tiles, one scale per tile */
  int swizzle;             /* scales in the cuBLAS swizzled layout (FORMATS.md 2.4) */
} nvfp4_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, amax. hq_storage.meta is not
   used (left zero): desc.scale_layout, desc.block_m/block_k and desc.transform/transform_param
   hold what it used to. */
enum { NVFP4_DATA = 0, NVFP4_SCALE_INV = 1, NVFP4_AMAX = 2, NVFP4_NBUF = 3 };

#ifdef __cplusplus
}
#endif
#endif
