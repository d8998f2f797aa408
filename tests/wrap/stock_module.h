/*
** stock_module.h -- what the test modules of tests/wrap share: a stock module (fp8_tensor.so,
** nvfp4.so, found on $HQ_PLUGIN_PATH, where make check puts the built plugins), opened and
** entered, its ops table copied into the wrapper's own for it to change.
*/
#ifndef HQ_STOCK_MODULE_H
#define HQ_STOCK_MODULE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../hq_wrap.h"

/* The table of stock module `so` ("fp8_tensor.so"; kept open for the process); *ops receives a
   copy. NULL (after host->error) when it cannot be found or was built against another
   hq_format_ops. */
static const hq_format_ops *stock_module(const hq_host_api *host, const char *so,
                                         hq_format_ops *ops) {
  const char *path = getenv("HQ_PLUGIN_PATH");
  char file[4200];
  file[0] = 0;
  for (const char *p = path; p && *p && !file[0];) {
    const size_t n = strcspn(p, ":");
    snprintf(file, sizeof file, "%.*s/%s", (int)n, p, so);
    if (!n || access(file, F_OK) != 0) file[0] = 0;
    p += n + (p[n] == ':');
  }
  if (!file[0]) {
    host->error(HQ_ENOENT, "%s not found on HQ_PLUGIN_PATH=%s", so, path ? path : "");
    return NULL;
  }
  const hq_format_ops *inner = NULL;
  return hq_wrap_module(host, file, ops, &inner) ? inner : NULL;
}

static inline const hq_format_ops *stock_fp8_tensor(const hq_host_api *host, hq_format_ops *ops) {
  return stock_module(host, "fp8_tensor.so", ops);
}

#endif /* HQ_STOCK_MODULE_H */
