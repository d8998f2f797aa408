/*
** fp8_block.cu -- CUDA kernels of the fp8_block plugin: the fused 128x128-tile quantize (both
** directions from one read of the input) and dequantize. Every bit comes from the functions the
** CPU reference runs (fp8_block_rules.h, fp8_scale.h, hq/numerics.h: HQ_HD), so the bytes and
** scales agree with it bit for bit by construction.
**
** quantize (also the update): one thread block of 256 threads per 128x128 tile of the [M, K]
** input (a 1-D grid over the ceil(M/128) * ceil(K/128) tiles; edge tiles cover only their
** in-bounds part). Thread t holds the 8x8 sub-block rows 8*(t/16) .. +7, columns 8*(t%16) .. +7
** of the tile in registers (one 16-byte load per row for bf16/f16, two for f32, when K % 8 == 0
** and the input is 16-byte aligned; element loads otherwise), so the tile is read from global
** memory exactly once and feeds both directions. A 16-bit input's amaxes come from its packed
** words, two elements per instruction (hq_cuda_absmax2: NaN ignored as the rule wants), so the
** elements are unpacked to FP32 only by the casts (fewer instructions and live registers):
**   1-D rowwise     row amax over the 16 threads of a row (a reduce-scatter by warp shuffles:
**                   two lanes finish each of the group's 8 rows), each row's scale computed
**                   once (hq_fp8b_scale) and shuffled to its lanes, 8-byte stores of the bytes;
**   1-D columnwise  column amax over the 16 row groups (shuffle + shared memory), the column
**                   scales computed once per column (shared), the bytes cast with them and
**                   written transposed into a shared 128x128 byte tile (XOR-swizzled 16-byte
**                   chunks: few bank conflicts), then 16-byte coalesced stores of the [K, M] rows;
**   2-D             one tile amax, one scale; the bytes are cast once, stored rowwise and, through
**                   the same shared tile, as their exact transpose.
** The fused optimizer step (update under HQ_CAP_FUSED_ADAM, an FP32 master): after the tile's
** read, each thread applies hq_adam_elem to its 8x8 elements row by row, the gradient and moments
** of a row loaded and master, m and v stored 8 at a time with 16-byte accesses (a thread's two
** fill its 32-byte sector), element by element only when K % 8 or an array's alignment forbids
** it; the rows a few ahead are prefetched into L2, so a CTA keeps DRAM reads in flight while it
** computes; its registers allow HQ_FP8B_ADAM_MIN_BLOCKS CTAs per SM. The updated values then
** take the quantize path above unchanged. On a tensor of fewer tiles than one wave of those CTAs
** the step runs apart instead (adam_cuda.h: element-wise over every SM), then the plain quantize.
** scale_inv = hq_rcp_rn(scale) is written by the threads that own the block; the zero padding of
** each scale buffer's rows (dim 1 up to a multiple of 4) is written by the edge tiles.
** A tensor of at most HQ_FP8B_SPLIT_TILES tiles (without the optimizer step) takes
** quantize_split_kernel instead: a cluster of 8 CTAs a tile, 16 rows each, the column and tile
** amaxes reduced through distributed shared memory (the comment there says why).
** dequantize: 32x32 tiles, x = hq_fp8_dequantize(q, its block's scale_inv); a columnwise [K, M]
** storage is read coalesced and transposed through shared memory.
**
** Every launch is queued on call->stream; nothing allocates (scratch_size is 0 on a device),
** nothing synchronizes: quantize/update can be captured in a CUDA graph.
*/
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "adam_cuda.h"
#include "fp8_cvt_cuda.h"
#include "amax_cuda.h"
#include "cuda_check.h"
#include "hp_load_cuda.h"
#include "hq/adamw.h"
#include "hq/numerics.h"
#include "smem_cuda.h"
#include "tma_cuda.h"
#include "fp8_block_rules.h"

extern "C" {
int fp8b_cuda_quantize(const hq_call *call, const hq_tensor *src, int elem, int two_d, int pow2,
                       float epsilon, uint8_t *rd, float *rs, uint8_t *cd, float *cs,
                       const hq_adam_pass *adam);
int fp8b_cuda_dequantize(const hq_call *call, int elem, int colwise, int two_d, const uint8_t *q,
                         const float *scale_inv, hq_tensor *dst);
}

