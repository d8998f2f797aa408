/*
** fp8_tensor_next.c -- test-only modules named "fp8_tensor": the stock fp8_tensor module
** (fp8_tensor.so, found on $HQ_PLUGIN_PATH) as a later version of it would be, for
** test_checkpoint's checks of checkpoints written by the version before (bug 6):
**   -DWRAP_APPEND_OPTION  one option appended to its table ("bump", a bool, default false),
**                         which it ignores: every checkpoint written before is still readable;
**   -DWRAP_LAYOUT=N       its layout_version set to N: its stored bytes changed, so no checkpoint
**                         written before is.
** Each is built into a folder of its own (tests/wrap/next, tests/wrap/relayout): it takes the
** stock module's name, so a plugin set opened there holds it instead of the stock one.
*/
#include "stock_module.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

#ifdef WRAP_APPEND_OPTION
static hq_option options[32];

/* vals has one entry more than the stock configure() reads: the appended option, ignored. */
static int configure(void *cfg, const hq_optval *vals, const hq_host_api *host) {
  return inner->configure(cfg, vals, host);
}

static int append_option(const hq_host_api *host) {
  size_t n = 0;
  while (inner->options[n].name) n++;
  if (n + 2 > sizeof options / sizeof options[0])
    return host->error(HQ_EINVAL, "fp8_tensor has %zu options, this fixture holds %zu", n,
                       sizeof options / sizeof options[0] - 2);
  memcpy(options, inner->options, n * sizeof options[0]);
  const hq_option bump = {"bump", HQ_OPT_BOOL, "false",
                          "test fixture: an option appended after checkpoints were written",
                          NULL, 0, -1};
  options[n] = bump;
  ops.options = options;
  ops.configure = configure;
  return HQ_OK;
}
#endif

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !(inner = stock_fp8_tensor(host, &ops)))
    return NULL;
  ops.description = "test fixture: a later fp8_tensor";
#ifdef WRAP_APPEND_OPTION
  if (append_option(host)) return NULL;
#endif
#ifdef WRAP_LAYOUT
  ops.layout_version = WRAP_LAYOUT;
#endif
  return &ops;
}
