/*
** test_gpu_dist_bf16.c -- the device conversions of --grad-dtype bf16 across GPUs
** (train/cast_cuda.cu, which the bf16-direct run's casts share) round FP32 to BF16 bit for bit as the CPU path does (hq_f32_to_bf16) and
** as a reference written here: the nearer of the two BF16 values around x, compared in double,
** ties to the even code, NaN kept quiet with its sign, the overflow past the largest BF16 to
** Inf. Inputs: every upper half (sign, exponent, 7 mantissa bits) with lower halves that are
** exact, just under, at and just over the tie, and the largest; then 3M values from an RNG, past
** one grid of the kernel. The widening gives every BF16 code's FP32 bits (code << 16). The host
** reference is checked against hq_f32_to_bf16 first; the device part exits 77 without a GPU.
*/
#include "hq_test.h"
#include "hq_gpu_test.h"

#include <string.h>

#include "cast_cuda.h"

static double bf16_value(uint16_t h) {
  if ((h & 0x7fffu) == 0x7f80u) return ldexp(1.0, 128); /* Inf stands as 2^128, one step on */
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return fabs((double)f);
}

/* round to nearest even, written from the definition */
static uint16_t ref_bf16(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x0040u);
  const uint16_t lo = (uint16_t)(u >> 16); /* |x| truncated: the BF16 at or below |x| */
  if (!(u & 0xffffu)) return lo;
  const uint16_t hi = (uint16_t)(lo + 1u);  /* the next one up in magnitude (Inf after the max) */
  const double ax = fabs((double)x), dl = ax - bf16_value(lo), dh = bf16_value(hi) - ax;
  if (dl != dh) return dl < dh ? lo : hi;
  return (lo & 1u) ? hi : lo;
}

static uint32_t *inputs(size_t *count) {
  static const uint16_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff, 0x1234};
  const size_t nl = sizeof lows / sizeof lows[0], rnd = 3u << 20;
  uint32_t *u = malloc((65536 * nl + rnd) * sizeof *u);
  assert_non_null(u);
  size_t n = 0;
  for (uint32_t h = 0; h < 65536; h++)
    for (size_t l = 0; l < nl; l++) u[n++] = h << 16 | lows[l];
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t k = 0; k < rnd; k++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    u[n++] = (uint32_t)(s >> 32);
  }
  *count = n;
  return u;
}

/* the reference is the CPU path's rule (hq_f32_to_bf16, what grads_bf16_mpi calls) */
static void test_cpu_rule(void **state) {
  (void)state;
  size_t n;
  uint32_t *u = inputs(&n);
  for (size_t k = 0; k < n; k++) {
    float f;
    memcpy(&f, &u[k], sizeof f);
    if (hq_f32_to_bf16(f) != ref_bf16(u[k]))
      fail_msg("0x%08x: hq_f32_to_bf16 0x%04x, reference 0x%04x", u[k], hq_f32_to_bf16(f),
               ref_bf16(u[k]));
  }
  free(u);
}

static void test_device(void **state) {
  (void)state;
  hq_ctx *gpu = NULL;
  hq_ctx_desc d = {.struct_size = sizeof d, .device = 0};
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &gpu));
  size_t n;
  uint32_t *u = inputs(&n);
  uint16_t *h16 = malloc(n * sizeof *h16), all[65536];
  uint32_t *back = malloc(65536 * sizeof *back);
  assert_non_null(h16);
  assert_non_null(back);
  void *df = NULL, *dh = NULL, *dw = NULL;
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, n * sizeof(float), &df));
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, n * sizeof(uint16_t), &dh));
  HQ_OK_OR_FAIL(hq_ctx_alloc(gpu, 65536 * sizeof(float), &dw));
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, df, 0, u, HQ_DEVICE_HOST, n * sizeof(float)));
  char err[256];
  void *stream = hq_ctx_stream(gpu);
  /* a count that is no multiple of 4 takes the element-wise kernel, a multiple of 4 on aligned
     buffers the four-element one; each converts up to its count, and nothing after it is
     written */
  const size_t counts[2] = {n - 3, (n - 3) & ~(size_t)3};
  for (int c = 0; c < 2; c++) {
    const size_t cnt = counts[c];
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, dh, 0, memset(h16, 0xab, n * sizeof *h16), HQ_DEVICE_HOST,
                                n * sizeof *h16));
    if (train_cuda_f32_to_bf16(stream, dh, df, (int64_t)cnt, "test cast", err, sizeof err))
      fail_msg("%s", err);
    HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, h16, HQ_DEVICE_HOST, dh, 0, n * sizeof *h16));
    HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
    for (size_t k = 0; k < n; k++) {
      const uint16_t want = k < cnt ? ref_bf16(u[k]) : 0xabab;
      if (h16[k] != want) fail_msg("count %zu, element %zu (0x%08x): device 0x%04x, want 0x%04x",
                                   cnt, k, u[k], h16[k], want);
    }
  }
  /* widening: every BF16 code, its FP32 bits exactly code << 16 (NaN payloads kept) */
  for (uint32_t c = 0; c < 65536; c++) all[c] = (uint16_t)c;
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, dh, 0, all, HQ_DEVICE_HOST, sizeof all));
  if (train_cuda_bf16_to_f32(stream, dw, dh, 65536, "test widening", err, sizeof err)) fail_msg("%s", err);
  HQ_OK_OR_FAIL(hq_ctx_memcpy(gpu, back, HQ_DEVICE_HOST, dw, 0, 65536 * sizeof *back));
  HQ_OK_OR_FAIL(hq_ctx_sync(gpu));
  for (uint32_t c = 0; c < 65536; c++)
    if (back[c] != c << 16) fail_msg("BF16 0x%04x widened to 0x%08x", c, back[c]);
  hq_ctx_free(gpu, df);
  hq_ctx_free(gpu, dh);
  hq_ctx_free(gpu, dw);
  hq_ctx_destroy(gpu);
  free(u);
  free(h16);
  free(back);
}

int main(void) {
  const struct CMUnitTest cpu[] = {cmocka_unit_test(test_cpu_rule)};
  const int rc = cmocka_run_group_tests_name("the CPU path's rule", cpu, NULL, NULL);
  if (rc || !hq_gpu_present()) return rc ? rc : HQ_TEST_SKIP;
  const struct CMUnitTest dev[] = {cmocka_unit_test(test_device)};
  return cmocka_run_group_tests_name("the device kernels", dev, NULL, NULL);
}
