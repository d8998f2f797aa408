/*
** test_hybrid.c -- the hybrid quantizer and quantized tensors: equal-format hybrids are
** bit-identical to the single-format quantize for every loaded plugin; usage flags decide which
** directions are made and refreshed; mixed formats; the rowwise_dequantized source; update in
** place keeps a skipped direction intact (even when it shared buffers); drop; make_empty;
** save/restore through hq_saved_buffer descriptors (names, directions, dtypes, shapes and bytes
** against hand-written tables for every stock format, an offload round trip through fresh
** blocks, rejected entries that change nothing); snapshots; error paths. Storages are read
** through the public descriptions only (hq_storage_cbuf: the buffer stride is buf_size).
*/
#include <math.h>
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#endif

#include "copy_out.h"
#include "hq_test.h"

static hq_ctx *host_ctx(void) {
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  return ctx;
}

/* Buffer i of direction dir of qt (fails the test when absent). */
static const hq_buffer *qbuf(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  if (!s || i >= s->nbuf) fail_msg("direction %u has no buffer %u", dir, i);
  assert_int_equal(s->buf_size, sizeof(hq_buffer));
  return hq_storage_cbuf(s, i);
}

/* Every buffer of direction dir holds the same bytes in a and b. */
static void assert_same_storage(const hq_qtensor *a, const hq_qtensor *b, uint32_t dir,
                                const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
  if (!sa || !sb) fail_msg("%s: direction %u missing", what, dir);
  assert_int_equal(sa->nbuf, sb->nbuf);
  for (uint32_t i = 0; i < sa->nbuf; i++) {
    const hq_buffer *ba = hq_storage_cbuf(sa, i), *bb = hq_storage_cbuf(sb, i);
    /* a columnwise buffer shared in one tensor and a private copy in the other (after a
       one-direction update) carry the rowwise name and the "columnwise_" one */
    if (strcmp(ba->name, bb->name) != 0) {
      const hq_buffer *pr = strncmp(ba->name, "columnwise_", 11) == 0 ? ba : bb;
      const hq_buffer *sh = pr == ba ? bb : ba;
      assert_int_equal(dir, HQ_COLWISE);
      assert_true(sh->flags & HQ_BUF_SHARED);
      assert_true(strncmp(pr->name, "columnwise_", 11) == 0);
      assert_string_equal(pr->name + 11, sh->name);
    }
    assert_int_equal(ba->bytes, bb->bytes);
    if (!ba->ptr || !bb->ptr) fail_msg("%s: direction %u buffer '%s' has no memory", what, dir,
                                       ba->name);
    if (memcmp(ba->ptr, bb->ptr, ba->bytes) != 0)
      fail_msg("%s: direction %u buffer '%s' differs", what, dir, ba->name);
  }
}

/* Like assert_same_storage, for a columnwise storage `b` made WITHOUT the rowwise one while
   `a`'s was made with it: a buffer `a` shares with its rowwise storage (keeping the rowwise name)
   is `b`'s own, named with the columnwise prefix; the bytes are equal either way. */
static void assert_same_column_alone(const hq_qtensor *a, const hq_qtensor *b, const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, HQ_COLWISE);
  const hq_storage *sb = hq_qtensor_storage(b, HQ_COLWISE);
  if (!sa || !sb) fail_msg("%s: columnwise direction missing", what);
  assert_int_equal(sa->nbuf, sb->nbuf);
  for (uint32_t i = 0; i < sa->nbuf; i++) {
    const hq_buffer *ba = hq_storage_cbuf(sa, i), *bb = hq_storage_cbuf(sb, i);
    char want[64];
    if (ba->flags & HQ_BUF_SHARED) snprintf(want, sizeof want, "columnwise_%s", ba->name);
    else snprintf(want, sizeof want, "%s", ba->name);
    if (strcmp(bb->name, want) != 0)
      fail_msg("%s: columnwise buffer %u made alone is '%s', want '%s'", what, i, bb->name, want);
    assert_int_equal(bb->flags & HQ_BUF_SHARED, 0);
    assert_int_equal(strncmp(bb->name, "columnwise_", 11), 0);
    assert_int_equal(ba->bytes, bb->bytes);
    if (memcmp(ba->ptr, bb->ptr, ba->bytes) != 0)
      fail_msg("%s: columnwise buffer '%s' differs", what, bb->name);
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
  assert_same_storage(fused, row, HQ_ROWWISE, what);
  /* two calls: the columnwise storage is made on its own, in the split tensor too */
  assert_same_column_alone(fused, split, what);
  assert_same_column_alone(fused, col, what);
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
  assert_int_equal(hq_plugins_count(set), 7); /* identity and the six stock formats */
  hq_tensor x = hq_test_tensor(HQ_BF16, 128, 256, 3, 1.0f);
  static const char *extra[][2] = {
      {"fp8_tensor", "dtype = e5m2\npower_2_scales = true"},
      {"mxfp8", "swizzle = true"},
      {"mxfp8", "block_2d = true\ndtype = e5m2"},
      {"nvfp4", "stochastic_rounding = true\nrht = true"},
      {"nvfp4", "block_2d = true\nswizzle = true"},
      {"fp8_block", "block = 2d\npower_2_scales = false"},
      {"identity", "dtype = f16"},
      {"mxfp4", "stochastic_rounding = true\nscale = rceil"},
      {"mxfp6", "elem = e3m2"},
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
  /* all seven plugins are built in this tree */
  assert_int_equal(checked, (int)(sizeof extra / sizeof extra[0]));
  free(x.data);
  hq_plugins_close(set);
}

static const char *MIXED =
    "[format f8]\nplugin = fp8_tensor\n[format hp]\nplugin = identity\ndtype = f32\n"
    "[role *:*:*]\nrowwise = f8\ncolumnwise = hp\n"
    "[role *:*:derived]\nrowwise = f8\ncolumnwise = hp\ncolumnwise_source = rowwise_dequantized\n"
    "[role *:*:both8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role *:*:deq8]\nrowwise = f8\ncolumnwise = f8\ncolumnwise_source = rowwise_dequantized\n";

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
  const hq_buffer *c = qbuf(qt, HQ_COLWISE, 0);
  assert_int_equal(hq_qtensor_storage(qt, HQ_COLWISE)->nbuf, 1);
  assert_int_equal(c->dtype, HQ_F32);
  /* made by its own call (another format): its own buffer, with the columnwise prefix */
  assert_string_equal(c->name, "columnwise_data");
  assert_int_equal(c->flags & HQ_BUF_SHARED, 0);
  assert_memory_equal(c->ptr, x.data, 33 * 65 * 4); /* the original, untouched */
  hq_qtensor_free(qt);
  hq_qtensor_free(ref);
  hq_recipe_free(r8);
  free(x.data);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}


/* One tensor of the hybrid (fp8_tensor rowwise, identity `dtype` columnwise) from x, both
   directions; *qt is made by the first call and updated in place by later ones. */
static void hybrid_pass(hq_recipe *r, hq_ctx *ctx, const hq_tensor *x, hq_qtensor **qt) {
  if (*qt) {
    HQ_OK_OR_FAIL(hq_qtensor_update(*qt, ctx, x));
    return;
  }
  *qt = quantize_with(r, ctx, x, HQ_BOTH);
}

/* ABI 2.6 copy_out: fp8_tensor (HQ_CAP_COPY_OUT) writes the identity columnwise copy of an F32
   source from its own read, and the core makes no identity call (its debug log says so, once
   per quantize and update). The copy holds the hand-checked BF16 / F16 bits of copy_bits and,
   for every element, identity's own bytes; the rowwise codes are fp8_tensor's alone. A BF16
   source, a columnwise-only usage and an F32 copy keep the identity call (no log line) with the
   same bytes. */
