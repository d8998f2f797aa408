/*
** test_gpu_fp8_tensor.c -- fp8_tensor on a CUDA device is bit-identical to the CPU reference:
** quantize (both directions, each alone), scale_inv and amax, dequantize into every dtype, for
** f32 / bf16 / f16 inputs, odd and large shapes, NaN/Inf inputs, power-of-two scales, E5M2;
** the per-tensor amax on the device (hq_quantizer_amax, and the module's amax op for every set
** of directions), quantize with a caller-supplied device amax (the same amax, a larger one,
** different rowwise/columnwise ones), and update with and without a supplied amax.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "hq_gpu_test.h"

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

static void compare(const hq_qtensor *h, const hq_qtensor *g, uint32_t dir, const char *what) {
  hq_gpu_compare_dir(gpu, h, g, dir, what);
}
static void compare_usage(const hq_qtensor *h, const hq_qtensor *g, uint32_t usage,
                          const char *what) {
  hq_gpu_compare_usage(gpu, h, g, usage, what);
}
static float *amax_to_gpu(const float a[2]) { return hq_gpu_amax_to_dev(gpu, a); }
static void amax_to_host(const float *dev, float out[2]) { hq_gpu_amax_to_host(gpu, dev, out); }

/* Copy a host tensor to the device. */
static hq_tensor to_gpu(const hq_tensor *h) {
  hq_tensor g = *h;
  size_t bytes = (size_t)(h->rows * h->cols) * hq_dtype_size(h->dtype);
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &g.data));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, g.data, 0, h->data, HQ_DEVICE_HOST, bytes));
  g.device = 0;
  return g;
}




static hq_qtensor *quantize_ex(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *x,
                               const float *amax) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.amax = amax;
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, x, &args, &qt));
  return qt;
}

static void update_ex(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *x, const float *amax) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.amax = amax;
  HQ_OK_OR_FAIL(hq_qtensor_update_ex(qt, ctx, x, &args));
}

/* Caller-supplied amax and update on the device, against the CPU: hq_quantizer_amax agrees bit
   for bit; hq_quantize_ex with it equals hq_quantize; a larger supplied amax and different
   rowwise/columnwise amaxes give the CPU's bytes; update (plain and with an amax) with new data
   equals the CPU's fresh quantize of that data. */
static void check_amax_and_update(hq_quantizer *q, uint32_t usage, const hq_tensor *x,
                                  const hq_tensor *xg, const hq_qtensor *h, const hq_tensor *y,
                                  const hq_tensor *yg, const char *what) {
  char w[256];
  float ah[2] = {-1, -1}, back[2];
  float *ag = amax_to_gpu(ah);
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, cpu, x, ah));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, xg, ag));
  amax_to_host(ag, back);
  if (memcmp(ah, back, sizeof ah) != 0)
    fail_msg("%s: amax cpu {%a, %a} gpu {%a, %a}", what, ah[0], ah[1], back[0], back[1]);
  /* the same amax, passed in device memory: the bytes of hq_quantize */
  hq_qtensor *g = quantize_ex(q, gpu, xg, ag);
  snprintf(w, sizeof w, "%s, quantize_ex(own amax)", what);
  compare_usage(h, g, usage, w);
  hq_qtensor_free(g);
  /* other amaxes: larger (x4) rowwise and smaller (/2) columnwise, and both larger (x3) */
  const float others[2][2] = {{ah[0] * 4.0f, ah[1] * 0.5f}, {ah[0] * 3.0f, ah[1] * 3.0f}};
  for (int k = 0; k < 2; k++) {
    float *og = amax_to_gpu(others[k]);
    hq_qtensor *hc = quantize_ex(q, cpu, x, others[k]);
    hq_qtensor *gc = quantize_ex(q, gpu, xg, og);
    snprintf(w, sizeof w, "%s, quantize_ex(amax {%g, %g})", what, others[k][0], others[k][1]);
    compare_usage(hc, gc, usage, w);
    /* update on the device with that amax: the same bytes again */
    hq_qtensor *gu = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, yg, &gu));
    update_ex(gu, gpu, xg, og);
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    snprintf(w, sizeof w, "%s, update_ex(amax {%g, %g})", what, others[k][0], others[k][1]);
    compare_usage(hc, gu, usage, w);
    hq_qtensor_free(gu);
    hq_qtensor_free(hc);
    hq_qtensor_free(gc);
    hq_ctx_free(gpu, og);
  }
  /* update with new data y, plain and with y's device amax == the CPU's fresh quantize of y */
  hq_qtensor *hy = NULL, *g1 = NULL, *g2 = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, y, &hy));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, xg, &g1));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, xg, &g2));
  HQ_OK_OR_FAIL(hq_qtensor_update(g1, gpu, yg));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, yg, ag));
  update_ex(g2, gpu, yg, ag);
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  snprintf(w, sizeof w, "%s, update(y)", what);
  compare_usage(hy, g1, usage, w);
  snprintf(w, sizeof w, "%s, update_ex(y, amax(y))", what);
  compare_usage(hy, g2, usage, w);
  hq_qtensor_free(hy);
  hq_qtensor_free(g1);
  hq_qtensor_free(g2);
  hq_ctx_free(gpu, ag);
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
  hq_tensor y = hq_test_tensor(dt, M, K, seed + 1000, 40.0f);
  hq_tensor yg = to_gpu(&y);
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
    if (usages[u] & HQ_COLWISE) compare(h, g, HQ_COLWISE, what);
    check_amax_and_update(q, usages[u], &x, &xg, h, &y, &yg, what);
    hq_qtensor_free(h);
    hq_qtensor_free(g);
  }
  hq_ctx_free(gpu, yg.data);
  free(y.data);
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

