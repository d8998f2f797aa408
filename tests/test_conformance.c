/*
** test_conformance.c -- the contract every format module meets, checked on every module the
** test plugin path holds (the stock formats, identity, and tests/plugins/third_party's
** int8_tensor, a module written as a third party would write it), each over a few instances:
** its defaults, one instance per non-default value of each boolean and enum option (read from the
** module's option table), and a short table of option combinations for the modules it knows.
**
** Per instance, through the public API on the host:
**   quantize     every shape of a small list is quantized or refused with HQ_ESHAPE, by
**                hq_quantize and hq_make_empty alike; the qtensor has the usage's directions;
**                dequantize(quantize(x)) is within the error bound the storage's descriptor
**                implies (below); BF16 and F16 destinations get the F32 values rounded to
**                nearest; a requant-safe instance quantizes the same input to the same bytes; an
**                update equals a fresh quantize, and a quantize or an update given the
**                quantizer's own amax (hq_quantizer_amax) equals one without it, byte for byte;
**   exact        zeros dequantize to zeros; powers of two dequantize exactly where the storage
**                promises it (every scale a power of two, no transform); a requant-safe instance
**                is idempotent where its storage promises that (below);
**   cross        a storage made by one instance (every shape it takes, every usage, a NaN in
**                the input) and dequantized by every other instance of the same module (its ops
**                called directly) gives the same values, in F32, BF16 and F16;
**   fsdp         2 and 4 shards with a shared amax, extracted, concatenated and assigned, equal
**                the whole tensor quantized with that amax, byte for byte (a buffer the module
**                gathers itself, ABI 2.4, included); or, where the storages' descriptions and
**                the module's FSDP forms say they cannot be gathered, hq_fsdp_extract refuses with
**                the status the protocol names, before any byte moves (an amax buffer of a
**                direction that takes no shared amax is the local shard's: docs/formats.md, 8);
**   offload      save, every buffer copied to other memory of the context and the original
**                freed, restore: the same bytes and the same dequantized values;
**   checkpoint   a safetensors file written and read back into an empty qtensor: the same bytes
**                (skipped, saying so, when libhqcore was built without jansson).
**
** The error bound. A storage's descriptor names its element dtype and the block that shares one
** scale (block_m x block_k; 0 x 0 for one scale per tensor). With B the largest |x| of the
** element's block and T that of the tensor, every element satisfies
**     |x - dequantize(quantize(x))| <= c * B + T * 2^-16
** where c is half a step at the top of the element's range (a whole step for an instance that
** rounds stochastically: not requant-safe and keeping no state) plus as much again for the
** scale's rounding and a saturated top (elem_c), and T * 2^-16 covers block scales that
** underflow their own dtype. A stateful instance (delayed scaling) is first given one step of the
** same input, so that its scale fits it. An RHT16 storage is quantized in the transformed domain:
** for its group g of 16 values along the contraction dimension the (orthonormal) inverse
** transform bounds every element by 4 * (c * ||g||_2 * (1 + 2^-7) + T * 2^-16) + 2^-8 * |x| (the
** input's and the transform's BF16 roundings).
**
** Idempotence is checked where the storage promises it (check_idempotent): byte for byte after
** one round without a scale, after two with power-of-two scales. Not beyond: a scale recomputed
** from the dequantized values may move (an E8M0 block scale when the block's largest element
** rounded up into the next binade; an FP32 scale RN(max / amax) by an ulp).
**
** The number of checks each module ran is printed per test ("[ checks ] nvfp4: fsdp: ...").
*/
#include <math.h>
#include <unistd.h>

#include "hq_test.h"

// --- the modules and their instances ----------------------------------------------------------

#define MAX_OPTS 8
#define MAX_INST 24

typedef struct inst {
  char label[160];         /* "nvfp4 rht=true" */
  char text[MAX_OPTS][64]; /* "key=value" */
  const char *opts[MAX_OPTS];
  size_t nopts;
} inst;

typedef struct pcase {
  const hq_plugin *p;
  const char *name;
  inst in[MAX_INST];
  size_t n;
  void *dl; /* the module opened again for direct calls (NULL: built in) */
  const hq_format_ops *ops;
  hq_host_api host;
  unsigned long checks; /* of the running test */
} pcase;

/* Option combinations beyond one option at a time, for the modules this test knows. */
static const struct {
  const char *plugin, *opts;
} k_extras[] = {
    {"fp8_tensor", "dtype=e5m2,power_2_scales=true,amax_epsilon=0.5"},
    {"fp8_tensor", "scaling=delayed,amax_history_len=4,amax_compute_algo=most_recent,margin=1"},
    {"mxfp8", "dtype=e5m2,block_2d=true"},
    {"mxfp8", "swizzle=true,block_2d=true"},
    {"nvfp4", "rht=true,rht_sign_mask=0x1234"},
    {"nvfp4", "block_2d=true,swizzle=true"},
    {"nvfp4", "rht=true,stochastic_rounding=true,seed=7"},
    {"nvfp4", "global_scale=row,stochastic_rounding=true"},
    {"nvfp4", "global_scale=row,scale_dtype=ue5m3,swizzle=true"},
    {"nvfp4", "scale_dtype=ue5m3,rht=true"},
    {"nvfp4", "scale_dtype=ue5m3,global_scale=none,block_2d=true"},
    {"fp8_block", "block=2d,dtype=e5m2,power_2_scales=false"},
    {"fp8_block", "power_2_scales=false,amax_epsilon=0.001"},
    {"int8_tensor", "columnwise=copy,shared_scale=false"},
};

/* The modules every run must cover (the stock formats, identity, the third-party fixture). */
static const char *const k_expected[] = {"identity", "fp8_tensor", "mxfp8",
                                         "nvfp4",    "fp8_block",  "int8_tensor"};

static hq_plugins *g_set;
static hq_ctx *g_ctx;
static pcase g_cases[32];
static size_t g_ncases;

static void inst_add(pcase *pc, const char *opts) {
  assert_true(pc->n < MAX_INST);
  inst *in = &pc->in[pc->n++];
  memset(in, 0, sizeof *in);
  snprintf(in->label, sizeof in->label, "%s%s%s", pc->name, *opts ? " " : "", opts);
  for (const char *s = opts; *s;) {
    const size_t len = strcspn(s, ",");
    assert_true(in->nopts < MAX_OPTS && len < sizeof in->text[0]);
    memcpy(in->text[in->nopts], s, len);
    in->opts[in->nopts] = in->text[in->nopts];
    in->nopts++;
    s += len + (s[len] == ',');
  }
}

/* A quantizer of instance `in` of module `plugin` for both directions (one fused instance). */
static int inst_quantizer(const inst *in, const char *plugin, hq_quantizer **q) {
  hq_format_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.struct_size = sizeof spec;
  spec.plugin = plugin;
  spec.options = in->opts;
  spec.n_options = in->nopts;
  return hq_quantizer_create_direct(g_set, &spec, &spec, HQ_SOURCE_ORIGINAL, q);
}

static int bool_text(const char *s) {
  return !strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on") || !strcmp(s, "1");
}

