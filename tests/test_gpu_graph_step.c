/*
** test_gpu_graph_step.c -- a linear layer's steady-state training step captured in a CUDA graph
** (hq.h: hq's calls are capture-safe once warm): the refresh of the input, the weight and the
** output gradient (hq_qtensor_update) and the three GEMMs (hq_linear_fprop, dgrad, wgrad), on
** a non-blocking stream, after one eager step made the plans and the GEMM workspace. The capture
** must succeed (an allocation or a synchronization inside would break it); the graph replayed
** on new data in the same buffers gives the bytes of the same calls run eagerly on that data,
** for per-tensor FP8 (the native FP8 path on Hopper), BF16 identity (the native BF16 path) and
** MXFP8 / MXFP4 and NVFP4 (emulated on Hopper: NVFP4's two dequantizes of each GEMM are one
** launch of the module's dequantize_pair, the graph one chain, folding both factors into one
** product; MXFP8's and MXFP4's, and NVFP4's through a module without the op (tests/wrap/
** nopair.c), run on the context's stream and its side stream, so the graph forks and joins --
** NVFP4's each folding its factor into a product of its own, which the GEMM's alpha multiplies,
** where eagerly B's fold reads A's product, and only while both operands have at most 2^20
** elements; a context's first GEMM captured before it has a side stream runs them in turn, one
** chain, with the eager run's bytes; the pair saves the NVFP4 step two kernel nodes a GEMM).
** The captured step holds no allocation or free node: the GEMMs' scratch (dequantized
** operands, alpha slots) comes from the buffers the context kept since the eager step.
** hq_adam_step with the quantized weight's write-back, captured once warm with its constants in
** device memory (hq_adam.consts_dev, filled by a copy from page-locked memory recorded in the
** same graph) and replayed for 5 steps whose learning rate and bias corrections change, leaves
** the masters, the moments and every direction of the quantized weight with the bytes of the
** same 5 steps run eagerly (constants as arguments, and again from a slot): per-tensor FP8 takes
** the two-kernel path (the step's kernel hands the write-back its amax in the caller's 8-byte
** slot, hq_adam.amax_dev: the captured graph holds no allocation or free node), BF16 identity and
** MXFP8 the fused write-back kernel, and a module fused without HQ_CAP_ADAM_KDEV (tests/wrap/
** mxfp8_nokdev.c) the two-kernel path. Captured without consts_dev, the step is refused
** (HQ_ESTATE) and records nothing.
** hq_ctx_capturing follows a capture of the context's stream: 0 before, 1 inside (asked from
** the capturing thread and from another), 1 once an illegal call has invalidated it, 0 once
** ended; on the legacy default stream while a blocking stream captures, CUDA cannot tell and
** the call says so (HQ_EDEVICE), and hq_ctx_set_rng_offset refuses for that reason, the capture
** left intact.
** A current-scaling quantize captured, of a small tensor and a larger one, holds no memset node
** and replays to the CPU reference's bytes; nor does hq_adam_step's two-kernel write-back, nor
** hq_quantizer_amax for one direction or both (the other direction's slot reads 0).
** mxfp8 with raw_copy = bf16: an fprop-shaped GEMM reads the raw copies in place (emulated, not
** fused, two kernel nodes fewer captured than on dequantized operands) with the same bytes.
** A GEMM's amax (hq_gemm_args.amax_d) captured, native FP8 and emulated, D bf16 and f32: no
** memset node, and the replay writes max |D| over whatever the slot held.
** Exits 77 (skipped) without a CUDA device.
*/
#include <cuda_runtime.h>
#include <pthread.h>

#include "hq_gpu_test.h"

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                 \
  } while (0)

static cudaStream_t stream;
static hq_ctx *gpu;

enum { M = 256, N = 384, K = 512 };   /* tokens, outputs, inputs */

/* the step: refresh the three qtensors from their sources, then y = x W^T, dx = dy W,
   dw = dy^T x */
static int step(hq_qtensor *const q[3], const hq_tensor src[3], hq_tensor out[3]) {
  for (int i = 0; i < 3; i++)
    if (hq_qtensor_update(q[i], gpu, &src[i])) return -1;
  if (hq_linear_fprop(gpu, hq_operand_q(q[0]), hq_operand_q(q[1]), NULL, HQ_F32, &out[0], NULL))
    return -1;
  if (hq_linear_dgrad(gpu, hq_operand_q(q[2]), hq_operand_q(q[1]), &out[1], NULL)) return -1;
  return hq_linear_wgrad(gpu, hq_operand_q(q[0]), hq_operand_q(q[2]), &out[2], 0, NULL);
}

/* host copies of the three outputs, concatenated */
static float *fetch(const hq_tensor out[3], size_t n) {
  float *h = malloc(n * sizeof *h);
  size_t at = 0;
  CK(cudaStreamSynchronize(stream));
  for (int i = 0; i < 3; i++) {
    const size_t k = (size_t)(out[i].rows * out[i].cols);
    CK(cudaMemcpy(h + at, out[i].data, k * sizeof *h, cudaMemcpyDeviceToHost));
    at += k;
  }
  return h;
}

static const char *recipes[] = {
    "[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = identity\ndtype = bf16\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    /* emulated on Hopper: each GEMM's two dequantizes forked onto the context's side stream */
    "[format f]\nplugin = mxfp8\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = mxfp4\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    /* the RHT amax pass (one cluster: 2^17 elements and fewer) on the input and the gradient,
       whose columnwise copies wgrad multiplies; the plain pass's memset and atomic form on the
       weight (more), which dgrad multiplies by the gradient's rowwise copy, untransformed */
    "[format f]\nplugin = nvfp4\nrht = true\n[format w]\nplugin = nvfp4\n"
    "[role linear:input:*]\nrowwise = f\ncolumnwise = f\n"
    "[role linear:weight:*]\nrowwise = w\ncolumnwise = w\n"
    "[role linear:grad_output:*]\nrowwise = f\ncolumnwise = f\n",
    /* recipe 4 through a module without dequantize_pair (tests/wrap/nopair.c) */
    "[format f]\nplugin = nvfp4_nopair\nrht = true\n[format w]\nplugin = nvfp4_nopair\n"
    "[role linear:input:*]\nrowwise = f\ncolumnwise = f\n"
    "[role linear:weight:*]\nrowwise = w\ncolumnwise = w\n"
    "[role linear:grad_output:*]\nrowwise = f\ncolumnwise = f\n",
};
/* PAIRED: the stock nvfp4 recipe, whose module has dequantize_pair; NOPAIR: the same recipe
   through the wrapped module without it */
enum { N_RECIPES = sizeof recipes / sizeof *recipes, PAIRED = 4, NOPAIR = 5 };

/* recipes[k], its plugins found on the test path and, for NOPAIR, in $HQ_TEST_WRAP_DIR */
static hq_recipe *step_recipe(size_t k) {
  const char *wrap = getenv("HQ_TEST_WRAP_DIR");
  if (k >= NOPAIR && !wrap)
    fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
  return hq_test_recipe_dirs(recipes[k], &wrap, k >= NOPAIR ? 1 : 0);
}

/* The nodes and edges of a captured graph: a capture of one stream is a chain (edges = nodes -
   1); work forked onto a second stream and joined back adds edges. */
