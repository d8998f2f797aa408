/*
** gemm_fixture.c -- test-only GEMM provider modules (hq/gemm_provider.h), the way a third party
** ships one. One source, built several times with a GEMM_FIXTURE_* macro selecting the module:
**   providers/test_gemm.so          "test_gemm", priority 200 (asked before cublaslt)
**   providers/test_gemm_low.so      "test_gemm_low", priority 25 (between fused_hopper and
**                                   emulated)
**   providers_bad/bad_major.so      abi_major = HQ_GEMM_ABI_MAJOR + 1
**   providers_bad/newer_minor.so    requires abi_minor = HQ_GEMM_ABI_MINOR + 1
**   providers_bad/small_table.so    struct_size ends before accepts (smaller than 1.0's table)
**   providers_bad/no_accepts.so     accepts = NULL
**   providers_bad/no_run.so         run = NULL
**   providers_bad/no_version.so     version = NULL
**   providers_bad/bad_name.so       name "Test-Gemm"
**   providers_bad/builtin_name.so   name "emulated" (built into libhqcore)
**   providers_bad/dup_a.so, dup_b.so  both named "test_gemm_dup"
**   providers_bad/no_entry.so       exports hq_gemm_provider_v0, no entry point of either kind
**
** A valid one multiplies identity f32 storages, storages whose raw values split from per-row
** factors (HQ_GEMM_OP_ROWF: nvfp4 global_scale = row) and storages whose dequantize folds a
** per-tensor factor (HQ_GEMM_OP_FOLDS: nvfp4), on the host into an f32 D: accepts() takes
** exactly those kinds (and refuses a caller's HQ_GEMM_FORCE_EMULATED), run() reads the operands'
** raw values through host->raw() and their factors through host->factor -- a split one's values
** and row factors through host->raw_rows (provider ABI 1.2), its per-tensor factor folded by that
** dequantize or through host->factor -- and computes D = alpha * op(A) op(B) + beta * D (+ bias)
** with a naive loop in double, one rounding per element, reporting HQ_GEMM_PATH_CPU. It counts
** its calls in the exported gemm_fixture (gemm_fixture.h), whose `mode` makes run() decline or
** fail, or read both operands through host->raw_pair (provider ABI 1.1) or host->raw_pair_fold
** (1.3: alpha folded into A's product, B's factor alone into B's, the product D = (A's * B's) *
** S; 1.4: B's fold reading A's product, D = B's * S), or ask raw_pair for a dtype it refuses,
** raw_pair_fold for A's fold reading B's product, or raw_rows for an operand without row
** factors.
*/
#include <stddef.h>

#include "hq/gemm_provider.h"
#include "hq/numerics.h"
#include "gemm_fixture.h"

#if defined(GEMM_FIXTURE_LOW)
#define NAME "test_gemm_low"
#define PRIORITY 25
#elif defined(GEMM_FIXTURE_BAD_NAME)
#define NAME "Test-Gemm"
#elif defined(GEMM_FIXTURE_BUILTIN_NAME)
#define NAME "emulated"
#elif defined(GEMM_FIXTURE_DUP)
#define NAME "test_gemm_dup"
#else
#define NAME "test_gemm"
#endif
#ifndef PRIORITY
#define PRIORITY 200
#endif

/* The operations a broken variant lacks are NULL in its table (and stay referenced there). */
#ifdef GEMM_FIXTURE_NO_ACCEPTS
#define HAS_ACCEPTS 0
#else
#define HAS_ACCEPTS 1
#endif
#ifdef GEMM_FIXTURE_NO_RUN
#define HAS_RUN 0
#else
#define HAS_RUN 1
#endif

HQ_GEMM_EXPORT gemm_fixture_state gemm_fixture;

/* An identity f32 storage: its values as they are, f32, no transform. */
static int plain_f32(const hq_gemm_operand_kind *o) {
  return o->desc && o->desc->elem == HQ_F32 && o->desc->scale_mode == HQ_SCALE_NONE &&
         o->desc->transform == HQ_TRANSFORM_NONE;
}

/* A storage whose raw values split from per-row factors (host->raw_rows). */
static int split_rows(const hq_gemm_operand_kind *o) {
  return o->desc && (o->flags & HQ_GEMM_OP_ROWF);
}

/* A storage whose dequantize can fold its per-tensor factor (HQ_GEMM_OP_FOLDS). */
static int folding(const hq_gemm_operand_kind *o) {
  return o->desc && (o->flags & HQ_GEMM_OP_FOLDS) && !(o->flags & HQ_GEMM_OP_ROWF);
}

