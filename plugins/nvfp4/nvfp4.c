/*
** nvfp4.c -- NVFP4 (FP4 E2M1 elements in 16-element blocks, an E4M3 scale per block and an FP32
** global amax per direction): the plugin (ABI 2.1) and its CPU reference (docs/formats.md).
** CUDA path (nvfp4.cu, built when HQ_HAVE_CUDA; every option, sm_90 and sm_100): the same
** rules functions, bit-identical to this reference. amax: one pass over the input (a flat
** vectorized pass; with rht 64x128 tiles in shared memory, the columnwise amax over
** hq_nvfp4_rht16 of each column's 16-groups), integer atomicMax on the FP32 bits
** (deterministic). quantize/update: that pass into the storages' amax buffers unless
** call->amax is given, then ONE kernel reading each 64x128 tile once and writing both
** directions (staged through shared memory, coalesced 8-byte stores; block_2d tile amaxes, RHT,
** Philox SR and swizzled scale indices as below).
** dequantize: a kernel per direction (the columnwise copy through the inverse RHT and a shared
** tile); dequantize_pair: an emulated GEMM's two raw dequantizes as one launch of both bodies.
** make_empty zeroes with cudaMemsetAsync. Everything on call->stream, no scratch (0 on a device),
** no allocation, no synchronization.
**
** Quantize, per direction, with TE's operation order (docs/formats.md; every rule is a function of
** nvfp4_rules.h, which the CUDA kernels share):
**   A     = the direction's global amax: max |x| over the whole input, NaN ignored, Inf counted.
**           Without RHT both directions use amax(x); with RHT the columnwise A is the amax of the
**           BF16-rounded transformed values (docs/formats.md "Global amax per direction").
**           amax_kind(): rowwise HQ_AMAX_INPUT; columnwise HQ_AMAX_INPUT, or HQ_AMAX_OWN with
**           rht. The amax() op computes them; quantize/update compute them too, unless the call
**           brings them (hq_call.amax[0] rowwise, [1] columnwise): then those values are used as
**           given, the input is read once, and the bytes are those of the internal path given
**           the same A (a larger A only changes S_enc and what follows from it).
**   S_enc = min(2688 / A, FLT_MAX) (1 if A == 0 or Inf), S_dec = RN(1 / S_enc),
**   sf    = E4M3(a_b * RN(S_enc * RN(1/6))) per block (stored),
**   enc   = min(1 / (sf * S_dec), FLT_MAX),
**   q     = E2M1(RN(x * enc)): round to nearest even, saturating to +-6, NaN -> +6; or stochastic.
** The rowwise blocks are 1x16 along K; the columnwise blocks are 16x1 along M and the columnwise
** copy is stored transposed, [K, M/2]. A columnwise-only quantize is supported.
**
** Dequantize (either direction, into f32 / bf16 / f16 [M, K]; the columnwise copy un-transposed):
**   x' = RN(e2m1(q) * RN(RN(fp32(sf) * A) * RN(1/2688))), then RN to the output dtype.
** With rht = true the columnwise copy holds the TRANSFORMED values (x^T's 16-groups times
** diag(s) H16 / 4: a GEMM operand whose partner along M is transformed the same way, so the
** product over M is preserved); dequantize applies the inverse transform
** (hq_nvfp4_rht16_inverse), so that every direction dequantizes to an approximation of x itself
** and may meet any partner in an emulated GEMM. Dequantize reads every layout fact from the
** storage (desc.scale_layout, desc.transform and desc.transform_param, the buffers), never from
** the instance's options: a storage made by a differently configured nvfp4 instance dequantizes
** the same.
**
** GEMM operands (ABI 2.1; docs/formats.md "GEMMs"):
**   raw values (dequantize with HQ_CALL_DEQ_RAW): e2m1(q) * fp32(sf) -- WITHOUT the global amax
**     factor and, for an RHT columnwise copy, WITHOUT the inverse transform (the values stay in
**     the transformed domain, which a GEMM against a partner transformed alike may multiply).
**     At most 6 significant bits, magnitudes 0 or 2^-10 .. 2688: exact in BF16, so
**     desc.emul_dtype = HQ_BF16 for every storage.
**   tensor_factor(): f = RN(A * RN(1/2688)) = hq_nvfp4_tensor_factor(A) of the storage's amax
**     buffer (the dequantizer's own rule, hq_nvfp4_decode_mult of a unit scale). The dequantizer
**     computes RN(e2m1 * RN(RN(fp32(sf) * A) * RN(1/2688))), so RN(raw * f) equals the
**     dequantized value bit for bit when fp32(sf) is a power of two, and within 3 ulps otherwise
**     (the order of the CPU reference, which follows TE's dequantize kernel, is kept).
**   native GEMM: none of its own. With swizzled scales (swizzle = true) its storages are what
**     cuBLASLt's VEC16_UE4M3 mode reads, k-contiguous in both directions (rowwise [M, K/2],
**     columnwise [K, M/2]), so gemm/cublaslt's provider multiplies them natively on sm_100 and
**     later, the two global decode scales (tensor_factor()) folded into alpha.
**
** Buffers of each storage, in save order (docs/formats.md; index functions in nvfp4_rules.h):
**      name                  dtype  shape                             role   FSDP gather
**   rowwise storage
**   0  data                  e2m1x2 [M, K/2]                          DATA   ROWS, m_div 1
**   1  scale_inv             e4m3   [roundup(M,128), roundup(K/16,4)] SCALE  ROWS, m_div 1
**   2  amax                  f32    [1]                               AMAX   SAME
**   columnwise storage (stored transposed)
**   0  columnwise_data       e2m1x2 [K, M/2]                          DATA   COLS, m_div 2
**   1  columnwise_scale_inv  e4m3   [roundup(K,128), roundup(M/16,4)] SCALE  COLS, m_div 16
**   2  columnwise_amax       f32    [1]                               AMAX   SAME
**   With swizzle = true the scale buffers are HQ_GATHER_NEVER (a swizzled buffer cannot be
**   concatenated). No buffer is shared between the directions (each has its own amax).
**   Element (i, k): rowwise byte hq_nvfp4_row_data_index(i, k, K), low nibble when k is even;
**   columnwise byte hq_nvfp4_col_data_index(i, k, M), low nibble when i is even. Its scale:
**   hq_nvfp4_row_scale_index(i, k, K, swizzle) / hq_nvfp4_col_scale_index(i, k, M, swizzle):
**   compact row-major [r][k/16] or, with swizzle, the cuBLAS 128x4-tile layout of docs/formats.md
**   2.4 for both copies ("row" scaling, the columnwise data being transposed). Every padded
**   scale entry is written as zero, so the bytes of a quantized tensor are deterministic.
** The operand descriptor (hq_storage.desc) of each storage:
**   elem HQ_E2M1X2; order HQ_ORDER_MK (rowwise) / HQ_ORDER_KM (columnwise);
**   scale_mode HQ_SCALE_VEC16_UE4M3 (the AMAX buffer holds the global amax A);
**   scale_layout HQ_SCALE_LAYOUT_OUTER_MAJOR, or HQ_SCALE_LAYOUT_SWIZZLED with swizzle;
**   block_m x block_k 1x16 (rowwise) / 16x1 (columnwise), 16x16 for both with block_2d;
**   transform HQ_TRANSFORM_RHT16 with transform_param = rht_sign_mask on the columnwise storage
**   with rht, else HQ_TRANSFORM_NONE and 0; emul_dtype HQ_BF16;
**   shard_rows 16 (FSDP shards are whole 16-row blocks; shards quantized with the shared amax
**   concatenate to the full tensor's bytes), 0 with stochastic_rounding (its random stream
**   follows each block's position in the whole tensor: not shardable).
**   hq_storage.meta is not used.
**
** Scratch: scratch_size() declares the 16-row FP32 strip buffer (16 * (K + 16) floats) and, with
** stochastic rounding, the Philox words of max(K, 256)/16 blocks; quantize, update and amax take
** them from call->scratch. The one allocation left is optional: with rht and no caller amax,
** a quantize outside an update keeps the transformed tiles of its amax pass (M*K BF16) in
** host->alloc memory so that the quantize pass reads them instead of transforming again; during
** an update (HQ_CALL_UPDATE), or when that allocation fails, the pass transforms again (the same
** bits).
**
** Options:
**   rht (false), rht_sign_mask (0xD7E8): the 16-point random Hadamard transform of the
**     columnwise copy only, in the fixed FP32 order of hq_nvfp4_rht16 (sign flip, butterfly
**     stages 1, 2, 4, 8 with RN adds, RN * 0.25 (exact but in FP32's subnormal range), RN to
**     BF16). Any input dtype is accepted: f32 and f16 inputs are rounded to BF16 first (TE
**     accepts BF16 only; BF16 is unchanged).
**   stochastic_rounding (false), seed (0 = the context's seed): E2M1 stochastic rounding in both
**     directions, random bits from Philox4x32-10, one call per (direction, block, call offset)
**     (hq_nvfp4_sr_bits: key = seed, counter = block index | direction, hq_call.offset), byte e
**     of the 16 for element e of the block; the same on every device and thread mapping.
**   block_2d (false): one scale per 16x16 tile, written for all its 16 rows (rowwise) and 16
**     columns (columnwise); both directions share amax(x), so the columnwise copy is exactly the
**     nibble transpose of the rowwise copy. Refused with rht or stochastic_rounding.
**   swizzle (false): scales in the swizzled layout above.
** Shape rule: M % 16 == 0 and K % 16 == 0.
*/
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION: a stock module reports the package version */
#include "hq/plugin.h"
#include "small_gemm.h"
#include "nvfp4.h"
#include "nvfp4_rules.h"

