/*
** identity.h -- shared between the identity format (identity.c) and its CUDA kernel
** (identity.cu), whichever way identity.c is built (into libhqcore or as a module). Not installed.
*/
#ifndef HQ_IDENTITY_H
#define HQ_IDENTITY_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fused optimizer write-back (HQ_CAP_FUSED_ADAM) on call->stream: for each of the n
   elements, one AdamW step (hq_adam_elem) on the FP32 master w with adam's gradient and moments,
   all written back, then the new master stored in dtype ot (F32, F16 or BF16, rounded as
   hq_store_hp rounds) into d0, and into d1 unless it is NULL; each element read once. */
int identity_cuda_adam_convert(const hq_call *call, const hq_adam_pass *adam, float *w, int64_t n,
                               void *d0, void *d1, hq_dtype ot);

#ifdef __cplusplus
}
#endif
#endif /* HQ_IDENTITY_H */
