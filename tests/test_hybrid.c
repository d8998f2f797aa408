/*
** test_hybrid.c -- the hybrid quantizer and quantized tensors: equal-format hybrids are
** bit-identical to the single-format quantize for every loaded plugin; usage flags decide which
** directions are made and refreshed; mixed formats; the rowwise_dequantized source; update in
** place keeps a skipped direction intact (even when it shared buffers); drop; make_empty;
** save/restore; snapshots; error paths.
*/
#include <math.h>

#include "hq_test.h"

static hq_ctx *host_ctx(void) {
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  return ctx;
}

/* Every buffer of direction dir holds the same bytes in a and b. */
static void assert_same_storage(const hq_qtensor *a, const hq_qtensor *b, uint32_t dir,
                                const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
  if (!sa || !sb) fail_msg("%s: direction %u missing", what, dir);
  assert_int_equal(sa->nbuf, sb->nbuf);
  for (uint32_t i = 0; i < sa->nbuf; i++) {
    assert_string_equal(sa->buf[i].name, sb->buf[i].name);
    assert_int_equal(sa->buf[i].bytes, sb->buf[i].bytes);
    if (memcmp(sa->buf[i].ptr, sb->buf[i].ptr, sa->buf[i].bytes) != 0)
      fail_msg("%s: direction %u buffer '%s' differs", what, dir, sa->buf[i].name);
  }
}

static hq_qtensor *quantize_with(hq_recipe *r, hq_ctx *ctx, const hq_tensor *x, uint32_t usage) {
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, x, &qt));
  hq_quantizer_free(q);
  return qt;
}

/* One configuration: one format instance for both directions (one fused call) == two instances
   of the same options (two calls) == each direction quantized alone. */
static void check_equal_format(const hq_tensor *x, const char *plugin, const char *options) {
  char ta[512], tb[512], what[256];
  snprintf(what, sizeof what, "%s [%s]", plugin, options);
  snprintf(ta, sizeof ta,
           "[format a]\nplugin = %s\n%s\n[role *:*:*]\nrowwise = a\ncolumnwise = a\n", plugin,
           options);
  snprintf(tb, sizeof tb, "[format r]\nplugin = %s\n%s\n[format c]\nplugin = %s\n%s\n[role *:*:*]\n"
           "rowwise = r\ncolumnwise = c\n", plugin, options, plugin, options);
  hq_recipe *ra = hq_test_recipe(ta), *rb = hq_test_recipe(tb);
  hq_quantizer *qa = hq_test_quantizer(ra, "x:y:z"), *qb = hq_test_quantizer(rb, "x:y:z");
  assert_true(hq_quantizer_fused(qa));
  assert_false(hq_quantizer_fused(qb));
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
  /* a fresh context each: every operation starts from random-stream offset 0 */
  hq_ctx *ctx[4] = {host_ctx(), host_ctx(), host_ctx(), host_ctx()};
  hq_qtensor *fused = quantize_with(ra, ctx[0], x, HQ_BOTH);
  hq_qtensor *split = quantize_with(rb, ctx[1], x, HQ_BOTH);
  hq_qtensor *row = quantize_with(ra, ctx[2], x, HQ_ROWWISE);
  hq_qtensor *col = quantize_with(ra, ctx[3], x, HQ_COLWISE);
  assert_int_equal(hq_qtensor_dirs(row), HQ_ROWWISE);
  assert_int_equal(hq_qtensor_dirs(col), HQ_COLWISE);
  assert_same_storage(fused, split, HQ_ROWWISE, what);
  assert_same_storage(fused, split, HQ_COLWISE, what);
  assert_same_storage(fused, row, HQ_ROWWISE, what);
  assert_same_storage(fused, col, HQ_COLWISE, what);
  hq_qtensor_free(fused);
  hq_qtensor_free(split);
  hq_qtensor_free(row);
  hq_qtensor_free(col);
  for (int i = 0; i < 4; i++) hq_ctx_destroy(ctx[i]);
  hq_recipe_free(ra);
  hq_recipe_free(rb);
}

