/*
** fp8_tensor_nofold.c -- a test-only module "fp8_tensor_nofold": the stock fp8_tensor module
** (fp8_tensor.so, found on $HQ_PLUGIN_PATH) under another name and without HQ_CAP_DEQ_FACTOR,
** as a module written for ABI 2.1 or 2.2 is: its per-tensor factor comes only from
** tensor_factor(), never folded by its raw dequantize. test_gpu_gemm pairs it with modules that
** fold theirs (nvfp4), so that the core's emulated GEMM runs its tensor_factor() branches beside
** the folding ones. Built for make check only, into a folder of its own (tests/wrap), apart from
** the loader fixtures whose counts the loader tests check.
*/
#include "stock_module.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

static uint64_t instance_caps(const void *cfg) {
  const uint64_t c = inner->instance_caps ? inner->instance_caps(cfg) : inner->caps;
  return c & ~HQ_CAP_DEQ_FACTOR;
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !(inner = stock_fp8_tensor(host, &ops)))
    return NULL;
  ops.name = "fp8_tensor_nofold";
  ops.description = "test fixture: fp8_tensor without deq-factor (ABI 2.2 behaviour)";
  ops.caps &= ~HQ_CAP_DEQ_FACTOR;
  ops.instance_caps = instance_caps;
  return &ops;
}
