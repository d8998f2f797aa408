/*
** test_gpu_fp8_tensor.c -- fp8_tensor on a CUDA device is bit-identical to the CPU reference:
** quantize (both directions, each alone), scale_inv and amax, dequantize into every dtype, for
** f32 / bf16 / f16 inputs, odd and large shapes, NaN/Inf inputs, power-of-two scales, E5M2;
** the per-tensor amax on the device (hq_quantizer_amax, and the module's amax op for every set
** of directions), quantize with a caller-supplied device amax (the same amax, a larger one,
** different rowwise/columnwise ones), and update with and without a supplied amax.
** ABI 2.1: the raw dequantize (HQ_CALL_DEQ_RAW) and tensor_factor on the device, called directly,
** equal the CPU's byte for byte, and RN_f32(raw * factor) equals the device dequantize; ABI
** 2.3: a raw dequantize with call->factor_out writes the folded factor from its kernel (also for
** an empty storage, where no dequantize kernel runs); hq_gemm
** of two fp8_tensor operands: on sm_89+ the native path (this module's gemm op) for e4m3 x e4m3,
** e4m3 x e5m2 and e5m2 x e4m3, every flag pair, F32 / BF16 D, against the emulated path
** (HQ_GEMM_FORCE_EMULATED) and an F64 product of the dequantized operands; e5m2 x e5m2 and k not
** a multiple of 16 take the emulated path with this module's reason.
** Delayed scaling (scaling = delayed): one hq_state on the host, one on the device, the same
** quantizers bound to each; over several steps every buffer of every quantize and update, and the
** whole state before and after each hq_state_update, equal the CPU's byte for byte.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "copy_out.h"
#include "hq_gpu_test.h"

static hq_ctx *cpu, *gpu;

static int setup(void **state) {
  (void)state;
  return hq_gpu_contexts(&cpu, &gpu, 0);
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

static hq_tensor to_gpu(const hq_tensor *h) { return hq_gpu_tensor_at(gpu, h, 0); }

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
    hq_gpu_check_amax_and_update(cpu, gpu, q, usages[u], &x, &xg, h, &y, &yg, NULL, what);
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

/* ABI 2.6 copy_out on the device: the hybrid of fp8_tensor rowwise and identity BF16 / F16
   columnwise from an F32 source is one call (the core's debug line once per quantize and
   update), whose columnwise copy equals identity's own on the CPU byte for byte (copy_bits'
   ties, overflows, subnormals, Inf and NaN among the elements) and whose codes equal fp8_tensor's
   alone, through the vector kernel at both tile sizes (96 x 160: 64 x 64 tiles; 1024 x 2048:
   128 x 128), the scalar one (33 x 65, and a source one element off 16-byte alignment), a fresh
   quantize and an update with a caller's amax. */
static void test_copy_beside_on_device(void **state) {
  (void)state;
  int logged = 0;
  hq_ctx *dev = copy_log_ctx(0, &logged);
  const int64_t shapes[4][2] = {{96, 160}, {1024, 2048}, {33, 65}, {64, 64}};
  const size_t shifts[4] = {0, 0, 0, 4};
  const char *dts[2] = {"bf16", "f16"};
  const float amax_host[2] = {100.0f, 100.0f};
  float *amax_dev = hq_gpu_amax_to_dev(dev, amax_host);
  int calls = 0;
  for (int t = 0; t < 2; t++) {
    hq_recipe *rs[3];
    copy_recipes(dts[t], rs);
    hq_recipe *r = rs[0], *rh = rs[1], *r8 = rs[2];
    hq_quantizer *qh = hq_test_quantizer(r, "a:b:c"), *qi = hq_test_quantizer(rh, "a:b:c");
    hq_quantizer *q8 = hq_test_quantizer(r8, "a:b:c");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(qi, HQ_COLWISE));
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q8, HQ_ROWWISE));
    for (int s = 0; s < 4; s++) {
      const int64_t M = shapes[s][0], K = shapes[s][1];
      char what[96];
      snprintf(what, sizeof what, "copy beside, %s, %lldx%lld, shift %zu", dts[t], (long long)M,
               (long long)K, shifts[s]);
      hq_qtensor *g = NULL;
      for (int pass = 0; pass < 2; pass++) {
        hq_tensor x = hq_test_tensor(HQ_F32, M, K, 7 + pass, pass ? 30.0f : 2.0f);
        for (size_t k = 0; k < N_COPY_BITS; k++)
          memcpy((float *)x.data + k * 41 + pass, &copy_bits[k].f32, 4);
        hq_tensor xg = hq_gpu_tensor_at(dev, &x, shifts[s]);
        if (!pass) g = hq_test_quantize_ex(qh, dev, &xg, NULL);
        else hq_test_update_ex(g, dev, &xg, amax_dev);
        assert_int_equal(logged, ++calls);
        hq_qtensor *hi = hq_test_quantize_ex(qi, cpu, &x, NULL);
        hq_qtensor *h8 = hq_test_quantize_ex(q8, cpu, &x, pass ? amax_host : NULL);
        hq_gpu_compare_dir(dev, hi, g, HQ_COLWISE, what);
        hq_gpu_compare_dir(dev, h8, g, HQ_ROWWISE, what);
        hq_qtensor_free(hi);
        hq_qtensor_free(h8);
        HQ_OK_OR_FAIL(hq_ctx_sync(dev));
        hq_ctx_free(dev, (char *)xg.data - shifts[s]);
        free(x.data);
      }
      hq_qtensor_free(g);
    }
    hq_quantizer_free(qh);
    hq_quantizer_free(qi);
    hq_quantizer_free(q8);
    hq_recipe_free(r);
    hq_recipe_free(rh);
    hq_recipe_free(r8);
  }
  hq_ctx_free(dev, amax_dev);
  hq_ctx_destroy(dev);
}

