/* int8_row.c -- per-row INT8: one FP32 scale per row of the GEMM operand. */
#include <stdint.h>
#include <string.h>

#include <hq/numerics.h> /* hq_load_hp, hq_store_hp, hq_fabs, hq_isnan ... */
#include <hq/plugin.h>

typedef struct i8_cfg {
  float qmax; /* largest code magnitude (option qmax) */
} i8_cfg;

enum { OPT_QMAX };
static const hq_option options[] = {
    [OPT_QMAX] = {"qmax", HQ_OPT_INT, "127", "largest code magnitude", NULL, 1, 127},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

enum { BUF_DATA = 0, BUF_SCALE = 1 };

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  (void)host;
  ((i8_cfg *)cfgp)->qmax = (float)v[OPT_QMAX].i;
  return HQ_OK;
}

/* Rowwise: data [M, K], one scale per row (M of them). Columnwise: data stored transposed
   [K, M], one scale per column of x (K of them). */
static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  (void)cfgp, (void)dirs;
  const int row = dir == HQ_ROWWISE;
  if (!row && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "int8_row: layout of direction %u", dir);
  const int64_t outer = row ? rows : cols, inner = row ? cols : rows;
  if (inner > INT32_MAX)
    return host->error(HQ_ESHAPE, "int8_row: %lld elements per scale is too many",
                       (long long)inner);
  hq_buffer *d = hq_buffer_describe(out, BUF_DATA, row ? "data" : "columnwise_data",
                                    HQ_ROLE_DATA, HQ_I8, 2, outer, inner);
  hq_buffer *s = hq_buffer_describe(out, BUF_SCALE, row ? "scale_inv" : "columnwise_scale_inv",
                                    HQ_ROLE_SCALE, HQ_F32, 1, outer, 0);
  if (row) {
    hq_buffer_gather(d, HQ_GATHER_ROWS, 1); /* a shard's rows are whole blocks */
    hq_buffer_gather(s, HQ_GATHER_ROWS, 1);
  } else {
    hq_buffer_gather(d, HQ_GATHER_COLS, 1);
    /* a column's scale depends on every row: a shard cannot know it (stays GATHER_NEVER) */
  }
  hq_operand_desc *o = &out->desc;
  o->elem = HQ_I8;
  o->order = row ? HQ_ORDER_MK : HQ_ORDER_KM;
  o->scale_mode = HQ_SCALE_OUTER_VEC_F32;
  o->scale_layout = HQ_SCALE_LAYOUT_OUTER_MAJOR;
  o->block_m = row ? 1 : (int32_t)inner;
  o->block_k = row ? (int32_t)inner : 1;
  o->transform = HQ_TRANSFORM_NONE;
  o->shard_rows = row ? 1 : 0; /* 0: the columnwise storage cannot be sharded */
  return HQ_OK;
}

/* The columnwise amaxes need a whole pass before the first column can be cast: keep them in
   scratch, so that an update allocates nothing. */
static size_t scratch_size(const void *cfgp, int64_t rows, int64_t cols, uint32_t dirs,
                           int32_t device) {
  (void)cfgp, (void)rows, (void)device;
  return (dirs & HQ_COLWISE) ? (size_t)cols * sizeof(float) : 0;
}

static float scale_of(float amax, float qmax) {
  return amax > 0.0f && amax <= 3.4028235e38f ? hq_div_rn(qmax, amax) : 1.0f;
}

