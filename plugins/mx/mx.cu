/*
** mx.cu -- the MXFP4 / MXFP6 CUDA kernels (sm_90 and Blackwell; any element kind), bit-identical
** to the CPU reference in mx.c: every byte comes from functions of mx_rules.h and hq/numerics.h
** (scale code, encode multiplier, element casts and their fast forms, Philox stream, packing).
**
** Quantize: one kernel for both directions, the input read once, organised as mxfp8.cu's: one
** CTA of 256 threads per tile of 32 rows x 128 columns, the tiles in row-major order (blockIdx.x
** along K where the grid allows); the rowwise copy alone from an aligned input by round to
** nearest takes its own form of it (ROWS: no columnwise code), each CTA over up to HQ_MX_TILES
** consecutive tiles down its column block where the grid still holds two waves of CTAs. Each
** thread loads two vectors of 8 consecutive elements, rows r and r + 16 of the tile (one 16-byte
** load each for bf16/f16, kept packed two elements per register, their amaxes taken two per
** instruction; two for f32), so every element sits in exactly one thread's registers for both
** directions. The columnwise copy alone from an aligned 16-bit input by round to nearest (the
** dgrad / wgrad operand) has a kernel of its own (COLS), below, taken where HQ_MX_COLS is 1.
**   rowwise 1x32: a block is 4 neighbouring lanes; the thread's two rows' amaxes are
**     reduce-scattered over them (NaN-propagating maxima: a NaN anywhere gives a NaN amax, the
**     rule's), so that each lane computes one scale code and gets the other row's by a
**     shuffle, then each thread casts its 8 elements per row;
**   columnwise 32x1: per column, the max over the thread's two rows, an xor-16 shuffle (the
**     warp's other row), the 8 warps' partial maxima meet in shared memory (2-4 KiB); 128
**     threads finish one column each, write its code (128 consecutive bytes), its multiplier
**     and, with stochastic rounding, its 32 random bytes to shared memory; every thread then
**     casts its registers with its columns' multipliers.
** COLS: a warp per 32 x 32 tile (8 warps along K per CTA), no shared memory, no barriers: lane
** 4g + c loads rows g, g + 8, g + 16, g + 24 of the tile at columns 8c .. 8c + 7 (16-byte loads,
** kept packed), takes per column the max over its 4 rows, and the column group's 8 lanes
** reduce-scatter those by three xor shuffles (NaN-propagating), so that each lane finishes one
** column's scale code (the warp's 32 codes one 32-byte store) and the 8 codes come back to every
** lane of the group by three more. The warp's rows then take the packed BF16 forms, the fast
** forms or the rule, as the other kernels' conditions allow for all 32 columns (a choice uniform
** over the warp: the FP6 stores shuffle); the rule's path reads its rows again, one at a time.
** Both copies are stored [M, K] packed along K (the columnwise copy is not transposed), so a
** thread's 8 codes are 8 consecutive elements of one row in either direction: FP4 4 bytes, one
** 4-byte store per lane; FP6 6 bytes, a 4-byte and a 2-byte store per lane, except in the ROWS
** and COLS kernels, where lanes 0..2 of a block write its 24 bytes as three 8-byte stores after
** shuffles.
** The element casts are the fast forms of mx_rules.h: E2M1 from BF16 on the packed input words
** themselves, two elements per instruction (hq_mx_e2m1x8_bf16: two BF16x2 multiply-adds and a
** 16-bit three-input min per pair, the multipliers BF16 words made from the scale code);
** E2M1 from FP32 / F16 by two FP32 sums and one min (hq_mx_cast_fast), the biased codes packed
** by multiply-adds and unbiased once per word; FP6 from BF16 on the packed words too
** (hq_mx_fp6x8_bf16: per pair an integer mask, one DPX add-min-max and a shift make the F16
** pair of the scaled values, which the F16-pair FP8 convert rounds; scale codes from 9 or 7 up),
** else through the FP8 convert of FP32 pairs, the codes clipped and packed by
** hq_mx_fp6x4_of_fp8x4_fin (either way a block with a finite amax). A NaN
** block (scale 0xFF), an FP6 block holding an Inf, a BF16 E2M1 block with scale code 0 under
** RCEIL, and with stochastic rounding every FP6 block and every E2M1 block with an Inf or NaN,
** take the rule itself (hq_mx_cast / hq_mx_cast_sr); E2M1 stochastic rounding of a finite
** block is hq_e2m1_sr_biased_lt8 (every |RN(x * mult)| < 8: mx_rules.h's scale rules).
** Dequantize: a run of 16 elements of one row per thread (FP4 one 8-byte load, FP6 three 4-byte
** loads), the element values from a 64-entry table in shared memory, the run's scales (one
** rowwise, 16 consecutive bytes columnwise) once, 16-byte stores. Into BF16 from aligned
** buffers (the emulated GEMM's operands) a kernel of its own: mx_rules.h's BF16 pair rule on
** the packed codes, four runs of 8 per thread along a row, each warp store 512 consecutive bytes.
** Unaligned pointers take scalar loads and stores (quantize: a 16-bit input that is not
** 16-byte aligned takes the kernels' VEC = false form, its elements in FP32 registers as an FP32
** input's). The aligned 16-bit quantize kernels fit round to nearest in 32 registers, 8 CTAs per
** SM (HQ_MX_MIN_BLOCKS_PK); the COLS kernels, whose lanes hold 4 rows, in 40, 6 CTAs
** (HQ_MX_COLS_MIN_BLOCKS). Everything on call->stream; nothing allocated, nothing synchronized.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "fp8_cvt_cuda.h"
#include "hp_load_cuda.h"
#include "launch_cuda.h"
#include "hq/numerics.h"
#include "mx.h"
#include "mx_rules.h"

namespace {

constexpr int kBlk = HQ_MX_BLOCK; /* 32 */
constexpr int kCols = 128;        /* tile columns */
constexpr int kThreads = 256;     /* 16 vectors of 8 per tile row, 16 rows per pass */
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;

struct QArgs {
  const void *x;
  int64_t M, K;
  /* hq_mx_row_bytes(K) and K / 32, made on the host: read from the parameters, they take none
     of the kernels' registers and instructions (a signed division costs its sign fix-ups) */
  int64_t rowb, kb;
  uint8_t *rd, *rs, *cd, *cs;
  uint16_t *rr, *cr; /* raw_copy: the directions' raw values (BF16 [M, K]); RAW kernels only */
  int raw16;     /* rr and cr 16-byte aligned: 16-byte raw stores */
  int rule;
  int vec;       /* x 16-byte aligned: vector loads (the kernels' VEC) */
  int st8;       /* rd and cd 8-byte aligned: 8-byte stores */
  int row_major; /* tiles in row-major order: blockIdx.x along K (else along M) */
  int64_t tiles; /* consecutive row blocks per CTA (the ROWS kernels; else 1) */
  uint64_t offset;
  /* a graph replay's random stream (hq_call.offset_dev, ABI 2.6): when offset_dev is set, the
     offset is hq_rng_offset(*offset_dev, role_key, role_count), made by the kernel */
  const uint64_t *offset_dev;
  uint64_t role_key, role_count;
  uint32_t rk[20]; /* the seed's Philox round keys (hq_nvfp4_sr_keys), made once on the host */
};

/* Whether a block with scale code e and a finite amax or not (fin) takes the fast forms: E2M1
   by round to nearest every block but a NaN block; FP6 by round to nearest (its FP8 codes
   clipped by hq_mx_fp6x4_of_fp8x4_fin) and E2M1 stochastic rounding (hq_e2m1_sr_biased_lt8)
   every block with a finite amax; FP6 stochastic rounding none. */
HQ_HD bool hq_mx_fast_block(bool fin, uint8_t e, int kind, bool sr) {
  if (kind == HQ_E2M1X2 && !sr) return e != HQ_E8M0_NAN;
  return fin && (kind == HQ_E2M1X2 || !sr);
}

/* The 8 elements of one vector as FP32 (exact): from the thread's packed 16-bit words (PK) or
   its FP32 registers. */
template <int DT, bool PK>
__device__ __forceinline__ void elems8(const uint32_t w[4], const float x[8], float y[8]) {
  if (PK) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      y[2 * k] = hq_cuda_hp16_to_f32<DT>(w[k] & 0xffffu);
      y[2 * k + 1] = hq_cuda_hp16_to_f32<DT>(w[k] >> 16);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = x[k];
  }
}

/* The packed codes of 8 consecutive elements y[0..7] of a row (FP4: 32 bits, FP6: 48 bits,
   element k at bits k * width), element k in a block with scale code e[k] (all equal rowwise),
   its fast-form multiplier m[k] (hq_mx_encode_mult, FP6: hq_mx_fp6_fp8_mult) and, with
   stochastic rounding, its random byte k of rb (byte k % 4 of word k / 4). fast: every element's
   block takes the fast form (no NaN block; with stochastic rounding no Inf or NaN). */
template <int KIND, bool SR>
__device__ __forceinline__ uint64_t encode8(const float y[8], const float m[8], const uint8_t e[8],
                                            uint2 rb, bool fast, int rule) {
  const uint32_t r[2] = {rb.x, rb.y};
  if (fast && KIND == HQ_E2M1X2) {
    /* (HQ_E2M1_BIAS_BITS + code) * 16^k accumulated (mod 2^32: a code <= 7 never carries into
       the next nibble), the bias removed once, the sign bits (products': bit 31) added */
    uint32_t acc = 0u, sg = 0u;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float v = hq_mul_rn(y[k], m[k]);
      uint32_t b;
      if (SR)
        b = hq_e2m1_sr_biased_lt8(v, hq_bits_f32(__byte_perm(r[k >> 2], 0u, 0x4044u | (k & 3) << 8)));
      else
        b = hq_mx_e2m1_biased(v);
      acc += b * (1u << (4 * k));
      sg |= (hq_f32_bits(v) >> 31) << (4 * k + 3);
    }
    return (uint64_t)(acc + (0u - HQ_E2M1_BIAS_BITS * 0x11111111u) + sg);
  }
  if (fast && !SR) { /* FP6: the FP8 code of v * 2^-12 / 2^-6, clipped (hq_mx_cast_fast) */
    constexpr int E8 = KIND == HQ_E3M2X4 ? HQ_E5M2 : HQ_E4M3;
    float u[8];
#pragma unroll
    for (int k = 0; k < 8; k++) u[k] = hq_mul_rn(y[k], m[k]);
    const uint32_t lo =
        hq_mx_fp6x4_of_fp8x4_fin(hq_cuda_f32x4_to_fp8_raw<E8>(u[0], u[1], u[2], u[3]));
    const uint32_t hi =
        hq_mx_fp6x4_of_fp8x4_fin(hq_cuda_f32x4_to_fp8_raw<E8>(u[4], u[5], u[6], u[7]));
    return (uint64_t)lo | (uint64_t)hi << 24;
  }
  /* the rule itself */
  uint32_t c[8];
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const float v = hq_mul_rn(y[k], hq_mx_encode_mult(e[k], rule));
    c[k] = SR ? hq_mx_cast_sr(v, KIND, (r[k >> 2] >> (8 * (k & 3))) & 0xffu) : hq_mx_cast(v, KIND);
  }
  if (KIND == HQ_E2M1X2) {
    uint32_t w = 0u;
#pragma unroll
    for (int k = 0; k < 8; k++) w |= (c[k] & 15u) << (4 * k);
    return w;
  }
  return (uint64_t)hq_fp6_pack4(c[0], c[1], c[2], c[3]) |
         (uint64_t)hq_fp6_pack4(c[4], c[5], c[6], c[7]) << 24;
}

