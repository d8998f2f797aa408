/*
** test_services_api.c -- the public functions of libhqcore that the trainer services
** (libhqtrain, services/) are built on, against hand-written expectations:
**   - hq_qtensor_format_desc: instance, plugin, version, layout version (the stock module's 1),
**     option names, values and defaults in table order, for present and absent directions;
**     struct_size handling;
**   - hq_qtensor_role / _columnwise_source / _device / _amax_kind;
**   - hq_qtensor_unshare: private copies of equal bytes under the columnwise names, all or none
**     when an allocation fails, shared again by an update of both directions;
**   - hq_qtensor_update_adam's refusals (its fused path runs on a GPU: test_gpu_core);
**   - hq_set_error, hq_tensor_check and hq_fpenv_enter / hq_fpenv_leave.
*/
#include <math.h>

#include "hq_test.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

static hq_ctx *g_ctx;
static hq_plugins *g_set;

static int setup(void **s) {
  (void)s;
  if (hq_ctx_create(NULL, &g_ctx)) return -1;
  return hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &g_set);
}
static int teardown(void **s) {
  (void)s;
  hq_plugins_close(g_set);
  hq_ctx_destroy(g_ctx);
  return 0;
}

/* A direct quantizer: `row` and `col` are plugin names (NULL: identity), one option each. */
static hq_quantizer *direct(const char *row, const char *ropt, const char *col, int source) {
  const char *ro[1] = {ropt};
  hq_format_spec r = {sizeof r, row, ropt ? ro : NULL, ropt ? 1u : 0u};
  hq_format_spec c = {sizeof c, col, NULL, 0};
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(g_set, &r, &c, source, &q));
  return q;
}

static hq_qtensor *quantize(hq_quantizer *q, hq_ctx *ctx, uint64_t seed) {
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 128, seed, 2.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  free(x.data);
  return qt;
}

static void test_format_desc(void **s) {
  (void)s;
  hq_quantizer *q = direct("fp8_tensor", "dtype=e5m2", NULL, HQ_SOURCE_ORIGINAL);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  hq_qtensor *qt = quantize(q, g_ctx, 1);
  const hq_plugin *p = hq_plugins_find(g_set, "fp8_tensor");
  const hq_option *o = hq_plugin_options(p);
  hq_format_desc d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  HQ_OK_OR_FAIL(hq_qtensor_format_desc(qt, HQ_ROWWISE, &d));
  assert_int_equal(d.struct_size, sizeof d);
  assert_int_equal(d.layout_version, 1);
  assert_string_equal(d.name, "fp8_tensor"); /* a direct quantizer's instance: the plugin's */
  assert_string_equal(d.plugin, "fp8_tensor");
  assert_string_equal(d.plugin_version, hq_plugin_version(p));
  size_t n = 0;
  while (o[n].name) n++;
  assert_int_equal(d.n_options, n);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(d.option_names[i], o[i].name);
    assert_string_equal(d.option_defaults[i], o[i].def);
    assert_string_equal(d.option_values[i], i == 0 ? "e5m2" : o[i].def);
  }
  assert_string_equal(d.option_names[0], "dtype");
  /* the columnwise direction is absent, its format (identity) still described */
  HQ_OK_OR_FAIL(hq_qtensor_format_desc(qt, HQ_COLWISE, &d));
  assert_string_equal(d.plugin, "identity");
  assert_int_equal(d.layout_version, 1);
  assert_int_equal(d.n_options, 1);
  assert_string_equal(d.option_names[0], "dtype");
  assert_string_equal(d.option_values[0], "auto");
  /* refusals: a direction mask, a struct older than its first layout */
  assert_int_equal(hq_qtensor_format_desc(qt, HQ_BOTH, &d), HQ_EINVAL);
  d.struct_size = 8;
  assert_int_equal(hq_qtensor_format_desc(qt, HQ_ROWWISE, &d), HQ_EINVAL);
  HQ_ERROR_HAS("struct_size = 8");
  /* a caller built against a later header: the fields this library knows, the rest left alone */
  struct {
    hq_format_desc d;
    uint64_t later;
  } big;
  memset(&big, 0, sizeof big);
  big.d.struct_size = sizeof big;
  big.later = 0x5eedull;
  HQ_OK_OR_FAIL(hq_qtensor_format_desc(qt, HQ_ROWWISE, &big.d));
  assert_int_equal(big.d.struct_size, sizeof big.d);
  assert_string_equal(big.d.plugin, "fp8_tensor");
  assert_int_equal(big.later, 0x5eedull);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
}

