/*
** mxfp8.c -- MXFP8 (E4M3 / E5M2 elements, one E8M0 scale per 32 elements): the plugin ABI 2.1
** entry and the CPU reference (docs/formats.md, TE's numerics bit for bit).
**
** Quantize, per block of 32 elements (1x32 along K rowwise, 32x1 down a column columnwise, or one
** 32x32 tile shared by both directions with block_2d):
**   amax = max|x| over the block (NaN ignored, Inf included);
**   e    = hq_mxfp8_scale_code(amax): t = RN(amax * RN(1/max_norm)), E8M0 rounded UP;
**   q    = fp8_rne_satfinite(RN(x * 2^(127-e))).
** Both directions are quantized independently from the high-precision input; when both are
** asked for in one call (dirs == HQ_BOTH) the input is read once. The columnwise copy is NOT
** transposed: it is [M, K] like the rowwise one, only its blocks run down the columns. There is
** no per-tensor amax (amax_kind: none for both directions).
**
** Special values: a NaN element does not enter amax and is stored as NaN (0x7F); its block's
** scale comes from the other elements (all-NaN block: e = 0); it dequantizes to NaN. A +-Inf
** element makes its block's amax Inf, so e = 0xFE (2^127): the Inf element becomes +-max (0x7E
** E4M3, 0x7B E5M2), which dequantizes to +-Inf again (max * 2^127 overflows FP32), and the finite
** elements of that block are multiplied by 2^-127, so all below about 2^117 (E4M3; 2^110 E5M2)
** become +-0. An all-zero block has e = 0 and zero elements (signs kept).
**
** Buffers of each storage, in save order (M % 32 == 0 and K % 32 == 0 are required), with their
** role and FSDP gather rule (shards split M; every shard's M must be a multiple of 32):
**   rowwise:
**     0 data                  DATA  e4m3|e5m2 [M, K]                        ROWS, m_div 1
**     1 scale_inv             SCALE e8m0 [roundup(M,128), roundup(K/32,4)]  ROWS, m_div 1
**   columnwise:
**     0 columnwise_data       DATA  e4m3|e5m2 [M, K] (not transposed)       ROWS, m_div 1
**     1 columnwise_scale_inv  SCALE e8m0 [roundup(M/32,4), roundup(K,128)]  ROWS, m_div 32
**   With swizzle = true both scale buffers are HQ_GATHER_NEVER (a swizzled tile mixes rows of
**   different shards); the rest is unchanged. An FSDP gather of a core of ABI 2.4 or later moves
**   them through this module's own ops instead (buffer forms, below).
** Operand descriptor (storage->desc):
**   elem = the dtype option; order MK (both directions); scale_mode HQ_SCALE_VEC32_UE8M0;
**   scale_layout: rowwise OUTER_MAJOR, columnwise BLOCK_MAJOR (swizzle = true: SWIZZLED);
**   block rowwise 1x32, columnwise 32x1 (block_2d: 32x32 both); transform NONE; shard_rows 32;
**   emul_dtype HQ_BF16 (2.1).
** Element (i, j) of data is scaled by rowwise scale (i, j/32), at byte
** hq_mxfp8_row_scale_idx(i, j/32, K, swizzled); element (i, j) of columnwise_data by columnwise
** scale (i/32, j), at byte hq_mxfp8_col_scale_idx(i/32, j, M, K, swizzled) (mxfp8_rules.h).
** Compact scale buffers are row-major as their shapes say (docs/formats.md); swizzled ones hold
** the cuBLAS VEC32_UE8M0 layout (docs/formats.md; columnwise: the [M/32][K] scale matrix used as
** its transpose). Every padded scale byte is written as zero, in both layouts, so the bytes of a
** quantized storage are fully deterministic (and an FSDP gather equals a full quantize).
**
** The storage describes itself: quantize and dequantize take the element dtype, the scale layout
** (swizzled or not) and the block shape (1-D or 2-D) from storage->desc and the buffers, never
** from the instance configuration or meta (meta stays zero), so a storage made by one instance
** is read correctly by a differently configured one.
**
** Dequantize: x = RN(fp32(q) * 2^(e-127)) from either direction, into f32/bf16/f16.
**
** GEMM operands (ABI 2.1; docs/formats.md "GEMMs"):
**   raw values (dequantize with HQ_CALL_DEQ_RAW): MXFP8 has no per-tensor factor and no
**     transform, so they are the dequantized values, computed by the same code (tensor_factor
**     is NULL: the factor is 1);
**   desc.emul_dtype = HQ_BF16: an FP8 value times a power of two is exact in BF16 -- except at
**     the far-underflow edge: BF16's smallest subnormal is 2^-133, and a raw value whose lowest
**     bit lies below it (E4M3 subnormals times 2^-127 are 2^-136 .. 7 * 2^-136; in general only
**     blocks with scale 2^-125 or less for E4M3, 2^-118 or less for E5M2, and values below
**     2^-130) is rounded by the emulated BF16 GEMM; the CPU path's F32 holds them all;
**   native GEMM: none of its own. With swizzled scales (swizzle = true) its storages are what
**     cuBLASLt's VEC32_UE8M0 mode reads (the columnwise scale matrix is swizzled transposed for
**     that), so gemm/cublaslt's provider multiplies them natively on sm_100 / sm_103; the data
**     is never transposed, so the caller's flags are kept.
**
** CUDA path (mxfp8.cu, built when CUDA is configured: HQ_HAVE_CUDA; every option, sm_90 and
** sm_100): a call with call->device != HQ_DEVICE_HOST validates the storages here exactly as on
** the host and hands their device pointers to the kernels, which compute every byte with the same
** functions of mxfp8_rules.h / hq/numerics.h, so the bytes equal the CPU reference's.
**   quantize / update: one kernel per call, a 32-row x 128-column tile per CTA read once into
**     registers; the rowwise 1x32 blocks reduce across 4 lanes, the columnwise 32x1 blocks (and
**     the 32x32 tiles of block_2d) through 4 KiB of shared memory; plus a small kernel writing
**     the zero padding of the scale buffers (only when M or K is not a multiple of 128). No
**     scratch (scratch_size() is 0 on a device), no allocation, no synchronization;
**   the element cast is the hardware cvt.rn.satfinite (sm_89 and later: Hopper, Blackwell),
**     bit-identical to hq_mxfp8_quantize, which older chips (and -DHQ_FP8_SW_CVT) run;
**   dequantize: 16 FP8 bytes per thread into f32 / bf16 / f16;
**   make_empty: cudaMemsetAsync of the scale buffers on call->stream.
** Without CUDA in the build, a device call returns HQ_ENOTSUP.
**
** FSDP of swizzled scales (plugin ABI 2.4, buffer forms; the module still requires 2.1: an older
** core ignores these ops and refuses the gather as before): buffer_form() gives a swizzled scale
** buffer the FSDP form of its compact rows -- rowwise [M, roundup(K/32,4)], one row per row of
** M; columnwise [M/32, roundup(K,128)], one per 32-row block -- exactly the rows a compact
** storage sends (hq_mxfp8_scale_idx, mxfp8_rules.h). fsdp_extract un-swizzles a shard's buffer
** into them; fsdp_assign swizzles the gathered rows into the full tensor's buffer, padding rows
** zero, so the result equals the whole tensor quantized with swizzle, byte for byte, whatever the
** shards' M (any multiple of 32: a 128-row tile may span shards). On a device, one kernel each
** (mxfp8.cu), moving the bytes by the same index functions. Saved as they are (no save form).
*/
#include <stddef.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION: a stock module reports the package version */
#include "hq/numerics.h"
#include "hq/plugin.h"
#include "mxfp8.h"
#include "mxfp8_rules.h"