static void test_copy_beside(void **state) {
  (void)state;
  const char *dts[2] = {"bf16", "f16"};
  for (int t = 0; t < 2; t++) {
    hq_recipe *rs[3];
    copy_recipes(dts[t], rs);
    hq_recipe *r = rs[0], *rh = rs[1], *r8 = rs[2];
    int logged = 0;
    hq_ctx *ctx = copy_log_ctx(HQ_DEVICE_HOST, &logged);
    hq_qtensor *qt = NULL;
    for (int pass = 0; pass < 2; pass++) {
      hq_tensor x = hq_test_tensor(HQ_F32, 19, 37, 5 + pass, pass ? 30.0f : 2.0f);
      for (size_t k = 0; k < N_COPY_BITS; k++) /* spread over rows and columns */
        memcpy((float *)x.data + k * 41 + pass, &copy_bits[k].f32, 4);
      hybrid_pass(r, ctx, &x, &qt);
      assert_int_equal(logged, pass + 1);
      const hq_buffer *c = qbuf(qt, HQ_COLWISE, 0);
      assert_int_equal(hq_qtensor_storage(qt, HQ_COLWISE)->nbuf, 1);
      assert_int_equal(c->dtype, t ? HQ_F16 : HQ_BF16);
      assert_string_equal(c->name, "columnwise_data");
      for (size_t k = 0; k < N_COPY_BITS; k++) {
        const uint16_t got = ((const uint16_t *)c->ptr)[k * 41 + pass];
        const uint16_t want = t ? copy_bits[k].f16 : copy_bits[k].bf16;
        if (got != want)
          fail_msg("%s copy of 0x%08x: 0x%04x, want 0x%04x", dts[t], copy_bits[k].f32, got, want);
      }
      /* every element as identity alone writes it, the codes as fp8_tensor alone */
      hq_qtensor *hq = quantize_with(rh, ctx, &x, HQ_COLWISE);
      hq_qtensor *f8 = quantize_with(r8, ctx, &x, HQ_ROWWISE);
      assert_int_equal(logged, pass + 1);
      assert_memory_equal(c->ptr, qbuf(hq, HQ_COLWISE, 0)->ptr, c->bytes);
      assert_same_storage(qt, f8, HQ_ROWWISE, "fp8 rowwise beside the copy");
      hq_qtensor_free(hq);
      hq_qtensor_free(f8);
      free(x.data);
    }
    hq_qtensor_free(qt);
    /* the two calls: a BF16 source, a columnwise-only tensor, an F32 copy */
    hq_tensor xb = hq_test_tensor(HQ_BF16, 19, 37, 9, 2.0f);
    hq_qtensor *b = quantize_with(r, ctx, &xb, HQ_BOTH);
    hq_qtensor *hb = quantize_with(rh, ctx, &xb, HQ_COLWISE);
    assert_memory_equal(qbuf(b, HQ_COLWISE, 0)->ptr, qbuf(hb, HQ_COLWISE, 0)->ptr,
                        qbuf(b, HQ_COLWISE, 0)->bytes);
    hq_tensor x = hq_test_tensor(HQ_F32, 19, 37, 10, 2.0f);
    hq_qtensor *col = quantize_with(r, ctx, &x, HQ_COLWISE);
    hq_qtensor *hc = quantize_with(rh, ctx, &x, HQ_COLWISE);
    assert_memory_equal(qbuf(col, HQ_COLWISE, 0)->ptr, qbuf(hc, HQ_COLWISE, 0)->ptr,
                        qbuf(col, HQ_COLWISE, 0)->bytes);
    assert_int_equal(logged, 2);
    hq_qtensor_free(b);
    hq_qtensor_free(hb);
    hq_qtensor_free(col);
    hq_qtensor_free(hc);
    free(xb.data);
    free(x.data);
    hq_ctx_destroy(ctx);
    hq_recipe_free(r);
    hq_recipe_free(rh);
    hq_recipe_free(r8);
  }
  /* identity in f32 (its default for an f32 source) is not a BF16 / F16 copy: two calls */
  int logged = 0;
  hq_ctx *ctx = copy_log_ctx(HQ_DEVICE_HOST, &logged);
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 8, 3, 2.0f);
  hq_qtensor *qt = quantize_with(r, ctx, &x, HQ_BOTH);
  assert_int_equal(logged, 0);
  assert_memory_equal(qbuf(qt, HQ_COLWISE, 0)->ptr, x.data, 8 * 8 * 4);
  hq_qtensor_free(qt);
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
  const float *col = qbuf(qt, HQ_COLWISE, 0)->ptr;
  assert_memory_equal(col, deq.data, 16 * 48 * 4);
  int differs = 0;
  for (int i = 0; i < 16 * 48; i++) differs |= col[i] != ((float *)x.data)[i];
  assert_true(differs); /* it really is the FP8-rounded copy */
  hq_qtensor_free(qt);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_COLWISE));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_COLWISE);
  assert_memory_equal(qbuf(qt, HQ_COLWISE, 0)->ptr, deq.data, 16 * 48 * 4);
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

/* columnwise_source = rowwise_dequantized holds the dequantized rowwise copy in the SOURCE dtype
   (hq.h, docs/recipes.md): for a bf16 input it is rounded to bf16 before the columnwise
   quantize. Rowwise fp8_tensor e4m3 (current scaling, amax 3): scale = RN(448/3) = 0x43155555,
   scale_inv = RN(1/scale) = 0x3BDB6DB7; 1.0 * scale = 149.33 -> e4m3 144, 0.5 -> 72, 2.0 -> 288,
   3.0 -> 448; dequantized RN(q * scale_inv) = 0x1.edb6dcp-1 (0.964285731) times 2^-1, 2^0,
   and 3.0 exactly. The identity f32 columnwise copy stores its source: from an f32 input those
   f32 values; from a bf16 input their bf16 rounding, 0x1.edb6dcp-1 -> 0x1.eep-1 (7 fraction
   bits, the dropped 0.857 ulp rounds up) = 0.96484375, 0.482421875, 1.9296875. */
static void test_rowwise_dequantized_keeps_source_dtype(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:derived");
  static const float in[8] = {3.0f, 1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.0f, -2.0f};
  static const float want_f32[8] = {3.0f, 0x1.edb6dcp-1f, 0x1.edb6dcp-2f, 0x1.edb6dcp+0f,
                                    -0x1.edb6dcp-1f, 0.0f, 0x1.edb6dcp-1f, -0x1.edb6dcp+0f};
  static const float want_bf16[8] = {3.0f, 0.96484375f, 0.482421875f, 1.9296875f,
                                     -0.96484375f, 0.0f, 0.96484375f, -1.9296875f};
  for (int bf = 0; bf < 2; bf++) {
    const hq_dtype dt = bf ? HQ_BF16 : HQ_F32;
    uint32_t raw[8];
    for (int i = 0; i < 8; i++) hq_store_hp(raw, i, dt, in[i]); /* all exact in bf16 */
    hq_tensor x = hq_tensor_2d(raw, dt, HQ_DEVICE_HOST, 2, 4);
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    const hq_buffer *c = qbuf(qt, HQ_COLWISE, 0);
    assert_int_equal(c->dtype, HQ_F32);
    const float *col = c->ptr;
    const float *want = bf ? want_bf16 : want_f32;
    for (int i = 0; i < 8; i++)
      if (col[i] != want[i])
        fail_msg("%s input, element %d: columnwise %a, expected %a", bf ? "bf16" : "f32", i,
                 (double)col[i], (double)want[i]);
    /* the rowwise copy itself is the same for both inputs: its dequantize gives the f32 values */
    hq_tensor deq = hq_test_empty(HQ_F32, 2, 4);
    HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &deq));
    assert_memory_equal(deq.data, want_f32, sizeof want_f32);
    free(deq.data);
    hq_qtensor_free(qt);
  }
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* One format instance for both directions with columnwise_source = rowwise_dequantized is two
   plugin calls (the columnwise one reads the rowwise result), so the quantizer is not fused: the
   columnwise storage shares no buffer with the rowwise one and holds exactly the columnwise
   quantization of the dequantized rowwise values, made alone. */