static void graph_shape(cudaGraph_t graph, size_t *nodes, size_t *edges) {
  CK(cudaGraphGetNodes(graph, NULL, nodes));
#if CUDART_VERSION >= 13000
  CK(cudaGraphGetEdges(graph, NULL, NULL, NULL, edges));
#else
  CK(cudaGraphGetEdges(graph, NULL, NULL, edges));
#endif
}

/* The nodes of a captured graph that depend on none: work forked at the capture's start, before
   any node (a fork after one adds an edge instead), makes more than one. */
static size_t graph_roots(cudaGraph_t graph) {
  size_t roots = 0;
  CK(cudaGraphGetRootNodes(graph, NULL, &roots));
  return roots;
}

/* The nodes of a captured graph of one kind. */
static size_t graph_count(cudaGraph_t graph, enum cudaGraphNodeType type) {
  size_t count = 0, n = 0;
  CK(cudaGraphGetNodes(graph, NULL, &count));
  cudaGraphNode_t *all = (cudaGraphNode_t *)calloc(count ? count : 1, sizeof *all);
  assert_non_null(all);
  CK(cudaGraphGetNodes(graph, all, &count));
  for (size_t i = 0; i < count; i++) {
    enum cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(all[i], &t));
    n += t == type;
  }
  free(all);
  return n;
}

/* Whether device 0 multiplies MX formats by emulation (Hopper) rather than natively. */
static int mx_emulated(void) {
  int arch = 0;
  char name[128];
  return hq_device_info(0, name, sizeof name, &arch) == HQ_OK && arch / 10 == 9;
}

static void test_step_in_a_graph(void **state) {
  (void)state;
  const int64_t rows[3] = {M, N, M}, cols[3] = {K, K, N};
  const char *roles[3] = {"linear:input:l", "linear:weight:l", "linear:grad_output:l"};
  const int64_t orow[3] = {M, M, N}, ocol[3] = {N, K, K};
  const size_t n_out = (size_t)(M * N + M * K + N * K);
  size_t kernels[N_RECIPES];
  for (size_t k = 0; k < N_RECIPES; k++) {
    hq_recipe *r = step_recipe(k);
    hq_quantizer *q[3];
    hq_qtensor *qt[3];
    hq_tensor src[3], out[2][3], first[3], second[3];
    for (int i = 0; i < 3; i++) {
      q[i] = hq_test_quantizer(r, roles[i]);
      HQ_OK_OR_FAIL(hq_quantizer_set_usage(q[i], HQ_BOTH));
      first[i] = hq_test_tensor(HQ_BF16, rows[i], cols[i], 10 + (uint64_t)i, 1.0f);
      second[i] = hq_test_tensor(HQ_BF16, rows[i], cols[i], 20 + (uint64_t)i, 3.0f);
      const size_t bytes = (size_t)(rows[i] * cols[i]) * 2;
      void *d = NULL;
      CK(cudaMalloc(&d, bytes));
      CK(cudaMemcpy(d, first[i].data, bytes, cudaMemcpyHostToDevice));
      src[i] = hq_tensor_2d(d, HQ_BF16, 0, rows[i], cols[i]);
      for (int o = 0; o < 2; o++) {
        void *p = NULL;
        CK(cudaMalloc(&p, (size_t)(orow[i] * ocol[i]) * sizeof(float)));
        out[o][i] = hq_tensor_2d(p, HQ_F32, 0, orow[i], ocol[i]);
      }
      HQ_OK_OR_FAIL(hq_quantize(q[i], gpu, &src[i], &qt[i]));
    }
    /* warm: the plans, the workspace, the scale buffers */
    if (step(qt, src, out[0])) fail_msg("%s: the eager step: %s", recipes[k], hq_last_error());
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = step(qt, src, out[0]);
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    if (rc) fail_msg("%s: the step under capture: %s", recipes[k], hq_last_error());
    CK(ce);
    size_t nodes = 0, edges = 0;
    graph_shape(graph, &nodes, &edges);
    kernels[k] = graph_count(graph, cudaGraphNodeTypeKernel);
    /* the emulated GEMMs' dequantized operands and alpha slots come from the scratch the
       context kept since the eager step: no allocation or free node */
    const size_t allocs = graph_count(graph, cudaGraphNodeTypeMemAlloc) +
                          graph_count(graph, cudaGraphNodeTypeMemFree);
    if (allocs)
      fail_msg("%s: %zu allocation and free nodes in a step captured after an eager one",
               recipes[k], allocs);
    /* each emulated GEMM's two dequantizes: one launch of nvfp4's dequantize_pair (a chain),
       or, from the MX modules and the one without the op, two kernels side by side (NVFP4's
       each folding its per-tensor factor into its own product, ABI 1.3) */
    const int emulated =
        (strstr(recipes[k], "mxfp") || strstr(recipes[k], "nvfp4")) && mx_emulated();
    const int paired = k == PAIRED;
    if (emulated && !paired && edges < nodes)
      fail_msg("%s: %zu nodes, %zu edges: the emulated GEMMs' dequantizes were not forked",
               recipes[k], nodes, edges);
    if (emulated && paired && edges + 1 != nodes)
      fail_msg("%s: %zu nodes, %zu edges: the emulated GEMMs' dequantizes were not one launch",
               recipes[k], nodes, edges);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    /* new data in the same buffers; the graph's outputs zeroed so that a replay that wrote
       nothing cannot pass */
    for (int i = 0; i < 3; i++) {
      CK(cudaMemcpyAsync(src[i].data, second[i].data, (size_t)(rows[i] * cols[i]) * 2,
                         cudaMemcpyHostToDevice, stream));
      CK(cudaMemsetAsync(out[0][i].data, 0, (size_t)(orow[i] * ocol[i]) * sizeof(float), stream));
    }
    CK(cudaGraphLaunch(exec, stream));
    float *replayed = fetch(out[0], n_out);
    if (step(qt, src, out[1])) fail_msg("%s: the eager step: %s", recipes[k], hq_last_error());
    float *eager = fetch(out[1], n_out);
    size_t nonzero = 0;
    for (size_t i = 0; i < n_out; i++) nonzero += eager[i] != 0.0f;
    assert_true(nonzero > n_out / 2);
    if (memcmp(replayed, eager, n_out * sizeof *eager)) {
      size_t at = 0;
      while (replayed[at] == eager[at]) at++;
      fail_msg("%s: the replayed step differs from the eager one at output %zu (%g, %g)",
               recipes[k], at, (double)replayed[at], (double)eager[at]);
    }
    free(replayed);
    free(eager);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    for (int i = 0; i < 3; i++) {
      hq_qtensor_free(qt[i]);
      hq_quantizer_free(q[i]);
      CK(cudaStreamSynchronize(stream));
      CK(cudaFree(src[i].data));
      CK(cudaFree(out[0][i].data));
      CK(cudaFree(out[1][i].data));
      free(first[i].data);
      free(second[i].data);
    }
    hq_recipe_free(r);
  }
  /* the pair saves each of the step's three NVFP4 GEMMs two kernels: one dequantize, and the
     runner's kernel multiplying the two products (the one launch folds B's factor into A's
     product) */
  if (mx_emulated() && kernels[NOPAIR] != kernels[PAIRED] + 6)
    fail_msg("kernel nodes: nvfp4 %zu, without the pair %zu (want 6 more)", kernels[PAIRED],
             kernels[NOPAIR]);
}

