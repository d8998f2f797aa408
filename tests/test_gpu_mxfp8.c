/*
** test_gpu_mxfp8.c -- mxfp8 on a CUDA device is bit-identical to the CPU reference: every buffer
** of every present direction (data and scales, padding included) after quantize on a host
** context and on a device context, copied back and compared with memcmp; for f32 / bf16 / f16
** inputs, shapes from 32x32 to 2048x1024 (96x160, K not a multiple of 128, M not a multiple of
** 128), usage rowwise-only / columnwise-only / both (the fused one-read path), every option
** combination (dtype e4m3|e5m2, swizzle, block_2d), two differently configured instances for the
** two directions, special blocks (all zero, NaN, all-NaN, +-Inf, subnormals, values at the FP8
** overflow boundary and at the top of FP32, wide dynamic range inside one block); dequantize of
** each direction into f32 / bf16 / f16 (NaN bits included), and of every (code, scale code)
** pair written by hand; update in place (with new data and
** back); make_empty on the device (zeroed scales) followed by an update; unaligned source and
** destination pointers (the scalar-load kernels). ABI 2.1: the raw dequantize (HQ_CALL_DEQ_RAW)
** on the device equals the CPU's byte for byte; hq_gemm of mxfp8 operands on the device (native
** on sm_100 / sm_103 against the forced emulated path, emulated elsewhere) equals the F64
** product of the dequantized operands within FP32 accumulation error. ABI 2.4: the FSDP gather
** of swizzled scales on the device (the module's un-swizzle and swizzle kernels), 2 and 4 shards
** of 32 and 128 rows, both directions, 1-D and 2-D blocks: each shard's extracted list equals
** the CPU's byte for byte, and the gathered tensor (its device buffers filled with garbage
** first) equals the CPU's whole-tensor quantize byte for byte. raw_copy = bf16: the raw-values
** buffers (every kernel mode, every input dtype, update, unaligned inputs) equal the CPU's.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "hq_test.h"
#include "hq_gpu_test.h"
#include "mxfp8_rules.h"

static hq_ctx *cpu, *gpu;
/* HQ_TEST_QUICK set (e.g. under compute-sanitizer): small shapes, fewer dtype combinations */
static int quick;

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

static hq_tensor to_gpu(const hq_tensor *h) { return hq_gpu_tensor_at(gpu, h, 0); }

/* Every buffer of `dir` on the device equals the host reference's, byte for byte (only the
   scale buffers when scales_only). */
static void compare_dir(const hq_qtensor *h, const hq_qtensor *g, uint32_t dir, int scales_only,
                        const char *what) {
  const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
  assert_non_null(sh);
  assert_non_null(sg);
  assert_int_equal(sh->nbuf, sg->nbuf);
  for (uint32_t i = 0; i < sh->nbuf; i++) {
    const hq_buffer *bh = hq_storage_cbuf(sh, i), *bg = hq_storage_cbuf(sg, i);
    if (scales_only && bh->role != HQ_ROLE_SCALE) continue;
    size_t n = bh->bytes;
    assert_int_equal(bg->bytes, n);
    if (n == 0) continue;
    uint8_t *tmp = malloc(n);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, tmp, HQ_DEVICE_HOST, bg->ptr, 0, n));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    if (memcmp(tmp, bh->ptr, n) != 0) {
      size_t k = 0;
      while (((uint8_t *)bh->ptr)[k] == tmp[k]) k++;
      fail_msg("%s: dir %u buffer '%s' differs at byte %zu of %zu: cpu %02x gpu %02x", what, dir,
               bh->name, k, n, ((uint8_t *)bh->ptr)[k], tmp[k]);
    }
    free(tmp);
  }
}

static void compare(const hq_qtensor *h, const hq_qtensor *g, uint32_t usage, const char *what) {
  if (usage & HQ_ROWWISE) compare_dir(h, g, HQ_ROWWISE, 0, what);
  if (usage & HQ_COLWISE) compare_dir(h, g, HQ_COLWISE, 0, what);
}

/* Dequantize direction d of h (host) and g (device) into dtype o, the device one at `shift`
   bytes past its allocation; the bytes must agree. */
