/*
** test_numerics_fp8.c -- the FP8 / FP16 / BF16 element rules of hq/numerics.h, against
** independent expectations: every code point decoded by a formula written here, encodes checked
** against fp8_ref.h's nearest-value search (ties to the even code), hand-computed vectors for
** subnormals, saturation, NaN and signed zero, the FP8 element kind as an hq_dtype (HQ_E4M3 /
** HQ_E5M2 select the codec; there is no second FP8 enum), and TE's current-scaling scale rule
** (hq_scale_from_amax, now the stock plugins' plugins/common/fp8_scale.h).
*/
#include <float.h>
#include <math.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "hq_test.h"
#include "fp8_ref.h"
#include "fp8_scale.h"

/* Independent decode: sign / exponent / mantissa fields -> value, in double. */
static double ref_decode(unsigned code, int ebits, int mbits, int bias, int ieee_inf) {
  unsigned s = (code >> (ebits + mbits)) & 1u;
  unsigned e = (code >> mbits) & ((1u << ebits) - 1u);
  unsigned m = code & ((1u << mbits) - 1u);
  double v;
  if (e == (1u << ebits) - 1u) {
    if (ieee_inf) return m ? NAN : (s ? -INFINITY : INFINITY);
    if (m == (1u << mbits) - 1u) return NAN; /* E4M3: only S.1111.111 is NaN */
  }
  if (e == 0) v = ldexp((double)m, 1 - bias - mbits);
  else v = ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias);
  return s ? -v : v;
}

static double e4m3_ref(unsigned c) { return ref_decode(c, 4, 3, 7, 0); }
static double e5m2_ref(unsigned c) { return ref_decode(c, 5, 2, 15, 1); }

static void test_e4m3_decode_every_code(void **state) {
  (void)state;
  int nans = 0;
  for (unsigned c = 0; c < 256; c++) {
    double ref = e4m3_ref(c);
    float got = hq_e4m3_to_f32((uint8_t)c);
    if (isnan(ref)) {
      assert_true(isnan(got));
      nans++;
      continue;
    }
    assert_true((double)got == ref);
    assert_int_equal(signbit(got) != 0, (c & 0x80) != 0);
  }
  assert_int_equal(nans, 2); /* 0x7F and 0xFF */
  assert_true(hq_e4m3_to_f32(0x7e) == 448.0f);
  assert_true(hq_e4m3_to_f32(0x01) == 0.001953125f); /* smallest subnormal 2^-9 */
  assert_true(hq_e4m3_to_f32(0x08) == 0.015625f);    /* smallest normal 2^-6 */
  assert_true(hq_e4m3_to_f32(0x38) == 1.0f);
}

static void test_e5m2_decode_every_code(void **state) {
  (void)state;
  for (unsigned c = 0; c < 256; c++) {
    double ref = e5m2_ref(c);
    float got = hq_e5m2_to_f32((uint8_t)c);
    if (isnan(ref)) assert_true(isnan(got));
    else assert_true((double)got == ref);
  }
  assert_true(isinf(hq_e5m2_to_f32(0x7c)) && hq_e5m2_to_f32(0x7c) > 0);
  assert_true(hq_e5m2_to_f32(0x7b) == 57344.0f);
  assert_true(hq_e5m2_to_f32(0x01) == 1.52587890625e-05f); /* 2^-16 */
  assert_true(hq_e5m2_to_f32(0x3c) == 1.0f);
}

/* Every finite code re-encodes to itself. */
static void test_fp8_roundtrip_every_code(void **state) {
  (void)state;
  for (unsigned c = 0; c < 256; c++) {
    float v = hq_e4m3_to_f32((uint8_t)c);
    if (!isnan(v)) assert_int_equal(hq_f32_to_e4m3(v), c);
    float w = hq_e5m2_to_f32((uint8_t)c);
    if (!isnan(w) && !isinf(w)) assert_int_equal(hq_f32_to_e5m2(w), c);
  }
}

/* Midpoints between neighbouring codes are ties: they go to the even code; a hair above or
   below goes to the nearer one. */
