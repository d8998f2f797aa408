/*
** test_bench_spec.c -- hq bench's format configurations (tools/bench_spec.c): which stock row is
** skipped because its module is not installed, and which fails. A plugin set of an empty
** directory (no search of $HQ_PLUGIN_PATH or the installed directory) lacks every stock module
** but identity, which libhqcore holds; a directory holding a file mxfp8.so that is no module
** makes mxfp8 rejected, a fault the bench reports rather than skips; the test's plugin path
** holds the stock modules, none missing. The name is the spec's first word, after any leading
** separators, as the recipe text reads it. Also the recipe text of a spec with options.
*/
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hq_test.h"
#include "bench_spec.h"

static hq_plugins *open_dir(const char *dir, unsigned flags) {
  hq_plugins *set = NULL;
  const char *dirs[1] = {dir};
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, dir ? 1 : 0, flags, &set));
  return set;
}

static void test_missing(void **state) {
  (void)state;
  char dir[] = "/tmp/hq_bench_spec_XXXXXX";
  assert_non_null(mkdtemp(dir));
  hq_plugins *empty = open_dir(dir, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT);
  assert_int_equal(bench_spec_missing(empty, "mxfp8"), 1);
  assert_int_equal(bench_spec_missing(empty, "nvfp4 rht=true"), 1);
  assert_int_equal(bench_spec_missing(empty, " ,fp8_block,block=2d"), 1);
  assert_int_equal(bench_spec_missing(empty, "identity dtype=bf16"), 0);
  assert_int_equal(bench_spec_missing(empty, ""), 0); /* no name: the spec's own error */
  hq_plugins_close(empty);

  char so[600];
  snprintf(so, sizeof so, "%s/mxfp8.so", dir);
  hq_test_write_file(so, "not a module\n");
  hq_plugins *bad = open_dir(dir, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT);
  assert_int_equal(hq_plugins_rejected_count(bad), 1);
  assert_int_equal(bench_spec_missing(bad, "mxfp8"), 0);
  assert_int_equal(bench_spec_missing(bad, "mxfp8 dtype=e5m2"), 0);
  assert_int_equal(bench_spec_missing(bad, "mxfp"), 1);  /* a prefix of the file is not it */
  assert_int_equal(bench_spec_missing(bad, "mxfp6"), 1);
  hq_plugins_close(bad);
  assert_int_equal(unlink(so), 0);
  assert_int_equal(rmdir(dir), 0);

  hq_plugins *stock = open_dir(NULL, HQ_PLUGINS_NO_DEFAULT); /* $HQ_PLUGIN_PATH */
  static const char *const names[] = {"fp8_tensor", "mxfp8", "nvfp4", "fp8_block", "mxfp4",
                                      "mxfp6", "identity"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (bench_spec_missing(stock, names[i])) fail_msg("%s: missing on the test's path", names[i]);
  assert_int_equal(bench_spec_missing(stock, "nosuch"), 1);
  hq_plugins_close(stock);
}

static void test_recipe_text(void **state) {
  (void)state;
  char text[1024], label[256];
  assert_int_equal(bench_recipe_text("nvfp4 rht=true,block_2d=false", "b", text, sizeof text,
                                     label, sizeof label), 0);
  assert_string_equal(text, "[format b]\nplugin = nvfp4\nrht = true\nblock_2d = false\n"
                            "[role *:*:*]\nrowwise = b\ncolumnwise = b\n");
  assert_string_equal(label, "nvfp4 rht=true block_2d=false");
  assert_int_equal(bench_recipe_text("nvfp4 rht", "b", text, sizeof text, NULL, 0), -1);
  assert_int_equal(bench_recipe_text(" ", "b", text, sizeof text, NULL, 0), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing),
      cmocka_unit_test(test_recipe_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
