/*
** ops_cuda.cu -- the trainer's device table on a CUDA device (device.h), on the context's stream.
** Deterministic by construction: every sum (embedding and bias gradients, the loss) runs in a
** fixed order that depends only on the shapes, in two stages (bands of rows, then the bands in
** order), so a run repeats bit for bit (the trainer's --verify-resume compares two runs byte for
** byte); the only atomics are the fused amaxes' atomicMax, whose result does not depend on their
** order. The element rules of the activations and the amax are device.h's, shared with the CPU
** table; the loss sums in double as there.
*/
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <new>

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

constexpr int TPB = 256;   /* threads of the element-wise kernels' blocks */

/* Blocks of an element-wise grid-stride kernel over `items`: enough to fill the device (8
   resident blocks of TPB threads per SM), no more, so that a kernel's per-block amax commits
   stay few. */
unsigned grid_for(int64_t items) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    sms = 16;
  }
  const int64_t cap = 8 * (int64_t)sms, b = (items + TPB - 1) / TPB;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* 16-byte aligned pointers (float4 loads and stores) */
bool aligned16(const void *a, const void *b) {
  return (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

/* The block's part of a fused amax (device.h): the block's maximum of the threads' chains m,
   then one atomicMax per float of amax on the FP32 bits -- bits of non-negative floats order like
   the values, so the result does not depend on the order of the blocks. Every thread of the
   (1-D) block calls it. */
__device__ void amax_commit(float m, float *amax) {
  __shared__ float warp_max[TPB / 32];
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < (int)(blockDim.x + 31) / 32 ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0 && m > 0.0f) {
      atomicMax(reinterpret_cast<unsigned int *>(amax), __float_as_uint(m));
      atomicMax(reinterpret_cast<unsigned int *>(amax + 1), __float_as_uint(m));
    }
  }
}

/* x[b, c*E + e] = emb[tok[b, c], e]; with E % 4 == 0 and aligned buffers (W = 4) a float4 per
   thread and step, else one float */
template <int W>
__global__ void __launch_bounds__(TPB)
    embed_fwd_k(const float *__restrict__ emb, const int32_t *__restrict__ tok,
                float *__restrict__ x, int64_t n, int E, float *amax) {
  const int64_t nv = n / W, ev = E / W;
  float m = 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)TPB + threadIdx.x; i < nv;
       i += (int64_t)gridDim.x * TPB) {
    const int64_t src = (int64_t)tok[i / ev] * ev + i % ev;
    if constexpr (W == 4) {
      const float4 v = reinterpret_cast<const float4 *>(emb)[src];
      reinterpret_cast<float4 *>(x)[i] = v;
      m = train_amax_step(train_amax_step(train_amax_step(train_amax_step(m, v.x), v.y), v.z), v.w);
    } else {
      const float v = emb[src];
      x[i] = v;
      m = train_amax_step(m, v);
    }
  }
  if (amax) amax_commit(m, amax);
}

/* h = act(y + bias[col]) (FWD) or d = d * act'(y + bias[col]) (!FWD) over n elements of rows
   of `cols`: W = 4 takes float4 steps (cols % 4 == 0 and aligned buffers: the 4 elements of a
   step share a row, so their bias is one float4), W = 1 one element each. A thread's bias
   column c follows its index i as i advances by the grid's stride (c += stride mod the row, less
   a row when past it), so that no step divides. */
