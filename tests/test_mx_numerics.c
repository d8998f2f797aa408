/*
** test_mx_numerics.c -- the element and scale codecs of MXFP4 / MXFP6 (hq/numerics.h) and the
** MX rules (plugins/mx/mx_rules.h) against independent tables: every code point of E2M1, E3M2,
** E2M3 and E8M0 as ml_dtypes decodes it, ml_dtypes' RNE casts at every value, tie and
** neighbour of a tie (tests/mx_tables.h, made by tests/gen_mx_tables.py), and hand-computed
** scale codes and packings.
*/
#include <math.h>

#include "hq_test.h"

#include "../plugins/mx/mx_rules.h"
#include "mx_tables.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void check_decode(const uint32_t *tab, int n, int eb, int mb) {
  for (int c = 0; c < n; c++) {
    const uint32_t got = hq_f32_bits(hq_fpx_to_f32((uint32_t)c, eb, mb));
    if (got != tab[c]) fail_msg("e%dm%d code %d: 0x%08x, ml_dtypes 0x%08x", eb, mb, c, got, tab[c]);
  }
}

static void check_encode(const uint32_t (*tab)[2], size_t n, int eb, int mb) {
  for (size_t i = 0; i < n; i++) {
    const uint32_t got = hq_f32_to_fpx(hq_bits_f32(tab[i][0]), eb, mb);
    if (got != tab[i][1])
      fail_msg("e%dm%d cast of 0x%08x: code %u, ml_dtypes %u", eb, mb, tab[i][0], got, tab[i][1]);
  }
}

static void test_decode_every_code(void **state) {
  (void)state;
  check_decode(e2m1_decode, 16, 2, 1);
  check_decode(e3m2_decode, 64, 3, 2);
  check_decode(e2m3_decode, 64, 2, 3);
  for (int c = 0; c < 16; c++)
    assert_int_equal(hq_f32_bits(hq_e2m1_to_f32((uint32_t)c)), e2m1_decode[c]);
  for (int c = 0; c < 64; c++) {
    assert_int_equal(hq_f32_bits(hq_fp6_to_f32((uint32_t)c, HQ_E3M2X4)), e3m2_decode[c]);
    assert_int_equal(hq_f32_bits(hq_fp6_to_f32((uint32_t)c, HQ_E2M3X4)), e2m3_decode[c]);
  }
  /* E8M0: all 256 codes, 0xFF NaN (any NaN) */
  for (int e = 0; e < 255; e++)
    assert_int_equal(hq_f32_bits(hq_e8m0_to_f32((uint8_t)e)), e8m0_decode[e]);
  assert_true(hq_isnan(hq_e8m0_to_f32(0xFF)) && hq_isnan(hq_bits_f32(e8m0_decode[255])));
}

static void test_encode_rne_satfinite(void **state) {
  (void)state;
  check_encode(e2m1_encode, N(e2m1_encode), 2, 1);
  check_encode(e3m2_encode, N(e3m2_encode), 3, 2);
  check_encode(e2m3_encode, N(e2m3_encode), 2, 3);
  for (size_t i = 0; i < N(e2m1_encode); i++)
    assert_int_equal(hq_f32_to_e2m1(hq_bits_f32(e2m1_encode[i][0])), e2m1_encode[i][1]);
  /* NaN: +max (ml_dtypes writes -0; hq's rule, as hq_f32_to_e2m1) */
  assert_int_equal(hq_f32_to_fp6(hq_bits_f32(0xffc00000u), HQ_E3M2X4), 0x1F);
  assert_int_equal(hq_f32_to_fp6(hq_bits_f32(0x7fc00000u), HQ_E2M3X4), 0x1F);
}

/* The generic E2M1 casts equal the E2M1-specific ones over every FP32 value below 16 (a sweep
   of the bit patterns) and the generic SR over every random byte. */
