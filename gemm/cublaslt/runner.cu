/*
** runner.cu -- the cuBLASLt runner: hqi_lt_matmul(), offered to format plugins and GEMM
** providers as hq_host_api.lt_matmul (the cublaslt provider's native GEMMs and the emulated
** provider's BF16 / F32 GEMMs run through it).
**
** One call is one cublasLtMatmul on call->device (current during the call) and call->stream,
**     D = alpha * f0 * f1 * op(A) * op(B) + beta * D  (+ bias[i] on every column),
** column-major as in cuBLASLt, with FP32 accumulation. What the runner keeps:
**
**   - One cublasLtHandle per device, created on first use (under the mutex below) and destroyed
**     at exit (or when libhqcore is unloaded).
**   - The workspace (32 MiB: what cuBLASLt's Hopper kernels use, all of it offered to the
**     heuristic; the alpha/beta slot below lies past it) is the calling context's
**     (hqi_call_workspace): allocated through its allocator at its first GEMM, on its stream,
**     freed by hq_ctx_destroy or hq_device_trim. Per context, not per device: two GEMMs running
**     concurrently on two contexts' streams never share scratch, and there is no limit on the
**     number of streams. A call without a context (a plugin's test harness), a stream being
**     captured into a CUDA graph before its context has a workspace, or an allocation that
**     failed runs with algorithms that need none (their plans are cached separately). As with
**     any per-stream workspace (cuBLAS's, PyTorch's), a CUDA graph captured on a context's stream
**     uses that context's workspace when replayed: do not replay it concurrently with other
**     GEMMs of that context.
**   - A plan cache: everything that defines a matmul descriptor, the three matrix layouts and the
**     heuristic's choice (dtypes, trans, rows / cols / ld of A, B and D, m, n, k, scale modes,
**     bias and its dtype, D dtype, fast accumulation, pointer mode, the pointers' alignment, the
**     workspace available, the device) is the key; the value is the algorithm cuBLASLt's
**     heuristic chose, or the status with which it found none (a refused problem is not asked
**     again). The heuristic runs once per distinct problem. The cache is a fixed table of
**     HQ_LT_PLANS entries; when it is full the least recently used entry is replaced. The
**     algorithm is settled at the key's first call that runs (a query does not): the
**     heuristic's first answer or, with HQ_GEMM_AUTOTUNE=1, the fastest of its first
**     HQ_LT_TUNE_CANDIDATES answers timed on that call (settle(); docs/gemm.md says when and
**     why), fixed for the plan's life. The
**     descriptors themselves are initialised on the stack for every call (cublasLt*Init, no
**     allocation, a fraction of a microsecond): the per-call pointers (scales, bias) are
**     attributes of the matmul descriptor, and a descriptor shared between threads would have
**     them overwritten under another thread's call.
**   - alpha_factor: when a call gives per-tensor factors (device FP32 values: the NVFP4 global
**     decode scales, the emulated path's FP8 scale_inv), alpha * f0 * f1 is computed on the
**     device by a one-thread kernel, together with beta, into the bytes past the stream's
**     workspace (only that stream's work, in order, touches them: a matmul has read its alpha
**     before the next call's kernel writes it; a stream without a workspace gets 8 bytes of
**     stream-ordered call memory instead), and the matmul reads both with
**     CUBLASLT_POINTER_MODE_DEVICE. Without factors alpha and beta are host values.
**   - alpha_device (2.3): the whole alpha already on the device (the emulated path's, folded by
**     the operands' raw dequantize kernels, HQ_CAP_DEQ_FACTOR); with beta 0 or 1 the matmul reads
**     beta from a device constant (kBetaConst) and no kernel runs before it, since a kernel
**     launched between the dequantizes and the matmul is a measurable share of a mid-sized
**     call; any other beta is written by the one-thread kernel as above.
**   - row_factor (2.6): factors per row of op(A) and per column of op(B) (the emulated path's
**     row-scaled NVFP4 operands, whose raw values without them are exact in BF16) multiply the
**     F32 product in the SPLIT epilogue kernel, before beta * D and the bias: such a call always
**     runs SPLIT, into an F32 temporary unless D is F32 and beta 0 (then in place).
**   - amax_d: max |D| from cuBLASLt's AMAX_D epilogue (not zeroed first: cuBLASLt documents the
**     value as set on completion, not maxed into; for a BF16 D rounded to BF16 by a one-thread
**     kernel, so that it is the largest stored |D|), in a DIRECT plan the
**     heuristic was asked for with the epilogue; where it has none for the problem (or the plan
**     is SPLIT, or cublasLtMatmul refuses the epilogue the heuristic offered: then that key's
**     calls run without it) *amax_done stays 0 and the caller reads D for it.
**   - What cuBLASLt refuses in the epilogue -- it takes a bias only of D's dtype for BF16 / F16 /
**     F32 inputs and only a BF16 bias for FP8 inputs, and F32 inputs only with an F32 D -- runs
**     as a matmul into an F32 D (the caller's D, or an F32 temporary when D is BF16) followed by
**     one kernel that adds beta * D and the bias in FP32 and rounds once (PLAN_SPLIT).
**
** Compute type CUBLAS_COMPUTE_32F; an F32 x F32 product uses CUBLAS_COMPUTE_32F_PEDANTIC, so
** that neither TF32 nor an emulation of FP32 through narrower types can be chosen. Every CUDA
** and cuBLASLt status is checked: failures are HQ_EDEVICE, a problem cuBLASLt has no algorithm
** for is HQ_ENOTSUP; messages name mm->what, m, n, k, the operand kinds and cuBLASLt's status.
*/
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "hq/hq.h"
#include "hq/numerics.h"
#include "hq/plugin.h"

#include "hqi_cuda.h"
#include "lt_names.h"

/* Feature levels of the cuBLASLt this file is compiled against. */
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
#define HQ_LT_SCALE_MODES 1 /* CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE, VEC16_UE4M3, VEC32_UE8M0 */
#else
#define HQ_LT_SCALE_MODES 0
#endif
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120900
#define HQ_LT_BLOCK_MODES 1 /* VEC128_32F, BLK128x128_32F (Hopper FP8 blocks) */
#else
#define HQ_LT_BLOCK_MODES 0
#endif
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120000
#define HQ_LT_AMAX_D 1 /* CUBLASLT_MATMUL_DESC_AMAX_D_POINTER */
#else
#define HQ_LT_AMAX_D 0
#endif
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12080
#define HQ_LT_FP4 1 /* CUDA_R_4F_E2M1 */
#else
#define HQ_LT_FP4 0
#endif

#define HQ_LT_MAX_DEVICES 64
#define HQ_LT_WORKSPACE ((size_t)32 << 20)    /* 32 MiB: what cuBLASLt's Hopper kernels use */
#define HQ_LT_PLANS 1024                      /* plan cache entries (LRU beyond) */
#define HQ_LT_BUCKETS 1024

