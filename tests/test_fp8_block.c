/*
** test_fp8_block.c -- the fp8_block format (FORMATS.md 4) through the public API (a recipe, a
** quantizer, hq_quantize / hq_dequantize) and the FP8-block helpers of fp8_block_rules.h, each
** against an expectation written here: hand-computed blocks (outliers, zeros, NaN/Inf, exact
** powers, tiny amax and the input dtype's value_for_inf, the epsilon floor, E5M2), scale-buffer
** layouts from index formulas written out in this file, and a brute-force reference (per-element
** block membership, TE's scale rule restated with frexp, a nearest-code FP8 encoder) over odd
** shapes, every option combination and every input dtype.
** ABI 2.0: the operand descriptor and every buffer's name, role, dtype, shape and FSDP gather
** rule against the table written here; scratch declared by scratch_size() and no host->alloc.
** (A storage dequantized through a differently configured instance, an update equal to a fresh
** quantize, FSDP, offload and checkpoints, for every option: test_conformance.)
** ABI 2.1: the raw dequantize (HQ_CALL_DEQ_RAW) of hand-built storages equals the dequantize
** (no per-tensor factor, no transform; tensor_factor absent); emul_dtype BF16 with power-of-two
** scales (every raw value exact in BF16, but the far-underflow edge, shown here) and F32 without
** (a raw value BF16 cannot hold, shown here); the gemm op's answers (the host: HQ_ENOTSUP; a mock
** sm_90 device and cuBLASLt runner: the TN call with VEC128_32F / BLK128x128_32F scales it makes,
** and each refusal with its reason); hq_gemm on the host against an F64 product of the
** dequantized operands.
*/
#include <dlfcn.h>
#include <float.h>
#include <math.h>

#include "hq_test.h"
#include "fp8_block_rules.h" /* the index and scale functions under test (test_index_functions) */
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
  return hq_storage_cbuf(hq_qtensor_storage(u->qt, dir), 0)->ptr;
}
static const float *scales_of(const run *u, uint32_t dir) {
  return hq_storage_cbuf(hq_qtensor_storage(u->qt, dir), 1)->ptr;
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
  hq_format_info fi = {.struct_size = sizeof fi};
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

/* The ABI 2.0 description of both directions, every block shape, dtype and usage, against the
   table of the conversion brief written out here: the operand descriptor (through
   hq_qtensor_storage()->desc) and each buffer's name, role, dtype, shape, flags, FSDP gather rule
   and rows-per-entry (through hq_storage_cbuf()). Mb = ceil(M/128), Kb = ceil(K/128). */
static const struct want_desc {
  int two_d, col;
  uint32_t order, mode, layout;
  int32_t block_m, block_k;
  int64_t shard_rows;
  uint32_t data_gather;
  uint32_t scale_gather;
  int32_t scale_m_div;
} want_descs[4] = {
    /* 1d rowwise: scale [Kb, r4(M)], M along dim 1, one entry per row */
    {0, 0, HQ_ORDER_MK, HQ_SCALE_VEC128_F32, HQ_SCALE_LAYOUT_BLOCK_MAJOR, 1, 128, 1,
     HQ_GATHER_ROWS, HQ_GATHER_COLS, 1},
    /* 1d columnwise: data [K, M], scale [Mb, r4(K)], M blocks along dim 0 */
    {0, 1, HQ_ORDER_KM, HQ_SCALE_VEC128_F32, HQ_SCALE_LAYOUT_BLOCK_MAJOR, 128, 1, 128,
     HQ_GATHER_COLS, HQ_GATHER_ROWS, 128},
    /* 2d rowwise: scale [Mb, r4(Kb)] */
    {1, 0, HQ_ORDER_MK, HQ_SCALE_BLK128X128_F32, HQ_SCALE_LAYOUT_OUTER_MAJOR, 128, 128, 128,
     HQ_GATHER_ROWS, HQ_GATHER_ROWS, 128},
    /* 2d columnwise: data [K, M], scale [Kb, r4(Mb)] */
    {1, 1, HQ_ORDER_KM, HQ_SCALE_BLK128X128_F32, HQ_SCALE_LAYOUT_OUTER_MAJOR, 128, 128, 128,
     HQ_GATHER_COLS, HQ_GATHER_COLS, 128},
};

static void check_description(const hq_storage *st, int64_t M, int64_t K, int two_d, int col,
                              int kind, int pow2) {
  const struct want_desc *w = &want_descs[two_d * 2 + col];
  assert_int_equal(w->two_d, two_d);
  assert_int_equal(w->col, col);
  assert_non_null(st);
  assert_int_equal(st->dir, col ? HQ_COLWISE : HQ_ROWWISE);
  assert_int_equal(st->rows, M);
  assert_int_equal(st->cols, K);
  const hq_operand_desc *d = &st->desc;
  assert_true(d->struct_size >= sizeof *d);
  assert_int_equal(d->elem, kind ? HQ_E5M2 : HQ_E4M3);
  assert_int_equal(d->order, w->order);
  assert_int_equal(d->scale_mode, w->mode);
  assert_int_equal(d->scale_layout, w->layout);
  assert_int_equal(d->block_m, w->block_m);
  assert_int_equal(d->block_k, w->block_k);
  assert_int_equal(d->transform, HQ_TRANSFORM_NONE);
  assert_int_equal(d->transform_param, 0);
  assert_int_equal(d->shard_rows, w->shard_rows);
  /* raw values q * scale_inv: exact in BF16 with power-of-two scales, F32 otherwise */
  assert_int_equal(d->emul_dtype, pow2 ? HQ_BF16 : HQ_F32);
  assert_int_equal(d->reserved32, 0);
  for (int i = 0; i < 7; i++) assert_int_equal(d->reserved[i], 0);
  /* meta is not the home of any layout fact: it stays zero */
  for (int i = 0; i < HQ_META_BYTES; i++) assert_int_equal(st->meta[i], 0);
  assert_int_equal(st->nbuf, 2);
  const hq_buffer *b = hq_storage_cbuf(st, 0), *sc = hq_storage_cbuf(st, 1);
  assert_string_equal(b->name, col ? "columnwise_data" : "data");
  assert_int_equal(b->role, HQ_ROLE_DATA);
  assert_int_equal(b->dtype, kind ? HQ_E5M2 : HQ_E4M3);
  assert_int_equal(b->ndim, 2);
  assert_int_equal(b->shape[0], col ? K : M);
  assert_int_equal(b->shape[1], col ? M : K);
  assert_int_equal(b->flags, 0u);
  assert_int_equal(b->gather, w->data_gather);
  assert_int_equal(b->m_div, 1);
  assert_int_equal(b->bytes, (size_t)(M * K));
  assert_non_null(b->ptr);
  assert_string_equal(sc->name, col ? "columnwise_scale_inv" : "scale_inv");
  assert_int_equal(sc->role, HQ_ROLE_SCALE);
  assert_int_equal(sc->dtype, HQ_F32);
  assert_int_equal(sc->ndim, 2);
  const int64_t Mb = nb(M), Kb = nb(K);
  const int64_t want0 = two_d ? (col ? Kb : Mb) : (col ? Mb : Kb);
  const int64_t want1 = two_d ? (col ? r4(Mb) : r4(Kb)) : (col ? r4(K) : r4(M));
  assert_int_equal(sc->shape[0], want0);
  assert_int_equal(sc->shape[1], want1);
  int64_t rows, cols, used; /* the same shape from the layout formulas of this file */
  ref_scale_dims(M, K, col, two_d, &rows, &cols, &used);
  assert_int_equal(rows, want0);
  assert_int_equal(cols, want1);
  assert_int_equal(sc->flags, 0u);
  assert_int_equal(sc->gather, w->scale_gather);
  assert_int_equal(sc->m_div, w->scale_m_div);
  assert_int_equal(sc->bytes, (size_t)(want0 * want1 * 4));
  assert_non_null(sc->ptr);
}

static void test_layout_description(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{130, 202}, {1, 1}, {256, 512}, {127, 129}, {3, 517}};
  const uint32_t usages[] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int two_d = 0; two_d < 2; two_d++)
      for (int kind = 0; kind < 2; kind++)
        for (size_t us = 0; us < 3; us++) {
          const int64_t M = shapes[s][0], K = shapes[s][1];
          const int pow2 = (int)((s + us) & 1);
          hq_tensor x = hq_test_tensor(HQ_F32, M, K, 1, 1.0f);
          run u = quantize_with((opts){two_d, kind, pow2, pow2 ? 0.0f : 1e-6f}, &x, usages[us]);
          assert_int_equal(hq_qtensor_dirs(u.qt), usages[us]);
          int64_t shard = 1;
          for (int col = 0; col < 2; col++) {
            const uint32_t dir = col ? HQ_COLWISE : HQ_ROWWISE;
            if (!(usages[us] & dir)) {
              assert_null(hq_qtensor_storage(u.qt, dir));
              continue;
            }
            check_description(hq_qtensor_storage(u.qt, dir), M, K, two_d, col, kind, pow2);
            if (want_descs[two_d * 2 + col].shard_rows > shard) shard = 128;
          }
          /* the tensor's shard multiple: 1 only for 1-D rowwise alone, else whole blocks */
          assert_int_equal(hq_qtensor_shard_rows(u.qt), shard);
          assert_int_equal(shard, (!two_d && usages[us] == HQ_ROWWISE) ? 1 : 128);
          run_free(&u);
          free(x.data);
        }
}

