/*
** mx_rules.h -- the MXFP4 / MXFP6 rules (OCP Microscaling v1.0: E2M1, E3M2 or E2M3 elements, one
** E8M0 scale per 32 elements), shared by the plugins' CPU reference (mx.c) and CUDA kernels
** (mx.cu). Private to the plugins (not installed); host + device. docs/formats.md "MXFP4 and
** MXFP6" has the rules with worked examples.
*/
#ifndef HQ_MX_RULES_H
#define HQ_MX_RULES_H

#include "hq/numerics.h"
/* the Philox stream of stochastic rounding is NVFP4's, drawn for two 16-element halves */
#include "../nvfp4/nvfp4_rules.h"

#define HQ_MX_BLOCK 32

/* The element kinds, by the dtype of the data buffer: HQ_E2M1X2 (MXFP4), HQ_E3M2X4 or
   HQ_E2M3X4 (MXFP6). */
HQ_HD int hq_mx_bits(int kind) { return kind == HQ_E2M1X2 ? 4 : 6; }
/* emax: the exponent of the largest power of two of the element type (OCP's emax_elem; torchao's
   *_MAX_POW2): 2 for E2M1 and E2M3 (max 6, 7.5), 4 for E3M2 (max 28). */
HQ_HD int hq_mx_emax(int kind) { return kind == HQ_E3M2X4 ? 4 : 2; }
HQ_HD float hq_mx_max(int kind) {
  return kind == HQ_E2M1X2 ? HQ_E2M1_MAX : kind == HQ_E3M2X4 ? HQ_E3M2_MAX : HQ_E2M3_MAX;
}
/* Bytes of a row of n elements (n % 32 == 0): n/2 (FP4) or 3n/4 (FP6). */
HQ_HD int64_t hq_mx_row_bytes(int64_t n, int kind) {
  return kind == HQ_E2M1X2 ? n / 2 : n / 4 * 3;
}

/* Scale rules (option scale):
   HQ_MX_FLOOR (default): OCP v1.0 section 6.3 as torchao's to_mx computes it
     (ScaleCalculationMode.FLOOR), bit for bit: with A the block amax (max |x|, a NaN anywhere in
     the block makes A NaN),
       e = 0xFF                                  if A is NaN
       e = max(E(A) - emax, 0)                   else, E(A) the biased FP32 exponent field of A
                                                 (0 for zero and FP32 subnormals, 255 for Inf)
     so A / 2^(e-127) lies in [2^emax, 2^(emax+1)) and may exceed the element maximum: such
     elements saturate (6, 7.5 or 28);
   HQ_MX_RCEIL: the scale rounded up so that nothing saturates (torchao's RCEIL, TE's rule for
     MXFP8 with a division): t = RN(A / max), e = E8M0 of t rounded toward +Inf
     (hq_e8m0_from_f32_rp: Inf -> 0xFE), 0xFF if A is NaN. */
#define HQ_MX_FLOOR 0
#define HQ_MX_RCEIL 1

/* RCEIL without the division, where the quotient is a normal number: with A = 1.m * 2^E and
   max = c * 2^k (E2M1 1.5 * 2^2, E2M3 1.875 * 2^2, E3M2 1.75 * 2^4), A / max lies in
   [1, 2) * 2^(E - k) when 1.m >= c and in (1, 2) * 2^(E - k - 1) when 1.m < c, and RN(A / max)
   is a power of two only where 1.m = c: a step of 1.m (2^-23) moves the quotient by 2^-23 / c
   (or 2^-22 / c) of its binade, more than half its spacing, as c < 2. So the quotient rounded
   up to a power of two is 2^(E - k + (1.m > c)): the code is E's field - k, plus 1 where m > c's
   mantissa. Amaxes of an exponent field below k + 2 (where the quotient may be subnormal), zero
   and Inf take the division. tests/test_mx_numerics.c checks it against the division. */
HQ_HD uint8_t hq_mx_scale_code(float amax, int kind, int rule) {
  const uint32_t a = hq_f32_bits(amax) & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)HQ_E8M0_NAN;
  if (rule == HQ_MX_RCEIL) {
    const uint32_t mb = hq_f32_bits(hq_mx_max(kind)), k = (mb >> 23) - 127u, eb = a >> 23;
    if (eb >= k + 2u && a < 0x7f800000u)
      return (uint8_t)(eb - k + ((a & 0x7fffffu) > (mb & 0x7fffffu) ? 1u : 0u));
    return hq_e8m0_from_f32_rp(hq_div_rn(hq_fabs(amax), hq_mx_max(kind)));
  }
  const int e = (int)(a >> 23) - hq_mx_emax(kind);
  return (uint8_t)(e > 0 ? e : 0);
}

