/*
** fused_gemm.h -- the fused kernel (fused_gemm.cu) as the fused_hopper provider (fused.c) calls
** it: the one declaration both compilers read.
*/
#ifndef HQ_FUSED_GEMM_H
#define HQ_FUSED_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* D(i, j) = alpha * f0 * f1 * sum_k X(i, k) W(j, k) (+ beta * D(i, j)) (+ bias[m]), X the raw
   values of an MXFP8 storage (codes [mx, k], K contiguous; E8M0 scales per 1x32 block), of an
   NVFP4 one (E2M1 codes [mx, k / 2], two per byte, the low nibble first; E4M3 scales per 1x16
   block: e2m1 * fp32(sf), the per-tensor factor left to f0 / f1) or of an MXFP4 / MXFP6 one
   (E2M1 codes as NVFP4's, or FP6 codes [mx, 3k / 4], four in three bytes; E8M0 scales per 1x32,
   compact, rows up to mx), the scales of row i, block b at xs[i * xs_ld + b] or, swizzled, at
   xs[hq_swizzle_offset(i, b, xs_ld)] (rows up to roundup(mx, 128)); W BF16 [nw, k] (K contiguous), D column-major with leading dimension ldd:
   D(i, j) at d[i + j * ldd] when x_is_m (X's rows are D's m), else at d[j + i * ldd]. */
typedef struct hqi_fused_gemm_args {
  int device, arch;              /* the device and its compute capability (90 = 9.0) */
  void *stream;
  const uint8_t *x, *xs;
  int64_t xs_ld;                 /* the scale buffer's columns */
  int xs_swizzled;               /* its layout: 1 swizzled, 0 row-major */
  int elem;                      /* HQ_E4M3, HQ_E5M2 (MXFP8), HQ_E2M1X2 (NVFP4 or MXFP4),
                                    HQ_E3M2X4 / HQ_E2M3X4 (MXFP6) */
  int e8m0;                      /* E8M0 scales per 1x32 (MXFP4 / MXFP6; MXFP8 always) */
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
  int (*error)(int code, const char *fmt, ...); /* records a failure's message (host->error) */
} hqi_fused_gemm_args;

/* The output tile of one CTA (X's rows x W's rows): the grid is one CTA per tile, k unsplit. */
#define HQI_FUSED_TILE_X 128
#define HQI_FUSED_TILE_W 256

/* The kernel's grid for mx rows of X and nw rows of W: the provider's size rule and the launch
   count the same tiles. */
static inline int64_t hqi_fused_tiles(int64_t mx, int64_t nw) {
  return ((mx + HQI_FUSED_TILE_X - 1) / HQI_FUSED_TILE_X) *
         ((nw + HQI_FUSED_TILE_W - 1) / HQI_FUSED_TILE_W);
}

/* Whether hqi_fused_gemm can run the problem (device 9.0, kind, shapes, alignment); no CUDA
   call. */
int hqi_fused_gemm_supported(const hqi_fused_gemm_args *a);
/* Run it on a->stream; HQ_ENOTSUP (nothing ran) where it cannot. */
int hqi_fused_gemm(const hqi_fused_gemm_args *a);

#ifdef __cplusplus
}
#endif
#endif
