/*
** test_forms.c -- buffer forms (plugin ABI 2.4): a buffer a format moves itself for an FSDP gather
** and for save/restore, with the fixture modules of tests/plugins/forms/ (forms.c says what each
** is). Checked:
**   - the loader rejects a malformed op set, naming it: fsdp_assign without fsdp_extract, save
**     without restore, the ops without buffer_form, buffer_form alone;
**   - FSDP: the core calls the module's fsdp_extract once per storage and shard and lists its
**     form in the buffer's place (rows along M by m_div 2, the tags in natural row order,
**     computed here from the input), gathers the other buffer by its rule, and fsdp_assign
**     rebuilds the full tensor's buffer: equal, byte for byte, to the whole tensor quantized --
**     every byte written (the full tensor is filled with garbage first);
**   - a table whose struct_size does not reach the ops (ABI 2.1's) has none: the core refuses the
**     never-gathered buffer as without forms and calls nothing;
**   - save hands out the save form (u8 [M] instead of u8 [M + 16], natural order), restore takes
**     it back from other memory and rebuilds the buffer: the same bytes; an entry of the buffer's
**     size instead of the form's is refused naming the buffer; the short table saves as it is;
**   - a module's faults: an invalid FSDP form or save form is HQ_EABI before any op runs or
**     anything changes; a failing fsdp_extract or restore reaches the caller with its status,
**     its message and the buffer named, the tensor left as it was (still saved, entries the
**     caller's).
*/
#include "hq_test.h"

static const char *forms_dir(void) {
  const char *d = getenv("HQ_TEST_FORMS");
  return d ? d : "tests/plugins/forms/.libs";
}

/* A recipe whose role linear:weight:* uses module `plugin` for both directions, option bug. */
static hq_recipe *forms_recipe(const char *plugin, int bug) {
  char text[256];
  snprintf(text, sizeof text, "[format f]\nplugin = %s\nbug = %d\n[role linear:weight:*]\n"
           "rowwise = f\ncolumnwise = f\n", plugin, bug);
  const char *dirs[] = {forms_dir()};
  return hq_test_recipe_dirs(text, dirs, 1);
}

/* The context's log: how many lines the fixture's ops wrote, per op. */
typedef struct oplog {
  int extract, assign, save, restore;
} oplog;
static void log_ops(void *user, int level, const char *msg) {
  oplog *l = user;
  (void)level;
  l->extract += strstr(msg, "test_forms: fsdp_extract ") != NULL;
  l->assign += strstr(msg, "test_forms: fsdp_assign ") != NULL;
  l->save += strstr(msg, "test_forms: save ") != NULL;
  l->restore += strstr(msg, "test_forms: restore ") != NULL;
}
static hq_ctx *logged_ctx(oplog *l) { return hq_test_log_ctx(HQ_DEVICE_HOST, log_ops, l); }

/* The fixture's tag of row i of x (forms.c): the xor of the four bytes of x[i][0]'s bits. */
static uint8_t tag_of(const hq_tensor *x, int64_t i) {
  uint32_t b;
  memcpy(&b, (const float *)x->data + i * x->cols, 4);
  return (uint8_t)(b ^ (b >> 8) ^ (b >> 16) ^ (b >> 24));
}

static hq_tensor rows_of(const hq_tensor *x, int64_t r0, int64_t n) {
  return hq_tensor_2d((float *)x->data + r0 * x->cols, HQ_F32, HQ_DEVICE_HOST, n, x->cols);
}

// --- the loader -----------------------------------------------------------------------------------

/* The reason module `base` was rejected for; fails the test when it was not. */
static const char *rejected(const hq_plugins *set, const char *base) {
  const char *r = hq_test_reason(set, base);
  if (!r) fail_msg("%s was not rejected", base);
  return r;
}

static void test_loader(void **state) {
  (void)state;
  const char *dirs[] = {forms_dir()};
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_ENV | HQ_PLUGINS_NO_DEFAULT, &set));
  /* identity, forms.so, forms_short.so */
  assert_int_equal(hq_plugins_count(set), 3);
  assert_non_null(hq_plugins_find(set, "test_forms"));
  assert_non_null(hq_plugins_find(set, "test_forms_short"));
  assert_int_equal(hq_plugins_rejected_count(set), 4);
  assert_string_equal(rejected(set, "forms_half_fsdp.so"),
                      "format 'test_forms_half_fsdp' has fsdp_assign but no fsdp_extract "
                      "operation (a buffer moved by the format needs both)");
  assert_string_equal(rejected(set, "forms_half_save.so"),
                      "format 'test_forms_half_save' has save but no restore operation (a buffer "
                      "moved by the format needs both)");
  assert_string_equal(rejected(set, "forms_undescribed.so"),
                      "format 'test_forms_undescribed' has fsdp_extract but no buffer_form "
                      "operation (it describes the forms those operations write)");
  assert_string_equal(rejected(set, "forms_unused.so"),
                      "format 'test_forms_unused' has buffer_form but neither "
                      "fsdp_extract/fsdp_assign nor save/restore (nothing would use its forms)");
  hq_plugins_close(set);
}

