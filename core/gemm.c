/*
** gemm.c -- hq_gemm: operand unwrap by transpose flag, dispatch between a format's native GEMM
** and the emulated path, the emulated GPU path (raw dequantize + one cuBLASLt GEMM through
** hqi_lt_matmul), the CPU path (raw dequantize to F32 + sgemm), and the linear-layer helpers.
**
** Convention (cuBLAS, column-major): A is [A0, A1] row-major, i.e. a column-major A1 x A0 matrix
** with ld = A1; m = transa ? A0 : A1, k = transa ? A1 : A0, n = transb ? B1 : B0; D is row-major
** [n, m] = column-major m x n with ld = m. So the emulated paths hand the dequantized operands to
** the BLAS with the caller's flags unchanged.
**
** Dispatch (see hq/plugin.h "GEMMs"): both operands quantized by one module that has a gemm op
** (ABI 2.1) -> ask it (HQ_GEMM_QUERY); HQ_OK runs natively. Every other case is emulated: each
** quantized operand dequantized RAW into its desc.emul_dtype (elements times block scales, no
** per-tensor factor, transform kept), the per-tensor factors (tensor_factor op) folded into
** alpha, then one GEMM in BF16 when both operands are exact there, else in F32. A 2.0 module
** (no raw dequantize) is dequantized completely into F32 with factor 1: still the exact product
** of its dequantized values, one rounding coarser for per-tensor formats.
*/
#include "config.h"
#include "hq_internal.h"

#include <math.h>
#include <string.h>

#include "hq/numerics.h"
#include "cuda/fused_gemm.h"

#ifdef HQ_HAVE_OPENBLAS
#include <cblas.h>
#endif

const char *hq_gemm_path_name(uint32_t path) {
  switch (path) {
  case HQ_GEMM_PATH_NATIVE: return "native";
  case HQ_GEMM_PATH_EMULATED_BF16: return "emulated-bf16";
  case HQ_GEMM_PATH_EMULATED_F32: return "emulated-f32";
  case HQ_GEMM_PATH_CPU: return "cpu";
  case HQ_GEMM_PATH_FUSED_BF16: return "fused-bf16";
  default: return "none";
  }
}

#ifndef HQ_HAVE_CUDA
int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  (void)mm;
  return hqi_error(HQ_ENOTSUP, "this libhqcore was built without CUDA: no cuBLASLt GEMM");
}
int hqi_fused_gemm_supported(const hqi_fused_gemm_args *a) {
  (void)a;
  return 0;
}
int hqi_fused_gemm(const hqi_fused_gemm_args *a) {
  return hqi_error(HQ_ENOTSUP, "%s: this libhqcore was built without CUDA", a->what);
}
#endif

// --- operands ---------------------------------------------------------------------------------

/* One operand as the GEMM sees it. */
typedef struct gop {
  const hq_qtensor *qt;          /* quantized, or NULL */
  const hq_storage *st;          /* its storage in the direction the flag selected */
  hqi_format *fmt;               /* that direction's format */
  const hq_tensor *hp;           /* high precision, when qt is NULL */
  uint32_t dir;                  /* 0 for hp */
  int64_t r0, r1;                /* [A0, A1] */
  hq_dtype emul;                 /* dtype its raw values are exact in (BF16 or F32) */
  int raw;                       /* the module dequantizes raw and gives its factor (2.1) */
  const char *label;             /* "A" / "B" */
} gop;

static const char *opname(const gop *o) {
  return o->qt ? o->qt->role : "high-precision tensor";
}

static int resolve(const hq_ctx *ctx, hq_operand in, int is_a, int trans, const char *what,
                   hq_tensor *hp_copy, gop *o) {
  memset(o, 0, sizeof *o);
  o->label = is_a ? "A" : "B";
  if (!!in.qt == !!in.hp)
    return hqi_error(HQ_EINVAL, "%s: operand %s must be exactly one of a qtensor and a "
                     "high-precision tensor", what, o->label);
  if (in.qt) {
    const hq_qtensor *qt = in.qt;
    if (qt->ctx->device != ctx->device)
      return hqi_error(HQ_EINVAL, "%s: operand %s (role %s) lives on device %d, the context runs "
                       "on %d", what, o->label, qt->role, qt->ctx->device, ctx->device);
    if (qt->saved)
      return hqi_error(HQ_ESTATE, "%s: operand %s (role %s) is saved (restore it first)", what,
                       o->label, qt->role);
    uint32_t dir = is_a ? (trans ? HQ_ROWWISE : HQ_COLWISE) : (trans ? HQ_COLWISE : HQ_ROWWISE);
    int d = dir == HQ_COLWISE;
    if (!qt->d[d].present)
      return hqi_error(HQ_ESTATE, "%s: operand %s (role %s) is used %s, which needs its %s copy, "
                       "but it holds %s (quantize it with that direction in its usage; hq never "
                       "requantizes silently)", what, o->label, qt->role,
                       trans ? "transposed" : "not transposed", HQI_DIR_NAME(dir),
                       qt->d[!d].present ? (d ? "only the rowwise copy" : "only the columnwise copy")
                                         : "no copy");
    o->qt = qt;
    o->st = &qt->d[d].st;
    o->fmt = qt->fmt[d];
    o->dir = dir;
    o->r0 = qt->rows;
    o->r1 = qt->cols;
    o->raw = o->fmt->plugin->ops.abi_minor >= 1;
    o->emul = o->raw && o->st->desc.emul_dtype == HQ_BF16 ? HQ_BF16 : HQ_F32;
    return HQ_OK;
  }
  /* the message's prefix is formatted only on failure (hq_gemm's host time is per call) */
  int rc = hqi_tensor_in(in.hp, is_a ? "operand A" : "operand B", hp_copy);
  if (rc) return hqi_error_prefix(rc, "%s", what);
  if (hp_copy->device != ctx->device)
    return hqi_error(HQ_EINVAL, "%s: operand %s is on device %d, the context runs on %d", what,
                     o->label, hp_copy->device, ctx->device);
  o->hp = hp_copy;
  o->r0 = hp_copy->rows;
  o->r1 = hp_copy->cols;
  o->emul = hp_copy->dtype == HQ_BF16 ? HQ_BF16 : HQ_F32; /* F16 is exact in F32, not BF16 */
  return HQ_OK;
}

