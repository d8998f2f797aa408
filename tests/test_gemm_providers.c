/*
** test_gemm_providers.c -- GEMM providers as a module kind (hq/gemm_provider.h), through the
** public API. Fixture modules (tests/plugins/gemm_fixture.c) are loaded from a plugin folder and
** listed with the built-in providers in order of priority; the one of priority 200, which takes
** identity f32 (or row-factor) storages on the host, is the one hq_gemm runs, with the exact
** product; its predicate is asked once per kind and context (a new context or another kind asks
** again); when its run() declines the next provider runs and hq_gemm_info says why;
** hq_gemm_plan runs nothing; read through host->raw_pair (ABI 1.1) its operands give the same
** product, and a dtype raw_pair refuses fails the GEMM with the provider named; read through
** host->raw_rows (ABI 1.2) a row-scaled NVFP4 operand's values and row factors give the
** dequantized operands' product. The loader rejects broken provider modules naming the file and
** the reason. And review
** bug 7: a format module with the 2.1 table that requires only ABI 2.0 has its storages
** multiplied through their raw values and per-tensor factor. A format module's gemm op that
** reports an emulated product (ABI 2.6, tests/wrap/owngemm.c) is reported as such, with the
** providers' reason, and gives way to HQ_GEMM_FUSED_ALWAYS.
*/
#include <math.h>

#include "hq_test.h"
#include "plugins/gemm_fixture.h"

/* Folder `sub` of the fixture modules ("providers" -> .../tests/plugins/providers/.libs). */
static const char *fixture_dir(const char *sub) {
  static char buf[4][4096];
  static int next;
  const char *root = getenv("HQ_TEST_FIXTURE_ROOT");
  char *out = buf[next++ % 4];
  snprintf(out, sizeof buf[0], "%s/%s/.libs", root ? root : "tests/plugins", sub);
  return out;
}

/* Symbol `name` of the loaded module `file` (the loader keeps it mapped). */
static void *module_symbol(const char *file, const char *name) {
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) fail_msg("%s is not loaded", file);
  void *s = dlsym(h, name);
  dlclose(h);
  if (!s) fail_msg("%s has no %s", file, name);
  return s;
}

static int ends_with(const char *s, const char *tail) {
  const size_t n = strlen(s), t = strlen(tail);
  return n >= t && strcmp(s + n - t, tail) == 0;
}

// --- listing ---------------------------------------------------------------------------------

typedef struct want_provider {
  const char *name;
  int32_t priority;
  const char *file; /* the module's file name, or NULL: built in */
} want_provider;

static void expect_providers(const hq_plugins *set, const want_provider *want, size_t n) {
  assert_int_equal(hq_plugins_gemm_count(set), n);
  for (size_t i = 0; i < n; i++) {
    hq_gemm_provider_info info;
    memset(&info, 0xa5, sizeof info);
    info.struct_size = sizeof info;
    HQ_OK_OR_FAIL(hq_plugins_gemm_info(set, i, &info));
    assert_int_equal(info.struct_size, sizeof info);
    assert_string_equal(info.name, want[i].name);
    assert_int_equal(info.priority, want[i].priority);
    if (want[i].file) {
      char tail[64];
      snprintf(tail, sizeof tail, "/%s", want[i].file);
      if (!ends_with(info.file, tail)) fail_msg("provider %zu: file %s", i, info.file);
      assert_string_equal(info.version, "0.7");
      assert_string_equal(info.description, "test fixture: identity f32 and row-factor storages "
                                            "on the host, a naive loop");
    } else {
      assert_string_equal(info.file, "(built into libhqcore)");
      assert_string_equal(info.version, hq_version());
      assert_true(strlen(info.description) > 0);
    }
  }
  hq_gemm_provider_info info = {.struct_size = sizeof info};
  assert_int_equal(hq_plugins_gemm_info(set, n, &info), HQ_ENOENT);
  char msg[96];
  snprintf(msg, sizeof msg, "there are %zu GEMM providers, not %zu", n, n + 1);
  HQ_ERROR_HAS(msg);
}

/* Without a set, the built-in providers; with the fixture folder's set, its two modules among
   them by priority: test_gemm (200) first, test_gemm_low (25) between fused_hopper and
   emulated. Providers are no formats: the set holds only the built-in identity. */
static void test_listing(void **state) {
  (void)state;
  const want_provider builtin[] = {{"cublaslt", 100, NULL}, {"fused_hopper", 50, NULL},
                                   {"emulated", 0, NULL}};
  expect_providers(NULL, builtin, 3);
  const char *dirs[] = {fixture_dir("providers")};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  assert_int_equal(hq_plugins_rejected_count(set), 0);
  assert_int_equal(hq_plugins_count(set), 1);
  const want_provider all[] = {{"test_gemm", 200, "test_gemm.so"},
                               {"cublaslt", 100, NULL},
                               {"fused_hopper", 50, NULL},
                               {"test_gemm_low", 25, "test_gemm_low.so"},
                               {"emulated", 0, NULL}};
  expect_providers(set, all, 5);
  hq_gemm_provider_info info = {.struct_size = sizeof info - 1};
  assert_int_equal(hq_plugins_gemm_info(set, 0, &info), HQ_EINVAL);
  HQ_ERROR_HAS("struct_size");
  assert_int_equal(hq_plugins_gemm_info(set, 0, NULL), HQ_EINVAL);
  hq_plugins_close(set);
}

// --- the loader's rejections -----------------------------------------------------------------

/* Each broken provider module is rejected with its file and reason while loading goes on: another
   ABI major, a newer minor, a table smaller than 1.0's, a missing accepts / run / version, an
   invalid name, a built-in name, the second of two modules of one name (naming the first), and
   a module exporting neither entry point (naming both). */
