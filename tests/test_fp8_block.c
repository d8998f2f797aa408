/*
** test_fp8_block.c -- the fp8_block format (FORMATS.md 4) through the public API (a recipe, a
** quantizer, hq_quantize / hq_dequantize) and the FP8-block helpers of hq/numerics.h, each
** against an expectation written here: hand-computed blocks (outliers, zeros, NaN/Inf, exact
** powers, tiny amax and the input dtype's value_for_inf, the epsilon floor, E5M2), scale-buffer
** layouts from index formulas written out in this file, and a brute-force reference (per-element
** block membership, TE's scale rule restated with frexp, a nearest-code FP8 encoder) over odd
** shapes, every option combination and every input dtype.
*/
#include <dlfcn.h>
#include <float.h>
#include <math.h>

#include "hq_test.h"
#include "fp8_ref.h"

#define BLK 128

// --- independent reference ---------------------------------------------------------------------

/* The input dtype's largest finite value, TE's value_for_inf for FP8 block scaling. */
static float ref_vinf(hq_dtype t) {
  return t == HQ_BF16 ? 0x1.FEp127f : t == HQ_F16 ? 65504.0f : FLT_MAX;
}

/* TE compute_scale_from_amax restated: epsilon floor, 0/Inf/NaN -> 1, RN division, overflow ->
   value_for_inf, pow2 -> the largest power of two not above the scale. */
static float ref_scale(float amax, int kind, int pow2, float eps, hq_dtype in) {
  if (amax < eps) amax = eps;
  if (amax == 0.0f || isinf(amax) || isnan(amax)) return 1.0f;
  float s = (float)((float)ref_fp8_max(kind) / amax);
  if (isinf(s)) s = ref_vinf(in);
  if (pow2) {
    int e;
    frexpf(s, &e);
    s = ldexpf(1.0f, e - 1);
  }
  return s;
}

static float ref_rcp(float s) { return (float)(1.0 / (double)s); }

/* RN(x * s) via an exact double product. */
static float ref_mul(float x, float s) { return (float)((double)x * (double)s); }

static int64_t r4(int64_t n) { return (n + 3) / 4 * 4; }
static int64_t nb(int64_t n) { return (n + BLK - 1) / BLK; }

/* The GEMM-ready scale layouts of FORMATS.md 4.3, written out per direction and block shape:
   [rows x cols] of the buffer and the index of the block holding element (m, k). */
static void ref_scale_dims(int64_t M, int64_t K, int col, int two_d, int64_t *rows, int64_t *cols,
                           int64_t *used) {
  if (!col && !two_d) *rows = nb(K), *used = M;          /* [Kb][r4(M)] */
  else if (!col && two_d) *rows = nb(M), *used = nb(K);  /* [Mb][r4(Kb)] */
  else if (col && !two_d) *rows = nb(M), *used = K;      /* [Mb][r4(K)] */
  else *rows = nb(K), *used = nb(M);                     /* [Kb][r4(Mb)] */
  *cols = r4(*used);
}

static int64_t ref_scale_at(int64_t m, int64_t k, int64_t M, int64_t K, int col, int two_d) {
  if (!col && !two_d) return (k / BLK) * r4(M) + m;
  if (!col && two_d) return (m / BLK) * r4(nb(K)) + k / BLK;
  if (col && !two_d) return (m / BLK) * r4(K) + k;
  return (k / BLK) * r4(nb(M)) + m / BLK;
}

// --- helpers ---------------------------------------------------------------------------------

typedef struct opts {
  int two_d, kind, pow2;
  float eps;
} opts;

static hq_recipe *recipe_for(opts o) {
  char text[400];
  snprintf(text, sizeof text,
           "[format fb]\nplugin = fp8_block\nblock = %s\ndtype = %s\npower_2_scales = %s\n"
           "amax_epsilon = %.9g\n[role *:*:*]\nrowwise = fb\ncolumnwise = fb\n",
           o.two_d ? "2d" : "1d", o.kind ? "e5m2" : "e4m3", o.pow2 ? "true" : "false",
           (double)o.eps);
  return hq_test_recipe(text);
}

typedef struct run {
  hq_recipe *r;
  hq_quantizer *q;
  hq_ctx *ctx;
  hq_qtensor *qt;
} run;

static run quantize_with(opts o, const hq_tensor *x, uint32_t usage) {
  run u = {0};
  u.r = recipe_for(o);
  u.q = hq_test_quantizer(u.r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(u.q, usage));
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &u.ctx));
  HQ_OK_OR_FAIL(hq_quantize(u.q, u.ctx, x, &u.qt));
  return u;
}

static void run_free(run *u) {
  hq_qtensor_free(u->qt);
  hq_quantizer_free(u->q);
  hq_ctx_destroy(u->ctx);
  hq_recipe_free(u->r);
}

