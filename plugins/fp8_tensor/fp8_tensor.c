/*
** fp8_tensor.c -- per-tensor FP8 (E4M3 / E5M2) with current or delayed scaling: the plugin ABI
** (requires 2.1), the CPU reference (docs/formats.md) and the native cuBLASLt GEMM.
**
** Quantize: amax = max|x| (NaN ignored, Inf counts); scale = RN(max_fp8 / amax) with TE's edge
** cases (hq_scale_from_amax, plugins/common/fp8_scale.h); scale_inv = RN(1/scale);
** q = fp8_satfinite(RN(x * scale)). The rowwise copy is [M, K]; the columnwise copy is its exact
** byte transpose [K, M] (the layout TN-only GEMMs need), made from the same read and the same
** scale. A columnwise-only quantize is supported (TE has none on Hopper).
**
** Per-tensor amax (current scaling: amax_kind INPUT for both directions): amax() computes
** max|x| for each requested direction. quantize() with call->amax uses amax[0] (rowwise) / amax[1]
** (columnwise) instead of reading the input for it; a call making both directions uses one
** scale for both, from max(amax[0], amax[1]) (fp8t_one_amax; equal values from amax()). Given
** the amax quantize() itself would compute, the bytes are identical. No scratch is needed
** (scratch_size 0): on a device the amax pass accumulates in the storage's own amax buffer.
** update() is quantize() (no allocation, no synchronization on either device).
**
** Storages (buffer order = save order; every M of a shard works, shard_rows 1):
**   rowwise     0 "data"             DATA  elem [M, K]  gather ROWS, m_div 1
**               1 "scale_inv"        SCALE f32  [1]     gather SAME
**               2 "amax"             AMAX  f32  [1]     gather SAME (the amax the scale came from)
**               desc: elem = dtype, order MK, scale_mode TENSOR_F32, scale_layout NONE, block
**                     0x0, transform NONE, shard_rows 1
**   columnwise  0 "columnwise_data"  DATA  elem [K, M]  gather COLS, m_div 1
**               1 "scale_inv"        SCALE f32  [1]     gather SAME, shared with rowwise buffer 1
**               2 "amax"             AMAX  f32  [1]     gather SAME, shared with rowwise buffer 2
**                 (made without a rowwise storage: own "columnwise_scale_inv", "columnwise_amax")
**               desc: as rowwise but order KM
**   both:       desc.emul_dtype = BF16 (the raw values below are exact in BF16)
** meta is unused (zero): dequantize() reads the element dtype from desc.elem and the order from
** desc.order, so it accepts a storage of any fp8_tensor instance.
**
** GEMMs (ABI 2.1):
**   raw values   dequantize() with HQ_CALL_DEQ_RAW writes the FP8 element values themselves
**                (fp8t_raw: no scale_inv; a NaN code gives NaN), on the host and on CUDA, into
**                f32, f16 or bf16. They are exact in BF16 (at most 4 significant bits, exponents
**                2^-16 .. 2^15, Inf and NaN exist there): desc.emul_dtype = BF16.
**   factor       tensor_factor() gives the storage's scale_inv (a copy on call->stream on CUDA).
**                dequantize = RN_f32(raw * scale_inv), the same single multiply, so for every
**                element RN_f32(raw * factor) equals the normal dequantize into f32, bit for bit
**                (NaN stays NaN).
**   folded       (ABI 2.3, HQ_CAP_DEQ_FACTOR) a raw dequantize with hq_call_factor_out(call)
**                also writes RN_f32(m * scale_inv) there, m = *call->factor_in or
**                call->factor_mul: on the host at once, on CUDA from the dequantize kernel's
**                first thread (a one-thread kernel when the storage has no elements), so the
**                emulated GEMM runs no kernel of its own for the operand's factor.
**   native gemm  none of its own: its descriptors (per-tensor FP8, SCALAR_32F scale_inv, data
**                k-contiguous in both directions) are what gemm/cublaslt's provider multiplies
**                natively.
**
** Delayed scaling (scaling = delayed; docs/formats.md 3.5; the rules in fp8_tensor_rules.h):
**   state        one slice per quantizer (plugin.h, "State"): the core's amax (history row 0)
**                and amax_history_len floats, [scale, history rows 1 .. L-1]; scale starts at 1.
**   quantize     scale = state[0] as it stands (computed from earlier steps' amaxes), scale_inv =
**                RN(1/scale), the same cast as current scaling; the tensor's amax (max|x|, NaN
**                ignored) goes to the storage's amax buffer and is max-accumulated into the
**                slice's amax. The caller's amax (call->amax) is ignored: amax_kind is NONE, the
**                bytes depend on the state only. On CUDA there is no amax pass: the cast kernel
**                accumulates the amax. Not REQUANT_SAFE (the scale moves between steps).
**   update_state roll + scale update of a whole group of slices (one kernel on CUDA).
**   Any direction, alone or as one half of a hybrid, may use it; the storages are the same as
**   with current scaling, so dequantize and GEMMs do not know the difference.
**
** Options: dtype (e4m3|e5m2), power_2_scales, amax_epsilon (current scaling); scaling
** (current|delayed), amax_history_len (1..1024, default 1024 as upstream), amax_compute_algo
** (max|most_recent), margin (0..126) (delayed scaling). An option of the other mode set to
** anything but its default is refused, naming it.
*/
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION: a stock module reports the package version */
#include "hq/numerics.h"
#include "hq/plugin.h"
#include "fp8_scale.h"
#include "fp8_tensor.h"
#include "fp8_tensor_rules.h"

