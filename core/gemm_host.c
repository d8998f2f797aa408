/*
** gemm_host.c -- the services GEMM providers get from the core (hq_gemm_host): an operand's raw
** values and its per-tensor factor, through the operand's own format module. The operand handle
** a provider passes back is the hqi_gop hq_gemm resolved (gemm.c).
*/
#include "config.h"
#include "hq_internal.h"

#include <string.h>

/* Whether storage st of an operand [r0, r1] holds its own raw values in dtype dt: no scale, no
   transform, elements of dt in [M, K] order in a data buffer of exactly that shape (identity's
   storages), so that a GEMM can read it in place. */
static const void *raw_in_place(const hqi_gop *g, hq_dtype dt) {
  const hq_operand_desc *d = &g->pub.st->desc;
  if ((g->kind.flags & (HQ_GEMM_OP_RAW | HQ_GEMM_OP_FACTOR)) != HQ_GEMM_OP_RAW ||
      d->scale_mode != HQ_SCALE_NONE || d->transform != HQ_TRANSFORM_NONE || d->elem != dt ||
      d->order != HQ_ORDER_MK)
    return NULL;
  const hq_buffer *b = hq_storage_role(g->pub.st, HQ_ROLE_DATA);
  return b && b->ndim == 2 && b->shape[0] == g->pub.rows && b->shape[1] == g->pub.cols ? b->ptr
                                                                                        : NULL;
}

static int svc_raw(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt,
                   const void **data, void **tmp, hq_gemm_fold *fold) {
  const hqi_gop *g = o ? o->handle : NULL;
  hq_ctx *ctx = call ? call->core_private : NULL;
  if (!g || !ctx || !data || !tmp || (dt != HQ_F32 && dt != HQ_BF16))
    return hqi_error(HQ_EINVAL, "hq_gemm_host.raw: an operand hq_gemm did not hand out, a call "
                     "without its context, or dtype %s (f32 or bf16)", hq_dtype_name(dt));
  *tmp = NULL;
  if (fold) fold->done = 0;
  if (g->qt ? (*data = raw_in_place(g, dt)) != NULL : g->hp.dtype == dt) {
    if (!g->qt) *data = g->hp.data;
    return HQ_OK;
  }
  const int64_t n = g->pub.rows * g->pub.cols;
  const size_t bytes = (size_t)n * hq_dtype_size(dt);
  *tmp = hqi_ctx_alloc_raw(ctx, bytes ? bytes : 1);
  if (!*tmp)
    return hqi_error(HQ_ENOMEM, "%s: operand %s: %zu bytes for its %s copy on device %d", g->what,
                     g->label, bytes, hq_dtype_name(dt), ctx->device);
  *data = *tmp;
  if (!g->qt) return hqi_convert(ctx->device, ctx->stream, *tmp, dt, g->hp.data, g->hp.dtype, n);
  hq_tensor dst = hq_tensor_2d(*tmp, dt, ctx->device, g->pub.rows, g->pub.cols);
  const hq_format_ops *ops = &g->fmt->plugin->ops;
  hq_call c;
  hqi_call_init(ctx, &c, (g->kind.flags & HQ_GEMM_OP_RAW) ? HQ_CALL_DEQ_RAW : 0, ctx->offset);
  const int folds = fold && (g->kind.flags & HQ_GEMM_OP_FOLDS);
  if (folds) {
    c.factor_out = fold->out;
    c.factor_in = fold->in;
    c.factor_mul = fold->mul;
  }
  hq_clear_error();
  int rc = hqi_plugin_rc(ops->dequantize(g->fmt->cfg, &c, g->pub.st, &dst), ops->name,
                         "dequantize");
  if (rc)
    return hqi_error_prefix(rc, "%s: operand %s (role %s, %s format '%s', plugin %s), dequantize",
                            g->what, g->label, g->qt->role, hq_dir_name(g->kind.dir),
                            g->fmt->name, ops->name);
  if (folds) fold->done = 1;
  return HQ_OK;
}

static int svc_factor(const hq_call *call, const hq_gemm_operand *o, float *out) {
  const hqi_gop *g = o ? o->handle : NULL;
  hq_ctx *ctx = call ? call->core_private : NULL;
  if (!g || !ctx || !out)
    return hqi_error(HQ_EINVAL, "hq_gemm_host.factor: an operand hq_gemm did not hand out, a "
                     "call without its context, or no output");
  if (!(g->kind.flags & HQ_GEMM_OP_FACTOR))
    return hqi_error(HQ_EINVAL, "%s: operand %s (%s) has no per-tensor factor", g->what, g->label,
                     g->kind.format);
  const hq_format_ops *ops = &g->fmt->plugin->ops;
  hq_call c;
  hqi_call_init(ctx, &c, 0, ctx->offset);
  hq_clear_error();
  int rc = hqi_plugin_rc(ops->tensor_factor(g->fmt->cfg, &c, g->pub.st, out), ops->name,
                         "tensor_factor");
  if (rc)
    return hqi_error_prefix(rc, "%s: operand %s (role %s, plugin %s), tensor_factor", g->what,
                            g->label, g->qt->role, ops->name);
  return HQ_OK;
}

const hq_gemm_host hqi_gemm_host = {
    .abi_major = HQ_GEMM_ABI_MAJOR,
    .abi_minor = HQ_GEMM_ABI_MINOR,
    .struct_size = sizeof(hq_gemm_host),
    .api = &hqi_host_api,
    .raw = svc_raw,
    .factor = svc_factor,
};
