/*
** test_nvfp4.c -- the nvfp4 plugin through the public API (recipes, quantizers, storages, the
** split amax, hq_gemm on the host) and, for the device, option, scratch, cross-instance,
** raw-dequantize, tensor-factor and gemm-op checks, through its ops table (ABI 2.1). The contract
** every format meets (update == fresh quantize, a given amax == the quantizer's own, a storage
** read by other instances, FSDP, offload, checkpoints): test_conformance.
** Expectations are independent of the plugin's code: hand-built rows and scales, the descriptor
** table of the ABI 2.0 / 2.1 briefs, an F64 product, and a reference quantizer written here
** in double precision from FORMATS.md 3.3 (brute-force E4M3 / E2M1 encoders, its own index
** arithmetic, the swizzle of FORMATS.md 2.4, the dense RHT matrix).
*/
#include <dlfcn.h>
#include <math.h>

#include "hq_test.h"
#include "hq/plugin.h"
#include "nvfp4_rules.h" /* HQ_NVFP4_RHT_SIGNS and the (KAT-checked) Philox4x32-10 */

// --- running a quantize through the API --------------------------------------------------------

typedef struct run {
  hq_recipe *r;
  hq_quantizer *q;
  hq_ctx *ctx;
  hq_qtensor *t;
} run;

static hq_ctx *ctx_with_seed(uint64_t seed) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  d.seed = seed;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  return ctx;
}

static hq_recipe *nv_recipe(const char *opts) {
  char text[1024];
  snprintf(text, sizeof text,
           "[format nv]\nplugin = nvfp4\n%s\n[role *:*:*]\nrowwise = nv\ncolumnwise = nv\n",
           opts ? opts : "");
  return hq_test_recipe(text);
}

/* Quantize x with [format nv] options `opts` (newline-separated) in a context of `seed`. */
static void run_quant(run *u, const char *opts, const hq_tensor *x, uint64_t seed,
                      uint32_t usage) {
  memset(u, 0, sizeof *u);
  u->r = nv_recipe(opts);
  u->q = hq_test_quantizer(u->r, "linear:input:x");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(u->q, usage));
  u->ctx = ctx_with_seed(seed);
  HQ_OK_OR_FAIL(hq_quantize(u->q, u->ctx, x, &u->t));
}

static void run_free(run *u) {
  hq_qtensor_free(u->t);
  hq_quantizer_free(u->q);
  hq_recipe_free(u->r);
  hq_ctx_destroy(u->ctx);
  memset(u, 0, sizeof *u);
}

static const hq_buffer *bufp(const run *u, uint32_t dir, int i) {
  const hq_storage *s = hq_qtensor_storage(u->t, dir);
  assert_non_null(s);
  return hq_storage_cbuf(s, (uint32_t)i);
}
static const uint8_t *bytes_of(const run *u, uint32_t dir, int i) { return bufp(u, dir, i)->ptr; }
static float amax_of(const run *u, uint32_t dir) { return *(const float *)bufp(u, dir, 2)->ptr; }

static hq_tensor dequant(const run *u, uint32_t dir, hq_dtype t) {
  hq_tensor y = hq_test_empty(t, hq_qtensor_rows(u->t), hq_qtensor_cols(u->t));
  HQ_OK_OR_FAIL(hq_dequantize(u->t, u->ctx, dir, &y));
  return y;
}

static float getf(const hq_tensor *x, int64_t i, int64_t k) {
  return hq_load_hp(x->data, i * x->cols + k, x->dtype);
}

static hq_tensor f32_from(const float *v, int64_t M, int64_t K) {
  hq_tensor x = hq_test_empty(HQ_F32, M, K);
  memcpy(x.data, v, (size_t)(M * K) * sizeof(float));
  return x;
}

// --- the independent reference ----------------------------------------------------------------

static const double E2M1_MAG[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

static unsigned ref_e2m1(double x) {
  if (isnan(x)) return 7u;
  unsigned s = signbit(x) ? 8u : 0u, best = 0;
  double a = fabs(x) > 6 ? 6 : fabs(x), bd = INFINITY;
  for (unsigned c = 0; c < 8; c++) {
    double d = fabs(E2M1_MAG[c] - a);
    if (d < bd || (d == bd && !(c & 1u))) bd = d, best = c;
  }
  return s | best;
}
static double ref_e2m1_val(unsigned c) { return (c & 8u) ? -E2M1_MAG[c & 7u] : E2M1_MAG[c & 7u]; }

static double ref_e4m3_val(unsigned c) {
  unsigned e = (c >> 3) & 0xfu, m = c & 7u;
  return e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp((double)m, -9);
}
static unsigned ref_e4m3(double a) { /* a >= 0, not NaN */
  unsigned best = 0;
  double bd = INFINITY;
  if (a > 448) a = 448;
  for (unsigned c = 0; c <= 0x7e; c++) {
    double d = fabs(ref_e4m3_val(c) - a);
    if (d < bd || (d == bd && !(c & 1u))) bd = d, best = c;
  }
  return best;
}
static float rf(double v) { /* RN to FP32 without an out-of-range cast */
  if (fabs(v) >= (double)FLT_MAX + ldexp(1.0, 103)) return v > 0 ? INFINITY : -INFINITY;
  if (fabs(v) > (double)FLT_MAX) return v > 0 ? FLT_MAX : -FLT_MAX;
  return (float)v;
}
static double bf16_ref(double v) { /* RNE to 8 significant bits */
  if (v == 0.0 || isnan(v) || isinf(v)) return v;
  int e;
  double f = frexp(v, &e);
  return ldexp(nearbyint(ldexp(f, 8)), e - 8);
}

static int64_t ru(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Byte offset of scale S[r][b] of a direction whose stored rows hold C elements. */
static int64_t ref_scale_off(int64_t r, int64_t b, int64_t C, int swz) {
  int64_t ld = ru(C / 16, 4);
  if (!swz) return r * ld + b;
  return ((r / 128) * (ld / 4) + b / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + b % 4;
}

typedef struct ref_out {
  uint8_t *data, *scale;
  float amax;
  size_t data_bytes, scale_bytes;
} ref_out;

/* Quantize v (the [R, C] matrix as STORED by the direction: rowwise x, columnwise x^T or
   RHT(x^T)) by FORMATS.md 3.3, with tile2d = 16x16 tiles, or stochastic rounding when bits is
   given (bits(block, e) -> u8). */
typedef unsigned (*ref_bits_fn)(const void *ctx, int64_t block, int e);
static ref_out ref_quantize(const float *v, int64_t R, int64_t C, int swz, int tile2d,
                            ref_bits_fn bits, const void *bctx) {
  ref_out o;
  o.data_bytes = (size_t)(R * C / 2);
  o.scale_bytes = (size_t)(ru(R, 128) * ru(C / 16, 4));
  o.data = calloc(o.data_bytes + 1, 1);
  o.scale = calloc(o.scale_bytes + 1, 1);
  double A = 0;
  for (int64_t i = 0; i < R * C; i++)
    if (!isnan(v[i]) && fabs(v[i]) > A) A = fabs(v[i]);
  o.amax = (float)A;
  float s_enc = 1.0f;
  if (A != 0) {
    double q = 2688.0 / A;
    s_enc = q >= (double)FLT_MAX ? FLT_MAX : (float)q;
    if (s_enc == 0.0f) s_enc = 1.0f;
  }
  float s_dec = (float)(1.0 / s_enc);
  float m = (float)((double)s_enc * (double)(float)(1.0 / 6.0));
  for (int64_t r = 0; r < R; r++) {
    for (int64_t b = 0; b < C / 16; b++) {
      double ab = 0;
      int64_t r0 = tile2d ? r / 16 * 16 : r, r1 = tile2d ? r0 + 16 : r + 1;
      for (int64_t rr = r0; rr < r1; rr++)
        for (int e = 0; e < 16; e++) {
          float x = v[rr * C + b * 16 + e];
          if (!isnan(x) && fabs(x) > ab) ab = fabs(x);
        }
      float p = rf(ab * m);
      if (p > FLT_MAX) p = FLT_MAX;
      unsigned sf = ref_e4m3(p);
      o.scale[ref_scale_off(r, b, C, swz)] = (uint8_t)sf;
      float d = (float)(ref_e4m3_val(sf) * (double)s_dec);
      float enc = d == 0 ? FLT_MAX : (1.0 / d >= (double)FLT_MAX ? FLT_MAX : (float)(1.0 / d));
      for (int e = 0; e < 16; e++) {
        int64_t c = b * 16 + e;
        float y = rf((double)v[r * C + c] * enc);
        unsigned code;
        if (!bits) code = ref_e2m1(y);
        else if (isnan(y)) code = 7;
        else {
          double a = fabs(y), st = a < 2 ? 0.5 : (a < 4 ? 1 : 2);
          double t = a >= 6 ? 6 : (double)(float)(a + bits(bctx, r * (C / 16) + b, e) / 256.0 * st);
          double st2 = t < 2 ? 0.5 : (t < 4 ? 1 : 2);
          double q = floor(t / st2) * st2;
          code = ref_e2m1(q > 6 ? 6 : q) | (signbit(y) ? 8u : 0u);
        }
        o.data[r * (C / 2) + c / 2] |= (uint8_t)(code << ((c & 1) * 4));
      }
    }
  }
  return o;
}

static void ref_free(ref_out *o) {
  free(o->data);
  free(o->scale);
}

/* x^T as floats, optionally through the dense RHT (double, then BF16), from tensor x. */
static float *stored_colwise(const hq_tensor *x, int rht, uint32_t mask) {
  int64_t M = x->rows, K = x->cols;
  float *t = malloc((size_t)(M * K) * sizeof(float));
  for (int64_t k = 0; k < K; k++) {
    for (int64_t i0 = 0; i0 < M; i0 += 16) {
      double g[16];
      for (int e = 0; e < 16; e++) g[e] = getf(x, i0 + e, k);
      for (int c = 0; c < 16; c++) {
        if (!rht) {
          t[k * M + i0 + c] = (float)g[c];
          continue;
        }
        double acc = 0;
        for (int r = 0; r < 16; r++)
          acc += bf16_ref(g[r]) * (((mask >> r) & 1u) ? -1 : 1) *
                 ((__builtin_popcount((unsigned)(r & c)) & 1) ? -1 : 1);
        t[k * M + i0 + c] = (float)bf16_ref(acc / 4);
      }
    }
  }
  return t;
}

static float *as_floats(const hq_tensor *x) {
  float *v = malloc((size_t)(x->rows * x->cols) * sizeof(float));
  for (int64_t i = 0; i < x->rows * x->cols; i++) v[i] = hq_load_hp(x->data, i, x->dtype);
  return v;
}

/* Compare a storage with the reference, byte for byte (scale padding included). */
static void expect_storage(const run *u, uint32_t dir, const ref_out *o) {
  const hq_buffer *d = bufp(u, dir, 0), *s = bufp(u, dir, 1);
  assert_int_equal(d->bytes, o->data_bytes);
  assert_int_equal(s->bytes, o->scale_bytes);
  for (size_t i = 0; i < o->scale_bytes; i++)
    if (((const uint8_t *)s->ptr)[i] != o->scale[i])
      fail_msg("%s scale byte %zu: %#x, want %#x", dir == HQ_ROWWISE ? "rowwise" : "columnwise",
               i, ((const uint8_t *)s->ptr)[i], o->scale[i]);
  for (size_t i = 0; i < o->data_bytes; i++)
    if (((const uint8_t *)d->ptr)[i] != o->data[i])
      fail_msg("%s data byte %zu: %#x, want %#x", dir == HQ_ROWWISE ? "rowwise" : "columnwise",
               i, ((const uint8_t *)d->ptr)[i], o->data[i]);
  assert_true(amax_of(u, dir) == o->amax);
}

/* Test data: N(0,1) rows whose 16-blocks get magnitudes spread over 2^-12 .. 2^10, with zero
   blocks, so that block scales cover the E4M3 range including subnormals and 0. */
static hq_tensor spread_tensor(hq_dtype t, int64_t M, int64_t K, uint64_t seed) {
  hq_tensor x = hq_test_empty(t, M, K);
  uint64_t s = seed;
  for (int64_t i = 0; i < M; i++) {
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      uint64_t r = hq_test_rand(&s);
      float scale = (r % 11 == 0) ? 0.0f : ldexpf(1.0f, (int)(r % 23) - 12);
      for (int e = 0; e < 16; e++)
        hq_store_hp(x.data, i * K + k0 + e, t, hq_test_normal(&s) * scale);
    }
  }
  return x;
}

// --- tests ---------------------------------------------------------------------------------

static void test_plugin_caps_and_options(void **state) {
  (void)state;
  hq_recipe *r = nv_recipe(NULL);
  const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), "nvfp4");
  assert_non_null(p);
  assert_int_equal(hq_plugin_caps(p),
                   HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR |
                       (hq_built_with_cuda() ? HQ_CAP_CUDA | HQ_CAP_RNG_DEV : 0));
  static const char *names[] = {"rht",      "rht_sign_mask", "stochastic_rounding",
                                "seed",     "block_2d",      "swizzle",
                                "scale_dtype", "global_scale"};
  static const char *defs[] = {"false", "0xD7E8", "false", "0",
                               "false", "false",  "e4m3",  "tensor"};
  const hq_option *o = hq_plugin_options(p);
  for (int i = 0; i < 8; i++) {
    assert_string_equal(o[i].name, names[i]);
    assert_string_equal(o[i].def, defs[i]);
    assert_true(o[i].help && *o[i].help);
  }
  assert_string_equal(o[6].choices, "e4m3|ue5m3");
  assert_string_equal(o[7].choices, "tensor|row|none");
  assert_null(o[8].name);
  assert_int_equal(o[1].min, 0);
  assert_int_equal(o[1].max, 65535);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  assert_true(hq_quantizer_requant_safe(q)); /* no RNG */
  assert_true(hq_quantizer_fused(q));
  hq_quantizer_free(q);
  hq_recipe_free(r);
  r = nv_recipe("stochastic_rounding = true\nrht = true");
  q = hq_test_quantizer(r, "a:b:c");
  assert_false(hq_quantizer_requant_safe(q)); /* SR: not REQUANT_SAFE */
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

static void expect_recipe_error(const char *opts, const char *needle1, const char *needle2) {
  char text[512];
  snprintf(text, sizeof text,
           "[format nv]\nplugin = nvfp4\n%s\n[role *:*:*]\nrowwise = nv\ncolumnwise = nv\n", opts);
  hq_recipe_opts ro = {0};
  ro.struct_size = sizeof ro;
  ro.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "test.ini", &ro, &r));
  assert_int_equal(hq_recipe_error_count(r), 1);
  const char *e = hq_recipe_error(r, 0);
  if (!strstr(e, needle1) || !strstr(e, needle2))
    fail_msg("error '%s' lacks '%s' / '%s'", e, needle1, needle2);
  hq_recipe_free(r);
}

static void test_configure_errors(void **state) {
  (void)state;
  expect_recipe_error("block_2d = true\nrht = true", "block_2d", "rht");
  expect_recipe_error("block_2d = true\nstochastic_rounding = true", "block_2d",
                      "stochastic_rounding");
  expect_recipe_error("rht_sign_mask = 65536", "rht_sign_mask", "out of range");
  expect_recipe_error("seed = -1", "seed", "out of range");
}

/* One buffer as the ABI 2.0 table describes it. */
typedef struct want_buf {
  const char *name;
  uint32_t role;
  hq_dtype dtype;
  int ndim;
  int64_t d0, d1;
  uint32_t gather;
  int32_t m_div;
} want_buf;

static void expect_buf(const hq_storage *s, uint32_t i, const want_buf *w) {
  const hq_buffer *b = hq_storage_cbuf(s, i);
  assert_string_equal(b->name, w->name);
  if (b->role != w->role || b->dtype != w->dtype || b->ndim != w->ndim ||
      b->shape[0] != w->d0 || (w->ndim > 1 && b->shape[1] != w->d1) || b->gather != w->gather ||
      b->m_div != w->m_div)
    fail_msg("%s: role %u dtype %d ndim %d shape [%lld, %lld] gather %u m_div %d; want role %u "
             "dtype %d ndim %d shape [%lld, %lld] gather %u m_div %d",
             w->name, b->role, (int)b->dtype, b->ndim, (long long)b->shape[0],
             (long long)b->shape[1], b->gather, b->m_div, w->role, (int)w->dtype, w->ndim,
             (long long)w->d0, (long long)w->d1, w->gather, w->m_div);
  assert_int_equal(b->flags, 0); /* nothing is shared between the directions */
  size_t elem = w->dtype == HQ_F32 ? 4 : 1;
  assert_int_equal(b->bytes, elem * (size_t)w->d0 * (size_t)(w->ndim > 1 ? w->d1 : 1));
}

/* The descriptor and buffer table of the ABI 2.0 / 2.1 briefs, for every option that changes it, on
   shapes whose scale buffers are padded (M and K not multiples of 128, K/16 or M/16 not
   multiples of 4), through the public API. */
