/*
** mxfp8.c -- MXFP8 (E4M3 / E5M2 elements, one E8M0 scale per 32 elements): the plugin ABI and
** the CPU reference (FORMATS.md section 2, TE's numerics bit for bit).
**
** Quantize, per block of 32 elements (1x32 along K rowwise, 32x1 down a column columnwise, or one
** 32x32 tile shared by both directions with block_2d):
**   amax = max|x| over the block (NaN ignored, Inf included);
**   e    = hq_mxfp8_scale_code(amax): t = RN(amax * RN(1/max_norm)), E8M0 rounded UP;
**   q    = fp8_rne_satfinite(RN(x * 2^(127-e))).
** Both directions are quantized independently from the high-precision input; when both are
** asked for in one call (dirs == HQ_BOTH) the input is read once. The columnwise copy is NOT
** transposed: it is [M, K] like the rowwise one, only its blocks run down the columns.
**
** Special values: a NaN element does not enter amax and is stored as NaN (0x7F); its block's
** scale comes from the other elements (all-NaN block: e = 0); it dequantizes to NaN. A +-Inf
** element makes its block's amax Inf, so e = 0xFE (2^127): the Inf element becomes +-max (0x7E
** E4M3, 0x7B E5M2), which dequantizes to +-Inf again (max * 2^127 overflows FP32), and the finite
** elements of that block are multiplied by 2^-127, so all below about 2^117 (E4M3; 2^110 E5M2)
** become +-0. An all-zero block has e = 0 and zero elements (signs kept).
**
** Buffers of each storage, in save order (M % 32 == 0 and K % 32 == 0 are required):
**   rowwise:
**     0 data                  e4m3|e5m2 [M, K]                           HQ_BUF_SHARDED
**     1 scale_inv             e8m0 [roundup(M,128), roundup(K/32,4)]     HQ_BUF_SHARDED
**   columnwise:
**     0 columnwise_data       e4m3|e5m2 [M, K] (not transposed)          HQ_BUF_SHARDED
**     1 columnwise_scale_inv  e8m0 [roundup(M/32,4), roundup(K,128)]
** Element (i, j) of data is scaled by rowwise scale (i, j/32), at byte
** hq_mxfp8_row_scale_idx(i, j/32, K, swizzle); element (i, j) of columnwise_data by columnwise
** scale (i/32, j), at byte hq_mxfp8_col_scale_idx(i/32, j, M, K, swizzle). With swizzle = false
** the scale buffers are row-major as their shapes say (FORMATS.md 2.3); with swizzle = true they
** hold the cuBLAS VEC32_UE8M0 layout (FORMATS.md 2.4; columnwise: the [M/32][K] scale matrix used
** as its transpose). Every padded scale byte is written as zero, in both layouts, so the bytes
** of a quantized storage are fully deterministic. The layout is recorded in the storage's meta
** (mxfp8.h), so dequantize reads a storage the way it was written.
**
** Dequantize: x = RN(fp32(q) * 2^(e-127)) from either direction, into f32/bf16/f16.
** CPU only for now: a call on a CUDA device returns HQ_ENOTSUP.
*/
#include <string.h>

#include "hq/numerics.h"
#include "hq/plugin.h"
#include "mxfp8.h"

enum { OPT_DTYPE, OPT_SWIZZLE, OPT_2D };

