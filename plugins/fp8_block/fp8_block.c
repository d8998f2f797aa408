/*
** fp8_block.c -- FP8 block scaling, DeepSeek-V3 style (TE Float8BlockwiseQTensor): the plugin
** (requires ABI 2.1), the CPU reference (docs/formats.md), the native cuBLASLt GEMM on Hopper,
** and the dispatch to the CUDA path
** (fp8_block.cu, built when CUDA is configured: HQ_CAP_CUDA, every option) on
** call->device != HQ_DEVICE_HOST. The CUDA path computes every bit with the same functions
** (fp8_block_rules.h, fp8_scale.h, hq/numerics.h), so its bytes and scales equal this
** reference's: one kernel per quantize/update, one thread block per 128x128 tile read once from
** global memory into registers, both directions from it (the columnwise bytes transposed through
** shared memory), scale_inv and the scale padding written in place; dequantize in 32x32 tiles.
** Without CUDA in the build a device call fails with HQ_ENOTSUP.
**
** Blocks over the logical [M, K]:
**   block = 1d  rowwise 1x128 (along K), columnwise 128x1 (down M); the two copies are quantized
**               independently from high precision and differ numerically;
**   block = 2d  128x128 tiles; the columnwise copy is the exact transpose of the rowwise copy
**               (same tiles, same scales).
** Any shape is accepted: blocks at the bottom/right edges cover only their in-bounds elements.
** Per block: amax = max|x| in FP32 ignoring NaN; scale = TE compute_scale_from_amax with
** value_for_inf = the input dtype's max (hq_fp8b_scale, fp8_block_rules.h); scale_inv =
** RN(1/scale); q = fp8_satfinite(RN(x * scale)); dequantize x = RN(q * scale_inv).
** There is no per-tensor amax (amax_kind NONE for both directions: the op is left NULL), so
** hq_call.amax is ignored. The input is read once per call: every 128x128 tile is loaded once
** and feeds both directions.
**
** Buffers of each storage, in save order (Mb = ceil(M/128), Kb = ceil(K/128), r4 = round up to
** a multiple of 4; index functions in fp8_block_rules.h; padding entries -- dim 1 beyond the
** logical extent -- are written as zero by every quantize):
**      name                  role   dtype      shape        entry          FSDP gather
**   1-D rowwise
**   0  data                  DATA   e4m3|e5m2  [M, K]                      ROWS, m_div 1
**   1  scale_inv             SCALE  f32        [Kb, r4(M)]  [k/128][m]     COLS, m_div 1
**   1-D columnwise (data physically transposed)
**   0  columnwise_data       DATA   e4m3|e5m2  [K, M]                      COLS, m_div 1
**   1  columnwise_scale_inv  SCALE  f32        [Mb, r4(K)]  [m/128][k]     ROWS, m_div 128
**   2-D rowwise
**   0  data                  DATA   e4m3|e5m2  [M, K]                      ROWS, m_div 1
**   1  scale_inv             SCALE  f32        [Mb, r4(Kb)] [m/128][k/128] ROWS, m_div 128
**   2-D columnwise (data physically transposed)
**   0  columnwise_data       DATA   e4m3|e5m2  [K, M]                      COLS, m_div 1
**   1  columnwise_scale_inv  SCALE  f32        [Kb, r4(Mb)] [k/128][m/128] COLS, m_div 128
** No buffer is shared between the directions.
** The operand descriptor (hq_storage.desc) of each storage:
**   elem = dtype; order HQ_ORDER_MK (rowwise) / HQ_ORDER_KM (columnwise); transform NONE (0);
**   1-D: scale_mode HQ_SCALE_VEC128_F32, scale_layout BLOCK_MAJOR ([block][outer]: cuBLASLt's
**        M-major 1x128 layout), block 1x128 (rowwise) / 128x1 (columnwise), shard_rows 1
**        (rowwise) / 128 (columnwise: a shard must hold whole 128-row blocks);
**   2-D: scale_mode HQ_SCALE_BLK128X128_F32, scale_layout OUTER_MAJOR ([outer/128][block]),
**        block 128x128, shard_rows 128.
**   emul_dtype: BF16 when the instance uses power-of-two scales (power_2_scales, the default),
**        else F32 (see GEMMs below).
** hq_storage.meta is not used (zero). dequantize() reads every layout fact -- element dtype,
** order, 1-D or 2-D blocks -- from s->desc and checks the buffers against it, so it accepts a
** storage made by any fp8_block instance, whatever this instance's options.
**
** GEMMs (ABI 2.1):
**   raw values   fp8_block has no per-tensor factor (tensor_factor NULL: 1) and no transform, so
**                its raw values (HQ_CALL_DEQ_RAW) are its dequantized values, RN_f32(q *
**                scale_inv): dequantize() writes the same for both (host and CUDA).
**   emul_dtype   with power-of-two scales q * 2^e is exact in BF16 -- except at the far-underflow
**                edge: a block whose scale_inv is below 2^-124 (E4M3; 2^-117 for E5M2), i.e.
**                whose amax is at most 448 * 2^-125 (about 2^-116; E5M2: 57344 * 2^-118, about
**                2^-102), may have raw values finer than BF16's smallest subnormal 2^-133 (the
**                E4M3 subnormal 2^-9 times 2^-127 is 2^-136), which the BF16 emulated GEMM
**                rounds to that grid. With FP32 scales (power_2_scales = false) a raw value has
**                up to 24 significant bits: F32.
**   own gemm     small problems on Hopper (gemm_op below, fp8_block_gemm.cu); the rest:
**   native gemm  its scale buffers are laid out as cuBLASLt reads them
**                (docs/formats.md: 1-D [ceil(k/128), r4(outer)] outer contiguous = BLOCK_MAJOR;
**                2-D [ceil(outer/128), r4(ceil(k/128))] = OUTER_MAJOR) and its data keeps k
**                contiguous, so gemm/cublaslt's provider multiplies its storages natively on
**                Hopper.
**
** Scratch: scratch_size() declares the tile buffer of the CPU quantize (one 128x128 FP32 tile of
** the input, its FP8 bytes and 128 column scales; smaller for tensors under 128 rows or columns);
** quantize, also as the update (HQ_CALL_UPDATE; update op NULL), takes it from call->scratch and
** never calls host->alloc. On a CUDA device it is 0 (the kernel's tile lives in registers and
** shared memory); the device quantize/update allocates nothing and never synchronizes.
**
** Options: block (1d|2d), dtype (e4m3|e5m2), power_2_scales (true), amax_epsilon (0).
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION: a stock module reports the package version */
#include "hq/numerics.h"
#include "hq/plugin.h"
#include "small_gemm.h"
#include "fp8_block_gemm.h"
#include "fp8_block_rules.h"

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
  hq_dtype elem;  /* HQ_E4M3 / HQ_E5M2 */
  int two_d;      /* block = 2d */
  int pow2;       /* power_2_scales */
  float epsilon;  /* amax_epsilon */
} fp8b_cfg;