static void test_generic_equals_e2m1(void **state) {
  (void)state;
  for (uint32_t u = 0; u < 0x41800000u; u += 0x101u) {
    const float x = hq_bits_f32(u), nx = -x;
    assert_int_equal(hq_f32_to_fpx(x, 2, 1), hq_f32_to_e2m1(x));
    assert_int_equal(hq_f32_to_fpx(nx, 2, 1), hq_f32_to_e2m1(nx));
    if ((u & 0xfffffu) < 0x101u)
      for (uint32_t r = 0; r < 256; r++)
        assert_int_equal(hq_f32_to_fpx_sr(x, 2, 1, r), hq_f32_to_e2m1_sr(x, r));
    assert_int_equal(hq_f32_to_fpx_sr(nx, 2, 1, u & 255u), hq_f32_to_e2m1_sr(nx, u & 255u));
  }
}

/* FP6 stochastic rounding: for a value between two neighbouring codes lo < hi, the result is lo
   or hi, lo with r8 = 0, and the count of hi over all 256 bytes is the fraction of the step
   (x - lo) / (hi - lo) times 256, exactly, where that is an integer. */
static void test_fp6_sr(void **state) {
  (void)state;
  const int kinds[2] = {HQ_E3M2X4, HQ_E2M3X4};
  for (int k = 0; k < 2; k++)
    for (uint32_t lo = 0; lo < 31; lo++) {
      const float a = hq_fp6_to_f32(lo, kinds[k]), b = hq_fp6_to_f32(lo + 1, kinds[k]);
      for (int q = 0; q < 4; q++) {
        const float x = a + (b - a) * (float)q / 4.0f;
        int hi = 0;
        for (uint32_t r = 0; r < 256; r++) {
          const uint32_t c = hq_f32_to_fp6_sr(x, kinds[k], r);
          if (c != lo && c != lo + 1) fail_msg("kind %d: %g -> code %u", kinds[k], x, c);
          hi += c == lo + 1;
          assert_int_equal(hq_f32_to_fp6_sr(-x, kinds[k], r), c | 0x20u);
        }
        assert_int_equal(hq_f32_to_fp6_sr(x, kinds[k], 0), lo);
        assert_int_equal(hi, 64 * q);
      }
    }
  /* beyond the maximum and Inf saturate whatever the byte; NaN is +max */
  assert_int_equal(hq_f32_to_fp6_sr(100.0f, HQ_E3M2X4, 255), 0x1F);
  assert_int_equal(hq_f32_to_fp6_sr(-INFINITY, HQ_E2M3X4, 7), 0x3F);
  assert_int_equal(hq_f32_to_fp6_sr(NAN, HQ_E2M3X4, 7), 0x1F);
}