static const uint8_t *data_of(const run *u, uint32_t dir) {
  return hq_qtensor_storage(u->qt, dir)->buf[0].ptr;
}
static const float *scales_of(const run *u, uint32_t dir) {
  return hq_qtensor_storage(u->qt, dir)->buf[1].ptr;
}

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Bit-exact float comparison (NaN never expected here). */
#define ASSERT_F32_SAME(got, want)                                                            \
  do {                                                                                        \
    float g_ = (got), w_ = (want);                                                            \
    if (fbits(g_) != fbits(w_)) fail_msg("%s = %a, expected %a", #got, (double)g_, (double)w_); \
  } while (0)

/* A 1-row f32 tensor with the given values (the rest of the row 0). */
static hq_tensor row_f32(int64_t K, const float *v, int n) {
  hq_tensor x = hq_test_empty(HQ_F32, 1, K);
  for (int i = 0; i < n; i++) ((float *)x.data)[i] = v[i];
  return x;
}

// --- options, recipes, layout ------------------------------------------------------------------

static void test_options_defaults(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format fb]\nplugin = fp8_block\n[role *:*:*]\nrowwise = fb\n");
  hq_format_info fi;
  int found = 0;
  for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
    HQ_OK_OR_FAIL(hq_recipe_format_info(r, i, &fi));
    if (strcmp(fi.name, "fb") != 0) continue;
    found = 1;
    const char *want[][2] = {{"block", "1d"}, {"dtype", "e4m3"}, {"power_2_scales", "true"},
                             {"amax_epsilon", "0"}};
    assert_int_equal(fi.n_options, 4);
    for (size_t j = 0; j < 4; j++) {
      assert_string_equal(fi.option_names[j], want[j][0]);
      assert_string_equal(fi.option_values[j], want[j][1]);
    }
  }
  assert_true(found);
  hq_recipe_free(r);
}

/* Every bad key or value is reported with file:line and what is wrong. */
static void test_option_errors(void **state) {
  (void)state;
  struct { const char *line; const char *needle; } bad[] = {
      {"blocks = 1d", "unknown option 'blocks'"},
      {"block = 3d", "block"},
      {"dtype = e4m3fn", "dtype"},
      {"power_2_scales = maybe", "power_2_scales"},
      {"power_2_scale = true", "unknown option 'power_2_scale'"},
      {"amax_epsilon = -1", "amax_epsilon"},
      {"amax_epsilon = nan", "amax_epsilon"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "[format fb]\nplugin = fp8_block\n%s\n[role *:*:*]\nrowwise = fb\n",
             bad[i].line);
    hq_recipe_opts o = {0};
    o.struct_size = sizeof o;
    o.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
    hq_recipe *r = NULL;
    HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "test.ini", &o, &r));
    if (hq_recipe_error_count(r) == 0) fail_msg("'%s' was accepted", bad[i].line);
    const char *e = hq_recipe_error(r, 0);
    if (strncmp(e, "test.ini:3: ", 12) != 0 || !strstr(e, bad[i].needle))
      fail_msg("'%s': error '%s' lacks test.ini:3 or '%s'", bad[i].line, e, bad[i].needle);
    hq_recipe_free(r);
  }
}

/* The described buffers (names, dtypes, shapes, flags) of both directions, all block shapes. */
static void test_layout_description(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{130, 202}, {1, 1}, {256, 512}, {127, 129}};
  for (size_t s = 0; s < 4; s++)
    for (int two_d = 0; two_d < 2; two_d++)
      for (int kind = 0; kind < 2; kind++) {
        const int64_t M = shapes[s][0], K = shapes[s][1];
        hq_tensor x = hq_test_tensor(HQ_F32, M, K, 1, 1.0f);
        run u = quantize_with((opts){two_d, kind, 1, 0}, &x, HQ_BOTH);
        for (int col = 0; col < 2; col++) {
          const hq_storage *st = hq_qtensor_storage(u.qt, col ? HQ_COLWISE : HQ_ROWWISE);
          assert_non_null(st);
          assert_int_equal(st->nbuf, 2);
          const hq_buffer *d = &st->buf[0], *sc = &st->buf[1];
          assert_string_equal(d->name, col ? "columnwise_data" : "data");
          assert_int_equal(d->dtype, kind ? HQ_E5M2 : HQ_E4M3);
          assert_int_equal(d->ndim, 2);
          assert_int_equal(d->shape[0], col ? K : M);
          assert_int_equal(d->shape[1], col ? M : K);
          assert_int_equal(d->flags, col ? 0u : HQ_BUF_SHARDED);
          assert_string_equal(sc->name, col ? "columnwise_scale_inv" : "scale_inv");
          assert_int_equal(sc->dtype, HQ_F32);
          assert_int_equal(sc->ndim, 2);
          int64_t rows, cols, used;
          ref_scale_dims(M, K, col, two_d, &rows, &cols, &used);
          assert_int_equal(sc->shape[0], rows);
          assert_int_equal(sc->shape[1], cols);
          /* dim 0 runs along M: 2-D rowwise (M blocks) and 1-D columnwise (M blocks) */
          assert_int_equal(sc->flags, (two_d && !col) || (!two_d && col) ? HQ_BUF_SHARDED : 0u);
          assert_int_equal(sc->bytes, (size_t)(rows * cols * 4));
        }
        run_free(&u);
        free(x.data);
      }
}

