/*
** test_gpu_gemm.c -- hq_gemm on a CUDA device, through the public API (hq_gemm, hq_linear_*,
** hq_gemm_plan):
**   - every stock format pair (identity bf16 / f32, fp8_tensor e4m3 / e5m2 combinations, mxfp8,
**     nvfp4 with and without RHT on both wgrad operands, fp8_block 1-D / 2-D combinations and
**     non-power-of-two scales, mixed pairs mxfp8 x nvfp4, fp8_tensor x identity, nvfp4 x
**     fp8_tensor and x the test module fp8_tensor_nofold, whose factor is not folded) in the three
**     GEMMs of a linear layer: the result equals an F64 reference of the product of the
**     operands' hq_dequantize outputs (quantized and dequantized on the host: the same bytes as
**     the device's, which tests/test_gpu_<format> check), within a bound derived from k;
**   - the path reported (on sm_90: native for the fp8_tensor and fp8_block pairs cuBLASLt runs,
**     identity's native cuBLASLt GEMM, emulated-bf16 / emulated-f32 for everything else, with a
**     reason); an emulated result equals the host (CPU) path's closely; a native result equals
**     the forced emulated one (HQ_GEMM_FORCE_EMULATED) within the two paths' bounds; the
**     linear-layer helpers give the bytes of the equivalent hq_gemm;
**   - bias (f32 and bf16), beta accumulation, bf16 and f32 D, and beta = 0 never reading D (it
**     holds NaN);
**   - a hybrid recipe whose two directions are equal configurations gives D bit-identical to the
**     single-format recipe, for fprop, dgrad and wgrad, native and emulated;
**   - F32 x F32 really is FP32 (a product TF32 would round is exact);
**   - odd shapes for identity and fp8_tensor with every transpose pair;
**   - refusals: a missing direction (HQ_ESTATE), shapes (HQ_ESHAPE), an RHT copy against a plain
**     one (HQ_EINVAL).
**
** Bounds (per element, S = sum_p |a_ip b_pj| of the dequantized operands, times |alpha|):
**   FP32 accumulation (emulated paths, identity, the CPU path): (k + 4) * 2^-23 * S -- the raw
**   operands are exact in the GEMM's input type, the per-tensor factors and the dequantize
**   roundings add a few units of 2^-24;
**   native FP8 on Hopper: its tensor cores accumulate FP8 products with about 14 significant
**   bits (over all of k with fast accumulation, within each block of k with the split
**   accumulator), so sqrt(k) * 2^-13 * S on top of the FP32 bound;
**   a BF16 D adds |D| * 2^-8, beta and the bias one FP32 rounding of their terms.
** Exits 77 (skipped) when no CUDA device is present or the build has no CUDA. HQ_TEST_QUICK=1
** (under compute-sanitizer) runs fewer formats.
*/
#include <math.h>

#include "hq_gpu_test.h"
#include "nvfp4_rules.h"

static hq_ctx *cpu, *gpu;
static int g_arch, g_quick;

static int setup(void **state) {
  (void)state;
  if (hq_gpu_contexts(&cpu, &gpu, 0)) return -1;
  char name[128];
  if (hq_device_info(0, name, sizeof name, &g_arch)) return -1;
  g_quick = getenv("HQ_TEST_QUICK") != NULL;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(cpu);
  hq_ctx_destroy(gpu);
  return 0;
}

// --- memory ------------------------------------------------------------------------------------

static size_t tbytes(const hq_tensor *t) {
  return (size_t)(t->rows * t->cols) * hq_dtype_size(t->dtype);
}

/* A device copy of a host tensor (free with hq_ctx_free(gpu, .data)). */
static hq_tensor to_gpu(const hq_tensor *h) {
  hq_tensor g = *h;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, tbytes(h), &g.data));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, g.data, hq_ctx_device(gpu), h->data, HQ_DEVICE_HOST, tbytes(h)));
  g.device = hq_ctx_device(gpu);
  return g;
}

/* A host copy of a device tensor (free with free(.data)). */
static hq_tensor to_host(const hq_tensor *g) {
  hq_tensor h = hq_test_empty(g->dtype, g->rows, g->cols);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, h.data, HQ_DEVICE_HOST, g->data, hq_ctx_device(gpu), tbytes(g)));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  return h;
}

static void *bytes_to_gpu(const void *h, size_t n) {
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, n, &p));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, p, hq_ctx_device(gpu), h, HQ_DEVICE_HOST, n));
  return p;
}

static float *f32_of(const hq_tensor *t) {
  float *o = malloc((size_t)(t->rows * t->cols) * sizeof(float) + 4);
  for (int64_t i = 0; i < t->rows * t->cols; i++) o[i] = hq_load_hp(t->data, i, t->dtype);
  return o;
}

// --- the reference and the bounds ----------------------------------------------------------------

/* op(X)(i, p) of a row-major [x0, x1] matrix read column-major (ld = x1). */
static double opv(const float *x, int64_t x1, int trans, int64_t i, int64_t p) {
  return trans ? (double)x[i * x1 + p] : (double)x[p * x1 + i];
}

static double acc_bound(int64_t k) { return (double)(k + 4) * 0x1p-23; }
/* Hopper's FP8 tensor cores accumulate inside an MMA at reduced precision even with the split
   accumulator: an H100 reached 1.16 x sqrt(k) 2^-13 S at k = 128 (a wgrad): twice that bound. */
static double fp8_bound(int64_t k) { return sqrt((double)k) * 0x1p-12 + acc_bound(k); }

/* One GEMM to check. */
typedef struct gcase {
  const char *what;
  hq_operand ag, bg;        /* the operands on the device */
  hq_operand ac, bc;        /* the same operands on the host (the CPU path) */
  int ta, tb;
  const float *af, *bf;     /* their dequantized copies (host F32, row-major [x0, x1]) */
  int64_t a1, b1, m, n, k;
  hq_dtype ddt;             /* D's dtype */
  float alpha, beta;
  hq_dtype bias_dt;         /* 0: no bias */
  uint32_t path;            /* the expected path (0: do not check; another arch) */
  int fp8_native;           /* native FP8 tensor-core accumulation (the looser bound) */
  uint8_t *out;             /* when set: receives the device D's bytes (n * m elements) */
  const char *provider;     /* when set: the provider expected to run it */
  int vs_forced;            /* compare with the forced emulated path even when not native */
  int rht16;                /* both operands hold 16-point RHTs along k (the GEMM multiplies
                               the transformed values; af and bf are transformed back) */
} gcase;

/* Max over D of |x - y| / (coef * S + extra), where x is D and y the reference (or a second
   result when y2 is set); fails with the first element beyond 1. */
typedef struct refdata {
  double *ref, *mag, *extra; /* the F64 value, S * |alpha|, the rounding of beta*D0 and bias */
} refdata;

static void reference(const gcase *c, const float *d0, const float *bias, refdata *r) {
  size_t nd = (size_t)(c->m * c->n);
  r->ref = malloc(nd * sizeof(double));
  r->mag = malloc(nd * sizeof(double));
  r->extra = malloc(nd * sizeof(double));
  for (int64_t j = 0; j < c->n; j++)
    for (int64_t i = 0; i < c->m; i++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < c->k; p++) {
        double t = opv(c->af, c->a1, c->ta, i, p) * opv(c->bf, c->b1, c->tb, p, j);
        s += t;
        mag += fabs(t);
      }
      if (c->rht16) {
        /* the GEMM accumulates products of transformed values, each at most a quarter of its
           16-group's sum of magnitudes: S_rht <= sum over groups of (sum |a|) (sum |b|), which
           can exceed S of the values transformed back by orders of magnitude (an outlier
           spreads over its group while its neighbours quantize to 0) */
        double g = 0;
        for (int64_t p0 = 0; p0 < c->k; p0 += 16) {
          double sa = 0, sb = 0;
          for (int64_t p = p0; p < p0 + 16 && p < c->k; p++) {
            sa += fabs(opv(c->af, c->a1, c->ta, i, p));
            sb += fabs(opv(c->bf, c->b1, c->tb, p, j));
          }
          g += sa * sb;
        }
        if (g > mag) mag = g;
      }
      size_t e = (size_t)(j * c->m + i);
      double bd = c->beta != 0 ? (double)c->beta * d0[e] : 0.0, bi = bias ? bias[i] : 0.0;
      r->ref[e] = (double)c->alpha * s + bd + bi;
      r->mag[e] = fabs((double)c->alpha) * mag + 1e-30;
      r->extra[e] = (fabs(bd) + fabs(bi)) * 0x1p-23;
    }
}

static void refdata_free(refdata *r) {
  free(r->ref);
  free(r->mag);
  free(r->extra);
}

/* |x - y| <= coef * S + nextra * extra + (bf16 ? nbf * |ref| * 2^-8 : 0) everywhere; y NULL:
   the reference. Returns the worst ratio. */
static double within(const char *what, const char *against, const hq_tensor *x, const hq_tensor *y,
                     const refdata *r, double coef, double nextra, double nbf) {
  double worst = 0;
  for (int64_t e = 0; e < x->rows * x->cols; e++) {
    double xv = hq_load_hp(x->data, e, x->dtype);
    double yv = y ? hq_load_hp(y->data, e, y->dtype) : r->ref[e];
    double tol = coef * r->mag[e] + nextra * r->extra[e];
    if (x->dtype == HQ_BF16 || (y && y->dtype == HQ_BF16)) tol += nbf * fabs(r->ref[e]) * 0x1p-8;
    double err = fabs(xv - yv);
    if (!(err <= tol))
      fail_msg("%s: D[%lld][%lld] = %.9g, %s %.9g (reference %.9g): error %.3g > bound %.3g",
               what, (long long)(e / x->cols), (long long)(e % x->cols), xv, against, yv,
               r->ref[e], err, tol);
    if (err / tol > worst) worst = err / tol;
  }
  return worst;
}

/* A D of n x m (row-major [n, m]) of dtype dt on the host: random values when beta != 0, NaN
   otherwise (beta = 0 must not read D). */
static hq_tensor make_d0(hq_dtype dt, int64_t n, int64_t m, float beta, uint64_t seed) {
  hq_tensor d = beta != 0 ? hq_test_tensor(dt, n, m, seed, 1.0f) : hq_test_empty(dt, n, m);
  if (beta == 0)
    for (int64_t i = 0; i < n * m; i++) hq_store_hp(d.data, i, dt, NAN);
  return d;
}

static void args_init(hq_gemm_args *a, const void *bias, hq_dtype bt, const char *what) {
  memset(a, 0, sizeof *a);
  a->struct_size = sizeof *a;
  a->bias = bias;
  a->bias_dtype = bt;
  a->what = what;
}

/* Run one GEMM on the device and check it: against the reference, the path, and against the
   CPU path (emulated) or the forced emulated path (native). */