namespace {

/* Whether an operand of mm has FP8 elements: only then does cuBLASLt's fast accumulation apply. */
bool any_fp8(const hq_lt_matmul *mm) {
  return hq_lt_is_fp8(mm->a.elem) || hq_lt_is_fp8(mm->b.elem);
}

// --- names for messages ------------------------------------------------------------------

/* The cuBLASLt data type of an operand element / output / bias dtype; 0 when unsupported. */
int cuda_type(int t, cudaDataType *out) {
  switch (t) {
  case HQ_E4M3: *out = CUDA_R_8F_E4M3; return 1;
  case HQ_E5M2: *out = CUDA_R_8F_E5M2; return 1;
#if HQ_LT_FP4
  case HQ_E2M1X2: *out = CUDA_R_4F_E2M1; return 1;
#endif
  case HQ_BF16: *out = CUDA_R_16BF; return 1;
  case HQ_F16: *out = CUDA_R_16F; return 1;
  case HQ_F32: *out = CUDA_R_32F; return 1;
  default: return 0;
  }
}

/* The cuBLASLt scale mode of an HQ_SCALE_* value (both have the same order, hq's shifted by one
   for "none"); 0 when this runner does not take it (HQ_SCALE_OUTER_VEC_F32: no hq format makes
   it) or this cuBLASLt has no such mode. */
#if HQ_LT_SCALE_MODES
int lt_scale_mode(uint32_t m, cublasLtMatmulMatrixScale_t *out) {
  switch (m) {
  case HQ_SCALE_TENSOR_F32: *out = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F; return 1;
  case HQ_SCALE_VEC16_UE4M3: *out = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3; return 1;
  case HQ_SCALE_VEC32_UE8M0: *out = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0; return 1;
#if HQ_LT_BLOCK_MODES
  case HQ_SCALE_VEC128_F32: *out = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; return 1;
  case HQ_SCALE_BLK128X128_F32: *out = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; return 1;
#endif
  default: return 0;
  }
}
#endif

/* Whether this build of the runner can express scale mode m at all. */
int scale_mode_known(uint32_t m) {
  if (m == HQ_SCALE_NONE || m == HQ_SCALE_TENSOR_F32) return 1;
#if HQ_LT_SCALE_MODES
  cublasLtMatmulMatrixScale_t s;
  return lt_scale_mode(m, &s);
#else
  return 0;
#endif
}

/* The largest power of two (<= 256) dividing the address: the alignment the heuristic may rely
   on. NULL (a query without data) counts as fully aligned. */
uint32_t align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  if (!a) return 256;
  uint32_t r = 1;
  while (r < 256 && !(a & r)) r <<= 1;
  return r;
}

// --- devices, handles and workspaces -------------------------------------------------------

struct dev_slot {
  int ready;
  cublasLtHandle_t lt;
};

/* What a call gets: the device's handle and its context's workspace. */
struct dev_use {
  cublasLtHandle_t lt;
  void *ws;             /* cuBLASLt workspace of the call's context, or NULL */
  size_t ws_bytes;
  float *ab;            /* the context's alpha/beta slot (in the workspace's tail), or NULL */
};

// --- the plan cache ----------------------------------------------------------------------

/* Everything that defines a plan. Filled after a memset, compared and hashed as bytes. */
struct plan_key {
  int32_t device;
  int32_t a_elem, a_trans, a_scale;
  int32_t b_elem, b_trans, b_scale;
  int32_t d_dtype, bias_dtype;     /* bias_dtype 0: no bias */
  int32_t fast_accum;              /* FP8 inputs only, else 0 */
  int32_t ptr_device;              /* 1: alpha and beta in device memory */
  int32_t accumulate_narrow;       /* beta != 0 into a D narrower than F32: SPLIT only */
  int32_t amax;                    /* the caller asks for max |D| (AMAX_D epilogue) */
  int32_t rowf;                    /* per-row / per-column factors (row_factor): SPLIT only */
  uint32_t align_a, align_b, align_d;
  uint32_t ws_bytes;               /* workspace offered to the heuristic */
  int64_t a_rows, a_cols, a_ld, b_rows, b_cols, b_ld;
  int64_t m, n, k, ldd;
};

/* How a plan produces D. DIRECT: one matmul, bias in cuBLASLt's BIAS epilogue. SPLIT, for what
   cuBLASLt refuses (it takes a bias only of D's dtype for BF16/F16/F32 inputs and only BF16 for
   FP8 inputs, and F32 inputs only with an F32 D): the matmul without the bias into an F32 D (the
   caller's D when it is F32, else an F32 temporary with beta = 0), then one kernel adds beta * D
   and the bias in FP32 and rounds once to D's dtype. */
#define PLAN_DIRECT 0
#define PLAN_SPLIT 1

/* Whether the call gives factors per row of op(A) or per column of op(B) (2.6 row_factor): they
   multiply the F32 product element by element, so such a call is SPLIT. */
static int has_rowf(const hq_lt_matmul *mm) { return mm->row_factor[0] || mm->row_factor[1]; }

/* Whether a SPLIT matmul writes an F32 temporary (contiguous, ld m) rather than the caller's D:
   for a narrower D, and for row factors with beta != 0 (the factors multiply the product, not
   the beta * D an F32 D would already hold); with beta 0 an F32 D takes the product and the
   epilogue scales it in place (no m x n temporary). */
static int split_to_temp(const hq_lt_matmul *mm) {
  return mm->d_dtype != HQ_F32 || (has_rowf(mm) && mm->beta != 0.0f);
}

struct plan {
  plan_key key;
  int next;                        /* bucket chain, -1 ends */
  uint64_t tick;                   /* last use, for LRU replacement */
  cublasStatus_t status;           /* SUCCESS: algo is valid; otherwise why there is none */
  int no_algo;                     /* the heuristic returned no algorithm (status SUCCESS) */
  int mode;                        /* PLAN_* */
  int amax_epi;                    /* DIRECT with cuBLASLt's AMAX_D epilogue */
  int amax_refused;                /* cublasLtMatmul refused the epilogue the heuristic offered:
                                      calls of this key run as if no amax was asked */
  int settled;                     /* algo is final: fixed by the key's first call that ran (the
                                      autotune's choice, or the heuristic's first answer) */
  cublasComputeType_t compute;
  cublasLtMatmulAlgo_t algo;
};

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
dev_slot g_dev[HQ_LT_MAX_DEVICES];
plan g_plans[HQ_LT_PLANS];
int g_bucket[HQ_LT_BUCKETS];
int g_nplans;
int g_inited;
uint64_t g_tick;

