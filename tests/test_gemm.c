/*
** test_gemm.c -- hq_gemm on the host (the CPU path), against an F64 reference computed here from
** the operands' hq_dequantize outputs: high-precision operands with every transpose pair, alpha,
** beta, bias and a BF16 output; every stock format through the linear-layer helpers (fprop,
** dgrad, wgrad); mixed pairs; the hybrid-equals-single-format bit identity; the refusals
** (missing direction, k mismatch, D shape, an RHT operand against a plain one); and max |D|
** (hq_gemm_args.amax_d) against D itself.
*/
#include <math.h>

#include "hq_test.h"

static hq_ctx *g_ctx;

static int setup(void **state) {
  (void)state;
  return hq_ctx_create(NULL, &g_ctx);
}
static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(g_ctx);
  return 0;
}

/* op(X)(i, p) of a row-major [r0, r1] F32 matrix seen column-major (ld = r1). */
static double opv(const float *x, int64_t r1, int trans, int64_t i, int64_t p) {
  /* column-major element (row, col) of the stored r1 x r0 matrix is x[col * r1 + row] */
  return trans ? (double)x[i * r1 + p] : (double)x[p * r1 + i];
}

/* Check D ([n, m] row-major, dtype dd) against alpha * op(A) op(B) + beta * D0 + bias, within
   the FP32 accumulation bound (k + 4) * 2^-23 * sum |a b| (plus BF16 rounding of D). */
static void check_product(const float *A, int64_t a1, int ta, const float *B, int64_t b1, int tb,
                          int64_t m, int64_t n, int64_t k, float alpha, float beta,
                          const float *D0, const float *bias, const hq_tensor *D,
                          const char *what) {
  double worst = 0;
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) {
        double t = opv(A, a1, ta, i, p) * opv(B, b1, tb, p, j);
        s += t;
        mag += fabs(t);
      }
      double ref = alpha * s + (D0 ? beta * (double)D0[j * m + i] : 0.0) + (bias ? bias[i] : 0.0);
      double got = hq_load_hp(D->data, j * m + i, D->dtype);
      double tol = (double)(k + 4) * 0x1p-23 * (fabs(alpha) * mag + 1e-30) +
                   (D0 ? fabs(beta * D0[j * m + i]) * 0x1p-23 : 0) + (bias ? fabs(bias[i]) * 0x1p-23 : 0);
      if (D->dtype == HQ_BF16) tol += fabs(ref) * 0x1p-8;
      double err = fabs(got - ref);
      if (!(err <= tol))
        fail_msg("%s: D[%lld][%lld] = %.9g, reference %.9g (tolerance %.3g)", what, (long long)j,
                 (long long)i, got, ref, tol);
      if (tol > 0 && err / tol > worst) worst = err / tol;
    }
}

static float *f32_of(const hq_tensor *t) {
  float *o = malloc((size_t)(t->rows * t->cols) * sizeof(float) + 4);
  for (int64_t i = 0; i < t->rows * t->cols; i++) o[i] = hq_load_hp(t->data, i, t->dtype);
  return o;
}

