/*
** test_gpu_fp8_block.c -- fp8_block on a CUDA device is bit-identical to the CPU reference:
** every buffer of every present direction (data, scale_inv with its zero padding) of quantize
** (usage both, rowwise only, columnwise only), update with new data (in place, no allocation),
** and dequantize of each direction into f32, bf16 and f16, compared byte for byte with what the
** CPU reference makes from the same input. Covered: block 1d and 2d, e4m3 and e5m2, power-of-two
** scales on and off, amax_epsilon; f32/bf16/f16 inputs; shapes with partial edge blocks on either
** side (1x1, 129x1, 1x129, 37x53, 257x131, 3x517, ...), shapes that take the vectorized paths
** (K % 8 == 0, M % 16 == 0) and shapes that take only some of them, a misaligned input pointer;
** special values: all-zero blocks, NaN and +-Inf, subnormals, values at and beyond the FP8
** overflow boundary and the input dtype's max, a wide dynamic range inside one block. Also: the
** module's caps (HQ_CAP_CUDA) and its device scratch (0).
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

static void compare_usage(const hq_qtensor *h, const hq_qtensor *g, uint32_t usage,
                          const char *what) {
  hq_gpu_compare_usage(gpu, h, g, usage, what);
}

/* A device copy of a host tensor; `shift` elements into its allocation (a misaligned pointer
   when shift is odd). *base is what to free. */
static hq_tensor to_gpu(const hq_tensor *h, int shift, void **base) {
  hq_tensor g = *h;
  const size_t es = hq_dtype_size(h->dtype);
  const size_t bytes = (size_t)(h->rows * h->cols) * es;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes + 16, base));
  g.data = (uint8_t *)*base + (size_t)shift * es;
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, g.data, 0, h->data, HQ_DEVICE_HOST, bytes));
  g.device = 0;
  return g;
}



/* Special values written over a random tensor: the first 128x128 tile (or what exists of it)
   all zero; NaN, +-Inf, subnormals of the input dtype, values at the FP8 and the input dtype's
   overflow boundary scattered elsewhere; a wide dynamic range in four rows of the second row
   block (the first when there is one); an all-NaN row but one value; a row of subnormals. */
static void add_specials(hq_tensor *x) {
  const int64_t M = x->rows, K = x->cols;
  const hq_dtype dt = x->dtype;
  /* an all-zero first tile */
  for (int64_t i = 0; i < M && i < 128; i++)
    for (int64_t k = 0; k < K && k < 128; k++) hq_store_hp(x->data, i * K + k, dt, 0.0f);
  const float sub = dt == HQ_F32 ? 1e-40f : dt == HQ_BF16 ? 9.2e-41f : 6.0e-8f;
  const float big = hq_hp_max(dt);
  const float vals[] = {NAN, INFINITY, -INFINITY, sub, -sub, 3.0f * sub, 448.0f, -448.0f,
                        449.0f, 464.0f, 57344.0f, 61440.0f, big, -big, 1e-30f, 1e30f,
                        0.5f, -1e-3f, 1e-6f, 2.0f};
  const int nv = (int)(sizeof vals / sizeof vals[0]);
  uint64_t s = (uint64_t)(M * 31 + K);
  /* scattered over the tensor, outside the zero tile when there is room */
  for (int v = 0; v < 3 * nv; v++) {
    int64_t i = (int64_t)(hq_test_rand(&s) % (uint64_t)M), k = (int64_t)(hq_test_rand(&s) % (uint64_t)K);
    if (i < 128 && k < 128 && (M > 128 || K > 128)) {
      if (M > 128) i = 128 + i % (M - 128);
      else k = 128 + k % (K - 128);
    }
    hq_store_hp(x->data, i * K + k, dt, vals[v % nv]);
  }
  /* one row block (rows 128.. or 0..) with a wide dynamic range in every row */
  const int64_t r0 = M > 128 ? 128 : 0;
  for (int64_t i = r0; i < M && i < r0 + 4; i++)
    for (int64_t k = 0; k < K; k++) {
      float mag = ldexpf(1.0f, (int)((i * 7 + k * 13) % 60) - 40);
      if (dt == HQ_F16) mag = ldexpf(1.0f, (int)((i * 7 + k * 13) % 30) - 20);
      hq_store_hp(x->data, i * K + k, dt, (k & 1) ? -mag : mag);
    }
  /* a whole row that is NaN except one value, a whole row of subnormals */
  if (M > 2) {
    for (int64_t k = 0; k < K; k++) hq_store_hp(x->data, (M - 1) * K + k, dt, NAN);
    hq_store_hp(x->data, (M - 1) * K + K / 2, dt, 3.0f);
    for (int64_t k = 0; k < K; k++)
      hq_store_hp(x->data, (M - 2) * K + k, dt, (float)(k % 5) * sub);
  }
}

