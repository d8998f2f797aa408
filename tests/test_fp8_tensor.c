/*
** test_fp8_tensor.c -- the fp8_tensor plugin (ABI 2.0) through the public API and by direct
** module calls: hand-computed codes and scales, power-of-two scales, epsilon, E5M2, NaN/Inf
** inputs, the transposed columnwise layout, columnwise-only quantize, dequantize, input dtypes,
** option errors (delayed scaling's options: tests/test_delayed.c), the operand descriptor and
** buffer descriptions, the rule of a caller-supplied amax (hq_quantize_ex / hq_qtensor_update_ex).
** Dequantize through a differently configured instance, update == fresh quantize and a given
** amax == the quantizer's own: tests/test_conformance.c, for every option.
** ABI 2.1: the raw dequantize (HQ_CALL_DEQ_RAW) of hand-built storages, the per-tensor factor and
** the invariant RN_f32(raw * factor) == dequantize, ABI 2.3's folded factor (factor_out,
** factor_in, factor_mul) of a raw dequantize, emul_dtype BF16 holding every code's value,
** the gemm op's answers (the host: HQ_ENOTSUP; a mock device and cuBLASLt runner: the TN call it
** makes, and each refusal with its reason), and hq_gemm on the host against an F64 product of
** the dequantized operands.
** Expected values come from hand computation or from tests/fp8_ref.h (an independent FP8 codec).
*/
#include <math.h>

#include "hq_test.h"
#include "fp8_ref.h"

static hq_ctx *host_ctx(void) {
  hq_ctx *ctx = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &ctx));
  return ctx;
}

/* A recipe with one fp8_tensor format `f` (given option lines) for both directions. */
static hq_recipe *recipe(const char *options) {
  char text[512];
  snprintf(text, sizeof text, "[format f]\nplugin = fp8_tensor\n%s\n[role *:*:*]\nrowwise = f\n"
           "columnwise = f\n", options);
  return hq_test_recipe(text);
}

/* Quantize x [rows, cols] with a single fp8_tensor format given by its option lines. */
static hq_qtensor *quantize(hq_ctx *ctx, const char *options, float *x, int64_t rows,
                            int64_t cols, uint32_t usage, hq_recipe **rp) {
  hq_recipe *r = recipe(options);
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, usage));
  hq_tensor t = hq_tensor_2d(x, HQ_F32, HQ_DEVICE_HOST, rows, cols);
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, ctx, &t, &qt));
  hq_quantizer_free(q);
  *rp = r;
  return qt;
}

static const hq_buffer *buf(const hq_qtensor *qt, uint32_t dir, uint32_t i) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  assert_non_null(s);
  assert_true(i < s->nbuf);
  return hq_storage_cbuf(s, i);
}
static const uint8_t *bytes(const hq_qtensor *qt, uint32_t dir) { return buf(qt, dir, 0)->ptr; }
static float scale_inv(const hq_qtensor *qt, uint32_t dir) {
  return *(const float *)buf(qt, dir, 1)->ptr;
}
static float amax(const hq_qtensor *qt, uint32_t dir) {
  return *(const float *)buf(qt, dir, 2)->ptr;
}

/* Every buffer of direction dir of a and b is equal, byte for byte. */
static void same_bytes(const hq_qtensor *a, const hq_qtensor *b, uint32_t dir, const char *what) {
  const hq_storage *sa = hq_qtensor_storage(a, dir), *sb = hq_qtensor_storage(b, dir);
  assert_non_null(sa);
  assert_non_null(sb);
  assert_int_equal(sa->nbuf, sb->nbuf);
  for (uint32_t i = 0; i < sa->nbuf; i++) {
    const hq_buffer *x = hq_storage_cbuf(sa, i), *y = hq_storage_cbuf(sb, i);
    assert_int_equal(x->bytes, y->bytes);
    if (memcmp(x->ptr, y->ptr, x->bytes) != 0)
      fail_msg("%s: dir %u buffer '%s' differs", what, dir, x->name);
  }
}

/* amax 448 -> scale 1: the codes are the plain E4M3 encodings, worked out by hand:
   1 = 1.0*2^0 -> e=7 m=0 -> 0x38; -2 -> 0xC0; 3 = 1.5*2^1 -> 0x44; 448 -> 0x7E;
   0.5 -> 0x30; -0.25 -> 0xA8. Columnwise [3,2] is the byte transpose. */
static void test_hand_computed(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  float x[6] = {1, -2, 3, 448, 0.5f, -0.25f};
  hq_qtensor *qt = quantize(ctx, "", x, 2, 3, HQ_BOTH, &r);
  const uint8_t want[6] = {0x38, 0xc0, 0x44, 0x7e, 0x30, 0xa8};
  const uint8_t want_t[6] = {0x38, 0x7e, 0xc0, 0x30, 0x44, 0xa8};
  assert_memory_equal(bytes(qt, HQ_ROWWISE), want, 6);
  assert_memory_equal(bytes(qt, HQ_COLWISE), want_t, 6);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  assert_true(amax(qt, HQ_ROWWISE) == 448.0f);
  assert_string_equal(buf(qt, HQ_ROWWISE, 0)->name, "data");
  assert_int_equal(buf(qt, HQ_ROWWISE, 0)->dtype, HQ_E4M3);
  assert_int_equal(buf(qt, HQ_ROWWISE, 0)->shape[0], 2);
  assert_int_equal(buf(qt, HQ_ROWWISE, 0)->shape[1], 3);
  assert_string_equal(buf(qt, HQ_COLWISE, 0)->name, "columnwise_data");
  assert_int_equal(buf(qt, HQ_COLWISE, 0)->shape[0], 3);
  assert_int_equal(buf(qt, HQ_COLWISE, 0)->shape[1], 2);
  /* made together, the two directions share one scale_inv and amax */
  assert_ptr_equal(buf(qt, HQ_COLWISE, 1)->ptr, buf(qt, HQ_ROWWISE, 1)->ptr);
  assert_ptr_equal(buf(qt, HQ_COLWISE, 2)->ptr, buf(qt, HQ_ROWWISE, 2)->ptr);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_ROWWISE), 6 + 4 + 4);
  assert_int_equal(hq_qtensor_bytes(qt, HQ_COLWISE), 6);
  hq_qtensor_free(qt);
  hq_recipe_free(r);

  /* amax 2 -> scale = 448/2 = 224; 1 * 224 = 224 = 1.75*2^7 -> e=14 m=6 -> 0x76;
     0.01 * 224 = 2.24 -> between 2.0 (0x40) and 2.25 (0x41), nearer 2.25 -> 0x41 */
  float y[3] = {2, 1, 0.01f};
  qt = quantize(ctx, "", y, 1, 3, HQ_ROWWISE, &r);
  const uint8_t want2[3] = {0x7e, 0x76, 0x41};
  assert_memory_equal(bytes(qt, HQ_ROWWISE), want2, 3);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 224.0f);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_scale_options(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  /* amax 3: plain scale 448/3 = 149.33 (3 -> 448 = 0x7E); pow2 scale 128 (3 -> 384 = 0x7C) */
  float x[2] = {3, -1.5f};
  hq_qtensor *qt = quantize(ctx, "power_2_scales = true", x, 1, 2, HQ_ROWWISE, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7c);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0xf4); /* -192 = -1.5*2^7 -> e=14 m=4 */
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 128.0f);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  qt = quantize(ctx, "", x, 1, 2, HQ_ROWWISE, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7e);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / (448.0f / 3.0f));
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* epsilon floor: amax 1e-3 < eps 0.5 -> scale 896 */
  float z[1] = {1e-3f};
  qt = quantize(ctx, "amax_epsilon = 0.5", z, 1, 1, HQ_ROWWISE, &r);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f / 896.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], hq_f32_to_e4m3(0.896f));
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], ref_fp8_encode((double)(1e-3f * 896.0f), 0));
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* E5M2: amax 57344 -> scale 1; 57344 -> 0x7B, -1 -> 0xBC */
  float w[2] = {57344.0f, -1.0f};
  qt = quantize(ctx, "dtype = e5m2", w, 1, 2, HQ_BOTH, &r);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7b);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0xbc);
  assert_int_equal(buf(qt, HQ_ROWWISE, 0)->dtype, HQ_E5M2);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* all zeros -> scale 1, every code 0 */
  float zero[4] = {0, 0, 0, 0};
  qt = quantize(ctx, "", zero, 2, 2, HQ_BOTH, &r);
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  for (int i = 0; i < 4; i++) assert_int_equal(bytes(qt, HQ_COLWISE)[i], 0);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

