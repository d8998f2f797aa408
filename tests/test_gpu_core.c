/*
** test_gpu_core.c -- the core's CUDA contract (hq.h, "Contexts, streams and devices"):
**   - all work of a call is ordered on the context's stream (a non-blocking stream here, so
**     nothing is hidden on the legacy stream): results equal the CPU reference;
**   - hq_qtensor_update allocates nothing and synchronizes nothing, so it can be captured into a
**     CUDA graph; replaying the graph on new data equals a fresh quantize of that data;
**   - calls restore the caller's current device (on a machine with two devices, a context on
**     device 1 is used while device 0 is current);
**   - FSDP extract/assign run on the device (transposes included) and match a full quantize;
**   - hq_adam_step refuses a quantized weight on another device before it writes anything, and
**     leaves a write-back amax slot the caller promised zero (HQ_ADAM_AMAX_ZEROED) unzeroed;
**   - the identity format's dtype conversions give the CPU's bytes (every 16-bit pattern);
**   - a qtensor used through another context's stream: the owner's allocations and frees are
**     ordered against that stream by events (no race with the stream-ordered pool);
**   - hq_device_mem_stats counts hq's pool alone, its peak included, and resets the peak;
**   - hq_ctx_memset sets exactly the bytes asked on the stream, by its kernel (small aligned
**     zeroings) and by the memset (the rest), and a captured one replays.
** Exits 77 (skipped) without a CUDA device.
*/
#include <cuda_runtime.h>
#include <time.h>

#include "hq_gpu_test.h"

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                 \
  } while (0)

static cudaStream_t stream;
static hq_ctx *cpu, *gpu;
static int fused_adam_logged; /* debug messages "AdamW fused into ..." seen on the gpu context */
static int copy_logged;       /* ... and "... written by the rowwise call" (copy_out) */

static void gpu_log(void *user, int level, const char *msg) {
  (void)user;
  if (strstr(msg, "AdamW fused into")) fused_adam_logged++;
  if (strstr(msg, "written by the rowwise call")) copy_logged++;
  if (level <= 1) fprintf(stderr, "hq: %s\n", msg);
}

static int setup(void **state) {
  (void)state;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return -1;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = stream;
  d.log = gpu_log;
  if (hq_ctx_create(NULL, &cpu) || hq_ctx_create(&d, &gpu)) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(cpu);
  hq_ctx_destroy(gpu);
  cudaStreamDestroy(stream);
  return 0;
}

/* A host-to-device copy finished before anything on `stream` runs. Not a plain cudaMemcpy: from
   pageable memory it may return before its DMA lands, and `stream` (non-blocking) does not wait
   for the legacy stream, so a kernel could read a half-copied input. */
static void h2d(void *d, const void *h, size_t bytes) {
  CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream));
  CK(cudaStreamSynchronize(stream));
}

static void *to_device(const void *h, size_t bytes) {
  void *d = NULL;
  CK(cudaMalloc(&d, bytes));
  h2d(d, h, bytes);
  return d;
}

/* Every buffer of both directions of g (device) equals h's (host). */
static void compare(const hq_qtensor *h, const hq_qtensor *g, const char *what) {
  CK(cudaStreamSynchronize(stream));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
    if (!sh) continue;
    assert_non_null(sg);
    for (uint32_t i = 0; i < sh->nbuf; i++) {
      const hq_buffer *bh = hq_storage_cbuf(sh, i), *bg = hq_storage_cbuf(sg, i);
      uint8_t *tmp = malloc(bh->bytes);
      CK(cudaMemcpy(tmp, bg->ptr, bh->bytes, cudaMemcpyDeviceToHost));
      if (memcmp(tmp, bh->ptr, bh->bytes) != 0) {
        size_t at = 0, count = 0;
        for (size_t b = bh->bytes; b-- > 0;)
          if (tmp[b] != ((const uint8_t *)bh->ptr)[b]) at = b, count++;
        fail_msg("%s: %s buffer '%s' differs from the CPU in %zu of %zu bytes, first at byte %zu "
                 "(GPU 0x%02x, CPU 0x%02x)", what, dir == HQ_ROWWISE ? "rowwise" : "columnwise",
                 bh->name, count, bh->bytes, at, tmp[at], ((const uint8_t *)bh->ptr)[at]);
      }
      free(tmp);
    }
  }
}

static const char *recipes[] = {
    "[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = identity\ndtype = bf16\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format a]\nplugin = fp8_tensor\n[format b]\nplugin = identity\n"
    "[role *:*:*]\nrowwise = a\ncolumnwise = b\n",
};

static void test_graph_capture_update(void **state) {
  (void)state;
  const int64_t M = 256, K = 384;
  for (size_t k = 0; k < sizeof recipes / sizeof recipes[0]; k++) {
    hq_recipe *r = hq_test_recipe(recipes[k]);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 1, 1.0f);
    hq_tensor y = hq_test_tensor(HQ_BF16, M, K, 2, 30.0f);
    size_t bytes = (size_t)(M * K) * 2;
    hq_tensor xd = hq_tensor_2d(to_device(x.data, bytes), HQ_BF16, 0, M, K);
    hq_qtensor *qt = NULL, *ref = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xd, &qt));
    /* capture the update: any allocation or synchronization inside would break the capture */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = hq_qtensor_update(qt, gpu, &xd);
    cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    if (rc) fail_msg("update under capture: %s", hq_last_error());
    CK(ce);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    /* new data in the same device buffer, replay */
    CK(cudaMemcpyAsync(xd.data, y.data, bytes, cudaMemcpyHostToDevice, stream));
    CK(cudaGraphLaunch(exec, stream));
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &y, &ref));
    compare(ref, qt, recipes[k]);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    hq_qtensor_free(ref);
    hq_qtensor_free(qt);
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(xd.data));
    free(x.data);
    free(y.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}

