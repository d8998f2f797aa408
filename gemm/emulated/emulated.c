/*
** emulated.c -- the "emulated" GEMM provider: every problem, on any device, exact up to FP32
** accumulation. Each operand is turned into its raw values (hq_gemm_host.raw: elements times
** block scales, the per-tensor factor kept out, a transform kept), the per-tensor factors are
** folded into alpha, and one GEMM multiplies the two: on a GPU one cuBLASLt matmul (through the
** core's runner, host->api->lt_matmul) in BF16 when both operands' raw values are exact there,
** else in F32 (no TF32); on the host an F32 sgemm (OpenBLAS when libhqcore is built with it,
** else the blocked loop below). It accepts every kind, so hq_gemm always has a path: this is the
** last provider asked (priority 0). On a GPU an operand whose raw values carry a factor per row
** (HQ_GEMM_OP_ROWF: row-scaled NVFP4) is multiplied as its BF16-exact values without them
** (host->raw_rows), the runner multiplying the F32 product by the factors of its row and column.
** Otherwise the two operands are dequantized side by side (host->raw_pair, or raw_pair_fold when
** a module folds its factor: each into a product of its own, so neither waits for the other;
** two such products cost one more kernel, so operands that both carry a factor are paired only
** when small and in a captured graph, else B's dequantize folds A's product, the chain) -- or,
** where their module takes the two as one request (host->joint, provider ABI 1.4), by one
** launch, in which two folding operands make the chain at no cost.
**
** The order in which the factors multiply alpha is fixed, (alpha * fa) * fb, on both devices,
** so that the emulated product of quantized operands does not depend on where it runs beyond
** the order of accumulation.
*/
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "hq/numerics.h"
#include "../builtin.h"

#ifdef HQ_HAVE_OPENBLAS
#include <cblas.h>
#endif

static int accepts(const hq_gemm_host *host, const hq_gemm_kind *kind) {
  (void)host;
  (void)kind;
  return HQ_OK;
}

/* Whether operand o is multiplied on the device as BF16-exact values with its per-row factors
   kept out (HQ_GEMM_OP_ROWF, a core that offers raw_rows): the runner applies the factors to
   the F32 product, so a row-scaled operand needs no F32 GEMM. */
static int split_rows(const hq_gemm_host *h, const hq_gemm_operand_kind *o) {
  return (o->flags & HQ_GEMM_OP_ROWF) && hq_gemm_host_has_raw_rows(h);
}

/* The dtype operand o is multiplied in on the device. */
static hq_dtype dev_dtype(const hq_gemm_host *h, const hq_gemm_operand_kind *o) {
  return split_rows(h, o) ? HQ_BF16 : hq_gemm_emul_dtype(o);
}

/* The path a problem takes here. */
static uint32_t path_of(const hq_gemm_host *h, const hq_gemm_kind *k) {
  if (k->device < 0) return HQ_GEMM_PATH_CPU;
  return dev_dtype(h, &k->a) == HQ_BF16 && dev_dtype(h, &k->b) == HQ_BF16
             ? HQ_GEMM_PATH_EMULATED_BF16
             : HQ_GEMM_PATH_EMULATED_F32;
}

// --- the host ------------------------------------------------------------------------------------

#ifndef HQ_HAVE_OPENBLAS
/* Column-major C[m x n] = alpha * op(A) * op(B) + beta * C, a blocked loop over transposed
   copies so that every inner product runs over contiguous memory (libhqcore built without
   OpenBLAS). */
static int plain_sgemm(const hq_host_api *api, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                       float beta, float *C, int64_t ldc) {
  /* At[i][p] = op(A)(i, p); Bt[j][p] = op(B)(p, j) */
  float *At = malloc((size_t)m * (size_t)k * sizeof(float) + 1);
  float *Bt = malloc((size_t)n * (size_t)k * sizeof(float) + 1);
  if (!At || !Bt) {
    free(At);
    free(Bt);
    return api->error(HQ_ENOMEM, "hq_gemm: CPU path: %lld x %lld and %lld x %lld F32 copies",
                      (long long)m, (long long)k, (long long)n, (long long)k);
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = 0; q < k; q++) At[i * k + q] = ta ? A[i * lda + q] : A[q * lda + i];
  for (int64_t j = 0; j < n; j++)
    for (int64_t q = 0; q < k; q++) Bt[j * k + q] = tb ? B[q * ldb + j] : B[j * ldb + q];
  for (int64_t j = 0; j < n; j++) {
    const float *b = Bt + j * k;
    for (int64_t i = 0; i < m; i++) {
      const float *a = At + i * k;
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t q = 0;
      for (; q + 8 <= k; q += 8)
        for (int u = 0; u < 8; u++) s[u] += a[q + u] * b[q + u];
      for (; q < k; q++) s[0] += a[q] * b[q];
      float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      float *c = &C[j * ldc + i];
      *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
    }
  }
  free(At);
  free(Bt);
  return HQ_OK;
}
#endif