static void test_nan_inf(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r;
  /* NaN does not enter amax (amax = 2 -> scale 224); the NaN element encodes as 0x7F */
  float x[3] = {NAN, 2.0f, -1.0f};
  hq_qtensor *qt = quantize(ctx, "", x, 1, 3, HQ_ROWWISE, &r);
  assert_true(amax(qt, HQ_ROWWISE) == 2.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0x7e);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[2], 0xf6);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  /* Inf enters amax -> scale 1; Inf saturates to 448, 3 stays 3 */
  float y[2] = {INFINITY, 3.0f};
  qt = quantize(ctx, "", y, 1, 2, HQ_ROWWISE, &r);
  assert_true(isinf(amax(qt, HQ_ROWWISE)));
  assert_true(scale_inv(qt, HQ_ROWWISE) == 1.0f);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[0], 0x7e);
  assert_int_equal(bytes(qt, HQ_ROWWISE)[1], 0x44);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* Random odd shapes: columnwise is the exact byte transpose; columnwise-only gives the same
   bytes; dequantize equals q * scale_inv and is close to the input; bf16 and f16 inputs holding
   the same values give the same bytes. */
static void test_layout_and_dtypes(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  const int64_t M = 37, K = 53;
  hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 7, 3.0f); /* bf16 values, exact in f16/f32 too */
  float *xf = malloc(sizeof(float) * M * K);
  for (int64_t i = 0; i < M * K; i++) xf[i] = hq_load_hp(x.data, i, HQ_BF16);
  hq_recipe *r;
  hq_qtensor *qt = quantize(ctx, "", xf, M, K, HQ_BOTH, &r);
  const uint8_t *row = bytes(qt, HQ_ROWWISE), *col = bytes(qt, HQ_COLWISE);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < K; j++) assert_int_equal(col[j * M + i], row[i * K + j]);
  /* independent check of every code: amax over the tensor, scale, encode */
  float am = 0;
  for (int64_t i = 0; i < M * K; i++) am = fabsf(xf[i]) > am ? fabsf(xf[i]) : am;
  float scale = 448.0f / am;
  for (int64_t i = 0; i < M * K; i++) {
    assert_int_equal(row[i], hq_f32_to_e4m3(xf[i] * scale));
    assert_int_equal(row[i], ref_fp8_encode((double)(xf[i] * scale), 0));
  }
  /* dequantize both directions */
  hq_tensor d = hq_test_empty(HQ_F32, M, K);
  for (int dir = 1; dir <= 2; dir++) {
    HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, (uint32_t)dir, &d));
    for (int64_t i = 0; i < M * K; i++) {
      float v = ((float *)d.data)[i];
      assert_true(v == hq_e4m3_to_f32(row[i]) * (1.0f / scale));
      assert_true(v == (float)ref_fp8_decode(row[i], 0) * (1.0f / scale));
      assert_true(fabsf(v - xf[i]) <= fabsf(xf[i]) / 16 + 1e-3f * am); /* 3 mantissa bits */
    }
  }
  /* columnwise only */
  hq_recipe *r2;
  hq_qtensor *qc = quantize(ctx, "", xf, M, K, HQ_COLWISE, &r2);
  assert_int_equal(hq_qtensor_dirs(qc), HQ_COLWISE);
  assert_memory_equal(bytes(qc, HQ_COLWISE), col, (size_t)(M * K));
  assert_true(scale_inv(qc, HQ_COLWISE) == scale_inv(qt, HQ_ROWWISE));
  assert_true(amax(qc, HQ_COLWISE) == am);
  hq_qtensor_free(qc);
  hq_recipe_free(r2);
  /* the same values as bf16 and f16 input */
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  hq_tensor xh = hq_test_empty(HQ_F16, M, K);
  for (int64_t i = 0; i < M * K; i++) hq_store_hp(xh.data, i, HQ_F16, xf[i]);
  hq_tensor *inputs[2] = {&x, &xh};
  for (int k = 0; k < 2; k++) {
    hq_qtensor *q2 = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, inputs[k], &q2));
    assert_memory_equal(bytes(q2, HQ_ROWWISE), row, (size_t)(M * K));
    assert_memory_equal(bytes(q2, HQ_COLWISE), col, (size_t)(M * K));
    hq_qtensor_free(q2);
  }
  /* dequantize into bf16 and f16 rounds the f32 values */
  hq_tensor db = hq_test_empty(HQ_BF16, M, K);
  HQ_OK_OR_FAIL(hq_dequantize(qt, ctx, HQ_ROWWISE, &db));
  for (int64_t i = 0; i < M * K; i++)
    assert_int_equal(((uint16_t *)db.data)[i], hq_f32_to_bf16(hq_e4m3_to_f32(row[i]) / scale));
  hq_quantizer_free(q);
  free(db.data);
  free(xh.data);
  free(d.data);
  free(xf);
  free(x.data);
  hq_qtensor_free(qt);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* A host-built module refuses a device it has no path for, and bad shapes/dtypes are errors. */
static void test_errors(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe("[role *:*:*]\nrowwise = fp8_tensor\ncolumnwise = fp8_tensor\n");
  hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
  float x[4] = {1, 2, 3, 4};
  hq_qtensor *qt = NULL;
  hq_tensor t = hq_tensor_2d(x, HQ_E4M3, HQ_DEVICE_HOST, 2, 2);
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("dtype e4m3 is not a high-precision type");
  t.dtype = HQ_F32;
  t.rows = 0;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_ESHAPE);
  t.rows = 2;
  t.device = 0;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("tensor is on device 0 but the context runs on -1");
  t.device = HQ_DEVICE_HOST;
  t.data = NULL;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  assert_null(qt);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, 0));
  t.data = x;
  assert_int_equal(hq_quantize(q, ctx, &t, &qt), HQ_EINVAL);
  HQ_ERROR_HAS("has no usage");
  assert_int_equal(hq_quantizer_set_usage(q, 4), HQ_EINVAL);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

/* The options: dtype, power_2_scales, amax_epsilon (current scaling), then scaling,
   amax_history_len, amax_compute_algo, margin (delayed scaling, tests/test_delayed.c); upstream's
   reduce_amax is not one (the caller reduces). */
