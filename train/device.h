/*
** device.h -- the trainer's device table: every operation of the model that is not a GEMM
** (embedding, activations, softmax cross-entropy, bias gradients), once for the CPU (ops_cpu.c)
** and once for CUDA (ops_cuda.cu). model.c picks the table of its context's device and calls
** nothing else; the tables run on the context's stream (hq_ctx_stream) so that their work is
** ordered with libhqcore's. Every table is deterministic: the same inputs give the same bytes
** on every run (sums in a fixed order; no atomics but the fused amaxes' max, whose result no
** order changes), which the trainer's --verify-resume needs.
*/
#ifndef HQ_TRAIN_DEVICE_H
#define HQ_TRAIN_DEVICE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "hq/hq.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_ACT_TANH 0
#define TRAIN_ACT_GELU 1

/* 4-byte words to move to the device: dst[0, n) = src[0, n), or zeros where src is NULL
   (train_device_ops.upload_mapped) */
typedef struct train_span {
  int32_t *dst;
  const int32_t *src;
  int64_t n;
} train_span;
/* the spans one upload_mapped call takes: the batch's tokens and targets, the optimizer's
   constants, the step of the random stream for each of the two contexts, the step's amax slots
   to zero */
#define TRAIN_UPLOAD_SPANS 6

typedef struct train_device_ops {
  const char *name;
  /* Every `amax` below may be NULL (nothing computed); otherwise amax[0] and amax[1] are each
     max-accumulated with max |v| over the tensor the call writes, NaN ignored and Inf counted
     (train_amax_step: hq_quantizer_amax's HQ_AMAX_INPUT rule), so that a per-tensor quantize of
     that tensor takes them as hq_quantize_args.amax and reads it once. The caller zeroes both
     floats before the call. Every `scratch` is the table's scratch_bytes() (below) of the
     context's device memory, which the call may overwrite (the CPU table needs none). */
  /* x[b, c*E + e] = emb[tok[b, c], e] */
  int (*embed_fwd)(hq_ctx *ctx, const float *emb, const int32_t *tok, float *x, int64_t B, int C,
                   int E, float *amax);
  /* gemb[v, e] = sum over (b, c) with tok[b, c] == v of dx[b, c*E + e] (gemb: [V, E], V = 27) */
  int (*embed_bwd)(hq_ctx *ctx, const float *dx, const int32_t *tok, float *gemb, int64_t B,
                   int C, int E, void *scratch);
  /* The layer's bias is added by the calls that read its output, not by its GEMM (the output
     buffer y holds x W^T alone): a GEMM with an FP32 bias can cost a kernel of its own (a
     cuBLASLt FP8 matmul takes only a BF16 one), and these calls read y anyway. The sum is one
     FP32 add, y + bias rounded once, as a GEMM that adds the bias after its product makes it.
     y, h and d are [n / cols, cols] row-major (n a multiple of cols), bias [cols]. */
  /* h = act(y + bias[col]) */
  int (*act_fwd)(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols, float *h,
                 int64_t n, float *amax);
  /* d = d * act'(y + bias[col]) in place: the gradient w.r.t. h becomes the gradient w.r.t. y */
  int (*act_bwd)(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols, float *d,
                 int64_t n, float *amax);
  /* mean cross-entropy of rows [0, n_valid) over the first V of Vpad logits y + bias[v] (y:
     [B, Vpad], bias: [V] at least) into *loss (device scalar); dlogits (NULL in eval) = (softmax
     - onehot) / n_valid, 0 in padded rows and columns; amax (of dlogits) only with dlogits */
  int (*xent)(hq_ctx *ctx, const float *logits, const float *bias, const int32_t *tgt, int64_t B,
              int64_t n_valid, int V, int Vpad, float *loss, float *dlogits, float *amax,
              void *scratch);
  /* db[j] = sum_b dy[b, j] */
  int (*colsum)(hq_ctx *ctx, const float *dy, int64_t B, int64_t n, float *db, void *scratch);
  /* what the last failing call of this table said */
  const char *(*error)(void);
  /* bytes of the scratch the calls above need for a model of batch B, context C, embedding E
     and widest layer `widest` (0: none) */
  size_t (*scratch_bytes)(int64_t B, int C, int E, int64_t widest);
  /* span[i].dst[0, n) = span[i].src[0, n) for each of the n_span (at most TRAIN_UPLOAD_SPANS)
     spans, whose sources are page-locked host buffers the device reads in place, or zeros where
     span[i].src is NULL: one kernel where a host-to-device copy per span would queue a
     copy-engine node each (the batch's tokens and targets, the optimizer's constants) and a
     zeroing its own kernel (the step's amax slots). NULL: the table has no such path (the
     caller copies and zeroes). */
  int (*upload_mapped)(hq_ctx *ctx, const train_span *span, int n_span);
} train_device_ops;

const train_device_ops *train_cpu_ops(void);
/* NULL when hq was built without CUDA */
const train_device_ops *train_cuda_ops(void);
/* cudaMemGetInfo of CUDA device `device`: 0, or -1 (no CUDA, no such device). */
int train_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* The CUDA graph of a training step (loop.c, --cuda-graph). A graph can only be captured on a
   stream of the trainer's own (the legacy default stream cannot be captured), so a run that
   captures creates its context on train_cuda_stream_create's stream. Each call returns 0, or -1
   with CUDA's message in err (the calls without CUDA say so). */
typedef struct train_graph train_graph;
int train_cuda_stream_create(int device, void **stream, char *err, size_t err_len);
void train_cuda_stream_destroy(void *stream);
/* Begin capturing the work queued on `stream` by this thread (thread-local mode: a call that
   would synchronize or allocate outside the stream's order fails the capture instead of
   running). */
