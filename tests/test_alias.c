/*
** test_alias.c -- HQ_QUANTIZE_ALIAS (hq.h) on the CPU:
**   - an identity direction of the source's dtype borrows the source: both directions' data
**     buffer is the source's memory (no copy), and a later write to the source shows through;
**   - without the flag hq copies: a later write to the source leaves the qtensor as it was;
**   - a storage dtype that differs (identity bf16 from f32), a format that is not identity
**     (fp8_tensor) and two directions in two formats copy as without the flag, byte for byte;
**   - an aliased qtensor refuses every call that would write, move or save its bytes
**     (HQ_ESTATE), and freeing it leaves the source alone (ASan sees any stray free);
**   - a GEMM of aliased operands gives the bit-identical result of the copied ones.
*/
#include "hq_test.h"

static hq_ctx *g_ctx;

static const char recipe_text[] =
    "[recipe]\nname = alias\n"
    "[format same]\nplugin = identity\n"
    "[format bf]\nplugin = identity\ndtype = bf16\n"
    "[format f8]\nplugin = fp8_tensor\ndtype = e4m3\n"
    "[role linear:input:same]\nrowwise = same\ncolumnwise = same\n"
    "[role linear:input:bf]\nrowwise = bf\ncolumnwise = bf\n"
    "[role linear:input:f8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:input:mixed]\nrowwise = f8\ncolumnwise = same\n";

static hq_qtensor *quantize(hq_quantizer *q, const hq_tensor *x, uint32_t flags) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.flags = flags;
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize_ex(q, g_ctx, x, &args, &qt));
  return qt;
}

static const void *data_of(const hq_qtensor *qt, uint32_t dir) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  assert_non_null(s);
  return hq_storage_cbuf(s, 0)->ptr;
}

static float first_value(const hq_qtensor *qt, uint32_t dir) {
  float out[6 * 8];
  hq_tensor d = hq_tensor_2d(out, HQ_F32, HQ_DEVICE_HOST, 6, 8);
  HQ_OK_OR_FAIL(hq_dequantize(qt, g_ctx, dir, &d));
  return out[0];
}