static void test_current_device_restored(void **state) {
  (void)state;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  int use = n > 1 ? 1 : 0, cur = -1;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = use;
  hq_ctx *ctx = NULL;
  CK(cudaSetDevice(0));
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  CK(cudaGetDevice(&cur));
  assert_int_equal(cur, 0);
  hq_recipe *r = hq_test_recipe(recipes[0]);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 64, 3, 1.0f);
  void *xd = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(ctx, 64 * 64 * 4, &xd));
  CK(cudaGetDevice(&cur));
  assert_int_equal(cur, 0);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(ctx, xd, use, x.data, HQ_DEVICE_HOST, 64 * 64 * 4));
  hq_tensor t = hq_tensor_2d(xd, HQ_F32, use, 64, 64);
  hq_qtensor *qt = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &t, &qt));
  CK(cudaGetDevice(&cur));
  assert_int_equal(cur, 0);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &t));
  HQ_OK_OR_FAIL(hq_ctx_sync(ctx));
  CK(cudaGetDevice(&cur));
  assert_int_equal(cur, 0);
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &ref));
  /* compare on the tensor's device */
  const hq_buffer *bh = hq_storage_cbuf(hq_qtensor_storage(ref, HQ_ROWWISE), 0);
  const hq_buffer *bg = hq_storage_cbuf(hq_qtensor_storage(qt, HQ_ROWWISE), 0);
  uint8_t *tmp = malloc(bh->bytes);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(ctx, tmp, HQ_DEVICE_HOST, bg->ptr, use, bh->bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(ctx));
  assert_memory_equal(tmp, bh->ptr, bh->bytes);
  free(tmp);
  hq_qtensor_free(qt);
  hq_qtensor_free(ref);
  hq_ctx_free(ctx, xd);
  CK(cudaGetDevice(&cur));
  assert_int_equal(cur, 0);
  hq_ctx_destroy(ctx);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* hq_ctx_memset on the device, each case in a buffer of 0xee bytes whose every byte is then
   checked: the kernel's zeroings (4-byte aligned, up to 16 KiB: the smallest, one at the limit)
   and the memset's (one word over the limit, an unaligned start or length, a non-zero value);
   then one captured into a CUDA graph and replayed over a refilled buffer. */
static void test_ctx_memset_device(void **state) {
  (void)state;
  enum { N = 40000 };
  const struct { size_t off, n; int value; } cases[] = {
      {4, 4, 0}, {128, 16384, 0}, {256, 16388, 0}, {1, 6, 0}, {8, 10, 0}, {100, 1000, 0x5a}};
  unsigned char *d = NULL, *h = malloc(N);
  CK(cudaMalloc((void **)&d, N));
  for (size_t c = 0; c <= sizeof cases / sizeof cases[0]; c++) {
    const int graph = c == sizeof cases / sizeof cases[0]; /* the last round: a replayed capture */
    const size_t off = graph ? 64 : cases[c].off, n = graph ? 32 : cases[c].n;
    const int value = graph ? 0 : cases[c].value;
    CK(cudaMemsetAsync(d, 0xee, N, stream));
    if (graph) {
      cudaGraph_t g;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const int rc = hq_ctx_memset(gpu, d + off, value, n);
      const cudaError_t ce = cudaStreamEndCapture(stream, &g);
      if (rc) fail_msg("hq_ctx_memset under capture: %s", hq_last_error());
      CK(ce);
      CK(cudaGraphInstantiate(&exec, g, 0));
      CK(cudaMemsetAsync(d, 0xee, N, stream)); /* what the capture did not run */
      CK(cudaGraphLaunch(exec, stream));
      CK(cudaStreamSynchronize(stream));
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(g));
    } else {
      HQ_OK_OR_FAIL(hq_ctx_memset(gpu, d + off, value, n));
    }
    CK(cudaMemcpyAsync(h, d, N, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < N; i++) {
      const int want = i >= off && i < off + n ? value : 0xee;
      if (h[i] != want)
        fail_msg("%s [%zu, +%zu) = %d: byte %zu is 0x%02x, 0x%02x expected",
                 graph ? "replayed" : "set", off, n, value, i, h[i], want);
    }
  }
  assert_int_equal(hq_ctx_memset(gpu, d, 300, 4), HQ_EINVAL);
  CK(cudaFree(d));
  free(h);
}

/* The FSDP protocol on the device: fp8_tensor (its columnwise copy is transposed: the COLS rule
   runs the core's transpose kernel both ways) and identity, 4 shards. */
static void test_fsdp_on_device(void **state) {
  (void)state;
  const int64_t ms = 96, M = 4 * ms, K = 200;
  for (size_t k = 0; k < sizeof recipes / sizeof recipes[0]; k++) {
    hq_recipe *r = hq_test_recipe(recipes[k]);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 7, 1.0f);
    size_t bytes = (size_t)(M * K) * 2;
    void *xdev = to_device(x.data, bytes);
    float *amax = NULL, shared[2] = {0, 0};
    CK(cudaMalloc((void **)&amax, 2 * sizeof(float)));
    hq_qtensor *shard[4];
    hq_fsdp_buffer ext[4][8];
    size_t n = 0;
    for (int s = 0; s < 4; s++) {
      hq_tensor xs = hq_tensor_2d((char *)xdev + (size_t)(s * ms * K) * 2, HQ_BF16, 0, ms, K);
      float a[2];
      HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, &xs, amax));
      CK(cudaMemcpyAsync(a, amax, sizeof a, cudaMemcpyDeviceToHost, stream));
      CK(cudaStreamSynchronize(stream));
      for (int d = 0; d < 2; d++) shared[d] = a[d] > shared[d] ? a[d] : shared[d];
    }
    h2d(amax, shared, sizeof shared);
    hq_quantize_args args = {.struct_size = sizeof args, .amax = amax};
    for (int s = 0; s < 4; s++) {
      hq_tensor xs = hq_tensor_2d((char *)xdev + (size_t)(s * ms * K) * 2, HQ_BF16, 0, ms, K);
      HQ_OK_OR_FAIL(hq_quantize_ex(q, gpu, &xs, &args, &shard[s]));
      HQ_OK_OR_FAIL(hq_fsdp_extract(shard[s], gpu, ext[s], 8, sizeof(hq_fsdp_buffer), &n));
    }
    hq_fsdp_buffer g[8];
    void *mem[8];
    for (size_t e = 0; e < n; e++) {
      size_t per = (size_t)(ext[0][e].rows * ext[0][e].row_bytes);
      CK(cudaMalloc(&mem[e], per * 4));
      for (int s = 0; s < 4; s++)
        CK(cudaMemcpyAsync((char *)mem[e] + per * (size_t)s, ext[s][e].ptr, per,
                           cudaMemcpyDeviceToDevice, stream));
      g[e] = ext[0][e];
      g[e].rows *= 4;
      g[e].ptr = mem[e];
    }
    hq_qtensor *full = NULL, *ref = NULL;
    HQ_OK_OR_FAIL(hq_make_empty(q, gpu, M, K, HQ_BF16, &full));
    HQ_OK_OR_FAIL(hq_fsdp_assign(full, gpu, shard[0], g, n, sizeof(hq_fsdp_buffer)));
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &ref)); /* the CPU, whole tensor, own amax */
    compare(ref, full, recipes[k]);
    for (size_t e = 0; e < n; e++) CK(cudaFree(mem[e]));
    for (int s = 0; s < 4; s++) hq_qtensor_free(shard[s]);
    hq_qtensor_free(full);
    hq_qtensor_free(ref);
    CK(cudaStreamSynchronize(stream));
    CK(cudaFree(amax));
    CK(cudaFree(xdev));
    free(x.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
}