static void fmt_name(const gop *o, char *out, size_t n) {
  const char *s = o->qt ? o->fmt->plugin->ops.name : hq_dtype_name(o->hp->dtype);
  size_t l = strlen(s);
  if (l >= n) l = n - 1;
  memcpy(out, s, l);
  out[l] = '\0';
}

/* Everything hq_gemm and hq_gemm_plan share: operands, shapes, transforms, the path. */
typedef struct plan {
  gop a, b;
  hq_tensor hpa, hpb, d;
  int64_t m, n, k;
  int transa, transb;
  uint32_t path;
  int tentative;                 /* hq_gemm: NATIVE to be confirmed by running it */
  int fused;                     /* FUSED_BF16: 1 = A is the fused operand, 2 = B */
  hqi_fused_gemm_args fa;        /* FUSED_BF16: the kernel's arguments but W, alpha, beta, the
                                    factors and the bias (filled when it runs) */
  int arch;                      /* the device's compute capability, asked once when an operand
                                    could be fused (0: not asked) */
  hq_gemm_args args;
  const char *what;
  char what_buf[96];
  hq_gemm_info info;
} plan;

static int check_transforms(const plan *p) {
  const hq_operand_desc *da = p->a.st ? &p->a.st->desc : NULL;
  const hq_operand_desc *db = p->b.st ? &p->b.st->desc : NULL;
  uint32_t ta = da ? da->transform : HQ_TRANSFORM_NONE, tb = db ? db->transform : HQ_TRANSFORM_NONE;
  uint64_t pa = da && ta ? da->transform_param : 0, pb = db && tb ? db->transform_param : 0;
  if (ta == tb && pa == pb) return HQ_OK;
  return hqi_error(HQ_EINVAL, "%s: operand A (%s, %s) carries transform %s (parameter 0x%llx) "
                   "along k but operand B (%s, %s) carries %s (parameter 0x%llx): a product of "
                   "differently transformed operands is meaningless; give both the same transform "
                   "(e.g. rht on both wgrad operands) or neither", p->what, opname(&p->a),
                   p->a.dir ? HQI_DIR_NAME(p->a.dir) : "high precision",
                   ta == HQ_TRANSFORM_RHT16 ? "rht16" : ta ? "other" : "none",
                   (unsigned long long)pa, opname(&p->b),
                   p->b.dir ? HQI_DIR_NAME(p->b.dir) : "high precision",
                   tb == HQ_TRANSFORM_RHT16 ? "rht16" : tb ? "other" : "none",
                   (unsigned long long)pb);
}

static void fill_problem(const plan *p, hq_gemm_problem *g, float alpha, float beta,
                         uint32_t flags) {
  memset(g, 0, sizeof *g);
  g->struct_size = sizeof *g;
  g->flags = flags;
  g->a = p->a.st;
  g->b = p->b.st;
  g->cfg_b = p->b.fmt->cfg;
  g->transa = p->transa;
  g->transb = p->transb;
  g->m = p->m;
  g->n = p->n;
  g->k = p->k;
  g->d = (hq_tensor *)&p->d;
  g->bias = p->args.bias;
  g->bias_dtype = p->args.bias_dtype;
  g->alpha = alpha;
  g->beta = beta;
}

/* The buffer of storage st with role `role` (2-D), or NULL. */
static const hq_buffer *buf_of(const hq_storage *st, uint32_t role) {
  for (uint32_t i = 0; i < st->nbuf; i++) {
    const hq_buffer *b = hq_storage_cbuf(st, i);
    if (b->role == role) return b->ndim == 2 ? b : NULL;
  }
  return NULL;
}

/* The fused path's arguments for operand x (fused) against y (dequantized to BF16): 1 when x's
   storage and y's orientation allow it (hqi_fused_gemm_supported), else 0. outer = x's rows (m
   for A, n for B). D and the scalars are filled by the caller. */
