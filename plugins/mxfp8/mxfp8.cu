/*
** mxfp8.cu -- CUDA kernels of the mxfp8 plugin: fused rowwise + columnwise quantize (one read of
** the input), scale-padding fill, dequantize. Every bit comes from the same functions the CPU
** reference (mxfp8.c) runs: hq_mxfp8_scale_code / hq_mxfp8_quantize / hq_mxfp8_dequantize and the
** scale index functions of mxfp8_rules.h and the codecs of hq/numerics.h (all HQ_HD), so CPU and
** GPU agree bit for bit by construction, on sm_90 and sm_100 alike; where the GPU takes another
** route (the block amax by fmaxf, the hardware FP8 cast, the dequantize fast path) the comment
** at that code says why the bits are the same, and the GPU tests compare every byte.
**
** Quantize kernel: one CTA of 256 threads per tile of 32 rows x 128 columns, the tiles in
** row-major order (blockIdx.x along K; along M only for more than 65535 row blocks). Each
** thread loads two vectors of 8 consecutive elements (one 16-byte load for bf16/f16, two for
** f32), rows r and r + 16 of the tile, into registers (a 16-bit input stays packed, two
** elements per register, its amaxes taken two per instruction, unpacked for the casts); the
** input is read exactly once for both directions.
**   rowwise 1x32: a block is 4 neighbouring lanes; the two rows' amaxes by a reduce-scatter
**     of two xor-shuffles (two lanes finish each row), one code per lane, the multipliers back
**     by shuffle, cast, one 8-byte store per vector (16 lanes write a 128-byte row segment);
**   columnwise 32x1: per column, the max over the thread's two rows, a xor-16 shuffle (the
**     warp's other row), then the 8 warps' partial maxima meet in shared memory (4 KiB); 128
**     threads finish one column each, write its code (compact: 128 consecutive bytes) and its
**     multiplier to shared memory; every thread then casts its registers with its columns'
**     multipliers and stores 8 bytes per vector;
**   block_2d 32x32 (kernels of their own): the column maxima of a 32-column block reduced over
**     the warp give the tile's code, used by both directions (identical bytes in both data
**     buffers, as on the CPU); the rowwise codes leave as one 4-byte word per row and tile;
**   both directions with swizzled scales (kDeferred): as 1x32 and 32x1, but the rows' codes wait
**     in shared memory and both copies are cast after the columns' codes, as in block_2d.
** Padding kernel: only the padding bytes of the scale buffers (logical index outside [M, K/32]
** rowwise, [M/32, K] columnwise, in either layout) are written as zero; the quantize kernel
** writes every logical entry; so each scale byte is written exactly once, as the CPU's bytes.
** Dequantize kernel: a run of 16 codes per thread, one 16-byte load, 16-byte stores; runs
** without NaN/Inf codes or NaN scales take hq_mxfp8_dequantize_fast (deq_fast).
** Unaligned pointers (not 16-byte aligned) take the same kernels with scalar loads and stores.
**
** Element cast: the hardware cvt.rn.satfinite on sm_89 and later (Hopper, Blackwell), the same
** bits as hq_mxfp8_quantize (hq_cuda_cast8v), which runs elsewhere. Scale codes: step 2 of the
** rule (hq_mxfp8_scale_t) rounded up to E8M0 by hq_cuda_e8m0_rp (mx_cvt_cuda.h), Blackwell's
** convert instruction where the build has a family-specific target, hq_e8m0_from_f32_rp
** elsewhere: the bits of hq_mxfp8_scale_code. Everything is queued on
** call->stream: no allocation, no scratch, no synchronization (update is the same call under
** HQ_CALL_UPDATE). make_empty zeroes scale buffers with cudaMemsetAsync.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "amax_cuda.h"
#include "cuda_check.h"
#include "fp8_cvt_cuda.h"
#include "hp_load_cuda.h"
#include "launch_cuda.h"
#include "mx_cvt_cuda.h"
#include "hq/adamw.h"
#include "hq/numerics.h"
#include "mxfp8.h"
#include "mxfp8_rules.h"

namespace {

constexpr int kBlk = HQ_MXFP8_BLOCK; /* 32 */
constexpr int kCols = 128;           /* tile columns */
constexpr int kThreads = 256;        /* 16 vectors of 8 per tile row, 16 rows per pass */
constexpr int kWarps = kThreads / 32;

struct QArgs {
  const void *x;
  int64_t M, K;
  uint8_t *rd, *rs, *cd, *cs;
  uint16_t *rr, *cr; /* raw_copy: the directions' raw values (BF16 [M, K]); RAW kernels only */
  int rswz, cswz, two_d;
  int rs4;       /* rs is 4-byte aligned (block_2d's rowwise codes go out as words) */
  int row_major; /* tiles in row-major order: blockIdx.x along K (else along M) */
  /* the fused optimizer step (GT != 0): x is the FP32 master, rewritten with m and v */
  const void *g;
  float *m, *v;
  hq_adam_consts k;
  const hq_adam_consts *kd; /* ABI 2.6: NULL, or k in device memory, read as the kernel runs */
};

/* The 8 elements at index i of the FP32 master after one AdamW step (hq_adam_elem, the core's
   rule) with the gradient (dtype GT) and the moments at the same index; master, m and v are
   written back. Each element is read and written by exactly one thread, once. */
