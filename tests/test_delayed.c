/*
** test_delayed.c -- delayed scaling (fp8_tensor scaling = delayed; docs/formats.md 3.5) and the
** scaling state it lives in (hq_state, hq/hq.h):
**   - the update rule against hand-computed histories: roll order, a zero amax skips the roll,
**     max vs most_recent, margin, a tiny amax gives FLT_MAX, Inf and NaN amaxes keep the scale,
**     the initial scale 1, history length 1;
**   - quantize over several steps equals FP8 quantization (tests/fp8_ref.h) with the scale
**     computed by hand from the previous steps' amaxes; the amax of every quantize and update of
**     a step max-accumulates into the slice; a checkpointed state resumes identically;
**   - many quantizers share ONE buffer: slices do not overlap, the amaxes are contiguous (0..n),
**     each group is contiguous, a rebuilt quantizer gets its slice back, a bind after the first
**     use grows the buffer and keeps every value;
**   - delayed scaling as the rowwise direction of a hybrid with mxfp8 columnwise, and as the
**     columnwise one: the mxfp8 copy is that of an mxfp8-only quantizer, the FP8 copy follows its
**     own history;
**   - a quantizer bound to no state: HQ_ESTATE naming the role (and the module refuses a direct
**     call without a slice);
**   - recipe options: ranges, choices, the refused mixtures, defaults, the shipped example.
*/
#include <float.h>
#include <math.h>

#include "hq_test.h"
#include "fp8_ref.h"

static hq_ctx *ctx;

static int setup(void **state) {
  (void)state;
  return hq_ctx_create(NULL, &ctx) == HQ_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(ctx);
  return 0;
}

static hq_quantizer *bound(hq_recipe *r, const char *role_text, hq_state *st) {
  char buf[256];
  hq_role role;
  hq_quantizer *q = NULL;
  if (hq_role_parse(role_text, buf, sizeof buf, &role)) fail_msg("%s", hq_last_error());
  if (hq_quantizer_create_ex(r, &role, st, &q)) fail_msg("%s", hq_last_error());
  return q;
}

static hq_state_slice slice_of(const hq_quantizer *q, uint32_t dir) {
  hq_state_slice s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  HQ_OK_OR_FAIL(hq_quantizer_state_slice(q, dir, &s));
  return s;
}

static float *state_data(hq_state *st, size_t *n) {
  float *p = NULL;
  size_t k = 0;
  HQ_OK_OR_FAIL(hq_state_data(st, &p, &k));
  if (n) *n = k;
  return p;
}

