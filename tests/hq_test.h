/*
** hq_test.h -- what every CMocka test of hq includes: cmocka's prerequisites, fallbacks for
** macros that differ between cmocka 1.1.5 and 2.x, and small helpers (contexts, recipes from
** text, random tensors, an exit-77 guard for GPU tests).
*/
#ifndef HQ_TEST_H
#define HQ_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <dlfcn.h>

#include "hq/hq.h"
#include "hq/numerics.h"
#include "hq/train.h" /* the trainer services: tests link libhqtrain too */

#ifndef assert_float_equal
#define assert_float_equal(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))
#endif

/* Exit status automake reads as "skipped". */
#define HQ_TEST_SKIP 77

/* Assert a call succeeds, printing hq_last_error() when it does not. */
#define HQ_OK_OR_FAIL(expr)                                                                   \
  do {                                                                                        \
    int rc_ = (expr);                                                                         \
    if (rc_ != HQ_OK) fail_msg("%s -> %d: %s", #expr, rc_, hq_last_error());                  \
  } while (0)

/* Assert that hq_last_error() contains `needle`. */
#define HQ_ERROR_HAS(needle)                                                                  \
  do {                                                                                        \
    if (!strstr(hq_last_error(), (needle)))                                                   \
      fail_msg("error '%s' lacks '%s'", hq_last_error(), (needle));                           \
  } while (0)

/* xorshift64*: deterministic test data. */
static inline uint64_t hq_test_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Uniform in [-1, 1). */
static inline float hq_test_uniform(uint64_t *s) {
  return (float)((double)(hq_test_rand(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Approximately N(0,1) (sum of 12 uniforms). */
static inline float hq_test_normal(uint64_t *s) {
  double acc = 0;
  for (int i = 0; i < 12; i++) acc += (double)(hq_test_rand(s) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(acc - 6.0);
}

/* A zero-filled host tensor (free x.data). */
/* The random stream (hq_call.offset) of the n-th quantize / update (from 0) of role `role` on a
   context whose step (hq_ctx_set_rng_offset) is `step`, as docs/embedding.md defines it:
   M(K ^ M(step ^ M(n))), K the FNV-1a-64 hash of the role's text (1 if it is 0), M SplitMix64's
   output function. Written here from the definitions, not from the core's code. */
static inline uint64_t hq_test_splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint64_t hq_test_rng_offset(const char *role, uint64_t step, uint64_t n) {
  uint64_t k = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const unsigned char *)role; *c; c++)
    k = (k ^ *c) * 0x100000001b3ull;
  if (!k) k = 1;
  return hq_test_splitmix(k ^ hq_test_splitmix(step ^ hq_test_splitmix(n)));
}

/* A context on `device` (HQ_DEVICE_HOST or a CUDA ordinal) whose log callback is `log` with
   `user`: a test counts the lines it looks for. */
static inline hq_ctx *hq_test_log_ctx(int device, void (*log)(void *, int, const char *),
                                      void *user) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = device;
  d.log = log;
  d.log_user = user;
  hq_ctx *ctx = NULL;
  if (hq_ctx_create(&d, &ctx)) fail_msg("%s", hq_last_error());
  return ctx;
}

static inline hq_tensor hq_test_empty(hq_dtype t, int64_t rows, int64_t cols) {
  return hq_tensor_2d(calloc((size_t)(rows * cols), hq_dtype_size(t)), t, HQ_DEVICE_HOST, rows,
                      cols);
}

/* A host tensor of dtype t filled with N(0,1) * scale values (stored in t). */
static inline hq_tensor hq_test_tensor(hq_dtype t, int64_t rows, int64_t cols, uint64_t seed,
                                       float scale) {
  hq_tensor x = hq_test_empty(t, rows, cols);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < rows * cols; i++) hq_store_hp(x.data, i, t, hq_test_normal(&s) * scale);
  return x;
}

/* Parse a recipe from text with the test plugin path ($HQ_PLUGIN_PATH, no installed dir) and
   the n folders `dirs` before it; fails the test when it has errors. */
static inline hq_recipe *hq_test_recipe_dirs(const char *text, const char *const *dirs, size_t n) {
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
  o.extra_dirs = dirs;
  o.n_extra_dirs = n;
  hq_recipe *r = NULL;
  if (hq_recipe_parse_string(text, "test.ini", &o, &r) != HQ_OK) fail_msg("%s", hq_last_error());
  if (hq_recipe_error_count(r)) fail_msg("%s", hq_recipe_error(r, 0));
  return r;
}
static inline hq_recipe *hq_test_recipe(const char *text) {
  return hq_test_recipe_dirs(text, NULL, 0);
}

/* A quantizer for role M:T:N of recipe r. */
static inline hq_quantizer *hq_test_quantizer(hq_recipe *r, const char *role_text) {
  char buf[256];
  hq_role role;
  hq_quantizer *q = NULL;
  if (hq_role_parse(role_text, buf, sizeof buf, &role)) fail_msg("%s", hq_last_error());
  if (hq_quantizer_create(r, &role, &q)) fail_msg("%s", hq_last_error());
  return q;
}

/* hq_quantize_ex / hq_qtensor_update_ex of x with a caller's amax pair (device memory for a
   device context; NULL: the quantizer computes it). */
static inline hq_qtensor *hq_test_quantize_ex(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *x,
                                              const float *amax) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.amax = amax;
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, x, &args, &qt));
  return qt;
}
static inline void hq_test_update_ex(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *x,
                                     const float *amax) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.amax = amax;
  HQ_OK_OR_FAIL(hq_qtensor_update_ex(qt, ctx, x, &args));
}

