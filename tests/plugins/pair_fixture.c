/*
** pair_fixture.c -- a test-only format module, "test_pair", that offers dequantize_pair (format
** ABI 2.6): the core hands it a GEMM's two dequantizations as one request. It stores a tensor as
** integer codes q = round(x / scale) in an f32 "data" buffer ([rows, cols], the same in both
** directions) and the per-tensor factor `scale` (option, per instance) in an f32 "scale_inv"
** buffer. Its raw values (HQ_CALL_DEQ_RAW) are the codes; its raw dequantize folds the factor
** when asked (HQ_CAP_DEQ_FACTOR: *factor_out = RN(m * scale)); a full dequantize writes
** RN(q * scale). Host only. dequantize_pair makes the two dequantizations in order -- which is
** the whole of the contract on the host, a chained fold included -- and counts itself in the
** exported pair_fixture (gemm_fixture.h), whose knobs make it decline (HQ_ENOTSUP) or fail.
*/
#include <math.h>
#include <string.h>

#include "hq/numerics.h"
#include "hq/plugin.h"
#include "gemm_fixture.h"

HQ_FORMAT_EXPORT pair_fixture_state pair_fixture;

static const hq_option options[] = {
    {.name = "scale", .type = HQ_OPT_FLOAT, .def = "0.1",
     .help = "the per-tensor factor: codes are round(x / scale)", .min = 1e-3, .max = 1e3},
    {.name = NULL},
};

typedef struct cfg {
  float scale;
} cfg;

static int configure(void *c, const hq_optval *v, const hq_host_api *host) {
  (void)host;
  ((cfg *)c)->scale = (float)v[0].f;
  return HQ_OK;
}

static int layout(const void *c, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  (void)c;
  (void)host;
  (void)dirs;
  const int col = dir == HQ_COLWISE;
  hq_buffer *d = hq_buffer_describe(out, 0, col ? "columnwise_data" : "data", HQ_ROLE_DATA,
                                    HQ_F32, 2, rows, cols);
  hq_buffer_gather(d, HQ_GATHER_ROWS, 1);
  hq_buffer *s = hq_buffer_describe(out, 1, col ? "columnwise_scale_inv" : "scale_inv",
                                    HQ_ROLE_SCALE, HQ_F32, 1, 1, 0);
  hq_buffer_gather(s, HQ_GATHER_SAME, 1);
  out->desc.elem = HQ_F32;
  out->desc.order = HQ_ORDER_MK;
  out->desc.scale_mode = HQ_SCALE_TENSOR_F32;
  out->desc.shard_rows = 1;
  out->desc.emul_dtype = HQ_F32;
  return HQ_OK;
}

static int quantize(const void *c, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const float scale = ((const cfg *)c)->scale;
  if (src->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_pair quantizes f32 host tensors only");
  const int64_t n = src->rows * src->cols;
  for (int d = 0; d < 2; d++) {
    hq_storage *s = d ? col : row;
    if (!(dirs & (d ? HQ_COLWISE : HQ_ROWWISE))) continue;
    float *q = hq_storage_buf(s, 0)->ptr;
    for (int64_t i = 0; i < n; i++) q[i] = floorf(((const float *)src->data)[i] / scale + 0.5f);
    *(float *)hq_storage_buf(s, 1)->ptr = scale;
  }
  return HQ_OK;
}

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)c;
  if (dst->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_pair dequantizes into f32 host tensors only");
  const int raw = (call->flags & HQ_CALL_DEQ_RAW) != 0;
  const float *q = hq_storage_cbuf(s, 0)->ptr, f = *(const float *)hq_storage_cbuf(s, 1)->ptr;
  float *y = dst->data;
  for (int64_t i = 0; i < dst->rows * dst->cols; i++) y[i] = raw ? q[i] : q[i] * f;
  float *out = hq_call_factor_out(call);
  if (out) *out = hq_mul_rn(call->factor_in ? *call->factor_in : call->factor_mul, f);
  pair_fixture.deqs++;
  return HQ_OK;
}

static int dequantize_pair(const void *c, const hq_call *call, const hq_storage *s,
                           hq_tensor *dst, const void *c_b, const hq_call *call_b,
                           const hq_storage *s_b, hq_tensor *dst_b) {
  if (pair_fixture.decline) return HQ_ENOTSUP;
  if (pair_fixture.fail) return call->host->error(HQ_EDEVICE, "test_pair: failed on purpose");
  if (call_b->device != call->device || call_b->stream != call->stream ||
      !(call->flags & call_b->flags & HQ_CALL_DEQ_RAW))
    return call->host->error(HQ_EINVAL, "test_pair: a pair of calls unlike each other");
  int rc = dequantize(c, call, s, dst);
  if (!rc) rc = dequantize(c_b, call_b, s_b, dst_b);
  if (!rc) pair_fixture.pairs++;
  return rc;
}

static int tensor_factor(const void *c, const hq_call *call, const hq_storage *s, float *out) {
  (void)c;
  if (call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_pair runs on the host only");
  *out = *(const float *)hq_storage_cbuf(s, 1)->ptr;
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 3, /* the factor fields of hq_call */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(cfg),
    .name = "test_pair",
    .version = "0.1",
    .description = "integer codes and a folded per-tensor factor, two dequantizes a request",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .tensor_factor = tensor_factor,
    .dequantize_pair = dequantize_pair,
};

HQ_FORMAT_DEFINE(ops);