enum { OPT_RHT, OPT_SIGNS, OPT_SR, OPT_SEED, OPT_2D, OPT_SWIZZLE, OPT_SCALE, OPT_GLOBAL };

static const hq_option options[] = {
    [OPT_RHT] = {"rht", HQ_OPT_BOOL, "false",
                 "16-point RHT of the columnwise copy: BF16 in, signs, FP32 butterflies h=1,2,4,8, "
                 "x0.25, BF16 out (hq/hq.h, docs/formats.md 5.3)",
                 NULL, 0, -1},
    [OPT_SIGNS] = {"rht_sign_mask", HQ_OPT_INT, "0xD7E8",
                   "RHT signs: bit i set makes s_i = -1 (default: TE's fixed vector)", NULL, 0,
                   65535},
    [OPT_SR] = {"stochastic_rounding", HQ_OPT_BOOL, "false",
                "stochastic rounding of the E2M1 elements (Philox4x32-10), both directions", NULL,
                0, -1},
    [OPT_SEED] = {"seed", HQ_OPT_INT, "0",
                  "stochastic rounding seed; 0 uses the context's seed", NULL, 0,
                  9223372036854775807.0},
    [OPT_2D] = {"block_2d", HQ_OPT_BOOL, "false",
                "one scale per 16x16 tile (weights): columnwise = nibble transpose of rowwise",
                NULL, 0, -1},
    [OPT_SWIZZLE] = {"swizzle", HQ_OPT_BOOL, "false",
                     "block scales in cuBLAS's swizzled 128x4-tile layout (GEMM-ready)", NULL, 0,
                     -1},
    /* the enum indices are HQ_NVFP4_SCALE_* and HQ_NVFP4_GLOBAL_* */
    [OPT_SCALE] = {"scale_dtype", HQ_OPT_ENUM, "e4m3",
                   "block scale type: e4m3 (max 448) or ue5m3 (unsigned E5M3, max 114688; TE's "
                   "prototype)",
                   "e4m3|ue5m3", 0, -1},
    [OPT_GLOBAL] = {"global_scale", HQ_OPT_ENUM, "tensor",
                    "FP32 global amax: one per direction (tensor), one per stored row (row: TE's "
                    "row-scaled NVFP4), or none (ue5m3 only)",
                    "tensor|row|none", 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  nvfp4_cfg *c = cfgp;
  c->rht = (int)v[OPT_RHT].i;
  c->rht_sign_mask = (uint32_t)v[OPT_SIGNS].i;
  c->sr = (int)v[OPT_SR].i;
  c->seed = (uint64_t)v[OPT_SEED].i;
  c->block_2d = (int)v[OPT_2D].i;
  c->swizzle = (int)v[OPT_SWIZZLE].i;
  c->scale_kind = (int)v[OPT_SCALE].i;
  c->global = (int)v[OPT_GLOBAL].i;
  if (c->global == HQ_NVFP4_GLOBAL_NONE && c->scale_kind != HQ_NVFP4_SCALE_UE5M3)
    return host->error(HQ_EINVAL, "nvfp4: global_scale = none needs scale_dtype = ue5m3 (E4M3 "
                       "block scales span 2^-9 .. 448 and need the global scale to reach a "
                       "tensor's range)");
  if (c->global == HQ_NVFP4_GLOBAL_ROW && (c->rht || c->block_2d))
    return host->error(HQ_EINVAL, "nvfp4: global_scale = row cannot be combined with %s = true "
                       "(TE's row-scaled NVFP4 quantizes 1x16 blocks without the RHT)",
                       c->rht ? "rht" : "block_2d");
  if (c->block_2d && (c->rht || c->sr))
    return host->error(HQ_EINVAL, "nvfp4: block_2d = true cannot be combined with %s = true "
                       "(2-D quantization makes the columnwise copy the nibble transpose of the "
                       "rowwise one; TE's weights use neither RHT nor stochastic rounding)",
                       c->rht ? "rht" : "stochastic_rounding");
  return HQ_OK;
}

/* Whether an instance (or a storage) uses one of the options outside NVFP4 as cuBLASLt reads it
   (scale_dtype = ue5m3, global_scale = row or none): no native GEMM reads their scales. */
static int opt_path(int scale_kind, int global) {
  return scale_kind != HQ_NVFP4_SCALE_E4M3 || global != HQ_NVFP4_GLOBAL_TENSOR;
}

static uint64_t instance_caps(const void *cfgp) {
  const nvfp4_cfg *c = cfgp;
  uint64_t caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR;
#ifdef HQ_HAVE_CUDA
  caps |= HQ_CAP_CUDA | HQ_CAP_RNG_DEV; /* every option runs on CUDA; a graph's SR draws from
                                            the device step (hq_call.offset_dev) */
#else
  (void)c;
#endif
  if (!c->sr) caps |= HQ_CAP_REQUANT_SAFE;
  if (c->global == HQ_NVFP4_GLOBAL_ROW) caps |= HQ_CAP_DEQ_ROW_FACTOR;
  return caps;
}

static int check_shape(const hq_host_api *host, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    return host->error(HQ_ESHAPE, "nvfp4: shape [%lld, %lld] is negative", (long long)rows,
                       (long long)cols);
  if (rows % HQ_NVFP4_BLOCK)
    return host->error(HQ_ESHAPE, "nvfp4: rows = %lld is not a multiple of 16", (long long)rows);
  if (cols % HQ_NVFP4_BLOCK)
    return host->error(HQ_ESHAPE, "nvfp4: cols = %lld is not a multiple of 16", (long long)cols);
  return HQ_OK;
}

static const char *dir_name(uint32_t dir) {
  return dir == HQ_ROWWISE ? "rowwise" : dir == HQ_COLWISE ? "columnwise" : "(no direction)";
}

/* The scale buffer's dtype of a scale type. */
static hq_dtype scale_dtype(int kind) {
  return kind == HQ_NVFP4_SCALE_UE5M3 ? HQ_U8 : HQ_E4M3;
}

/* The descriptor fields this instance gives direction `dir` (all but struct_size). */
static void instance_desc(const nvfp4_cfg *c, uint32_t dir, hq_operand_desc *d) {
  const int row = dir == HQ_ROWWISE, rht = !row && c->rht;
  d->elem = HQ_E2M1X2;
  d->order = row ? HQ_ORDER_MK : HQ_ORDER_KM;
  /* only E4M3 scales under one global amax are what cuBLASLt's VEC16_UE4M3 mode (and the fused
     kernel) read; UE5M3 scales and per-row global scales are a scheme of this module alone */
  d->scale_mode = opt_path(c->scale_kind, c->global) ? HQ_SCALE_OTHER : HQ_SCALE_VEC16_UE4M3;
  d->scale_layout = c->swizzle ? HQ_SCALE_LAYOUT_SWIZZLED : HQ_SCALE_LAYOUT_OUTER_MAJOR;
  d->block_m = c->block_2d || !row ? HQ_NVFP4_BLOCK : 1;
  d->block_k = c->block_2d || row ? HQ_NVFP4_BLOCK : 1;
  d->transform = rht ? HQ_TRANSFORM_RHT16 : HQ_TRANSFORM_NONE;
  d->transform_param = rht ? (uint64_t)c->rht_sign_mask : 0;
  /* a per-column amax (global_scale = row, columnwise) spans every shard's rows */
  d->shard_rows = c->sr || (!row && c->global == HQ_NVFP4_GLOBAL_ROW) ? 0 : HQ_NVFP4_BLOCK;
  /* raw values e2m1 * sf: at most 6 significant bits, 2^-18 .. 688128 (BF16-exact); with
     global_scale = row they carry their row's global decode scale too (F32) */
  d->emul_dtype = c->global == HQ_NVFP4_GLOBAL_ROW ? HQ_F32 : HQ_BF16;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const nvfp4_cfg *c = cfgp;
  (void)dirs; /* no buffer is shared between the directions */
  int rc = check_shape(host, rows, cols);
  if (rc) return rc;
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "nvfp4: layout of direction %u (want rowwise or columnwise)",
                       dir);
  const int row = dir == HQ_ROWWISE;
  /* the stored data is [R, C/2]: rowwise [M, K/2], columnwise [K, M/2] (M contiguous) */
  const int64_t R = row ? rows : cols, C = row ? cols : rows;
  /* shards split M: dim 0 of the rowwise buffers, dim 1 of the transposed columnwise ones */
  const uint32_t along_m = row ? HQ_GATHER_ROWS : HQ_GATHER_COLS;
  hq_buffer *b = hq_buffer_describe(out, NVFP4_DATA, row ? "data" : "columnwise_data",
                                    HQ_ROLE_DATA, HQ_E2M1X2, 2, R, C / 2);
  hq_buffer_gather(b, along_m, row ? 1 : 2); /* a columnwise byte holds two rows of M */
  /* UE5M3 scale bytes have no hq_dtype of their own: u8 codes, read as UE5M3 (the scale
     buffer's dtype is what tells a storage's scale type) */
  b = hq_buffer_describe(out, NVFP4_SCALE_INV, row ? "scale_inv" : "columnwise_scale_inv",
                         HQ_ROLE_SCALE, scale_dtype(c->scale_kind), 2, hq_nvfp4_scale_rows(R),
                         hq_nvfp4_scale_cols(C));
  if (!c->swizzle) hq_buffer_gather(b, along_m, row ? 1 : HQ_NVFP4_BLOCK);
  if (c->global == HQ_NVFP4_GLOBAL_TENSOR) {
    b = hq_buffer_describe(out, NVFP4_AMAX, row ? "amax" : "columnwise_amax", HQ_ROLE_AMAX,
                           HQ_F32, 1, 1, 0);
    hq_buffer_gather(b, HQ_GATHER_SAME, 1);
  } else if (c->global == HQ_NVFP4_GLOBAL_ROW) {
    /* one amax per stored row: not the per-tensor AMAX role; rowwise shards own their rows */
    b = hq_buffer_describe(out, NVFP4_AMAX, row ? "amax" : "columnwise_amax", HQ_ROLE_OTHER,
                           HQ_F32, 1, R, 0);
    if (row) hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  }
  instance_desc(c, dir, &out->desc);
  return HQ_OK;
}