static const hq_option options[] = {
    [OPT_DTYPE] = {"dtype", HQ_OPT_ENUM, "e4m3", "FP8 element type (max 448 / 57344)",
                   "e4m3|e5m2", 0, -1},
    [OPT_SWIZZLE] = {"swizzle", HQ_OPT_BOOL, "false",
                     "scale buffers in the cuBLAS swizzled (GEMM-ready) layout instead of compact "
                     "row-major", NULL, 0, -1},
    [OPT_2D] = {"block_2d", HQ_OPT_BOOL, "false",
                "one scale per 32x32 tile, the same code in both directions (for weights)", NULL,
                0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  mxfp8_cfg *c = cfgp;
  (void)host;
  c->kind = v[OPT_DTYPE].i ? HQ_FP8_E5M2 : HQ_FP8_E4M3;
  c->swizzle = (int)v[OPT_SWIZZLE].i;
  c->block_2d = (int)v[OPT_2D].i;
  return HQ_OK;
}

static int check_shape(const hq_host_api *host, int64_t rows, int64_t cols) {
  if (rows < 0 || rows % HQ_MXFP8_BLOCK)
    return host->error(HQ_ESHAPE, "mxfp8: rows = %lld is not a multiple of %d", (long long)rows,
                       HQ_MXFP8_BLOCK);
  if (cols < 0 || cols % HQ_MXFP8_BLOCK)
    return host->error(HQ_ESHAPE, "mxfp8: cols = %lld is not a multiple of %d", (long long)cols,
                       HQ_MXFP8_BLOCK);
  return HQ_OK;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const mxfp8_cfg *c = cfgp;
  (void)dirs;
  int rc = check_shape(host, rows, cols);
  if (rc) return rc;
  hq_dtype t = c->kind == HQ_FP8_E5M2 ? HQ_E5M2 : HQ_E4M3;
  out->nbuf = MXFP8_NBUF;
  out->meta[MXFP8_META_MAGIC] = MXFP8_MAGIC;
  out->meta[MXFP8_META_KIND] = (uint8_t)c->kind;
  out->meta[MXFP8_META_SWIZZLED] = (uint8_t)c->swizzle;
  out->meta[MXFP8_META_2D] = (uint8_t)c->block_2d;
  if (dir == HQ_ROWWISE) {
    hq_buffer_describe(&out->buf[MXFP8_DATA], "data", t, 2, rows, cols, HQ_BUF_SHARDED);
    hq_buffer_describe(&out->buf[MXFP8_SCALE_INV], "scale_inv", HQ_E8M0, 2,
                       hq_mxfp8_row_scale_rows(rows), hq_mxfp8_row_scale_cols(cols),
                       HQ_BUF_SHARDED);
  } else {
    hq_buffer_describe(&out->buf[MXFP8_DATA], "columnwise_data", t, 2, rows, cols, HQ_BUF_SHARDED);
    hq_buffer_describe(&out->buf[MXFP8_SCALE_INV], "columnwise_scale_inv", HQ_E8M0, 2,
                       hq_mxfp8_col_scale_rows(rows), hq_mxfp8_col_scale_cols(cols), 0);
  }
  return HQ_OK;
}

/* Bytes of the scale buffer of a storage of direction dir. */
static size_t scale_bytes(uint32_t dir, int64_t M, int64_t K) {
  if (dir == HQ_ROWWISE) return (size_t)(hq_mxfp8_row_scale_rows(M) * hq_mxfp8_row_scale_cols(K));
  return (size_t)(hq_mxfp8_col_scale_rows(M) * hq_mxfp8_col_scale_cols(K));
}

/* A storage is usable when it is one layout() described for this shape and direction and its
   buffers are allocated (guards every index computed below). */
static int check_storage(const hq_host_api *host, const hq_storage *s, uint32_t dir, int64_t M,
                         int64_t K, const char *what) {
  if (!s) return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage is missing", what,
                             dir == HQ_ROWWISE ? "rowwise" : "columnwise");
  if (s->meta[MXFP8_META_MAGIC] != MXFP8_MAGIC || s->nbuf != MXFP8_NBUF || s->dir != dir)
    return host->error(HQ_EINVAL, "mxfp8: %s: the storage was not laid out by mxfp8", what);
  if (s->rows != M || s->cols != K)
    return host->error(HQ_ESHAPE, "mxfp8: %s: tensor [%lld, %lld] does not match the storage's "
                       "[%lld, %lld]", what, (long long)M, (long long)K, (long long)s->rows,
                       (long long)s->cols);
  int rc = check_shape(host, M, K);
  if (rc) return rc;
  const hq_buffer *d = &s->buf[MXFP8_DATA], *e = &s->buf[MXFP8_SCALE_INV];
  if ((d->dtype != HQ_E4M3 && d->dtype != HQ_E5M2) || e->dtype != HQ_E8M0 ||
      d->bytes != (size_t)(M * K) || e->bytes != scale_bytes(dir, M, K))
    return host->error(HQ_EINVAL, "mxfp8: %s: buffer dtypes or sizes differ from the layout", what);
  if ((M * K != 0 && !d->ptr) || (e->bytes != 0 && !e->ptr))
    return host->error(HQ_EINVAL, "mxfp8: %s: a buffer is not allocated", what);
  return HQ_OK;
}

