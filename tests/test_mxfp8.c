/*
** test_mxfp8.c -- the mxfp8 plugin (ABI 2.1) through the public API (recipes, quantizers,
** qtensors, their storages' descriptors and buffers, updates, hq_gemm on the host), plus direct
** calls into the loaded module (device refusal, layout messages, scratch, updates without
** allocation, storages written by a differently configured instance, the raw dequantize, and
** the native gemm op's answers and its cuBLASLt operands, seen through a recording
** host->lt_matmul). The contract every format meets (update == fresh quantize, a storage read by
** other instances, FSDP, offload, checkpoints): test_conformance. Every expectation is
** independent of the plugin: hand-computed codes and values, the descriptor table of the ABI
** briefs, the reference of mxfp8_ref.h (its own FP8 encoder, scale search and scale-layout
** writer), or an F64 product.
** Buffers are allocated poisoned (0xA5) so that unwritten padding shows.
** The reference numbers its element kinds 0 = E4M3, 1 = E5M2; DT() gives the hq_dtype.
*/
#include <dlfcn.h>
#include <float.h>
#include <math.h>

#include "hq_test.h"
#include "mxfp8_ref.h"

/* The hq_dtype of reference kind k (0 = E4M3, 1 = E5M2). */
#define DT(k) ((k) ? HQ_E5M2 : HQ_E4M3)

// --- helpers ----------------------------------------------------------------------------------

static void *poison_alloc(void *user, int device, size_t bytes, void *stream) {
  (void)user, (void)device, (void)stream;
  void *p = malloc(bytes ? bytes : 1);
  if (p) memset(p, 0xA5, bytes);
  return p;
}

static void poison_free(void *user, int device, void *ptr, void *stream) {
  (void)user, (void)device, (void)stream;
  free(ptr);
}

static const hq_allocator poison = {
    .struct_size = sizeof poison, .alloc = poison_alloc, .free = poison_free, .user = NULL};

static hq_ctx *make_ctx(void) {
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  d.allocator = &poison;
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &ctx));
  return ctx;
}

static hq_recipe *mx_recipe(int kind, int swizzle, int two_d) {
  char text[512];
  snprintf(text, sizeof text,
           "[format mx]\nplugin = mxfp8\ndtype = %s\nswizzle = %s\nblock_2d = %s\n"
           "[role *:*:*]\nrowwise = mx\ncolumnwise = mx\n",
           kind ? "e5m2" : "e4m3", swizzle ? "true" : "false", two_d ? "true" : "false");
  return hq_test_recipe(text);
}

/* A host tensor of dtype t holding the values of xf (which must be representable in t) */
static hq_tensor tensor_of(const float *xf, hq_dtype t, int64_t M, int64_t K) {
  hq_tensor x = hq_test_empty(t, M, K);
  for (int64_t i = 0; i < M * K; i++) hq_store_hp(x.data, i, t, xf[i]);
  return x;
}

/* Round every value of xf to dtype t in place (so the reference sees the stored values). */
static void round_to(float *xf, int64_t n, hq_dtype t) {
  if (t == HQ_F32) return;
  uint16_t h;
  for (int64_t i = 0; i < n; i++) {
    hq_store_hp(&h, 0, t, xf[i]);
    xf[i] = hq_load_hp(&h, 0, t);
  }
}

static const hq_storage *storage(const hq_qtensor *qt, uint32_t dir) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  if (!s) fail_msg("no %s storage", dir == HQ_ROWWISE ? "rowwise" : "columnwise");
  return s;
}

/* Buffer i of qt's storage of direction dir (through the stride: hq_storage_cbuf). */
static const hq_buffer *sbuf(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  return hq_storage_cbuf(storage(qt, dir), i);
}

/* Its bytes. */
static const uint8_t *sbytes(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  return sbuf(qt, dir, i)->ptr;
}

static hq_qtensor *quantize(hq_recipe *r, hq_ctx *ctx, const hq_tensor *x, uint32_t usage) {
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, x, &qt));
  hq_quantizer_free(q);
  return qt;
}

/* Compare one direction of qt, every byte of both buffers (padding included), with the
   reference quantization of xf. */
static void check_dir(const hq_qtensor *qt, const float *xf, int64_t M, int64_t K, int kind,
                      int swz, int two_d, uint32_t dir) {
  const hq_storage *s = storage(qt, dir);
  int d = dir == HQ_ROWWISE ? 1 : 2;
  uint8_t *data = malloc((size_t)(M * K));
  uint8_t *codes = malloc((size_t)(M * K)); /* >= M*K/32 */
  ref_quantize(xf, M, K, kind, d, two_d, data, codes);
  size_t nbytes;
  uint8_t *want = ref_dir_scales(codes, M, K, d, swz, &nbytes);
  const hq_buffer *db = hq_storage_cbuf(s, 0), *sb = hq_storage_cbuf(s, 1);
  assert_int_equal(db->bytes, (size_t)(M * K));
  assert_int_equal(sb->bytes, nbytes);
  const uint8_t *got = db->ptr, *gs = sb->ptr;
  for (int64_t i = 0; i < M * K; i++)
    if (got[i] != data[i])
      fail_msg("%s data[%lld][%lld] = 0x%02x, want 0x%02x (x = %a, kind %d swz %d 2d %d)",
               d == 1 ? "rowwise" : "columnwise", (long long)(i / K), (long long)(i % K), got[i],
               data[i], (double)xf[i], kind, swz, two_d);
  for (size_t i = 0; i < nbytes; i++)
    if (gs[i] != want[i])
      fail_msg("%s scale byte %zu = 0x%02x, want 0x%02x (M %lld K %lld kind %d swz %d 2d %d)",
               d == 1 ? "rowwise" : "columnwise", i, gs[i], want[i], (long long)M, (long long)K,
               kind, swz, two_d);
  free(want);
  free(codes);
  free(data);
}

/* Test data: N(0,1) times a random power of two per 32x32 region and per element class, with
   zeros, signed zeros, FP32 subnormals, NaN and +-Inf sprinkled in (specials != 0 only). */
static float *gen(int64_t M, int64_t K, uint64_t seed, int lo, int hi, int specials) {
  float *x = malloc((size_t)(M * K) * sizeof *x);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++) {
      uint64_t h = (uint64_t)((i / 32) * 1000003 + (j / 32) * 7919 + (i % 7) * 31 + (j % 5)) ^ seed;
      int e = lo + (int)((h * 2654435761u >> 7) % (uint64_t)(hi - lo + 1));
      x[i * K + j] = ldexpf(hq_test_normal(&s), e);
    }
  if (specials) {
    for (int n = 0; n < (int)(M * K / 97) + 4; n++) {
      int64_t p = (int64_t)(hq_test_rand(&s) % (uint64_t)(M * K));
      switch (hq_test_rand(&s) % 16) {
      case 0: x[p] = NAN; break;
      case 1: x[p] = INFINITY; break;
      case 2: x[p] = -INFINITY; break;
      case 3: x[p] = -0.0f; break;
      case 4: x[p] = ldexpf(1.0f, -140); break;
      default: x[p] = 0.0f; break;
      }
    }
  }
  return x;
}

// --- layout: descriptor and buffers (the ABI 2.0 table) -----------------------------------------

/* One buffer against the table: name, role, dtype, 2-D shape, no flags (nothing is shared),
   gather rule and, for a ROWS rule, the rows of M per entry (m_div is meaningless under NEVER). */
static void check_buf(const hq_buffer *b, const char *name, uint32_t role, hq_dtype t, int64_t d0,
                      int64_t d1, uint32_t gather, int32_t m_div) {
  assert_string_equal(b->name, name);
  assert_int_equal(b->role, role);
  assert_int_equal(b->dtype, t);
  assert_int_equal(b->ndim, 2);
  assert_int_equal(b->shape[0], d0);
  assert_int_equal(b->shape[1], d1);
  assert_int_equal(b->flags, 0);
  assert_int_equal(b->gather, gather);
  if (gather != HQ_GATHER_NEVER) assert_int_equal(b->m_div, m_div);
  assert_int_equal(b->bytes, (size_t)(d0 * d1)); /* one byte per element (FP8, E8M0) */
}

/* A storage of direction dir of an [M, K] tensor, made by an instance (kind, swz, two_d), is
   what the table says:
     rowwise: "data" DATA [M,K] ROWS 1; "scale_inv" E8M0 [r128(M), r4(K/32)] ROWS 1 (swizzle:
       NEVER); desc VEC32_UE8M0, OUTER_MAJOR (SWIZZLED), block 1x32 (2-D 32x32), shard_rows 32;
     columnwise: "columnwise_data" [M,K] order MK ROWS 1; "columnwise_scale_inv" E8M0
       [r4(M/32), r128(K)] ROWS m_div 32 (swizzle: NEVER); desc VEC32_UE8M0, BLOCK_MAJOR
       (SWIZZLED), block 32x1 (2-D 32x32), shard_rows 32.
   Both: elem = the dtype option, transform none. */
static void check_storage_table(const hq_storage *s, uint32_t dir, int64_t M, int64_t K, int kind,
                                int swz, int two_d) {
  const int row = dir == HQ_ROWWISE;
  const hq_operand_desc *d = &s->desc;
  assert_int_equal(s->dir, dir);
  assert_int_equal(s->rows, M);
  assert_int_equal(s->cols, K);
  assert_int_equal(s->nbuf, 2);
  assert_int_equal(d->struct_size, sizeof(hq_operand_desc));
  assert_int_equal(d->elem, DT(kind));
  assert_int_equal(d->order, HQ_ORDER_MK);
  assert_int_equal(d->scale_mode, HQ_SCALE_VEC32_UE8M0);
  assert_int_equal(d->scale_layout, swz   ? HQ_SCALE_LAYOUT_SWIZZLED
                                    : row ? HQ_SCALE_LAYOUT_OUTER_MAJOR
                                          : HQ_SCALE_LAYOUT_BLOCK_MAJOR);
  assert_int_equal(d->block_m, two_d || !row ? 32 : 1);
  assert_int_equal(d->block_k, two_d || row ? 32 : 1);
  assert_int_equal(d->transform, HQ_TRANSFORM_NONE);
  assert_int_equal(d->transform_param, 0);
  assert_int_equal(d->shard_rows, 32);
  /* 2.1: the raw values (= the dequantized ones) are exact in BF16, bar the far-underflow edge */
  assert_int_equal(d->emul_dtype, HQ_BF16);
  assert_int_equal(d->reserved32, 0);
  for (size_t i = 0; i < sizeof d->reserved / sizeof d->reserved[0]; i++)
    assert_int_equal(d->reserved[i], 0);
  /* meta holds no layout fact any more: it stays as the core zeroed it */
  for (int i = 0; i < HQ_META_BYTES; i++) assert_int_equal(s->meta[i], 0);
  const uint32_t sg = swz ? HQ_GATHER_NEVER : HQ_GATHER_ROWS;
  if (row) {
    check_buf(hq_storage_cbuf(s, 0), "data", HQ_ROLE_DATA, DT(kind), M, K, HQ_GATHER_ROWS, 1);
    check_buf(hq_storage_cbuf(s, 1), "scale_inv", HQ_ROLE_SCALE, HQ_E8M0, ref_up(M, 128),
              ref_up(K / 32, 4), sg, 1);
  } else {
    check_buf(hq_storage_cbuf(s, 0), "columnwise_data", HQ_ROLE_DATA, DT(kind), M, K,
              HQ_GATHER_ROWS, 1);
    check_buf(hq_storage_cbuf(s, 1), "columnwise_scale_inv", HQ_ROLE_SCALE, HQ_E8M0,
              ref_up(M / 32, 4), ref_up(K, 128), sg, 32);
  }
}