/* A storage's options, read from its buffers (the storage describes itself): the scale type
   from the scale buffer's dtype (e4m3, or u8 codes read as UE5M3), the global scale from its
   amax buffer (none without one, [1] per tensor, [R] per stored row). */
typedef struct nvfp4_mode {
  int scale_kind, global;
} nvfp4_mode;

/* A storage must be an nvfp4 storage of direction `dir` for [M, K], with its buffers allocated
   (never write or read out of bounds); *mode (may be NULL) gets its options. */
static int check_storage(const hq_host_api *host, const hq_storage *s, uint32_t dir, int64_t M,
                         int64_t K, nvfp4_mode *mode) {
  const int64_t R = dir == HQ_ROWWISE ? M : K, C = dir == HQ_ROWWISE ? K : M;
  nvfp4_mode md = {HQ_NVFP4_SCALE_E4M3, HQ_NVFP4_GLOBAL_TENSOR};
  int ok = s && s->dir == dir && (s->nbuf == NVFP4_NBUF || s->nbuf == NVFP4_NBUF - 1) &&
           s->buf_size >= sizeof(hq_buffer) && s->rows == M && s->cols == K;
  if (ok) {
    const hq_buffer *d = hq_storage_cbuf(s, NVFP4_DATA), *sc = hq_storage_cbuf(s, NVFP4_SCALE_INV);
    md.scale_kind = sc->dtype == HQ_U8 ? HQ_NVFP4_SCALE_UE5M3 : HQ_NVFP4_SCALE_E4M3;
    ok = d->role == HQ_ROLE_DATA && d->dtype == HQ_E2M1X2 && d->bytes == (size_t)(R * (C / 2)) &&
         sc->role == HQ_ROLE_SCALE && (sc->dtype == HQ_E4M3 || sc->dtype == HQ_U8) &&
         sc->bytes == (size_t)(hq_nvfp4_scale_rows(R) * hq_nvfp4_scale_cols(C)) && d->ptr &&
         sc->ptr;
    if (ok && s->nbuf == NVFP4_NBUF) {
      const hq_buffer *a = hq_storage_cbuf(s, NVFP4_AMAX);
      md.global = a->bytes == sizeof(float) && a->role == HQ_ROLE_AMAX ? HQ_NVFP4_GLOBAL_TENSOR
                                                                       : HQ_NVFP4_GLOBAL_ROW;
      ok = a->dtype == HQ_F32 && a->ptr &&
           (md.global == HQ_NVFP4_GLOBAL_TENSOR
                ? 1
                : a->role == HQ_ROLE_OTHER && a->bytes == (size_t)R * sizeof(float));
    } else if (ok) {
      md.global = HQ_NVFP4_GLOBAL_NONE;
      ok = md.scale_kind == HQ_NVFP4_SCALE_UE5M3;
    }
  }
  if (!ok)
    return host->error(HQ_EINVAL, "nvfp4: the %s storage does not match a [%lld, %lld] tensor",
                       dir_name(dir), (long long)M, (long long)K);
  if (mode) *mode = md;
  return HQ_OK;
}

/* quantize() writes what this instance's layout() described: refuse a storage whose descriptor
   says otherwise (a storage of another instance), rather than write bytes it mislabels. */
static int check_made_here(const hq_host_api *host, const nvfp4_cfg *c, const hq_storage *s) {
  hq_operand_desc want;
  memset(&want, 0, sizeof want);
  instance_desc(c, s->dir, &want);
  const hq_operand_desc *d = &s->desc;
  nvfp4_mode md;
  if (check_storage(host, s, s->dir, s->rows, s->cols, &md) || md.scale_kind != c->scale_kind ||
      md.global != c->global)
    return host->error(HQ_EINVAL, "nvfp4: the %s storage was not described by this instance "
                       "(its scale type or global scale differs: another nvfp4 configuration "
                       "made it)", dir_name(s->dir));
  if (d->elem != want.elem || d->order != want.order || d->scale_mode != want.scale_mode ||
      d->scale_layout != want.scale_layout || d->block_m != want.block_m ||
      d->block_k != want.block_k || d->transform != want.transform ||
      d->transform_param != want.transform_param)
    return host->error(HQ_EINVAL, "nvfp4: the %s storage was not described by this instance "
                       "(its descriptor differs: another nvfp4 configuration made it)",
                       dir_name(s->dir));
  return HQ_OK;
}

static int make_empty(const void *cfgp, const hq_call *call, hq_storage *s) {
  (void)cfgp;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    for (uint32_t i = 0; i < s->nbuf; i++) {
      hq_buffer *b = hq_storage_buf(s, i);
      if (b->ptr && b->bytes) {
        int rc = nvfp4_cuda_memset(call, b->ptr, b->bytes);
        if (rc) return rc;
      }
    }
    return HQ_OK;
#else
    return call->host->error(HQ_ENOTSUP, "nvfp4: built without CUDA (CPU reference only)");
#endif
  }
  for (uint32_t i = 0; i < s->nbuf; i++) {
    hq_buffer *b = hq_storage_buf(s, i);
    if (b->ptr) memset(b->ptr, 0, b->bytes);
  }
  return HQ_OK;
}

// --- scratch -----------------------------------------------------------------------------------

/* call->scratch, in this order: the strip buffer S, 16 rows of ld = K + 16 floats (one spare
   cache line per row: columns don't alias in L1); with stochastic rounding, the Philox words of
   max(K, 256)/16 blocks (a row's K/16 blocks, or the 16 columns of a columnwise tile). */
static int64_t strip_ld(int64_t cols) { return cols + 16; }
static size_t strip_bytes(int64_t cols) { return (size_t)(16 * strip_ld(cols)) * sizeof(float); }
static size_t bits_bytes(int64_t cols) {
  return (size_t)((cols > 256 ? cols : 256) / 16) * sizeof(uint32_t[4]);
}
static size_t scratch_need(const nvfp4_cfg *c, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return strip_bytes(cols) + (c->sr ? bits_bytes(cols) : 0);
}

static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)dirs;
  if (device != HQ_DEVICE_HOST) return 0; /* the CUDA kernels work in shared-memory tiles */
  return scratch_need(cfgp, rows, cols);
}