enum { OPT_DTYPE, OPT_POW2, OPT_EPS, OPT_SCALING, OPT_HISTORY, OPT_ALGO, OPT_MARGIN };

static const hq_option options[] = {
    [OPT_DTYPE] = {"dtype", HQ_OPT_ENUM, "e4m3", "FP8 element type (max 448 / 57344)", "e4m3|e5m2",
                   0, -1},
    [OPT_POW2] = {"power_2_scales", HQ_OPT_BOOL, "false", "round the scale down to a power of two",
                  NULL, 0, -1},
    [OPT_EPS] = {"amax_epsilon", HQ_OPT_FLOAT, "0",
                 "floor applied to amax before the scale is computed", NULL, 0, 3.4e38},
    [OPT_SCALING] = {"scaling", HQ_OPT_ENUM, "current",
                     "current: scale from this tensor's amax; delayed: from an amax history "
                     "(needs an hq_state)", "current|delayed", 0, -1},
    [OPT_HISTORY] = {"amax_history_len", HQ_OPT_INT, "1024",
                     "delayed: steps of amax history the scale is computed from", NULL, 1,
                     FP8T_HISTORY_MAX},
    [OPT_ALGO] = {"amax_compute_algo", HQ_OPT_ENUM, "max",
                  "delayed: the amax the scale uses (history max, or the latest step's)",
                  "max|most_recent", 0, -1},
    [OPT_MARGIN] = {"margin", HQ_OPT_INT, "0",
                    "delayed: scale = (max_fp8 / 2^margin) / amax", NULL, 0, 126},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  fp8t_cfg *c = cfgp;
  c->elem = v[OPT_DTYPE].i ? HQ_E5M2 : HQ_E4M3;
  c->pow2 = (int)v[OPT_POW2].i;
  c->epsilon = (float)v[OPT_EPS].f;
  c->delayed = v[OPT_SCALING].i == 1;
  c->history_len = (int)v[OPT_HISTORY].i;
  c->most_recent = v[OPT_ALGO].i == 1;
  c->margin = (int)v[OPT_MARGIN].i;
  if (c->delayed && c->pow2)
    return host->error(HQ_EINVAL, "fp8_tensor: power_2_scales applies to scaling = current only "
                       "(delayed scaling has no power-of-two option)");
  if (c->delayed && c->epsilon != 0.0f)
    return host->error(HQ_EINVAL, "fp8_tensor: amax_epsilon applies to scaling = current only "
                       "(delayed scaling has no epsilon)");
  if (!c->delayed) {
    const char *set = c->history_len != 1024 ? "amax_history_len"
                      : c->most_recent       ? "amax_compute_algo"
                      : c->margin            ? "margin"
                                             : NULL;
    if (set)
      return host->error(HQ_EINVAL, "fp8_tensor: %s applies to scaling = delayed only (this "
                         "instance has scaling = current)", set);
  }
  return HQ_OK;
}

/* A delayed-scaling instance is not requantization-safe: its scale moves between steps. It takes
   the fused optimizer step on a GPU (its scale comes from the state, not from the new master, so
   the cast reads each element once). Every instance writes a plain BF16 / F16 copy of an F32
   source beside its codes (ABI 2.6 copy_out): a hybrid with a high-precision other direction
   then reads the source once. */
