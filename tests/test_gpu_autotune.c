/*
** test_gpu_autotune.c -- the cuBLASLt runner with HQ_GEMM_AUTOTUNE=1 (set here before the
** process's first GEMM: the runner reads it once). A plan's first call times the heuristic's
** candidates on the call's own operands before it runs; what must hold:
**   - the tuned call means what it says: alpha and beta over a random D0 (the candidates run into
**     a scratch D then) and beta 0 (into D itself, overwritten by the call) agree with the F64
**     product of the dequantized operands within the native path's tolerance, for the per-tensor
**     FP8 pairs the trainer runs (E4M3 x E4M3 and the hybrids' mixed pairs, all transposes) and
**     for BF16 identity;
**   - the first call (the one that tuned) and every later call give the same bytes, with beta 0
**     and with beta 1 (a tuning that wrote into D, or read it, would show here);
**   - a plan whose first call is captured into a CUDA graph is not tuned (nothing synchronizes
**     inside the capture, which must succeed), and the replay gives the eager call's bytes.
** Exits 77 (skipped) without a CUDA device.
*/
#include <cuda_runtime.h>
#include <stdlib.h>

#include "hq_gpu_test.h"

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                 \
  } while (0)

static hq_ctx *cpu, *gpu;
static hq_recipe *rec;

static const char recipe_text[] =
    "[format a]\nplugin = fp8_tensor\n"
    "[format b]\nplugin = fp8_tensor\ndtype = e5m2\n"
    "[format h]\nplugin = identity\ndtype = bf16\n"
    "[role *:*:a]\nrowwise = a\ncolumnwise = a\n"
    "[role *:*:b]\nrowwise = b\ncolumnwise = b\n"
    "[role *:*:h]\nrowwise = h\ncolumnwise = h\n";

static int setup(void **state) {
  (void)state;
  if (hq_gpu_contexts(&cpu, &gpu, 0)) return -1;
  rec = hq_test_recipe(recipe_text);
  return rec ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hq_recipe_free(rec);
  hq_ctx_destroy(cpu);
  hq_ctx_destroy(gpu);
  return 0;
}

static hq_tensor to_dev(hq_ctx *ctx, const hq_tensor *h) { return hq_gpu_tensor_at(ctx, h, 0); }

/* A [r0, r1] BF16 tensor quantized on ctx's device with role `role`, both directions. */
static hq_qtensor *make_q(hq_ctx *ctx, const char *role, int64_t r0, int64_t r1, uint64_t seed) {
  hq_quantizer *q = hq_test_quantizer(rec, role);
  hq_tensor x = hq_test_tensor(HQ_BF16, r0, r1, seed, 1.5f);
  hq_tensor xg = to_dev(ctx, &x);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &xg, &qt));
  HQ_OK_OR_FAIL(hq_ctx_sync(ctx));
  hq_ctx_free(ctx, xg.data);
  free(x.data);
  hq_quantizer_free(q);
  return qt;
}

/* The tuned plan's first call and the emulated path against the F64 product (alpha 1.25, beta
   0.5 over a random D0: the candidates are timed into a scratch D). Each case is a problem no
   earlier call made, so its first call tunes. */
static void test_tuned_vs_f64(void **state) {
  (void)state;
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  if (arch < 89) skip(); /* no native FP8 GEMM: nothing of the FP8 pairs reaches cuBLASLt */
  static const char *pairs[][2] = {{"l:w:a", "l:x:a"}, {"l:w:a", "l:x:b"}, {"l:w:b", "l:x:a"},
                                   {"l:w:h", "l:x:h"}};
  const int64_t M = 192, N = 320, K = 512;
  for (int pr = 0; pr < 4; pr++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const hq_dtype ddt = (ta + tb + pr) & 1 ? HQ_BF16 : HQ_F32;
        char what[160];
        snprintf(what, sizeof what, "tuned %s x %s ta %d tb %d D %s", pairs[pr][0],
                 pairs[pr][1], ta, tb, hq_dtype_name(ddt));
        hq_qtensor *A = make_q(gpu, pairs[pr][0], ta ? M : K, ta ? K : M, 71 + (uint64_t)pr);
        hq_qtensor *B = make_q(gpu, pairs[pr][1], tb ? K : N, tb ? N : K, 81 + (uint64_t)pr);
        hq_tensor d0h = hq_test_tensor(ddt, N, M, 91, 1.0f);
        hq_tensor d = to_dev(gpu, &d0h), de = to_dev(gpu, &d0h);
        hq_gpu_gemm_vs_f64(gpu, A, ta, B, tb, &d0h, &d, &de, HQ_GEMM_PATH_NATIVE, NULL,
                           HQ_GEMM_PATH_EMULATED_BF16, what);
        hq_ctx_free(gpu, d.data);
        hq_ctx_free(gpu, de.data);
        free(d0h.data);
        hq_qtensor_free(A);
        hq_qtensor_free(B);
      }
}

/* D's bytes back on the host. */
static void *back(hq_ctx *ctx, const hq_tensor *d, size_t bytes) {
  void *h = malloc(bytes);
  assert_non_null(h);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(ctx, h, HQ_DEVICE_HOST, d->data, hq_ctx_device(ctx), bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(ctx));
  return h;
}

/* The first call of a plan (it tunes) and four more give the same bytes, from the same D0, with
   beta 0 and beta 1: the hybrids' dgrad and wgrad pair (E4M3 x E5M2) and the E4M3 pair, D F32
   as the trainer's, at a size where the heuristic has several candidates. */