/* AdamW on the device gives the CPU's bits (one element rule), and the write-back equals the
   CPU's and a fresh quantize of the new master for weights whose per-tensor amax the core's
   Adam kernel computes in its own pass (fp8_tensor current scaling, alone and as the rowwise
   half of a hybrid; nvfp4's global scales), whose columnwise amax is format-specific (nvfp4
   with RHT: the update computes it), which need none (2-D nvfp4), and whose module runs the
   whole step inside its write-back kernel (HQ_CAP_FUSED_ADAM: mxfp8 with both directions and
   with the rowwise direction alone, identity in BF16 and F32, fp8_block 1-D and 2-D), and the
   hybrid whose BF16 / F16 identity copy fp8_tensor's update writes beside its codes (copy_out,
   after the step's kernel); the
   shape (160 x 288) gives fp8_block 2 x 3 tiles, the last ones partial (fp8_block and delayed
   fp8_tensor split the step off there; delayed fp8_tensor is run on a size that takes its fused
   kernel too); non-finite counting on the device. */
static const int adam_fused[] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
static const int adam_copy[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
static const char *adam_recipes[] = {
    "[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format a]\nplugin = fp8_tensor\n[format b]\nplugin = identity\n"
    "[role *:*:*]\nrowwise = a\ncolumnwise = b\n",
    "[format f]\nplugin = nvfp4\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format a]\nplugin = nvfp4\n[format b]\nplugin = nvfp4\nrht = true\n"
    "[role *:*:*]\nrowwise = a\ncolumnwise = b\n",
    "[format f]\nplugin = nvfp4\nblock_2d = true\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = mxfp8\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = mxfp8\ndtype = e5m2\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = identity\ndtype = bf16\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = identity\ndtype = f32\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = fp8_block\n[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    "[format f]\nplugin = fp8_block\nblock = 2d\npower_2_scales = false\n"
    "[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    /* delayed scaling (a state per context, updated between steps): fused in one instance */
    "[format f]\nplugin = fp8_tensor\nscaling = delayed\namax_history_len = 4\n"
    "[role *:*:*]\nrowwise = f\ncolumnwise = f\n",
    /* ... and not as one half of a hybrid (two calls) */
    "[format f]\nplugin = fp8_tensor\nscaling = delayed\n[format g]\nplugin = fp8_tensor\n"
    "dtype = e5m2\nscaling = delayed\nmargin = 1\n[role *:*:*]\nrowwise = f\ncolumnwise = g\n",
    /* the identity copy written by fp8_tensor's update (copy_out), BF16 and F16 */
    "[format a]\nplugin = fp8_tensor\n[format b]\nplugin = identity\ndtype = bf16\n"
    "[role *:*:*]\nrowwise = a\ncolumnwise = b\n",
    "[format a]\nplugin = fp8_tensor\n[format b]\nplugin = identity\ndtype = f16\n"
    "[role *:*:*]\nrowwise = a\ncolumnwise = b\n",
};

/* Three steps of recipe k on an R x C weight, on the CPU and the device, compared. */
static void adam_recipe_case(size_t k, int64_t R, int64_t C) {
  const int64_t n = R * C;
  hq_tensor g = hq_test_tensor(HQ_BF16, R, C, 3, 0.5f);
  float *back = malloc(n * 4);
  void *dg = to_device(g.data, n * 2);
  hq_tensor gd = hq_tensor_2d(dg, HQ_BF16, 0, R, C);
  {
    hq_tensor w = hq_test_tensor(HQ_F32, R, C, 4, 0.1f);
    float *m = calloc(n, 4), *v = calloc(n, 4);
    float *dw = to_device(w.data, n * 4), *dm = to_device(m, n * 4), *dv = to_device(v, n * 4);
    hq_recipe *r = hq_test_recipe(adam_recipes[k]);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w"), *qd = q;
    /* delayed scaling: one state per context and a quantizer bound to each */
    hq_state *sh = NULL, *sg = NULL;
    if (strstr(adam_recipes[k], "delayed")) {
      char buf[64];
      hq_role role;
      HQ_OK_OR_FAIL(hq_role_parse("linear:weight:w", buf, sizeof buf, &role));
      HQ_OK_OR_FAIL(hq_state_create(r, cpu, &sh));
      HQ_OK_OR_FAIL(hq_state_create(r, gpu, &sg));
      hq_quantizer_free(q);
      HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, sh, &q));
      HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, sg, &qd));
    }
    hq_tensor wd = hq_tensor_2d(dw, HQ_F32, 0, R, C);
    hq_qtensor *qh = NULL, *qg = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &qh));
    HQ_OK_OR_FAIL(hq_quantize(qd, gpu, &wd, &qg));
    if (k == 6) { /* the rowwise copy alone (an eval-only weight) */
      HQ_OK_OR_FAIL(hq_qtensor_drop(qh, HQ_COLWISE));
      HQ_OK_OR_FAIL(hq_qtensor_drop(qg, HQ_COLWISE));
    }
    fused_adam_logged = copy_logged = 0;
    for (int64_t t = 1; t <= 3; t++) {
      hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, t, NULL, NULL, 0};
      HQ_OK_OR_FAIL(hq_adam_step(cpu, &a, &g, w.data, m, v, qh));
      HQ_OK_OR_FAIL(hq_adam_step(gpu, &a, &gd, dw, dm, dv, qg));
      if (sh && t < 3) { /* the next step casts with the scale this one's amax gives (the last
                            step's scale stays for the fresh quantize below) */
        HQ_OK_OR_FAIL(hq_state_update(sh, cpu));
        HQ_OK_OR_FAIL(hq_state_update(sg, gpu));
      }
    }
    if (fused_adam_logged != 3 * adam_fused[k])
      fail_msg("%s: %d fused write-backs logged, %d expected", adam_recipes[k],
               fused_adam_logged, 3 * adam_fused[k]);
    if (copy_logged != 3 * adam_copy[k])
      fail_msg("%s: %d copies written beside logged, %d expected", adam_recipes[k], copy_logged,
               3 * adam_copy[k]);
    CK(cudaStreamSynchronize(stream));
    if (sh) { /* the states the three steps' amaxes rolled into agree, and the scale moved */
      float *ah = NULL, *ag = NULL;
      size_t nh = 0, ng = 0;
      HQ_OK_OR_FAIL(hq_state_data(sh, &ah, &nh));
      HQ_OK_OR_FAIL(hq_state_data(sg, &ag, &ng));
      assert_int_equal(nh, ng);
      float *back_state = malloc(ng * 4);
      CK(cudaMemcpy(back_state, ag, ng * 4, cudaMemcpyDeviceToHost));
      assert_memory_equal(back_state, ah, nh * 4);
      free(back_state);
      hq_state_slice sl = {sizeof sl, 0, 0, 0, 0};
      HQ_OK_OR_FAIL(hq_quantizer_state_slice(q, HQ_ROWWISE, &sl));
      assert_true(ah[sl.offset] > 100.0f); /* 448 / amax of a master near 0.1, not the initial 1 */
    }
    CK(cudaMemcpy(back, dw, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, w.data, n * 4);
    CK(cudaMemcpy(back, dm, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, m, n * 4);
    CK(cudaMemcpy(back, dv, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, v, n * 4);
    /* the write-back is a fresh quantize of the updated master (here on the CPU) */
    hq_qtensor *fresh = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &fresh));
    if (k == 6) HQ_OK_OR_FAIL(hq_qtensor_drop(fresh, HQ_COLWISE));
    compare(fresh, qg, adam_recipes[k]);
    compare(qh, qg, adam_recipes[k]);
    hq_qtensor_free(fresh);
    hq_qtensor_free(qh);
    hq_qtensor_free(qg);
    if (qd != q) hq_quantizer_free(qd);
    hq_quantizer_free(q);
    hq_state_free(sh);
    hq_state_free(sg);
    hq_recipe_free(r);
    cudaFree(dw), cudaFree(dm), cudaFree(dv);
    free(w.data), free(m), free(v);
  }
  if (k == 0) { /* non-finite counting on the device, over the gradient */
    int64_t count = 0, first = 0;
    uint16_t nan = 0x7FC0;
    h2d((uint16_t *)dg + 1234, &nan, 2);
    HQ_OK_OR_FAIL(hq_tensor_nonfinite(gpu, &gd, &count, &first));
    assert_int_equal(count, 1);
    assert_int_equal(first, 1234);
  }
  cudaFree(dg);
  free(g.data), free(back);
}