static void test_rejections(void **state) {
  (void)state;
  const char *dirs[] = {fixture_dir("providers_bad")};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  char want[256];
  snprintf(want, sizeof want, "built for GEMM provider ABI %d (requires %d.0), but this core "
           "implements GEMM provider ABI %d.%d (major versions must match)", HQ_GEMM_ABI_MAJOR + 1,
           HQ_GEMM_ABI_MAJOR + 1, HQ_GEMM_ABI_MAJOR, HQ_GEMM_ABI_MINOR);
  hq_test_expect_reason(set, "bad_major.so", want);
  snprintf(want, sizeof want, "requires GEMM provider ABI %d.%d, newer than this core's %d.%d "
           "(upgrade libhqcore)", HQ_GEMM_ABI_MAJOR, HQ_GEMM_ABI_MINOR + 1, HQ_GEMM_ABI_MAJOR,
           HQ_GEMM_ABI_MINOR);
  hq_test_expect_reason(set, "newer_minor.so", want);
  snprintf(want, sizeof want, "provider table struct_size %zu is smaller than ABI 1.0's %zu bytes",
           offsetof(hq_gemm_provider, accepts),
           offsetof(hq_gemm_provider, run) + sizeof(void (*)(void)));
  hq_test_expect_reason(set, "small_table.so", want);
  hq_test_expect_reason(set, "no_accepts.so",
                        "GEMM provider 'test_gemm' lacks the required field 'accepts'");
  hq_test_expect_reason(set, "no_run.so",
                        "GEMM provider 'test_gemm' lacks the required field 'run'");
  hq_test_expect_reason(set, "no_version.so",
                        "GEMM provider 'test_gemm' lacks the required field 'version'");
  hq_test_expect_reason(set, "bad_name.so",
                        "GEMM provider name 'Test-Gemm' is not 1-31 characters of [a-z0-9_]");
  hq_test_expect_reason(set, "builtin_name.so", "GEMM provider name 'emulated' is built into "
                        "libhqcore; a module cannot replace it");
  snprintf(want, sizeof want, "duplicate GEMM provider name 'test_gemm_dup' (already provided by "
           "%s/dup_a.so)", dirs[0]);
  hq_test_expect_reason(set, "dup_b.so", want);
  hq_test_expect_reason(set, "no_entry.so", "no entry point hq_format_module_v2 in the module (is "
                        "it an hq format?), nor hq_gemm_provider_v1 (an hq GEMM provider)");
  assert_null(hq_test_reason(set, "dup_a.so"));
  assert_int_equal(hq_plugins_rejected_count(set), 10);
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++)
    if (strncmp(hq_plugins_rejected_file(set, i), dirs[0], strlen(dirs[0])) != 0)
      fail_msg("rejected file %s is not in %s", hq_plugins_rejected_file(set, i), dirs[0]);
  /* the one that loaded, among the built-in ones; the built-in emulated stays */
  const want_provider all[] = {{"test_gemm_dup", 200, "dup_a.so"},
                               {"cublaslt", 100, NULL},
                               {"fused_hopper", 50, NULL},
                               {"emulated", 0, NULL}};
  expect_providers(set, all, 4);
  hq_plugins_close(set);
}

// --- dispatch --------------------------------------------------------------------------------

/* Recipe `text`, its plugin set also loading the fixture folder `sub` (NULL: none). */
static hq_recipe *recipe_in(const char *text, const char *sub) {
  if (!sub) return hq_test_recipe(text);
  const char *dirs[] = {fixture_dir(sub)};
  return hq_test_recipe_dirs(text, dirs, 1);
}

static const char *const k_identity = "[format f]\nplugin = identity\ndtype = f32\n"
                                      "[role *:*:*]\nrowwise = f\ncolumnwise = f\n";

/* Identity f32 operands from a recipe that loads the fixture folder `sub` (NULL: none). */
static hq_recipe *identity_recipe(const char *sub) { return recipe_in(k_identity, sub); }

/* Recipe `text` whose set loaded the fixture folder, and the states of its two provider modules
   (test_gemm, 0th by priority; test_gemm_low, 3rd), counters at zero. */
static hq_recipe *fixture_recipe_of(const char *text, gemm_fixture_state **fx,
                                    gemm_fixture_state **fl) {
  hq_recipe *r = recipe_in(text, "providers");
  hq_gemm_provider_info top = {.struct_size = sizeof top}, low = {.struct_size = sizeof low};
  HQ_OK_OR_FAIL(hq_plugins_gemm_info(hq_recipe_plugins(r), 0, &top));
  HQ_OK_OR_FAIL(hq_plugins_gemm_info(hq_recipe_plugins(r), 3, &low));
  assert_string_equal(top.name, "test_gemm");
  assert_string_equal(low.name, "test_gemm_low");
  *fx = module_symbol(top.file, GEMM_FIXTURE_STATE);
  *fl = module_symbol(low.file, GEMM_FIXTURE_STATE);
  memset(*fx, 0, sizeof **fx);
  memset(*fl, 0, sizeof **fl);
  return r;
}

/* The identity f32 recipe with the fixtures (fixture_recipe_of). */
static hq_recipe *fixture_recipe(gemm_fixture_state **fx, gemm_fixture_state **fl) {
  return fixture_recipe_of(k_identity, fx, fl);
}

/* A host tensor [rows, cols] of small integers (every product below is exact). */
static hq_tensor int_tensor(int64_t rows, int64_t cols, uint64_t seed) {
  hq_tensor x = hq_test_empty(HQ_F32, rows, cols);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < rows * cols; i++)
    ((float *)x.data)[i] = (float)((int)(hq_test_rand(&s) >> 40) % 9 - 4);
  return x;
}

static hq_qtensor *quantize(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *x) {
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, x, &qt));
  return qt;
}

/* D [n, m] == alpha * op(A) op(B) exactly (A [A0, A1], B [B0, B1] row-major; the values are
   small integers, so every order of accumulation gives the same floats). */