/* The encode multiplier of a block with scale code e: every element becomes
   cast(RN(x * mult)).
     e = 0xFF (a NaN block): 0, so finite elements become +-0 and NaN / Inf ones NaN (+max);
     e = 0 under FLOOR: 2^126, as torchao divides by max(2^(e-127), 2^-126) (its scale is
       clamped to the smallest normal FP32): such a block (A < 2^(emax-126)) dequantizes to half
       its values, torchao's behaviour, kept for bit agreement;
     else 2^(127-e) (hq_e8m0_quant_mult; e = 0 under RCEIL gives 2^127, where torchao's RCEIL
       multiplies by 1: a block with A <= max * 2^-127 is all zero there).
   x * 2^(127-e) equals torchao's x / 2^(e-127): both are the exact quotient rounded once. */
HQ_HD float hq_mx_encode_mult(uint8_t e, int rule) {
  if (e == 0xFFu) return 0.0f;
  if (e == 0 && rule == HQ_MX_FLOOR) return 0x1p126f;
  return hq_e8m0_quant_mult(e);
}

/* The fast forms of the RN cast that the CUDA kernels run, each the same code as hq_mx_cast(RN(x *
   hq_mx_encode_mult(e, rule)), kind) for every block that is not a NaN block (e != 0xFF; a NaN
   block takes hq_mx_cast itself). tests/test_mx_numerics.c checks them against hq_mx_cast.
   E2M1: hq_mx_e2m1_biased(v) is hq_e2m1_biased_bits_lt7(|v|) saturated at code 7 (one
     three-input min on the GPU): HQ_E2M1_BIAS_BITS + the code of |v| for every v not NaN (Inf
     included), so that a kernel packs the biased codes, subtracts the bias once per word and
     adds v's sign bits (bit 3 of each nibble is clear).
   FP6: an FP8 type with as many mantissa bits and a wider exponent has the FP6 grid, subnormals
     included, scaled by a power of two: E5M2 (bias 15) is E3M2 (bias 3) times 2^-12, E4M3
     (bias 7) is E2M3 (bias 1) times 2^-6 -- same mantissa width, and the FP8 subnormal step
     2^-16 / 2^-9 is the FP6 one (2^-4 / 2^-3) times that power. So the FP6 code of v is the FP8
     code (RNE, satfinite) of v * 2^-12 / 2^-6 with its magnitude bits clipped at 31 (the FP8
     exponent field then equals the FP6 one and the codes' low 5 bits coincide; beyond the FP6
     maximum, Inf included, the FP8 code is larger and the clip saturates) and its sign moved
     from bit 7 to bit 5. The power of two is folded into the multiplier (hq_mx_fp6_fp8_mult:
     2^-139 .. 2^115, exact): RN(x * m * 2^-s) = RN(x * m) * 2^-s wherever the products are
     normal FP32 numbers, and where either is not, |x * m| < 2^(-126 + s) lies far below half
     the smallest FP6 step and both forms give a zero code with x's sign. */