template <bool FWD, int W>
__global__ void __launch_bounds__(TPB)
    act_k(int act, const float *__restrict__ y, const float *__restrict__ bias, int64_t cols,
          float *__restrict__ out, int64_t n, float *amax) {
  const int64_t nv = n / W, cv = cols / W, stride = (int64_t)gridDim.x * TPB;
  const int64_t t = blockIdx.x * (int64_t)TPB + threadIdx.x, cs = stride % cv;
  int64_t c = t % cv;
  float m = 0.0f;
  for (int64_t i = t; i < nv; i += stride) {
    if constexpr (W == 4) {
      const float4 a = reinterpret_cast<const float4 *>(y)[i];
      const float4 bv = reinterpret_cast<const float4 *>(bias)[c];
      const float4 v = make_float4(a.x + bv.x, a.y + bv.y, a.z + bv.z, a.w + bv.w);
      float4 o;
      if (FWD) {
        o = make_float4(train_act(act, v.x), train_act(act, v.y), train_act(act, v.z),
                        train_act(act, v.w));
      } else {
        o = reinterpret_cast<const float4 *>(out)[i];
        o.x *= train_act_grad(act, v.x);
        o.y *= train_act_grad(act, v.y);
        o.z *= train_act_grad(act, v.z);
        o.w *= train_act_grad(act, v.w);
      }
      reinterpret_cast<float4 *>(out)[i] = o;
      m = train_amax_step(train_amax_step(train_amax_step(train_amax_step(m, o.x), o.y), o.z),
                          o.w);
    } else {
      const float v = y[i] + bias[c];
      const float o = FWD ? train_act(act, v) : out[i] * train_act_grad(act, v);
      out[i] = o;
      m = train_amax_step(m, o);
    }
    c += cs;
    if (c >= cv) c -= cv;
  }
  if (amax) amax_commit(m, amax);
}

/* --- column sums in a fixed order -----------------------------------------------------------
   A [rows, cols] matrix is cut into `chunks` bands of rpc consecutive rows (the last shorter);
   stage 1 sums each band's columns into part[band, col], stage 2 sums the bands in order. In a
   band, row group g (of CS_GROUPS) sums rows g, g + CS_GROUPS, ... in order, and the groups'
   sums are added in order g = 0, 1, ...: the order depends on the shape alone (not on the
   alignment, which only picks the load width). */
constexpr int CS_GROUPS = 8;      /* row groups of a stage-1 block (threadIdx.y) */
constexpr int CS_TILE = 128;      /* columns of a stage-1 block: 32 threads x 4 */
constexpr int CS_ROWS_MIN = 64;   /* rows of a band at least */
constexpr int CS_BLOCKS = 2048;   /* stage-1 blocks aimed at: some 16 per SM */
constexpr int CS_CHUNKS_MAX = 128; /* bands at most: bounds the scratch and stage 2's loop */

/* the bands of a [rows, cols] sum whose stage 1 tiles the columns by `tile` */
int64_t cs_chunks(int64_t rows, int64_t cols, int64_t tile) {
  const int64_t tiles = (cols + tile - 1) / tile;
  int64_t c = (rows + CS_ROWS_MIN - 1) / CS_ROWS_MIN;
  const int64_t fill = CS_BLOCKS / tiles > 1 ? CS_BLOCKS / tiles : 1;
  if (c > fill) c = fill;
  if (c > CS_CHUNKS_MAX) c = CS_CHUNKS_MAX;
  return c < 1 ? 1 : c;
}

/* stage 1: W = 4 loads a float4 (cols % 4 == 0, aligned), W = 1 one float; a block covers 32 * W
   columns, so a W = 1 grid has 4 times the blocks in x of a W = 4 one, same bands */
