/*
** test_optim.c -- hq_adam_step: the AdamW element rule against an F64 evaluation of the same
** formulas, the quantized write-back equal to a fresh quantize of the new master (every stock
** format), refusals that change nothing, and the train/eval alternation: a persistent weight
** keeps both copies when eval steps use only the rowwise one, and its columnwise copy is fresh
** after every optimizer step; hq_adam_consts_write's constants against hand-computed ones and
** hq_adam.consts_dev on the host (the step applies the slot's constants).
*/
#include <math.h>

#include "hq_test.h"

static hq_ctx *g_ctx;
static hq_plugins *g_set;

static int setup(void **s) {
  (void)s;
  if (hq_ctx_create(NULL, &g_ctx)) return -1;
  return hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &g_set);
}
static int teardown(void **s) {
  (void)s;
  hq_plugins_close(g_set);
  hq_ctx_destroy(g_ctx);
  return 0;
}

/* |a - b| within k ulps of b (float). */
static int near_ulps(double a, double b, double k) {
  double ulp = ldexp(1.0, ilogb(b == 0 ? 1e-30 : b) - 23);
  return fabs(a - b) <= k * ulp;
}

/* One step of a single element, hand-computed with constants exact in binary, so every
   intermediate is exact: g = 0.5, w = 1, m = v = 0, lr = 0.125, b1 = 0.875, b2 = 1 - 2^-10,
   eps = 0, wd = 0.25, t = 1: m = 0.125 * 0.5 = 0.0625, v = 2^-10 * 0.25 = 2^-12, c1 = 8,
   c2 = 1024, m^ = 0.5, v^ = 0.25, sqrt = 0.5, update = 0.5 / 0.5 + 0.25 = 1.25,
   w = 1 - 0.125 * 1.25 = 0.84375. */
static void test_hand_computed(void **s) {
  (void)s;
  float g = 0.5f, w = 1.0f, m = 0.0f, v = 0.0f;
  hq_tensor gt = hq_tensor_2d(&g, HQ_F32, HQ_DEVICE_HOST, 1, 1);
  hq_adam a = {sizeof a, 0.125f, 0.875f, 1.0f - 0x1p-10f, 0.0f, 0.25f, 1, NULL, NULL, 0};
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(m == 0.0625f);
  assert_true(v == 0x1p-12f);
  assert_true(w == 0.84375f);
  /* step 2 with g = -0.5: m = 0.875 * 0.0625 - 0.0625 = -0.0078125, v = (1-2^-10) 2^-12 +
     2^-12, c1 = 1 / (1 - 0.765625) = 4.266666..., the rest is rounded: check the moments */
  g = -0.5f;
  a.step = 2;
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(m == -0.0078125f);
  assert_true(v == (float)((1.0 - 0x1p-10) * 0x1p-12 + 0x1p-12));
}

/* Many elements and steps: each step equals an F64 evaluation of the rule from the previous
   FP32 state within a few ulps (the FP32 rounding of each operation). */
static void test_steps_against_f64(void **s) {
  (void)s;
  const int64_t R = 16, C = 24, n = R * C;
  float *w = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
  uint64_t seed = 5;
  for (int64_t i = 0; i < n; i++) w[i] = hq_test_normal(&seed);
  for (int64_t t = 1; t <= 5; t++) {
    hq_tensor g = hq_test_tensor(HQ_BF16, R, C, 100 + (uint64_t)t, 0.3f);
    hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, NULL, NULL, 0};
    double *ew = malloc(n * 8), *em = malloc(n * 8), *ev = malloc(n * 8), *mag = malloc(n * 8);
    for (int64_t i = 0; i < n; i++) {
      double gi = hq_load_hp(g.data, i, HQ_BF16);
      const double b1 = 0.9f, b2 = 0.95f; /* the float parameters' values */
      em[i] = b1 * m[i] + (1 - b1) * gi;
      mag[i] = fmax(fabs(b1 * m[i]), fabs((1 - b1) * gi)); /* the sum may cancel */
      ev[i] = b2 * v[i] + (1 - b2) * gi * gi;
      double mh = em[i] / (1 - pow(b1, (double)t)), vh = ev[i] / (1 - pow(b2, (double)t));
      ew[i] = w[i] - (double)1e-2f * (mh / (sqrt(vh) + (double)1e-8f) + (double)0.1f * w[i]);
    }
    HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &g, w, m, v, NULL));
    for (int64_t i = 0; i < n; i++) {
      if (fabs(m[i] - em[i]) > 4 * ldexp(1.0, ilogb(mag[i] + 1e-30) - 23) ||
          !near_ulps(v[i], ev[i], 4))
        fail_msg("step %lld element %lld: m %.9g v %.9g, expected %.9g %.9g", (long long)t,
                 (long long)i, m[i], v[i], em[i], ev[i]);
      /* the update itself is ~lr: compare w to a few ulps of w plus a relative bound on it */
      if (fabs(w[i] - ew[i]) > 1e-6 * fabs(ew[i]) + 1e-9)
        fail_msg("step %lld element %lld: w %.9g, expected %.9g", (long long)t, (long long)i,
                 w[i], ew[i]);
    }
    free(ew), free(em), free(ev), free(mag), free(g.data);
  }
  free(w), free(m), free(v);
}