static int fused_args(const hq_ctx *ctx, plan *p, const gop *x, const gop *y, int x_is_a,
                      hqi_fused_gemm_args *fa) {
  if (!x->qt || !x->st || !x->raw || y->emul != HQ_BF16) return 0;
  /* y K-contiguous as the emulated path lays it out: A transposed, B not transposed */
  if (x_is_a ? p->transb : !p->transa) return 0;
  /* x's raw values as its descriptor states them: MXFP8 (E4M3 / E5M2 codes times E8M0 scales of
     1x32 blocks) or NVFP4 (E2M1 codes times E4M3 scales of 1x16 blocks, a per-tensor factor
     apart), k contiguous, scales row-major or swizzled. A transform along k needs nothing: both
     operands carry the same one (check_transforms) and the path multiplies raw values, as the
     emulated path does. */
  const hq_operand_desc *d = &x->st->desc;
  const int nv = d->elem == HQ_E2M1X2;
  if (nv ? d->scale_mode != HQ_SCALE_VEC16_UE4M3 || d->block_k != 16
         : (d->elem != HQ_E4M3 && d->elem != HQ_E5M2) || d->scale_mode != HQ_SCALE_VEC32_UE8M0 ||
               d->block_k != 32 || x->fmt->plugin->ops.tensor_factor)
    return 0;
  if (d->order != HQ_ORDER_MK || d->block_m != 1 ||
      (d->scale_layout != HQ_SCALE_LAYOUT_OUTER_MAJOR &&
       d->scale_layout != HQ_SCALE_LAYOUT_SWIZZLED))
    return 0;
  const int64_t outer = x_is_a ? p->m : p->n;
  const hq_buffer *data = buf_of(x->st, HQ_ROLE_DATA), *sc = buf_of(x->st, HQ_ROLE_SCALE);
  if (!data || !sc || data->shape[0] != outer || data->shape[1] != (nv ? p->k / 2 : p->k) ||
      (nv && p->k % 2) || hq_dtype_size(data->dtype) != 1 || hq_dtype_size(sc->dtype) != 1 ||
      sc->shape[0] < hq_roundup(outer, 128))
    return 0;
  memset(fa, 0, sizeof *fa);
  fa->device = ctx->device;
  if (!p->arch) p->arch = hqi_cuda_arch(ctx->device);
  fa->arch = p->arch;
  fa->stream = ctx->stream;
  fa->x = data->ptr;
  fa->xs = sc->ptr;
  fa->xs_ld = sc->shape[1];
  fa->xs_swizzled = d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED;
  fa->elem = (int)d->elem;
  fa->mx = outer;
  fa->nw = x_is_a ? p->n : p->m;
  fa->k = p->k;
  fa->x_is_m = x_is_a;
  fa->d = p->d.data;
  if (!fa->d) fa->d = (void *)(uintptr_t)256; /* a plan: D's alignment is checked when it runs */
  fa->d_dtype = (int)p->d.dtype;
  fa->ldd = p->m;
  fa->what = p->what;
  return hqi_fused_gemm_supported(fa);
}

/* Rows of the BF16 operand up to which the fused path is taken by default: up to there, the
   unfused path's BF16 copy of the large operand costs more than the fused kernel's lower rate.
   Measured on an H100 (2026-11-27, the kernel of ccf8eb9), back to back, in % of the BF16 GEMM,
   MXFP8 / NVFP4, fused vs unfused: 16384 x 1024 x 4096 85 / 85% vs 73 / 72% (an earlier
   kernel); 4096 x 2048 x 4096 79 / 80% vs 74 / 74%; 4096^3 80 / 81% vs 81 / 82%; 8192^3 89 /
   89% vs 89 / 92%; 16384 x 4096 x 1024 71 / 72% vs 88 / 88%. */
#define HQI_FUSED_MAX_OTHER 2048

/* The emulated path of a plan (the native one refused or unavailable), and for FUSED_BF16 which
   operand is fused (p->fused). */
static uint32_t emulated_path(const hq_ctx *ctx, plan *p) {
  p->fused = 0;
  if (ctx->device < 0) return HQ_GEMM_PATH_CPU;
  if (p->a.emul != HQ_BF16 || p->b.emul != HQ_BF16) return HQ_GEMM_PATH_EMULATED_F32;
  const uint32_t fl = p->args.flags;
  if (!(fl & (HQ_GEMM_FORCE_EMULATED | HQ_GEMM_NO_FUSED)) && p->m > 0 && p->n > 0 && p->k > 0) {
    hqi_fused_gemm_args fa, fb;
    const int can_a = fused_args(ctx, p, &p->a, &p->b, 1, &fa);
    const int can_b = fused_args(ctx, p, &p->b, &p->a, 0, &fb);
    /* the larger operand fused; by default only against a small other one */
    int pick = can_a && (!can_b || p->m >= p->n) ? 1 : can_b ? 2 : 0;
    const int64_t other = pick == 1 ? p->n : p->m;
    if (pick && !(fl & HQ_GEMM_FUSED_ALWAYS) && other > HQI_FUSED_MAX_OTHER) pick = 0;
    if (pick) {
      p->fused = pick;
      p->fa = pick == 1 ? fa : fb; /* hq_gemm's plan has D: its alignment is checked */
      return HQ_GEMM_PATH_FUSED_BF16;
    }
  }
  return HQ_GEMM_PATH_EMULATED_BF16;
}

/* direct: a native candidate is not asked (HQ_GEMM_QUERY) but marked tentative: hq_gemm runs it
   and falls back to the emulated path on HQ_ENOTSUP (which by the ABI means nothing ran), so a
   native GEMM makes one module call and one plan lookup, not two. */