/* The fp8_block_rules.h index and shape functions against the formulas written out here. */
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
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E4M3, 0, 0.0f, HQ_F16), 65504.0f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E4M3, 1, 0.0f, HQ_F16), 32768.0f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E5M2, 0, 0.0f, HQ_BF16), 0x1.FEp127f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E4M3, 1, 0.0f, HQ_BF16), 0x1p127f);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E4M3, 0, 0.0f, HQ_F32), FLT_MAX);
  ASSERT_F32_SAME(hq_fp8b_scale(tiny, HQ_E4M3, 1, 0.0f, HQ_F32), 0x1p127f);
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
      const hq_buffer *b = hq_storage_cbuf(hq_qtensor_storage(u.qt, col ? HQ_COLWISE : HQ_ROWWISE),
                                           1);
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

/* Allocation counter of the direct calls' host table: quantize and update take their scratch
   from call->scratch and never call host->alloc. */
static int g_allocs;
static void *count_alloc(const hq_call *call, size_t bytes) {
  g_allocs++;
  return hq_test_host_alloc(call, bytes);
}

static hq_host_api direct_host(void) {
  hq_host_api h = hq_test_host();
  h.alloc = count_alloc;
  return h;
}

static const hq_format_ops *fb_ops(const hq_host_api *host) {
  const hq_format_ops *ops = hq_test_module_entry("fp8_block")(host);
  assert_non_null(ops);
  return ops;
}

/* An instance configured with o (values placed by option name). */
static void *fb_configure(const hq_format_ops *ops, const hq_host_api *host, opts o) {
  hq_optval v[8];
  memset(v, 0, sizeof v);
  int n = 0;
  for (const hq_option *p = ops->options; p->name; p++, n++) {
    assert_true(n < 8);
    if (!strcmp(p->name, "block")) v[n].i = o.two_d;
    else if (!strcmp(p->name, "dtype")) v[n].i = o.kind;
    else if (!strcmp(p->name, "power_2_scales")) v[n].i = o.pow2;
    else if (!strcmp(p->name, "amax_epsilon")) v[n].f = o.eps;
    else fail_msg("unexpected option '%s'", p->name);
  }
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  assert_int_equal(ops->configure(cfg, v, host), HQ_OK);
  return cfg;
}

/* What the core does before a quantize: layout() into an initialised storage, then every buffer
   allocated (filled with 0xA5, so that anything quantize leaves unwritten shows). */