namespace {

constexpr int kB = HQ_FP8B_BLOCK; /* 128 */
constexpr int kThreads = 256;     /* 16 column groups x 16 row groups of 8x8 */

struct QArgs {
  const void *x;
  int64_t M, K, Kb;  /* Kb = tiles along K */
  uint8_t *rd, *cd;  /* rowwise [M, K] / columnwise [K, M] bytes, NULL when not made */
  float *rs, *cs;    /* their scale_inv buffers */
  int pow2;
  float epsilon;
  int vec_in;        /* K % 8 == 0 and x 16-byte aligned: 16-byte loads */
  int vec_row;       /* K % 8 == 0 and rd 8-byte aligned: 8-byte rowwise stores */
  int vec_col;       /* M % 16 == 0 and cd 16-byte aligned: 16-byte columnwise stores */
  int vec_adam;      /* vec_in and g, m, v 16-byte aligned: 16-byte optimizer loads/stores */
  /* the fused optimizer step (GT != 0): x is the FP32 master, rewritten with m and v */
  const void *g;
  float *m, *v;
  hq_adam_consts k;
  const hq_adam_consts *kd; /* ABI 2.6: NULL, or k in device memory, read as the kernel runs */
};

/* The registers of one thread: 8 rows x 8 elements, raw input bits (two 16-bit elements per word
   for bf16/f16). */
template <int DT> struct Raw {
  static constexpr int W = DT == HQ_F32 ? 8 : 4;
  uint32_t w[8][W];
  /* max |x| (NaN ignored, 0 when all are NaN) of row p's 8 elements: 16-bit inputs from their
     packed words (hq_cuda_absmax2, two per instruction; no FP32 copies of the elements kept
     live beside the casts that need them), FP32 by hq_cuda_amax_step (amax_cuda.h) */
  __device__ __forceinline__ float row_amax(int p) const {
    if constexpr (DT == HQ_F32) {
      float m = 0.0f;
      for (int j = 0; j < 8; j++) m = hq_cuda_amax_step(m, at(p, j));
      return m;
    } else {
      return hq_cuda_words_amax<DT, 4>(w[p]);
    }
  }
  /* the same over the 8 rows of columns 2k and 2k + 1 (16-bit inputs) */
  __device__ __forceinline__ uint32_t col_pair_absmax(int k) const {
    const uint32_t c[8] = {w[0][k], w[1][k], w[2][k], w[3][k], w[4][k], w[5][k], w[6][k], w[7][k]};
    return hq_cuda_absmax_tree<DT, 8>(c);
  }
  __device__ __forceinline__ float at(int p, int j) const {
    if constexpr (DT == HQ_F32) {
      return hq_bits_f32(w[p][j]);
    } else {
      const uint16_t h = (uint16_t)(w[p][j >> 1] >> (16 * (j & 1)));
      return hq_cuda_hp16_to_f32<DT>(h);
    }
  }
};

/* Store 8 bytes of row `row` of the rowwise copy at columns [c, c + 8) (in-bounds part only). */
__device__ __forceinline__ void store_row8(const QArgs &a, int64_t row, int64_t c, uint2 v) {
  uint8_t *o = a.rd + row * a.K + c;
  if (a.vec_row) {
    *reinterpret_cast<uint2 *>(o) = v;
  } else {
    for (int j = 0; j < 8; j++)
      if (c + j < a.K) o[j] = (uint8_t)((j < 4 ? v.x : v.y) >> (8 * (j & 3)));
  }
}

/* Store 8 FP32 values at p (32-byte aligned) as two 16-byte stores. */
__device__ __forceinline__ void store8f(float *p, const float y[8]) {
  float4 *q = reinterpret_cast<float4 *>(p);
  q[0] = make_float4(y[0], y[1], y[2], y[3]);
  q[1] = make_float4(y[4], y[5], y[6], y[7]);
}

/* Ask L2 for the line holding p (no register, no wait): the fused optimizer step's rows of
   gradient and moments are requested a few rows ahead of their loads, so each CTA keeps several
   rows of DRAM reads in flight while it computes. */
__device__ __forceinline__ void prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Rows of the thread's 8 the fused optimizer step prefetches ahead (0: none); each CTA then
   has that many rows of gradient and moments (12 KiB to 24 KiB a row) in L2 at once. */
#ifndef HQ_FP8B_ADAM_PREFETCH
#define HQ_FP8B_ADAM_PREFETCH 2
#endif

/* The zero padding of row `row` of a scale buffer whose rows hold n scales stored r4(n) apart:
   entries n .. r4(n), by threads t < r4(n) - n of a tile that is the last along n (`last`). The
   1-D rowwise scales ([k/128][M]), the 1-D columnwise ones ([m/128][K]) and both 2-D ones
   ([m/128][k/128], [k/128][m/128]) are such rows. */
__device__ __forceinline__ void pad_scale_row(float *s, int64_t n, int64_t row, int t, bool last) {
  const int64_t r4 = hq_roundup(n, 4);
  if (last && t < r4 - n) s[row * r4 + n + t] = 0.0f;
}

/* A 2-D block's scale_inv in both scale buffers (thread 0 of the tile's CTA or cluster) and,
   by threads t < 3 of the edge tiles, the zero padding of the scale rows: [m/128][Kb .. r4(Kb))
   and [k/128][Mb .. r4(Mb)). */
__device__ __forceinline__ void store_2d_scales(const QArgs &a, int t, int64_t mb, int64_t kb,
                                                float scale) {
  const int64_t M = a.M, K = a.K, m0 = mb * kB, k0 = kb * kB;
  if (t == 0) {
    const float scale_inv = hq_rcp_rn(scale);
    if (a.rs) a.rs[hq_fp8b_row2d_index(m0, k0, K)] = scale_inv;
    if (a.cs) a.cs[hq_fp8b_col2d_index(m0, k0, M)] = scale_inv;
  }
  const int64_t Mb = hq_fp8b_nblocks(M);
  if (a.rs) pad_scale_row(a.rs, a.Kb, mb, t, kb == a.Kb - 1);
  if (a.cs) pad_scale_row(a.cs, Mb, kb, t, mb == Mb - 1);
}

/* Swizzled byte offset of (row r, byte b) of the shared 128x128 transposed tile: 16-byte chunk
   b/16 of row r sits at chunk (b/16) ^ ((r/8) % 8). */
__device__ __forceinline__ int sw(int r, int b) {
  return r * kB + ((((b >> 4) ^ (r >> 3)) & 7) << 4) + (b & 15);
}

/* CTAs per SM the register allocation aims at, 1-D and 2-D alike: 3 (80 registers, a few
   spilled words) rather than 2 (128): each CTA loads its tile, reduces, then encodes, so more
   CTAs keep more loads in flight, which outweighs the spills. The fused optimizer step holds
   the gradient and moments of a row beside the 64-word tile, which does not fit 80 registers
   without heavy spills: it takes HQ_FP8B_ADAM_MIN_BLOCKS. */
#ifndef HQ_FP8B_MIN_BLOCKS
#define HQ_FP8B_MIN_BLOCKS 3
#endif
#ifndef HQ_FP8B_ADAM_MIN_BLOCKS
#define HQ_FP8B_ADAM_MIN_BLOCKS 2
#endif
template <int DT, int ELEM, bool TWO_D, int GT>
__global__ void __launch_bounds__(kThreads, GT ? HQ_FP8B_ADAM_MIN_BLOCKS : HQ_FP8B_MIN_BLOCKS)
    quantize_kernel(QArgs a) {
  /* the optimizer's constants (GT != 0): *a.kd when given (a graph's replay: this step's), else
     the argument, in shared memory: a copy in registers would spill at this kernel's bound */
  __shared__ hq_adam_consts sk;
  if constexpr (GT != 0) {
    if (threadIdx.x == 0) sk = a.kd ? *a.kd : a.k;
    __syncthreads();
  }
  __shared__ __align__(16) uint8_t ct[kB * kB]; /* [tile column k][tile row m], swizzled */
  __shared__ float wmax[8][kB];                 /* per-warp column amax (1-D) */
  __shared__ float cscale[kB];                  /* column scales (1-D) */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int cg = t & 15, rg = t >> 4, r0 = rg * 8, c0 = cg * 8;
  const int64_t mb = blockIdx.x / a.Kb, kb = blockIdx.x % a.Kb;
  const int64_t m0 = mb * kB, k0 = kb * kB, M = a.M, K = a.K;
  const int nr = (int)(M - m0 < kB ? M - m0 : kB), nc = (int)(K - k0 < kB ? K - k0 : kB);

  /* --- the one read of the tile ---------------------------------------------------------- */
  Raw<DT> x;
  const bool col_in = c0 < nc;
  /* the fused optimizer step: row p's gradient and moments, requested from L2 ahead of use */
  const auto prefetch_row = [&](int p) {
    if (GT == 0 || p >= 8 || r0 + p >= nr || !col_in) return;
    const int64_t i = (m0 + r0 + p) * K + k0 + c0;
    prefetch_l2(static_cast<const char *>(a.g) + i * (GT == HQ_F32 ? 4 : 2));
    prefetch_l2(a.m + i);
    prefetch_l2(a.v + i);
  };
  #pragma unroll
  for (int p = 0; p < HQ_FP8B_ADAM_PREFETCH; p++) prefetch_row(p);
  if (a.vec_in) {
    #pragma unroll
    for (int p = 0; p < 8; p++) {
      const int64_t i = (m0 + r0 + p) * K + k0 + c0;
      if (r0 + p < nr && col_in) {
        if constexpr (DT == HQ_F32) {
          const uint4 *s = reinterpret_cast<const uint4 *>(static_cast<const float *>(a.x) + i);
          const uint4 u0 = __ldg(s), u1 = __ldg(s + 1);
          x.w[p][0] = u0.x; x.w[p][1] = u0.y; x.w[p][2] = u0.z; x.w[p][3] = u0.w;
          x.w[p][4] = u1.x; x.w[p][5] = u1.y; x.w[p][6] = u1.z; x.w[p][7] = u1.w;
        } else {
          const uint4 u = __ldg(reinterpret_cast<const uint4 *>(
              static_cast<const uint16_t *>(a.x) + i));
          x.w[p][0] = u.x; x.w[p][1] = u.y; x.w[p][2] = u.z; x.w[p][3] = u.w;
        }
      } else {
        #pragma unroll
        for (int j = 0; j < Raw<DT>::W; j++) x.w[p][j] = 0u;
      }
    }
  } else {
    #pragma unroll
    for (int p = 0; p < 8; p++) {
      const bool row_in = r0 + p < nr;
      const int64_t i = (m0 + r0 + p) * K + k0 + c0;
      #pragma unroll
      for (int j = 0; j < Raw<DT>::W; j++) x.w[p][j] = 0u;
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        if (!row_in || c0 + j >= nc) continue;
        if constexpr (DT == HQ_F32) {
          x.w[p][j] = __ldg(static_cast<const unsigned int *>(a.x) + i + j);
        } else {
          const uint32_t h = __ldg(static_cast<const unsigned short *>(a.x) + i + j);
          x.w[p][j >> 1] |= h << (16 * (j & 1));
        }
      }
    }
  }
  /* out-of-bounds elements are 0: they never raise an amax and their bytes are never stored */