static int accepts(const hq_gemm_host *host, const hq_gemm_kind *k) {
  gemm_fixture.accepts_calls++;
  if (k->flags & HQ_GEMM_FORCE_EMULATED)
    return host->api->error(HQ_ENOTSUP, NAME ": the caller forced the emulated path");
  if (k->device != HQ_DEVICE_HOST ||
      !(plain_f32(&k->a) || split_rows(&k->a) || folding(&k->a)) ||
      !(plain_f32(&k->b) || split_rows(&k->b) || folding(&k->b)) || k->d_dtype != HQ_F32)
    return host->api->error(HQ_ENOTSUP, NAME ": only identity f32, row-factor or folding "
                            "storages into an f32 D on the host");
  return HQ_OK;
}

/* Operand o's raw values in F32 (*x, a temporary in *tx to free): through raw_rows for a split
   one, with its row factors in *rf (freed by the caller) and its per-tensor factor in *f (1
   without one); else through raw(). ROWS_BAD asks raw_rows of an operand that has no split. */
static int operand(const hq_gemm_host *host, const hq_call *call, const hq_gemm_operand *o,
                   const hq_gemm_operand_kind *k, const void **x, void **tx, float **rf,
                   float *f) {
  *f = 1.0f;
  const float *pf = NULL; /* f itself, or NULL: no factor (1) */
  if (!split_rows(k) && gemm_fixture.mode != GEMM_FIXTURE_ROWS_BAD)
    return hq_gemm_raw_factor(host, call, o, k, HQ_F32, x, tx, f, &pf, NULL);
  if (!hq_gemm_host_has_raw_rows(host)) return host->api->error(HQ_EABI, NAME ": no raw_rows");
  void *v = NULL;
  hq_gemm_fold fd = {f, NULL, 1.0f, 0}; /* the per-tensor factor, folded where the module can */
  int rc = host->raw_rows(call, o, HQ_F32, &v, rf, &fd);
  *x = *tx = v;
  if (!rc) rc = hq_gemm_folded_factor(host, call, o, k, &fd, f, &pf);
  if (!rc && fd.done) gemm_fixture.folds++;
  if (!rc) gemm_fixture.rows++;
  return rc;
}

/* Element (i, j) of op(X) for X's raw values, row-major [rows, cols] (cuBLAS's column-major
   reading: the stored matrix is cols x rows with ld cols, op(X) its transpose when trans). */
static double op_at(const float *x, int64_t cols, int trans, int64_t i, int64_t j) {
  return trans ? (double)x[i * cols + j] : (double)x[j * cols + i];
}