static void compare_dequantize(const hq_qtensor *h, const hq_qtensor *g, uint32_t d, hq_dtype o,
                               size_t shift, const char *what) {
  const int64_t M = hq_qtensor_rows(h), K = hq_qtensor_cols(h);
  hq_tensor dh = hq_test_empty(o, M, K);
  hq_tensor dg = dh;
  size_t bytes = (size_t)(M * K) * hq_dtype_size(o);
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes + shift + 16, &p));
  dg.data = (char *)p + shift;
  dg.device = 0;
  HQ_OK_OR_FAIL(hq_dequantize(h, cpu, d, &dh));
  HQ_OK_OR_FAIL(hq_dequantize(g, gpu, d, &dg));
  uint8_t *back = malloc(bytes ? bytes : 1);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dg.data, 0, bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  if (memcmp(back, dh.data, bytes) != 0) {
    size_t k = 0;
    while (((uint8_t *)dh.data)[k] == back[k]) k++;
    fail_msg("%s: dequantize dir %u into %s differs at byte %zu", what, d, hq_dtype_name(o), k);
  }
  free(back);
  free(dh.data);
  hq_ctx_free(gpu, p);
}

/* Special values, one kind per 32x32 tile (tile t gets kind t % 9; kind 0 keeps the random
   values), so that both directions' blocks meet them. */
static void fill_special(hq_tensor *x) {
  const hq_dtype dt = x->dtype;
  const int64_t M = x->rows, K = x->cols;
  const float tiny = dt == HQ_F16 ? 3e-7f : 1e-39f; /* subnormal in the input dtype */
  const float big = dt == HQ_F16 ? 60000.0f : 1e30f;
  const float small = dt == HQ_F16 ? 1e-4f : 1e-30f;
  const float bound[] = {448.0f, 449.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 896.0f, 0.875f};
  int64_t t = 0;
  for (int64_t i0 = 0; i0 < M; i0 += 32)
    for (int64_t j0 = 0; j0 < K; j0 += 32, t++) {
      const int kind = (int)(t % 9);
      for (int r = 0; r < 32; r++)
        for (int c = 0; c < 32; c++) {
          const int64_t idx = (i0 + r) * K + j0 + c;
          const float v = hq_load_hp(x->data, idx, dt);
          float w = v;
          switch (kind) {
          case 1: w = (r + c) % 2 ? 0.0f : -0.0f; break;                    /* all zero */
          case 2:                                                            /* NaN */
            if (r == 3) w = NAN;                                             /* all-NaN row */
            else if (c == 5) w = -NAN;                                       /* all-NaN column */
            else if ((r * 7 + c) % 11 == 0) w = NAN;
            break;
          case 3:                                                            /* +-Inf */
            if (r == c) w = r % 2 ? -INFINITY : INFINITY;
            break;
          case 4: w = v * tiny; break;                                       /* subnormals */
          case 5: w = v * 0.1f; if (c == r) w = (r % 2 ? -1 : 1) * bound[(r / 2) % 8]; break;
          case 6: w = (r + c) % 3 ? v * small : v * big; break;             /* wide range */
          case 7: w = dt == HQ_F32 ? v * 1e37f : v * (dt == HQ_F16 ? 1e4f : 1e37f); break;
          case 8: if (c == 0) w = dt == HQ_F16 ? 65504.0f : 3.3895314e38f; break; /* top */
          default: break;
          }
          hq_store_hp(x->data, idx, dt, w);
        }
    }
}

/* The recipe `text` (formats and a [role *:*:*] section) on an [M, K] tensor of dtype dt:
   quantize (each usage), dequantize, update, make_empty + update, unaligned pointers. */
