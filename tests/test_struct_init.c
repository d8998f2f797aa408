/*
** test_struct_init.c -- the init macros of hq.h (HQ_STRUCT_INIT and the named forms) for the
** structs a caller fills: built with -Wall -Wextra -Werror whatever the build's flags (see
** tests/local.mk), so a macro that warns (the positional `{sizeof info}` does, under -Wextra)
** fails the build; at run time each declares struct_size = sizeof the struct and every other
** byte zero.
*/
#include "hq_test.h"

#define CHECK_INIT(T, x) assert_int_equal((x).struct_size, sizeof(T))

static void test_init_macros(void **state) {
  (void)state;
  hq_gemm_info info = HQ_GEMM_INFO_INIT;
  CHECK_INIT(hq_gemm_info, info);
  assert_int_equal(info.path, 0);
  assert_int_equal(info.m, 0);
  assert_string_equal(info.reason, "");
  assert_string_equal(info.provider, "");
  hq_gemm_info info2 = HQ_STRUCT_INIT(hq_gemm_info);
  CHECK_INIT(hq_gemm_info, info2);
  hq_gemm_args ga = HQ_GEMM_ARGS_INIT;
  CHECK_INIT(hq_gemm_args, ga);
  assert_null(ga.bias);
  assert_null(ga.what);
  hq_mem_stats ms = HQ_MEM_STATS_INIT;
  CHECK_INIT(hq_mem_stats, ms);
  assert_true(ms.in_use == 0 && ms.peak == 0 && ms.reserved == 0);
  hq_ctx_desc cd = HQ_CTX_DESC_INIT;
  CHECK_INIT(hq_ctx_desc, cd);
  assert_int_equal(cd.device, 0);
  hq_recipe_opts ro = HQ_RECIPE_OPTS_INIT;
  CHECK_INIT(hq_recipe_opts, ro);
  assert_null(ro.plugins);
  hq_format_info fi = HQ_FORMAT_INFO_INIT;
  CHECK_INIT(hq_format_info, fi);
  hq_role_info ri = HQ_ROLE_INFO_INIT;
  CHECK_INIT(hq_role_info, ri);
  hq_gemm_provider_info pi = HQ_GEMM_PROVIDER_INFO_INIT;
  CHECK_INIT(hq_gemm_provider_info, pi);
  hq_format_spec fs = HQ_FORMAT_SPEC_INIT;
  CHECK_INIT(hq_format_spec, fs);
  assert_null(fs.plugin);
  hq_quantize_args qa = HQ_QUANTIZE_ARGS_INIT;
  CHECK_INIT(hq_quantize_args, qa);
  hq_format_desc fd = HQ_FORMAT_DESC_INIT;
  CHECK_INIT(hq_format_desc, fd);
  hq_adam adam = HQ_ADAM_INIT;
  CHECK_INIT(hq_adam, adam);

  /* the macro's result is what the library checks: a plan on the host fills it */
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  static float a[8 * 8], b[8 * 8];
  hq_tensor ta = hq_tensor_2d(a, HQ_F32, HQ_DEVICE_HOST, 8, 8);
  hq_tensor tb = hq_tensor_2d(b, HQ_F32, HQ_DEVICE_HOST, 8, 8);
  HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_hp(&ta), 1, hq_operand_hp(&tb), 0, NULL, NULL, &info));
  assert_int_equal(info.k, 8);
  assert_int_equal(info.struct_size, sizeof info);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_init_macros)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
