/*
** test_gemm_cublaslt.c -- the "cublaslt" GEMM provider, loaded as a module (its source built
** without HQ_GEMM_BUILTIN) and handed a mock host: a host table whose lt_matmul records what it
** is given (hq_mock_lt) and whose device_arch answers the architecture a test sets, a factor
** service that writes known values, an allocator that counts. The operands are real storages,
** quantized on the host through the public API for each stock format and option set, marked as
** living on mock device 0. For each format: what accepts() answers per architecture (the exact
** status and the reason's words), and what run() hands cuBLASLt, field by field, for every
** transpose pair and with and without HQ_GEMM_QUERY; the refusals, none of which reaches the
** runner; and how the runner reads HQ_GEMM_AUTOTUNE (lt_names.h). Nothing runs on a GPU.
*/
#include <math.h>

#include "hq_test.h"
#include "hq/gemm_provider.h"
#include "../gemm/cublaslt/lt_names.h"

static hq_ctx *g_ctx;
static hq_host_api g_api;
static hq_gemm_host g_host;
static const hq_gemm_provider *g_lt;
static hq_gemm_entry_fn g_entry;
static void *g_module;

/* The per-tensor factors the mock factor service writes for operands A and B (run.a / run.b
   carry a pointer to one of them as their handle). */
static const float g_factor_value[2] = {0.375f, 1.25f};
static int g_factor_calls, g_factor_rc;
static int g_allocs, g_frees;
static void *g_last_alloc;
/* The factors lt_matmul could read when it was called (NAN: none, or a query). */
static float g_seen_factor[2];

static void *mock_alloc(const hq_call *call, size_t bytes) {
  g_allocs++;
  g_last_alloc = hq_test_host_alloc(call, bytes);
  return g_last_alloc;
}
static void mock_free(const hq_call *call, void *p) {
  if (p) g_frees++;
  hq_test_host_free(call, p);
}
static int mock_factor(const hq_call *call, const hq_gemm_operand *o, float *out) {
  (void)call;
  g_factor_calls++;
  if (g_factor_rc) return g_api.error(g_factor_rc, "mock factor service: failed on purpose");
  *out = *(const float *)o->handle;
  return HQ_OK;
}
static int mock_raw(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt, const void **data,
                    void **tmp, hq_gemm_fold *fold) {
  (void)call;
  (void)o;
  (void)dt;
  (void)data;
  (void)tmp;
  (void)fold;
  fail_msg("cublaslt asked for an operand's raw values: its GEMMs read the stored codes");
  return HQ_EINVAL;
}
/* hq_mock_lt, reading the alpha factors while they are valid (the provider frees them after). */
static int lt_record(const hq_call *call, const hq_lt_matmul *mm) {
  for (int i = 0; i < 2; i++)
    g_seen_factor[i] = mm->alpha_factor[i] && !(mm->flags & HQ_GEMM_QUERY) ? *mm->alpha_factor[i]
                                                                           : NAN;
  return hq_mock_lt(call, mm);
}

static int setup(void **state) {
  (void)state;
  const char *root = getenv("HQ_TEST_FIXTURE_ROOT");
  char path[4096];
  snprintf(path, sizeof path, "%s/cublaslt/.libs/cublaslt.so", root ? root : "tests/plugins");
  g_module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!g_module) {
    fprintf(stderr, "%s: %s\n", path, dlerror());
    return -1;
  }
  g_entry = (hq_gemm_entry_fn)(uintptr_t)dlsym(g_module, HQ_GEMM_ENTRY_NAME);
  if (!g_entry) return -1;
  g_api = hq_test_host();
  g_api.device_arch = hq_mock_arch;
  g_api.lt_matmul = lt_record;
  g_api.alloc = mock_alloc;
  g_api.free = mock_free;
  g_host = (hq_gemm_host){HQ_GEMM_ABI_MAJOR, HQ_GEMM_ABI_MINOR, sizeof g_host, &g_api, mock_raw,
                          mock_factor, NULL, NULL, NULL, NULL, NULL};
  g_lt = g_entry(&g_host);
  return g_lt && hq_ctx_create(NULL, &g_ctx) == HQ_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  hq_ctx_destroy(g_ctx);
  return 0;
}

// --- operands --------------------------------------------------------------------------------

/* A format as a recipe names it, and the hq_gemm_operand_kind.flags the core gives its storages
   (its table has the 2.1 layout: RAW; a tensor_factor op: FACTOR; HQ_CAP_DEQ_FACTOR: FOLDS). */
typedef struct fmt {
  const char *plugin, *opts;
  uint32_t flags;
} fmt;
#define RAW HQ_GEMM_OP_RAW
#define FACTOR (HQ_GEMM_OP_RAW | HQ_GEMM_OP_FACTOR | HQ_GEMM_OP_FOLDS)

/* One operand: its recipe and qtensor (quantized on the host) and a copy of the storage of the
   direction the transpose flag selects, marked as on mock device 0. */
typedef struct side {
  hq_recipe *r;
  hq_qtensor *qt;
  hq_storage st;
} side;

/* A problem of an m x n x k GEMM as hq_gemm would hand it to the provider. */
typedef struct problem {
  side a, b;
  hq_gemm_kind kind;
  hq_gemm_run run;
  float dbuf[4];
  hq_tensor d;
} problem;

static void side_make(side *s, fmt f, int64_t rows, int64_t cols, uint32_t dir, uint64_t seed) {
  char text[512];
  snprintf(text, sizeof text, "[format f]\nplugin = %s\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", f.plugin, f.opts);
  s->r = hq_test_recipe(text);
  hq_quantizer *q = hq_test_quantizer(s->r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_F32, rows, cols, seed, 1.0f);
  HQ_OK_OR_FAIL(hq_quantize(q, g_ctx, &x, &s->qt));
  hq_quantizer_free(q);
  free(x.data);
  const hq_storage *st = hq_qtensor_storage(s->qt, dir);
  assert_non_null(st);
  assert_int_equal(st->buf_size, sizeof(hq_buffer)); /* a copy by value keeps its buffers */
  s->st = *st;
  s->st.device = 0;
}