static uint64_t instance_caps(const void *cfgp) {
  const fp8t_cfg *c = cfgp;
  uint64_t caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR | HQ_CAP_COPY_OUT |
                  (c->delayed ? 0 : HQ_CAP_REQUANT_SAFE);
#ifdef HQ_HAVE_CUDA
  caps |= HQ_CAP_CUDA | (c->delayed ? HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV : 0);
#endif
  return caps;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const fp8t_cfg *c = cfgp;
  (void)host;
  hq_operand_desc *d = &out->desc;
  d->elem = c->elem;
  d->order = dir == HQ_COLWISE ? HQ_ORDER_KM : HQ_ORDER_MK;
  d->scale_mode = HQ_SCALE_TENSOR_F32;
  d->scale_layout = HQ_SCALE_LAYOUT_NONE;
  d->block_m = 0;
  d->block_k = 0;
  d->transform = HQ_TRANSFORM_NONE;
  d->transform_param = 0;
  d->shard_rows = 1;
  d->emul_dtype = HQ_BF16; /* fp8t_raw values: at most 4 significant bits, within BF16's range */
  if (dir == HQ_COLWISE) {
    hq_buffer_gather(hq_buffer_describe(out, FP8T_DATA, "columnwise_data", HQ_ROLE_DATA, c->elem,
                                        2, cols, rows),
                     HQ_GATHER_COLS, 1);
    const int shared = (dirs & HQ_ROWWISE) != 0;
    hq_buffer *s = hq_buffer_describe(out, FP8T_SCALE_INV,
                                      shared ? "scale_inv" : "columnwise_scale_inv",
                                      HQ_ROLE_SCALE, HQ_F32, 1, 1, 0);
    hq_buffer *a = hq_buffer_describe(out, FP8T_AMAX, shared ? "amax" : "columnwise_amax",
                                      HQ_ROLE_AMAX, HQ_F32, 1, 1, 0);
    hq_buffer_gather(s, HQ_GATHER_SAME, 1);
    hq_buffer_gather(a, HQ_GATHER_SAME, 1);
    if (shared) {
      hq_buffer_share(s, FP8T_SCALE_INV);
      hq_buffer_share(a, FP8T_AMAX);
    }
  } else {
    hq_buffer_gather(hq_buffer_describe(out, FP8T_DATA, "data", HQ_ROLE_DATA, c->elem, 2, rows,
                                        cols),
                     HQ_GATHER_ROWS, 1);
    hq_buffer_gather(hq_buffer_describe(out, FP8T_SCALE_INV, "scale_inv", HQ_ROLE_SCALE, HQ_F32,
                                        1, 1, 0),
                     HQ_GATHER_SAME, 1);
    hq_buffer_gather(hq_buffer_describe(out, FP8T_AMAX, "amax", HQ_ROLE_AMAX, HQ_F32, 1, 1, 0),
                     HQ_GATHER_SAME, 1);
  }
  return HQ_OK;
}

/* No scratch: the CPU path works in stack tiles, the CUDA path accumulates its amax in the
   storage's amax buffer. */
static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)cfgp;
  (void)rows;
  (void)cols;
  (void)dirs;
  (void)device;
  return 0;
}

/* Current scaling: both directions depend on the input's amax (a producer's max|x| fits).
   Delayed scaling: none (the scale comes from the state). */
static uint32_t amax_kind(const void *cfgp, uint32_t dir) {
  const fp8t_cfg *c = cfgp;
  if (c->delayed) return HQ_AMAX_NONE;
  return dir == HQ_ROWWISE || dir == HQ_COLWISE ? HQ_AMAX_INPUT : HQ_AMAX_NONE;
}

// --- delayed-scaling state ------------------------------------------------------------------

static uint32_t state_floats(const void *cfgp, uint32_t dirs) {
  const fp8t_cfg *c = cfgp;
  (void)dirs;
  return c->delayed ? fp8t_state_floats(c->history_len) : 0;
}

static void init_state(const void *cfgp, uint32_t dirs, float *state) {
  const fp8t_cfg *c = cfgp;
  (void)dirs;
  if (c->delayed) fp8t_state_init(state, c->history_len);
}