static void aliases_and_shows_writes(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(recipe_text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:same");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
  for (int t = 0; t < 3; t++) {
    const hq_dtype dt = t == 0 ? HQ_F32 : t == 1 ? HQ_BF16 : HQ_F16;
    hq_tensor x = hq_test_tensor(dt, 6, 8, 7 + (uint64_t)t, 1.0f);
    hq_store_hp(x.data, 0, dt, 1.5f);
    hq_qtensor *copy = quantize(q, &x, 0), *alias = quantize(q, &x, HQ_QUANTIZE_ALIAS);
    /* the alias is the source, both directions; the copy is not */
    assert_ptr_equal(data_of(alias, HQ_ROWWISE), x.data);
    assert_ptr_equal(data_of(alias, HQ_COLWISE), x.data);
    assert_ptr_not_equal(data_of(copy, HQ_ROWWISE), x.data);
    hq_test_same_qtensors(copy, alias, "the alias and the copy");
    /* a later write to the source: seen through the alias, not by the copy */
    hq_store_hp(x.data, 0, dt, -2.0f);
    assert_true(first_value(alias, HQ_ROWWISE) == -2.0f);
    assert_true(first_value(alias, HQ_COLWISE) == -2.0f);
    assert_true(first_value(copy, HQ_ROWWISE) == 1.5f);
    hq_qtensor_free(alias);
    hq_qtensor_free(copy);
    /* the free left the source alone */
    assert_true(hq_load_hp(x.data, 0, dt) == -2.0f);
    free(x.data);
  }
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* roles whose bytes are not the source's: the flag changes nothing */
static void copies_otherwise(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(recipe_text);
  const char *roles[] = {"linear:input:bf", "linear:input:f8", "linear:input:mixed"};
  hq_tensor x = hq_test_tensor(HQ_F32, 32, 32, 3, 1.0f);
  for (size_t i = 0; i < sizeof roles / sizeof *roles; i++) {
    hq_quantizer *q = hq_test_quantizer(r, roles[i]);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_qtensor *a = quantize(q, &x, 0), *b = quantize(q, &x, HQ_QUANTIZE_ALIAS);
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
      assert_ptr_not_equal(data_of(b, dir), x.data);
    hq_test_same_qtensors(a, b, roles[i]);
    /* not aliased: an update is allowed */
    HQ_OK_OR_FAIL(hq_qtensor_update(b, g_ctx, &x));
    hq_qtensor_free(a);
    hq_qtensor_free(b);
    hq_quantizer_free(q);
  }
  /* one direction of the source's own identity: borrowed too */
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:same");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_COLWISE));
  hq_qtensor *c = quantize(q, &x, HQ_QUANTIZE_ALIAS);
  assert_int_equal(hq_qtensor_dirs(c), HQ_COLWISE);
  assert_ptr_equal(data_of(c, HQ_COLWISE), x.data);
  hq_qtensor_free(c);
  hq_quantizer_free(q);
  free(x.data);
  hq_recipe_free(r);
}

static void read_only(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(recipe_text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:same");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 8, 5, 1.0f), y = hq_test_tensor(HQ_F32, 8, 8, 6, 1.0f);
  float keep[64];
  memcpy(keep, x.data, sizeof keep);
  hq_qtensor *qt = quantize(q, &x, HQ_QUANTIZE_ALIAS);
  assert_int_equal(hq_qtensor_update(qt, g_ctx, &y), HQ_ESTATE);
  HQ_ERROR_HAS("borrows its source's memory");
  hq_saved_buffer sb[4];
  size_t n = 0;
  assert_int_equal(hq_qtensor_save(qt, sb, 4, sizeof *sb, &n), HQ_ESTATE);
  HQ_ERROR_HAS("hq_qtensor_save: role linear:input:same borrows its source's memory");
  hq_fsdp_buffer fb[4];
  assert_int_equal(hq_fsdp_extract(qt, g_ctx, fb, 4, sizeof *fb, &n), HQ_ESTATE);
  HQ_ERROR_HAS("hq_fsdp_extract");
  /* nothing was written: the source holds its values */
  assert_memory_equal(x.data, keep, sizeof keep);
  hq_qtensor_free(qt);
  assert_memory_equal(x.data, keep, sizeof keep);
  free(x.data);
  free(y.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* fprop, dgrad, wgrad of aliased operands: the bytes of the copied ones */
static void gemm_identical(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(recipe_text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:same");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
  const int64_t M = 16, N = 24, K = 32;
  hq_tensor x = hq_test_tensor(HQ_F32, M, K, 11, 1.0f), w = hq_test_tensor(HQ_F32, N, K, 12, 0.1f),
            dy = hq_test_tensor(HQ_F32, M, N, 13, 1.0f);
  hq_qtensor *c[3], *a[3];
  const hq_tensor *src[3] = {&x, &w, &dy};
  for (int i = 0; i < 3; i++) {
    c[i] = quantize(q, src[i], 0);
    a[i] = quantize(q, src[i], HQ_QUANTIZE_ALIAS);
    assert_ptr_equal(data_of(a[i], HQ_ROWWISE), src[i]->data);
  }
  hq_qtensor **sets[2] = {c, a};
  float out[2][3][32 * 32];
  for (int s = 0; s < 2; s++) {
    hq_qtensor **t = sets[s];
    hq_tensor y = hq_tensor_2d(out[s][0], HQ_F32, HQ_DEVICE_HOST, M, N);
    hq_tensor dx = hq_tensor_2d(out[s][1], HQ_F32, HQ_DEVICE_HOST, M, K);
    hq_tensor dw = hq_tensor_2d(out[s][2], HQ_F32, HQ_DEVICE_HOST, N, K);
    HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_q(t[0]), hq_operand_q(t[1]), NULL, HQ_F32, &y,
                                  NULL));
    HQ_OK_OR_FAIL(hq_linear_dgrad(g_ctx, hq_operand_q(t[2]), hq_operand_q(t[1]), &dx, NULL));
    HQ_OK_OR_FAIL(hq_linear_wgrad(g_ctx, hq_operand_q(t[0]), hq_operand_q(t[2]), &dw, 0, NULL));
  }
  assert_memory_equal(out[0][0], out[1][0], (size_t)(M * N) * sizeof(float));
  assert_memory_equal(out[0][1], out[1][1], (size_t)(M * K) * sizeof(float));
  assert_memory_equal(out[0][2], out[1][2], (size_t)(N * K) * sizeof(float));
  for (int i = 0; i < 3; i++) {
    hq_qtensor_free(c[i]);
    hq_qtensor_free(a[i]);
  }
  free(x.data);
  free(w.data);
  free(dy.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static int setup(void **state) {
  (void)state;
  return hq_ctx_create(NULL, &g_ctx) == HQ_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(g_ctx);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(aliases_and_shows_writes),
      cmocka_unit_test(copies_otherwise),
      cmocka_unit_test(read_only),
      cmocka_unit_test(gemm_identical),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