/* HQ_MX_ST4 (1, the default): FP4 codes stored 4 bytes per lane, no shuffle, the same sectors
   per warp store (a row's 16 lanes write 64 consecutive bytes either way); faster than the
   shuffled 8-byte stores (0, kept for measuring). */
#ifndef HQ_MX_ST4
#define HQ_MX_ST4 1
#endif
/* A lane's own 4 FP4 code bytes v at q: one 4-byte store (st8: q 4-byte aligned) or byte
   stores. Shared by store_codes and the COLS kernels' cols_store. */
HQ_HD void store_fp4_own(uint8_t *q, uint64_t v, bool st8) {
  if (st8) {
    *reinterpret_cast<uint32_t *>(q) = (uint32_t)v;
  } else {
    for (int b = 0; b < 4; b++) q[b] = (uint8_t)(v >> (8 * b));
  }
}

/* A 32-block's 24 FP6 code bytes from its 4 lanes (lane k's 6 bytes v at q, the next lane's
   nlo / nhi brought by a shuffle down): with st8 lanes 0..2 write three 8-byte words (lane k's
   at q + 2k, 8-byte aligned), else each lane its own bytes. Shared by store_codes and the COLS
   kernels' cols_store, whose shuffles differ. */
HQ_HD void store_fp6_words(uint8_t *q, uint64_t v, uint32_t nlo, uint32_t nhi, bool st8,
                           int lane) {
  if (st8) {
    const int k = lane & 3;
    if (k < 3) {
      const uint64_t next = (uint64_t)nlo | (uint64_t)nhi << 32;
      *reinterpret_cast<uint64_t *>(q + 2 * k) = (v >> (16 * k)) | (next << (48 - 16 * k));
    }
  } else {
    for (int b = 0; b < 6; b++) q[b] = (uint8_t)(v >> (8 * b));
  }
}

/* Stores the packed codes v of the thread's 8 elements at q, their first byte in the row (q =
   row + j/2 for FP4, row + j/4*3 for FP6), the 4 lanes of a 32-block together (every lane of
   the warp calls it: shuffles): FP4 the even lane of a pair writes both lanes' 8 bytes, FP6
   lanes 0..2 of the block write its 24 bytes as three 8-byte words (lane k's word at its own
   first byte + 2k, 8-byte aligned: rows of K/2 or 3K/4 bytes, K % 32 == 0); with HQ_MX_ST4,
   every FP4 lane its own 4 bytes; with ST6, every FP6 lane its own 6 bytes. ST6 is the kernels'
   choice for every call but the rowwise copy alone (ROWS): the kernel that writes both copies
   was faster with the lanes' own stores and the ROWS kernel with the shuffled 8-byte ones.
   Without st8, byte stores. */
template <int KIND, bool ST6>
__device__ __forceinline__ void store_codes(uint8_t *q, uint64_t v, bool valid, bool st8,
                                            int lane) {
  if (KIND == HQ_E2M1X2 && HQ_MX_ST4) {
    if (valid) store_fp4_own(q, v, st8);
    return;
  }
  if (KIND == HQ_E2M1X2) {
    const uint32_t other = __shfl_down_sync(kAll, (uint32_t)v, 1);
    if (!valid) return;
    if (st8) {
      if (!(lane & 1)) *reinterpret_cast<uint64_t *>(q) = (v & 0xffffffffu) | (uint64_t)other << 32;
    } else {
      for (int b = 0; b < 4; b++) q[b] = (uint8_t)(v >> (8 * b));
    }
    return;
  }
  if (ST6 && st8) {
    /* lane k's 6 bytes at its own first byte (6k into the block: 4-byte aligned for even k,
       2 mod 4 for odd), as one 4-byte and one 2-byte store, no shuffle */
    if (!valid) return;
    const bool odd = lane & 1;
    const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
    *reinterpret_cast<uint32_t *>(q + (odd ? 2 : 0)) = odd ? __funnelshift_r(lo, hi, 16) : lo;
    *reinterpret_cast<uint16_t *>(q + (odd ? 0 : 4)) = (uint16_t)(odd ? lo : hi);
    return;
  }
  const uint32_t nlo = __shfl_down_sync(kAll, (uint32_t)v, 1);
  const uint32_t nhi = __shfl_down_sync(kAll, (uint32_t)(v >> 32), 1);
  if (valid) store_fp6_words(q, v, nlo, nhi, st8, lane);
}

/* The raw values (raw_copy) of the 8 codes packed in v (FP4: nibble k; FP6: bits 6k .. 6k+5)
   with their scale codes e[k]: hq_mx_dequantize rounded to BF16 -- the bytes a dequantize into a
   BF16 tensor writes -- in one 16-byte store (v16) or element stores. A pair whose two scale
   codes are at most hq_mx_bf16_one_max takes the BF16 pair rule's one-multiply form lane by lane
   (hq_mx_dequantize_bf16x2: each lane's factor 2^(e - bias) from its own code), the rest the
   rule in FP32. */
template <int KIND>
__device__ __forceinline__ void store_raw8(uint16_t *p, uint64_t v, const uint8_t e[8], bool v16) {
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 8; k += 2) {
    const int w = KIND == HQ_E2M1X2 ? 4 : 6;
    const uint32_t m = (1u << w) - 1u;
    const uint32_t c0 = (uint32_t)(v >> (w * k)) & m, c1 = (uint32_t)(v >> (w * (k + 1))) & m;
    if (e[k] <= hq_mx_bf16_one_max(KIND) && e[k + 1] <= hq_mx_bf16_one_max(KIND))
      h[k / 2] = hq_mx_bf16x2_mul(hq_mx_bf16_raw2(c0 | c1 << 16, KIND),
                                  (hq_mx_bf16_one2(e[k], KIND) & 0xffffu) |
                                      (hq_mx_bf16_one2(e[k + 1], KIND) & 0xffff0000u));
    else
      h[k / 2] = (uint32_t)hq_f32_to_bf16(hq_mx_dequantize(c0, e[k], KIND)) |
                 (uint32_t)hq_f32_to_bf16(hq_mx_dequantize(c1, e[k + 1], KIND)) << 16;
  }
  if (v16) {
    *reinterpret_cast<uint4 *>(p) = make_uint4(h[0], h[1], h[2], h[3]);
  } else {
    for (int k = 0; k < 8; k++) p[k] = (uint16_t)(h[k / 2] >> (16 * (k % 2)));
  }
}

/* The CTAs per SM the quantize kernels' registers must allow. Each tile is one CTA, so the
   loads in flight are the resident CTAs': a 16-bit input read with 16-byte loads (kept packed)
   fits round to nearest in 32 registers, 8 CTAs, the SM's 2048 threads -- but F16 to E2M1,
   whose elements are unpacked to FP32 for the cast, spills there; it, FP32 and unaligned
   inputs keep 6 (40 registers); stochastic rounding, with its Philox rounds, keeps 4. */
/* The most row blocks one rowwise-only quantize CTA takes (mx_cuda_quantize chooses how many) */
#ifndef HQ_MX_TILES
#define HQ_MX_TILES 2
#endif
#ifndef HQ_MX_MIN_BLOCKS_PK
#define HQ_MX_MIN_BLOCKS_PK 8
#endif
#ifndef HQ_MX_MIN_BLOCKS
#define HQ_MX_MIN_BLOCKS 6
#endif
#ifndef HQ_MX_MIN_BLOCKS_SR
#define HQ_MX_MIN_BLOCKS_SR 4
#endif
/* The raw_copy kernels (RAW) hold the codes a while longer: the unpacked forms' bound from
   packed 16-bit inputs kept packed, stochastic rounding's from FP32, element loads and F16 to
   E2M1 (unpacked for its cast, as above), so that none spills. */
template <int DT, int KIND, bool VEC, bool SR, bool RAW = false>
constexpr int kMinBlocksOf = SR ? HQ_MX_MIN_BLOCKS_SR
                             : RAW ? (VEC && (DT == HQ_BF16 || (DT == HQ_F16 && KIND != HQ_E2M1X2))
                                          ? HQ_MX_MIN_BLOCKS
                                          : HQ_MX_MIN_BLOCKS_SR)
                             : DT == HQ_BF16 && VEC ? HQ_MX_MIN_BLOCKS_PK
                             : DT == HQ_F16 && VEC && KIND != HQ_E2M1X2 ? HQ_MX_MIN_BLOCKS_PK
                                                    : HQ_MX_MIN_BLOCKS;

/* The amax of a row block from its 4 lanes' partial maxima pa[p] of the thread's two rows p
   (packed NaN-propagating 16-bit maxima (PK) or FP32 magnitude bits), reduce-scattered: the
   lanes with bit 0 = p finish row p (two shuffles for both rows), as FP32 bits, NaN kept. */
template <int DT, bool PK>
__device__ __forceinline__ uint32_t row_amax_scatter(const uint32_t pa[2], int lane) {
  const bool b0 = lane & 1;
  const uint32_t mine = b0 ? pa[1] : pa[0], theirs = b0 ? pa[0] : pa[1];
  const uint32_t got = __shfl_xor_sync(kAll, theirs, 1);
  if (PK) {
    uint32_t m = hq_cuda_absmax2<DT, true>(mine, got);
    m = hq_cuda_absmax2<DT, true>(m, __shfl_xor_sync(kAll, m, 2));
    return max(hq_f32_bits(hq_cuda_lane_abs<DT>(m, 0)), hq_f32_bits(hq_cuda_lane_abs<DT>(m, 1)));
  }
  const uint32_t m = max(mine, got);
  return max(m, __shfl_xor_sync(kAll, m, 2));
}

