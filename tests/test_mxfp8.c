/*
** test_mxfp8.c -- the mxfp8 plugin through the public API (recipes, quantizers, qtensors), plus
** a few direct calls into the loaded module (device refusal, layout messages). Every expectation
** is independent of the plugin: hand-computed codes, or the reference of mxfp8_ref.h (its own
** FP8 encoder, scale search and scale-layout writer). Buffers are allocated poisoned (0xA5) so
** that unwritten padding shows.
*/
#include <dlfcn.h>
#include <math.h>

#include "hq_test.h"
#include "mxfp8_ref.h"

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

static const hq_allocator poison = {poison_alloc, poison_free, NULL};

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
  size_t sbytes;
  uint8_t *want = ref_dir_scales(codes, M, K, d, swz, &sbytes);
  assert_int_equal(s->buf[0].bytes, (size_t)(M * K));
  assert_int_equal(s->buf[1].bytes, sbytes);
  const uint8_t *got = s->buf[0].ptr, *gs = s->buf[1].ptr;
  for (int64_t i = 0; i < M * K; i++)
    if (got[i] != data[i])
      fail_msg("%s data[%lld][%lld] = 0x%02x, want 0x%02x (x = %a, kind %d swz %d 2d %d)",
               d == 1 ? "rowwise" : "columnwise", (long long)(i / K), (long long)(i % K), got[i],
               data[i], (double)xf[i], kind, swz, two_d);
  for (size_t i = 0; i < sbytes; i++)
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

// --- layout -----------------------------------------------------------------------------------

static void check_buf(const hq_buffer *b, const char *name, hq_dtype t, int64_t d0, int64_t d1,
                      uint32_t flags) {
  assert_string_equal(b->name, name);
  assert_int_equal(b->dtype, t);
  assert_int_equal(b->ndim, 2);
  assert_int_equal(b->shape[0], d0);
  assert_int_equal(b->shape[1], d1);
  assert_int_equal(b->flags, flags);
}

/* Buffer names, order, dtypes, shapes (padded as FORMATS.md 2.3 says) and flags. */
static void test_layout_buffers(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  const int64_t shapes[][2] = {{96, 160}, {32, 32}, {256, 4096}, {160, 96}};
  for (int kind = 0; kind < 2; kind++)
    for (int swz = 0; swz < 2; swz++)
      for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
        int64_t M = shapes[n][0], K = shapes[n][1];
        hq_recipe *r = mx_recipe(kind, swz, 0);
        hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 1, 1.0f);
        hq_qtensor *qt = quantize(r, ctx, &x, HQ_BOTH);
        hq_dtype t = kind ? HQ_E5M2 : HQ_E4M3;
        const hq_storage *row = storage(qt, HQ_ROWWISE), *col = storage(qt, HQ_COLWISE);
        assert_int_equal(row->nbuf, 2);
        assert_int_equal(col->nbuf, 2);
        check_buf(&row->buf[0], "data", t, M, K, HQ_BUF_SHARDED);
        check_buf(&row->buf[1], "scale_inv", HQ_E8M0, ref_up(M, 128), ref_up(K / 32, 4),
                  HQ_BUF_SHARDED);
        check_buf(&col->buf[0], "columnwise_data", t, M, K, HQ_BUF_SHARDED);
        check_buf(&col->buf[1], "columnwise_scale_inv", HQ_E8M0, ref_up(M / 32, 4),
                  ref_up(K, 128), 0);
        assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE),
                         (size_t)(M * K + ref_up(M, 128) * ref_up(K / 32, 4)));
        assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE),
                         (size_t)(M * K + ref_up(M / 32, 4) * ref_up(K, 128)));
        hq_qtensor_free(qt);
        free(x.data);
        hq_recipe_free(r);
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
  /* 64 x 1056: more than one 512-column tile of the CPU loop, and a partial last one */
  const int64_t shapes[][2] = {{32, 32}, {96, 160}, {160, 96}, {256, 384}, {64, 1056}};
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
            assert_memory_equal(storage(qt, HQ_ROWWISE)->buf[0].ptr,
                                storage(qt, HQ_COLWISE)->buf[0].ptr, (size_t)(M * K));
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
    const uint8_t *rs = storage(qt, HQ_ROWWISE)->buf[1].ptr;
    const uint8_t *cs = storage(qt, HQ_COLWISE)->buf[1].ptr;
    const uint8_t *rd = storage(qt, HQ_ROWWISE)->buf[0].ptr;
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
  const uint8_t *rs = storage(a, HQ_ROWWISE)->buf[1].ptr, *rd = storage(a, HQ_ROWWISE)->buf[0].ptr;
  const uint8_t *cs = storage(b, HQ_COLWISE)->buf[1].ptr, *cd = storage(b, HQ_COLWISE)->buf[0].ptr;
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
  const uint8_t *rs = storage(qt, HQ_ROWWISE)->buf[1].ptr;
  const uint8_t *cs = storage(qt, HQ_COLWISE)->buf[1].ptr;
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
  assert_int_equal(((uint8_t *)storage(qt, HQ_ROWWISE)->buf[0].ptr)[5 * K + 71], 0x28);
  assert_int_equal(((uint8_t *)storage(qt, HQ_COLWISE)->buf[0].ptr)[5 * K + 71], 0x78);
  /* (6, 70) is 1.0 under the 1024 in its column -> 0x28 columnwise, 0x78 rowwise */
  assert_int_equal(((uint8_t *)storage(qt, HQ_ROWWISE)->buf[0].ptr)[6 * K + 70], 0x78);
  assert_int_equal(((uint8_t *)storage(qt, HQ_COLWISE)->buf[0].ptr)[6 * K + 70], 0x28);
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

