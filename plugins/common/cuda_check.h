/*
** cuda_check.h -- error checks of the stock plugins' CUDA code. Private to the stock plugins (not
** installed). Both return from the enclosing function with HQ_EDEVICE and a message naming the
** file, line and CUDA error, recorded through the call's host table.
**   CHECK_CUDA(call, expr)    a CUDA runtime call (cudaMemsetAsync, cudaMemcpyAsync, ...)
**   CHECK_LAUNCH(call, what)  after a kernel launch: cudaGetLastError()
*/
#ifndef HQ_CUDA_CHECK_H
#define HQ_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "hq/plugin.h"

#define CHECK_LAUNCH(call, what)                                                              \
  do {                                                                                        \
    cudaError_t e_ = cudaGetLastError();                                                      \
    if (e_ != cudaSuccess)                                                                    \
      return (call)->host->error(HQ_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, what,       \
                                 cudaGetErrorString(e_));                                     \
  } while (0)

#define CHECK_CUDA(call, expr)                                                                \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess)                                                                    \
      return (call)->host->error(HQ_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #expr,      \
                                 cudaGetErrorString(e_));                                     \
  } while (0)

#endif /* HQ_CUDA_CHECK_H */
