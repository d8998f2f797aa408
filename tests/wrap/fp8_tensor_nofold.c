/*
** fp8_tensor_nofold.c -- a test-only module "fp8_tensor_nofold": the stock fp8_tensor module
** (fp8_tensor.so, found on $HQ_PLUGIN_PATH) under another name and without HQ_CAP_DEQ_FACTOR,
** as a module written for ABI 2.1 or 2.2 is: its per-tensor factor comes only from
** tensor_factor(), never folded by its raw dequantize. test_gpu_gemm pairs it with modules that
** fold theirs (nvfp4), so that the core's emulated GEMM runs its tensor_factor() branches beside
** the folding ones. Built for make check only, into a folder of its own (tests/wrap), apart from
** the loader fixtures whose counts the loader tests check.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../hq_wrap.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

static uint64_t instance_caps(const void *cfg) {
  const uint64_t c = inner->instance_caps ? inner->instance_caps(cfg) : inner->caps;
  return c & ~HQ_CAP_DEQ_FACTOR;
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR) return NULL;
  const char *path = getenv("HQ_PLUGIN_PATH");
  char file[4200];
  file[0] = 0;
  for (const char *p = path; p && *p && !file[0];) {
    const size_t n = strcspn(p, ":");
    snprintf(file, sizeof file, "%.*s/fp8_tensor.so", (int)n, p);
    if (!n || access(file, F_OK) != 0) file[0] = 0;
    p += n + (p[n] == ':');
  }
  if (!file[0]) {
    host->error(HQ_ENOENT, "fp8_tensor.so not found on HQ_PLUGIN_PATH=%s", path ? path : "");
    return NULL;
  }
  if (!hq_wrap_module(host, file, &ops, &inner)) return NULL;
  ops.name = "fp8_tensor_nofold";
  ops.description = "test fixture: fp8_tensor without deq-factor (ABI 2.2 behaviour)";
  ops.caps &= ~HQ_CAP_DEQ_FACTOR;
  ops.instance_caps = instance_caps;
  return &ops;
}
