/*
** test_mxfp8_numerics.c -- the MXFP8 rules (plugins/mxfp8/mxfp8_rules.h: TE's scale rule, the
** element cast, the scale-layout index functions) and the E8M0 / FP8 codecs of hq/numerics.h
** they use, against the independent reference of mxfp8_ref.h and hand-computed values: every
** E8M0 code point, the scale rule against a doubling search and against the exact ratio
** amax/max_norm, amax = max_norm * 2^k, amax = 500, and the swizzle / compact index functions
** element by element. The rules take the element kind as an hq_dtype (HQ_E4M3 / HQ_E5M2); the
** reference (fp8_ref.h) numbers its kinds 0 = E4M3, 1 = E5M2, hence DT().
*/
#include <math.h>

#include "hq_test.h"
#include "mxfp8_ref.h"
#include "mxfp8_rules.h"

/* The hq_dtype of reference kind k (0 = E4M3, 1 = E5M2). */
#define DT(k) ((k) ? HQ_E5M2 : HQ_E4M3)

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Every code decodes to 2^(e-127); 0 is the FP32 subnormal 2^-127; 0xFF is NaN. */
static void test_e8m0_decode_every_code(void **state) {
  (void)state;
  for (unsigned e = 0; e < 255; e++) {
    float v = hq_e8m0_to_f32((uint8_t)e);
    assert_true((double)v == ldexp(1.0, (int)e - 127));
  }
  assert_true(isnan(hq_e8m0_to_f32(0xFF)));
  assert_int_equal(bits(hq_e8m0_to_f32(0)), 0x00400000u);
  assert_true(hq_e8m0_to_f32(127) == 1.0f);
  assert_true(hq_e8m0_to_f32(128) == 2.0f);
  assert_true(hq_e8m0_to_f32(254) == ldexpf(1.0f, 127));
}

/* Every code re-encodes to itself; a hair above goes to the next code (round up), a hair below
   stays (it is still <= 2^(e-127)) down to just above the previous power of two. */
static void test_e8m0_reencode_every_code(void **state) {
  (void)state;
  for (unsigned e = 0; e < 255; e++) {
    float v = hq_e8m0_to_f32((uint8_t)e);
    assert_int_equal(hq_e8m0_from_f32_rp(v), e);
    float up = nextafterf(v, INFINITY);
    assert_int_equal(hq_e8m0_from_f32_rp(up), e < 254 ? e + 1 : 254); /* 254: satfinite */
    assert_int_equal(hq_e8m0_from_f32_rp(nextafterf(v, 0.0f)), e);
    if (e > 0) {
      float prev_up = nextafterf((float)ldexp(1.0, (int)e - 128), INFINITY);
      assert_int_equal(hq_e8m0_from_f32_rp(prev_up), e);
    }
  }
  assert_int_equal(hq_e8m0_from_f32_rp(hq_e8m0_to_f32(0xFF)), 0xFF);
}

static void test_e8m0_encode_specials(void **state) {
  (void)state;
  assert_int_equal(hq_e8m0_from_f32_rp(0.0f), 0);
  assert_int_equal(hq_e8m0_from_f32_rp(-0.0f), 0);
  assert_int_equal(hq_e8m0_from_f32_rp(INFINITY), 0xFE);
  assert_int_equal(hq_e8m0_from_f32_rp(NAN), 0xFF);
  assert_int_equal(hq_e8m0_from_f32_rp(FLT_MAX), 0xFE);             /* 2^128 saturates */
  assert_int_equal(hq_e8m0_from_f32_rp(ldexpf(1.0f, 127)), 0xFE);
  assert_int_equal(hq_e8m0_from_f32_rp(ldexpf(1.5f, 126)), 0xFE);
  assert_int_equal(hq_e8m0_from_f32_rp(1.0f), 127);
  assert_int_equal(hq_e8m0_from_f32_rp(1.5f), 128);
  assert_int_equal(hq_e8m0_from_f32_rp(0.75f), 127);
  /* FP32 subnormals: <= 2^-127 -> 0, above -> 1 (2^-126) */
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x00000001u)), 0);
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x00400000u)), 0);
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x00400001u)), 1);
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x007fffffu)), 1);
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x00800000u)), 1);   /* 2^-126 */
  assert_int_equal(hq_e8m0_from_f32_rp(from_bits(0x00800001u)), 2);
}

