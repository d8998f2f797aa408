/*
** int8_tensor.c -- a test-only third-party format module "int8_tensor": per-tensor symmetric
** INT8, written as an out-of-tree author would write it (hq/plugin.h and hq/numerics.h only, no
** core internals), so that tests/test_conformance.c runs its format contract on a module that is
** not one of the stock formats. Built for make check only, into a folder of its own, apart from
** the loader fixtures whose counts the loader tests check.
**
** Numerics: amax = max |x| (NaN ignored); scale = qmax / amax (1 when amax is 0, Inf or NaN),
** scale_inv = RN(1 / scale); code = RN-even(clamp(x * scale, -qmax, qmax)), NaN -> 0; value =
** RN(code * scale_inv). Both directions made together use one scale, from the larger of their two
** amaxes, so that the columnwise copy holds the same codes as the rowwise one.
**
** Options that change the layout:
**   columnwise = transposed   columnwise data stored [K, M] (order KM, FSDP rule COLS), or
**                copy         stored [M, K] like the rowwise data (order MK, rule ROWS);
**   shared_scale = true       the columnwise storage shares the rowwise scale_inv buffer when both
**                             are made together (HQ_BUF_SHARED), or keeps its own copy.
** and one that changes only the numbers: qmax (the largest code magnitude).
** A dequantize reads the order from the storage's descriptor, never from its own configuration.
*/
#include <stdint.h>

#include <hq/numerics.h>
#include <hq/plugin.h>

