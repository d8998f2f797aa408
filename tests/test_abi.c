/*
** test_abi.c -- the ABI 2.0 and API contracts of the core, with the test_good fixture module
** (tests/plugins/fixture.c) and the built-in identity format:
**   - versioned structs: callers' structs at the floor size are read without over-reading,
**     smaller ones are refused by name, newer (larger) ones accepted;
**   - the core checks what layout() describes (data role, descriptor, names, gather rules);
**   - an update must not allocate; host->log reaches the context's logger;
**   - the context passed to a call is the one whose logger and allocator the call uses;
**   - identity is built in; the random stream position is readable and settable;
**   - a host context is never being captured into a CUDA graph (hq_ctx_capturing);
**   - hq_ctx_memset on a host context sets exactly the bytes asked, and refuses bad arguments;
**   - saved-buffer descriptors;
**   - a module's configure() status reaches the caller unchanged.
*/
#include <math.h>

#include "hq_test.h"

static const char *fixtures(void) {
  const char *d = getenv("HQ_TEST_FIXTURES");
  return d ? d : "tests/plugins/.libs";
}

/* A recipe using the fixture module (test_good) with `level` for both directions. */
static hq_recipe *fixture_recipe(int level, const char *source) {
  char text[512];
  snprintf(text, sizeof text,
           "[recipe]\nplugin_dirs = %s\n[format g]\nplugin = test_good\nlevel = %d\n"
           "[role linear:weight:*]\nrowwise = g\ncolumnwise = g\ncolumnwise_source = %s\n",
           fixtures(), level, source ? source : "original");
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV;
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "abi.ini", &o, &r));
  if (hq_recipe_error_count(r)) fail_msg("%s", hq_recipe_error(r, 0));
  return r;
}

// --- versioned structs --------------------------------------------------------------------

/* hq_ctx_desc at exactly its floor size, in a block of that size (ASan catches an over-read). */
/* The words every tool, log line and checkpoint uses for a direction. */
static void test_dir_name(void **state) {
  (void)state;
  assert_string_equal(hq_dir_name(HQ_ROWWISE), "rowwise");
  assert_string_equal(hq_dir_name(HQ_COLWISE), "columnwise");
  assert_string_equal(hq_dir_name(0), "invalid");
  assert_string_equal(hq_dir_name(HQ_ROWWISE | HQ_COLWISE), "invalid");
}

static void test_ctx_desc_floor(void **state) {
  (void)state;
  size_t floor = HQ_CTX_DESC_SIZE_0_1;
  hq_ctx_desc *d = malloc(floor);
  memset(d, 0, floor);
  d->struct_size = (uint32_t)floor;
  d->device = HQ_DEVICE_HOST;
  d->seed = 77;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(d, &ctx));
  assert_int_equal(hq_ctx_seed(ctx), 77);
  hq_ctx_destroy(ctx);
  d->struct_size = (uint32_t)floor - 1;
  assert_int_equal(hq_ctx_create(d, &ctx), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_desc.struct_size");
  free(d);
  /* a newer caller's larger struct: the fields this core knows are read */
  struct { hq_ctx_desc d; uint64_t future[4]; } big;
  memset(&big, 0xff, sizeof big);
  memset(&big.d, 0, sizeof big.d);
  big.d.struct_size = sizeof big;
  big.d.device = HQ_DEVICE_HOST;
  big.d.seed = 5;
  HQ_OK_OR_FAIL(hq_ctx_create(&big.d, &ctx));
  assert_int_equal(hq_ctx_seed(ctx), 5);
  hq_ctx_destroy(ctx);
}

static void test_recipe_opts_floor(void **state) {
  (void)state;
  /* an older caller's struct: only its bytes exist (written field by field, as that caller's
     compiler laid them out) */
  const size_t floor = HQ_RECIPE_OPTS_SIZE_0_1;
  unsigned char *o = calloc(1, floor);
  const uint32_t size = (uint32_t)floor, small = 4;
  const unsigned flags = HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV;
  memcpy(o + offsetof(hq_recipe_opts, struct_size), &size, sizeof size);
  memcpy(o + offsetof(hq_recipe_opts, plugin_flags), &flags, sizeof flags);
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[role *:*:*]\nrowwise = identity\n", "t",
                                       (const hq_recipe_opts *)o, &r));
  assert_int_equal(hq_recipe_error_count(r), 0);
  hq_recipe_free(r);
  memcpy(o + offsetof(hq_recipe_opts, struct_size), &small, sizeof small);
  assert_int_equal(hq_recipe_parse_string("", "t", (const hq_recipe_opts *)o, &r), HQ_EINVAL);
  HQ_ERROR_HAS("hq_recipe_opts.struct_size");
  free(o);
}

static void test_tensor_struct_size(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[role *:*:*]\nrowwise = identity\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 4, 8, 1, 1.0f);
  hq_qtensor *qt = NULL;
  hq_tensor bad = x;
  bad.struct_size = 0; /* a caller that forgot it */
  assert_int_equal(hq_quantize(q, ctx, &bad, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("struct_size");
  bad.struct_size = (uint32_t)HQ_TENSOR_SIZE_2_0;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &bad, &qt));
  /* hq_quantize_args below its floor */
  hq_quantize_args a = {.struct_size = 4};
  hq_qtensor *qt2 = NULL;
  assert_int_equal(hq_quantize_ex(q, ctx, &x, &a, &qt2), HQ_EINVAL);
  HQ_ERROR_HAS("hq_quantize_args");
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

// --- layout checks ------------------------------------------------------------------------

static void test_layout_checks(void **state) {
  (void)state;
  static const struct { int level; const char *needle; } bad[] = {
      {1, "data role (exactly one must)"},
      {2, "does not match the descriptor"},
      {4, "must be named 'columnwise_data'"},
      {5, "swizzled scale buffer"},
      {6, "two buffers are named 'data'"},
      {9, "does not match the descriptor"},
  };
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hq_recipe *r = fixture_recipe(bad[i].level, NULL);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qt = NULL;
    int rc = hq_quantize(q, ctx, &x, &qt);
    if (rc != HQ_EABI) fail_msg("level %d: %d (%s)", bad[i].level, rc, hq_last_error());
    assert_null(qt);
    HQ_ERROR_HAS(bad[i].needle);
    HQ_ERROR_HAS("test_good");
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  free(x.data);
  hq_ctx_destroy(ctx);
}

/* The raw-values role (ABI 2.6): a valid f32 [rows, cols] buffer is kept and filled; one of
   another dtype or shape, or two of them, are layout errors naming the buffer. */