enum { WR = 192, WC = 320 };   /* the weight AdamW updates */

/* One parameter: FP32 master, moments, gradient on the device, the quantized weight. */
typedef struct param {
  float *w, *m, *v, *g;
  hq_qtensor *qw;
} param;

static void param_make(param *p, hq_quantizer *q, const hq_tensor *w0, const hq_tensor *g0) {
  const size_t bytes = (size_t)(WR * WC) * sizeof(float);
  CK(cudaMalloc((void **)&p->w, bytes));
  CK(cudaMalloc((void **)&p->m, bytes));
  CK(cudaMalloc((void **)&p->v, bytes));
  CK(cudaMalloc((void **)&p->g, bytes));
  CK(cudaMemcpy(p->w, w0->data, bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(p->g, g0->data, bytes, cudaMemcpyHostToDevice));
  CK(cudaMemset(p->m, 0, bytes));
  CK(cudaMemset(p->v, 0, bytes));
  hq_tensor wd = hq_tensor_2d(p->w, HQ_F32, 0, WR, WC);
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &wd, &p->qw));
}

static int adam(param *p, const hq_adam *a) {
  hq_tensor g = hq_tensor_2d(p->g, HQ_F32, 0, WR, WC);
  return hq_adam_step(gpu, a, &g, p->w, p->m, p->v, p->qw);
}

/* The bytes of p: master, moments, then every direction of the quantized weight dequantized
   (F32), concatenated; *n floats. */
static float *param_bytes(param *p, size_t *n) {
  const size_t k = (size_t)(WR * WC);
  float *h = malloc(5 * k * sizeof *h), *d = NULL;
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(h, p->w, k * sizeof *h, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h + k, p->m, k * sizeof *h, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h + 2 * k, p->v, k * sizeof *h, cudaMemcpyDeviceToHost));
  CK(cudaMalloc((void **)&d, k * sizeof *h));
  *n = 3 * k;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    if (!(hq_qtensor_dirs(p->qw) & dir)) continue;
    hq_tensor dt = hq_tensor_2d(d, HQ_F32, 0, WR, WC);
    HQ_OK_OR_FAIL(hq_dequantize(p->qw, gpu, dir, &dt));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(h + *n, d, k * sizeof *h, cudaMemcpyDeviceToHost));
    *n += k;
  }
  CK(cudaFree(d));
  return h;
}

static void param_free(param *p) {
  hq_qtensor_free(p->qw);
  CK(cudaStreamSynchronize(stream));
  CK(cudaFree(p->w));
  CK(cudaFree(p->m));
  CK(cudaFree(p->v));
  CK(cudaFree(p->g));
}

/* The weights the AdamW capture runs on: per-tensor FP8 with current scaling (the two-kernel
   path: the step's kernel hands the write-back its amax), BF16 identity and MXFP8 (the fused
   write-back kernel), and mxfp8_nokdev (tests/wrap: fused without HQ_CAP_ADAM_KDEV, which
   refuses a k_dev; with consts_dev the core must take the two-kernel path for it, while its
   eager steps without consts_dev stay fused). */
static const struct {
  const char *text;
  int wrap;   /* its plugin is in $HQ_TEST_WRAP_DIR */
} adam_recipes[] = {
    {"[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n", 0},
    {"[format f]\nplugin = identity\ndtype = bf16\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
     0},
    {"[format f]\nplugin = mxfp8\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n", 0},
    {"[format f]\nplugin = mxfp8_nokdev\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n", 1},
};

enum { ADAM_STEPS = 5 };

/* Step t (1-based) of the replays: the learning rate changes at every step, as a schedule's
   does, and so do the bias corrections; a replay applying the constants of the capture would
   differ from the eager steps from the second step on. */
static hq_adam adam_at_step(int64_t t, const void *consts_dev, void *amax_dev) {
  hq_adam a = {sizeof a, 1e-2f / (float)t, 0.9f, 0.95f, 1e-8f, 0.01f, t, consts_dev, amax_dev, 0};
  return a;
}

/* The first float where got and want differ fails the test. */
static void same_floats(const float *got, const float *want, size_t n, const char *what,
                        const char *recipe) {
  if (!memcmp(got, want, n * sizeof *got)) return;
  size_t at = 0;
  while (!memcmp(&got[at], &want[at], sizeof *got)) at++;
  fail_msg("%s: %s differ from the eager steps at float %zu of %zu (%g, %g)", recipe, what, at, n,
           (double)got[at], (double)want[at]);
}

