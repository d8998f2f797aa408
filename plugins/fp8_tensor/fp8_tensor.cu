/*
** fp8_tensor.cu -- CUDA kernels of the fp8_tensor plugin: amax reduction, fused cast +
** transpose, dequantize (also raw, HQ_CALL_DEQ_RAW: the codes' values without scale_inv), and
** the tensor_factor copy of scale_inv. Element rules come from hq/numerics.h and the scale rule
** from plugins/common/fp8_scale.h, the same code the CPU reference runs, so the bytes agree bit
** for bit.
**
** Every launch, memset and copy is queued on call->stream; nothing allocates (no scratch) and
** nothing synchronizes, so quantize/update can be captured in a CUDA graph.
**
** amax op:  the amax pass writes out[0] (or out[1] for a columnwise-only request; the other
**           float zeroed first), both floats when both directions are asked for.
** quantize: (1) amax pass, skipped when the caller passes call->amax: max|x| ignoring NaN
**           (amax_cuda.h's flat pass, which nvfp4 shares: any alignment, any n; one cluster's
**           kernel on a small tensor, else a memset and atomicMax on the FP32 bits) into the
**           storage's amax buffer;
**           (2) cast kernel: each block recomputes the scale from that amax -- or from the
**           caller's (fp8t_one_amax) -- (a few flops), then quantizes a tile read once from
**           global memory, writes the rowwise bytes and the transposed columnwise bytes
**           (transposed in registers, or through shared memory in the scalar kernel).
** Fast path (rows % 8 == 0, cols % 8 == 0, 16-byte aligned pointers): an 8x8 block per thread,
** 8 elements per 16-byte (bf16/f16) or 2x16-byte (f32) load, 8-byte stores of both copies, the
** transpose in registers (byte permutes); the rowwise codes alone (nothing to transpose, no
** optimizer step) a thread per 8 consecutive elements instead. Otherwise a scalar 32x32-tile
** kernel. All compute every byte with the same hq/numerics.h rules.
** Delayed scaling (fp8_tensor_rules.h): no amax pass; every block reads the scale from the
** slice's state, block (0,0) writes scale_inv, and each block atomically maxes its tile's max|x|
** (NaN ignored, on the FP32 bits) into the storage's amax (zeroed first) and the slice's amax.
** update_state: one kernel per group of slices, one block per slice (fp8t_delayed_update's rule).
** The fused optimizer write-back (HQ_CAP_FUSED_ADAM, delayed scaling only: its scale does not
** depend on the new master): the cast kernels apply one AdamW step (hq_adam_elem) to each
** element of the FP32 master as they read it, write master, m and v back and cast the new value.
*/
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "adam_cuda.h"
#include "amax_cuda.h"
#include "cuda_check.h"
#include "fp8_cvt_cuda.h"
#include "hp_load_cuda.h"
#include "hq/adamw.h"
#include "hq/numerics.h"
#include "fp8_scale.h"
#include "fp8_tensor.h"
#include "fp8_tensor_rules.h"

namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8; /* block = 32 x 8 threads, 4 rows each */

/* --- fast path ---------------------------------------------------------------------------- */
constexpr int kVTile = 128;    /* 128x128 tile, 256 threads, an 8x8 block per thread */
/* A tensor of fewer 128x128 tiles than this takes 64x64 tiles of 64 threads (the same 8x8
   block per thread): four times the CTAs, so that a small tensor's work spreads over about a
   wave of SMs (H100 / H200: 132) instead of waiting on a few. */
constexpr int64_t kVSmallTiles = 128;
/* The fused write-back's threads per SM that hide their loads' latency (half the SM's 2048):
   a smaller tensor has its step split off (fp8t_cuda_quantize). */
constexpr int kFusedThreadsPerSM = 1024;

/* The vector kernel's tile edge T for an M x K tensor (T x T tiles of T * T / 64 threads). */
int vec_tile(int64_t M, int64_t K) {
  const int64_t tiles = ((M + kVTile - 1) / kVTile) * ((K + kVTile - 1) / kVTile);
  return tiles < kVSmallTiles ? 64 : kVTile;
}

