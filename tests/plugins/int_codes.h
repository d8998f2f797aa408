/*
** int_codes.h -- the storage of the test format modules raw_factor.c and pair_fixture.c, each of
** which defines CODES_NAME (its format name, for messages) before including this: a tensor kept
** as integer codes q = round(x / scale) in an f32 "data" buffer ([rows, cols], the same in both
** directions) and the per-tensor factor `scale` (option, per instance) in an f32 "scale_inv"
** buffer. The raw values (HQ_CALL_DEQ_RAW) are the codes, the factor is the scale, a full
** dequantize writes RN(q * scale). Host only.
*/
#ifndef TEST_INT_CODES_H
#define TEST_INT_CODES_H

#include <math.h>
#include <string.h>

#include "hq/plugin.h"

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
    return call->host->error(HQ_ENOTSUP, CODES_NAME " quantizes f32 host tensors only");
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

/* The values of s into dst: the codes (raw) or RN(q * scale). */
static int codes_dequantize(const hq_call *call, const hq_storage *s, hq_tensor *dst, int raw) {
  if (dst->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, CODES_NAME " dequantizes into f32 host tensors only");
  const float *q = hq_storage_cbuf(s, 0)->ptr, f = *(const float *)hq_storage_cbuf(s, 1)->ptr;
  float *y = dst->data;
  for (int64_t i = 0; i < dst->rows * dst->cols; i++) y[i] = raw ? q[i] : q[i] * f;
  return HQ_OK;
}

/* The per-tensor factor of s (*out, host memory): a tensor_factor op. */
static int codes_factor(const void *c, const hq_call *call, const hq_storage *s, float *out) {
  (void)c;
  if (call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, CODES_NAME " runs on the host only");
  *out = *(const float *)hq_storage_cbuf(s, 1)->ptr;
  return HQ_OK;
}

#endif