uint64_t key_hash(const plan_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* Free every handle (at exit, or when libhqcore is unloaded: atexit() in a shared object runs
   then). Errors are ignored: the CUDA runtime may already be going away. */
void lt_cleanup(void) {
  for (int d = 0; d < HQ_LT_MAX_DEVICES; d++) {
    dev_slot *s = &g_dev[d];
    if (!s->ready) continue;
    cublasLtDestroy(s->lt);
    s->ready = 0;
  }
  cudaGetLastError();
}

/* Under g_mu: the device's handle (created on first use). */
int device_get(int device, dev_use *u) {
  dev_slot *s = &g_dev[device];
  if (!g_inited) {
    for (int i = 0; i < HQ_LT_BUCKETS; i++) g_bucket[i] = -1;
    g_inited = 1;
  }
  if (!s->ready) {
    /* creating a handle is not stream work: let it happen even while this thread captures a
       CUDA graph */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cublasStatus_t st = cublasLtCreate(&s->lt);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (st != CUBLAS_STATUS_SUCCESS)
      return hqi_error(HQ_EDEVICE, "%s:%d: cublasLtCreate on device %d: %s", __FILE__, __LINE__,
                       device, cublasLtGetStatusString(st));
    static int registered;
    if (!registered) {
      atexit(lt_cleanup);
      registered = 1;
    }
    s->ready = 1;
  }
  u->lt = s->lt;
  return HQ_OK;
}

/* HQ_LT_AB_BYTES past the workspace cuBLASLt gets hold the context's alpha/beta pair: only work
   on that context's stream touches them, in stream order, so a matmul's alpha is never
   overwritten before the matmul has read it. They come on top of HQ_LT_WORKSPACE, so that the
   heuristic is offered the same workspace as a direct call with a 32 MiB workspace: offered a
   few bytes less, it may choose another algorithm for the same problem. */
#define HQ_LT_AB_BYTES 256
int workspace_get(const hq_call *call, dev_use *u) {
  void *p = NULL;
  int rc = hqi_call_workspace(call, HQ_LT_WORKSPACE + HQ_LT_AB_BYTES, &p);
  if (rc) return rc;
  u->ws = p;
  u->ws_bytes = p ? HQ_LT_WORKSPACE : 0;
  u->ab = p ? (float *)((char *)p + HQ_LT_WORKSPACE) : NULL;
  return HQ_OK;
}

/* Under g_mu: the plan of key k, or NULL. */
plan *plan_find(const plan_key *k, uint64_t h) {
  for (int i = g_bucket[h % HQ_LT_BUCKETS]; i >= 0; i = g_plans[i].next)
    if (!memcmp(&g_plans[i].key, k, sizeof *k)) {
      g_plans[i].tick = ++g_tick;
      return &g_plans[i];
    }
  return NULL;
}

/* Under g_mu: a slot for a new plan of key k (the least recently used one when full). */
plan *plan_insert(const plan_key *k, uint64_t h) {
  int slot;
  if (g_nplans < HQ_LT_PLANS) {
    slot = g_nplans++;
  } else {
    slot = 0;
    for (int i = 1; i < HQ_LT_PLANS; i++)
      if (g_plans[i].tick < g_plans[slot].tick) slot = i;
    int *pp = &g_bucket[key_hash(&g_plans[slot].key) % HQ_LT_BUCKETS];
    while (*pp != slot) pp = &g_plans[*pp].next;
    *pp = g_plans[slot].next;
  }
  plan *p = &g_plans[slot];
  memset(p, 0, sizeof *p);
  p->key = *k;
  p->tick = ++g_tick;
  p->next = g_bucket[h % HQ_LT_BUCKETS];
  g_bucket[h % HQ_LT_BUCKETS] = slot;
  return p;
}

// --- descriptors -------------------------------------------------------------------------

struct descs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

/* Initialise, on the stack, the matmul descriptor and the layouts of mm for a matmul whose D is
   of dtype d_dtype with leading dimension ldd, with the bias epilogue when with_bias. On
   failure *what names the step. */
cublasStatus_t descs_init(descs *ds, const hq_lt_matmul *mm, cublasComputeType_t compute,
                          int ptr_device, int with_bias, int d_dtype, int64_t ldd,
                          void *amax_d, const char **what) {
  cudaDataType ta = CUDA_R_32F, tb = CUDA_R_32F, td = CUDA_R_32F, tbias = CUDA_R_32F;
  cuda_type(mm->a.elem, &ta);
  cuda_type(mm->b.elem, &tb);
  cuda_type(d_dtype, &td);
  if (with_bias) cuda_type(mm->bias_dtype, &tbias);
  cublasStatus_t st;
#define LT_TRY(expr, name)                                                                    \
  do {                                                                                        \
    st = (expr);                                                                              \
    if (st != CUBLAS_STATUS_SUCCESS) {                                                        \
      *what = name;                                                                           \
      return st;                                                                              \
    }                                                                                         \
  } while (0)
#define LT_SET(attr, val)                                                                     \
  LT_TRY(cublasLtMatmulDescSetAttribute(&ds->op, attr, &(val), sizeof(val)), #attr)
  LT_TRY(cublasLtMatmulDescInit(&ds->op, compute, CUDA_R_32F), "cublasLtMatmulDescInit");
  cublasOperation_t opa = mm->a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = mm->b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_SET(CUBLASLT_MATMUL_DESC_TRANSA, opa);
  LT_SET(CUBLASLT_MATMUL_DESC_TRANSB, opb);
  if (ptr_device) {
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    LT_SET(CUBLASLT_MATMUL_DESC_POINTER_MODE, pm);
  }
  if (any_fp8(mm)) {
    int8_t fa = mm->fast_accum ? 1 : 0;
    LT_SET(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fa);
  }
  const hq_lt_operand *ops[2] = {&mm->a, &mm->b};
  for (int i = 0; i < 2; i++) {
    const hq_lt_operand *o = ops[i];
    if (o->scale_mode == HQ_SCALE_NONE) continue;
#if HQ_LT_SCALE_MODES
    cublasLtMatmulMatrixScale_t sm = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    lt_scale_mode(o->scale_mode, &sm);
    if (sm != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
      if (i == 0) LT_SET(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, sm);
      else LT_SET(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, sm);
    }
#endif
    const void *sp = o->scale;
    if (i == 0) LT_SET(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sp);
    else LT_SET(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sp);
  }
  if (with_bias) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    int32_t bt = (int32_t)tbias;
    const void *bp = mm->bias;
    LT_SET(CUBLASLT_MATMUL_DESC_EPILOGUE, ep);
    LT_SET(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt);
    LT_SET(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bp);
  }
#if HQ_LT_AMAX_D
  if (amax_d) LT_SET(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_d);
#else
  (void)amax_d;
#endif
  LT_TRY(cublasLtMatrixLayoutInit(&ds->a, ta, (uint64_t)mm->a.rows, (uint64_t)mm->a.cols,
                                  mm->a.ld), "layout of A");
  LT_TRY(cublasLtMatrixLayoutInit(&ds->b, tb, (uint64_t)mm->b.rows, (uint64_t)mm->b.cols,
                                  mm->b.ld), "layout of B");
  LT_TRY(cublasLtMatrixLayoutInit(&ds->d, td, (uint64_t)mm->m, (uint64_t)mm->n, ldd),
         "layout of D");
#undef LT_SET
#undef LT_TRY
  return CUBLAS_STATUS_SUCCESS;
}

/* The descriptors of plan mode `mode`: DIRECT as the caller asked (with the AMAX_D epilogue into
   amax_d when it is not NULL); SPLIT without the bias, into an F32 D (the caller's when F32, else
   a contiguous temporary), never with the epilogue. */
cublasStatus_t descs_for(descs *ds, const hq_lt_matmul *mm, int mode, cublasComputeType_t c,
                         int ptr_device, void *amax_d, const char **what) {
  if (mode == PLAN_DIRECT)
    return descs_init(ds, mm, c, ptr_device, mm->bias != NULL, mm->d_dtype, mm->ldd, amax_d,
                      what);
  return descs_init(ds, mm, c, ptr_device, 0, HQ_F32, split_to_temp(mm) ? mm->m : mm->ldd, NULL,
                    what);
}

/* "fp8_tensor e4m3 x e5m2, m=.. n=.. k=.. (A e4m3 T 256x128 ld 256 scale tensor_f32, B ...,
   D bf16, bias f32)" */
void describe(char *buf, size_t len, const hq_lt_matmul *mm) {
  char bias[32] = "";
  if (mm->bias) snprintf(bias, sizeof bias, ", bias %s", hq_lt_elem_name(mm->bias_dtype));
  snprintf(buf, len,
           "%s, m=%lld n=%lld k=%lld (A %s %s %lldx%lld ld %lld scale %s, B %s %s %lldx%lld ld "
           "%lld scale %s, D %s ld %lld%s%s)",
           mm->what ? mm->what : "GEMM", (long long)mm->m, (long long)mm->n, (long long)mm->k,
           hq_lt_elem_name(mm->a.elem), mm->a.trans ? "T" : "N", (long long)mm->a.rows,
           (long long)mm->a.cols, (long long)mm->a.ld, hq_lt_scale_name(mm->a.scale_mode),
           hq_lt_elem_name(mm->b.elem), mm->b.trans ? "T" : "N", (long long)mm->b.rows,
           (long long)mm->b.cols, (long long)mm->b.ld, hq_lt_scale_name(mm->b.scale_mode),
           hq_lt_elem_name(mm->d_dtype), (long long)mm->ldd, bias,
           any_fp8(mm) && mm->fast_accum ? ", fast accum" : "");
}

/* One heuristic query for up to `want` algorithms, best first, into res[0 .. *count). */
cublasStatus_t heuristic_n(cublasLtHandle_t lt, const hq_lt_matmul *mm, const plan_key *key,
                           int mode, cublasComputeType_t compute, int amax, int want,
                           cublasLtMatmulHeuristicResult_t *res, int *count) {
  descs ds;
  const char *what = "";
  *count = 0;
  /* the epilogue's pointer only has to be set for the question (the heuristic reads no data) */
  void *amax_d = amax ? (mm->amax_d ? (void *)mm->amax_d : (void *)(uintptr_t)256) : nullptr;
  cublasStatus_t st = descs_for(&ds, mm, mode, compute, key->ptr_device, amax_d, &what);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulPreferenceOpaque_t pref;
  uint64_t wsb = key->ws_bytes;
  uint32_t al[3] = {key->align_a, key->align_b, mode == PLAN_DIRECT ? key->align_d : 256u};
  if (mode == PLAN_SPLIT && !split_to_temp(mm)) al[2] = key->align_d;
  st = cublasLtMatmulPreferenceInit(&pref);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &wsb, sizeof wsb);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &al[0], sizeof al[0]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &al[1], sizeof al[1]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &al[2], sizeof al[2]);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &al[2], sizeof al[2]);
  /* FP32 accumulation throughout: a split-K reduction may only sum its partial results in the
     compute type. The in-place scheme sums them in C's type (BF16 for a BF16 D), which rounds
     every partial sum to 8 bits (measured on an H100: 3 BF16 ulps off an F64 reference). */
  uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &reductions, sizeof reductions);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  memset(res, 0, sizeof *res * (size_t)want);
  return cublasLtMatmulAlgoGetHeuristic(lt, (cublasLtMatmulDesc_t)&ds.op,
                                        (cublasLtMatrixLayout_t)&ds.a,
                                        (cublasLtMatrixLayout_t)&ds.b,
                                        (cublasLtMatrixLayout_t)&ds.d,
                                        (cublasLtMatrixLayout_t)&ds.d, &pref, want, res, count);
}