/* Every option set (dtype x swizzle x block_2d), usage (both, rowwise only, columnwise only) and
   shapes with and without scale padding: the descriptors and buffers of the quantized storages
   (and of hq_make_empty's) are the table's; sizes, shard rows, the amax kind (none) too. */
static void test_layout_desc_buffers(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t shapes[][2] = {{96, 160}, {32, 32}, {256, 4096}, {160, 96}, {64, 1056}};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
    const int64_t M = shapes[n][0], K = shapes[n][1];
    hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 1, 1.0f);
    for (int kind = 0; kind < 2; kind++)
      for (int swz = 0; swz < 2; swz++)
        for (int two_d = 0; two_d < 2; two_d++)
          for (uint32_t usage = 1; usage <= 3; usage++) {
            hq_recipe *r = mx_recipe(kind, swz, two_d);
            hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
            HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
            assert_int_equal(hq_quantizer_amax_kind(q, HQ_ROWWISE), HQ_AMAX_NONE);
            assert_int_equal(hq_quantizer_amax_kind(q, HQ_COLWISE), HQ_AMAX_NONE);
            hq_qtensor *qt = NULL, *e = NULL;
            HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &qt));
            HQ_OK_OR_FAIL(hq_make_empty(q, ctx, M, K, HQ_F32, &e));
            assert_int_equal(hq_qtensor_dirs(qt), usage);
            assert_int_equal(hq_qtensor_shard_rows(qt), 32);
            for (uint32_t dir = 1; dir <= 2; dir++) {
              if (!(usage & dir)) {
                assert_null(hq_qtensor_storage(qt, dir));
                continue;
              }
              check_storage_table(storage(qt, dir), dir, M, K, kind, swz, two_d);
              check_storage_table(storage(e, dir), dir, M, K, kind, swz, two_d);
            }
            if (usage & HQ_ROWWISE)
              assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE),
                               (size_t)(M * K + ref_up(M, 128) * ref_up(K / 32, 4)));
            if (usage & HQ_COLWISE)
              assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE),
                               (size_t)(M * K + ref_up(M / 32, 4) * ref_up(K, 128)));
            hq_qtensor_free(qt);
            hq_qtensor_free(e);
            hq_quantizer_free(q);
            hq_recipe_free(r);
          }
    free(x.data);
  }
  hq_ctx_destroy(ctx);
}

/* M and K must be multiples of 32; the message names the dimension, value and multiple. */
static void test_shape_errors(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  hq_recipe *r = mx_recipe(0, 1, 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:input:x");
  struct { int64_t M, K; const char *msg; } cases[] = {
      {100, 64, "mxfp8: rows = 100 is not a multiple of 32"},
      {64, 48, "mxfp8: cols = 48 is not a multiple of 32"},
      {1, 32, "mxfp8: rows = 1 is not a multiple of 32"},
      {33, 33, "mxfp8: rows = 33 is not a multiple of 32"},
      {64, 4100, "mxfp8: cols = 4100 is not a multiple of 32"},
  };
  for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
    for (uint32_t usage = 1; usage <= 3; usage++) {
      HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
      hq_tensor x = hq_test_tensor(HQ_F32, cases[n].M, cases[n].K, 2, 1.0f);
      hq_qtensor *qt = NULL;
      assert_int_equal(hq_quantize(q, ctx, &x, &qt), HQ_ESHAPE);
      assert_null(qt);
      HQ_ERROR_HAS(cases[n].msg);
      assert_int_equal(hq_make_empty(q, ctx, cases[n].M, cases[n].K, HQ_BF16, &qt), HQ_ESHAPE);
      assert_null(qt);
      HQ_ERROR_HAS(cases[n].msg);
      free(x.data);
    }
  }
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

// --- numerics against the reference -------------------------------------------------------------

/* Every option combination, source dtype and usage, on shapes with and without scale padding:
   every data byte and every scale byte (padding zero) equals the reference. Rowwise-only and
   columnwise-only quantizes give the same bytes as the fused one. */
static void test_reference_all_combinations(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  /* 64 x 1056: more than one 512-column tile of the CPU loop, and a partial last one; 416 x 32
     and 32 x 544: a tile narrower than 512 columns, M and K/32 off the scale padding multiples;
     256 x 384 f16: the f16 decode table (>= 65536 elements) */
  const int64_t shapes[][2] = {{32, 32},   {96, 160},  {160, 96}, {256, 384},
                               {64, 1056}, {416, 32}, {32, 544}};
  const hq_dtype dts[] = {HQ_F32, HQ_BF16, HQ_F16};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++)
    for (int di = 0; di < 3; di++)
      for (int kind = 0; kind < 2; kind++) {
        int64_t M = shapes[n][0], K = shapes[n][1];
        hq_dtype dt = dts[di];
        if (n == 3 && dt != HQ_F32 && kind) continue; /* keep the run short */
        int lo = dt == HQ_F16 ? -8 : -40, hi = dt == HQ_F16 ? 8 : 40;
        float *xf = gen(M, K, 100 + n * 10 + (uint64_t)di, lo, hi, 1);
        round_to(xf, M * K, dt);
        hq_tensor x = tensor_of(xf, dt, M, K);
        for (int swz = 0; swz < 2; swz++) {
          hq_recipe *r = mx_recipe(kind, swz, 0);
          for (uint32_t usage = 1; usage <= 3; usage++) {
            hq_qtensor *qt = quantize(r, ctx, &x, usage);
            if (usage & HQ_ROWWISE) check_dir(qt, xf, M, K, kind, swz, 0, HQ_ROWWISE);
            if (usage & HQ_COLWISE) check_dir(qt, xf, M, K, kind, swz, 0, HQ_COLWISE);
            hq_qtensor_free(qt);
          }
          hq_recipe_free(r);
        }
        free(x.data);
        free(xf);
      }
  hq_ctx_destroy(ctx);
}

/* The same through block_2d: one code per 32x32 tile, in both directions, identical data. */
static void test_block_2d(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t shapes[][2] = {{32, 32}, {96, 160}, {160, 96}, {64, 1056}};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++)
    for (int kind = 0; kind < 2; kind++)
      for (int swz = 0; swz < 2; swz++) {
        int64_t M = shapes[n][0], K = shapes[n][1];
        float *xf = gen(M, K, 300 + n, -30, 30, 1);
        hq_tensor x = tensor_of(xf, HQ_F32, M, K);
        hq_recipe *r = mx_recipe(kind, swz, 1);
        for (uint32_t usage = 1; usage <= 3; usage++) {
          hq_qtensor *qt = quantize(r, ctx, &x, usage);
          if (usage & HQ_ROWWISE) check_dir(qt, xf, M, K, kind, swz, 1, HQ_ROWWISE);
          if (usage & HQ_COLWISE) check_dir(qt, xf, M, K, kind, swz, 1, HQ_COLWISE);
          if (usage == HQ_BOTH)
            assert_memory_equal(sbytes(qt, HQ_ROWWISE, 0),
                                sbytes(qt, HQ_COLWISE, 0), (size_t)(M * K));
          hq_qtensor_free(qt);
        }
        hq_recipe_free(r);
        free(x.data);
        free(xf);
      }
  {
    float xf[32 * 32];
    for (int i = 0; i < 32 * 32; i++) xf[i] = 1.0f;
    xf[0] = 1000.0f; /* tile amax 1000 -> e = 129 for every row and column of the tile */
    hq_tensor x = tensor_of(xf, HQ_F32, 32, 32);
    hq_recipe *r = mx_recipe(0, 0, 1);
    hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH);
    const uint8_t *rs = sbytes(qt, HQ_ROWWISE, 1);
    const uint8_t *cs = sbytes(qt, HQ_COLWISE, 1);
    const uint8_t *rd = sbytes(qt, HQ_ROWWISE, 0);
    for (int i = 0; i < 32; i++) assert_int_equal(rs[i * 4], 129);  /* compact stride 4 */
    for (int j = 0; j < 32; j++) assert_int_equal(cs[j], 129);
    assert_int_equal(rd[0], 0x78);      /* 1000 / 4 = 250 -> 256 */
    assert_int_equal(rd[7 * 32 + 5], 0x28); /* 1 / 4 = 0.25 */
    hq_qtensor_free(qt);
    hq_recipe_free(r);
    free(x.data);
  }
  hq_ctx_destroy(ctx);
}

/* Hand-built blocks: put `blk` in row 0 (rowwise block (0,0)) and, transposed, in column 0
   (columnwise block (0,0)) of a 32x32 zero tensor; both directions must give `code` and `q`. */
static void hand_block(hq_ctx *ctx, int kind, const float *blk, unsigned code, const uint8_t *q) {
  float xr[32 * 32] = {0}, xc[32 * 32] = {0};
  for (int k = 0; k < 32; k++) {
    xr[k] = blk[k];
    xc[k * 32] = blk[k];
  }
  hq_recipe *r = mx_recipe(kind, 0, 0);
  hq_tensor tr = tensor_of(xr, HQ_F32, 32, 32), tc = tensor_of(xc, HQ_F32, 32, 32);
  hq_qtensor *a = quantize(r, ctx, &tr, HQ_BOTH), *b = quantize(r, ctx, &tc, HQ_BOTH);
  const uint8_t *rs = sbytes(a, HQ_ROWWISE, 1), *rd = sbytes(a, HQ_ROWWISE, 0);
  const uint8_t *cs = sbytes(b, HQ_COLWISE, 1), *cd = sbytes(b, HQ_COLWISE, 0);
  assert_int_equal(rs[0], code);
  assert_int_equal(cs[0], code);
  for (int k = 0; k < 32; k++) {
    if (rd[k] != q[k]) fail_msg("rowwise element %d: 0x%02x, want 0x%02x", k, rd[k], q[k]);
    if (cd[k * 32] != q[k])
      fail_msg("columnwise element %d: 0x%02x, want 0x%02x", k, cd[k * 32], q[k]);
  }
  /* the other blocks of the tensor are zero blocks: code 0 (rows 1.. rowwise, cols 1.. colwise) */
  assert_int_equal(rs[4], 0);
  assert_int_equal(cs[1], 0);
  hq_qtensor_free(a);
  hq_qtensor_free(b);
  hq_recipe_free(r);
  free(tr.data);
  free(tc.data);
}