/* ROWS: the rowwise copy alone (no columnwise code), the CTA over a.tiles consecutive row blocks
   of its column block, the last CTA's fewer: its start, indices and predicates are about half of
   a one-tile CTA's instructions, done once for them all */
/* RAW: the storages keep their raw values (raw_copy): each copy's codes are also written as
   BF16 raw values, from the scale codes they were made with (store_raw8). */
template <int DT, int KIND, bool SR, bool VEC, bool ROWS = false, bool RAW = false>
__global__ void __launch_bounds__(kThreads, kMinBlocksOf<DT, KIND, VEC, SR, RAW>)
    quantize_kernel(const QArgs a) {
  /* a 16-bit input read with 16-byte loads stays in its packed words, two elements each */
  constexpr bool PK = DT != HQ_F32 && VEC;
  /* BF16 to E2M1 by round to nearest: the packed form (hq_mx_e2m1x8_bf16), on the words */
  constexpr bool BP = PK && DT == HQ_BF16 && KIND == HQ_E2M1X2 && !SR;
  /* BF16 to FP6 by round to nearest: the packed form (hq_mx_fp6x8_bf16) for the blocks of a
     finite amax with hq_mx_fp6_bf16_ok */
  constexpr bool BP6 = PK && DT == HQ_BF16 && KIND != HQ_E2M1X2 && !SR;
  __shared__ __align__(16) uint32_t part[kWarps * kCols]; /* per-warp column maxima (bits) */
  __shared__ __align__(16) float s_mult[kCols];            /* per-column fast multipliers */
  __shared__ __align__(16) uint8_t s_code[kCols];          /* per-column scale codes */
  __shared__ __align__(16) uint8_t s_fast[kCols];          /* per-column: fast form */
  __shared__ __align__(16) uint32_t s_bits[SR ? 8 : 1][kCols]; /* per-column random words */
  /* per-column BF16 mult, 2 * mult (BP); the FP6 form's lane -D << 7 (BP6) */
  __shared__ __align__(16) uint16_t s_mb[BP ? 2 : 1][kCols];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, cg = t & 15, r0 = t >> 4;
  /* the call's random-stream offset, once per thread: from the step a graph replay reads on
     the device (the host set it before the replay), else the host's */
  const uint64_t offset =
      !SR ? 0 : a.offset_dev ? hq_rng_offset(*a.offset_dev, a.role_key, a.role_count) : a.offset;
  const int64_t K = a.K;
  const unsigned bi = a.row_major ? blockIdx.y : blockIdx.x,
                 bj = a.row_major ? blockIdx.x : blockIdx.y;
  const int64_t j0 = (int64_t)bj * kCols;
  const int64_t j = j0 + cg * 8;
  const bool valid = j < K; /* K % 32 == 0: the 4 lanes of a 32-block agree */
  const int64_t rowb = a.rowb, kb = a.kb;
  const int64_t nt = ROWS ? a.tiles : 1;
  /* in row r0 of a tile: the thread's first element's index, the byte offset of its first code
     (either direction's data) and its rowwise scale's index (row r0 + 16's are 16 rows of K,
     rowb and K/32 further). The ROWS kernels make them once per CTA and advance them by a tile
     (32 rows) an iteration; the one-tile kernels make them per tile */
  /* element j's first code byte: hq_mx_row_bytes(j)'s rule in unsigned 32-bit arithmetic (its
     signed 64-bit division costs the kernels instructions) */
  const int64_t c0 = (uint32_t)j / (KIND == HQ_E2M1X2 ? 2u : 4u) * (KIND == HQ_E2M1X2 ? 1u : 3u);
  const int64_t ib = (int64_t)bi * nt * kBlk + r0;
  int64_t at_r = ib * K + j, o0_r = ib * rowb + c0, s0_r = ib * kb + j / kBlk;
  for (int64_t u = 0; u < nt; u++, at_r += kBlk * K, o0_r += kBlk * rowb, s0_r += K) {
    const int64_t i0 = ((int64_t)bi * nt + u) * kBlk;
    if (ROWS && i0 >= a.M) break; /* uniform over the CTA */
    /* the one-tile kernels: 32 x 32 -> 64-bit products (rows and row lengths below 2^32: the
       launcher's check), one instruction each, as the compiler makes them again after the
       barriers rather than hold them in the 32 registers */
    const uint32_t rw = (uint32_t)(i0 + r0);
    const int64_t at0 = ROWS ? at_r : (int64_t)((uint64_t)rw * (uint32_t)K) + j;
    const int64_t o0 = ROWS ? o0_r : (int64_t)((uint64_t)rw * (uint32_t)rowb) + c0;
    const int64_t s0 = ROWS ? s0_r : (int64_t)((uint64_t)rw * (uint32_t)kb) + j / kBlk;
    /* the columnwise codes' place, made before the barriers and held across them (the 32
       registers of 8 CTAs an SM had the compiler make it again after them) */
    uint8_t *cq = ROWS ? nullptr : a.cd + o0;
    if (!ROWS) asm volatile("" : "+l"(cq));
    if (!ROWS) __builtin_assume(__isGlobal(cq));
    float x[2][8];
    uint32_t w[2][4];
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const int64_t at =
          ROWS ? at0 + 16 * p * K : (int64_t)((uint64_t)(rw + 16 * p) * (uint32_t)K) + j;
      if (PK) {
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (valid)
          u = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.x) + at));
        w[p][0] = u.x, w[p][1] = u.y, w[p][2] = u.z, w[p][3] = u.w;
      } else if (valid) {
        hq_cuda_load8<DT>(a.x, at, VEC, x[p]);
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++) x[p][k] = 0.0f;
      }
    }

    /* the column maxima's partial reduction first (its shared-memory round trip overlaps the
       rowwise work): max |x| as bit patterns, a NaN kept (NaN-propagating packed maxima, whose
       lanes' bits order like the values) */
    if (!ROWS && a.cd) {
      if (PK) {
        uint32_t c[4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
          c[h] = hq_cuda_absmax2<DT, true>(w[0][h], w[1][h]);
          c[h] = hq_cuda_absmax2<DT, true>(c[h], __shfl_xor_sync(kAll, c[h], 16));
        }
        if (lane < 16)
          reinterpret_cast<uint4 *>(&part[warp * kCols])[cg] = make_uint4(c[0], c[1], c[2], c[3]);
      } else {
        uint32_t c[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
          c[k] = max(hq_f32_bits(x[0][k]) & 0x7fffffffu, hq_f32_bits(x[1][k]) & 0x7fffffffu);
          c[k] = max(c[k], __shfl_xor_sync(kAll, c[k], 16));
        }
        if (lane < 16) {
          uint4 *d = reinterpret_cast<uint4 *>(&part[warp * kCols + cg * 8]);
          d[0] = make_uint4(c[0], c[1], c[2], c[3]);
          d[1] = make_uint4(c[4], c[5], c[6], c[7]);
        }
      }
    }

    if (a.rd) {
      /* the two rows' block amaxes reduce-scattered over the block's 4 lanes: each lane computes
         one scale code (of row r0 + 16 * (lane & 1)), the pair's other code comes by shuffle with
         its amax's finiteness (bit 8), and lanes 0 and 1 of the 4 write the two codes */
      uint32_t pa[2];
#pragma unroll
      for (int p = 0; p < 2; p++) {
        if (PK) {
          pa[p] = hq_cuda_absmax_tree<DT, 4, true>(w[p]);
        } else {
          pa[p] = 0u;
#pragma unroll
          for (int k = 0; k < 8; k++) pa[p] = max(pa[p], hq_f32_bits(x[p][k]) & 0x7fffffffu);
        }
      }
      const uint32_t my_am = row_amax_scatter<DT, PK>(pa, lane);
      const uint8_t my_e = hq_mx_scale_code(hq_bits_f32(my_am), KIND, a.rule);
      const uint32_t my_ew = my_e | (my_am < 0x7f800000u ? 0x100u : 0u);
      const uint32_t other_ew = __shfl_xor_sync(kAll, my_ew, 1);
      if (valid && !(lane & 2)) a.rs[s0 + 16 * (lane & 1) * kb] = my_e;
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const uint32_t ew = p == (lane & 1) ? my_ew : other_ew;
        const uint8_t e = (uint8_t)ew;
        const int64_t si = s0 + 16 * p * kb; /* hq_mx_scale_idx(0, row, j, K) */
        const bool fin = ew & 0x100u;
        const bool fast = hq_mx_fast_block(fin, e, KIND, SR);
        /* the fast multiplier: the packed kernels make it only on the path that takes it (made
           before the branch, it cost every block its instructions), the others here */
        const auto mult = [&]() {
          return !fast ? 0.0f
                 : KIND == HQ_E2M1X2 ? hq_mx_encode_mult(e, a.rule)
                                     : hq_mx_fp6_fp8_mult(e, a.rule, KIND);
        };
        const float mu0 = BP || BP6 ? 0.0f : mult();
        uint2 rb = make_uint2(0u, 0u);
        if (SR) { /* elements 8q .. 8q + 7 of the block: words 2q, 2q + 1 of its 8 */
          const int q = lane & 3;
          uint32_t bits[4];
          hq_nvfp4_sr_bits_rk(a.rk, offset, 0, 2 * (uint64_t)si + (q >> 1), bits);
          rb = (q & 1) ? make_uint2(bits[2], bits[3]) : make_uint2(bits[0], bits[1]);
        }
        uint64_t v;
        if (BP && hq_mx_e2m1_bf16_ok(e, a.rule)) {
          const uint32_t m1 = hq_mx_bf16_mult2(e, 0), m2 = hq_mx_bf16_mult2(e, 1);
          const uint32_t m1w[4] = {m1, m1, m1, m1}, m2w[4] = {m2, m2, m2, m2};
          v = hq_mx_e2m1x8_bf16(w[p], m1w, m2w);
        } else if (BP6 && fin && hq_mx_fp6_bf16_ok(e, KIND)) { /* BP6: fast is fin */
          const uint32_t nd = hq_mx_fp6_bf16_nd(e, KIND) * 0x10001u;
          const uint32_t ndw[4] = {nd, nd, nd, nd};
          v = hq_mx_fp6x8_bf16(w[p], ndw, KIND);
        } else {
          const float mu = BP || BP6 ? mult() : mu0;
          float y[8], m[8];
          uint8_t ek[8];
          elems8<DT, PK>(w[p], x[p], y);
#pragma unroll
          for (int k = 0; k < 8; k++) m[k] = mu, ek[k] = e;
          v = encode8<KIND, SR>(y, m, ek, rb, fast && !BP, a.rule);
        }
        store_codes<KIND, !ROWS>(a.rd + o0 + 16 * p * rowb, v, valid, a.st8, lane);
        if (RAW && valid) {
          const uint8_t ev[8] = {e, e, e, e, e, e, e, e};
          store_raw8<KIND>(a.rr + (i0 + r0 + 16 * p) * K + j, v, ev, a.raw16);
        }
      }
    }
    if (ROWS || !a.cd) continue; /* uniform over the CTA */
    __syncthreads();
    if (t < kCols) {
      uint32_t am;
      if (PK) {
        uint32_t c = part[t >> 1];
#pragma unroll
        for (int v = 1; v < kWarps; v++)
          c = hq_cuda_absmax2<DT, true>(c, part[v * kCols + (t >> 1)]);
        am = hq_f32_bits(hq_cuda_lane_abs<DT>(c, t & 1));
      } else {
        am = part[t];
#pragma unroll
        for (int v = 1; v < kWarps; v++) am = max(am, part[v * kCols + t]);
      }
      const uint8_t e = hq_mx_scale_code(hq_bits_f32(am), KIND, a.rule);
      const bool fast = BP ? hq_mx_e2m1_bf16_ok(e, a.rule)
                        : hq_mx_fast_block(am < 0x7f800000u, e, KIND, SR);
      /* bit 1: the column takes the packed FP6 form */
      const bool ok6 = BP6 && fast && hq_mx_fp6_bf16_ok(e, KIND);
      if (BP) {
        s_mb[0][t] = (uint16_t)hq_mx_bf16_mult2(e, 0);
        s_mb[BP ? 1 : 0][t] = (uint16_t)hq_mx_bf16_mult2(e, 1);
      }
      if (BP6) s_mb[0][t] = (uint16_t)(ok6 ? hq_mx_fp6_bf16_nd(e, KIND) : 0u);
      s_code[t] = e;
      s_fast[t] = (uint8_t)(fast | ok6 << 1);
      s_mult[t] = !fast || BP ? 0.0f
                  : KIND == HQ_E2M1X2 ? hq_mx_encode_mult(e, a.rule)
                                      : hq_mx_fp6_fp8_mult(e, a.rule, KIND);
      const int64_t jc = j0 + t;
      if (jc < K) {
        const int64_t si = hq_mx_scale_idx(1, i0, jc, K);
        a.cs[si] = e;
        if (SR) {
          uint32_t bits[8];
          hq_mx_sr_bits(a.rk, offset, 1, (uint64_t)si, bits);
#pragma unroll
          for (int q = 0; q < 8; q++) s_bits[q][t] = bits[q];
        }
      }
    }
    __syncthreads();
    uint32_t m1w[4] = {0u, 0u, 0u, 0u}, m2w[4] = {0u, 0u, 0u, 0u};
    if (BP || BP6) { /* the 8 columns' BF16 multipliers (BP6: lane words), two columns a word */
      const uint4 u1 = *reinterpret_cast<const uint4 *>(&s_mb[0][cg * 8]);
      m1w[0] = u1.x, m1w[1] = u1.y, m1w[2] = u1.z, m1w[3] = u1.w;
    }
    if (BP) {
      const uint4 u2 = *reinterpret_cast<const uint4 *>(&s_mb[BP ? 1 : 0][cg * 8]);
      m2w[0] = u2.x, m2w[1] = u2.y, m2w[2] = u2.z, m2w[3] = u2.w;
    }
    float m[8];
    uint8_t ek[8];
    bool fast = true, bp6 = false;
    /* the 8 columns' fast multipliers and scale codes; BP6 kernels read them on the path that
       needs them (the packed form's registers leave no room to hold them across it) */
    const auto load_mult = [&]() {
      const float4 *s = reinterpret_cast<const float4 *>(&s_mult[cg * 8]);
      const float4 u = s[0], v = s[1];
      m[0] = u.x, m[1] = u.y, m[2] = u.z, m[3] = u.w;
      m[4] = v.x, m[5] = v.y, m[6] = v.z, m[7] = v.w;
      const uint2 c = *reinterpret_cast<const uint2 *>(&s_code[cg * 8]);
#pragma unroll
      for (int k = 0; k < 8; k++) ek[k] = (uint8_t)((k < 4 ? c.x : c.y) >> (8 * (k & 3)));
    };
    {
      const uint2 f = *reinterpret_cast<const uint2 *>(&s_fast[cg * 8]);
      fast = (f.x & f.y & 0x01010101u) == 0x01010101u;
      bp6 = BP6 && (f.x & f.y) == 0x03030303u;
    }
    if (!BP6) load_mult();
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const int r = r0 + 16 * p; /* the element's index in its column block */
      uint2 rb = make_uint2(0u, 0u);
      if (SR) { /* byte r % 4 of word r / 4 of each of the 8 columns */
        const uint4 *s = reinterpret_cast<const uint4 *>(&s_bits[r >> 2][cg * 8]);
        const uint4 u = s[0], v = s[1];
        const uint32_t sel = (uint32_t)(r & 3);
        const uint32_t b0 = __byte_perm(u.x, u.y, sel | (sel + 4) << 4);
        const uint32_t b1 = __byte_perm(u.z, u.w, sel | (sel + 4) << 4);
        const uint32_t b2 = __byte_perm(v.x, v.y, sel | (sel + 4) << 4);
        const uint32_t b3 = __byte_perm(v.z, v.w, sel | (sel + 4) << 4);
        rb = make_uint2(__byte_perm(b0, b1, 0x5410), __byte_perm(b2, b3, 0x5410));
      }
      uint64_t v;
      if (BP && fast) {
        v = hq_mx_e2m1x8_bf16(w[p], m1w, m2w);
      } else if (BP6 && bp6) {
        v = hq_mx_fp6x8_bf16(w[p], m1w, KIND);
      } else {
        if (BP6) load_mult();
        float y[8];
        elems8<DT, PK>(w[p], x[p], y);
        v = encode8<KIND, SR>(y, m, ek, rb, fast && !BP, a.rule);
      }
      store_codes<KIND, !ROWS>(cq + 16 * p * rowb, v, valid, a.st8, lane);
      if (RAW && valid) { /* the 8 columns' codes */
        const uint2 c = *reinterpret_cast<const uint2 *>(&s_code[cg * 8]);
        uint8_t ev[8];
#pragma unroll
        for (int k = 0; k < 8; k++) ev[k] = (uint8_t)((k < 4 ? c.x : c.y) >> (8 * (k & 3)));
        store_raw8<KIND>(a.cr + (i0 + r0 + 16 * p) * K + j, v, ev, a.raw16);
      }
    }
  }
}

