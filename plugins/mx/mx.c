/*
** mx.c -- MXFP4 and MXFP6 (OCP Microscaling v1.0: FP4 E2M1 or FP6 E3M2 / E2M3 elements, one E8M0
** scale per 32 elements): the plugin (ABI 2.1) and its CPU reference. One source, two modules:
** built with -DHQ_MX_FP=4 it is `mxfp4`, with -DHQ_MX_FP=6 `mxfp6` (plugins/mx/local.mk); the
** two differ only in the element type and its packing, so they share every line of code and
** every rule (mx_rules.h; docs/formats.md "MXFP4 and MXFP6").
**
** Quantize, per block of 32 elements (1x32 along K rowwise, 32x1 down a column columnwise), with
** torchao's to_mx numerics (FLOOR, its default) bit for bit, or its round-up rule (RCEIL):
**   A    = max |x| over the block (a NaN makes A NaN; Inf counts);
**   e    = hq_mx_scale_code(A): FLOOR max(E(A) - emax, 0); RCEIL E8M0_rp(RN(A / max)); NaN 0xFF;
**   q    = cast(RN(x * hq_mx_encode_mult(e))): E2M1 / E3M2 / E2M3 round to nearest even with
**          saturation, or stochastic rounding (option), NaN -> +max.
** Both directions are quantized independently from the high-precision input (read once when
** both are asked for). The columnwise copy is NOT transposed: it is [M, K] like the rowwise one,
** packed along K, only its blocks run down the columns, so that every buffer splits on whole
** rows (FSDP by the core's generic byte movement, packing never straddles a shard). There is no
** per-tensor amax.
**
** Buffers of each storage, in save order (M % 32 == 0 and K % 32 == 0 are required):
**   rowwise:
**     0 data                  DATA  e2m1x2|e3m2x4|e2m3x4 [M, K/2 | 3K/4] bytes  ROWS, m_div 1
**     1 scale_inv             SCALE e8m0 [M, K/32]                               ROWS, m_div 1
**   columnwise:
**     0 columnwise_data       DATA  as data (not transposed)                     ROWS, m_div 1
**     1 columnwise_scale_inv  SCALE e8m0 [M/32, K]                               ROWS, m_div 32
** Packing: E2M1X2 element 2i in the low nibble of byte i (torchao's pack_uint4); FP6 four codes
** in three bytes, element n at bits 6n .. 6n+5 of the row's little-endian bit stream
** (hq_fp6_pack4). No padding anywhere: the bytes of a quantized storage are all determined.
** Operand descriptor: elem = the data dtype; order MK (both directions); scale_mode
** HQ_SCALE_VEC32_UE8M0; scale_layout rowwise OUTER_MAJOR, columnwise BLOCK_MAJOR; block 1x32 /
** 32x1; transform NONE; shard_rows 32 (0 with stochastic rounding: its stream follows each
** block's position in the whole tensor); emul_dtype HQ_BF16 (every finite raw value, an element
** times 2^(e-127), is exact in BF16: at most 4 significant bits, the smallest 2^-131).
**
** Dequantize (either direction, into f32 / bf16 / f16): x' = RN(elem(q) * 2^(e-127)), then RN to
** the output dtype. The raw values (HQ_CALL_DEQ_RAW) are the same values (no per-tensor factor,
** no transform). No native GEMM: cuBLASLt's MXFP4 mode wants both operands K-major, which the
** untransposed columnwise copy is not; the emulated path multiplies the raw values.
**
** Options: mxfp6 elem (e2m3 | e3m2); both: scale (floor | rceil), stochastic_rounding (false) and
** seed (0 = the context's): random bytes from Philox4x32-10 keyed by the seed, NVFP4's stream at
** two half-blocks per 32-element block (hq_mx_sr_bits), the same on every device.
**
** CUDA path (mx.cu, when CUDA is configured): the same rules functions, bit-identical bytes;
** without CUDA a device call returns HQ_ENOTSUP.
*/
#include <stddef.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION: a stock module reports the package version */
#include "hq/numerics.h"
#include "hq/plugin.h"
#include "mx.h"
#include "mx_rules.h"

#if HQ_MX_FP == 4
#define MX_NAME "mxfp4"
#elif HQ_MX_FP == 6
#define MX_NAME "mxfp6"
#else
#error "build mx.c with -DHQ_MX_FP=4 or -DHQ_MX_FP=6"
#endif

