/*
** test_gpu_nvfp4.c -- nvfp4 on a CUDA device is bit-identical to the CPU reference: every buffer
** of every direction (data, scale_inv with its zero padding, amax) for quantize with usage
** rowwise + columnwise, rowwise only and columnwise only; f32 / bf16 / f16 inputs; shapes from
** 16x16 to 2048x8192 (multiples of 16, tile edges in both dimensions, more tiles than the GPU
** holds CTAs at once); every option and their
** combinations (swizzle, block_2d, rht with the default and another sign mask, stochastic
** rounding with an instance seed and with the context's seed, rht + SR + swizzle; with rht the
** small tensors' one-cluster kernel that makes its own global amaxes, at 1 to 8 tiles, and the
** amax pass before the kernel from 9 tiles on); special
** inputs (NaN, Inf, subnormals, -0, all-zero blocks and an all-zero tensor, wide dynamic range
** inside one block, values at the E2M1 and E4M3 saturation boundaries); a source pointer off
** 16-byte alignment; dequantize of each
** direction into f32 / bf16 / f16 (through the inverse RHT); update; the device amax
** (hq_quantizer_amax and the module's amax op for every set of directions, with and without
** rht); quantize and update with a caller-supplied device amax (the own one, larger, smaller,
** different per direction), of both directions and of the rowwise copy alone (which a tensor of
** fewer 32 x 256 tiles than the device has SMs makes by the element-wise kernel -- test_options'
** shapes and most of test_shapes' -- and a larger one by the tile kernel: 1024 x 2048 and
** test_many_tiles'); make_empty; a shape with a dimension of 2^31 or more refused with a
** clear error before anything runs. Dequantized values compare byte for byte except NaN
** against NaN (an Inf global amax gives 0 * Inf, whose NaN sign differs between host and
** device). The two contexts share the seed and every pair of calls
** starts from the same RNG offset, so stochastic rounding draws the same stream. ABI 2.1: the
** raw dequantize (HQ_CALL_DEQ_RAW) and the tensor factor on the device equal the CPU's byte for
** byte; hq_gemm of nvfp4 operands on the device (native on sm_100+ against the forced emulated
** path, emulated elsewhere) equals the F64 product of the dequantized operands within FP32
** accumulation error. The options scale_dtype = ue5m3 and global_scale = row / none join
** the option sets in every combination the configuration takes (each scale type with each
** global scale, with rht, stochastic rounding, block_2d and swizzle where allowed), every
** direction, on the tile-edge shapes and over many tiles and column groups, and through the
** special inputs; their GEMMs take the emulated path (BF16, row-scaled operands with their row
** factors split off and multiplied into the F32 product) and equal the F64 product too, and a
** row-scaled storage's split raw values and row factors equal the CPU's byte for byte.
** global_scale = row's one-read rowwise kernel (its half-size and full-size slabs) and its
** two-pass fallback: odd K / 16, slabs of one row and of many, rows at and just over each slab
** size and the on-chip budget in each dtype, rows of very
** different magnitudes with all-zero rows, NaN and Inf (test_row_scaled).
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "hq_gpu_test.h"

static hq_ctx *cpu, *gpu;

static int setup(void **state) {
  (void)state;
  return hq_gpu_contexts(&cpu, &gpu, 0x5eed1234abcdull);
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
static float *amax_to_gpu(const float a[2]) { return hq_gpu_amax_to_dev(gpu, a); }
static void amax_to_host(const float *dev, float out[2]) { hq_gpu_amax_to_host(gpu, dev, out); }

/* Both contexts at RNG offset 11 (the next operation on each draws the same stream). */
static void same_rng(void) {
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(cpu, 11));
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 11));
}

static hq_tensor to_gpu(const hq_tensor *h) { return hq_gpu_tensor_at(gpu, h, 0); }

/* One context at RNG offset 11 (hq_gpu_check_amax_and_update's rng hook). */
static void rng11(hq_ctx *ctx) { HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 11)); }

/* Dequantize direction d of h (CPU) and g (GPU) into each dtype: the same bytes. */
static void check_dequantize(const hq_qtensor *h, const hq_qtensor *g, uint32_t d, int64_t M,
                             int64_t K, int all_dtypes, const char *what) {
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int o = 0; o < (all_dtypes ? 3 : 1); o++) {
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
      /* equal up to NaN bits: an Inf global amax makes 0 * Inf = NaN, whose sign the host's
         and the device's multiply choose differently (not a rule of the format) */
      for (int64_t k = 0; k < M * K; k++) {
        float a = hq_load_hp(back, k, outs[o]), b = hq_load_hp(dh.data, k, outs[o]);
        if (isnan(a) && isnan(b)) continue;
        if (memcmp((char *)back + (size_t)k * hq_dtype_size(outs[o]),
                   (char *)dh.data + (size_t)k * hq_dtype_size(outs[o]), hq_dtype_size(outs[o])))
          fail_msg("%s: dequantize dir %u into %s differs at element %lld: cpu %a gpu %a", what,
                   d, hq_dtype_name(outs[o]), (long long)k, b, a);
      }
    }
    free(back);
    free(dh.data);
    hq_ctx_free(gpu, dg.data);
  }
}

/* Special values written into x (dtype dt, [M, K], M, K multiples of 16):
   1: NaN, -0, subnormals, an all-zero 16-block, a block spanning 1e-30..3e4, values at the
      E2M1 rounding boundaries of the block amax (5/6, 2.5/6, ... of it), a large block next to
      small ones (E4M3 scale range);
   2: as 1 plus +Inf and -Inf (global amax Inf: S_enc = 1);
   3: all zeros;
   4: the edges of the device's columnwise RHT shortcut (the kernel leaves the transform's 0.25
      out and folds it into its multipliers, exact where v * 0.25 is a normal FP32 value, with
      blocks whose unscaled amax is not 0 and not in [2^-100, 2^120) redone by the rule): in
      the first 16 rows, columns whose transform has outputs of FP32-subnormal size beside
      normal ones (two equal values cancel in half the outputs, leaving a third, tiny one),
      unscaled amaxes just above and below 2^-100 and at 2^120, huge values below it, a block
      of 2^-126 values;
   5: rows of very different magnitudes (2^-30 .. 2^30 times the random values; f16 2^-12 ..
      2^12), every 5th row all zero (A_i = 0: S_enc = 1), a NaN in row 1 and -Inf in row 4
      (global_scale = row). */
