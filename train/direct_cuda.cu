/*
** direct_cuda.cu -- the bf16-direct run's GEMMs on cuBLASLt and its FP32 -> BF16 casts (direct.h;
** the conversion is cast_cuda.cu's, which --grad-dtype bf16 shares).
**
** A plan is chosen as libhqcore's cuBLASLt runner chooses one for the identity recipe's GEMMs,
** so that both take the same algorithm and give the same bits: compute type 32F, scale type
** 32F, host alpha 1 and beta 0, TRANSA / TRANSB set, the heuristic asked for its first answer
** with the whole 32 MiB workspace, the buffers' alignments (the largest power of two up to 256
** dividing each address; C's and D's both D's) and split-K reductions in the compute type only.
** No GEMM adds a bias: fprop's output is x W^T alone, as the trainer asks of libhqcore's fprop
** too (its kernels add the bias as they read the output, device.h). The operands, in cuBLASLt's
** column-major terms (a row-major [R, C] buffer is a C x R matrix with ld C):
**   fprop  y [B, out]  = A: W  (in x out, ld in) T,  B: x  (in x B, ld in) N,   m out, n B, k in
**   dgrad  dx [B, in]  = A: W  (in x out, ld in) N,  B: dy (out x B, ld out) N, m in, n B, k out
**   wgrad  gw [out, in] = A: x (in x B, ld in) N,    B: dy (out x B, ld out) T, m in, n out, k B
*/
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hq/numerics.h"
#include "cast_cuda.h"
#include "direct.h"

/* the workspace offered to the heuristic and given to every matmul: libhqcore's runner offers
   32 MiB, and a different size may make the heuristic choose another algorithm */
#define DIRECT_WORKSPACE ((size_t)32 << 20)

enum { G_FPROP, G_DGRAD, G_WGRAD, G_N };

namespace {

/* A plan: what defines the problem (the GEMM, hence the transposes; m, n, k, hence the layouts;
   the buffers' alignments) and the heuristic's answer for it. */
struct plan_key {
  int64_t g, m, n, k;
  uint32_t align[3];             /* A, B, D */
  uint32_t pad;
};
struct plan {
  plan_key key;
  cublasLtMatmulAlgo_t algo;
};

struct layer {
  int64_t in, out;
  uint16_t *wb, *xb;             /* BF16 W [out, in], x [B, in] */
};

/* one GEMM's operands in cuBLASLt's terms */
struct problem {
  const void *a, *b;
  void *d;
  int64_t a_rows, a_cols, b_rows, b_cols, m, n, k;
  int ta, tb;
};

} // namespace

struct train_direct {
  hq_ctx *ctx;
  int device;
  cudaStream_t stream;
  cublasLtHandle_t lt;
  int have_lt;
  void *ws;
  int64_t batch;
  int n_lin;
  layer *lin;
  plan *plans;                   /* one per distinct problem: at most 3 a layer */
  int n_plans;
  uint16_t *dyb;                 /* BF16 dy [B, widest out] */
  char err[512];
};

