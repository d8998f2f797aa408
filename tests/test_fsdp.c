/*
** test_fsdp.c -- the FSDP buffer protocol, without communication: for hybrids (one format per
** direction), a tensor split along M into shards, each shard quantized with the amax shared by
** all (hq_quantizer_amax per shard, max-reduced), its buffers extracted, concatenated per entry
** in rank order (what an all-gather does) and assigned into a full-size qtensor, equals the whole
** tensor quantized with that amax, byte for byte, in every buffer of every direction; gathered
** lists of the wrong length or with a wrong entry are refused. Shards whose rows are not a
** multiple of the formats' shard rows are refused by hq_fsdp_extract before any bytes move; the
** shard-row query; argument checks. Every single format, over its options, 2 and 4 shards and
** each usage, is checked by tests/test_conformance.c.
** Swizzled MXFP8 scales (gathered by the module's own ops, plugin ABI 2.4; refused before): 2 and
** 4 shards of 32, 96 and 128 rows (a 128-row swizzle tile spans shards), both directions and each
** alone, 1-D and 2-D blocks, K with padded scale columns: equal to the whole tensor quantized,
** byte for byte, the full tensor's every byte written; each shard's extracted list is the
** compact layout's list for the same input, byte for byte (the swizzled scales travel as the
** compact rows). nvfp4's swizzled scales (no such ops) are still refused.
** hq_fsdp_extract_dirs: each direction's list is that direction's part of the whole list.
*/
#include "hq_test.h"

#define WORLD 4

typedef struct fmt_case {
  const char *name;      /* for messages */
  const char *recipe;    /* defines formats "r" and "c" */
  int refuse;            /* expected hq_fsdp_extract status (0 = works) */
  const char *why;       /* a piece of the refusal message */
} fmt_case;

/* A role section using [format r] rowwise and [format c] columnwise. */
#define ROLE "[role linear:weight:*]\nrowwise = r\ncolumnwise = c\n"
#define SAME(body) "[format r]\n" body "[format c]\n" body ROLE

/* Single formats, for the shard-row rule (test_shard_row_multiple). */
static const fmt_case cases[] = {
    {"fp8_tensor e4m3", SAME("plugin = fp8_tensor\n"), 0, NULL},
    {"mxfp8", SAME("plugin = mxfp8\n"), 0, NULL},
    {"nvfp4", SAME("plugin = nvfp4\n"), 0, NULL},
    {"nvfp4 rht", SAME("plugin = nvfp4\nrht = true\n"), 0, NULL},
    {"fp8_block 1d", SAME("plugin = fp8_block\n"), 0, NULL},
    {"fp8_block 2d", SAME("plugin = fp8_block\nblock = 2d\n"), 0, NULL},
    {"nvfp4 ue5m3", SAME("plugin = nvfp4\nscale_dtype = ue5m3\n"), 0, NULL},
    {"nvfp4 ue5m3 none", SAME("plugin = nvfp4\nscale_dtype = ue5m3\nglobal_scale = none\n"), 0,
     NULL},
};

/* Hybrids: each direction is gathered by its own format's rules. */
static const fmt_case hybrids[] = {
    {"mxfp8 / nvfp4 rht", "[format r]\nplugin = mxfp8\n[format c]\nplugin = nvfp4\nrht = true\n" ROLE,
     0, NULL},
    {"fp8_tensor / fp8_block", "[format r]\nplugin = fp8_tensor\n[format c]\nplugin = fp8_block\n"
     ROLE, 0, NULL},
    {"identity / nvfp4 2d", "[format r]\nplugin = identity\n[format c]\nplugin = nvfp4\n"
     "block_2d = true\n" ROLE, 0, NULL},
    {"fp8_block 2d / mxfp8", "[format r]\nplugin = fp8_block\nblock = 2d\n[format c]\nplugin = "
     "mxfp8\n" ROLE, 0, NULL},
    {"mxfp8 swizzled / fp8_tensor", "[format r]\nplugin = mxfp8\nswizzle = true\n[format c]\n"
     "plugin = fp8_tensor\n" ROLE, 0, NULL},
    {"fp8_tensor / mxfp8 swizzled 2d", "[format r]\nplugin = fp8_tensor\n[format c]\nplugin = "
     "mxfp8\nswizzle = true\nblock_2d = true\n" ROLE, 0, NULL},
    {"nvfp4 row / mxfp8", "[format r]\nplugin = nvfp4\nglobal_scale = row\n[format c]\nplugin = "
     "mxfp8\n" ROLE, 0, NULL},
    {"nvfp4 swizzled / fp8_tensor", "[format r]\nplugin = nvfp4\nswizzle = true\n[format c]\n"
     "plugin = fp8_tensor\n" ROLE, HQ_ENOTSUP, "swizzle"},
};