static void test_layout_desc_buffers(void **state) {
  (void)state;
  static const struct {
    const char *opts;
    int swz, two_d, sr;
    uint64_t rht_mask; /* 0: no RHT */
  } cases[] = {
      {NULL, 0, 0, 0, 0},
      {"swizzle = true", 1, 0, 0, 0},
      {"rht = true", 0, 0, 0, HQ_NVFP4_RHT_SIGNS},
      {"swizzle = true\nrht = true\nrht_sign_mask = 0x1234", 1, 0, 0, 0x1234},
      {"block_2d = true", 0, 1, 0, 0},
      {"block_2d = true\nswizzle = true", 1, 1, 0, 0},
      {"stochastic_rounding = true", 0, 0, 1, 0},
      {"stochastic_rounding = true\nrht = true\nswizzle = true", 1, 0, 1, HQ_NVFP4_RHT_SIGNS},
  };
  static const int64_t shapes[][2] = {{48, 32}, {144, 80}, {16, 272}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const int64_t M = shapes[si][0], K = shapes[si][1];
      hq_tensor x = hq_test_tensor(HQ_F32, M, K, 1, 1.0f);
      run u;
      run_quant(&u, cases[ci].opts, &x, 0, HQ_BOTH);
      const hq_storage *r = hq_qtensor_storage(u.t, HQ_ROWWISE);
      const hq_storage *c = hq_qtensor_storage(u.t, HQ_COLWISE);
      assert_non_null(r);
      assert_non_null(c);
      assert_int_equal(r->nbuf, 3);
      assert_int_equal(c->nbuf, 3);
      /* swizzled scales cannot be gathered (m_div then keeps its default, 1) */
      const uint32_t scale_row = cases[ci].swz ? HQ_GATHER_NEVER : HQ_GATHER_ROWS;
      const uint32_t scale_col = cases[ci].swz ? HQ_GATHER_NEVER : HQ_GATHER_COLS;
      const want_buf wr[3] = {
          {"data", HQ_ROLE_DATA, HQ_E2M1X2, 2, M, K / 2, HQ_GATHER_ROWS, 1},
          {"scale_inv", HQ_ROLE_SCALE, HQ_E4M3, 2, ru(M, 128), ru(K / 16, 4), scale_row, 1},
          {"amax", HQ_ROLE_AMAX, HQ_F32, 1, 1, 0, HQ_GATHER_SAME, 1},
      };
      const want_buf wc[3] = {
          {"columnwise_data", HQ_ROLE_DATA, HQ_E2M1X2, 2, K, M / 2, HQ_GATHER_COLS, 2},
          {"columnwise_scale_inv", HQ_ROLE_SCALE, HQ_E4M3, 2, ru(K, 128), ru(M / 16, 4),
           scale_col, cases[ci].swz ? 1 : 16},
          {"columnwise_amax", HQ_ROLE_AMAX, HQ_F32, 1, 1, 0, HQ_GATHER_SAME, 1},
      };
      for (uint32_t i = 0; i < 3; i++) {
        expect_buf(r, i, &wr[i]);
        expect_buf(c, i, &wc[i]);
      }
      for (int d = 0; d < 2; d++) {
        const hq_storage *st = d ? c : r;
        const hq_operand_desc *o = &st->desc;
        const int col = d == 1, rht = col && cases[ci].rht_mask != 0;
        assert_int_equal(st->dir, col ? HQ_COLWISE : HQ_ROWWISE);
        assert_int_equal(o->elem, HQ_E2M1X2);
        assert_int_equal(o->order, col ? HQ_ORDER_KM : HQ_ORDER_MK);
        assert_int_equal(o->scale_mode, HQ_SCALE_VEC16_UE4M3);
        assert_int_equal(o->scale_layout,
                         cases[ci].swz ? HQ_SCALE_LAYOUT_SWIZZLED : HQ_SCALE_LAYOUT_OUTER_MAJOR);
        assert_int_equal(o->block_m, cases[ci].two_d || col ? 16 : 1);
        assert_int_equal(o->block_k, cases[ci].two_d || !col ? 16 : 1);
        assert_int_equal(o->transform, rht ? HQ_TRANSFORM_RHT16 : HQ_TRANSFORM_NONE);
        assert_int_equal(o->transform_param, rht ? cases[ci].rht_mask : 0);
        assert_int_equal(o->shard_rows, cases[ci].sr ? 0 : 16);
        /* 2.1: raw values e2m1 * sf are exact in BF16 (test_emul_dtype_bf16) */
        assert_int_equal(o->emul_dtype, HQ_BF16);
        assert_int_equal(o->reserved32, 0);
        for (size_t k = 0; k < sizeof o->reserved / sizeof o->reserved[0]; k++)
          assert_int_equal(o->reserved[k], 0);
        for (int k = 0; k < HQ_META_BYTES; k++) assert_int_equal(st->meta[k], 0); /* unused */
      }
      assert_int_equal(hq_qtensor_shard_rows(u.t), cases[ci].sr ? 0 : 16);
      assert_int_equal(hq_qtensor_saved_count(u.t), 6);
      /* a columnwise-only tensor describes the same columnwise storage */
      run co;
      run_quant(&co, cases[ci].opts, &x, 0, HQ_COLWISE);
      const hq_storage *c2 = hq_qtensor_storage(co.t, HQ_COLWISE);
      for (uint32_t i = 0; i < 3; i++) expect_buf(c2, i, &wc[i]);
      assert_memory_equal(&c2->desc, &c->desc, sizeof c->desc);
      run_free(&co);
      run_free(&u);
      free(x.data);
    }
  }
}

static void test_shape_errors(void **state) {
  (void)state;
  hq_recipe *r = nv_recipe(NULL);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_ctx *ctx = ctx_with_seed(0);
  hq_qtensor *t = NULL;
  hq_tensor x = hq_test_tensor(HQ_F32, 32, 40, 2, 1.0f);
  assert_int_equal(hq_quantize(q, ctx, &x, &t), HQ_ESHAPE);
  HQ_ERROR_HAS("nvfp4: cols = 40 is not a multiple of 16");
  assert_null(t);
  free(x.data);
  x = hq_test_tensor(HQ_BF16, 40, 32, 2, 1.0f);
  assert_int_equal(hq_quantize(q, ctx, &x, &t), HQ_ESHAPE);
  HQ_ERROR_HAS("nvfp4: rows = 40 is not a multiple of 16");
  assert_int_equal(hq_make_empty(q, ctx, 24, 16, HQ_F32, &t), HQ_ESHAPE);
  HQ_ERROR_HAS("rows = 24 is not a multiple of 16");
  assert_int_equal(hq_quantizer_set_usage(q, HQ_COLWISE), HQ_OK);
  assert_int_equal(hq_make_empty(q, ctx, 16, 8, HQ_F32, &t), HQ_ESHAPE);
  HQ_ERROR_HAS("cols = 8 is not a multiple of 16");
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* A hand-built 16x16 tensor: amax 2688 (row 15) makes S_enc = 1; row 0 holds the E2M1 values
   themselves in a block of amax 6 (sf = 1.0 = 0x38, enc = 1), so its codes are the values'. */
static void test_hand_built_packing(void **state) {
  (void)state;
  float v[16 * 16] = {0};
  static const float row0[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4,
                                 -6, 0.25f};
  memcpy(v, row0, sizeof row0);
  v[15 * 16] = 2688.0f;
  hq_tensor x = f32_from(v, 16, 16);
  run u;
  run_quant(&u, NULL, &x, 0, HQ_BOTH);
  static const uint8_t want0[8] = {0x10, 0x32, 0x54, 0x76, 0xa9, 0xcb, 0xed, 0x0f};
  assert_memory_equal(bytes_of(&u, HQ_ROWWISE, 0), want0, 8);
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[0], 0x38);         /* row 0: sf = 1.0 */
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[1], 0x00);         /* padding */
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[1 * 4], 0x00);     /* row 1: zero block */
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[15 * 4], 0x7e);    /* row 15: 2688 -> 448 */
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 0)[15 * 8], 0x07);    /* 2688 * RN(1/448) -> 6 */
  assert_true(amax_of(&u, HQ_ROWWISE) == 2688.0f);
  assert_true(amax_of(&u, HQ_COLWISE) == 2688.0f);
  /* columnwise, stored [16, 8]: column 0 = (0, 0, ..., 2688) -> codes 0 ... 7 in the high
     nibble of byte 7; column 7 = (6, 0, ...): amax 6 -> sf 0x38, code 7 in the low nibble */
  const uint8_t *cd = bytes_of(&u, HQ_COLWISE, 0), *cs = bytes_of(&u, HQ_COLWISE, 1);
  static const uint8_t col0[8] = {0, 0, 0, 0, 0, 0, 0, 0x70};
  static const uint8_t col7[8] = {0x07, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(cd, col0, 8);
  assert_memory_equal(cd + 7 * 8, col7, 8);
  assert_int_equal(cs[0 * 4], 0x7e);
  assert_int_equal(cs[7 * 4], 0x38);
  /* column 13 = (-4, 0, ...): 4 * RN(1/6) = 0.6666667 -> E4M3 0.6875 (0x33, 1.375 * 2^-1) */
  assert_int_equal(cs[13 * 4], 0x33);
  /* dequantize: row 0 returns its values exactly (dm = 1 * 2688 * RN(1/2688) = 1) */
  hq_tensor y = dequant(&u, HQ_ROWWISE, HQ_F32);
  for (int k = 0; k < 15; k++) assert_true(getf(&y, 0, k) == row0[k]);
  assert_true(getf(&y, 0, 15) == 0.0f);
  free(y.data);
  run_free(&u);
  free(x.data);
}

/* FORMATS.md 3.3 by hand with A = 10: a block of amax 2.5 gets sf = 0x6E (112), enc =
   2.3999999 (0x40199999), q = E2M1(RN(x * enc)); dequantized with RN(RN(112 * 10) * RN(1/2688))
   = 0.41666669. (Numbers from a separate float32 calculation.) */
static void test_hand_computed_chain(void **state) {
  (void)state;
  float v[16 * 16] = {0};
  static const float blk[16] = {2.5f, -1.0f, 0.3f, 0.0f, 1.25f, -2.5f, 0.7f, 0.1f,
                                1.9f, -0.4f, 2.0f, 1.5f, -0.21f, 0.625f, 1.66f, -2.2f};
  memcpy(v, blk, sizeof blk);
  v[16 * 3 + 5] = -10.0f; /* the global amax, in another block */
  hq_tensor x = f32_from(v, 16, 16);
  run u;
  run_quant(&u, NULL, &x, 0, HQ_ROWWISE);
  static const uint8_t want[8] = {0xc7, 0x01, 0xf5, 0x03, 0xa6, 0x66, 0x39, 0xf6};
  assert_memory_equal(bytes_of(&u, HQ_ROWWISE, 0), want, 8);
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[0], 0x6e);
  assert_true(amax_of(&u, HQ_ROWWISE) == 10.0f);
  assert_null(hq_qtensor_storage(u.t, HQ_COLWISE));
  hq_tensor y = dequant(&u, HQ_ROWWISE, HQ_F32);
  static const float deq[16] = {2.5f, -0.8333333730697632f, 0.2083333432674408f, 0.0f, 1.25f,
                                -2.5f, 0.625f, 0.0f, 1.6666667461395264f, -0.4166666865348816f,
                                1.6666667461395264f, 1.6666667461395264f, -0.2083333432674408f,
                                0.625f, 1.6666667461395264f, -2.5f};
  for (int k = 0; k < 16; k++) assert_true(getf(&y, 0, k) == deq[k]);
  assert_true(getf(&y, 3, 5) == -10.0f); /* the amax block: 6 * RN(448 * 10 * RN(1/2688)) */
  free(y.data);
  run_free(&u);
  free(x.data);
}

// --- options: global_scale = row, scale_dtype = ue5m3, global_scale = none -------------------

/* The E2M1 values in one 16-block (amax 6); 0.25 ties to 0. Packed: want_e2m1_bytes. */
static const float E2M1_ROW[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4,
                                   -6, 0.25f};
static const uint8_t E2M1_BYTES[8] = {0x10, 0x32, 0x54, 0x76, 0xa9, 0xcb, 0xed, 0x0f};

/* The row multipliers of row_scaled_input's rows 0..2. */
static const float ROW_MUL[3] = {1.0f, 1024.0f, 1.0f / 1024.0f};

/* v[16 x 32]: rows 0..2 are E2M1_ROW times ROW_MUL[r] in both 16-blocks, the rest zero; as a
   tensor over v. */
static hq_tensor row_scaled_input(float v[16 * 32]) {
  memset(v, 0, 16 * 32 * sizeof(float));
  for (int r = 0; r < 3; r++)
    for (int k = 0; k < 32; k++) v[r * 32 + k] = E2M1_ROW[k % 16] * ROW_MUL[r];
  return f32_from(v, 16, 32);
}

/* global_scale = row, rowwise, by hand. Rows 0..2 are E2M1_ROW times 1, 2^10 and 2^-10 in
   both 16-blocks; row 3 is zero. Each row's amax A_r = 6 * 2^k gives S_enc = 448 * 2^-k,
   m = 74.66667 * 2^-k (0x42955556 for k = 0) and a block scale RN(6 * 2^k * m) = 448.00003 ->
   E4M3 448 (0x7E); enc = RN(1 / RN(448 * RN(1 / S_enc))) = 2^-k, so every row has row 0's codes,
   and the decode multiplier RN(RN(448 * A_r) * RN(1/2688)) = 2^k gives the values back exactly.
   With one amax for the tensor (6144) row 2's block scale 0.00586 * 0.0729 underflows E4M3 and
   the row dequantizes to zeros. Columnwise: the copy is x^T's rowwise row-scaled copy (a column
   of x is a stored row), its amax buffer one amax per column of x. */
static void test_row_scaled_hand(void **state) {
  (void)state;
  const int64_t M = 16, K = 32;
  float v[16 * 32];
  hq_tensor x = row_scaled_input(v);
  run u;
  run_quant(&u, "global_scale = row", &x, 0, HQ_BOTH);
  const hq_buffer *am = bufp(&u, HQ_ROWWISE, 2);
  assert_string_equal(am->name, "amax");
  assert_int_equal(am->dtype, HQ_F32);
  assert_int_equal(am->role, HQ_ROLE_OTHER);
  assert_int_equal(am->ndim, 1);
  assert_int_equal(am->shape[0], M);
  const float *ra = am->ptr;
  assert_true(ra[0] == 6.0f && ra[1] == 6144.0f && ra[2] == 6.0f / 1024.0f && ra[3] == 0.0f);
  const uint8_t *d = bytes_of(&u, HQ_ROWWISE, 0), *sc = bytes_of(&u, HQ_ROWWISE, 1);
  for (int r = 0; r < 3; r++)
    for (int b = 0; b < 2; b++) {
      assert_memory_equal(d + r * (K / 2) + b * 8, E2M1_BYTES, 8);
      assert_int_equal(sc[r * 4 + b], 0x7e);
    }
  for (int b = 0; b < 16; b++) assert_int_equal(d[3 * (K / 2) + b], 0);
  assert_int_equal(sc[3 * 4], 0x00);
  hq_tensor y = dequant(&u, HQ_ROWWISE, HQ_F32);
  for (int64_t i = 0; i < M * K; i++)
    if (((const float *)y.data)[i] !=
        (i / K < 3 && v[i] == 0.25f * ROW_MUL[i / K] ? 0.0f : v[i]))
      fail_msg("row-scaled element %lld: %g, want %g", (long long)i, ((const float *)y.data)[i],
               v[i]);
  free(y.data);
  /* the descriptor: no native GEMM reads it; raw values carry the row factor (F32) */
  const hq_storage *st = hq_qtensor_storage(u.t, HQ_ROWWISE);
  assert_int_equal(st->desc.scale_mode, HQ_SCALE_OTHER);
  assert_int_equal(st->desc.emul_dtype, HQ_F32);
  assert_int_equal(st->desc.shard_rows, 16);
  assert_int_equal(hq_qtensor_storage(u.t, HQ_COLWISE)->desc.shard_rows, 0);
  /* columnwise = rowwise of x^T, byte for byte, amaxes included */
  float vt[32 * 16];
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++) vt[k * M + i] = v[i * K + k];
  hq_tensor xt = f32_from(vt, K, M);
  run ut;
  run_quant(&ut, "global_scale = row", &xt, 0, HQ_ROWWISE);
  for (int i = 0; i < 3; i++) {
    const hq_buffer *a = bufp(&u, HQ_COLWISE, i), *b = bufp(&ut, HQ_ROWWISE, i);
    assert_int_equal(a->bytes, b->bytes);
    assert_memory_equal(a->ptr, b->ptr, a->bytes);
  }
  assert_string_equal(bufp(&u, HQ_COLWISE, 2)->name, "columnwise_amax");
  /* column 7 = (6, 6144, 6/1024, 0, ...): amax 6144, codes 7 only for row 1 (byte 0 = 0x70) */
  assert_true(((const float *)bufp(&u, HQ_COLWISE, 2)->ptr)[7] == 6144.0f);
  assert_int_equal(bytes_of(&u, HQ_COLWISE, 0)[7 * (M / 2)], 0x70);
  y = dequant(&u, HQ_COLWISE, HQ_F32);
  hq_tensor yt = dequant(&ut, HQ_ROWWISE, HQ_F32);
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++) assert_true(getf(&y, i, k) == getf(&yt, k, i));
  free(y.data);
  free(yt.data);
  run_free(&ut);
  free(xt.data);
  run_free(&u);
  /* one amax per tensor loses row 2 */
  run_quant(&u, NULL, &x, 0, HQ_ROWWISE);
  y = dequant(&u, HQ_ROWWISE, HQ_F32);
  for (int64_t k = 0; k < K; k++) assert_true(getf(&y, 2, k) == 0.0f);
  free(y.data);
  run_free(&u);
  free(x.data);
}