static void fill_special(hq_tensor *x, int kind) {
  const hq_dtype dt = x->dtype;
  const int64_t M = x->rows, K = x->cols, n = M * K;
  if (kind == 5) { /* rows of 61 magnitudes 2^-30 .. 2^30 (f16: 25, 2^-12 .. 2^12), every 5th
                      row all zero */
    const int span = dt == HQ_F16 ? 25 : 61;
    for (int64_t i = 0; i < M; i++)
      for (int64_t k = 0; k < K; k++) {
        const float v = hq_load_hp(x->data, i * K + k, dt);
        hq_store_hp(x->data, i * K + k, dt,
                    i % 5 == 2 ? 0.0f : ldexpf(v, (int)((i * 7) % span) - span / 2));
      }
    if (M > 1) hq_store_hp(x->data, K + 3, dt, NAN);                 /* NaN in row 1 */
    if (M > 4) hq_store_hp(x->data, 4 * K + K - 1, dt, -INFINITY); /* Inf in row 4 */
    return;
  }
  if (kind == 3) {
    memset(x->data, 0, (size_t)n * hq_dtype_size(dt));
    return;
  }
  if (kind == 4) {
    /* column c, rows 0..15: {x0 = x1 = a, x15 = t, others 0} (a and t per column), or all b */
    static const float a_[8] = {0x1p-90f, 0x1p-100f, 0x1p-102f, 0x1p119f,
                                0x1p118f, 0.0f,      3.0f,      0x1p-99f};
    static const float t_[8] = {0x1p-130f, -0x1p-128f, 0x1p-131f, 1.0f,
                                -0x1p90f,  0.0f,       0x1p-126f, -0x1p-127f};
    for (int c = 0; c < 8 && c < K; c++)
      for (int i = 0; i < 16 && i < M; i++) {
        const float v = c == 5 ? 0x1p-126f : i < 2 ? a_[c] : i == 15 ? t_[c] : 0.0f;
        hq_store_hp(x->data, i * K + c, dt, v);
      }
    return;
  }
  hq_store_hp(x->data, 0, dt, NAN);
  hq_store_hp(x->data, 1, dt, -0.0f);
  hq_store_hp(x->data, 2, dt, 1e-40f);
  hq_store_hp(x->data, 3, dt, -3e-39f);
  hq_store_hp(x->data, 4, dt, 6e-8f);
  for (int e = 0; e < 16 && 16 + e < K; e++) hq_store_hp(x->data, 16 + e, dt, 0.0f);
  if (M >= 2) {
    static const float wide[16] = {1e-30f, -1e-20f, 1e-10f, 1e-5f, 1e-3f, 0.1f, 1.0f, 30000.0f,
                                   -2.0f, 7.0f, -1e-7f, 5e-3f, 0.5f, -100.0f, 1e3f, 2e-2f};
    for (int e = 0; e < 16; e++) hq_store_hp(x->data, K + e, dt, wide[e]);
  }
  if (M >= 3) {
    /* fractions of the block amax 6: the E2M1 decision boundaries and their neighbours */
    static const float f[16] = {6.0f, 5.0f, -5.0f, 3.5f, 2.5f, -1.75f, 1.25f, 0.75f,
                                0.25f, 4.9999f, 5.0001f, 0.2499f, 0.2501f, -2.5f, 1.7499f, 3.0f};
    for (int e = 0; e < 16; e++) hq_store_hp(x->data, 2 * K + e, dt, f[e] * 1.5f);
  }
  if (M >= 4)
    for (int e = 0; e < 16; e++) hq_store_hp(x->data, 3 * K + e, dt, 2000.0f + (float)e);
  if (kind == 2) {
    hq_store_hp(x->data, n / 2, dt, INFINITY);
    hq_store_hp(x->data, n - 1, dt, -INFINITY);
  }
}

/* quantize on both contexts for usages both / rowwise / columnwise, compare every buffer;
   dequantize every present direction; update in place; with `full`, the amax and update checks
   (usage both). */
static void check_case(const char *options, hq_dtype dt, int64_t M, int64_t K, uint64_t seed,
                       int special, int full) {
  char text[512], what[320];
  snprintf(text, sizeof text, "[format f]\nplugin = nvfp4\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  snprintf(what, sizeof what, "[%s] %s %lldx%lld special %d", options, hq_dtype_name(dt),
           (long long)M, (long long)K, special);
  for (char *c = what; *c; c++)
    if (*c == '\n') *c = ',';
  hq_recipe *r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor x = hq_test_tensor(dt, M, K, seed, 4.0f);
  if (special) fill_special(&x, special);
  hq_tensor xg = to_gpu(&x);
  hq_tensor y = hq_test_tensor(dt, M, K, seed + 1000, 40.0f);
  hq_tensor yg = to_gpu(&y);
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (int u = 0; u < 3; u++) {
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usages[u]));
    hq_qtensor *h = NULL, *g = NULL;
    same_rng();
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    compare_usage(h, g, usages[u], what);
    for (uint32_t d = 1; d <= 2; d++)
      if (usages[u] & d) check_dequantize(h, g, d, M, K, u == 0, what);
    /* the device update path refreshes in place identically */
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 11));
    HQ_OK_OR_FAIL(hq_qtensor_update(g, gpu, &xg));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    compare_usage(h, g, usages[u], what);
    /* both directions, and the rowwise copy alone (a small one: the element-wise kernel) */
    if (full && u <= 1)
      hq_gpu_check_amax_and_update(cpu, gpu, q, usages[u], &x, &xg, h, &y, &yg, rng11, what);
    if (u == 0) { /* a source one element off 16-byte alignment: the element-by-element copy */
      hq_tensor xu = hq_gpu_tensor_at(gpu, &x, hq_dtype_size(dt));
      hq_qtensor *gu = NULL;
      char w[400];
      same_rng();
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xu, &gu));
      HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
      snprintf(w, sizeof w, "%s, unaligned source", what);
      compare_usage(h, gu, usages[u], w);
      hq_qtensor_free(gu);
      hq_ctx_free(gpu, (char *)xu.data - hq_dtype_size(dt));
    }
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

