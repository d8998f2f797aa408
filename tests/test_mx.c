/*
** test_mx.c -- the mxfp4 and mxfp6 plugins through the public API: torchao's to_mx vectors
** (tests/mx_vectors.h, made by tests/gen_mx_vectors.py) byte for byte in both directions, for
** every element type and both scale rules; the buffer table; hand-computed specials (NaN and Inf
** blocks); dequantize against the rule computed here; stochastic rounding's determinism and
** unbiasedness; shape errors; raw_copy's BF16 raw values against the rule and the dequantize.
*/
#include <math.h>

#include "hq_test.h"

#include "mx_vectors.h"

static hq_ctx *make_ctx(void) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  return ctx;
}

/* kind: 0 E2M1 (mxfp4), 1 E3M2, 2 E2M3 (mxfp6) */
static hq_recipe *recipe(int kind, const char *rule, const char *extra) {
  char text[512];
  snprintf(text, sizeof text,
           "[format f]\nplugin = %s\n%sscale = %s\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n",
           kind ? "mxfp6" : "mxfp4", kind == 1 ? "elem = e3m2\n" : kind == 2 ? "elem = e2m3\n" : "",
           rule, extra ? extra : "");
  return hq_test_recipe(text);
}

static hq_qtensor *quantize(hq_recipe *r, hq_ctx *ctx, const hq_tensor *x, uint32_t dirs) {
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, dirs));
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, x, &qt));
  hq_quantizer_free(q);
  return qt;
}

static const hq_buffer *buf(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  if (!s) fail_msg("no storage");
  return hq_storage_cbuf(s, i);
}

static void same_bytes(const hq_buffer *b, const uint8_t *want, size_t n, const char *what) {
  assert_int_equal(b->bytes, n);
  const uint8_t *p = b->ptr;
  for (size_t i = 0; i < n; i++)
    if (p[i] != want[i]) fail_msg("%s: byte %zu is 0x%02x, torchao 0x%02x", what, i, p[i], want[i]);
}

typedef struct vec {
  const uint8_t *rs, *rd, *cs, *cd;
} vec;

#define VEC(k, r) {mxv_##k##_##r##_row_scale, mxv_##k##_##r##_row_data, \
                   mxv_##k##_##r##_col_scale, mxv_##k##_##r##_col_data}

static void test_torchao_vectors(void **state) {
  (void)state;
  const vec v[3][2] = {{VEC(e2m1, floor), VEC(e2m1, rceil)},
                       {VEC(e3m2, floor), VEC(e3m2, rceil)},
                       {VEC(e2m3, floor), VEC(e2m3, rceil)}};
  const uint32_t *x[2] = {mxv_x_floor, mxv_x_rceil};
  const char *rules[2] = {"floor", "rceil"};
  hq_ctx *ctx = make_ctx();
  for (int k = 0; k < 3; k++)
    for (int r = 0; r < 2; r++)
      for (uint32_t dirs = 1; dirs <= 3; dirs++) {
        hq_tensor t = hq_tensor_2d((void *)x[r], HQ_F32, HQ_DEVICE_HOST, MXV_M, MXV_K);
        hq_recipe *rc = recipe(k, rules[r], NULL);
        hq_qtensor *qt = quantize(rc, ctx, &t, dirs);
        const size_t db = (size_t)MXV_M * (k ? MXV_K / 4 * 3 : MXV_K / 2);
        char what[64];
        snprintf(what, sizeof what, "kind %d %s dirs %u", k, rules[r], dirs);
        if (dirs & HQ_ROWWISE) {
          same_bytes(buf(qt, HQ_ROWWISE, 1), v[k][r].rs, MXV_M * MXV_K / 32, what);
          same_bytes(buf(qt, HQ_ROWWISE, 0), v[k][r].rd, db, what);
        }
        if (dirs & HQ_COLWISE) {
          same_bytes(buf(qt, HQ_COLWISE, 1), v[k][r].cs, MXV_M * MXV_K / 32, what);
          same_bytes(buf(qt, HQ_COLWISE, 0), v[k][r].cd, db, what);
        }
        /* a BF16 copy of an input whose values are BF16 gives the same bytes: not tested here
           (the vectors are FP32); dequantize follows the rule */
        hq_tensor y = hq_test_empty(HQ_F32, MXV_M, MXV_K);
        for (uint32_t dir = 1; dir <= 2; dir++) {
          if (!(dirs & dir)) continue;
          HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, dir, &y));
          const hq_buffer *d = buf(qt, dir, 0), *s = buf(qt, dir, 1);
          const int kind = d->dtype;
          for (int64_t i = 0; i < MXV_M; i++)
            for (int64_t j = 0; j < MXV_K; j++) {
              const uint8_t *row = (const uint8_t *)d->ptr + i * (d->bytes / MXV_M);
              const uint32_t code = kind == HQ_E2M1X2 ? (row[j / 2] >> (4 * (j % 2))) & 15u
                                                      : hq_fp6_code(row, j);
              const uint8_t e = ((const uint8_t *)s->ptr)[dir == HQ_ROWWISE
                                                              ? i * (MXV_K / 32) + j / 32
                                                              : (i / 32) * MXV_K + j];
              const float el = kind == HQ_E2M1X2 ? hq_e2m1_to_f32(code) : hq_fp6_to_f32(code, kind);
              const float want = el * hq_e8m0_to_f32(e);
              const float got = ((float *)y.data)[i * MXV_K + j];
              if (hq_f32_bits(got) != hq_f32_bits(want))
                fail_msg("%s: dequantize (%lld, %lld) = %g, want %g", what, (long long)i,
                         (long long)j, got, want);
            }
        }
        free(y.data);
        hq_qtensor_free(qt);
        hq_recipe_free(rc);
      }
  hq_ctx_destroy(ctx);
}