/* Rows [r0, r0 + n) of x as a tensor of its own (shares x's memory). */
static hq_tensor rows_of(const hq_tensor *x, int64_t r0, int64_t n) {
  return hq_tensor_2d((char *)x->data + (size_t)(r0 * x->cols) * hq_dtype_size(x->dtype),
                      x->dtype, x->device, n, x->cols);
}

/* Every byte of every buffer of qt's present directions set to a value no quantize leaves in
   padding, so that an assign that skips a byte shows. */
static void poison(hq_qtensor *qt) {
  for (uint32_t d = 1; d <= 2; d++) {
    hq_storage *st = (hq_storage *)hq_qtensor_storage(qt, d);
    for (uint32_t b = 0; st && b < st->nbuf; b++)
      memset(HQ_STORAGE_BUF(st, b)->ptr, 0xa5, HQ_STORAGE_BUF(st, b)->bytes);
  }
}

/* Split x into WORLD shards of ms rows, run the protocol, compare with the whole quantized. */
static void run_case(const fmt_case *c, const hq_tensor *x, int64_t ms, int expect,
                     const char *why) {
  hq_recipe *r = hq_test_recipe(c->recipe);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const int world = (int)(x->rows / ms);
  /* the shared amax: max over the shards' amaxes */
  float shared[2] = {0, 0};
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(x, s * ms, ms);
    float a[2];
    HQ_OK_OR_FAIL(hq_quantizer_amax(q, ctx, &xs, a));
    for (int d = 0; d < 2; d++) shared[d] = a[d] > shared[d] ? a[d] : shared[d];
  }
  hq_quantize_args args = {.struct_size = sizeof args, .amax = shared};
  hq_qtensor *shard[WORLD] = {0};
  hq_fsdp_buffer ext[WORLD][2 * HQ_MAX_BUFFERS];
  size_t n[WORLD];
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(x, s * ms, ms);
    HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, &xs, &args, &shard[s]));
    int rc = hq_fsdp_extract(shard[s], ctx, ext[s], 2 * HQ_MAX_BUFFERS, sizeof(hq_fsdp_buffer),
                             &n[s]);
    if (expect) {
      if (rc != expect) fail_msg("%s: extract gave %d (%s), expected %d", c->name, rc,
                                 hq_last_error(), expect);
      HQ_ERROR_HAS(why);
      for (int t = 0; t <= s; t++) hq_qtensor_free(shard[t]);
      hq_ctx_destroy(ctx);
      hq_quantizer_free(q);
      hq_recipe_free(r);
      return;
    }
    if (rc) fail_msg("%s: extract: %s", c->name, hq_last_error());
    assert_int_equal(n[s], n[0]);
  }
  hq_fsdp_buffer gathered[2 * HQ_MAX_BUFFERS];
  void *mem[2 * HQ_MAX_BUFFERS];
  hq_test_all_gather(ext, world, n[0], gathered, mem);
  hq_qtensor *full = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, x->rows, x->cols, x->dtype, &full));
  poison(full); /* assign must write every byte, padding included */
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, shard[world - 1], gathered, n[0],
                               sizeof(hq_fsdp_buffer)));
  HQ_OK_OR_FAIL(hq_quantize_ex(q, ctx, x, &args, &ref));
  hq_test_same_qtensors(full, ref, c->name);
  /* a second assign into the same full tensor (the next iteration) gives the same bytes */
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)));
  hq_test_same_qtensors(full, ref, c->name);
  /* a gathered list of the wrong length or a wrong entry is refused */
  if (n[0]) {
    assert_int_equal(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0] - 1,
                                    sizeof(hq_fsdp_buffer)), HQ_EINVAL);
    gathered[0].rows--;
    assert_int_equal(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)),
                     HQ_EINVAL);
    HQ_ERROR_HAS(gathered[0].name);
  }
  for (size_t e = 0; e < n[0]; e++) free(mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

/* Values of a wide dynamic range: rows scaled differently, so that shards have different amaxes
   and the shared amax matters. */
static hq_tensor test_input(hq_dtype t, int64_t M, int64_t K) {
  hq_tensor x = hq_test_tensor(t, M, K, 42, 1.0f);
  for (int64_t i = 0; i < M; i++) {
    float f = (float)(1 << (i % 7)) * (i >= M / 2 ? 8.0f : 0.25f);
    for (int64_t k = 0; k < K; k++)
      hq_store_hp(x.data, i * K + k, t, hq_load_hp(x.data, i * K + k, t) * f);
  }
  return x;
}

static void test_hybrids(void **state) {
  (void)state;
  hq_tensor x = test_input(HQ_BF16, 4 * 128, 160);
  for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++)
    run_case(&hybrids[i], &x, 128, hybrids[i].refuse, hybrids[i].why);
  free(x.data);
}

