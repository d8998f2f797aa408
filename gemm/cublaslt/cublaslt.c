/*
** cublaslt.c -- the "cublaslt" GEMM provider: the native low-precision GEMMs cuBLASLt offers,
** chosen by the two storages' operand descriptors alone, run through the core's runner
** (host->api->lt_matmul, runner.cu beside this file). Whichever module made a storage, a
** descriptor cuBLASLt can read is multiplied natively:
**
**   scale mode                  elements              device            scales as cuBLASLt reads them
**   TENSOR_F32 (per tensor)     E4M3 / E5M2           sm_89 and later   the FP32 scale_inv buffer
**   VEC128_F32, BLK128X128_F32  E4M3 / E5M2           Hopper (sm_9x)    F32 [k/128][r4(outer)] (1x128,
**     (FP8 blocks)                                                      BLOCK_MAJOR) or
**                                                                       [outer/128][r4(k/128)] (128x128,
**                                                                       OUTER_MAJOR); not 2-D x 2-D
**   VEC32_UE8M0 (1x32 E8M0)     E4M3 / E5M2           sm_100, sm_103    128x4-tile swizzle
**   VEC16_UE4M3 (1x16 E4M3)     E2M1 (two a byte)     sm_100 and later  128x4-tile swizzle, times the
**                                                                       per-tensor factor
**   NONE (high precision)       BF16 / F16 / F32,     every GPU         none: a plain cuBLASLt GEMM on
**                                 the same on both                      the stored values (identity's)
**
** never two E5M2 operands (cuBLASLt has no such FP8 kernel). An operand of logical [X0, X1]
** whose data is stored in [M, K] order is the column-major X1 x X0 matrix (ld X1) taken with the
** caller's transpose flag; one stored in [K, M] order is the column-major X0 x X1 matrix (ld X0)
** taken with the flag flipped. The per-tensor FP8, FP8-block and FP4 modes take only "TN" (both
** operands k-contiguous), which the hq layouts give; the block-scaled MXFP8 mode takes every
** flag. Accumulation is cuBLASLt's split FP32 accumulator (no fast accumulation): block scaling
** requires it, and it keeps per-tensor FP8 as exact as the emulated path. Per-tensor FP8 takes
** cuBLASLt's fast accumulation when the caller sets HQ_GEMM_FAST_ACCUM.
**
** accepts() decides from the descriptors, the flags and the architecture; run() checks what
** depends on the problem -- non-empty sizes, the multiples cuBLASLt's FP8 kernels need (k % 16,
** and m % 8, n % 8 with blocks; k % 32 for FP4), 16-byte alignment, the buffers' shapes -- and
** declines with the reason before anything runs; with HQ_GEMM_QUERY the runner is asked whether
** it has an algorithm.
*/
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "../builtin.h"
#include "lt_names.h"

static int is_hp(hq_dtype t) { return t == HQ_BF16 || t == HQ_F16 || t == HQ_F32; }

/* Two storages holding their values as they are (no scale, no transform, one high-precision
   dtype, [M, K] order): a plain GEMM of the stored data. */
static int plain_pair(const hq_operand_desc *da, const hq_operand_desc *db) {
  return da->scale_mode == HQ_SCALE_NONE && db->scale_mode == HQ_SCALE_NONE &&
         da->transform == HQ_TRANSFORM_NONE && db->transform == HQ_TRANSFORM_NONE &&
         is_hp(da->elem) && da->elem == db->elem && da->order == HQ_ORDER_MK &&
         db->order == HQ_ORDER_MK;
}

static int is_block(uint32_t m) {
  return m == HQ_SCALE_VEC128_F32 || m == HQ_SCALE_BLK128X128_F32;
}

/* The scale layout cuBLASLt reads for a scale mode. */
static uint32_t lt_layout(uint32_t m) {
  switch (m) {
  case HQ_SCALE_VEC128_F32: return HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  case HQ_SCALE_BLK128X128_F32: return HQ_SCALE_LAYOUT_OUTER_MAJOR;
  case HQ_SCALE_VEC32_UE8M0:
  case HQ_SCALE_VEC16_UE4M3: return HQ_SCALE_LAYOUT_SWIZZLED;
  default: return HQ_SCALE_LAYOUT_NONE;
  }
}

