/*
** test_gpu_train_ops.c -- the trainer's CUDA kernels (train/ops_cuda.cu, the table of
** train/device.h) against references computed here on the host in double: the embedding and its
** gradient, the activations and their gradients (tanh and GELU), the bias gradient's column sums
** and the softmax cross-entropy, at shapes that take the vector and the scalar paths, one band
** and many. The activations and the cross-entropy add a nonzero bias to what they read (the
** layer's output holds none), checked against the FP32 sum made here. Each fused amax equals
** max |x| of what the kernel wrote (NaN ignored, Inf counted), bit for bit, NaN and Inf cases
** included, and equals hq_quantizer_amax of an fp8_tensor (current scaling) quantizer; a
** quantize given it makes the same bytes as one that computes its own. Every kernel run twice
** gives the same bytes. An activation of elements that are not whole rows is refused. The upload
** of the batch and the optimizer's constants from page-locked memory read in place equals the
** host's values. Exit 77 without a CUDA device.
*/
#include "hq_test.h"
#include "hq_gpu_test.h"

#include <string.h>

#include "device.h"

static hq_ctx *gpu;
static const train_device_ops *ops;
static void *scratch;

#define V 27

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes ? bytes : 4, &p));
  return p;
}
static void up(void *d, const void *h, size_t bytes) {
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, d, hq_ctx_device(gpu), h, HQ_DEVICE_HOST, bytes));
}
static void down(void *h, const void *d, size_t bytes) {
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, h, HQ_DEVICE_HOST, d, hq_ctx_device(gpu), bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
}
static float *fill_normal(int64_t n, uint64_t seed, float scale) {
  float *h = malloc((size_t)n * sizeof *h);
  for (int64_t i = 0; i < n; i++) h[i] = scale * hq_test_normal(&seed);
  return h;
}

/* max |x| over x[0, n) with NaN skipped and Inf counted: written out here, not device.h's step */
static float host_amax(const float *x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(x[i])) continue;
    const float a = x[i] < 0 ? -x[i] : x[i];
    if (a > m) m = a;
  }
  return m;
}

/* the fused amax pair on the device, zeroed */
static float *amax_pair(void) {
  float *a = dev_alloc(2 * sizeof(float));
  HQ_OK_OR_FAIL(hq_ctx_memset(gpu, a, 0, 2 * sizeof(float)));
  return a;
}

/* quantizing t with the amax pair a (device) makes the bytes of a quantize that takes its own */
static void same_quantize(hq_quantizer *q, const hq_tensor *t, const float *a, const char *what) {
  hq_qtensor *own = NULL, *given = hq_test_quantize_ex(q, gpu, t, a);
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, t, &own));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *s0 = hq_qtensor_storage(own, dir), *s1 = hq_qtensor_storage(given, dir);
    assert_int_equal(s0->nbuf, s1->nbuf);
    for (uint32_t i = 0; i < s0->nbuf; i++) {
      const hq_buffer *b0 = hq_storage_cbuf(s0, i), *b1 = hq_storage_cbuf(s1, i);
      assert_int_equal(b0->bytes, b1->bytes);
      uint8_t *h0 = malloc(b0->bytes), *h1 = malloc(b0->bytes);
      down(h0, b0->ptr, b0->bytes);
      down(h1, b1->ptr, b1->bytes);
      if (memcmp(h0, h1, b0->bytes)) fail_msg("%s: the quantized bytes differ (buffer %u)", what, i);
      free(h0);
      free(h1);
    }
  }
  hq_qtensor_free(own);
  hq_qtensor_free(given);
}

/* both floats of the device pair `a` are, bit for bit, max |x| of the device tensor x[0, n) as
   computed here and as hq_quantizer_amax of fp8_tensor with current scaling computes it; and
   quantizing x with the pair gives the bytes of quantizing it without */