static float *state_amaxes(hq_state *st, size_t *n) {
  float *p = NULL;
  size_t k = 0;
  HQ_OK_OR_FAIL(hq_state_amaxes(st, &p, &k));
  if (n) *n = k;
  return p;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float fbits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* Two floats equal bit for bit (NaN: any NaN). */
static void assert_same(float got, float want, const char *what, int step) {
  if (isnan(want) ? !isnan(got) : bits(got) != bits(want))
    fail_msg("%s, step %d: got %a (%g), want %a (%g)", what, step, got, got, want, want);
}

// --- the update rule ----------------------------------------------------------------------------

/* One slice: write its amax, update the whole state, check scale, history rows 1..L-1 and that
   the amax is 0 again. */
typedef struct step {
  float last;
  float scale;
  float rows[4]; /* rows 1 .. L-1 */
} step;

static void run_steps(hq_state *st, const hq_quantizer *q, int L, const step *s, int n,
                      const char *what) {
  for (int t = 0; t < n; t++) {
    hq_state_slice sl = slice_of(q, HQ_ROWWISE);
    assert_int_equal(sl.floats, (size_t)L);
    float *amax = state_amaxes(st, NULL);
    amax[sl.amax_index] = s[t].last;
    HQ_OK_OR_FAIL(hq_state_update(st, ctx));
    float *d = state_data(st, NULL);
    assert_same(d[sl.offset], s[t].scale, what, t + 1);
    for (int i = 1; i < L; i++)
      assert_same(d[sl.offset + (size_t)i], s[t].rows[i - 1], what, t + 1);
    assert_same(amax[sl.amax_index], s[t].last == 0.0f ? s[t].last : 0.0f, what, t + 1);
  }
}

static void test_update_rule(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format mx4]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 4\n"
      "[format mr4]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 4\n"
      "amax_compute_algo = most_recent\n"
      "[format g1]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 1\nmargin = 3\n"
      "[format t2]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 2\n"
      "[format n3]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 3\n"
      "[format e5]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\namax_history_len = 2\n"
      "margin = 1\n"
      "[role *:*:max]\nrowwise = mx4\ncolumnwise = mx4\n"
      "[role *:*:recent]\nrowwise = mr4\ncolumnwise = mr4\n"
      "[role *:*:margin]\nrowwise = g1\ncolumnwise = g1\n"
      "[role *:*:tiny]\nrowwise = t2\ncolumnwise = t2\n"
      "[role *:*:nan]\nrowwise = n3\ncolumnwise = n3\n"
      "[role *:*:e5]\nrowwise = e5\ncolumnwise = e5\n");
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_quantizer *qmax = bound(r, "a:b:max", st), *qrec = bound(r, "a:b:recent", st);
  hq_quantizer *qmar = bound(r, "a:b:margin", st), *qtiny = bound(r, "a:b:tiny", st);
  hq_quantizer *qnan = bound(r, "a:b:nan", st), *qe5 = bound(r, "a:b:e5", st);
  assert_int_equal(hq_state_slice_count(st), 6);
  /* the initial state: scale 1, history 0, amax 0 */
  size_t n = 0, na = 0;
  float *d = state_data(st, &n), *a = state_amaxes(st, &na);
  assert_ptr_equal(d, a); /* the amaxes come first */
  assert_int_equal(na, 6);
  assert_int_equal(n, 6 + 4 + 4 + 1 + 2 + 3 + 2);
  const hq_quantizer *all[6] = {qmax, qrec, qmar, qtiny, qnan, qe5};
  for (int k = 0; k < 6; k++) {
    hq_state_slice sl = slice_of(all[k], HQ_COLWISE);
    assert_int_equal(sl.dirs, HQ_BOTH); /* a fused quantizer: one slice for both directions */
    assert_int_equal(slice_of(all[k], HQ_ROWWISE).amax_index, sl.amax_index);
    assert_same(a[sl.amax_index], 0.0f, "initial amax", 0);
    assert_same(d[sl.offset], 1.0f, "initial scale", 0);
    for (size_t i = 1; i < sl.floats; i++) assert_same(d[sl.offset + i], 0.0f, "initial row", 0);
  }
  const float inf = INFINITY, qnan_v = NAN;
  /* max over the window (rows 1..3 and the newest); row 3 is the newest */
  const step smax[] = {
      {2.0f, 224.0f, {0, 0, 2}},
      {8.0f, 56.0f, {0, 2, 8}},
      {0.0f, 56.0f, {0, 2, 8}}, /* zero amax: no roll, scale kept */
      {1.0f, 56.0f, {2, 8, 1}},
      {0.5f, 56.0f, {8, 1, 0.5f}},
      {0.25f, 56.0f, {1, 0.5f, 0.25f}}, /* 8 is still in the window (row 1 before the roll) */
      {0.125f, 448.0f, {0.5f, 0.25f, 0.125f}},
      {3.0f, 448.0f / 3.0f, {0.25f, 0.125f, 3}},
  };
  run_steps(st, qmax, 4, smax, (int)(sizeof smax / sizeof smax[0]), "max L=4");
  /* most_recent: the newest amax alone; NaN keeps the scale (and still rolls in) */
  const step srec[] = {
      {2.0f, 224.0f, {0, 0, 2}},       {8.0f, 56.0f, {0, 2, 8}},       {0.0f, 56.0f, {0, 2, 8}},
      {1.0f, 448.0f, {2, 8, 1}},       {0.0f, 448.0f, {2, 8, 1}},      {7.0f, 64.0f, {8, 1, 7}},
      {qnan_v, 64.0f, {1, 7, qnan_v}}, {inf, 64.0f, {7, qnan_v, inf}},
  };
  run_steps(st, qrec, 4, srec, (int)(sizeof srec / sizeof srec[0]), "most_recent L=4");
  /* margin 3: scaled_max = 448 / 8 = 56; history length 1: the state is the scale alone */
  const step smar[] = {{7.0f, 8.0f, {0}},  {0.0f, 8.0f, {0}},     {0.5f, 112.0f, {0}},
                       {inf, 112.0f, {0}}, {qnan_v, 112.0f, {0}}, {112.0f, 0.5f, {0}}};
  run_steps(st, qmar, 1, smar, (int)(sizeof smar / sizeof smar[0]), "margin 3, L=1");
  /* a tiny amax: 448 / 2^-143 overflows -> FLT_MAX; an Inf amax keeps the scale for as long as
     it is in the window */
  const float tiny = fbits(0x00000040u); /* 2^-143, subnormal */
  const step stiny[] = {
      {tiny, FLT_MAX, {tiny}}, {inf, FLT_MAX, {inf}}, {4.0f, FLT_MAX, {4}}, {4.0f, 112.0f, {4}}};
  run_steps(st, qtiny, 2, stiny, (int)(sizeof stiny / sizeof stiny[0]), "tiny/Inf L=2");
  /* NaN with max: it rolls in, and the max ignores it */
  const step snan[] = {{2.0f, 224.0f, {0, 2}},      {qnan_v, 224.0f, {2, qnan_v}},
                       {4.0f, 112.0f, {qnan_v, 4}}, {1.0f, 112.0f, {4, 1}},
                       {0.5f, 112.0f, {1, 0.5f}},   {0.25f, 448.0f, {0.5f, 0.25f}}};
  run_steps(st, qnan, 3, snan, (int)(sizeof snan / sizeof snan[0]), "NaN L=3");
  /* E5M2, margin 1: scaled_max = 28672 */
  const step se5[] = {
      {7.0f, 28672.0f / 7.0f, {7}}, {2.0f, 28672.0f / 7.0f, {2}}, {1.0f, 14336.0f, {1}}};
  run_steps(st, qe5, 2, se5, (int)(sizeof se5 / sizeof se5[0]), "e5m2 margin 1");
  for (int k = 0; k < 6; k++) hq_quantizer_free((hq_quantizer *)all[k]);
  hq_state_free(st);
  hq_recipe_free(r);
}

// --- quantize over steps ------------------------------------------------------------------------

static float tensor_amax(const hq_tensor *x) {
  float m = 0.0f;
  for (int64_t i = 0; i < x->rows * x->cols; i++) {
    float v = fabsf(hq_load_hp(x->data, i, x->dtype));
    if (v > m) m = v;
  }
  return m;
}

/* Direction dir of qt is x quantized with `scale` (FP8 kind 0 = E4M3, 1 = E5M2), scale_inv =
   RN(1/scale), amax buffer = the tensor's amax. */