static int prepare(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                   const hq_tensor *D, const hq_gemm_args *argsp, const char *fn, int direct,
                   plan *p) {
  memset(p, 0, sizeof *p);
  if (!ctx) return hqi_error(HQ_EINVAL, "%s: NULL context", fn);
  if (argsp) {
    int rc = hqi_struct_in(&p->args, sizeof p->args, argsp, argsp->struct_size,
                           offsetof(hq_gemm_args, what) + sizeof(const char *), "hq_gemm_args");
    if (rc) return rc;
  }
  if (p->args.what) {
    snprintf(p->what_buf, sizeof p->what_buf, "%s (%s)", fn, p->args.what);
    p->what = p->what_buf;
  } else {
    p->what = fn;
  }
  p->transa = transa = !!transa;
  p->transb = transb = !!transb;
  int rc = resolve(ctx, A, 1, transa, p->what, &p->hpa, &p->a);
  if (!rc) rc = resolve(ctx, B, 0, transb, p->what, &p->hpb, &p->b);
  if (rc) return rc;
  p->m = transa ? p->a.r0 : p->a.r1;
  int64_t ka = transa ? p->a.r1 : p->a.r0;
  p->n = transb ? p->b.r1 : p->b.r0;
  int64_t kb = transb ? p->b.r0 : p->b.r1;
  if (ka != kb)
    return hqi_error(HQ_ESHAPE, "%s: A [%lld, %lld] (%s) and B [%lld, %lld] (%s) do not agree on "
                     "k: %lld vs %lld", p->what, (long long)p->a.r0, (long long)p->a.r1,
                     transa ? "T" : "N", (long long)p->b.r0, (long long)p->b.r1,
                     transb ? "T" : "N", (long long)ka, (long long)kb);
  p->k = ka;
  if (D) {
    if ((rc = hqi_tensor_in(D, "D", &p->d))) return hqi_error_prefix(rc, "%s", p->what);
    if (p->d.dtype != HQ_F32 && p->d.dtype != HQ_BF16)
      return hqi_error(HQ_EINVAL, "%s: D must be f32 or bf16, not %s", p->what,
                       hq_dtype_name(p->d.dtype));
    if (p->d.device != ctx->device)
      return hqi_error(HQ_EINVAL, "%s: D is on device %d, the context runs on %d", p->what,
                       p->d.device, ctx->device);
    if (p->d.rows != p->n || p->d.cols != p->m)
      return hqi_error(HQ_ESHAPE, "%s: D is [%lld, %lld], the product is [n, m] = [%lld, %lld]",
                       p->what, (long long)p->d.rows, (long long)p->d.cols, (long long)p->n,
                       (long long)p->m);
  } else {
    p->d = hq_tensor_2d(NULL, HQ_F32, ctx->device, p->n, p->m);
  }
  if (p->args.bias && p->args.bias_dtype != HQ_F32 && p->args.bias_dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: bias must be f32 or bf16, not %s", p->what,
                     hq_dtype_name(p->args.bias_dtype));
  if ((rc = check_transforms(p))) return rc;

  p->info.struct_size = sizeof p->info;
  p->info.m = p->m;
  p->info.n = p->n;
  p->info.k = p->k;
  p->info.dir_a = p->a.dir;
  p->info.dir_b = p->b.dir;
  fmt_name(&p->a, p->info.format_a, sizeof p->info.format_a);
  fmt_name(&p->b, p->info.format_b, sizeof p->info.format_b);

  /* the path */
  const hq_format_ops *ops = p->a.qt ? &p->a.fmt->plugin->ops : NULL;
  if (p->args.flags & HQ_GEMM_FORCE_EMULATED) {
    snprintf(p->info.reason, sizeof p->info.reason, "the caller forced the emulated path");
  } else if (!p->a.qt || !p->b.qt) {
    snprintf(p->info.reason, sizeof p->info.reason, "a high-precision operand");
  } else if (p->a.fmt->plugin != p->b.fmt->plugin &&
             (strcmp(p->a.fmt->plugin->ops.name, p->b.fmt->plugin->ops.name) != 0 ||
              p->a.fmt->plugin->ops.gemm != p->b.fmt->plugin->ops.gemm)) {
    /* one module: the same name and the same code (two recipes loading one .so count as one) */
    snprintf(p->info.reason, sizeof p->info.reason, "operands of two modules (%s x %s)",
             p->info.format_a, p->info.format_b);
  } else if (ops->abi_minor < 1 || !ops->gemm) {
    snprintf(p->info.reason, sizeof p->info.reason, "module %s has no native gemm", ops->name);
  } else if (direct) {
    p->path = HQ_GEMM_PATH_NATIVE;
    p->tentative = 1;
  } else {
    hq_gemm_problem g;
    fill_problem(p, &g, 1.0f, 0.0f, HQ_GEMM_QUERY);
    hq_call call;
    hqi_call_init(ctx, &call, 0, ctx->offset);
    hq_clear_error();
    int saved;
    if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
    rc = ops->gemm(p->a.fmt->cfg, &call, &g);
    hqi_device_leave(saved);
    if (rc == HQ_OK) {
      p->path = HQ_GEMM_PATH_NATIVE;
    } else if (rc == HQ_ENOTSUP) {
      snprintf(p->info.reason, sizeof p->info.reason, "%s", hq_last_error());
      hq_clear_error();
    } else {
      return hqi_error_prefix(rc, "%s: module %s, gemm query", p->what, ops->name);
    }
  }
  if (!p->path) p->path = emulated_path(ctx, p);
  p->info.path = p->path;
  return HQ_OK;
}

static void info_out(const plan *p, hq_gemm_info *out) {
  if (!out) return;
  uint32_t n = out->struct_size;
  if (n < offsetof(hq_gemm_info, path) + sizeof(uint32_t)) return;
  if (n > sizeof p->info) n = sizeof p->info;
  hq_gemm_info i = p->info;
  i.fused = (uint32_t)p->fused; /* from the plan's pick, wherever it was made */
  memcpy(out, &i, n);
  out->struct_size = n;
}

int hq_gemm_plan(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                 const hq_tensor *D, const hq_gemm_args *args, hq_gemm_info *info) {
  plan p;
  int rc = prepare(ctx, A, transa, B, transb, D, args, "hq_gemm_plan", 0, &p);
  if (!rc) info_out(&p, info);
  return rc;
}

// --- emulated operands --------------------------------------------------------------------------

/* The per-tensor factor of a quantized operand's raw values (ABI 2.1 tensor_factor(), written
   into factor_slot; *factor = factor_slot), or none (*factor = NULL). */
