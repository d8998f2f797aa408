/*
** identity.c -- the high-precision passthrough format.
**
** Stores the tensor as it is (or cast to `dtype`). One buffer serves both directions: when both
** are made together the columnwise storage shares the rowwise buffer; the GEMM reads it
** transposed through its layout flags. No scale, no amax, no padding (FORMATS.md 5).
**
** Buffers (save order): data [rows, cols] of the storage dtype.
*/
#include <stdint.h>
#include <string.h>

#include "hq/numerics.h"
#include "hq/plugin.h"

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

static hq_dtype storage_dtype(const identity_cfg *c, int nominal) {
  return (hq_dtype)(c->dtype ? c->dtype : nominal);
}

static int layout(const void *cfg, const hq_host_api *h, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const identity_cfg *c = cfg;
  hq_dtype t = storage_dtype(c, out->nominal);
  if (t != HQ_F32 && t != HQ_F16 && t != HQ_BF16)
    return h->error(HQ_EINVAL, "identity: nominal dtype %d is not f32, f16 or bf16", (int)t);
  out->nbuf = 1;
  const int shared = dir == HQ_COLWISE && (dirs & HQ_ROWWISE);
  hq_buffer_describe(&out->buf[0], "data", t, 2, rows, cols,
                     HQ_BUF_SHARDED | (shared ? HQ_BUF_SHARED : 0u));
  out->buf[0].shared_with = 0;
  return HQ_OK;
}

#ifdef HQ_HAVE_CUDA
int identity_cuda_convert(const hq_call *call, void *dst, int dt, const void *src, int st,
                          int64_t n);
#endif

/* Element-wise convert n values on the call's device. Equal dtypes copy bytes, so NaN payloads
   and signed zeros pass through unchanged. */
static int convert(const hq_call *call, void *dst, int dt, const void *src, int st, int64_t n) {
  if (call->device != HQ_DEVICE_HOST) {
#ifdef HQ_HAVE_CUDA
    return identity_cuda_convert(call, dst, dt, src, st, n);
#else
    return call->host->error(HQ_ENOTSUP, "identity was built without CUDA");
#endif
  }
  if (dt == st) {
    memcpy(dst, src, (size_t)n * (dt == HQ_F32 ? 4u : 2u));
    return HQ_OK;
  }
  for (int64_t i = 0; i < n; i++) hq_store_hp(dst, i, dt, hq_load_hp(src, i, st));
  return HQ_OK;
}

static int quantize(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  (void)cfg;
  int64_t n = src->rows * src->cols;
  int rc = HQ_OK;
  if (dirs & HQ_ROWWISE)
    rc = convert(call, row->buf[0].ptr, row->buf[0].dtype, src->data, src->dtype, n);
  if (!rc && (dirs & HQ_COLWISE) && !((dirs & HQ_ROWWISE) && (col->buf[0].flags & HQ_BUF_SHARED)))
    rc = convert(call, col->buf[0].ptr, col->buf[0].dtype, src->data, src->dtype, n);
  return rc;
}

static int dequantize(const void *cfg, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfg;
  return convert(call, dst->data, dst->dtype, s->buf[0].ptr, s->buf[0].dtype,
                 dst->rows * dst->cols);
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(identity_cfg),
    .name = "identity",
    .version = "1.0",
    .description = "high-precision passthrough (f32/bf16/f16), one buffer for both directions",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY
#ifdef HQ_HAVE_CUDA
            | HQ_CAP_CUDA
#endif
    ,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v1(const hq_host_api *h) {
  if (h->abi_major != HQ_ABI_MAJOR) return NULL;
  return &ops;
}
