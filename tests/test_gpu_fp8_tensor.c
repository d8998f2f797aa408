/*
** test_gpu_fp8_tensor.c -- fp8_tensor on a CUDA device is bit-identical to the CPU reference:
** quantize (both directions, each alone), scale_inv and amax, dequantize into every dtype, for
** f32 / bf16 / f16 inputs, odd and large shapes, NaN/Inf inputs, power-of-two scales, E5M2.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "hq_test.h"

static hq_ctx *cpu, *gpu;

static int setup(void **state) {
  (void)state;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  if (hq_ctx_create(NULL, &cpu) || hq_ctx_create(&d, &gpu)) {
    fprintf(stderr, "context: %s\n", hq_last_error());
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(cpu);
  hq_ctx_destroy(gpu);
  return 0;
}

/* Copy a host tensor to the device. */
static hq_tensor to_gpu(const hq_tensor *h) {
  hq_tensor g = *h;
  size_t bytes = (size_t)(h->rows * h->cols) * hq_dtype_size(h->dtype);
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &g.data));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, g.data, 0, h->data, HQ_DEVICE_HOST, bytes));
  g.device = 0;
  return g;
}

/* Every buffer of `dir` on the device equals the host reference's, byte for byte. */
static void compare(const hq_qtensor *h, const hq_qtensor *g, uint32_t dir, const char *what) {
  const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
  assert_non_null(sh);
  assert_non_null(sg);
  for (uint32_t i = 0; i < sh->nbuf; i++) {
    size_t n = sh->buf[i].bytes;
    uint8_t *tmp = malloc(n);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, tmp, HQ_DEVICE_HOST, sg->buf[i].ptr, 0, n));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    if (memcmp(tmp, sh->buf[i].ptr, n) != 0) {
      size_t k = 0;
      while (((uint8_t *)sh->buf[i].ptr)[k] == tmp[k]) k++;
      fail_msg("%s: dir %u buffer '%s' differs at byte %zu: cpu %02x gpu %02x", what, dir,
               sh->buf[i].name, k, ((uint8_t *)sh->buf[i].ptr)[k], tmp[k]);
    }
    free(tmp);
  }
}

