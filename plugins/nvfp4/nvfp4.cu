/*
** nvfp4.cu -- CUDA kernels of the nvfp4 plugin: the global amax pass (plain and RHT), the fused
** quantize of both directions from one read of the input, dequantize. Every bit comes from the
** functions of nvfp4_rules.h and hq/numerics.h (HQ_HD: host + device) that the CPU reference
** runs, in the same order, so the bytes agree with it bit for bit on sm_90 and sm_100 alike.
**
** Every launch and memset is queued on call->stream; nothing allocates (scratch_size is 0 on a
** device) and nothing synchronizes, so quantize/update can be captured in a CUDA graph.
**
** Three translation units: this file, and nvfp4_f16.cu and nvfp4_bf16.cu, which include it with
** HQ_NVFP4_TU_DT set and keep the quantize launches and kernels of that source dtype alone (the
** dequantizes, the row amax pass and the module's entry points are this unit's), so that the
** three dtypes' kernels, most of the module's build, compile in parallel.
**
** The comments say why each choice was made; what was measured for it, when, and the
** alternatives that were not kept are in docs/performance.md (sections 3 to 5).
**
** Quantize tiles of 64 (M) x 128 (K) elements for both directions, 128 x 64 for the columnwise
** copy alone and 32 x 256 for the rowwise copy alone (QShape: a tile longer along its
** direction's blocks writes that direction's data and scales in pieces twice as long, so the
** L2 gets half as many requests), 256 threads, read once from global memory into a shared tile
** of the input's own bits: by the tensor-memory accelerator (tma_cuda.h: TK / 64 2-D boxes per
** tile, the 128-byte swizzled layout, an mbarrier per tile buffer) for a 16-bit input, by
** cp.async for an F32 one. The text below says "64x128" for the tile of both directions; the
** other shapes take the same steps with their own sizes. Both directions (round to nearest)
** walk groups of 4 tiles stacked along M and store the columnwise bytes of a group together
** (ColGroup: a column's piece one 128-byte line), a part per tile while the next group is
** encoded.
**   amax: max |x| (NaN ignored): the stock plugins' flat pass (amax_cuda.h) when only max |x|
**     is wanted; with rht a kernel that also takes the columnwise amax of the BF16-rounded
**     transformed 16-groups (the RHT of each column's 16-row groups, as the quantize kernel
**     computes it) from registers: a thread loads 16 rows x 4 columns (8- or 16-byte loads,
**     scalar ones when the input is not 16-byte aligned) and transforms its 4 columns, with no
**     shared tile and no barrier; resident CTAs loop over the patches, one atomicMax per CTA
**     and target into targets zeroed first: the result does not depend on the order of the
**     atomics. A tensor of at most 2^17 elements takes one cluster of 8 CTAs of 512 threads
**     instead, a thread on 16 rows x 1 column (element loads, one transform: the pass is then
**     one thread's chain long), whose first CTA gathers the maxima and stores them (no memset
**     node in a captured step). A quantize with rht whose call brings no amax and whose grid
**     is at most 8 CTAs (a trainer's small activations and gradients) runs no pass: its kernel
**     is launched as one cluster (CA), each CTA takes its share of the same 16 x 1 patches
**     while its first tiles' copies are in flight, and the cluster's maxima reach every thread
**     through distributed shared memory before the constants are made -- one launch where
**     there were two, a graph node fewer per call.
**   quantize: as many CTAs as are resident at once, each looping over tiles (TileWalk) through
**     a ring of tile buffers (kStagesOf): the next tiles are copied in while tile n is encoded,
**     so the memory stays busy while the CTAs compute. One barrier per tile: after it, tile
**     n - 1's staged bytes are stored from one staging buffer while tile n is encoded into the
**     other. A tile wholly inside the tensor with aligned buffers (every tile but the edges) is
**     copied and stored with no bounds checks; a partial tile is zero-filled in shared memory,
**     so every block is encoded without a check (only the stores check). Per CTA once: the
**     global amaxes (call->amax, which CTA 0 copies into the storages' amax buffers; the
**     buffers the amax pass filled; or the cluster's own, CA, which CTA 0 stores), S_enc, S_dec
**     and m per direction, and a shared table of hq_nvfp4_encode_mult for the 256 scale
**     codes. Per tile a thread encodes four blocks: two rowwise (16 along K of one row) and two
**     columnwise (16 along M of two adjacent columns, one 32-bit shared read per row; with rht
**     through rht16_head / rht16_tail), with no branch among them -- every block's values and
**     amax, then the heads (block_heads2), then the fast forms -- so that their dependent chains
**     overlap; a block the fast form does not take (a NaN, an Inf, a scale code that
**     underflows) is redone by the rule, out of line (redo_blocks), so that the instruction
**     cache holds the common path. The fast forms
**     (fast_block) are hq_e2m1_biased_bits_lt7 for round to nearest and hq_e2m1_sr_biased_lt8
**     for stochastic rounding (one hq_nvfp4_sr_bits draw per block, byte e for element e),
**     packed by multiply-adds; a 16-bit input's block amaxes come from packed
**     max.NaN.xorsign.abs on the raw words and its sign bits from byte permutes. On Blackwell's
**     family-specific targets (sm_100f) round to nearest takes the rule's own steps instead,
**     RN(v * enc) and the FP4 convert instruction on pairs (mx_cvt_cuda.h: HQ_MX_CVT_PAIRS).
**     block_2d takes a block's 16x16 tile amax from the lanes that hold the tile (tile_max).
**     The packed bytes and the scale bytes are staged in shared memory and stored coalesced
**     (Staged, ColGroup), the scales as words of 4 entries, not one byte per block
**     (single-byte scale stores keep L1 and L2 busier than DRAM); the block scale code comes
**     through the FP8 convert instruction (fp8_cvt_cuda.h). The kernel is specialized on the
**     input dtype, rht, SR, block_2d and the directions, so its body holds no branch on them,
**     and addresses its tiles and staging buffers through 32-bit shared-window addresses taken
**     once (smem_cuda.h). A scale buffer with padding entries is zeroed first
**     (cudaMemsetAsync). The rowwise copy alone of a tensor of fewer tiles than the device has
**     SMs (a trainer's activations and gradients) takes rowe_kernel instead: a thread per
**     block, straight from global memory to its 8 bytes and scale byte, so that a few hundred
**     rows are spread over tens of CTAs instead of a CTA per tile (block_2d, whose tile amaxes
**     span 16 rows, keeps the tile kernel).
**   dequantize: 16-element blocks through hq_nvfp4_decode_mult / hq_nvfp4_dequantize; the
**     rowwise copy by a grid-stride kernel, one block per thread; the columnwise copy through
**     hq_nvfp4_rht16_inverse when its descriptor says RHT, transposed back through a shared
**     tile of 16 x 128 (one row block: small tensors still spread over the SMs; coalesced
**     stores). The raw dequantize (HQ_CALL_DEQ_RAW) is the same kernels with
**     hq_nvfp4_raw_mult (the block scale alone) and no inverse RHT; its values take
**     hq_nvfp4_raw_fast (the same bits) and, into BF16, exact truncation. dequantize_pair
**     (an emulated GEMM's two raw dequantizes) runs both as one grid, the first CTAs on the
**     first storage's part with that part's own device body, the rest on the second's; one
**     thread writes both folded factors in order, so the second may read the first's product.
**   options: scale_dtype = ue5m3 and global_scale = row / none take the same kernels,
**     specialized on them (OPT, struct Head): UE5M3 codes by hq_f32_to_ue5m3 and S_enc = 1 for
**     none, the encode multipliers from the same per-direction table; global_scale = row takes
**     its per-row amaxes from a pass of its own first (row_amax_kernel: every row's and every
**     column's from one read), and the quantize kernel makes each thread's row (or two
**     columns') S_enc, S_dec and m per tile and each block's encode multiplier by the rule --
**     except the rowwise copy alone, which rowq_kernel makes from one read (slabs of whole rows
**     in shared memory by the TMA's bulk copy, each row's amax reduced there, one barrier per
**     slab, its constants and an encode-multiplier table made once per warp and row).
**     Dequantize and the tensor factor take the scale type and global scale as arguments.
**   tensor factor: one thread writes hq_nvfp4_tensor_factor_k of the amax buffer (the
**     tensor_factor op, and the alpha factors of the native GEMM); a raw dequantize asked for it
**     (ABI 2.3, hq_call.factor_out) has thread 0 of its own kernel write it, times the caller's
**     running product (write_factor), so the emulated GEMM launches nothing for it.
*/
#include <cuda_runtime.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "amax_cuda.h"
#include "cuda_check.h"
#include "fp8_cvt_cuda.h"
#include "hp_load_cuda.h"
#include "mx_cvt_cuda.h"
#include "hq/numerics.h"
#include "launch_cuda.h"
#include "nvfp4.h"
#include "nvfp4_rules.h"
#include "smem_cuda.h"
#include "tma_cuda.h"

namespace {

constexpr int kTM = 64;  /* tile rows (M) */
constexpr int kTK = 128; /* tile columns (K) */
constexpr int kThreads = 256;
/* quantize CTAs per SM the register allocation aims at, both directions: 2 (128 registers, no
   spills), the fastest measured; 3 (80 registers, which now fit without spills) and 4 (64,
   spilling) were slower on both GPUs (docs/performance.md, section 4) */
#ifndef HQ_NVFP4_MIN_BLOCKS /* (a build-time override, for measuring other targets) */
#define HQ_NVFP4_MIN_BLOCKS 2
#endif
constexpr int kMinBlocks = HQ_NVFP4_MIN_BLOCKS;
/* the same for one direction alone: 3 (80 registers, no spills), the fastest measured there;
   4 (64 registers) gained nothing */
#ifndef HQ_NVFP4_MIN_BLOCKS1
#define HQ_NVFP4_MIN_BLOCKS1 3
#endif
constexpr int kMinBlocks1 = HQ_NVFP4_MIN_BLOCKS1;
/* the same with stochastic rounding, whatever the directions: 2 (128 registers); 3 (80)
   measured slower for both directions and for one alone */
#ifndef HQ_NVFP4_SR_MIN_BLOCKS
#define HQ_NVFP4_SR_MIN_BLOCKS 2
#endif
constexpr int kMinBlocksSR = HQ_NVFP4_SR_MIN_BLOCKS;
/* quantize: tile buffers in the ring (the tiles in flight while one is encoded: kStages - 1),
   by what measured fastest: 3 for one direction of a 16-bit input with stochastic rounding,
   whose tiles take longer to encode, and for both directions of a 16-bit input without it
   (TMA tiles, the ColGroups leaving by bulk stores); 2 everywhere else, where a third buffer
   was slower (and an F32 input's three tiles would leave one CTA per SM). */
#ifndef HQ_NVFP4_STAGES
#define HQ_NVFP4_STAGES 2
#endif
#ifndef HQ_NVFP4_SR1_STAGES
#define HQ_NVFP4_SR1_STAGES 3
#endif
#ifndef HQ_NVFP4_TMA_STAGES
#define HQ_NVFP4_TMA_STAGES 3
#endif
template <int DT, int DIRS, bool SR>
constexpr int kStagesOf = SR && DIRS != 3 && DT != HQ_F32 ? HQ_NVFP4_SR1_STAGES
                          : DIRS == 3 && !SR && DT != HQ_F32 ? HQ_NVFP4_TMA_STAGES
                                                             : HQ_NVFP4_STAGES;
/* stochastic rounding's fast form for ordinary blocks (hq_e2m1_sr_biased_lt8; 0 = the rule for
   every block: the same bits, more instructions per element) */
#ifndef HQ_NVFP4_SR_FAST
#define HQ_NVFP4_SR_FAST 1
#endif
constexpr bool kSRFast = HQ_NVFP4_SR_FAST;
/* The quantize kernel's tile shape (8192 elements, kThreads x 32) by the directions it makes:
   64 x 128 for both; for one direction alone a tile longer along the direction's blocks, so that
   each tile writes fewer, longer pieces of that direction's data and scales (each piece a line of
   its own in the L2): columnwise alone 128 x 64 (a column's 64 data bytes and 8 scale bytes per
   tile instead of 32 and 4), rowwise alone 32 x 256 (a row's 128 and 16 instead of 64 and 8).
   Longer still (256 x 32 for the columnwise copy alone, 128 x 128 for both) measured slower.
   RS: uint2 per row of the rowwise staging (TK / 16 used, one of padding); CS: uint2 per row
   block of the columnwise staging (TK used; the pad spreads the row blocks a half-warp reads over
   the banks). */
#ifndef HQ_NVFP4_ONE_DIR_SHAPES /* 0: 64 x 128 for one direction too (for measuring) */
#define HQ_NVFP4_ONE_DIR_SHAPES 1
#endif
template <int DIRS> struct QShape {
  static constexpr int TM = !HQ_NVFP4_ONE_DIR_SHAPES || DIRS == 3 ? 64 : DIRS == 2 ? 128 : 32;
  static constexpr int TK = 8192 / TM;
  static constexpr int RS = TK / 16 + 1;
  static constexpr int CS = TK + 256 / TM;
};

/* Whether the TM x TK tile at (i0, k0) lies wholly inside [M, K]. */
template <int TM, int TK>
__device__ __forceinline__ bool tile_full(uint32_t M, uint32_t K, uint32_t i0, uint32_t k0) {
  return i0 + TM <= M && k0 + TK <= K;
}

/* A CTA's walk over the tiles, grid-stride in row-major order, without a division per tile;
   with G > 1 over groups of G tiles stacked along M (G tile rows, one tile column; the groups
   grid-stride in row-major order, the tiles of a group top to bottom, a group at the bottom
   edge holding fewer). Row-major: what the order moves is the rowwise copy's locality; orders
   that fill or spread the columnwise lines sooner were no faster.
   Tile n = ti * ntk + tk; the next one (n + gridDim.x) adds the stride's quotient and remainder
   by ntk (made once) with one carry. */
template <int TM, int TK, int G = 1> struct TileWalk {
  unsigned gm, tk, j, ntm, ntk, dq, dr;
  __device__ __forceinline__ TileWalk(int64_t M, int64_t K) {
    ntm = (unsigned)((M + TM - 1) / TM), ntk = (unsigned)((K + TK - 1) / TK);
    gm = blockIdx.x / ntk, tk = blockIdx.x % ntk, j = 0;
    dq = gridDim.x / ntk, dr = gridDim.x % ntk;
  }
  __device__ __forceinline__ TileWalk next() const {
    TileWalk w = *this;
    if (G > 1 && w.j + 1 < G && G * w.gm + w.j + 1 < ntm) {
      w.j++;
      return w;
    }
    w.j = 0, w.tk += dr, w.gm += dq;
    if (w.tk >= ntk) w.tk -= ntk, w.gm++;
    return w;
  }
  __device__ __forceinline__ bool valid() const { return G * gm < ntm; }
  /* the tile's origin (below 2^31: the launcher rejects M or K of 2^31 or more), its place in
     its group and the group's first row */
  __device__ __forceinline__ uint32_t i0() const { return (G * gm + j) * TM; }
  __device__ __forceinline__ uint32_t k0() const { return tk * TK; }
  __device__ __forceinline__ unsigned slot() const { return j; }
  __device__ __forceinline__ uint32_t g0() const { return G * gm * TM; }
};

struct AmaxArgs {
  const void *x;
  int64_t M, K;
  int vec;
  float *x0, *x1; /* receive max |x| (either may be NULL) */
  float *t;       /* receives the amax of the RHT-transformed columns (NULL: not wanted) */
  uint32_t mask;  /* RHT signs */
};


/* One direction's constants from its global amax A. */
struct DirConst {
  float amax, s_dec, m;
};

/* How the kernel makes a block's scale code and encode multiplier (its OPT parameter):
     OPT 0: nvfp4 as shipped, E4M3 codes, the multiplier from the direction's table (tab: its
            hq_nvfp4_encode_mult of every code, shared memory);
     OPT 1: the scale type of the option scale_dtype (kind, a kernel argument) under one global
            scale per direction (global_scale = tensor, or none: S_enc = 1), from the table;
     OPT 2: global_scale = row: m and S_dec are the stored row's (the thread's row, or column
            of x), so the multiplier is the rule's hq_nvfp4_encode_mult_k of the code (no table).
   OPT 0 takes its constants as compile-time ones, so its code is the shipped kernel's. */
template <int OPT> struct Head {
  const float *tab; /* OPT 0, 1 */
  float m;          /* the block scale multiplier m of the block's direction or stored row */
  float s_dec;      /* OPT 2: the stored row's S_dec */
  int kind;         /* OPT 1, 2: HQ_NVFP4_SCALE_* */
  /* hq_nvfp4_block_scale_k's code of the product p = RN(bamax * m) >= 0 (or NaN): E4M3 through
     the FP8 convert instruction (fp8_cvt_cuda.h: the same bits; its saturation also covers the
     rule's Inf -> FLT_MAX clamp), UE5M3 by hq_f32_to_ue5m3 (which saturates Inf too) */
  __device__ __forceinline__ uint32_t code(float p) const {
    if (OPT && kind == HQ_NVFP4_SCALE_UE5M3) return hq_f32_to_ue5m3(p);
    return hq_cuda_f32_to_fp8<HQ_E4M3>(p);
  }
  __device__ __forceinline__ float enc(uint32_t sf) const {
    if (OPT == 2) return hq_nvfp4_encode_mult_k((uint8_t)sf, s_dec, kind);
    return tab[sf & 0xffu];
  }
};

/* A direction's constants (S_dec, m) from its global amax A (or a stored row's with
   global_scale = row) for scale type `kind`; with global_scale = none (none) S_enc = 1. */
__device__ __forceinline__ DirConst dir_const_k(float amax, int kind, bool none = false) {
  DirConst d;
  d.amax = amax;
  const float s_enc = none ? 1.0f : hq_nvfp4_global_encode_scale_k(amax, kind);
  d.s_dec = hq_nvfp4_global_decode_scale(s_enc);
  d.m = hq_nvfp4_block_scale_mult(s_enc);
  return d;
}

/* A block's scale code from its amax, hq_nvfp4_block_scale_k(bamax, m, kind), and the code's
   encode multiplier *enc. */
template <int OPT>
__device__ __forceinline__ uint8_t block_code(float bamax, const Head<OPT> &h, float *enc) {
  const uint8_t sf = (uint8_t)h.code(hq_mul_rn(bamax, h.m));
  *enc = h.enc(sf);
  return sf;
}

/* Whether a block takes the fast form: no NaN among its values and every |v * enc| <=
   RN(bamax * enc) < 7 (rounding is monotonic; enc >= 0), so hq_e2m1_biased_bits_lt7 applies,
   and with stochastic rounding hq_e2m1_sr_biased_lt8 (every ordinary block: the E4M3 scale
   rounding leaves at most 6.4). Otherwise (a NaN, an Inf, a scale code below the block: E4M3
   underflow) the rule itself. */
template <bool SR = false>
__device__ __forceinline__ bool fast_block(float bamax, float enc, int has_nan) {
  return (!SR || kSRFast) && !has_nan && hq_mul_rn(bamax, enc) < 7.0f;
}

/* The fast form of 16 values v(0..15) (a fast_block): the same codes as hq_nvfp4_quantize
   with two FP32 adds and one integer min per value (this loop bounds the kernel). Each nibble
   is accumulated as (HQ_E2M1_BIAS_BITS + code) * 16^e (multiply-adds, on the FMA pipe beside
   the min)
   and the biases leave in one subtraction (mod 2^32: code <= 7 never carries into the next
   nibble); the sign bits sgn (x's: enc > 0, or enc = 0 and x * enc = +-0) are added in the
   same three-input add (bit 3 of every nibble is clear: the same as or-ing them). */
template <class V> __device__ __forceinline__ uint2 encode_fast(V v, float enc, uint2 sgn) {
#if HQ_MX_CVT_PAIRS
  /* Blackwell (mx_cvt_cuda.h): the rule's own steps, RN(v * enc) and hq_f32_to_e2m1, the
     convert instruction taking two products at a time (a block here holds no NaN or Inf and
     every |v * enc| < 7); the sign bits come with the conversion, sgn goes unused */
  (void)sgn;
  float p[16];
#pragma unroll
  for (int e = 0; e < 16; e++) p[e] = hq_mul_rn(v(e), enc);
  return make_uint2(hq_cuda_f32x8_to_e2m1(p), hq_cuda_f32x8_to_e2m1(p + 8));
#else
  constexpr uint32_t kBias = HQ_E2M1_BIAS_BITS * 0x11111111u;
  uint32_t acc[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 16; e++)
    acc[e >> 3] += hq_e2m1_biased_bits_lt7(fabsf(hq_mul_rn(v(e), enc))) * (1u << (4 * (e & 7)));
  return make_uint2(acc[0] + sgn.x + (0u - kBias), acc[1] + sgn.y + (0u - kBias));
#endif
}

/* Stochastic rounding's Philox words of a block, from the seed or from its round keys
   (hq_nvfp4_sr_keys; the kernels' QArgs.rk: no key bumped per block): the same bits. */
__device__ __forceinline__ void sr_bits(uint64_t seed, uint64_t offset, uint32_t colwise,
                                        uint64_t block, uint32_t out[4]) {
  hq_nvfp4_sr_bits(seed, offset, colwise, block, out);
}
__device__ __forceinline__ void sr_bits(const uint32_t *rk, uint64_t offset, uint32_t colwise,
                                        uint64_t block, uint32_t out[4]) {
  hq_nvfp4_sr_bits_rk(rk, offset, colwise, block, out);
}

/* The fast form of stochastic rounding for 16 values v(0..15) (a fast_block): the block's
   Philox words as the rule draws them; per value hq_e2m1_sr_biased_lt8 with f built by one byte
   permute from element e's random byte (hq_nvfp4_sr_byte: byte e % 4 of word e / 4) into bits
   16-23, zeros elsewhere, packed as in encode_fast (the biases leave in one subtraction per
   word, mod 2^32, with the sign bits sgn added in: bit 3 of every nibble is clear). */
template <class V, class Key>
__device__ __forceinline__ uint2 encode_fast_sr(V v, float enc, Key key, uint64_t offset,
                                                uint32_t colwise, uint64_t block, uint2 sgn) {
  constexpr uint32_t kBias = HQ_E2M1_BIAS_BITS * 0x11111111u;
  uint32_t bits[4], acc[2] = {0u, 0u};
  sr_bits(key, offset, colwise, block, bits);
#pragma unroll
  for (int e = 0; e < 16; e++) {
    const float f = hq_bits_f32(__byte_perm(bits[e >> 2], 0u, 0x4044u | (e & 3) << 8));
    /* the signed product: hq_e2m1_sr_biased_lt8 takes |x| as an operand modifier of its
       multiply-add, so no instruction makes |x| (and the SR kernels do not spill) */
    acc[e >> 3] += hq_e2m1_sr_biased_lt8(hq_mul_rn(v(e), enc), f) * (1u << (4 * (e & 7)));
  }
  return make_uint2(acc[0] + sgn.x + (0u - kBias), acc[1] + sgn.y + (0u - kBias));
}

/* The fast form of either rounding. */
template <bool SR, class V, class Key>
__device__ __forceinline__ uint2 encode_fast_any(V v, float enc, Key key, uint64_t offset,
                                                 uint32_t colwise, uint64_t block, uint2 sgn) {
  return SR ? encode_fast_sr(v, enc, key, offset, colwise, block, sgn) : encode_fast(v, enc, sgn);
}

/* The rule for 16 values: hq_nvfp4_quantize, or with SR hq_nvfp4_quantize_sr from the block's
   Philox words (its index `block` in the direction's stored data). */
template <bool SR, class V, class Key>
__device__ __forceinline__ uint2 encode_rule(V v, float enc, Key key, uint64_t offset,
                                             uint32_t colwise, uint64_t block) {
  uint32_t w[2] = {0u, 0u};
  if (SR) {
    uint32_t bits[4];
    sr_bits(key, offset, colwise, block, bits);
#pragma unroll
    for (int e = 0; e < 16; e++)
      w[e >> 3] |= hq_nvfp4_quantize_sr(v(e), enc, hq_nvfp4_sr_byte(bits, e)) << (4 * (e & 7));
  } else {
#pragma unroll
    for (int e = 0; e < 16; e++) w[e >> 3] |= hq_nvfp4_quantize(v(e), enc) << (4 * (e & 7));
  }
  return make_uint2(w[0], w[1]);
}

/* One block of FP32 values: its scale code, and its 8 packed bytes into *out (element 2b in
   the low nibble of byte b), RNE or SR; sgn: the 16 sign bits at their places in the packed
   words (bit 4e + 3 of word e / 8), used by the fast form. */
template <bool SR, int OPT, class Key>
__device__ __forceinline__ uint8_t encode16(const float v[16], float bamax, const Head<OPT> &h,
                                            Key key, uint64_t offset, uint32_t colwise,
                                            uint64_t block, int has_nan, uint2 sgn, uint2 *out) {
  float enc;
  const uint8_t sf = block_code(bamax, h, &enc);
  auto val = [&](int e) { return v[e]; };
  *out = fast_block<SR>(bamax, enc, has_nan)
             ? encode_fast_any<SR>(val, enc, key, offset, colwise, block, sgn)
             : encode_rule<SR>(val, enc, key, offset, colwise, block);
  return sf;
}

/* 16-bit inputs: the words of the tile hold two elements each (sign bits 15 and 31).
   prmt with a selector nibble >= 8 replicates the selected byte's sign bit over the byte, so
   two permutes gather 4 sign masks (0x00 / 0xff bytes): sign_split(a, b, c, d) returns the
   masks of the low halves of a, b, c, d (in bytes 0..3) and of their high halves. */
template <uint32_t kSel> __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "n"(kSel));
  return d;
}
__device__ __forceinline__ uint2 sign_split(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  const uint32_t p = prmt<0xFBD9u>(a, b), q = prmt<0xFBD9u>(c, d); /* [a.lo b.lo a.hi b.hi] */
  return make_uint2(prmt<0x5410u>(p, q), prmt<0x7632u>(p, q));
}
/* One packed word's 8 sign bits from the masks of its even elements (bit 3 of each byte) and
   of its odd elements (bit 7). */