/* The strip buffer (and SR words) of a call on [rows, cols]; NULLs for an empty tensor. */
static int scratch_take(const nvfp4_cfg *c, const hq_call *call, int64_t rows, int64_t cols,
                        float **S, uint32_t (**bits)[4]) {
  const size_t need = scratch_need(c, rows, cols);
  *S = NULL;
  if (bits) *bits = NULL;
  if (!need) return HQ_OK;
  if (!call->scratch || call->scratch_bytes < need)
    return call->host->error(HQ_EINVAL, "nvfp4: call->scratch holds %zu bytes, a [%lld, %lld] "
                             "tensor needs %zu (scratch_size)",
                             call->scratch ? call->scratch_bytes : (size_t)0, (long long)rows,
                             (long long)cols, need);
  *S = call->scratch;
  if (bits && c->sr) *bits = (uint32_t(*)[4])((char *)call->scratch + strip_bytes(cols));
  return HQ_OK;
}

// --- CPU reference: quantize -------------------------------------------------------------------

/* One direction being quantized. */
typedef struct qdir {
  uint8_t *data, *scale;   /* NULL: the direction is not made by this call */
  float *amax_out;         /* [1] (tensor), [R] (row: one per stored row), NULL (none) */
  int kind, global;        /* HQ_NVFP4_SCALE_*, HQ_NVFP4_GLOBAL_* */
  float amax;              /* the global amax A (tensor) */
  float m;                 /* RN(S_enc * RN(1/6)) (tensor, none) */
  float enc[256];          /* hq_nvfp4_encode_mult_k of every scale code, for this S_dec */
} qdir;

/* The global scale of one stored row (global_scale = row), from its amax. */
typedef struct rowscale {
  float m, s_dec;
} rowscale;
static rowscale rowscale_of(float amax, int kind) {
  const float s_enc = hq_nvfp4_global_encode_scale_k(amax, kind);
  rowscale r = {hq_nvfp4_block_scale_mult(s_enc), hq_nvfp4_global_decode_scale(s_enc)};
  return r;
}

static void qdir_start(qdir *d, const nvfp4_cfg *c, hq_storage *s, float amax) {
  hq_buffer *scale = hq_storage_buf(s, NVFP4_SCALE_INV);
  d->data = hq_storage_buf(s, NVFP4_DATA)->ptr;
  d->scale = scale->ptr;
  d->kind = c->scale_kind;
  d->global = c->global;
  d->amax_out = c->global == HQ_NVFP4_GLOBAL_NONE ? NULL : hq_storage_buf(s, NVFP4_AMAX)->ptr;
  d->amax = amax;
  /* global_scale = none: S_enc = 1 (TE's quantizer given no amax) */
  float s_enc = c->global == HQ_NVFP4_GLOBAL_NONE ? 1.0f
                                                  : hq_nvfp4_global_encode_scale_k(amax, d->kind);
  float s_dec = hq_nvfp4_global_decode_scale(s_enc);
  d->m = hq_nvfp4_block_scale_mult(s_enc);
  if (c->global != HQ_NVFP4_GLOBAL_ROW)
    for (int v = 0; v < 256; v++) d->enc[v] = hq_nvfp4_encode_mult_k((uint8_t)v, s_dec, d->kind);
  else if (!(s->rows && s->cols) && hq_storage_buf(s, NVFP4_AMAX)->bytes)
    memset(d->amax_out, 0, hq_storage_buf(s, NVFP4_AMAX)->bytes); /* no strip writes them */
  memset(d->scale, 0, scale->bytes); /* padding: deterministic zeros */
}

/* The CPU loops below keep a constant trip count of 16 innermost: that is what GCC vectorizes
   at -O2 (its "very cheap" cost model refuses loops that need an epilogue). */

/* Rows [r0, r0 + n) of src as FP32 into S (row stride ld). */
static void load_rows(const hq_tensor *src, int64_t r0, int64_t n, float *S, int64_t ld) {
  const int64_t K = src->cols;
  for (int64_t r = 0; r < n; r++) {
    float *o = S + r * ld;
    if (src->dtype == HQ_F32) {
      memcpy(o, (const float *)src->data + (r0 + r) * K, (size_t)K * sizeof(float));
    } else if (src->dtype == HQ_F16) {
      const uint16_t *p = (const uint16_t *)src->data + (r0 + r) * K;
      for (int64_t k = 0; k < K; k++) o[k] = hq_f16_to_f32(p[k]);
    } else {
      const uint16_t *p = (const uint16_t *)src->data + (r0 + r) * K;
      for (int64_t k = 0; k < K; k += 16)
        for (int l = 0; l < 16; l++) o[k + l] = hq_bf16_to_f32(p[k + l]);
    }
  }
}

/* hq_nvfp4_amax of n values, n a multiple of 16, with 16 running maxima. */
static float amax16(const float *v, int64_t n) {
  float mx[16] = {0};
  for (int64_t i = 0; i < n; i += 16) {
    for (int l = 0; l < 16; l++) {
      int32_t b = (int32_t)(hq_f32_bits(v[i + l]) & 0x7fffffffu);
      b = b > 0x7f800000 ? 0 : b;
      int32_t m = (int32_t)hq_f32_bits(mx[l]);
      mx[l] = hq_bits_f32((uint32_t)(b > m ? b : m));
    }
  }
  return hq_nvfp4_amax(mx, 16);
}

/* amax of the whole input (docs/formats.md); half-precision inputs go through the strip buffer. */
static float input_amax(const hq_tensor *src, float *S, int64_t ld) {
  float m = 0.0f;
  if (src->dtype == HQ_F32) return amax16(src->data, src->rows * src->cols);
  for (int64_t r0 = 0; r0 < src->rows; r0 += HQ_NVFP4_BLOCK) {
    load_rows(src, r0, HQ_NVFP4_BLOCK, S, ld);
    for (int r = 0; r < HQ_NVFP4_BLOCK; r++) {
      float b = amax16(S + r * ld, src->cols);
      m = b > m ? b : m;
    }
  }
  return m;
}

/* out[k] = max |x[i][k]| over the rows i (NaN ignored, Inf counted): the columnwise amaxes of
   global_scale = row, one per column of x (a stored row of the transposed copy). */
static void column_amaxes(const hq_tensor *src, float *S, int64_t ld, float *out) {
  const int64_t K = src->cols;
  for (int64_t k = 0; k < K; k++) out[k] = 0.0f;
  for (int64_t r0 = 0; r0 < src->rows; r0 += HQ_NVFP4_BLOCK) {
    load_rows(src, r0, HQ_NVFP4_BLOCK, S, ld);
    for (int r = 0; r < HQ_NVFP4_BLOCK; r++)
      for (int64_t k = 0; k < K; k++) {
        uint32_t b = hq_abs_bits_nonan(S[r * ld + k]);
        if (b > hq_f32_bits(out[k])) out[k] = hq_bits_f32(b);
      }
  }
}

/* Columns j0..j0+15 of a 16-row strip as 16 contiguous groups: T[16 * l + e] = element e (row
   r0 + e) of column j0 + l, through the RHT when rht is on. */
static inline void column_tile(const float *S, int64_t ld, int64_t j0, const nvfp4_cfg *c,
                               float T[256]) {
  if (c->rht) {
    float v[256]; /* v[16 * e + l]: lanes are columns, as hq_nvfp4_rht16x16 wants */
    for (int e = 0; e < 16; e++) memcpy(v + 16 * e, S + e * ld + j0, 16 * sizeof(float));
    hq_nvfp4_rht16x16(v, c->rht_sign_mask);
    for (int e = 0; e < 16; e++)
      for (int l = 0; l < 16; l++) T[16 * l + e] = v[16 * e + l];
  } else {
    for (int e = 0; e < 16; e++)
      for (int l = 0; l < 16; l++) T[16 * l + e] = S[e * ld + j0 + l];
  }
}

/* amax of RHT(x^T) (BF16-rounded), the columnwise global amax with rht. When `cache` is given
   (M*K values), every transformed 16x16 tile is kept there as BF16 -- exact, the transform
   rounds to BF16 -- tile (r0, j0) at ((r0/16) * (K/16) + j0/16) * 256, so that the quantize
   pass reads it instead of transforming again. */
static float rht_amax(const hq_tensor *src, const nvfp4_cfg *c, float *S, int64_t ld,
                      uint16_t *cache) {
  float m = 0.0f, T[256];
  for (int64_t r0 = 0; r0 < src->rows; r0 += HQ_NVFP4_BLOCK) {
    load_rows(src, r0, HQ_NVFP4_BLOCK, S, ld);
    for (int64_t j0 = 0; j0 < src->cols; j0 += 16) {
      column_tile(S, ld, j0, c, T);
      float b = hq_nvfp4_amax(T, 256);
      m = b > m ? b : m;
      if (cache) {
        uint16_t *o = cache + ((r0 / 16) * (src->cols / 16) + j0 / 16) * 256;
        for (int e = 0; e < 256; e++) o[e] = (uint16_t)(hq_f32_bits(T[e]) >> 16);
      }
    }
  }
  return m;
}