/* Scale codes by hand. FLOOR: max(E(A) - emax, 0); RCEIL: round up of RN(A / max). */
static void test_scale_codes(void **state) {
  (void)state;
  /* A = 6.0 = 1.5 * 2^2: E = 129; emax 2 -> 127 (scale 1); E3M2 emax 4 -> 125 */
  assert_int_equal(hq_mx_scale_code(6.0f, HQ_E2M1X2, HQ_MX_FLOOR), 127);
  assert_int_equal(hq_mx_scale_code(6.0f, HQ_E3M2X4, HQ_MX_FLOOR), 125);
  assert_int_equal(hq_mx_scale_code(7.99f, HQ_E2M3X4, HQ_MX_FLOOR), 127);
  assert_int_equal(hq_mx_scale_code(8.0f, HQ_E2M1X2, HQ_MX_FLOOR), 128);
  /* RCEIL: 6 / 6 = 1 -> 127; 6.5 / 6 > 1 -> 128; 28 / 28 -> 127; 7.5 * 2^-3 / 7.5 -> 124 */
  assert_int_equal(hq_mx_scale_code(6.0f, HQ_E2M1X2, HQ_MX_RCEIL), 127);
  assert_int_equal(hq_mx_scale_code(6.5f, HQ_E2M1X2, HQ_MX_RCEIL), 128);
  assert_int_equal(hq_mx_scale_code(28.0f, HQ_E3M2X4, HQ_MX_RCEIL), 127);
  assert_int_equal(hq_mx_scale_code(0.9375f, HQ_E2M3X4, HQ_MX_RCEIL), 124);
  /* zero, FP32 subnormals, Inf, NaN */
  for (int rule = 0; rule < 2; rule++) {
    assert_int_equal(hq_mx_scale_code(0.0f, HQ_E2M1X2, rule), 0);
    assert_int_equal(hq_mx_scale_code(NAN, HQ_E2M1X2, rule), 0xFF);
  }
  assert_int_equal(hq_mx_scale_code(1e-40f, HQ_E2M1X2, HQ_MX_FLOOR), 0);
  assert_int_equal(hq_mx_scale_code(INFINITY, HQ_E2M1X2, HQ_MX_FLOOR), 253);
  assert_int_equal(hq_mx_scale_code(INFINITY, HQ_E3M2X4, HQ_MX_FLOOR), 251);
  assert_int_equal(hq_mx_scale_code(INFINITY, HQ_E2M1X2, HQ_MX_RCEIL), 0xFE);
  assert_int_equal(hq_mx_scale_code(FLT_MAX, HQ_E2M1X2, HQ_MX_FLOOR), 252);
  /* multipliers: 2^(127-e); FLOOR's e = 0 is torchao's 2^126; NaN blocks 0 */
  assert_true(hq_mx_encode_mult(127, HQ_MX_FLOOR) == 1.0f);
  assert_true(hq_mx_encode_mult(0, HQ_MX_FLOOR) == 0x1p126f);
  assert_true(hq_mx_encode_mult(0, HQ_MX_RCEIL) == 0x1p127f);
  assert_true(hq_mx_encode_mult(254, HQ_MX_FLOOR) == 0x1p-127f);
  assert_true(hq_mx_encode_mult(0xFF, HQ_MX_RCEIL) == 0.0f);
}

/* RCEIL's code made without the division (mx_rules.h) against the rule's own steps, the division
   done here: every mantissa of the binade where the integer form starts (the quotient's first
   normal binade), and every binade at the mantissas about c's (max = c * 2^k), the ends, and a
   stride through the rest; both signs. With HQ_TEST_EXHAUSTIVE set, every one of the 2^31
   magnitudes of each element kind instead (about half a minute: too long for every run). */
static uint8_t rceil_by_division(float amax, float max) {
  if (isnan(amax)) return 0xFF;
  volatile float q = fabsf(amax) / max; /* one IEEE division, rounded to nearest */
  return hq_e8m0_from_f32_rp(q);
}
static void check_rceil(int kind, uint32_t a, int both_signs) {
  const float x = hq_bits_f32(a), max = hq_mx_max(kind);
  const uint8_t want = rceil_by_division(x, max);
  if (hq_mx_scale_code(x, kind, HQ_MX_RCEIL) != want ||
      (both_signs && hq_mx_scale_code(-x, kind, HQ_MX_RCEIL) != want))
    fail_msg("kind %d amax bits 0x%08x: code %u, the division's %u", kind, a,
             hq_mx_scale_code(x, kind, HQ_MX_RCEIL), want);
}
static void test_rceil_code_form(void **state) {
  (void)state;
  const int kinds[3] = {HQ_E2M1X2, HQ_E2M3X4, HQ_E3M2X4};
  for (int i = 0; i < 3; i++) {
    const uint32_t mb = hq_f32_bits(hq_mx_max(kinds[i])), k = (mb >> 23) - 127u;
    const uint32_t cm = mb & 0x7fffffu;
    if (getenv("HQ_TEST_EXHAUSTIVE")) {
      for (uint32_t a = 0; a <= 0x7fffffffu; a++) check_rceil(kinds[i], a, 0);
      continue;
    }
    for (uint32_t m = 0; m <= 0x7fffffu; m++) check_rceil(kinds[i], (k + 2u) << 23 | m, 0);
    for (uint32_t eb = 0; eb < 256; eb++) {
      const uint32_t ms[7] = {0u, 1u, cm - 1u, cm, cm + 1u, 0x7ffffeu, 0x7fffffu};
      for (int j = 0; j < 7; j++) check_rceil(kinds[i], eb << 23 | ms[j], 1);
      for (uint32_t m = 0; m <= 0x7fffffu; m += 4093u) check_rceil(kinds[i], eb << 23 | m, 1);
    }
  }
}