__device__ __forceinline__ uint32_t sign_word(uint32_t even, uint32_t odd) {
  return (even & 0x08080808u) | (odd & 0x80808080u);
}

/* max of two floats with NaN propagated (PTX max.NaN) */
__device__ __forceinline__ float max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

/* The block amax of 16 values, hq_nvfp4_amax(v, 16) (NaN ignored), and whether one of them is
   NaN (the block then takes the reference rules), from one max |v| with NaN *propagated* (PTX
   max.NaN, one instruction per value with the abs folded in): without a NaN that max is the
   NaN-ignoring amax (the max of non-negative values is one of them, whatever the order). */
__device__ __forceinline__ float block_amax16(const float v[16], int *has_nan) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < 16; e++) m = max_nan(m, fabsf(v[e]));
  *has_nan = (hq_f32_bits(m) & 0x7fffffffu) > 0x7f800000u;
  return *has_nan ? hq_nvfp4_amax(v, 16) : m;
}

/* block_2d: the 16x16 tile amax of a thread's blocks, from lanes of one warp with no shared
   memory and no barrier: m is the thread's share (max |x| with NaN ignored, 0 when every element
   is NaN), and the LANES consecutive lanes that hold the tile's other shares (a power of 2, the
   group aligned) take the max of theirs. */
template <int LANES> __device__ __forceinline__ float tile_max(float m) {
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}
/* the same with NaN propagated (max_nan): NaN when a lane of the group holds one */
template <int LANES> __device__ __forceinline__ float tile_max_nan(float m) {
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

/* The quantize kernel's tiles hold the input's own bits (DT's element size): TM rows of TK
   elements; kStagesOf of them (2 or 3), the next tiles copied in while the current one is
   encoded. Two layouts:
   - the TMA tile (kTmaTile: a 16-bit input, every tile shape): the layout the tensor-memory
     accelerator writes with the 128-byte swizzle, TK / 64 boxes of TM rows x 64 elements (TM
     x 128 bytes each, columns 0-63, then 64-127, ...), row r's 16-byte chunk j of a box at
     chunk j ^ (r & 7) of its 128 bytes; 1024-byte aligned, no padding. 16-byte reads of 8
     consecutive rows and 4-byte reads of 16 consecutive rows of a column meet no bank
     conflict, as with the padding below.
   - otherwise (F32 inputs) each row padded by 16 bytes, so that 16-byte reads of 8
     consecutive rows and 2- or 4-byte reads of consecutive columns meet no bank conflict.
   The one-direction kernels' tiles (32 x 256, 128 x 64) come by the TMA too, where it measured
   faster than cp.async (HQ_NVFP4_TMA_ONE_DIR 0: by cp.async into the padded layout, for
   measuring). */
#ifndef HQ_NVFP4_TMA_ONE_DIR
#define HQ_NVFP4_TMA_ONE_DIR 1
#endif
template <int DT, int TK>
constexpr bool kTmaTile = DT != HQ_F32 && (TK == 128 || HQ_NVFP4_TMA_ONE_DIR);
template <int DT, int TK>
constexpr int kRawRowBytes = TK * (DT == HQ_F32 ? 4 : 2) + (kTmaTile<DT, TK> ? 0 : 16);
/* the shared-window address of byte b of tile row r (b a multiple of 2; a 16-byte piece when b
   is a multiple of 16); a TMA tile's box is TM = 8192 / TK rows of 128 bytes (QShape) */
template <int DT, int TK>
__device__ __forceinline__ uint32_t tile_byte(uint32_t tile, int r, int b) {
  if constexpr (kTmaTile<DT, TK>)
    return hq_swz128(tile + (uint32_t)(b >> 7) * (8192u / TK * 128u), r, (b >> 4) & 7, b & 15);
  else
    return tile + (uint32_t)r * kRawRowBytes<DT, TK> + (uint32_t)b;
}
template <int DT, int TM, int TK> struct RawTile {
  static constexpr int kEsz = DT == HQ_F32 ? 4 : 2;
  static constexpr int kRowBytes = kRawRowBytes<DT, TK>;
  static constexpr int kBytes = TM * kRowBytes;
  static constexpr int kChunksPerRow = TK * kEsz / 16;
  static constexpr int kChunks = TM * kChunksPerRow; /* 16-byte chunks per tile */
};

/* Start copying the tile (i0, k0) of x into `tile`; elements outside [M, K] become 0 (K % 16
   == 0: a 16-byte chunk is wholly inside or outside; a tile wholly inside checks nothing).
   A TMA tile with the input's tensor map (tma: tm valid) comes in as TK / 64 2-D boxes that
   thread 0 issues, completing on the mbarrier at `bar` (the TMA writes the zeros outside the
   tensor); every other tile by cp.async, 16 bytes a thread and chunk (the caller waits for its
   group);
   without vec (x not 16-byte aligned) the copy is made here, element by element.
   The 2-D boxes alone measure no faster than cp.async; they came with the third tile buffer
   and the bulk stores of the columnwise bytes, together the fastest measured (kStagesOf,
   store_col_group). */
template <int DT, int TM, int TK>
__device__ __forceinline__ void issue_tile(const void *__restrict__ x, uint32_t M, uint32_t K,
                                           uint32_t i0, uint32_t k0, int vec, uint32_t tile,
                                           int tma, const CUtensorMap *tm, uint32_t bar) {
  using R = RawTile<DT, TM, TK>;
  if constexpr (kTmaTile<DT, TK>) {
    static_assert(TM * TK == 8192 && R::kBytes == 16384,
                  "the TMA tile is TK / 64 boxes of TM rows");
    if (tma) {
      if (threadIdx.x == 0) {
        hq_mbar_expect_tx(bar, (uint32_t)R::kBytes);
#pragma unroll
        for (int b = 0; b < TK / 64; b++)
          hq_tma_load_2d(tile + (uint32_t)b * (TM * 128u), tm, bar, (int)k0 + 64 * b, (int)i0);
      }
      return;
    }
  }
  (void)tma, (void)tm, (void)bar;
  const bool full = tile_full<TM, TK>(M, K, i0, k0);
  constexpr int kPer = 16 / R::kEsz; /* elements per chunk */
  constexpr int kRowsPerPass = kThreads / R::kChunksPerRow;
  /* this thread's first chunk: row i0 + r0 of the tile, element c0 (32-bit factors, one wide
     multiply-add), and the element offset of each further pass */
  const uint32_t r0 = threadIdx.x / R::kChunksPerRow, c0 = (threadIdx.x % R::kChunksPerRow) * kPer;
  const uint8_t *const base = static_cast<const uint8_t *>(x);
  const uint64_t off0 = (uint64_t)(i0 + r0) * K + (k0 + c0);
  const uint64_t pass = (uint64_t)kRowsPerPass * K;
  if (full && vec) { /* the common case: every chunk, no checks, one stride per pass */
    const uint8_t *src = base + off0 * R::kEsz;
#pragma unroll
    for (int s = 0; s < R::kChunks / kThreads; s++)
      hq_cp_async16_at(tile_byte<DT, TK>(tile, r0 + s * kRowsPerPass,
                                         (threadIdx.x % R::kChunksPerRow) * 16),
                       src + s * pass * R::kEsz);
    return;
  }
#pragma unroll
  for (int s = 0; s < R::kChunks / kThreads; s++) {
    const int g = threadIdx.x + kThreads * s, r = g / R::kChunksPerRow, cc = g % R::kChunksPerRow;
    const bool in = full || (i0 + r < M && k0 + cc * kPer < K);
    const uint64_t off = off0 + s * pass;
    const uint32_t dst = tile_byte<DT, TK>(tile, r, cc * 16);
    if (vec) {
      hq_cp_async16_n_at(dst, in ? base + off * R::kEsz : base, in ? 16 : 0);
    } else if (DT == HQ_F32) {
      for (int e = 0; e < kPer; e++)
        hq_sts32(dst + 4 * e, in ? reinterpret_cast<const uint32_t *>(base)[off + e] : 0u);
    } else {
      for (int e = 0; e < kPer; e++)
        hq_sts16(dst + 2 * e, in ? reinterpret_cast<const uint16_t *>(base)[off + e] : 0u);
    }
  }
}

/* Row r's 16 values of tile columns c0..c0+15 (c0 a multiple of 16), as FP32 (exact). */
template <int DT, int TK>
__device__ __forceinline__ void row_group_raw(uint32_t tile, int r, int c0, float v[16]) {
  const uint32_t p = tile_byte<DT, TK>(tile, r, c0 * (DT == HQ_F32 ? 4 : 2));
  if (DT == HQ_F32) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const uint4 f = hq_lds128(p + 16 * q);
      v[4 * q] = hq_bits_f32(f.x);
      v[4 * q + 1] = hq_bits_f32(f.y);
      v[4 * q + 2] = hq_bits_f32(f.z);
      v[4 * q + 3] = hq_bits_f32(f.w);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 2; q++) {
      const uint4 u = hq_lds128(tile_byte<DT, TK>(tile, r, 2 * c0 + 16 * q));
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        v[8 * q + 2 * e] = hq_cuda_hp16_to_f32<DT>(w[e] & 0xffffu);
        v[8 * q + 2 * e + 1] = hq_cuda_hp16_to_f32<DT>(w[e] >> 16);
      }
    }
  }
}

/* 16-bit DT: row r's 16 elements of tile columns c0..c0+15 as 8 words of the input's bits
   (element 2j in the low half of w[j], 2j + 1 in the high half). */
template <int DT, int TK>
__device__ __forceinline__ void row_words(uint32_t tile, int r, int c0, uint32_t w[8]) {
  const uint4 x = hq_lds128(tile_byte<DT, TK>(tile, r, 2 * c0)),
              y = hq_lds128(tile_byte<DT, TK>(tile, r, 2 * c0 + 16));
  w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
  w[4] = y.x, w[5] = y.y, w[6] = y.z, w[7] = y.w;
}

/* 16-bit DT: tile rows r0..r0+15 of columns c and c + 1 (c even), one word per row (column c
   in the low half): a warp reads 128 consecutive bytes of a row, no bank conflict. */
template <int DT, int TK>
__device__ __forceinline__ void colpair_words(uint32_t tile, int r0, int c, uint32_t x[16]) {
  constexpr int kRowBytes = kRawRowBytes<DT, TK>;
  if constexpr (kTmaTile<DT, TK>) {
    /* r0 a multiple of 8: row r0 + e's chunks XOR e & 7 (hq_swz128). The tile is 1024-byte
       aligned and the XOR touches address bits 4-6 only, so the thread's offset p XOR
       (e & 7) << 4 (8 values, made once per tile) plus the tile's base and 128 * e is the
       address: each load takes its base and row as operands, where computing
       (p + 128 e) ^ ((e & 7) << 4) per load would cost two instructions */
    const uint32_t p = tile_byte<DT, TK>(0u, r0, 2 * c);
#pragma unroll
    for (int e = 0; e < 16; e++)
      x[e] = hq_lds32(tile + (p ^ ((uint32_t)(e & 7) << 4)) + 128u * e);
    return;
  }
  const uint32_t p = tile + r0 * kRowBytes + c * 2;
#pragma unroll
  for (int e = 0; e < 16; e++) x[e] = hq_lds32(p + e * kRowBytes);
}

/* Tile rows r0..r0+15 of columns c and c + 1 (c even) as FP32: column c into a, c + 1 into b. */
template <int DT, int TK>
__device__ __forceinline__ void colpair_f32(uint32_t tile, int r0, int c, float a[16],
                                            float b[16]) {
  if (DT == HQ_F32) {
    constexpr int kRowBytes = kRawRowBytes<DT, TK>;
    const uint32_t p = tile + r0 * kRowBytes + c * 4;
#pragma unroll
    for (int e = 0; e < 16; e++) {
      const uint2 f = hq_lds64(p + e * kRowBytes);
      a[e] = hq_bits_f32(f.x);
      b[e] = hq_bits_f32(f.y);
    }
  } else {
    uint32_t x[16];
    colpair_words<DT, TK>(tile, r0, c, x);
#pragma unroll
    for (int e = 0; e < 16; e++) {
      a[e] = hq_cuda_hp16_to_f32<DT>(x[e] & 0xffffu);
      b[e] = hq_cuda_hp16_to_f32<DT>(x[e] >> 16);
    }
  }
}

/* Element e of 16 consecutive row elements held as 8 words (row_words). */
template <int DT> __device__ __forceinline__ float row_word_value(const uint32_t *w, int e) {
  return hq_cuda_hp16_to_f32<DT>(e & 1 ? w[e >> 1] >> 16 : w[e >> 1] & 0xffffu);
}

/* hq_nvfp4_amax of 16 values v(0..15) (NaN ignored): a block holding a NaN. */
template <class V> __device__ __forceinline__ float amax_of(V v) {
  float t[16];
#pragma unroll
  for (int e = 0; e < 16; e++) t[e] = v(e);
  return hq_nvfp4_amax(t, 16);
}

/* The sign bits of 16 values v(0..15) at their places in the two packed words. */
template <class V> __device__ __forceinline__ uint2 signs_of(V v) {
  uint32_t s[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 16; e++) s[e >> 3] |= (hq_f32_bits(v(e)) >> 31) << (4 * (e & 7) + 3);
  return make_uint2(s[0], s[1]);
}

/* Whether a non-negative float (or NaN) is NaN. */
__device__ __forceinline__ int is_nan_abs(float a) { return hq_f32_bits(a) > 0x7f800000u; }

} // namespace

/* QArgs is one type in all three of the module's CUDA translation units: the quantize launches
   for F16 and BF16 sources are compiled in units of their own (nvfp4_f16.cu, nvfp4_bf16.cu, which
   include this file with HQ_NVFP4_TU_DT set), so that the three dtypes' kernels compile in
   parallel; quantize<DT> and rowq<DT> are launch_quantize<DT> and launch_rowq<DT> there. */
namespace hq_nvfp4_cuda {
struct QArgs {
  const void *x;
  int64_t M, K;
  int vec;                 /* x 16-byte aligned */
  int a8;                  /* data buffers 8-byte aligned */
  int a4;                  /* scale buffers 4-byte aligned */
  /* the kernel's tensor maps that were made (the launcher's, kernel parameters): the input's
     (TMA tiles come in by the TMA), the columnwise data's and scales' (a ColGroup goes out by
     bulk tensor stores); the kernel reads them through hq_tma_on */
  int tma, tmc, tmcs;
  uint8_t *rdata, *rscale; /* rowwise copy (NULL: not made) */
  float *ramax;
  uint8_t *cdata, *cscale; /* columnwise copy (NULL: not made) */
  float *camax;
  const float *given; /* the caller's amax[2] (device memory), or NULL: use *ramax / *camax */
  int rht, sr, b2d, swz;
  int kind, global; /* options scale_dtype and global_scale (HQ_NVFP4_SCALE_*, _GLOBAL_*) */
  uint32_t mask;
  uint64_t seed, offset;
  /* a graph replay's random stream (hq_call.offset_dev, ABI 2.6): when offset_dev is set, the
     offset is hq_rng_offset(*offset_dev, role_key, role_count), made by the kernel (q_offset) */
  const uint64_t *offset_dev;
  uint64_t role_key, role_count;
  /* the seed's Philox round keys (hq_nvfp4_sr_keys), made once by the launcher, which the
     kernels' rounds read as uniform operands: no key is bumped per block */
  uint32_t rk[20];
  /* the launcher's 32-bit pitches (M, K < 2^31: the kernels read M and K's low words),
     kernel parameters so that no tile recomputes them: the data rows' K / 2 and M / 2, the
     scale rows' hq_nvfp4_scale_cols(K) and (M) */
  uint32_t rld, cld, rsc, csc;
  /* rowq_kernel (global_scale = row, the rowwise copy alone): stored rows per slab */
  uint32_t rq_rows;
  /* a per-tensor quantize whose call brought no amax: the launcher makes the global amaxes into
     *ramax / *camax (the small kernel's own cluster; or the amax pass, after which it is
     cleared for the quantize that follows) */
  int own;
};
template <int DT> int quantize(const hq_call *call, const QArgs &a);
template <int DT> int rowq(const hq_call *call, const QArgs &a);
template <> int quantize<HQ_F16>(const hq_call *call, const QArgs &a);
template <> int quantize<HQ_BF16>(const hq_call *call, const QArgs &a);
template <> int rowq<HQ_F16>(const hq_call *call, const QArgs &a);
template <> int rowq<HQ_BF16>(const hq_call *call, const QArgs &a);
} // namespace hq_nvfp4_cuda