/* scale_dtype = ue5m3 by hand, with the global scale and without. Row 0: E2M1_ROW; row 1:
   E2M1_ROW * 2^-12; row 15 starts with 688128 = 6 * 114688 (the tensor amax, so S_enc = 1).
   tensor: m = RN(1/6); row 0's scale RN(6 * m) = 1 -> UE5M3 0x78, codes = values; row 1's
   2^-12 -> 0x18 (e = 3); row 15's 114688.0x -> 0xFE, code 7; decode RN(RN(sf * A) *
   RN(1/688128)) = sf, so all three dequantize exactly. none: the same codes and scales (S_enc
   is 1 either way here), no amax buffer, x' = e2m1 * sf. E4M3 with a tensor scale keeps row 1
   only to 2^-9 * 2688 / 688128 resolution: it underflows. */
static void test_ue5m3_hand(void **state) {
  (void)state;
  const int64_t M = 16, K = 16;
  float v[16 * 16] = {0};
  for (int k = 0; k < 16; k++) {
    v[k] = E2M1_ROW[k];
    v[K + k] = E2M1_ROW[k] / 4096.0f;
  }
  v[15 * K] = 688128.0f;
  hq_tensor x = f32_from(v, M, K);
  for (int none = 0; none < 2; none++) {
    run u;
    run_quant(&u, none ? "scale_dtype = ue5m3\nglobal_scale = none" : "scale_dtype = ue5m3", &x, 0,
              HQ_BOTH);
    const hq_storage *st = hq_qtensor_storage(u.t, HQ_ROWWISE);
    assert_int_equal(st->nbuf, none ? 2 : 3);
    assert_int_equal(st->desc.scale_mode, HQ_SCALE_OTHER);
    assert_int_equal(st->desc.emul_dtype, HQ_BF16);
    assert_int_equal(bufp(&u, HQ_ROWWISE, 1)->dtype, HQ_U8);
    if (!none) assert_true(amax_of(&u, HQ_ROWWISE) == 688128.0f);
    const uint8_t *d = bytes_of(&u, HQ_ROWWISE, 0), *sc = bytes_of(&u, HQ_ROWWISE, 1);
    assert_memory_equal(d, E2M1_BYTES, 8);
    assert_memory_equal(d + 8, E2M1_BYTES, 8);
    assert_int_equal(sc[0], 0x78);
    assert_int_equal(sc[4], 0x18);
    assert_int_equal(sc[15 * 4], 0xfe);
    assert_int_equal(d[15 * 8], 0x07);
    assert_int_equal(sc[2 * 4], 0x00); /* a zero row */
    hq_tensor y = dequant(&u, HQ_ROWWISE, HQ_F32);
    for (int64_t i = 0; i < M * K; i++) {
      const float want = v[i] == 0.25f || v[i] == 0.25f / 4096.0f ? 0.0f : v[i];
      if (((const float *)y.data)[i] != want)
        fail_msg("ue5m3 none=%d element %lld: %g, want %g", none, (long long)i,
                 ((const float *)y.data)[i], want);
    }
    free(y.data);
    /* columnwise: column 0 = (0, 0, 0 ... 688128): one block, scale 0xFE, code 7 at row 15 */
    assert_int_equal(bytes_of(&u, HQ_COLWISE, 1)[0], 0xfe);
    assert_int_equal(bytes_of(&u, HQ_COLWISE, 0)[7], 0x70);
    assert_int_equal(bytes_of(&u, HQ_COLWISE, 1)[7 * 4], 0x78); /* column 7: 6, 6/4096 */
    run_free(&u);
  }
  run u;
  run_quant(&u, NULL, &x, 0, HQ_ROWWISE);
  hq_tensor y = dequant(&u, HQ_ROWWISE, HQ_F32);
  for (int64_t k = 0; k < K; k++) assert_true(getf(&y, 1, k) == 0.0f);
  free(y.data);
  run_free(&u);
  free(x.data);
}

/* Bad values and combinations of the options, as recipe errors naming the key. */
static void test_option_errors(void **state) {
  (void)state;
  expect_recipe_error("scale_dtype = e5m3", "scale_dtype", "e4m3|ue5m3");
  expect_recipe_error("global_scale = column", "global_scale", "tensor|row|none");
  expect_recipe_error("global_scale = none", "global_scale = none", "ue5m3");
  expect_recipe_error("global_scale = row\nrht = true", "global_scale = row", "rht");
  expect_recipe_error("global_scale = row\nblock_2d = true", "global_scale = row", "block_2d");
}

/* A storage of one configuration is refused by a quantize of another (scale type, global
   scale), and dequantizes through any instance. */
static void test_options_cross_instance(void **state) {
  (void)state;
  hq_tensor x = spread_tensor(HQ_F32, 32, 64, 5);
  static const char *opts[] = {"global_scale = row", "scale_dtype = ue5m3",
                               "scale_dtype = ue5m3\nglobal_scale = none",
                               "scale_dtype = ue5m3\nglobal_scale = row", NULL};
  for (int i = 0; i < 5; i++) {
    run u;
    run_quant(&u, opts[i], &x, 0, HQ_BOTH);
    for (int j = 0; j < 5; j++) {
      if (i == j) continue;
      run w;
      run_quant(&w, opts[j], &x, 0, HQ_BOTH);
      /* dequantize reads the storage: another instance's storage dequantizes the same */
      for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
        hq_tensor a = dequant(&u, dir, HQ_F32);
        hq_tensor b = hq_test_empty(HQ_F32, 32, 64);
        HQ_OK_OR_FAIL(hq_dequantize(u.t, w.ctx, dir, &b));
        assert_memory_equal(a.data, b.data, 32 * 64 * sizeof(float));
        free(a.data);
        free(b.data);
      }
      run_free(&w);
    }
    run_free(&u);
  }
  free(x.data);
}

/* The emulated GEMM of row-scaled operands: fprop y = x W^T with rows scaled by 2^k (their
   values come back exactly, see test_row_scaled_hand) equals the exact product, which the F32
   sum of 32 products of E2M1 values times one power of two holds exactly. */
static void test_row_scaled_gemm(void **state) {
  (void)state;
  const int64_t T = 16, N = 16, K = 32;
  float xv[16 * 32], wv[16 * 32];
  uint64_t s = 3;
  for (int64_t r = 0; r < 16; r++) {
    const float px = ldexpf(1.0f, (int)(r % 7) - 3), pw = ldexpf(1.0f, 5 - (int)(r % 5));
    for (int64_t k = 0; k < K; k++) {
      xv[r * K + k] = E2M1_ROW[hq_test_rand(&s) % 15] * px;
      wv[r * K + k] = E2M1_ROW[hq_test_rand(&s) % 15] * pw;
    }
    xv[r * K] = 6.0f * px; /* each block holds its row's amax */
    xv[r * K + 16] = -6.0f * px;
    wv[r * K] = 6.0f * pw;
    wv[r * K + 16] = 6.0f * pw;
  }
  hq_tensor X = f32_from(xv, T, K), W = f32_from(wv, N, K);
  run ux, uw;
  run_quant(&ux, "global_scale = row", &X, 0, HQ_BOTH);
  run_quant(&uw, "global_scale = row", &W, 0, HQ_BOTH);
  float yv[16 * 16];
  hq_tensor Y = hq_tensor_2d(yv, HQ_F32, HQ_DEVICE_HOST, T, N);
  hq_gemm_info info = {0};
  info.struct_size = sizeof info;
  HQ_OK_OR_FAIL(hq_linear_fprop(ux.ctx, hq_operand_q(ux.t), hq_operand_q(uw.t), NULL, HQ_F32, &Y,
                                &info));
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)xv[t * K + k] * wv[n * K + k];
      if ((double)yv[t * N + n] != acc)
        fail_msg("y[%lld][%lld] = %.9g, want %.9g", (long long)t, (long long)n, yv[t * N + n],
                 acc);
    }
  /* dgrad multiplies W's columnwise copy (one amax per column of W) against dy's rowwise one:
     dx = dy W, the product of the dequantized values up to F32 accumulation */
  hq_tensor DY = f32_from(yv, T, N);
  run ud;
  run_quant(&ud, "global_scale = row", &DY, 0, HQ_ROWWISE);
  float dxv[16 * 32];
  hq_tensor DX = hq_tensor_2d(dxv, HQ_F32, HQ_DEVICE_HOST, T, K);
  HQ_OK_OR_FAIL(hq_linear_dgrad(ud.ctx, hq_operand_q(ud.t), hq_operand_q(uw.t), &DX, &info));
  hq_tensor wc = dequant(&uw, HQ_COLWISE, HQ_F32), dr = dequant(&ud, HQ_ROWWISE, HQ_F32);
  for (int64_t t = 0; t < T; t++)
    for (int64_t k = 0; k < K; k++) {
      double acc = 0, mag = 0;
      for (int64_t n = 0; n < N; n++) {
        acc += (double)getf(&dr, t, n) * getf(&wc, n, k);
        mag += fabs((double)getf(&dr, t, n) * getf(&wc, n, k));
      }
      if (fabs((double)dxv[t * K + k] - acc) > 16 * 0x1p-24 * mag)
        fail_msg("dx[%lld][%lld] = %.9g, want %.9g", (long long)t, (long long)k, dxv[t * K + k],
                 acc);
    }
  free(wc.data);
  free(dr.data);
  run_free(&ud);
  free(DY.data);
  run_free(&ux);
  run_free(&uw);
  free(X.data);
  free(W.data);
}

/* Whole tensors against the reference, for every input dtype, both layouts, both directions. */
static void test_vs_reference(void **state) {
  (void)state;
  static const hq_dtype dts[3] = {HQ_F32, HQ_BF16, HQ_F16};
  static const int64_t shapes[3][2] = {{48, 80}, {144, 32}, {16, 16}};
  for (int d = 0; d < 3; d++) {
    for (int sh = 0; sh < 3; sh++) {
      for (int swz = 0; swz < 2; swz++) {
        int64_t M = shapes[sh][0], K = shapes[sh][1];
        hq_tensor x = spread_tensor(dts[d], M, K, 100 + (uint64_t)(d * 10 + sh));
        run u;
        run_quant(&u, swz ? "swizzle = true" : NULL, &x, 0, HQ_BOTH);
        float *v = as_floats(&x), *t = stored_colwise(&x, 0, 0);
        ref_out ro = ref_quantize(v, M, K, swz, 0, NULL, NULL);
        ref_out co = ref_quantize(t, K, M, swz, 0, NULL, NULL);
        expect_storage(&u, HQ_ROWWISE, &ro);
        expect_storage(&u, HQ_COLWISE, &co);
        /* dequantize: RN(e2m1 * RN(RN(sf * A) * RN(1/2688))), then RN to the output dtype */
        for (int dir = 1; dir <= 2; dir++) {
          const ref_out *o = dir == 1 ? &ro : &co;
          for (int od = 0; od < 3; od++) {
            hq_tensor y = dequant(&u, (uint32_t)dir, dts[od]);
            for (int64_t i = 0; i < M; i++) {
              for (int64_t k = 0; k < K; k++) {
                int64_t r = dir == 1 ? i : k, c = dir == 1 ? k : i, C = dir == 1 ? K : M;
                unsigned code = (o->data[r * (C / 2) + c / 2] >> ((c & 1) * 4)) & 0xfu;
                unsigned sf = o->scale[ref_scale_off(r, c / 16, C, swz)];
                float dm = (float)((double)(float)(ref_e4m3_val(sf) * o->amax) *
                                   (double)(float)(1.0 / 2688.0));
                float want = (float)(ref_e2m1_val(code) * dm);
                float got = getf(&y, i, k);
                float w2 = dts[od] == HQ_F32 ? want
                           : dts[od] == HQ_BF16 ? (float)bf16_ref(want)
                                                : hq_f16_to_f32(hq_f32_to_f16(want));
                if (!(got == w2)) fail_msg("dequant %d/%d (%lld,%lld): %g want %g", dir, od,
                                           (long long)i, (long long)k, got, w2);
              }
            }
            free(y.data);
          }
        }
        ref_free(&ro);
        ref_free(&co);
        free(v);
        free(t);
        run_free(&u);
        free(x.data);
      }
    }
  }
}

/* Zero tensor, NaN and Inf elements. */
static void test_zero_nan_inf(void **state) {
  (void)state;
  hq_tensor z = hq_test_empty(HQ_F32, 32, 32);
  run u;
  run_quant(&u, NULL, &z, 0, HQ_BOTH);
  for (int d = 1; d <= 2; d++) {
    for (size_t i = 0; i < bufp(&u, (uint32_t)d, 0)->bytes; i++)
      assert_int_equal(bytes_of(&u, (uint32_t)d, 0)[i], 0);
    for (size_t i = 0; i < bufp(&u, (uint32_t)d, 1)->bytes; i++)
      assert_int_equal(bytes_of(&u, (uint32_t)d, 1)[i], 0);
    assert_true(amax_of(&u, (uint32_t)d) == 0.0f);
    hq_tensor y = dequant(&u, (uint32_t)d, HQ_F32);
    for (int64_t i = 0; i < 32 * 32; i++) assert_true(((float *)y.data)[i] == 0.0f);
    free(y.data);
  }
  run_free(&u);
  free(z.data);

  /* NaN elements: ignored by every amax, encoded +6 (0x7) whatever their sign */
  hq_tensor x = hq_test_tensor(HQ_F32, 16, 32, 3, 1.0f);
  float *p = x.data;
  p[0] = NAN;
  p[17] = -NAN;
  p[5 * 32 + 20] = 100.0f; /* the amax */
  run_quant(&u, NULL, &x, 0, HQ_BOTH);
  assert_true(amax_of(&u, HQ_ROWWISE) == 100.0f);
  assert_true(amax_of(&u, HQ_COLWISE) == 100.0f);
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 0)[0] & 0xf, 7);
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 0)[8] >> 4, 7);       /* (0, 17) */
  assert_int_equal(bytes_of(&u, HQ_COLWISE, 0)[0] & 0xf, 7);      /* (0, 0) */
  assert_int_equal(bytes_of(&u, HQ_COLWISE, 0)[17 * 8] & 0xf, 7); /* (0, 17) */
  float *v = as_floats(&x), *t = stored_colwise(&x, 0, 0);
  ref_out ro = ref_quantize(v, 16, 32, 0, 0, NULL, NULL);
  ref_out co = ref_quantize(t, 32, 16, 0, 0, NULL, NULL);
  expect_storage(&u, HQ_ROWWISE, &ro);
  expect_storage(&u, HQ_COLWISE, &co);
  ref_free(&ro);
  ref_free(&co);
  run_free(&u);

  /* Inf: A = Inf gives S_enc = 1; an Inf block's scale saturates to 448 (0x7E) and Inf
     encodes as +-6; other blocks use m = RN(1/6) */
  p[0] = 1.0f;
  p[17] = -INFINITY;
  run_quant(&u, NULL, &x, 0, HQ_BOTH);
  assert_true(isinf(amax_of(&u, HQ_ROWWISE)));
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 1)[1], 0x7e);
  assert_int_equal(bytes_of(&u, HQ_ROWWISE, 0)[8] >> 4, 15);
  free(v);
  free(t);
  v = as_floats(&x);
  t = stored_colwise(&x, 0, 0);
  ro = ref_quantize(v, 16, 32, 0, 0, NULL, NULL);
  co = ref_quantize(t, 32, 16, 0, 0, NULL, NULL);
  expect_storage(&u, HQ_ROWWISE, &ro);
  expect_storage(&u, HQ_COLWISE, &co);
  ref_free(&ro);
  ref_free(&co);
  free(v);
  free(t);
  run_free(&u);
  free(x.data);
}

/* Relative RMS error ||x - deq|| / ||x|| of N(0,1) data in the 8-12% band (each direction, with
   and without RHT, for f32 and bf16). */
static double rel_rms(const hq_tensor *x, const hq_tensor *y, const float *ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < x->rows * x->cols; i++) {
    double a = ref ? ref[i] : hq_load_hp(x->data, i, x->dtype);
    double b = hq_load_hp(y->data, i, y->dtype);
    num += (a - b) * (a - b);
    den += a * a;
  }
  return sqrt(num / den);
}

