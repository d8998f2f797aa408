/*
** hq_gpu_test.h -- what the GPU tests share: comparing a device quantization with the CPU
** reference byte for byte, copying an input (or a caller's amax pair) to the device, raw dequantize on
** both sides, checking a device hq_gemm (native or emulated) against the F64 product, the two
** contexts every test compares, the caller-supplied-amax checks of the per-tensor formats, and
** the raw dequantize's folded factor (ABI 2.3).
** Include after hq_test.h.
*/
#ifndef HQ_GPU_TEST_H
#define HQ_GPU_TEST_H

#include <math.h>
#include "hq_test.h"

/* Whether a CUDA device is there to test on: false (the caller returns HQ_TEST_SKIP, automake's
   77) with the reason printed; true with device 0's name and architecture printed. */
static inline int hq_gpu_present(void) {
  if (!hq_built_with_cuda() || hq_device_count() == 0) {
    printf("no CUDA device (built with CUDA: %s): skipped\n", hq_built_with_cuda() ? "yes" : "no");
    return 0;
  }
  char name[128];
  int arch = 0;
  if (hq_device_info(0, name, sizeof name, &arch) == HQ_OK)
    printf("device 0: %s (sm_%d)\n", name, arch);
  return 1;
}

/* The two contexts a GPU test compares: the host (the CPU reference) and device 0, both with
   RNG seed `seed` when it is nonzero (stochastic rounding); nonzero with the error printed when
   either cannot be made (a cmocka group setup returns it). */
static inline int hq_gpu_contexts(hq_ctx **cpu, hq_ctx **gpu, uint64_t seed) {
  hq_ctx_desc h = {0}, d = {0};
  h.struct_size = d.struct_size = sizeof d;
  h.device = HQ_DEVICE_HOST;
  d.device = 0;
  h.seed = d.seed = seed;
  if (hq_ctx_create(seed ? &h : NULL, cpu) || hq_ctx_create(&d, gpu)) {
    fprintf(stderr, "context: %s\n", hq_last_error());
    return -1;
  }
  return 0;
}

/* Every buffer of direction `dir` of g (on dev's device) equals h's (host), byte for byte; a
   difference fails the test naming the buffer, the byte and both values. */
static inline void hq_gpu_compare_dir(hq_ctx *dev, const hq_qtensor *h, const hq_qtensor *g,
                                      uint32_t dir, const char *what) {
  const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
  assert_non_null(sh);
  assert_non_null(sg);
  assert_int_equal(sh->nbuf, sg->nbuf);
  for (uint32_t i = 0; i < sh->nbuf; i++) {
    const hq_buffer *bh = hq_storage_cbuf(sh, i), *bg = hq_storage_cbuf(sg, i);
    size_t n = bh->bytes;
    assert_int_equal(bg->bytes, n);
    if (!n) continue;
    uint8_t *tmp = malloc(n);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, tmp, HQ_DEVICE_HOST, bg->ptr, hq_ctx_device(dev), n));
    HQ_OK_OR_FAIL(hq_ctx_sync(dev));
    if (memcmp(tmp, bh->ptr, n) != 0) {
      size_t k = 0;
      while (((uint8_t *)bh->ptr)[k] == tmp[k]) k++;
      fail_msg("%s: dir %u buffer '%s' differs at byte %zu of %zu: cpu %02x gpu %02x", what, dir,
               bh->name, k, n, ((uint8_t *)bh->ptr)[k], tmp[k]);
    }
    free(tmp);
  }
}

/* The directions of `usage`. */
static inline void hq_gpu_compare_usage(hq_ctx *dev, const hq_qtensor *h, const hq_qtensor *g,
                                        uint32_t usage, const char *what) {
  if (usage & HQ_ROWWISE) hq_gpu_compare_dir(dev, h, g, HQ_ROWWISE, what);
  if (usage & HQ_COLWISE) hq_gpu_compare_dir(dev, h, g, HQ_COLWISE, what);
}

/* A device copy of host tensor h on dev, `shift` bytes into its allocation (shift > 0: a
   source off 16-byte alignment, which the kernels read element by element); free it with
   hq_ctx_free(dev, (char *)g.data - shift). */
static inline hq_tensor hq_gpu_tensor_at(hq_ctx *dev, const hq_tensor *h, size_t shift) {
  hq_tensor g = *h;
  const size_t bytes = (size_t)(h->rows * h->cols) * hq_dtype_size(h->dtype);
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, bytes + shift + 16, &p));
  g.data = (char *)p + shift;
  if (bytes)
    HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, g.data, hq_ctx_device(dev), h->data, HQ_DEVICE_HOST, bytes));
  g.device = hq_ctx_device(dev);
  return g;
}