static int update_state(const void *cfgp, const hq_call *call, uint32_t dirs, int64_t n,
                        float *amax, float *state) {
  const fp8t_cfg *c = cfgp;
  (void)dirs;
  if (!c->delayed)
    return call->host->error(HQ_EINVAL, "fp8_tensor: update_state of an instance with scaling "
                             "= current (it keeps no state)");
  if (n < 0 || (n > 0 && (!amax || !state)))
    return call->host->error(HQ_EINVAL, "fp8_tensor: update_state of %lld slices without their "
                             "memory", (long long)n);
  const float scaled_max = fp8t_scaled_max(c->elem, c->margin);
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_update_state(call, n, amax, state, c->history_len, c->most_recent,
                                  scaled_max);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  for (int64_t i = 0; i < n; i++)
    fp8t_delayed_update(amax + i, state + i * c->history_len, c->history_len, c->most_recent,
                        scaled_max);
  return HQ_OK;
}

/* The slice of a delayed-scaling quantize, or HQ_ESTATE (the core refuses first, naming the
   role; this guards direct calls). */
static int delayed_slice(const hq_call *call, const float **scale, float **acc) {
  if (call->struct_size < HQ_CALL_SIZE_2_1 || !call->state || !call->state_amax)
    return call->host->error(HQ_ESTATE, "fp8_tensor: scaling = delayed needs the quantizer's "
                             "scaling state (bind the quantizer to an hq_state)");
  *scale = call->state;
  *acc = call->state_amax;
  return HQ_OK;
}

