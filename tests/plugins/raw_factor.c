/*
** raw_factor.c -- a test-only format module, "test_raw_factor" (review bug 7): its ops table has
** the ABI 2.1 layout (struct_size = sizeof(hq_format_ops), a tensor_factor op) but it REQUIRES
** only ABI 2.0 (abi_minor = 0), as a module may that runs on an older core too. What it offers a
** GEMM must follow from its table, not from that minor.
**
** It stores a tensor as integer codes and a per-tensor factor (int_codes.h): its raw values
** (HQ_CALL_DEQ_RAW) are the codes, tensor_factor() gives the factor. It counts its dequantize
** and tensor_factor calls in the exported raw_factor_fixture (gemm_fixture.h).
*/
#define CODES_NAME "test_raw_factor"
#include "int_codes.h"
#include "gemm_fixture.h"

HQ_FORMAT_EXPORT raw_factor_counts raw_factor_fixture;

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)c;
  const int raw = (call->flags & HQ_CALL_DEQ_RAW) != 0;
  const int rc = codes_dequantize(call, s, dst, raw);
  if (!rc && raw) raw_factor_fixture.deq_raw++;
  if (!rc && !raw) raw_factor_fixture.deq_full++;
  return rc;
}

static int tensor_factor(const void *c, const hq_call *call, const hq_storage *s, float *out) {
  const int rc = codes_factor(c, call, s, out);
  if (!rc) raw_factor_fixture.factor++;
  return rc;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 0, /* requires 2.0: the point of the fixture */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(cfg),
    .name = "test_raw_factor",
    .version = "0.1",
    .description = "integer codes and a per-tensor factor, 2.1 table, requires 2.0",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .tensor_factor = tensor_factor,
};

HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host) {
  return host->abi_major == HQ_ABI_MAJOR ? &ops : NULL;
}
