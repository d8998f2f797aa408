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
** ABI 2.1: the raw dequantize (HQ_CALL_DEQ_RAW), called directly on the device, equals the CPU's
** byte for byte and the device's normal dequantize (no per-tensor factor, no transform); hq_gemm
** of two fp8_block operands: on Hopper (sm_90) the native path for 1-D x 1-D, 1-D x 2-D and 2-D x
** 1-D, every flag pair, F32 / BF16 D, against the emulated path (HQ_GEMM_FORCE_EMULATED) and an
** F64 product of the dequantized operands -- small problems by this module's own kernel (2-D x
** 2-D too), large ones by cuBLASLt; a large 2-D x 2-D takes the emulated path with the cublaslt
** provider's reason.
** The fused AdamW write-back (hq_adam_step with HQ_CAP_FUSED_ADAM) against the CPU's step: 1-D
** and 2-D, each direction alone and both, partial tiles, the element-wise and 16-byte paths, on
** tensors of fewer tiles than one wave of the fused kernel's CTAs (the step runs apart, then the
** quantize) and of more (the step inside the quantize kernel).
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

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

static void compare_usage(const hq_qtensor *h, const hq_qtensor *g, uint32_t usage,
                          const char *what) {
  hq_gpu_compare_usage(gpu, h, g, usage, what);
}

/* A device copy of a host tensor; `shift` elements into its allocation (a misaligned pointer
   when shift is odd). *base is what to free. */
static hq_tensor to_gpu(const hq_tensor *h, int shift, void **base) {
  const size_t off = (size_t)shift * hq_dtype_size(h->dtype);
  const hq_tensor g = hq_gpu_tensor_at(gpu, h, off);
  *base = (char *)g.data - off;
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
   one larger tensor per block shape. Tensors of at most 16 tiles (every shape above) take the
   split kernel, a cluster of CTAs a tile; the larger ones here the one-CTA-a-tile kernel. */
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
  /* a host tensor: the CPU quantize's 128x128 tile (128 FP32 column scales, 128 x 128 FP32
     inputs and as many FP8 bytes) */
  assert_int_equal(ops->scratch_size(cfg, 300, 300, HQ_BOTH, HQ_DEVICE_HOST),
                   128 * 4 + 128 * 128 * 4 + 128 * 128);
  free(cfg);
}

// --- ABI 2.1 on the device -----------------------------------------------------------------------

/* The raw dequantize called directly on the device (call->device 0, the context's default
   stream) equals the CPU's raw dequantize and the device's normal one, byte for byte, for every
   direction, block shape, element dtype, pow2 and FP32 scales, edge shapes with special values and
   every destination dtype. */
static void test_raw_on_device(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_block")(&host);
  assert_non_null(ops);
  void *cfg = calloc(1, ops->config_size);
  hq_optval v[4];
  memset(v, 0, sizeof v);
  HQ_OK_OR_FAIL(ops->configure(cfg, v, &host));
  hq_call hc = hq_test_call(&host, 0, 0), gc = hc;
  gc.device = 0;
  const int64_t shapes[][2] = {{257, 131}, {1, 1}, {256, 512}, {3, 517}};
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int c = 0; c < NCONFIGS; c++)
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
      char text[512];
      snprintf(text, sizeof text, "[format f]\nplugin = fp8_block\n%s\n[role *:*:*]\n"
               "rowwise = f\ncolumnwise = f\n", configs[c]);
      hq_recipe *r = hq_test_recipe(text);
      hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
      const int64_t M = shapes[sh][0], K = shapes[sh][1], n = M * K;
      hq_tensor x = hq_test_tensor(HQ_F32, M, K, 700 + sh, 4.0f);
      if (M > 2) add_specials(&x);
      void *xb = NULL;
      hq_tensor xg = to_gpu(&x, 0, &xb);
      hq_qtensor *h = NULL, *g = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
      for (uint32_t dir = 1; dir <= 2; dir++) {
        const hq_storage *sh_ = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
        for (int t = 0; t < 3; t++) {
          const size_t bytes = (size_t)n * hq_dtype_size(outs[t]);
          hq_tensor dh = hq_test_empty(outs[t], M, K), dg = dh, dn = dh;
          HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &dg.data));
          HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes, &dn.data));
          dg.device = dn.device = 0;
          hc.flags = gc.flags = HQ_CALL_DEQ_RAW;
          HQ_OK_OR_FAIL(ops->dequantize(cfg, &hc, sh_, &dh));
          assert_int_equal(ops->dequantize(cfg, &gc, sg, &dg), HQ_OK);
          hc.flags = gc.flags = 0;
          HQ_OK_OR_FAIL(hq_dequantize(g, gpu, dir, &dn));
          void *back = malloc(bytes), *backn = malloc(bytes);
          HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg.data, 0, bytes));
          HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, backn, HQ_DEVICE_HOST, dn.data, 0, bytes));
          HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
          if (memcmp(back, dh.data, bytes) != 0 || memcmp(back, backn, bytes) != 0)
            fail_msg("[%s] %lldx%lld dir %u: raw dequantize into %s differs (cpu raw %d, device "
                     "dequantize %d)", configs[c], (long long)M, (long long)K, dir,
                     hq_dtype_name(outs[t]), memcmp(back, dh.data, bytes) != 0,
                     memcmp(back, backn, bytes) != 0);
          free(back);
          free(backn);
          free(dh.data);
          hq_ctx_free(gpu, dg.data);
          hq_ctx_free(gpu, dn.data);
        }
      }
      hq_qtensor_free(h);
      hq_qtensor_free(g);
      hq_ctx_free(gpu, xb);
      free(x.data);
      hq_quantizer_free(q);
      hq_recipe_free(r);
    }
  free(cfg);
}