static void test_rms_error_band(void **state) {
  (void)state;
  static const char *opts[] = {NULL, "rht = true", "stochastic_rounding = true", "block_2d = true"};
  for (int dt = 0; dt < 2; dt++) {
    hq_tensor x = hq_test_tensor(dt ? HQ_BF16 : HQ_F32, 512, 256, 7, 1.0f);
    for (int o = 0; o < 4; o++) {
      run u;
      run_quant(&u, opts[o], &x, 1, HQ_BOTH);
      hq_tensor yr = dequant(&u, HQ_ROWWISE, HQ_F32), yc = dequant(&u, HQ_COLWISE, HQ_F32);
      /* with RHT the columnwise copy dequantizes through the inverse transform: to ~x too */
      double er = rel_rms(&x, &yr, NULL), ec = rel_rms(&x, &yc, NULL);
      double hi = o == 2 ? 0.15 : 0.12; /* SR trades bias for variance: a higher RMS */
      if (!(er >= 0.08 && er <= hi && ec >= 0.08 && ec <= hi))
        fail_msg("%s %s: relative RMS error rowwise %.4f columnwise %.4f",
                 dt ? "bf16" : "f32", opts[o] ? opts[o] : "plain", er, ec);
      free(yr.data);
      free(yc.data);
      run_free(&u);
    }
    free(x.data);
  }
}

// --- stochastic rounding ------------------------------------------------------------------

typedef struct sr_ctx {
  uint64_t seed, offset;
  uint32_t col;
} sr_ctx;

/* The documented mapping, rebuilt here from the KAT-checked Philox. */
static unsigned sr_bits_ref(const void *p, int64_t block, int e) {
  const sr_ctx *c = p;
  uint32_t key[2] = {(uint32_t)c->seed, (uint32_t)(c->seed >> 32)};
  uint32_t ctr[4] = {(uint32_t)block, (uint32_t)((uint64_t)block >> 32) | (c->col << 31),
                     (uint32_t)c->offset, (uint32_t)(c->offset >> 32)};
  uint32_t out[4];
  hq_philox4x32_10(ctr, key, out);
  return (out[e / 4] >> (8 * (e % 4))) & 0xffu;
}

/* Through the API: the first quantize of role linear:input:x on a fresh context (step 0) draws
   with the offset docs/embedding.md defines for (role, step 0, call 0), in both directions.
   test_ops_direct fixes seed and offset. */
static void test_sr_against_reference(void **state) {
  (void)state;
  hq_tensor x = spread_tensor(HQ_BF16, 32, 48, 31);
  float *v = as_floats(&x), *tr[2] = {stored_colwise(&x, 1, HQ_NVFP4_RHT_SIGNS),
                                      stored_colwise(&x, 0, 0)};
  static const char *opts[2] = {"stochastic_rounding = true\nrht = true",
                                "stochastic_rounding = true\nseed = 77"};
  for (int o = 0; o < 2; o++) {
    run u;
    uint64_t seed = o ? 77 : 0xabcdef12345ull;
    run_quant(&u, opts[o], &x, o ? 5 : seed, HQ_BOTH); /* seed = 77 overrides the context's 5 */
    const uint64_t off = hq_test_rng_offset("linear:input:x", 0, 0);
    sr_ctx rc = {seed, off, 0};
    ref_out ro = ref_quantize(v, 32, 48, 0, 0, sr_bits_ref, &rc);
    expect_storage(&u, HQ_ROWWISE, &ro);
    ref_free(&ro);
    sr_ctx cc = {seed, off, 1};
    ref_out co = ref_quantize(tr[o], 48, 32, 0, 0, sr_bits_ref, &cc);
    expect_storage(&u, HQ_COLWISE, &co);
    ref_free(&co);
    run_free(&u);
  }
  free(v);
  free(tr[0]);
  free(tr[1]);
  free(x.data);
}

static int same_bytes(const run *a, const run *b, uint32_t dir) {
  return memcmp(bytes_of(a, dir, 0), bytes_of(b, dir, 0), bufp(a, dir, 0)->bytes) == 0;
}

static void test_sr_reproducible(void **state) {
  (void)state;
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 64, 9, 1.0f);
  run a, b, c;
  run_quant(&a, "stochastic_rounding = true", &x, 42, HQ_BOTH);
  run_quant(&b, "stochastic_rounding = true", &x, 42, HQ_BOTH);
  run_quant(&c, "stochastic_rounding = true", &x, 43, HQ_BOTH);
  for (uint32_t d = 1; d <= 2; d++) {
    assert_true(same_bytes(&a, &b, d));   /* same seed and offset: same bytes */
    assert_false(same_bytes(&a, &c, d));  /* another seed: other bytes */
  }
  /* the next call of a context has another offset: other bytes */
  hq_qtensor *t2 = NULL;
  HQ_OK_OR_FAIL(hq_quantize(a.q, a.ctx, &x, &t2));
  assert_false(memcmp(bytes_of(&a, HQ_ROWWISE, 0),
                      hq_storage_cbuf(hq_qtensor_storage(t2, HQ_ROWWISE), 0)->ptr,
                      bufp(&a, HQ_ROWWISE, 0)->bytes) == 0);
  hq_qtensor_free(t2);
  run_free(&a);
  run_free(&b);
  run_free(&c);
  free(x.data);
}

/* The mean of the dequantized value over many seeds is the input (SR is unbiased). Rows
   i % 16 != 15 repeat one row of values; rows i % 16 == 15 hold +-6.5, so every columnwise
   block's amax is 6.5 and no tested value is its block's amax (a block amax may scale to just
   above 6 when its E4M3 scale rounds down, and then saturates: a bias of the format, not of
   SR). Each call gives 240 samples per column in each direction. */
static void test_sr_unbiased(void **state) {
  (void)state;
  const int64_t M = 256, K = 32;
  static const float row[32] = {0.3f,  -1.1f, 2.6f,  0.05f, -4.4f, 5.3f,  0.77f, 1.23f,
                                -2.2f, 3.9f,  0.01f, -0.6f, 1.81f, -5.9f, 2.49f, 0.33f,
                                0.12f, 0.9f,  -0.45f, 3.3f, -1.7f, 0.61f, 4.05f, -0.08f,
                                2.0f,  -3.1f, 0.2f,  1.4f,  -0.99f, 5.0f, 0.5f,  -2.75f};
  hq_tensor x = hq_test_empty(HQ_F32, M, K);
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++)
      ((float *)x.data)[i * K + k] = i % 16 == 15 ? ((i + k) & 1 ? 6.5f : -6.5f) : row[k];
  double sum[2][32] = {{0}}, sum2[2][32] = {{0}};
  const int seeds = 64;
  for (int s = 0; s < seeds; s++) {
    run u;
    run_quant(&u, "stochastic_rounding = true", &x, 1000 + (uint64_t)s, HQ_BOTH);
    for (int d = 0; d < 2; d++) {
      hq_tensor y = dequant(&u, d ? HQ_COLWISE : HQ_ROWWISE, HQ_F32);
      for (int64_t i = 0; i < M; i++) {
        if (i % 16 == 15) continue;
        for (int64_t k = 0; k < K; k++) {
          double q = getf(&y, i, k);
          sum[d][k] += q;
          sum2[d][k] += q * q;
        }
      }
      free(y.data);
    }
    run_free(&u);
  }
  const double n = (double)seeds * (double)(M - M / 16);
  for (int d = 0; d < 2; d++) {
    for (int k = 0; k < 32; k++) {
      if (d == 0 && (k == 13 || k == 29)) continue; /* the rowwise block amaxes */
      double mean = sum[d][k] / n, var = sum2[d][k] / n - mean * mean;
      /* 5 sigma of the mean, plus the 8-bit u's bias (below one E2M1 step / 256; steps here are
         at most 2 * 6.5/6 in input units) */
      double tol = 5 * sqrt(var > 0 ? var / n : 0) + 2.2 / 256;
      if (fabs(mean - row[k]) > tol) {
        free(x.data);
        fail_msg("%s element %d: mean %.6f, input %.6f (tol %.6f)",
                 d ? "columnwise" : "rowwise", k, mean, row[k], tol);
      }
    }
  }
  free(x.data);
}

// --- RHT -----------------------------------------------------------------------------------

static void test_rht_columnwise(void **state) {
  (void)state;
  /* inputs on a 1/16 grid: the FP32 butterfly is exact, the reference's dense product matches */
  const int64_t M = 64, K = 48;
  hq_tensor x = hq_test_empty(HQ_BF16, M, K);
  uint64_t s = 3;
  for (int64_t i = 0; i < M * K; i++)
    hq_store_hp(x.data, i, HQ_BF16, (float)((int)(hq_test_rand(&s) % 129) - 64) / 16.0f);
  static const uint32_t masks[2] = {HQ_NVFP4_RHT_SIGNS, 0x00ff};
  for (int mi = 0; mi < 2; mi++) {
    run u, plain;
    char opts[128];
    snprintf(opts, sizeof opts, "rht = true\nrht_sign_mask = %u", masks[mi]);
    run_quant(&u, opts, &x, 0, HQ_BOTH);
    run_quant(&plain, NULL, &x, 0, HQ_BOTH);
    /* the rowwise copy ignores rht */
    assert_memory_equal(bytes_of(&u, HQ_ROWWISE, 0), bytes_of(&plain, HQ_ROWWISE, 0), M * K / 2);
    assert_memory_equal(bytes_of(&u, HQ_ROWWISE, 1), bytes_of(&plain, HQ_ROWWISE, 1),
                        bufp(&u, HQ_ROWWISE, 1)->bytes);
    assert_true(amax_of(&u, HQ_ROWWISE) == amax_of(&plain, HQ_ROWWISE));
    /* the columnwise copy is the reference quantization of RHT(x^T) in BF16, with its own amax */
    float *t = stored_colwise(&x, 1, masks[mi]);
    ref_out co = ref_quantize(t, K, M, 0, 0, NULL, NULL);
    expect_storage(&u, HQ_COLWISE, &co);
    assert_true(amax_of(&u, HQ_COLWISE) != amax_of(&u, HQ_ROWWISE));
    ref_free(&co);
    free(t);
    run_free(&u);
    run_free(&plain);
  }
  /* f32 input is rounded to BF16 before the transform: same columnwise bytes as bf16 input */
  hq_tensor xf = hq_test_tensor(HQ_F32, 32, 32, 8, 1.0f), xb = hq_test_empty(HQ_BF16, 32, 32);
  for (int64_t i = 0; i < 32 * 32; i++)
    hq_store_hp(xb.data, i, HQ_BF16, ((float *)xf.data)[i]);
  run a, b;
  run_quant(&a, "rht = true", &xf, 0, HQ_COLWISE);
  run_quant(&b, "rht = true", &xb, 0, HQ_COLWISE);
  assert_true(same_bytes(&a, &b, HQ_COLWISE));
  assert_true(amax_of(&a, HQ_COLWISE) == amax_of(&b, HQ_COLWISE));
  assert_null(hq_qtensor_storage(a.t, HQ_ROWWISE));
  run_free(&a);
  run_free(&b);
  free(xf.data);
  free(xb.data);
  free(x.data);
}

/* The columnwise copies of RHT-quantized operands are GEMM operands contracted over M. Their
   dequantized values (transformed back) keep the products X^T Y and X^T X, and also the product
   with a partner quantized without RHT. Scales: |X^T Y| entries are ~ sqrt(M) against |x||y| ~
   M; the quantization error of a product is ~ 0.14 / sqrt(M) of |x||y| (0.009 here). The stored
   (transformed) bytes differ from the plain ones, so the transform was really applied. */
static void test_rht_preserves_products(void **state) {
  (void)state;
  const int64_t M = 256, K = 16, N = 16;
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 21, 1.0f);
  hq_tensor y = hq_test_tensor(HQ_BF16, M, N, 22, 1.0f);
  run qx, qy, qp;
  run_quant(&qx, "rht = true", &x, 0, HQ_COLWISE);
  run_quant(&qy, "rht = true", &y, 0, HQ_COLWISE);
  run_quant(&qp, NULL, &y, 0, HQ_COLWISE);
  hq_tensor dx = dequant(&qx, HQ_COLWISE, HQ_F32), dy = dequant(&qy, HQ_COLWISE, HQ_F32),
            dp = dequant(&qp, HQ_COLWISE, HQ_F32);
  int bad = 0;
  for (int64_t a = 0; a < K; a++) {
    double xx = 0, dxdx = 0, dxx = 0;
    for (int64_t i = 0; i < M; i++) {
      xx += (double)getf(&x, i, a) * getf(&x, i, a);
      dxdx += (double)getf(&dx, i, a) * getf(&dx, i, a);
      dxx += (double)getf(&dx, i, a) * getf(&x, i, a);
    }
    if (fabs(dxdx - xx) > 0.05 * xx) bad++;  /* X'^T X' = X^T X on the diagonal */
    if (fabs(dxx - xx) > 0.05 * xx) bad++;   /* and X'^T X too: X' approximates X */
    for (int64_t b = 0; b < N; b++) {
      double exact = 0, got = 0, wrong = 0, ny = 0;
      for (int64_t i = 0; i < M; i++) {
        exact += (double)getf(&x, i, a) * getf(&y, i, b);
        got += (double)getf(&dx, i, a) * getf(&dy, i, b);
        wrong += (double)getf(&dx, i, a) * getf(&dp, i, b);
        ny += (double)getf(&y, i, b) * getf(&y, i, b);
      }
      double scale = sqrt(xx * ny);
      if (fabs(got - exact) > 0.04 * scale) bad++;
      if (fabs(wrong - exact) > 0.04 * scale) bad++; /* a plain partner meets it correctly */
    }
  }
  /* the transform was applied to the stored bytes */
  assert_true(memcmp(bytes_of(&qy, HQ_COLWISE, 0), bytes_of(&qp, HQ_COLWISE, 0),
                     bufp(&qy, HQ_COLWISE, 0)->bytes) != 0);
  free(dx.data);
  free(dy.data);
  free(dp.data);
  run_free(&qx);
  run_free(&qy);
  run_free(&qp);
  free(x.data);
  free(y.data);
  assert_int_equal(bad, 0);
}

// --- 2-D, swizzle, columnwise-only, padding -------------------------------------------------

static void test_block_2d(void **state) {
  (void)state;
  const int64_t M = 64, K = 48;
  for (int swz = 0; swz < 2; swz++) {
    hq_tensor x = spread_tensor(HQ_F32, M, K, 55);
    run u;
    run_quant(&u, swz ? "block_2d = true\nswizzle = true" : "block_2d = true", &x, 0, HQ_BOTH);
    const uint8_t *rd = bytes_of(&u, HQ_ROWWISE, 0), *cd = bytes_of(&u, HQ_COLWISE, 0);
    const uint8_t *rs = bytes_of(&u, HQ_ROWWISE, 1), *cs = bytes_of(&u, HQ_COLWISE, 1);
    /* columnwise bytes are exactly the nibble transpose of the rowwise bytes */
    for (int64_t i = 0; i < M; i++)
      for (int64_t k = 0; k < K; k++) {
        unsigned a = (rd[i * (K / 2) + k / 2] >> ((k & 1) * 4)) & 0xfu;
        unsigned b = (cd[k * (M / 2) + i / 2] >> ((i & 1) * 4)) & 0xfu;
        assert_int_equal(a, b);
        /* one scale per 16x16 tile, in both buffers */
        unsigned sr = rs[ref_scale_off(i, k / 16, K, swz)];
        assert_int_equal(sr, rs[ref_scale_off(i / 16 * 16, k / 16, K, swz)]);
        assert_int_equal(sr, cs[ref_scale_off(k, i / 16, M, swz)]);
      }
    assert_true(amax_of(&u, HQ_ROWWISE) == amax_of(&u, HQ_COLWISE));
    float *v = as_floats(&x);
    ref_out ro = ref_quantize(v, M, K, swz, 1, NULL, NULL);
    expect_storage(&u, HQ_ROWWISE, &ro);
    ref_free(&ro);
    free(v);
    /* a columnwise-only quantize makes the same bytes */
    run c;
    run_quant(&c, swz ? "block_2d = true\nswizzle = true" : "block_2d = true", &x, 0,
              HQ_COLWISE);
    assert_true(same_bytes(&u, &c, HQ_COLWISE));
    run_free(&c);
    run_free(&u);
    free(x.data);
  }
}

static void test_swizzle_is_a_permutation(void **state) {
  (void)state;
  const int64_t M = 160, K = 96;
  hq_tensor x = spread_tensor(HQ_BF16, M, K, 77);
  run a, b;
  run_quant(&a, NULL, &x, 0, HQ_BOTH);
  run_quant(&b, "swizzle = true", &x, 0, HQ_BOTH);
  for (uint32_t d = 1; d <= 2; d++) {
    int64_t R = d == 1 ? M : K, C = d == 1 ? K : M;
    assert_true(same_bytes(&a, &b, d));
    const uint8_t *cs = bytes_of(&a, d, 1), *ss = bytes_of(&b, d, 1);
    size_t nonzero = 0;
    for (int64_t r = 0; r < ru(R, 128); r++)
      for (int64_t c = 0; c < ru(C / 16, 4); c++) {
        uint8_t want = (r < R && c < C / 16) ? cs[r * ru(C / 16, 4) + c] : 0;
        assert_int_equal(cs[r * ru(C / 16, 4) + c], want); /* compact padding is zero */
        assert_int_equal(ss[ref_scale_off(r, c, C, 1)], want);
        nonzero += want != 0;
      }
    /* as many nonzero scales as the reference quantizer gives (spread_tensor's zero and tiny
       blocks have scale 0) */
    float *v = d == 1 ? as_floats(&x) : stored_colwise(&x, 0, 0);
    ref_out o = ref_quantize(v, R, C, 0, 0, NULL, NULL);
    size_t want_nonzero = 0;
    for (size_t i = 0; i < o.scale_bytes; i++) want_nonzero += o.scale[i] != 0;
    assert_int_equal(nonzero, want_nonzero);
    ref_free(&o);
    free(v);
    hq_tensor ya = dequant(&a, d, HQ_F32), yb = dequant(&b, d, HQ_F32);
    assert_memory_equal(ya.data, yb.data, (size_t)(M * K) * 4);
    free(ya.data);
    free(yb.data);
  }
  run_free(&a);
  run_free(&b);
  free(x.data);
}

