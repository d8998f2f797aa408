/*
** adamw.c -- hq_adam_step: AdamW on FP32 master weights (the element rule is hq_adam_elem of
** hq/adamw.h, shared with the CUDA kernel and the modules' fused write-backs) followed by the
** quantized weight's write-back, through libhqcore's public API.
*/
#include "config.h"
#include "svc.h"

#include <math.h>
#include <string.h>

#include "hq/adamw.h"
#include "adamw_cuda.h"

#ifndef HQ_HAVE_CUDA
/* A build without CUDA has no device context: these are never reached. */
int hqt_cuda_enter(int device, int *saved) {
  *saved = -1;
  return device < 0 ? HQ_OK : hq_set_error(HQ_ENOTSUP, "libhqtrain was built without CUDA");
}
void hqt_cuda_leave(int saved) { (void)saved; }
int hqt_cuda_adam(void *stream, const hq_adam_consts *k, const hq_adam_consts *k_dev,
                  const void *grad, int gdtype, float *w, float *m, float *v, int64_t n,
                  unsigned int *amax_bits, int zeroed) {
  (void)stream; (void)k; (void)k_dev; (void)grad; (void)gdtype; (void)w; (void)m; (void)v;
  (void)n; (void)amax_bits; (void)zeroed;
  return hq_set_error(HQ_ENOTSUP, "libhqtrain was built without CUDA");
}
#endif

/* hq_adam_consts_write's bytes are the struct the kernels read: the public size must match it. */
_Static_assert(sizeof(hq_adam_consts) == HQ_ADAM_CONSTS_BYTES,
               "HQ_ADAM_CONSTS_BYTES is not sizeof(hq_adam_consts)");

/* Copy the caller's hq_adam into *a (fields its struct_size lacks zero) and check its fields
   (fn names the call in the message). */
static int check_fields(const hq_adam *ap, const char *fn, hq_adam *a) {
  if (!ap) return hq_set_error(HQ_EINVAL, "%s: NULL argument", fn);
  if (ap->struct_size < HQ_ADAM_SIZE_0_1)
    return hq_set_error(HQ_EINVAL, "%s: hq_adam.struct_size = %zu is smaller than the oldest "
                        "layout (%zu bytes): set it to sizeof(hq_adam)", fn,
                        (size_t)ap->struct_size, (size_t)HQ_ADAM_SIZE_0_1);
  memset(a, 0, sizeof *a);
  memcpy(a, ap, ap->struct_size < sizeof *a ? ap->struct_size : sizeof *a);
  a->struct_size = sizeof *a;
  if (a->step < 1) return hq_set_error(HQ_EINVAL, "%s: step %lld (the first step is 1)", fn,
                                       (long long)a->step);
  if (!(a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 && a->eps >= 0 &&
        isfinite(a->lr) && isfinite(a->weight_decay)))
    return hq_set_error(HQ_EINVAL, "%s: beta1 = %g and beta2 = %g must lie in [0, 1), eps = %g "
                        ">= 0, lr = %g and weight_decay = %g finite", fn, a->beta1, a->beta2,
                        a->eps, a->lr, a->weight_decay);
  return HQ_OK;
}