/* Buffer indices, both storages (save order). */
enum { FP8B_DATA = 0, FP8B_SCALE_INV = 1, FP8B_NBUF = 2 };

#define B HQ_FP8B_BLOCK

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  fp8b_cfg *c = cfgp;
  (void)host;
  c->two_d = (int)v[OPT_BLOCK].i;
  c->elem = v[OPT_DTYPE].i ? HQ_E5M2 : HQ_E4M3;
  c->pow2 = (int)v[OPT_POW2].i;
  c->epsilon = (float)v[OPT_EPS].f;
  return HQ_OK;
}

/* The operand descriptor of direction `colwise` (0/1) with 1-D or 2-D blocks. */
static void fill_desc(hq_operand_desc *d, hq_dtype elem, int colwise, int two_d) {
  d->elem = elem;
  d->order = colwise ? HQ_ORDER_KM : HQ_ORDER_MK;
  d->scale_mode = two_d ? HQ_SCALE_BLK128X128_F32 : HQ_SCALE_VEC128_F32;
  d->scale_layout = two_d ? HQ_SCALE_LAYOUT_OUTER_MAJOR : HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  d->block_m = two_d || colwise ? B : 1;
  d->block_k = two_d || !colwise ? B : 1;
  d->transform = HQ_TRANSFORM_NONE;
  d->transform_param = 0;
  /* 1-D rowwise blocks never span rows: any shard works; otherwise whole 128-row blocks */
  d->shard_rows = two_d || colwise ? B : 1;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const fp8b_cfg *c = cfgp;
  (void)dirs; /* nothing is shared between the directions */
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "fp8_block: layout of direction %u", dir);
  const int colwise = dir == HQ_COLWISE;
  int64_t d0, d1, n1;
  hq_fp8b_scale_shape(rows, cols, colwise, c->two_d, &d0, &d1, &n1);
  fill_desc(&out->desc, c->elem, colwise, c->two_d);
  /* q * 2^e is exact in BF16 (but for the far-underflow edge, see the header); FP32 scales make
     raw values of up to 24 significant bits */
  out->desc.emul_dtype = c->pow2 ? HQ_BF16 : HQ_F32;
  /* which dim of the scale runs along M: dim 0 (M blocks) for 1-D columnwise and 2-D rowwise,
     dim 1 (rows of M, or M blocks) for 1-D rowwise and 2-D columnwise */
  const int scale_m_in_dim0 = c->two_d != colwise;
  const int32_t scale_m_div = c->two_d || colwise ? B : 1;
  hq_buffer *data, *scale;
  if (!colwise) {
    data = hq_buffer_describe(out, FP8B_DATA, "data", HQ_ROLE_DATA, c->elem, 2, rows, cols);
    hq_buffer_gather(data, HQ_GATHER_ROWS, 1);
    scale = hq_buffer_describe(out, FP8B_SCALE_INV, "scale_inv", HQ_ROLE_SCALE, HQ_F32, 2, d0,
                               d1);
  } else {
    data = hq_buffer_describe(out, FP8B_DATA, "columnwise_data", HQ_ROLE_DATA, c->elem, 2, cols,
                              rows);
    hq_buffer_gather(data, HQ_GATHER_COLS, 1);
    scale = hq_buffer_describe(out, FP8B_SCALE_INV, "columnwise_scale_inv", HQ_ROLE_SCALE,
                               HQ_F32, 2, d0, d1);
  }
  hq_buffer_gather(scale, scale_m_in_dim0 ? HQ_GATHER_ROWS : HQ_GATHER_COLS, scale_m_div);
  return HQ_OK;
}