/* Two floats (a rowwise and a columnwise amax) in device memory (free with hq_ctx_free). */
static inline float *hq_gpu_amax_to_dev(hq_ctx *dev, const float a[2]) {
  void *p = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, 2 * sizeof(float), &p));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, p, hq_ctx_device(dev), a, HQ_DEVICE_HOST, 2 * sizeof(float)));
  return p;
}
static inline void hq_gpu_amax_to_host(hq_ctx *dev, const float *p, float out[2]) {
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, out, HQ_DEVICE_HOST, p, hq_ctx_device(dev), 2 * sizeof(float)));
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
}

/* Whether path `got` is what `want` asks for: the emulated BF16 path may run fused
   (HQ_GEMM_PATH_FUSED_BF16, the same BF16 values: a Hopper device, an MXFP8 or NVFP4 operand
   with k contiguous). */
static inline int hq_gpu_path_ok(uint32_t got, uint32_t want) {
  return got == want || (want == HQ_GEMM_PATH_EMULATED_BF16 && got == HQ_GEMM_PATH_FUSED_BF16);
}

/* A device tensor's contents (on dev's device) as host F32 (free the result). */
static inline float *hq_gpu_back_f32(hq_ctx *dev, const hq_tensor *t) {
  const size_t n = (size_t)(t->rows * t->cols), bytes = n * hq_dtype_size(t->dtype);
  void *raw = malloc(bytes);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, raw, HQ_DEVICE_HOST, t->data, hq_ctx_device(dev), bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
  float *f = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) f[i] = hq_load_hp(raw, (int64_t)i, t->dtype);
  free(raw);
  return f;
}

/* hq_dequantize of direction dir of a device qtensor [r0, r1], as host F32 (free the result). */
static inline float *hq_gpu_deq_back(hq_ctx *dev, const hq_qtensor *qt, uint32_t dir, int64_t r0,
                                     int64_t r1) {
  hq_tensor t = hq_tensor_2d(NULL, HQ_F32, hq_ctx_device(dev), r0, r1);
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, (size_t)(r0 * r1) * 4, &t.data));
  HQ_OK_OR_FAIL(hq_dequantize(qt, dev, dir, &t));
  float *f = hq_gpu_back_f32(dev, &t);
  hq_ctx_free(dev, t.data);
  return f;
}

/* D = alpha op(A) op(B) + beta D0 on dev for device qtensors A and B (flags ta / tb), with alpha
   1.25 and beta 0.5: d and de are device copies of the host tensor d0h (D0, [n, m] of D's dtype),
   overwritten. The path hq_gemm_plan names must be `want` (0: any) and its reason contain
   `reason` (NULL: none checked); hq_gemm's result into d and the emulated path's
   (HQ_GEMM_FORCE_EMULATED, which must report path `emul`) into de are checked against the F64
   product of the dequantized operands: the emulated path within FP32 accumulation error (plus
   BF16 rounding of D), the native one within 2^-10 of sum |alpha a b| more. Prints the worst
   relative error; a failure names `what`. */