static void check_amax(const float *a, const float *x_dev, int64_t rows, int64_t cols,
                       const char *what) {
  const int64_t n = rows * cols;
  float got[2], want, core[2];
  float *x = malloc((size_t)n * sizeof *x);
  down(got, a, sizeof got);
  down(x, x_dev, (size_t)n * sizeof *x);
  want = host_amax(x, n);
  free(x);
  if (memcmp(&got[0], &want, 4) || memcmp(&got[1], &want, 4))
    fail_msg("%s: fused amax %a, %a; max |x| %a", what, got[0], got[1], want);

  hq_recipe *r = hq_test_recipe("[format f8]\nplugin = fp8_tensor\ndtype = e4m3\n"
                                "[role *:*:*]\nrowwise = f8\ncolumnwise = f8\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:fc1");
  hq_quantizer_set_usage(q, HQ_BOTH);
  assert_int_equal(hq_quantizer_amax_kind(q, HQ_ROWWISE), HQ_AMAX_INPUT);
  hq_tensor t = hq_tensor_2d((void *)x_dev, HQ_F32, hq_ctx_device(gpu), rows, cols);
  float *ca = dev_alloc(2 * sizeof(float));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, &t, ca));
  down(core, ca, sizeof core);
  if (memcmp(core, got, sizeof core))
    fail_msg("%s: fused amax %a, %a; hq_quantizer_amax %a, %a", what, got[0], got[1], core[0],
             core[1]);
  /* (an amax of Inf has no finite scale: what a format makes of it is not this test's) */
  if (isfinite(want)) same_quantize(q, &t, a, what);
  hq_ctx_free(gpu, ca);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* the device buffers a and b of n bytes are equal */
static void same_bytes(const void *a, const void *b, size_t n, const char *what) {
  uint8_t *ha = malloc(n), *hb = malloc(n);
  down(ha, a, n);
  down(hb, b, n);
  if (memcmp(ha, hb, n)) fail_msg("%s: two runs differ", what);
  free(ha);
  free(hb);
}

/* |got - want| <= tol * scale for every element */
static void close_to(const float *got, const double *want, int64_t n, double abs_tol,
                     double rel_tol, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    const double tol = abs_tol + rel_tol * fabs(want[i]);
    if (!(fabs((double)got[i] - want[i]) <= tol))
      fail_msg("%s: element %lld: %.9g, expected %.9g", what, (long long)i, got[i], want[i]);
  }
}

// --- activations --------------------------------------------------------------------------------

static double ref_act(int act, double y) {
  if (act == TRAIN_ACT_TANH) return tanh(y);
  const double k = 0.7978845608028654; /* sqrt(2 / pi) */
  return 0.5 * y * (1.0 + tanh(k * (y + 0.044715 * y * y * y)));
}
static double ref_act_grad(int act, double y) {
  if (act == TRAIN_ACT_TANH) return 1.0 - tanh(y) * tanh(y);
  const double k = 0.7978845608028654, u = k * (y + 0.044715 * y * y * y), t = tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * y * y);
}

/* y [rows, cols] and the bias [cols] from `offset` floats into their buffers (offset 1: not
   16-byte aligned, the scalar path, as is a cols not a multiple of 4). The expected outputs take
   act of y + b summed here in FP32 (the kernels' one rounding), then in double. */
