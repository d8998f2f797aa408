/*
** ops_cuda.cu -- the trainer's device table on a CUDA device (device.h), on the context's stream.
** Deterministic by construction: no atomics; every sum (embedding and bias gradients, the loss)
** runs in a fixed order that depends only on the shapes, so a run repeats bit for bit (the
** trainer's --verify-resume compares two runs byte for byte). The element rules of the
** activations are device.h's, shared with the CPU table; the loss sums in double as there.
*/
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "device.h"

#define TRAIN_V 27   /* rows of the embedding table (train.h's TRAIN_VOCAB) */

namespace {

thread_local char g_err[512] = "no error";

/* a launch or runtime failure: the operation and CUDA's message (0 when none) */
int check(const char *what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(g_err, sizeof g_err, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

/* every call runs on the context's device and stream */
int enter(hq_ctx *ctx, cudaStream_t *s, const char *what) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur != hq_ctx_device(ctx)) e = cudaSetDevice(hq_ctx_device(ctx));
  if (e != cudaSuccess) {
    snprintf(g_err, sizeof g_err, "%s: selecting CUDA device %d: %s", what, hq_ctx_device(ctx),
             cudaGetErrorString(e));
    return -1;
  }
  *s = (cudaStream_t)hq_ctx_stream(ctx);
  return 0;
}

unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > 65535) b = 65535;   /* grid-stride loops cover the rest */
  return (unsigned)(b < 1 ? 1 : b);
}

__global__ void embed_fwd_k(const float *__restrict__ emb, const int32_t *__restrict__ tok,
                            float *__restrict__ x, int64_t n, int E) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = emb[(int64_t)tok[i / E] * E + i % E];
}

/* Column sums of a [rows, cols] matrix, restricted to rows r with key[r] == blockIdx.y when key
   is given (the embedding gradient: one blockIdx.y per token id). A block owns COLS columns;
   its GROUPS row groups each sum rows g, g + GROUPS, ... in order, then thread (0, c) adds the
   groups' sums in order: a fixed order for a given shape. */
constexpr int COLS = 32, GROUPS = 8;
__global__ void colsum_k(const float *__restrict__ a, int64_t rows, int64_t cols,
                         const int32_t *__restrict__ key, float *__restrict__ out) {
  __shared__ float part[GROUPS][COLS];
  const int c = threadIdx.x, g = threadIdx.y;
  const int64_t col = blockIdx.x * (int64_t)COLS + c;
  const int want = (int)blockIdx.y;
  float s = 0.0f;
  if (col < cols)
    for (int64_t r = g; r < rows; r += GROUPS)
      if (!key || key[r] == want) s += a[r * cols + col];
  part[g][c] = s;
  __syncthreads();
  if (g == 0 && col < cols) {
    float t = part[0][c];
    for (int k = 1; k < GROUPS; k++) t += part[k][c];
    out[(int64_t)want * cols + col] = t;
  }
}

__global__ void act_fwd_k(int act, const float *__restrict__ y, float *__restrict__ h,
                          int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    h[i] = train_act(act, y[i]);
}

__global__ void act_bwd_k(int act, const float *__restrict__ y, float *__restrict__ d,
                          int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    d[i] *= train_act_grad(act, y[i]);
}

/* One block: thread t takes rows t, t + XT, ... (the row's loss and gradient in double as on
   the CPU), then a fixed tree sums the threads' partial losses. */