static void test_hand_blocks(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  float blk[32];
  uint8_t q[32];
#define FILL(v, c)                                                                            \
  for (int k = 0; k < 32; k++) blk[k] = (v), q[k] = (c)

  /* one outlier: 1000 among 1.0 -> 1000/448 = 2.23 -> scale 4 (e 129); 1000/4 = 250 -> 256 (0x78),
     1/4 -> 0.25 (0x28) */
  FILL(1.0f, 0x28);
  blk[7] = 1000.0f, q[7] = 0x78;
  blk[8] = -1.0f, q[8] = 0xA8;
  hand_block(ctx, 0, blk, 129, q);

  /* all zeros (one -0): e = 0, elements keep their sign */
  FILL(0.0f, 0x00);
  blk[3] = -0.0f, q[3] = 0x80;
  hand_block(ctx, 0, blk, 0, q);

  /* FP32-subnormal-only block: amax 2^-130 -> t subnormal <= 2^-127 -> e = 0, mult 2^127:
     2^-130 -> 0.125 (0x20); 3*2^-135 -> 3*2^-8 = 6 E4M3 subnormal steps (0x06); -2^-130 -> 0xA0 */
  FILL(ldexpf(1.0f, -130), 0x20);
  blk[1] = ldexpf(3.0f, -135), q[1] = 0x06;
  blk[2] = -ldexpf(1.0f, -130), q[2] = 0xA0;
  hand_block(ctx, 0, blk, 0, q);

  /* E4M3-subnormal elements under a normal scale: amax 448 (e 127), 2^-9 -> 0x01, 2^-10 -> tie
     to even 0, 3*2^-10 -> tie to even 2 steps (0x02), 2^-12 -> 0 */
  FILL(ldexpf(1.0f, -9), 0x01);
  blk[0] = 448.0f, q[0] = 0x7E;
  blk[1] = ldexpf(1.0f, -10), q[1] = 0x00;
  blk[2] = ldexpf(3.0f, -10), q[2] = 0x02;
  blk[3] = ldexpf(1.0f, -12), q[3] = 0x00;
  hand_block(ctx, 0, blk, 127, q);

  /* NaN present: amax ignores it; 2.0 -> 2/448 -> 2^-7 (e 120) -> 256 (0x78); NaN -> 0x7F */
  FILL(2.0f, 0x78);
  blk[5] = NAN, q[5] = 0x7F;
  blk[6] = 1.0f, q[6] = 0x70; /* 128 */
  hand_block(ctx, 0, blk, 120, q);

  /* all NaN: amax 0 -> e 0, all 0x7F */
  FILL(NAN, 0x7F);
  hand_block(ctx, 0, blk, 0, q);

  /* +-Inf present: amax Inf -> e 0xFE (2^127), Inf -> +-max, finite values underflow to +-0,
     NaN stays NaN */
  FILL(1.0f, 0x00);
  blk[4] = INFINITY, q[4] = 0x7E;
  blk[9] = -INFINITY, q[9] = 0xFE;
  blk[10] = -1.0f, q[10] = 0x80;
  blk[11] = NAN, q[11] = 0x7F;
  blk[12] = FLT_MAX, q[12] = 0x40; /* (2 - 2^-23) * 2^127 * 2^-127 rounds to 2.0 (0x40) */
  hand_block(ctx, 0, blk, 0xFE, q);

  /* saturation edge: amax exactly 448 -> e 127, 448 -> 0x7E (no saturation needed), 440 ->
     nearest 448 (0x7E), 432 -> a tie of 416 (mantissa 5, odd) and 448 (mantissa 6) -> 448 */
  FILL(1.0f, 0x38);
  blk[0] = 448.0f, q[0] = 0x7E;
  blk[1] = 440.0f, q[1] = 0x7E;
  blk[2] = 432.0f, q[2] = 0x7E;
  hand_block(ctx, 0, blk, 127, q);

  /* one FP32 step above 448 -> e 128: 448.00003/2 = 224.00002 -> 224 (0x76); 1 -> 0.5 (0x30) */
  FILL(1.0f, 0x30);
  blk[0] = nextafterf(448.0f, 1e9f), q[0] = 0x76;
  hand_block(ctx, 0, blk, 128, q);

  /* amax 464 (OCP would saturate it to 448) -> e 128 -> 232, a tie of 224/240 -> even 224 */
  FILL(0.0f, 0x00);
  blk[31] = 464.0f, q[31] = 0x76;
  blk[30] = -464.0f, q[30] = 0xF6;
  hand_block(ctx, 0, blk, 128, q);

  /* E5M2: amax 57344 -> e 127 -> 0x7B; 500 -> 512 (0x60: exponent 24, mantissa 0;
     500 lies between 448 and 512, nearer 512); 1 -> 0x3C */
  FILL(1.0f, 0x3C);
  blk[0] = 57344.0f, q[0] = 0x7B;
  blk[1] = 500.0f, q[1] = 0x60;
  hand_block(ctx, 1, blk, 127, q);

  /* E5M2 amax 500 -> 500/57344 = 2^-6.84 -> 2^-6 (e 121) -> 32000 -> between 28672 and 32768
     (step 4096) -> 32768 = 2^15 (0x78) */
  FILL(0.0f, 0x00);
  blk[0] = 500.0f, q[0] = 0x78;
  hand_block(ctx, 1, blk, 121, q);
#undef FILL
  hq_ctx_destroy(ctx);
}

/* Outliers at known places: each lands in exactly the rowwise block of its row and 32-column
   group and in the columnwise block of its 32-row group and column -- every other block has the
   background's code. */
static void test_directions_pick_right_blocks(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t M = 128, K = 128;
  float *xf = malloc(M * K * sizeof *xf);
  for (int64_t i = 0; i < M * K; i++) xf[i] = 1.0f; /* 1/448 -> 2^-8 -> e 119 */
  struct { int64_t i, j; float v; unsigned e; } out[] = {
      {5, 70, 1024.0f, 129},       /* 1024/448 = 2.29 -> 2^2 */
      {100, 127, 1048576.0f, 139}, /* 2^20/448 -> 2^12 */
      {64, 0, -8.0f, 122},         /* 8/448 -> 2^-5 */
      {31, 31, 448.0f, 127},
      {32, 32, 3.0f, 120},         /* 3/448 = 2^-7.2 -> 2^-7 */
  };
  size_t no = sizeof out / sizeof out[0];
  for (size_t n = 0; n < no; n++) xf[out[n].i * K + out[n].j] = out[n].v;
  hq_tensor x = tensor_of(xf, HQ_F32, M, K);
  hq_recipe *r = mx_recipe(0, 0, 0);
  hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH);
  const uint8_t *rs = sbytes(qt, HQ_ROWWISE, 1);
  const uint8_t *cs = sbytes(qt, HQ_COLWISE, 1);
  for (int64_t i = 0; i < M; i++)
    for (int64_t kb = 0; kb < K / 32; kb++) {
      unsigned want = 119;
      for (size_t n = 0; n < no; n++)
        if (out[n].i == i && out[n].j / 32 == kb) want = out[n].e;
      assert_int_equal(rs[i * 4 + kb], want); /* compact stride roundup(4, 4) = 4 */
    }
  for (int64_t mb = 0; mb < M / 32; mb++)
    for (int64_t j = 0; j < K; j++) {
      unsigned want = 119;
      for (size_t n = 0; n < no; n++)
        if (out[n].i / 32 == mb && out[n].j == j) want = out[n].e;
      assert_int_equal(cs[mb * 128 + j], want); /* compact stride roundup(128, 128) */
    }
  /* an element's byte differs between the directions when only one block has an outlier:
     (5, 71) is 1.0 next to the 1024 in its row -> 1/4 -> 0x28 rowwise; its column has no outlier
     -> 1 * 2^8 = 256 -> 0x78 columnwise */
  assert_int_equal(sbytes(qt, HQ_ROWWISE, 0)[5 * K + 71], 0x28);
  assert_int_equal(sbytes(qt, HQ_COLWISE, 0)[5 * K + 71], 0x78);
  /* (6, 70) is 1.0 under the 1024 in its column -> 0x28 columnwise, 0x78 rowwise */
  assert_int_equal(sbytes(qt, HQ_ROWWISE, 0)[6 * K + 70], 0x78);
  assert_int_equal(sbytes(qt, HQ_COLWISE, 0)[6 * K + 70], 0x28);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  free(x.data);
  free(xf);
  hq_ctx_destroy(ctx);
}

// --- dequantize -------------------------------------------------------------------------------

/* Dequantize is exactly RN(fp8(q) * 2^(e-127)) in both directions and layouts; the error per
   element is within half an FP8 step (|x|/16 E4M3 normal range, |x|/8 E5M2; the subnormal step
   below that); bf16/f16 destinations hold the rounded FP32 result; the relative RMS error of an
   N(0,1) tensor is small. */
static void test_dequantize(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t M = 256, K = 256;
  hq_tensor x = hq_test_tensor(HQ_F32, M, K, 9, 1.0f);
  const float *xf = x.data;
  for (int kind = 0; kind < 2; kind++)
    for (int swz = 0; swz < 2; swz++) {
      hq_recipe *r = mx_recipe(kind, swz, 0);
      hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH);
      for (int d = 1; d <= 2; d++) {
        uint8_t *data = malloc((size_t)(M * K)), *codes = malloc((size_t)(M * K));
        ref_quantize(xf, M, K, kind, d, 0, data, codes);
        hq_tensor y = hq_test_empty(HQ_F32, M, K), yb = hq_test_empty(HQ_BF16, M, K);
        hq_tensor yh = hq_test_empty(HQ_F16, M, K);
        HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)d, &y));
        HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)d, &yb));
        HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)d, &yh));
        const float *yf = y.data;
        double num = 0, den = 0;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < K; j++) {
            int e = d == 1 ? codes[i * (K / 32) + j / 32] : codes[(i / 32) * K + j];
            double sinv = ldexp(1.0, e - 127);
            double want = ref_fp8_decode(data[i * K + j], kind) * sinv;
            float got = yf[i * K + j];
            if ((double)got != (double)(float)want)
              fail_msg("deq dir %d (%lld,%lld): %a want %a", d, (long long)i, (long long)j,
                       (double)got, want);
            assert_int_equal(((uint16_t *)yb.data)[i * K + j], hq_f32_to_bf16(got));
            assert_int_equal(((uint16_t *)yh.data)[i * K + j], hq_f32_to_f16(got));
            double xv = xf[i * K + j], err = fabs(xv - (double)got);
            double y_scaled = fabs(xv) / sinv;
            double min_normal = kind ? ldexp(1.0, -14) : ldexp(1.0, -6);
            double bound = y_scaled >= min_normal
                               ? fabs(xv) * (kind ? 0.125 : 0.0625)
                               : sinv * (kind ? ldexp(1.0, -17) : ldexp(1.0, -10));
            if (err > bound)
              fail_msg("error %g > bound %g at (%lld,%lld) x %a", err, bound, (long long)i,
                       (long long)j, xv);
            num += err * err;
            den += xv * xv;
          }
        double rel = sqrt(num / den);
        if (rel > (kind ? 0.07 : 0.035)) fail_msg("relative RMS %g (kind %d dir %d)", rel, kind, d);
        free(y.data);
        free(yb.data);
        free(yh.data);
        free(data);
        free(codes);
      }
      hq_qtensor_free(qt);
      hq_recipe_free(r);
    }
  free(x.data);
  hq_ctx_destroy(ctx);
}