/* One GEMM case on the device: A quantized by role ra, B by rb, flags ta / tb, D of dtype ddt
   (beta 0.5 over a random D0, alpha 1.25). hq_gemm_plan must name path `want` (0: any) with a
   reason containing `reason` (NULL: unchecked); hq_gemm's result and the emulated path's
   (HQ_GEMM_FORCE_EMULATED, which must be `emul`) are checked against the F64 product of the
   dequantized operands: the emulated one within FP32 accumulation error, the native one (FP8
   tensor cores, 128-element blocks promoted to FP32) within 2^-10 of sum |alpha a b| more. The
   plan must name `provider` (NULL: unchecked). */
static void gemm_case(hq_recipe *r, const char *ra, const char *rb, int ta, int tb, int64_t M,
                      int64_t N, int64_t K, hq_dtype ddt, uint32_t want, const char *reason,
                      uint32_t emul, const char *provider) {
  char what[200];
  snprintf(what, sizeof what, "%s x %s ta %d tb %d m %lld n %lld k %lld D %s", ra, rb, ta, tb,
           (long long)M, (long long)N, (long long)K, hq_dtype_name(ddt));
  hq_quantizer *qa = hq_test_quantizer(r, ra), *qb = hq_test_quantizer(r, rb);
  const int64_t a0 = ta ? M : K, a1 = ta ? K : M, b0 = tb ? K : N, b1 = tb ? N : K;
  hq_tensor xa = hq_test_tensor(HQ_BF16, a0, a1, 41 + (uint64_t)ta, 2.0f);
  hq_tensor xb = hq_test_tensor(HQ_F32, b0, b1, 51 + (uint64_t)tb, 0.5f);
  void *pa = NULL, *pb = NULL, *pd = NULL, *pe = NULL;
  hq_tensor xag = to_gpu(&xa, 0, &pa), xbg = to_gpu(&xb, 0, &pb);
  hq_qtensor *A = NULL, *B = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qa, gpu, &xag, &A));
  HQ_OK_OR_FAIL(hq_quantize(qb, gpu, &xbg, &B));
  hq_tensor d0h = hq_test_tensor(ddt, N, M, 61, 1.0f);
  hq_tensor d = to_gpu(&d0h, 0, &pd), de = to_gpu(&d0h, 0, &pe);
  if (provider) {
    hq_gemm_info info = {.struct_size = sizeof info};
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, NULL, &info));
    if (strcmp(info.provider, provider) != 0)
      fail_msg("%s: provider %s, expected %s", what, info.provider, provider);
  }
  hq_gpu_gemm_vs_f64(gpu, A, ta, B, tb, &d0h, &d, &de, want, reason, emul, what);
  hq_ctx_free(gpu, pd);
  hq_ctx_free(gpu, pe);
  hq_ctx_free(gpu, pa);
  hq_ctx_free(gpu, pb);
  free(d0h.data);
  free(xa.data);
  free(xb.data);
  hq_qtensor_free(A);
  hq_qtensor_free(B);
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
}