static hq_quantizer *direct(const char *plugin, const char *opt) {
  const char *opts[1] = {opt};
  hq_format_spec f = {sizeof f, plugin, opt ? opts : NULL, opt ? 1u : 0u};
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(g_set, &f, &f, HQ_SOURCE_ORIGINAL, &q));
  return q;
}

static void assert_same_dir(const hq_qtensor *a, const hq_qtensor *b, uint32_t dir,
                            const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
  assert_non_null(sa);
  assert_non_null(sb);
  for (uint32_t i = 0; i < sa->nbuf; i++)
    if (memcmp(hq_storage_cbuf(sa, i)->ptr, hq_storage_cbuf(sb, i)->ptr,
               hq_storage_cbuf(sa, i)->bytes) != 0)
      fail_msg("%s: %s buffer '%s' differs from a fresh quantize of the master", what,
               dir == HQ_ROWWISE ? "rowwise" : "columnwise", hq_storage_cbuf(sa, i)->name);
}

/* The write-back equals hq_quantize of the updated master, for every stock format. */
static void test_write_back(void **s) {
  (void)s;
  const char *plugins[][2] = {{"identity", NULL},  {"fp8_tensor", NULL}, {"mxfp8", NULL},
                              {"nvfp4", "block_2d=true"}, {"fp8_block", "block=2d"}};
  const int64_t R = 128, C = 128, n = R * C;
  for (size_t p = 0; p < sizeof plugins / sizeof *plugins; p++) {
    hq_quantizer *q = direct(plugins[p][0], plugins[p][1]);
    hq_tensor w0 = hq_test_tensor(HQ_F32, R, C, 7, 0.05f);
    float *m = calloc(n, 4), *v = calloc(n, 4);
    hq_qtensor *qw = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &w0, &qw));
    for (int64_t t = 1; t <= 2; t++) {
      hq_tensor g = hq_test_tensor(HQ_F32, R, C, 30 + (uint64_t)t, 1.0f);
      hq_adam a = {sizeof a, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, t, NULL, NULL, 0};
      HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &g, w0.data, m, v, qw));
      hq_qtensor *fresh = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &w0, &fresh));
      assert_same_dir(qw, fresh, HQ_ROWWISE, plugins[p][0]);
      assert_same_dir(qw, fresh, HQ_COLWISE, plugins[p][0]);
      hq_qtensor_free(fresh);
      free(g.data);
    }
    hq_qtensor_free(qw);
    hq_quantizer_free(q);
    free(w0.data), free(m), free(v);
  }
}