/* raw_copy = bf16: each storage gains a third buffer, "raw" / "columnwise_raw" (role RAW, BF16
   [M, K], gathered by rows), holding bf16(code's value * 2^(e - 127)) from the reference
   quantization's codes, equal to what hq_dequantize writes into a BF16 tensor; an update rewrites
   it; a GEMM of such operands gives the bytes of the same operands without it. Every element
   kind, both scale layouts, 1-D and 2-D blocks, with NaN, Inf, zeros and subnormals. */
static void test_raw_copy(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t M = 96, K = 160;
  float *xf = gen(M, K, 41, -30, 30, 1), *xf2 = gen(M, K, 42, -10, 10, 0);
  hq_tensor x = tensor_of(xf, HQ_F32, M, K), x2 = tensor_of(xf2, HQ_F32, M, K);
  for (int kind = 0; kind < 2; kind++)
    for (int swz = 0; swz < 2; swz++)
      for (int two_d = 0; two_d < 2; two_d++) {
        char text[512];
        snprintf(text, sizeof text,
                 "[format mx]\nplugin = mxfp8\ndtype = %s\nswizzle = %s\nblock_2d = %s\n"
                 "raw_copy = bf16\n[format plain]\nplugin = mxfp8\ndtype = %s\n"
                 "swizzle = %s\nblock_2d = %s\n[role *:weight:*]\nrowwise = mx\n"
                 "columnwise = mx\n[role *:input:*]\nrowwise = plain\ncolumnwise = plain\n",
                 kind ? "e5m2" : "e4m3", swz ? "true" : "false", two_d ? "true" : "false",
                 kind ? "e5m2" : "e4m3", swz ? "true" : "false", two_d ? "true" : "false");
        hq_recipe *r = hq_test_recipe(text);
        hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH); /* the weight role: raw_copy */
        for (int pass = 0; pass < 2; pass++) {
          const float *src = pass ? xf2 : xf;
          if (pass) HQ_OK_OR_FAIL(hq_qtensor_update(qt, ctx, &x2));
          for (int d = 1; d <= 2; d++) {
            const hq_storage *st = storage(qt, (uint32_t)d);
            assert_int_equal(st->nbuf, 3);
            const hq_buffer *rb = hq_storage_cbuf(st, 2);
            assert_string_equal(rb->name, d == 1 ? "raw" : "columnwise_raw");
            assert_int_equal(rb->role, HQ_ROLE_RAW);
            assert_int_equal(rb->dtype, HQ_BF16);
            assert_int_equal(rb->ndim, 2);
            assert_int_equal(rb->shape[0], M);
            assert_int_equal(rb->shape[1], K);
            assert_int_equal(rb->gather, HQ_GATHER_ROWS);
            assert_int_equal(rb->m_div, 1);
            assert_int_equal(rb->bytes, (size_t)(M * K) * 2);
            const uint16_t *raw = rb->ptr;
            /* against the reference's codes and scales */
            uint8_t *data = malloc((size_t)(M * K)), *codes = malloc((size_t)(M * K));
            ref_quantize(src, M, K, kind, d, two_d, data, codes);
            for (int64_t i = 0; i < M; i++)
              for (int64_t j = 0; j < K; j++) {
                const int e = d == 1 ? codes[i * (K / 32) + j / 32] : codes[(i / 32) * K + j];
                const float want = hq_mul_rn((float)ref_fp8_decode(data[i * K + j], kind),
                                             hq_e8m0_to_f32((uint8_t)e));
                const uint16_t wb = hq_f32_to_bf16(want), gb = raw[i * K + j];
                if (wb != gb && !(hq_isnan(want) && (gb & 0x7f80u) == 0x7f80u && (gb & 0x7fu)))
                  fail_msg("kind %d swz %d 2d %d pass %d dir %d (%lld, %lld): raw %04x, want "
                           "%04x (%a)", kind, swz, two_d, pass, d, (long long)i, (long long)j,
                           gb, wb, (double)want);
              }
            /* and what the dequantize writes into BF16, byte for byte */
            hq_tensor yb = hq_test_empty(HQ_BF16, M, K);
            HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)d, &yb));
            assert_memory_equal(yb.data, raw, (size_t)(M * K) * 2);
            free(yb.data);
            free(data);
            free(codes);
          }
        }
        /* a GEMM reads the same values with and without the copy (the CPU path multiplies the
           F32 raw values; a device's emulated path reads the BF16 copy in place) */
        hq_quantizer *qi = hq_test_quantizer(r, "linear:input:x");
        HQ_OK_OR_FAIL(hq_quantizer_set_usage(qi, HQ_BOTH));
        hq_qtensor *xin = NULL;
        HQ_OK_OR_FAIL(hq_quantize(qi, ctx, &x2, &xin));
        hq_tensor y1 = hq_test_empty(HQ_F32, M, M), y2 = hq_test_empty(HQ_F32, M, M);
        HQ_OK_OR_FAIL(hq_linear_fprop(ctx, hq_operand_q(xin), hq_operand_q(qt), NULL, HQ_F32,
                                      &y1, NULL));
        HQ_OK_OR_FAIL(hq_linear_fprop(ctx, hq_operand_q(xin), hq_operand_q(xin), NULL, HQ_F32,
                                      &y2, NULL));
        assert_memory_equal(y1.data, y2.data, (size_t)(M * M) * sizeof(float));
        free(y1.data);
        free(y2.data);
        hq_qtensor_free(xin);
        hq_quantizer_free(qi);
        hq_qtensor_free(qt);
        hq_recipe_free(r);
      }
  /* without the option: two buffers, as before */
  hq_recipe *r0 = mx_recipe(0, 0, 0);
  hq_qtensor *q0 = quantize(r0, ctx, &x, HQ_BOTH);
  assert_int_equal(storage(q0, HQ_ROWWISE)->nbuf, 2);
  assert_int_equal(storage(q0, HQ_COLWISE)->nbuf, 2);
  hq_qtensor_free(q0);
  hq_recipe_free(r0);
  free(x.data);
  free(x2.data);
  free(xf);
  free(xf2);
  hq_ctx_destroy(ctx);
}

/* Special values survive dequantize as documented: NaN -> NaN, Inf -> +-max * 2^127. */
static void test_dequantize_specials(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  float xf[32 * 32] = {0};
  xf[0] = NAN;
  xf[1] = INFINITY;
  xf[2] = 3.0f;
  hq_tensor x = tensor_of(xf, HQ_F32, 32, 32);
  hq_recipe *r = mx_recipe(0, 1, 0);
  hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH);
  hq_tensor y = hq_test_empty(HQ_F32, 32, 32);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &y));
  const float *yf = y.data;
  assert_true(isnan(yf[0]));
  assert_true(isinf(yf[1])); /* 448 * 2^127 overflows FP32 */
  assert_true(yf[2] == 0.0f);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_COLWISE, &y));
  assert_true(isnan(yf[0]));
  assert_true(isinf(yf[1]));
  assert_true(yf[2] == 3.0f); /* column 2 has amax 3: 3/448 -> 2^-7, 3*128 = 384 exact */
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  free(x.data);
  free(y.data);
  hq_ctx_destroy(ctx);
}

// --- lifecycle ----------------------------------------------------------------------------------

/* The instance's facts (REQUANT_SAFE, one fused call for both directions), and make_empty zeroes
   the scale buffers. */
static void test_make_empty(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  hq_recipe *r = mx_recipe(0, 1, 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  assert_int_equal(hq_quantizer_requant_safe(q), 1);
  assert_int_equal(hq_quantizer_fused(q), 1);
  hq_qtensor *e = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 96, 160, HQ_F32, &e));
  for (uint32_t d = 1; d <= 2; d++) {
    const hq_buffer *s = sbuf(e, d, 1);
    for (size_t i = 0; i < s->bytes; i++) assert_int_equal(((uint8_t *)s->ptr)[i], 0);
  }
  hq_qtensor_free(e);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* An update in place (hq_qtensor_update) writes the reference's codes and scales, for every
   option set and usage (that it equals a fresh quantize byte for byte: test_conformance). The
   sources: bf16 with scale padding, f32 over more than one column tile, and f16 of 65536
   elements, where a fresh quantize may decode through a cached table but an update must not
   allocate. */
static void test_update_matches_reference(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  struct { hq_dtype t; int64_t M, K; } srcs[] = {
      {HQ_BF16, 96, 160}, {HQ_F32, 64, 1056}, {HQ_F16, 256, 256}};
  for (size_t n = 0; n < sizeof srcs / sizeof srcs[0]; n++) {
    const int64_t M = srcs[n].M, K = srcs[n].K;
    hq_tensor x = hq_test_tensor(srcs[n].t, M, K, 40 + n, 3.0f);
    hq_tensor y = hq_test_tensor(srcs[n].t, M, K, 50 + n, 0.01f);
    float *yf = malloc((size_t)(M * K) * sizeof *yf);
    for (int64_t i = 0; i < M * K; i++) yf[i] = hq_load_hp(y.data, i, srcs[n].t);
    for (int kind = 0; kind < 2; kind++)
      for (int swz = 0; swz < 2; swz++)
        for (int two_d = 0; two_d < 2; two_d++) {
          hq_recipe *r = mx_recipe(kind, swz, two_d);
          for (uint32_t usage = 1; usage <= 3; usage++) {
            hq_qtensor *a = quantize(r, ctx, &x, usage);
            HQ_OK_OR_FAIL(hq_qtensor_update(a, ctx, &y));
            for (uint32_t d = 1; d <= 2; d++)
              if (usage & d) check_dir(a, yf, M, K, kind, swz, two_d, d);
            hq_qtensor_free(a);
          }
          hq_recipe_free(r);
        }
    free(yf);
    free(x.data);
    free(y.data);
  }
  hq_ctx_destroy(ctx);
}