template <int GT, bool VEC>
__device__ __forceinline__ void adam_load8(const QArgs &a, int64_t i, float x[8]) {
  float *w = static_cast<float *>(const_cast<void *>(a.x));
  float g[8], m[8], v[8];
  hq_cuda_load8<GT>(a.g, i, VEC, g);
  hq_cuda_load8<HQ_F32>(w, i, VEC, x);
  hq_cuda_load8<HQ_F32>(a.m, i, VEC, m);
  hq_cuda_load8<HQ_F32>(a.v, i, VEC, v);
  for (int k = 0; k < 8; k++) hq_adam_elem(&a.k, g[k], &x[k], &m[k], &v[k]);
  if (VEC) {
    float4 *pw = reinterpret_cast<float4 *>(w + i), *pm = reinterpret_cast<float4 *>(a.m + i),
           *pv = reinterpret_cast<float4 *>(a.v + i);
    pw[0] = make_float4(x[0], x[1], x[2], x[3]);
    pw[1] = make_float4(x[4], x[5], x[6], x[7]);
    pm[0] = make_float4(m[0], m[1], m[2], m[3]);
    pm[1] = make_float4(m[4], m[5], m[6], m[7]);
    pv[0] = make_float4(v[0], v[1], v[2], v[3]);
    pv[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    for (int k = 0; k < 8; k++) {
      w[i + k] = x[k];
      a.m[i + k] = m[k];
      a.v[i + k] = v[k];
    }
  }
}

/* The dequantized value, RN(fp32(q) * 2^(e-127)) (hq_mxfp8_dequantize), with the NaN the CPU
   reference's FP32 multiply returns: IEEE leaves the payload of a NaN product open; the host
   (x86 SSE, AArch64 without default-NaN) returns the NaN operand, quieted, where the GPU returns
   its canonical NaN. Finite and infinite results are untouched. */
__device__ __forceinline__ float deq(uint8_t q, uint8_t e, int elem) {
  const float r = hq_mxfp8_dequantize(q, e, elem);
  if (!hq_isnan(r)) return r;
  const float f = hq_fp8_to_f32(q, elem);
  const uint32_t nb = hq_isnan(f) ? hq_f32_bits(f) : hq_f32_bits(hq_e8m0_to_f32(e));
  return hq_bits_f32(nb | 0x00400000u);
}

/* The BF16 raw values of 8 codes by the rule (deq, then hq_f32_to_bf16): store_raw8's path for a
   vector with a special code or a NaN scale. Not inlined: the kernels that call it keep the
   registers of their common path. */
template <int ELEM>
__device__ __noinline__ void raw8_rule(uint2 q, const uint8_t e[8], uint32_t h[4]) {
  for (int k = 0; k < 8; k += 2) {
    const uint8_t c0 = (uint8_t)((k < 4 ? q.x : q.y) >> (8 * (k % 4)));
    const uint8_t c1 = (uint8_t)((k < 4 ? q.x : q.y) >> (8 * (k % 4 + 1)));
    h[k / 2] = hq_pack2_hp16(deq(c0, e[k], ELEM), deq(c1, e[k + 1], ELEM), HQ_BF16);
  }
}

/* The raw values (raw_copy) of 8 codes just made, packed in q (byte k: element k), with their
   scale codes e[k]: deq's value, rounded to BF16 as hq_store_hp rounds it -- the bytes the
   dequantize kernel writes into a BF16 tensor -- in one 16-byte store (VEC) or element stores.
   Ordinary codes with scales that are not NaN take the dequantize's fast route (shifts and two
   multiplies an element, hq_mxfp8_dequantize_fast), a pair's BF16 high halves taken as they are
   where both low halves are zero (exact), else rounded by hq_f32_to_bf16; the rest raw8_rule. */
template <int ELEM, bool VEC>
__device__ __forceinline__ void store_raw8(uint16_t *p, uint2 q, const uint8_t e[8]) {
  uint32_t h[4];
  uint32_t special = hq_fp8_word_special(q.x, ELEM) | hq_fp8_word_special(q.y, ELEM);
  for (int k = 0; k < 8; k++) special |= e[k] == HQ_E8M0_NAN;
  if (!special) {
    for (int k = 0; k < 8; k += 2) {
      const uint32_t w = k < 4 ? q.x : q.y;
      const uint32_t b0 = hq_f32_bits(hq_mxfp8_dequantize_fast(
                         (uint8_t)(w >> (8 * (k % 4))), hq_e8m0_to_f32(e[k]), ELEM)),
                     b1 = hq_f32_bits(hq_mxfp8_dequantize_fast(
                         (uint8_t)(w >> (8 * (k % 4 + 1))), hq_e8m0_to_f32(e[k + 1]), ELEM));
      h[k / 2] = ((b0 | b1) & 0xffffu) == 0
                     ? __byte_perm(b0, b1, 0x7632)
                     : hq_pack2_hp16(hq_bits_f32(b0), hq_bits_f32(b1), HQ_BF16);
    }
  } else {
    raw8_rule<ELEM>(q, e, h);
  }
  if (VEC) {
    *reinterpret_cast<uint4 *>(p) = make_uint4(h[0], h[1], h[2], h[3]);
  } else {
    for (int k = 0; k < 8; k++) p[k] = (uint16_t)(h[k / 2] >> (16 * (k % 2)));
  }
}

template <bool VEC>
__device__ __forceinline__ void store8(uint8_t *p, uint2 packed) {
  if (VEC) {
    *reinterpret_cast<uint2 *>(p) = packed;
  } else {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)((k < 4 ? packed.x : packed.y) >> (8 * (k % 4)));
  }
}