static inline void hq_gpu_gemm_vs_f64(hq_ctx *dev, const hq_qtensor *A, int ta,
                                      const hq_qtensor *B, int tb, const hq_tensor *d0h,
                                      hq_tensor *d, hq_tensor *de, uint32_t want,
                                      const char *reason, uint32_t emul, const char *what) {
  const hq_dtype ddt = d0h->dtype;
  const int64_t M = d0h->cols, N = d0h->rows;
  const int64_t a0 = hq_qtensor_rows(A), a1 = hq_qtensor_cols(A);
  const int64_t b0 = hq_qtensor_rows(B), b1 = hq_qtensor_cols(B);
  const int64_t K = ta ? a1 : a0;
  float *fa = hq_gpu_deq_back(dev, A, ta ? HQ_ROWWISE : HQ_COLWISE, a0, a1);
  float *fb = hq_gpu_deq_back(dev, B, tb ? HQ_COLWISE : HQ_ROWWISE, b0, b1);
  hq_gemm_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  HQ_OK_OR_FAIL(hq_gemm_plan(dev, hq_operand_q(A), ta, hq_operand_q(B), tb, d, NULL, &info));
  if (want && !hq_gpu_path_ok(info.path, want))
    fail_msg("%s: path %s (%s), expected %s", what, hq_gemm_path_name(info.path), info.reason,
             hq_gemm_path_name(want));
  if (reason && !strstr(info.reason, reason))
    fail_msg("%s: reason '%s' lacks '%s'", what, info.reason, reason);
  const uint32_t path = info.path;
  HQ_OK_OR_FAIL(hq_gemm(dev, hq_operand_q(A), ta, hq_operand_q(B), tb, d, 1.25f, 0.5f, NULL,
                        &info));
  assert_int_equal(info.path, path);
  hq_gemm_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.flags = HQ_GEMM_FORCE_EMULATED;
  HQ_OK_OR_FAIL(hq_gemm(dev, hq_operand_q(A), ta, hq_operand_q(B), tb, de, 1.25f, 0.5f, &args,
                        &info));
  assert_int_equal(info.path, emul);
  float *got = hq_gpu_back_f32(dev, d), *emu = hq_gpu_back_f32(dev, de);
  /* the fused path where it can run at all (HQ_GEMM_FUSED_ALWAYS): the emulated tolerance */
  float *fus = NULL;
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, de->data, hq_ctx_device(dev), d0h->data, HQ_DEVICE_HOST,
                              (size_t)(M * N) * hq_dtype_size(ddt)));
  args.flags = HQ_GEMM_FUSED_ALWAYS;
  HQ_OK_OR_FAIL(hq_gemm(dev, hq_operand_q(A), ta, hq_operand_q(B), tb, de, 1.25f, 0.5f, &args,
                        &info));
  if (info.path == HQ_GEMM_PATH_FUSED_BF16) fus = hq_gpu_back_f32(dev, de);
  double worst = 0;
  for (int64_t j = 0; j < N; j++)
    for (int64_t i = 0; i < M; i++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < K; p++) {
        const double x = ta ? fa[i * K + p] : fa[p * M + i];
        const double y = tb ? fb[p * N + j] : fb[j * K + p];
        s += x * y;
        sa += fabs(x * y);
      }
      const double c = 0.5 * hq_load_hp(d0h->data, j * M + i, ddt);
      const double ref = 1.25 * s + c;
      const double acc = (double)(K + 8) * 0x1p-24 * (1.25 * sa + fabs(c));
      const double out = ddt == HQ_BF16 ? fabs(ref) * 0x1p-8 + 1e-30 : 1e-30;
      const double tol_e = acc + out;
      const double tol_n = path == HQ_GEMM_PATH_NATIVE ? tol_e + 0x1p-10 * 1.25 * sa : tol_e;
      const double ee = fabs(emu[j * M + i] - ref), en = fabs(got[j * M + i] - ref);
      if (ee > tol_e)
        fail_msg("%s: emulated D[%lld][%lld] = %.9g, F64 %.9g (tolerance %.3g)", what,
                 (long long)j, (long long)i, (double)emu[j * M + i], ref, tol_e);
      if (fus && fabs(fus[j * M + i] - ref) > tol_e)
        fail_msg("%s: fused D[%lld][%lld] = %.9g, F64 %.9g (tolerance %.3g)", what,
                 (long long)j, (long long)i, (double)fus[j * M + i], ref, tol_e);
      if (en > tol_n)
        fail_msg("%s: %s D[%lld][%lld] = %.9g, F64 %.9g (tolerance %.3g)", what,
                 hq_gemm_path_name(path), (long long)j, (long long)i, (double)got[j * M + i], ref,
                 tol_n);
      if (sa > 0 && en / (1.25 * sa) > worst) worst = en / (1.25 * sa);
    }
  printf("%s: %s, worst |D - F64| / sum|alpha a b| = %.3g%s\n", what, hq_gemm_path_name(path),
         worst, fus ? " (fused checked too)" : "");
  free(fus);
  free(got);
  free(emu);
  free(fa);
  free(fb);
}

/* The buffer with `role` (HQ_ROLE_*) of storage st; a test failure when it has none. */
static inline const hq_buffer *hq_gpu_buf_of(const hq_storage *st, uint32_t role) {
  for (uint32_t i = 0; i < st->nbuf; i++)
    if (hq_storage_cbuf(st, i)->role == role) return hq_storage_cbuf(st, i);
  fail_msg("storage without a buffer of role %u", role);
  return NULL;
}

/* Raw dequantize (HQ_CALL_DEQ_RAW) of storage s through the module's op, directly: on the host
   into dst (host memory), or on a CUDA device into dst (device memory, legacy default stream). */
static inline void hq_gpu_raw_direct(const hq_format_ops *ops, const hq_host_api *host,
                                     const hq_storage *s, int device, hq_tensor *dst) {
  hq_call call = hq_test_call(host, 0, 0);
  call.device = device;
  call.flags = HQ_CALL_DEQ_RAW;
  uint8_t cfg[256] = {0}; /* dequantize reads the storage, not the instance */
  int rc = ops->dequantize(cfg, &call, s, dst);
  if (rc) fail_msg("raw dequantize on device %d -> %d: %s", device, rc, hq_test_module_error());
}