static void fb_storage(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                       uint32_t dir, uint32_t dirs, int64_t M, int64_t K, hq_dtype nominal,
                       hq_storage *st) {
  hq_test_storage_init(st, dir, M, K, nominal);
  if (ops->layout(cfg, host, M, K, dir, dirs, st) != HQ_OK)
    fail_msg("layout: %s", hq_test_module_error());
  for (uint32_t i = 0; i < st->nbuf; i++) {
    hq_buffer *b = hq_storage_buf(st, i);
    size_t n = hq_dtype_size(b->dtype);
    for (int d = 0; d < b->ndim; d++) n *= (size_t)b->shape[d];
    b->bytes = n;
    b->ptr = malloc(n ? n : 1);
    memset(b->ptr, 0xa5, n);
  }
}

static void fb_storage_free(hq_storage *st) {
  for (uint32_t i = 0; i < st->nbuf; i++) free(hq_storage_buf(st, i)->ptr);
}

/* A quantize call with exactly scratch_size() bytes of scratch (sanitizers see any overrun; a
   canary after it catches one without them), no host->alloc. */
static int fb_quantize(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                       const hq_tensor *x, uint32_t dirs, hq_storage *row, hq_storage *col,
                       uint32_t flags) {
  const size_t need = ops->scratch_size(cfg, x->rows, x->cols, dirs, HQ_DEVICE_HOST);
  uint8_t *scratch = malloc(need + 64);
  memset(scratch + need, 0x5a, 64);
  hq_call call = hq_test_call(host, 0, 0);
  call.flags = flags;
  call.scratch = need ? scratch : NULL;
  call.scratch_bytes = need;
  const int before = g_allocs;
  int rc = ops->quantize(cfg, &call, x, dirs, row, col);
  assert_int_equal(g_allocs, before);
  for (int i = 0; i < 64; i++) assert_int_equal(scratch[need + (size_t)i], 0x5a);
  free(scratch);
  return rc;
}

static int fb_dequantize(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                         const hq_storage *st, hq_tensor *y) {
  hq_call call = hq_test_call(host, 0, 0);
  return ops->dequantize(cfg, &call, st, y);
}

/* Paths the core guards before the plugin sees them (a CUDA call to a CPU-only format, a bad
   dtype, a mismatched destination, missing scratch) still fail cleanly, with a message, when
   called directly. */
static void test_module_direct(void **state) {
  (void)state;
  hq_format_entry_fn entry = hq_test_module_entry("fp8_block");
  hq_host_api host = direct_host();
  char *g_err = hq_test_module_error();
  hq_host_api future = host;
  future.abi_major = HQ_ABI_MAJOR + 1;
  assert_null(entry(&future));
  const hq_format_ops *ops = entry(&host);
  assert_non_null(ops);
  assert_int_equal(ops->abi_major, 2);
  assert_int_equal(ops->abi_minor, 1); /* requires ABI 2.1: raw dequantize and GEMMs */
  assert_int_equal(ops->struct_size, sizeof(hq_format_ops));
  assert_string_equal(ops->name, "fp8_block");
  assert_string_equal(ops->version, hq_version());
  assert_null(ops->tensor_factor); /* no per-tensor factor */
  /* its own GEMM: small problems by mma.sync on the codes on compute capability 9.x
     (tests/test_gpu_gemm); it takes no host problem, which the core's CPU path multiplies */
  assert_non_null(ops->gemm);
  hq_call hcall = hq_test_call(&host, 0, 0);
  hq_gemm_problem gp = {.struct_size = sizeof gp, .m = 1, .n = 1, .k = 1};
  assert_int_equal(ops->gemm(NULL, &hcall, &gp), HQ_ENOTSUP);
  /* HQ_CAP_CUDA exactly when the build has the CUDA path (tests/test_gpu_fp8_block.c) */
  assert_int_equal(ops->caps & ~(HQ_CAP_CUDA | HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV),
                   HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY);
  assert_int_equal(!!(ops->caps & HQ_CAP_CUDA), !!hq_built_with_cuda());
  /* the fused optimizer write-back rides on the CUDA kernel (tests/test_gpu_core.c) */
  assert_int_equal(!!(ops->caps & HQ_CAP_FUSED_ADAM), !!hq_built_with_cuda());
  /* ... reading its constants from device memory when given (ABI 2.6: graph capture) */
  assert_int_equal(!!(ops->caps & HQ_CAP_ADAM_KDEV), !!hq_built_with_cuda());
  assert_non_null(ops->scratch_size);
  /* no per-tensor amax: amax_kind NONE for both directions (the op is absent) */
  assert_true(ops->amax_kind == NULL || (ops->amax_kind(NULL, HQ_ROWWISE) == HQ_AMAX_NONE &&
                                         ops->amax_kind(NULL, HQ_COLWISE) == HQ_AMAX_NONE));
  int nopt = 0;
  for (const hq_option *o = ops->options; o->name; o++, nopt++)
    assert_true(o->help && o->help[0] && !strchr(o->help, '\n'));
  assert_int_equal(nopt, 4);

  void *cfg = fb_configure(ops, &host, (opts){0, 0, 1, 0});
  /* no scratch for a device (the CUDA kernel needs none); for a host [2, 3] tensor the tile of
     the CPU quantize: 128 FP32 column scales, 2 x 128 FP32 inputs, 3 x 128 FP8 bytes */
  assert_int_equal(ops->scratch_size(cfg, 300, 300, HQ_BOTH, 0), 0);
  assert_int_equal(ops->scratch_size(cfg, 2, 3, HQ_ROWWISE, HQ_DEVICE_HOST),
                   128 * 4 + 2 * 128 * 4 + 3 * 128);
  hq_storage st;
  fb_storage(ops, cfg, &host, HQ_ROWWISE, HQ_ROWWISE, 2, 3, HQ_F32, &st);
  float xs[6] = {1, 2, 3, 4, 5, 6};
  hq_tensor src = hq_tensor_2d(xs, HQ_F32, 0, 2, 3);
  hq_call call = hq_test_call(&host, 0, 0);
  float ys[6];
  hq_tensor dst = hq_tensor_2d(ys, HQ_F32, 0, 2, 3);
  if (!hq_built_with_cuda()) {
    /* a build without CUDA refuses a device call (with CUDA, test_gpu_fp8_block covers it) */
    call.device = 0;
    g_err[0] = 0;
    assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_ENOTSUP);
    assert_non_null(strstr(g_err, "no CUDA path"));
    assert_non_null(strstr(g_err, "quantize on device 0"));
    assert_int_equal(ops->dequantize(cfg, &call, &st, &dst), HQ_ENOTSUP);
    assert_non_null(strstr(g_err, "dequantize on device 0"));
  }
  call.device = HQ_DEVICE_HOST;
  src.device = dst.device = HQ_DEVICE_HOST;
  src.dtype = HQ_U8;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(g_err, "source dtype"));
  src.dtype = HQ_F32;
  /* the scratch is call->scratch, never host->alloc: none given, or too little, is an error */
  g_err[0] = 0;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(g_err, "scratch"));
  const size_t need = ops->scratch_size(cfg, 2, 3, HQ_ROWWISE, HQ_DEVICE_HOST);
  void *scratch = malloc(need);
  call.scratch = scratch;
  call.scratch_bytes = need - 1;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(g_err, "scratch"));
  call.scratch_bytes = need;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_OK);
  /* the fused optimizer step (ABI 2.2) only comes with an update on a CUDA device: on the host
     it is refused, naming it, and nothing is written */
  {
    float g6[6] = {0}, m6[6] = {0}, v6[6] = {0};
    hq_adam_pass pass = hq_test_adam_pass(g6, m6, v6);
    hq_call ac = call;
    ac.flags = HQ_CALL_UPDATE;
    ac.adam = &pass;
    const uint8_t before = ((const uint8_t *)hq_storage_cbuf(&st, 0)->ptr)[0];
    g_err[0] = 0;
    assert_int_equal(ops->quantize(cfg, &ac, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
    assert_non_null(strstr(g_err, "fused optimizer step"));
    assert_int_equal(((const uint8_t *)hq_storage_cbuf(&st, 0)->ptr)[0], before);
    assert_true(xs[0] == 1.0f && m6[0] == 0.0f); /* the master and moments untouched */
  }
  /* a direction without its storage */
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_BOTH, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(g_err, "columnwise"));
  free(scratch);
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
  fb_storage_free(&st);
  free(cfg);
}