/* High-precision operands: every transpose pair, odd shapes, alpha/beta/bias, f32 and bf16 D. */
static void test_hp_all_flags(void **state) {
  (void)state;
  const int64_t m = 5, n = 7, k = 9;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int dd = 0; dd < 2; dd++) {
        hq_tensor A = hq_test_tensor(dd ? HQ_BF16 : HQ_F32, ta ? m : k, ta ? k : m, 1 + ta, 1.0f);
        hq_tensor B = hq_test_tensor(HQ_F32, tb ? k : n, tb ? n : k, 3 + tb, 1.0f);
        hq_tensor D = hq_test_tensor(dd ? HQ_BF16 : HQ_F32, n, m, 5, 1.0f);
        float *D0 = f32_of(&D), *fa = f32_of(&A);
        float bias[5] = {0.5f, -1.0f, 2.0f, 0.25f, -0.125f};
        hq_gemm_args args = {sizeof args, 0, bias, HQ_F32, 0, "flags", NULL};
        hq_gemm_info info = {.struct_size = sizeof info};
        HQ_OK_OR_FAIL(hq_gemm(g_ctx, hq_operand_hp(&A), ta, hq_operand_hp(&B), tb, &D, 0.75f,
                              0.5f, &args, &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
        assert_int_equal(info.m, m);
        assert_int_equal(info.n, n);
        assert_int_equal(info.k, k);
        char what[64];
        snprintf(what, sizeof what, "hp ta=%d tb=%d d=%s", ta, tb, dd ? "bf16" : "f32");
        check_product(fa, A.cols, ta, B.data, B.cols, tb, m, n, k, 0.75f, 0.5f, D0, bias, &D,
                      what);
        free(D0);
        free(fa);
        free(A.data);
        free(B.data);
        free(D.data);
      }
}

/* A hand-computed product: [[1,2],[3,4]] times [[5,6],[7,8]], both as row-major tensors
   used without transposes in the column-major convention. */
static void test_hand_computed(void **state) {
  (void)state;
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, d[4] = {0};
  hq_tensor A = hq_tensor_2d(a, HQ_F32, HQ_DEVICE_HOST, 2, 2);
  hq_tensor B = hq_tensor_2d(b, HQ_F32, HQ_DEVICE_HOST, 2, 2);
  hq_tensor D = hq_tensor_2d(d, HQ_F32, HQ_DEVICE_HOST, 2, 2);
  /* column-major: A = [[1,3],[2,4]], B = [[5,7],[6,8]], A*B = [[23,31],[34,46]] -> stored
     column-major as 23, 34, 31, 46 */
  HQ_OK_OR_FAIL(hq_gemm(g_ctx, hq_operand_hp(&A), 0, hq_operand_hp(&B), 0, &D, 1.0f, 0.0f, NULL,
                        NULL));
  assert_true(d[0] == 23 && d[1] == 34 && d[2] == 31 && d[3] == 46);
  /* the linear layer: y = x W^T with x = [[1,2]], W = [[5,6],[7,8]] -> [17, 23] */
  float x[2] = {1, 2}, y[2];
  hq_tensor X = hq_tensor_2d(x, HQ_F32, HQ_DEVICE_HOST, 1, 2);
  hq_tensor Y = hq_tensor_2d(y, HQ_F32, HQ_DEVICE_HOST, 1, 2);
  float bias[2] = {100, 200};
  HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_hp(&X), hq_operand_hp(&B), bias, HQ_F32, &Y,
                                NULL));
  assert_true(y[0] == 117 && y[1] == 223);
}

static const char *k_recipe =
    "[format f8]\nplugin = fp8_tensor\n"
    "[format f8g]\nplugin = fp8_tensor\ndtype = e5m2\n"
    "[format mx]\nplugin = mxfp8\n"
    "[format mx2]\nplugin = mxfp8\n"
    "[format nv]\nplugin = nvfp4\n"
    "[format nv_rht]\nplugin = nvfp4\nrht = true\n"
    "[format nv_w]\nplugin = nvfp4\nblock_2d = true\n"
    "[format fb]\nplugin = fp8_block\n"
    "[format fb2]\nplugin = fp8_block\nblock = 2d\n"
    "[format fbx]\nplugin = fp8_block\npower_2_scales = false\n"
    "[role linear:*:identity]\nrowwise = identity\ncolumnwise = identity\n"
    "[role linear:*:fp8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:grad_output:fp8]\nrowwise = f8g\ncolumnwise = f8g\n"
    "[role linear:*:mxfp8]\nrowwise = mx\ncolumnwise = mx\n"
    "[role linear:*:mxfp8_hybrid]\nrowwise = mx\ncolumnwise = mx2\n"
    "[role linear:*:nvfp4]\nrowwise = nv\ncolumnwise = nv_rht\n"
    "[role linear:weight:nvfp4]\nrowwise = nv\ncolumnwise = nv_w\n"
    "[role linear:*:fp8_block]\nrowwise = fb\ncolumnwise = fb\n"
    "[role linear:weight:fp8_block]\nrowwise = fb2\ncolumnwise = fb2\n"
    "[role linear:*:fp8_block_np2]\nrowwise = fbx\ncolumnwise = fbx\n"
    "[role linear:*:mixed]\nrowwise = mx\ncolumnwise = nv\n"
    "[role linear:grad_output:mixed]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:weight:mixed]\nrowwise = mx\ncolumnwise = f8\n";

typedef struct layer {
  hq_qtensor *x, *w, *dy;
  hq_tensor hx, hw, hdy;
} layer;