  if constexpr (GT != 0) {
    /* the fused optimizer step (DT is F32): each in-bounds element of the master, read once
       above by this thread alone, gets one AdamW step (hq_adam_elem) with the gradient and
       moments at its index; master, m and v are written back and the new value is quantized.
       Each element is read and written by this thread only, once, so the read-only path is
       safe for the moments too. */
    float *w = static_cast<float *>(const_cast<void *>(a.x));
    #pragma unroll
    for (int p = 0; p < 8; p++) {
      if (HQ_FP8B_ADAM_PREFETCH > 0) prefetch_row(p + HQ_FP8B_ADAM_PREFETCH);
      if (r0 + p >= nr) continue;
      const int64_t i = (m0 + r0 + p) * K + k0 + c0;
      if (a.vec_adam) {
        /* K % 8 == 0: the thread's 8 columns are all in bounds or all out */
        if (!col_in) continue;
        float g[8], m[8], v[8], y[8];
        hq_cuda_load8<GT>(a.g, i, true, g);
        hq_cuda_load8<HQ_F32>(a.m, i, true, m);
        hq_cuda_load8<HQ_F32>(a.v, i, true, v);
        #pragma unroll
        for (int j = 0; j < 8; j++) {
          y[j] = hq_bits_f32(x.w[p][j]);
          hq_adam_elem(&sk, g[j], &y[j], &m[j], &v[j]);
          x.w[p][j] = hq_f32_bits(y[j]);
        }
        store8f(w + i, y);
        store8f(a.m + i, m);
        store8f(a.v + i, v);
      } else {
        #pragma unroll
        for (int j = 0; j < 8; j++) {
          if (c0 + j >= nc) continue;
          float wi = hq_bits_f32(x.w[p][j]), mi = a.m[i + j], vi = a.v[i + j];
          hq_adam_elem(&sk, hq_load_hp(a.g, i + j, GT), &wi, &mi, &vi);
          w[i + j] = wi;
          a.m[i + j] = mi;
          a.v[i + j] = vi;
          x.w[p][j] = hq_f32_bits(wi);
        }
      }
    }
  }