namespace {
using hq_nvfp4_cuda::QArgs;

/* The call's random-stream offset, once per thread at a kernel's start: from the step a graph
   replay reads on the device (the host set it before the replay), else the host's; 0 without
   stochastic rounding (nothing draws). */
template <bool SR> __device__ __forceinline__ uint64_t q_offset(const QArgs &a) {
  if (!SR) return 0;
  return a.offset_dev ? hq_rng_offset(*a.offset_dev, a.role_key, a.role_count) : a.offset;
}

__device__ __forceinline__ void store8(uint8_t *p, uint2 v, int a8) {
  if (a8) {
    *reinterpret_cast<uint2 *>(p) = v;
  } else {
    for (int b = 0; b < 4; b++) p[b] = (uint8_t)(v.x >> (8 * b));
    for (int b = 0; b < 4; b++) p[4 + b] = (uint8_t)(v.y >> (8 * b));
  }
}

/* A staged word of 4 scale bytes (entries b..b+3 of scale row r, b a multiple of 4: 4
   consecutive bytes in both layouts) to its place; byte by byte when the buffer is not 4-byte
   aligned, then only the logical entries (< n; the padding was zeroed). */
__device__ __forceinline__ void store_scale_word(uint8_t *scale, int64_t r, int64_t b, int64_t cols,
                                                 int swz, int a4, uint32_t w) {
  const int64_t off = hq_nvfp4_scale_offset(r, b, cols, swz);
  if (a4) {
    *reinterpret_cast<uint32_t *>(scale + off) = w;
  } else {
    for (int j = 0; j < 4 && b + j < cols / 16; j++) scale[off + j] = (uint8_t)(w >> (8 * j));
  }
}

/* A staged scale word w (entries b..b+3 of scale row r of a direction with `rows` scale rows
   of n / 16 entries, ld bytes apart when compact): one 4-byte store when the tile or group is
   wholly inside and the buffer aligned and compact, else store_scale_word when the word's row
   and first entry are logical ones. */
__device__ __forceinline__ void put_scale_word(const QArgs &a, uint8_t *scale, uint32_t ld,
                                               uint32_t rows, uint32_t n, uint32_t r, uint32_t b,
                                               bool full, uint32_t w) {
  if (__builtin_expect(full && a.a4 && !a.swz, 1)) /* the fall-through, as in store_lines */
    *reinterpret_cast<uint32_t *>(scale + ((uint64_t)r * ld + b)) = w;
  else if (r < rows && b < n / 16)
    store_scale_word(scale, r, b, n, a.swz, a.a4, w);
}

/* RN_bf16 of two FP32 values, packed (lo in the low half): the convert instruction, the bits
   of hq_nvfp4_bf16_round for every value that is not NaN. */
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

/* hq_nvfp4_rht16 of one 16-group, in fewer instructions and with the same bits (the rule's
   steps in nvfp4_rules.h; NaN outputs are not defined by it): v holds the group after steps 0
   and 1 (the caller rounds and flips the signs the cheap way for its input); the butterfly
   stages in their order, RN(v * 0.25), and step 4's RN_bf16 through the convert instruction on
   pairs. The results come back packed, element 2j in the low half of y[j] (the layout of
   row_words, so the rowwise packed amax and sign permutes apply). kScale false leaves out the
   RN(v * 0.25): the results are then RN_bf16(v), four times the rule's wherever v * 0.25 is a
   normal FP32 value (scaling by a power of 2 commutes with both roundings there); the quantize
   kernel's common path folds the 0.25 into its multipliers (block_heads2). */
template <bool kScale = true>
__device__ __forceinline__ void rht16_tail(float v[16], uint32_t y[8]) {
#pragma unroll
  for (int h = 1; h < 16; h <<= 1)
#pragma unroll
    for (int i = 0; i < 16; i++)
      if (!(i & h)) {
        const float p = v[i], q = v[i + h];
        v[i] = __fadd_rn(p, q);
        v[i + h] = __fsub_rn(p, q);
      }
#pragma unroll
  for (int j = 0; j < 8; j++)
    y[j] = kScale ? bf16x2_rn(__fmul_rn(v[2 * j], 0.25f), __fmul_rn(v[2 * j + 1], 0.25f))
                  : bf16x2_rn(v[2 * j], v[2 * j + 1]);
}

/* Row e's sign-flip word of the RHT, held in shared memory or registers for the transform's
   head (rht16_head): 0 where bit e of the sign mask is clear, else the sign bit of every element
   of a packed F16 word (0x80008000), or the FP32 sign bit alone (0x80000000), which a BF16
   element gets in the instruction that widens it, and which F32 values take as they are. */
template <int DT> __device__ __forceinline__ uint32_t flip_word(uint32_t mask, int e) {
  return ((mask >> e) & 1u) ? (DT == HQ_F16 ? 0x80008000u : 0x80000000u) : 0u;
}

/* Steps 0 and 1 of the RHT on FP32 values f of a DT input (flip[e]: row e's flip_word): the
   flip is exact and commutes with RN; a BF16 value is its own RN_bf16, F16 and F32 values go
   through the convert (pairs). */
template <int DT>
__device__ __forceinline__ void rht16_head_f32(const float *f, const uint32_t *flip, float v[16]) {
#pragma unroll
  for (int e = 0; e < 16; e++) v[e] = hq_bits_f32(hq_f32_bits(f[e]) ^ (flip[e] & 0x80000000u));
  if (DT != HQ_BF16) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint32_t y = bf16x2_rn(v[2 * j], v[2 * j + 1]);
      v[2 * j] = hq_bits_f32(y << 16);
      v[2 * j + 1] = hq_bits_f32(y & 0xffff0000u);
    }
  }
}

/* The same for column h (0: c, 1: c + 1) of a column pair's 16 rows: from the raw words x of a
   16-bit input, or the FP32 values f of an F32 one. A BF16 element is widened and flipped in
   one instruction: the high half as (x & 0xffff0000) ^ flip, the low half as x * 2^16 + flip
   (mod 2^32: adding the sign bit flips it), where widening, then flipping took two for the
   low halves and the packed flip one per word; F16 flips both halves of the word at once. */
template <int DT>
__device__ __forceinline__ void rht16_head(const uint32_t *x, const float *f, const uint32_t *flip,
                                           int h, float v[16]) {
  if (DT == HQ_F32) {
    rht16_head_f32<DT>(f, flip, v);
  } else if (DT == HQ_BF16) {
#pragma unroll
    for (int e = 0; e < 16; e++)
      v[e] = hq_bits_f32(h ? (x[e] & 0xffff0000u) ^ flip[e] : x[e] * 65536u + flip[e]);
  } else {
    float g[16];
#pragma unroll
    for (int e = 0; e < 16; e++) {
      const uint32_t w = x[e] ^ flip[e];
      g[e] = hq_cuda_hp16_to_f32<DT>(h ? w >> 16 : w & 0xffffu);
    }
    const uint32_t none[16] = {0u};
    rht16_head_f32<DT>(g, none, v);
  }
}

/* The block amax of 16 values of a 16-bit dtype DT packed as 8 words, two per word in element
   order (NaN propagated, as hq_cuda_lane_abs / is_nan_abs read it). */
template <int DT = HQ_BF16> __device__ __forceinline__ float packed16_amax(const uint32_t y[8]) {
  const uint32_t mm = hq_cuda_absmax_tree<DT, 8, true>(y);
  return hq_cuda_lane_abs<DT>(hq_cuda_absmax2<DT, true>(mm, prmt<0x1032u>(mm, mm)), 0);
}

/* The small-tensor (one cluster) form of the RHT amax pass: 16 x 1 patches on CTAs of 512
   threads, so that a thread transforms one column where the large form's transforms four; at
   that size the pass lasts as long as one thread's chain of dependent instructions (the grid
   fills 8 of the SMs), which the narrower patch shortens. 2^17 elements are 8192 patches, two
   a thread. */
constexpr int kAmaxClThreads = 512;

/* The RHT amax pass: max |x| and the columnwise amax of the transformed 16-groups (the
   transform through rht16_head / rht16_tail, the rule's bits), from registers: a thread takes
   16 rows x 4 columns (M % 16 == 0 and K % 16 == 0, the format's shape rule, so patches tile the
   tensor exactly), 16 loads of 8 bytes (16-byte ones for f32) in flight, consecutive threads on
   consecutive column quads (a warp reads 256- or 512-byte row segments), no shared tile and no
   barrier; resident CTAs loop over the patches, one atomicMax per CTA and target. CL, one
   cluster: 16 x 1 patches (kAmaxClThreads), 16 element loads in flight, a warp on 32
   consecutive columns. The walk goes backwards (patch g of it is patch npatch - 1 - g), as the
   flat pass does (amax_cuda.h), so that the L2 cache holds the tensor's head when the quantize
   kernel starts reading it.
   amax_patches is its per-thread part -- patches first, first + stride, ... (PW: the patch's
   columns, 1 or 4), maxed into mx (max |x|) and, where a.t is set, into mt (the transformed
   columns' amax, as bits) -- shared with the small quantize that makes its own global amaxes
   (quantize_kernel's CA); amax_kernel adds the CTAs' and the cluster's endings. */
template <int DT, int PW>
__device__ __forceinline__ void amax_patches(const AmaxArgs &a, int64_t first, int64_t stride,
                                             float &mx, uint32_t &mt) {
  constexpr int kEsz = DT == HQ_F32 ? 4 : 2;
  const int64_t K = a.K, nq = K / PW, npatch = (a.M / 16) * nq;
  uint32_t fl[16];
#pragma unroll
  for (int e = 0; e < 16; e++) fl[e] = flip_word<DT>(a.mask, e);
  for (int64_t g = first; g < npatch; g += stride) {
    const int64_t gb = HQ_AMAX_FORWARD ? g : npatch - 1 - g; /* backwards */
    const int64_t i = (gb / nq) * 16, k = (gb % nq) * PW;
    const uint8_t *p = static_cast<const uint8_t *>(a.x) + (i * K + k) * kEsz;
    /* column pairs (k, k + 1) and (k + 2, k + 3): raw words (16-bit) or FP32 values; PW 1:
       column k alone, a 16-bit element in its word's high half */
    uint32_t w[2][16];
    float f[4][16];
#pragma unroll
    for (int e = 0; e < 16; e++) {
      const uint8_t *q = p + e * K * kEsz;
      if (PW == 1 && DT == HQ_F32) {
        f[0][e] = *reinterpret_cast<const float *>(q);
        mx = fmaxf(mx, fabsf(f[0][e]));
      } else if (PW == 1) {
        const uint16_t s = *reinterpret_cast<const uint16_t *>(q);
        w[0][e] = (uint32_t)s << 16;
        mx = fmaxf(mx, fabsf(hq_cuda_hp16_to_f32<DT>(s)));
      } else if (DT == HQ_F32) {
        float4 v;
        if (a.vec) {
          v = *reinterpret_cast<const float4 *>(q);
        } else {
          const float *s = reinterpret_cast<const float *>(q);
          v = make_float4(s[0], s[1], s[2], s[3]);
        }
        f[0][e] = v.x, f[1][e] = v.y, f[2][e] = v.z, f[3][e] = v.w;
        mx = fmaxf(fmaxf(mx, fabsf(v.x)), fmaxf(fabsf(v.y), fmaxf(fabsf(v.z), fabsf(v.w))));
      } else {
        if (a.vec) {
          const uint2 v = *reinterpret_cast<const uint2 *>(q);
          w[0][e] = v.x, w[1][e] = v.y;
        } else {
          const uint16_t *s = reinterpret_cast<const uint16_t *>(q);
          w[0][e] = s[0] | (uint32_t)s[1] << 16, w[1][e] = s[2] | (uint32_t)s[3] << 16;
        }
#pragma unroll
        for (int h = 0; h < 4; h++)
          mx = fmaxf(mx, fabsf(hq_cuda_hp16_to_f32<DT>(h & 1 ? w[h >> 1][e] >> 16
                                                           : w[h >> 1][e] & 0xffffu)));
      }
    }
    if (!a.t) continue;
#pragma unroll
    for (int c = 0; c < PW; c++) {
      float v[16];
      uint32_t y[8];
      rht16_head<DT>(w[c >> 1], f[c], fl, PW == 1 || (c & 1), v);
      rht16_tail(v, y);
      const float ba = packed16_amax(y);
      if (!is_nan_abs(ba)) {
        mt = max(mt, hq_f32_bits(ba));
      } else { /* NaN ignored */
        for (int e = 0; e < 16; e++)
          mt = max(mt, hq_abs_bits_nonan(row_word_value<HQ_BF16>(y, e)));
      }
    }
  }
}

template <int DT, bool CL>
__global__ void __launch_bounds__(CL ? kAmaxClThreads : kThreads) amax_kernel(AmaxArgs a) {
  constexpr int kT = CL ? kAmaxClThreads : kThreads;
  __shared__ HqClusterBox box;
  if (CL) hq_cuda_cluster_open(&box, cooperative_groups::this_cluster().block_rank() == 0);
  float mx = 0.0f; /* max |x|: fmaxf drops NaN (IEEE maxNum) */
  uint32_t mt = 0;
  amax_patches<DT, CL ? 1 : 4>(a, blockIdx.x * (int64_t)kT + threadIdx.x, (int64_t)gridDim.x * kT,
                               mx, mt);
  if (CL) { /* one cluster: the first CTA stores each maximum (amax_cuda.h) */
    float m1 = __uint_as_float(mt);
    if (hq_cuda_cluster_max_first<kT>(mx, m1, &box)) {
      if (a.x0) *a.x0 = mx;
      if (a.x1) *a.x1 = mx;
      if (a.t) *a.t = m1;
    }
    return;
  }
  /* one atomic per CTA and target: the pass's CTAs are the resident ones, a few hundred */
  if (a.x0 || a.x1) hq_cuda_cta_atomic_max(hq_f32_bits(mx), a.x0, a.x1);
  if (a.t) {
    __syncthreads(); /* hq_cuda_cta_atomic_max's shared words are free again */
    hq_cuda_cta_atomic_max(mt, a.t, NULL);
  }
}

/* The sign words of two blocks (the fast form's sgn). */
struct Signs2 {
  uint2 s[2];
};

/* The sign words of two blocks of 16 values of a 16-bit dtype, each packed as 8 words two per
   word in element order (a row's raw words, or the RHT's packed BF16 results). */
__device__ __forceinline__ Signs2 row_signs2(const uint32_t a[8], const uint32_t b[8]) {
  const uint2 s0 = sign_split(a[0], a[1], a[2], a[3]), s1 = sign_split(a[4], a[5], a[6], a[7]);
  const uint2 s2 = sign_split(b[0], b[1], b[2], b[3]), s3 = sign_split(b[4], b[5], b[6], b[7]);
  return Signs2{{make_uint2(sign_word(s0.x, s0.y), sign_word(s1.x, s1.y)),
                 make_uint2(sign_word(s2.x, s2.y), sign_word(s3.x, s3.y))}};
}

/* The heads of two packed blocks on the common path: their scale codes (block 0's in bits 0-7,
   block 1's in bits 8-15) and encode multipliers enc[0..1] from their amaxes ba0, ba1 (max |v|
   with NaN propagated: NaN marks a block holding one), or with block_2d from their 16x16 tile
   amaxes t0, t1 (read before, NaN ignored); q[j], whether block j takes the fast form:
   q[j] < 7 when it does (q[j] = RN(bamax * enc) + 0 * ba_j, NaN for a block holding a NaN or an
   Inf), so that one max over a thread's blocks tells whether any needs redo_blocks (which then
   makes it by the rule, its scale code included) and the common path spends nothing on a mask.
   Both E4M3 codes come from one convert instruction (hq_nvfp4_block_scale's bits, as
   block_code) without the FP8 NaN rule: a NaN product makes a NaN code, whose multiplier
   (FLT_MAX) keeps the block off the fast form, so that code is never kept (UE5M3 codes come
   from Head::code: its NaN code 0xFF has the multiplier FLT_MAX too). h0, h1: the blocks'
   Heads (the same one but for the two columns of global_scale = row).
   kFold (the columnwise rht blocks, from rht16_tail<false>): ba0, ba1 are the amaxes of the
   unscaled results, four times the rule's, and m is the direction's m * 0.25 (exact), so the
   products and codes are the rule's; enc comes back times 0.25 (exact: enc >= 2^-124 for every
   block the fast form takes), so RN(value * enc) of an unscaled value is the rule's for every
   element whose v * 0.25 is normal. The others (|v * 0.25| < 2^-126) encode to a signed zero
   both ways as long as the block's amax is not tiny: a block whose unscaled amax is neither 0
   nor in [2^-100, 2^120) goes to redo_blocks (q = NaN), which takes the rule's own steps. */
template <bool kFold = false, int OPT>
__device__ __forceinline__ uint32_t block_heads2(float ba0, float ba1, bool b2d, float t0,
                                                 float t1, const Head<OPT> &h0,
                                                 const Head<OPT> &h1, float enc[2], float q[2]) {
  const float a0 = b2d ? t0 : ba0, a1 = b2d ? t1 : ba1;
  const float p0 = hq_mul_rn(a0, h0.m), p1 = hq_mul_rn(a1, h1.m);
  uint32_t sf;
  if (OPT && h0.kind == HQ_NVFP4_SCALE_UE5M3) { /* UE5M3 (one kind per kernel launch) */
    sf = h0.code(p0) | h1.code(p1) << 8;
  } else {
#if HQ_FP8_HW_CVT
    unsigned short h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(p1), "f"(p0));
    sf = h;
#else
    sf = hq_cuda_f32_to_fp8<HQ_E4M3>(p0) | hq_cuda_f32_to_fp8<HQ_E4M3>(p1) << 8;
#endif
  }
  enc[0] = h0.enc(sf & 0xffu);
  enc[1] = h1.enc(sf >> 8);
  if (kFold) {
    enc[0] = hq_mul_rn(enc[0], 0.25f);
    enc[1] = hq_mul_rn(enc[1], 0.25f);
  }
  /* fast_block's test: RN(a * enc) < 7 and no NaN in the block (0 * ba is 0 for a finite ba,
     NaN for a NaN or an Inf one, whose block is never fast: its RN(a * enc) >= 7 or NaN) */
  q[0] = __fmaf_rn(ba0, 0.0f, hq_mul_rn(a0, enc[0]));
  q[1] = __fmaf_rn(ba1, 0.0f, hq_mul_rn(a1, enc[1]));
  if (kFold) { /* bits - 1 wraps for 0: [2^-100, 2^120) and 0 pass */
    constexpr uint32_t kLo = 0x0d800000u, kHi = 0x7b800000u; /* 2^-100, 2^120 */
    const uint32_t b0 = hq_f32_bits(ba0), b1 = hq_f32_bits(ba1);
    if (b0 - 1u < kLo - 1u || b0 >= kHi) q[0] = __int_as_float(0x7fffffff);
    if (b1 - 1u < kLo - 1u || b1 >= kHi) q[1] = __int_as_float(0x7fffffff);
  }
  return sf;
}

/* The packed bytes and the scale bytes of one tile, staged as each block is encoded (no
   registers held across the two directions), then stored coalesced. c[rb][col]: column col's row
   block rb (a thread writes its two columns' entries as one 16-byte store); rsw / csw: the scale
   words, TK / 64 per tile row and TM / 64 per tile column (QShape). */
template <int DIRS, bool G = false> struct Staged {
  using S = QShape<DIRS>;
  static constexpr int kC = G ? 1 : S::TM / 16; /* G: the columnwise bytes go to a ColGroup */
  uint2 r[S::TM * S::RS];
  __align__(16) uint2 c[kC][G ? 1 : S::CS];
  uint32_t rsw[S::TM * S::TK / 64], csw[G ? 1 : S::TM * S::TK / 64];
};

/* Both directions: the columnwise bytes of a group of kColGroup tiles stacked along M (the
   CTAs walk groups; TileWalk), staged as each tile is encoded and stored once the group is
   done, so that each column's piece of the group is kColGroup * 32 data bytes (a 128-byte line
   for 4) and kColGroup * 4 scale bytes, where per tile they were 32 and 4: 4x fewer L2 write
   requests for the columnwise copy. Two of them (dynamic shared memory, after the tiles): a
   group is encoded into one while the other, finished, is stored a part (128 / kColGroup
   columns) per tile. Row block g of a column is tile g / 4's row block g % 4 (the layout:
   struct ColGroup below); csw: column col's scale bytes, word col * kColGroup + tile.
   Why: the small stores, not their bytes, cost the time (each column's 32 data bytes and 4
   scale bytes per tile a write request of its own), and a group of 4 makes a column's piece
   one 128-byte line. A part per tile, while the next group is encoded, keeps the stores spread
   over the group's tiles; groups of 8 would leave one CTA per SM. Stochastic rounding keeps
   per-tile staging (kGroupC). */
#ifndef HQ_NVFP4_COL_GROUP
#define HQ_NVFP4_COL_GROUP 4
#endif
constexpr int kColGroup = HQ_NVFP4_COL_GROUP;
/* A group's columnwise bytes: column col's kColGroup * RB data words (its 128-byte line, row
   block g's word at byte 8g) in row col of c, each row's 16-byte chunk j at chunk j ^ (col & 7)
   (the 128-byte swizzle a bulk tensor store reads, so that 8 consecutive columns' chunk j meet
   no bank conflict); then column col's kColGroup scale words (its 16 bytes) at csw[kColGroup *
   col]. 1024-byte aligned (the swizzle's alignment, kAlign1K). */
struct ColGroup {
  using S = QShape<3>;                        /* the both-directions tile */
  static constexpr int RB = S::TM / 16;       /* row blocks per tile */
  static constexpr int NC = S::TK;            /* columns */
  static constexpr int PART = NC / kColGroup; /* columns stored per tile (store_part) */
  static constexpr int kLine = kColGroup * RB * 8; /* a column's data bytes */
  __align__(16) uint2 c[NC][kColGroup * RB];
  uint32_t csw[NC * kColGroup];
};
static_assert(ColGroup::kLine == 128 && sizeof(ColGroup) % 1024 == 0,
              "HQ_NVFP4_COL_GROUP must be 4: a column's data are one swizzled 128-byte row and "
              "the ColGroups keep 1024-byte alignment");
/* the shared-window address of row block g's word of column col in the ColGroup at cg */
__device__ __forceinline__ uint32_t colgroup_word(uint32_t cg, int g, int col) {
  return hq_swz128(cg + (uint32_t)offsetof(ColGroup, c), col, g >> 1, (g & 1) << 3);
}
/* whether a kernel stages its columnwise bytes by groups: both directions without stochastic
   rounding, whose kernel is bound by its instructions rather than its stores (grouping made it
   slower), on a tensor of at least a wave of groups (UG: fewer, each tile its own CTA: a group
   per CTA would leave most SMs idle and take four tiles' time) */
template <int DIRS, bool SR, bool UG = false>
constexpr bool kGroupC = DIRS == 3 && !SR && !UG && kColGroup > 1;
/* whether the kernel aligns its tiles (and the ColGroups after them) to 1024 bytes, the
   128-byte swizzle's alignment, in the 1024 bytes of dynamic shared memory the launcher adds */
template <int DT, int DIRS, bool SR, bool UG = false>
constexpr bool kAlign1K = kTmaTile<DT, QShape<DIRS>::TK> || kGroupC<DIRS, SR, UG>;

/* A staging buffer's shared-window address (hq_smem_addr: taken once, then offsets added) and
   the addresses of its parts: packed word i of the rowwise staging, word (rb, col) of the
   columnwise one, byte b of the rowwise and of the columnwise scale words. */
template <int DIRS, bool G = false> struct StagedAt {
  using T = Staged<DIRS, G>;
  uint32_t base;
  uint32_t cg;   /* G: the group's ColGroup */
  unsigned slot; /* G: the tile's place in its group */
  __device__ __forceinline__ uint32_t r(int i) const {
    return base + (uint32_t)offsetof(T, r) + 8u * i;
  }
  __device__ __forceinline__ uint32_t c(int rb, int col) const {
    if (G) return colgroup_word(cg, (int)slot * ColGroup::RB + rb, col);
    return base + (uint32_t)offsetof(T, c) + 8u * (rb * QShape<DIRS>::CS + col);
  }
  __device__ __forceinline__ uint32_t rs(int b) const {
    return base + (uint32_t)offsetof(T, rsw) + b;
  }
  /* byte b = col * (TM / 16) + rb of the tile's columnwise scales */
  __device__ __forceinline__ uint32_t cs(int b) const {
    if (G)
      return cg + (uint32_t)offsetof(ColGroup, csw) + (b >> 2) * 4 * kColGroup + slot * 4 +
             (b & 3);
    return base + (uint32_t)offsetof(T, csw) + b;
  }
};

/* The blocks of a thread's share of a tile that the fast form does not take (a NaN, an Inf, a
   scale code that underflows its block: rare), redone by the rule from the shared tile over
   their staged bytes. Bit j of `redo`: rowwise block 2p + j of row r (j = 0, 1), columnwise
   column 2q + j - 2 of row block rb (j = 2, 3), the thread's share as the kernel assigns it.
   Each block: its values (through the RHT for a columnwise block with rht), hq_nvfp4_amax (NaN
   ignored) or with block_2d the 16x16 tile amax (ta0, ta1: rowwise blocks j = 0, 1; ta2: the
   columnwise blocks), the scale code (hr: the rowwise blocks' Head, hc0 / hc1: columns 2q and
   2q + 1's), and hq_nvfp4_quantize (_sr) of every element. Out of line: the common path stays
   small and free of branches. Each kernel its own copy (CA, its caller's): ptxas fits one
   out-of-line function's registers to all of its callers, and the small kernel's sharing it
   cost the others registers and spills. */