struct CastArgs {
  const void *x;
  int64_t M, K;
  uint8_t *row, *col;
  const float *acc;    /* the amax pass's result, or NULL with `given` */
  const float *given;  /* the caller's amax[2] (device memory), or NULL */
  uint32_t dirs;       /* the directions made (for fp8t_one_amax) */
  float *scale_inv_out[2], *amax_out[2];
  int elem, pow2;      /* elem: HQ_E4M3 / HQ_E5M2 */
  int row_major;       /* the vector kernel's tiles in row-major order (blockIdx.x along K) */
  float epsilon;
  const float *state;  /* delayed scaling: the slice's state (scale = state[0]), else NULL */
  float *state_amax;   /* delayed: the slice's amax; acc_out: the storage's (zeroed) amax */
  float *acc_out;
  /* the fused optimizer step (kernels with GT != 0; delayed scaling only): x is the FP32
     master, rewritten with m and v before its new value is cast */
  const void *g;
  float *m, *v;
  hq_adam_consts k;
  const hq_adam_consts *kd; /* ABI 2.6: NULL, or k in device memory, read as the kernel runs */
  /* ABI 2.6 copy_out (an F32 x, GT == 0): NULL, or where every element also goes as copy_dt */
  void *copy;
  int copy_dt;
};

/* x[0..8) stored at copy[i..i + 8) as CT (HQ_BF16 or HQ_F16: hq_pack2_hp16, hq_store_hp's rule
   and the core's convert's), one 16-byte store: i % 8 == 0, copy 16-byte aligned. CT is a
   template parameter: with the dtype chosen at run time the compiler computed both conversions
   of every element. */
template <int CT>
__device__ __forceinline__ void store_copy8(void *copy, int64_t i, const float x[8]) {
  uint32_t u[4];
#pragma unroll
  for (int k = 0; k < 4; k++) u[k] = hq_pack2_hp16(x[2 * k], x[2 * k + 1], CT);
  uint4 *p = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(copy) + i);
  *p = make_uint4(u[0], u[1], u[2], u[3]);
}

/* One AdamW step (hq_adam_elem) on master element i, whose value w this thread alone has read:
   master, m and v are written back and the new value returned for the cast. */
template <int GT>
__device__ __forceinline__ float adam_at(const CastArgs &a, int64_t i, float w) {
  float m = a.m[i], v = a.v[i];
  hq_adam_elem(&a.k, hq_load_hp(a.g, i, GT), &w, &m, &v);
  static_cast<float *>(const_cast<void *>(a.x))[i] = w;
  a.m[i] = m;
  a.v[i] = v;
  return w;
}

/* The same for the 8 elements from i of the fast path (m, v and g 16-byte aligned, i % 8 == 0). */
template <int GT>
__device__ __forceinline__ void adam_at8(const CastArgs &a, int64_t i, float w[8]) {
  float g[8];
  hq_cuda_load8<GT>(a.g, i, true, g);
  float4 *mp = reinterpret_cast<float4 *>(a.m + i), *vp = reinterpret_cast<float4 *>(a.v + i);
  float4 *wp = reinterpret_cast<float4 *>(static_cast<float *>(const_cast<void *>(a.x)) + i);
  #pragma unroll
  for (int h = 0; h < 2; h++) {
    float4 m4 = mp[h], v4 = vp[h];
    float m[4] = {m4.x, m4.y, m4.z, m4.w}, v[4] = {v4.x, v4.y, v4.z, v4.w};
    #pragma unroll
    for (int e = 0; e < 4; e++) hq_adam_elem(&a.k, g[4 * h + e], &w[4 * h + e], &m[e], &v[e]);
    mp[h] = make_float4(m[0], m[1], m[2], m[3]);
    vp[h] = make_float4(v[0], v[1], v[2], v[3]);
    wp[h] = make_float4(w[4 * h], w[4 * h + 1], w[4 * h + 2], w[4 * h + 3]);
  }
}

/* The scale of a cast kernel's block, from the amax; block (0,0) also writes scale_inv and amax
   of each storage. `given` may even be a storage's own amax buffer: block (0,0) then writes the
   value the other blocks compute from it again (fp8t_one_amax of it is the same). */
__device__ float block_scale(const CastArgs &a) {
  __shared__ float s_scale;
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float amax = 0.0f, scale;
    if (a.state) {
      scale = a.state[0]; /* delayed: from earlier steps */
    } else {
      amax = a.given ? fp8t_one_amax(a.dirs, a.given) : *a.acc;
      scale = hq_scale_from_amax(amax, hq_fp8_max(a.elem), a.pow2, a.epsilon, FLT_MAX);
    }
    s_scale = scale;
    if (blockIdx.x == 0 && blockIdx.y == 0) {
      float scale_inv = hq_rcp_rn(scale);
      for (int d = 0; d < 2; d++) {
        if (a.scale_inv_out[d]) *a.scale_inv_out[d] = scale_inv;
        if (a.amax_out[d]) *a.amax_out[d] = amax;
      }
    }
  }
  __syncthreads();
  return s_scale;
}