// --- the storage's own description --------------------------------------------------------------

/* What a storage says about itself (dequantize must not ask the configuration). */
typedef struct geom {
  hq_dtype elem;    /* HQ_E4M3 / HQ_E5M2 */
  int colwise;      /* data [K, M] (order KM), columnwise blocks */
  int two_d;        /* 128x128 tiles */
  void *data;       /* the DATA buffer */
  float *scale;     /* the SCALE buffer (f32) */
} geom;

static const char *dname(uint32_t dir) {
  return dir == HQ_ROWWISE ? "rowwise" : dir == HQ_COLWISE ? "columnwise" : "undirected";
}

/* Read s->desc and check the storage's buffers against it and the [M, K] of the call. */
static int read_storage(const hq_host_api *host, const hq_storage *s, int64_t M, int64_t K,
                        geom *g) {
  const hq_operand_desc *d = &s->desc;
  const char *dn = dname(s->dir);
  if (s->rows != M || s->cols != K)
    return host->error(HQ_ESHAPE, "fp8_block: the %s storage is [%lld, %lld], the tensor [%lld, "
                       "%lld]", dn, (long long)s->rows, (long long)s->cols, (long long)M,
                       (long long)K);
  if (d->elem != HQ_E4M3 && d->elem != HQ_E5M2)
    return host->error(HQ_EINVAL, "fp8_block: the %s storage's element dtype %d is not e4m3 or "
                       "e5m2", dn, (int)d->elem);
  if (d->order != HQ_ORDER_MK && d->order != HQ_ORDER_KM)
    return host->error(HQ_EINVAL, "fp8_block: the %s storage's data order %u is unknown", dn,
                       d->order);
  if (d->scale_mode != HQ_SCALE_VEC128_F32 && d->scale_mode != HQ_SCALE_BLK128X128_F32)
    return host->error(HQ_ENOTSUP, "fp8_block: the %s storage's scale mode %u is neither "
                       "VEC128_F32 (1-D blocks) nor BLK128X128_F32 (2-D)", dn, d->scale_mode);
  g->elem = d->elem;
  g->colwise = d->order == HQ_ORDER_KM;
  g->two_d = d->scale_mode == HQ_SCALE_BLK128X128_F32;
  hq_operand_desc want;
  memset(&want, 0, sizeof want);
  fill_desc(&want, g->elem, g->colwise, g->two_d);
  if (d->scale_layout != want.scale_layout || d->block_m != want.block_m ||
      d->block_k != want.block_k || d->transform != HQ_TRANSFORM_NONE)
    return host->error(HQ_ENOTSUP, "fp8_block: the %s storage's descriptor (order %s, scale "
                       "mode %u, scale layout %u, block %dx%d, transform %u) is not an fp8_block "
                       "layout", dn, g->colwise ? "KM" : "MK", d->scale_mode, d->scale_layout,
                       (int)d->block_m, (int)d->block_k, d->transform);
  const hq_buffer *data = NULL, *scale = NULL;
  for (uint32_t i = 0; i < s->nbuf && i < HQ_MAX_BUFFERS; i++) {
    const hq_buffer *b = hq_storage_cbuf(s, i);
    if (b->role == HQ_ROLE_DATA && !data) data = b;
    else if (b->role == HQ_ROLE_SCALE && !scale) scale = b;
  }
  if (!data || !scale || !data->ptr || !scale->ptr)
    return host->error(HQ_EINVAL, "fp8_block: the %s storage lacks an allocated %s buffer", dn,
                       !data || !data->ptr ? "data" : "scale");
  int64_t d0, d1, n1;
  hq_fp8b_scale_shape(M, K, g->colwise, g->two_d, &d0, &d1, &n1);
  const int64_t e0 = g->colwise ? K : M, e1 = g->colwise ? M : K;
  if (data->dtype != g->elem || data->ndim != 2 || data->shape[0] != e0 || data->shape[1] != e1)
    return host->error(HQ_EINVAL, "fp8_block: %s data buffer '%s' is not %s [%lld, %lld]", dn,
                       data->name ? data->name : "?", g->elem == HQ_E5M2 ? "e5m2" : "e4m3",
                       (long long)e0, (long long)e1);
  if (scale->dtype != HQ_F32 || scale->ndim != 2 || scale->shape[0] != d0 ||
      scale->shape[1] != d1)
    return host->error(HQ_EINVAL, "fp8_block: %s scale buffer '%s' is not f32 [%lld, %lld] (%s "
                       "blocks)", dn, scale->name ? scale->name : "?", (long long)d0,
                       (long long)d1, g->two_d ? "2-D" : "1-D");
  g->data = data->ptr;
  g->scale = scale->ptr;
  return HQ_OK;
}