template <int W>
__global__ void __launch_bounds__(32 * CS_GROUPS)
    colsum_part_k(const float *__restrict__ a, int64_t rows, int64_t cols, int64_t rpc,
                  float *__restrict__ part) {
  __shared__ float sh[CS_GROUPS][32 * W];
  const int x = threadIdx.x, g = threadIdx.y;
  const int64_t c0 = ((int64_t)blockIdx.x * 32 + x) * W;
  const int64_t r0 = (int64_t)blockIdx.y * rpc, r1 = r0 + rpc < rows ? r0 + rpc : rows;
  float s[W];
#pragma unroll
  for (int k = 0; k < W; k++) s[k] = 0.0f;
  if (c0 < cols) {
#pragma unroll 4
    for (int64_t r = r0 + g; r < r1; r += CS_GROUPS) {
      if constexpr (W == 4) {
        const float4 v = *reinterpret_cast<const float4 *>(a + r * cols + c0);
        s[0] += v.x;
        s[1] += v.y;
        s[2] += v.z;
        s[3] += v.w;
      } else {
        s[0] += a[r * cols + c0];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < W; k++) sh[g][x * W + k] = s[k];
  __syncthreads();
  for (int j = g * 32 + x; j < 32 * W; j += 32 * CS_GROUPS) {
    const int64_t col = (int64_t)blockIdx.x * 32 * W + j;
    if (col >= cols) continue;
    float t = sh[0][j];
    for (int q = 1; q < CS_GROUPS; q++) t += sh[q][j];
    part[(int64_t)blockIdx.y * cols + col] = t;
  }
}

/* stage 2: out[col] = sum of part[k, col] over the bands k in order */
__global__ void __launch_bounds__(TPB)
    colsum_final_k(const float *__restrict__ part, int64_t chunks, int64_t cols,
                   float *__restrict__ out) {
  for (int64_t c = blockIdx.x * (int64_t)TPB + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * TPB) {
    float t = 0.0f;
#pragma unroll 8
    for (int64_t k = 0; k < chunks; k++) t += part[k * cols + c];
    out[c] = t;
  }
}

/* Column sums of a [rows, cols] matrix into out (scratch: cs_chunks(...) * cols floats). */
void colsum_launch(const float *a, int64_t rows, int64_t cols, float *out, float *scratch,
                   cudaStream_t s) {
  const int64_t chunks = cs_chunks(rows, cols, CS_TILE), rpc = (rows + chunks - 1) / chunks;
  float *part = chunks == 1 ? out : scratch;
  const dim3 block(32, CS_GROUPS);
  if (cols % 4 == 0 && aligned16(a, a)) {
    const dim3 grid((unsigned)((cols + CS_TILE - 1) / CS_TILE), (unsigned)chunks);
    colsum_part_k<4><<<grid, block, 0, s>>>(a, rows, cols, rpc, part);
  } else {
    const dim3 grid((unsigned)((cols + 31) / 32), (unsigned)chunks);
    colsum_part_k<1><<<grid, block, 0, s>>>(a, rows, cols, rpc, part);
  }
  if (chunks > 1) colsum_final_k<<<grid_for(cols), TPB, 0, s>>>(part, chunks, cols, out);
}

/* Embedding gradient, stage 1: the rows of dx ([rows, E], one token per row) cut into bands as
   above; a block owns EB_COLS columns of a band, row group g sums rows g, g + CS_GROUPS, ... in
   order into its own accumulator of the row's token, then the groups' accumulators are added in
   order into part[band, v, col]. Stage 2 is colsum_final_k over part viewed as [bands, V*E]. A
   token outside [0, V) adds nothing (it has no row of the table). */
constexpr int EB_COLS = 32;
__global__ void __launch_bounds__(EB_COLS * CS_GROUPS)
    embed_bwd_part_k(const float *__restrict__ dx, const int32_t *__restrict__ tok, int64_t rows,
                     int E, int64_t rpc, float *__restrict__ part) {
  __shared__ float acc[CS_GROUPS][TRAIN_V][EB_COLS];
  const int c = threadIdx.x, g = threadIdx.y;
  const int64_t col = (int64_t)blockIdx.x * EB_COLS + c;
  for (int v = 0; v < TRAIN_V; v++) acc[g][v][c] = 0.0f;   /* the thread's own slots */
  const int64_t r0 = (int64_t)blockIdx.y * rpc, r1 = r0 + rpc < rows ? r0 + rpc : rows;
  if (col < E) {
#pragma unroll 4
    for (int64_t r = r0 + g; r < r1; r += CS_GROUPS) {
      const int32_t v = tok[r];
      const float d = dx[r * E + col];
      if ((uint32_t)v < (uint32_t)TRAIN_V) acc[g][v][c] += d;
    }
  }
  __syncthreads();
  if (col >= E) return;
  for (int v = g; v < TRAIN_V; v += CS_GROUPS) {
    float t = acc[0][v][c];
    for (int q = 1; q < CS_GROUPS; q++) t += acc[q][v][c];
    part[((int64_t)blockIdx.y * TRAIN_V + v) * E + col] = t;
  }
}

/* Cross-entropy: one thread per row (train_xent_row in double, as on the CPU) writes the row's
   loss term to row_loss (scratch) and its gradient row; then one block sums the terms of rows
   [0, n_valid): thread t takes rows t, t + XS, ... in order, then a fixed tree. */
constexpr int XB = 128, XS = 1024;
__global__ void __launch_bounds__(XB)
    xent_rows_k(const float *__restrict__ logits, const float *__restrict__ bias,
                const int32_t *__restrict__ tgt, int64_t B, int64_t n_valid, int V, int Vpad,
                double *__restrict__ row_loss, float *__restrict__ dlogits, float *amax) {
  const float inv = n_valid > 0 ? 1.0f / (float)n_valid : 0.0f;
  const int64_t b = blockIdx.x * (int64_t)XB + threadIdx.x;
  float m = 0.0f;
  if (b < B) {
    float *d = dlogits ? dlogits + b * Vpad : nullptr;
    if (b < n_valid) {
      row_loss[b] = train_xent_row(logits + b * Vpad, bias, tgt[b], V, Vpad, inv, d);
      if (d && amax)
        for (int v = 0; v < Vpad; v++) m = train_amax_step(m, d[v]);
    } else if (d) {
      for (int v = 0; v < Vpad; v++) d[v] = 0.0f;
    }
  }
  if (amax) amax_commit(m, amax);
}

/* The same rows, one warp each when the vocabulary fits a warp (V <= 32): lane v takes class v
   (and the padded columns v + 32, v + 64, ...). The row's maximum and its sum of exponentials
   are still taken in class order (every lane folds the warp's values by shuffles, v = 0 ..
   V-1), so each row's term and gradient are
   train_xent_row's bits; the exponentials, the long part of a row, run side by side, and the
   gradient row is stored coalesced instead of by one thread. */
constexpr int XW = XB / 32; /* rows per block */
__global__ void __launch_bounds__(XB)
    xent_warp_k(const float *__restrict__ logits, const float *__restrict__ bias,
                const int32_t *__restrict__ tgt, int64_t B, int64_t n_valid, int V, int Vpad,
                double *__restrict__ row_loss, float *__restrict__ dlogits, float *amax) {
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x * (int64_t)XW + (threadIdx.x >> 5);
  float m = 0.0f;
  if (b < B) {
    float *d = dlogits ? dlogits + b * Vpad : nullptr;
    if (b < n_valid) {
      const float inv = 1.0f / (float)n_valid;
      /* train_logit's sum */
      const float lv = lane < V ? logits[b * Vpad + lane] + bias[lane] : 0.0f;
      const int t = tgt[b];
      float mx = __shfl_sync(full, lv, 0);
      for (int v = 1; v < V; v++) {
        const float x = __shfl_sync(full, lv, v);
        mx = x > mx ? x : mx;
      }
      const double e = lane < V ? exp((double)(lv - mx)) : 0.0;
      double z = 0;
      for (int v = 0; v < V; v++) z += __shfl_sync(full, e, v);
      /* every lane has read its logit (the shuffles above wait for the whole warp) before any
         lane writes d, which may alias the logits */
      const float lt = __shfl_sync(full, lv, t & 31);
      if (lane == 0) row_loss[b] = log(z) + (double)mx - (double)lt;
      if (d)
        for (int v = lane; v < Vpad; v += 32) {
          float g = 0.0f; /* the padded columns [V, Vpad) */
          if (v < V) {    /* then v is this lane's class */
            g = (float)(e / z) * inv;
            if (v == t) g -= inv;
          }
          d[v] = g;
          if (amax) m = train_amax_step(m, g);
        }
    } else if (d) {
      for (int v = lane; v < Vpad; v += 32) d[v] = 0.0f;
    }
  }
  if (amax) amax_commit(m, amax);
}

__global__ void __launch_bounds__(XS)
    xent_sum_k(const double *__restrict__ row_loss, int64_t n_valid, float *__restrict__ loss) {
  __shared__ double part[XS];
  double sum = 0;
  for (int64_t b = threadIdx.x; b < n_valid; b += XS) sum += row_loss[b];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = XS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = (float)(n_valid > 0 ? part[0] / (double)n_valid : 0.0);
}

int cuda_embed_fwd(hq_ctx *ctx, const float *emb, const int32_t *tok, float *x, int64_t B, int C,
                   int E, float *amax) {
  cudaStream_t s;
  if (enter(ctx, &s, "embedding")) return -1;
  const int64_t n = B * C * E;
  if (E % 4 == 0 && aligned16(emb, x))
    embed_fwd_k<4><<<grid_for(n / 4), TPB, 0, s>>>(emb, tok, x, n, E, amax);
  else
    embed_fwd_k<1><<<grid_for(n), TPB, 0, s>>>(emb, tok, x, n, E, amax);
  return check("embedding kernel");
}

int cuda_embed_bwd(hq_ctx *ctx, const float *dx, const int32_t *tok, float *gemb, int64_t B,
                   int C, int E, void *scratch) {
  cudaStream_t s;
  if (enter(ctx, &s, "embedding gradient")) return -1;
  /* dx viewed as [B*C, E] with one token per row */
  const int64_t rows = B * C, chunks = cs_chunks(rows, E, EB_COLS);
  const int64_t rpc = (rows + chunks - 1) / chunks;
  float *part = chunks == 1 ? gemb : (float *)scratch;
  const dim3 grid((unsigned)((E + EB_COLS - 1) / EB_COLS), (unsigned)chunks),
      block(EB_COLS, CS_GROUPS);
  embed_bwd_part_k<<<grid, block, 0, s>>>(dx, tok, rows, E, rpc, part);
  if (chunks > 1)
    colsum_final_k<<<grid_for((int64_t)TRAIN_V * E), TPB, 0, s>>>(part, chunks,
                                                                  (int64_t)TRAIN_V * E, gemb);
  return check("embedding gradient kernel");
}

/* the activation kernels' launch: float4 steps when a row is whole float4s and every buffer
   is 16-byte aligned */
int act_launch(bool fwd, int act, const float *y, const float *bias, int64_t cols, float *out,
               int64_t n, float *amax, cudaStream_t s) {
  if (cols < 1 || n % cols) {
    snprintf(g_err, sizeof g_err, "activation: %lld elements are not rows of %lld",
             (long long)n, (long long)cols);
    return -1;
  }
  const bool v4 = cols % 4 == 0 && aligned16(y, out) && aligned16(bias, bias);
  if (fwd && v4) act_k<true, 4><<<grid_for(n / 4), TPB, 0, s>>>(act, y, bias, cols, out, n, amax);
  else if (fwd) act_k<true, 1><<<grid_for(n), TPB, 0, s>>>(act, y, bias, cols, out, n, amax);
  else if (v4) act_k<false, 4><<<grid_for(n / 4), TPB, 0, s>>>(act, y, bias, cols, out, n, amax);
  else act_k<false, 1><<<grid_for(n), TPB, 0, s>>>(act, y, bias, cols, out, n, amax);
  return check(fwd ? "activation kernel" : "activation gradient kernel");
}

int cuda_act_fwd(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols, float *h,
                 int64_t n, float *amax) {
  cudaStream_t s;
  if (enter(ctx, &s, "activation")) return -1;
  return act_launch(true, act, y, bias, cols, h, n, amax, s);
}

int cuda_act_bwd(hq_ctx *ctx, int act, const float *y, const float *bias, int64_t cols, float *d,
                 int64_t n, float *amax) {
  cudaStream_t s;
  if (enter(ctx, &s, "activation gradient")) return -1;
  return act_launch(false, act, y, bias, cols, d, n, amax, s);
}

int cuda_xent(hq_ctx *ctx, const float *logits, const float *bias, const int32_t *tgt, int64_t B,
              int64_t n_valid, int V, int Vpad, float *loss, float *dlogits, float *amax,
              void *scratch) {
  cudaStream_t s;
  if (enter(ctx, &s, "cross-entropy")) return -1;
  if (V >= 1 && V <= 32)
    xent_warp_k<<<(unsigned)((B + XW - 1) / XW), XB, 0, s>>>(logits, bias, tgt, B, n_valid, V,
                                                             Vpad, (double *)scratch, dlogits,
                                                             dlogits ? amax : nullptr);
  else
    xent_rows_k<<<(unsigned)((B + XB - 1) / XB), XB, 0, s>>>(logits, bias, tgt, B, n_valid, V,
                                                             Vpad, (double *)scratch, dlogits,
                                                             dlogits ? amax : nullptr);
  xent_sum_k<<<1, XS, 0, s>>>((const double *)scratch, n_valid, loss);
  return check("cross-entropy kernel");
}

int cuda_colsum(hq_ctx *ctx, const float *dy, int64_t B, int64_t n, float *db, void *scratch) {
  cudaStream_t s;
  if (enter(ctx, &s, "bias gradient")) return -1;
  colsum_launch(dy, B, n, db, (float *)scratch, s);
  return check("bias gradient kernel");
}

/* the most any call above uses: the loss terms (B doubles), a bias gradient's bands
   (at most CS_CHUNKS_MAX x widest) or the embedding gradient's (CS_CHUNKS_MAX x V x E) */
size_t cuda_scratch_bytes(int64_t B, int C, int E, int64_t widest) {
  (void)C;
  size_t n = (size_t)B * sizeof(double);
  const size_t cs = (size_t)CS_CHUNKS_MAX * (size_t)widest * sizeof(float);
  const size_t eb = (size_t)CS_CHUNKS_MAX * TRAIN_V * (size_t)E * sizeof(float);
  if (cs > n) n = cs;
  if (eb > n) n = eb;
  return n;
}

const char *cuda_error(void) { return g_err; }

/* The batch from page-locked host memory, read in place through its device mapping (under
   unified addressing a cudaMallocHost pointer is the device's too): 4-byte reads over the bus,
   as many in flight as the grid has threads; a span without a source is zeroed. */
struct UploadSpans {
  train_span s[TRAIN_UPLOAD_SPANS];
};

__global__ void __launch_bounds__(TPB) upload_k(UploadSpans sp, int64_t total) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i;
    int k = 0;
    while (j >= sp.s[k].n) j -= sp.s[k++].n;   /* the spans' counts sum to total */
    sp.s[k].dst[j] = sp.s[k].src ? sp.s[k].src[j] : 0;
  }
}