static void act_case(int act, int64_t rows, int64_t cols, int offset) {
  char what[128];
  const int64_t n = rows * cols;
  const int64_t vr = n % 1024 ? 1 : n / 1024;   /* the quantize's view of the n elements */
  float *y = fill_normal(n, 11 + (uint64_t)n, 2.0f), *d = fill_normal(n, 12 + (uint64_t)n, 1.0f);
  float *b = fill_normal(cols, 13 + (uint64_t)cols, 1.0f);
  float *yd = dev_alloc((size_t)(n + offset) * 4), *hd = dev_alloc((size_t)(n + offset) * 4);
  float *dd = dev_alloc((size_t)(n + offset) * 4), *h2 = dev_alloc((size_t)(n + offset) * 4);
  float *bd = dev_alloc((size_t)(cols + offset) * 4);
  float *got = malloc((size_t)n * 4);
  double *want = malloc((size_t)n * 8);
  up(yd + offset, y, (size_t)n * 4);
  up(dd + offset, d, (size_t)n * 4);
  up(bd + offset, b, (size_t)cols * 4);
  const float *bo = bd + offset;

  snprintf(what, sizeof what, "%s fwd rows %lld cols %lld offset %d", act ? "gelu" : "tanh",
           (long long)rows, (long long)cols, offset);
  float *a = amax_pair();
  HQ_OK_OR_FAIL(ops->act_fwd(gpu, act, yd + offset, bo, cols, hd + offset, n, a));
  down(got, hd + offset, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++) {
    const float v = y[i] + b[i % cols];
    want[i] = ref_act(act, v);
  }
  close_to(got, want, n, 2e-6, 2e-5, what);
  check_amax(a, hd + offset, vr, n / vr, what);
  HQ_OK_OR_FAIL(ops->act_fwd(gpu, act, yd + offset, bo, cols, h2 + offset, n, NULL));
  same_bytes(hd + offset, h2 + offset, (size_t)n * 4, what);

  snprintf(what, sizeof what, "%s bwd rows %lld cols %lld offset %d", act ? "gelu" : "tanh",
           (long long)rows, (long long)cols, offset);
  HQ_OK_OR_FAIL(hq_ctx_memset(gpu, a, 0, 8));
  HQ_OK_OR_FAIL(ops->act_bwd(gpu, act, yd + offset, bo, cols, dd + offset, n, a));
  down(got, dd + offset, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++) {
    const float v = y[i] + b[i % cols];
    want[i] = d[i] * ref_act_grad(act, v);
  }
  close_to(got, want, n, 1e-5, 2e-5, what);
  check_amax(a, dd + offset, vr, n / vr, what);
  up(h2 + offset, d, (size_t)n * 4);
  HQ_OK_OR_FAIL(ops->act_bwd(gpu, act, yd + offset, bo, cols, h2 + offset, n, NULL));
  same_bytes(dd + offset, h2 + offset, (size_t)n * 4, what);

  void *bufs[] = {yd, hd, dd, h2, bd, a};
  for (size_t i = 0; i < 6; i++) hq_ctx_free(gpu, bufs[i]);
  free(y);
  free(d);
  free(b);
  free(got);
  free(want);
}

static void test_activations(void **state) {
  (void)state;
  for (int act = 0; act < 2; act++) {
    act_case(act, 1024, 1024, 0);   /* float4 steps */
    /* more float4 steps than the grid has threads: each thread's bias column moves along
       rows of 250 vectors by the grid's stride */
    act_case(act, 4096, 1000, 0);
    act_case(act, 3001, 333, 0);    /* rows not whole float4s: scalar, several steps a thread */
    act_case(act, 5, 820, 1);       /* not aligned: one element at a time */
    act_case(act, 333, 30, 0);      /* the lm_head's width less its padding: scalar */
    act_case(act, 1, 3, 0);         /* less than a float4 */
  }
  /* elements that are not whole rows, and rows of no column, are refused before any launch,
     saying so */
  float *buf = dev_alloc(64 * sizeof(float));
  assert_int_equal(ops->act_fwd(gpu, TRAIN_ACT_GELU, buf, buf, 4, buf + 16, 10, NULL), -1);
  if (!strstr(ops->error(), "activation: 10 elements are not rows of 4"))
    fail_msg("act_fwd's refusal says '%s'", ops->error());
  assert_int_equal(ops->act_bwd(gpu, TRAIN_ACT_TANH, buf, buf, 0, buf + 16, 8, NULL), -1);
  if (!strstr(ops->error(), "activation: 8 elements are not rows of 0"))
    fail_msg("act_bwd's refusal says '%s'", ops->error());
  hq_ctx_free(gpu, buf);
}