static void test_adam_and_nonfinite_on_device(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof adam_recipes / sizeof *adam_recipes; k++)
    adam_recipe_case(k, 160, 288);
  /* delayed scaling's fused write-back fills the device only from about 1024 threads per SM
     (fp8_tensor.cu): 160 x 288 takes the split step, 3072 x 4352 (816 tiles of 128 x 128, a
     wave on up to 204 SMs) the fused kernel */
  adam_recipe_case(11, 3072, 4352);
}


/* The unfused step's per-tensor amax over tensors larger than one sweep of the kernel's grid
   (each CTA loops several times, so the CTAs' partial maxima have to be combined): the masters,
   moments and write-back equal the CPU's, and the storage's amax is the max |w| of the new
   master computed here. The largest element sits last, so it lands in the last vector, in the
   tail of a size that is not a multiple of 4, or in the element-wise kernel when the masters are
   not 16-byte aligned (offset by one float). Gradients of each dtype. mxfp8 and fp8_block 1-D
   and 2-D (the fused one-kernel write-back; 2-D also with partial tiles and off 16-byte
   alignment) on the same size, against the CPU as well. */
static void test_adam_amax_large(void **state) {
  (void)state;
  static const char *fp8 = "[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\n"
                           "columnwise = f\n";
  static const char *nvfp4 = "[format f]\nplugin = nvfp4\n[role *:*:*]\nrowwise = f\n"
                             "columnwise = f\n";
  static const char *mxfp8 = "[format f]\nplugin = mxfp8\n[role *:*:*]\nrowwise = f\n"
                             "columnwise = f\n";
  static const char *fp8b = "[format f]\nplugin = fp8_block\n[role *:*:*]\nrowwise = f\n"
                            "columnwise = f\n";
  static const char *fp8b2 = "[format f]\nplugin = fp8_block\nblock = 2d\n[role *:*:*]\n"
                             "rowwise = f\ncolumnwise = f\n";
  const struct {
    const char *recipe;
    int64_t rows, cols;
    hq_dtype gdt;
    int offset; /* floats the master, m and v start past an aligned address */
  } cases[] = {
      {fp8, 1024, 2048, HQ_BF16, 0}, {fp8, 1023, 2049, HQ_F32, 0},
      {fp8, 1024, 2048, HQ_F16, 1},  {nvfp4, 1024, 2048, HQ_F16, 0},
      /* the fused write-backs (one kernel, no amax) on the same sizes: many tiles per kernel */
      {mxfp8, 1024, 2048, HQ_BF16, 0}, {fp8b, 1024, 2048, HQ_F32, 0},
      {fp8b2, 1100, 2176, HQ_F16, 0},  {fp8b2, 1024, 2048, HQ_BF16, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    const int64_t R = cases[c].rows, C = cases[c].cols, n = R * C;
    const int off = cases[c].offset;
    const size_t gsz = hq_dtype_size(cases[c].gdt);
    hq_tensor g = hq_test_tensor(cases[c].gdt, R, C, 11 + c, 0.5f);
    hq_tensor w = hq_test_tensor(HQ_F32, R, C, 21 + c, 0.1f);
    ((float *)w.data)[n - 1] = -3.0f; /* the largest |w|, before and after the steps */
    float *m = calloc(n, 4), *v = calloc(n, 4), *back = malloc(n * 4);
    void *dg = to_device(g.data, n * gsz);
    float *bw = NULL, *bm = NULL, *bv = NULL;
    CK(cudaMalloc((void **)&bw, (n + 4) * 4));
    CK(cudaMalloc((void **)&bm, (n + 4) * 4));
    CK(cudaMalloc((void **)&bv, (n + 4) * 4));
    float *dw = bw + off, *dm = bm + off, *dv = bv + off;
    h2d(dw, w.data, n * 4);
    h2d(dm, m, n * 4);
    h2d(dv, v, n * 4);
    hq_tensor gd = hq_tensor_2d(dg, cases[c].gdt, 0, R, C);
    hq_tensor wd = hq_tensor_2d(dw, HQ_F32, 0, R, C);
    hq_recipe *r = hq_test_recipe(cases[c].recipe);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qh = NULL, *qg = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &qh));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &wd, &qg));
    for (int64_t t = 1; t <= 3; t++) {
      hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, t, NULL, NULL, 0};
      HQ_OK_OR_FAIL(hq_adam_step(cpu, &a, &g, w.data, m, v, qh));
      HQ_OK_OR_FAIL(hq_adam_step(gpu, &a, &gd, dw, dm, dv, qg));
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back, dw, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, w.data, n * 4);
    CK(cudaMemcpy(back, dm, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, m, n * 4);
    CK(cudaMemcpy(back, dv, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, v, n * 4);
    float want = 0.0f; /* max |w| of the new master, here */
    for (int64_t i = 0; i < n; i++) {
      const float a = fabsf(((const float *)w.data)[i]);
      want = a > want ? a : want;
    }
    assert_true(want == fabsf(((const float *)w.data)[n - 1]));
    if (cases[c].recipe == fp8) {
      float got = 0.0f;
      const hq_buffer *ab = hq_storage_role(hq_qtensor_storage(qg, HQ_ROWWISE), HQ_ROLE_AMAX);
      assert_non_null(ab);
      CK(cudaMemcpy(&got, ab->ptr, 4, cudaMemcpyDeviceToHost));
      if (got != want)
        fail_msg("case %zu: the write-back's amax %.9g, max |w| of the new master %.9g", c,
                 (double)got, (double)want);
    }
    hq_qtensor *fresh = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &fresh));
    char what[64];
    snprintf(what, sizeof what, "large adam case %zu", c);
    compare(fresh, qg, what);
    compare(qh, qg, what);
    hq_qtensor_free(fresh);
    hq_qtensor_free(qh);
    hq_qtensor_free(qg);
    hq_quantizer_free(q);
    hq_recipe_free(r);
    cudaFree(bw), cudaFree(bm), cudaFree(bv), cudaFree(dg);
    free(g.data), free(w.data), free(m), free(v), free(back);
  }
}

