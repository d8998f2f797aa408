/* hq.torch's per-call path, compiled into hq._native with the bindings (python/hq/_build.py).
**
** A linear layer's forward is one call here and its backward another, each taking the caller's
** tensors as plain pointers and sizes: building an hq_tensor per operand in Python (cffi struct,
** field by field) cost more host time than the GEMMs' own dispatch. Each function only composes
** public calls of hq/hq.h -- hq_quantize_ex or hq_qtensor_update_ex, then hq_linear_fprop,
** _dgrad and _wgrad -- in the order the bindings make them, so the bytes are the library's own.
** The Python side (hq/torch.py) has checked dtypes, devices, shapes and contiguity first.
**
** An operand's qtensor: when io->qt is not NULL it is updated in place (a qtensor kept from an
** earlier step of the same shape, dtype and directions: no allocation); else a new one is made
** with HQ_QUANTIZE_ALIAS, so an identity format of the source's dtype borrows the source instead
** of copying it, and io->aliased says whether it did (an aliased qtensor cannot be updated, so
** the caller frees it after use instead of keeping it). On failure io->qt still holds what was
** made (the caller owns and frees it) and hqpy_failed_step() names the call that failed.
*/

typedef struct hqpy_io {
  hq_qtensor *qt;
  int aliased;
} hqpy_io;

static __thread const char *hqpy_step = "";

static const char *hqpy_failed_step(void) { return hqpy_step; }

/* The source pointer is the first buffer of the direction the qtensor holds: then it borrows. */
static int hqpy_borrows(const hq_qtensor *qt, const void *src) {
  for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d <<= 1) {
    const hq_storage *s = hq_qtensor_storage(qt, d);
    if (s && s->nbuf > 0 && hq_storage_cbuf(s, 0)->ptr == src) return 1;
  }
  return 0;
}

static int hqpy_quantize(hq_quantizer *q, hq_ctx *ctx, hqpy_io *io, uint32_t dirs,
                         const hq_tensor *src) {
  hq_quantize_args a = HQ_QUANTIZE_ARGS_INIT;
  a.dirs = dirs;
  hqpy_step = "quantize";
  if (io->qt) return hq_qtensor_update_ex(io->qt, ctx, src, &a);
  a.flags = HQ_QUANTIZE_ALIAS;
  int rc = hq_quantize_ex(q, ctx, src, &a, &io->qt);
  if (!rc) io->aliased = hqpy_borrows(io->qt, src->data);
  return rc;
}

/* Data pointers come as integers (torch's data_ptr()), 0 for none: no cast per call in Python. */
static void *hqpy_ptr(uintptr_t p) { return (void *)p; }

/* Forward: quantize x [tokens, in] (directions dirs) into io, then y [tokens, out] = x w^T
   (+ bias[out] when bias is not 0). */
static int hqpy_linear_fwd(hq_ctx *ctx, hq_quantizer *q, hqpy_io *io, uint32_t dirs,
                           uintptr_t x, hq_dtype xdt, int32_t dev, int64_t tokens, int64_t in,
                           const hq_qtensor *qw, uintptr_t bias, hq_dtype bdt, uintptr_t y,
                           hq_dtype ydt, int64_t out) {
  hq_tensor tx = hq_tensor_2d(hqpy_ptr(x), xdt, dev, tokens, in);
  int rc = hqpy_quantize(q, ctx, io, dirs, &tx);
  if (rc) return rc;
  hq_tensor ty = hq_tensor_2d(hqpy_ptr(y), ydt, dev, tokens, out);
  hqpy_step = "linear fprop";
  return hq_linear_fprop(ctx, hq_operand_q(io->qt), hq_operand_q(qw), hqpy_ptr(bias), bdt, &ty,
                         NULL);
}

/* Backward: quantize dy [tokens, out] (directions dirs) into io, then dx [tokens, in] = dy w
   when dx is not 0 and dw [out, in] = dy^T x when dw is not 0. */
static int hqpy_linear_bwd(hq_ctx *ctx, hq_quantizer *q, hqpy_io *io, uint32_t dirs,
                           uintptr_t dy, hq_dtype dydt, int32_t dev, int64_t tokens, int64_t out,
                           const hq_qtensor *qw, const hq_qtensor *qx, int64_t in, uintptr_t dx,
                           hq_dtype dxdt, uintptr_t dw, hq_dtype dwdt) {
  hq_tensor tdy = hq_tensor_2d(hqpy_ptr(dy), dydt, dev, tokens, out);
  int rc = hqpy_quantize(q, ctx, io, dirs, &tdy);
  if (rc) return rc;
  if (dx) {
    hq_tensor tdx = hq_tensor_2d(hqpy_ptr(dx), dxdt, dev, tokens, in);
    hqpy_step = "linear dgrad";
    if ((rc = hq_linear_dgrad(ctx, hq_operand_q(io->qt), hq_operand_q(qw), &tdx, NULL)))
      return rc;
  }
  if (dw) {
    hq_tensor tdw = hq_tensor_2d(hqpy_ptr(dw), dwdt, dev, out, in);
    hqpy_step = "linear wgrad";
    if ((rc = hq_linear_wgrad(ctx, hq_operand_q(qx), hq_operand_q(io->qt), &tdw, 0, NULL)))
      return rc;
  }
  return HQ_OK;
}
