/* gemm.c -- placeholder while the GEMM dispatch is written */
#include "config.h"
#include "hq_internal.h"

#ifndef HQ_HAVE_CUDA
int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  (void)mm;
  return hqi_error(HQ_ENOTSUP, "this libhqcore was built without CUDA: no cuBLASLt GEMM");
}
#endif