static void test_f32_input(void **state) {
  (void)state;
  hq_tensor x = test_input(HQ_F32, 4 * 128, 96);
  for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++)
    run_case(&hybrids[i], &x, 128, hybrids[i].refuse, hybrids[i].why);
  free(x.data);
}

/* Shards of 32 rows: fine for per-tensor FP8, MXFP8 and NVFP4 (multiples of 1, 32, 16), refused
   for FP8 block scaling, whose 128-row blocks would straddle shards. */
static void test_shard_row_multiple(void **state) {
  (void)state;
  hq_tensor x = test_input(HQ_BF16, 4 * 32, 64);
  for (size_t i = 0; i < 4; i++) run_case(&cases[i], &x, 32, 0, NULL);
  run_case(&cases[4], &x, 32, HQ_ESHAPE, "not a multiple of 128");
  run_case(&cases[5], &x, 32, HQ_ESHAPE, "not a multiple of 128");
  run_case(&cases[6], &x, 32, 0, NULL); /* nvfp4 ue5m3: shards of 16-row multiples */
  run_case(&cases[7], &x, 32, 0, NULL);
  free(x.data);
}

/* Shapes whose transposed copies (per-tensor FP8's columnwise codes, NVFP4's columnwise scales)
   fill no 16 x 16 block or 64 x 64 tile evenly: the host transpose's edges, gathered equal to
   whole as above. */
static void test_transpose_edges(void **state) {
  (void)state;
  const int64_t shapes[][3] = {{3, 24, 100}, {2, 120, 200}, {4, 16, 37}}; /* shards, rows, cols */
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    hq_tensor x = test_input(HQ_BF16, shapes[i][0] * shapes[i][1], shapes[i][2]);
    run_case(&cases[0], &x, shapes[i][1], 0, NULL); /* fp8_tensor e4m3 */
    free(x.data);
  }
  hq_tensor x = test_input(HQ_BF16, 3 * 48, 96);
  run_case(&cases[2], &x, 48, 0, NULL); /* nvfp4: 48 / 16 = 3 columns of scales per shard */
  free(x.data);
}

/* hq_fsdp_extract of a full tensor lists its row-gathered buffers in place; assigning that list
   back (an entry that is the buffer itself is not copied onto itself) leaves every byte as it
   was, for every stock format with both directions. */