/* hq_adam.amax_dev with HQ_ADAM_AMAX_ZEROED (hq/train.h): the caller's slot is taken as zero,
   the step launches no zeroing. Per-tensor FP8 (current scaling), three steps each: a slot
   zeroed by hq_ctx_memset before each step gives the CPU's bytes and is left holding max |w| of
   the new master in both words; a slot holding 1e30 without the flag is zeroed by the step (the
   CPU's bytes again); with the flag the same stale slot is not zeroed, so the write-back's amax
   is 1e30 -- the proof that the flag, not a leftover zeroing, decides. Without the quantized
   weight (qw NULL, a zeroed slot and the flag), the step leaves max |w| in the slot all the same,
   and the caller's own write-back given it (hq_quantize_args.amax) makes the CPU's bytes. */
static void test_adam_amax_zeroed(void **state) {
  (void)state;
  static const char *fp8 = "[format f]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f\n"
                           "columnwise = f\n";
  const int64_t R = 512, C = 768, n = R * C;
  const float stale = 1e30f;
  /* 0: memset + flag, 1: stale, no flag, 2: stale + flag, 3: memset + flag, the caller's own
     write-back */
  for (int mode = 0; mode < 4; mode++) {
    hq_tensor g = hq_test_tensor(HQ_BF16, R, C, 31, 0.5f);
    hq_tensor w = hq_test_tensor(HQ_F32, R, C, 32, 0.1f);
    float *m = calloc(n, 4), *v = calloc(n, 4), *back = malloc(n * 4);
    void *dg = to_device(g.data, n * 2);
    float *dw = to_device(w.data, n * 4), *dm = to_device(m, n * 4), *dv = to_device(v, n * 4);
    float *slot = NULL;
    CK(cudaMalloc((void **)&slot, HQ_ADAM_AMAX_BYTES));
    hq_tensor gd = hq_tensor_2d(dg, HQ_BF16, 0, R, C), wd = hq_tensor_2d(dw, HQ_F32, 0, R, C);
    hq_recipe *r = hq_test_recipe(fp8);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qh = NULL, *qg = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &qh));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &wd, &qg));
    for (int64_t t = 1; t <= 3; t++) {
      hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, t, NULL, slot,
                   mode == 1 ? 0 : HQ_ADAM_AMAX_ZEROED};
      if (mode == 0 || mode == 3) {
        HQ_OK_OR_FAIL(hq_ctx_memset(gpu, slot, 0, HQ_ADAM_AMAX_BYTES));
      } else {
        const float two[2] = {stale, stale};
        CK(cudaStreamSynchronize(stream));
        h2d(slot, two, sizeof two);
      }
      HQ_OK_OR_FAIL(hq_adam_step(cpu, &a, &g, w.data, m, v, qh));
      HQ_OK_OR_FAIL(hq_adam_step(gpu, &a, &gd, dw, dm, dv, mode == 3 ? NULL : qg));
      if (mode == 3) {
        hq_quantize_args qa = {.struct_size = sizeof qa, .amax = slot};
        HQ_OK_OR_FAIL(hq_qtensor_update_ex(qg, gpu, &wd, &qa));
      }
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(back, dw, n * 4, cudaMemcpyDeviceToHost));
    assert_memory_equal(back, w.data, n * 4); /* the step itself never depends on the slot */
    float want = 0.0f, got[2] = {0, 0}, stored = 0.0f;
    for (int64_t i = 0; i < n; i++) {
      const float a = fabsf(((const float *)w.data)[i]);
      want = a > want ? a : want;
    }
    CK(cudaMemcpy(got, slot, sizeof got, cudaMemcpyDeviceToHost));
    const hq_buffer *ab = hq_storage_role(hq_qtensor_storage(qg, HQ_ROWWISE), HQ_ROLE_AMAX);
    assert_non_null(ab);
    CK(cudaMemcpy(&stored, ab->ptr, 4, cudaMemcpyDeviceToHost));
    const float expect = mode == 2 ? stale : want;
    if (got[0] != expect || got[1] != expect || stored != expect)
      fail_msg("mode %d: slot %.9g %.9g, the write-back's amax %.9g, expected %.9g", mode,
               (double)got[0], (double)got[1], (double)stored, (double)expect);
    if (mode != 2) {
      char what[48];
      snprintf(what, sizeof what, "amax slot mode %d", mode);
      compare(qh, qg, what);
    }
    hq_qtensor_free(qh);
    hq_qtensor_free(qg);
    hq_quantizer_free(q);
    hq_recipe_free(r);
    cudaFree(slot), cudaFree(dw), cudaFree(dm), cudaFree(dv), cudaFree(dg);
    free(g.data), free(w.data), free(m), free(v), free(back);
  }
}

/* A quantized weight on another device than the context's cannot take the write-back:
   hq_adam_step refuses it before the step writes anything (hq/train.h), in both directions --
   a device weight with a host context (the CPU loop) and a host weight with a device context
   (the fused and the two-kernel paths) -- and master, m and v keep their bytes. */