enum { OPT_QMAX, OPT_COLWISE, OPT_SHARED };
static const hq_option options[] = {
    [OPT_QMAX] = {"qmax", HQ_OPT_INT, "127", "largest code magnitude", NULL, 1, 127},
    [OPT_COLWISE] = {"columnwise", HQ_OPT_ENUM, "transposed",
                     "columnwise data stored transposed [K, M] or as a copy [M, K]",
                     "transposed|copy", 0, -1},
    [OPT_SHARED] = {"shared_scale", HQ_OPT_BOOL, "true",
                    "both directions made together share one scale_inv buffer", NULL, 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

typedef struct i8t_cfg {
  float qmax;
  int transposed, shared;
} i8t_cfg;

enum { BUF_DATA = 0, BUF_SCALE = 1, NBUF = 2 };

static int configure(void *cfgp, const hq_optval *v, const hq_host_api *host) {
  i8t_cfg *c = cfgp;
  (void)host;
  c->qmax = (float)v[OPT_QMAX].i;
  c->transposed = v[OPT_COLWISE].i == 0;
  c->shared = (int)v[OPT_SHARED].i;
  return HQ_OK;
}

static int layout(const void *cfgp, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const i8t_cfg *c = cfgp;
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return host->error(HQ_EINVAL, "int8_tensor: layout of direction %u", dir);
  const int col = dir == HQ_COLWISE, km = col && c->transposed;
  hq_buffer *d = hq_buffer_describe(out, BUF_DATA, col ? "columnwise_data" : "data", HQ_ROLE_DATA,
                                    HQ_I8, 2, km ? cols : rows, km ? rows : cols);
  hq_buffer_gather(d, km ? HQ_GATHER_COLS : HQ_GATHER_ROWS, 1);
  const int share = col && c->shared && (dirs & HQ_ROWWISE);
  hq_buffer *s =
      hq_buffer_describe(out, BUF_SCALE, col && !share ? "columnwise_scale_inv" : "scale_inv",
                         HQ_ROLE_SCALE, HQ_F32, 1, 1, 0);
  hq_buffer_gather(s, HQ_GATHER_SAME, 1); /* equal on every shard once they share the amax */
  if (share) hq_buffer_share(s, BUF_SCALE);
  hq_operand_desc *o = &out->desc;
  o->elem = HQ_I8;
  o->order = km ? HQ_ORDER_KM : HQ_ORDER_MK;
  o->scale_mode = HQ_SCALE_TENSOR_F32;
  o->scale_layout = HQ_SCALE_LAYOUT_NONE;
  o->transform = HQ_TRANSFORM_NONE;
  o->shard_rows = 1;
  return HQ_OK;
}

static uint32_t amax_kind(const void *cfgp, uint32_t dir) {
  (void)cfgp, (void)dir;
  return HQ_AMAX_INPUT;
}

static float amax_of(const hq_tensor *src) {
  float a = 0.0f;
  for (int64_t i = 0; i < src->rows * src->cols; i++)
    a = hq_fmax_nan_ignoring(a, hq_fabs(hq_load_hp(src->data, i, src->dtype)));
  return a;
}

static int amax(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                float *out) {
  (void)cfgp;
  if (call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "int8_tensor: CPU only (device %d)", (int)call->device);
  const float a = amax_of(src);
  out[0] = (dirs & HQ_ROWWISE) ? a : 0.0f;
  out[1] = (dirs & HQ_COLWISE) ? a : 0.0f;
  return HQ_OK;
}

static float scale_of(float a, float qmax) {
  return a > 0.0f && a <= 3.4028235e38f ? hq_div_rn(qmax, a) : 1.0f;
}

/* RN-even of the clamped product (|v| <= 127); NaN -> 0. */
static int8_t code_of(float x, float scale, float qmax) {
  if (hq_isnan(x)) return 0;
  float v = hq_mul_rn(x, scale);
  v = v > qmax ? qmax : v < -qmax ? -qmax : v;
  v = hq_add_rn(hq_add_rn(v, 12582912.0f), -12582912.0f); /* 1.5 * 2^23: rounds to even */
  return (int8_t)v;
}

static void cast(const hq_tensor *src, int km, float scale, float qmax, int8_t *q) {
  const int64_t M = src->rows, K = src->cols;
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++)
      q[km ? k * M + i : i * K + k] =
          code_of(hq_load_hp(src->data, i * K + k, src->dtype), scale, qmax);
}

static int quantize(const void *cfgp, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  const i8t_cfg *c = cfgp;
  if (call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "int8_tensor: CPU only (device %d)", (int)call->device);
  float a[2];
  if (call->amax) {
    a[0] = call->amax[0];
    a[1] = call->amax[1];
  } else {
    a[0] = a[1] = amax_of(src);
  }
  const float both = hq_fmax_nan_ignoring(a[0], a[1]);
  for (int d = 0; d < 2; d++) {
    hq_storage *s = d ? col : row;
    if (!(dirs & (d ? HQ_COLWISE : HQ_ROWWISE))) continue;
    const float scale = scale_of(dirs == HQ_BOTH ? both : a[d], c->qmax);
    cast(src, s->desc.order == HQ_ORDER_KM, scale, c->qmax, hq_storage_buf(s, BUF_DATA)->ptr);
    *(float *)hq_storage_buf(s, BUF_SCALE)->ptr = hq_div_rn(1.0f, scale);
  }
  return HQ_OK;
}

static int dequantize(const void *cfgp, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)cfgp;
  const hq_host_api *h = call->host;
  if (call->device != HQ_DEVICE_HOST)
    return h->error(HQ_ENOTSUP, "int8_tensor: CPU only (device %d)", (int)call->device);
  if (s->nbuf != NBUF || s->desc.elem != HQ_I8 || hq_storage_cbuf(s, BUF_DATA)->dtype != HQ_I8 ||
      hq_storage_cbuf(s, BUF_SCALE)->dtype != HQ_F32)
    return h->error(HQ_EINVAL, "int8_tensor: not an int8_tensor storage");
  if (dst->rows != s->rows || dst->cols != s->cols)
    return h->error(HQ_ESHAPE, "int8_tensor: destination [%lld, %lld], storage [%lld, %lld]",
                    (long long)dst->rows, (long long)dst->cols, (long long)s->rows,
                    (long long)s->cols);
  const int8_t *q = hq_storage_cbuf(s, BUF_DATA)->ptr;
  const float si = *(const float *)hq_storage_cbuf(s, BUF_SCALE)->ptr;
  const int km = s->desc.order == HQ_ORDER_KM;
  const int64_t M = s->rows, K = s->cols;
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++)
      hq_store_hp(dst->data, i * K + k, dst->dtype,
                  hq_mul_rn((float)q[km ? k * M + i : i * K + k], si));
  return HQ_OK;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 0, /* needs nothing newer than ABI 2.0 */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(i8t_cfg),
    .name = "int8_tensor",
    .version = "1.0",
    .description = "per-tensor INT8 (test fixture: a third-party module)",
    .caps = HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY,
    .options = options,
    .configure = configure,
    .layout = layout,
    .amax_kind = amax_kind,
    .amax = amax,
    .quantize = quantize, /* update = NULL: the core calls quantize with HQ_CALL_UPDATE */
    .dequantize = dequantize,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR) return NULL;
  return &ops;
}
