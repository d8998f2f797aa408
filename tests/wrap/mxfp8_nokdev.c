/*
** mxfp8_nokdev.c -- a test-only module "mxfp8_nokdev": the stock mxfp8 module (mxfp8.so, found
** on $HQ_PLUGIN_PATH) under another name and without HQ_CAP_ADAM_KDEV, as a module written for
** ABI 2.2 - 2.5 is: it keeps HQ_CAP_FUSED_ADAM, but its kernel would apply adam->k, the
** constants of a graph's capture. A fused call that carries adam->k_dev anyway is refused here,
** so that a core handing it to such a module fails test_gpu_graph_step instead of passing
** because the stock kernel underneath reads it. Built for make check only (tests/wrap).
*/
#include "stock_module.h"

static hq_format_ops ops;
static const hq_format_ops *inner;

static int quantize(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                    hq_storage *row, hq_storage *col) {
  int ok;
  const hq_adam_pass *adam = hq_call_adam(call, src, &ok);
  if (ok && hq_adam_pass_k_dev(adam))
    return call->host->error(HQ_EINVAL, "mxfp8_nokdev: the fused step carries k_dev, but this "
                             "module does not declare HQ_CAP_ADAM_KDEV");
  return inner->quantize(cfg, call, src, dirs, row, col);
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !(inner = stock_module(host, "mxfp8.so", &ops)))
    return NULL;
  if (inner->update || inner->instance_caps) {
    host->error(HQ_EINVAL, "mxfp8_nokdev: the stock mxfp8 has an update() or instance_caps() "
                "this fixture does not wrap");
    return NULL;
  }
  ops.name = "mxfp8_nokdev";
  ops.description = "test fixture: mxfp8 without adam-kdev (ABI 2.5 behaviour)";
  ops.caps &= ~HQ_CAP_ADAM_KDEV;
  ops.quantize = quantize;
  return &ops;
}