static void test_assign_in_place(void **state) {
  (void)state;
  hq_tensor x = test_input(HQ_BF16, 128, 96);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].refuse) continue;
    hq_recipe *r = hq_test_recipe(cases[i].recipe);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_ctx *ctx = NULL;
    HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
    hq_qtensor *full = NULL, *ref = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &full));
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &ref));
    hq_fsdp_buffer list[2 * HQ_MAX_BUFFERS];
    size_t n = 0;
    if (hq_fsdp_extract(full, ctx, list, 2 * HQ_MAX_BUFFERS, sizeof list[0], &n) != HQ_OK)
      fail_msg("%s: extract: %s", cases[i].name, hq_last_error());
    int in_place = 0;
    for (size_t e = 0; e < n; e++)
      for (uint32_t d = 1; d <= 2; d++) {
        const hq_storage *st = hq_qtensor_storage(full, d);
        for (uint32_t b = 0; st && b < st->nbuf; b++)
          in_place |= HQ_STORAGE_BUF((hq_storage *)st, b)->ptr == list[e].ptr;
      }
    assert_true(in_place); /* every stock format gathers its rowwise data by rows */
    HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, ref, list, n, sizeof list[0]));
    hq_fsdp_release(full);
    hq_test_same_qtensors(full, ref, cases[i].name);
    hq_qtensor_free(full);
    hq_qtensor_free(ref);
    hq_ctx_destroy(ctx);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  free(x.data);
}

/* hq_fsdp_extract_dirs: HQ_ROWWISE lists exactly the rowwise entries of hq_fsdp_extract's list
   (its first ones, byte for byte), HQ_COLWISE exactly the rest, for every stock format and
   hybrid; a direction that is not present lists nothing; dirs outside HQ_BOTH are refused; a
   shard refused for its other direction (1-D fp8_block's columnwise 128-row blocks) is refused
   whichever direction is asked. */
typedef struct entry_copy {
  hq_fsdp_buffer e;
  unsigned char *bytes;
} entry_copy;

static size_t extract_copy(hq_qtensor *qt, hq_ctx *ctx, uint32_t dirs, entry_copy *out) {
  hq_fsdp_buffer list[2 * HQ_MAX_BUFFERS];
  size_t n = 0;
  if (hq_fsdp_extract_dirs(qt, ctx, dirs, list, 2 * HQ_MAX_BUFFERS, sizeof list[0], &n))
    fail_msg("extract dirs %u: %s", dirs, hq_last_error());
  for (size_t e = 0; e < n; e++) {
    const size_t bytes = (size_t)(list[e].rows * list[e].row_bytes);
    out[e].e = list[e];
    out[e].bytes = malloc(bytes ? bytes : 1);
    assert_non_null(out[e].bytes);
    memcpy(out[e].bytes, list[e].ptr, bytes);
  }
  hq_fsdp_release(qt);
  return n;
}

static void same_entry(const entry_copy *a, const entry_copy *b, const char *what) {
  if (a->e.dir != b->e.dir || strcmp(a->e.name, b->e.name) || a->e.rows != b->e.rows ||
      a->e.row_bytes != b->e.row_bytes || a->e.dtype != b->e.dtype ||
      memcmp(a->bytes, b->bytes, (size_t)(a->e.rows * a->e.row_bytes)))
    fail_msg("%s: entry '%s' differs from the whole list's '%s'", what, a->e.name, b->e.name);
}

