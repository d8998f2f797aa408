/*
** fused_gemm.h -- the core's fused emulated GEMM (core/cuda/fused_gemm.cu), for gemm.c. Internal.
*/
#ifndef HQ_FUSED_GEMM_H
#define HQ_FUSED_GEMM_H

#include <stdint.h>

/* D(i, j) = alpha * f0 * f1 * sum_k X(i, k) W(j, k) (+ beta * D(i, j)) (+ bias[m]), X an MXFP8
   storage's codes [mx, k] (K contiguous) with its compact E8M0 scales (row i, 32-block b at
   xs[i * xs_ld + b], rows up to roundup(mx, 128)), W BF16 [nw, k] (K contiguous), D column-major
   with leading dimension ldd: D(i, j) at d[i + j * ldd] when x_is_m (X's rows are D's m), else
   at d[j + i * ldd]. */
typedef struct hqi_fused_gemm_args {
  int device, arch;              /* the device and its compute capability (90 = 9.0) */
  void *stream;
  const uint8_t *x, *xs;
  int64_t xs_ld;
  int elem;                      /* HQ_E4M3 or HQ_E5M2 */
  int64_t mx, nw, k;
  const void *w;
  int x_is_m;
  void *d;
  int d_dtype;                   /* HQ_F32 or HQ_BF16 */
  int64_t ldd;
  float alpha, beta;
  const float *factor[2];        /* NULL or device FP32 factors multiplied into alpha */
  const void *bias;              /* NULL or [m] of bias_dtype */
  int bias_dtype;
  const char *what;
} hqi_fused_gemm_args;

/* Whether hqi_fused_gemm can run the problem (device 9.0, shapes, alignment); no CUDA call. */
int hqi_fused_gemm_supported(const hqi_fused_gemm_args *a);
/* Run it on a->stream; HQ_ENOTSUP (nothing ran) where it cannot. */
int hqi_fused_gemm(const hqi_fused_gemm_args *a);

#endif