// --- options and the module itself ------------------------------------------------------------

static void test_options(void **state) {
  (void)state;
  hq_recipe *r = mx_recipe(1, 1, 0);
  const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), "mxfp8");
  assert_non_null(p);
  uint64_t caps = hq_plugin_caps(p);
  const uint64_t cuda_caps = HQ_CAP_CUDA | HQ_CAP_FUSED_ADAM | HQ_CAP_ADAM_KDEV;
  assert_int_equal(caps, HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY |
                             (hq_built_with_cuda() ? cuda_caps : 0));
  const hq_option *o = hq_plugin_options(p);
  const char *names[] = {"dtype", "swizzle", "block_2d", "raw_copy"};
  const char *defs[] = {"e4m3", "false", "false", "none"};
  for (int i = 0; i < 4; i++) {
    assert_string_equal(o[i].name, names[i]);
    assert_string_equal(o[i].def, defs[i]);
    assert_true(o[i].help && strlen(o[i].help) > 10 && !strchr(o[i].help, '\n'));
  }
  assert_null(o[4].name);
  hq_recipe_free(r);

  /* bad values are recipe errors, one each, naming the line and the value */
  const char *bad[] = {"[format mx]\nplugin = mxfp8\ndtype = e2m1\n",
                       "[format mx]\nplugin = mxfp8\nswizzle = maybe\n",
                       "[format mx]\nplugin = mxfp8\nblock_size = 16\n",
                       "[format mx]\nplugin = mxfp8\nraw_copy = f16\n"};
  const char *why[] = {"bad.ini:3: option 'dtype' (enum) of format 'mx': 'e2m1' is not one of",
                       "bad.ini:3: option 'swizzle' (bool) of format 'mx': 'maybe' is not a bool",
                       "bad.ini:3: unknown option 'block_size' for plugin 'mxfp8'",
                       "bad.ini:3: option 'raw_copy' (enum) of format 'mx': 'f16' is not one of"};
  for (int i = 0; i < 4; i++) {
    hq_recipe_opts ro = {0};
    ro.struct_size = sizeof ro;
    ro.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
    hq_recipe *rr = NULL;
    HQ_OK_OR_FAIL(hq_recipe_parse_string(bad[i], "bad.ini", &ro, &rr));
    assert_int_equal(hq_recipe_error_count(rr), 1);
    if (!strstr(hq_recipe_error(rr, 0), why[i]))
      fail_msg("'%s' lacks '%s'", hq_recipe_error(rr, 0), why[i]);
    hq_recipe_free(rr);
  }
}

// --- the module called directly ---------------------------------------------------------------

/* Load the module (from $HQ_PLUGIN_PATH) with the test host table. */
static const hq_format_ops *load_ops(hq_host_api *host) {
  hq_format_entry_fn entry = hq_test_module_entry("mxfp8");
  *host = hq_test_host();
  const hq_format_ops *ops = entry(host);
  assert_non_null(ops);
  return ops;
}

/* A configured instance: kind (0 e4m3, 1 e5m2), swizzle, block_2d (the option table's order),
   raw_copy none. configure() reads one value per option of the table: as many as it has. */
static void *direct_cfg(const hq_format_ops *ops, const hq_host_api *host, int kind, int swz,
                        int two_d) {
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  size_t nopt = 0;
  while (ops->options[nopt].name) nopt++;
  assert_int_equal(nopt, 4);
  hq_optval v[4] = {{kind, 0, NULL}, {swz, 0, NULL}, {two_d, 0, NULL}, {0, 0, NULL}};
  assert_int_equal(ops->configure(cfg, v, host), HQ_OK);
  return cfg;
}

/* A storage as the core makes one: hq_test_storage_init, layout(), then every buffer allocated
   here (poisoned), its bytes computed from dtype and shape. */
static void direct_storage(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                           hq_storage *s, uint32_t dir, uint32_t dirs, int64_t M, int64_t K) {
  hq_test_storage_init(s, dir, M, K, HQ_F32);
  int rc = ops->layout(cfg, host, M, K, dir, dirs, s);
  if (rc) fail_msg("layout -> %d: %s", rc, hq_test_module_error());
  for (uint32_t i = 0; i < s->nbuf; i++) {
    hq_buffer *b = hq_storage_buf(s, i);
    size_t n = hq_dtype_size(b->dtype);
    for (int k = 0; k < b->ndim; k++) n *= (size_t)b->shape[k];
    b->bytes = n;
    b->ptr = malloc(n ? n : 1);
    memset(b->ptr, 0xA5, n);
  }
}

static void direct_free(hq_storage *s) {
  for (uint32_t i = 0; i < s->nbuf; i++) {
    free(hq_storage_buf(s, i)->ptr);
    hq_storage_buf(s, i)->ptr = NULL;
  }
}

/* A quantize (or, with HQ_CALL_UPDATE, an update) as the core makes it: call->scratch of
   scratch_size() bytes (poisoned), or none with no_scratch. */
static int direct_quantize(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                           const hq_tensor *x, uint32_t dirs, hq_storage *row, hq_storage *col,
                           uint32_t flags, int no_scratch) {
  size_t ns = ops->scratch_size(cfg, x->rows, x->cols, dirs, HQ_DEVICE_HOST);
  void *scratch = no_scratch || !ns ? NULL : malloc(ns);
  if (scratch) memset(scratch, 0xA5, ns);
  hq_call call = hq_test_call(host, 0, 0);
  call.flags = flags;
  call.scratch = scratch;
  call.scratch_bytes = scratch ? ns : 0;
  hq_test_module_error()[0] = 0;
  int rc = ops->quantize(cfg, &call, x, dirs, row, col);
  free(scratch);
  return rc;
}

static int direct_dequantize(const hq_format_ops *ops, const void *cfg, const hq_host_api *host,
                             const hq_storage *s, hq_tensor *y) {
  hq_call call = hq_test_call(host, 0, 0);
  hq_test_module_error()[0] = 0;
  return ops->dequantize(cfg, &call, s, y);
}

/* The storage's bytes against the reference quantization of xf (kind, two_d from the instance
   that wrote it; the scale layout swz). */
static void check_direct(const hq_storage *s, const float *xf, int kind, int swz, int two_d) {
  const int64_t M = s->rows, K = s->cols;
  int d = s->dir == HQ_ROWWISE ? 1 : 2;
  uint8_t *data = malloc((size_t)(M * K)), *codes = malloc((size_t)(M * K));
  ref_quantize(xf, M, K, kind, d, two_d, data, codes);
  size_t nb;
  uint8_t *want = ref_dir_scales(codes, M, K, d, swz, &nb);
  assert_int_equal(hq_storage_cbuf(s, 1)->bytes, nb);
  assert_memory_equal(hq_storage_cbuf(s, 0)->ptr, data, (size_t)(M * K));
  assert_memory_equal(hq_storage_cbuf(s, 1)->ptr, want, nb);
  free(want);
  free(codes);
  free(data);
}

/* What the core never lets through: a CUDA-device call, layout() on its own, storages that do
   not match their tensor or are not MXFP8 layouts, a fused call over two storages that disagree,
   and the ops table's identity (ABI 2.1: entry hq_format_module_v2, required minor 1). */
