/*
** test_identity.c -- the identity format built as a module from the source libhqcore builds in
** (plugins/identity/identity.c, HQ_FORMAT_BUILTIN), and the host service it converts through:
**   - the module exports its entry function alone (HQ_FORMAT_DEFINE: a NULL host table or one of
**     another ABI major is refused) and describes the format as the built-in does;
**   - on the plugin path it is rejected, the built-in staying (a module cannot replace it);
**   - loaded under another name (tests/identity/identity_module.c), it quantizes, updates and
**     dequantizes on the CPU byte for byte as the built-in, for every source dtype, `dtype`
**     option and set of directions, and both give the hand-computed RNE bytes;
**   - host->convert (ABI 2.4) on the core's real host table: exhaustive bf16/f16 -> f32 against
**     the IEEE definitions, hand-computed f32 -> bf16/f16 roundings, NaN payloads through equal
**     dtypes, and its refusals.
*/
#include <math.h>

#include "hq_test.h"

/* plugins/identity/.libs/identity.so ($HQ_TEST_IDENTITY_SO, set by make check) */
static const char *module_file(void) {
  const char *f = getenv("HQ_TEST_IDENTITY_SO");
  if (!f) fail_msg("HQ_TEST_IDENTITY_SO is not set (make check sets it)");
  return f;
}

/* tests/identity/.libs, the folder of the identity_module wrapper ($HQ_TEST_IDENTITY_DIR) */
static const char *wrapper_dir(void) {
  const char *d = getenv("HQ_TEST_IDENTITY_DIR");
  if (!d) fail_msg("HQ_TEST_IDENTITY_DIR is not set (make check sets it)");
  return d;
}

static void *open_module(void) {
  void *h = dlopen(module_file(), RTLD_NOW | RTLD_LOCAL);
  if (!h) fail_msg("dlopen %s: %s", module_file(), dlerror());
  return h;
}

/* A set holding the built-in identity and the wrapper's identity_module, nothing else. */
static hq_plugins *open_pair(void) {
  const char *dirs[] = {wrapper_dir()};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  if (hq_plugins_rejected_count(set))
    fail_msg("%s: %s", hq_plugins_rejected_file(set, 0), hq_plugins_rejected_reason(set, 0));
  assert_int_equal(hq_plugins_count(set), 2);
  return set;
}

/* The core's host table, as the wrapper received it when the set above loaded it. */
static const hq_host_api *core_host(void) {
  char file[4200];
  snprintf(file, sizeof file, "%s/identity_module.so", wrapper_dir());
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail_msg("dlopen %s: %s", file, dlerror());
  const hq_host_api *(*get)(void) =
      (const hq_host_api *(*)(void))(uintptr_t)dlsym(h, "hq_test_identity_host");
  assert_non_null(get);
  const hq_host_api *host = get();
  assert_non_null(host);
  return host;
}

static void expect_same_options(const hq_option *a, const hq_option *b) {
  size_t i = 0;
  for (; a[i].name; i++) {
    assert_non_null(b[i].name);
    assert_string_equal(a[i].name, b[i].name);
    assert_int_equal(a[i].type, b[i].type);
    assert_string_equal(a[i].def, b[i].def);
    assert_string_equal(a[i].help, b[i].help);
    assert_string_equal(a[i].choices, b[i].choices);
  }
  assert_null(b[i].name);
  assert_int_equal(i, 1); /* dtype */
}

// --- the module's entry and table -----------------------------------------------------------

static int host_errors;
static int counting_error(int code, const char *fmt, ...) {
  (void)fmt;
  host_errors++;
  return code;
}