/* D (F32, column-major m x n, ld m) += bias[i] on every column j. */
static void add_bias(float *d, int64_t m, int64_t n, const void *bias, hq_dtype bt) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) d[j * m + i] += hq_load_hp(bias, i, bt);
}

/* sgemm of the F32 raw values a, b into the F32 d (ld m). */
static int sgemm(const hq_host_api *api, const hq_gemm_run *r, float alpha, const float *a,
                 const float *b, float *d) {
  const int64_t m = r->m, n = r->n, k = r->k;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; i++) d[i] = r->beta == 0.0f ? 0.0f : r->beta * d[i];
    return HQ_OK;
  }
#ifdef HQ_HAVE_OPENBLAS
  (void)api;
  cblas_sgemm(CblasColMajor, r->kind->a.trans ? CblasTrans : CblasNoTrans,
              r->kind->b.trans ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
              alpha, a, (blasint)r->a.cols, b, (blasint)r->b.cols, r->beta, d, (blasint)m);
  return HQ_OK;
#else
  return plain_sgemm(api, r->kind->a.trans, r->kind->b.trans, m, n, k, alpha, a, r->a.cols, b,
                     r->b.cols, r->beta, d, m);
#endif
}

static int cpu_gemm(const hq_gemm_host *h, const hq_call *call, const hq_gemm_run *r) {
  const hq_host_api *api = h->api;
  const void *a = NULL, *b = NULL;
  void *ta = NULL, *tb = NULL;
  float fa = 1.0f, fb = 1.0f, *td = NULL;
  const float *pfa = NULL, *pfb = NULL;
  int rc = hq_gemm_raw_factor(h, call, &r->a, &r->kind->a, HQ_F32, &a, &ta, &fa, &pfa, NULL);
  if (!rc)
    rc = hq_gemm_raw_factor(h, call, &r->b, &r->kind->b, HQ_F32, &b, &tb, &fb, &pfb, NULL);
  float *d = r->d->data;
  const int64_t nd = r->m * r->n;
  if (!rc && r->d->dtype != HQ_F32) {
    td = api->alloc(call, (size_t)nd * sizeof(float));
    if (!td) {
      rc = api->error(HQ_ENOMEM, "%s: an F32 copy of D (%lld elements)", r->what, (long long)nd);
    } else {
      d = td;
      /* the core's conversion (hq_host_api.convert), which this provider, built into
         libhqcore, always has: rounding to nearest, in the mode hq_gemm entered */
      if (r->beta != 0.0f) rc = api->convert(call, d, HQ_F32, r->d->data, r->d->dtype, nd);
    }
  }
  if (!rc && nd > 0) {
    /* the per-tensor factors multiply alpha: (alpha * fa) * fb, as on the GPU */
    float al = r->alpha * (pfa ? *pfa : 1.0f);
    al = al * (pfb ? *pfb : 1.0f);
    rc = sgemm(api, r, al, a, b, d);
    if (!rc && r->bias) add_bias(d, r->m, r->n, r->bias, r->bias_dtype);
    if (!rc && td) rc = api->convert(call, r->d->data, r->d->dtype, d, HQ_F32, nd);
  }
  api->free(call, ta);
  api->free(call, tb);
  api->free(call, td);
  return rc;
}

// --- a CUDA device -------------------------------------------------------------------------------

/* Operand o's values in dt and where its per-tensor factor lies, as hq_gemm_raw_factor gives
   them (fd: the fold to offer its dequantize, or NULL); for an operand split from its per-row
   factors (split) the values without them in *tmp (= *data) and the factors in *rowf (both
   temporaries), the per-tensor factor folded by the same dequantize where the module can. */
