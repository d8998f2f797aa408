/*
** adam_rule.h -- the one definition of an AdamW element update, shared by the CPU loop
** (core/optim.c) and the CUDA kernel (core/cuda/kernels.cu), so that both give the same bits:
** every operation is an IEEE FP32 operation in a fixed order (no contraction: the C side builds
** with -ffp-contract=off, nvcc with -fmad=false), and sqrtf is correctly rounded on both.
**
**   m' = b1 * m + (1 - b1) * g
**   v' = b2 * v + (1 - b2) * g * g
**   w' = w - lr * ((m' * c1) / (sqrt(v' * c2) + eps) + wd * w)
** with c1 = 1 / (1 - b1^t) and c2 = 1 / (1 - b2^t) computed once per step on the host (double,
** rounded to float) and passed in: decoupled weight decay (AdamW), bias-corrected moments.
*/
#ifndef HQ_ADAM_RULE_H
#define HQ_ADAM_RULE_H

#include "hq/numerics.h"

typedef struct hqi_adam_k {
  float lr, b1, b2, eps, wd;
  float one_minus_b1, one_minus_b2; /* 1 - b1, 1 - b2, rounded once */
  float c1, c2;                     /* bias corrections */
} hqi_adam_k;

#include <math.h> /* sqrtf: correctly rounded on the host and in CUDA device code (nvcc's
                      default -prec-sqrt=true; hq never builds with --use_fast_math) */
#define HQI_SQRTF(x) sqrtf(x)

HQ_HD void hqi_adam_elem(const hqi_adam_k *k, float g, float *w, float *m, float *v) {
  float mm = k->b1 * *m + k->one_minus_b1 * g;
  float gg = g * g;
  float vv = k->b2 * *v + k->one_minus_b2 * gg;
  float mh = mm * k->c1;
  float vh = vv * k->c2;
  float den = HQI_SQRTF(vh) + k->eps;
  float upd = mh / den + k->wd * *w;
  *w = *w - k->lr * upd;
  *m = mm;
  *v = vv;
}

#endif /* HQ_ADAM_RULE_H */
