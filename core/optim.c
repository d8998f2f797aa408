/*
** optim.c -- hq_adam_step: AdamW on FP32 master weights (the element rule is hq_adam_elem of
** hq/adamw.h, shared with the CUDA kernels and the modules' fused write-backs) followed by the
** quantized weight's write-back.
*/
#include "config.h"
#include "hq_internal.h"

#include <math.h>

#include "hq/adamw.h"

/* Whether the write-back needs a per-tensor amax that is the max |x| of its source (the new
   master) in every direction it refreshes, so that the step's kernel can make it; not when one
   direction's amax is format-specific (HQ_AMAX_OWN). */
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

int hq_adam_step(hq_ctx *ctx, const hq_adam *ap, const hq_tensor *gradp, float *master, float *m,
                 float *v, hq_qtensor *qw) {
  if (!ctx || !ap) return hqi_error(HQ_EINVAL, "hq_adam_step: NULL argument");
  hq_adam a;
  int rc = hqi_struct_in(&a, sizeof a, ap, ap->struct_size, sizeof(hq_adam), "hq_adam");
  if (rc) return rc;
  hq_tensor g;
  if ((rc = hqi_tensor_in(gradp, "hq_adam_step: gradient", &g))) return rc;
  if (!master)
    return hqi_error(HQ_EINVAL, "hq_adam_step: no FP32 master weights%s: a quantized parameter is "
                     "updated through its master copy, never in its low-precision bytes",
                     qw ? " for the quantized weight" : "");
  if (!m || !v) return hqi_error(HQ_EINVAL, "hq_adam_step: the moments m and v are NULL");
  if (g.device != ctx->device)
    return hqi_error(HQ_EINVAL, "hq_adam_step: the gradient is on device %d, the context runs on "
                     "%d", g.device, ctx->device);
  if (a.step < 1) return hqi_error(HQ_EINVAL, "hq_adam_step: step %lld (the first step is 1)",
                                   (long long)a.step);
  if (!(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1 && a.eps >= 0 &&
        isfinite(a.lr) && isfinite(a.weight_decay)))
    return hqi_error(HQ_EINVAL, "hq_adam_step: beta1 = %g and beta2 = %g must lie in [0, 1), eps "
                     "= %g >= 0, lr = %g and weight_decay = %g finite", a.beta1, a.beta2, a.eps,
                     a.lr, a.weight_decay);
  if (qw && (hq_qtensor_rows(qw) != g.rows || hq_qtensor_cols(qw) != g.cols))
    return hqi_error(HQ_ESHAPE, "hq_adam_step: the quantized weight is [%lld, %lld], the gradient "
                     "[%lld, %lld]", (long long)hq_qtensor_rows(qw),
                     (long long)hq_qtensor_cols(qw), (long long)g.rows, (long long)g.cols);
  hq_adam_consts k; /* made in hq's floating-point mode too: the device step uses them */
  const hqi_fpenv fk = hqi_fp_enter();
  k.lr = a.lr;
  k.b1 = a.beta1;
  k.b2 = a.beta2;
  k.eps = a.eps;
  k.wd = a.weight_decay;
  k.one_minus_b1 = 1.0f - a.beta1;
  k.one_minus_b2 = 1.0f - a.beta2;
  k.c1 = (float)(1.0 / (1.0 - pow((double)a.beta1, (double)a.step)));
  k.c2 = (float)(1.0 / (1.0 - pow((double)a.beta2, (double)a.step)));
  hqi_fp_leave(fk);
  const int64_t n = g.rows * g.cols;
  /* the write-back's source */
  hq_tensor w = hq_tensor_2d(master, HQ_F32, ctx->device, g.rows, g.cols);
  if (ctx->device < 0) {
    const hqi_fpenv fe = hqi_fp_enter();
    for (int64_t i = 0; i < n; i++) hq_adam_at(&k, g.data, g.dtype, master, m, v, i);
    hqi_fp_leave(fe);
    return qw ? hq_qtensor_update(qw, ctx, &w) : HQ_OK;
  }
  if (qw && hq_qtensor_device(qw) == ctx->device) {
    /* the whole step in the format's own write-back kernel, where it can take it (HQ_CAP_FUSED_
       ADAM: one read of master, grad, m and v, one write of master, m, v and every direction) */
    hq_adam_pass pass = {sizeof pass, (uint32_t)g.dtype, g.data, m, v, k};
    rc = hq_qtensor_update_adam(qw, ctx, &w, &pass);
    if (rc != HQ_ENOTSUP) return rc;
    hq_clear_error(); /* not a failure: the two-kernel path below takes the step */
  }
  /* Otherwise the step in the core's kernel, then the format's update. When the write-back needs
     a per-tensor amax of the new master (fp8_tensor with current scaling, nvfp4's global scales)
     the step's kernel computes it in its own pass and hands it to the update
     (hq_quantize_args.amax: the same bytes as the update computing it), so the master is read
     once by the step and once by the format's cast instead of once more for the amax. */
  unsigned int *amax = NULL;
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  if (qw && amax_from_source(qw)) {
    amax = hqi_ctx_alloc_raw(ctx, 2 * sizeof *amax);
    if (!amax) rc = hqi_error(HQ_ENOMEM, "hq_adam_step: 8 bytes on device %d", ctx->device);
    else rc = hqi_ctx_memset(ctx, amax, 0, 2 * sizeof *amax);
  }
  if (!rc) rc = hqi_cuda_adam(ctx->stream, &k, g.data, g.dtype, master, m, v, n, amax);
  hqi_device_leave(saved);
  if (!rc && qw) {
    hq_quantize_args args = {sizeof args, 0, (const float *)amax};
    rc = hq_qtensor_update_ex(qw, ctx, &w, amax ? &args : NULL);
  }
  if (amax) hqi_ctx_free_raw(ctx, amax); /* stream-ordered: after the update that reads it */
  return rc;
}