static int operand_raw(const hq_gemm_host *h, const hq_call *call, const hq_gemm_operand *o,
                       const hq_gemm_operand_kind *k, hq_dtype dt, int split, const void **data,
                       void **tmp, float **rowf, float *slot, const float **pf,
                       hq_gemm_fold *fd) {
  if (!split) return hq_gemm_raw_factor(h, call, o, k, dt, data, tmp, slot, pf, fd);
  *pf = NULL;
  void *v = NULL;
  int rc = h->raw_rows(call, o, dt, &v, rowf, fd);
  *data = *tmp = v;
  return rc ? rc : hq_gemm_folded_factor(h, call, o, k, fd, slot, pf);
}

/* Two operands that both carry a per-tensor factor, one at least folding it, are dequantized
   side by side only in a captured graph and when both are small: their two products cost one
   more kernel (the runner multiplies them into alpha), and the fork and join host time per
   call, which pays when the graph replays them and each dequantize is as short as a launch, not
   eagerly nor when each already keeps the GPU busy (the chain, B's dequantize folding A's
   product, adds neither). 2^20 elements: 2 MiB of BF16 written by each. */
enum { PAIR_FOLD_MAX_ELEMS = 1 << 20 };

static int pair_fold_pays(const hq_gemm_host *h, const hq_call *call, const hq_gemm_run *r) {
  return r->a.rows * r->a.cols <= PAIR_FOLD_MAX_ELEMS &&
         r->b.rows * r->b.cols <= PAIR_FOLD_MAX_ELEMS && hq_gemm_host_capturing(h, call);
}

