/*
** nvfp4.h -- shared between the nvfp4 plugin's CPU reference (nvfp4.c) and its CUDA kernels
** (nvfp4.cu). Not installed. The numeric rules are in nvfp4_rules.h.
*/
#ifndef HQ_NVFP4_H
#define HQ_NVFP4_H

#include <stddef.h>
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
  int swizzle;             /* scales in the cuBLAS swizzled layout (docs/formats.md) */
  int scale_kind;          /* HQ_NVFP4_SCALE_E4M3 / _UE5M3 (option scale_dtype) */
  int global;              /* HQ_NVFP4_GLOBAL_TENSOR / _ROW / _NONE (option global_scale) */
} nvfp4_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, amax (absent with
   global_scale = none: NVFP4_NBUF - 1 buffers; [R] per stored row with global_scale = row). hq_storage.meta is not
   used (left zero): desc.scale_layout, desc.block_m/block_k and desc.transform/transform_param
   hold what it used to. */
enum { NVFP4_DATA = 0, NVFP4_SCALE_INV = 1, NVFP4_AMAX = 2, NVFP4_NBUF = 3 };

/* The CUDA path (nvfp4.cu; built when HQ_HAVE_CUDA). Every call queues its work on call->stream
   and returns without synchronizing; nothing allocates. */

/* The device buffers of one direction being quantized. */
typedef struct nvfp4_dev_dir {
  uint8_t *data, *scale;
  float *amax;
} nvfp4_dev_dir;

/* out[0] (rowwise) / out[1] (columnwise), device memory: the global amaxes of src for the
   directions in dirs (the columnwise one over the RHT values with rht), 0 for the others. */
int nvfp4_cuda_amax(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                    uint32_t dirs, float *out);
/* Quantize src into the directions whose pointer is not NULL: an amax pass into the storages'
   amax buffers unless call->amax is given, then one fused pass for both directions. */
int nvfp4_cuda_quantize(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                        const nvfp4_dev_dir *row, const nvfp4_dev_dir *col);
/* Dequantize one stored direction (colwise: the transposed copy, through the inverse RHT when
   rht) into dst [M, K]; with raw, the raw values e2m1 * sf (no amax, no inverse RHT). fout (raw
   only; NULL: none): *fout = hq_mul_rn(fin ? *fin : fmul, hq_nvfp4_tensor_factor(*amax)),
   written by the dequantize kernel (ABI 2.3's hq_call.factor_out). */
int nvfp4_cuda_dequantize(const hq_call *call, const uint8_t *q, const uint8_t *scale,
                          const float *amax, int colwise, int swizzle, int rht, uint32_t mask,
                          int raw, hq_tensor *dst, float *fout, const float *fin, float fmul);
/* out[0] = hq_nvfp4_tensor_factor(*amax0) and, when amax1 is not NULL, out[1] =
   hq_nvfp4_tensor_factor(*amax1): device memory, one thread, on call->stream. */
int nvfp4_cuda_tensor_factors(const hq_call *call, const float *amax0, const float *amax1,
                              float *out);
/* The options the tuned kernels do not take (scale_dtype = ue5m3, global_scale = row / none):
   one thread per block through the rule functions (nvfp4.cu, last section). quantize: the
   amax buffers ([1] per tensor: given or computed; [R] per stored row; none) and both
   directions' bytes. dequantize / factor: as nvfp4_cuda_dequantize and
   nvfp4_cuda_tensor_factors for a storage of scale type `kind` and global scale `global`. */
int nvfp4_cuda_opt_quantize(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                            const nvfp4_dev_dir *row, const nvfp4_dev_dir *col);
int nvfp4_cuda_opt_dequantize(const hq_call *call, const uint8_t *q, const uint8_t *scale,
                              const float *amax, int kind, int global, int colwise, int swizzle,
                              int rht, uint32_t mask, int raw, hq_tensor *dst, float *fout,
                              const float *fin, float fmul);
int nvfp4_cuda_opt_factor(const hq_call *call, const float *amax, int kind, int global,
                          float *out);
/* cudaMemsetAsync(p, 0, bytes) on call->stream. */
int nvfp4_cuda_memset(const hq_call *call, void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
