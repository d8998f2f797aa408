/*
** test_gpu_rng_graph.c -- stochastic rounding captured in a CUDA graph (issue 48, plugin ABI 2.6):
** an in-place refresh (hq_qtensor_update) of an output gradient with stochastic rounding --
** nvfp4 (both directions, one call), nvfp4 with rht, mxfp4 (both directions) -- captured once
** on the context's stream, then replayed after hq_ctx_set_rng_offset(ctx, s) for s = 1, 2, 3.
** Each replay's bytes (every buffer, both directions; zeroed before the replay, so that a replay
** that wrote nothing cannot pass) equal those of the CPU reference quantizing the same input at
** step s, and those of the same update run eagerly at step s; the replays of different steps
** differ (a replay that repeated the captured step's offset would give step 0's bytes every
** time). Refusals: hq_ctx_set_rng_offset during a capture (HQ_ESTATE: it would fix every
** replay's step), a captured stochastic quantize on a context whose step was never set (no step
** on the device yet), and one by a module without HQ_CAP_RNG_DEV (tests/wrap/nvfp4_norng.c: its
** noise would repeat at every replay).
** Exits 77 (skipped) without a CUDA device.
*/
#include <cuda_runtime.h>

#include "hq_gpu_test.h"

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                 \
  } while (0)

enum { M = 256, K = 512 };
#define SEED 0x5eedull
#define ROLE "linear:grad_output:g"

static cudaStream_t stream;
static hq_ctx *cpu, *gpu;

static const char *recipes[] = {
    "[format g]\nplugin = nvfp4\nstochastic_rounding = true\n"
    "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
    "[format g]\nplugin = nvfp4\nstochastic_rounding = true\nrht = true\n"
    "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
    "[format g]\nplugin = mxfp4\nstochastic_rounding = true\n"
    "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
};

/* A context on device 0 with `s` as its stream and the test's seed. */
static hq_ctx *gpu_ctx(cudaStream_t s) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = s;
  d.seed = SEED;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  return ctx;
}

/* Every buffer of both directions of qt (device memory), concatenated on the host. */
static uint8_t *qt_bytes(const hq_qtensor *qt, size_t *n) {
  size_t total = 0, at = 0;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(qt, dir);
    assert_non_null(s);
    for (uint32_t i = 0; i < s->nbuf; i++) total += hq_storage_cbuf(s, i)->bytes;
  }
  uint8_t *h = malloc(total);
  assert_non_null(h);
  CK(cudaStreamSynchronize(stream));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; i < s->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(s, i);
      CK(cudaMemcpy(h + at, b->ptr, b->bytes, cudaMemcpyDeviceToHost));
      at += b->bytes;
    }
  }
  *n = total;
  return h;
}

/* Zero every buffer of qt on the stream. */
static void qt_zero(const hq_qtensor *qt) {
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; i < s->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(s, i);
      CK(cudaMemsetAsync(b->ptr, 0, b->bytes, stream));
    }
  }
}

static void test_replays_draw_their_step(void **state) {
  (void)state;
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 17, 2.0f);
  hq_tensor xg = hq_gpu_tensor_at(gpu, &x, 0);
  for (size_t k = 0; k < sizeof recipes / sizeof *recipes; k++) {
    hq_recipe *r = hq_test_recipe(recipes[k]);
    hq_quantizer *q = hq_test_quantizer(r, ROLE);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_qtensor *qt = NULL;
    /* warm, outside the capture: the storages, the scratch and the kernels' first launch */
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 0));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qt));
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 0));
    HQ_OK_OR_FAIL(hq_qtensor_update(qt, gpu, &xg));
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 0));
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    /* setting the step inside the capture would fix it for every replay: refused, and the
       capture goes on */
    const int set_rc = hq_ctx_set_rng_offset(gpu, 9);
    const int rc = hq_qtensor_update(qt, gpu, &xg);
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    assert_int_equal(set_rc, HQ_ESTATE);
    if (rc) fail_msg("%s: the update under capture: %s", recipes[k], hq_last_error());
    CK(ce);
    assert_int_equal(hq_ctx_rng_offset(gpu), 0); /* the refused set changed nothing */
    CK(cudaGraphInstantiate(&exec, graph, 0));
    uint8_t *replayed[4] = {NULL};
    size_t n = 0;
    for (uint64_t s = 1; s <= 3; s++) {
      qt_zero(qt);
      HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, s));
      CK(cudaGraphLaunch(exec, stream));
      replayed[s] = qt_bytes(qt, &n);
      /* the CPU reference: a fresh quantize, the step's first of the role, as the replay's */
      hq_qtensor *ref = NULL;
      HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(cpu, s));
      HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &ref));
      char what[160];
      snprintf(what, sizeof what, "%s: replay at step %llu against the CPU", recipes[k],
               (unsigned long long)s);
      hq_gpu_compare_usage(gpu, ref, qt, HQ_BOTH, what);
      hq_qtensor_free(ref);
      /* the same update eagerly at step s */
      qt_zero(qt);
      HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, s));
      HQ_OK_OR_FAIL(hq_qtensor_update(qt, gpu, &xg));
      size_t ne = 0;
      uint8_t *eager = qt_bytes(qt, &ne);
      assert_int_equal(ne, n);
      if (memcmp(eager, replayed[s], n)) {
        size_t at = 0;
        while (eager[at] == replayed[s][at]) at++;
        fail_msg("%s: step %llu: the replay differs from the eager update at byte %zu of %zu",
                 recipes[k], (unsigned long long)s, at, n);
      }
      free(eager);
    }
    /* each step its own draws: the data bytes of the three replays differ pairwise */
    for (int a = 1; a <= 3; a++)
      for (int b = a + 1; b <= 3; b++)
        if (!memcmp(replayed[a], replayed[b], n))
          fail_msg("%s: the replays at steps %d and %d gave the same bytes", recipes[k], a, b);
    for (int s = 1; s <= 3; s++) free(replayed[s]);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  hq_ctx_free(gpu, xg.data);
  free(x.data);
}