static int check_hp(const hq_host_api *host, const hq_tensor *t, const char *what) {
  if (!t || (t->rows * t->cols != 0 && !t->data))
    return host->error(HQ_EINVAL, "mxfp8: %s: NULL tensor", what);
  if (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16)
    return host->error(HQ_EINVAL, "mxfp8: %s: dtype %d is not f32, f16 or bf16", what,
                       (int)t->dtype);
  return HQ_OK;
}

static int no_device(const hq_call *call, const char *what) {
  return call->host->error(HQ_ENOTSUP, "mxfp8: %s on CUDA device %d is not supported: this "
                           "build has the CPU reference only (CUDA kernels are not written yet)",
                           what, (int)call->device);
}

// --- CPU reference ----------------------------------------------------------------------------

/* Columns per tile: a tile of 32 rows x TW columns (64 KiB of FP32, host->alloc scratch) is
   loaded once and feeds both directions, so the columnwise blocks are read from cache; 32 long
   row runs of the source keep the hardware prefetchers streaming. */
#define TW 512
#define BLK HQ_MXFP8_BLOCK

/* Convert n high-precision elements to FP32 (exact for every input dtype). f16 goes through
   `f16`, a table of hq_f16_to_f32 over all 65536 codes, when the caller built one. */
static void load_row(float *dst, const void *src, int64_t off, int64_t n, hq_dtype t,
                     const float *f16) {
  const uint16_t *p = (const uint16_t *)src + off;
  if (t == HQ_F32) {
    memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
  } else if (t == HQ_BF16) {
    for (int64_t k0 = 0; k0 < n; k0 += BLK) /* n is a multiple of 32: fixed-count inner loops */
      for (int k = 0; k < BLK; k++) dst[k0 + k] = hq_bf16_to_f32(p[k0 + k]);
  } else if (f16) {
    for (int64_t k = 0; k < n; k++) dst[k] = f16[p[k]];
  } else {
    for (int64_t k = 0; k < n; k++) dst[k] = hq_f16_to_f32(p[k]);
  }
}

/* The loops below have a fixed trip count of 32, restrict pointers and branch-free bodies (the
   casts and selects of numerics.h), so that the compiler vectorizes them. */

/* max|x| of 32 elements (NaN ignored), as FP32 bits. */
static uint32_t amax32(const float *restrict x) {
  uint32_t m = 0;
  for (int k = 0; k < BLK; k++) {
    uint32_t a = hq_abs_bits_nonan(x[k]);
    m = a > m ? a : m;
  }
  return m;
}

/* m[k] = max(m[k], |x[k]|) over 32 columns (NaN ignored). */
static void colmax32(uint32_t *restrict m, const float *restrict x) {
  for (int k = 0; k < BLK; k++) {
    uint32_t a = hq_abs_bits_nonan(x[k]);
    m[k] = a > m[k] ? a : m[k];
  }
}

/* dst[k] = fp8(RN(x[k] * mult)) for 32 elements sharing one multiplier ... */
static void quant32(uint8_t *restrict dst, const float *restrict x, float mult, int kind) {
  if (kind == HQ_FP8_E5M2)
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e5m2(hq_mul_rn(x[k], mult));
  else
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e4m3(hq_mul_rn(x[k], mult));
}

/* ... or each with its own (32 columns of one tile row). */
static void quant32_cols(uint8_t *restrict dst, const float *restrict x,
                         const float *restrict mult, int kind) {
  if (kind == HQ_FP8_E5M2)
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e5m2(hq_mul_rn(x[k], mult[k]));
  else
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e4m3(hq_mul_rn(x[k], mult[k]));
}

typedef struct qjob {
  const mxfp8_cfg *c;
  int64_t M, K;
  uint8_t *rd, *rs;   /* rowwise data / scales, or NULL */
  uint8_t *cd, *cs;   /* columnwise data / scales, or NULL */
  size_t rs_bytes, cs_bytes;
  int rswz, cswz;     /* the storages' layouts */
} qjob;

