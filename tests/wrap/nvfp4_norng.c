/*
** nvfp4_norng.c -- a test-only module "nvfp4_norng": the stock nvfp4 module (nvfp4.so, found on
** $HQ_PLUGIN_PATH) under another name and without HQ_CAP_RNG_DEV, as a module written before
** ABI 2.6 is: its stochastic rounding draws only from the host's hq_call.offset, so that the core
** must refuse to capture it into a CUDA graph (test_gpu_rng_graph). In a folder of its own
** (tests/wrap/norng), apart from the modules other tests load from tests/wrap.
*/
#include "stock_module.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

static uint64_t instance_caps(const void *cfg) {
  const uint64_t c = inner->instance_caps ? inner->instance_caps(cfg) : inner->caps;
  return c & ~HQ_CAP_RNG_DEV;
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !(inner = stock_module(host, "nvfp4.so", &ops)))
    return NULL;
  ops.name = "nvfp4_norng";
  ops.description = "test fixture: nvfp4 without rng-dev (ABI 2.5 behaviour)";
  ops.caps &= ~HQ_CAP_RNG_DEV;
  ops.instance_caps = instance_caps;
  return &ops;
}