static void test_raw_buffer_checks(void **state) {
  (void)state;
  static const struct { int n; const char *needle; } cases[] = {
      {2, "raw-values buffer 'raw' must be bf16 or f32 [8, 16]"},
      {3, "raw-values buffer 'raw' must be bf16 or f32 [8, 16]"},
      {4, "2 buffers have the raw-values role (at most one may)"},
      {1, NULL},
  };
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "[recipe]\nplugin_dirs = %s\n[format g]\nplugin = test_good\nlabel = rawbuf=%d\n"
             "[role linear:weight:*]\nrowwise = g\ncolumnwise = g\n",
             fixtures(), cases[i].n);
    hq_recipe_opts o = {0};
    o.struct_size = sizeof o;
    o.plugin_flags = HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV;
    hq_recipe *r = NULL;
    HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "abi.ini", &o, &r));
    if (hq_recipe_error_count(r)) fail_msg("%s", hq_recipe_error(r, 0));
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qt = NULL;
    const int rc = hq_quantize(q, ctx, &x, &qt);
    if (cases[i].needle) {
      if (rc != HQ_EABI) fail_msg("rawbuf=%d: %d (%s)", cases[i].n, rc, hq_last_error());
      assert_null(qt);
      HQ_ERROR_HAS(cases[i].needle);
      HQ_ERROR_HAS("test_good");
    } else {
      HQ_OK_OR_FAIL(rc);
      for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d <<= 1) {
        const hq_storage *s = hq_qtensor_storage(qt, d);
        assert_int_equal(s->nbuf, 3);
        const hq_buffer *b = hq_storage_cbuf(s, 2);
        assert_int_equal(b->role, HQ_ROLE_RAW);
        assert_int_equal(b->bytes, 8 * 16 * 4);
        assert_memory_equal(b->ptr, x.data, 8 * 16 * 4);
      }
      hq_qtensor_free(qt);
    }
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  free(x.data);
  hq_ctx_destroy(ctx);
}

/* The valid fixture: descriptor and buffers as the core completes them. */
static void test_storage_as_described(void **state) {
  (void)state;
  hq_recipe *r = fixture_recipe(3, NULL);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  const hq_storage *s = hq_qtensor_storage(qt, HQ_COLWISE);
  assert_int_equal(s->struct_size, sizeof(hq_storage));
  assert_int_equal(s->buf_size, sizeof(hq_buffer));
  assert_int_equal(s->desc.struct_size, sizeof(hq_operand_desc));
  assert_int_equal(s->desc.elem, HQ_F32);
  assert_int_equal(s->nbuf, 2);
  assert_string_equal(hq_storage_cbuf(s, 0)->name, "columnwise_data");
  assert_int_equal(hq_storage_cbuf(s, 0)->bytes, 8 * 16 * 4);
  assert_int_equal(hq_storage_cbuf(s, 1)->bytes, 2);
  assert_memory_equal(hq_storage_cbuf(s, 0)->ptr, x.data, 8 * 16 * 4);
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

// --- calls: update, logging, per-call contexts ------------------------------------------------

typedef struct sink {
  int n;
  char last[256];
} sink;
static void log_to(void *user, int level, const char *msg) {
  sink *s = user;
  (void)level;
  s->n++;
  snprintf(s->last, sizeof s->last, "%s", msg);
}

typedef struct counting {
  int allocs, frees;
} counting;
static void *count_alloc(void *user, int device, size_t bytes, void *stream) {
  (void)device;
  (void)stream;
  ((counting *)user)->allocs++;
  return malloc(bytes);
}
static void count_free(void *user, int device, void *ptr, void *stream) {
  (void)device;
  (void)stream;
  ((counting *)user)->frees++;
  free(ptr);
}

static hq_ctx *ctx_with(sink *s, counting *c, const hq_allocator *a) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  d.log = log_to;
  d.log_user = s;
  d.allocator = c ? a : NULL;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  return ctx;
}

static void test_update_must_not_allocate(void **state) {
  (void)state;
  hq_recipe *r = fixture_recipe(8, NULL);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt)); /* quantize may allocate */
  assert_int_equal(hq_qtensor_update(qt, ctx, &x), HQ_ENOMEM);
  HQ_ERROR_HAS("during an update");
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* A plugin's host->log reaches the logger of the context the call runs on: the creating one
   for hq_quantize, the one passed to hq_qtensor_update for an update. The update's temporary
   (columnwise_source = rowwise_dequantized) comes from that context's allocator too. */
static void test_per_call_context(void **state) {
  (void)state;
  hq_recipe *r = fixture_recipe(3, "rowwise_dequantized");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  sink s1 = {0}, s2 = {0};
  counting c1 = {0}, c2 = {0};
  hq_allocator a1 = {.struct_size = sizeof a1, .alloc = count_alloc, .free = count_free,
                     .user = &c1};
  hq_allocator a2 = {.struct_size = sizeof a2, .alloc = count_alloc, .free = count_free,
                     .user = &c2};
  hq_ctx *ctx1 = ctx_with(&s1, &c1, &a1), *ctx2 = ctx_with(&s2, &c2, &a2);
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx1, &x, &qt));
  assert_int_equal(s1.n, 2); /* one line per plugin call: rowwise, then columnwise */
  assert_non_null(strstr(s1.last, "test_good: quantize [8, 16]"));
  assert_int_equal(s2.n, 0);
  int owner_allocs = c1.allocs;
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx2, &x));
  assert_int_equal(s2.n, 2);
  assert_non_null(strstr(s2.last, "test_good: quantize [8, 16]"));
  assert_int_equal(c2.allocs, 1);          /* the dequantized temporary */
  assert_int_equal(c2.allocs, c2.frees);   /* ... freed by the same allocator */
  assert_int_equal(c1.allocs, owner_allocs); /* nothing new from the owner */
  hq_qtensor_free(qt);
  assert_int_equal(c1.allocs, c1.frees);
  free(x.data);
  hq_ctx_destroy(ctx1);
  hq_ctx_destroy(ctx2);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* hq_ctx_capturing: a host context never captures (HQ_OK, the flag written 0 over what the
   caller left there), and each NULL argument is refused by name, the flag cleared when given. */
