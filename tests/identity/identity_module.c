/*
** identity_module.c -- a test-only module "identity_module": the identity format built as a
** module (plugins/identity/identity.so, the file $HQ_TEST_IDENTITY_SO names) under another name,
** so that the loader takes it beside the built-in identity of the same source. test_identity
** quantizes and dequantizes through both and compares the bytes; the module runs on the core's
** own host table, which this wrapper also hands to the test (hq_test_identity_host), so that the
** test can call the host services directly. Built for make check only, into a folder of its own.
*/
#include <stdlib.h>

#include "../hq_wrap.h"

static hq_format_ops ops;
static const hq_host_api *core_host;

/* The host table the core passed to this module (NULL before it was loaded). */
HQ_FORMAT_EXPORT const hq_host_api *hq_test_identity_host(void);
HQ_FORMAT_EXPORT const hq_host_api *hq_test_identity_host(void) { return core_host; }

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR) return NULL;
  const char *file = getenv("HQ_TEST_IDENTITY_SO");
  if (!file) {
    host->error(HQ_ENOENT, "HQ_TEST_IDENTITY_SO is not set (make check sets it)");
    return NULL;
  }
  if (!hq_wrap_module(host, file, &ops, NULL)) return NULL;
  ops.name = "identity_module";
  core_host = host;
  return &ops;
}
