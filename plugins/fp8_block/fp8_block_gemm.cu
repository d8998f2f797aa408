/*
** fp8_block_gemm.cu -- the fp8_block module's own GEMM for small problems on Hopper: the FP8
** codes multiplied by mma.sync, each 128-element block of k on its own and added to an FP32
** accumulator times its two block scales, in one kernel (fp8_block.c's gemm op says which
** problems). On sm_90 ptxas lowers an FP8 mma.sync to exact FP8 -> FP16 conversions in registers
** and FP16 MMAs with FP32 accumulation (Hopper's FP8 tensor-core rate is wgmma's alone): at these
** sizes the rate is not what bounds the kernel, and the products are exact either way.
**
** Why: at a trainer's small sizes (256 x 256 x 256) cuBLASLt's block-scaled FP8 GEMM on sm_90 is
** mostly a fixed cost, longer than a BF16 GEMM of the same shape (docs/performance.md). A CTA per
** 32 x 32 tile of D and a k loop of a few blocks is latency-bound the same way, with less of it.
**
** D(i, j) = alpha * sum_b (sa(i, b) * sb(j, b)) * P_b(i, j) (+ beta * D(i, j)) (+ bias[i]), rounded
** once into D's dtype, i < m over A's stored rows, j < n over B's, D row-major [n, m] (F32 or
** BF16); P_b the FP8 product of block b's codes (k from 128 b, fewer in a last partial block),
** sa / sb the blocks' scale_inv (fp8_block_rules.h's indices: 1-D a scale per row and block, 2-D
** per 128 rows and block). An operand is a k-contiguous storage: codes [outer, k] bytes.
**
** The kernel: 4 warps over the tile (2 x 2, each 16 x 16: two m16n8k32 FP8 MMAs per 32 of k). Per
** block each thread loads 2 x 16 bytes of each operand's codes into registers (the next block's
** while this one is multiplied) and, for one row, its scale; after a barrier the warps read their
** fragments with ldmatrix (8-bit MMA fragments are the b16 ones with byte pairs), multiply the
** block into a zeroed partial, and add it scaled. Rows past m / n and k past the operand are
** zeros. The accumulators go through shared memory to the shared epilogue (small_gemm_cuda.h:
** 4-element stores of D where its rows allow). The MMAs take the codes themselves and the scales are applied per block as a block-scaled GEMM
** applies them, so the path is reported native.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "small_gemm_cuda.h"
#include "smem_cuda.h"
#include "hq/numerics.h"
#include "fp8_block_gemm.h"
#include "fp8_block_rules.h"

namespace {

constexpr int kTile = FP8B_GEMM_TILE;       /* D's tile: kTile rows of A x kTile rows of B */
constexpr int kThreads = 128;               /* 4 warps, 2 x 2 over the tile */
constexpr int kBlk = HQ_FP8B_BLOCK;         /* k per step: one scale block */
constexpr int kLd = kBlk + 16;              /* row stride in bytes: 144 puts ldmatrix's 8 rows
                                               of 16 bytes on distinct banks */
constexpr int kVec = kTile * kBlk / 16;     /* 16-byte pieces of an operand's block */
constexpr int kPerThread = kVec / kThreads; /* of them per thread */
static_assert(kVec % kThreads == 0, "whole pieces per thread");
static_assert(kTile <= kThreads, "a thread per row's scale");

struct Operand {
  const uint8_t *q;
  const float *scale;
  int64_t rows;
  int two_d;
};

/* Block kb of rows r0 .. r0 + kTile - 1 into registers: codes (zeros past the rows or k) and,
   for thread t < kTile, row r0 + t's scale. Code offsets fit 32 bits: the op takes m * n * k <=
   HQ_FP8B_GEMM_MAX_MNK, which fp8_block.c keeps at most 2^31. */