static const char *layout_name(uint32_t l) {
  switch (l) {
  case HQ_SCALE_LAYOUT_NONE: return "none";
  case HQ_SCALE_LAYOUT_OUTER_MAJOR: return "outer-major";
  case HQ_SCALE_LAYOUT_BLOCK_MAJOR: return "block-major";
  case HQ_SCALE_LAYOUT_SWIZZLED: return "swizzled";
  default: return "unknown";
  }
}

/* The architectures that run a scale mode natively; the message names them. */
static int arch_ok(uint32_t mode, int arch, const char **need) {
  switch (mode) {
  case HQ_SCALE_TENSOR_F32: *need = "sm_89 or newer"; return arch >= 89;
  case HQ_SCALE_VEC128_F32:
  case HQ_SCALE_BLK128X128_F32: *need = "Hopper (sm_90 .. sm_99)"; return arch >= 90 && arch <= 99;
  case HQ_SCALE_VEC32_UE8M0: *need = "sm_100 or sm_103"; return arch == 100 || arch == 103;
  case HQ_SCALE_VEC16_UE4M3: *need = "sm_100 or newer"; return arch >= 100;
  default: *need = "nothing"; return 0;
  }
}

/* One operand's descriptor against the mode's requirements. */
static int operand_ok(const hq_host_api *api, const hq_gemm_operand_kind *o, const char *which,
                      uint32_t mode) {
  const hq_operand_desc *d = o->desc;
  if (d->transform != HQ_TRANSFORM_NONE && mode != HQ_SCALE_VEC16_UE4M3)
    return api->error(HQ_ENOTSUP, "cublaslt: operand %s (%s) carries a transform, which only "
                      "the FP4 mode multiplies natively", which, o->format);
  if (d->scale_layout != lt_layout(mode))
    return api->error(HQ_ENOTSUP, "cublaslt: operand %s (%s) has %s scales; cuBLASLt's %s mode "
                      "reads them %s%s", which, o->format, layout_name(d->scale_layout),
                      hq_lt_scale_name(mode), layout_name(lt_layout(mode)),
                      lt_layout(mode) == HQ_SCALE_LAYOUT_SWIZZLED
                          ? " (a format option such as swizzle = true makes them so)" : "");
  /* the block along k (the contraction): a rowwise storage's block_k, a columnwise one's
     block_m; 2-D blocks are fine, their scales are stored per 1 x block along k */
  const int want_k = mode == HQ_SCALE_VEC16_UE4M3 ? 16 : mode == HQ_SCALE_VEC32_UE8M0 ? 32 : 0;
  const int along_k = o->dir == HQ_ROWWISE ? d->block_k : d->block_m;
  if (want_k && along_k != want_k)
    return api->error(HQ_ENOTSUP, "cublaslt: operand %s (%s) has blocks of %d along k; the %s "
                      "mode scales every %d", which, o->format, along_k, hq_lt_scale_name(mode), want_k);
  if (mode != HQ_SCALE_VEC32_UE8M0 && !hq_gemm_k_contiguous(o))
    return api->error(HQ_ENOTSUP, "cublaslt: operand %s (%s) does not keep k contiguous; "
                      "cuBLASLt's %s GEMMs take \"TN\" operands only", which, o->format,
                      hq_lt_scale_name(mode));
  return HQ_OK;
}