static void run_case(gcase *c) {
  const int64_t m = c->m, n = c->n;
  hq_tensor d0 = make_d0(c->ddt, n, m, c->beta, (uint64_t)(m * 131 + n));
  float *d0f = f32_of(&d0);
  float *bias = NULL;
  void *bias_h = NULL, *bias_d = NULL;
  if (c->bias_dt) {
    hq_tensor b = hq_test_tensor(c->bias_dt, 1, m, 77, 2.0f);
    bias_h = b.data;
    bias = f32_of(&b);
    bias_d = bytes_to_gpu(bias_h, tbytes(&b));
  }
  refdata r;
  reference(c, d0f, bias, &r);

  /* the device */
  hq_tensor dg = to_gpu(&d0);
  hq_gemm_args args;
  args_init(&args, bias_d, c->bias_dt, c->what);
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gemm(gpu, c->ag, c->ta, c->bg, c->tb, &dg, c->alpha, c->beta, &args, &info));
  if (c->path && !hq_gpu_path_ok(info.path, c->path))
    fail_msg("%s: path %s, expected %s (reason: %s)", c->what, hq_gemm_path_name(info.path),
             hq_gemm_path_name(c->path), info.reason);
  if (c->provider) assert_string_equal(info.provider, c->provider);
  assert_int_equal(info.m, m);
  assert_int_equal(info.n, n);
  assert_int_equal(info.k, c->k);
  if (info.path == HQ_GEMM_PATH_NATIVE) assert_string_equal(info.reason, "");
  else assert_true(info.reason[0] != 0);
  /* the plan says the same without running */
  hq_gemm_info pinfo = {.struct_size = sizeof pinfo};
  HQ_OK_OR_FAIL(hq_gemm_plan(gpu, c->ag, c->ta, c->bg, c->tb, &dg, &args, &pinfo));
  assert_int_equal(pinfo.path, info.path);
  hq_tensor dh = to_host(&dg);
  const int native_fp8 = info.path == HQ_GEMM_PATH_NATIVE && c->fp8_native;
  const double coef = native_fp8 ? fp8_bound(c->k) : acc_bound(c->k);
  char what[256];
  snprintf(what, sizeof what, "%s (%s, D %s%s%s)", c->what, hq_gemm_path_name(info.path),
           hq_dtype_name(c->ddt), c->bias_dt ? ", bias " : "",
           c->bias_dt ? hq_dtype_name(c->bias_dt) : "");
  within(what, "reference", &dh, NULL, &r, coef, 1, 1);
  if (c->out) memcpy(c->out, dh.data, tbytes(&dh));

  if (info.path == HQ_GEMM_PATH_NATIVE || c->vs_forced) {
    /* the forced emulated path on the device agrees within both bounds */
    hq_tensor de = to_gpu(&d0);
    args.flags = HQ_GEMM_FORCE_EMULATED;
    hq_gemm_info einfo = {.struct_size = sizeof einfo};
    HQ_OK_OR_FAIL(hq_gemm(gpu, c->ag, c->ta, c->bg, c->tb, &de, c->alpha, c->beta, &args, &einfo));
    assert_true(einfo.path == HQ_GEMM_PATH_EMULATED_BF16 || einfo.path == HQ_GEMM_PATH_EMULATED_F32);
    if (c->provider) assert_string_not_equal(einfo.provider, c->provider);
    hq_tensor deh = to_host(&de);
    within(what, "forced emulated", &dh, &deh, &r, coef + acc_bound(c->k), 2, 2);
    within(what, "reference (forced emulated)", &deh, NULL, &r, acc_bound(c->k), 1, 1);
    free(deh.data);
    hq_ctx_free(gpu, de.data);
  }
  if (info.path != HQ_GEMM_PATH_NATIVE) {
    /* the CPU path on the same operands agrees within two FP32 accumulations */
    hq_tensor dc = hq_test_empty(c->ddt, n, m);
    memcpy(dc.data, d0.data, tbytes(&d0));
    hq_gemm_args hargs;
    args_init(&hargs, bias_h, c->bias_dt, c->what);
    hq_gemm_info cinfo = {.struct_size = sizeof cinfo};
    HQ_OK_OR_FAIL(hq_gemm(cpu, c->ac, c->ta, c->bc, c->tb, &dc, c->alpha, c->beta, &hargs, &cinfo));
    assert_int_equal(cinfo.path, HQ_GEMM_PATH_CPU);
    within(what, "CPU path", &dh, &dc, &r, 2 * acc_bound(c->k), 2, 2);
    free(dc.data);
  }
  refdata_free(&r);
  free(dh.data);
  hq_ctx_free(gpu, dg.data);
  if (bias_d) hq_ctx_free(gpu, bias_d);
  free(bias_h);
  free(bias);
  free(d0f);
  free(d0.data);
}

// --- linear layers of every format ---------------------------------------------------------------

static const char *k_recipe =
    "[format bf]\nplugin = identity\ndtype = bf16\n"
    "[format bf_b]\nplugin = identity\ndtype = bf16\n"
    "[format hf]\nplugin = identity\ndtype = f32\n"
    "[format f8]\nplugin = fp8_tensor\n"
    "[format f8_b]\nplugin = fp8_tensor\n"
    "[format f8g]\nplugin = fp8_tensor\ndtype = e5m2\n"
    "[format f8g_b]\nplugin = fp8_tensor\ndtype = e5m2\n"
    "[format f8n]\nplugin = fp8_tensor_nofold\n"
    "[format mx]\nplugin = mxfp8\n"
    "[format mx_b]\nplugin = mxfp8\n"
    "[format nv]\nplugin = nvfp4\n"
    "[format nv_b]\nplugin = nvfp4\n"
    "[format nv_rht]\nplugin = nvfp4\nrht = true\n"
    "[format nv_w]\nplugin = nvfp4\nblock_2d = true\n"
    "[format nvr]\nplugin = nvfp4\nglobal_scale = row\n"
    "[format nv_sw]\nplugin = nvfp4\nswizzle = true\n"
    "[format nv_ue]\nplugin = nvfp4\nscale_dtype = ue5m3\nglobal_scale = none\n"
    "[format nv_ut]\nplugin = nvfp4\nscale_dtype = ue5m3\nrht = true\n"
    "[format nv_utw]\nplugin = nvfp4\nscale_dtype = ue5m3\n"
    "[format fb]\nplugin = fp8_block\n"
    "[format fb_b]\nplugin = fp8_block\n"
    "[format fb2]\nplugin = fp8_block\nblock = 2d\n"
    "[format fb2_b]\nplugin = fp8_block\nblock = 2d\n"
    "[format fbx]\nplugin = fp8_block\npower_2_scales = false\n"
    /* single-format layers */
    "[role linear:*:bf16]\nrowwise = bf\ncolumnwise = bf\n"
    "[role linear:*:f32]\nrowwise = hf\ncolumnwise = hf\n"
    "[role linear:*:fp8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:grad_output:fp8]\nrowwise = f8g\ncolumnwise = f8g\n"
    "[role linear:*:fp8_e5]\nrowwise = f8g\ncolumnwise = f8g\n"
    "[role linear:input:fp8_e5]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:*:mxfp8]\nrowwise = mx\ncolumnwise = mx\n"
    "[role linear:*:nvfp4]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:*:nvfp4_rht]\nrowwise = nv\ncolumnwise = nv_rht\n"
    "[role linear:weight:nvfp4_rht]\nrowwise = nv_w\ncolumnwise = nv_w\n"
    "[role linear:*:nvfp4_row]\nrowwise = nvr\ncolumnwise = nvr\n"
    /* the module's own GEMM: swizzled scales; UE5M3 scales without a global scale (factor 1)
       against E4M3 ones; UE5M3 with a global scale and RHT on the wgrad operands (rht
       transforms the columnwise copy, so the weights, whose columnwise copy dgrad multiplies
       by the gradient's rowwise one, take none) */
    "[role linear:*:nvfp4_sw]\nrowwise = nv_sw\ncolumnwise = nv_sw\n"
    "[role linear:*:nvfp4_ue]\nrowwise = nv_ue\ncolumnwise = nv_ue\n"
    /* row-scaled weights against per-tensor activations and gradients: a row factor on A
       (fprop, dgrad) beside a factor in alpha */
    "[role linear:*:nvfp4_rmix]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:weight:nvfp4_rmix]\nrowwise = nvr\ncolumnwise = nvr\n"
    "[role linear:weight:nvfp4_ue]\nrowwise = nv\ncolumnwise = nv_sw\n"
    "[role linear:*:nvfp4_ut]\nrowwise = nv_ut\ncolumnwise = nv_ut\n"
    "[role linear:weight:nvfp4_ut]\nrowwise = nv_utw\ncolumnwise = nv_utw\n"
    "[role linear:*:fp8_block]\nrowwise = fb\ncolumnwise = fb\n"
    "[role linear:weight:fp8_block]\nrowwise = fb2\ncolumnwise = fb2\n"
    "[role linear:*:fp8_block_b2]\nrowwise = fb\ncolumnwise = fb\n"
    "[role linear:input:fp8_block_b2]\nrowwise = fb2\ncolumnwise = fb2\n"
    "[role linear:*:fp8_block_2d2d]\nrowwise = fb2\ncolumnwise = fb2\n"
    "[role linear:*:fp8_block_np2]\nrowwise = fbx\ncolumnwise = fbx\n"
    /* mixed pairs: fprop mxfp8 x nvfp4, dgrad fp8_tensor x identity bf16 (f32), wgrad nvfp4 */
    "[role linear:weight:mixed]\nrowwise = mx\ncolumnwise = f8\n"
    "[role linear:input:mixed]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:grad_output:mixed]\nrowwise = bf\ncolumnwise = nv\n"
    /* nvfp4 x fp8_tensor both ways: two modules that fold their factors into alpha in their
       dequantize kernels (ABI 2.3), B's chained onto A's through factor_in */
    "[role linear:weight:mixed_nv8]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:input:mixed_nv8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:grad_output:mixed_nv8]\nrowwise = f8\ncolumnwise = nv\n"
    /* the same with fp8_tensor_nofold (tests/wrap): fp8_tensor without HQ_CAP_DEQ_FACTOR, a
       module of ABI 2.2 whose factor comes from tensor_factor() beside nvfp4's folded one */
    "[role linear:weight:mixed_nf]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:input:mixed_nf]\nrowwise = f8n\ncolumnwise = f8n\n"
    "[role linear:grad_output:mixed_nf]\nrowwise = f8n\ncolumnwise = nv\n"
    /* row-scaled NVFP4 (per-row factors split off, ABI 2.6) against operands without them: fprop
       A only (x identity bf16, read in place), dgrad both, wgrad B only (x mxfp8) */
    "[role linear:weight:mixed_row]\nrowwise = nvr\ncolumnwise = nvr\n"
    "[role linear:input:mixed_row]\nrowwise = bf\ncolumnwise = mx\n"
    "[role linear:grad_output:mixed_row]\nrowwise = nvr\ncolumnwise = nvr\n"
    "[role linear:weight:mixed_f32]\nrowwise = mx\ncolumnwise = f8\n"
    "[role linear:input:mixed_f32]\nrowwise = nv\ncolumnwise = nv\n"
    "[role linear:grad_output:mixed_f32]\nrowwise = hf\ncolumnwise = nv\n"
    /* hybrids whose two directions are equal configurations (two instances) */
    "[role linear:*:h_bf16]\nrowwise = bf\ncolumnwise = bf_b\n"
    "[role linear:*:h_fp8]\nrowwise = f8\ncolumnwise = f8_b\n"
    "[role linear:grad_output:h_fp8]\nrowwise = f8g\ncolumnwise = f8g_b\n"
    "[role linear:*:h_mxfp8]\nrowwise = mx\ncolumnwise = mx_b\n"
    "[role linear:*:h_nvfp4]\nrowwise = nv\ncolumnwise = nv_b\n"
    "[role linear:*:h_fp8_block]\nrowwise = fb\ncolumnwise = fb_b\n"
    "[role linear:weight:h_fp8_block]\nrowwise = fb2\ncolumnwise = fb2_b\n";