static hq_qtensor *quant(hq_recipe *r, const char *role, const hq_tensor *src) {
  hq_quantizer *q = hq_test_quantizer(r, role);
  hq_qtensor *t = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, src, &t));
  hq_quantizer_free(q);
  return t;
}

static float *deq(const hq_qtensor *t, uint32_t dir) {
  hq_tensor o = hq_test_empty(HQ_F32, hq_qtensor_rows(t), hq_qtensor_cols(t));
  HQ_OK_OR_FAIL(hq_dequantize(t, g_ctx, dir, &o));
  return o.data;
}

static void make_layer(hq_recipe *r, const char *name, int64_t tokens, int64_t in, int64_t out,
                       layer *L) {
  char role[96];
  L->hx = hq_test_tensor(HQ_BF16, tokens, in, 11, 1.0f);
  L->hw = hq_test_tensor(HQ_BF16, out, in, 12, 0.05f);
  L->hdy = hq_test_tensor(HQ_BF16, tokens, out, 13, 0.001f);
  /* wide dynamic range inside blocks: a few large values */
  hq_store_hp(L->hx.data, 3, HQ_BF16, 300.0f);
  hq_store_hp(L->hdy.data, 70, HQ_BF16, -2.5f);
  snprintf(role, sizeof role, "linear:input:%s", name);
  L->x = quant(r, role, &L->hx);
  snprintf(role, sizeof role, "linear:weight:%s", name);
  L->w = quant(r, role, &L->hw);
  snprintf(role, sizeof role, "linear:grad_output:%s", name);
  L->dy = quant(r, role, &L->hdy);
}

static void free_layer(layer *L) {
  hq_qtensor_free(L->x);
  hq_qtensor_free(L->w);
  hq_qtensor_free(L->dy);
  free(L->hx.data);
  free(L->hw.data);
  free(L->hdy.data);
}

/* fprop, dgrad and wgrad of one layer, each against the F64 product of the dequantized copies
   that GEMM must use. Returns the three outputs (F32) for further comparisons. */
static void run_layer(const layer *L, int64_t tokens, int64_t in, int64_t out, const char *name,
                      hq_tensor *y, hq_tensor *dx, hq_tensor *dw) {
  char what[96];
  hq_gemm_info info = {.struct_size = sizeof info};
  *y = hq_test_empty(HQ_F32, tokens, out);
  *dx = hq_test_empty(HQ_F32, tokens, in);
  *dw = hq_test_empty(HQ_F32, out, in);

  HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_q(L->x), hq_operand_q(L->w), NULL, HQ_F32, y,
                                &info));
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  assert_int_equal(info.fused, 0); /* only the fused GPU path names a fused operand */
  assert_int_equal(info.dir_a, HQ_ROWWISE);
  assert_int_equal(info.dir_b, HQ_ROWWISE);
  float *w_row = deq(L->w, HQ_ROWWISE), *x_row = deq(L->x, HQ_ROWWISE);
  snprintf(what, sizeof what, "%s fprop", name);
  check_product(w_row, in, 1, x_row, in, 0, out, tokens, in, 1, 0, NULL, NULL, y, what);

  HQ_OK_OR_FAIL(hq_linear_dgrad(g_ctx, hq_operand_q(L->dy), hq_operand_q(L->w), dx, &info));
  assert_int_equal(info.dir_a, HQ_COLWISE);
  assert_int_equal(info.dir_b, HQ_ROWWISE);
  float *w_col = deq(L->w, HQ_COLWISE), *dy_row = deq(L->dy, HQ_ROWWISE);
  snprintf(what, sizeof what, "%s dgrad", name);
  check_product(w_col, in, 0, dy_row, out, 0, in, tokens, out, 1, 0, NULL, NULL, dx, what);

  HQ_OK_OR_FAIL(hq_linear_wgrad(g_ctx, hq_operand_q(L->x), hq_operand_q(L->dy), dw, 0, &info));
  assert_int_equal(info.dir_a, HQ_COLWISE);
  assert_int_equal(info.dir_b, HQ_COLWISE);
  float *x_col = deq(L->x, HQ_COLWISE), *dy_col = deq(L->dy, HQ_COLWISE);
  snprintf(what, sizeof what, "%s wgrad", name);
  /* an RHT pair multiplies in the transformed domain; its dequantized copies are transformed
     back (orthogonal: the same product up to the FP32 rounding of the inverse transform, which
     the bound's k factor covers at these sizes) */
  check_product(x_col, in, 0, dy_col, out, 1, in, out, tokens, 1, 0, NULL, NULL, dw, what);
  free(w_row);
  free(x_row);
  free(w_col);
  free(dy_row);
  free(x_col);
  free(dy_col);
}