template <int DT, bool RHT, bool SR, int DIRS, bool G, int OPT, bool CA>
__device__ __noinline__ void redo_blocks(unsigned redo, uint32_t sm, float ta0, float ta1,
                                         float ta2, const uint32_t *flip, Head<OPT> hr,
                                         Head<OPT> hc0, Head<OPT> hc1, int64_t M, int64_t K,
                                         int64_t i0, int64_t k0, int b2d, uint64_t seed,
                                         uint64_t offset, StagedAt<DIRS, G> st) {
  constexpr int TM = QShape<DIRS>::TM, TK = QShape<DIRS>::TK, RS = QShape<DIRS>::RS;
  const int t = threadIdx.x, r = t % TM, p = t / TM, q = t % (TK / 2), rb = t / (TK / 2);
  for (int j = 0; j < 4; j++) {
    if (!((redo >> j) & 1u)) continue;
    float v[16], enc;
    if (j < 2) {
      row_group_raw<DT, TK>(sm, r, 32 * p + 16 * j, v);
      const float ba = b2d ? (j ? ta1 : ta0) : hq_nvfp4_amax(v, 16);
      const uint8_t sf = block_code(ba, hr, &enc);
      const uint64_t blk = (uint64_t)((i0 + r) * (K >> 4) + (k0 >> 4) + 2 * p + j);
      hq_sts64(st.r(r * RS + 2 * p + j),
               encode_rule<SR>([&](int e) { return v[e]; }, enc, seed, offset, 0u, blk));
      hq_sts8(st.rs(r * (TK / 16) + 2 * p + j), sf);
    } else {
      const int c = 2 * q + (j - 2);
      float f[2][16];
      colpair_f32<DT, TK>(sm, 16 * rb, 2 * q, f[0], f[1]);
      if (RHT) {
        uint32_t y[8];
        rht16_head_f32<DT>(f[j - 2], flip, v);
        rht16_tail(v, y);
        for (int e = 0; e < 16; e++) v[e] = row_word_value<HQ_BF16>(y, e);
      } else {
        for (int e = 0; e < 16; e++) v[e] = f[j - 2][e];
      }
      const float ba = b2d ? ta2 : hq_nvfp4_amax(v, 16);
      const uint8_t sf = block_code(ba, j == 2 ? hc0 : hc1, &enc);
      const uint64_t blk = (uint64_t)((k0 + c) * (M >> 4) + ((i0 >> 4) + rb));
      hq_sts64(st.c(rb, c),
               encode_rule<SR>([&](int e) { return v[e]; }, enc, seed, offset, 1u, blk));
      hq_sts8(st.cs(c * (TM / 16) + rb), sf);
    }
  }
}

/* kLines output lines of kWords 8-byte words each, line l at buf + (l0 + l) * ld + c0 (32-bit
   factors, one wide multiply-add): word w of line l is val(l, w), stored where in(l, w) (a
   partial tile) -- a tile wholly inside the tensor with an 8-byte aligned buffer (full && a8)
   checks nothing and steps one stride per pass. Coalesced: consecutive threads take consecutive
   words. (8-byte stores: 16-byte ones, half the store instructions, were no faster.) */
template <int kLines, int kWords, class V, class In>
__device__ __forceinline__ void store_lines(uint8_t *buf, uint32_t l0, uint32_t c0, uint32_t ld,
                                            bool full, int a8, const V &val, const In &in) {
  const int t = threadIdx.x;
  constexpr int kPass = kThreads / kWords; /* lines per pass */
  uint8_t *const p = buf + ((uint64_t)(l0 + t / kWords) * ld + (c0 + 8 * (t % kWords)));
  const uint64_t pass = (uint64_t)kPass * ld;
  /* expected: the wholly-inside tile's stores then follow on in the code, where the
     instruction fetch of a small call's one pass through it is already heading */
  if (__builtin_expect(full && a8, 1)) {
#pragma unroll
    for (int s = 0; s < kLines / kPass; s++)
      *reinterpret_cast<uint2 *>(p + s * pass) = val(t / kWords + s * kPass, t % kWords);
    return;
  }
#pragma unroll
  for (int s = 0; s < kLines / kPass; s++) {
    const int l = t / kWords + s * kPass, w = t % kWords;
    if (full || in(l, w)) store8(p + s * pass, val(l, w), a8);
  }
}

/* Store a staged tile (i0, k0) to the outputs: coalesced 8-byte stores of the packed bytes and
   4-byte scale words; a tile wholly inside [M, K] with aligned buffers checks nothing. Every
   thread of the CTA calls it. Offsets from 32-bit factors (M, K < 2^31). */
template <int DIRS, bool G>
__device__ __forceinline__ void store_staged(const QArgs &a, StagedAt<DIRS, G> st, uint32_t i0,
                                             uint32_t k0, bool full) {
  using S = QShape<DIRS>;
  const uint32_t M = (uint32_t)a.M, K = (uint32_t)a.K;
  const int t = threadIdx.x;
  if constexpr ((DIRS & 1) != 0) {
    /* row i0 + rr's bytes k0/2 + 8b ..: hq_nvfp4_row_data_index */
    store_lines<S::TM, S::TK / 16>(
        a.rdata, i0, k0 >> 1, a.rld, full, a.a8,
        [&](int rr, int b) { return hq_lds64(st.r(rr * S::RS + b)); },
        [&](int rr, int b) { return i0 + rr < M && k0 + 16 * b < K; });
    constexpr int kW = S::TK / 64; /* scale words per tile row */
    if (t < S::TM * kW) { /* row t/kW's scale entries k0/16 + 4 (t%kW) .. +3 */
      put_scale_word(a, a.rscale, a.rsc, M, K, i0 + t / kW, k0 / 16 + 4 * (t % kW), full,
                     hq_lds32(st.rs(4 * t)));
    }
  }
  if constexpr ((DIRS & 2) != 0 && !G) {
    /* column k0 + cc's bytes i0/2 + 8rb ..: hq_nvfp4_col_data_index */
    store_lines<S::TK, S::TM / 16>(
        a.cdata, k0, i0 >> 1, a.cld, full, a.a8,
        [&](int cc, int rb) { return hq_lds64(st.c(rb, cc)); },
        [&](int cc, int rb) { return i0 + 16 * rb < M && k0 + cc < K; });
    constexpr int kW = S::TM / 64; /* scale words per tile column */
    if (t < S::TK * kW) { /* column k0 + t/kW's scale entries i0/16 + 4 (t%kW) .. +3 */
      put_scale_word(a, a.cscale, a.csc, K, M, k0 + t / kW, i0 / 16 + 4 * (t % kW), full,
                     hq_lds32(st.cs(4 * t)));
    }
  }
}

/* Store columns c0 .. c0 + NC - 1 of a staged group of columnwise tiles (both directions,
   ColGroup at cg): rows g0 .. g0 + kColGroup * 64 - 1, columns k0 + c0 ..; a column's piece
   is one 128-byte line of data and 16 bytes of scales. Every thread of the CTA calls it.
   With the columnwise tensor maps (a.tmc, a.tmcs) thread 0 issues one bulk tensor store per
   ColGroup::PART columns (the maps' box), which the TMA clips at the tensor's edges, as one
   bulk group: the CTA's threads made their writes of the ColGroup visible to it first
   (hq_fence_proxy_async, then a CTA barrier), and thread 0 waits for the group's reads before
   the ColGroup is written again. The bulk stores leave the warps no store instructions to
   issue for the column lines, and measured faster than the threads' stores. Otherwise
   coalesced 8-byte stores of the data and 4-byte scale words; a group wholly inside [M, K]
   with aligned buffers checks nothing, otherwise only what lies inside is stored (the tiles of
   a group at the bottom edge that do not exist were never staged). */
template <int NC = ColGroup::NC>
__device__ __forceinline__ void store_col_group(const QArgs &a, uint32_t cg, uint32_t g0,
                                                uint32_t k0, const CUtensorMap *tmc,
                                                const CUtensorMap *tmcs, int c0 = 0) {
  static_assert(NC % ColGroup::PART == 0, "whole boxes");
  const bool bulk = hq_tma_on(a.tmc), bulk_scales = bulk && hq_tma_on(a.tmcs);
  if (bulk) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int b = 0; b < NC / ColGroup::PART; b++) {
        const int cb = c0 + b * ColGroup::PART;
        hq_tma_store_2d(tmc, (int)(g0 >> 1), (int)k0 + cb,
                        cg + (uint32_t)offsetof(ColGroup, c) + (uint32_t)ColGroup::kLine * cb);
        if (bulk_scales)
          hq_tma_store_2d(tmcs, (int)(g0 >> 4), (int)k0 + cb,
                          cg + (uint32_t)offsetof(ColGroup, csw) + 4u * kColGroup * cb);
      }
      hq_tma_store_commit();
    }
  }
  if (bulk_scales) return;
  const uint32_t M = (uint32_t)a.M, K = (uint32_t)a.K;
  const bool full = g0 + kColGroup * ColGroup::S::TM <= M && k0 + ColGroup::NC <= K;
  if (!bulk)
    store_lines<NC, kColGroup * ColGroup::RB>(
        a.cdata, k0 + c0, g0 >> 1, a.cld, full, a.a8,
        [&](int cc, int g) { return hq_lds64(colgroup_word(cg, g, c0 + cc)); },
        [&](int cc, int g) { return g0 + 16 * g < M && k0 + c0 + cc < K; });
  constexpr int kWords = NC * kColGroup;
#pragma unroll
  for (int s = 0; s < (kWords + kThreads - 1) / kThreads; s++) {
    const int u = threadIdx.x + s * kThreads + c0 * kColGroup; /* column u / kColGroup, tile
                                                                  u % kColGroup */
    if (kWords % kThreads != 0 && u >= (c0 + NC) * kColGroup) break;
    put_scale_word(a, a.cscale, a.csc, K, M, k0 + u / kColGroup, g0 / 16 + 4 * (u % kColGroup),
                   full, hq_lds32(cg + (uint32_t)offsetof(ColGroup, csw) + 4u * u));
  }
}