static int accepts(const hq_gemm_host *host, const hq_gemm_kind *k) {
  const hq_host_api *api = host->api;
  if (k->flags & HQ_GEMM_FORCE_EMULATED)
    return api->error(HQ_ENOTSUP, "the caller forced the emulated path");
  if (!k->a.desc || !k->b.desc)
    return api->error(HQ_ENOTSUP, "a high-precision operand");
  if (k->device < 0)
    return api->error(HQ_ENOTSUP, "cublaslt: no native GEMM on the host (the CPU path "
                      "multiplies the raw values)");
  const hq_operand_desc *da = k->a.desc, *db = k->b.desc;
  if (plain_pair(da, db)) return HQ_OK;
  const uint32_t ma = da->scale_mode, mb = db->scale_mode;
  const int fp8 = hq_lt_is_fp8(da->elem) && hq_lt_is_fp8(db->elem);
  const int fp4 = da->elem == HQ_E2M1X2 && db->elem == HQ_E2M1X2;
  if (!fp8 && !fp4)
    return api->error(HQ_ENOTSUP, "cublaslt: %s (%s elements) x %s (%s elements) is no native "
                      "cuBLASLt pair (FP8 x FP8 or FP4 x FP4)", k->a.format,
                      hq_lt_elem_name(da->elem), k->b.format, hq_lt_elem_name(db->elem));
  if (ma != mb && !(is_block(ma) && is_block(mb)))
    return api->error(HQ_ENOTSUP, "cublaslt: operands scaled differently (A %s: %s, B %s: %s)",
                      k->a.format, hq_lt_scale_name(ma), k->b.format, hq_lt_scale_name(mb));
  const char *need;
  if (!arch_ok(ma, k->arch, &need))
    return api->error(HQ_ENOTSUP, "cublaslt: %s x %s (%s scales) runs natively on %s; device %d "
                      "is sm_%d", k->a.format, k->b.format, hq_lt_scale_name(ma), need, (int)k->device,
                      (int)k->arch);
  if ((ma == HQ_SCALE_VEC16_UE4M3) != fp4)
    return api->error(HQ_ENOTSUP, "cublaslt: the %s mode takes %s elements", hq_lt_scale_name(ma),
                      fp4 ? "FP8" : "E2M1");
  if (fp8 && da->elem == HQ_E5M2 && db->elem == HQ_E5M2)
    return api->error(HQ_ENOTSUP, "cublaslt: cuBLASLt has no e5m2 x e5m2 FP8 GEMM (e4m3 x e4m3, "
                      "e4m3 x e5m2 and e5m2 x e4m3 run natively)");
  if (ma == HQ_SCALE_BLK128X128_F32 && mb == HQ_SCALE_BLK128X128_F32)
    return api->error(HQ_ENOTSUP, "cublaslt: cuBLASLt has no 2-D x 2-D (128x128 x 128x128) "
                      "block-scaled GEMM (1-D x 1-D, 1-D x 2-D and 2-D x 1-D run natively)");
  int rc = operand_ok(api, &k->a, "A", ma);
  if (!rc) rc = operand_ok(api, &k->b, "B", mb);
  return rc;
}

/* Operand `which` of a problem as cuBLASLt takes it (see the header comment for the mapping),
   with the problem-level checks: its data and scale buffers, their shapes and alignment. */
