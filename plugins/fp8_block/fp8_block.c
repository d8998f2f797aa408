/*
** fp8_block.c -- FP8 block scaling, DeepSeek-V3 style (TE Float8BlockwiseQTensor): the plugin ABI
** and the CPU reference (FORMATS.md section 4). CUDA kernels are a later piece of work.
**
** Blocks over the logical [M, K]:
**   block = 1d  rowwise 1x128 (along K), columnwise 128x1 (down M); the two copies are quantized
**               independently from high precision and differ numerically;
**   block = 2d  128x128 tiles; the columnwise copy is the exact transpose of the rowwise copy
**               (same tiles, same scales).
** Any shape is accepted: blocks at the bottom/right edges cover only their in-bounds elements.
** Per block: amax = max|x| in FP32 ignoring NaN; scale = TE compute_scale_from_amax with
** value_for_inf = the input dtype's max (hq_fp8b_scale); scale_inv = RN(1/scale);
** q = fp8_satfinite(RN(x * scale)); dequantize x = RN(q * scale_inv).
**
** Buffers of each storage, in save order (Mb = ceil(M/128), Kb = ceil(K/128), r4 = round up to
** a multiple of 4; index functions in hq/numerics.h, padding entries are written as zero):
**   rowwise    0 data                  e4m3|e5m2 [M, K]                       SHARDED
**              1 scale_inv             f32  1d: [Kb, r4(M)]  entry [k/128][m]  (M contiguous)
**                                           2d: [Mb, r4(Kb)] entry [m/128][k/128]   SHARDED
**   columnwise 0 columnwise_data       e4m3|e5m2 [K, M] (physically transposed)
**              1 columnwise_scale_inv  f32  1d: [Mb, r4(K)]  entry [m/128][k]       SHARDED
**                                           2d: [Kb, r4(Mb)] entry [k/128][m/128]
** HQ_BUF_SHARDED marks exactly the buffers whose dim 0 runs along M, so that shards of M
** concatenate along dim 0 into the full buffer: the rowwise data, and the scales whose dim 0 is
** the M-block index (2-D rowwise, 1-D columnwise; a shard's M must then be a multiple of 128, or
** a block would straddle two shards). The 1-D rowwise scale (M in dim 1) and the columnwise data
** (K in dim 0) are not gatherable along dim 0 as they are: a 1-D storage, or a 2-D columnwise
** one, needs fsdp_extract/fsdp_assign (transposes; TE's FSDP2 gathers 2-D rowwise only and
** rebuilds the columnwise copy locally), which this plugin does not provide yet.
** meta[0] = element kind (HQ_FP8_E4M3 / HQ_FP8_E5M2), meta[1] = block dims (1 or 2).
*/
#include <string.h>

#include "hq/numerics.h"
#include "hq/plugin.h"

enum { OPT_BLOCK, OPT_DTYPE, OPT_POW2, OPT_EPS };