template <int DT, int GT>
__global__ void cast_transpose_kernel(CastArgs a) {
  if (GT != 0 && a.kd) a.k = *a.kd; /* a graph's replay: this step's constants */
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float scale = block_scale(a);
  const int64_t i0 = (int64_t)blockIdx.x * kTile, j0 = (int64_t)blockIdx.y * kTile;
  const int64_t j = j0 + threadIdx.x;
  float m = 0.0f; /* delayed scaling's block amax, NaN ignored (the vector kernel's step) */
  for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
    const int64_t i = i0 + r;
    if (i < a.M && j < a.K) {
      float x = hq_load_hp(a.x, i * a.K + j, DT);
      if constexpr (GT != 0) x = adam_at<GT>(a, i * a.K + j, x);
      if constexpr (DT == HQ_F32 && GT == 0)
        if (a.copy) hq_store_hp(a.copy, i * a.K + j, a.copy_dt, x);
      if (a.state) m = hq_cuda_amax_step(m, x); /* under delayed scaling only */
      uint8_t q = hq_fp8_quantize(x, scale, a.elem);
      if (a.row) a.row[i * a.K + j] = q;
      tile[r][threadIdx.x] = q;
    }
  }
  /* delayed scaling: the block's max |x| (NaN ignored) into the storage's amax and the slice's
     -- fp8t_amax_accumulate for every block, the whole tensor's amax in any block order */
  if (a.state) hq_cuda_cta_atomic_max(__float_as_uint(m), a.acc_out, a.state_amax);
  if (!a.col) return;
  __syncthreads();
  const int64_t ii = i0 + threadIdx.x;
  for (int c = threadIdx.y; c < kTile; c += kRowsPerPass) {
    const int64_t jj = j0 + c;
    if (ii < a.M && jj < a.K) a.col[jj * a.M + ii] = tile[threadIdx.x][c];
  }
}

/* Fast path: a thread owns an 8x8 block (M and K are multiples of 8, so a block lies wholly
   inside the tensor or wholly outside), reads its 8 rows (one 16-byte load each for 16-bit
   inputs), writes each row's 8 codes (8 bytes) and the block transposed in registers (byte
   permutes) as 8 columns of 8 codes; no shared memory but the scale's. A warp covers 32 rows x
   64 columns (lane: 8 column groups x 4 row groups), so a load instruction reads 128
   contiguous bytes per row, a rowwise store writes 64 per row and a columnwise store whole
   32-byte sectors; the CTA's warps tile T x T (T = 128: 8 warps, 2 across and 4 down; T = 64
   for small tensors: 2 warps, one above the other), the tiles in row-major order (blockIdx.x
   along K) unless there are more than 65535 row tiles. */