/* One option set apart from the defaults: a module may refuse it as a combination its option
   table cannot express (configure(): HQ_EINVAL, plugin.h), e.g. an option of a mode the defaults
   do not select; it is then left out. */
static void inst_add_derived(pcase *pc, const char *kv) {
  inst_add(pc, kv);
  const inst *in = &pc->in[pc->n - 1];
  hq_quantizer *q = NULL;
  const int rc = inst_quantizer(in, pc->name, &q);
  if (rc == HQ_OK) {
    hq_quantizer_free(q);
    return;
  }
  if (rc != HQ_EINVAL) fail_msg("%s: refused with %d: %s", in->label, rc, hq_last_error());
  print_message("[ left out ] %s: %s\n", in->label, hq_last_error());
  pc->n--;
}

/* The defaults, each boolean option flipped, each enum option at each other choice, and the
   extras. */
static void build_instances(pcase *pc) {
  inst_add(pc, "");
  char kv[160];
  for (const hq_option *o = hq_plugin_options(pc->p); o->name; o++) {
    if (o->type == HQ_OPT_BOOL) {
      snprintf(kv, sizeof kv, "%s=%s", o->name, bool_text(o->def) ? "false" : "true");
      inst_add_derived(pc, kv);
    } else if (o->type == HQ_OPT_ENUM) {
      for (const char *c = o->choices; *c;) {
        const size_t len = strcspn(c, "|");
        if (strlen(o->def) != len || strncmp(c, o->def, len)) {
          snprintf(kv, sizeof kv, "%s=%.*s", o->name, (int)len, c);
          inst_add_derived(pc, kv);
        }
        c += len + (c[len] == '|');
      }
    }
  }
  for (size_t i = 0; i < sizeof k_extras / sizeof k_extras[0]; i++)
    if (!strcmp(k_extras[i].plugin, pc->name)) inst_add(pc, k_extras[i].opts);
}

static void count(pcase *pc) { pc->checks++; }

static void report(pcase *pc, const char *what) {
  print_message("[ checks ] %s: %s: %zu instances, %lu checks\n", pc->name, what, pc->n,
                pc->checks);
}

// --- quantizers, tensors, comparisons ---------------------------------------------------------

/* A quantizer of instance `in` with usage `usage`, bound to a state of its own (delayed scaling
   needs one; a stateless quantizer takes no slice). */
typedef struct qz {
  hq_quantizer *q;
  hq_state *st;
} qz;

static qz qz_open(const inst *in, const char *plugin, uint32_t usage) {
  qz z = {NULL, NULL};
  if (inst_quantizer(in, plugin, &z.q)) fail_msg("%s: %s", in->label, hq_last_error());
  assert_int_equal(hq_quantizer_fused(z.q), 1);
  HQ_OK_OR_FAIL(hq_quantizer_set_usage(z.q, usage));
  HQ_OK_OR_FAIL(hq_state_create(NULL, g_ctx, &z.st));
  HQ_OK_OR_FAIL(hq_quantizer_bind_state(z.q, z.st));
  return z;
}
static void qz_close(qz *z) {
  hq_quantizer_free(z->q);
  hq_state_free(z->st);
}
/* A stateful instance takes its scale from earlier steps: one step of x first, so that the
   scale fits x as a current-scaling scale would. */
static void qz_prime(qz *z, const hq_tensor *x) {
  if (!hq_state_slice_count(z->st)) return;
  hq_qtensor *qt = NULL;
  HQ_OK_OR_FAIL(hq_quantize(z->q, g_ctx, x, &qt));
  hq_qtensor_free(qt);
  HQ_OK_OR_FAIL(hq_state_update(z->st, g_ctx));
}

/* Not requant-safe without keeping state: the instance draws random bits (stochastic rounding). */
static int qz_stochastic(const qz *z) {
  return !hq_quantizer_requant_safe(z->q) && !hq_state_slice_count(z->st);
}

/* N(0,1) values with rows of different magnitudes (2^-2 .. 2^2), so that blocks differ. */
static hq_tensor input(hq_dtype t, int64_t M, int64_t K, uint64_t seed) {
  hq_tensor x = hq_test_tensor(t, M, K, seed, 1.0f);
  for (int64_t i = 0; i < M; i++)
    for (int64_t k = 0; k < K; k++)
      hq_store_hp(x.data, i * K + k, t,
                  hq_load_hp(x.data, i * K + k, t) * ldexpf(1.0f, (int)(i % 5) - 2));
  return x;
}

static hq_tensor deq(const hq_qtensor *qt, uint32_t dir, hq_dtype t) {
  hq_tensor d = hq_test_empty(t, hq_qtensor_rows(qt), hq_qtensor_cols(qt));
  HQ_OK_OR_FAIL(hq_dequantize(qt, g_ctx, dir, &d));
  return d;
}

static const char *dir_name(uint32_t dir) { return dir == HQ_ROWWISE ? "rowwise" : "columnwise"; }

/* Every byte of every buffer of qt set to 0xFF. */
static void poison(hq_qtensor *qt) {
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; st && i < st->nbuf; i++)
      memset(hq_storage_cbuf(st, i)->ptr, 0xFF, hq_storage_cbuf(st, i)->bytes);
  }
}

/* A copy of every buffer of qt (rowwise first, in buffer order), to compare with later. */
typedef struct snap {
  uint8_t *bytes;
  size_t n;
} snap;
static snap snap_take(const hq_qtensor *qt) {
  snap s = {NULL, 0};
  for (int pass = 0; pass < 2; pass++) {
    size_t k = 0;
    for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
      const hq_storage *st = hq_qtensor_storage(qt, dir);
      for (uint32_t i = 0; st && i < st->nbuf; i++) {
        const hq_buffer *b = hq_storage_cbuf(st, i);
        if (pass) memcpy(s.bytes + k, b->ptr, b->bytes);
        k += b->bytes;
      }
    }
    if (!pass) s.bytes = malloc(k ? k : 1);
    s.n = k;
  }
  return s;
}
static void snap_same(const snap *s, const hq_qtensor *qt, const char *what) {
  snap t = snap_take(qt);
  assert_int_equal(t.n, s->n);
  if (memcmp(t.bytes, s->bytes, s->n)) fail_msg("%s: the buffers changed", what);
  free(t.bytes);
}

static int is_colwise_only_capable(const pcase *pc) {
  return (hq_plugin_caps(pc->p) & HQ_CAP_COLWISE_ONLY) != 0;
}

// --- the error bound --------------------------------------------------------------------------

/* c(elem): half a step at the top of the block, relative to the block's largest magnitude, plus
   as much again for the scale's rounding and a saturated top; stochastic rounding (sr) moves an
   element by up to a whole step. */