/* raw_copy = bf16: each storage gains "raw" / "columnwise_raw" (role RAW, BF16 [M, K], gathered
   by rows) holding bf16(elem(q) * 2^(e - 127)) of its own codes and scales, the bytes
   hq_dequantize writes into BF16; an update rewrites it. Every element kind, both scale rules,
   with and without stochastic rounding, NaN / Inf blocks among the values. */
static void test_raw_copy(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t M = 64, K = 96;
  const char *rules[2] = {"floor", "rceil"};
  for (int k = 0; k < 3; k++)
    for (int r = 0; r < 2; r++)
      for (int sr = 0; sr < 2; sr++) {
        hq_recipe *rc = recipe(k, rules[r], sr ? "raw_copy = bf16\nstochastic_rounding = true\n"
                                                  "seed = 5"
                                               : "raw_copy = bf16");
        hq_tensor t = hq_test_tensor(HQ_F32, M, K, 30 + (uint64_t)(k * 4 + r * 2 + sr), 3.0f);
        float *tf = t.data;
        tf[5] = NAN;
        tf[K + 40] = INFINITY;
        tf[3 * K + 7] = ldexpf(1.0f, -130);
        hq_tensor t2 = hq_test_tensor(HQ_F32, M, K, 90 + (uint64_t)k, 0.01f);
        hq_qtensor *qt = quantize(rc, ctx, &t, HQ_BOTH);
        for (int pass = 0; pass < 2; pass++) {
          if (pass) HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &t2));
          char what[96];
          snprintf(what, sizeof what, "kind %d %s sr %d pass %d", k, rules[r], sr, pass);
          for (uint32_t dir = 1; dir <= 2; dir++) {
            const hq_storage *st = hq_qtensor_storage(qt, dir);
            assert_int_equal(st->nbuf, 3);
            const hq_buffer *d = buf(qt, dir, 0), *sc = buf(qt, dir, 1), *rb = buf(qt, dir, 2);
            assert_string_equal(rb->name, dir == HQ_ROWWISE ? "raw" : "columnwise_raw");
            assert_int_equal(rb->role, HQ_ROLE_RAW);
            assert_int_equal(rb->dtype, HQ_BF16);
            assert_int_equal(rb->shape[0], M);
            assert_int_equal(rb->shape[1], K);
            assert_int_equal(rb->gather, HQ_GATHER_ROWS);
            assert_int_equal(rb->m_div, 1);
            assert_int_equal(rb->bytes, (size_t)(M * K) * 2);
            const int kind = d->dtype;
            for (int64_t i = 0; i < M; i++)
              for (int64_t j = 0; j < K; j++) {
                const uint8_t *row = (const uint8_t *)d->ptr + i * (d->bytes / M);
                const uint32_t code = kind == HQ_E2M1X2 ? (row[j / 2] >> (4 * (j % 2))) & 15u
                                                        : hq_fp6_code(row, j);
                const uint8_t e = ((const uint8_t *)sc->ptr)[dir == HQ_ROWWISE
                                                                 ? i * (K / 32) + j / 32
                                                                 : (i / 32) * K + j];
                const float el =
                    kind == HQ_E2M1X2 ? hq_e2m1_to_f32(code) : hq_fp6_to_f32(code, kind);
                const float want = e == 0xFF ? NAN : el * hq_e8m0_to_f32(e);
                const uint16_t wb = hq_f32_to_bf16(want);
                const uint16_t gb = ((const uint16_t *)rb->ptr)[i * K + j];
                if (wb != gb && !(isnan(want) && (gb & 0x7fffu) > 0x7f80u))
                  fail_msg("%s dir %u: raw (%lld, %lld) = %04x, want %04x", what, dir,
                           (long long)i, (long long)j, gb, wb);
              }
            hq_tensor yb = hq_test_empty(HQ_BF16, M, K);
            HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, dir, &yb));
            assert_memory_equal(yb.data, rb->ptr, (size_t)(M * K) * 2);
            free(yb.data);
          }
        }
        hq_qtensor_free(qt);
        free(t.data);
        free(t2.data);
        hq_recipe_free(rc);
      }
  /* without the option: two buffers a storage, as before */
  hq_recipe *rc = recipe(0, "floor", NULL);
  hq_tensor t = hq_test_tensor(HQ_F32, M, K, 3, 1.0f);
  hq_qtensor *qt = quantize(rc, ctx, &t, HQ_BOTH);
  assert_int_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->nbuf, 2);
  hq_qtensor_free(qt);
  free(t.data);
  hq_recipe_free(rc);
  hq_ctx_destroy(ctx);
}

