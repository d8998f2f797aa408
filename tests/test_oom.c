/*
** test_oom.c -- allocation failures injected one at a time. The test program replaces malloc,
** calloc, realloc, free and the aligned allocators (ELF interposition: libhqcore and the plugins
** call these), counts the allocations of one operation, and then runs the operation again
** failing the 1st, the 2nd, ... allocation in turn, until a run meets no failure. Each failed run
** must return HQ_ENOMEM with a message about memory -- never another status, never a crash, never
** a half-built object (a recipe parse that fails an allocation is refused as a whole) -- and leave
** no allocation behind once the caller has freed what it got.
**
** Operations: a recipe parse (formats, roles, options, errors), a quantizer build from a recipe
** and from specs, a hybrid quantize on the host, and a CPU GEMM of two quantized operands.
** Built with AddressSanitizer the allocator cannot be replaced: the test skips (77) there.
*/
#include <dlfcn.h>
#include <errno.h>
#include <math.h>

#include "hq_test.h"

#if defined(__SANITIZE_ADDRESS__)
int main(void) { return HQ_TEST_SKIP; }
#else

#include "hq_alloc_fail.h"

static const char *k_recipe =
    "[recipe]\nname = oom\n"
    "[format mx]\nplugin = mxfp8\ndtype = e4m3\n"
    "[format nv]\nplugin = nvfp4\nrht = true\nstochastic_rounding = true\n"
    "[format f8]\nplugin = fp8_tensor\n"
    "[role linear:input:*]\nrowwise = mx\ncolumnwise = nv\n"
    "[role linear:weight:*]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:grad_output:*]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:*:lm_head]\n rowwise = identity\n";

/* One operation: returns its status; *done receives what the caller frees afterwards. */
typedef int (*op_fn)(void *ctx);

static hq_ctx *g_host;
static hq_recipe *g_recipe;
static hq_quantizer *g_q;
static hq_tensor g_src;
static hq_plugins *g_set;

static int op_recipe(void *unused) {
  (void)unused;
  hq_recipe *r = NULL;
  hq_recipe_opts o = {.struct_size = sizeof o, .plugin_flags = HQ_PLUGINS_NO_DEFAULT};
  int rc = hq_recipe_parse_string(k_recipe, "oom.ini", &o, &r);
  if (rc == HQ_OK) {
    /* a recipe that comes back is complete: no error, every role and format present */
    const hq_plugins *set = hq_recipe_plugins(r);
    for (size_t i = 0; hq_recipe_error_count(r) && set && i < hq_plugins_rejected_count(set); i++)
      print_message("rejected %s: %s\n", hq_plugins_rejected_file(set, i),
                    hq_plugins_rejected_reason(set, i));
    if (hq_recipe_error_count(r)) fail_msg("parse returned a recipe with errors: %s", hq_recipe_error(r, 0));
    assert_int_equal(hq_recipe_role_count(r), 4);
    assert_int_equal(hq_recipe_format_count(r), 4);
  }
  hq_recipe_free(r);
  return rc;
}

static int op_quantizer(void *unused) {
  (void)unused;
  hq_quantizer *q = NULL;
  hq_role role = hq_role_of("linear", "input", "fc1");
  int rc = hq_quantizer_create(g_recipe, &role, &q);
  if (!rc) assert_string_equal(hq_quantizer_plugin(q, HQ_COLWISE), "nvfp4");
  hq_quantizer_free(q);
  return rc;
}

static int op_direct(void *unused) {
  (void)unused;
  const char *opts[] = {"dtype=e5m2", "power_2_scales=true"};
  hq_format_spec row = {sizeof row, "fp8_tensor", opts, 2}, col = {sizeof col, "mxfp8", NULL, 0};
  hq_quantizer *q = NULL;
  int rc = hq_quantizer_create_direct(g_set, &row, &col, HQ_SOURCE_ORIGINAL, &q);
  hq_quantizer_free(q);
  return rc;
}

static hq_qtensor *g_ref; /* the same quantize without failures, at rng offset 0 */

static int op_quantize(void *unused) {
  (void)unused;
  hq_qtensor *t = NULL;
  hq_ctx_set_rng_offset(g_host, 0);
  int rc = hq_quantize(g_q, g_host, &g_src, &t);
  if (!rc) { /* complete and equal to the reference, byte for byte */
    assert_int_equal(hq_qtensor_dirs(t), HQ_BOTH);
    for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
      const hq_storage *a = hq_qtensor_storage(t, d), *b = hq_qtensor_storage(g_ref, d);
      assert_int_equal(a->nbuf, b->nbuf);
      for (uint32_t i = 0; i < a->nbuf; i++)
        assert_memory_equal(hq_storage_cbuf(a, i)->ptr, hq_storage_cbuf(b, i)->ptr,
                            hq_storage_cbuf(b, i)->bytes);
    }
  }
  hq_qtensor_free(t);
  return rc;
}