/* Encode 16 values with one multiplier into 8 packed bytes (element 2b low nibble of byte b).
   bits: the block's Philox words for stochastic rounding, or NULL for RNE. The codes are made
   first in a flat loop (vectorizable), then packed. */
static inline void pack16(const float *g, float enc, const uint32_t *bits, uint8_t out[8]) {
  uint8_t c[16];
  if (!bits) {
    for (int e = 0; e < 16; e++) c[e] = (uint8_t)hq_nvfp4_quantize(g[e], enc);
  } else {
    uint32_t r[16]; /* r[e] = hq_nvfp4_sr_byte(bits, e), with constant shifts */
    for (int w = 0; w < 4; w++) {
      r[4 * w] = bits[w] & 0xffu;
      r[4 * w + 1] = (bits[w] >> 8) & 0xffu;
      r[4 * w + 2] = (bits[w] >> 16) & 0xffu;
      r[4 * w + 3] = bits[w] >> 24;
    }
    for (int e = 0; e < 16; e++) c[e] = (uint8_t)hq_nvfp4_quantize_sr(g[e], enc, r[e]);
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  /* the same packing on 64-bit words: byte 2b of a word is c[2b], byte 2b+1 is c[2b+1] */
  for (int h = 0; h < 2; h++) {
    uint64_t x;
    memcpy(&x, c + 8 * h, 8);
    x = (x | x >> 4) & 0x00ff00ff00ff00ffull;
    x = (x | x >> 8) & 0x0000ffff0000ffffull;
    x = (x | x >> 16) & 0x00000000ffffffffull;
    uint32_t y = (uint32_t)x;
    memcpy(out + 4 * h, &y, 4);
  }
#else
  for (int b = 0; b < 8; b++) out[b] = (uint8_t)(c[2 * b] | c[2 * b + 1] << 4);
#endif
}

/* One 16-element block: its scale code (returned) and its 8 bytes. rs: its stored row's
   global scale with global_scale = row, else NULL (the direction's). */
static inline uint8_t encode_block(const float *g, const qdir *d, const rowscale *rs,
                                   const uint32_t *bits, uint8_t out[8]) {
  if (rs) {
    uint8_t sf = hq_nvfp4_block_scale_k(hq_nvfp4_amax(g, 16), rs->m, d->kind);
    pack16(g, hq_nvfp4_encode_mult_k(sf, rs->s_dec, d->kind), bits, out);
    return sf;
  }
  uint8_t sf = hq_nvfp4_block_scale_k(hq_nvfp4_amax(g, 16), d->m, d->kind);
  pack16(g, d->enc[sf], bits, out);
  return sf;
}

typedef struct qjob {
  const nvfp4_cfg *cfg;
  int64_t M, K;
  uint64_t seed, offset;
  const uint16_t *rht_cache;  /* transformed tiles from rht_amax(), or NULL */
} qjob;

/* The SR words of n consecutive blocks first, .. first+n-1 of one direction: the same values as
   hq_nvfp4_sr_bits() block by block, made in one loop over independent blocks so that the
   compiler can run several Philox streams side by side. */
static void sr_bits_run(const qjob *q, uint32_t colwise, uint64_t first, int64_t n,
                        uint32_t (*out)[4]) {
  for (int64_t b = 0; b < n; b++)
    hq_nvfp4_sr_bits(q->seed, q->offset, colwise, first + (uint64_t)b, out[b]);
}

/* 1-D blocks of the 16-row strip S (rows r0..r0+15). `bits` has room for max(K, M)/16 blocks'
   words when stochastic rounding is on. */
static void strip_1d(const qjob *q, const float *S, int64_t ld, int64_t r0, qdir *rd, qdir *cd,
                     uint32_t (*bits)[4]) {
  const int64_t M = q->M, K = q->K;
  const int sw = q->cfg->swizzle, sr = q->cfg->sr;
  if (rd) {
    for (int e = 0; e < 16; e++) {
      const int64_t i = r0 + e;
      rowscale rs, *rsp = NULL;
      if (rd->global == HQ_NVFP4_GLOBAL_ROW) { /* row i's amax, kept in the storage */
        rd->amax_out[i] = amax16(S + e * ld, K);
        rs = rowscale_of(rd->amax_out[i], rd->kind);
        rsp = &rs;
      }
      if (sr) sr_bits_run(q, 0, (uint64_t)(i * (K / 16)), K / 16, bits);
      for (int64_t k = 0; k < K; k += 16)
        rd->scale[hq_nvfp4_row_scale_index(i, k, K, sw)] =
            encode_block(S + e * ld + k, rd, rsp, sr ? bits[k / 16] : NULL,
                         rd->data + hq_nvfp4_row_data_index(i, k, K));
    }
  }
  if (cd) {
    float T[256];
    for (int64_t j0 = 0; j0 < K; j0 += 16) {
      if (q->rht_cache) {
        const uint16_t *t = q->rht_cache + ((r0 / 16) * (K / 16) + j0 / 16) * 256;
        for (int e = 0; e < 256; e++) T[e] = hq_bf16_to_f32(t[e]);
      } else {
        column_tile(S, ld, j0, q->cfg, T);
      }
      /* columnwise block of column k in this strip: k * (M/16) + r0/16 (stride M/16) */
      if (sr)
        for (int l = 0; l < 16; l++)
          hq_nvfp4_sr_bits(q->seed, q->offset, 1, (uint64_t)((j0 + l) * (M / 16) + r0 / 16),
                           bits[l]);
      for (int l = 0; l < 16; l++) {
        const int64_t k = j0 + l;
        rowscale rs; /* global_scale = row: column k's amax, from pass 1 */
        if (cd->global == HQ_NVFP4_GLOBAL_ROW) rs = rowscale_of(cd->amax_out[k], cd->kind);
        cd->scale[hq_nvfp4_col_scale_index(r0, k, M, sw)] =
            encode_block(T + 16 * l, cd, cd->global == HQ_NVFP4_GLOBAL_ROW ? &rs : NULL,
                         sr ? bits[l] : NULL, cd->data + hq_nvfp4_col_data_index(r0, k, M));
      }
    }
  }
}

/* 16x16 tiles of the strip: one amax and one scale per tile. Both copies come from the same
   tile amax; when their global amaxes are equal (always, unless a caller hands two different
   ones), so are m and enc, and the columnwise codes are the rowwise codes transposed. */
static void strip_2d(const qjob *q, const float *S, int64_t ld, int64_t r0, qdir *rd, qdir *cd) {
  const int64_t M = q->M, K = q->K;
  const int sw = q->cfg->swizzle;
  const int share = rd && cd && hq_f32_bits(rd->amax) == hq_f32_bits(cd->amax);
  uint8_t codes[16][8]; /* rowwise bytes of the tile: codes[row][byte] */
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    float a = 0.0f;
    for (int e = 0; e < 16; e++) {
      float b = hq_nvfp4_amax(S + e * ld + k0, 16);
      a = b > a ? b : a;
    }
    uint8_t sf = 0;
    if (rd) {
      sf = hq_nvfp4_block_scale_k(a, rd->m, rd->kind);
      for (int e = 0; e < 16; e++) pack16(S + e * ld + k0, rd->enc[sf], NULL, codes[e]);
      for (int e = 0; e < 16; e++) {
        memcpy(rd->data + hq_nvfp4_row_data_index(r0 + e, k0, K), codes[e], 8);
        rd->scale[hq_nvfp4_row_scale_index(r0 + e, k0, K, sw)] = sf;
      }
    }
    if (cd) {
      if (!share) {
        sf = hq_nvfp4_block_scale_k(a, cd->m, cd->kind);
        for (int e = 0; e < 16; e++) pack16(S + e * ld + k0, cd->enc[sf], NULL, codes[e]);
      }
      for (int t = 0; t < 16; t++) {
        uint8_t col[8];
        const int sh = (t & 1) * 4;
        for (int b = 0; b < 8; b++)
          col[b] = (uint8_t)(((codes[2 * b][t >> 1] >> sh) & 0xfu) |
                             ((codes[2 * b + 1][t >> 1] >> sh) & 0xfu) << 4);
        memcpy(cd->data + hq_nvfp4_col_data_index(r0, k0 + t, M), col, 8);
        cd->scale[hq_nvfp4_col_scale_index(r0, k0 + t, M, sw)] = sf;
      }
    }
  }
}