static void test_formats_linear(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const char *names[] = {"identity", "fp8", "mxfp8", "nvfp4", "fp8_block", "fp8_block_np2",
                         "mixed"};
  const int64_t tokens = 128, in = 256, out = 128;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    layer L;
    make_layer(r, names[i], tokens, in, out, &L);
    hq_tensor y, dx, dw;
    run_layer(&L, tokens, in, out, names[i], &y, &dx, &dw);
    free(y.data);
    free(dx.data);
    free(dw.data);
    free_layer(&L);
  }
  hq_recipe_free(r);
}

/* hq_gemm_args.amax_d on the host: max |D| of the stored result, against the largest |D|
   computed here from D itself, for F32 and BF16 outputs (with beta and a bias, so the epilogue's
   terms count), high-precision and per-tensor FP8 operands; a NaN in D is ignored; a caller
   whose struct_size predates the field gets nothing written; HQ_GEMM_FAST_ACCUM, which only the
   native GPU path honours, leaves the CPU product bit for bit as it is. */
static float max_abs_of(const hq_tensor *d) {
  float m = 0.0f;
  for (int64_t i = 0; i < d->rows * d->cols; i++) {
    const float v = fabsf(hq_load_hp(d->data, i, d->dtype));
    if (v > m) m = v; /* a NaN compares false: ignored */
  }
  return m;
}

static void test_amax_d(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const int64_t m = 24, n = 40, k = 32;
  hq_tensor A = hq_test_tensor(HQ_F32, m, k, 31, 1.0f), B = hq_test_tensor(HQ_F32, n, k, 32, 1.0f);
  hq_store_hp(A.data, 5, HQ_F32, -40.0f); /* one large product, negative somewhere */
  hq_qtensor *qa = quant(r, "linear:weight:fp8", &A), *qb = quant(r, "linear:input:fp8", &B);
  float bias[24];
  for (int i = 0; i < 24; i++) bias[i] = (float)(i - 12) * 0.5f;
  for (int q = 0; q < 2; q++)
    for (int dd = 0; dd < 2; dd++) {
      hq_operand oa = q ? hq_operand_q(qa) : hq_operand_hp(&A);
      hq_operand ob = q ? hq_operand_q(qb) : hq_operand_hp(&B);
      hq_tensor D = hq_test_tensor(dd ? HQ_BF16 : HQ_F32, n, m, 33, 1.0f);
      float amax = -1.0f;
      hq_gemm_args args = HQ_GEMM_ARGS_INIT;
      args.bias = bias;
      args.bias_dtype = HQ_F32;
      args.amax_d = &amax;
      hq_gemm_info info = HQ_GEMM_INFO_INIT;
      HQ_OK_OR_FAIL(hq_gemm(g_ctx, oa, 1, ob, 0, &D, 1.5f, 0.5f, &args, &info));
      assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
      assert_int_equal(info.amax_fused, 0); /* the host has no epilogue: a pass over D */
      const float want = max_abs_of(&D);
      assert_true(want > 10.0f);
      if (amax != want)
        fail_msg("%s operands, D %s: amax_d %.9g, max |D| %.9g", q ? "fp8" : "f32",
                 dd ? "bf16" : "f32", (double)amax, (double)want);
      /* a NaN in D does not reach the amax; beta 0 leaves D's old values out */
      hq_store_hp(D.data, 7, D.dtype, NAN);
      HQ_OK_OR_FAIL(hq_gemm(g_ctx, oa, 1, ob, 0, &D, 1.0f, 0.0f, &args, &info));
      hq_store_hp(D.data, 0, D.dtype, NAN);
      const float want0 = max_abs_of(&D);
      HQ_OK_OR_FAIL(hq_gemm(g_ctx, oa, 1, ob, 0, &D, 1.0f, 1.0f, &args, &info));
      assert_true(isnan(hq_load_hp(D.data, 0, D.dtype)));
      if (!(amax >= want0 && amax == max_abs_of(&D)))
        fail_msg("with a NaN in D: amax_d %.9g, max |D| of the rest %.9g", (double)amax,
                 (double)max_abs_of(&D));
      free(D.data);
    }
  /* an older caller's struct (without amax_d): nothing written */
  hq_tensor D = hq_test_empty(HQ_F32, n, m);
  float untouched = -1.0f;
  struct {
    hq_gemm_args a;
    float *beyond; /* where amax_d lies in the new layout, outside the caller's struct_size */
  } old;
  memset(&old, 0, sizeof old);
  old.a.struct_size = (uint32_t)offsetof(hq_gemm_args, amax_d);
  old.a.amax_d = &untouched; /* past struct_size: must not be read */
  HQ_OK_OR_FAIL(hq_gemm(g_ctx, hq_operand_q(qa), 1, hq_operand_q(qb), 0, &D, 1.0f, 0.0f, &old.a,
                        NULL));
  assert_true(untouched == -1.0f);
  /* HQ_GEMM_FAST_ACCUM: the CPU path computes the same bytes */
  hq_tensor D2 = hq_test_empty(HQ_F32, n, m);
  hq_gemm_args fast = HQ_GEMM_ARGS_INIT;
  fast.flags = HQ_GEMM_FAST_ACCUM;
  HQ_OK_OR_FAIL(hq_gemm(g_ctx, hq_operand_q(qa), 1, hq_operand_q(qb), 0, &D2, 1.0f, 0.0f, &fast,
                        NULL));
  assert_memory_equal(D.data, D2.data, (size_t)(n * m) * 4);
  free(D.data);
  free(D2.data);
  hq_qtensor_free(qa);
  hq_qtensor_free(qb);
  free(A.data);
  free(B.data);
  hq_recipe_free(r);
}