/* NaN and Inf: an amax ignores NaN and counts Inf; all NaN (or all 0) gives 0 */
static void test_amax_nonfinite(void **state) {
  (void)state;
  const int64_t n = 1000, cols = 100;
  float *h = fill_normal(n, 5, 1.0f), *b = fill_normal(cols, 6, 0.5f);
  float *yd = dev_alloc(n * 4), *hd = dev_alloc(n * 4), *bd = dev_alloc(cols * 4);
  h[17] = NAN;
  h[400] = -NAN;
  up(yd, h, n * 4);
  up(bd, b, cols * 4);
  float *a = amax_pair();
  /* tanh: NaN in, NaN out (ignored); the others below 1 */
  HQ_OK_OR_FAIL(ops->act_fwd(gpu, TRAIN_ACT_TANH, yd, bd, cols, hd, n, a));
  check_amax(a, hd, 1, n, "tanh with NaN");
  /* the gradient: d holds -Inf at one place, NaN at others: amax +Inf */
  h[123] = -INFINITY;
  up(hd, h, n * 4);
  HQ_OK_OR_FAIL(hq_ctx_memset(gpu, a, 0, 8));
  HQ_OK_OR_FAIL(ops->act_bwd(gpu, TRAIN_ACT_TANH, yd, bd, cols, hd, n, a));
  float got[2];
  down(got, a, sizeof got);
  assert_true(isinf(got[0]) && got[0] > 0 && isinf(got[1]));
  check_amax(a, hd, 1, n, "tanh gradient with NaN and -Inf");
  /* GELU of +Inf (+ a finite bias) is +Inf */
  h[600] = INFINITY;
  up(yd, h, n * 4);
  HQ_OK_OR_FAIL(hq_ctx_memset(gpu, a, 0, 8));
  HQ_OK_OR_FAIL(ops->act_fwd(gpu, TRAIN_ACT_GELU, yd, bd, cols, hd, n, a));
  check_amax(a, hd, 1, n, "gelu with NaN and Inf");
  down(got, a, sizeof got);
  assert_true(isinf(got[0]) && got[0] > 0);
  /* every element NaN: 0 */
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  up(yd, h, n * 4);
  HQ_OK_OR_FAIL(hq_ctx_memset(gpu, a, 0, 8));
  HQ_OK_OR_FAIL(ops->act_fwd(gpu, TRAIN_ACT_GELU, yd, bd, cols, hd, n, a));
  down(got, a, sizeof got);
  assert_true(got[0] == 0.0f && got[1] == 0.0f && !signbit(got[0]));
  hq_ctx_free(gpu, yd);
  hq_ctx_free(gpu, hd);
  hq_ctx_free(gpu, bd);
  hq_ctx_free(gpu, a);
  free(h);
  free(b);
}

// --- embedding ----------------------------------------------------------------------------------