static int check_src(const hq_host_api *host, const hq_tensor *t, const char *what) {
  if (!t || !t->data || (t->dtype != HQ_F32 && t->dtype != HQ_F16 && t->dtype != HQ_BF16))
    return host->error(HQ_EINVAL, "nvfp4: the %s tensor must be f32, f16 or bf16", what);
  return check_shape(host, t->rows, t->cols);
}

/* The global amaxes of the directions in dirs: a[0] = amax(x) (rowwise), a[1] = amax(x), or
   the amax of the transformed values with rht (columnwise); 0 for a direction not in dirs.
   S: the strip buffer (NULL for an empty tensor); cache: see rht_amax(). */
static void global_amaxes(const nvfp4_cfg *c, const hq_tensor *src, uint32_t dirs, float *S,
                          int64_t ld, uint16_t *cache, float a[2]) {
  const int col_rht = (dirs & HQ_COLWISE) && c->rht;
  float amax_x = 0.0f, amax_t = 0.0f;
  if (S && ((dirs & HQ_ROWWISE) || ((dirs & HQ_COLWISE) && !c->rht)))
    amax_x = input_amax(src, S, ld);
  if (S && col_rht) amax_t = rht_amax(src, c, S, ld, cache);
  a[0] = (dirs & HQ_ROWWISE) ? amax_x : 0.0f;
  a[1] = (dirs & HQ_COLWISE) ? (c->rht ? amax_t : amax_x) : 0.0f;
}

/* With global_scale = row or none no per-tensor amax enters the bytes (row: each stored row's
   own amax, computed by quantize(); a caller's call->amax is not used). */
static uint32_t amax_kind(const void *cfgp, uint32_t dir) {
  const nvfp4_cfg *c = cfgp;
  if (c->global != HQ_NVFP4_GLOBAL_TENSOR) return HQ_AMAX_NONE;
  if (dir == HQ_ROWWISE) return HQ_AMAX_INPUT;
  if (dir == HQ_COLWISE) return c->rht ? HQ_AMAX_OWN : HQ_AMAX_INPUT;
  return HQ_AMAX_NONE;
}

static int amax_op(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                   float *out) {
  const nvfp4_cfg *c = cfgp;
  const hq_host_api *h = call->host;
  if (!out) return h->error(HQ_EINVAL, "nvfp4: amax without an output");
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    int rc = check_src(h, src, "input");
    if (rc) return rc;
    if (c->global != HQ_NVFP4_GLOBAL_TENSOR) /* amax_kind NONE: 0 */
      return nvfp4_cuda_memset(call, out, 2 * sizeof(float));
    return nvfp4_cuda_amax(c, call, src, dirs & HQ_BOTH, out);
#else
    return h->error(HQ_ENOTSUP, "nvfp4: built without CUDA (CPU reference only); compute the "
                    "amax on a host context");
#endif
  }
  out[0] = out[1] = 0.0f;
  int rc = check_src(h, src, "input");
  if (rc || c->global != HQ_NVFP4_GLOBAL_TENSOR) return rc; /* amax_kind NONE: 0 */
  float *S = NULL;
  rc = scratch_take(c, call, src->rows, src->cols, &S, NULL);
  if (rc) return rc;
  global_amaxes(c, src, dirs & HQ_BOTH, S, strip_ld(src->cols), NULL, out);
  return HQ_OK;
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const nvfp4_cfg *c = cfgp;
  const hq_host_api *h = call->host;
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return h->error(HQ_ENOTSUP, "nvfp4: built without CUDA (CPU reference only); quantize on a "
                    "host context");
#endif
  int rc = check_src(h, src, "input");
  const int64_t M = src->rows, K = src->cols;
  if (!rc && (dirs & HQ_ROWWISE)) rc = check_storage(h, row, HQ_ROWWISE, M, K, NULL);
  if (!rc && (dirs & HQ_ROWWISE)) rc = check_made_here(h, c, row);
  if (!rc && (dirs & HQ_COLWISE)) rc = check_storage(h, col, HQ_COLWISE, M, K, NULL);
  if (!rc && (dirs & HQ_COLWISE)) rc = check_made_here(h, c, col);
  if (rc) return rc;
  if (!(dirs & HQ_BOTH)) return HQ_OK;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) {
    const int has_amax = c->global != HQ_NVFP4_GLOBAL_NONE;
    nvfp4_dev_dir dr, dc;
    if (dirs & HQ_ROWWISE) {
      dr.data = hq_storage_buf(row, NVFP4_DATA)->ptr;
      dr.scale = hq_storage_buf(row, NVFP4_SCALE_INV)->ptr;
      dr.amax = has_amax ? hq_storage_buf(row, NVFP4_AMAX)->ptr : NULL;
    }
    if (dirs & HQ_COLWISE) {
      dc.data = hq_storage_buf(col, NVFP4_DATA)->ptr;
      dc.scale = hq_storage_buf(col, NVFP4_SCALE_INV)->ptr;
      dc.amax = has_amax ? hq_storage_buf(col, NVFP4_AMAX)->ptr : NULL;
    }
    return nvfp4_cuda_quantize(c, call, src, (dirs & HQ_ROWWISE) ? &dr : NULL,
                               (dirs & HQ_COLWISE) ? &dc : NULL);
  }
#endif

  qjob q = {c, M, K, c->seed ? c->seed : call->seed, call->offset, NULL};
  const int64_t ld = strip_ld(K);
  float *S;
  uint32_t (*bits)[4];
  rc = scratch_take(c, call, M, K, &S, &bits);
  if (rc) return rc;
  /* pass 1: the global amaxes, unless the call brings them */
  float a[2] = {0.0f, 0.0f};
  uint16_t *cache = NULL; /* optional: without it the quantize pass transforms again */
  if (c->global != HQ_NVFP4_GLOBAL_TENSOR) {
    /* row: the rowwise amaxes come with the strips; the columnwise ones (one per column of x)
       need every row first */
    if (S && (dirs & HQ_COLWISE) && c->global == HQ_NVFP4_GLOBAL_ROW)
      column_amaxes(src, S, ld, hq_storage_buf(col, NVFP4_AMAX)->ptr);
  } else if (call->amax) {
    a[0] = (dirs & HQ_ROWWISE) ? call->amax[0] : 0.0f;
    a[1] = (dirs & HQ_COLWISE) ? call->amax[1] : 0.0f;
  } else {
    if (S && (dirs & HQ_COLWISE) && c->rht && !(call->flags & HQ_CALL_UPDATE))
      cache = h->alloc(call, (size_t)(M * K) * sizeof(uint16_t));
    global_amaxes(c, src, dirs, S, ld, cache, a);
    q.rht_cache = cache;
  }
  qdir rd, cd;
  if (dirs & HQ_ROWWISE) qdir_start(&rd, c, row, a[0]);
  if (dirs & HQ_COLWISE) qdir_start(&cd, c, col, a[1]);
  qdir *rp = (dirs & HQ_ROWWISE) ? &rd : NULL, *cp = (dirs & HQ_COLWISE) ? &cd : NULL;
  /* pass 2: 16-row strips */
  for (int64_t r0 = 0; S && r0 < M; r0 += 16) {
    load_rows(src, r0, 16, S, ld);
    if (c->block_2d) strip_2d(&q, S, ld, r0, rp, cp);
    else strip_1d(&q, S, ld, r0, rp, cp, bits);
  }
  if (rp && c->global == HQ_NVFP4_GLOBAL_TENSOR) *rp->amax_out = rp->amax;
  if (cp && c->global == HQ_NVFP4_GLOBAL_TENSOR) *cp->amax_out = cp->amax;
  if (cache) h->free(call, cache);
  return HQ_OK;
}

// --- CPU reference: dequantize -----------------------------------------------------------------

/* What dequantize needs from a storage's descriptor: the scale layout and the transform. Any
   descriptor an nvfp4 instance makes for that direction is accepted, nothing else. */