static void check_text(const char *text, const char *what, hq_dtype dt, int64_t M, int64_t K,
                       uint64_t seed, int special, int full) {
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor x = hq_test_tensor(dt, M, K, seed, 4.0f);
  if (special) fill_special(&x);
  hq_tensor xg = to_gpu(&x);
  hq_tensor y = hq_test_tensor(dt, M, K, seed + 1000, 40.0f);
  hq_tensor yg = to_gpu(&y);
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  char w[512];
  for (int u = 0; u < 3; u++) {
    const uint32_t us = usages[u];
    snprintf(w, sizeof w, "%s, usage %u", what, us);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, us));
    hq_qtensor *h = NULL, *g = NULL, *hy = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    compare(h, g, us, w);
    for (uint32_t d = 1; d <= 2; d++)
      if (us & d)
        for (int o = 0; o < 3; o++) compare_dequantize(h, g, d, outs[o], 0, w);
    /* update in place with new data, then back */
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &y, &hy));
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &yg));
    snprintf(w, sizeof w, "%s, usage %u, update(y)", what, us);
    compare(hy, g, us, w);
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &xg));
    snprintf(w, sizeof w, "%s, usage %u, update(x)", what, us);
    compare(h, g, us, w);
    hq_qtensor_free(g);
    if (full) {
      /* make_empty on the device: scales zero like the host's; then an update fills it */
      hq_qtensor *eh = NULL, *eg = NULL;
      HQ_OK_OR_FAIL(hq_make_empty(q, cpu, M, K, dt, &eh));
      HQ_OK_OR_FAIL(hq_make_empty(q, gpu, M, K, dt, &eg));
      snprintf(w, sizeof w, "%s, usage %u, make_empty", what, us);
      if (us & HQ_ROWWISE) compare_dir(eh, eg, HQ_ROWWISE, 1, w);
      if (us & HQ_COLWISE) compare_dir(eh, eg, HQ_COLWISE, 1, w);
      HQ_OK_OR_FAIL(hq_qtensor_update(eg, gpu, &xg));
      snprintf(w, sizeof w, "%s, usage %u, make_empty + update", what, us);
      compare(h, eg, us, w);
      hq_qtensor_free(eh);
      hq_qtensor_free(eg);
      /* unaligned source (scalar loads, byte stores) and unaligned dequantize destinations */
      hq_tensor xu = hq_gpu_tensor_at(gpu, &x, 4);
      hq_qtensor *gu = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xu, &gu));
      snprintf(w, sizeof w, "%s, usage %u, unaligned source", what, us);
      compare(h, gu, us, w);
      for (uint32_t d = 1; d <= 2; d++)
        if (us & d)
          for (int o = 0; o < 3; o++) compare_dequantize(h, gu, d, outs[o], 4, w);
      hq_qtensor_free(gu);
      hq_ctx_free(gpu, (char *)xu.data - 4);
    }
    hq_qtensor_free(hy);
    hq_qtensor_free(h);
  }
  hq_ctx_free(gpu, yg.data);
  free(y.data);
  hq_ctx_free(gpu, xg.data);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* One instance f for both directions (the fused call when both are made). */
static void check_case(const char *options, hq_dtype dt, int64_t M, int64_t K, uint64_t seed,
                       int special, int full) {
  char text[512], what[256];
  snprintf(text, sizeof text, "[format f]\nplugin = mxfp8\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  snprintf(what, sizeof what, "[%s] %s %lldx%lld%s", options, hq_dtype_name(dt), (long long)M,
           (long long)K, special ? " special" : "");
  check_text(text, what, dt, M, K, seed, special, full);
}

static const char *const option_sets[] = {
    "",
    "dtype = e5m2",
    "swizzle = true",
    "block_2d = true",
    "swizzle = true\nblock_2d = true",
    "dtype = e5m2\nswizzle = true\nblock_2d = true",
    "dtype = e5m2\nblock_2d = true",
    "dtype = e5m2\nswizzle = true",
    /* the raw values kept beside the codes (every kernel mode: 1-D, swizzled both directions,
       2-D with and without the rowwise copy) */
    "raw_copy = bf16",
    "raw_copy = bf16\nswizzle = true",
    "raw_copy = bf16\nblock_2d = true",
    "raw_copy = bf16\ndtype = e5m2\nswizzle = true\nblock_2d = true",
};
#define NOPT (sizeof option_sets / sizeof option_sets[0])
static const hq_dtype dtypes[3] = {HQ_F32, HQ_BF16, HQ_F16};