template <int DT, bool RHT, bool SR, int DIRS, bool B2D, int OPT, bool UG, bool CA>
__global__ void
__launch_bounds__(kThreads, SR ? kMinBlocksSR : DIRS == 3 ? kMinBlocks : kMinBlocks1)
    quantize_kernel(QArgs a, const __grid_constant__ CUtensorMap tm_x,
                    const __grid_constant__ CUtensorMap tm_cdata,
                    const __grid_constant__ CUtensorMap tm_cscale) {
  using S = QShape<DIRS>;
  constexpr int TM = S::TM, TK = S::TK, RS = S::RS;
  constexpr int kStages = kStagesOf<DT, DIRS, SR>;
  extern __shared__ __align__(16) uint8_t tiles[]; /* kStages RawTile<DT, TM, TK> */
  __shared__ float enc_tab[2][256];          /* encode multipliers: rowwise, columnwise */
  /* the packed bytes and the scale bytes, staged as each block is encoded (no registers held
     across the two directions), then stored coalesced (Staged) */
  /* both directions with round to nearest: the columnwise bytes go to ColGroups (kGroupC) */
  constexpr bool kGroup = kGroupC<DIRS, SR, UG>;
  /* CA (one cluster: the launcher's kOwn) and UG (fewer groups than SMs) launch a CTA per tile
     (no groups), so each CTA encodes one tile, and the code that copies a next tile or stores a
     previous one is left out of the kernel: a small call runs each instruction once per SM, and
     its path jumped over that code to targets not yet fetched */
  constexpr bool kOne = CA || UG;
  static_assert(!kOne || !kGroup, "a CTA per tile");
  __shared__ Staged<DIRS, kGroup> staged[2];
  __shared__ __align__(16) uint32_t flip[16];  /* RHT: row e's sign-flip word (flip_word) */
  __shared__ __align__(8) uint64_t full_bar[kStages]; /* TMA tiles: buffer s's copy has landed */
  using R = RawTile<DT, TM, TK>;
  constexpr uint32_t kStagedBytes = sizeof(Staged<DIRS, kGroup>);
  constexpr bool kRow = DIRS & 1, kCol = DIRS & 2;
  /* 16-bit input: the block amaxes from packed maxima of the raw words (two elements per
     instruction) and the sign bits gathered from them by byte permutes */
  constexpr bool kPacked = DT != HQ_F32;
  /* the blocks encoded on the common path with their heads first (no branch until every
     block of the thread's share is encoded): rowwise of a 16-bit input, columnwise of a 16-bit
     input or with rht (the transform's packed BF16 results) */
  constexpr bool kRowP = kRow && kPacked, kColP = kCol && (kPacked || RHT);
  const int64_t M = a.M, K = a.K;
  const uint32_t M32 = (uint32_t)M, K32 = (uint32_t)K;
  const int t = threadIdx.x;
  const uint64_t offset = q_offset<SR>(a);
  /* the scale type (OPT 0: E4M3, a constant) and, OPT 1, global_scale = none (S_enc = 1: no
     amax read or written); OPT 2 (global_scale = row) takes its constants per tile below */
  static_assert(OPT != 2 || (!RHT && !B2D), "global_scale = row goes without rht and block_2d");
  const int kind = OPT ? a.kind : HQ_NVFP4_SCALE_E4M3;
  const bool none = OPT == 1 && a.global == HQ_NVFP4_GLOBAL_NONE;
  /* the directions' Heads: rowwise, columnwise (OPT 2: m and S_dec set per tile) */
  Head<OPT> hr{enc_tab[0], 0.0f, 0.0f, kind}, hc{enc_tab[1], 0.0f, 0.0f, kind};
  /* CA: the kernel is one cluster that makes the global amaxes itself (below); every CTA's
     mailbox is made and its arrival given now, so that the reduction's first push into
     another CTA can wait for that CTA to have started (amax_cuda.h) */
  __shared__ HqClusterBox cbox;
  if constexpr (CA) hq_cuda_cluster_open(&cbox, true);
  if (RHT && t < 16) flip[t] = flip_word<DT>(a.mask, t); /* read after a barrier */
  /* the global amaxes: the cluster's own (CA, below), or what the call brought or the pass
     before this kernel wrote, both loaded before anything is stored (a store to the amax
     buffers between them would order the second load after the first's use) */
  float ga[2] = {0.0f, 0.0f};
  if (!CA && !none) {
    if (kRow && OPT != 2) ga[0] = a.given ? a.given[0] : *a.ramax;
    if (kCol && OPT != 2) ga[1] = a.given ? a.given[1] : *a.camax;
  }
  /* the directions' constants and encode tables; the amax buffers get what the call brought
     or the cluster made */
  auto dir_consts = [&]() {
    if (kRow && OPT != 2) {
      const DirConst d = dir_const_k(ga[0], kind, none);
      hr.m = d.m;
      enc_tab[0][t] = hq_nvfp4_encode_mult_k((uint8_t)t, d.s_dec, kind);
      if ((CA || a.given) && blockIdx.x == 0 && t == 0) *a.ramax = d.amax;
    }
    if (kCol && OPT != 2) {
      const DirConst d = dir_const_k(ga[1], kind, none);
      hc.m = d.m;
      enc_tab[1][t] = hq_nvfp4_encode_mult_k((uint8_t)t, d.s_dec, kind);
      if ((CA || a.given) && blockIdx.x == 0 && t == 0) *a.camax = d.amax;
    }
  };
  /* rht: the columnwise Head with m * 0.25, for the unscaled amaxes (block_heads2), made with
     the constants below, after the first tiles' copies are issued (they need none of them) */
  Head<OPT> hc4 = hc;
  /* block_2d, a kernel of its own (the configuration refuses it with rht or stochastic
     rounding: no code for it in those kernels), so that the plain kernel carries none of its
     code and block_2d none of the plain kernel's branches */
  static_assert(!B2D || (!RHT && !SR), "block_2d goes without rht and stochastic rounding");
  constexpr bool b2d = B2D;
  /* the CTA's tiles, grid-stride (the constants above are made once per CTA), through a ring of
     kStages tile buffers: the copies of the next kStages - 1 tiles are in flight while tile n is
     encoded */
  /* the buffers' shared-window addresses, once (smem_cuda.h); both directions: the two
     ColGroups after the tiles */
  using At = StagedAt<DIRS, kGroup>;
  uint32_t tiles_s = hq_smem_addr(tiles), staged_s = hq_smem_addr(staged);
  /* TMA tiles and ColGroups: the tiles and the ColGroups after them 1024-byte aligned
     (kAlign1K); buffer s's copies complete on full_bar[s], whose phase of
     parity bit s of `parity` is the next to wait for. bulk: the ColGroups go out by bulk
     tensor stores, for F32 inputs too, whose tiles the threads copy (the threads' own stores
     from the swizzled ColGroup are slower than the layout they replaced) */
  constexpr bool kTma = kTmaTile<DT, TK>;
  const bool tma = kTma && hq_tma_on(a.tma), bulk = kGroup && hq_tma_on(a.tmc);
  const uint32_t bar_s = hq_smem_addr(full_bar);
  uint32_t parity = 0;
  static_assert(!kGroup || kStages * R::kBytes % 1024 == 0, "ColGroups 1024-byte aligned");
  if constexpr (kAlign1K<DT, DIRS, SR, UG>) tiles_s = (tiles_s + 1023u) & ~1023u;
  if constexpr (kTma && HQ_TMA_ARCH) {
    if (t < kStages) hq_mbar_init(bar_s + 8u * t, 1);
    hq_mbar_init_fence();
    __syncthreads();
  }
  uint32_t groups_s = tiles_s + kStages * R::kBytes;
  TileWalk<TM, TK, kGroup ? kColGroup : 1> cur(M, K), ahead(M, K); /* ahead: the next to copy */
  /* global_scale = row: the amaxes of the thread's stored rows in a tile (rowwise: row r;
     columnwise: columns c, c + 1; 0 outside the tensor, whose blocks are zeros and are not
     stored), loaded one tile ahead so that their latency hides behind a tile's encoding */
  float ra = 0.0f, ca[2] = {0.0f, 0.0f};
  auto row_amaxes = [&](uint32_t ti0, uint32_t tk0, float &r_, float c_[2]) {
    const uint32_t ri = ti0 + (uint32_t)(t % TM), ck = tk0 + 2u * (uint32_t)(t % (TK / 2));
    if (kRow) r_ = ri < M32 ? a.ramax[ri] : 0.0f;
    if (kCol) {
      c_[0] = ck < K32 ? a.camax[ck] : 0.0f;
      c_[1] = ck + 1 < K32 ? a.camax[ck + 1] : 0.0f;
    }
  };
  if (OPT == 2 && cur.valid()) row_amaxes(cur.i0(), cur.k0(), ra, ca);
  /* OPT 2: the (m, S_dec) of the thread's row and columns, made for the tile row rc_i0 and
     the tile column cc_k0 (origins below 2^31: the first tile makes them) */
  uint32_t rc_i0 = 0xffffffffu, cc_k0 = 0xffffffffu;
  float rc[2] = {0.0f, 0.0f}, cc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  (void)rc_i0, (void)cc_k0, (void)rc, (void)cc; /* read by OPT 2 alone */
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if ((!kOne || s == 0) && ahead.valid())
      issue_tile<DT, TM, TK>(a.x, M32, K32, ahead.i0(), ahead.k0(), a.vec,
                             tiles_s + s * R::kBytes, tma, &tm_x, bar_s + 8u * s);
    hq_cuda_cp_async_commit();
    ahead = ahead.next();
  }
  if constexpr (!CA) {
    /* the constants while the first tiles' copies are in flight */
    dir_consts();
    hc4 = hc;
    hc4.m = hq_mul_rn(hc.m, 0.25f);
  }
  if constexpr (CA) {
    /* the global amaxes while the first tiles' copies are in flight: this CTA's share of the
       RHT pass's 16 x 1 patches (amax_patches; am.t only asks for the transformed columns'),
       maxed over the cluster and taken by every thread; max |x| for the rowwise copy, the
       transformed values' for the columnwise one (the pass's outputs, the same bits) */
    static_assert(RHT && kCol, "the one-cluster form is the RHT pass's; the launcher's kOwn");
    const AmaxArgs am{a.x, a.M, a.K, a.vec, NULL, NULL, a.camax, a.mask};
    float mx = 0.0f;
    uint32_t mt = 0;
    amax_patches<DT, 1>(am, blockIdx.x * (int64_t)kThreads + t, (int64_t)gridDim.x * kThreads,
                        mx, mt);
    float m1 = __uint_as_float(mt);
    hq_cuda_cluster_max2_all<kThreads>(mx, m1, &cbox);
    ga[0] = mx, ga[1] = m1;
    dir_consts();
    hc4 = hc;
    hc4.m = hq_mul_rn(hc.m, 0.25f);
  }
  /* one barrier per tile: tile n - 1's staged bytes are stored after it, while tile n is
     encoded into the other staging buffer; a group's columnwise bytes once its last tile is
     staged, while the next group is encoded into the other ColGroup */
  uint32_t pi0 = 0, pk0 = 0, pg0 = 0; /* tile n - 1, its group's first row */
  bool pfull = false, first = true;
  int sb = 0; /* the staging buffer tile n is encoded into */
  int gb = 0; /* the ColGroup tile n's group is encoded into */
  bool pv = false;           /* a finished group still being stored, part by part */
  int pq = 0;                /* its next part (ColGroup::PART columns) */
  uint32_t qg0 = 0, qk0 = 0; /* its origin */
  /* store part pq of the finished group (in the ColGroup tile n is not encoded into) */
  auto store_part = [&]() {
    store_col_group<ColGroup::PART>(a, groups_s + (gb ^ 1) * (uint32_t)sizeof(ColGroup), qg0,
                                    qk0, &tm_cdata, &tm_cscale, pq * ColGroup::PART);
    pq++;
  };
  for (int buf = 0; cur.valid(); buf = buf + 1 == kStages ? 0 : buf + 1, sb ^= 1) {
    hq_pin(tiles_s);
    hq_pin(staged_s);
    hq_pin(groups_s);
    const uint32_t i0 = cur.i0(), k0 = cur.k0(), g0 = cur.g0();
    const unsigned slot = cur.slot();
    cur = cur.next();
    float nra = 0.0f, nca[2] = {0.0f, 0.0f}; /* OPT 2: the next tile's (row_amaxes) */
    if (OPT == 2 && cur.valid()) row_amaxes(cur.i0(), cur.k0(), nra, nca);
    const bool full = tile_full<TM, TK>(M32, K32, i0, k0);
    if (!tma) hq_cuda_cp_async_wait<kStages - 2>();
    if (bulk && slot == 0) { /* tile n - 1 ended its group (or tile n is the first): its
                                ColGroup's writes made visible to the bulk stores after the
                                barrier, and the stores of the group before it done reading
                                the ColGroup tile n's group is encoded into */
      hq_fence_proxy_async();
      if (t == 0) hq_tma_store_wait_read<0>();
    }
    __syncthreads(); /* tile n is in (cp.async); tile n - 1 is encoded and staged, its buffer
                        free */
    /* the copy of the next tile into the buffer of tile n - 1, first: before any store of this
       pass, so that no store waits ahead of it in the SM's memory pipeline */
    const int nb = buf == 0 ? kStages - 1 : buf - 1;
    if (!kOne && ahead.valid())
      issue_tile<DT, TM, TK>(a.x, M32, K32, ahead.i0(), ahead.k0(), a.vec,
                             tiles_s + nb * R::kBytes, tma, &tm_x, bar_s + 8u * nb);
    hq_cuda_cp_async_commit();
    ahead = ahead.next();
    /* tile n - 1's staged bytes: for both directions stored between tile n's rowwise and
       columnwise blocks below (kMidStore), for one direction here */
    constexpr bool kMidStore = DIRS == 3;
    /* tile n - 1's origin, copied before the update below (the update at the loop's end
       instead, without these copies, was slower for stochastic rounding) */
    const bool spend = !kOne && !first;
    const uint32_t si0 = pi0, sk0 = pk0;
    const bool sfull = pfull;
    if (!kMidStore && spend)
      store_staged(a, At{staged_s + (sb ^ 1) * kStagedBytes, 0u, 0u}, si0, sk0, sfull);
    if (kGroup && !first && slot == 0) { /* tile n - 1 ended its group */
      if (pv && pq < kColGroup) { /* the group before it, after a group of fewer tiles than
                                     parts (not in row-major group order, where those end a
                                     CTA's walk): what is left, before its ColGroup is reused */
        while (pq < kColGroup) store_part();
        if (bulk && t == 0) hq_tma_store_wait_read<0>();
        __syncthreads();
      }
      pv = true, pq = 0, qg0 = pg0, qk0 = pk0;
      gb ^= 1;
    }
    if (kGroup && pv && pq < kColGroup) store_part(); /* one part per tile */
    first = false;
    pi0 = i0, pk0 = k0, pg0 = g0, pfull = full;
    /* tile n's staging buffers and its tile (a TMA tile: when its copy has landed) */
    if (tma) {
      hq_mbar_wait(bar_s + 8u * buf, (parity >> buf) & 1u);
      parity ^= 1u << buf;
    }
    const At st{staged_s + sb * kStagedBytes, groups_s + gb * (uint32_t)sizeof(ColGroup), slot};
    const uint32_t sm = tiles_s + buf * R::kBytes;

    /* rowwise threads: row r, blocks 2p and 2p+1 (columns 32p..32p+31 of the tile) */
    const int r = t % TM, p = t / TM;
    /* columnwise threads: columns c = 2q and c + 1, row block rb (rows 16rb..16rb+15) */
    const int q = t % (TK / 2), rb = t / (TK / 2), c = 2 * q;
    /* the Heads of the thread's blocks: rowwise (row r), columns c and c + 1; with
       global_scale = row each from its stored row's amax (the row amax pass's; 0 outside the
       tensor, whose blocks are zeros and are not stored) */
    Head<OPT> hrt = hr, hct[2] = {RHT ? hc4 : hc, RHT ? hc4 : hc};
    if constexpr (OPT == 2) {
      /* made again only when the tile's rows (columns) are not the previous tile's: the
         tiles of a group (both directions) share their columns */
      if (kRow && i0 != rc_i0) {
        const DirConst d = dir_const_k(ra, kind);
        rc[0] = d.m, rc[1] = d.s_dec, rc_i0 = i0;
      }
      if (kCol && k0 != cc_k0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const DirConst d = dir_const_k(ca[h], kind);
          cc[h][0] = d.m, cc[h][1] = d.s_dec;
        }
        cc_k0 = k0;
      }
      hrt.m = rc[0], hrt.s_dec = rc[1];
#pragma unroll
      for (int h = 0; h < 2; h++) hct[h].m = cc[h][0], hct[h].s_dec = cc[h][1];
      ra = nra, ca[0] = nca[0], ca[1] = nca[1];
    }
    /* SR: the index of row block 2p, of column c's block (c + 1's: + M / 16) */
    const int64_t rblk = (int64_t)(i0 + r) * (K >> 4) + (k0 >> 4) + 2 * p;
    const int64_t cblk = (int64_t)(k0 + c) * (M >> 4) + (i0 >> 4) + rb;
    /* block_2d: the thread's blocks' 16x16 tile amaxes (NaN ignored), each from the thread's
       share and the lanes that hold the rest of its tile (tile_max): a rowwise thread has 16
       elements of each tile, its row's, beside the 15 lanes of the tile's other rows; a
       columnwise thread 32, its two columns', beside the 7 lanes of the tile's other columns */
    float tba[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto tile_amaxes = [&]() {
      if (kRow) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
          uint32_t w[8];
          row_words<DT, TK>(sm, r, 32 * p + 16 * j, w);
          tba[j] = tile_max<16>(hq_cuda_words_amax<DT, 8>(w));
        }
      }
      if (kCol) {
        uint32_t xw[16];
        colpair_words<DT, TK>(sm, 16 * rb, c, xw);
        tba[2] = tba[3] = tile_max<8>(hq_cuda_words_amax<DT, 16>(xw));
      }
    };
    /* Out-of-range elements of a partial tile are zeros in shared memory (issue_tile): their
       blocks encode to scale code 0 and code 0 (the padding entries of a scale word must be
       0) and are not stored, so every block is encoded unconditionally. */
    /* the fast form's test of the thread's packed blocks (block_heads2: < 7 when a block takes
       it): rowwise 0, 1, columnwise 2, 3 */
    float fq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    /* The packed blocks: first every block's values and amax (NaN propagated), then every
       head (scale code, multiplier), then every block's fast form; no branch in between, so
       the dependent chains of the heads overlap each other and the encoding. */
    uint32_t w[16];    /* rowwise: row r's two blocks, 8 words each */
    uint32_t x[16];    /* columnwise, 16-bit input without rht: rows of columns c, c + 1 */
    uint32_t y[2][8];  /* columnwise with rht: the transformed columns, packed BF16 */
    float ba[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kRowP) {
      row_words<DT, TK>(sm, r, 32 * p, w);
      row_words<DT, TK>(sm, r, 32 * p + 16, w + 8);
      ba[0] = packed16_amax<DT>(w);
      ba[1] = packed16_amax<DT>(w + 8);
    }
    if (kColP) {
      if (RHT) {
        uint32_t fl[16];
        float f0[16], f1[16];
        const uint4 *f4 = reinterpret_cast<const uint4 *>(flip);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const uint4 u = f4[e];
          fl[4 * e] = u.x, fl[4 * e + 1] = u.y, fl[4 * e + 2] = u.z, fl[4 * e + 3] = u.w;
        }
        if (DT == HQ_F32)
          colpair_f32<DT, TK>(sm, 16 * rb, c, f0, f1);
        else
          colpair_words<DT, TK>(sm, 16 * rb, c, x);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          float v[16];
          rht16_head<DT>(x, h ? f1 : f0, fl, h, v);
          rht16_tail<false>(v, y[h]); /* the 0.25 folded into hc4 and enc (block_heads2) */
        }
        ba[2] = packed16_amax(y[0]);
        ba[3] = packed16_amax(y[1]);
      } else {
        colpair_words<DT, TK>(sm, 16 * rb, c, x);
        const uint32_t mm = hq_cuda_absmax_tree<DT, 16, true>(x);
        ba[2] = hq_cuda_lane_abs<DT>(mm, 0);
        ba[3] = hq_cuda_lane_abs<DT>(mm, 1);
      }
    }
    if (b2d && kPacked) {
      /* the tile amaxes from the blocks' (NaN propagated), so the tile's words are not read
         and reduced a second time; a tile of the warp holding a NaN takes them again from its
         words, NaN ignored (tile_amaxes) */
      if (kRowP) tba[0] = tile_max_nan<16>(ba[0]), tba[1] = tile_max_nan<16>(ba[1]);
      if (kColP) tba[2] = tba[3] = tile_max_nan<8>(max_nan(ba[2], ba[3]));
      if (__any_sync(0xffffffffu, !(max_nan(max_nan(tba[0], tba[1]), tba[2]) >= 0.0f)))
        tile_amaxes();
    }
    uint32_t rsf = 0, csf = 0; /* the scale codes of the packed blocks, two per word */
    float enc[4];
    if (kRowP) {
      rsf = block_heads2(ba[0], ba[1], b2d, tba[0], tba[1], hrt, hrt, enc, fq);
    }
    if (kColP) {
      csf = block_heads2<RHT>(ba[2], ba[3], b2d, tba[2], tba[3], hct[0], hct[1], enc + 2,
                              fq + 2);
    }
    if (kRowP) {
      auto v0 = [&](int e) { return row_word_value<DT>(w, e); };
      auto v1 = [&](int e) { return row_word_value<DT>(w + 8, e); };
      const Signs2 sg = row_signs2(w, w + 8);
      hq_sts64(st.r(r * RS + 2 * p),
               encode_fast_any<SR>(v0, enc[0], a.rk, offset, 0u, (uint64_t)rblk, sg.s[0]));
      hq_sts64(st.r(r * RS + 2 * p + 1),
               encode_fast_any<SR>(v1, enc[1], a.rk, offset, 0u, (uint64_t)rblk + 1, sg.s[1]));
      hq_sts16(st.rs(r * (TK / 16) + 2 * p), rsf);
    }
    /* both directions: tile n - 1's staged bytes, here between the two directions' blocks
       rather than right after the barrier, where every warp of the CTA would store at once
       (after both directions' blocks was slower); one direction alone stores after the
       barrier, where it measured fastest */
    if (kMidStore && spend)
      store_staged(a, At{staged_s + (sb ^ 1) * kStagedBytes, 0u, 0u}, si0, sk0, sfull);
    if (kColP) {
      uint2 o[2];
      const uint64_t b0 = (uint64_t)cblk, b1 = (uint64_t)cblk + (uint64_t)(M >> 4);
      if (RHT) {
        auto v0 = [&](int e) { return row_word_value<HQ_BF16>(y[0], e); };
        auto v1 = [&](int e) { return row_word_value<HQ_BF16>(y[1], e); };
        const Signs2 sg = row_signs2(y[0], y[1]);
        o[0] = encode_fast_any<SR>(v0, enc[2], a.rk, offset, 1u, b0, sg.s[0]);
        o[1] = encode_fast_any<SR>(v1, enc[3], a.rk, offset, 1u, b1, sg.s[1]);
      } else {
        auto v0 = [&](int e) { return hq_cuda_hp16_to_f32<DT>(x[e] & 0xffffu); };
        auto v1 = [&](int e) { return hq_cuda_hp16_to_f32<DT>(x[e] >> 16); };
        /* column c's signs are the low halves' (rows 0, 2, 4, 6 and 1, 3, 5, 7 of each packed
           word), column c + 1's the high halves' */
        const uint2 e0 = sign_split(x[0], x[2], x[4], x[6]);
        const uint2 d0 = sign_split(x[1], x[3], x[5], x[7]);
        const uint2 e1 = sign_split(x[8], x[10], x[12], x[14]);
        const uint2 d1 = sign_split(x[9], x[11], x[13], x[15]);
        o[0] = encode_fast_any<SR>(v0, enc[2], a.rk, offset, 1u, b0,
                                   make_uint2(sign_word(e0.x, d0.x), sign_word(e1.x, d1.x)));
        o[1] = encode_fast_any<SR>(v1, enc[3], a.rk, offset, 1u, b1,
                                   make_uint2(sign_word(e0.y, d0.y), sign_word(e1.y, d1.y)));
      }
      if constexpr (kGroup) { /* a ColGroup's columns are rows 128 bytes apart */
        hq_sts64(st.c(rb, c), o[0]);
        hq_sts64(st.c(rb, c + 1), o[1]);
      } else {
        hq_sts128(st.c(rb, c), make_uint4(o[0].x, o[0].y, o[1].x, o[1].y));
      }
      hq_sts8(st.cs(c * (TM / 16) + rb), csf);
      hq_sts8(st.cs((c + 1) * (TM / 16) + rb), csf >> 8);
    }
    /* F32 input: rowwise, and columnwise without rht, block by block (encode16); block_2d takes
       the tile amaxes from the blocks' own (tile_max), so the tile is read once */
    if (kRow && !kPacked) {
      float v[2][16], bv[2];
      int has_nan[2];
#pragma unroll
      for (int j = 0; j < 2; j++) {
        row_group_raw<DT, TK>(sm, r, 32 * p + 16 * j, v[j]);
        bv[j] = block_amax16(v[j], &has_nan[j]);
      }
      if (b2d) tba[0] = bv[0] = tile_max<16>(bv[0]), tba[1] = bv[1] = tile_max<16>(bv[1]);
#pragma unroll
      for (int j = 0; j < 2; j++) {
        uint2 o;
        const uint8_t s = encode16<SR>(v[j], bv[j], hrt, a.rk, offset, 0u,
                                       (uint64_t)rblk + j, has_nan[j],
                                       signs_of([&](int e) { return v[j][e]; }), &o);
        hq_sts64(st.r(r * RS + 2 * p + j), o);
        hq_sts8(st.rs(r * (TK / 16) + 2 * p + j), s);
      }
    }
    if (kCol && !kPacked && !RHT) {
      float v[2][16], bvs[2];
      int has_nans[2];
      colpair_f32<DT, TK>(sm, 16 * rb, c, v[0], v[1]);
      bvs[0] = block_amax16(v[0], &has_nans[0]);
      bvs[1] = block_amax16(v[1], &has_nans[1]);
      if (b2d) tba[2] = tba[3] = bvs[0] = bvs[1] = tile_max<8>(fmaxf(bvs[0], bvs[1]));
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int has_nan = has_nans[h];
        const float bv = bvs[h];
        uint2 o;
        hq_sts8(st.cs((c + h) * (TM / 16) + rb),
                encode16<SR>(v[h], bv, hct[h], a.rk, offset, 1u,
                             (uint64_t)cblk + h * (uint64_t)(M >> 4), has_nan,
                             signs_of([&](int e) { return v[h][e]; }), &o));
        hq_sts64(st.c(rb, c + h), o);
      }
    }
    /* the blocks the fast form does not take (rare), or every packed block when stochastic
       rounding has no fast form: redone by the rule */
    constexpr bool kAllRule = SR && !kSRFast;
    if (kAllRule || !(max_nan(max_nan(fq[0], fq[1]), max_nan(fq[2], fq[3])) < 7.0f)) {
      unsigned redo = 0;
      for (int j = 0; j < 4; j++)
        redo |= (kAllRule && (j < 2 ? kRowP : kColP)) || !(fq[j] < 7.0f) ? 1u << j : 0u;
      /* the rule's own m for the columnwise blocks (not the folded one of rht) */
      Head<OPT> hc0 = hct[0], hc1 = hct[1];
      if (RHT) hc0.m = hc1.m = hc.m;
      redo_blocks<DT, RHT, SR, DIRS, kGroup, OPT, CA>(redo, sm, tba[0], tba[1], tba[2], flip, hrt,
                                                  hc0, hc1, M, K, i0, k0, b2d, a.seed,
                                                  offset, st);
    }
    if constexpr (kOne) { /* the CTA's one tile: the staging buffer flipped as the loop's step
                             flips it, for the store below */
      sb ^= 1;
      break;
    }
  }
  if (bulk) hq_fence_proxy_async(); /* the last group's ColGroup, for the bulk stores below */
  __syncthreads(); /* the last tile is staged */
  if (!first) {
    store_staged(a, At{staged_s + (sb ^ 1) * kStagedBytes, 0u, 0u}, pi0, pk0, pfull);
    if (kGroup && pv)
      while (pq < kColGroup) store_part();
    if (kGroup)
      store_col_group(a, groups_s + gb * (uint32_t)sizeof(ColGroup), pg0, pk0, &tm_cdata,
                      &tm_cscale);
  }
  if (bulk && t == 0) hq_tma_store_wait<0>(); /* the shared memory the stores read stays */
}

/* global_scale = row, the rowwise copy alone, from ONE read of the input (the two-pass path
   reads it twice: the row amax pass, then quantize_kernel). A CTA takes whole rows: a slab of
   rq_rows consecutive rows (rq_rows * K elements, contiguous in the input and, packed, in the
   rowwise data) is copied into shared memory, its rows' amaxes reduced there, and every block
   encoded from registers, so the input leaves DRAM once. Resident CTAs grid-stride over the
   slabs through a ring of slab buffers, each filled by one bulk copy (the TMA's 1-D
   cp.async.bulk, issued by thread 0, completing on the buffer's mbarrier): no thread spends
   instructions on addresses of 16-byte pieces, and the copy of a slab is in flight as soon as
   the slab before it in the same buffer has been read.
   Warp w takes blocks (w * kBPT + j) * 32 + lane of the slab (j < kBPT, row-major), so that
   each j is 32 consecutive blocks (a warp reads and later writes consecutive bytes) and, when
   K / 16 is a multiple of 32, lies in one row: the row is then the same for every lane and
   everything per row (its max, its constants, its encode table) is made by the warp, with no
   barrier between the rows' maxima and the blocks.
   Per slab, ONE barrier:
     1. (after the slab's mbarrier) each thread takes its blocks' values into registers and
        their amaxes (NaN ignored); each row's max into rmax[n % 3] (the bits of a non-negative
        float order like the values, so the order of the atomics does not matter): one
        reduction and one atomic per warp and row where the row is the warp's, else one atomic
        per block;
     2. the barrier: every row's max is whole, and every thread has read the slab buffer, which
        thread 0 then refills with the slab kStages later;
     3. the rows' constants, S_dec and m (dir_const_k: the rule's functions): where each j is
        one row, lanes 8j .. 8j + 7 make row[j]'s and its 8-entry encode table
        (hq_nvfp4_encode_table, entry lane % 8), one round per warp and slab whatever K; else
        each thread once per row it meets. Then each block from registers: its scale code by
        the rule with its row's m (a shuffle), its encode multiplier from the table (a
        shuffle and a power of 2 from the code's exponent: hq_nvfp4_encode_mult_tab's bits),
        else by the rule itself (a subnormal or zero code, a row whose S_dec is outside the
        table's range, rows not the warps'); the codes by the fast form or the rule as in
        quantize_kernel; 8 packed bytes stored per thread (a warp's 256 consecutive bytes),
        the scale codes as words of 4 entries where a row's blocks come in fours (K % 64 ==
        0), else byte by byte. Row i's amax A_i goes to the amax buffer from a thread that
        made its constants for the segment holding its block 0.
   The row maxima rotate through three buffers, so that no other barrier is needed: slab n's
   are written before barrier n and read between barriers n and n + 1, and the buffer slab
   n + 2 will take is cleared between those barriers too (its last readers, slab n - 1's, were
   done before barrier n; its first writers, slab n + 2's, start after barrier n + 1).
   On-chip budget: a slab buffer of kRqSlab bytes holds at least one row, so rows of up to
   HQ_NVFP4_RQ_SLAB bytes (16384 bf16 / f16, 8192 f32 elements; RqShape: rows of half that take
   half-size slabs) take this kernel; a longer row cannot be
   held while its amax is reduced, and goes to the two-pass kernels (rowq_fits), as does an input
   not 16-byte aligned (the bulk copy takes 16-byte aligned addresses). Registers hold a slab's
   share per thread (kBPT blocks) from step 1 to step 3, so the slab buffer is free after the
   barrier and two buffers keep a slab in flight while one is encoded and another is read. */
#ifndef HQ_NVFP4_RQ_SLAB /* bytes per slab buffer (a multiple of 16 KiB) */
#define HQ_NVFP4_RQ_SLAB 32768
#endif
/* slab buffers per CTA (2 or more) and the CTAs per SM the registers are allotted for: round
   to nearest 2 buffers at 3 CTAs per SM (80 registers: 24 warps per SM, two slabs in flight per
   CTA while one is encoded), stochastic rounding, whose blocks hold more registers, 3 at 2 */
#ifndef HQ_NVFP4_RQ_STAGES
#define HQ_NVFP4_RQ_STAGES 2
#endif
#ifndef HQ_NVFP4_RQ_MIN_BLOCKS
#define HQ_NVFP4_RQ_MIN_BLOCKS 3
#endif
#ifndef HQ_NVFP4_RQ_SR_STAGES
#define HQ_NVFP4_RQ_SR_STAGES 3
#endif
#ifndef HQ_NVFP4_RQ_SR_MIN_BLOCKS
#define HQ_NVFP4_RQ_SR_MIN_BLOCKS 2
#endif
/* Rows of at most HQ_NVFP4_RQ_SMALL_SLAB bytes (round to nearest) take half-size slabs: half
   the blocks per thread, so 4 CTAs per SM fit the registers, with 3 buffers each -- more slabs
   in flight per SM than the large form's 6, which measured the faster (docs/performance.md);
   longer rows keep the large slabs, the only ones that hold them. */
#ifndef HQ_NVFP4_RQ_SMALL_SLAB
#define HQ_NVFP4_RQ_SMALL_SLAB 16384
#endif
#ifndef HQ_NVFP4_RQ_SMALL_STAGES
#define HQ_NVFP4_RQ_SMALL_STAGES 3
#endif
#ifndef HQ_NVFP4_RQ_SMALL_MIN_BLOCKS
#define HQ_NVFP4_RQ_SMALL_MIN_BLOCKS 4
#endif
/* One form of rowq_kernel: slab buffer bytes, buffers per CTA, CTAs per SM (SMALL: the
   half-size slabs, round to nearest only) */