static void side_op(side *s, const fmt *f, uint32_t dir, int trans, const float *factor,
                    hq_gemm_operand_kind *k, hq_gemm_operand *o) {
  k->dir = dir;
  k->trans = trans;
  k->dtype = s->st.desc.elem;
  k->flags = f->flags;
  k->desc = &s->st.desc;
  k->format = f->plugin;
  o->st = &s->st;
  o->hp = NULL;
  o->rows = s->st.rows;
  o->cols = s->st.cols;
  o->role = "linear:weight:w";
  o->handle = factor;
}

/* A (ta ? [m, k] : [k, m]) by instance fa, B (tb ? [k, n] : [n, k]) by fb, in the directions
   hq_gemm takes (A: T -> rowwise, N -> columnwise; B: N -> rowwise, T -> columnwise); D of
   dtype dd, alpha, beta; device 0 at sm_`arch`. */
static void problem_make(problem *p, fmt fa, fmt fb, int ta, int tb, int64_t m, int64_t n,
                         int64_t k, hq_dtype dd, float alpha, float beta, int arch) {
  memset(p, 0, sizeof *p);
  const uint32_t da = ta ? HQ_ROWWISE : HQ_COLWISE, db = tb ? HQ_COLWISE : HQ_ROWWISE;
  side_make(&p->a, fa, ta ? m : k, ta ? k : m, da, 1);
  side_make(&p->b, fb, tb ? k : n, tb ? n : k, db, 2);
  p->d = hq_tensor_2d(p->dbuf, dd, 0, n, m);
  p->kind.struct_size = sizeof p->kind;
  p->kind.device = 0;
  hq_mock()->arch = arch;
  p->kind.arch = g_api.device_arch(0);
  p->kind.d_dtype = dd;
  side_op(&p->a, &fa, da, ta, &g_factor_value[0], &p->kind.a, &p->run.a);
  side_op(&p->b, &fb, db, tb, &g_factor_value[1], &p->kind.b, &p->run.b);
  p->run.struct_size = sizeof p->run;
  p->run.kind = &p->kind;
  p->run.m = m;
  p->run.n = n;
  p->run.k = k;
  p->run.d = &p->d;
  p->run.alpha = alpha;
  p->run.beta = beta;
  p->run.what = "test";
}
static void problem_free(problem *p) {
  hq_qtensor_free(p->a.qt);
  hq_qtensor_free(p->b.qt);
  hq_recipe_free(p->a.r);
  hq_recipe_free(p->b.r);
}

static void set_arch(problem *p, int arch) {
  hq_mock()->arch = arch;
  p->kind.arch = g_api.device_arch(p->kind.device);
}

static int accepts(problem *p) {
  hq_test_module_error()[0] = '\0';
  return g_lt->accepts(&g_host, &p->kind);
}

/* run() on the problem's device with `flags`; the counters start at zero, and whatever the
   provider allocated is freed again. */
static int run(problem *p, uint32_t flags) {
  hq_test_module_error()[0] = '\0';
  hq_mock()->lt_calls = 0;
  memset(&hq_mock()->mm, 0, sizeof hq_mock()->mm);
  g_allocs = g_frees = g_factor_calls = 0;
  g_last_alloc = NULL;
  p->run.flags = flags;
  p->run.path = HQ_GEMM_PATH_NONE;
  hq_call call = hq_test_call(&g_api, 0, 0);
  call.device = p->kind.device;
  const int rc = g_lt->run(&g_host, &call, &p->run);
  assert_int_equal(g_frees, g_allocs);
  return rc;
}

/* accepts() takes p's kind. */
#define ACCEPTED(p)                                                                            \
  do {                                                                                         \
    if (accepts(p) != HQ_OK) fail_msg("accepts: %s", hq_test_module_error());                  \
  } while (0)

/* The status and every needle in the provider's message. */
static void expect_msg(int rc, int want, const char *const *needles, size_t n) {
  const char *msg = hq_test_module_error();
  if (rc != want) fail_msg("status %d, expected %d (message: %s)", rc, want, msg);
  for (size_t i = 0; i < n; i++)
    if (!strstr(msg, needles[i])) fail_msg("message '%s' lacks '%s'", msg, needles[i]);
}
#define EXPECT(rc, want, ...)                                                                  \
  do {                                                                                         \
    const char *const nd_[] = {__VA_ARGS__};                                                   \
    expect_msg((rc), (want), nd_, sizeof nd_ / sizeof nd_[0]);                                 \
  } while (0)

/* A refusal of run(): the status, the words, and no call of the runner. */
#define EXPECT_RUN_REFUSED(p, flags, want, ...)                                                \
  do {                                                                                         \
    EXPECT(run((p), (flags)), (want), __VA_ARGS__);                                            \
    assert_int_equal(hq_mock()->lt_calls, 0);                                                  \
  } while (0)

/* An operand as cuBLASLt got it: storage st's data buffer (index 0) and, for a scaled mode, its
   scale buffer (index 1). */