static const hq_option options[] = {
    [OPT_BLOCK] = {"block", HQ_OPT_ENUM, "1d",
                   "1d: 1x128 blocks rowwise, 128x1 columnwise; 2d: 128x128 tiles", "1d|2d", 0,
                   -1},
    [OPT_DTYPE] = {"dtype", HQ_OPT_ENUM, "e4m3", "FP8 element type (max 448 / 57344)",
                   "e4m3|e5m2", 0, -1},
    [OPT_POW2] = {"power_2_scales", HQ_OPT_BOOL, "true",
                  "round each block scale down to a power of two (TE's default; required on "
                  "Blackwell)", NULL, 0, -1},
    [OPT_EPS] = {"amax_epsilon", HQ_OPT_FLOAT, "0",
                 "floor applied to each block's amax before its scale is computed", NULL, 0,
                 3.4e38},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

typedef struct fp8b_cfg {
  int kind;       /* HQ_FP8_E4M3 / HQ_FP8_E5M2 */
  int two_d;      /* block = 2d */
  int pow2;       /* power_2_scales */
  float epsilon;  /* amax_epsilon */
} fp8b_cfg;

/* Buffer indices, both storages (save order). */
enum { FP8B_DATA = 0, FP8B_SCALE_INV = 1 };

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  fp8b_cfg *c = cfgp;
  (void)host;
  c->two_d = (int)v[OPT_BLOCK].i;
  c->kind = v[OPT_DTYPE].i ? HQ_FP8_E5M2 : HQ_FP8_E4M3;
  c->pow2 = (int)v[OPT_POW2].i;
  c->epsilon = (float)v[OPT_EPS].f;
  return HQ_OK;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const fp8b_cfg *c = cfgp;
  (void)host;
  (void)dirs;
  const int colwise = dir == HQ_COLWISE;
  int64_t d0, d1, n1;
  hq_fp8b_scale_shape(rows, cols, colwise, c->two_d, &d0, &d1, &n1);
  /* dim 0 of the scale runs along M for 2-D rowwise and 1-D columnwise (see the header) */
  uint32_t scale_flags = c->two_d != colwise ? HQ_BUF_SHARDED : 0;
  hq_dtype t = c->kind == HQ_FP8_E5M2 ? HQ_E5M2 : HQ_E4M3;
  out->nbuf = 2;
  out->meta[0] = (uint8_t)c->kind;
  out->meta[1] = (uint8_t)(c->two_d ? 2 : 1);
  if (!colwise) {
    hq_buffer_describe(&out->buf[FP8B_DATA], "data", t, 2, rows, cols, HQ_BUF_SHARDED);
    hq_buffer_describe(&out->buf[FP8B_SCALE_INV], "scale_inv", HQ_F32, 2, d0, d1, scale_flags);
  } else {
    hq_buffer_describe(&out->buf[FP8B_DATA], "columnwise_data", t, 2, cols, rows, 0);
    hq_buffer_describe(&out->buf[FP8B_SCALE_INV], "columnwise_scale_inv", HQ_F32, 2, d0, d1,
                       scale_flags);
  }
  return HQ_OK;
}

// --- CPU reference ----------------------------------------------------------------------------

#define B HQ_FP8B_BLOCK

/* Scratch for one 128x128 tile: the input in FP32 (row stride B), its bytes, per-column scales. */
typedef struct tile {
  float x[B * B];
  uint8_t q[B * B];   /* row-major [i][j] (rowwise / 2-D) or transposed [j][i] (1-D colwise) */
  float cscale[B];
} tile;

/* Load the in-bounds part [nr, nc] of the tile at (m0, k0) into t->x, converting to FP32. */
static void load_tile(const hq_tensor *src, int64_t m0, int64_t k0, int nr, int nc, float *x) {
  const int64_t K = src->cols;
  for (int i = 0; i < nr; i++) {
    const int64_t off = (m0 + i) * K + k0;
    float *xi = x + i * B;
    if (src->dtype == HQ_F32) {
      memcpy(xi, (const float *)src->data + off, (size_t)nc * sizeof(float));
    } else if (src->dtype == HQ_BF16) {
      const uint16_t *p = (const uint16_t *)src->data + off;
      for (int j = 0; j < nc; j++) xi[j] = hq_bf16_to_f32(p[j]);
    } else {
      const uint16_t *p = (const uint16_t *)src->data + off;
      for (int j = 0; j < nc; j++) xi[j] = hq_f16_to_f32(p[j]);
    }
  }
}

static float amax_of(const float *x, int n) {
  uint32_t m = 0;
  for (int j = 0; j < n; j++) {
    uint32_t a = hq_abs_bits_nonan(x[j]);
    m = a > m ? a : m;
  }
  return hq_bits_f32(m);
}

/* q[j*qs] = fp8(RN(x[j] * scale[j*ss])) for j < n (ss = 0: one scale for all). cast() picks
   the element kind once per call, so each loop inlines one conversion with no per-element kind
   branch. */