/* The quantize kernel's modes, a template argument each, so that each mode's registers are its
   own (as flags of one kernel, block_2d's word stores cost the plain kernel registers and
   occupancy).
   The swizzled scale layouts put the tile's codes one byte in 4 over 512-byte spans. There
   kDeferred -- every cast after the column codes, the rows' codes staged in shared memory and
   written as one word per row, as block_2d does -- is faster; with compact scales it is slower,
   so only the swizzled layouts take it. */
constexpr int kOneD = 0;     /* 1x32 / 32x1 blocks, rowwise cast before the columns' codes */
constexpr int kTwoD = 1;     /* block_2d, no rowwise copy */
constexpr int kTwoDRows = 2; /* block_2d with the rowwise copy */
constexpr int kDeferred = 3; /* 1x32 and 32x1, both copies cast after the columns' codes */
/* The CTAs per SM each kernel's registers must allow (an explicit bound: without one the
   compiler takes more registers for the template kernels). Each tile is one CTA, so the loads in
   flight are the resident CTAs'. A 16-bit input read with 16-byte loads (PK below) keeps its
   elements packed, which fits every mode in 32 registers without spills: 8 CTAs, the SM's 2048
   threads. FP32 inputs keep 6 (40 registers), 5 for block_2d with the rowwise copy (48: capped
   at 40 it spills and is slower), and the fused optimizer step 4 (64). */
#ifndef HQ_MXFP8_2D_MIN_BLOCKS
#define HQ_MXFP8_2D_MIN_BLOCKS 5
#endif
#ifndef HQ_MXFP8_MIN_BLOCKS
#define HQ_MXFP8_MIN_BLOCKS 6
#endif
#ifndef HQ_MXFP8_MIN_BLOCKS_PK
#define HQ_MXFP8_MIN_BLOCKS_PK 8
#endif
/* The raw_copy kernels (RAW) hold the codes' values a while longer: they take the bounds of the
   unpacked forms, 6 CTAs (5 for block_2d with the rowwise copy), and 4 with element loads, which
   keep them unspilled. */
template <int DT, bool VEC, int GT, int MODE, bool RAW = false>
constexpr int kMinBlocksOf = GT || (RAW && !VEC)            ? 4
                             : DT != HQ_F32 && VEC && !RAW  ? HQ_MXFP8_MIN_BLOCKS_PK
                             : MODE == kTwoDRows            ? HQ_MXFP8_2D_MIN_BLOCKS
                                                            : HQ_MXFP8_MIN_BLOCKS;
/* The 8 elements of one vector as FP32 (exact): from the thread's packed 16-bit words (PK) or
   its FP32 registers. */
template <int DT, bool PK>
__device__ __forceinline__ void elems8(const uint32_t w[4], const float x[8], float y[8]) {
  if (PK) {
    for (int k = 0; k < 4; k++) {
      y[2 * k] = hq_cuda_hp16_to_f32<DT>(w[k] & 0xffffu);
      y[2 * k + 1] = hq_cuda_hp16_to_f32<DT>(w[k] >> 16);
    }
  } else {
    for (int k = 0; k < 8; k++) y[k] = x[k];
  }
}

/* RAW: the storages keep their raw values (raw_copy): each copy's codes are also written as
   BF16 raw values, from the scale codes they were made with (store_raw8). A kernel of its own,
   so that the kernels without it keep their registers. */
