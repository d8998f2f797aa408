/*
** nopair.c -- test-only module "nvfp4_nopair" (WRAP_STOCK names the stock module): the stock
** module (found on $HQ_PLUGIN_PATH) under another name and without dequantize_pair, as a module
** written before ABI 2.6 is, so that test_gpu_graph_step sees the core dequantize an emulated
** GEMM's operands side by side (or in turn) for such a module, and counts the graph nodes the
** op saves. Built for make check only (tests/wrap).
*/
#include "stock_module.h"

static hq_format_ops ops;

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !stock_module(host, WRAP_STOCK ".so", &ops))
    return NULL;
  ops.name = WRAP_STOCK "_nopair";
  ops.description = "test fixture: " WRAP_STOCK " without dequantize_pair (ABI 2.5 behaviour)";
  ops.dequantize_pair = NULL;
  return &ops;
}