/* The numerics.h index and shape functions against the formulas written out here. */
static void test_index_functions(void **state) {
  (void)state;
  const int64_t dims[] = {1, 2, 3, 4, 5, 127, 128, 129, 255, 256, 257, 385, 1000};
  const size_t nd = sizeof dims / sizeof dims[0];
  for (size_t a = 0; a < nd; a++)
    for (size_t b = 0; b < nd; b++) {
      const int64_t M = dims[a], K = dims[b];
      for (int col = 0; col < 2; col++)
        for (int two_d = 0; two_d < 2; two_d++) {
          int64_t d0, d1, n1, rows, cols, used;
          hq_fp8b_scale_shape(M, K, col, two_d, &d0, &d1, &n1);
          ref_scale_dims(M, K, col, two_d, &rows, &cols, &used);
          assert_int_equal(d0, rows);
          assert_int_equal(d1, cols);
          assert_int_equal(n1, used);
          for (int64_t m = 0; m < M; m += (M > 300 ? 7 : 1))
            for (int64_t k = 0; k < K; k += (K > 300 ? 11 : 1)) {
              int64_t i = hq_fp8b_scale_index(m, k, M, K, col, two_d);
              assert_int_equal(i, ref_scale_at(m, k, M, K, col, two_d));
              assert_true(i >= 0 && i < d0 * d1 && i % d1 < n1);
            }
        }
    }
  /* the four named functions are the ones the dispatcher picks */
  assert_int_equal(hq_fp8b_row1d_index(5, 300, 6), 2 * 8 + 5);
  assert_int_equal(hq_fp8b_row2d_index(300, 300, 1000), 2 * 8 + 2);
  assert_int_equal(hq_fp8b_col1d_index(300, 5, 6), 2 * 8 + 5);
  assert_int_equal(hq_fp8b_col2d_index(300, 300, 1000), 2 * 8 + 2);
}

// --- hand-built blocks -------------------------------------------------------------------------

/* Quantize one [1, n] f32 row with 1-D blocks; returns the run (rowwise data/scale). */
static run one_row(opts o, hq_tensor *x) { return quantize_with(o, x, HQ_ROWWISE); }

static void test_outlier(void **state) {
  (void)state;
  float v[128];
  for (int i = 0; i < 128; i++) v[i] = 0.01f;
  v[5] = 3.0f;
  hq_tensor x = row_f32(128, v, 128);
  /* pow2: 448/3 = 149.3 -> 128; 3*128 = 384 = 0x7C; 0.01*128 = 1.28 -> 1.25 = 0x3A */
  run u = one_row((opts){0, 0, 1, 0}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], 0.0078125f);
  for (int i = 0; i < 128; i++) assert_int_equal(data_of(&u, HQ_ROWWISE)[i], i == 5 ? 0x7c : 0x3a);
  run_free(&u);
  /* FP32 scales: 448/3; the outlier lands on 448 = 0x7E; 0.01*149.3 = 1.493 -> 1.5 = 0x3C */
  u = one_row((opts){0, 0, 0, 0}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(448.0f / 3.0f));
  for (int i = 0; i < 128; i++) assert_int_equal(data_of(&u, HQ_ROWWISE)[i], i == 5 ? 0x7e : 0x3c);
  run_free(&u);
  free(x.data);
}

static void test_all_zeros(void **state) {
  (void)state;
  for (int two_d = 0; two_d < 2; two_d++)
    for (int pow2 = 0; pow2 < 2; pow2++) {
      hq_tensor x = hq_test_empty(HQ_F32, 3, 130);
      run u = quantize_with((opts){two_d, 0, pow2, 0}, &x, HQ_BOTH);
      for (int col = 0; col < 2; col++) {
        uint32_t dir = col ? HQ_COLWISE : HQ_ROWWISE;
        int64_t rows, cols, used;
        ref_scale_dims(3, 130, col, two_d, &rows, &cols, &used);
        for (int64_t i = 0; i < rows * cols; i++)
          ASSERT_F32_SAME(scales_of(&u, dir)[i], (i % cols) < used ? 1.0f : 0.0f);
        for (int i = 0; i < 3 * 130; i++) assert_int_equal(data_of(&u, dir)[i], 0);
      }
      run_free(&u);
      free(x.data);
    }
}