// --- CPU reference ----------------------------------------------------------------------------

/* The working set of one 128x128 tile, in call->scratch: the input in FP32 (row stride B), its
   bytes, per-column scales. Rows beyond min(M, B) (x) and beyond max(min(M, B), min(K, B)) (q)
   are never touched, so a small tensor needs a small scratch. */
typedef struct tile {
  float *cscale;  /* [B] */
  float *x;       /* [rows_x][B] */
  uint8_t *q;     /* [rows_q][B]: row-major [i][j] (rowwise / 2-D) or transposed [j][i] (1-D
                     colwise) */
} tile;

static int64_t min_b(int64_t n) { return n < B ? n : B; }

/* Bytes of the tile working set for a [M, K] tensor (0 when empty). */
static size_t tile_bytes(int64_t M, int64_t K) {
  if (M <= 0 || K <= 0) return 0;
  const int64_t rx = min_b(M), rq = rx > min_b(K) ? rx : min_b(K);
  return (size_t)(B + rx * B) * sizeof(float) + (size_t)(rq * B);
}

static void tile_carve(void *p, int64_t M, tile *t) {
  t->cscale = p;
  t->x = t->cscale + B;
  t->q = (uint8_t *)(t->x + min_b(M) * B);
}

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
   the element dtype once per call, so each loop inlines one conversion with no per-element
   branch. */