enum { OPT_DTYPE, OPT_SWIZZLE, OPT_2D, OPT_RAW };

static const hq_option options[] = {
    [OPT_DTYPE] = {"dtype", HQ_OPT_ENUM, "e4m3", "FP8 element type (max 448 / 57344)",
                   "e4m3|e5m2", 0, -1},
    [OPT_SWIZZLE] = {"swizzle", HQ_OPT_BOOL, "false",
                     "scale buffers in the cuBLAS swizzled (GEMM-ready) layout instead of compact "
                     "row-major", NULL, 0, -1},
    [OPT_2D] = {"block_2d", HQ_OPT_BOOL, "false",
                "one scale per 32x32 tile, the same code in both directions (for weights)", NULL,
                0, -1},
    [OPT_RAW] = {"raw_copy", HQ_OPT_ENUM, "none",
                 "keep each copy's raw values in BF16 beside its codes (2 more bytes an element): "
                 "an emulated GEMM (no native MXFP8 GEMM, e.g. Hopper) reads them instead of "
                 "dequantizing",
                 "none|bf16", 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  mxfp8_cfg *c = cfgp;
  (void)host;
  c->elem = v[OPT_DTYPE].i ? HQ_E5M2 : HQ_E4M3;
  c->swizzle = (int)v[OPT_SWIZZLE].i;
  c->block_2d = (int)v[OPT_2D].i;
  c->raw_copy = (int)v[OPT_RAW].i;
  return HQ_OK;
}

#define BLK HQ_MXFP8_BLOCK

static int check_shape(const hq_host_api *host, int64_t rows, int64_t cols) {
  if (rows < 0 || rows % BLK)
    return host->error(HQ_ESHAPE, "mxfp8: rows = %lld is not a multiple of %d", (long long)rows,
                       BLK);
  if (cols < 0 || cols % BLK)
    return host->error(HQ_ESHAPE, "mxfp8: cols = %lld is not a multiple of %d", (long long)cols,
                       BLK);
  return HQ_OK;
}

/* The compact (unswizzled) scale layout of a direction: rowwise [M][K/32] is [outer][block],
   columnwise [M/32][K] is [block][outer]. */
static uint32_t compact_layout(uint32_t dir) {
  return dir == HQ_ROWWISE ? HQ_SCALE_LAYOUT_OUTER_MAJOR : HQ_SCALE_LAYOUT_BLOCK_MAJOR;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const mxfp8_cfg *c = cfgp;
  (void)dirs; /* the two directions share no buffer */
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "mxfp8: layout: dir = 0x%x is not rowwise or columnwise", dir);
  int rc = check_shape(host, rows, cols);
  if (rc) return rc;
  const int row = dir == HQ_ROWWISE;
  hq_operand_desc *d = &out->desc;
  d->elem = c->elem;
  d->order = HQ_ORDER_MK; /* the columnwise copy is not transposed */
  d->scale_mode = HQ_SCALE_VEC32_UE8M0;
  d->scale_layout = c->swizzle ? HQ_SCALE_LAYOUT_SWIZZLED : compact_layout(dir);
  d->block_m = c->block_2d || !row ? BLK : 1;
  d->block_k = c->block_2d || row ? BLK : 1;
  d->transform = HQ_TRANSFORM_NONE;
  d->transform_param = 0;
  d->shard_rows = BLK;
  /* raw values = the dequantized ones, fp8 * 2^(e-127): exact in BF16 but at the far-underflow
     edge (see the header comment) */
  d->emul_dtype = HQ_BF16;
  hq_buffer *b = hq_buffer_describe(out, MXFP8_DATA, row ? "data" : "columnwise_data",
                                    HQ_ROLE_DATA, c->elem, 2, rows, cols);
  hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  if (row)
    b = hq_buffer_describe(out, MXFP8_SCALE_INV, "scale_inv", HQ_ROLE_SCALE, HQ_E8M0, 2,
                           hq_mxfp8_row_scale_rows(rows), hq_mxfp8_row_scale_cols(cols));
  else
    b = hq_buffer_describe(out, MXFP8_SCALE_INV, "columnwise_scale_inv", HQ_ROLE_SCALE, HQ_E8M0,
                           2, hq_mxfp8_col_scale_rows(rows), hq_mxfp8_col_scale_cols(cols));
  /* compact: one scale row per row of M (rowwise) or per 32 rows (columnwise), padding rows
     after them; swizzled: 128-row tiles interleave rows, so it cannot be concatenated */
  if (!c->swizzle) hq_buffer_gather(b, HQ_GATHER_ROWS, row ? 1 : BLK);
  if (c->raw_copy) {
    b = hq_buffer_describe(out, MXFP8_RAW, row ? "raw" : "columnwise_raw", HQ_ROLE_RAW, HQ_BF16,
                           2, rows, cols);
    hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  }
  return HQ_OK;
}