static void test_options(void **state) {
  (void)state;
  hq_plugins *set = NULL;
  HQ_OK_OR_FAIL(hq_plugins_open(NULL, 0, HQ_PLUGINS_NO_DEFAULT, &set));
  const hq_plugin *p = hq_plugins_find(set, "fp8_tensor");
  assert_non_null(p);
  assert_string_equal(hq_plugin_version(p), hq_version());
  assert_int_equal(hq_plugin_abi_minor(p), 1);
  const hq_option *o = hq_plugin_options(p);
  const char *want[] = {"dtype", "power_2_scales", "amax_epsilon", "scaling", "amax_history_len",
                        "amax_compute_algo", "margin"};
  for (size_t i = 0; i < 7; i++) {
    assert_non_null(o[i].name);
    assert_string_equal(o[i].name, want[i]);
    assert_non_null(o[i].help);
  }
  assert_null(o[7].name);
  assert_int_equal(o[0].type, HQ_OPT_ENUM);
  assert_string_equal(o[0].choices, "e4m3|e5m2");
  assert_string_equal(o[0].def, "e4m3");
  assert_int_equal(o[1].type, HQ_OPT_BOOL);
  assert_string_equal(o[1].def, "false");
  assert_int_equal(o[2].type, HQ_OPT_FLOAT);
  assert_string_equal(o[2].def, "0");
  assert_int_equal(o[3].type, HQ_OPT_ENUM);
  assert_string_equal(o[3].choices, "current|delayed");
  assert_string_equal(o[3].def, "current");
  assert_int_equal(o[4].type, HQ_OPT_INT);
  assert_string_equal(o[4].def, "1024");
  assert_int_equal(o[5].type, HQ_OPT_ENUM);
  assert_string_equal(o[5].choices, "max|most_recent");
  assert_int_equal(o[6].type, HQ_OPT_INT);
  assert_string_equal(o[6].def, "0");
  hq_plugins_close(set);
  const char *gone[] = {"reduce_amax = false", "scale_update = delayed"};
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) {
    char text[256], key[64];
    snprintf(text, sizeof text, "[format f]\nplugin = fp8_tensor\n%s\n", gone[i]);
    snprintf(key, sizeof key, "unknown option '%.*s'", (int)strcspn(gone[i], " "), gone[i]);
    hq_recipe_opts ro = {0};
    ro.struct_size = sizeof ro;
    ro.plugin_flags = HQ_PLUGINS_NO_DEFAULT;
    hq_recipe *r = NULL;
    HQ_OK_OR_FAIL(hq_recipe_parse_string(text, "test.ini", &ro, &r));
    assert_int_equal(hq_recipe_error_count(r), 1);
    if (!strstr(hq_recipe_error(r, 0), key))
      fail_msg("error '%s' lacks \"%s\"", hq_recipe_error(r, 0), key);
    if (!strstr(hq_recipe_error(r, 0), "test.ini:3:"))
      fail_msg("error '%s' is not at line 3", hq_recipe_error(r, 0));
    hq_recipe_free(r);
  }
}

// --- operand descriptor and buffer descriptions (the table of the ABI 2.0 brief) -------------