/* The buffer table of docs/formats.md: names, dtypes, shapes, descriptor. */
static void test_layout(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const hq_dtype kinds[3] = {HQ_E2M1X2, HQ_E3M2X4, HQ_E2M3X4};
  for (int k = 0; k < 3; k++) {
    hq_recipe *rc = recipe(k, "floor", NULL);
    hq_tensor t = hq_test_tensor(HQ_BF16, 64, 96, 1, 1.0f);
    hq_qtensor *qt = quantize(rc, ctx, &t, HQ_BOTH);
    const int64_t rb = k ? 96 / 4 * 3 : 48;
    const hq_storage *r = hq_qtensor_storage(qt, HQ_ROWWISE), *c = hq_qtensor_storage(qt, HQ_COLWISE);
    assert_string_equal(buf(qt, HQ_ROWWISE, 0)->name, "data");
    assert_int_equal(buf(qt, HQ_ROWWISE, 0)->dtype, kinds[k]);
    assert_int_equal(buf(qt, HQ_ROWWISE, 0)->shape[0], 64);
    assert_int_equal(buf(qt, HQ_ROWWISE, 0)->shape[1], rb);
    assert_int_equal(buf(qt, HQ_ROWWISE, 0)->bytes, 64 * rb);
    assert_string_equal(buf(qt, HQ_ROWWISE, 1)->name, "scale_inv");
    assert_int_equal(buf(qt, HQ_ROWWISE, 1)->dtype, HQ_E8M0);
    assert_int_equal(buf(qt, HQ_ROWWISE, 1)->shape[0], 64);
    assert_int_equal(buf(qt, HQ_ROWWISE, 1)->shape[1], 3);
    assert_string_equal(buf(qt, HQ_COLWISE, 0)->name, "columnwise_data");
    assert_int_equal(buf(qt, HQ_COLWISE, 0)->shape[1], rb);
    assert_string_equal(buf(qt, HQ_COLWISE, 1)->name, "columnwise_scale_inv");
    assert_int_equal(buf(qt, HQ_COLWISE, 1)->shape[0], 2);
    assert_int_equal(buf(qt, HQ_COLWISE, 1)->shape[1], 96);
    assert_int_equal(r->desc.elem, kinds[k]);
    assert_int_equal(r->desc.scale_mode, HQ_SCALE_VEC32_UE8M0);
    assert_int_equal(r->desc.block_m, 1);
    assert_int_equal(r->desc.block_k, 32);
    assert_int_equal(c->desc.block_m, 32);
    assert_int_equal(c->desc.block_k, 1);
    assert_int_equal(c->desc.order, HQ_ORDER_MK);
    assert_int_equal(r->desc.shard_rows, 32);
    assert_int_equal(r->desc.emul_dtype, HQ_BF16);
    hq_qtensor_free(qt);
    free(t.data);
    hq_recipe_free(rc);
  }
  hq_ctx_destroy(ctx);
}

