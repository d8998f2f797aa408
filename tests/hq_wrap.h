/*
** hq_wrap.h -- for the test-only modules that wrap a built module under another name
** (tests/wrap/, tests/identity/): load it and take a copy of its ops table to change.
*/
#ifndef HQ_WRAP_H
#define HQ_WRAP_H

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "hq/plugin.h"

/* The ops table of module `file`, opened and called with the wrapper's own host table, copied
   into *copy (which the wrapper then renames and changes). *inner, when not NULL, receives the
   module's own table. Returns copy, or NULL after host->error() when the module cannot be
   opened, has no entry point, refuses or was built with another ops table size. */
static inline hq_format_ops *hq_wrap_module(const hq_host_api *host, const char *file,
                                            hq_format_ops *copy, const hq_format_ops **inner) {
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) {
    host->error(HQ_ENOENT, "%s: %s", file, dlerror());
    return NULL;
  }
  hq_format_entry_fn entry = (hq_format_entry_fn)(uintptr_t)dlsym(h, HQ_FORMAT_ENTRY_NAME);
  if (!entry) {
    host->error(HQ_ENOENT, "%s has no %s", file, HQ_FORMAT_ENTRY_NAME);
    return NULL;
  }
  const hq_format_ops *ops = entry(host);
  if (!ops) return NULL;
  if (ops->struct_size != sizeof *copy) {
    host->error(HQ_EINVAL, "%s: ops table of %u bytes, this wrapper was built for %zu", file,
                ops->struct_size, sizeof *copy);
    return NULL;
  }
  memcpy(copy, ops, sizeof *copy);
  if (inner) *inner = ops;
  return copy;
}

#endif /* HQ_WRAP_H */