template <int DT, int ELEM, bool VEC, int GT, int MODE, bool RAW>
__global__ void __launch_bounds__(kThreads, kMinBlocksOf<DT, VEC, GT, MODE, RAW>)
    quantize_kernel(QArgs a) {
  if (GT != 0 && a.kd) a.k = *a.kd; /* a graph's replay: this step's constants */
  constexpr int TWO_D = MODE == kTwoD ? 1 : MODE == kTwoDRows ? 2 : 0;
  constexpr bool defer = MODE == kDeferred;
  /* PK: a 16-bit input stays in its packed words (8 registers for the thread's 16 elements, not
     16), its amaxes taken two elements per instruction (hq_cuda_absmax2, NaN ignored as the
     rule wants) and its elements unpacked to FP32 where a cast needs them */
  constexpr bool PK = DT != HQ_F32 && GT == 0 && VEC;
  __shared__ __align__(16) float part[kWarps][kCols]; /* per-warp column maxima */
  __shared__ __align__(16) float s_mult[kCols];          /* per-column multipliers */
  __shared__ __align__(4) uint8_t s_code[kCols / kBlk];  /* block_2d: the tile's block codes */
  __shared__ __align__(4) uint8_t s_rcode[kBlk * 4];     /* defer: the rows' codes */
  __shared__ __align__(16) uint8_t s_e[RAW ? kCols : 1];  /* RAW: per-column scale codes */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, cg = t & 15, r0 = t >> 4;
  const int64_t K = a.K, M = a.M;
  const unsigned bi = a.row_major ? blockIdx.y : blockIdx.x,
                 bj = a.row_major ? blockIdx.x : blockIdx.y;
  const int64_t i0 = (int64_t)bi * kBlk, j0 = (int64_t)bj * kCols;
  const int64_t j = j0 + cg * 8;
  const bool valid = j < K; /* K % 32 == 0: the 4 lanes of a 32-block agree */
  float x[2][8];
  uint32_t w[2][4];
  for (int p = 0; p < 2; p++) {
    if (PK) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (valid)
        u = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.x) +
                                                  (i0 + r0 + 16 * p) * K + j));
      w[p][0] = u.x; w[p][1] = u.y; w[p][2] = u.z; w[p][3] = u.w;
    } else if (valid && GT) {
      adam_load8<GT, VEC>(a, (i0 + r0 + 16 * p) * K + j, x[p]);
    } else if (valid) {
      hq_cuda_load8<DT>(a.x, (i0 + r0 + 16 * p) * K + j, VEC, x[p]);
    } else {
      for (int k = 0; k < 8; k++) x[p][k] = 0.0f;
    }
  }

  float rmult[2] = {0.0f, 0.0f};
  if (!TWO_D && a.rd) { /* rowwise 1x32 blocks: 4 lanes each */
    /* the thread's two rows' partial maxima, reduce-scattered over the block's 4 lanes: lanes
       with bit 0 = p finish row p (2 shuffles), each computes one scale code, not two, and
       the multipliers travel back by shuffle */
    float m0 = 0.0f, m1 = 0.0f;
    if (PK) {
      m0 = hq_cuda_words_amax<DT, 4>(w[0]);
      m1 = hq_cuda_words_amax<DT, 4>(w[1]);
    } else {
      for (int k = 0; k < 8; k++) {
        m0 = hq_cuda_amax_step(m0, x[0][k]);
        m1 = hq_cuda_amax_step(m1, x[1][k]);
      }
    }
    const bool b0 = lane & 1;
    float m = fmaxf(b0 ? m1 : m0, __shfl_xor_sync(0xffffffffu, b0 ? m0 : m1, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const uint8_t e = hq_cuda_e8m0_rp(hq_mxfp8_scale_t(m, ELEM)); /* of row i0 + r0 + 16 * b0 */
    const float my_mult = hq_e8m0_quant_mult(e);
    for (int p = 0; p < 2; p++) rmult[p] = __shfl_sync(0xffffffffu, my_mult, (lane & ~3) | p);
    if (defer) {
      if (!(lane & 2)) s_rcode[(r0 + 16 * b0) * 4 + (cg >> 2)] = e;
    } else {
      if (valid && !(lane & 2))
        a.rs[hq_mxfp8_row_scale_idx(i0 + r0 + 16 * b0, j / kBlk, K, a.rswz)] = e;
      uint8_t er[2] = {0, 0}; /* RAW: the two rows' codes, from the lanes that made them */
      if (RAW)
        for (int p = 0; p < 2; p++)
          er[p] = (uint8_t)__shfl_sync(0xffffffffu, (uint32_t)e, (lane & ~3) | p);
      for (int p = 0; p < 2; p++) {
        float y[8];
        elems8<DT, PK>(w[p], x[p], y);
        const uint2 q = hq_cuda_cast8<ELEM>(y, rmult[p]);
        if (valid) store8<VEC>(a.rd + (i0 + r0 + 16 * p) * K + j, q);
        if (RAW && valid) {
          const uint8_t ev[8] = {er[p], er[p], er[p], er[p], er[p], er[p], er[p], er[p]};
          store_raw8<ELEM, VEC>(a.rr + (i0 + r0 + 16 * p) * K + j, q, ev);
        }
      }
    }
  }
  if (!TWO_D && !a.cd) return; /* uniform over the CTA */

  /* column maxima over the tile's 32 rows (NaN only where all behind them are; the chain over
     the warps' partial maxima starts at 0) */
  if (PK) { /* packed: part holds [kWarps][kCols / 2] words, two columns each */
    uint32_t c[4];
    for (int h = 0; h < 4; h++) {
      c[h] = hq_cuda_absmax2<DT>(w[0][h], w[1][h]);
      c[h] = hq_cuda_absmax2<DT>(c[h], __shfl_xor_sync(0xffffffffu, c[h], 16));
    }
    if (lane < 16)
      reinterpret_cast<uint4 *>(&part[warp][0])[cg] = make_uint4(c[0], c[1], c[2], c[3]);
  } else {
    float cm[8];
    for (int k = 0; k < 8; k++) {
      cm[k] = fmaxf(fabsf(x[0][k]), fabsf(x[1][k]));
      cm[k] = fmaxf(cm[k], __shfl_xor_sync(0xffffffffu, cm[k], 16));
    }
    if (lane < 16) {
      float4 *dst = reinterpret_cast<float4 *>(&part[warp][cg * 8]);
      dst[0] = make_float4(cm[0], cm[1], cm[2], cm[3]);
      dst[1] = make_float4(cm[4], cm[5], cm[6], cm[7]);
    }
  }
  __syncthreads();
  if (t < kCols) {
    float m = 0.0f;
    if (PK) {
      uint32_t c = reinterpret_cast<const uint32_t *>(&part[0][0])[t >> 1];
      for (int v = 1; v < kWarps; v++)
        c = hq_cuda_absmax2<DT>(c, reinterpret_cast<const uint32_t *>(&part[v][0])[t >> 1]);
      m = hq_cuda_lane_amax<DT>(c, t & 1);
    } else {
      for (int v = 0; v < kWarps; v++) m = fmaxf(m, part[v][t]);
    }
    if (TWO_D) /* warp w < 4 holds the 32 columns of block w: the tile's amax */
      for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    const uint8_t e = hq_cuda_e8m0_rp(hq_mxfp8_scale_t(m, ELEM));
    s_mult[t] = hq_e8m0_quant_mult(e);
    if (RAW) s_e[t] = e;
    const int64_t jc = j0 + t;
    if (a.cd && jc < K) a.cs[hq_mxfp8_col_scale_idx(i0 / kBlk, jc, M, K, a.cswz)] = e;
    if (TWO_D == 2 && a.rd && lane == 0) s_code[warp] = e; /* warp w < 4: block w's code */
  }
  __syncthreads();
  float mult[8];
  {
    const float4 *s = reinterpret_cast<const float4 *>(&s_mult[cg * 8]);
    float4 u = s[0], v = s[1];
    mult[0] = u.x; mult[1] = u.y; mult[2] = u.z; mult[3] = u.w;
    mult[4] = v.x; mult[5] = v.y; mult[6] = v.z; mult[7] = v.w;
  }
  if (valid) {
    for (int p = 0; p < 2; p++) {
      float y[8];
      elems8<DT, PK>(w[p], x[p], y);
      const uint2 q = hq_cuda_cast8v<ELEM>(y, mult);
      const int64_t off = (i0 + r0 + 16 * p) * K + j;
      if (defer) {
        const uint2 qr = hq_cuda_cast8<ELEM>(y, rmult[p]);
        store8<VEC>(a.rd + off, qr);
        if (RAW) { /* the row's code of this 32-block, staged above */
          const uint8_t er = s_rcode[(r0 + 16 * p) * 4 + (cg >> 2)];
          const uint8_t ev[8] = {er, er, er, er, er, er, er, er};
          store_raw8<ELEM, VEC>(a.rr + off, qr, ev);
        }
      }
      if (a.cd) store8<VEC>(a.cd + off, q);
      if (TWO_D == 2 && a.rd) store8<VEC>(a.rd + off, q);
      if (RAW) { /* the columns' codes: both copies' with block_2d (the same bytes) */
        uint8_t ev[8];
        for (int k = 0; k < 8; k++) ev[k] = s_e[cg * 8 + k];
        if (a.cd) store_raw8<ELEM, VEC>(a.cr + off, q, ev);
        if (TWO_D == 2 && a.rd) store_raw8<ELEM, VEC>(a.rr + off, q, ev);
      }
    }
  }
  /* 2-D rowwise codes: thread r < 32 writes row i0 + r's codes of the tile's 4 blocks, one
     4-byte word (4 consecutive, aligned entries in either layout) where all 4 blocks lie inside
     K, after the data (the elements' registers free by then): one byte per thread and block
     would make a sector write per byte */
  if ((TWO_D == 2 && a.rd && t < kBlk) || (defer && t >= kThreads - kBlk)) {
    const int64_t kb0 = j0 / kBlk;
    const int r = t & (kBlk - 1);
    const uint32_t w = TWO_D ? *reinterpret_cast<const uint32_t *>(s_code)
                             : reinterpret_cast<const uint32_t *>(s_rcode)[r];
    if (a.rs4 && j0 + kCols <= K) {
      *reinterpret_cast<uint32_t *>(a.rs + hq_mxfp8_row_scale_idx(i0 + r, kb0, K, a.rswz)) = w;
    } else {
      for (int b = 0; b < kCols / kBlk; b++)
        if (j0 + kBlk * b < K)
          a.rs[hq_mxfp8_row_scale_idx(i0 + r, kb0 + b, K, a.rswz)] = (uint8_t)(w >> (8 * b));
    }
  }
}

/* Zero the padding of one scale buffer: logical index pairs (u, v) with u in [0, Up), v in
   [0, Vp), padding where u >= U or v >= V; byte offset from the rules' index function
   (rowwise: (i, kb); columnwise: (mb, j)), so both layouts are covered. */
struct PadArgs {
  uint8_t *p;
  int colwise, swz;
  int64_t M, K, U, V, Up, Vp, n1, n; /* n1 = (Up - U) * Vp entries below, n in all */
};

__global__ void pad_kernel(PadArgs a0, PadArgs a1) {
  for (int b = 0; b < 2; b++) {
    const PadArgs &a = b ? a1 : a0;
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < a.n;
         n += (int64_t)gridDim.x * blockDim.x) {
      int64_t u, v;
      if (n < a.n1) {
        u = a.U + n / a.Vp, v = n % a.Vp;
      } else {
        const int64_t m = n - a.n1, w = a.Vp - a.V;
        u = m / w, v = a.V + m % w;
      }
      const int64_t off = a.colwise ? hq_mxfp8_col_scale_idx(u, v, a.M, a.K, a.swz)
                                    : hq_mxfp8_row_scale_idx(u, v, a.K, a.swz);
      a.p[off] = 0;
    }
  }
}