static void expect_product(const hq_tensor *A, int ta, const hq_tensor *B, int tb, float alpha,
                           const hq_tensor *D) {
  const float *a = A->data, *b = B->data, *d = D->data;
  const int64_t m = ta ? A->rows : A->cols, k = ta ? A->cols : A->rows;
  const int64_t n = tb ? B->cols : B->rows;
  assert_int_equal(D->rows, n);
  assert_int_equal(D->cols, m);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0;
      for (int64_t p = 0; p < k; p++)
        s += (double)(ta ? a[i * A->cols + p] : a[p * A->cols + i]) *
             (double)(tb ? b[p * B->cols + j] : b[j * B->cols + p]);
      const float want = (float)(alpha * s);
      if (d[j * m + i] != want)
        fail_msg("D[%lld][%lld] = %.9g, expected %.9g", (long long)j, (long long)i,
                 (double)d[j * m + i], (double)want);
    }
}

typedef struct gemm_call {
  hq_gemm_info info;
  int rc;
} gemm_call;

/* hq_gemm of qtensors a (flag ta) and b (flag tb) into D (zeroed first), alpha 0.5, beta 0. */
static gemm_call gemm(hq_ctx *ctx, const hq_qtensor *a, int ta, const hq_qtensor *b, int tb,
                      hq_tensor *D, uint32_t flags) {
  memset(D->data, 0, (size_t)(D->rows * D->cols) * hq_dtype_size(D->dtype));
  gemm_call c;
  memset(&c.info, 0, sizeof c.info);
  c.info.struct_size = sizeof c.info;
  hq_gemm_args args = {sizeof args, flags, NULL, HQ_F32, 0, NULL, NULL};
  c.rc = hq_gemm(ctx, hq_operand_q(a), ta, hq_operand_q(b), tb, D, 0.5f, 0.0f, &args, &c.info);
  return c;
}

/* Expect call c to have run on `provider` with `path`, `reason` in info.reason ("" for none). */
static void expect_ran(const gemm_call *c, const char *provider, uint32_t path,
                       const char *reason) {
  if (c->rc != HQ_OK) fail_msg("hq_gemm -> %d: %s", c->rc, hq_last_error());
  assert_string_equal(c->info.provider, provider);
  assert_int_equal(c->info.path, path);
  if (!reason[0]) {
    assert_string_equal(c->info.reason, "");
  } else if (!strstr(c->info.reason, reason)) {
    fail_msg("reason '%s' lacks '%s'", c->info.reason, reason);
  }
}

/* Expect hq_gemm of a (transposed) and b into d to fail with HQ_EINVAL, its message naming the
   fixture provider and saying `why`. */
static void expect_refused(hq_ctx *ctx, const hq_qtensor *a, const hq_qtensor *b, hq_tensor *d,
                           const char *why) {
  const gemm_call c = gemm(ctx, a, 1, b, 0, d, 0);
  assert_int_equal(c.rc, HQ_EINVAL);
  HQ_ERROR_HAS("GEMM provider test_gemm");
  HQ_ERROR_HAS(why);
}

/* The fixture of priority 200 takes identity f32 x identity f32 on the host and computes the
   product itself (hq_gemm_info.provider = "test_gemm", path CPU as it reports, D exact). Its
   accepts() is asked once per kind and context -- another hq_gemm of the kind, other tensors of
   the same instances, a plan: no new question; a new context, another transpose pair, another D
   dtype, the caller's HQ_GEMM_FORCE_EMULATED: one more each (the last two it refuses: emulated
   runs, and info.reason carries the fixture's reason). hq_gemm_plan runs nothing. Operands
   whose formats come from a set without the fixture never ask it; with one operand from each
   set, it is asked. */
static void test_dispatch_and_cache(void **state) {
  (void)state;
  gemm_fixture_state *fx, *fl;
  hq_recipe *r = fixture_recipe(&fx, &fl);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  const int64_t m = 6, n = 5, k = 7;
  hq_ctx *ctx = NULL, *ctx2 = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor xa = int_tensor(m, k, 1), xb = int_tensor(n, k, 2), xc = int_tensor(m, k, 3);
  hq_qtensor *A = quantize(q, ctx, &xa), *B = quantize(q, ctx, &xb), *C = quantize(q, ctx, &xc);
  hq_tensor D = hq_test_empty(HQ_F32, n, m);

  gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_string_equal(c.info.format_a, "identity");
  assert_int_equal(c.info.m, m);
  assert_int_equal(c.info.n, n);
  assert_int_equal(c.info.k, k);
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 1);
  assert_int_equal(fx->runs, 1);
  assert_int_equal(fl->accepts_calls, 1); /* every candidate is asked once for the kind */
  assert_int_equal(fl->runs, 0);
  /* the kind again, and other tensors of the same instances: answered from the cache */
  c = gemm(ctx, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  c = gemm(ctx, C, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  expect_product(&xc, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 1);
  assert_int_equal(fx->runs, 3);
  /* a plan asks run() with HQ_GEMM_QUERY, which computes nothing */
  for (int64_t i = 0; i < n * m; i++) ((float *)D.data)[i] = 42.0f;
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_q(A), 1, hq_operand_q(B), 0, &D, NULL, &info));
  assert_string_equal(info.provider, "test_gemm");
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  for (int64_t i = 0; i < n * m; i++) assert_true(((float *)D.data)[i] == 42.0f);
  assert_int_equal(fx->queries, 1);
  assert_int_equal(fx->runs, 3);
  assert_int_equal(fx->accepts_calls, 1);
  /* a new context asks again (its own cache) */
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx2));
  c = gemm(ctx2, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->accepts_calls, 2);
  c = gemm(ctx2, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->accepts_calls, 2);
  /* another kind: the other transpose pair (A^T's columnwise copy, B^T's) */
  hq_tensor xa2 = int_tensor(k, m, 4), xb2 = int_tensor(k, n, 5);
  hq_qtensor *A2 = quantize(q, ctx, &xa2), *B2 = quantize(q, ctx, &xb2);
  c = gemm(ctx, A2, 0, B2, 1, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  expect_product(&xa2, 0, &xb2, 1, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 3);
  assert_int_equal(fx->runs, 6);
  /* kinds it refuses: a BF16 D, the caller forcing the emulated path */
  hq_tensor Dh = hq_test_empty(HQ_BF16, n, m);
  c = gemm(ctx, A, 1, B, 0, &Dh, 0);
  expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU,
             "test_gemm: only identity f32, row-factor or folding storages into an f32 D on the "
             "host");
  assert_int_equal(fx->accepts_calls, 4);
  c = gemm(ctx, A, 1, B, 0, &D, HQ_GEMM_FORCE_EMULATED);
  expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU, "test_gemm: the caller forced the emulated path");
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 5);
  assert_int_equal(fx->runs, 6);
  assert_int_equal(fl->runs, 0);
  assert_int_equal(fl->accepts_calls, 5);

  /* operands whose formats come from a set without the fixture: it is never asked */
  hq_recipe *plain = identity_recipe(NULL);
  hq_quantizer *qp = hq_test_quantizer(plain, "linear:weight:w");
  hq_qtensor *Ap = quantize(qp, ctx, &xa), *Bp = quantize(qp, ctx, &xb);
  c = gemm(ctx, Ap, 1, Bp, 0, &D, 0);
  expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU, "cublaslt: no native GEMM on the host");
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 5);
  /* one operand from each set: the fixture is a candidate again, whichever side brings it (the
     cache tells both instances apart, though their descriptors are equal) */
  c = gemm(ctx, Ap, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  c = gemm(ctx, A, 1, Bp, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->accepts_calls, 7);

  hq_qtensor *all[] = {A, B, C, A2, B2, Ap, Bp};
  hq_qtensors_free(all, sizeof all / sizeof all[0]);
  hq_quantizer_free(qp);
  hq_quantizer_free(q);
  hq_recipe_free(plain);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx2);
  hq_ctx_destroy(ctx);
  free(xa.data);
  free(xb.data);
  free(xc.data);
  free(xa2.data);
  free(xb2.data);
  free(D.data);
  free(Dh.data);
}