/* k_recipe, its plugins found on the test path and in $HQ_TEST_WRAP_DIR (fp8_tensor_nofold) */
static hq_recipe *gemm_recipe(void) {
  const char *wrap = getenv("HQ_TEST_WRAP_DIR");
  if (!wrap) fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
  return hq_test_recipe_dirs(k_recipe, &wrap, 1);
}

typedef struct qop {
  hq_tensor h, d;           /* the source on the host and on the device */
  hq_qtensor *g, *c;        /* quantized on the device / on the host */
  float *deq[2];            /* host dequantized rowwise / columnwise copies (F32) */
} qop;

typedef struct layer {
  qop x, w, dy;
  int64_t tokens, in, out;
} layer;

static void qop_make(hq_recipe *r, const char *role, hq_tensor src, qop *o) {
  hq_quantizer *q = hq_test_quantizer(r, role);
  o->h = src;
  o->d = to_gpu(&src);
  o->g = o->c = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &o->d, &o->g));
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &o->h, &o->c));
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    hq_tensor t = hq_test_empty(HQ_F32, src.rows, src.cols);
    HQ_OK_OR_FAIL(hq_dequantize(o->c, cpu, dir, &t));
    o->deq[d] = t.data;
  }
  hq_quantizer_free(q);
}

static void qop_free(qop *o) {
  hq_qtensor_free(o->g);
  hq_qtensor_free(o->c);
  hq_ctx_free(gpu, o->d.data);
  free(o->h.data);
  free(o->deq[0]);
  free(o->deq[1]);
}

static void layer_make(hq_recipe *r, const char *name, int64_t tokens, int64_t in, int64_t out,
                       uint64_t seed, layer *L) {
  char role[96];
  hq_tensor hx = hq_test_tensor(HQ_BF16, tokens, in, seed + 1, 1.0f);
  hq_tensor hw = hq_test_tensor(HQ_BF16, out, in, seed + 2, 0.05f);
  hq_tensor hdy = hq_test_tensor(HQ_BF16, tokens, out, seed + 3, 0.001f);
  /* a wide dynamic range inside blocks: a few large values */
  hq_store_hp(hx.data, 3, HQ_BF16, 300.0f);
  hq_store_hp(hdy.data, 70, HQ_BF16, -2.5f);
  hq_store_hp(hw.data, 200, HQ_BF16, 7.0f);
  L->tokens = tokens;
  L->in = in;
  L->out = out;
  snprintf(role, sizeof role, "linear:input:%s", name);
  qop_make(r, role, hx, &L->x);
  snprintf(role, sizeof role, "linear:weight:%s", name);
  qop_make(r, role, hw, &L->w);
  snprintf(role, sizeof role, "linear:grad_output:%s", name);
  qop_make(r, role, hdy, &L->dy);
}

static void layer_free(layer *L) {
  qop_free(&L->x);
  qop_free(&L->w);
  qop_free(&L->dy);
}

#define FPROP 0
#define DGRAD 1
#define WGRAD 2
static const char *gemm_name[3] = {"fprop", "dgrad", "wgrad"};

/* The GEMM g of layer L as a gcase (D f32, alpha 1, beta 0, no bias). */
static gcase layer_case(const layer *L, int g, const char *what) {
  gcase c;
  memset(&c, 0, sizeof c);
  c.what = what;
  c.ddt = HQ_F32;
  c.alpha = 1.0f;
  const qop *A, *B;
  if (g == FPROP) { /* y = x W^T: A = W (T, rowwise), B = x (N, rowwise) */
    A = &L->w, B = &L->x, c.ta = 1, c.tb = 0;
    c.m = L->out, c.n = L->tokens, c.k = L->in;
  } else if (g == DGRAD) { /* dx = dy W: A = W (N, columnwise), B = dy (N, rowwise) */
    A = &L->w, B = &L->dy, c.ta = 0, c.tb = 0;
    c.m = L->in, c.n = L->tokens, c.k = L->out;
  } else { /* dW = dy^T x: A = x (N, columnwise), B = dy (T, columnwise) */
    A = &L->x, B = &L->dy, c.ta = 0, c.tb = 1;
    c.m = L->in, c.n = L->out, c.k = L->tokens;
  }
  c.ag = hq_operand_q(A->g);
  c.bg = hq_operand_q(B->g);
  c.ac = hq_operand_q(A->c);
  c.bc = hq_operand_q(B->c);
  c.af = A->deq[c.ta ? 0 : 1];  /* A: T -> rowwise, N -> columnwise */
  c.bf = B->deq[c.tb ? 1 : 0];  /* B: N -> rowwise, T -> columnwise */
  c.a1 = A->h.cols;
  c.b1 = B->h.cols;
  const hq_storage *sa = hq_qtensor_storage(A->c, c.ta ? HQ_ROWWISE : HQ_COLWISE);
  const hq_storage *sb = hq_qtensor_storage(B->c, c.tb ? HQ_COLWISE : HQ_ROWWISE);
  c.rht16 = sa && sb && sa->desc.transform == HQ_TRANSFORM_RHT16 &&
            sb->desc.transform == HQ_TRANSFORM_RHT16;
  return c;
}

/* Expected paths on sm_90 for the three GEMMs of each layer (N native, B emulated-bf16, F
   emulated-f32), and whether its native GEMMs are FP8. */
typedef struct lcfg {
  const char *name;
  const char *paths;        /* fprop, dgrad, wgrad */
  int fp8;                  /* a native GEMM of it runs on low-precision tensor cores */
  int quick;                /* part of the HQ_TEST_QUICK set */
} lcfg;

static const lcfg k_layers[] = {
    {"bf16", "NNN", 0, 1},
    {"f32", "NNN", 0, 0},
    {"fp8", "NNN", 1, 1},          /* e4m3 x e4m3, e4m3 x e5m2 (dgrad, wgrad) */
    {"fp8_e5", "NBN", 1, 0},       /* e5m2 x e4m3; dgrad e5m2 x e5m2: no cuBLASLt kernel */
    {"mxfp8", "BBB", 1, 1},        /* (native on sm_100: the looser bound) */
    {"nvfp4", "BBB", 1, 0},
    {"nvfp4_rht", "BBB", 1, 1},    /* 16x16 weights; RHT on both wgrad operands */
    {"nvfp4_row", "BBB", 0, 1},    /* per-row factors on both operands of every GEMM */
    {"mixed_row", "BBB", 0, 0},    /* per-row factors on one operand, on both, on the other */
    {"fp8_block", "NNN", 1, 1},    /* 2-D x 1-D (fprop, dgrad), 1-D x 1-D (wgrad) */
    {"fp8_block_b2", "NNN", 1, 0}, /* 1-D x 2-D (fprop), 1-D x 1-D, 2-D x 1-D (wgrad) */
    {"fp8_block_2d2d", "NNN", 1, 0}, /* 2-D x 2-D: the module's own kernel (cuBLASLt has none) */
    {"fp8_block_np2", "NNN", 1, 0},  /* non-power-of-two scales: emulated would be F32 */
    {"mixed", "BBB", 1, 1},        /* mxfp8 x nvfp4, fp8_tensor x identity bf16, nvfp4 x nvfp4 */
    {"mixed_f32", "BFB", 1, 0},    /* fp8_tensor x identity f32 */
    {"mixed_nv8", "BBB", 0, 0},    /* nvfp4 x fp8_tensor (fprop, dgrad), fp8_tensor x nvfp4 */
    {"mixed_nf", "BBB", 0, 0},     /* the same, fp8_tensor's factor from tensor_factor() */
};

static uint32_t path_of(char c) {
  return c == 'N' ? HQ_GEMM_PATH_NATIVE : c == 'B' ? HQ_GEMM_PATH_EMULATED_BF16
                                                   : HQ_GEMM_PATH_EMULATED_F32;
}

static void test_formats_linear(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  const int64_t tokens = 128, in = 384, out = 256; /* fprop m=256 n=128 k=384 */
  for (size_t i = 0; i < sizeof k_layers / sizeof *k_layers; i++) {
    const lcfg *cf = &k_layers[i];
    if (g_quick && !cf->quick) continue;
    layer L;
    layer_make(r, cf->name, tokens, in, out, 10 * i, &L);
    for (int g = 0; g < 3; g++) {
      char what[96];
      snprintf(what, sizeof what, "%s %s", cf->name, gemm_name[g]);
      gcase c = layer_case(&L, g, what);
      c.path = g_arch == 90 ? path_of(cf->paths[g]) : 0;
      c.fp8_native = cf->fp8;
      c.out = malloc((size_t)(c.m * c.n) * 4);
      run_case(&c);
      /* the linear-layer helper makes the same call: the same bytes */
      hq_tensor y = hq_test_empty(HQ_F32, c.n, c.m);
      hq_tensor yd = to_gpu(&y);
      hq_gemm_info info = {.struct_size = sizeof info};
      if (g == FPROP)
        HQ_OK_OR_FAIL(hq_linear_fprop(gpu, hq_operand_q(L.x.g), hq_operand_q(L.w.g), NULL, HQ_F32,
                                      &yd, &info));
      else if (g == DGRAD)
        HQ_OK_OR_FAIL(hq_linear_dgrad(gpu, hq_operand_q(L.dy.g), hq_operand_q(L.w.g), &yd, &info));
      else
        HQ_OK_OR_FAIL(hq_linear_wgrad(gpu, hq_operand_q(L.x.g), hq_operand_q(L.dy.g), &yd, 0,
                                      &info));
      assert_int_equal(info.dir_a, g == FPROP ? HQ_ROWWISE : HQ_COLWISE);
      assert_int_equal(info.dir_b, g == WGRAD ? HQ_COLWISE : HQ_ROWWISE);
      hq_tensor yh = to_host(&yd);
      if (memcmp(yh.data, c.out, (size_t)(c.m * c.n) * 4) != 0)
        fail_msg("%s: hq_linear_%s differs from the equivalent hq_gemm", what, gemm_name[g]);
      free(yh.data);
      free(y.data);
      hq_ctx_free(gpu, yd.data);
      free(c.out);
    }
    layer_free(&L);
  }
  hq_recipe_free(r);
}