#define BLK HQ_MX_BLOCK

enum {
  OPT_SCALE,
  OPT_SR,
  OPT_SEED,
#if HQ_MX_FP == 6
  OPT_ELEM,
#endif
  OPT_RAW
};

static const hq_option options[] = {
    [OPT_SCALE] = {"scale", HQ_OPT_ENUM, "floor",
                   "E8M0 scale rule: floor (OCP / torchao default; the block top may saturate) "
                   "or rceil (rounded up from amax/max: nothing saturates)",
                   "floor|rceil", 0, -1},
    [OPT_SR] = {"stochastic_rounding", HQ_OPT_BOOL, "false",
                "stochastic rounding of the elements (Philox4x32-10), both directions", NULL, 0,
                -1},
    [OPT_SEED] = {"seed", HQ_OPT_INT, "0", "stochastic rounding seed; 0 uses the context's seed",
                  NULL, 0, 9223372036854775807.0},
#if HQ_MX_FP == 6
    [OPT_ELEM] = {"elem", HQ_OPT_ENUM, "e2m3", "FP6 element type (max 7.5 / 28)", "e2m3|e3m2", 0,
                  -1},
#endif
    [OPT_RAW] = {"raw_copy", HQ_OPT_ENUM, "none",
                 "keep each copy's raw values in BF16 beside its codes (2 more bytes an element): "
                 "an emulated GEMM reads them instead of dequantizing",
                 "none|bf16", 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  mx_cfg *c = cfgp;
  (void)host;
#if HQ_MX_FP == 6
  c->kind = v[OPT_ELEM].i ? HQ_E3M2X4 : HQ_E2M3X4;
#else
  c->kind = HQ_E2M1X2;
#endif
  c->rule = v[OPT_SCALE].i ? HQ_MX_RCEIL : HQ_MX_FLOOR;
  c->sr = (int)v[OPT_SR].i;
  c->seed = (uint64_t)v[OPT_SEED].i;
  c->raw_copy = (int)v[OPT_RAW].i;
  return HQ_OK;
}

static int kind_ok(hq_dtype t) {
#if HQ_MX_FP == 6
  return t == HQ_E3M2X4 || t == HQ_E2M3X4;
#else
  return t == HQ_E2M1X2;
#endif
}

static int check_shape(const hq_host_api *host, int64_t rows, int64_t cols) {
  if (rows < 0 || rows % BLK)
    return host->error(HQ_ESHAPE, MX_NAME ": rows = %lld is not a multiple of %d",
                       (long long)rows, BLK);
  if (cols < 0 || cols % BLK)
    return host->error(HQ_ESHAPE, MX_NAME ": cols = %lld is not a multiple of %d",
                       (long long)cols, BLK);
  return HQ_OK;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const mx_cfg *c = cfgp;
  (void)dirs; /* the two directions share no buffer */
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, MX_NAME ": layout: dir = 0x%x is not rowwise or columnwise",
                       dir);
  int rc = check_shape(host, rows, cols);
  if (rc) return rc;
  const int row = dir == HQ_ROWWISE;
  hq_operand_desc *d = &out->desc;
  d->elem = c->kind;
  d->order = HQ_ORDER_MK; /* the columnwise copy is not transposed */
  d->scale_mode = HQ_SCALE_VEC32_UE8M0;
  d->scale_layout = row ? HQ_SCALE_LAYOUT_OUTER_MAJOR : HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  d->block_m = row ? 1 : BLK;
  d->block_k = row ? BLK : 1;
  d->transform = HQ_TRANSFORM_NONE;
  d->transform_param = 0;
  d->shard_rows = c->sr ? 0 : BLK;
  d->emul_dtype = HQ_BF16; /* raw values are exact in BF16 (header comment) */
  hq_buffer *b = hq_buffer_describe(out, MX_DATA, row ? "data" : "columnwise_data", HQ_ROLE_DATA,
                                    c->kind, 2, rows, hq_mx_row_bytes(cols, c->kind));
  hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  if (row)
    b = hq_buffer_describe(out, MX_SCALE_INV, "scale_inv", HQ_ROLE_SCALE, HQ_E8M0, 2, rows,
                           cols / BLK);
  else
    b = hq_buffer_describe(out, MX_SCALE_INV, "columnwise_scale_inv", HQ_ROLE_SCALE, HQ_E8M0, 2,
                           rows / BLK, cols);
  hq_buffer_gather(b, HQ_GATHER_ROWS, row ? 1 : BLK);
  if (c->raw_copy) {
    b = hq_buffer_describe(out, MX_RAW, row ? "raw" : "columnwise_raw", HQ_ROLE_RAW, HQ_BF16, 2,
                           rows, cols);
    hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  }
  return HQ_OK;
}