static void test_ctx_capturing_host(void **state) {
  (void)state;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  int capturing = 7;
  HQ_OK_OR_FAIL(hq_ctx_capturing(ctx, &capturing));
  assert_int_equal(capturing, 0);
  capturing = 7;
  assert_int_equal(hq_ctx_capturing(NULL, &capturing), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_capturing: ctx is NULL");
  assert_int_equal(capturing, 0);
  assert_int_equal(hq_ctx_capturing(ctx, NULL), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_capturing: capturing is NULL");
  assert_int_equal(hq_ctx_capturing(NULL, NULL), HQ_EINVAL);
  hq_ctx_destroy(ctx);
}

/* hq_ctx_memset on a host context: exactly [off, off + n) takes the value, nothing around it;
   zero bytes with a NULL dst is nothing to do; a NULL context or dst and a value that is not a
   byte are refused by name, the buffer untouched. */
static void test_ctx_memset_host(void **state) {
  (void)state;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  unsigned char buf[64];
  const struct { size_t off, n; int value; } cases[] = {{0, 64, 0}, {3, 17, 0xab}, {1, 6, 255},
                                                        {60, 4, 0}, {10, 0, 7}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memset(buf, 0x11, sizeof buf);
    HQ_OK_OR_FAIL(hq_ctx_memset(ctx, buf + cases[c].off, cases[c].value, cases[c].n));
    for (size_t i = 0; i < sizeof buf; i++) {
      const int in = i >= cases[c].off && i < cases[c].off + cases[c].n;
      if (buf[i] != (in ? cases[c].value : 0x11))
        fail_msg("case %zu: byte %zu is 0x%02x, 0x%02x expected", c, i, buf[i],
                 in ? cases[c].value : 0x11);
    }
  }
  HQ_OK_OR_FAIL(hq_ctx_memset(ctx, NULL, 0, 0));
  memset(buf, 0x11, sizeof buf);
  assert_int_equal(hq_ctx_memset(NULL, buf, 0, 8), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_memset: ctx is NULL");
  assert_int_equal(hq_ctx_memset(ctx, NULL, 0, 8), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_memset: dst is NULL (8 bytes)");
  assert_int_equal(hq_ctx_memset(ctx, buf, 256, 8), HQ_EINVAL);
  HQ_ERROR_HAS("hq_ctx_memset: value 256 is not a byte (0 to 255)");
  assert_int_equal(hq_ctx_memset(ctx, buf, -1, 8), HQ_EINVAL);
  HQ_ERROR_HAS("value -1 is not a byte");
  for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0x11);
  hq_ctx_destroy(ctx);
}

// --- identity, random stream, saved buffers ----------------------------------------------------

static void test_identity_is_built_in(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  const hq_plugin *p = hq_plugins_find(set, "identity");
  assert_non_null(p);
  assert_string_equal(hq_plugin_file(p), "(built into libhqcore)");
  hq_plugins_close(set);
  /* a recipe found no plugin at all and still quantizes in high precision */
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV;
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[format hp]\nplugin = identity\ndtype = bf16\n"
                                       "[role *:*:*]\nrowwise = hp\n", "t", &o, &r));
  assert_int_equal(hq_recipe_error_count(r), 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 4, 6, 3, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  const hq_storage *row = hq_qtensor_storage(qt, HQ_ROWWISE);
  const hq_storage *col = hq_qtensor_storage(qt, HQ_COLWISE);
  assert_int_equal(row->desc.elem, HQ_BF16);
  assert_int_equal(row->desc.scale_mode, HQ_SCALE_NONE);
  assert_string_equal(hq_storage_cbuf(row, 0)->name, "data");
  assert_int_equal(hq_storage_cbuf(row, 0)->role, HQ_ROLE_DATA);
  /* the columnwise direction is the implicit identity (f32): a different instance, own buffer */
  assert_string_equal(hq_storage_cbuf(col, 0)->name, "columnwise_data");
  assert_int_equal(col->desc.elem, HQ_F32);
  const uint16_t *b = hq_storage_cbuf(row, 0)->ptr;
  for (int i = 0; i < 24; i++)
    assert_int_equal(b[i], hq_f32_to_bf16(((const float *)x.data)[i]));
  assert_int_equal(hq_quantizer_amax_kind(q, HQ_ROWWISE), HQ_AMAX_NONE);
  float amax[2] = {-1, -1};
  HQ_OK_OR_FAIL(hq_quantizer_amax(q, ctx, &x, amax));
  assert_true(amax[0] == 0.0f && amax[1] == 0.0f);
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* The random stream is keyed per role and step (review bug 12): each operation of a role draws
   a new offset (docs/embedding.md's rule, rebuilt by hq_test_rng_offset), the context's step
   does not move by itself, setting it back reproduces a stochastically rounded quantization
   exactly (a resumed run), and quantizing another role in between -- an identity copy, another
   NVFP4 gradient -- changes none of this role's bits. */
static void test_rng_offset(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format g]\nplugin = nvfp4\nstochastic_rounding = true\n"
                                "[role *:grad_output:*]\nrowwise = g\ncolumnwise = g\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:grad_output:x");
  hq_quantizer *other = hq_test_quantizer(r, "linear:grad_output:y");
  hq_quantizer *hp = hq_test_quantizer(r, "linear:input:x"); /* identity: no section matches */
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  d.seed = 1234;
  hq_ctx *ctx = NULL, *alone = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &alone));
  assert_int_equal(hq_ctx_rng_offset(ctx), 0);
  hq_tensor x = hq_test_tensor(HQ_F32, 32, 64, 9, 1.0f);
  hq_qtensor *a = NULL, *b = NULL, *c = NULL, *t = NULL, *a1 = NULL, *b1 = NULL;
  /* on `alone`: x's role twice in a row */
  HQ_OK_OR_FAIL(hq_quantize(q, alone, &x, &a1));
  HQ_OK_OR_FAIL(hq_quantize(q, alone, &x, &b1));
  /* on `ctx`: the same, with two other roles quantized in between */
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &a));
  HQ_OK_OR_FAIL(hq_quantize(hp, ctx, &x, &t));
  hq_qtensor_free(t);
  HQ_OK_OR_FAIL(hq_quantize(other, ctx, &x, &t));
  hq_qtensor_free(t);
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &b));
  assert_int_equal(hq_ctx_rng_offset(ctx), 0); /* the step moves only when set */
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 0));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &c));
  const hq_buffer *ba = hq_storage_cbuf(hq_qtensor_storage(a, HQ_ROWWISE), 0);
  const hq_buffer *bb = hq_storage_cbuf(hq_qtensor_storage(b, HQ_ROWWISE), 0);
  const hq_buffer *bc = hq_storage_cbuf(hq_qtensor_storage(c, HQ_ROWWISE), 0);
  const hq_buffer *ba1 = hq_storage_cbuf(hq_qtensor_storage(a1, HQ_ROWWISE), 0);
  const hq_buffer *bb1 = hq_storage_cbuf(hq_qtensor_storage(b1, HQ_ROWWISE), 0);
  assert_memory_equal(ba->ptr, bc->ptr, ba->bytes);        /* the step set back: same draws */
  assert_memory_not_equal(ba->ptr, bb->ptr, ba->bytes);    /* the role's next call differs */
  assert_memory_equal(ba->ptr, ba1->ptr, ba->bytes);       /* other roles changed nothing */
  assert_memory_equal(bb->ptr, bb1->ptr, bb->bytes);
  /* the offsets themselves: what a plugin sees is the documented mix */
  assert_int_not_equal(hq_test_rng_offset("linear:grad_output:x", 0, 0),
                       hq_test_rng_offset("linear:grad_output:x", 0, 1));
  assert_int_not_equal(hq_test_rng_offset("linear:grad_output:x", 0, 0),
                       hq_test_rng_offset("linear:grad_output:y", 0, 0));
  assert_int_not_equal(hq_test_rng_offset("linear:grad_output:x", 0, 0),
                       hq_test_rng_offset("linear:grad_output:x", 1, 0));
  /* step 7: a fresh context set to step 7 draws what ctx does after it is set to 7 */
  hq_qtensor *s7 = NULL, *s7b = NULL;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, 7));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &s7));
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(alone, 7));
  HQ_OK_OR_FAIL(hq_quantize(q, alone, &x, &s7b));
  assert_memory_equal(hq_storage_cbuf(hq_qtensor_storage(s7, HQ_ROWWISE), 0)->ptr,
                      hq_storage_cbuf(hq_qtensor_storage(s7b, HQ_ROWWISE), 0)->ptr, ba->bytes);
  assert_memory_not_equal(hq_storage_cbuf(hq_qtensor_storage(s7, HQ_ROWWISE), 0)->ptr, ba->ptr,
                          ba->bytes);
  /* hq_ctx_set_rng_offset_ex with HQ_RNG_OFFSET_HOST_ONLY: the same step and restarted counts
     (step 7 again after a draw: s7's bytes); unknown flags refused; a host context has no device
     word, and NULL arguments are refused */
  hq_qtensor *s7c = NULL;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset_ex(ctx, 7, HQ_RNG_OFFSET_HOST_ONLY));
  assert_int_equal(hq_ctx_rng_offset(ctx), 7);
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &s7c));
  assert_memory_equal(hq_storage_cbuf(hq_qtensor_storage(s7c, HQ_ROWWISE), 0)->ptr,
                      hq_storage_cbuf(hq_qtensor_storage(s7, HQ_ROWWISE), 0)->ptr, ba->bytes);
  assert_int_equal(hq_ctx_set_rng_offset_ex(ctx, 8, 2u), HQ_EINVAL);
  assert_int_equal(hq_ctx_rng_offset(ctx), 7);
  assert_int_equal(hq_ctx_set_rng_offset_ex(NULL, 8, 0), HQ_EINVAL);
  uint64_t *word = (uint64_t *)&x;
  assert_int_equal(hq_ctx_rng_offset_device(ctx, &word), HQ_EINVAL);
  assert_null(word);
  assert_non_null(strstr(hq_last_error(), "host context"));
  assert_int_equal(hq_ctx_rng_offset_device(ctx, NULL), HQ_EINVAL);
  hq_qtensor *qs[] = {a, b, c, a1, b1, s7, s7b, s7c};
  hq_qtensors_free(qs, sizeof qs / sizeof qs[0]);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_ctx_destroy(alone);
  hq_quantizer_free(q);
  hq_quantizer_free(other);
  hq_quantizer_free(hp);
  hq_recipe_free(r);
}