static void test_nan_inf_in_block(void **state) {
  (void)state;
  /* NaN is ignored by amax: amax 2 -> 224 -> pow2 128; 2*128 = 256 = 0x78; 0.5*128 = 64 = 0x68 */
  float v[128];
  for (int i = 0; i < 128; i++) v[i] = 0.5f;
  v[0] = 2.0f;
  v[1] = NAN;
  v[2] = -NAN;
  hq_tensor x = row_f32(128, v, 128);
  run u = one_row((opts){0, 0, 1, 0}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], 0.0078125f);
  const uint8_t *q = data_of(&u, HQ_ROWWISE);
  assert_int_equal(q[0], 0x78);
  assert_int_equal(q[1], 0x7f);
  assert_int_equal(q[2], 0x7f);
  for (int i = 3; i < 128; i++) assert_int_equal(q[i], 0x68);
  run_free(&u);
  free(x.data);
  /* Inf enters amax: scale 1; +-Inf and 1000 saturate to +-448; 3.0 = 0x44 */
  for (int i = 0; i < 128; i++) v[i] = 0.0f;
  v[0] = INFINITY;
  v[1] = -INFINITY;
  v[2] = 3.0f;
  v[3] = 1000.0f;
  v[4] = NAN;
  x = row_f32(128, v, 128);
  for (int pow2 = 0; pow2 < 2; pow2++) {
    u = one_row((opts){0, 0, pow2, 0}, &x);
    ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], 1.0f);
    q = data_of(&u, HQ_ROWWISE);
    const uint8_t want[] = {0x7e, 0xfe, 0x44, 0x7e, 0x7f, 0x00};
    for (int i = 0; i < 6; i++) assert_int_equal(q[i], want[i]);
    run_free(&u);
  }
  free(x.data);
}

/* amax = 448 * 2^k: the scale 2^-k is exact with or without pow2, the outlier maps to 448. */
static void test_amax_exact_power(void **state) {
  (void)state;
  const int ks[] = {2, -3, 0, 20, -30};
  for (size_t t = 0; t < 5; t++)
    for (int pow2 = 0; pow2 < 2; pow2++) {
      float v[2] = {ldexpf(448.0f, ks[t]), -ldexpf(1.0f, ks[t])};
      hq_tensor x = row_f32(128, v, 2);
      run u = one_row((opts){0, 0, pow2, 0}, &x);
      ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ldexpf(1.0f, ks[t]));
      assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x7e);
      assert_int_equal(data_of(&u, HQ_ROWWISE)[1], 0xb8); /* -1.0 */
      run_free(&u);
      free(x.data);
    }
}

/* A block of input-dtype subnormals: 448/amax overflows FP32, so the scale falls back to the
   input dtype's max (2^127 with pow2); f16 subnormals are large enough not to overflow. */
static void test_tiny_amax_value_for_inf(void **state) {
  (void)state;
  struct {
    hq_dtype t;
    float v0, v1;          /* stored exactly in t */
    float scale, scale_p2; /* expected scale without / with pow2 */
  } c[] = {
      {HQ_F32, 1e-40f, -2e-40f, FLT_MAX, 0x1p127f},
      {HQ_BF16, 0x1p-133f, 0x1p-130f, 0x1.FEp127f, 0x1p127f},
      {HQ_F16, 0x1p-24f, 0x1p-23f, 448.0f * 0x1p23f, 0x1p31f},
  };
  for (size_t i = 0; i < 3; i++)
    for (int pow2 = 0; pow2 < 2; pow2++) {
      hq_tensor x = hq_test_empty(c[i].t, 1, 128);
      for (int j = 0; j < 128; j++) hq_store_hp(x.data, j, c[i].t, (j & 1) ? c[i].v1 : c[i].v0);
      assert_true(hq_load_hp(x.data, 0, c[i].t) == c[i].v0);
      assert_true(hq_load_hp(x.data, 1, c[i].t) == c[i].v1);
      run u = one_row((opts){0, 0, pow2, 0}, &x);
      float s = pow2 ? c[i].scale_p2 : c[i].scale;
      ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(s));
      for (int j = 0; j < 128; j++)
        assert_int_equal(data_of(&u, HQ_ROWWISE)[j],
                         ref_fp8_encode(ref_mul((j & 1) ? c[i].v1 : c[i].v0, s), 0));
      run_free(&u);
      free(x.data);
    }
  /* hand-checked codes: bf16 2^-133 * 0x1.FEp127 = 0x1.FEp-6 -> 2^-5 = 0x10; with pow2 2^-6 = 0x08
   */
  assert_int_equal(ref_fp8_encode(0x1.FEp-6, 0), 0x10);
  /* the rule itself for each input dtype, where no input can reach it (f16) too */
  const float tiny = 1e-38f;
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E4M3, 0, 0.0f, HQ_F16), 65504.0f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E4M3, 1, 0.0f, HQ_F16), 32768.0f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E5M2, 0, 0.0f, HQ_BF16), 0x1.FEp127f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E4M3, 1, 0.0f, HQ_BF16), 0x1p127f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E4M3, 0, 0.0f, HQ_F32), FLT_MAX);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_FP8_E4M3, 1, 0.0f, HQ_F32), 0x1p127f);
}