/* A hybrid whose two directions are two instances of one format configuration multiplies
   bit-identically to the single-instance quantizer, for all three GEMMs. */
static void test_hybrid_equal_bitwise(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const int64_t tokens = 128, in = 256, out = 128;
  layer A, B;
  make_layer(r, "mxfp8", tokens, in, out, &A);
  make_layer(r, "mxfp8_hybrid", tokens, in, out, &B);
  hq_tensor y1, dx1, dw1, y2, dx2, dw2;
  run_layer(&A, tokens, in, out, "single", &y1, &dx1, &dw1);
  run_layer(&B, tokens, in, out, "hybrid", &y2, &dx2, &dw2);
  assert_memory_equal(y1.data, y2.data, (size_t)(tokens * out) * 4);
  assert_memory_equal(dx1.data, dx2.data, (size_t)(tokens * in) * 4);
  assert_memory_equal(dw1.data, dw2.data, (size_t)(out * in) * 4);
  free(y1.data), free(dx1.data), free(dw1.data), free(y2.data), free(dx2.data), free(dw2.data);
  free_layer(&A);
  free_layer(&B);
  hq_recipe_free(r);
}

/* A quantized operand against a high-precision one, and beta accumulation (wgrad accumulate). */
static void test_mixed_hp_and_accumulate(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const int64_t tokens = 64, in = 128, out = 64;
  hq_tensor w = hq_test_tensor(HQ_F32, out, in, 21, 0.1f), x = hq_test_tensor(HQ_F32, tokens, in, 22, 1.0f);
  hq_qtensor *qw = quant(r, "linear:weight:fp8", &w);
  hq_tensor y = hq_test_empty(HQ_BF16, tokens, out);
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_hp(&x), hq_operand_q(qw), NULL, HQ_F32, &y, &info));
  assert_string_equal(info.format_a, "fp8_tensor");
  assert_string_equal(info.format_b, "f32");
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  assert_string_equal(info.reason, "a high-precision operand");
  float *w_row = deq(qw, HQ_ROWWISE);
  check_product(w_row, in, 1, x.data, in, 0, out, tokens, in, 1, 0, NULL, NULL, &y, "fp8 x f32");
  /* wgrad accumulate: dW = dW0 + dy^T x */
  hq_tensor dy = hq_test_tensor(HQ_F32, tokens, out, 23, 1.0f);
  hq_tensor dw = hq_test_tensor(HQ_F32, out, in, 24, 1.0f);
  float *dw0 = f32_of(&dw);
  HQ_OK_OR_FAIL(hq_linear_wgrad(g_ctx, hq_operand_hp(&x), hq_operand_hp(&dy), &dw, 1, NULL));
  check_product(x.data, in, 0, dy.data, out, 1, in, out, tokens, 1, 1, dw0, NULL, &dw, "accumulate");
  free(dw0);
  free(w_row);
  free(dw.data), free(dy.data), free(w.data), free(x.data), free(y.data);
  hq_qtensor_free(qw);
  hq_recipe_free(r);
}