/* Every plugin on the path with its default options, and the stock plugins' other option sets
   (stochastic rounding included: every operation draws from one random stream, whether its
   directions are made by one call or two). */
static void test_equal_format_hybrid_every_plugin(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  assert_true(hq_plugins_count(set) >= 2);
  hq_tensor x = hq_test_tensor(HQ_BF16, 128, 256, 3, 1.0f);
  static const char *extra[][2] = {
      {"fp8_tensor", "dtype = e5m2\npower_2_scales = true"},
      {"mxfp8", "swizzle = true"},
      {"mxfp8", "block_2d = true\ndtype = e5m2"},
      {"nvfp4", "stochastic_rounding = true\nrht = true"},
      {"nvfp4", "block_2d = true\nswizzle = true"},
      {"fp8_block", "block = 2d\npower_2_scales = false"},
      {"identity", "dtype = f16"},
  };
  int checked = 0;
  for (size_t p = 0; p < hq_plugins_count(set); p++) {
    const hq_plugin *pl = hq_plugins_get(set, p);
    if (!(hq_plugin_caps(pl) & HQ_CAP_CPU)) continue;
    check_equal_format(&x, hq_plugin_name(pl), "");
    for (size_t e = 0; e < sizeof extra / sizeof extra[0]; e++) {
      if (strcmp(extra[e][0], hq_plugin_name(pl)) != 0) continue;
      check_equal_format(&x, extra[e][0], extra[e][1]);
      checked++;
    }
  }
  /* all five stock plugins are built in this tree */
  assert_int_equal(checked, (int)(sizeof extra / sizeof extra[0]));
  free(x.data);
  hq_plugins_close(set);
}

static const char *MIXED =
    "[format f8]\nplugin = fp8_tensor\n[format hp]\nplugin = identity\ndtype = f32\n"
    "[role *:*:*]\nrowwise = f8\ncolumnwise = hp\n"
    "[role *:*:derived]\nrowwise = f8\ncolumnwise = hp\ncolumnwise_source = rowwise_dequantized\n"
    "[role *:*:both8]\nrowwise = f8\ncolumnwise = f8\n";

/* Two formats: each direction equals the single-format quantize of its own format. */
static void test_mixed_formats(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_recipe *r8 = hq_test_recipe("[role *:*:*]\nrowwise = fp8_tensor\n");
  hq_tensor x = hq_test_tensor(HQ_F32, 33, 65, 11, 2.0f);
  hq_qtensor *qt = quantize_with(r, ctx, &x, HQ_BOTH);
  hq_qtensor *ref = quantize_with(r8, ctx, &x, HQ_ROWWISE);
  assert_string_equal(hq_qtensor_format(qt, HQ_ROWWISE), "f8");
  assert_string_equal(hq_qtensor_format(qt, HQ_COLWISE), "hp");
  assert_same_storage(qt, ref, HQ_ROWWISE, "fp8 rowwise");
  const hq_storage *c = hq_qtensor_storage(qt, HQ_COLWISE);
  assert_int_equal(c->buf[0].dtype, HQ_F32);
  assert_memory_equal(c->buf[0].ptr, x.data, 33 * 65 * 4); /* the original, untouched */
  hq_qtensor_free(qt);
  hq_qtensor_free(ref);
  hq_recipe_free(r8);
  free(x.data);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* columnwise_source = rowwise_dequantized: the identity columnwise copy equals the dequantized
   rowwise FP8 values; with only columnwise requested a transient rowwise quantization is made. */
static void test_rowwise_dequantized_source(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_tensor x = hq_test_tensor(HQ_F32, 16, 48, 5, 1.0f);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:derived");
  assert_int_equal(hq_quantizer_columnwise_source(q), HQ_SOURCE_ROWWISE_DEQUANTIZED);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_tensor deq = hq_test_empty(HQ_F32, 16, 48);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &deq));
  const float *col = hq_qtensor_storage(qt, HQ_COLWISE)->buf[0].ptr;
  assert_memory_equal(col, deq.data, 16 * 48 * 4);
  int differs = 0;
  for (int i = 0; i < 16 * 48; i++) differs |= col[i] != ((float *)x.data)[i];
  assert_true(differs); /* it really is the FP8-rounded copy */
  hq_qtensor_free(qt);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_COLWISE));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_COLWISE);
  assert_memory_equal(hq_qtensor_storage(qt, HQ_COLWISE)->buf[0].ptr, deq.data, 16 * 48 * 4);
  /* update with the source rule: columnwise follows the new rowwise rounding */
  hq_tensor y = hq_test_tensor(HQ_F32, 16, 48, 6, 3.0f);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y));
  hq_qtensor *fresh = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &fresh));
  assert_same_storage(qt, fresh, HQ_COLWISE, "updated derived column");
  assert_true(hq_quantizer_requant_safe(q));
  hq_qtensor_free(fresh);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  free(deq.data);
  free(x.data);
  free(y.data);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* update refreshes only present directions in the tensor's usage; a skipped direction keeps
   its old bytes AND its old scale, although the two directions shared one scale buffer. */