static void expect_lt_operand(const hq_lt_operand *o, const hq_storage *st, hq_dtype elem,
                              int trans, int64_t rows, int64_t cols, int64_t ld, uint32_t mode) {
  assert_int_equal(hq_storage_cbuf(st, 0)->role, HQ_ROLE_DATA);
  assert_ptr_equal(o->data, hq_storage_cbuf(st, 0)->ptr);
  assert_int_equal(o->elem, elem);
  assert_int_equal(o->trans, trans);
  assert_int_equal(o->rows, rows);
  assert_int_equal(o->cols, cols);
  assert_int_equal(o->ld, ld);
  assert_int_equal(o->scale_mode, mode);
  if (mode == HQ_SCALE_NONE) {
    assert_null(o->scale);
  } else {
    assert_int_equal(hq_storage_cbuf(st, 1)->role, HQ_ROLE_SCALE);
    assert_ptr_equal(o->scale, hq_storage_cbuf(st, 1)->ptr);
  }
}

/* The problem's fields of the one matmul run() handed on: flags, sizes, alpha, beta, D (column-
   major m x n, ld m), no bias, split accumulation, the description. */
static void expect_lt_problem(const problem *p, uint32_t flags, const char *what) {
  const hq_lt_matmul *mm = &hq_mock()->mm;
  assert_int_equal(hq_mock()->lt_calls, 1);
  assert_int_equal(mm->struct_size, sizeof(hq_lt_matmul));
  assert_int_equal(mm->flags, flags);
  assert_int_equal(mm->m, p->run.m);
  assert_int_equal(mm->n, p->run.n);
  assert_int_equal(mm->k, p->run.k);
  assert_true(mm->alpha == p->run.alpha);
  assert_true(mm->beta == p->run.beta);
  assert_ptr_equal(mm->d, p->dbuf);
  assert_int_equal(mm->d_dtype, p->d.dtype);
  assert_int_equal(mm->ldd, p->run.m);
  assert_null(mm->bias);
  assert_null(mm->alpha_device);
  assert_int_equal(mm->fast_accum, 0);
  assert_string_equal(hq_mock()->what, what);
  assert_int_equal(p->run.path, HQ_GEMM_PATH_NATIVE);
}

static void expect_no_factors(void) {
  assert_null(hq_mock()->mm.alpha_factor[0]);
  assert_null(hq_mock()->mm.alpha_factor[1]);
  assert_int_equal(g_factor_calls, 0);
  assert_int_equal(g_allocs, 0);
}

/* With cuBLASLt's refusal (lt_matmul's HQ_ENOTSUP) run() answers HQ_ENOTSUP too. */
static void expect_runner_refusal_passed(problem *p, uint32_t flags) {
  hq_mock()->lt_rc = HQ_ENOTSUP;
  assert_int_equal(run(p, flags), HQ_ENOTSUP);
  assert_int_equal(hq_mock()->lt_calls, 1);
  hq_mock()->lt_rc = HQ_OK;
}

static const char *const g_arch_names[] = {"is sm_0",   "is sm_75",  "is sm_80",
                                           "is sm_89",  "is sm_90",  "is sm_100",
                                           "is sm_103", "is sm_120"};
static const int g_archs[] = {0, 75, 80, 89, 90, 100, 103, 120};
#define N_ARCHS (sizeof g_archs / sizeof g_archs[0])

/* accepts() of p on every architecture of g_archs: HQ_OK where `ok` has the architecture's
   bit (1 << index), else HQ_ENOTSUP with `need` in the reason, and with by_arch the device and
   its architecture too. */
static void expect_archs(problem *p, unsigned ok, const char *need, int by_arch) {
  for (size_t i = 0; i < N_ARCHS; i++) {
    set_arch(p, g_archs[i]);
    if (ok & (1u << i)) {
      if (accepts(p) != HQ_OK) fail_msg("sm_%d: %s", g_archs[i], hq_test_module_error());
    } else if (by_arch) {
      EXPECT(accepts(p), HQ_ENOTSUP, need, "device 0", g_arch_names[i]);
    } else {
      EXPECT(accepts(p), HQ_ENOTSUP, need);
    }
  }
}
#define ARCH(a) (1u << ((a) == 0 ? 0 : (a) == 75 ? 1 : (a) == 80 ? 2 : (a) == 89 ? 3 : \
                        (a) == 90 ? 4 : (a) == 100 ? 5 : (a) == 103 ? 6 : 7))

// --- the module ------------------------------------------------------------------------------

/* Built from gemm/cublaslt/cublaslt.c without HQ_GEMM_BUILTIN, the provider is a module like a
   third party's: it exports the ABI's entry (not the built-in hqi_gemm_cublaslt), refuses a
   host of another major, and returns the table libhqcore lists as "cublaslt". */
static void test_module(void **state) {
  (void)state;
  assert_null(dlsym(g_module, "hqi_gemm_cublaslt"));
  assert_int_equal(g_lt->abi_major, HQ_GEMM_ABI_MAJOR);
  assert_int_equal(g_lt->abi_minor, 0);
  assert_int_equal(g_lt->struct_size, sizeof(hq_gemm_provider));
  assert_int_equal(g_lt->priority, 100);
  assert_string_equal(g_lt->name, "cublaslt");
  assert_string_equal(g_lt->version, hq_version());
  assert_non_null(strstr(g_lt->description, "cuBLASLt"));
  assert_non_null(g_lt->accepts);
  assert_non_null(g_lt->run);
  hq_gemm_host other = g_host;
  other.abi_major = HQ_GEMM_ABI_MAJOR + 1;
  assert_null(g_entry(&other));
  assert_null(g_entry(NULL));
  /* the one libhqcore lists is the same provider */
  hq_gemm_provider_info info = {.struct_size = sizeof info};
  HQ_OK_OR_FAIL(hq_plugins_gemm_info(NULL, 0, &info));
  assert_string_equal(info.name, "cublaslt");
  assert_int_equal(info.priority, g_lt->priority);
  assert_string_equal(info.description, g_lt->description);
}

// --- per-tensor FP8 (fp8_tensor) -------------------------------------------------------------