static inline void cast_e4m3(const float *x, const float *scale, int ss, int n, uint8_t *q,
                             int qs) {
  for (int j = 0; j < n; j++) q[j * qs] = hq_f32_to_e4m3(hq_mul_rn(x[j], scale[j * ss]));
}
static inline void cast_e5m2(const float *x, const float *scale, int ss, int n, uint8_t *q,
                             int qs) {
  for (int j = 0; j < n; j++) q[j * qs] = hq_f32_to_e5m2(hq_mul_rn(x[j], scale[j * ss]));
}
static void cast(hq_dtype elem, const float *x, const float *scale, int ss, int n, uint8_t *q,
                 int qs) {
  if (elem == HQ_E5M2) cast_e5m2(x, scale, ss, n, q, qs);
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
      float scale = hq_fp8b_scale(amax_of(xi, nc), c->elem, c->pow2, c->epsilon, src_dtype);
      rs[hq_fp8b_row1d_index(m0 + i, k0, M)] = hq_rcp_rn(scale);
      cast(c->elem, xi, &scale, 0, nc, rd + (m0 + i) * K + k0, 1);
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
      float scale = hq_fp8b_scale(hq_bits_f32(am[j]), c->elem, c->pow2, c->epsilon, src_dtype);
      t->cscale[j] = scale;
      cs[hq_fp8b_col1d_index(m0, k0 + j, K)] = hq_rcp_rn(scale);
    }
    /* cast row by row (contiguous reads) into the transposed tile, then copy its rows out */
    for (int i = 0; i < nr; i++) cast(c->elem, t->x + i * B, t->cscale, 1, nc, t->q + i, B);
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
  float scale = hq_fp8b_scale(hq_bits_f32(m), c->elem, c->pow2, c->epsilon, src_dtype);
  float scale_inv = hq_rcp_rn(scale);
  for (int i = 0; i < nr; i++) cast(c->elem, t->x + i * B, &scale, 0, nc, t->q + i * B, 1);
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

#ifdef HQ_HAVE_CUDA
/* The CUDA path (fp8_block.cu). */
int fp8b_cuda_quantize(const hq_call *call, const hq_tensor *src, int elem, int two_d, int pow2,
                       float epsilon, uint8_t *rd, float *rs, uint8_t *cd, float *cs,
                       const hq_adam_pass *adam);
int fp8b_cuda_dequantize(const hq_call *call, int elem, int colwise, int two_d, const uint8_t *q,
                         const float *scale_inv, hq_tensor *dst);
#endif