/* A configuration with every option at its default (current scaling, e4m3): one value per entry
   of the module's option table, whatever its length. */
static void *default_cfg(const hq_format_ops *ops, const hq_host_api *host) {
  hq_optval v[16];
  memset(v, 0, sizeof v);
  for (size_t n = 0; ops->options[n].name; n++) {
    assert_true(n < 16);
    if (!strcmp(ops->options[n].name, "amax_history_len")) v[n].i = 1024;
  }
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  HQ_OK_OR_FAIL(ops->configure(cfg, v, host));
  return cfg;
}

/* The module's amax op on the device, called directly: out[0] / out[1] get max |x| (NaN ignored,
   Inf counted) for the requested directions and 0 for the others (written over whatever was
   there), for aligned (vectorized) and odd shapes (the largest |x| in the last n % 8 elements
   of the last three), on both sides of 2^17 elements (the pass's one-cluster form, and the
   memset and atomics of a larger tensor), from a 16-byte aligned source and one an element
   off, every input dtype; its scratch is 0. */
static void test_amax_op_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_tensor")(&host);
  assert_non_null(ops);
  assert_non_null(ops->amax);
  void *cfg = default_cfg(ops, &host);
  assert_int_equal(ops->scratch_size ? ops->scratch_size(cfg, 4096, 4096, HQ_BOTH, 0) : 0, 0);
  hq_call call = hq_test_call(&host, 0, 0);
  call.device = 0;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{1, 1},      {37, 53},     {64, 64},    {1000, 333},
                               {3, 5},      {1001, 333},  {121, 1045}, {362, 363}};
  for (int t = 0; t < 3; t++)
    for (size_t sh = 0; sh < 2 * (sizeof shapes / sizeof shapes[0]); sh++) {
      const size_t shape = sh / 2;
      const int64_t M = shapes[shape][0], K = shapes[shape][1];
      hq_tensor x = hq_test_tensor(dts[t], M, K, 500 + sh, 2.0f);
      if (M * K > 8) {
        hq_store_hp(x.data, 5, dts[t], NAN);
        hq_store_hp(x.data, M * K - 2, dts[t], -300.0f);
      }
      if (shape >= 5) hq_store_hp(x.data, M * K - 1, dts[t], 400.0f); /* n % 8 == 5, 5, 6 */
      float want = 0;
      for (int64_t i = 0; i < M * K; i++) {
        float a = fabsf(hq_load_hp(x.data, i, dts[t]));
        if (!isnan(a) && a > want) want = a;
      }
      /* odd sh: the source one element past a 16-byte boundary (element loads) */
      hq_tensor xg = hq_gpu_tensor_at(gpu, &x, sh % 2 ? hq_dtype_size(dts[t]) : 0);
      for (uint32_t dirs = 0; dirs <= 3; dirs++) {
        const float junk[2] = {-7.0f, NAN};
        float *og = amax_to_gpu(junk), out[2];
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        assert_int_equal(ops->amax(cfg, &call, &xg, dirs, og), HQ_OK);
        amax_to_host(og, out);
        if (out[0] != ((dirs & HQ_ROWWISE) ? want : 0.0f) ||
            out[1] != ((dirs & HQ_COLWISE) ? want : 0.0f))
          fail_msg("%s %lldx%lld%s dirs %u: amax {%a, %a}, want %a", hq_dtype_name(dts[t]),
                   (long long)M, (long long)K, sh % 2 ? " (unaligned)" : "", dirs, out[0],
                   out[1], want);
        hq_ctx_free(gpu, og);
      }
      hq_ctx_free(gpu, (char *)xg.data - (sh % 2 ? hq_dtype_size(dts[t]) : 0));
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

// --- ABI 2.1 on the device -----------------------------------------------------------------------

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* The raw dequantize and tensor_factor, called directly on the device (call->device 0, the
   context's default stream), equal the CPU's byte for byte, for both directions, e4m3 and e5m2,
   odd and aligned shapes, NaN / Inf inputs and every destination dtype; and on the device's
   outputs RN_f32(raw * factor) equals hq_dequantize into f32 bit for bit (NaN: NaN). */
static void test_raw_and_factor_on_device(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_tensor")(&host);
  assert_non_null(ops);
  assert_non_null(ops->tensor_factor);
  void *cfg = default_cfg(ops, &host);
  hq_call hc = hq_test_call(&host, 0, 0), gc = hc;
  gc.device = 0;
  const char *sets[2] = {"", "dtype = e5m2\npower_2_scales = true"};
  const int64_t shapes[][2] = {{37, 53}, {256, 512}, {1, 1}, {64, 72}};
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  float *fdev = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, sizeof(float), (void **)&fdev));
  for (int o = 0; o < 2; o++)
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
      char text[256];
      snprintf(text, sizeof text, "[format f]\nplugin = fp8_tensor\n%s\n[role *:*:*]\n"
               "rowwise = f\ncolumnwise = f\n", sets[o]);
      hq_recipe *r = hq_test_recipe(text);
      hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
      const int64_t M = shapes[sh][0], K = shapes[sh][1], n = M * K;
      hq_tensor x = hq_test_tensor(HQ_F32, M, K, 900 + sh, 20.0f);
      if (n > 8) {
        ((float *)x.data)[1] = NAN;
        ((float *)x.data)[n - 2] = o ? INFINITY : 1e-12f;
      }
      hq_tensor xg = to_gpu(&x);
      hq_qtensor *h = NULL, *g = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
      for (uint32_t dir = 1; dir <= 2; dir++) {
        const hq_storage *sh_ = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
        float fh = -1.0f, fg = -2.0f;
        HQ_OK_OR_FAIL(ops->tensor_factor(cfg, &hc, sh_, &fh));
        assert_int_equal(ops->tensor_factor(cfg, &gc, sg, fdev), HQ_OK);
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, &fg, HQ_DEVICE_HOST, fdev, 0, sizeof fg));
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        if (f32_bits(fh) != f32_bits(fg)) fail_msg("factor cpu %a gpu %a", (double)fh, (double)fg);
        hq_gpu_check_factor_out(gpu, ops, &host, sg, fh, M, K, sets[o]); /* ABI 2.3 */
        float *raw_f32 = NULL;
        for (int t = 0; t < 3; t++) {
          const size_t bytes = (size_t)n * hq_dtype_size(outs[t]);
          hq_tensor dh = hq_test_empty(outs[t], M, K), dg = dh;
          HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &dg.data));
          dg.device = 0;
          hc.flags = gc.flags = HQ_CALL_DEQ_RAW;
          HQ_OK_OR_FAIL(ops->dequantize(cfg, &hc, sh_, &dh));
          assert_int_equal(ops->dequantize(cfg, &gc, sg, &dg), HQ_OK);
          hc.flags = gc.flags = 0;
          void *back = malloc(bytes);
          HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg.data, 0, bytes));
          HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
          if (memcmp(back, dh.data, bytes) != 0)
            fail_msg("[%s] %lldx%lld dir %u: raw dequantize into %s differs from the CPU's",
                     sets[o], (long long)M, (long long)K, dir, hq_dtype_name(outs[t]));
          if (outs[t] == HQ_F32) raw_f32 = back;
          else free(back);
          free(dh.data);
          hq_ctx_free(gpu, dg.data);
        }
        /* the invariant on the device's outputs */
        hq_tensor dg = hq_test_empty(HQ_F32, M, K);
        void *dd = NULL;
        HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, (size_t)n * 4, &dd));
        hq_tensor dgd = hq_tensor_2d(dd, HQ_F32, 0, M, K);
        HQ_OK_OR_FAIL(hq_dequantize(g, gpu, dir, &dgd));
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, dg.data, HQ_DEVICE_HOST, dd, 0, (size_t)n * 4));
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        for (int64_t i = 0; i < n; i++) {
          const float r = raw_f32[i], d = ((float *)dg.data)[i];
          if (isnan(r)) {
            assert_true(isnan(d));
            continue;
          }
          const float prod = (float)((double)r * (double)fg);
          if (f32_bits(prod) != f32_bits(d))
            fail_msg("[%s] %lldx%lld dir %u [%lld]: RN(raw %a * factor %a) = %a, dequantize %a",
                     sets[o], (long long)M, (long long)K, dir, (long long)i, (double)r,
                     (double)fg, (double)prod, (double)d);
        }
        free(raw_f32);
        free(dg.data);
        hq_ctx_free(gpu, dd);
      }
      hq_qtensor_free(h);
      hq_qtensor_free(g);
      hq_ctx_free(gpu, xg.data);
      free(x.data);
      hq_quantizer_free(q);
      hq_recipe_free(r);
    }
  hq_ctx_free(gpu, fdev);
  free(cfg);
}