template <int DT, int GT, int T, int CT = 0>
__global__ void __launch_bounds__(T * T / 64) cast_transpose_vec_kernel(CastArgs a) {
  if (GT != 0 && a.kd) a.k = *a.kd; /* a graph's replay: this step's constants */
  constexpr int kColWarps = T / 64;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const unsigned bi = a.row_major ? blockIdx.y : blockIdx.x;
  const unsigned bj = a.row_major ? blockIdx.x : blockIdx.y;
  const int64_t i = (int64_t)bi * T + (warp / kColWarps) * 32 + (lane >> 3) * 8;
  const int64_t j = (int64_t)bj * T + (warp % kColWarps) * 64 + (lane & 7) * 8;
  const bool in = i < a.M && j < a.K;
  float x[8][8];
  if (in)
#pragma unroll
    for (int r = 0; r < 8; r++) hq_cuda_load8<DT>(a.x, (i + r) * a.K + j, true, x[r]);
  const float scale = block_scale(a); /* every thread: it synchronizes the CTA */
  /* delayed scaling's block amax, taken only under delayed scaling: a chain of fmaxf (IEEE
     maxNum: a NaN operand gives the other) started at 0 is max |x| with NaN ignored, whose bits
     are the integer max of hq_abs_bits_nonan over the same elements, in one instruction per
     element where that max takes four; the other scalings skip it */
  float m = 0.0f;
  uint2 q[8];
  if (in) {
#pragma unroll
    for (int r = 0; r < 8; r++) {
      if constexpr (GT != 0) adam_at8<GT>(a, (i + r) * a.K + j, x[r]);
      if constexpr (CT != 0) store_copy8<CT>(a.copy, (i + r) * a.K + j, x[r]);
      if (a.state)
        for (int k = 0; k < 8; k++) m = hq_cuda_amax_step(m, x[r][k]);
      q[r] = a.elem == HQ_E5M2 ? hq_cuda_cast8<HQ_E5M2>(x[r], scale)
                                 : hq_cuda_cast8<HQ_E4M3>(x[r], scale);
      if (a.row) *reinterpret_cast<uint2 *>(a.row + (i + r) * a.K + j) = q[r];
    }
  }
  /* delayed scaling: as in cast_transpose_kernel */
  if (a.state) hq_cuda_cta_atomic_max(__float_as_uint(m), a.acc_out, a.state_amax);
  if (!in || !a.col) return;
  uint32_t lo[8], hi[8]; /* column c: rows 0-3 in lo[c], rows 4-7 in hi[c] */
  hq_cuda_transpose4x4(q[0].x, q[1].x, q[2].x, q[3].x, lo);
  hq_cuda_transpose4x4(q[0].y, q[1].y, q[2].y, q[3].y, lo + 4);
  hq_cuda_transpose4x4(q[4].x, q[5].x, q[6].x, q[7].x, hi);
  hq_cuda_transpose4x4(q[4].y, q[5].y, q[6].y, q[7].y, hi + 4);
#pragma unroll
  for (int c = 0; c < 8; c++)
    *reinterpret_cast<uint2 *>(a.col + (j + c) * a.M + i) = make_uint2(lo[c], hi[c]);
}

/* The rowwise codes alone (no columnwise codes, so nothing to transpose; no optimizer step; the
   identity copy beside them when CT is set): element-wise, a thread per 8 consecutive elements
   and a CTA per 2048, the load issued before the scale's barrier; under delayed scaling each
   CTA's max |x| goes out as the vector kernel's does. The vector kernel's 8 x 8 blocks exist
   for the transpose; without one, its few threads per SM (a 1024 x 1024 weight: 256 CTAs of
   64) left most of the device's warps idle. n8: the tensor's groups of 8 (M K % 8 == 0, every
   pointer 16-byte aligned). */
constexpr int kRowThreads = 256;
template <int DT, int CT = 0>
__global__ void __launch_bounds__(kRowThreads) cast_row_kernel(CastArgs a, int64_t n8) {
  const int64_t g = blockIdx.x * (int64_t)kRowThreads + threadIdx.x;
  const bool in = g < n8;
  float x[8];
  if (in) hq_cuda_load8<DT>(a.x, g * 8, true, x);
  const float scale = block_scale(a); /* every thread: it synchronizes the CTA */
  if (in) {
    if constexpr (CT != 0) store_copy8<CT>(a.copy, g * 8, x);
    *reinterpret_cast<uint2 *>(a.row + g * 8) = a.elem == HQ_E5M2
                                                    ? hq_cuda_cast8<HQ_E5M2>(x, scale)
                                                    : hq_cuda_cast8<HQ_E4M3>(x, scale);
  }
  if (!a.state) return;
  float m = 0.0f; /* delayed scaling: as in cast_transpose_vec_kernel */
  if (in)
    for (int k = 0; k < 8; k++) m = hq_cuda_amax_step(m, x[k]);
  hq_cuda_cta_atomic_max(__float_as_uint(m), a.acc_out, a.state_amax);
}

/* The value of one code: raw (scale_inv_p NULL, HQ_CALL_DEQ_RAW) or dequantized. */
__device__ __forceinline__ float code_value(uint8_t q, int raw, float scale_inv, int elem) {
  return raw ? fp8t_raw(q, elem) : hq_fp8_dequantize(q, scale_inv, elem);
}

/* The raw dequantize's folded factor (ABI 2.3): *f.out = RN(m * *f.scale_inv), m = *f.in or
   f.mul; f.out NULL: none. */
struct DeqFactor {
  float *out;
  const float *in;
  float mul;
  const float *scale_inv;
};
__device__ __forceinline__ void write_factor(const DeqFactor &f) {
  if (f.out) *f.out = hq_mul_rn(f.in ? *f.in : f.mul, *f.scale_inv);
}