/* Packing by hand (docs/formats.md's worked example): codes 1, 2, 3, 4 of FP6 are the 24-bit
   word 1 | 2 << 6 | 3 << 12 | 4 << 18 = 0x103081: bytes 0x81 0x30 0x10. */
static void test_packing(void **state) {
  (void)state;
  uint32_t c[32];
  for (int k = 0; k < 32; k++) c[k] = (uint32_t)(k % 4 + 1);
  uint8_t b[24];
  hq_mx_pack32(b, c, HQ_E3M2X4);
  assert_int_equal(b[0], 0x81);
  assert_int_equal(b[1], 0x30);
  assert_int_equal(b[2], 0x10);
  for (int k = 0; k < 32; k++) c[k] = (uint32_t)((k * 37 + 5) & 63);
  hq_mx_pack32(b, c, HQ_E2M3X4);
  for (int k = 0; k < 32; k++) assert_int_equal(hq_mx_code(b, k, HQ_E2M3X4), c[k]);
  /* FP4: element 0 low nibble: 0x1, 0xF -> 0xF1 */
  c[0] = 1, c[1] = 15;
  hq_mx_pack32(b, c, HQ_E2M1X2);
  assert_int_equal(b[0], 0xF1);
  assert_int_equal(hq_mx_code(b, 1, HQ_E2M1X2), 15);
}

/* The kernels' fast RN forms (hq_mx_cast_fast: E2M1 by two sums and a min, FP6 through the FP8
   encoder of the value times 2^-12 / 2^-6, folded into the multiplier) equal the rule,
   hq_mx_cast(RN(x * hq_mx_encode_mult(e)), kind), for every scale code but NaN's and both
   scale rules: (1) with the multiplier 1 (e = 127) on every 63rd FP32 bit pattern below 64 and
   every 16383rd above, each with its neighbours, and on every tie of 1, 2 or 3 mantissa bits
   (only zeros below the rounding bit) in every binade with its neighbours; (2) on a sweep of x for every code 0..254, where the
   folded multiplier reaches 2^-139 and 2^115 and the products go subnormal. */
static void check_fast(float x, uint8_t e, int kind, int rule) {
  if (hq_isnan(x)) return; /* a NaN makes its block a NaN block (e = 0xFF) */
  const uint32_t want = hq_mx_cast(hq_mul_rn(x, hq_mx_encode_mult(e, rule)), kind);
  const uint32_t got = hq_mx_cast_fast(x, e, kind, rule);
  if (got != want)
    fail_msg("kind %d rule %d e %u x 0x%08x: fast %u, rule %u", kind, rule, e, hq_f32_bits(x),
             got, want);
}

