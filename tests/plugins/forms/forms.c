/*
** forms.c -- test-only format modules for buffer forms (plugin ABI 2.4): a buffer the format
** moves itself for an FSDP gather and for save/restore. One source, built with a FORMS_*
** macro selecting the variant (tests/test_forms.c):
**   forms.so            "test_forms": buffer_form, fsdp_extract, fsdp_assign, save, restore
**   forms_short.so      "test_forms_short": the same ops, but a table whose struct_size is
**                       ABI 2.1's (HQ_FORMAT_OPS_SIZE_2_1): the core must not see them
**   forms_half_fsdp.so  fsdp_assign without fsdp_extract          (the loader rejects it)
**   forms_half_save.so  save without restore                      (rejected)
**   forms_undescribed.so  the four ops without buffer_form        (rejected)
**   forms_unused.so     buffer_form alone                         (rejected)
**
** test_forms stores an f32 host tensor [M, K] (M even) as it is ("data", gather ROWS) plus a
** "tag" buffer, u8 [M + 16]: one byte per row, tag(i) = the xor of the four bytes of x[i][0]'s
** FP32 bits (0 when K = 0), stored in REVERSED row order (row i at byte M-1-i), then 16 zero
** bytes. A shard's tag buffer is therefore no piece of the whole tensor's (gather NEVER), as a
** swizzled scale buffer is not. Its forms, both in natural row order without the padding:
**   HQ_FORM_FSDP  u8 [M/2, 2], m_div 2 (two rows of M per form row; shard_rows is 2)
**   HQ_FORM_SAVE  u8 [M]
** Every op logs one info line "test_forms: OP BUFFER" through host->log, so that a test sees
** which ops the core called. Option `bug` selects a deliberate fault: 1 an FSDP form with the
** wrong row count, 2 a save form of 5 dimensions, 3 fsdp_extract fails (HQ_EDEVICE), 4 restore
** fails (HQ_EDEVICE).
*/
#include <string.h>

#include "hq/plugin.h"