/* dst[i][j] = q[i][j] * scale_inv (transposed = 0) or q[j][i] * scale_inv (transposed = 1),
   both through a shared tile so that reads and writes are coalesced; with scale_inv_p NULL the
   raw values q[.][.] (fp8t_raw). The first thread of the first CTA writes the folded factor. */
template <int DT>
__global__ void dequantize_kernel(const uint8_t *__restrict__ q, int transposed,
                                  const float *__restrict__ scale_inv_p, int elem, void *dst,
                                  int64_t M, int64_t K, DeqFactor fac) {
  __shared__ float tile[kTile][kTile + 1];
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
    write_factor(fac);
  const int raw = scale_inv_p == NULL;
  const float scale_inv = raw ? 1.0f : *scale_inv_p;
  const int64_t i0 = (int64_t)blockIdx.x * kTile, j0 = (int64_t)blockIdx.y * kTile;
  if (!transposed) {
    const int64_t j = j0 + threadIdx.x;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t i = i0 + r;
      if (i < M && j < K)
        hq_store_hp(dst, i * K + j, DT, code_value(q[i * K + j], raw, scale_inv, elem));
    }
    return;
  }
  const int64_t ii = i0 + threadIdx.x;
  for (int c = threadIdx.y; c < kTile; c += kRowsPerPass) {
    const int64_t jj = j0 + c;
    if (ii < M && jj < K) tile[threadIdx.x][c] = code_value(q[jj * M + ii], raw, scale_inv, elem);
  }
  __syncthreads();
  const int64_t j = j0 + threadIdx.x;
  for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
    const int64_t i = i0 + r;
    if (i < M && j < K) hq_store_hp(dst, i * K + j, DT, tile[r][threadIdx.x]);
  }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

int grid_for(const hq_call *call, int64_t M, int64_t K, dim3 *grid) {
  int64_t gx = (M + kTile - 1) / kTile, gy = (K + kTile - 1) / kTile;
  if (gx > 0x7fffffff || gy > 65535)
    return call->host->error(HQ_ESHAPE, "fp8_tensor CUDA: shape [%lld, %lld] exceeds the grid "
                             "limits (cols <= %d)", (long long)M, (long long)K, 65535 * kTile);
  *grid = dim3((unsigned)gx, (unsigned)gy);
  return HQ_OK;
}

/* The amax pass: max |x| of the n elements of x written into *acc and, if not NULL, *acc2:
   the stock plugins' shared pass (amax_cuda.h; vec: x 16-byte aligned). */
template <int DT>
int launch_amax(const hq_call *call, cudaStream_t stream, const void *x, int64_t n, int vec,
                float *acc, float *acc2 = NULL) {
  CHECK_CUDA(call, hq_cuda_amax<DT>(x, n, vec, acc, acc2, stream));
  return HQ_OK;
}

/* One block per slice, the history spread over its threads: one thread walking a 1024-row
   history serially (a dependent load and store per row) would take longer than a small model's
   whole step. The rule is fp8t_delayed_update's: the max over rows 1 .. L-1 and `last`
   ignores NaN and so does not depend on the order it is taken in; the roll moves each row up by
   one. A thread holds the new values of its rows in registers (at most FP8T_STATE_ROWS: the
   option caps the history at FP8T_HISTORY_MAX rows), so one barrier both orders every read of
   the history before any write and publishes the warps' maxima; the rows are read whatever the
   new amax, so that their loads and the amax's overlap instead of waiting for each other. */
#define FP8T_STATE_THREADS 256
#define FP8T_STATE_ROWS (FP8T_HISTORY_MAX / FP8T_STATE_THREADS)
static_assert(FP8T_STATE_ROWS * FP8T_STATE_THREADS == FP8T_HISTORY_MAX,
              "the update's threads hold every row of the longest history");