  if (TWO_D) {
    /* --- one 128x128 block: one amax, one scale, one cast ---------------------------------- */
    float m = 0.0f;
    #pragma unroll
    for (int p = 0; p < 8; p++) m = fmaxf(m, x.row_amax(p));
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) wmax[0][warp] = m;
    __syncthreads();
    m = 0.0f;
    #pragma unroll
    for (int w = 0; w < 8; w++) m = fmaxf(m, wmax[0][w]);
    const float scale = hq_fp8b_scale(m, ELEM, a.pow2, a.epsilon, DT);
    uint2 q[8];
    #pragma unroll
    for (int p = 0; p < 8; p++) {
      float y[8];
      #pragma unroll
      for (int j = 0; j < 8; j++) y[j] = x.at(p, j);
      q[p] = hq_cuda_cast8<ELEM>(y, scale);
    }
    store_2d_scales(a, t, mb, kb, scale);
    if (a.rd && col_in)
      #pragma unroll
      for (int p = 0; p < 8; p++)
        if (r0 + p < nr) store_row8(a, m0 + r0 + p, k0 + c0, q[p]);
    if (a.cd) {
      /* column j of this thread's 8x8 bytes: byte j of each row's words, by 4x4 transposes */
      uint32_t lo[2][4], hi[2][4]; /* [rows 0-3 / 4-7][column]: columns 0-3, columns 4-7 */
      hq_cuda_transpose4x4(q[0].x, q[1].x, q[2].x, q[3].x, lo[0]);
      hq_cuda_transpose4x4(q[4].x, q[5].x, q[6].x, q[7].x, lo[1]);
      hq_cuda_transpose4x4(q[0].y, q[1].y, q[2].y, q[3].y, hi[0]);
      hq_cuda_transpose4x4(q[4].y, q[5].y, q[6].y, q[7].y, hi[1]);
      #pragma unroll
      for (int j = 0; j < 4; j++) {
        *reinterpret_cast<uint2 *>(ct + sw(c0 + j, r0)) = make_uint2(lo[0][j], lo[1][j]);
        *reinterpret_cast<uint2 *>(ct + sw(c0 + 4 + j, r0)) = make_uint2(hi[0][j], hi[1][j]);
      }
    }
  } else {
    /* --- 1-D rowwise: each tile row is a 1x128 block ---------------------------------------- */
    if (a.rd) {
      float v[8]; /* the amax of rows r0 .. r0 + 7 over this thread's 8 columns */
      #pragma unroll
      for (int p = 0; p < 8; p++) v[p] = x.row_amax(p);
      /* reduce-scatter over the row group's 16 consecutive lanes (8 shuffles, not 32): each step
         keeps the half of the rows named by one bit of cg and takes the partner's maxima of
         them, so lanes 2r and 2r + 1 end with the amax of row r0 + r, r = cg >> 1 */
      const bool b3 = cg & 8, b2 = cg & 4, b1 = cg & 2;
      float w4[4], w2[2];
      #pragma unroll
      for (int k = 0; k < 4; k++)
        w4[k] = fmaxf(b3 ? v[k + 4] : v[k], __shfl_xor_sync(0xffffffffu, b3 ? v[k] : v[k + 4], 8));
      #pragma unroll
      for (int k = 0; k < 2; k++)
        w2[k] = fmaxf(b2 ? w4[k + 2] : w4[k],
                      __shfl_xor_sync(0xffffffffu, b2 ? w4[k] : w4[k + 2], 4));
      float rm = fmaxf(b1 ? w2[1] : w2[0], __shfl_xor_sync(0xffffffffu, b1 ? w2[0] : w2[1], 2));
      rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, 1));
      /* one scale per lane (its row's), not eight; lane 2r writes row r's scale_inv */
      const float my_scale = hq_fp8b_scale(rm, ELEM, a.pow2, a.epsilon, DT);
      if (!(cg & 1) && r0 + (cg >> 1) < nr)
        a.rs[hq_fp8b_row1d_index(m0 + r0 + (cg >> 1), k0, M)] = hq_rcp_rn(my_scale);
      #pragma unroll
      for (int p = 0; p < 8; p++) {
        const float scale = __shfl_sync(0xffffffffu, my_scale, (lane & 16) | (2 * p));
        float y[8];
        #pragma unroll
        for (int j = 0; j < 8; j++) y[j] = x.at(p, j);
        const uint2 q = hq_cuda_cast8<ELEM>(y, scale); /* stored at once: no registers held */
        if (col_in && r0 + p < nr) store_row8(a, m0 + r0 + p, k0 + c0, q);
      }
      pad_scale_row(a.rs, M, kb, t, mb == hq_fp8b_nblocks(M) - 1);
    }
    /* --- 1-D columnwise: each tile column is a 128x1 block ---------------------------------- */
    if (a.cd) {
      float cm[8];
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        if constexpr (DT == HQ_F32) {
          cm[j] = 0.0f;
          #pragma unroll
          for (int p = 0; p < 8; p++) cm[j] = hq_cuda_amax_step(cm[j], x.at(p, j));
        } else {
          cm[j] = hq_cuda_lane_amax<DT>(x.col_pair_absmax(j / 2), j & 1);
        }
        /* lanes l and l ^ 16 hold the same columns (row groups 2w and 2w + 1) */
        cm[j] = fmaxf(cm[j], __shfl_xor_sync(0xffffffffu, cm[j], 16));
      }
      if (lane < 16)
        #pragma unroll
        for (int j = 0; j < 8; j++) wmax[warp][c0 + j] = cm[j];
      __syncthreads();
      if (t < kB) {
        float m = 0.0f;
        #pragma unroll
        for (int w = 0; w < 8; w++) m = fmaxf(m, wmax[w][t]);
        const float scale = hq_fp8b_scale(m, ELEM, a.pow2, a.epsilon, DT);
        cscale[t] = scale;
        if (t < nc) a.cs[hq_fp8b_col1d_index(m0, k0 + t, K)] = hq_rcp_rn(scale);
      }
      pad_scale_row(a.cs, K, mb, t, kb == a.Kb - 1);
      __syncthreads();
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        float y[8];
        #pragma unroll
        for (int p = 0; p < 8; p++) y[p] = x.at(p, j);
        *reinterpret_cast<uint2 *>(ct + sw(c0 + j, r0)) = hq_cuda_cast8<ELEM>(y, cscale[c0 + j]);
      }
    }
  }

  /* --- the transposed bytes: [nc rows of K][nr bytes of M], 16 bytes per thread and pass ---- */
  if (!a.cd) return;
  __syncthreads();
  #pragma unroll
  for (int pass = 0; pass < kB * kB / 16 / kThreads; pass++) {
    const int idx = t + kThreads * pass, r = idx >> 3, b = (idx & 7) << 4;
    if (r >= nc || b >= nr) continue;
    const uint4 v = *reinterpret_cast<const uint4 *>(ct + sw(r, b));
    uint8_t *o = a.cd + (k0 + r) * M + m0 + b;
    if (a.vec_col) {
      *reinterpret_cast<uint4 *>(o) = v;
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      #pragma unroll
      for (int j = 0; j < 16 && b + j < nr; j++) o[j] = (uint8_t)(w[j >> 2] >> (8 * (j & 3)));
    }
  }
}

