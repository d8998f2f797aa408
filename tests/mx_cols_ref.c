/*
** mx_cols_ref.c -- the CPU reference for tests/test_mx_cols_host.cu: mx.c itself (included, for
** its static tile functions), quantizing a whole [M, K] tensor as its quantize op does.
*/
#include <stdlib.h>

#include "mx.c"

void mx_cols_ref_quantize(const mx_job *q, const void *x, hq_dtype dt);

void mx_cols_ref_quantize(const mx_job *q, const void *x, hq_dtype dt) {
  const int64_t ts = tile_width(q->K);
  float *tile = malloc((size_t)(BLK * ts) * sizeof(float));
  uint32_t rk[20];
  if (!tile) abort();
  hq_nvfp4_sr_keys(q->seed, rk);
  for (int64_t i0 = 0; i0 < q->M; i0 += BLK)
    for (int64_t j0 = 0; j0 < q->K; j0 += TW) {
      const int w = (int)(q->K - j0 < TW ? q->K - j0 : TW);
      for (int r = 0; r < BLK; r++) load_row(tile + r * ts, x, (i0 + r) * q->K + j0, w, dt);
      quant_tile(q, rk, tile, ts, i0, j0, w);
    }
  free(tile);
}