static void test_colwise_only_and_hybrid(void **state) {
  (void)state;
  hq_tensor x = spread_tensor(HQ_F32, 48, 64, 88);
  static const char *opts[] = {NULL, "rht = true"};
  for (int o = 0; o < 2; o++) {
    run both, col;
    run_quant(&both, opts[o], &x, 0, HQ_BOTH);
    run_quant(&col, opts[o], &x, 0, HQ_COLWISE);
    assert_null(hq_qtensor_storage(col.t, HQ_ROWWISE));
    assert_true(same_bytes(&both, &col, HQ_COLWISE));
    assert_memory_equal(bytes_of(&both, HQ_COLWISE, 1), bytes_of(&col, HQ_COLWISE, 1),
                        bufp(&col, HQ_COLWISE, 1)->bytes);
    assert_true(amax_of(&both, HQ_COLWISE) == amax_of(&col, HQ_COLWISE));
    run_free(&both);
    run_free(&col);
  }
  /* nvfp4 rowwise with an identity columnwise copy */
  hq_recipe *r = hq_test_recipe("[format nv]\nplugin = nvfp4\n[role *:*:*]\nrowwise = nv\n");
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_ctx *ctx = ctx_with_seed(0);
  hq_qtensor *t = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &t));
  run ref;
  run_quant(&ref, NULL, &x, 0, HQ_ROWWISE);
  assert_memory_equal(hq_storage_cbuf(hq_qtensor_storage(t, HQ_ROWWISE), 0)->ptr,
                      bytes_of(&ref, HQ_ROWWISE, 0), 48 * 32);
  run_free(&ref);
  hq_qtensor_free(t);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

/* Padded scale entries are zero after make_empty and after every quantize (also when the
   memory held other bytes: update in place after scribbling on the padding). */
static void test_padding_is_zero(void **state) {
  (void)state;
  hq_tensor x = spread_tensor(HQ_F32, 48, 32, 99);
  run u;
  run_quant(&u, NULL, &x, 0, HQ_BOTH);
  hq_qtensor *e = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(u.q, u.ctx, 48, 32, HQ_F32, &e));
  for (uint32_t d = 1; d <= 2; d++)
    for (int b = 0; b < 3; b++) {
      const hq_buffer *bf = hq_storage_cbuf(hq_qtensor_storage(e, d), (uint32_t)b);
      for (size_t i = 0; i < bf->bytes; i++) assert_int_equal(((uint8_t *)bf->ptr)[i], 0);
    }
  hq_qtensor_free(e);
  for (uint32_t d = 1; d <= 2; d++) {
    const hq_buffer *bf = bufp(&u, d, 1);
    memset(bf->ptr, 0xab, bf->bytes);
  }
  HQ_OK_OR_FAIL(hq_qtensor_update(u.t, u.ctx, &x));
  float *v = as_floats(&x), *t = stored_colwise(&x, 0, 0);
  ref_out ro = ref_quantize(v, 48, 32, 0, 0, NULL, NULL);
  ref_out co = ref_quantize(t, 32, 48, 0, 0, NULL, NULL);
  expect_storage(&u, HQ_ROWWISE, &ro); /* checks every scale byte, padding included */
  expect_storage(&u, HQ_COLWISE, &co);
  ref_free(&ro);
  ref_free(&co);
  free(v);
  free(t);
  run_free(&u);
  free(x.data);
}

// --- the ops table directly: device calls, configure, scratch, cross-instance dequantize ------

/* Assert a direct module call succeeds, printing the message it recorded when it does not. */
#define DIRECT_OK(expr)                                                                       \
  do {                                                                                        \
    int rc_ = (expr);                                                                         \
    if (rc_ != HQ_OK) fail_msg("%s -> %d: %s", #expr, rc_, hq_test_module_error());           \
  } while (0)

static const hq_format_ops *module_ops(const hq_host_api *host) {
  const hq_format_ops *ops = hq_test_module_entry("nvfp4")(host);
  assert_non_null(ops);
  return ops;
}

/* Configure an instance (cfg: 256 bytes) from its six option values. */
typedef struct nv_opts {
  int rht;
  uint32_t mask;
  int sr;
  uint64_t seed;
  int two_d, swz;
  int ue5m3, global; /* scale_dtype, global_scale (enum indices; 0: e4m3, tensor) */
} nv_opts;

static void configure_nv(const hq_format_ops *ops, const hq_host_api *host, void *cfg,
                         nv_opts o) {
  assert_true(ops->config_size <= 256);
  memset(cfg, 0, 256);
  hq_optval v[8] = {{0}};
  v[6].i = o.ue5m3;
  v[7].i = o.global;
  v[0].i = o.rht;
  v[1].i = o.mask;
  v[2].i = o.sr;
  v[3].i = (int64_t)o.seed;
  v[4].i = o.two_d;
  v[5].i = o.swz;
  DIRECT_OK(ops->configure(cfg, v, host));
}

/* Allocate the buffers layout() described (sizes from dtype and shape), filled with garbage. */
static void alloc_storage(hq_storage *st) {
  for (uint32_t i = 0; i < st->nbuf; i++) {
    hq_buffer *b = hq_storage_buf(st, i);
    size_t n = b->dtype == HQ_F32 ? 4 : 1;
    for (int d = 0; d < b->ndim; d++) n *= (size_t)b->shape[d];
    b->bytes = n;
    b->ptr = malloc(n);
    memset(b->ptr, 0x5a, n);
  }
}
static void free_storage(hq_storage *st) {
  for (uint32_t i = 0; i < st->nbuf; i++) free(hq_storage_buf(st, i)->ptr);
}

/* A storage of direction `dir` of an [M, K] tensor as instance cfg lays it out, allocated. */
static void make_storage(const hq_format_ops *ops, const hq_host_api *host, const void *cfg,
                         hq_storage *st, uint32_t dir, uint32_t dirs, int64_t M, int64_t K) {
  hq_test_storage_init(st, dir, M, K, HQ_F32);
  DIRECT_OK(ops->layout(cfg, host, M, K, dir, dirs, st));
  alloc_storage(st);
}

/* A host call carrying the scratch the instance declares for [M, K] / dirs (free_call). */
static hq_call scratch_call(const hq_format_ops *ops, const hq_host_api *host, const void *cfg,
                            uint64_t seed, uint64_t offset, int64_t M, int64_t K, uint32_t dirs) {
  hq_call c = hq_test_call(host, seed, offset);
  assert_non_null(ops->scratch_size);
  c.scratch_bytes = ops->scratch_size(cfg, M, K, dirs, HQ_DEVICE_HOST);
  c.scratch = c.scratch_bytes ? malloc(c.scratch_bytes) : NULL;
  return c;
}
static void free_call(hq_call *c) {
  free(c->scratch);
  c->scratch = NULL;
}

/* Both directions' storages of x [M, K] as instance cfg lays them out, quantized by one direct
   call (seed, offset 0) into st[0] (rowwise) and st[1] (columnwise); free_storage each. */
static void quantize_both(const hq_format_ops *ops, const hq_host_api *host, const void *cfg,
                          const hq_tensor *x, uint64_t seed, hq_storage st[2]) {
  const int64_t M = x->rows, K = x->cols;
  make_storage(ops, host, cfg, &st[0], HQ_ROWWISE, HQ_BOTH, M, K);
  make_storage(ops, host, cfg, &st[1], HQ_COLWISE, HQ_BOTH, M, K);
  hq_call call = scratch_call(ops, host, cfg, seed, 0, M, K, HQ_BOTH);
  DIRECT_OK(ops->quantize(cfg, &call, x, HQ_BOTH, &st[0], &st[1]));
  free_call(&call);
}

static int same_storage_bytes(const hq_storage *a, const hq_storage *b) {
  if (a->nbuf != b->nbuf) return 0;
  for (uint32_t i = 0; i < a->nbuf; i++) {
    const hq_buffer *x = hq_storage_cbuf(a, i), *y = hq_storage_cbuf(b, i);
    if (x->bytes != y->bytes || memcmp(x->ptr, y->ptr, x->bytes)) return 0;
  }
  return 1;
}

/* SR with an explicit hq_call seed and offset, and the seed option overriding it. */
static void sr_direct(const hq_format_ops *ops, hq_host_api *host) {
  const int64_t M = 32, K = 48;
  uint8_t cfg[256];
  hq_tensor x = spread_tensor(HQ_F32, M, K, 61);
  float *t = stored_colwise(&x, 0, 0);
  for (int with_seed = 0; with_seed < 2; with_seed++) {
    nv_opts o = {0, 0xD7E8, 1, with_seed ? 555 : 0, 0, 0, 0, 0};
    configure_nv(ops, host, cfg, o);
    hq_call call = scratch_call(ops, host, cfg, 0x1234, 99, M, K, HQ_BOTH);
    hq_storage rs, cs;
    make_storage(ops, host, cfg, &rs, HQ_ROWWISE, HQ_BOTH, M, K);
    make_storage(ops, host, cfg, &cs, HQ_COLWISE, HQ_BOTH, M, K);
    DIRECT_OK(ops->quantize(cfg, &call, &x, HQ_BOTH, &rs, &cs));
    sr_ctx rc = {with_seed ? 555 : 0x1234, 99, 0}, cc = rc;
    cc.col = 1;
    ref_out ro = ref_quantize(x.data, M, K, 0, 0, sr_bits_ref, &rc);
    ref_out co = ref_quantize(t, K, M, 0, 0, sr_bits_ref, &cc);
    assert_memory_equal(hq_storage_buf(&rs, 0)->ptr, ro.data, ro.data_bytes);
    assert_memory_equal(hq_storage_buf(&rs, 1)->ptr, ro.scale, ro.scale_bytes);
    assert_memory_equal(hq_storage_buf(&cs, 0)->ptr, co.data, co.data_bytes);
    assert_memory_equal(hq_storage_buf(&cs, 1)->ptr, co.scale, co.scale_bytes);
    ref_free(&ro);
    ref_free(&co);
    free_storage(&rs);
    free_storage(&cs);
    free_call(&call);
  }
  free(t);
  free(x.data);
}

static void test_ops_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  char *last_err = hq_test_module_error();
  const hq_format_ops *ops = module_ops(&host);
  assert_string_equal(ops->name, "nvfp4");
  /* ABI 2.1: the minor REQUIRED (2.1: raw dequantize, emul dtype, host->lt_matmul), the
     module's version (the package's), the 2.1 ops */
  assert_int_equal(ops->abi_major, 2);
  assert_int_equal(ops->abi_minor, 1);
  assert_int_equal(ops->struct_size, sizeof(hq_format_ops));
  assert_true(ops->struct_size >= HQ_FORMAT_OPS_SIZE_2_1);
  assert_string_equal(ops->version, hq_version());
  assert_non_null(ops->tensor_factor);
  /* its own GEMM: a small problem's emulated product in one kernel on a GPU of compute
     capability 9.x (tests/test_gpu_gemm); native GEMMs are gemm/cublaslt's */
  assert_non_null(ops->gemm);
  uint8_t cfg[256] = {0};
  assert_true(ops->config_size <= sizeof cfg);
  hq_optval vals[8] = {{0}}; /* one per option of the table */
  vals[1].i = 0xD7E8;
  vals[0].i = 1; /* rht */
  vals[4].i = 1; /* block_2d */
  assert_int_equal(ops->configure(cfg, vals, &host), HQ_EINVAL);
  assert_non_null(strstr(last_err, "block_2d"));
  vals[0].i = 0;
  vals[4].i = 0;
  vals[2].i = 1; /* stochastic_rounding */
  /* every instance runs on CUDA in a CUDA build (tests/test_gpu_nvfp4.c checks it), its
     stochastic rounding from the device step under a graph capture (test_gpu_rng_graph) */
  const uint64_t cuda = hq_built_with_cuda() ? HQ_CAP_CUDA | HQ_CAP_RNG_DEV : 0;
  DIRECT_OK(ops->configure(cfg, vals, &host));
  assert_int_equal(ops->instance_caps(cfg),
                   HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR | cuda);
  vals[2].i = 0;
  DIRECT_OK(ops->configure(cfg, vals, &host));
  assert_int_equal(ops->instance_caps(cfg),
                   HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_REQUANT_SAFE | HQ_CAP_DEQ_FACTOR |
                       cuda);
  hq_call call = hq_test_call(&host, 0, 0);
  hq_storage st;
  hq_test_storage_init(&st, HQ_ROWWISE, 16, 16, HQ_F32);
  DIRECT_OK(ops->layout(cfg, &host, 16, 16, HQ_ROWWISE, HQ_ROWWISE, &st));
  hq_tensor src = hq_tensor_2d(NULL, HQ_F32, 0, 16, 16);
  if (!cuda) {
    /* without CUDA a device call is refused with a clear message, before touching any pointer */
    call.device = 0;
    last_err[0] = 0;
    assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_ENOTSUP);
    assert_non_null(strstr(last_err, "nvfp4: built without CUDA"));
    last_err[0] = 0;
    assert_int_equal(ops->dequantize(cfg, &call, &st, &src), HQ_ENOTSUP);
    assert_non_null(strstr(last_err, "CUDA"));
    last_err[0] = 0;
    float dev_amax[2];
    assert_int_equal(ops->amax(cfg, &call, &src, HQ_BOTH, dev_amax), HQ_ENOTSUP);
    assert_non_null(strstr(last_err, "nvfp4: built without CUDA"));
  }
  /* host calls with a storage that does not fit the tensor are refused (no OOB access) */
  call.device = HQ_DEVICE_HOST;
  float data[32 * 16] = {0};
  src = hq_tensor_2d(data, HQ_F32, HQ_DEVICE_HOST, 32, 16);
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_EINVAL);
  assert_non_null(strstr(last_err, "does not match"));
  src.rows = 16;
  src.cols = 24;
  assert_int_equal(ops->quantize(cfg, &call, &src, HQ_ROWWISE, &st, NULL), HQ_ESHAPE);
  assert_non_null(strstr(last_err, "cols = 24 is not a multiple of 16"));
  assert_int_equal(ops->layout(cfg, &host, 32, 8, HQ_COLWISE, HQ_COLWISE, &st), HQ_ESHAPE);
  assert_non_null(strstr(last_err, "cols = 8"));
  /* amax_kind, per the table: rowwise INPUT; columnwise INPUT, OWN with rht */
  static const struct {
    nv_opts o;
    uint32_t col_kind;
  } kinds[] = {{{0, 0xD7E8, 0, 0, 0, 0, 0, 0}, HQ_AMAX_INPUT},
               {{1, 0xD7E8, 0, 0, 0, 0, 0, 0}, HQ_AMAX_OWN},
               {{1, 0x1234, 1, 0, 0, 1, 0, 0}, HQ_AMAX_OWN},
               {{0, 0xD7E8, 1, 0, 0, 0, 0, 0}, HQ_AMAX_INPUT},
               {{0, 0xD7E8, 0, 0, 1, 1, 0, 0}, HQ_AMAX_INPUT}};
  assert_non_null(ops->amax_kind);
  assert_non_null(ops->amax);
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    configure_nv(ops, &host, cfg, kinds[i].o);
    assert_int_equal(ops->amax_kind(cfg, HQ_ROWWISE), HQ_AMAX_INPUT);
    assert_int_equal(ops->amax_kind(cfg, HQ_COLWISE), kinds[i].col_kind);
  }
  sr_direct(ops, &host);
}

/* Scratch: quantize takes what scratch_size declares from call->scratch and refuses less; an
   update (HQ_CALL_UPDATE: host->alloc refuses) never allocates and makes the bytes of a plain
   quantize, with RHT (whose optional tile cache is then skipped) and with stochastic rounding. */