static void test_module_direct(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  char *host_msg = hq_test_module_error();
  assert_string_equal(ops->name, "mxfp8");
  assert_string_equal(ops->version, hq_version());
  assert_int_equal(ops->abi_major, 2);
  assert_int_equal(ops->abi_minor, 1);
  assert_true(ops->struct_size >= HQ_FORMAT_OPS_SIZE_2_1);
  assert_null(ops->tensor_factor); /* no per-tensor factor */
  assert_null(ops->gemm); /* native GEMMs are gemm/cublaslt's, by the descriptors */
  assert_null(ops->amax_kind); /* no per-tensor amax */
  assert_null(ops->amax);
  assert_null(ops->update);    /* quantize serves updates */
  assert_non_null(ops->scratch_size);
  assert_non_null(ops->make_empty);
  /* a core of another major is refused */
  hq_host_api other = host;
  other.abi_major = 1;
  assert_null(hq_test_module_entry("mxfp8")(&other));

  /* configure e4m3, swizzle, no 2-D, then describe storages */
  void *cfg = direct_cfg(ops, &host, 0, 1, 0);
  hq_storage row, col;
  hq_test_storage_init(&row, HQ_ROWWISE, 64, 97, HQ_F32);
  assert_int_equal(ops->layout(cfg, &host, 64, 96 + 1, HQ_ROWWISE, HQ_BOTH, &row), HQ_ESHAPE);
  assert_string_equal(host_msg, "mxfp8: cols = 97 is not a multiple of 32");
  hq_test_storage_init(&col, HQ_COLWISE, 100, 64, HQ_F32);
  assert_int_equal(ops->layout(cfg, &host, 100, 64, HQ_COLWISE, HQ_COLWISE, &col), HQ_ESHAPE);
  assert_string_equal(host_msg, "mxfp8: rows = 100 is not a multiple of 32");
  direct_storage(ops, cfg, &host, &row, HQ_ROWWISE, HQ_BOTH, 64, 64);
  assert_int_equal(hq_storage_cbuf(&row, 0)->bytes, 64 * 64);
  assert_int_equal(hq_storage_cbuf(&row, 1)->bytes, 128 * 4);
  static float xs[64 * 64];
  memset(xs, 0, sizeof xs);
  hq_tensor x = hq_tensor_2d(xs, HQ_F32, 0, 64, 64); /* on CUDA device 0 */
  hq_call call = hq_test_call(&host, 0, 0);
  call.device = 0;
  if (!hq_built_with_cuda()) { /* a CUDA build runs these on the device (tests/test_gpu_mxfp8.c) */
    host_msg[0] = 0;
    assert_int_equal(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_ENOTSUP);
    assert_non_null(strstr(host_msg, "CUDA device 0 is not supported"));
    host_msg[0] = 0;
    assert_int_equal(ops->dequantize(cfg, &call, &row, &x), HQ_ENOTSUP);
    assert_non_null(strstr(host_msg, "not supported"));
    host_msg[0] = 0;
    assert_int_equal(ops->make_empty(cfg, &call, &row), HQ_ENOTSUP);
    assert_non_null(strstr(host_msg, "not supported"));
  }
  assert_int_equal(ops->scratch_size(cfg, 64, 64, HQ_BOTH, 0), 0);

  /* on the host it works and writes every scale byte, the padding too (here into a poisoned
     buffer make_empty never saw) */
  x.device = HQ_DEVICE_HOST;
  for (int i = 0; i < 64 * 64; i++) xs[i] = (i % 64 == 3) ? -5.0f : 1.0f;
  direct_storage(ops, cfg, &host, &col, HQ_COLWISE, HQ_BOTH, 64, 64);
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_BOTH, &row, &col, 0, 0), HQ_OK);
  check_direct(&row, xs, 0, 1, 0);
  check_direct(&col, xs, 0, 1, 0);

  /* the fused optimizer step (ABI 2.2) comes only with an update on a CUDA device: on the host,
     or with a plain quantize, it is refused with a message and nothing is written */
  {
    static float g[64 * 64], m[64 * 64], v[64 * 64];
    hq_adam_pass pass = hq_test_adam_pass(g, m, v);
    hq_call ac = hq_test_call(&host, 0, 0);
    ac.flags = HQ_CALL_UPDATE;
    ac.adam = &pass;
    const uint8_t before = ((const uint8_t *)hq_storage_cbuf(&row, 0)->ptr)[0];
    host_msg[0] = 0;
    assert_int_equal(ops->quantize(cfg, &ac, &x, HQ_ROWWISE, &row, NULL), HQ_EINVAL);
    assert_non_null(strstr(host_msg, "fused optimizer step"));
    assert_int_equal(((const uint8_t *)hq_storage_cbuf(&row, 0)->ptr)[0], before);
  }

  /* a mismatched or broken storage is refused, not overrun */
  hq_tensor big = hq_tensor_2d(xs, HQ_F32, HQ_DEVICE_HOST, 32, 128);
  assert_int_equal(direct_quantize(ops, cfg, &host, &big, HQ_ROWWISE, &row, NULL, 0, 0),
                   HQ_ESHAPE);
  assert_int_equal(direct_dequantize(ops, cfg, &host, &row, &big), HQ_ESHAPE);
  hq_storage_buf(&row, 1)->bytes = 16;
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_ROWWISE, &row, NULL, 0, 0), HQ_EINVAL);
  hq_storage_buf(&row, 1)->bytes = 128 * 4;
  float ys[64 * 64];
  hq_tensor y = hq_tensor_2d(ys, HQ_F32, HQ_DEVICE_HOST, 64, 64);
  hq_storage bad = row;
  bad.desc.scale_mode = HQ_SCALE_VEC16_UE4M3;
  assert_int_equal(direct_dequantize(ops, cfg, &host, &bad, &y), HQ_EINVAL);
  assert_non_null(strstr(host_msg, "descriptor"));
  bad = row;
  bad.desc.elem = HQ_E5M2; /* the data buffer is e4m3 */
  assert_int_equal(direct_dequantize(ops, cfg, &host, &bad, &y), HQ_EINVAL);
  bad = row;
  bad.desc.block_m = 16;
  assert_int_equal(direct_dequantize(ops, cfg, &host, &bad, &y), HQ_EINVAL);
  bad = row;
  bad.desc.scale_layout = HQ_SCALE_LAYOUT_BLOCK_MAJOR; /* columnwise's compact layout */
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_ROWWISE, &bad, NULL, 0, 0), HQ_EINVAL);
  bad = row;
  hq_storage_buf(&bad, 0)->role = HQ_ROLE_OTHER;
  assert_int_equal(direct_dequantize(ops, cfg, &host, &bad, &y), HQ_EINVAL);
  bad = row;
  bad.dir = HQ_COLWISE;
  assert_int_equal(direct_dequantize(ops, cfg, &host, &bad, &y), HQ_EINVAL);
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_COLWISE, NULL, &bad, 0, 0), HQ_EINVAL);
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, 0, &row, &col, 0, 0), HQ_EINVAL);
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, 4, &row, &col, 0, 0), HQ_EINVAL);
  /* a fused call over storages of different element dtypes (made by different instances) */
  void *cfg5 = direct_cfg(ops, &host, 1, 1, 0);
  hq_storage col5;
  direct_storage(ops, cfg5, &host, &col5, HQ_COLWISE, HQ_BOTH, 64, 64);
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_BOTH, &row, &col5, 0, 0), HQ_EINVAL);
  assert_non_null(strstr(host_msg, "differ"));
  /* ... one direction at a time each is written as its storage says */
  assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_COLWISE, NULL, &col5, 0, 0), HQ_OK);
  check_direct(&col5, xs, 1, 1, 0);
  direct_free(&col5);
  direct_free(&row);
  direct_free(&col);
  free(cfg5);
  free(cfg);
}

/* Scratch and updates: scratch_size() is a 32-row FP32 tile at most 512 columns wide; an update
   (HQ_CALL_UPDATE) runs on call->scratch alone -- host->alloc, which refuses during an update, is
   never called, even for an f16 source large enough for the f16 table -- and writes the same
   bytes as a quantize; without scratch an update is refused before anything is written, while a
   plain quantize falls back to host->alloc. */
static void test_direct_scratch_and_update(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  char *host_msg = hq_test_module_error();
  void *cfg = direct_cfg(ops, &host, 1, 0, 0);
  assert_int_equal(ops->scratch_size(cfg, 64, 64, HQ_BOTH, HQ_DEVICE_HOST), 32 * 64 * 4);
  assert_int_equal(ops->scratch_size(cfg, 32, 4096, HQ_ROWWISE, HQ_DEVICE_HOST), 32 * 512 * 4);
  assert_int_equal(ops->scratch_size(cfg, 64, 1056, HQ_COLWISE, HQ_DEVICE_HOST), 32 * 512 * 4);
  assert_int_equal(ops->scratch_size(cfg, 0, 64, HQ_BOTH, HQ_DEVICE_HOST), 0);
  const int64_t M = 256, K = 256; /* 65536 f16 elements: the size that uses the table */
  hq_tensor x = hq_test_tensor(HQ_F16, M, K, 71, 4.0f);
  hq_tensor x2 = hq_test_tensor(HQ_F16, M, K, 72, 0.5f);
  float *xf = malloc((size_t)(M * K) * sizeof *xf);
  for (int64_t i = 0; i < M * K; i++) xf[i] = hq_load_hp(x.data, i, HQ_F16);
  for (int two_d = 0; two_d < 2; two_d++) {
    void *c = direct_cfg(ops, &host, 1, 0, two_d);
    hq_storage fr, fc, ur, uc;
    direct_storage(ops, c, &host, &fr, HQ_ROWWISE, HQ_BOTH, M, K);
    direct_storage(ops, c, &host, &fc, HQ_COLWISE, HQ_BOTH, M, K);
    direct_storage(ops, c, &host, &ur, HQ_ROWWISE, HQ_BOTH, M, K);
    direct_storage(ops, c, &host, &uc, HQ_COLWISE, HQ_BOTH, M, K);
    /* a plain quantize without scratch: host->alloc */
    assert_int_equal(direct_quantize(ops, c, &host, &x, HQ_BOTH, &fr, &fc, 0, 1), HQ_OK);
    check_direct(&fr, xf, 1, 0, two_d);
    check_direct(&fc, xf, 1, 0, two_d);
    /* updates: first of other values, then of x; no allocation attempted */
    assert_int_equal(direct_quantize(ops, c, &host, &x2, HQ_BOTH, &ur, &uc, HQ_CALL_UPDATE, 0),
                     HQ_OK);
    assert_string_equal(host_msg, "");
    uint8_t *before = malloc(hq_storage_cbuf(&ur, 1)->bytes);
    memcpy(before, hq_storage_cbuf(&ur, 1)->ptr, hq_storage_cbuf(&ur, 1)->bytes);
    assert_int_equal(direct_quantize(ops, c, &host, &x, HQ_ROWWISE, &ur, NULL, HQ_CALL_UPDATE, 1),
                     HQ_EINVAL);
    assert_non_null(strstr(host_msg, "scratch"));
    assert_memory_equal(hq_storage_cbuf(&ur, 1)->ptr, before, hq_storage_cbuf(&ur, 1)->bytes);
    free(before);
    assert_int_equal(direct_quantize(ops, c, &host, &x, HQ_BOTH, &ur, &uc, HQ_CALL_UPDATE, 0),
                     HQ_OK);
    assert_string_equal(host_msg, "");
    for (uint32_t i = 0; i < 2; i++) {
      assert_memory_equal(hq_storage_cbuf(&ur, i)->ptr, hq_storage_cbuf(&fr, i)->ptr,
                          hq_storage_cbuf(&fr, i)->bytes);
      assert_memory_equal(hq_storage_cbuf(&uc, i)->ptr, hq_storage_cbuf(&fc, i)->ptr,
                          hq_storage_cbuf(&fc, i)->bytes);
    }
    direct_free(&fr);
    direct_free(&fc);
    direct_free(&ur);
    direct_free(&uc);
    free(c);
  }
  free(xf);
  free(x.data);
  free(x2.data);
  free(cfg);
}

/* A storage is read as it describes itself. Quantize with instance A (every element dtype,
   swizzle, 1-D or 2-D): A's dequantize equals the reference RN(fp8(q) * 2^(e-127)). Quantizing
   with another instance B into A's storages writes A's bytes (the layout is the storage's, the
   instance is only what layout() consults). That every other instance dequantizes A's storage
   to the same values: test_conformance. */
static void test_cross_instance_storages(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  const int cfgs[][3] = {{0, 1, 0}, {1, 0, 1}, {0, 0, 0}, {1, 1, 1}, {0, 0, 1}, {1, 1, 0}};
  const int nc = (int)(sizeof cfgs / sizeof cfgs[0]);
  const int64_t shapes[][2] = {{96, 160}, {160, 544}};
  for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
    const int64_t M = shapes[n][0], K = shapes[n][1];
    float *xf = gen(M, K, 500 + n, -20, 20, 1);
    hq_tensor x = tensor_of(xf, HQ_F32, M, K);
    for (int a = 0; a < nc; a++) {
      const int kind = cfgs[a][0], swz = cfgs[a][1], two_d = cfgs[a][2];
      void *ca = direct_cfg(ops, &host, kind, swz, two_d);
      hq_storage st[2];
      direct_storage(ops, ca, &host, &st[0], HQ_ROWWISE, HQ_BOTH, M, K);
      direct_storage(ops, ca, &host, &st[1], HQ_COLWISE, HQ_BOTH, M, K);
      assert_int_equal(direct_quantize(ops, ca, &host, &x, HQ_BOTH, &st[0], &st[1], 0, 0), HQ_OK);
      for (int d = 0; d < 2; d++) {
        check_direct(&st[d], xf, kind, swz, two_d);
        /* A's own dequantize against the reference decode */
        uint8_t *data = malloc((size_t)(M * K)), *codes = malloc((size_t)(M * K));
        ref_quantize(xf, M, K, kind, d + 1, two_d, data, codes);
        hq_tensor ya = hq_test_empty(HQ_F32, M, K);
        assert_int_equal(direct_dequantize(ops, ca, &host, &st[d], &ya), HQ_OK);
        const float *yf = ya.data;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < K; j++) {
            int e = d == 0 ? codes[i * (K / 32) + j / 32] : codes[(i / 32) * K + j];
            float want = (float)(ref_fp8_decode(data[i * K + j], kind) * ldexp(1.0, e - 127));
            float got = yf[i * K + j];
            int ok = isnan(want) ? isnan(got) != 0
                                 : got == want && signbit(got) == signbit(want);
            if (!ok)
              fail_msg("cfg %d dir %d (%lld,%lld): %a, want %a", a, d + 1, (long long)i,
                         (long long)j, (double)got, (double)want);
          }
        free(ya.data);
        free(data);
        free(codes);
      }
      /* B quantizing into A's storages writes what A wrote */
      const int b = (a + 1) % nc;
      void *cb = direct_cfg(ops, &host, cfgs[b][0], cfgs[b][1], cfgs[b][2]);
      for (int d = 0; d < 2; d++)
        for (uint32_t i = 0; i < 2; i++) memset(hq_storage_buf(&st[d], i)->ptr, 0xA5,
                                                 hq_storage_buf(&st[d], i)->bytes);
      assert_int_equal(direct_quantize(ops, cb, &host, &x, HQ_BOTH, &st[0], &st[1], 0, 0), HQ_OK);
      check_direct(&st[0], xf, kind, swz, two_d);
      check_direct(&st[1], xf, kind, swz, two_d);
      free(cb);
      direct_free(&st[0]);
      direct_free(&st[1]);
      free(ca);
    }
    free(x.data);
    free(xf);
  }
}