static void check_buffer(const hq_storage *s, uint32_t i, const char *name, uint32_t role,
                         hq_dtype dtype, int ndim, int64_t d0, int64_t d1, uint32_t gather,
                         int32_t m_div, int shared_with /* -1: own buffer */) {
  const hq_buffer *b = hq_storage_cbuf(s, i);
  assert_non_null(b->name);
  assert_string_equal(b->name, name);
  assert_int_equal(b->role, role);
  assert_int_equal(b->dtype, dtype);
  assert_int_equal(b->ndim, ndim);
  assert_int_equal(b->shape[0], d0);
  if (ndim > 1) assert_int_equal(b->shape[1], d1);
  assert_int_equal(b->gather, gather);
  assert_int_equal(b->m_div, m_div);
  if (shared_with < 0) {
    assert_int_equal(b->flags & HQ_BUF_SHARED, 0);
  } else {
    assert_int_equal(b->flags & HQ_BUF_SHARED, HQ_BUF_SHARED);
    assert_int_equal(b->shared_with, shared_with);
  }
  size_t n = hq_dtype_size(dtype) * (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
  assert_int_equal(b->bytes, n);
  assert_non_null(b->ptr);
}

static void check_desc(const hq_storage *s, hq_dtype elem, uint32_t order) {
  const hq_operand_desc *d = &s->desc;
  assert_int_equal(d->elem, elem);
  assert_int_equal(d->order, order);
  assert_int_equal(d->scale_mode, HQ_SCALE_TENSOR_F32);
  assert_int_equal(d->scale_layout, HQ_SCALE_LAYOUT_NONE);
  assert_int_equal(d->block_m, 0);
  assert_int_equal(d->block_k, 0);
  assert_int_equal(d->transform, HQ_TRANSFORM_NONE);
  assert_true(d->transform_param == 0);
  assert_int_equal(d->shard_rows, 1);
  assert_int_equal(d->emul_dtype, HQ_BF16); /* every FP8 element value is exact in BF16 */
  assert_int_equal(d->reserved32, 0);
  for (int i = 0; i < 7; i++) assert_true(d->reserved[i] == 0);
  for (int i = 0; i < HQ_META_BYTES; i++) assert_int_equal(s->meta[i], 0); /* meta unused */
}

static void test_desc_and_buffers(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  struct {
    const char *options;
    hq_dtype elem;
  } sets[] = {{"", HQ_E4M3},
              {"dtype = e5m2", HQ_E5M2},
              {"dtype = e4m3\npower_2_scales = true\namax_epsilon = 0.25", HQ_E4M3}};
  const int64_t shapes[][2] = {{37, 53}, {1, 1}, {65, 130}};
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (size_t o = 0; o < sizeof sets / sizeof sets[0]; o++)
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
      for (int u = 0; u < 3; u++) {
        const int64_t M = shapes[sh][0], K = shapes[sh][1];
        hq_tensor x = hq_test_tensor(HQ_F32, M, K, 11 + sh, 2.0f);
        hq_recipe *r;
        hq_qtensor *qt = quantize(ctx, sets[o].options, x.data, M, K, usages[u], &r);
        assert_int_equal(hq_qtensor_dirs(qt), usages[u]);
        assert_int_equal(hq_qtensor_shard_rows(qt), 1);
        if (usages[u] & HQ_ROWWISE) {
          const hq_storage *s = hq_qtensor_storage(qt, HQ_ROWWISE);
          assert_int_equal(s->dir, HQ_ROWWISE);
          assert_int_equal(s->nbuf, 3);
          check_desc(s, sets[o].elem, HQ_ORDER_MK);
          check_buffer(s, 0, "data", HQ_ROLE_DATA, sets[o].elem, 2, M, K, HQ_GATHER_ROWS, 1, -1);
          check_buffer(s, 1, "scale_inv", HQ_ROLE_SCALE, HQ_F32, 1, 1, 0, HQ_GATHER_SAME, 1, -1);
          check_buffer(s, 2, "amax", HQ_ROLE_AMAX, HQ_F32, 1, 1, 0, HQ_GATHER_SAME, 1, -1);
        }
        if (usages[u] & HQ_COLWISE) {
          const hq_storage *s = hq_qtensor_storage(qt, HQ_COLWISE);
          const int with_row = (usages[u] & HQ_ROWWISE) != 0;
          assert_int_equal(s->dir, HQ_COLWISE);
          assert_int_equal(s->nbuf, 3);
          check_desc(s, sets[o].elem, HQ_ORDER_KM);
          check_buffer(s, 0, "columnwise_data", HQ_ROLE_DATA, sets[o].elem, 2, K, M,
                       HQ_GATHER_COLS, 1, -1);
          check_buffer(s, 1, with_row ? "scale_inv" : "columnwise_scale_inv", HQ_ROLE_SCALE,
                       HQ_F32, 1, 1, 0, HQ_GATHER_SAME, 1, with_row ? 1 : -1);
          check_buffer(s, 2, with_row ? "amax" : "columnwise_amax", HQ_ROLE_AMAX, HQ_F32, 1, 1,
                       0, HQ_GATHER_SAME, 1, with_row ? 2 : -1);
          if (with_row) {
            const hq_storage *rs = hq_qtensor_storage(qt, HQ_ROWWISE);
            assert_ptr_equal(hq_storage_cbuf(s, 1)->ptr, hq_storage_cbuf(rs, 1)->ptr);
            assert_ptr_equal(hq_storage_cbuf(s, 2)->ptr, hq_storage_cbuf(rs, 2)->ptr);
          }
        }
        hq_qtensor_free(qt);
        hq_recipe_free(r);
        free(x.data);
      }
  hq_ctx_destroy(ctx);
}

// --- direct module calls -------------------------------------------------------------------

typedef struct module {
  hq_host_api host;
  const hq_format_ops *ops;
} module;

static module open_module(void) {
  module m;
  m.host = hq_test_host();
  m.ops = hq_test_module_entry("fp8_tensor")(&m.host);
  assert_non_null(m.ops);
  assert_int_equal(m.ops->abi_major, HQ_ABI_MAJOR);
  assert_int_equal(m.ops->abi_minor, 1); /* requires ABI 2.1: raw dequantize and GEMMs */
  assert_string_equal(m.ops->version, hq_version());
  assert_string_equal(m.ops->name, "fp8_tensor");
  assert_non_null(m.ops->tensor_factor);
  assert_null(m.ops->gemm); /* native GEMMs are gemm/cublaslt's, by the descriptors */
  return m;
}

/* A configured current-scaling instance: option values found by name in the module's table
   (the delayed-scaling options at their defaults). */
static void *configure(const module *m, int e5m2, int pow2, double eps) {
  hq_optval v[8];
  memset(v, 0, sizeof v);
  size_t n = 0;
  for (; m->ops->options[n].name; n++) {
    const char *name = m->ops->options[n].name;
    assert_true(n < 8);
    if (!strcmp(name, "dtype")) v[n].i = e5m2;
    else if (!strcmp(name, "power_2_scales")) v[n].i = pow2;
    else if (!strcmp(name, "amax_epsilon")) v[n].f = eps;
    else if (!strcmp(name, "scaling")) v[n].i = 0;             /* current */
    else if (!strcmp(name, "amax_history_len")) v[n].i = 1024; /* default */
    else if (!strcmp(name, "amax_compute_algo")) v[n].i = 0;   /* max */
    else if (!strcmp(name, "margin")) v[n].i = 0;
    else fail_msg("unexpected option '%s'", name);
  }
  assert_int_equal(n, 7);
  void *cfg = calloc(1, m->ops->config_size ? m->ops->config_size : 1);
  HQ_OK_OR_FAIL(m->ops->configure(cfg, v, &m->host));
  return cfg;
}

/* Describe (layout) and allocate the storages of dirs of a [M, K] tensor as the core does: a
   buffer the columnwise storage shares is the rowwise storage's memory. */
static void make_storages(const module *m, const void *cfg, int64_t M, int64_t K, uint32_t dirs,
                          hq_storage *row, hq_storage *col) {
  hq_storage *st[2] = {row, col};
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    if (!(dirs & dir)) continue;
    hq_test_storage_init(st[d], dir, M, K, HQ_F32);
    HQ_OK_OR_FAIL(m->ops->layout(cfg, &m->host, M, K, dir, dirs, st[d]));
    for (uint32_t i = 0; i < st[d]->nbuf; i++) {
      hq_buffer *b = hq_storage_buf(st[d], i);
      size_t n = hq_dtype_size(b->dtype);
      for (int k = 0; k < b->ndim; k++) n *= (size_t)b->shape[k];
      b->bytes = n;
      if (d == 1 && (dirs & HQ_ROWWISE) && (b->flags & HQ_BUF_SHARED)) {
        b->ptr = hq_storage_buf(row, (uint32_t)b->shared_with)->ptr;
        continue;
      }
      b->ptr = malloc(n ? n : 1);
      memset(b->ptr, 0x5a, n); /* poison: quantize must write every byte */
    }
  }
}
static void free_storages(uint32_t dirs, hq_storage *row, hq_storage *col) {
  if (dirs & HQ_ROWWISE)
    for (uint32_t i = 0; i < row->nbuf; i++) free(hq_storage_buf(row, i)->ptr);
  if (dirs & HQ_COLWISE)
    for (uint32_t i = 0; i < col->nbuf; i++) {
      hq_buffer *b = hq_storage_buf(col, i);
      if (!((dirs & HQ_ROWWISE) && (b->flags & HQ_BUF_SHARED))) free(b->ptr);
    }
}

/* The ops a direct caller sees: scratch 0, amax_kind INPUT both ways, amax() writes both
   entries (0 for a direction not asked for), quantize with call->amax, update flags (host->alloc
   refuses) work, a storage that is not per-tensor FP8 is refused, device calls of a host-only
   build are refused. */