/* Every buffer of every direction of a and b equal, byte for byte (same names and sizes), but
   the buffers of role `skip_role` (HQ_ROLE_*; UINT32_MAX: none), whose names and sizes are still
   compared; a failure names `what`, the direction, the buffer and the first differing byte. */
static inline void hq_test_same_qtensors_but(const hq_qtensor *a, const hq_qtensor *b,
                                             const char *what, uint32_t skip_role) {
  assert_int_equal(hq_qtensor_dirs(a), hq_qtensor_dirs(b));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
    if (!sa) continue;
    assert_non_null(sb);
    assert_int_equal(sa->nbuf, sb->nbuf);
    for (uint32_t i = 0; i < sa->nbuf; i++) {
      const hq_buffer *x = hq_storage_cbuf(sa, i), *y = hq_storage_cbuf(sb, i);
      assert_string_equal(x->name, y->name);
      assert_int_equal(x->bytes, y->bytes);
      if (x->role != skip_role && memcmp(x->ptr, y->ptr, x->bytes)) {
        size_t k = 0;
        while (((const uint8_t *)x->ptr)[k] == ((const uint8_t *)y->ptr)[k]) k++;
        fail_msg("%s: %s buffer '%s' differs at byte %zu of %zu", what,
                 dir == HQ_ROWWISE ? "rowwise" : "columnwise", x->name, k, x->bytes);
      }
    }
  }
}
static inline void hq_test_same_qtensors(const hq_qtensor *a, const hq_qtensor *b,
                                         const char *what) {
  hq_test_same_qtensors_but(a, b, what, UINT32_MAX);
}

/* Fill every buffer of qt's storages (host memory) with 0xA5: a later step that must write every
   byte (an FSDP assign) is then checked to have done so. */
static inline void hq_test_fill_garbage(const hq_qtensor *qt) {
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; st && i < st->nbuf; i++)
      memset(hq_storage_cbuf(st, i)->ptr, 0xA5, hq_storage_cbuf(st, i)->bytes);
  }
}

/* What an FSDP all-gather does with the n entries hq_fsdp_extract gave each of `world` shards
   (ext[rank]): each entry concatenated along dim 0 in rank order, into gathered[e] (memory
   mem[e], which the caller frees). The shards' entries must agree in name and shape. */
static inline void hq_test_all_gather(hq_fsdp_buffer (*ext)[2 * HQ_MAX_BUFFERS], int world,
                                      size_t n, hq_fsdp_buffer *gathered, void **mem) {
  for (size_t e = 0; e < n; e++) {
    gathered[e] = ext[0][e];
    const size_t per = (size_t)(ext[0][e].rows * ext[0][e].row_bytes);
    mem[e] = malloc(per * (size_t)world + 1);
    for (int s = 0; s < world; s++) {
      assert_string_equal(ext[s][e].name, ext[0][e].name);
      assert_int_equal(ext[s][e].row_bytes, ext[0][e].row_bytes);
      assert_int_equal(ext[s][e].rows, ext[0][e].rows);
      memcpy((char *)mem[e] + per * (size_t)s, ext[s][e].ptr, per);
    }
    gathered[e].rows = ext[0][e].rows * world;
    gathered[e].ptr = mem[e];
  }
}