static const char *const option_sets[] = {
    "",
    "swizzle = true",
    "block_2d = true",
    "block_2d = true\nswizzle = true",
    "rht = true",
    "rht = true\nrht_sign_mask = 0x1234\nswizzle = true",
    "stochastic_rounding = true\nseed = 77",
    "stochastic_rounding = true",
    "rht = true\nstochastic_rounding = true\nswizzle = true",
    /* the option kernels (scale_dtype = ue5m3, global_scale = row / none) */
    "global_scale = row",
    "global_scale = row\nstochastic_rounding = true\nswizzle = true",
    "scale_dtype = ue5m3",
    "scale_dtype = ue5m3\nrht = true\nrht_sign_mask = 0x1234\nswizzle = true",
    "scale_dtype = ue5m3\nglobal_scale = none\nblock_2d = true",
    "scale_dtype = ue5m3\nglobal_scale = none\nstochastic_rounding = true",
    "scale_dtype = ue5m3\nglobal_scale = row",
    /* every scale type x global scale with each of the other options it takes */
    "scale_dtype = ue5m3\nglobal_scale = row\nstochastic_rounding = true\nswizzle = true",
    "scale_dtype = ue5m3\nglobal_scale = none",
    "scale_dtype = ue5m3\nglobal_scale = none\nrht = true\nswizzle = true",
    "scale_dtype = ue5m3\nglobal_scale = none\nrht = true\nstochastic_rounding = true",
    "scale_dtype = ue5m3\nstochastic_rounding = true\nseed = 5",
    "scale_dtype = ue5m3\nblock_2d = true\nswizzle = true",
    "scale_dtype = ue5m3\nrht = true\nstochastic_rounding = true",
    "global_scale = row\nswizzle = true",
};
#define N_OPTION_SETS (sizeof option_sets / sizeof option_sets[0])

/* Every option set x every input dtype, on a tile-edge shape and a multi-tile one. */
static void test_options(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (size_t o = 0; o < N_OPTION_SETS; o++)
    for (int t = 0; t < 3; t++) {
      check_case(option_sets[o], dts[t], 48, 80, 100 + o * 3 + (size_t)t, 0, 1);
      check_case(option_sets[o], dts[t], 96, 160, 200 + o * 3 + (size_t)t, 0, t == 1);
    }
}

/* Many shapes (multiples of 16; tile edges at 64 rows and 128 columns), plain and with all the
   options that change the layout or the columnwise values. */
static void test_shapes(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{16, 16},  {32, 48},   {64, 128}, {80, 272}, {144, 96},
                               {16, 1040}, {1040, 16}, {128, 64}, {208, 400}, {256, 512}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    check_case("", dts[s % 3], shapes[s][0], shapes[s][1], 300 + s, 0, s % 3 == 0);
    check_case("rht = true\nstochastic_rounding = true\nswizzle = true", dts[(s + 1) % 3],
               shapes[s][0], shapes[s][1], 400 + s, 0, 0);
    check_case("block_2d = true\nswizzle = true", dts[(s + 2) % 3], shapes[s][0], shapes[s][1],
               500 + s, 0, 0);
  }
  /* the options' kernels on the same shapes: the row amax pass's strips of 256 columns and
     bands of 256 rows, partial ones included */
  static const char *const opt[3] = {"global_scale = row\nscale_dtype = ue5m3",
                                     "scale_dtype = ue5m3\nglobal_scale = none\nswizzle = true",
                                     "global_scale = row\nstochastic_rounding = true"};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int o = 0; o < 3; o++)
      check_case(opt[o], dts[(s + (size_t)o) % 3], shapes[s][0], shapes[s][1], 700 + 3 * s + o,
                 0, 0);
  check_case("", HQ_BF16, 1024, 2048, 7, 0, 1);
  check_case("rht = true", HQ_BF16, 1024, 2048, 8, 0, 0);
  /* a quantize with rht and no caller amax over at most 8 tiles is one cluster that makes its
     own global amaxes: 8 tiles in both usages with a columnwise copy at 256 x 256 (64 x 128
     both directions, 128 x 64 the columnwise copy alone), the trainer's shape; NaN and Inf
     among them (fill kind 2); 9 tiles and more take the amax pass first (192 x 384) */
  check_case("rht = true", HQ_F32, 256, 256, 10, 0, 1);
  check_case("rht = true\nstochastic_rounding = true", HQ_F32, 256, 256, 11, 2, 0);
  check_case("scale_dtype = ue5m3\nrht = true\nswizzle = true", HQ_BF16, 256, 256, 12, 2, 0);
  check_case("rht = true\nstochastic_rounding = true", HQ_F16, 192, 384, 13, 0, 0);
  check_case("stochastic_rounding = true\nblock_2d = false", HQ_F32, 512, 1024, 9, 0, 0);
  /* one tile: a cluster of one CTA, which keeps its maxima in place (st.async, the mailbox of
     the larger clusters, is undefined there); NaN and Inf among them */
  check_case("rht = true", HQ_F32, 48, 112, 14, 2, 1);
  check_case("rht = true\nstochastic_rounding = true", HQ_BF16, 64, 128, 15, 2, 0);
}