namespace {

int fail(train_direct *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fail(train_direct *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->err, sizeof d->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* every call runs on the context's device */
int enter(train_direct *d, const char *what) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur != d->device) e = cudaSetDevice(d->device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(d, "%s: selecting CUDA device %d: %s", what, d->device, cudaGetErrorString(e));
  }
  return 0;
}

uint32_t align_of(const void *p) {
  const uintptr_t a = (uintptr_t)p;
  uint32_t r = 1;
  while (r < 256 && !(a & r)) r <<= 1;
  return r;
}

int cast(train_direct *d, const float *src, uint16_t *dst, int64_t n, const char *what) {
  if (enter(d, what)) return -1;
  char why[256];
  return train_cuda_f32_to_bf16(d->stream, dst, src, n, what, why, sizeof why)
             ? fail(d, "%s", why)
             : 0;
}

struct descs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

/* the descriptors of problem p; *step names what failed */
cublasStatus_t descs_init(descs *ds, const problem *p, const char **step) {
  cublasStatus_t st;
#define TRY(expr, name)                                                                        \
  do {                                                                                         \
    if ((st = (expr)) != CUBLAS_STATUS_SUCCESS) {                                              \
      *step = name;                                                                            \
      return st;                                                                               \
    }                                                                                          \
  } while (0)
#define SET(attr, val) TRY(cublasLtMatmulDescSetAttribute(&ds->op, attr, &(val), sizeof(val)), #attr)
  TRY(cublasLtMatmulDescInit(&ds->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
  const cublasOperation_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  SET(CUBLASLT_MATMUL_DESC_TRANSA, ta);
  SET(CUBLASLT_MATMUL_DESC_TRANSB, tb);
  TRY(cublasLtMatrixLayoutInit(&ds->a, CUDA_R_16BF, (uint64_t)p->a_rows, (uint64_t)p->a_cols,
                               p->a_rows), "layout of A");
  TRY(cublasLtMatrixLayoutInit(&ds->b, CUDA_R_16BF, (uint64_t)p->b_rows, (uint64_t)p->b_cols,
                               p->b_rows), "layout of B");
  TRY(cublasLtMatrixLayoutInit(&ds->d, CUDA_R_32F, (uint64_t)p->m, (uint64_t)p->n, p->m),
      "layout of D");
#undef SET
#undef TRY
  return CUBLAS_STATUS_SUCCESS;
}

/* The heuristic's first algorithm for p into *algo; *none: it returned none. */
cublasStatus_t heuristic(train_direct *d, const problem *p, const uint32_t al[3],
                         cublasLtMatmulAlgo_t *algo, int *none, const char **step) {
  descs ds;
  *none = 0;
  cublasStatus_t st = descs_init(&ds, p, step);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulPreferenceOpaque_t pref;
  const uint64_t wsb = DIRECT_WORKSPACE;
  /* split-K partial sums only in the compute type (FP32), as libhqcore's runner allows */
  const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  *step = "the heuristic's preferences";
  st = cublasLtMatmulPreferenceInit(&pref);
#define PREF(attr, v)                                                                          \
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(&pref, attr, &(v), sizeof(v))
  PREF(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, wsb);
  PREF(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al[0]);
  PREF(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al[1]);
  PREF(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al[2]);
  PREF(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al[2]);
  PREF(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, red);
#undef PREF
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof res);
  int count = 0;
  *step = "cublasLtMatmulAlgoGetHeuristic";
  st = cublasLtMatmulAlgoGetHeuristic(d->lt, (cublasLtMatmulDesc_t)&ds.op,
                                      (cublasLtMatrixLayout_t)&ds.a, (cublasLtMatrixLayout_t)&ds.b,
                                      (cublasLtMatrixLayout_t)&ds.d, (cublasLtMatrixLayout_t)&ds.d,
                                      &pref, 1, &res, &count);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (count < 1) {
    *none = 1;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (res.state != CUBLAS_STATUS_SUCCESS) return res.state;
  *algo = res.algo;
  return CUBLAS_STATUS_SUCCESS;
}

const char *const gemm_name[G_N] = {"fprop", "dgrad", "wgrad"};

/* One GEMM of layer i: its problem's plan (the heuristic runs once per distinct problem, on
   its first call: layers of one shape share it), then the matmul. */
int matmul(train_direct *d, int i, int g, const problem *p) {
  char what[64];
  snprintf(what, sizeof what, "layer %d %s (m %lld, n %lld, k %lld)", i, gemm_name[g],
           (long long)p->m, (long long)p->n, (long long)p->k);
  if (enter(d, what)) return -1;
  plan_key key;
  memset(&key, 0, sizeof key);
  key.g = g;
  key.m = p->m;
  key.n = p->n;
  key.k = p->k;
  key.align[0] = align_of(p->a);
  key.align[1] = align_of(p->b);
  key.align[2] = align_of(p->d);
  const uint32_t *al = key.align;
  plan *pl = NULL;
  for (int q = 0; q < d->n_plans && !pl; q++)
    if (!memcmp(&d->plans[q].key, &key, sizeof key)) pl = &d->plans[q];
  const char *step = "";
  if (!pl) {
    /* only a buffer whose alignment changed between calls could need more than 3 a layer */
    if (d->n_plans == 3 * d->n_lin) return fail(d, "%s: no room for another plan", what);
    pl = &d->plans[d->n_plans];
    int none = 0;
    const cublasStatus_t st = heuristic(d, p, al, &pl->algo, &none, &step);
    if (st != CUBLAS_STATUS_SUCCESS)
      return fail(d, "%s: cuBLASLt has no BF16 x BF16 -> F32 algorithm: %s: %s", what, step,
                  none ? "the heuristic returned none" : cublasLtGetStatusString(st));
    pl->key = key;
    d->n_plans++;
  }
  descs ds;
  cublasStatus_t st = descs_init(&ds, p, &step);
  const float alpha = 1.0f, beta = 0.0f;
  if (st == CUBLAS_STATUS_SUCCESS) {
    step = "cublasLtMatmul";
    st = cublasLtMatmul(d->lt, (cublasLtMatmulDesc_t)&ds.op, &alpha, p->a,
                        (cublasLtMatrixLayout_t)&ds.a, p->b, (cublasLtMatrixLayout_t)&ds.b, &beta,
                        p->d, (cublasLtMatrixLayout_t)&ds.d, p->d, (cublasLtMatrixLayout_t)&ds.d,
                        &pl->algo, d->ws, DIRECT_WORKSPACE, d->stream);
  }
  if (st != CUBLAS_STATUS_SUCCESS)
    return fail(d, "%s: %s: %s", what, step, cublasLtGetStatusString(st));
  return 0;
}

int bad_layer(train_direct *d, int i) {
  return i < 0 || i >= d->n_lin ? fail(d, "layer %d: the model has %d", i, d->n_lin) : 0;
}

} // namespace

extern "C" int train_direct_create(hq_ctx *ctx, int n_lin, const int64_t *in, const int64_t *out,
                                   int64_t batch, train_direct **dp, char *err, size_t err_len) {
  *dp = NULL;
  if (hq_ctx_device(ctx) < 0) {
    snprintf(err, err_len, "bf16-direct calls cuBLASLt: it runs on a CUDA device (--device "
             "cuda), not on the CPU");
    return -1;
  }
  train_direct *d = (train_direct *)calloc(1, sizeof *d);
  layer *lin = (layer *)calloc((size_t)(n_lin > 0 ? n_lin : 1), sizeof *lin);
  plan *plans = (plan *)calloc((size_t)(n_lin > 0 ? 3 * n_lin : 1), sizeof *plans);
  if (!d || !lin || !plans) {
    free(d);
    free(lin);
    free(plans);
    snprintf(err, err_len, "bf16-direct: out of memory");
    return -1;
  }
  d->ctx = ctx;
  d->device = hq_ctx_device(ctx);
  d->stream = (cudaStream_t)hq_ctx_stream(ctx);
  d->batch = batch;
  d->n_lin = n_lin;
  d->lin = lin;
  d->plans = plans;
  int rc = enter(d, "bf16-direct");
  if (!rc) {
    const cublasStatus_t st = cublasLtCreate(&d->lt);
    if (st == CUBLAS_STATUS_SUCCESS) d->have_lt = 1;
    else rc = fail(d, "bf16-direct: cublasLtCreate: %s", cublasLtGetStatusString(st));
  }
  int64_t widest = 0;
  if (!rc && hq_ctx_alloc(ctx, DIRECT_WORKSPACE, &d->ws))
    rc = fail(d, "bf16-direct: the %zu-byte cuBLASLt workspace: %s", DIRECT_WORKSPACE,
              hq_last_error());
  for (int i = 0; i < n_lin && !rc; i++) {
    layer *l = &d->lin[i];
    l->in = in[i];
    l->out = out[i];
    if (out[i] > widest) widest = out[i];
    if (hq_ctx_alloc(ctx, (size_t)(l->out * l->in) * 2, (void **)&l->wb) ||
        hq_ctx_alloc(ctx, (size_t)(batch * l->in) * 2, (void **)&l->xb))
      rc = fail(d, "bf16-direct: layer %d's BF16 weight and input: %s", i, hq_last_error());
  }
  if (!rc && hq_ctx_alloc(ctx, (size_t)(batch * widest) * 2, (void **)&d->dyb))
    rc = fail(d, "bf16-direct: the BF16 output gradient: %s", hq_last_error());
  if (rc) {
    snprintf(err, err_len, "%s", d->err);
    train_direct_free(d);
    return -1;
  }
  *dp = d;
  return 0;
}

extern "C" void train_direct_free(train_direct *d) {
  if (!d) return;
  for (int i = 0; i < d->n_lin; i++) {
    if (d->lin[i].wb) hq_ctx_free(d->ctx, d->lin[i].wb);
    if (d->lin[i].xb) hq_ctx_free(d->ctx, d->lin[i].xb);
  }
  if (d->dyb) hq_ctx_free(d->ctx, d->dyb);
  if (d->ws) hq_ctx_free(d->ctx, d->ws);
  if (d->have_lt && enter(d, "bf16-direct") == 0) cublasLtDestroy(d->lt);
  free(d->lin);
  free(d->plans);
  free(d);
}

extern "C" int train_direct_weight(train_direct *d, int i, const float *w) {
  if (bad_layer(d, i)) return -1;
  const layer *l = &d->lin[i];
  return cast(d, w, l->wb, l->out * l->in, "the weight's BF16 cast");
}

extern "C" int train_direct_input(train_direct *d, int i, const float *x) {
  if (bad_layer(d, i)) return -1;
  return cast(d, x, d->lin[i].xb, d->batch * d->lin[i].in, "the input's BF16 cast");
}

extern "C" int train_direct_grad(train_direct *d, int i, const float *dy) {
  if (bad_layer(d, i)) return -1;
  return cast(d, dy, d->dyb, d->batch * d->lin[i].out, "the output gradient's BF16 cast");
}

extern "C" int train_direct_fprop(train_direct *d, int i, float *y) {
  if (bad_layer(d, i)) return -1;
  const layer *l = &d->lin[i];
  const problem p = {l->wb, l->xb, y, l->in, l->out, l->in, d->batch,
                     l->out, d->batch, l->in, 1, 0};
  return matmul(d, i, G_FPROP, &p);
}

extern "C" int train_direct_dgrad(train_direct *d, int i, float *dx) {
  if (bad_layer(d, i)) return -1;
  const layer *l = &d->lin[i];
  const problem p = {l->wb, d->dyb, dx, l->in, l->out, l->out, d->batch,
                     l->in, d->batch, l->out, 0, 0};
  return matmul(d, i, G_DGRAD, &p);
}

extern "C" int train_direct_wgrad(train_direct *d, int i, float *gw) {
  if (bad_layer(d, i)) return -1;
  const layer *l = &d->lin[i];
  const problem p = {l->xb, d->dyb, gw, l->in, d->batch, l->out, d->batch,
                     l->in, l->out, d->batch, 0, 1};
  return matmul(d, i, G_WGRAD, &p);
}

extern "C" const char *train_direct_error(const train_direct *d) {
  return d ? d->err : "bf16-direct: no run";
}