static void test_ops_direct(void **state) {
  (void)state;
  module m = open_module();
  void *cfg = configure(&m, 0, 0, 0.0);
  assert_non_null(m.ops->scratch_size);
  assert_int_equal(m.ops->scratch_size(cfg, 37, 53, HQ_BOTH, HQ_DEVICE_HOST), 0);
  assert_int_equal(m.ops->scratch_size(cfg, 4096, 4096, HQ_BOTH, 0), 0);
  assert_non_null(m.ops->amax_kind);
  assert_non_null(m.ops->amax);
  assert_null(m.ops->update); /* update = quantize, which neither allocates nor syncs */
  assert_int_equal(m.ops->amax_kind(cfg, HQ_ROWWISE), HQ_AMAX_INPUT);
  assert_int_equal(m.ops->amax_kind(cfg, HQ_COLWISE), HQ_AMAX_INPUT);
  /* amax: max |x| with NaN ignored, per requested direction, 0 for the other */
  const int64_t M = 9, K = 7;
  hq_tensor x = hq_test_tensor(HQ_F16, M, K, 5, 1.0f); /* |x| <= 6 */
  hq_store_hp(x.data, 3, HQ_F16, NAN);
  hq_store_hp(x.data, 20, HQ_F16, -9.5f);
  hq_call call = hq_test_call(&m.host, 0, 0);
  for (uint32_t dirs = 0; dirs <= 3; dirs++) {
    float out[2] = {-1.0f, -1.0f};
    HQ_OK_OR_FAIL(m.ops->amax(cfg, &call, &x, dirs, out));
    assert_true(out[0] == ((dirs & HQ_ROWWISE) ? 9.5f : 0.0f));
    assert_true(out[1] == ((dirs & HQ_COLWISE) ? 9.5f : 0.0f));
  }
  /* quantize under HQ_CALL_UPDATE (host->alloc returns NULL) with and without call->amax */
  hq_storage r1, c1, r2, c2;
  make_storages(&m, cfg, M, K, HQ_BOTH, &r1, &c1);
  make_storages(&m, cfg, M, K, HQ_BOTH, &r2, &c2);
  hq_call up = call;
  up.flags = HQ_CALL_UPDATE;
  HQ_OK_OR_FAIL(m.ops->quantize(cfg, &up, &x, HQ_BOTH, &r1, &c1));
  const float given[2] = {9.5f, 9.5f};
  up.amax = given;
  HQ_OK_OR_FAIL(m.ops->quantize(cfg, &up, &x, HQ_BOTH, &r2, &c2));
  for (uint32_t i = 0; i < 3; i++) {
    assert_memory_equal(hq_storage_buf(&r1, i)->ptr, hq_storage_buf(&r2, i)->ptr,
                        hq_storage_buf(&r1, i)->bytes);
    assert_memory_equal(hq_storage_buf(&c1, i)->ptr, hq_storage_buf(&c2, i)->ptr,
                        hq_storage_buf(&c1, i)->bytes);
  }
  assert_true(*(float *)hq_storage_buf(&r1, 2)->ptr == 9.5f);
  assert_true(*(float *)hq_storage_buf(&r1, 1)->ptr == 1.0f / (448.0f / 9.5f));
  /* a storage that is not per-tensor FP8 is refused, not misread */
  hq_tensor d = hq_test_empty(HQ_F32, M, K);
  hq_storage bad = r1;
  bad.desc.elem = HQ_E2M1X2;
  assert_int_equal(m.ops->dequantize(cfg, &call, &bad, &d), HQ_EINVAL);
  bad = r1;
  bad.desc.scale_mode = HQ_SCALE_VEC32_UE8M0;
  assert_int_equal(m.ops->dequantize(cfg, &call, &bad, &d), HQ_EINVAL);
  hq_tensor wrong = hq_test_empty(HQ_F32, K, M);
  assert_int_equal(m.ops->dequantize(cfg, &call, &r1, &wrong), HQ_ESHAPE);
  free(wrong.data);
  /* copy_out (ABI 2.6) takes an F32 source into BF16 / F16 only: a 16-bit source or an F32
     copy is refused by name before anything is written */
  uint16_t copy[9 * 7];
  memset(copy, 0xAB, sizeof copy);
  uint8_t codes[9 * 7];
  memcpy(codes, hq_storage_buf(&r1, 0)->ptr, sizeof codes);
  hq_tensor x32 = hq_test_tensor(HQ_F32, M, K, 6, 1.0f);
  const struct { const hq_tensor *src; int32_t dt; } refused[] = {
      {&x, HQ_BF16}, {&x32, HQ_F32}, {&x32, HQ_E4M3}};
  for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
    hq_call cc = call;
    cc.copy_out = copy;
    cc.copy_dtype = refused[k].dt;
    char *msg = hq_test_module_error();
    msg[0] = 0;
    assert_int_equal(m.ops->quantize(cfg, &cc, refused[k].src, HQ_ROWWISE, &r1, NULL), HQ_EINVAL);
    assert_non_null(strstr(msg, "copy_out"));
    for (size_t i = 0; i < sizeof copy / sizeof copy[0]; i++) assert_int_equal(copy[i], 0xABAB);
    assert_memory_equal(hq_storage_buf(&r1, 0)->ptr, codes, sizeof codes);
  }
  free(x32.data);
  HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, &c1, &d));
  if (!hq_built_with_cuda()) {
    hq_call dev = call;
    dev.device = 0;
    hq_tensor xd = x;
    xd.device = 0;
    char *msg = hq_test_module_error();
    msg[0] = 0;
    assert_int_equal(m.ops->quantize(cfg, &dev, &xd, HQ_BOTH, &r1, &c1), HQ_ENOTSUP);
    assert_non_null(strstr(msg, "without CUDA"));
    float out[2];
    assert_int_equal(m.ops->amax(cfg, &dev, &xd, HQ_BOTH, out), HQ_ENOTSUP);
    hq_tensor dd = d;
    dd.device = 0;
    assert_int_equal(m.ops->dequantize(cfg, &dev, &r1, &dd), HQ_ENOTSUP);
  }
  free(d.data);
  free_storages(HQ_BOTH, &r1, &c1);
  free_storages(HQ_BOTH, &r2, &c2);
  free(x.data);
  free(cfg);
}

// --- caller-supplied amax and update, through the public API ---------------------------------

/* A supplied amax is used as given (the input is not read for it), by the scale rule
   scale = RN(max_fp8 / amax) (pow2: rounded down to a power of two), scale_inv = RN(1/scale):
     x = {1, -2, 0.5, 2} (amax 2), supplied 4: scale 448/4 = 112, scale_inv 1/112;
       1 -> 112 = 1.75*2^6 (e=13, m=6) 0x6E; -2 -> -224 = -1.75*2^7 (e=14, m=6) 0xF6;
       0.5 -> 56 = 1.75*2^5 (e=12, m=6) 0x66; 2 -> 224 0x76.
     pow2, supplied 4: 112 -> 64; 1 -> 64 = 2^6 0x68; -2 -> -128 0xF0; 0.5 -> 32 0x60; 2 -> 0x70.
     e5m2, supplied 4: scale 57344/4 = 14336; 1 -> 14336 = 1.75*2^13 (e=28, m=3) 0x73;
       -2 -> -28672 (e=29, m=3) 0xF7; 0.5 -> 7168 (e=27, m=3) 0x6F; 2 -> 0x77.
     supplied 1 (smaller than the data): scale 448; 1 -> 448 0x7E; -2 -> -896 saturates 0xFE;
       0.5 -> 224 0x76; 2 -> 0x7E.
   Both directions made together share one scale: from max(amax[0], amax[1]); one direction
   alone uses its own entry. */