/* A provider reading its operands through host->raw_pair (provider ABI 1.1) gets what two raw()
   requests give: on the host (no side stream) the same product bit for bit; a dtype raw_pair
   refuses (F16) fails the GEMM with raw's message, the provider named. */
static void test_raw_pair(void **state) {
  (void)state;
  gemm_fixture_state *fx, *fl;
  hq_recipe *r = fixture_recipe(&fx, &fl);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  const int64_t m = 6, n = 5, k = 7;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor xa = int_tensor(m, k, 1), xb = int_tensor(n, k, 2);
  hq_qtensor *A = quantize(q, ctx, &xa), *B = quantize(q, ctx, &xb);
  hq_tensor D = hq_test_empty(HQ_F32, n, m), D2 = hq_test_empty(HQ_F32, n, m);
  fx->mode = GEMM_FIXTURE_RUN;
  gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  fx->mode = GEMM_FIXTURE_PAIR;
  fx->pairs = 0;
  c = gemm(ctx, A, 1, B, 0, &D2, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->pairs, 1);
  expect_product(&xa, 1, &xb, 0, 0.5f, &D2);
  assert_memory_equal(D.data, D2.data, (size_t)(n * m) * sizeof(float));
  fx->mode = GEMM_FIXTURE_PAIR_BAD;
  expect_refused(ctx, A, B, &D2,
                 "hq_gemm_host.raw: an operand hq_gemm did not hand out, a call without its "
                 "context, or dtype f16 (f32 or bf16)");
  assert_int_equal(fx->pairs, 1);
  fx->mode = GEMM_FIXTURE_RUN;
  hq_qtensor *all[] = {A, B};
  hq_qtensors_free(all, 2);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  free(xa.data);
  free(xb.data);
  free(D.data);
  free(D2.data);
}

/* A provider reading two NVFP4 operands through host->raw_pair_fold (provider ABI 1.3) gets each
   per-tensor factor folded by its own dequantize into a product of its own -- A's times alpha,
   B's alone: RN(alpha * fa) and fb, with f = RN(amax * RN(1/2688)) of each input (docs/formats.md)
   -- and the GEMM agrees with raw() plus factor() (test_gemm's RUN mode) to the rounding of the
   scalar; A's fold reading B's product is refused, the provider named. With B's fold reading
   A's product (ABI 1.4, a chain) B's product is RN(RN(alpha * fa) * fb), the same GEMM. */