/* More tiles than any GPU holds quantize CTAs at once (2 or 3 per SM), so every CTA loops
   over several: full and partial tiles in one walk (the last tile column and row partial), the
   next tile copied in while one is encoded and the previous one stored; for both directions
   groups of 4 tiles along M, a short one last (a tensor of fewer groups than the GPU has SMs --
   every shape of the other tests -- takes the kernel that gives each tile its own CTA instead;
   these take the grouped one). HQ_TEST_QUICK (under
   compute-sanitizer): the two smallest cases alone, still several tiles per CTA. */
static void test_many_tiles(void **state) {
  (void)state;
  check_case("block_2d = true\nswizzle = true", HQ_F32, 1040, 4176, 31, 0, 0);
  check_case("rht = true", HQ_F32, 1040, 4176, 39, 0, 0); /* grouped, with the transform */
  if (getenv("HQ_TEST_QUICK")) return;
  check_case("", HQ_BF16, 2048, 8192, 32, 0, 0);
  /* more groups of 4 tiles along M than CTAs, the last row of groups short (18 tile rows):
     CTAs walk a full group, then a short one, its finished neighbour stored part by part */
  check_case("block_2d = true", HQ_BF16, 1104, 8192, 34, 0, 0);
  check_case("rht = true\nstochastic_rounding = true", HQ_F16, 1040, 8272, 33, 0, 0);
  /* the options' kernels over many tiles and groups (the same walk), row-scaled with rows and
     columns of many tiles each */
  check_case("global_scale = row", HQ_BF16, 1104, 8192, 35, 0, 0);
  check_case("scale_dtype = ue5m3\nglobal_scale = row", HQ_F32, 1040, 4176, 36, 0, 0);
  check_case("scale_dtype = ue5m3", HQ_BF16, 1104, 8192, 37, 0, 0);
  check_case("scale_dtype = ue5m3\nglobal_scale = none\nrht = true", HQ_F16, 1040, 8272, 38, 0,
             0);
}

/* global_scale = row through the one-read rowwise kernel (rowq_kernel: a CTA's slab of whole
   rows in shared memory, rows of up to 32 KiB) and its fallback, the two-pass kernels (a row
   longer than a slab, an unaligned source: check_case's unaligned quantize), against the CPU:
   odd K / 16 (no warp-wide row reduction, scale codes byte by byte), K / 16 a multiple of 4
   but not of 32, slabs of 1 row, of many rows (capped at 256) with a partial last slab, rows
   exactly at the budget and just over it in each dtype; rows of very different magnitudes with
   all-zero rows, NaN and Inf (fill kind 5); every direction (columnwise and both directions
   take the two-pass kernels, whose amaxes now come one tile ahead); swizzle, stochastic
   rounding and UE5M3 scales. */
static void test_row_scaled(void **state) {
  (void)state;
  static const struct {
    const char *opt;
    hq_dtype dt;
    int64_t M, K;
  } c[] = {
      {"global_scale = row", HQ_BF16, 96, 208},    /* K / 16 = 13 */
      {"global_scale = row", HQ_BF16, 48, 8208},   /* 513 blocks a row: a large slab each */
      {"global_scale = row", HQ_BF16, 64, 8192},   /* exactly a small slab, one atomic a warp */
      {"global_scale = row", HQ_F16, 528, 80},     /* 102 rows a small slab, the last partial */
      {"global_scale = row", HQ_F32, 1040, 16},    /* 256 rows a slab (the cap) */
      {"global_scale = row", HQ_F32, 48, 192},     /* K / 16 = 12: words, no warp reduction */
      {"global_scale = row", HQ_BF16, 32, 16384},  /* exactly a large slab */
      {"global_scale = row", HQ_BF16, 32, 16400},  /* over the budget: two-pass */
      {"global_scale = row", HQ_F32, 32, 8192},    /* exactly a large slab */
      {"global_scale = row", HQ_F32, 32, 8208},    /* over the budget: two-pass */
      {"global_scale = row\nswizzle = true", HQ_BF16, 144, 336},
      {"global_scale = row\nswizzle = true", HQ_F16, 80, 1024},
      {"global_scale = row\nstochastic_rounding = true", HQ_BF16, 112, 400},
      {"global_scale = row\nstochastic_rounding = true\nswizzle = true", HQ_F32, 64, 2064},
      {"scale_dtype = ue5m3\nglobal_scale = row", HQ_BF16, 80, 1040},
      {"scale_dtype = ue5m3\nglobal_scale = row\nswizzle = true", HQ_F16, 48, 16400},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    check_case(c[i].opt, c[i].dt, c[i].M, c[i].K, 900 + i, 5, 0);
    if (i % 4 == 0) check_case(c[i].opt, c[i].dt, c[i].M, c[i].K, 950 + i, 0, 0);
  }
  /* many slabs per CTA (more than the GPU holds CTAs at once), rows of every magnitude */
  check_case("global_scale = row", HQ_BF16, 2048, 8192, 990, 5, 0);
}

/* NaN, Inf, subnormals, zero blocks, wide ranges, saturation boundaries, an all-zero tensor. */
static void test_special_values(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int kind = 1; kind <= 3; kind++)
    for (int t = 0; t < 3; t++)
      for (size_t o = 0; o < N_OPTION_SETS; o += (kind == 1 ? 1 : 3))
        check_case(option_sets[o], dts[t], 64, 96, 600 + (uint64_t)kind, kind,
                   o == 0 || o == 4);
  for (int t = 0; t < 3; t++) /* the columnwise RHT's edges (kind 4), every rht option set */
    for (size_t o = 4; o < N_OPTION_SETS; o += (o == 5 ? 3 : 1))
      check_case(option_sets[o], dts[t], 32, 48, 640 + (uint64_t)t, 4, o == 4);
}