/* A device call in a build without CUDA is refused. */
static int device_ok(const hq_call *call, const char *op) {
#ifdef HQ_HAVE_CUDA
  (void)call;
  (void)op;
  return HQ_OK;
#else
  if (call->device == HQ_DEVICE_HOST) return HQ_OK;
  return call->host->error(HQ_ENOTSUP, "fp8_block was built without CUDA (no CUDA path): %s "
                           "on device %d is not supported", op, (int)call->device);
#endif
}

static int check_hp(const hq_call *call, const hq_tensor *t, const char *what) {
  if (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16)
    return call->host->error(HQ_EINVAL, "fp8_block: %s dtype %d is not f32, f16 or bf16", what,
                             (int)t->dtype);
  if (t->device != call->device)
    return call->host->error(HQ_EINVAL, "fp8_block: %s on device %d, the call on device %d",
                             what, (int)t->device, (int)call->device);
  return HQ_OK;
}

/* The tile working set of the CPU quantize; the CUDA kernel keeps its tile in registers and
   shared memory and needs none. */
static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)cfgp;
  (void)dirs;
  if (device != HQ_DEVICE_HOST) return 0;
  return tile_bytes(rows, cols);
}

/* A storage this instance's layout() described for direction `dir` of [M, K]. */
static int check_own(const fp8b_cfg *c, const hq_call *call, const hq_storage *s, uint32_t dir,
                     int64_t M, int64_t K, geom *g) {
  if (!s)
    return call->host->error(HQ_EINVAL, "fp8_block: quantize of the %s direction without its "
                             "storage", dname(dir));
  int rc = read_storage(call->host, s, M, K, g);
  if (rc) return rc;
  if (g->colwise != (dir == HQ_COLWISE) || g->elem != c->elem || g->two_d != c->two_d)
    return call->host->error(HQ_EINVAL, "fp8_block: the %s storage (%s %s, %s blocks) is not "
                             "one this instance (%s, %s blocks) describes", dname(dir),
                             g->colwise ? "columnwise" : "rowwise",
                             g->elem == HQ_E5M2 ? "e5m2" : "e4m3", g->two_d ? "2-D" : "1-D",
                             c->elem == HQ_E5M2 ? "e5m2" : "e4m3", c->two_d ? "2-D" : "1-D");
  return HQ_OK;
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const fp8b_cfg *c = cfgp;
  int rc = device_ok(call, (call->flags & HQ_CALL_UPDATE) ? "update" : "quantize");
  if (!rc) rc = check_hp(call, src, "source");
  if (rc) return rc;
  const int64_t M = src->rows, K = src->cols;
  uint8_t *rd = NULL, *cd = NULL;
  float *rs = NULL, *cs = NULL;
  int64_t d0, d1, n1;
  geom g;
  if (dirs & HQ_ROWWISE) {
    if ((rc = check_own(c, call, row, HQ_ROWWISE, M, K, &g))) return rc;
    rd = g.data;
    rs = g.scale;
  }
  if (dirs & HQ_COLWISE) {
    if ((rc = check_own(c, call, col, HQ_COLWISE, M, K, &g))) return rc;
    cd = g.data;
    cs = g.scale;
  }
  /* the fused optimizer write-back (ABI 2.2, HQ_CAP_FUSED_ADAM): the kernel reads each element
     of its tile once, so it applies the step to the FP32 master as it reads it */
  int adam_ok;
  const hq_adam_pass *adam = hq_call_adam(call, src, &adam_ok);
  if (!adam_ok)
    return call->host->error(HQ_EINVAL, "fp8_block: the fused optimizer step comes with an "
                             "update of an f32 master on a CUDA device (gradient f32, f16 or "
                             "bf16)");
  (void)adam; /* read by the CUDA path only */
  if (M <= 0 || K <= 0 || (!rd && !cd)) return HQ_OK;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return fp8b_cuda_quantize(call, src, (int)c->elem, c->two_d, c->pow2, c->epsilon, rd, rs, cd,
                              cs, adam);
#endif
  const size_t need = tile_bytes(M, K);
  if (!call->scratch || call->scratch_bytes < need)
    return call->host->error(HQ_EINVAL, "fp8_block: call->scratch holds %zu bytes, a [%lld, %lld] "
                             "tensor needs %zu (scratch_size)",
                             call->scratch ? call->scratch_bytes : (size_t)0, (long long)M,
                             (long long)K, need);
  if (rs) {
    hq_fp8b_scale_shape(M, K, 0, c->two_d, &d0, &d1, &n1);
    zero_padding(rs, d0, d1, n1);
  }
  if (cs) {
    hq_fp8b_scale_shape(M, K, 1, c->two_d, &d0, &d1, &n1);
    zero_padding(cs, d0, d1, n1);
  }
  tile t;
  tile_carve(call->scratch, M, &t);
  /* one read of the input: every 128x128 tile is loaded once and feeds both directions */
  for (int64_t m0 = 0; m0 < M; m0 += B) {
    const int nr = (int)(M - m0 < B ? M - m0 : B);
    for (int64_t k0 = 0; k0 < K; k0 += B) {
      const int nc = (int)(K - k0 < B ? K - k0 : B);
      load_tile(src, m0, k0, nr, nc, t.x);
      if (c->two_d) tile_2d(c, src->dtype, &t, M, K, m0, k0, nr, nc, rd, rs, cd, cs);
      else tile_1d(c, src->dtype, &t, M, K, m0, k0, nr, nc, rd, rs, cd, cs);
    }
  }
  return HQ_OK;
}