static int lt_operand(const hq_host_api *api, const hq_call *call, const hq_gemm_operand *o,
                      const hq_gemm_operand_kind *k, const char *which, hq_lt_operand *out) {
  const hq_operand_desc *d = k->desc;
  const hq_buffer *data = hq_storage_role(o->st, HQ_ROLE_DATA);
  const hq_buffer *sc = hq_storage_role(o->st, HQ_ROLE_SCALE);
  const int fp4 = d->elem == HQ_E2M1X2, km = d->order == HQ_ORDER_KM;
  /* the stored matrix: [M, K] order holds [X0, X1], [K, M] order [X1, X0]; FP4 counts bytes */
  const int64_t r0 = km ? o->cols : o->rows, r1 = km ? o->rows : o->cols;
  const int plain = d->scale_mode == HQ_SCALE_NONE;
  if (!data || (!sc && !plain) || data->ndim != 2 || data->shape[0] != r0 ||
      data->shape[1] != (fp4 ? r1 / 2 : r1) || (fp4 && r1 % 2))
    return api->error(HQ_EINVAL, "cublaslt: operand %s (%s, role %s) does not describe a data "
                      "buffer of [%lld, %lld]%s%s", which, k->format, o->role, (long long)r0,
                      (long long)(fp4 ? r1 / 2 : r1), fp4 ? " bytes" : "",
                      plain ? "" : " and a scale buffer");
  if (o->st->device != call->device)
    return api->error(HQ_EINVAL, "cublaslt: operand %s is on device %d, the call on %d", which,
                      (int)o->st->device, (int)call->device);
  memset(out, 0, sizeof *out);
  out->data = data->ptr;
  out->elem = d->elem;
  out->trans = km ? !k->trans : k->trans;
  out->rows = r1;
  out->cols = r0;
  out->ld = r1;
  out->scale_mode = d->scale_mode;
  if (plain) return HQ_OK; /* cuBLASLt takes any alignment of high-precision data */
  out->scale = sc->ptr;
  if (((uintptr_t)data->ptr & 15u) || (d->scale_mode != HQ_SCALE_TENSOR_F32 &&
                                       ((uintptr_t)sc->ptr & 15u)))
    return api->error(HQ_ENOTSUP, "cublaslt: operand %s's %s buffer is not 16-byte aligned "
                      "(cuBLASLt needs it)", which, ((uintptr_t)data->ptr & 15u) ? "data" : "scale");
  /* the scales cuBLASLt reads for the mode must be there, whoever laid them out */
  const int64_t outer = o->st->dir == HQ_ROWWISE ? o->rows : o->cols;
  const int64_t kk = o->st->dir == HQ_ROWWISE ? o->cols : o->rows;
  int64_t want = 0;
  switch (d->scale_mode) {
  case HQ_SCALE_TENSOR_F32: want = 4; break;
  case HQ_SCALE_VEC128_F32: want = 4 * ((kk + 127) / 128) * ((outer + 3) / 4 * 4); break;
  case HQ_SCALE_BLK128X128_F32:
    want = 4 * ((outer + 127) / 128) * (((kk + 127) / 128 + 3) / 4 * 4);
    break;
  case HQ_SCALE_VEC32_UE8M0: want = (outer + 127) / 128 * 128 * ((kk / 32 + 3) / 4 * 4); break;
  default: want = (outer + 127) / 128 * 128 * ((kk / 16 + 3) / 4 * 4); break;
  }
  if ((int64_t)sc->bytes < want)
    return api->error(HQ_EINVAL, "cublaslt: operand %s's scale buffer '%s' holds %zu bytes; "
                      "cuBLASLt reads %lld for its %s scales", which, sc->name ? sc->name : "?",
                      sc->bytes, (long long)want, hq_lt_scale_name(d->scale_mode));
  return HQ_OK;
}

/* "cublaslt e4m3 x e5m2 (vec128_f32 x blk128x128_f32)", assembled without printf: a GEMM runs
   this on every call. */
static void describe(char *what, size_t len, const hq_gemm_kind *k) {
  const char *parts[] = {"cublaslt ", hq_lt_elem_name(k->a.desc->elem), " x ",
                         hq_lt_elem_name(k->b.desc->elem), " (",
                         hq_lt_scale_name(k->a.desc->scale_mode), " x ",
                         hq_lt_scale_name(k->b.desc->scale_mode), ")"};
  size_t n = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    const size_t l = strlen(parts[i]);
    if (n + l >= len) break;
    memcpy(what + n, parts[i], l);
    n += l;
  }
  what[n] = '\0';
}

/* The limits of cuBLASLt's low-precision kernels that depend on the problem. */
static int sizes_ok(const hq_host_api *api, const hq_gemm_run *r, uint32_t mode) {
  const int fp4 = mode == HQ_SCALE_VEC16_UE4M3;
  if (mode == HQ_SCALE_NONE) return HQ_OK; /* high precision: the runner takes every size */
  if (r->m <= 0 || r->n <= 0 || r->k <= 0)
    return api->error(HQ_ENOTSUP, "cublaslt: an empty GEMM (m = %lld, n = %lld, k = %lld) is not "
                      "run natively", (long long)r->m, (long long)r->n, (long long)r->k);
  if (fp4 ? r->k % 32 : r->k % 16)
    return api->error(HQ_ENOTSUP, "cublaslt: k = %lld is not a multiple of %d, which cuBLASLt's "
                      "%s GEMMs need (the operands' leading dimension)", (long long)r->k,
                      fp4 ? 32 : 16, fp4 ? "FP4" : "FP8");
  if (is_block(mode) && r->m % 8)
    return api->error(HQ_ENOTSUP, "cublaslt: m = %lld is not a multiple of 8, which the "
                      "block-scaled cuBLASLt GEMM needs", (long long)r->m);
  if (is_block(mode) && r->kind->b.desc->scale_mode == HQ_SCALE_VEC128_F32 && r->n % 8)
    return api->error(HQ_ENOTSUP, "cublaslt: n = %lld is not a multiple of 8, which the "
                      "block-scaled cuBLASLt GEMM needs when B has 1-D (1x128) blocks",
                      (long long)r->n);
  return HQ_OK;
}

