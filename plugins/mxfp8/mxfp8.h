/*
** mxfp8.h -- shared between the mxfp8 plugin's CPU reference (mxfp8.c) and its future CUDA
** kernels. Not installed. The numerics themselves (E8M0 encode/decode, the scale rule, the
** scale-layout index functions) live in hq/numerics.h, section "MXFP8".
*/
#ifndef HQ_MXFP8_H
#define HQ_MXFP8_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mxfp8_cfg {
  int kind;          /* HQ_FP8_E4M3 / HQ_FP8_E5M2 (option dtype) */
  int swizzle;       /* scale buffers in the cuBLAS swizzled layout (option swizzle) */
  int block_2d;      /* one scale per 32x32 tile, shared by both directions (option block_2d) */
} mxfp8_cfg;

/* Buffer indices, both storages (save order): data, scale_inv. */
enum { MXFP8_DATA = 0, MXFP8_SCALE_INV = 1, MXFP8_NBUF = 2 };

/* hq_storage.meta written by layout(): how the buffers are laid out, so that a storage carries
   its own layout through copies, saves and checkpoints (TE's with_gemm_swizzled_scales). */
enum { MXFP8_META_MAGIC = 0, MXFP8_META_KIND = 1, MXFP8_META_SWIZZLED = 2, MXFP8_META_2D = 3 };
#define MXFP8_MAGIC 0x4Du /* 'M' */

#ifdef __cplusplus
}
#endif
#endif