/* The module's amax op on the device, called directly: out[0] / out[1] get max |x| (NaN ignored,
   Inf counted) for the requested directions and 0 for the others (written over whatever was
   there), for aligned (vectorized) and odd shapes, every input dtype; its scratch is 0. */
static void test_amax_op_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_tensor")(&host);
  assert_non_null(ops);
  assert_non_null(ops->amax);
  hq_optval v[3];
  memset(v, 0, sizeof v);
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  HQ_OK_OR_FAIL(ops->configure(cfg, v, &host));
  assert_int_equal(ops->scratch_size ? ops->scratch_size(cfg, 4096, 4096, HQ_BOTH, 0) : 0, 0);
  hq_call call = hq_test_call(&host, 0, 0);
  call.device = 0;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{1, 1}, {37, 53}, {64, 64}, {1000, 333}};
  for (int t = 0; t < 3; t++)
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
      const int64_t M = shapes[sh][0], K = shapes[sh][1];
      hq_tensor x = hq_test_tensor(dts[t], M, K, 500 + sh, 2.0f);
      if (M * K > 8) {
        hq_store_hp(x.data, 5, dts[t], NAN);
        hq_store_hp(x.data, M * K - 2, dts[t], -300.0f);
      }
      float want = 0;
      for (int64_t i = 0; i < M * K; i++) {
        float a = fabsf(hq_load_hp(x.data, i, dts[t]));
        if (!isnan(a) && a > want) want = a;
      }
      hq_tensor xg = to_gpu(&x);
      for (uint32_t dirs = 0; dirs <= 3; dirs++) {
        const float junk[2] = {-7.0f, NAN};
        float *og = amax_to_gpu(junk), out[2];
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        assert_int_equal(ops->amax(cfg, &call, &xg, dirs, og), HQ_OK);
        amax_to_host(og, out);
        if (out[0] != ((dirs & HQ_ROWWISE) ? want : 0.0f) ||
            out[1] != ((dirs & HQ_COLWISE) ? want : 0.0f))
          fail_msg("%s %lldx%lld dirs %u: amax {%a, %a}, want %a", hq_dtype_name(dts[t]),
                   (long long)M, (long long)K, dirs, out[0], out[1], want);
        hq_ctx_free(gpu, og);
      }
      hq_ctx_free(gpu, xg.data);
      free(x.data);
    }
  free(cfg);
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
      cmocka_unit_test(test_amax_op_direct),
      cmocka_unit_test(test_device_mismatch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