/* The heuristic's first answer; CUBLAS_STATUS_SUCCESS with *algo, or why not (*no_algo: it
   returned none). */
cublasStatus_t heuristic(cublasLtHandle_t lt, const hq_lt_matmul *mm, const plan_key *key,
                         int mode, cublasComputeType_t compute, int amax,
                         cublasLtMatmulAlgo_t *algo, int *no_algo) {
  cublasLtMatmulHeuristicResult_t res;
  int count = 0;
  *no_algo = 0;
  cublasStatus_t st = heuristic_n(lt, mm, key, mode, compute, amax, 1, &res, &count);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (count < 1) {
    *no_algo = 1;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (res.state != CUBLAS_STATUS_SUCCESS) return res.state;
  *algo = res.algo;
  return CUBLAS_STATUS_SUCCESS;
}

int unsupported(cublasStatus_t st) {
  return st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
         st == CUBLAS_STATUS_ARCH_MISMATCH;
}

/* Under g_mu: choose the plan of p->key (the heuristic runs here, once per key). */
void plan_choose(plan *p, cublasLtHandle_t lt, const hq_lt_matmul *mm) {
  cublasComputeType_t computes[2] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F};
  int ncomputes = 1;
  if (mm->a.elem == HQ_F32 && mm->b.elem == HQ_F32) {
    /* F32 x F32 must really be FP32: PEDANTIC rules out TF32 and any emulation of FP32 through
       narrower types. Where cuBLASLt has no PEDANTIC kernel for a problem, 32F, which in
       cuBLASLt is FP32 as well (TF32 only comes with CUBLAS_COMPUTE_32F_FAST_TF32). */
    computes[0] = CUBLAS_COMPUTE_32F_PEDANTIC;
    ncomputes = 2;
  }
  const int split_helps = mm->bias != NULL || mm->d_dtype != HQ_F32 || p->key.rowf;
  /* beta * D into a BF16 D: cuBLASLt's own epilogue rounded alpha * acc to BF16 before adding
     beta * C on an H100 (3 BF16 ulps off an F64 reference when the two cancel): the SPLIT plan
     adds them in FP32 and rounds once */
  const int first = p->key.accumulate_narrow || p->key.rowf ? PLAN_SPLIT : PLAN_DIRECT;
  p->status = CUBLAS_STATUS_NOT_SUPPORTED;
  /* max |D| asked for: DIRECT with the AMAX_D epilogue where cuBLASLt has it for the problem
     (the core otherwise reads D once more after the matmul) */
  if (p->key.amax && first == PLAN_DIRECT)
    for (int c = 0; c < ncomputes; c++) {
      int no_algo = 0;
      if (heuristic(lt, mm, &p->key, PLAN_DIRECT, computes[c], 1, &p->algo, &no_algo) ==
          CUBLAS_STATUS_SUCCESS) {
        p->status = CUBLAS_STATUS_SUCCESS;
        p->mode = PLAN_DIRECT;
        p->compute = computes[c];
        p->amax_epi = 1;
        return;
      }
    }
  for (int mode = first; mode <= (split_helps ? PLAN_SPLIT : PLAN_DIRECT); mode++)
    for (int c = 0; c < ncomputes; c++) {
      int no_algo = 0;
      cublasStatus_t st = heuristic(lt, mm, &p->key, mode, computes[c], 0, &p->algo, &no_algo);
      if (st == CUBLAS_STATUS_SUCCESS) {
        p->status = st;
        p->no_algo = 0;
        p->mode = mode;
        p->compute = computes[c];
        return;
      }
      if (mode == first && c == 0) { /* report why the problem as asked has none */
        p->status = st;
        p->no_algo = no_algo;
      }
      if (!unsupported(st)) return; /* a real failure: do not try further */
    }
}

// --- kernels -----------------------------------------------------------------------------

/* The betas a matmul with a device alpha (hq_lt_matmul.alpha_device) reads without a kernel of
   its own: 0 and 1, in every device's copy of this variable. */
__device__ const float kBetaConst[2] = {0.0f, 1.0f};

/* Device d's address of kBetaConst, looked up once (a race repeats the lookup harmlessly); NULL
   when the lookup fails (the caller then writes beta with alpha_beta_kernel). */
const float *beta_consts(int device) {
  static std::atomic<const float *> addr[HQ_LT_MAX_DEVICES];
  const float *p = addr[device].load(std::memory_order_relaxed);
  if (p) return p;
  void *v = nullptr;
  if (cudaGetSymbolAddress(&v, kBetaConst) != cudaSuccess || !v) {
    cudaGetLastError();
    return nullptr;
  }
  addr[device].store(static_cast<const float *>(v), std::memory_order_relaxed);
  return static_cast<const float *>(v);
}