/* Bias (f32, bf16), beta accumulation, bf16 and f32 D, alpha, on native and emulated paths. */
static void test_bias_beta_dtypes(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  const char *names[] = {"bf16",      "fp8",       "mxfp8",    "nvfp4_row", "fp8_block_np2",
                         "mixed_f32", "nvfp4",     "mixed_nv8", "mixed_nf",  "mixed",
                         "mixed_row"};
  const int64_t tokens = 128, in = 384, out = 256;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    if (g_quick && i > 3) break;
    layer L;
    layer_make(r, names[i], tokens, in, out, 300 + 10 * i, &L);
    const lcfg *cf = NULL;
    for (size_t j = 0; j < sizeof k_layers / sizeof *k_layers; j++)
      if (!strcmp(k_layers[j].name, names[i])) cf = &k_layers[j];
    assert_non_null(cf);
    static const struct {
      int g;
      hq_dtype d, b;
      float alpha, beta;
    } v[] = {
        {FPROP, HQ_BF16, HQ_BF16, 1.0f, 0.0f}, {FPROP, HQ_BF16, HQ_F32, 0.5f, 0.0f},
        {FPROP, HQ_F32, HQ_F32, 1.0f, 0.0f},   {FPROP, HQ_F32, HQ_BF16, 2.0f, 0.0f},
        {WGRAD, HQ_F32, 0, 1.0f, 1.0f},        {WGRAD, HQ_BF16, 0, 1.0f, 1.0f},
        {DGRAD, HQ_F32, 0, 0.75f, 0.5f},       {FPROP, HQ_BF16, HQ_F32, 1.0f, 0.25f},
    };
    for (size_t j = 0; j < sizeof v / sizeof *v; j++) {
      char what[96];
      snprintf(what, sizeof what, "%s %s alpha %g beta %g", names[i], gemm_name[v[j].g],
               v[j].alpha, v[j].beta);
      gcase c = layer_case(&L, v[j].g, what);
      c.ddt = v[j].d;
      c.bias_dt = v[j].b;
      c.alpha = v[j].alpha;
      c.beta = v[j].beta;
      c.path = g_arch == 90 ? path_of(cf->paths[v[j].g]) : 0;
      c.fp8_native = cf->fp8;
      run_case(&c);
    }
    /* the fprop helper with a bias on the device, against hq_gemm with the same bias */
    hq_tensor bias = hq_test_tensor(HQ_F32, 1, out, 99, 1.0f);
    void *bias_d = bytes_to_gpu(bias.data, (size_t)out * 4);
    hq_tensor y = hq_test_empty(HQ_BF16, tokens, out), y2 = hq_test_empty(HQ_BF16, tokens, out);
    hq_tensor yd = to_gpu(&y), y2d = to_gpu(&y2);
    HQ_OK_OR_FAIL(hq_linear_fprop(gpu, hq_operand_q(L.x.g), hq_operand_q(L.w.g), bias_d, HQ_F32,
                                  &yd, NULL));
    hq_gemm_args a;
    args_init(&a, bias_d, HQ_F32, "fprop with bias");
    HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(L.w.g), 1, hq_operand_q(L.x.g), 0, &y2d, 1.0f, 0.0f,
                          &a, NULL));
    hq_tensor yh = to_host(&yd), y2h = to_host(&y2d);
    assert_memory_equal(yh.data, y2h.data, tbytes(&yh));
    free(yh.data), free(y2h.data), free(y.data), free(y2.data), free(bias.data);
    hq_ctx_free(gpu, yd.data);
    hq_ctx_free(gpu, y2d.data);
    hq_ctx_free(gpu, bias_d);
    layer_free(&L);
  }
  hq_recipe_free(r);
}

/* A hybrid whose two directions are two instances of one configuration multiplies bit for bit
   like the single-instance quantizer: fprop, dgrad, wgrad, native and emulated. */
static void test_hybrid_equal_bitwise(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  static const char *pairs[][2] = {{"bf16", "h_bf16"},   {"fp8", "h_fp8"},
                                   {"mxfp8", "h_mxfp8"}, {"nvfp4", "h_nvfp4"},
                                   {"fp8_block", "h_fp8_block"}};
  const int64_t tokens = 128, in = 384, out = 256;
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    if (g_quick && i > 2) break;
    layer S, H;
    layer_make(r, pairs[i][0], tokens, in, out, 500, &S);
    layer_make(r, pairs[i][1], tokens, in, out, 500, &H);
    for (int g = 0; g < 3; g++) {
      gcase cs = layer_case(&S, g, pairs[i][0]), ch = layer_case(&H, g, pairs[i][1]);
      size_t nb = (size_t)(cs.m * cs.n) * 4;
      hq_tensor ds = hq_test_empty(HQ_F32, cs.n, cs.m);
      hq_tensor dsd = to_gpu(&ds), dhd = to_gpu(&ds);
      hq_gemm_info is = {.struct_size = sizeof is}, ih = {.struct_size = sizeof ih};
      HQ_OK_OR_FAIL(hq_gemm(gpu, cs.ag, cs.ta, cs.bg, cs.tb, &dsd, 1.0f, 0.0f, NULL, &is));
      HQ_OK_OR_FAIL(hq_gemm(gpu, ch.ag, ch.ta, ch.bg, ch.tb, &dhd, 1.0f, 0.0f, NULL, &ih));
      assert_int_equal(is.path, ih.path);
      hq_tensor a = to_host(&dsd), b = to_host(&dhd);
      if (memcmp(a.data, b.data, nb) != 0)
        fail_msg("%s %s (%s): the hybrid's D differs from the single-format D", pairs[i][1],
                 gemm_name[g], hq_gemm_path_name(is.path));
      free(a.data), free(b.data), free(ds.data);
      hq_ctx_free(gpu, dsd.data);
      hq_ctx_free(gpu, dhd.data);
    }
    layer_free(&S);
    layer_free(&H);
  }
  hq_recipe_free(r);
}

/* F32 x F32 is FP32, not TF32: A[i][0] = 1 + 2^-20 (TF32 keeps 10 mantissa bits: 1), B[j][0] = 1,
   every other product 0: D must be exactly 1 + 2^-20. Native (identity f32 storages) and
   emulated (high-precision operands). */
static void test_f32_is_fp32(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  const int64_t m = 64, n = 32, k = 128;
  hq_tensor a = hq_test_empty(HQ_F32, m, k), b = hq_test_empty(HQ_F32, n, k);
  for (int64_t i = 0; i < m * k; i++) ((float *)a.data)[i] = 1.0f;
  for (int64_t i = 0; i < m; i++) ((float *)a.data)[i * k] = 1.0f + 0x1p-20f;
  for (int64_t j = 0; j < n; j++) ((float *)b.data)[j * k] = 1.0f;
  hq_tensor ad = to_gpu(&a), bd = to_gpu(&b);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:f32");
  hq_qtensor *qa = NULL, *qb = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &ad, &qa));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &bd, &qb));
  for (int native = 0; native < 2; native++) {
    hq_tensor d = hq_test_empty(HQ_F32, n, m), dd = to_gpu(&d);
    hq_gemm_info info = {.struct_size = sizeof info};
    if (native)
      HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(qa), 1, hq_operand_q(qb), 0, &dd, 1, 0, NULL, &info));
    else
      HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_hp(&ad), 1, hq_operand_hp(&bd), 0, &dd, 1, 0, NULL,
                            &info));
    if (g_arch) assert_int_equal(info.path, native ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_F32);
    hq_tensor dh = to_host(&dd);
    for (int64_t e = 0; e < m * n; e++)
      if (((float *)dh.data)[e] != 1.0f + 0x1p-20f)
        fail_msg("%s f32 x f32: D[%lld] = 1 + %.3g, not 1 + 2^-20 (TF32 or a narrower type?)",
                 native ? "native" : "emulated", (long long)e, ((float *)dh.data)[e] - 1.0);
    free(dh.data), free(d.data);
    hq_ctx_free(gpu, dd.data);
  }
  hq_qtensor_free(qa);
  hq_qtensor_free(qb);
  hq_quantizer_free(q);
  hq_ctx_free(gpu, ad.data);
  hq_ctx_free(gpu, bd.data);
  free(a.data), free(b.data);
  hq_recipe_free(r);
}

/* Odd shapes, every transpose pair: identity bf16 / f32 (native) and fp8_tensor e4m3 (native
   where k is a multiple of 16, emulated otherwise), high-precision operands (emulated). */
static void test_odd_shapes(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  static const int64_t shapes[][3] = {{29, 37, 53}, {40, 24, 48}, {8, 1, 16}, {1, 5, 3}};
  static const char *roles[] = {"linear:weight:bf16", "linear:weight:f32", "linear:weight:fp8",
                                NULL};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (size_t f = 0; f < sizeof roles / sizeof *roles; f++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
          if (g_quick && (s > 1 || ta != tb)) continue;
          const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
          const int64_t a0 = ta ? m : k, a1 = ta ? k : m, b0 = tb ? k : n, b1 = tb ? n : k;
          hq_tensor ah = hq_test_tensor(HQ_BF16, a0, a1, 1000 + s, 1.0f);
          hq_tensor bh = hq_test_tensor(HQ_BF16, b0, b1, 2000 + s, 1.0f);
          qop A, B;
          memset(&A, 0, sizeof A);
          memset(&B, 0, sizeof B);
          gcase c;
          memset(&c, 0, sizeof c);
          char what[128];
          snprintf(what, sizeof what, "%s %s%s m=%lld n=%lld k=%lld",
                   roles[f] ? roles[f] : "high precision", ta ? "T" : "N", tb ? "T" : "N",
                   (long long)m, (long long)n, (long long)k);
          c.what = what;
          if (roles[f]) {
            qop_make(r, roles[f], ah, &A);
            qop_make(r, roles[f], bh, &B);
            c.ag = hq_operand_q(A.g), c.bg = hq_operand_q(B.g);
            c.ac = hq_operand_q(A.c), c.bc = hq_operand_q(B.c);
            c.af = A.deq[ta ? 0 : 1];
            c.bf = B.deq[tb ? 1 : 0];
          } else {
            A.h = ah, B.h = bh;
            A.d = to_gpu(&ah), B.d = to_gpu(&bh);
            A.deq[0] = f32_of(&ah), B.deq[0] = f32_of(&bh);
            c.ag = hq_operand_hp(&A.d), c.bg = hq_operand_hp(&B.d);
            c.ac = hq_operand_hp(&A.h), c.bc = hq_operand_hp(&B.h);
            c.af = A.deq[0], c.bf = B.deq[0];
          }
          c.ta = ta, c.tb = tb, c.a1 = a1, c.b1 = b1, c.m = m, c.n = n, c.k = k;
          c.ddt = (ta ^ tb) ? HQ_BF16 : HQ_F32;
          c.alpha = 1.5f;
          c.beta = ta ? 0.5f : 0.0f;
          c.bias_dt = tb ? HQ_F32 : 0;
          const int fp8 = roles[f] && strstr(roles[f], "fp8");
          c.fp8_native = fp8;
          /* fp8_tensor: native where k (= lda = ldb) is a multiple of 16; whether cuBLASLt has
             an FP8 kernel for m or n below 8 is its own business (either path is checked) */
          if (g_arch == 90 && !(fp8 && k % 16 == 0 && (m % 8 || n % 8)))
            c.path = !roles[f]     ? HQ_GEMM_PATH_EMULATED_BF16
                     : fp8         ? (k % 16 == 0 ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16)
                                   : HQ_GEMM_PATH_NATIVE;
          run_case(&c);
          qop_free(&A);
          qop_free(&B);
        }
  hq_recipe_free(r);
}