static void test_epsilon_floor(void **state) {
  (void)state;
  /* amax 1e-3 < eps 0.5: scale 448/0.5 = 896 (pow2 512); 1e-3*896 = 0.896 -> 0.875 = 0x36,
     1e-3*512 = 0.512 -> 0.5 = 0x30 */
  float v[1] = {1e-3f};
  hq_tensor x = row_f32(128, v, 1);
  run u = one_row((opts){0, 0, 0, 0.5f}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(896.0f));
  assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x36);
  run_free(&u);
  u = one_row((opts){0, 0, 1, 0.5f}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], 1.0f / 512.0f);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x30);
  run_free(&u);
  free(x.data);
  /* the floor comes before the zero check: an all-zero block gets 896, not 1 */
  x = hq_test_empty(HQ_F32, 1, 128);
  u = one_row((opts){0, 0, 0, 0.5f}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(896.0f));
  run_free(&u);
  free(x.data);
  /* an amax above the floor is untouched: 2 -> 224 */
  v[0] = 2.0f;
  x = row_f32(128, v, 1);
  u = one_row((opts){0, 0, 0, 0.5f}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(224.0f));
  assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x7e);
  run_free(&u);
  free(x.data);
}

static void test_e5m2(void **state) {
  (void)state;
  /* amax 2: 57344/2 = 28672 (pow2 16384). 2 -> 57344 = 0x7B, 1 -> 28672 = 1.75*2^14 = 0x77,
     -0.25 -> -7168 = 0xEF; pow2: 2 -> 2^15 = 0x78, 1 -> 2^14 = 0x74, -0.25 -> -2^12 = 0xEC */
  float v[3] = {2.0f, 1.0f, -0.25f};
  hq_tensor x = row_f32(128, v, 3);
  run u = one_row((opts){0, 1, 0, 0}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], ref_rcp(28672.0f));
  assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x7b);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[1], 0x77);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[2], 0xef); /* -7168 = -1.75*2^12 */
  run_free(&u);
  u = one_row((opts){0, 1, 1, 0}, &x);
  ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[0], 1.0f / 16384.0f);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[0], 0x78);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[1], 0x74);
  assert_int_equal(data_of(&u, HQ_ROWWISE)[2], 0xec);
  run_free(&u);
  free(x.data);
}

// --- layouts and block geometry ------------------------------------------------------------------

/* 1-D rowwise scales are M-contiguous: row m of a [6, 256] tensor has amax 2^m in its first
   block and 2^-m in its second; the buffer is [2][8] with entries [kb][m] and zero padding. */
static void test_row1d_m_contiguous(void **state) {
  (void)state;
  hq_tensor x = hq_test_empty(HQ_F32, 6, 256);
  float *p = x.data;
  for (int m = 0; m < 6; m++) {
    p[m * 256 + 3] = ldexpf(448.0f, m);
    p[m * 256 + 200] = ldexpf(448.0f, -m);
  }
  run u = quantize_with((opts){0, 0, 1, 0}, &x, HQ_ROWWISE);
  const float want[16] = {1, 2,    4,     8,      16,      32,       0, 0,
                          1, 0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0, 0};
  for (int i = 0; i < 16; i++) ASSERT_F32_SAME(scales_of(&u, HQ_ROWWISE)[i], want[i]);
  run_free(&u);
  free(x.data);
}

/* A column outlier changes only its own 128x1 columnwise block, its own 1x128 rowwise block and
   (2-D) its own tile. */
static void test_blocks_follow_geometry(void **state) {
  (void)state;
  const int64_t M = 256, K = 384;
  hq_tensor x = hq_test_empty(HQ_F32, M, K);
  for (int64_t i = 0; i < M * K; i++) ((float *)x.data)[i] = 1.0f;
  ((float *)x.data)[5 * K + 7] = 100.0f; /* element (5, 7) */
  const float base = 1.0f / 256.0f, hit = 1.0f / 4.0f; /* pow2 scales 256 (amax 1), 4 (100) */
  for (int two_d = 0; two_d < 2; two_d++) {
    run u = quantize_with((opts){two_d, 0, 1, 0}, &x, HQ_BOTH);
    for (int col = 0; col < 2; col++) {
      int64_t rows, cols, used;
      ref_scale_dims(M, K, col, two_d, &rows, &cols, &used);
      const float *s = scales_of(&u, col ? HQ_COLWISE : HQ_ROWWISE);
      int64_t hit_at = ref_scale_at(5, 7, M, K, col, two_d);
      for (int64_t i = 0; i < rows * cols; i++)
        ASSERT_F32_SAME(s[i], i == hit_at ? hit : (i % cols) < used ? base : 0.0f);
    }
    /* the outlier's columnwise block (1-D: column 7, rows 0..127; 2-D: tile (0, 0)) has scale 4:
       1 -> 4 = 0x48, 100 -> 400, a tie between 384 (0x7C) and 416 -> even 0x7C; elsewhere scale
       256: 1 -> 256 = 0x78 */
    const uint8_t *cd = data_of(&u, HQ_COLWISE);
    for (int64_t k = 0; k < K; k++)
      for (int64_t m = 0; m < M; m++) {
        int in = two_d ? (m < 128 && k < 128) : (m < 128 && k == 7);
        unsigned want = (m == 5 && k == 7) ? 0x7c : in ? 0x48 : 0x78;
        assert_int_equal(cd[k * M + m], want);
      }
    run_free(&u);
  }
  free(x.data);
}