/* The raw values of direction d of h (host) and g (device) agree byte for byte, into f32,
   bf16 and f16. */
static inline void hq_gpu_compare_raw(hq_ctx *dev, const hq_format_ops *ops,
                                      const hq_host_api *host, const hq_qtensor *h,
                                      const hq_qtensor *g, uint32_t d, const char *what) {
  const int64_t M = hq_qtensor_rows(h), K = hq_qtensor_cols(h);
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
  for (int o = 0; o < 3; o++) {
    const size_t bytes = (size_t)(M * K) * hq_dtype_size(outs[o]);
    hq_tensor dh = hq_test_empty(outs[o], M, K), dg = dh;
    HQ_OK_OR_FAIL(hq_ctx_alloc(dev, bytes, &dg.data));
    dg.device = hq_ctx_device(dev);
    hq_gpu_raw_direct(ops, host, hq_qtensor_storage(h, d), HQ_DEVICE_HOST, &dh);
    hq_gpu_raw_direct(ops, host, hq_qtensor_storage(g, d), hq_ctx_device(dev), &dg);
    uint8_t *back = malloc(bytes);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, back, HQ_DEVICE_HOST, dg.data, hq_ctx_device(dev), bytes));
    HQ_OK_OR_FAIL(hq_ctx_sync(dev));
    for (int64_t t = 0; t < M * K; t++) {
      const float a = hq_load_hp(back, t, outs[o]), b = hq_load_hp(dh.data, t, outs[o]);
      if (isnan(a) && isnan(b)) continue; /* NaN payloads: host and device multiplies differ */
      if (memcmp(back + (size_t)t * hq_dtype_size(outs[o]),
                 (uint8_t *)dh.data + (size_t)t * hq_dtype_size(outs[o]), hq_dtype_size(outs[o])))
        fail_msg("%s: raw dequantize dir %u into %s differs at element %lld: host_ctx %a dev %a", what,
                 d, hq_dtype_name(outs[o]), (long long)t, (double)b, (double)a);
    }
    free(back);
    free(dh.data);
    hq_ctx_free(dev, dg.data);
  }
}

/* D = op(A) op(B) of two qtensors quantized alike on the host (h*) and the device (g*): the
   device's hq_gemm (whatever path hq_gemm_plan names) equals the host's F64 product of the
   dequantized operands within FP32 accumulation error, which bounds the host's own hq_gemm too;
   when the path is NATIVE the same GEMM forced onto the emulated path agrees with it as well.
   Returns the path. */
static inline uint32_t hq_gpu_gemm_device_check(hq_ctx *host_ctx, hq_ctx *dev,
                                                const hq_qtensor *hA, const hq_qtensor *gA, int ta,
                                                const hq_qtensor *hB, const hq_qtensor *gB, int tb,
                                                const char *what) {
  const int64_t A0 = hq_qtensor_rows(hA), A1 = hq_qtensor_cols(hA);
  const int64_t B0 = hq_qtensor_rows(hB), B1 = hq_qtensor_cols(hB);
  const int64_t m = ta ? A0 : A1, k = ta ? A1 : A0, n = tb ? B1 : B0;
  hq_tensor a = hq_test_empty(HQ_F32, A0, A1), b = hq_test_empty(HQ_F32, B0, B1);
  HQ_OK_OR_FAIL(hq_dequantize(hA, host_ctx, ta ? HQ_ROWWISE : HQ_COLWISE, &a));
  HQ_OK_OR_FAIL(hq_dequantize(hB, host_ctx, tb ? HQ_COLWISE : HQ_ROWWISE, &b));
  hq_gemm_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  hq_tensor dg = hq_tensor_2d(NULL, HQ_F32, hq_ctx_device(dev), n, m), de = dg;
  const size_t bytes = (size_t)(n * m) * sizeof(float);
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, bytes, &dg.data));
  HQ_OK_OR_FAIL(hq_ctx_alloc(dev, bytes, &de.data));
  HQ_OK_OR_FAIL(hq_gemm_plan(dev, hq_operand_q(gA), ta, hq_operand_q(gB), tb, &dg, NULL, &info));
  const uint32_t path = info.path;
  printf("%s: path %s%s%s\n", what, hq_gemm_path_name(path), info.reason[0] ? ": " : "",
         info.reason);
  HQ_OK_OR_FAIL(hq_gemm(dev, hq_operand_q(gA), ta, hq_operand_q(gB), tb, &dg, 1.0f, 0.0f, NULL,
                        &info));
  assert_int_equal(info.path, path);
  hq_gemm_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.flags = HQ_GEMM_FORCE_EMULATED;
  HQ_OK_OR_FAIL(hq_gemm(dev, hq_operand_q(gA), ta, hq_operand_q(gB), tb, &de, 1.0f, 0.0f, &args,
                        &info));
  /* forced emulation multiplies in BF16, or in F32 where the operands' raw values need it; a plan
     that was emulated already is that same path */
  assert_true(info.path == HQ_GEMM_PATH_EMULATED_BF16 || info.path == HQ_GEMM_PATH_EMULATED_F32);
  if (path == HQ_GEMM_PATH_EMULATED_BF16 || path == HQ_GEMM_PATH_EMULATED_F32)
    assert_int_equal(info.path, path);
  float *back = malloc(bytes), *backe = malloc(bytes);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, back, HQ_DEVICE_HOST, dg.data, hq_ctx_device(dev), bytes));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(dev, backe, HQ_DEVICE_HOST, de.data, hq_ctx_device(dev), bytes));
  HQ_OK_OR_FAIL(hq_ctx_sync(dev));
  const float *af = a.data, *bf = b.data;
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0, sabs = 0;
      for (int64_t p = 0; p < k; p++) {
        const double x = ta ? af[i * A1 + p] : af[p * A1 + i];
        const double y = tb ? bf[p * B1 + j] : bf[j * B1 + p];
        s += x * y;
        sabs += fabs(x * y);
      }
      const double tol = (double)(k + 16) * 0x1p-23 * sabs + 1e-30;
      const float got = back[j * m + i], emu = backe[j * m + i];
      if (!(fabs(got - s) <= tol) || !(fabs(emu - s) <= tol))
        fail_msg("%s (%s): D[%lld][%lld] = %.9g (emulated %.9g), F64 %.9g, tol %g", what,
                 hq_gemm_path_name(path), (long long)j, (long long)i, (double)got, (double)emu,
                 s, tol);
    }
  free(back);
  free(backe);
  hq_ctx_free(dev, dg.data);
  hq_ctx_free(dev, de.data);
  free(a.data);
  free(b.data);
  return path;
}