static void test_entry(void **state) {
  (void)state;
  void *h = open_module();
  hq_format_entry_fn entry = (hq_format_entry_fn)(uintptr_t)dlsym(h, HQ_FORMAT_ENTRY_NAME);
  assert_non_null(entry);
  /* the built-in's entry and the kernel's launcher are not exported from the module */
  assert_null(dlsym(h, "hqi_identity_module"));
  assert_null(dlsym(h, "identity_cuda_adam_convert"));
  /* HQ_FORMAT_DEFINE's check: no host table, or another major, gets NULL without a call */
  assert_null(entry(NULL));
  hq_host_api other = hq_test_host();
  other.abi_major = HQ_ABI_MAJOR + 1;
  other.error = counting_error;
  host_errors = 0;
  assert_null(entry(&other));
  assert_int_equal(host_errors, 0);
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = entry(&host);
  assert_non_null(ops);
  assert_ptr_equal(entry(&host), ops); /* the module's one static table */
  assert_string_equal(ops->name, "identity");
  assert_int_equal(ops->abi_major, HQ_ABI_MAJOR);
  assert_int_equal(ops->abi_minor, 4); /* host->convert */
  assert_int_equal(ops->struct_size, sizeof(hq_format_ops));
  assert_string_equal(ops->version, hq_version());
  /* the built-in is the same table */
  hq_plugins *set = open_pair();
  const hq_plugin *b = hq_plugins_get(set, 0);
  assert_string_equal(hq_plugin_name(b), "identity");
  assert_string_equal(hq_plugin_file(b), "(built into libhqcore)");
  assert_int_equal(ops->caps, hq_plugin_caps(b));
  assert_int_equal(ops->abi_minor, hq_plugin_abi_minor(b));
  assert_string_equal(ops->description, hq_plugin_description(b));
  expect_same_options(hq_plugin_options(b), ops->options);
  hq_plugins_close(set);
  dlclose(h);
}

/* identity.so on the search path: rejected with its reason, the built-in stays first and alone. */
static void test_module_is_a_duplicate(void **state) {
  (void)state;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", module_file());
  char *slash = strrchr(dir, '/');
  assert_non_null(slash);
  *slash = 0;
  const char *dirs[] = {dir};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_count(set), 1);
  assert_string_equal(hq_plugin_file(hq_plugins_get(set, 0)), "(built into libhqcore)");
  assert_int_equal(hq_plugins_rejected_count(set), 1);
  assert_string_equal(hq_plugins_rejected_file(set, 0), module_file());
  assert_string_equal(hq_plugins_rejected_reason(set, 0),
                      "format name 'identity' is built into libhqcore; a module cannot replace "
                      "it");
  hq_plugins_close(set);
}

/* The module loaded by the loader (renamed by the wrapper): what it declares is the built-in's. */
static void test_module_loads(void **state) {
  (void)state;
  hq_plugins *set = open_pair();
  const hq_plugin *b = hq_plugins_get(set, 0), *m = hq_plugins_find(set, "identity_module");
  assert_ptr_equal(hq_plugins_get(set, 1), m);
  assert_non_null(strstr(hq_plugin_file(m), "/identity_module.so"));
  assert_string_equal(hq_plugin_version(m), hq_plugin_version(b));
  assert_int_equal(hq_plugin_caps(m), hq_plugin_caps(b));
  assert_int_equal(hq_plugin_abi_minor(m), 4);
  expect_same_options(hq_plugin_options(b), hq_plugin_options(m));
  hq_plugins_close(set);
}

// --- the same bytes as the built-in ---------------------------------------------------------

static hq_quantizer *quantizer(hq_plugins *set, const char *plugin, const char *opt,
                               uint32_t usage) {
  const char *opts[] = {opt};
  hq_format_spec spec = {sizeof spec, plugin, opts, 1};
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, &spec, HQ_SOURCE_ORIGINAL, &q));
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  return q;
}