static void test_extract_dirs(void **state) {
  (void)state;
  hq_tensor x = test_input(HQ_BF16, 128, 96);
  const size_t nc = sizeof cases / sizeof cases[0], nh = sizeof hybrids / sizeof hybrids[0];
  for (size_t i = 0; i < nc + nh; i++) {
    const fmt_case *c = i < nc ? &cases[i] : &hybrids[i - nc];
    if (c->refuse) continue;
    hq_recipe *r = hq_test_recipe(c->recipe);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    hq_ctx *ctx = NULL;
    HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    entry_copy all[2 * HQ_MAX_BUFFERS], row[2 * HQ_MAX_BUFFERS], col[2 * HQ_MAX_BUFFERS];
    const size_t n = extract_copy(qt, ctx, HQ_BOTH, all);
    const size_t nr = extract_copy(qt, ctx, HQ_ROWWISE, row);
    const size_t ncol = extract_copy(qt, ctx, HQ_COLWISE, col);
    assert_int_equal(nr + ncol, n);
    assert_true(nr > 0 && ncol > 0);
    for (size_t e = 0; e < nr; e++) {
      assert_int_equal(row[e].e.dir, HQ_ROWWISE);
      same_entry(&row[e], &all[e], c->name);
    }
    for (size_t e = 0; e < ncol; e++) {
      assert_int_equal(col[e].e.dir, HQ_COLWISE);
      same_entry(&col[e], &all[nr + e], c->name);
    }
    hq_fsdp_buffer one;
    size_t k = 9;
    assert_int_equal(hq_fsdp_extract_dirs(qt, ctx, 0, &one, 1, sizeof one, &k), HQ_EINVAL);
    HQ_ERROR_HAS("dirs");
    assert_int_equal(hq_fsdp_extract_dirs(qt, ctx, 4, &one, 1, sizeof one, &k), HQ_EINVAL);
    for (size_t e = 0; e < n; e++) free(all[e].bytes);
    for (size_t e = 0; e < nr; e++) free(row[e].bytes);
    for (size_t e = 0; e < ncol; e++) free(col[e].bytes);
    hq_qtensor_free(qt);
    /* rowwise alone: asking for the columnwise direction lists nothing */
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, HQ_ROWWISE));
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
    assert_int_equal(extract_copy(qt, ctx, HQ_COLWISE, col), 0);
    hq_qtensor_free(qt);
    hq_ctx_destroy(ctx);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  free(x.data);
  /* 32 rows of 1-D fp8_block: its rowwise 1 x 128 blocks could be sharded, its columnwise
     128 x 1 blocks cannot; the rowwise list alone is refused all the same */
  hq_tensor y = test_input(HQ_BF16, 32, 128);
  hq_recipe *r = hq_test_recipe(cases[4].recipe);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &qt));
  hq_fsdp_buffer list[2 * HQ_MAX_BUFFERS];
  size_t k = 0;
  assert_int_equal(hq_fsdp_extract_dirs(qt, ctx, HQ_ROWWISE, list, 2 * HQ_MAX_BUFFERS,
                                        sizeof list[0], &k), HQ_ESHAPE);
  HQ_ERROR_HAS("not a multiple of 128");
  hq_qtensor_free(qt);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  free(y.data);
}

/* One swizzled mxfp8 instance (`opts`, one line each) of usage `usage`, world shards of ms rows of
   x: gathered equals whole; each shard's list equals a compact instance's for the same shard. */