static void test_raw_pair_fold(void **state) {
  (void)state;
  const char *text = "[format n]\nplugin = nvfp4\n[role *:*:*]\nrowwise = n\ncolumnwise = n\n";
  gemm_fixture_state *fx, *fl;
  hq_recipe *r = fixture_recipe_of(text, &fx, &fl);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  const int64_t m = 32, n = 16, k = 64;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor xa = hq_test_tensor(HQ_F32, m, k, 81, 3.0f);
  hq_tensor xb = hq_test_tensor(HQ_F32, n, k, 82, 0.25f);
  float amax[2] = {0.0f, 0.0f};
  for (int64_t i = 0; i < m * k; i++) amax[0] = fmaxf(amax[0], fabsf(((float *)xa.data)[i]));
  for (int64_t i = 0; i < n * k; i++) amax[1] = fmaxf(amax[1], fabsf(((float *)xb.data)[i]));
  const float fa = amax[0] * (1.0f / 2688.0f), fb = amax[1] * (1.0f / 2688.0f);
  hq_qtensor *A = quantize(q, ctx, &xa), *B = quantize(q, ctx, &xb);
  hq_tensor D = hq_test_empty(HQ_F32, n, m), D2 = hq_test_empty(HQ_F32, n, m);
  fx->mode = GEMM_FIXTURE_RUN;
  gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0); /* alpha 0.5 */
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  fx->mode = GEMM_FIXTURE_PAIR_FOLD;
  fx->capturing = 7;
  c = gemm(ctx, A, 1, B, 0, &D2, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->capturing, 0); /* hq_gemm_host.capturing: a host context never captures */
  assert_int_equal(fx->pair_folds, 2);
  assert_true(fx->fold_a == 0.5f * fa);
  assert_true(fx->fold_b == fb);
  const float *d = D.data, *d2 = D2.data;
  size_t nonzero = 0;
  for (int64_t i = 0; i < m * n; i++) {
    nonzero += d2[i] != 0.0f;
    if (fabsf(d2[i] - d[i]) > 0x1p-20f * fabsf(d[i]))
      fail_msg("D[%lld] = %.9g through raw_pair_fold, %.9g through raw() and factor()",
               (long long)i, (double)d2[i], (double)d[i]);
  }
  assert_true(nonzero > (size_t)(m * n) / 2);
  fx->mode = GEMM_FIXTURE_PAIR_FOLD_BAD;
  expect_refused(ctx, A, B, &D2, "hq_gemm_host.raw_pair_fold: A's fold reads B's product");
  assert_int_equal(fx->pair_folds, 2);
  fx->mode = GEMM_FIXTURE_PAIR_CHAIN;
  c = gemm(ctx, A, 1, B, 0, &D2, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->pair_folds, 4);
  assert_true(fx->fold_a == 0.5f * fa);
  assert_true(fx->fold_b == (0.5f * fa) * fb);
  for (int64_t i = 0; i < m * n; i++)
    if (fabsf(d2[i] - d[i]) > 0x1p-20f * fabsf(d[i]))
      fail_msg("D[%lld] = %.9g through a chained raw_pair_fold, %.9g through raw() and factor()",
               (long long)i, (double)d2[i], (double)d[i]);
  fx->mode = GEMM_FIXTURE_RUN;
  hq_qtensor *all[] = {A, B};
  hq_qtensors_free(all, 2);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  free(xa.data);
  free(xb.data);
  free(D.data);
  free(D2.data);
}

/* Recipe `text` loading the provider fixtures and the test_pair format (tests/plugins/pair),
   the states of test_gemm and of test_pair at zero. */
static hq_recipe *pair_recipe(const char *text, gemm_fixture_state **fx,
                              pair_fixture_state **px) {
  const char *dirs[] = {fixture_dir("providers"), fixture_dir("pair")};
  hq_recipe *r = hq_test_recipe_dirs(text, dirs, 2);
  hq_gemm_provider_info top = {.struct_size = sizeof top};
  HQ_OK_OR_FAIL(hq_plugins_gemm_info(hq_recipe_plugins(r), 0, &top));
  assert_string_equal(top.name, "test_gemm");
  *fx = module_symbol(top.file, GEMM_FIXTURE_STATE);
  const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), "test_pair");
  assert_non_null(p);
  *px = module_symbol(hq_plugin_file(p), PAIR_FIXTURE_STATE);
  memset(*fx, 0, sizeof **fx);
  memset(*px, 0, sizeof **px);
  return r;
}

/* D [n, m] == RN(scalar * S) with S the exact sum of the codes' products, A's codes ca [m, k]
   and B's cb [n, k] (A transposed, B not: gemm()'s flags). */
static void expect_codes_product(const float *ca, const float *cb, int64_t m, int64_t n,
                                 int64_t k, double scalar, const hq_tensor *D) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0;
      for (int64_t q = 0; q < k; q++) s += (double)ca[i * k + q] * cb[j * k + q];
      const float want = (float)(s * scalar), got = ((const float *)D->data)[j * m + i];
      if (got != want)
        fail_msg("D[%lld][%lld] = %.9g, expected %.9g", (long long)j, (long long)i, (double)got,
                 (double)want);
    }
}

/* A module offering dequantize_pair (format ABI 2.6; tests/plugins/pair_fixture.c) gets a GEMM's
   two raw dequantizations as one request, from two instances of it (another scale each):
   hq_gemm_host.joint says 1, and raw_pair, raw_pair_fold and a chain (B's fold reading A's
   product: RN(RN(alpha * fa) * fb)) each make one request of two dequantizes, the product exact.
   A pair the module declines (HQ_ENOTSUP) is made as two dequantizes, the same product; a pair
   it fails fails the GEMM naming both operands and the op. With an identity operand (read in
   place) there is no request: joint 0, one dequantize. */