/* *a = its BF16 rounding (round to nearest even): cuBLASLt's amax of a BF16 D made max |D| of the
   stored values. Rounding is monotonic and symmetric, so the rounding of the largest |value| is
   the largest |rounded value|, whether cuBLASLt took its amax before the rounding or after it. */
__global__ void amax_bf16_kernel(float *a) { *a = hq_bf16_to_f32(hq_f32_to_bf16(*a)); }

/* out[0] = alpha * f0 * f1 (an absent factor is 1), out[1] = beta. */
__global__ void alpha_beta_kernel(float *out, float alpha, float beta, const float *f0,
                                  const float *f1) {
  float a = alpha;
  if (f0) a = a * *f0;
  if (f1) a = a * *f1;
  out[0] = a;
  out[1] = beta;
}

/* D (column-major m x n, leading dimension ldd, dtype dt) = v + bias[i], in FP32, rounded once
   to dt, where v is
     t == NULL, in_place == 0:  beta * D            (k = 0: nothing to multiply)
     t == NULL, in_place == 1:  D * ra[i] * rb[j]   (D already holds alpha*op(A)op(B) + beta*D;
                                                     row factors only with beta 0)
     t != NULL:                 t[j*m+i] * ra[i] * rb[j] + beta * D (t: the F32 product,
                                contiguous; ra, rb: the row factors, each skipped when NULL)
   beta == 0 never reads D (which may hold NaN). */
/* One element of finish_kernel: row i, at D's offset `at`, tv the F32 product's value there. */
__device__ __forceinline__ float finish_elem(const void *d, int dt, int64_t at, int64_t i,
                                             int64_t j, float beta, float tv, int in_place,
                                             const void *bias, int bt, const float *ra,
                                             const float *rb) {
  float v = in_place ? hq_load_hp(d, at, dt) : tv;
  if (ra) v = v * ra[i];
  if (rb) v = v * rb[j];
  if (!in_place && beta != 0.0f) v = v + beta * hq_load_hp(d, at, dt);
  if (bias) v = v + hq_load_hp(bias, i, bt);
  return v;
}

__global__ void finish_kernel(void *d, int dt, int64_t m, int64_t n, int64_t ldd, float beta,
                              const float *t, int in_place, const void *bias, int bt,
                              const float *ra, const float *rb) {
  int64_t total = m * n;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = e % m, j = e / m, at = j * ldd + i;
    hq_store_hp(d, at, dt,
                finish_elem(d, dt, at, i, j, beta, t ? t[e] : 0.0f, in_place, bias, bt, ra, rb));
  }
}

/* finish_kernel four rows of a column at a time, for the common shape (m and ldd multiples of
   4, every pointer aligned for it, D F32 or BF16): one 16-byte load of t and one 16- or 8-byte
   store per thread, a division per four elements; each element is finish_elem, as there. */
template <int DT>
__global__ void finish4_kernel(void *d, int64_t m, int64_t n, int64_t ldd, float beta,
                               const float *t, int in_place, const void *bias, int bt,
                               const float *ra, const float *rb) {
  const int64_t m4 = m / 4, total4 = m4 * n;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total4;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = e / m4, i = (e - j * m4) * 4, at = j * ldd + i;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t && !in_place) {
      const float4 q = reinterpret_cast<const float4 *>(t)[e];
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    }
    for (int k = 0; k < 4; k++)
      v[k] = finish_elem(d, DT, at + k, i + k, j, beta, v[k], in_place, bias, bt, ra, rb);
    if (DT == HQ_F32) {
      *reinterpret_cast<float4 *>((float *)d + at) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      uint2 w;
      w.x = hq_pack2_hp16(v[0], v[1], DT);
      w.y = hq_pack2_hp16(v[2], v[3], DT);
      *reinterpret_cast<uint2 *>((uint16_t *)d + at) = w;
    }
  }
}

static int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

int launch_finish(const hq_call *call, const hq_lt_matmul *mm, const float *t, int in_place) {
  int64_t total = mm->m * mm->n;
  const int dt = mm->d_dtype;
  const size_t de = dt == HQ_F32 ? 4 : 2, be = mm->bias_dtype == HQ_F32 ? 4 : 2;
  const int vec = (dt == HQ_F32 || dt == HQ_BF16) && mm->m % 4 == 0 && mm->ldd % 4 == 0 &&
                  aligned(mm->d, 4 * de) && (!t || aligned(t, 16)) &&
                  (!mm->bias || aligned(mm->bias, 4 * be));
  if (vec) total /= 4;
  int64_t blocks = (total + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  cudaStream_t s = (cudaStream_t)call->stream;
  /* the factors scale a product; with none (k = 0: beta * D alone) they are not read, so that a
     NaN or Inf factor cannot turn its zero into NaN */
  const int product = t || in_place;
  const float *ra = product ? mm->row_factor[0] : nullptr, *rb = product ? mm->row_factor[1]
                                                                         : nullptr;
  if (vec && dt == HQ_F32)
    finish4_kernel<HQ_F32><<<(unsigned)blocks, 256, 0, s>>>(
        mm->d, mm->m, mm->n, mm->ldd, mm->beta, t, in_place, mm->bias, mm->bias_dtype, ra, rb);
  else if (vec)
    finish4_kernel<HQ_BF16><<<(unsigned)blocks, 256, 0, s>>>(
        mm->d, mm->m, mm->n, mm->ldd, mm->beta, t, in_place, mm->bias, mm->bias_dtype, ra, rb);
  else
    finish_kernel<<<(unsigned)blocks, 256, 0, s>>>(mm->d, mm->d_dtype, mm->m, mm->n, mm->ldd,
                                                   mm->beta, t, in_place, mm->bias,
                                                   mm->bias_dtype, ra, rb);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    char desc[512];
    describe(desc, sizeof desc, mm);
    return hqi_error(HQ_EDEVICE, "%s:%d: %s: epilogue kernel: %s", __FILE__, __LINE__, desc,
                     cudaGetErrorString(e));
  }
  return HQ_OK;
}

/* Stream-ordered device memory for one call: the context's allocator when the call comes from
   the core (plugins' calls do), else the device's default pool. */
void *call_alloc(const hq_call *call, size_t bytes) {
  if (call->host && call->core_private && call->host->alloc)
    return call->host->alloc(call, bytes); /* records its own message on failure */
  void *p = NULL;
  if (hqi_cuda_malloc(call->device, bytes, call->stream, &p)) return NULL;
  return p;
}
void call_free(const hq_call *call, void *p) {
  if (!p) return;
  if (call->host && call->core_private && call->host->free) call->host->free(call, p);
  else hqi_cuda_free(call->device, p, call->stream);
}