/* Check the arguments (nothing has changed when this fails) and copy the caller's hq_adam. */
static int check_args(hq_ctx *ctx, const hq_adam *ap, const hq_tensor *gradp, const float *master,
                      const float *m, const float *v, const hq_qtensor *qw, hq_adam *a,
                      hq_tensor *g) {
  if (!ctx) return hq_set_error(HQ_EINVAL, "hq_adam_step: NULL argument");
  int rc = check_fields(ap, "hq_adam_step", a);
  if (rc) return rc;
  rc = hq_tensor_check(gradp, "hq_adam_step: gradient", g);
  if (rc) return rc;
  if (!master)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: no FP32 master weights%s: a quantized "
                        "parameter is updated through its master copy, never in its "
                        "low-precision bytes", qw ? " for the quantized weight" : "");
  if (!m || !v) return hq_set_error(HQ_EINVAL, "hq_adam_step: the moments m and v are NULL");
  if (g->device != hq_ctx_device(ctx))
    return hq_set_error(HQ_EINVAL, "hq_adam_step: the gradient is on device %d, the context "
                        "runs on %d", g->device, hq_ctx_device(ctx));
  if ((uintptr_t)a->consts_dev % 16)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: hq_adam.consts_dev %p is not 16-byte aligned",
                        a->consts_dev);
  if ((uintptr_t)a->amax_dev % 4)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: hq_adam.amax_dev %p is not 4-byte aligned",
                        a->amax_dev);
  if (a->flags & ~HQ_ADAM_AMAX_ZEROED)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: hq_adam.flags = 0x%x has bits hq does not know "
                        "(HQ_ADAM_AMAX_ZEROED is 0x%x)", (unsigned)a->flags,
                        (unsigned)HQ_ADAM_AMAX_ZEROED);
  if ((a->flags & HQ_ADAM_AMAX_ZEROED) && !a->amax_dev)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: hq_adam.flags has HQ_ADAM_AMAX_ZEROED and "
                        "hq_adam.amax_dev is NULL: the flag says the caller's slot is zero, so "
                        "give the slot");
  if (qw && (hq_qtensor_rows(qw) != g->rows || hq_qtensor_cols(qw) != g->cols))
    return hq_set_error(HQ_ESHAPE, "hq_adam_step: the quantized weight is [%lld, %lld], the "
                        "gradient [%lld, %lld]", (long long)hq_qtensor_rows(qw),
                        (long long)hq_qtensor_cols(qw), (long long)g->rows, (long long)g->cols);
  /* the write-back's own refusals, made here because the step would otherwise have written
     master, m and v by the time the update refuses */
  if (qw && hq_qtensor_device(qw) != hq_ctx_device(ctx))
    return hq_set_error(HQ_EINVAL, "hq_adam_step: the quantized weight (role %s) lives on device "
                        "%d, the context runs on %d", hq_qtensor_role(qw),
                        hq_qtensor_device(qw), hq_ctx_device(ctx));
  if (qw && hq_qtensor_is_saved(qw))
    return hq_set_error(HQ_ESTATE, "hq_adam_step: the quantized weight (role %s) is saved "
                        "(restore it first)", hq_qtensor_role(qw));
  if (g->device >= 0) {
    /* a graph replays kernel arguments as captured: the constants must come from memory */
    int capturing = 0;
    rc = hq_ctx_capturing(ctx, &capturing);
    if (rc) return rc;
    if (capturing && !a->consts_dev)
      return hq_set_error(HQ_ESTATE, "hq_adam_step: the context's stream is being captured into "
                          "a CUDA graph and hq_adam.consts_dev is NULL: the step's constants "
                          "(lr, c1, c2) would be frozen in the graph at their values of step "
                          "%lld; give hq_adam.consts_dev and fill it before each replay "
                          "(hq_adam_consts_write)", (long long)a->step);
  }
  return HQ_OK;
}

/* The step's constants, made in hq's floating-point mode too: the device step uses them. */
static hq_adam_consts step_consts(const hq_adam *a) {
  hq_adam_consts k;
  const hq_fpenv fk = hq_fpenv_enter();
  k.lr = a->lr;
  k.b1 = a->beta1;
  k.b2 = a->beta2;
  k.eps = a->eps;
  k.wd = a->weight_decay;
  k.one_minus_b1 = 1.0f - a->beta1;
  k.one_minus_b2 = 1.0f - a->beta2;
  k.c1 = (float)(1.0 / (1.0 - pow((double)a->beta1, (double)a->step)));
  k.c2 = (float)(1.0 / (1.0 - pow((double)a->beta2, (double)a->step)));
  hq_fpenv_leave(fk);
  return k;
}

/* Whether the write-back needs a per-tensor amax that is the max |x| of its source (the new
   master) in every direction it refreshes: then the step's kernel makes it in its own pass and
   hands it to the update (hq_quantize_args.amax: the same bytes as the update computing it).
   Not when one direction's amax is format-specific (HQ_AMAX_OWN). */
static int amax_from_source(const hq_qtensor *qw) {
  const uint32_t dirs = hq_qtensor_usage(qw) & hq_qtensor_dirs(qw);
  int need = 0;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    if (!(dirs & dir)) continue;
    const uint32_t kind = hq_qtensor_amax_kind(qw, dir);
    if (kind == HQ_AMAX_OWN) return 0;
    if (kind == HQ_AMAX_INPUT) need = 1;
  }
  return need;
}