static void test_joint_pair(void **state) {
  (void)state;
  const char *text = "[format a]\nplugin = test_pair\nscale = 0.1\n"
                     "[format b]\nplugin = test_pair\nscale = 0.3\n"
                     "[format f]\nplugin = identity\ndtype = f32\n"
                     "[role linear:weight:*]\nrowwise = a\ncolumnwise = a\n"
                     "[role linear:grad_output:*]\nrowwise = f\ncolumnwise = f\n"
                     "[role *:*:*]\nrowwise = b\ncolumnwise = b\n";
  gemm_fixture_state *fx;
  pair_fixture_state *px;
  hq_recipe *r = pair_recipe(text, &fx, &px);
  hq_quantizer *qa = hq_test_quantizer(r, "linear:weight:w");
  hq_quantizer *qb = hq_test_quantizer(r, "linear:input:x");
  hq_quantizer *qf = hq_test_quantizer(r, "linear:grad_output:y");
  const int64_t m = 6, n = 5, k = 7;
  const float fa = 0.1f, fb = 0.3f;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor xa = hq_test_tensor(HQ_F32, m, k, 21, 1.0f);
  hq_tensor xb = hq_test_tensor(HQ_F32, n, k, 22, 1.0f);
  hq_qtensor *A = quantize(qa, ctx, &xa), *B = quantize(qb, ctx, &xb), *F = quantize(qf, ctx, &xb);
  const float *ca = hq_storage_cbuf(hq_qtensor_storage(A, HQ_ROWWISE), 0)->ptr;
  const float *cb = hq_storage_cbuf(hq_qtensor_storage(B, HQ_ROWWISE), 0)->ptr;
  hq_tensor D = hq_test_empty(HQ_F32, n, m);
  const float whole = (0.5f * fa) * fb; /* RN(RN(alpha * fa) * fb) */

  /* raw_pair (factors by factor(), multiplied in double by the fixture), raw_pair_fold (each
     factor its own product, B's alone), the chain, the chain declined (two dequantizes) */
  const struct {
    int mode, decline, pairs, deqs;
    float fold_b;   /* B's product, or 0: not asked */
    double scalar;  /* alpha * fa * fb as the fixture multiplies */
  } runs[] = {
      {GEMM_FIXTURE_PAIR, 0, 1, 2, 0.0f, 0.5 * fa * (double)fb},
      {GEMM_FIXTURE_PAIR_FOLD, 0, 2, 4, fb, whole},
      {GEMM_FIXTURE_PAIR_CHAIN, 0, 3, 6, whole, whole},
      {GEMM_FIXTURE_PAIR_CHAIN, 1, 3, 8, whole, whole},
  };
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    fx->mode = runs[i].mode;
    px->decline = runs[i].decline;
    fx->fold_b = 0.0f;
    gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
    expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
    assert_int_equal(fx->joint, 1);
    assert_int_equal(px->pairs, runs[i].pairs);
    assert_int_equal(px->deqs, runs[i].deqs);
    if (runs[i].fold_b != 0.0f) {
      assert_true(fx->fold_a == 0.5f * fa);
      assert_true(fx->fold_b == runs[i].fold_b);
    }
    expect_codes_product(ca, cb, m, n, k, runs[i].scalar, &D);
  }
  px->decline = 0;
  px->fail = 1;
  gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
  assert_int_equal(c.rc, HQ_EDEVICE);
  HQ_ERROR_HAS("GEMM provider test_gemm");
  HQ_ERROR_HAS("operands A (role linear:weight:w, rowwise format 'a') and B (role "
               "linear:input:x, rowwise format 'b'), plugin test_pair, dequantize_pair");
  HQ_ERROR_HAS("test_pair: failed on purpose");
  px->fail = 0;
  /* an identity operand is read in place: no pair */
  fx->mode = GEMM_FIXTURE_PAIR;
  c = gemm(ctx, A, 1, F, 0, &D, 0);
  expect_ran(&c, "test_gemm", HQ_GEMM_PATH_CPU, "");
  assert_int_equal(fx->joint, 0);
  assert_int_equal(px->pairs, 3);
  assert_int_equal(px->deqs, 9);
  expect_codes_product(ca, xb.data, m, n, k, 0.5 * fa, &D);
  fx->mode = GEMM_FIXTURE_RUN;
  hq_qtensor *all[] = {A, B, F};
  hq_qtensors_free(all, 3);
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
  hq_quantizer_free(qf);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  free(xa.data);
  free(xb.data);
  free(D.data);
}

/* A provider reading a row-scaled NVFP4 operand through host->raw_rows (provider ABI 1.2) gets
   values without the row factors and one factor per stored row -- A rowwise (x, its rows), B
   columnwise (w transposed: its factors are per column of w) -- and its product of those, times
   the factors of row i and column j, equals the F64 product of the dequantized operands within
   FP32 accumulation (the dequantized values round RN(fp32(sf) * A_r) first); the built-in
   emulated path (both fixtures declining) agrees the same way. Asking raw_rows of an identity
   operand fails the GEMM with the service's message. */
static void test_raw_rows(void **state) {
  (void)state;
  const char *text = "[format f]\nplugin = identity\ndtype = f32\n"
                     "[format nr]\nplugin = nvfp4\nglobal_scale = row\n"
                     "[role *:*:*]\nrowwise = f\ncolumnwise = f\n"
                     "[role linear:*:nr]\nrowwise = nr\ncolumnwise = nr\n";
  gemm_fixture_state *fx, *fl;
  hq_recipe *r = fixture_recipe_of(text, &fx, &fl);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:nr");
  hq_quantizer *qf = hq_test_quantizer(r, "linear:input:f");
  const int64_t m = 48, n = 32, k = 64; /* D = x w: x [m, k] rowwise, w [k, n] columnwise */
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, m, k, 71, 3.0f), w = hq_test_tensor(HQ_F32, k, n, 72, 0.5f);
  for (int64_t i = 0; i < m; i++) /* rows of very different magnitudes: the factors matter */
    for (int64_t p = 0; p < k; p++) ((float *)x.data)[i * k + p] *= ldexpf(1.0f, (int)(i % 9) - 4);
  hq_qtensor *X = quantize(q, ctx, &x), *W = quantize(q, ctx, &w);
  hq_tensor xd = hq_test_empty(HQ_F32, m, k), wd = hq_test_empty(HQ_F32, k, n);
  HQ_OK_OR_FAIL(hq_dequantize(X, ctx, HQ_ROWWISE, &xd));
  HQ_OK_OR_FAIL(hq_dequantize(W, ctx, HQ_COLWISE, &wd));
  hq_tensor D = hq_test_empty(HQ_F32, n, m);
  for (int declined = 0; declined < 2; declined++) {
    fx->mode = fl->mode = declined ? GEMM_FIXTURE_DECLINE : GEMM_FIXTURE_RUN;
    fx->rows = fx->folds = 0;
    gemm_call c = gemm(ctx, X, 1, W, 1, &D, 0); /* alpha 0.5 */
    expect_ran(&c, declined ? "emulated" : "test_gemm", HQ_GEMM_PATH_CPU,
               declined ? "test_gemm: declined" : "");
    assert_int_equal(fx->rows, declined ? 0 : 2);
    assert_int_equal(fx->folds, declined ? 0 : 2); /* nvfp4 folds (HQ_CAP_DEQ_FACTOR) */
    const float *a = xd.data, *b = wd.data, *d = D.data;
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < m; i++) {
        double sum = 0, mag = 0;
        for (int64_t p = 0; p < k; p++) {
          sum += 0.5 * a[i * k + p] * b[p * n + j];
          mag += fabs(0.5 * a[i * k + p] * b[p * n + j]);
        }
        if (!(fabs(d[j * m + i] - sum) <= (double)(k + 16) * 0x1p-23 * mag + 1e-30))
          fail_msg("%s: D[%lld][%lld] = %.9g, F64 %.9g", declined ? "emulated" : "raw_rows",
                   (long long)j, (long long)i, (double)d[j * m + i], sum);
      }
  }
  /* raw_rows of an operand without row factors: the service's refusal, the provider named */
  hq_qtensor *F = quantize(qf, ctx, &x);
  fx->mode = GEMM_FIXTURE_ROWS_BAD;
  hq_tensor D2 = hq_test_empty(HQ_F32, m, m);
  expect_refused(ctx, F, F, &D2, "has no per-row factors");
  fx->mode = fl->mode = GEMM_FIXTURE_RUN;
  hq_qtensor *all[] = {X, W, F};
  hq_qtensors_free(all, 3);
  hq_quantizer_free(q);
  hq_quantizer_free(qf);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  free(x.data), free(w.data), free(xd.data), free(wd.data), free(D.data), free(D2.data);
}