/* Refusals on the device, and the plan's reasons. */
static void test_refusals(void **state) {
  (void)state;
  hq_recipe *r = gemm_recipe();
  const int64_t tokens = 128, in = 384, out = 256;
  layer L;
  layer_make(r, "nvfp4_rht", tokens, in, out, 700, &L);
  hq_tensor y = hq_test_empty(HQ_F32, tokens, out), yd = to_gpu(&y);
  hq_tensor dx = hq_test_empty(HQ_F32, tokens, in), dxd = to_gpu(&dx);
  hq_tensor dw = hq_test_empty(HQ_F32, out, in), dwd = to_gpu(&dw);

  /* a weight without its columnwise copy: dgrad is HQ_ESTATE naming role and direction */
  HQ_OK_OR_FAIL(hq_qtensor_drop(L.w.g, HQ_COLWISE));
  assert_int_equal(hq_linear_dgrad(gpu, hq_operand_q(L.dy.g), hq_operand_q(L.w.g), &dxd, NULL),
                   HQ_ESTATE);
  HQ_ERROR_HAS("linear:weight:nvfp4_rht");
  HQ_ERROR_HAS("columnwise");
  HQ_OK_OR_FAIL(hq_linear_fprop(gpu, hq_operand_q(L.x.g), hq_operand_q(L.w.g), NULL, HQ_F32, &yd,
                                NULL));
  /* shapes: D of the wrong shape, k disagreeing */
  assert_int_equal(hq_linear_fprop(gpu, hq_operand_q(L.x.g), hq_operand_q(L.w.g), NULL, HQ_F32,
                                   &dxd, NULL), HQ_ESHAPE);
  assert_int_equal(hq_gemm(gpu, hq_operand_q(L.dy.g), 1, hq_operand_q(L.x.g), 0, &yd, 1, 0, NULL,
                           NULL), HQ_ESHAPE);
  HQ_ERROR_HAS("agree on k");
  /* an RHT columnwise copy against a plain one (the weight's 16x16 columnwise copy has none):
     x^T * W in the wgrad position */
  layer P;
  layer_make(r, "nvfp4", tokens, in, out, 710, &P);
  assert_int_equal(hq_linear_wgrad(gpu, hq_operand_q(L.x.g), hq_operand_q(P.dy.g), &dwd, 0, NULL),
                   HQ_EINVAL);
  HQ_ERROR_HAS("transform");
  hq_gemm_info info = {.struct_size = sizeof info};
  assert_int_equal(hq_gemm_plan(gpu, hq_operand_q(L.x.g), 0, hq_operand_q(P.dy.g), 1, NULL, NULL,
                                &info), HQ_EINVAL);
  /* a device operand against a host context */
  if (hq_ctx_device(gpu) >= 0)
    assert_int_equal(hq_linear_fprop(cpu, hq_operand_q(L.x.g), hq_operand_q(L.w.g), NULL, HQ_F32,
                                     &y, NULL), HQ_EINVAL);
  /* plans with reasons (sm_90): e5m2 x e5m2, 2-D x 2-D block scales */
  if (g_arch == 90) {
    layer E, B2;
    layer_make(r, "fp8_e5", tokens, in, out, 720, &E);
    /* above fp8_block's own kernel (2^26 multiply-adds), which multiplies 2-D x 2-D natively */
    layer_make(r, "fp8_block_2d2d", 512, 256, 512, 730, &B2);
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(E.w.g), 0, hq_operand_q(E.dy.g), 0, NULL, NULL,
                               &info));
    assert_int_equal(info.path, HQ_GEMM_PATH_EMULATED_BF16);
    if (!strstr(info.reason, "e5m2")) fail_msg("reason '%s' lacks e5m2", info.reason);
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(E.w.g), 1, hq_operand_q(E.x.g), 0, NULL, NULL,
                               &info));
    assert_int_equal(info.path, HQ_GEMM_PATH_NATIVE);
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(B2.w.g), 1, hq_operand_q(B2.x.g), 0, NULL, NULL,
                               &info));
    assert_int_equal(info.path, HQ_GEMM_PATH_EMULATED_BF16);
    if (!strstr(info.reason, "2-D")) fail_msg("reason '%s' lacks 2-D", info.reason);
    layer_free(&E);
    layer_free(&B2);
  }
  layer_free(&P);
  layer_free(&L);
  free(y.data), free(dx.data), free(dw.data);
  hq_ctx_free(gpu, yd.data);
  hq_ctx_free(gpu, dxd.data);
  hq_ctx_free(gpu, dwd.data);
  hq_recipe_free(r);
}

/* hq_gemm_args.amax_d on the GPU, every path: the native per-tensor FP8 GEMM (D bf16 and f32,
   split and fast accumulation, with bias and beta), the native plain BF16 GEMM of identity
   storages, the emulated path (forced) and high-precision tensors. Each amax equals the largest
   |D| of the stored result, computed here from D read back, though the slot held 1e30 before
   the call (the value is written, not maxed into: the runner no longer zeroes it, relying on
   cuBLASLt's documented AMAX_D); hq_gemm_info.amax_fused says which calls took it from cuBLASLt's
   epilogue (printed: cuBLASLt decides which problems have one). */
static void test_amax_d(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format f8]\nplugin = fp8_tensor\n[format bf]\nplugin = identity\n"
                                "dtype = bf16\n[role linear:*:fp8]\nrowwise = f8\n"
                                "columnwise = f8\n[role linear:*:bf]\nrowwise = bf\n"
                                "columnwise = bf\n");
  const int64_t m = 256, n = 384, k = 512;
  hq_tensor ah = hq_test_tensor(HQ_BF16, m, k, 41, 1.0f), bh = hq_test_tensor(HQ_BF16, n, k, 42, 1.0f);
  hq_store_hp(ah.data, 77, HQ_BF16, -24.0f);
  hq_tensor ad = to_gpu(&ah), bd = to_gpu(&bh);
  hq_quantizer *q8 = hq_test_quantizer(r, "linear:weight:fp8"),
               *qb = hq_test_quantizer(r, "linear:weight:bf");
  hq_qtensor *a8 = NULL, *b8 = NULL, *abf = NULL, *bbf = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q8, gpu, &ad, &a8));
  HQ_OK_OR_FAIL(hq_quantize(q8, gpu, &bd, &b8));
  HQ_OK_OR_FAIL(hq_quantize(qb, gpu, &ad, &abf));
  HQ_OK_OR_FAIL(hq_quantize(qb, gpu, &bd, &bbf));
  float biash[256];
  for (int i = 0; i < 256; i++) biash[i] = (float)(i % 17) - 8.0f;
  hq_tensor bias_h = hq_tensor_2d(biash, HQ_F32, HQ_DEVICE_HOST, 1, 256), bias_d = to_gpu(&bias_h);
  float *amax_dev = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, sizeof(float), (void **)&amax_dev));
  const struct {
    const char *what;
    int ops;        /* 0 fp8_tensor, 1 identity bf16, 2 high-precision tensors */
    hq_dtype dt;
    uint32_t flags;
    int bias_beta;
  } cases[] = {
      {"fp8 -> bf16", 0, HQ_BF16, 0, 0},
      {"fp8 -> f32", 0, HQ_F32, 0, 0},
      {"fp8 fast accum -> bf16", 0, HQ_BF16, HQ_GEMM_FAST_ACCUM, 0},
      {"fp8 -> bf16, bias and beta", 0, HQ_BF16, 0, 1},
      {"fp8 emulated -> bf16", 0, HQ_BF16, HQ_GEMM_FORCE_EMULATED, 0},
      {"identity bf16 -> bf16", 1, HQ_BF16, 0, 0},
      {"bf16 tensors -> f32, bias and beta", 2, HQ_F32, 0, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    hq_operand oa = cases[c].ops == 0   ? hq_operand_q(a8)
                    : cases[c].ops == 1 ? hq_operand_q(abf)
                                        : hq_operand_hp(&ad);
    hq_operand ob = cases[c].ops == 0   ? hq_operand_q(b8)
                    : cases[c].ops == 1 ? hq_operand_q(bbf)
                                        : hq_operand_hp(&bd);
    hq_tensor dh = hq_test_tensor(cases[c].dt, n, m, 43, 4.0f), dd = to_gpu(&dh);
    hq_gemm_args args = HQ_GEMM_ARGS_INIT;
    args.flags = cases[c].flags;
    args.amax_d = amax_dev;
    if (cases[c].bias_beta) {
      args.bias = bias_d.data;
      args.bias_dtype = HQ_F32;
    }
    static const float stale = 1e30f; /* outlives the stream-ordered copy */
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, amax_dev, hq_ctx_device(gpu), &stale, HQ_DEVICE_HOST, 4));
    hq_gemm_info info = HQ_GEMM_INFO_INIT;
    HQ_OK_OR_FAIL(hq_gemm(gpu, oa, 1, ob, 0, &dd, 0.5f, cases[c].bias_beta ? 0.75f : 0.0f, &args,
                          &info));
    hq_tensor back = to_host(&dd);
    float got = -1.0f, want = 0.0f;
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, &got, HQ_DEVICE_HOST, amax_dev, hq_ctx_device(gpu), 4));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    for (int64_t i = 0; i < n * m; i++) {
      const float v = fabsf(hq_load_hp(back.data, i, back.dtype));
      if (v > want) want = v;
    }
    print_message("amax_d %-36s path %-14s provider %-9s amax_fused %u: %.9g\n", cases[c].what,
                  hq_gemm_path_name(info.path), info.provider, info.amax_fused, (double)got);
    if (got != want)
      fail_msg("%s: amax_d %.9g, max |D| of the stored result %.9g (path %s, amax_fused %u)",
               cases[c].what, (double)got, (double)want, hq_gemm_path_name(info.path),
               info.amax_fused);
    free(back.data);
    free(dh.data);
    hq_ctx_free(gpu, dd.data);
  }
  hq_ctx_free(gpu, amax_dev);
  hq_ctx_free(gpu, bias_d.data);
  hq_qtensor_free(a8), hq_qtensor_free(b8), hq_qtensor_free(abf), hq_qtensor_free(bbf);
  hq_quantizer_free(q8), hq_quantizer_free(qb);
  hq_ctx_free(gpu, ad.data), hq_ctx_free(gpu, bd.data);
  free(ah.data), free(bh.data);
  hq_recipe_free(r);
}