/* ABI 2.3: the folded factor of an empty [0, 48] device storage of each direction (no
   dequantize kernel runs; the public API makes no empty tensors, so the storage is laid out and
   allocated here by direct module calls), its scale_inv set to 0.3 and 2^-9 * 1.5. */
static void test_factor_out_empty(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_tensor")(&host);
  assert_non_null(ops);
  assert_true(ops->caps & HQ_CAP_DEQ_FACTOR);
  void *cfg = default_cfg(ops, &host);
  for (uint32_t d = 1; d <= 2; d++) {
    hq_storage st;
    hq_gpu_device_storage(gpu, ops, cfg, &host, 0, 48, HQ_F32, d, d, NULL, &st);
    const float si = d == 1 ? 0.3f : 0x1.8p-9f;
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, hq_gpu_buf_of(&st, HQ_ROLE_SCALE)->ptr, hq_ctx_device(gpu),
                                &si, HQ_DEVICE_HOST, sizeof si));
    hq_gpu_check_factor_out(gpu, ops, &host, &st, si, 0, 48, "empty");
    hq_gpu_free_storage(gpu, &st);
  }
  free(cfg);
}

/* One GEMM case on the device: A = x_a quantized by role ra, B by rb, flags ta / tb, D of dtype
   ddt (beta 0.5 over a random D0, alpha 1.25). The path hq_gemm_plan names must be `want` (0: any)
   and its reason contain `reason` (NULL: none checked); hq_gemm's result and, when the path is
   native, the emulated path's (HQ_GEMM_FORCE_EMULATED) are checked against the F64 product of
   the dequantized operands: the emulated path within FP32 accumulation error, the native one
   (FP8 tensor cores, fast accumulation) within 2^-10 of sum |alpha a b| more. */