static const fmt T_E4 = {"fp8_tensor", "dtype = e4m3", FACTOR};
static const fmt T_E5 = {"fp8_tensor", "dtype = e5m2", FACTOR};

/* Per-tensor FP8 runs natively from sm_89 on. For every flag pair and element pair (e4m3 x
   e4m3, e4m3 x e5m2, e5m2 x e4m3) run() hands cuBLASLt the "TN" call: each operand's data
   ([outer, k] rowwise, the transposed [k, outer] columnwise copy, both k-contiguous) as a
   column-major k x outer matrix with ld k, A transposed, B not; TENSOR_F32 scales = the
   storages' scale_inv; no alpha factor (the scale IS the per-tensor factor, though the kind says
   FACTOR); D column-major m x n, ld m; split accumulation; the query flag passed on and
   cuBLASLt's refusal returned. Refused: sm_80 and older, e5m2 x e5m2, k % 16, misaligned
   data. */
static void test_fp8_tensor(void **state) {
  (void)state;
  const int64_t M = 32, N = 48, K = 64;
  problem p;
  problem_make(&p, T_E4, T_E4, 1, 0, M, N, K, HQ_BF16, 1.5f, 0.25f, 90);
  expect_archs(&p, ARCH(89) | ARCH(90) | ARCH(100) | ARCH(103) | ARCH(120), "sm_89 or newer", 1);
  /* misaligned data: refused before cuBLASLt (the scale, one FP32 value, may lie anywhere) */
  set_arch(&p, 90);
  hq_buffer *data = hq_storage_buf(&p.a.st, 0);
  data->ptr = (char *)data->ptr + 1;
  EXPECT_RUN_REFUSED(&p, 0, HQ_ENOTSUP, "operand A's data buffer is not 16-byte aligned");
  data->ptr = (char *)data->ptr - 1;
  hq_buffer *scale = hq_storage_buf(&p.a.st, 1);
  scale->ptr = (char *)scale->ptr + 4;
  assert_int_equal(run(&p, HQ_GEMM_QUERY), HQ_OK);
  problem_free(&p);

  const char *names[3] = {"cublaslt e4m3 x e4m3 (tensor_f32 x tensor_f32)",
                          "cublaslt e4m3 x e5m2 (tensor_f32 x tensor_f32)",
                          "cublaslt e5m2 x e4m3 (tensor_f32 x tensor_f32)"};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int pair = 0; pair < 3; pair++) {
        problem_make(&p, pair == 2 ? T_E5 : T_E4, pair == 1 ? T_E5 : T_E4, ta, tb, M, N, K,
                     HQ_BF16, 1.5f, 0.25f, 90);
        ACCEPTED(&p);
        for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
          if (run(&p, fl) != HQ_OK) fail_msg("run: %s", hq_test_module_error());
          expect_lt_problem(&p, fl, names[pair]);
          expect_lt_operand(&hq_mock()->mm.a, &p.a.st, pair == 2 ? HQ_E5M2 : HQ_E4M3, 1, K, M, K,
                            HQ_SCALE_TENSOR_F32);
          expect_lt_operand(&hq_mock()->mm.b, &p.b.st, pair == 1 ? HQ_E5M2 : HQ_E4M3, 0, K, N, K,
                            HQ_SCALE_TENSOR_F32);
          expect_no_factors();
          expect_runner_refusal_passed(&p, fl);
        }
        problem_free(&p);
      }

  problem_make(&p, T_E5, T_E5, 0, 1, M, N, K, HQ_BF16, 1.5f, 0.25f, 90);
  EXPECT(accepts(&p), HQ_ENOTSUP, "no e5m2 x e5m2 FP8 GEMM");
  problem_free(&p);
  problem_make(&p, T_E4, T_E5, 1, 1, M, N, 40, HQ_BF16, 1.5f, 0.25f, 90);
  ACCEPTED(&p); /* k is the problem's, not the kind's */
  for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY)
    EXPECT_RUN_REFUSED(&p, fl, HQ_ENOTSUP, "k = 40 is not a multiple of 16", "FP8");
  problem_free(&p);
}

// --- FP8 blocks (fp8_block) ------------------------------------------------------------------

static const fmt B1 = {"fp8_block", "block = 1d\ndtype = e4m3\npower_2_scales = true", RAW};
static const fmt B1E5 = {"fp8_block", "block = 1d\ndtype = e5m2\npower_2_scales = true", RAW};
static const fmt B2 = {"fp8_block", "block = 2d\ndtype = e4m3\npower_2_scales = false", RAW};

/* FP8 blocks run natively on Hopper only. For every flag pair and the block pairs 1-D x 1-D
   (e4m3 x e5m2), 2-D x 1-D and 1-D x 2-D, run() hands cuBLASLt the "TN" call: data as a column-
   major k x outer matrix, ld k, A transposed; VEC128_F32 scales for a 1-D storage and
   BLK128X128_F32 for a 2-D one, each its scale buffer as stored; no alpha factor; D column-major
   m x n, ld m; split accumulation. Refused: every other architecture, 2-D x 2-D, e5m2 x e5m2,
   scales laid out otherwise (naming both layouts), k % 16, m % 8, n % 8 with a 1-D B (with a
   2-D B it runs). */
