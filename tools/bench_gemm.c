/*
** bench_gemm.c -- `hq bench --gemm`: GEMM throughput of hq against direct calls of the same
** kind, in one run.
**
** CUDA (--device cuda): for each shape m x n x k (D = m x n, bf16; A [m, k] and B [n, k] row-major, the
** "TN" product of a linear layer's fprop), medians over --iters samples timed with CUDA events
** (a sample: --batch calls back to back, its time divided by the batch) of
**   - cuBLASLt BF16, called directly here (not through hq): the baseline;
**   - hq identity bf16 (native: cuBLASLt on the stored data), in % of the direct BF16 call;
**   - cuBLASLt FP8 e4m3 x e4m3 with per-tensor scales, called directly on the bytes of hq's
**     fp8_tensor storages, and hq fp8_tensor (native) in % of it (target >= 95%);
**   - the same for fp8_block, 1x128 x 1x128 and 128x128 x 1x128 scales (Hopper);
**   - hq mxfp8 and nvfp4 on the path this device gives them (emulated on Hopper: raw dequantize
**     of both operands to BF16 included; against a BF16 operand of at most 2048 rows the large
**     operand fused) in % of the direct BF16 rate (target >= 80%);
** each hq row against its baseline timed again interleaved with it, sample by sample;
** and the host dispatch overhead of one hq_gemm call: hq_gemm_plan timed over many calls, and
** the host time per call of hq_gemm minus that of a direct cublasLtMatmul with a prepared plan
** (a small shape, best of several batches of calls issued back to back; target < 2 us).
** CPU (the default, as for every hq command): hq's CPU path (f32 tensors; fp8_tensor and mxfp8
** with their raw dequantize) against a plain sgemm called directly (the BLAS libhqcore was built
** with). --format and --recipe/--role replace hq's quantized default rows with the user's, each
** against the direct BF16 call (CUDA) or the direct sgemm (CPU).
**
** The direct calls reach cuBLASLt (and cblas_sgemm) through the libraries libhqcore already
** loaded (dlsym), so the command links nothing beyond libhqcore and the CUDA runtime.
** A benchmark, never a test.
*/
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_spec.h"
#include "bench_timer.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "hq/numerics.h"

#ifdef HQ_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

#define CMD "bench --gemm"

static const char usage[] =
    "usage: hq bench --gemm [--device cpu|cuda[:N]] [--shape MxNxK]... [--iters N]\n"
    "                       [--batch N] [--format 'PLUGIN[ key=value...]']...\n"
    "                       [--recipe FILE --role M:T:N] [--path auto|fused|unfused|emulated]\n"
    "                       [--d bf16|f32] [--trainer] [--plugin-dir DIR]... [--json]\n"
    "\n"
    "GEMM throughput of hq against direct calls of the same kind, in one run: D = A B^T with\n"
    "A [m, k], B [n, k] (the fprop of a linear layer), D bf16 on a GPU (--d f32: F32, as hq\n"
    "train's GEMMs write it, for the baseline and every row) and f32 on the CPU. On the CPU\n"
    "by default, as every hq command; --device cuda for the GPU.\n"
    "--format (one row per configuration) and --recipe/--role (the role's rowwise format, both\n"
    "operands quantized with it; a relative FILE that is not here: the shipped recipe of that\n"
    "name) replace hq's quantized rows: each is timed against the\n"
    "baseline (the direct BF16 call on a GPU, the direct sgemm on the CPU). --path picks\n"
    "the path of those rows: auto (default: the one hq_gemm picks), fused (a fused kernel\n"
    "wherever one can run: HQ_GEMM_FUSED_ALWAYS), unfused (no fused kernel:\n"
    "HQ_GEMM_NO_FUSED) or emulated (both operands dequantized, one BF16 GEMM:\n"
    "HQ_GEMM_FORCE_EMULATED), to compare the paths of a shape.\n"
    "CUDA (default shapes 8192x8192x8192, 4096x4096x4096, 16384x4096x1024, 16384x1024x4096;\n"
    "20 iterations): a direct cuBLASLt BF16 GEMM (the baseline), hq identity bf16, a direct\n"
    "cuBLASLt FP8 GEMM and hq fp8_tensor (target >= 98% of the direct call; split FP32\n"
    "accumulation, and again both with fast accumulation, HQ_GEMM_FAST_ACCUM), the same for\n"
    "fp8_block (1x128 x 1x128 and 128x128 x 1x128 scales, Hopper), hq mxfp8, nvfp4, mxfp4 and\n"
    "mxfp6 on the path the device gives them (dequantize included; target >= 80% of the BF16\n"
    "rate), and the host dispatch overhead per hq_gemm call (target < 2 us).\n"
    "Then (and alone with --trainer) the GEMMs of hq train's large model as the trainer\n"
    "calls them (32768 tokens, 4096 x 4096 layers and the 4096 -> 128 lm_head; fprop, dgrad\n"
    "and wgrad through hq_linear_*, D f32) for the BF16, E4M3, hybrid (E4M3 forward, E5M2\n"
    "gradients) and FP8-block (128x128 weights, 1x128 activations) recipes, each beside a\n"
    "direct cuBLASLt call on the same storages' bytes in the same layout (target >= 98%); a\n"
    "mixed FP8 pair is also timed with A and B swapped.\n"
    "CPU (default 1024x1024x1024, 5 iterations): hq's CPU path against a plain sgemm.\n"
    "Medians over --iters samples; a sample is --batch calls issued back to back between two\n"
    "CUDA events, its time divided by the batch (default 10 on a GPU: the time per call of a\n"
    "trainer that keeps the GPU's queue full, the host's work overlapping the GPU's; --batch 1\n"
    "times each call alone, the host's work before its first kernel included). Each hq row\n"
    "times its baseline again, one sample of it before each of its own, and its percentage is\n"
    "against that interleaved median (a shared GPU's clocks drift between rows); the baseline's\n"
    "own row shows its first timing. TFLOP/s = 2 m n k / time.\n"
    "Exit status 1 when an hq row did not run (failed: the reason); a direct call this\n"
    "machine lacks (no cblas_sgemm, a pair the GPU's cuBLASLt refuses) and a default row\n"
    "whose module is not installed are skipped (the reason in parentheses) and leave it 0.\n";

/* One measured row. */
typedef struct row {
  int64_t m, n, k;
  const char *kind;         /* "cuBLASLt bf16 (direct)", "hq fp8_tensor", ... */
  const char *path;         /* hq's path name, or "direct" */
  double ms;                /* median; NAN when not run */
  const char *base;         /* the row it is compared with, or NULL */
  double base_ms;
  double target;            /* % of the baseline it should reach, 0: none */
  char note[320];           /* why it did not run, or the reason hq took its path */
  uint32_t fused;           /* hq_gemm_info.fused: 1 = A, 2 = B read as codes (fused-bf16) */
  int user;                 /* a row of --format or --recipe/--role */
  int missing;              /* its module is not installed (bench_spec_missing) */
} row;

/* Whether row r was meant to run and did not (exit status 1): a direct library call this machine
   lacks (no cblas_sgemm, a pair this GPU's cuBLASLt refuses) and a stock row whose module is not
   installed are skipped instead. */
static int row_failed(const row *r) {
  if (!isnan(r->ms)) return 0;
  if (r->path && !strcmp(r->path, "direct")) return 0;
  return r->user || !r->missing;
}

#ifdef HQ_HAVE_CUDA
/* Host microseconds (the dispatch bench times host work, not the device) */
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}
#endif

static double tflops(const row *r) {
  return 2.0 * (double)r->m * (double)r->n * (double)r->k / (r->ms * 1e-3) * 1e-12;
}

/* Random host values (a sum of two uniforms in [-1, 1)) of dtype dt, [rows, cols]. */
static void *random_host(hq_dtype dt, int64_t rows, int64_t cols, uint64_t seed) {
  size_t n = (size_t)(rows * cols);
  void *p = malloc(n * hq_dtype_size(dt));
  if (!p) return NULL;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float v = (float)((double)(s >> 40) * (1.0 / 8388608.0) - 1.0);
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v += (float)((double)(s >> 40) * (1.0 / 8388608.0) - 1.0);
    hq_store_hp(p, (int64_t)i, dt, v);
  }
  return p;
}

/* A quantizer of one format configuration ("fp8_block block=2d") for both directions, rowwise
   only (the TN product reads A's and B's rowwise copies). */
static hq_quantizer *quantizer_for(const char *spec, hq_plugins *set, hq_recipe **rp) {
  char text[1024];
  if (bench_recipe_text(spec, "f", text, sizeof text, NULL, 0)) return NULL;
  const hq_recipe_opts o = {.struct_size = sizeof o, .plugins = set};
  hq_recipe *r = NULL;
  if (hq_recipe_parse_string(text, "bench", &o, &r)) return NULL;
  if (hq_recipe_error_count(r)) {
    hq_recipe_free(r);
    return NULL;
  }
  hq_role role = hq_role_of("bench", "tensor", "x");
  hq_quantizer *q = NULL;
  if (hq_quantizer_create(r, &role, &q) || hq_quantizer_set_usage(q, HQ_ROWWISE)) {
    hq_quantizer_free(q);
    hq_recipe_free(r);
    return NULL;
  }
  *rp = r;
  return q;
}

/* Output ---------------------------------------------------------------------------------------- */