static void test_queries(void **s) {
  (void)s;
  /* fp8_tensor (current scaling) rowwise, fp8_tensor columnwise from the dequantized rowwise
     copy: the rowwise amax is max|x| of the input, the columnwise one the format's own */
  hq_quantizer *q = direct("fp8_tensor", NULL, "fp8_tensor", HQ_SOURCE_ROWWISE_DEQUANTIZED);
  hq_qtensor *qt = quantize(q, g_ctx, 2);
  assert_string_equal(hq_qtensor_role(qt), "(direct)");
  assert_int_equal(hq_qtensor_columnwise_source(qt), HQ_SOURCE_ROWWISE_DEQUANTIZED);
  assert_int_equal(hq_qtensor_device(qt), HQ_DEVICE_HOST);
  assert_int_equal(hq_qtensor_amax_kind(qt, HQ_ROWWISE), HQ_AMAX_INPUT);
  assert_int_equal(hq_qtensor_amax_kind(qt, HQ_COLWISE), HQ_AMAX_OWN);
  assert_int_equal(hq_qtensor_amax_kind(qt, HQ_BOTH), HQ_AMAX_NONE);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  /* a recipe role; mxfp8 has block scales only */
  hq_recipe *r =
      hq_test_recipe("[role linear:weight:*]\nrowwise = mxfp8\ncolumnwise = fp8_tensor\n");
  q = hq_test_quantizer(r, "linear:weight:fc1");
  qt = quantize(q, g_ctx, 3);
  assert_string_equal(hq_qtensor_role(qt), "linear:weight:fc1");
  assert_int_equal(hq_qtensor_columnwise_source(qt), HQ_SOURCE_ORIGINAL);
  assert_int_equal(hq_qtensor_amax_kind(qt, HQ_ROWWISE), HQ_AMAX_NONE);
  assert_int_equal(hq_qtensor_amax_kind(qt, HQ_COLWISE), HQ_AMAX_INPUT);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  assert_null(hq_qtensor_role(NULL));
}

/* An allocator that fails allocation number g_fail_at (counted from 0 since g_count was reset). */
static long g_count, g_fail_at = -1;
static void *fail_alloc(void *user, int device, size_t bytes, void *stream) {
  (void)user, (void)device, (void)stream;
  return g_count++ == g_fail_at ? NULL : malloc(bytes);
}
static void fail_free(void *user, int device, void *ptr, void *stream) {
  (void)user, (void)device, (void)stream;
  free(ptr);
}

/* Columnwise buffer i of qt: its name, and whether it is rowwise buffer shared_with. */
static const hq_buffer *colbuf(const hq_qtensor *qt, uint32_t i) {
  return hq_storage_cbuf(hq_qtensor_storage(qt, HQ_COLWISE), i);
}
static int aliased(const hq_qtensor *qt, uint32_t i) {
  const hq_buffer *b = colbuf(qt, i);
  const hq_storage *row = hq_qtensor_storage(qt, HQ_ROWWISE);
  return b->ptr == hq_storage_cbuf(row, (uint32_t)b->shared_with)->ptr;
}

