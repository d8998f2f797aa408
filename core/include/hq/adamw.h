/*
** hq/adamw.h -- the AdamW element rule of hq_adam_step (hq/train.h): the one definition shared
** by the trainer services' CPU loop and CUDA kernel (libhqtrain) and by a format module's fused
** write-back (hq/plugin.h, HQ_CAP_FUSED_ADAM), so that every path gives the same bits. Plain
** FP32 code that compiles as C (host) and as CUDA (host + device), like hq/numerics.h.
**
** Every operation is an IEEE FP32 operation in this order (build C with -ffp-contract=off, CUDA
** with -fmad=false), sqrtf correctly rounded (nvcc's default -prec-sqrt=true; never
** --use_fast_math):
**   m' = b1 * m + (1 - b1) * g
**   v' = b2 * v + (1 - b2) * g * g
**   w' = w - lr * ((m' * c1) / (sqrt(v' * c2) + eps) + wd * w)
** with c1 = 1 / (1 - b1^t) and c2 = 1 / (1 - b2^t) computed once per step (hq_adam_consts, in
** hq/plugin.h: the fused write-back's hq_adam_pass carries them).
*/
#ifndef HQ_ADAMW_H
#define HQ_ADAMW_H

#include <math.h>
#include <stdint.h>

#include "hq/numerics.h" /* HQ_HD, hq_load_hp; hq/plugin.h for hq_adam_consts */

HQ_HD void hq_adam_elem(const hq_adam_consts *k, float g, float *w, float *m, float *v) {
  float mm = k->b1 * *m + k->one_minus_b1 * g;
  float gg = g * g;
  float vv = k->b2 * *v + k->one_minus_b2 * gg;
  float mh = mm * k->c1;
  float vh = vv * k->c2;
  float den = sqrtf(vh) + k->eps;
  float upd = mh / den + k->wd * *w;
  *w = *w - k->lr * upd;
  *m = mm;
  *v = vv;
}

/* hq_adam_elem on element i of the FP32 master w and moments m, v with gradient element i of g
   (dtype gdtype: HQ_F32, HQ_F16 or HQ_BF16), all written back; returns the new w[i] (what a
   write-back quantizes). */
HQ_HD float hq_adam_at(const hq_adam_consts *k, const void *g, int gdtype, float *w, float *m,
                       float *v, int64_t i) {
  float wi = w[i], mi = m[i], vi = v[i];
  hq_adam_elem(k, hq_load_hp(g, i, gdtype), &wi, &mi, &vi);
  w[i] = wi;
  m[i] = mi;
  v[i] = vi;
  return wi;
}

#endif /* HQ_ADAMW_H */