PadArgs pad_args(uint8_t *p, int colwise, int swz, int64_t M, int64_t K) {
  PadArgs a;
  a.p = p;
  a.colwise = colwise;
  a.swz = swz;
  a.M = M;
  a.K = K;
  if (!p) {
    a.U = a.V = a.Up = a.Vp = a.n1 = a.n = 0;
    return a;
  }
  if (colwise) {
    a.U = M / kBlk, a.V = K;
    a.Up = hq_mxfp8_col_scale_rows(M), a.Vp = hq_mxfp8_col_scale_cols(K);
  } else {
    a.U = M, a.V = K / kBlk;
    a.Up = hq_mxfp8_row_scale_rows(M), a.Vp = hq_mxfp8_row_scale_cols(K);
  }
  a.n1 = (a.Up - a.U) * a.Vp;
  a.n = a.n1 + a.U * (a.Vp - a.V);
  return a;
}

/* The fast path of one run of 16 codes (vector loads and stores): every code ordinary
   (hq_fp8_word_special, 4 codes per test) and no scale NaN -> hq_mxfp8_dequantize_fast, the rule
   by shifts and two multiplies (mxfp8_rules.h); for BF16 the FP32 results' high halves -- exact
   whenever no result has a bit in its low half, which the run checks (every normal FP32 result
   has at most 4 significant bits; only FP32-subnormal results of the smallest scales may not),
   else RNE as hq_f32_to_bf16; F16 through hq_f32_to_f16. Returns false, having written
   nothing, when the run needs the reference path (NaN/Inf codes, a NaN scale). */