static void test_unshare(void **s) {
  (void)s;
  const hq_allocator al = {
      .struct_size = sizeof al, .alloc = fail_alloc, .free = fail_free, .user = NULL};
  hq_ctx_desc desc = {sizeof desc, HQ_DEVICE_HOST, NULL, &al, NULL, NULL, 0};
  hq_ctx *ctx;
  HQ_OK_OR_FAIL(hq_ctx_create(&desc, &ctx));
  /* fp8_tensor from one call: columnwise scale_inv (1) and amax (2) are the rowwise ones */
  hq_quantizer *q = direct("fp8_tensor", NULL, "fp8_tensor", HQ_SOURCE_ORIGINAL);
  hq_qtensor *qt = quantize(q, ctx, 4);
  assert_string_equal(colbuf(qt, 1)->name, "scale_inv");
  assert_string_equal(colbuf(qt, 2)->name, "amax");
  assert_true(aliased(qt, 1) && aliased(qt, 2));
  const size_t col_bytes = hq_qtensor_bytes(qt, HQ_COLWISE);
  /* the second of the two allocations fails: neither buffer is made private */
  for (long k = 0; k < 2; k++) {
    g_count = 0;
    g_fail_at = k;
    assert_int_equal(hq_qtensor_unshare(qt, ctx), HQ_ENOMEM);
    HQ_ERROR_HAS("memory");
    assert_true(aliased(qt, 1) && aliased(qt, 2));
    assert_string_equal(colbuf(qt, 1)->name, "scale_inv");
    assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), col_bytes);
  }
  g_fail_at = -1;
  HQ_OK_OR_FAIL(hq_qtensor_unshare(qt, ctx));
  assert_string_equal(colbuf(qt, 1)->name, "columnwise_scale_inv");
  assert_string_equal(colbuf(qt, 2)->name, "columnwise_amax");
  assert_false(aliased(qt, 1) || aliased(qt, 2));
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), col_bytes + 2 * sizeof(float));
  for (uint32_t i = 1; i <= 2; i++)
    assert_memory_equal(colbuf(qt, i)->ptr,
                        hq_storage_cbuf(hq_qtensor_storage(qt, HQ_ROWWISE), i)->ptr, 4);
  HQ_OK_OR_FAIL(hq_qtensor_unshare(qt, ctx)); /* nothing shared any more: nothing to do */
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), col_bytes + 2 * sizeof(float));
  /* an update of both directions by one call shares them again */
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 128, 5, 2.0f);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  assert_true(aliased(qt, 1) && aliased(qt, 2));
  assert_string_equal(colbuf(qt, 1)->name, "scale_inv");
  /* a saved qtensor, another device */
  hq_saved_buffer sv[8];
  size_t n;
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 8, sizeof sv[0], &n));
  assert_int_equal(hq_qtensor_unshare(qt, ctx), HQ_ESTATE);
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, sv, n, sizeof sv[0]));
  assert_int_equal(hq_qtensor_unshare(NULL, ctx), HQ_EINVAL);
  free(x.data);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  hq_ctx_destroy(ctx);
}

/* hq_qtensor_update_adam takes its one fused call on a CUDA device only: on the host it refuses
   with HQ_ENOTSUP and runs nothing; wrong arguments (a misaligned k_dev too) are refused
   first. */
static void test_update_adam_refusals(void **s) {
  (void)s;
  hq_quantizer *q = direct("mxfp8", NULL, "mxfp8", HQ_SOURCE_ORIGINAL);
  hq_qtensor *qt = quantize(q, g_ctx, 6);
  const hq_storage *row = hq_qtensor_storage(qt, HQ_ROWWISE);
  unsigned char before[64];
  memcpy(before, hq_storage_cbuf(row, 0)->ptr, sizeof before);
  hq_tensor w = hq_test_tensor(HQ_F32, 64, 128, 7, 1.0f);
  hq_tensor g = hq_test_tensor(HQ_F32, 64, 128, 8, 1.0f);
  float *m = calloc(64 * 128, 4), *v = calloc(64 * 128, 4);
  float w0 = ((float *)w.data)[0];
  hq_adam_pass pass;
  memset(&pass, 0, sizeof pass);
  pass.struct_size = sizeof pass;
  pass.grad_dtype = HQ_F32;
  pass.grad = g.data;
  pass.m = m;
  pass.v = v;
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &w, &pass), HQ_ENOTSUP);
  HQ_ERROR_HAS("hq_qtensor_update_adam: role (direct)");
  assert_true(((float *)w.data)[0] == w0 && m[0] == 0.0f);
  assert_memory_equal(hq_storage_cbuf(row, 0)->ptr, before, sizeof before);
  hq_tensor wb = hq_test_tensor(HQ_BF16, 64, 128, 7, 1.0f), ws = w;
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &wb, &pass), HQ_EINVAL);
  HQ_ERROR_HAS("bf16 [64, 128]");
  ws.cols = 64;
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &ws, &pass), HQ_ESHAPE);
  HQ_ERROR_HAS("[64, 64]");
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &w, NULL), HQ_EINVAL);
  /* constants in device memory (ABI 2.6) must be 16-byte aligned; a pass of the 2.2 layout has
     none, whatever lies past it */
  _Alignas(16) unsigned char slot[48];
  pass.k_dev = (const hq_adam_consts *)(slot + 4);
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &w, &pass), HQ_EINVAL);
  HQ_ERROR_HAS("k_dev");
  HQ_ERROR_HAS("16-byte aligned");
  pass.struct_size = HQ_ADAM_PASS_SIZE_2_2;
  assert_int_equal(hq_qtensor_update_adam(qt, g_ctx, &w, &pass), HQ_ENOTSUP);
  assert_true(((float *)w.data)[0] == w0 && m[0] == 0.0f);
  free(w.data), free(wb.data), free(g.data), free(m), free(v);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
}