static int check_src(const hq_call *call, const hq_tensor *src) {
  if (src->dtype != HQ_F32 && src->dtype != HQ_F16 && src->dtype != HQ_BF16)
    return call->host->error(HQ_EINVAL, "fp8_tensor: source dtype %d is not f32, f16 or bf16",
                             (int)src->dtype);
  if (src->device != call->device)
    return call->host->error(HQ_EINVAL, "fp8_tensor: source on device %d, call on device %d",
                             (int)src->device, (int)call->device);
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

/* q[c] = fp8(RN(x[c] * scale)), the element dtype chosen once per row so the loop vectorizes. */
static void cast_row(hq_dtype elem, const float *x, float scale, int n, uint8_t *q) {
  if (elem == HQ_E5M2)
    for (int c = 0; c < n; c++) q[c] = hq_f32_to_e5m2(hq_mul_rn(x[c], scale));
  else
    for (int c = 0; c < n; c++) q[c] = hq_f32_to_e4m3(hq_mul_rn(x[c], scale));
}

/* Quantize with one scale into row [M,K] and/or col [K,M], 64x64 tiles: each tile is read once,
   cast row by row, its bytes written to the rowwise copy and, transposed through the tile, to
   the columnwise copy; with copy (an F32 source), each element also stored in copy_dt there
   [M,K] (hq_store_hp: the host's convert rule). */
static void cast_transpose(const hq_tensor *src, float scale, hq_dtype elem, uint8_t *row,
                           uint8_t *col, void *copy, int copy_dt) {
  const int64_t M = src->rows, K = src->cols;
  float x[TILE * TILE];
  uint8_t q[TILE * TILE];
  for (int64_t i0 = 0; i0 < M; i0 += TILE) {
    const int nr = (int)(M - i0 < TILE ? M - i0 : TILE);
    for (int64_t j0 = 0; j0 < K; j0 += TILE) {
      const int nc = (int)(K - j0 < TILE ? K - j0 : TILE);
      load_tile(src, i0, j0, nr, nc, x);
      for (int r = 0; r < nr; r++) {
        cast_row(elem, x + r * TILE, scale, nc, q + r * TILE);
        if (row) memcpy(row + (i0 + r) * K + j0, q + r * TILE, (size_t)nc);
        if (copy)
          for (int c = 0; c < nc; c++)
            hq_store_hp(copy, (i0 + r) * K + j0 + c, copy_dt, x[r * TILE + c]);
      }
      if (col)
        for (int c = 0; c < nc; c++) {
          uint8_t *o = col + (j0 + c) * M + i0;
          for (int r = 0; r < nr; r++) o[r] = q[r * TILE + c];
        }
    }
  }
}

static int amax(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                float *out) {
  (void)cfgp;
  int rc = check_src(call, src);
  if (rc) return rc;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_amax(call, src, dirs, out);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  const float a = (dirs & HQ_BOTH) ? amax_of(src) : 0.0f;
  out[0] = (dirs & HQ_ROWWISE) ? a : 0.0f;
  out[1] = (dirs & HQ_COLWISE) ? a : 0.0f;
  return HQ_OK;
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const fp8t_cfg *c = cfgp;
  int rc = check_src(call, src);
  if (rc) return rc;
  if (!(dirs & HQ_BOTH) || ((dirs & HQ_ROWWISE) && !row) || ((dirs & HQ_COLWISE) && !col))
    return call->host->error(HQ_EINVAL, "fp8_tensor: quantize of directions %u without their "
                             "storages", dirs);
  dirs &= HQ_BOTH;
  uint8_t *rd = NULL, *cd = NULL;
  float *rs = NULL, *ra = NULL, *cs = NULL, *ca = NULL;
  if (dirs & HQ_ROWWISE) {
    rd = hq_storage_buf(row, FP8T_DATA)->ptr;
    rs = hq_storage_buf(row, FP8T_SCALE_INV)->ptr;
    ra = hq_storage_buf(row, FP8T_AMAX)->ptr;
  }
  if (dirs & HQ_COLWISE) {
    cd = hq_storage_buf(col, FP8T_DATA)->ptr;
    cs = hq_storage_buf(col, FP8T_SCALE_INV)->ptr;
    ca = hq_storage_buf(col, FP8T_AMAX)->ptr;
  }
  /* the fused optimizer write-back (ABI 2.2): delayed scaling only, where the scale does not
     depend on the new master */
  int adam_ok;
  const hq_adam_pass *adam = hq_call_adam(call, src, &adam_ok);
  if (!adam_ok || (adam && !c->delayed))
    return call->host->error(HQ_EINVAL, "fp8_tensor: the fused optimizer step comes with an "
                             "update of an f32 master on a CUDA device (gradient f32, f16 or "
                             "bf16), with scaling = delayed");
  /* ABI 2.6: the other direction's plain copy, from this call's read of src */
  int32_t copy_dt;
  void *copy = hq_call_copy_out(call, &copy_dt);
  if (copy && (src->dtype != HQ_F32 || (copy_dt != HQ_BF16 && copy_dt != HQ_F16) || adam))
    return call->host->error(HQ_EINVAL, "fp8_tensor: copy_out takes an f32 source into bf16 or "
                             "f16 without the fused optimizer step (source dtype %d, copy "
                             "dtype %d)", (int)src->dtype, (int)copy_dt);
  const float *state = NULL;
  float *state_amax = NULL;
  if (c->delayed && (rc = delayed_slice(call, &state, &state_amax))) return rc;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_quantize(c, call, src, c->delayed ? NULL : call->amax, rd, cd, rs, ra, cs,
                              ca, state, state_amax, adam, copy, copy_dt);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  const float amax = call->amax && !c->delayed ? fp8t_one_amax(dirs, call->amax) : amax_of(src);
  float scale = c->delayed ? state[0]
                           : hq_scale_from_amax(amax, hq_fp8_max(c->elem), c->pow2, c->epsilon,
                                                FLT_MAX);
  float scale_inv = hq_rcp_rn(scale);
  if (state_amax)
    *state_amax = hq_bits_f32(fp8t_amax_accumulate(hq_f32_bits(*state_amax), amax));
  cast_transpose(src, scale, c->elem, rd, cd, copy, copy_dt);
  if (rs) *rs = scale_inv, *ra = amax;
  if (cs) *cs = scale_inv, *ca = amax;
  return HQ_OK;
}

/* A per-tensor FP8 storage, as any fp8_tensor instance describes one: the element dtype and the
   order come from s->desc, the data and scale_inv from its buffers. */
static int check_storage(const hq_host_api *host, const hq_storage *s, const char *what) {
  const hq_dtype elem = s ? s->desc.elem : HQ_DTYPE_INVALID;
  if (!s || s->nbuf < 2 || (elem != HQ_E4M3 && elem != HQ_E5M2) ||
      s->desc.scale_mode != HQ_SCALE_TENSOR_F32 ||
      (s->desc.order != HQ_ORDER_MK && s->desc.order != HQ_ORDER_KM) ||
      hq_storage_cbuf(s, FP8T_DATA)->role != HQ_ROLE_DATA ||
      hq_storage_cbuf(s, FP8T_DATA)->dtype != elem ||
      hq_storage_cbuf(s, FP8T_SCALE_INV)->role != HQ_ROLE_SCALE ||
      hq_storage_cbuf(s, FP8T_SCALE_INV)->dtype != HQ_F32)
    return host->error(HQ_EINVAL, "fp8_tensor: %s is not a per-tensor FP8 storage (elem %d, "
                       "scale mode %u, order %u, %u buffers)", what, (int)elem,
                       s ? s->desc.scale_mode : 0u, s ? s->desc.order : 0u, s ? s->nbuf : 0u);
  return HQ_OK;
}

/* The element dtype and order come from the storage, so a storage of any fp8_tensor instance
   (e4m3 or e5m2, any scale options) dequantizes here. With HQ_CALL_DEQ_RAW the values are the
   codes' own (fp8t_raw), scale_inv left out: tensor_factor() gives it, and (ABI 2.3) a raw
   call with hq_call_factor_out() writes RN(m * scale_inv) there besides. */
static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  int rc = check_storage(call->host, s, "the storage");
  if (rc) return rc;
  const hq_dtype elem = s->desc.elem;
  const int raw = (call->flags & HQ_CALL_DEQ_RAW) != 0;
  if (dst->rows != s->rows || dst->cols != s->cols)
    return call->host->error(HQ_ESHAPE, "fp8_tensor: dequantize of a [%lld, %lld] storage into "
                             "[%lld, %lld]", (long long)s->rows, (long long)s->cols,
                             (long long)dst->rows, (long long)dst->cols);
  if (dst->dtype != HQ_F32 && dst->dtype != HQ_F16 && dst->dtype != HQ_BF16)
    return call->host->error(HQ_EINVAL, "fp8_tensor: destination dtype %d is not f32, f16 or "
                             "bf16", (int)dst->dtype);
  const uint8_t *q = hq_storage_cbuf(s, FP8T_DATA)->ptr;
  const float *sp = hq_storage_cbuf(s, FP8T_SCALE_INV)->ptr;
  const int transposed = s->desc.order == HQ_ORDER_KM;
  float *fout = hq_call_factor_out(call); /* NULL unless raw */
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_dequantize(elem, call, q, transposed, sp, raw, fout, dst);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  const int64_t M = dst->rows, K = dst->cols;
  if (fout) *fout = hq_mul_rn(call->factor_in ? *call->factor_in : call->factor_mul, *sp);
  if (raw) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < K; j++)
        hq_store_hp(dst->data, i * K + j, dst->dtype,
                    fp8t_raw(q[transposed ? j * M + i : i * K + j], elem));
    return HQ_OK;
  }
  const float scale_inv = *sp;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++)
      hq_store_hp(dst->data, i * K + j, dst->dtype,
                  hq_fp8_dequantize(q[transposed ? j * M + i : i * K + j], scale_inv, elem));
  return HQ_OK;
}

