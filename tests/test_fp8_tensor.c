/*
** test_fp8_tensor.c -- the fp8_tensor plugin through the public API: hand-computed codes and
** scales, power-of-two scales, epsilon, E5M2, NaN/Inf inputs, the transposed columnwise layout,
** columnwise-only quantize, dequantize, input dtypes, option errors.
*/
#include <math.h>

#include "hq_test.h"

static hq_ctx *host_ctx(void) {
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  return ctx;
}

/* Quantize x [rows, cols] with a single fp8_tensor format given by its option lines. */
static hq_qtensor *quantize(hq_ctx *ctx, const char *options, float *x, int64_t rows,
                            int64_t cols, uint32_t usage, hq_recipe **rp) {
  char text[512];
  snprintf(text, sizeof text, "[format f]\nplugin = fp8_tensor\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_tensor t = {x, HQ_F32, HQ_DEVICE_HOST, rows, cols};
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &t, &qt));
  hq_quantizer_free(q);
  *rp = r;
  return qt;
}

static const uint8_t *bytes(const hq_qtensor *qt, uint32_t dir) {
  return hq_qtensor_storage(qt, dir)->buf[0].ptr;
}
static float scale_inv(const hq_qtensor *qt, uint32_t dir) {
  return *(const float *)hq_qtensor_storage(qt, dir)->buf[1].ptr;
}
static float amax(const hq_qtensor *qt, uint32_t dir) {
  return *(const float *)hq_qtensor_storage(qt, dir)->buf[2].ptr;
}

/* amax 448 -> scale 1: the codes are the plain E4M3 encodings, worked out by hand:
   1 = 1.0*2^0 -> e=7 m=0 -> 0x38; -2 -> 0xC0; 3 = 1.5*2^1 -> 0x44; 448 -> 0x7E;
   0.5 -> 0x30; -0.25 -> 0xA8. Columnwise [3,2] is the byte transpose. */
static void test_hand_computed(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  float x[6] = {1, -2, 3, 448, 0.5f, -0.25f};
  hq_qtensor *qt = quantize(ctx, "", x, 2, 3, HQ_BOTH, &r);
  const uint8_t want[6] = {0x38, 0xc0, 0x44, 0x7e, 0x30, 0xa8};
  const uint8_t want_t[6] = {0x38, 0x7e, 0xc0, 0x30, 0x44, 0xa8};
  assert_memory_equal(bytes(qt, HQ_ROWWISE), want, 6);
  assert_memory_equal(bytes(qt, HQ_COLWISE), want_t, 6);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  assert_true(amax(qt, HQ_ROWWISE) == 448.0f);
  const hq_storage *s = hq_qtensor_storage(qt, HQ_ROWWISE), *c = hq_qtensor_storage(qt, HQ_COLWISE);
  assert_string_equal(s->buf[0].name, "data");
  assert_int_equal(s->buf[0].dtype, HQ_E4M3);
  assert_int_equal(s->buf[0].shape[0], 2);
  assert_int_equal(s->buf[0].shape[1], 3);
  assert_string_equal(c->buf[0].name, "columnwise_data");
  assert_int_equal(c->buf[0].shape[0], 3);
  assert_int_equal(c->buf[0].shape[1], 2);
  /* made together, the two directions share one scale_inv and amax */
  assert_ptr_equal(c->buf[1].ptr, s->buf[1].ptr);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE), 6 + 4 + 4);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 6);
  hq_qtensor_free(qt);
  hq_recipe_free(r);

  /* amax 2 -> scale = 448/2 = 224; 1 * 224 = 224 = 1.75*2^7 -> e=14 m=6 -> 0x76;
     0.01 * 224 = 2.24 -> between 2.0 (0x40) and 2.25 (0x41), nearer 2.25 -> 0x41 */
  float y[3] = {2, 1, 0.01f};
  qt = quantize(ctx, "", y, 1, 3, HQ_ROWWISE, &r);
  const uint8_t want2[3] = {0x7e, 0x76, 0x41};
  assert_memory_equal(bytes(qt, HQ_ROWWISE), want2, 3);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 224.0f);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_scale_options(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  /* amax 3: plain scale 448/3 = 149.33 (3 -> 448 = 0x7E); pow2 scale 128 (3 -> 384 = 0x7C) */
  float x[2] = {3, -1.5f};
  hq_qtensor *qt = quantize(ctx, "power_2_scales = true", x, 1, 2, HQ_ROWWISE, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7c);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0xf4); /* -192 = -1.5*2^7 -> e=14 m=4 */
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 128.0f);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  qt = quantize(ctx, "", x, 1, 2, HQ_ROWWISE, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7e);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / (448.0f / 3.0f));
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* epsilon floor: amax 1e-3 < eps 0.5 -> scale 896 */
  float z[1] = {1e-3f};
  qt = quantize(ctx, "amax_epsilon = 0.5", z, 1, 1, HQ_ROWWISE, &r);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 896.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], hq_f32_to_e4m3(0.896f));
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* E5M2: amax 57344 -> scale 1; 57344 -> 0x7B, -1 -> 0xBC */
  float w[2] = {57344.0f, -1.0f};
  qt = quantize(ctx, "dtype = e5m2", w, 1, 2, HQ_BOTH, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7b);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0xbc);
  assert_int_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->buf[0].dtype, HQ_E5M2);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* all zeros -> scale 1, every code 0 */
  float zero[4] = {0, 0, 0, 0};
  qt = quantize(ctx, "", zero, 2, 2, HQ_BOTH, &r);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  for (int i = 0; i < 4; i++) assert_int_equal(bytes(qt, HQ_COLWISE)[i], 0);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_nan_inf(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  /* NaN does not enter amax (amax = 2 -> scale 224); the NaN element encodes as 0x7F */
  float x[3] = {NAN, 2.0f, -1.0f};
  hq_qtensor *qt = quantize(ctx, "", x, 1, 3, HQ_ROWWISE, &r);
  assert_true(amax(qt, HQ_ROWWISE) == 2.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0x7e);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[2], 0xf6);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* Inf enters amax -> scale 1; Inf saturates to 448, 3 stays 3 */
  float y[2] = {INFINITY, 3.0f};
  qt = quantize(ctx, "", y, 1, 2, HQ_ROWWISE, &r);
  assert_true(isinf(amax(qt, HQ_ROWWISE)));
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7e);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0x44);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* Random odd shapes: columnwise is the exact byte transpose; columnwise-only gives the same
   bytes; dequantize equals q * scale_inv and is close to the input; bf16 and f16 inputs holding
   the same values give the same bytes. */
