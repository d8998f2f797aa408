/*
** test_loader.c -- the plugin loader: a valid module is accepted; each broken fixture module is
** rejected with a message naming its file and the reason, while loading goes on; the search
** path honours HQ_PLUGIN_PATH, extra directories and never the current directory implicitly.
** Every set holds the built-in identity format first (file "(built into libhqcore)"), whatever
** the search path; a module of ABI 1 (hq_format_module_v1) is told to be rebuilt, and a module
** named "identity" cannot replace the built-in.
*/
#include <sys/stat.h>
#include <unistd.h>

#include "hq_test.h"

static const char *fixtures(void) {
  const char *d = getenv("HQ_TEST_FIXTURES");
  return d ? d : "tests/plugins/.libs";
}

/* The built-in identity format as every set holds it: first, file "(built into libhqcore)", the
   core's own version, ABI 2.4, its one option `dtype`. */
static void expect_builtin_identity(const hq_plugins *set) {
  const hq_plugin *id = hq_plugins_find(set, "identity");
  assert_non_null(id);
  assert_ptr_equal(hq_plugins_get(set, 0), id);
  assert_string_equal(hq_plugin_name(id), "identity");
  assert_string_equal(hq_plugin_file(id), "(built into libhqcore)");
  assert_string_equal(hq_plugin_version(id), hq_version());
  assert_int_equal(hq_plugin_abi_minor(id), 4); /* it converts through host->convert (2.4) */
  assert_true(hq_plugin_caps(id) & HQ_CAP_CPU);
  assert_true(hq_plugin_caps(id) & HQ_CAP_REQUANT_SAFE);
  assert_true(hq_plugin_caps(id) & HQ_CAP_COLWISE_ONLY);
  assert_int_equal(!!(hq_plugin_caps(id) & HQ_CAP_CUDA), !!hq_built_with_cuda());
  const hq_option *o = hq_plugin_options(id);
  assert_string_equal(o[0].name, "dtype");
  assert_int_equal(o[0].type, HQ_OPT_ENUM);
  assert_string_equal(o[0].def, "auto");
  assert_string_equal(o[0].choices, "auto|f32|bf16|f16");
  assert_null(o[1].name);
}

static void test_fixtures(void **state) {
  (void)state;
  const char *dirs[] = {fixtures()};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  /* the built-in identity (first) and the two valid modules in name order: bad_default.so (it
     loads: only using its defaults fails) and good.so (good_dup.so sorts after it and is the
     duplicate) */
  assert_int_equal(hq_plugins_count(set), 3);
  expect_builtin_identity(set);
  assert_string_equal(hq_plugin_name(hq_plugins_get(set, 1)), "test_bad_default");
  const hq_plugin *p = hq_plugins_find(set, "test_good");
  assert_ptr_equal(hq_plugins_get(set, 2), p);
  assert_string_equal(hq_plugin_name(p), "test_good");
  assert_string_equal(hq_plugin_version(p), "0.0");
  assert_string_equal(hq_plugin_description(p), "loader test fixture");
  assert_int_equal(hq_plugin_abi_minor(p), 0);
  assert_int_equal(hq_plugin_caps(p), HQ_CAP_CPU | HQ_CAP_COLWISE_ONLY | HQ_CAP_REQUANT_SAFE);
  assert_non_null(strstr(hq_plugin_file(p), "/good.so"));
  assert_ptr_equal(hq_plugins_find(set, "test_good"), p);
  assert_null(hq_plugins_get(set, 3));
  const hq_option *o = hq_plugin_options(p);
  assert_string_equal(o[0].name, "level");
  assert_int_equal(o[0].type, HQ_OPT_INT);
  assert_int_equal(o[2].type, HQ_OPT_ENUM);
  assert_string_equal(o[4].name, "label");
  assert_null(o[5].name);

  hq_test_expect_reason(set, "good_dup.so", "duplicate format name 'test_good'");
  hq_test_expect_reason(set, "good_dup.so", "/good.so");
  hq_test_expect_reason(set, "bad_major.so", "built for plugin ABI 3 (requires 3.0)");
  hq_test_expect_reason(set, "bad_major.so",
                        "this core implements plugin ABI 2.6 (major versions must match)");
  hq_test_expect_reason(set, "newer_minor.so",
                        "requires plugin ABI 2.7, newer than this core's 2.6");
  hq_test_expect_reason(set, "small_struct.so", "struct_size 24 is smaller than ABI 2.0's");
  hq_test_expect_reason(set, "no_entry.so", "no entry point hq_format_module_v2");
  /* a module of ABI 1 is told apart from a non-module: it must be rebuilt */
  hq_test_expect_reason(set, "v1_entry.so", "built for plugin ABI 1");
  hq_test_expect_reason(set, "v1_entry.so", "hq_format_module_v1");
  hq_test_expect_reason(set, "v1_entry.so", "rebuild");
  assert_null(strstr(hq_test_reason(set, "no_entry.so"), "ABI 1"));
  hq_test_expect_reason(set, "missing_op.so", "lacks the required field 'quantize'");
  hq_test_expect_reason(set, "bad_option.so", "option 'broken': invalid default");
  hq_test_expect_reason(set, "refuses.so", "this fixture refuses every core");
  hq_test_expect_reason(set, "bad_name.so", "'Test_Bad' is not 1-31 characters");
  /* a module cannot replace the built-in identity: the built-in stays */
  hq_test_expect_reason(set, "identity.so", "'identity' is built into libhqcore");
  assert_null(hq_test_reason(set, "good.so"));
  assert_int_equal(hq_plugins_rejected_count(set), 11);
  /* none of the rejected modules' names is in the set */
  const char *gone[] = {"test_bad_major", "test_newer_minor", "test_small_struct",
                        "test_missing_op", "test_bad_option", "Test_Bad"};
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++)
    assert_null(hq_plugins_find(set, gone[i]));
  /* every rejected file path is absolute and names its file (each reason is checked above) */
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++)
    assert_non_null(strstr(hq_plugins_rejected_file(set, i), fixtures()));
  assert_null(hq_plugins_rejected_file(set, 11));
  assert_null(hq_plugins_rejected_reason(set, 11));
  hq_plugins_close(set);
}