static void test_repeat_identical(void **state) {
  (void)state;
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  if (arch < 89) skip();
  const int64_t M = 512, N = 1536, K = 1024;
  static const char *pairs[][2] = {{"l:w:a", "l:dy:b"}, {"l:w:a", "l:x:a"}};
  for (int pr = 0; pr < 2; pr++)
    for (int acc = 0; acc < 2; acc++) {
      /* a new shape for each case: its plan is made, and tuned, by the first call below */
      const int64_t n = N + 64 * (2 * pr + acc);
      hq_qtensor *A = make_q(gpu, pairs[pr][0], M, K, 101);
      hq_qtensor *B = make_q(gpu, pairs[pr][1], n, K, 102);
      hq_tensor d0h = hq_test_tensor(HQ_F32, n, M, 103, 1.0f);
      hq_tensor d = to_dev(gpu, &d0h);
      const size_t bytes = (size_t)(n * M) * sizeof(float);
      void *first = NULL;
      for (int rep = 0; rep < 5; rep++) {
        HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, d.data, hq_ctx_device(gpu), d0h.data, HQ_DEVICE_HOST,
                                    bytes));
        hq_gemm_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(A), 1, hq_operand_q(B), 0, &d, 1.0f,
                              acc ? 1.0f : 0.0f, NULL, &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_NATIVE);
        void *got = back(gpu, &d, bytes);
        if (!first) {
          first = got;
          continue;
        }
        if (memcmp(first, got, bytes)) {
          size_t i = 0;
          while (((float *)first)[i] == ((float *)got)[i]) i++;
          fail_msg("%s x %s beta %d: call %d differs from the first (tuned) call at D[%zu]: "
                   "%.9g vs %.9g", pairs[pr][0], pairs[pr][1], acc, rep, i,
                   (double)((float *)got)[i], (double)((float *)first)[i]);
        }
        free(got);
      }
      printf("%s x %s, beta %d: 5 calls, the same bytes\n", pairs[pr][0], pairs[pr][1], acc);
      free(first);
      free(d0h.data);
      hq_ctx_free(gpu, d.data);
      hq_qtensor_free(A);
      hq_qtensor_free(B);
    }
}

/* A plan first called inside a stream capture: the capture succeeds (the runner timed nothing
   there), and the graph's replay gives the bytes of the same call run eagerly afterwards (the
   plan keeps the algorithm it started with). */
static void test_first_call_captured(void **state) {
  (void)state;
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  if (arch < 89) skip();
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  hq_ctx_desc desc = {0};
  desc.struct_size = sizeof desc;
  desc.device = 0;
  desc.stream = stream;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&desc, &ctx));
  const int64_t M = 256, N = 640, K = 768;
  hq_qtensor *A = make_q(ctx, "l:w:a", M, K, 111);
  hq_qtensor *B = make_q(ctx, "l:dy:b", N, K, 112);
  hq_tensor d0h = hq_test_tensor(HQ_F32, N, M, 113, 1.0f);
  hq_tensor d = to_dev(ctx, &d0h);
  const size_t bytes = (size_t)(N * M) * sizeof(float);
  /* the context's workspace and its choice of provider for the pair exist before the capture:
     an eager call of the same pair at another shape made them; only the runner's plan is new */
  {
    hq_qtensor *W = make_q(ctx, "l:w:a", 128, 256, 114), *X = make_q(ctx, "l:dy:b", 64, 256, 115);
    hq_tensor e = hq_tensor_2d(NULL, HQ_F32, 0, 64, 128);
    HQ_OK_OR_FAIL(hq_ctx_alloc(ctx, 64 * 128 * sizeof(float), &e.data));
    HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(W), 1, hq_operand_q(X), 0, &e, 1.0f, 0.0f, NULL,
                          NULL));
    HQ_OK_OR_FAIL(hq_ctx_sync(ctx));
    hq_ctx_free(ctx, e.data);
    hq_qtensor_free(W);
    hq_qtensor_free(X);
  }
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int rc = hq_gemm(ctx, hq_operand_q(A), 1, hq_operand_q(B), 0, &d, 1.0f, 0.0f, NULL, NULL);
  const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
  if (rc) fail_msg("hq_gemm under capture: %s", hq_last_error());
  if (ce != cudaSuccess) fail_msg("the capture broke: %s", cudaGetErrorString(ce));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaMemsetAsync(d.data, 0xff, bytes, stream));
  CK(cudaGraphLaunch(exec, stream));
  void *replayed = back(ctx, &d, bytes);
  CK(cudaMemsetAsync(d.data, 0xff, bytes, stream));
  HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), 1, hq_operand_q(B), 0, &d, 1.0f, 0.0f, NULL, NULL));
  void *eager = back(ctx, &d, bytes);
  assert_memory_equal(replayed, eager, bytes);
  free(replayed);
  free(eager);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  free(d0h.data);
  hq_ctx_free(ctx, d.data);
  hq_qtensor_free(A);
  hq_qtensor_free(B);
  hq_ctx_destroy(ctx);
  CK(cudaStreamDestroy(stream));
}

int main(void) {
  /* before the first GEMM of the process: the runner reads the variable once */
  setenv("HQ_GEMM_AUTOTUNE", "1", 1);
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repeat_identical),
      cmocka_unit_test(test_first_call_captured),
      cmocka_unit_test(test_tuned_vs_f64),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