static void test_fp8_block(void **state) {
  (void)state;
  const int64_t M = 64, N = 48, K = 256;
  problem p;
  problem_make(&p, B1, B2, 1, 0, M, N, K, HQ_F32, 2.0f, 1.0f, 90);
  expect_archs(&p, ARCH(90), "Hopper (sm_90 .. sm_99)", 1);
  set_arch(&p, 90);
  p.a.st.desc.scale_layout = HQ_SCALE_LAYOUT_SWIZZLED;
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand A (fp8_block) has swizzled scales; cuBLASLt's "
         "vec128_f32 mode reads them block-major");
  p.a.st.desc.scale_layout = HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  p.b.st.desc.scale_layout = HQ_SCALE_LAYOUT_BLOCK_MAJOR;
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand B (fp8_block) has block-major scales; cuBLASLt's "
         "blk128x128_f32 mode reads them outer-major");
  problem_free(&p);

  const char *names[3] = {"cublaslt e4m3 x e5m2 (vec128_f32 x vec128_f32)",
                          "cublaslt e4m3 x e4m3 (blk128x128_f32 x vec128_f32)",
                          "cublaslt e4m3 x e4m3 (vec128_f32 x blk128x128_f32)"};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int pair = 0; pair < 3; pair++) {
        const int a2 = pair == 1, b2 = pair == 2;
        problem_make(&p, a2 ? B2 : B1, b2 ? B2 : pair == 0 ? B1E5 : B1, ta, tb, M, N, K, HQ_F32,
                     2.0f, 1.0f, 90);
        ACCEPTED(&p);
        for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
          if (run(&p, fl) != HQ_OK) fail_msg("run: %s", hq_test_module_error());
          expect_lt_problem(&p, fl, names[pair]);
          expect_lt_operand(&hq_mock()->mm.a, &p.a.st, HQ_E4M3, 1, K, M, K,
                            a2 ? HQ_SCALE_BLK128X128_F32 : HQ_SCALE_VEC128_F32);
          expect_lt_operand(&hq_mock()->mm.b, &p.b.st, pair == 0 ? HQ_E5M2 : HQ_E4M3, 0, K, N, K,
                            b2 ? HQ_SCALE_BLK128X128_F32 : HQ_SCALE_VEC128_F32);
          expect_no_factors();
          expect_runner_refusal_passed(&p, fl);
        }
        problem_free(&p);
      }

  problem_make(&p, B2, B2, 1, 0, M, N, K, HQ_F32, 2.0f, 1.0f, 90);
  EXPECT(accepts(&p), HQ_ENOTSUP, "no 2-D x 2-D (128x128 x 128x128) block-scaled GEMM");
  problem_free(&p);
  problem_make(&p, B1E5, B1E5, 0, 1, M, N, K, HQ_F32, 2.0f, 1.0f, 90);
  EXPECT(accepts(&p), HQ_ENOTSUP, "no e5m2 x e5m2 FP8 GEMM");
  problem_free(&p);
  /* the problem's sizes: accepted kinds, refused problems */
  const int64_t dims[3][3] = {{M, N, 200}, {36, N, K}, {M, 36, K}};
  const char *needles[3] = {"k = 200 is not a multiple of 16", "m = 36 is not a multiple of 8",
                            "n = 36 is not a multiple of 8"};
  for (int i = 0; i < 3; i++) {
    problem_make(&p, B1, B1, 1, 1, dims[i][0], dims[i][1], dims[i][2], HQ_F32, 2.0f, 1.0f, 90);
    ACCEPTED(&p);
    for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY)
      EXPECT_RUN_REFUSED(&p, fl, HQ_ENOTSUP, needles[i]);
    if (i == 2) assert_non_null(strstr(hq_test_module_error(), "B has 1-D (1x128) blocks"));
    problem_free(&p);
  }
  problem_make(&p, B1, B2, 1, 1, M, 36, K, HQ_F32, 2.0f, 1.0f, 90);
  if (run(&p, HQ_GEMM_QUERY) != HQ_OK) fail_msg("n = 36, 2-D B: %s", hq_test_module_error());
  assert_int_equal(hq_mock()->lt_calls, 1);
  problem_free(&p);
}

// --- MXFP8 -----------------------------------------------------------------------------------

static const fmt MX_E4 = {"mxfp8", "dtype = e4m3\nswizzle = true", RAW};
static const fmt MX_E5 = {"mxfp8", "dtype = e5m2\nswizzle = true", RAW};
static const fmt MX_COMPACT = {"mxfp8", "dtype = e4m3\nswizzle = false", RAW};

/* MXFP8 runs natively on sm_100 / sm_103 only. There, for every flag pair and element pair
   but e5m2 x e5m2, swizzled storages reach cuBLASLt as the column-major operands of the
   caller's flags (both directions keep [M, K] order: the contiguous dimension is the rows, ld =
   rows, the caller's transpose), VEC32_UE8M0 scales from the storages' buffers, no alpha
   factor, D with ld = m. Refused: compact scales on either operand (naming it and the layouts),
   misaligned scales, a scale buffer smaller than cuBLASLt reads (HQ_EINVAL). */