static void test_adam_in_a_graph(void **state) {
  (void)state;
  void *kd = NULL, *kd_eager = NULL, *kh = NULL;   /* the graph's slot, the eager one's, host */
  void *ka = NULL;                                 /* the write-back amax's slot (amax_dev) */
  CK(cudaMalloc(&kd, HQ_ADAM_CONSTS_BYTES));
  CK(cudaMalloc(&ka, HQ_ADAM_AMAX_BYTES));
  CK(cudaMalloc(&kd_eager, HQ_ADAM_CONSTS_BYTES));
  CK(cudaMallocHost(&kh, HQ_ADAM_CONSTS_BYTES));
  for (size_t k = 0; k < sizeof adam_recipes / sizeof *adam_recipes; k++) {
    const char *rname = adam_recipes[k].text, *wrap = getenv("HQ_TEST_WRAP_DIR");
    if (adam_recipes[k].wrap && !wrap)
      fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
    hq_recipe *r = hq_test_recipe_dirs(rname, &wrap, adam_recipes[k].wrap ? 1 : 0);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:l");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_tensor w0 = hq_test_tensor(HQ_F32, WR, WC, 30, 0.05f);
    hq_tensor g0 = hq_test_tensor(HQ_F32, WR, WC, 31, 1.0f);
    param warm, pg, pe, pk;   /* warms the kernels; the graph's; eager; eager with a slot */
    param_make(&warm, q, &w0, &g0);
    param_make(&pg, q, &w0, &g0);
    param_make(&pe, q, &w0, &g0);
    param_make(&pk, q, &w0, &g0);
    const hq_adam a1 = adam_at_step(1, NULL, NULL);
    if (adam(&warm, &a1)) fail_msg("%s: the eager step: %s", rname, hq_last_error());
    CK(cudaStreamSynchronize(stream));

    /* without consts_dev a capture is refused, nothing queued: the constants would be frozen */
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int refused = adam(&pg, &a1);
    CK(cudaStreamEndCapture(stream, &graph));
    assert_int_equal(refused, HQ_ESTATE);
    HQ_ERROR_HAS("hq_adam.consts_dev");
    size_t nodes = 1;
    CK(cudaGraphGetNodes(graph, NULL, &nodes));
    assert_int_equal(nodes, 0);
    CK(cudaGraphDestroy(graph));

    /* the capture: the slot filled from page-locked memory, then the step reading it */
    cudaGraphExec_t exec;
    /* the write-back amax in a slot of the caller's (amax_dev): no allocation in the graph */
    const hq_adam ag = adam_at_step(1, kd, ka);
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaError_t ce = cudaMemcpyAsync(kd, kh, HQ_ADAM_CONSTS_BYTES, cudaMemcpyHostToDevice, stream);
    const int rc = ce == cudaSuccess ? adam(&pg, &ag) : -1;
    const cudaError_t ee = cudaStreamEndCapture(stream, &graph);
    CK(ce);
    if (rc) fail_msg("%s: hq_adam_step under capture: %s", rname, hq_last_error());
    CK(ee);
    const size_t allocs = graph_count(graph, cudaGraphNodeTypeMemAlloc) +
                          graph_count(graph, cudaGraphNodeTypeMemFree);
    const size_t memsets = graph_count(graph, cudaGraphNodeTypeMemset);
    if (allocs) fail_msg("%s: the captured step holds %zu allocation or free nodes", rname, allocs);
    /* the write-back amax's slot zeroed by a kernel (a memset node costs twice as much) */
    if (memsets) fail_msg("%s: the captured step holds %zu memset nodes", rname, memsets);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int64_t t = 1; t <= ADAM_STEPS; t++) {
      /* the replay: this step's constants into the host buffer the graph's copy reads (the last
         replay has finished: synchronized below) */
      const hq_adam at = adam_at_step(t, NULL, NULL);
      HQ_OK_OR_FAIL(hq_adam_consts_write(&at, kh));
      CK(cudaGraphLaunch(exec, stream));
      CK(cudaStreamSynchronize(stream));
      /* eager, constants as arguments */
      if (adam(&pe, &at)) fail_msg("%s: the eager step %lld: %s", rname, (long long)t,
                                   hq_last_error());
      /* eager with its slot filled: the same bits as without */
      const hq_adam ak = adam_at_step(t, kd_eager, ka);
      CK(cudaMemcpyAsync(kd_eager, kh, HQ_ADAM_CONSTS_BYTES, cudaMemcpyHostToDevice, stream));
      if (adam(&pk, &ak)) fail_msg("%s: the eager step %lld with consts_dev: %s", rname,
                                   (long long)t, hq_last_error());
      CK(cudaStreamSynchronize(stream));
    }
    size_t ng, ne, nk;
    float *got = param_bytes(&pg, &ng), *want = param_bytes(&pe, &ne);
    float *slot = param_bytes(&pk, &nk);
    assert_int_equal(ng, ne);
    assert_int_equal(nk, ne);
    assert_true(ng >= 4 * (size_t)(WR * WC));   /* a direction of the weight at least */
    /* the steps moved the master: a replay that ran nothing cannot pass */
    float *w0d = (float *)w0.data;
    size_t moved = 0;
    for (size_t i = 0; i < (size_t)(WR * WC); i++) moved += want[i] != w0d[i];
    assert_true(moved > (size_t)(WR * WC) / 2);
    same_floats(got, want, ng, "the replayed AdamW steps (master, moments, write-back)", rname);
    same_floats(slot, want, nk, "the eager steps with consts_dev", rname);
    free(got);
    free(want);
    free(slot);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    param_free(&warm);
    param_free(&pg);
    param_free(&pe);
    param_free(&pk);
    free(w0.data);
    free(g0.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  CK(cudaFree(kd));
  CK(cudaFree(ka));
  CK(cudaFree(kd_eager));
  CK(cudaFreeHost(kh));
}

/* hq_ctx_capturing(gpu) asked from a thread other than the capturing one: {status, flag}. */
static void *capturing_elsewhere(void *arg) {
  int *out = arg;
  out[0] = hq_ctx_capturing(gpu, &out[1]);
  return NULL;
}

/* hq_ctx_capturing held to CUDA's own answers for the stream. Every answer is collected first
   and checked once the capture has ended, so that a failure leaves no stream in capture mode. */
static void test_ctx_capturing(void **state) {
  (void)state;
  int before = 7, inside = 7, after = 7, other[2] = {-1, -1};
  HQ_OK_OR_FAIL(hq_ctx_capturing(gpu, &before));
  assert_int_equal(before, 0);

  cudaGraph_t graph = NULL;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int rc_in = hq_ctx_capturing(gpu, &inside);
  pthread_t th;
  const int made = pthread_create(&th, NULL, capturing_elsewhere, other);
  if (!made) pthread_join(th, NULL);
  const cudaError_t ee = cudaStreamEndCapture(stream, &graph);
  CK(ee);
  CK(cudaGraphDestroy(graph));
  HQ_OK_OR_FAIL(hq_ctx_capturing(gpu, &after));
  HQ_OK_OR_FAIL(rc_in);
  assert_int_equal(inside, 1);
  assert_int_equal(made, 0);
  assert_int_equal(other[0], HQ_OK);
  assert_int_equal(other[1], 1);
  assert_int_equal(after, 0);

  /* a synchronization inside the capture is refused and invalidates it: the stream stays in
     capture mode until the capture is ended, and is reported as capturing */
  int invalidated = 7;
  graph = NULL;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t se = cudaStreamSynchronize(stream);
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t qe = cudaStreamIsCapturing(stream, &st);
  const int rc_inv = hq_ctx_capturing(gpu, &invalidated);
  const cudaError_t ie = cudaStreamEndCapture(stream, &graph);
  cudaGetLastError();
  after = 7;
  HQ_OK_OR_FAIL(hq_ctx_capturing(gpu, &after));
  assert_int_not_equal(se, cudaSuccess);
  CK(qe);
  assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
  HQ_OK_OR_FAIL(rc_inv);
  assert_int_equal(invalidated, 1);
  assert_int_not_equal(ie, cudaSuccess);   /* the capture ended without a graph */
  assert_null(graph);
  assert_int_equal(after, 0);

  /* a context on the legacy default stream while a blocking stream of its device captures:
     CUDA refuses to tell (cudaStreamIsCapturing documents cudaErrorStreamCaptureImplicit), and
     hq_ctx_capturing says so -- HQ_EDEVICE with CUDA's message, the flag 0 -- with the
     runtime's last error cleared and the capture left active */
  cudaStream_t blocking;
  CK(cudaStreamCreate(&blocking));
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;   /* stream NULL */
  hq_ctx *legacy = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &legacy));
  int flag = 7;
  graph = NULL;
  CK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal));
  const cudaError_t direct = cudaStreamIsCapturing(cudaStreamLegacy, &st);
  cudaGetLastError();
  const int rc_legacy = hq_ctx_capturing(legacy, &flag);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", hq_last_error());
  const cudaError_t last = cudaGetLastError();
  /* nor does hq_ctx_set_rng_offset write the step then: its stream-ordered allocation and copy
     on the legacy stream would end the other stream's capture (it asked with the query's
     error ignored, and went on, before it took hq_ctx_capturing's answer) */
  const int rc_set = hq_ctx_set_rng_offset(legacy, 5);
  const uint64_t off_set = hq_ctx_rng_offset(legacy);
  const cudaError_t last_set = cudaGetLastError();
  enum cudaStreamCaptureStatus still = cudaStreamCaptureStatusNone;
  const cudaError_t qs = cudaStreamIsCapturing(blocking, &still);
  const cudaError_t le = cudaStreamEndCapture(blocking, &graph);
  CK(le);
  CK(cudaGraphDestroy(graph));
  int free_again = 7;
  HQ_OK_OR_FAIL(hq_ctx_capturing(legacy, &free_again));   /* nothing captures: it can tell */
  hq_ctx_destroy(legacy);
  CK(cudaStreamDestroy(blocking));
  assert_int_equal(free_again, 0);
  assert_int_equal(direct, cudaErrorStreamCaptureImplicit);
  assert_int_equal(rc_legacy, HQ_EDEVICE);
  assert_int_equal(flag, 0);
  if (!strstr(msg, "hq_ctx_capturing") || !strstr(msg, cudaGetErrorString(direct)))
    fail_msg("the message '%s' lacks the call or CUDA's reason", msg);
  assert_int_equal(last, cudaSuccess);
  assert_int_equal(rc_set, HQ_EDEVICE);
  assert_int_equal(off_set, 0);
  assert_int_equal(last_set, cudaSuccess);
  CK(qs);
  assert_int_equal(still, cudaStreamCaptureStatusActive);
}