/* The rejection reason a plugin set recorded for the module file named `base` ("bad_major.so"),
   or NULL. */
static inline const char *hq_test_reason(const hq_plugins *set, const char *base) {
  for (size_t i = 0; i < hq_plugins_rejected_count(set); i++) {
    const char *f = hq_plugins_rejected_file(set, i);
    const char *b = strrchr(f, '/');
    if (strcmp(b ? b + 1 : f, base) == 0) return hq_plugins_rejected_reason(set, i);
  }
  return NULL;
}
/* Fails the test unless module `base` was rejected with `needle` in its reason. */
static inline void hq_test_expect_reason(const hq_plugins *set, const char *base,
                                           const char *needle) {
  const char *r = hq_test_reason(set, base);
  if (!r) fail_msg("%s was not rejected", base);
  if (!strstr(r, needle)) fail_msg("%s: reason '%s' lacks '%s'", base, r, needle);
}

/* Write text (NULL: nothing, an empty file) to path, replacing what was there; a file that
   cannot be written fails the test. */
static inline void hq_test_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) fail_msg("%s: cannot be written", path);
  if (text && fputs(text, f) == EOF) fail_msg("%s: write failed", path);
  if (fclose(f) != 0) fail_msg("%s: close failed", path);
}

/* Path of a file under the test source directory ($HQ_TEST_SRCDIR, set by make check). */
static inline const char *hq_test_path(const char *rel) {
  static char buf[4096];
  const char *dir = getenv("HQ_TEST_SRCDIR");
  snprintf(buf, sizeof buf, "%s/%s", dir ? dir : "tests", rel);
  return buf;
}

// --- calling a module's ops directly (what the core never lets through) -------------------

/* The message the last host->error() of a direct call recorded. */
static inline char *hq_test_module_error(void) {
  static char buf[1024];
  return buf;
}
static inline int hq_test_host_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(hq_test_module_error(), 1024, fmt, ap);
  va_end(ap);
  return code;
}
static inline void hq_test_host_log(const hq_call *call, int level, const char *fmt, ...) {
  (void)call;
  (void)level;
  (void)fmt;
}
static inline void *hq_test_host_alloc(const hq_call *call, size_t bytes) {
  if (call && (call->flags & HQ_CALL_UPDATE)) {
    hq_test_host_error(HQ_ENOMEM, "host->alloc during an update");
    return NULL;
  }
  return malloc(bytes ? bytes : 1);
}
static inline void hq_test_host_free(const hq_call *call, void *p) {
  (void)call;
  free(p);
}
static inline int hq_test_host_arch(int device) {
  (void)device;
  return 0;
}
/* Direct calls have no cuBLASLt behind them: every matmul is "not supported here". */
static inline int hq_test_host_lt_matmul(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  (void)mm;
  return hq_test_host_error(HQ_ENOTSUP, "test host: no cuBLASLt");
}
/* A mock device for the tests of the gemm ops: put hq_mock_arch / hq_mock_lt in a host table's
   device_arch / lt_matmul. hq_mock_arch answers hq_mock()->arch (0, as the core does, for the
   host); hq_mock_lt counts its calls in lt_calls, keeps a copy of the matmul in mm (mm.what, when
   set, points to a copy in what; what is "" when mm.what is NULL) and answers lt_rc (HQ_OK
   unless a test sets it). */
typedef struct hq_mock_device {
  int arch, lt_calls, lt_rc;
  hq_lt_matmul mm;
  char what[128];
} hq_mock_device;
static inline hq_mock_device *hq_mock(void) {
  static hq_mock_device m;
  return &m;
}
static inline int hq_mock_arch(int device) { return device < 0 ? 0 : hq_mock()->arch; }
static inline int hq_mock_lt(const hq_call *call, const hq_lt_matmul *mm) {
  (void)call;
  hq_mock_device *m = hq_mock();
  m->lt_calls++;
  m->mm = *mm;
  snprintf(m->what, sizeof m->what, "%s", mm->what ? mm->what : "");
  if (mm->what) m->mm.what = m->what;
  return m->lt_rc;
}
/* A fused optimizer step for a module's update (hq_call.adam): an F32 gradient g and moments m,
   v, constants zero but lr 1 (any step a module refuses must leave them unread). */