/* The module's amax op on the device, called directly: out[0] / out[1] get the CPU's amaxes for
   the requested directions and 0 for the others (written over whatever was there), with and
   without rht, every input dtype, on both sides of 2^17 elements (the passes' one-cluster
   form, and the memset and atomics of a larger tensor), a large value at several places or
   none; scratch on a device is 0. */
static void test_amax_op_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("nvfp4")(&host);
  assert_non_null(ops);
  assert_non_null(ops->amax);
  assert_true(ops->caps & HQ_CAP_CUDA);
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  const int64_t shapes[][2] = {{16, 16}, {48, 80}, {208, 400}, {512, 256}, {528, 256}};
  for (int rht = 0; rht <= 1; rht++) {
    hq_optval v[8]; /* one per option of the table */
    memset(v, 0, sizeof v);
    v[0].i = rht;
    v[1].i = 0xD7E8;
    void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
    HQ_OK_OR_FAIL(ops->configure(cfg, v, &host));
    assert_true(ops->instance_caps(cfg) & HQ_CAP_CUDA);
    assert_int_equal(ops->scratch_size(cfg, 4096, 4096, HQ_BOTH, 0), 0);
    hq_call call = hq_test_call(&host, 0, 0);
    call.device = 0;
    char text[160];
    snprintf(text, sizeof text, "[format f]\nplugin = nvfp4\nrht = %s\n[role *:*:*]\n"
             "rowwise = f\ncolumnwise = f\n", rht ? "true" : "false");
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    for (int t = 0; t < 3; t++)
      for (size_t c = 0; c < 5 * (sizeof shapes / sizeof shapes[0]); c++) {
        const size_t sh = c / 5, ol = c % 5;
        const int64_t M = shapes[sh][0], K = shapes[sh][1];
        /* the -300 that sets both maxima in the last column pair of the last row block, the
           first column, the last, the middle, or nowhere (the random values' own maxima): a
           pass that skipped or repeated patches would miss one */
        const int64_t at[5] = {M * K - 2, 0, K - 1, (M / 2) * K + K / 2 + 1, -1};
        hq_tensor x = hq_test_tensor(dts[t], M, K, 700 + sh + 10 * (uint64_t)ol, 2.0f);
        hq_store_hp(x.data, 5, dts[t], NAN);
        if (at[ol] >= 0) hq_store_hp(x.data, at[ol], dts[t], -300.0f);
        float want[2];
        HQ_OK_OR_FAIL(hq_quantizer_amax(q, cpu, &x, want));
        hq_tensor xg = to_gpu(&x);
        for (uint32_t dirs = 0; dirs <= 3; dirs++) {
          const float junk[2] = {-7.0f, NAN};
          float *og = amax_to_gpu(junk), out[2];
          HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
          assert_int_equal(ops->amax(cfg, &call, &xg, dirs, og), HQ_OK);
          amax_to_host(og, out);
          const float w0 = (dirs & HQ_ROWWISE) ? want[0] : 0.0f;
          const float w1 = (dirs & HQ_COLWISE) ? want[1] : 0.0f;
          if (memcmp(&out[0], &w0, 4) || memcmp(&out[1], &w1, 4))
            fail_msg("rht %d %s %lldx%lld, -300 at %lld, dirs %u: amax {%a, %a}, want {%a, %a}",
                     rht, hq_dtype_name(dts[t]), (long long)M, (long long)K, (long long)at[ol],
                     dirs, out[0], out[1], w0, w1);
          hq_ctx_free(gpu, og);
        }
        hq_ctx_free(gpu, xg.data);
        free(x.data);
      }
    hq_quantizer_free(q);
    hq_recipe_free(r);
    free(cfg);
  }
}

// --- ABI 2.1: raw dequantize and hq_gemm on the device -----------------------------------------

/* A row-scaled storage's raw values split from their row factors (ABI 2.6 row_factor_out) on the
   device equal the host's, byte for byte: the BF16 values (what the emulated GEMM multiplies)
   and the one factor per stored row (M of them rowwise, K columnwise), NaN against NaN aside. */
static void compare_row_split(const hq_format_ops *ops, const hq_host_api *host,
                              const hq_qtensor *h, const hq_qtensor *g, uint32_t d,
                              const char *what) {
  const int64_t M = hq_qtensor_rows(h), K = hq_qtensor_cols(h), R = d == HQ_ROWWISE ? M : K;
  const size_t vb = (size_t)(M * K) * 2, fb = (size_t)R * sizeof(float);
  hq_tensor vh = hq_test_empty(HQ_BF16, M, K), vg = vh;
  float *fh = malloc(fb), *fg = malloc(fb), *fdev = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, vb, &vg.data));
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, fb, (void **)&fdev));
  vg.device = 0;
  uint8_t cfg[256] = {0};
  hq_call hc = hq_test_call(host, 0, 0), dc = hc;
  hc.flags = dc.flags = HQ_CALL_DEQ_RAW;
  dc.device = 0;
  hc.row_factor_out = fh;
  dc.row_factor_out = fdev;
  if (ops->dequantize(cfg, &hc, hq_qtensor_storage(h, d), &vh) ||
      ops->dequantize(cfg, &dc, hq_qtensor_storage(g, d), &vg))
    fail_msg("%s: dequantize with row factors: %s", what, hq_test_module_error());
  uint16_t *back = malloc(vb);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, vg.data, 0, vb));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, fg, HQ_DEVICE_HOST, fdev, 0, fb));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  for (int64_t t = 0; t < M * K; t++) {
    const float a = hq_load_hp(back, t, HQ_BF16), b = hq_load_hp(vh.data, t, HQ_BF16);
    if (!(isnan(a) && isnan(b)) && back[t] != ((const uint16_t *)vh.data)[t])
      fail_msg("%s dir %u: split value %lld cpu %a gpu %a", what, d, (long long)t, (double)b,
               (double)a);
  }
  for (int64_t r = 0; r < R; r++)
    if (!(isnan(fh[r]) && isnan(fg[r])) && memcmp(&fh[r], &fg[r], sizeof(float)))
      fail_msg("%s dir %u: row factor %lld cpu %a gpu %a", what, d, (long long)r, (double)fh[r],
               (double)fg[r]);
  free(back);
  free(fh);
  free(fg);
  free(vh.data);
  hq_ctx_free(gpu, vg.data);
  hq_ctx_free(gpu, fdev);
}