constexpr int XT = 256;
__global__ void xent_k(const float *__restrict__ logits, const int32_t *__restrict__ tgt,
                       int64_t B, int64_t n_valid, int V, int Vpad, float *__restrict__ loss,
                       float *__restrict__ dlogits) {
  __shared__ double part[XT];
  const float inv = n_valid > 0 ? 1.0f / (float)n_valid : 0.0f;
  double sum = 0;
  for (int64_t b = threadIdx.x; b < B; b += XT) {
    const float *l = logits + b * Vpad;
    float *d = dlogits ? dlogits + b * Vpad : nullptr;
    if (b >= n_valid) {
      if (d)
        for (int v = 0; v < Vpad; v++) d[v] = 0.0f;
      continue;
    }
    sum += train_xent_row(l, tgt[b], V, Vpad, inv, d);
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = XT / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = (float)(n_valid > 0 ? part[0] / (double)n_valid : 0.0);
}

int cuda_embed_fwd(hq_ctx *ctx, const float *emb, const int32_t *tok, float *x, int64_t B, int C,
                   int E) {
  cudaStream_t s;
  if (enter(ctx, &s, "embedding")) return -1;
  const int64_t n = B * C * E;
  embed_fwd_k<<<blocks_for(n, 256), 256, 0, s>>>(emb, tok, x, n, E);
  return check("embedding kernel");
}

int cuda_embed_bwd(hq_ctx *ctx, const float *dx, const int32_t *tok, float *gemb, int64_t B,
                   int C, int E) {
  cudaStream_t s;
  if (enter(ctx, &s, "embedding gradient")) return -1;
  /* dx viewed as [B*C, E] with one key (the token) per row; row v of gemb sums the rows of
     token v */
  const dim3 grid((unsigned)((E + COLS - 1) / COLS), TRAIN_V), block(COLS, GROUPS);
  colsum_k<<<grid, block, 0, s>>>(dx, B * C, E, tok, gemb);
  return check("embedding gradient kernel");
}

int cuda_act_fwd(hq_ctx *ctx, int act, const float *y, float *h, int64_t n) {
  cudaStream_t s;
  if (enter(ctx, &s, "activation")) return -1;
  act_fwd_k<<<blocks_for(n, 256), 256, 0, s>>>(act, y, h, n);
  return check("activation kernel");
}

int cuda_act_bwd(hq_ctx *ctx, int act, const float *y, float *d, int64_t n) {
  cudaStream_t s;
  if (enter(ctx, &s, "activation gradient")) return -1;
  act_bwd_k<<<blocks_for(n, 256), 256, 0, s>>>(act, y, d, n);
  return check("activation gradient kernel");
}

int cuda_xent(hq_ctx *ctx, const float *logits, const int32_t *tgt, int64_t B, int64_t n_valid,
              int V, int Vpad, float *loss, float *dlogits) {
  cudaStream_t s;
  if (enter(ctx, &s, "cross-entropy")) return -1;
  xent_k<<<1, XT, 0, s>>>(logits, tgt, B, n_valid, V, Vpad, loss, dlogits);
  return check("cross-entropy kernel");
}

int cuda_colsum(hq_ctx *ctx, const float *dy, int64_t B, int64_t n, float *db) {
  cudaStream_t s;
  if (enter(ctx, &s, "bias gradient")) return -1;
  const dim3 grid((unsigned)((n + COLS - 1) / COLS), 1), block(COLS, GROUPS);
  colsum_k<<<grid, block, 0, s>>>(dy, B, n, nullptr, db);
  return check("bias gradient kernel");
}

int cuda_zero(hq_ctx *ctx, void *p, size_t bytes) {
  cudaStream_t s;
  if (enter(ctx, &s, "zeroing a buffer")) return -1;
  const cudaError_t e = cudaMemsetAsync(p, 0, bytes, s);
  if (e != cudaSuccess) {
    snprintf(g_err, sizeof g_err, "zeroing %zu bytes: %s", bytes, cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

const char *cuda_error(void) { return g_err; }

const train_device_ops cuda_ops = {
    "cuda", cuda_embed_fwd, cuda_embed_bwd, cuda_act_fwd, cuda_act_bwd, cuda_xent, cuda_colsum,
    cuda_zero, cuda_error,
};

}  // namespace

extern "C" const train_device_ops *train_cuda_ops(void) { return &cuda_ops; }

extern "C" int train_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  int cur = -1;
  size_t f = 0, t = 0;
  *free_bytes = *total_bytes = 0;
  if (cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();   /* not sticky: leave no error for the next check() */
    return -1;
  }
  const cudaError_t e = cudaMemGetInfo(&f, &t);
  cudaSetDevice(cur);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

/* --- the profile's events and the memory watch (profile.h) --------------------------------- */

#include "profile.h"

extern "C" int train_cuda_events_create(void **ev, int64_t n, int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess ||
      (cur != device && cudaSetDevice(device) != cudaSuccess)) {
    cudaGetLastError();
    return -1;
  }
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; i++) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      cudaGetLastError();
      train_cuda_events_destroy(ev, i);
      rc = -1;
    }
    ev[i] = e;
  }
  if (cur != device) cudaSetDevice(cur);
  return rc;
}

extern "C" void train_cuda_events_destroy(void **ev, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (ev[i]) {
      cudaEventDestroy((cudaEvent_t)ev[i]);
      ev[i] = nullptr;
    }
}

extern "C" int train_cuda_event_record(void *ev, void *stream) {
  if (cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream) == cudaSuccess) return 0;
  cudaGetLastError();
  return -1;
}

extern "C" int train_cuda_event_ms(void *a, void *b, float *ms) {
  if (cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess) return 0;
  cudaGetLastError();
  *ms = 0;
  return -1;
}

extern "C" int train_cuda_event_sync(void *ev) {
  if (cudaEventSynchronize((cudaEvent_t)ev) == cudaSuccess) return 0;
  cudaGetLastError();
  return -1;
}

extern "C" int train_cuda_mem_used(int device, int64_t *used) {
  int cur = -1;
  size_t fr = 0, tot = 0;
  *used = 0;
  if (cudaGetDevice(&cur) != cudaSuccess ||
      (cur != device && cudaSetDevice(device) != cudaSuccess)) {
    cudaGetLastError();
    return -1;
  }
  const cudaError_t e = cudaMemGetInfo(&fr, &tot);
  if (cur != device) cudaSetDevice(cur);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  *used = (int64_t)(tot - fr);
  return 0;
}