static void copy_bytes(const hq_qtensor *qt, uint8_t **out, size_t *n) {
  size_t total = 0;
  for (uint32_t d = 1; d <= 2; d++)
    for (int b = 0; b < 2; b++) total += storage(qt, d)->buf[b].bytes;
  *out = malloc(total);
  *n = total;
  size_t k = 0;
  for (uint32_t d = 1; d <= 2; d++)
    for (int b = 0; b < 2; b++) {
      const hq_buffer *bb = &storage(qt, d)->buf[b];
      memcpy(*out + k, bb->ptr, bb->bytes);
      k += bb->bytes;
    }
}

/* Quantizing the same input twice gives the same bytes (REQUANT_SAFE); an update in place
   equals a fresh quantize of the new input; make_empty zeroes the scale buffers. */
static void test_requant_update_make_empty(void **state) {
  (void)state;
  hq_ctx *ctx = make_ctx();
  hq_recipe *r = mx_recipe(0, 1, 0);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  assert_true(hq_quantizer_requant_safe(q));
  assert_true(hq_quantizer_fused(q));
  hq_tensor x = hq_test_tensor(HQ_BF16, 96, 160, 21, 3.0f);
  hq_tensor y = hq_test_tensor(HQ_BF16, 96, 160, 22, 0.01f);
  hq_qtensor *a = NULL, *b = NULL, *c = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &a));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &x, &b));
  uint8_t *ba, *bb;
  size_t na, nb;
  copy_bytes(a, &ba, &na);
  copy_bytes(b, &bb, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(ba, bb, na);
  free(bb);
  HQ_OK_OR_FAIL(hq_qtensor_update(a, ctx, &y));
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &c));
  uint8_t *bc;
  size_t nc;
  free(ba);
  copy_bytes(a, &ba, &na);
  copy_bytes(c, &bc, &nc);
  assert_memory_equal(ba, bc, na);
  free(ba);
  free(bc);
  hq_qtensor_free(a);
  hq_qtensor_free(b);
  hq_qtensor_free(c);

  hq_qtensor *e = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(q, ctx, 96, 160, HQ_F32, &e));
  for (uint32_t d = 1; d <= 2; d++) {
    const hq_buffer *s = &storage(e, d)->buf[1];
    for (size_t i = 0; i < s->bytes; i++) assert_int_equal(((uint8_t *)s->ptr)[i], 0);
  }
  hq_qtensor_free(e);
  hq_quantizer_free(q);
  free(x.data);
  free(y.data);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

// --- options and the module itself ------------------------------------------------------------

static void test_options(void **state) {
  (void)state;
  hq_recipe *r = mx_recipe(1, 1, 0);
  const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), "mxfp8");
  assert_non_null(p);
  uint64_t caps = hq_plugin_caps(p);
  assert_int_equal(caps, HQ_CAP_CPU | HQ_CAP_REQUANT_SAFE | HQ_CAP_COLWISE_ONLY);
  const hq_option *o = hq_plugin_options(p);
  const char *names[] = {"dtype", "swizzle", "block_2d"};
  const char *defs[] = {"e4m3", "false", "false"};
  for (int i = 0; i < 3; i++) {
    assert_string_equal(o[i].name, names[i]);
    assert_string_equal(o[i].def, defs[i]);
    assert_true(o[i].help && strlen(o[i].help) > 10 && !strchr(o[i].help, '\n'));
  }
  assert_null(o[3].name);
  hq_recipe_free(r);

  /* bad values are recipe errors */
  const char *bad[] = {"[format mx]\nplugin = mxfp8\ndtype = e2m1\n",
                       "[format mx]\nplugin = mxfp8\nswizzle = maybe\n",
                       "[format mx]\nplugin = mxfp8\nblock_size = 16\n"};
  for (int i = 0; i < 3; i++) {
    hq_recipe_opts ro = {0};
    ro.struct_size = sizeof ro;
    ro.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
    hq_recipe *rr = NULL;
    HQ_OK_OR_FAIL(hq_recipe_parse_string(bad[i], "bad.ini", &ro, &rr));
    assert_true(hq_recipe_error_count(rr) > 0);
    hq_recipe_free(rr);
  }
}

/* Load the module directly (from $HQ_PLUGIN_PATH) to drive what the core never lets through:
   a CUDA-device call, and layout() on its own. */
