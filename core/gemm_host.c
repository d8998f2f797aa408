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

/* The raw-values buffer (HQ_ROLE_RAW) of g's storage when it is of dtype dt and the tensor's
   shape: what the format's quantize wrote beside the data, read in place. */
static const void *raw_copy(const hqi_gop *g, hq_dtype dt) {
  const hq_buffer *b = hq_storage_role(g->pub.st, HQ_ROLE_RAW);
  return b && b->dtype == dt && b->ndim == 2 && b->shape[0] == g->pub.rows &&
                 b->shape[1] == g->pub.cols
             ? b->ptr
             : NULL;
}

/* A storage operand's own memory holding its raw values in dt (raw_in_place or raw_copy), or
   NULL: they must be dequantized. */
static const void *stored_raw(const hqi_gop *g, hq_dtype dt) {
  const void *p = raw_in_place(g, dt);
  return p ? p : raw_copy(g, dt);
}

/* The checks every raw request starts with. */
static int raw_args(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt, const void **data,
                    void **tmp) {
  if (!o || !o->handle || !call || !call->core_private || !data || !tmp ||
      (dt != HQ_F32 && dt != HQ_BF16))
    return hqi_error(HQ_EINVAL, "hq_gemm_host.raw: an operand hq_gemm did not hand out, a call "
                     "without its context, or dtype %s (f32 or bf16)", hq_dtype_name(dt));
  return HQ_OK;
}

/* The first half of a raw request: *data the operand's own memory when it holds its raw values
   in dt, in its data or in a raw-values buffer (*tmp NULL, nothing to fill), else a temporary
   from the context's scratch on its stream (*tmp = *data; host->free gives it back), which
   raw_fill then fills. */
static int raw_prepare(hq_ctx *ctx, const hqi_gop *g, hq_dtype dt, const void **data,
                       void **tmp) {
  *tmp = NULL;
  if (g->qt ? (*data = stored_raw(g, dt)) != NULL : g->hp.dtype == dt) {
    if (!g->qt) *data = g->hp.data;
    return HQ_OK;
  }
  const size_t bytes = (size_t)(g->pub.rows * g->pub.cols) * hq_dtype_size(dt);
  *tmp = hqi_ctx_scratch_alloc(ctx, bytes ? bytes : 1, ctx->stream);
  if (!*tmp)
    return hqi_error(HQ_ENOMEM, "%s: operand %s: %zu bytes for its %s copy on device %d", g->what,
                     g->label, bytes, hq_dtype_name(dt), ctx->device);
  *data = *tmp;
  return HQ_OK;
}

/* The dequantize call that fills tmp with storage operand g's raw values in dt on `stream`:
   *c and *dst, with the fold when the module folds (returned: 1) and row_factors (raw_rows: the
   values without the per-row factors, which go there). */
static int raw_call(hq_ctx *ctx, const hqi_gop *g, hq_dtype dt, void *tmp,
                    const hq_gemm_fold *fold, void *stream, float *row_factors, hq_call *c,
                    hq_tensor *dst) {
  *dst = hq_tensor_2d(tmp, dt, ctx->device, g->pub.rows, g->pub.cols);
  hqi_call_init(ctx, c, (g->kind.flags & HQ_GEMM_OP_RAW) ? HQ_CALL_DEQ_RAW : 0, ctx->offset);
  c->stream = stream;
  c->row_factor_out = row_factors;
  const int folds = fold && (g->kind.flags & HQ_GEMM_OP_FOLDS);
  if (folds) {
    c->factor_out = fold->out;
    c->factor_in = fold->in;
    c->factor_mul = fold->mul;
  }
  return folds;
}

/* The error of a failed dequantize of g (rc, the module's message kept). */
static int raw_failed(int rc, const hqi_gop *g, const char *op) {
  return hqi_error_prefix(rc, "%s: operand %s (role %s, %s format '%s', plugin %s), %s", g->what,
                          g->label, g->qt->role, hq_dir_name(g->kind.dir), g->fmt->name,
                          g->fmt->plugin->ops.name, op);
}

/* The second half: the operand's raw values in dt into tmp, queued on `stream` (the context's,
   or the side stream of a pair); with row_factors (raw_rows) the values without the per-row
   factors, which go there. */
static int raw_fill(hq_ctx *ctx, const hqi_gop *g, hq_dtype dt, void *tmp, hq_gemm_fold *fold,
                    void *stream, float *row_factors) {
  const int64_t n = g->pub.rows * g->pub.cols;
  if (!g->qt) return hqi_convert(ctx->device, stream, tmp, dt, g->hp.data, g->hp.dtype, n);
  const hq_format_ops *ops = &g->fmt->plugin->ops;
  hq_call c;
  hq_tensor dst;
  const int folds = raw_call(ctx, g, dt, tmp, fold, stream, row_factors, &c, &dst);
  hq_clear_error();
  int rc = hqi_plugin_rc(ops->dequantize(g->fmt->cfg, &c, g->pub.st, &dst), ops->name,
                         "dequantize");
  if (rc) return raw_failed(rc, g, row_factors ? "dequantize with row factors" : "dequantize");
  if (folds) fold->done = 1;
  return HQ_OK;
}