static void check_fp8(const hq_qtensor *qt, uint32_t dir, const hq_tensor *x, float scale, int kind,
                      const char *what, int step) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  assert_non_null(s);
  const uint8_t *q = hq_storage_cbuf(s, 0)->ptr;
  const float si = *(const float *)hq_storage_cbuf(s, 1)->ptr;
  const float am = *(const float *)hq_storage_cbuf(s, 2)->ptr;
  const int64_t M = x->rows, K = x->cols;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++) {
      const float p = hq_load_hp(x->data, i * K + j, x->dtype) * scale;
      const unsigned want = ref_fp8_encode((double)p, kind);
      const unsigned got = q[dir == HQ_ROWWISE ? i * K + j : j * M + i];
      if (got != want)
        fail_msg("%s, step %d, %s [%lld, %lld]: code %02x, want %02x (scale %g)", what, step,
                 dir == HQ_ROWWISE ? "rowwise" : "columnwise", (long long)i, (long long)j, got,
                 want, scale);
    }
  assert_same(si, 1.0f / scale, "scale_inv", step);
  assert_same(am, tensor_amax(x), "storage amax", step);
}

/* The scale the next step uses, by hand: scaled_max over the max of the last L non-zero step
   amaxes (a zero step amax never enters the history and keeps the scale). */
static float next_scale(const float *hist, int n, int L, float scaled_max, float prev) {
  float m = 0.0f;
  for (int i = n - L < 0 ? 0 : n - L; i < n; i++) m = hist[i] > m ? hist[i] : m;
  return m > 0.0f ? scaled_max / m : prev;
}

static void test_quantize_steps(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format d]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 3\n"
      "[format g]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\namax_history_len = 2\n"
      "[role linear:*:*]\nrowwise = d\ncolumnwise = d\n"
      "[role linear:grad_output:*]\nrowwise = g\ncolumnwise = g\n");
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_quantizer *qw = bound(r, "linear:weight:fc1", st);
  hq_quantizer *qg = bound(r, "linear:grad_output:fc1", st);
  assert_false(hq_quantizer_requant_safe(qw)); /* the scale moves between steps */
  assert_int_equal(hq_quantizer_amax_kind(qw, HQ_ROWWISE), HQ_AMAX_NONE);
  hq_qtensor *w = NULL; /* a persistent weight refreshed by hq_qtensor_update every step */
  HQ_OK_OR_FAIL(hq_make_empty(qw, ctx, 24, 40, HQ_F32, &w));
  const float factors[] = {1.0f, 10.0f, 0.1f, 100.0f, 2.0f, 0.5f, 0.05f};
  const int steps = (int)(sizeof factors / sizeof factors[0]);
  float hist_w[16], hist_g[16], scale_w = 1.0f, scale_g = 1.0f;
  float *saved = NULL;
  size_t nsaved = 0;
  float saved_w = 0, saved_g = 0;
  for (int t = 0; t < steps; t++) {
    hq_tensor x = hq_test_tensor(HQ_F32, 24, 40, 100 + (uint64_t)t, factors[t]);
    hq_tensor y = hq_test_tensor(HQ_BF16, 17, 9, 200 + (uint64_t)t, factors[t] * 0.5f);
    hq_tensor g = hq_test_tensor(HQ_BF16, 33, 70, 300 + (uint64_t)t, factors[steps - 1 - t]);
    hq_qtensor *qx = NULL, *qy = NULL, *qgr = NULL;
    HQ_OK_OR_FAIL(hq_quantize(qw, ctx, &x, &qx));
    HQ_OK_OR_FAIL(hq_quantize(qw, ctx, &y, &qy));
    HQ_OK_OR_FAIL(hq_qtensor_update(w, ctx, &x));
    HQ_OK_OR_FAIL(hq_quantize(qg, ctx, &g, &qgr));
    check_fp8(qx, HQ_ROWWISE, &x, scale_w, 0, "weight", t + 1);
    check_fp8(qx, HQ_COLWISE, &x, scale_w, 0, "weight", t + 1);
    check_fp8(qy, HQ_ROWWISE, &y, scale_w, 0, "second tensor", t + 1);
    check_fp8(w, HQ_ROWWISE, &x, scale_w, 0, "updated weight", t + 1);
    check_fp8(w, HQ_COLWISE, &x, scale_w, 0, "updated weight", t + 1);
    check_fp8(qgr, HQ_ROWWISE, &g, scale_g, 1, "gradient", t + 1);
    check_fp8(qgr, HQ_COLWISE, &g, scale_g, 1, "gradient", t + 1);
    /* the step's amax: the max over every quantize and update of the slice */
    const float step_w = fmaxf(tensor_amax(&x), tensor_amax(&y)), step_g = tensor_amax(&g);
    float *amax = state_amaxes(st, NULL);
    assert_same(amax[slice_of(qw, HQ_ROWWISE).amax_index], step_w, "step amax", t + 1);
    assert_same(amax[slice_of(qg, HQ_ROWWISE).amax_index], step_g, "step amax", t + 1);
    HQ_OK_OR_FAIL(hq_state_update(st, ctx));
    hist_w[t] = step_w;
    hist_g[t] = step_g;
    scale_w = next_scale(hist_w, t + 1, 3, 448.0f, scale_w);
    scale_g = next_scale(hist_g, t + 1, 2, 57344.0f, scale_g);
    float *d = state_data(st, &nsaved);
    assert_same(d[slice_of(qw, HQ_ROWWISE).offset], scale_w, "state scale", t + 1);
    assert_same(d[slice_of(qg, HQ_ROWWISE).offset], scale_g, "state scale", t + 1);
    if (t == 2) { /* checkpoint the whole state after step 3 */
      saved = malloc(nsaved * sizeof *saved);
      memcpy(saved, d, nsaved * sizeof *saved);
      saved_w = scale_w;
      saved_g = scale_g;
    }
    hq_qtensor_free(qx);
    hq_qtensor_free(qy);
    hq_qtensor_free(qgr);
    free(x.data);
    free(y.data);
    free(g.data);
  }
  /* resume from the checkpoint in a fresh state with rebuilt quantizers: step 4 again */
  hq_state *st2 = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st2));
  hq_quantizer *qw2 = bound(r, "linear:weight:fc1", st2),
               *qg2 = bound(r, "linear:grad_output:fc1", st2);
  size_t n2 = 0;
  float *d2 = state_data(st2, &n2);
  assert_int_equal(n2, nsaved);
  memcpy(d2, saved, nsaved * sizeof *saved);
  hq_tensor x = hq_test_tensor(HQ_F32, 24, 40, 103, factors[3]);
  hq_qtensor *qx = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qw2, ctx, &x, &qx));
  check_fp8(qx, HQ_ROWWISE, &x, saved_w, 0, "resumed", 4);
  hq_tensor g = hq_test_tensor(HQ_BF16, 33, 70, 303, factors[steps - 1 - 3]);
  hq_qtensor *qgr = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qg2, ctx, &g, &qgr));
  check_fp8(qgr, HQ_ROWWISE, &g, saved_g, 1, "resumed gradient", 4);
  hq_qtensor_free(qgr);
  free(g.data);
  hq_qtensor_free(qx);
  free(x.data);
  free(saved);
  hq_quantizer_free(qw2);
  hq_quantizer_free(qg2);
  hq_state_free(st2);
  hq_qtensor_free(w);
  hq_quantizer_free(qw);
  hq_quantizer_free(qg);
  hq_state_free(st);
  hq_recipe_free(r);
}