__global__ void __launch_bounds__(FP8T_STATE_THREADS)
    update_state_kernel(float *amax, float *state, int history_len, int most_recent,
                        float scaled_max) {
  __shared__ float warp_max[FP8T_STATE_THREADS / 32];
  float *st = state + (int64_t)blockIdx.x * history_len;
  const float last = amax[blockIdx.x];
  const int t = threadIdx.x;
  const bool roll = last != 0.0f; /* the same for the whole block */
  float v[FP8T_STATE_ROWS], m = 0.0f;
#pragma unroll
  for (int k = 0; k < FP8T_STATE_ROWS; k++) {
    const int i = t + k * FP8T_STATE_THREADS;
    v[k] = i < history_len - 1 ? st[i + 1] : last;
    if (roll && i < history_len) m = hq_fmax_nan_ignoring(m, v[k]);
  }
  for (int off = 16; off > 0; off >>= 1)
    m = hq_fmax_nan_ignoring(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((t & 31) == 0) warp_max[t >> 5] = m;
  __syncthreads();
  if (roll) {
#pragma unroll
    for (int k = 0; k < FP8T_STATE_ROWS; k++) {
      const int i = t + k * FP8T_STATE_THREADS;
      if (i >= 1 && i < history_len) st[i] = v[k];
    }
  }
  if (t == 0) {
    m = 0.0f;
    for (int w = 0; w < FP8T_STATE_THREADS / 32; w++) m = hq_fmax_nan_ignoring(m, warp_max[w]);
    if (most_recent) m = last;
    st[0] = fp8t_delayed_scale(m, st[0], scaled_max);
    if (roll) amax[blockIdx.x] = 0.0f;
  }
}

/* The vector kernel of T x T tiles; ct: the copy's dtype (HQ_BF16 / HQ_F16, an F32 source without
   the optimizer step: copy_out), else 0. */
template <int DT, int GT, int T>
void launch_vec(dim3 grid, cudaStream_t stream, const CastArgs &a, int ct) {
  constexpr int threads = T * T / 64;
  if constexpr (DT == HQ_F32 && GT == 0) {
    if (ct == HQ_F16) {
      cast_transpose_vec_kernel<DT, GT, T, HQ_F16><<<grid, threads, 0, stream>>>(a);
      return;
    }
    if (ct == HQ_BF16) {
      cast_transpose_vec_kernel<DT, GT, T, HQ_BF16><<<grid, threads, 0, stream>>>(a);
      return;
    }
  }
  cast_transpose_vec_kernel<DT, GT, T><<<grid, threads, 0, stream>>>(a);
}

template <int DT, int GT>
int quantize_t(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src,
               const float *given, uint8_t *row, uint8_t *col, float *scale_inv, float *amax,
               float *col_scale_inv, float *col_amax, const float *state, float *state_amax,
               const hq_adam_pass *adam, void *copy, int copy_dt) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t n = src->rows * src->cols;
  dim3 grid;
  int rc = grid_for(call, src->rows, src->cols, &grid);
  if (rc) return rc;
  const int vec = src->rows % 8 == 0 && src->cols % 8 == 0 && aligned16(src->data) &&
                  aligned16(row) && aligned16(col) && aligned16(copy) &&
                  (!adam || (aligned16(adam->grad) && aligned16(adam->m) && aligned16(adam->v)));
  float *acc = NULL;
  if (state) {
    /* delayed: the cast kernel accumulates the tensor's amax into the storage's amax buffer */
    given = NULL;
    acc = amax ? amax : col_amax;
    CHECK_CUDA(call, hq_cuda_zero_words(acc, NULL, NULL, stream));
  } else if (!given) {
    /* the storage's own amax buffer receives the amax pass (no scratch, no allocation) */
    acc = amax ? amax : col_amax;
    rc = launch_amax<DT>(call, stream, src->data, n, aligned16(src->data), acc);
    if (rc) return rc;
  }
  CastArgs a;
  a.x = src->data;
  a.M = src->rows;
  a.K = src->cols;
  a.row = row;
  a.col = col;
  a.acc = acc;
  a.given = given;
  a.dirs = (row ? HQ_ROWWISE : 0u) | (col ? HQ_COLWISE : 0u);
  a.scale_inv_out[0] = scale_inv;
  a.scale_inv_out[1] = col_scale_inv != scale_inv ? col_scale_inv : NULL;
  a.amax_out[0] = amax != acc ? amax : NULL;
  a.amax_out[1] = col_amax != acc && col_amax != amax ? col_amax : NULL;
  a.elem = cfg->elem;
  a.pow2 = cfg->pow2;
  a.epsilon = cfg->epsilon;
  a.state = state;
  a.state_amax = state_amax;
  a.acc_out = state ? acc : NULL;
  a.g = adam ? adam->grad : NULL;
  a.m = adam ? adam->m : NULL;
  a.v = adam ? adam->v : NULL;
  if (adam) a.k = adam->k;
  a.kd = hq_adam_pass_k_dev(adam);
  a.copy = copy;
  a.copy_dt = copy_dt;
  float *acc_copy = NULL; /* delayed: a second, distinct amax buffer gets the result after */
  if (state) {
    acc_copy = a.amax_out[1] ? a.amax_out[1] : a.amax_out[0];
    a.amax_out[0] = a.amax_out[1] = NULL;
  }
  const int64_t n8 = n / 8, row_ctas = (n8 + kRowThreads - 1) / kRowThreads;
  if (GT == 0 && vec && row && !col && row_ctas > 0 && row_ctas <= 0x7fffffff) {
    /* a copy comes with an F32 source only, as BF16 or F16 (copy_out's contract, checked by
       the caller; launch_vec's choice) */
    bool launched = false;
    if constexpr (DT == HQ_F32) {
      if (copy && copy_dt == HQ_F16) {
        cast_row_kernel<DT, HQ_F16><<<(unsigned)row_ctas, kRowThreads, 0, stream>>>(a, n8);
        launched = true;
      } else if (copy && copy_dt == HQ_BF16) {
        cast_row_kernel<DT, HQ_BF16><<<(unsigned)row_ctas, kRowThreads, 0, stream>>>(a, n8);
        launched = true;
      }
    }
    if (!launched) cast_row_kernel<DT><<<(unsigned)row_ctas, kRowThreads, 0, stream>>>(a, n8);
  } else if (vec) {
    const int T = vec_tile(src->rows, src->cols);
    const unsigned tm = (unsigned)((src->rows + T - 1) / T),
                   tk = (unsigned)((src->cols + T - 1) / T);
    /* row-major tile order wherever the grid's y limit allows: the CTAs running at once read
       whole rows */
    a.row_major = tm <= 65535;
    const dim3 vgrid = a.row_major ? dim3(tk, tm) : dim3(tm, tk);
    if (T == 64)
      launch_vec<DT, GT, 64>(vgrid, stream, a, copy ? copy_dt : 0);
    else
      launch_vec<DT, GT, kVTile>(vgrid, stream, a, copy ? copy_dt : 0);
  } else {
    cast_transpose_kernel<DT, GT><<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(a);
  }
  CHECK_LAUNCH(call, "cast-transpose kernel");
  if (acc_copy)
    CHECK_CUDA(call, cudaMemcpyAsync(acc_copy, acc, sizeof(float), cudaMemcpyDeviceToDevice,
                                     stream));
  return HQ_OK;
}

} // namespace

