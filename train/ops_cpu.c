/*
** ops_cpu.c -- the trainer's device table on the host (device.h): plain loops in FP32, the
** cross-entropy's sums in double.
*/
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device.h"

#define TRAIN_V 27   /* rows of the embedding table (train.h's TRAIN_VOCAB) */

/* amax[0..1] max-accumulated with the chain of train_amax_step over v[0, n) (device.h) */
static void amax_of(float *amax, const float *v, int64_t n) {
  if (!amax) return;
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++) m = train_amax_step(m, v[i]);
  amax[0] = fmaxf(amax[0], m);
  amax[1] = fmaxf(amax[1], m);
}

static int cpu_embed_fwd(hq_ctx *ctx, const float *emb, const int32_t *tok, float *x, int64_t B,
                         int C, int E, float *amax) {
  (void)ctx;
  for (int64_t b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      memcpy(x + (b * C + c) * E, emb + (int64_t)tok[b * C + c] * E, (size_t)E * sizeof(float));
  amax_of(amax, x, B * C * E);
  return 0;
}

static int cpu_embed_bwd(hq_ctx *ctx, const float *dx, const int32_t *tok, float *gemb,
                         int64_t B, int C, int E, void *scratch) {
  (void)ctx;
  (void)scratch;
  memset(gemb, 0, (size_t)TRAIN_V * (size_t)E * sizeof(float));
  for (int64_t b = 0; b < B; b++)
    for (int c = 0; c < C; c++) {
      float *g = gemb + (int64_t)tok[b * C + c] * E;
      const float *d = dx + (b * C + c) * E;
      for (int e = 0; e < E; e++) g[e] += d[e];
    }
  return 0;
}

static int cpu_act_fwd(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols,
                       float *h, int64_t n, float *amax) {
  (void)ctx;
  for (int64_t r = 0; r < n; r += cols)
    for (int64_t c = 0; c < cols && r + c < n; c++)
      h[r + c] = train_act(act, y[r + c] + bias[c]);
  amax_of(amax, h, n);
  return 0;
}

static int cpu_act_bwd(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols,
                       float *d, int64_t n, float *amax) {
  (void)ctx;
  for (int64_t r = 0; r < n; r += cols)
    for (int64_t c = 0; c < cols && r + c < n; c++)
      d[r + c] *= train_act_grad(act, y[r + c] + bias[c]);
  amax_of(amax, d, n);
  return 0;
}

static int cpu_xent(hq_ctx *ctx, const float *logits, const float *bias, const int32_t *tgt,
                    int64_t B, int64_t n_valid, int V, int Vpad, float *loss, float *dlogits,
                    float *amax, void *scratch) {
  (void)ctx;
  (void)scratch;
  double sum = 0;
  const float inv = n_valid > 0 ? 1.0f / (float)n_valid : 0.0f;
  for (int64_t b = 0; b < B; b++) {
    const float *l = logits + b * Vpad;
    float *d = dlogits ? dlogits + b * Vpad : NULL;
    if (b >= n_valid) {
      if (d) memset(d, 0, (size_t)Vpad * sizeof(float));
      continue;
    }
    sum += train_xent_row(l, bias, tgt[b], V, Vpad, inv, d);
  }
  *loss = (float)(n_valid > 0 ? sum / (double)n_valid : 0.0);
  if (dlogits) amax_of(amax, dlogits, B * Vpad);
  return 0;
}

static int cpu_colsum(hq_ctx *ctx, const float *dy, int64_t B, int64_t n, float *db,
                      void *scratch) {
  (void)ctx;
  (void)scratch;
  memset(db, 0, (size_t)n * sizeof(float));
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < n; j++) db[j] += dy[b * n + j];
  return 0;
}

static const char *cpu_error(void) { return "no error"; }

static size_t cpu_scratch_bytes(int64_t B, int C, int E, int64_t widest) {
  (void)B;
  (void)C;
  (void)E;
  (void)widest;
  return 0;
}

static const train_device_ops cpu_ops = {
    "cpu", cpu_embed_fwd, cpu_embed_bwd, cpu_act_fwd, cpu_act_bwd, cpu_xent, cpu_colsum, cpu_error,
    cpu_scratch_bytes, NULL,
};

const train_device_ops *train_cpu_ops(void) { return &cpu_ops; }

#ifndef HQ_HAVE_CUDA
const train_device_ops *train_cuda_ops(void) { return NULL; }
int train_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  (void)device;
  *free_bytes = *total_bytes = 0;
  return -1;
}
/* A build without CUDA never captures: the loop asks for a graph only on a CUDA context. */
static int no_cuda(char *err, size_t err_len) {
  snprintf(err, err_len, "this hq was built without CUDA");
  return -1;
}
int train_cuda_stream_create(int device, void **stream, char *err, size_t err_len) {
  (void)device;
  *stream = NULL;
  return no_cuda(err, err_len);
}
void train_cuda_stream_destroy(void *stream) { (void)stream; }
int train_graph_begin(int device, void *stream, char *err, size_t err_len) {
  (void)device;
  (void)stream;
  return no_cuda(err, err_len);
}
int train_graph_end(int device, void *stream, int ok, const char *dot, train_graph **out,
                    char *err, size_t err_len) {
  (void)device;
  (void)stream;
  (void)ok;
  (void)dot;
  *out = NULL;
  return no_cuda(err, err_len);
}
int train_graph_launch(int device, train_graph *g, void *stream, char *err,
                       size_t err_len) {
  (void)device;
  (void)g;
  (void)stream;
  return no_cuda(err, err_len);
}
void train_graph_free(train_graph *g) { (void)g; }
void train_graph_nodes(const train_graph *g, int *counts) {
  (void)g;
  for (int k = 0; k < TRAIN_GRAPH_NODE_KINDS; k++) counts[k] = 0;
}
int train_cuda_order_event(int device, void **ev, char *err, size_t err_len) {
  (void)device;
  *ev = NULL;
  return no_cuda(err, err_len);
}
void train_cuda_order_event_free(void *ev) { (void)ev; }
int train_cuda_order_mark(void *ev, void *from, char *err, size_t err_len) {
  (void)ev;
  (void)from;
  return no_cuda(err, err_len);
}
int train_cuda_order_wait(void *ev, void *to, char *err, size_t err_len) {
  (void)ev;
  (void)to;
  return no_cuda(err, err_len);
}
int train_cuda_order_mark_external(void *ev, void *from, char *err, size_t err_len) {
  (void)ev;
  (void)from;
  return no_cuda(err, err_len);
}
int train_cuda_order_sync(void *ev, char *err, size_t err_len) {
  (void)ev;
  return no_cuda(err, err_len);
}
int train_cuda_host_alloc(int device, size_t bytes, void **out, char *err, size_t err_len) {
  (void)device;
  (void)bytes;
  *out = NULL;
  return no_cuda(err, err_len);
}
void train_cuda_host_free(void *p) { (void)p; }
#endif