static void test_module_direct(void **state) {
  (void)state;
  hq_format_entry_fn entry = hq_test_module_entry("mxfp8");
  hq_host_api host = hq_test_host();
  char *host_msg = hq_test_module_error();
  const hq_format_ops *ops = entry(&host);
  assert_non_null(ops);
  assert_string_equal(ops->name, "mxfp8");
  assert_null(ops->gemm);

  /* configure with the defaults, then describe a storage */
  void *cfg = calloc(1, ops->config_size ? ops->config_size : 1);
  hq_optval v[3] = {{0, 0, NULL}, {1, 0, NULL}, {0, 0, NULL}}; /* e4m3, swizzle, no 2-D */
  assert_int_equal(ops->configure(cfg, v, &host), HQ_OK);
  hq_storage row = {0}, col = {0};
  row.dir = HQ_ROWWISE, col.dir = HQ_COLWISE;
  row.rows = col.rows = 64, row.cols = col.cols = 64;
  assert_int_equal(ops->layout(cfg, &host, 64, 96 + 1, HQ_ROWWISE, HQ_BOTH, &row), HQ_ESHAPE);
  assert_string_equal(host_msg, "mxfp8: cols = 97 is not a multiple of 32");
  assert_int_equal(ops->layout(cfg, &host, 100, 64, HQ_COLWISE, HQ_COLWISE, &col), HQ_ESHAPE);
  assert_string_equal(host_msg, "mxfp8: rows = 100 is not a multiple of 32");
  memset(&row, 0, sizeof row);
  row.dir = HQ_ROWWISE, row.rows = 64, row.cols = 64;
  assert_int_equal(ops->layout(cfg, &host, 64, 64, HQ_ROWWISE, HQ_BOTH, &row), HQ_OK);
  uint8_t data[64 * 64], scales[128 * 4];
  row.buf[0].ptr = data, row.buf[0].bytes = sizeof data;
  row.buf[1].ptr = scales, row.buf[1].bytes = sizeof scales;
  float xs[64 * 64] = {0};
  hq_tensor x = {xs, HQ_F32, 0, 64, 64}; /* on CUDA device 0 */
  hq_call call = {0};
  call.struct_size = sizeof call;
  call.device = 0;
  call.host = &host;
  host_msg[0] = 0;
  assert_int_equal(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_ENOTSUP);
  assert_non_null(strstr(host_msg, "CUDA device 0 is not supported"));
  host_msg[0] = 0;
  assert_int_equal(ops->dequantize(cfg, &call, &row, &x), HQ_ENOTSUP);
  assert_non_null(strstr(host_msg, "not supported"));
  /* on the host it works and writes every scale byte, the padding too (here into a poisoned
     buffer the core's make_empty never saw); a mismatched storage is refused, not overrun */
  call.device = HQ_DEVICE_HOST;
  x.device = HQ_DEVICE_HOST;
  for (int i = 0; i < 64 * 64; i++) xs[i] = (i % 64 == 3) ? -5.0f : 1.0f;
  uint8_t cdata[64 * 64], cscales[4 * 128];
  assert_int_equal(ops->layout(cfg, &host, 64, 64, HQ_COLWISE, HQ_BOTH, &col), HQ_OK);
  col.dir = HQ_COLWISE, col.rows = 64, col.cols = 64;
  col.buf[0].ptr = cdata, col.buf[0].bytes = sizeof cdata;
  col.buf[1].ptr = cscales, col.buf[1].bytes = sizeof cscales;
  memset(scales, 0xA5, sizeof scales);
  memset(cscales, 0xA5, sizeof cscales);
  assert_int_equal(ops->quantize(cfg, &call, &x, HQ_BOTH, &row, &col), HQ_OK);
  for (int d = 1; d <= 2; d++) {
    uint8_t rdata[64 * 64], codes[64 * 64];
    size_t nb;
    ref_quantize(xs, 64, 64, 0, d, 0, rdata, codes);
    uint8_t *want = ref_dir_scales(codes, 64, 64, d, 1, &nb);
    assert_int_equal(nb, d == 1 ? sizeof scales : sizeof cscales);
    assert_memory_equal(d == 1 ? scales : cscales, want, nb);
    assert_memory_equal(d == 1 ? data : cdata, rdata, sizeof rdata);
    free(want);
  }
  hq_tensor big = {xs, HQ_F32, HQ_DEVICE_HOST, 32, 128};
  assert_int_equal(ops->quantize(cfg, &call, &big, HQ_ROWWISE, &row, NULL), HQ_ESHAPE);
  row.buf[1].bytes = 16;
  assert_int_equal(ops->quantize(cfg, &call, &x, HQ_ROWWISE, &row, NULL), HQ_EINVAL);
  free(cfg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_buffers),
      cmocka_unit_test(test_shape_errors),
      cmocka_unit_test(test_reference_all_combinations),
      cmocka_unit_test(test_block_2d),
      cmocka_unit_test(test_hand_blocks),
      cmocka_unit_test(test_directions_pick_right_blocks),
      cmocka_unit_test(test_dequantize),
      cmocka_unit_test(test_dequantize_specials),
      cmocka_unit_test(test_requant_update_make_empty),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_module_direct),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
