/*
** adam_cuda.h -- the optimizer step alone, element by element (hq_adam_at), for a plugin whose
** fused write-back (HQ_CAP_FUSED_ADAM) gives each CTA a whole scaling block: on a tensor of few
** blocks that kernel leaves most SMs idle while each thread steps dozens of elements in
** sequence, so its latency, not its bytes, sets the time. Split there, this kernel steps the
** master over the whole GPU and the plugin's plain quantize then reads the new master: the same
** bits (the same hq_adam_elem per element), one more read of the master.
**
**   hq_cuda_adam(adam, w, n, stream)   w: the FP32 master's n elements, with adam's gradient and
**                                       moments at the same indices; queued on stream
*/
#ifndef HQ_ADAM_CUDA_H
#define HQ_ADAM_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

#include <hq/adamw.h>
#include <hq/plugin.h>

/* Elements a thread steps, at indices a block's width apart (each access coalesced across the
   warp; several loads in flight per thread). */
#define HQ_CUDA_ADAM_PER_THREAD 4
#define HQ_CUDA_ADAM_THREADS 256

template <int GT>
__global__ void __launch_bounds__(HQ_CUDA_ADAM_THREADS)
    hq_cuda_adam_kernel(float *w, const void *g, float *m, float *v, int64_t n,
                        hq_adam_consts k, const hq_adam_consts *kd) {
  /* a graph's replay reads this step's constants from the device (ABI 2.6) */
  const hq_adam_consts c = kd ? *kd : k;
  const int64_t base =
      (int64_t)blockIdx.x * (HQ_CUDA_ADAM_THREADS * HQ_CUDA_ADAM_PER_THREAD) + threadIdx.x;
#pragma unroll
  for (int j = 0; j < HQ_CUDA_ADAM_PER_THREAD; j++) {
    const int64_t i = base + (int64_t)j * HQ_CUDA_ADAM_THREADS;
    if (i < n) hq_adam_at(&c, g, GT, w, m, v, i);
  }
}

static inline cudaError_t hq_cuda_adam(const hq_adam_pass *adam, float *w, int64_t n,
                                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t per_block = HQ_CUDA_ADAM_THREADS * HQ_CUDA_ADAM_PER_THREAD;
  const int64_t blocks = (n + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const hq_adam_consts *kd = hq_adam_pass_k_dev(adam);
  switch (adam->grad_dtype) {
  case HQ_F32:
    hq_cuda_adam_kernel<HQ_F32><<<(unsigned)blocks, HQ_CUDA_ADAM_THREADS, 0, stream>>>(
        w, adam->grad, adam->m, adam->v, n, adam->k, kd);
    break;
  case HQ_F16:
    hq_cuda_adam_kernel<HQ_F16><<<(unsigned)blocks, HQ_CUDA_ADAM_THREADS, 0, stream>>>(
        w, adam->grad, adam->m, adam->v, n, adam->k, kd);
    break;
  default:
    hq_cuda_adam_kernel<HQ_BF16><<<(unsigned)blocks, HQ_CUDA_ADAM_THREADS, 0, stream>>>(
        w, adam->grad, adam->m, adam->v, n, adam->k, kd);
    break;
  }
  return cudaGetLastError();
}

#endif /* HQ_ADAM_CUDA_H */