/* The fused test's two products of X [rows, K] (quantized) and the identity W [K, K] (BF16):
   out[0] through the fused path (HQ_GEMM_FUSED_ALWAYS), out[1] through the plain emulated one,
   as host F32 tensors (free .data). orient 0: D [K, rows] = X (A, T) x W (B, N), D(i, j) =
   X(i, j), X's rows are D's m; orient 1: D [rows, K] = W (A, T) x X (B, N), D(i, j) = X(j, i),
   X's rows are D's n. */
static void fused_and_emulated(const hq_qtensor *qx, const hq_tensor *wg, int orient,
                               int64_t rows, int64_t K, hq_tensor out[2]) {
  const hq_operand xo = hq_operand_q(qx), wo = hq_operand_hp(wg);
  const int64_t dn = orient ? rows : K, dm = orient ? K : rows;
  for (int f = 0; f < 2; f++) {
    hq_tensor dh = hq_test_empty(HQ_F32, dn, dm), dd = to_gpu(&dh);
    hq_gemm_args a = {.struct_size = sizeof a,
                      .flags = f ? HQ_GEMM_FORCE_EMULATED : HQ_GEMM_FUSED_ALWAYS};
    hq_gemm_info info = {.struct_size = sizeof info};
    HQ_OK_OR_FAIL(hq_gemm(gpu, orient ? wo : xo, 1, orient ? xo : wo, 0, &dd, 1.0f, 0.0f, &a,
                          &info));
    assert_int_equal(info.path, f ? HQ_GEMM_PATH_EMULATED_BF16 : HQ_GEMM_PATH_FUSED_BF16);
    assert_int_equal(info.fused, f ? 0 : orient ? 2 : 1); /* X is B in orient 1 */
    out[f] = to_host(&dd);
    free(dh.data);
    hq_ctx_free(gpu, dd.data);
  }
}

/* The fused path (Hopper) multiplies the same BF16 values as the emulated path, bit for bit:
   with W the identity, D = X exactly (one product per output, the others exact zeros), so the
   fused D, the emulated D and the dequantize of X rounded to BF16 must agree byte for byte (a
   zero as a value: -0 + 0 is +0).
   X spans every binade an MXFP8 block scale can take here (2^-120 .. 2^120: E4M3 subnormal codes,
   scales above and below the fused kernel's one-multiply limit), holds a NaN and a zero block;
   both orientations of D (X as A: its rows are D's m; X as B: its rows are D's n), partial tiles,
   E4M3 and E5M2. */
static void test_fused_exact(void **state) {
  (void)state;
  if (g_arch != 90) skip();
  hq_recipe *r = hq_test_recipe(
      "[format mx]\nplugin = mxfp8\n[format mx5]\nplugin = mxfp8\ndtype = e5m2\n"
      "[format mxs]\nplugin = mxfp8\nswizzle = true\n"
      "[role linear:input:e4]\nrowwise = mx\n[role linear:input:e5]\nrowwise = mx5\n"
      "[role linear:input:e4s]\nrowwise = mxs\n");
  /* 3 x 128 row tiles (the last partial); 13 k-steps of 64, the last one half (K % 64 == 32),
     more than the kernel's ring of stages holds: each stage is used two or three times */
  const int64_t rows = 320, K = 800;
  hq_tensor x = hq_test_tensor(HQ_F32, rows, K, 991, 1.0f);
  float *xf = x.data;
  uint64_t s = 12345;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t b = 0; b < K / 32; b++) {
      const int e = (int)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 241;
      for (int64_t q = 0; q < 32; q++) {
        float v = xf[i * K + 32 * b + q] * ldexpf(1.0f, e - 120);
        if (q % 7 == 3) v *= 0x1p-9f; /* small codes: E4M3 / E5M2 subnormals */
        xf[i * K + 32 * b + q] = v;
      }
    }
  for (int64_t q = 0; q < 32; q++) xf[5 * K + 64 + q] = 0.0f; /* a zero block */
  xf[7 * K + 100] = NAN;
  hq_tensor w = hq_test_empty(HQ_BF16, K, K);
  for (int64_t j = 0; j < K; j++) hq_store_hp(w.data, j * K + j, HQ_BF16, 1.0f);
  hq_tensor xg = to_gpu(&x), wg = to_gpu(&w);
  static const char *const roles[3] = {"linear:input:e4", "linear:input:e5",
                                       "linear:input:e4s"};
  static const char *const names[3] = {"e4m3", "e5m2", "e4m3 (swizzled scales)"};
  for (int v = 0; v < 3; v++) {
    hq_quantizer *q = hq_test_quantizer(r, roles[v]);
    hq_qtensor *qx = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qx));
    /* the reference: dequantize (bit-identical to the CPU's, test_gpu_mxfp8), then BF16 */
    float *xr = hq_gpu_deq_back(gpu, qx, HQ_ROWWISE, rows, K);
    for (int orient = 0; orient < 2; orient++) {
      hq_tensor out[2];
      fused_and_emulated(qx, &wg, orient, rows, K, out);
      const float *fu = out[0].data, *em = out[1].data;
      int64_t checked = 0;
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < K; j++) {
          const int64_t e = orient ? i * K + j : j * rows + i; /* D's element of X(i, j) */
          const float ref = hq_bf16_to_f32(hq_f32_to_bf16(xr[i * K + j]));
          const int row_nan = i == 7; /* NaN * 0 spreads along X's row 7 */
          if (row_nan) {
            if (!isnan(fu[e]) || !isnan(em[e]))
              fail_msg("%s orient %d: X(7, %lld): fused %g, emulated %g, expected NaN", names[v],
                       orient, (long long)j, fu[e], em[e]);
            continue;
          }
          if (ref == 0.0f) { /* a -0 code sums with +0 products to +0 on either path */
            if (fu[e] != 0.0f || em[e] != 0.0f)
              fail_msg("%s orient %d: X(%lld, %lld): fused %a, emulated %a, expected 0",
                       names[v], orient, (long long)i, (long long)j, fu[e], em[e]);
          } else if (memcmp(&fu[e], &ref, 4) || memcmp(&em[e], &ref, 4))
            fail_msg("%s orient %d: X(%lld, %lld): fused %a, emulated %a, dequantize %a",
                     names[v], orient, (long long)i, (long long)j, fu[e], em[e], ref);
          checked++;
        }
      printf("fused exact: %s, D %s: %lld values equal to the dequantize, bit for bit\n",
             names[v], orient ? "= X (X as B)" : "= X^T (X as A)", (long long)checked);
      free(out[0].data);
      free(out[1].data);
    }
    free(xr);
    hq_qtensor_free(qx);
    hq_quantizer_free(q);
  }
  hq_ctx_free(gpu, xg.data);
  hq_ctx_free(gpu, wg.data);
  free(x.data);
  free(w.data);
  hq_recipe_free(r);
}

/* The fused path's default reach (Hopper): an F32 D (hq train's GEMMs) with k below 2048 takes
   the unfused path, which trained the wide model faster; a BF16 D keeps the fused kernel at the
   same k, as does an F32 D at k = 2048 and HQ_GEMM_FUSED_ALWAYS at any k. A grid of fewer than
   96 output tiles of 128 x 256 takes the unfused path whatever k (3968 x 768: 31 x 3 = 93 tiles;
   4096 x 512: 64), 4096 x 768 (96) the fused one. The fused operand (the MXFP8 input, the
   larger) holds at least 2^20 elements (the size rule's floor) against a BF16 weight. */
static void test_fused_short_k(void **state) {
  (void)state;
  if (g_arch != 90) skip();
  hq_recipe *r = hq_test_recipe("[format mx]\nplugin = mxfp8\n[role linear:input:x]\nrowwise = mx\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  static const struct {
    int64_t rows, n, k;
    hq_dtype d;
    uint32_t flags;
    int fused;
  } cases[] = {{4096, 768, 1024, HQ_F32, 0, 0},
               {4096, 768, 1024, HQ_BF16, 0, 1},
               {4096, 768, 2048, HQ_F32, 0, 1},
               {4096, 768, 1024, HQ_F32, HQ_GEMM_FUSED_ALWAYS, 1},
               {4096, 768, 512, HQ_F32, 0, 0},
               {3968, 768, 2048, HQ_BF16, 0, 0},
               {3968, 768, 2048, HQ_F32, HQ_GEMM_FUSED_ALWAYS, 1},
               {4096, 512, 2048, HQ_BF16, 0, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int64_t k = cases[c].k, rows = cases[c].rows, N = cases[c].n;
    hq_tensor x = hq_test_tensor(HQ_F32, rows, k, 77 + (uint64_t)c, 1.0f);
    hq_tensor w = hq_test_tensor(HQ_BF16, N, k, 78 + (uint64_t)c, 1.0f);
    hq_tensor xg = to_gpu(&x), wg = to_gpu(&w);
    hq_qtensor *qx = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qx));
    void *dd = NULL; /* the plan checks D's pointer though it runs nothing */
    HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, (size_t)(N * rows) * (cases[c].d == HQ_F32 ? 4 : 2), &dd));
    hq_tensor d = hq_tensor_2d(dd, cases[c].d, 0, N, rows);
    hq_gemm_args a = {.struct_size = sizeof a, .flags = cases[c].flags};
    hq_gemm_info info = {.struct_size = sizeof info};
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(qx), 1, hq_operand_hp(&wg), 0, &d, &a, &info));
    if ((info.path == HQ_GEMM_PATH_FUSED_BF16) != cases[c].fused)
      fail_msg("%lld x %lld x %lld, D %s, flags %#x: path %s, the fused path %s",
               (long long)rows, (long long)N, (long long)k, cases[c].d == HQ_F32 ? "f32" : "bf16",
               (unsigned)cases[c].flags, hq_gemm_path_name(info.path),
               cases[c].fused ? "expected" : "not expected");
    hq_qtensor_free(qx);
    hq_ctx_free(gpu, dd);
    hq_ctx_free(gpu, xg.data);
    hq_ctx_free(gpu, wg.data);
    free(x.data);
    free(w.data);
  }
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* A host copy of the buffer with `role` of a device storage (free()). */
static uint8_t *storage_buf(const hq_storage *st, uint32_t role, const hq_buffer **out) {
  const hq_buffer *b = hq_gpu_buf_of(st, role);
  uint8_t *h = malloc(b->bytes);
  assert_non_null(h);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, h, HQ_DEVICE_HOST, b->ptr, hq_ctx_device(gpu), b->bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  *out = b;
  return h;
}