static int run(const hq_gemm_host *host, const hq_call *call, hq_gemm_run *r) {
  const hq_host_api *api = host->api;
  const int mode = gemm_fixture.mode;
  const int pair = mode == GEMM_FIXTURE_PAIR || mode == GEMM_FIXTURE_PAIR_BAD;
  const int chain = mode == GEMM_FIXTURE_PAIR_CHAIN;
  const int pair_fold = mode == GEMM_FIXTURE_PAIR_FOLD || mode == GEMM_FIXTURE_PAIR_FOLD_BAD ||
                        chain;
  if (pair && !hq_gemm_host_has_raw_pair(host))
    return api->error(HQ_EABI, NAME ": the core offers no raw_pair");
  if (pair_fold && !hq_gemm_host_has_raw_pair_fold(host))
    return api->error(HQ_EABI, NAME ": the core offers no raw_pair_fold");
  if (mode != GEMM_FIXTURE_RUN && mode != GEMM_FIXTURE_ROWS_BAD && !pair && !pair_fold) {
    gemm_fixture.declines++;
    if (mode == GEMM_FIXTURE_DECLINE)
      return api->error(HQ_ENOTSUP, NAME ": declined m = %lld on purpose", (long long)r->m);
    return api->error(HQ_EDEVICE, NAME ": failed on purpose");
  }
  r->path = HQ_GEMM_PATH_CPU;
  if (r->flags & HQ_GEMM_QUERY) {
    gemm_fixture.queries++;
    return HQ_OK;
  }
  gemm_fixture.capturing = hq_gemm_host_capturing(host, call);
  const void *a = NULL, *b = NULL;
  void *ta = NULL, *tb = NULL;
  float *ra = NULL, *rb = NULL, fa = 1.0f, fb = 1.0f;
  double whole = 0.0; /* alpha times both factors, when the folds made it (have_whole) */
  int have_whole = 0;
  int rc;
  if (pair || pair_fold)
    gemm_fixture.joint = hq_gemm_host_joint(host, call, &r->a, HQ_F32, &r->b, HQ_F32);
  if (pair) {
    rc = host->raw_pair(call, &r->a, HQ_F32, &a, &ta, &r->b,
                        mode == GEMM_FIXTURE_PAIR_BAD ? HQ_F16 : HQ_F32, &b, &tb);
    const float *pf; /* the factors, where the operands have them (host memory: fa, fb) */
    if (!rc) rc = hq_gemm_factor_of(host, call, &r->a, &r->kind->a, &fa, &pf);
    if (!rc) rc = hq_gemm_factor_of(host, call, &r->b, &r->kind->b, &fb, &pf);
    if (!rc) gemm_fixture.pairs++;
  } else if (pair_fold) {
    /* host memory (the fixture runs on the host): the folds write the products here */
    float prod[2] = {1.0f, 1.0f};
    hq_gemm_fold pa = {&prod[0], mode == GEMM_FIXTURE_PAIR_FOLD_BAD ? &prod[1] : NULL, r->alpha,
                       0};
    hq_gemm_fold pb = {&prod[1], chain ? &prod[0] : NULL, 1.0f, 0};
    rc = host->raw_pair_fold(call, &r->a, HQ_F32, &a, &ta, &pa, &r->b, HQ_F32, &b, &tb, &pb);
    if (!rc && !pa.done) rc = api->error(HQ_EINVAL, NAME ": A's factor was not folded");
    if (!rc && !pb.done) rc = api->error(HQ_EINVAL, NAME ": B's factor was not folded");
    if (!rc) {
      gemm_fixture.pair_folds += 2;
      gemm_fixture.fold_a = prod[0];
      gemm_fixture.fold_b = prod[1];
      /* (alpha * fa) * fb: B's product, or the two multiplied */
      whole = chain ? (double)prod[1] : (double)hq_mul_rn(prod[0], prod[1]);
      have_whole = 1;
    }
  } else {
    rc = operand(host, call, &r->a, &r->kind->a, &a, &ta, &ra, &fa);
    if (!rc) rc = operand(host, call, &r->b, &r->kind->b, &b, &tb, &rb, &fb);
  }
  if (!rc) {
    float *d = r->d->data;
    for (int64_t j = 0; j < r->n; j++)
      for (int64_t i = 0; i < r->m; i++) {
        double s = 0;
        for (int64_t p = 0; p < r->k; p++)
          s += op_at(a, r->a.cols, r->kind->a.trans, i, p) *
               op_at(b, r->b.cols, r->kind->b.trans, p, j);
        s *= (have_whole ? whole : (double)r->alpha * fa * fb) * (ra ? ra[i] : 1.0f) *
             (rb ? rb[j] : 1.0f);
        if (r->beta != 0.0f) s += (double)r->beta * d[j * r->m + i];
        if (r->bias) s += hq_load_hp(r->bias, i, r->bias_dtype);
        d[j * r->m + i] = (float)s;
      }
    gemm_fixture.runs++;
  }
  api->free(call, ta);
  api->free(call, tb);
  api->free(call, ra);
  api->free(call, rb);
  return rc;
}

static const hq_gemm_provider table = {
#ifdef GEMM_FIXTURE_BAD_MAJOR
    .abi_major = HQ_GEMM_ABI_MAJOR + 1,
#else
    .abi_major = HQ_GEMM_ABI_MAJOR,
#endif
#ifdef GEMM_FIXTURE_NEWER_MINOR
    .abi_minor = HQ_GEMM_ABI_MINOR + 1,
#else
    .abi_minor = 0,
#endif
#ifdef GEMM_FIXTURE_SMALL_TABLE
    .struct_size = offsetof(hq_gemm_provider, accepts),
#else
    .struct_size = sizeof(hq_gemm_provider),
#endif
    .priority = PRIORITY,
    .name = NAME,
#ifndef GEMM_FIXTURE_NO_VERSION
    .version = "0.7",
#endif
    .description = "test fixture: identity f32 and row-factor storages on the host, a naive "
                   "loop",
    .accepts = HAS_ACCEPTS ? accepts : NULL,
    .run = HAS_RUN ? run : NULL,
};

#ifdef GEMM_FIXTURE_NO_ENTRY
HQ_GEMM_EXPORT const hq_gemm_provider *hq_gemm_provider_v0(const hq_gemm_host *host);
HQ_GEMM_EXPORT const hq_gemm_provider *hq_gemm_provider_v0(const hq_gemm_host *host) {
  (void)host;
  return &table;
}
#else
HQ_GEMM_PROVIDER_DEFINE(table)
#endif