static void gemm_case(hq_recipe *r, const char *ra, const char *rb, int ta, int tb, int64_t M,
                      int64_t N, int64_t K, hq_dtype ddt, uint32_t want, const char *reason) {
  char what[200];
  snprintf(what, sizeof what, "%s x %s ta %d tb %d m %lld n %lld k %lld D %s", ra, rb, ta, tb,
           (long long)M, (long long)N, (long long)K, hq_dtype_name(ddt));
  hq_quantizer *qa = hq_test_quantizer(r, ra), *qb = hq_test_quantizer(r, rb);
  const int64_t a0 = ta ? M : K, a1 = ta ? K : M, b0 = tb ? K : N, b1 = tb ? N : K;
  hq_tensor xa = hq_test_tensor(HQ_BF16, a0, a1, 41 + (uint64_t)ta, 2.0f);
  hq_tensor xb = hq_test_tensor(HQ_BF16, b0, b1, 51 + (uint64_t)tb, 0.5f);
  hq_tensor xag = to_gpu(&xa), xbg = to_gpu(&xb);
  hq_qtensor *A = NULL, *B = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qa, gpu, &xag, &A));
  HQ_OK_OR_FAIL(hq_quantize(qb, gpu, &xbg, &B));
  hq_tensor d0h = hq_test_tensor(ddt, N, M, 61, 1.0f);
  hq_tensor d = to_gpu(&d0h), de = to_gpu(&d0h);
  hq_gpu_gemm_vs_f64(gpu, A, ta, B, tb, &d0h, &d, &de, want, reason, HQ_GEMM_PATH_EMULATED_BF16, what);
  hq_ctx_free(gpu, d.data);
  hq_ctx_free(gpu, de.data);
  hq_ctx_free(gpu, xag.data);
  hq_ctx_free(gpu, xbg.data);
  free(d0h.data);
  free(xa.data);
  free(xb.data);
  hq_qtensor_free(A);
  hq_qtensor_free(B);
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
}

