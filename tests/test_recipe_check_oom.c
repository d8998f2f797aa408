/*
** test_recipe_check_oom.c -- `hq recipe check` under allocation failures injected one at a time
** (tests/hq_alloc_fail.h): the command (tools/cmd_recipe.c, linked in) runs on one recipe,
** failing its 1st, 2nd, ... allocation in turn until a run meets no failure. A run that met a
** failure either absorbed it (a fallback: then it must still print the full check) or exits 1
** with an error on stderr; it never prints "valid" with parts missing, never exits 0 with less
** output than the clean run. Skips (77) under AddressSanitizer, which owns malloc.
*/
#include "hq_test.h"

#if defined(__SANITIZE_ADDRESS__)
int main(void) { return HQ_TEST_SKIP; }
#else

#include <fcntl.h>
#include <unistd.h>

#include "hq_alloc_fail.h"
#include "../tools/commands.h"

static const char k_recipe[] =
    "[recipe]\nname = oom\nunmatched = identity\n"
    "[format mx]\nplugin = mxfp8\n"
    "[format f8]\nplugin = fp8_tensor\n"
    "[role linear:input:*]\nrowwise = mx\ncolumnwise = mx\n"
    "[role linear:weight:*]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:grad_output:*]\nrowwise = f8\ncolumnwise = f8\n"
    "[role linear:*:lm_head]\nrowwise = identity\ncolumnwise = identity\n";

static char g_out[1 << 16], g_err[1 << 16];

/* Read the whole file `path` into buf (NUL-terminated). */
static void slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
}

/* One run of `hq recipe check FILE` with stdout and stderr in files; returns its exit status. */
static int run_check(const char *file, long long fail_at) {
  char *argv[] = {"recipe", "check", (char *)file, NULL};
  static int saved[2] = {-1, -1};
  static char obuf[1 << 16], ebuf[1 << 16];
  fflush(stdout);
  fflush(stderr);
  if (saved[0] < 0) {
    saved[0] = dup(1);
    saved[1] = dup(2);
    /* stdio's buffers are set before any failure, so that none can silence the output */
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    setvbuf(stderr, ebuf, _IOFBF, sizeof ebuf);
  }
  const char *names[2] = {"recipe_check_oom.out", "recipe_check_oom.err"};
  for (int i = 0; i < 2; i++) {
    int fd = open(names[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    dup2(fd, i + 1);
    close(fd);
  }
  hq_clear_error();
  g_count = 0;
  g_failed = 0;
  g_fail_at = fail_at;
  g_armed = 1;
  int rc = hq_cmd_recipe(3, argv);
  g_armed = 0;
  fflush(stdout);
  fflush(stderr);
  dup2(saved[0], 1);
  dup2(saved[1], 2);
  slurp(names[0], g_out, sizeof g_out);
  slurp(names[1], g_err, sizeof g_err);
  return rc;
}

static void test_every_failure_reported(void **state) {
  (void)state;
  const char *file = "recipe_check_oom.ini";
  hq_test_write_file(file, k_recipe);

  /* the clean run: valid, every layer's three GEMMs listed */
  assert_int_equal(run_check(file, -1), 0);
  static char clean[sizeof g_out];
  memcpy(clean, g_out, sizeof clean);
  assert_non_null(strstr(clean, "\nvalid\n"));
  assert_non_null(strstr(clean, "  layer lm_head\n"));

  long long n, failed_runs = 0;
  for (n = 0;; n++) {
    int rc = run_check(file, n);
    if (!g_failed) {
      if (rc != 0) fail_msg("no allocation failed, yet exit %d: %s", rc, g_err);
      assert_string_equal(g_out, clean);
      break;
    }
    if (rc == 0) { /* absorbed: the output must be the whole check */
      if (strcmp(g_out, clean) != 0)
        fail_msg("allocation %lld failed, exit 0, but the output differs from the clean run:\n%s",
                 n + 1, g_out);
      continue;
    }
    failed_runs++;
    if (rc != 1) fail_msg("allocation %lld failed: exit %d instead of 1", n + 1, rc);
    if (strstr(g_out, "\nvalid\n"))
      fail_msg("allocation %lld failed, exit 1, yet stdout says valid", n + 1);
    if (!strstr(g_err, "memory") && !strstr(g_err, "allocat"))
      fail_msg("allocation %lld failed, exit 1, with no message about memory: '%s'", n + 1,
               g_err);
  }
  print_message("%lld allocations, %lld failures reported\n", n, failed_runs);
  assert_true(failed_runs > 0);
  unlink(file);
  unlink("recipe_check_oom.out");
  unlink("recipe_check_oom.err");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_failure_reported)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
