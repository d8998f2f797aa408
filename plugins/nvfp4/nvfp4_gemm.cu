/*
** nvfp4_gemm.cu -- the nvfp4 module's own GEMM of two nvfp4 storages on Hopper, which has no FP4
** tensor cores (nvfp4.c's gemm op takes compute capability 9.x alone): the emulated product (the
** raw values of both operands in BF16, FP32 accumulation, both per-tensor factors folded into
** alpha) in ONE kernel, for the small problems where the emulated path's two launches -- the
** dequantize of both operands into BF16 temporaries, then a cuBLASLt GEMM -- cost more than the
** work (nvfp4.c's gemm op says which).
**
** Why: at a trainer's small sizes (256 x 256 x 256) each launch of the emulated path is a few
** microseconds of latency and almost no work; one kernel that reads both operands' codes and
** scales, decodes them into shared memory and multiplies there takes one launch's latency.
**
** D(i, j) = ((alpha * fa) * fb) * sum_k raw_A(i, k) raw_B(j, k) (+ beta * D(i, j)) (+ bias[i]), i <
** m over A's stored rows, j < n over B's, D row-major [n, m] in F32 or BF16, rounded once; fa, fb
** the storages' per-tensor factors hq_nvfp4_tensor_factor_k(amax) (1 with global_scale = none),
** multiplied into alpha in the emulated path's order. A row-scaled operand (global_scale = row)
** has no factor in alpha: the product is multiplied by its row's factor
** hq_nvfp4_tensor_factor_k(amax[i]) (A's, then B's amax[j]) before beta and the bias, as the
** emulated path's epilogue multiplies it. Each operand is a k-contiguous nvfp4 storage
** (the direction the core picks for a GEMM always is): codes [outer, k / 2] bytes, low nibble
** first, and one scale byte per 1x16 block at hq_nvfp4_scale_offset (compact or swizzled; block_2d
** stores its tile's scale in every row). raw = e2m1(code) * fp32(sf) has at most 6 significant bits
** (nvfp4_rules.h): exact in BF16, so the BF16 product of the code's E2M1 value and the scale (one
** rounding of an exact product) is the raw value bit for bit, and the result equals the emulated
** path's up to the order of accumulation.
**
** The kernel: a CTA makes a 32 x 32 tile of D with 4 warps (2 x 2, each 16 x 16: two m16n8k16 BF16
** MMAs per 16 of k). k is walked in chunks of kChunk: each thread loads 4 blocks of A and 4 of B (8
** code bytes and a scale byte each), decodes them through a 256-entry table of E2M1 pairs, a
** 256-entry table of the operand's fp32(sf) and one BF16x2 multiply per code byte, and stores them
** into the chunk's row of shared memory; after a barrier the warps read their fragments with
** ldmatrix. Blocks past k or rows past m / n are zeros. The accumulators go through shared memory
** to the shared epilogue (small_gemm_cuda.h): 4-element stores of D where its rows allow.
** Small tiles keep the CTAs many (64 at 256 x 256): the decode of a chunk, not the MMAs, is each
** CTA's work, and it is redone for every tile along the other dimension, which is why the module
** takes small problems only.
*/
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "small_gemm_cuda.h"
#include "smem_cuda.h"
#include "hq/numerics.h"
#include "nvfp4.h"
#include "nvfp4_rules.h"