static void test_mxfp8(void **state) {
  (void)state;
  const int64_t m = 64, n = 96, k = 128;
  problem p;
  problem_make(&p, MX_E4, MX_E4, 1, 0, m, n, k, HQ_F32, 1.5f, 0.0f, 100);
  expect_archs(&p, ARCH(100) | ARCH(103), "sm_100 or sm_103", 1);
  set_arch(&p, 100);
  hq_buffer *scale = hq_storage_buf(&p.b.st, 1);
  scale->ptr = (char *)scale->ptr + 4;
  EXPECT_RUN_REFUSED(&p, HQ_GEMM_QUERY, HQ_ENOTSUP, "operand B's scale buffer is not 16-byte "
                     "aligned");
  scale->ptr = (char *)scale->ptr - 4;
  /* cuBLASLt reads 128 x 4 scales per tile: the swizzled buffer of [96, 128] holds 128 rows */
  assert_int_equal(scale->bytes, 128 * 4);
  scale->bytes -= 1;
  EXPECT_RUN_REFUSED(&p, HQ_GEMM_QUERY, HQ_EINVAL, "operand B's scale buffer", "holds 511 bytes; "
                     "cuBLASLt reads 512 for its vec32_ue8m0 scales");
  problem_free(&p);

  for (int arch = 100; arch <= 103; arch += 3)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int kinds = 0; kinds < 4; kinds++) {
          const int ka = kinds & 1, kb = kinds >> 1;
          problem_make(&p, ka ? MX_E5 : MX_E4, kb ? MX_E5 : MX_E4, ta, tb, m, n, k, HQ_F32, 1.5f,
                       0.0f, arch);
          if (ka && kb) {
            EXPECT(accepts(&p), HQ_ENOTSUP, "no e5m2 x e5m2 FP8 GEMM");
            problem_free(&p);
            continue;
          }
          ACCEPTED(&p);
          char what[96];
          snprintf(what, sizeof what, "cublaslt %s x %s (vec32_ue8m0 x vec32_ue8m0)",
                   ka ? "e5m2" : "e4m3", kb ? "e5m2" : "e4m3");
          for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
            if (run(&p, fl) != HQ_OK) fail_msg("run: %s", hq_test_module_error());
            expect_lt_problem(&p, fl, what);
            /* A [A0, A1] = ta ? [m, k] : [k, m]: a column-major A1 x A0 matrix, ld A1 */
            expect_lt_operand(&hq_mock()->mm.a, &p.a.st, ka ? HQ_E5M2 : HQ_E4M3, ta, ta ? k : m,
                              ta ? m : k, ta ? k : m, HQ_SCALE_VEC32_UE8M0);
            /* B [B0, B1] = tb ? [k, n] : [n, k] */
            expect_lt_operand(&hq_mock()->mm.b, &p.b.st, kb ? HQ_E5M2 : HQ_E4M3, tb, tb ? n : k,
                              tb ? k : n, tb ? n : k, HQ_SCALE_VEC32_UE8M0);
            expect_no_factors();
            expect_runner_refusal_passed(&p, fl);
          }
          problem_free(&p);
        }

  /* compact scales, either operand: rowwise ones are outer-major, columnwise block-major */
  for (int which = 0; which < 2; which++)
    for (int ta = 0; ta < 2; ta++) {
      problem_make(&p, which ? MX_E4 : MX_COMPACT, which ? MX_COMPACT : MX_E4, ta, 0, m, n, k,
                   HQ_F32, 1.5f, 0.0f, 100);
      char want[160];
      snprintf(want, sizeof want, "operand %s (mxfp8) has %s scales; cuBLASLt's vec32_ue8m0 mode "
               "reads them swizzled (a format option such as swizzle = true makes them so)",
               which ? "B" : "A", which || ta ? "outer-major" : "block-major");
      EXPECT(accepts(&p), HQ_ENOTSUP, want);
      problem_free(&p);
    }
}

// --- NVFP4 -----------------------------------------------------------------------------------

static const fmt NV = {"nvfp4", "swizzle = true", FACTOR};
static const fmt NV_COMPACT = {"nvfp4", "swizzle = false", FACTOR};
static const fmt NV_RHT = {"nvfp4", "rht = true\nswizzle = true", FACTOR};
static const fmt NV_2D = {"nvfp4", "block_2d = true\nswizzle = true", FACTOR};

/* NVFP4 runs natively from sm_100 on. For every flag pair (NT with the same RHT on both
   columnwise operands, TN with 2-D weights) swizzled storages reach cuBLASLt "TN" whatever the
   flags: both k-contiguous column-major matrices with ld = k in elements (A: k x m transposed;
   B: k x n), FP4 elements, VEC16_UE4M3 scales from the storages' buffers, D with ld = m. The
   per-tensor factors go into alpha_factor: in a run the factor service's values (A's first) in
   one scratch allocation freed after the matmul; in a query, which runs nothing, the scale
   buffers stand in and no factor is computed. Refused: sm_90 and older, compact scales,
   k % 32; a failing factor service is the answer, with the scratch freed. */