static int operand_factor(hq_ctx *ctx, const plan *p, const gop *o, float *factor_slot,
                          const float **factor) {
  *factor = NULL;
  const hq_format_ops *ops = o->st ? &o->fmt->plugin->ops : NULL;
  if (!ops || !ops->tensor_factor) return HQ_OK;
  hq_call call;
  hqi_call_init(ctx, &call, 0, ctx->offset);
  hq_clear_error();
  int rc = ops->tensor_factor(o->fmt->cfg, &call, o->st, factor_slot);
  if (rc)
    return hqi_error_prefix(rc, "%s: operand %s (role %s, plugin %s), tensor_factor", p->what,
                            o->label, o->qt->role, ops->name);
  *factor = factor_slot;
  return HQ_OK;
}

/* Folding an operand's per-tensor factor into alpha inside its raw dequantize (ABI 2.3,
   HQ_CAP_DEQ_FACTOR), so that no kernel runs for it: the product so far (*in on the device, or
   mul when in is NULL). emul_operand sets `done` when the dequantize wrote hq_mul_rn(product so
   far, the operand's factor) into the operand's factor slot. */
typedef struct fold {
  const float *in;
  float mul;
  int done;
} fold;

/* The raw values of operand o as a [r0, r1] tensor of dtype `dt` on ctx's device: the caller's
   own memory for a high-precision operand already of that dtype, else a temporary (*tmp, to be
   freed with hqi_ctx_free_raw). *factor receives the per-tensor factor's location (NULL: 1):
   tensor_factor()'s value, or with fd (a device path) and a module that folds, the product
   described at `fold`. */
static int emul_operand(hq_ctx *ctx, const plan *p, const gop *o, hq_dtype dt, const void **data,
                        void **tmp, float *factor_slot, const float **factor, fold *fd) {
  *tmp = NULL;
  *factor = NULL;
  if (o->hp && o->hp->dtype == dt) {
    *data = o->hp->data;
    return HQ_OK;
  }
  if (o->st && o->raw && !o->fmt->plugin->ops.tensor_factor) {
    /* a storage that describes itself as its own raw values -- no scale, no transform, data of
       the GEMM's dtype in [rows, cols] order (identity's) -- is multiplied in place */
    const hq_operand_desc *d = &o->st->desc;
    if (d->scale_mode == HQ_SCALE_NONE && d->transform == HQ_TRANSFORM_NONE && d->elem == dt &&
        d->order == HQ_ORDER_MK)
      for (uint32_t i = 0; i < o->st->nbuf; i++) {
        const hq_buffer *b = hq_storage_cbuf(o->st, i);
        if (b->role == HQ_ROLE_DATA && b->ndim == 2 && b->shape[0] == o->r0 &&
            b->shape[1] == o->r1) {
          *data = b->ptr;
          return HQ_OK;
        }
      }
  }
  size_t bytes = (size_t)o->r0 * (size_t)o->r1 * hq_dtype_size(dt);
  *tmp = hqi_ctx_alloc_raw(ctx, bytes ? bytes : 1);
  if (!*tmp)
    return hqi_error(HQ_ENOMEM, "%s: operand %s: %zu bytes for its %s copy on device %d", p->what,
                     o->label, bytes, hq_dtype_name(dt), ctx->device);
  *data = *tmp;
  hq_tensor dst = hq_tensor_2d(*tmp, dt, ctx->device, o->r0, o->r1);
  int rc;
  if (o->hp)
    return hqi_convert(ctx->device, ctx->stream, *tmp, dt, o->hp->data, o->hp->dtype,
                       o->r0 * o->r1);
  const hq_format_ops *ops = &o->fmt->plugin->ops;
  hq_call call;
  hqi_call_init(ctx, &call, o->raw ? HQ_CALL_DEQ_RAW : 0, ctx->offset);
  const int folds = fd && o->raw && ops->tensor_factor && (o->fmt->caps & HQ_CAP_DEQ_FACTOR);
  if (folds) {
    call.factor_out = factor_slot;
    call.factor_in = fd->in;
    call.factor_mul = fd->mul;
  }
  hq_clear_error();
  rc = ops->dequantize(o->fmt->cfg, &call, o->st, &dst);
  if (rc)
    return hqi_error_prefix(rc, "%s: operand %s (role %s, %s format '%s', plugin %s), dequantize",
                            p->what, o->label, o->qt->role, HQI_DIR_NAME(o->dir), o->fmt->name,
                            ops->name);
  if (folds) {
    fd->done = 1;
    *factor = factor_slot;
    return HQ_OK;
  }
  return o->raw ? operand_factor(ctx, p, o, factor_slot, factor) : HQ_OK;
}

// --- the CPU path ------------------------------------------------------------------------------

#ifndef HQ_HAVE_OPENBLAS
/* Column-major C[m x n] = alpha * op(A) * op(B) + beta * C, a blocked loop over transposed
   copies so that every inner product runs over contiguous memory (used when libhqcore is built
   without OpenBLAS). */
static int plain_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
  /* At[i][p] = op(A)(i, p); Bt[j][p] = op(B)(p, j) */
  float *At = hqi_host_alloc((size_t)m * (size_t)k * sizeof(float));
  float *Bt = hqi_host_alloc((size_t)n * (size_t)k * sizeof(float));
  if (!At || !Bt) {
    hqi_host_free(At);
    hqi_host_free(Bt);
    return hqi_error(HQ_ENOMEM, "hq_gemm: CPU path: %lld x %lld and %lld x %lld F32 copies",
                     (long long)m, (long long)k, (long long)n, (long long)k);
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = 0; q < k; q++) At[i * k + q] = ta ? A[i * lda + q] : A[q * lda + i];
  for (int64_t j = 0; j < n; j++)
    for (int64_t q = 0; q < k; q++) Bt[j * k + q] = tb ? B[q * ldb + j] : B[j * ldb + q];
  for (int64_t j = 0; j < n; j++) {
    const float *b = Bt + j * k;
    for (int64_t i = 0; i < m; i++) {
      const float *a = At + i * k;
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t q = 0;
      for (; q + 8 <= k; q += 8)
        for (int u = 0; u < 8; u++) s[u] += a[q + u] * b[q + u];
      for (; q < k; q++) s[0] += a[q] * b[q];
      float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      float *c = &C[j * ldc + i];
      *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
    }
  }
  hqi_host_free(At);
  hqi_host_free(Bt);
  return HQ_OK;
}
#endif