// --- FSDP -----------------------------------------------------------------------------------------

#define WORLD 4
#define NE (2 * HQ_MAX_BUFFERS)

/* world shards of ms rows through the protocol, against the whole tensor quantized. */
static void gather_case(int world, int64_t ms) {
  const int64_t M = world * ms, K = 12;
  oplog l = {0};
  hq_ctx *ctx = logged_ctx(&l);
  hq_recipe *r = forms_recipe("test_forms", 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_F32, M, K, 11 + (uint64_t)world, 1.0f);
  hq_qtensor *shard[WORLD];
  hq_fsdp_buffer ext[WORLD][NE];
  size_t n[WORLD];
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(&x, s * ms, ms);
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &xs, &shard[s]));
    HQ_OK_OR_FAIL(hq_fsdp_extract(shard[s], ctx, ext[s], NE, sizeof(hq_fsdp_buffer), &n[s]));
    /* data and tag of each direction, the tag as the module's form: ms/2 rows of 2 bytes */
    assert_int_equal(n[s], 4);
    static const char *const names[4] = {"data", "tag", "columnwise_data", "columnwise_tag"};
    for (int e = 0; e < 4; e++) assert_string_equal(ext[s][e].name, names[e]);
    for (int e = 1; e < 4; e += 2) {
      assert_int_equal(ext[s][e].dtype, HQ_U8);
      assert_int_equal(ext[s][e].rows, ms / 2);
      assert_int_equal(ext[s][e].row_bytes, 2);
      for (int64_t i = 0; i < ms; i++)
        assert_int_equal(((const uint8_t *)ext[s][e].ptr)[i], tag_of(&x, s * ms + i));
    }
    assert_int_equal(ext[s][0].rows, ms); /* by its rule: ROWS, one per row */
    assert_int_equal(ext[s][0].row_bytes, K * 4);
  }
  assert_int_equal(l.extract, 2 * world); /* one call per storage and shard */
  assert_int_equal(l.assign, 0);
  hq_fsdp_buffer gathered[NE];
  void *mem[NE];
  hq_test_all_gather(ext, world, n[0], gathered, mem);
  hq_qtensor *full = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, M, K, HQ_F32, &full));
  hq_test_fill_garbage(full); /* assign writes every byte */
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)));
  assert_int_equal(l.assign, 2);
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
  hq_test_same_qtensors(full, ref, "test_forms gathered");
  /* the form's row count is checked against the full tensor's form before anything moves */
  gathered[3].rows--;
  assert_int_equal(
      hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)), HQ_EINVAL);
  HQ_ERROR_HAS("'columnwise_tag'");
  assert_int_equal(l.assign, 2);
  for (size_t e = 0; e < n[0]; e++) free(mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_fsdp_ops(void **state) {
  (void)state;
  gather_case(2, 6);
  gather_case(4, 2); /* one form row per shard */
  gather_case(4, 10);
}

/* A table that does not reach the ops has none: the tag buffer is never gathered. */
static void test_short_table(void **state) {
  (void)state;
  oplog l = {0};
  hq_ctx *ctx = logged_ctx(&l);
  hq_recipe *r = forms_recipe("test_forms_short", 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 4, 3, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_fsdp_buffer ext[NE];
  size_t n = 0;
  assert_int_equal(hq_fsdp_extract(qt, ctx, ext, NE, sizeof ext[0], &n), HQ_ENOTSUP);
  HQ_ERROR_HAS("buffer 'tag' cannot be gathered");
  /* saved as it is: the reversed tags and their padding */
  hq_saved_buffer sv[4];
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 4, sizeof sv[0], &n));
  assert_int_equal(n, 4);
  assert_string_equal(sv[1].name, "tag");
  assert_int_equal(sv[1].bytes, 8 + 16);
  assert_int_equal(sv[1].shape[0], 8 + 16);
  assert_int_equal(((const uint8_t *)sv[1].ptr)[0], tag_of(&x, 7));
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, sv, n, sizeof sv[0]));
  assert_int_equal(l.extract + l.assign + l.save + l.restore, 0);
  hq_qtensor_free(qt);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

// --- save / restore -------------------------------------------------------------------------------

