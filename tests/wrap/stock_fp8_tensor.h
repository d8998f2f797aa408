/*
** stock_fp8_tensor.h -- what the test modules of tests/wrap share: the stock fp8_tensor module
** (fp8_tensor.so, found on $HQ_PLUGIN_PATH, where make check puts the built plugins), opened
** and entered, its ops table copied into the wrapper's own for it to change.
*/
#ifndef HQ_STOCK_FP8_TENSOR_H
#define HQ_STOCK_FP8_TENSOR_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hq/plugin.h"

/* The stock module's table (kept open for the process); *ops receives a copy. NULL (after
   host->error) when it cannot be found or was built against another hq_format_ops. */
static const hq_format_ops *stock_fp8_tensor(const hq_host_api *host, hq_format_ops *ops) {
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
  const hq_format_ops *inner = entry(host);
  if (!inner) return NULL;
  if (inner->struct_size != sizeof *ops) {
    host->error(HQ_EINVAL, "%s: ops table of %u bytes, this fixture was built for %zu", file,
                inner->struct_size, sizeof *ops);
    return NULL;
  }
  memcpy(ops, inner, sizeof *ops);
  return inner;
}

#endif /* HQ_STOCK_FP8_TENSOR_H */