/* Whether the fills of storage operands ga and gb (both needing one) go to their module as one
   request: one module (the same code, whichever plugin set loaded it), which offers
   dequantize_pair (format ABI 2.6; its table is past 2.1's, so both calls are raw ones). */
static int joint_fill(const hqi_gop *ga, const hqi_gop *gb) {
  return ga->qt && gb->qt && ga->fmt->plugin->ops.dequantize_pair != NULL &&
         ga->fmt->plugin->ops.dequantize_pair == gb->fmt->plugin->ops.dequantize_pair;
}

/* Both fills as one request on the context's stream: HQ_ENOTSUP (nothing queued, no error
   left) when the module declines the pair, so that the caller fills them another way. With
   `chain` (fb reads fa's product) fb is folded only where fa is. */
static int raw_fill_joint(hq_ctx *ctx, const hqi_gop *ga, hq_dtype dta, void *tmp_a,
                          hq_gemm_fold *fa, const hqi_gop *gb, hq_dtype dtb, void *tmp_b,
                          hq_gemm_fold *fb, int chain) {
  const hq_format_ops *ops = &ga->fmt->plugin->ops;
  hq_call ca, cb;
  hq_tensor da, db;
  const int folds_a = raw_call(ctx, ga, dta, tmp_a, fa, ctx->stream, NULL, &ca, &da);
  const int folds_b = raw_call(ctx, gb, dtb, tmp_b, chain && !folds_a ? NULL : fb, ctx->stream,
                               NULL, &cb, &db);
  hq_clear_error();
  int rc = ops->dequantize_pair(ga->fmt->cfg, &ca, ga->pub.st, &da, gb->fmt->cfg, &cb,
                                gb->pub.st, &db);
  if (rc == HQ_ENOTSUP) {
    hq_clear_error();
    return HQ_ENOTSUP;
  }
  rc = hqi_plugin_rc(rc, ops->name, "dequantize_pair");
  if (rc)
    return hqi_error_prefix(rc, "%s: operands %s (role %s, %s format '%s') and %s (role %s, %s "
                            "format '%s'), plugin %s, dequantize_pair", ga->what, ga->label,
                            ga->qt->role, hq_dir_name(ga->kind.dir), ga->fmt->name, gb->label,
                            gb->qt->role, hq_dir_name(gb->kind.dir), gb->fmt->name, ops->name);
  if (folds_a) fa->done = 1;
  if (folds_b) fb->done = 1;
  return HQ_OK;
}

static int svc_raw(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt,
                   const void **data, void **tmp, hq_gemm_fold *fold) {
  int rc = raw_args(call, o, dt, data, tmp);
  if (rc) return rc;
  hq_ctx *ctx = call->core_private;
  const hqi_gop *g = o->handle;
  if (fold) fold->done = 0;
  rc = raw_prepare(ctx, g, dt, data, tmp);
  return rc || !*tmp ? rc : raw_fill(ctx, g, dt, *tmp, fold, ctx->stream, NULL);
}

/* raw() of a and of b with folds fa and fb (NULL: none). Where both need a fill: as one request
   to their module where it offers one (joint_fill), else side by side on a CUDA device: b's on
   the context's stream, a's on the context's side stream, forked from it after both temporaries
   are allocated there and joined back before this returns (also when a fill fails, so that a
   capture stays whole). In turn without a side stream (none can be made, or none was made
   before a capture began: making one is not capture work) and for a chain (fb reads fa's
   product, folded only where fa's is). */
static int svc_raw_pair_fold(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
                             const void **data_a, void **tmp_a, hq_gemm_fold *fa,
                             const hq_gemm_operand *b, hq_dtype dtb, const void **data_b,
                             void **tmp_b, hq_gemm_fold *fb) {
  int rc = raw_args(call, a, dta, data_a, tmp_a);
  if (!rc) rc = raw_args(call, b, dtb, data_b, tmp_b);
  if (rc) return rc;
  if (fa) fa->done = 0;
  if (fb) fb->done = 0;
  /* A's fold reading B's product would read it before B's dequantize writes it */
  if (fa && fb && fb->out && fa->in == fb->out)
    return hqi_error(HQ_EINVAL, "hq_gemm_host.raw_pair_fold: A's fold reads B's product, which "
                     "B's dequantize writes after A's (B's may read A's)");
  const int chain = fa && fb && fa->out && fb->in == fa->out;
  hq_ctx *ctx = call->core_private;
  const hqi_gop *ga = a->handle, *gb = b->handle;
  *tmp_b = NULL;
  rc = raw_prepare(ctx, ga, dta, data_a, tmp_a);
  if (!rc) rc = raw_prepare(ctx, gb, dtb, data_b, tmp_b);
  if (rc) return rc;
  if (*tmp_a && *tmp_b && joint_fill(ga, gb)) {
    rc = raw_fill_joint(ctx, ga, dta, *tmp_a, fa, gb, dtb, *tmp_b, fb, chain);
    if (rc != HQ_ENOTSUP) return rc;
  }
  void *side = *tmp_a && *tmp_b && !chain ? hqi_ctx_side_stream(ctx) : NULL;
  if (!side) {
    if (*tmp_a) rc = raw_fill(ctx, ga, dta, *tmp_a, fa, ctx->stream, NULL);
    if (!rc && *tmp_b)
      rc = raw_fill(ctx, gb, dtb, *tmp_b, chain && !fa->done ? NULL : fb, ctx->stream, NULL);
    return rc;
  }
  rc = hqi_cuda_event_record(&ctx->side_ev[0], ctx->stream);
  if (!rc) rc = hqi_cuda_stream_wait_event(side, ctx->side_ev[0]);
  if (rc) return rc; /* nothing forked */
  rc = raw_fill(ctx, ga, dta, *tmp_a, fa, side, NULL);
  if (!rc) rc = raw_fill(ctx, gb, dtb, *tmp_b, fb, ctx->stream, NULL); /* beside a's */
  int jrc = hqi_cuda_event_record(&ctx->side_ev[1], side);
  if (!jrc) jrc = hqi_cuda_stream_wait_event(ctx->stream, ctx->side_ev[1]);
  return rc ? rc : jrc;
}