static void test_fast_forms(void **state) {
  (void)state;
  const int kinds[3] = {HQ_E2M1X2, HQ_E3M2X4, HQ_E2M3X4};
  for (int k = 0; k < 3; k++) {
    for (uint32_t u = 0; u < 0x7f800001u; u += u < 0x42800000u ? 0x3fu : 0x3fffu)
      for (uint32_t d = 0; d < 3; d++) {
        const float x = hq_bits_f32(u + d - (u ? 1u : 0u));
        check_fast(x, 127, kinds[k], HQ_MX_FLOOR);
        check_fast(-x, 127, kinds[k], HQ_MX_FLOOR);
      }
    /* every tie of 1, 2 or 3 mantissa bits (and its neighbours) in every binade */
    for (uint32_t ex = 0; ex < 255; ex++)
      for (uint32_t m = 0; m < 16; m++)
        for (uint32_t d = 0; d < 3; d++) {
          const uint32_t u = ex << 23 | m << 19;
          const float x = hq_bits_f32(u + d - (u ? 1u : 0u));
          check_fast(x, 127, kinds[k], HQ_MX_FLOOR);
          check_fast(-x, 127, kinds[k], HQ_MX_FLOOR);
        }
    for (int rule = 0; rule < 2; rule++)
      for (int e = 0; e < 255; e++) {
        uint64_t s = (uint64_t)(e * 3 + rule + 1);
        for (int n = 0; n < 4000; n++) {
          const uint32_t r = (uint32_t)hq_test_rand(&s);
          /* values near the block's range: x * 2^(127-e) within a few binades of the grid */
          const int ex = e - 127 + (int)(r % 12) - 8;
          float x = ldexpf(1.0f + (float)((r >> 8) & 0xffff) / 65536.0f, ex);
          if (r & 0x80000000u) x = -x;
          check_fast(x, (uint8_t)e, kinds[k], rule);
          check_fast(hq_bits_f32(hq_f32_bits(x) + 1u), (uint8_t)e, kinds[k], rule);
          check_fast(hq_bits_f32(r & 0x7fffffffu), (uint8_t)e, kinds[k], rule); /* anything */
        }
        check_fast(INFINITY, (uint8_t)e, kinds[k], rule);
        check_fast(-INFINITY, (uint8_t)e, kinds[k], rule);
        check_fast(-0.0f, (uint8_t)e, kinds[k], rule);
        check_fast(0.0f, (uint8_t)e, kinds[k], rule);
      }
  }
}

/* The packed BF16 form of the E2M1 cast (hq_mx_e2m1x8_bf16, the kernels' form for BF16 input)
   against the rule: every BF16 bit pattern but NaN, in groups of 8 with each pair's own scale
   code, for every scale code under both rules (where the form applies), packing and signs
   included. */
static void test_bf16_e2m1_form(void **state) {
  (void)state;
  for (int rule = 0; rule < 2; rule++)
    for (int e = 0; e < 255; e++)
      for (uint32_t g = 0; g < 0x10000u; g += 8) {
        uint32_t w[4], m1[4], m2[4], want = 0;
        uint8_t ej[4];
        int ok = 1;
        for (int j = 0; j < 4; j++) {
          ej[j] = (uint8_t)((e + 67 * j * (int)((g >> 3) & 3u)) % 255);
          ok &= hq_mx_e2m1_bf16_ok(ej[j], rule);
          m1[j] = hq_mx_bf16_mult2(ej[j], 0);
          m2[j] = hq_mx_bf16_mult2(ej[j], 1);
        }
        if (!ok) continue;
        for (int k = 0; k < 8; k++) {
          uint32_t b = g + (uint32_t)k;
          if ((b & 0x7fffu) >= 0x7f80u) b &= 0x8000u; /* NaN: a NaN block takes the rule */
          w[k / 2] = k & 1 ? w[k / 2] | b << 16 : b;
          const float v = hq_mul_rn(hq_bf16_to_f32((uint16_t)b), hq_mx_encode_mult(ej[k / 2], rule));
          want |= hq_mx_cast(v, HQ_E2M1X2) << (4 * k);
        }
        const uint32_t got = hq_mx_e2m1x8_bf16(w, m1, m2);
        if (got != want)
          fail_msg("bf16 %04x.. scale codes %u %u %u %u rule %d: 0x%08x, rule 0x%08x", g, ej[0],
                   ej[1], ej[2], ej[3], rule, got, want);
      }
  /* the multiplier words: the BF16 bits of mult and 2 * mult (exact: powers of two from 2^-127,
     a BF16 subnormal, to 2^127) in both halves, for every code the form takes */
  for (int rule = 0; rule < 2; rule++)
    for (int e = 0; e < 255; e++) {
      if (!hq_mx_e2m1_bf16_ok((uint8_t)e, rule)) continue;
      const float mult = hq_mx_encode_mult((uint8_t)e, rule);
      const uint32_t b1 = hq_f32_to_bf16(mult), b2 = hq_f32_to_bf16(hq_mul_rn(mult, 2.0f));
      assert_int_equal(hq_mx_bf16_mult2((uint8_t)e, 0), b1 | b1 << 16);
      assert_int_equal(hq_mx_bf16_mult2((uint8_t)e, 1), b2 | b2 << 16);
    }
  assert_int_equal(hq_mx_bf16_mult2(254, 0), 0x00400040u);
  assert_int_equal(hq_mx_bf16_mult2(1, 1), 0x7f007f00u);
  assert_int_equal(hq_mx_bf16_mult2(0, 1), 0x7f007f00u);
  assert_false(hq_mx_e2m1_bf16_ok(0, HQ_MX_RCEIL));
  assert_true(hq_mx_e2m1_bf16_ok(0, HQ_MX_FLOOR));
  assert_false(hq_mx_e2m1_bf16_ok(0xFF, HQ_MX_FLOOR));
}