// --- ABI 2.1: raw dequantize, emul dtype, the gemm op, hq_gemm on the host -------------------

/* A host storage of direction dir of an [M, K] tensor laid out by the instance (kind, swz=0,
   two_d=0), buffers zeroed; the caller writes its bytes by hand. */
static void hand_storage(const hq_format_ops *ops, const hq_host_api *host, void **cfg,
                         hq_storage *s, uint32_t dir, int kind, int64_t M, int64_t K) {
  *cfg = direct_cfg(ops, host, kind, 0, 0);
  direct_storage(ops, *cfg, host, s, dir, dir, M, K);
  for (uint32_t i = 0; i < s->nbuf; i++)
    memset(hq_storage_buf(s, i)->ptr, 0, hq_storage_buf(s, i)->bytes);
}

static int direct_dequantize_flags(const hq_format_ops *ops, const void *cfg,
                                   const hq_host_api *host, const hq_storage *s, hq_tensor *y,
                                   uint32_t flags) {
  hq_call call = hq_test_call(host, 0, 0);
  call.flags = flags;
  hq_test_module_error()[0] = 0;
  return ops->dequantize(cfg, &call, s, y);
}

/* The same float, bit for bit (NaN: any NaN). */
static int same_value(float got, float want) {
  if (isnan(want)) return isnan(got) != 0;
  return got == want && !signbit(got) == !signbit(want);
}

/* Raw dequantize (HQ_CALL_DEQ_RAW) of hand-built storages: rows of the worked example of
   docs/formats.md 4.3 (e = 0x79), the bottom of the scale range (e = 0: 2^-127) and its top
   (e = 0xFE: 2^127), in the rowwise and (transposed into column 0) the columnwise storage. The
   values are fp8(q) * 2^(e-127) as computed by hand; in BF16 the ones below 2^-133 (BF16's
   smallest subnormal) are rounded: the documented far-underflow edge. The raw values are the
   dequantized ones (no per-tensor factor, no transform). */
static void test_raw_dequantize_hand(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  const int64_t M = 32, K = 32;
  static const struct {
    int i;           /* row (rowwise) / column-0 row (columnwise) */
    int k;           /* element along the block */
    uint8_t q;
    float f32, bf16; /* expected raw value, and its BF16 */
  } cells[] = {
      {0, 0, 0xF3, -2.75f, -2.75f},     {0, 1, 0xF2, -2.5f, -2.5f},
      {0, 2, 0xF0, -2.0f, -2.0f},       {0, 6, 0xE6, -0.875f, -0.875f},
      {0, 8, 0xDA, -0.3125f, -0.3125f}, {0, 9, 0x00, 0.0f, 0.0f},
      {0, 10, 0x5A, 0.3125f, 0.3125f},  {0, 31, 0x7D, 6.5f, 6.5f},
      /* e = 0: 2^-127 times the E4M3 subnormal 2^-9, the smallest normal 2^-6, 1.125 * 2^-6,
         the max 448 */
      {1, 0, 0x01, 0x1p-136f, 0.0f},     {1, 1, 0x08, 0x1p-133f, 0x1p-133f},
      {1, 2, 0x09, 0x1.2p-133f, 0x1p-133f}, {1, 3, 0x7E, 0x1.cp-119f, 0x1.cp-119f},
      {1, 4, 0x88, -0x1p-133f, -0x1p-133f}, {1, 5, 0x0C, 0x1.8p-133f, 0x1p-132f}, /* tie: even */
      /* e = 0xFE: 2^127 */
      {2, 0, 0x38, 0x1p127f, 0x1p127f},  {2, 1, 0x7E, INFINITY, INFINITY},
      {2, 2, 0xFE, -INFINITY, -INFINITY}, {2, 3, 0x7F, NAN, NAN},
      {2, 4, 0x30, 0x1p126f, 0x1p126f},
  };
  static const uint8_t codes[3] = {0x79, 0x00, 0xFE};
  for (int dir = 1; dir <= 2; dir++) {
    void *cfg;
    hq_storage s;
    hand_storage(ops, &host, &cfg, &s, (uint32_t)dir, 0, M, K);
    uint8_t *data = hq_storage_buf(&s, 0)->ptr, *sc = hq_storage_buf(&s, 1)->ptr;
    /* rowwise (OUTER_MAJOR): cell (i, k) is element (i, k), its scale the byte i * roundup(K/32,
       4) + 0; columnwise (BLOCK_MAJOR): cell (i, k) is element (k, i) -- column i, row k -- its
       scale the byte (k / 32) * roundup(K, 128) + i */
    for (int r = 0; r < 3; r++) sc[dir == 1 ? r * 4 : r] = codes[r];
    for (size_t c = 0; c < sizeof cells / sizeof cells[0]; c++) {
      const int64_t i = dir == 1 ? cells[c].i : cells[c].k, j = dir == 1 ? cells[c].k : cells[c].i;
      data[i * K + j] = cells[c].q;
    }
    hq_tensor raw = hq_test_empty(HQ_F32, M, K), rawb = hq_test_empty(HQ_BF16, M, K);
    hq_tensor deq = hq_test_empty(HQ_F32, M, K);
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &s, &raw, HQ_CALL_DEQ_RAW), HQ_OK);
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &s, &rawb, HQ_CALL_DEQ_RAW), HQ_OK);
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &s, &deq, 0), HQ_OK);
    for (size_t c = 0; c < sizeof cells / sizeof cells[0]; c++) {
      const int64_t i = dir == 1 ? cells[c].i : cells[c].k, j = dir == 1 ? cells[c].k : cells[c].i;
      const float g = ((float *)raw.data)[i * K + j];
      const float gb = hq_load_hp(rawb.data, i * K + j, HQ_BF16);
      if (!same_value(g, cells[c].f32) || !same_value(gb, cells[c].bf16))
        fail_msg("dir %d cell %zu (q %02x, e %02x): raw %a / bf16 %a, want %a / %a", dir, c,
                 cells[c].q, codes[cells[c].i], (double)g, (double)gb, (double)cells[c].f32,
                 (double)cells[c].bf16);
    }
    /* raw and dequantized: the same bytes, everywhere */
    assert_memory_equal(raw.data, deq.data, (size_t)(M * K) * sizeof(float));
    /* a wrong storage is refused by the raw path too, naming it */
    hq_storage bad = s;
    bad.desc.scale_mode = HQ_SCALE_VEC16_UE4M3;
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &bad, &raw, HQ_CALL_DEQ_RAW),
                     HQ_EINVAL);
    assert_non_null(strstr(hq_test_module_error(), "raw dequantize"));
    free(raw.data);
    free(rawb.data);
    free(deq.data);
    direct_free(&s);
    free(cfg);
  }
}

/* The invariant of the per-tensor factor, which for MXFP8 is 1 (tensor_factor is NULL): the raw
   values equal the dequantized values byte for byte -- every instance, both directions, f32 /
   bf16 / f16 destinations, random data with NaN, Inf, zeros and subnormals. */
static void test_raw_equals_dequantize(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  const int64_t M = 96, K = 160;
  float *xf = gen(M, K, 77, -30, 30, 1);
  hq_tensor x = tensor_of(xf, HQ_F32, M, K);
  const hq_dtype outs[] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int c = 0; c < 8; c++) {
    const int kind = c & 1, swz = (c >> 1) & 1, two_d = c >> 2;
    void *cfg = direct_cfg(ops, &host, kind, swz, two_d);
    hq_storage st[2];
    direct_storage(ops, cfg, &host, &st[0], HQ_ROWWISE, HQ_BOTH, M, K);
    direct_storage(ops, cfg, &host, &st[1], HQ_COLWISE, HQ_BOTH, M, K);
    assert_int_equal(direct_quantize(ops, cfg, &host, &x, HQ_BOTH, &st[0], &st[1], 0, 0), HQ_OK);
    for (int d = 0; d < 2; d++)
      for (int o = 0; o < 3; o++) {
        hq_tensor a = hq_test_empty(outs[o], M, K), b = hq_test_empty(outs[o], M, K);
        assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &st[d], &a, HQ_CALL_DEQ_RAW),
                         HQ_OK);
        assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &st[d], &b, 0), HQ_OK);
        if (memcmp(a.data, b.data, (size_t)(M * K) * hq_dtype_size(outs[o])))
          fail_msg("cfg %d dir %d out %d: raw differs from dequantize", c, d + 1, (int)outs[o]);
        free(a.data);
        free(b.data);
      }
    direct_free(&st[0]);
    direct_free(&st[1]);
    free(cfg);
  }
  free(x.data);
  free(xf);
}

/* Is v (a double) exactly a BF16 value: 0, +-Inf, or 8 significant bits with its lowest bit at
   or above 2^-133 and |v| at most BF16's max (2 - 2^-7) * 2^127? */
static int bf16_exact(double v) {
  if (v == 0 || isinf(v)) return 1;
  double a = fabs(v);
  if (a > ldexp(255.0, 120)) return 0;
  int e;
  frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): the top bit is 2^(e-1) */
  int lsb = e - 8 > -133 ? e - 8 : -133;
  double scaled = ldexp(a, -lsb);
  return scaled == floor(scaled);
}

