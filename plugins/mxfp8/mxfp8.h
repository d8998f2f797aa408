/*
** mxfp8.h -- shared between the mxfp8 plugin's CPU reference (mxfp8.c) and its CUDA kernels
** (mxfp8.cu). Not installed. The numerics themselves (the scale rule, the element cast, the
** scale-buffer shapes and index functions) live in mxfp8_rules.h; the generic E8M0 / FP8 codecs
** in hq/numerics.h.
*/
#ifndef HQ_MXFP8_H
#define HQ_MXFP8_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-instance configuration. It decides what layout() describes and nothing else: quantize and
   dequantize read every layout fact (element dtype, swizzle, 1-D or 2-D blocks) from the
   storage's descriptor, so a storage made by one instance is read correctly by any other. */
typedef struct mxfp8_cfg {
  hq_dtype elem;     /* HQ_E4M3 / HQ_E5M2 (option dtype) */
  int swizzle;       /* scale buffers in the cuBLAS swizzled layout (option swizzle) */
  int block_2d;      /* one scale per 32x32 tile, shared by both directions (option block_2d) */
  int raw_copy;      /* each storage also keeps its raw values in BF16 (option raw_copy) */
} mxfp8_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, and with raw_copy = bf16 the raw
   values (HQ_ROLE_RAW: BF16 [M, K], what the raw dequantize writes), written with the data. */
enum { MXFP8_DATA = 0, MXFP8_SCALE_INV = 1, MXFP8_NBUF = 2, MXFP8_RAW = 2 };

/* hq_storage.meta is unused (left zero): the descriptor holds every layout fact. */

#ifdef HQ_HAVE_CUDA
/* One quantize on a CUDA device, as mxfp8.c read it from the storages (validated there). */
typedef struct mxfp8_cuda_job {
  hq_dtype elem;      /* HQ_E4M3 / HQ_E5M2 */
  int two_d;          /* one code per 32x32 tile */
  int64_t M, K;       /* multiples of 32 */
  uint8_t *rd, *rs;   /* rowwise data / scales (device memory), or NULL */
  uint8_t *cd, *cs;   /* columnwise data / scales (device memory), or NULL */
  int rswz, cswz;     /* the storages' scale layouts: swizzled or compact */
  uint16_t *rr, *cr;  /* the storages' raw values (BF16 [M, K], raw_copy), or NULL */
  const hq_adam_pass *adam; /* the fused optimizer step (src is then the FP32 master), or NULL */
} mxfp8_cuda_job;

/* mxfp8.cu: everything queued on call->stream, nothing allocated, nothing synchronized. */
int mxfp8_cuda_quantize(const mxfp8_cuda_job *q, const hq_call *call, const hq_tensor *src);
int mxfp8_cuda_dequantize(const hq_call *call, const uint8_t *data, const uint8_t *scale,
                          hq_dtype elem, int swizzled, int colwise, hq_tensor *dst);
int mxfp8_cuda_zero(const hq_call *call, void *ptr, size_t bytes);
/* Between a swizzled scale buffer of an [M, K] tensor and its FSDP form of `rows` rows of C
   bytes (mxfp8.c, form_move): hq_mxfp8_form_move on every entry of the first R rows -- the
   form's rows (to_form) or every row of the buffer (the padding rows get zeros). */
int mxfp8_cuda_scale_form(const hq_call *call, uint8_t *swizzled, uint8_t *form, int colwise,
                          int64_t M, int64_t K, int64_t rows, int64_t R, int64_t C, int to_form);
#endif

#ifdef __cplusplus
}
#endif
#endif