static void test_caller_amax_rule(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  float xv[4] = {1, -2, 0.5f, 2};
  hq_tensor x = hq_tensor_2d(xv, HQ_F32, HQ_DEVICE_HOST, 2, 2);
  struct {
    const char *options;
    float a[2];
    uint32_t usage;
    float used, scale;
    uint8_t codes[4];
  } cases[] = {
      {"", {4, 4}, HQ_BOTH, 4, 112.0f, {0x6e, 0xf6, 0x66, 0x76}},
      {"power_2_scales = true", {4, 4}, HQ_BOTH, 4, 64.0f, {0x68, 0xf0, 0x60, 0x70}},
      {"dtype = e5m2", {4, 4}, HQ_BOTH, 4, 14336.0f, {0x73, 0xf7, 0x6f, 0x77}},
      {"", {1, 1}, HQ_BOTH, 1, 448.0f, {0x7e, 0xfe, 0x76, 0x7e}},
      {"", {4, 1}, HQ_BOTH, 4, 112.0f, {0x6e, 0xf6, 0x66, 0x76}},   /* max of the two */
      {"", {1, 4}, HQ_BOTH, 4, 112.0f, {0x6e, 0xf6, 0x66, 0x76}},
      {"", {4, 1}, HQ_ROWWISE, 4, 112.0f, {0x6e, 0xf6, 0x66, 0x76}}, /* its own entry */
      {"", {1, 4}, HQ_ROWWISE, 1, 448.0f, {0x7e, 0xfe, 0x76, 0x7e}},
      {"", {4, 1}, HQ_COLWISE, 1, 448.0f, {0x7e, 0xfe, 0x76, 0x7e}},
      {"", {1, 4}, HQ_COLWISE, 4, 112.0f, {0x6e, 0xf6, 0x66, 0x76}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hq_recipe *r = recipe(cases[c].options);
    hq_quantizer *q = hq_test_quantizer(r, "a:b:c");
    HQ_OK_OR_FAIL(hq_quantizer_set_usage(q, cases[c].usage));
    hq_qtensor *qt = hq_test_quantize_ex(q, ctx, &x, cases[c].a);
    const float want_si = 1.0f / cases[c].scale;
    const uint8_t *cd = cases[c].codes;
    const uint8_t want_t[4] = {cd[0], cd[2], cd[1], cd[3]};
    if (cases[c].usage & HQ_ROWWISE) {
      assert_memory_equal(bytes(qt, HQ_ROWWISE), cd, 4);
      assert_true(scale_inv(qt, HQ_ROWWISE) == want_si);
      assert_true(amax(qt, HQ_ROWWISE) == cases[c].used);
    }
    if (cases[c].usage & HQ_COLWISE) {
      assert_memory_equal(bytes(qt, HQ_COLWISE), want_t, 4);
      assert_true(scale_inv(qt, HQ_COLWISE) == want_si);
      assert_true(amax(qt, HQ_COLWISE) == cases[c].used);
    }
    /* the same through an update of a qtensor made from other data */
    float other[4] = {100, -3, 7, 0.125f};
    hq_tensor y = hq_tensor_2d(other, HQ_F32, HQ_DEVICE_HOST, 2, 2);
    hq_qtensor *u = NULL;
    HQ_OK_OR_FAIL(hq_quantize(q, ctx, &y, &u));
    hq_quantize_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.amax = cases[c].a;
    HQ_OK_OR_FAIL(hq_qtensor_update_ex(u, ctx, &x, &args));
    if (cases[c].usage & HQ_ROWWISE) same_bytes(qt, u, HQ_ROWWISE, "update_ex");
    if (cases[c].usage & HQ_COLWISE) same_bytes(qt, u, HQ_COLWISE, "update_ex");
    hq_qtensor_free(u);
    hq_qtensor_free(qt);
    hq_quantizer_free(q);
    hq_recipe_free(r);
  }
  hq_ctx_destroy(ctx);
}

// --- ABI 2.1: raw values, the per-tensor factor, the emul dtype --------------------------------

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* A storage of direction dir of a [M, K] tensor as layout() describes it, holding the given codes
   (row-major over the logical [M, K]; the columnwise copy gets their transpose) and scale_inv,
   written here by hand: no quantize involved. */
static void hand_storage(const module *m, const void *cfg, uint32_t dir, int64_t M, int64_t K,
                         const uint8_t *codes, float si, hq_storage *st) {
  hq_storage other;
  make_storages(m, cfg, M, K, dir, dir == HQ_ROWWISE ? st : &other,
                dir == HQ_COLWISE ? st : &other);
  uint8_t *q = hq_storage_buf(st, 0)->ptr;
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++) q[dir == HQ_ROWWISE ? i * K + k : k * M + i] = codes[i * K + k];
  *(float *)hq_storage_buf(st, 1)->ptr = si;
}

static void free_storage(hq_storage *st) {
  for (uint32_t i = 0; i < st->nbuf; i++) free(hq_storage_buf(st, i)->ptr);
}

/* Raw dequantize of hand-built storages: the codes' values, worked out by hand, without the
   scale_inv, in f32, bf16 and f16 and from either direction; the normal dequantize of the same
   storage multiplies them by scale_inv. E4M3: 0x38 = 1, 0xC0 = -2, 0x44 = 1.5*2 = 3,
   0x7E = 1.75*2^8 = 448, 0x01 = 1*2^-9 (subnormal), 0x7F = NaN, 0x80 = -0, 0x3F = 1.875.
   E5M2: 0x3C = 1, 0x7B = 1.75*2^15 = 57344, 0x01 = 2^-16, 0x7C = Inf, 0xFC = -Inf,
   0x7D = NaN. */
static void test_raw_dequantize_hand(void **state) {
  (void)state;
  module m = open_module();
  const struct {
    int e5m2;
    int64_t M, K;
    uint8_t codes[8];
    float want[8];
  } sets[2] = {
      {0, 2, 4, {0x38, 0xc0, 0x44, 0x7e, 0x01, 0x7f, 0x80, 0x3f},
       {1.0f, -2.0f, 3.0f, 448.0f, 0x1p-9f, NAN, -0.0f, 1.875f}},
      {1, 2, 3, {0x3c, 0x7b, 0x01, 0x7c, 0xfc, 0x7d},
       {1.0f, 57344.0f, 0x1p-16f, INFINITY, -INFINITY, NAN}},
  };
  const float si = 0.3f; /* any scale_inv: the raw values do not see it */
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (int t = 0; t < 2; t++) {
    void *cfg = configure(&m, sets[t].e5m2, 0, 0.0);
    const int64_t M = sets[t].M, K = sets[t].K, n = M * K;
    for (uint32_t dir = 1; dir <= 2; dir++) {
      hq_storage st;
      hand_storage(&m, cfg, dir, M, K, sets[t].codes, si, &st);
      for (int o = 0; o < 3; o++) {
        hq_tensor y = hq_test_empty(outs[o], M, K), z = hq_test_empty(outs[o], M, K);
        hq_call call = hq_test_call(&m.host, 0, 0);
        call.flags = HQ_CALL_DEQ_RAW;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, &st, &y));
        call.flags = 0;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, &st, &z));
        for (int64_t i = 0; i < n; i++) {
          const float want = sets[t].want[i], got = hq_load_hp(y.data, i, outs[o]);
          const float deq = hq_load_hp(z.data, i, outs[o]);
          if (isnan(want)) {
            if (!isnan(got) || !isnan(deq))
              fail_msg("set %d dir %u %s [%lld]: NaN expected", t, dir, hq_dtype_name(outs[o]),
                       (long long)i);
            continue;
          }
          if (f32_bits(got) != f32_bits(want))
            fail_msg("set %d dir %u %s [%lld]: raw %a, expected %a", t, dir,
                     hq_dtype_name(outs[o]), (long long)i, (double)got, (double)want);
          /* the normal dequantize: RN(value * scale_inv), then the destination dtype */
          float wd = (float)((double)want * (double)si);
          if (outs[o] == HQ_BF16) wd = hq_bf16_to_f32(hq_f32_to_bf16(wd));
          if (outs[o] == HQ_F16) wd = hq_f16_to_f32(hq_f32_to_f16(wd));
          if (f32_bits(deq) != f32_bits(wd))
            fail_msg("set %d dir %u %s [%lld]: dequantize %a, expected %a", t, dir,
                     hq_dtype_name(outs[o]), (long long)i, (double)deq, (double)wd);
        }
        free(y.data);
        free(z.data);
      }
      /* the factor is the storage's scale_inv */
      float f = -1.0f;
      hq_call call = hq_test_call(&m.host, 0, 0);
      HQ_OK_OR_FAIL(m.ops->tensor_factor(cfg, &call, &st, &f));
      assert_true(f32_bits(f) == f32_bits(si));
      free_storage(&st);
    }
    free(cfg);
  }
}

/* The invariant of the factor, on quantized storages of every option set, both directions, with
   NaN, Inf and tiny inputs: tensor_factor() is the storage's scale_inv; for every element the
   raw value is the code's FP8 value (tests/fp8_ref.h) and RN_f32(raw * factor) (an exact double
   product rounded once) equals the normal dequantize into f32, bit for bit (NaN: both NaN). A
   storage of another instance gives the same raw values and factor. */