/* Dequantize: each thread turns a run of 16 consecutive elements of one row into the output,
   x' = hq_mx_scaled(elem(q), e) (hq_mx_dequantize) with the element values from a table of the
   64 (16) codes in shared memory and the run's scales read once; K % 32 == 0, so a run never
   crosses a row or a rowwise block, and its columnwise scales are 16 consecutive bytes of one
   scale row. SMALL (fewer than 2^32 runs): the run's row by a 32-bit division. vec: data 8-byte (FP4) / 4-byte (FP6), scales and destination 16-byte aligned. */
template <int OT, int KIND, bool SMALL>
__global__ void __launch_bounds__(256)
    dequantize_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                      int colwise, void *__restrict__ dst, int64_t M, int64_t K, int vec) {
  __shared__ float lut[64];
  if (threadIdx.x < 64) lut[threadIdx.x] = hq_mx_elem_to_f32(threadIdx.x & (KIND == HQ_E2M1X2 ? 15u : 63u), KIND);
  __syncthreads();
  constexpr int bits = KIND == HQ_E2M1X2 ? 4 : 6;
  const int64_t runs_per_row = K / 16, nrun = M * runs_per_row;
  const int64_t rb = hq_mx_row_bytes(K, KIND);
  for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < nrun;
       g += (int64_t)gridDim.x * blockDim.x) {
    int64_t i, k0;
    hq_cuda_row_col<SMALL>(g, runs_per_row, &i, &k0);
    k0 *= 16;
    const uint8_t *row = data + i * rb;
    uint32_t cw[3];
    if (KIND == HQ_E2M1X2) {
      if (vec) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(row + k0 / 2));
        cw[0] = u.x, cw[1] = u.y;
      } else {
        const uint8_t *s = row + k0 / 2;
        cw[0] = s[0] | s[1] << 8 | s[2] << 16 | (uint32_t)s[3] << 24;
        cw[1] = s[4] | s[5] << 8 | s[6] << 16 | (uint32_t)s[7] << 24;
      }
      cw[2] = 0u;
    } else {
      const uint8_t *s = row + k0 / 4 * 3;
#pragma unroll
      for (int h = 0; h < 3; h++)
        cw[h] = vec ? __ldg(reinterpret_cast<const uint32_t *>(s) + h)
                    : s[4 * h] | s[4 * h + 1] << 8 | s[4 * h + 2] << 16 | (uint32_t)s[4 * h + 3] << 24;
    }
    uint8_t e[16];
    if (!colwise) {
      const uint8_t r = scale[i * (K / kBlk) + k0 / kBlk];
#pragma unroll
      for (int k = 0; k < 16; k++) e[k] = r;
    } else {
      const uint8_t *s = scale + (i / kBlk) * K + k0;
      if (vec) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(s));
        const uint32_t uw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 16; k++) e[k] = (uint8_t)(uw[k >> 2] >> (8 * (k & 3)));
      } else {
#pragma unroll
        for (int k = 0; k < 16; k++) e[k] = s[k];
      }
    }
    float y[16];