static void swizzled_case(const char *opts, uint32_t usage, const hq_tensor *x, int64_t ms) {
  char rs[256], rc[256];
  snprintf(rs, sizeof rs, "[format m]\nplugin = mxfp8\nswizzle = true\n%s[role *:*:*]\n"
           "rowwise = m\ncolumnwise = m\n", opts);
  snprintf(rc, sizeof rc, "[format m]\nplugin = mxfp8\n%s[role *:*:*]\nrowwise = m\n"
           "columnwise = m\n", opts);
  char what[160];
  snprintf(what, sizeof what, "mxfp8 swizzle %s usage %u, shards of %lld", opts, usage,
           (long long)ms);
  hq_recipe *r = hq_test_recipe(rs), *r_compact = hq_test_recipe(rc);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_quantizer *qc = hq_test_quantizer(r_compact, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(qc, usage));
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  const int world = (int)(x->rows / ms);
  const size_t want = usage == HQ_BOTH ? 4 : 2; /* data and scales per direction */
  hq_qtensor *shard[WORLD] = {0};
  hq_fsdp_buffer ext[WORLD][2 * HQ_MAX_BUFFERS];
  size_t n[WORLD];
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(x, s * ms, ms);
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &xs, &shard[s]));
    HQ_OK_OR_FAIL(hq_fsdp_extract(shard[s], ctx, ext[s], 2 * HQ_MAX_BUFFERS,
                                  sizeof(hq_fsdp_buffer), &n[s]));
    assert_int_equal(n[s], want);
    hq_qtensor *c = NULL;
    hq_fsdp_buffer ce[2 * HQ_MAX_BUFFERS];
    size_t nc = 0;
    HQ_OK_OR_FAIL(hq_quantize(qc, ctx, &xs, &c));
    HQ_OK_OR_FAIL(hq_fsdp_extract(c, ctx, ce, 2 * HQ_MAX_BUFFERS, sizeof ce[0], &nc));
    assert_int_equal(nc, want);
    for (size_t e = 0; e < nc; e++) {
      assert_string_equal(ext[s][e].name, ce[e].name);
      assert_int_equal(ext[s][e].dtype, ce[e].dtype);
      assert_int_equal(ext[s][e].rows, ce[e].rows);
      assert_int_equal(ext[s][e].row_bytes, ce[e].row_bytes);
      if (memcmp(ext[s][e].ptr, ce[e].ptr, (size_t)(ce[e].rows * ce[e].row_bytes)))
        fail_msg("%s: shard %d entry '%s' differs from the compact layout's", what, s, ce[e].name);
    }
    hq_qtensor_free(c);
  }
  hq_fsdp_buffer gathered[2 * HQ_MAX_BUFFERS];
  void *mem[2 * HQ_MAX_BUFFERS];
  hq_test_all_gather(ext, world, n[0], gathered, mem);
  hq_qtensor *full = NULL, *ref = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, x->rows, x->cols, x->dtype, &full));
  hq_test_fill_garbage(full); /* assign writes every byte */
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, ctx, shard[world - 1], gathered, n[0],
                               sizeof(hq_fsdp_buffer)));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, x, &ref));
  assert_int_equal(hq_qtensor_storage(ref, usage & HQ_ROWWISE ? HQ_ROWWISE : HQ_COLWISE)
                       ->desc.scale_layout, HQ_SCALE_LAYOUT_SWIZZLED);
  hq_test_same_qtensors(full, ref, what);
  /* a gathered scale entry of the wrong size is refused, naming it */
  gathered[1].row_bytes++;
  assert_int_equal(hq_fsdp_assign(full, ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)),
                   HQ_EINVAL);
  HQ_ERROR_HAS(gathered[1].name);
  for (size_t e = 0; e < n[0]; e++) free(mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_quantizer_free(qc);
  hq_recipe_free(r);
  hq_recipe_free(r_compact);
}

static void test_swizzled_mxfp8(void **state) {
  (void)state;
  static const char *const opts[] = {"", "block_2d = true\n", "dtype = e5m2\n"};
  static const uint32_t usages[] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  static const int64_t shard_rows[] = {32, 96, 128};
  for (int world = 2; world <= 4; world += 2)
    for (size_t m = 0; m < sizeof shard_rows / sizeof shard_rows[0]; m++) {
      /* K = 160: 5 scale blocks per row (padded to 8) and columns padded to 256 */
      hq_tensor x = test_input(HQ_BF16, world * shard_rows[m], 160);
      for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
        for (size_t u = 0; u < sizeof usages / sizeof usages[0]; u++)
          swizzled_case(opts[o], usages[u], &x, shard_rows[m]);
      free(x.data);
    }
}

/* hq_qtensor_shard_rows: the least common multiple of the directions' multiples, 0 when one
   cannot be sharded. */