static int read_desc(const hq_host_api *h, const hq_storage *s, const nvfp4_mode *md,
                     int *swizzle, uint32_t *rht_mask, int *rht) {
  const hq_operand_desc *d = &s->desc;
  const int row = s->dir == HQ_ROWWISE;
  const char *dn = dir_name(s->dir);
  const uint32_t mode = opt_path(md->scale_kind, md->global) ? HQ_SCALE_OTHER
                                                             : HQ_SCALE_VEC16_UE4M3;
  if (d->elem != HQ_E2M1X2 || d->scale_mode != mode)
    return h->error(HQ_EINVAL, "nvfp4: the %s storage is not NVFP4 with its buffers' scales "
                    "(desc.elem = %d, desc.scale_mode = %u)", dn, (int)d->elem, d->scale_mode);
  if (d->order != (row ? HQ_ORDER_MK : HQ_ORDER_KM))
    return h->error(HQ_ENOTSUP, "nvfp4: a %s storage with desc.order = %u is not supported (the "
                    "%s copy is stored %s)", dn, d->order, dn, row ? "[M, K]" : "transposed");
  if (d->scale_layout == HQ_SCALE_LAYOUT_OUTER_MAJOR) *swizzle = 0;
  else if (d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED) *swizzle = 1;
  else
    return h->error(HQ_ENOTSUP, "nvfp4: desc.scale_layout = %u of the %s storage is not "
                    "supported (outer-major or swizzled)", d->scale_layout, dn);
  const int b1 = row ? d->block_m == 1 && d->block_k == 16 : d->block_m == 16 && d->block_k == 1;
  if (!b1 && !(d->block_m == 16 && d->block_k == 16))
    return h->error(HQ_ENOTSUP, "nvfp4: a %dx%d block in the %s storage is not supported",
                    (int)d->block_m, (int)d->block_k, dn);
  *rht = 0;
  *rht_mask = 0;
  if (d->transform == HQ_TRANSFORM_RHT16 && !row && d->transform_param <= 0xffffu) {
    *rht = 1;
    *rht_mask = (uint32_t)d->transform_param;
  } else if (d->transform != HQ_TRANSFORM_NONE) {
    return h->error(HQ_ENOTSUP, "nvfp4: desc.transform = %u (parameter %#llx) of the %s storage "
                    "is not supported (RHT16 of the columnwise copy, 16-bit sign mask)",
                    d->transform, (unsigned long long)d->transform_param, dn);
  }
  return HQ_OK;
}

/* What dequantize, tensor_factor and the GEMM read of a stored operand: s must be an nvfp4
   storage of its own direction for [M, K] with a descriptor an nvfp4 instance makes; `what`
   names the caller or the operand in the error. */
typedef struct nvfp4_view {
  nvfp4_mode md;
  int swizzle, rht;
  uint32_t mask;
} nvfp4_view;

static int read_storage(const hq_host_api *h, const hq_storage *s, int64_t M, int64_t K,
                        const char *what, nvfp4_view *v) {
  const uint32_t dir = s ? s->dir : 0;
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return h->error(HQ_EINVAL, "nvfp4: %s: a storage without a direction", what);
  *v = (nvfp4_view){.swizzle = 0};
  int rc = check_storage(h, s, dir, M, K, &v->md);
  return rc ? rc : read_desc(h, s, &v->md, &v->swizzle, &v->mask, &v->rht);
}

/* The checks of a dequantize of s into dst and what it then does, as the device kernels take
   it (*d, *md). */
static int deq_job(const hq_call *call, const hq_storage *s, hq_tensor *dst, nvfp4_deq *d,
                   nvfp4_mode *md) {
  const hq_host_api *h = call->host;
#ifndef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST)
    return h->error(HQ_ENOTSUP, "nvfp4: built without CUDA (CPU reference only); dequantize on a "
                    "host context");
#endif
  int rc = check_src(h, dst, "output");
  if (rc) return rc;
  const int64_t M = dst->rows, K = dst->cols;
  nvfp4_view v;
  rc = read_storage(h, s, M, K, "dequantize", &v);
  if (rc) return rc;
  *md = v.md;
  const uint32_t dir = s->dir;
  /* raw (HQ_CALL_DEQ_RAW): e2m1 * sf, without the global amax and, for an RHT copy, left in
     the transformed domain (no inverse transform) */
  const int raw = (call->flags & HQ_CALL_DEQ_RAW) != 0;
  /* ABI 2.6 (HQ_CAP_DEQ_ROW_FACTOR): a row-scaled storage's raw values split into e2m1 * sf
     (those of global_scale = none, BF16-exact) and each stored row's factor
     hq_nvfp4_tensor_factor_k(amax[r]) */
  float *rfout = md->global == HQ_NVFP4_GLOBAL_ROW ? hq_call_row_factor_out(call) : NULL;
  const float *amax =
      md->global == HQ_NVFP4_GLOBAL_NONE ? NULL : hq_storage_cbuf(s, NVFP4_AMAX)->ptr;
  *d = (nvfp4_deq){.q = hq_storage_cbuf(s, NVFP4_DATA)->ptr,
                   .scale = hq_storage_cbuf(s, NVFP4_SCALE_INV)->ptr,
                   .amax = rfout ? NULL : amax,
                   .kind = md->scale_kind,
                   .global = rfout ? HQ_NVFP4_GLOBAL_NONE : md->global,
                   .colwise = dir == HQ_COLWISE,
                   .swizzle = v.swizzle,
                   .rht = raw ? 0 : v.rht,
                   .raw = raw,
                   .mask = v.mask,
                   .dst = dst,
                   /* ABI 2.3 (HQ_CAP_DEQ_FACTOR): with a raw dequantize, the factor times the
                      chain's value */
                   .fout = hq_call_factor_out(call),
                   .fin = call->factor_in,
                   .fmul = call->factor_mul,
                   .rf_amax = amax,
                   .rfout = rfout,
                   .rf_n = dir == HQ_ROWWISE ? M : K};
  return HQ_OK;
}

static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp; /* the storage describes itself: it may come from another nvfp4 instance */
  nvfp4_deq d = {0};
  nvfp4_mode md = {0};
  int rc = deq_job(call, s, dst, &d, &md);
  if (rc) return rc;
#ifdef HQ_HAVE_CUDA
  if (call->device != HQ_DEVICE_HOST) return nvfp4_cuda_dequantize(call, &d);
#endif
  const int64_t M = dst->rows, K = dst->cols;
  const int sw = d.swizzle, kind = md.scale_kind;
  const int per_row = md.global == HQ_NVFP4_GLOBAL_ROW && !d.rfout;
  /* the storage's amax buffer (deq_job's rf_amax) -- tensor: the direction's amax; row: one
     per stored row (amaxes[r]); none: NULL, the decode multiplier is fp32(sf), raw or not */
  const float *amaxes = d.rf_amax;
  const float amax = md.global == HQ_NVFP4_GLOBAL_TENSOR ? amaxes[0] : 0.0f;
  for (int64_t r = 0; d.rfout && r < d.rf_n; r++)
    d.rfout[r] = hq_nvfp4_tensor_factor_k(amaxes[r], kind);
  if (d.fout)
    *d.fout = hq_mul_rn(d.fin ? *d.fin : d.fmul,
                        md.global == HQ_NVFP4_GLOBAL_TENSOR ? hq_nvfp4_tensor_factor_k(amax, kind)
                                                            : 1.0f);
  const int t = dst->dtype;
  /* the multiplier of each scale code for a tensor-wide amax (per_row: per stored row r, made
     by row_decode); raw values keep the per-row factor (they are a row-scaled storage's
     operand: the emulated GEMM multiplies them as they are, in F32) unless it was split off
     (rfout) */
  float dec[256];
  if (!per_row)
    for (int v = 0; v < 256; v++)
      dec[v] = d.raw || !amaxes ? hq_nvfp4_raw_mult_k((uint8_t)v, kind)
                                : hq_nvfp4_decode_mult_k((uint8_t)v, amax, kind);
  if (s->dir == HQ_ROWWISE) {
    for (int64_t i = 0; i < M; i++) {
      if (per_row)
        for (int v = 0; v < 256; v++) dec[v] = hq_nvfp4_decode_mult_k((uint8_t)v, amaxes[i], kind);
      for (int64_t k = 0; k < K; k += 16) {
        const float dm = dec[d.scale[hq_nvfp4_row_scale_index(i, k, K, sw)]];
        const uint8_t *p = d.q + hq_nvfp4_row_data_index(i, k, K);
        for (int e = 0; e < 16; e++)
          hq_store_hp(dst->data, i * K + k + e, t,
                      hq_nvfp4_dequantize((uint32_t)(p[e >> 1] >> ((e & 1) * 4)) & 0xfu, dm));
      }
    }
  } else {
    /* stored row k holds column k of the output; 16 output rows advance together. An RHT copy
       is transformed back with the signs its descriptor names. */
    for (int64_t i0 = 0; i0 < M; i0 += 16) {
      for (int64_t k = 0; k < K; k++) {
        const uint8_t sk = d.scale[hq_nvfp4_col_scale_index(i0, k, M, sw)];
        const float dm = per_row ? hq_nvfp4_decode_mult_k(sk, amaxes[k], kind) : dec[sk];
        const uint8_t *p = d.q + hq_nvfp4_col_data_index(i0, k, M);
        float g[16];
        for (int e = 0; e < 16; e++)
          g[e] = hq_nvfp4_dequantize((uint32_t)(p[e >> 1] >> ((e & 1) * 4)) & 0xfu, dm);
        if (d.rht) hq_nvfp4_rht16_inverse(g, d.mask);
        for (int e = 0; e < 16; e++) hq_store_hp(dst->data, (i0 + e) * K + k, t, g[e]);
      }
    }
  }
  return HQ_OK;
}