static void test_one_instance_two_calls(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:deq8");
  hq_quantizer *plain = hq_test_quantizer(r, "linear:weight:both8");
  assert_string_equal(hq_quantizer_format(q, HQ_ROWWISE), "f8");
  assert_string_equal(hq_quantizer_format(q, HQ_COLWISE), "f8");
  assert_false(hq_quantizer_fused(q));
  assert_true(hq_quantizer_fused(plain)); /* the same instance from the original: one call */
  hq_tensor x = hq_test_tensor(HQ_F32, 32, 48, 7, 4.0f);
  hq_qtensor *qt = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  const hq_storage *c = hq_qtensor_storage(qt, HQ_COLWISE);
  assert_non_null(c);
  assert_int_equal(c->nbuf, 3);
  static const char *own[3] = {"columnwise_data", "columnwise_scale_inv", "columnwise_amax"};
  for (uint32_t i = 0; i < 3; i++) {
    assert_string_equal(qbuf(qt, HQ_COLWISE, i)->name, own[i]);
    assert_int_equal(qbuf(qt, HQ_COLWISE, i)->flags & HQ_BUF_SHARED, 0);
    assert_ptr_not_equal(qbuf(qt, HQ_COLWISE, i)->ptr, qbuf(qt, HQ_ROWWISE, i)->ptr);
  }
  hq_tensor deq = hq_test_empty(HQ_F32, 32, 48);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &deq));
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(plain, HQ_COLWISE));
  HQ_OK_OR_FAIL(hq_quantize(plain, ctx, &deq, &ref));
  assert_same_storage(qt, ref, HQ_COLWISE, "columnwise of the dequantized rowwise");
  hq_qtensor_free(ref);
  hq_qtensor_free(qt);
  hq_quantizer_free(plain);
  hq_quantizer_free(q);
  free(deq.data);
  free(x.data);
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
  /* made by one call: the columnwise storage IS the rowwise scale_inv and amax (same memory,
     rowwise names, marked shared); its own data carries the columnwise prefix */
  assert_string_equal(qbuf(qt, HQ_COLWISE, 0)->name, "columnwise_data");
  assert_int_equal(qbuf(qt, HQ_COLWISE, 0)->flags & HQ_BUF_SHARED, 0);
  static const char *shared_names[3] = {NULL, "scale_inv", "amax"};
  for (uint32_t i = 1; i < 3; i++) {
    const hq_buffer *cb = qbuf(qt, HQ_COLWISE, i), *rb = qbuf(qt, HQ_ROWWISE, i);
    assert_string_equal(cb->name, shared_names[i]);
    assert_string_equal(rb->name, shared_names[i]);
    assert_true(cb->flags & HQ_BUF_SHARED);
    assert_int_equal(cb->shared_with, (int)i);
    assert_ptr_equal(cb->ptr, rb->ptr);
  }
  assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE), 32 * 40 + 4 + 4);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 40 * 32); /* shared ones count once */
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
  /* ... because the column got private copies of the shared buffers before the refresh */
  for (uint32_t i = 1; i < 3; i++)
    assert_ptr_not_equal(qbuf(qt, HQ_COLWISE, i)->ptr, qbuf(qt, HQ_ROWWISE, i)->ptr);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 40 * 32 + 4 + 4);
  assert_true(*(const float *)qbuf(qt, HQ_COLWISE, 1)->ptr ==
              *(const float *)qbuf(fy, HQ_ROWWISE, 1)->ptr);
  assert_true(*(const float *)qbuf(qt, HQ_ROWWISE, 1)->ptr ==
              *(const float *)qbuf(fz, HQ_ROWWISE, 1)->ptr);
  assert_true(*(const float *)qbuf(fy, HQ_ROWWISE, 1)->ptr !=
              *(const float *)qbuf(fz, HQ_ROWWISE, 1)->ptr); /* the scales really differ */
  hq_tensor d1 = hq_test_empty(HQ_F32, 32, 40), d2 = hq_test_empty(HQ_F32, 32, 40);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_COLWISE, &d1));
  HQ_OK_OR_FAIL(hq_dequantize(fy, ctx, HQ_COLWISE, &d2));
  assert_memory_equal(d1.data, d2.data, 32 * 40 * 4);
  /* both again: the directions are made by one call and share the scale again */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  assert_same_storage(qt, fx, HQ_ROWWISE, "back to both rowwise");
  assert_same_storage(qt, fx, HQ_COLWISE, "back to both columnwise");
  for (uint32_t i = 1; i < 3; i++)
    assert_ptr_equal(qbuf(qt, HQ_COLWISE, i)->ptr, qbuf(qt, HQ_ROWWISE, i)->ptr);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 40 * 32);
  /* columnwise only, then drop rowwise: the column survives with its own scale */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_COLWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &z));
  assert_same_storage(qt, fx, HQ_ROWWISE, "row stale");
  assert_same_storage(qt, fz, HQ_COLWISE, "column refreshed");
  HQ_OK_OR_FAIL(hq_qtensor_drop(qt, HQ_ROWWISE));
  assert_int_equal(hq_qtensor_dirs(qt), HQ_COLWISE);
  assert_same_storage(qt, fz, HQ_COLWISE, "column after drop");
  assert_null(hq_qtensor_storage(qt, HQ_ROWWISE));
  assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE), 0);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 40 * 32 + 4 + 4); /* owns its scale now */
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

/* A bring-your-own allocator that counts live blocks (save/restore hands memory back and forth
   between the caller and the qtensor: every block must be freed exactly once). */
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

static hq_ctx *counting_ctx(counting *c, hq_allocator *a) {
  a->struct_size = sizeof *a;
  a->alloc = count_alloc;
  a->free = count_free;
  a->user = c;
  hq_ctx_desc desc = {0};
  desc.struct_size = sizeof desc;
  desc.device = HQ_DEVICE_HOST;
  desc.allocator = a;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&desc, &ctx));
  return ctx;
}

/* What a saved entry must say, written by hand from each format's buffer table. */
typedef struct want_buf {
  uint32_t dir;
  const char *name;
  hq_dtype dtype;
  int ndim;
  int64_t d0, d1;
} want_buf;

static size_t want_bytes(const want_buf *w) {
  size_t n = hq_dtype_size(w->dtype) * (size_t)w->d0;
  return w->ndim > 1 ? n * (size_t)w->d1 : n;
}

/* The storage buffer of qt named `name` in direction dir, or NULL. */
static const hq_buffer *find_buf(const hq_qtensor *qt, uint32_t dir, const char *name) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  for (uint32_t i = 0; s && i < s->nbuf; i++)
    if (strcmp(hq_storage_cbuf(s, i)->name, name) == 0) return hq_storage_cbuf(s, i);
  return NULL;
}

/* Every buffer of every present direction of qt has ptr == NULL (saved) or != NULL. */
static void expect_skeleton(const hq_qtensor *qt, int saved) {
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; s && i < s->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(s, i);
      if (saved && b->ptr) fail_msg("saved: direction %u buffer '%s' still has memory", dir,
                                    b->name);
      if (!saved && !b->ptr) fail_msg("direction %u buffer '%s' has no memory", dir, b->name);
    }
  }
  assert_int_equal(hq_qtensor_is_saved(qt), saved);
}