template <int OT, int ELEM>
__device__ __forceinline__ bool deq_fast(uint4 u, const uint8_t *__restrict__ qs, int swz,
                                         int colwise, void *__restrict__ dst, int64_t e0, int64_t i,
                                         int64_t j, int64_t M, int64_t K) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  uint32_t special = 0;
  for (int h = 0; h < 4; h++) special |= hq_fp8_word_special(w[h], ELEM);
  float s[16];
  if (!colwise) {
    const uint8_t r = qs[hq_mxfp8_row_scale_idx(i, j / kBlk, K, swz)];
    special |= r == HQ_E8M0_NAN;
    const float sv = hq_e8m0_to_f32(r);
    for (int k = 0; k < 16; k++) s[k] = sv;
  } else {
    uint8_t e[16];
    if (!swz) { /* compact: the run's 16 scales are consecutive bytes of one row */
      const uint8_t *p = qs + hq_mxfp8_col_scale_idx(i / kBlk, j, M, K, 0);
      for (int k = 0; k < 16; k++) e[k] = p[k];
    } else {
      for (int k = 0; k < 16; k++) e[k] = qs[hq_mxfp8_col_scale_idx(i / kBlk, j + k, M, K, 1)];
    }
    for (int k = 0; k < 16; k++) {
      special |= e[k] == HQ_E8M0_NAN;
      s[k] = hq_e8m0_to_f32(e[k]);
    }
  }
  if (special) return false;
  uint32_t b[16], low = 0;
  for (int k = 0; k < 16; k++) {
    b[k] = hq_f32_bits(hq_mxfp8_dequantize_fast((uint8_t)(w[k / 4] >> (8 * (k % 4))), s[k], ELEM));
    low |= b[k];
  }
  if (OT == HQ_F32) {
    uint4 *o = reinterpret_cast<uint4 *>(static_cast<float *>(dst) + e0);
    for (int h = 0; h < 4; h++) o[h] = make_uint4(b[4 * h], b[4 * h + 1], b[4 * h + 2], b[4 * h + 3]);
    return true;
  }
  uint32_t h[8];
  if (OT == HQ_BF16 && (low & 0xffffu) == 0) {
    for (int k = 0; k < 8; k++) h[k] = __byte_perm(b[2 * k], b[2 * k + 1], 0x7632);
  } else {
    for (int k = 0; k < 8; k++) {
      const float lo = hq_bits_f32(b[2 * k]), hi = hq_bits_f32(b[2 * k + 1]);
      h[k] = OT == HQ_F16 ? (uint32_t)hq_f32_to_f16(lo) | (uint32_t)hq_f32_to_f16(hi) << 16
                          : (uint32_t)hq_f32_to_bf16(lo) | (uint32_t)hq_f32_to_bf16(hi) << 16;
    }
  }
  uint4 *o = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(dst) + e0);
  o[0] = make_uint4(h[0], h[1], h[2], h[3]);
  o[1] = make_uint4(h[4], h[5], h[6], h[7]);
  return true;
}

/* Each thread turns a run of 16 consecutive elements of one row into the output (one 16-byte
   load of codes when VEC; a warp writes one contiguous span); SMALL (M * K < 2^32) finds the
   run's row with 32-bit arithmetic (a 64-bit division costs more than the element work).
   K % 32 == 0: a run never crosses a row or a 32-block. Runs with NaN/Inf codes or NaN scales,
   and unaligned pointers, take the reference rule element by element (deq). */
template <int OT, bool VEC, bool SMALL, int ELEM>
__global__ void __launch_bounds__(256)
dequantize_kernel(const uint8_t *__restrict__ qd, const uint8_t *__restrict__ qs, int elem_rt,
                  int swz, int colwise, void *__restrict__ dst, int64_t M, int64_t K) {
  (void)elem_rt;
  constexpr int elem = ELEM; /* the element kind, fixed at compile time */
  constexpr int EPT = 16;
  const int64_t nrun = M * K / EPT;
  for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < nrun;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = g * EPT;
    int64_t i, j;
    hq_cuda_row_col<SMALL>(e0, K, &i, &j);
    uint8_t q[EPT];
    if (VEC) {
      const uint4 u = __ldg(reinterpret_cast<const uint4 *>(qd + e0));
      if (deq_fast<OT, ELEM>(u, qs, swz, colwise, dst, e0, i, j, M, K)) continue;
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
      for (int k = 0; k < EPT; k++) q[k] = (uint8_t)(w[k / 4] >> (8 * (k % 4)));
    } else {
      for (int k = 0; k < EPT; k++) q[k] = qd[e0 + k];
    }
    for (int k = 0; k < EPT; k++) {
      const uint8_t e = colwise ? qs[hq_mxfp8_col_scale_idx(i / kBlk, j + k, M, K, swz)]
                                : qs[hq_mxfp8_row_scale_idx(i, j / kBlk, K, swz)];
      hq_store_hp(dst, e0 + k, OT, deq(q[k], e, elem));
    }
  }
}

bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