static void embed_case(int64_t B, int C, int E) {
  char what[96];
  snprintf(what, sizeof what, "embedding B %lld C %d E %d", (long long)B, C, E);
  const int64_t rows = B * C, n = rows * E;
  float *emb = fill_normal(V * E, 21, 1.0f), *dx = fill_normal(n, 22, 1.0f);
  int32_t *tok = malloc((size_t)rows * 4);
  uint64_t s = 23;
  for (int64_t r = 0; r < rows; r++) tok[r] = (int32_t)(hq_test_rand(&s) % V);
  float *embd = dev_alloc(V * E * 4), *xd = dev_alloc((size_t)n * 4), *dxd = dev_alloc((size_t)n * 4);
  float *g1 = dev_alloc(V * E * 4), *g2 = dev_alloc(V * E * 4);
  int32_t *tokd = dev_alloc((size_t)rows * 4);
  up(embd, emb, V * E * 4);
  up(dxd, dx, (size_t)n * 4);
  up(tokd, tok, (size_t)rows * 4);

  float *a = amax_pair();
  HQ_OK_OR_FAIL(ops->embed_fwd(gpu, embd, tokd, xd, B, C, E, a));
  float *x = malloc((size_t)n * 4);
  down(x, xd, (size_t)n * 4);
  for (int64_t r = 0; r < rows; r++)
    if (memcmp(x + r * E, emb + (int64_t)tok[r] * E, (size_t)E * 4))
      fail_msg("%s: row %lld is not token %d's", what, (long long)r, tok[r]);
  check_amax(a, xd, rows, E, what);

  HQ_OK_OR_FAIL(ops->embed_bwd(gpu, dxd, tokd, g1, B, C, E, scratch));
  HQ_OK_OR_FAIL(ops->embed_bwd(gpu, dxd, tokd, g2, B, C, E, scratch));
  same_bytes(g1, g2, V * E * 4, what);
  double *want = calloc((size_t)V * E, 8), *mag = calloc((size_t)V * E, 8);
  for (int64_t r = 0; r < rows; r++)
    for (int e = 0; e < E; e++) {
      want[tok[r] * E + e] += dx[r * E + e];
      mag[tok[r] * E + e] += fabs(dx[r * E + e]);
    }
  float *g = malloc((size_t)V * E * 4);
  down(g, g1, V * E * 4);
  /* an FP32 chain of k additions errs by at most k * 2^-24 times the sum of magnitudes; the
     longest chain of a banded sum: a row group's share of a band, the groups, the bands */
  for (int64_t i = 0; i < V * E; i++)
    if (!(fabs(g[i] - want[i]) <= 1e-6 + ((double)rows / 8 + 136) * 6e-8 * mag[i]))
      fail_msg("%s: gemb[%lld] %.9g, expected %.9g", what, (long long)i, g[i], want[i]);
  void *bufs[] = {embd, xd, dxd, g1, g2, tokd, a};
  for (size_t i = 0; i < 7; i++) hq_ctx_free(gpu, bufs[i]);
  free(emb);
  free(dx);
  free(tok);
  free(x);
  free(want);
  free(mag);
  free(g);
}

static void test_embedding(void **state) {
  (void)state;
  embed_case(4096, 8, 64);   /* many bands, float4 copies, two column tiles */
  embed_case(300, 3, 6);     /* scalar copies, a partial column tile */
  embed_case(2, 1, 100);     /* one band: stage 1 writes the gradient itself */
}

// --- bias gradient ------------------------------------------------------------------------------

static void colsum_case(int64_t B, int64_t n, int offset) {
  char what[96];
  snprintf(what, sizeof what, "colsum B %lld n %lld offset %d", (long long)B, (long long)n, offset);
  float *dy = fill_normal(B * n, 31 + (uint64_t)n, 1.0f);
  float *dyd = dev_alloc((size_t)(B * n + offset) * 4), *d1 = dev_alloc((size_t)n * 4);
  float *d2 = dev_alloc((size_t)n * 4);
  up(dyd + offset, dy, (size_t)(B * n) * 4);
  HQ_OK_OR_FAIL(ops->colsum(gpu, dyd + offset, B, n, d1, scratch));
  HQ_OK_OR_FAIL(ops->colsum(gpu, dyd + offset, B, n, d2, scratch));
  same_bytes(d1, d2, (size_t)n * 4, what);
  double *want = calloc((size_t)n, 8), *mag = calloc((size_t)n, 8);
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < n; j++) {
      want[j] += dy[b * n + j];
      mag[j] += fabs(dy[b * n + j]);
    }
  float *got = malloc((size_t)n * 4);
  down(got, d1, (size_t)n * 4);
  for (int64_t j = 0; j < n; j++)
    if (!(fabs(got[j] - want[j]) <= 1e-6 + ((double)B / 8 + 136) * 6e-8 * mag[j]))
      fail_msg("%s: db[%lld] %.9g, expected %.9g", what, (long long)j, got[j], want[j]);
  hq_ctx_free(gpu, dyd);
  hq_ctx_free(gpu, d1);
  hq_ctx_free(gpu, d2);
  free(dy);
  free(want);
  free(mag);
  free(got);
}