/* The offsets a plugin sees on the host, pinned: values of the rule computed outside hq (a
   Python SplitMix64 / FNV-1a-64) that the core gave before the rule moved into hq/numerics.h's
   hq_rng_offset, so that a change of the mix, of the role key or of the count shows here; and
   the call's role_key and role_count (ABI 2.6), from which a captured kernel remakes the offset.
   Read from test_good's log line (the fixture prints them). */
static void test_rng_offset_pinned(void **state) {
  (void)state;
  hq_recipe *r = fixture_recipe(3, NULL);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  sink s = {0};
  counting c = {0};
  hq_allocator a = {.struct_size = sizeof a, .alloc = count_alloc, .free = count_free,
                    .user = &c};
  hq_ctx *ctx = ctx_with(&s, &c, &a);
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  static const struct {
    uint64_t step;
    const char *offset; /* of the step's first call (n = 0), then its second (n = 1) */
    const char *next;
  } pin[] = {
      {0, "0x19662b0b94ec2e62", "0x83ff08f0d483c778"},
      {7, "0x263e7e82fa1c557f", "0xcc4c0dfc564c7522"},
      {UINT64_MAX, "0xe12eabffb33b7924", NULL},
  };
  for (size_t i = 0; i < sizeof pin / sizeof pin[0]; i++) {
    HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(ctx, pin[i].step));
    for (int n = 0; n < 2 && (n == 0 || pin[i].next); n++) {
      hq_qtensor *qt = NULL;
      const int before = s.n;
      HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
      assert_true(s.n > before);
      const char *at = strstr(s.last, "offset ");
      assert_non_null(at);
      char want[96];
      snprintf(want, sizeof want, "%s key 0x3b705da3490431e9 count %d",
               n ? pin[i].next : pin[i].offset, n); /* FNV-1a-64 of "linear:weight:w" */
      assert_string_equal(at + 7, want);
      hq_qtensor_free(qt);
    }
  }
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* hq_rng_offset and hq_splitmix64 (hq/numerics.h), the rule the core and the kernels share (ABI
   2.6), against values computed outside hq (a Python SplitMix64 whose first outputs from seed 0
   are the published 0xe220a8397b1dcdaf, 0x910a2dec89025cc1; FNV-1a-64 role keys), and against
   the test's own rebuild of the documented rule. */
static void test_rng_offset_helper(void **state) {
  (void)state;
  assert_true(hq_splitmix64(0) == 0xe220a8397b1dcdafull);
  assert_true(hq_splitmix64(1) == 0x910a2dec89025cc1ull);
  assert_true(hq_splitmix64(UINT64_MAX) == 0xe4d971771b652c20ull);
  const uint64_t kw = 0x3b705da3490431e9ull;  /* FNV-1a-64 of "linear:weight:w" */
  const uint64_t kg = 0x08bbf33033e5a02cull;  /* ... of "linear:grad_output:x" */
  assert_true(hq_rng_offset(0, kw, 0) == 0x19662b0b94ec2e62ull);
  assert_true(hq_rng_offset(7, kw, 1) == 0xcc4c0dfc564c7522ull);
  assert_true(hq_rng_offset(7, kg, 2) == 0x4ae62fe3557ab47aull);
  assert_true(hq_rng_offset(UINT64_MAX, kg, 5) == 0x695448fc6716f046ull);
  assert_true(hq_rng_offset(7, kg, 2) == hq_test_rng_offset("linear:grad_output:x", 7, 2));
  assert_true(hq_rng_offset(3, kw, 9) == hq_test_rng_offset("linear:weight:w", 3, 9));
}

/* Review bug 10: hq_ctx_destroy while quantized tensors and a scaling state made on the context
   are alive was a silent use-after-free (their frees went through the freed context). Now the
   context ends when the last of them is freed: destroying it first logs a warning (through its
   logger) naming how many still use it, and every later free goes through its allocator. Under
   ASan the old behaviour is a heap-use-after-free here. */
static void test_ctx_outlived(void **state) {
  (void)state;
  sink s = {0};
  counting c = {0};
  hq_allocator a = {.struct_size = sizeof a, .alloc = count_alloc, .free = count_free, .user = &c};
  hq_ctx *ctx = ctx_with(&s, &c, &a);
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\nscaling = delayed\n"
                                "[role *:*:*]\nrowwise = f\ncolumnwise = f\n");
  hq_state *st = NULL;
  HQ_OK_OR_FAIL(hq_state_create(r, ctx, &st));
  hq_role role = hq_role_of("linear", "weight", "w");
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_ex(r, &role, st, &q));
  hq_tensor x = hq_test_tensor(HQ_F32, 16, 32, 7, 1.0f);
  hq_qtensor *a1 = NULL, *a2 = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &a1));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &a2));
  const int before = s.n;
  hq_ctx_destroy(ctx);
  assert_int_equal(s.n, before + 1);
  assert_non_null(strstr(s.last, "3 quantized tensors or scaling states still use this context"));
  const int frees0 = c.frees;
  hq_qtensor_free(a1);
  assert_true(c.frees > frees0); /* its buffers went back through the context's allocator */
  hq_qtensor_free(a2);
  hq_quantizer_free(q);
  hq_state_free(st); /* the last user: the context ends here */
  assert_int_equal(c.allocs, c.frees);
  free(x.data);
  hq_recipe_free(r);
}