extern "C" int fp8t_cuda_amax(const hq_call *call, const hq_tensor *src, uint32_t dirs,
                              float *out) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  /* a direction not asked for reads 0, zeroed by a kernel (a memset node costs a captured step
     about twice as much); the asked ones are written by the pass alone */
  if ((dirs & HQ_BOTH) != HQ_BOTH)
    CHECK_CUDA(call, hq_cuda_zero_words((dirs & HQ_ROWWISE) ? NULL : out,
                                        (dirs & HQ_COLWISE) ? NULL : out + 1, NULL, stream));
  if (!(dirs & HQ_BOTH)) return HQ_OK;
  /* both directions: the pass writes both floats (no copy of one into the other) */
  float *acc = (dirs & HQ_ROWWISE) ? out : out + 1;
  float *acc2 = (dirs & HQ_BOTH) == HQ_BOTH ? out + 1 : NULL;
  const int64_t n = src->rows * src->cols;
  const int vec = aligned16(src->data); /* any n: the shared pass takes the tail */
  switch (src->dtype) {
  case HQ_F32: return launch_amax<HQ_F32>(call, stream, src->data, n, vec, acc, acc2);
  case HQ_F16: return launch_amax<HQ_F16>(call, stream, src->data, n, vec, acc, acc2);
  case HQ_BF16: return launch_amax<HQ_BF16>(call, stream, src->data, n, vec, acc, acc2);
  default: return call->host->error(HQ_EINVAL, "fp8_tensor CUDA: source dtype %d", (int)src->dtype);
  }
}