/* Every layout fact comes from the storage (s->desc and its buffers), not from cfg: the storage
   may come from a differently configured fp8_block instance. HQ_CALL_DEQ_RAW asks for the raw
   values (elements times block scales, no per-tensor factor, no transform): fp8_block has
   neither a per-tensor factor nor a transform, so they are exactly the dequantized values and
   the one code path below writes both. */
static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const int raw = (call->flags & HQ_CALL_DEQ_RAW) != 0;
  (void)raw; /* raw == dequantized for this format (see above) */
  int rc = device_ok(call, "dequantize");
  if (!rc) rc = check_hp(call, dst, "destination");
  if (rc) return rc;
  const int64_t M = dst->rows, K = dst->cols;
  if (!s) return call->host->error(HQ_EINVAL, "fp8_block: dequantize of a NULL storage");
  if (M != s->rows || K != s->cols)
    return call->host->error(HQ_ESHAPE, "fp8_block: destination [%lld, %lld] does not match the "
                             "storage's [%lld, %lld]", (long long)M, (long long)K,
                             (long long)s->rows, (long long)s->cols);
  geom g;
  if ((rc = read_storage(call->host, s, M, K, &g))) return rc;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return fp8b_cuda_dequantize(call, (int)g.elem, g.colwise, g.two_d, g.data, g.scale, dst);
#endif
  const uint8_t *q = g.data;
  const float *sc = g.scale;
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      float si = sc[hq_fp8b_scale_index(m, k, M, K, g.colwise, g.two_d)];
      uint8_t b = g.colwise ? q[k * M + m] : q[m * K + k];
      hq_store_hp(dst->data, m * K + k, dst->dtype, hq_fp8_dequantize(b, si, g.elem));
    }
  return HQ_OK;
}

/* Problems up to this many multiply-adds (m * n * k) take the module's own kernel: there
   cuBLASLt's block-scaled GEMM is mostly its fixed cost; larger ones are faster on cuBLASLt,
   whose kernels reuse each operand tile across a wider one of the other. */
#ifndef HQ_FP8B_GEMM_MAX_MNK
#define HQ_FP8B_GEMM_MAX_MNK (1ll << 25)
#endif
/* the kernel addresses an operand's codes with 32-bit offsets (m * k bytes at most) */
_Static_assert(HQ_FP8B_GEMM_MAX_MNK <= (1ll << 31), "HQ_FP8B_GEMM_MAX_MNK above 2^31");
/* ... and at most this k: each CTA walks k alone, block after block, where cuBLASLt splits a long
   k across CTAs (a few tiles of a long k would leave most SMs idle). */
