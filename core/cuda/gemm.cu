/*
** gemm.cu -- the core's cuBLASLt runner (hq_host_api.lt_matmul). Placeholder until written.
*/
#include <stdint.h>

#include "hq/plugin.h"

extern "C" int hqi_error(int code, const char *fmt, ...);

extern "C" int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  (void)mm;
  return hqi_error(HQ_ENOTSUP, "cuBLASLt GEMMs are not written yet");
}