/* A tensor of few tiles (HQ_FP8B_SPLIT_TILES or fewer): each 128x128 tile is quantized by a
   cluster of kSplit CTAs, CTA r taking the tile's rows 16r .. 16r + 15, so that a small tensor
   spreads over kSplit times the SMs (one CTA a tile leaves most of the GPU idle while each CTA
   runs its whole tile's chain of loads, reductions and casts). Thread t holds row t / 16's eight
   columns 8 (t % 16) .. + 7 as FP32. A 1x128 rowwise block is one CTA's row (16 lanes' shuffles);
   a 128x1 columnwise block's amax and a 128x128 block's amax are reduced over the cluster: each
   CTA pushes its partial maxima into every CTA's shared slots (st.async, counted on the
   receiver's mbarrier: tma_cuda.h), then each CTA reduces its 8 slots once they have all come,
   so no CTA reads another's memory and none has to wait for the others to exit. The amaxes,
   scales and casts are the one-CTA kernel's (hq_cuda_amax_step, hq_fp8b_scale,
   hq_cuda_cast8): the same bytes. The fused optimizer step keeps the one-CTA kernel. */
constexpr int kSplit = 8, kSplitRows = kB / kSplit;
static_assert(kSplitRows * 16 == kThreads, "a thread per row and 8-column group of a CTA's rows");
#ifndef HQ_FP8B_SPLIT_TILES
#define HQ_FP8B_SPLIT_TILES 16
#endif