/* When the accepting provider's run() declines (HQ_ENOTSUP, nothing run), the next accepting
   one runs: test_gemm_low, then, with both declining, emulated; info.reason carries the first
   decline's message. A provider's failure (not HQ_ENOTSUP) is hq_gemm's, with the provider
   named. The predicates are not asked again. */
static void test_decline(void **state) {
  (void)state;
  gemm_fixture_state *fx, *fl;
  hq_recipe *r = fixture_recipe(&fx, &fl);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  const int64_t m = 4, n = 3, k = 8;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor xa = int_tensor(m, k, 7), xb = int_tensor(n, k, 8), D = hq_test_empty(HQ_F32, n, m);
  hq_qtensor *A = quantize(q, ctx, &xa), *B = quantize(q, ctx, &xb);

  fx->mode = GEMM_FIXTURE_DECLINE;
  gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
  expect_ran(&c, "test_gemm_low", HQ_GEMM_PATH_CPU, "test_gemm: declined m = 4 on purpose");
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->declines, 1);
  assert_int_equal(fl->runs, 1);
  fl->mode = GEMM_FIXTURE_DECLINE;
  c = gemm(ctx, A, 1, B, 0, &D, 0);
  expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU, "test_gemm: declined m = 4 on purpose");
  expect_product(&xa, 1, &xb, 0, 0.5f, &D);
  assert_int_equal(fx->declines, 2);
  assert_int_equal(fl->declines, 1);
  /* a plan goes the same way */
  hq_gemm_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_q(A), 1, hq_operand_q(B), 0, NULL, NULL, &info));
  assert_string_equal(info.provider, "emulated");
  assert_int_equal(fx->queries + fl->queries, 0);
  /* a failure is not a decline */
  fx->mode = GEMM_FIXTURE_FAIL;
  c = gemm(ctx, A, 1, B, 0, &D, 0);
  assert_int_equal(c.rc, HQ_EDEVICE);
  HQ_ERROR_HAS("GEMM provider test_gemm");
  HQ_ERROR_HAS("test_gemm: failed on purpose");
  assert_int_equal(fx->declines, 4);
  assert_int_equal(fl->declines, 2); /* as after the plan: test_gemm_low was not reached */
  assert_int_equal(fx->accepts_calls, 1);
  assert_int_equal(fl->accepts_calls, 1);
  fx->mode = fl->mode = GEMM_FIXTURE_RUN;

  hq_qtensor *all[] = {A, B};
  hq_qtensors_free(all, 2);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
  free(xa.data);
  free(xb.data);
  free(D.data);
}

// --- a module's own emulated GEMM (ABI 2.6) --------------------------------------------------

/* A format module's gemm op may multiply the raw values itself and say so (emul_out): the
   wrapped fp8_tensor of tests/wrap/owngemm.c does on the host for every m but 8 and 16. The
   core then reports path emulated-f32, the module as provider, and the reason the providers
   give (cublaslt's first refusal), and D is what the op wrote. The caller's
   HQ_GEMM_FUSED_ALWAYS leaves such a problem to the providers (the op is only asked, it writes
   nothing: D is the emulated path's product, equal to HQ_GEMM_FORCE_EMULATED's). A decline
   with a message gives that reason; one without a message leaves the providers'. */
static void test_module_emulated(void **state) {
  (void)state;
  const char *wrap = getenv("HQ_TEST_WRAP_DIR");
  if (!wrap) fail_msg("HQ_TEST_WRAP_DIR is not set (make check sets it to tests/wrap/.libs)");
  hq_recipe *r = hq_test_recipe_dirs("[format f]\nplugin = fp8_tensor_owngemm\n"
                                     "[role *:*:*]\nrowwise = f\ncolumnwise = f\n", &wrap, 1);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const int64_t ms[3] = {32, 8, 16}, n = 5, k = 24;
  for (int t = 0; t < 3; t++) {
    const int64_t m = ms[t];
    hq_tensor xa = int_tensor(m, k, 21 + (uint64_t)t), xb = int_tensor(n, k, 31);
    hq_qtensor *A = quantize(q, ctx, &xa), *B = quantize(q, ctx, &xb);
    hq_tensor D = hq_test_empty(HQ_F32, n, m), E = hq_test_empty(HQ_F32, n, m);
    gemm_call c = gemm(ctx, A, 1, B, 0, &D, 0);
    const gemm_call e = gemm(ctx, A, 1, B, 0, &E, HQ_GEMM_FORCE_EMULATED);
    expect_ran(&e, "emulated", HQ_GEMM_PATH_CPU, "the caller forced the emulated path");
    if (m == 32) {
      expect_ran(&c, "fp8_tensor_owngemm", HQ_GEMM_PATH_EMULATED_F32,
                 "cublaslt: no native GEMM on the host");
      for (int64_t i = 0; i < m * n; i++) assert_true(((float *)D.data)[i] == 42.0f);
      c = gemm(ctx, A, 1, B, 0, &D, HQ_GEMM_FUSED_ALWAYS);
      expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU, "cublaslt: no native GEMM on the host");
      assert_memory_equal(D.data, E.data, (size_t)(m * n) * sizeof(float));
      /* a plan with the flag names the path a run takes (it named the module's) */
      hq_gemm_args fa = {sizeof fa, HQ_GEMM_FUSED_ALWAYS, NULL, HQ_F32, 0, NULL, NULL};
      hq_gemm_info pi = {.struct_size = sizeof pi};
      HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_q(A), 1, hq_operand_q(B), 0, &D, &fa, &pi));
      assert_string_equal(pi.provider, "emulated");
      assert_int_equal(pi.path, HQ_GEMM_PATH_CPU);
    } else {
      expect_ran(&c, "emulated", HQ_GEMM_PATH_CPU,
                 m == 8 ? "fp8_tensor_owngemm: declined m = 8 on purpose"
                        : "cublaslt: no native GEMM on the host");
      assert_memory_equal(D.data, E.data, (size_t)(m * n) * sizeof(float));
    }
    hq_qtensor_free(A);
    hq_qtensor_free(B);
    free(xa.data);
    free(xb.data);
    free(D.data);
    free(E.data);
  }
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