static void test_save_ops(void **state) {
  (void)state;
  const int64_t M = 10, K = 6;
  oplog l = {0};
  hq_ctx *ctx = logged_ctx(&l);
  hq_recipe *r = forms_recipe("test_forms", 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_tensor x = hq_test_tensor(HQ_F32, M, K, 5, 1.0f);
  hq_qtensor *qt = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
  assert_int_equal(hq_qtensor_saved_count(qt), 4);
  hq_saved_buffer sv[4];
  size_t n = 0;
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 4, sizeof sv[0], &n));
  assert_int_equal(l.save, 2);
  assert_int_equal(hq_qtensor_is_saved(qt), 1);
  /* data as it is; each tag as its form: u8 [M], natural order, no padding */
  assert_string_equal(sv[0].name, "data");
  assert_int_equal(sv[0].bytes, M * K * 4);
  assert_int_equal(sv[0].dtype, HQ_F32);
  for (int e = 1; e < 4; e += 2) {
    assert_string_equal(sv[e].name, e == 1 ? "tag" : "columnwise_tag");
    assert_int_equal(sv[e].dir, e == 1 ? HQ_ROWWISE : HQ_COLWISE);
    assert_int_equal(sv[e].dtype, HQ_U8);
    assert_int_equal(sv[e].ndim, 1);
    assert_int_equal(sv[e].shape[0], M);
    assert_int_equal(sv[e].bytes, M);
    for (int64_t i = 0; i < M; i++)
      assert_int_equal(((const uint8_t *)sv[e].ptr)[i], tag_of(&x, i));
  }
  /* offloaded: every entry moved to other memory of the context, the original freed */
  for (size_t e = 0; e < n; e++) {
    void *p = NULL;
    HQ_OK_OR_FAIL(hq_ctx_alloc(ctx, sv[e].bytes, &p));
    memcpy(p, sv[e].ptr, sv[e].bytes);
    hq_ctx_free(ctx, sv[e].ptr);
    sv[e].ptr = p;
  }
  /* an entry of the buffer's size, not the form's, is refused before anything changes */
  sv[3].bytes = M + 16;
  assert_int_equal(hq_qtensor_restore(qt, sv, n, sizeof sv[0]), HQ_EINVAL);
  HQ_ERROR_HAS("'columnwise_tag' (10 bytes as its format saves it");
  assert_int_equal(hq_qtensor_is_saved(qt), 1);
  assert_int_equal(l.restore, 0);
  sv[3].bytes = M;
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, sv, n, sizeof sv[0]));
  assert_int_equal(l.restore, 2);
  assert_int_equal(hq_qtensor_is_saved(qt), 0);
  hq_test_same_qtensors(qt, ref, "test_forms restored");
  hq_qtensor_free(qt);
  hq_qtensor_free(ref);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

// --- a module's faults ------------------------------------------------------------------------------

static void test_faults(void **state) {
  (void)state;
  oplog l = {0};
  hq_ctx *ctx = logged_ctx(&l);
  hq_tensor x = hq_test_tensor(HQ_F32, 8, 4, 9, 1.0f);
  hq_fsdp_buffer ext[NE];
  hq_saved_buffer sv[4];
  size_t n = 0;
  for (int bug = 1; bug <= 4; bug++) {
    hq_recipe *r = forms_recipe("test_forms", bug);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    memset(&l, 0, sizeof l);
    switch (bug) {
    case 1: /* an FSDP form of 5 rows for 8 rows of M by 2 */
      assert_int_equal(hq_fsdp_extract(qt, ctx, ext, NE, sizeof ext[0], &n), HQ_EABI);
      HQ_ERROR_HAS("buffer_form() of plugin test_forms gave buffer 'tag' an invalid FSDP form");
      HQ_ERROR_HAS("shape [5, 2], m_div 2");
      assert_int_equal(l.extract, 0);
      break;
    case 2: /* a save form of 5 dimensions: refused, the tensor not saved */
      assert_int_equal(hq_qtensor_save(qt, sv, 4, sizeof sv[0], &n), HQ_EABI);
      HQ_ERROR_HAS("gave buffer 'tag' an invalid save form (dtype 4, ndim 5");
      assert_int_equal(hq_qtensor_is_saved(qt), 0);
      assert_int_equal(l.save, 0);
      break;
    case 3: /* fsdp_extract fails: its status and message, the buffer named */
      assert_int_equal(hq_fsdp_extract(qt, ctx, ext, NE, sizeof ext[0], &n), HQ_EDEVICE);
      HQ_ERROR_HAS("role linear:weight:w, rowwise format 'f' (plugin test_forms), fsdp_extract of "
                   "buffer 'tag': test_forms: the un-reverse kernel failed");
      break;
    case 4: /* restore fails: still saved, the entries still the caller's */
      HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 4, sizeof sv[0], &n));
      assert_int_equal(hq_qtensor_restore(qt, sv, n, sizeof sv[0]), HQ_EDEVICE);
      HQ_ERROR_HAS("restore of buffer 'tag': test_forms: the reverse kernel failed");
      assert_int_equal(hq_qtensor_is_saved(qt), 1);
      for (size_t e = 0; e < n; e++) hq_ctx_free(ctx, sv[e].ptr);
      break;
    }
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  free(x.data);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loader),     cmocka_unit_test(test_fsdp_ops),
      cmocka_unit_test(test_short_table), cmocka_unit_test(test_save_ops),
      cmocka_unit_test(test_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