extern "C" int fp8t_cuda_quantize(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src,
                                  const float *given, uint8_t *row, uint8_t *col,
                                  float *scale_inv, float *amax, float *col_scale_inv,
                                  float *col_amax, const float *state, float *state_amax,
                                  const hq_adam_pass *adam, void *copy, int copy_dt) {
#define FP8T_Q(DT, GT)                                                                          \
  quantize_t<DT, GT>(cfg, call, src, given, row, col, scale_inv, amax, col_scale_inv, col_amax, \
                     state, state_amax, adam, copy, copy_dt)
  if (adam) {
    /* a tensor too small for the fused kernel's threads (64 elements each, in sequence) to fill
       the device: the step over every SM, then the plain cast of the new master */
    const int64_t M = src->rows, K = src->cols;
    const int T = vec_tile(M, K);
    const int64_t ctas = ((M + T - 1) / T) * ((K + T - 1) / T);
    if (!hq_cuda_fused_adam_fills(call->device, ctas, kFusedThreadsPerSM / (T * T / 64))) {
      CHECK_CUDA(call, hq_cuda_adam(adam, static_cast<float *>(src->data), M * K,
                                    (cudaStream_t)call->stream));
      adam = NULL;
    }
  }
  if (adam) { /* the fused optimizer step: src is the FP32 master (checked in fp8_tensor.c) */
    switch (adam->grad_dtype) {
    case HQ_F32: return FP8T_Q(HQ_F32, HQ_F32);
    case HQ_F16: return FP8T_Q(HQ_F32, HQ_F16);
    default: return FP8T_Q(HQ_F32, HQ_BF16);
    }
  }
  switch (src->dtype) {
  case HQ_F32: return FP8T_Q(HQ_F32, 0);
  case HQ_F16: return FP8T_Q(HQ_F16, 0);
  case HQ_BF16: return FP8T_Q(HQ_BF16, 0);
  default: return call->host->error(HQ_EINVAL, "fp8_tensor CUDA: source dtype %d", (int)src->dtype);
  }
#undef FP8T_Q
}

/* The folded factor alone (a storage with no elements runs no dequantize kernel). */
__global__ void factor_kernel(DeqFactor fac) { write_factor(fac); }

extern "C" int fp8t_cuda_dequantize(hq_dtype elem, const hq_call *call, const uint8_t *q,
                                    int transposed, const float *scale_inv, int raw, float *fout,
                                    hq_tensor *dst) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  dim3 grid;
  int rc = grid_for(call, dst->rows, dst->cols, &grid);
  if (rc) return rc;
  const DeqFactor fac = {fout, call->factor_in, call->factor_mul, scale_inv};
  const float *s = raw ? NULL : scale_inv;
  if (dst->dtype != HQ_F32 && dst->dtype != HQ_F16 && dst->dtype != HQ_BF16)
    return call->host->error(HQ_EINVAL, "fp8_tensor CUDA: destination dtype %d", (int)dst->dtype);
  if (grid.x == 0 || grid.y == 0) {
    if (!fout) return HQ_OK;
    factor_kernel<<<1, 1, 0, stream>>>(fac);
    CHECK_LAUNCH(call, "factor kernel");
    return HQ_OK;
  }
  dim3 block(kTile, kRowsPerPass);
  switch (dst->dtype) {
  case HQ_F32:
    dequantize_kernel<HQ_F32><<<grid, block, 0, stream>>>(q, transposed, s, (int)elem,
                                                          dst->data, dst->rows, dst->cols, fac);
    break;
  case HQ_F16:
    dequantize_kernel<HQ_F16><<<grid, block, 0, stream>>>(q, transposed, s, (int)elem,
                                                          dst->data, dst->rows, dst->cols, fac);
    break;
  default:
    dequantize_kernel<HQ_BF16><<<grid, block, 0, stream>>>(q, transposed, s, (int)elem,
                                                           dst->data, dst->rows, dst->cols, fac);
    break;
  }
  CHECK_LAUNCH(call, "dequantize kernel");
  return HQ_OK;
}

extern "C" int fp8t_cuda_factor(const hq_call *call, const float *scale_inv, float *out) {
  CHECK_CUDA(call, cudaMemcpyAsync(out, scale_inv, sizeof(float), cudaMemcpyDeviceToDevice,
                                   (cudaStream_t)call->stream));
  return HQ_OK;
}

extern "C" int fp8t_cuda_update_state(const hq_call *call, int64_t n, float *amax, float *state,
                                      int history_len, int most_recent, float scaled_max) {
  if (n <= 0) return HQ_OK;
  if (n > 0x7fffffff)
    return call->host->error(HQ_ESHAPE, "fp8_tensor CUDA: %lld slices", (long long)n);
  update_state_kernel<<<(unsigned)n, FP8T_STATE_THREADS, 0, (cudaStream_t)call->stream>>>(
      amax, state, history_len, most_recent, scaled_max);
  CHECK_LAUNCH(call, "update_state kernel");
  return HQ_OK;
}