template <int DT, int ELEM, int GT, int MODE>
void launch_quantize_2d(const QArgs &a, bool vec, dim3 grid, cudaStream_t stream) {
  const bool raw = a.rr || a.cr;
  if (vec && raw)
    quantize_kernel<DT, ELEM, true, GT, MODE, true><<<grid, kThreads, 0, stream>>>(a);
  else if (vec)
    quantize_kernel<DT, ELEM, true, GT, MODE, false><<<grid, kThreads, 0, stream>>>(a);
  else if (raw)
    quantize_kernel<DT, ELEM, false, GT, MODE, true><<<grid, kThreads, 0, stream>>>(a);
  else
    quantize_kernel<DT, ELEM, false, GT, MODE, false><<<grid, kThreads, 0, stream>>>(a);
}

template <int DT, int ELEM, int GT>
void launch_quantize(const QArgs &a, bool vec, dim3 grid, cudaStream_t stream) {
  /* both directions with a swizzled scale layout: kDeferred, but for the fused optimizer step,
     which keeps kOneD (no kernel of that mode is built for it) */
  constexpr int kSwizzledBoth = GT == 0 ? kDeferred : kOneD;
  if (a.two_d && a.rd)
    launch_quantize_2d<DT, ELEM, GT, kTwoDRows>(a, vec, grid, stream);
  else if (a.two_d)
    launch_quantize_2d<DT, ELEM, GT, kTwoD>(a, vec, grid, stream);
  else if (a.rd && a.cd && (a.rswz || a.cswz))
    launch_quantize_2d<DT, ELEM, GT, kSwizzledBoth>(a, vec, grid, stream);
  else
    launch_quantize_2d<DT, ELEM, GT, kOneD>(a, vec, grid, stream);
}

template <int DT, int GT>
void launch_quantize_dt(const QArgs &a, int elem, bool vec, dim3 grid, cudaStream_t stream) {
  if (elem == HQ_E5M2)
    launch_quantize<DT, HQ_E5M2, GT>(a, vec, grid, stream);
  else
    launch_quantize<DT, HQ_E4M3, GT>(a, vec, grid, stream);
}

template <int OT, int ELEM>
void launch_dequantize_e(bool vec, bool small, unsigned blocks, cudaStream_t stream,
                         const uint8_t *qd, const uint8_t *qs, int swz, int colwise, void *dst,
                         int64_t M, int64_t K) {
  if (vec && small)
    dequantize_kernel<OT, true, true, ELEM><<<blocks, 256, 0, stream>>>(qd, qs, ELEM, swz, colwise, dst, M, K);
  else if (vec)
    dequantize_kernel<OT, true, false, ELEM><<<blocks, 256, 0, stream>>>(qd, qs, ELEM, swz, colwise, dst, M, K);
  else if (small)
    dequantize_kernel<OT, false, true, ELEM><<<blocks, 256, 0, stream>>>(qd, qs, ELEM, swz, colwise, dst, M, K);
  else
    dequantize_kernel<OT, false, false, ELEM><<<blocks, 256, 0, stream>>>(qd, qs, ELEM, swz, colwise, dst, M, K);
}

template <int OT>
void launch_dequantize(bool vec, unsigned blocks, cudaStream_t stream, const uint8_t *qd,
                       const uint8_t *qs, int elem, int swz, int colwise, void *dst, int64_t M,
                       int64_t K) {
  const bool small = (uint64_t)(M * K) < ((uint64_t)1 << 32);
  if (elem == HQ_E5M2)
    launch_dequantize_e<OT, HQ_E5M2>(vec, small, blocks, stream, qd, qs, swz, colwise, dst, M, K);
  else
    launch_dequantize_e<OT, HQ_E4M3>(vec, small, blocks, stream, qd, qs, swz, colwise, dst, M, K);
}

/* Between a swizzled scale buffer and its FSDP form: one thread per byte t of the form
   (to_form) or of the buffer, entry (t / C, t % C) moved by the CPU loop's hq_mxfp8_form_move
   (a permutation: the same bytes by construction). */
__global__ void __launch_bounds__(256)
    scale_form_kernel(uint8_t *swz, uint8_t *form, int colwise, int64_t M, int64_t K,
                      int64_t rows, int64_t n, int64_t C, int to_form) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += step) {
    const int64_t a = t / C;
    hq_mxfp8_form_move(swz, form, colwise, M, K, rows, C, a, t - a * C, to_form);
  }
}

} // namespace

extern "C" int mxfp8_cuda_scale_form(const hq_call *call, uint8_t *swizzled, uint8_t *form,
                                     int colwise, int64_t M, int64_t K, int64_t rows, int64_t R,
                                     int64_t C, int to_form) {
  const int64_t n = R * C;
  if (n == 0) return HQ_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 132 * 16) blocks = 132 * 16;
  scale_form_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)call->stream>>>(
      swizzled, form, colwise, M, K, rows, n, C, to_form);
  CHECK_LAUNCH(call, to_form ? "FSDP form kernel (un-swizzle)" : "FSDP form kernel (swizzle)");
  return HQ_OK;
}