/* The packed BF16 form of the FP6 cast (hq_mx_fp6x8_bf16) against the rule, packing and signs
   included, for both element types: every finite BF16 bit pattern (the form's blocks have a
   finite amax) under every scale code the form takes (hq_mx_fp6_bf16_ok), either rule, each
   pattern in a position (0..7 of the 8) that turns with the code, each pair with its own code;
   then every pattern in each of the 8 positions for the codes at the ends of the range and 127.
   The rule's codes come from a table per scale code (fp6_want), hq_mx_cast of RN(x * mult). */
static uint8_t fp6_want[255][0x10000];
static void fp6_bf16_table(int kind, int rule) {
  for (int e = (int)hq_mx_fp6_bf16_emin(kind); e < 255; e++)
    for (uint32_t b = 0; b < 0x10000u; b++) {
      const float v = hq_mul_rn(hq_bf16_to_f32((uint16_t)b), hq_mx_encode_mult((uint8_t)e, rule));
      fp6_want[e][b] = (uint8_t)hq_mx_cast(v, kind);
    }
}
/* patterns g + (k + r) % 8 at positions k = 0..7 (NaN patterns replaced by a zero of their
   sign), pair j under code ej[j]; 0 when they agree */
static int fp6_bf16_group(int kind, uint32_t g, int r, const uint8_t ej[4], int report) {
  uint32_t w[4], nd[4];
  uint64_t want = 0;
  for (int j = 0; j < 4; j++) nd[j] = hq_mx_fp6_bf16_nd(ej[j], kind) * 0x10001u;
  for (int k = 0; k < 8; k++) {
    uint32_t b = g + (uint32_t)((k + r) & 7);
    if ((b & 0x7fffu) >= 0x7f80u) b &= 0x8000u;
    w[k / 2] = k & 1 ? w[k / 2] | b << 16 : b;
    want |= (uint64_t)fp6_want[ej[k / 2]][b] << (6 * k);
  }
  const uint64_t got = hq_mx_fp6x8_bf16(w, nd, kind);
  if (got != want && report)
    fail_msg("kind %d bf16 %04x.. turn %d scale codes %u %u %u %u: 0x%012llx, rule 0x%012llx",
             kind, g, r, ej[0], ej[1], ej[2], ej[3], (unsigned long long)got,
             (unsigned long long)want);
  return got != want;
}