HQ_HD uint32_t hq_mx_e2m1_biased(float v) {
#if defined(__CUDA_ARCH__)
  const float y = fabsf(v);
  return __vimin3_u32(hq_f32_bits(__fmaf_rn(y, 2.0f, HQ_E2M1_SUM1)),
                      hq_f32_bits(__fadd_rn(y, HQ_E2M1_SUM2)), HQ_E2M1_SAT_BITS);
#else
  const uint32_t b = hq_e2m1_biased_bits_lt7(hq_fabs(v));
  return b < HQ_E2M1_SAT_BITS ? b : HQ_E2M1_SAT_BITS;
#endif
}
HQ_HD int hq_mx_fp6_fp8_elem(int kind) { return kind == HQ_E3M2X4 ? HQ_E5M2 : HQ_E4M3; }
HQ_HD float hq_mx_fp6_fp8_mult(uint8_t e, int rule, int kind) {
  return hq_mul_rn(hq_mx_encode_mult(e, rule), kind == HQ_E3M2X4 ? 0x1p-12f : 0x1p-6f);
}
/* Four FP8 codes (byte k) of the scaled values into their four FP6 codes (byte k). */
HQ_HD uint32_t hq_mx_fp6_of_fp8x4(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return __vminu4(w & 0x7f7f7f7fu, 0x1f1f1f1fu) | ((w >> 2) & 0x20202020u);
#else
  uint32_t r = 0;
  for (int k = 0; k < 4; k++) {
    const uint32_t b = (w >> (8 * k)) & 0xffu, m = b & 0x7fu;
    r |= ((m < 31u ? m : 31u) | ((b >> 2) & 0x20u)) << (8 * k);
  }
  return r;
#endif
}
/* The same for the four FP8 codes of values of a block whose amax is finite (no Inf, no NaN),
   packed at once into their 24 bits (hq_fp6_pack4). There every |RN(x * mult)| is below
   2^(emax+1) (FLOOR) or at most the element maximum rounded once (RCEIL), so each FP8 magnitude
   code is at most 32 (2^(emax+1) times 2^-12 or 2^-6), and the clip at 31 is the subtraction of
   the byte's bit 5 (set only for 32: no borrow). The packing moves bytes 0 and 2 up by 2 bits
   (b + 3 * those bytes: two 12-bit pairs), then the low pair up by 4 (+ 15 * it), and takes the
   24 bits at bit 6 -- two multiply-adds instead of a shift and mask per code. */
HQ_HD uint32_t hq_mx_fp6x4_of_fp8x4_fin(uint32_t w) {
  const uint32_t c = w - ((w >> 5) & 0x01010101u);
  const uint32_t b = (c & 0x1f1f1f1fu) | ((c >> 2) & 0x20202020u);
  const uint32_t p = b + (b & 0x00ff00ffu) * 3u;
  return (p + (p & 0x0000ffffu) * 15u) >> 6;
}
/* The fast form's code of one value x of a block with scale code e != 0xFF. */
HQ_HD uint32_t hq_mx_cast_fast(float x, uint8_t e, int kind, int rule) {
  if (kind == HQ_E2M1X2) {
    const float v = hq_mul_rn(x, hq_mx_encode_mult(e, rule));
    return (hq_mx_e2m1_biased(v) - HQ_E2M1_BIAS_BITS) | ((hq_f32_bits(v) >> 28) & 8u);
  }
  const float u = hq_mul_rn(x, hq_mx_fp6_fp8_mult(e, rule, kind));
  return hq_mx_fp6_of_fp8x4(hq_f32_to_fp8(u, hq_mx_fp6_fp8_elem(kind)));
}

/* The packed form of the E2M1 RN cast for a BF16 input, two elements per instruction: the
   two-sum form above done in BF16x2 arithmetic (fma.rn.bf16x2: the exact a * b + c rounded
   once to BF16). The constants are hq_e2m1_biased_bits_lt7's scaled from 2^24 to 2^8 (BF16 has
   8 significant bits as FP32 has 24): p1 = RN(2|v| + 250) and p2 = RN(|v| + 252) land in
   [128, 256) (step 1) or [256, 512) (step 2) exactly as the FP32 sums land about 2^24, so
   min(p1, p2, 258) as BF16 bits is HQ_MX_E2M1_BF16_BIAS + the code of |v| for every |v| < 8
   and for Inf, v = x * mult the exact product (x a BF16 value, mult a power of two: the product
   is the rule's RN(x * mult) wherever that is a normal FP32 number, and below 2^-126 both round
   to code 0). The multiplier enters the multiply-add as BF16 (2 * mult for p1), so the form
   needs 2 * mult <= 2^127: every scale code but e = 0 under RCEIL (mult 2^127), and no NaN
   block (hq_mx_e2m1_bf16_ok). */
#define HQ_MX_E2M1_BF16_SUM1 0x437au /* BF16 250 = 2^8 - 6: code 0 */
#define HQ_MX_E2M1_BF16_SUM2 0x437cu /* BF16 252 = 2^8 - 4 */
#define HQ_MX_E2M1_BF16_SAT 0x4381u  /* BF16 258 = 2^8 + 2: code 7 */
#define HQ_MX_E2M1_BF16_BIAS HQ_MX_E2M1_BF16_SUM1
HQ_HD int hq_mx_e2m1_bf16_ok(uint8_t e, int rule) {
  return e != 0xFFu && !(e == 0 && rule == HQ_MX_RCEIL);
}
/* The BF16 bits of the multiplier of a block with hq_mx_e2m1_bf16_ok (twice = 1: of 2 * mult),
   in both halves of the word, by integer arithmetic: mult = 2^(127 - e), and e = 0 under FLOOR
   has e = 1's (2^126); 2 * mult has the BF16 exponent field 255 - e, mult 254 - e but for
   e = 254, whose 2^-127 is the BF16 subnormal 0x0040. */