static double elem_c(hq_dtype t, int sr) {
  static const struct {
    hq_dtype t;
    double half, scale;
  } steps[] = {
      {HQ_E4M3, 0x1p-4, 0x1p-4},      /* 3 mantissa bits */
      {HQ_E5M2, 0x1p-3, 0x1p-3},      /* 2 mantissa bits */
      {HQ_E2M1X2, 1.0 / 6, 1.0 / 12}, /* the gap 4 .. 6 at a top of 6 */
      {HQ_E3M2X4, 1.0 / 8, 1.0 / 16}, /* step 4 in [16, 32); 28 .. 32 saturates */
      {HQ_E2M3X4, 1.0 / 16, 1.0 / 32}, /* step 0.5 in [4, 8); 7.5 .. 8 saturates */
      {HQ_I8, 1.0 / 254, 1.0 / 254},  /* half a code of 127 */
      {HQ_BF16, 0x1p-8, 0},           /* no scale: the dtype itself */
      {HQ_F16, 0x1p-11, 0},           {HQ_F32, 0x1p-24, 0},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
    if (steps[i].t == t) return steps[i].half * (sr ? 2 : 1) + steps[i].scale;
  fail_msg("no error bound for element dtype %s", hq_dtype_name(t));
  return 0;
}

/* |x - y| within the bound of storage s for every element (x the source, y the F32 values). */
static void check_bound(const hq_storage *s, const hq_tensor *x, const float *y, int sr,
                        const char *what) {
  const int64_t M = x->rows, K = x->cols;
  /* MXFP4's power-of-two scale puts a block's top anywhere in [4, 8): half a step there (1) is
     up to a quarter of it, a saturated top loses as much, a stochastic step twice that */
  const double c = s->desc.elem == HQ_E2M1X2 && s->desc.scale_mode == HQ_SCALE_VEC32_UE8M0
                       ? 0.25 * (sr ? 2 : 1)
                       : elem_c(s->desc.elem, sr);
  double T = 0;
  for (int64_t i = 0; i < M * K; i++) T = fmax(T, fabs(hq_load_hp(x->data, i, x->dtype)));
  const double floor_ = T * 0x1p-16;
  if (s->desc.transform == HQ_TRANSFORM_RHT16) {
    const int along_m = s->dir == HQ_COLWISE; /* the contraction dimension */
    for (int64_t i = 0; i < M; i++)
      for (int64_t k = 0; k < K; k++) {
        const int64_t g0 = along_m ? i / 16 * 16 : k / 16 * 16;
        double l2 = 0;
        for (int64_t j = g0; j < g0 + 16 && j < (along_m ? M : K); j++) {
          const double v = hq_load_hp(x->data, along_m ? j * K + k : i * K + j, x->dtype);
          l2 += v * v;
        }
        const double xv = hq_load_hp(x->data, i * K + k, x->dtype);
        const double bound = 4 * (c * sqrt(l2) * (1 + 0x1p-7) + floor_) + 0x1p-8 * fabs(xv);
        if (!(fabs(xv - y[i * K + k]) <= bound))
          fail_msg("%s: [%lld, %lld] = %g dequantizes to %g, beyond %g (RHT16)", what, (long long)i,
                   (long long)k, xv, (double)y[i * K + k], bound);
      }
    return;
  }
  assert_int_equal(s->desc.transform, HQ_TRANSFORM_NONE);
  const int64_t bm = s->desc.block_m > 0 ? s->desc.block_m : M;
  const int64_t bk = s->desc.block_k > 0 ? s->desc.block_k : K;
  for (int64_t i0 = 0; i0 < M; i0 += bm)
    for (int64_t k0 = 0; k0 < K; k0 += bk) {
      double B = 0;
      for (int64_t i = i0; i < i0 + bm && i < M; i++)
        for (int64_t k = k0; k < k0 + bk && k < K; k++)
          B = fmax(B, fabs(hq_load_hp(x->data, i * K + k, x->dtype)));
      const double bound = c * B + floor_;
      for (int64_t i = i0; i < i0 + bm && i < M; i++)
        for (int64_t k = k0; k < k0 + bk && k < K; k++) {
          const double xv = hq_load_hp(x->data, i * K + k, x->dtype);
          if (!(fabs(xv - y[i * K + k]) <= bound))
            fail_msg("%s: [%lld, %lld] = %g dequantizes to %g, beyond %g (block %dx%d of %s)", what,
                     (long long)i, (long long)k, xv, (double)y[i * K + k], bound, s->desc.block_m,
                     s->desc.block_k, hq_dtype_name(s->desc.elem));
        }
    }
}

// --- quantize / dequantize ---------------------------------------------------------------------

/* Edge and block-straddling shapes; [128, 256] is a multiple of every stock block. */
static const int64_t k_shapes[][2] = {{1, 1}, {37, 53}, {64, 96}, {128, 256}, {257, 131}};

/* One instance, one shape, source dtype and usage: returns 0 when the shape is refused. */
static int check_quantize(pcase *pc, const inst *in, int64_t M, int64_t K, hq_dtype t,
                          uint32_t usage) {
  char what[320];
  snprintf(what, sizeof what, "%s [%lld, %lld] %s usage %u", in->label, (long long)M, (long long)K,
           hq_dtype_name(t), usage);
  qz z = qz_open(in, pc->name, usage);
  hq_tensor x = input(t, M, K, (uint64_t)(M * 131 + K + t));
  hq_tensor y = input(t, M, K, (uint64_t)(M * 131 + K + t + 7));
  for (int64_t i = 0; i < M * K; i++) /* the second input 8x larger: other scales */
    hq_store_hp(y.data, i, t, hq_load_hp(y.data, i, t) * 8.0f);
  if (M * K > 4) hq_store_hp(y.data, 2, t, NAN); /* which an amax ignores */
  qz_prime(&z, &x);
  hq_qtensor *qt = NULL, *e = NULL;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 5));
  const int rc = hq_quantize(z.q, g_ctx, &x, &qt);
  const int rc_empty = hq_make_empty(z.q, g_ctx, M, K, t, &e);
  if (rc != HQ_OK && rc != HQ_ESHAPE)
    fail_msg("%s: hq_quantize -> %d: %s", what, rc, hq_last_error());
  if (rc_empty != rc) fail_msg("%s: hq_make_empty -> %d, hq_quantize -> %d", what, rc_empty, rc);
  count(pc);
  if (rc == HQ_ESHAPE) {
    assert_null(qt);
    assert_null(e);
    free(x.data);
    free(y.data);
    qz_close(&z);
    return 0;
  }
  assert_int_equal(hq_qtensor_dirs(qt), usage);
  assert_int_equal(hq_qtensor_rows(qt), M);
  assert_int_equal(hq_qtensor_cols(qt), K);
  assert_int_equal(hq_qtensor_nominal_dtype(qt), t);
  assert_int_equal(hq_qtensor_dirs(e), usage);
  count(pc);
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    if (!(usage & dir)) continue;
    char wd[360];
    snprintf(wd, sizeof wd, "%s %s", what, dir_name(dir));
    hq_tensor f = deq(qt, dir, HQ_F32);
    check_bound(hq_qtensor_storage(qt, dir), &x, f.data, qz_stochastic(&z), wd);
    count(pc);
    /* narrower destinations: the F32 values rounded to nearest */
    const hq_dtype narrow[2] = {HQ_BF16, HQ_F16};
    for (int n = 0; n < 2; n++) {
      hq_tensor h = deq(qt, dir, narrow[n]), want = hq_test_empty(narrow[n], M, K);
      for (int64_t i = 0; i < M * K; i++)
        hq_store_hp(want.data, i, narrow[n], ((const float *)f.data)[i]);
      if (memcmp(h.data, want.data, (size_t)(M * K) * 2))
        fail_msg("%s: dequantize to %s is not the F32 values rounded", wd,
                 hq_dtype_name(narrow[n]));
      count(pc);
      free(h.data);
      free(want.data);
    }
    free(f.data);
  }
  /* requant-safe: the same input again gives the same bytes (the RNG offset has moved on) */
  if (hq_quantizer_requant_safe(z.q)) {
    hq_qtensor *again = NULL;
    HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &x, &again));
    hq_test_same_qtensors(qt, again, what);
    count(pc);
    hq_qtensor_free(again);
  }
  /* an update equals a fresh quantize of the new input (at the same RNG offset), also into
     buffers of garbage (padding included: every byte is rewritten) and into an empty qtensor */
  hq_qtensor *fresh = NULL;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &y, &fresh));
  poison(qt);
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  HQ_OK_OR_FAIL(hq_qtensor_update(qt, g_ctx, &y));
  hq_test_same_qtensors(fresh, qt, what);
  count(pc);
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  HQ_OK_OR_FAIL(hq_qtensor_update(e, g_ctx, &y));
  hq_test_same_qtensors(fresh, e, what);
  count(pc);
  /* the amax: an INPUT amax is max |y|, NaN ignored; a direction without one gets 0 */
  float want = 0.0f;
  for (int64_t i = 0; i < M * K; i++) {
    const float v = fabsf(hq_load_hp(y.data, i, t));
    if (v > want) want = v;
  }
  float a[2] = {-1.0f, -1.0f};
  HQ_OK_OR_FAIL(hq_quantizer_amax(z.q, g_ctx, &y, a));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const uint32_t kind = hq_quantizer_amax_kind(z.q, dir);
    if (kind == HQ_AMAX_NONE) assert_true(a[dir - 1] == 0.0f);
    if (kind == HQ_AMAX_INPUT && (usage & dir)) assert_true(a[dir - 1] == want);
  }
  count(pc);
  /* ... given back: the same bytes, through quantize_ex and update_ex; so are args without an
     amax, and any amax for a direction that takes none */
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  hq_qtensor *given = hq_test_quantize_ex(z.q, g_ctx, &y, a);
  hq_test_same_qtensors(fresh, given, what);
  count(pc);
  poison(qt);
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  hq_test_update_ex(qt, g_ctx, &y, a);
  hq_test_same_qtensors(fresh, qt, what);
  count(pc);
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  hq_qtensor *noamax = hq_test_quantize_ex(z.q, g_ctx, &y, NULL);
  hq_test_same_qtensors(fresh, noamax, what);
  count(pc);
  hq_qtensor_free(noamax);
  float bogus[2] = {a[0], a[1]};
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
    if (hq_quantizer_amax_kind(z.q, dir) == HQ_AMAX_NONE)
      bogus[dir - 1] = dir == 1 ? 1e30f : 1e-30f;
  HQ_OK_OR_FAIL(hq_ctx_set_rng_offset(g_ctx, 9));
  hq_qtensor *ignored = hq_test_quantize_ex(z.q, g_ctx, &y, bogus);
  hq_test_same_qtensors(fresh, ignored, what);
  count(pc);
  hq_qtensor_free(ignored);
  hq_qtensor_free(given);
  hq_qtensor_free(fresh);
  hq_qtensor_free(e);
  hq_qtensor_free(qt);
  free(x.data);
  free(y.data);
  qz_close(&z);
  return 1;
}