// --- brute-force reference over shapes and options ---------------------------------------------

/* A test input: N(0,1) with a magnitude that changes every few rows and columns (so neighbouring
   blocks get different scales), a zero region, and a few NaN / Inf. */
static hq_tensor make_input(hq_dtype t, int64_t M, int64_t K, uint64_t seed, int specials) {
  hq_tensor x = hq_test_empty(t, M, K);
  uint64_t s = seed * 7919u + 3u;
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      int e = (int)((m / 37 + k / 53) % 9) - 4;
      float v = ldexpf(hq_test_normal(&s), e);
      if (m >= M / 2 && m < M / 2 + 3 && k < 140) v = 0.0f; /* zero rows: some all-zero blocks */
      hq_store_hp(x.data, m * K + k, t, v);
    }
  if (specials && M * K > 64) {
    hq_store_hp(x.data, (M * K) / 3, t, NAN);
    hq_store_hp(x.data, (M * K) / 5, t, -INFINITY);
    hq_store_hp(x.data, M * K - 1, t, NAN);
  }
  return x;
}

/* Per-block amax by element membership: block of (m, k) is (m, k/128) rowwise 1-D, (m/128, k)
   columnwise 1-D, (m/128, k/128) 2-D. Returns the expected scale of element (m, k). */
typedef struct refq {
  int64_t M, K;
  int col, two_d;
  int64_t bm, bk; /* block grid */
  float *scale;   /* [bm][bk] */
} refq;

static refq ref_blocks(const hq_tensor *x, int col, opts o) {
  refq r = {x->rows, x->cols, col, o.two_d, 0, 0, NULL};
  r.bm = (o.two_d || col) ? nb(r.M) : r.M;
  r.bk = (o.two_d || !col) ? nb(r.K) : r.K;
  float *amax = calloc((size_t)(r.bm * r.bk), sizeof(float));
  r.scale = calloc((size_t)(r.bm * r.bk), sizeof(float));
  for (int64_t m = 0; m < r.M; m++)
    for (int64_t k = 0; k < r.K; k++) {
      float a = fabsf(hq_load_hp(x->data, m * r.K + k, x->dtype));
      int64_t bi = (r.bm == r.M ? m : m / BLK) * r.bk + (r.bk == r.K ? k : k / BLK);
      if (!isnan(a) && a > amax[bi]) amax[bi] = a;
    }
  for (int64_t i = 0; i < r.bm * r.bk; i++)
    r.scale[i] = ref_scale(amax[i], o.kind, o.pow2, o.eps, x->dtype);
  free(amax);
  return r;
}

static float ref_scale_of(const refq *r, int64_t m, int64_t k) {
  return r->scale[(r->bm == r->M ? m : m / BLK) * r->bk + (r->bk == r->K ? k : k / BLK)];
}

/* Check one direction of a quantized tensor against the reference: every data byte, every scale
   entry (at the index written out here), zero padding, and dequantize into f32/bf16/f16. */
static void check_dir(const run *u, const hq_tensor *x, int col, opts o) {
  const int64_t M = x->rows, K = x->cols;
  uint32_t dir = col ? HQ_COLWISE : HQ_ROWWISE;
  const uint8_t *q = data_of(u, dir);
  const float *s = scales_of(u, dir);
  refq r = ref_blocks(x, col, o);
  int64_t rows, cols, used;
  ref_scale_dims(M, K, col, o.two_d, &rows, &cols, &used);
  /* padding is zero */
  for (int64_t i = 0; i < rows * cols; i++)
    if (i % cols >= used) assert_int_equal(fbits(s[i]), 0);
  hq_tensor deq[3];
  const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int t = 0; t < 3; t++) {
    deq[t] = hq_test_empty(dts[t], M, K);
    HQ_OK_OR_FAIL(hq_dequantize(u->qt, u->ctx, dir, &deq[t]));
  }
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      float sc = ref_scale_of(&r, m, k);
      float si = ref_rcp(sc);
      ASSERT_F32_SAME(s[ref_scale_at(m, k, M, K, col, o.two_d)], si);
      float xv = hq_load_hp(x->data, m * K + k, x->dtype);
      unsigned want = ref_fp8_encode(ref_mul(xv, sc), o.kind);
      unsigned got = col ? q[k * M + m] : q[m * K + k];
      if (got != want)
        fail_msg("%s %s [%lld,%lld] (%lld,%lld): x=%a scale=%a q=0x%02x want 0x%02x",
                 col ? "col" : "row", o.two_d ? "2d" : "1d", (long long)M, (long long)K,
                 (long long)m, (long long)k, (double)xv, (double)sc, got, want);
      /* dequantize: RN(decode(q) * scale_inv), then rounded to the destination dtype */
      double dv = ref_fp8_decode(want, o.kind);
      float d32 = (float)(dv * (double)si);
      float got32 = ((float *)deq[0].data)[m * K + k];
      if (isnan(d32)) assert_true(isnan(got32));
      else ASSERT_F32_SAME(got32, d32);
      if (!isnan(d32)) {
        assert_int_equal(((uint16_t *)deq[1].data)[m * K + k], hq_f32_to_bf16(d32));
        assert_int_equal(((uint16_t *)deq[2].data)[m * K + k], hq_f32_to_f16(d32));
      }
    }
  for (int t = 0; t < 3; t++) free(deq[t].data);
  free(r.scale);
}