static void print_header(int gpu) {
  printf("%-20s %-44s %-14s %9s %8s  %s\n", "m x n x k", "kind", "path", "median_ms",
         gpu ? "TFLOP/s" : "GFLOP/s", "vs baseline");
}

static void print_row(const row *r, int first, int gpu) {
  char shape[64] = "";
  if (first)
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)r->m, (long long)r->n,
             (long long)r->k);
  if (isnan(r->ms)) {
    printf("%-20s %-44s %-14s %9s %8s  (%s%s)\n", shape, r->kind, r->path ? r->path : "-", "-",
           "-", row_failed(r) ? "failed: " : "", r->note);
    return;
  }
  double f = tflops(r) * (gpu ? 1.0 : 1000.0);
  printf("%-20s %-44s %-14s %9.4f %8.1f", shape, r->kind, r->path, r->ms, f);
  if (r->base && !isnan(r->base_ms)) {
    double pct = 100.0 * r->base_ms / r->ms;
    printf("  %5.1f%% of %s", pct, r->base);
    if (r->target > 0) printf(" (target >= %.0f%%: %s)", r->target, pct >= r->target ? "met" : "MISSED");
  }
  if (r->note[0]) printf("  [%s]", r->note);
  printf("\n");
}

static void json_row(json *j, const row *r) {
  const int64_t mnk[3] = {r->m, r->n, r->k};
  json_obj(j);
  json_kints(j, "shape", mnk, 3);
  json_kstr(j, "kind", r->kind);
  if (r->path) json_kstr(j, "path", r->path);
  if (r->fused) json_kstr(j, "fused_operand", r->fused == 1 ? "A" : "B");
  if (isnan(r->ms)) {
    json_kstr(j, row_failed(r) ? "error" : "skipped", r->note);
  } else {
    json_knum(j, "median_ms", r->ms);
    json_knum(j, "tflops", tflops(r));
    if (r->base && !isnan(r->base_ms)) {
      json_kstr(j, "baseline", r->base);
      json_knum(j, "percent_of_baseline", 100.0 * r->base_ms / r->ms);
      if (r->target > 0) {
        json_knum(j, "target_percent", r->target);
        json_kbool(j, "target_met", 100.0 * r->base_ms / r->ms >= r->target);
      }
    }
    if (r->note[0]) json_kstr(j, "note", r->note);
  }
  json_close_obj(j);
}

/* hq_gemm, timed ------------------------------------------------------------------------------- */

/* One hq_gemm call (D = A B^T) as a timed call. */
typedef struct hq_call_args {
  hq_ctx *ctx;
  hq_operand a, b;
  hq_tensor *d;
  hq_gemm_info *info;
  const hq_gemm_args *args; /* NULL, or the flags of the row (HQ_GEMM_FAST_ACCUM) */
} hq_call_args;

static int hq_call_run(void *arg) {
  hq_call_args *c = arg;
  return hq_gemm(c->ctx, c->a, 1, c->b, 0, c->d, 1.0f, 0.0f, c->args, c->info);
}

/* Median ms per hq_gemm call (bench_time_calls, 3 warm-up samples); the path into *info; with a
   baseline, its interleaved median into *base_ms. */
static int time_hq(hq_ctx *ctx, bench_timer *t, hq_operand a, hq_operand b, hq_tensor *d,
                   int iters, int batch, hq_gemm_info *info, double *ms,
                   const bench_timed *base, double *base_ms, const hq_gemm_args *args) {
  info->struct_size = sizeof *info;
  hq_call_args c = {ctx, a, b, d, info, args};
  const bench_timed f = {hq_call_run, &c};
  return bench_time_calls(t, iters, 3, batch, &f, ms, base, base_ms);
}

#ifdef HQ_HAVE_CUDA
/* cuBLASLt, reached through the copy libhqcore loaded --------------------------------------------- */

#define LT_FN(name) __typeof__(&name) name
static struct lt_api {
  int ok;
  LT_FN(cublasLtCreate);
  LT_FN(cublasLtDestroy);
  LT_FN(cublasLtMatmulDescCreate);
  LT_FN(cublasLtMatmulDescDestroy);
  LT_FN(cublasLtMatmulDescSetAttribute);
  LT_FN(cublasLtMatrixLayoutCreate);
  LT_FN(cublasLtMatrixLayoutDestroy);
  LT_FN(cublasLtMatmulPreferenceCreate);
  LT_FN(cublasLtMatmulPreferenceDestroy);
  LT_FN(cublasLtMatmulPreferenceSetAttribute);
  LT_FN(cublasLtMatmulAlgoGetHeuristic);
  LT_FN(cublasLtMatmul);
  LT_FN(cublasLtGetStatusString);
} lt;