/* Dequantize direction d of h (CPU) and g (GPU) into every dtype; equal bytes. */
static void check_dequantize(const hq_qtensor *h, const hq_qtensor *g, uint32_t d, int64_t M,
                             int64_t K, const char *what) {
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int o = 0; o < 3; o++) {
    hq_tensor dh = hq_test_empty(outs[o], M, K);
    hq_tensor dg = dh;
    size_t bytes = (size_t)(M * K) * hq_dtype_size(outs[o]);
    HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &dg.data));
    dg.device = 0;
    HQ_OK_OR_FAIL(hq_dequantize(h, cpu, d, &dh));
    HQ_OK_OR_FAIL(hq_dequantize(g, gpu, d, &dg));
    void *back = malloc(bytes);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg.data, 0, bytes));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    if (memcmp(back, dh.data, bytes) != 0) {
      size_t k = 0;
      while (((uint8_t *)back)[k] == ((uint8_t *)dh.data)[k]) k++;
      fail_msg("%s: dequantize dir %u into %s differs at byte %zu", what, d,
               hq_dtype_name(outs[o]), k);
    }
    free(back);
    free(dh.data);
    hq_ctx_free(gpu, dg.data);
  }
}

static int g_cases;

/* One configuration and input: quantize on both contexts for every usage, compare; dequantize;
   update the device tensor with other data and compare with the CPU's quantize of that. */
static void check_case(const char *options, hq_dtype dt, int64_t M, int64_t K, uint64_t seed,
                       int special, int shift) {
  char text[512], what[256];
  snprintf(text, sizeof text, "[format f]\nplugin = fp8_block\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  snprintf(what, sizeof what, "[%s] %s %lldx%lld%s%s", options, hq_dtype_name(dt), (long long)M,
           (long long)K, special ? " specials" : "", shift ? " misaligned" : "");
  for (char *c = what; *c; c++)
    if (*c == '\n') *c = ' ';
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor x = hq_test_tensor(dt, M, K, seed, 4.0f);
  if (special) add_specials(&x);
  void *xb = NULL, *yb = NULL;
  hq_tensor xg = to_gpu(&x, shift, &xb);
  hq_tensor y = hq_test_tensor(dt, M, K, seed + 1000, 40.0f);
  hq_tensor yg = to_gpu(&y, shift, &yb);
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (int u = 0; u < 3; u++) {
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usages[u]));
    hq_qtensor *h = NULL, *g = NULL, *hy = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    compare_usage(h, g, usages[u], what);
    for (uint32_t d = 1; d <= 2; d++)
      if (usages[u] & d) check_dequantize(h, g, d, M, K, what);
    /* update in place with y == the CPU's quantize of y; then back to x */
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &y, &hy));
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &yg));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    char w2[300];
    snprintf(w2, sizeof w2, "%s, update(y)", what);
    compare_usage(hy, g, usages[u], w2);
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &xg));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    snprintf(w2, sizeof w2, "%s, update(x)", what);
    compare_usage(h, g, usages[u], w2);
    hq_qtensor_free(hy);
    hq_qtensor_free(h);
    hq_qtensor_free(g);
  }
  hq_ctx_free(gpu, yb);
  free(y.data);
  hq_ctx_free(gpu, xb);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  g_cases++;
}