/* A format with a per-tensor amax: the caller-supplied amax and update on the device against
   the CPU. hq_quantizer_amax agrees bit for bit; hq_quantize_ex with it gives h (the CPU's
   hq_quantize of x); other amaxes (x4 / x0.5, x3 / x3, x0.25 / x0.125 of the rowwise /
   columnwise amax: larger, smaller -- the element format saturates -- and different per
   direction) give the CPU's bytes through quantize_ex and update_ex; update with new data y,
   plain and with y's device amax, equals the CPU's fresh quantize of y. x, y on the host, xg,
   yg their device copies; rng (NULL: none) is called with the context before each quantize_ex
   and update_ex and with both before the CPU's and the device's quantize and update of y, so
   that stochastic rounding draws the same stream on both sides. */
static inline void hq_gpu_check_amax_and_update(hq_ctx *cpu, hq_ctx *gpu, hq_quantizer *q,
                                                uint32_t usage, const hq_tensor *x,
                                                const hq_tensor *xg, const hq_qtensor *h,
                                                const hq_tensor *y, const hq_tensor *yg,
                                                void (*rng)(hq_ctx *), const char *what) {
  char w[512];
  float ah[2] = {-1, -1}, back[2];
  float *ag = hq_gpu_amax_to_dev(gpu, ah);
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, cpu, x, ah));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, xg, ag));
  hq_gpu_amax_to_host(gpu, ag, back);
  if (memcmp(ah, back, sizeof ah) != 0)
    fail_msg("%s: amax cpu {%a, %a} gpu {%a, %a}", what, ah[0], ah[1], back[0], back[1]);
  if (rng) rng(gpu);
  hq_qtensor *g = hq_test_quantize_ex(q, gpu, xg, ag);
  snprintf(w, sizeof w, "%s, quantize_ex(own amax)", what);
  hq_gpu_compare_usage(gpu, h, g, usage, w);
  hq_qtensor_free(g);
  const float others[3][2] = {{ah[0] * 4.0f, ah[1] * 0.5f},
                              {ah[0] * 3.0f, ah[1] * 3.0f},
                              {ah[0] * 0.25f, ah[1] * 0.125f}};
  for (int k = 0; k < 3; k++) {
    float *og = hq_gpu_amax_to_dev(gpu, others[k]);
    if (rng) rng(cpu);
    hq_qtensor *hc = hq_test_quantize_ex(q, cpu, x, others[k]);
    if (rng) rng(gpu);
    hq_qtensor *gc = hq_test_quantize_ex(q, gpu, xg, og);
    snprintf(w, sizeof w, "%s, quantize_ex(amax {%g, %g})", what, others[k][0], others[k][1]);
    hq_gpu_compare_usage(gpu, hc, gc, usage, w);
    /* update on the device with that amax: the same bytes again */
    hq_qtensor *gu = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, gpu, yg, &gu));
    if (rng) rng(gpu);
    hq_test_update_ex(gu, gpu, xg, og);
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    snprintf(w, sizeof w, "%s, update_ex(amax {%g, %g})", what, others[k][0], others[k][1]);
    hq_gpu_compare_usage(gpu, hc, gu, usage, w);
    hq_qtensor_free(gu);
    hq_qtensor_free(hc);
    hq_qtensor_free(gc);
    hq_ctx_free(gpu, og);
  }
  hq_qtensor *hy = NULL, *g1 = NULL, *g2 = NULL;
  if (rng) rng(cpu), rng(gpu);
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, y, &hy));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, xg, &g1));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, xg, &g2));
  if (rng) rng(cpu), rng(gpu);
  HQ_OK_OR_FAIL(hq_qtensor_update(g1, gpu, yg));
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, gpu, yg, ag));
  if (rng) rng(gpu);
  hq_test_update_ex(g2, gpu, yg, ag);
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  snprintf(w, sizeof w, "%s, update(y)", what);
  hq_gpu_compare_usage(gpu, hy, g1, usage, w);
  snprintf(w, sizeof w, "%s, update_ex(y, amax(y))", what);
  hq_gpu_compare_usage(gpu, hy, g2, usage, w);
  hq_qtensor_free(hy);
  hq_qtensor_free(g1);
  hq_qtensor_free(g2);
  hq_ctx_free(gpu, ag);
}