static void test_quantize(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (size_t i = 0; i < pc->n; i++)
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) {
      const int64_t M = k_shapes[s][0], K = k_shapes[s][1];
      /* every source dtype on one shape, BF16 on the others */
      const hq_dtype dts[3] = {HQ_BF16, HQ_F32, HQ_F16};
      const int ndt = M == 64 ? 3 : 1;
      int first = -1;
      for (int d = 0; d < ndt; d++)
        for (int u = 0; u < 3; u++) {
          if (usages[u] == HQ_COLWISE && !is_colwise_only_capable(pc)) continue;
          const int ok = check_quantize(pc, &pc->in[i], M, K, dts[d], usages[u]);
          if (first < 0) first = ok;
          if (ok != first)
            fail_msg("%s [%lld, %lld]: accepted for one usage or dtype, refused for another",
                     pc->in[i].label, (long long)M, (long long)K);
        }
      /* [128, 256], a multiple of every stock block, is a shape every format takes */
      if (M == 128 && K == 256 && !first) fail_msg("%s: refuses [128, 256]", pc->in[i].label);
    }
  report(pc, "quantize");
}

// --- exact values -----------------------------------------------------------------------------

static int is_pow2_or_zero(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return v == 0.0f ||
         ((u & 0x007fffffu) == 0 && (u & 0x7f800000u) != 0 && (u & 0x7f800000u) != 0x7f800000u);
}

/* The storage promises powers of two back exactly: data times one scale that is a power of two
   (or no scale at all), no transform. */
static int promises_pow2(const hq_storage *s) {
  if (s->desc.transform != HQ_TRANSFORM_NONE) return 0;
  /* E2M1 and E2M3 hold fewer binades of powers of two than the test's 2^-3 .. 2^3 */
  if (s->desc.elem == HQ_E2M1X2 || s->desc.elem == HQ_E2M3X4) return 0;
  switch (s->desc.scale_mode) {
  case HQ_SCALE_NONE:
  case HQ_SCALE_TENSOR_F32:
  case HQ_SCALE_VEC32_UE8M0:
  case HQ_SCALE_OUTER_VEC_F32:
  case HQ_SCALE_VEC128_F32:
  case HQ_SCALE_BLK128X128_F32:
    break;
  default:
    return 0;
  }
  for (uint32_t i = 0; i < s->nbuf; i++) {
    const hq_buffer *b = hq_storage_cbuf(s, i);
    if (b->role != HQ_ROLE_SCALE) continue;
    const int64_t n = (int64_t)(b->bytes / hq_dtype_size(b->dtype));
    for (int64_t j = 0; j < n; j++) {
      if (b->dtype == HQ_E8M0) {
        if (((const uint8_t *)b->ptr)[j] == 0xFF) return 0;
      } else if (b->dtype == HQ_F32) {
        if (!is_pow2_or_zero(((const float *)b->ptr)[j])) return 0;
      } else {
        return 0;
      }
    }
  }
  return 1;
}

/* Idempotence, where the storage promises it. Without a scale, dequantize then quantize gives
   the storage back: quantize(dequantize(quantize(x))) == quantize(x). With scales that are all
   powers of two (promises_pow2) the first round may still move a block's scale (its largest
   element can round up into the next binade), but after it every block's largest magnitude is a
   code at its scale, so the second round is a fixed point: with s = quantize(dequantize(
   quantize(x))), quantize(dequantize(s)) == s. Byte for byte, the values in F32 (exact). */