/* Bytes of the scale buffer of a storage of direction dir. */
static size_t scale_bytes(uint32_t dir, int64_t M, int64_t K) {
  if (dir == HQ_ROWWISE) return (size_t)(hq_mxfp8_row_scale_rows(M) * hq_mxfp8_row_scale_cols(K));
  return (size_t)(hq_mxfp8_col_scale_rows(M) * hq_mxfp8_col_scale_cols(K));
}

/* What the CPU loops need of one storage, read from its descriptor and buffers. */
typedef struct sview {
  uint8_t *data, *scale;
  uint16_t *raw;      /* the raw values' BF16 buffer (raw_copy), or NULL */
  size_t scale_bytes;
  hq_dtype elem;      /* HQ_E4M3 / HQ_E5M2 */
  int swizzled;       /* desc.scale_layout == HQ_SCALE_LAYOUT_SWIZZLED */
  int two_d;          /* desc block 32x32 */
} sview;

/* A storage is usable when its descriptor and buffers are an MXFP8 layout of this direction and
   shape and its buffers are allocated (guards every index computed below). Whichever instance
   made it, everything the loops need comes from here. */
static int read_storage(const hq_host_api *host, const hq_storage *s, uint32_t dir, int64_t M,
                        int64_t K, const char *what, sview *v) {
  const char *dn = dir == HQ_ROWWISE ? "rowwise" : "columnwise";
  if (!s) return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage is missing", what, dn);
  if (s->dir != dir || (s->nbuf != MXFP8_NBUF && s->nbuf != MXFP8_NBUF + 1))
    return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage was not laid out by mxfp8 (dir %u, "
                       "%u buffers)", what, dn, s->dir, s->nbuf);
  if (s->rows != M || s->cols != K)
    return host->error(HQ_ESHAPE, "mxfp8: %s: tensor [%lld, %lld] does not match the storage's "
                       "[%lld, %lld]", what, (long long)M, (long long)K, (long long)s->rows,
                       (long long)s->cols);
  int rc = check_shape(host, M, K);
  if (rc) return rc;
  const hq_operand_desc *d = &s->desc;
  const int row = dir == HQ_ROWWISE;
  const int two_d = d->block_m == BLK && d->block_k == BLK;
  const int one_d = row ? (d->block_m == 1 && d->block_k == BLK)
                        : (d->block_m == BLK && d->block_k == 1);
  if ((d->elem != HQ_E4M3 && d->elem != HQ_E5M2) || d->order != HQ_ORDER_MK ||
      d->scale_mode != HQ_SCALE_VEC32_UE8M0 || d->transform != HQ_TRANSFORM_NONE ||
      (d->scale_layout != HQ_SCALE_LAYOUT_SWIZZLED && d->scale_layout != compact_layout(dir)) ||
      !(two_d || one_d))
    return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage's descriptor is not an MXFP8 one "
                       "(elem %d, order %u, scale mode %u, scale layout %u, block %dx%d, "
                       "transform %u)", what, dn, (int)d->elem, d->order, d->scale_mode,
                       d->scale_layout, d->block_m, d->block_k, d->transform);
  const hq_buffer *db = hq_storage_cbuf(s, MXFP8_DATA), *eb = hq_storage_cbuf(s, MXFP8_SCALE_INV);
  if (db->role != HQ_ROLE_DATA || db->dtype != d->elem || db->bytes != (size_t)(M * K) ||
      eb->role != HQ_ROLE_SCALE || eb->dtype != HQ_E8M0 || eb->bytes != scale_bytes(dir, M, K))
    return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage's buffer roles, dtypes or sizes "
                       "differ from an MXFP8 layout of [%lld, %lld]", what, dn, (long long)M,
                       (long long)K);
  const hq_buffer *rb = s->nbuf > MXFP8_NBUF ? hq_storage_cbuf(s, MXFP8_RAW) : NULL;
  if (rb && (rb->role != HQ_ROLE_RAW || rb->dtype != HQ_BF16 || rb->bytes != (size_t)(M * K) * 2))
    return host->error(HQ_EINVAL, "mxfp8: %s: the %s storage's third buffer is not its raw "
                       "values (bf16 [%lld, %lld])", what, dn, (long long)M, (long long)K);
  if ((db->bytes != 0 && !db->ptr) || (eb->bytes != 0 && !eb->ptr) ||
      (rb && rb->bytes != 0 && !rb->ptr))
    return host->error(HQ_EINVAL, "mxfp8: %s: a buffer of the %s storage is not allocated", what,
                       dn);
  v->raw = rb ? rb->ptr : NULL;
  v->data = db->ptr;
  v->scale = eb->ptr;
  v->scale_bytes = eb->bytes;
  v->elem = d->elem;
  v->swizzled = d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED;
  v->two_d = two_d;
  return HQ_OK;
}