/* The per-tensor factor: the storage's scale_inv, in memory of call->device. */
static int tensor_factor(const void *cfgp, const hq_call *call, const hq_storage *s, float *out) {
  (void)cfgp;
  int rc = check_storage(call->host, s, "the storage");
  if (rc) return rc;
  const float *sp = hq_storage_cbuf(s, FP8T_SCALE_INV)->ptr;
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return fp8t_cuda_factor(call, sp, out);
#else
    return call->host->error(HQ_ENOTSUP, "fp8_tensor was built without CUDA");
#endif
  }
  *out = *sp;
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 1, /* requires ABI 2.1 (raw dequantize, tensor_factor, gemm) */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(fp8t_cfg),
    .name = "fp8_tensor",
    .version = PACKAGE_VERSION,
    .description = "per-tensor FP8 (E4M3/E5M2), current or delayed scaling; columnwise = byte "
                   "transpose",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR |
            HQ_CAP_COPY_OUT
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA
#endif
    ,
    .options = options,
    .configure = configure,
    .instance_caps = instance_caps,
    .layout = layout,
    .scratch_size = scratch_size,
    .amax_kind = amax_kind,
    .amax = amax,
    .quantize = quantize,
    .dequantize = dequantize,
    .tensor_factor = tensor_factor,
    .state_floats = state_floats,
    .init_state = init_state,
    .update_state = update_state,
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
};

HQ_FORMAT_DEFINE(ops);