/* Every entry of a saved list matches the hand-written table (and the pointers the storages
   held before the save, `before`). */
static void expect_entries(const hq_saved_buffer *e, size_t n, const want_buf *w, size_t nw,
                           void *const *before, const char *what) {
  if (n != nw) fail_msg("%s: %zu saved entries, want %zu", what, n, nw);
  for (size_t k = 0; k < n; k++) {
    if (e[k].dir != w[k].dir || !e[k].name || strcmp(e[k].name, w[k].name) != 0)
      fail_msg("%s: entry %zu is (%u, %s), want (%u, %s)", what, k, e[k].dir,
               e[k].name ? e[k].name : "NULL", w[k].dir, w[k].name);
    assert_int_equal(e[k].struct_size, sizeof(hq_saved_buffer));
    if (e[k].dtype != w[k].dtype)
      fail_msg("%s: entry %zu '%s' dtype %s, want %s", what, k, w[k].name,
               hq_dtype_name(e[k].dtype), hq_dtype_name(w[k].dtype));
    assert_int_equal(e[k].ndim, w[k].ndim);
    int64_t want_shape[HQ_MAX_BUFFER_DIMS] = {w[k].d0, w[k].ndim > 1 ? w[k].d1 : 0};
    for (int d = 0; d < HQ_MAX_BUFFER_DIMS; d++)
      if (e[k].shape[d] != want_shape[d])
        fail_msg("%s: entry %zu '%s' shape[%d] = %lld, want %lld", what, k, w[k].name, d,
                 (long long)e[k].shape[d], (long long)want_shape[d]);
    if (e[k].bytes != want_bytes(&w[k]))
      fail_msg("%s: entry %zu '%s' has %zu bytes, want %zu", what, k, w[k].name, e[k].bytes,
               want_bytes(&w[k]));
    assert_int_equal(e[k].device, HQ_DEVICE_HOST);
    assert_non_null(e[k].ptr);
    if (before) assert_ptr_equal(e[k].ptr, before[k]);
    for (size_t j = 0; j < k; j++) /* one entry per buffer: no pointer handed out twice */
      assert_ptr_not_equal(e[j].ptr, e[k].ptr);
  }
}

/* Restore rejects `bad` (a corrupted copy of the good list) and changes nothing. */
static void expect_restore_refused(hq_qtensor *qt, const hq_saved_buffer *bad, size_t n,
                                   const char *needle) {
  hq_clear_error();
  assert_int_equal(hq_qtensor_restore(qt, bad, n, sizeof *bad), HQ_EINVAL);
  HQ_ERROR_HAS("hq_qtensor_restore");
  if (needle) HQ_ERROR_HAS(needle);
  expect_skeleton(qt, 1);
}

static const char *SAVE_RECIPE =
    "[format f8]\nplugin = fp8_tensor\n[format hp]\nplugin = identity\ndtype = f32\n"
    "[format nv]\nplugin = nvfp4\n[format mx]\nplugin = mxfp8\n"
    "[format b1]\nplugin = fp8_block\n[format b2]\nplugin = fp8_block\nblock = 2d\n"
    "[role *:*:f8]\nrowwise = f8\ncolumnwise = f8\n"
    "[role *:*:mixed]\nrowwise = f8\ncolumnwise = hp\n"
    "[role *:*:hp]\nrowwise = hp\ncolumnwise = hp\n"
    "[role *:*:nv]\nrowwise = nv\ncolumnwise = nv\n"
    "[role *:*:mx]\nrowwise = mx\ncolumnwise = mx\n"
    "[role *:*:b1]\nrowwise = b1\ncolumnwise = b1\n"
    "[role *:*:b2]\nrowwise = b2\ncolumnwise = b2\n";

typedef struct save_case {
  const char *role;
  uint32_t usage;
  int64_t M, K;
  size_t n;
  want_buf w[6];
} save_case;

#define R HQ_ROWWISE
#define C HQ_COLWISE
static const save_case SAVE_CASES[] = {
    /* fp8_tensor made together: the shared scale_inv / amax travel once, with the rowwise
       storage */
    {"f8", HQ_BOTH, 24, 8, 4,
     {{R, "data", HQ_E4M3, 2, 24, 8}, {R, "scale_inv", HQ_F32, 1, 1, 0},
      {R, "amax", HQ_F32, 1, 1, 0}, {C, "columnwise_data", HQ_E4M3, 2, 8, 24}}},
    {"f8", HQ_ROWWISE, 24, 8, 3,
     {{R, "data", HQ_E4M3, 2, 24, 8}, {R, "scale_inv", HQ_F32, 1, 1, 0},
      {R, "amax", HQ_F32, 1, 1, 0}}},
    /* made alone: its own, prefixed, scale_inv and amax */
    {"f8", HQ_COLWISE, 24, 8, 3,
     {{C, "columnwise_data", HQ_E4M3, 2, 8, 24}, {C, "columnwise_scale_inv", HQ_F32, 1, 1, 0},
      {C, "columnwise_amax", HQ_F32, 1, 1, 0}}},
    /* two formats: FP8 rowwise, the f32 identity columnwise (its own buffer) */
    {"mixed", HQ_BOTH, 33, 65, 4,
     {{R, "data", HQ_E4M3, 2, 33, 65}, {R, "scale_inv", HQ_F32, 1, 1, 0},
      {R, "amax", HQ_F32, 1, 1, 0}, {C, "columnwise_data", HQ_F32, 2, 33, 65}}},
    /* identity in both directions: one buffer serves both */
    {"hp", HQ_BOTH, 5, 7, 1, {{R, "data", HQ_F32, 2, 5, 7}}},
    {"hp", HQ_COLWISE, 5, 7, 1, {{C, "columnwise_data", HQ_F32, 2, 5, 7}}},
    /* nvfp4: packed FP4 [M, K/2] / transposed [K, M/2], E4M3 scales padded to
       [roundup(outer,128), roundup(blocks,4)], an amax per direction */
    {"nv", HQ_BOTH, 64, 48, 6,
     {{R, "data", HQ_E2M1X2, 2, 64, 24}, {R, "scale_inv", HQ_E4M3, 2, 128, 4},
      {R, "amax", HQ_F32, 1, 1, 0}, {C, "columnwise_data", HQ_E2M1X2, 2, 48, 32},
      {C, "columnwise_scale_inv", HQ_E4M3, 2, 128, 4}, {C, "columnwise_amax", HQ_F32, 1, 1, 0}}},
    /* mxfp8: both copies [M, K]; E8M0 scales [roundup(M,128), roundup(K/32,4)] and
       [roundup(M/32,4), roundup(K,128)] */
    {"mx", HQ_BOTH, 64, 96, 4,
     {{R, "data", HQ_E4M3, 2, 64, 96}, {R, "scale_inv", HQ_E8M0, 2, 128, 4},
      {C, "columnwise_data", HQ_E4M3, 2, 64, 96},
      {C, "columnwise_scale_inv", HQ_E8M0, 2, 4, 128}}},
    /* fp8_block 1d on a non-multiple shape: Mb = 2, Kb = 3; scales [Kb, r4(M)] / [Mb, r4(K)] */
    {"b1", HQ_BOTH, 200, 300, 4,
     {{R, "data", HQ_E4M3, 2, 200, 300}, {R, "scale_inv", HQ_F32, 2, 3, 200},
      {C, "columnwise_data", HQ_E4M3, 2, 300, 200},
      {C, "columnwise_scale_inv", HQ_F32, 2, 2, 300}}},
    /* fp8_block 2d: tiles [Mb, r4(Kb)] / [Kb, r4(Mb)] */
    {"b2", HQ_BOTH, 200, 300, 4,
     {{R, "data", HQ_E4M3, 2, 200, 300}, {R, "scale_inv", HQ_F32, 2, 2, 4},
      {C, "columnwise_data", HQ_E4M3, 2, 300, 200},
      {C, "columnwise_scale_inv", HQ_F32, 2, 3, 4}}},
};
#undef R
#undef C