/* One tile: rows i0 .. i0+31, columns j0 .. j0+w-1 (w a multiple of 32), already in FP32. */
static void quant_tile(const qjob *q, float (*tile)[TW], int64_t i0, int64_t j0, int w) {
  const int kind = q->c->kind;
  const int64_t K = q->K, M = q->M;
  if (q->c->block_2d) {
    for (int b = 0; b < w; b += BLK) {
      uint32_t m = 0;
      for (int r = 0; r < BLK; r++) {
        uint32_t a = amax32(&tile[r][b]);
        m = a > m ? a : m;
      }
      uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(m), kind);
      float mult = hq_e8m0_quant_mult(e);
      for (int r = 0; r < BLK; r++) {
        int64_t off = (i0 + r) * K + j0 + b;
        uint8_t *dst = q->rd ? q->rd + off : q->cd + off;
        quant32(dst, &tile[r][b], mult, kind);
        if (q->rd && q->cd) memcpy(q->cd + off, dst, BLK);
      }
      if (q->rs)
        for (int r = 0; r < BLK; r++)
          q->rs[hq_mxfp8_row_scale_idx(i0 + r, (j0 + b) / BLK, K, q->rswz)] = e;
      if (q->cs)
        for (int k = 0; k < BLK; k++)
          q->cs[hq_mxfp8_col_scale_idx(i0 / BLK, j0 + b + k, M, K, q->cswz)] = e;
    }
    return;
  }
  if (q->rd) {
    for (int r = 0; r < BLK; r++)
      for (int b = 0; b < w; b += BLK) {
        uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(amax32(&tile[r][b])), kind);
        quant32(q->rd + (i0 + r) * K + j0 + b, &tile[r][b], hq_e8m0_quant_mult(e), kind);
        q->rs[hq_mxfp8_row_scale_idx(i0 + r, (j0 + b) / BLK, K, q->rswz)] = e;
      }
  }
  if (q->cd) {
    uint32_t m[TW];
    float mult[TW];
    memset(m, 0, sizeof m);
    for (int r = 0; r < BLK; r++)
      for (int b = 0; b < w; b += BLK) colmax32(&m[b], &tile[r][b]);
    for (int k = 0; k < w; k++) {
      uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(m[k]), kind);
      mult[k] = hq_e8m0_quant_mult(e);
      q->cs[hq_mxfp8_col_scale_idx(i0 / BLK, j0 + k, M, K, q->cswz)] = e;
    }
    for (int r = 0; r < BLK; r++)
      for (int b = 0; b < w; b += BLK)
        quant32_cols(q->cd + (i0 + r) * K + j0 + b, &tile[r][b], &mult[b], kind);
  }
}

/* f16 sources of at least this many elements are decoded through a 256 KiB table (building it
   costs about as much as decoding this many elements directly). */
#define F16_TABLE_MIN (1 << 16)

static int quantize_cpu(const qjob *q, const hq_call *call, const hq_tensor *src) {
  int table = src->dtype == HQ_F16 && q->M * q->K >= F16_TABLE_MIN;
  size_t tile_bytes = BLK * TW * sizeof(float);
  float *scratch = call->host->alloc(call, tile_bytes + (table ? 65536 * sizeof(float) : 0));
  if (!scratch) return HQ_ENOMEM; /* host->alloc recorded the message */
  float (*tile)[TW] = (float (*)[TW])scratch;
  float *f16 = table ? scratch + BLK * TW : NULL;
  if (f16)
    for (uint32_t h = 0; h < 65536; h++) f16[h] = hq_f16_to_f32((uint16_t)h);
  /* padding is zero; every in-bounds entry is overwritten below */
  if (q->rs) memset(q->rs, 0, q->rs_bytes);
  if (q->cs) memset(q->cs, 0, q->cs_bytes);
  for (int64_t i0 = 0; i0 < q->M; i0 += BLK)
    for (int64_t j0 = 0; j0 < q->K; j0 += TW) {
      int w = (int)(q->K - j0 < TW ? q->K - j0 : TW);
      for (int r = 0; r < BLK; r++)
        load_row(tile[r], src->data, (i0 + r) * q->K + j0, w, src->dtype, f16);
      quant_tile(q, tile, i0, j0, w);
    }
  call->host->free(call, scratch);
  return HQ_OK;
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const mxfp8_cfg *c = cfgp;
  const hq_host_api *host = call->host;
  if (call->device != HQ_DEVICE_HOST) return no_device(call, "quantize");
  int rc = check_hp(host, src, "quantize source");
  if (rc) return rc;
  if (!(dirs & HQ_BOTH) || (dirs & ~HQ_BOTH))
    return host->error(HQ_EINVAL, "mxfp8: quantize: dirs = 0x%x is not rowwise, columnwise or "
                       "both", dirs);
  const int64_t M = src->rows, K = src->cols;
  if ((dirs & HQ_ROWWISE) && (rc = check_storage(host, row, HQ_ROWWISE, M, K, "quantize")))
    return rc;
  if ((dirs & HQ_COLWISE) && (rc = check_storage(host, col, HQ_COLWISE, M, K, "quantize")))
    return rc;
  qjob q = {c, M, K, NULL, NULL, NULL, NULL, 0, 0, 0, 0};
  if (dirs & HQ_ROWWISE) {
    q.rd = row->buf[MXFP8_DATA].ptr;
    q.rs = row->buf[MXFP8_SCALE_INV].ptr;
    q.rs_bytes = row->buf[MXFP8_SCALE_INV].bytes;
    q.rswz = row->meta[MXFP8_META_SWIZZLED];
  }
  if (dirs & HQ_COLWISE) {
    q.cd = col->buf[MXFP8_DATA].ptr;
    q.cs = col->buf[MXFP8_SCALE_INV].ptr;
    q.cs_bytes = col->buf[MXFP8_SCALE_INV].bytes;
    q.cswz = col->meta[MXFP8_META_SWIZZLED];
  }
  return quantize_cpu(&q, call, src);
}