static void test_brute_force(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{130, 200}, {1, 1}, {127, 129}, {128, 128}, {3, 517}, {257, 131},
                               {2, 130}};
  const hq_dtype ins[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int t = 0; t < 3; t++)
      for (int two_d = 0; two_d < 2; two_d++)
        for (int kind = 0; kind < 2; kind++)
          for (int pow2 = 0; pow2 < 2; pow2++) {
            opts o = {two_d, kind, pow2, pow2 ? 0.0f : 1e-3f};
            hq_tensor x = make_input(ins[t], shapes[sh][0], shapes[sh][1], sh * 31 + (size_t)t, 1);
            /* fused (one call), rowwise only, columnwise only (f32 only, to keep it quick) */
            for (int usage = HQ_BOTH; usage >= (t == 0 ? 1 : 3); usage--) {
              run u = quantize_with(o, &x, (uint32_t)usage);
              if (usage & HQ_ROWWISE) check_dir(&u, &x, 0, o);
              if (usage & HQ_COLWISE) check_dir(&u, &x, 1, o);
              run_free(&u);
            }
            free(x.data);
          }
}

/* 2-D: the columnwise copy is the rowwise copy transposed, bytes and scales. */
static void test_2d_columnwise_is_transpose(void **state) {
  (void)state;
  const int64_t M = 300, K = 260;
  hq_tensor x = make_input(HQ_BF16, M, K, 9, 1);
  for (int pow2 = 0; pow2 < 2; pow2++) {
    run u = quantize_with((opts){1, 0, pow2, 0}, &x, HQ_BOTH);
    const uint8_t *rd = data_of(&u, HQ_ROWWISE), *cd = data_of(&u, HQ_COLWISE);
    for (int64_t m = 0; m < M; m++)
      for (int64_t k = 0; k < K; k++) assert_int_equal(cd[k * M + m], rd[m * K + k]);
    const float *rs = scales_of(&u, HQ_ROWWISE), *cs = scales_of(&u, HQ_COLWISE);
    const int64_t Mb = nb(M), Kb = nb(K);
    for (int64_t mb = 0; mb < Mb; mb++)
      for (int64_t kb = 0; kb < Kb; kb++)
        assert_int_equal(fbits(cs[kb * r4(Mb) + mb]), fbits(rs[mb * r4(Kb) + kb]));
    run_free(&u);
  }
  free(x.data);
}

/* Padding is rewritten as zero by every quantize, also into a reused (dirty) storage. */
static void test_padding_rezeroed_on_update(void **state) {
  (void)state;
  const int64_t M = 130, K = 202;
  hq_tensor x = make_input(HQ_F32, M, K, 4, 0);
  for (int two_d = 0; two_d < 2; two_d++) {
    run u = quantize_with((opts){two_d, 0, 1, 0}, &x, HQ_BOTH);
    for (int col = 0; col < 2; col++) {
      const hq_buffer *b = &hq_qtensor_storage(u.qt, col ? HQ_COLWISE : HQ_ROWWISE)->buf[1];
      memset(b->ptr, 0xff, b->bytes);
    }
    HQ_OK_OR_FAIL(hq_qtensor_update(u.qt, u.ctx, &x));
    opts o = {two_d, 0, 1, 0};
    check_dir(&u, &x, 0, o);
    check_dir(&u, &x, 1, o);
    run_free(&u);
  }
  free(x.data);
}

/* Dequantize stays within half an FP8 step of x, per element, in both directions. */
static void test_dequantize_error_bound(void **state) {
  (void)state;
  const int64_t M = 200, K = 300;
  hq_tensor x = make_input(HQ_F32, M, K, 5, 0);
  for (int two_d = 0; two_d < 2; two_d++)
    for (int kind = 0; kind < 2; kind++)
      for (int pow2 = 0; pow2 < 2; pow2++) {
        /* half ulp relative to |x*scale| for normals (2^-4 E4M3, 2^-3 E5M2), half the subnormal
           step below the smallest normal (2^-10 E4M3, 2^-17 E5M2), in scaled units */
        const double rel = kind ? 0x1p-3 : 0x1p-4, absu = kind ? 0x1p-17 : 0x1p-10;
        run u = quantize_with((opts){two_d, kind, pow2, 0}, &x, HQ_BOTH);
        hq_tensor y = hq_test_empty(HQ_F32, M, K);
        for (int col = 0; col < 2; col++) {
          uint32_t dir = col ? HQ_COLWISE : HQ_ROWWISE;
          HQ_OK_OR_FAIL(hq_dequantize(u.qt, u.ctx, dir, &y));
          const float *s = scales_of(&u, dir);
          for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
              double xv = ((float *)x.data)[m * K + k], yv = ((float *)y.data)[m * K + k];
              double si = s[ref_scale_at(m, k, M, K, col, two_d)];
              double bound = (rel * fabs(xv) + absu * si) * (1 + 0x1p-18);
              if (fabs(xv - yv) > bound)
                fail_msg("(%lld,%lld) dir %d: x=%a deq=%a bound %g", (long long)m, (long long)k,
                         col, xv, yv, bound);
            }
        }
        free(y.data);
        run_free(&u);
      }
  free(x.data);
}