static int check_hp(const hq_host_api *host, const hq_tensor *t, const char *what) {
  if (!t || t->rows < 0 || t->cols < 0 || (t->rows * t->cols != 0 && !t->data))
    return host->error(HQ_EINVAL, "mxfp8: %s: NULL tensor", what);
  if (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16)
    return host->error(HQ_EINVAL, "mxfp8: %s: dtype %d is not f32, f16 or bf16", what,
                       (int)t->dtype);
  return HQ_OK;
}

#ifndef HQ_HAVE_CUDA
static int no_device(const hq_call *call, const char *what) {
  return call->host->error(HQ_ENOTSUP, "mxfp8: %s on CUDA device %d is not supported: this "
                           "build has no CUDA (CPU reference only)", what, (int)call->device);
}
#endif

// --- CPU reference ----------------------------------------------------------------------------

/* Columns per tile: a tile of 32 rows x TW columns (at most 64 KiB of FP32, in call->scratch) is
   loaded once and feeds both directions, so the columnwise blocks are read from cache; 32 long
   row runs of the source keep the hardware prefetchers streaming. A tensor narrower than TW
   uses a tile of its own width (row stride tile_width(K)). */
#define TW 512

static int64_t tile_width(int64_t K) { return K < TW ? K : TW; }

/* Scratch of a quantize or update: the FP32 tile. Nothing on a CUDA device (the kernels keep
   their tiles in registers and shared memory). */