/* D (F32, column-major m x n, ld m) += bias[i] on every column j. */
static void add_bias(float *d, int64_t m, int64_t n, const void *bias, hq_dtype bt) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) d[j * m + i] += hq_load_hp(bias, i, bt);
}

static int cpu_gemm(hq_ctx *ctx, plan *p, float alpha, float beta) {
  const void *a = NULL, *b = NULL;
  void *ta = NULL, *tb = NULL;
  float *td = NULL;
  float fa = 1.0f, fb = 1.0f;
  const float *pfa = NULL, *pfb = NULL;
  int rc = emul_operand(ctx, p, &p->a, HQ_F32, &a, &ta, &fa, &pfa, NULL);
  if (!rc) rc = emul_operand(ctx, p, &p->b, HQ_F32, &b, &tb, &fb, &pfb, NULL);
  float *d = p->d.data;
  const int64_t nd = p->m * p->n;
  if (!rc && p->d.dtype != HQ_F32) {
    td = hqi_host_alloc((size_t)nd * sizeof(float));
    if (!td) {
      rc = hqi_error(HQ_ENOMEM, "%s: an F32 copy of D (%lld elements)", p->what, (long long)nd);
    } else {
      d = td;
      if (beta != 0.0f) hqi_convert(HQ_DEVICE_HOST, NULL, d, HQ_F32, p->d.data, p->d.dtype, nd);
    }
  }
  if (!rc && nd > 0) {
    /* the per-tensor factors multiply alpha: (alpha * fa) * fb, the order the GPU path uses */
    float al = alpha * (pfa ? *pfa : 1.0f);
    al = al * (pfb ? *pfb : 1.0f);
    if (p->k == 0) {
      for (int64_t i = 0; i < nd; i++) d[i] = beta == 0.0f ? 0.0f : beta * d[i];
    } else {
#ifdef HQ_HAVE_OPENBLAS
      cblas_sgemm(CblasColMajor, p->transa ? CblasTrans : CblasNoTrans,
                  p->transb ? CblasTrans : CblasNoTrans, (blasint)p->m, (blasint)p->n,
                  (blasint)p->k, al, a, (blasint)p->a.r1, b, (blasint)p->b.r1, beta, d,
                  (blasint)p->m);
#else
      rc = plain_sgemm(p->transa, p->transb, p->m, p->n, p->k, al, a, p->a.r1, b, p->b.r1, beta,
                       d, p->m);
#endif
    }
    if (!rc && p->args.bias) add_bias(d, p->m, p->n, p->args.bias, p->args.bias_dtype);
    if (!rc && td) hqi_convert(HQ_DEVICE_HOST, NULL, p->d.data, p->d.dtype, d, HQ_F32, nd);
  }
  hqi_ctx_free_raw(ctx, ta);
  hqi_ctx_free_raw(ctx, tb);
  hqi_host_free(td);
  return rc;
}

// --- the emulated GPU path -----------------------------------------------------------------------

static int gpu_gemm(hq_ctx *ctx, plan *p, float alpha, float beta) {
  const hq_dtype dt = p->path == HQ_GEMM_PATH_EMULATED_BF16 ? HQ_BF16 : HQ_F32;
  const void *a = NULL, *b = NULL;
  void *ta = NULL, *tb = NULL;
  float *factors = hqi_ctx_alloc_raw(ctx, 2 * sizeof(float));
  if (!factors) return hqi_error(HQ_ENOMEM, "%s: 8 bytes of device memory", p->what);
  const float *pfa = NULL, *pfb = NULL;
  /* alpha * fa * fb in that order, folded by the dequantize kernels where the modules can (2.3):
     A's writes alpha * fa into factors[0], B's then (alpha * fa) * fb into factors[1] */
  fold fda = {NULL, alpha, 0}, fdb = {NULL, alpha, 0};
  int rc = emul_operand(ctx, p, &p->a, dt, &a, &ta, factors, &pfa, &fda);
  if (fda.done) fdb.in = factors;
  if (!rc) rc = emul_operand(ctx, p, &p->b, dt, &b, &tb, factors + 1, &pfb,
                             fda.done || !pfa ? &fdb : NULL);
  if (!rc) {
    hq_lt_matmul mm;
    memset(&mm, 0, sizeof mm);
    mm.struct_size = sizeof mm;
    mm.a = (hq_lt_operand){a, dt, p->transa, p->a.r1, p->a.r0, p->a.r1, HQ_SCALE_NONE, NULL};
    mm.b = (hq_lt_operand){b, dt, p->transb, p->b.r1, p->b.r0, p->b.r1, HQ_SCALE_NONE, NULL};
    mm.m = p->m;
    mm.n = p->n;
    mm.k = p->k;
    mm.alpha = alpha;
    mm.beta = beta;
    if (fdb.done || (fda.done && !pfb)) {
      mm.alpha_device = fdb.done ? pfb : pfa; /* the whole alpha, folded */
    } else {
      if (fda.done) mm.alpha = 1.0f; /* A's slot holds alpha * fa: (1 * (alpha * fa)) * fb */
      mm.alpha_factor[0] = pfa;
      mm.alpha_factor[1] = pfb;
    }
    mm.d = p->d.data;
    mm.d_dtype = p->d.dtype;
    mm.ldd = p->m;
    mm.bias = p->args.bias;
    mm.bias_dtype = p->args.bias_dtype;
    mm.what = p->what;
    hq_call call;
    hqi_call_init(ctx, &call, 0, ctx->offset);
    rc = hqi_lt_matmul(&call, &mm);
  }
  /* stream-ordered frees: they follow the GEMM that reads the temporaries */
  hqi_ctx_free_raw(ctx, ta);
  hqi_ctx_free_raw(ctx, tb);
  hqi_ctx_free_raw(ctx, factors);
  return rc;
}

