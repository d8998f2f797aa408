/*
** mxfp8_ref.h -- an independent MXFP8 reference for the tests: written from FORMATS.md 2
** in plain double arithmetic and brute-force searches, sharing no code with the plugin's rules
** (plugins/mxfp8/mxfp8_rules.h), hq/numerics.h or the plugin. Element kinds are numbered as in
** fp8_ref.h (0 = E4M3, 1 = E5M2), not as hq_dtype values.
**   - FP8 decode and encode: fp8_ref.h.
**   - E8M0 scale: t = amax * RN(1/max_norm) rounded once to FP32 (a double product of two floats
**     is exact), then the smallest 2^(e-127), e = 0..254, with 2^(e-127) >= t, found by doubling
**     from 2^-127.
**   - Scale layouts: compact = row-major over the padded shape; swizzled = built by walking the
**     128x4 tiles in row-major tile order and, inside a tile, the rows in the order
**     0, 32, 64, 96, 1, 33, 65, 97, ..., 31, 63, 95, 127.
*/
#ifndef HQ_TESTS_MXFP8_REF_H
#define HQ_TESTS_MXFP8_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_ref.h"

/* E8M0 code by doubling: the smallest e in 0..254 with 2^(e-127) >= t; NaN -> 255. */
static inline unsigned ref_e8m0_ceil(double t) {
  if (isnan(t)) return 255;
  double p = ldexp(1.0, -127);
  unsigned e = 0;
  while (p < t && e < 254) {
    p *= 2.0;
    e++;
  }
  return e;
}

/* The block scale code of TE's rule (FORMATS.md 2.2) from a block's values. */
static inline unsigned ref_block_code(const float *const *vals, int n, int kind) {
  double amax = 0;
  for (int k = 0; k < n; k++) {
    double a = fabs((double)*vals[k]);
    if (!isnan(a) && a > amax) amax = a;
  }
  float rcp = 1.0f / (float)ref_fp8_max(kind);   /* RN(1/max_norm), an IEEE FP32 division */
  float t = (float)(amax * (double)rcp);          /* exact product, one rounding to FP32 */
  return ref_e8m0_ceil((double)t);
}

static inline unsigned ref_elem(float x, unsigned code, int kind) {
  return ref_fp8_encode((double)x * ldexp(1.0, 127 - (int)code), kind);
}

/* Reference quantize of an [M, K] FP32 matrix in one direction.
   dir 1 = rowwise: codes[i * (K/32) + kb]; dir 2 = columnwise: codes[mb * K + j].
   two_d: one code per 32x32 tile, the same in both directions' code arrays. */
static inline void ref_quantize(const float *x, int64_t M, int64_t K, int kind, int dir, int two_d,
                         uint8_t *data, uint8_t *codes) {
  const float *v[1024];
  int64_t Kb = K / 32;
  if (two_d) {
    for (int64_t ib = 0; ib < M / 32; ib++)
      for (int64_t jb = 0; jb < Kb; jb++) {
        int n = 0;
        for (int r = 0; r < 32; r++)
          for (int k = 0; k < 32; k++) v[n++] = &x[(ib * 32 + r) * K + jb * 32 + k];
        unsigned e = ref_block_code(v, 1024, kind);
        for (int r = 0; r < 32; r++)
          for (int k = 0; k < 32; k++) {
            int64_t i = ib * 32 + r, j = jb * 32 + k;
            data[i * K + j] = (uint8_t)ref_elem(x[i * K + j], e, kind);
            if (dir == 1 && k == 0) codes[i * Kb + jb] = (uint8_t)e;
            if (dir == 2 && r == 0) codes[ib * K + j] = (uint8_t)e;
          }
      }
    return;
  }
  if (dir == 1) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t jb = 0; jb < Kb; jb++) {
        for (int k = 0; k < 32; k++) v[k] = &x[i * K + jb * 32 + k];
        unsigned e = ref_block_code(v, 32, kind);
        codes[i * Kb + jb] = (uint8_t)e;
        for (int k = 0; k < 32; k++) data[i * K + jb * 32 + k] = (uint8_t)ref_elem(*v[k], e, kind);
      }
  } else {
    for (int64_t ib = 0; ib < M / 32; ib++)
      for (int64_t j = 0; j < K; j++) {
        for (int r = 0; r < 32; r++) v[r] = &x[(ib * 32 + r) * K + j];
        unsigned e = ref_block_code(v, 32, kind);
        codes[ib * K + j] = (uint8_t)e;
        for (int r = 0; r < 32; r++)
          data[(ib * 32 + r) * K + j] = (uint8_t)ref_elem(*v[r], e, kind);
      }
  }
}

static inline int64_t ref_up(int64_t x, int64_t m) { return ((x + m - 1) / m) * m; }

/* Expected scale buffer bytes of a logical scale matrix S [R, C] (S[r * C + c]), padded to
   [Rp, Cp]; compact: row-major, padding zero; swizzled: by walking the tiles (see the top). */
static inline uint8_t *ref_scale_buffer(const uint8_t *S, int64_t R, int64_t C, int64_t Rp,
                                        int64_t Cp, int swizzled) {
  uint8_t *out = calloc((size_t)(Rp * Cp), 1);
  if (!swizzled) {
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) out[r * Cp + c] = S[r * C + c];
    return out;
  }
  int order[128];
  for (int p = 0; p < 128; p++) order[p] = (p % 4) * 32 + p / 4;  /* 0,32,64,96,1,33,... */
  int64_t pos = 0;
  for (int64_t tr = 0; tr < Rp / 128; tr++)
    for (int64_t tc = 0; tc < Cp / 4; tc++)
      for (int p = 0; p < 128; p++)
        for (int cc = 0; cc < 4; cc++, pos++) {
          int64_t r = tr * 128 + order[p], c = tc * 4 + cc;
          out[pos] = (r < R && c < C) ? S[r * C + c] : 0;
        }
  return out;
}

/* Expected scale buffer of a direction from the reference codes (layout of ref_quantize). */
static inline uint8_t *ref_dir_scales(const uint8_t *codes, int64_t M, int64_t K, int dir,
                                      int swizzled, size_t *bytes) {
  uint8_t *out;
  if (dir == 1) {
    /* rowwise: S[i][kb], compact shape [r128(M), r4(K/32)], swizzled the same S */
    out = ref_scale_buffer(codes, M, K / 32, ref_up(M, 128), ref_up(K / 32, 4), swizzled);
    *bytes = (size_t)(ref_up(M, 128) * ref_up(K / 32, 4));
    return out;
  }
  if (!swizzled) {
    out = ref_scale_buffer(codes, M / 32, K, ref_up(M / 32, 4), ref_up(K, 128), 0);
  } else {
    /* columnwise swizzled: the [M/32][K] matrix transposed, r = column j, c = M-block */
    int64_t Mb = M / 32;
    uint8_t *t = malloc((size_t)(K * Mb));
    for (int64_t j = 0; j < K; j++)
      for (int64_t mb = 0; mb < Mb; mb++) t[j * Mb + mb] = codes[mb * K + j];
    out = ref_scale_buffer(t, K, Mb, ref_up(K, 128), ref_up(Mb, 4), 1);
    free(t);
  }
  *bytes = (size_t)(ref_up(M / 32, 4) * ref_up(K, 128));
  return out;
}

#endif