/* Argument checks that do not need cuBLASLt. */
int check_operand(const hq_lt_matmul *mm, const hq_lt_operand *o, char name, int64_t op_rows,
                  int64_t op_cols) {
  const char *what = mm->what ? mm->what : "GEMM";
  cudaDataType t;
  if (!cuda_type(o->elem, &t))
    return hqi_error(o->elem == HQ_E2M1X2 ? HQ_ENOTSUP : HQ_EINVAL,
                     "%s: operand %c has element dtype %d, which the cuBLASLt runner does not "
                     "take%s", what, name, (int)o->elem,
                     o->elem == HQ_E2M1X2 ? " (hq was built with a CUDA older than 12.8)" : "");
  int64_t r = o->trans ? op_cols : op_rows, c = o->trans ? op_rows : op_cols;
  if (o->rows != r || o->cols != c)
    return hqi_error(HQ_ESHAPE, "%s: operand %c is stored %lld x %lld (trans %s), but op(%c) "
                     "must be %lld x %lld for m=%lld n=%lld k=%lld", what, name,
                     (long long)o->rows, (long long)o->cols, o->trans ? "T" : "N", name,
                     (long long)op_rows, (long long)op_cols, (long long)mm->m, (long long)mm->n,
                     (long long)mm->k);
  if (o->ld < (o->rows > 1 ? o->rows : 1))
    return hqi_error(HQ_ESHAPE, "%s: operand %c has ld %lld < its %lld rows", what, name,
                     (long long)o->ld, (long long)o->rows);
  if (!scale_mode_known(o->scale_mode))
    return hqi_error(HQ_ENOTSUP, "%s: operand %c's scale mode %s (%u) is not available in the "
                     "cuBLASLt hq was built with (%d; block FP32 scales need 12.9, VEC16/VEC32 "
                     "12.8)", what, name, hq_lt_scale_name(o->scale_mode), o->scale_mode,
                     (int)CUBLAS_VERSION);
  if (o->scale_mode != HQ_SCALE_NONE && !o->scale && o->data)
    return hqi_error(HQ_EINVAL, "%s: operand %c has scale mode %s but no scale buffer", what,
                     name, hq_lt_scale_name(o->scale_mode));
  return HQ_OK;
}

/* The checks of a call's sizes, D and bias that need no operand: HQ_OK or the error. */
int check_call(const hq_call *call, const hq_lt_matmul *mm, const char *what, int query) {
  if (call->device < 0)
    return hqi_error(HQ_ENOTSUP, "%s: cuBLASLt runs on a CUDA device, not on the host", what);
  if (call->device >= HQ_LT_MAX_DEVICES)
    return hqi_error(HQ_ENOTSUP, "%s: device %d: the cuBLASLt runner handles devices 0..%d",
                     what, call->device, HQ_LT_MAX_DEVICES - 1);
  if (mm->m < 0 || mm->n < 0 || mm->k < 0)
    return hqi_error(HQ_ESHAPE, "%s: negative size m=%lld n=%lld k=%lld", what,
                     (long long)mm->m, (long long)mm->n, (long long)mm->k);
  if (mm->d_dtype != HQ_F32 && mm->d_dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: D must be f32 or bf16 (got dtype %d)", what,
                     (int)mm->d_dtype);
  if (mm->bias && mm->bias_dtype != HQ_F32 && mm->bias_dtype != HQ_BF16)
    return hqi_error(HQ_EINVAL, "%s: the bias must be f32 or bf16 (got dtype %d)", what,
                     (int)mm->bias_dtype);
  if (mm->ldd < (mm->m > 1 ? mm->m : 1))
    return hqi_error(HQ_ESHAPE, "%s: ldd %lld < m = %lld", what, (long long)mm->ldd,
                     (long long)mm->m);
  if (!query && !mm->d && mm->m && mm->n)
    return hqi_error(HQ_EINVAL, "%s: D is NULL", what);
  return HQ_OK;
}

/* Everything a plan depends on: two calls with equal keys take the same algorithm. */
void key_for(plan_key *key, const hq_call *call, const hq_lt_matmul *mm, int ptr_device) {
  memset(key, 0, sizeof *key);
  key->device = call->device;
  key->a_elem = mm->a.elem;
  key->a_trans = mm->a.trans ? 1 : 0;
  key->a_scale = (int32_t)mm->a.scale_mode;
  key->b_elem = mm->b.elem;
  key->b_trans = mm->b.trans ? 1 : 0;
  key->b_scale = (int32_t)mm->b.scale_mode;
  key->d_dtype = mm->d_dtype;
  key->bias_dtype = mm->bias ? mm->bias_dtype : 0;
  key->fast_accum = any_fp8(mm) && mm->fast_accum ? 1 : 0;
  key->accumulate_narrow = mm->d_dtype != HQ_F32 && mm->beta != 0.0f;
  key->rowf = has_rowf(mm) ? 1 + (mm->beta != 0.0f) : 0; /* 2: into a temporary */
  key->ptr_device = ptr_device;
  key->amax = HQ_LT_AMAX_D && mm->amax_d && mm->amax_done;
  key->align_a = align_of(mm->a.data);
  key->align_b = align_of(mm->b.data);
  key->align_d = align_of(mm->d);
  key->a_rows = mm->a.rows;
  key->a_cols = mm->a.cols;
  key->a_ld = mm->a.ld;
  key->b_rows = mm->b.rows;
  key->b_cols = mm->b.cols;
  key->b_ld = mm->b.ld;
  key->m = mm->m;
  key->n = mm->n;
  key->k = mm->k;
  key->ldd = mm->ldd;
}

/* The stream's workspace and handle in *u and the key's plan in *pl (chosen on first use):
   HQ_OK, or the error for a problem cuBLASLt has no algorithm for. */
int plan_for(const hq_call *call, const hq_lt_matmul *mm, plan_key *key, dev_use *u, plan *pl) {
  int rc = workspace_get(call, u);
  if (rc) return rc;
  pthread_mutex_lock(&g_mu);
  rc = device_get(call->device, u);
  if (!rc) {
    key->ws_bytes = (uint32_t)u->ws_bytes;
    uint64_t h = key_hash(key);
    plan *p = plan_find(key, h);
    if (!p) {
      p = plan_insert(key, h);
      plan_choose(p, u->lt, mm);
    }
    *pl = *p; /* a copy: the slot may be reused by another thread once the lock is released */
  }
  pthread_mutex_unlock(&g_mu);
  if (rc || pl->status == CUBLAS_STATUS_SUCCESS) return rc;
  char desc[512];
  describe(desc, sizeof desc, mm);
  if (pl->no_algo || unsupported(pl->status))
    return hqi_error(HQ_ENOTSUP, "cuBLASLt has no algorithm for %s on device %d: %s", desc,
                     call->device,
                     pl->no_algo ? "the heuristic returned none"
                                 : cublasLtGetStatusString(pl->status));
  return hqi_error(HQ_EDEVICE, "%s:%d: cuBLASLt heuristic for %s: %s", __FILE__, __LINE__, desc,
                   cublasLtGetStatusString(pl->status));
}

/* alpha (times the factors) and beta as the matmul reads them: host values, or device values in
   the stream's slot (or, for a stream without a workspace, in call-owned memory *owned, freed by
   the caller after the matmul). */
typedef struct scalars {
  float alpha_h, beta_h;
  const void *alpha, *beta;
  float *owned;
} scalars;