HQ_HD uint32_t hq_mx_bf16_mult2(uint8_t e, int twice) {
  const uint32_t ee = e > 1u ? e : 1u;
  const uint32_t b = twice ? (255u - ee) << 7 : ee == 254u ? 0x40u : (254u - ee) << 7;
  return b * 0x10001u;
}
/* fma.rn.bf16x2 of the word pairs (a * b + c per 16-bit lane). The host form rounds the FP32
   sum of an FP32 product, which is the single rounding here: a has 8 significant bits and b is
   a power of two, so the product is exact (or far below 1), and the sum is exact wherever it
   can lie near a BF16 tie (c = 250 or 252). */
HQ_HD uint32_t hq_mx_bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const float p = hq_mul_rn(hq_bf16_to_f32((uint16_t)(a >> h)), hq_bf16_to_f32((uint16_t)(b >> h)));
    d |= (uint32_t)hq_f32_to_bf16(hq_add_rn(p, hq_bf16_to_f32((uint16_t)(c >> h)))) << h;
  }
  return d;
#endif
}
/* The unsigned 16-bit lanewise min of three words (one DPX instruction on sm_90). */
HQ_HD uint32_t hq_mx_min3_u16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __vimin3_u16x2(a, b, c);
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    uint32_t x = (a >> h) & 0xffffu, y = (b >> h) & 0xffffu, z = (c >> h) & 0xffffu;
    x = x < y ? x : y;
    d |= (x < z ? x : z) << h;
  }
  return d;
#endif
}
/* Bytes of (a, b) chosen by s: CUDA's __byte_perm without its sign modes. */
HQ_HD uint32_t hq_mx_prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t ab = (uint64_t)b << 32 | a;
  uint32_t d = 0;
  for (int k = 0; k < 4; k++) d |= (uint32_t)((ab >> (8 * ((s >> (4 * k)) & 7u))) & 0xffu) << (8 * k);
  return d;
#endif
}
/* The E2M1 codes of 8 consecutive BF16 elements (w: 4 words, element 2j in the low half of
   w[j]), each pair j with its multiplier words m1[j] (mult) and m2[j] (2 * mult) from
   hq_mx_bf16_mult2, as the packed word (element k in nibble k): hq_mx_cast(RN(x * mult)) of each
   for a block with hq_mx_e2m1_bf16_ok. The biased lanes of pairs 2i and 2i + 1 are joined by one
   multiply-add (lanes at bytes 0, 2 and 1, 3; a code + sign < 16 never carries), unbiased at
   once, given their signs (the elements' sign bits gathered by a byte permute, moved to bit 3),
   and each byte's two nibbles folded by one shift-add. */
HQ_HD uint32_t hq_mx_e2m1x8_bf16(const uint32_t w[4], const uint32_t m1[4], const uint32_t m2[4]) {
  uint32_t q[4];
  for (int j = 0; j < 4; j++) {
    const uint32_t a = w[j] & 0x7fff7fffu;
    q[j] = hq_mx_min3_u16x2(hq_mx_bf16x2_fma(a, m2[j], HQ_MX_E2M1_BF16_SUM1 * 0x10001u),
                            hq_mx_bf16x2_fma(a, m1[j], HQ_MX_E2M1_BF16_SUM2 * 0x10001u),
                            HQ_MX_E2M1_BF16_SAT * 0x10001u);
  }
  /* the bias of four lanes at bytes 0, 2 (one word) and 1, 3 (the next, times 256) */
  const uint32_t bias4 = HQ_MX_E2M1_BF16_BIAS * 0x10001u + HQ_MX_E2M1_BF16_BIAS * 0x1000100u;
  uint32_t h[2];
  for (int i = 0; i < 2; i++) {
    /* elements 4i, 4i + 2, 4i + 1, 4i + 3 in bytes 0..3: their sign bits (bit 15 or 31 of the
       input words) at bit 7 of those bytes, then bit 3 */
    const uint32_t s = (hq_mx_prmt(w[2 * i], w[2 * i + 1], 0x7351u) >> 4) & 0x08080808u;
    const uint32_t c = q[2 * i] + q[2 * i + 1] * 256u - bias4 + s;
    h[i] = c + (c >> 12); /* bytes 2, 3 onto the high nibbles of bytes 0, 1 */
  }
  return hq_mx_prmt(h[0], h[1], 0x5410u);
}