/* The encode multiplier is 2^(127-e) for every code (e = 254: the FP32 subnormal 2^-127), and
   multiplier * scale_inv == 1 wherever both are normal. */
static void test_e8m0_quant_mult(void **state) {
  (void)state;
  for (unsigned e = 0; e < 255; e++) {
    float m = hq_e8m0_quant_mult((uint8_t)e);
    assert_true((double)m == ldexp(1.0, 127 - (int)e));
    if (e >= 1 && e <= 253) assert_true(m * hq_e8m0_to_f32((uint8_t)e) == 1.0f);
  }
  assert_int_equal(bits(hq_e8m0_quant_mult(254)), 0x00400000u);
  assert_true(isnan(hq_e8m0_quant_mult(0xFF)));
}

/* TE's rule against the doubling search (same t, different ceil), over random amax values in
   every binade, FP32 subnormals, powers of two, their neighbours and the special values. Where t
   is a normal FP32 number the code must also be the smallest power of two >= the exact ratio
   amax/max_norm (computed in double, no FP32 rounding at all). */
static void test_scale_rule_vs_bruteforce(void **state) {
  (void)state;
  uint64_t s = 777;
  for (int kind = 0; kind < 2; kind++) {
    double maxn = ref_fp8_max(kind);
    int n_exact = 0;
    for (int it = 0; it < 300000; it++) {
      float amax;
      int pick = it % 4;
      if (pick == 0) amax = from_bits((uint32_t)(hq_test_rand(&s) >> 33) & 0x7fffffffu);
      else if (pick == 1) amax = from_bits((uint32_t)(hq_test_rand(&s) % 0x00800000u));
      else if (pick == 2) {
        float p = (float)ldexp(1.0, (int)(hq_test_rand(&s) % 276) - 149);
        float q = (float)(p * maxn);
        amax = (hq_test_rand(&s) & 1) ? nextafterf(q, INFINITY) : nextafterf(q, 0.0f);
        if (hq_test_rand(&s) % 3 == 0) amax = q;
      } else
        amax = (float)ldexp(fabs((double)hq_test_uniform(&s)), (int)(hq_test_rand(&s) % 280) - 150);
      if (isnan(amax)) continue; /* amax never is NaN */
      const float *p = &amax;
      unsigned want = ref_block_code(&p, 1, kind);
      assert_int_equal(hq_mxfp8_scale_code(amax, DT(kind)), want);
      float t = (float)((double)amax * (double)(1.0f / (float)maxn));
      if (!isinf(amax) && t >= ldexpf(1.0f, -126)) {
        double ratio = (double)amax / maxn;
        int k = 0;
        double pw = 1.0;
        while (pw < ratio) pw *= 2.0, k++;
        while (pw / 2.0 >= ratio) pw /= 2.0, k--;
        if (k > 127) k = 127;
        assert_int_equal(want, (unsigned)(k + 127));
        n_exact++;
      }
    }
    assert_int_equal(n_exact, kind ? 199709 : 204936); /* the seeded draws in the normal range */
  }
  /* special amax values */
  assert_int_equal(hq_mxfp8_scale_code(0.0f, HQ_E4M3), 0);
  assert_int_equal(hq_mxfp8_scale_code(INFINITY, HQ_E4M3), 0xFE);
  assert_int_equal(hq_mxfp8_scale_code(INFINITY, HQ_E5M2), 0xFE);
  assert_int_equal(hq_mxfp8_scale_code(NAN, HQ_E4M3), 0xFF);
  assert_int_equal(hq_mxfp8_scale_code(FLT_MAX, HQ_E4M3), 247); /* 2^128/448 -> 2^120 */
  assert_int_equal(hq_mxfp8_scale_code(from_bits(1), HQ_E4M3), 0);
}