static int gpu_gemm(const hq_gemm_host *h, const hq_call *call, hq_gemm_run *r,
                    hq_dtype dt) {
  const hq_host_api *api = h->api;
  const void *a = NULL, *b = NULL;
  void *ta = NULL, *tb = NULL;
  float *factors = api->alloc(call, 2 * sizeof(float));
  if (!factors) return api->error(HQ_ENOMEM, "%s: 8 bytes of device memory", r->what);
  const float *pfa = NULL, *pfb = NULL;
  float *rfa = NULL, *rfb = NULL; /* per-row factors of A (m) and B (n), split off (raw_rows) */
  const int rows_a = split_rows(h, &r->kind->a), rows_b = split_rows(h, &r->kind->b);
  /* alpha * fa * fb in that order, folded by the dequantize kernels where the modules can: in
     turn, A's writes alpha * fa into factors[0], B's then (alpha * fa) * fb into factors[1] */
  hq_gemm_fold fda = {factors, NULL, r->alpha, 0}, fdb = {factors + 1, NULL, r->alpha, 0};
  int rc, alpha_in = 0; /* alpha_in: *pfa or *pfb already holds alpha (folded) */
  const int folds_a = (r->kind->a.flags & HQ_GEMM_OP_FOLDS) != 0,
            folds_b = (r->kind->b.flags & HQ_GEMM_OP_FOLDS) != 0, folds = folds_a || folds_b;
  const int has_fa = r->a.st && (r->kind->a.flags & HQ_GEMM_OP_FACTOR),
            has_fb = r->b.st && (r->kind->b.flags & HQ_GEMM_OP_FACTOR);
  if (!rows_a && !rows_b && has_fa && has_fb && folds_a && folds_b &&
      hq_gemm_host_joint(h, call, &r->a, dt, &r->b, dt)) {
    /* one request to the format for both, B's fold reading A's product (the chain at one
       launch's cost): factors[1] = (alpha * fa) * fb, the whole alpha */
    fdb.in = factors;
    rc = h->raw_pair_fold(call, &r->a, dt, &a, &ta, &fda, &r->b, dt, &b, &tb, &fdb);
    if (!rc) rc = hq_gemm_folded_factor(h, call, &r->a, &r->kind->a, &fda, factors, &pfa);
    if (!rc) rc = hq_gemm_folded_factor(h, call, &r->b, &r->kind->b, &fdb, factors + 1, &pfb);
    alpha_in = fda.done || fdb.done;
    if (fdb.done) pfa = NULL; /* B's product holds alpha * fa already */
  } else if (!rows_a && !rows_b &&
      (folds ? hq_gemm_host_has_raw_pair_fold(h) &&
                   (!(has_fa && has_fb) || pair_fold_pays(h, call, r))
             : hq_gemm_host_has_raw_pair(h))) {
    /* both operands dequantized side by side, each folding its own factor into a product of
       its own -- A's with alpha; B's with alpha only when A has no factor, so that the order
       stays (alpha * fa) * fb -- and the runner multiplies the two: a chained fold would make
       B's dequantize wait for A's */
    hq_gemm_fold pa = {factors, NULL, r->alpha, 0};
    hq_gemm_fold pb = {factors + 1, NULL, has_fa ? 1.0f : r->alpha, 0};
    rc = folds ? h->raw_pair_fold(call, &r->a, dt, &a, &ta, folds_a ? &pa : NULL, &r->b, dt, &b,
                                  &tb, folds_b ? &pb : NULL)
               : h->raw_pair(call, &r->a, dt, &a, &ta, &r->b, dt, &b, &tb);
    if (!rc) rc = hq_gemm_folded_factor(h, call, &r->a, &r->kind->a, &pa, factors, &pfa);
    if (!rc) rc = hq_gemm_folded_factor(h, call, &r->b, &r->kind->b, &pb, factors + 1, &pfb);
    /* a product the dequantize wrote (not factor()'s value in the same slot) holds alpha */
    alpha_in = (pa.done && pfa) || (!has_fa && pb.done && pfb);
  } else {
    rc = operand_raw(h, call, &r->a, &r->kind->a, dt, rows_a, &a, &ta, &rfa, factors, &pfa,
                     &fda);
    if (fda.done) fdb.in = factors;
    if (!rc)
      rc = operand_raw(h, call, &r->b, &r->kind->b, dt, rows_b, &b, &tb, &rfb, factors + 1, &pfb,
                       fda.done || !pfa ? &fdb : NULL);
    alpha_in = fda.done || fdb.done;
    if (fdb.done) pfa = NULL; /* B's product holds alpha * fa already (or A has no factor) */
  }
  if (!rc) {
    hq_lt_matmul mm;
    memset(&mm, 0, sizeof mm);
    mm.struct_size = sizeof mm;
    mm.a = (hq_lt_operand){a, dt, r->kind->a.trans, r->a.cols, r->a.rows, r->a.cols,
                           HQ_SCALE_NONE, NULL};
    mm.b = (hq_lt_operand){b, dt, r->kind->b.trans, r->b.cols, r->b.rows, r->b.cols,
                           HQ_SCALE_NONE, NULL};
    mm.m = r->m;
    mm.n = r->n;
    mm.k = r->k;
    mm.alpha = r->alpha;
    mm.beta = r->beta;
    if (alpha_in && (!pfa || !pfb)) {
      mm.alpha_device = pfa ? pfa : pfb; /* the whole alpha, folded */
    } else {
      if (alpha_in) mm.alpha = 1.0f; /* A's product holds alpha * fa: (1 * (alpha * fa)) * fb */
      mm.alpha_factor[0] = pfa;
      mm.alpha_factor[1] = pfb;
    }
    mm.row_factor[0] = rfa;
    mm.row_factor[1] = rfb;
    mm.d = r->d->data;
    mm.d_dtype = r->d->dtype;
    mm.ldd = r->m;
    mm.bias = r->bias;
    mm.bias_dtype = r->bias_dtype;
    mm.what = r->what;
    /* max |D| from cuBLASLt's epilogue where it offers one for this GEMM; else the core makes
       it after run() */
    int32_t amax_done = 0;
    mm.amax_d = r->amax_d;
    mm.amax_done = &amax_done;
    rc = api->lt_matmul(call, &mm);
    r->amax_done = !rc && amax_done;
  }
  /* stream-ordered frees: they follow the GEMM that reads the temporaries */
  api->free(call, ta);
  api->free(call, tb);
  api->free(call, rfa);
  api->free(call, rfb);
  api->free(call, factors);
  return rc;
}

static int run(const hq_gemm_host *h, const hq_call *call, hq_gemm_run *r) {
  r->path = path_of(h, r->kind);
  if (r->flags & HQ_GEMM_QUERY) return HQ_OK;
  if (r->path == HQ_GEMM_PATH_CPU) return cpu_gemm(h, call, r);
  return gpu_gemm(h, call, r, r->path == HQ_GEMM_PATH_EMULATED_BF16 ? HQ_BF16 : HQ_F32);
}

static const hq_gemm_provider table = {
    .abi_major = HQ_GEMM_ABI_MAJOR,
    .abi_minor = 0,
    .struct_size = sizeof(hq_gemm_provider),
    .priority = 0,
    .name = "emulated",
    .version = PACKAGE_VERSION,
    .description = "raw values of both operands, then one BF16 / F32 cuBLASLt GEMM or an F32 "
                   "sgemm on the host; every problem",
    .accepts = accepts,
    .run = run,
};

HQ_GEMM_ENTRY(emulated, table)