static void check_case(const char *options, hq_dtype dt, int64_t M, int64_t K, uint64_t seed,
                       int special) {
  char text[256], what[160];
  snprintf(text, sizeof text, "[format f]\nplugin = fp8_tensor\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  snprintf(what, sizeof what, "[%s] %s %lldx%lld", options, hq_dtype_name(dt), (long long)M,
           (long long)K);
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor x = hq_test_tensor(dt, M, K, seed, 4.0f);
  if (special) {
    hq_store_hp(x.data, 0, dt, NAN);
    hq_store_hp(x.data, (M * K) / 2, dt, special > 1 ? INFINITY : 1e-6f);
  }
  hq_tensor xg = to_gpu(&x);
  uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (int u = 0; u < 3; u++) {
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usages[u]));
    hq_qtensor *h = NULL, *g = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    if (usages[u] & HQ_ROWWISE) compare(h, g, HQ_ROWWISE, what);
    if (usages[u] & HQ_COLWISE) compare(h, g, HQ_COLWISE, what);
    /* dequantize each present direction into each dtype */
    hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
    for (int d = 1; d <= 2; d++) {
      if (!(usages[u] & (uint32_t)d)) continue;
      for (int o = 0; o < 3; o++) {
        hq_tensor dh = hq_test_empty(outs[o], M, K);
        hq_tensor dg = dh;
        size_t bytes = (size_t)(M * K) * hq_dtype_size(outs[o]);
        HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &dg.data));
        dg.device = 0;
        HQ_OK_OR_FAIL(hq_dequantize(h, cpu, (uint32_t)d, &dh));
        HQ_OK_OR_FAIL(hq_dequantize(g, gpu, (uint32_t)d, &dg));
        void *back = malloc(bytes);
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg.data, 0, bytes));
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        if (memcmp(back, dh.data, bytes) != 0)
          fail_msg("%s: dequantize dir %d into %s differs", what, d, hq_dtype_name(outs[o]));
        free(back);
        free(dh.data);
        hq_ctx_free(gpu, dg.data);
      }
    }
    /* the device update path refreshes in place identically */
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &xg));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    if (usages[u] & HQ_ROWWISE) compare(h, g, HQ_ROWWISE, what);
    hq_qtensor_free(h);
    hq_qtensor_free(g);
  }
  hq_ctx_free(gpu, xg.data);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static void test_bitwise_equal(void **state) {
  (void)state;
  hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  int64_t shapes[][2] = {{1, 1}, {37, 53}, {256, 512}, {1000, 333}, {31, 2049}, {72, 200}, {8, 8}};
  for (int t = 0; t < 3; t++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check_case("", dts[t], shapes[s][0], shapes[s][1], (uint64_t)(t * 10 + s), 0);
  check_case("dtype = e5m2", HQ_BF16, 128, 96, 1, 0);
  check_case("power_2_scales = true", HQ_F32, 64, 64, 2, 0);
  check_case("amax_epsilon = 100", HQ_F32, 64, 64, 3, 0);
  check_case("", HQ_F32, 64, 80, 4, 1);   /* NaN and a tiny value */
  check_case("", HQ_BF16, 64, 80, 5, 2);  /* NaN and Inf */
  check_case("", HQ_BF16, 2048, 4096, 6, 0);
}

/* Hybrids on the device: FP8 rowwise + identity columnwise (bf16), with the original and the
   rowwise_dequantized source, equal the CPU bytes; so does an all-identity dtype conversion. */
static void test_hybrid_on_device(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format f8]\nplugin = fp8_tensor\n[format hp]\nplugin = identity\ndtype = bf16\n"
      "[role *:*:orig]\nrowwise = f8\ncolumnwise = hp\n"
      "[role *:*:deq]\nrowwise = f8\ncolumnwise = hp\ncolumnwise_source = rowwise_dequantized\n"
      "[role *:*:hp]\nrowwise = hp\ncolumnwise = hp\n");
  const char *roles[3] = {"a:b:orig", "a:b:deq", "a:b:hp"};
  hq_tensor x = hq_test_tensor(HQ_F32, 96, 160, 42, 3.0f);
  hq_tensor xg = to_gpu(&x);
  for (int k = 0; k < 3; k++) {
    hq_quantizer *q = hq_test_quantizer(r, roles[k]);
    uint32_t usages[2] = {HQ_BOTH, HQ_COLWISE};
    for (int u = 0; u < 2; u++) {
      HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usages[u]));
      hq_qtensor *h = NULL, *g = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
      if (usages[u] & HQ_ROWWISE) compare(h, g, HQ_ROWWISE, roles[k]);
      compare(h, g, HQ_COLWISE, roles[k]);
      hq_qtensor_free(h);
      hq_qtensor_free(g);
    }
    hq_quantizer_free(q);
  }
  hq_ctx_free(gpu, xg.data);
  free(x.data);
  hq_recipe_free(r);
}

/* The host module refuses the wrong device for a tensor; errors name the device. */
static void test_device_mismatch(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[role *:*:*]\nrowwise = fp8_tensor\n");
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  hq_tensor x = hq_test_tensor(HQ_F32, 4, 4, 1, 1.0f);
  hq_qtensor *qt = NULL;
  assert_int_equal(hq_quantize(q, gpu, &x, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("tensor is on device -1 but the context runs on 0");
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

int main(void) {
  if (!hq_built_with_cuda() || hq_device_count() == 0) {
    printf("no CUDA device (built with CUDA: %s): skipped\n", hq_built_with_cuda() ? "yes" : "no");
    return HQ_TEST_SKIP;
  }
  char name[128];
  int arch = 0;
  if (hq_device_info(0, name, sizeof name, &arch) == HQ_OK)
    printf("device 0: %s (sm_%d)\n", name, arch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bitwise_equal),
      cmocka_unit_test(test_hybrid_on_device),
      cmocka_unit_test(test_device_mismatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