/* The step written by the caller: hq_ctx_rng_offset_device's word set on the stream by a copy
   from page-locked memory ahead of each replay (as hq train's upload kernel brings it), the
   context's own copy moved by hq_ctx_set_rng_offset_ex(HQ_RNG_OFFSET_HOST_ONLY), which queues
   nothing: each replay's bytes equal the CPU reference's at its step, as with
   hq_ctx_set_rng_offset. The word is the same one every call returns; a host context has none. */
static void test_caller_writes_the_step(void **state) {
  (void)state;
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 23, 2.0f);
  hq_tensor xg = hq_gpu_tensor_at(gpu, &x, 0);
  hq_recipe *r = hq_test_recipe(recipes[0]);
  hq_quantizer *q = hq_test_quantizer(r, ROLE);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
  uint64_t *word = NULL, *again = NULL, *host_step = NULL;
  HQ_OK_OR_FAIL(hq_ctx_rng_offset_device(gpu, &word));
  HQ_OK_OR_FAIL(hq_ctx_rng_offset_device(gpu, &again));
  assert_non_null(word);
  assert_ptr_equal(word, again);
  CK(cudaMallocHost((void **)&host_step, sizeof *host_step));
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 0));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &qt));
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(gpu, 0));
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  /* the host-only set queues nothing: allowed inside the capture */
  const int set_rc = hq_ctx_set_rng_offset_ex(gpu, 0, HQ_RNG_OFFSET_HOST_ONLY);
  const int rc = hq_qtensor_update(qt, gpu, &xg);
  const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
  HQ_OK_OR_FAIL(set_rc);
  if (rc) fail_msg("the update under capture: %s", hq_last_error());
  CK(ce);
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t s = 4; s <= 5; s++) {
    qt_zero(qt);
    *host_step = s;
    CK(cudaMemcpyAsync(word, host_step, sizeof *word, cudaMemcpyHostToDevice, stream));
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset_ex(gpu, s, HQ_RNG_OFFSET_HOST_ONLY));
    assert_int_equal(hq_ctx_rng_offset(gpu), s);
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    hq_qtensor *ref = NULL;
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(cpu, s));
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &ref));
    char what[96];
    snprintf(what, sizeof what, "the caller's step %llu against the CPU", (unsigned long long)s);
    hq_gpu_compare_usage(gpu, ref, qt, HQ_BOTH, what);
    hq_qtensor_free(ref);
  }
  uint64_t *none = word;
  assert_int_equal(hq_ctx_rng_offset_device(cpu, &none), HQ_EINVAL);
  assert_null(none);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaFreeHost(host_step));
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_free(gpu, xg.data);
  free(x.data);
}

/* A captured stochastic update that cannot draw a fresh stream at every replay is refused
   (HQ_ESTATE, naming the role), and the capture ends without an error of CUDA's: on a context
   whose step was never set (nothing on the device to read) and by a module without
   HQ_CAP_RNG_DEV. The same updates outside a capture run. */
static void test_refusals(void **state) {
  (void)state;
  const char *wrap = getenv("HQ_TEST_WRAP_DIR");
  if (!wrap) fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/../norng/.libs", wrap);
  const char *dirs[1] = {dir};
  static const char *texts[2] = {
      "[format g]\nplugin = nvfp4\nstochastic_rounding = true\n"
      "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
      "[format g]\nplugin = nvfp4_norng\nstochastic_rounding = true\n"
      "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n",
  };
  static const char *why[2] = {"call it before the capture", "HQ_CAP_RNG_DEV"};
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 128, 5, 1.0f);
  for (int k = 0; k < 2; k++) {
    hq_ctx *ctx = gpu_ctx(stream); /* a fresh context: its step never set */
    hq_tensor xg = hq_gpu_tensor_at(ctx, &x, 0);
    hq_recipe *r = hq_test_recipe_dirs(texts[k], dirs, 1);
    hq_quantizer *q = hq_test_quantizer(r, ROLE);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_BOTH));
    hq_qtensor *qt = NULL;
    if (k == 1) HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 4)); /* the step is there */
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &xg, &qt));
    HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &xg));
    CK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = hq_qtensor_update(qt, ctx, &xg);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", hq_last_error());
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphDestroy(graph));
    assert_int_equal(rc, HQ_ESTATE);
    if (!strstr(msg, ROLE) || !strstr(msg, why[k]))
      fail_msg("%s: the refusal's message: %s", texts[k], msg);
    HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &xg)); /* eagerly: as before */
    CK(cudaStreamSynchronize(stream));
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
    hq_recipe_free(r);
    hq_ctx_free(ctx, xg.data);
    hq_ctx_destroy(ctx);
  }
  free(x.data);
}

static int setup(void **state) {
  (void)state;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return -1;
  hq_ctx_desc h = {0};
  h.struct_size = sizeof h;
  h.device = HQ_DEVICE_HOST;
  h.seed = SEED;
  if (hq_ctx_create(&h, &cpu)) return -1;
  gpu = gpu_ctx(stream);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(gpu);
  hq_ctx_destroy(cpu);
  cudaStreamDestroy(stream);
  return 0;
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_replays_draw_their_step),
                                     cmocka_unit_test(test_caller_writes_the_step),
                                     cmocka_unit_test(test_refusals)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