template <bool SR, bool SMALL> struct RqShape {
  static constexpr int kSlab = SMALL ? HQ_NVFP4_RQ_SMALL_SLAB : HQ_NVFP4_RQ_SLAB;
  static constexpr int kStages = SR      ? HQ_NVFP4_RQ_SR_STAGES
                                 : SMALL ? HQ_NVFP4_RQ_SMALL_STAGES
                                         : HQ_NVFP4_RQ_STAGES;
  static constexpr int kMinBlocks = SR      ? HQ_NVFP4_RQ_SR_MIN_BLOCKS
                                    : SMALL ? HQ_NVFP4_RQ_SMALL_MIN_BLOCKS
                                            : HQ_NVFP4_RQ_MIN_BLOCKS;
  static_assert(kSlab % (16 * 4 * kThreads) == 0 && kStages >= 2 && !(SR && SMALL),
                "a slab buffer is whole 16-block rounds of the CTA's threads, in F32 too");
  /* elements and blocks per thread of a slab, at most */
  template <int DT> static constexpr int kElems = kSlab / (DT == HQ_F32 ? 4 : 2);
  template <int DT> static constexpr int kBPT = kElems<DT> / 16 / kThreads;
};
/* rows per slab, at most: thread t clears row t's max (step 3) */
constexpr int kRqMaxRows = kThreads;

/* The scale code's encode multiplier from a row's table (hq_nvfp4_encode_mult_tab's bits for
   a normal code, sf >= 8): code sf = e * 8 + g has the value 2^(e - bias) * (1 + g / 8), whose
   FP32 exponent field is e - bias + 127, so the table's power of 2 is 2^(254 - that) = the
   float with exponent field kExp - e (E4M3: bias 7, kExp 134; UE5M3: bias 15, kExp 142);
   tv = the table's entry g. */
template <bool UE> __device__ __forceinline__ float rq_tab_enc(float tv, uint32_t sf) {
  constexpr uint32_t kExp = UE ? 142u : 134u;
  return hq_mul_rn(tv, hq_bits_f32(kExp * 0x800000u - (sf >> 3) * 0x800000u));
}

/* The rule for 16 values of a block with round to nearest (encode_rule), out of line: the
   blocks the fast form does not take are rare, and the kernel's common path stays compact. A
   16-bit input's 8 raw words in x, y (row_words' layout), an F32 one's 16 values' bits in x, y,
   z, u. */
template <int DT>
__device__ __noinline__ uint2 rq_rule_rn(uint4 x, uint4 y, uint4 z, uint4 u, float enc) {
  const uint32_t q[16] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w,
                          z.x, z.y, z.z, z.w, u.x, u.y, u.z, u.w};
  auto val = [&](int e) {
    return DT == HQ_F32 ? hq_bits_f32(q[e]) : row_word_value<DT>(q, e);
  };
  return encode_rule<false>(val, enc, (const uint32_t *)nullptr, 0u, 0u, 0u);
}
/* Keeps a pointer in registers as made, where the compiler would make it again from the
   kernel's arguments before each use (hq_pin's reason, for a 64-bit value). */
__device__ __forceinline__ void rq_pin64(uint8_t *&p) { asm volatile("" : "+l"(p)); }
__device__ __forceinline__ uint4 f4(const float *v, int e) {
  return make_uint4(hq_f32_bits(v[e]), hq_f32_bits(v[e + 1]), hq_f32_bits(v[e + 2]),
                    hq_f32_bits(v[e + 3]));
}

template <int DT, bool SR, bool UE, bool SMALL>
__global__ void __launch_bounds__(kThreads, (RqShape<SR, SMALL>::kMinBlocks))
    rowq_kernel(QArgs a) {
  using Sh = RqShape<SR, SMALL>;
  constexpr int kEsz = DT == HQ_F32 ? 4 : 2, kBPT = Sh::template kBPT<DT>;
  constexpr int kStages = Sh::kStages, kRqSlab = Sh::kSlab;
  constexpr int kind = UE ? HQ_NVFP4_SCALE_UE5M3 : HQ_NVFP4_SCALE_E4M3;
  extern __shared__ __align__(16) uint8_t slabs[]; /* kStages buffers of kRqSlab bytes */
  __shared__ uint32_t rmax[3][kRqMaxRows];          /* the slabs' row amaxes (bits), step 1 */
  __shared__ __align__(8) uint64_t full[kStages];   /* buffer b's copy has landed */
  const int t = threadIdx.x, lane = t & 31;
  const uint64_t offset = q_offset<SR>(a);
  const uint32_t M = (uint32_t)a.M, K = (uint32_t)a.K, R = a.rq_rows, nbr = K / 16;
  const uint32_t nslab = (M + R - 1) / R;
  uint32_t base = hq_smem_addr(slabs);
  const uint32_t bar0 = hq_smem_addr(full);
  /* each j's 32 blocks lie in one row (step 1's warp reduction, step 3's table), and a scale
     word's 4 blocks are 4 lanes' (step 3) */
  const bool warp_row = nbr % 32 == 0, q4 = (lane & 3) == 0;
  /* the scale codes by words of 4 (1: compact, at block b's place r0 * nbr + b; 2: swizzled),
     0: byte by byte */
  const int smode = nbr % 4 == 0 && a.a4 ? (a.swz ? 2 : 1) : 0;
  /* the thread's blocks in a slab, b0 + 32 j, and their rows: the same in every slab (one
     division each, once); block b of the slab is block b - row[j] * nbr of its row */
  const uint32_t b0 = (uint32_t)(t >> 5) * (32u * kBPT) + (uint32_t)lane;
  uint32_t row[kBPT];
#pragma unroll
  for (int j = 0; j < kBPT; j++) row[j] = (b0 + 32u * j) / nbr;
  /* warp_row: lanes 8j .. 8j + 7 make the constants of j's row (kBPT <= 4 rows a warp, one
     round of the warp whatever K): the lane's segment, its row, and whether the lane writes
     that row's amax (entry 0, the segment holding the row's block 0) */
  const uint32_t cseg = ((uint32_t)(t >> 5) * kBPT + ((uint32_t)(lane >> 3) & (kBPT - 1))) * 32u;
  const uint32_t crow = cseg / nbr;
  const bool cfirst = cseg == crow * nbr && (lane & 7) == 0;
  /* copy slab s (its rows' rows * K * kEsz bytes, a multiple of 32) into buffer b */
  auto issue = [&](uint32_t s, int b) {
    const uint32_t r0 = s * R, rows = min(R, M - r0), bytes = rows * K * kEsz;
    hq_mbar_expect_tx(bar0 + 8u * b, bytes);
    hq_tma_load_1d(base + (uint32_t)b * kRqSlab,
                   static_cast<const uint8_t *>(a.x) + (uint64_t)r0 * K * kEsz, bytes,
                   bar0 + 8u * b);
  };
  rmax[0][t] = rmax[1][t] = rmax[2][t] = 0u;
  if (t < kStages) hq_mbar_init(bar0 + 8u * t, 1);
  hq_mbar_init_fence();
  __syncthreads(); /* the barriers and row maxima are set */
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < kStages; b++) {
      const uint32_t s = blockIdx.x + (uint32_t)b * gridDim.x;
      if (s < nslab) issue(s, b);
    }
  }
  int buf = 0, rb = 0;  /* slab n's buffer (n % kStages) and row-max buffer (n % 3) */
  uint32_t parity = 0u; /* bit b: the phase of buffer b's mbarrier to wait for */
  for (uint32_t s = blockIdx.x; s < nslab; s += gridDim.x) {
    hq_pin(base);
#pragma unroll
    for (int j = 0; j < kBPT; j++) hq_pin(row[j]); /* nothing made from them is held across
                                                      slabs (registers) */
    const uint32_t r0 = s * R, rows = min(R, M - r0), nb = rows * nbr;
    const uint32_t sm = base + (uint32_t)buf * kRqSlab;
    uint32_t *const rm = rmax[rb];
    hq_mbar_wait(bar0 + 8u * buf, (parity >> buf) & 1u);
    parity ^= 1u << buf;
    /* step 1: the thread's blocks, their amaxes, the rows' maxima */
    uint32_t w[kBPT][8]; /* 16-bit input: block j's raw words (row_words' layout) */
    float v[kBPT][16];   /* F32 input: block j's values */
    float bam[kBPT];     /* block j's amax, NaN ignored */
    uint32_t nanm = 0u;  /* bit j: block j holds a NaN */
    uint32_t acc = 0u; /* warp_row: the max of the thread's blocks in row[j] so far */
#pragma unroll
    for (int j = 0; j < kBPT; j++) {
      const bool in = (b0 + 32u * j) < nb;
      bam[j] = 0.0f;
      if (in) {
        const uint32_t p = sm + (b0 + 32u * j) * (16u * kEsz);
        if (DT == HQ_F32) {
#pragma unroll
          for (int q = 0; q < 4; q++) {
            const uint4 f = hq_lds128(p + 16u * q);
            v[j][4 * q] = hq_bits_f32(f.x), v[j][4 * q + 1] = hq_bits_f32(f.y);
            v[j][4 * q + 2] = hq_bits_f32(f.z), v[j][4 * q + 3] = hq_bits_f32(f.w);
          }
          int hn;
          bam[j] = block_amax16(v[j], &hn);
          nanm |= (uint32_t)hn << j;
        } else {
          const uint4 x = hq_lds128(p), y = hq_lds128(p + 16u);
          w[j][0] = x.x, w[j][1] = x.y, w[j][2] = x.z, w[j][3] = x.w;
          w[j][4] = y.x, w[j][5] = y.y, w[j][6] = y.z, w[j][7] = y.w;
          const float ba = packed16_amax<DT>(w[j]); /* NaN propagated */
          const int hn = is_nan_abs(ba);
          nanm |= (uint32_t)hn << j;
          bam[j] = hn ? amax_of([&](int e) { return row_word_value<DT>(w[j], e); }) : ba;
        }
      }
      const uint32_t u = hq_f32_bits(bam[j]); /* 0 for a block outside the slab */
      if (warp_row) { /* uniform: j's 32 blocks are all in or all out, in one row */
        acc = max(acc, u);
        /* the warp's max of the row once its last block of the thread's is in */
        if (j + 1 == kBPT || row[j + 1] != row[j] || (b0 + 32u * (j + 1)) >= nb) {
          const uint32_t wm = __reduce_max_sync(0xffffffffu, acc);
          if (lane == 0 && in && wm) atomicMax(&rm[row[j]], wm);
          acc = 0u;
        }
      } else if (in && u) {
        atomicMax(&rm[row[j]], u);
      }
    }
    __syncthreads(); /* every row's max is whole; slab n's buffer has been read */
    if (t == 0 && s + kStages * gridDim.x < nslab) issue(s + kStages * gridDim.x, buf);
    buf = buf + 1 == kStages ? 0 : buf + 1;
    /* row maxima of slab n + 2 start from 0 (the buffer slab n - 1 read, see above) */
    rmax[rb == 0 ? 2 : rb - 1][t] = 0u;
    rb = rb == 2 ? 0 : rb + 1;
    /* step 3: the rows' constants, encode and store. The thread's blocks are b0 + 32 j:
       their packed bytes 256 j bytes apart, and (words, compact scales: K / 16 entries a
       row, so block b's entry is r0 * nbr + b) their scale words 32 j entries apart */
    uint8_t *ob = a.rdata + (uint64_t)r0 * (K / 2) + 8u * b0;
    uint8_t *sb = a.rscale + (uint64_t)r0 * nbr + b0;
    if (!SR) rq_pin64(ob), rq_pin64(sb); /* made once, not again before each store (the
                                            registers stochastic rounding needs elsewhere) */
    __builtin_assume(__isGlobal(ob)), __builtin_assume(__isGlobal(sb));
    /* warp_row: m and the encode table of row[j] in lanes 8j .. 8j + 7 (entry lane % 8; 0
       where S_dec is outside the table's range) */
    float mv = 0.0f, tv = 0.0f;
    if (warp_row) {
      const float A = hq_bits_f32(rm[crow]);
      const DirConst d = dir_const_k(A, kind);
      mv = d.m;
      tv = hq_nvfp4_encode_table_ok(d.s_dec) ? hq_nvfp4_encode_table(lane & 7, d.s_dec) : 0.0f;
      if (cfirst && cseg < nb) a.ramax[r0 + crow] = A;
    }
    /* otherwise each thread's, made once per row it meets */
    uint32_t cur = 0xffffffffu; /* the row whose constants are held */
    float s_dec = 0.0f, m = 0.0f;
#pragma unroll
    for (int j = 0; j < kBPT; j++) {
      const uint32_t b = (b0 + 32u * j), i = row[j];
      const bool in = b < nb;
      if (!warp_row && in && i != cur) {
        const float A = hq_bits_f32(rm[i]);
        const DirConst d = dir_const_k(A, kind);
        s_dec = d.s_dec, m = d.m, cur = i;
        if (b == i * nbr) a.ramax[r0 + i] = A;
      }
      /* the scale code (0 outside the slab, whose bam is 0); the shuffles by every lane */
      const float mj = __shfl_sync(0xffffffffu, mv, 8 * j);
      const float pr = hq_mul_rn(bam[j], warp_row ? mj : m);
      uint32_t sf;
#if HQ_FP8_HW_CVT
      if (!UE) { /* bam * m is never NaN (bam >= 0 and not NaN, m finite and positive), and
                    the instruction saturates +Inf as the rule does: no NaN test */
        unsigned short c2;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c2) : "f"(0.0f), "f"(pr));
        sf = c2;
      } else
#endif
        sf = Head<2>{nullptr, 0.0f, 0.0f, kind}.code(pr);
      /* the multiplier from row[j]'s table entry sf % 8 (tv is 0 where there is none) */
      const float te = __shfl_sync(0xffffffffu, tv, (int)((sf & 7u) | (8u * j)));
      const bool hit = (sf >= 8u) & (te > 0.0f);
      float enc = rq_tab_enc<UE>(te, sf);
      if (in) {
        if (!hit) { /* the rule's multiplier (its S_dec made again where warp_row) */
          const float sd = warp_row ? dir_const_k(hq_bits_f32(rm[i]), kind).s_dec : s_dec;
          enc = hq_nvfp4_encode_mult_k((uint8_t)sf, sd, kind);
        }
        const bool fast = fast_block<SR>(bam[j], enc, (nanm >> j) & 1u);
        const uint64_t blk = (uint64_t)r0 * nbr + b; /* hq_nvfp4_sr_bits' rowwise index */
        uint2 o;
        if (DT == HQ_F32) {
          auto val = [&](int e) { return v[j][e]; };
          if (fast)
            o = encode_fast_any<SR>(val, enc, a.rk, offset, 0u, blk, signs_of(val));
          else if (SR)
            o = encode_rule<SR>(val, enc, a.rk, offset, 0u, blk);
          else
            o = rq_rule_rn<DT>(f4(v[j], 0), f4(v[j], 4), f4(v[j], 8), f4(v[j], 12), enc);
        } else {
          auto val = [&](int e) { return row_word_value<DT>(w[j], e); };
          const uint2 s0 = sign_split(w[j][0], w[j][1], w[j][2], w[j][3]);
          const uint2 s1 = sign_split(w[j][4], w[j][5], w[j][6], w[j][7]);
          const uint2 sg = make_uint2(sign_word(s0.x, s0.y), sign_word(s1.x, s1.y));
          const uint4 z = make_uint4(0u, 0u, 0u, 0u);
          if (fast)
            o = encode_fast_any<SR>(val, enc, a.rk, offset, 0u, blk, sg);
          else if (SR)
            o = encode_rule<SR>(val, enc, a.rk, offset, 0u, blk);
          else
            o = rq_rule_rn<DT>(make_uint4(w[j][0], w[j][1], w[j][2], w[j][3]),
                               make_uint4(w[j][4], w[j][5], w[j][6], w[j][7]), z, z, enc);
        }
        store8(ob + 256u * j, o, a.a8);
      }
      if (smode) { /* lanes 4n .. 4n + 3: blocks cb .. cb + 3 of one row, cb % 4 == 0 */
        const uint32_t x = __byte_perm(sf, __shfl_down_sync(0xffffffffu, sf, 1), 0x0040u);
        const uint32_t wd = __byte_perm(x, __shfl_down_sync(0xffffffffu, x, 2), 0x5410u);
        if (in && q4) {
          if (smode == 1)
            *reinterpret_cast<uint32_t *>(sb + 32u * j) = wd;
          else
            store_scale_word(a.rscale, r0 + i, b - i * nbr, K, 1, 1, wd);
        }
      } else if (in) {
        a.rscale[hq_nvfp4_scale_offset(r0 + i, b - i * nbr, K, a.swz)] = (uint8_t)sf;
      }
    }
  }
}

#ifndef HQ_NVFP4_TU_DT /* the dequantizes and the row amax pass: nvfp4.cu alone */
struct DArgs {
  const uint8_t *q, *scale;
  const float *amax; /* [1] (global_scale = tensor), one per stored row (row), NULL (none) */
  int kind, global;  /* the storage's scale type and global scale (HQ_NVFP4_SCALE_*, _GLOBAL_*) */
  int colwise, swz, rht, raw; /* rht: apply the inverse RHT (never with raw) */
  int vec;                    /* q 8-byte and dst 16-byte aligned: vector loads and stores */
  uint32_t mask;
  void *dst;
  int64_t M, K;
  float *fout;       /* NULL, or the factor's destination (ABI 2.3): see write_factor */
  const float *fin;
  float fmul;
  float *rfout;          /* NULL, or the row factors' destination (ABI 2.6): write_row_factors */
  const float *rf_amax;  /* ... the storage's amax of each of its rf_n stored rows */
  int64_t rf_n;
};

/* The per-tensor factor of a storage: hq_nvfp4_tensor_factor_k of its amax with
   global_scale = tensor; 1 with row (each raw value then carries its row's global scale, see
   deq_mult) and with none. */
__device__ __forceinline__ float storage_factor(const float *amax, int kind, int global) {
  return global == HQ_NVFP4_GLOBAL_TENSOR ? hq_nvfp4_tensor_factor_k(*amax, kind) : 1.0f;
}

/* *fout = hq_mul_rn(fin ? *fin : fmul, storage_factor): the raw dequantize's per-tensor factor,
   folded into the caller's running product (hq_call.factor_out), written by thread 0 of CTA 0
   of the dequantize kernel itself (no launch of its own). */
__device__ __forceinline__ void write_factor_now(const DArgs &a) {
  if (a.fout)
    *a.fout = hq_mul_rn(a.fin ? *a.fin : a.fmul, storage_factor(a.amax, a.kind, a.global));
}
__device__ __forceinline__ void write_factor(const DArgs &a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) write_factor_now(a);
}

/* The decode multiplier of scale code sf in stored row r (amax: the per-tensor amax, read once
   by the caller): hq_nvfp4_decode_mult_k with the direction's amax, or with global_scale = row
   the row's (raw values of a row-scaled storage too: the GEMM's F32 operands carry it);
   fp32(sf) for a raw dequantize and with global_scale = none. */
__device__ __forceinline__ float deq_mult(const DArgs &a, uint8_t sf, float amax, int64_t r) {
  if (a.global == HQ_NVFP4_GLOBAL_ROW) return hq_nvfp4_decode_mult_k(sf, a.amax[r], a.kind);
  if (a.raw || a.global == HQ_NVFP4_GLOBAL_NONE) return hq_nvfp4_raw_mult_k(sf, a.kind);
  return hq_nvfp4_decode_mult_k(sf, amax, a.kind);
}

/* The 16 codes of one block: 8 packed bytes (one 8-byte load when aligned: with the shape rule
   M % 16 == 0 and K % 16 == 0 every block starts at a multiple of 8 bytes of its buffer). */
__device__ __forceinline__ uint64_t load_block(const uint8_t *p, int vec) {
  if (vec) {
    const uint2 w = *reinterpret_cast<const uint2 *>(p);
    return (uint64_t)w.x | (uint64_t)w.y << 32;
  }
  uint64_t v = 0;
  for (int b = 0; b < 8; b++) v |= (uint64_t)p[b] << (8 * b);
  return v;
}

/* n consecutive values (n = 4 or 8) of a high-precision row at element offset off: 16-byte
   stores when vec (off is then a multiple of n elements: 16-byte aligned for F32, 8- or 16-byte
   for 16-bit types), else one element at a time. */
template <int DT, int N>
__device__ __forceinline__ void store_run(void *dst, int64_t off, const float *g, int vec) {
  if (!vec) {
    for (int e = 0; e < N; e++) hq_store_hp(dst, off + e, DT, g[e]);
  } else if (DT == HQ_F32) {
    float4 *o = reinterpret_cast<float4 *>(static_cast<float *>(dst) + off);
    for (int k = 0; k < N / 4; k++)
      o[k] = make_float4(g[4 * k], g[4 * k + 1], g[4 * k + 2], g[4 * k + 3]);
  } else {
    uint32_t h[N / 2];
    for (int k = 0; k < N / 2; k++) h[k] = hq_pack2_hp16(g[2 * k], g[2 * k + 1], DT);
    uint16_t *o16 = static_cast<uint16_t *>(dst) + off;
    if (N == 4) *reinterpret_cast<uint2 *>(o16) = make_uint2(h[0], h[1]);
    else *reinterpret_cast<uint4 *>(o16) = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

/* The row factors of a row-scaled storage split from its raw values (hq_call.row_factor_out):
   rfout[r] = hq_nvfp4_tensor_factor_k(rf_amax[r]) for its rf_n stored rows, grid-stride over
   every thread of the dequantize kernel itself (no launch of its own). */
__device__ __forceinline__ void write_row_factors(const DArgs &a) {
  if (!a.rfout) return;
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < a.rf_n;
       r += (int64_t)gridDim.x * blockDim.x)
    a.rfout[r] = hq_nvfp4_tensor_factor_k(a.rf_amax[r], a.kind);
}

/* Rowwise dequantize: one thread per 16-block, grid-stride over the [M, K] tensor's blocks in
   order (K % 16 == 0: a block never crosses a row): one 8-byte load of its codes, its scale, two
   16-byte stores (BF16/F16), so consecutive threads write one contiguous span (a half block per
   thread, every store of a warp 512 contiguous bytes, was slower). SMALL (M * K < 2^32) finds
   the row with 32-bit arithmetic. */
template <int DT, bool SMALL>
__device__ __forceinline__ void deq_rows(const DArgs &a, int64_t cta, int64_t ctas) {
  const int64_t K = a.K, nrun = a.M * K / 16;
  const float amax = a.raw || a.global != HQ_NVFP4_GLOBAL_TENSOR ? 0.0f : *a.amax;
  for (int64_t g = cta * blockDim.x + threadIdx.x; g < nrun; g += ctas * blockDim.x) {
    const int64_t e0 = g * 16;
    int64_t i, k;
    hq_cuda_row_col<SMALL>(e0, K, &i, &k);
    const uint8_t sf = a.scale[hq_nvfp4_row_scale_index(i, k, K, a.swz)];
    const float dm = deq_mult(a, sf, amax, i);
    const uint64_t codes = load_block(a.q + hq_nvfp4_row_data_index(i, k, K), a.vec);
    if (DT == HQ_BF16 && a.raw && a.global != HQ_NVFP4_GLOBAL_ROW && a.vec && !hq_isnan(dm)) {
      /* raw values: hq_nvfp4_raw_fast, exact in BF16 (hq_nvfp4_raw_mult_k's comment; not with
         global_scale = row, whose raw values carry the row's global scale): the FP32
         results' high halves, two per byte_perm. The stores bound this kernel, not its
         instructions, so a shorter form (byte-permute tables, BF16 pair multiplies) gains
         nothing. */
      uint32_t b[16], hw[8];
      for (int e = 0; e < 16; e++)
        b[e] = hq_f32_bits(hq_nvfp4_raw_fast((uint32_t)(codes >> (4 * e)), dm));
      for (int e = 0; e < 8; e++) hw[e] = __byte_perm(b[2 * e], b[2 * e + 1], 0x7632);
      uint4 *o = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.dst) + e0);
      o[0] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
      o[1] = make_uint4(hw[4], hw[5], hw[6], hw[7]);
      continue;
    }
    float v[16];
    for (int e = 0; e < 16; e++)
      v[e] = hq_nvfp4_dequantize((uint32_t)(codes >> (4 * e)) & 0xfu, dm);
    store_run<DT, 8>(a.dst, e0, v, a.vec);
    store_run<DT, 8>(a.dst, e0 + 8, v + 8, a.vec);
  }
}
template <int DT, bool SMALL>
__global__ void __launch_bounds__(kThreads) dequantize_rows_kernel(DArgs a) {
  write_factor(a);
  write_row_factors(a);
  deq_rows<DT, SMALL>(a, blockIdx.x, gridDim.x);
}