static int svc_raw_pair(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
                        const void **data_a, void **tmp_a, const hq_gemm_operand *b,
                        hq_dtype dtb, const void **data_b, void **tmp_b) {
  return svc_raw_pair_fold(call, a, dta, data_a, tmp_a, NULL, b, dtb, data_b, tmp_b, NULL);
}

/* Whether raw_pair of a and b would be one request to their module (gemm_provider.h). */
static int svc_joint(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
                     const hq_gemm_operand *b, hq_dtype dtb) {
  const void *data;
  void *tmp;
  if (raw_args(call, a, dta, &data, &tmp) || raw_args(call, b, dtb, &data, &tmp)) {
    hq_clear_error();
    return 0;
  }
  const hqi_gop *ga = a->handle, *gb = b->handle;
  return joint_fill(ga, gb) && !stored_raw(ga, dta) && !stored_raw(gb, dtb);
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

/* The raw values of a storage with per-row factors, split: the values without them into one
   temporary, the factors (one per stored row) into another, by one raw dequantize that writes
   both (raw_fill with call->row_factor_out). */
static int svc_raw_rows(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt, void **data,
                        float **factors, hq_gemm_fold *fold) {
  if (data) *data = NULL;
  if (factors) *factors = NULL;
  if (fold) fold->done = 0;
  const void *unused = NULL;
  void *tmp = NULL;
  int rc = raw_args(call, o, dt, data ? &unused : NULL, factors ? &tmp : NULL);
  if (rc) return rc;
  hq_ctx *ctx = call->core_private;
  const hqi_gop *g = o->handle;
  if (!g->qt || !(g->kind.flags & HQ_GEMM_OP_ROWF))
    return hqi_error(HQ_EINVAL, "%s: operand %s (%s) has no per-row factors (its format does not "
                     "declare HQ_CAP_DEQ_ROW_FACTOR)", g->what, g->label, g->kind.format);
  const int64_t outer = g->kind.dir == HQ_ROWWISE ? g->pub.rows : g->pub.cols;
  const size_t bytes = (size_t)(g->pub.rows * g->pub.cols) * hq_dtype_size(dt);
  *data = hqi_ctx_scratch_alloc(ctx, bytes ? bytes : 1, ctx->stream);
  if (*data)
    *factors = hqi_ctx_scratch_alloc(ctx, outer ? (size_t)outer * sizeof(float) : 1, ctx->stream);
  if (!*data || !*factors)
    return hqi_error(HQ_ENOMEM, "%s: operand %s: %zu bytes for its %s values and %lld row "
                     "factors on device %d", g->what, g->label, bytes, hq_dtype_name(dt),
                     (long long)outer, ctx->device);
  return raw_fill(ctx, g, dt, *data, fold, ctx->stream, *factors);
}

/* Outside a capture this also makes the context's side stream if it has none: a provider asks
   before it would fork, and a capture that follows cannot make one (it is not capture work), so
   a context whose eager calls never forked would otherwise chain every captured pair. */
static int svc_capturing(const hq_call *call) {
  hq_ctx *ctx = call ? call->core_private : NULL;
  if (!ctx || ctx->device < 0) return 0;
  if (hqi_cuda_capturing(ctx->stream)) return 1;
  (void)hqi_ctx_side_stream(ctx);
  return 0;
}

const hq_gemm_host hqi_gemm_host = {
    .abi_major = HQ_GEMM_ABI_MAJOR,
    .abi_minor = HQ_GEMM_ABI_MINOR,
    .struct_size = sizeof(hq_gemm_host),
    .api = &hqi_host_api,
    .raw = svc_raw,
    .factor = svc_factor,
    .raw_pair = svc_raw_pair,
    .raw_rows = svc_raw_rows,
    .raw_pair_fold = svc_raw_pair_fold,
    .capturing = svc_capturing,
    .joint = svc_joint,
};