static void test_layout_and_dtypes(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  const int64_t M = 37, K = 53;
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 7, 3.0f); /* bf16 values, exact in f16/f32 too */
  float *xf = malloc(sizeof(float) * M * K);
  for (int64_t i = 0; i < M * K; i++) xf[i] = hq_load_hp(x.data, i, HQ_BF16);
  hq_recipe *r;
  hq_qtensor *qt = quantize(ctx, "", xf, M, K, HQ_BOTH, &r);
  const uint8_t *row = bytes(qt, HQ_ROWWISE), *col = bytes(qt, HQ_COLWISE);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++) assert_int_equal(col[j * M + i], row[i * K + j]);
  /* independent check of every code: amax over the tensor, scale, encode */
  float am = 0;
  for (int64_t i = 0; i < M * K; i++) am = fabsf(xf[i]) > am ? fabsf(xf[i]) : am;
  float scale = 448.0f / am;
  for (int64_t i = 0; i < M * K; i++) assert_int_equal(row[i], hq_f32_to_e4m3(xf[i] * scale));
  /* dequantize both directions */
  hq_tensor d = hq_test_empty(HQ_F32, M, K);
  for (int dir = 1; dir <= 2; dir++) {
    HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)dir, &d));
    for (int64_t i = 0; i < M * K; i++) {
      float v = ((float *)d.data)[i];
      assert_true(v == hq_e4m3_to_f32(row[i]) * (1.0f / scale));
      assert_true(fabsf(v - xf[i]) <= fabsf(xf[i]) / 16 + 1e-3f * am); /* 3 mantissa bits */
    }
  }
  /* columnwise only */
  hq_recipe *r2;
  hq_qtensor *qc = quantize(ctx, "", xf, M, K, HQ_COLWISE, &r2);
  assert_int_equal(hq_qtensor_dirs(qc), HQ_COLWISE);
  assert_memory_equal(bytes(qc, HQ_COLWISE), col, (size_t)(M * K));
  assert_true(scale_inv(qc, HQ_COLWISE) == scale_inv(qt, HQ_ROWWISE));
  hq_qtensor_free(qc);
  hq_recipe_free(r2);
  /* the same values as bf16 and f16 input */
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor xh = hq_test_empty(HQ_F16, M, K);
  for (int64_t i = 0; i < M * K; i++) hq_store_hp(xh.data, i, HQ_F16, xf[i]);
  hq_tensor *inputs[2] = {&x, &xh};
  for (int k = 0; k < 2; k++) {
    hq_qtensor *q2 = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, inputs[k], &q2));
    assert_memory_equal(bytes(q2, HQ_ROWWISE), row, (size_t)(M * K));
    assert_memory_equal(bytes(q2, HQ_COLWISE), col, (size_t)(M * K));
    hq_qtensor_free(q2);
  }
  /* dequantize into bf16 and f16 rounds the f32 values */
  hq_tensor db = hq_test_empty(HQ_BF16, M, K);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &db));
  for (int64_t i = 0; i < M * K; i++)
    assert_int_equal(((uint16_t *)db.data)[i], hq_f32_to_bf16(hq_e4m3_to_f32(row[i]) / scale));
  hq_quantizer_free(q);
  free(db.data);
  free(xh.data);
  free(d.data);
  free(xf);
  free(x.data);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* A host-built module refuses a device it has no path for, and bad shapes/dtypes are errors. */
static void test_errors(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe("[role *:*:*]\nrowwise = fp8_tensor\ncolumnwise = fp8_tensor\n");
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  float x[4] = {1, 2, 3, 4};
  hq_qtensor *qt = NULL;
  hq_tensor t = {x, HQ_E4M3, HQ_DEVICE_HOST, 2, 2};
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("dtype e4m3 is not a high-precision type");
  t.dtype = HQ_F32;
  t.rows = 0;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_ESHAPE);
  t.rows = 2;
  t.device = 0;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("tensor is on device 0 but the context runs on -1");
  t.device = HQ_DEVICE_HOST;
  t.data = NULL;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  assert_null(qt);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, 0));
  t.data = x;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("has no usage");
  assert_int_equal(hq_quantizer_set_usage(q, 4), HQ_EINVAL);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),
      cmocka_unit_test(test_scale_options),
      cmocka_unit_test(test_nan_inf),
      cmocka_unit_test(test_layout_and_dtypes),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
