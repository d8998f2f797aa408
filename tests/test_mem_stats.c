/*
** test_mem_stats.c -- the refusals of hq_device_mem_stats and hq_device_mem_reset_peak (hq.h):
** HQ_EINVAL for a NULL or too small struct in every build; in a build without CUDA HQ_ENOTSUP
** for every device, with a message that says so; in a CUDA build HQ_EINVAL for a device that
** does not exist, named in the message. A refused call leaves zero counts and writes no byte
** past the struct it knows. The counts themselves need a device: test_gpu_core.
*/
#include "hq_test.h"

/* hq_mem_stats followed by bytes a newer caller's larger struct would hold */
typedef struct {
  hq_mem_stats s;
  unsigned char tail[16];
} newer_stats;

/* What a refused device gives in this build, with the words its message must hold. */
static int refused(const char **words) {
  if (!hq_built_with_cuda()) {
    *words = "built without CUDA";
    return HQ_ENOTSUP;
  }
  *words = "does not exist";
  return HQ_EINVAL;
}

static void check_refused(int device) {
  const char *words;
  const int want = refused(&words);
  char name[32];
  snprintf(name, sizeof name, "CUDA device %d ", device);

  newer_stats n;
  memset(&n, 0xa5, sizeof n);
  n.s.struct_size = sizeof n; /* larger than this libhqcore's struct */
  assert_int_equal(hq_device_mem_stats(device, &n.s), want);
  assert_non_null(strstr(hq_last_error(), "hq_device_mem_stats"));
  assert_non_null(strstr(hq_last_error(), name));
  assert_non_null(strstr(hq_last_error(), words));
  /* the struct this libhqcore knows, zeroed; the newer tail untouched */
  assert_int_equal(n.s.struct_size, sizeof(hq_mem_stats));
  assert_true(n.s.in_use == 0 && n.s.peak == 0 && n.s.reserved == 0);
  for (size_t i = 0; i < sizeof n.tail; i++) assert_int_equal(n.tail[i], 0xa5);

  hq_clear_error();
  assert_int_equal(hq_device_mem_reset_peak(device), want);
  assert_non_null(strstr(hq_last_error(), "hq_device_mem_reset_peak"));
  assert_non_null(strstr(hq_last_error(), name));
  assert_non_null(strstr(hq_last_error(), words));
}

static void test_refused_devices(void **state) {
  (void)state;
  check_refused(-1);
  check_refused(1 << 20);
  check_refused(hq_device_count()); /* one past the last: 0 without CUDA or without a device */
}

static void test_bad_struct(void **state) {
  (void)state;
  assert_int_equal(hq_device_mem_stats(0, NULL), HQ_EINVAL);
  assert_non_null(strstr(hq_last_error(), "out is NULL"));
  hq_mem_stats s;
  memset(&s, 0xa5, sizeof s);
  s.struct_size = 0;
  assert_int_equal(hq_device_mem_stats(0, &s), HQ_EINVAL);
  assert_non_null(strstr(hq_last_error(), "hq_mem_stats.struct_size = 0"));
  s.struct_size = (uint32_t)offsetof(hq_mem_stats, reserved); /* reserved missing */
  assert_int_equal(hq_device_mem_stats(0, &s), HQ_EINVAL);
  assert_non_null(strstr(hq_last_error(), "hq_mem_stats.struct_size"));
  /* nothing written: not even the counts the short struct has room for */
  assert_true(s.in_use == 0xa5a5a5a5a5a5a5a5ull && s.peak == 0xa5a5a5a5a5a5a5a5ull);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused_devices),
      cmocka_unit_test(test_bad_struct),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