/* y = x W^T of recipes[rec] (x: tokens x K, W: N x K) captured on a new context -- after one
   eager run of it when warm (the context then has its side stream) -- the graph a fork
   (want_fork) or one stream's chain, and its replay the bytes of the same GEMM run eagerly
   afterwards. Returns the graph's kernel nodes. */
static size_t fprop_captured(int rec, int64_t tokens, int warm, int want_fork) {
  const int64_t rows[2] = {tokens, N};
  hq_ctx *ctx = NULL;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = stream;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  hq_recipe *r = step_recipe((size_t)rec);
  const char *roles[2] = {"linear:input:l", "linear:weight:l"};
  hq_quantizer *q[2];
  hq_qtensor *qt[2];
  hq_tensor h[2];
  void *dsrc[2], *dout[2];
  for (int i = 0; i < 2; i++) {
    q[i] = hq_test_quantizer(r, roles[i]);
    h[i] = hq_test_tensor(HQ_BF16, rows[i], K, 30 + (uint64_t)i, 1.0f);
    CK(cudaMalloc(&dsrc[i], (size_t)(rows[i] * K) * 2));
    CK(cudaMemcpy(dsrc[i], h[i].data, (size_t)(rows[i] * K) * 2, cudaMemcpyHostToDevice));
    hq_tensor src = hq_tensor_2d(dsrc[i], HQ_BF16, 0, rows[i], K);
    HQ_OK_OR_FAIL(hq_quantize(q[i], ctx, &src, &qt[i]));
    CK(cudaMalloc(&dout[i], (size_t)(tokens * N) * sizeof(float)));
  }
  hq_tensor out[2] = {hq_tensor_2d(dout[0], HQ_F32, 0, tokens, N),
                      hq_tensor_2d(dout[1], HQ_F32, 0, tokens, N)};
  if (warm)
    HQ_OK_OR_FAIL(hq_linear_fprop(ctx, hq_operand_q(qt[0]), hq_operand_q(qt[1]), NULL, HQ_F32,
                                  &out[1], NULL));
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int rc = hq_linear_fprop(ctx, hq_operand_q(qt[0]), hq_operand_q(qt[1]), NULL, HQ_F32,
                                 &out[0], NULL);
  const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
  if (rc) fail_msg("%s: the GEMM under capture: %s", recipes[rec], hq_last_error());
  CK(ce);
  size_t nodes = 0, edges = 0;
  graph_shape(graph, &nodes, &edges);
  const size_t kernels = graph_count(graph, cudaGraphNodeTypeKernel), roots = graph_roots(graph);
  /* no node precedes the GEMM's dequantizes (its scratch is the context's since the eager run):
     a fork makes two roots; one stream's chain has one root and an edge fewer than nodes */
  const int forked = roots > 1 || edges >= nodes, chain = roots == 1 && edges + 1 == nodes;
  if (want_fork ? !forked : !chain)
    fail_msg("%s, %lld tokens%s: %zu nodes, %zu edges: %s", recipes[rec], (long long)tokens,
             warm ? " (warm)" : "", nodes, edges,
             want_fork ? "the dequantizes were not forked" : "not one stream's chain");
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));
  HQ_OK_OR_FAIL(hq_linear_fprop(ctx, hq_operand_q(qt[0]), hq_operand_q(qt[1]), NULL, HQ_F32,
                                &out[1], NULL));
  const size_t n = (size_t)(tokens * N);
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(a, dout[0], n * sizeof *a, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b, dout[1], n * sizeof *b, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) nonzero += b[i] != 0.0f;
  assert_true(nonzero > n / 2);
  assert_memory_equal(a, b, n * sizeof *a);
  free(a), free(b);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  for (int i = 0; i < 2; i++) {
    hq_qtensor_free(qt[i]);
    hq_quantizer_free(q[i]);
    free(h[i].data);
  }
  CK(cudaStreamSynchronize(stream));
  for (int i = 0; i < 2; i++) {
    CK(cudaFree(dsrc[i]));
    CK(cudaFree(dout[i]));
  }
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  return kernels;
}

/* The kernel nodes the stock nvfp4's pair saves a captured GEMM against the module without it:
   one dequantize where B's fold reads A's product (large operands, in turn), and also the
   runner's kernel multiplying the two products where each operand folds into its own (small
   operands: forked, or in turn before the context has a side stream). */
static void want_saved(size_t nopair, size_t paired, size_t saved, const char *what) {
  if (nopair != paired + saved)
    fail_msg("%s: %zu kernel nodes without the pair, %zu with it (want %zu fewer)", what, nopair,
             paired, saved);
}

/* The first GEMM of a context captured before the context made its side stream (making one is
   not capture work), from modules without dequantize_pair: its dequantizes run in turn on the
   captured stream (the graph is a chain), and the replay gives the bytes of the same GEMM run
   eagerly afterwards -- for MXFP8 (no factor; the eager run forks) and for NVFP4 wrapped
   without the op (each operand folding its factor into its own product, in turn; the eager run
   chains the folds, B's reading A's product). The stock nvfp4's one launch needs no side
   stream: a chain too. */
static void test_first_gemm_captured(void **state) {
  (void)state;
  if (!mx_emulated()) skip();
  const size_t n = fprop_captured(NOPAIR, M, 0, 0);
  fprop_captured(2, M, 0, 0);
  want_saved(n, fprop_captured(PAIRED, M, 0, 0), 2, "the first GEMM captured");
}

/* NVFP4 operands, which both carry a per-tensor factor, captured once the context has its side
   stream. From a module without dequantize_pair: small ones (at most 2^20 elements each)
   dequantized side by side, each folding into its own product, the graph a fork; an input of
   2304 x 512 = 1.18M elements dequantized in turn, B's fold reading A's product, the graph a
   chain. From the stock module: one launch for both, B's fold reading A's product, a chain at
   either size. Each replay gives the eager run's bytes (eagerly the emulated path never forks
   two such operands). */
static void test_fold_pair_captured(void **state) {
  (void)state;
  if (!mx_emulated()) skip();
  const size_t forked = fprop_captured(NOPAIR, M, 1, 1);
  const size_t chained = fprop_captured(NOPAIR, 2304, 1, 0);
  want_saved(forked, fprop_captured(PAIRED, M, 1, 0), 2, "small operands, warm");
  want_saved(chained, fprop_captured(PAIRED, 2304, 1, 0), 1, "2304 tokens, warm");
}