/* What cannot be honoured is refused before anything changes. */
static void test_refusals(void **s) {
  (void)s;
  /* hq_device_trim: a device out of range is refused (a build without CUDA has no pool at all) */
  const int trim_bad = hq_built_with_cuda() ? HQ_EINVAL : HQ_ENOTSUP;
  assert_int_equal(hq_device_trim(-1), trim_bad);
  assert_int_equal(hq_device_trim(1 << 20), trim_bad);
  assert_true(strstr(hq_last_error(), "1048576") || !hq_built_with_cuda());
  hq_quantizer *q = direct("mxfp8", NULL);
  hq_tensor w = hq_test_tensor(HQ_F32, 64, 64, 3, 1.0f), g = hq_test_tensor(HQ_F32, 64, 64, 4, 1.0f);
  hq_tensor g2 = hq_test_tensor(HQ_F32, 64, 32, 4, 1.0f);
  float *m = calloc(64 * 64, 4), *v = calloc(64 * 64, 4), *keep = malloc(64 * 64 * 4);
  float *zero = calloc(64 * 64, 4);
  memcpy(keep, w.data, 64 * 64 * 4);
  hq_qtensor *qw = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &w, &qw));
  hq_adam a = {sizeof a, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, NULL, NULL, 0};
  assert_int_equal(hq_adam_step(g_ctx, &a, &g, NULL, m, v, qw), HQ_EINVAL);
  HQ_ERROR_HAS("master");
  assert_int_equal(hq_adam_step(g_ctx, &a, &g2, w.data, m, v, qw), HQ_ESHAPE);
  HQ_ERROR_HAS("[64, 64]");
  a.step = 0;
  assert_int_equal(hq_adam_step(g_ctx, &a, &g, w.data, m, v, qw), HQ_EINVAL);
  a.step = 1;
  a.beta2 = 1.0f;
  assert_int_equal(hq_adam_step(g_ctx, &a, &g, w.data, m, v, qw), HQ_EINVAL);
  a.beta2 = 0.999f;
  /* a saved weight cannot take the write-back: refused before the step touches master, m, v */
  hq_saved_buffer sv[8];
  size_t ns = 0;
  HQ_OK_OR_FAIL(hq_qtensor_save(qw, sv, 8, sizeof sv[0], &ns));
  assert_int_equal(hq_adam_step(g_ctx, &a, &g, w.data, m, v, qw), HQ_ESTATE);
  HQ_ERROR_HAS("hq_adam_step: the quantized weight (role (direct)) is saved");
  HQ_OK_OR_FAIL(hq_qtensor_restore(qw, sv, ns, sizeof sv[0]));
  assert_memory_equal(w.data, keep, 64 * 64 * 4);
  assert_memory_equal(m, zero, 64 * 64 * 4);
  assert_memory_equal(v, zero, 64 * 64 * 4);
  hq_qtensor_free(qw);
  hq_quantizer_free(q);
  free(w.data), free(g.data), free(g2.data), free(m), free(v), free(keep), free(zero);
}

/* hq_adam_consts_write: the constants of a step, with betas whose powers are exact (b1 = 1/2,
   b2 = 3/4): c1 = 1 / (1 - 2^-t) = 2, 4/3, 8/7 and c2 = 1 / (1 - (3/4)^t) = 4, 16/7, 64/37,
   each the float nearest the rational; exactly HQ_ADAM_CONSTS_BYTES bytes written. */