static inline hq_adam_pass hq_test_adam_pass(const float *g, float *m, float *v) {
  hq_adam_pass pass;
  memset(&pass, 0, sizeof pass);
  pass.struct_size = sizeof pass;
  pass.grad_dtype = HQ_F32;
  pass.grad = g;
  pass.m = m;
  pass.v = v;
  pass.k.lr = 1.0f;
  return pass;
}
/* A gemm op's problem: storages a and b (flags ta / tb, B's instance cfg_b), m x n x k, D = d
   (may be NULL in a query), alpha, beta, flags (HQ_GEMM_QUERY or 0); no bias. */
static inline hq_gemm_problem hq_test_gemm_problem(const hq_storage *a, const hq_storage *b,
                                                   const void *cfg_b, int ta, int tb, int64_t m,
                                                   int64_t n, int64_t k, hq_tensor *d, float alpha,
                                                   float beta, uint32_t flags) {
  hq_gemm_problem p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.flags = flags;
  p.a = a;
  p.b = b;
  p.cfg_b = cfg_b;
  p.transa = ta;
  p.transb = tb;
  p.m = m;
  p.n = n;
  p.k = k;
  p.d = d;
  p.alpha = alpha;
  p.beta = beta;
  return p;
}
/* Direct calls convert on the host only, element by element through hq/numerics.h. */
static inline int hq_test_host_convert(const hq_call *call, void *dst, hq_dtype dt,
                                       const void *src, hq_dtype st, int64_t n) {
  if (call->device != HQ_DEVICE_HOST)
    return hq_test_host_error(HQ_ENOTSUP, "test host: no device conversion");
  for (int64_t i = 0; i < n; i++) hq_store_hp(dst, i, dt, hq_load_hp(src, i, st));
  return HQ_OK;
}
/* A host table for direct calls: host memory from malloc, errors into hq_test_module_error(). */
static inline hq_host_api hq_test_host(void) {
  hq_host_api h = {HQ_ABI_MAJOR,        HQ_ABI_MINOR,     sizeof h,           "test",
                   hq_test_host_error,  hq_test_host_log, hq_test_host_alloc, hq_test_host_free,
                   hq_test_host_arch,   hq_test_host_lt_matmul, hq_test_host_convert};
  return h;
}
/* A host call for direct module calls: host device, the given host table, seed and offset. */
static inline hq_call hq_test_call(const hq_host_api *host, uint64_t seed, uint64_t offset) {
  hq_call c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.device = HQ_DEVICE_HOST;
  c.seed = seed;
  c.offset = offset;
  c.host = host;
  return c;
}
/* An empty storage as the core hands it to layout(): sizes and stride set, the rest zero. */
static inline void hq_test_storage_init(hq_storage *s, uint32_t dir, int64_t rows, int64_t cols,
                                        hq_dtype nominal) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->buf_size = sizeof(hq_buffer);
  s->dir = dir;
  s->rows = rows;
  s->cols = cols;
  s->device = HQ_DEVICE_HOST;
  s->nominal = nominal;
  s->desc.struct_size = sizeof s->desc;
  for (int i = 0; i < HQ_MAX_BUFFERS; i++) s->buf[i].struct_size = sizeof(hq_buffer);
}

/* The entry function of module NAME.so, found on $HQ_PLUGIN_PATH (fails the test if absent). */
static inline hq_format_entry_fn hq_test_module_entry(const char *name) {
  const char *path = getenv("HQ_PLUGIN_PATH");
  void *h = NULL;
  char file[4200];
  for (const char *p = path; p && *p && !h;) {
    size_t n = strcspn(p, ":");
    snprintf(file, sizeof file, "%.*s/%s.so", (int)n, p, name);
    if (n) h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    p += n + (p[n] == ':');
  }
  if (!h) fail_msg("%s.so not found on HQ_PLUGIN_PATH=%s", name, path ? path : "(unset)");
  hq_format_entry_fn entry = (hq_format_entry_fn)(uintptr_t)dlsym(h, HQ_FORMAT_ENTRY_NAME);
  if (!entry) fail_msg("%s has no %s", file, HQ_FORMAT_ENTRY_NAME);
  return entry;
}

#endif