/* The raw dequantize and the tensor factor on the device equal the CPU's, byte for byte: every
   option set (RHT copies stay in the transformed domain on both), both directions, every
   destination dtype, and special inputs (NaN, Inf: an Inf amax gives an Inf factor). */
static void test_raw_and_factor(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("nvfp4")(&host);
  assert_non_null(ops);
  assert_non_null(ops->tensor_factor);
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (size_t o = 0; o < N_OPTION_SETS; o++)
    for (int special = 0; special <= 2; special += 2) {
      char text[512];
      snprintf(text, sizeof text, "[format f]\nplugin = nvfp4\n%s\n[role *:*:*]\nrowwise = f\n"
               "columnwise = f\n", option_sets[o]);
      hq_recipe *r = hq_test_recipe(text);
      hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
      hq_tensor x = hq_test_tensor(dts[o % 3], 96, 160, 3000 + o, 4.0f);
      if (special) fill_special(&x, special);
      hq_tensor xg = to_gpu(&x);
      hq_qtensor *h = NULL, *g = NULL;
      same_rng();
      HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
      HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
      compare_usage(h, g, HQ_BOTH, option_sets[o]);
      float fhs[2] = {0.0f, 0.0f}; /* each direction's factor on the host */
      for (uint32_t d = 1; d <= 2; d++) {
        hq_gpu_compare_raw(gpu, ops, &host, h, g, d, option_sets[o]);
        if (strstr(option_sets[o], "global_scale = row"))
          compare_row_split(ops, &host, h, g, d, option_sets[o]);
        /* the factor: host value vs device value, one thread on the legacy stream */
        uint8_t cfg[256] = {0};
        hq_call hc = hq_test_call(&host, 0, 0), dc = hc;
        dc.device = 0;
        float fh = -1.0f, fg = -2.0f, *dev = NULL;
        HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, sizeof(float), (void **)&dev));
        if (ops->tensor_factor(cfg, &hc, hq_qtensor_storage(h, d), &fh) ||
            ops->tensor_factor(cfg, &dc, hq_qtensor_storage(g, d), dev))
          fail_msg("tensor_factor: %s", hq_test_module_error());
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, &fg, HQ_DEVICE_HOST, dev, 0, sizeof fg));
        HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
        if (memcmp(&fh, &fg, sizeof fh))
          fail_msg("%s special %d dir %u: factor cpu %a gpu %a", option_sets[o], special, d,
                   (double)fh, (double)fg);
        fhs[d - 1] = fh;
        hq_ctx_free(gpu, dev);
        if (!special)
          hq_gpu_check_factor_out(gpu, ops, &host, hq_qtensor_storage(g, d), fh, 96, 160,
                                  option_sets[o]);
      }
      /* both directions as one pair (ABI 2.6), in either order and each with itself, into the
         emulated GEMM's BF16, into F32 and F16; the special values too (the kernels' NaN
         paths), the chained fold only where the values are finite (a row-scaled storage's
         per-tensor factor is 1) */
      static const struct { uint32_t a, b; hq_dtype dt; } pairs[] = {
          {1, 2, HQ_BF16}, {2, 1, HQ_BF16}, {1, 1, HQ_BF16}, {2, 2, HQ_F32}, {2, 1, HQ_F16}};
      for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
        const uint32_t da = pairs[p].a, db = pairs[p].b;
        char what[600];
        snprintf(what, sizeof what, "%s special %d, pair of directions %u and %u, %s",
                 option_sets[o], special, da, db, hq_dtype_name(pairs[p].dt));
        hq_gpu_check_pair(gpu, ops, &host, hq_qtensor_storage(g, da), hq_qtensor_storage(g, db),
                          pairs[p].dt, !special, fhs[da - 1], fhs[db - 1], what);
      }
      /* with a storage of another shape (48 x 288: another grid for each part), both orders */
      hq_tensor x2 = hq_test_tensor(dts[o % 3], 48, 288, 3100 + o, 4.0f);
      hq_tensor x2g = to_gpu(&x2);
      hq_qtensor *g2 = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, gpu, &x2g, &g2));
      for (uint32_t p = 0; p < 4; p++) {
        const hq_qtensor *ta = p < 2 ? g : g2, *tb = p < 2 ? g2 : g;
        const uint32_t da = 1 + (p & 1), db = 2 - (p & 1);
        char what[600];
        snprintf(what, sizeof what, "%s special %d, pair of %lldx%lld direction %u and "
                 "%lldx%lld direction %u", option_sets[o], special,
                 (long long)hq_qtensor_rows(ta), (long long)hq_qtensor_cols(ta), da,
                 (long long)hq_qtensor_rows(tb), (long long)hq_qtensor_cols(tb), db);
        hq_gpu_check_pair(gpu, ops, &host, hq_qtensor_storage(ta, da),
                          hq_qtensor_storage(tb, db), HQ_BF16, 0, 1.0f, 1.0f, what);
      }
      hq_qtensor_free(g2);
      hq_ctx_free(gpu, x2g.data);
      free(x2.data);
      hq_qtensor_free(h);
      hq_qtensor_free(g);
      hq_ctx_free(gpu, xg.data);
      free(x.data);
      hq_quantizer_free(q);
      hq_recipe_free(r);
    }
}