// --- the fused GPU path ------------------------------------------------------------------------

static int fused_gemm(hq_ctx *ctx, plan *p, float alpha, float beta) {
  const int x_is_a = p->fused == 1;
  const gop *x = x_is_a ? &p->a : &p->b, *y = x_is_a ? &p->b : &p->a;
  hqi_fused_gemm_args fa = p->fa;
  const void *w = NULL;
  void *tw = NULL;
  float *factors = hqi_ctx_alloc_raw(ctx, 2 * sizeof(float));
  if (!factors) return hqi_error(HQ_ENOMEM, "%s: 8 bytes of device memory", p->what);
  const float *pf = NULL, *px = NULL;
  /* W's factor times 1 (exact: the factor itself) from its dequantize where its module folds
     (2.3), no kernel; X's from tensor_factor(); the kernel multiplies alpha by both, A's first */
  fold fdy = {NULL, 1.0f, 0};
  int rc = emul_operand(ctx, p, y, HQ_BF16, &w, &tw, factors, &pf, &fdy);
  if (!rc) rc = operand_factor(ctx, p, x, factors + 1, &px);
  if (!rc) {
    fa.w = w;
    fa.alpha = alpha;
    fa.beta = beta;
    fa.factor[0] = x_is_a ? px : pf; /* A's factor first, as the emulated path folds them */
    fa.factor[1] = x_is_a ? pf : px;
    fa.bias = p->args.bias;
    fa.bias_dtype = (int)p->args.bias_dtype;
    rc = hqi_fused_gemm(&fa);
  }
  hqi_ctx_free_raw(ctx, tw);
  hqi_ctx_free_raw(ctx, factors);
  return rc;
}

// --- hq_gemm ---------------------------------------------------------------------------------------

int hq_gemm(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb, hq_tensor *D,
            float alpha, float beta, const hq_gemm_args *args, hq_gemm_info *info) {
  if (!D) return hqi_error(HQ_EINVAL, "hq_gemm: D is NULL");
  plan p;
  int rc = prepare(ctx, A, transa, B, transb, D, args, "hq_gemm", 1, &p);
  if (rc) return rc;
  if (!isfinite(alpha) || !isfinite(beta))
    return hqi_error(HQ_EINVAL, "%s: alpha = %g and beta = %g must be finite", p.what, alpha, beta);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  const hqi_fpenv fe = hqi_fp_enter();
  if (p.path == HQ_GEMM_PATH_NATIVE) {
    hq_gemm_problem g;
    fill_problem(&p, &g, alpha, beta, 0);
    hq_call call;
    hqi_call_init(ctx, &call, 0, ctx->offset);
    hq_clear_error();
    const hq_format_ops *ops = &p.a.fmt->plugin->ops;
    rc = ops->gemm(p.a.fmt->cfg, &call, &g);
    if (rc == HQ_ENOTSUP && p.tentative) { /* declined (nothing ran): the emulated path */
      snprintf(p.info.reason, sizeof p.info.reason, "%s", hq_last_error());
      hq_clear_error();
      p.path = p.info.path = emulated_path(ctx, &p);
      rc = p.path == HQ_GEMM_PATH_CPU          ? cpu_gemm(ctx, &p, alpha, beta)
           : p.path == HQ_GEMM_PATH_FUSED_BF16 ? fused_gemm(ctx, &p, alpha, beta)
                                               : gpu_gemm(ctx, &p, alpha, beta);
    } else if (rc) {
      rc = hqi_error_prefix(rc, "%s: module %s, native gemm", p.what, ops->name);
    }
  } else if (p.path == HQ_GEMM_PATH_CPU) {
    rc = cpu_gemm(ctx, &p, alpha, beta);
  } else if (p.path == HQ_GEMM_PATH_FUSED_BF16) {
    rc = fused_gemm(ctx, &p, alpha, beta);
  } else {
    rc = gpu_gemm(ctx, &p, alpha, beta);
  }
  hqi_fp_leave(fe);
  hqi_device_leave(saved);
  if (rc) return rc;
  hqi_log(ctx, 3, "%s: %s path, A %s %s x B %s %s, m=%lld n=%lld k=%lld%s%s", p.what,
          hq_gemm_path_name(p.path), p.info.format_a,
          p.a.dir ? HQI_DIR_NAME(p.a.dir) : "(high precision)", p.info.format_b,
          p.b.dir ? HQI_DIR_NAME(p.b.dir) : "(high precision)", (long long)p.m, (long long)p.n,
          (long long)p.k, p.info.reason[0] ? "; not native: " : "", p.info.reason);
  info_out(&p, info);
  return HQ_OK;
}

// --- linear layers ---------------------------------------------------------------------------------

static const char *role_of(hq_operand o) { return o.qt ? o.qt->role : "high precision"; }