/* A current-scaling quantize (fp8_tensor; nvfp4's global scales, with and without the RHT
   pass), captured, of a small tensor (the amax pass as one cluster; with rht no pass at all:
   nvfp4's quantize kernel, one cluster of its 4 tiles, makes its own global amaxes) and a
   larger one (the targets zeroed by a kernel before the atomic pass): no memset node (in a
   replayed step a memset node costs about two kernel nodes), and the replay on new data leaves
   the CPU reference's bytes for that data. */
static void test_amax_in_a_graph(void **state) {
  (void)state;
  static const char *const fmts[] = {"plugin = fp8_tensor", "plugin = nvfp4",
                                     "plugin = nvfp4\nrht = true"};
  static const int64_t shapes[][2] = {{128, 256}, {512, 384}}; /* 2^15, 3 * 2^16 elements */
  for (size_t k = 0; k < 2 * (sizeof fmts / sizeof *fmts); k++) {
    const int64_t R = shapes[k % 2][0], C = shapes[k % 2][1];
    char text[160];
    snprintf(text, sizeof text, "[format f]\n%s\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
             fmts[k / 2]);
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "linear:input:l");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_tensor h1 = hq_test_tensor(HQ_BF16, R, C, 40 + (uint64_t)k, 1.0f);
    hq_tensor h2 = hq_test_tensor(HQ_BF16, R, C, 50 + (uint64_t)k, 5.0f);
    const size_t bytes = (size_t)(R * C) * 2;
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h1.data, bytes, cudaMemcpyHostToDevice));
    hq_tensor src = hq_tensor_2d(d, HQ_BF16, 0, R, C);
    hq_qtensor *qg = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &src, &qg));
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = hq_qtensor_update(qg, gpu, &src);
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    if (rc) fail_msg("%s: the update under capture: %s", fmts[k / 2], hq_last_error());
    CK(ce);
    const size_t memsets = graph_count(graph, cudaGraphNodeTypeMemset);
    const size_t kernels = graph_count(graph, cudaGraphNodeTypeKernel);
    if (memsets) fail_msg("%s: the captured quantize holds %zu memset nodes", fmts[k / 2], memsets);
    if (k == 4) /* nvfp4 with rht, 4 tiles: the one kernel */
      assert_int_equal(kernels, 1);
    else
      assert_true(kernels >= 2); /* the amax pass and the cast */
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemcpyAsync(d, h2.data, bytes, cudaMemcpyHostToDevice, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    /* the CPU reference's quantize of the second fill, byte for byte (amax buffers included) */
    hq_ctx *host = NULL;
    HQ_OK_OR_FAIL(hq_ctx_create(NULL, &host));
    hq_qtensor *qh = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, host, &h2, &qh));
    hq_gpu_compare_usage(gpu, qh, qg, HQ_BOTH, fmts[k / 2]);
    hq_qtensor_free(qh);
    hq_ctx_destroy(host);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    hq_qtensor_free(qg);
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(d));
    free(h1.data);
    free(h2.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

/* hq_quantizer_amax captured for one direction and for both (fp8_tensor, nvfp4), of a small
   tensor (one cluster) and a larger one (the atomic pass): no memset node (the direction not
   asked for is zeroed by a kernel), and the replay on new data, both slots holding 1e30 before
   it, leaves max |x| of that data in each asked direction and 0 in the other. */
static void test_quantizer_amax_in_a_graph(void **state) {
  (void)state;
  static const char *const fmts[] = {"plugin = fp8_tensor", "plugin = nvfp4"};
  static const uint32_t usages[] = {HQ_ROWWISE, HQ_COLWISE, HQ_BOTH};
  static const int64_t shapes[][2] = {{128, 256}, {512, 384}};
  static const float stale[2] = {1e30f, 1e30f};
  for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
    for (size_t u = 0; u < sizeof usages / sizeof *usages; u++)
      for (size_t z = 0; z < 2; z++) {
        const int64_t R = shapes[z][0], C = shapes[z][1];
        char text[160];
        snprintf(text, sizeof text, "[format f]\n%s\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
                 fmts[f]);
        hq_recipe *r = hq_test_recipe(text);
        hq_quantizer *q = hq_test_quantizer(r, "linear:input:l");
        HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usages[u]));
        hq_tensor h1 = hq_test_tensor(HQ_BF16, R, C, 80 + (uint64_t)z, 1.0f);
        hq_tensor h2 = hq_test_tensor(HQ_BF16, R, C, 90 + (uint64_t)z, 3.0f);
        const size_t bytes = (size_t)(R * C) * 2;
        void *d = NULL;
        float *out = NULL;
        CK(cudaMalloc(&d, bytes));
        CK(cudaMalloc((void **)&out, 2 * sizeof(float)));
        CK(cudaMemcpy(d, h1.data, bytes, cudaMemcpyHostToDevice));
        hq_tensor src = hq_tensor_2d(d, HQ_BF16, 0, R, C);
        HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, &src, out)); /* warm */
        CK(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const int rc = hq_quantizer_amax(q, gpu, &src, out);
        const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
        if (rc) fail_msg("%s, usage %u: the amax under capture: %s", fmts[f], usages[u],
                         hq_last_error());
        CK(ce);
        const size_t memsets = graph_count(graph, cudaGraphNodeTypeMemset);
        if (memsets)
          fail_msg("%s, usage %u, %lld x %lld: the captured amax holds %zu memset nodes", fmts[f],
                   usages[u], (long long)R, (long long)C, memsets);
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaMemcpy(d, h2.data, bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(out, stale, sizeof stale, cudaMemcpyHostToDevice));
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        float got[2], m = 0.0f;
        CK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < R * C; i++) m = fmaxf(m, fabsf(hq_load_hp(h2.data, i, HQ_BF16)));
        const float want[2] = {usages[u] & HQ_ROWWISE ? m : 0.0f,
                               usages[u] & HQ_COLWISE ? m : 0.0f};
        if (got[0] != want[0] || got[1] != want[1])
          fail_msg("%s, usage %u, %lld x %lld: amax %.9g / %.9g after the replay, want %.9g / %.9g",
                   fmts[f], usages[u], (long long)R, (long long)C, (double)got[0],
                   (double)got[1], (double)want[0], (double)want[1]);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaFree(d));
        CK(cudaFree(out));
        free(h1.data);
        free(h2.data);
        hq_quantizer_free(q);
        hq_recipe_free(r);
      }
}

/* The kernel nodes of a captured hq_gemm of A (transposed) and B into D (flags: hq_gemm_args). */
static size_t captured_gemm_kernels(hq_qtensor *A, hq_qtensor *B, hq_tensor *D, uint32_t flags,
                                    hq_gemm_info *info) {
  hq_gemm_args args = {sizeof args, flags, NULL, HQ_DTYPE_INVALID, 0, "raw copy test", NULL};
  /* warm: plans and workspace before the capture */
  HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(A), 1, hq_operand_q(B), 0, D, 1.0f, 0.0f, &args, info));
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int rc = hq_gemm(gpu, hq_operand_q(A), 1, hq_operand_q(B), 0, D, 1.0f, 0.0f, &args, NULL);
  const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
  if (rc) fail_msg("the GEMM under capture: %s", hq_last_error());
  CK(ce);
  const size_t kernels = graph_count(graph, cudaGraphNodeTypeKernel);
  CK(cudaGraphDestroy(graph));
  return kernels;
}