int cuda_upload_mapped(hq_ctx *ctx, const train_span *span, int n_span) {
  cudaStream_t s;
  if (n_span < 0 || n_span > TRAIN_UPLOAD_SPANS) {
    snprintf(g_err, sizeof g_err, "the upload: %d spans, at most %d", n_span, TRAIN_UPLOAD_SPANS);
    return -1;
  }
  if (enter(ctx, &s, "the upload")) return -1;
  UploadSpans sp = {};
  int64_t total = 0;
  for (int k = 0; k < n_span; k++) {
    if (span[k].n < 0) {
      snprintf(g_err, sizeof g_err, "the upload: span %d has %lld words", k, (long long)span[k].n);
      return -1;
    }
    sp.s[k] = span[k];
    total += span[k].n;
  }
  if (total == 0) return 0;
  upload_k<<<grid_for(total), TPB, 0, s>>>(sp, total);
  return check("the upload kernel");
}

const train_device_ops cuda_ops = {
    "cuda",      cuda_embed_fwd, cuda_embed_bwd, cuda_act_fwd, cuda_act_bwd, cuda_xent,
    cuda_colsum, cuda_error,     cuda_scratch_bytes, cuda_upload_mapped,
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

extern "C" int train_cuda_graph_mem(int device, int reset, uint64_t *used, uint64_t *high) {
  *used = *high = 0;
  uint64_t zero = 0;
  cudaError_t e = cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, used);
  if (e == cudaSuccess && reset)
    e = cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero);
  if (e == cudaSuccess)
    e = cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, high);
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  *used = *high = 0;
  return -1;
}