static inline void cast_e4m3(const float *x, const float *scale, int ss, int n, uint8_t *q,
                             int qs) {
  for (int j = 0; j < n; j++) q[j * qs] = hq_f32_to_e4m3(hq_mul_rn(x[j], scale[j * ss]));
}
static inline void cast_e5m2(const float *x, const float *scale, int ss, int n, uint8_t *q,
                             int qs) {
  for (int j = 0; j < n; j++) q[j * qs] = hq_f32_to_e5m2(hq_mul_rn(x[j], scale[j * ss]));
}
static void cast(int kind, const float *x, const float *scale, int ss, int n, uint8_t *q, int qs) {
  if (kind == HQ_FP8_E5M2) cast_e5m2(x, scale, ss, n, q, qs);
  else cast_e4m3(x, scale, ss, n, q, qs);
}

/* Zero the padding [., n1, d1) of a [d0, d1] scale buffer. */
static void zero_padding(float *s, int64_t d0, int64_t d1, int64_t n1) {
  for (int64_t r = 0; r < d0; r++)
    for (int64_t j = n1; j < d1; j++) s[r * d1 + j] = 0.0f;
}

/* One tile, 1-D blocks: each tile row is one rowwise block, each tile column one columnwise
   block (blocks are aligned to tiles, so a tile never splits one). */
static void tile_1d(const fp8b_cfg *c, int src_dtype, tile *t, int64_t M, int64_t K, int64_t m0,
                    int64_t k0, int nr, int nc, uint8_t *rd, float *rs, uint8_t *cd, float *cs) {
  if (rd) {
    for (int i = 0; i < nr; i++) {
      const float *xi = t->x + i * B;
      float scale = hq_fp8b_scale(amax_of(xi, nc), c->kind, c->pow2, c->epsilon, src_dtype);
      rs[hq_fp8b_row1d_index(m0 + i, k0, M)] = hq_rcp_rn(scale);
      cast(c->kind, xi, &scale, 0, nc, rd + (m0 + i) * K + k0, 1);
    }
  }
  if (cd) {
    uint32_t am[B] = {0};
    for (int i = 0; i < nr; i++) {
      const float *xi = t->x + i * B;
      for (int j = 0; j < nc; j++) {
        uint32_t a = hq_abs_bits_nonan(xi[j]);
        am[j] = a > am[j] ? a : am[j];
      }
    }
    for (int j = 0; j < nc; j++) {
      float scale = hq_fp8b_scale(hq_bits_f32(am[j]), c->kind, c->pow2, c->epsilon, src_dtype);
      t->cscale[j] = scale;
      cs[hq_fp8b_col1d_index(m0, k0 + j, K)] = hq_rcp_rn(scale);
    }
    /* cast row by row (contiguous reads) into the transposed tile, then copy its rows out */
    for (int i = 0; i < nr; i++) cast(c->kind, t->x + i * B, t->cscale, 1, nc, t->q + i, B);
    for (int j = 0; j < nc; j++) memcpy(cd + (k0 + j) * M + m0, t->q + j * B, (size_t)nr);
  }
}

/* One tile, 2-D: one block, one scale; the columnwise bytes are the transpose of the rowwise. */
static void tile_2d(const fp8b_cfg *c, int src_dtype, tile *t, int64_t M, int64_t K, int64_t m0,
                    int64_t k0, int nr, int nc, uint8_t *rd, float *rs, uint8_t *cd, float *cs) {
  uint32_t m = 0;
  for (int i = 0; i < nr; i++) {
    uint32_t a = hq_f32_bits(amax_of(t->x + i * B, nc));
    m = a > m ? a : m;
  }
  float scale = hq_fp8b_scale(hq_bits_f32(m), c->kind, c->pow2, c->epsilon, src_dtype);
  float scale_inv = hq_rcp_rn(scale);
  for (int i = 0; i < nr; i++) cast(c->kind, t->x + i * B, &scale, 0, nc, t->q + i * B, 1);
  if (rd) {
    rs[hq_fp8b_row2d_index(m0, k0, K)] = scale_inv;
    for (int i = 0; i < nr; i++) memcpy(rd + (m0 + i) * K + k0, t->q + i * B, (size_t)nc);
  }
  if (cd) {
    cs[hq_fp8b_col2d_index(m0, k0, M)] = scale_inv;
    for (int j = 0; j < nc; j++) {
      uint8_t *o = cd + (k0 + j) * M + m0;
      for (int i = 0; i < nr; i++) o[i] = t->q[i * B + j];
    }
  }
}