// --- one buffer for many quantizers -------------------------------------------------------------

typedef struct ref {
  const hq_quantizer *q;
  uint32_t dir;
} ref;

static void test_shared_buffer(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format d4]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 4\n"
      "[format d8]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\namax_history_len = 8\n"
      "[format cur]\nplugin = fp8_tensor\n"
      "[role *:*:a?]\nrowwise = d4\ncolumnwise = d4\n"
      "[role *:*:b]\nrowwise = d8\ncolumnwise = d8\n"
      "[role *:*:c]\nrowwise = d4\ncolumnwise = d8\n"
      "[role *:*:d]\nrowwise = d4\ncolumnwise = mxfp8\n"
      "[role *:*:e]\nrowwise = cur\ncolumnwise = cur\n"
      "[role *:*:f]\nrowwise = d4\ncolumnwise = d4\ncolumnwise_source = rowwise_dequantized\n");
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  /* interleaved binds: the layout still groups each (instance, directions) */
  hq_quantizer *qa1 = bound(r, "m:t:a1", st), *qc = bound(r, "m:t:c", st);
  hq_quantizer *qb = bound(r, "m:t:b", st), *qa2 = bound(r, "m:t:a2", st);
  hq_quantizer *qd = bound(r, "m:t:d", st), *qe = bound(r, "m:t:e", st);
  hq_quantizer *qf = bound(r, "m:t:f", st), *qa3 = bound(r, "m:t:a3", st);
  /* slices: a1 a2 a3 (d4, both), c (d4 row, d8 col), b (d8, both), d (d4 row), f (d4 row,
     d4 col), e none */
  assert_int_equal(hq_state_slice_count(st), 9);
  hq_state_slice sl;
  sl.struct_size = sizeof sl;
  assert_int_equal(hq_quantizer_state_slice(qe, HQ_ROWWISE, &sl), HQ_ENOENT);
  assert_int_equal(hq_quantizer_state_slice(qd, HQ_COLWISE, &sl), HQ_ENOENT); /* mxfp8 */
  const ref refs[] = {{qa1, HQ_ROWWISE}, {qa2, HQ_ROWWISE}, {qa3, HQ_ROWWISE},
                      {qc, HQ_ROWWISE},  {qc, HQ_COLWISE},  {qb, HQ_ROWWISE},
                      {qd, HQ_ROWWISE},  {qf, HQ_ROWWISE},  {qf, HQ_COLWISE}};
  const size_t nref = sizeof refs / sizeof refs[0];
  const size_t floats[] = {4, 4, 4, 4, 8, 8, 4, 4, 4};
  const uint32_t sdirs[] = {HQ_BOTH, HQ_BOTH,    HQ_BOTH,    HQ_ROWWISE, HQ_COLWISE,
                            HQ_BOTH, HQ_ROWWISE, HQ_ROWWISE, HQ_COLWISE};
  size_t total = 0, na = 0;
  float *data = state_data(st, &total);
  float *amax = state_amaxes(st, &na);
  assert_int_equal(na, nref);
  assert_ptr_equal(data, amax);
  assert_int_equal(total, nref + 44);
  hq_state_slice s[16];
  int seen[16] = {0};
  for (size_t k = 0; k < nref; k++) {
    s[k] = slice_of(refs[k].q, refs[k].dir);
    assert_int_equal(s[k].floats, floats[k]);
    assert_int_equal(s[k].dirs, sdirs[k]);
    assert_true(s[k].amax_index < nref);
    assert_false(seen[s[k].amax_index]); /* one amax per slice: contiguous 0 .. n-1 */
    seen[s[k].amax_index] = 1;
    assert_true(s[k].offset >= nref && s[k].offset + s[k].floats <= total);
    for (size_t j = 0; j < k; j++) /* states do not overlap */
      assert_true(s[k].offset + s[k].floats <= s[j].offset ||
                  s[j].offset + s[j].floats <= s[k].offset);
    assert_same(data[s[k].offset], 1.0f, "initial scale", 0);
  }
  /* a group is contiguous: a1, a2, a3 (bound in that order) sit side by side */
  assert_int_equal(s[1].amax_index, s[0].amax_index + 1);
  assert_int_equal(s[2].amax_index, s[0].amax_index + 2);
  assert_int_equal(s[1].offset, s[0].offset + 4);
  assert_int_equal(s[2].offset, s[0].offset + 8);
  /* a fused quantizer's two directions are one slice */
  assert_int_equal(slice_of(qa1, HQ_COLWISE).offset, s[0].offset);
  /* a rebuilt quantizer of the same role gets its slice back */
  hq_quantizer *again = bound(r, "m:t:a2", st);
  assert_int_equal(hq_state_slice_count(st), 9);
  assert_int_equal(slice_of(again, HQ_ROWWISE).offset, s[1].offset);
  /* each quantize lands in its own slice only: tensor k is filled with k + 1 */
  const hq_quantizer *qs[] = {qa1, qa2, qa3, qc, qb, qd, qf};
  for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
    hq_tensor x = hq_test_empty(HQ_F32, 64, 64);
    for (int64_t i = 0; i < 64 * 64; i++) ((float *)x.data)[i] = (float)(k + 1) * (i % 2 ? 1 : -1);
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize((hq_quantizer *)qs[k], ctx, &x, &qt));
    hq_qtensor_free(qt);
    free(x.data);
  }
  const float want[] = {1, 2, 3, 4, 4, 5, 6, 7, 7};
  for (size_t k = 0; k < nref; k++) assert_same(amax[s[k].amax_index], want[k], "amax", 0);
  /* a bind after the first use grows the buffer; every value moves with its slice */
  hq_quantizer *qa4 = bound(r, "m:t:a4", st);
  assert_int_equal(hq_state_slice_count(st), nref + 1);
  amax = state_amaxes(st, &na);
  data = state_data(st, &total);
  assert_int_equal(na, nref + 1);
  assert_int_equal(total, nref + 1 + 48);
  for (size_t k = 0; k < nref; k++) {
    s[k] = slice_of(refs[k].q, refs[k].dir);
    assert_same(amax[s[k].amax_index], want[k], "amax after growth", 0);
  }
  hq_state_slice s4 = slice_of(qa4, HQ_ROWWISE);
  assert_int_equal(s4.amax_index, s[2].amax_index + 1); /* appended to its group */
  assert_same(amax[s4.amax_index], 0.0f, "new amax", 0);
  assert_same(data[s4.offset], 1.0f, "new scale", 0);
  /* one update for all: scale = scaled_max / amax per slice */
  HQ_OK_OR_FAIL(hq_state_update(st, ctx));
  for (size_t k = 0; k < nref; k++) {
    const float smax = s[k].floats == 8 ? 57344.0f : 448.0f;
    assert_same(data[s[k].offset], smax / want[k], "updated scale", 1);
    assert_same(amax[s[k].amax_index], 0.0f, "amax reset", 1);
  }
  assert_same(data[s4.offset], 1.0f, "no amax: scale kept", 1);
  hq_quantizer *free_list[] = {qa1, qa2, qa3, qa4, qb, qc, qd, qe, qf, again};
  for (size_t k = 0; k < sizeof free_list / sizeof free_list[0]; k++)
    hq_quantizer_free(free_list[k]);
  hq_state_free(st);
  hq_recipe_free(r);
}