/* Storages equal in description and bytes (their plugin names aside). */
static void expect_same_storage(const hq_storage *a, const hq_storage *b) {
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->dir, b->dir);
  assert_int_equal(a->rows, b->rows);
  assert_int_equal(a->cols, b->cols);
  assert_int_equal(a->nominal, b->nominal);
  assert_memory_equal(&a->desc, &b->desc, sizeof a->desc);
  assert_int_equal(a->nbuf, b->nbuf);
  for (uint32_t i = 0; i < a->nbuf; i++) {
    const hq_buffer *x = hq_storage_cbuf(a, i), *y = hq_storage_cbuf(b, i);
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->role, y->role);
    assert_int_equal(x->flags, y->flags);
    assert_int_equal(x->gather, y->gather);
    assert_int_equal(x->ndim, y->ndim);
    assert_memory_equal(x->shape, y->shape, sizeof x->shape);
    assert_int_equal(x->bytes, y->bytes);
    assert_memory_equal(x->ptr, y->ptr, x->bytes);
  }
}

/* Every source dtype, `dtype` option and set of directions: quantize, dequantize into each
   dtype, then update from a second tensor and dequantize again; the module's bytes are the
   built-in's. Sources mix N(0,1) values with the special ones (signed zeros, Inf, NaN, ties,
   subnormals, f16 overflow). */
static void test_same_bytes_as_builtin(void **state) {
  (void)state;
  static const uint32_t special[] = {0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                     0xffa00000u, 0x3f808000u, 0x3f818000u, 0x477ff000u,
                                     0x00010000u, 0x33800000u, 0x387fe000u, 0x00000001u};
  static const char *const opts[] = {"dtype=auto", "dtype=f32", "dtype=bf16", "dtype=f16"};
  static const hq_dtype dts[] = {HQ_F32, HQ_BF16, HQ_F16};
  static const uint32_t usages[] = {HQ_ROWWISE, HQ_COLWISE, HQ_BOTH};
  hq_plugins *set = open_pair();
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const int64_t M = 24, K = 40;
  int compared = 0;
  for (size_t s = 0; s < 3; s++) {
    hq_tensor x[2];
    for (int k = 0; k < 2; k++) {
      x[k] = hq_test_tensor(dts[s], M, K, 11 + (uint64_t)k, 3.0f);
      for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        hq_store_hp(x[k].data, (int64_t)(7 * i + (size_t)k), dts[s], hq_bits_f32(special[i]));
    }
    for (size_t o = 0; o < 4; o++)
      for (size_t u = 0; u < 3; u++) {
        hq_quantizer *qb = quantizer(set, "identity", opts[o], usages[u]);
        hq_quantizer *qm = quantizer(set, "identity_module", opts[o], usages[u]);
        assert_int_equal(hq_quantizer_fused(qb), 1);
        assert_int_equal(hq_quantizer_fused(qm), 1);
        hq_qtensor *tb = NULL, *tm = NULL;
        HQ_OK_OR_FAIL(hq_quantize(qb, ctx, &x[0], &tb));
        HQ_OK_OR_FAIL(hq_quantize(qm, ctx, &x[0], &tm));
        for (int pass = 0; pass < 2; pass++) {
          if (pass) {
            HQ_OK_OR_FAIL(hq_qtensor_update(tb, ctx, &x[1]));
            HQ_OK_OR_FAIL(hq_qtensor_update(tm, ctx, &x[1]));
          }
          assert_int_equal(hq_qtensor_dirs(tb), usages[u]);
          assert_int_equal(hq_qtensor_dirs(tm), usages[u]);
          for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
            if (!(usages[u] & dir)) continue;
            expect_same_storage(hq_qtensor_storage(tb, dir), hq_qtensor_storage(tm, dir));
            for (size_t d = 0; d < 3; d++) {
              hq_tensor yb = hq_test_empty(dts[d], M, K), ym = hq_test_empty(dts[d], M, K);
              HQ_OK_OR_FAIL(hq_dequantize(tb, ctx, dir, &yb));
              HQ_OK_OR_FAIL(hq_dequantize(tm, ctx, dir, &ym));
              assert_memory_equal(yb.data, ym.data, (size_t)(M * K) * hq_dtype_size(dts[d]));
              free(yb.data);
              free(ym.data);
              compared++;
            }
          }
        }
        hq_qtensor_free(tb);
        hq_qtensor_free(tm);
        hq_quantizer_free(qb);
        hq_quantizer_free(qm);
      }
    free(x[0].data);
    free(x[1].data);
  }
  /* 3 sources x 4 options x (1 + 1 + 2 directions) x 2 passes x 3 output dtypes */
  assert_int_equal(compared, 3 * 4 * 4 * 2 * 3);
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}

