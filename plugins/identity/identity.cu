/*
** identity.cu -- the identity format's one kernel: the fused optimizer write-back. Its element
** conversions are the host's convert service (the core's kernels), not kernels of its own.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "hq/adamw.h"
#include "hq/numerics.h"
#include "identity.h"

namespace {

/* The step (hq_adam_at, the AdamW rule of hq/adamw.h), then the new master stored in the
   storage's dtype OT into d0 (and d1 when the directions have two buffers), each element read
   once. */
template <int GT, int OT>
__global__ void adam_convert_kernel(hq_adam_consts k, const hq_adam_consts *__restrict__ kd,
                                    const void *__restrict__ g, float *__restrict__ w,
                                    float *__restrict__ m, float *__restrict__ v, int64_t n,
                                    void *__restrict__ d0, void *__restrict__ d1) {
  if (kd) k = *kd; /* ABI 2.6: the constants as they are when the kernel runs (a graph replay) */
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float wi = hq_adam_at(&k, g, GT, w, m, v, i);
    hq_store_hp(d0, i, OT, wi);
    if (d1) hq_store_hp(d1, i, OT, wi);
  }
}

template <int GT>
void launch(unsigned blocks, cudaStream_t s, const hq_adam_pass *a, float *w, int64_t n, void *d0,
            void *d1, int ot) {
  const hq_adam_consts *kd = hq_adam_pass_k_dev(a);
  if (ot == HQ_F32)
    adam_convert_kernel<GT, HQ_F32><<<blocks, 256, 0, s>>>(a->k, kd, a->grad, w, a->m, a->v, n,
                                                           d0, d1);
  else if (ot == HQ_F16)
    adam_convert_kernel<GT, HQ_F16><<<blocks, 256, 0, s>>>(a->k, kd, a->grad, w, a->m, a->v, n,
                                                           d0, d1);
  else
    adam_convert_kernel<GT, HQ_BF16><<<blocks, 256, 0, s>>>(a->k, kd, a->grad, w, a->m, a->v, n,
                                                            d0, d1);
}

} // namespace

extern "C" int identity_cuda_adam_convert(const hq_call *call, const hq_adam_pass *adam, float *w,
                                          int64_t n, void *d0, void *d1, hq_dtype ot) {
  cudaStream_t s = (cudaStream_t)call->stream;
  if (n <= 0) return HQ_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  if (adam->grad_dtype == HQ_F32) launch<HQ_F32>((unsigned)blocks, s, adam, w, n, d0, d1, ot);
  else if (adam->grad_dtype == HQ_F16) launch<HQ_F16>((unsigned)blocks, s, adam, w, n, d0, d1, ot);
  else launch<HQ_BF16>((unsigned)blocks, s, adam, w, n, d0, d1, ot);
  CHECK_LAUNCH(call, "identity adam write-back kernel");
  return HQ_OK;
}
