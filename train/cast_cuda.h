/*
** cast_cuda.h -- the trainer's FP32 <-> BF16 conversions on the GPU (train/cast_cuda.cu, built
** with CUDA): the bf16-direct run's BF16 operands (direct_cuda.cu) and --grad-dtype bf16's
** weight gradients, rounded to BF16 before NCCL's BF16 reduce-scatter and widened back to FP32
** after (dist.c), on the given stream, so that nothing goes through host memory.
*/
#ifndef HQ_TRAIN_CAST_CUDA_H
#define HQ_TRAIN_CAST_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[k] = hq_f32_to_bf16(src[k]) for k < n (round to nearest even, NaN kept quiet: the CPU
   path's rule bit for bit), enqueued on stream (a cudaStream_t). 0, or -1 with "what: CUDA's
   message" in err. */
int train_cuda_f32_to_bf16(void *stream, uint16_t *dst, const float *src, int64_t n,
                           const char *what, char *err, size_t err_len);
/* dst[k] = hq_bf16_to_f32(src[k]) for k < n (exact), enqueued on stream. */
int train_cuda_bf16_to_f32(void *stream, float *dst, const uint16_t *src, int64_t n,
                           const char *what, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* HQ_TRAIN_CAST_CUDA_H */