static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)cfgp, (void)dirs;
  if (device != HQ_DEVICE_HOST || rows <= 0 || cols <= 0) return 0;
  return (size_t)(BLK * tile_width(cols)) * sizeof(float);
}

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
static void quant32(uint8_t *restrict dst, const float *restrict x, float mult, hq_dtype elem) {
  if (elem == HQ_E5M2)
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e5m2(hq_mul_rn(x[k], mult));
  else
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e4m3(hq_mul_rn(x[k], mult));
}

/* ... or each with its own (32 columns of one tile row). */
static void quant32_cols(uint8_t *restrict dst, const float *restrict x,
                         const float *restrict mult, hq_dtype elem) {
  if (elem == HQ_E5M2)
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e5m2(hq_mul_rn(x[k], mult[k]));
  else
    for (int k = 0; k < BLK; k++) dst[k] = hq_f32_to_e4m3(hq_mul_rn(x[k], mult[k]));
}

/* One quantize, as the storages describe it (both present ones agree on elem and two_d). */
typedef struct qjob {
  hq_dtype elem;      /* HQ_E4M3 / HQ_E5M2 */
  int two_d;          /* one code per 32x32 tile */
  int64_t M, K;
  uint8_t *rd, *rs;   /* rowwise data / scales, or NULL */
  uint8_t *cd, *cs;   /* columnwise data / scales, or NULL */
  size_t rs_bytes, cs_bytes;
  int rswz, cswz;     /* the storages' scale layouts: swizzled or compact */
} qjob;

/* One tile: rows i0 .. i0+31, columns j0 .. j0+w-1 (w a multiple of 32), already in FP32, row r
   at tile + r * ts. */
static void quant_tile(const qjob *q, const float *tile, int64_t ts, int64_t i0, int64_t j0,
                       int w) {
  const hq_dtype elem = q->elem;
  const int64_t K = q->K, M = q->M;
#define T(r, c) (tile + (int64_t)(r) * ts + (c))
  if (q->two_d) {
    for (int b = 0; b < w; b += BLK) {
      uint32_t m = 0;
      for (int r = 0; r < BLK; r++) {
        uint32_t a = amax32(T(r, b));
        m = a > m ? a : m;
      }
      uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(m), elem);
      float mult = hq_e8m0_quant_mult(e);
      for (int r = 0; r < BLK; r++) {
        int64_t off = (i0 + r) * K + j0 + b;
        uint8_t *dst = q->rd ? q->rd + off : q->cd + off;
        quant32(dst, T(r, b), mult, elem);
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
        uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(amax32(T(r, b))), elem);
        quant32(q->rd + (i0 + r) * K + j0 + b, T(r, b), hq_e8m0_quant_mult(e), elem);
        q->rs[hq_mxfp8_row_scale_idx(i0 + r, (j0 + b) / BLK, K, q->rswz)] = e;
      }
  }
  if (q->cd) {
    uint32_t m[TW];
    float mult[TW];
    memset(m, 0, sizeof m);
    for (int r = 0; r < BLK; r++)
      for (int b = 0; b < w; b += BLK) colmax32(&m[b], T(r, b));
    for (int k = 0; k < w; k++) {
      uint8_t e = hq_mxfp8_scale_code(hq_bits_f32(m[k]), elem);
      mult[k] = hq_e8m0_quant_mult(e);
      q->cs[hq_mxfp8_col_scale_idx(i0 / BLK, j0 + k, M, K, q->cswz)] = e;
    }
    for (int r = 0; r < BLK; r++)
      for (int b = 0; b < w; b += BLK)
        quant32_cols(q->cd + (i0 + r) * K + j0 + b, T(r, b), &mult[b], elem);
  }