int scalars_for(scalars *sc, const hq_call *call, const hq_lt_matmul *mm, const dev_use *u,
                float gemm_beta, int ptr_device, const char *what) {
  sc->alpha_h = mm->alpha;
  sc->beta_h = gemm_beta;
  sc->alpha = &sc->alpha_h;
  sc->beta = &sc->beta_h;
  sc->owned = nullptr;
  const float *beta_c = mm->alpha_device && (gemm_beta == 0.0f || gemm_beta == 1.0f)
                           ? beta_consts(call->device)
                           : nullptr;
  if (beta_c) {
    /* the whole alpha is on the device already and beta is a constant there: no kernel */
    sc->alpha = mm->alpha_device;
    sc->beta = beta_c + (gemm_beta == 0.0f ? 0 : 1);
    return HQ_OK;
  }
  if (!ptr_device) return HQ_OK;
  float *ab = u->ab;
  if (!ab) {
    ab = sc->owned = (float *)call_alloc(call, 2 * sizeof(float));
    if (!ab) return hqi_error(HQ_ENOMEM, "%s: 8 bytes for alpha and beta: allocation failed", what);
  }
  cudaStream_t stream = (cudaStream_t)call->stream;
  if (mm->alpha_device) /* 1 * a = a: the device alpha as it is */
    alpha_beta_kernel<<<1, 1, 0, stream>>>(ab, 1.0f, gemm_beta, mm->alpha_device, nullptr);
  else
    alpha_beta_kernel<<<1, 1, 0, stream>>>(ab, mm->alpha, gemm_beta, mm->alpha_factor[0],
                                           mm->alpha_factor[1]);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    call_free(call, sc->owned);
    sc->owned = nullptr;
    return hqi_error(HQ_EDEVICE, "%s:%d: %s: alpha kernel: %s", __FILE__, __LINE__, what,
                     cudaGetErrorString(e));
  }
  sc->alpha = ab;
  sc->beta = ab + 1;
  return HQ_OK;
}

// --- autotune ------------------------------------------------------------------------------

#define HQ_LT_TUNE_CANDIDATES 8 /* the heuristic's answers timed at a plan's first call */
#define HQ_LT_TUNE_REPS 3       /* timed runs of each, after one untimed run */

/* HQ_GEMM_AUTOTUNE, read once per process (hq_lt_autotune_parse: 0, 1, or -1 invalid): a plan's
   algorithm must not depend on when the variable was read. */
int autotune_setting(void) {
  static std::atomic<int> setting{-2};
  int v = setting.load(std::memory_order_relaxed);
  if (v == -2) {
    v = hq_lt_autotune_parse(getenv("HQ_GEMM_AUTOTUNE"));
    setting.store(v, std::memory_order_relaxed);
  }
  return v;
}

/* What one call's matmul needs besides the algorithm, for timing candidates. */
struct tune_call {
  cublasLtHandle_t lt;
  const descs *ds;
  const void *alpha, *beta;
  const void *a, *b;
  void *d;
  void *ws;
  size_t ws_bytes;
  cudaStream_t stream;
};

cublasStatus_t tune_run(const tune_call *t, const cublasLtMatmulAlgo_t *algo) {
  return cublasLtMatmul(t->lt, (cublasLtMatmulDesc_t)&t->ds->op, t->alpha, t->a,
                        (cublasLtMatrixLayout_t)&t->ds->a, t->b, (cublasLtMatrixLayout_t)&t->ds->b,
                        t->beta, t->d, (cublasLtMatrixLayout_t)&t->ds->d, t->d,
                        (cublasLtMatrixLayout_t)&t->ds->d, algo, t->ws, t->ws_bytes, t->stream);
}

/* Milliseconds per run of algo on t (one untimed run, then HQ_LT_TUNE_REPS between two events);
   a negative value when the algorithm fails (skipped), NAN when timing itself failed (tuning
   stops). */
float tune_time(const tune_call *t, const cublasLtMatmulAlgo_t *algo, cudaEvent_t e0,
                cudaEvent_t e1) {
  if (tune_run(t, algo) != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();
    return -1.0f;
  }
  if (cudaEventRecord(e0, t->stream) != cudaSuccess) return NAN;
  for (int r = 0; r < HQ_LT_TUNE_REPS; r++)
    if (tune_run(t, algo) != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();
      /* the event pair is left recorded around nothing useful: wait so that they are reusable */
      return cudaStreamSynchronize(t->stream) == cudaSuccess ? -1.0f : NAN;
    }
  float ms = 0.0f;
  if (cudaEventRecord(e1, t->stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
      cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
    return NAN;
  return ms / HQ_LT_TUNE_REPS;
}

/* The fastest of the heuristic's first HQ_LT_TUNE_CANDIDATES answers for pl's problem, timed on
   t (the call's own operands, scalars, descriptors and workspace) into *algo; *algo is left as
   it is (the heuristic's first) when fewer than two answers run or timing fails. Another answer
   replaces the first only when it is at least 3% faster: between kernels within the timing noise
   the heuristic's order decides, so that the choice does not flip from run to run. */
void tune(const tune_call *t, const hq_lt_matmul *mm, const plan_key *key, const plan *pl,
          cublasLtMatmulAlgo_t *algo) {
  cublasLtMatmulHeuristicResult_t res[HQ_LT_TUNE_CANDIDATES];
  int count = 0;
  if (heuristic_n(t->lt, mm, key, pl->mode, pl->compute, pl->amax_epi, HQ_LT_TUNE_CANDIDATES, res,
                  &count) != CUBLAS_STATUS_SUCCESS || count < 2)
    return;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    return;
  }
  /* the plan's own algorithm first: the one to beat */
  float base = tune_time(t, algo, e0, e1), best = base;
  int best_i = -1;
  for (int i = 0; i < count && !isnan(base) && base >= 0.0f; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > t->ws_bytes ||
        !memcmp(&res[i].algo, algo, sizeof *algo))
      continue;
    const float ms = tune_time(t, &res[i].algo, e0, e1);
    if (isnan(ms)) {
      best_i = -1; /* timing broke down: keep the heuristic's first */
      break;
    }
    if (ms >= 0.0f && ms < best) best = ms, best_i = i;
  }
  if (best_i >= 0 && best <= 0.97f * base) *algo = res[best_i].algo;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGetLastError();
}

/* Bytes of the D a plan's matmul writes (its dtype and leading dimension in the plan's mode). */
size_t gemm_d_bytes(const hq_lt_matmul *mm, int mode) {
  const int f32 = mode == PLAN_SPLIT || mm->d_dtype == HQ_F32;
  const int64_t ld = mode == PLAN_SPLIT && split_to_temp(mm) ? mm->m : mm->ldd;
  return (size_t)(ld * (mm->n - 1) + mm->m) * (f32 ? 4u : 2u);
}

/* At the first call of pl's key that runs (not a query): fix the key's algorithm for the plan's
   life, into pl->algo. With HQ_GEMM_AUTOTUNE=1 the heuristic's candidates are timed on this
   call's operands first -- into D itself when the matmul does not read it (gemm_beta 0: the
   call's own matmul overwrites it next), else into a scratch D, so that the caller's D and beta
   mean what they say -- except while the stream is being captured into a CUDA graph (nothing
   may synchronize there): then, as without the variable, the heuristic's first answer. When
   another thread settled the key meanwhile, its choice is taken. HQ_OK or the error of an
   invalid HQ_GEMM_AUTOTUNE. */