/* What the loops need of one storage, read from its descriptor and buffers. */
typedef struct sview {
  uint8_t *data, *scale;
  uint16_t *raw;      /* the raw values' BF16 buffer (raw_copy), or NULL */
  hq_dtype kind;
} sview;

/* A storage is usable when its descriptor and buffers are this module's layout of this
   direction and shape and its buffers are allocated (guards every index computed below). */
static int read_storage(const hq_host_api *host, const hq_storage *s, uint32_t dir, int64_t M,
                        int64_t K, const char *what, sview *v) {
  const char *dn = dir == HQ_ROWWISE ? "rowwise" : "columnwise";
  if (!s) return host->error(HQ_EINVAL, MX_NAME ": %s: the %s storage is missing", what, dn);
  if (s->dir != dir || (s->nbuf != MX_NBUF && s->nbuf != MX_NBUF + 1))
    return host->error(HQ_EINVAL, MX_NAME ": %s: the %s storage was not laid out by " MX_NAME
                       " (dir %u, %u buffers)", what, dn, s->dir, s->nbuf);
  if (s->rows != M || s->cols != K)
    return host->error(HQ_ESHAPE, MX_NAME ": %s: tensor [%lld, %lld] does not match the "
                       "storage's [%lld, %lld]", what, (long long)M, (long long)K,
                       (long long)s->rows, (long long)s->cols);
  int rc = check_shape(host, M, K);
  if (rc) return rc;
  const hq_operand_desc *d = &s->desc;
  const int row = dir == HQ_ROWWISE;
  if (!kind_ok(d->elem) || d->order != HQ_ORDER_MK || d->scale_mode != HQ_SCALE_VEC32_UE8M0 ||
      d->transform != HQ_TRANSFORM_NONE ||
      d->scale_layout != (row ? HQ_SCALE_LAYOUT_OUTER_MAJOR : HQ_SCALE_LAYOUT_BLOCK_MAJOR) ||
      d->block_m != (row ? 1 : BLK) || d->block_k != (row ? BLK : 1))
    return host->error(HQ_EINVAL, MX_NAME ": %s: the %s storage's descriptor is not an " MX_NAME
                       " one (elem %d, order %u, scale mode %u, scale layout %u, block %dx%d, "
                       "transform %u)", what, dn, (int)d->elem, d->order, d->scale_mode,
                       d->scale_layout, d->block_m, d->block_k, d->transform);
  const hq_buffer *db = hq_storage_cbuf(s, MX_DATA), *eb = hq_storage_cbuf(s, MX_SCALE_INV);
  if (db->role != HQ_ROLE_DATA || db->dtype != d->elem ||
      db->bytes != (size_t)(M * hq_mx_row_bytes(K, d->elem)) || eb->role != HQ_ROLE_SCALE ||
      eb->dtype != HQ_E8M0 || eb->bytes != (size_t)(M * K / BLK))
    return host->error(HQ_EINVAL, MX_NAME ": %s: the %s storage's buffer roles, dtypes or sizes "
                       "differ from an " MX_NAME " layout of [%lld, %lld]", what, dn,
                       (long long)M, (long long)K);
  const hq_buffer *rb = s->nbuf > MX_NBUF ? hq_storage_cbuf(s, MX_RAW) : NULL;
  if (rb && (rb->role != HQ_ROLE_RAW || rb->dtype != HQ_BF16 || rb->bytes != (size_t)(M * K) * 2))
    return host->error(HQ_EINVAL, MX_NAME ": %s: the %s storage's third buffer is not its raw "
                       "values (bf16 [%lld, %lld])", what, dn, (long long)M, (long long)K);
  if ((db->bytes != 0 && !db->ptr) || (eb->bytes != 0 && !eb->ptr) ||
      (rb && rb->bytes != 0 && !rb->ptr))
    return host->error(HQ_EINVAL, MX_NAME ": %s: a buffer of the %s storage is not allocated",
                       what, dn);
  v->raw = rb ? rb->ptr : NULL;
  v->data = db->ptr;
  v->scale = eb->ptr;
  v->kind = d->elem;
  return HQ_OK;
}