// --- review bug 7: a module's offer, by its table ------------------------------------------

/* test_raw_factor (tests/plugins/raw_factor.c) has the 2.1 table and a tensor_factor op but
   requires ABI 2.0. The emulated GEMM dequantizes its storages with HQ_CALL_DEQ_RAW (the codes)
   and multiplies alpha by the two per-tensor factors: D = RN(RN(RN(alpha * fa) * fb) * S) with S
   the exact integer sum of the codes' products, bit for bit. Before, its minor 0 made the core
   ask for a full dequantize (RN(q * f) per element), whose product rounds otherwise. */
static void test_raw_by_table_size(void **state) {
  (void)state;
  const char *dirs[] = {fixture_dir("minor0")};
  hq_recipe *ra = hq_test_recipe_dirs("[format a]\nplugin = test_raw_factor\nscale = 0.1\n"
                                      "[role *:*:*]\nrowwise = a\ncolumnwise = a\n", dirs, 1);
  hq_recipe *rb = hq_test_recipe_dirs("[format b]\nplugin = test_raw_factor\nscale = 0.3\n"
                                      "[role *:*:*]\nrowwise = b\ncolumnwise = b\n", dirs, 1);
  const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(ra), "test_raw_factor");
  assert_non_null(p);
  assert_int_equal(hq_plugin_abi_minor(p), 0);
  raw_factor_counts *cnt = module_symbol(hq_plugin_file(p), RAW_FACTOR_COUNTS);
  hq_quantizer *qa = hq_test_quantizer(ra, "linear:weight:w");
  hq_quantizer *qb = hq_test_quantizer(rb, "linear:input:x");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const int64_t m = 8, n = 6, k = 32;
  const float alpha = 0.7f, fa = 0.1f, fb = 0.3f;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      hq_tensor xa = hq_test_tensor(HQ_F32, ta ? m : k, ta ? k : m, 11 + ta, 1.0f);
      hq_tensor xb = hq_test_tensor(HQ_F32, tb ? k : n, tb ? n : k, 13 + tb, 1.0f);
      hq_qtensor *A = quantize(qa, ctx, &xa), *B = quantize(qb, ctx, &xb);
      /* the codes, as the storages of the directions the flags take hold them */
      const hq_storage *sa = hq_qtensor_storage(A, ta ? HQ_ROWWISE : HQ_COLWISE);
      const hq_storage *sb = hq_qtensor_storage(B, tb ? HQ_COLWISE : HQ_ROWWISE);
      const float *ca = hq_storage_cbuf(sa, 0)->ptr, *cb = hq_storage_cbuf(sb, 0)->ptr;
      hq_tensor D = hq_test_empty(HQ_F32, n, m);
      memset(cnt, 0, sizeof *cnt);
      hq_gemm_info info = {.struct_size = sizeof info};
      HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &D, alpha, 0.0f, NULL,
                            &info));
      assert_string_equal(info.provider, "emulated");
      assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
      assert_int_equal(cnt->deq_raw, 2);
      assert_int_equal(cnt->deq_full, 0);
      assert_int_equal(cnt->factor, 2);
      const float al = (alpha * fa) * fb;
      for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
          double s = 0;
          for (int64_t q = 0; q < k; q++) {
            const float a = ta ? ca[i * k + q] : ca[q * m + i];
            const float b = tb ? cb[q * n + j] : cb[j * k + q];
            assert_true(a == floorf(a) && fabsf(a) <= 64.0f);
            s += (double)a * b;
          }
          const float want = al * (float)s, got = ((float *)D.data)[j * m + i];
          if (got != want)
            fail_msg("%c%c D[%lld][%lld] = %.9g, expected %.9g", ta ? 'T' : 'N', tb ? 'T' : 'N',
                     (long long)j, (long long)i, (double)got, (double)want);
        }
      hq_qtensor *all[] = {A, B};
      hq_qtensors_free(all, 2);
      free(xa.data);
      free(xb.data);
      free(D.data);
    }
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
  hq_recipe_free(ra);
  hq_recipe_free(rb);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_listing),
      cmocka_unit_test(test_rejections),
      cmocka_unit_test(test_dispatch_and_cache),
      cmocka_unit_test(test_raw_pair),
      cmocka_unit_test(test_raw_pair_fold),
      cmocka_unit_test(test_joint_pair),
      cmocka_unit_test(test_raw_rows),
      cmocka_unit_test(test_decline),
      cmocka_unit_test(test_raw_by_table_size),
      cmocka_unit_test(test_module_emulated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
