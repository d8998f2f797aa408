/*
** fixture.c -- test-only format modules for the loader and recipe tests. One source, built
** several times with a FIXTURE_* macro selecting what is wrong with each module:
**   good.so          a valid module "test_good" with one option of each type
**   good_dup.so      a valid module that reuses the name "test_good"
**   bad_major.so     abi_major = HQ_ABI_MAJOR + 1
**   newer_minor.so   abi_minor = HQ_ABI_MINOR + 1
**   small_struct.so  struct_size smaller than ABI 1.0's table
**   no_entry.so      exports a differently named function, not the entry point
**   missing_op.so    quantize = NULL
**   bad_option.so    an option whose default is not a valid value
**   refuses.so       the entry function returns NULL after host->error()
**   bad_name.so      format name with an upper-case letter
**   save_rev.so      a valid module "test_save_rev": three buffers, save() hands them out in
**                    reverse order, restore() takes them back
**   save_bad.so      a valid module "test_save_bad" whose save() forgets a buffer
*/
#include <string.h>

#include "hq/plugin.h"

static const hq_option options[] = {
    {"level", HQ_OPT_INT, "3", "an integer in [0, 10]", NULL, 0, 10},
    {"ratio", HQ_OPT_FLOAT, "0.5", "a float in [0, 1]", NULL, 0, 1},
    {"mode", HQ_OPT_ENUM, "fast", "an enum", "fast|exact", 0, -1},
    {"flag", HQ_OPT_BOOL, "false", "a bool", NULL, 0, -1},
#ifdef FIXTURE_BAD_OPTION
    {"broken", HQ_OPT_INT, "eleven", "default is not an integer", NULL, 0, -1},
#endif
    {"label", HQ_OPT_STRING, "", "free text", NULL, 0, -1},
    {NULL, 0, NULL, NULL, NULL, 0, 0},
};

typedef struct cfg { int level; } cfg;

/* level 9 asks for shared scaling state, which the core does not provide yet */
static uint32_t state_floats(const void *c) { return ((const cfg *)c)->level == 9 ? 4u : 0u; }

static int configure(void *c, const hq_optval *v, const hq_host_api *host) {
  ((cfg *)c)->level = (int)v[0].i;
  if (v[0].i == 7) return host->error(HQ_EINVAL, "level 7 is unlucky");
  return HQ_OK;
}

static int layout(const void *c, const hq_host_api *host, int64_t rows, int64_t cols,
                  uint32_t dir, uint32_t dirs, hq_storage *out) {
  (void)c; (void)host; (void)dir; (void)dirs;
  out->nbuf = 1;
  out->buf[0].name = "data";
  out->buf[0].dtype = HQ_F32;
  out->buf[0].ndim = 2;
  out->buf[0].shape[0] = rows;
  out->buf[0].shape[1] = cols;
#if defined(FIXTURE_SAVE_REV) || defined(FIXTURE_SAVE_BAD)
  static const char *names[3] = {"data", "first", "second"};
  out->nbuf = 3;
  for (int i = 1; i < 3; i++) {
    out->buf[i].name = names[i];
    out->buf[i].dtype = HQ_U8;
    out->buf[i].ndim = 1;
    out->buf[i].shape[0] = i;
  }
#endif
  return HQ_OK;
}

#if defined(FIXTURE_SAVE_REV) || defined(FIXTURE_SAVE_BAD)
static int save(const void *c, hq_storage *s, void **out, uint32_t *n) {
  (void)c;
  *n = 0;
  for (int i = (int)s->nbuf - 1; i >= 0; i--) {
#ifdef FIXTURE_SAVE_BAD
    if (i == 1) continue; /* forgets "first" */
#endif
    if (s->buf[i].ptr) out[(*n)++] = s->buf[i].ptr;
    s->buf[i].ptr = NULL;
  }
  return HQ_OK;
}

static int restore(const void *c, hq_storage *s, void *const *in, uint32_t n) {
  (void)c;
  if (n != s->nbuf) return HQ_EINVAL;
  for (uint32_t i = 0; i < n; i++) s->buf[s->nbuf - 1 - i].ptr = in[i];
  return HQ_OK;
}
#endif

static int quantize(const void *c, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  (void)c; (void)call; (void)src; (void)dirs; (void)row; (void)col;
  return HQ_OK;
}

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)c; (void)call; (void)s; (void)dst;
  return HQ_OK;
}

static hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = HQ_ABI_MINOR,
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(cfg),
    .name = "test_good",
    .version = "0.0",
    .description = "loader test fixture",
    .caps = HQ_CAP_CPU,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .state_floats = state_floats,
};

#ifdef FIXTURE_NO_ENTRY
HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  (void)host;
  return &ops;
}
#else
HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v1(const hq_host_api *host) {
#if defined(FIXTURE_BAD_MAJOR)
  ops.abi_major = HQ_ABI_MAJOR + 1;
  ops.name = "test_bad_major";
#elif defined(FIXTURE_NEWER_MINOR)
  ops.abi_minor = HQ_ABI_MINOR + 1;
  ops.name = "test_newer_minor";
#elif defined(FIXTURE_SMALL_STRUCT)
  ops.struct_size = 24;
  ops.name = "test_small_struct";
#elif defined(FIXTURE_MISSING_OP)
  ops.quantize = NULL;
  ops.name = "test_missing_op";
#elif defined(FIXTURE_BAD_OPTION)
  ops.name = "test_bad_option";
#elif defined(FIXTURE_REFUSES)
  host->error(HQ_EABI, "this fixture refuses every core");
  return NULL;
#elif defined(FIXTURE_BAD_NAME)
  ops.name = "Test_Bad";
#elif defined(FIXTURE_SAVE_REV) || defined(FIXTURE_SAVE_BAD)
#ifdef FIXTURE_SAVE_REV
  ops.name = "test_save_rev";
#else
  ops.name = "test_save_bad";
#endif
  ops.save = save;
  ops.restore = restore;
  ops.caps |= HQ_CAP_COLWISE_ONLY;
#endif
  (void)host;
  return &ops;
}
#endif