/* f32 values and their bf16 / f16 bytes, rounded to nearest even by hand: 1, -2.5, the bf16 ties
   1 + 2^-8 (to the even 0x3F80) and 1 + 3 * 2^-8 (to the even 0x3F82, f16 exact), 65520 (bf16
   rounds up to 65536; f16's tie between 65504 and the next step goes to Inf), -0, 2^-133 (a bf16
   subnormal, 0 in f16) and 2^-24 (f16's smallest subnormal). */
static const uint32_t hand_f32[8] = {0x3f800000u, 0xc0200000u, 0x3f808000u, 0x3f818000u,
                                     0x477ff000u, 0x80000000u, 0x00010000u, 0x33800000u};
static const uint16_t hand_bf16[8] = {0x3f80u, 0xc020u, 0x3f80u, 0x3f82u,
                                      0x4780u, 0x8000u, 0x0001u, 0x3380u};
static const uint16_t hand_f16[8] = {0x3c00u, 0xc100u, 0x3c04u, 0x3c0cu,
                                     0x7c00u, 0x8000u, 0x0000u, 0x0001u};
/* ... and the f32 values those f16 codes stand for */
static const uint32_t hand_f16_f32[8] = {0x3f800000u, 0xc0200000u, 0x3f808000u, 0x3f818000u,
                                         0x7f800000u, 0x80000000u, 0x00000000u, 0x33800000u};

static void test_hand_computed(void **state) {
  (void)state;
  hq_plugins *set = open_pair();
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  float src[8];
  memcpy(src, hand_f32, sizeof src);
  hq_tensor x = hq_tensor_2d(src, HQ_F32, HQ_DEVICE_HOST, 2, 4);
  const char *plugins[] = {"identity", "identity_module"};
  for (int p = 0; p < 2; p++)
    for (int t = 0; t < 2; t++) {
      hq_quantizer *q = quantizer(set, plugins[p], t ? "dtype=f16" : "dtype=bf16", HQ_ROWWISE);
      hq_qtensor *qt = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
      const hq_buffer *b = hq_storage_cbuf(hq_qtensor_storage(qt, HQ_ROWWISE), 0);
      assert_int_equal(b->dtype, t ? HQ_F16 : HQ_BF16);
      assert_memory_equal(b->ptr, t ? hand_f16 : hand_bf16, sizeof hand_bf16);
      uint32_t back[8];
      hq_tensor y = hq_tensor_2d(back, HQ_F32, HQ_DEVICE_HOST, 2, 4);
      HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &y));
      for (int i = 0; i < 8; i++)
        assert_int_equal(back[i], t ? hand_f16_f32[i] : (uint32_t)hand_bf16[i] << 16);
      hq_qtensor_free(qt);
      hq_quantizer_free(q);
    }
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}

/* hq_pack2_hp16 (hq/numerics.h), the pair the CUDA kernels' 16-bit vector stores write: each
   pair of the hand-computed vector above packs to the two hand-computed codes, the first in the
   low half (little-endian memory order), for BF16 and F16. */
static void test_pack2(void **state) {
  (void)state;
  for (int i = 0; i < 8; i += 2) {
    float a, b;
    memcpy(&a, &hand_f32[i], 4);
    memcpy(&b, &hand_f32[i + 1], 4);
    assert_int_equal(hq_pack2_hp16(a, b, HQ_BF16),
                     (uint32_t)hand_bf16[i] | (uint32_t)hand_bf16[i + 1] << 16);
    assert_int_equal(hq_pack2_hp16(a, b, HQ_F16),
                     (uint32_t)hand_f16[i] | (uint32_t)hand_f16[i + 1] << 16);
  }
}