/* The fused path with an NVFP4 operand (Hopper), compact and swizzled scales: X times an identity
   BF16 W, both orientations, D (F32) against the exact product of the ABI's raw-value rule
   computed here from the storage's bytes -- RN(f * e2m1(q) * fp32(sf)), f the tensor factor
   RN(A * RN(1/2688)) of its amax -- bit for bit, and the unfused emulated path alike. The 16-blocks
   span 2^-20 .. 2^8 so their E4M3 scales are normal, subnormal and zero (with saturated codes);
   one block is zero, and two scale bytes are overwritten on the device: a NaN (its row of D must
   be NaN) and a negative scale (never written by the plugin: the rule path). K % 64 == 32. */
static void test_fused_nvfp4_exact(void **state) {
  (void)state;
  if (g_arch != 90) skip();
  hq_recipe *r = hq_test_recipe(
      "[format nv]\nplugin = nvfp4\n[format nvs]\nplugin = nvfp4\nswizzle = true\n"
      "[role linear:input:c]\nrowwise = nv\n[role linear:input:s]\nrowwise = nvs\n");
  const int64_t rows = 320, K = 800; /* as test_fused_exact: 13 k-steps, the ring wraps */
  hq_tensor x = hq_test_tensor(HQ_F32, rows, K, 993, 1.0f);
  float *xf = x.data;
  uint64_t s = 777;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t b = 0; b < K / 16; b++) {
      const int e = (int)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 29;
      for (int64_t q = 0; q < 16; q++) xf[i * K + 16 * b + q] *= ldexpf(1.0f, e - 20);
    }
  for (int64_t q = 0; q < 16; q++) xf[5 * K + 64 + q] = 0.0f; /* a zero block */
  hq_tensor w = hq_test_empty(HQ_BF16, K, K);
  for (int64_t j = 0; j < K; j++) hq_store_hp(w.data, j * K + j, HQ_BF16, 1.0f);
  hq_tensor xg = to_gpu(&x), wg = to_gpu(&w);
  for (int v = 0; v < 2; v++) {
    hq_quantizer *q = hq_test_quantizer(r, v ? "linear:input:s" : "linear:input:c");
    hq_qtensor *qx = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qx));
    const hq_storage *st = hq_qtensor_storage(qx, HQ_ROWWISE);
    const hq_buffer *bd, *bs, *ba;
    uint8_t *data = storage_buf(st, HQ_ROLE_DATA, &bd), *sc = storage_buf(st, HQ_ROLE_SCALE, &bs);
    uint8_t *am = storage_buf(st, HQ_ROLE_AMAX, &ba);
    const int64_t ld = bs->shape[1];
    const int64_t nan_at = v ? hq_swizzle_offset(9, 3, ld) : 9 * ld + 3;
    const int64_t neg_at = v ? hq_swizzle_offset(200, 5, ld) : 200 * ld + 5;
    sc[nan_at] = 0x7f; /* E4M3 NaN */
    sc[neg_at] = 0xb8; /* -1.0 */
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, (uint8_t *)bs->ptr + nan_at, hq_ctx_device(gpu), sc + nan_at,
                                HQ_DEVICE_HOST, 1));
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, (uint8_t *)bs->ptr + neg_at, hq_ctx_device(gpu), sc + neg_at,
                                HQ_DEVICE_HOST, 1));
    float amax;
    memcpy(&amax, am, 4);
    const float f = hq_nvfp4_tensor_factor(amax);
    int64_t zero_sf = 0, sub_sf = 0;
    for (int64_t i = 0; i < rows; i++)
      for (int64_t b = 0; b < K / 16; b++) {
        const uint8_t e = sc[v ? hq_swizzle_offset(i, b, ld) : i * ld + b];
        zero_sf += e == 0;
        sub_sf += e > 0 && e < 8;
      }
    assert_true(zero_sf > 10 && sub_sf > 10); /* the data reached the edges it is meant to */
    for (int orient = 0; orient < 2; orient++) {
      hq_tensor out[2];
      fused_and_emulated(qx, &wg, orient, rows, K, out);
      const float *fd = out[0].data, *em = out[1].data;
      int64_t checked = 0;
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < K; j++) {
          const int64_t e = orient ? i * K + j : j * rows + i; /* D's element of X(i, j) */
          if (i == 9) { /* the NaN scale: NaN * 0 spreads along X's row 9 */
            if (!isnan(fd[e]) || !isnan(em[e]))
              fail_msg("%s orient %d: X(9, %lld): fused %g, emulated %g, expected NaN",
                       v ? "swizzled" : "compact", orient, (long long)j, fd[e], em[e]);
            continue;
          }
          const uint32_t code = (data[i * (K / 2) + j / 2] >> (4 * (j & 1))) & 15u;
          const uint8_t sf = sc[v ? hq_swizzle_offset(i, j / 16, ld) : i * ld + j / 16];
          const float raw = hq_mul_rn(hq_e2m1_to_f32(code), hq_fp8_to_f32(sf, HQ_E4M3));
          const float ref = hq_mul_rn(f, raw);
          if (ref == 0.0f) {
            if (fd[e] != 0.0f || em[e] != 0.0f)
              fail_msg("%s orient %d: X(%lld, %lld): fused %a, emulated %a, expected 0",
                       v ? "swizzled" : "compact", orient, (long long)i, (long long)j, fd[e],
                       em[e]);
          } else if (memcmp(&fd[e], &ref, 4) || memcmp(&em[e], &ref, 4)) {
            fail_msg("%s orient %d: X(%lld, %lld) (code %x, scale %02x): fused %a, emulated %a, "
                     "expected %a", v ? "swizzled" : "compact", orient, (long long)i,
                     (long long)j, code, sf, fd[e], em[e], ref);
          }
          checked++;
        }
      printf("fused exact: nvfp4 %s scales, D %s: %lld values equal to f * raw, bit for bit "
             "(%lld zero and %lld subnormal scales)\n", v ? "swizzled" : "compact",
             orient ? "= X (X as B)" : "= X^T (X as A)", (long long)checked, (long long)zero_sf,
             (long long)sub_sf);
      free(out[0].data);
      free(out[1].data);
    }
    free(data);
    free(sc);
    free(am);
    hq_qtensor_free(qx);
    hq_quantizer_free(q);
  }
  hq_ctx_free(gpu, xg.data);
  hq_ctx_free(gpu, wg.data);
  free(x.data);
  free(w.data);
  hq_recipe_free(r);
}

/* The fused path with an MXFP4 / MXFP6 operand (Hopper): storages whose bytes are written here --
   random codes (every code point), E8M0 scales 0..128 on the first 128 rows (one multiply in the
   kernel) and 0..250 on the rest (two multiplies; 250 keeps 28 * 2^123 below BF16's maximum), a
   NaN scale at row 9 -- times an identity BF16 W, both orientations, D (F32) against
   RN_bf16(elem(q) * 2^(e-127)) computed here from the bytes with hq/numerics.h's decoders, bit
   for bit, and the unfused emulated path alike. 320 rows: a partial last row tile, whose scale
   rows the storage does not have. MXFP4 K = 800 (a half last k-step: its second scale past the
   row), MXFP6 K = 832 (the kernel's FP6 rows need K % 64 == 0). */
static void test_fused_mx_exact(void **state) {
  (void)state;
  if (g_arch != 90) skip();
  hq_recipe *r = hq_test_recipe(
      "[format m4]\nplugin = mxfp4\n[format m6a]\nplugin = mxfp6\nelem = e3m2\n"
      "[format m6b]\nplugin = mxfp6\nelem = e2m3\n"
      "[role linear:input:m4]\nrowwise = m4\n[role linear:input:m6a]\nrowwise = m6a\n"
      "[role linear:input:m6b]\nrowwise = m6b\n");
  static const char *const roles[3] = {"linear:input:m4", "linear:input:m6a", "linear:input:m6b"};
  static const char *const names[3] = {"mxfp4", "mxfp6 e3m2", "mxfp6 e2m3"};
  const int kinds[3] = {HQ_E2M1X2, HQ_E3M2X4, HQ_E2M3X4};
  const int64_t rows = 320;
  for (int v = 0; v < 3; v++) {
    const int64_t K = v ? 832 : 800;
    hq_tensor x = hq_test_tensor(HQ_F32, rows, K, 995 + v, 1.0f);
    hq_tensor w = hq_test_empty(HQ_BF16, K, K);
    for (int64_t j = 0; j < K; j++) hq_store_hp(w.data, j * K + j, HQ_BF16, 1.0f);
    hq_tensor xg = to_gpu(&x), wg = to_gpu(&w);
    hq_quantizer *q = hq_test_quantizer(r, roles[v]);
    hq_qtensor *qx = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qx));
    const hq_storage *st = hq_qtensor_storage(qx, HQ_ROWWISE);
    const hq_buffer *bd = hq_gpu_buf_of(st, HQ_ROLE_DATA), *bs = hq_gpu_buf_of(st, HQ_ROLE_SCALE);
    const int64_t rb = v ? K / 4 * 3 : K / 2, nb = K / 32;
    assert_int_equal(bd->bytes, (size_t)(rows * rb));
    assert_int_equal(bs->bytes, (size_t)(rows * nb));
    uint8_t *data = malloc(bd->bytes), *sc = malloc(bs->bytes);
    assert_non_null(data);
    assert_non_null(sc);
    uint64_t s = 4321 + (uint64_t)v;
    for (size_t n = 0; n < bd->bytes; n++) data[n] = (uint8_t)(hq_test_rand(&s) >> 24);
    for (int64_t i = 0; i < rows; i++)
      for (int64_t b = 0; b < nb; b++)
        sc[i * nb + b] = (uint8_t)((hq_test_rand(&s) >> 24) % (i < 128 ? 129 : 251));
    sc[9 * nb + 3] = 0xFF;
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, bd->ptr, hq_ctx_device(gpu), data, HQ_DEVICE_HOST, bd->bytes));
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, bs->ptr, hq_ctx_device(gpu), sc, HQ_DEVICE_HOST, bs->bytes));
    for (int orient = 0; orient < 2; orient++) {
      hq_tensor out[2];
      fused_and_emulated(qx, &wg, orient, rows, K, out);
      const float *fd = out[0].data, *em = out[1].data;
      int64_t checked = 0;
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < K; j++) {
          const int64_t e = orient ? i * K + j : j * rows + i; /* D's element of X(i, j) */
          if (i == 9) { /* the NaN scale: NaN * 0 spreads along X's row 9 */
            if (!isnan(fd[e]) || !isnan(em[e]))
              fail_msg("%s orient %d: X(9, %lld): fused %g, emulated %g, expected NaN", names[v],
                       orient, (long long)j, fd[e], em[e]);
            continue;
          }
          const uint8_t *row = data + i * rb;
          const uint32_t code = v ? hq_fp6_code(row, j) : (row[j / 2] >> (4 * (j & 1))) & 15u;
          const float val = v ? hq_fp6_to_f32(code, kinds[v]) : hq_e2m1_to_f32(code);
          const uint8_t sf = sc[i * nb + j / 32];
          const float ref = hq_bf16_to_f32(hq_f32_to_bf16(hq_mul_rn(val, hq_e8m0_to_f32(sf))));
          if (ref == 0.0f) { /* a -0 code sums with +0 products to +0 on either path */
            if (fd[e] != 0.0f || em[e] != 0.0f)
              fail_msg("%s orient %d: X(%lld, %lld): fused %a, emulated %a, expected 0",
                       names[v], orient, (long long)i, (long long)j, fd[e], em[e]);
          } else if (memcmp(&fd[e], &ref, 4) || memcmp(&em[e], &ref, 4)) {
            fail_msg("%s orient %d: X(%lld, %lld) (code %x, scale %02x): fused %a, emulated %a, "
                     "expected %a", names[v], orient, (long long)i, (long long)j, code, sf, fd[e],
                     em[e], ref);
          }
          checked++;
        }
      printf("fused exact: %s, D %s: %lld values equal to RN_bf16(elem * 2^(e-127)), bit for "
             "bit\n", names[v], orient ? "= X (X as B)" : "= X^T (X as A)", (long long)checked);
      free(out[0].data);
      free(out[1].data);
    }
    free(data);
    free(sc);
    hq_qtensor_free(qx);
    hq_quantizer_free(q);
    hq_ctx_free(gpu, xg.data);
    hq_ctx_free(gpu, wg.data);
    free(x.data);
    free(w.data);
  }
  hq_recipe_free(r);
}