/* hq_gemm of fp8_tensor operands on the device: native where this module's gemm op runs
   cuBLASLt (sm_89 and newer: every flag pair, e4m3 x e4m3 / x e5m2 / e5m2 x e4m3, F32 and BF16
   D) and equal to the emulated path and the F64 product within the bounds above; e5m2 x e5m2 and
   k = 40 go emulated with the module's reason. */
static void test_gemm_on_device(void **state) {
  (void)state;
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  const uint32_t native = arch >= 89 ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16;
  hq_recipe *r = hq_test_recipe("[format a]\nplugin = fp8_tensor\n[format b]\nplugin = fp8_tensor\n"
                                "dtype = e5m2\n[role *:*:a]\nrowwise = a\ncolumnwise = a\n"
                                "[role *:*:b]\nrowwise = b\ncolumnwise = b\n");
  const char *pairs[3][2] = {{"l:w:a", "l:x:a"}, {"l:w:a", "l:x:b"}, {"l:w:b", "l:x:a"}};
  for (int pr = 0; pr < 3; pr++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        gemm_case(r, pairs[pr][0], pairs[pr][1], ta, tb, 128, 96, 256,
                  (ta + tb + pr) & 1 ? HQ_BF16 : HQ_F32, native, NULL);
  gemm_case(r, "l:w:a", "l:x:a", 1, 0, 512, 256, 2048, HQ_BF16, native, NULL);
  gemm_case(r, "l:w:b", "l:x:b", 1, 0, 64, 32, 64, HQ_F32, HQ_GEMM_PATH_EMULATED_BF16,
            "e5m2 x e5m2");
  gemm_case(r, "l:w:a", "l:x:b", 0, 1, 64, 32, 40, HQ_F32, HQ_GEMM_PATH_EMULATED_BF16, "k = 40");
  hq_recipe_free(r);
}

// --- delayed scaling ----------------------------------------------------------------------------

/* The two states' whole buffers are equal bit for bit. */
static void compare_states(hq_state *sh, hq_state *sg, const char *what, int step) {
  float *dh = NULL, *dg = NULL;
  size_t nh = 0, ng = 0;
  HQ_OK_OR_FAIL(hq_state_data(sh, &dh, &nh));
  HQ_OK_OR_FAIL(hq_state_data(sg, &dg, &ng));
  assert_int_equal(nh, ng);
  float *back = malloc(ng * sizeof *back);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg, 0, ng * sizeof *back));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  for (size_t i = 0; i < nh; i++)
    if (memcmp(&dh[i], &back[i], sizeof(float)) != 0)
      fail_msg("%s, step %d: state float %zu of %zu: cpu %a gpu %a", what, step, i, nh, dh[i],
               back[i]);
  free(back);
}

/* A delayed-scaling state on the host and one on the device, and three roles' quantizers bound
   to each (which lays out their slices). */
typedef struct delayed_pair {
  hq_state *sh, *sg;
  hq_quantizer *qh[3], *qg[3];
} delayed_pair;

static void delayed_pair_make(delayed_pair *p, hq_recipe *r, const char *const roles[3]) {
  HQ_OK_OR_FAIL(hq_state_create(r, cpu, &p->sh));
  HQ_OK_OR_FAIL(hq_state_create(r, gpu, &p->sg));
  for (int k = 0; k < 3; k++) {
    char buf[64];
    hq_role role;
    HQ_OK_OR_FAIL(hq_role_parse(roles[k], buf, sizeof buf, &role));
    HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, p->sh, &p->qh[k]));
    HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, p->sg, &p->qg[k]));
  }
}