static void test_colsum(void **state) {
  (void)state;
  colsum_case(5000, 4096, 0);   /* float4 loads, many bands */
  colsum_case(5000, 4096, 1);   /* not aligned: one float each, the same bands */
  colsum_case(4096, 32, 0);     /* the lm_head's width */
  colsum_case(333, 30, 0);      /* not a multiple of 4 */
  colsum_case(1, 768, 0);       /* one row, one band */
}

// --- cross-entropy ------------------------------------------------------------------------------

/* V classes of Vpad columns; the bias is nonzero on the V classes and NaN on the padded
   columns, which no kernel may read. The expected values take the logits y + b summed here in
   FP32 (the kernels' one rounding). */
static void xent_case(int64_t B, int64_t n_valid, int nv, int Vpad) {
  char what[96];
  snprintf(what, sizeof what, "xent B %lld valid %lld V %d Vpad %d", (long long)B,
           (long long)n_valid, nv, Vpad);
  float *l = fill_normal(B * Vpad, 41, 3.0f), *bias = fill_normal(Vpad, 43, 2.0f);
  for (int v = nv; v < Vpad; v++) bias[v] = NAN;
  int32_t *t = malloc((size_t)B * 4);
  uint64_t s = 42;
  for (int64_t b = 0; b < B; b++) t[b] = (int32_t)(hq_test_rand(&s) % (uint64_t)nv);
  float *ld = dev_alloc((size_t)(B * Vpad) * 4), *dd = dev_alloc((size_t)(B * Vpad) * 4);
  float *d2 = dev_alloc((size_t)(B * Vpad) * 4), *lossd = dev_alloc(8);
  float *bd = dev_alloc((size_t)Vpad * 4);
  int32_t *td = dev_alloc((size_t)B * 4);
  up(ld, l, (size_t)(B * Vpad) * 4);
  up(bd, bias, (size_t)Vpad * 4);
  up(td, t, (size_t)B * 4);
  float *a = amax_pair();
  HQ_OK_OR_FAIL(ops->xent(gpu, ld, bd, td, B, n_valid, nv, Vpad, lossd, dd, a, scratch));
  float loss[2];
  down(&loss[0], lossd, 4);
  HQ_OK_OR_FAIL(ops->xent(gpu, ld, bd, td, B, n_valid, nv, Vpad, lossd, d2, NULL, scratch));
  same_bytes(dd, d2, (size_t)(B * Vpad) * 4, what);
  down(&loss[1], lossd, 4);
  assert_memory_equal(&loss[0], &loss[1], 4);
  /* eval: no gradient, the same loss */
  HQ_OK_OR_FAIL(ops->xent(gpu, ld, bd, td, B, n_valid, nv, Vpad, lossd, NULL, NULL, scratch));
  down(&loss[1], lossd, 4);
  assert_memory_equal(&loss[0], &loss[1], 4);

  double sum = 0;
  double *want = calloc((size_t)(B * Vpad), 8);
  float *r = malloc((size_t)nv * 4);
  for (int64_t b = 0; b < n_valid; b++) {
    /* the row's logits and their differences from the max in FP32 (as the rule takes them:
       exact max, rounded differences), everything after in double */
    for (int v = 0; v < nv; v++) r[v] = l[b * Vpad + v] + bias[v];
    float mx = r[0];
    double z = 0;
    for (int v = 1; v < nv; v++) mx = r[v] > mx ? r[v] : mx;
    for (int v = 0; v < nv; v++) z += exp((double)(float)(r[v] - mx));
    sum += log(z) + mx - r[t[b]];
    for (int v = 0; v < nv; v++)
      want[b * Vpad + v] = exp((double)(float)(r[v] - mx)) / z / (double)n_valid;
    want[b * Vpad + t[b]] -= 1.0 / (double)n_valid;
  }
  const double mean = n_valid ? sum / (double)n_valid : 0.0;
  if (!(fabs(loss[0] - mean) <= 1e-6 * fabs(mean) + 1e-7))
    fail_msg("%s: loss %.9g, expected %.9g", what, loss[0], mean);
  float *got = malloc((size_t)(B * Vpad) * 4);
  down(got, dd, (size_t)(B * Vpad) * 4);
  /* rows past n_valid and columns past V exactly 0 (want's zeros) */
  for (int64_t i = 0; i < B * Vpad; i++)
    if ((i / Vpad >= n_valid || i % Vpad >= nv) && got[i] != 0.0f)
      fail_msg("%s: padding element %lld is %g", what, (long long)i, got[i]);
  close_to(got, want, B * Vpad, 1e-9, 2e-6, what);
  check_amax(a, dd, B, Vpad, what);
  void *bufs[] = {ld, dd, d2, lossd, bd, td, a};
  for (size_t i = 0; i < 7; i++) hq_ctx_free(gpu, bufs[i]);
  free(l);
  free(bias);
  free(t);
  free(r);
  free(want);
  free(got);
}

