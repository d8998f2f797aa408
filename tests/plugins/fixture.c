/*
** fixture.c -- test-only format modules for the loader, recipe and ABI tests. One source, built
** several times with a FIXTURE_* macro selecting what is wrong with each module:
**   good.so          a valid module "test_good" with one option of each type (see below)
**   good_dup.so      a valid module that reuses the name "test_good"
**   bad_major.so     abi_major = HQ_ABI_MAJOR + 1
**   newer_minor.so   requires abi_minor = HQ_ABI_MINOR + 1
**   small_struct.so  struct_size smaller than ABI 2.0's table
**   no_entry.so      exports a differently named function, not the entry point
**   v1_entry.so      exports only the ABI 1 entry point hq_format_module_v1
**   missing_op.so    quantize = NULL
**   bad_option.so    an option whose default is not a valid value
**   refuses.so       the entry function returns NULL after host->error()
**   bad_name.so      format name with an upper-case letter
**   identity.so      a valid module named "identity" (built into the core: must be rejected)
**   bad_default.so   test_good whose default `level` (7) its own configure() refuses
**   wide/wide_options.so  "test_wide": test_good whose option entries are larger than this
**                    header's hq_option (two appended fields), as a module built against a later
**                    header would declare them, with option_size saying so
**
** test_good stores an f32 tensor as it is ("data", or "columnwise_data" made alone) plus a
** 2-byte "aux" buffer, and logs one info line per quantize through host->log, with the call's
** random-stream offset and its inputs (hq_call.offset, role_key, role_count). Its `level` option selects a deliberate bug in layout()
** or update(), so that the core's checks can be tested: 1 no data buffer, 2 data dtype differs
** from desc.elem, 4 columnwise buffer without the "columnwise_" prefix, 5 swizzled scale marked
** gatherable, 6 two buffers of one name, 7 configure() refuses, 8 update() allocates through
** host->alloc, 9 data shape differs from the descriptor's order. Any other level is valid. A
** `label` of "status=N" makes configure() refuse with status N through host->error, "raw=N"
** return N without a message. A label "rawbuf=N" adds a raw-values buffer (HQ_ROLE_RAW, ABI
** 2.6): 1 a valid f32 [rows, cols] one that quantize fills with the data, 2 of dtype u8, 3 of
** [rows, cols + 1], 4 two of them.
*/
#include <stdlib.h>
#include <string.h>

#include "hq/plugin.h"