static void test_direct_scratch_and_update(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  char *last_err = hq_test_module_error();
  const hq_format_ops *ops = module_ops(&host);
  const int64_t M = 48, K = 80;
  hq_tensor xs[3] = {spread_tensor(HQ_F32, M, K, 71), spread_tensor(HQ_BF16, M, K, 72),
                     spread_tensor(HQ_F16, M, K, 73)};
  static const nv_opts opts[] = {{0, 0xD7E8, 0, 0, 0, 0, 0, 0}, {1, 0xD7E8, 0, 0, 0, 1, 0, 0},
                                 {1, 0x00ff, 1, 9, 0, 0, 0, 0}, {0, 0xD7E8, 0, 0, 1, 0, 0, 0}};
  uint8_t cfg[256];
  for (size_t oi = 0; oi < sizeof opts / sizeof opts[0]; oi++) {
    configure_nv(ops, &host, cfg, opts[oi]);
    /* the declaration: at least the 16-row FP32 strip; nothing on a device (shared tiles) */
    size_t need = ops->scratch_size(cfg, M, K, HQ_BOTH, HQ_DEVICE_HOST);
    assert_true(need >= (size_t)(16 * K) * sizeof(float));
    assert_int_equal(ops->scratch_size(cfg, M, K, HQ_BOTH, 0), 0);
    for (int xi = 0; xi < 3; xi++) {
      const hq_tensor *x = &xs[xi];
      hq_storage r0, c0, r1, c1;
      make_storage(ops, &host, cfg, &r0, HQ_ROWWISE, HQ_BOTH, M, K);
      make_storage(ops, &host, cfg, &c0, HQ_COLWISE, HQ_BOTH, M, K);
      make_storage(ops, &host, cfg, &r1, HQ_ROWWISE, HQ_BOTH, M, K);
      make_storage(ops, &host, cfg, &c1, HQ_COLWISE, HQ_BOTH, M, K);
      hq_call call = scratch_call(ops, &host, cfg, 5, 3, M, K, HQ_BOTH);
      assert_int_equal(call.scratch_bytes, need);
      /* less scratch than declared, or none: refused, naming scratch_size */
      call.scratch_bytes = need - 1;
      last_err[0] = 0;
      assert_int_equal(ops->quantize(cfg, &call, x, HQ_BOTH, &r0, &c0), HQ_EINVAL);
      assert_non_null(strstr(last_err, "scratch_size"));
      void *keep = call.scratch;
      call.scratch = NULL;
      call.scratch_bytes = need;
      assert_int_equal(ops->quantize(cfg, &call, x, HQ_BOTH, &r0, &c0), HQ_EINVAL);
      call.scratch = keep;
      /* exactly the declared scratch (the sanitizer build checks the bounds) */
      DIRECT_OK(ops->quantize(cfg, &call, x, HQ_BOTH, &r0, &c0));
      /* an update: the test host's alloc fails and records a message if it is called */
      call.flags = HQ_CALL_UPDATE;
      last_err[0] = 0;
      DIRECT_OK(ops->quantize(cfg, &call, x, HQ_BOTH, &r1, &c1));
      assert_null(strstr(last_err, "host->alloc during an update"));
      assert_true(same_storage_bytes(&r0, &r1));
      assert_true(same_storage_bytes(&c0, &c1));
      /* one direction at a time, in an update, still the same bytes */
      memset(hq_storage_buf(&c1, 0)->ptr, 0x33, hq_storage_buf(&c1, 0)->bytes);
      DIRECT_OK(ops->quantize(cfg, &call, x, HQ_COLWISE, NULL, &c1));
      assert_true(same_storage_bytes(&c0, &c1));
      free_call(&call);
      free_storage(&r0);
      free_storage(&c0);
      free_storage(&r1);
      free_storage(&c1);
    }
  }
  for (int i = 0; i < 3; i++) free(xs[i].data);
}

/* amax(): out[0] = max |x| (NaN ignored), out[1] = max |x| or, with rht, the max of the
   BF16-rounded transformed values (the dense reference, exact on a 1/16 grid); a direction not
   asked for is written as 0. With call->amax, quantize uses the values given: the same bytes as
   computing them, and the given value is what the AMAX buffer holds. */
static void test_direct_amax(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  const int64_t M = 64, K = 48;
  hq_tensor x = hq_test_empty(HQ_BF16, M, K);
  uint64_t s = 13;
  for (int64_t i = 0; i < M * K; i++)
    hq_store_hp(x.data, i, HQ_BF16, (float)((int)(hq_test_rand(&s) % 129) - 64) / 16.0f);
  hq_store_hp(x.data, 5 * K + 7, HQ_BF16, -7.5f);  /* the input amax */
  hq_store_hp(x.data, 9 * K + 2, HQ_BF16, NAN);    /* ignored */
  double amax_x = 0, amax_t[2] = {0, 0};
  for (int64_t i = 0; i < M * K; i++) {
    double v = fabs((double)hq_load_hp(x.data, i, HQ_BF16));
    if (!isnan(v) && v > amax_x) amax_x = v;
  }
  /* the dense reference: the NaN makes its whole 16-group NaN, which the amax ignores */
  static const uint32_t masks[2] = {HQ_NVFP4_RHT_SIGNS, 0x0f0f};
  for (int m = 0; m < 2; m++) {
    float *t = stored_colwise(&x, 1, masks[m]);
    for (int64_t i = 0; i < M * K; i++)
      if (fabs((double)t[i]) > amax_t[m]) amax_t[m] = fabs((double)t[i]);
    free(t);
    assert_true(amax_t[m] != amax_x); /* the data tells the two amaxes apart */
  }
  assert_true(amax_x == 7.5);
  uint8_t cfg[256];
  for (int o = 0; o < 4; o++) {
    const int rht = o >= 1 && o <= 2;
    nv_opts no = {rht, rht ? masks[o - 1] : 0xD7E8, o == 2, 0, o == 3, o == 3, 0, 0};
    configure_nv(ops, &host, cfg, no);
    const double want_col = rht ? amax_t[o - 1] : amax_x;
    for (uint32_t dirs = 1; dirs <= 3; dirs++) {
      hq_call call = scratch_call(ops, &host, cfg, 7, 0, M, K, dirs);
      float a[2] = {123.0f, 123.0f};
      DIRECT_OK(ops->amax(cfg, &call, &x, dirs, a));
      assert_true(a[0] == ((dirs & HQ_ROWWISE) ? (float)amax_x : 0.0f));
      assert_true(a[1] == ((dirs & HQ_COLWISE) ? (float)want_col : 0.0f));
      /* quantize with the computed amaxes == quantize computing them */
      hq_storage r0, c0, r1, c1;
      make_storage(ops, &host, cfg, &r0, HQ_ROWWISE, dirs, M, K);
      make_storage(ops, &host, cfg, &c0, HQ_COLWISE, dirs, M, K);
      make_storage(ops, &host, cfg, &r1, HQ_ROWWISE, dirs, M, K);
      make_storage(ops, &host, cfg, &c1, HQ_COLWISE, dirs, M, K);
      hq_storage *rp0 = (dirs & HQ_ROWWISE) ? &r0 : NULL, *cp0 = (dirs & HQ_COLWISE) ? &c0 : NULL;
      hq_storage *rp1 = (dirs & HQ_ROWWISE) ? &r1 : NULL, *cp1 = (dirs & HQ_COLWISE) ? &c1 : NULL;
      DIRECT_OK(ops->quantize(cfg, &call, &x, dirs, rp0, cp0));
      call.amax = a;
      DIRECT_OK(ops->quantize(cfg, &call, &x, dirs, rp1, cp1));
      if (rp0) assert_true(same_storage_bytes(rp0, rp1));
      if (cp0) assert_true(same_storage_bytes(cp0, cp1));
      /* a larger given amax is stored as given and changes the scales */
      if (!rht && dirs == HQ_BOTH) {
        float big[2] = {a[0] * 3.0f, a[1] * 3.0f};
        call.amax = big;
        DIRECT_OK(ops->quantize(cfg, &call, &x, dirs, rp1, cp1));
        assert_true(*(float *)hq_storage_buf(&r1, 2)->ptr == big[0]);
        assert_true(*(float *)hq_storage_buf(&c1, 2)->ptr == big[1]);
        assert_false(same_storage_bytes(&r0, &r1));
        /* each direction uses its own given amax, also where both are made in one pass (2-D:
           the columnwise copy is not the rowwise one transposed then): the bytes of making
           each direction alone with its amax */
        float two[2] = {a[0], a[1] * 2.0f};
        call.amax = two;
        DIRECT_OK(ops->quantize(cfg, &call, &x, HQ_BOTH, &r1, &c1));
        DIRECT_OK(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &r0, NULL));
        DIRECT_OK(ops->quantize(cfg, &call, &x, HQ_COLWISE, NULL, &c0));
        assert_true(same_storage_bytes(&r0, &r1));
        assert_true(same_storage_bytes(&c0, &c1));
        assert_true(*(float *)hq_storage_buf(&c1, 2)->ptr == two[1]);
      }
      free_call(&call);
      free_storage(&r0);
      free_storage(&c0);
      free_storage(&r1);
      free_storage(&c1);
    }
  }
  free(x.data);
}

/* Dequantize reads the layout from the storage: quantize with instance A, dequantize with A and
   with a differently configured instance B of a storage whose descriptor has one layout fact
   flipped: the values change (so the descriptor is what is read; that B reads A's storage as A
   does: test_conformance). A storage of A is refused by B's quantize. */
static void test_cross_instance_dequantize(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  char *last_err = hq_test_module_error();
  const hq_format_ops *ops = module_ops(&host);
  static const struct {
    nv_opts a, b;
  } pairs[] = {
      {{0, 0xD7E8, 0, 0, 0, 1, 0, 0}, {0, 0xD7E8, 0, 0, 0, 0, 0, 0}}, /* swizzled, read by compact */
      {{0, 0xD7E8, 0, 0, 0, 0, 0, 0}, {1, 0xD7E8, 0, 0, 0, 1, 0, 0}}, /* compact, read by swizzle + rht */
      {{1, 0x1234, 0, 0, 0, 0, 0, 0}, {0, 0xD7E8, 0, 0, 0, 0, 0, 0}}, /* rht, read without rht */
      {{1, 0xD7E8, 0, 0, 0, 1, 0, 0}, {1, 0x00ff, 0, 0, 0, 0, 0, 0}}, /* rht signs A, read with signs B */
      {{0, 0xD7E8, 0, 0, 1, 1, 0, 0}, {1, 0xD7E8, 0, 0, 0, 0, 0, 0}}, /* 2-D swizzled, read by 1-D rht */
      {{1, 0xD7E8, 1, 3, 0, 0, 0, 0}, {0, 0xD7E8, 0, 0, 1, 1, 0, 0}}, /* SR + rht, read by 2-D swizzled */
  };
  static const int64_t shapes[][2] = {{144, 80}, {48, 32}};
  uint8_t ca[256], cb[256];
  for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
    for (size_t si = 0; si < 2; si++) {
      const int64_t M = shapes[si][0], K = shapes[si][1];
      hq_tensor x = spread_tensor(HQ_BF16, M, K, 500 + pi);
      configure_nv(ops, &host, ca, pairs[pi].a);
      configure_nv(ops, &host, cb, pairs[pi].b);
      hq_storage st[2];
      quantize_both(ops, &host, ca, &x, 11, st);
      /* B's quantize refuses A's storages (their descriptor is not B's) */
      hq_call cbc = scratch_call(ops, &host, cb, 11, 0, M, K, HQ_BOTH);
      last_err[0] = 0;
      assert_int_equal(ops->quantize(cb, &cbc, &x, HQ_BOTH, &st[0], &st[1]), HQ_EINVAL);
      assert_non_null(strstr(last_err, "not described by this instance"));
      free_call(&cbc);
      for (int d = 0; d < 2; d++) {
        hq_call c = hq_test_call(&host, 0, 0);
        hq_tensor ya = hq_test_empty(HQ_F32, M, K), yb = hq_test_empty(HQ_F32, M, K);
        const size_t bytes = (size_t)(M * K) * sizeof(float);
        DIRECT_OK(ops->dequantize(ca, &c, &st[d], &ya));
        /* what the descriptor says matters: the other scale layout gives other values */
        hq_operand_desc keep = st[d].desc;
        st[d].desc.scale_layout = keep.scale_layout == HQ_SCALE_LAYOUT_SWIZZLED
                                      ? HQ_SCALE_LAYOUT_OUTER_MAJOR
                                      : HQ_SCALE_LAYOUT_SWIZZLED;
        DIRECT_OK(ops->dequantize(cb, &c, &st[d], &yb));
        assert_int_not_equal(memcmp(ya.data, yb.data, bytes), 0);
        st[d].desc = keep;
        if (d == 1) { /* ... and so does the RHT transform and its signs */
          st[d].desc.transform =
              keep.transform == HQ_TRANSFORM_RHT16 ? HQ_TRANSFORM_NONE : HQ_TRANSFORM_RHT16;
          st[d].desc.transform_param = keep.transform == HQ_TRANSFORM_RHT16 ? 0 : 0x5555;
          DIRECT_OK(ops->dequantize(cb, &c, &st[d], &yb));
          assert_int_not_equal(memcmp(ya.data, yb.data, bytes), 0);
          st[d].desc = keep;
        }
        free(ya.data);
        free(yb.data);
      }
      free_storage(&st[0]);
      free_storage(&st[1]);
      free(x.data);
    }
  }
  /* descriptors no nvfp4 instance makes are refused, naming the field */
  const int64_t M = 32, K = 32;
  configure_nv(ops, &host, ca, pairs[0].b);
  hq_storage s;
  make_storage(ops, &host, ca, &s, HQ_ROWWISE, HQ_BOTH, M, K);
  hq_tensor y = hq_test_empty(HQ_F32, M, K);
  hq_call c = hq_test_call(&host, 0, 0);
  s.desc.transform = HQ_TRANSFORM_RHT16; /* a rowwise RHT */
  assert_int_equal(ops->dequantize(ca, &c, &s, &y), HQ_ENOTSUP);
  assert_non_null(strstr(last_err, "desc.transform"));
  s.desc.transform = HQ_TRANSFORM_NONE;
  s.desc.scale_layout = HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  assert_int_equal(ops->dequantize(ca, &c, &s, &y), HQ_ENOTSUP);
  assert_non_null(strstr(last_err, "desc.scale_layout"));
  s.desc.scale_layout = HQ_SCALE_LAYOUT_OUTER_MAJOR;
  s.desc.order = HQ_ORDER_KM;
  assert_int_equal(ops->dequantize(ca, &c, &s, &y), HQ_ENOTSUP);
  assert_non_null(strstr(last_err, "desc.order"));
  s.desc.order = HQ_ORDER_MK;
  s.desc.scale_mode = HQ_SCALE_VEC32_UE8M0;
  assert_int_equal(ops->dequantize(ca, &c, &s, &y), HQ_EINVAL);
  assert_non_null(strstr(last_err, "not NVFP4"));
  free_storage(&s);
  free(y.data);
}

// --- the split amax and updates through the public API ------------------------------------

/* The 16x16 tensor of test_hand_computed_chain (A = 10, a block of amax 2.5) quantized with a
   caller's amax of 15 instead: S_enc = RN(2688/15) = 179.2 (0x43333333), m = 29.866667
   (0x41EEEEEF), the block's sf = E4M3(RN(2.5 * m) = 74.666664) = 72 (0x69), S_dec =
   0x3BB6DB6E, enc = RN(1 / RN(72 * S_dec) = 0.40178573) = 2.4888887 (0x401F49F4): the same
   codes; dequantized with RN(RN(72 * 15) * RN(1/2688)) = 0.40178573 (0x3ECDB6DC). The amax
   block (-10): sf = E4M3(298.66666) = 288 (0x79), code 15, dequantized to -9.642858. (Numbers
   from a separate float32 calculation.) */
static void test_caller_amax_hand(void **state) {
  (void)state;
  float v[16 * 16] = {0};
  static const float blk[16] = {2.5f, -1.0f, 0.3f, 0.0f, 1.25f, -2.5f, 0.7f, 0.1f,
                                1.9f, -0.4f, 2.0f, 1.5f, -0.21f, 0.625f, 1.66f, -2.2f};
  memcpy(v, blk, sizeof blk);
  v[16 * 3 + 5] = -10.0f;
  hq_tensor x = f32_from(v, 16, 16);
  hq_recipe *r = nv_recipe(NULL);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  hq_ctx *ctx = ctx_with_seed(0);
  float a[2] = {-1.0f, -1.0f};
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, ctx, &x, a));
  assert_true(a[0] == 10.0f);
  float given[2] = {15.0f, 15.0f};
  hq_quantize_args args = {0};
  args.struct_size = sizeof args;
  args.amax = given;
  hq_qtensor *t = NULL;
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, &x, &args, &t));
  const hq_storage *s = hq_qtensor_storage(t, HQ_ROWWISE);
  const uint8_t *data = hq_storage_cbuf(s, 0)->ptr, *sc = hq_storage_cbuf(s, 1)->ptr;
  static const uint8_t want[8] = {0xc7, 0x01, 0xf5, 0x03, 0xa6, 0x66, 0x39, 0xf6};
  assert_memory_equal(data, want, 8);
  assert_int_equal(sc[0], 0x69);     /* was 0x6E with A = 10 */
  assert_int_equal(sc[3 * 4], 0x79); /* the amax block: was 0x7E (448) */
  assert_true(*(const float *)hq_storage_cbuf(s, 2)->ptr == 15.0f);
  hq_tensor y = hq_test_empty(HQ_F32, 16, 16);
  HQ_OK_OR_FAIL(hq_dequantize(t, ctx, HQ_ROWWISE, &y));
  static const float deq[16] = {2.4107143878936768f, -0.8035714626312256f, 0.2008928656578064f,
                                0.0f, 1.2053571939468384f, -2.4107143878936768f,
                                0.6026785969734192f, 0.0f, 1.6071429252624512f,
                                -0.4017857313156128f, 1.6071429252624512f, 1.6071429252624512f,
                                -0.2008928656578064f, 0.6026785969734192f, 1.6071429252624512f,
                                -2.4107143878936768f};
  for (int k = 0; k < 16; k++) assert_true(getf(&y, 0, k) == deq[k]);
  assert_true(getf(&y, 3, 5) == -9.642857551574707f);
  free(y.data);
  hq_qtensor_free(t);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
}