/* Review bug 5: hq_role, hq_format_info, hq_role_info and hq_allocator carry struct_size. A
   role without it (struct_size 0: a caller that filled the three strings alone) is refused with
   the struct named; an info struct of a newer, larger size gets this core's bytes and nothing
   beyond (the canary stays); one below the floor is refused. */
static void test_struct_sizes(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\n[role linear:*:*]\nrowwise = f\n");
  hq_role bad = hq_role_of("linear", "weight", "w");
  bad.struct_size = 0;
  hq_quantizer *q = NULL;
  assert_int_equal(hq_quantizer_create(r, &bad, &q), HQ_EINVAL);
  HQ_ERROR_HAS("hq_role.struct_size = 0");
  assert_int_equal(hq_recipe_match(r, &bad), -1);
  HQ_ERROR_HAS("hq_recipe_match");
  hq_role good = hq_role_of("linear", "weight", "w");
  assert_int_equal(hq_recipe_match(r, &good), 0);
  /* a newer caller's larger hq_role_info: this core's fields written, struct_size says how
     many bytes that was, and nothing beyond them touched (the canary stays) */
  struct {
    hq_role_info ri;
    unsigned char canary[16];
  } big;
  memset(&big, 0xa5, sizeof big);
  big.ri.struct_size = (uint32_t)sizeof big;
  HQ_OK_OR_FAIL(hq_recipe_role_info(r, 0, &big.ri));
  assert_int_equal(big.ri.struct_size, sizeof(hq_role_info));
  assert_string_equal(big.ri.pattern, "linear:*:*");
  assert_string_equal(big.ri.rowwise, "f");
  assert_int_equal(big.ri.shadowed_by, -1);
  for (size_t i = 0; i < sizeof big.canary; i++) assert_int_equal(big.canary[i], 0xa5);
  hq_role_info tiny = {.struct_size = 4};
  assert_int_equal(hq_recipe_role_info(r, 0, &tiny), HQ_EINVAL);
  hq_format_info fi = {.struct_size = 3};
  assert_int_equal(hq_recipe_format_info(r, 0, &fi), HQ_EINVAL);
  HQ_ERROR_HAS("hq_format_info.struct_size");
  /* an allocator without struct_size */
  counting c = {0};
  hq_allocator a = {.struct_size = 0, .alloc = count_alloc, .free = count_free, .user = &c};
  hq_ctx_desc d = {.struct_size = sizeof d, .device = HQ_DEVICE_HOST, .allocator = &a};
  hq_ctx *ctx = NULL;
  assert_int_equal(hq_ctx_create(&d, &ctx), HQ_EINVAL);
  HQ_ERROR_HAS("hq_allocator.struct_size");
  a.struct_size = sizeof a;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  hq_ctx_destroy(ctx);
  hq_recipe_free(r);
}

/* Per-call directions (review bug 12): hq_quantize_args.dirs makes just those directions of a
   quantizer whose usage is both (the qtensor's usage is then those), an update refreshes just
   the directions it names, and naming one the qtensor does not hold is HQ_ESTATE. */
