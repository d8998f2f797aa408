/*
** test_gpu_mx.c -- mxfp4 and mxfp6 on a CUDA device are bit-identical to the CPU reference:
** every buffer of every present direction after quantize on a host context and on a device
** context, compared byte for byte, for every element type (e2m1, e3m2, e2m3), both scale rules,
** round-to-nearest and stochastic rounding (the same seed and offset on both), f32 / bf16 / f16
** inputs (16-byte aligned: the vector loads; one element off: the scalar loads), usage rowwise /
** columnwise / both, shapes 32x32 to 160x4128, 32x8192 and 4160x8224 (several row blocks per
** CTA) with every kind of last column tile (K % 128 = 0, 32, 64, 96) and special blocks (zeros,
** NaN, +-Inf, FP32 subnormals, values past the maximum: the kernels' NaN blocks and Inf blocks
** take the rule, the rest its fast forms);
** dequantize of each direction into f32 / bf16 / f16, aligned and one element off, of those
** storages and of storages holding every code and every scale byte. raw_copy = bf16: the raw
** values' buffers equal the CPU's too.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA.
*/
#include <math.h>

#include "hq_test.h"
#include "hq_gpu_test.h"

static hq_ctx *cpu, *gpu;

static int setup(void **state) {
  (void)state;
  return hq_gpu_contexts(&cpu, &gpu, 0x5eed);
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(cpu);
  hq_ctx_destroy(gpu);
  return 0;
}

/* set by test_raw_copy: the recipes keep raw copies (raw_copy = bf16) */
static int raw_copy;
/* set by test_columnwise_alone: the recipes set the columnwise format alone (rowwise identity) */
static int cols_only;

static hq_recipe *recipe(int kind, int rceil, int sr) {
  char text[512];
  snprintf(text, sizeof text,
           "[format f]\nplugin = %s\n%sscale = %s\nstochastic_rounding = %s\n%s[role *:*:*]\n"
           "%scolumnwise = f\n",
           kind ? "mxfp6" : "mxfp4", kind == 1 ? "elem = e3m2\n" : kind == 2 ? "elem = e2m3\n" : "",
           rceil ? "rceil" : "floor", sr ? "true" : "false", raw_copy ? "raw_copy = bf16\n" : "",
           cols_only ? "" : "rowwise = f\n");
  return hq_test_recipe(text);
}

/* A host input with special blocks along the first rows and columns. */
static hq_tensor input(hq_dtype t, int64_t M, int64_t K, uint64_t seed) {
  hq_tensor x = hq_test_tensor(t, M, K, seed, 3.0f);
  uint64_t s = seed;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j += 32) {
      const float m = ldexpf(1.0f, (int)(hq_test_rand(&s) % 40) - 20);
      for (int k = 0; k < 32; k++)
        hq_store_hp(x.data, i * K + j + k, t, hq_load_hp(x.data, i * K + j + k, t) * m);
    }
  const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 1e30f, 100.0f, -7.6f};
  for (int64_t n = 0; n < (int64_t)(sizeof sp / sizeof sp[0]) && n < M; n++) {
    hq_store_hp(x.data, n * K + n, t, sp[n]);
    hq_store_hp(x.data, (M - 1 - n) * K + (K - 1) - n, t, sp[n]);
  }
  for (int k = 0; k < 32 && M >= 64; k++) hq_store_hp(x.data, 32 * K + 32 + k, t, 0.0f);
  /* an all-zero columnwise block: rows 0..31 of column K/2 (clear of the values above) */
  for (int r = 0; r < 32; r++) hq_store_hp(x.data, r * K + K / 2, t, r & 1 ? -0.0f : 0.0f);
  /* a rowwise and a columnwise block of values near 2^-133 (BF16 subnormals, scale code 0: the
     BF16 form's multiply-add takes subnormal operands) */
  for (int k = 0; k < 32 && M >= 96 && K >= 128; k++) {
    const float v = ldexpf((float)(k - 16) * 3.0f + 0.5f, -133);
    hq_store_hp(x.data, 40 * K + 64 + k, t, v);
    hq_store_hp(x.data, (64 + k) * K + 100, t, v);
  }
  return x;
}