#define HQ_FP8B_GEMM_MAX_K 2048

#ifdef HQ_HAVE_CUDA
/* One operand of the module's GEMM: s a storage whose stored matrix is `outer` rows of k
   contiguous elements. HQ_ENOTSUP, without a message (gemm_op), for one the kernel does not
   take. */
static int gemm_operand(const hq_host_api *h, const hq_storage *s, int64_t outer, int64_t k,
                        fp8b_gemm_operand *o) {
  geom g;
  if (!s) return h->error(HQ_EINVAL, "fp8_block: a GEMM operand without a storage");
  int rc = read_storage(h, s, s->rows, s->cols, &g);
  if (rc) return rc;
  /* the stored matrix: [rows, cols] rowwise, [cols, rows] columnwise (transposed); the kernel
     reads its codes 16 bytes at a time */
  const int64_t R = g.colwise ? s->cols : s->rows, C = g.colwise ? s->rows : s->cols;
  if (R != outer || C != k || C % 16 || ((uintptr_t)g.data & 15u)) return HQ_ENOTSUP;
  *o = (fp8b_gemm_operand){.q = g.data, .scale = g.scale, .elem = g.elem, .two_d = g.two_d};
  return HQ_OK;
}
#endif

/* The module's own GEMM (ABI 2.1's gemm op): on Hopper (compute capability 9.x; the build has its
   code for sm_90 and Blackwell alone) a small problem's block-scaled product in one kernel
   (fp8_block_gemm.cu) by mma.sync on the codes, in place of cuBLASLt's -- the same products of
   codes, each block's partial sum times its two scales into FP32, so a native product that equals
   cuBLASLt's up to the order and precision of accumulation. Its 2-D x 2-D products, which
   cuBLASLt does not run, are native here too. Everything else -- the host, other devices,
   problems above HQ_FP8B_GEMM_MAX_MNK or HQ_FP8B_GEMM_MAX_K, a layout the kernel does not read --
   is declined without a message and takes the core's paths (cuBLASLt's, or the emulated one with
   its reason); a storage that is not fp8_block's at all is an error. */
static int gemm_op(const void *cfgp, const hq_call *call, const hq_gemm_problem *p) {
  (void)cfgp; /* the storages describe themselves */
  if (call->device == HQ_DEVICE_HOST) return HQ_ENOTSUP;
#ifndef HQ_HAVE_CUDA
  (void)p;
  return HQ_ENOTSUP;
#else
  if (!hq_small_gemm_fits(call, p, HQ_FP8B_GEMM_MAX_MNK, HQ_FP8B_GEMM_MAX_K, FP8B_GEMM_TILE))
    return HQ_ENOTSUP;
  const hq_host_api *h = call->host;
  fp8b_gemm_operand a, b;
  int rc = gemm_operand(h, p->a, p->m, p->k, &a);
  if (!rc) rc = gemm_operand(h, p->b, p->n, p->k, &b);
  if (rc) return rc;
  return p->flags & HQ_GEMM_QUERY ? HQ_OK : fp8b_cuda_gemm(call, p, &a, &b);
#endif
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 1, /* requires ABI 2.1 (raw dequantize, gemm) */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(fp8b_cfg),
    .name = "fp8_block",
    .version = PACKAGE_VERSION,
    .description = "FP8 block scaling (DeepSeek-V3): 1x128/128x1 or 128x128 blocks, FP32 scales, "
                   "GEMM-ready layouts; columnwise = [K, M]",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA | HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .scratch_size = scratch_size,
    .quantize = quantize,
    .dequantize = dequantize,
    .tensor_factor = NULL, /* no per-tensor factor */
    .gemm = gemm_op,
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
};

HQ_FORMAT_DEFINE(ops);