static void test_call_dirs(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\n[role *:*:*]\n"
                                "rowwise = f\ncolumnwise = f\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 16, 32, 3, 1.0f), y = hq_test_tensor(HQ_F32, 16, 32, 4, 2.0f);
  hq_qtensor *t = NULL, *full = NULL, *ref = NULL;
  hq_quantize_args a = {.struct_size = sizeof a, .dirs = HQ_ROWWISE};
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, &x, &a, &t));
  assert_int_equal(hq_qtensor_dirs(t), HQ_ROWWISE);
  assert_int_equal(hq_qtensor_usage(t), HQ_ROWWISE);
  assert_int_equal(hq_quantizer_usage(q), HQ_BOTH); /* the quantizer is not changed */
  a.dirs = HQ_COLWISE;
  assert_int_equal(hq_qtensor_update_ex(t, ctx, &y, &a), HQ_ESTATE);
  assert_string_equal(hq_last_error(), "hq_qtensor_update: role linear:input:x has no columnwise "
                                       "copy to refresh (it holds the rowwise one only)");
  a.dirs = HQ_BOTH;
  assert_int_equal(hq_qtensor_update_ex(t, ctx, &y, &a), HQ_ESTATE);
  HQ_ERROR_HAS("has no columnwise copy to refresh");
  a.dirs = 4;
  assert_int_equal(hq_qtensor_update_ex(t, ctx, &y, &a), HQ_EINVAL);
  assert_string_equal(hq_last_error(), "hq_qtensor_update: directions 0x4 have unknown bits");
  assert_int_equal(hq_quantize_ex(q, ctx, &x, &a, &full), HQ_EINVAL);
  assert_null(full);
  /* both made, then the rowwise copy alone refreshed from y: rowwise = y's, columnwise = x's */
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &full));
  a.dirs = HQ_ROWWISE;
  HQ_OK_OR_FAIL(hq_qtensor_update_ex(full, ctx, &y, &a));
  assert_int_equal(hq_qtensor_usage(full), HQ_BOTH);
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &ref));
  const hq_storage *fr = hq_qtensor_storage(full, HQ_ROWWISE), *rr = hq_qtensor_storage(ref, HQ_ROWWISE);
  assert_memory_equal(hq_storage_cbuf(fr, 0)->ptr, hq_storage_cbuf(rr, 0)->ptr,
                      hq_storage_cbuf(rr, 0)->bytes);
  const hq_storage *fc = hq_qtensor_storage(full, HQ_COLWISE), *rc = hq_qtensor_storage(ref, HQ_COLWISE);
  assert_memory_not_equal(hq_storage_cbuf(fc, 0)->ptr, hq_storage_cbuf(rc, 0)->ptr,
                          hq_storage_cbuf(rc, 0)->bytes);
  hq_qtensor_free(t);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  free(x.data);
  free(y.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* Saved-buffer descriptors with an older (floor-size) element: the list is written with that
   stride and read back. */
static void test_saved_buffer_stride(void **state) {
  (void)state;
  hq_recipe *r = fixture_recipe(3, NULL);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 16, 2, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  const size_t es = HQ_SAVED_BUFFER_SIZE_0_2;
  size_t n = 0;
  char *list = malloc(4 * es);
  assert_int_equal(hq_qtensor_save(qt, (hq_saved_buffer *)list, 4, es - 1, &n), HQ_EINVAL);
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, (hq_saved_buffer *)list, 4, es, &n));
  assert_int_equal(n, 4);
  static const char *names[] = {"data", "aux", "columnwise_data", "columnwise_aux"};
  for (size_t i = 0; i < n; i++) {
    hq_saved_buffer e;
    memcpy(&e, list + i * es, es);
    assert_string_equal(e.name, names[i]);
    assert_int_equal(e.dir, i < 2 ? HQ_ROWWISE : HQ_COLWISE);
    assert_int_equal(e.bytes, i % 2 ? 2 : 8 * 16 * 4);
    assert_int_equal(e.device, HQ_DEVICE_HOST);
  }
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, (hq_saved_buffer *)list, n, es));
  assert_memory_equal(hq_storage_cbuf(hq_qtensor_storage(qt, HQ_COLWISE), 0)->ptr, x.data,
                      8 * 16 * 4);
  free(list);
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* Sizes near the limits: refused with the numbers, never a wrapped-around small allocation. */
static void test_huge_sizes(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe("[role *:*:*]\nrowwise = identity\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_qtensor *qt = NULL;
  assert_int_equal(hq_make_empty(q, ctx, (int64_t)1 << 62, 4, HQ_F32, &qt), HQ_ESHAPE);
  HQ_ERROR_HAS("4611686018427387904");
  HQ_ERROR_HAS("2^48");
  assert_int_equal(hq_make_empty(q, ctx, INT64_MAX, INT64_MAX, HQ_F32, &qt), HQ_ESHAPE);
  assert_null(qt);
  void *p = (void *)1;
  assert_int_equal(hq_ctx_alloc(ctx, SIZE_MAX, &p), HQ_ENOMEM);
  assert_null(p);
  assert_int_equal(hq_ctx_alloc(ctx, SIZE_MAX - 10, &p), HQ_ENOMEM);
  hq_tensor x = hq_tensor_2d((void *)16, HQ_F32, HQ_DEVICE_HOST, (int64_t)1 << 40, 1 << 20);
  assert_int_equal(hq_quantize(q, ctx, &x, &qt), HQ_ESHAPE);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* A quantizer built from "plugin + options" without recipe text equals the recipe's, bit for bit;
   equal specs make one fused instance; bad options are refused by name. */
static void test_direct_quantizer(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  const char *opts[] = {"dtype=e5m2", "power_2_scales=true"};
  hq_format_spec f8 = {sizeof f8, "fp8_tensor", opts, 2};
  hq_quantizer *q = NULL, *h = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &f8, &f8, HQ_SOURCE_ORIGINAL, &q));
  assert_true(hq_quantizer_fused(q));
  assert_string_equal(hq_quantizer_plugin(q, HQ_COLWISE), "fp8_tensor");
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\ndtype = e5m2\n"
                                "power_2_scales = true\n[role *:*:*]\nrowwise = f\n"
                                "columnwise = f\n");
  hq_quantizer *rq = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_BF16, 48, 40, 4, 3.0f);
  hq_qtensor *a = NULL, *b = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &a));
  HQ_OK_OR_FAIL(hq_quantize(rq, ctx, &x, &b));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1)
    for (uint32_t i = 0; i < hq_qtensor_storage(a, dir)->nbuf; i++) {
      const hq_buffer *ba = hq_storage_cbuf(hq_qtensor_storage(a, dir), i);
      const hq_buffer *bb = hq_storage_cbuf(hq_qtensor_storage(b, dir), i);
      assert_string_equal(ba->name, bb->name);
      assert_memory_equal(ba->ptr, bb->ptr, ba->bytes);
    }
  /* a hybrid: fp8_tensor rowwise, high precision columnwise (NULL spec) */
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &f8, NULL, HQ_SOURCE_ORIGINAL, &h));
  assert_false(hq_quantizer_fused(h));
  assert_string_equal(hq_quantizer_plugin(h, HQ_COLWISE), "identity");
  /* refusals */
  hq_quantizer *bad = NULL;
  const char *unknown[] = {"scale_mode=delayed"}, *range[] = {"amax_epsilon=-1"}, *twice[] = {
      "dtype=e4m3", "dtype=e5m2"}, *noeq[] = {"dtype"};
  hq_format_spec s1 = {sizeof s1, "fp8_tensor", unknown, 1}, s2 = {sizeof s2, "fp8_tensor", range, 1},
                 s3 = {sizeof s3, "fp8_tensor", twice, 2}, s4 = {sizeof s4, "fp8_tensor", noeq, 1},
                 s5 = {sizeof s5, "no_such_format", NULL, 0};
  assert_int_equal(hq_quantizer_create_direct(set, &s1, NULL, 0, &bad), HQ_EPARSE);
  HQ_ERROR_HAS("has no option 'scale_mode'");
  assert_int_equal(hq_quantizer_create_direct(set, &s2, NULL, 0, &bad), HQ_EPARSE);
  HQ_ERROR_HAS("amax_epsilon");
  assert_int_equal(hq_quantizer_create_direct(set, NULL, &s3, 0, &bad), HQ_EPARSE);
  HQ_ERROR_HAS("columnwise option 'dtype' given twice");
  assert_int_equal(hq_quantizer_create_direct(set, &s4, NULL, 0, &bad), HQ_EPARSE);
  HQ_ERROR_HAS("is not key=value");
  assert_int_equal(hq_quantizer_create_direct(set, &s5, NULL, 0, &bad), HQ_ENOENT);
  HQ_ERROR_HAS("'no_such_format' was not found");
  assert_null(bad);
  hq_qtensor_free(a);
  hq_qtensor_free(b);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_quantizer_free(h);
  hq_quantizer_free(rq);
  hq_recipe_free(r);
  hq_plugins_close(set);
}

/* A module's configure() status reaches the caller as it is (test_good's label "status=N"
   refuses with N and a message, "raw=N" returns N alone); a value that is no hq_status is
   HQ_EINTERNAL naming the plugin and the value. */
static void test_configure_status(void **state) {
  (void)state;
  const char *dir = fixtures();
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(&dir, 1, HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV, &set));
  static const struct { const char *opt; int rc; const char *needle; } cases[] = {
      {"label=status=1", HQ_EINVAL, "configure refuses with status 1"},
      {"label=status=2", HQ_ENOMEM, "configure refuses with status 2"},
      {"label=status=3", HQ_ENOTSUP, "configure refuses with status 3"},
      {"label=status=4", HQ_ESHAPE, "configure refuses with status 4"},
      {"label=status=5", HQ_EPARSE, "configure refuses with status 5"},
      {"label=status=11", HQ_EINTERNAL, "configure refuses with status 11"},
      {"label=raw=2", HQ_ENOMEM, "out of memory"},
      {"label=raw=3", HQ_ENOTSUP, "not supported"},
      {"label=raw=12", HQ_EINTERNAL,
       "plugin test_good: configure() returned 12, which is not an hq_status"},
      {"label=raw=-1", HQ_EINTERNAL,
       "plugin test_good: configure() returned -1, which is not an hq_status"},
      {"label=status=42", HQ_EINTERNAL,
       "plugin test_good: configure() returned 42, which is not an hq_status: "
       "configure refuses with status 42"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hq_format_spec spec = {sizeof spec, "test_good", &cases[i].opt, 1};
    hq_quantizer *q = NULL;
    int rc = hq_quantizer_create_direct(set, &spec, NULL, HQ_SOURCE_ORIGINAL, &q);
    if (rc != cases[i].rc)
      fail_msg("%s: status %d, expected %d (%s)", cases[i].opt, rc, cases[i].rc,
               hq_last_error());
    HQ_ERROR_HAS(cases[i].needle);
    HQ_ERROR_HAS("rowwise format 'test_good'");
    assert_null(q);
  }
  hq_plugins_close(set);
}

