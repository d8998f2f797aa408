/*
** small_gemm.h -- which problems a stock module's own small GEMM kernel takes (nvfp4's and
** fp8_block's gemm ops): both run a CTA per square tile of D on compute capability 9.x and
** write D and read the bias in F32 or BF16. Private to the stock plugins (not installed); host.
*/
#ifndef HQ_SMALL_GEMM_H
#define HQ_SMALL_GEMM_H

#include <stdint.h>

#include "hq/plugin.h"

/* 1 when problem p fits such a kernel on call's device: compute capability 9.x (Hopper), m, n,
   k > 0, k <= max_k, m * n * k <= max_mnk (tested without forming the product, which a huge n
   would overflow), n tiles of `tile` within the grid's y (65535), D and the bias F32 or BF16.
   0 otherwise: the module declines and the core's paths take it. */
static inline int hq_small_gemm_fits(const hq_call *call, const hq_gemm_problem *p,
                                     int64_t max_mnk, int64_t max_k, int64_t tile) {
  const hq_host_api *h = call->host;
  const int arch = h->device_arch ? h->device_arch(call->device) : 0;
  return arch / 10 == 9 && p->m > 0 && p->n > 0 && p->k > 0 && p->k <= max_k &&
         p->m <= max_mnk / p->k && p->n <= max_mnk / p->k / p->m && p->n <= 65535 * tile &&
         (p->d->dtype == HQ_F32 || p->d->dtype == HQ_BF16) &&
         (!p->bias || p->bias_dtype == HQ_F32 || p->bias_dtype == HQ_BF16);
}

#endif /* HQ_SMALL_GEMM_H */