/* A file that is not a shared object is rejected with dlopen's reason; a subdirectory named
   *.so is skipped; other files are ignored. */
static void test_garbage_files(void **state) {
  (void)state;
  char dir[] = "/tmp/hq_loader_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[512];
  snprintf(path, sizeof path, "%s/garbage.so", dir);
  hq_test_write_file(path, "this is not an ELF file\n");
  char sub[512], txt[512];
  snprintf(sub, sizeof sub, "%s/dir.so", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  snprintf(txt, sizeof txt, "%s/readme.txt", dir);
  hq_test_write_file(txt, NULL);
  const char *dirs[] = {dir};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_count(set), 1); /* the built-in identity only */
  expect_builtin_identity(set);
  assert_int_equal(hq_plugins_rejected_count(set), 1);
  assert_non_null(strstr(hq_plugins_rejected_reason(set, 0), "dlopen failed"));
  assert_non_null(strstr(hq_plugins_rejected_file(set, 0), "garbage.so"));
  hq_plugins_close(set);
  unlink(path);
  unlink(txt);
  rmdir(sub);
  rmdir(dir);
}

/* HQ_PLUGIN_PATH first, then extra dirs, then (not here) the default; empty entries never
   become the current directory; duplicates collapse; a missing directory is harmless. */
static void test_search_path(void **state) {
  (void)state;
  char *saved = getenv("HQ_PLUGIN_PATH") ? strdup(getenv("HQ_PLUGIN_PATH")) : NULL;
  char env[1024];
  snprintf(env, sizeof env, "::/nonexistent/a::%s:", fixtures());
  setenv("HQ_PLUGIN_PATH", env, 1);
  const char *extra[] = {"/nonexistent/b", fixtures()};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(extra, 2, HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_dir_count(set), 3);
  assert_string_equal(hq_plugins_dir(set, 0), "/nonexistent/a");
  assert_string_equal(hq_plugins_dir(set, 1), fixtures());
  assert_string_equal(hq_plugins_dir(set, 2), "/nonexistent/b");
  assert_non_null(hq_plugins_find(set, "test_good"));
  hq_plugins_close(set);

  /* with the environment ignored and no dirs, nothing is searched: the set holds only the
     built-in identity, which needs no directory */
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_dir_count(set), 0);
  assert_int_equal(hq_plugins_count(set), 1);
  assert_int_equal(hq_plugins_rejected_count(set), 0);
  expect_builtin_identity(set);
  hq_plugins_close(set);

  /* the default directory is last */
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_ENV, &set));
  assert_int_equal(hq_plugins_dir_count(set), 1);
  assert_string_equal(hq_plugins_dir(set, 0), hq_plugins_default_dir());
  hq_plugins_close(set);
  if (saved) {
    setenv("HQ_PLUGIN_PATH", saved, 1);
    free(saved);
  } else {
    unsetenv("HQ_PLUGIN_PATH");
  }
}

/* The stock modules on HQ_PLUGIN_PATH load and declare what they implement: modules requiring
   ABI 2.1 that report the package's version (hq_version(), as the built-in identity does), next
   to the built-in identity (no identity module exists any more); fp8_tensor offers dtype, power_2_scales, amax_epsilon, then its delayed-scaling
   options scaling, amax_history_len, amax_compute_algo, margin (implemented since 2.1). */