// --- the step's CUDA graph (loop.c) -------------------------------------------------------------

struct train_graph {
  cudaGraphExec_t exec;
  int nodes[TRAIN_GRAPH_NODE_KINDS];
};

/* 0, or -1 with "what: CUDA's message" in err (the error cleared: none of these is sticky) */
static int graph_check(cudaError_t e, const char *what, char *err, size_t err_len) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

extern "C" int train_cuda_stream_create(int device, void **stream, char *err, size_t err_len) {
  *stream = nullptr;
  int cur = -1;
  if (graph_check(cudaGetDevice(&cur), "cudaGetDevice", err, err_len)) return -1;
  if (cur != device && graph_check(cudaSetDevice(device), "cudaSetDevice", err, err_len))
    return -1;
  cudaStream_t s = nullptr;
  /* non-blocking: the legacy default stream, which other code may use, never joins the work
     a capture records */
  const int rc = graph_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags", err, err_len);
  if (cur != device) cudaSetDevice(cur);
  *stream = s;
  return rc;
}

extern "C" void train_cuda_stream_destroy(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

/* `device` current for the call (the caller's put back by graph_leave) */
static int graph_enter(int device, int *cur, char *err, size_t err_len) {
  *cur = -1;
  if (graph_check(cudaGetDevice(cur), "cudaGetDevice", err, err_len)) return -1;
  return *cur != device && graph_check(cudaSetDevice(device), "cudaSetDevice", err, err_len);
}
static void graph_leave(int device, int cur) {
  if (cur >= 0 && cur != device) cudaSetDevice(cur);
}

extern "C" int train_cuda_order_event(int device, void **ev, char *err, size_t err_len) {
  *ev = nullptr;
  int cur;
  cudaEvent_t e = nullptr;
  int rc = graph_enter(device, &cur, err, err_len);
  if (!rc)
    rc = graph_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                     "cudaEventCreateWithFlags", err, err_len);
  graph_leave(device, cur);
  *ev = e;
  return rc;
}