static void test_refusals(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const int64_t tokens = 128, in = 256, out = 128;
  layer L;
  make_layer(r, "nvfp4", tokens, in, out, &L);
  hq_tensor y = hq_test_empty(HQ_F32, tokens, out), dw = hq_test_empty(HQ_F32, out, in);

  /* a weight quantized for inference only (rowwise): dgrad needs its columnwise copy */
  HQ_OK_OR_FAIL(hq_qtensor_drop(L.w, HQ_COLWISE));
  hq_tensor dx = hq_test_empty(HQ_F32, tokens, in);
  assert_int_equal(hq_linear_dgrad(g_ctx, hq_operand_q(L.dy), hq_operand_q(L.w), &dx, NULL),
                   HQ_ESTATE);
  HQ_ERROR_HAS("linear:weight:nvfp4");
  HQ_ERROR_HAS("columnwise");
  /* fprop still works from the rowwise copy */
  HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, hq_operand_q(L.x), hq_operand_q(L.w), NULL, HQ_F32, &y, NULL));

  /* D of the wrong shape */
  hq_tensor bad = hq_test_empty(HQ_F32, tokens, in);
  assert_int_equal(hq_linear_fprop(g_ctx, hq_operand_q(L.x), hq_operand_q(L.w), NULL, HQ_F32,
                                   &bad, NULL), HQ_ESHAPE);
  HQ_ERROR_HAS("[n, m]");
  /* k mismatch: x [tokens, in] against dy [tokens, out] in fprop position */
  assert_int_equal(hq_gemm(g_ctx, hq_operand_q(L.dy), 1, hq_operand_q(L.x), 0, &y, 1, 0, NULL,
                           NULL), HQ_ESHAPE);
  HQ_ERROR_HAS("do not agree on k");
  /* RHT columnwise x against a plain columnwise copy: the transforms differ along k */
  hq_tensor hdy = hq_test_tensor(HQ_BF16, tokens, out, 31, 0.01f);
  hq_qtensor *plain = quant(r, "linear:grad_output:mixed", &hdy); /* nv (no rht) both ways */
  int rc = hq_linear_wgrad(g_ctx, hq_operand_q(L.x), hq_operand_q(plain), &dw, 0, NULL);
  if (hq_qtensor_storage(L.x, HQ_COLWISE)->desc.transform == HQ_TRANSFORM_RHT16) {
    assert_int_equal(rc, HQ_EINVAL);
    HQ_ERROR_HAS("transform");
    HQ_ERROR_HAS("rht16");
  }
  /* both operands of one kind: exactly one of qt / hp */
  hq_operand none = {NULL, NULL};
  assert_int_equal(hq_gemm(g_ctx, none, 0, hq_operand_q(L.x), 0, &y, 1, 0, NULL, NULL), HQ_EINVAL);
  /* plan without D, and the path names */
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gemm_plan(g_ctx, hq_operand_q(L.w), 1, hq_operand_q(L.x), 0, NULL, NULL, &info));
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  assert_string_equal(hq_gemm_path_name(HQ_GEMM_PATH_EMULATED_BF16), "emulated-bf16");
  assert_string_equal(hq_gemm_path_name(HQ_GEMM_PATH_NATIVE), "native");
  hq_qtensor_free(plain);
  free(hdy.data), free(y.data), free(dw.data), free(dx.data), free(bad.data);
  free_layer(&L);
  hq_recipe_free(r);
}


/* Mixture of experts: one token tensor split into experts (one of them empty), single-format and
   hybrid quantizers mixed, a grouped fprop equal, bit for bit, to one hq_linear_fprop per expert,
   and to the F64 reference. */