/* mxfp8 with raw_copy = bf16 on a device whose MXFP8 GEMM is emulated (Hopper): an fprop-shaped
   GEMM (4096 x 2048 input, 768 x 2048 weight: 96 output tiles, a shape the fused kernel takes)
   reads both operands' raw values in place -- the emulated BF16 path, not the fused kernel, and
   two kernel nodes fewer in its capture than the same operands without the copy on the emulated
   path (no dequantize) -- and its D has the bytes of that path's D. */
static void test_raw_copy_gemm(void **state) {
  (void)state;
  if (!mx_emulated()) skip();
  enum { T = 4096, O = 768, I = 2048 }; /* k = 2048: an F32 D is fused from there */
  hq_recipe *rr = hq_test_recipe("[format f]\nplugin = mxfp8\nraw_copy = bf16\n[role *:*:*]\n"
                                 "rowwise = f\ncolumnwise = f\n");
  hq_recipe *rp = hq_test_recipe(recipes[2]);
  hq_tensor hx = hq_test_tensor(HQ_BF16, T, I, 61, 2.0f), hw = hq_test_tensor(HQ_BF16, O, I, 62,
                                                                              0.5f);
  void *dx = NULL, *dw = NULL, *dr = NULL, *dp = NULL;
  CK(cudaMalloc(&dx, (size_t)T * I * 2));
  CK(cudaMalloc(&dw, (size_t)O * I * 2));
  CK(cudaMalloc(&dr, (size_t)T * O * 4));
  CK(cudaMalloc(&dp, (size_t)T * O * 4));
  CK(cudaMemcpy(dx, hx.data, (size_t)T * I * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, hw.data, (size_t)O * I * 2, cudaMemcpyHostToDevice));
  hq_tensor x = hq_tensor_2d(dx, HQ_BF16, 0, T, I), w = hq_tensor_2d(dw, HQ_BF16, 0, O, I);
  hq_tensor yr = hq_tensor_2d(dr, HQ_F32, 0, T, O), yp = hq_tensor_2d(dp, HQ_F32, 0, T, O);
  hq_quantizer *qxr = hq_test_quantizer(rr, "linear:input:l"),
               *qwr = hq_test_quantizer(rr, "linear:weight:l"),
               *qxp = hq_test_quantizer(rp, "linear:input:l"),
               *qwp = hq_test_quantizer(rp, "linear:weight:l");
  hq_qtensor *xr = NULL, *wr = NULL, *xp = NULL, *wp = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qxr, gpu, &x, &xr));
  HQ_OK_OR_FAIL(hq_quantize(qwr, gpu, &w, &wr));
  HQ_OK_OR_FAIL(hq_quantize(qxp, gpu, &x, &xp));
  HQ_OK_OR_FAIL(hq_quantize(qwp, gpu, &w, &wp));
  hq_gemm_info ir = {.struct_size = sizeof ir}, ip = {.struct_size = sizeof ip},
               iq = {.struct_size = sizeof iq};
  /* without the flag the plain operands take the fused kernel at this shape */
  HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(wp), 1, hq_operand_q(xp), 0, &yp, NULL, &iq));
  assert_int_equal(iq.path, HQ_GEMM_PATH_FUSED_BF16);
  const size_t kr = captured_gemm_kernels(wr, xr, &yr, 0, &ir);
  const size_t kp = captured_gemm_kernels(wp, xp, &yp, HQ_GEMM_NO_FUSED, &ip);
  assert_int_equal(ir.path, HQ_GEMM_PATH_EMULATED_BF16);
  assert_int_equal(ir.fused, 0);
  assert_int_equal(ip.path, HQ_GEMM_PATH_EMULATED_BF16);
  if (kr + 2 > kp)
    fail_msg("the GEMM on raw copies captured %zu kernels, on dequantized operands %zu (two "
             "dequantizes fewer expected)", kr, kp);
  float *a = malloc((size_t)T * O * 4), *b = malloc((size_t)T * O * 4);
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(a, dr, (size_t)T * O * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b, dp, (size_t)T * O * 4, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (size_t i = 0; i < (size_t)T * O; i++) nonzero += b[i] != 0.0f;
  assert_true(nonzero > (size_t)T * O / 2);
  assert_memory_equal(a, b, (size_t)T * O * 4);
  free(a);
  free(b);
  hq_qtensor *all[] = {xr, wr, xp, wp};
  hq_qtensors_free(all, 4);
  hq_quantizer_free(qxr);
  hq_quantizer_free(qwr);
  hq_quantizer_free(qxp);
  hq_quantizer_free(qwp);
  CK(cudaStreamSynchronize(stream));
  CK(cudaFree(dx));
  CK(cudaFree(dw));
  CK(cudaFree(dr));
  CK(cudaFree(dp));
  free(hx.data);
  free(hw.data);
  hq_recipe_free(rr);
  hq_recipe_free(rp);
}

/* hq_gemm_args.amax_d captured: per-tensor FP8 operands multiplied on the native path (cuBLASLt's
   AMAX_D epilogue where it offers one; the runner does not zero the slot first) and forced onto
   the emulated path (hq's own pass over D, its slot zeroed by a kernel), D bf16 and f32, each
   captured once warm: no memset node, and each replay, the slot holding 1e30 before it, leaves
   max |D| of the stored result, computed here from D read back. */