static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const hq_host_api *host = call->host;
  if (call->device != HQ_DEVICE_HOST) return no_device(call, "dequantize");
  int rc = check_hp(host, dst, "dequantize destination");
  if (rc) return rc;
  if (!s) return host->error(HQ_EINVAL, "mxfp8: dequantize: NULL storage");
  const int64_t M = dst->rows, K = dst->cols;
  if ((rc = check_storage(host, s, s->dir, M, K, "dequantize"))) return rc;
  const uint8_t *qd = s->buf[MXFP8_DATA].ptr, *qs = s->buf[MXFP8_SCALE_INV].ptr;
  const int kind = s->buf[MXFP8_DATA].dtype == HQ_E5M2 ? HQ_FP8_E5M2 : HQ_FP8_E4M3;
  const int swz = s->meta[MXFP8_META_SWIZZLED], colwise = s->dir == HQ_COLWISE;
  float lut[256], sinv[TW];
  for (int k = 0; k < 256; k++) lut[k] = hq_fp8_to_f32((uint8_t)k, kind);
  float *out = dst->dtype == HQ_F32 ? dst->data : NULL;
  for (int64_t i = 0; i < M; i++) {
    for (int64_t j0 = 0; j0 < K; j0 += TW) {
      int w = (int)(K - j0 < TW ? K - j0 : TW);
      for (int k = 0; k < w; k++) {
        int64_t j = j0 + k;
        if (colwise) sinv[k] = hq_e8m0_to_f32(qs[hq_mxfp8_col_scale_idx(i / 32, j, M, K, swz)]);
        else if (k % 32 == 0)
          sinv[k] = hq_e8m0_to_f32(qs[hq_mxfp8_row_scale_idx(i, j / 32, K, swz)]);
        else sinv[k] = sinv[k - k % 32];
      }
      const uint8_t *qrow = qd + i * K + j0;
      if (out) {
        for (int k = 0; k < w; k++) out[i * K + j0 + k] = hq_mul_rn(lut[qrow[k]], sinv[k]);
      } else {
        for (int k = 0; k < w; k++)
          hq_store_hp(dst->data, i * K + j0 + k, dst->dtype, hq_mul_rn(lut[qrow[k]], sinv[k]));
      }
    }
  }
  return HQ_OK;
}

/* Fresh storages (hq_make_empty): zero the scale buffers, so their padding is zero from the
   start, as after a quantize. The data is left for the caller to fill. */
static int make_empty(const void *cfgp, const hq_call *call, hq_storage *s) {
  (void)cfgp;
  if (call->device != HQ_DEVICE_HOST) return no_device(call, "make_empty");
  hq_buffer *e = &s->buf[MXFP8_SCALE_INV];
  if (s->nbuf == MXFP8_NBUF && e->ptr) memset(e->ptr, 0, e->bytes);
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(mxfp8_cfg),
    .name = "mxfp8",
    .version = "1.0",
    .description = "MXFP8 (E4M3/E5M2, E8M0 scale per 32 elements, TE numerics); columnwise "
                   "copy untransposed",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY,
    .options = options,
    .configure = configure,
    .layout = layout,
    .make_empty = make_empty,
    .quantize = quantize,
    .dequantize = dequantize,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v1(const hq_host_api *host) {
  if (host->abi_major != HQ_ABI_MAJOR) return NULL;
  return &ops;
}