/* Dequantize every present direction of a and b and compare bit for bit. */
static void assert_same_dequantized(const hq_qtensor *a, const hq_qtensor *b, hq_ctx *ctx,
                                    const char *what) {
  const int64_t M = hq_qtensor_rows(a), K = hq_qtensor_cols(a);
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    if (!(hq_qtensor_dirs(a) & dir)) continue;
    hq_tensor da = hq_test_empty(HQ_F32, M, K), db = hq_test_empty(HQ_F32, M, K);
    HQ_OK_OR_FAIL(hq_dequantize(a, ctx, dir, &da));
    HQ_OK_OR_FAIL(hq_dequantize(b, ctx, dir, &db));
    if (memcmp(da.data, db.data, (size_t)(M * K) * 4u) != 0)
      fail_msg("%s: direction %u dequantizes differently", what, dir);
    free(da.data);
    free(db.data);
  }
}

/* For every case: the saved list equals the hand-written table, in order, and holds the
   storages' own pointers; the saved tensor is an empty skeleton that refuses to be used;
   restore refuses a wrong count, name, direction, size, device or a NULL pointer without
   changing anything; an offload round trip (every buffer copied out to host memory, freed, and
   copied back into a fresh hq_ctx_alloc block) restores a tensor bit-identical to a reference
   quantization, which then updates and frees normally (every block freed exactly once). */
static void test_save_restore_descriptors(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(SAVE_RECIPE);
  for (size_t ci = 0; ci < sizeof SAVE_CASES / sizeof SAVE_CASES[0]; ci++) {
    const save_case *sc = &SAVE_CASES[ci];
    char what[96], role[64];
    snprintf(what, sizeof what, "%s usage %u [%lld, %lld]", sc->role, sc->usage,
             (long long)sc->M, (long long)sc->K);
    snprintf(role, sizeof role, "linear:weight:%s", sc->role);
    counting cnt = {0, 0};
    hq_allocator alloc;
    hq_ctx *ctx = counting_ctx(&cnt, &alloc);
    hq_quantizer *q = hq_test_quantizer(r, role);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, sc->usage));
    hq_tensor x = hq_test_tensor(HQ_BF16, sc->M, sc->K, 40 + ci, 2.0f);
    hq_tensor y = hq_test_tensor(HQ_BF16, sc->M, sc->K, 80 + ci, 0.5f);
    hq_qtensor *qt = NULL, *ref = NULL, *fy = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &fy));
    const uint32_t dirs = hq_qtensor_dirs(qt);
    assert_int_equal(dirs, sc->usage);
    assert_int_equal(hq_qtensor_saved_count(qt), sc->n);
    /* the pointers the storages hold now, in table order */
    void *before[6];
    for (size_t k = 0; k < sc->n; k++) {
      const hq_buffer *b = find_buf(qt, sc->w[k].dir, sc->w[k].name);
      if (!b) fail_msg("%s: no %u buffer '%s'", what, sc->w[k].dir, sc->w[k].name);
      before[k] = b->ptr;
    }

    /* too small an array: the count comes back, nothing is saved */
    hq_saved_buffer list[8], bad[8];
    memset(list, 0, sizeof list);
    memset(bad, 0, sizeof bad);
    size_t n = 0;
    assert_int_equal(hq_qtensor_save(qt, list, sc->n - 1, sizeof list[0], &n), HQ_EINVAL);
    assert_int_equal(n, sc->n);
    expect_skeleton(qt, 0);
    assert_int_equal(hq_qtensor_save(qt, list, 8, HQ_SAVED_BUFFER_SIZE_0_2 - 1, &n), HQ_EINVAL);
    expect_skeleton(qt, 0);

    /* a padded element (a newer caller's bigger struct): the stride is honoured and the bytes
       beyond the struct this core knows are left alone */
    struct { hq_saved_buffer e; unsigned char pad[24]; } wide[8];
    memset(wide, 0x5a, sizeof wide);
    HQ_OK_OR_FAIL(hq_qtensor_save(qt, &wide[0].e, 8, sizeof wide[0], &n));
    assert_int_equal(n, sc->n);
    for (size_t k = 0; k < n; k++) {
      list[k] = wide[k].e;
      for (size_t j = 0; j < sizeof wide[k].pad; j++) assert_int_equal(wide[k].pad[j], 0x5a);
    }
    expect_entries(list, n, sc->w, sc->n, before, what);
    expect_skeleton(qt, 1);
    /* the skeleton keeps its descriptions and refuses to be used */
    assert_int_equal(hq_qtensor_dirs(qt), dirs);
    assert_int_equal(hq_qtensor_saved_count(qt), sc->n);
    for (size_t k = 0; k < sc->n; k++)
      assert_non_null(find_buf(qt, sc->w[k].dir, sc->w[k].name));
    hq_tensor d = hq_test_empty(HQ_F32, sc->M, sc->K);
    uint32_t some = dirs & HQ_ROWWISE ? HQ_ROWWISE : HQ_COLWISE;
    assert_int_equal(hq_dequantize(qt, ctx, some, &d), HQ_ESTATE);
    assert_int_equal(hq_qtensor_update(qt, ctx, &x), HQ_ESTATE);
    assert_int_equal(hq_qtensor_drop(qt, some), HQ_ESTATE);
    assert_int_equal(hq_qtensor_save(qt, bad, 8, sizeof bad[0], &n), HQ_ESTATE);
    HQ_ERROR_HAS("already saved");
    expect_skeleton(qt, 1);

    /* restore refuses, and changes nothing: a wrong count, then one bad entry (first, then
       last: nothing before it may have been taken) */
    expect_restore_refused(qt, list, sc->n - 1, "given back");
    for (int at = 0; at < 2; at++) {
      size_t k = at ? sc->n - 1 : 0;
      memcpy(bad, list, sizeof list);
      bad[k].name = "bogus";
      expect_restore_refused(qt, bad, sc->n, "bogus");
      memcpy(bad, list, sizeof list);
      bad[k].name = NULL;
      expect_restore_refused(qt, bad, sc->n, NULL);
      memcpy(bad, list, sizeof list);
      bad[k].bytes += 1;
      expect_restore_refused(qt, bad, sc->n, list[k].name);
      memcpy(bad, list, sizeof list);
      bad[k].bytes -= 1;
      expect_restore_refused(qt, bad, sc->n, list[k].name);
      memcpy(bad, list, sizeof list);
      bad[k].ptr = NULL;
      expect_restore_refused(qt, bad, sc->n, "NULL pointer");
      memcpy(bad, list, sizeof list);
      bad[k].dir = bad[k].dir == HQ_ROWWISE ? HQ_COLWISE : HQ_ROWWISE;
      expect_restore_refused(qt, bad, sc->n, list[k].name);
      memcpy(bad, list, sizeof list);
      bad[k].device = 0;
      expect_restore_refused(qt, bad, sc->n, list[k].name);
    }
    if (sc->n > 1) { /* two entries swapped: each is in the wrong place */
      memcpy(bad, list, sizeof list);
      bad[0] = list[1];
      bad[1] = list[0];
      expect_restore_refused(qt, bad, sc->n, NULL);
    }
    assert_int_equal(hq_qtensor_restore(qt, list, sc->n, HQ_SAVED_BUFFER_SIZE_0_2 - 1),
                     HQ_EINVAL);
    expect_skeleton(qt, 1);

    /* offload: out to host memory, the device block freed, back into a fresh block */
    void *fresh[8];
    for (size_t k = 0; k < n; k++) {
      void *host = malloc(list[k].bytes);
      assert_non_null(host);
      HQ_OK_OR_FAIL(hq_ctx_memcpy(ctx, host, HQ_DEVICE_HOST, list[k].ptr, list[k].device,
                                  list[k].bytes));
      HQ_OK_OR_FAIL(hq_ctx_alloc(ctx, list[k].bytes, &fresh[k]));
      assert_ptr_not_equal(fresh[k], list[k].ptr); /* both live: a different block */
      HQ_OK_OR_FAIL(hq_ctx_memcpy(ctx, fresh[k], list[k].device, host, HQ_DEVICE_HOST,
                                  list[k].bytes));
      memset(list[k].ptr, 0xa5, list[k].bytes); /* poison the old block, then free it */
      hq_ctx_free(ctx, list[k].ptr);
      list[k].ptr = fresh[k];
      free(host);
    }
    HQ_OK_OR_FAIL(hq_qtensor_restore(qt, list, n, sizeof list[0]));
    expect_skeleton(qt, 0);
    for (size_t k = 0; k < n; k++)
      assert_ptr_equal(find_buf(qt, sc->w[k].dir, sc->w[k].name)->ptr, fresh[k]);
    /* a columnwise buffer shared with the rowwise storage points at the restored rowwise one */
    const hq_storage *cs = hq_qtensor_storage(qt, HQ_COLWISE);
    int shared = 0;
    for (uint32_t i = 0; cs && (dirs & HQ_ROWWISE) && i < cs->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(cs, i);
      if (!(b->flags & HQ_BUF_SHARED)) continue;
      shared++;
      assert_ptr_equal(b->ptr, qbuf(qt, HQ_ROWWISE, (uint32_t)b->shared_with)->ptr);
    }
    if (strcmp(sc->role, "f8") == 0 && sc->usage == HQ_BOTH) assert_int_equal(shared, 2);
    if (strcmp(sc->role, "hp") == 0 && sc->usage == HQ_BOTH) assert_int_equal(shared, 1);
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
      if (dirs & dir) assert_same_storage(qt, ref, dir, what);
    assert_same_dequantized(qt, ref, ctx, what);
    assert_int_equal(hq_qtensor_restore(qt, list, n, sizeof list[0]), HQ_ESTATE);
    /* the restored tensor is whole again: it updates in place like a fresh one */
    HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y));
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
      if (dirs & dir) assert_same_storage(qt, fy, dir, what);
    for (size_t k = 0; k < n; k++) /* in the restored blocks */
      assert_ptr_equal(find_buf(qt, sc->w[k].dir, sc->w[k].name)->ptr, fresh[k]);

    /* a saved tensor may be freed: the caller then owns (and frees) the buffers */
    HQ_OK_OR_FAIL(hq_qtensor_save(qt, list, 8, sizeof list[0], &n));
    expect_entries(list, n, sc->w, sc->n, fresh, what);
    hq_qtensor_free(qt);
    for (size_t k = 0; k < n; k++) hq_ctx_free(ctx, list[k].ptr);
    hq_qtensor_free(ref);
    hq_qtensor_free(fy);
    assert_int_equal(cnt.live, 0); /* every block freed, once */
    free(d.data);
    free(x.data);
    free(y.data);
    hq_quantizer_free(q);
    hq_ctx_destroy(ctx);
  }
  hq_recipe_free(r);
}