template <int DT, int ELEM, bool TWO_D>
__global__ void __launch_bounds__(kThreads) quantize_split_kernel(QArgs a) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  __shared__ float slot[kSplit][kB];                 /* the cluster's partial maxima, by rank */
  __shared__ uint64_t slot_bar;                      /* counts the bytes pushed into slot */
  __shared__ float wmax[kThreads / 32][kB];          /* per-warp column maxima (1-D columnwise) */
  __shared__ float cscale[kB];                       /* column scales (1-D columnwise) */
  __shared__ uint8_t ctile[kB][kSplitRows + 1];      /* [tile column][CTA row] codes, padded */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int lr = t >> 4, c0 = (t & 15) * 8;
  const unsigned rank = cl.block_rank();
  const int64_t tile = blockIdx.x / kSplit, mb = tile / a.Kb, kb = tile % a.Kb;
  const int64_t m0 = mb * kB, k0 = kb * kB, M = a.M, K = a.K;
  const int nr = (int)(M - m0 < kB ? M - m0 : kB), nc = (int)(K - k0 < kB ? K - k0 : kB);
  const int r = (int)rank * kSplitRows + lr; /* this thread's row in the tile */
  const bool row_in = r < nr, col_in = c0 < nc;
  const int64_t i = m0 + r;
  /* each CTA's maxima are pushed into every CTA's slot (st.async, counted on slot_bar: the
     receiver's wait on it is the only synchronization, tma_cuda.h); every CTA of the cluster has
     started, its slot_bar made, before any push: the relaxed arrival here, the wait just before
     the first push (the load overlaps it) */
  const uint32_t sbar = hq_smem_addr(&slot_bar);
  if (TWO_D || a.cd)
    hq_cluster_open(sbar, true, (uint32_t)(kSplit * (TWO_D ? 1 : kB) * sizeof(float)));

  float y[8];
  if (row_in && col_in && a.vec_in) {
    hq_cuda_load8<DT>(a.x, i * K + k0 + c0, true, y);
  } else {
    #pragma unroll
    for (int j = 0; j < 8; j++)
      y[j] = row_in && c0 + j < nc ? hq_load_hp(a.x, i * K + k0 + c0 + j, DT) : 0.0f;
  }
  /* out-of-bounds elements are 0: they never raise an amax and their bytes are never stored */

  if (TWO_D) {
    float m = 0.0f;
    #pragma unroll
    for (int j = 0; j < 8; j++) m = hq_cuda_amax_step(m, y[j]);
    m = hq_cuda_cta_max<kThreads>(m); /* on thread 0 */
    hq_cluster_wait();
    if (t == 0)
      for (unsigned c = 0; c < kSplit; c++)
        hq_cluster_push1(hq_smem_addr(&slot[0][rank]), c, __float_as_uint(m), sbar);
    hq_mbar_wait_cluster(sbar, 0);
    float tm = 0.0f;
    #pragma unroll
    for (int c = 0; c < kSplit; c++) tm = fmaxf(tm, slot[0][c]);
    const float scale = hq_fp8b_scale(tm, ELEM, a.pow2, a.epsilon, DT);
    const uint2 q = hq_cuda_cast8<ELEM>(y, scale);
    if (rank == 0) store_2d_scales(a, t, mb, kb, scale);
    if (a.rd && row_in && col_in) store_row8(a, i, k0 + c0, q);
    if (a.cd)
      #pragma unroll
      for (int j = 0; j < 8; j++) ctile[c0 + j][lr] = (uint8_t)((j < 4 ? q.x : q.y) >> (8 * (j & 3)));
  } else {
    if (a.rd) {
      /* the row's amax over its 16 lanes (a half-warp) */
      float rm = 0.0f;
      #pragma unroll
      for (int j = 0; j < 8; j++) rm = hq_cuda_amax_step(rm, y[j]);
      #pragma unroll
      for (int off = 8; off > 0; off >>= 1) rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, off));
      const float scale = hq_fp8b_scale(rm, ELEM, a.pow2, a.epsilon, DT);
      if ((t & 15) == 0 && row_in) a.rs[hq_fp8b_row1d_index(i, k0, M)] = hq_rcp_rn(scale);
      if (row_in && col_in) store_row8(a, i, k0 + c0, hq_cuda_cast8<ELEM>(y, scale));
      pad_scale_row(a.rs, M, kb, t, rank == 0 && mb == hq_fp8b_nblocks(M) - 1);
    }
    if (a.cd) {
      /* column maxima over the CTA's 16 rows: lanes l and l ^ 16 hold rows 2w and 2w + 1, then
         the warps through shared memory; then over the cluster's 8 CTAs */
      float cm[8];
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        cm[j] = hq_cuda_amax_step(0.0f, y[j]);
        cm[j] = fmaxf(cm[j], __shfl_xor_sync(0xffffffffu, cm[j], 16));
      }
      if (lane < 16)
        #pragma unroll
        for (int j = 0; j < 8; j++) wmax[warp][c0 + j] = cm[j];
      __syncthreads();
      hq_cluster_wait();
      if (t < kB) {
        float m = 0.0f;
        #pragma unroll
        for (int w = 0; w < kThreads / 32; w++) m = fmaxf(m, wmax[w][t]);
        for (unsigned c = 0; c < kSplit; c++)
          hq_cluster_push1(hq_smem_addr(&slot[rank][t]), c, __float_as_uint(m), sbar);
      }
      hq_mbar_wait_cluster(sbar, 0);
      if (t < kB) {
        float m = 0.0f;
        #pragma unroll
        for (int c = 0; c < kSplit; c++) m = fmaxf(m, slot[c][t]);
        const float scale = hq_fp8b_scale(m, ELEM, a.pow2, a.epsilon, DT);
        cscale[t] = scale;
        if (rank == 0 && t < nc) a.cs[hq_fp8b_col1d_index(m0, k0 + t, K)] = hq_rcp_rn(scale);
      }
      pad_scale_row(a.cs, K, mb, t, rank == 0 && kb == a.Kb - 1);
      __syncthreads();
      const uint2 q = hq_cuda_cast8v<ELEM>(y, &cscale[c0]);
      #pragma unroll
      for (int j = 0; j < 8; j++) ctile[c0 + j][lr] = (uint8_t)((j < 4 ? q.x : q.y) >> (8 * (j & 3)));
    }
  }
  if (!a.cd) return;
  /* the transposed bytes: tile column c's 16 codes of this CTA's rows, 16 bytes at
     [k0 + c][m0 + 16 rank] of the [K, M] copy */
  __syncthreads();
  if (t < nc && (int)rank * kSplitRows < nr) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    #pragma unroll
    for (int b = 0; b < kSplitRows; b++) w[b >> 2] |= (uint32_t)ctile[t][b] << (8 * (b & 3));
    const int nb = nr - (int)rank * kSplitRows < kSplitRows ? nr - (int)rank * kSplitRows : kSplitRows;
    uint8_t *o = a.cd + (k0 + t) * M + m0 + (int64_t)rank * kSplitRows;
    if (a.vec_col && nb == kSplitRows) {
      *reinterpret_cast<uint4 *>(o) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int b = 0; b < nb; b++) o[b] = (uint8_t)(w[b >> 2] >> (8 * (b & 3)));
    }
  }
}