// --- hybrids ------------------------------------------------------------------------------------

/* Every buffer of direction dir of a equals b's. */
static void same_dir(const hq_qtensor *a, const hq_qtensor *b, uint32_t dir, const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
  assert_non_null(sa);
  assert_non_null(sb);
  assert_int_equal(sa->nbuf, sb->nbuf);
  for (uint32_t i = 0; i < sa->nbuf; i++) {
    const hq_buffer *x = hq_storage_cbuf(sa, i), *y = hq_storage_cbuf(sb, i);
    assert_int_equal(x->bytes, y->bytes);
    if (memcmp(x->ptr, y->ptr, x->bytes) != 0) fail_msg("%s: buffer '%s' differs", what, x->name);
  }
}

static void test_hybrid(void **state) {
  (void)state;
  hq_recipe *r =
      hq_test_recipe("[format d]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 2\n"
                     "[format e]\nplugin = fp8_tensor\ndtype = e5m2\nscaling = delayed\n"
                     "amax_compute_algo = most_recent\n"
                     "[role *:*:rowd]\nrowwise = d\ncolumnwise = mxfp8\n"
                     "[role *:*:cold]\nrowwise = mxfp8\ncolumnwise = e\n"
                     "[role *:*:mx]\nrowwise = mxfp8\ncolumnwise = mxfp8\n");
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_quantizer *qr = bound(r, "a:b:rowd", st), *qc = bound(r, "a:b:cold", st);
  hq_quantizer *qm = hq_test_quantizer(r, "a:b:mx");
  assert_false(hq_quantizer_fused(qr));
  assert_int_equal(hq_state_slice_count(st), 2);
  assert_int_equal(slice_of(qr, HQ_ROWWISE).dirs, HQ_ROWWISE);
  assert_int_equal(slice_of(qc, HQ_COLWISE).dirs, HQ_COLWISE);
  assert_int_equal(hq_quantizer_amax_kind(qr, HQ_ROWWISE), HQ_AMAX_NONE);
  assert_int_equal(hq_quantizer_amax_kind(qc, HQ_ROWWISE), HQ_AMAX_NONE); /* mxfp8 */
  assert_false(hq_quantizer_requant_safe(qr));
  assert_false(hq_quantizer_requant_safe(qc));
  float scale_r = 1.0f, scale_c = 1.0f, hist_r[8];
  const float factors[] = {1.0f, 30.0f, 0.01f, 4.0f};
  for (int t = 0; t < 4; t++) {
    hq_tensor x = hq_test_tensor(HQ_BF16, 64, 96, 500 + (uint64_t)t, factors[t]);
    hq_qtensor *hr = NULL, *hc = NULL, *hm = NULL;
    HQ_OK_OR_FAIL(hq_quantize(qr, ctx, &x, &hr));
    HQ_OK_OR_FAIL(hq_quantize(qc, ctx, &x, &hc));
    HQ_OK_OR_FAIL(hq_quantize(qm, ctx, &x, &hm));
    check_fp8(hr, HQ_ROWWISE, &x, scale_r, 0, "delayed rowwise", t + 1);
    check_fp8(hc, HQ_COLWISE, &x, scale_c, 1, "delayed columnwise", t + 1);
    same_dir(hr, hm, HQ_COLWISE, "mxfp8 columnwise beside delayed rowwise");
    same_dir(hc, hm, HQ_ROWWISE, "mxfp8 rowwise beside delayed columnwise");
    /* a columnwise-only refresh of the hybrid keeps using the columnwise slice */
    HQ_OK_OR_FAIL(hq_qtensor_set_usage(hc, HQ_COLWISE));
    HQ_OK_OR_FAIL(hq_qtensor_update(hc, ctx, &x));
    check_fp8(hc, HQ_COLWISE, &x, scale_c, 1, "delayed columnwise update", t + 1);
    HQ_OK_OR_FAIL(hq_state_update(st, ctx));
    hist_r[t] = tensor_amax(&x);
    scale_r = next_scale(hist_r, t + 1, 2, 448.0f, scale_r);
    scale_c = 57344.0f / tensor_amax(&x);
    hq_qtensor_free(hr);
    hq_qtensor_free(hc);
    hq_qtensor_free(hm);
    free(x.data);
  }
  hq_quantizer_free(qr);
  hq_quantizer_free(qc);
  hq_quantizer_free(qm);
  hq_state_free(st);
  hq_recipe_free(r);
}