/* One GEMM case over the three operands of hq_gpu_check_role_gemms: operand a (0 weight,
   1 input, 2 grad_output) with transpose flag ta, operand b with tb. */
typedef struct {
  const char *what;
  int a, ta, b, tb;
} hq_gpu_gemm_case;

/* The linear layer's GEMMs of one block-scaled format on the device: the recipe text maps the
   roles linear:{weight,input,grad_output}:*; W [192, 256], x [128, 256] and dy [128, 192]
   (BF16, seeds seed, seed + 1, seed + 2) are quantized on the host and the device (rng, NULL
   for none, called with both contexts before each pair: stochastic rounding's stream), and
   each case goes through hq_gpu_gemm_device_check, whose path must be native where
   native_on(arch) is true for device 0's architecture (sm_NN: NN), else emulated -- and then
   hq_gemm_plan's reason names the architecture ("is sm_NN"). */
static inline void hq_gpu_check_role_gemms(hq_ctx *cpu, hq_ctx *gpu, const char *recipe_text,
                                           uint64_t seed, void (*rng)(hq_ctx *),
                                           const hq_gpu_gemm_case *cases, size_t ncases,
                                           int (*native_on)(int arch)) {
  int arch = 0;
  char name[128];
  HQ_OK_OR_FAIL(hq_device_info(0, name, sizeof name, &arch));
  const int native = native_on(arch);
  hq_recipe *r = hq_test_recipe(recipe_text);
  hq_quantizer *qs[3] = {hq_test_quantizer(r, "linear:weight:w"),
                         hq_test_quantizer(r, "linear:input:x"),
                         hq_test_quantizer(r, "linear:grad_output:y")};
  const int64_t shape[3][2] = {{192, 256}, {128, 256}, {128, 192}}; /* W, x, dy */
  hq_qtensor *h[3], *g[3];
  hq_tensor xs[3];
  for (int t = 0; t < 3; t++) {
    xs[t] = hq_test_tensor(HQ_BF16, shape[t][0], shape[t][1], seed + (uint64_t)t, 2.0f);
    hq_tensor xg = hq_gpu_tensor_at(gpu, &xs[t], 0);
    if (rng) rng(cpu), rng(gpu);
    HQ_OK_OR_FAIL(hq_quantize(qs[t], cpu, &xs[t], &h[t]));
    HQ_OK_OR_FAIL(hq_quantize(qs[t], gpu, &xg, &g[t]));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    hq_ctx_free(gpu, xg.data);
  }
  for (size_t c = 0; c < ncases; c++) {
    const hq_gpu_gemm_case *k = &cases[c];
    const uint32_t path = hq_gpu_gemm_device_check(cpu, gpu, h[k->a], g[k->a], k->ta, h[k->b],
                                                   g[k->b], k->tb, k->what);
    const uint32_t want = native ? HQ_GEMM_PATH_NATIVE : HQ_GEMM_PATH_EMULATED_BF16;
    if (!hq_gpu_path_ok(path, want))
      fail_msg("%s: path %s, expected %s", k->what, hq_gemm_path_name(path),
               hq_gemm_path_name(want));
  }
  if (!native) {
    hq_gemm_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    HQ_OK_OR_FAIL(hq_gemm_plan(gpu, hq_operand_q(g[0]), 1, hq_operand_q(g[1]), 0, NULL, NULL,
                               &info));
    char want[32];
    snprintf(want, sizeof want, "is sm_%d", arch);
    if (!strstr(info.reason, want)) fail_msg("reason '%s' lacks '%s'", info.reason, want);
  }
  for (int t = 0; t < 3; t++) {
    hq_qtensor_free(h[t]);
    hq_qtensor_free(g[t]);
    free(xs[t].data);
    hq_quantizer_free(qs[t]);
  }
  hq_recipe_free(r);
}