static void check_idempotent(pcase *pc, const inst *in, uint32_t dir, const hq_tensor *x) {
  qz z = qz_open(in, pc->name, dir);
  hq_qtensor *s[3] = {NULL, NULL, NULL};
  HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, x, &s[0]));
  for (int r = 1; r < 3; r++) {
    hq_tensor v = deq(s[r - 1], dir, HQ_F32);
    HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &v, &s[r]));
    free(v.data);
  }
  const hq_storage *st = hq_qtensor_storage(s[0], dir);
  char what[256];
  if (st->desc.scale_mode == HQ_SCALE_NONE) {
    snprintf(what, sizeof what, "%s %s: quantize(dequantize(quantize(x)))", in->label,
             dir_name(dir));
    hq_test_same_qtensors(s[0], s[1], what);
    count(pc);
  }
  if (promises_pow2(st) && promises_pow2(hq_qtensor_storage(s[1], dir))) {
    snprintf(what, sizeof what, "%s %s: quantize(dequantize(s)), s a requantization", in->label,
             dir_name(dir));
    hq_test_same_qtensors(s[1], s[2], what);
    count(pc);
  }
  for (int r = 0; r < 3; r++) hq_qtensor_free(s[r]);
  qz_close(&z);
}

/* The shape the exact-value, FSDP-free checks use: [64, 96], else [128, 256]. */
static void usable_shape(pcase *pc, const inst *in, int64_t *M, int64_t *K) {
  qz z = qz_open(in, pc->name, HQ_BOTH);
  hq_qtensor *e = NULL;
  *M = 64;
  *K = 96;
  if (hq_make_empty(z.q, g_ctx, 64, 96, HQ_BF16, &e) == HQ_ESHAPE) *M = 128, *K = 256;
  hq_qtensor_free(e);
  qz_close(&z);
}

static void test_exact(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  size_t pow2_checked = 0;
  for (size_t i = 0; i < pc->n; i++) {
    const inst *in = &pc->in[i];
    int64_t M, K;
    usable_shape(pc, in, &M, &K);
    const hq_dtype dts[2] = {HQ_BF16, HQ_F32};
    for (int d = 0; d < 2; d++) {
      const hq_dtype t = dts[d];
      /* zeros */
      qz z = qz_open(in, pc->name, HQ_BOTH);
      hq_tensor x = input(t, M, K, 3);
      qz_prime(&z, &x);
      hq_tensor zero = hq_test_empty(t, M, K);
      hq_qtensor *qt = NULL;
      HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &zero, &qt));
      for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
        hq_tensor f = deq(qt, dir, HQ_F32);
        for (int64_t j = 0; j < M * K; j++)
          if (((const float *)f.data)[j] != 0.0f)
            fail_msg("%s %s %s: zero dequantizes to %g at %lld", in->label, hq_dtype_name(t),
                     dir_name(dir), (double)((const float *)f.data)[j], (long long)j);
        count(pc);
        free(f.data);
      }
      hq_qtensor_free(qt);
      /* powers of two 2^-3 .. 2^3 of either sign, each block holding 2^3 */
      hq_tensor p2 = hq_test_empty(t, M, K);
      uint64_t s = 99;
      for (int64_t j = 0; j < M * K; j++) {
        const int e = (int)(hq_test_rand(&s) % 7) - 3;
        hq_store_hp(p2.data, j, t, ((hq_test_rand(&s) >> 7) & 1 ? -1.0f : 1.0f) * ldexpf(1, e));
      }
      for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < K; c++)
          if (r % 16 == 0 && c % 16 == 0) hq_store_hp(p2.data, r * K + c, t, 8.0f);
      HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &p2, &qt));
      for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
        if (!promises_pow2(hq_qtensor_storage(qt, dir))) continue;
        hq_tensor f = deq(qt, dir, HQ_F32);
        for (int64_t j = 0; j < M * K; j++)
          if (((const float *)f.data)[j] != hq_load_hp(p2.data, j, t))
            fail_msg("%s %s %s: %g dequantizes to %g", in->label, hq_dtype_name(t), dir_name(dir),
                     (double)hq_load_hp(p2.data, j, t), (double)((const float *)f.data)[j]);
        count(pc);
        pow2_checked++;
        free(f.data);
      }
      hq_qtensor_free(qt);
      if (t == HQ_F32 && hq_quantizer_requant_safe(z.q))
        for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
          if (dir == HQ_ROWWISE || is_colwise_only_capable(pc)) check_idempotent(pc, in, dir, &x);
      free(p2.data);
      free(zero.data);
      free(x.data);
      qz_close(&z);
    }
  }
  print_message("[ checks ] %s: exact: powers of two promised by %zu storages\n", pc->name,
                pow2_checked);
  report(pc, "exact");
}

// --- cross-instance dequantize (the module's ops called directly) ------------------------------

/* Option values as the core would hand them to configure(): the table's defaults, overridden by
   the instance's "key=value" strings. */
static void parse_options(const hq_option *o, const inst *in, hq_optval *v, size_t cap) {
  size_t n = 0;
  for (; o[n].name; n++) {
    assert_true(n < cap);
    const char *text = o[n].def;
    const size_t kl = strlen(o[n].name);
    for (size_t j = 0; j < in->nopts; j++)
      if (!strncmp(in->opts[j], o[n].name, kl) && in->opts[j][kl] == '=')
        text = in->opts[j] + kl + 1;
    memset(&v[n], 0, sizeof v[n]);
    switch (o[n].type) {
    case HQ_OPT_BOOL:
      v[n].i = bool_text(text);
      break;
    case HQ_OPT_INT:
      v[n].i = strtoll(text, NULL, 0);
      break;
    case HQ_OPT_FLOAT:
      v[n].f = strtod(text, NULL);
      break;
    case HQ_OPT_STRING:
      v[n].s = text;
      break;
    case HQ_OPT_ENUM: {
      int64_t idx = 0;
      const char *c = o[n].choices;
      for (;;) {
        const size_t len = strcspn(c, "|");
        if (strlen(text) == len && !strncmp(c, text, len)) break;
        if (!c[len]) fail_msg("%s: '%s' is not a choice of %s", in->label, text, o[n].name);
        c += len + 1;
        idx++;
      }
      v[n].i = idx;
      break;
    }
    default:
      fail_msg("option %s of unknown type %d", o[n].name, (int)o[n].type);
    }
  }
}

static void *direct_configure(pcase *pc, const inst *in) {
  hq_optval v[32];
  parse_options(pc->ops->options, in, v, 32);
  void *cfg = calloc(1, pc->ops->config_size ? pc->ops->config_size : 1);
  if (pc->ops->configure(cfg, v, &pc->host))
    fail_msg("%s: configure: %s", in->label, hq_test_module_error());
  return cfg;
}
static void direct_release(pcase *pc, void *cfg) {
  if (pc->ops->release) pc->ops->release(cfg);
  free(cfg);
}

