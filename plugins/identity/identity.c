/*
** identity.c -- the high-precision passthrough format. One source, built twice (as SQLite builds
** an extension with SQLITE_CORE): into libhqcore, with HQ_FORMAT_BUILTIN naming the internal
** entry function the loader registers in every plugin set (it cannot go missing: a role or
** direction a recipe leaves unset stays in high precision through it), and as a module of its
** own (identity.la, for make check) whose hq_format_module_v2 the loader would reject as a
** duplicate of the built-in. Either way it sees the core only through the ABI: the element
** conversion is the host's convert service, never a libhqcore function.
**
** Stores the tensor as it is (or cast to `dtype`). One buffer serves both directions: when both
** are made together the columnwise storage shares the rowwise buffer; a GEMM reads it transposed
** through its layout flags. No scale, no amax, no padding (docs/formats.md).
**
** Buffers (save order): rowwise "data" [rows, cols] of the storage dtype (FSDP: gathered by
** rows); columnwise the same buffer shared (name "data") or, made alone, its own
** "columnwise_data" [rows, cols]. desc: elem = the storage dtype, order MK, no scale.
** That is a plain copy (HQ_CAP_PLAIN_COPY): in a hybrid whose other direction's module writes
** such a copy from its own read (HQ_CAP_COPY_OUT), the core makes no call of this one.
*/
#include "config.h"

#include <stddef.h>
#include <stdint.h>

#include "hq/plugin.h"
#include "identity.h"

typedef struct identity_cfg {
  int dtype; /* 0 = same as the source, else HQ_F32 / HQ_F16 / HQ_BF16 */
} identity_cfg;

static const hq_option options[] = {
    {"dtype", HQ_OPT_ENUM, "auto", "storage dtype: auto keeps the source's dtype",
     "auto|f32|bf16|f16", 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

static int configure(void *cfg, const hq_optval *vals, const hq_host_api *h) {
  static const int map[] = {0, HQ_F32, HQ_BF16, HQ_F16};
  (void)h;
  ((identity_cfg *)cfg)->dtype = map[vals[0].i];
  return HQ_OK;
}

static int is_hp(int t) { return t == HQ_F32 || t == HQ_F16 || t == HQ_BF16; }

/* n elements src -> dst through the host's convert service (ABI 2.4), which the core's own
   conversions share: one implementation, on the host and on a GPU. */
static int convert(const hq_call *call, void *dst, hq_dtype dt, const void *src, hq_dtype st,
                   int64_t n) {
  const hq_host_api *h = call->host;
  if (h->struct_size < HQ_HOST_API_SIZE_2_4 || !h->convert)
    return h->error(HQ_ENOTSUP, "identity: the core offers no convert service (ABI 2.4)");
  return h->convert(call, dst, dt, src, st, n);
}

static int layout(const void *cfg, const hq_host_api *h, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const identity_cfg *c = cfg;
  hq_dtype t = (hq_dtype)(c->dtype ? c->dtype : (int)out->nominal);
  if (!is_hp(t))
    return h->error(HQ_EINVAL, "identity: nominal dtype %d is not f32, f16 or bf16", (int)t);
  const int shared = dir == HQ_COLWISE && (dirs & HQ_ROWWISE);
  const char *name = dir == HQ_ROWWISE || shared ? "data" : "columnwise_data";
  hq_buffer *b = hq_buffer_describe(out, 0, name, HQ_ROLE_DATA, t, 2, rows, cols);
  hq_buffer_gather(b, HQ_GATHER_ROWS, 1);
  if (shared) hq_buffer_share(b, 0);
  out->desc.elem = t;
  out->desc.order = HQ_ORDER_MK;
  out->desc.scale_mode = HQ_SCALE_NONE;
  out->desc.scale_layout = HQ_SCALE_LAYOUT_NONE;
  out->desc.shard_rows = 1;
  out->desc.emul_dtype = t == HQ_BF16 ? HQ_BF16 : HQ_F32; /* f16 values are exact in f32 */
  return HQ_OK;
}

static int quantize(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  (void)cfg;
  int64_t n = src->rows * src->cols;
  int rc = HQ_OK;
  int adam_ok;
  const hq_adam_pass *adam = hq_call_adam(call, src, &adam_ok);
  if (!adam_ok)
    return call->host->error(HQ_EINVAL, "identity: the fused optimizer step comes with an update "
                             "of an f32 master on a CUDA device (gradient f32, f16 or bf16)");
  if (adam) {
    /* the fused optimizer write-back (HQ_CAP_FUSED_ADAM): the step and the store of the new
       master into every buffer the directions have, in one pass */
    hq_buffer *b0 = (dirs & HQ_ROWWISE) ? hq_storage_buf(row, 0) : hq_storage_buf(col, 0);
    hq_buffer *b1 = NULL;
    if (dirs == HQ_BOTH && !(hq_storage_buf(col, 0)->flags & HQ_BUF_SHARED))
      b1 = hq_storage_buf(col, 0);
    if (b1 && b1->dtype != b0->dtype)
      return call->host->error(HQ_EINVAL, "identity: the two directions' buffers differ in dtype");
#ifdef HQ_HAVE_CUDA
    return identity_cuda_adam_convert(call, adam, (float *)src->data, n, b0->ptr,
                                      b1 ? b1->ptr : NULL, b0->dtype);
#else
    return call->host->error(HQ_ENOTSUP, "identity: built without CUDA, no fused optimizer step");
#endif
  }
  if (dirs & HQ_ROWWISE) {
    hq_buffer *b = hq_storage_buf(row, 0);
    rc = convert(call, b->ptr, b->dtype, src->data, src->dtype, n);
  }
  if (!rc && (dirs & HQ_COLWISE)) {
    hq_buffer *b = hq_storage_buf(col, 0);
    if (!((dirs & HQ_ROWWISE) && (b->flags & HQ_BUF_SHARED)))
      rc = convert(call, b->ptr, b->dtype, src->data, src->dtype, n);
  }
  return rc;
}

/* The raw values (HQ_CALL_DEQ_RAW) are the stored values: no scale, no transform. */
static int dequantize(const void *cfg, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfg;
  const hq_buffer *b = hq_storage_cbuf(s, 0);
  if (!is_hp(b->dtype) || b->dtype != s->desc.elem)
    return call->host->error(HQ_EINVAL, "identity: the storage's data is %d, not f32/f16/bf16",
                             (int)b->dtype);
  return convert(call, dst->data, dst->dtype, b->ptr, b->dtype, dst->rows * dst->cols);
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 4, /* host->convert */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(identity_cfg),
    .name = "identity",
    .version = PACKAGE_VERSION,
    .description = "high-precision passthrough (f32/bf16/f16), one buffer for both directions",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY | HQ_CAP_PLAIN_COPY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA | HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .layout_version = 1, /* raise it when the bytes this module stores change (checkpoints) */
};

HQ_FORMAT_DEFINE(ops);