#ifndef FIXTURE_WIDE_OPTIONS
static const hq_option options[] = {
#ifdef FIXTURE_BAD_DEFAULT
    {"level", HQ_OPT_INT, "7", "an integer in [0, 10] whose default configure() refuses", NULL, 0,
     10},
#else
    {"level", HQ_OPT_INT, "3", "an integer in [0, 10]", NULL, 0, 10},
#endif
    {"ratio", HQ_OPT_FLOAT, "0.5", "a float in [0, 1]", NULL, 0, 1},
    {"mode", HQ_OPT_ENUM, "fast", "an enum", "fast|exact", 0, -1},
    {"flag", HQ_OPT_BOOL, "false", "a bool", NULL, 0, -1},
#ifdef FIXTURE_BAD_OPTION
    {"broken", HQ_OPT_INT, "eleven", "default is not an integer", NULL, 0, -1},
#endif
    {"label", HQ_OPT_STRING, "", "free text", NULL, 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};
#else
/* An option entry as a later header might define it: hq_option, then appended fields. */
typedef struct wide_option {
  hq_option o;
  const char *note;
  double step;
} wide_option;
static const wide_option wide_options[] = {
    {{"level", HQ_OPT_INT, "3", "an integer in [0, 10]", NULL, 0, 10}, "n", 1},
    {{"ratio", HQ_OPT_FLOAT, "0.5", "a float in [0, 1]", NULL, 0, 1}, "r", 0.25},
    {{"mode", HQ_OPT_ENUM, "fast", "an enum", "fast|exact", 0, -1}, "m", 0},
    {{"flag", HQ_OPT_BOOL, "false", "a bool", NULL, 0, -1}, "f", 0},
    {{"label", HQ_OPT_STRING, "", "free text", NULL, 0, -1}, "l", 0},
    {{NULL, 0, NULL, NULL, NULL, 0, 0}, NULL, 0},
};
#endif

/* raw_q / raw_d (label "qraw=N" / "draw=N"): what quantize / dequantize return instead of
   working, any int (a broken module's status); has_raw_* says one was given. */
typedef struct cfg { int level, has_raw_q, raw_q, has_raw_d, raw_d, rawbuf; } cfg;

static int configure(void *c, const hq_optval *v, const hq_host_api *host) {
  ((cfg *)c)->level = (int)v[0].i;
  if (v[0].i == 7) return host->error(HQ_EINVAL, "level 7 is unlucky");
#ifdef FIXTURE_BAD_OPTION
  const char *label = v[5].s ? v[5].s : "";
#else
  const char *label = v[4].s ? v[4].s : "";
#endif
  if (strncmp(label, "status=", 7) == 0) {
    int rc = atoi(label + 7);
    return host->error(rc, "configure refuses with status %d", rc);
  }
  if (strncmp(label, "raw=", 4) == 0) return atoi(label + 4);
  cfg *k = c;
  k->has_raw_q = strncmp(label, "qraw=", 5) == 0;
  k->raw_q = k->has_raw_q ? atoi(label + 5) : 0;
  k->has_raw_d = strncmp(label, "draw=", 5) == 0;
  k->raw_d = k->has_raw_d ? atoi(label + 5) : 0;
  k->rawbuf = strncmp(label, "rawbuf=", 7) == 0 ? atoi(label + 7) : 0;
  return HQ_OK;
}

static int layout(const void *c, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  const int level = ((const cfg *)c)->level;
  const int col = dir == HQ_COLWISE;
  (void)host;
  (void)dirs;
  /* level 10: packed 4-bit integers, two per byte (make_empty only: quantize copies f32) */
  hq_buffer *d = hq_buffer_describe(out, 0, col && level != 4 ? "columnwise_data" : "data",
                                    level == 1 ? HQ_ROLE_OTHER : HQ_ROLE_DATA,
                                    level == 10 ? HQ_I4X2 : HQ_F32, 2, rows,
                                    level == 9 ? cols + 1 : level == 10 ? cols / 2 : cols);
  hq_buffer_gather(d, HQ_GATHER_ROWS, 1);
  hq_buffer *a = hq_buffer_describe(out, 1, level == 6 ? d->name : col ? "columnwise_aux" : "aux",
                                    HQ_ROLE_OTHER, HQ_U8, 1, 2, 0);
  hq_buffer_gather(a, HQ_GATHER_SAME, 1);
  out->desc.elem = level == 2 ? HQ_BF16 : level == 10 ? HQ_I4X2 : HQ_F32;
  out->desc.order = HQ_ORDER_MK;
  out->desc.shard_rows = 1;
  if (level == 5) {
    hq_buffer *s = hq_buffer_describe(out, 2, col ? "columnwise_scale_inv" : "scale_inv",
                                      HQ_ROLE_SCALE, HQ_E8M0, 2, rows, 4);
    hq_buffer_gather(s, HQ_GATHER_ROWS, 1);
    out->desc.scale_mode = HQ_SCALE_VEC32_UE8M0;
    out->desc.scale_layout = HQ_SCALE_LAYOUT_SWIZZLED;
  }
  const int rawbuf = ((const cfg *)c)->rawbuf;
  for (int k = 0; rawbuf && k < (rawbuf == 4 ? 2 : 1); k++) {
    static const char *const names[2][2] = {{"raw", "raw2"}, {"columnwise_raw", "columnwise_raw2"}};
    hq_buffer *rb = hq_buffer_describe(out, out->nbuf, names[col][k], HQ_ROLE_RAW,
                                       rawbuf == 2 ? HQ_U8 : HQ_F32, 2, rows,
                                       rawbuf == 3 ? cols + 1 : cols);
    hq_buffer_gather(rb, HQ_GATHER_ROWS, 1);
  }
  return HQ_OK;
}

static int quantize(const void *c, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  if (((const cfg *)c)->has_raw_q) return ((const cfg *)c)->raw_q;
  if (src->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_good stores f32 host tensors only");
  /* role_key and role_count (ABI 2.6) only from a call that carries them */
  const int rk = call->struct_size >= HQ_CALL_SIZE_2_6;
  call->host->log(call, 2, "test_good: quantize [%lld, %lld] offset 0x%016llx key 0x%016llx "
                  "count %llu", (long long)src->rows, (long long)src->cols,
                  (unsigned long long)call->offset,
                  (unsigned long long)(rk ? call->role_key : 0),
                  (unsigned long long)(rk ? call->role_count : 0));
  for (int d = 0; d < 2; d++) {
    hq_storage *s = d ? col : row;
    if (!(dirs & (d ? HQ_COLWISE : HQ_ROWWISE))) continue;
    memcpy(hq_storage_buf(s, 0)->ptr, src->data, (size_t)(src->rows * src->cols) * 4u);
    uint8_t *aux = hq_storage_buf(s, 1)->ptr;
    aux[0] = 1;
    aux[1] = (uint8_t)(2 + d);
    if (((const cfg *)c)->rawbuf == 1) /* the raw values of an f32 copy: the values */
      memcpy(hq_storage_buf(s, 2)->ptr, src->data, (size_t)(src->rows * src->cols) * 4u);
  }
  return HQ_OK;
}

static int update(const void *c, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                  hq_storage *row, hq_storage *col) {
  if (((const cfg *)c)->level == 8) {
    void *p = call->host->alloc(call, 16);
    if (!p) return HQ_ENOMEM;
    call->host->free(call, p);
  }
  return quantize(c, call, src, dirs, row, col);
}

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  if (((const cfg *)c)->has_raw_d) return ((const cfg *)c)->raw_d;
  if (dst->dtype != HQ_F32 || call->device != HQ_DEVICE_HOST)
    return call->host->error(HQ_ENOTSUP, "test_good dequantizes into f32 host tensors only");
  memcpy(dst->data, hq_storage_cbuf(s, 0)->ptr, (size_t)(dst->rows * dst->cols) * 4u);
  return HQ_OK;
}

/* What each fixture changes in test_good's table (the rest, and the checked entry function that
   HQ_FORMAT_DEFINE writes, stay test_good's). */
#if defined(FIXTURE_BAD_MAJOR)
#define FX_NAME "test_bad_major"
#define FX_ABI_MAJOR (HQ_ABI_MAJOR + 1)
#elif defined(FIXTURE_NEWER_MINOR)
#define FX_NAME "test_newer_minor"
#define FX_ABI_MINOR (HQ_ABI_MINOR + 1)
#elif defined(FIXTURE_SMALL_STRUCT)
#define FX_NAME "test_small_struct"
#define FX_STRUCT_SIZE 24
#elif defined(FIXTURE_MISSING_OP)
#define FX_NAME "test_missing_op"
#define FX_QUANTIZE NULL
#elif defined(FIXTURE_BAD_OPTION)
#define FX_NAME "test_bad_option"
#elif defined(FIXTURE_BAD_NAME)
#define FX_NAME "Test_Bad"
#elif defined(FIXTURE_IDENTITY)
#define FX_NAME "identity"
#elif defined(FIXTURE_BAD_DEFAULT)
#define FX_NAME "test_bad_default"
#elif defined(FIXTURE_WIDE_OPTIONS)
#define FX_NAME "test_wide"
#define FX_OPTIONS ((const hq_option *)wide_options)
#define FX_OPTION_SIZE sizeof(wide_option)
#else
#define FX_NAME "test_good"
#endif
#ifndef FX_ABI_MAJOR
#define FX_ABI_MAJOR HQ_ABI_MAJOR
#endif
#ifndef FX_ABI_MINOR
#define FX_ABI_MINOR 0
#endif
#ifndef FX_STRUCT_SIZE
#define FX_STRUCT_SIZE sizeof(hq_format_ops)
#endif
#ifndef FX_QUANTIZE
#define FX_QUANTIZE quantize
#endif
#ifndef FX_OPTIONS
#define FX_OPTIONS options
#define FX_OPTION_SIZE 0
#endif

static const hq_format_ops ops = {
    .abi_major = FX_ABI_MAJOR,
    .abi_minor = FX_ABI_MINOR,
    .struct_size = FX_STRUCT_SIZE,
    .config_size = sizeof(cfg),
    .name = FX_NAME,
    .version = "0.0",
    .description = "loader test fixture",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_REQUANT_SAFE,
    .options = FX_OPTIONS,
    .configure = configure,
    .layout = layout,
    .quantize = FX_QUANTIZE,
    .update = update,
    .dequantize = dequantize,
    .option_size = FX_OPTION_SIZE,
};

/* The fixtures that break the entry function itself write theirs by hand. */
#if defined(FIXTURE_NO_ENTRY) || defined(FIXTURE_V1_ENTRY)
#ifdef FIXTURE_V1_ENTRY
#define WRONG_ENTRY hq_format_module_v1
#else
#define WRONG_ENTRY hq_format_module_v3
#endif
HQ_FORMAT_EXPORT const hq_format_ops *WRONG_ENTRY(const hq_host_api *host);
HQ_FORMAT_EXPORT const hq_format_ops *WRONG_ENTRY(const hq_host_api *host) {
  (void)host;
  return &ops;
}
#elif defined(FIXTURE_REFUSES)
HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  (void)ops;
  host->error(HQ_EABI, "this fixture refuses every core");
  return NULL;
}
#else
HQ_FORMAT_DEFINE(ops);
#endif