/* amax = max_norm * 2^k gives scale_inv exactly 2^k (448 * RN(1/448) rounds to 1.0). */
static void test_scale_of_max_norm_powers(void **state) {
  (void)state;
  for (int kind = 0; kind < 2; kind++) {
    float maxn = (float)ref_fp8_max(kind);
    assert_true(maxn * (1.0f / maxn) == 1.0f);
    for (int k = -127; k <= 127; k++) {
      float amax = ldexpf(maxn, k);
      if (isinf(amax)) continue; /* 448 * 2^127 overflows */
      unsigned e = hq_mxfp8_scale_code(amax, DT(kind));
      assert_int_equal(e, (unsigned)(k + 127));
      assert_true((double)hq_e8m0_to_f32((uint8_t)e) == ldexp(1.0, k));
      /* the block max maps exactly onto max_norm: no saturation, no rounding */
      assert_int_equal(hq_mxfp8_quantize(amax, hq_e8m0_quant_mult((uint8_t)e), DT(kind)),
                       kind ? 0x7B : 0x7E);
    }
    /* below 2^-127 the code clamps at 0 */
    assert_int_equal(hq_mxfp8_scale_code(ldexpf(maxn, -130), DT(kind)), 0);
  }
}

/* FORMATS.md 2.2's example: amax 500, E4M3 -> scale_inv 2 (not OCP's 1), 500 -> 250 -> 0x78
   (E4M3 256: exponent field 15, mantissa 0; 250 lies nearer 256 than 240). */
static void test_amax_500(void **state) {
  (void)state;
  uint8_t e = hq_mxfp8_scale_code(500.0f, HQ_E4M3);
  assert_int_equal(e, 128);
  assert_true(hq_e8m0_to_f32(e) == 2.0f);
  float mult = hq_e8m0_quant_mult(e);
  assert_true(hq_mul_rn(500.0f, mult) == 250.0f);
  uint8_t q = hq_mxfp8_quantize(500.0f, mult, HQ_E4M3);
  assert_int_equal(q, 0x78);
  assert_true(hq_mxfp8_dequantize(q, e, HQ_E4M3) == 512.0f);
  assert_int_equal(hq_mxfp8_quantize(-500.0f, mult, HQ_E4M3), 0xF8);
  /* 464 (would round to 480 > 448 under scale 1) also takes scale 2 */
  assert_int_equal(hq_mxfp8_scale_code(464.0f, HQ_E4M3), 128);
  /* one FP32 step above 448: still 2 */
  assert_int_equal(hq_mxfp8_scale_code(nextafterf(448.0f, 1000.0f), HQ_E4M3), 128);
  /* the element kind is the hq_dtype: HQ_E5M2 selects max 57344. 500/57344 -> 2^-6 (e 121);
     500 * 2^6 = 32000 -> E5M2 32768 (0x78; the step there is 4096); 57344 = 448 * 2^7 */
  assert_int_equal(hq_mxfp8_scale_code(500.0f, HQ_E5M2), 121);
  assert_int_equal(hq_mxfp8_quantize(500.0f, hq_e8m0_quant_mult(121), HQ_E5M2), 0x78);
  assert_int_equal(hq_mxfp8_scale_code(57344.0f, HQ_E4M3), 134);
  assert_int_equal(hq_mxfp8_scale_code(57344.0f, HQ_E5M2), 127);
  assert_true(hq_mxfp8_dequantize(0x7B, 127, HQ_E5M2) == 57344.0f);
  assert_true(hq_mxfp8_dequantize(0x7E, 127, HQ_E4M3) == 448.0f);
}