/* hq_gemm of fp8_block operands on the device: native on Hopper for 1-D x 1-D, 1-D x 2-D and
   2-D x 1-D (pow2 and FP32 scales, e4m3 with an e5m2 gradient, every flag pair, F32 and BF16 D),
   equal to the emulated path (BF16 with pow2 scales on both sides, else F32) and the F64 product
   within the bounds above: at 2^24 multiply-adds by the module's own kernel, with partial blocks
   (m 200, n 136, k 320: a last block of 64) too, at 2^28 or with k = 4096 by cuBLASLt; 2-D x 2-D
   by the module's kernel when small, else emulated with cuBLASLt's reason. */
static void test_gemm_on_device(void **state) {
  (void)state;
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  const int hopper = arch >= 90 && arch <= 99;
  hq_recipe *r = hq_test_recipe(
      "[format one]\nplugin = fp8_block\n[format two]\nplugin = fp8_block\nblock = 2d\n"
      "[format g5]\nplugin = fp8_block\ndtype = e5m2\n"
      "[format one32]\nplugin = fp8_block\npower_2_scales = false\n"
      "[format two32]\nplugin = fp8_block\nblock = 2d\npower_2_scales = false\n"
      "[role *:*:one]\nrowwise = one\ncolumnwise = one\n[role *:*:two]\nrowwise = two\n"
      "columnwise = two\n[role *:*:g5]\nrowwise = g5\ncolumnwise = g5\n"
      "[role *:*:one32]\nrowwise = one32\ncolumnwise = one32\n"
      "[role *:*:two32]\nrowwise = two32\ncolumnwise = two32\n");
  const struct {
    const char *a, *b;
    int bf16; /* both pow2: the emulated path is BF16 */
  } pairs[] = {{"l:w:one", "l:x:one", 1}, {"l:w:two", "l:x:one", 1}, {"l:w:one", "l:x:two", 1},
               {"l:w:two32", "l:x:g5", 0}, {"l:w:one32", "l:x:two32", 0}};
  const int np = (int)(sizeof pairs / sizeof pairs[0]);
  for (int pr = 0; pr < np; pr++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const uint32_t emul = pairs[pr].bf16 ? HQ_GEMM_PATH_EMULATED_BF16
                                             : HQ_GEMM_PATH_EMULATED_F32;
        gemm_case(r, pairs[pr].a, pairs[pr].b, ta, tb, 256, 128, 512,
                  (ta + tb + pr) & 1 ? HQ_BF16 : HQ_F32, hopper ? HQ_GEMM_PATH_NATIVE : emul,
                  NULL, emul, hopper ? "fp8_block" : NULL);
        gemm_case(r, pairs[pr].a, pairs[pr].b, ta, tb, 200, 136, 320, HQ_F32, 0, NULL, emul,
                  hopper ? "fp8_block" : NULL);
      }
  /* k = 4096 (2^24 multiply-adds): above the kernel's k, cuBLASLt's */
  gemm_case(r, "l:w:one", "l:x:one", 1, 0, 64, 64, 4096, HQ_F32,
            hopper ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16, NULL,
            HQ_GEMM_PATH_EMULATED_BF16, hopper ? "cublaslt" : NULL);
  for (int pr = 0; pr < np; pr++) /* 1024 x 512 x 512: cuBLASLt's */
    gemm_case(r, pairs[pr].a, pairs[pr].b, 1, 0, 1024, 512, 512, pr & 1 ? HQ_BF16 : HQ_F32,
              hopper ? HQ_GEMM_PATH_NATIVE : 0, NULL,
              pairs[pr].bf16 ? HQ_GEMM_PATH_EMULATED_BF16 : HQ_GEMM_PATH_EMULATED_F32,
              hopper ? "cublaslt" : NULL);
  /* E5M2 as A, and E5M2 x E5M2, for which cuBLASLt has no kernel: the module's own */
  gemm_case(r, "l:w:g5", "l:x:one", 1, 0, 256, 128, 512, HQ_BF16,
            hopper ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16, NULL,
            HQ_GEMM_PATH_EMULATED_BF16, hopper ? "fp8_block" : NULL);
  gemm_case(r, "l:w:g5", "l:x:g5", 0, 1, 200, 136, 320, HQ_F32,
            hopper ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16, NULL,
            HQ_GEMM_PATH_EMULATED_BF16, hopper ? "fp8_block" : NULL);
  gemm_case(r, "l:w:two", "l:x:two", 1, 0, 256, 128, 256, HQ_F32,
            hopper ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16, NULL,
            HQ_GEMM_PATH_EMULATED_BF16, hopper ? "fp8_block" : NULL);
  gemm_case(r, "l:w:two", "l:x:two", 1, 0, 512, 256, 512, HQ_F32, HQ_GEMM_PATH_EMULATED_BF16,
            hopper ? "2-D x 2-D" : NULL, HQ_GEMM_PATH_EMULATED_BF16, NULL);
  hq_recipe_free(r);
}