/* A device storage laid out by the module itself (ops->layout for [M, K] of dtype dt, direction
   d, usage), each buffer's bytes from its shape: every buffer at `shared` when that is not NULL
   (a test that lets nothing touch them), else allocated on dev's device (one byte at least, so
   an empty buffer's pointer is never NULL); hq_gpu_free_storage frees them. For what the public
   API does not make, e.g. an empty tensor or one too large to allocate. */
static inline void hq_gpu_device_storage(hq_ctx *dev, const hq_format_ops *ops, const void *cfg,
                                         const hq_host_api *host, int64_t M, int64_t K,
                                         hq_dtype dt, uint32_t d, uint32_t usage, void *shared,
                                         hq_storage *st) {
  hq_test_storage_init(st, d, M, K, dt);
  if (ops->layout(cfg, host, M, K, d, usage, st))
    fail_msg("layout [%lld, %lld] direction %u: %s", (long long)M, (long long)K, d,
             hq_test_module_error());
  st->device = hq_ctx_device(dev);
  for (uint32_t b = 0; b < st->nbuf; b++) {
    hq_buffer *buf = hq_storage_buf(st, b);
    size_t n = hq_dtype_size(buf->dtype);
    for (int k = 0; k < buf->ndim; k++) n *= (size_t)buf->shape[k];
    buf->bytes = n;
    if (shared)
      buf->ptr = shared;
    else
      HQ_OK_OR_FAIL(hq_ctx_alloc(dev, n ? n : 1, &buf->ptr));
  }
}
static inline void hq_gpu_free_storage(hq_ctx *dev, hq_storage *st) {
  for (uint32_t b = 0; b < st->nbuf; b++) hq_ctx_free(dev, hq_storage_buf(st, b)->ptr);
}

/* ABI 2.3 (HQ_CAP_DEQ_FACTOR) on gpu's device: a raw dequantize of device storage sg ([M, K],
   factor fh as the host computed it; a module whose dequantize needs no config) with
   call->factor_out writes RN(1.5 * fh), then, chained through factor_in, RN(RN(1.5 * fh) * fh)
   (the test's own float arithmetic), from the dequantize kernel on the stream; the values are
   those of a plain raw dequantize (BF16, the emulated GEMM's dtype). With M == 0 no dequantize
   kernel runs and the factor is still written. */
static inline void hq_gpu_check_factor_out(hq_ctx *gpu, const hq_format_ops *ops,
                                           const hq_host_api *host, const hq_storage *sg,
                                           float fh, int64_t M, int64_t K, const char *what) {
  volatile float m0 = 1.5f, w0 = m0 * fh, w1 = w0 * fh;
  const size_t bytes = (size_t)(M * K) * 2;
  float *dev = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, 2 * sizeof(float), (void **)&dev));
  hq_tensor y[3];
  for (int i = 0; i < 3; i++) {
    y[i] = hq_tensor_2d(NULL, HQ_BF16, hq_ctx_device(gpu), M, K);
    HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes ? bytes : 16, &y[i].data)); /* never NULL */
  }
  uint8_t cfg[256] = {0};
  hq_call c = hq_test_call(host, 0, 0);
  c.device = hq_ctx_device(gpu);
  c.flags = HQ_CALL_DEQ_RAW;
  if (ops->dequantize(cfg, &c, sg, &y[0])) fail_msg("%s: %s", what, hq_test_module_error());
  c.factor_out = dev;
  c.factor_mul = 1.5f;
  if (ops->dequantize(cfg, &c, sg, &y[1])) fail_msg("%s: %s", what, hq_test_module_error());
  c.factor_out = dev + 1;
  c.factor_in = dev;
  c.factor_mul = 99.0f; /* ignored: factor_in is set */
  if (ops->dequantize(cfg, &c, sg, &y[2])) fail_msg("%s: %s", what, hq_test_module_error());
  float got[2];
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, got, HQ_DEVICE_HOST, dev, hq_ctx_device(gpu), sizeof got));
  uint8_t *back[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3 && bytes; i++) {
    back[i] = malloc(bytes);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back[i], HQ_DEVICE_HOST, y[i].data, hq_ctx_device(gpu),
                                bytes));
  }
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  const float want[2] = {w0, w1};
  if (memcmp(got, want, sizeof got))
    fail_msg("%s: factor_out %a, %a; want RN(1.5 * %a) = %a, then %a", what, (double)got[0],
             (double)got[1], (double)fh, (double)want[0], (double)want[1]);
  for (int i = 1; i < 3 && bytes; i++)
    if (memcmp(back[i], back[0], bytes))
      fail_msg("%s: the values of a raw dequantize with factor_out differ from a plain one", what);
  for (int i = 0; i < 3; i++) {
    free(back[i]);
    hq_ctx_free(gpu, y[i].data);
  }
  hq_ctx_free(gpu, dev);
}