static void one(int kind, int rceil, int sr, hq_dtype t, int64_t M, int64_t K, uint32_t usage,
                int shift) {
  char what[176];
  snprintf(what, sizeof what, "kind %d rceil %d sr %d dtype %d [%lld, %lld] usage %u shift %d%s",
           kind, rceil, sr, (int)t, (long long)M, (long long)K, usage, shift,
           cols_only ? " (columnwise format alone)" : "");
  /* the directions the module quantizes (a columnwise-only recipe's rowwise copy is identity) */
  const uint32_t dirs = cols_only ? usage & HQ_COLWISE : usage;
  hq_recipe *r = recipe(kind, rceil, sr);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_tensor h = input(t, M, K, (uint64_t)(M * 7 + K + kind));
  hq_tensor g = hq_gpu_tensor_at(gpu, &h, shift);
  hq_qtensor *qh = NULL, *qg = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &h, &qh));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &g, &qg));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  hq_gpu_compare_usage(gpu, qh, qg, dirs, what);
  /* dequantize each direction on both sides into every dtype */
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (uint32_t d = 1; d <= 2; d++) {
    if (!(dirs & d)) continue;
    for (int o = 0; o < 3; o++) {
      hq_tensor yh = hq_test_empty(outs[o], M, K);
      hq_tensor yg0 = hq_test_empty(outs[o], M, K);
      /* shift != 0: the destination one element off 16-byte alignment (the scalar stores) */
      const int dshift = shift ? (int)hq_dtype_size(outs[o]) : 0;
      hq_tensor yg = hq_gpu_tensor_at(gpu, &yg0, dshift);
      HQ_OK_OR_FAIL(hq_dequantize(qh, cpu, d, &yh));
      HQ_OK_OR_FAIL(hq_dequantize(qg, gpu, d, &yg));
      const size_t n = (size_t)(M * K) * hq_dtype_size(outs[o]);
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, yg0.data, HQ_DEVICE_HOST, yg.data, 0, n));
      HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
      if (memcmp(yh.data, yg0.data, n)) {
        /* the first differing element, for the report */
        const size_t es = hq_dtype_size(outs[o]);
        size_t e = 0;
        while (e + 1 < (size_t)(M * K) && !memcmp((char *)yh.data + e * es, (char *)yg0.data + e * es, es)) e++;
        uint32_t bh = 0, bg = 0;
        memcpy(&bh, (char *)yh.data + e * es, es);
        memcpy(&bg, (char *)yg0.data + e * es, es);
        fail_msg("%s: dequantize dir %u dtype %d differs: element [%lld, %lld] host 0x%x device 0x%x",
                 what, d, (int)outs[o], (long long)(e / (size_t)K), (long long)(e % (size_t)K), bh, bg);
      }
      hq_ctx_free(gpu, (char *)yg.data - dshift);
      free(yh.data);
      free(yg0.data);
    }
  }
  hq_qtensor_free(qh);
  hq_qtensor_free(qg);
  hq_ctx_free(gpu, (char *)g.data - shift);
  free(h.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static void test_every_option(void **state) {
  (void)state;
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int kind = 0; kind < 3; kind++)
    for (int rceil = 0; rceil < 2; rceil++)
      for (int sr = 0; sr < 2; sr++)
        for (int d = 0; d < 3; d++)
          for (uint32_t usage = 1; usage <= 3; usage++) {
            one(kind, rceil, sr, dts[d], 96, 160, usage, 0);
            one(kind, rceil, sr, dts[d], 64, 96, usage, (int)hq_dtype_size(dts[d]));
          }
}

/* raw_copy = bf16: the raw-values buffers (the RAW kernels, every element kind, both scale
   rules, with and without stochastic rounding, aligned and unaligned inputs, every usage) equal
   the CPU's byte for byte, as every other buffer does. */