static void test_update_usage_and_sharing(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:both8");
  assert_true(hq_quantizer_fused(q));
  hq_tensor x = hq_test_tensor(HQ_F32, 32, 40, 1, 1.0f);
  hq_tensor y = hq_test_tensor(HQ_F32, 32, 40, 2, 10.0f);
  hq_tensor z = hq_test_tensor(HQ_F32, 32, 40, 3, 0.1f);
  hq_qtensor *qt = NULL, *fx = NULL, *fy = NULL, *fz = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &fx));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &fy));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &z, &fz));
  /* the tensor snapshots the quantizer: later changes to q do not reach it */
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
  assert_int_equal(hq_qtensor_usage(qt), HQ_BOTH);
  /* full update == fresh quantize */
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y));
  assert_same_storage(qt, fy, HQ_ROWWISE, "update both rowwise");
  assert_same_storage(qt, fy, HQ_COLWISE, "update both columnwise");
  /* rowwise only: the columnwise copy keeps y's bytes and y's scale */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &z));
  assert_same_storage(qt, fz, HQ_ROWWISE, "row refreshed");
  assert_same_storage(qt, fy, HQ_COLWISE, "column stale but intact");
  hq_tensor d1 = hq_test_empty(HQ_F32, 32, 40), d2 = hq_test_empty(HQ_F32, 32, 40);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_COLWISE, &d1));
  HQ_OK_OR_FAIL(hq_dequantize(fy, ctx, HQ_COLWISE, &d2));
  assert_memory_equal(d1.data, d2.data, 32 * 40 * 4);
  /* both again: the directions are made by one call and share the scale again */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  assert_same_storage(qt, fx, HQ_ROWWISE, "back to both rowwise");
  assert_same_storage(qt, fx, HQ_COLWISE, "back to both columnwise");
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_COLWISE)->buf[1].ptr,
                   hq_qtensor_storage(qt, HQ_ROWWISE)->buf[1].ptr);
  /* columnwise only, then drop rowwise: the column survives with its own scale */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_COLWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &z));
  assert_same_storage(qt, fx, HQ_ROWWISE, "row stale");
  assert_same_storage(qt, fz, HQ_COLWISE, "column refreshed");
  HQ_OK_OR_FAIL(hq_qtensor_drop(qt, HQ_ROWWISE));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_COLWISE);
  assert_same_storage(qt, fz, HQ_COLWISE, "column after drop");
  assert_int_equal(hq_dequantize(qt, ctx, HQ_ROWWISE, &d1), HQ_ENOENT);
  HQ_ERROR_HAS("has no rowwise representation");
  /* nothing is ever created by an update */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_COLWISE);
  assert_same_storage(qt, fy, HQ_COLWISE, "column only update");
  /* shape mismatch */
  hq_tensor bad = hq_test_empty(HQ_F32, 40, 32);
  assert_int_equal(hq_qtensor_update(qt, ctx, &bad), HQ_ESHAPE);
  HQ_ERROR_HAS("does not match");
  free(bad.data);
  free(d1.data);
  free(d2.data);
  free(x.data);
  free(y.data);
  free(z.data);
  hq_qtensor_free(qt);
  hq_qtensor_free(fx);
  hq_qtensor_free(fy);
  hq_qtensor_free(fz);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_make_empty_and_save_restore(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:both8");
  hq_tensor x = hq_test_tensor(HQ_F32, 24, 8, 9, 1.0f);
  hq_qtensor *qt = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 24, 8, HQ_BF16, &qt));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_BOTH);
  assert_int_equal(hq_qtensor_nominal_dtype(qt), HQ_BF16);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
  assert_same_storage(qt, ref, HQ_ROWWISE, "make_empty + update");
  assert_same_storage(qt, ref, HQ_COLWISE, "make_empty + update");
  /* save: rowwise data, scale_inv, amax, then columnwise data (the shared scale is not
     listed twice) */
  assert_int_equal(hq_qtensor_saved_count(qt), 4);
  void *saved[8];
  size_t n = 0;
  const void *row_data = hq_qtensor_storage(qt, HQ_ROWWISE)->buf[0].ptr;
  const void *col_data = hq_qtensor_storage(qt, HQ_COLWISE)->buf[0].ptr;
  assert_int_equal(hq_qtensor_save(qt, saved, 2, &n), HQ_EINVAL);
  assert_int_equal(n, 4);
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, saved, 8, &n));
  assert_int_equal(n, 4);
  assert_ptr_equal(saved[0], row_data);
  assert_ptr_equal(saved[3], col_data);
  assert_true(hq_qtensor_is_saved(qt));
  assert_null(hq_qtensor_storage(qt, HQ_ROWWISE)->buf[0].ptr);
  hq_tensor d = hq_test_empty(HQ_F32, 24, 8);
  assert_int_equal(hq_dequantize(qt, ctx, HQ_ROWWISE, &d), HQ_ESTATE);
  assert_int_equal(hq_qtensor_update(qt, ctx, &x), HQ_ESTATE);
  assert_int_equal(hq_qtensor_save(qt, saved, 8, &n), HQ_ESTATE);
  assert_int_equal(hq_qtensor_restore(qt, saved, 3), HQ_EINVAL);
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, saved, 4));
  assert_false(hq_qtensor_is_saved(qt));
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->buf[0].ptr, row_data);
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_COLWISE)->buf[1].ptr,
                   hq_qtensor_storage(qt, HQ_ROWWISE)->buf[1].ptr);
  assert_same_storage(qt, ref, HQ_COLWISE, "after restore");
  assert_int_equal(hq_qtensor_restore(qt, saved, 4), HQ_ESTATE);
  /* a saved tensor may be freed; the caller then owns the buffers */
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, saved, 8, &n));
  hq_qtensor_free(qt);
  for (size_t i = 0; i < n; i++) hq_ctx_free(ctx, saved[i]);
  free(d.data);
  free(x.data);
  hq_qtensor_free(ref);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* A format's own save order is honoured (and checked); shared buffers are never listed. */