/* Element cast: random values over many binades against the reference, both kinds. */
static void test_element_cast_vs_reference(void **state) {
  (void)state;
  uint64_t s = 4242;
  for (int it = 0; it < 200000; it++) {
    int kind = it & 1;
    float x = ldexpf(hq_test_uniform(&s), (int)(hq_test_rand(&s) % 60) - 30);
    const float *p = &x;
    unsigned e = ref_block_code(&p, 1, kind);
    /* the block max of a block: every smaller element of a block also through the same scale */
    float y = ldexpf(hq_test_uniform(&s), -(int)(hq_test_rand(&s) % 30));
    float mult = hq_e8m0_quant_mult((uint8_t)e);
    assert_int_equal(hq_mxfp8_quantize(x, mult, DT(kind)), ref_elem(x, e, kind));
    assert_int_equal(hq_mxfp8_quantize(x * y, mult, DT(kind)), ref_elem(x * y, e, kind));
    uint8_t q = hq_mxfp8_quantize(x, mult, DT(kind));
    assert_true((double)hq_mxfp8_dequantize(q, (uint8_t)e, DT(kind)) ==
                (double)(float)(ref_fp8_decode(q, kind) * ldexp(1.0, (int)e - 127)));
  }
  /* NaN -> 0x7F; Inf in a block (e = 0xFE) -> +-max */
  assert_int_equal(hq_mxfp8_quantize(NAN, 1.0f, HQ_E4M3), 0x7F);
  float m = hq_e8m0_quant_mult(0xFE);
  assert_int_equal(hq_mxfp8_quantize(INFINITY, m, HQ_E4M3), 0x7E);
  assert_int_equal(hq_mxfp8_quantize(-INFINITY, m, HQ_E5M2), 0xFB);
  assert_int_equal(hq_mxfp8_quantize(1e30f, m, HQ_E4M3), 0x00);
  assert_true(isnan(hq_mxfp8_dequantize(0x38, 0xFF, HQ_E4M3)));
}

/* The FP8 casts the hot loops use (hq_f32_to_e4m3 / e5m2, branch-free) against the brute-force
   nearest-code encoder over FP32 bit patterns: a strided sweep of all 2^32 patterns, and every
   pattern of the top 12 bits combined with the low-bit patterns where RNE ties and carries happen
   for both formats. The NaN-ignoring |x| bits too. */
static void test_fp8_casts_bit_patterns(void **state) {
  (void)state;
  for (uint64_t v = 0; v <= 0xffffffffull; v += 4093) {
    float y = from_bits((uint32_t)v);
    if (hq_f32_to_e4m3(y) != ref_fp8_encode(y, 0)) fail_msg("e4m3 %08x", (unsigned)v);
    if (hq_f32_to_e5m2(y) != ref_fp8_encode(y, 1)) fail_msg("e5m2 %08x", (unsigned)v);
    uint32_t a = (uint32_t)v & 0x7fffffffu;
    assert_int_equal(hq_abs_bits_nonan(y), a > 0x7f800000u ? 0u : a);
  }
  const uint32_t low[] = {0x00000, 0x00001, 0x3ffff, 0x40000, 0x40001, 0x7ffff, 0x80000,
                          0x80001, 0xbffff, 0xc0000, 0xc0001, 0xfffff, 0x20000, 0x60000};
  for (uint32_t hi = 0; hi < 4096; hi++)
    for (size_t k = 0; k < sizeof low / sizeof low[0]; k++) {
      uint32_t v = (hi << 20) | low[k];
      float y = from_bits(v);
      if (hq_f32_to_e4m3(y) != ref_fp8_encode(y, 0)) fail_msg("e4m3 %08x", (unsigned)v);
      if (hq_f32_to_e5m2(y) != ref_fp8_encode(y, 1)) fail_msg("e5m2 %08x", (unsigned)v);
    }
}

/* The swizzle index function against the tile-walking description, for several logical sizes,
   and it is a bijection onto the padded buffer. */
/* The dequantize fast path (hq_mxfp8_dequantize_fast) equals hq_mxfp8_dequantize for every
   code that is not special and every scale code but NaN, both element kinds; the special codes
   are exactly the NaN (and E5M2 Inf) codes, found alone and in every byte of a packed word;
   hq_fp8_word_canon_nan makes exactly the special bytes 0x7F, one at a time in every byte and
   in 2^20 random words (any number of them per word). */