/* Random inputs of many shapes, the default options, every input dtype. */
static void test_shapes(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{32, 32}, {96, 160}, {64, 64}, {160, 96}, {32, 4096},
                               {256, 544}, {4096, 32}, {128, 384}, {2048, 1024}};
  const size_t nshapes = quick ? 4 : sizeof shapes / sizeof shapes[0];
  for (int t = 0; t < 3; t++)
    for (size_t s = 0; s < nshapes; s++)
      check_case("", dtypes[t], shapes[s][0], shapes[s][1], (uint64_t)(t * 10 + s), 0,
                 s < 2);
}

/* Every option combination, every input dtype, random and special inputs. */
static void test_options(void **state) {
  (void)state;
  for (size_t o = 0; o < NOPT; o++)
    for (int t = 0; t < 3; t++) {
      if (quick && t != (int)(o % 3)) continue;
      check_case(option_sets[o], dtypes[t], 96, 160, 100 + o * 3 + (uint64_t)t, 0, t == 1);
      check_case(option_sets[o], dtypes[t], 288, 288, 200 + o * 3 + (uint64_t)t, 1, t == 0);
    }
  if (quick) return;
  check_case("", HQ_BF16, 512, 640, 7, 1, 0);
  check_case("block_2d = true\nswizzle = true", HQ_BF16, 512, 640, 8, 1, 0);
}

/* Two differently configured instances for the two directions (one call each, different scale
   layouts, block shapes and element dtypes). */
static void test_mixed_instances(void **state) {
  (void)state;
  const char *texts[] = {
      "[format f]\nplugin = mxfp8\nswizzle = true\n[format g]\nplugin = mxfp8\n"
      "[role *:*:*]\nrowwise = f\ncolumnwise = g\n",
      "[format f]\nplugin = mxfp8\ndtype = e5m2\n[format g]\nplugin = mxfp8\nblock_2d = true\n"
      "swizzle = true\n[role *:*:*]\nrowwise = f\ncolumnwise = g\n",
  };
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < 3; t++)
      check_text(texts[k], k ? "mixed e5m2 / 2-D swizzled" : "mixed swizzled / compact",
                 dtypes[t], 160, 96, 300 + (uint64_t)(k * 3 + t), t == 2, t == 0);
}

/* Dequantize of every (code, scale code) pair, both element kinds, both scale layouts, both
   directions: a 256x256 tensor whose bytes are written by hand -- rowwise, row i holds every
   code (rotated by i) under scale code i; columnwise, column j holds every code under scale code
   j -- so every code meets every scale, NaN/Inf codes and the NaN scale 0xFF among them, inside
   runs of ordinary codes and scales; the device's f32 / bf16 / f16 bytes equal the CPU's. */