static int run(const hq_gemm_host *host, const hq_call *call, hq_gemm_run *r) {
  const hq_host_api *api = host->api;
  const hq_gemm_kind *k = r->kind;
  const uint32_t mode = k->a.desc->scale_mode;
  int rc = sizes_ok(api, r, mode);
  if (rc) return rc;
  hq_lt_matmul mm;
  memset(&mm, 0, sizeof mm);
  rc = lt_operand(api, call, &r->a, &k->a, "A", &mm.a);
  if (!rc) rc = lt_operand(api, call, &r->b, &k->b, "B", &mm.b);
  if (rc) return rc;
  char what[96];
  describe(what, sizeof what, k);
  mm.struct_size = sizeof mm;
  mm.flags = r->flags & HQ_GEMM_QUERY;
  mm.m = r->m;
  mm.n = r->n;
  mm.k = r->k;
  mm.alpha = r->alpha;
  mm.beta = r->beta;
  mm.d = r->d->data;
  mm.d_dtype = r->d->dtype;
  mm.ldd = r->m;
  mm.bias = r->bias;
  mm.bias_dtype = r->bias_dtype;
  /* the split accumulator unless the caller asks otherwise: block scaling needs it */
  mm.fast_accum = mode == HQ_SCALE_TENSOR_F32 && (k->flags & HQ_GEMM_FAST_ACCUM);
  mm.what = what;
  /* max |D| from cuBLASLt's epilogue where it offers one; else the core makes it after */
  int32_t amax_done = 0;
  mm.amax_d = r->amax_d;
  mm.amax_done = &amax_done;
  r->path = HQ_GEMM_PATH_NATIVE;
  /* A per-tensor scale IS the operand's factor (its raw values are the bare codes); a block
     mode's storage may add one (NVFP4's global scale), folded into alpha: alpha * fa * fb. */
  const int fa = mode != HQ_SCALE_TENSOR_F32 && (k->a.flags & HQ_GEMM_OP_FACTOR);
  const int fb = mode != HQ_SCALE_TENSOR_F32 && (k->b.flags & HQ_GEMM_OP_FACTOR);
  if (!fa && !fb) {
    rc = api->lt_matmul(call, &mm);
    r->amax_done = !rc && amax_done;
    return rc;
  }
  if (mm.flags & HQ_GEMM_QUERY) {
    /* nothing runs: the scale buffers stand in for the factors (device FP32 pointers) */
    mm.alpha_factor[0] = fa ? mm.a.scale : NULL;
    mm.alpha_factor[1] = fb ? mm.b.scale : NULL;
    return api->lt_matmul(call, &mm);
  }
  float *f = api->alloc(call, 2 * sizeof(float));
  if (!f) return HQ_ENOMEM; /* alloc recorded the message */
  if (fa && !(rc = host->factor(call, &r->a, f))) mm.alpha_factor[0] = f;
  if (!rc && fb && !(rc = host->factor(call, &r->b, f + 1))) mm.alpha_factor[1] = f + 1;
  if (!rc) rc = api->lt_matmul(call, &mm);
  api->free(call, f); /* stream-ordered: after the GEMM that reads it */
  r->amax_done = !rc && amax_done;
  return rc;
}

static const hq_gemm_provider table = {
    .abi_major = HQ_GEMM_ABI_MAJOR,
    .abi_minor = 0,
    .struct_size = sizeof(hq_gemm_provider),
    .priority = 100,
    .name = "cublaslt",
    .version = PACKAGE_VERSION,
    .description = "cuBLASLt's native GEMMs by the operands' descriptors: per-tensor FP8, FP8 "
                   "blocks (Hopper), MXFP8 and NVFP4 block scales (Blackwell)",
    .accepts = accepts,
    .run = run,
};

HQ_GEMM_ENTRY(cublaslt, table)