static void test_fp8_ties_to_even(void **state) {
  (void)state;
  struct { double (*dec)(unsigned); uint8_t (*enc)(float); unsigned maxc; } f[2] = {
      {e4m3_ref, hq_f32_to_e4m3, 0x7e}, {e5m2_ref, hq_f32_to_e5m2, 0x7b}};
  for (int k = 0; k < 2; k++) {
    for (unsigned c = 0; c < f[k].maxc; c++) {
      double lo = f[k].dec(c), hi = f[k].dec(c + 1);
      float mid = (float)((lo + hi) / 2); /* exact in FP32 */
      assert_true((double)mid == (lo + hi) / 2);
      unsigned even = (c & 1u) ? c + 1 : c;
      assert_int_equal(f[k].enc(mid), even);
      assert_int_equal(f[k].enc(-mid), 0x80u | even);
      assert_int_equal(f[k].enc(nextafterf(mid, 0.0f)), c);
      assert_int_equal(f[k].enc(nextafterf(mid, INFINITY)), c + 1);
    }
  }
  /* hand-picked E4M3 ties: 1.0625 lies between 1.0 (0x38) and 1.125 (0x39) -> even 0x38;
     1.1875 between 1.125 (0x39) and 1.25 (0x3A) -> 0x3A; subnormal 1.5*2^-9 -> 0x02;
     0.5*2^-9 -> 0 (ties to even zero) */
  assert_int_equal(hq_f32_to_e4m3(1.0625f), 0x38);
  assert_int_equal(hq_f32_to_e4m3(1.1875f), 0x3a);
  assert_int_equal(hq_f32_to_e4m3(0.0029296875f), 0x02);
  assert_int_equal(hq_f32_to_e4m3(0.0009765625f), 0x00);
  assert_int_equal(hq_f32_to_e4m3(-0.0009765625f), 0x80);
  /* the largest subnormal rounds up into the smallest normal: 7.5*2^-9 -> 2^-6 = 0x08 */
  assert_int_equal(hq_f32_to_e4m3(0.0146484375f), 0x08);
}

static void test_fp8_saturation_nan_zero(void **state) {
  (void)state;
  assert_int_equal(hq_f32_to_e4m3(448.0f), 0x7e);
  assert_int_equal(hq_f32_to_e4m3(449.0f), 0x7e);
  assert_int_equal(hq_f32_to_e4m3(464.0f), 0x7e); /* would round to 480: saturates */
  assert_int_equal(hq_f32_to_e4m3(1e30f), 0x7e);
  assert_int_equal(hq_f32_to_e4m3(INFINITY), 0x7e);
  assert_int_equal(hq_f32_to_e4m3(-INFINITY), 0xfe);
  assert_int_equal(hq_f32_to_e4m3(NAN), 0x7f);
  assert_int_equal(hq_f32_to_e5m2(60000.0f), 0x7b);
  assert_int_equal(hq_f32_to_e5m2(INFINITY), 0x7b); /* satfinite: never Inf */
  assert_int_equal(hq_f32_to_e5m2(-INFINITY), 0xfb);
  assert_int_equal(hq_f32_to_e5m2(NAN), 0x7f);
  assert_int_equal(hq_f32_to_e4m3(0.0f), 0x00);
  assert_int_equal(hq_f32_to_e4m3(-0.0f), 0x80);
  assert_int_equal(hq_f32_to_e5m2(-0.0f), 0x80);
  assert_int_equal(hq_f32_to_e4m3(1e-30f), 0x00);  /* underflow keeps the sign */
  assert_int_equal(hq_f32_to_e4m3(-1e-30f), 0x80);
  assert_int_equal(hq_f32_to_e4m3(1.4e-45f), 0x00); /* FP32 subnormal input */
}

/* Random inputs over many binades against the brute-force encoder. */
static void test_fp8_random_vs_bruteforce(void **state) {
  (void)state;
  uint64_t s = 12345;
  for (int i = 0; i < 200000; i++) {
    float x = ldexpf(hq_test_uniform(&s), (int)(hq_test_rand(&s) % 40) - 24);
    assert_int_equal(hq_f32_to_e4m3(x), ref_fp8_encode(x, 0));
    float y = ldexpf(hq_test_uniform(&s), (int)(hq_test_rand(&s) % 50) - 28);
    assert_int_equal(hq_f32_to_e5m2(y), ref_fp8_encode(y, 1));
  }
}

static double f16_ref(unsigned c) { return ref_decode(c, 5, 10, 15, 1); }

/* hq_f16_to_f32 gives the same bits for every pattern when the CPU flushes subnormal operands
   and results (MXCSR DAZ and FTZ, as a process linked with -ffast-math runs): a subnormal half
   must not go through a subnormal FP32. x86 only (skipped elsewhere). */
