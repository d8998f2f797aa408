/*
** fp8_tensor_nofold.c -- a test-only module "fp8_tensor_nofold": the stock fp8_tensor module
** (fp8_tensor.so, found on $HQ_PLUGIN_PATH) under another name and without HQ_CAP_DEQ_FACTOR,
** as a module written for ABI 2.1 or 2.2 is: its per-tensor factor comes only from
** tensor_factor(), never folded by its raw dequantize. test_gpu_gemm pairs it with modules that
** fold theirs (nvfp4), so that the core's emulated GEMM runs its tensor_factor() branches beside
** the folding ones. Built for make check only, into a folder of its own (tests/wrap), apart from
** the loader fixtures whose counts the loader tests check.
*/
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hq/plugin.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

static uint64_t instance_caps(const void *cfg) {
  const uint64_t c = inner->instance_caps ? inner->instance_caps(cfg) : inner->caps;
  return c & ~HQ_CAP_DEQ_FACTOR;
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  const char *path = getenv("HQ_PLUGIN_PATH");
  void *h = NULL;
  char file[4200];
  for (const char *p = path; p && *p && !h;) {
    const size_t n = strcspn(p, ":");
    snprintf(file, sizeof file, "%.*s/fp8_tensor.so", (int)n, p);
    if (n) h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    p += n + (p[n] == ':');
  }
  if (!h) {
    host->error(HQ_ENOENT, "fp8_tensor.so not found on HQ_PLUGIN_PATH=%s", path ? path : "");
    return NULL;
  }
  hq_format_entry_fn entry = (hq_format_entry_fn)(uintptr_t)dlsym(h, HQ_FORMAT_ENTRY_NAME);
  if (!entry) {
    host->error(HQ_ENOENT, "%s has no %s", file, HQ_FORMAT_ENTRY_NAME);
    return NULL;
  }
  inner = entry(host);
  if (!inner) return NULL;
  if (inner->struct_size != sizeof ops) {
    host->error(HQ_EINVAL, "%s: ops table of %u bytes, this fixture was built for %zu", file,
                inner->struct_size, sizeof ops);
    return NULL;
  }
  memcpy(&ops, inner, sizeof ops);
  ops.name = "fp8_tensor_nofold";
  ops.description = "test fixture: fp8_tensor without deq-factor (ABI 2.2 behaviour)";
  ops.caps &= ~HQ_CAP_DEQ_FACTOR;
  ops.instance_caps = instance_caps;
  return &ops;
}