static void test_cross(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  if (!pc->ops) {
    print_message("[ skipped ] %s: built into libhqcore, its ops are not reachable for direct "
                  "calls\n",
                  pc->name);
    skip();
  }
  void *cfg[MAX_INST];
  for (size_t b = 0; b < pc->n; b++) cfg[b] = direct_configure(pc, &pc->in[b]);
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  const hq_dtype outs[3] = {HQ_F32, HQ_BF16, HQ_F16};
  for (size_t a = 0; a < pc->n; a++)
    for (size_t sh = 0; sh < sizeof k_shapes / sizeof k_shapes[0]; sh++)
      for (int u = 0; u < 3; u++) {
        if (usages[u] == HQ_COLWISE && !is_colwise_only_capable(pc)) continue;
        const int64_t M = k_shapes[sh][0], K = k_shapes[sh][1];
        const hq_dtype t = outs[(sh + (size_t)u) % 3]; /* the source dtypes in turn */
        qz z = qz_open(&pc->in[a], pc->name, usages[u]);
        hq_tensor x = input(t, M, K, 11 + a);
        if (M * K > 2) hq_store_hp(x.data, 1, t, NAN); /* each format's NaN, read alike */
        qz_prime(&z, &x);
        hq_qtensor *qt = NULL;
        const int rc = hq_quantize(z.q, g_ctx, &x, &qt);
        if (rc != HQ_OK && rc != HQ_ESHAPE) fail_msg("%s: %s", pc->in[a].label, hq_last_error());
        for (uint32_t dir = HQ_ROWWISE; qt && dir <= HQ_COLWISE; dir++) {
          if (!(usages[u] & dir)) continue;
          const hq_storage *s = hq_qtensor_storage(qt, dir);
          for (int o = 0; o < 3; o++) {
            hq_tensor want = deq(qt, dir, outs[o]);
            for (size_t b = 0; b < pc->n; b++) {
              if (b == a) continue;
              hq_tensor got = hq_test_empty(outs[o], M, K);
              hq_call call = hq_test_call(&pc->host, 0, 0);
              if (pc->ops->dequantize(cfg[b], &call, s, &got))
                fail_msg("%s storage [%lld, %lld] %s: dequantized by %s: %s", pc->in[a].label,
                         (long long)M, (long long)K, dir_name(dir), pc->in[b].label,
                         hq_test_module_error());
              if (memcmp(got.data, want.data, (size_t)(M * K) * hq_dtype_size(outs[o])))
                fail_msg("%s storage [%lld, %lld] %s: %s dequantizes it to other %s values",
                         pc->in[a].label, (long long)M, (long long)K, dir_name(dir),
                         pc->in[b].label, hq_dtype_name(outs[o]));
              count(pc);
              free(got.data);
            }
            free(want.data);
          }
        }
        hq_qtensor_free(qt);
        free(x.data);
        qz_close(&z);
      }
  for (size_t b = 0; b < pc->n; b++) direct_release(pc, cfg[b]);
  report(pc, "cross-instance");
}

// --- FSDP ---------------------------------------------------------------------------------------

/* Whether the module gives buffer i of s an FSDP form (plugin ABI 2.4: it gathers the buffer
   itself), asked of the module directly with instance `in`'s configuration. */
static int fsdp_has_form(pcase *pc, const inst *in, const hq_storage *s, uint32_t i) {
  if (!pc->ops || pc->ops->struct_size < HQ_FORMAT_OPS_SIZE_2_4 || !pc->ops->fsdp_extract)
    return 0;
  void *cfg = direct_configure(pc, in);
  hq_buffer_form f;
  memset(&f, 0, sizeof f);
  f.struct_size = sizeof f;
  if (pc->ops->buffer_form(cfg, &pc->host, s, i, HQ_FORM_FSDP, &f))
    fail_msg("%s: buffer_form: %s", in->label, hq_test_module_error());
  direct_release(pc, cfg);
  return f.ndim != 0;
}

/* What hq_fsdp_extract must answer for a shard of ms rows, from the storages' descriptions and
   the module's FSDP forms alone (hq.h's protocol), and a piece of the message: a storage without
   a shard-row multiple ("cannot be sharded"), or with a buffer of its own that is never gathered
   and has no form (its name), is HQ_ENOTSUP; rows not a multiple of it, HQ_ESHAPE. */
static int fsdp_expect(pcase *pc, const inst *in, const hq_qtensor *shard, int64_t ms,
                       const char **why) {
  const int both = hq_qtensor_dirs(shard) == HQ_BOTH;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(shard, dir);
    if (!s) continue;
    *why = "cannot be sharded";
    if (s->desc.shard_rows <= 0) return HQ_ENOTSUP;
    *why = "not a multiple of";
    if (ms % s->desc.shard_rows) return HQ_ESHAPE;
    for (uint32_t i = 0; i < s->nbuf; i++) {
      const hq_buffer *b = hq_storage_cbuf(s, i);
      if (dir == HQ_COLWISE && both && (b->flags & HQ_BUF_SHARED)) continue;
      *why = b->name;
      if (b->gather == HQ_GATHER_NEVER && !fsdp_has_form(pc, in, s, i)) return HQ_ENOTSUP;
    }
  }
  *why = NULL;
  return HQ_OK;
}

static hq_tensor rows_of(const hq_tensor *x, int64_t r0, int64_t n) {
  return hq_tensor_2d((char *)x->data + (size_t)(r0 * x->cols) * hq_dtype_size(x->dtype), x->dtype,
                      x->device, n, x->cols);
}

/* The gathered tensor equals the whole one quantized with the shared amax, byte for byte -- but
   for an amax buffer of a direction that takes no shared amax (amax kind NONE: delayed scaling,
   whose scale comes from the state): gathered by SAME, it is the assigning shard's own amax
   (docs/formats.md, 8). */
static void same_gathered(const hq_qtensor *full, const hq_qtensor *ref, const hq_qtensor *local,
                          const hq_quantizer *q, const char *what) {
  assert_int_equal(hq_qtensor_dirs(full), hq_qtensor_dirs(ref));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *sf = hq_qtensor_storage(full, dir), *sr = hq_qtensor_storage(ref, dir);
    const hq_storage *sl = hq_qtensor_storage(local, dir);
    if (!sf) continue;
    assert_int_equal(sf->nbuf, sr->nbuf);
    for (uint32_t i = 0; i < sf->nbuf; i++) {
      const hq_buffer *x = hq_storage_cbuf(sf, i), *y = hq_storage_cbuf(sr, i);
      if (x->role == HQ_ROLE_AMAX && x->gather == HQ_GATHER_SAME &&
          hq_quantizer_amax_kind(q, dir) == HQ_AMAX_NONE)
        y = hq_storage_cbuf(sl, i);
      assert_string_equal(x->name, y->name);
      assert_int_equal(x->bytes, y->bytes);
      if (memcmp(x->ptr, y->ptr, x->bytes))
        fail_msg("%s: gathered %s buffer '%s' differs", what, dir_name(dir), x->name);
    }
  }
}

#define WORLD_MAX 4
#define SHARD_ROWS 128