static void test_raw_copy(void **state) {
  (void)state;
  raw_copy = 1;
  for (int kind = 0; kind < 3; kind++)
    for (int rceil = 0; rceil < 2; rceil++)
      for (int sr = 0; sr < 2; sr++)
        for (uint32_t usage = 1; usage <= 3; usage++) {
          one(kind, rceil, sr, HQ_BF16, 96, 160, usage, 0);
          one(kind, rceil, sr, HQ_F32, 64, 96, usage, 4);
        }
  one(0, 0, 0, HQ_BF16, 1024, 1056, HQ_BOTH, 0);
  one(1, 1, 1, HQ_F16, 1024, 1056, HQ_BOTH, 0);
  raw_copy = 0;
}

/* Shapes around the kernels' 32 x 128 tile: K a multiple of 128, K % 128 = 32, 64 or 96 (a
   last tile with 1..3 of its 4 column blocks), one row block and many, each kind under each
   option set on a few of them. */
static void test_shapes(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{32, 32},   {32, 1056},  {1024, 64}, {1024, 1056},
                               {64, 128},  {96, 224},   {160, 4128}, {32, 8192}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int kind = 0; kind < 3; kind++) {
      one(kind, 0, 0, HQ_BF16, shapes[s][0], shapes[s][1], HQ_BOTH, 0);
      if (s >= 4)
        for (int o = 0; o < 3; o++) /* rceil; stochastic rounding under each rule */
          one(kind, o == 0 || o == 2, o > 0, o == 1 ? HQ_F32 : HQ_F16, shapes[s][0], shapes[s][1],
              HQ_BOTH, 0);
    }
}

/* The rowwise copy alone from an aligned input by round to nearest, more tiles than two waves of
   8 CTAs per SM hold twice over (4160 x 8224: 130 x 65 tiles, the last column tile a quarter
   full): the launcher gives each CTA several consecutive row blocks (2 on a 132-SM device), so
   the kernel's loop over row blocks runs, with a short last CTA where they do not divide; every
   element kind and input dtype, both scale rules. Both directions of the same shape take a CTA
   per tile. */
static void test_many_tiles(void **state) {
  (void)state;
  for (int kind = 0; kind < 3; kind++) one(kind, 0, 0, HQ_BF16, 4160, 8224, HQ_ROWWISE, 0);
  one(0, 1, 0, HQ_F32, 4160, 8224, HQ_ROWWISE, 0);
  one(1, 1, 0, HQ_F16, 4128, 8224, HQ_ROWWISE, 0); /* 129 row blocks: the last CTA's one */
  one(0, 0, 0, HQ_BF16, 4160, 8224, HQ_BOTH, 0);
}

/* The columnwise copy alone (a recipe that sets only the columnwise format: the dgrad / wgrad
   operand) from aligned BF16 and F16 inputs by round to nearest: the COLS kernels where HQ_MX_COLS
   is 1 (a warp per 32 x 32 tile, 8 warps along K per CTA; else the kernel that writes both copies),
   every element kind, both scale rules; K % 256 = 0, 32, 96, 160, 224 (a last CTA with 8, 1, 3, 5,
   7 warps of tiles), 4160 x 8224 (several waves of CTAs), and 65537 row blocks of 32 columns (past
   the grid's y limit: the row blocks along x). Each input holds an all-zero columnwise block and
   special values (input()), so that warps take the packed forms, the fast forms and the rule. Usage
   columnwise, and both directions where the rowwise copy (identity) is made beside it. */
static void test_columnwise_alone(void **state) {
  (void)state;
  cols_only = 1;
  const int64_t shapes[][2] = {{64, 256}, {96, 288}, {32, 352}, {160, 416}, {64, 480},
                               {1024, 1056}};
  const hq_dtype dts[2] = {HQ_BF16, HQ_F16};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int kind = 0; kind < 3; kind++)
      for (int rceil = 0; rceil < 2; rceil++)
        for (int d = 0; d < 2; d++)
          one(kind, rceil, 0, dts[d], shapes[s][0], shapes[s][1], s == 1 ? HQ_BOTH : HQ_COLWISE,
              0);
  for (int kind = 0; kind < 3; kind++)
    for (int rceil = 0; rceil < 2; rceil++)
      one(kind, rceil, 0, dts[(kind + rceil) % 2], 4160, 8224, HQ_COLWISE, 0);
  for (int kind = 0; kind < 3; kind++)
    one(kind, kind == 1, 0, dts[kind % 2], 32 * 65537, 32, kind == 2 ? HQ_BOTH : HQ_COLWISE, 0);
  cols_only = 0;
}