static void test_dequantize_fast_every_pair(void **state) {
  (void)state;
  for (int kd = 0; kd < 2; kd++) {
    const int kind = DT(kd);
    for (int q = 0; q < 256; q++) {
      const float v = hq_fp8_to_f32((uint8_t)q, kind);
      const int special = isnan(v) || isinf(v);
      assert_int_equal(hq_fp8_code_special((uint8_t)q, kind) != 0, special);
      for (int pos = 0; pos < 4; pos++) {
        /* the other three bytes: ordinary codes around the specials (0x7e/0x7b, 0xfe/0xfb) */
        const uint32_t fill = kd ? 0xfb7b7bfbu : 0xfe7e7efeu;
        const uint32_t w = (fill & ~(0xffu << (8 * pos))) | ((uint32_t)q << (8 * pos));
        assert_int_equal(hq_fp8_word_special(w, kind) != 0, special);
        /* the branch-free canonicalization: this byte becomes 0x7F when special, the others
           (never special) stay */
        const uint32_t want = special ? (w & ~(0xffu << (8 * pos))) | (0x7fu << (8 * pos)) : w;
        if (hq_fp8_word_canon_nan(w, kind) != want)
          fail_msg("kind %d word 0x%08x: canon 0x%08x, want 0x%08x", kind, w,
                   hq_fp8_word_canon_nan(w, kind), want);
      }
      if (special) continue;
      for (int e = 0; e < 255; e++) {
        const float want = hq_mxfp8_dequantize((uint8_t)q, (uint8_t)e, kind);
        const float got = hq_mxfp8_dequantize_fast((uint8_t)q, hq_e8m0_to_f32((uint8_t)e), kind);
        if (bits(want) != bits(got))
          fail_msg("kind %d code 0x%02x e %d: fast 0x%08x, rule 0x%08x", kind, q, e, bits(got),
                   bits(want));
      }
    }
  }
  uint32_t r = 12345u;
  for (int kd = 0; kd < 2; kd++)
    for (int n = 0; n < (1 << 20); n++) {
      r = r * 1664525u + 1013904223u;
      const uint32_t w = r ^ (r >> 7) * 0x01010101u; /* 3% hold an E4M3 special, 12% E5M2 */
      uint32_t want = 0;
      for (int pos = 0; pos < 4; pos++) {
        const uint8_t q = (uint8_t)(w >> (8 * pos));
        want |= (uint32_t)(hq_fp8_code_special(q, DT(kd)) ? 0x7fu : q) << (8 * pos);
      }
      if (hq_fp8_word_canon_nan(w, DT(kd)) != want)
        fail_msg("kind %d word 0x%08x: canon 0x%08x, want 0x%08x", DT(kd), w,
                 hq_fp8_word_canon_nan(w, DT(kd)), want);
    }
}

static void test_swizzle_idx(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{1, 1}, {128, 4}, {96, 3}, {256, 8}, {130, 5}, {384, 12},
                               {1000, 7}, {32, 1}};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
    int64_t R = shapes[n][0], C = shapes[n][1];
    int64_t Rp = ref_up(R, 128), Cp = ref_up(C, 4);
    /* S[r][c] = a unique id + 1 (ids fit as long as R*C < 255 ... use 16-bit here) */
    uint16_t *want = calloc((size_t)(Rp * Cp), 2);
    int order[128];
    for (int p = 0; p < 128; p++) order[p] = (p % 4) * 32 + p / 4;
    int64_t pos = 0;
    for (int64_t tr = 0; tr < Rp / 128; tr++)
      for (int64_t tc = 0; tc < Cp / 4; tc++)
        for (int p = 0; p < 128; p++)
          for (int cc = 0; cc < 4; cc++, pos++) {
            int64_t r = tr * 128 + order[p], c = tc * 4 + cc;
            want[pos] = (uint16_t)(r * Cp + c + 1);
          }
    uint8_t *seen = calloc((size_t)(Rp * Cp), 1);
    for (int64_t r = 0; r < Rp; r++)
      for (int64_t c = 0; c < Cp; c++) {
        int64_t off = hq_swizzle_offset(r, c, C);
        assert_true(off >= 0 && off < Rp * Cp);
        assert_int_equal(want[off], (uint16_t)(r * Cp + c + 1));
        assert_int_equal(seen[off], 0);
        seen[off] = 1;
      }
    free(seen);
    free(want);
  }
  /* hand-picked: rows 0,32,64,96 are the first 16 bytes of a tile; row 1 follows */
  assert_int_equal(hq_swizzle_offset(0, 0, 4), 0);
  assert_int_equal(hq_swizzle_offset(32, 0, 4), 4);
  assert_int_equal(hq_swizzle_offset(96, 3, 4), 15);
  assert_int_equal(hq_swizzle_offset(1, 0, 4), 16);
  assert_int_equal(hq_swizzle_offset(127, 3, 4), 511);
  assert_int_equal(hq_swizzle_offset(0, 4, 8), 512);    /* second tile along c */
  assert_int_equal(hq_swizzle_offset(128, 0, 8), 1024); /* next tile row: after 2 tiles */
  assert_int_equal(hq_swizzle_offset(128, 0, 5), 1024); /* 5 cols pad to 8 */
}