template <int DT, int ELEM>
cudaError_t launch_split(int two_d, unsigned tiles, cudaStream_t stream, const QArgs &a) {
  return two_d ? hq_cuda_launch_clusters(quantize_split_kernel<DT, ELEM, true>, tiles * kSplit,
                                         kSplit, kThreads, stream, a)
               : hq_cuda_launch_clusters(quantize_split_kernel<DT, ELEM, false>, tiles * kSplit,
                                         kSplit, kThreads, stream, a);
}

template <int DT>
cudaError_t launch_split_dt(int elem, int two_d, unsigned tiles, cudaStream_t stream,
                            const QArgs &a) {
  return elem == HQ_E5M2 ? launch_split<DT, HQ_E5M2>(two_d, tiles, stream, a)
                         : launch_split<DT, HQ_E4M3>(two_d, tiles, stream, a);
}

/* dst[m][k] = hq_fp8_dequantize(q, scale_inv of (m, k)); q is [M, K] (colwise 0) or [K, M]
   (colwise 1, read coalesced along M and transposed through shared memory). */
constexpr int kT = 32, kRows = 8;

template <int DT>
__global__ void dequantize_kernel(const uint8_t *__restrict__ q, const float *__restrict__ sc,
                                  int elem, int colwise, int two_d, void *dst, int64_t M,
                                  int64_t K, int64_t tiles_k) {
  __shared__ float tile[kT][kT + 1];
  const int64_t i0 = (int64_t)(blockIdx.x / tiles_k) * kT, j0 = (int64_t)(blockIdx.x % tiles_k) * kT;
  const int tx = threadIdx.x, ty = threadIdx.y;
  if (!colwise) {
    const int64_t j = j0 + tx;
    for (int r = ty; r < kT; r += kRows) {
      const int64_t i = i0 + r;
      if (i < M && j < K)
        hq_store_hp(dst, i * K + j, DT,
                    hq_fp8_dequantize(q[i * K + j], sc[hq_fp8b_scale_index(i, j, M, K, 0, two_d)],
                                      elem));
    }
    return;
  }
  const int64_t ii = i0 + tx;
  for (int c = ty; c < kT; c += kRows) {
    const int64_t jj = j0 + c;
    if (ii < M && jj < K)
      tile[tx][c] = hq_fp8_dequantize(q[jj * M + ii],
                                      sc[hq_fp8b_scale_index(ii, jj, M, K, 1, two_d)], elem);
  }
  __syncthreads();
  const int64_t j = j0 + tx;
  for (int r = ty; r < kT; r += kRows) {
    const int64_t i = i0 + r;
    if (i < M && j < K) hq_store_hp(dst, i * K + j, DT, tile[r][tx]);
  }
}

bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

template <int DT, int ELEM, int GT>
void launch_quantize(int two_d, unsigned grid, cudaStream_t stream, const QArgs &a) {
  if (two_d) quantize_kernel<DT, ELEM, true, GT><<<grid, kThreads, 0, stream>>>(a);
  else quantize_kernel<DT, ELEM, false, GT><<<grid, kThreads, 0, stream>>>(a);
}

template <int DT, int GT = 0>
void launch_quantize_dt(int elem, int two_d, unsigned grid, cudaStream_t stream,
                        const QArgs &a) {
  if (elem == HQ_E5M2) launch_quantize<DT, HQ_E5M2, GT>(two_d, grid, stream, a);
  else launch_quantize<DT, HQ_E4M3, GT>(two_d, grid, stream, a);
}

} // namespace

/* Quantize src ([M, K], f32/f16/bf16, device memory) into the rowwise (rd, rs) and/or columnwise
   (cd, cs) buffers (NULL: direction not made) on call->stream: one kernel, one read. */