#pragma unroll
    for (int k = 0; k < 16; k++) {
      const int b = bits * k; /* the code's first bit in the run's little-endian bit stream */
      uint32_t c = cw[b >> 5] >> (b & 31);
      if ((b & 31) + bits > 32) c |= cw[(b >> 5) + 1] << (32 - (b & 31));
      y[k] = hq_mx_scaled(lut[c & ((1u << bits) - 1u)], e[k]);
    }
    const int64_t o = i * K + k0;
    if (vec && OT == HQ_F32) {
      uint4 *q = reinterpret_cast<uint4 *>(static_cast<float *>(dst) + o);
#pragma unroll
      for (int h = 0; h < 4; h++)
        q[h] = make_uint4(hq_f32_bits(y[4 * h]), hq_f32_bits(y[4 * h + 1]),
                          hq_f32_bits(y[4 * h + 2]), hq_f32_bits(y[4 * h + 3]));
    } else if (vec) {
      uint32_t hw[8];
#pragma unroll
      for (int k = 0; k < 8; k++) hw[k] = hq_pack2_hp16(y[2 * k], y[2 * k + 1], OT);
      uint4 *q = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(dst) + o);
      q[0] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
      q[1] = make_uint4(hw[4], hw[5], hw[6], hw[7]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; k++) hq_store_hp(dst, o + k, OT, y[k]);
    }
  }
}

/* Dequantize into BF16 from aligned buffers (the emulated GEMM's operands): mx_rules.h's BF16
   pair rule (hq_mx_dequantize_bf16x2), two elements per bf16x2 multiply and no FP32 rounding
   step, which the table kernel above spends most of its instructions on. A warp takes 1024
   columns of one row: lane l holds the runs of 8 elements at k + 256 u + 8 l, u = 0..3, so every
   warp store is 512 consecutive bytes, the code loads coalesce, all four runs' codes and scales
   are loaded before any is used, and every address is one base plus a constant. A CTA takes 8
   rows (blockIdx.y: 8 rows, blockIdx.x: 1024 columns). Written for the host too (the dq_*
   helpers), so that the body can be run there against the CPU reference. */
constexpr int kDqRun = 8;                       /* elements per run: one 16-byte store */
constexpr int kDqUnits = 4;                     /* runs per thread */
constexpr int kDqCols = 32 * kDqRun * kDqUnits; /* columns per warp */
constexpr int kDqRowsPerCta = 8;

/* the low word of (hi:lo) >> n, n <= 32 */
HQ_HD uint32_t dq_fshr(uint32_t lo, uint32_t hi, uint32_t n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_rc(lo, hi, n);
#else
  return (uint32_t)(((uint64_t)hi << 32 | lo) >> n);
#endif
}
/* the lanewise unsigned maximum of two 16-bit pairs */
HQ_HD uint32_t dq_max2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
  return lo | ((a >> 16) > (b >> 16) ? a >> 16 : b >> 16) << 16;
#endif
}
/* whether p holds on every lane of the warp (on the host: of the thread) */
HQ_HD bool dq_all(bool p) {
#if defined(__CUDA_ARCH__)
  return __all_sync(kAll, p);
#else
  return p;
#endif
}
template <typename T> HQ_HD T dq_ld(const T *p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}
/* one 16-byte store (the compiler splits a plain one here into four) */
HQ_HD void dq_st16(uint16_t *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
#else
  *reinterpret_cast<uint4 *>(p) = make_uint4(a, b, c, d);
#endif
}

/* The raw BF16 pairs (hq_mx_bf16_raw2's words) of the 8 codes of a run, word j holding codes 2j
   and 2j + 1. E2M1 (c[0]: the 8 nibbles): the fused GEMM's form -- one sign-mode byte permute puts
   a code's nibble at the top of one byte and its sign bit across the next, one shift and one mask
   leave the magnitude at bits 6..8 and the sign at bit 15 of each half. FP6 (the 48 code bits at
   bit sh of c[1]:c[0]): the same, each code taken from a byte that holds it at bits 2..7 (its
   sign at bit 7): code n starts at bit 6n, so byte 0 of the stream shifted by -2, 4, 10 or 16
   bits holds codes 0..3 that way and byte 3 codes 4..7. */
template <int KIND> HQ_HD void dq_raw(const uint32_t c[2], uint32_t sh, uint32_t r[4]) {
  if (KIND == HQ_E2M1X2) {
    const uint32_t x4 = c[0] << 4;
    for (uint32_t j = 0; j < 4; j++)
      r[j] = (hq_mx_prmt_sx(x4, c[0], j | (j + 8) << 4 | (j + 4) << 8 | (j + 12) << 12) << 2) &
             0x81c081c0u;
    return;
  }
  constexpr int s = KIND == HQ_E3M2X4 ? 5 : 4; /* 7 - mantissa bits */
  constexpr uint32_t mask = (0x8000u | 0x1fu << s) * 0x10001u;
  const uint32_t wa = dq_fshr(c[0], c[1], sh) << 2, wb = dq_fshr(c[0], c[1], sh + 4);
  const uint32_t wc = dq_fshr(c[0], c[1], sh + 10), wd = dq_fshr(c[0], c[1], sh + 16);
  r[0] = (hq_mx_prmt_sx(wa, wb, 0xc480u) << (s - 2)) & mask;
  r[1] = (hq_mx_prmt_sx(wc, wd, 0xc480u) << (s - 2)) & mask;
  r[2] = (hq_mx_prmt_sx(wa, wb, 0xf7b3u) << (s - 2)) & mask;
  r[3] = (hq_mx_prmt_sx(wc, wd, 0xf7b3u) << (s - 2)) & mask;
}
/* The scale codes of a run's 4 pairs in 16-bit lanes, from ec (columnwise: the run's 8 codes;
   rowwise: .x its one code) */
template <bool COLWISE> HQ_HD void dq_ew(uint2 ec, uint32_t ew[4]) {
  if (COLWISE) {
    ew[0] = hq_mx_prmt_sx(ec.x, 0u, 0x4140u), ew[1] = hq_mx_prmt_sx(ec.x, 0u, 0x4342u);
    ew[2] = hq_mx_prmt_sx(ec.y, 0u, 0x4140u), ew[3] = hq_mx_prmt_sx(ec.y, 0u, 0x4342u);
  } else {
    ew[0] = ew[1] = ew[2] = ew[3] = ec.x * 0x10001u;
  }
}

/* One thread's runs of rows i, i + rstep, ... below M (bx: blockIdx.x, t: threadIdx.x). I: the
   index type, uint32_t where M * K < 2^31 (the launcher's check), else int64_t. The indices come
   from the element offset e = i K + k of the thread's first run: its code bytes e / 2 (FP4) or
   6 (e / 8), its rowwise scale e / 32; its columnwise scale is (i / 32) K + k.
   FULL: every run in (bx's columns all below K), else a run is all in or all out (K % 32 == 0).
   The raw pairs times 2^(e - bias) in one multiply (hq_mx_bf16_one2, the rule's first form) where
   every scale code of the warp's runs is below 128 (<= hq_mx_bf16_one_max; one OR per word to
   test, where the exact bound would take three instructions per word); else, as the rule's second
   form, times 2^(127 - bias) (exact) and 2^(e - 127) (hq_mx_bf16_scale2: e = 0 the subnormal
   2^-127), the lanes of NaN scales (0xFF) replaced by the rule's NaN. */
template <int KIND, bool COLWISE, typename I, bool FULL>
HQ_HD void dq_bf16_rows(const uint8_t *data, const uint8_t *scale, uint16_t *dst, I M, I K, I bx,
                        I i, I rstep, int t) {
  constexpr bool FP4 = KIND == HQ_E2M1X2;
  constexpr uint32_t one_add = (127u - (KIND == HQ_E3M2X4 ? 3u : 1u)) << 7; /* hq_mx_bf16_one2 */
  constexpr int ustep = 32 * kDqRun;                     /* columns between a thread's runs */
  constexpr int cstep = FP4 ? ustep / 2 : ustep / 4 * 3; /* their code bytes */
  const int lane = t & 31;
  const I k = bx * (I)kDqCols + (I)(lane * kDqRun); /* run u at k + 256 u */
  bool valid[kDqUnits];
  for (int u = 0; u < kDqUnits; u++) valid[u] = FULL || k + (I)(ustep * u) < K;
  /* FP6: the run's 6 code bytes read as the two aligned words that hold them, sh bits into the
     first */
  const uint32_t sh = FP4 ? 0u : (uint32_t)(lane & 1) * 16u;
  for (; i < M; i += rstep) {
    const I e = i * K + k;
    const uint32_t *p =
        reinterpret_cast<const uint32_t *>(data + (FP4 ? e / 2 : e / 8 * 6 - (I)(sh / 8)));
    const uint8_t *sr = scale + e / kBlk;             /* rowwise: run u's at 8 u */
    const uint8_t *sc = scale + ((i / kBlk) * K + k); /* columnwise: at 256 u */
    uint32_t c[kDqUnits][2];
    uint2 ec[kDqUnits]; /* columnwise: the run's 8 scale codes; rowwise: .x its one code */
    for (int u = 0; u < kDqUnits; u++) {
      c[u][0] = c[u][1] = 0u;
      ec[u] = make_uint2(0u, 0u);
      if (!valid[u]) continue;
      c[u][0] = dq_ld(p + cstep / 4 * u);
      if (!FP4) c[u][1] = dq_ld(p + cstep / 4 * u + 1);
      if (COLWISE)
        ec[u] = dq_ld(reinterpret_cast<const uint2 *>(sc + ustep * u));
      else
        ec[u].x = dq_ld(sr + ustep / kBlk * u);
    }
    uint32_t big = 0u;
    for (int u = 0; u < kDqUnits; u++) big |= ec[u].x | ec[u].y;
    uint16_t *o = dst + e;
    uint32_t r[4], ew[4], w[4];
    if (dq_all(!(big & 0x80808080u))) { /* every code < 128 */
      for (int u = 0; u < kDqUnits; u++) {
        dq_raw<KIND>(c[u], sh, r);
        dq_ew<COLWISE>(ec[u], ew);
        for (int j = 0; j < 4; j++)
          w[j] = hq_mx_bf16x2_mul(r[j], (ew[j] << 7) + one_add * 0x10001u);
        if (valid[u]) dq_st16(o + ustep * u, w[0], w[1], w[2], w[3]);
      }
    } else {
      const uint32_t pre = hq_mx_bf16_pre2(KIND);
      const uint32_t nan2 = (uint32_t)hq_f32_to_bf16(hq_mx_scaled(0.0f, 0xFFu)) * 0x10001u;
      for (int u = 0; u < kDqUnits; u++) {
        dq_raw<KIND>(c[u], sh, r);
        dq_ew<COLWISE>(ec[u], ew);
        for (int j = 0; j < 4; j++) {
          const uint32_t es = ew[j] << 7, nan = hq_mx_prmt_sx(es + 0x00800080u, 0u, 0xbb99u);
          w[j] = hq_mx_bf16x2_mul(hq_mx_bf16x2_mul(r[j], pre), dq_max2(es, 0x00400040u));
          w[j] = (w[j] & ~nan) | (nan2 & nan);
        }
        if (valid[u]) dq_st16(o + ustep * u, w[0], w[1], w[2], w[3]);
      }
    }
  }
}