int settle(const hq_call *call, const hq_lt_matmul *mm, const plan_key *key, const dev_use *u,
           plan *pl, const descs *ds, const scalars *sc, void *gd, float gemm_beta) {
  const int on = autotune_setting();
  if (on < 0)
    return hqi_error(HQ_EINVAL, "HQ_GEMM_AUTOTUNE='%s': expected 0 (the heuristic's first "
                     "algorithm) or 1 (time the heuristic's candidates)",
                     getenv("HQ_GEMM_AUTOTUNE") ? getenv("HQ_GEMM_AUTOTUNE") : "");
  cublasLtMatmulAlgo_t chosen = pl->algo;
  cudaStream_t stream = (cudaStream_t)call->stream;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusActive;
  if (on && cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    cudaGetLastError();
    cap = cudaStreamCaptureStatusActive; /* unknown: do as under capture */
  }
  if (on && cap == cudaStreamCaptureStatusNone) {
    void *scratch = nullptr;
    if (gemm_beta != 0.0f) {
      const size_t bytes = gemm_d_bytes(mm, pl->mode);
      scratch = call_alloc(call, bytes);
      if (scratch && cudaMemsetAsync(scratch, 0, bytes, stream) != cudaSuccess) {
        cudaGetLastError();
        call_free(call, scratch);
        scratch = nullptr;
      }
      if (!scratch) hq_clear_error(); /* no room to tune: the heuristic's first */
    }
    if (gemm_beta == 0.0f || scratch) {
      const tune_call t = {u->lt,      ds,         sc->alpha, sc->beta, mm->a.data, mm->b.data,
                           scratch ? scratch : gd, u->ws,     u->ws_bytes, stream};
      /* without the lock: other threads' GEMMs go on (the handle is thread-safe), and a wait
         on this stream never holds up a thread that the stream's work may be waiting for */
      tune(&t, mm, key, pl, &chosen);
    }
    call_free(call, scratch);
  }
  pthread_mutex_lock(&g_mu);
  plan *p = plan_find(key, key_hash(key));
  if (p && p->settled) {
    chosen = p->algo;
  } else if (p) {
    p->algo = chosen;
    p->settled = 1;
  }
  pthread_mutex_unlock(&g_mu);
  pl->algo = chosen;
  return HQ_OK;
}

} // namespace

/* mm without the amax epilogue (*amax_done stays 0). */
static int without_amax(const hq_call *call, const hq_lt_matmul *mm) {
  hq_lt_matmul plain = *mm;
  plain.amax_d = nullptr;
  plain.amax_done = nullptr;
  return hqi_lt_matmul(call, &plain);
}

extern "C" int hqi_lt_matmul(const hq_call *call, const hq_lt_matmul *mm_in) {
  if (!call || !mm_in)
    return hqi_error(HQ_EINVAL, "lt_matmul: NULL %s", call ? "matmul" : "call");
  /* read at most struct_size bytes of the caller's struct; fields it lacks read as zero */
  const size_t floor = offsetof(hq_lt_matmul, what) + sizeof(const char *);
  if (mm_in->struct_size < floor)
    return hqi_error(HQ_EINVAL, "lt_matmul: struct_size %u is smaller than the 2.1 struct (%zu)",
                     mm_in->struct_size, floor);
  hq_lt_matmul mmv;
  memset(&mmv, 0, sizeof mmv);
  memcpy(&mmv, mm_in, mm_in->struct_size < sizeof mmv ? mm_in->struct_size : sizeof mmv);
  const hq_lt_matmul *mm = &mmv;
  const char *what = mm->what ? mm->what : "GEMM";
  const int query = (mm->flags & HQ_GEMM_QUERY) != 0;

  int rc = check_call(call, mm, what, query);
  if (rc) return rc;
  if (mm->m == 0 || mm->n == 0) return HQ_OK; /* nothing to compute */
  if (mm->k == 0) return query ? HQ_OK : launch_finish(call, mm, NULL, 0); /* beta*D + bias */
  rc = check_operand(mm, &mm->a, 'A', mm->m, mm->k);
  if (!rc) rc = check_operand(mm, &mm->b, 'B', mm->k, mm->n);
  if (rc) return rc;
  if (!query && (!mm->a.data || !mm->b.data))
    return hqi_error(HQ_EINVAL, "%s: operand %c has no data", what, mm->a.data ? 'B' : 'A');

  const int ptr_device = mm->alpha_factor[0] || mm->alpha_factor[1] || mm->alpha_device;
  plan_key key;
  key_for(&key, call, mm, ptr_device);
  dev_use u;
  plan pl;
  if ((rc = plan_for(call, mm, &key, &u, &pl)) || query) return rc;
  if (pl.amax_refused) return without_amax(call, mm);

  /* SPLIT into a BF16 D: the product goes to an F32 temporary (beta 0); finish_kernel adds
     beta * D and the bias and rounds once */
  const int to_temp = pl.mode == PLAN_SPLIT && split_to_temp(mm);
  const float gemm_beta = to_temp ? 0.0f : mm->beta;
  float *tmp = NULL;
  if (to_temp) {
    tmp = (float *)call_alloc(call, (size_t)(mm->m * mm->n) * sizeof(float));
    if (!tmp)
      return hqi_error(HQ_ENOMEM, "%s: %lld bytes for the F32 product before the epilogue: %s",
                       what, (long long)(mm->m * mm->n * 4), "allocation failed");
  }
  scalars sc;
  if ((rc = scalars_for(&sc, call, mm, &u, gemm_beta, ptr_device, what))) {
    call_free(call, tmp);
    return rc;
  }

  descs ds;
  const char *step = "";
  void *gd = to_temp ? (void *)tmp : mm->d;
  void *amax_d = pl.amax_epi ? (void *)mm->amax_d : nullptr;
  cublasStatus_t st = descs_for(&ds, mm, pl.mode, pl.compute, ptr_device, amax_d, &step);
  if (st == CUBLAS_STATUS_SUCCESS && !pl.settled &&
      (rc = settle(call, mm, &key, &u, &pl, &ds, &sc, gd, gemm_beta))) {
    call_free(call, sc.owned);
    call_free(call, tmp);
    return rc;
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    step = "cublasLtMatmul";
    st = cublasLtMatmul(u.lt, (cublasLtMatmulDesc_t)&ds.op, sc.alpha, mm->a.data,
                        (cublasLtMatrixLayout_t)&ds.a, mm->b.data, (cublasLtMatrixLayout_t)&ds.b,
                        sc.beta, gd, (cublasLtMatrixLayout_t)&ds.d, gd,
                        (cublasLtMatrixLayout_t)&ds.d, &pl.algo, u.ws, u.ws_bytes,
                        (cudaStream_t)call->stream);
  }
  if (amax_d && unsupported(st)) {
    /* the epilogue the heuristic offered is refused when the matmul is set up (nothing ran):
       this key's calls run without it from now on, and the caller reads D for the amax */
    pthread_mutex_lock(&g_mu);
    plan *p = plan_find(&key, key_hash(&key));
    if (p) p->amax_refused = 1;
    pthread_mutex_unlock(&g_mu);
    call_free(call, sc.owned);
    call_free(call, tmp);
    return without_amax(call, mm);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    char desc[512];
    describe(desc, sizeof desc, mm);
    rc = hqi_error(HQ_EDEVICE, "%s:%d: %s for %s on device %d: %s", __FILE__, __LINE__, step,
                   desc, call->device, cublasLtGetStatusString(st));
  } else if (pl.mode == PLAN_SPLIT && (to_temp || mm->bias || has_rowf(mm))) {
    rc = launch_finish(call, mm, tmp, !to_temp);
  } else if (amax_d) {
    if (mm->d_dtype == HQ_BF16) {
      amax_bf16_kernel<<<1, 1, 0, (cudaStream_t)call->stream>>>(mm->amax_d);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess)
        rc = hqi_error(HQ_EDEVICE, "%s:%d: %s: amax rounding kernel: %s", __FILE__, __LINE__,
                       what, cudaGetErrorString(e));
    }
    if (!rc) *mm->amax_done = 1;
  }
  /* stream-ordered: released after the work that reads them */
  call_free(call, sc.owned);
  call_free(call, tmp);
  return rc;
}