static void test_raw_factor_invariant(void **state) {
  (void)state;
  module m = open_module();
  const struct {
    int e5m2, pow2;
    double eps;
  } cfgs[] = {{0, 0, 0.0}, {1, 0, 0.0}, {0, 1, 0.0}, {1, 1, 0.5}, {0, 0, 100.0}};
  const int64_t shapes[][2] = {{37, 53}, {1, 1}, {64, 48}};
  void *other = configure(&m, 1, 1, 0.0);
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    void *cfg = configure(&m, cfgs[c].e5m2, cfgs[c].pow2, cfgs[c].eps);
    for (size_t sh = 0; sh < 3; sh++) {
      const int64_t M = shapes[sh][0], K = shapes[sh][1], n = M * K;
      hq_tensor x = hq_test_tensor(HQ_F32, M, K, 300 + sh + 10 * c, 50.0f);
      if (n > 4) {
        ((float *)x.data)[1] = NAN;
        ((float *)x.data)[2] = 1e-30f;
        ((float *)x.data)[3] = -3e-7f;
      }
      if (sh == 2) ((float *)x.data)[7] = INFINITY; /* amax Inf: scale 1, Inf saturates */
      hq_storage row, col;
      make_storages(&m, cfg, M, K, HQ_BOTH, &row, &col);
      hq_call call = hq_test_call(&m.host, 0, 0);
      HQ_OK_OR_FAIL(m.ops->quantize(cfg, &call, &x, HQ_BOTH, &row, &col));
      for (uint32_t dir = 1; dir <= 2; dir++) {
        const hq_storage *st = dir == HQ_ROWWISE ? &row : &col;
        const uint8_t *q = hq_storage_cbuf(st, 0)->ptr;
        const float si = *(const float *)hq_storage_cbuf(st, 1)->ptr;
        float f = -1.0f, f2 = -1.0f;
        HQ_OK_OR_FAIL(m.ops->tensor_factor(cfg, &call, st, &f));
        HQ_OK_OR_FAIL(m.ops->tensor_factor(other, &call, st, &f2));
        assert_true(f32_bits(f) == f32_bits(si));
        assert_true(f32_bits(f2) == f32_bits(si));
        hq_tensor raw = hq_test_empty(HQ_F32, M, K), raw2 = hq_test_empty(HQ_F32, M, K);
        hq_tensor deq = hq_test_empty(HQ_F32, M, K);
        hq_call rc = call;
        rc.flags = HQ_CALL_DEQ_RAW;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &rc, st, &raw));
        HQ_OK_OR_FAIL(m.ops->dequantize(other, &rc, st, &raw2));
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, st, &deq));
        assert_memory_equal(raw.data, raw2.data, (size_t)n * 4);
        for (int64_t i = 0; i < M; i++)
          for (int64_t k = 0; k < K; k++) {
            const float r = ((float *)raw.data)[i * K + k], d = ((float *)deq.data)[i * K + k];
            const uint8_t code = q[dir == HQ_ROWWISE ? i * K + k : k * M + i];
            const double want = ref_fp8_decode(code, cfgs[c].e5m2);
            if (isnan(want)) {
              assert_true(isnan(r) && isnan(d));
              continue;
            }
            if ((double)r != want) fail_msg("raw %a, code value %a", (double)r, want);
            const float prod = (float)((double)r * (double)f);
            if (f32_bits(prod) != f32_bits(d))
              fail_msg("cfg %zu [%lld, %lld] dir %u (%lld, %lld): RN(raw %a * factor %a) = %a, "
                       "dequantize %a", c, (long long)M, (long long)K, dir, (long long)i,
                       (long long)k, (double)r, (double)f, (double)prod, (double)d);
          }
        free(raw.data);
        free(raw2.data);
        free(deq.data);
      }
      free_storages(HQ_BOTH, &row, &col);
      free(x.data);
    }
    free(cfg);
  }
  free(other);
}

/* ABI 2.3 (HQ_CAP_DEQ_FACTOR), on hand-built storages of both element dtypes and directions, one
   with no rows among them: a raw dequantize with call->factor_out writes the values of a plain
   raw dequantize and RN(1.5 * scale_inv) there (the exact double product rounded once: a
   subnormal scale_inv too), chained through factor_in RN(that * scale_inv) with factor_mul
   ignored; without HQ_CALL_DEQ_RAW, or from a call struct older than 2.3, factor_out is left
   alone. */
static void test_deq_factor_out(void **state) {
  (void)state;
  module m = open_module();
  assert_true(m.ops->caps & HQ_CAP_DEQ_FACTOR);
  const uint8_t codes[6] = {0x38, 0xc0, 0x44, 0x7e, 0x01, 0x3f};
  const float sis[2] = {0.3f, 0x1.8p-130f};
  for (int e5 = 0; e5 < 2; e5++) {
    void *cfg = configure(&m, e5, 0, 0.0);
    assert_true(m.ops->instance_caps(cfg) & HQ_CAP_DEQ_FACTOR);
    const double si = sis[e5];
    const float w0 = (float)(1.5 * si), w1 = (float)((double)w0 * si);
    for (int empty = 0; empty < 2; empty++)
      for (uint32_t dir = 1; dir <= 2; dir++) {
        const int64_t M = empty ? 0 : 2, K = 3;
        hq_storage st;
        hand_storage(&m, cfg, dir, M, K, codes, sis[e5], &st);
        hq_tensor plain = hq_test_empty(HQ_F32, M, K), y = hq_test_empty(HQ_F32, M, K);
        hq_call c = hq_test_call(&m.host, 0, 0);
        c.flags = HQ_CALL_DEQ_RAW;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &c, &st, &plain));
        float out[2] = {-1.0f, -1.0f};
        c.factor_out = &out[0];
        c.factor_mul = 1.5f;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &c, &st, &y));
        if (M && memcmp(y.data, plain.data, (size_t)(M * K) * sizeof(float)))
          fail_msg("e5m2 %d dir %u: the values differ from a plain raw dequantize", e5, dir);
        c.factor_out = &out[1];
        c.factor_in = &out[0];
        c.factor_mul = 99.0f; /* ignored: factor_in is set */
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &c, &st, &y));
        if (f32_bits(out[0]) != f32_bits(w0) || f32_bits(out[1]) != f32_bits(w1))
          fail_msg("e5m2 %d empty %d dir %u: factors %a, %a; want RN(1.5 * %a) = %a, then %a",
                   e5, empty, dir, (double)out[0], (double)out[1], si, (double)w0, (double)w1);
        float untouched = -7.0f;
        c.flags = 0;
        c.factor_out = &untouched;
        c.factor_in = NULL;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &c, &st, &y));
        c.flags = HQ_CALL_DEQ_RAW;
        c.struct_size = HQ_CALL_SIZE_2_2;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &c, &st, &y));
        assert_true(untouched == -7.0f);
        free(plain.data);
        free(y.data);
        free_storage(&st);
      }
    free(cfg);
  }
}

/* emul_dtype is BF16 for every instance, and rightly: every one of the 256 codes of E4M3 and of
   E5M2, dequantized raw into bf16, is the code's value exactly (its raw f32 value read back), the
   largest (448, 57344) and the subnormals (2^-9, 2^-16) included. */