static void fsdp_case(pcase *pc, const inst *in, int world, hq_dtype t, uint32_t usage) {
  const int64_t ms = SHARD_ROWS, M = world * ms, K = t == HQ_BF16 ? 160 : 96;
  char what[256];
  snprintf(what, sizeof what, "%s, %d shards, %s, usage %u", in->label, world, hq_dtype_name(t),
           usage);
  qz z = qz_open(in, pc->name, usage);
  hq_tensor x = input(t, M, K, 40 + (uint64_t)world);
  for (int64_t i = M / 2; i < M; i++) /* the later shards larger: the shared amax matters */
    for (int64_t k = 0; k < K; k++)
      hq_store_hp(x.data, i * K + k, t, hq_load_hp(x.data, i * K + k, t) * 16.0f);
  qz_prime(&z, &x);
  float shared[2] = {0, 0};
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(&x, s * ms, ms);
    float a[2];
    HQ_OK_OR_FAIL(hq_quantizer_amax(z.q, g_ctx, &xs, a));
    for (int d = 0; d < 2; d++) shared[d] = fmaxf(shared[d], a[d]);
  }
  hq_qtensor *shard[WORLD_MAX] = {0};
  hq_fsdp_buffer ext[WORLD_MAX][2 * HQ_MAX_BUFFERS];
  size_t n[WORLD_MAX];
  for (int s = 0; s < world; s++) {
    hq_tensor xs = rows_of(&x, s * ms, ms);
    shard[s] = hq_test_quantize_ex(z.q, g_ctx, &xs, shared);
    const char *why = NULL;
    const int expect = fsdp_expect(pc, in, shard[s], ms, &why);
    snap before = snap_take(shard[s]);
    const int rc =
        hq_fsdp_extract(shard[s], g_ctx, ext[s], 2 * HQ_MAX_BUFFERS, sizeof(hq_fsdp_buffer), &n[s]);
    if (rc != expect)
      fail_msg("%s: extract -> %d (%s), the descriptions say %d", what, rc, hq_last_error(),
               expect);
    count(pc);
    if (expect) { /* refused before any byte moved */
      HQ_ERROR_HAS(why);
      snap_same(&before, shard[s], what);
      count(pc);
      free(before.bytes);
      for (int u = 0; u <= s; u++) hq_qtensor_free(shard[u]);
      free(x.data);
      qz_close(&z);
      return;
    }
    free(before.bytes);
    assert_int_equal(n[s], n[0]);
  }
  hq_fsdp_buffer gathered[2 * HQ_MAX_BUFFERS];
  void *mem[2 * HQ_MAX_BUFFERS];
  hq_test_all_gather(ext, world, n[0], gathered, mem);
  hq_qtensor *full = NULL;
  HQ_OK_OR_FAIL(hq_make_empty(z.q, g_ctx, M, K, t, &full));
  HQ_OK_OR_FAIL(
      hq_fsdp_assign(full, g_ctx, shard[world - 1], gathered, n[0], sizeof(hq_fsdp_buffer)));
  hq_qtensor *ref = hq_test_quantize_ex(z.q, g_ctx, &x, shared);
  same_gathered(full, ref, shard[world - 1], z.q, what);
  count(pc);
  /* assigned again (the next step's gather into the same tensor): the same bytes */
  HQ_OK_OR_FAIL(hq_fsdp_assign(full, g_ctx, shard[0], gathered, n[0], sizeof(hq_fsdp_buffer)));
  same_gathered(full, ref, shard[0], z.q, what);
  count(pc);
  for (size_t e = 0; e < n[0]; e++) free(mem[e]);
  for (int s = 0; s < world; s++) hq_qtensor_free(shard[s]);
  hq_qtensor_free(full);
  hq_qtensor_free(ref);
  free(x.data);
  qz_close(&z);
}

static void test_fsdp(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (size_t i = 0; i < pc->n; i++)
    for (int world = 2; world <= 4; world += 2)
      for (int u = 0; u < 3; u++) {
        if (usages[u] == HQ_COLWISE && !is_colwise_only_capable(pc)) continue;
        fsdp_case(pc, &pc->in[i], world, HQ_BF16, usages[u]);
        if (usages[u] == HQ_BOTH) fsdp_case(pc, &pc->in[i], world, HQ_F32, usages[u]);
      }
  report(pc, "fsdp");
}

// --- offload (save / restore) ------------------------------------------------------------------

/* A check of one quantized tensor: qt, of instance `in` and usage `usage`, made by z from an
   input of the instance's usable shape; nonzero stops the iteration with that status. */
typedef int (*qt_check)(pcase *pc, const inst *in, qz *z, hq_qtensor *qt, uint32_t usage);

/* Run `check` on every instance and usage of pc. */
static int each_quantized(pcase *pc, uint64_t seed, qt_check check) {
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  for (size_t i = 0; i < pc->n; i++)
    for (int u = 0; u < 3; u++) {
      if (usages[u] == HQ_COLWISE && !is_colwise_only_capable(pc)) continue;
      int64_t M, K;
      usable_shape(pc, &pc->in[i], &M, &K);
      qz z = qz_open(&pc->in[i], pc->name, usages[u]);
      hq_tensor x = input(HQ_BF16, M, K, seed + i);
      qz_prime(&z, &x);
      hq_qtensor *qt = NULL;
      HQ_OK_OR_FAIL(hq_quantize(z.q, g_ctx, &x, &qt));
      const int rc = check(pc, &pc->in[i], &z, qt, usages[u]);
      hq_qtensor_free(qt);
      free(x.data);
      qz_close(&z);
      if (rc) return rc;
    }
  return 0;
}

static int offload_one(pcase *pc, const inst *in, qz *z, hq_qtensor *qt, uint32_t usage) {
  (void)z;
  const int64_t M = hq_qtensor_rows(qt), K = hq_qtensor_cols(qt);
  /* the buffers a save hands out: every buffer, a shared one once */
  size_t owned = 0;
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    const hq_storage *s = hq_qtensor_storage(qt, dir);
    for (uint32_t b = 0; s && b < s->nbuf; b++)
      owned += !(dir == HQ_COLWISE && usage == HQ_BOTH &&
                 (hq_storage_cbuf(s, b)->flags & HQ_BUF_SHARED));
  }
  assert_int_equal(hq_qtensor_saved_count(qt), owned);
  snap before = snap_take(qt);
  hq_tensor dv[2] = {{0}, {0}};
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++)
    if (usage & dir) dv[dir - 1] = deq(qt, dir, HQ_F32);
  hq_saved_buffer sv[2 * HQ_MAX_BUFFERS];
  size_t n = 0;
  HQ_OK_OR_FAIL(hq_qtensor_save(qt, sv, 2 * HQ_MAX_BUFFERS, sizeof sv[0], &n));
  assert_int_equal(n, owned);
  assert_int_equal(hq_qtensor_is_saved(qt), 1);
  hq_tensor tmp = hq_test_empty(HQ_F32, M, K);
  assert_int_equal(hq_dequantize(qt, g_ctx, usage & HQ_ROWWISE ? HQ_ROWWISE : HQ_COLWISE, &tmp),
                   HQ_ESTATE);
  free(tmp.data);
  /* offloaded: each buffer moved to other memory of the context, the original freed */
  for (size_t e = 0; e < n; e++) {
    void *p = NULL;
    HQ_OK_OR_FAIL(hq_ctx_alloc(g_ctx, sv[e].bytes, &p));
    memcpy(p, sv[e].ptr, sv[e].bytes);
    memset(sv[e].ptr, 0xA5, sv[e].bytes);
    hq_ctx_free(g_ctx, sv[e].ptr);
    sv[e].ptr = p;
  }
  HQ_OK_OR_FAIL(hq_qtensor_restore(qt, sv, n, sizeof sv[0]));
  assert_int_equal(hq_qtensor_is_saved(qt), 0);
  snap_same(&before, qt, in->label);
  count(pc);
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir++) {
    if (!(usage & dir)) continue;
    hq_tensor f = deq(qt, dir, HQ_F32);
    if (memcmp(f.data, dv[dir - 1].data, (size_t)(M * K) * 4))
      fail_msg("%s %s: other values after restore", in->label, dir_name(dir));
    count(pc);
    free(f.data);
    free(dv[dir - 1].data);
  }
  free(before.bytes);
  return 0;
}