static void test_nvfp4(void **state) {
  (void)state;
  const int64_t m = 64, n = 48, k = 96;
  problem p;
  problem_make(&p, NV, NV, 1, 0, m, n, k, HQ_BF16, 2.0f, 1.0f, 100);
  expect_archs(&p, ARCH(100) | ARCH(103) | ARCH(120), "sm_100 or newer", 1);
  set_arch(&p, 100);
  g_factor_rc = HQ_EDEVICE;
  EXPECT_RUN_REFUSED(&p, 0, HQ_EDEVICE, "mock factor service: failed on purpose");
  assert_int_equal(g_allocs, 1);
  assert_int_equal(g_factor_calls, 1);
  g_factor_rc = HQ_OK;
  problem_free(&p);

  for (int arch = 100; arch <= 120; arch += arch == 100 ? 3 : 17)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const int both_rht = !ta && tb;
        problem_make(&p, both_rht ? NV_RHT : ta ? NV_2D : NV, both_rht ? NV_RHT : NV, ta, tb, m,
                     n, k, HQ_BF16, 2.0f, 1.0f, arch);
        assert_int_equal(p.kind.a.desc->transform,
                         both_rht ? HQ_TRANSFORM_RHT16 : HQ_TRANSFORM_NONE);
        if (accepts(&p) != HQ_OK)
          fail_msg("sm_%d %c%c: %s", arch, ta ? 'T' : 'N', tb ? 'T' : 'N', hq_test_module_error());
        for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
          if (run(&p, fl) != HQ_OK) fail_msg("run: %s", hq_test_module_error());
          expect_lt_problem(&p, fl, "cublaslt e2m1 x e2m1 (vec16_ue4m3 x vec16_ue4m3)");
          expect_lt_operand(&hq_mock()->mm.a, &p.a.st, HQ_E2M1X2, 1, k, m, k,
                            HQ_SCALE_VEC16_UE4M3);
          expect_lt_operand(&hq_mock()->mm.b, &p.b.st, HQ_E2M1X2, 0, k, n, k,
                            HQ_SCALE_VEC16_UE4M3);
          const hq_lt_matmul *mm = &hq_mock()->mm;
          if (fl & HQ_GEMM_QUERY) {
            assert_ptr_equal(mm->alpha_factor[0], hq_storage_cbuf(&p.a.st, 1)->ptr);
            assert_ptr_equal(mm->alpha_factor[1], hq_storage_cbuf(&p.b.st, 1)->ptr);
            assert_int_equal(g_factor_calls, 0);
            assert_int_equal(g_allocs, 0);
          } else {
            assert_int_equal(g_allocs, 1);
            assert_ptr_equal(mm->alpha_factor[0], g_last_alloc);
            assert_ptr_equal(mm->alpha_factor[1], (float *)g_last_alloc + 1);
            assert_int_equal(g_factor_calls, 2);
            assert_true(g_seen_factor[0] == g_factor_value[0]);
            assert_true(g_seen_factor[1] == g_factor_value[1]);
          }
          expect_runner_refusal_passed(&p, fl);
        }
        problem_free(&p);
      }

  for (int which = 0; which < 2; which++) {
    problem_make(&p, which ? NV : NV_COMPACT, which ? NV_COMPACT : NV, 1, 0, m, n, k, HQ_BF16,
                 2.0f, 1.0f, 100);
    EXPECT(accepts(&p), HQ_ENOTSUP, which ? "operand B (nvfp4)" : "operand A (nvfp4)",
           "cuBLASLt's vec16_ue4m3 mode reads them swizzled");
    problem_free(&p);
  }
  problem_make(&p, NV, NV, 1, 0, m, n, 48, HQ_BF16, 2.0f, 1.0f, 100);
  ACCEPTED(&p);
  for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
    EXPECT_RUN_REFUSED(&p, fl, HQ_ENOTSUP, "k = 48 is not a multiple of 32", "FP4");
    assert_int_equal(g_factor_calls, 0);
  }
  problem_free(&p);
}

// --- high precision, mixed pairs, what every kind is refused for ------------------------------

static const fmt ID_BF16 = {"identity", "dtype = bf16", RAW};
static const fmt ID_F32 = {"identity", "dtype = f32", RAW};

/* Two storages holding their values as they are (identity's: no scale, one high-precision
   dtype, [M, K] order in both directions) are a plain cuBLASLt GEMM on every architecture and
   every size: the caller's flags, each operand a column-major [X1 x X0] matrix with ld X1, no
   scale, no factor. A pair of different element kinds is refused, whatever the architecture:
   bf16 x f32, identity x fp8_tensor, mxfp8 x nvfp4. */
static void test_plain_and_mixed(void **state) {
  (void)state;
  const int64_t m = 5, n = 7, k = 9; /* high precision takes every size */
  const fmt *hp[2] = {&ID_BF16, &ID_F32};
  const char *what[2] = {"cublaslt bf16 x bf16 (none x none)", "cublaslt f32 x f32 (none x none)"};
  problem p;
  for (int t = 0; t < 2; t++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        problem_make(&p, *hp[t], *hp[t], ta, tb, m, n, k, HQ_F32, 0.5f, 2.0f, 80);
        expect_archs(&p, ~0u, "", 0);
        set_arch(&p, 80);
        for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY) {
          if (run(&p, fl) != HQ_OK) fail_msg("run: %s", hq_test_module_error());
          expect_lt_problem(&p, fl, what[t]);
          const hq_dtype e = t ? HQ_F32 : HQ_BF16;
          expect_lt_operand(&hq_mock()->mm.a, &p.a.st, e, ta, ta ? k : m, ta ? m : k, ta ? k : m,
                            HQ_SCALE_NONE);
          expect_lt_operand(&hq_mock()->mm.b, &p.b.st, e, tb, tb ? n : k, tb ? k : n, tb ? n : k,
                            HQ_SCALE_NONE);
          expect_no_factors();
          expect_runner_refusal_passed(&p, fl);
        }
        problem_free(&p);
      }
  const struct {
    fmt a, b;
    int64_t m, n, k;
    const char *want;
  } mixed[] = {
      {ID_BF16, ID_F32, m, n, k,
       "cublaslt: identity (bf16 elements) x identity (f32 elements) is no native cuBLASLt pair "
       "(FP8 x FP8 or FP4 x FP4)"},
      {ID_BF16, T_E4, 32, 48, 64,
       "cublaslt: identity (bf16 elements) x fp8_tensor (e4m3 elements) is no native cuBLASLt "
       "pair"},
      {MX_E4, NV, 64, 48, 128,
       "cublaslt: mxfp8 (e4m3 elements) x nvfp4 (e2m1 elements) is no native cuBLASLt pair"},
  };
  for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; i++) {
    problem_make(&p, mixed[i].a, mixed[i].b, 1, 0, mixed[i].m, mixed[i].n, mixed[i].k, HQ_F32,
                 1.0f, 0.0f, 100);
    expect_archs(&p, 0, mixed[i].want, 0);
    problem_free(&p);
  }
}

/* Whatever the operands: the host, a high-precision operand and a caller forcing the emulated
   path are refused by the predicate with their reason (the fused flags are not its business),
   and so are descriptors no stock format writes (on copies): a k-strided operand of a "TN"-only
   mode, a transform outside the FP4 mode, blocks along k other than the mode's.
   An empty GEMM of an accepted kind is declined by run(), before the runner. */