extern "C" int fp8b_cuda_quantize(const hq_call *call, const hq_tensor *src, int elem, int two_d,
                                  int pow2, float epsilon, uint8_t *rd, float *rs, uint8_t *cd,
                                  float *cs, const hq_adam_pass *adam) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = src->rows, K = src->cols;
  if (M <= 0 || K <= 0 || (!rd && !cd)) return HQ_OK;
  QArgs a;
  a.kd = nullptr;
  a.x = src->data;
  a.M = M;
  a.K = K;
  a.Kb = hq_fp8b_nblocks(K);
  const int64_t tiles = hq_fp8b_nblocks(M) * a.Kb;
  if (tiles > 0x7fffffff)
    return call->host->error(HQ_ESHAPE, "fp8_block CUDA: [%lld, %lld] has more than 2^31 - 1 "
                             "128x128 tiles", (long long)M, (long long)K);
  a.rd = rd;
  a.rs = rd ? rs : NULL;
  a.cd = cd;
  a.cs = cd ? cs : NULL;
  a.pow2 = pow2;
  a.epsilon = epsilon;
  a.vec_in = K % 8 == 0 && aligned(src->data, 16);
  a.vec_row = K % 8 == 0 && aligned(rd, 8);
  a.vec_col = M % 16 == 0 && aligned(cd, 16);
  const unsigned grid = (unsigned)tiles;
  a.g = NULL;
  a.m = a.v = NULL;
  a.vec_adam = 0;
  if (adam && !hq_cuda_fused_adam_fills(call->device, tiles, HQ_FP8B_ADAM_MIN_BLOCKS)) {
    /* too few tiles for the fused kernel to fill the GPU: the step over every SM, then the
       plain quantize of the new master (the same bits) */
    CHECK_CUDA(call, hq_cuda_adam(adam, static_cast<float *>(src->data), M * K, stream));
    adam = NULL;
  }
  if (adam) { /* the fused optimizer step: src is the FP32 master (checked in fp8_block.c) */
    a.g = adam->grad;
    a.m = adam->m;
    a.v = adam->v;
    a.k = adam->k;
    a.kd = hq_adam_pass_k_dev(adam);
    a.vec_adam = a.vec_in && aligned(a.g, 16) && aligned(a.m, 16) && aligned(a.v, 16);
    switch (adam->grad_dtype) {
    case HQ_F32: launch_quantize_dt<HQ_F32, HQ_F32>(elem, two_d, grid, stream, a); break;
    case HQ_F16: launch_quantize_dt<HQ_F32, HQ_F16>(elem, two_d, grid, stream, a); break;
    default: launch_quantize_dt<HQ_F32, HQ_BF16>(elem, two_d, grid, stream, a); break;
    }
    CHECK_LAUNCH(call, "fp8_block quantize kernel with the fused optimizer step");
    return HQ_OK;
  }
  if (tiles <= HQ_FP8B_SPLIT_TILES) {
    /* a few tiles: each over a cluster of kSplit CTAs */
    switch (src->dtype) {
    case HQ_F32: CHECK_CUDA(call, launch_split_dt<HQ_F32>(elem, two_d, grid, stream, a)); break;
    case HQ_F16: CHECK_CUDA(call, launch_split_dt<HQ_F16>(elem, two_d, grid, stream, a)); break;
    case HQ_BF16: CHECK_CUDA(call, launch_split_dt<HQ_BF16>(elem, two_d, grid, stream, a)); break;
    default:
      return call->host->error(HQ_EINVAL, "fp8_block CUDA: source dtype %d", (int)src->dtype);
    }
    return HQ_OK;
  }
  switch (src->dtype) {
  case HQ_F32: launch_quantize_dt<HQ_F32>(elem, two_d, grid, stream, a); break;
  case HQ_F16: launch_quantize_dt<HQ_F16>(elem, two_d, grid, stream, a); break;
  case HQ_BF16: launch_quantize_dt<HQ_BF16>(elem, two_d, grid, stream, a); break;
  default:
    return call->host->error(HQ_EINVAL, "fp8_block CUDA: source dtype %d", (int)src->dtype);
  }
  CHECK_LAUNCH(call, "fp8_block quantize kernel");
  return HQ_OK;
}

/* Dequantize one storage (q: [M, K] or, colwise, [K, M] bytes of elem; scale_inv in its layout)
   into dst (f32/f16/bf16, device memory) on call->stream. */
extern "C" int fp8b_cuda_dequantize(const hq_call *call, int elem, int colwise, int two_d,
                                    const uint8_t *q, const float *scale_inv, hq_tensor *dst) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = dst->rows, K = dst->cols;
  if (M <= 0 || K <= 0) return HQ_OK;
  const int64_t tiles_k = (K + kT - 1) / kT, tiles = (M + kT - 1) / kT * tiles_k;
  if (tiles > 0x7fffffff)
    return call->host->error(HQ_ESHAPE, "fp8_block CUDA: [%lld, %lld] has more than 2^31 - 1 "
                             "32x32 tiles", (long long)M, (long long)K);
  const dim3 block(kT, kRows);
  const unsigned grid = (unsigned)tiles;
  switch (dst->dtype) {
  case HQ_F32:
    dequantize_kernel<HQ_F32><<<grid, block, 0, stream>>>(q, scale_inv, elem, colwise, two_d,
                                                          dst->data, M, K, tiles_k);
    break;
  case HQ_F16:
    dequantize_kernel<HQ_F16><<<grid, block, 0, stream>>>(q, scale_inv, elem, colwise, two_d,
                                                          dst->data, M, K, tiles_k);
    break;
  case HQ_BF16:
    dequantize_kernel<HQ_BF16><<<grid, block, 0, stream>>>(q, scale_inv, elem, colwise, two_d,
                                                           dst->data, M, K, tiles_k);
    break;
  default:
    return call->host->error(HQ_EINVAL, "fp8_block CUDA: destination dtype %d", (int)dst->dtype);
  }
  CHECK_LAUNCH(call, "fp8_block dequantize kernel");
  return HQ_OK;
}