/* RN-even of v (|v| <= 127 here); NaN -> 0, +-Inf -> +-qmax through the clamp. */
static int8_t code_of(float x, float scale, float qmax) {
  if (hq_isnan(x)) return 0;
  float v = hq_mul_rn(x, scale);
  v = v > qmax ? qmax : v < -qmax ? -qmax : v;
  v = hq_add_rn(hq_add_rn(v, 12582912.0f), -12582912.0f); /* 1.5 * 2^23: rounds to even */
  return (int8_t)v;
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const i8_cfg *c = cfgp;
  const hq_host_api *h = call->host;
  if (call->device != HQ_DEVICE_HOST)
    return h->error(HQ_ENOTSUP, "int8_row: CPU only (device %d)", (int)call->device);
  const int64_t M = src->rows, K = src->cols;
  const int t = src->dtype;
  if (dirs & HQ_ROWWISE) {
    int8_t *q = hq_storage_buf(row, BUF_DATA)->ptr;
    float *si = hq_storage_buf(row, BUF_SCALE)->ptr;
    for (int64_t i = 0; i < M; i++) {
      float amax = 0.0f;
      for (int64_t k = 0; k < K; k++)
        amax = hq_fmax_nan_ignoring(amax, hq_fabs(hq_load_hp(src->data, i * K + k, t)));
      const float s = scale_of(amax, c->qmax);
      for (int64_t k = 0; k < K; k++)
        q[i * K + k] = code_of(hq_load_hp(src->data, i * K + k, t), s, c->qmax);
      si[i] = hq_rcp_rn(s);
    }
  }
  if (dirs & HQ_COLWISE) {
    float *s = call->scratch; /* K floats: scratch_size() */
    if (!s || call->scratch_bytes < (size_t)K * sizeof(float))
      return h->error(HQ_EINVAL, "int8_row: call->scratch is smaller than scratch_size()");
    int8_t *q = hq_storage_buf(col, BUF_DATA)->ptr; /* [K, M] */
    float *si = hq_storage_buf(col, BUF_SCALE)->ptr;
    for (int64_t k = 0; k < K; k++) s[k] = 0.0f;
    for (int64_t i = 0; i < M; i++)
      for (int64_t k = 0; k < K; k++)
        s[k] = hq_fmax_nan_ignoring(s[k], hq_fabs(hq_load_hp(src->data, i * K + k, t)));
    for (int64_t k = 0; k < K; k++) {
      s[k] = scale_of(s[k], c->qmax);
      si[k] = hq_rcp_rn(s[k]);
    }
    for (int64_t i = 0; i < M; i++)
      for (int64_t k = 0; k < K; k++)
        q[k * M + i] = code_of(hq_load_hp(src->data, i * K + k, t), s[k], c->qmax);
  }
  return HQ_OK;
}

/* Everything comes from the storage: any int8_row instance's storage dequantizes here. */
static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const hq_host_api *h = call->host;
  if (call->device != HQ_DEVICE_HOST)
    return h->error(HQ_ENOTSUP, "int8_row: CPU only (device %d)", (int)call->device);
  if (s->nbuf != 2 || s->desc.elem != HQ_I8 || s->desc.scale_mode != HQ_SCALE_OUTER_VEC_F32 ||
      hq_storage_cbuf(s, BUF_DATA)->dtype != HQ_I8 ||
      hq_storage_cbuf(s, BUF_SCALE)->dtype != HQ_F32)
    return h->error(HQ_EINVAL, "int8_row: not an int8_row storage");
  if (dst->rows != s->rows || dst->cols != s->cols)
    return h->error(HQ_ESHAPE, "int8_row: destination [%lld, %lld], storage [%lld, %lld]",
                    (long long)dst->rows, (long long)dst->cols, (long long)s->rows,
                    (long long)s->cols);
  const int8_t *q = hq_storage_cbuf(s, BUF_DATA)->ptr;
  const float *si = hq_storage_cbuf(s, BUF_SCALE)->ptr;
  const int km = s->desc.order == HQ_ORDER_KM;
  const int64_t M = s->rows, K = s->cols;
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++) {
      const float v = km ? hq_mul_rn((float)q[k * M + i], si[k])
                         : hq_mul_rn((float)q[i * K + k], si[i]);
      hq_store_hp(dst->data, i * K + k, dst->dtype, v);
    }
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 0, /* needs nothing newer than ABI 2.0 */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(i8_cfg),
    .name = "int8_row",
    .version = "1.0",
    .description = "per-row INT8 (one FP32 scale per operand row)",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY,
    .options = options,
    .configure = configure,
    .layout = layout,
    .scratch_size = scratch_size,
    .quantize = quantize, /* update = NULL: the core calls quantize with HQ_CALL_UPDATE */
    .dequantize = dequantize,
};

HQ_FORMAT_DEFINE(ops);
