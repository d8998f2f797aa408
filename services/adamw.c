/*
** adamw.c -- hq_adam_step: AdamW on FP32 master weights (the element rule is hq_adam_elem of
** hq/adamw.h, shared with the CUDA kernel and the modules' fused write-backs) followed by the
** quantized weight's write-back, through libhqcore's public API.
*/
#include "config.h"
#include "svc.h"

#include <math.h>

#include "hq/adamw.h"
#include "adamw_cuda.h"

#ifndef HQ_HAVE_CUDA
/* A build without CUDA has no device context: these are never reached. */
int hqt_cuda_enter(int device, int *saved) {
  *saved = -1;
  return device < 0 ? HQ_OK : hq_set_error(HQ_ENOTSUP, "libhqtrain was built without CUDA");
}
void hqt_cuda_leave(int saved) { (void)saved; }
int hqt_cuda_adam(void *stream, const hq_adam_consts *k, const void *grad, int gdtype, float *w,
                  float *m, float *v, int64_t n, unsigned int *amax_bits) {
  (void)stream; (void)k; (void)grad; (void)gdtype; (void)w; (void)m; (void)v; (void)n;
  (void)amax_bits;
  return hq_set_error(HQ_ENOTSUP, "libhqtrain was built without CUDA");
}
#endif

/* Check the arguments (nothing has changed when this fails) and copy the caller's hq_adam. */
static int check_args(hq_ctx *ctx, const hq_adam *ap, const hq_tensor *gradp, const float *master,
                      const float *m, const float *v, const hq_qtensor *qw, hq_adam *a,
                      hq_tensor *g) {
  if (!ctx || !ap) return hq_set_error(HQ_EINVAL, "hq_adam_step: NULL argument");
  if (ap->struct_size < sizeof(hq_adam)) /* every field is of the first layout */
    return hq_set_error(HQ_EINVAL, "hq_adam.struct_size = %zu is smaller than the oldest layout "
                        "(%zu bytes): set it to sizeof(hq_adam)", (size_t)ap->struct_size,
                        sizeof(hq_adam));
  *a = *ap;
  int rc = hq_tensor_check(gradp, "hq_adam_step: gradient", g);
  if (rc) return rc;
  if (!master)
    return hq_set_error(HQ_EINVAL, "hq_adam_step: no FP32 master weights%s: a quantized "
                        "parameter is updated through its master copy, never in its "
                        "low-precision bytes", qw ? " for the quantized weight" : "");
  if (!m || !v) return hq_set_error(HQ_EINVAL, "hq_adam_step: the moments m and v are NULL");
  if (g->device != hq_ctx_device(ctx))
    return hq_set_error(HQ_EINVAL, "hq_adam_step: the gradient is on device %d, the context "
                        "runs on %d", g->device, hq_ctx_device(ctx));
  if (a->step < 1) return hq_set_error(HQ_EINVAL, "hq_adam_step: step %lld (the first step is 1)",
                                       (long long)a->step);
  if (!(a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 && a->eps >= 0 &&
        isfinite(a->lr) && isfinite(a->weight_decay)))
    return hq_set_error(HQ_EINVAL, "hq_adam_step: beta1 = %g and beta2 = %g must lie in [0, 1), "
                        "eps = %g >= 0, lr = %g and weight_decay = %g finite", a->beta1,
                        a->beta2, a->eps, a->lr, a->weight_decay);
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
static int device_step(hq_ctx *ctx, const hq_adam_consts *k, const hq_tensor *g, hq_tensor *w,
                       float *m, float *v, hq_qtensor *qw) {
  const int device = hq_ctx_device(ctx);
  void *amax = NULL;
  int saved, rc = hqt_cuda_enter(device, &saved);
  if (rc) return rc;
  if (qw && amax_from_source(qw) && hq_ctx_alloc(ctx, 2 * sizeof(unsigned int), &amax))
    rc = hq_set_error(HQ_ENOMEM, "hq_adam_step: 8 bytes on device %d", device);
  if (!rc)
    rc = hqt_cuda_adam(hq_ctx_stream(ctx), k, g->data, g->dtype, w->data, m, v, g->rows * g->cols,
                       amax);
  hqt_cuda_leave(saved);
  if (!rc && qw) {
    hq_quantize_args args = {.struct_size = sizeof args, .amax = (const float *)amax};
    rc = hq_qtensor_update_ex(qw, ctx, w, amax ? &args : NULL);
  }
  hq_ctx_free(ctx, amax); /* stream-ordered: after the update that reads it */
  return rc;
}

int hq_adam_step(hq_ctx *ctx, const hq_adam *ap, const hq_tensor *gradp, float *master, float *m,
                 float *v, hq_qtensor *qw) {
  hq_adam a = {0}; /* set by check_args (zeroed: GCC cannot see it through the early returns) */
  hq_tensor g = {0};
  int rc = check_args(ctx, ap, gradp, master, m, v, qw, &a, &g);
  if (rc) return rc;
  const hq_adam_consts k = step_consts(&a);
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
    hq_adam_pass pass = {sizeof pass, (uint32_t)g.dtype, g.data, m, v, k};
    rc = hq_qtensor_update_adam(qw, ctx, &w, &pass);
    if (rc != HQ_ENOTSUP) return rc;
    hq_clear_error(); /* not a failure: the two-kernel path below takes the step */
  }
  return device_step(ctx, &k, &g, &w, m, v, qw);
}