/* 8 CTAs of 256 per SM (32 registers); the 64-bit index form, which spills there, 6 */
template <int KIND, bool COLWISE, typename I>
__global__ void __launch_bounds__(256, sizeof(I) == 4 ? 8 : 6)
    dequantize_bf16_kernel(const uint8_t *__restrict__ data, const uint8_t *__restrict__ scale,
                           uint16_t *__restrict__ dst, I M, I K) {
  const I bx = blockIdx.x, i = (I)blockIdx.y * kDqRowsPerCta + (I)(threadIdx.x / 32),
          rstep = (I)gridDim.y * kDqRowsPerCta;
  if ((bx + 1) * (I)kDqCols <= K) /* uniform over the CTA */
    dq_bf16_rows<KIND, COLWISE, I, true>(data, scale, dst, M, K, bx, i, rstep, (int)threadIdx.x);
  else
    dq_bf16_rows<KIND, COLWISE, I, false>(data, scale, dst, M, K, bx, i, rstep, (int)threadIdx.x);
}

/* COLS: the columnwise copy alone (dgrad's and wgrad's operand) from an aligned 16-bit input by
   round to nearest. A warp per 32 x 32 tile, no shared memory and no barriers: lane l = 4g + c
   holds rows g, g + 8, g + 16, g + 24 of the tile at its columns 8c .. 8c + 7 (a 16-byte load
   each; a warp load is 8 rows of 64 consecutive bytes), so its 8 codes of a row are consecutive
   bytes of the output row and a row's 32-block is lanes 4g .. 4g + 3, as in the other kernels.
   A CTA is kColsWarps warps along K. The body is written for the host too (its lane exchanges
   a parameter, L), so that tests/test_mx_cols_host runs it as a warp of host threads against
   the CPU reference. */
constexpr int kColsWarps = 8;
constexpr int kColsCols = kColsWarps * kBlk; /* columns per CTA */

/* #pragma unroll in code for the host too (whose compiler would warn of an unknown pragma) */
#if defined(__CUDA_ARCH__)
#define HQ_MX_UNROLL _Pragma("unroll")
#define HQ_MX_NOUNROLL _Pragma("unroll 1")
#else
#define HQ_MX_UNROLL
#define HQ_MX_NOUNROLL
#endif

/* The COLS warp's lane exchanges: the CUDA intrinsics. The host pass compiles the body too,
   where these forms are never run (a host simulation of the kernel brings its own). */
struct CudaLanes {
#if defined(__CUDA_ARCH__)
  static __device__ uint32_t shfl(uint32_t v, int src) { return __shfl_sync(kAll, v, src); }
  static __device__ uint32_t shfl_xor(uint32_t v, int m) { return __shfl_xor_sync(kAll, v, m); }
  static __device__ uint32_t shfl_down(uint32_t v, int d) { return __shfl_down_sync(kAll, v, d); }
  static __device__ uint32_t ballot(bool p) { return __ballot_sync(kAll, p); }
#else
  static HQ_HD uint32_t shfl(uint32_t v, int) { return v; }
  static HQ_HD uint32_t shfl_xor(uint32_t v, int) { return v; }
  static HQ_HD uint32_t shfl_down(uint32_t v, int) { return v; }
  static HQ_HD uint32_t ballot(bool p) { return p ? kAll : 0u; }
#endif
};

/* hq_cuda_absmax2<DT, true>: per 16-bit lane the larger magnitude of a and b, a NaN where
   either is one (sign bits meaningless). The host form (the simulation's) writes a NaN as
   0x7fff, the same magnitudes otherwise: readers mask the sign and read NaN as NaN. */
template <int DT> HQ_HD uint32_t cols_absmax2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return hq_cuda_absmax2<DT, true>(a, b);
#else
  const uint32_t inf = DT == HQ_BF16 ? 0x7f80u : 0x7c00u;
  uint32_t d = 0;
  for (int h = 0; h < 32; h += 16) {
    const uint32_t x = (a >> h) & 0x7fffu, y = (b >> h) & 0x7fffu;
    d |= (x > inf || y > inf ? 0x7fffu : x > y ? x : y) << h;
  }
  return d;
#endif
}

/* One 16-bit element's bits as FP32 (hq_cuda_hp16_to_f32's conversion, on either side) */
template <int DT> HQ_HD float cols_hp16(uint32_t h) {
  return DT == HQ_F16 ? hq_f16_to_f32_anynan((uint16_t)h) : hq_bf16_to_f32((uint16_t)h);
}

/* The 8 elements of 4 packed 16-bit words as FP32, element k in word k / 2 (low half first) */
template <int DT> HQ_HD void cols_y8(const uint32_t w[4], float y[8]) {
  HQ_MX_UNROLL
  for (int k = 0; k < 8; k++) y[k] = cols_hp16<DT>(k & 1 ? w[k >> 1] >> 16 : w[k >> 1] & 0xffffu);
}

/* Row i + 8p of a COLS lane's 4 (x at row i), read again by a rule path, as FP32 */
template <int DT> HQ_HD void cols_reread8(const uint16_t *x, int p, uint32_t K, float y[8]) {
  const uint4 u = dq_ld(reinterpret_cast<const uint4 *>(x + (uint64_t)(8 * p) * K));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  cols_y8<DT>(w, y);
}

/* encode8 by round to nearest; the host form (the simulation's) takes the same forms element
   by element with mx_rules.h's host functions. */
template <int KIND>
HQ_HD uint64_t cols_encode8(const float y[8], const float m[8], const uint8_t e[8], bool fast,
                            int rule) {
#if defined(__CUDA_ARCH__)
  return encode8<KIND, false>(y, m, e, make_uint2(0u, 0u), fast, rule);
#else
  uint32_t c[8];
  for (int k = 0; k < 8; k++) {
    const float v = hq_mul_rn(y[k], fast ? m[k] : hq_mx_encode_mult(e[k], rule));
    if (!fast)
      c[k] = hq_mx_cast(v, KIND);
    else if (KIND == HQ_E2M1X2)
      c[k] = (hq_mx_e2m1_biased(v) - HQ_E2M1_BIAS_BITS) | ((hq_f32_bits(v) >> 28) & 8u);
    else
      c[k] = hq_f32_to_fp8(v, hq_mx_fp6_fp8_elem(KIND));
  }
  if (KIND == HQ_E2M1X2) {
    uint32_t w = 0u;
    for (int k = 0; k < 8; k++) w |= (c[k] & 15u) << (4 * k);
    return w;
  }
  if (fast)
    return (uint64_t)hq_mx_fp6x4_of_fp8x4_fin(c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24) |
           (uint64_t)hq_mx_fp6x4_of_fp8x4_fin(c[4] | c[5] << 8 | c[6] << 16 | c[7] << 24) << 24;
  return (uint64_t)hq_fp6_pack4(c[0], c[1], c[2], c[3]) |
         (uint64_t)hq_fp6_pack4(c[4], c[5], c[6], c[7]) << 24;
#endif
}

/* The BF16 E2M1 form's multiplier words (hq_mx_bf16_mult2's) of two columns, their scale codes
   the 16-bit lanes of ew, both with hq_mx_e2m1_bf16_ok (e <= 254: no lane borrows): 2 * mult
   has the BF16 exponent field 255 - max(e, 1) (the min turns e = 0's 255 into 254), mult one
   less but for e = 254, whose subnormal 0x40 the max gives. */
HQ_HD void cols_bf16_mult2(uint32_t ew, uint32_t *m1, uint32_t *m2) {
  *m2 = hq_mx_min3_u16x2(0x7f807f80u - (ew << 7), 0x7f007f00u, 0x7f007f00u);
  *m1 = dq_max2(*m2 - 0x00800080u, 0x00400040u);
}

/* The BF16 FP6 form's lane words (hq_mx_fp6_bf16_nd's) of two columns, their scale codes the
   16-bit lanes of ew: -(e - emin) << 7 mod 2^16 as (512 + emin - e) << 7, whose 512 vanishes
   mod 2^16 and keeps each lane positive (no borrow); the mask drops the bit the low lane's
   shift carries into the high one. */
HQ_HD uint32_t cols_fp6_nd2(uint32_t ew, int kind) {
  return (((512u + hq_mx_fp6_bf16_emin(kind)) * 0x10001u - ew) << 7) & 0xff80ff80u;
}

/* store_codes<KIND, false> of the COLS warp: FP4 4 bytes per lane; FP6 lanes 0..2 of a 32-block
   write its 24 bytes as three 8-byte words; without st8, byte stores. */
template <int KIND, class L>
HQ_HD void cols_store(uint8_t *q, uint64_t v, bool st8, int lane) {
  if (KIND == HQ_E2M1X2) {
    store_fp4_own(q, v, st8);
    return;
  }
  const uint32_t nlo = L::shfl_down((uint32_t)v, 1), nhi = L::shfl_down((uint32_t)(v >> 32), 1);
  store_fp6_words(q, v, nlo, nhi, st8, lane);
}

/* The forms a COLS warp takes for its 32 blocks, this lane's with amax bits am and scale code
   e: every block the fast forms (*fast), every block the BF16 packed form (*pk) -- a choice
   uniform over the warp, so that the FP6 stores' shuffles stay in either path. */
template <int DT, int KIND, class L>
HQ_HD void warp_forms(uint32_t am, uint8_t e, int rule, bool *fast, bool *pk) {
  const bool fin = am < 0x7f800000u;
  *fast = L::ballot(!hq_mx_fast_block(fin, e, KIND, false)) == 0u;
  *pk = false;
  if (DT == HQ_BF16 && KIND == HQ_E2M1X2) *pk = L::ballot(!hq_mx_e2m1_bf16_ok(e, rule)) == 0u;
  if (DT == HQ_BF16 && KIND != HQ_E2M1X2)
    *pk = L::ballot(!(fin && hq_mx_fp6_bf16_ok(e, KIND))) == 0u;
}