static void test_bf16_fp6_form(void **state) {
  (void)state;
  const int kinds[2] = {HQ_E3M2X4, HQ_E2M3X4};
  int64_t checked = 0;
  for (int k = 0; k < 2; k++) {
    const int kind = kinds[k], emin = (int)hq_mx_fp6_bf16_emin(kind);
    /* the form takes no rule: both rules' multipliers are 2^(127 - e) for every code it takes
       (e >= 1), so their rule codes are one table */
    for (int e = emin; e < 255; e++)
      assert_true(hq_mx_encode_mult((uint8_t)e, HQ_MX_FLOOR) ==
                  hq_mx_encode_mult((uint8_t)e, HQ_MX_RCEIL));
    fp6_bf16_table(kind, HQ_MX_RCEIL);
    for (int e = emin; e < 255; e++)
      for (uint32_t g = 0; g < 0x10000u; g += 8) {
        uint8_t ej[4];
        for (int j = 0; j < 4; j++) {
          ej[j] = (uint8_t)(emin + (e - emin + 67 * j * (int)((g >> 3) & 3u)) % (255 - emin));
          assert_true(hq_mx_fp6_bf16_ok(ej[j], kind));
        }
        fp6_bf16_group(kind, g, e & 7, ej, 1);
        checked += 8;
      }
    const uint8_t ends[4] = {(uint8_t)emin, 127, 253, 254};
    for (int q = 0; q < 4; q++)
      for (int r = 0; r < 8; r++)
        for (uint32_t g = 0; g < 0x10000u; g += 8) {
          const uint8_t ej[4] = {ends[q], ends[q], ends[q], ends[q]};
          fp6_bf16_group(kind, g, r, ej, 1);
          checked += 8;
        }
    /* an Inf reads as 2^128, below the saturation for the code of a block that holds it (FLOOR:
       255 - emax), so such blocks keep the rule */
    const uint8_t e_inf = hq_mx_scale_code(INFINITY, kind, HQ_MX_FLOOR);
    uint32_t w[4] = {0x7f80u, 0, 0, 0}, nd[4];
    for (int j = 0; j < 4; j++) nd[j] = hq_mx_fp6_bf16_nd(e_inf, kind) * 0x10001u;
    assert_int_equal(hq_mx_cast(INFINITY, kind), 31);
    assert_int_not_equal(hq_mx_fp6x8_bf16(w, nd, kind) & 63u, 31);
    assert_false(hq_mx_fp6_bf16_ok((uint8_t)(emin - 1), kind));
    assert_true(hq_mx_fp6_bf16_ok((uint8_t)emin, kind));
    assert_false(hq_mx_fp6_bf16_ok(0xFF, kind));
  }
  printf("bf16 fp6 form: %lld elements, bit for bit\n", (long long)checked);
}

/* The FP6 form of blocks with a finite amax (hq_mx_fp6x4_of_fp8x4_fin after the FP8 convert of
   x * hq_mx_fp6_fp8_mult) against the rule, packing included: blocks of random amax A (every
   binade) under both rules, with A, the grid's points, ties and their neighbours scaled into
   the block, and random values in [-A, A]; then the clip and packing alone on every word of
   four codes of magnitude <= 32 that holds one byte of each magnitude at each place. */
static uint32_t fp6x4_fin(const float x[4], uint8_t e, int kind, int rule) {
  const float m = hq_mx_fp6_fp8_mult(e, rule, kind);
  uint32_t w = 0;
  for (int k = 0; k < 4; k++) w |= (uint32_t)hq_f32_to_fp8(hq_mul_rn(x[k], m), hq_mx_fp6_fp8_elem(kind)) << (8 * k);
  return hq_mx_fp6x4_of_fp8x4_fin(w);
}