int hq_linear_fprop(hq_ctx *ctx, hq_operand x, hq_operand w, const void *bias,
                    hq_dtype bias_dtype, hq_tensor *y, hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "fprop: weight %s, input %s", role_of(w), role_of(x));
  hq_gemm_args a = {sizeof a, 0, bias, bias_dtype, 0, what};
  /* y[tokens, out] = x[tokens, in] * W[out, in]^T: A = W transposed (rowwise), B = x (rowwise) */
  return hq_gemm(ctx, w, 1, x, 0, y, 1.0f, 0.0f, &a, info);
}

int hq_linear_dgrad(hq_ctx *ctx, hq_operand dy, hq_operand w, hq_tensor *dx, hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "dgrad: weight %s, grad_output %s", role_of(w), role_of(dy));
  hq_gemm_args a = {sizeof a, 0, NULL, HQ_DTYPE_INVALID, 0, what};
  /* dx[tokens, in] = dy[tokens, out] * W[out, in]: A = W (columnwise), B = dy (rowwise) */
  return hq_gemm(ctx, w, 0, dy, 0, dx, 1.0f, 0.0f, &a, info);
}

int hq_linear_wgrad(hq_ctx *ctx, hq_operand x, hq_operand dy, hq_tensor *dw, int accumulate,
                    hq_gemm_info *info) {
  char what[160];
  snprintf(what, sizeof what, "wgrad: input %s, grad_output %s", role_of(x), role_of(dy));
  hq_gemm_args a = {sizeof a, 0, NULL, HQ_DTYPE_INVALID, 0, what};
  /* dW[out, in] = dy^T * x: A = x (columnwise), B = dy transposed (columnwise) */
  return hq_gemm(ctx, x, 0, dy, 1, dw, 1.0f, accumulate ? 1.0f : 0.0f, &a, info);
}

// --- mixture of experts ------------------------------------------------------------------------------

void hq_qtensors_free(hq_qtensor **qts, size_t n) {
  if (!qts) return;
  for (size_t i = 0; i < n; i++) {
    hq_qtensor_free(qts[i]);
    qts[i] = NULL;
  }
}

int hq_quantize_split(hq_quantizer *const *qs, size_t n, hq_ctx *ctx, const hq_tensor *srcp,
                      const int64_t *m_splits, hq_qtensor **out) {
  if (!qs || !ctx || !srcp || !m_splits || !out)
    return hqi_error(HQ_EINVAL, "hq_quantize_split: NULL argument");
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  hq_tensor src;
  int rc = hqi_tensor_in(srcp, "hq_quantize_split: source", &src);
  if (rc) return rc;
  int64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (m_splits[i] < 0 || m_splits[i] > src.rows - sum)
      return hqi_error(HQ_ESHAPE, "hq_quantize_split: m_splits[%zu] = %lld: the splits must be >= 0 "
                       "and sum to the source's %lld rows", i, (long long)m_splits[i],
                       (long long)src.rows);
    sum += m_splits[i];
    if (m_splits[i] && !qs[i])
      return hqi_error(HQ_EINVAL, "hq_quantize_split: expert %zu has %lld rows but no quantizer", i,
                       (long long)m_splits[i]);
  }
  if (sum != src.rows)
    return hqi_error(HQ_ESHAPE, "hq_quantize_split: m_splits sum to %lld, the source has %lld rows",
                     (long long)sum, (long long)src.rows);
  const size_t row_bytes = (size_t)src.cols * hq_dtype_size(src.dtype);
  int64_t row = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!m_splits[i]) continue;
    hq_tensor part = src;
    part.data = (char *)src.data + (size_t)row * row_bytes;
    part.rows = m_splits[i];
    rc = hq_quantize(qs[i], ctx, &part, &out[i]);
    if (rc) rc = hqi_error_prefix(rc, "hq_quantize_split: expert %zu (rows %lld..%lld)", i,
                                  (long long)row, (long long)(row + m_splits[i]));
    row += m_splits[i];
  }
  if (rc) hq_qtensors_free(out, n);
  return rc;
}

int hq_grouped_gemm(hq_ctx *ctx, size_t n, const hq_operand *A, int transa, const hq_operand *B,
                    int transb, hq_tensor *const *D, float alpha, float beta,
                    const hq_gemm_args *args, hq_gemm_info *infos) {
  if (!ctx || (n && (!A || !B || !D))) return hqi_error(HQ_EINVAL, "hq_grouped_gemm: NULL argument");
  uint32_t info_size = infos ? infos[0].struct_size : 0;
  for (size_t i = 0; i < n; i++) {
    int empty_a = !A[i].qt && !A[i].hp, empty_b = !B[i].qt && !B[i].hp;
    hq_gemm_info *info = NULL;
    if (infos) {
      info = (hq_gemm_info *)((char *)infos + i * (info_size ? info_size : sizeof *infos));
      info->struct_size = info_size;
    }
    if (empty_a || empty_b) {
      if (D[i] && D[i]->rows * D[i]->cols != 0)
        return hqi_error(HQ_ESHAPE, "hq_grouped_gemm: group %zu has an empty operand (an expert "
                         "with no rows) but D[%zu] is [%lld, %lld], not empty", i, i,
                         (long long)D[i]->rows, (long long)D[i]->cols);
      if (info && info_size >= offsetof(hq_gemm_info, path) + sizeof(uint32_t))
        info->path = HQ_GEMM_PATH_NONE;
      continue;
    }
    int rc = hq_gemm(ctx, A[i], transa, B[i], transb, D[i], alpha, beta, args, info);
    if (rc) return hqi_error_prefix(rc, "hq_grouped_gemm: group %zu of %zu", i, n);
  }
  return HQ_OK;
}