// --- a quantizer without its state --------------------------------------------------------------

static void test_unbound(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format d]\nplugin = fp8_tensor\nscaling = delayed\n"
      "[role linear:*:*]\nrowwise = d\ncolumnwise = d\n"
      "[role linear:input:*]\nrowwise = fp8_tensor\ncolumnwise = d\n"
      "[role linear:grad_output:*]\nrowwise = fp8_tensor\ncolumnwise = fp8_tensor\n");
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 1, 1.0f);
  hq_qtensor *qt = NULL;
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:fc1");
  assert_int_equal(hq_quantize(q, ctx, &x, &qt), HQ_ESTATE);
  assert_null(qt);
  HQ_ERROR_HAS("role linear:weight:fc1");
  HQ_ERROR_HAS("hq_state");
  hq_state_slice sl;
  sl.struct_size = sizeof sl;
  assert_int_equal(hq_quantizer_state_slice(q, HQ_ROWWISE, &sl), HQ_ENOENT);
  HQ_ERROR_HAS("not bound");
  /* an empty tensor can be made, not refreshed */
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 8, 16, HQ_F32, &qt));
  assert_int_equal(hq_qtensor_update(qt, ctx, &x), HQ_ESTATE);
  HQ_ERROR_HAS("role linear:weight:fc1");
  hq_qtensor_free(qt);
  qt = NULL;
  /* the delayed direction is named in a hybrid */
  hq_quantizer *qi = hq_test_quantizer(r, "linear:input:fc1");
  assert_int_equal(hq_quantize(qi, ctx, &x, &qt), HQ_ESTATE);
  HQ_ERROR_HAS("role linear:input:fc1, columnwise format 'd'");
  /* a stateless quantizer needs no state */
  hq_quantizer *qg = hq_test_quantizer(r, "linear:grad_output:fc1");
  HQ_OK_OR_FAIL(hq_quantize(qg, ctx, &x, &qt));
  hq_qtensor_free(qt);
  /* binding: once is enough, again is a no-op, another state is refused */
  hq_state *st = NULL, *other = NULL;
  HQ_OK_OR_FAIL(hq_state_create(NULL, ctx, &st));
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &other));
  HQ_OK_OR_FAIL(hq_quantizer_bind_state(q, st));
  HQ_OK_OR_FAIL(hq_quantizer_bind_state(q, st));
  assert_int_equal(hq_quantizer_bind_state(q, other), HQ_ESTATE);
  HQ_ERROR_HAS("already bound");
  HQ_OK_OR_FAIL(hq_quantizer_bind_state(qg, st)); /* no slice, no error */
  assert_int_equal(hq_quantizer_state_slice(qg, HQ_ROWWISE, &sl), HQ_ENOENT);
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_qtensor_free(qt);
  /* a qtensor keeps its quantizer's binding (and the state) after both are freed */
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 8, 16, HQ_F32, &qt));
  hq_quantizer_free(q);
  hq_state_free(st);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  hq_qtensor_free(qt);
  /* a direct quantizer with delayed scaling: refused unbound, fine once bound */
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  const char *opts[] = {"scaling=delayed", "amax_history_len=8"};
  hq_format_spec spec = {sizeof spec, "fp8_tensor", opts, 2};
  hq_quantizer *qd = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, &spec, HQ_SOURCE_ORIGINAL, &qd));
  assert_int_equal(hq_quantize(qd, ctx, &x, &qt), HQ_ESTATE);
  HQ_ERROR_HAS("role (direct)");
  HQ_OK_OR_FAIL(hq_quantizer_bind_state(qd, other));
  assert_int_equal(slice_of(qd, HQ_ROWWISE).floats, 8);
  HQ_OK_OR_FAIL(hq_quantize(qd, ctx, &x, &qt));
  hq_qtensor_free(qt);
  hq_quantizer_free(qd);
  hq_plugins_close(set);
  /* create_ex with no state is create */
  char buf[64];
  hq_role role;
  HQ_OK_OR_FAIL(hq_role_parse("linear:weight:fc2", buf, sizeof buf, &role));
  HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, NULL, &q));
  assert_int_equal(hq_quantize(q, ctx, &x, &qt), HQ_ESTATE);
  hq_quantizer_free(q);
  hq_quantizer_free(qi);
  hq_quantizer_free(qg);
  hq_state_free(other);
  free(x.data);
  hq_recipe_free(r);
}