static void test_refusals(void **state) {
  (void)state;
  problem p;
  problem_make(&p, T_E4, T_E4, 1, 0, 32, 48, 64, HQ_F32, 1.0f, 0.0f, 90);
  ACCEPTED(&p);
  p.kind.device = HQ_DEVICE_HOST;
  p.kind.arch = g_api.device_arch(HQ_DEVICE_HOST);
  EXPECT(accepts(&p), HQ_ENOTSUP, "cublaslt: no native GEMM on the host");
  p.kind.device = 0;
  set_arch(&p, 90);
  const hq_gemm_operand_kind b = p.kind.b;
  p.kind.b.desc = NULL;
  p.kind.b.dir = 0;
  p.kind.b.flags = 0;
  p.kind.b.dtype = HQ_BF16;
  p.kind.b.format = "bf16";
  EXPECT(accepts(&p), HQ_ENOTSUP, "a high-precision operand");
  p.kind.b = b;
  p.kind.flags = HQ_GEMM_FORCE_EMULATED;
  EXPECT(accepts(&p), HQ_ENOTSUP, "the caller forced the emulated path");
  p.kind.flags = HQ_GEMM_NO_FUSED | HQ_GEMM_FUSED_ALWAYS; /* not the native path's business */
  ACCEPTED(&p);
  p.kind.flags = 0;
  /* descriptors no stock format writes, on copies: a TN-only mode with a k-strided operand */
  p.a.st.desc.order = HQ_ORDER_KM; /* A's rowwise storage claiming its transposed order */
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand A (fp8_tensor) does not keep k contiguous; "
         "cuBLASLt's tensor_f32 GEMMs take \"TN\" operands only");
  problem_free(&p);
  /* a transform outside the FP4 mode; blocks along k other than the mode's */
  problem_make(&p, MX_E4, MX_E4, 1, 0, 64, 96, 128, HQ_F32, 1.0f, 0.0f, 100);
  p.b.st.desc.transform = HQ_TRANSFORM_RHT16;
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand B (mxfp8) carries a transform, which only the FP4 "
         "mode multiplies natively");
  p.b.st.desc.transform = HQ_TRANSFORM_NONE;
  p.a.st.desc.block_k = 16;
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand A (mxfp8) has blocks of 16 along k; the vec32_ue8m0 "
         "mode scales every 32");
  problem_free(&p);
  problem_make(&p, NV, NV, 0, 0, 64, 48, 96, HQ_F32, 1.0f, 0.0f, 100);
  p.a.st.desc.block_m = 32; /* a columnwise A: its blocks along k are block_m */
  EXPECT(accepts(&p), HQ_ENOTSUP, "operand A (nvfp4) has blocks of 32 along k; the vec16_ue4m3 "
         "mode scales every 16");
  problem_free(&p);

  /* an empty GEMM: no qtensor is empty (hq_quantize refuses [0, k]), so the problem's sizes are
     zeroed one at a time; run() declines before it looks at a buffer */
  problem_make(&p, T_E4, T_E4, 1, 0, 32, 48, 64, HQ_F32, 1.0f, 0.0f, 90);
  const char *empty[3] = {"an empty GEMM (m = 0, n = 48, k = 64)",
                          "an empty GEMM (m = 32, n = 0, k = 64)",
                          "an empty GEMM (m = 32, n = 48, k = 0)"};
  for (int i = 0; i < 3; i++) {
    int64_t *dim = i == 0 ? &p.run.m : i == 1 ? &p.run.n : &p.run.k;
    const int64_t keep = *dim;
    *dim = 0;
    for (uint32_t fl = 0; fl <= HQ_GEMM_QUERY; fl += HQ_GEMM_QUERY)
      EXPECT_RUN_REFUSED(&p, fl, HQ_ENOTSUP, empty[i]);
    *dim = keep;
  }
  problem_free(&p);
}

/* The element names the provider's messages use: one element, not the packed byte (an MXFP6
   operand was "? elements" in hq bench --gemm before the FP6 dtypes had names). */
static void test_elem_names(void **state) {
  (void)state;
  static const struct {
    hq_dtype t;
    const char *name;
  } k[] = {{HQ_E4M3, "e4m3"}, {HQ_E5M2, "e5m2"}, {HQ_E2M1X2, "e2m1"}, {HQ_E3M2X4, "e3m2"},
           {HQ_E2M3X4, "e2m3"}, {HQ_I4X2, "int4"},  {HQ_I8, "int8"},     {HQ_BF16, "bf16"},
           {HQ_F16, "f16"},     {HQ_F32, "f32"}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    assert_string_equal(hq_lt_elem_name(k[i].t), k[i].name);
  assert_string_equal(hq_lt_elem_name(-1), "?");
}

/* HQ_GEMM_AUTOTUNE as the runner reads it: unset, empty and "0" off, "1" on, and anything else
   refused (-1) rather than read as one of them. */
static void test_autotune_setting(void **state) {
  (void)state;
  assert_int_equal(hq_lt_autotune_parse(NULL), 0);
  assert_int_equal(hq_lt_autotune_parse(""), 0);
  assert_int_equal(hq_lt_autotune_parse("0"), 0);
  assert_int_equal(hq_lt_autotune_parse("1"), 1);
  static const char *bad[] = {"2", "-1", "01", "10", "1 ", " 1", "00", "on", "true", "yes", "x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (hq_lt_autotune_parse(bad[i]) != -1)
      fail_msg("HQ_GEMM_AUTOTUNE='%s' read as %d, not refused", bad[i],
               hq_lt_autotune_parse(bad[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_autotune_setting),
      cmocka_unit_test(test_elem_names), cmocka_unit_test(test_module),      cmocka_unit_test(test_fp8_tensor),
      cmocka_unit_test(test_fp8_block),   cmocka_unit_test(test_mxfp8),
      cmocka_unit_test(test_nvfp4),       cmocka_unit_test(test_plain_and_mixed),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