static void test_errors_and_tensors(void **s) {
  (void)s;
  assert_int_equal(hq_set_error(HQ_EIO, "reading %s: %d", "x.bin", 3), HQ_EIO);
  assert_string_equal(hq_last_error(), "reading x.bin: 3");
  assert_int_equal(hq_set_error(HQ_ENOMEM, "a buffer of %d bytes", 8), HQ_ENOMEM);
  assert_string_equal(hq_last_error(), "out of memory: a buffer of 8 bytes");
  hq_set_error(HQ_ENOMEM, "no memory for it");
  assert_string_equal(hq_last_error(), "no memory for it");
  hq_clear_error();

  uint16_t data[9];
  hq_tensor t = hq_test_empty(HQ_F32, 2, 3), out;
  HQ_OK_OR_FAIL(hq_tensor_check(&t, "mine", &out));
  assert_memory_equal(&out, &t, sizeof t);
  /* a struct of the oldest layout is read as it is */
  t.struct_size = HQ_TENSOR_SIZE_2_0;
  HQ_OK_OR_FAIL(hq_tensor_check(&t, "mine", &out));
  assert_int_equal(out.struct_size, sizeof out);
  assert_int_equal(out.rows * out.cols, 6);
  t.struct_size = 4;
  assert_int_equal(hq_tensor_check(&t, "mine", &out), HQ_EINVAL);
  HQ_ERROR_HAS("mine");
  free(t.data);
  assert_int_equal(hq_tensor_check(NULL, "mine", &out), HQ_EINVAL);
  HQ_ERROR_HAS("mine: tensor is NULL");
  hq_tensor b = hq_tensor_2d((char *)data + 1, HQ_BF16, HQ_DEVICE_HOST, 2, 2);
  assert_int_equal(hq_tensor_check(&b, "odd", &out), HQ_EINVAL);
  HQ_ERROR_HAS("aligned");
  b = hq_tensor_2d(data, HQ_U8, HQ_DEVICE_HOST, 2, 2);
  assert_int_equal(hq_tensor_check(&b, "u8", &out), HQ_EINVAL);
  b = hq_tensor_2d(data, HQ_BF16, HQ_DEVICE_HOST, 0, 2);
  assert_int_equal(hq_tensor_check(&b, "empty", &out), HQ_ESHAPE);
  b = hq_tensor_2d(data, HQ_BF16, HQ_DEVICE_HOST, (int64_t)1 << 25, (int64_t)1 << 24);
  assert_int_equal(hq_tensor_check(&b, "huge", &out), HQ_ESHAPE);
  HQ_ERROR_HAS("2^48");
}

/* x86: FTZ (bit 15), DAZ (bit 6) and rounding toward zero (bits 13-14) are cleared by
   hq_fpenv_enter and put back by hq_fpenv_leave; elsewhere the pair only has to round-trip. */
static void test_fpenv(void **s) {
  (void)s;
#if defined(__x86_64__)
  const unsigned keep = _mm_getcsr();
  _mm_setcsr(keep | 0x8040u | 0x6000u);
  const hq_fpenv mode = hq_fpenv_enter();
  assert_int_equal(_mm_getcsr() & 0xe040u, 0);
  volatile float tiny = 0x1p-140f; /* subnormal: kept, not flushed */
  assert_true(tiny * 2.0f == 0x1p-139f);
  hq_fpenv_leave(mode);
  assert_int_equal(_mm_getcsr() & 0xe040u, 0xe040u);
  _mm_setcsr(keep);
#else
  hq_fpenv_leave(hq_fpenv_enter());
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format_desc),      cmocka_unit_test(test_queries),
      cmocka_unit_test(test_unshare),          cmocka_unit_test(test_update_adam_refusals),
      cmocka_unit_test(test_errors_and_tensors), cmocka_unit_test(test_fpenv),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