/* --- the fused AdamW write-back ------------------------------------------------------------
** hq_adam_step on a device runs the whole optimizer step inside fp8_block's quantize kernel
** (HQ_CAP_FUSED_ADAM): the masters, moments and every stored byte equal the CPU's loop (the
** element rule hq_adam_elem, then a quantize), and the stored bytes equal a fresh CPU quantize of
** the new master. Covered: 1-D and 2-D blocks, both directions and each alone, e4m3 and e5m2,
** power-of-two scales on and off, gradients in f32, bf16 and f16, partial edge tiles on either
** side, K % 8 != 0 and masters, moments and gradients off 16-byte alignment (the element-wise
** path), and tensors of more 128x128 tiles than the device holds CTAs at once. */
static int adam_fused_seen; /* "AdamW fused into" debug messages on adam_ctx */

static void adam_log(void *user, int level, const char *msg) {
  (void)user;
  if (strstr(msg, "AdamW fused into")) adam_fused_seen++;
  if (level <= 1) fprintf(stderr, "hq: %s\n", msg);
}

/* A device copy of host array h (n elements of `size` bytes), `shift` elements into its
   allocation; *base is what to free. */
static void *adam_to_dev(hq_ctx *dev, const void *h, int64_t n, size_t size, int shift,
                         void **base) {
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, (size_t)(n + shift + 8) * size, base));
  void *d = (char *)*base + (size_t)shift * size;
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, d, hq_ctx_device(dev), h, HQ_DEVICE_HOST, (size_t)n * size));
  return d;
}

static void adam_expect_equal(hq_ctx *dev, const float *d, const float *h, int64_t n,
                              const char *arr, const char *what) {
  float *back = malloc((size_t)n * 4);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, back, HQ_DEVICE_HOST, d, hq_ctx_device(dev), (size_t)n * 4));
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&back[i], &h[i], 4) != 0)
      fail_msg("%s: %s[%lld] is %.9g on the device, %.9g on the CPU", what, arr, (long long)i,
               (double)back[i], (double)h[i]);
  free(back);
}

/* shift: elements the master (wshift) and the gradient and moments (shift) sit past an aligned
   address. */