/* A storage whose description is not an fp8_block one, or whose buffers do not match its
   description, is refused by dequantize with a message; a quantize into a storage another
   instance described is refused too (never a write out of bounds). */
static void test_foreign_storage_refused(void **state) {
  (void)state;
  hq_host_api host = direct_host();
  const hq_format_ops *ops = fb_ops(&host);
  char *g_err = hq_test_module_error();
  const int64_t M = 130, K = 200;
  void *ca = fb_configure(ops, &host, (opts){0, 0, 1, 0});
  void *cb = fb_configure(ops, &host, (opts){1, 1, 1, 0});
  hq_tensor x = make_input(HQ_F32, M, K, 3, 0);
  hq_storage st, bad;
  fb_storage(ops, ca, &host, HQ_ROWWISE, HQ_ROWWISE, M, K, HQ_F32, &st);
  assert_int_equal(fb_quantize(ops, ca, &host, &x, HQ_ROWWISE, &st, NULL, 0), HQ_OK);
  hq_tensor y = hq_test_empty(HQ_F32, M, K);
  struct {
    int field, code;
    const char *needle;
  } cases[] = {
      {0, HQ_ENOTSUP, "scale mode"},    /* per-tensor scale mode */
      {1, HQ_EINVAL, "data buffer"},    /* desc says e5m2, the data buffer is e4m3 */
      {2, HQ_ENOTSUP, "not an fp8_block layout"}, /* KM order with 1x128 blocks */
      {3, HQ_ENOTSUP, "not an fp8_block layout"}, /* a transform */
      {4, HQ_EINVAL, "scale buffer"},   /* a scale buffer of the wrong shape */
      {5, HQ_EINVAL, "element dtype"},  /* a non-FP8 element */
      {6, HQ_EINVAL, "data buffer"},    /* a data buffer of the wrong shape */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(&bad, &st, sizeof st);
    switch (cases[i].field) {
    case 0: bad.desc.scale_mode = HQ_SCALE_TENSOR_F32; break;
    case 1: bad.desc.elem = HQ_E5M2; break;
    case 2: bad.desc.order = HQ_ORDER_KM; break;
    case 3: bad.desc.transform = HQ_TRANSFORM_RHT16; break;
    case 4: hq_storage_buf(&bad, 1)->shape[1] += 4; break;
    case 5: bad.desc.elem = HQ_BF16; break;
    default: hq_storage_buf(&bad, 0)->shape[0] = K; break;
    }
    g_err[0] = 0;
    int rc = fb_dequantize(ops, cb, &host, &bad, &y);
    if (rc != cases[i].code || !strstr(g_err, cases[i].needle))
      fail_msg("case %zu: %d '%s', expected %d with '%s'", i, rc, g_err, cases[i].code,
               cases[i].needle);
  }
  /* instance B (2-D, e5m2) must not write into A's (1-D, e4m3) storage */
  g_err[0] = 0;
  assert_int_equal(fb_quantize(ops, cb, &host, &x, HQ_ROWWISE, &st, NULL, 0), HQ_EINVAL);
  assert_non_null(strstr(g_err, "not one this instance"));
  /* a tensor of another shape than the storage's */
  hq_tensor x2 = hq_tensor_2d(x.data, HQ_F32, HQ_DEVICE_HOST, M - 1, K);
  assert_int_equal(fb_quantize(ops, ca, &host, &x2, HQ_ROWWISE, &st, NULL, 0), HQ_ESHAPE);
  fb_storage_free(&st);
  free(y.data);
  free(x.data);
  free(ca);
  free(cb);
}