/* make_empty + update == quantize; a saved list of a make_empty tensor is the same list. */
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
  assert_int_equal(hq_qtensor_storage(qt, HQ_ROWWISE)->nominal, HQ_BF16);
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
  assert_same_storage(qt, ref, HQ_ROWWISE, "make_empty + update");
  assert_same_storage(qt, ref, HQ_COLWISE, "make_empty + update");
  /* save: rowwise data, scale_inv, amax, then columnwise data (the shared scale is not
     listed twice) */
  static const want_buf want[4] = {{HQ_ROWWISE, "data", HQ_E4M3, 2, 24, 8},
                                   {HQ_ROWWISE, "scale_inv", HQ_F32, 1, 1, 0},
                                   {HQ_ROWWISE, "amax", HQ_F32, 1, 1, 0},
                                   {HQ_COLWISE, "columnwise_data", HQ_E4M3, 2, 8, 24}};
  assert_int_equal(hq_qtensor_saved_count(qt), 4);
  hq_saved_buffer saved[8];
  size_t n = 0;
  void *before[4] = {qbuf(qt, HQ_ROWWISE, 0)->ptr, qbuf(qt, HQ_ROWWISE, 1)->ptr,
                     qbuf(qt, HQ_ROWWISE, 2)->ptr, qbuf(qt, HQ_COLWISE, 0)->ptr};
  assert_int_equal(hq_qtensor_save(qt, saved, 2, sizeof saved[0], &n), HQ_EINVAL);
  assert_int_equal(n, 4);
  assert_int_equal(hq_qtensor_save(qt, NULL, 0, sizeof saved[0], &n), HQ_EINVAL);
  assert_int_equal(n, 4);
  assert_false(hq_qtensor_is_saved(qt));
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, saved, 8, sizeof saved[0], &n));
  expect_entries(saved, n, want, 4, before, "make_empty");
  /* the scale really is the amax rule's: scale_inv = amax / 448 rounded through 1/scale */
  const float amax = *(const float *)saved[2].ptr, sinv = *(const float *)saved[1].ptr;
  float m = 0;
  for (int i = 0; i < 24 * 8; i++) m = fmaxf(m, fabsf(((const float *)x.data)[i]));
  assert_true(amax == m);
  assert_true(sinv == 1.0f / (448.0f / m));
  expect_skeleton(qt, 1);
  hq_tensor d = hq_test_empty(HQ_F32, 24, 8);
  assert_int_equal(hq_dequantize(qt, ctx, HQ_ROWWISE, &d), HQ_ESTATE);
  HQ_ERROR_HAS("is saved");
  assert_int_equal(hq_qtensor_update(qt, ctx, &x), HQ_ESTATE);
  assert_int_equal(hq_qtensor_save(qt, saved, 8, sizeof saved[0], &n), HQ_ESTATE);
  assert_int_equal(hq_qtensor_restore(qt, saved, 3, sizeof saved[0]), HQ_EINVAL);
  assert_int_equal(hq_qtensor_restore(NULL, saved, 4, sizeof saved[0]), HQ_EINVAL);
  assert_int_equal(hq_qtensor_restore(qt, NULL, 4, sizeof saved[0]), HQ_EINVAL);
  expect_skeleton(qt, 1);
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, saved, 4, sizeof saved[0]));
  assert_false(hq_qtensor_is_saved(qt));
  assert_ptr_equal(qbuf(qt, HQ_ROWWISE, 0)->ptr, before[0]);
  assert_ptr_equal(qbuf(qt, HQ_COLWISE, 0)->ptr, before[3]);
  assert_ptr_equal(qbuf(qt, HQ_COLWISE, 1)->ptr, qbuf(qt, HQ_ROWWISE, 1)->ptr);
  assert_ptr_equal(qbuf(qt, HQ_COLWISE, 2)->ptr, qbuf(qt, HQ_ROWWISE, 2)->ptr);
  assert_same_storage(qt, ref, HQ_ROWWISE, "after restore");
  assert_same_storage(qt, ref, HQ_COLWISE, "after restore");
  assert_int_equal(hq_qtensor_restore(qt, saved, 4, sizeof saved[0]), HQ_ESTATE);
  /* a saved tensor may be freed; the caller then owns the buffers */
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, saved, 8, sizeof saved[0], &n));
  hq_qtensor_free(qt);
  for (size_t i = 0; i < n; i++) hq_ctx_free(ctx, saved[i].ptr);
  free(d.data);
  free(x.data);
  hq_qtensor_free(ref);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* Saving a tensor whose directions were refreshed apart (the columnwise storage then holds
   private copies of the formerly shared buffers): every buffer travels once, each (direction,
   name) pair is unique, and the round trip restores both directions with their own scales. */