/* The packed form of the FP6 RN cast for a BF16 input, two elements per instruction, through
   the FP8 convert of F16 pairs (cvt.rn.satfinite.e4m3x2 / e5m2x2.f16x2, which sm_90 has; its
   BF16-pair form does not exist). As in hq_mx_cast_fast, the FP6 code of v = RN(x * mult) is the
   FP8 code of t = v * 2^-s (s = 6: E4M3 for E2M3, s = 12: E5M2 for E3M2), the magnitude clipped
   at 31. With mult = 2^(127 - e) (both rules for e >= 1) t is x * 2^(127 - e - s): x's 8
   significant bits with its exponent moved, so where t is a normal F16 number its bits are x's
   magnitude bits minus D << 7 (D = e + s - 15, the biases' and exponents' difference), shifted
   up 3 places (F16 has 3 more mantissa bits) -- integer arithmetic on the 16-bit lanes, exact.
   One DPX instruction per pair (__viaddmin_s16x2_relu: max(min(a + b, c), 0) per lane) adds
   -D << 7, clamps at zero and at CAP, the lane of the element maximum (7.5 or 28 times 2^-s):
     above CAP the cast saturates to code 31, which CAP's convert gives;
     below 1 << 7 (t < 2^-14, so |v| < 2^-8 for E2M3) the lane is not t's, but everything
       there, x's subnormals included, converts to FP8 code 0 (the lane, read as F16, and t are
       both below half the smallest FP8 step), the rule's code, as zero (the clamp) gives;
     and the sum never wraps (|x| bits < 2^15, 0 <= D << 7 < 2^15).
   E5M2's step below 2^-14 is 2^-16, so E3M2's subnormals need t below the F16 normals: its lane
   holds t * 2^4 (D = e - 7, CAP 28 * 2^-8), and one F16 multiply by 2^-4 gives t, the exact
   product rounded once (the F16 grid there, 2^-24, is finer than E5M2's; only t < 2^-17, which
   is code 0 either way, may round). The sign is x's (also of a zero code), put at bit 5 of each
   FP8 magnitude byte (all below 32: the clamp) from a byte permute that replicates the sign
   bit of the elements' high bytes. Valid for every finite x of a block with scale code e >= 9
   (E2M3) or e >= 7 (E3M2), either rule (hq_mx_fp6_bf16_ok: D >= 0), i.e. every element of such
   a block with a finite amax; lower codes (amax below about 2^-116) keep hq_mx_cast_fast. An
   Inf reads as 2^128, which is not beyond the maximum at the codes of blocks that hold one
   (FLOOR 253 for E2M3, 251 for E3M2; RCEIL 254), so those keep the rule, as they do with
   hq_mx_cast_fast. */
#define HQ_MX_E2M3_BF16_CAP 0x05f0u /* F16 7.5 * 2^-6 = 0x2f80, >> 3 */
#define HQ_MX_E3M2_BF16_CAP 0x05e0u /* F16 28 * 2^-8 = 0x2f00, >> 3 */
#define HQ_MX_F16X2_2EM4 0x2c002c00u /* F16 2^-4, both halves */
HQ_HD uint32_t hq_mx_fp6_bf16_emin(int kind) { return kind == HQ_E3M2X4 ? 7u : 9u; }
HQ_HD int hq_mx_fp6_bf16_ok(uint8_t e, int kind) {
  return e != 0xFFu && e >= hq_mx_fp6_bf16_emin(kind);
}
/* The lane word -D << 7 of a block with hq_mx_fp6_bf16_ok (one lane; times 0x10001 for both) */
HQ_HD uint32_t hq_mx_fp6_bf16_nd(uint8_t e, int kind) {
  return (0u - (((uint32_t)e - hq_mx_fp6_bf16_emin(kind)) << 7)) & 0xffffu;
}
/* max(min(a + b, c), 0) per signed 16-bit lane, the sum wrapping (one DPX instruction) */
HQ_HD uint32_t hq_mx_viaddmin_s16x2_relu(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __viaddmin_s16x2_relu(a, b, c);
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const int32_t x = (int16_t)(uint16_t)(((a >> h) + (b >> h)) & 0xffffu);
    const int32_t z = (int16_t)(uint16_t)((c >> h) & 0xffffu);
    const int32_t m = x < z ? x : z;
    d |= (uint32_t)(m > 0 ? m : 0) << h;
  }
  return d;