static void test_shard_rows_query(void **state) {
  (void)state;
  static const struct { const char *recipe; int64_t rows; } q[] = {
      {SAME("plugin = fp8_tensor\n"), 1},
      {SAME("plugin = mxfp8\n"), 32},
      {SAME("plugin = nvfp4\n"), 16},
      {SAME("plugin = nvfp4\nstochastic_rounding = true\n"), 0},
      {SAME("plugin = fp8_block\n"), 128},
      {"[format r]\nplugin = fp8_tensor\n[format c]\nplugin = mxfp8\n" ROLE, 32},
      /* row-scaled: the rowwise copy shards by 16 rows, the columnwise (per-column amax) not */
      {SAME("plugin = nvfp4\nglobal_scale = row\n"), 0},
  };
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 128, 128, 1, 1.0f);
  for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
    hq_recipe *r = hq_test_recipe(q[i].recipe);
    hq_quantizer *qz = hq_test_quantizer(r, "linear:weight:w");
    hq_qtensor *qt = NULL;
    HQ_OK_OR_FAIL(hq_quantize(qz, ctx, &x, &qt));
    assert_int_equal(hq_qtensor_shard_rows(qt), q[i].rows);
    /* one direction alone: the fp8_tensor/mxfp8 hybrid's rowwise copy needs only 1 */
    if (i == 5) {
      HQ_OK_OR_FAIL(hq_qtensor_drop(qt, HQ_COLWISE));
      assert_int_equal(hq_qtensor_shard_rows(qt), 1);
    }
    if (i == 6) {
      HQ_OK_OR_FAIL(hq_qtensor_drop(qt, HQ_COLWISE));
      assert_int_equal(hq_qtensor_shard_rows(qt), 16);
    }
    hq_qtensor_free(qt);
    hq_quantizer_free(qz);
    hq_recipe_free(r);
  }
  free(x.data);
  hq_ctx_destroy(ctx);
}

/* Argument checks: too small an array, too small an element size, a saved shard. */
static void test_errors(void **state) {
  (void)state;
  hq_recipe *r = hq_test_recipe(SAME("plugin = mxfp8\n"));
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  hq_tensor x = hq_test_tensor(HQ_F32, 64, 64, 2, 1.0f);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
  hq_fsdp_buffer out[8];
  size_t n = 0;
  assert_int_equal(hq_fsdp_extract(qt, ctx, out, 1, sizeof out[0], &n), HQ_EINVAL);
  assert_int_equal(n, 4); /* data + scale of each direction */
  assert_int_equal(hq_fsdp_extract(qt, ctx, out, 8, 8, &n), HQ_EINVAL);
  HQ_ERROR_HAS("elem_size");
  HQ_OK_OR_FAIL(hq_fsdp_extract(qt, ctx, out, 8, sizeof out[0], &n));
  assert_string_equal(out[0].name, "data");
  assert_string_equal(out[1].name, "scale_inv");
  assert_int_equal(out[1].rows, 64); /* padding rows (to 128) trimmed */
  assert_string_equal(out[3].name, "columnwise_scale_inv");
  assert_int_equal(out[3].rows, 2); /* one row per 32 rows of M */
  hq_fsdp_release(qt);
  hq_saved_buffer sv[8];
  size_t nsaved = 0;
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 8, sizeof sv[0], &nsaved));
  assert_int_equal(hq_fsdp_extract(qt, ctx, out, 8, sizeof out[0], &n), HQ_ESTATE);
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, sv, nsaved, sizeof sv[0]));
  hq_qtensor_free(qt);
  free(x.data);
  hq_ctx_destroy(ctx);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hybrids),          cmocka_unit_test(test_f32_input),
      cmocka_unit_test(test_shard_row_multiple), cmocka_unit_test(test_shard_rows_query),
      cmocka_unit_test(test_errors),           cmocka_unit_test(test_swizzled_mxfp8),
      cmocka_unit_test(test_transpose_edges),  cmocka_unit_test(test_assign_in_place),
      cmocka_unit_test(test_extract_dirs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