/* An update (HQ_CALL_UPDATE: host->alloc refuses) with exactly the declared scratch writes the
   same bytes as a plain quantize, padding included, for edge shapes and every usage. */
static void test_direct_update_scratch(void **state) {
  (void)state;
  hq_host_api host = direct_host();
  const hq_format_ops *ops = fb_ops(&host);
  const int64_t shapes[][2] = {{1, 1}, {3, 517}, {517, 3}, {130, 200}, {300, 300}, {129, 2}};
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
    for (int two_d = 0; two_d < 2; two_d++)
      for (uint32_t dirs = 1; dirs <= HQ_BOTH; dirs++) {
        const int64_t M = shapes[sh][0], K = shapes[sh][1];
        void *cfg = fb_configure(ops, &host, (opts){two_d, (int)(sh & 1), 1, 0});
        hq_tensor x = make_input(HQ_BF16, M, K, sh + 100, 1);
        hq_storage s[2][2]; /* [plain, update][row, col] */
        for (int u = 0; u < 2; u++)
          for (int c = 0; c < 2; c++)
            if (dirs & (c ? HQ_COLWISE : HQ_ROWWISE))
              fb_storage(ops, cfg, &host, c ? HQ_COLWISE : HQ_ROWWISE, dirs, M, K, HQ_BF16,
                         &s[u][c]);
        for (int u = 0; u < 2; u++)
          if (fb_quantize(ops, cfg, &host, &x, dirs, (dirs & HQ_ROWWISE) ? &s[u][0] : NULL,
                          (dirs & HQ_COLWISE) ? &s[u][1] : NULL, u ? HQ_CALL_UPDATE : 0))
            fail_msg("[%lld, %lld] dirs %u %s: %s", (long long)M, (long long)K, dirs,
                     u ? "update" : "quantize", hq_test_module_error());
        for (int c = 0; c < 2; c++) {
          if (!(dirs & (c ? HQ_COLWISE : HQ_ROWWISE))) continue;
          for (uint32_t i = 0; i < 2; i++) {
            const hq_buffer *p = hq_storage_cbuf(&s[0][c], i), *q = hq_storage_cbuf(&s[1][c], i);
            assert_memory_equal(p->ptr, q->ptr, p->bytes);
          }
          fb_storage_free(&s[0][c]);
          fb_storage_free(&s[1][c]);
        }
        free(x.data);
        free(cfg);
      }
}

// --- through the library: update, per-tensor amax, FSDP ----------------------------------------

static void assert_same_qtensors(const hq_qtensor *a, const hq_qtensor *b) {
  assert_int_equal(hq_qtensor_dirs(a), hq_qtensor_dirs(b));
  for (int c = 0; c < 2; c++) {
    const hq_storage *sa = hq_qtensor_storage(a, c ? HQ_COLWISE : HQ_ROWWISE);
    const hq_storage *sb = hq_qtensor_storage(b, c ? HQ_COLWISE : HQ_ROWWISE);
    if (!sa) {
      assert_null(sb);
      continue;
    }
    assert_int_equal(sa->nbuf, sb->nbuf);
    assert_memory_equal(&sa->desc, &sb->desc, sizeof sa->desc);
    for (uint32_t i = 0; i < sa->nbuf; i++) {
      const hq_buffer *p = hq_storage_cbuf(sa, i), *q = hq_storage_cbuf(sb, i);
      assert_string_equal(p->name, q->name);
      assert_int_equal(p->bytes, q->bytes);
      assert_memory_equal(p->ptr, q->ptr, p->bytes);
    }
  }
}

/* No per-tensor amax: both directions report HQ_AMAX_NONE (that hq_quantizer_amax then writes
   zeros and a caller's amax changes nothing: test_conformance). */
static void test_amax_none(void **state) {
  (void)state;
  hq_tensor x = make_input(HQ_BF16, 130, 260, 8, 1);
  for (int two_d = 0; two_d < 2; two_d++) {
    const opts o = {two_d, 0, 1, 0};
    run u = quantize_with(o, &x, HQ_BOTH);
    assert_int_equal(hq_quantizer_amax_kind(u.q, HQ_ROWWISE), HQ_AMAX_NONE);
    assert_int_equal(hq_quantizer_amax_kind(u.q, HQ_COLWISE), HQ_AMAX_NONE);
    run_free(&u);
  }
  free(x.data);
}

/* The gather rules hold on edge shapes (test_conformance: 2 and 4 shards of 128 rows): 1-D
   rowwise alone shards by single rows (its scale runs along M in dim 1, padded to 4), and every
   other storage by whole 128-row blocks, with K not a multiple of 128 or of 4. The shards'
   extracted buffers, concatenated, assigned into a full tensor, equal the whole tensor
   quantized. */