#endif
}
/* mul.rn.f16x2 (subnormals kept). The host form rounds the FP32 product, exact for F16 factors
   (11 significant bits each), once to F16. */
HQ_HD uint32_t hq_mx_f16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const float p = hq_mul_rn(hq_f16_to_f32((uint16_t)(a >> h)), hq_f16_to_f32((uint16_t)(b >> h)));
    d |= (uint32_t)hq_f32_to_f16(p) << h;
  }
  return d;
#endif
}
/* cvt.rn.satfinite.{e4m3x2, e5m2x2}.f16x2 (FP8 elem HQ_E4M3 / HQ_E5M2) of two F16 pairs: the
   four FP8 codes, a's low half in byte 0, b's high half in byte 3 (one word, as the convert
   writes it). F16 to FP32 is exact, so the host form is the FP32 rule. */
HQ_HD uint32_t hq_mx_fp8x4_of_f16x4(uint32_t a, uint32_t b, int elem) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if (elem == HQ_E5M2)
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e5m2x2.f16x2 lo, %1;\n"
        "cvt.rn.satfinite.e5m2x2.f16x2 hi, %2;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(d) : "r"(a), "r"(b));
  else
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f16x2 lo, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f16x2 hi, %2;\n"
        "mov.b32 %0, {lo, hi};\n}"
        : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int k = 0; k < 4; k++) {
    const uint16_t h = (uint16_t)((k < 2 ? a : b) >> (16 * (k & 1)));
    d |= (uint32_t)hq_f32_to_fp8(hq_f16_to_f32(h), elem) << (8 * k);
  }
  return d;
#endif
}
/* prmt.b32 in its default mode: selector nibble k picks byte (k & 7) of (a, b), and with bit 3
   set replicates that byte's bit 7 over the result byte. */
HQ_HD uint32_t hq_mx_prmt_sx(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
#else
  const uint64_t ab = (uint64_t)b << 32 | a;
  uint32_t d = 0;
  for (int k = 0; k < 4; k++) {
    const uint32_t n = (s >> (4 * k)) & 15u, y = (uint32_t)(ab >> (8 * (n & 7u))) & 0xffu;
    d |= ((n & 8u) ? ((y >> 7) ? 0xffu : 0u) : y) << (8 * k);
  }
  return d;
#endif
}
/* The FP6 codes of 8 consecutive BF16 elements (w: 4 words, element 2j in the low half of w[j]),
   pair j with its lane word nd[j] (hq_mx_fp6_bf16_nd of its two elements' blocks), packed as
   hq_fp6_pack4 packs them (element k at bits 6k .. 6k + 5): hq_mx_cast(RN(x * mult)) of each, for
   finite x of blocks with hq_mx_fp6_bf16_ok. The FP8 pairs of pairs 2i, 2i + 1 are one word of 4 magnitude
   bytes; with their signs, the bytes are packed 6 bits apart by the two multiply-adds of
   hq_mx_fp6x4_of_fp8x4_fin. */
HQ_HD uint64_t hq_mx_fp6x8_bf16(const uint32_t w[4], const uint32_t nd[4], int kind) {
  const uint32_t cap = (kind == HQ_E3M2X4 ? HQ_MX_E3M2_BF16_CAP : HQ_MX_E2M3_BF16_CAP) * 0x10001u;
  uint32_t f[4];
  for (int j = 0; j < 4; j++) {
    f[j] = hq_mx_viaddmin_s16x2_relu(w[j] & 0x7fff7fffu, nd[j], cap) << 3;
    if (kind == HQ_E3M2X4) f[j] = hq_mx_f16x2_mul(f[j], HQ_MX_F16X2_2EM4);
  }
  uint32_t q[2];
  for (int i = 0; i < 2; i++) {
    /* elements 4i .. 4i + 3 in bytes 0..3; their sign bits are bit 7 of bytes 1, 3 of the words */
    const uint32_t m = hq_mx_fp8x4_of_f16x4(f[2 * i], f[2 * i + 1], hq_mx_fp6_fp8_elem(kind));
    const uint32_t s = hq_mx_prmt_sx(w[2 * i], w[2 * i + 1], 0xFDB9u);
    const uint32_t b = m | (s & 0x20202020u);
    const uint32_t p = b + (b & 0x00ff00ffu) * 3u;
    q[i] = (p + (p & 0x0000ffffu) * 15u) >> 6;
  }
  return (uint64_t)q[0] | (uint64_t)q[1] << 24;
}