static void test_consts_write(void **s) {
  (void)s;
  assert_int_equal(HQ_ADAM_CONSTS_BYTES, sizeof(hq_adam_consts));
  const double c1[3] = {2.0, 4.0 / 3.0, 8.0 / 7.0}, c2[3] = {4.0, 16.0 / 7.0, 64.0 / 37.0};
  unsigned char buf[HQ_ADAM_CONSTS_BYTES + 8];
  for (int64_t t = 1; t <= 3; t++) {
    hq_adam a = {sizeof a, 0.125f, 0.5f, 0.75f, 0x1p-20f, 0.25f, t, NULL, NULL, 0};
    memset(buf, 0xa5, sizeof buf);
    HQ_OK_OR_FAIL(hq_adam_consts_write(&a, buf));
    for (size_t i = HQ_ADAM_CONSTS_BYTES; i < sizeof buf; i++) assert_int_equal(buf[i], 0xa5);
    hq_adam_consts k;
    memcpy(&k, buf, sizeof k);
    assert_true(k.lr == 0.125f && k.b1 == 0.5f && k.b2 == 0.75f && k.eps == 0x1p-20f);
    assert_true(k.wd == 0.25f && k.one_minus_b1 == 0.5f && k.one_minus_b2 == 0.25f);
    if (k.c1 != (float)c1[t - 1] || k.c2 != (float)c2[t - 1])
      fail_msg("step %lld: c1 %.9g c2 %.9g, expected %.9g %.9g", (long long)t, (double)k.c1,
               (double)k.c2, (double)(float)c1[t - 1], (double)(float)c2[t - 1]);
  }
  /* the oldest layout (no consts_dev) is accepted */
  hq_adam a = {HQ_ADAM_SIZE_0_1, 0.125f, 0.5f, 0.75f, 0.0f, 0.0f, 1, NULL, NULL, 0};
  HQ_OK_OR_FAIL(hq_adam_consts_write(&a, buf));
  /* refusals write nothing */
  memset(buf, 0xa5, sizeof buf);
  a.struct_size = sizeof a;
  a.step = 0;
  assert_int_equal(hq_adam_consts_write(&a, buf), HQ_EINVAL);
  HQ_ERROR_HAS("hq_adam_consts_write: step 0");
  a.step = 1;
  a.beta1 = 1.0f;
  assert_int_equal(hq_adam_consts_write(&a, buf), HQ_EINVAL);
  HQ_ERROR_HAS("beta1 = 1");
  a.beta1 = 0.5f;
  a.lr = INFINITY;
  assert_int_equal(hq_adam_consts_write(&a, buf), HQ_EINVAL);
  a.lr = 0.125f;
  a.struct_size = HQ_ADAM_SIZE_0_1 - 1;
  assert_int_equal(hq_adam_consts_write(&a, buf), HQ_EINVAL);
  HQ_ERROR_HAS("struct_size");
  a.struct_size = sizeof a;
  assert_int_equal(hq_adam_consts_write(NULL, buf), HQ_EINVAL);
  assert_int_equal(hq_adam_consts_write(&a, NULL), HQ_EINVAL);
  for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0xa5);
}

/* consts_dev on a host context: the step applies what the slot holds. The slot of the same step
   gives test_hand_computed's bits; a slot written for lr = 0.25 moves w by 0.25 * 1.25 although
   the hq_adam says 0.125 (the slot is read, not the fields). A misaligned slot is refused; an
   hq_adam of the oldest layout has no slot, whatever lies past it. */
static void test_consts_slot(void **s) {
  (void)s;
  _Alignas(16) unsigned char slot[HQ_ADAM_CONSTS_BYTES + 16];
  hq_adam a = {sizeof a, 0.125f, 0.875f, 1.0f - 0x1p-10f, 0.0f, 0.25f, 1, NULL, NULL, 0};
  HQ_OK_OR_FAIL(hq_adam_consts_write(&a, slot));
  a.consts_dev = slot;
  float g = 0.5f, w = 1.0f, m = 0.0f, v = 0.0f;
  hq_tensor gt = hq_tensor_2d(&g, HQ_F32, HQ_DEVICE_HOST, 1, 1);
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(w == 0.84375f && m == 0.0625f && v == 0x1p-12f);
  hq_adam other = a;
  other.lr = 0.25f;
  HQ_OK_OR_FAIL(hq_adam_consts_write(&other, slot));
  w = 1.0f, m = 0.0f, v = 0.0f;
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(w == 0.6875f);
  a.consts_dev = slot + 4;
  w = 1.0f;
  assert_int_equal(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL), HQ_EINVAL);
  HQ_ERROR_HAS("not 16-byte aligned");
  assert_true(w == 1.0f);
  /* amax_dev, which a host step does not use, is checked all the same: 4-byte aligned */
  a.consts_dev = slot;
  a.amax_dev = slot + 2;
  assert_int_equal(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL), HQ_EINVAL);
  HQ_ERROR_HAS("hq_adam.amax_dev");
  HQ_ERROR_HAS("not 4-byte aligned");
  assert_true(w == 1.0f);
  a.amax_dev = NULL;
  /* flags: a bit hq does not know, and HQ_ADAM_AMAX_ZEROED without a slot to be zero, are
     refused before the step writes anything; with an aligned slot the flag is taken (a host
     step ignores the slot); a caller whose hq_adam ends before flags has none (the slot's
     constants, lr = 0.25, apply) */
  m = 0.0f, v = 0.0f;
  a.flags = 2;
  assert_int_equal(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL), HQ_EINVAL);
  HQ_ERROR_HAS("hq_adam.flags = 0x2 has bits hq does not know");
  a.flags = HQ_ADAM_AMAX_ZEROED;
  assert_int_equal(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL), HQ_EINVAL);
  HQ_ERROR_HAS("HQ_ADAM_AMAX_ZEROED and hq_adam.amax_dev is NULL");
  assert_true(w == 1.0f && m == 0.0f && v == 0.0f);
  a.struct_size = offsetof(hq_adam, flags);
  a.flags = 0xffffffffu; /* past the caller's struct: not read */
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(w == 0.6875f);
  a.struct_size = sizeof a;
  a.flags = HQ_ADAM_AMAX_ZEROED;
  a.amax_dev = slot + 4;
  w = 1.0f, m = 0.0f, v = 0.0f;
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(w == 0.6875f);
  a.flags = 0;
  a.amax_dev = NULL;
  w = 1.0f;
  /* a caller of the oldest layout has no consts_dev: what lies there is not read */
  a.struct_size = HQ_ADAM_SIZE_0_1;
  m = 0.0f, v = 0.0f;
  HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &gt, &w, &m, &v, NULL));
  assert_true(w == 0.84375f);
}