/* The module itself: a quantize without a slice is HQ_ESTATE; update_state of a current-scaling
   instance is refused; the state of a slice is L floats (scale 1, zeros). */
static void test_module_direct(void **state) {
  (void)state;
  hq_host_api host = hq_test_host();
  const hq_format_ops *ops = hq_test_module_entry("fp8_tensor")(&host);
  assert_non_null(ops);
  assert_true(ops->struct_size >= HQ_FORMAT_OPS_SIZE_2_1);
  assert_non_null(ops->state_floats);
  assert_non_null(ops->update_state);
  /* dtype, power_2_scales, amax_epsilon, scaling, amax_history_len, amax_compute_algo, margin */
  hq_optval cur[7], del[7];
  memset(cur, 0, sizeof cur);
  cur[4].i = 1024;
  memcpy(del, cur, sizeof del);
  del[3].i = 1;
  del[4].i = 5;
  uint8_t ccfg[256] = {0}, dcfg[256] = {0};
  assert_true(ops->config_size <= sizeof ccfg);
  assert_int_equal(ops->configure(ccfg, cur, &host), HQ_OK);
  assert_int_equal(ops->configure(dcfg, del, &host), HQ_OK);
  assert_int_equal(ops->state_floats(ccfg, HQ_BOTH), 0);
  assert_int_equal(ops->state_floats(dcfg, HQ_ROWWISE), 5);
  float init[5] = {-1, -1, -1, -1, -1};
  ops->init_state(dcfg, HQ_BOTH, init);
  assert_same(init[0], 1.0f, "init scale", 0);
  for (int i = 1; i < 5; i++) assert_same(init[i], 0.0f, "init row", 0);
  assert_int_equal(ops->instance_caps(dcfg) & HQ_CAP_REQUANT_SAFE, 0);
  assert_true(ops->instance_caps(ccfg) & HQ_CAP_REQUANT_SAFE);
  /* the fused optimizer step: delayed scaling on a CUDA build only (current scaling needs the
     new master's amax first) */
  assert_int_equal(ops->instance_caps(ccfg) & HQ_CAP_FUSED_ADAM, 0);
  assert_int_equal(!!(ops->instance_caps(dcfg) & HQ_CAP_FUSED_ADAM), hq_built_with_cuda());
  assert_int_equal(ops->instance_caps(ccfg) & HQ_CAP_ADAM_KDEV, 0);
  assert_int_equal(!!(ops->instance_caps(dcfg) & HQ_CAP_ADAM_KDEV), hq_built_with_cuda());
  hq_call call = hq_test_call(&host, 0, 0);
  float amax = 3.0f;
  assert_int_equal(ops->update_state(ccfg, &call, HQ_BOTH, 1, &amax, init), HQ_EINVAL);
  assert_int_equal(ops->update_state(dcfg, &call, HQ_BOTH, 1, &amax, init), HQ_OK);
  assert_same(init[0], 448.0f / 3.0f, "direct update", 1);
  assert_same(init[4], 3.0f, "direct update row 4", 1);
  assert_same(amax, 0.0f, "direct update amax", 1);
  /* quantize with no slice */
  hq_storage row;
  hq_test_storage_init(&row, HQ_ROWWISE, 2, 2, HQ_F32);
  assert_int_equal(ops->layout(dcfg, &host, 2, 2, HQ_ROWWISE, HQ_ROWWISE, &row), HQ_OK);
  uint8_t data[4];
  float si, am;
  hq_storage_buf(&row, 0)->ptr = data;
  hq_storage_buf(&row, 1)->ptr = &si;
  hq_storage_buf(&row, 2)->ptr = &am;
  float xv[4] = {1, -2, 3, 0.5f};
  hq_tensor x = hq_tensor_2d(xv, HQ_F32, HQ_DEVICE_HOST, 2, 2);
  assert_int_equal(ops->quantize(dcfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_ESTATE);
  if (!strstr(hq_test_module_error(), "hq_state"))
    fail_msg("module error '%s' lacks hq_state", hq_test_module_error());
  /* with a slice: the state's scale, and the amax accumulated */
  float st[5] = {2.0f, 0, 0, 0, 0}, acc = 1.0f;
  call.state = st;
  call.state_amax = &acc;
  assert_int_equal(ops->quantize(dcfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_OK);
  assert_same(si, 0.5f, "scale_inv", 1);
  assert_same(am, 3.0f, "storage amax", 1);
  assert_same(acc, 3.0f, "slice amax", 1);
  assert_int_equal(data[1], ref_fp8_encode(-4.0, 0));
  /* a larger accumulated amax stays */
  acc = 10.0f;
  assert_int_equal(ops->quantize(dcfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_OK);
  assert_same(acc, 10.0f, "slice amax kept", 1);
  /* the fused optimizer step comes with an update on a CUDA device: on the host it is refused,
     naming it, and nothing is written (master, moments, bytes, amaxes) */
  float g4[4] = {1, 1, 1, 1}, m4[4] = {0}, v4[4] = {0};
  hq_adam_pass pass = hq_test_adam_pass(g4, m4, v4);
  hq_call ac = call;
  ac.flags = HQ_CALL_UPDATE;
  ac.adam = &pass;
  const uint8_t before = data[1];
  hq_test_module_error()[0] = 0;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(ops->quantize(k ? ccfg : dcfg, &ac, &x, HQ_ROWWISE, &row, NULL), HQ_EINVAL);
    if (!strstr(hq_test_module_error(), "fused optimizer step"))
      fail_msg("module error '%s' lacks the fused step", hq_test_module_error());
  }
  assert_int_equal(data[1], before);
  assert_true(xv[1] == -2.0f && m4[0] == 0.0f && v4[0] == 0.0f && acc == 10.0f);
}

// --- recipes ------------------------------------------------------------------------------------

static void expect_recipe_error(const char *text, int line, const char *needle) {
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "d.ini", &o, &r));
  if (hq_recipe_error_count(r) != 1)
    fail_msg("%zu errors for:\n%s", hq_recipe_error_count(r), text);
  char at[32];
  snprintf(at, sizeof at, "d.ini:%d: ", line);
  const char *e = hq_recipe_error(r, 0);
  if (!strstr(e, at) || !strstr(e, needle)) fail_msg("error '%s' lacks '%s' / '%s'", e, at, needle);
  hq_recipe_free(r);
}