/* ABI 2.6: an emulated GEMM's two raw dequantizes as one launch (nvfp4_cuda_dequantize_pair).
   On the host, and for a pair the kernel does not take, HQ_ENOTSUP: the core makes the two
   calls. */
static int dequantize_pair(const void *cfg, const hq_call *call, const hq_storage *s,
                           hq_tensor *dst, const void *cfg_b, const hq_call *call_b,
                           const hq_storage *s_b, hq_tensor *dst_b) {
  (void)cfg; /* the storages describe themselves */
  (void)cfg_b;
#ifdef HQ_HAVE_CUDA
  if (call->device == HQ_DEVICE_HOST) return HQ_ENOTSUP; /* both calls share device and stream */
  nvfp4_deq a, b;
  nvfp4_mode ma, mb;
  int rc = deq_job(call, s, dst, &a, &ma);
  if (!rc) rc = deq_job(call_b, s_b, dst_b, &b, &mb);
  return rc ? rc : nvfp4_cuda_dequantize_pair(call, &a, &b);
#else
  (void)call, (void)s, (void)dst, (void)call_b, (void)s_b, (void)dst_b;
  return HQ_ENOTSUP;
#endif
}

// --- ABI 2.1: the per-tensor factor and the native GEMM ------------------------------------

/* The storage's per-tensor factor, hq_nvfp4_tensor_factor(A) = RN(A * RN(1/2688)) of its amax
   buffer: the global decode scale that multiplies every raw value. On a device it is written by
   one thread on call->stream into device memory. */
static int tensor_factor(const void *cfgp, const hq_call *call, const hq_storage *s, float *out) {
  (void)cfgp;
  const hq_host_api *h = call->host;
  if (!out) return h->error(HQ_EINVAL, "nvfp4: tensor_factor without an output");
  nvfp4_view v;
  int rc = read_storage(h, s, s ? s->rows : 0, s ? s->cols : 0, "tensor_factor", &v);
  if (rc) return rc;
  const nvfp4_mode md = v.md;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return nvfp4_cuda_tensor_factor(
        call, md.global == HQ_NVFP4_GLOBAL_NONE ? NULL : hq_storage_cbuf(s, NVFP4_AMAX)->ptr,
        md.scale_kind, md.global, out);
#else
    return h->error(HQ_ENOTSUP, "nvfp4: built without CUDA (CPU reference only); tensor_factor "
                    "on a host context");
#endif
  }
  /* row: each raw value carries its row's factor already; none: there is no global scale */
  *out = md.global == HQ_NVFP4_GLOBAL_TENSOR
             ? hq_nvfp4_tensor_factor_k(*(const float *)hq_storage_cbuf(s, NVFP4_AMAX)->ptr,
                                        md.scale_kind)
             : 1.0f;
  return HQ_OK;
}

/* Problems up to this many multiply-adds (m * n * k) take the module's own kernel: there the
   emulated path's two launches (the dequantize of both operands, then cuBLASLt's BF16 GEMM) are
   mostly latency; larger ones are faster on that path, whose GEMM runs at the BF16 rate and
   decodes each element once (the kernel decodes an operand once per tile of the other). */
#ifndef HQ_NVFP4_GEMM_MAX_MNK
#define HQ_NVFP4_GEMM_MAX_MNK (1ll << 25)
#endif
/* the kernel addresses an operand's codes with 32-bit offsets (m * k / 2 bytes at most) */
_Static_assert(HQ_NVFP4_GEMM_MAX_MNK <= (1ll << 31), "HQ_NVFP4_GEMM_MAX_MNK above 2^31");

#ifdef HQ_HAVE_CUDA
/* One operand of the module's GEMM: s a k-contiguous storage of `outer` rows of k. HQ_ENOTSUP,
   without a message (gemm_op), for one the kernel does not take. */
static int gemm_operand(const hq_host_api *h, const hq_storage *s, const char *which,
                        int64_t outer, int64_t k, nvfp4_gemm_operand *o) {
  nvfp4_view v;
  int rc = read_storage(h, s, s ? s->rows : 0, s ? s->cols : 0, which, &v);
  if (rc) return rc;
  const nvfp4_mode md = v.md;
  const uint32_t dir = s->dir;
  /* the stored matrix: [rows, cols] rowwise, [cols, rows] columnwise (transposed), with a
     global amax per stored row when row-scaled; the codes are read 8 bytes at a time */
  const int64_t R = dir == HQ_ROWWISE ? s->rows : s->cols;
  const int64_t C = dir == HQ_ROWWISE ? s->cols : s->rows;
  const hq_buffer *d = hq_storage_cbuf(s, NVFP4_DATA);
  if (R != outer || C != k || C % 16 || ((uintptr_t)d->ptr & 7u)) return HQ_ENOTSUP;
  o->q = d->ptr;
  o->scale = hq_storage_cbuf(s, NVFP4_SCALE_INV)->ptr;
  o->amax = md.global == HQ_NVFP4_GLOBAL_NONE ? NULL : hq_storage_cbuf(s, NVFP4_AMAX)->ptr;
  o->kind = md.scale_kind;
  o->swizzle = v.swizzle;
  o->row = md.global == HQ_NVFP4_GLOBAL_ROW;
  return HQ_OK;
}
#endif

/* The module's own GEMM (ABI 2.1's gemm op): on Hopper (compute capability 9.x, no FP4 tensor
   cores; the build has its code for sm_90 and Blackwell alone) a small problem's emulated product
   in one kernel (nvfp4_gemm.cu), in place of the emulated path's dequantize and cuBLASLt GEMM --
   the same raw values in BF16, FP32 accumulation, the per-tensor factors folded into alpha and a
   row-scaled operand's row factors multiplying the product in the same order, so the result
   equals that path's up to the order of accumulation. It reports the product as emulated in BF16
   (2.6's emul_out). Everything else is declined without a message -- the host, Blackwell
   (cuBLASLt multiplies NVFP4 natively), problems above HQ_NVFP4_GEMM_MAX_MNK, a core too old to
   be told the product is emulated -- and takes the core's paths, whose providers say why it is
   not native: the kernel is a faster emulated path, not a native one, so its declines are no
   such reason. */
static int gemm_op(const void *cfgp, const hq_call *call, const hq_gemm_problem *p) {
  (void)cfgp; /* the storages describe themselves */
  hq_dtype *emul = hq_gemm_problem_emul_out(p);
  if (call->device == HQ_DEVICE_HOST || !emul) return HQ_ENOTSUP;
#ifndef HQ_HAVE_CUDA
  return HQ_ENOTSUP;
#else
  /* no bound on k of its own: m * n * k <= HQ_NVFP4_GEMM_MAX_MNK bounds it */
  if (!hq_small_gemm_fits(call, p, HQ_NVFP4_GEMM_MAX_MNK, HQ_NVFP4_GEMM_MAX_MNK, NVFP4_GEMM_TILE))
    return HQ_ENOTSUP;
  const hq_host_api *h = call->host;
  nvfp4_gemm_operand a, b;
  int rc = gemm_operand(h, p->a, "the GEMM's operand A", p->m, p->k, &a);
  if (!rc) rc = gemm_operand(h, p->b, "the GEMM's operand B", p->n, p->k, &b);
  if (rc) return rc;
  *emul = HQ_BF16;
  return p->flags & HQ_GEMM_QUERY ? HQ_OK : nvfp4_cuda_gemm(call, p, &a, &b);
#endif
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 1, /* requires ABI 2.1: DEQ_RAW, emul_dtype, host->lt_matmul */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(nvfp4_cfg),
    .name = "nvfp4",
    .version = PACKAGE_VERSION,
    .description = "NVFP4: E2M1 in 16-blocks, E4M3 block scales, FP32 amax; RHT, SR, 2-D, swizzle",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA | HQ_CAP_RNG_DEV
#endif
    ,
    .options = options,
    .configure = configure,
    .instance_caps = instance_caps,
    .layout = layout,
    .scratch_size = scratch_size,
    .make_empty = make_empty,
    .amax_kind = amax_kind,
    .amax = amax_op,
    .quantize = quantize,
    .update = NULL, /* the core calls quantize() with HQ_CALL_UPDATE */
    .dequantize = dequantize,
    .tensor_factor = tensor_factor,
    .gemm = gemm_op,
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
    .dequantize_pair = dequantize_pair,
};

HQ_FORMAT_DEFINE(ops);