/* dequantize_pair (format ABI 2.6) of device storages sa and sb into dtype dt takes the pair
   (no HQ_ENOTSUP) and writes the bytes of the two raw dequantizes made alone, every byte of both
   outputs (their memory holds another pattern first). With folds (the module folds its
   per-tensor factor; fa, fb the factors' host values) the pair is a chain: the first writes
   RN(1.5 * fa), the second reads that product and writes RN(RN(1.5 * fa) * fb). */
static inline void hq_gpu_check_pair(hq_ctx *gpu, const hq_format_ops *ops,
                                     const hq_host_api *host, const hq_storage *sa,
                                     const hq_storage *sb, hq_dtype dt, int folds, float fa,
                                     float fb, const char *what) {
  if (!ops->dequantize_pair) fail_msg("%s: the module has no dequantize_pair", what);
  const hq_storage *st[2] = {sa, sb};
  const int dev = hq_ctx_device(gpu);
  hq_tensor y[4]; /* a and b alone, a and b as a pair */
  size_t bytes[2];
  uint8_t *back[4];
  for (int i = 0; i < 4; i++) {
    const hq_storage *s = st[i % 2];
    bytes[i % 2] = (size_t)(s->rows * s->cols) * hq_dtype_size(dt);
    y[i] = hq_tensor_2d(NULL, dt, dev, s->rows, s->cols);
    HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, bytes[i % 2], &y[i].data));
    back[i] = malloc(bytes[i % 2]);
    memset(back[i], 0xa5, bytes[i % 2]);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, y[i].data, dev, back[i], HQ_DEVICE_HOST, bytes[i % 2]));
  }
  float *prod = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, 2 * sizeof(float), (void **)&prod));
  uint8_t cfg[256] = {0};
  hq_call c = hq_test_call(host, 0, 0);
  c.device = dev;
  c.flags = HQ_CALL_DEQ_RAW;
  if (ops->dequantize(cfg, &c, sa, &y[0]) || ops->dequantize(cfg, &c, sb, &y[1]))
    fail_msg("%s: dequantize: %s", what, hq_test_module_error());
  hq_call ca = c, cb = c;
  if (folds) {
    ca.factor_out = prod;
    ca.factor_mul = 1.5f;
    cb.factor_out = prod + 1;
    cb.factor_in = prod;
    cb.factor_mul = 99.0f; /* ignored: factor_in is set */
  }
  const int rc = ops->dequantize_pair(cfg, &ca, sa, &y[2], cfg, &cb, sb, &y[3]);
  if (rc) fail_msg("%s: dequantize_pair -> %d: %s", what, rc, hq_test_module_error());
  float got[2] = {0.0f, 0.0f};
  if (folds) HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, got, HQ_DEVICE_HOST, prod, dev, sizeof got));
  for (int i = 0; i < 4; i++)
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back[i], HQ_DEVICE_HOST, y[i].data, dev, bytes[i % 2]));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  for (int i = 0; i < 2; i++)
    if (memcmp(back[2 + i], back[i], bytes[i]))
      fail_msg("%s: the pair's %c differs from its dequantize alone", what, i ? 'b' : 'a');
  volatile float w0 = 1.5f * fa, w1 = w0 * fb; /* each product rounded to FP32 */
  const float want[2] = {w0, w1};
  if (folds && memcmp(got, want, sizeof got))
    fail_msg("%s: the pair's products %a, %a; want RN(1.5 * %a) = %a, then RN(* %a) = %a", what,
             (double)got[0], (double)got[1], (double)fa, (double)want[0], (double)fb,
             (double)want[1]);
  for (int i = 0; i < 4; i++) {
    free(back[i]);
    hq_ctx_free(gpu, y[i].data);
  }
  hq_ctx_free(gpu, prod);
}

#endif