extern "C" void train_cuda_order_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int train_cuda_order_mark(void *ev, void *from, char *err, size_t err_len) {
  return graph_check(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)from), "cudaEventRecord",
                     err, err_len);
}

extern "C" int train_cuda_order_wait(void *ev, void *to, char *err, size_t err_len) {
  return graph_check(cudaStreamWaitEvent((cudaStream_t)to, (cudaEvent_t)ev, 0),
                     "cudaStreamWaitEvent", err, err_len);
}

extern "C" int train_cuda_order_mark_external(void *ev, void *from, char *err, size_t err_len) {
  return graph_check(cudaEventRecordWithFlags((cudaEvent_t)ev, (cudaStream_t)from,
                                              cudaEventRecordExternal),
                     "cudaEventRecordWithFlags", err, err_len);
}

extern "C" int train_cuda_order_sync(void *ev, char *err, size_t err_len) {
  return graph_check(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize", err,
                     err_len);
}

extern "C" int train_graph_begin(int device, void *stream, char *err, size_t err_len) {
  int cur;
  int rc = graph_enter(device, &cur, err, err_len);
  if (!rc)
    rc = graph_check(cudaStreamBeginCapture((cudaStream_t)stream,
                                            cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture", err, err_len);
  graph_leave(device, cur);
  return rc;
}

/* counts[k] += the nodes of `graph` of each kind k (TRAIN_GRAPH_*, device.h) */
static int graph_count(cudaGraph_t graph, int *counts, char *err, size_t err_len) {
  size_t n = 0;
  if (graph_check(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes", err, err_len))
    return -1;
  if (!n) return 0;
  cudaGraphNode_t *nodes = new (std::nothrow) cudaGraphNode_t[n];
  if (!nodes) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  int rc = graph_check(cudaGraphGetNodes(graph, nodes, &n), "cudaGraphGetNodes", err, err_len);
  for (size_t i = 0; !rc && i < n; i++) {
    cudaGraphNodeType t;
    rc = graph_check(cudaGraphNodeGetType(nodes[i], &t), "cudaGraphNodeGetType", err, err_len);
    if (rc) break;
    counts[t == cudaGraphNodeTypeKernel   ? TRAIN_GRAPH_KERNELS
           : t == cudaGraphNodeTypeMemcpy ? TRAIN_GRAPH_COPIES
           : t == cudaGraphNodeTypeMemset ? TRAIN_GRAPH_MEMSETS
           : t == cudaGraphNodeTypeMemAlloc || t == cudaGraphNodeTypeMemFree
               ? TRAIN_GRAPH_ALLOCS
               : TRAIN_GRAPH_OTHER]++;
  }
  delete[] nodes;
  return rc;
}

static int graph_end(void *stream, int ok, const char *dot, train_graph **out, char *err,
                     size_t err_len) {
  cudaGraph_t graph = nullptr;
  /* ended in every case, so that the stream takes eager work again */
  const cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &graph);
  if (!ok) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return 0;
  }
  if (graph_check(e, "cudaStreamEndCapture", err, err_len)) {
    if (graph) cudaGraphDestroy(graph);
    return -1;
  }
  int counts[TRAIN_GRAPH_NODE_KINDS] = {0};
  if (graph_count(graph, counts, err, err_len)) {
    cudaGraphDestroy(graph);
    return -1;
  }
  /* --graph-dot: the graph as captured, every node with its parameters */
  if (dot && graph_check(cudaGraphDebugDotPrint(graph, dot, cudaGraphDebugDotFlagsVerbose),
                         "cudaGraphDebugDotPrint", err, err_len)) {
    const size_t n = strlen(err);
    snprintf(err + n, err_len - n, " (--graph-dot %s)", dot);
    cudaGraphDestroy(graph);
    return -1;
  }
  cudaGraphExec_t exec = nullptr;
  const int rc = graph_check(cudaGraphInstantiateWithFlags(&exec, graph, 0),
                             "cudaGraphInstantiate", err, err_len);
  cudaGraphDestroy(graph);
  if (rc) return -1;
  train_graph *g = new (std::nothrow) train_graph;
  if (!g) {
    cudaGraphExecDestroy(exec);
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  g->exec = exec;
  memcpy(g->nodes, counts, sizeof counts);
  *out = g;
  return 0;
}

extern "C" int train_graph_end(int device, void *stream, int ok, const char *dot,
                               train_graph **out, char *err, size_t err_len) {
  *out = nullptr;
  int cur;
  int rc = graph_enter(device, &cur, err, err_len);
  /* the capture is ended even when the device could not be selected: that is the thread's */
  const int rc2 = graph_end(stream, ok && !rc, dot, out, err, err_len);
  graph_leave(device, cur);
  return rc ? -1 : rc2;
}

extern "C" int train_graph_launch(int device, train_graph *g, void *stream, char *err,
                                  size_t err_len) {
  int cur;
  int rc = graph_enter(device, &cur, err, err_len);
  if (!rc)
    rc = graph_check(cudaGraphLaunch(g->exec, (cudaStream_t)stream), "cudaGraphLaunch", err,
                     err_len);
  graph_leave(device, cur);
  return rc;
}

extern "C" void train_graph_nodes(const train_graph *g, int *counts) {
  memcpy(counts, g->nodes, sizeof g->nodes);
}

extern "C" void train_graph_free(train_graph *g) {
  if (!g) return;
  cudaGraphExecDestroy(g->exec);
  delete g;
}

extern "C" int train_cuda_host_alloc(int device, size_t bytes, void **out, char *err,
                                     size_t err_len) {
  *out = nullptr;
  int cur;
  int rc = graph_enter(device, &cur, err, err_len);
  if (!rc) rc = graph_check(cudaMallocHost(out, bytes ? bytes : 1), "cudaMallocHost", err, err_len);
  graph_leave(device, cur);
  if (rc) *out = nullptr;
  return rc;
}

extern "C" void train_cuda_host_free(void *p) {
  if (p) cudaFreeHost(p);
}
