/*
** copy_out.h -- what the tests of a plain copy written beside a format's codes (ABI 2.6
** copy_out) share: test_hybrid on the host, test_gpu_fp8_tensor on a device. F32 values and
** their BF16 / F16 bits, a context whose log counts the core's line for each such call, and the
** recipes compared.
*/
#ifndef HQ_TEST_COPY_OUT_H
#define HQ_TEST_COPY_OUT_H

#include <stdint.h>

#include "hq_test.h"

/* F32 bit patterns and their BF16 / F16 conversions (round to nearest even, overflow to Inf,
   NaN quiet with its sign; checked against ml_dtypes.bfloat16 and numpy.float16, NaN by the rule
   of hq/numerics.h): ties to even, just above a tie, overflow, subnormals, Inf, NaN. */
static const struct copy_bit { uint32_t f32; uint16_t bf16, f16; } copy_bits[] = {
    {0x3f800000u, 0x3f80u, 0x3c00u}, /* 1 */
    {0x3f808000u, 0x3f80u, 0x3c04u}, /* 1 + 2^-8: a BF16 tie, to even (down) */
    {0x3f818000u, 0x3f82u, 0x3c0cu}, /* 1 + 3 * 2^-8: a BF16 tie, to even (up) */
    {0x3f808001u, 0x3f81u, 0x3c04u}, /* just above the tie */
    {0xc0200000u, 0xc020u, 0xc100u}, /* -2.5 */
    {0x7f7fffffu, 0x7f80u, 0x7c00u}, /* FLT_MAX: Inf in both */
    {0x477ff000u, 0x4780u, 0x7c00u}, /* 65520: the F16 tie that overflows */
    {0x477fefffu, 0x4780u, 0x7bffu}, /* just below it */
    {0x00018000u, 0x0002u, 0x0000u}, /* an F32 subnormal, a BF16 tie, to even (up) */
    {0x33800000u, 0x3380u, 0x0001u}, /* 2^-24: the smallest F16 subnormal */
    {0x33000000u, 0x3300u, 0x0000u}, /* 2^-25: an F16 tie, to even (zero) */
    {0x387fc000u, 0x3880u, 0x03ffu}, /* the largest F16 subnormal */
    {0xff800000u, 0xff80u, 0xfc00u}, /* -Inf */
    {0x7fa00000u, 0x7fe0u, 0x7e00u}, /* a signalling NaN, quieted */
    {0xffa00000u, 0xffe0u, 0xfe00u}, /* ... negative */
};
#define N_COPY_BITS (sizeof copy_bits / sizeof copy_bits[0])


static void copy_log_count(void *user, int level, const char *msg) {
  if (level == 3 && strstr(msg, "written by the rowwise call")) ++*(int *)user;
}

/* A context on `device` whose log counts the core's copy_out lines into *logged. */
static inline hq_ctx *copy_log_ctx(int device, int *logged) {
  return hq_test_log_ctx(device, copy_log_count, logged);
}

/* The recipes compared for an identity dtype dt ("bf16" or "f16"): r[0] the hybrid (fp8_tensor
   rowwise, identity columnwise), r[1] identity alone, r[2] fp8_tensor alone. */
static inline void copy_recipes(const char *dt, hq_recipe *r[3]) {
  char text[256];
  snprintf(text, sizeof text, "[format f8]\nplugin = fp8_tensor\n[format hp]\nplugin = "
           "identity\ndtype = %s\n[role *:*:*]\nrowwise = f8\ncolumnwise = hp\n", dt);
  r[0] = hq_test_recipe(text);
  snprintf(text, sizeof text, "[format hp]\nplugin = identity\ndtype = %s\n[role *:*:*]\n"
           "rowwise = hp\ncolumnwise = hp\n", dt);
  r[1] = hq_test_recipe(text);
  r[2] = hq_test_recipe("[role *:*:*]\nrowwise = fp8_tensor\n");
}

#endif