/* The quantizer's amax kinds per the table (the columnwise RHT copy's amax is its own), and the
   AMAX buffers of hq_quantize_ex hold the amaxes hq_quantizer_amax computed, for every option
   that changes the amax (that the bytes equal hq_quantize's: test_conformance). */
static void test_caller_amax_api(void **state) {
  (void)state;
  static const struct {
    const char *opts;
    uint32_t col_kind;
  } cases[] = {
      {NULL, HQ_AMAX_INPUT},
      {"rht = true", HQ_AMAX_OWN},
      {"swizzle = true\nrht = true\nrht_sign_mask = 0x1234", HQ_AMAX_OWN},
      {"block_2d = true", HQ_AMAX_INPUT},
      {"stochastic_rounding = true\nrht = true", HQ_AMAX_OWN},
      {"stochastic_rounding = true", HQ_AMAX_INPUT},
  };
  static const int64_t shapes[][2] = {{48, 80}, {144, 32}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    for (size_t si = 0; si < 2; si++) {
      const int64_t M = shapes[si][0], K = shapes[si][1];
      hq_tensor x = spread_tensor(si ? HQ_F32 : HQ_BF16, M, K, 300 + ci);
      hq_recipe *r = nv_recipe(cases[ci].opts);
      for (uint32_t usage = 1; usage <= 3; usage++) {
        hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
        HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
        assert_int_equal(hq_quantizer_amax_kind(q, HQ_ROWWISE), HQ_AMAX_INPUT);
        assert_int_equal(hq_quantizer_amax_kind(q, HQ_COLWISE), cases[ci].col_kind);
        hq_ctx *c1 = ctx_with_seed(21), *c2 = ctx_with_seed(21);
        float a[2] = {-1.0f, -1.0f};
        HQ_OK_OR_FAIL(hq_quantizer_amax(q, c1, &x, a));
        hq_quantize_args args = {0};
        args.struct_size = sizeof args;
        args.amax = a;
        hq_qtensor *t1 = NULL;
        HQ_OK_OR_FAIL(hq_quantize_ex(q, c2, &x, &args, &t1));
        /* the AMAX buffers hold the amaxes */
        if (usage & HQ_ROWWISE)
          assert_true(*(const float *)hq_storage_cbuf(hq_qtensor_storage(t1, 1), 2)->ptr == a[0]);
        if (usage & HQ_COLWISE)
          assert_true(*(const float *)hq_storage_cbuf(hq_qtensor_storage(t1, 2), 2)->ptr == a[1]);
        hq_qtensor_free(t1);
        hq_ctx_destroy(c1);
        hq_ctx_destroy(c2);
        hq_quantizer_free(q);
      }
      hq_recipe_free(r);
      free(x.data);
    }
  }
}

// --- ABI 2.1: raw dequantize, the per-tensor factor, emul dtype, the gemm op, hq_gemm --------

/* A direct module call of dequantize with `flags` (HQ_CALL_DEQ_RAW or 0). */
static int deq_flags(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                     const hq_storage *s, hq_tensor *y, uint32_t flags) {
  hq_call c = hq_test_call(host, 0, 0);
  c.flags = flags;
  hq_test_module_error()[0] = 0;
  return ops->dequantize(cfg, &c, s, y);
}
static float factor_of(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                       const hq_storage *s) {
  hq_call c = hq_test_call(host, 0, 0);
  float f = -1.0f;
  DIRECT_OK(ops->tensor_factor(cfg, &c, s, &f));
  return f;
}
/* The rule of docs/formats.md, in the test's own float arithmetic: RN(A * RN(1/2688)). */
static float want_factor(float A) {
  volatile float c = 1.0f / 2688.0f;
  return A * c;
}
static int is_pow2_e4m3(unsigned sf) { /* fp32(sf) is a power of two (0x00 is 0: not) */
  unsigned e = (sf >> 3) & 0xfu, m = sf & 7u;
  return e ? m == 0 : (m == 1 || m == 2 || m == 4);
}
/* Distance in units in the last place between two finite floats (by their ordered bits). */
static int64_t ulp_dist(float a, float b) {
  int32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  int64_t u = x < 0 ? (int64_t)INT32_MIN - x : x, v = y < 0 ? (int64_t)INT32_MIN - y : y;
  return u > v ? u - v : v - u;
}
static int same_float(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* The worked example of docs/formats.md 5.6 (A = 10, sf = 0x71 = 144, bytes a4 61 3f 40 6e 90
   e7 53), built by hand in a rowwise storage (row 0) and in a columnwise storage marked RHT
   (stored row 0 = column 0 of the [M, K] tensor): the raw values are e2m1 * 144, in every
   destination dtype, the RHT copy left in its (transformed) domain; the factor is
   RN(10 * RN(1/2688)) = 0x1.e79e7ap-9; the plain dequantize gives the doc's table; the RHT copy's
   dequantize applies the inverse transform (so it is not raw * factor there). */
static void test_raw_dequantize_hand(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  static const uint8_t bytes[8] = {0xa4, 0x61, 0x3f, 0x40, 0x6e, 0x90, 0xe7, 0x53};
  static const float raw[16] = {288, -144, 72, 576, -864, 216, 0, 288,
                                -576, 576, 0, -72, 864, -576, 216, 432};
  static const float deq[16] = {1.07142854f, -0.535714269f, 0.267857134f, 2.14285707f,
                                -3.21428561f, 0.803571403f, 0, 1.07142854f,
                                -2.14285707f, 2.14285707f, 0, -0.267857134f,
                                3.21428561f, -2.14285707f, 0.803571403f, 1.60714281f};
  const int64_t M = 16, K = 16;
  uint8_t cfg[256];
  configure_nv(ops, &host, cfg, (nv_opts){1, 0xD7E8, 0, 0, 0, 0, 0, 0});
  for (int d = 0; d < 2; d++) {
    hq_storage s;
    make_storage(ops, &host, cfg, &s, d ? HQ_COLWISE : HQ_ROWWISE, HQ_BOTH, M, K);
    for (uint32_t i = 0; i < 3; i++)
      memset(hq_storage_buf(&s, i)->ptr, 0, hq_storage_buf(&s, i)->bytes);
    memcpy(hq_storage_buf(&s, 0)->ptr, bytes, 8);
    ((uint8_t *)hq_storage_buf(&s, 1)->ptr)[0] = 0x71;
    *(float *)hq_storage_buf(&s, 2)->ptr = 10.0f;
    assert_int_equal(s.desc.transform, d ? HQ_TRANSFORM_RHT16 : HQ_TRANSFORM_NONE);
    const float f = factor_of(ops, cfg, &host, &s);
    assert_true(same_float(f, 0x1.e79e7ap-9f));
    assert_true(same_float(f, want_factor(10.0f)));
    static const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
    for (int o = 0; o < 3; o++) {
      hq_tensor y = hq_test_empty(outs[o], M, K);
      DIRECT_OK(deq_flags(ops, cfg, &host, &s, &y, HQ_CALL_DEQ_RAW));
      for (int e = 0; e < 16; e++) {
        const float g = hq_load_hp(y.data, d ? e * K : e, outs[o]);
        if (!same_float(g, raw[e]))
          fail_msg("dir %d out %d element %d: raw %a, want %a", d + 1, (int)outs[o], e,
                   (double)g, (double)raw[e]);
      }
      for (int64_t t = 0; t < M * K; t++) /* every other block: sf = 0 */
        if ((d ? t % K : t / K) != 0) assert_true(hq_load_hp(y.data, t, outs[o]) == 0.0f);
      free(y.data);
    }
    hq_tensor y = hq_test_empty(HQ_F32, M, K);
    DIRECT_OK(deq_flags(ops, cfg, &host, &s, &y, 0));
    if (!d) {
      for (int e = 0; e < 16; e++) {
        assert_true(same_float(getf(&y, 0, e), deq[e]));
        assert_true(same_float(want_factor(10.0f) * raw[e], deq[e])); /* here: bit for bit */
      }
    } else {
      /* the inverse RHT mixes the 16 values: the first output is (s_0 / 4) * sum(values) */
      float sum = 0;
      for (int e = 0; e < 16; e++) sum += deq[e];
      assert_float_equal(getf(&y, 0, 0), sum / 4, 1e-5);
      assert_false(same_float(getf(&y, 1, 0), deq[1]));
      /* the same storage without the transform: the factor times the raw values */
      hq_storage plain = s;
      plain.desc.transform = HQ_TRANSFORM_NONE;
      plain.desc.transform_param = 0;
      DIRECT_OK(deq_flags(ops, cfg, &host, &plain, &y, 0));
      for (int e = 0; e < 16; e++) assert_true(same_float(getf(&y, e, 0), deq[e]));
    }
    free(y.data);
    free_storage(&s);
  }
}

/* ABI 2.3 (HQ_CAP_DEQ_FACTOR): a raw dequantize with call->factor_out also writes RN(m * f), f
   = RN(A * RN(1/2688)) of the storage's amax (here in the test's own float arithmetic), m =
   factor_mul or *factor_in; the values it writes are those of a plain raw dequantize; without
   HQ_CALL_DEQ_RAW, or from a call struct older than 2.3, factor_out is left alone; an empty
   storage still gets its factor. */
static void test_deq_factor_out(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  assert_true(ops->caps & HQ_CAP_DEQ_FACTOR);
  static const nv_opts opts[] = {{0, 0xD7E8, 0, 0, 0, 0, 0, 0}, {1, 0xD7E8, 0, 0, 0, 1, 0, 0}};
  uint8_t cfg[256];
  for (size_t oi = 0; oi < sizeof opts / sizeof opts[0]; oi++)
    for (int empty = 0; empty < 2; empty++) {
      const int64_t M = empty ? 0 : 48, K = 80;
      configure_nv(ops, &host, cfg, opts[oi]);
      hq_tensor x = spread_tensor(HQ_BF16, M, K, 900 + oi);
      hq_storage st[2];
      quantize_both(ops, &host, cfg, &x, 3, st);
      if (empty) { /* an empty tensor's amax is 0: give it one, so the factor is not 0 */
        *(float *)hq_storage_buf(&st[0], 2)->ptr = 1000.0f;
        *(float *)hq_storage_buf(&st[1], 2)->ptr = 3.0f;
      }
      for (int d = 0; d < 2; d++) {
        const hq_storage *s = &st[d];
        const float A = *(const float *)hq_storage_cbuf(s, 2)->ptr;
        assert_true(A > 0.0f);
        volatile float f = want_factor(A), m0 = 1.5f, w0 = m0 * f, w1 = w0 * f;
        hq_tensor plain = hq_test_empty(HQ_F32, M, K), y = hq_test_empty(HQ_F32, M, K);
        DIRECT_OK(deq_flags(ops, cfg, &host, s, &plain, HQ_CALL_DEQ_RAW));
        float out[2] = {-1.0f, -1.0f};
        hq_call c = hq_test_call(&host, 0, 0);
        c.flags = HQ_CALL_DEQ_RAW;
        c.factor_out = &out[0];
        c.factor_mul = 1.5f;
        DIRECT_OK(ops->dequantize(cfg, &c, s, &y));
        if (M && memcmp(y.data, plain.data, (size_t)(M * K) * sizeof(float)))
          fail_msg("opts %zu dir %d: the values differ from a plain raw dequantize", oi, d + 1);
        c.factor_out = &out[1];
        c.factor_in = &out[0];
        c.factor_mul = 99.0f; /* ignored: factor_in is set */
        DIRECT_OK(ops->dequantize(cfg, &c, s, &y));
        if (!same_float(out[0], w0) || !same_float(out[1], w1))
          fail_msg("opts %zu empty %d dir %d: factors %a, %a; want RN(1.5 * %a) = %a, then %a",
                   oi, empty, d + 1, (double)out[0], (double)out[1], (double)f, (double)w0,
                   (double)w1);
        /* not raw, or a 2.2 call struct: nothing is written */
        float untouched = -7.0f;
        c.flags = 0;
        c.factor_out = &untouched;
        c.factor_in = NULL;
        DIRECT_OK(ops->dequantize(cfg, &c, s, &y));
        c.flags = HQ_CALL_DEQ_RAW;
        c.struct_size = HQ_CALL_SIZE_2_2;
        DIRECT_OK(ops->dequantize(cfg, &c, s, &y));
        assert_true(untouched == -7.0f);
        free(plain.data);
        free(y.data);
      }
      free_storage(&st[0]);
      free_storage(&st[1]);
      free(x.data);
    }
}

/* ABI 2.6's row factors (HQ_CAP_DEQ_ROW_FACTOR): a raw dequantize of a row-scaled storage with
   call->row_factor_out writes each stored row's factor RN(A_r * RN(1/2688)) and the raw values
   without it, e2m1 * fp32(sf). The hand data of test_row_scaled_hand: rowwise, rows 0..2 carry
   scale 0x7E (448) and amaxes 6, 6144, 6/1024, so their values are E2M1_ROW * 448 (0.25 ties to
   0) in F32 and BF16 alike, and 448 times each factor is the row's multiplier 2^k within an ulp;
   columnwise (stored row = column k of x) the factors follow the per-column amaxes
   1024 * |E2M1_ROW[k % 16]|, and RN(value * factor) is the plain raw value within 3 ulps (the
   rounding of RN(fp32(sf) * A) first, as test_tensor_factor_invariant). Without
   HQ_CALL_DEQ_RAW, or from a call struct of 2.5, nothing is written to row_factor_out and the
   values keep their factors. */
static void test_row_factor_out(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  const int64_t M = 16, K = 32;
  float v[16 * 32];
  hq_tensor x = row_scaled_input(v);
  run u;
  run_quant(&u, "global_scale = row", &x, 0, HQ_BOTH);
  const float A_row[4] = {6.0f, 6144.0f, 6.0f / 1024.0f, 0.0f};
  for (int d = 0; d < 2; d++) {
    const hq_storage *s = hq_qtensor_storage(u.t, d ? HQ_COLWISE : HQ_ROWWISE);
    const int64_t R = d ? K : M;
    float f[32], A[32];
    for (int64_t r = 0; r < R; r++) {
      f[r] = -1.0f;
      A[r] = d ? 1024.0f * fabsf(E2M1_ROW[r % 16]) : r < 4 ? A_row[r] : 0.0f;
    }
    hq_tensor plain = hq_test_empty(HQ_F32, M, K);
    DIRECT_OK(deq_flags(ops, NULL, &host, s, &plain, HQ_CALL_DEQ_RAW));
    for (int t = 0; t < 2; t++) {
      hq_tensor y = hq_test_empty(t ? HQ_BF16 : HQ_F32, M, K);
      hq_call c = hq_test_call(&host, 0, 0);
      c.flags = HQ_CALL_DEQ_RAW;
      c.row_factor_out = f;
      DIRECT_OK(ops->dequantize(NULL, &c, s, &y));
      for (int64_t r = 0; r < R; r++) {
        if (!same_float(f[r], want_factor(A[r])))
          fail_msg("dir %d: factor of stored row %lld %a, want RN(%a * RN(1/2688)) = %a", d + 1,
                   (long long)r, (double)f[r], (double)A[r], (double)want_factor(A[r]));
        if (!d && r < 3 && ulp_dist(448.0f * f[r], ROW_MUL[r]) > 1)
          fail_msg("row %lld: 448 * factor %a is not 2^k = %a", (long long)r,
                   (double)(448.0f * f[r]), (double)ROW_MUL[r]);
      }
      for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
          const float got = getf(&y, i, k), p = getf(&plain, i, k);
          if (!d) {
            const float want = i < 3 && E2M1_ROW[k % 16] != 0.25f ? E2M1_ROW[k % 16] * 448.0f
                                                                  : 0.0f;
            if (got != want)
              fail_msg("rowwise [%lld][%lld] %s: %g, want %g", (long long)i, (long long)k,
                       t ? "bf16" : "f32", got, want);
          }
          volatile float prod = got * f[d ? k : i];
          if (ulp_dist(prod, p) > 3)
            fail_msg("dir %d [%lld][%lld]: value %g times factor %g = %a, plain raw %a", d + 1,
                     (long long)i, (long long)k, got, (double)f[d ? k : i], (double)prod,
                     (double)p);
        }
      free(y.data);
    }
    /* not raw, or a call struct that ends before row_factor_out: untouched, factors kept */
    float untouched = -7.0f;
    hq_tensor y = hq_test_empty(HQ_F32, M, K);
    hq_call c = hq_test_call(&host, 0, 0);
    c.row_factor_out = &untouched;
    DIRECT_OK(ops->dequantize(NULL, &c, s, &y));
    c.flags = HQ_CALL_DEQ_RAW;
    c.struct_size = HQ_CALL_SIZE_2_3;
    DIRECT_OK(ops->dequantize(NULL, &c, s, &y));
    assert_true(untouched == -7.0f);
    assert_memory_equal(y.data, plain.data, (size_t)(M * K) * sizeof(float));
    free(y.data);
    free(plain.data);
  }
  run_free(&u);
  free(x.data);
}