static void delayed_pair_free(delayed_pair *p) {
  for (int k = 0; k < 3; k++) {
    hq_quantizer_free(p->qh[k]);
    hq_quantizer_free(p->qg[k]);
  }
  hq_state_free(p->sh);
  hq_state_free(p->sg);
}

/* Delayed scaling on the device: a fused quantizer (aligned and odd shapes, a NaN and an Inf in
   some steps), delayed rowwise beside mxfp8 columnwise, delayed columnwise (e5m2, most_recent,
   margin) beside mxfp8 rowwise; f32, bf16 and f16 inputs; a quantize and an in-place update per
   step; then the update kernel against the CPU rule for hand-set amaxes (0, NaN, Inf, a
   subnormal, -0). */
static void test_delayed_on_device(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format d]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 3\n"
      "[format e]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\namax_history_len = 5\n"
      "amax_compute_algo = most_recent\nmargin = 2\n"
      "[role *:*:fused]\nrowwise = d\ncolumnwise = d\n"
      "[role *:*:rowd]\nrowwise = d\ncolumnwise = mxfp8\n"
      "[role *:*:cold]\nrowwise = mxfp8\ncolumnwise = e\n");
  const char *roles[3] = {"a:b:fused", "a:b:rowd", "a:b:cold"};
  delayed_pair dp;
  delayed_pair_make(&dp, r, roles);
  hq_state *sh = dp.sh, *sg = dp.sg;
  hq_quantizer **qh = dp.qh, **qg = dp.qg;
  compare_states(sh, sg, "initial", 0);
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const float factors[5] = {1.0f, 20.0f, 0.05f, 3.0f, 0.5f};
  for (int t = 0; t < 5; t++) {
    for (int k = 0; k < 3; k++) {
      const hq_dtype dt = dts[(t + k) % 3];
      const int64_t M = k == 0 && (t % 2) ? 37 : 64, K = k == 0 && (t % 2) ? 53 : 96;
      hq_tensor x = hq_test_tensor(dt, M, K, 700 + (uint64_t)(10 * t + k), factors[t]);
      if (k == 0 && t == 1) hq_store_hp(x.data, 5, dt, NAN);
      if (k == 0 && t == 3) hq_store_hp(x.data, 7, dt, -INFINITY);
      hq_tensor xg = to_gpu(&x);
      char what[128];
      snprintf(what, sizeof what, "delayed %s %s %lldx%lld step %d", roles[k], hq_dtype_name(dt),
               (long long)M, (long long)K, t + 1);
      hq_qtensor *h = NULL, *g = NULL;
      HQ_OK_OR_FAIL(hq_quantize(qh[k], cpu, &x, &h));
      HQ_OK_OR_FAIL(hq_quantize(qg[k], gpu, &xg, &g));
      compare_usage(h, g, HQ_BOTH, what);
      /* an in-place update with other data accumulates into the same slices */
      hq_tensor y = hq_test_tensor(dt, M, K, 900 + (uint64_t)(10 * t + k), factors[t] * 1.5f);
      hq_tensor yg = to_gpu(&y);
      HQ_OK_OR_FAIL(hq_qtensor_update(h, cpu, &y));
      HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &yg));
      compare_usage(h, g, HQ_BOTH, what);
      hq_qtensor_free(h);
      hq_qtensor_free(g);
      hq_ctx_free(gpu, yg.data);
      free(y.data);
      hq_ctx_free(gpu, xg.data);
      free(x.data);
    }
    compare_states(sh, sg, "before update", t + 1);
    HQ_OK_OR_FAIL(hq_state_update(sh, cpu));
    HQ_OK_OR_FAIL(hq_state_update(sg, gpu));
    compare_states(sh, sg, "after update", t + 1);
  }
  /* the update kernel against the CPU rule, amaxes set by hand */
  const float special[][3] = {{0.0f, NAN, INFINITY}, {1e-45f, -0.0f, 7.0f}, {NAN, 0.0f, 1e30f},
                              {2.0f, 3.0f, 4.0f}};
  for (int t = 0; t < 4; t++) {
    float *ah = NULL, *ag = NULL;
    size_t nh = 0, ng = 0;
    HQ_OK_OR_FAIL(hq_state_amaxes(sh, &ah, &nh));
    HQ_OK_OR_FAIL(hq_state_amaxes(sg, &ag, &ng));
    assert_int_equal(nh, 3);
    assert_int_equal(ng, 3);
    memcpy(ah, special[t], sizeof special[t]);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, ag, 0, special[t], HQ_DEVICE_HOST, sizeof special[t]));
    HQ_OK_OR_FAIL(hq_state_update(sh, cpu));
    HQ_OK_OR_FAIL(hq_state_update(sg, gpu));
    compare_states(sh, sg, "hand-set amaxes", t + 1);
  }
  delayed_pair_free(&dp);
  hq_recipe_free(r);
}