#undef T
}

/* f16 sources of at least this many elements are decoded through a 256 KiB table (building it
   costs about as much as decoding this many elements directly). The table is an optional cache:
   never during an update (host->alloc refuses there), and without it the values are the same. */
#define F16_TABLE_MIN (1 << 16)

static int quantize_cpu(const qjob *q, const hq_call *call, const hq_tensor *src) {
  const hq_host_api *host = call->host;
  const int update = (call->flags & HQ_CALL_UPDATE) != 0;
  const int64_t ts = tile_width(q->K);
  const size_t tile_bytes = (size_t)(BLK * ts) * sizeof(float);
  float *tile = NULL, *own_tile = NULL, *f16 = NULL;
  if (q->M * q->K != 0) {
    if (call->scratch && call->scratch_bytes >= tile_bytes) {
      tile = call->scratch;
    } else if (update) {
      return host->error(HQ_EINVAL, "mxfp8: update: the call's scratch holds %zu bytes, %zu "
                         "needed (scratch_size())", call->scratch ? call->scratch_bytes : 0,
                         tile_bytes);
    } else {
      tile = own_tile = host->alloc(call, tile_bytes);
      if (!tile) return HQ_ENOMEM; /* host->alloc recorded the message */
    }
    if (src->dtype == HQ_F16 && q->M * q->K >= F16_TABLE_MIN && !update) {
      f16 = host->alloc(call, 65536 * sizeof(float)); /* NULL: decode directly */
      if (f16)
        for (uint32_t h = 0; h < 65536; h++) f16[h] = hq_f16_to_f32((uint16_t)h);
    }
  }
  /* padding is zero; every in-bounds entry is overwritten below */
  if (q->rs) memset(q->rs, 0, q->rs_bytes);
  if (q->cs) memset(q->cs, 0, q->cs_bytes);
  for (int64_t i0 = 0; i0 < q->M; i0 += BLK)
    for (int64_t j0 = 0; j0 < q->K; j0 += TW) {
      int w = (int)(q->K - j0 < TW ? q->K - j0 : TW);
      for (int r = 0; r < BLK; r++)
        load_row(tile + r * ts, src->data, (i0 + r) * q->K + j0, w, src->dtype, f16);
      quant_tile(q, tile, ts, i0, j0, w);
    }
  if (f16) host->free(call, f16);
  if (own_tile) host->free(call, own_tile);
  return HQ_OK;
}

/* The CPU dequantize of one storage's codes qd and scales qs into dst (dtype dt, [M, K]): each
   element hq_mul_rn(code's value, its block's scale), stored in dt by hq_store_hp (f32: as is).
   The raw values of raw_copy are this, into BF16. */
static void dequantize_cpu(const uint8_t *qd, const uint8_t *qs, hq_dtype elem, int swz,
                           int colwise, int64_t M, int64_t K, void *dst, hq_dtype dt) {
  float lut[256], sinv[TW];
  for (int k = 0; k < 256; k++) lut[k] = hq_fp8_to_f32((uint8_t)k, elem);
  float *out = dt == HQ_F32 ? dst : NULL;
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
          hq_store_hp(dst, i * K + j0 + k, dt, hq_mul_rn(lut[qrow[k]], sinv[k]));
      }
    }
  }
}

/* quantize and update (the core calls quantize with HQ_CALL_UPDATE for an update): the layout
   written -- element dtype, scale layout, 1-D or 2-D blocks -- is the one each storage's
   descriptor states. */