/* Dequantize of storages whose bytes are written here, not by quantize: every code at every
   position of a pair of codes, every scale code 0..255 (0xFF NaN, 0 the subnormal 2^-127, 254
   past BF16's range) in both directions, on both sides into f32 / bf16 / f16, byte for byte
   (the CPU reference is the oracle); destinations aligned (the vector kernel) and one element
   off (the scalar one). */
static void test_dequantize_every_byte(void **state) {
  (void)state;
  const int64_t M = 256, K = 1024;
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int kind = 0; kind < 3; kind++) {
    hq_recipe *r = recipe(kind, 0, 0);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_tensor h = hq_test_tensor(HQ_F32, M, K, 4242, 1.0f);
    hq_tensor g = hq_gpu_tensor_at(gpu, &h, 0);
    hq_qtensor *qh = NULL, *qg = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &h, &qh));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &g, &qg));
    for (uint32_t d = 1; d <= 2; d++) {
      const hq_storage *sh = hq_qtensor_storage(qh, d), *sg = hq_qtensor_storage(qg, d);
      const uint32_t roles[2] = {HQ_ROLE_DATA, HQ_ROLE_SCALE};
      for (int b = 0; b < 2; b++) {
        const hq_buffer *bh = hq_gpu_buf_of(sh, roles[b]), *bg = hq_gpu_buf_of(sg, roles[b]);
        assert_int_equal(bh->bytes, bg->bytes);
        uint8_t *p = bh->ptr;
        /* scales: byte n is n mod 256; codes: an LCG's bytes (every code pair shows up) */
        uint64_t st = 99 + d;
        for (size_t n = 0; n < bh->bytes; n++)
          p[n] = b ? (uint8_t)(n * (d == 1 ? 1 : 7)) : (uint8_t)(hq_test_rand(&st) >> 24);
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, bg->ptr, hq_ctx_device(gpu), p, HQ_DEVICE_HOST,
                                    bh->bytes));
      }
      for (int o = 0; o < 3; o++)
        for (int shift = 0; shift < 2; shift++) {
          hq_tensor yh = hq_test_empty(outs[o], M, K), yg0 = hq_test_empty(outs[o], M, K);
          const int dshift = shift * (int)hq_dtype_size(outs[o]);
          hq_tensor yg = hq_gpu_tensor_at(gpu, &yg0, dshift);
          HQ_OK_OR_FAIL(hq_dequantize(qh, cpu, d, &yh));
          HQ_OK_OR_FAIL(hq_dequantize(qg, gpu, d, &yg));
          const size_t es = hq_dtype_size(outs[o]), n = (size_t)(M * K) * es;
          HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, yg0.data, HQ_DEVICE_HOST, yg.data, 0, n));
          HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
          for (size_t e = 0; e < (size_t)(M * K); e++)
            if (memcmp((char *)yh.data + e * es, (char *)yg0.data + e * es, es)) {
              uint32_t vh = 0, vg = 0;
              memcpy(&vh, (char *)yh.data + e * es, es);
              memcpy(&vg, (char *)yg0.data + e * es, es);
              fail_msg("kind %d dir %u dtype %d shift %d: element [%lld, %lld] host 0x%x device "
                       "0x%x", kind, d, (int)outs[o], shift, (long long)(e / (size_t)K),
                       (long long)(e % (size_t)K), vh, vg);
            }
          hq_ctx_free(gpu, (char *)yg.data - dshift);
          free(yh.data);
          free(yg0.data);
        }
    }
    printf("dequantize every byte: kind %d, both directions, f32 / bf16 / f16: equal\n", kind);
    hq_qtensor_free(qh);
    hq_qtensor_free(qg);
    hq_ctx_free(gpu, g.data);
    free(h.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_option),
      cmocka_unit_test(test_raw_copy),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_many_tiles),
      cmocka_unit_test(test_columnwise_alone),
      cmocka_unit_test(test_dequantize_every_byte),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