/* Per-direction index functions: compact = row-major with the padded row stride; swizzled =
   the swizzle of S (rowwise S[i][kb]; columnwise S[j][mb], the transpose). Shapes and sizes. */
static void test_scale_index_functions(void **state) {
  (void)state;
  const int64_t shapes[][2] = {{32, 32}, {96, 160}, {160, 96}, {256, 4096}, {4096, 256},
                               {32, 8192}};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
    int64_t M = shapes[n][0], K = shapes[n][1];
    int64_t rr = ref_up(M, 128), rc = ref_up(K / 32, 4), cr = ref_up(M / 32, 4),
            cc = ref_up(K, 128);
    assert_int_equal(hq_mxfp8_row_scale_rows(M), rr);
    assert_int_equal(hq_mxfp8_row_scale_cols(K), rc);
    assert_int_equal(hq_mxfp8_col_scale_rows(M), cr);
    assert_int_equal(hq_mxfp8_col_scale_cols(K), cc);
    for (int64_t i = 0; i < M; i++)
      for (int64_t kb = 0; kb < K / 32; kb++) {
        assert_int_equal(hq_mxfp8_row_scale_idx(i, kb, K, 0), i * rc + kb);
        int64_t sw = hq_mxfp8_row_scale_idx(i, kb, K, 1);
        assert_int_equal(sw, ((i / 128) * (rc / 4) + kb / 4) * 512 + (i % 32) * 16 +
                                 ((i % 128) / 32) * 4 + kb % 4);
        assert_true(sw < rr * rc);
      }
    for (int64_t mb = 0; mb < M / 32; mb++)
      for (int64_t j = 0; j < K; j++) {
        assert_int_equal(hq_mxfp8_col_scale_idx(mb, j, M, K, 0), mb * cc + j);
        int64_t sw = hq_mxfp8_col_scale_idx(mb, j, M, K, 1);
        assert_int_equal(sw, ((j / 128) * (cr / 4) + mb / 4) * 512 + (j % 32) * 16 +
                                 ((j % 128) / 32) * 4 + mb % 4);
        assert_true(sw < cr * cc);
      }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e8m0_decode_every_code),
      cmocka_unit_test(test_e8m0_reencode_every_code),
      cmocka_unit_test(test_e8m0_encode_specials),
      cmocka_unit_test(test_e8m0_quant_mult),
      cmocka_unit_test(test_scale_rule_vs_bruteforce),
      cmocka_unit_test(test_scale_of_max_norm_powers),
      cmocka_unit_test(test_amax_500),
      cmocka_unit_test(test_element_cast_vs_reference),
      cmocka_unit_test(test_fp8_casts_bit_patterns),
      cmocka_unit_test(test_dequantize_fast_every_pair),
      cmocka_unit_test(test_swizzle_idx),
      cmocka_unit_test(test_scale_index_functions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