static void fsdp_case(opts o, uint32_t usage, int64_t M, int64_t K, int64_t ms) {
  hq_recipe *r = recipe_for(o);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = make_input(HQ_BF16, M, K, (uint64_t)(M + K), 0);
  const int world = (int)(M / ms);
  hq_qtensor *shard[8] = {0};
  hq_fsdp_buffer ext[8][2 * HQ_MAX_BUFFERS];
  size_t n[8];
  assert_true(world <= 8 && world * ms == M);
  for (int s = 0; s < world; s++) {
    hq_tensor xs = hq_tensor_2d((uint16_t *)x.data + s * ms * K, HQ_BF16, HQ_DEVICE_HOST, ms, K);
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &xs, &shard[s]));
    HQ_OK_OR_FAIL(hq_fsdp_extract(shard[s], ctx, ext[s], 2 * HQ_MAX_BUFFERS,
                                  sizeof(hq_fsdp_buffer), &n[s]));
    assert_int_equal(n[s], n[0]);
  }
  hq_fsdp_buffer gathered[2 * HQ_MAX_BUFFERS];
  void *mem[2 * HQ_MAX_BUFFERS];
  hq_test_all_gather(ext, world, n[0], gathered, mem);
  hq_qtensor *full = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, M, K, HQ_BF16, &full));
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
  assert_same_qtensors(full, ref);
  for (size_t e = 0; e < n[0]; e++) free(mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

static void test_fsdp_edge_shapes(void **state) {
  (void)state;
  fsdp_case((opts){0, 0, 1, 0}, HQ_ROWWISE, 15, 130, 5);   /* shards of 5 rows, r4 padding */
  fsdp_case((opts){0, 1, 0, 0}, HQ_ROWWISE, 14, 3, 2);     /* K < 128 */
  fsdp_case((opts){0, 0, 1, 0}, HQ_BOTH, 384, 130, 128);
  fsdp_case((opts){0, 0, 1, 0}, HQ_COLWISE, 256, 3, 128);
  fsdp_case((opts){1, 0, 1, 0}, HQ_BOTH, 640, 131, 128);   /* 5 shards: Mb = 5, r4 -> 8 */
  fsdp_case((opts){1, 1, 0, 0}, HQ_ROWWISE, 256, 600, 128);
  /* a shard of 1-D columnwise or 2-D must hold whole 128-row blocks: refused before any move */
  hq_recipe *r = recipe_for((opts){1, 0, 1, 0});
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = make_input(HQ_F32, 64, 130, 1, 0);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_fsdp_buffer out[2 * HQ_MAX_BUFFERS];
  size_t n = 0;
  assert_int_equal(hq_fsdp_extract(qt, ctx, out, 2 * HQ_MAX_BUFFERS, sizeof out[0], &n),
                   HQ_ESHAPE);
  HQ_ERROR_HAS("64 rows are not a multiple of 128");
  hq_qtensor_free(qt);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

// --- ABI 2.1: raw values, emul dtype, the gemm op, hq_gemm on the host -------------------------

/* A storage of direction `col` of a [M, K] tensor as instance cfg describes it, its codes and
   scales written here: code of logical element (m, k) = codes(m, k), scale_inv of its block =
   scales(block index) (index by this file's ref_scale_at); padding 0. */
static uint8_t hand_code(int64_t m, int64_t k) { return (uint8_t)((m * 37 + k * 11) % 251); }
static float hand_scale(int64_t idx) {
  return ldexpf(1.0f + (float)(idx % 5) * 0.3f, (int)(idx % 7) - 3);
}
static void hand_storage(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                         int col, int two_d, int64_t M, int64_t K, hq_storage *st) {
  fb_storage(ops, cfg, host, col ? HQ_COLWISE : HQ_ROWWISE, col ? HQ_COLWISE : HQ_ROWWISE, M, K,
             HQ_F32, st);
  uint8_t *q = hq_storage_buf(st, 0)->ptr;
  float *sc = hq_storage_buf(st, 1)->ptr;
  memset(sc, 0, hq_storage_buf(st, 1)->bytes);
  for (int64_t m = 0; m < M; m++)
    for (int64_t k = 0; k < K; k++) {
      q[col ? k * M + m : m * K + k] = hand_code(m, k);
      const int64_t i = ref_scale_at(m, k, M, K, col, two_d);
      sc[i] = hand_scale(i);
    }
}

/* Raw dequantize (HQ_CALL_DEQ_RAW) of hand-built storages, every direction and block shape, both
   element dtypes, pow2 and arbitrary FP32 scales, into f32 / bf16 / f16: it equals the normal
   dequantize byte for byte (fp8_block has no per-tensor factor and no transform), which is
   RN_f32(code value * the block's scale_inv) by this file's index formulas and tests/fp8_ref.h.
   Spelled out: E4M3 0x44 = 3 in a block of scale_inv 0.5 is 1.5; 0x7E = 448 with 3.0 is 1344;
   E5M2 0x7B = 57344 with 2^-10 is 56. */
static void test_raw_dequantize(void **state) {
  (void)state;
  hq_host_api host = direct_host();
  const hq_format_ops *ops = fb_ops(&host);
  const int64_t shapes[][2] = {{2, 130}, {130, 3}, {129, 257}};
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int two_d = 0; two_d < 2; two_d++)
    for (int kind = 0; kind < 2; kind++)
      for (int col = 0; col < 2; col++)
        for (size_t sh = 0; sh < 3; sh++) {
          const int64_t M = shapes[sh][0], K = shapes[sh][1];
          void *cfg = fb_configure(ops, &host, (opts){two_d, kind, 1, 0});
          hq_storage st;
          hand_storage(ops, cfg, &host, col, two_d, M, K, &st);
          for (int o = 0; o < 3; o++) {
            hq_tensor y = hq_test_empty(outs[o], M, K), z = hq_test_empty(outs[o], M, K);
            hq_call call = hq_test_call(&host, 0, 0);
            call.flags = HQ_CALL_DEQ_RAW;
            HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &y));
            call.flags = 0;
            HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &z));
            assert_memory_equal(y.data, z.data, (size_t)(M * K) * hq_dtype_size(outs[o]));
            if (outs[o] == HQ_F32)
              for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++) {
                  const double v = ref_fp8_decode(hand_code(m, k), kind);
                  const float si = hand_scale(ref_scale_at(m, k, M, K, col, two_d));
                  const float got = ((float *)y.data)[m * K + k];
                  if (isnan(v)) {
                    assert_true(isnan(got));
                    continue;
                  }
                  ASSERT_F32_SAME(got, (float)(v * (double)si));
                }
            free(y.data);
            free(z.data);
          }
          fb_storage_free(&st);
          free(cfg);
        }
  /* three values by hand, in a 1-D rowwise [1, 256] storage: block 0 scale_inv 0.5, block 1 3.0 */
  void *cfg = fb_configure(ops, &host, (opts){0, 0, 1, 0});
  hq_storage st;
  fb_storage(ops, cfg, &host, HQ_ROWWISE, HQ_ROWWISE, 1, 256, HQ_F32, &st);
  uint8_t *q = hq_storage_buf(&st, 0)->ptr;
  float *sc = hq_storage_buf(&st, 1)->ptr; /* [2][4]: entry [k/128][m] */
  memset(q, 0, 256);
  memset(sc, 0, 32);
  sc[0] = 0.5f;
  sc[4] = 3.0f;
  q[5] = 0x44;
  q[130] = 0x7e;
  hq_tensor y = hq_test_empty(HQ_F32, 1, 256);
  hq_call call = hq_test_call(&host, 0, 0);
  call.flags = HQ_CALL_DEQ_RAW;
  HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &y));
  assert_true(((float *)y.data)[5] == 1.5f);
  assert_true(((float *)y.data)[130] == 1344.0f);
  assert_true(((float *)y.data)[0] == 0.0f);
  fb_storage_free(&st);
  free(cfg);
  cfg = fb_configure(ops, &host, (opts){0, 1, 1, 0});
  fb_storage(ops, cfg, &host, HQ_ROWWISE, HQ_ROWWISE, 1, 2, HQ_F32, &st);
  ((uint8_t *)hq_storage_buf(&st, 0)->ptr)[1] = 0x7b;
  ((float *)hq_storage_buf(&st, 1)->ptr)[0] = 0x1p-10f;
  hq_tensor y2 = hq_test_empty(HQ_F32, 1, 2);
  HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &y2));
  assert_true(((float *)y2.data)[1] == 56.0f);
  fb_storage_free(&st);
  free(cfg);
  free(y.data);
  free(y2.data);
}