static int check_hp(const hq_host_api *host, const hq_tensor *t, const char *what) {
  if (!t || t->rows < 0 || t->cols < 0 || (t->rows * t->cols != 0 && !t->data))
    return host->error(HQ_EINVAL, MX_NAME ": %s: NULL tensor", what);
  if (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16)
    return host->error(HQ_EINVAL, MX_NAME ": %s: dtype %d is not f32, f16 or bf16", what,
                       (int)t->dtype);
  return HQ_OK;
}

#ifndef HQ_HAVE_CUDA
static int no_device(const hq_call *call, const char *what) {
  return call->host->error(HQ_ENOTSUP, MX_NAME ": %s on CUDA device %d is not supported: this "
                           "build has no CUDA (CPU reference only)", what, (int)call->device);
}
#endif

// --- CPU reference ----------------------------------------------------------------------------

/* Columns per tile: 32 rows x TW columns of FP32 (64 KiB, in call->scratch) are loaded once and
   feed both directions. */
#define TW 512

static int64_t tile_width(int64_t K) { return K < TW ? K : TW; }

/* Scratch of a quantize or update: the FP32 tile. Nothing on a CUDA device. */
static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)cfgp, (void)dirs;
  if (device != HQ_DEVICE_HOST || rows <= 0 || cols <= 0) return 0;
  return (size_t)(BLK * tile_width(cols)) * sizeof(float);
}

/* A's bits over 32 values: |x| bit patterns order like the values and every NaN pattern lies
   above Inf's, so the integer max is A's pattern, a NaN one when any value is NaN. */
static uint32_t amax32(const float *restrict x, int64_t stride) {
  uint32_t m = 0;
  for (int k = 0; k < BLK; k++) {
    uint32_t a = hq_f32_bits(x[k * stride]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

/* One block of 32 values x[k * stride] with scale code e into 32 codes (random bytes from
   bits when stochastic). */
static void cast32(uint32_t *restrict c, const float *restrict x, int64_t stride, uint8_t e,
                   const mx_job *q, const uint32_t *bits) {
  const float mult = hq_mx_encode_mult(e, q->rule);
  if (bits)
    for (int k = 0; k < BLK; k++)
      c[k] = hq_mx_cast_sr(hq_mul_rn(x[k * stride], mult), q->kind, hq_mx_sr_byte(bits, k));
  else
    for (int k = 0; k < BLK; k++) c[k] = hq_mx_cast(hq_mul_rn(x[k * stride], mult), q->kind);
}

/* Tile rows i0 .. i0+31, columns j0 .. j0+w-1 (w a multiple of 32), row r at tile + r * ts. */
static void quant_tile(const mx_job *q, const uint32_t *rk, const float *tile, int64_t ts,
                       int64_t i0, int64_t j0, int w) {
  const int64_t K = q->K, rb = hq_mx_row_bytes(K, q->kind);
  const int64_t bb = hq_mx_row_bytes(BLK, q->kind); /* bytes of one packed block */
  uint32_t c[BLK], bits[8];
  uint32_t ccode[BLK][BLK]; /* columnwise: codes of 32 columns, [row][column] */
  for (int b = 0; b < w; b += BLK) {
    const int64_t j = j0 + b;
    if (q->rd)
      for (int r = 0; r < BLK; r++) {
        const float *x = tile + r * ts + b;
        const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax32(x, 1)), q->kind, q->rule);
        const int64_t si = hq_mx_scale_idx(0, i0 + r, j, K);
        if (q->sr) hq_mx_sr_bits(rk, q->offset, 0, (uint64_t)si, bits);
        cast32(c, x, 1, e, q, q->sr ? bits : NULL);
        q->rs[si] = e;
        hq_mx_pack32(q->rd + (i0 + r) * rb + j / BLK * bb, c, q->kind);
      }
    if (q->cd) {
      for (int k = 0; k < BLK; k++) {
        const float *x = tile + b + k;
        const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax32(x, ts)), q->kind, q->rule);
        const int64_t si = hq_mx_scale_idx(1, i0, j + k, K);
        if (q->sr) hq_mx_sr_bits(rk, q->offset, 1, (uint64_t)si, bits);
        cast32(c, x, ts, e, q, q->sr ? bits : NULL);
        q->cs[si] = e;
        for (int r = 0; r < BLK; r++) ccode[r][k] = c[r];
      }
      for (int r = 0; r < BLK; r++)
        hq_mx_pack32(q->cd + (i0 + r) * rb + j / BLK * bb, ccode[r], q->kind);
    }
  }
}