static void test_plugin_save_order(void **state) {
  (void)state;
  const char *fx = getenv("HQ_TEST_FIXTURES");
  if (!fx) skip();
  hq_recipe_opts o = {sizeof o, HQ_PLUGINS_NO_DEFAULT, &fx, 1};
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[role *:*:rev]\nrowwise = test_save_rev\n"
                                       "columnwise = test_save_rev\n[role *:*:bad]\n"
                                       "rowwise = test_save_bad\ncolumnwise = identity\n",
                                       "t.ini", &o, &r));
  assert_int_equal(hq_recipe_error_count(r), 0);
  hq_ctx *ctx = host_ctx();
  hq_tensor x = hq_test_tensor(HQ_F32, 2, 3, 1, 1.0f);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:rev");
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  const hq_storage *rs = hq_qtensor_storage(qt, HQ_ROWWISE),
                   *cs = hq_qtensor_storage(qt, HQ_COLWISE);
  void *want[6] = {rs->buf[2].ptr, rs->buf[1].ptr, rs->buf[0].ptr,
                   cs->buf[2].ptr, cs->buf[1].ptr, cs->buf[0].ptr};
  void *got[8];
  size_t n = 0;
  assert_int_equal(hq_qtensor_saved_count(qt), 6);
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, got, 8, &n));
  assert_int_equal(n, 6);
  assert_memory_equal(got, want, sizeof want);
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, got, 6));
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->buf[0].ptr, want[2]);
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_COLWISE)->buf[2].ptr, want[3]);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  /* a save() that loses a buffer is refused and nothing moves */
  q = hq_test_quantizer(r, "a:b:bad");
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  void *first = hq_qtensor_storage(qt, HQ_ROWWISE)->buf[1].ptr;
  assert_int_equal(hq_qtensor_save(qt, got, 8, &n), HQ_EABI);
  HQ_ERROR_HAS("did not hand out exactly the 3 buffers");
  assert_false(hq_qtensor_is_saved(qt));
  assert_ptr_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->buf[1].ptr, first);
  hq_qtensor_free(qt);
  hq_quantizer_free(q);
  free(x.data);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* Quantizers and tensors keep their formats alive after the recipe is freed. */