/* Train steps (both copies) alternate with eval steps (the forward GEMM alone: usage rowwise).
   The weight never loses its columnwise copy, and after every optimizer step both copies equal
   a fresh quantize of the master -- also when an eval-time update refreshed only the rowwise
   copy in between. */
static void test_train_eval_alternation(void **s) {
  (void)s;
  hq_recipe *r = hq_test_recipe("[format mx]\nplugin = mxfp8\n[format nv]\nplugin = nvfp4\n"
                                "block_2d = true\n[role linear:weight:*]\nrowwise = mx\n"
                                "columnwise = nv\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:fc1");
  const int64_t R = 64, C = 128, n = R * C;
  hq_tensor w = hq_test_tensor(HQ_F32, R, C, 8, 0.05f);
  float *m = calloc(n, 4), *v = calloc(n, 4);
  hq_qtensor *qw = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &w, &qw));
  hq_tensor x = hq_test_tensor(HQ_F32, 32, C, 9, 1.0f);
  hq_tensor y = hq_test_empty(HQ_F32, 32, R);
  for (int64_t t = 1; t <= 4; t++) {
    /* train: both copies, an optimizer step with the write-back */
    HQ_OK_OR_FAIL(hq_qtensor_set_usage(qw, HQ_BOTH));
    hq_tensor g = hq_test_tensor(HQ_F32, R, C, 50 + (uint64_t)t, 1.0f);
    hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, t, NULL, NULL, 0};
    HQ_OK_OR_FAIL(hq_adam_step(g_ctx, &a, &g, w.data, m, v, qw));
    assert_int_equal(hq_qtensor_dirs(qw), HQ_BOTH);
    hq_qtensor *fresh = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &w, &fresh));
    assert_same_dir(qw, fresh, HQ_ROWWISE, "after a train step");
    assert_same_dir(qw, fresh, HQ_COLWISE, "after a train step");
    hq_qtensor_free(fresh);
    free(g.data);
    /* eval: rowwise only, the forward GEMM runs, the columnwise copy stays */
    HQ_OK_OR_FAIL(hq_qtensor_set_usage(qw, HQ_ROWWISE));
    HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_hp(&x), hq_operand_q(qw), NULL, HQ_F32, &y, NULL));
    if (t % 2 == 0) { /* an eval-time reload refreshes the rowwise copy only */
      HQ_OK_OR_FAIL(hq_qtensor_update(qw, g_ctx, &w));
    }
    assert_int_equal(hq_qtensor_dirs(qw), HQ_BOTH);
  }
  hq_qtensor_free(qw);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(w.data), free(m), free(v), free(x.data), free(y.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),     cmocka_unit_test(test_steps_against_f64),
      cmocka_unit_test(test_write_back),        cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_train_eval_alternation),
      cmocka_unit_test(test_consts_write),      cmocka_unit_test(test_consts_slot),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