/* The invariant of the per-tensor factor, on quantized random data (1-D, 2-D, swizzled, SR,
   RHT; both directions): tensor_factor is RN(A * RN(1/2688)) of the storage's amax; every raw
   value is e2m1(q) * fp32(sf) (computed here from the bytes); and RN(raw * factor) equals the
   dequantized value bit for bit wherever fp32(sf) is a power of two, within 3 ulps elsewhere:
   the dequantizer rounds RN(fp32(sf) * A) first (TE's order, kept), so the two orders round
   differently. For an RHT copy the relation holds before the inverse transform (its dequantize
   with the descriptor's transform cleared). */
static void test_tensor_factor_invariant(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  static const nv_opts opts[] = {{0, 0xD7E8, 0, 0, 0, 0, 0, 0}, {0, 0xD7E8, 0, 0, 0, 1, 0, 0},
                                 {0, 0xD7E8, 0, 0, 1, 0, 0, 0}, {1, 0xD7E8, 1, 5, 0, 1, 0, 0},
                                 {1, 0x1234, 0, 0, 0, 0, 0, 0}};
  const int64_t M = 144, K = 80;
  int64_t exact = 0, near = 0;
  uint8_t cfg[256];
  for (size_t oi = 0; oi < sizeof opts / sizeof opts[0]; oi++) {
    configure_nv(ops, &host, cfg, opts[oi]);
    hq_tensor x = spread_tensor(oi % 2 ? HQ_BF16 : HQ_F32, M, K, 800 + oi);
    hq_storage st[2];
    quantize_both(ops, &host, cfg, &x, 3, st);
    for (int d = 0; d < 2; d++) {
      const hq_storage *s = &st[d];
      const float A = *(const float *)hq_storage_cbuf(s, 2)->ptr;
      const float f = factor_of(ops, cfg, &host, s);
      if (!same_float(f, want_factor(A)))
        fail_msg("opts %zu dir %d: factor %a, want RN(%a * RN(1/2688)) = %a", oi, d + 1,
                 (double)f, (double)A, (double)want_factor(A));
      hq_storage plain = *s; /* the dequantize before the inverse transform */
      plain.desc.transform = HQ_TRANSFORM_NONE;
      plain.desc.transform_param = 0;
      hq_tensor raw = hq_test_empty(HQ_F32, M, K), y = hq_test_empty(HQ_F32, M, K);
      DIRECT_OK(deq_flags(ops, cfg, &host, s, &raw, HQ_CALL_DEQ_RAW));
      DIRECT_OK(deq_flags(ops, cfg, &host, &plain, &y, 0));
      const uint8_t *q = hq_storage_cbuf(s, 0)->ptr, *sc = hq_storage_cbuf(s, 1)->ptr;
      const int swz = s->desc.scale_layout == HQ_SCALE_LAYOUT_SWIZZLED;
      for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
          /* stored row r, element c: rowwise (i, k), columnwise (k, i) */
          const int64_t r = d ? k : i, c = d ? i : k, C = d ? M : K;
          const unsigned code = (q[r * (C / 2) + c / 2] >> ((c & 1) * 4)) & 0xfu;
          const unsigned sf = sc[ref_scale_off(r, c / 16, C, swz)];
          const float want_raw = (float)(ref_e2m1_val(code) * ref_e4m3_val(sf));
          const float g = getf(&raw, i, k), dv = getf(&y, i, k);
          if (!same_float(g, want_raw))
            fail_msg("opts %zu dir %d (%lld,%lld): raw %a, want %a (code %x sf %02x)", oi, d + 1,
                     (long long)i, (long long)k, (double)g, (double)want_raw, code, sf);
          const float p = g * f;
          if (is_pow2_e4m3(sf) || g == 0.0f) {
            if (!same_float(p, dv) && !(g == 0.0f && p == dv))
              fail_msg("opts %zu dir %d (%lld,%lld): raw * factor %a != dequantized %a (sf %02x)",
                       oi, d + 1, (long long)i, (long long)k, (double)p, (double)dv, sf);
            exact += g != 0.0f;
          } else {
            if (ulp_dist(p, dv) > 3)
              fail_msg("opts %zu dir %d (%lld,%lld): raw * factor %a vs dequantized %a: %lld ulps",
                       oi, d + 1, (long long)i, (long long)k, (double)p, (double)dv,
                       (long long)ulp_dist(p, dv));
            near++;
          }
        }
      free(raw.data);
      free(y.data);
    }
    free_storage(&st[0]);
    free_storage(&st[1]);
    free(x.data);
  }
  assert_true(exact > 1000); /* both kinds of scale are met */
  assert_true(near > 1000);
}

/* desc.emul_dtype is BF16: every raw value of every (element code, scale code) pair -- all 16
   E2M1 codes times the 127 non-NaN E4M3 scale codes -- is e2m1 * fp32(sf) (computed here in
   double) and is written to a BF16 destination unchanged (signed zeros included), in both
   directions. */
static void test_emul_dtype_bf16(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  const int64_t R = 128, C = 16; /* stored rows: one per scale code */
  uint8_t cfg[256];
  configure_nv(ops, &host, cfg, (nv_opts){0, 0xD7E8, 0, 0, 0, 0, 0, 0});
  for (int d = 0; d < 2; d++) {
    const int64_t M = d ? C : R, K = d ? R : C;
    hq_storage s;
    make_storage(ops, &host, cfg, &s, d ? HQ_COLWISE : HQ_ROWWISE, HQ_BOTH, M, K);
    assert_int_equal(s.desc.emul_dtype, HQ_BF16);
    uint8_t *q = hq_storage_buf(&s, 0)->ptr, *sc = hq_storage_buf(&s, 1)->ptr;
    memset(sc, 0, hq_storage_buf(&s, 1)->bytes);
    for (int64_t r = 0; r < R; r++) {
      for (int b = 0; b < 8; b++) q[r * 8 + b] = (uint8_t)(2 * b | (2 * b + 1) << 4);
      sc[ref_scale_off(r, 0, C, 0)] = (uint8_t)(r < 127 ? r : 0x7e);
    }
    *(float *)hq_storage_buf(&s, 2)->ptr = 1.0f;
    hq_tensor f = hq_test_empty(HQ_F32, M, K), b = hq_test_empty(HQ_BF16, M, K);
    DIRECT_OK(deq_flags(ops, cfg, &host, &s, &f, HQ_CALL_DEQ_RAW));
    DIRECT_OK(deq_flags(ops, cfg, &host, &s, &b, HQ_CALL_DEQ_RAW));
    for (int64_t r = 0; r < R; r++)
      for (int e = 0; e < 16; e++) {
        const int64_t t = d ? e * K + r : r * K + e;
        const double want = ref_e2m1_val((unsigned)e) * ref_e4m3_val(r < 127 ? (unsigned)r : 0x7e);
        const float g = ((float *)f.data)[t], gb = hq_load_hp(b.data, t, HQ_BF16);
        if ((double)g != want || !signbit(g) != !signbit(want) || !same_float(gb, g))
          fail_msg("dir %d sf %02llx code %x: raw %a, bf16 %a, want %a", d + 1, (long long)r, e,
                   (double)g, (double)gb, want);
      }
    free(f.data);
    free(b.data);
    free_storage(&s);
  }
}

/* hq_gemm of two nvfp4 operands on a host context, against the F64 product of their
   hq_dequantize outputs: fprop (TN: 2-D swizzled weights x inputs), dgrad (NN), wgrad (NT: both
   columnwise copies with the same RHT, multiplied in the transformed domain; their dequantize
   undoes the RHT in FP32, whose rounding -- at most 2^-24 of each 16-group's absolute sum per
   value, bounded here by 2^-22 -- adds to the FP32 accumulation tolerance), TT; f32 and bf16 D;
   beta 0 and 1. */
static void test_gemm_host(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = module_ops(&host);
  hq_recipe *r = hq_test_recipe(
      "[format w]\nplugin = nvfp4\nblock_2d = true\nswizzle = true\n"
      "[format x]\nplugin = nvfp4\nrht = true\n"
      "[format g]\nplugin = nvfp4\nrht = true\nstochastic_rounding = true\n"
      "[role linear:weight:*]\nrowwise = w\ncolumnwise = w\n"
      "[role linear:input:*]\nrowwise = x\ncolumnwise = x\n"
      "[role linear:grad_output:*]\nrowwise = g\ncolumnwise = g\n");
  hq_quantizer *qw = hq_test_quantizer(r, "linear:weight:fc"),
               *qx = hq_test_quantizer(r, "linear:input:fc"),
               *qg = hq_test_quantizer(r, "linear:grad_output:fc");
  hq_ctx *ctx = ctx_with_seed(5);
  const int64_t tokens = 96, in = 64, out = 80;
  hq_tensor w = spread_tensor(HQ_BF16, out, in, 11), x = spread_tensor(HQ_F32, tokens, in, 12);
  hq_tensor dy = spread_tensor(HQ_BF16, tokens, out, 13);
  hq_qtensor *W = NULL, *X = NULL, *G = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qw, ctx, &w, &W));
  HQ_OK_OR_FAIL(hq_quantize(qx, ctx, &x, &X));
  HQ_OK_OR_FAIL(hq_quantize(qg, ctx, &dy, &G));
  static const struct {
    const char *what;
    int a, ta, b, tb; /* 0 W, 1 X, 2 G */
  } cases[] = {
      {"fprop TN", 0, 1, 1, 0}, {"dgrad NN", 0, 0, 2, 0}, {"wgrad NT", 1, 0, 2, 1},
      {"TT", 2, 1, 0, 1},
  };
  hq_qtensor *Q[3] = {W, X, G};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int v = 0; v < 2; v++) {
      const hq_qtensor *A = Q[cases[c].a], *B = Q[cases[c].b];
      const int ta = cases[c].ta, tb = cases[c].tb;
      const hq_dtype dt = v ? HQ_BF16 : HQ_F32;
      const float alpha = v ? -0.5f : 1.0f, beta = v ? 1.0f : 0.0f;
      const int64_t A0 = hq_qtensor_rows(A), A1 = hq_qtensor_cols(A);
      const int64_t B0 = hq_qtensor_rows(B), B1 = hq_qtensor_cols(B);
      const int64_t m = ta ? A0 : A1, k = ta ? A1 : A0, n = tb ? B1 : B0;
      const uint32_t da = ta ? HQ_ROWWISE : HQ_COLWISE, db = tb ? HQ_COLWISE : HQ_ROWWISE;
      hq_tensor a = hq_test_empty(HQ_F32, A0, A1), b = hq_test_empty(HQ_F32, B0, B1);
      HQ_OK_OR_FAIL(hq_dequantize(A, ctx, da, &a));
      HQ_OK_OR_FAIL(hq_dequantize(B, ctx, db, &b));
      /* the transformed-domain magnitudes: |raw * factor| summed over each 16-group along k */
      const hq_storage *sa = hq_qtensor_storage(A, da), *sb = hq_qtensor_storage(B, db);
      const int rht = sa->desc.transform == HQ_TRANSFORM_RHT16;
      assert_int_equal(sb->desc.transform, sa->desc.transform);
      hq_tensor ra = hq_test_empty(HQ_F32, A0, A1), rb = hq_test_empty(HQ_F32, B0, B1);
      uint8_t cfg[256];
      configure_nv(ops, &host, cfg, (nv_opts){0, 0xD7E8, 0, 0, 0, 0, 0, 0});
      DIRECT_OK(deq_flags(ops, cfg, &host, sa, &ra, HQ_CALL_DEQ_RAW));
      DIRECT_OK(deq_flags(ops, cfg, &host, sb, &rb, HQ_CALL_DEQ_RAW));
      const float fa = factor_of(ops, cfg, &host, sa), fb = factor_of(ops, cfg, &host, sb);
      hq_tensor d = hq_test_tensor(dt, n, m, 77 + c, 1.0f);
      double *d0 = malloc((size_t)(n * m) * sizeof(double));
      for (int64_t t = 0; t < n * m; t++) d0[t] = hq_load_hp(d.data, t, dt);
      hq_gemm_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, alpha, beta, NULL,
                            &info));
      double worst = 0;
      assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
      assert_string_equal(info.format_a, "nvfp4");
      assert_string_equal(info.format_b, "nvfp4");
      if (!strstr(info.reason, "host")) fail_msg("%s: reason '%s'", cases[c].what, info.reason);
      const float *af = a.data, *bf = b.data, *raf = ra.data, *rbf = rb.data;
      for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
          double s = 0, sabs = 0, grp = 0;
          for (int64_t p = 0; p < k; p++) {
            const int64_t ia = ta ? i * A1 + p : p * A1 + i, ib = tb ? p * B1 + j : j * B1 + p;
            s += (double)af[ia] * bf[ib];
            sabs += fabs((double)af[ia] * bf[ib]);
            if (rht) { /* group abs-sums of the transformed values times the partner's */
              double ga = 0, gb = 0;
              for (int64_t q = p / 16 * 16; q < p / 16 * 16 + 16; q++) {
                ga += fabs((double)raf[ta ? i * A1 + q : q * A1 + i] * fa);
                gb += fabs((double)rbf[tb ? q * B1 + j : j * B1 + q] * fb);
              }
              grp += ga * fabs((double)bf[ib]) + fabs((double)af[ia]) * gb;
            }
          }
          const double want = (double)alpha * s + (double)beta * d0[j * m + i];
          const double got = hq_load_hp(d.data, j * m + i, dt);
          double tol = (double)(k + 8) * 0x1p-23 *
                           (fabs((double)alpha) * sabs + fabs((double)beta * d0[j * m + i])) +
                       0x1p-22 * fabs((double)alpha) * grp + 1e-30;
          if (dt == HQ_BF16) tol += 0x1p-7 * fabs(want);
          if (!(fabs(got - want) <= tol))
            fail_msg("%s (%s): D[%lld][%lld] = %.9g, F64 %.9g (tol %g)", cases[c].what,
                     hq_dtype_name(dt), (long long)j, (long long)i, got, want, tol);
          if (fabs(got - want) / tol > worst) worst = fabs(got - want) / tol;
        }
      if (getenv("HQ_TEST_VERBOSE"))
        printf("%s (%s): worst err/tol %.3g\n", cases[c].what, hq_dtype_name(dt), worst);
      free(d0);
      free(d.data);
      free(a.data);
      free(b.data);
      free(ra.data);
      free(rb.data);
    }
  hq_qtensor_free(W);
  hq_qtensor_free(X);
  hq_qtensor_free(G);
  free(w.data);
  free(x.data);
  free(dy.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(qw);
  hq_quantizer_free(qx);
  hq_quantizer_free(qg);
  hq_recipe_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plugin_caps_and_options),
      cmocka_unit_test(test_configure_errors),
      cmocka_unit_test(test_layout_desc_buffers),
      cmocka_unit_test(test_shape_errors),
      cmocka_unit_test(test_hand_built_packing),
      cmocka_unit_test(test_hand_computed_chain),
      cmocka_unit_test(test_vs_reference),
      cmocka_unit_test(test_zero_nan_inf),
      cmocka_unit_test(test_rms_error_band),
      cmocka_unit_test(test_sr_against_reference),
      cmocka_unit_test(test_sr_reproducible),
      cmocka_unit_test(test_sr_unbiased),
      cmocka_unit_test(test_rht_columnwise),
      cmocka_unit_test(test_rht_preserves_products),
      cmocka_unit_test(test_block_2d),
      cmocka_unit_test(test_swizzle_is_a_permutation),
      cmocka_unit_test(test_colwise_only_and_hybrid),
      cmocka_unit_test(test_padding_is_zero),
      cmocka_unit_test(test_ops_direct),
      cmocka_unit_test(test_direct_scratch_and_update),
      cmocka_unit_test(test_direct_amax),
      cmocka_unit_test(test_cross_instance_dequantize),
      cmocka_unit_test(test_caller_amax_hand),
      cmocka_unit_test(test_caller_amax_api),
      cmocka_unit_test(test_raw_dequantize_hand),
      cmocka_unit_test(test_tensor_factor_invariant),
      cmocka_unit_test(test_deq_factor_out),
      cmocka_unit_test(test_row_factor_out),
      cmocka_unit_test(test_emul_dtype_bf16),
      cmocka_unit_test(test_gemm_host),
      cmocka_unit_test(test_row_scaled_hand),
      cmocka_unit_test(test_ue5m3_hand),
      cmocka_unit_test(test_option_errors),
      cmocka_unit_test(test_options_cross_instance),
      cmocka_unit_test(test_row_scaled_gemm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