static void test_stock_plugins(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_rejected_count(set), 0);
  expect_builtin_identity(set);
  const char *stock[] = {"fp8_tensor", "mxfp8", "nvfp4", "fp8_block", "mxfp4", "mxfp6"};
  for (size_t i = 0; i < sizeof stock / sizeof stock[0]; i++) {
    const hq_plugin *p = hq_plugins_find(set, stock[i]);
    if (!p) fail_msg("stock plugin %s not found", stock[i]);
    assert_int_equal(hq_plugin_abi_minor(p), 1); /* ABI 2.1: raw dequantize, gemm */
    assert_string_equal(hq_plugin_version(p), hq_version());
    assert_true(hq_plugin_caps(p) & HQ_CAP_CPU);
    char want[64];
    snprintf(want, sizeof want, "/%s.so", stock[i]);
    const char *file = hq_plugin_file(p);
    assert_true(strlen(file) > strlen(want));
    assert_string_equal(file + strlen(file) - strlen(want), want);
  }
  assert_int_equal(hq_plugins_count(set), 7); /* identity + the six stock modules */
  const hq_plugin *f8 = hq_plugins_find(set, "fp8_tensor");
  assert_true(hq_plugin_caps(f8) & HQ_CAP_REQUANT_SAFE);
  assert_true(hq_plugin_caps(f8) & HQ_CAP_COLWISE_ONLY);
  assert_int_equal(hq_plugin_abi_minor(f8), 1); /* requires 2.1 (state, gemm) */
  const char *want[] = {"dtype", "power_2_scales", "amax_epsilon", "scaling", "amax_history_len",
                        "amax_compute_algo", "margin"};
  const hq_opt_type types[] = {HQ_OPT_ENUM, HQ_OPT_BOOL, HQ_OPT_FLOAT, HQ_OPT_ENUM,
                               HQ_OPT_INT,  HQ_OPT_ENUM, HQ_OPT_INT};
  const hq_option *o = hq_plugin_options(f8);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    assert_non_null(o[i].name);
    assert_string_equal(o[i].name, want[i]);
    assert_int_equal(o[i].type, types[i]);
    assert_non_null(o[i].help);
  }
  assert_null(o[7].name);
  assert_string_equal(o[0].choices, "e4m3|e5m2");
  assert_string_equal(o[0].def, "e4m3");
  hq_plugins_close(set);
}

/* Review bug 5: a module's option table is read at the stride it declares (option_size), so
   that option entries may grow: test_wide's entries carry two appended fields. It loads, its
   options read back through hq_plugin_options as they were declared, and a recipe sets them.
   Before, the table was read at this header's fixed stride, and the second entry was garbage. */
static void test_wide_option_entries(void **state) {
  (void)state;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/wide/.libs", getenv("HQ_TEST_FIXTURE_ROOT"));
  const char *dirs[1] = {dir};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_rejected_count(set), 0);
  const hq_plugin *p = hq_plugins_find(set, "test_wide");
  assert_non_null(p);
  const hq_option *o = hq_plugin_options(p);
  static const char *const names[] = {"level", "ratio", "mode", "flag", "label"};
  static const char *const defs[] = {"3", "0.5", "fast", "false", ""};
  for (int i = 0; i < 5; i++) {
    assert_string_equal(o[i].name, names[i]);
    assert_string_equal(o[i].def, defs[i]);
  }
  assert_null(o[5].name);
  assert_string_equal(o[2].choices, "fast|exact");
  assert_true(o[1].min == 0.0 && o[1].max == 1.0);
  hq_recipe_opts ro = {.struct_size = sizeof ro, .plugins = set};
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_load_string("[format w]\nplugin = test_wide\nmode = exact\nlevel = 4\n",
                                      "wide.ini", &ro, &r));
  hq_format_info fi = {.struct_size = sizeof fi};
  size_t k = 0;
  while (k < hq_recipe_format_count(r)) {
    HQ_OK_OR_FAIL(hq_recipe_format_info(r, k, &fi));
    if (!strcmp(fi.name, "w")) break;
    k++;
  }
  assert_int_equal(fi.n_options, 5);
  assert_string_equal(fi.option_values[0], "4");
  assert_string_equal(fi.option_values[2], "exact");
  assert_string_equal(fi.option_names[4], "label");
  hq_recipe_free(r);
  hq_plugins_close(set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixtures),
      cmocka_unit_test(test_garbage_files),
      cmocka_unit_test(test_search_path),
      cmocka_unit_test(test_stock_plugins),
      cmocka_unit_test(test_wide_option_entries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