static void test_adam_refuses_other_device(void **state) {
  (void)state;
  const int64_t R = 64, C = 128, n = R * C;
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = mxfp8\n[role *:*:*]\nrowwise = f\n"
                                "columnwise = f\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor w = hq_test_tensor(HQ_F32, R, C, 4, 0.1f), g = hq_test_tensor(HQ_F32, R, C, 3, 0.5f);
  hq_tensor mt = hq_test_tensor(HQ_F32, R, C, 5, 0.01f);
  hq_tensor vt = hq_test_tensor(HQ_F32, R, C, 6, 0.01f);
  float *m = mt.data, *v = vt.data;
  for (int64_t i = 0; i < n; i++) v[i] = v[i] * v[i]; /* a second moment is not negative */
  float *w0 = malloc(n * 4), *m0 = malloc(n * 4), *v0 = malloc(n * 4), *back = malloc(n * 4);
  memcpy(w0, w.data, n * 4), memcpy(m0, m, n * 4), memcpy(v0, v, n * 4);
  float *dw = to_device(w.data, n * 4), *dm = to_device(m, n * 4), *dv = to_device(v, n * 4);
  float *dg = to_device(g.data, n * 4);
  hq_tensor wd = hq_tensor_2d(dw, HQ_F32, 0, R, C), gd = hq_tensor_2d(dg, HQ_F32, 0, R, C);
  hq_qtensor *qh = NULL, *qg = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &w, &qh));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &wd, &qg));
  hq_adam a = {sizeof a, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f, 1, NULL, NULL, 0};
  /* a device weight, a host context: the CPU loop would have run first */
  assert_int_equal(hq_adam_step(cpu, &a, &g, w.data, m, v, qg), HQ_EINVAL);
  HQ_ERROR_HAS("hq_adam_step: the quantized weight (role linear:weight:w) lives on device 0, the "
               "context runs on -1");
  assert_memory_equal(w.data, w0, n * 4);
  assert_memory_equal(m, m0, n * 4);
  assert_memory_equal(v, v0, n * 4);
  /* a host weight, a device context: the device step would have run first */
  assert_int_equal(hq_adam_step(gpu, &a, &gd, dw, dm, dv, qh), HQ_EINVAL);
  HQ_ERROR_HAS("hq_adam_step: the quantized weight (role linear:weight:w) lives on device -1, the "
               "context runs on 0");
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(back, dw, n * 4, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, w0, n * 4);
  CK(cudaMemcpy(back, dm, n * 4, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, m0, n * 4);
  CK(cudaMemcpy(back, dv, n * 4, cudaMemcpyDeviceToHost));
  assert_memory_equal(back, v0, n * 4);
  hq_qtensor_free(qh);
  hq_qtensor_free(qg);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  cudaFree(dw), cudaFree(dm), cudaFree(dv), cudaFree(dg);
  free(w.data), free(g.data), free(m), free(v), free(w0), free(m0), free(v0), free(back);
}

/* Offload and recompute on the device, per format: every saved buffer goes device -> pinned host
   -> a fresh device block, the qtensor is restored from the new blocks and equals the CPU
   quantization byte for byte (so the round trip changed nothing). */
static void test_offload_round_trip(void **state) {
  (void)state;
  static const char *const fmts[] = {
      "[format f]\nplugin = fp8_tensor\n",
      "[format f]\nplugin = mxfp8\nblock_2d = true\n",
      "[format f]\nplugin = nvfp4\nrht = true\n",
      "[format f]\nplugin = nvfp4\nblock_2d = true\nswizzle = true\n",
      "[format f]\nplugin = fp8_block\nblock = 2d\n",
      "[format f]\nplugin = identity\ndtype = bf16\n",
  };
  const int64_t R = 128, C = 256;
  hq_tensor x = hq_test_tensor(HQ_BF16, R, C, 12, 1.0f);
  void *dx = to_device(x.data, (size_t)(R * C) * 2);
  hq_tensor xd = hq_tensor_2d(dx, HQ_BF16, 0, R, C);
  for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
    char text[256];
    snprintf(text, sizeof text, "%s[role *:*:*]\nrowwise = f\ncolumnwise = f\n", fmts[f]);
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
    hq_qtensor *h = NULL, *g = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xd, &g));
    hq_saved_buffer list[16];
    size_t n = 0;
    HQ_OK_OR_FAIL(hq_qtensor_save(g, list, 16, sizeof list[0], &n));
    void *pinned[16];
    for (size_t k = 0; k < n; k++) { /* out: device -> pinned host, the device block freed */
      CK(cudaMallocHost(&pinned[k], list[k].bytes));
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, pinned[k], HQ_DEVICE_HOST, list[k].ptr, 0, list[k].bytes));
      hq_ctx_free(gpu, list[k].ptr);
      list[k].ptr = NULL;
    }
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    for (size_t k = 0; k < n; k++) { /* back: pinned host -> a new device block */
      HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, list[k].bytes, &list[k].ptr));
      HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, list[k].ptr, 0, pinned[k], HQ_DEVICE_HOST, list[k].bytes));
    }
    HQ_OK_OR_FAIL(hq_qtensor_restore(g, list, n, sizeof list[0]));
    compare(h, g, fmts[f]);
    for (size_t k = 0; k < n; k++) CK(cudaFreeHost(pinned[k]));
    hq_qtensor_free(h);
    hq_qtensor_free(g);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  cudaFree(dx);
  free(x.data);
}

/* Review bug 1: a qtensor made on one context's stream (A) and updated through others (B, C).
   A one-direction update through B gives the columnwise storage private copies of the buffers
   both directions shared (fp8_tensor's scale_inv); they are allocated by the owner (A) and
   written on B, and freed by A when a later update through C makes both directions again. Two
   host gates show the ordering the core now inserts: while A is held, B's update does not run
   (it waits for A's allocation), and while B is held, A's free of the private copies does not
   run (A waits for B's last use). The bytes equal the same sequence on the CPU. */