static const char *const configs[] = {
    "block = 1d",
    "block = 2d",
    "block = 1d\ndtype = e5m2",
    "block = 2d\ndtype = e5m2",
    "block = 1d\npower_2_scales = false",
    "block = 2d\npower_2_scales = false",
    "block = 1d\ndtype = e5m2\npower_2_scales = false\namax_epsilon = 0.5",
    "block = 2d\npower_2_scales = false\namax_epsilon = 100",
};
#define NCONFIGS (int)(sizeof configs / sizeof configs[0])

/* Every configuration x every input dtype over edge shapes, with and without special values. */
static void test_shapes_and_options(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{1, 1},     {129, 1},  {1, 129},  {37, 53},  {128, 128},
                               {257, 131}, {3, 517},  {136, 256}, {72, 200}, {256, 384},
                               {130, 200}, {31, 264}, {16, 8}};
  const int ns = (int)(sizeof shapes / sizeof shapes[0]);
  for (int c = 0; c < NCONFIGS; c++)
    for (int t = 0; t < 3; t++)
      for (int s = 0; s < ns; s++) {
        /* the full product for the default configurations, a rotating subset otherwise */
        if (c >= 2 && (s + t + c) % 4 != 0) continue;
        check_case(configs[c], dts[t], shapes[s][0], shapes[s][1],
                   (uint64_t)(c * 100 + t * 10 + s), (s + c) % 2, 0);
      }
}

/* Special values everywhere that matters: each configuration, each dtype, shapes with full and
   partial tiles. */
static void test_special_values(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{256, 256}, {300, 260}, {129, 384}, {5, 200}};
  for (int c = 0; c < NCONFIGS; c++)
    for (int t = 0; t < 3; t++)
      for (int s = 0; s < 4; s++) {
        if (c >= 4 && s >= 1) continue;
        check_case(configs[c], dts[t], shapes[s][0], shapes[s][1], (uint64_t)(7 + c + s), 1, 0);
      }
}

/* A misaligned input pointer (element loads instead of 16-byte ones) gives the same bytes; and
   one larger tensor per block shape. */
static void test_misaligned_and_large(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int c = 0; c < 4; c++)
    for (int t = 0; t < 3; t++) {
      check_case(configs[c], dts[t], 256, 256, 40 + (uint64_t)t, 1, 1);
      check_case(configs[c], dts[t], 144, 136, 50 + (uint64_t)t, 0, 3);
    }
  check_case("block = 1d", HQ_BF16, 1024, 2048, 61, 0, 0);
  check_case("block = 2d", HQ_BF16, 1024, 2048, 62, 0, 0);
  check_case("block = 1d", HQ_F32, 640, 1000, 63, 1, 0);
  printf("%d quantize cases compared\n", g_cases);
}

/* The module: HQ_CAP_CUDA and HQ_CAP_CPU, no scratch on a device, some on the host. */
static void test_module_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_block")(&host);
  assert_non_null(ops);
  assert_true(ops->caps & HQ_CAP_CUDA);
  assert_true(ops->caps & HQ_CAP_CPU);
  void *cfg = calloc(1, ops->config_size);
  hq_optval v[4];
  memset(v, 0, sizeof v);
  v[2].i = 1; /* power_2_scales */
  HQ_OK_OR_FAIL(ops->configure(cfg, v, &host));
  assert_int_equal(ops->scratch_size(cfg, 8192, 8192, HQ_BOTH, 0), 0);
  assert_true(ops->scratch_size(cfg, 300, 300, HQ_BOTH, HQ_DEVICE_HOST) > 0);
  free(cfg);
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
      cmocka_unit_test(test_module_direct),
      cmocka_unit_test(test_shapes_and_options),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_misaligned_and_large),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