static void load_row(float *dst, const void *src, int64_t off, int64_t n, hq_dtype t) {
  if (t == HQ_F32) {
    memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
    return;
  }
  const uint16_t *p = (const uint16_t *)src + off;
  if (t == HQ_BF16)
    for (int64_t k = 0; k < n; k++) dst[k] = hq_bf16_to_f32(p[k]);
  else
    for (int64_t k = 0; k < n; k++) dst[k] = hq_f16_to_f32(p[k]);
}

static int quantize_cpu(const mx_job *q, const hq_call *call, const hq_tensor *src) {
  const hq_host_api *host = call->host;
  const int update = (call->flags & HQ_CALL_UPDATE) != 0;
  const int64_t ts = tile_width(q->K);
  const size_t tile_bytes = (size_t)(BLK * ts) * sizeof(float);
  float *tile = NULL, *own_tile = NULL;
  if (q->M * q->K == 0) return HQ_OK;
  if (call->scratch && call->scratch_bytes >= tile_bytes) {
    tile = call->scratch;
  } else if (update) {
    return host->error(HQ_EINVAL, MX_NAME ": update: the call's scratch holds %zu bytes, %zu "
                       "needed (scratch_size())", call->scratch ? call->scratch_bytes : 0,
                       tile_bytes);
  } else {
    tile = own_tile = host->alloc(call, tile_bytes);
    if (!tile) return HQ_ENOMEM; /* host->alloc recorded the message */
  }
  uint32_t rk[20];
  hq_nvfp4_sr_keys(q->seed, rk);
  for (int64_t i0 = 0; i0 < q->M; i0 += BLK)
    for (int64_t j0 = 0; j0 < q->K; j0 += TW) {
      const int w = (int)(q->K - j0 < TW ? q->K - j0 : TW);
      for (int r = 0; r < BLK; r++) load_row(tile + r * ts, src->data, (i0 + r) * q->K + j0, w,
                                             src->dtype);
      quant_tile(q, rk, tile, ts, i0, j0, w);
    }
  if (own_tile) host->free(call, own_tile);
  return HQ_OK;
}

/* The CPU dequantize of one storage's codes and scales into dst (dtype dt, [M, K]): x' =
   hq_mx_scaled(elem(q), e), stored in dt by hq_store_hp. The raw values of raw_copy are this,
   into BF16. */
static void dequantize_cpu(const uint8_t *data, const uint8_t *scale, hq_dtype kind, int colwise,
                           int64_t M, int64_t K, void *dst, hq_dtype dt) {
  float lut[64];
  for (uint32_t k = 0; k < 64; k++) lut[k] = hq_mx_elem_to_f32(k, kind);
  const int64_t rb = hq_mx_row_bytes(K, kind);
  for (int64_t i = 0; i < M; i++) {
    const uint8_t *row = data + i * rb;
    for (int64_t k = 0; k < K; k++) {
      const float y =
          hq_mx_scaled(lut[hq_mx_code(row, k, kind)], scale[hq_mx_scale_idx(colwise, i, k, K)]);
      hq_store_hp(dst, i * K + k, dt, y);
    }
  }
}