/* emul_dtype. With power-of-two scales (BF16): every raw value of quantized data, in every
   direction and block shape, read back from a bf16 raw dequantize equals the f32 one. The
   far-underflow edge (documented): a block whose amax is 2^-120 gets scale 2^127 (the input
   dtype's max, rounded to a power of two), scale_inv 2^-127, and a code 0x01 (2^-9) in it has the
   raw value 2^-136, below BF16's smallest subnormal 2^-133: BF16 cannot hold it (it is 0 there).
   With FP32 scales (F32): some raw value has more significant bits than BF16's 8. */
static void test_emul_dtype(void **state) {
  (void)state;
  hq_host_api host = direct_host();
  const hq_format_ops *ops = fb_ops(&host);
  const int64_t M = 130, K = 260;
  hq_tensor x = make_input(HQ_F32, M, K, 5, 1);
  for (int two_d = 0; two_d < 2; two_d++)
    for (int kind = 0; kind < 2; kind++)
      for (int pow2 = 0; pow2 < 2; pow2++) {
        void *cfg = fb_configure(ops, &host, (opts){two_d, kind, pow2, 0});
        hq_storage row, col;
        fb_storage(ops, cfg, &host, HQ_ROWWISE, HQ_BOTH, M, K, HQ_F32, &row);
        fb_storage(ops, cfg, &host, HQ_COLWISE, HQ_BOTH, M, K, HQ_F32, &col);
        assert_int_equal(fb_quantize(ops, cfg, &host, &x, HQ_BOTH, &row, &col, 0), HQ_OK);
        for (int c = 0; c < 2; c++) {
          const hq_storage *st = c ? &col : &row;
          assert_int_equal(st->desc.emul_dtype, pow2 ? HQ_BF16 : HQ_F32);
          hq_tensor rf = hq_test_empty(HQ_F32, M, K), rb = hq_test_empty(HQ_BF16, M, K);
          hq_call call = hq_test_call(&host, 0, 0);
          call.flags = HQ_CALL_DEQ_RAW;
          HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, st, &rf));
          HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, st, &rb));
          int64_t inexact = 0;
          for (int64_t i = 0; i < M * K; i++) {
            const float f = ((float *)rf.data)[i], b = hq_bf16_to_f32(((uint16_t *)rb.data)[i]);
            if (isnan(f)) {
              assert_true(isnan(b));
              continue;
            }
            if (fbits(f) != fbits(b)) {
              if (pow2)
                fail_msg("2d %d kind %d %s [%lld]: raw %a is %a in bf16", two_d, kind,
                         c ? "col" : "row", (long long)i, (double)f, (double)b);
              inexact++;
            }
          }
          if (!pow2) assert_true(inexact > 0); /* F32 is needed, not a caution */
          free(rf.data);
          free(rb.data);
        }
        fb_storage_free(&row);
        fb_storage_free(&col);
        free(cfg);
      }
  free(x.data);
  /* the far-underflow edge */
  void *cfg = fb_configure(ops, &host, (opts){0, 0, 1, 0});
  /* amax 2^-120: 448 / 2^-120 overflows FP32 -> FLT_MAX -> 2^127; 2^-129 * 2^127 = 2^-2, and
     2^-136 * 2^127 = 2^-9 is code 0x01 */
  const float v[3] = {0x1p-120f, 0x1p-129f, 0x1p-136f};
  hq_tensor t = row_f32(128, v, 3);
  hq_storage st;
  fb_storage(ops, cfg, &host, HQ_ROWWISE, HQ_ROWWISE, 1, 128, HQ_F32, &st);
  assert_int_equal(fb_quantize(ops, cfg, &host, &t, HQ_ROWWISE, &st, NULL, 0), HQ_OK);
  ASSERT_F32_SAME(((float *)hq_storage_buf(&st, 1)->ptr)[0], 0x1p-127f);
  assert_int_equal(((uint8_t *)hq_storage_buf(&st, 0)->ptr)[2], 0x01);
  hq_tensor rf = hq_test_empty(HQ_F32, 1, 128), rb = hq_test_empty(HQ_BF16, 1, 128);
  hq_call call = hq_test_call(&host, 0, 0);
  call.flags = HQ_CALL_DEQ_RAW;
  HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &rf));
  HQ_OK_OR_FAIL(ops->dequantize(cfg, &call, &st, &rb));
  ASSERT_F32_SAME(((float *)rf.data)[2], 0x1p-136f);
  assert_true(hq_bf16_to_f32(((uint16_t *)rb.data)[2]) != 0x1p-136f);
  ASSERT_F32_SAME(((float *)rf.data)[1], 0x1p-129f); /* 2^-2 * 2^-127: still exact in BF16 */
  ASSERT_F32_SAME(hq_bf16_to_f32(((uint16_t *)rb.data)[1]), 0x1p-129f);
  free(rf.data);
  free(rb.data);
  free(t.data);
  fb_storage_free(&st);
  free(cfg);
}

