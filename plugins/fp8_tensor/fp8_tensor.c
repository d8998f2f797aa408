/*
** fp8_tensor.c -- per-tensor FP8 (E4M3 / E5M2) with current scaling: the plugin ABI and the CPU
** reference (FORMATS.md section 1).
**
** Quantize: amax = max|x| (NaN ignored); scale = RN(max_fp8 / amax) with TE's edge cases
** (hq_scale_from_amax); scale_inv = RN(1/scale); q = fp8_satfinite(RN(x * scale)).
** The rowwise copy is [M, K]; the columnwise copy is its exact byte transpose [K, M] (the layout
** TN-only GEMMs need), made from the same read and the same scale. A columnwise-only quantize is
** supported (TE has none on Hopper).
**
** Buffers of each storage, in save order:
**   0 data / columnwise_data   e4m3|e5m2 [M, K] / [K, M]
**   1 scale_inv                f32 [1]   (columnwise: shared with rowwise when made together)
**   2 amax                     f32 [1]   (ditto; the amax the scale came from)
**
** Delayed scaling (scaling = delayed and its options) is reserved: its shared amax history
** arrives with the training-lifecycle work; until then configure() refuses it by name.
*/
#include <float.h>
#include <string.h>

#include "hq/numerics.h"
#include "hq/plugin.h"
#include "fp8_tensor.h"

enum { OPT_DTYPE, OPT_SCALING, OPT_POW2, OPT_EPS, OPT_HIST, OPT_MARGIN, OPT_ALGO, OPT_REDUCE };