static void test_dequantize_every_pair(void **state) {
  (void)state;
  const int64_t M = 256, K = 256;
  const char *opts[] = {"", "dtype = e5m2", "swizzle = true", "dtype = e5m2\nswizzle = true"};
  for (int o = 0; o < 4; o++) {
    char text[256];
    snprintf(text, sizeof text, "[format f]\nplugin = mxfp8\n%s\n[role *:*:*]\nrowwise = f\n"
             "columnwise = f\n", opts[o]);
    const int swz = o >= 2;
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 77 + (uint64_t)o, 1.0f);
    hq_tensor xg = to_gpu(&x);
    hq_qtensor *h = NULL, *g = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    for (uint32_t d = 1; d <= 2; d++) {
      const hq_storage *sh = hq_qtensor_storage(h, d), *sg = hq_qtensor_storage(g, d);
      for (uint32_t b = 0; b < sh->nbuf; b++) {
        const hq_buffer *bh = hq_storage_cbuf(sh, b);
        uint8_t *p = bh->ptr;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < K; j++) {
            if (bh->role == HQ_ROLE_DATA)
              p[i * K + j] = (uint8_t)(d == HQ_ROWWISE ? j + 7 * i : i + 3 * j);
            else if (bh->role == HQ_ROLE_SCALE && d == HQ_ROWWISE && j % 32 == 0)
              p[hq_mxfp8_row_scale_idx(i, j / 32, K, swz)] = (uint8_t)i;
            else if (bh->role == HQ_ROLE_SCALE && d == HQ_COLWISE && i % 32 == 0)
              p[hq_mxfp8_col_scale_idx(i / 32, j, M, K, swz)] = (uint8_t)j;
          }
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, hq_storage_cbuf(sg, b)->ptr, 0, p, HQ_DEVICE_HOST,
                                    bh->bytes));
      }
    }
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    char w[128];
    snprintf(w, sizeof w, "every (code, scale) pair [%s]", opts[o]);
    const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
    for (uint32_t d = 1; d <= 2; d++)
      for (int k = 0; k < 3; k++) compare_dequantize(h, g, d, outs[k], 0, w);
    hq_qtensor_free(h);
    hq_qtensor_free(g);
    hq_ctx_free(gpu, xg.data);
    free(x.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

// --- ABI 2.1: raw dequantize and hq_gemm on the device -----------------------------------------


/* The raw dequantize on the device equals the CPU's, byte for byte, for every option set, both
   directions and every destination dtype (random data with the special tiles). */
static void test_raw_dequantize(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("mxfp8")(&host);
  assert_non_null(ops);
  for (size_t o = 0; o < NOPT; o++) {
    char text[512];
    snprintf(text, sizeof text, "[format f]\nplugin = mxfp8\n%s\n[role *:*:*]\nrowwise = f\n"
             "columnwise = f\n", option_sets[o]);
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    hq_tensor x = hq_test_tensor(dtypes[o % 3], 96, 160, 1000 + o, 4.0f);
    if (o % 2) fill_special(&x);
    hq_tensor xg = to_gpu(&x);
    hq_qtensor *h = NULL, *g = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    for (uint32_t d = 1; d <= 2; d++)
      hq_gpu_compare_raw(gpu, ops, &host, h, g, d, option_sets[o]);
    hq_qtensor_free(h);
    hq_qtensor_free(g);
    hq_ctx_free(gpu, xg.data);
    free(x.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

/* hq_gemm of two mxfp8 operands on the device (swizzled scales: GEMM-ready), fprop TN, dgrad
   NN, wgrad NT, e4m3 x e4m3 and e4m3 x e5m2: on sm_100 / sm_103 the native path, checked
   against the emulated one and the F64 product; elsewhere the emulated path (the gemm op's
   reason names the architecture), checked against the F64 product. */
static int mxfp8_native_on(int arch) { return arch == 100 || arch == 103; }
static void test_gemm_device(void **state) {
  (void)state;
  static const hq_gpu_gemm_case cases[] = {{"mxfp8 fprop TN e4m3 x e4m3", 0, 1, 1, 0},
                                           {"mxfp8 dgrad NN e4m3 x e5m2", 0, 0, 2, 0},
                                           {"mxfp8 wgrad NT e4m3 x e5m2", 1, 0, 2, 1}};
  hq_gpu_check_role_gemms(cpu, gpu,
                          "[format a]\nplugin = mxfp8\nswizzle = true\nblock_2d = true\n"
                          "[format b]\nplugin = mxfp8\nswizzle = true\n"
                          "[format c]\nplugin = mxfp8\nswizzle = true\ndtype = e5m2\n"
                          "[role linear:weight:*]\nrowwise = a\ncolumnwise = a\n"
                          "[role linear:input:*]\nrowwise = b\ncolumnwise = b\n"
                          "[role linear:grad_output:*]\nrowwise = c\ncolumnwise = c\n",
                          2000, NULL, cases, sizeof cases / sizeof cases[0], mxfp8_native_on);
}

/* The FSDP protocol with swizzled scales on the device against the CPU (ABI 2.4). */
static void fsdp_swizzled_case(const char *opts, int world, int64_t ms) {
  const int64_t M = world * ms, K = 160;
  char text[256], what[160];
  snprintf(text, sizeof text, "[format m]\nplugin = mxfp8\nswizzle = true\n%s[role *:*:*]\n"
           "rowwise = m\ncolumnwise = m\n", opts);
  snprintf(what, sizeof what, "fsdp swizzle %s%d shards of %lld", opts, world, (long long)ms);
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 31 + (uint64_t)world, 1.0f);
  hq_tensor xg = to_gpu(&x);
  hq_qtensor *shard[4], *hs = NULL;
  hq_fsdp_buffer ext[4][8], hext[8];
  size_t n = 0, hn = 0;
  for (int s = 0; s < world; s++) {
    hq_tensor xs = hq_tensor_2d((char *)xg.data + (size_t)(s * ms * K) * 2, HQ_BF16, 0, ms, K);
    hq_tensor xh = hq_tensor_2d((char *)x.data + (size_t)(s * ms * K) * 2, HQ_BF16,
                                HQ_DEVICE_HOST, ms, K);
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xs, &shard[s]));
    HQ_OK_OR_FAIL(hq_fsdp_extract(shard[s], gpu, ext[s], 8, sizeof(hq_fsdp_buffer), &n));
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &xh, &hs));
    HQ_OK_OR_FAIL(hq_fsdp_extract(hs, cpu, hext, 8, sizeof(hq_fsdp_buffer), &hn));
    assert_int_equal(n, 4);
    assert_int_equal(hn, 4);
    for (size_t e = 0; e < n; e++) { /* the device's list is the CPU's, byte for byte */
      assert_string_equal(ext[s][e].name, hext[e].name);
      assert_int_equal(ext[s][e].rows, hext[e].rows);
      assert_int_equal(ext[s][e].row_bytes, hext[e].row_bytes);
      const size_t per = (size_t)(hext[e].rows * hext[e].row_bytes);
      uint8_t *back = malloc(per + 1);
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, ext[s][e].ptr, 0, per));
      HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
      if (memcmp(back, hext[e].ptr, per))
        fail_msg("%s: shard %d entry '%s' differs from the CPU's", what, s, hext[e].name);
      free(back);
    }
    hq_qtensor_free(hs);
    hs = NULL;
  }
  hq_fsdp_buffer g[8];
  void *mem[8];
  for (size_t e = 0; e < n; e++) { /* the all-gather: concatenated in rank order on the device */
    const size_t per = (size_t)(ext[0][e].rows * ext[0][e].row_bytes);
    HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, per * (size_t)world, &mem[e]));
    for (int s = 0; s < world; s++)
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, (char *)mem[e] + per * (size_t)s, 0, ext[s][e].ptr, 0,
                                  per));
    g[e] = ext[0][e];
    g[e].rows *= world;
    g[e].ptr = mem[e];
  }
  hq_qtensor *full = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, gpu, M, K, HQ_BF16, &full));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) { /* garbage: assign writes all */
    const hq_storage *st = hq_qtensor_storage(full, dir);
    for (uint32_t i = 0; i < st->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(st, i);
      uint8_t *junk = malloc(b->bytes);
      memset(junk, 0xA5, b->bytes);
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, b->ptr, 0, junk, HQ_DEVICE_HOST, b->bytes));
      HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
      free(junk);
    }
  }
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, gpu, shard[world - 1], g, n, sizeof(hq_fsdp_buffer)));
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &ref));
  compare(ref, full, HQ_BOTH, what);
  for (size_t e = 0; e < n; e++) hq_ctx_free(gpu, mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  hq_ctx_free(gpu, xg.data);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static void test_fsdp_swizzled(void **state) {
  (void)state;
  static const char *const opts[] = {"", "block_2d = true\n"};
  for (size_t o = 0; o < 2; o++)
    for (int world = 2; world <= 4; world += 2) {
      fsdp_swizzled_case(opts[o], world, 32); /* a 128-row swizzle tile spans shards */
      fsdp_swizzled_case(opts[o], world, 128);
    }
}

/* The module on the device: no scratch (the kernels need none). */
static void test_module_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("mxfp8")(&host);
  assert_non_null(ops);
  assert_true((ops->caps & HQ_CAP_CUDA) != 0);
  hq_optval v[8]; /* at least one per option of the table (configure reads them all) */
  memset(v, 0, sizeof v);
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  HQ_OK_OR_FAIL(ops->configure(cfg, v, &host));
  assert_int_equal(ops->scratch_size(cfg, 4096, 4096, HQ_BOTH, 0), 0);
  free(cfg);
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  quick = getenv("HQ_TEST_QUICK") != NULL;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_module_direct),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_mixed_instances),
      cmocka_unit_test(test_dequantize_every_pair),
      cmocka_unit_test(test_raw_dequantize),
      cmocka_unit_test(test_gemm_device),
      cmocka_unit_test(test_fsdp_swizzled),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