namespace {

constexpr int kTile = NVFP4_GEMM_TILE;      /* D's tile: kTile rows of A x kTile rows of B */
constexpr int kThreads = 128;               /* 4 warps, 2 x 2 over the tile */
constexpr int kChunk = 256;                 /* elements of k per chunk in shared memory */
constexpr int kBlocks = kChunk / 16;        /* 16-element blocks per row and chunk */
constexpr int kLd = kChunk + 8;             /* BF16 row stride: 16 bytes of padding, so that
                                               ldmatrix's 8 row addresses hit distinct banks */
constexpr int kPerThread = kTile * kBlocks / kThreads; /* blocks of each operand per thread */
static_assert(kTile * kBlocks % kThreads == 0, "whole blocks per thread");

/* An E2M1 code's value as BF16 bits: the rule's FP32 value, exact in BF16 (2 significant bits) */
__device__ __forceinline__ uint32_t e2m1_bf16(uint32_t c) {
  return __float_as_uint(hq_e2m1_to_f32(c)) >> 16;
}

/* One operand's rows and its scale decode: rows past `rows` read as zeros. */
struct Operand {
  const uint8_t *q, *sc;
  int64_t rows;
  int swizzle;
  int kind;
};

/* The thread's blocks of one operand for the chunk from k0: block column blk (t % kBlocks) of
   rows r0 + kRowStep * j. Offsets fit 32 bits: the op takes m * n * k <= HQ_NVFP4_GEMM_MAX_MNK,
   which nvfp4.c keeps at most 2^31. */
static_assert(kThreads % kBlocks == 0, "a thread's blocks share one block column");
constexpr int kRowStep = kThreads / kBlocks;
__device__ __forceinline__ void load_blocks(const Operand &o, uint32_t r0, uint32_t k, uint32_t k0,
                                            uint2 code[kPerThread], uint8_t sf[kPerThread]) {
  const uint32_t kb = k0 / 16 + (uint32_t)(threadIdx.x % kBlocks);
  const bool in_k = kb * 16 < k;
#pragma unroll
  for (int j = 0; j < kPerThread; j++) {
    const uint32_t r = r0 + kRowStep * j;
    code[j] = make_uint2(0u, 0u);
    sf[j] = 0;
    if (in_k && r < (uint64_t)o.rows) {
      code[j] = *reinterpret_cast<const uint2 *>(o.q + (r * (k / 2) + kb * 8));
      sf[j] = o.sc[hq_nvfp4_scale_offset(r, kb, k, o.swizzle)];
    }
  }
}

/* The raw values of the loaded blocks, BF16, into s: byte e of a block's codes holds elements 2e
   (low nibble) and 2e + 1; one BF16x2 multiply by (sf, sf) per byte, exact (see the top). stab:
   the operand's fp32(sf) as BF16 bits, exact (at most 4 significant bits; NaN stays NaN). */
__device__ __forceinline__ void store_blocks(const uint32_t *tab, const uint16_t *stab, uint16_t *s,
                                             const uint2 code[kPerThread],
                                             const uint8_t sf[kPerThread]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kPerThread; j++) {
    const int row = t / kBlocks + kRowStep * j, blk = t % kBlocks;
    const __nv_bfloat16 sb = __ushort_as_bfloat16(stab[sf[j]]);
    const __nv_bfloat162 s2 = __halves2bfloat162(sb, sb);
    uint32_t w[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const uint32_t byte = ((e < 4 ? code[j].x : code[j].y) >> (8 * (e & 3))) & 0xffu;
      const uint32_t p = tab[byte];
      __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162 *>(&p);
      v = __hmul2(v, s2);
      w[e] = *reinterpret_cast<const uint32_t *>(&v);
    }
    uint4 *dst = reinterpret_cast<uint4 *>(s + row * kLd + blk * 16);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct GemmArgs {
  Operand a, b;
  const float *amax_a, *amax_b; /* NULL: factor 1; else the tensor's, or each row's (row_*) */
  int row_a, row_b;
  int64_t m, n, k;
  void *d;
  const void *bias; /* NULL or [m] */
  int bias_dtype;
  float alpha, beta;
};

/* The tile of accumulators in shared memory for the epilogue, rows of kTile + 4 floats: a
   warp's fragment stores (2 (lane % 4) rows apart, lane / 4 columns) then hit 32 banks. */
constexpr int kCsLd = kTile + 4;

/* DT: D's dtype (HQ_F32 or HQ_BF16), a template parameter so that D's loads and stores are
   one instruction each. A small call runs each instruction about once per SM, so every
   instruction is fetched cold: the loops that do not hide a load's latency are kept rolled
   and the epilogue is one loop over the tile through shared memory. */
template <int DT> __global__ void __launch_bounds__(kThreads) small_gemm_kernel(GemmArgs g) {
  /* A's chunk, then (after the loop) the accumulators */
  __shared__ __align__(16) union {
    uint16_t h[kTile * kLd];
    float f[kTile * kCsLd];
  } sa_u;
  __shared__ __align__(16) uint16_t sb[kTile * kLd];
  __shared__ uint32_t tab[256];     /* code byte -> its two E2M1 values as BF16x2 (low nibble low) */
  uint16_t *const sa = sa_u.h;
  __shared__ uint16_t stab[2][256]; /* scale byte -> fp32(sf) as BF16 bits, per operand's kind */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const uint32_t i0 = blockIdx.x * kTile, j0 = blockIdx.y * kTile, k = (uint32_t)g.k;
  const uint32_t r0 = (uint32_t)(t / kBlocks);
  uint2 ca[kPerThread], cb[kPerThread];
  uint8_t fa[kPerThread], fb[kPerThread];
  /* the first chunk's codes in flight while the tables are made */
  load_blocks(g.a, i0 + r0, k, 0, ca, fa);
  load_blocks(g.b, j0 + r0, k, 0, cb, fb);
  /* the per-tensor amaxes loaded with the codes (not after the MMAs, where their latency was
     the epilogue's) */
  const bool fac_a = g.amax_a && !g.row_a, fac_b = g.amax_b && !g.row_b;
  const float amax_a = fac_a ? __ldg(g.amax_a) : 0.0f, amax_b = fac_b ? __ldg(g.amax_b) : 0.0f;
#pragma unroll 1
  for (int i = t; i < 256; i += kThreads) {
    tab[i] = e2m1_bf16(i & 15u) | (e2m1_bf16(i >> 4) << 16);
    stab[0][i] = (uint16_t)(__float_as_uint(hq_nvfp4_raw_mult_k((uint8_t)i, g.a.kind)) >> 16);
    stab[1][i] = (uint16_t)(__float_as_uint(hq_nvfp4_raw_mult_k((uint8_t)i, g.b.kind)) >> 16);
  }
  const int wm = warp >> 1, wn = warp & 1; /* the warp's 16 x 16 of the tile */
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  __syncthreads(); /* the tables */
  /* the emulated path's alpha: (alpha * fa) * fb of the per-tensor factors; a row-scaled
     operand's factors multiply the product after it, as that path's epilogue does */
  float alpha = g.alpha;
  if (fac_a) alpha = alpha * hq_nvfp4_tensor_factor_k(amax_a, g.a.kind);
  if (fac_b) alpha = alpha * hq_nvfp4_tensor_factor_k(amax_b, g.b.kind);
  /* ldmatrix rows: A's 16 rows (lanes 0-15 columns 0-7, 16-31 columns 8-15); B's 16 rows as
     two n8 tiles (lanes 0-7 and 16-23 columns 0-7, 8-15 and 24-31 columns 8-15) */
  const uint16_t *pa = sa + (wm * 16 + (lane & 15)) * kLd + (lane >> 4) * 8;
  const uint16_t *pb = sb + (wn * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLd +
                       ((lane >> 3) & 1) * 8;
#pragma unroll 1
  for (uint32_t k0 = 0; k0 < k; k0 += kChunk) {
    store_blocks(tab, stab[0], sa, ca, fa);
    store_blocks(tab, stab[1], sb, cb, fb);
    __syncthreads(); /* the chunk is in shared memory */
    /* the next chunk's codes in flight while this one is multiplied */
    if (k0 + kChunk < k) {
      load_blocks(g.a, i0 + r0, k, k0 + kChunk, ca, fa);
      load_blocks(g.b, j0 + r0, k, k0 + kChunk, cb, fb);
    }
    const int steps = (int)((k - k0 < kChunk ? k - k0 : kChunk) / 16);
#pragma unroll 4
    for (int s = 0; s < steps; s++) {
      uint32_t af[4], bf[4];
      hq_ldmatrix_x4(af, pa + 16 * s);
      hq_ldmatrix_x4(bf, pb + 16 * s);
      mma_bf16(acc[0], af, bf[0], bf[1]);
      mma_bf16(acc[1], af, bf[2], bf[3]);
    }
    __syncthreads(); /* every warp is done reading the chunk */
  }
  /* the accumulators into shared memory (sa is free after the loop's last barrier): accumulator
     e of n8 tile h is row (of A) lane / 4 + 8 * (e / 2), column (of B) 2 * (lane % 4) + e % 2 */
  float *const cs = sa_u.f;
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      cs[(wn * 16 + 8 * h + 2 * (lane & 3) + (e & 1)) * kCsLd + wm * 16 + (lane >> 2) +
         8 * (e >> 1)] = acc[h][e];
  __syncthreads();
  /* D's tile; a row-scaled operand's factors multiply alpha times the product, as the emulated
     path's epilogue does */
  hq_small_gemm_store<DT, kTile, kThreads>(
      cs, kCsLd, i0, j0, g.m, g.n, g.d, alpha, g.beta, g.bias, g.bias_dtype,
      [&](float o, int64_t i, int64_t j) {
        if (g.row_a) o = o * hq_nvfp4_tensor_factor_k(g.amax_a[i], g.a.kind);
        if (g.row_b) o = o * hq_nvfp4_tensor_factor_k(g.amax_b[j], g.b.kind);
        return o;
      });
}

} // namespace

extern "C" int nvfp4_cuda_gemm(const hq_call *call, const hq_gemm_problem *p,
                               const nvfp4_gemm_operand *a, const nvfp4_gemm_operand *b) {
  const GemmArgs g = {Operand{a->q, a->scale, p->m, a->swizzle, a->kind},
                      Operand{b->q, b->scale, p->n, b->swizzle, b->kind},
                      a->amax,
                      b->amax,
                      a->row,
                      b->row,
                      p->m,
                      p->n,
                      p->k,
                      p->d->data,
                      p->bias,
                      (int)p->bias_dtype,
                      p->alpha,
                      p->beta};
  const dim3 grid((unsigned)((p->m + kTile - 1) / kTile), (unsigned)((p->n + kTile - 1) / kTile));
  /* the op admits D in F32 or BF16 alone (nvfp4.c) */
  if (p->d->dtype == HQ_F32)
    small_gemm_kernel<HQ_F32><<<grid, kThreads, 0, (cudaStream_t)call->stream>>>(g);
  else
    small_gemm_kernel<HQ_BF16><<<grid, kThreads, 0, (cudaStream_t)call->stream>>>(g);
  CHECK_LAUNCH(call, "nvfp4 GEMM kernel");
  return HQ_OK;
}