static void test_amax_d_in_a_graph(void **state) {
  (void)state;
  enum { Mr = 256, Nr = 384, Kr = 512 };
  hq_recipe *r = hq_test_recipe("[format f8]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f8\n"
                                "columnwise = f8\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:l");
  hq_tensor ha = hq_test_tensor(HQ_BF16, Mr, Kr, 71, 1.0f), hb = hq_test_tensor(HQ_BF16, Nr, Kr,
                                                                                72, 1.0f);
  hq_store_hp(ha.data, 5, HQ_BF16, -30.0f);
  void *da = NULL, *db = NULL, *dd = NULL, *slot = NULL;
  CK(cudaMalloc(&da, (size_t)Mr * Kr * 2));
  CK(cudaMalloc(&db, (size_t)Nr * Kr * 2));
  CK(cudaMalloc(&dd, (size_t)Mr * Nr * 4));
  CK(cudaMalloc(&slot, 4));
  CK(cudaMemcpy(da, ha.data, (size_t)Mr * Kr * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data, (size_t)Nr * Kr * 2, cudaMemcpyHostToDevice));
  hq_tensor a = hq_tensor_2d(da, HQ_BF16, 0, Mr, Kr), b = hq_tensor_2d(db, HQ_BF16, 0, Nr, Kr);
  hq_qtensor *qa = NULL, *qb = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &a, &qa));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &b, &qb));
  static const float stale = 1e30f;
  float *back = malloc((size_t)Mr * Nr * 4);
  assert_non_null(back);
  for (int c = 0; c < 4; c++) {
    const hq_dtype dt = c & 1 ? HQ_F32 : HQ_BF16;
    const uint32_t flags = c & 2 ? HQ_GEMM_FORCE_EMULATED : 0;
    hq_tensor d = hq_tensor_2d(dd, dt, 0, Mr, Nr);
    hq_gemm_args args = HQ_GEMM_ARGS_INIT;
    args.flags = flags;
    args.amax_d = slot;
    hq_gemm_info info = HQ_GEMM_INFO_INIT;
    /* warm: plans and workspace before the capture */
    HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(qb), 1, hq_operand_q(qa), 0, &d, 1.0f, 0.0f, &args,
                          &info));
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = hq_gemm(gpu, hq_operand_q(qb), 1, hq_operand_q(qa), 0, &d, 1.0f, 0.0f, &args,
                           NULL);
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    if (rc) fail_msg("case %d: the GEMM under capture: %s", c, hq_last_error());
    CK(ce);
    const size_t memsets = graph_count(graph, cudaGraphNodeTypeMemset);
    print_message("amax_d captured, D %s, path %s, amax_fused %u: %zu memset nodes\n",
                  dt == HQ_F32 ? "f32" : "bf16", hq_gemm_path_name(info.path), info.amax_fused,
                  memsets);
    if (memsets) fail_msg("case %d: the captured GEMM holds %zu memset nodes", c, memsets);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemcpy(slot, &stale, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0, (size_t)Mr * Nr * 4));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    float got = -1.0f, want = 0.0f;
    CK(cudaMemcpy(&got, slot, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(back, dd, (size_t)Mr * Nr * (dt == HQ_F32 ? 4 : 2), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < (int64_t)Mr * Nr; i++) {
      const float v = fabsf(hq_load_hp(back, i, dt));
      if (v > want) want = v;
    }
    assert_true(want > 0.0f);
    if (got != want)
      fail_msg("case %d (path %s, amax_fused %u): amax_d %.9g after the replay, max |D| %.9g", c,
               hq_gemm_path_name(info.path), info.amax_fused, (double)got, (double)want);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  free(back);
  hq_qtensor_free(qa);
  hq_qtensor_free(qb);
  CK(cudaStreamSynchronize(stream));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dd));
  CK(cudaFree(slot));
  free(ha.data);
  free(hb.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* A weight refreshed on a second context's stream inside a capture (a trainer's second lane:
   the write-back beside the next optimizer step), for identity BF16 and per-tensor FP8 with
   current scaling: the replay writes the bytes an eager refresh writes, and the free after it
   -- the owner's stream waits for the last foreign use first -- fails nothing and leaves no
   error for the next launch to report (the use, recorded inside a capture, is an external event
   node there, which a wait outside the capture may take). */
static void test_foreign_update_in_a_graph(void **state) {
  (void)state;
  cudaStream_t side_stream;
  CK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = side_stream;
  hq_ctx *side = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &side));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const size_t ks[] = {1, 0}; /* identity bf16, fp8_tensor */
  for (size_t r_i = 0; r_i < sizeof ks / sizeof *ks; r_i++) {
    hq_recipe *r = step_recipe(ks[r_i]);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:l");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_tensor first = hq_test_tensor(HQ_F32, N, K, 31, 1.0f);
    hq_tensor second = hq_test_tensor(HQ_F32, N, K, 32, 2.5f);
    const size_t bytes = (size_t)(N * K) * sizeof(float);
    void *p = NULL, *p2 = NULL;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&p2, bytes));
    CK(cudaMemcpy(p, first.data, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p2, second.data, bytes, cudaMemcpyHostToDevice));
    hq_tensor src = hq_tensor_2d(p, HQ_F32, 0, N, K), src2 = hq_tensor_2d(p2, HQ_F32, 0, N, K);
    hq_qtensor *qt = NULL, *want = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &src, &qt));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &src2, &want));
    /* warm: the foreign refresh once, eagerly */
    HQ_OK_OR_FAIL(hq_qtensor_update(qt, side, &src));
    CK(cudaStreamSynchronize(side_stream));
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(fork, stream));
    CK(cudaStreamWaitEvent(side_stream, fork, 0));
    const int rc = hq_qtensor_update(qt, side, &src);
    CK(cudaEventRecord(join, side_stream));
    CK(cudaStreamWaitEvent(stream, join, 0));
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    if (rc) fail_msg("%s: the foreign refresh under capture: %s", recipes[ks[r_i]],
                     hq_last_error());
    CK(ce);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemcpyAsync(p, p2, bytes, cudaMemcpyDeviceToDevice, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    for (int dir = 0; dir < 2; dir++) {
      const uint32_t dd = dir ? HQ_COLWISE : HQ_ROWWISE;
      hq_tensor a = hq_test_empty(HQ_F32, N, K), b = hq_test_empty(HQ_F32, N, K);
      void *da = NULL, *db = NULL;
      CK(cudaMalloc(&da, bytes));
      CK(cudaMalloc(&db, bytes));
      hq_tensor ta = hq_tensor_2d(da, HQ_F32, 0, N, K), tb = hq_tensor_2d(db, HQ_F32, 0, N, K);
      HQ_OK_OR_FAIL(hq_dequantize(qt, gpu, dd, &ta));
      HQ_OK_OR_FAIL(hq_dequantize(want, gpu, dd, &tb));
      CK(cudaStreamSynchronize(stream));
      CK(cudaMemcpy(a.data, da, bytes, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data, db, bytes, cudaMemcpyDeviceToHost));
      if (memcmp(a.data, b.data, bytes))
        fail_msg("%s: the replayed foreign refresh differs from a quantize of its source (%s)",
                 recipes[ks[r_i]], dir ? "columnwise" : "rowwise");
      CK(cudaFree(da));
      CK(cudaFree(db));
      free(a.data);
      free(b.data);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    /* the free waits for the foreign stream's last use, recorded by the replay */
    hq_qtensor_free(qt);
    const cudaError_t left = cudaGetLastError();
    if (left != cudaSuccess)
      fail_msg("%s: the free after a captured foreign refresh left '%s' behind",
               recipes[ks[r_i]], cudaGetErrorString(left));
    hq_qtensor_free(want);
    hq_quantizer_free(q);
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(p));
    CK(cudaFree(p2));
    free(first.data);
    free(second.data);
    hq_recipe_free(r);
  }
  hq_ctx_destroy(side);
  CK(cudaStreamDestroy(side_stream));
  CK(cudaEventDestroy(fork));
  CK(cudaEventDestroy(join));
}

static int setup(void **state) {
  (void)state;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return -1;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = stream;
  return hq_ctx_create(&d, &gpu) == HQ_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(gpu);
  cudaStreamDestroy(stream);
  return 0;
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_step_in_a_graph),
                                     cmocka_unit_test(test_adam_in_a_graph),
                                     cmocka_unit_test(test_first_gemm_captured),
                                     cmocka_unit_test(test_fold_pair_captured),
                                     cmocka_unit_test(test_amax_in_a_graph),
                                     cmocka_unit_test(test_quantizer_amax_in_a_graph),
                                     cmocka_unit_test(test_raw_copy_gemm),
                                     cmocka_unit_test(test_amax_d_in_a_graph),
                                     cmocka_unit_test(test_ctx_capturing),
                                     cmocka_unit_test(test_foreign_update_in_a_graph)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