/* The module on a host table older than 2.4 (no convert): it refuses, naming the service. */
static void test_module_needs_convert(void **state) {
  (void)state;
  void *h = open_module();
  hq_format_entry_fn entry = (hq_format_entry_fn)(uintptr_t)dlsym(h, HQ_FORMAT_ENTRY_NAME);
  hq_host_api host = hq_test_host();
  host.abi_minor = 3;
  host.struct_size = (uint32_t)offsetof(hq_host_api, convert);
  const hq_format_ops *ops = entry(&host);
  assert_non_null(ops);
  hq_optval v = {0, 0, NULL}; /* dtype = auto */
  char cfg[64] = {0};
  assert_true(ops->config_size <= sizeof cfg);
  assert_int_equal(ops->configure(cfg, &v, &host), HQ_OK);
  hq_storage st;
  hq_test_storage_init(&st, HQ_ROWWISE, 2, 4, HQ_F32);
  assert_int_equal(ops->layout(cfg, &host, 2, 4, HQ_ROWWISE, HQ_ROWWISE, &st), HQ_OK);
  float src[8] = {0}, dst[8];
  hq_storage_buf(&st, 0)->ptr = dst;
  hq_tensor x = hq_tensor_2d(src, HQ_F32, HQ_DEVICE_HOST, 2, 4);
  hq_call call = hq_test_call(&host, 0, 0);
  hq_test_module_error()[0] = 0;
  assert_int_equal(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &st, NULL), HQ_ENOTSUP);
  assert_string_equal(hq_test_module_error(),
                      "identity: the core offers no convert service (ABI 2.4)");
  /* with the service (the test host's), the same call stores the values */
  host.abi_minor = 4;
  host.struct_size = sizeof host;
  for (int i = 0; i < 8; i++) src[i] = (float)i - 2.5f;
  assert_int_equal(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &st, NULL), HQ_OK);
  assert_memory_equal(dst, src, sizeof src);
  dlclose(h);
}

// --- host->convert --------------------------------------------------------------------------

static int convert(const hq_host_api *host, void *dst, hq_dtype dt, const void *src, hq_dtype st,
                   int64_t n) {
  hq_call call = hq_test_call(host, 0, 0);
  return host->convert(&call, dst, dt, src, st, n);
}

/* The f32 an f16 code stands for (IEEE 754 binary16), NaN payloads moved up 13 places. */
static uint32_t f16_ref(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31) return sign | 0x7f800000u | m << 13;
  float v = e ? ldexpf((float)(1024u + m), (int)e - 25) : ldexpf((float)m, -24);
  uint32_t u;
  memcpy(&u, &v, 4);
  return sign | u;
}