static int lt_load(char *err, size_t len) {
  if (lt.ok) return 0;
#define LT_LOAD(name)                                                                         \
  do {                                                                                        \
    lt.name = (__typeof__(lt.name))dlsym(RTLD_DEFAULT, #name);                                \
    if (!lt.name) {                                                                           \
      snprintf(err, len, "cuBLASLt's %s is not loaded in this process", #name);               \
      return -1;                                                                              \
    }                                                                                         \
  } while (0)
  LT_LOAD(cublasLtCreate);
  LT_LOAD(cublasLtDestroy);
  LT_LOAD(cublasLtMatmulDescCreate);
  LT_LOAD(cublasLtMatmulDescDestroy);
  LT_LOAD(cublasLtMatmulDescSetAttribute);
  LT_LOAD(cublasLtMatrixLayoutCreate);
  LT_LOAD(cublasLtMatrixLayoutDestroy);
  LT_LOAD(cublasLtMatmulPreferenceCreate);
  LT_LOAD(cublasLtMatmulPreferenceDestroy);
  LT_LOAD(cublasLtMatmulPreferenceSetAttribute);
  LT_LOAD(cublasLtMatmulAlgoGetHeuristic);
  LT_LOAD(cublasLtMatmul);
  LT_LOAD(cublasLtGetStatusString);
#undef LT_LOAD
  lt.ok = 1;
  return 0;
}

/* One operand of a direct call: a [outer, k] row-major matrix (column-major k x outer, ld k). */
typedef struct dop {
  const void *data;
  cudaDataType type;
  int scale_mode;           /* -1: none; else a cublasLtMatmulMatrixScale_t */
  const void *scale;
  int k_outer;              /* 1: stored [k, outer] instead (k strided: an identity storage's
                               data read by dgrad or wgrad) */
} dop;

/* A prepared direct matmul D (m x n, column-major) = op(A) op(B): "TN" for k-contiguous
   operands, "N" for an A and "T" for a B stored [k, outer]. */
typedef struct direct {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  void *a, *b, *d;
} direct;

#define LT_CK(expr)                                                                           \
  do {                                                                                        \
    cublasStatus_t st_ = (expr);                                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      snprintf(err, len, "%s: %s", #expr, lt.cublasLtGetStatusString(st_));                   \
      return -1;                                                                              \
    }                                                                                         \
  } while (0)

static void direct_free(direct *x) {
  if (x->op) lt.cublasLtMatmulDescDestroy(x->op);
  if (x->la) lt.cublasLtMatrixLayoutDestroy(x->la);
  if (x->lb) lt.cublasLtMatrixLayoutDestroy(x->lb);
  if (x->ld) lt.cublasLtMatrixLayoutDestroy(x->ld);
  memset(x, 0, sizeof *x);
}

static int direct_prepare(cublasLtHandle_t h, size_t ws_bytes, const dop *A, const dop *B,
                          int64_t m, int64_t n, int64_t k, void *D, cudaDataType td,
                          int fast_accum, direct *x, char *err, size_t len) {
  memset(x, 0, sizeof *x);
  /* F32 x F32 as hq's runner asks for it: really FP32 (no TF32) */
  LT_CK(lt.cublasLtMatmulDescCreate(
      &x->op, A->type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = A->k_outer ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t tb = B->k_outer ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CK(lt.cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CK(lt.cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (A->type == CUDA_R_8F_E4M3 || A->type == CUDA_R_8F_E5M2) {
    int8_t fa = (int8_t)fast_accum;
    LT_CK(lt.cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
  }
  const dop *ops[2] = {A, B};
  for (int i = 0; i < 2; i++) {
    if (ops[i]->scale_mode < 0) continue;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
    cublasLtMatmulMatrixScale_t sm = (cublasLtMatmulMatrixScale_t)ops[i]->scale_mode;
    LT_CK(lt.cublasLtMatmulDescSetAttribute(
        x->op, i ? CUBLASLT_MATMUL_DESC_B_SCALE_MODE : CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm,
        sizeof sm));
#else
    if (ops[i]->scale_mode != 0) {
      snprintf(err, len, "this cuBLASLt has no block scale modes");
      return -1;
    }
#endif
    const void *p = ops[i]->scale;
    LT_CK(lt.cublasLtMatmulDescSetAttribute(
        x->op, i ? CUBLASLT_MATMUL_DESC_B_SCALE_POINTER : CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p,
        sizeof p));
  }
  if (A->k_outer) LT_CK(lt.cublasLtMatrixLayoutCreate(&x->la, A->type, (uint64_t)m, (uint64_t)k, m));
  else LT_CK(lt.cublasLtMatrixLayoutCreate(&x->la, A->type, (uint64_t)k, (uint64_t)m, k));
  if (B->k_outer) LT_CK(lt.cublasLtMatrixLayoutCreate(&x->lb, B->type, (uint64_t)n, (uint64_t)k, n));
  else LT_CK(lt.cublasLtMatrixLayoutCreate(&x->lb, B->type, (uint64_t)k, (uint64_t)n, k));
  LT_CK(lt.cublasLtMatrixLayoutCreate(&x->ld, td, (uint64_t)m, (uint64_t)n, m));
  cublasLtMatmulPreference_t pref = NULL;
  LT_CK(lt.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t wsb = ws_bytes;
  cublasStatus_t st = lt.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  cublasLtMatmulHeuristicResult_t res;
  int cnt = 0;
  memset(&res, 0, sizeof res);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.cublasLtMatmulAlgoGetHeuristic(h, x->op, x->la, x->lb, x->ld, x->ld, pref, 1, &res,
                                           &cnt);
  lt.cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || cnt < 1) {
    snprintf(err, len, "cuBLASLt has no algorithm (%s)",
             st != CUBLAS_STATUS_SUCCESS ? lt.cublasLtGetStatusString(st) : "none returned");
    return -1;
  }
  x->algo = res.algo;
  x->a = (void *)A->data;
  x->b = (void *)B->data;
  x->d = D;
  return 0;
}

static cublasStatus_t direct_run(cublasLtHandle_t h, const direct *x, void *ws, size_t ws_bytes) {
  static const float one = 1.0f, zero = 0.0f;
  return lt.cublasLtMatmul(h, x->op, &one, x->a, x->la, x->b, x->lb, &zero, x->d, x->ld, x->d,
                           x->ld, &x->algo, ws, ws_bytes, 0);
}

/* A direct call as a timed call (the last status in st). */
typedef struct direct_pair {
  cublasLtHandle_t h;
  const direct *x;
  void *ws;
  size_t ws_bytes;
  cublasStatus_t st;
} direct_pair;

static int direct_pair_run(void *arg) {
  direct_pair *p = arg;
  p->st = direct_run(p->h, p->x, p->ws, p->ws_bytes);
  return p->st == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* Median ms per direct call (bench_time_calls, 3 warm-up samples); a failed call's status in
   err. */
static int direct_time(cublasLtHandle_t h, const direct *x, void *ws, size_t ws_bytes,
                       bench_timer *t, int iters, int batch, double *ms, char *err, size_t len) {
  direct_pair p = {h, x, ws, ws_bytes, CUBLAS_STATUS_SUCCESS};
  const bench_timed f = {direct_pair_run, &p};
  const int rc = bench_time_calls(t, iters, 3, batch, &f, ms, NULL, NULL);
  if (rc && p.st != CUBLAS_STATUS_SUCCESS)
    snprintf(err, len, "cublasLtMatmul: %s", lt.cublasLtGetStatusString(p.st));
  return rc;
}

/* The direct operand of direction dir of a storage (fp8_tensor: SCALAR_32F; fp8_block: VEC128 /
   BLK128x128; identity: the plain data, no scale). */
static int dop_dir(const hq_qtensor *qt, uint32_t dir, dop *o, char *err, size_t len) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  if (!s) {
    snprintf(err, len, "no %s storage", dir == HQ_ROWWISE ? "rowwise" : "columnwise");
    return -1;
  }
  memset(o, 0, sizeof *o);
  o->scale_mode = -1;
  for (uint32_t i = 0; i < s->nbuf; i++) {
    const hq_buffer *b = hq_storage_cbuf(s, i);
    if (b->role == HQ_ROLE_DATA) o->data = b->ptr;
    if (b->role == HQ_ROLE_SCALE) o->scale = b->ptr;
  }
  o->type = s->desc.elem == HQ_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  if (s->desc.scale_mode == HQ_SCALE_NONE && (s->desc.elem == HQ_BF16 || s->desc.elem == HQ_F32)) {
    o->type = s->desc.elem == HQ_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (!o->data) snprintf(err, len, "the storage lacks its data buffer");
    return o->data ? 0 : -1;
  }
  switch (s->desc.scale_mode) {
  case HQ_SCALE_TENSOR_F32: o->scale_mode = 0; break;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
  case HQ_SCALE_VEC128_F32: o->scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; break;
  case HQ_SCALE_BLK128X128_F32: o->scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; break;
#endif
  default:
    snprintf(err, len, "scale mode %u has no direct cuBLASLt counterpart here", s->desc.scale_mode);
    return -1;
  }
  if (!o->data || !o->scale) {
    snprintf(err, len, "the storage lacks its data or scale buffer");
    return -1;
  }
  return 0;
}

static int dop_of(const hq_qtensor *qt, dop *o, char *err, size_t len) {
  return dop_dir(qt, HQ_ROWWISE, o, err, len);
}

/* The host time per call of `calls` back-to-back calls, best of `batches` (synchronized
   between batches). which: 0 hq_gemm_plan, 1 hq_gemm, 2 direct. */
typedef struct disp {
  hq_ctx *ctx;
  hq_operand a, b;
  hq_tensor *d;
  cublasLtHandle_t h;
  const direct *x;
  void *ws;
  size_t ws_bytes;
} disp;

static double host_us(const disp *p, int which, int calls, int batches) {
  double best = INFINITY;
  for (int bt = 0; bt < batches; bt++) {
    cudaDeviceSynchronize();
    double t0 = now_us();
    for (int i = 0; i < calls; i++) {
      int rc = 0;
      if (which == 0) rc = hq_gemm_plan(p->ctx, p->a, 1, p->b, 0, p->d, NULL, NULL);
      else if (which == 1) rc = hq_gemm(p->ctx, p->a, 1, p->b, 0, p->d, 1.0f, 0.0f, NULL, NULL);
      else rc = direct_run(p->h, p->x, p->ws, p->ws_bytes) != CUBLAS_STATUS_SUCCESS;
      if (rc) return NAN;
    }
    double t1 = now_us();
    if ((t1 - t0) / calls < best) best = (t1 - t0) / calls;
  }
  cudaDeviceSynchronize();
  return best;
}
#endif /* HQ_HAVE_CUDA */

/* The GPU bench ---------------------------------------------------------------------------------- */

/* The host dispatch overhead of one kind on a small shape. */
typedef struct dispatch_res {
  const char *kind;
  int64_t mnk;
  double plan_us, hq_us, direct_us;
  char note[200];
} dispatch_res;

#define MAX_SHAPES 16
#define MAX_ROWS 256

#define MAX_USER 16

typedef struct bench {
  int device, iters, batch;
  hq_ctx *ctx;
  bench_timer *timer;
  hq_plugins *set; /* every module loaded once for all the format configurations */
  row rows[MAX_ROWS];
  int nrows;
  /* the user's rows, replacing the default ones when there are any: --format's specs, and the
     quantizer of --recipe/--role (its recipe and delayed-scaling state kept alive with it) */
  const char *const *specs;
  size_t nspecs;
  char labels[MAX_USER + 1][300];
  hq_recipe *role_r;
  hq_state *role_st;
  hq_quantizer *role_q;
  const hq_gemm_args *args; /* hq_gemm's arguments for the rows being timed (NULL: none) */
  hq_gemm_args user_args;   /* the user's rows' (--path) */
  int d_f32;                /* a GPU's D in F32 (--d f32), not BF16 */
  char labels_t[MAX_ROWS][120]; /* the trainer rows' kinds */
  int nlabels_t;
} bench;

static row *add_row(bench *B, int64_t m, int64_t n, int64_t k, const char *kind) {
  if (B->nrows == MAX_ROWS) return NULL;
  row *r = &B->rows[B->nrows++];
  memset(r, 0, sizeof *r);
  r->m = m, r->n = n, r->k = k;
  r->kind = kind;
  r->ms = NAN;
  r->base_ms = NAN;
  return r;
}

/* Quantize src with q (labelled `what` in the note); NULL on failure (note set). */
static hq_qtensor *quantize_with(bench *B, hq_quantizer *q, const char *what,
                                 const hq_tensor *src, char *note, size_t len) {
  hq_qtensor *qt = NULL;
  if (hq_quantize(q, B->ctx, src, &qt)) {
    snprintf(note, len, "%s: %s", what, hq_last_error());
    qt = NULL;
  }
  return qt;
}

/* Quantize src ([rows, cols] on the context's device) with `spec`; NULL on failure (note set). */
static hq_qtensor *quantize_spec(bench *B, const char *spec, const hq_tensor *src, char *note,
                                 size_t len) {
  hq_recipe *r = NULL;
  hq_quantizer *q = quantizer_for(spec, B->set, &r);
  if (!q) {
    snprintf(note, len, "%s: %s", spec, hq_last_error()[0] ? hq_last_error() : "not installed");
    return NULL;
  }
  hq_qtensor *qt = quantize_with(B, q, spec, src, note, len);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  return qt;
}

/* quantize_spec for row r: its note says why it failed, and r->missing whether spec's module
   is not installed. */
static hq_qtensor *row_quantize(bench *B, row *r, const char *spec, const hq_tensor *src) {
  hq_qtensor *qt = quantize_spec(B, spec, src, r->note, sizeof r->note);
  if (!qt) r->missing = bench_spec_missing(B->set, spec);
  return qt;
}

/* Time hq_gemm of two formats (qa for A, qb for B) into row r; with a baseline pb (named
   `base`), its median timed interleaved into r->base_ms. */
static void hq_row(bench *B, row *r, hq_qtensor *qa, hq_qtensor *qb, hq_tensor *d,
                   const bench_timed *pb, const char *base) {
  hq_gemm_info info;
  double ms = NAN, base_ms = NAN;
  if (time_hq(B->ctx, B->timer, hq_operand_q(qa), hq_operand_q(qb), d, B->iters, B->batch, &info,
              &ms, pb, &base_ms, B->args)) {
    snprintf(r->note, sizeof r->note, "%s", hq_last_error());
    return;
  }
  r->ms = ms;
  if (pb) {
    r->base = base;
    r->base_ms = base_ms;
  }
  r->path = hq_gemm_path_name(info.path);
  r->fused = info.fused;
  if (info.reason[0]) snprintf(r->note, sizeof r->note, "%s", info.reason);
}

/* The user's rows (B->specs, then B->role_q) of one shape, each against the baseline pb (named
   `base`, median base_ms): 1 when there are any (they replace the default rows), else 0. */
static int user_rows(bench *B, int64_t m, int64_t n, int64_t k, const hq_tensor *a,
                     const hq_tensor *b, hq_tensor *d, const bench_timed *pb, const char *base,
                     double base_ms) {
  const size_t nrow = B->nspecs + (B->role_q != NULL);
  for (size_t i = 0; i < nrow; i++) {
    row *r = add_row(B, m, n, k, B->labels[i]);
    if (!r) break;
    r->user = 1;
    hq_qtensor *qa, *qb = NULL;
    if (i < B->nspecs) {
      qa = row_quantize(B, r, B->specs[i], a);
      if (qa) qb = row_quantize(B, r, B->specs[i], b);
    } else {
      qa = quantize_with(B, B->role_q, B->labels[i], a, r->note, sizeof r->note);
      if (qa) qb = quantize_with(B, B->role_q, B->labels[i], b, r->note, sizeof r->note);
    }
    r->base = base;
    r->base_ms = base_ms;
    const hq_gemm_args *saved = B->args;
    B->args = &B->user_args;
    if (qa && qb) hq_row(B, r, qa, qb, d, pb, base);
    B->args = saved;
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }
  return nrow > 0;
}

#ifdef HQ_HAVE_CUDA
/* Device memory through the bench's context, or NULL (message printed). */
static void *dalloc(bench *B, size_t bytes) {
  void *p = NULL;
  if (hq_ctx_alloc(B->ctx, bytes, &p)) {
    fprintf(stderr, "hq bench --gemm: %s\n", hq_last_error());
    return NULL;
  }
  return p;
}

static void deq_share(bench *B, row *r, hq_qtensor *qa, hq_qtensor *qb);

static int bench_cuda_shape(bench *B, int64_t m, int64_t n, int64_t k, cublasLtHandle_t h,
                            void *ws, size_t ws_bytes) {
  char err[256] = "";
  int rc = 0;
  direct xbf; /* the direct BF16 call, kept to time again beside every row measured against it */
  memset(&xbf, 0, sizeof xbf);
  hq_tensor a = hq_tensor_2d(NULL, HQ_BF16, B->device, m, k);
  hq_tensor b = hq_tensor_2d(NULL, HQ_BF16, B->device, n, k);
  hq_tensor d = hq_tensor_2d(NULL, B->d_f32 ? HQ_F32 : HQ_BF16, B->device, n, m);
  const cudaDataType dtype = B->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  void *ha = random_host(HQ_BF16, m, k, 1), *hb = random_host(HQ_BF16, n, k, 2);
  a.data = dalloc(B, (size_t)(m * k) * 2);
  b.data = dalloc(B, (size_t)(n * k) * 2);
  d.data = dalloc(B, (size_t)(m * n) * (B->d_f32 ? 4 : 2));
  if (!ha || !hb || !a.data || !b.data || !d.data ||
      hq_ctx_memcpy(B->ctx, a.data, B->device, ha, HQ_DEVICE_HOST, (size_t)(m * k) * 2) ||
      hq_ctx_memcpy(B->ctx, b.data, B->device, hb, HQ_DEVICE_HOST, (size_t)(n * k) * 2) ||
      hq_ctx_sync(B->ctx)) {
    fprintf(stderr, "hq bench --gemm: %lldx%lldx%lld: inputs: %s\n", (long long)m, (long long)n,
            (long long)k, hq_last_error());
    rc = -1;
    goto out;
  }

  /* the baseline: direct cuBLASLt BF16 */
  row *base = add_row(B, m, n, k, "cuBLASLt bf16 (direct)");
  base->path = "direct";
  direct_pair bf16_pair = {h, &xbf, ws, ws_bytes, CUBLAS_STATUS_SUCCESS};
  const bench_timed bf16_pb = {direct_pair_run, &bf16_pair};
  const bench_timed *bf16 = NULL;
  {
    dop da = {a.data, CUDA_R_16BF, -1, NULL, 0}, db = {b.data, CUDA_R_16BF, -1, NULL, 0};
    if (!direct_prepare(h, ws_bytes, &da, &db, m, n, k, d.data, dtype, 0, &xbf, err,
                        sizeof err) &&
        !direct_time(h, &xbf, ws, ws_bytes, B->timer, B->iters, B->batch, &base->ms, err,
                     sizeof err))
      bf16 = &bf16_pb;
    else
      snprintf(base->note, sizeof base->note, "%s", err);
  }
  const double bf16_ms = base->ms;
  if (user_rows(B, m, n, k, &a, &b, &d, bf16, "direct bf16", bf16_ms)) goto out;

  /* hq identity bf16 */
  {
    row *r = add_row(B, m, n, k, "hq identity bf16");
    hq_qtensor *qa = row_quantize(B, r, "identity dtype=bf16", &a);
    hq_qtensor *qb = qa ? row_quantize(B, r, "identity dtype=bf16", &b) : NULL;
    r->base = "direct bf16";
    r->base_ms = bf16_ms;
    if (qa && qb) hq_row(B, r, qa, qb, &d, bf16, "direct bf16");
    if (qa && qb && r->path && strcmp(r->path, "native")) deq_share(B, r, qa, qb);
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }

  /* FP8 per tensor, FP8 blocks: direct on hq's storages, then hq. Each direct call asks
     cuBLASLt what hq's call asks (the same accumulation: split FP32 by default, fast with
     HQ_GEMM_FAST_ACCUM), so the pair measures hq's own cost and not two different GEMMs. */
  static const struct {
    const char *spec_a, *spec_b, *direct_kind, *hq_kind, *base;
    int fast;
  } f8[] = {
      {"fp8_tensor", "fp8_tensor", "cuBLASLt fp8 e4m3, tensor scales (direct)",
       "hq fp8_tensor e4m3", "direct fp8", 0},
      {"fp8_tensor", "fp8_tensor", "cuBLASLt fp8 e4m3, tensor scales, fast accum (direct)",
       "hq fp8_tensor e4m3 fast accum", "direct fp8 fast accum", 1},
      {"fp8_block block=1d", "fp8_block block=1d", "cuBLASLt fp8 1x128 x 1x128 (direct)",
       "hq fp8_block 1d x 1d", "direct fp8 1dx1d", 0},
      {"fp8_block block=2d", "fp8_block block=1d", "cuBLASLt fp8 128x128 x 1x128 (direct)",
       "hq fp8_block 2d x 1d", "direct fp8 2dx1d", 0},
  };
  hq_gemm_args fast_args = HQ_GEMM_ARGS_INIT;
  fast_args.flags = HQ_GEMM_FAST_ACCUM;
  for (size_t i = 0; i < sizeof f8 / sizeof *f8; i++) {
    row *rd = add_row(B, m, n, k, f8[i].direct_kind);
    rd->path = "direct";
    row *rh = add_row(B, m, n, k, f8[i].hq_kind);
    hq_qtensor *qa = row_quantize(B, rh, f8[i].spec_a, &a);
    hq_qtensor *qb = qa ? row_quantize(B, rh, f8[i].spec_b, &b) : NULL;
    if (qa && qb) {
      dop da, db;
      direct x;
      memset(&x, 0, sizeof x);
      const int ok = !dop_of(qa, &da, err, sizeof err) && !dop_of(qb, &db, err, sizeof err) &&
                     !direct_prepare(h, ws_bytes, &da, &db, m, n, k, d.data, dtype,
                                     f8[i].fast, &x, err, sizeof err) &&
                     !direct_time(h, &x, ws, ws_bytes, B->timer, B->iters, B->batch, &rd->ms,
                                  err, sizeof err);
      if (!ok) snprintf(rd->note, sizeof rd->note, "%s", err);
      rd->base = "direct bf16";
      rd->base_ms = bf16_ms;
      direct_pair f8_pair = {h, &x, ws, ws_bytes, CUBLAS_STATUS_SUCCESS};
      const bench_timed f8_pb = {direct_pair_run, &f8_pair};
      rh->base = f8[i].base;
      rh->base_ms = rd->ms;
      B->args = f8[i].fast ? &fast_args : NULL;
      hq_row(B, rh, qa, qb, &d, ok ? &f8_pb : NULL, f8[i].base);
      B->args = NULL;
      direct_free(&x);
      rh->target = 98.0;
    } else {
      snprintf(rd->note, sizeof rd->note, "%s", rh->note);
    }
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }

  /* MXFP8, NVFP4, MXFP4, MXFP6 on whichever path this device gives them, against the BF16
     rate */
  static const char *emul[][2] = {
      {"mxfp8", "hq mxfp8"}, {"nvfp4", "hq nvfp4"}, {"mxfp4", "hq mxfp4"}, {"mxfp6", "hq mxfp6"}};
  for (size_t i = 0; i < sizeof emul / sizeof *emul; i++) {
    row *r = add_row(B, m, n, k, emul[i][1]);
    hq_qtensor *qa = row_quantize(B, r, emul[i][0], &a);
    hq_qtensor *qb = qa ? row_quantize(B, r, emul[i][0], &b) : NULL;
    r->base = "direct bf16";
    r->base_ms = bf16_ms;
    if (qa && qb) hq_row(B, r, qa, qb, &d, bf16, "direct bf16");
    if (qa && qb && r->path && strcmp(r->path, "native")) deq_share(B, r, qa, qb);
    r->target = r->path && strcmp(r->path, "native") ? 80.0 : 0.0;
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }
out:
  direct_free(&xbf);
  if (a.data) hq_ctx_free(B->ctx, a.data);
  if (b.data) hq_ctx_free(B->ctx, b.data);
  if (d.data) hq_ctx_free(B->ctx, d.data);
  free(ha);
  free(hb);
  return rc;
}

/* Dequantizing the operands of a row (rowwise, into BF16) as a timed call: qa / qb NULL to skip
   one. */
typedef struct deq_args {
  hq_ctx *ctx;
  const hq_qtensor *qa, *qb;
  hq_tensor *da, *db;
} deq_args;

static int deq_run(void *arg) {
  deq_args *c = arg;
  return (c->qa && hq_dequantize(c->qa, c->ctx, HQ_ROWWISE, c->da)) ||
                 (c->qb && hq_dequantize(c->qb, c->ctx, HQ_ROWWISE, c->db))
             ? -1
             : 0;
}

/* Where an emulated GEMM's time goes: the median of dequantizing the operands it dequantizes into
   BF16 (hq_dequantize, the kernels the emulated path runs; the path itself keeps the per-tensor
   factors out), appended to the row's note beside the whole call's median. The fused path
   dequantizes only the operand it does not fuse (hq_gemm_info.fused names the fused one). */
static void deq_share(bench *B, row *r, hq_qtensor *qa, hq_qtensor *qb) {
  /* only: the one operand dequantized (1 = A, 2 = B), 0: both */
  const int only = r->fused == 1 ? 2 : r->fused == 2 ? 1 : 0;
  hq_tensor da = hq_tensor_2d(NULL, HQ_BF16, B->device, hq_qtensor_rows(qa), hq_qtensor_cols(qa));
  hq_tensor db = hq_tensor_2d(NULL, HQ_BF16, B->device, hq_qtensor_rows(qb), hq_qtensor_cols(qb));
  da.data = dalloc(B, (size_t)(da.rows * da.cols) * 2);
  db.data = dalloc(B, (size_t)(db.rows * db.cols) * 2);
  deq_args c = {B->ctx, only == 2 ? NULL : qa, only == 1 ? NULL : qb, &da, &db};
  const bench_timed f = {deq_run, &c};
  double ms = NAN;
  if (da.data && db.data &&
      !bench_time_calls(B->timer, B->iters, 2, B->batch, &f, &ms, NULL, NULL)) {
    const size_t l = strlen(r->note);
    snprintf(r->note + l, sizeof r->note - l, "%sdequantize %s to bf16: %.3f ms (%.0f%% of the call)",
             l ? "; " : "", only == 1 ? "A (B fused)" : only == 2 ? "B (A fused)" : "A+B", ms,
             100.0 * ms / r->ms);
  }
  if (da.data) hq_ctx_free(B->ctx, da.data);
  if (db.data) hq_ctx_free(B->ctx, db.data);
}

/* Host dispatch overhead on a small shape: identity bf16 and fp8_tensor. */
static void bench_dispatch(bench *B, cublasLtHandle_t h, void *ws, size_t ws_bytes,
                           dispatch_res *out, int *nout) {
  const int64_t s = 256;
  hq_tensor a = hq_tensor_2d(NULL, HQ_BF16, B->device, s, s);
  hq_tensor b = a, d = a;
  void *ha = random_host(HQ_BF16, s, s, 3);
  a.data = dalloc(B, (size_t)(s * s) * 2);
  b.data = dalloc(B, (size_t)(s * s) * 2);
  d.data = dalloc(B, (size_t)(s * s) * 2);
  *nout = 0;
  if (!ha || !a.data || !b.data || !d.data ||
      hq_ctx_memcpy(B->ctx, a.data, B->device, ha, HQ_DEVICE_HOST, (size_t)(s * s) * 2) ||
      hq_ctx_memcpy(B->ctx, b.data, B->device, ha, HQ_DEVICE_HOST, (size_t)(s * s) * 2) ||
      hq_ctx_sync(B->ctx))
    goto out;
  static const char *specs[][2] = {{"identity dtype=bf16", "identity bf16"},
                                   {"fp8_tensor", "fp8_tensor e4m3"}};
  for (int i = 0; i < 2; i++) {
    dispatch_res *r = &out[(*nout)++];
    memset(r, 0, sizeof *r);
    r->kind = specs[i][1];
    r->mnk = s;
    r->plan_us = r->hq_us = r->direct_us = NAN;
    hq_qtensor *qa = quantize_spec(B, specs[i][0], &a, r->note, sizeof r->note);
    hq_qtensor *qb = qa ? quantize_spec(B, specs[i][0], &b, r->note, sizeof r->note) : NULL;
    char err[256] = "";
    direct x;
    memset(&x, 0, sizeof x);
    dop da = {a.data, CUDA_R_16BF, -1, NULL, 0}, db = {b.data, CUDA_R_16BF, -1, NULL, 0};
    if (qa && qb && (i == 0 || (!dop_of(qa, &da, err, sizeof err) &&
                                !dop_of(qb, &db, err, sizeof err))) &&
        !direct_prepare(h, ws_bytes, &da, &db, s, s, s, d.data, CUDA_R_16BF, i == 1, &x,
                        err, sizeof err)) {
      disp p = {B->ctx, hq_operand_q(qa), hq_operand_q(qb), &d, h, &x, ws, ws_bytes};
      host_us(&p, 1, 20, 1); /* warm-up: plans cached */
      r->plan_us = host_us(&p, 0, 1000, 5);
      r->hq_us = host_us(&p, 1, 100, 9);
      r->direct_us = host_us(&p, 2, 100, 9);
    } else if (err[0]) {
      snprintf(r->note, sizeof r->note, "%s", err);
    }
    direct_free(&x);
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }
out:
  if (a.data) hq_ctx_free(B->ctx, a.data);
  if (b.data) hq_ctx_free(B->ctx, b.data);
  if (d.data) hq_ctx_free(B->ctx, d.data);
  free(ha);
}
/* The trainer's GEMMs --------------------------------------------------------------------------- */

/* One of a linear layer's three GEMMs through hq (hq_linear_fprop / dgrad / wgrad), D F32 as in
   `hq train`, as a timed call. */
enum { LIN_FPROP, LIN_DGRAD, LIN_WGRAD };
typedef struct lin_call {
  hq_ctx *ctx;
  int which;
  const hq_qtensor *x, *w, *dy;
  hq_tensor *d;
  hq_gemm_info *info;
} lin_call;

static int lin_run(void *arg) {
  lin_call *c = arg;
  if (c->which == LIN_FPROP)
    return hq_linear_fprop(c->ctx, hq_operand_q(c->x), hq_operand_q(c->w), NULL, HQ_F32, c->d,
                           c->info);
  if (c->which == LIN_DGRAD)
    return hq_linear_dgrad(c->ctx, hq_operand_q(c->dy), hq_operand_q(c->w), c->d, c->info);
  return hq_linear_wgrad(c->ctx, hq_operand_q(c->x), hq_operand_q(c->dy), c->d, 0, c->info);
}

/* Quantize src with `spec`, both directions (the three GEMMs read both); NULL on failure. */
static hq_qtensor *quantize_both(bench *B, const char *spec, const hq_tensor *src, char *note,
                                 size_t len) {
  hq_recipe *r = NULL;
  hq_quantizer *q = quantizer_for(spec, B->set, &r);
  hq_qtensor *qt = NULL;
  if (!q || hq_quantizer_set_usage(q, HQ_BOTH))
    snprintf(note, len, "%s: %s", spec, hq_last_error()[0] ? hq_last_error() : "not installed");
  else
    qt = quantize_with(B, q, spec, src, note, len);
  hq_quantizer_free(q);
  hq_recipe_free(r);
  return qt;
}

/* The operands cuBLASLt multiplies for GEMM `which` of a layer: fprop A = W rowwise, B = x
   rowwise; dgrad A = W columnwise, B = dy rowwise; wgrad A = x columnwise, B = dy columnwise.
   A storage in [M, K] order holds the tensor as it is, so k is strided in dgrad's A and in both
   of wgrad's operands (the "NN" and "NT" products of a high-precision layer); a per-tensor FP8
   columnwise copy is stored transposed ([K, M] order), so its three products are all "TN". */
static int lin_dops(int which, const hq_qtensor *x, const hq_qtensor *w, const hq_qtensor *dy,
                    dop *a, dop *b, char *err, size_t len) {
  const hq_qtensor *qa = which == LIN_WGRAD ? x : w, *qb = dy;
  const uint32_t da = which == LIN_FPROP ? HQ_ROWWISE : HQ_COLWISE;
  const uint32_t db = which == LIN_WGRAD ? HQ_COLWISE : HQ_ROWWISE;
  if (which == LIN_FPROP) qb = x;
  if (dop_dir(qa, da, a, err, len) || dop_dir(qb, db, b, err, len)) return -1;
  const int km_a = hq_qtensor_storage(qa, da)->desc.order == HQ_ORDER_KM;
  const int km_b = hq_qtensor_storage(qb, db)->desc.order == HQ_ORDER_KM;
  a->k_outer = (which != LIN_FPROP) != km_a;
  b->k_outer = (which == LIN_WGRAD) != km_b;
  return 0;
}

static const char *type_name(cudaDataType t) {
  switch (t) {
  case CUDA_R_8F_E4M3: return "e4m3";
  case CUDA_R_8F_E5M2: return "e5m2";
  case CUDA_R_16BF: return "bf16";
  default: return "f32";
  }
}

/* One layer of `hq train` (tokens T, in -> out features) and one recipe's formats (spec_f: input,
   spec_w: weight, spec_b: output gradient): per GEMM a direct cuBLASLt call on the bytes of hq's storages
   (D f32, as the trainer's) and hq's linear-layer call against it, interleaved; for a mixed FP8
   pair also the direct call with A and B swapped (the transposed product, same work), which
   says whether cuBLASLt's kernel for the pair depends on the operand order. */
static void trainer_layer(bench *B, cublasLtHandle_t h, void *ws, size_t ws_bytes, int64_t T,
                          int64_t in, int64_t out, const char *label, const char *spec_f,
                          const char *spec_w, const char *spec_b, const hq_tensor *x,
                          const hq_tensor *w, const hq_tensor *dy, void *d) {
  static const char *gname[] = {"fprop", "dgrad", "wgrad"};
  char note[320] = "";
  hq_qtensor *qx = quantize_both(B, spec_f, x, note, sizeof note);
  hq_qtensor *qw = qx ? quantize_both(B, spec_w, w, note, sizeof note) : NULL;
  hq_qtensor *qdy = qw ? quantize_both(B, spec_b, dy, note, sizeof note) : NULL;
  /* a stock module not installed skips the rows (row_failed) */
  const int missing = !qdy && bench_spec_missing(B->set, !qx ? spec_f : !qw ? spec_w : spec_b);
  for (int g = 0; g < 3; g++) {
    const int64_t m = g == LIN_FPROP ? out : in, n = g == LIN_WGRAD ? out : T;
    const int64_t k = g == LIN_FPROP ? in : g == LIN_DGRAD ? out : T;
    if (B->nlabels_t + 3 > MAX_ROWS) break;
    char *kd = B->labels_t[B->nlabels_t++], *kh = B->labels_t[B->nlabels_t++];
    char *ks = B->labels_t[B->nlabels_t++];
    row *rd = add_row(B, m, n, k, kd), *rh = add_row(B, m, n, k, kh);
    if (!rd || !rh) break;
    rd->path = "direct";
    snprintf(kh, 120, "hq %s %s, D f32", label, gname[g]);
    snprintf(kd, 120, "cuBLASLt %s %s, D f32 (direct)", label, gname[g]);
    if (!qdy) {
      snprintf(rh->note, sizeof rh->note, "%s", note);
      rh->missing = missing;
      continue;
    }
    char err[256] = "";
    dop da, db;
    direct x1, x2;
    memset(&x1, 0, sizeof x1);
    memset(&x2, 0, sizeof x2);
    int ok = !lin_dops(g, qx, qw, qdy, &da, &db, err, sizeof err);
    if (ok) {
      snprintf(kd, 120, "cuBLASLt %s x %s %s, D f32 (direct)", type_name(da.type),
               type_name(db.type), gname[g]);
      ok = !direct_prepare(h, ws_bytes, &da, &db, m, n, k, d, CUDA_R_32F, 0, &x1, err,
                           sizeof err) &&
           !direct_time(h, &x1, ws, ws_bytes, B->timer, B->iters, B->batch, &rd->ms, err,
                        sizeof err);
    }
    if (!ok) snprintf(rd->note, sizeof rd->note, "%s", err);
    hq_tensor dt = hq_tensor_2d(d, HQ_F32, B->device, n, m);
    hq_gemm_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    lin_call c = {B->ctx, g, qx, qw, qdy, &dt, &info};
    const bench_timed f = {lin_run, &c};
    direct_pair pair = {h, &x1, ws, ws_bytes, CUBLAS_STATUS_SUCCESS};
    const bench_timed pb = {direct_pair_run, &pair};
    double ms = NAN, base_ms = NAN;
    if (bench_time_calls(B->timer, B->iters, 3, B->batch, &f, &ms, ok ? &pb : NULL, &base_ms)) {
      snprintf(rh->note, sizeof rh->note, "%s", hq_last_error());
    } else {
      rh->ms = ms;
      rh->path = hq_gemm_path_name(info.path);
      if (info.reason[0]) snprintf(rh->note, sizeof rh->note, "%s", info.reason);
      if (ok) {
        rh->base = "direct (same pair)";
        rh->base_ms = base_ms;
        rh->target = 98.0;
      }
    }
    /* the mixed pair the other way round: D^T = op(B)^T op(A), n x m */
    if (ok && da.type != db.type && da.type != CUDA_R_16BF && da.type != CUDA_R_32F) {
      row *rs = add_row(B, n, m, k, ks);
      if (!rs) break;
      rs->path = "direct";
      snprintf(ks, 120, "cuBLASLt %s x %s %s swapped, D f32 (direct)", type_name(db.type),
               type_name(da.type), gname[g]);
      if (!direct_prepare(h, ws_bytes, &db, &da, n, m, k, d, CUDA_R_32F, 0, &x2, err,
                          sizeof err) &&
          !direct_time(h, &x2, ws, ws_bytes, B->timer, B->iters, B->batch, &rs->ms, err,
                       sizeof err)) {
        rs->base = "the unswapped direct call";
        rs->base_ms = rd->ms;
      } else {
        snprintf(rs->note, sizeof rs->note, "%s", err);
      }
    }
    direct_free(&x1);
    direct_free(&x2);
  }
  hq_qtensor_free(qx);
  hq_qtensor_free(qw);
  hq_qtensor_free(qdy);
}

/* The GEMMs of `hq train --preset large` (32768 tokens; the 4096 x 4096 hidden layers, and the
   lm_head 4096 -> 128 that the hybrid recipes keep in high precision, as F32 identity), each
   recipe pair of those runs: BF16 (high_precision.ini), E4M3 x E4M3 (fp8_current.ini), E4M3
   forward with E5M2 gradients (fp8_current_hybrid.ini, fp8_delayed.ini), FP8 blocks
   (fp8_block.ini: 128x128 weights, 1x128 activations and gradients), and the lm_head in F32
   (the hybrids' identity with the trainer's F32 tensors). */
static int bench_cuda_trainer(bench *B, cublasLtHandle_t h, void *ws, size_t ws_bytes) {
  const int64_t T = 32768, H = 4096, V = 128;
  hq_tensor x = hq_tensor_2d(NULL, HQ_F32, B->device, T, H);
  hq_tensor w = hq_tensor_2d(NULL, HQ_F32, B->device, H, H);
  hq_tensor dy = hq_tensor_2d(NULL, HQ_F32, B->device, T, H);
  float *hx = random_host(HQ_F32, T, H, 11), *hw = random_host(HQ_F32, H, H, 12);
  float *hd = random_host(HQ_F32, T, H, 13);
  void *d = NULL;
  int rc = 0;
  x.data = dalloc(B, (size_t)(T * H) * 4);
  w.data = dalloc(B, (size_t)(H * H) * 4);
  dy.data = dalloc(B, (size_t)(T * H) * 4);
  d = dalloc(B, (size_t)(T * H) * 4);
  if (!hx || !hw || !hd || !x.data || !w.data || !dy.data || !d ||
      hq_ctx_memcpy(B->ctx, x.data, B->device, hx, HQ_DEVICE_HOST, (size_t)(T * H) * 4) ||
      hq_ctx_memcpy(B->ctx, w.data, B->device, hw, HQ_DEVICE_HOST, (size_t)(H * H) * 4) ||
      hq_ctx_memcpy(B->ctx, dy.data, B->device, hd, HQ_DEVICE_HOST, (size_t)(T * H) * 4) ||
      hq_ctx_sync(B->ctx)) {
    fprintf(stderr, "hq bench --gemm: the trainer's GEMMs: inputs: %s\n", hq_last_error());
    rc = -1;
    goto out;
  }
  static const char *pairs[][4] = {
      {"bf16", "identity dtype=bf16", "identity dtype=bf16", "identity dtype=bf16"},
      {"fp8 e4m3", "fp8_tensor dtype=e4m3", "fp8_tensor dtype=e4m3", "fp8_tensor dtype=e4m3"},
      {"fp8 hybrid", "fp8_tensor dtype=e4m3", "fp8_tensor dtype=e4m3", "fp8_tensor dtype=e5m2"},
      /* fp8_block.ini: 1x128 activations and gradients, 128x128 weights */
      {"fp8 block", "fp8_block block=1d", "fp8_block block=2d", "fp8_block block=1d"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    trainer_layer(B, h, ws, ws_bytes, T, H, H, pairs[i][0], pairs[i][1], pairs[i][2],
                  pairs[i][3], &x, &w, &dy, d);
  /* the lm_head: the same buffers, read as [T, H] inputs, a [V, H] weight, a [T, V] gradient */
  {
    hq_tensor wl = hq_tensor_2d(w.data, HQ_F32, B->device, V, H);
    hq_tensor dyl = hq_tensor_2d(dy.data, HQ_F32, B->device, T, V);
    static const char *heads[][2] = {{"lm_head bf16", "identity dtype=bf16"},
                                     {"lm_head f32", "identity"},
                                     {"lm_head fp8 e4m3", "fp8_tensor dtype=e4m3"}};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++)
      trainer_layer(B, h, ws, ws_bytes, T, H, V, heads[i][0], heads[i][1], heads[i][1],
                    heads[i][1], &x, &wl, &dyl, d);
  }
out:
  if (x.data) hq_ctx_free(B->ctx, x.data);
  if (w.data) hq_ctx_free(B->ctx, w.data);
  if (dy.data) hq_ctx_free(B->ctx, dy.data);
  if (d) hq_ctx_free(B->ctx, d);
  free(hx);
  free(hw);
  free(hd);
  return rc;
}
#endif /* HQ_HAVE_CUDA */

/* The CPU bench ---------------------------------------------------------------------------------- */

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

/* One direct sgemm call as a timed call: column-major D (m x n) = A^T (A stored k x m) * B
   (k x n). */
typedef struct sgemm_call {
  sgemm_fn f;
  int m, n, k;
  const float *a, *b;
  float *d;
} sgemm_call;
static int sgemm_run(void *arg) {
  const sgemm_call *c = arg;
  c->f(102, 112, 111, c->m, c->n, c->k, 1.0f, c->a, c->k, c->b, c->k, 0.0f, c->d, c->m);
  return 0;
}

static int bench_cpu_shape(bench *B, int64_t m, int64_t n, int64_t k) {
  hq_tensor a = hq_tensor_2d(random_host(HQ_F32, m, k, 1), HQ_F32, HQ_DEVICE_HOST, m, k);
  hq_tensor b = hq_tensor_2d(random_host(HQ_F32, n, k, 2), HQ_F32, HQ_DEVICE_HOST, n, k);
  hq_tensor d = hq_tensor_2d(calloc((size_t)(m * n), 4), HQ_F32, HQ_DEVICE_HOST, n, m);
  int rc = 0;
  if (!a.data || !b.data || !d.data) {
    rc = cli_fail(1, CMD, "out of memory for %lldx%lldx%lld", (long long)m, (long long)n,
                  (long long)k);
    goto out;
  }
  row *base = add_row(B, m, n, k, "sgemm (direct)");
  base->path = "direct";
  /* the BLAS libhqcore was built with, when it is one with cblas_sgemm */
  sgemm_fn sgemm = (sgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm");
  if (!sgemm) {
    snprintf(base->note, sizeof base->note, "no cblas_sgemm in this process (libhqcore was built "
             "without OpenBLAS)");
  } else { /* one warm-up sample, as before */
    sgemm_call c = {sgemm, (int)m, (int)n, (int)k, a.data, b.data, d.data};
    const bench_timed f = {sgemm_run, &c};
    double ms = NAN;
    if (!bench_time_calls(B->timer, B->iters, 1, B->batch, &f, &ms, NULL, NULL)) base->ms = ms;
  }
  {
    row *r = add_row(B, m, n, k, "hq f32 tensors");
    hq_gemm_info info;
    double ms = NAN;
    if (time_hq(B->ctx, B->timer, hq_operand_hp(&a), hq_operand_hp(&b), &d, B->iters, B->batch,
                &info, &ms, NULL, NULL, NULL))
      snprintf(r->note, sizeof r->note, "%s", hq_last_error());
    else
      r->ms = ms, r->path = hq_gemm_path_name(info.path);
    r->base = "direct sgemm";
    r->base_ms = base->ms;
  }
  static const char *specs[][2] = {{"fp8_tensor", "hq fp8_tensor (raw dequantize + sgemm)"},
                                   {"mxfp8", "hq mxfp8 (raw dequantize + sgemm)"}};
  const int user = user_rows(B, m, n, k, &a, &b, &d, NULL, "direct sgemm", base->ms);
  for (int i = 0; !user && i < 2; i++) {
    row *r = add_row(B, m, n, k, specs[i][1]);
    hq_qtensor *qa = row_quantize(B, r, specs[i][0], &a);
    hq_qtensor *qb = qa ? row_quantize(B, r, specs[i][0], &b) : NULL;
    if (qa && qb) hq_row(B, r, qa, qb, &d, NULL, NULL);
    r->base = "direct sgemm";
    r->base_ms = base->ms;
    hq_qtensor_free(qa);
    hq_qtensor_free(qb);
  }
out:
  free(a.data);
  free(b.data);
  free(d.data);
  return rc;
}

/* Parse "MxNxK". */
static int parse_mnk(const char *s, int64_t v[3]) {
  char *end;
  for (int i = 0; i < 3; i++) {
    long long x = strtoll(s, &end, 10);
    if (end == s || x <= 0 || x > (1ll << 20)) return -1;
    v[i] = x;
    if (i < 2) {
      if (*end != 'x' && *end != 'X') return -1;
      s = end + 1;
    }
  }
  return *end ? -1 : 0;
}

typedef struct gemm_args {
  const char *device_s, *recipe, *role_s, *path_s, *d_s;
  cli_list formats;
  cli_list shape_s;
  int64_t iters, batch;
  int json, gemm, trainer;
  cli_list dirs;
  int device;
  int64_t shapes[MAX_SHAPES][3];
  int nshapes;
} gemm_args;

static int parse_args(int argc, char **argv, gemm_args *a) {
  const cli_option opts[] = {
      {.name = "--gemm", .kind = CLI_FLAG, .dest = &a->gemm},
      {.name = "--device", .kind = CLI_STR, .dest = &a->device_s},
      {.name = "--shape", .kind = CLI_LIST, .dest = &a->shape_s, .max = MAX_SHAPES},
      {.name = "--iters", .kind = CLI_INT, .dest = &a->iters, .min = 1, .max = 10000},
      {.name = "--batch", .kind = CLI_INT, .dest = &a->batch, .min = 1, .max = 1000},
      {.name = "--format", .kind = CLI_LIST, .dest = &a->formats, .max = MAX_USER},
      {.name = "--recipe", .kind = CLI_STR, .dest = &a->recipe},
      {.name = "--role", .kind = CLI_STR, .dest = &a->role_s},
      {.name = "--path", .kind = CLI_STR, .dest = &a->path_s},
      {.name = "--d", .kind = CLI_STR, .dest = &a->d_s},
      CLI_PLUGIN_DIRS(&a->dirs),
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
      {.name = "--trainer", .kind = CLI_FLAG, .dest = &a->trainer},
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  for (size_t i = 0; i < a->shape_s.n; i++)
    if (parse_mnk(a->shape_s.v[i], a->shapes[a->nshapes++]))
      return cli_fail(2, CMD, "--shape '%s' is not MxNxK with positive sizes", a->shape_s.v[i]);
  if (cli_device_arg(CMD, a->device_s, &a->device)) return 2;
  if (!!a->recipe != !!a->role_s) return cli_fail(2, CMD, "--recipe and --role go together");
  static char recipe_path[CLI_PATH_MAX];
  if (a->recipe) a->recipe = cli_recipe_path(CMD, a->recipe, recipe_path);
  if (a->path_s && strcmp(a->path_s, "auto") && strcmp(a->path_s, "fused") &&
      strcmp(a->path_s, "unfused") && strcmp(a->path_s, "emulated"))
    return cli_fail(2, CMD, "--path '%s' is not auto, fused, unfused or emulated", a->path_s);
  if (a->d_s && strcmp(a->d_s, "bf16") && strcmp(a->d_s, "f32"))
    return cli_fail(2, CMD, "--d '%s' is not bf16 or f32", a->d_s);
  if (a->d_s && !strcmp(a->d_s, "f32") && a->device < 0)
    return cli_fail(2, CMD, "--d f32 chooses a GPU's D: the CPU's D is always f32");
  if (a->d_s && a->trainer)
    return cli_fail(2, CMD, "--trainer times the trainer's GEMMs with their own D (f32): no --d");
  if (a->path_s && !a->formats.n && !a->recipe)
    return cli_fail(2, CMD, "--path chooses the path of --format and --recipe rows: give one");
  if (a->trainer && (a->shape_s.n || a->formats.n || a->recipe || a->device < 0))
    return cli_fail(2, CMD, "--trainer times the trainer's own GEMMs on a GPU: it takes no "
                    "--shape, --format or --recipe, and needs --device cuda");
  for (size_t i = 0; i < a->formats.n; i++) {
    char text[1024];
    if (bench_recipe_text(a->formats.v[i], "f", text, sizeof text, NULL, 0))
      return cli_fail(2, CMD, "--format '%s' is not 'PLUGIN[ key=value...]'", a->formats.v[i]);
  }
  if (!a->nshapes) {
    static const int64_t gpu_default[4][3] = {
        {8192, 8192, 8192}, {4096, 4096, 4096}, {16384, 4096, 1024}, {16384, 1024, 4096}};
    if (a->device >= 0) {
      memcpy(a->shapes, gpu_default, sizeof gpu_default);
      a->nshapes = 4;
    } else {
      a->shapes[0][0] = a->shapes[0][1] = a->shapes[0][2] = 1024;
      a->nshapes = 1;
    }
  }
  if (!a->iters) a->iters = a->device >= 0 ? 20 : 5;
  if (!a->batch) a->batch = a->device >= 0 ? 10 : 1;
  return CLI_RUN;
}

/* What the run measured beyond the rows: the device and the host dispatch overheads. */
typedef struct gemm_run {
  char devname[256];
  int arch;
  dispatch_res dres[2];
  int ndres;
} gemm_run;

/* Every shape on the CUDA device, then the dispatch overhead: 0; 1 when a shape failed (the rows
   measured are reported); -1 when the device could not be set up (nothing to report). A message
   is printed for either failure. */
static int run_cuda(bench *B, const gemm_args *a, gemm_run *g) {
#ifdef HQ_HAVE_CUDA
  char err[256];
  if (hq_device_info(B->device, g->devname, sizeof g->devname, &g->arch))
    return cli_fail(-1, CMD, "%s", hq_last_error());
  if (lt_load(err, sizeof err)) return cli_fail(-1, CMD, "%s", err);
  cublasLtHandle_t h = NULL;
  void *ws = NULL;
  const size_t ws_bytes = (size_t)32 << 20; /* as hq's runner */
  if (lt.cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS || cudaMalloc(&ws, ws_bytes) != cudaSuccess)
    return cli_fail(-1, CMD, "cuBLASLt handle or workspace on device %d", B->device);
  int status = 0;
  for (int s = 0; s < a->nshapes && !a->trainer && !status; s++)
    if (bench_cuda_shape(B, a->shapes[s][0], a->shapes[s][1], a->shapes[s][2], h, ws, ws_bytes))
      status = 1;
  /* the trainer's GEMMs: with the default shapes, or alone with --trainer */
  const int trainer = a->trainer || (!a->shape_s.n && !a->formats.n && !a->recipe);
  if (!status && trainer && bench_cuda_trainer(B, h, ws, ws_bytes)) status = 1;
  if (!status && !a->trainer) bench_dispatch(B, h, ws, ws_bytes, g->dres, &g->ndres);
  cudaFree(ws);
  lt.cublasLtDestroy(h);
  return status;
#else
  (void)B, (void)a, (void)g;
  return cli_fail(-1, CMD, "this hq was built without CUDA");
#endif
}

static void report_json(const bench *B, const gemm_run *g) {
  json j;
  json_begin(&j, stdout);
  json_obj(&j);
  json_kstr(&j, "device", B->device >= 0 ? g->devname : "cpu");
  if (B->device >= 0) json_kint(&j, "arch", g->arch);
  json_kint(&j, "iters", B->iters);
  json_kint(&j, "batch", B->batch);
  json_kstr(&j, "d_dtype", B->device >= 0 && !B->d_f32 ? "bf16" : "f32");
  json_key(&j, "results");
  json_arr(&j);
  for (int i = 0; i < B->nrows; i++) json_row(&j, &B->rows[i]);
  json_close_arr(&j);
  if (g->ndres) {
    json_key(&j, "dispatch");
    json_arr(&j);
    for (int i = 0; i < g->ndres; i++) {
      const dispatch_res *r = &g->dres[i];
      json_obj(&j);
      json_kstr(&j, "kind", r->kind);
      json_kint(&j, "m_n_k", r->mnk);
      json_knum(&j, "hq_gemm_plan_us", r->plan_us);
      json_knum(&j, "hq_gemm_host_us", r->hq_us);
      json_knum(&j, "cublaslt_host_us", r->direct_us);
      json_knum(&j, "overhead_us", r->hq_us - r->direct_us);
      json_knum(&j, "target_us", 2.0);
      if (r->note[0]) json_kstr(&j, "note", r->note);
      json_close_obj(&j);
    }
    json_close_arr(&j);
  }
  json_close_obj(&j);
  json_end(&j);
}

static void report_text(const bench *B, const gemm_run *g) {
  const int gpu = B->device >= 0;
  if (gpu)
    printf("hq bench --gemm: %s (sm_%d), D %s, median of %d samples of %d call%s (CUDA "
           "events)\n", g->devname, g->arch, B->d_f32 ? "f32" : "bf16", B->iters, B->batch,
           B->batch == 1 ? "" : "s back to back");
  else
    printf("hq bench --gemm: cpu (the BLAS libhqcore uses), D f32, median of %d samples of %d "
           "call%s\n", B->iters, B->batch, B->batch == 1 ? "" : "s");
  print_header(gpu);
  for (int i = 0; i < B->nrows; i++) {
    const row *r = &B->rows[i], *p = i ? &B->rows[i - 1] : NULL;
    print_row(r, !p || r->m != p->m || r->n != p->n || r->k != p->k, gpu);
  }
  for (int i = 0; i < g->ndres; i++) {
    const dispatch_res *r = &g->dres[i];
    if (isnan(r->hq_us)) {
      printf("host dispatch, %s %lld^3: not measured (%s)\n", r->kind, (long long)r->mnk,
             r->note);
      continue;
    }
    double over = r->hq_us - r->direct_us;
    printf("host dispatch, %s %lld^3: hq_gemm_plan %.2f us/call; hq_gemm %.2f us/call vs "
           "cublasLtMatmul %.2f us/call: overhead %.2f us (target < 2 us: %s)\n",
           r->kind, (long long)r->mnk, r->plan_us, r->hq_us, r->direct_us, over,
           over < 2.0 ? "met" : "MISSED");
  }
}

/* The user's rows of B: labels, and the quantizer of --recipe/--role (the rowwise direction,
   which the TN product reads); 0, or 1 after the message. */
static int user_setup(bench *B, const gemm_args *a) {
  B->user_args = (hq_gemm_args)HQ_GEMM_ARGS_INIT;
  if (a->path_s && !strcmp(a->path_s, "fused")) B->user_args.flags = HQ_GEMM_FUSED_ALWAYS;
  if (a->path_s && !strcmp(a->path_s, "unfused")) B->user_args.flags = HQ_GEMM_NO_FUSED;
  if (a->path_s && !strcmp(a->path_s, "emulated")) B->user_args.flags = HQ_GEMM_FORCE_EMULATED;
  B->specs = (const char *const *)a->formats.v;
  B->nspecs = a->formats.n;
  for (size_t i = 0; i < a->formats.n; i++) {
    char text[1024], label[256];
    bench_recipe_text(a->formats.v[i], "f", text, sizeof text, label, sizeof label);
    snprintf(B->labels[i], sizeof B->labels[i], "hq %s", label);
  }
  if (!a->recipe) return 0;
  snprintf(B->labels[a->formats.n], sizeof B->labels[0], "hq %s %s", a->recipe, a->role_s);
  const hq_recipe_opts ropts = cli_recipe_opts(&a->dirs);
  char rbuf[512];
  hq_role role;
  if (hq_role_parse(a->role_s, rbuf, sizeof rbuf, &role) ||
      hq_recipe_load(a->recipe, &ropts, &B->role_r))
    return cli_fail(1, CMD, "%s", hq_last_error());
  if (hq_recipe_error_count(B->role_r))
    return cli_fail(1, CMD, "%s", hq_recipe_error(B->role_r, 0));
  if (hq_state_create(B->role_r, B->ctx, &B->role_st) ||
      hq_quantizer_create_ex(B->role_r, &role, B->role_st, &B->role_q) ||
      hq_quantizer_set_usage(B->role_q, HQ_ROWWISE))
    return cli_fail(1, CMD, "%s %s: %s", a->recipe, a->role_s, hq_last_error());
  return 0;
}

int hq_bench_gemm(int argc, char **argv) {
  gemm_args a = {.device_s = "cpu"};
  int status = parse_args(argc, argv, &a);
  if (status != CLI_RUN) return status;
  bench B;
  memset(&B, 0, sizeof B);
  B.device = a.device;
  B.d_f32 = a.d_s && !strcmp(a.d_s, "f32");
  B.iters = (int)a.iters;
  B.batch = (int)a.batch;
  char err[256];
  B.timer = bench_timer_create(a.device, err, sizeof err);
  if (!B.timer) return cli_fail(1, CMD, "%s", err);
  hq_ctx_desc desc = {sizeof desc, a.device, NULL, NULL, NULL, NULL, 1};
  if (hq_ctx_create(&desc, &B.ctx) || hq_plugins_open(a.dirs.v, a.dirs.n, 0, &B.set)) {
    hq_ctx_destroy(B.ctx);
    bench_timer_destroy(B.timer);
    return cli_fail(1, CMD, "%s", hq_last_error());
  }
  gemm_run g = {.devname = "cpu"};
  status = user_setup(&B, &a) ? -1 : 0;
  if (status == 0 && a.device >= 0) {
    status = run_cuda(&B, &a, &g);
  } else if (status == 0) {
    for (int s = 0; s < a.nshapes && !status; s++)
      if (bench_cpu_shape(&B, a.shapes[s][0], a.shapes[s][1], a.shapes[s][2])) status = 1;
  }
  if (status >= 0 && a.json) report_json(&B, &g);
  else if (status >= 0) report_text(&B, &g);
  else status = 1;
  int failed = 0;
  for (int i = 0; i < B.nrows; i++) failed += row_failed(&B.rows[i]);
  if (failed && status != 1)
    status = cli_fail(1, CMD, "%d row%s failed (see the table)", failed, failed == 1 ? "" : "s");
  hq_quantizer_free(B.role_q);
  hq_state_free(B.role_st);
  hq_recipe_free(B.role_r);
  hq_ctx_destroy(B.ctx);
  bench_timer_destroy(B.timer);
  hq_plugins_close(B.set);
  return status;
}