static void test_xent(void **state) {
  (void)state;
  xent_case(32768, 32768, V, 32);   /* 256 blocks of rows, 32 rows per summing thread */
  xent_case(3000, 2900, V, 32);     /* padded rows */
  xent_case(100, 0, V, 27);         /* nothing valid: loss 0, gradient 0 */
  xent_case(1000, 990, 40, 44);     /* more classes than a warp: a thread per row */
}

// --- the batch's upload ------------------------------------------------------------------------

/* upload_mapped: up to six spans of 4-byte words, the first five from page-locked host buffers
   (train_cuda_host_alloc, as the graph's staging buffers are made), read in place, equal to them
   word for word, the last with no source, zeroed (the trainer's amax slots); the buffers
   rewritten and uploaded again give the new values (the kernel reads them at each call, as a
   replay must), and the zeroed span is zero again after the device wrote into it. The spans'
   sizes: the trainer's (tokens, targets, the optimizer's 2 x 48 bytes of constants, two 8-byte
   steps, 4 floats a layer), odd counts, an empty span first, between and last, one span alone,
   one larger than a grid's threads; no span (nothing queued); the words a span does not name are
   left alone. More spans than the kernel takes, or a negative count, are refused with a
   message. */
static void test_upload_mapped(void **state) {
  (void)state;
  assert_non_null(ops->upload_mapped);
  enum { ZSPAN = TRAIN_UPLOAD_SPANS - 1 }; /* the span without a source */
  static const int64_t shapes[][TRAIN_UPLOAD_SPANS] = {
      {2048, 256, 24, 2, 2, 12}, {7, 3, 5, 1, 3, 1},       {0, 9, 1, 0, 0, 0},
      {6, 0, 11, 2, 0, 3},       {13, 2, 0, 0, 2, 0},      {100003, 1, 0, 2, 2, 5},
      {0, 0, 300001, 0, 0, 0},   {1, 0, 0, 0, 0, 0},       {0, 0, 0, 0, 0, 70001},
      {0, 0, 0, 5, 0, 0},        {0, 0, 0, 0, 0, 0}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    char pe[200];
    void *h[TRAIN_UPLOAD_SPANS] = {NULL};
    int32_t *d[TRAIN_UPLOAD_SPANS], *back[TRAIN_UPLOAD_SPANS];
    train_span span[TRAIN_UPLOAD_SPANS];
    for (int k = 0; k < TRAIN_UPLOAD_SPANS; k++) {
      const int64_t n = shapes[s][k];
      /* one word more than the span on each side: the guard words keep their sentinel */
      if (k != ZSPAN && train_cuda_host_alloc(0, (size_t)(n + 1) * 4, &h[k], pe, sizeof pe))
        fail_msg("page-locked buffers: %s", pe);
      d[k] = dev_alloc((size_t)(n + 2) * 4);
      back[k] = malloc((size_t)(n + 2) * 4);
      assert_non_null(back[k]);
      span[k] = (train_span){d[k] + 1, h[k], n};
    }
    for (int round = 0; round < 2; round++) {
      /* every device word a sentinel before each call: the zeroed span must be written again */
      for (int k = 0; k < TRAIN_UPLOAD_SPANS; k++) {
        const int64_t n = shapes[s][k];
        for (int64_t i = 0; i < n + 2; i++) back[k][i] = (int32_t)0x5a5a5a5a;
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, d[k], 0, back[k], HQ_DEVICE_HOST, (size_t)(n + 2) * 4));
        int32_t *x = h[k];
        for (int64_t i = 0; x && i < n; i++)
          x[i] = (int32_t)((i * 7 + round * 13 + k * 1000003) % 2147483647) - k;
      }
      HQ_OK_OR_FAIL(ops->upload_mapped(gpu, span, TRAIN_UPLOAD_SPANS));
      for (int k = 0; k < TRAIN_UPLOAD_SPANS; k++) {
        const int64_t n = shapes[s][k];
        const int32_t *x = h[k];
        down(back[k], d[k], (size_t)(n + 2) * 4);
        if (back[k][0] != (int32_t)0x5a5a5a5a || back[k][n + 1] != (int32_t)0x5a5a5a5a)
          fail_msg("upload shape %zu, round %d: span %d's guard words %08x %08x", s, round, k,
                   (unsigned)back[k][0], (unsigned)back[k][n + 1]);
        for (int64_t i = 0; i < n; i++)
          if (back[k][i + 1] != (x ? x[i] : 0))
            fail_msg("upload shape %zu, round %d: span %d word %lld %d, expected %d", s, round,
                     k, (long long)i, back[k][i + 1], x ? x[i] : 0);
      }
    }
    for (int k = 0; k < TRAIN_UPLOAD_SPANS; k++) {
      hq_ctx_free(gpu, d[k]);
      if (h[k]) train_cuda_host_free(h[k]);
      free(back[k]);
    }
  }
  /* no span: nothing queued, success */
  HQ_OK_OR_FAIL(ops->upload_mapped(gpu, NULL, 0));
  /* refused: more spans than the kernel takes, a negative count */
  train_span bad[TRAIN_UPLOAD_SPANS + 1] = {{NULL, NULL, 0}};
  assert_int_not_equal(ops->upload_mapped(gpu, bad, TRAIN_UPLOAD_SPANS + 1), 0);
  assert_non_null(strstr(ops->error(), "spans, at most"));
  bad[1].n = -1;
  assert_int_not_equal(ops->upload_mapped(gpu, bad, 2), 0);
  assert_non_null(strstr(ops->error(), "span 1 has -1 words"));
}

static int setup(void **state) {
  (void)state;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  if (hq_ctx_create(&d, &gpu)) {
    fprintf(stderr, "context: %s\n", hq_last_error());
    return -1;
  }
  /* the largest case of each kernel: B 32768, C 8, E 64 (the embedding: 32768 rows), widest
     4096 */
  const size_t n = ops->scratch_bytes(32768, 8, 100, 4096);
  return hq_ctx_alloc(gpu, n, &scratch) ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_free(gpu, scratch);
  hq_ctx_destroy(gpu);
  return 0;
}

int main(void) {
  ops = train_cuda_ops();
  if (!ops || !hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_activations), cmocka_unit_test(test_amax_nonfinite),
      cmocka_unit_test(test_embedding),   cmocka_unit_test(test_colsum),
      cmocka_unit_test(test_xent),        cmocka_unit_test(test_upload_mapped),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