/* Columnwise dequantize: one CTA of 128 threads per 16 x 128 tile, one block of 16 along M for
   each of 128 columns: each thread decodes one block from the [K, M] copy (8 bytes, the inverse
   RHT where asked), the tile goes back to [M, K] rows through shared memory in runs of 4
   columns (a warp stores a whole 128-column row). A tile of one row block keeps a tensor of a
   few hundred rows on as many CTAs as its blocks of 16 x 128 (a 256 x 256 weight: 32). */
constexpr int kDcM = 16, kDcK = 128;
/* rows padded to 132 floats: the 16-byte reads of a row's runs stay conflict-free */
typedef float DcTile[kDcM][kDcK + 4];
template <int DT>
__device__ __forceinline__ void deq_cols(const DArgs &a, unsigned tile, DcTile &ft) {
  const int64_t M = a.M, K = a.K;
  const unsigned ntk = (unsigned)((K + kDcK - 1) / kDcK);
  const int64_t i0 = (int64_t)(tile / ntk) * kDcM, k0 = (int64_t)(tile % ntk) * kDcK;
  const float amax = a.raw || a.global != HQ_NVFP4_GLOBAL_TENSOR ? 0.0f : *a.amax;
  const int t = threadIdx.x;
  const int64_t k = k0 + t;
  if (k < K) { /* M % 16 == 0: the tile's 16 rows are all in */
    const uint8_t sf = a.scale[hq_nvfp4_col_scale_index(i0, k, M, a.swz)];
    const float dm = deq_mult(a, sf, amax, k);
    const uint64_t codes = load_block(a.q + hq_nvfp4_col_data_index(i0, k, M), a.vec);
    float g[16];
    if (a.raw && !hq_isnan(dm)) /* hq_nvfp4_raw_fast: the same bits, fewer instructions */
      for (int e = 0; e < 16; e++) g[e] = hq_nvfp4_raw_fast((uint32_t)(codes >> (4 * e)), dm);
    else
      for (int e = 0; e < 16; e++)
        g[e] = hq_nvfp4_dequantize((uint32_t)(codes >> (4 * e)) & 0xfu, dm);
    if (a.rht) hq_nvfp4_rht16_inverse(g, a.mask);
    for (int e = 0; e < 16; e++) ft[e][t] = g[e];
  }
  __syncthreads();
  /* back to [M, K] rows: runs of 4 columns per thread (vector stores when the run is whole) */
  for (int u = t; u < kDcM * kDcK / 4; u += kDcK) {
    const int rr = u / (kDcK / 4), c = 4 * (u % (kDcK / 4));
    const int64_t i = i0 + rr, kk = k0 + c;
    if (kk >= K) continue;
    const float4 f = *reinterpret_cast<const float4 *>(&ft[rr][c]);
    const float g[4] = {f.x, f.y, f.z, f.w};
    if (kk + 4 <= K && a.vec && K % 4 == 0) {
      store_run<DT, 4>(a.dst, i * K + kk, g, 1);
    } else {
      for (int e = 0; e < 4 && kk + e < K; e++) hq_store_hp(a.dst, i * K + kk + e, DT, g[e]);
    }
  }
}
template <int DT> __global__ void __launch_bounds__(kDcK) dequantize_kernel(DArgs a) {
  __shared__ __align__(16) DcTile ft;
  write_factor(a);
  write_row_factors(a);
  deq_cols<DT>(a, blockIdx.x, ft);
}

/* Two dequantizes in one launch (dequantize_pair): CTAs [0, na) do a's, the others b's, each
   part as its own kernel above would (a rowwise part grid-strides over its CTAs at 128 threads
   each, a columnwise part takes a 16 x 128 tile a CTA); thread 0 of CTA 0 writes a's factor and
   then b's, so that b's may read a's product (a chained fold). No row factors. */
template <int DT, bool SMALL>
__global__ void __launch_bounds__(kDcK) dequantize_pair_kernel(DArgs a, DArgs b, unsigned na) {
  __shared__ __align__(16) DcTile ft;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    write_factor_now(a);
    write_factor_now(b);
  }
  if (blockIdx.x < na) {
    if (a.colwise) deq_cols<DT>(a, blockIdx.x, ft);
    else deq_rows<DT, SMALL>(a, blockIdx.x, na);
  } else {
    const unsigned cta = blockIdx.x - na, ctas = gridDim.x - na;
    if (b.colwise) deq_cols<DT>(b, cta, ft);
    else deq_rows<DT, SMALL>(b, cta, ctas);
  }
}

/* write_factor and write_row_factors alone (a dequantize of no elements runs no dequantize
   kernel: a [M, 0] tensor's rowwise storage still has M row factors). */
__global__ void factor_kernel(DArgs a) {
  write_factor(a);
  write_row_factors(a);
}

/* The per-tensor factor (tensor_factor(), the native GEMM's alpha factor): one thread. */
__global__ void tensor_factor_kernel(const float *amax, int kind, int global, float *out) {
  *out = storage_factor(amax, kind, global);
}

/* global_scale = row: the amax of every row of x (rowwise copy: row[i] = max_k |x[i][k]|) and
   of every column (columnwise copy: col[k] = max_i |x[i][k]|), NaN ignored, Inf counted, from
   one read of x (either target may be NULL: not wanted; both were zeroed). A CTA takes a strip
   of kRaTK columns and kRaBand rows, kRaTM rows at a time: lane l of warp w reads the 8 columns
   8l.. of rows w, w + 8, w + 16, w + 24 (one or two 16-byte loads each, coalesced along the
   row), a warp's row maxima leave by one atomicMax per row and strip, the columns' by one per
   column and band after a reduction over the warps in shared memory. The maxima are over the
   bits of |x| with NaN patterns as 0 (hq_abs_bits_nonan), which order like the values, so
   the atomics' order does not change the result. */
constexpr int kRaTK = 256, kRaTM = 32, kRaBand = 256;
struct RowAmaxArgs {
  const void *x;
  int64_t M, K; /* M, K < 2^31, K % 16 == 0 */
  int vec;      /* x 16-byte aligned */
  float *row, *col;
};
template <int DT> __global__ void __launch_bounds__(kThreads) row_amax_kernel(RowAmaxArgs a) {
  __shared__ uint32_t part[kThreads / 32][kRaTK];
  const int t = threadIdx.x, l = t & 31, w = t >> 5;
  const unsigned ntk = (unsigned)((a.K + kRaTK - 1) / kRaTK);
  const int64_t k = (int64_t)(blockIdx.x % ntk) * kRaTK + 8 * l;
  const int64_t ib = (int64_t)(blockIdx.x / ntk) * kRaBand;
  const bool kin = k < a.K; /* K % 8 == 0: the 8 columns are wholly inside or outside */
  uint32_t cmax[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
  for (int64_t i0 = ib; i0 < ib + kRaBand && i0 < a.M; i0 += kRaTM) {
    float v[4][8];
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const int64_t i = i0 + w + 8 * s;
      if (kin && i < a.M) {
        hq_cuda_load8<DT>(a.x, i * a.K + k, a.vec, v[s]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[s][e] = 0.0f;
      }
    }
#pragma unroll
    for (int s = 0; s < 4; s++) {
      uint32_t rmax = 0u;
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const uint32_t b = hq_abs_bits_nonan(v[s][e]);
        rmax = b > rmax ? b : rmax;
        cmax[e] = b > cmax[e] ? b : cmax[e];
      }
      if (a.row) {
        rmax = __reduce_max_sync(0xffffffffu, rmax);
        const int64_t i = i0 + w + 8 * s;
        if (l == 0 && rmax && i < a.M)
          atomicMax(reinterpret_cast<unsigned int *>(a.row + i), rmax);
      }
    }
  }
  if (!a.col) return; /* uniform over the CTA */
#pragma unroll
  for (int e = 0; e < 8; e++) part[w][8 * l + e] = cmax[e];
  __syncthreads();
  uint32_t m = 0u;
#pragma unroll
  for (int j = 0; j < kThreads / 32; j++) m = part[j][t] > m ? part[j][t] : m;
  const int64_t kc = (int64_t)(blockIdx.x % ntk) * kRaTK + t;
  if (m && kc < a.K) atomicMax(reinterpret_cast<unsigned int *>(a.col + kc), m);
}

#endif

inline bool aligned(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

/* The 1-D grid of tm x tk tiles of an [M, K] tensor (M, K > 0; 64x128 unless told). */
inline int tile_grid(const hq_call *call, int64_t M, int64_t K, unsigned *grid,
                      int tm = kTM, int tk = kTK) {
  const int64_t n = ((M + tm - 1) / tm) * ((K + tk - 1) / tk);
  if (n > 0x7fffffff)
    return call->host->error(HQ_ESHAPE, "nvfp4 CUDA: shape [%lld, %lld] exceeds the grid limit",
                             (long long)M, (long long)K);
  *grid = (unsigned)n;
  return HQ_OK;
}

/* The amax pass: writes *x0, *x1 and *t (each where not NULL); the targets need no zeroing. */
template <int DT> int launch_amax(const hq_call *call, const AmaxArgs &a) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  if (!a.t) { /* max |x| alone: the shared flat pass (amax_cuda.h) */
    CHECK_CUDA(call, hq_cuda_amax<DT>(a.x, a.M * a.K, a.vec, a.x0, a.x1, stream));
    return HQ_OK;
  }
  /* a small tensor: one cluster, no memset node (amax_cuda.h says why) */
  if (a.M * a.K <= kHqAmaxClusterElems) {
    CHECK_CUDA(call, (hq_cuda_launch_cluster(amax_kernel<DT, true>, kAmaxClThreads, stream, a)));
    return HQ_OK;
  }
  /* 16x4 patches, one per thread: as many CTAs as are resident, each looping, each maxing
     atomically into the zeroed targets */
  CHECK_CUDA(call, hq_cuda_zero_words(a.x0, a.x1, a.t, stream));
  const int64_t blocks = ((a.M / 16) * (a.K / 4) + kThreads - 1) / kThreads;
  int64_t resident = 0;
  CHECK_CUDA(call, (hq_cuda_resident<amax_kernel<DT, false>>(kThreads, 0, &resident)));
  const unsigned grid = (unsigned)(blocks < resident ? blocks : resident);
  amax_kernel<DT, false><<<grid, kThreads, 0, stream>>>(a);
  if (cudaPeekAtLastError() != cudaSuccess) hq_cuda_resident_forget<amax_kernel<DT, false>>();
  CHECK_LAUNCH(call, "nvfp4 amax kernel");
  return HQ_OK;
}

inline int amax_dispatch(const hq_call *call, int dtype, const AmaxArgs &a) {
  switch (dtype) {
  case HQ_F32:
    return launch_amax<HQ_F32>(call, a);
  case HQ_F16:
    return launch_amax<HQ_F16>(call, a);
  case HQ_BF16:
    return launch_amax<HQ_BF16>(call, a);
  default:
    return call->host->error(HQ_EINVAL, "nvfp4 CUDA: source dtype %d", dtype);
  }
}

/* The quantize kernel's tensor maps (QArgs tma, tmc, tmcs; each left unmade, and its flag 0,
   where the driver has no encoder or the layout does not allow it, and the kernel then takes
   its other path):
   - x, for TMA tiles (kTmaTile) of a 16-byte aligned input: boxes of TM rows x 64 elements with
     the 128-byte swizzle, zeros outside the tensor (K % 16 == 0 makes the row pitch a multiple
     of 16 bytes, as the TMA needs);
   - the columnwise data, for the ColGroups (kGroup; F32 inputs too): K rows of M / 2 bytes
     (M % 32 == 0 for a pitch of a multiple of 16, a 16-byte aligned buffer), boxes of PART rows
     x 128 bytes with the ColGroup's swizzle;
   - and then its scales in the compact layout with a pitch of a multiple of 16 bytes: K rows
     of M / 16 bytes (the padding after them not written, as by the kernel's own stores),
     boxes of PART rows x one column's 4 * kColGroup bytes. */
template <int DT, int DIRS, bool SR, bool UG>
void make_tensor_maps(QArgs &a, CUtensorMap *tx, CUtensorMap *tcd, CUtensorMap *tcs) {
  a.tma = a.tmc = a.tmcs = 0;
  constexpr bool kTma = kTmaTile<DT, QShape<DIRS>::TK>, kGroup = kGroupC<DIRS, SR, UG>;
  if (kTma && a.vec)
    a.tma = hq_tensor_map_2d(tx, DT == HQ_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                             a.x, (uint64_t)a.K, (uint64_t)a.M, (uint64_t)a.K * 2, 64,
                             QShape<DIRS>::TM,
                             CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_128B) == CUDA_SUCCESS;
  if (!kGroup || !a.cdata || a.M % 32 != 0 || ((uintptr_t)a.cdata & 15) != 0) return;
  a.tmc = hq_tensor_map_2d(tcd, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.cdata, (uint64_t)a.M / 2,
                           (uint64_t)a.K, a.cld, ColGroup::kLine, ColGroup::PART,
                           CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_NONE) == CUDA_SUCCESS;
  if (!a.tmc || a.swz || a.csc % 16 != 0 || ((uintptr_t)a.cscale & 15) != 0) return;
  a.tmcs = hq_tensor_map_2d(tcs, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.cscale, (uint64_t)a.M / 16,
                            (uint64_t)a.K, a.csc, 4 * kColGroup, ColGroup::PART,
                            CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE) == CUDA_SUCCESS;
}

/* The amax pass of a per-tensor quantize: max |x| into ramax, and into camax the same (the RHT
   values' amax with rht), each where not NULL. */
AmaxArgs pass_args(const QArgs &q) {
  AmaxArgs am;
  am.x = q.x;
  am.M = q.M;
  am.K = q.K;
  am.vec = q.vec;
  am.x0 = q.ramax;
  am.x1 = q.camax && !q.rht ? q.camax : NULL;
  am.t = q.camax && q.rht ? q.camax : NULL;
  am.mask = q.mask;
  return am;
}

template <int DT, bool RHT, bool SR, int DIRS, bool B2D, int OPT, bool UG = false>
int launch_quantize_t(const hq_call *call, QArgs a) {
  unsigned grid = 0;
  using Sh = QShape<DIRS>;
  constexpr bool kGroup = kGroupC<DIRS, SR, UG>;
  /* both directions: groups of kColGroup tiles along M (ColGroup) */
  int rc = tile_grid(call, a.M, a.K, &grid, kGroup ? Sh::TM * kColGroup : Sh::TM, Sh::TK);
  if (rc) return rc;
  /* as many CTAs as fit on the device at once, each looping over tiles (groups) */
  a.rld = (uint32_t)a.K / 2, a.cld = (uint32_t)a.M / 2;
  a.rsc = (uint32_t)hq_nvfp4_scale_cols(a.K);
  a.csc = (uint32_t)hq_nvfp4_scale_cols(a.M);
  /* the two raw tiles are dynamic shared memory (more than the 48 KiB a kernel gets without
     asking): launch_cuda.h sets the function attributes and counts the resident CTAs once per
     device and kernel */
  const int dyn = kStagesOf<DT, DIRS, SR> * RawTile<DT, Sh::TM, Sh::TK>::kBytes +
                  (kGroup ? 2 * (int)sizeof(ColGroup) : 0) +
                  (kAlign1K<DT, DIRS, SR, UG> ? 1024 : 0);
  CUtensorMap tx{}, tcd{}, tcs{};
  make_tensor_maps<DT, DIRS, SR, UG>(a, &tx, &tcd, &tcs);
  int64_t resident = 0;
  /* the global amaxes not made yet (QArgs.own): a grid of at most one cluster makes them itself
     with rht (kOwn: the kernels the small tensors of both rounding modes take), in one launch
     where the pass and the quantize take two; any other, the pass first */
  constexpr bool kOwn = RHT && !B2D && (DIRS != 3 || SR || UG);
  if (a.own) {
    if constexpr (kOwn) {
      if (grid <= (unsigned)kHqAmaxCluster) {
        constexpr auto kern = quantize_kernel<DT, RHT, SR, DIRS, B2D, OPT, UG, true>;
        CHECK_CUDA(call, (hq_cuda_resident<kern>(kThreads, dyn, &resident)));
        const cudaError_t e = hq_cuda_launch_clusters_dyn(
            kern, grid, grid, kThreads, (size_t)dyn, (cudaStream_t)call->stream, a, tx, tcd, tcs);
        if (e == cudaSuccess) return HQ_OK;
        hq_cuda_resident_forget<kern>(); /* set up again at the next call */
        return call->host->error(HQ_EDEVICE, "nvfp4 CUDA: the quantize kernel as one cluster of "
                                 "%u CTAs: %s", grid, cudaGetErrorString(e));
      }
    }
    if ((rc = launch_amax<DT>(call, pass_args(a)))) return rc;
    a.own = 0;
  }
  constexpr auto kern = quantize_kernel<DT, RHT, SR, DIRS, B2D, OPT, UG, false>;
  CHECK_CUDA(call, (hq_cuda_resident<kern>(kThreads, dyn, &resident)));
  /* UG: a CTA per tile (the kernel's kOne), fewer than 4 per SM, in waves where more than fit */
  if (!UG && (int64_t)grid > resident) grid = (unsigned)resident;
  kern<<<grid, kThreads, dyn, (cudaStream_t)call->stream>>>(a, tx, tcd, tcs);
  if (cudaPeekAtLastError() != cudaSuccess) hq_cuda_resident_forget<kern>();
  CHECK_LAUNCH(call, "nvfp4 quantize kernel");
  return HQ_OK;
}

/* The rowwise copy alone of a small tensor (fewer 32 x 256 tiles than the device has SMs: a
   trainer's activations and gradients at a few hundred rows), element-wise: a thread per
   16-element block, which is 16 consecutive elements of the input and 8 consecutive bytes of the
   data (block b of row-major [M, K / 16] starts at element 16 b and byte 8 b), so a warp reads
   and writes contiguous runs with no shared tile, no barrier and no encode table. The tile
   kernel gives such a tensor a CTA per 8192 elements (8 CTAs for 256 x 256), each a chain of
   copy, encode and store; here the same work is spread over 16-32 CTAs, each thread one load,
   one encode and one store. Every bit is the tile kernel's: the same global constants
   (dir_const_k), block amax, scale code (Head::code), encode multiplier (the function the tile
   kernel tabulates), fast form or rule, and stochastic rounding's draw for block index b. */
constexpr int kRowE = 128; /* threads a CTA: 4096 blocks (256 x 256) are 32 CTAs */
template <int DT, bool SR, int OPT, bool SMALL>
__global__ void __launch_bounds__(kRowE) rowe_kernel(QArgs a) {
  const int kind = OPT ? a.kind : HQ_NVFP4_SCALE_E4M3;
  const bool none = OPT == 1 && a.global == HQ_NVFP4_GLOBAL_NONE;
  const float ga = none ? 0.0f : a.given ? a.given[0] : *a.ramax;
  const DirConst d = dir_const_k(ga, kind, none);
  const Head<OPT> h{nullptr, d.m, 0.0f, kind};
  if (a.given && blockIdx.x == 0 && threadIdx.x == 0) *a.ramax = d.amax;
  const uint64_t offset = q_offset<SR>(a);
  const int64_t nbr = a.K >> 4, nb = a.M * nbr;
  for (int64_t b = (int64_t)blockIdx.x * kRowE + threadIdx.x; b < nb;
       b += (int64_t)gridDim.x * kRowE) {
    float v[16];
    hq_cuda_load8<DT>(a.x, 16 * b, a.vec, v);
    hq_cuda_load8<DT>(a.x, 16 * b + 8, a.vec, v + 8);
    int has_nan;
    const float bamax = block_amax16(v, &has_nan);
    const uint8_t sf = (uint8_t)h.code(hq_mul_rn(bamax, h.m));
    const float enc = hq_nvfp4_encode_mult_k(sf, d.s_dec, kind);
    auto val = [&](int e) { return v[e]; };
    const uint64_t blk = (uint64_t)b;
    const uint2 o = fast_block<SR>(bamax, enc, has_nan)
                        ? encode_fast_any<SR>(val, enc, a.rk, offset, 0u, blk, signs_of(val))
                        : encode_rule<SR>(val, enc, a.rk, offset, 0u, blk);
    store8(a.rdata + 8 * b, o, a.a8);
    int64_t i, kb;
    hq_cuda_row_col<SMALL>(b, nbr, &i, &kb);
    a.rscale[hq_nvfp4_scale_offset(i, kb, a.K, a.swz)] = sf;
  }
}
#ifndef HQ_NVFP4_ROWE /* 0: the tile kernel for the rowwise copy alone at every size (measuring) */
#define HQ_NVFP4_ROWE 1
#endif
/* The rowwise copy alone by rowe_kernel where the tensor has fewer rowwise tiles than the device
   has SMs (1 when it took it, 0 to go on to the tile kernel, or an error); the global amax first
   when the call brought none (the pass, as for the tile kernel). */