/* The step in the trainer services' kernel, then the format's update. When the write-back needs
   a per-tensor amax of the new master (fp8_tensor with current scaling, nvfp4's global scales)
   the step's kernel computes it, so the master is read once by the step and once by the
   format's cast instead of once more for the amax. */
static int device_step(hq_ctx *ctx, const hq_adam_consts *k, const hq_adam_consts *k_dev,
                       const hq_adam *a, const hq_tensor *g, hq_tensor *w, float *m, float *v,
                       hq_qtensor *qw) {
  const int device = hq_ctx_device(ctx);
  void *amax = NULL, *owned = NULL;   /* the caller's slot, or one of this call's */
  int saved, rc = hqt_cuda_enter(device, &saved);
  if (rc) return rc;
  /* the write-back's amax: qw's when it takes the new master's, or, without qw, the caller's
     own write-back's when it gives a slot (hq/train.h) */
  if (qw ? amax_from_source(qw) : a->amax_dev != NULL) {
    amax = a->amax_dev;
    if (!amax && hq_ctx_alloc(ctx, HQ_ADAM_AMAX_BYTES, &owned))
      rc = hq_set_error(HQ_ENOMEM, "hq_adam_step: 8 bytes on device %d", device);
    if (!amax) amax = owned;
  }
  /* only the caller's slot can be promised zero: this call's allocation is not */
  const int zeroed = amax && !owned && (a->flags & HQ_ADAM_AMAX_ZEROED);
  if (!rc)
    rc = hqt_cuda_adam(hq_ctx_stream(ctx), k, k_dev, g->data, g->dtype, w->data, m, v,
                       g->rows * g->cols, amax, zeroed);
  hqt_cuda_leave(saved);
  if (!rc && qw) {
    hq_quantize_args args = {.struct_size = sizeof args, .amax = (const float *)amax};
    rc = hq_qtensor_update_ex(qw, ctx, w, amax ? &args : NULL);
  }
  hq_ctx_free(ctx, owned); /* stream-ordered: after the update that reads it */
  return rc;
}

int hq_adam_step(hq_ctx *ctx, const hq_adam *ap, const hq_tensor *gradp, float *master, float *m,
                 float *v, hq_qtensor *qw) {
  hq_adam a = {0}; /* set by check_args (zeroed: GCC cannot see it through the early returns) */
  hq_tensor g = {0};
  int rc = check_args(ctx, ap, gradp, master, m, v, qw, &a, &g);
  if (rc) return rc;
  const hq_adam_consts *k_dev = a.consts_dev;
  /* a host context's "device memory" is host memory: the step applies what the slot holds */
  const hq_adam_consts k = k_dev && hq_ctx_device(ctx) < 0 ? *k_dev : step_consts(&a);
  const int64_t n = g.rows * g.cols;
  /* the write-back's source */
  hq_tensor w = hq_tensor_2d(master, HQ_F32, hq_ctx_device(ctx), g.rows, g.cols);
  if (hq_ctx_device(ctx) < 0) {
    const hq_fpenv fe = hq_fpenv_enter();
    for (int64_t i = 0; i < n; i++) hq_adam_at(&k, g.data, g.dtype, master, m, v, i);
    hq_fpenv_leave(fe);
    return qw ? hq_qtensor_update(qw, ctx, &w) : HQ_OK;
  }
  if (qw) {
    /* the whole step in the format's own write-back kernel, where it can take it (HQ_CAP_FUSED_
       ADAM: one read of master, grad, m and v, one write of master, m, v and every direction) */
    hq_adam_pass pass = {sizeof pass, (uint32_t)g.dtype, g.data, m, v, k, k_dev};
    rc = hq_qtensor_update_adam(qw, ctx, &w, &pass);
    if (rc != HQ_ENOTSUP) return rc;
    hq_clear_error(); /* not a failure: the two-kernel path below takes the step */
  }
  return device_step(ctx, &k, k_dev, &a, &g, &w, m, v, qw);
}

int hq_adam_consts_write(const hq_adam *ap, void *host_dst) {
  hq_adam a;
  int rc = check_fields(ap, "hq_adam_consts_write", &a);
  if (rc) return rc;
  if (!host_dst) return hq_set_error(HQ_EINVAL, "hq_adam_consts_write: host_dst is NULL");
  const hq_adam_consts k = step_consts(&a);
  memcpy(host_dst, &k, sizeof k);
  return HQ_OK;
}