/* One element, round to nearest even (saturating to +-max; NaN -> +max), or stochastically from
   the random byte r8. */
HQ_HD uint32_t hq_mx_cast(float v, int kind) {
  return kind == HQ_E2M1X2 ? hq_f32_to_e2m1(v) : hq_f32_to_fp6(v, kind);
}
HQ_HD uint32_t hq_mx_cast_sr(float v, int kind, uint32_t r8) {
  return kind == HQ_E2M1X2 ? hq_f32_to_e2m1_sr(v, r8) : hq_f32_to_fp6_sr(v, kind, r8);
}
HQ_HD float hq_mx_elem_to_f32(uint32_t code, int kind) {
  return kind == HQ_E2M1X2 ? hq_e2m1_to_f32(code) : hq_fp6_to_f32(code, kind);
}

/* An element's value v scaled by E8M0 code e: RN(v * 2^(e-127)) (hq_e8m0_to_f32: e = 0 is
   2^-127). A NaN scale (0xFF) gives the canonical quiet NaN 0x7fc00000 itself, not a product:
   the host propagates the NaN operand's bits through a multiply and the GPU returns 0x7fffffff,
   and the CPU reference and the kernels must agree bit for bit. */
HQ_HD float hq_mx_scaled(float v, uint8_t e) {
  return e == 0xFFu ? hq_bits_f32(0x7fc00000u) : hq_mul_rn(v, hq_e8m0_to_f32(e));
}

/* Dequantize: x' = hq_mx_scaled(elem(q), e). */
HQ_HD float hq_mx_dequantize(uint32_t code, uint8_t e, int kind) {
  return hq_mx_scaled(hq_mx_elem_to_f32(code, kind), e);
}

/* The dequantize in BF16 arithmetic, two elements at once (the dequantize kernel's BF16 output and
   the fused GEMM's A fragments). An element's magnitude bits (exponent, then mantissa) moved to
   the top of a BF16 word's exponent and mantissa fields -- BF16 subnormals for the element's
   subnormals -- give the element's value times 2^(bias - 127), bias 1 (E2M1, E2M3) or 3 (E3M2):
   exact for every code. Times 2^(127 - bias) it is the value itself (a normal BF16 number, exact),
   and times 2^(e - 127) (BF16 normal for e >= 1, the subnormal 2^-127 for e = 0) it is the exact
   product rounded once to BF16, which is hq_f32_to_bf16(hq_mx_dequantize(code, e, kind)): the
   FP32 product is exact wherever it is at least 2^-146 (at most 4 significant bits), and below
   that both round to zero. The two factors join into one, 2^(e - bias), where that is a BF16
   normal: e <= 127 + bias (hq_mx_bf16_one_max). A NaN scale (0xFF) takes the rule itself. */
HQ_HD int hq_mx_bias(int kind) { return kind == HQ_E3M2X4 ? 3 : 1; }
HQ_HD uint32_t hq_mx_bf16_one_max(int kind) { return 127u + (uint32_t)hq_mx_bias(kind); }
/* Codes lo and hi, c = lo | hi << 16 (other bits of c ignored), as the BF16 pair of their values
   times 2^(bias - 127). */
HQ_HD uint32_t hq_mx_bf16_raw2(uint32_t c, int kind) {
  const int w = hq_mx_bits(kind), mb = kind == HQ_E2M1X2 ? 1 : kind == HQ_E3M2X4 ? 2 : 3;
  const uint32_t mag = ((1u << (w - 1)) - 1u) * 0x10001u, sgn = (1u << (w - 1)) * 0x10001u;
  return ((c & mag) << (7 - mb)) | ((c & sgn) << (16 - w));
}
/* The BF16 pair 2^(127 - bias) (the raw pair's factor to the values) */
HQ_HD uint32_t hq_mx_bf16_pre2(int kind) { return ((254u - (uint32_t)hq_mx_bias(kind)) << 7) * 0x10001u; }
/* The BF16 pair 2^(e - 127), e != 0xFF */
HQ_HD uint32_t hq_mx_bf16_scale2(uint8_t e) { return (e ? (uint32_t)e << 7 : 0x40u) * 0x10001u; }
/* The BF16 pair 2^(e - bias), e <= hq_mx_bf16_one_max(kind) */
HQ_HD uint32_t hq_mx_bf16_one2(uint8_t e, int kind) {
  return (((uint32_t)e + 127u - (uint32_t)hq_mx_bias(kind)) << 7) * 0x10001u;
}
/* mul.rn.bf16x2 as a multiply-add of -0 (a * b + -0 is a * b, signed zeros included) */
HQ_HD uint32_t hq_mx_bf16x2_mul(uint32_t a, uint32_t b) { return hq_mx_bf16x2_fma(a, b, 0x80008000u); }
/* The BF16 pair of hq_f32_to_bf16(hq_mx_dequantize(code, e, kind)) of the two codes of c
   (hq_mx_bf16_raw2's form). */