int train_graph_begin(int device, void *stream, char *err, size_t err_len);
/* End the capture on `stream` and instantiate it into *out, after writing it to `dot` as
   Graphviz dot when not NULL (--graph-dot). ok = 0 (a captured call failed): the capture is
   ended and dropped, *out is NULL and 0 is returned (the caller has the message). */
int train_graph_end(int device, void *stream, int ok, const char *dot, train_graph **out,
                    char *err, size_t err_len);
/* Replay g on `stream` (queued: nothing waits). */
int train_graph_launch(int device, train_graph *g, void *stream, char *err,
                       size_t err_len);
void train_graph_free(train_graph *g);
/* What a captured step holds, per kind of node (counts[TRAIN_GRAPH_NODE_KINDS]): each node is
   one launch that the replay still runs, so their number bounds a small model's step. */
enum { TRAIN_GRAPH_KERNELS, TRAIN_GRAPH_COPIES, TRAIN_GRAPH_MEMSETS, TRAIN_GRAPH_ALLOCS,
       TRAIN_GRAPH_OTHER,
       TRAIN_GRAPH_NODE_KINDS };
void train_graph_nodes(const train_graph *g, int *counts);
/* The side lane of a captured step (model.c, train_model_side): an event that only orders
   (no timing) on CUDA device `device`; the work queued on `from` so far marked by it, and `to`
   made to wait for its last mark (in a capture, the edge joins `to` to it). */
int train_cuda_order_event(int device, void **ev, char *err, size_t err_len);
void train_cuda_order_event_free(void *ev);
int train_cuda_order_mark(void *ev, void *from, char *err, size_t err_len);
int train_cuda_order_wait(void *ev, void *to, char *err, size_t err_len);
/* ev marks the work queued on `from` so far as train_cuda_order_mark does, and where `from` is
   being captured, as an external event node: each replay of the graph then marks ev once that
   work has run, which the host can wait for while the replay goes on. */
int train_cuda_order_mark_external(void *ev, void *from, char *err, size_t err_len);
/* The host waits until the work ev last marked has run. */
int train_cuda_order_sync(void *ev, char *err, size_t err_len);
/* Page-locked host memory (cudaMallocHost): the batch's staging buffers, whose copies to the
   device a capture can record (a copy from pageable memory cannot be captured). */
int train_cuda_host_alloc(int device, size_t bytes, void **out, char *err, size_t err_len);
void train_cuda_host_free(void *p);

/* The activations' element rules, shared by both tables (plain C, compiled by gcc and nvcc):
   tanh(y) = 1 - 2 / (1 + e^(2y)); GELU (tanh form) 0.5 y (1 + tanh(u)) = y * sigmoid(2u) with
   u = sqrt(2/pi) (y + 0.044715 y^3): one expf per element. */
#ifdef __CUDACC__
#define TRAIN_HD __host__ __device__
#else
#define TRAIN_HD
#endif
#define TRAIN_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define TRAIN_GELU_C 0.044715f

static inline TRAIN_HD float train_tanh(float y) { return 1.0f - 2.0f / (1.0f + expf(2.0f * y)); }
static inline TRAIN_HD float train_gelu_sig(float y) { /* sigmoid(2u) */
  return 1.0f / (1.0f + expf(-2.0f * TRAIN_GELU_K * (y + TRAIN_GELU_C * y * y * y)));
}
static inline TRAIN_HD float train_act(int act, float y) {
  return act == TRAIN_ACT_TANH ? train_tanh(y) : y * train_gelu_sig(y);
}
/* act'(y) */
static inline TRAIN_HD float train_act_grad(int act, float y) {
  if (act == TRAIN_ACT_TANH) {
    const float t = train_tanh(y);
    return 1.0f - t * t;
  }
  /* d/dy [y s(2u)] = s + y s (1 - s) 2 du/dy */
  const float s = train_gelu_sig(y);
  return s + y * s * (1.0f - s) * 2.0f * TRAIN_GELU_K * (1.0f + 3.0f * TRAIN_GELU_C * y * y);
}

/* One step of a per-tensor amax: fmaxf drops a NaN operand, so a chain started at 0 is max |x|
   with NaN ignored and Inf counted, the rule of hq_fmax_nan_ignoring and of the plugins' amax
   passes (the same float, whatever the order of the chain). */
static inline TRAIN_HD float train_amax_step(float m, float x) { return fmaxf(m, fabsf(x)); }

/* One row of the softmax cross-entropy (the rule both xent tables run per row) over the logits
   l_v = y[v] + bias[v] (one FP32 add): the loss term log(sum_v e^(l_v - max)) + max - l_tgt in
   double, and, when d is not NULL, d_v = softmax_v * inv for v < V, d_tgt -= inv, 0 in the
   padded columns [V, Vpad). */
static inline TRAIN_HD float train_logit(const float *y, const float *bias, int v) {
  return y[v] + bias[v];
}
static inline TRAIN_HD double train_xent_row(const float *y, const float *bias, int32_t tgt,
                                             int V, int Vpad, float inv, float *d) {
  float mx = train_logit(y, bias, 0);
  for (int v = 1; v < V; v++) {
    const float l = train_logit(y, bias, v);
    mx = l > mx ? l : mx;
  }
  double z = 0;
  for (int v = 0; v < V; v++) z += exp((double)(train_logit(y, bias, v) - mx));
  /* before d: d may alias y */
  const double term = log(z) + (double)mx - (double)train_logit(y, bias, tgt);
  if (d) {
    for (int v = 0; v < V; v++)
      d[v] = (float)(exp((double)(train_logit(y, bias, v) - mx)) / z) * inv;
    d[tgt] -= inv;
    for (int v = V; v < Vpad; v++) d[v] = 0.0f;
  }
  return term;
}

#ifdef __cplusplus
}
#endif
#endif