static int host_only(const hq_call *call, const char *op) {
  if (call->device == HQ_DEVICE_HOST) return HQ_OK;
  return call->host->error(HQ_ENOTSUP, "fp8_block has no CUDA path yet (CPU reference only): %s "
                           "on device %d is not supported", op, (int)call->device);
}

static int check_hp(const hq_host_api *host, hq_dtype t, const char *what) {
  if (t == HQ_F32 || t == HQ_F16 || t == HQ_BF16) return HQ_OK;
  return host->error(HQ_EINVAL, "%s dtype %d is not f32, f16 or bf16", what, (int)t);
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const fp8b_cfg *c = cfgp;
  const hq_host_api *host = call->host;
  int rc = host_only(call, "quantize");
  if (!rc) rc = check_hp(host, src->dtype, "source");
  if (rc) return rc;
  const int64_t M = src->rows, K = src->cols;
  uint8_t *rd = NULL, *cd = NULL;
  float *rs = NULL, *cs = NULL;
  int64_t d0, d1, n1;
  if (dirs & HQ_ROWWISE) {
    rd = row->buf[FP8B_DATA].ptr;
    rs = row->buf[FP8B_SCALE_INV].ptr;
    hq_fp8b_scale_shape(M, K, 0, c->two_d, &d0, &d1, &n1);
    zero_padding(rs, d0, d1, n1);
  }
  if (dirs & HQ_COLWISE) {
    cd = col->buf[FP8B_DATA].ptr;
    cs = col->buf[FP8B_SCALE_INV].ptr;
    hq_fp8b_scale_shape(M, K, 1, c->two_d, &d0, &d1, &n1);
    zero_padding(cs, d0, d1, n1);
  }
  if (M <= 0 || K <= 0 || (!rd && !cd)) return HQ_OK;
  tile *t = host->alloc(call, sizeof *t);
  if (!t) return HQ_ENOMEM;
  /* one read of the input: every 128x128 tile is loaded once and feeds both directions */
  for (int64_t m0 = 0; m0 < M; m0 += B) {
    const int nr = (int)(M - m0 < B ? M - m0 : B);
    for (int64_t k0 = 0; k0 < K; k0 += B) {
      const int nc = (int)(K - k0 < B ? K - k0 : B);
      load_tile(src, m0, k0, nr, nc, t->x);
      if (c->two_d) tile_2d(c, src->dtype, t, M, K, m0, k0, nr, nc, rd, rs, cd, cs);
      else tile_1d(c, src->dtype, t, M, K, m0, k0, nr, nc, rd, rs, cd, cs);
    }
  }
  host->free(call, t);
  return HQ_OK;
}

static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  const fp8b_cfg *c = cfgp;
  const hq_host_api *host = call->host;
  int rc = host_only(call, "dequantize");
  if (!rc) rc = check_hp(host, dst->dtype, "destination");
  if (rc) return rc;
  const int64_t M = dst->rows, K = dst->cols;
  if (M != s->rows || K != s->cols)
    return host->error(HQ_ESHAPE, "destination [%lld, %lld] does not match the storage's "
                       "[%lld, %lld]", (long long)M, (long long)K, (long long)s->rows,
                       (long long)s->cols);
  const uint8_t *q = s->buf[FP8B_DATA].ptr;
  const float *sc = s->buf[FP8B_SCALE_INV].ptr;
  const int colwise = s->dir == HQ_COLWISE;
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      float si = sc[hq_fp8b_scale_index(m, k, M, K, colwise, c->two_d)];
      uint8_t b = colwise ? q[k * M + m] : q[m * K + k];
      hq_store_hp(dst->data, m * K + k, dst->dtype, hq_fp8_dequantize(b, si, c->kind));
    }
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(fp8b_cfg),
    .name = "fp8_block",
    .version = "1.0",
    .description = "FP8 block scaling (DeepSeek-V3): 1x128/128x1 or 128x128 blocks, FP32 scales, "
                   "GEMM-ready layouts; columnwise = [K, M]",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY,
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