/* Write `n` bytes into the buffer with `role` of a storage on the host or the device, at offset
   `off` of the buffer. */
static void poke(const hq_storage *st, uint32_t role, int on_gpu, size_t off, const void *src,
                 size_t n) {
  const hq_buffer *b = hq_gpu_buf_of(st, role);
  assert_true(off + n <= b->bytes);
  if (on_gpu)
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, (uint8_t *)b->ptr + off, hq_ctx_device(gpu), src,
                                HQ_DEVICE_HOST, n));
  else
    memcpy((uint8_t *)b->ptr + off, src, n);
}

/* The raw dequantize of every (code, scale) pair on the device equals the host's, byte for byte,
   into F32, BF16 and F16 (BF16 with vector stores is what the emulated GEMM reads, on its own
   fast path): row i of a 256 x 32 storage has the scale byte i for both its blocks (normal,
   subnormal, zero, negative and NaN scales) and the 16 codes in order, then reversed; compact
   and swizzled scales. */
static void test_raw_every_pair(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("nvfp4")(&host);
  assert_non_null(ops);
  for (int swz = 0; swz < 2; swz++) {
    hq_recipe *r = hq_test_recipe(swz ? "[format f]\nplugin = nvfp4\nswizzle = true\n"
                                        "[role *:*:*]\nrowwise = f\n"
                                      : "[format f]\nplugin = nvfp4\n[role *:*:*]\nrowwise = f\n");
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    const int64_t M = 256, K = 32;
    hq_qtensor *h = NULL, *g = NULL;
    HQ_OK_OR_FAIL(hq_make_empty(q, cpu, M, K, HQ_BF16, &h));
    HQ_OK_OR_FAIL(hq_make_empty(q, gpu, M, K, HQ_BF16, &g));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    const hq_storage *sh = hq_qtensor_storage(h, HQ_ROWWISE);
    const hq_storage *sg = hq_qtensor_storage(g, HQ_ROWWISE);
    const int64_t ld = hq_gpu_buf_of(sh, HQ_ROLE_SCALE)->shape[1];
    assert_true(ld >= K / 16);
    uint8_t row[16];
    for (int j = 0; j < 8; j++) {
      row[j] = (uint8_t)(2 * j | (2 * j + 1) << 4);            /* codes 0..15 */
      row[8 + j] = (uint8_t)((15 - 2 * j) | (14 - 2 * j) << 4); /* codes 15..0 */
    }
    for (int64_t i = 0; i < M; i++) {
      const uint8_t sf = (uint8_t)i;
      for (int on_gpu = 0; on_gpu < 2; on_gpu++) {
        const hq_storage *st = on_gpu ? sg : sh;
        poke(st, HQ_ROLE_DATA, on_gpu, (size_t)(i * K / 2), row, sizeof row);
        for (int64_t b = 0; b < K / 16; b++)
          poke(st, HQ_ROLE_SCALE, on_gpu, (size_t)(swz ? hq_swizzle_offset(i, b, ld) : i * ld + b),
               &sf, 1);
      }
    }
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    hq_gpu_compare_raw(gpu, ops, &host, h, g, HQ_ROWWISE,
                       swz ? "every pair, swizzled" : "every pair");
    hq_qtensor_free(h);
    hq_qtensor_free(g);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

/* hq_gemm of two nvfp4 operands on the device (swizzled scales): fprop TN (2-D weights), dgrad
   NN, TT; on sm_100 and later the native path, checked against the emulated one and the F64
   product; elsewhere the emulated path (the gemm op's reason names the architecture). */
static int nvfp4_native_on(int arch) { return arch >= 100; }
static void test_gemm_device(void **state) {
  (void)state;
  static const hq_gpu_gemm_case cases[] = {{"nvfp4 fprop TN", 0, 1, 1, 0},
                                           {"nvfp4 dgrad NN", 0, 0, 2, 0},
                                           {"nvfp4 wgrad NT", 1, 0, 2, 1},
                                           {"nvfp4 TT", 2, 1, 0, 1}};
  hq_gpu_check_role_gemms(cpu, gpu,
                          "[format w]\nplugin = nvfp4\nswizzle = true\nblock_2d = true\n"
                          "[format x]\nplugin = nvfp4\nswizzle = true\n"
                          "[format g]\nplugin = nvfp4\nswizzle = true\n"
                          "stochastic_rounding = true\n"
                          "[role linear:weight:*]\nrowwise = w\ncolumnwise = w\n"
                          "[role linear:input:*]\nrowwise = x\ncolumnwise = x\n"
                          "[role linear:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
                          4000, rng11, cases, sizeof cases / sizeof cases[0],
                          nvfp4_native_on);
}

/* Row-scaled and UE5M3 operands on the device: never native or fused (no such scales in those
   kernels), the emulated product of the dequantized operands in BF16 -- row-scaled ones as their
   BF16-exact values without the row factors, which multiply the F32 product (ABI 2.6
   row_factor_out). */
static void test_gemm_options(void **state) {
  (void)state;
  static const struct {
    const char *opts;
    uint32_t path;
  } k[] = {{"global_scale = row", HQ_GEMM_PATH_EMULATED_BF16},
           {"scale_dtype = ue5m3\nswizzle = true", HQ_GEMM_PATH_EMULATED_BF16},
           {"scale_dtype = ue5m3\nglobal_scale = none\nswizzle = true", HQ_GEMM_PATH_EMULATED_BF16},
           {"scale_dtype = ue5m3\nglobal_scale = row", HQ_GEMM_PATH_EMULATED_BF16}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "[format f]\nplugin = nvfp4\n%s\n[role *:*:*]\nrowwise = f\n"
             "columnwise = f\n", k[i].opts);
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    hq_tensor x = hq_test_tensor(HQ_BF16, 128, 256, 91 + i, 2.0f);
    hq_tensor w = hq_test_tensor(HQ_BF16, 192, 256, 92 + i, 2.0f);
    hq_tensor xg = to_gpu(&x), wg = to_gpu(&w);
    hq_qtensor *hx, *gx, *hw, *gw;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &hx));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &gx));
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &hw));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &wg, &gw));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    /* fprop y = x W^T (TN, the rowwise copies) and x^T x (NT, the columnwise copies) */
    uint32_t p = hq_gpu_gemm_device_check(cpu, gpu, hw, gw, 1, hx, gx, 0, k[i].opts);
    if (p != k[i].path)
      fail_msg("[%s] fprop: path %s, expected %s", k[i].opts, hq_gemm_path_name(p),
               hq_gemm_path_name(k[i].path));
    p = hq_gpu_gemm_device_check(cpu, gpu, hx, gx, 0, hx, gx, 1, k[i].opts); /* x^T x */
    if (p != k[i].path)
      fail_msg("[%s] NT: path %s, expected %s", k[i].opts, hq_gemm_path_name(p),
               hq_gemm_path_name(k[i].path));
    hq_qtensor_free(hx);
    hq_qtensor_free(gx);
    hq_qtensor_free(hw);
    hq_qtensor_free(gw);
    hq_ctx_free(gpu, xg.data);
    hq_ctx_free(gpu, wg.data);
    free(x.data);
    free(w.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

/* make_empty on the device zeroes every buffer, as on the host. */
static void test_make_empty(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = nvfp4\nswizzle = true\n[role *:*:*]\n"
                                "rowwise = f\ncolumnwise = f\n");
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_qtensor *h = NULL, *g = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, cpu, 48, 80, HQ_BF16, &h));
  HQ_OK_OR_FAIL(hq_make_empty(q, gpu, 48, 80, HQ_BF16, &g));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  compare_usage(h, g, HQ_BOTH, "make_empty");
  hq_qtensor_free(h);
  hq_qtensor_free(g);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* The nvfp4 module's ops, configured into cfg with every option off (the default sign mask). */