/* The update kernel spreads a slice's history over a block of 256 threads: histories longer
   than the block (600, 1024: several chunks of the roll, one not whole) and of one row, the
   whole state set by hand to distinct values (NaN, Inf, -0 and a subnormal among the history's
   rows), then updated over several steps with amaxes that are 0, NaN or finite, against the
   CPU's serial rule: every float of the state equal after each update. */
static void test_delayed_long_history(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format l]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 1024\n"
      "[format m]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\n"
      "amax_history_len = 600\namax_compute_algo = most_recent\n"
      "[format o]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 1\n"
      "[role *:*:l]\nrowwise = l\ncolumnwise = l\n"
      "[role *:*:m]\nrowwise = m\ncolumnwise = m\n"
      "[role *:*:o]\nrowwise = o\ncolumnwise = o\n");
  const char *roles[3] = {"a:b:l", "a:b:m", "a:b:o"};
  delayed_pair dp;
  delayed_pair_make(&dp, r, roles);
  hq_state *sh = dp.sh, *sg = dp.sg;
  float *dh = NULL, *dg = NULL, *ah = NULL, *ag = NULL;
  size_t nh = 0, ng = 0, mh = 0, mg = 0;
  HQ_OK_OR_FAIL(hq_state_amaxes(sh, &ah, &mh));
  HQ_OK_OR_FAIL(hq_state_amaxes(sg, &ag, &mg));
  HQ_OK_OR_FAIL(hq_state_data(sh, &dh, &nh));
  HQ_OK_OR_FAIL(hq_state_data(sg, &dg, &ng));
  assert_int_equal(nh, ng);
  assert_int_equal(mh, mg);
  assert_true(mh >= 3 && mh <= 16 && nh >= 1024 + 600 + 1);
  /* distinct positive values, a few specials among them */
  uint64_t seed = 12345;
  for (size_t i = 0; i < nh; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    dh[i] = ldexpf((float)(seed >> 40) + 1.0f, (int)(seed % 41) - 30);
  }
  dh[5] = NAN;
  dh[700] = INFINITY;
  dh[900] = -0.0f;
  dh[1030] = 1e-45f;
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, dg, 0, dh, HQ_DEVICE_HOST, nh * sizeof *dh));
  const float amaxes[5][3] = {{3.0f, 5.0f, 7.0f}, {0.0f, NAN, 2.0f}, {NAN, 0.0f, 0.0f},
                              {1e30f, 1e-30f, INFINITY}, {0.25f, 0.5f, 0.75f}};
  for (int t = 0; t < 5; t++) {
    float a[16] = {0};
    for (size_t i = 0; i < mh && i < 16; i++) a[i] = amaxes[t][i % 3];
    memcpy(ah, a, mh * sizeof *ah);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, ag, 0, a, HQ_DEVICE_HOST, mh * sizeof *ag));
    HQ_OK_OR_FAIL(hq_state_update(sh, cpu));
    HQ_OK_OR_FAIL(hq_state_update(sg, gpu));
    compare_states(sh, sg, "long histories", t + 1);
    float back[16];
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, ag, 0, mh * sizeof *back));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    assert_memory_equal(back, ah, mh * sizeof *ah);
  }
  delayed_pair_free(&dp);
  hq_recipe_free(r);
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bitwise_equal),
      cmocka_unit_test(test_hybrid_on_device),
      cmocka_unit_test(test_copy_beside_on_device),
      cmocka_unit_test(test_amax_op_direct),
      cmocka_unit_test(test_device_mismatch),
      cmocka_unit_test(test_raw_and_factor_on_device),
      cmocka_unit_test(test_factor_out_empty),
      cmocka_unit_test(test_gemm_on_device),
      cmocka_unit_test(test_delayed_on_device),
      cmocka_unit_test(test_delayed_long_history),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