static const hq_option options[] = {
    [OPT_DTYPE] = {"dtype", HQ_OPT_ENUM, "e4m3", "FP8 element type (max 448 / 57344)", "e4m3|e5m2",
                   0, -1},
    [OPT_SCALING] = {"scaling", HQ_OPT_ENUM, "current",
                     "current: scale from this tensor's amax; delayed: from the amax history "
                     "(reserved, arrives with the lifecycle work)",
                     "current|delayed", 0, -1},
    [OPT_POW2] = {"power_2_scales", HQ_OPT_BOOL, "false",
                  "round the scale down to a power of two (current scaling)", NULL, 0, -1},
    [OPT_EPS] = {"amax_epsilon", HQ_OPT_FLOAT, "0",
                 "floor applied to amax before the scale is computed (current scaling)", NULL, 0,
                 3.4e38},
    [OPT_HIST] = {"amax_history_len", HQ_OPT_INT, "1024", "delayed scaling: amax history length",
                  NULL, 1, 65536},
    [OPT_MARGIN] = {"margin", HQ_OPT_INT, "0",
                    "delayed scaling: scale = max_fp8 * 2^-margin / amax", NULL, 0, 64},
    [OPT_ALGO] = {"amax_compute_algo", HQ_OPT_ENUM, "max",
                  "delayed scaling: amax from the history's max or its most recent entry",
                  "max|most_recent", 0, -1},
    [OPT_REDUCE] = {"reduce_amax", HQ_OPT_BOOL, "true",
                    "delayed scaling: all-reduce the amaxes over the data-parallel group", NULL, 0,
                    -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  fp8t_cfg *c = cfgp;
  c->kind = v[OPT_DTYPE].i ? HQ_FP8_E5M2 : HQ_FP8_E4M3;
  c->delayed = (int)v[OPT_SCALING].i;
  c->pow2 = (int)v[OPT_POW2].i;
  c->epsilon = (float)v[OPT_EPS].f;
  c->history_len = (int)v[OPT_HIST].i;
  c->margin = (int)v[OPT_MARGIN].i;
  c->algo_max = v[OPT_ALGO].i == 0;
  if (c->delayed)
    return host->error(HQ_ENOTSUP, "scaling = delayed is reserved and not implemented yet (its "
                       "shared amax history comes with the training-lifecycle work); use "
                       "scaling = current");
  return HQ_OK;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const fp8t_cfg *c = cfgp;
  (void)host;
  hq_dtype t = c->kind == HQ_FP8_E5M2 ? HQ_E5M2 : HQ_E4M3;
  out->nbuf = 3;
  out->meta[0] = (uint8_t)c->kind;
  if (dir == HQ_ROWWISE) {
    hq_buffer_describe(&out->buf[FP8T_DATA], "data", t, 2, rows, cols, HQ_BUF_SHARDED);
    hq_buffer_describe(&out->buf[FP8T_SCALE_INV], "scale_inv", HQ_F32, 1, 1, 0, 0);
    hq_buffer_describe(&out->buf[FP8T_AMAX], "amax", HQ_F32, 1, 1, 0, 0);
  } else {
    uint32_t shared = (dirs & HQ_ROWWISE) ? HQ_BUF_SHARED : 0;
    hq_buffer_describe(&out->buf[FP8T_DATA], "columnwise_data", t, 2, cols, rows, 0);
    hq_buffer_describe(&out->buf[FP8T_SCALE_INV], "scale_inv", HQ_F32, 1, 1, 0, shared);
    hq_buffer_describe(&out->buf[FP8T_AMAX], "amax", HQ_F32, 1, 1, 0, shared);
    out->buf[FP8T_SCALE_INV].shared_with = FP8T_SCALE_INV;
    out->buf[FP8T_AMAX].shared_with = FP8T_AMAX;
  }
  return HQ_OK;
}

// --- CPU reference ----------------------------------------------------------------------------

/* NaN-ignoring amax as an integer max over |x| bits, one typed loop per input dtype. */
static float amax_of(const hq_tensor *src) {
  const int64_t n = src->rows * src->cols;
  uint32_t m = 0;
  if (src->dtype == HQ_F32) {
    const float *p = src->data;
    for (int64_t i = 0; i < n; i++) {
      uint32_t a = hq_abs_bits_nonan(p[i]);
      m = a > m ? a : m;
    }
  } else {
    const uint16_t *p = src->data;
    const int f16 = src->dtype == HQ_F16;
    for (int64_t i = 0; i < n; i++) {
      uint32_t a = hq_abs_bits_nonan(f16 ? hq_f16_to_f32(p[i]) : hq_bf16_to_f32(p[i]));
      m = a > m ? a : m;
    }
  }
  return hq_bits_f32(m);
}

#define TILE 64

/* Rows [i0, i0+nr) x columns [j0, j0+nc) of src as FP32, row stride TILE. */
static void load_tile(const hq_tensor *src, int64_t i0, int64_t j0, int nr, int nc, float *x) {
  for (int r = 0; r < nr; r++) {
    const int64_t off = (i0 + r) * src->cols + j0;
    float *xr = x + r * TILE;
    if (src->dtype == HQ_F32) {
      memcpy(xr, (const float *)src->data + off, (size_t)nc * sizeof(float));
    } else if (src->dtype == HQ_BF16) {
      const uint16_t *p = (const uint16_t *)src->data + off;
      for (int c = 0; c < nc; c++) xr[c] = hq_bf16_to_f32(p[c]);
    } else {
      const uint16_t *p = (const uint16_t *)src->data + off;
      for (int c = 0; c < nc; c++) xr[c] = hq_f16_to_f32(p[c]);
    }
  }
}

/* q[c] = fp8(RN(x[c] * scale)), the element kind chosen once per row so the loop vectorizes. */
static void cast_row(int kind, const float *x, float scale, int n, uint8_t *q) {
  if (kind == HQ_FP8_E5M2)
    for (int c = 0; c < n; c++) q[c] = hq_f32_to_e5m2(hq_mul_rn(x[c], scale));
  else
    for (int c = 0; c < n; c++) q[c] = hq_f32_to_e4m3(hq_mul_rn(x[c], scale));
}

/* Quantize with one scale into row [M,K] and/or col [K,M], 64x64 tiles: each tile is read once,
   cast row by row, its bytes written to the rowwise copy and, transposed through the tile, to
   the columnwise copy. */
static void cast_transpose(const hq_tensor *src, float scale, int kind, uint8_t *row,
                           uint8_t *col) {
  const int64_t M = src->rows, K = src->cols;
  float x[TILE * TILE];
  uint8_t q[TILE * TILE];
  for (int64_t i0 = 0; i0 < M; i0 += TILE) {
    const int nr = (int)(M - i0 < TILE ? M - i0 : TILE);
    for (int64_t j0 = 0; j0 < K; j0 += TILE) {
      const int nc = (int)(K - j0 < TILE ? K - j0 : TILE);
      load_tile(src, i0, j0, nr, nc, x);
      for (int r = 0; r < nr; r++) {
        cast_row(kind, x + r * TILE, scale, nc, q + r * TILE);
        if (row) memcpy(row + (i0 + r) * K + j0, q + r * TILE, (size_t)nc);
      }
      if (col)
        for (int c = 0; c < nc; c++) {
          uint8_t *o = col + (j0 + c) * M + i0;
          for (int r = 0; r < nr; r++) o[r] = q[r * TILE + c];
        }
    }
  }
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const fp8t_cfg *c = cfgp;
  uint8_t *rd = (dirs & HQ_ROWWISE) ? row->buf[FP8T_DATA].ptr : NULL;
  uint8_t *cd = (dirs & HQ_COLWISE) ? col->buf[FP8T_DATA].ptr : NULL;
  float *rs = rd ? row->buf[FP8T_SCALE_INV].ptr : NULL, *ra = rd ? row->buf[FP8T_AMAX].ptr : NULL;
  float *cs = cd ? col->buf[FP8T_SCALE_INV].ptr : NULL, *ca = cd ? col->buf[FP8T_AMAX].ptr : NULL;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_quantize(c, call, src, rd, cd, rs, ra, cs, ca);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  float amax = amax_of(src);
  float scale = hq_scale_from_amax(amax, hq_fp8_max(c->kind), c->pow2, c->epsilon, FLT_MAX);
  float scale_inv = hq_rcp_rn(scale);
  cast_transpose(src, scale, c->kind, rd, cd);
  if (rs) *rs = scale_inv, *ra = amax;
  if (cs) *cs = scale_inv, *ca = amax;
  return HQ_OK;
}

static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  const fp8t_cfg *c = cfgp;
  const uint8_t *q = s->buf[FP8T_DATA].ptr;
  int transposed = s->dir == HQ_COLWISE;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_dequantize(c, call, q, transposed, s->buf[FP8T_SCALE_INV].ptr, dst);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  const float scale_inv = *(const float *)s->buf[FP8T_SCALE_INV].ptr;
  const int64_t M = dst->rows, K = dst->cols;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++)
      hq_store_hp(dst->data, i * K + j, dst->dtype,
                  hq_fp8_dequantize(q[transposed ? j * M + i : i * K + j], scale_inv, c->kind));
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(fp8t_cfg),
    .name = "fp8_tensor",
    .version = "1.0",
    .description = "per-tensor FP8 (E4M3/E5M2), current scaling; columnwise = byte transpose",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v1(const hq_host_api *host) {
  if (host->abi_major != HQ_ABI_MAJOR) return NULL;
  return &ops;
}