static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  (void)cfgp;
  const hq_host_api *host = call->host;
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return no_device(call, "quantize");
#endif
  int rc = check_hp(host, src, "quantize source");
  if (rc) return rc;
  if (src->device != call->device)
    return host->error(HQ_EINVAL, "mxfp8: quantize: source on device %d, call on device %d",
                       (int)src->device, (int)call->device);
  if (!(dirs & HQ_BOTH) || (dirs & ~HQ_BOTH))
    return host->error(HQ_EINVAL, "mxfp8: quantize: dirs = 0x%x is not rowwise, columnwise or "
                       "both", dirs);
  const int64_t M = src->rows, K = src->cols;
  sview r = {0}, c = {0};
  if ((dirs & HQ_ROWWISE) && (rc = read_storage(host, row, HQ_ROWWISE, M, K, "quantize", &r)))
    return rc;
  if ((dirs & HQ_COLWISE) && (rc = read_storage(host, col, HQ_COLWISE, M, K, "quantize", &c)))
    return rc;
  if (dirs == HQ_BOTH && (r.elem != c.elem || r.two_d != c.two_d))
    return host->error(HQ_EINVAL, "mxfp8: quantize: the rowwise and columnwise storages differ "
                       "in element dtype or block shape; quantize them one direction at a time");
  const sview *v = (dirs & HQ_ROWWISE) ? &r : &c;
  /* the fused optimizer write-back (ABI 2.2, HQ_CAP_FUSED_ADAM): the kernel reads every element
     once, so it applies the step to the FP32 master as it reads it */
  int adam_ok;
  const hq_adam_pass *adam = hq_call_adam(call, src, &adam_ok);
  if (!adam_ok)
    return host->error(HQ_EINVAL, "mxfp8: the fused optimizer step comes with an update of an f32 "
                       "master on a CUDA device (gradient f32, f16 or bf16)");
  (void)adam; /* read by the CUDA path only */
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) {
    mxfp8_cuda_job j = {v->elem, v->two_d, M, K, r.data, r.scale, c.data, c.scale,
                        r.swizzled, c.swizzled, r.raw, c.raw, adam};
    return mxfp8_cuda_quantize(&j, call, src);
  }
#endif
  qjob q = {v->elem, v->two_d, M, K, r.data, r.scale, c.data, c.scale,
            r.scale_bytes, c.scale_bytes, r.swizzled, c.swizzled};
  rc = quantize_cpu(&q, call, src);
  /* raw_copy: the raw values of what was just written, by the dequantize's own loop */
  if (!rc && r.raw) dequantize_cpu(r.data, r.scale, r.elem, r.swizzled, 0, M, K, r.raw, HQ_BF16);
  if (!rc && c.raw) dequantize_cpu(c.data, c.scale, c.elem, c.swizzled, 1, M, K, c.raw, HQ_BF16);
  return rc;
}

/* Reads the storage alone (any instance's): element dtype and scale layout from its descriptor;
   the block shape does not matter here (every element has its scale entry). The raw values
   (call->flags & HQ_CALL_DEQ_RAW) are the dequantized values: MXFP8 has no per-tensor factor and
   no transform, so both requests run the same code. */
static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const hq_host_api *host = call->host;
  /* HQ_CALL_DEQ_RAW asks for the raw values, elements times block scales: for MXFP8 (no
     per-tensor factor, no transform) they are the dequantized values, computed by the same code;
     the flag only names the operation in messages */
  const char *op = (call->flags & HQ_CALL_DEQ_RAW) ? "raw dequantize" : "dequantize";
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return no_device(call, op);
#endif
  int rc = check_hp(host, dst, "dequantize destination");
  if (rc) return rc;
  if (dst->device != call->device)
    return host->error(HQ_EINVAL, "mxfp8: dequantize: destination on device %d, call on device "
                       "%d", (int)dst->device, (int)call->device);
  if (!s) return host->error(HQ_EINVAL, "mxfp8: dequantize: NULL storage");
  if (s->dir != HQ_ROWWISE && s->dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "mxfp8: dequantize: storage dir = 0x%x is not rowwise or "
                       "columnwise", s->dir);
  const int64_t M = dst->rows, K = dst->cols;
  sview v;
  if ((rc = read_storage(host, s, s->dir, M, K, op, &v))) return rc;
  const uint8_t *qd = v.data, *qs = v.scale;
  const hq_dtype elem = v.elem;
  const int swz = v.swizzled, colwise = s->dir == HQ_COLWISE;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return mxfp8_cuda_dequantize(call, qd, qs, elem, swz, colwise, dst);
#endif
  dequantize_cpu(qd, qs, elem, swz, colwise, M, K, dst->data, dst->dtype);
  return HQ_OK;
}

/* Fresh storages (hq_make_empty): zero the scale buffer, so its padding is zero from the start,
   as after a quantize. The data is left for the caller to fill. */
static int make_empty(const void *cfgp, const hq_call *call, hq_storage *s) {
  (void)cfgp;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    for (uint32_t i = 0; i < s->nbuf; i++) {
      hq_buffer *b = hq_storage_buf(s, i);
      int rc;
      if (b->role == HQ_ROLE_SCALE && b->ptr && (rc = mxfp8_cuda_zero(call, b->ptr, b->bytes)))
        return rc;
    }
    return HQ_OK;
#else
    return no_device(call, "make_empty");
#endif
  }
  for (uint32_t i = 0; i < s->nbuf; i++) {
    hq_buffer *b = hq_storage_buf(s, i);
    if (b->role == HQ_ROLE_SCALE && b->ptr) memset(b->ptr, 0, b->bytes);
  }
  return HQ_OK;
}