/* A NaN anywhere makes its block's scale 0xFF: finite elements +-0, NaN and Inf +max; a block
   with Inf (no NaN) saturates the Inf to max, the rest underflow to zero (FLOOR code 253). */
static void test_specials(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  float x[32 * 64];
  for (int i = 0; i < 32 * 64; i++) x[i] = 1.0f;
  x[0] = NAN;
  x[1] = -2.0f;
  x[2] = INFINITY;
  x[64 + 32] = INFINITY; /* row 1, second block */
  x[64 + 33] = -3.0f;
  hq_tensor t = hq_tensor_2d(x, HQ_F32, HQ_DEVICE_HOST, 32, 64);
  hq_recipe *rc = recipe(0, "floor", NULL);
  hq_qtensor *qt = quantize(rc, ctx, &t, HQ_ROWWISE);
  const uint8_t *d = buf(qt, HQ_ROWWISE, 0)->ptr, *s = buf(qt, HQ_ROWWISE, 1)->ptr;
  assert_int_equal(s[0], 0xFF);
  assert_int_equal(d[0], 0x87); /* NaN -> +6 (7), -2 -> -0 (8) */
  assert_int_equal(d[1], 0x07); /* Inf * 0 = NaN -> +6, 1 -> +0 */
  assert_int_equal(d[2], 0x00);
  assert_int_equal(s[1], 125); /* amax 1.0: E(1) = 127, minus emax 2 */
  assert_int_equal(s[3], 253); /* row 1, second block: amax Inf, E = 255 - 2 */
  assert_int_equal(d[32 + 16], 0x87); /* Inf * 2^-126 -> +6, -3 * 2^-126 -> -0 */
  hq_qtensor_free(qt);
  hq_recipe_free(rc);
  hq_ctx_destroy(ctx);
}

/* Stochastic rounding: the same seed and RNG offset give the same bytes; across seeds the mean of the
   dequantized values of a constant block is the value (unbiased) within sampling error. */
static void test_stochastic(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  float x[32 * 32];
  for (int i = 0; i < 32 * 32; i++) x[i] = i == 0 ? 6.0f : 1.25f; /* between 1 and 1.5 */
  hq_tensor t = hq_tensor_2d(x, HQ_F32, HQ_DEVICE_HOST, 32, 32);
  double sum = 0;
  int n = 0;
  for (int seed = 1; seed <= 8; seed++) {
    char extra[64];
    snprintf(extra, sizeof extra, "stochastic_rounding = true\nseed = %d", seed);
    hq_recipe *rc = recipe(0, "floor", extra);
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 5));
    hq_qtensor *a = quantize(rc, ctx, &t, HQ_BOTH);
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 5));
    hq_qtensor *b = quantize(rc, ctx, &t, HQ_BOTH);
    assert_int_equal(hq_qtensor_storage(a, HQ_ROWWISE)->desc.shard_rows, 0);
    hq_test_same_qtensors(a, b, "same seed, same bytes");
    hq_tensor y = hq_test_empty(HQ_F32, 32, 32);
    HQ_OK_OR_FAIL(hq_dequantize(a, ctx, HQ_ROWWISE, &y));
    for (int i = 1; i < 32 * 32; i++) {
      const float v = ((float *)y.data)[i];
      if (v != 1.0f && v != 1.5f) fail_msg("SR of 1.25 gave %g", v);
      sum += v, n++;
    }
    free(y.data);
    hq_qtensor_free(a);
    hq_qtensor_free(b);
    hq_recipe_free(rc);
  }
  assert_true(fabs(sum / n - 1.25) < 0.01); /* 8184 draws: sd of the mean 0.0028 */
  hq_ctx_destroy(ctx);
}