HQ_HD uint32_t hq_mx_dequantize_bf16x2(uint32_t c, uint8_t e, int kind) {
  if (e == 0xFFu) return (uint32_t)hq_f32_to_bf16(hq_mx_scaled(0.0f, e)) * 0x10001u;
  const uint32_t r = hq_mx_bf16_raw2(c, kind);
  if (e <= hq_mx_bf16_one_max(kind)) return hq_mx_bf16x2_mul(r, hq_mx_bf16_one2(e, kind));
  return hq_mx_bf16x2_mul(hq_mx_bf16x2_mul(r, hq_mx_bf16_pre2(kind)), hq_mx_bf16_scale2(e));
}

/* Code n of a packed row. */
HQ_HD uint32_t hq_mx_code(const uint8_t *row, int64_t n, int kind) {
  if (kind == HQ_E2M1X2) return (row[n >> 1] >> (4 * (n & 1))) & 15u;
  return hq_fp6_code(row, n);
}

/* 32 codes of one block into their packed bytes (16 for FP4, 24 for FP6) at dst. */
HQ_HD void hq_mx_pack32(uint8_t *dst, const uint32_t c[32], int kind) {
  if (kind == HQ_E2M1X2) {
    for (int i = 0; i < 16; i++) dst[i] = (uint8_t)((c[2 * i] & 15u) | (c[2 * i + 1] & 15u) << 4);
    return;
  }
  for (int g = 0; g < 8; g++) {
    const uint32_t w = hq_fp6_pack4(c[4 * g], c[4 * g + 1], c[4 * g + 2], c[4 * g + 3]);
    dst[3 * g] = (uint8_t)w;
    dst[3 * g + 1] = (uint8_t)(w >> 8);
    dst[3 * g + 2] = (uint8_t)(w >> 16);
  }
}

/* Stochastic rounding: the 32 random bytes of a block are NVFP4's stream (hq_nvfp4_sr_bits_rk:
   key = seed, counter = {block', direction, call offset}) at block' = 2b and 2b + 1, b the
   block's index in its direction: rowwise i * (K/32) + k/32, columnwise (i/32) * K + k (the
   index of its scale). Element e = 0..31 of the block (along the block) takes byte e % 16 of
   half e / 16. */
HQ_HD void hq_mx_sr_bits(const uint32_t rk[20], uint64_t offset, uint32_t colwise, uint64_t b,
                         uint32_t out[8]) {
  hq_nvfp4_sr_bits_rk(rk, offset, colwise, 2 * b, out);
  hq_nvfp4_sr_bits_rk(rk, offset, colwise, 2 * b + 1, out + 4);
}
HQ_HD uint32_t hq_mx_sr_byte(const uint32_t bits[8], int e) {
  return (bits[e >> 2] >> (8 * (e & 3))) & 0xffu;
}

/* Buffers of an [M, K] tensor (M % 32 == 0, K % 32 == 0), both directions stored [M, K]
   (the columnwise copy is not transposed):
     data (either direction)  [M, hq_mx_row_bytes(K)] bytes, element (i, k) code k of row i
     rowwise scale_inv        e8m0 [M, K/32]: (i, k) -> i * (K/32) + k/32
     columnwise_scale_inv     e8m0 [M/32, K]: (i, k) -> (i/32) * K + k */
HQ_HD int64_t hq_mx_scale_idx(int colwise, int64_t i, int64_t k, int64_t K) {
  return colwise ? (i / HQ_MX_BLOCK) * K + k : i * (K / HQ_MX_BLOCK) + k / HQ_MX_BLOCK;
}

#endif /* HQ_MX_RULES_H */
