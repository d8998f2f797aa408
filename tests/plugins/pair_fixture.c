/*
** pair_fixture.c -- a test-only format module, "test_pair", that offers dequantize_pair (format
** ABI 2.6): the core hands it a GEMM's two dequantizations as one request. It stores a tensor as
** integer codes and a per-tensor factor (int_codes.h); its raw dequantize folds the factor when
** asked (HQ_CAP_DEQ_FACTOR: *factor_out = RN(m * scale)). dequantize_pair makes the two
** dequantizations in order -- which is the whole of the contract on the host, a chained fold
** included -- and counts itself in the exported pair_fixture (gemm_fixture.h), whose knobs make
** it decline (HQ_ENOTSUP) or fail.
*/
#include "hq/numerics.h"
#define CODES_NAME "test_pair"
#include "int_codes.h"
#include "gemm_fixture.h"

HQ_FORMAT_EXPORT pair_fixture_state pair_fixture;

static int dequantize(const void *c, const hq_call *call, const hq_storage *s, hq_tensor *dst) {
  (void)c;
  const int rc = codes_dequantize(call, s, dst, (call->flags & HQ_CALL_DEQ_RAW) != 0);
  float *out = hq_call_factor_out(call);
  if (!rc && out)
    *out = hq_mul_rn(call->factor_in ? *call->factor_in : call->factor_mul,
                     *(const float *)hq_storage_cbuf(s, 1)->ptr);
  if (!rc) pair_fixture.deqs++;
  return rc;
}

static int dequantize_pair(const void *c, const hq_call *call, const hq_storage *s,
                           hq_tensor *dst, const void *c_b, const hq_call *call_b,
                           const hq_storage *s_b, hq_tensor *dst_b) {
  if (pair_fixture.decline) return HQ_ENOTSUP;
  if (pair_fixture.fail) return call->host->error(HQ_EDEVICE, "test_pair: failed on purpose");
  if (call_b->device != call->device || call_b->stream != call->stream ||
      !(call->flags & call_b->flags & HQ_CALL_DEQ_RAW))
    return call->host->error(HQ_EINVAL, "test_pair: a pair of calls unlike each other");
  int rc = dequantize(c, call, s, dst);
  if (!rc) rc = dequantize(c_b, call_b, s_b, dst_b);
  if (!rc) pair_fixture.pairs++;
  return rc;
}

static const hq_format_ops ops = {
    .abi_major = HQ_ABI_MAJOR,
    .abi_minor = 3, /* the factor fields of hq_call */
    .struct_size = sizeof(hq_format_ops),
    .config_size = sizeof(cfg),
    .name = "test_pair",
    .version = "0.1",
    .description = "integer codes and a folded per-tensor factor, two dequantizes a request",
    .caps = HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_DEQ_FACTOR,
    .options = options,
    .configure = configure,
    .layout = layout,
    .quantize = quantize,
    .dequantize = dequantize,
    .tensor_factor = codes_factor,
    .dequantize_pair = dequantize_pair,
};

HQ_FORMAT_DEFINE(ops);