static void test_f16_flushing_cpu(void **state) {
  (void)state;
#if defined(__x86_64__) || defined(__i386__)
  static uint32_t want[65536];
  for (unsigned c = 0; c < 65536; c++) {
    const float f = hq_f16_to_f32((uint16_t)c);
    memcpy(&want[c], &f, 4);
  }
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6) */
  unsigned bad = 0, first = 0;
  for (unsigned c = 0; c < 65536; c++) {
    volatile uint16_t h = (uint16_t)c;
    const float f = hq_f16_to_f32(h);
    uint32_t b;
    memcpy(&b, &f, 4);
    if (b != want[c] && !bad++) first = c;
  }
  _mm_setcsr(csr);
  if (bad) fail_msg("%u patterns differ with DAZ/FTZ, the first 0x%04x", bad, first);
#else
  skip();
#endif
}

static void test_f16_bf16(void **state) {
  (void)state;
  for (unsigned c = 0; c < 65536; c++) {
    double ref = f16_ref(c);
    float got = hq_f16_to_f32((uint16_t)c);
    uint32_t gb;
    memcpy(&gb, &got, 4);
    assert_int_equal(gb >> 31, c >> 15); /* the sign, -0.0 and NaN's included */
    if (isnan(ref)) /* a NaN keeps its payload: the mantissa bits 13 places up */
      assert_int_equal(gb, ((c & 0x8000u) << 16) | 0x7f800000u | ((c & 0x3ffu) << 13));
    else {
      assert_true((double)got == ref);
      if (!isinf(ref)) assert_int_equal(hq_f32_to_f16(got), c); /* exact values round-trip */
    }
    /* bf16 is the top half of an FP32 */
    uint32_t bits = (uint32_t)c << 16;
    float b = hq_bf16_to_f32((uint16_t)c);
    uint32_t bb;
    memcpy(&bb, &b, 4);
    assert_int_equal(bb, bits);
  }
  assert_int_equal(hq_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(hq_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(hq_f32_to_f16(65520.0f), 0x7c00); /* tie to even -> Inf */
  assert_int_equal(hq_f32_to_f16(5.9604644775390625e-08f), 0x0001);
  assert_int_equal(hq_f32_to_f16(2.98023223876953125e-08f), 0x0000); /* tie -> even 0 */
  assert_int_equal(hq_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(hq_f32_to_bf16(1.00390625f), 0x3f80); /* tie: 1 + 2^-8 -> even 0x3f80 */
  assert_int_equal(hq_f32_to_bf16(1.01171875f), 0x3f82); /* tie: 1 + 3*2^-8 -> even 0x3f82 */
  assert_true(isnan(hq_bf16_to_f32(hq_f32_to_bf16(NAN))));
}

/* The FP8 element kind is the hq_dtype: the ABI values are fixed, and the dtype-selected codecs
   equal the named ones for every code and for random inputs, scaled or not. */
static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_fp8_dtype_selectors(void **state) {
  (void)state;
  assert_int_equal(HQ_E4M3, 5); /* ABI values: never renumbered */
  assert_int_equal(HQ_E5M2, 6);
  assert_int_equal(hq_dtype_size(HQ_E4M3), 1);
  assert_int_equal(hq_dtype_size(HQ_E5M2), 1);
  assert_string_equal(hq_dtype_name(HQ_E4M3), "e4m3");
  assert_string_equal(hq_dtype_name(HQ_E5M2), "e5m2");
  assert_int_equal(hq_dtype_from_name("e4m3"), HQ_E4M3);
  assert_int_equal(hq_dtype_from_name("e5m2"), HQ_E5M2);
  assert_true(hq_fp8_max(HQ_E4M3) == 448.0f);
  assert_true(hq_fp8_max(HQ_E5M2) == 57344.0f);
  for (unsigned c = 0; c < 256; c++) {
    double r4 = e4m3_ref(c), r5 = e5m2_ref(c);
    float g4 = hq_fp8_to_f32((uint8_t)c, HQ_E4M3), g5 = hq_fp8_to_f32((uint8_t)c, HQ_E5M2);
    if (isnan(r4)) assert_true(isnan(g4));
    else assert_true((double)g4 == r4 && !signbit(g4) == !signbit(r4));
    if (isnan(r5)) assert_true(isnan(g5));
    else assert_true((double)g5 == r5 && !signbit(g5) == !signbit(r5));
    /* dequantize: RN(value * scale_inv); a NaN code gives the one canonical NaN */
    float d4 = hq_fp8_dequantize((uint8_t)c, 0.375f, HQ_E4M3);
    float d5 = hq_fp8_dequantize((uint8_t)c, 0.375f, HQ_E5M2);
    if (isnan(r4)) assert_int_equal(bits_of(d4), 0x7fc00000u);
    else assert_true(d4 == (float)(r4 * 0.375)); /* exact: 3 mantissa bits times 0.375 */
    if (isnan(r5)) assert_int_equal(bits_of(d5), 0x7fc00000u);
    else assert_true(d5 == (float)(r5 * 0.375));
  }
  uint64_t s = 777;
  for (int i = 0; i < 50000; i++) {
    float x = ldexpf(hq_test_uniform(&s), (int)(hq_test_rand(&s) % 44) - 26);
    float scale = ldexpf(1.0f + (float)(hq_test_rand(&s) % 255) / 256.0f, 3);
    assert_int_equal(hq_f32_to_fp8(x, HQ_E4M3), ref_fp8_encode(x, 0));
    assert_int_equal(hq_f32_to_fp8(x, HQ_E5M2), ref_fp8_encode(x, 1));
    float xs = x * scale; /* one FP32 rounding, as the codec's RN(x * scale) */
    assert_int_equal(hq_fp8_quantize(x, scale, HQ_E4M3), ref_fp8_encode(xs, 0));
    assert_int_equal(hq_fp8_quantize(x, scale, HQ_E5M2), ref_fp8_encode(xs, 1));
  }
  /* where the kinds differ: 500 saturates in E4M3 and is 512 in E5M2; Inf saturates in both */
  assert_int_equal(hq_f32_to_fp8(500.0f, HQ_E4M3), 0x7e);
  assert_int_equal(hq_f32_to_fp8(500.0f, HQ_E5M2), 0x60);
  assert_int_equal(hq_f32_to_fp8(-INFINITY, HQ_E5M2), 0xfb);
  assert_true(hq_fp8_to_f32(0x60, HQ_E5M2) == 512.0f);
}

/* TE compute_scale_from_amax, hand-computed cases. */
static void test_scale_from_amax(void **state) {
  (void)state;
  assert_true(hq_scale_from_amax(0.0f, 448.0f, 0, 0.0f, FLT_MAX) == 1.0f);
  assert_true(hq_scale_from_amax(INFINITY, 448.0f, 0, 0.0f, FLT_MAX) == 1.0f);
  assert_true(hq_scale_from_amax(NAN, 448.0f, 0, 0.0f, FLT_MAX) == 1.0f);
  assert_true(hq_scale_from_amax(2.0f, 448.0f, 0, 0.0f, FLT_MAX) == 224.0f);
  assert_true(hq_scale_from_amax(3.0f, 448.0f, 0, 0.0f, FLT_MAX) == 448.0f / 3.0f);
  assert_true(hq_scale_from_amax(3.0f, 448.0f, 1, 0.0f, FLT_MAX) == 128.0f); /* pow2 rounds down */
  assert_true(hq_scale_from_amax(448.0f, 448.0f, 1, 0.0f, FLT_MAX) == 1.0f);
  assert_true(hq_scale_from_amax(1e-3f, 448.0f, 0, 0.5f, FLT_MAX) == 896.0f); /* eps floor */
  assert_true(hq_scale_from_amax(1e-40f, 57344.0f, 0, 0.0f, FLT_MAX) == FLT_MAX); /* Inf -> */
  assert_true(hq_scale_from_amax(1e-40f, 448.0f, 1, 0.0f, 65504.0f) == 32768.0f);
  assert_true(hq_rcp_rn(224.0f) == 1.0f / 224.0f);
  /* NaN is ignored by amax, Inf is not */
  assert_true(hq_fmax_nan_ignoring(1.0f, NAN) == 1.0f);
  assert_true(hq_fmax_nan_ignoring(NAN, 2.0f) == 2.0f);
  assert_true(isinf(hq_fmax_nan_ignoring(1.0f, INFINITY)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e4m3_decode_every_code),
      cmocka_unit_test(test_e5m2_decode_every_code),
      cmocka_unit_test(test_fp8_roundtrip_every_code),
      cmocka_unit_test(test_fp8_ties_to_even),
      cmocka_unit_test(test_fp8_saturation_nan_zero),
      cmocka_unit_test(test_fp8_random_vs_bruteforce),
      cmocka_unit_test(test_f16_bf16),
      cmocka_unit_test(test_f16_flushing_cpu),
      cmocka_unit_test(test_fp8_dtype_selectors),
      cmocka_unit_test(test_scale_from_amax),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