static void test_grouped(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(k_recipe);
  const int64_t in = 128, out = 64, splits[3] = {64, 0, 128}, tokens = 192;
  const char *names[3] = {"mxfp8", "fp8", "mixed"};
  hq_quantizer *qs[3];
  hq_qtensor *w[3], *xs[3];
  hq_tensor hw[3], y[3], *yp[3];
  char role[64];
  for (int e = 0; e < 3; e++) {
    snprintf(role, sizeof role, "linear:input:%s", names[e]);
    qs[e] = hq_test_quantizer(r, role);
    snprintf(role, sizeof role, "linear:weight:%s", names[e]);
    hw[e] = hq_test_tensor(HQ_F32, out, in, 40 + e, 0.1f);
    w[e] = quant(r, role, &hw[e]);
    y[e] = hq_test_empty(HQ_F32, splits[e], out);
    yp[e] = &y[e];
  }
  hq_tensor x = hq_test_tensor(HQ_BF16, tokens, in, 50, 1.0f);
  HQ_OK_OR_FAIL(hq_quantize_split(qs, 3, g_ctx, &x, splits, xs));
  assert_non_null(xs[0]);
  assert_null(xs[1]);
  assert_non_null(xs[2]);
  assert_int_equal(hq_qtensor_rows(xs[2]), 128);
  assert_string_equal(hq_qtensor_format(xs[2], HQ_COLWISE), "nv");
  hq_operand A[3], B[3];
  for (int e = 0; e < 3; e++) {
    A[e] = hq_operand_q(w[e]);
    B[e] = xs[e] ? hq_operand_q(xs[e]) : (hq_operand){NULL, NULL};
  }
  hq_gemm_info infos[3];
  for (int e = 0; e < 3; e++) infos[e].struct_size = sizeof infos[0];
  HQ_OK_OR_FAIL(hq_grouped_gemm(g_ctx, 3, A, 1, B, 0, yp, 1.0f, 0.0f, NULL, infos));
  assert_int_equal(infos[1].path, HQ_GEMM_PATH_NONE);
  assert_int_equal(infos[2].path, HQ_GEMM_PATH_CPU);
  for (int e = 0; e < 3; e += 2) {
    hq_tensor y1 = hq_test_empty(HQ_F32, splits[e], out);
    HQ_OK_OR_FAIL(hq_linear_fprop(g_ctx, B[e], A[e], NULL, HQ_F32, &y1, NULL));
    assert_memory_equal(y1.data, y[e].data, (size_t)(splits[e] * out) * 4);
    float *wr = deq(w[e], HQ_ROWWISE), *xr = deq(xs[e], HQ_ROWWISE);
    check_product(wr, in, 1, xr, in, 0, out, splits[e], in, 1, 0, NULL, NULL, &y[e], names[e]);
    free(wr), free(xr), free(y1.data);
  }
  /* splits that do not add up, or a negative one */
  hq_qtensor *bad[3];
  const int64_t short_splits[3] = {64, 0, 64}, neg[3] = {256, -64, 0};
  assert_int_equal(hq_quantize_split(qs, 3, g_ctx, &x, short_splits, bad), HQ_ESHAPE);
  HQ_ERROR_HAS("sum to 128");
  assert_null(bad[0]);
  assert_int_equal(hq_quantize_split(qs, 3, g_ctx, &x, neg, bad), HQ_ESHAPE);
  /* an empty group with a non-empty D */
  hq_tensor wrong = hq_test_empty(HQ_F32, 4, out);
  yp[1] = &wrong;
  assert_int_equal(hq_grouped_gemm(g_ctx, 3, A, 1, B, 0, yp, 1.0f, 0.0f, NULL, NULL), HQ_ESHAPE);
  HQ_ERROR_HAS("group 1");
  free(wrong.data);
  hq_qtensors_free(xs, 3);
  for (int e = 0; e < 3; e++) {
    hq_qtensor_free(w[e]);
    hq_quantizer_free(qs[e]);
    free(hw[e].data);
    free(y[e].data);
  }
  free(x.data);
  hq_recipe_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),
      cmocka_unit_test(test_hp_all_flags),
      cmocka_unit_test(test_formats_linear),
      cmocka_unit_test(test_hybrid_equal_bitwise),
      cmocka_unit_test(test_mixed_hp_and_accumulate),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_grouped),
      cmocka_unit_test(test_amax_d),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
