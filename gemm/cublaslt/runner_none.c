/*
** runner_none.c -- the cuBLASLt runner of a libhqcore built without CUDA: every matmul is
** refused, so that the providers built on it decline and the emulated path's CPU GEMM runs.
*/
#include "config.h"

#include "hqi_cuda.h"

int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  (void)mm;
  return hqi_error(HQ_ENOTSUP, "this libhqcore was built without CUDA: no cuBLASLt GEMM");
}
