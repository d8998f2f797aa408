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
/* Quantize src into the directions whose pointer is not NULL, every option of cfg: pass 1 fills
   the storages' amax buffers (per tensor unless call->amax is given; per stored row with
   global_scale = row; none with global_scale = none), then one fused pass for both directions. */
int nvfp4_cuda_quantize(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                        const nvfp4_dev_dir *row, const nvfp4_dev_dir *col);
/* Dequantize one stored direction of scale type `kind` and global scale `global` (colwise: the
   transposed copy, through the inverse RHT when rht) into dst [M, K]; amax: [1] per tensor, one
   per stored row (row), NULL (none). With raw, the raw values e2m1 * sf (no per-tensor amax, no
   inverse RHT; a row-scaled storage's carry their row's global scale). fout (raw only; NULL:
   none): *fout = hq_mul_rn(fin ? *fin : fmul, the storage's tensor factor), written by the
   dequantize kernel (ABI 2.3's hq_call.factor_out). rfout (raw only; NULL: none):
   rfout[r] = hq_nvfp4_tensor_factor_k(rf_amax[r], kind) for the rf_n stored rows of a
   row-scaled storage (ABI 2.6's hq_call.row_factor_out; the values are then dequantized with
   amax NULL and global none), written by the dequantize kernel. */
typedef struct nvfp4_deq {
  const uint8_t *q, *scale;
  const float *amax;
  int kind, global, colwise, swizzle, rht, raw;
  uint32_t mask;
  hq_tensor *dst;
  float *fout;
  const float *fin;
  float fmul;
  const float *rf_amax;
  float *rfout;
  int64_t rf_n;
} nvfp4_deq;
int nvfp4_cuda_dequantize(const hq_call *call, const nvfp4_deq *d);
/* Two of them as one launch, a's and then b's effect (b's fin may be a's fout: the product a
   writes), both on call->stream: HQ_ENOTSUP, nothing queued and no message, for a pair the
   kernel does not take (another dst dtype, no elements, row factors). */
int nvfp4_cuda_dequantize_pair(const hq_call *call, const nvfp4_deq *a, const nvfp4_deq *b);
/* The module's own GEMM on a device (nvfp4_gemm.cu): p's D = ((alpha * fa) * fb) * A B^T
   (+ beta * D) (+ bias) of two k-contiguous storages' raw values in BF16, FP32 accumulation, one
   launch on call->stream; a row-scaled operand's row factors multiply the product instead. An
   operand: codes [outer, k / 2], scales at hq_nvfp4_scale_offset, amax NULL for a factor of 1
   (global_scale = none), else [1], or [outer] with row. A CTA makes an NVFP4_GEMM_TILE square of
   D, the grid's x over m, its y (at most 65535) over n. */
#define NVFP4_GEMM_TILE 32
typedef struct nvfp4_gemm_operand {
  const uint8_t *q, *scale;
  const float *amax; /* NULL: factor 1; [1]: the tensor's; [outer] with row: each row's */
  int kind, swizzle, row;
} nvfp4_gemm_operand;
int nvfp4_cuda_gemm(const hq_call *call, const hq_gemm_problem *p, const nvfp4_gemm_operand *a,
                    const nvfp4_gemm_operand *b);
/* *out = hq_nvfp4_tensor_factor_k(*amax, kind) with global_scale = tensor, 1 otherwise: device
   memory, one thread, on call->stream. */
int nvfp4_cuda_tensor_factor(const hq_call *call, const float *amax, int kind, int global,
                             float *out);
/* cudaMemsetAsync(p, 0, bytes) on call->stream. */
int nvfp4_cuda_memset(const hq_call *call, void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