static const hq_format_ops *plain_module(hq_host_api *host, uint8_t cfg[256]) {
  const hq_format_ops *ops = hq_test_module_entry("nvfp4")(host);
  assert_non_null(ops);
  memset(cfg, 0, 256);
  hq_optval v[8] = {{0}}; /* one per option of the table */
  v[1].i = 0xD7E8; /* rht_sign_mask; every other option off */
  if (ops->configure(cfg, v, host)) fail_msg("configure: %s", hq_test_module_error());
  return ops;
}

/* The factor of an empty [0, 160] device storage (no dequantize kernel runs; the public API
   makes no empty tensors, so the storage is laid out and allocated here by direct module
   calls): its amax set to 1000 and 3 (rowwise, columnwise), the factor RN(A * RN(1/2688)) in the
   test's arithmetic. */
static void test_factor_out_empty(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  uint8_t cfg[256];
  const hq_format_ops *ops = plain_module(&host, cfg);
  for (uint32_t d = 1; d <= 2; d++) {
    hq_storage st;
    hq_gpu_device_storage(gpu, ops, cfg, &host, 0, 160, HQ_BF16, d, HQ_BOTH, NULL, &st);
    const float A = d == 1 ? 1000.0f : 3.0f;
    volatile float c = 1.0f / 2688.0f, f = A * c;
    poke(&st, HQ_ROLE_AMAX, 1, 0, &A, sizeof A);
    hq_gpu_check_factor_out(gpu, ops, &host, &st, f, 0, 160, "empty");
    hq_gpu_free_storage(gpu, &st);
  }
}

/* A device quantize of a tensor with a dimension of 2^31 or more is refused with a clear error
   before anything runs (the kernel's offsets take 32-bit factors): the storages are laid out
   for the shape, their buffers point at one small allocation that nothing may touch. */
static void test_huge_dims_refused(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  uint8_t cfg[256];
  const hq_format_ops *ops = plain_module(&host, cfg);
  void *small = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, 256, &small));
  const int64_t big = (int64_t)1 << 31, shapes[2][2] = {{big, 16}, {16, big}};
  for (int sh = 0; sh < 2; sh++) {
    const int64_t M = shapes[sh][0], K = shapes[sh][1];
    hq_storage st[2];
    for (uint32_t d = 1; d <= 2; d++)
      hq_gpu_device_storage(gpu, ops, cfg, &host, M, K, HQ_BF16, d, HQ_BOTH, small, &st[d - 1]);
    hq_tensor x = hq_tensor_2d(small, HQ_BF16, hq_ctx_device(gpu), M, K);
    hq_call call = hq_test_call(&host, 0, 0);
    call.device = hq_ctx_device(gpu);
    call.amax = small; /* given: no amax pass either */
    assert_int_equal(ops->quantize(cfg, &call, &x, HQ_BOTH, &st[0], &st[1]), HQ_ESHAPE);
    if (!strstr(hq_test_module_error(), "dimension of 2^31 or more"))
      fail_msg("[%lld, %lld]: %s", (long long)M, (long long)K, hq_test_module_error());
  }
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  hq_ctx_free(gpu, small);
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_many_tiles),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_row_scaled),
      cmocka_unit_test(test_amax_op_direct),
      cmocka_unit_test(test_make_empty),
      cmocka_unit_test(test_raw_and_factor),
      cmocka_unit_test(test_factor_out_empty),
      cmocka_unit_test(test_huge_dims_refused),
      cmocka_unit_test(test_raw_every_pair),
      cmocka_unit_test(test_gemm_device),
      cmocka_unit_test(test_gemm_options),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