static_assert(kThreads % (kBlk / 16) == 0, "a thread's pieces share one column");
__device__ __forceinline__ void load_block(const Operand &o, uint32_t r0, uint32_t k, uint32_t kb,
                                           uint4 v[kPerThread], float *sf) {
  const int t = threadIdx.x;
  const uint32_t c = kb * kBlk + (uint32_t)(t % (kBlk / 16)) * 16;
#pragma unroll
  for (int j = 0; j < kPerThread; j++) {
    const uint32_t r = r0 + (uint32_t)(t + j * kThreads) / (kBlk / 16);
    v[j] = make_uint4(0u, 0u, 0u, 0u);
    if (r < (uint64_t)o.rows && c < k) v[j] = *reinterpret_cast<const uint4 *>(o.q + (r * k + c));
  }
  if (t < kTile) {
    const int64_t r = (int64_t)r0 + t;
    *sf = 0.0f;
    if (r < o.rows)
      *sf = o.scale[o.two_d ? hq_fp8b_row2d_index(r, kb * kBlk, k)
                            : hq_fp8b_row1d_index(r, kb * kBlk, o.rows)];
  }
}

__device__ __forceinline__ void store_block(uint8_t *s, float *ss, const uint4 v[kPerThread],
                                            float sf) {
  const int t = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kPerThread; j++) {
    const int p = t + j * kThreads, row = p / (kBlk / 16), col = (p % (kBlk / 16)) * 16;
    *reinterpret_cast<uint4 *>(s + row * kLd + col) = v[j];
  }
  if (t < kTile) ss[t] = sf;
}

/* c += A B of one m16n8k32 step, A's and B's FP8 dtypes E4 (E4M3) or not (E5M2) */
template <bool E4A, bool E4B>
__device__ __forceinline__ void mma_fp8(float c[4], const uint32_t a[4], uint32_t b0,
                                        uint32_t b1) {
#define HQ_FP8B_MMA(TA, TB)                                                                    \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB ".f32 {%0, %1, %2, %3}, "    \
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                               \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if (E4A && E4B) HQ_FP8B_MMA("e4m3", "e4m3");
  else if (E4A) HQ_FP8B_MMA("e4m3", "e5m2");
  else if (E4B) HQ_FP8B_MMA("e5m2", "e4m3");
  else HQ_FP8B_MMA("e5m2", "e5m2");
#undef HQ_FP8B_MMA
}

struct GemmArgs {
  Operand a, b;
  int64_t m, n, k;
  void *d;
  const void *bias; /* NULL or [m] */
  int bias_dtype;
  float alpha, beta;
};

/* The tile of accumulators in shared memory for the epilogue, rows of kTile + 4 floats: a
   warp's fragment stores (2 (lane % 4) rows apart, lane / 4 columns) then hit 32 banks. */
constexpr int kCsLd = kTile + 4;

/* DT: D's dtype (HQ_F32 or HQ_BF16), a template parameter so that D's loads and stores are one
   instruction each. A small call runs each instruction about once per SM, so every instruction
   is fetched cold: the epilogue is one loop over the tile through shared memory. */