// --- the module's ABI directly: caps, option table, defensive error paths -----------------------

/* Paths the core guards before the plugin sees them (a CUDA call to a CPU-only format, a bad
   dtype, a mismatched destination) still fail cleanly, with a message, when called directly. */
static void test_module_direct(void **state) {
  (void)state;
  hq_format_entry_fn entry = hq_test_module_entry("fp8_block");
  hq_host_api host = hq_test_host();
  char *g_err = hq_test_module_error();
  hq_host_api future = host;
  future.abi_major = HQ_ABI_MAJOR + 1;
  assert_null(entry(&future));
  const hq_format_ops *ops = entry(&host);
  assert_non_null(ops);
  assert_string_equal(ops->name, "fp8_block");
  assert_int_equal(ops->caps, HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY);
  int nopt = 0;
  for (const hq_option *o = ops->options; o->name; o++, nopt++)
    assert_true(o->help && o->help[0] && !strchr(o->help, '\n'));
  assert_int_equal(nopt, 4);

  void *cfg = calloc(1, ops->config_size);
  hq_optval v[4] = {{0}};
  v[2].i = 1; /* block 1d, e4m3, pow2, eps 0 */
  assert_int_equal(ops->configure(cfg, v, &host), HQ_OK);
  hq_storage st;
  memset(&st, 0, sizeof st);
  st.dir = HQ_ROWWISE;
  st.rows = 2;
  st.cols = 3;
  assert_int_equal(ops->layout(cfg, &host, 2, 3, HQ_ROWWISE, HQ_ROWWISE, &st), HQ_OK);
  st.buf[0].ptr = calloc(6, 1);
  st.buf[1].ptr = calloc((size_t)(st.buf[1].shape[0] * st.buf[1].shape[1]), sizeof(float));
  float xs[6] = {1, 2, 3, 4, 5, 6};
  hq_tensor src = {xs, HQ_F32, 0, 2, 3};
  hq_call call;
  memset(&call, 0, sizeof call);
  call.struct_size = sizeof call;
  call.host = &host;
  call.device = 0;
  g_err[0] = 0;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_ENOTSUP);
  assert_non_null(strstr(g_err, "no CUDA path"));
  assert_non_null(strstr(g_err, "quantize on device 0"));
  float ys[6];
  hq_tensor dst = {ys, HQ_F32, 0, 2, 3};
  assert_int_equal(ops->dequantize(cfg, &call, &st, &dst), HQ_ENOTSUP);
  assert_non_null(strstr(g_err, "dequantize on device 0"));
  call.device = HQ_DEVICE_HOST;
  src.device = dst.device = HQ_DEVICE_HOST;
  src.dtype = HQ_U8;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(g_err, "source dtype"));
  src.dtype = HQ_F32;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_OK);
  dst.dtype = HQ_E4M3;
  assert_int_equal(ops->dequantize(cfg, &call, &st, &dst), HQ_EINVAL);
  assert_non_null(strstr(g_err, "destination dtype"));
  dst.dtype = HQ_F32;
  dst.rows = 3;
  dst.cols = 2;
  assert_int_equal(ops->dequantize(cfg, &call, &st, &dst), HQ_ESHAPE);
  assert_non_null(strstr(g_err, "[3, 2]"));
  dst.rows = 2;
  dst.cols = 3;
  assert_int_equal(ops->dequantize(cfg, &call, &st, &dst), HQ_OK);
  assert_true(ys[5] == 6.0f); /* 6 * 64 = 384 is exact in E4M3 */
  free(st.buf[0].ptr);
  free(st.buf[1].ptr);
  free(cfg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_defaults),
      cmocka_unit_test(test_option_errors),
      cmocka_unit_test(test_layout_description),
      cmocka_unit_test(test_index_functions),
      cmocka_unit_test(test_outlier),
      cmocka_unit_test(test_all_zeros),
      cmocka_unit_test(test_nan_inf_in_block),
      cmocka_unit_test(test_amax_exact_power),
      cmocka_unit_test(test_tiny_amax_value_for_inf),
      cmocka_unit_test(test_epsilon_floor),
      cmocka_unit_test(test_e5m2),
      cmocka_unit_test(test_row1d_m_contiguous),
      cmocka_unit_test(test_blocks_follow_geometry),
      cmocka_unit_test(test_brute_force),
      cmocka_unit_test(test_2d_columnwise_is_transpose),
      cmocka_unit_test(test_padding_rezeroed_on_update),
      cmocka_unit_test(test_dequantize_error_bound),
      cmocka_unit_test(test_module_direct),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