/* desc.emul_dtype is BF16: every raw value of every (element code, scale code) pair -- all 256
   FP8 codes times all 255 E8M0 codes, both element dtypes -- is written to a BF16 destination
   unchanged, except the documented far-underflow edge: values whose lowest bit lies below 2^-133
   (BF16's smallest subnormal), all of them below 2^-130 and only in blocks whose scale is at
   most 2^-125 (E4M3, e <= 2) or 2^-118 (E5M2, e <= 9), which BF16 rounds. The F32 raw values are
   fp8(q) * 2^(e-127), computed here in double. */
static void test_emul_dtype_bf16(void **state) {
  (void)state;
  hq_host_api host;
  const hq_format_ops *ops = load_ops(&host);
  const int64_t M = 256, K = 256;
  for (int kind = 0; kind < 2; kind++) {
    void *cfg;
    hq_storage s;
    hand_storage(ops, &host, &cfg, &s, HQ_ROWWISE, kind, M, K);
    assert_int_equal(s.desc.emul_dtype, HQ_BF16);
    uint8_t *data = hq_storage_buf(&s, 0)->ptr, *sc = hq_storage_buf(&s, 1)->ptr;
    for (int64_t i = 0; i < M; i++) {
      for (int64_t j = 0; j < K; j++) data[i * K + j] = (uint8_t)j;
      for (int64_t kb = 0; kb < K / 32; kb++) sc[i * 8 + kb] = (uint8_t)(i < 255 ? i : 127);
    }
    hq_tensor f = hq_test_empty(HQ_F32, M, K), b = hq_test_empty(HQ_BF16, M, K);
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &s, &f, HQ_CALL_DEQ_RAW), HQ_OK);
    assert_int_equal(direct_dequantize_flags(ops, cfg, &host, &s, &b, HQ_CALL_DEQ_RAW), HQ_OK);
    int64_t edge = 0, exact = 0;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < K; j++) {
        const int e = i < 255 ? (int)i : 127;
        const double want = ref_fp8_decode((unsigned)j, kind) * ldexp(1.0, e - 127);
        const float wf = fabs(want) > FLT_MAX ? (want > 0 ? INFINITY : -INFINITY) : (float)want;
        const float gf = ((float *)f.data)[i * K + j];
        const float gb = hq_load_hp(b.data, i * K + j, HQ_BF16);
        if (!same_value(gf, wf))
          fail_msg("kind %d q %02llx e %02x: raw %a, want %a", kind, (long long)j, e,
                   (double)gf, want);
        if (isnan(want)) {
          assert_true(isnan(gb));
        } else if (bf16_exact((double)wf)) {
          if (!same_value(gb, wf))
            fail_msg("kind %d q %02llx e %02x: bf16 %a, want %a", kind, (long long)j, e,
                     (double)gb, (double)wf);
          exact++;
        } else {
          /* only the far-underflow edge */
          if (!(fabs(want) < 0x1p-130) || e > (kind ? 9 : 2))
            fail_msg("kind %d q %02llx e %02x: %a is not exact in BF16 and not in the edge",
                     kind, (long long)j, e, want);
          edge++;
        }
      }
    /* the edge, counted by hand: a code whose lowest set bit is 2^L lands below 2^-133 for the
       scale exponents e - 127 < -133 - L, i.e. for e in [0, -7 - L]; summed over the codes of
       each sign, E4M3 (L from -9 up) gives 48 and E5M2 (L from -16 up) 220. Every other value
       but the NaN codes (2 of E4M3's 256, 6 of E5M2's) is exact: 256 rows of them. */
    assert_int_equal(edge, kind ? 2 * 220 : 2 * 48);
    assert_int_equal(exact, 256 * (kind ? 256 - 6 : 256 - 2) - edge);
    free(f.data);
    free(b.data);
    direct_free(&s);
    free(cfg);
  }
}

/* F64 reference of hq_gemm from the operands' hq_dequantize outputs. D row-major [n, m];
   op(A)(i, p) = ta ? A[i][p] : A[p][i], op(B)(p, j) = tb ? B[p][j] : B[j][p]. The tolerance is
   FP32 accumulation over k (plus the output dtype's rounding). */
static void check_gemm_f64(hq_ctx *ctx, const hq_qtensor *A, int ta, const hq_qtensor *B, int tb,
                           hq_dtype dt, float alpha, float beta, const char *what) {
  const int64_t A0 = hq_qtensor_rows(A), A1 = hq_qtensor_cols(A);
  const int64_t B0 = hq_qtensor_rows(B), B1 = hq_qtensor_cols(B);
  const int64_t m = ta ? A0 : A1, k = ta ? A1 : A0, n = tb ? B1 : B0;
  hq_tensor a = hq_test_empty(HQ_F32, A0, A1), b = hq_test_empty(HQ_F32, B0, B1);
  HQ_OK_OR_FAIL(hq_dequantize(A, ctx, ta ? HQ_ROWWISE : HQ_COLWISE, &a));
  HQ_OK_OR_FAIL(hq_dequantize(B, ctx, tb ? HQ_COLWISE : HQ_ROWWISE, &b));
  const float *af = a.data, *bf = b.data;
  hq_tensor d = hq_test_tensor(dt, n, m, 4242, 1.0f); /* D's old values, for beta */
  double *d0 = malloc((size_t)(n * m) * sizeof(double));
  for (int64_t t = 0; t < n * m; t++) d0[t] = hq_load_hp(d.data, t, dt);
  hq_gemm_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, alpha, beta, NULL,
                        &info));
  assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
  assert_string_equal(info.format_a, "mxfp8");
  assert_string_equal(info.format_b, "mxfp8");
  assert_int_equal(info.dir_a, ta ? HQ_ROWWISE : HQ_COLWISE);
  assert_int_equal(info.dir_b, tb ? HQ_COLWISE : HQ_ROWWISE);
  assert_int_equal(info.m, m);
  assert_int_equal(info.n, n);
  assert_int_equal(info.k, k);
  if (!strstr(info.reason, "host")) fail_msg("reason: %s", info.reason); /* the gemm op's answer */
  double worst = 0;
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        const double x = ta ? af[i * A1 + p] : af[p * A1 + i];
        const double y = tb ? bf[p * B1 + j] : bf[j * B1 + p];
        s += x * y;
        sa += fabs(x * y);
      }
      const double want = (double)alpha * s + (double)beta * d0[j * m + i];
      const double got = hq_load_hp(d.data, j * m + i, dt);
      double tol = (double)(k + 8) * 0x1p-23 * (fabs((double)alpha) * sa +
                                                fabs((double)beta * d0[j * m + i])) + 1e-30;
      if (dt == HQ_BF16) tol += 0x1p-7 * fabs(want); /* RN to 8 bits: at most 2^-8 relative */
      const double err = fabs(got - want);
      if (!(err <= tol))
        fail_msg("%s: D[%lld][%lld] = %.9g, F64 %.9g (err %g > tol %g)", what, (long long)j,
                 (long long)i, got, want, err, tol);
      if (err / tol > worst) worst = err / tol;
    }
  if (getenv("HQ_TEST_VERBOSE")) printf("%s: worst err/tol %.3g\n", what, worst);
  free(d0);
  free(d.data);
  free(a.data);
  free(b.data);
}

/* hq_gemm of two mxfp8 operands on a host context (the CPU path: raw values in F32, an sgemm):
   TN (fprop), NN (dgrad), NT (wgrad) and TT, e4m3 x e4m3 and e4m3 x e5m2, compact and swizzled
   scales, 1-D and 2-D blocks, f32 and bf16 D, beta 0 and 1, equal to the F64 product of the
   operands' hq_dequantize outputs within FP32 accumulation error. */
static void test_gemm_host(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t m = 64, n = 96, k = 160;
  for (int c = 0; c < 4; c++) {
    const int swz = c & 1, two_d = c >> 1;
    /* one recipe, two instances of the module: A from "a" (weights), B from "b" (inputs) */
    char text[512];
    snprintf(text, sizeof text,
             "[format a]\nplugin = mxfp8\nswizzle = %s\nblock_2d = %s\n"
             "[format b]\nplugin = mxfp8\nswizzle = %s\ndtype = %s\n"
             "[role linear:weight:*]\nrowwise = a\ncolumnwise = a\n"
             "[role linear:input:*]\nrowwise = b\ncolumnwise = b\n",
             swz ? "true" : "false", two_d ? "true" : "false", swz ? "true" : "false",
             c == 3 ? "e5m2" : "e4m3");
    hq_recipe *r = hq_test_recipe(text);
    hq_quantizer *qa = hq_test_quantizer(r, "linear:weight:w");
    hq_quantizer *qb = hq_test_quantizer(r, "linear:input:x");
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        float *xa = gen(ta ? m : k, ta ? k : m, 900 + (uint64_t)c, -4, 4, 0);
        float *xb = gen(tb ? k : n, tb ? n : k, 950 + (uint64_t)c, -6, 2, 0);
        hq_tensor ha = tensor_of(xa, HQ_F32, ta ? m : k, ta ? k : m);
        hq_tensor hb = tensor_of(xb, HQ_BF16, tb ? k : n, tb ? n : k);
        hq_qtensor *A = NULL, *B = NULL;
        HQ_OK_OR_FAIL(hq_quantize(qa, ctx, &ha, &A));
        HQ_OK_OR_FAIL(hq_quantize(qb, ctx, &hb, &B));
        char what[96];
        snprintf(what, sizeof what, "swz %d 2d %d e5m2 B %d, %c%c", swz, two_d, c == 3,
                 ta ? 'T' : 'N', tb ? 'T' : 'N');
        check_gemm_f64(ctx, A, ta, B, tb, HQ_F32, 1.0f, 0.0f, what);
        check_gemm_f64(ctx, A, ta, B, tb, (ta + tb) % 2 ? HQ_BF16 : HQ_F32, -0.75f, 1.0f, what);
        hq_qtensor_free(A);
        hq_qtensor_free(B);
        free(ha.data);
        free(hb.data);
        free(xa);
        free(xb);
      }
    hq_quantizer_free(qa);
    hq_quantizer_free(qb);
    hq_recipe_free(r);
  }
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_desc_buffers),
      cmocka_unit_test(test_shape_errors),
      cmocka_unit_test(test_reference_all_combinations),
      cmocka_unit_test(test_block_2d),
      cmocka_unit_test(test_hand_blocks),
      cmocka_unit_test(test_directions_pick_right_blocks),
      cmocka_unit_test(test_dequantize),
      cmocka_unit_test(test_dequantize_specials),
      cmocka_unit_test(test_make_empty),
      cmocka_unit_test(test_update_matches_reference),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_module_direct),
      cmocka_unit_test(test_direct_scratch_and_update),
      cmocka_unit_test(test_cross_instance_storages),
      cmocka_unit_test(test_raw_dequantize_hand),
      cmocka_unit_test(test_raw_equals_dequantize),
      cmocka_unit_test(test_raw_copy),
      cmocka_unit_test(test_emul_dtype_bf16),
      cmocka_unit_test(test_gemm_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