static void test_lifetimes(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_recipe_free(r);
  hq_tensor x = hq_test_tensor(HQ_F32, 4, 4, 1, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_quantizer_free(q);
  hq_tensor d = hq_test_empty(HQ_F32, 4, 4);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_COLWISE, &d));
  assert_memory_equal(d.data, x.data, 64);
  assert_string_equal(hq_qtensor_format(qt, HQ_ROWWISE), "f8");
  hq_qtensor_free(qt);
  free(x.data);
  free(d.data);
  hq_ctx_destroy(ctx);
}

/* A bring-your-own allocator sees every allocation and every free. */
typedef struct counting { int live, total; } counting;
static void *count_alloc(void *user, int device, size_t bytes, void *stream) {
  (void)device; (void)stream;
  counting *c = user;
  c->live++;
  c->total++;
  return malloc(bytes);
}
static void count_free(void *user, int device, void *ptr, void *stream) {
  (void)device; (void)stream;
  ((counting *)user)->live--;
  free(ptr);
}

static void test_allocator_hooks(void **state) {
  (void)state;
  counting c = {0, 0};
  hq_allocator a = {count_alloc, count_free, &c};
  hq_ctx_desc desc = {0};
  desc.struct_size = sizeof desc;
  desc.device = HQ_DEVICE_HOST;
  desc.allocator = &a;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&desc, &ctx));
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "a:b:derived");
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 8, 1, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  assert_true(c.total >= 4); /* fp8 data/scale/amax, identity data, transient dequantized */
  assert_int_equal(c.live, 4);
  hq_qtensor_free(qt);
  assert_int_equal(c.live, 0);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(x.data);
  hq_ctx_destroy(ctx);
  /* bad descriptors */
  desc.struct_size = 4;
  assert_int_equal(hq_ctx_create(&desc, &ctx), HQ_EINVAL);
  desc.struct_size = sizeof desc;
  hq_allocator half = {count_alloc, NULL, &c};
  desc.allocator = &half;
  assert_int_equal(hq_ctx_create(&desc, &ctx), HQ_EINVAL);
  desc.allocator = NULL;
  desc.device = 1000;
  assert_int_not_equal(hq_ctx_create(&desc, &ctx), HQ_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equal_format_hybrid_every_plugin),
      cmocka_unit_test(test_mixed_formats),
      cmocka_unit_test(test_rowwise_dequantized_source),
      cmocka_unit_test(test_update_usage_and_sharing),
      cmocka_unit_test(test_make_empty_and_save_restore),
      cmocka_unit_test(test_plugin_save_order),
      cmocka_unit_test(test_lifetimes),
      cmocka_unit_test(test_allocator_hooks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