template <int DT, bool SR, int OPT> int launch_rowe(const hq_call *call, QArgs a, int *took) {
  *took = 0;
  unsigned tiles = 0;
  int rc = tile_grid(call, a.M, a.K, &tiles, QShape<1>::TM, QShape<1>::TK);
  if (rc || !HQ_NVFP4_ROWE || (int64_t)tiles >= (int64_t)hq_cuda_device_sms(call->device))
    return rc;
  if (a.own) {
    if ((rc = launch_amax<DT>(call, pass_args(a)))) return rc;
    a.own = 0;
  }
  const int64_t nb = a.M * (a.K / 16);
  const unsigned grid = (unsigned)hq_cuda_stride_grid(call->device, (nb + kRowE - 1) / kRowE);
  if (nb < ((int64_t)1 << 32))
    rowe_kernel<DT, SR, OPT, true><<<grid, kRowE, 0, (cudaStream_t)call->stream>>>(a);
  else
    rowe_kernel<DT, SR, OPT, false><<<grid, kRowE, 0, (cudaStream_t)call->stream>>>(a);
  CHECK_LAUNCH(call, "nvfp4 rowwise quantize kernel");
  *took = 1;
  return HQ_OK;
}

/* The kernel for the directions made (1 rowwise, 2 columnwise, 3 both; the RHT is columnwise
   only), so each body holds no branch on them. */
template <int DT, bool RHT, bool SR, bool B2D, int OPT>
int launch_quantize_d(const hq_call *call, const QArgs &a) {
  const int dirs = (a.rdata ? 1 : 0) | (a.cdata ? 2 : 0);
  if (dirs == 0) return HQ_OK;
  if (dirs == 1) {
    if constexpr (!B2D && OPT != 2) { /* block_2d's tile amaxes span 16 rows: the tile kernel */
      int took = 0;
      const int rc = launch_rowe<DT, SR, OPT>(call, a, &took);
      if (rc || took) return rc;
    }
    return launch_quantize_t<DT, false, SR, 1, B2D, OPT>(call, a);
  }
  if (dirs == 2) return launch_quantize_t<DT, RHT, SR, 2, B2D, OPT>(call, a);
  if constexpr (kGroupC<3, SR>) {
    /* fewer groups than SMs: a CTA per tile (kGroupC's UG) */
    unsigned groups = 0;
    int rc = tile_grid(call, a.M, a.K, &groups, QShape<3>::TM * kColGroup, QShape<3>::TK);
    if (rc) return rc;
    if ((int64_t)groups < (int64_t)hq_cuda_device_sms(call->device))
      return launch_quantize_t<DT, RHT, SR, 3, B2D, OPT, true>(call, a);
  }
  return launch_quantize_t<DT, RHT, SR, 3, B2D, OPT>(call, a);
}

/* The kernel for the options: OPT 0 for nvfp4 as shipped (E4M3 scales, one global amax per
   direction), 1 for the other scale type or global_scale = none, 2 for global_scale = row (which
   the configuration refuses with rht and block_2d: no such kernels). */
template <int DT, int OPT> int launch_quantize_o(const hq_call *call, const QArgs &a) {
  if (OPT != 2 && a.rht)
    return a.sr ? launch_quantize_d<DT, OPT != 2, true, false, OPT>(call, a)
                : launch_quantize_d<DT, OPT != 2, false, false, OPT>(call, a);
  if (a.sr) return launch_quantize_d<DT, false, true, false, OPT>(call, a);
  if (OPT != 2 && a.b2d) return launch_quantize_d<DT, false, false, OPT != 2, OPT>(call, a);
  return launch_quantize_d<DT, false, false, false, OPT>(call, a);
}

template <int DT> int launch_quantize(const hq_call *call, const QArgs &a) {
  if (a.global == HQ_NVFP4_GLOBAL_ROW) return launch_quantize_o<DT, 2>(call, a);
  if (a.global == HQ_NVFP4_GLOBAL_NONE || a.kind != HQ_NVFP4_SCALE_E4M3)
    return launch_quantize_o<DT, 1>(call, a);
  return launch_quantize_o<DT, 0>(call, a);
}

/* Whether a quantize takes rowq_kernel (one read): global_scale = row, the rowwise copy alone,
   a 16-byte aligned input whose rows fit a slab buffer (rowq_kernel says why). */
bool rowq_fits(const nvfp4_cfg *cfg, const hq_tensor *src, const nvfp4_dev_dir *row,
               const nvfp4_dev_dir *col) {
  if (cfg->global != HQ_NVFP4_GLOBAL_ROW || !row || col) return false;
  const int64_t esz = src->dtype == HQ_F32 ? 4 : src->dtype == HQ_F16 || src->dtype == HQ_BF16
                                                     ? 2
                                                     : 0;
  return esz && aligned(src->data, 16) && src->cols * esz <= HQ_NVFP4_RQ_SLAB;
}

template <int DT, bool SR, bool UE, bool SMALL> int launch_rowq_t(const hq_call *call, QArgs a) {
  using Sh = RqShape<SR, SMALL>;
  a.rld = (uint32_t)a.K / 2;
  a.rsc = (uint32_t)hq_nvfp4_scale_cols(a.K);
  const int64_t rows = Sh::template kElems<DT> / a.K;
  a.rq_rows = (uint32_t)(rows < kRqMaxRows ? rows : kRqMaxRows);
  const int64_t nslab = (a.M + a.rq_rows - 1) / a.rq_rows;
  const int dyn = Sh::kStages * Sh::kSlab;
  int64_t resident = 0;
  CHECK_CUDA(call,
             (hq_cuda_resident<rowq_kernel<DT, SR, UE, SMALL>>(kThreads, dyn, &resident)));
  const unsigned grid = (unsigned)(nslab < resident ? nslab : resident);
  rowq_kernel<DT, SR, UE, SMALL><<<grid, kThreads, dyn, (cudaStream_t)call->stream>>>(a);
  if (cudaPeekAtLastError() != cudaSuccess)
    hq_cuda_resident_forget<rowq_kernel<DT, SR, UE, SMALL>>();
  CHECK_LAUNCH(call, "nvfp4 row-scaled rowwise quantize kernel");
  return HQ_OK;
}
/* specialized on the scale type too (its code and its table's exponent), a kernel argument
   elsewhere; rows that fit the half-size slabs take them (round to nearest) */
template <int DT, bool SR, bool UE> int launch_rowq_s(const hq_call *call, const QArgs &a) {
  if constexpr (!SR) {
    if (a.K * (DT == HQ_F32 ? 4 : 2) <= RqShape<false, true>::kSlab)
      return launch_rowq_t<DT, SR, UE, true>(call, a);
  }
  return launch_rowq_t<DT, SR, UE, false>(call, a);
}
template <int DT, bool SR> int launch_rowq_k(const hq_call *call, const QArgs &a) {
  return a.kind == HQ_NVFP4_SCALE_UE5M3 ? launch_rowq_s<DT, SR, true>(call, a)
                                        : launch_rowq_s<DT, SR, false>(call, a);
}
template <int DT> int launch_rowq(const hq_call *call, const QArgs &a) {
  return a.sr ? launch_rowq_k<DT, true>(call, a) : launch_rowq_k<DT, false>(call, a);
}

} // namespace

#ifdef HQ_NVFP4_TU_DT /* nvfp4_f16.cu or nvfp4_bf16.cu: this dtype's launches, nothing else */
namespace hq_nvfp4_cuda {
template <> int quantize<HQ_NVFP4_TU_DT>(const hq_call *call, const QArgs &a) {
  return launch_quantize<HQ_NVFP4_TU_DT>(call, a);
}
template <> int rowq<HQ_NVFP4_TU_DT>(const hq_call *call, const QArgs &a) {
  return launch_rowq<HQ_NVFP4_TU_DT>(call, a);
}
} // namespace hq_nvfp4_cuda
#else
namespace {

template <int DT> int launch_dequantize(const hq_call *call, const DArgs &a) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  if (!a.colwise) {
    if (a.K % 16 != 0)
      return call->host->error(HQ_ESHAPE, "nvfp4 CUDA dequantize: K = %lld is not a multiple of 16",
                               (long long)a.K);
    const int64_t nrun = a.M * a.K / 16;
    int64_t blocks = (nrun + kThreads - 1) / kThreads;
    blocks = hq_cuda_stride_grid(call->device, blocks);
    if ((uint64_t)(a.M * a.K) < ((uint64_t)1 << 32))
      dequantize_rows_kernel<DT, true><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
    else
      dequantize_rows_kernel<DT, false><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
    CHECK_LAUNCH(call, "nvfp4 rowwise dequantize kernel");
    return HQ_OK;
  }
  unsigned grid = 0;
  int rc = tile_grid(call, a.M, a.K, &grid, kDcM, kDcK);
  if (rc) return rc;
  dequantize_kernel<DT><<<grid, kDcK, 0, stream>>>(a);
  CHECK_LAUNCH(call, "nvfp4 columnwise dequantize kernel");
  return HQ_OK;
}

/* Zero a scale buffer that has padding entries (those the kernels do not write). */
int zero_padding(const hq_call *call, uint8_t *scale, int64_t R, int64_t C) {
  if (hq_nvfp4_scale_rows(R) == R && hq_nvfp4_scale_cols(C) == C / 16) return HQ_OK;
  const size_t bytes = (size_t)(hq_nvfp4_scale_rows(R) * hq_nvfp4_scale_cols(C));
  if (bytes) CHECK_CUDA(call, cudaMemsetAsync(scale, 0, bytes, (cudaStream_t)call->stream));
  return HQ_OK;
}

/* Pass 1 of a quantize with global_scale = row: the per-row amax buffers given (NULL: not
   made; rowwise [M], columnwise [K]) zeroed, then row_amax_kernel fills them. */
int row_amax_pass(const hq_call *call, const hq_tensor *src, float *row, float *col) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  const int64_t M = src->rows, K = src->cols;
  if (row) CHECK_CUDA(call, cudaMemsetAsync(row, 0, (size_t)M * sizeof(float), stream));
  if (col) CHECK_CUDA(call, cudaMemsetAsync(col, 0, (size_t)K * sizeof(float), stream));
  if (M == 0 || K == 0 || (!row && !col)) return HQ_OK;
  const int64_t grid = ((K + kRaTK - 1) / kRaTK) * ((M + kRaBand - 1) / kRaBand);
  if (grid > 0x7fffffff)
    return call->host->error(HQ_ESHAPE, "nvfp4 CUDA: shape [%lld, %lld] needs more row-amax "
                             "blocks than a grid holds", (long long)M, (long long)K);
  RowAmaxArgs a = {src->data, M, K, aligned(src->data, 16), row, col};
  switch (src->dtype) {
  case HQ_F32:
    row_amax_kernel<HQ_F32><<<(unsigned)grid, kThreads, 0, stream>>>(a);
    break;
  case HQ_F16:
    row_amax_kernel<HQ_F16><<<(unsigned)grid, kThreads, 0, stream>>>(a);
    break;
  case HQ_BF16:
    row_amax_kernel<HQ_BF16><<<(unsigned)grid, kThreads, 0, stream>>>(a);
    break;
  default:
    return call->host->error(HQ_EINVAL, "nvfp4 CUDA: source dtype %d", (int)src->dtype);
  }
  CHECK_LAUNCH(call, "nvfp4 row amax kernel");
  return HQ_OK;
}

} // namespace

extern "C" int nvfp4_cuda_amax(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                               uint32_t dirs, float *out) {
  /* a direction not asked for reads 0, as does the amax of no element, zeroed by a kernel (a
     memset node costs a captured step about twice as much); the asked directions of a tensor
     are written by the pass alone */
  const bool empty = src->rows == 0 || src->cols == 0;
  float *zr = (empty || !(dirs & HQ_ROWWISE)) ? out : NULL;
  float *zc = (empty || !(dirs & HQ_COLWISE)) ? out + 1 : NULL;
  if (zr || zc) CHECK_CUDA(call, hq_cuda_zero_words(zr, zc, NULL, (cudaStream_t)call->stream));
  if (zr && zc) return HQ_OK; /* nothing left to reduce */
  AmaxArgs a;
  a.x = src->data;
  a.M = src->rows;
  a.K = src->cols;
  a.vec = aligned(src->data, 16);
  a.x0 = (dirs & HQ_ROWWISE) ? out : NULL;
  a.x1 = ((dirs & HQ_COLWISE) && !cfg->rht) ? out + 1 : NULL;
  a.t = ((dirs & HQ_COLWISE) && cfg->rht) ? out + 1 : NULL;
  a.mask = cfg->rht_sign_mask;
  return amax_dispatch(call, src->dtype, a);
}

namespace {

/* The quantize kernels' arguments for every configuration (the one place QArgs is filled):
   the directions whose pointer is not NULL, the options of cfg, the caller's amaxes `given`
   (NULL: the amax buffers hold them; unused with global_scale = row or none). */
QArgs quantize_args(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                    const nvfp4_dev_dir *row, const nvfp4_dev_dir *col, const float *given) {
  QArgs a = QArgs();
  a.x = src->data;
  a.M = src->rows;
  a.K = src->cols;
  a.vec = aligned(src->data, 16);
  a.rdata = row ? row->data : NULL;
  a.rscale = row ? row->scale : NULL;
  a.ramax = row ? row->amax : NULL;
  a.cdata = col ? col->data : NULL;
  a.cscale = col ? col->scale : NULL;
  a.camax = col ? col->amax : NULL;
  a.a8 = (!row || aligned(row->data, 8)) && (!col || aligned(col->data, 8));
  a.a4 = (!row || aligned(row->scale, 4)) && (!col || aligned(col->scale, 4));
  a.given = given;
  a.rht = cfg->rht;
  a.sr = cfg->sr;
  a.b2d = cfg->block_2d;
  a.swz = cfg->swizzle;
  a.kind = cfg->scale_kind;
  a.global = cfg->global;
  a.mask = cfg->rht_sign_mask;
  a.seed = cfg->seed ? cfg->seed : call->seed;
  hq_nvfp4_sr_keys(a.seed, a.rk);
  a.offset = call->offset;
  a.offset_dev = hq_call_offset_dev(call);
  if (a.offset_dev) { /* the fields of a 2.6 call: an older core's ends before them */
    a.role_key = call->role_key;
    a.role_count = call->role_count;
  }
  return a;
}

/* A quantize of no elements: the per-tensor amax buffers get the given amaxes, or 0 (the
   per-row ones of global_scale = row hold no entry for an empty direction but are zeroed by
   row_amax_pass; global_scale = none has none). */
int empty_amaxes(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                 const nvfp4_dev_dir *row, const nvfp4_dev_dir *col) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  if (cfg->global == HQ_NVFP4_GLOBAL_ROW)
    return row_amax_pass(call, src, row ? row->amax : NULL, col ? col->amax : NULL);
  if (cfg->global == HQ_NVFP4_GLOBAL_NONE) return HQ_OK;
  const float *given = call->amax;
  const nvfp4_dev_dir *d[2] = {row, col};
  for (int j = 0; j < 2; j++) {
    if (!d[j]) continue;
    if (given)
      CHECK_CUDA(call, cudaMemcpyAsync(d[j]->amax, given + j, sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream));
    else
      CHECK_CUDA(call, cudaMemsetAsync(d[j]->amax, 0, sizeof(float), stream));
  }
  return HQ_OK;
}

} // namespace

extern "C" int nvfp4_cuda_quantize(const nvfp4_cfg *cfg, const hq_call *call, const hq_tensor *src,
                                   const nvfp4_dev_dir *row, const nvfp4_dev_dir *col) {
  const int64_t M = src->rows, K = src->cols;
  /* the quantize kernel's offsets take 32-bit factors (QArgs): refused before anything runs */
  if (M >= ((int64_t)1 << 31) || K >= ((int64_t)1 << 31))
    return call->host->error(HQ_ESHAPE,
                             "nvfp4 CUDA quantize: shape [%lld, %lld] has a dimension of 2^31 or "
                             "more", (long long)M, (long long)K);
  int rc;
  if (row && (rc = zero_padding(call, row->scale, M, K))) return rc;
  if (col && (rc = zero_padding(call, col->scale, K, M))) return rc;
  if (M == 0 || K == 0) return empty_amaxes(cfg, call, src, row, col);
  if (rowq_fits(cfg, src, row, col)) { /* one read: the row amaxes made on chip */
    const QArgs a = quantize_args(cfg, call, src, row, col, NULL);
    switch (src->dtype) {
    case HQ_F32:
      return launch_rowq<HQ_F32>(call, a);
    case HQ_F16:
      return hq_nvfp4_cuda::rowq<HQ_F16>(call, a);
    default:
      return hq_nvfp4_cuda::rowq<HQ_BF16>(call, a);
    }
  }
  /* the global amaxes into the storages' amax buffers -- per stored row with global_scale =
     row (a pass first); per direction unless the call brings them (the launcher, own); none
     without a global scale */
  const float *given = cfg->global == HQ_NVFP4_GLOBAL_TENSOR ? call->amax : NULL;
  if (cfg->global == HQ_NVFP4_GLOBAL_ROW &&
      (rc = row_amax_pass(call, src, row ? row->amax : NULL, col ? col->amax : NULL)))
    return rc;
  QArgs a = quantize_args(cfg, call, src, row, col, given);
  a.own = cfg->global == HQ_NVFP4_GLOBAL_TENSOR && !given;
  switch (src->dtype) {
  case HQ_F32:
    return launch_quantize<HQ_F32>(call, a);
  case HQ_F16:
    return hq_nvfp4_cuda::quantize<HQ_F16>(call, a);
  case HQ_BF16:
    return hq_nvfp4_cuda::quantize<HQ_BF16>(call, a);
  default:
    return call->host->error(HQ_EINVAL, "nvfp4 CUDA: source dtype %d", (int)src->dtype);
  }
}

namespace {

/* The kernel arguments of dequantize d. */
DArgs deq_args(const nvfp4_deq *d) {
  DArgs a = DArgs();
  a.amax = d->amax;
  a.kind = d->kind;
  a.global = d->global;
  a.fout = d->raw ? d->fout : NULL;
  a.fin = d->fin;
  a.fmul = d->fmul;
  a.rfout = d->raw && d->rf_n > 0 ? d->rfout : NULL;
  a.rf_amax = d->rf_amax;
  a.rf_n = d->rf_n;
  a.q = d->q;
  a.scale = d->scale;
  a.colwise = d->colwise;
  a.swz = d->swizzle;
  a.rht = d->rht && !d->raw; /* a raw RHT copy stays in the transformed domain */
  a.raw = d->raw;
  a.mask = d->mask;
  a.dst = d->dst->data;
  a.M = d->dst->rows;
  a.K = d->dst->cols;
  a.vec = aligned(d->q, 8) && aligned(a.dst, 16) && a.M % 16 == 0 && a.K % 16 == 0;
  return a;
}

/* CTAs of one part of the pair kernel (128 threads): a rowwise part's grid-stride grid, a
   columnwise part's tiles; 0 when the part cannot be one (K % 16 != 0 rowwise). */
int64_t pair_ctas(const hq_call *call, const DArgs &a) {
  if (a.colwise) return ((a.M + kDcM - 1) / kDcM) * ((a.K + kDcK - 1) / kDcK);
  if (a.K % 16 != 0) return 0;
  return hq_cuda_stride_grid(call->device, (a.M * a.K / 16 + kDcK - 1) / kDcK);
}

template <int DT> int launch_pair(const hq_call *call, const DArgs &a, const DArgs &b,
                                  unsigned na, unsigned n) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  if ((uint64_t)(a.M * a.K) < ((uint64_t)1 << 32) && (uint64_t)(b.M * b.K) < ((uint64_t)1 << 32))
    dequantize_pair_kernel<DT, true><<<n, kDcK, 0, stream>>>(a, b, na);
  else
    dequantize_pair_kernel<DT, false><<<n, kDcK, 0, stream>>>(a, b, na);
  CHECK_LAUNCH(call, "nvfp4 pair dequantize kernel");
  return HQ_OK;
}

} // namespace

extern "C" int nvfp4_cuda_dequantize_pair(const hq_call *call, const nvfp4_deq *da,
                                          const nvfp4_deq *db) {
  const hq_tensor *ta = da->dst, *tb = db->dst;
  if (ta->dtype != tb->dtype || ta->rows * ta->cols == 0 || tb->rows * tb->cols == 0 ||
      (da->raw && da->rfout && da->rf_n > 0) || (db->raw && db->rfout && db->rf_n > 0))
    return HQ_ENOTSUP;
  const DArgs a = deq_args(da), b = deq_args(db);
  const int64_t na = pair_ctas(call, a), nb = pair_ctas(call, b);
  if (na == 0 || nb == 0 || na + nb > 0x7fffffff) return HQ_ENOTSUP;
  switch (ta->dtype) {
  case HQ_F32: return launch_pair<HQ_F32>(call, a, b, (unsigned)na, (unsigned)(na + nb));
  case HQ_F16: return launch_pair<HQ_F16>(call, a, b, (unsigned)na, (unsigned)(na + nb));
  case HQ_BF16: return launch_pair<HQ_BF16>(call, a, b, (unsigned)na, (unsigned)(na + nb));
  default: return HQ_ENOTSUP;
  }
}

extern "C" int nvfp4_cuda_dequantize(const hq_call *call, const nvfp4_deq *d) {
  const hq_tensor *dst = d->dst;
  DArgs a = deq_args(d);
  if (dst->rows == 0 || dst->cols == 0) {
    if (!a.fout && !a.rfout) return HQ_OK;
    const int64_t nb = (a.rf_n + 255) / 256 < 1024 ? (a.rf_n + 255) / 256 : 1024;
    factor_kernel<<<a.rfout ? (unsigned)nb : 1u, 256, 0, (cudaStream_t)call->stream>>>(a);
    CHECK_LAUNCH(call, "nvfp4 factor kernel");
    return HQ_OK;
  }
  switch (dst->dtype) {
  case HQ_F32:
    return launch_dequantize<HQ_F32>(call, a);
  case HQ_F16:
    return launch_dequantize<HQ_F16>(call, a);
  case HQ_BF16:
    return launch_dequantize<HQ_BF16>(call, a);
  default:
    return call->host->error(HQ_EINVAL, "nvfp4 CUDA: destination dtype %d", (int)dst->dtype);
  }
}

extern "C" int nvfp4_cuda_tensor_factor(const hq_call *call, const float *amax, int kind,
                                        int global, float *out) {
  tensor_factor_kernel<<<1, 1, 0, (cudaStream_t)call->stream>>>(amax, kind, global, out);
  CHECK_LAUNCH(call, "nvfp4 tensor factor kernel");
  return HQ_OK;
}

extern "C" int nvfp4_cuda_memset(const hq_call *call, void *p, size_t bytes) {
  CHECK_CUDA(call, cudaMemsetAsync(p, 0, bytes, (cudaStream_t)call->stream));
  return HQ_OK;
}

#endif /* HQ_NVFP4_TU_DT */