static void test_host_convert(void **state) {
  (void)state;
  hq_plugins *set = open_pair();
  const hq_host_api *host = core_host();
  assert_int_equal(host->abi_major, HQ_ABI_MAJOR);
  assert_int_equal(host->abi_minor, 6);
  assert_true(host->struct_size >= HQ_HOST_API_SIZE_2_4);
  assert_non_null(host->convert);
  /* every bf16 and f16 code into f32: exact */
  uint16_t *codes = malloc(65536 * 2);
  uint32_t *out = malloc(65536 * 4);
  for (uint32_t i = 0; i < 65536; i++) codes[i] = (uint16_t)i;
  HQ_OK_OR_FAIL(convert(host, out, HQ_F32, codes, HQ_BF16, 65536));
  for (uint32_t i = 0; i < 65536; i++)
    if (out[i] != i << 16) fail_msg("bf16 0x%04x -> f32 0x%08x", i, out[i]);
  HQ_OK_OR_FAIL(convert(host, out, HQ_F32, codes, HQ_F16, 65536));
  for (uint32_t i = 0; i < 65536; i++)
    if (out[i] != f16_ref((uint16_t)i)) fail_msg("f16 0x%04x -> f32 0x%08x", i, out[i]);
  /* equal dtypes copy bytes: every 16-bit code, NaNs included, comes back as it was */
  uint16_t *same = malloc(65536 * 2);
  HQ_OK_OR_FAIL(convert(host, same, HQ_F16, codes, HQ_F16, 65536));
  assert_memory_equal(same, codes, 65536 * 2);
  HQ_OK_OR_FAIL(convert(host, same, HQ_BF16, codes, HQ_BF16, 65536));
  assert_memory_equal(same, codes, 65536 * 2);
  const uint32_t nans[2] = {0x7fa00001u, 0xffa00001u}; /* signalling, both signs */
  uint32_t nan_out[2];
  HQ_OK_OR_FAIL(convert(host, nan_out, HQ_F32, nans, HQ_F32, 2));
  assert_memory_equal(nan_out, nans, sizeof nans);
  /* f32 -> bf16 / f16, rounded to nearest even (the hand-computed table); NaN stays a quiet NaN
     with its sign */
  uint16_t h16[8];
  HQ_OK_OR_FAIL(convert(host, h16, HQ_BF16, hand_f32, HQ_F32, 8));
  assert_memory_equal(h16, hand_bf16, sizeof h16);
  HQ_OK_OR_FAIL(convert(host, h16, HQ_F16, hand_f32, HQ_F32, 8));
  assert_memory_equal(h16, hand_f16, sizeof h16);
  HQ_OK_OR_FAIL(convert(host, h16, HQ_BF16, nans, HQ_F32, 2));
  assert_int_equal(h16[0], 0x7fe0u);
  assert_int_equal(h16[1], 0xffe0u);
  HQ_OK_OR_FAIL(convert(host, h16, HQ_F16, nans, HQ_F32, 2));
  assert_int_equal(h16[0], 0x7e00u);
  assert_int_equal(h16[1], 0xfe00u);
  /* f16 -> bf16 through f32: 1 + 2^-10 and 1 + 3 * 2^-10 round down, 1 + 6 * 2^-10 up */
  const uint16_t f16s[3] = {0x3c01u, 0x3c03u, 0x3c06u};
  HQ_OK_OR_FAIL(convert(host, h16, HQ_BF16, f16s, HQ_F16, 3));
  assert_int_equal(h16[0], 0x3f80u);
  assert_int_equal(h16[1], 0x3f80u);
  assert_int_equal(h16[2], 0x3f81u);
  /* refusals */
  hq_clear_error();
  assert_int_equal(convert(host, out, HQ_F32, codes, HQ_E4M3, 4), HQ_EINVAL);
  HQ_ERROR_HAS("host->convert: e4m3 -> f32: both dtypes must be f32, f16 or bf16");
  assert_int_equal(convert(host, out, HQ_I8, codes, HQ_F32, 4), HQ_EINVAL);
  HQ_ERROR_HAS("host->convert: f32 -> i8");
  assert_int_equal(convert(host, out, HQ_F32, codes, HQ_F16, -1), HQ_EINVAL);
  HQ_ERROR_HAS("n = -1 is negative");
  assert_int_equal(convert(host, NULL, HQ_F32, codes, HQ_F16, 1), HQ_EINVAL);
  HQ_ERROR_HAS("host->convert: a NULL pointer");
  assert_int_equal(host->convert(NULL, out, HQ_F32, codes, HQ_F16, 1), HQ_EINVAL);
  HQ_ERROR_HAS("host->convert: the call is NULL");
  HQ_OK_OR_FAIL(convert(host, NULL, HQ_F32, NULL, HQ_F16, 0)); /* nothing to convert */
  free(codes);
  free(out);
  free(same);
  hq_plugins_close(set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry),
      cmocka_unit_test(test_module_is_a_duplicate),
      cmocka_unit_test(test_module_loads),
      cmocka_unit_test(test_same_bytes_as_builtin),
      cmocka_unit_test(test_hand_computed),
      cmocka_unit_test(test_pack2),
      cmocka_unit_test(test_module_needs_convert),
      cmocka_unit_test(test_host_convert),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