/* D = alpha * op(A) * op(B) + beta * D0 in F64 from the dequantized operands (row-major [A0, A1]
   and [B0, B1]), D row-major [n, m]; bound: the FP32 accumulation bound (k + 8) * 2^-24 *
   (|alpha| sum |a||b| + |beta D0|) per element. */
static void gemm_ref(const float *a, const float *b, const float *d0, int ta, int tb, int64_t m,
                     int64_t n, int64_t k, double alpha, double beta, double *ref, double *bound) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        const double x = ta ? a[i * k + p] : a[p * m + i];
        const double y = tb ? b[p * n + j] : b[j * k + p];
        s += x * y;
        sa += fabs(x * y);
      }
      const double c = d0 ? beta * d0[j * m + i] : 0.0;
      ref[j * m + i] = alpha * s + c;
      bound[j * m + i] = (double)(k + 8) * 0x1p-24 * (fabs(alpha) * sa + fabs(c)) + 1e-30;
    }
}

/* hq_gemm of two fp8_block operands on the host (1-D x 2-D with FP32 scales, 2-D x 1-D and 1-D
   x 1-D with pow2 scales, every flag pair, partial blocks: k = 200, m = 72, n = 40) equals the F64
   product of their hq_dequantize outputs within FP32 accumulation error; the path is CPU and
   hq_gemm_plan gives this module's reason. */
static void test_hq_gemm_host(void **state) {
  (void)state;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_recipe *r = hq_test_recipe(
      "[format one]\nplugin = fp8_block\n[format two]\nplugin = fp8_block\nblock = 2d\n"
      "[format one32]\nplugin = fp8_block\npower_2_scales = false\ndtype = e5m2\n"
      "[format two32]\nplugin = fp8_block\nblock = 2d\npower_2_scales = false\n"
      "[role *:*:one]\nrowwise = one\ncolumnwise = one\n[role *:*:two]\nrowwise = two\n"
      "columnwise = two\n[role *:*:one32]\nrowwise = one32\ncolumnwise = one32\n"
      "[role *:*:two32]\nrowwise = two32\ncolumnwise = two32\n");
  const char *pairs[3][2] = {{"l:w:one32", "l:x:two32"}, {"l:w:two", "l:x:one"},
                             {"l:w:one", "l:x:one"}};
  const int64_t M = 72, N = 40, K = 200;
  for (int pr = 0; pr < 3; pr++) {
    hq_quantizer *qa = hq_test_quantizer(r, pairs[pr][0]), *qb = hq_test_quantizer(r, pairs[pr][1]);
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const int64_t a0 = ta ? M : K, a1 = ta ? K : M, b0 = tb ? K : N, b1 = tb ? N : K;
        hq_tensor xa = make_input(HQ_F32, a0, a1, 11 + (uint64_t)ta, 0);
        hq_tensor xb = make_input(HQ_BF16, b0, b1, 21 + (uint64_t)tb, 0);
        hq_qtensor *A = NULL, *B = NULL;
        HQ_OK_OR_FAIL(hq_quantize(qa, ctx, &xa, &A));
        HQ_OK_OR_FAIL(hq_quantize(qb, ctx, &xb, &B));
        hq_tensor fa = hq_test_empty(HQ_F32, a0, a1), fb = hq_test_empty(HQ_F32, b0, b1);
        HQ_OK_OR_FAIL(hq_dequantize(A, ctx, ta ? HQ_ROWWISE : HQ_COLWISE, &fa));
        HQ_OK_OR_FAIL(hq_dequantize(B, ctx, tb ? HQ_COLWISE : HQ_ROWWISE, &fb));
        hq_tensor d = hq_test_tensor(HQ_F32, N, M, 31, 1.0f);
        float *d0 = malloc(sizeof(float) * (size_t)(M * N));
        memcpy(d0, d.data, sizeof(float) * (size_t)(M * N));
        hq_gemm_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, NULL,
                                   &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
        assert_non_null(strstr(info.reason, "host"));
        HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, -0.75f, 2.0f,
                              NULL, &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
        assert_string_equal(info.format_a, "fp8_block");
        double *ref = malloc(sizeof(double) * (size_t)(M * N));
        double *bnd = malloc(sizeof(double) * (size_t)(M * N));
        gemm_ref(fa.data, fb.data, d0, ta, tb, M, N, K, -0.75, 2.0, ref, bnd);
        for (int64_t i = 0; i < M * N; i++) {
          const double got = ((float *)d.data)[i];
          if (fabs(got - ref[i]) > bnd[i])
            fail_msg("%s x %s ta %d tb %d [%lld]: %.9g, F64 reference %.9g (tolerance %.3g)",
                     pairs[pr][0], pairs[pr][1], ta, tb, (long long)i, got, ref[i], bnd[i]);
        }
        free(ref);
        free(bnd);
        free(d0);
        free(d.data);
        free(fa.data);
        free(fb.data);
        free(xa.data);
        free(xb.data);
        hq_qtensor_free(A);
        hq_qtensor_free(B);
      }
    hq_quantizer_free(qa);
    hq_quantizer_free(qb);
  }
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
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
      cmocka_unit_test(test_foreign_storage_refused),
      cmocka_unit_test(test_direct_update_scratch),
      cmocka_unit_test(test_amax_none),
      cmocka_unit_test(test_fsdp_edge_shapes),
      cmocka_unit_test(test_raw_dequantize),
      cmocka_unit_test(test_emul_dtype),
      cmocka_unit_test(test_hq_gemm_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