/* One warp's tile: row block bi, columns jt .. jt + 31 (none where jt >= K), lane `lane`.
   Per column, the max over the lane's 4 rows, reduce-scattered over the 8 lanes of its columns
   (lane bits 2..4) by three xor shuffles, NaN-propagating as the rule's amax (a NaN anywhere
   makes the column's amax NaN): lane 4g + c finishes column 8c + g, writes its scale code (the
   warp's 32 codes one 32-byte row segment) and the 8 lanes gather their 8 columns' codes by
   three more. The warp's rows take the BF16 packed form (BP, BP6) where all 32 blocks allow it,
   the fast forms (hq_mx_fast_block, as in quantize_kernel) where all 32 do, else the rule: the
   forms and their conditions of the other kernels, decided for the warp, not per 8 columns
   (the same bytes: each form is the rule wherever it is taken), so that the paths' shuffles
   are uniform. */
template <int DT, int KIND, class L>
HQ_HD void cols_tile(const QArgs &a, uint32_t bi, uint32_t jt, int lane) {
  constexpr bool BP = DT == HQ_BF16 && KIND == HQ_E2M1X2;
  constexpr bool BP6 = DT == HQ_BF16 && KIND != HQ_E2M1X2;
  const uint32_t K = (uint32_t)a.K; /* below 2^32, as the rows (the launcher's check) */
  if (jt >= K) return;              /* uniform over the warp (K % 32 == 0) */
  const int c = lane & 3, g = lane >> 2;
  const uint32_t j = jt + 8 * c, i = bi * kBlk + g; /* the lane's first column and row */
  const uint16_t *x = static_cast<const uint16_t *>(a.x) + ((uint64_t)i * K + j);
  uint32_t w[4][4];
  HQ_MX_UNROLL
  for (int p = 0; p < 4; p++) { /* rows i + 8p */
    const uint4 u = dq_ld(reinterpret_cast<const uint4 *>(x + (uint64_t)(8 * p) * K));
    w[p][0] = u.x, w[p][1] = u.y, w[p][2] = u.z, w[p][3] = u.w;
  }
  uint32_t cm[4]; /* word h: columns 2h, 2h + 1 of the lane's 8 */
  HQ_MX_UNROLL
  for (int h = 0; h < 4; h++)
    cm[h] = cols_absmax2<DT>(cols_absmax2<DT>(w[0][h], w[1][h]),
                             cols_absmax2<DT>(w[2][h], w[3][h]));
  /* xor 16 (g's bit 2) halves the words to 2h + (g & 4 ? 2 : 0) + 0, 1; xor 8 (bit 1) to one
     word; xor 4 (bit 0) the last, whose lane g & 1 is column g */
  const bool b2 = g & 4, b1 = g & 2, b0 = g & 1;
  uint32_t r[2];
  HQ_MX_UNROLL
  for (int h = 0; h < 2; h++)
    r[h] = cols_absmax2<DT>(b2 ? cm[2 + h] : cm[h], L::shfl_xor(b2 ? cm[h] : cm[2 + h], 16));
  uint32_t s = cols_absmax2<DT>(b1 ? r[1] : r[0], L::shfl_xor(b1 ? r[0] : r[1], 8));
  s = cols_absmax2<DT>(s, L::shfl_xor(s, 4));
  const uint32_t am = hq_f32_bits(cols_hp16<DT>((b0 ? s >> 16 : s) & 0x7fffu));
  const uint8_t e = hq_mx_scale_code(hq_bits_f32(am), KIND, a.rule);
  a.cs[(uint64_t)(i / kBlk) * K + j + g] = e; /* hq_mx_scale_idx(1, i, j + g, K) */
  /* the 8 columns' codes, column k at byte k % 4 of ec[k / 4]: pairs (xor 4), quads (xor 8),
     all 8 (xor 16), each lane's own below its partner's where its bit is set */
  const uint32_t e1 = L::shfl_xor(e, 4);
  const uint32_t e2 = hq_mx_prmt(e, e1, b0 ? 0x04u : 0x40u);
  const uint32_t e2o = L::shfl_xor(e2, 8);
  const uint32_t e4 = hq_mx_prmt(e2, e2o, b1 ? 0x1054u : 0x5410u);
  const uint32_t e4o = L::shfl_xor(e4, 16);
  const uint32_t ec[2] = {b2 ? e4o : e4, b2 ? e4 : e4o};
  bool fast, pk;
  warp_forms<DT, KIND, L>(am, e, a.rule, &fast, &pk);
  const int64_t rowb = a.rowb;
  uint8_t *q = a.cd + (int64_t)((uint64_t)i * (uint32_t)rowb) +
               (KIND == HQ_E2M1X2 ? j / 2 : j / 4 * 3);
  if (pk) {
    uint32_t m1w[4], m2w[4]; /* BP: pair h's multiplier words; BP6: m1w its lane words */
    HQ_MX_UNROLL
    for (int h = 0; h < 4; h++) {
      const uint32_t ew = hq_mx_prmt(ec[h >> 1], 0u, h & 1 ? 0x4342u : 0x4140u);
      m1w[h] = m2w[h] = 0u;
      if (BP) cols_bf16_mult2(ew, &m1w[h], &m2w[h]);
      if (BP6) m1w[h] = cols_fp6_nd2(ew, KIND);
    }
    HQ_MX_UNROLL
    for (int p = 0; p < 4; p++) {
      const uint64_t v =
          BP ? hq_mx_e2m1x8_bf16(w[p], m1w, m2w) : hq_mx_fp6x8_bf16(w[p], m1w, KIND);
      cols_store<KIND, L>(q + 8 * p * rowb, v, a.st8, lane);
    }
    return;
  }
  /* the fast forms' multipliers of the 8 columns, from the lanes that made them (BF16 to E2M1
     has no fast form but the packed one) */
  float m[8];
  const float mu = KIND == HQ_E2M1X2 ? hq_mx_encode_mult(e, a.rule)
                                     : hq_mx_fp6_fp8_mult(e, a.rule, KIND);
  HQ_MX_UNROLL
  for (int k = 0; k < 8; k++) m[k] = 0.0f;
  if (!BP && fast) { /* uniform over the warp */
    HQ_MX_UNROLL
    for (int k = 0; k < 8; k++) m[k] = hq_bits_f32(L::shfl(hq_f32_bits(mu), 4 * k + c));
  }
  if (DT == HQ_F16 && fast) {
    HQ_MX_UNROLL
    for (int p = 0; p < 4; p++) {
      float y[8];
      cols_y8<DT>(w[p], y);
      cols_store<KIND, L>(q + 8 * p * rowb, cols_encode8<KIND>(y, m, nullptr, true, a.rule),
                          a.st8, lane);
    }
    return;
  }
  /* the rule, and BF16 to FP6's FP8 form for a warp with finite blocks below the packed form's
     codes: rare, so the rows are read again one at a time (L1 hits), which leaves the loop
     the registers the rule's casts take */
  HQ_MX_NOUNROLL
  for (int p = 0; p < 4; p++, q += 8 * rowb) {
    float y[8];
    uint8_t ek[8];
    cols_reread8<DT>(x, p, K, y);
    HQ_MX_UNROLL
    for (int k = 0; k < 8; k++) ek[k] = (uint8_t)(ec[k >> 2] >> (8 * (k & 3)));
    cols_store<KIND, L>(q, cols_encode8<KIND>(y, m, ek, fast && !BP, a.rule), a.st8, lane);
  }
}

/* 1: mx_cuda_quantize sends the columnwise copy alone to the COLS kernels. 0: they match the CPU
   reference (tests/test_gpu_mx) but are slower for MXFP6 than the kernel that writes both copies
   (docs/performance.md, "MX COLS timed"), so they stay compiled for every architecture and out
   of the dispatch. */
#ifndef HQ_MX_COLS
#define HQ_MX_COLS 0
#endif
/* The CTAs of 256 threads per SM the COLS kernels' registers must allow: 6 (40 registers),
   where no form spills; the BF16 packed forms alone would fit 32, but the warp's rule path
   beside them spills there. */
#ifndef HQ_MX_COLS_MIN_BLOCKS
#define HQ_MX_COLS_MIN_BLOCKS 6
#endif

/* The CTA's column block along K and its row block (blockIdx swapped as in quantize_kernel) */
template <int DT, int KIND>
__global__ void __launch_bounds__(kColsWarps * 32, HQ_MX_COLS_MIN_BLOCKS)
    quantize_cols_kernel(const QArgs a) {
  const unsigned bi = a.row_major ? blockIdx.y : blockIdx.x,
                 bj = a.row_major ? blockIdx.x : blockIdx.y;
  cols_tile<DT, KIND, CudaLanes>(a, bi, bj * kColsCols + (threadIdx.x >> 5) * kBlk,
                                 (int)(threadIdx.x & 31));
}

bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

/* rows: the ROWS kernels (mx_cuda_quantize's choice, which sized the grid by a.tiles) */
template <int DT, int KIND>
void launch_q(const QArgs &a, bool sr, bool rows, dim3 grid, cudaStream_t s) {
  if (a.rr || a.cr) { /* raw_copy: the RAW kernels (never the ROWS ones) */
    if (sr && a.vec)
      quantize_kernel<DT, KIND, true, true, false, true><<<grid, kThreads, 0, s>>>(a);
    else if (sr)
      quantize_kernel<DT, KIND, true, false, false, true><<<grid, kThreads, 0, s>>>(a);
    else if (a.vec)
      quantize_kernel<DT, KIND, false, true, false, true><<<grid, kThreads, 0, s>>>(a);
    else
      quantize_kernel<DT, KIND, false, false, false, true><<<grid, kThreads, 0, s>>>(a);
    return;
  }
  if (sr && a.vec)
    quantize_kernel<DT, KIND, true, true><<<grid, kThreads, 0, s>>>(a);
  else if (sr)
    quantize_kernel<DT, KIND, true, false><<<grid, kThreads, 0, s>>>(a);
  else if (rows)
    quantize_kernel<DT, KIND, false, true, true><<<grid, kThreads, 0, s>>>(a);
  else if (a.vec)
    quantize_kernel<DT, KIND, false, true><<<grid, kThreads, 0, s>>>(a);
  else
    quantize_kernel<DT, KIND, false, false><<<grid, kThreads, 0, s>>>(a);
}