extern "C" int mxfp8_cuda_quantize(const mxfp8_cuda_job *q, const hq_call *call,
                                   const hq_tensor *src) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = q->M, K = q->K;
  if (src->dtype != HQ_F32 && src->dtype != HQ_F16 && src->dtype != HQ_BF16)
    return call->host->error(HQ_EINVAL, "mxfp8 CUDA: source dtype %d", (int)src->dtype);
  /* the padding of the scale buffers (none when M % 128 == 0 and K % 128 == 0) */
  PadArgs p0 = pad_args(q->rs, 0, q->rswz, M, K), p1 = pad_args(q->cs, 1, q->cswz, M, K);
  const int64_t npad = p0.n > p1.n ? p0.n : p1.n;
  if (npad > 0) {
    int64_t blocks = (npad + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    pad_kernel<<<(unsigned)blocks, 256, 0, stream>>>(p0, p1);
    CHECK_LAUNCH(call, "scale padding kernel");
  }
  if (M * K == 0) return HQ_OK;
  /* tiles: gx row blocks of 32, gy column blocks of 128; one of them must fit the grid's y
     limit (65535) and the other its x limit (2^31 - 1) */
  const int64_t gx = M / kBlk, gy = (K + kCols - 1) / kCols;
  if (!(gx <= 65535 && gy <= 0x7fffffff) && !(gy <= 65535 && gx <= 0x7fffffff))
    return call->host->error(HQ_ESHAPE, "mxfp8 CUDA: shape [%lld, %lld] exceeds the grid limits "
                             "(rows <= %d or cols <= %d)", (long long)M, (long long)K,
                             65535 * kBlk, 65535 * kCols);
  QArgs a;
  a.kd = nullptr;
  a.x = src->data;
  a.M = M;
  a.K = K;
  a.rd = q->rd;
  a.rs = q->rs;
  a.cd = q->cd;
  a.cs = q->cs;
  a.rswz = q->rswz;
  a.cswz = q->cswz;
  a.two_d = q->two_d;
  a.rs4 = aligned(q->rs, 4);
  a.rr = q->rr;
  a.cr = q->cr;
  bool vec = aligned(src->data, 16) && aligned(q->rd, 8) && aligned(q->cd, 8) &&
             aligned(q->rr, 16) && aligned(q->cr, 16);
  /* row-major tile order (blockIdx.x along K) wherever the grid's y limit allows: consecutive
     CTAs read neighbouring 256-byte row segments and write neighbouring 128-byte ones, so the
     CTAs running at once stream whole rows (column-major order strides down M, reading and
     writing short segments far apart) */
  a.row_major = gx <= 65535;
  const dim3 grid = a.row_major ? dim3((unsigned)gy, (unsigned)gx)
                                : dim3((unsigned)gx, (unsigned)gy);
  if (q->adam) { /* the fused optimizer step: src is the FP32 master (checked in mxfp8.c) */
    a.g = q->adam->grad;
    a.m = q->adam->m;
    a.v = q->adam->v;
    a.k = q->adam->k;
    a.kd = hq_adam_pass_k_dev(q->adam);
    vec = vec && aligned(a.g, 16) && aligned(a.m, 16) && aligned(a.v, 16);
    switch (q->adam->grad_dtype) {
    case HQ_F32: launch_quantize_dt<HQ_F32, HQ_F32>(a, q->elem, vec, grid, stream); break;
    case HQ_F16: launch_quantize_dt<HQ_F32, HQ_F16>(a, q->elem, vec, grid, stream); break;
    default: launch_quantize_dt<HQ_F32, HQ_BF16>(a, q->elem, vec, grid, stream); break;
    }
    CHECK_LAUNCH(call, "quantize kernel with the fused optimizer step");
    return HQ_OK;
  }
  a.g = NULL;
  a.m = a.v = NULL;
  switch (src->dtype) {
  case HQ_F32: launch_quantize_dt<HQ_F32, 0>(a, q->elem, vec, grid, stream); break;
  case HQ_F16: launch_quantize_dt<HQ_F16, 0>(a, q->elem, vec, grid, stream); break;
  default: launch_quantize_dt<HQ_BF16, 0>(a, q->elem, vec, grid, stream); break;
  }
  CHECK_LAUNCH(call, "quantize kernel");
  return HQ_OK;
}

extern "C" int mxfp8_cuda_dequantize(const hq_call *call, const uint8_t *data,
                                     const uint8_t *scale, hq_dtype elem, int swizzled,
                                     int colwise, hq_tensor *dst) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = dst->rows, K = dst->cols, nrun = M * K / 16;
  if (nrun == 0) return HQ_OK;
  int64_t blocks = (nrun + 255) / 256;
  blocks = hq_cuda_stride_grid(call->device, blocks);
  const bool vec = aligned(data, 16) && aligned(dst->data, 16);
  switch (dst->dtype) {
  case HQ_F32:
    launch_dequantize<HQ_F32>(vec, (unsigned)blocks, stream, data, scale, (int)elem, swizzled,
                              colwise, dst->data, M, K);
    break;
  case HQ_F16:
    launch_dequantize<HQ_F16>(vec, (unsigned)blocks, stream, data, scale, (int)elem, swizzled,
                              colwise, dst->data, M, K);
    break;
  case HQ_BF16:
    launch_dequantize<HQ_BF16>(vec, (unsigned)blocks, stream, data, scale, (int)elem, swizzled,
                               colwise, dst->data, M, K);
    break;
  default:
    return call->host->error(HQ_EINVAL, "mxfp8 CUDA: destination dtype %d", (int)dst->dtype);
  }
  CHECK_LAUNCH(call, "dequantize kernel");
  return HQ_OK;
}

extern "C" int mxfp8_cuda_zero(const hq_call *call, void *ptr, size_t bytes) {
  if (bytes == 0) return HQ_OK;
  CHECK_CUDA(call, cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)call->stream));
  return HQ_OK;
}