static volatile int gate;
static void CUDART_CB hold(void *arg) {
  (void)arg;
  while (!__atomic_load_n(&gate, __ATOMIC_ACQUIRE)) {
    struct timespec t = {0, 200000};
    nanosleep(&t, NULL);
  }
}
/* Whether `s` still has work queued after about 50 ms. */
static int still_busy(cudaStream_t s) {
  for (int i = 0; i < 50; i++) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady) fail_msg("cudaStreamQuery: %s", cudaGetErrorString(e));
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
  }
  return 1;
}
static void test_cross_stream_update(void **state) {
  (void)state;
  const int64_t R = 256, C = 512;
  hq_tensor x[3];
  void *dx[3];
  hq_tensor xd[3];
  for (int i = 0; i < 3; i++) {
    x[i] = hq_test_tensor(HQ_BF16, R, C, 40 + i, 1.0f + i);
    dx[i] = to_device(x[i].data, (size_t)(R * C) * 2);
    xd[i] = hq_tensor_2d(dx[i], HQ_BF16, 0, R, C);
  }
  hq_recipe *r = hq_test_recipe(recipes[0]);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  /* the CPU reference: both directions, the rowwise one alone, both again */
  hq_qtensor *h = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x[0], &h));
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(h, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(h, cpu, &x[1]));
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(h, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(h, cpu, &x[2]));

  cudaStream_t s[3];
  hq_ctx *c[3];
  for (int i = 0; i < 3; i++) {
    CK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    hq_ctx_desc d = {0};
    d.struct_size = sizeof d;
    d.device = 0;
    d.stream = s[i];
    HQ_OK_OR_FAIL(hq_ctx_create(&d, &c[i]));
  }
  hq_qtensor *g = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, c[0], &xd[0], &g));
  CK(cudaStreamSynchronize(s[0]));
  /* A held: B's one-direction update waits for A's allocation of the private copies */
  gate = 0;
  CK(cudaLaunchHostFunc(s[0], hold, NULL));
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(g, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(g, c[1], &xd[1]));
  if (!still_busy(s[1])) fail_msg("the update on B ran while A, which allocated for it, was held");
  __atomic_store_n(&gate, 1, __ATOMIC_RELEASE);
  CK(cudaStreamSynchronize(s[0]));
  CK(cudaStreamSynchronize(s[1]));
  /* B held, with a use of the tensor through B (the same rowwise update again) queued behind
     the gate: C's update of both directions, ordered after B as a caller orders its streams,
     frees the private copies on A, which must wait for B's last use */
  gate = 0;
  CK(cudaLaunchHostFunc(s[1], hold, NULL));
  HQ_OK_OR_FAIL(hq_qtensor_update(g, c[1], &xd[1]));
  cudaEvent_t b_done;
  CK(cudaEventCreateWithFlags(&b_done, cudaEventDisableTiming));
  CK(cudaEventRecord(b_done, s[1]));
  CK(cudaStreamWaitEvent(s[2], b_done, 0));
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(g, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(g, c[2], &xd[2]));
  if (!still_busy(s[0]))
    fail_msg("A freed the columnwise private copies while B, which used them last, was held");
  __atomic_store_n(&gate, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 3; i++) CK(cudaStreamSynchronize(s[i]));
  CK(cudaEventDestroy(b_done));
  compare(h, g, "A, then B rowwise, then C both");
  hq_qtensor_free(g);
  CK(cudaStreamSynchronize(s[0]));
  for (int i = 0; i < 3; i++) {
    hq_ctx_destroy(c[i]);
    CK(cudaStreamDestroy(s[i]));
    cudaFree(dx[i]);
    free(x[i].data);
  }
  hq_qtensor_free(h);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* hq's memory pool: hq_device_trim hands the kept memory back (the driver's free memory grows
   by what hq freed), allocation works again afterwards, and a device out of range is refused. */
/* The identity format's dtype conversions on the device (the core's conversion kernel) give the
   CPU's bytes: for every source dtype, a quantize into every storage dtype and a dequantize of
   it into every dtype. The 16-bit sources hold every one of the 65536 bit patterns (NaN
   payloads, subnormals, Inf, -0); the FP32 source random bit patterns of every exponent plus
   the BF16 and F16 rounding ties, their overflow boundaries, subnormals and NaNs with payloads.
   Shapes of 65536 elements and of counts that are not multiples of 8 (the last n % 8 one by
   one), sources and destinations 16-byte aligned or an element off (8 elements per thread with
   16-byte accesses, or one by one). */
static void fill_bits(hq_tensor *x, uint64_t seed) {
  const int64_t n = x->rows * x->cols;
  uint64_t s = seed;
  if (x->dtype != HQ_F32) {
    for (int64_t i = 0; i < n; i++)
      ((uint16_t *)x->data)[i] = (uint16_t)(n == 65536 ? (uint64_t)i : hq_test_rand(&s));
    return;
  }
  static const uint32_t special[] = {
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, /* bf16 ties to even, either side */
      0x7f7f8000u, 0x7f7fffffu, 0xff7f8000u,              /* bf16 overflow to Inf */
      0x3f801000u, 0x3f803000u, 0x477ff000u, 0x477fefffu, /* f16 ties, 65520 -> Inf */
      0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u, /* f16 subnormal ties, 2^-14 */
      0x00000001u, 0x807fffffu, 0x80000000u, 0x7f800000u, /* f32 subnormals, -0, Inf */
      0x7fc00001u, 0xffa5a5a5u, 0x7f800001u};             /* NaN payloads */
  for (int64_t i = 0; i < n; i++) {
    uint32_t b = (uint32_t)hq_test_rand(&s);
    if (i % 3 == 0) b = special[(i / 3) % (sizeof special / sizeof *special)];
    memcpy((float *)x->data + i, &b, 4);
  }
}

static void test_identity_conversions(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(
      "[format d1]\nplugin = identity\ndtype = f32\n[role *:*:d1]\nrowwise = d1\n"
      "[format d2]\nplugin = identity\ndtype = f16\n[role *:*:d2]\nrowwise = d2\n"
      "[format d3]\nplugin = identity\ndtype = bf16\n[role *:*:d3]\nrowwise = d3\n");
  static const char *roles[4] = {NULL, "a:b:d1", "a:b:d2", "a:b:d3"};
  static const int64_t shapes[3][2] = {{256, 256}, {37, 53}, {3, 5}};
  for (int st = HQ_F32; st <= HQ_BF16; st++)
    for (int sh = 0; sh < 3; sh++)
      for (int off = 0; off < 2; off++) {
        const int64_t M = shapes[sh][0], K = shapes[sh][1];
        const size_t es = hq_dtype_size((hq_dtype)st);
        hq_tensor x = hq_test_empty((hq_dtype)st, M, K);
        fill_bits(&x, 77 + sh);
        const hq_tensor xg = hq_gpu_tensor_at(gpu, &x, off * es);
        for (int dt = HQ_F32; dt <= HQ_BF16; dt++) {
          char what[96];
          snprintf(what, sizeof what, "identity %s -> %s, %lldx%lld, offset %d",
                   hq_dtype_name((hq_dtype)st), hq_dtype_name((hq_dtype)dt), (long long)M,
                   (long long)K, off);
          hq_quantizer *q = hq_test_quantizer(r, roles[dt]);
          HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
          hq_qtensor *h = NULL, *g = NULL;
          HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
          HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xg, &g));
          hq_gpu_compare_dir(gpu, h, g, HQ_ROWWISE, what);
          for (int ot = HQ_F32; ot <= HQ_BF16; ot++) { /* and back into every dtype */
            const size_t os = hq_dtype_size((hq_dtype)ot), bytes = (size_t)(M * K) * os;
            hq_tensor yh = hq_test_empty((hq_dtype)ot, M, K);
            hq_tensor yg = hq_gpu_tensor_at(gpu, &yh, off * os);
            HQ_OK_OR_FAIL(hq_dequantize(h, cpu, HQ_ROWWISE, &yh));
            HQ_OK_OR_FAIL(hq_dequantize(g, gpu, HQ_ROWWISE, &yg));
            uint8_t *back = malloc(bytes);
            HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, yg.data, hq_ctx_device(gpu),
                                        bytes));
            HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
            for (size_t k = 0; k < bytes; k++)
              if (back[k] != ((uint8_t *)yh.data)[k])
                fail_msg("%s, dequantized to %s: byte %zu of %zu: cpu %02x gpu %02x", what,
                         hq_dtype_name((hq_dtype)ot), k, bytes, ((uint8_t *)yh.data)[k],
                         back[k]);
            free(back);
            free(yh.data);
            hq_ctx_free(gpu, (char *)yg.data - off * os);
          }
          hq_qtensor_free(h);
          hq_qtensor_free(g);
          hq_quantizer_free(q);
        }
        hq_ctx_free(gpu, (char *)xg.data - off * es);
        free(x.data);
      }
  hq_recipe_free(r);
}