template <int DT>
void launch_q_dt(const QArgs &a, int kind, bool sr, bool rows, dim3 grid, cudaStream_t s) {
  if (kind == HQ_E2M1X2)
    launch_q<DT, HQ_E2M1X2>(a, sr, rows, grid, s);
  else if (kind == HQ_E3M2X4)
    launch_q<DT, HQ_E3M2X4>(a, sr, rows, grid, s);
  else
    launch_q<DT, HQ_E2M3X4>(a, sr, rows, grid, s);
}

/* The COLS kernels (mx_cuda_quantize's choice for a 16-bit input) */
template <int DT> void launch_cols(const QArgs &a, int kind, dim3 grid, cudaStream_t s) {
  if (kind == HQ_E2M1X2)
    quantize_cols_kernel<DT, HQ_E2M1X2><<<grid, kColsWarps * 32, 0, s>>>(a);
  else if (kind == HQ_E3M2X4)
    quantize_cols_kernel<DT, HQ_E3M2X4><<<grid, kColsWarps * 32, 0, s>>>(a);
  else
    quantize_cols_kernel<DT, HQ_E2M3X4><<<grid, kColsWarps * 32, 0, s>>>(a);
}

template <int OT, int KIND>
void launch_dq_k(unsigned blocks, cudaStream_t s, const uint8_t *data, const uint8_t *scale,
                 int colwise, void *dst, int64_t M, int64_t K, int vec) {
  if ((uint64_t)(M * (K / 16)) < ((uint64_t)1 << 32))
    dequantize_kernel<OT, KIND, true><<<blocks, 256, 0, s>>>(data, scale, colwise, dst, M, K, vec);
  else
    dequantize_kernel<OT, KIND, false><<<blocks, 256, 0, s>>>(data, scale, colwise, dst, M, K, vec);
}

template <int OT>
void launch_dq(int kind, unsigned blocks, cudaStream_t s, const uint8_t *data,
               const uint8_t *scale, int colwise, void *dst, int64_t M, int64_t K, int vec) {
  if (kind == HQ_E2M1X2)
    launch_dq_k<OT, HQ_E2M1X2>(blocks, s, data, scale, colwise, dst, M, K, vec);
  else if (kind == HQ_E3M2X4)
    launch_dq_k<OT, HQ_E3M2X4>(blocks, s, data, scale, colwise, dst, M, K, vec);
  else
    launch_dq_k<OT, HQ_E2M3X4>(blocks, s, data, scale, colwise, dst, M, K, vec);
}

/* The BF16 kernel's grid: 1024 columns per blockIdx.x, 8 rows per blockIdx.y (a loop past the
   grid's y limit); 32-bit indices where every element offset fits */
template <int KIND, bool COLWISE>
void launch_dq_bf16(cudaStream_t s, const uint8_t *data, const uint8_t *scale, void *dst, int64_t M,
                    int64_t K) {
  const int64_t gy = M / kDqRowsPerCta;
  const dim3 grid((unsigned)((K + kDqCols - 1) / kDqCols), (unsigned)(gy < 65535 ? gy : 65535));
  uint16_t *d = static_cast<uint16_t *>(dst);
  if (M * K < ((int64_t)1 << 31))
    dequantize_bf16_kernel<KIND, COLWISE, uint32_t>
        <<<grid, 256, 0, s>>>(data, scale, d, (uint32_t)M, (uint32_t)K);
  else
    dequantize_bf16_kernel<KIND, COLWISE, int64_t><<<grid, 256, 0, s>>>(data, scale, d, M, K);
}
template <int KIND>
void launch_dq_bf16_k(cudaStream_t s, const uint8_t *data, const uint8_t *scale, int colwise,
                      void *dst, int64_t M, int64_t K) {
  if (colwise)
    launch_dq_bf16<KIND, true>(s, data, scale, dst, M, K);
  else
    launch_dq_bf16<KIND, false>(s, data, scale, dst, M, K);
}

} // namespace

extern "C" int mx_cuda_quantize(const mx_job *q, const hq_call *call, const hq_tensor *src) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = q->M, K = q->K;
  if (M * K == 0) return HQ_OK;
  /* tiles: gx row blocks of 32, gy column blocks of 128; one of them must fit the grid's y
     limit (65535) and the other its x limit (2^31 - 1) */
  const int64_t gx = M / kBlk, gy = (K + kCols - 1) / kCols;
  if ((!(gx <= 65535 && gy <= 0x7fffffff) && !(gy <= 65535 && gx <= 0x7fffffff)) ||
      M > 0xffffffffLL || K > 0xffffffffLL)
    return call->host->error(HQ_ESHAPE, "mx CUDA: shape [%lld, %lld] exceeds the grid limits "
                             "(rows <= %d or cols <= %d; both below 2^32)", (long long)M,
                             (long long)K, 65535 * kBlk, 65535 * kCols);
  QArgs a;
  a.x = src->data;
  a.M = M;
  a.K = K;
  a.rowb = hq_mx_row_bytes(K, q->kind);
  a.kb = K / kBlk;
  a.rd = q->rd;
  a.rs = q->rs;
  a.cd = q->cd;
  a.cs = q->cs;
  a.rr = q->rr;
  a.cr = q->cr;
  a.raw16 = aligned(q->rr, 16) && aligned(q->cr, 16);
  a.rule = q->rule;
  a.vec = aligned(src->data, 16);
  a.st8 = aligned(q->rd, 8) && aligned(q->cd, 8);
  a.offset = q->offset;
  a.offset_dev = hq_call_offset_dev(call);
  /* the fields of a 2.6 call (an older core's ends before them) */
  a.role_key = a.offset_dev ? call->role_key : 0;
  a.role_count = a.offset_dev ? call->role_count : 0;
  hq_nvfp4_sr_keys(q->seed, a.rk);
  const int kind = (int)q->kind;
  /* the columnwise copy alone from an aligned 16-bit input by round to nearest: the COLS
     kernels (HQ_MX_COLS), a CTA per 32 rows x kColsCols columns, row-major where the grid's y
     limit allows */
  if (HQ_MX_COLS && !a.rd && !q->sr && a.vec && a.cd && !a.rr && !a.cr &&
      (src->dtype == HQ_BF16 || src->dtype == HQ_F16)) {
    const int64_t gc = (K + kColsCols - 1) / kColsCols;
    a.tiles = 1;
    a.row_major = gx <= 65535;
    const dim3 grid =
        a.row_major ? dim3((unsigned)gc, (unsigned)gx) : dim3((unsigned)gx, (unsigned)gc);
    if (src->dtype == HQ_BF16)
      launch_cols<HQ_BF16>(a, kind, grid, stream);
    else
      launch_cols<HQ_F16>(a, kind, grid, stream);
    CHECK_LAUNCH(call, "mx quantize");
    return HQ_OK;
  }
  /* the rowwise copy alone from aligned input by round to nearest: the ROWS kernels, a CTA over
     up to HQ_MX_TILES row blocks where the grid keeps two waves of 8 CTAs per SM or more */
  const bool rows = !q->sr && a.vec && !a.cd && !a.rr;
  a.tiles = 1;
  if (rows) {
    const int sms = hq_cuda_device_sms(call->device);
    a.tiles = sms > 0 ? gx * gy / (2 * 8 * (int64_t)sms) : 1;
    a.tiles = a.tiles < 1 ? 1 : a.tiles > HQ_MX_TILES ? HQ_MX_TILES : a.tiles;
  }
  const int64_t gt = (gx + a.tiles - 1) / a.tiles; /* the grid along M */
  /* row-major tile order (blockIdx.x along K) wherever the grid's y limit allows: the CTAs
     running at once stream whole rows */
  a.row_major = gt <= 65535;
  const dim3 grid =
      a.row_major ? dim3((unsigned)gy, (unsigned)gt) : dim3((unsigned)gt, (unsigned)gy);
  switch (src->dtype) {
  case HQ_F32: launch_q_dt<HQ_F32>(a, kind, q->sr != 0, rows, grid, stream); break;
  case HQ_F16: launch_q_dt<HQ_F16>(a, kind, q->sr != 0, rows, grid, stream); break;
  case HQ_BF16: launch_q_dt<HQ_BF16>(a, kind, q->sr != 0, rows, grid, stream); break;
  default:
    return call->host->error(HQ_EINVAL, "mx CUDA: source dtype %d", (int)src->dtype);
  }
  CHECK_LAUNCH(call, "mx quantize");
  return HQ_OK;
}

extern "C" int mx_cuda_dequantize(const hq_call *call, const uint8_t *data, const uint8_t *scale,
                                  hq_dtype kind, int colwise, hq_tensor *dst) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = dst->rows, K = dst->cols, nrun = M * (K / 16);
  if (nrun == 0) return HQ_OK;
  int64_t blocks = (nrun + 255) / 256;
  blocks = hq_cuda_stride_grid(call->device, blocks);
  const int vec = aligned(data, kind == HQ_E2M1X2 ? 8 : 4) && aligned(scale, 16) &&
                  aligned(dst->data, 16);
  switch (dst->dtype) {
  case HQ_F32:
    launch_dq<HQ_F32>((int)kind, (unsigned)blocks, stream, data, scale, colwise, dst->data, M, K, vec);
    break;
  case HQ_F16:
    launch_dq<HQ_F16>((int)kind, (unsigned)blocks, stream, data, scale, colwise, dst->data, M, K, vec);
    break;
  case HQ_BF16:
    if (vec && (K + kDqCols - 1) / kDqCols <= 0x7fffffff) {
      if (kind == HQ_E2M1X2)
        launch_dq_bf16_k<HQ_E2M1X2>(stream, data, scale, colwise, dst->data, M, K);
      else if (kind == HQ_E3M2X4)
        launch_dq_bf16_k<HQ_E3M2X4>(stream, data, scale, colwise, dst->data, M, K);
      else
        launch_dq_bf16_k<HQ_E2M3X4>(stream, data, scale, colwise, dst->data, M, K);
      break;
    }
    launch_dq<HQ_BF16>((int)kind, (unsigned)blocks, stream, data, scale, colwise, dst->data, M, K, vec);
    break;
  default:
    return call->host->error(HQ_EINVAL, "mx CUDA: destination dtype %d", (int)dst->dtype);
  }
  CHECK_LAUNCH(call, "mx dequantize");
  return HQ_OK;
}