static void test_recipe(void **state) {
  (void)state;
  const char *h = "[format d]\nplugin = fp8_tensor\n";
  char text[512];
  struct {
    const char *lines;
    int line;
    const char *needle;
  } bad[] = {
      {"scaling = delayed\namax_history_len = 0\n", 4, "0 is out of range [1, 1024]"},
      {"scaling = delayed\namax_history_len = 1025\n", 4, "1025 is out of range [1, 1024]"},
      {"scaling = delayed\nmargin = -1\n", 4, "-1 is out of range [0, 126]"},
      {"scaling = delayed\nmargin = 127\n", 4, "127 is out of range [0, 126]"},
      {"scaling = delayed\namax_compute_algo = mean\n", 4, "not one of max|most_recent"},
      {"scaling = late\n", 3, "not one of current|delayed"},
      {"scaling = delayed\npower_2_scales = true\n", 1,
       "power_2_scales applies to scaling = current only"},
      {"scaling = delayed\namax_epsilon = 1\n", 1, "amax_epsilon applies to scaling = current"},
      {"margin = 2\n", 1, "margin applies to scaling = delayed only"},
      {"amax_history_len = 16\n", 1, "amax_history_len applies to scaling = delayed only"},
      {"scaling = current\namax_compute_algo = most_recent\n", 1,
       "amax_compute_algo applies to scaling = delayed only"},
      {"scaling = delayed\nreduce_amax = true\n", 4, "unknown option 'reduce_amax'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(text, sizeof text, "%s%s", h, bad[i].lines);
    expect_recipe_error(text, bad[i].line, bad[i].needle);
  }
  /* valid: delayed as either direction of a hybrid (the upstream system refuses it there) */
  hq_recipe *r =
      hq_test_recipe("[format d]\nplugin = fp8_tensor\nscaling = delayed\n"
                     "[format dm]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 16\n"
                     "amax_compute_algo = most_recent\nmargin = 2\n"
                     "[role linear:weight:*]\nrowwise = d\ncolumnwise = mxfp8\n"
                     "[role linear:input:*]\nrowwise = nvfp4\ncolumnwise = dm\n");
  int found = 0;
  for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
    hq_format_info fi = {.struct_size = sizeof fi};
    HQ_OK_OR_FAIL(hq_recipe_format_info(r, i, &fi));
    if (strcmp(fi.name, "d") != 0) continue;
    found = 1;
    const char *names[] = {"dtype",   "power_2_scales",   "amax_epsilon",
                           "scaling", "amax_history_len", "amax_compute_algo",
                           "margin"};
    const char *vals[] = {"e4m3", "false", "0", "delayed", "1024", "max", "0"};
    assert_int_equal(fi.n_options, 7);
    for (size_t k = 0; k < 7; k++) {
      assert_string_equal(fi.option_names[k], names[k]);
      assert_string_equal(fi.option_values[k], vals[k]);
    }
  }
  assert_true(found);
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_quantizer *qw = bound(r, "linear:weight:fc1", st), *qi = bound(r, "linear:input:fc1", st);
  assert_int_equal(slice_of(qw, HQ_ROWWISE).floats, 1024);
  assert_int_equal(slice_of(qi, HQ_COLWISE).floats, 16);
  hq_quantizer_free(qw);
  hq_quantizer_free(qi);
  hq_state_free(st);
  hq_recipe_free(r);
  /* a recipe with errors makes no state */
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
  HQ_OK_OR_FAIL(
      hq_recipe_parse_string("[format d]\nplugin = fp8_tensor\nmargin = 9\n", "e.ini", &o, &r));
  assert_int_equal(hq_state_create(r, ctx, &st), HQ_EPARSE);
  assert_null(st);
  hq_recipe_free(r);
  /* the shipped example */
  const char *conf = getenv("HQ_CONF_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/examples/fp8_delayed.ini", conf ? conf : "conf");
  HQ_OK_OR_FAIL(hq_recipe_load(path, &o, &r));
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_quantizer *qx = bound(r, "linear:input:fc1", st), *qg = bound(r, "linear:grad_output:fc1", st);
  hq_quantizer *qh = bound(r, "linear:weight:lm_head", st);
  assert_int_equal(hq_state_slice_count(st), 2); /* lm_head stays in high precision */
  assert_int_equal(slice_of(qx, HQ_ROWWISE).floats, 1024);
  hq_tensor x = hq_test_tensor(HQ_BF16, 16, 32, 9, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qg, ctx, &x, &qt));
  check_fp8(qt, HQ_ROWWISE, &x, 1.0f, 1, "example e5m2, first step", 1);
  hq_qtensor_free(qt);
  free(x.data);
  hq_quantizer_free(qx);
  hq_quantizer_free(qg);
  hq_quantizer_free(qh);
  hq_state_free(st);
  hq_recipe_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_update_rule),   cmocka_unit_test(test_quantize_steps),
      cmocka_unit_test(test_shared_buffer), cmocka_unit_test(test_hybrid),
      cmocka_unit_test(test_unbound),       cmocka_unit_test(test_module_direct),
      cmocka_unit_test(test_recipe),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