static void test_pool_trim(void **state) {
  (void)state;
  void *p = NULL;
  const size_t big = (size_t)256 << 20;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, big, &p));
  hq_ctx_free(gpu, p); /* kept by hq's pool */
  CK(cudaStreamSynchronize(stream));
  size_t free0 = 0, total = 0, free1 = 0;
  CK(cudaMemGetInfo(&free0, &total));
  HQ_OK_OR_FAIL(hq_device_trim(0));
  CK(cudaMemGetInfo(&free1, &total));
  assert_true(free1 >= free0 + big / 2); /* the 256 MiB went back (others may allocate too) */
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, 1024, &p));
  hq_ctx_free(gpu, p);
  assert_int_equal(hq_device_trim(-1), HQ_EINVAL);
  assert_int_equal(hq_device_trim(1 << 20), HQ_EINVAL);
}

/* An allocator of the test's own (cudaMalloc, outside hq's pool) for a context. */
static void *own_alloc(void *user, int device, size_t bytes, void *s) {
  (void)user;
  (void)device;
  (void)s;
  void *p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
static void own_free(void *user, int device, void *ptr, void *s) {
  (void)user;
  (void)device;
  (void)s;
  cudaFree(ptr);
}

static hq_mem_stats pool_stats(void) {
  hq_mem_stats m = HQ_MEM_STATS_INIT;
  CK(cudaStreamSynchronize(stream)); /* the stream-ordered frees done */
  HQ_OK_OR_FAIL(hq_device_mem_stats(0, &m));
  assert_int_equal(m.struct_size, sizeof m);
  assert_true(m.reserved >= m.in_use);
  assert_true(m.peak >= m.in_use);
  return m;
}

/* hq_device_mem_stats counts hq's pool, and nothing else: a 64 MiB hq_ctx_alloc raises in_use
   and the peak by at least 64 MiB and its free brings in_use back exactly, the peak staying;
   memory outside the pool (cudaMalloc, a context with an allocator of its own) moves no count;
   hq_device_mem_reset_peak brings the peak down to in_use; an FP8 qtensor of 1024 x 2048 raises
   in_use by at least its buffers' bytes (two directions of one byte per element); a device
   that does not exist is refused by name. */
static void test_pool_stats(void **state) {
  (void)state;
  const uint64_t big = (uint64_t)64 << 20;
  CK(cudaDeviceSynchronize()); /* the earlier tests' frees done: in_use settled at the reset */
  HQ_OK_OR_FAIL(hq_device_mem_reset_peak(0));
  const hq_mem_stats s0 = pool_stats();
  assert_true(s0.peak == s0.in_use);
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, big, &p));
  const hq_mem_stats s1 = pool_stats();
  assert_true(s1.in_use >= s0.in_use + big);
  assert_true(s1.peak >= s0.in_use + big);
  hq_ctx_free(gpu, p);
  const hq_mem_stats s2 = pool_stats();
  assert_true(s2.in_use == s0.in_use);
  assert_true(s2.peak == s1.peak);

  /* outside hq's pool */
  void *q = NULL, *o = NULL;
  CK(cudaMalloc(&q, big));
  hq_allocator al = {sizeof al, own_alloc, own_free, NULL};
  hq_ctx_desc d = HQ_CTX_DESC_INIT;
  d.device = 0;
  d.stream = stream;
  d.allocator = &al;
  hq_ctx *own = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &own));
  HQ_OK_OR_FAIL(hq_ctx_alloc(own, big, &o));
  const hq_mem_stats s3 = pool_stats();
  assert_true(s3.in_use == s2.in_use);
  assert_true(s3.peak == s2.peak);
  hq_ctx_free(own, o);
  hq_ctx_destroy(own);
  CK(cudaFree(q));

  CK(cudaDeviceSynchronize());
  HQ_OK_OR_FAIL(hq_device_mem_reset_peak(0));
  const hq_mem_stats s4 = pool_stats();
  assert_true(s4.peak == s4.in_use);
  assert_true(s4.peak < s1.peak);

  const int64_t R = 1024, C = 2048;
  hq_tensor x = hq_test_tensor(HQ_BF16, R, C, 7, 1.0f);
  void *dx = to_device(x.data, (size_t)(R * C) * 2);
  hq_tensor xd = hq_tensor_2d(dx, HQ_BF16, 0, R, C);
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\n[role *:*:*]\n"
                                "rowwise = f\ncolumnwise = f\n");
  hq_quantizer *qz = hq_test_quantizer(r, "linear:input:x");
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(qz, gpu, &xd, &qt));
  uint64_t held = 0;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    assert_non_null(st);
    for (uint32_t i = 0; i < st->nbuf; i++)
      if (!(hq_storage_cbuf(st, i)->flags & HQ_BUF_SHARED)) held += hq_storage_cbuf(st, i)->bytes;
  }
  assert_true(held >= (uint64_t)(2 * R * C));
  const hq_mem_stats s5 = pool_stats();
  assert_true(s5.in_use >= s4.in_use + held);
  assert_true(s5.peak >= s4.in_use + held);
  hq_qtensor_free(qt);
  hq_quantizer_free(qz);
  hq_recipe_free(r);
  CK(cudaFree(dx));
  free(x.data);

  hq_mem_stats m = HQ_MEM_STATS_INIT;
  assert_int_equal(hq_device_mem_stats(1 << 20, &m), HQ_EINVAL);
  assert_non_null(strstr(hq_last_error(), "1048576"));
  assert_int_equal(hq_device_mem_stats(-1, &m), HQ_EINVAL);
  assert_int_equal(hq_device_mem_reset_peak(1 << 20), HQ_EINVAL);
  assert_non_null(strstr(hq_last_error(), "1048576"));
}

int main(void) {
  if (!hq_gpu_present()) return HQ_TEST_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_graph_capture_update),
      cmocka_unit_test(test_current_device_restored),
      cmocka_unit_test(test_ctx_memset_device),
      cmocka_unit_test(test_fsdp_on_device),
      cmocka_unit_test(test_adam_and_nonfinite_on_device),
      cmocka_unit_test(test_adam_amax_large),
      cmocka_unit_test(test_adam_amax_zeroed),
      cmocka_unit_test(test_adam_refuses_other_device),
      cmocka_unit_test(test_offload_round_trip),
      cmocka_unit_test(test_identity_conversions),
      cmocka_unit_test(test_pool_trim),
      cmocka_unit_test(test_pool_stats),
      cmocka_unit_test(test_cross_stream_update),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