/* Where the core receives a module's status (here quantize and dequantize of test_good, whose
   label "qraw=N" / "draw=N" makes the op return N): an hq_status reaches the caller as it is; any
   other value (-7, 12345, 12 one past HQ_EINTERNAL) is HQ_EINTERNAL naming the plugin, the op
   and the value -- never "unknown status", never success. */
static void test_plugin_status_range(void **state) {
  (void)state;
  const char *dir = fixtures();
  hq_plugins *set = NULL;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(&dir, 1, HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV, &set));
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  static float data[4 * 4];
  hq_tensor x = hq_tensor_2d(data, HQ_F32, HQ_DEVICE_HOST, 4, 4);
  static const struct { const char *opt; int rc; const char *msg; } cases[] = {
      {"label=qraw=-7", HQ_EINTERNAL,
       "role (direct), rowwise format 'test_good' (plugin test_good), quantize of [4, 4] f32: "
       "plugin test_good: quantize() returned -7, which is not an hq_status"},
      {"label=qraw=12345", HQ_EINTERNAL,
       "role (direct), rowwise format 'test_good' (plugin test_good), quantize of [4, 4] f32: "
       "plugin test_good: quantize() returned 12345, which is not an hq_status"},
      {"label=qraw=12", HQ_EINTERNAL,
       "role (direct), rowwise format 'test_good' (plugin test_good), quantize of [4, 4] f32: "
       "plugin test_good: quantize() returned 12, which is not an hq_status"},
      {"label=qraw=3", HQ_ENOTSUP, NULL},
      {"label=qraw=11", HQ_EINTERNAL, NULL},
      {"label=draw=-7", HQ_EINTERNAL, "plugin test_good: dequantize() returned -7, which is not an "
                                      "hq_status"},
      {"label=draw=12345", HQ_EINTERNAL, "plugin test_good: dequantize() returned 12345, which is "
                                         "not an hq_status"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hq_format_spec spec = {sizeof spec, "test_good", &cases[i].opt, 1};
    hq_quantizer *q = NULL;
    hq_qtensor *t = NULL;
    HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, NULL, HQ_SOURCE_ORIGINAL, &q));
    int rc = hq_quantize(q, ctx, &x, &t);
    if (!strncmp(cases[i].opt, "label=draw=", 11)) {
      HQ_OK_OR_FAIL(rc);
      static float out[4 * 4];
      hq_tensor y = hq_tensor_2d(out, HQ_F32, HQ_DEVICE_HOST, 4, 4);
      rc = hq_dequantize(t, ctx, HQ_ROWWISE, &y);
    }
    if (rc != cases[i].rc)
      fail_msg("%s: status %d, expected %d (%s)", cases[i].opt, rc, cases[i].rc, hq_last_error());
    if (cases[i].msg && !strstr(hq_last_error(), cases[i].msg))
      fail_msg("%s: error '%s' lacks '%s'", cases[i].opt, hq_last_error(), cases[i].msg);
    assert_string_not_equal(hq_strerror(rc), "unknown status");
    hq_qtensor_free(t);
    hq_quantizer_free(q);
  }
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}

/* HQ_I4X2 (ABI 2.5): one byte per two signed 4-bit codes. Its name and size; hq_i4x2_pack /
   hq_i4x2_get over every pair of values (-8..7, element 2i in the low nibble: pack(-8, 7) is
   0x78, pack(-1, 0) is 0x0F); a data buffer of it has its inner dimension halved, so that a
   [4, 8] tensor's codes are 16 bytes: 4 bits per element (test_good level 10: codes + aux [2]). */
static void test_i4x2(void **state) {
  (void)state;
  assert_int_equal(HQ_ABI_MINOR, 6);
  assert_int_equal(HQ_I4X2, 13);
  assert_int_equal(hq_dtype_size(HQ_I4X2), 1);
  assert_string_equal(hq_dtype_name(HQ_I4X2), "i4x2");
  assert_int_equal(hq_dtype_from_name("i4x2"), HQ_I4X2);
  assert_int_equal(hq_i4x2_pack(-8, 7), 0x78);
  assert_int_equal(hq_i4x2_pack(-1, 0), 0x0F);
  assert_int_equal(hq_i4x2_pack(3, -3), 0xD3);
  for (int lo = -8; lo <= 7; lo++)
    for (int hi = -8; hi <= 7; hi++) {
      const uint8_t row[2] = {hq_i4x2_pack(lo, hi), hq_i4x2_pack(hi, lo)};
      assert_int_equal(row[0], (uint8_t)((lo & 15) | (hi & 15) << 4));
      assert_int_equal(hq_i4x2_get(row, 0), lo);
      assert_int_equal(hq_i4x2_get(row, 1), hi);
      assert_int_equal(hq_i4x2_get(row, 2), hi);
      assert_int_equal(hq_i4x2_get(row, 3), lo);
    }
  const char *dir = fixtures();
  hq_plugins *set = NULL;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(&dir, 1, HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV, &set));
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const char *opt = "level=10";
  hq_format_spec spec = {sizeof spec, "test_good", &opt, 1};
  hq_quantizer *q = NULL;
  hq_qtensor *t = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, NULL, HQ_SOURCE_ORIGINAL, &q));
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 4, 8, HQ_F32, &t));
  const hq_storage *st = hq_qtensor_storage(t, HQ_ROWWISE);
  assert_int_equal(hq_storage_cbuf(st, 0)->dtype, HQ_I4X2);
  assert_int_equal(hq_storage_cbuf(st, 0)->bytes, 16);
  assert_int_equal(hq_qtensor_bytes(t, HQ_ROWWISE), 16 + 2);
  hq_qtensor_free(t);
  hq_quantizer_free(q);
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}

/* A recipe with errors: the parse functions leave the first error in hq_last_error; the
   string twin of hq_recipe_load refuses it. */
static void test_recipe_string_errors(void **state) {
  (void)state;
  hq_recipe_opts o = {0};
  o.struct_size = sizeof o;
  o.plugin_flags = HQ_PLUGINS_NO_DEFAULT | HQ_PLUGINS_NO_ENV;
  hq_recipe *r = NULL;
  hq_clear_error();
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[role a:b:c]\nrowwise = nope\n", "s.ini", &o, &r));
  assert_int_equal(hq_recipe_error_count(r), 1);
  HQ_ERROR_HAS("s.ini:2: unknown format 'nope'");
  hq_recipe_free(r);
  assert_int_equal(hq_recipe_load_string("[role a:b:c]\nrowwise = nope\n", "s.ini", &o, &r),
                   HQ_EPARSE);
  assert_null(r);
  HQ_ERROR_HAS("s.ini:2: unknown format 'nope'");
  HQ_OK_OR_FAIL(hq_recipe_load_string("[role a:b:c]\nrowwise = identity\n", "s.ini", &o, &r));
  hq_recipe_free(r);
  /* a repeated key does not hide the other errors of the file: all are listed, in line order,
     with no follow-on noise */
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[format a]\nplugin = identity\ndtype = f32\n"
                                       "dtype = bf16\n[role x:y:z]\nrowwise = nope\n[bogus]\n"
                                       " = 3\n", "m.ini", &o, &r));
  assert_int_equal(hq_recipe_error_count(r), 4);
  assert_non_null(strstr(hq_recipe_error(r, 0), "m.ini:4: key 'dtype' repeated"));
  assert_non_null(strstr(hq_recipe_error(r, 1), "m.ini:6: unknown format 'nope'"));
  assert_non_null(strstr(hq_recipe_error(r, 2), "m.ini:7: unknown section [bogus]"));
  assert_non_null(strstr(hq_recipe_error(r, 3), "m.ini:8: empty key"));
  hq_recipe_free(r);
}


