/*
** mx.h -- shared between the MXFP4 / MXFP6 plugins' CPU reference (mx.c) and CUDA kernels
** (mx.cu). Not installed. The numerics live in mx_rules.h.
*/
#ifndef HQ_MX_H
#define HQ_MX_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-instance configuration. The element kind decides layout(); the scale rule and the rounding
   decide how quantize computes the bytes. dequantize reads the storage alone. */
typedef struct mx_cfg {
  hq_dtype kind;     /* HQ_E2M1X2 (mxfp4), HQ_E3M2X4 / HQ_E2M3X4 (mxfp6, option elem) */
  int rule;          /* HQ_MX_FLOOR / HQ_MX_RCEIL (option scale) */
  int sr;            /* stochastic rounding (option stochastic_rounding) */
  uint64_t seed;     /* option seed; 0: the call's (the context's) seed */
  int raw_copy;      /* each storage also keeps its raw values in BF16 (option raw_copy) */
} mx_cfg;

/* Buffer indices, both storages (save order): data, scale_inv, and with raw_copy = bf16 the raw
   values (HQ_ROLE_RAW: BF16 [M, K], what the raw dequantize writes), written with the data. */
enum { MX_DATA = 0, MX_SCALE_INV = 1, MX_NBUF = 2, MX_RAW = 2 };

/* One quantize, as mx.c read it from the storages (validated there). */
typedef struct mx_job {
  hq_dtype kind;
  int rule, sr;
  uint64_t seed, offset;
  int64_t M, K;       /* multiples of 32 */
  uint8_t *rd, *rs;   /* rowwise data / scales, or NULL */
  uint8_t *cd, *cs;   /* columnwise data / scales, or NULL */
  uint16_t *rr, *cr;  /* the storages' raw values (BF16 [M, K], raw_copy), or NULL */
} mx_job;

#ifdef HQ_HAVE_CUDA
/* mx.cu: everything queued on call->stream, nothing allocated, nothing synchronized. */
int mx_cuda_quantize(const mx_job *q, const hq_call *call, const hq_tensor *src);
int mx_cuda_dequantize(const hq_call *call, const uint8_t *data, const uint8_t *scale,
                       hq_dtype kind, int colwise, hq_tensor *dst);
#endif

#ifdef __cplusplus
}
#endif
#endif