static void test_emul_dtype_exact(void **state) {
  (void)state;
  module m = open_module();
  for (int e5m2 = 0; e5m2 < 2; e5m2++)
    for (int pow2 = 0; pow2 < 2; pow2++) {
      void *cfg = configure(&m, e5m2, pow2, 0.0);
      uint8_t codes[256];
      for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
      for (uint32_t dir = 1; dir <= 2; dir++) {
        hq_storage st;
        hand_storage(&m, cfg, dir, 16, 16, codes, 0.1f, &st);
        assert_int_equal(st.desc.emul_dtype, HQ_BF16);
        hq_tensor rf = hq_test_empty(HQ_F32, 16, 16), rb = hq_test_empty(HQ_BF16, 16, 16);
        hq_call call = hq_test_call(&m.host, 0, 0);
        call.flags = HQ_CALL_DEQ_RAW;
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, &st, &rf));
        HQ_OK_OR_FAIL(m.ops->dequantize(cfg, &call, &st, &rb));
        for (int i = 0; i < 256; i++) {
          const double v = ref_fp8_decode((unsigned)i, e5m2);
          const float f = ((float *)rf.data)[i], b = hq_bf16_to_f32(((uint16_t *)rb.data)[i]);
          if (isnan(v)) {
            assert_true(isnan(f) && isnan(b));
            continue;
          }
          if ((double)f != v || (double)b != v || !!signbit(b) != !!signbit(v))
            fail_msg("%s code 0x%02x: value %a, raw f32 %a, raw bf16 %a", e5m2 ? "e5m2" : "e4m3",
                     i, v, (double)f, (double)b);
        }
        free(rf.data);
        free(rb.data);
        free_storage(&st);
      }
      free(cfg);
    }
}

// --- hq_gemm on the host -------------------------------------------------------------------------

/* D = alpha * op(A) * op(B) + beta * D0 in F64 from the dequantized operands (row-major [A0, A1]
   and [B0, B1], as hq_dequantize writes them), D row-major [n, m]; *bound receives, per element,
   the FP32 accumulation bound (k + 8) * 2^-24 * (|alpha| sum |a||b| + |beta D0|). */
static void gemm_ref(const float *a, const float *b, const float *d0, int ta, int tb, int64_t m,
                     int64_t n, int64_t k, double alpha, double beta, double *ref, double *bound) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        const double x = ta ? a[i * k + p] : a[p * m + i];
        const double y = tb ? b[p * n + j] : b[j * k + p];
        s += x * y;
        sa += fabs(x * y);
      }
      const double c = d0 ? beta * d0[j * m + i] : 0.0;
      ref[j * m + i] = alpha * s + c;
      bound[j * m + i] = (double)(k + 8) * 0x1p-24 * (fabs(alpha) * sa + fabs(c)) + 1e-30;
    }
}

/* hq_gemm of two fp8_tensor operands on the host (every flag pair, e4m3 and e5m2 mixed, F32 and
   BF16 D, beta) equals the F64 product of their hq_dequantize outputs within FP32 accumulation
   error (BF16 D: plus its rounding); the path is CPU and hq_gemm_plan says why it is not native
   (this module's answer, naming the host). */
static void test_hq_gemm_host(void **state) {
  (void)state;
  hq_ctx *ctx = host_ctx();
  hq_recipe *r = hq_test_recipe("[format a]\nplugin = fp8_tensor\n[format b]\nplugin = fp8_tensor\n"
                                "dtype = e5m2\n[role *:*:a]\nrowwise = a\ncolumnwise = a\n"
                                "[role *:*:b]\nrowwise = b\ncolumnwise = b\n");
  hq_quantizer *qa = hq_test_quantizer(r, "l:w:a"), *qb = hq_test_quantizer(r, "l:x:b");
  const int64_t M = 24, N = 40, K = 72;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int dt = 0; dt < 2; dt++) {
        const hq_dtype ddt = dt ? HQ_BF16 : HQ_F32;
        const int64_t a0 = ta ? M : K, a1 = ta ? K : M, b0 = tb ? K : N, b1 = tb ? N : K;
        hq_tensor xa = hq_test_tensor(HQ_F32, a0, a1, 11 + ta, 3.0f);
        hq_tensor xb = hq_test_tensor(HQ_F32, b0, b1, 21 + tb, 0.02f);
        hq_qtensor *A = NULL, *B = NULL;
        HQ_OK_OR_FAIL(hq_quantize(qa, ctx, &xa, &A));
        HQ_OK_OR_FAIL(hq_quantize(qb, ctx, &xb, &B));
        hq_tensor fa = hq_test_empty(HQ_F32, a0, a1), fb = hq_test_empty(HQ_F32, b0, b1);
        HQ_OK_OR_FAIL(hq_dequantize(A, ctx, ta ? HQ_ROWWISE : HQ_COLWISE, &fa));
        HQ_OK_OR_FAIL(hq_dequantize(B, ctx, tb ? HQ_COLWISE : HQ_ROWWISE, &fb));
        hq_tensor d = hq_test_tensor(ddt, N, M, 31, 1.0f);
        float *d0 = malloc(sizeof(float) * (size_t)(M * N));
        for (int64_t i = 0; i < M * N; i++) d0[i] = hq_load_hp(d.data, i, ddt);
        hq_gemm_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        HQ_OK_OR_FAIL(hq_gemm_plan(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, NULL,
                                   &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
        assert_non_null(strstr(info.reason, "host"));
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        HQ_OK_OR_FAIL(hq_gemm(ctx, hq_operand_q(A), ta, hq_operand_q(B), tb, &d, 1.5f, 0.5f, NULL,
                              &info));
        assert_int_equal(info.path, HQ_GEMM_PATH_CPU);
        assert_string_equal(info.format_a, "fp8_tensor");
        assert_string_equal(info.format_b, "fp8_tensor");
        assert_int_equal(info.dir_a, ta ? HQ_ROWWISE : HQ_COLWISE);
        assert_int_equal(info.dir_b, tb ? HQ_COLWISE : HQ_ROWWISE);
        double *ref = malloc(sizeof(double) * (size_t)(M * N));
        double *bnd = malloc(sizeof(double) * (size_t)(M * N));
        gemm_ref(fa.data, fb.data, d0, ta, tb, M, N, K, 1.5, 0.5, ref, bnd);
        for (int64_t i = 0; i < M * N; i++) {
          const double got = hq_load_hp(d.data, i, ddt);
          const double tol = bnd[i] + (dt ? fabs(ref[i]) * 0x1p-8 : 0.0);
          if (fabs(got - ref[i]) > tol)
            fail_msg("ta %d tb %d %s [%lld]: %.9g, F64 reference %.9g (tolerance %.3g)", ta, tb,
                     hq_dtype_name(ddt), (long long)i, got, ref[i], tol);
        }
        free(ref);
        free(bnd);
        free(d0);
        free(d.data);
        free(fa.data);
        free(fb.data);
        free(xa.data);
        free(xb.data);
        hq_qtensor_free(A);
        hq_qtensor_free(B);
      }
  hq_quantizer_free(qa);
  hq_quantizer_free(qb);
  hq_recipe_free(r);
  hq_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),
      cmocka_unit_test(test_scale_options),
      cmocka_unit_test(test_nan_inf),
      cmocka_unit_test(test_layout_and_dtypes),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_desc_and_buffers),
      cmocka_unit_test(test_ops_direct),
      cmocka_unit_test(test_caller_amax_rule),
      cmocka_unit_test(test_raw_dequantize_hand),
      cmocka_unit_test(test_raw_factor_invariant),
      cmocka_unit_test(test_deq_factor_out),
      cmocka_unit_test(test_emul_dtype_exact),
      cmocka_unit_test(test_hq_gemm_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