static void test_save_after_unshare(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe(MIXED);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:both8");
  hq_tensor x = hq_test_tensor(HQ_F32, 16, 24, 1, 1.0f);
  hq_tensor y = hq_test_tensor(HQ_F32, 16, 24, 2, 7.0f);
  hq_qtensor *qt = NULL, *fx = NULL, *fy = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &fx));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &fy));
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_ROWWISE));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y)); /* row: y; column: x, with x's scale */
  assert_int_equal(hq_qtensor_saved_count(qt), 6);
  hq_saved_buffer list[8];
  size_t n = 0;
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, list, 8, sizeof list[0], &n));
  assert_int_equal(n, 6);
  /* the private copies are the columnwise storage's own buffers now: names stay unique */
  static const char *names[6] = {"data",            "scale_inv",            "amax",
                                 "columnwise_data", "columnwise_scale_inv", "columnwise_amax"};
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(list[k].dir, k < 3 ? HQ_ROWWISE : HQ_COLWISE);
    assert_string_equal(list[k].name, names[k]);
    for (size_t j = 0; j < k; j++) {
      assert_ptr_not_equal(list[j].ptr, list[k].ptr);
      assert_string_not_equal(list[j].name, list[k].name);
    }
  }
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, list, n, sizeof list[0]));
  assert_same_storage(qt, fy, HQ_ROWWISE, "row after unshared round trip");
  assert_same_storage(qt, fx, HQ_COLWISE, "column after unshared round trip");
  for (uint32_t i = 1; i < 3; i++)
    assert_ptr_not_equal(qbuf(qt, HQ_COLWISE, i)->ptr, qbuf(qt, HQ_ROWWISE, i)->ptr);
  /* refreshing both again shares the scale once more */
  HQ_OK_OR_FAIL(hq_qtensor_set_usage(qt, HQ_BOTH));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &y));
  assert_same_storage(qt, fy, HQ_COLWISE, "both refreshed");
  assert_ptr_equal(qbuf(qt, HQ_COLWISE, 1)->ptr, qbuf(qt, HQ_ROWWISE, 1)->ptr);
  assert_string_equal(qbuf(qt, HQ_COLWISE, 1)->name, "scale_inv"); /* shared again */
  assert_int_equal(hq_qtensor_saved_count(qt), 4);
  hq_qtensor_free(qt);
  hq_qtensor_free(fx);
  hq_qtensor_free(fy);
  free(x.data);
  free(y.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* A format's buffer order is the save order, rowwise storage first (the fixture module
   test_good: "data", "aux" / "columnwise_data", "columnwise_aux", none shared). */
static void test_plugin_save_order(void **state) {
  (void)state;
  const char *fx = getenv("HQ_TEST_FIXTURES");
  if (!fx) skip();
  hq_recipe_opts o = {.struct_size = sizeof o,
                      .plugin_flags = HQ_PLUGINS_NO_DEFAULT,
                      .extra_dirs = &fx,
                      .n_extra_dirs = 1};
  hq_recipe *r = NULL;
  HQ_OK_OR_FAIL(hq_recipe_parse_string("[role *:*:both]\nrowwise = test_good\n"
                                       "columnwise = test_good\n[role *:*:mixed]\n"
                                       "rowwise = test_good\ncolumnwise = identity\n",
                                       "t.ini", &o, &r));
  assert_int_equal(hq_recipe_error_count(r), 0);
  hq_ctx *ctx = host_ctx();
  hq_tensor x = hq_test_tensor(HQ_F32, 2, 3, 1, 1.0f);
  static const want_buf both[4] = {{HQ_ROWWISE, "data", HQ_F32, 2, 2, 3},
                                   {HQ_ROWWISE, "aux", HQ_U8, 1, 2, 0},
                                   {HQ_COLWISE, "columnwise_data", HQ_F32, 2, 2, 3},
                                   {HQ_COLWISE, "columnwise_aux", HQ_U8, 1, 2, 0}};
  static const want_buf mixed[3] = {{HQ_ROWWISE, "data", HQ_F32, 2, 2, 3},
                                    {HQ_ROWWISE, "aux", HQ_U8, 1, 2, 0},
                                    {HQ_COLWISE, "columnwise_data", HQ_F32, 2, 2, 3}};
  struct { const char *role; uint32_t usage; const want_buf *w; size_t n; } cases[] = {
      {"a:b:both", HQ_BOTH, both, 4},
      {"a:b:both", HQ_COLWISE, both + 2, 2},
      {"a:b:both", HQ_ROWWISE, both, 2},
      {"a:b:mixed", HQ_BOTH, mixed, 3},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hq_quantizer *q = hq_test_quantizer(r, cases[c].role);
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, cases[c].usage));
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    void *before[4];
    for (size_t k = 0; k < cases[c].n; k++)
      before[k] = find_buf(qt, cases[c].w[k].dir, cases[c].w[k].name)->ptr;
    hq_saved_buffer got[8];
    size_t n = 0;
    assert_int_equal(hq_qtensor_saved_count(qt), cases[c].n);
    HQ_OK_OR_FAIL(hq_qtensor_save(qt, got, 8, sizeof got[0], &n));
    expect_entries(got, n, cases[c].w, cases[c].n, before, cases[c].role);
    for (size_t k = 0; k < n; k++) {
      if (strstr(got[k].name, "aux")) { /* the fixture writes {1, 2 + direction index} */
        const uint8_t *aux = got[k].ptr;
        assert_int_equal(aux[0], 1);
        assert_int_equal(aux[1], got[k].dir == HQ_ROWWISE ? 2 : 3);
      } else {
        assert_memory_equal(got[k].ptr, x.data, 2 * 3 * 4);
      }
    }
    HQ_OK_OR_FAIL(hq_qtensor_restore(qt, got, n, sizeof got[0]));
    for (size_t k = 0; k < n; k++)
      assert_ptr_equal(find_buf(qt, cases[c].w[k].dir, cases[c].w[k].name)->ptr, before[k]);
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
  }
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

static void test_allocator_hooks(void **state) {
  (void)state;
  counting c = {0, 0};
  hq_allocator a = {.struct_size = sizeof a, .alloc = count_alloc, .free = count_free, .user = &c};
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
  assert_int_equal(c.total, 5); /* fp8 data/scale/amax, identity data, transient dequantized */
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
  hq_allocator half = {.struct_size = sizeof half, .alloc = count_alloc, .free = NULL, .user = &c};
  desc.allocator = &half;
  assert_int_equal(hq_ctx_create(&desc, &ctx), HQ_EINVAL);
  desc.allocator = NULL;
  desc.device = 1000;
  if (hq_built_with_cuda()) {
    assert_int_equal(hq_ctx_create(&desc, &ctx), HQ_EINVAL);
    HQ_ERROR_HAS("CUDA device 1000 does not exist");
  } else {
    assert_int_equal(hq_ctx_create(&desc, &ctx), HQ_ENOTSUP);
    HQ_ERROR_HAS("built without CUDA");
  }
}

/* Everything hq computes on the host gives the same bytes when the caller's CPU flushes
   subnormals (x86 MXCSR FTZ and DAZ, as a process linked with -ffast-math runs) or rounds
   another way (fesetround; x86 only): every
   stock format's quantize of an FP32 input full of subnormals (whole blocks of them, and
   blocks mixing them with normal values) and its dequantize, the identity format's F16
   conversion, a CPU GEMM whose products are subnormal, and AdamW with subnormal gradients; and
   the caller's mode is left as it was. */