/* nvfp4's own GEMM (its gemm op; Hopper, at most 2^25 multiply-adds): the three GEMMs of layers
   whose shapes leave partial 32 x 32 tiles and k over several 256-element chunks (fprop k = 800:
   four, the last partial), every scale form the kernel decodes (compact and swizzled, E4M3 and
   UE5M3, no global scale, RHT on both wgrad operands, 16x16 weight blocks), row-scaled operands
   (both, or the weight against per-tensor ones), D f32 and bf16, beta and a bias: the module
   reports an emulated BF16 product, and its D agrees with the F64 reference and the CPU path
   (run_case) and with the core's emulated path (HQ_GEMM_FORCE_EMULATED: dequantize, then
   cuBLASLt) within two FP32 accumulations. A problem above 2^25 multiply-adds takes the emulated
   path. */
static void test_nvfp4_module_gemm(void **state) {
  (void)state;
  if (g_arch / 10 != 9) {
    printf("nvfp4 module GEMM: compute capability %d.%d has none (skipped)\n", g_arch / 10,
           g_arch % 10);
    return;
  }
  hq_recipe *r = gemm_recipe();
  const char *names[] = {"nvfp4",    "nvfp4_rht", "nvfp4_sw",  "nvfp4_ue",
                         "nvfp4_ut", "nvfp4_row", "nvfp4_rmix"};
  const int64_t shapes[][3] = {{256, 256, 256}, {96, 800, 48}, {80, 48, 112}}; /* tokens, in,
                                                                                  out */
  int n_cases = 0;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      if (g_quick && s > 1) break;
      layer L;
      layer_make(r, names[i], shapes[s][0], shapes[s][1], shapes[s][2], 900 + 10 * i + s, &L);
      const int row_w = !strcmp(names[i], "nvfp4_row") || !strcmp(names[i], "nvfp4_rmix");
      for (int g = 0; g < 3; g++) {
        char what[96];
        snprintf(what, sizeof what, "%s %lldx%lldx%lld %s", names[i], (long long)shapes[s][0],
                 (long long)shapes[s][1], (long long)shapes[s][2], gemm_name[g]);
        gcase c = layer_case(&L, g, what);
        c.path = HQ_GEMM_PATH_EMULATED_BF16;
        if (g == DGRAD) c.ddt = HQ_BF16, c.beta = 0.5f, c.bias_dt = HQ_F32;
        if (g == WGRAD) c.alpha = 0.75f, c.bias_dt = HQ_BF16;
        c.provider = "nvfp4";
        c.vs_forced = 1; /* the core's emulated path agrees within its bounds */
        run_case(&c);
        /* the native provider's reason; a fused path where the caller asks for one */
        hq_gemm_info info = {.struct_size = sizeof info};
        HQ_OK_OR_FAIL(hq_gemm_plan(gpu, c.ag, c.ta, c.bg, c.tb, NULL, NULL, &info));
        if (!strstr(info.reason, "cublaslt")) fail_msg("%s: reason '%s'", what, info.reason);
        if (g == FPROP && !row_w) {
          /* the module leaves its emulated product to the providers under FUSED_ALWAYS: the
             fused kernel, which reads an operand with E4M3 scales (not row-scaled; nvfp4_ut's
             operands both have UE5M3 ones) and k in whole 32-element steps (fprop's k is the
             layer's input width: 48 is not); else the core's emulated path */
          const int fused = strcmp(names[i], "nvfp4_ut") != 0 && shapes[s][1] % 32 == 0;
          hq_gemm_args args;
          args_init(&args, NULL, 0, what);
          args.flags = HQ_GEMM_FUSED_ALWAYS;
          HQ_OK_OR_FAIL(hq_gemm_plan(gpu, c.ag, c.ta, c.bg, c.tb, NULL, &args, &info));
          if (info.path != (fused ? HQ_GEMM_PATH_FUSED_BF16 : HQ_GEMM_PATH_EMULATED_BF16))
            fail_msg("%s, fused always: path %s, provider %s (%s)", what,
                     hq_gemm_path_name(info.path), info.provider, info.reason);
          assert_string_not_equal(info.provider, "nvfp4");
        }
        n_cases++;
      }
      layer_free(&L);
    }
  }
  /* 512 x 512 x 256: 2^26 multiply-adds, declined to the emulated path; the reason is the native
     provider's, as it is when the module runs it */
  layer L;
  layer_make(r, "nvfp4", 512, 256, 512, 990, &L);
  gcase c = layer_case(&L, FPROP, "nvfp4 512x256x512 fprop");
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gemm_plan(gpu, c.ag, c.ta, c.bg, c.tb, NULL, NULL, &info));
  assert_string_not_equal(info.provider, "nvfp4");
  assert_int_equal(info.path, HQ_GEMM_PATH_EMULATED_BF16);
  if (!strstr(info.reason, "cublaslt")) fail_msg("reason: %s", info.reason);
  layer_free(&L);
  printf("nvfp4 module GEMM: %d GEMMs agree with the reference, the CPU path and the core's "
         "emulated path\n", n_cases);
  hq_recipe_free(r);
}

/* The modules' own small GEMMs where D's rows do not start at multiples of 4 elements
   (fp8_block's 2-D x 2-D at m = 29 and 30: the epilogue's element-wise form,
   small_gemm_cuda.h) and where they do with partial tiles (fp8_block at m = 36, n = 20; nvfp4,
   whose rows are multiples of 16, at m = 48, n = 80, with per-row factors on both operands too:
   its 4-element form), D F32 alone and BF16 with beta and a bias: D agrees with the F64
   reference, the CPU path and the core's emulated path as in run_case. */
static void test_module_gemm_odd_m(void **state) {
  (void)state;
  if (g_arch / 10 != 9) {
    printf("module GEMMs, odd m: compute capability %d.%d has none (skipped)\n", g_arch / 10,
           g_arch % 10);
    return;
  }
  hq_recipe *r = gemm_recipe();
  static const struct {
    const char *role, *provider;
    int64_t m, n, k;
  } cases[] = {{"linear:weight:fp8_block_2d2d", "fp8_block", 29, 37, 64},
               {"linear:weight:fp8_block_2d2d", "fp8_block", 30, 33, 256},
               {"linear:weight:fp8_block_2d2d", "fp8_block", 36, 20, 128},
               {"linear:weight:nvfp4", "nvfp4", 48, 80, 64},
               {"linear:weight:nvfp4_row", "nvfp4", 48, 80, 64}};
  int n_cases = 0;
  for (size_t f = 0; f < sizeof cases / sizeof *cases; f++)
    for (int bf = 0; bf < 2; bf++) {
      const int64_t m = cases[f].m, n = cases[f].n, k = cases[f].k;
      qop A, B;
      /* both operands k-contiguous (A [m, k] transposed, B [n, k]): the modules' layout */
      qop_make(r, cases[f].role, hq_test_tensor(HQ_BF16, m, k, 3100 + f, 1.0f), &A);
      qop_make(r, cases[f].role, hq_test_tensor(HQ_BF16, n, k, 3200 + f, 1.0f), &B);
      char what[128];
      snprintf(what, sizeof what, "%s m=%lld n=%lld k=%lld", cases[f].role, (long long)m,
               (long long)n, (long long)k);
      gcase c;
      memset(&c, 0, sizeof c);
      c.what = what;
      c.ag = hq_operand_q(A.g), c.bg = hq_operand_q(B.g);
      c.ac = hq_operand_q(A.c), c.bc = hq_operand_q(B.c);
      c.af = A.deq[0], c.bf = B.deq[0];
      c.ta = 1, c.tb = 0, c.a1 = k, c.b1 = k, c.m = m, c.n = n, c.k = k;
      c.ddt = bf ? HQ_BF16 : HQ_F32;
      c.alpha = 0.75f;
      c.beta = bf ? 0.5f : 0.0f;
      c.bias_dt = bf ? HQ_F32 : 0;
      c.provider = cases[f].provider;
      c.fp8_native = !strcmp(cases[f].provider, "fp8_block");
      c.vs_forced = 1;
      run_case(&c);
      qop_free(&A);
      qop_free(&B);
      n_cases++;
    }
  printf("module GEMMs, odd m: %d GEMMs agree with the reference, the CPU path and the core's "
         "emulated path\n", n_cases);
  hq_recipe_free(r);
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats_linear),
      cmocka_unit_test(test_bias_beta_dtypes),
      cmocka_unit_test(test_hybrid_equal_bitwise),
      cmocka_unit_test(test_f32_is_fp32),
      cmocka_unit_test(test_odd_shapes),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_fused_exact),
      cmocka_unit_test(test_fused_short_k),
      cmocka_unit_test(test_fused_nvfp4_exact),
      cmocka_unit_test(test_fused_mx_exact),
      cmocka_unit_test(test_amax_d),
      cmocka_unit_test(test_nvfp4_module_gemm),
      cmocka_unit_test(test_module_gemm_odd_m),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