static hq_qtensor *g_w, *g_x;
static uint16_t g_yref[64 * 64];
static int op_gemm(void *unused) {
  (void)unused;
  static uint16_t ybuf[64 * 64];
  hq_tensor y = hq_tensor_2d(ybuf, HQ_BF16, HQ_DEVICE_HOST, 64, 64);
  int rc = hq_linear_fprop(g_host, hq_operand_q(g_x), hq_operand_q(g_w), NULL, HQ_F32, &y, NULL);
  if (!rc) assert_memory_equal(ybuf, g_yref, sizeof ybuf);
  return rc;
}

static void run_injected(op_fn op, const char *name) {
  long long n;
  for (n = 0;; n++) {
    hq_clear_error();
    long long live0 = g_live;
    g_count = 0;
    g_failed = 0;
    g_fail_at = n;
    g_armed = 1;
    int rc = op(NULL);
    g_armed = 0;
    if (!g_failed) {
      if (rc != HQ_OK) fail_msg("%s: no allocation failed, yet rc = %d: %s", name, rc, hq_last_error());
      if (g_live != live0) fail_msg("%s: %lld allocations left behind", name, g_live - live0);
      break;
    }
    if (rc == HQ_OK) continue; /* a fallback absorbed it; the op checked its result */
    if (rc != HQ_ENOMEM)
      fail_msg("%s: allocation %lld failed, status %d (%s) instead of HQ_ENOMEM", name, n + 1, rc,
               hq_last_error());
    if (!strstr(hq_last_error(), "memory") && !strstr(hq_last_error(), "allocat"))
      fail_msg("%s: allocation %lld failed with a message that does not say so: '%s'", name, n + 1,
               hq_last_error());
    if (g_live != live0)
      fail_msg("%s: allocation %lld failed and %lld allocations were left behind", name, n + 1,
               g_live - live0);
  }
  print_message("%s: %lld allocations, each failed in turn\n", name, n);
  assert_true(n > 0);
}

static void test_recipe_parse(void **s) {
  (void)s;
  run_injected(op_recipe, "recipe parse");
}
static void test_quantizer(void **s) {
  (void)s;
  run_injected(op_quantizer, "quantizer from a recipe");
}
static void test_direct(void **s) {
  (void)s;
  run_injected(op_direct, "quantizer from specs");
}
static void test_quantize(void **s) {
  (void)s;
  run_injected(op_quantize, "hybrid quantize");
}
static void test_gemm(void **s) {
  (void)s;
  hq_tensor w = hq_test_tensor(HQ_F32, 64, 64, 3, 0.1f);
  hq_quantizer *qw = hq_test_quantizer(g_recipe, "linear:weight:fc1");
  HQ_OK_OR_FAIL(hq_quantize(qw, g_host, &w, &g_w));
  HQ_OK_OR_FAIL(hq_quantize(g_q, g_host, &g_src, &g_x));
  hq_tensor yref = hq_tensor_2d(g_yref, HQ_BF16, HQ_DEVICE_HOST, 64, 64);
  /* the reference, which also warms up the BLAS outside the injection */
  HQ_OK_OR_FAIL(hq_linear_fprop(g_host, hq_operand_q(g_x), hq_operand_q(g_w), NULL, HQ_F32, &yref,
                                NULL));
  run_injected(op_gemm, "cpu gemm");
  hq_qtensor_free(g_w);
  hq_qtensor_free(g_x);
  hq_quantizer_free(qw);
  free(w.data);
}

static int setup(void **s) {
  (void)s;
  if (hq_ctx_create(NULL, &g_host)) return -1;
  if (hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &g_set)) return -1;
  hq_recipe_opts o = {.struct_size = sizeof o, .plugin_flags = HQ_PLUGINS_NO_DEFAULT};
  if (hq_recipe_load_string(k_recipe, "oom.ini", &o, &g_recipe)) return -1;
  hq_role role = hq_role_of("linear", "input", "fc1");
  if (hq_quantizer_create(g_recipe, &role, &g_q)) return -1;
  g_src = hq_test_tensor(HQ_BF16, 64, 64, 7, 1.0f);
  hq_ctx_set_rng_offset(g_host, 0);
  if (hq_quantize(g_q, g_host, &g_src, &g_ref)) return -1;
  return 0;
}
static int teardown(void **s) {
  (void)s;
  hq_qtensor_free(g_ref);
  hq_quantizer_free(g_q);
  hq_recipe_free(g_recipe);
  hq_plugins_close(g_set);
  hq_ctx_destroy(g_host);
  free(g_src.data);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recipe_parse), cmocka_unit_test(test_quantizer),
      cmocka_unit_test(test_direct),       cmocka_unit_test(test_quantize),
      cmocka_unit_test(test_gemm),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
#endif