template <bool E4A, bool E4B, int DT>
__global__ void __launch_bounds__(kThreads) small_gemm_kernel(GemmArgs g) {
  /* A's block, then (after the loop) the accumulators */
  __shared__ __align__(16) union {
    uint8_t b[kTile * kLd];
    float f[kTile * kCsLd];
  } sa_u;
  __shared__ __align__(16) uint8_t sb[kTile * kLd];
  __shared__ float ssa[kTile], ssb[kTile];
  uint8_t *const sa = sa_u.b;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t i0 = blockIdx.x * kTile, j0 = blockIdx.y * kTile, k = (uint32_t)g.k;
  const int wm = warp >> 1, wn = warp & 1; /* the warp's 16 x 16 of the tile */
  float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
  uint4 va[kPerThread], vb[kPerThread];
  float fa = 0.0f, fb = 0.0f;
  load_block(g.a, i0, k, 0, va, &fa);
  load_block(g.b, j0, k, 0, vb, &fb);
  /* ldmatrix rows, as the BF16 fragments with two codes per b16: A's 16 rows (lanes 0-15 bytes
     0-15, 16-31 bytes 16-31); B's 16 rows as two n8 tiles (lanes 0-7 and 16-23 bytes 0-15, 8-15
     and 24-31 bytes 16-31) */
  const uint8_t *pa = sa + (wm * 16 + (lane & 15)) * kLd + (lane >> 4) * 16;
  const uint8_t *pb = sb + (wn * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLd +
                      ((lane >> 3) & 1) * 16;
  const uint32_t nb = (uint32_t)hq_fp8b_nblocks(g.k);
  for (uint32_t kb = 0; kb < nb; kb++) {
    store_block(sa, ssa, va, fa);
    store_block(sb, ssb, vb, fb);
    __syncthreads(); /* the block is in shared memory */
    if (kb + 1 < nb) { /* the next block's codes in flight while this one is multiplied */
      load_block(g.a, i0, k, kb + 1, va, &fa);
      load_block(g.b, j0, k, kb + 1, vb, &fb);
    }
    float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const int rest = (int)(k - kb * kBlk < kBlk ? k - kb * kBlk : kBlk);
    for (int s = 0; s < (rest + 31) / 32; s++) {
      uint32_t af[4], bf[4];
      hq_ldmatrix_x4(af, pa + 32 * s);
      hq_ldmatrix_x4(bf, pb + 32 * s);
      mma_fp8<E4A, E4B>(part[0], af, bf[0], bf[1]);
      mma_fp8<E4A, E4B>(part[1], af, bf[2], bf[3]);
    }
    /* partial element e of n8 tile h: row (of A) lane / 4 + 8 * (e / 2), column (of B)
       2 * (lane % 4) + e % 2 */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = wm * 16 + (lane >> 2) + 8 * (e >> 1);
        const int j = wn * 16 + 8 * h + 2 * (lane & 3) + (e & 1);
        acc[h][e] = acc[h][e] + (ssa[i] * ssb[j]) * part[h][e];
      }
    __syncthreads(); /* every warp is done reading the block */
  }
  /* the accumulators into shared memory (sa is free after the loop's last barrier): element e
     of n8 tile h is row (of A) lane / 4 + 8 * (e / 2), column (of B) 2 * (lane % 4) + e % 2 */
  float *const cs = sa_u.f;
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      cs[(wn * 16 + 8 * h + 2 * (lane & 3) + (e & 1)) * kCsLd + wm * 16 + (lane >> 2) +
         8 * (e >> 1)] = acc[h][e];
  __syncthreads();
  hq_small_gemm_store<DT, kTile, kThreads>(cs, kCsLd, i0, j0, g.m, g.n, g.d, g.alpha, g.beta,
                                           g.bias, g.bias_dtype,
                                           [](float o, int64_t, int64_t) { return o; });
}

} // namespace

extern "C" int fp8b_cuda_gemm(const hq_call *call, const hq_gemm_problem *p,
                              const fp8b_gemm_operand *a, const fp8b_gemm_operand *b) {
  const GemmArgs g = {Operand{a->q, a->scale, p->m, a->two_d},
                      Operand{b->q, b->scale, p->n, b->two_d},
                      p->m,
                      p->n,
                      p->k,
                      p->d->data,
                      p->bias,
                      (int)p->bias_dtype,
                      p->alpha,
                      p->beta};
  const dim3 grid((unsigned)((p->m + kTile - 1) / kTile), (unsigned)((p->n + kTile - 1) / kTile));
  cudaStream_t st = (cudaStream_t)call->stream;
  const bool e4a = a->elem == HQ_E4M3, e4b = b->elem == HQ_E4M3;
  /* the op admits D in F32 or BF16 alone (fp8_block.c) */
  const bool f32 = p->d->dtype == HQ_F32;
#define HQ_FP8B_LAUNCH(A, B)                                                                   \
  (f32 ? small_gemm_kernel<A, B, HQ_F32><<<grid, kThreads, 0, st>>>(g)                          \
       : small_gemm_kernel<A, B, HQ_BF16><<<grid, kThreads, 0, st>>>(g))
  if (e4a && e4b) HQ_FP8B_LAUNCH(true, true);
  else if (e4a) HQ_FP8B_LAUNCH(true, false);
  else if (e4b) HQ_FP8B_LAUNCH(false, true);
  else HQ_FP8B_LAUNCH(false, false);
#undef HQ_FP8B_LAUNCH
  CHECK_LAUNCH(call, "fp8_block GEMM kernel");
  return HQ_OK;
}
