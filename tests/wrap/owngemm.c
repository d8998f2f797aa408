/*
** owngemm.c -- test-only module "fp8_tensor_owngemm": the stock fp8_tensor module (found on
** $HQ_PLUGIN_PATH) under another name with a gemm op of its own that reports its product as
** emulated (ABI 2.6's hq_gemm_problem.emul_out), as nvfp4's kernel for small problems does on
** Hopper, so that test_gemm_providers checks on the host what the core makes of such an op.
** The op, by m: 8 declines with a message, 16 declines without one; any other m on the host,
** with an F32 D, writes OWNGEMM_VALUE into every element of D (so a test sees that it ran) and
** says its product was emulated in F32. Built for make check only (tests/wrap).
*/
#include "stock_module.h"

#define OWNGEMM_VALUE 42.0f

static hq_format_ops ops;

static int gemm(const void *cfg, const hq_call *call, const hq_gemm_problem *p) {
  (void)cfg;
  if (p->m == 8)
    return call->host->error(HQ_ENOTSUP, "fp8_tensor_owngemm: declined m = 8 on purpose");
  hq_dtype *emul = hq_gemm_problem_emul_out(p);
  if (p->m == 16 || !emul || call->device != HQ_DEVICE_HOST || p->d->dtype != HQ_F32)
    return HQ_ENOTSUP;
  *emul = HQ_F32;
  if (p->flags & HQ_GEMM_QUERY) return HQ_OK;
  float *d = p->d->data;
  for (int64_t i = 0; i < p->m * p->n; i++) d[i] = OWNGEMM_VALUE;
  return HQ_OK;
}

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  if (!host || host->abi_major != HQ_ABI_MAJOR || !stock_fp8_tensor(host, &ops)) return NULL;
  ops.name = "fp8_tensor_owngemm";
  ops.description = "test fixture: fp8_tensor with a gemm op that reports an emulated product";
  ops.gemm = gemm;
  return &ops;
}