static void test_shape_errors(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  hq_recipe *rc = recipe(1, "floor", NULL);
  hq_quantizer *q = hq_test_quantizer(rc, "linear:weight:w");
  hq_tensor t = hq_test_tensor(HQ_F32, 32, 48, 1, 1.0f);
  hq_qtensor *qt = NULL;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_ESHAPE);
  HQ_ERROR_HAS("mxfp6: cols = 48 is not a multiple of 32");
  free(t.data);
  hq_quantizer_free(q);
  hq_recipe_free(rc);
  hq_ctx_destroy(ctx);
}

/* The emulated GEMM (the host path) multiplies the dequantized values: an mxfp4 A against an
   mxfp6 B, every transpose pair, equals the F64 product of the dequantized operands within FP32
   accumulation error. */
static void test_gemm_host(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  hq_recipe *r = hq_test_recipe("[format a]\nplugin = mxfp4\n[format b]\nplugin = mxfp6\n"
                                "elem = e3m2\n[role linear:weight:*]\nrowwise = a\n"
                                "columnwise = a\n[role linear:input:*]\nrowwise = b\n"
                                "columnwise = b\n");
  hq_quantizer *qa = hq_test_quantizer(r, "linear:weight:w");
  hq_quantizer *qb = hq_test_quantizer(r, "linear:input:x");
  const int64_t m = 64, n = 32, k = 96;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      const int64_t A0 = ta ? m : k, A1 = ta ? k : m, B0 = tb ? k : n, B1 = tb ? n : k;
      hq_tensor ha = hq_test_tensor(HQ_F32, A0, A1, 7, 1.0f);
      hq_tensor hb = hq_test_tensor(HQ_BF16, B0, B1, 8, 3.0f);
      hq_qtensor *A = NULL, *B = NULL;
      HQ_OK_OR_FAIL(hq_quantize(qa, ctx, &ha, &A));
      HQ_OK_OR_FAIL(hq_quantize(qb, ctx, &hb, &B));
      hq_tensor a = hq_test_empty(HQ_F32, A0, A1), b = hq_test_empty(HQ_F32, B0, B1);
      HQ_OK_OR_FAIL(hq_dequantize(A, ctx, ta ? HQ_ROWWISE : HQ_COLWISE, &a));
      HQ_OK_OR_FAIL(hq_dequantize(B, ctx, tb ? HQ_COLWISE : HQ_ROWWISE, &b));
      hq_tensor d = hq_test_empty(HQ_F32, n, m);
      hq_gemm_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, 1.0f, 0.0f, NULL,
                            &info));
      assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
      assert_string_equal(info.format_a, "mxfp4");
      assert_string_equal(info.format_b, "mxfp6");
      const float *af = a.data, *bf = b.data;
      for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
          double s = 0, sa = 0;
          for (int64_t p = 0; p < k; p++) {
            const double x = ta ? af[i * A1 + p] : af[p * A1 + i];
            const double y = tb ? bf[p * B1 + j] : bf[j * B1 + p];
            s += x * y, sa += fabs(x * y);
          }
          const double got = ((const float *)d.data)[j * m + i];
          if (!(fabs(got - s) <= (double)(k + 8) * 0x1p-23 * sa + 1e-30))
            fail_msg("%c%c: D[%lld][%lld] = %.9g, F64 %.9g", ta ? 'T' : 'N', tb ? 'T' : 'N',
                     (long long)j, (long long)i, got, s);
        }
      hq_qtensor_free(A);
      hq_qtensor_free(B);
      free(ha.data), free(hb.data), free(a.data), free(b.data), free(d.data);
    }
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_torchao_vectors), cmocka_unit_test(test_layout),
      cmocka_unit_test(test_specials),        cmocka_unit_test(test_stochastic),
      cmocka_unit_test(test_shape_errors),    cmocka_unit_test(test_gemm_host),
      cmocka_unit_test(test_raw_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
