/*
** nvfp4.h -- shared between the nvfp4 plugin's CPU reference (nvfp4.c) and its future CUDA
** kernels. Not installed.
*/
#ifndef HQ_NVFP4_H
#define HQ_NVFP4_H

#include <stdint.h>

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nvfp4_cfg {
  int rht;                 /* 16-point RHT on the columnwise copy */
  uint32_t rht_sign_mask;  /* bit i set: sign s_i = -1 */
  int sr;                  /* stochastic rounding, both directions */
  uint64_t seed;           /* 0: the context's seed (hq_call.seed) */
  int block_2d;            /* 16x16 tiles, one scale per tile */
  int swizzle;             /* scales in the cuBLAS swizzled layout (FORMATS.md 2.4) */
} nvfp4_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, amax. */
enum { NVFP4_DATA = 0, NVFP4_SCALE_INV = 1, NVFP4_AMAX = 2, NVFP4_NBUF = 3 };

/* hq_storage.meta written by layout(): meta[0] = NVFP4_META_* flags of the instance that made
   the storage, meta[1..2] = the RHT sign mask (little endian; 0 without RHT). */
#define NVFP4_META_RHT 1u
#define NVFP4_META_SR 2u
#define NVFP4_META_2D 4u
#define NVFP4_META_SWIZZLE 8u

#ifdef __cplusplus
}
#endif
#endif