/* quantize and update (the core calls quantize with HQ_CALL_UPDATE for an update). */
static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const mx_cfg *cfg = cfgp;
  const hq_host_api *host = call->host;
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return no_device(call, "quantize");
#endif
  int rc = check_hp(host, src, "quantize source");
  if (rc) return rc;
  if (src->device != call->device)
    return host->error(HQ_EINVAL, MX_NAME ": quantize: source on device %d, call on device %d",
                       (int)src->device, (int)call->device);
  if (!(dirs & HQ_BOTH) || (dirs & ~HQ_BOTH))
    return host->error(HQ_EINVAL, MX_NAME ": quantize: dirs = 0x%x is not rowwise, columnwise or "
                       "both", dirs);
  const int64_t M = src->rows, K = src->cols;
  sview r = {0}, c = {0};
  if ((dirs & HQ_ROWWISE) && (rc = read_storage(host, row, HQ_ROWWISE, M, K, "quantize", &r)))
    return rc;
  if ((dirs & HQ_COLWISE) && (rc = read_storage(host, col, HQ_COLWISE, M, K, "quantize", &c)))
    return rc;
  if (dirs == HQ_BOTH && r.kind != c.kind)
    return host->error(HQ_EINVAL, MX_NAME ": quantize: the rowwise and columnwise storages differ "
                       "in element dtype; quantize them one direction at a time");
  int adam_ok;
  (void)hq_call_adam(call, src, &adam_ok);
  if (!adam_ok || (call->struct_size >= HQ_CALL_SIZE_2_2 && call->adam))
    return host->error(HQ_EINVAL, MX_NAME ": the fused optimizer step is not supported");
  const mx_job q = {(dirs & HQ_ROWWISE) ? r.kind : c.kind, cfg->rule, cfg->sr,
                    cfg->seed ? cfg->seed : call->seed, call->offset, M, K,
                    r.data, r.scale, c.data, c.scale, r.raw, c.raw};
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return mx_cuda_quantize(&q, call, src);
#endif
  rc = quantize_cpu(&q, call, src);
  /* raw_copy: the raw values of what was just written, by the dequantize's own loop */
  if (!rc && r.raw) dequantize_cpu(r.data, r.scale, r.kind, 0, M, K, r.raw, HQ_BF16);
  if (!rc && c.raw) dequantize_cpu(c.data, c.scale, c.kind, 1, M, K, c.raw, HQ_BF16);
  return rc;
}

/* Reads the storage alone (any instance's). The raw values (HQ_CALL_DEQ_RAW) are the dequantized
   values (no per-tensor factor, no transform): the same code. */
static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const hq_host_api *host = call->host;
  const char *op = (call->flags & HQ_CALL_DEQ_RAW) ? "raw dequantize" : "dequantize";
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return no_device(call, op);
#endif
  int rc = check_hp(host, dst, "dequantize destination");
  if (rc) return rc;
  if (dst->device != call->device)
    return host->error(HQ_EINVAL, MX_NAME ": %s: destination on device %d, call on device %d",
                       op, (int)dst->device, (int)call->device);
  if (!s) return host->error(HQ_EINVAL, MX_NAME ": %s: NULL storage", op);
  if (s->dir != HQ_ROWWISE && s->dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, MX_NAME ": %s: storage dir = 0x%x is not rowwise or "
                       "columnwise", op, s->dir);
  const int64_t M = dst->rows, K = dst->cols;
  sview v;
  if ((rc = read_storage(host, s, s->dir, M, K, op, &v))) return rc;
  const int colwise = s->dir == HQ_COLWISE;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return mx_cuda_dequantize(call, v.data, v.scale, v.kind, colwise, dst);
#endif
  dequantize_cpu(v.data, v.scale, v.kind, colwise, M, K, dst->data, dst->dtype);
  return HQ_OK;
}

/* Stochastic rounding makes an instance's bytes depend on the call's RNG offset. */
static uint64_t instance_caps(const void *cfgp) {
  const mx_cfg *c = cfgp;
  uint64_t caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY;
#ifdef HQ_HAVE_CUDA
  caps |= HQ_CAP_CUDA | HQ_CAP_RNG_DEV; /* a graph's SR draws from the device step */
#endif
  if (!c->sr) caps |= HQ_CAP_REQUANT_SAFE;
  return caps;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 1, /* required: ABI 2.1 (DEQ_RAW, emul_dtype) */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(mx_cfg),
    .name = MX_NAME,
    .version = PACKAGE_VERSION,
#if HQ_MX_FP == 4
    .description = "MXFP4 (OCP MX: E2M1 elements, two a byte, E8M0 scale per 32; torchao "
                   "numerics); columnwise copy untransposed",
#else
    .description = "MXFP6 (OCP MX: E2M3/E3M2 elements, four in three bytes, E8M0 scale per 32; "
                   "torchao numerics); columnwise copy untransposed",
#endif
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA | HQ_CAP_RNG_DEV
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .scratch_size = scratch_size,
    /* make_empty: NULL, no padding to zero; amax_kind / amax: NULL, no per-tensor amax */
    .quantize = quantize,
    .dequantize = dequantize,
    /* tensor_factor: NULL, no per-tensor factor (the raw values are the dequantized values) */
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
    .instance_caps = instance_caps,
};

HQ_FORMAT_DEFINE(ops);
