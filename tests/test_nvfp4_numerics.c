/*
** test_nvfp4_numerics.c -- the NVFP4 rules (plugins/nvfp4/nvfp4_rules.h) and the generic E2M1
** element codecs of hq/numerics.h against independent expectations:
** E2M1 code points decoded from their bit fields, encodes against a brute-force nearest search
** (ties to the even code) and FORMATS.md 0.3's tie table, stochastic rounding against a
** double-precision statement of FORMATS.md 3.6's rule, the scale chain of FORMATS.md 3.3 computed
** by hand and in double precision, Philox4x32-10 against Random123's published known answers, the
** RHT against the dense matrix diag(s) H16 / 4, the scale layouts against an enumeration of
** FORMATS.md 2.4's tile order, and the UE5M3 scale codec (scale_dtype = ue5m3) code point by
** code point against its bit fields and a nearest-code search.
*/
#include <math.h>

#include "hq_test.h"
#include "fp8_ref.h"
#include "nvfp4_rules.h"

static const double E2M1_MAG[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

/* E2M1 from its fields: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0. */
static double e2m1_ref(unsigned c) {
  unsigned s = (c >> 3) & 1u, e = (c >> 1) & 3u, m = c & 1u;
  double v = e ? ldexp(1.0 + m / 2.0, (int)e - 1) : m * 0.5;
  return s ? -v : v;
}

/* Brute force: nearest magnitude, ties to the even code, saturating at 6; NaN -> +6; the sign
   bit of x is kept. */
static unsigned e2m1_ref_encode(double x) {
  if (isnan(x)) return 7u;
  unsigned s = signbit(x) ? 8u : 0u;
  double a = fabs(x);
  if (a > 6.0) a = 6.0;
  unsigned best = 0;
  double bd = INFINITY;
  for (unsigned c = 0; c < 8; c++) {
    double d = fabs(E2M1_MAG[c] - a);
    if (d < bd || (d == bd && (c & 1u) == 0)) {
      bd = d;
      best = c;
    }
  }
  return s | best;
}

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_e2m1_decode_every_code(void **state) {
  (void)state;
  for (unsigned c = 0; c < 16; c++) {
    float v = hq_e2m1_to_f32(c);
    assert_true((double)v == e2m1_ref(c));
    assert_true(fabs((double)v) == E2M1_MAG[c & 7u]);
    assert_int_equal(signbit(v) != 0, (c & 8u) != 0);
    assert_int_equal(hq_f32_to_e2m1(v), c); /* every code re-encodes to itself (8 is -0.0) */
  }
  assert_true(hq_e2m1_to_f32(7) == 6.0f);
  assert_true(hq_e2m1_to_f32(15) == -6.0f);
  assert_true(hq_e2m1_to_f32(1) == 0.5f);
}

static void test_e2m1_rne_tie_table(void **state) {
  (void)state;
  /* FORMATS.md 0.3: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4 */
  static const float in[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  static const float out[7] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
  static const unsigned code[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; i++) {
    assert_int_equal(hq_f32_to_e2m1(in[i]), code[i]);
    assert_true(hq_e2m1_to_f32(hq_f32_to_e2m1(in[i])) == out[i]);
    assert_int_equal(hq_f32_to_e2m1(-in[i]), 8u | code[i]);
  }
  /* every midpoint: a hair below goes down, a hair above goes up */
  for (unsigned c = 0; c < 7; c++) {
    float mid = (float)((E2M1_MAG[c] + E2M1_MAG[c + 1]) / 2);
    unsigned even = (c & 1u) ? c + 1 : c;
    assert_int_equal(hq_f32_to_e2m1(mid), even);
    assert_int_equal(hq_f32_to_e2m1(nextafterf(mid, 0.0f)), c);
    assert_int_equal(hq_f32_to_e2m1(nextafterf(mid, INFINITY)), c + 1);
  }
}

/* The nearest E2M1 magnitude code of a >= 0 in double: ties to the even code, above 6 -> 7. */
static unsigned e2m1_nearest(double a) {
  if (a >= 6.0) return 7;
  unsigned best = 0;
  for (unsigned c = 1; c < 8; c++) {
    double d = fabs(a - E2M1_MAG[c]), db = fabs(a - E2M1_MAG[best]);
    if (d < db || (d == db && (c & 1u) == 0)) best = c;
  }
  return best;
}

/* The GPU kernels' form (hq_e2m1_code_nonan) gives hq_f32_to_e2m1's code for every FP32 value
   below 32 (exhaustively, both signs) and on a sweep of the rest up to +-Inf; a sample also
   against the nearest code found in double. The unsaturated form (hq_e2m1_biased_bits_lt7)
   gives the magnitude code for every value below 7. */
static void test_e2m1_fast_form_exhaustive(void **state) {
  (void)state;
  uint64_t bad = 0;
  for (uint32_t u = 0; u <= 0x42000000u; u++) {
    const float x = hq_bits_f32(u), nx = hq_bits_f32(u | 0x80000000u);
    bad += hq_e2m1_code_nonan(x) != hq_f32_to_e2m1(x);
    bad += hq_e2m1_code_nonan(nx) != hq_f32_to_e2m1(nx);
    if (u < 0x40e00000u) /* |x| < 7: the unsaturated form of the kernels' bounded blocks */
      bad += hq_e2m1_biased_bits_lt7(x) - HQ_E2M1_BIAS_BITS != (hq_f32_to_e2m1(x) & 7u);
    if ((u & 0xfffu) == 0x123u && hq_e2m1_code_nonan(x) != e2m1_nearest((double)x))
      fail_msg("0x%08x: code %u, nearest %u", u, hq_e2m1_code_nonan(x), e2m1_nearest((double)x));
  }
  for (uint32_t u = 0x42000000u; u < 0x7f800000u; u += 4099u) {
    bad += hq_e2m1_code_nonan(hq_bits_f32(u)) != 7u;
    bad += hq_e2m1_code_nonan(hq_bits_f32(u | 0x80000000u)) != 15u;
  }
  assert_int_equal(bad, 0);
  assert_int_equal(hq_e2m1_code_nonan(INFINITY), 7);
  assert_int_equal(hq_e2m1_code_nonan(-INFINITY), 15);
  assert_int_equal(hq_e2m1_code_nonan(FLT_MAX), 7);
  assert_int_equal(hq_e2m1_code_nonan(-0.0f), 8);
  assert_int_equal(hq_e2m1_code_nonan(1e-45f), 0);
}

/* The raw dequantize's fast form (hq_nvfp4_raw_fast) equals the rule for every code and every
   E4M3 scale code that is not NaN; its results are exact in BF16 (the low 16 bits are zero), as
   hq_nvfp4_raw_mult's comment proves and the CUDA fast path relies on. */
static void test_raw_fast_every_pair(void **state) {
  (void)state;
  for (uint32_t sf = 0; sf < 256; sf++) {
    const float s = hq_e4m3_to_f32((uint8_t)sf);
    if (isnan(s)) continue;
    for (uint32_t q = 0; q < 16; q++) {
      const float want = hq_nvfp4_dequantize(q, hq_nvfp4_raw_mult((uint8_t)sf));
      const float got = hq_nvfp4_raw_fast(q | 0xfffffff0u, s);
      if (f_bits(want) != f_bits(got))
        fail_msg("code %u sf 0x%02x: fast 0x%08x, rule 0x%08x", q, sf, f_bits(got), f_bits(want));
      assert_int_equal(f_bits(got) & 0xffffu, 0);
    }
  }
}

static void test_e2m1_saturation_nan_sign(void **state) {
  (void)state;
  assert_int_equal(hq_f32_to_e2m1(6.0f), 7);
  assert_int_equal(hq_f32_to_e2m1(5.0001f), 7);
  assert_int_equal(hq_f32_to_e2m1(7.0f), 7);
  assert_int_equal(hq_f32_to_e2m1(1e30f), 7);
  assert_int_equal(hq_f32_to_e2m1(INFINITY), 7);
  assert_int_equal(hq_f32_to_e2m1(-INFINITY), 15);
  assert_int_equal(hq_f32_to_e2m1(-100.0f), 15);
  assert_int_equal(hq_f32_to_e2m1(NAN), 7);   /* satfinite: NaN -> +6 */
  assert_int_equal(hq_f32_to_e2m1(-NAN), 7);
  assert_int_equal(hq_f32_to_e2m1(bits_f(0x7f800001u)), 7); /* signalling NaN */
  assert_int_equal(hq_f32_to_e2m1(bits_f(0xffc00000u)), 7);
  assert_int_equal(hq_f32_to_e2m1(0.0f), 0);
  assert_int_equal(hq_f32_to_e2m1(-0.0f), 8);
  assert_int_equal(hq_f32_to_e2m1(-0.1f), 8);
  assert_int_equal(hq_f32_to_e2m1(1e-45f), 0);
}

static void test_e2m1_random_vs_bruteforce(void **state) {
  (void)state;
  uint64_t s = 777;
  for (int i = 0; i < 300000; i++) {
    float x = ldexpf(hq_test_uniform(&s), (int)(hq_test_rand(&s) % 16) - 10);
    assert_int_equal(hq_f32_to_e2m1(x), e2m1_ref_encode(x));
  }
}

/* FORMATS.md 3.6 in double: t = RN_f32(a + u * step(a)); q = the largest E2M1 value <= t (the
   grid of step(t)), at most 6. */
static double step_of(double v) { return v < 2 ? 0.5 : (v < 4 ? 1.0 : 2.0); }
static unsigned sr_ref(float x, unsigned r8) {
  if (isnan(x)) return 7u;
  unsigned s = signbit(x) ? 8u : 0u;
  double a = fabs((double)x);
  if (a >= 6.0) return s | 7u;
  double t = (double)(float)(a + (r8 / 256.0) * step_of(a));
  double q = floor(t / step_of(t)) * step_of(t);
  if (q > 6.0) q = 6.0;
  for (unsigned c = 0; c < 8; c++)
    if (E2M1_MAG[c] == q) return s | c;
  fail_msg("sr_ref: %g is not an E2M1 value", q);
  return 0;
}

/* The bounded form of the stochastic rule (hq_e2m1_sr_code_lt8) gives hq_f32_to_e2m1_sr's code
   for every FP32 value below 8 with r8 = 0 and 255 (exhaustively) and for every r8 on a sweep of
   the values. */
static void test_e2m1_sr_bounded_form(void **state) {
  (void)state;
  uint64_t bad = 0;
  for (uint32_t u = 0; u < 0x41000000u; u++) {
    const float a = hq_bits_f32(u);
    bad += hq_e2m1_sr_code_lt8(a, 0) != hq_f32_to_e2m1_sr(a, 0);
    bad += hq_e2m1_sr_code_lt8(a, 255) != hq_f32_to_e2m1_sr(a, 255);
    if (u % 4099u == 0)
      for (uint32_t r = 1; r < 255; r++) bad += hq_e2m1_sr_code_lt8(a, r) != hq_f32_to_e2m1_sr(a, r);
  }
  for (uint32_t r = 0; r < 256; r++) /* the binade edges and the largest value below 6 */
    for (int k = 0; k < 8; k++) {
      const float edge[8] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f, 6.0f, 0x1.fffffep2f, 1e-40f};
      const float a = edge[k], below = hq_bits_f32(hq_f32_bits(a) - 1u);
      bad += hq_e2m1_sr_code_lt8(a, r) != hq_f32_to_e2m1_sr(a, r);
      bad += hq_e2m1_sr_code_lt8(below, r) != hq_f32_to_e2m1_sr(below, r);
    }
  assert_int_equal(bad, 0);
}

static void test_e2m1_stochastic_rule(void **state) {
  (void)state;
  /* representable values never move */
  for (unsigned c = 0; c < 16; c++)
    for (unsigned r = 0; r < 256; r++)
      assert_int_equal(hq_f32_to_e2m1_sr(hq_e2m1_to_f32(c), r), c);
  /* 1.25 lies halfway between 1 and 1.5: up exactly when u >= 0.5 */
  for (unsigned r = 0; r < 256; r++)
    assert_int_equal(hq_f32_to_e2m1_sr(1.25f, r), r >= 128 ? 3 : 2);
  /* 2.25 (step 1): up to 3 when u >= 0.75; 5.0 (step 2): up to 6 when u >= 0.5 */
  for (unsigned r = 0; r < 256; r++) {
    assert_int_equal(hq_f32_to_e2m1_sr(2.25f, r), r >= 192 ? 5 : 4);
    assert_int_equal(hq_f32_to_e2m1_sr(-5.0f, r), r >= 128 ? 15 : 14);
  }
  /* crossing a binade: 1.9 + u*0.5 >= 2 goes to 2 (code 4) */
  for (unsigned r = 0; r < 256; r++)
    assert_int_equal(hq_f32_to_e2m1_sr(1.875f, r), r >= 64 ? 4 : 3);
  assert_int_equal(hq_f32_to_e2m1_sr(NAN, 0), 7);
  assert_int_equal(hq_f32_to_e2m1_sr(-NAN, 255), 7);
  assert_int_equal(hq_f32_to_e2m1_sr(INFINITY, 255), 7);
  assert_int_equal(hq_f32_to_e2m1_sr(-INFINITY, 0), 15);
  assert_int_equal(hq_f32_to_e2m1_sr(-1e-9f, 0), 8);
  assert_int_equal(hq_f32_to_e2m1_sr(5.99f, 255), 7);
  /* random values, every r8, against the double statement; and the mean over all 256 r8 is
     the value within 2 * step/256 (8-bit u: a bias below step/256; the FP32 add may move one
     of the 256 decisions) */
  uint64_t s = 4242;
  for (int i = 0; i < 3000; i++) {
    float x = hq_test_uniform(&s) * 6.5f;
    if (i & 1) x = ldexpf(x, -(int)(hq_test_rand(&s) % 12)); /* small values too */
    double sum = 0;
    for (unsigned r = 0; r < 256; r++) {
      unsigned c = hq_f32_to_e2m1_sr(x, r);
      assert_int_equal(c, sr_ref(x, r));
      sum += e2m1_ref(c);
    }
    double a = fabs((double)x) > 6 ? (x > 0 ? 6.0 : -6.0) : (double)x;
    double err = fabs(sum / 256 - a);
    assert_true(err <= 2 * step_of(fabs(a)) / 256);
  }
}

/* ---- scales ------------------------------------------------------------------------------- */

/* RN to FP32 of a double, Inf past the rounding threshold (no UB cast). */
static float rf(double v) {
  if (fabs(v) >= (double)FLT_MAX + ldexp(1.0, 103)) return v > 0 ? INFINITY : -INFINITY;
  if (fabs(v) > (double)FLT_MAX) return v > 0 ? FLT_MAX : -FLT_MAX;
  return (float)v;
}

/* FORMATS.md 3.3 steps 1-4 in double (each FP32 operation as an exact double op rounded once) */
typedef struct ref_chain {
  float s_enc, s_dec, m;
} ref_chain;

static ref_chain ref_global(float A) {
  ref_chain r;
  if (A == 0.0f) r.s_enc = 1.0f;
  else {
    double q = 2688.0 / (double)A;
    r.s_enc = q >= (double)FLT_MAX ? FLT_MAX : (float)q;
    if (r.s_enc == 0.0f) r.s_enc = 1.0f;
  }
  r.s_dec = (float)(1.0 / (double)r.s_enc);
  r.m = (float)((double)r.s_enc * (double)(float)(1.0 / 6.0));
  return r;
}

static unsigned ref_sf(float block_amax, const ref_chain *r) {
  float p = rf((double)block_amax * r->m);
  if (p > FLT_MAX) p = FLT_MAX;
  return ref_fp8_encode(p, 0);
}

static float ref_enc(unsigned sf, const ref_chain *r) {
  float d = (float)(ref_fp8_decode(sf, 0) * (double)r->s_dec);
  if (d == 0.0f) return FLT_MAX;
  double e = 1.0 / (double)d;
  return e >= (double)FLT_MAX ? FLT_MAX : (float)e;
}

static void test_global_scale_hand(void **state) {
  (void)state;
  assert_true(hq_nvfp4_global_encode_scale(2688.0f) == 1.0f); /* 448 * 6 / 2688 */
  assert_true(hq_nvfp4_global_encode_scale(1.0f) == 2688.0f);
  assert_true(hq_nvfp4_global_encode_scale(3.0f) == 896.0f);
  assert_true(hq_nvfp4_global_encode_scale(0.0f) == 1.0f);      /* A == 0 */
  assert_true(hq_nvfp4_global_encode_scale(INFINITY) == 1.0f);  /* S_enc == 0 */
  assert_true(hq_nvfp4_global_encode_scale(1e-45f) == FLT_MAX); /* Inf quotient clamped */
  assert_true(hq_nvfp4_global_encode_scale(1e-36f) == FLT_MAX); /* finite but > FLT_MAX */
  assert_true(hq_nvfp4_global_encode_scale(NAN) == FLT_MAX);    /* fminf(NaN, FLT_MAX) */
  /* A = 10: 268.8 is not representable; RN gives 0x43866666 = 268.79998779296875 */
  assert_int_equal(f_bits(hq_nvfp4_global_encode_scale(10.0f)), 0x43866666u);
  assert_int_equal(f_bits(hq_nvfp4_global_decode_scale(268.79998779296875f)), 0x3b73cf3eu);
  assert_true(hq_nvfp4_global_decode_scale(1.0f) == 1.0f);
  /* RN(1/6) = 0x3E2AAAAB; m = RN(S_enc * RN(1/6)) */
  assert_int_equal(f_bits(hq_nvfp4_block_scale_mult(1.0f)), 0x3e2aaaabu);
  assert_int_equal(f_bits(hq_nvfp4_block_scale_mult(268.79998779296875f)), 0x42333333u);
  assert_true(hq_nvfp4_block_scale_mult(2688.0f) == 448.0f);
  /* random amaxes against the double statement */
  uint64_t s = 99;
  for (int i = 0; i < 100000; i++) {
    float A = ldexpf(fabsf(hq_test_uniform(&s)), (int)(hq_test_rand(&s) % 200) - 100);
    ref_chain r = ref_global(A);
    assert_true(hq_nvfp4_global_encode_scale(A) == r.s_enc);
    assert_true(hq_nvfp4_global_decode_scale(r.s_enc) == r.s_dec);
    assert_true(hq_nvfp4_block_scale_mult(r.s_enc) == r.m);
  }
}

/* FORMATS.md 3.3 step by step, by hand. */
static void test_block_scale_hand(void **state) {
  (void)state;
  /* A = 2688: S_enc = 1, S_dec = 1, m = RN(1/6). A block of amax 6: 6 * 0.16666667 =
     1.0000000298 -> RN 1.0 -> sf = E4M3(1.0) = 0x38; enc = 1 / (1 * 1) = 1. */
  float m = hq_nvfp4_block_scale_mult(hq_nvfp4_global_encode_scale(2688.0f));
  assert_int_equal(hq_nvfp4_block_scale(6.0f, m), 0x38);
  assert_true(hq_nvfp4_encode_mult(0x38, 1.0f) == 1.0f);
  /* amax 3 -> 0.5 = 0x30; amax 2688 -> 448 = 0x7E; beyond and Inf saturate to 0x7E */
  assert_int_equal(hq_nvfp4_block_scale(3.0f, m), 0x30);
  assert_int_equal(hq_nvfp4_block_scale(2688.0f, m), 0x7e);
  assert_int_equal(hq_nvfp4_block_scale(1e9f, m), 0x7e);
  assert_int_equal(hq_nvfp4_block_scale(INFINITY, m), 0x7e);
  assert_int_equal(hq_nvfp4_block_scale(0.0f, m), 0x00);
  /* enc of 448 with S_dec 1: RN(1/448) */
  assert_true(hq_nvfp4_encode_mult(0x7e, 1.0f) == 1.0f / 448.0f);
  /* A = 10, a block of amax 2.5: m = 44.8 (0x42333333), 2.5 * m = 112 exactly = E4M3 0x6E
     (1.75 * 2^6); RN(112 * S_dec) = 0.41666669 (0x3ED55556); enc = RN(1/that) = 2.3999999
     (0x40199999). */
  float se = hq_nvfp4_global_encode_scale(10.0f), sd = hq_nvfp4_global_decode_scale(se);
  m = hq_nvfp4_block_scale_mult(se);
  assert_int_equal(hq_nvfp4_block_scale(2.5f, m), 0x6e);
  assert_int_equal(f_bits(hq_nvfp4_encode_mult(0x6e, sd)), 0x40199999u);
  /* q = E2M1(RN(x * 2.3999999)): 2.5 -> 5.9999995 -> 6 (7); -1 -> -2.4 -> -2 (12);
     0.3 -> 0.72 -> 0.5 (1); 1.25 -> 2.9999998 -> 3 (5); 0.1 -> 0.24 -> 0 (0);
     1.5 -> 3.6 -> 4 (6); -0.21 -> -0.504 -> -0.5 (9); 0.625 -> 1.4999999 -> 1.5 (3) */
  float enc = hq_nvfp4_encode_mult(0x6e, sd);
  static const float x[8] = {2.5f, -1.0f, 0.3f, 1.25f, 0.1f, 1.5f, -0.21f, 0.625f};
  static const unsigned q[8] = {7, 12, 1, 5, 0, 6, 9, 3};
  for (int i = 0; i < 8; i++) assert_int_equal(hq_nvfp4_quantize(x[i], enc), q[i]);
  /* dequantize: RN(RN(112 * 10) * RN(1/2688)) = 0.41666669 (0x3ED55556); code 7 -> 2.5 */
  float dm = hq_nvfp4_decode_mult(0x6e, 10.0f);
  assert_int_equal(f_bits(dm), 0x3ed55556u);
  assert_true(hq_nvfp4_dequantize(7, dm) == 2.5f);
  assert_true(hq_nvfp4_dequantize(12, dm) == -0.8333333730697632f);
  assert_int_equal(f_bits((float)(1.0 / 2688.0)), 0x39c30c31u);
}

/* A zero block: sf = 0, enc = FLT_MAX; zeros stay zero; a tiny block's codes may saturate but
   dequantize to 0 because sf = 0. */
static void test_zero_and_tiny_block(void **state) {
  (void)state;
  float m = hq_nvfp4_block_scale_mult(hq_nvfp4_global_encode_scale(0.0f));
  assert_true(m == (float)(1.0 / 6.0));
  assert_int_equal(hq_nvfp4_block_scale(0.0f, m), 0);
  assert_true(hq_nvfp4_encode_mult(0, 1.0f) == FLT_MAX);
  assert_int_equal(hq_nvfp4_quantize(0.0f, FLT_MAX), 0);
  assert_int_equal(hq_nvfp4_quantize(-0.0f, FLT_MAX), 8);
  /* A = 1000, block amax 1e-4: 1e-4 * 0.448 < 2^-10 -> sf 0; x = 1e-4 * FLT_MAX = Inf -> 6 */
  float se = hq_nvfp4_global_encode_scale(1000.0f);
  m = hq_nvfp4_block_scale_mult(se);
  assert_int_equal(hq_nvfp4_block_scale(1e-4f, m), 0);
  assert_int_equal(hq_nvfp4_quantize(1e-4f, hq_nvfp4_encode_mult(0, 0.372f)), 7);
  assert_true(hq_nvfp4_dequantize(7, hq_nvfp4_decode_mult(0, 1000.0f)) == 0.0f);
  /* a product that underflows to 0 also gives FLT_MAX: sf 2^-9 times S_dec 2^-140 */
  assert_true(hq_nvfp4_encode_mult(0x01, ldexpf(1.0f, -140)) == FLT_MAX);
}

static void test_block_scale_random_vs_double(void **state) {
  (void)state;
  uint64_t s = 1234;
  for (int i = 0; i < 20000; i++) {
    float A = ldexpf(fabsf(hq_test_uniform(&s)) + 0.01f, (int)(hq_test_rand(&s) % 60) - 30);
    ref_chain r = ref_global(A);
    for (int j = 0; j < 8; j++) {
      float ab = A * fabsf(hq_test_uniform(&s));
      if (j == 0) ab = A;
      unsigned sf = hq_nvfp4_block_scale(ab, r.m);
      assert_int_equal(sf, ref_sf(ab, &r));
      assert_true(hq_nvfp4_encode_mult((uint8_t)sf, r.s_dec) == ref_enc(sf, &r));
      float dm = hq_nvfp4_decode_mult((uint8_t)sf, A);
      float dref = (float)((double)(float)(ref_fp8_decode(sf, 0) * (double)A) *
                           (double)(float)(1.0 / 2688.0));
      assert_true(dm == dref);
      float x = ab * hq_test_uniform(&s);
      assert_int_equal(hq_nvfp4_quantize(x, ref_enc(sf, &r)),
                       e2m1_ref_encode(rf((double)x * ref_enc(sf, &r))));
    }
  }
}

/* --- UE5M3 (scale_dtype = ue5m3) ---------------------------------------------------------- */

/* UE5M3 from its fields, by hand: 5 exponent bits (bias 15), 3 mantissa bits, no sign; e = 0
   is subnormal m * 2^-17; 0xFF is the one NaN (no Inf: 0xF8..0xFE are finite). */
static double ue5m3_ref(unsigned c) {
  unsigned e = c >> 3, m = c & 7u;
  return e ? ldexp(1.0 + m / 8.0, (int)e - 15) : ldexp((double)m, -17);
}

/* Nearest code by search over the 255 finite codes, ties to the even code, saturating at the
   max; NaN -> 0xFF; x <= 0 -> 0. */
static unsigned ue5m3_ref_encode(double x) {
  if (isnan(x)) return 0xffu;
  if (!(x > 0.0)) return 0u;
  if (x > 114688.0) return 0xfeu;
  unsigned best = 0;
  double bd = INFINITY;
  for (unsigned c = 0; c < 255; c++) {
    double d = fabs(ue5m3_ref(c) - x);
    if (d < bd || (d == bd && (c & 1u) == 0)) {
      bd = d;
      best = c;
    }
  }
  return best;
}

static void test_ue5m3_decode_every_code(void **state) {
  (void)state;
  for (unsigned c = 0; c < 255; c++) assert_true((double)hq_ue5m3_to_f32((uint8_t)c) == ue5m3_ref(c));
  assert_true(isnan(hq_ue5m3_to_f32(0xff)));
  /* landmarks: max, the top binade finite, 1.0, the smallest normal and subnormal */
  assert_true(hq_ue5m3_to_f32(0xfe) == 114688.0f && HQ_UE5M3_MAX == 114688.0f);
  assert_true(hq_ue5m3_to_f32(0xf8) == 65536.0f);
  assert_true(hq_ue5m3_to_f32(0x78) == 1.0f && HQ_NVFP4_UE5M3_ONE == 0x78);
  assert_true(hq_ue5m3_to_f32(0x08) == ldexpf(1.0f, -14));
  assert_true(hq_ue5m3_to_f32(0x01) == ldexpf(1.0f, -17));
  assert_true(hq_ue5m3_to_f32(0x00) == 0.0f && !signbit(hq_ue5m3_to_f32(0x00)));
}

/* Every code, every midpoint between neighbours (ties to the even code) and the values either
   side of it, the specials, and random inputs against the nearest-code search. */
static void test_ue5m3_encode_exhaustive(void **state) {
  (void)state;
  for (unsigned c = 0; c < 255; c++) assert_int_equal(hq_f32_to_ue5m3((float)ue5m3_ref(c)), c);
  for (unsigned c = 0; c < 254; c++) {
    const float mid = (float)((ue5m3_ref(c) + ue5m3_ref(c + 1)) / 2.0); /* 5 bits: exact */
    assert_true((double)mid == (ue5m3_ref(c) + ue5m3_ref(c + 1)) / 2.0);
    assert_int_equal(hq_f32_to_ue5m3(mid), (c & 1u) ? c + 1 : c);
    assert_int_equal(hq_f32_to_ue5m3(nextafterf(mid, 0.0f)), c);
    assert_int_equal(hq_f32_to_ue5m3(nextafterf(mid, INFINITY)), c + 1);
  }
  assert_int_equal(hq_f32_to_ue5m3(118784.0f), 0xfe);     /* halfway to 2^17: saturates */
  assert_int_equal(hq_f32_to_ue5m3(1e30f), 0xfe);
  assert_int_equal(hq_f32_to_ue5m3(FLT_MAX), 0xfe);
  assert_int_equal(hq_f32_to_ue5m3(INFINITY), 0xfe);
  assert_int_equal(hq_f32_to_ue5m3(NAN), 0xff);
  assert_int_equal(hq_f32_to_ue5m3(-NAN), 0xff);
  assert_int_equal(hq_f32_to_ue5m3(-0.0f), 0x00);
  assert_int_equal(hq_f32_to_ue5m3(-3.0f), 0x00);
  assert_int_equal(hq_f32_to_ue5m3(-INFINITY), 0x00);
  assert_int_equal(hq_f32_to_ue5m3(ldexpf(1.0f, -18)), 0x00);  /* tie 0 / 2^-17: even */
  assert_int_equal(hq_f32_to_ue5m3(ldexpf(1.0f, -140)), 0x00); /* FP32 subnormal */
  uint64_t s = 77;
  for (int i = 0; i < 200000; i++) {
    float x = ldexpf(fabsf(hq_test_uniform(&s)), (int)(hq_test_rand(&s) % 44) - 24);
    assert_int_equal(hq_f32_to_ue5m3(x), ue5m3_ref_encode((double)x));
  }
}

/* The rule chain with UE5M3 scales (TE's prototype: 448 -> 114688, so 2688 -> 688128), by
   hand, and with no global scale. */
static void test_ue5m3_rules_hand(void **state) {
  (void)state;
  const int U = HQ_NVFP4_SCALE_UE5M3;
  assert_true(hq_nvfp4_global_range(U) == 688128.0f);
  assert_int_equal(f_bits(hq_nvfp4_global_range_rcp(U)), 0x35c30c31u); /* RN(1/688128) */
  assert_true(hq_nvfp4_global_encode_scale_k(688128.0f, U) == 1.0f);
  assert_true(hq_nvfp4_global_encode_scale_k(0.0f, U) == 1.0f);
  assert_true(hq_nvfp4_global_encode_scale_k(INFINITY, U) == 1.0f);
  assert_true(hq_nvfp4_tensor_factor_k(688128.0f, U) == 1.0f);
  /* the E4M3 instances are the _k functions of E4M3 */
  assert_true(hq_nvfp4_global_encode_scale_k(10.0f, HQ_NVFP4_SCALE_E4M3) ==
              hq_nvfp4_global_encode_scale(10.0f));
  /* TE's test values: A = 12 gives S_enc = 688128 / 12 = 57344; m = RN(57344 * RN(1/6)) =
     9557.334 (0x46155556); block amaxes 3 and 6 give 28672.002 and 57344.004, which UE5M3
     rounds to 28672 = 1.75 * 2^14 (0xEE) and 57344 = 1.75 * 2^15 (0xF6), TE's expected
     3 * 114688 / 12 and 6 * 114688 / 12. */
  float se = hq_nvfp4_global_encode_scale_k(12.0f, U), sd = hq_nvfp4_global_decode_scale(se);
  assert_true(se == 57344.0f);
  float m = hq_nvfp4_block_scale_mult(se);
  assert_int_equal(f_bits(m), 0x46155556u);
  assert_int_equal(hq_nvfp4_block_scale_k(3.0f, m, U), 0xee);
  assert_int_equal(hq_nvfp4_block_scale_k(6.0f, m, U), 0xf6);
  assert_true(hq_ue5m3_to_f32(0xee) == 28672.0f && hq_ue5m3_to_f32(0xf6) == 57344.0f);
  /* enc = RN(1 / RN(28672 * RN(1/57344))) = 1 / 0.5 = 2; x = 3 -> E2M1(6) = code 7; x = -1.3
     -> -2.6 -> -3 (code 13) */
  float enc = hq_nvfp4_encode_mult_k(0xee, sd, U);
  assert_true(enc == 2.0f);
  assert_int_equal(hq_nvfp4_quantize(3.0f, enc), 7);
  assert_int_equal(hq_nvfp4_quantize(-1.3f, enc), 13);
  /* decode: RN(RN(28672 * 12) * RN(1/688128)) = 0.5; code 7 -> 3 */
  float dm = hq_nvfp4_decode_mult_k(0xee, 12.0f, U);
  assert_true(dm == 0.5f);
  assert_true(hq_nvfp4_dequantize(7, dm) == 3.0f);
  /* the largest block amax 6 * 114688 = 688128 at S_enc = 1 takes the max code */
  assert_int_equal(hq_nvfp4_block_scale_k(688128.0f, hq_nvfp4_block_scale_mult(1.0f), U), 0xfe);
  assert_int_equal(hq_nvfp4_block_scale_k(INFINITY, hq_nvfp4_block_scale_mult(1.0f), U), 0xfe);
  /* global_scale = none: S_enc = 1, m = RN(1/6). amax 6 -> RN(1.0000000298) = 1 -> 0x78,
     enc 1; amax 1e-4 -> 1.6667e-5 = 2.18 * 2^-17 -> 0x02 (2^-16); amax 1e-5 -> 0.22 * 2^-17
     -> 0 (enc FLT_MAX, dequantizes to 0); raw = dequantized = e2m1 * fp32(sf) */
  m = hq_nvfp4_block_scale_mult(1.0f);
  assert_int_equal(hq_nvfp4_block_scale_k(6.0f, m, U), 0x78);
  assert_true(hq_nvfp4_encode_mult_k(0x78, 1.0f, U) == 1.0f);
  assert_int_equal(hq_nvfp4_block_scale_k(1e-4f, m, U), 0x02);
  assert_int_equal(hq_nvfp4_block_scale_k(1e-5f, m, U), 0x00);
  assert_true(hq_nvfp4_encode_mult_k(0x00, 1.0f, U) == FLT_MAX);
  assert_true(hq_nvfp4_raw_mult_k(0x02, U) == ldexpf(1.0f, -16));
  assert_true(hq_nvfp4_dequantize(7, hq_nvfp4_raw_mult_k(0xfe, U)) == 688128.0f);
}

/* Every UE5M3 raw value e2m1 * fp32(sf) is exact in BF16 (desc.emul_dtype stays BF16). */
/* hq_nvfp4_encode_mult_tab (the per-row table of global_scale = row's one-read kernel) equals
   the rule hq_nvfp4_encode_mult_k for every one of the 256 codes of both scale types, over
   S_dec of every binade of [2^-100, 2^100] (256 mantissas each: an even spread and random
   ones, plus both ends of each binade) and the range's edges; outside the range
   hq_nvfp4_encode_table_ok says no. Independent of the table's derivation: the rule is
   evaluated as written. */
static void test_encode_table_vs_rule(void **state) {
  (void)state;
  uint64_t rng = 0x243f6a8885a308d3ull;
  assert_true(hq_nvfp4_encode_table_ok(0x1p-100f) && hq_nvfp4_encode_table_ok(0x1p100f));
  assert_false(hq_nvfp4_encode_table_ok(nextafterf(0x1p-100f, 0.0f)));
  assert_false(hq_nvfp4_encode_table_ok(nextafterf(0x1p100f, INFINITY)));
  assert_false(hq_nvfp4_encode_table_ok(NAN));
  long n = 0;
  for (int e = -100; e <= 100; e++)
    for (int j = 0; j < (e == 100 ? 1 : 256); j++) {
      uint32_t mant;
      if (j == 0) mant = 0;
      else if (j == 1) mant = 0x7fffffu;
      else if (j < 128) mant = (uint32_t)j * (0x800000u / 128u);
      else {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        mant = (uint32_t)(rng >> 41);
      }
      const float s_dec = bits_f(((uint32_t)(e + 127) << 23) | mant);
      assert_true(hq_nvfp4_encode_table_ok(s_dec));
      float tab[8];
      for (int g = 0; g < 8; g++) tab[g] = hq_nvfp4_encode_table(g, s_dec);
      for (int kind = 0; kind < 2; kind++)
        for (int c = 0; c < 256; c++) {
          const float want = hq_nvfp4_encode_mult_k((uint8_t)c, s_dec, kind);
          const float got = hq_nvfp4_encode_mult_tab((uint8_t)c, tab, s_dec, kind);
          if (f_bits(want) != f_bits(got) && !(isnan(want) && isnan(got)))
            fail_msg("kind %d code 0x%02x S_dec %a: rule %a, table %a", kind, c, s_dec, want,
                     got);
          n++;
        }
    }
  assert_true(n > 25000000L);
}

static void test_ue5m3_raw_bf16_exact(void **state) {
  (void)state;
  for (unsigned c = 0; c < 255; c++)
    for (unsigned q = 0; q < 16; q++) {
      float v = hq_nvfp4_dequantize(q, hq_nvfp4_raw_mult_k((uint8_t)c, HQ_NVFP4_SCALE_UE5M3));
      assert_true((double)v == e2m1_ref(q) * ue5m3_ref(c));
      assert_true(hq_bf16_to_f32(hq_f32_to_bf16(v)) == v);
    }
}

static void test_amax_nan_inf(void **state) {
  (void)state;
  float v[5] = {1.0f, -3.0f, NAN, 2.0f, -NAN};
  assert_true(hq_nvfp4_amax(v, 5) == 3.0f);
  v[1] = -INFINITY;
  assert_true(isinf(hq_nvfp4_amax(v, 5)));
  float w[2] = {NAN, NAN};
  assert_true(hq_nvfp4_amax(w, 2) == 0.0f);
  assert_true(hq_nvfp4_amax(w, 0) == 0.0f);
}

/* ---- Philox4x32-10 ------------------------------------------------------------------------ */

/* Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter[4] key[2] -> out[4]). */
static void test_philox_known_answers(void **state) {
  (void)state;
  static const uint32_t kat[3][10] = {
      {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x6627e8d5,
       0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t out[4];
    hq_philox4x32_10(kat[t], kat[t] + 4, out);
    for (int w = 0; w < 4; w++) assert_int_equal(out[w], kat[t][6 + w]);
  }
}

/* The round keys the CUDA kernels take as parameters: round r's key is (k0 + r * 0x9E3779B9,
   k1 + r * 0xBB67AE85) mod 2^32 (Random123's Weyl constants), and drawing from them gives the
   known answers; hq_nvfp4_sr_keys keys on the seed's low and high words. */
static void test_philox_round_keys(void **state) {
  (void)state;
  static const uint32_t key[2] = {0xa4093822u, 0x299f31d0u};
  static const uint32_t ctr[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  static const uint32_t want[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  uint32_t rk[20], out[4];
  hq_philox_round_keys(key, rk);
  for (uint64_t r = 0; r < 10; r++) {
    assert_int_equal(rk[2 * r], (uint32_t)((key[0] + r * 0x9E3779B9ull) & 0xffffffffull));
    assert_int_equal(rk[2 * r + 1], (uint32_t)((key[1] + r * 0xBB67AE85ull) & 0xffffffffull));
  }
  assert_int_equal(rk[18], 0x33fc7fa3u); /* 0xa4093822 + 0x8ff34781 (9 * 0x9E3779B9) mod 2^32 */
  hq_philox4x32_10_rk(ctr, rk, out);
  assert_memory_equal(out, want, sizeof out);
  uint32_t sk[20], a[4], b[4];
  hq_nvfp4_sr_keys(0x299f31d0a4093822ull, sk);
  assert_memory_equal(sk, rk, sizeof sk);
  hq_nvfp4_sr_bits_rk(sk, 7, 1, 0x80000000bull, a);
  hq_nvfp4_sr_bits(0x299f31d0a4093822ull, 7, 1, 0x80000000bull, b);
  assert_memory_equal(a, b, sizeof a);
}

/* The documented SR mapping: key = seed, counter = {block, block_hi | colwise << 31, offset}. */
static void test_sr_bits_mapping(void **state) {
  (void)state;
  uint64_t seed = 0x0123456789abcdefull, off = 0xfedcba9876543210ull, blk = 0x123456789ull;
  for (uint32_t col = 0; col < 2; col++) {
    uint32_t a[4], b[4];
    const uint32_t key[2] = {0x89abcdefu, 0x01234567u};
    const uint32_t ctr[4] = {0x23456789u, 0x1u | (col << 31), 0x76543210u, 0xfedcba98u};
    hq_philox4x32_10(ctr, key, a);
    hq_nvfp4_sr_bits(seed, off, col, blk, b);
    assert_memory_equal(a, b, sizeof a);
    for (int e = 0; e < 16; e++) /* byte e % 4 of word e / 4, the low byte first */
      assert_int_equal(hq_nvfp4_sr_byte(a, e), (a[e / 4] >> (8 * (e % 4))) & 0xffu);
  }
  uint32_t r0[4], r1[4], c0[4];
  hq_nvfp4_sr_bits(1, 0, 0, 0, r0);
  hq_nvfp4_sr_bits(1, 0, 1, 0, c0);
  hq_nvfp4_sr_bits(1, 1, 0, 0, r1);
  assert_memory_not_equal(r0, c0, sizeof r0);
  assert_memory_not_equal(r0, r1, sizeof r0);
  assert_int_equal(hq_nvfp4_sr_byte(r0, 5), (r0[1] >> 8) & 0xffu);
}

/* ---- RHT ---------------------------------------------------------------------------------- */

static int hsign(int r, int c) { return __builtin_popcount((unsigned)(r & c)) & 1 ? -1 : 1; }

/* RNE of a double to BF16 precision (8 significant bits), for normal magnitudes and zero. */
static double bf16_ref(double v) {
  if (v == 0.0) return v;
  int e;
  double f = frexp(v, &e); /* v = f * 2^e, 0.5 <= |f| < 1 */
  return ldexp(nearbyint(ldexp(f, 8)), e - 8);
}

/* y = g diag(s) H16 / 4, in double */
static void rht_dense(const double g[16], uint32_t mask, double y[16]) {
  for (int c = 0; c < 16; c++) {
    double acc = 0;
    for (int r = 0; r < 16; r++) acc += g[r] * (((mask >> r) & 1u) ? -1 : 1) * hsign(r, c);
    y[c] = acc / 4;
  }
}

static void test_rht_te_signs(void **state) {
  (void)state;
  /* TE's get_wgrad_sign_vector: bit i set when s_i = -1 */
  static const int s[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  uint32_t mask = 0;
  for (int i = 0; i < 16; i++)
    if (s[i] < 0) mask |= 1u << i;
  assert_int_equal(mask, HQ_NVFP4_RHT_SIGNS);
  assert_int_equal(mask, 55272);
}

/* Inputs on a 1/16 grid in [-4, 4]: every FP32 partial sum is exact, so hq's fixed order must
   give exactly bf16(dense product). Random BF16 inputs: within one BF16 step. */
static void test_rht_matches_dense_matrix(void **state) {
  (void)state;
  uint64_t s = 5;
  uint32_t masks[3] = {HQ_NVFP4_RHT_SIGNS, 0, 0xffff};
  for (int m = 0; m < 3; m++) {
    for (int it = 0; it < 2000; it++) {
      float v[16];
      double g[16], y[16];
      for (int i = 0; i < 16; i++) {
        g[i] = (double)((int)(hq_test_rand(&s) % 129) - 64) / 16.0;
        v[i] = (float)g[i];
      }
      rht_dense(g, masks[m], y);
      hq_nvfp4_rht16(v, masks[m]);
      for (int i = 0; i < 16; i++) assert_true((double)v[i] == bf16_ref(y[i]));
    }
  }
  int exact = 0, n = 0;
  for (int it = 0; it < 5000; it++) {
    float v[16];
    double g[16], y[16];
    for (int i = 0; i < 16; i++) {
      g[i] = bf16_ref(hq_test_normal(&s));
      v[i] = (float)g[i];
    }
    rht_dense(g, HQ_NVFP4_RHT_SIGNS, y);
    hq_nvfp4_rht16(v, HQ_NVFP4_RHT_SIGNS);
    double l1 = 0;
    for (int i = 0; i < 16; i++) l1 += fabs(g[i]);
    for (int i = 0; i < 16; i++, n++) {
      if ((double)v[i] == bf16_ref(y[i])) exact++;
      /* BF16 rounding (2^-8 relative) plus FP32 accumulation under cancellation */
      assert_true(fabs((double)v[i] - y[i]) <= ldexp(fabs(y[i]), -8) + ldexp(l1, -21));
    }
  }
  assert_true(exact >= n * 99 / 100);
  /* non-BF16 input is rounded to BF16 first: 1 + 2^-10 acts as 1 */
  float a[16] = {0}, b[16] = {0};
  a[0] = 1.0f + ldexpf(1.0f, -10);
  b[0] = 1.0f;
  hq_nvfp4_rht16(a, HQ_NVFP4_RHT_SIGNS);
  hq_nvfp4_rht16(b, HQ_NVFP4_RHT_SIGNS);
  assert_memory_equal(a, b, sizeof a);
  /* a unit vector e_0 becomes s_0 * H[0][c] / 4 = 0.25 everywhere */
  for (int i = 0; i < 16; i++) assert_true(b[i] == 0.25f);
}

/* The 16-lane form gives the bits of the single-group form (a NaN only as a NaN: its sign and
   payload are not defined); the branch-free BF16 rounding is the core's BF16 round trip. */
static int same_or_both_nan(float a, float b) {
  return (isnan(a) && isnan(b)) || f_bits(a) == f_bits(b);
}

static void test_rht_lanes_and_bf16_round(void **state) {
  (void)state;
  uint64_t s = 23;
  for (int it = 0; it < 500; it++) {
    float v[256], g[16];
    for (int k = 0; k < 256; k++) {
      uint64_t r = hq_test_rand(&s);
      v[k] = (r % 97 == 0)   ? NAN
             : (r % 89 == 0) ? INFINITY
                             : hq_test_normal(&s) * ldexpf(1, (int)(r % 40) - 20);
    }
    float w[256];
    memcpy(w, v, sizeof w);
    uint32_t mask = (uint32_t)hq_test_rand(&s) & 0xffffu;
    hq_nvfp4_rht16x16(w, mask);
    for (int l = 0; l < 16; l++) {
      for (int i = 0; i < 16; i++) g[i] = v[16 * i + l];
      hq_nvfp4_rht16(g, mask);
      for (int i = 0; i < 16; i++) assert_true(same_or_both_nan(g[i], w[16 * i + l]));
    }
  }
  static const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                     0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0x3f808000u,
                                     0x3f818000u, 0x00000001u, 0x807fffffu, 0x3f807fffu};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
    float x = bits_f(special[i]);
    assert_int_equal(f_bits(hq_nvfp4_bf16_round(x)), f_bits(hq_bf16_to_f32(hq_f32_to_bf16(x))));
  }
  for (int i = 0; i < 2000000; i++) {
    float x = bits_f((uint32_t)hq_test_rand(&s));
    assert_int_equal(f_bits(hq_nvfp4_bf16_round(x)), f_bits(hq_bf16_to_f32(hq_f32_to_bf16(x))));
  }
}

/* The CUDA quantize kernel's shortcut for columnwise RHT blocks (nvfp4.cu: rht16_tail<false>,
   block_heads2<true>): the transform without its RN(v * 0.25), the 0.25 folded into the block's
   multipliers, stands for the rule on every block the kernel lets it take -- unscaled amax a' = 0
   or in [2^-100, 2^120), and RN(a' * RN(enc * 0.25)) < 7 -- giving the rule's scale code and
   every element code. Checked against hq_nvfp4_rht16, hq_nvfp4_block_scale and
   hq_nvfp4_quantize on random groups (one exponent per group, or one per element), on groups
   built to cancel (two equal values beside one much smaller: half the outputs are that small
   one alone, of FP32-subnormal size after the 0.25 when it is tiny), with random sign masks
   and global amaxes from the block's own to 2^40 times it. */
static void test_rht_fold_identity(void **state) {
  (void)state;
  uint64_t s = 91;
  long taken = 0, tiny = 0;
  for (int it = 0; it < 400000; it++) {
    float g[16];
    const uint64_t r = hq_test_rand(&s);
    const int kind = (int)(r % 3);
    if (kind == 0) {
      const int e = (int)((r >> 8) % 250) - 130;
      for (int i = 0; i < 16; i++) g[i] = ldexpf(hq_test_normal(&s), e);
    } else if (kind == 1) {
      for (int i = 0; i < 16; i++)
        g[i] = ldexpf(hq_test_normal(&s), (int)(hq_test_rand(&s) % 200) - 110);
    } else {
      const int e = (int)((r >> 8) % 236) - 110, d = 8 + (int)((r >> 20) % 60);
      const float a = ldexpf(1.0f + (float)((r >> 32) % 128) / 128.0f, e);
      for (int i = 0; i < 16; i++) g[i] = 0.0f;
      g[0] = g[1] = a;
      g[2 + (int)((r >> 40) % 14)] = ldexpf(hq_test_uniform(&s), e - d);
    }
    const uint32_t mask = (uint32_t)hq_test_rand(&s) & 0xffffu;
    /* the rule */
    float v[16];
    memcpy(v, g, sizeof v);
    hq_nvfp4_rht16(v, mask);
    const float ba = hq_nvfp4_amax(v, 16);
    const float A = ba > 0.0f ? ldexpf(ba, (int)(hq_test_rand(&s) % 41)) : 1.0f;
    const float s_enc = hq_nvfp4_global_encode_scale(A);
    const float s_dec = hq_nvfp4_global_decode_scale(s_enc), m = hq_nvfp4_block_scale_mult(s_enc);
    const uint8_t sf = hq_nvfp4_block_scale(ba, m);
    const float enc = hq_nvfp4_encode_mult(sf, s_dec);
    /* the shortcut: steps 0-2 of the rule, then RN_bf16 without the 0.25 */
    float u[16];
    for (int i = 0; i < 16; i++)
      u[i] = bits_f(f_bits(hq_nvfp4_bf16_round(g[i])) ^ (((mask >> i) & 1u) << 31));
    for (int h = 1; h < 16; h <<= 1)
      for (int i = 0; i < 16; i++)
        if (!(i & h)) {
          const float x = u[i], y = u[i + h];
          u[i] = hq_add_rn(x, y);
          u[i + h] = hq_add_rn(x, -y);
        }
    for (int i = 0; i < 16; i++) u[i] = hq_nvfp4_bf16_round(u[i]);
    const float a2 = hq_nvfp4_amax(u, 16);
    const uint32_t b = f_bits(a2);
    if (!(b == 0 || (b >= 0x0d800000u && b < 0x7b800000u))) continue; /* redone by the rule */
    const uint8_t sf2 = hq_nvfp4_block_scale(a2, hq_mul_rn(m, 0.25f));
    const float enc4 = hq_mul_rn(hq_nvfp4_encode_mult(sf2, s_dec), 0.25f);
    if (!(hq_mul_rn(a2, enc4) < 7.0f)) continue; /* not the fast form: redone by the rule */
    taken++;
    if (sf2 != sf) fail_msg("it %d: scale code %#x, the rule's %#x", it, sf2, sf);
    int small = 0;
    for (int e = 0; e < 16; e++) {
      const uint32_t c = hq_f32_to_e2m1(hq_mul_rn(u[e], enc4));
      const uint32_t want = hq_nvfp4_quantize(v[e], enc);
      if (c != want)
        fail_msg("it %d element %d: code %#x, the rule's %#x (u %a, v %a, enc %a)", it, e, c, want,
                 (double)u[e], (double)v[e], (double)enc);
      small |= u[e] != 0.0f && fabsf(u[e]) < 0x1p-124f;
    }
    tiny += small;
  }
  /* the shortcut was taken, also by blocks holding outputs of FP32-subnormal size */
  assert_int_equal(taken, 172296); /* of the 400000 seeded groups (the others' scales underflow) */
  assert_int_equal(tiny, 1860);
}

/* Orthogonality: the transpose undoes the transform within BF16 rounding. */
/* The inverse transform: (a) on inputs in {-1, 0, 1} every step of both transforms is exact, so
   inverse(forward(v)) == v bit for bit; (b) on random inputs it equals the dense product with
   the transpose H16 diag(s) / 4, computed in double here, within FP32 rounding. */
static void test_rht_inverse(void **state) {
  (void)state;
  uint64_t st = 77;
  const uint32_t masks[3] = {HQ_NVFP4_RHT_SIGNS, 0x0000, 0xffff};
  for (int m = 0; m < 3; m++) {
    for (int it = 0; it < 2000; it++) {
      float v[16], w[16];
      for (int i = 0; i < 16; i++) v[i] = w[i] = (float)((int)(hq_test_rand(&st) % 3) - 1);
      hq_nvfp4_rht16(w, masks[m]);
      hq_nvfp4_rht16_inverse(w, masks[m]);
      for (int i = 0; i < 16; i++)
        if (w[i] != v[i]) fail_msg("mask %04x: element %d %g != %g", masks[m], i, w[i], v[i]);
    }
    for (int it = 0; it < 2000; it++) {
      float v[16];
      double want[16];
      for (int i = 0; i < 16; i++) v[i] = hq_test_normal(&st);
      for (int c = 0; c < 16; c++) { /* (v H diag(s) / 4)[c] = s_c/4 * sum_r v_r H[r][c] */
        double acc = 0;
        for (int r = 0; r < 16; r++)
          acc += (__builtin_popcount((unsigned)(r & c)) & 1 ? -1 : 1) * (double)v[r];
        want[c] = ((masks[m] >> c) & 1 ? -0.25 : 0.25) * acc;
      }
      hq_nvfp4_rht16_inverse(v, masks[m]);
      for (int c = 0; c < 16; c++)
        if (fabs(v[c] - want[c]) > 1e-5 * (1 + fabs(want[c])))
          fail_msg("mask %04x: inverse[%d] = %.9g, dense %.9g", masks[m], c, v[c], want[c]);
    }
  }
}

static void test_rht_orthogonal(void **state) {
  (void)state;
  uint64_t s = 11;
  for (int it = 0; it < 3000; it++) {
    float v[16], w[16];
    double g[16], norm = 0, err = 0, err2 = 0;
    for (int i = 0; i < 16; i++) {
      g[i] = bf16_ref(hq_test_normal(&s) * 3);
      v[i] = (float)g[i];
      norm += g[i] * g[i];
    }
    hq_nvfp4_rht16(v, HQ_NVFP4_RHT_SIGNS);
    /* (a) transpose in double: z = y H16 diag(s) / 4 */
    for (int c = 0; c < 16; c++) {
      double acc = 0;
      for (int r = 0; r < 16; r++) acc += (double)v[r] * hsign(c, r);
      acc = acc / 4 * (((HQ_NVFP4_RHT_SIGNS >> c) & 1u) ? -1 : 1);
      err += (acc - g[c]) * (acc - g[c]);
    }
    /* (b) with hq's own transform: H16/4 is its own transpose, then the sign flip */
    memcpy(w, v, sizeof w);
    hq_nvfp4_rht16(w, 0);
    for (int c = 0; c < 16; c++) {
      double z = (double)w[c] * (((HQ_NVFP4_RHT_SIGNS >> c) & 1u) ? -1 : 1);
      err2 += (z - g[c]) * (z - g[c]);
    }
    /* each output carries at most 2^-8 relative BF16 rounding; (b) rounds twice */
    assert_true(sqrt(err) <= 1.5 * ldexp(sqrt(norm), -8));
    assert_true(sqrt(err2) <= 1.5 * ldexp(sqrt(norm), -7));
  }
}

/* Dot products of two transformed vectors equal those of the originals. Inputs k/4, |k| <= 8:
   the outputs are multiples of 1/16 below 8, exact in BF16, so the equality is exact. */
static void test_rht_preserves_dot_products(void **state) {
  (void)state;
  uint64_t s = 17;
  for (int it = 0; it < 2000; it++) {
    float a[16], b[16];
    double da = 0, dt = 0;
    for (int i = 0; i < 16; i++) {
      a[i] = (float)((int)(hq_test_rand(&s) % 17) - 8) / 4.0f;
      b[i] = (float)((int)(hq_test_rand(&s) % 17) - 8) / 4.0f;
      da += (double)a[i] * b[i];
    }
    hq_nvfp4_rht16(a, HQ_NVFP4_RHT_SIGNS);
    hq_nvfp4_rht16(b, HQ_NVFP4_RHT_SIGNS);
    for (int i = 0; i < 16; i++) dt += (double)a[i] * b[i];
    assert_true(dt == da);
  }
}

/* ---- layouts ------------------------------------------------------------------------------ */

/* FORMATS.md 2.4 by enumeration: tiles of 128 rows x 4 columns, tile-row-major; inside a tile
   the rows are stored in the order 0,32,64,96,1,33,65,97,...,31,63,95,127, 4 bytes each. */
static void test_scale_layouts(void **state) {
  (void)state;
  static const int64_t shapes[][2] = {{16, 16}, {128, 64}, {144, 80}, {256, 272}, {16, 1040}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    int64_t R = shapes[t][0], C = shapes[t][1];
    int64_t rows = hq_nvfp4_scale_rows(R), cols = hq_nvfp4_scale_cols(C);
    assert_int_equal(rows, (R + 127) / 128 * 128);
    assert_int_equal(cols, ((C / 16) + 3) / 4 * 4);
    int64_t n = rows * cols;
    int64_t *want = malloc((size_t)n * sizeof *want);
    uint8_t *seen = calloc((size_t)n, 1);
    int64_t pos = 0;
    for (int64_t tr = 0; tr < rows / 128; tr++)
      for (int64_t tc = 0; tc < cols / 4; tc++)
        for (int64_t a = 0; a < 32; a++)
          for (int64_t b = 0; b < 4; b++)
            for (int64_t c = 0; c < 4; c++)
              want[(tr * 128 + a + 32 * b) * cols + tc * 4 + c] = pos++;
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t b = 0; b < cols; b++) {
        assert_int_equal(hq_nvfp4_scale_offset(r, b, C, 0), r * cols + b);
        int64_t o = hq_nvfp4_scale_offset(r, b, C, 1);
        assert_int_equal(o, want[r * cols + b]);
        assert_true(o >= 0 && o < n && !seen[o]);
        seen[o] = 1;
      }
    }
    free(want);
    free(seen);
    /* element (i, k) of an [M, K] = [R, C] tensor */
    assert_int_equal(hq_nvfp4_row_scale_index(R - 1, C - 1, C, 0), (R - 1) * cols + (C - 1) / 16);
    assert_int_equal(hq_nvfp4_col_scale_index(R - 1, C - 1, R, 0),
                     (C - 1) * hq_nvfp4_scale_cols(R) + (R - 1) / 16);
  }
  /* hand-picked swizzled offsets: (r=1, c=0) -> 16; (32, 0) -> 4; (0, 1) -> 1; (0, 4) -> 512
     with 8 scale columns; (128, 0) -> 1024 with 8 scale columns */
  assert_int_equal(hq_nvfp4_scale_offset(1, 0, 128, 1), 16);
  assert_int_equal(hq_nvfp4_scale_offset(32, 0, 128, 1), 4);
  assert_int_equal(hq_nvfp4_scale_offset(0, 1, 128, 1), 1);
  assert_int_equal(hq_nvfp4_scale_offset(0, 4, 128, 1), 512);
  assert_int_equal(hq_nvfp4_scale_offset(128, 0, 128, 1), 1024);
  assert_int_equal(hq_nvfp4_scale_offset(127, 3, 128, 1), 511);
}

static void test_data_layouts(void **state) {
  (void)state;
  /* rowwise [M, K/2]: (i, k) -> i*K/2 + k/2; columnwise [K, M/2]: (i, k) -> k*M/2 + i/2 */
  assert_int_equal(hq_nvfp4_row_data_index(0, 0, 32), 0);
  assert_int_equal(hq_nvfp4_row_data_index(0, 1, 32), 0);
  assert_int_equal(hq_nvfp4_row_data_index(0, 2, 32), 1);
  assert_int_equal(hq_nvfp4_row_data_index(3, 31, 32), 3 * 16 + 15);
  assert_int_equal(hq_nvfp4_col_data_index(0, 0, 48), 0);
  assert_int_equal(hq_nvfp4_col_data_index(5, 0, 48), 2);
  assert_int_equal(hq_nvfp4_col_data_index(5, 7, 48), 7 * 24 + 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e2m1_decode_every_code),
      cmocka_unit_test(test_e2m1_rne_tie_table),
      cmocka_unit_test(test_raw_fast_every_pair),
      cmocka_unit_test(test_e2m1_saturation_nan_sign),
      cmocka_unit_test(test_e2m1_fast_form_exhaustive),
      cmocka_unit_test(test_e2m1_random_vs_bruteforce),
      cmocka_unit_test(test_e2m1_stochastic_rule),
      cmocka_unit_test(test_global_scale_hand),
      cmocka_unit_test(test_block_scale_hand),
      cmocka_unit_test(test_zero_and_tiny_block),
      cmocka_unit_test(test_block_scale_random_vs_double),
      cmocka_unit_test(test_amax_nan_inf),
      cmocka_unit_test(test_ue5m3_decode_every_code),
      cmocka_unit_test(test_ue5m3_encode_exhaustive),
      cmocka_unit_test(test_ue5m3_rules_hand),
      cmocka_unit_test(test_ue5m3_raw_bf16_exact),
      cmocka_unit_test(test_encode_table_vs_rule),
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_philox_round_keys),
      cmocka_unit_test(test_sr_bits_mapping),
      cmocka_unit_test(test_rht_te_signs),
      cmocka_unit_test(test_rht_matches_dense_matrix),
      cmocka_unit_test(test_rht_lanes_and_bf16_round),
      cmocka_unit_test(test_rht_fold_identity),
      cmocka_unit_test(test_e2m1_sr_bounded_form),
      cmocka_unit_test(test_rht_inverse),
      cmocka_unit_test(test_rht_orthogonal),
      cmocka_unit_test(test_rht_preserves_dot_products),
      cmocka_unit_test(test_scale_layouts),
      cmocka_unit_test(test_data_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
