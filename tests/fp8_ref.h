/*
** fp8_ref.h -- the tests' independent FP8 reference (E4M3 / E5M2), written from FORMATS.md 0.2
** and 0.3 in plain double arithmetic, sharing no code with hq/numerics.h:
**   decode from the sign/exponent/mantissa fields;
**   encode round-to-nearest-even with saturation by a binary search over the positive codes
**   (the nearest value, ties to the even code, |x| above max -> max, NaN -> 0x7F).
** kind: 0 = E4M3 (no Inf, S.1111.111 is NaN), 1 = E5M2 (IEEE-style Inf/NaN).
*/
#ifndef HQ_TESTS_FP8_REF_H
#define HQ_TESTS_FP8_REF_H

#include <math.h>

static inline double ref_fp8_decode(unsigned code, int kind) {
  int ebits = kind ? 5 : 4, mbits = kind ? 2 : 3, bias = kind ? 15 : 7;
  unsigned s = (code >> 7) & 1u, e = (code >> mbits) & ((1u << ebits) - 1u);
  unsigned m = code & ((1u << mbits) - 1u);
  if (kind && e == 31u) return m ? NAN : (s ? -INFINITY : INFINITY);
  if (!kind && e == 15u && m == 7u) return NAN;
  double v = e ? ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias)
               : ldexp((double)m, 1 - bias - mbits);
  return s ? -v : v;
}

static inline double ref_fp8_max(int kind) { return kind ? 57344.0 : 448.0; }

static inline unsigned ref_fp8_encode(double x, int kind) {
  if (isnan(x)) return 0x7f;
  unsigned sign = signbit(x) ? 0x80u : 0u;
  unsigned top = kind ? 0x7bu : 0x7eu;
  double a = fabs(x);
  if (a >= ref_fp8_max(kind)) return sign | top;
  unsigned lo = 0, hi = top; /* invariant: decode(lo) <= a < decode(hi) */
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (ref_fp8_decode(mid, kind) <= a) lo = mid;
    else hi = mid;
  }
  double dl = a - ref_fp8_decode(lo, kind), dh = ref_fp8_decode(hi, kind) - a;
  return sign | (dl < dh ? lo : dh < dl ? hi : ((lo & 1u) ? hi : lo));
}

#endif