typedef struct flush_run {
  uint8_t *bytes; /* every buffer of both directions, then both dequantized copies, D, AdamW */
  size_t n;
} flush_run;

/* The inputs, made once with the CPU in IEEE mode (made under FTZ they would be flushed). */
typedef struct flush_in {
  hq_tensor x, a, b, g;
  float w[64], m[64], v[64];
} flush_in;

static void flush_append(flush_run *r, const void *p, size_t n) {
  r->bytes = realloc(r->bytes, r->n + n);
  assert_non_null(r->bytes);
  memcpy(r->bytes + r->n, p, n);
  r->n += n;
}

static void flush_inputs(flush_in *in) {
  const int64_t M = 64, K = 128;
  in->x = hq_test_empty(HQ_F32, M, K);
  uint64_t seed = 5;
  for (int64_t i = 0; i < M * K; i++) {
    const int64_t row = i / K;
    const float u = hq_test_uniform(&seed);
    /* rows 0-15 all subnormal, rows 16-31 subnormal beside one normal value per 16, the rest
       normal values down to 2^-120 */
    ((float *)in->x.data)[i] = row < 16   ? u * 0x1p-127f
                               : row < 32 ? (i % 16 ? u * 0x1p-130f : u * 0x1p-100f)
                                          : ldexpf(u, -(int)(i % 120));
  }
  /* a GEMM of values 2^-70 * u (every product subnormal); AdamW's gradients and moments
     subnormal */
  in->a = hq_test_empty(HQ_F32, 16, 32);
  in->b = hq_test_empty(HQ_F32, 8, 32);
  for (int i = 0; i < 16 * 32; i++) ((float *)in->a.data)[i] = hq_test_uniform(&seed) * 0x1p-70f;
  for (int i = 0; i < 8 * 32; i++) ((float *)in->b.data)[i] = hq_test_uniform(&seed) * 0x1p-70f;
  in->g = hq_test_empty(HQ_F32, 1, 64);
  for (int i = 0; i < 64; i++) {
    ((float *)in->g.data)[i] = hq_test_uniform(&seed) * 0x1p-130f;
    in->w[i] = 1.0f + (float)i, in->m[i] = 0x1p-128f, in->v[i] = 0x1p-140f;
  }
}

/* hq's computations only (no FP arithmetic of the test's own): their bytes appended to r */
static void flush_compute(hq_recipe *rec, const char *const *roles, size_t nroles,
                          const flush_in *in, flush_run *r) {
  hq_ctx *ctx = host_ctx();
  const int64_t M = in->x.rows, K = in->x.cols;
  for (size_t k = 0; k < nroles; k++) {
    hq_quantizer *q = hq_test_quantizer(rec, roles[k]);
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &in->x, &qt));
    for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
      const hq_storage *st = hq_qtensor_storage(qt, d);
      for (uint32_t b = 0; st && b < st->nbuf; b++)
        flush_append(r, hq_storage_cbuf(st, b)->ptr, hq_storage_cbuf(st, b)->bytes);
      hq_tensor y = hq_test_empty(HQ_F32, M, K);
      HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, d, &y));
      flush_append(r, y.data, (size_t)(M * K) * 4);
      free(y.data);
    }
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
  }
  hq_tensor dd = hq_test_empty(HQ_F32, 8, 16);
  HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_hp(&in->a), 1, hq_operand_hp(&in->b), 0, &dd, 1.0f, 0.0f,
                        NULL, NULL));
  flush_append(r, dd.data, 8 * 16 * 4);
  free(dd.data);
  float w[64], m[64], v[64];
  memcpy(w, in->w, sizeof w);
  memcpy(m, in->m, sizeof m);
  memcpy(v, in->v, sizeof v);
  hq_adam ad = {sizeof ad, 1e-3f, 0.9f, 0.999f, 0x1p-130f, 0.0f, 3, NULL, NULL, 0};
  HQ_OK_OR_FAIL(hq_adam_step(ctx, &ad, &in->g, w, m, v, NULL));
  flush_append(r, w, sizeof w);
  flush_append(r, m, sizeof m);
  flush_append(r, v, sizeof v);
  hq_ctx_destroy(ctx);
}

static void test_host_flush_mode(void **state) {
  (void)state;
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
  hq_recipe *rec = hq_test_recipe(
      "[format f8]\nplugin = fp8_tensor\n[format mx]\nplugin = mxfp8\n"
      "[format nv]\nplugin = nvfp4\n[format nvs]\nplugin = nvfp4\nstochastic_rounding = true\n"
      "[format nvr]\nplugin = nvfp4\nrht = true\n[format fb]\nplugin = fp8_block\n"
      "[format fb2]\nplugin = fp8_block\nblock = 2d\npower_2_scales = false\n"
      "[format h16]\nplugin = identity\ndtype = f16\n"
      "[role *:*:f8]\nrowwise = f8\ncolumnwise = f8\n"
      "[role *:*:mx]\nrowwise = mx\ncolumnwise = mx\n"
      "[role *:*:nv]\nrowwise = nv\ncolumnwise = nvr\n"
      "[role *:*:nvs]\nrowwise = nvs\ncolumnwise = nvs\n"
      "[role *:*:fb]\nrowwise = fb\ncolumnwise = fb2\n"
      "[role *:*:h16]\nrowwise = h16\ncolumnwise = h16\n");
  static const char *const roles[] = {"a:b:f8", "a:b:mx",  "a:b:nv",
                                      "a:b:nvs", "a:b:fb", "a:b:h16"};
  const size_t nroles = sizeof roles / sizeof roles[0];
  flush_in in;
  flush_inputs(&in);
  flush_run ieee = {NULL, 0};
  flush_compute(rec, roles, nroles, &in, &ieee);
  /* the caller's modes: FTZ and DAZ; rounding toward zero; upward with FTZ */
  static const unsigned modes[3] = {0x8040u, 0x6000u, 0x4000u | 0x8000u};
  for (int md = 0; md < 3; md++) {
    flush_run other = {NULL, 0};
    const unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0xe040u) | modes[md]);
    flush_compute(rec, roles, nroles, &in, &other);
    const unsigned after = _mm_getcsr();
    _mm_setcsr(csr);
    assert_int_equal(after & 0xe040u, modes[md]); /* the caller's mode left as it was */
    assert_int_equal(other.n, ieee.n);
    for (size_t i = 0; i < ieee.n; i++)
      if (other.bytes[i] != ieee.bytes[i])
        fail_msg("with MXCSR mode 0x%04x set by the caller, byte %zu of %zu differs: %02x, IEEE "
                 "%02x", modes[md], i, ieee.n, other.bytes[i], ieee.bytes[i]);
    free(other.bytes);
  }
  free(ieee.bytes);
  free(in.x.data);
  free(in.a.data);
  free(in.b.data);
  free(in.g.data);
  hq_recipe_free(rec);
#else
  skip();
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equal_format_hybrid_every_plugin),
      cmocka_unit_test(test_mixed_formats),
      cmocka_unit_test(test_copy_beside),
      cmocka_unit_test(test_rowwise_dequantized_source),
      cmocka_unit_test(test_rowwise_dequantized_keeps_source_dtype),
      cmocka_unit_test(test_one_instance_two_calls),
      cmocka_unit_test(test_update_usage_and_sharing),
      cmocka_unit_test(test_make_empty_and_save_restore),
      cmocka_unit_test(test_save_restore_descriptors),
      cmocka_unit_test(test_save_after_unshare),
      cmocka_unit_test(test_plugin_save_order),
      cmocka_unit_test(test_host_flush_mode),
      cmocka_unit_test(test_lifetimes),
      cmocka_unit_test(test_allocator_hooks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