/* The alignment rule: element-aligned data is accepted at any such offset (here 2 bytes for bf16
   and 4 for f32 past a 64-byte boundary, so no 16-byte vector path applies) and quantizes to the
   same bytes as an aligned copy, for every stock format; offsets that split an element (1 and 3
   bytes for bf16; 1, 2 and 3 for f32) are refused with a message naming the rule. */
static void test_alignment_rule(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const char *plugins[] = {"identity", "fp8_tensor", "mxfp8", "nvfp4", "fp8_block"};
  const int64_t R = 64, C = 64;
  for (int dt = 0; dt < 2; dt++) {
    hq_dtype t = dt ? HQ_F32 : HQ_BF16;
    size_t es = hq_dtype_size(t), bytes = (size_t)(R * C) * es;
    hq_tensor ref = hq_test_tensor(t, R, C, 9, 1.0f);
    uint8_t *raw = aligned_alloc(64, bytes + 128);
    for (size_t p = 0; p < sizeof plugins / sizeof *plugins; p++) {
      hq_format_spec spec = {sizeof spec, plugins[p], NULL, 0};
      hq_quantizer *q = NULL;
      HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, &spec, HQ_SOURCE_ORIGINAL, &q));
      hq_qtensor *a = NULL;
      HQ_OK_OR_FAIL(hq_quantize(q, ctx, &ref, &a));
      for (size_t off = 1; off <= 4; off++) {
        memcpy(raw + off, ref.data, bytes);
        hq_tensor x = hq_tensor_2d(raw + off, t, HQ_DEVICE_HOST, R, C);
        hq_qtensor *b = NULL;
        int rc = hq_quantize(q, ctx, &x, &b);
        if (off % es) {
          assert_int_equal(rc, HQ_EINVAL);
          HQ_ERROR_HAS("element-aligned");
          continue;
        }
        HQ_OK_OR_FAIL(rc);
        for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
          const hq_storage *sa = hq_qtensor_storage(a, d), *sb = hq_qtensor_storage(b, d);
          for (uint32_t i = 0; i < sa->nbuf; i++)
            assert_memory_equal(hq_storage_cbuf(sa, i)->ptr, hq_storage_cbuf(sb, i)->ptr,
                                hq_storage_cbuf(sa, i)->bytes);
        }
        hq_qtensor_free(b);
      }
      hq_qtensor_free(a);
      hq_quantizer_free(q);
    }
    free(raw);
    free(ref.data);
  }
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}


/* Non-finite input: counted and located; HQ_QUANTIZE_FINITE_ONLY refuses it (quantize and
   update) and leaves an updated tensor as it was. */
static void test_finite_only(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_BF16, 32, 64, 4, 1.0f);
  int64_t count, first;
  HQ_OK_OR_FAIL(hq_tensor_nonfinite(ctx, &x, &count, &first));
  assert_int_equal(count, 0);
  assert_int_equal(first, -1);
  hq_format_spec spec = {sizeof spec, "mxfp8", NULL, 0};
  hq_quantizer *q = NULL;
  HQ_OK_OR_FAIL(hq_quantizer_create_direct(set, &spec, &spec, HQ_SOURCE_ORIGINAL, &q));
  hq_quantize_args args = {.struct_size = sizeof args, .flags = HQ_QUANTIZE_FINITE_ONLY};
  hq_qtensor *t = NULL;
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, &x, &args, &t));
  const hq_storage *st = hq_qtensor_storage(t, HQ_ROWWISE);
  size_t nb = hq_storage_cbuf(st, 0)->bytes;
  uint8_t *before = malloc(nb);
  memcpy(before, hq_storage_cbuf(st, 0)->ptr, nb);
  hq_store_hp(x.data, 64 * 3 + 5, HQ_BF16, NAN);
  hq_store_hp(x.data, 64 * 20 + 1, HQ_BF16, -INFINITY);
  HQ_OK_OR_FAIL(hq_tensor_nonfinite(ctx, &x, &count, &first));
  assert_int_equal(count, 2);
  assert_int_equal(first, 64 * 3 + 5);
  hq_qtensor *bad = NULL;
  assert_int_equal(hq_quantize_ex(q, ctx, &x, &args, &bad), HQ_EINVAL);
  HQ_ERROR_HAS("2 NaN/Inf values, the first at [3, 5]");
  assert_null(bad);
  assert_int_equal(hq_qtensor_update_ex(t, ctx, &x, &args), HQ_EINVAL);
  HQ_ERROR_HAS("hq_qtensor_update");
  assert_memory_equal(hq_storage_cbuf(st, 0)->ptr, before, nb); /* nothing written */
  /* without the flag the format's own rule applies */
  HQ_OK_OR_FAIL(hq_qtensor_update(t, ctx, &x));
  free(before);
  hq_qtensor_free(t);
  hq_quantizer_free(q);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_plugins_close(set);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alignment_rule),
      cmocka_unit_test(test_finite_only),
      cmocka_unit_test(test_dir_name),
      cmocka_unit_test(test_ctx_desc_floor),        cmocka_unit_test(test_recipe_opts_floor),
      cmocka_unit_test(test_tensor_struct_size),    cmocka_unit_test(test_layout_checks),
      cmocka_unit_test(test_raw_buffer_checks),
      cmocka_unit_test(test_storage_as_described),  cmocka_unit_test(test_update_must_not_allocate),
      cmocka_unit_test(test_per_call_context),      cmocka_unit_test(test_identity_is_built_in),
      cmocka_unit_test(test_ctx_capturing_host),
      cmocka_unit_test(test_ctx_memset_host),
      cmocka_unit_test(test_rng_offset),            cmocka_unit_test(test_call_dirs),
      cmocka_unit_test(test_rng_offset_pinned),     cmocka_unit_test(test_rng_offset_helper),
      cmocka_unit_test(test_ctx_outlived),
      cmocka_unit_test(test_struct_sizes),
      cmocka_unit_test(test_saved_buffer_stride),
      cmocka_unit_test(test_huge_sizes),            cmocka_unit_test(test_direct_quantizer),
      cmocka_unit_test(test_recipe_string_errors),  cmocka_unit_test(test_configure_status),
      cmocka_unit_test(test_plugin_status_range),
      cmocka_unit_test(test_i4x2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