static void test_offload(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  each_quantized(pc, 21, offload_one);
  report(pc, "offload");
}

// --- checkpoints: the one section that calls hq_ckpt_* ----------------------------------------

static char g_dir[512];

/* Write qt to a file, read it back into an empty qtensor of q. HQ_ENOTSUP: no checkpoints in
   this build (jansson missing). */
static int ckpt_round_trip(hq_quantizer *q, const hq_qtensor *qt, hq_qtensor **out) {
  char path[600];
  snprintf(path, sizeof path, "%s/c.safetensors", g_dir);
  hq_ckpt_writer *w = NULL;
  const int rc = hq_ckpt_writer_open(path, &w);
  if (rc == HQ_ENOTSUP) return rc;
  HQ_OK_OR_FAIL(rc);
  HQ_OK_OR_FAIL(hq_ckpt_add_qtensor(w, g_ctx, "w", qt));
  HQ_OK_OR_FAIL(hq_ckpt_writer_close(w));
  hq_ckpt *c = NULL;
  HQ_OK_OR_FAIL(hq_ckpt_open(path, &c));
  HQ_OK_OR_FAIL(hq_make_empty(q, g_ctx, hq_qtensor_rows(qt), hq_qtensor_cols(qt),
                              hq_qtensor_nominal_dtype(qt), out));
  HQ_OK_OR_FAIL(hq_ckpt_load_qtensor(c, g_ctx, "w", *out));
  hq_ckpt_close(c);
  unlink(path);
  return HQ_OK;
}

static int checkpoint_one(pcase *pc, const inst *in, qz *z, hq_qtensor *qt, uint32_t usage) {
  (void)usage;
  hq_qtensor *back = NULL;
  const int rc = ckpt_round_trip(z->q, qt, &back);
  if (rc) return rc;
  hq_test_same_qtensors(qt, back, in->label);
  count(pc);
  hq_qtensor_free(back);
  return 0;
}

static void test_checkpoint(void **state) {
  pcase *pc = *state;
  pc->checks = 0;
  if (each_quantized(pc, 31, checkpoint_one) == HQ_ENOTSUP) {
    print_message("[ skipped ] %s: built without jansson: no checkpoints\n", pc->name);
    skip();
  }
  report(pc, "checkpoint");
}

// --- the set of modules -----------------------------------------------------------------------

static void test_set(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_expected / sizeof k_expected[0]; i++)
    if (!hq_plugins_find(g_set, k_expected[i]))
      fail_msg("module %s is not on the test plugin path", k_expected[i]);
  for (size_t i = 0; i < hq_plugins_rejected_count(g_set); i++)
    print_message("rejected: %s: %s\n", hq_plugins_rejected_file(g_set, i),
                  hq_plugins_rejected_reason(g_set, i));
  assert_int_equal(g_ncases, hq_plugins_count(g_set));
  for (size_t c = 0; c < g_ncases; c++) build_instances(&g_cases[c]);
}

static void open_cases(void) {
  const char *tp = getenv("HQ_TEST_THIRD_PARTY");
  const char *dirs[1] = {tp ? tp : "tests/plugins/third_party/.libs"};
  if (hq_plugins_open(dirs, 1, HQ_PLUGINS_NO_DEFAULT, &g_set)) {
    fprintf(stderr, "hq_plugins_open: %s\n", hq_last_error());
    exit(1);
  }
  for (size_t i = 0; i < hq_plugins_count(g_set) && g_ncases < 32; i++) {
    pcase *pc = &g_cases[g_ncases++];
    memset(pc, 0, sizeof *pc);
    pc->p = hq_plugins_get(g_set, i);
    pc->name = hq_plugin_name(pc->p);
    pc->host = hq_test_host();
    const char *file = hq_plugin_file(pc->p);
    if (file && file[0] == '/') {
      pc->dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
      hq_format_entry_fn entry =
          pc->dl ? (hq_format_entry_fn)(uintptr_t)dlsym(pc->dl, HQ_FORMAT_ENTRY_NAME) : NULL;
      pc->ops = entry ? entry(&pc->host) : NULL;
      if (!pc->ops) {
        fprintf(stderr, "%s: cannot open %s for direct calls\n", pc->name, file);
        exit(1);
      }
    }
  }
}

static int group_setup(void **state) {
  (void)state;
  if (hq_ctx_create(NULL, &g_ctx)) return -1;
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/hq-conformance.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}
static int group_teardown(void **state) {
  (void)state;
  rmdir(g_dir);
  hq_ctx_destroy(g_ctx);
  return 0;
}

int main(void) {
  open_cases();
  static void (*const kinds[])(void **) = {test_quantize, test_exact,   test_cross,
                                           test_fsdp,     test_offload, test_checkpoint};
  static const char *const kind_names[] = {"quantize", "exact",   "cross-instance",
                                           "fsdp",     "offload", "checkpoint"};
  const size_t nk = sizeof kinds / sizeof kinds[0];
  struct CMUnitTest *tests = calloc(1 + g_ncases * nk, sizeof *tests);
  char(*names)[96] = calloc(g_ncases * nk, sizeof *names);
  tests[0] = (struct CMUnitTest)cmocka_unit_test(test_set);
  for (size_t c = 0; c < g_ncases; c++) {
    for (size_t k = 0; k < nk; k++) {
      struct CMUnitTest *t = &tests[1 + c * nk + k];
      snprintf(names[c * nk + k], sizeof names[0], "%s: %s", g_cases[c].name, kind_names[k]);
      t->name = names[c * nk + k];
      t->test_func = kinds[k];
      t->initial_state = &g_cases[c];
    }
  }
  const int rc =
      _cmocka_run_group_tests("conformance", tests, 1 + g_ncases * nk, group_setup, group_teardown);
  for (size_t c = 0; c < g_ncases; c++)
    if (g_cases[c].dl) dlclose(g_cases[c].dl);
  hq_plugins_close(g_set);
  free(tests);
  free(names);
  return rc;
}