// --- FSDP of swizzled scales (ABI 2.4) --------------------------------------------------------

/* A swizzled scale buffer travels as its compact rows (see the header comment); every other
   buffer by its gather rule. Read from the storage alone. */
static int buffer_form(const void *cfgp, const hq_host_api *host, const hq_storage *s,
                       uint32_t buffer, uint32_t purpose, hq_buffer_form *form) {
  (void)cfgp, (void)host;
  if (purpose != HQ_FORM_FSDP || buffer != MXFP8_SCALE_INV || s->nbuf < MXFP8_NBUF ||
      s->desc.scale_layout != HQ_SCALE_LAYOUT_SWIZZLED)
    return HQ_OK;
  const int col = s->dir == HQ_COLWISE;
  const int32_t m_div = (int32_t)hq_mxfp8_scale_m_div(col);
  hq_buffer_form_describe(form, HQ_E8M0, 2, s->rows / m_div, hq_mxfp8_scale_cols(col, s->cols),
                          m_div);
  return HQ_OK;
}

/* Move between the swizzled scale buffer of s and its form (to_form: un-swizzle into the form;
   else swizzle the form into every byte of the buffer). */
static int form_move(const hq_call *call, const hq_storage *s, uint32_t buffer,
                     const hq_buffer_form *form, int to_form, const char *what) {
  const hq_host_api *host = call->host;
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return no_device(call, what);
#endif
  if (!s) return host->error(HQ_EINVAL, "mxfp8: %s: NULL storage", what);
  const int64_t M = s->rows, K = s->cols;
  const int col = s->dir == HQ_COLWISE;
  sview v;
  int rc = read_storage(host, s, s->dir, M, K, what, &v);
  if (rc) return rc;
  const int64_t rows = hq_mxfp8_form_rows(col, M), C = hq_mxfp8_scale_cols(col, K);
  if (buffer != MXFP8_SCALE_INV || !v.swizzled || !form || form->dtype != HQ_E8M0 ||
      form->ndim != 2 || form->shape[0] != rows || form->shape[1] != C ||
      (rows * C != 0 && !form->ptr))
    return host->error(HQ_EINVAL, "mxfp8: %s: buffer %u of the %s storage has no FSDP form [%lld, "
                       "%lld] here (only a swizzled scale buffer has one)", what, buffer,
                       col ? "columnwise" : "rowwise", (long long)rows, (long long)C);
  /* the form's rows, or every row of the buffer (its padding rows too) */
  const int64_t R = to_form ? rows : hq_mxfp8_scale_rows(col, M);
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return mxfp8_cuda_scale_form(call, v.scale, form->ptr, col, M, K, rows, R, C, to_form);
#endif
  for (int64_t a = 0; a < R; a++)
    for (int64_t b = 0; b < C; b++)
      hq_mxfp8_form_move(v.scale, form->ptr, col, M, K, rows, C, a, b, to_form);
  return HQ_OK;
}

static int fsdp_extract(const void *cfgp, const hq_call *call, const hq_storage *s,
                        uint32_t buffer, const hq_buffer_form *form) {
  (void)cfgp;
  return form_move(call, s, buffer, form, 1, "fsdp_extract");
}

static int fsdp_assign(const void *cfgp, const hq_call *call, hq_storage *s, uint32_t buffer,
                       const hq_buffer_form *form) {
  (void)cfgp;
  return form_move(call, s, buffer, form, 0, "fsdp_assign");
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 1, /* required: ABI 2.1 (DEQ_RAW, emul_dtype, host->lt_matmul) */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(mxfp8_cfg),
    .name = "mxfp8",
    .version = PACKAGE_VERSION,
    .description = "MXFP8 (E4M3/E5M2, E8M0 scale per 32 elements, TE numerics); columnwise "
                   "copy untransposed",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA | HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .scratch_size = scratch_size,
    .make_empty = make_empty,
    /* amax_kind / amax: NULL, no per-tensor amax; update: NULL, quantize handles the flag */
    .quantize = quantize,
    .dequantize = dequantize,
    /* tensor_factor: NULL, no per-tensor factor (the raw values are the dequantized values) */
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
    /* ABI 2.4, read by cores that know it (the module requires 2.1) */
    .buffer_form = buffer_form,
    .fsdp_extract = fsdp_extract,
    .fsdp_assign = fsdp_assign,
};

HQ_FORMAT_DEFINE(ops);