static void adam_case(hq_ctx *dev, const char *options, uint32_t usage, int64_t M, int64_t K,
                      hq_dtype gdt, int wshift, int shift, uint64_t seed) {
  char text[512], what[256];
  snprintf(text, sizeof text, "[format f]\nplugin = fp8_block\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  snprintf(what, sizeof what, "adam [%s] usage %u %lldx%lld grad %s, shifts %d %d", options,
           usage, (long long)M, (long long)K, hq_dtype_name(gdt), wshift, shift);
  for (char *c = what; *c; c++)
    if (*c == '\n') *c = ' ';
  const int64_t n = M * K;
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_tensor g = hq_test_tensor(gdt, M, K, seed, 0.5f);
  hq_tensor w = hq_test_tensor(HQ_F32, M, K, seed + 1, 0.1f);
  hq_tensor mt = hq_test_tensor(HQ_F32, M, K, seed + 2, 0.01f);
  hq_tensor vt = hq_test_tensor(HQ_F32, M, K, seed + 3, 0.01f);
  float *m = mt.data, *v = vt.data;
  for (int64_t i = 0; i < n; i++) v[i] = v[i] * v[i]; /* a second moment is >= 0 */
  void *bg, *bw, *bm, *bv;
  void *dg = adam_to_dev(dev, g.data, n, hq_dtype_size(gdt), shift, &bg);
  float *dw = adam_to_dev(dev, w.data, n, 4, wshift, &bw);
  float *dm = adam_to_dev(dev, m, n, 4, shift, &bm);
  float *dv = adam_to_dev(dev, v, n, 4, shift, &bv);
  hq_tensor gd = hq_tensor_2d(dg, gdt, hq_ctx_device(dev), M, K);
  hq_tensor wd = hq_tensor_2d(dw, HQ_F32, hq_ctx_device(dev), M, K);
  hq_qtensor *qh = NULL, *qg = NULL, *fresh = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &qh));
  HQ_OK_OR_FAIL(hq_quantize(q, dev, &wd, &qg));
  adam_fused_seen = 0;
  for (int64_t t = 1; t <= 2; t++) {
    hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, t, NULL, NULL, 0};
    HQ_OK_OR_FAIL(hq_adam_step(cpu, &a, &g, w.data, m, v, qh));
    HQ_OK_OR_FAIL(hq_adam_step(dev, &a, &gd, dw, dm, dv, qg));
  }
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
  if (adam_fused_seen != 2)
    fail_msg("%s: %d fused write-backs logged, 2 expected", what, adam_fused_seen);
  adam_expect_equal(dev, dw, w.data, n, "master", what);
  adam_expect_equal(dev, dm, m, n, "m", what);
  adam_expect_equal(dev, dv, v, n, "v", what);
  hq_gpu_compare_usage(dev, qh, qg, usage, what);
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &fresh)); /* independent of the step's path */
  hq_gpu_compare_usage(dev, fresh, qg, usage, what);
  hq_qtensor_free(fresh);
  hq_qtensor_free(qh);
  hq_qtensor_free(qg);
  hq_ctx_free(dev, bg), hq_ctx_free(dev, bw), hq_ctx_free(dev, bm), hq_ctx_free(dev, bv);
  free(g.data), free(w.data), free(m), free(v);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static void test_fused_adam_writeback(void **state) {
  (void)state;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.log = adam_log;
  hq_ctx *dev = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &dev));
  const char *one = "block = 1d", *two = "block = 2d";
  /* partial tiles on both sides; 16-byte paths (K % 8 == 0, aligned) */
  adam_case(dev, one, HQ_BOTH, 160, 288, HQ_BF16, 0, 0, 1);
  adam_case(dev, two, HQ_BOTH, 200, 136, HQ_F16, 0, 0, 2);
  adam_case(dev, "block = 2d\npower_2_scales = false", HQ_BOTH, 257, 392, HQ_F32, 0, 0, 3);
  adam_case(dev, "block = 1d\ndtype = e5m2\npower_2_scales = false", HQ_BOTH, 136, 264, HQ_BF16,
            0, 0, 4);
  /* each direction alone */
  adam_case(dev, one, HQ_ROWWISE, 257, 264, HQ_F32, 0, 0, 5);
  adam_case(dev, one, HQ_COLWISE, 136, 384, HQ_BF16, 0, 0, 6);
  adam_case(dev, "block = 2d\ndtype = e5m2", HQ_ROWWISE, 130, 200, HQ_F16, 0, 0, 7);
  adam_case(dev, two, HQ_COLWISE, 300, 136, HQ_BF16, 0, 0, 8);
  /* element-wise paths: K % 8 != 0; arrays one element off 16-byte alignment */
  adam_case(dev, one, HQ_BOTH, 130, 131, HQ_BF16, 0, 0, 9);
  adam_case(dev, two, HQ_BOTH, 131, 259, HQ_F32, 0, 0, 10);
  adam_case(dev, one, HQ_BOTH, 256, 256, HQ_F16, 1, 1, 11);
  adam_case(dev, two, HQ_BOTH, 144, 136, HQ_BF16, 1, 1, 12);
  adam_case(dev, one, HQ_BOTH, 136, 264, HQ_F32, 0, 1, 16); /* master aligned, the rest not */
  adam_case(dev, two, HQ_COLWISE, 264, 136, HQ_BF16, 0, 2, 17);
  /* 20 x 21 = 420 tiles: more than one wave of resident CTAs (132 SMs x 2 on an H200): the
     fused kernel; every case above has fewer, and takes the split path */
  adam_case(dev, one, HQ_BOTH, 2560, 2688, HQ_F32, 0, 0, 13);
  adam_case(dev, two, HQ_BOTH, 2560, 2688, HQ_BF16, 0, 0, 14);
  adam_case(dev, two, HQ_BOTH, 2500, 2690, HQ_F32, 0, 0, 15);
  hq_ctx_destroy(dev);
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_module_direct),
      cmocka_unit_test(test_shapes_and_options),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_misaligned_and_large),
      cmocka_unit_test(test_raw_on_device),
      cmocka_unit_test(test_gemm_on_device),
      cmocka_unit_test(test_fused_adam_writeback),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