static void test_fp6_fin_form(void **state) {
  (void)state;
  const int kinds[2] = {HQ_E3M2X4, HQ_E2M3X4};
  uint64_t s = 49;
  for (int k = 0; k < 2; k++)
    for (int rule = 0; rule < 2; rule++)
      for (int n = 0; n < 60000; n++) {
        const uint32_t r = (uint32_t)hq_test_rand(&s);
        const float A = hq_bits_f32(r % 0x7f800000u);
        const uint8_t e = hq_mx_scale_code(A, kinds[k], rule);
        const float mult = hq_mx_encode_mult(e, rule);
        float x[4];
        for (int q = 0; q < 4; q++) {
          const uint32_t t = (uint32_t)hq_test_rand(&s);
          float v;
          if (q == 0) {
            v = A;
          } else if (t & 1u) { /* a grid point or tie of the element type, +-1 ulp, in the block */
            const float g = hq_mul_rn(hq_mx_elem_to_f32((t >> 1) & 31u, kinds[k]) +
                                          hq_mx_elem_to_f32(((t >> 1) & 31u) + ((t >> 6) & 1u), kinds[k]),
                                      0.5f);
            v = hq_bits_f32(hq_f32_bits(hq_mul_rn(g, hq_e8m0_to_f32(e))) + ((t >> 7) % 3u) - 1u);
            if (!(hq_fabs(v) <= A)) v = A;
          } else {
            v = hq_mul_rn(A, (float)(t >> 8) / 16777216.0f);
          }
          x[q] = (t >> 31) ? -v : v;
        }
        uint32_t c[4];
        for (int q = 0; q < 4; q++) c[q] = hq_mx_cast(hq_mul_rn(x[q], mult), kinds[k]);
        const uint32_t want = hq_fp6_pack4(c[0], c[1], c[2], c[3]), got = fp6x4_fin(x, e, kinds[k], rule);
        if (got != want)
          fail_msg("kind %d rule %d A 0x%08x e %u: 0x%06x, rule 0x%06x", kinds[k], rule,
                   hq_f32_bits(A), e, got, want);
      }
  for (uint32_t b = 0; b < 66; b++) /* FP8 byte b: magnitude b % 33, sign b / 33 */
    for (int at = 0; at < 4; at++) {
      const uint32_t byte = (b % 33u) | (b / 33u) << 7;
      uint32_t w = 0, c[4];
      for (int q = 0; q < 4; q++) {
        const uint32_t o = q == at ? byte : (b * 7u + (uint32_t)q * 13u) % 66u;
        const uint32_t ob = q == at ? byte : (o % 33u) | (o / 33u) << 7;
        w |= ob << (8 * q);
        c[q] = ((ob & 0x7fu) < 31u ? (ob & 0x7fu) : 31u) | (ob >> 2 & 0x20u);
      }
      assert_int_equal(hq_mx_fp6x4_of_fp8x4_fin(w), hq_fp6_pack4(c[0], c[1], c[2], c[3]));
    }
}

/* hq_mx_dequantize_bf16x2 (the BF16 dequantize of the kernels: the dequantize kernel's BF16
   output, the fused GEMM's A fragments) against ml_dtypes' element values: every code pair of
   every kind under every scale code, each half the element's value times 2^(e-127) computed in
   double (exact), rounded to FP32 then to BF16 (the dequantize's rule: FP32 value, then the
   destination's RN), a NaN scale the canonical NaN 0x7fc0. */
static void test_dequantize_bf16x2(void **state) {
  (void)state;
  static const int kinds[3] = {HQ_E2M1X2, HQ_E3M2X4, HQ_E2M3X4};
  const uint32_t *tabs[3] = {e2m1_decode, e3m2_decode, e2m3_decode};
  int64_t checked = 0;
  for (int v = 0; v < 3; v++) {
    const int n = v ? 64 : 16;
    for (int e = 0; e < 256; e++)
      for (int lo = 0; lo < n; lo++)
        for (int hi = 0; hi < n; hi++) {
          const uint32_t got = hq_mx_dequantize_bf16x2((uint32_t)lo | (uint32_t)hi << 16,
                                                       (uint8_t)e, kinds[v]);
          const int c[2] = {lo, hi};
          for (int h = 0; h < 2; h++) {
            uint16_t want = 0x7fc0u;
            if (e != 255) {
              const float f = (float)ldexp((double)hq_bits_f32(tabs[v][c[h]]), e - 127);
              want = hq_f32_to_bf16(f);
            }
            const uint16_t g = (uint16_t)(got >> (16 * h));
            if (g != want)
              fail_msg("kind %d code %d scale %d: bf16 0x%04x, expected 0x%04x", kinds[v], c[h],
                       e, g, want);
            checked++;
          }
        }
  }
  printf("dequantize bf16x2: %lld values, bit for bit\n", (long long)checked);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_every_code),  cmocka_unit_test(test_encode_rne_satfinite),
      cmocka_unit_test(test_generic_equals_e2m1), cmocka_unit_test(test_fp6_sr),
      cmocka_unit_test(test_scale_codes),        cmocka_unit_test(test_rceil_code_form),
      cmocka_unit_test(test_packing),
      cmocka_unit_test(test_fast_forms),         cmocka_unit_test(test_bf16_e2m1_form),
      cmocka_unit_test(test_fp6_fin_form),      cmocka_unit_test(test_bf16_fp6_form),
      cmocka_unit_test(test_dequantize_bf16x2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