static const hq_option options[] = {
    {"bug", HQ_OPT_INT, "0", "a deliberate fault (0 = none)", NULL, 0, 4},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

typedef struct cfg { int bug; } cfg;

#define PAD 16 /* zero bytes after the tags */
enum { DATA = 0, TAG = 1 };

static int configure(void *c, const hq_optval *v, const hq_host_api *host) {
  (void)host;
  ((cfg *)c)->bug = (int)v[0].i;
  return HQ_OK;
}

static int layout(const void *c, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  (void)c, (void)dirs;
  if (rows % 2)
    return host->error(HQ_ESHAPE, "test_forms: rows = %lld is not even", (long long)rows);
  const int col = dir == HQ_COLWISE;
  hq_buffer *d = hq_buffer_describe(out, DATA, col ? "columnwise_data" : "data", HQ_ROLE_DATA,
                                    HQ_F32, 2, rows, cols);
  hq_buffer_gather(d, HQ_GATHER_ROWS, 1);
  /* gather NEVER (the default): only the format's own ops can move the reversed tags */
  hq_buffer_describe(out, TAG, col ? "columnwise_tag" : "tag", HQ_ROLE_OTHER, HQ_U8, 1,
                     rows + PAD, 0);
  out->desc.elem = HQ_F32;
  out->desc.order = HQ_ORDER_MK;
  out->desc.shard_rows = 2;
  return HQ_OK;
}

static uint8_t tag_of(const float *row, int64_t K) {
  if (K == 0) return 0;
  uint32_t b;
  memcpy(&b, row, 4);
  return (uint8_t)(b ^ (b >> 8) ^ (b >> 16) ^ (b >> 24));
}

static int quantize(const void *c, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  (void)c;
  if (src->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_forms stores f32 host tensors only");
  const int64_t M = src->rows, K = src->cols;
  for (int d = 0; d < 2; d++) {
    hq_storage *s = d ? col : row;
    if (!(dirs & (d ? HQ_COLWISE : HQ_ROWWISE))) continue;
    memcpy(hq_storage_buf(s, DATA)->ptr, src->data, (size_t)(M * K) * 4u);
    uint8_t *t = hq_storage_buf(s, TAG)->ptr;
    for (int64_t i = 0; i < M; i++) t[M - 1 - i] = tag_of((const float *)src->data + i * K, K);
    memset(t + M, 0, PAD);
  }
  return HQ_OK;
}

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)c;
  if (dst->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_forms dequantizes into f32 host tensors only");
  memcpy(dst->data, hq_storage_cbuf(s, DATA)->ptr, (size_t)(dst->rows * dst->cols) * 4u);
  return HQ_OK;
}

// --- buffer forms (ABI 2.4) ---------------------------------------------------------------------

static int buffer_form(const void *c, const hq_host_api *host, const hq_storage *s,
                       uint32_t buffer, uint32_t purpose, hq_buffer_form *form) {
  const int bug = ((const cfg *)c)->bug;
  (void)host;
  if (buffer != TAG) return HQ_OK; /* data goes by its gather rule, and is saved as it is */
  if (purpose == HQ_FORM_FSDP)
    hq_buffer_form_describe(form, HQ_U8, 2, s->rows / 2 + (bug == 1), 2, 2);
  else
    hq_buffer_form_describe(form, HQ_U8, bug == 2 ? 5 : 1, s->rows, 0, 0);
  return HQ_OK;
}

/* Tags out of the buffer into a form in natural order, or back in reversed order with the zero
   padding; checks the form the core made against the storage. */
static int move(const hq_call *call, const hq_storage *s, uint32_t buffer,
                const hq_buffer_form *form, int to_form, const char *op) {
  const hq_buffer *b = hq_storage_cbuf(s, buffer);
  call->host->log(call, 2, "test_forms: %s %s", op, b->name);
  const int64_t M = s->rows;
  if (buffer != TAG || form->bytes != (size_t)M || (M && (!form->ptr || !b->ptr)))
    return call->host->error(HQ_EINVAL, "test_forms: %s: buffer %u, form of %zu bytes for %lld "
                             "rows", op, buffer, form->bytes, (long long)M);
  uint8_t *t = b->ptr, *f = form->ptr;
  for (int64_t i = 0; i < M; i++) {
    if (to_form) f[i] = t[M - 1 - i];
    else t[M - 1 - i] = f[i];
  }
  if (!to_form) memset(t + M, 0, PAD);
  return HQ_OK;
}

static int fsdp_extract(const void *c, const hq_call *call, const hq_storage *s, uint32_t buffer,
                        const hq_buffer_form *form) {
  if (((const cfg *)c)->bug == 3)
    return call->host->error(HQ_EDEVICE, "test_forms: the un-reverse kernel failed");
  return move(call, s, buffer, form, 1, "fsdp_extract");
}
static int fsdp_assign(const void *c, const hq_call *call, hq_storage *s, uint32_t buffer,
                       const hq_buffer_form *form) {
  (void)c;
  return move(call, s, buffer, form, 0, "fsdp_assign");
}
static int save(const void *c, const hq_call *call, const hq_storage *s, uint32_t buffer,
                const hq_buffer_form *form) {
  (void)c;
  return move(call, s, buffer, form, 1, "save");
}
static int restore(const void *c, const hq_call *call, hq_storage *s, uint32_t buffer,
                   const hq_buffer_form *form) {
  if (((const cfg *)c)->bug == 4)
    return call->host->error(HQ_EDEVICE, "test_forms: the reverse kernel failed");
  return move(call, s, buffer, form, 0, "restore");
}

static hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 4,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(cfg),
    .name = "test_forms",
    .version = "0.0",
    .description = "buffer-form test fixture",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_REQUANT_SAFE,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .buffer_form = buffer_form,
    .fsdp_extract = fsdp_extract,
    .fsdp_assign = fsdp_assign,
    .save = save,
    .restore = restore,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR) return NULL;
#if defined(FORMS_SHORT)
  ops.abi_minor = 1;
  ops.struct_size = (uint32_t)HQ_FORMAT_OPS_SIZE_2_1;
  ops.name = "test_forms_short";
#elif defined(FORMS_HALF_FSDP)
  ops.fsdp_extract = NULL;
  ops.name = "test_forms_half_fsdp";
#elif defined(FORMS_HALF_SAVE)
  ops.restore = NULL;
  ops.name = "test_forms_half_save";
#elif defined(FORMS_UNDESCRIBED)
  ops.buffer_form = NULL;
  ops.name = "test_forms_undescribed";
#elif defined(FORMS_UNUSED)
  ops.fsdp_extract = NULL;
  ops.fsdp_assign = NULL;
  ops.save = NULL;
  ops.restore = NULL;
  ops.name = "test_forms_unused";
#endif
  return &ops;
}
