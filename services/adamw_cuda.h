/*
** adamw_cuda.h -- the CUDA side of libhqtrain's AdamW (adamw_cuda.cu): one set of prototypes
** that the C file calling it and nvcc compiling it both include. Without CUDA, adamw.c defines
** them as stubs (a host context never reaches them).
*/
#ifndef HQ_ADAMW_CUDA_H
#define HQ_ADAMW_CUDA_H

#include <stdint.h>

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Make `device` current, remembering the caller's current device in *saved; hqt_cuda_leave(saved)
   puts it back (a host `device` does nothing). */
int hqt_cuda_enter(int device, int *saved);
void hqt_cuda_leave(int saved);
/* One AdamW step (hq_adam_at, hq/adamw.h) over the n elements of the FP32 master w and moments
   m, v with the gradient grad (dtype gdtype), on `stream` of the current device, with the
   constants *k, or *k_dev (device memory, read when the kernel runs) when k_dev is not NULL.
   amax_bits: NULL,
   or two words of device memory that are zeroed on the stream (unless `zeroed`: the caller's
   promise that they are zero then) and then receive, by atomic max into both, the FP32 bits of
   max |updated w| with NaN ignored (hq_abs_bits_nonan): the write-back's per-tensor amax, made
   in the same pass. */
int hqt_cuda_adam(void *stream, const hq_adam_consts *k, const hq_adam_consts *k_dev,
                  const void *grad, int gdtype, float *w, float *m, float *v, int64_t n,
                  unsigned int *amax_bits, int zeroed);

#ifdef __cplusplus
}
#endif
#endif /* HQ_ADAMW_CUDA_H */
