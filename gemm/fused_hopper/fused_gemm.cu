/*
** fused_gemm.cu -- the fused_hopper provider's kernel: the emulated GEMM with one operand's
** dequantize fused into the GEMM (Hopper, sm_90a only: wgmma, TMA and mbarriers),
** hqi_fused_gemm().
**
** Why: on Hopper the tensor cores have no MXFP8 mode, so the emulated path dequantizes both
** operands to BF16 and calls cuBLASLt. When one operand is much larger than the other (a
** 16384 x 4096 activation times a 1024 x 4096 weight), writing and reading back its BF16 copy
** costs as much as a third of the GEMM. Here that operand X is read as it is stored -- MXFP8
** codes (E4M3 or E5M2, [rows, K] with K contiguous) and E8M0 scales per 1x32 block, or NVFP4
** codes (E2M1, [rows, K / 2], two per byte) and E4M3 scales per 1x16 block; scales compact
** ([roundup(rows, 128)][ld] bytes) or in the 128x4-tile swizzle -- and turned into BF16 in
** registers right before the tensor cores use it; the other operand W is BF16 [nw, K] with K
** contiguous (the core dequantizes it as for the emulated path). Result: D(i, j) = alpha * f0 *
** f1 * sum_k X(i, k) W(j, k) (+ beta * D(i, j)) (+ bias), i over X's rows, j over W's rows, D
** column-major with X's rows as D's m (x_is_m) or its n; f0 / f1 the per-tensor factors (NVFP4's
** global scale), A's first.
**
** Every X value the tensor cores see is RN_bf16(code * 2^(e-127)) computed as the emulated path's
** dequantize computes it (exact except far below FP32's normal range, hq_mxfp8_dequantize_fast's
** comment): the code's bits placed into a BF16 word (value * 2^-120, E4M3; 2^-112, E5M2; subnormal
** codes on BF16 subnormals) and multiplied by 2^(e-7) (E4M3; 2^(e+112-127) E5M2) in one BF16
** multiply when that factor is a BF16 normal for every scale a warp holds in a k-step, else by
** 2^120 / 2^112 and then 2^(e-127): each BF16 multiply of exact values rounds once, so either way
** the result is the exact product rounded once to BF16 (tests/test_gpu_gemm.c test_fused_exact
** compares the values the kernel multiplies with the dequantize, bit for bit, over codes and
** scales of every binade from 2^-120 to 2^120; the conversion was also checked on an H100 for
** every (code, scale) pair, outside the test suite). A k-step that holds a NaN code (E4M3 0x7f /
** 0xff, E5M2 Inf and NaN) takes the rule itself (hq_fp8_to_f32 * hq_e8m0_to_f32, then
** hq_f32_to_bf16). NVFP4's values are the raw values e2m1 * fp32(sf) times 2^-9 (exact; alpha
** carries the 2^9): the code's bits placed into a BF16 word (value * 2^-126) times s * 2^117,
** itself made exactly from the scale's bits (fragment<HQ_E2M1X2>); a warp holding a NaN or
** negative scale takes the rule. So the fused path multiplies the same BF16 values as the
** emulated path (NVFP4's scaled by a power of two) and accumulates in FP32: results equal the
** exact product up to the order of accumulation, like every emulated path. MXFP4 (E2M1 codes as
** NVFP4's, E8M0 scales per 32) and MXFP6 (E3M2 / E2M3 codes four in three bytes, stages of
** 48-byte unswizzled rows) use mx_rules.h's BF16 dequantize (hq_mx_dequantize_bf16x2's form): the
** code's bits placed into a BF16 word, times 2^(e - bias) in one multiply, or 2^(127 - bias) and
** then 2^(e - 127); their scales are read a byte at a time (any K / 32; rows past the storage's
** read its last row's, the codes there being the TMA's zeros).
**
** The kernel: a CTA computes a 128 x 256 tile of (i, j) with three warpgroups. Warpgroup 0 (one
** thread) streams K in steps of 64 through a 5-stage ring of shared memory with TMA: X's 128 x 64
** codes (64-byte swizzle) and W's 256 x 64 BF16 values (128-byte swizzle, the layout wgmma reads),
** each stage guarded by a "full" and an "empty" mbarrier (NVFP4: 32-byte rows with 32-byte
** swizzle, 6 stages). Warpgroups 1 and 2 own 64 rows each: per step a thread reads its 32 codes
** from shared memory (2-byte loads, or NVFP4's 16-byte ones, conflict-free thanks to the
** swizzle) a step before it converts them, and its 4 (NVFP4: 8) scales from global memory two
** steps before, builds the wgmma A fragment (bf16x2 registers, double-buffered), and issues four
** m64n256k16 wgmmas with A from registers; the fragment of step k+1 is built while the tensor
** cores run step k. That conversion, not the tensor cores, bounds the kernel (ncu, H100: two
** consumer warps per scheduler, most of their stalls waits on the previous instruction of a
** dependent chain), so the loop keeps everything else out of it: ring positions and wgmma
** descriptors advance by additions (no division by the ring's depth), the code offsets, the
** shared-window addresses of the stages and barriers and the scale pointers stay in registers
** and advance by additions (a generic-to-shared conversion costs an S2R of the CTA's id on the
** chain every step), the scale slots are fixed by running steps in pairs, and the special-code
** test is one packed maximum per pair (docs/performance.md has what each of these gave). The
** epilogue stages the FP32 tile
** in shared memory and writes D with 16-byte stores along its contiguous dimension, adding
** beta * D and the bias in FP32 and rounding once (the convert instruction, as cuBLASLt rounds
** the emulated path's D).
**
** Limits (hqi_fused_gemm returns HQ_ENOTSUP, the caller takes the unfused emulated path): a
** device of compute capability 9.0, K % 32 == 0 (MXFP6: K % 64 == 0), 16-byte aligned X, W and
** scales (MXFP4 / MXFP6: any scale alignment, compact scales only), dimensions below 2^31. This file is compiled for sm_90a alone (Makefile.am); every CUDA status is checked.
*/
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "hq/numerics.h"
#include "hq/plugin.h"
/* The decode rules are the formats' own (the one definition their CPU references and kernels
   share); the kernel's fast conversions are checked against them bit for bit. */
#include "mx/mx_rules.h"
#include "mxfp8/mxfp8_rules.h"
#include "nvfp4/nvfp4_rules.h"
#include "tma_cuda.h" /* the TMA, its mbarriers, the driver's tensor-map encoder */

#include "fused_gemm.h"

namespace {

constexpr int kBM = HQI_FUSED_TILE_X, kBN = HQI_FUSED_TILE_W, kBK = 64;
constexpr int kBBytes = kBN * kBK * 2; /* W values per stage */
constexpr int kLdI = 68;               /* staging stride, lines of 64 i (x_is_m) */
constexpr int kLdJ = 260;              /* staging stride, lines of 256 j */
constexpr int kCW = 24;                /* code words a thread holds per k-step (MXFP6's two rows) */

/* The kernel's storage kinds: the element dtype (HQ_E4M3 / HQ_E5M2: MXFP8; HQ_E2M1X2: NVFP4;
   HQ_E3M2X4 / HQ_E2M3X4: MXFP6), and kMx4 for MXFP4 (E2M1 codes as NVFP4's, E8M0 scales per 32). */
constexpr int kMx4 = 0x100 | HQ_E2M1X2;
/* MXFP4 / MXFP6: the element kind of mx_rules.h, else 0 */
__host__ __device__ constexpr int mx_kind(int f) {
  return f == kMx4 ? HQ_E2M1X2 : f == HQ_E3M2X4 || f == HQ_E2M3X4 ? f : 0;
}

/* Per storage kind: the bytes of one X row per 64-wide k-step (its TMA box and swizzle span), the
   ring's depth, the bytes of scales per row and k-step. */
template <int ELEM> struct Fmt {     /* MXFP8: one byte per code, two E8M0 scales per k-step */
  static constexpr int row = 64, stages = 5, sbytes = 2;
};
template <> struct Fmt<HQ_E2M1X2> { /* NVFP4: two codes per byte, four E4M3 scales per k-step */
  static constexpr int row = 32, stages = 6, sbytes = 4;
};
template <> struct Fmt<kMx4> {      /* MXFP4: two codes per byte, two E8M0 scales per k-step */
  static constexpr int row = 32, stages = 6, sbytes = 2;
};
template <> struct Fmt<HQ_E3M2X4> { /* MXFP6: four codes in three bytes (no swizzle: 48-byte rows) */
  static constexpr int row = 48, stages = 5, sbytes = 2;
};
template <> struct Fmt<HQ_E2M3X4> : Fmt<HQ_E3M2X4> {};
template <int ELEM> __host__ __device__ constexpr int a_bytes() { /* X per stage */
  return kBM * Fmt<ELEM>::row;
}
template <int ELEM> __host__ __device__ constexpr int smem_bytes() {
  return Fmt<ELEM>::stages * (a_bytes<ELEM>() + kBBytes) + 1024 /* alignment */ + 128 /* bars */;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HQ_FUSED_SM90A 1
#else
#define HQ_FUSED_SM90A 0
#endif

__device__ __forceinline__ uint32_t su32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

struct Params {
  const uint8_t *xs; /* scales */
  int64_t xs_ld;
  int xs_swz;        /* the 128x4-tile swizzled layout (hq_swizzle_offset), else row-major */
  int mx, nw, k;
  int x_is_m, vec_ok, d_f32;
  void *d;
  int64_t ldd;
  float alpha, beta;
  const float *f0, *f1;
  const void *bias;
  int bias_f32;
};

/* The PTX helpers and the conversions (to the matching #endif) exist in the sm_90a pass alone:
   only the kernel body uses them. */
#if HQ_FUSED_SM90A
#include "wgmma_m64n256k16.h"

/* Shared-memory loads at a shared-window address (the codes of a stage) */
__device__ __forceinline__ uint32_t lds_u16(uint32_t a) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds_v4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* keep the compiler from moving register reads and writes across the asynchronous wgmma */
__device__ __forceinline__ void pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void pin(uint64_t &r) { asm volatile("" : "+l"(r)::"memory"); }

/* wgmma descriptor of a K-major BF16 tile with 128-byte swizzle: rows of 128 bytes, 8-row groups
   1024 bytes apart */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(a), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t prmt2(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

/* Per element kind: the shift of the code's 7 magnitude bits in a BF16 word, the power of two
   that word's value is short of the code's (SH), the BF16 pair 2^SH, and the special-code test
   (a carry into bit TEST of each half when the magnitude is NaN / Inf). */
template <int ELEM> struct Kind;
template <> struct Kind<HQ_E4M3> {
  static constexpr uint32_t mask = 0x87f087f0u, shift = 4, sh = 120, pre = 0x7B807B80u,
                            add = 0x00100010u, test = 0x08000800u, one_max = 254 - 120;
};
template <> struct Kind<HQ_E5M2> {
  static constexpr uint32_t mask = 0x8fe08fe0u, shift = 5, sh = 112, pre = 0x77807780u,
                            add = 0x00800080u, test = 0x10001000u, one_max = 254 - 112;
};

/* 2^(e - 127 + sh) as a BF16 pair (e = 255: NaN; e = 0, sh = 0: the subnormal 2^-127) */
__device__ __forceinline__ uint32_t scale_pair(uint32_t e, uint32_t sh) {
  const uint32_t b = e == 255 ? 0x7fc0u : (e == 0 && sh == 0 ? 0x40u : (e + sh) << 7);
  return b * 0x10001u;
}

/* Two codes (low byte first) as BF16 bits of value * 2^-SH: each code sign-extended to 16 bits by
   one byte permute, shifted, masked. */
template <int ELEM> __device__ __forceinline__ uint32_t raw_pair(uint32_t h) {
  return (prmt(h, 0x9180u) << Kind<ELEM>::shift) & Kind<ELEM>::mask;
}
/* The larger magnitude of each half of two BF16 pairs (the raw pairs: finite, never NaN) */
__device__ __forceinline__ uint32_t absmax2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

/* The rule (RN(fp32(code) * 2^(e-127)), MXFP8's dequantize, then RN to BF16) for a pair: a k-step
   with special codes. */
template <int ELEM>
__device__ __forceinline__ uint32_t rule_pair(uint32_t h, uint8_t e) {
  const float lo = hq_mxfp8_dequantize((uint8_t)(h & 0xff), e, ELEM);
  const float hi = hq_mxfp8_dequantize((uint8_t)(h >> 8), e, ELEM);
  return (uint32_t)hq_f32_to_bf16(lo) | (uint32_t)hq_f32_to_bf16(hi) << 16;
}


/* A thread's share of a k-step's fragment: rows r and r + 8 of its warp, the codes at k = 2t,
   2t+1, 2t+8, 2t+9 of each 16-wide substep; their byte offsets in a stage (64-byte swizzle). */
template <int ELEM> __device__ __forceinline__ void code_offsets(int r, int t, uint32_t (&o)[4]) {
  const int sw = (r >> 1) & 3;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) o[kk] = r * 64 + ((kk ^ sw) << 4) + 2 * t;
}
/* A thread's codes of one k-step from the stage at shared address sa, at its offsets o
   (code_offsets, computed once) */
template <int ELEM>
__device__ __forceinline__ void codes(uint32_t sa, const uint32_t (&o)[4], uint32_t (&h)[kCW]) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint32_t b0 = sa + o[kk], b1 = b0 + 8 * 64;
    h[4 * kk + 0] = lds_u16(b0);
    h[4 * kk + 1] = lds_u16(b1);
    h[4 * kk + 2] = lds_u16(b0 + 8);
    h[4 * kk + 3] = lds_u16(b1 + 8);
  }
}
template <int ELEM>
__device__ __forceinline__ void fragment(const uint32_t (&h)[kCW], int t, uint32_t e0, uint32_t e1,
                                         uint32_t (&fa)[16]) {
  using KD = Kind<ELEM>;
  (void)t;
#pragma unroll
  for (int i = 0; i < 16; i++) fa[i] = raw_pair<ELEM>(h[i]);
  /* The special codes (NaN, and Inf for E5M2) are the largest magnitudes a code can have, so
     the step holds one iff the largest raw magnitude reaches them: a tree of packed maxima (15
     instructions, one per pair, against two per pair for testing every pair), then the carry
     test into bit TEST of either half. */
  uint32_t m8[8];
#pragma unroll
  for (int i = 0; i < 8; i++) m8[i] = absmax2(fa[2 * i], fa[2 * i + 1]);
  const uint32_t mx = absmax2(absmax2(absmax2(m8[0], m8[1]), absmax2(m8[2], m8[3])),
                              absmax2(absmax2(m8[4], m8[5]), absmax2(m8[6], m8[7])));
  const uint32_t special = (mx & 0x7fff7fffu) + KD::add;
  const uint32_t s00 = e0 & 0xff, s01 = e0 >> 8, s10 = e1 & 0xff, s11 = e1 >> 8;
  const uint32_t emax = max(max(s00, s01), max(s10, s11));
  if (!__any_sync(0xffffffffu, emax > KD::one_max)) {
    /* every e + sh is a BF16 normal exponent here (neither NaN nor subnormal): one multiply-add */
    const uint32_t f00 = s00 * 0x00800080u + KD::sh * 0x00800080u;
    const uint32_t f01 = s01 * 0x00800080u + KD::sh * 0x00800080u;
    const uint32_t f10 = s10 * 0x00800080u + KD::sh * 0x00800080u;
    const uint32_t f11 = s11 * 0x00800080u + KD::sh * 0x00800080u;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t fa0 = kk < 2 ? f00 : f01, fb0 = kk < 2 ? f10 : f11;
      fa[4 * kk + 0] = bmul2(fa[4 * kk + 0], fa0);
      fa[4 * kk + 1] = bmul2(fa[4 * kk + 1], fb0);
      fa[4 * kk + 2] = bmul2(fa[4 * kk + 2], fa0);
      fa[4 * kk + 3] = bmul2(fa[4 * kk + 3], fb0);
    }
  } else {
    const uint32_t f00 = scale_pair(s00, 0), f01 = scale_pair(s01, 0);
    const uint32_t f10 = scale_pair(s10, 0), f11 = scale_pair(s11, 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t fa0 = kk < 2 ? f00 : f01, fb0 = kk < 2 ? f10 : f11;
      fa[4 * kk + 0] = bmul2(bmul2(fa[4 * kk + 0], KD::pre), fa0);
      fa[4 * kk + 1] = bmul2(bmul2(fa[4 * kk + 1], KD::pre), fb0);
      fa[4 * kk + 2] = bmul2(bmul2(fa[4 * kk + 2], KD::pre), fa0);
      fa[4 * kk + 3] = bmul2(bmul2(fa[4 * kk + 3], KD::pre), fb0);
    }
  }
  if (special & KD::test) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint8_t ea = (uint8_t)(kk < 2 ? s00 : s01), eb = (uint8_t)(kk < 2 ? s10 : s11);
      fa[4 * kk + 0] = rule_pair<ELEM>(h[4 * kk + 0], ea);
      fa[4 * kk + 1] = rule_pair<ELEM>(h[4 * kk + 1], eb);
      fa[4 * kk + 2] = rule_pair<ELEM>(h[4 * kk + 2], ea);
      fa[4 * kk + 3] = rule_pair<ELEM>(h[4 * kk + 3], eb);
    }
  }
}

/* NVFP4: two E2M1 codes (the low and high nibble of byte t of w) as BF16 bits of value * 2^-126:
   the nibbles' sign bits sign-extended by one byte permute (the low nibble from w << 4), the
   three magnitude bits moved to bits 6..8 of each half (exponent 0..3 and one mantissa bit; the
   code 0.5 lands on the BF16 subnormal 2^-127), everything else masked off. sel = t | (t + 8) << 4
   | (t + 4) << 8 | (t + 12) << 12. */
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w, uint32_t sel) {
  return (prmt2(w << 4, w, sel) << 2) & 0x81c081c0u;
}

/* NVFP4's rule for the pair (byte nb of codes, E4M3 scale sf): the raw values
   RN(e2m1 * fp32(sf)) (exact, or NaN) times 2^-9, in BF16 (a k-step whose warp holds a NaN or
   negative scale). */
__device__ __forceinline__ uint32_t nv_rule_pair(uint32_t nb, uint32_t sf) {
  const float sc = hq_nvfp4_raw_mult((uint8_t)sf);
  const float lo = hq_mul_rn(hq_nvfp4_dequantize(nb & 15u, sc), 0x1p-9f);
  const float hi = hq_mul_rn(hq_nvfp4_dequantize((nb >> 4) & 15u, sc), 0x1p-9f);
  return (uint32_t)hq_f32_to_bf16(lo) | (uint32_t)hq_f32_to_bf16(hi) << 16;
}

/* NVFP4's fragment: X values as RN(e2m1 * fp32(sf)) * 2^-9 (exact: at most 6 significant bits,
   magnitudes 2^-19 .. 5.25; the epilogue multiplies alpha by 2^9). Rows r and r + 8 of a stage of
   32-byte rows (32-byte swizzle: 16-byte halves swapped on rows with bit 2 set); e0 / e1 hold the
   rows' four 16-block scales of the k-step (low byte first). Per k-substep the two rows' scales
   become s * 2^-120 in BF16 by placing the E4M3 bits (subnormals on BF16 subnormals, zero on
   zero), then times 2^120 and 2^117: s * 2^117, every factor exact; code * 2^-126 times that is
   the value * 2^-9, rounded once and exact. A warp holding a NaN or negative scale (never
   written by the nvfp4 plugin) takes the rule instead. */
template <>
__device__ __forceinline__ void code_offsets<HQ_E2M1X2>(int r, int t, uint32_t (&o)[4]) {
  (void)t;
  const int sw = (r >> 2) & 1;
  o[0] = r * 32 + (sw << 4);
  o[1] = r * 32 + ((1 ^ sw) << 4);
  o[2] = o[3] = 0;
}
template <>
__device__ __forceinline__ void codes<HQ_E2M1X2>(uint32_t sa, const uint32_t (&o)[4],
                                                 uint32_t (&w)[kCW]) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint4 a = lds_v4(sa + o[h]);
    const uint4 b = lds_v4(sa + o[h] + 8 * 32);
    w[4 * h + 0] = a.x, w[4 * h + 1] = a.y, w[4 * h + 2] = a.z, w[4 * h + 3] = a.w;
    w[8 + 4 * h + 0] = b.x, w[8 + 4 * h + 1] = b.y, w[8 + 4 * h + 2] = b.z, w[8 + 4 * h + 3] = b.w;
  }
}
template <>
__device__ __forceinline__ void fragment<HQ_E2M1X2>(const uint32_t (&w)[kCW], int t, uint32_t e0,
                                                    uint32_t e1, uint32_t (&fa)[16]) {
  const uint32_t *w0 = w, *w1 = w + 8; /* rows r and r + 8: 32 bytes (64 codes) each */
  /* substep kk: codes 16 kk + 2t, +1 are byte t of word 2 kk; 16 kk + 8 + 2t, +1 of 2 kk + 1 */
  const uint32_t bad = ((((e0 & 0x7f7f7f7fu) + 0x01010101u) | e0) |
                        (((e1 & 0x7f7f7f7fu) + 0x01010101u) | e1)) & 0x80808080u;
  if (!__any_sync(0xffffffffu, bad)) {
    const uint32_t sel = (uint32_t)t | (uint32_t)(t + 8) << 4 | (uint32_t)(t + 4) << 8 |
                         (uint32_t)(t + 12) << 12;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t q = prmt2(e0, e1, (uint32_t)(kk | kk << 4 | (4 + kk) << 8 | (4 + kk) << 12));
      const uint32_t f = bmul2(bmul2((q << 4) & 0x07f007f0u, 0x7b807b80u /* 2^120 */),
                               0x7a007a00u /* 2^117 */);
      const uint32_t f0 = prmt(f, 0x1010u), f1 = prmt(f, 0x3232u);
      fa[4 * kk + 0] = bmul2(e2m1_pair(w0[2 * kk], sel), f0);
      fa[4 * kk + 1] = bmul2(e2m1_pair(w1[2 * kk], sel), f1);
      fa[4 * kk + 2] = bmul2(e2m1_pair(w0[2 * kk + 1], sel), f0);
      fa[4 * kk + 3] = bmul2(e2m1_pair(w1[2 * kk + 1], sel), f1);
    }
  } else {
    const int sh = 8 * t;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t s0 = (e0 >> (8 * kk)) & 0xffu, s1 = (e1 >> (8 * kk)) & 0xffu;
      fa[4 * kk + 0] = nv_rule_pair((w0[2 * kk] >> sh) & 0xffu, s0);
      fa[4 * kk + 1] = nv_rule_pair((w1[2 * kk] >> sh) & 0xffu, s1);
      fa[4 * kk + 2] = nv_rule_pair((w0[2 * kk + 1] >> sh) & 0xffu, s0);
      fa[4 * kk + 3] = nv_rule_pair((w1[2 * kk + 1] >> sh) & 0xffu, s1);
    }
  }
}

/* MXFP4 / MXFP6 (mx_rules.h's BF16 dequantize, hq_mx_dequantize_bf16x2): each code pair as the BF16
   pair of its values times 2^(bias - 127) (MXFP4: e2m1_pair, NVFP4's placement of the E2M1 bits,
   which is hq_mx_bf16_raw2's; MXFP6: hq_mx_bf16_raw2 itself), then times 2^(e - bias) in one
   multiply where every scale the warp holds in the k-step allows it (hq_mx_bf16_one_max), else
   times 2^(127 - bias) and 2^(e - 127) (the NaN scale 0xFF a NaN pair): the exact value
   rounded once to BF16, the emulated path's dequantize bit for bit. Row r's two E8M0 scales of
   the k-step are e0 (low byte: k 0..31, substeps 0 and 1; high byte: 32..63), row r + 8's e1. */
template <int F>
__device__ __forceinline__ void mx_scale(const uint32_t (&raw)[16], uint32_t e0, uint32_t e1,
                                         uint32_t (&fa)[16]) {
  constexpr int K = mx_kind(F);
  const uint32_t s00 = e0 & 0xff, s01 = (e0 >> 8) & 0xff, s10 = e1 & 0xff, s11 = (e1 >> 8) & 0xff;
  const uint32_t emax = max(max(s00, s01), max(s10, s11));
  if (!__any_sync(0xffffffffu, emax > hq_mx_bf16_one_max(K))) {
    const uint32_t f00 = hq_mx_bf16_one2((uint8_t)s00, K), f01 = hq_mx_bf16_one2((uint8_t)s01, K);
    const uint32_t f10 = hq_mx_bf16_one2((uint8_t)s10, K), f11 = hq_mx_bf16_one2((uint8_t)s11, K);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t fr0 = kk < 2 ? f00 : f01, fr1 = kk < 2 ? f10 : f11;
      fa[4 * kk + 0] = bmul2(raw[4 * kk + 0], fr0);
      fa[4 * kk + 1] = bmul2(raw[4 * kk + 1], fr1);
      fa[4 * kk + 2] = bmul2(raw[4 * kk + 2], fr0);
      fa[4 * kk + 3] = bmul2(raw[4 * kk + 3], fr1);
    }
  } else {
    const uint32_t pre = hq_mx_bf16_pre2(K);
    const uint32_t f00 = scale_pair(s00, 0), f01 = scale_pair(s01, 0);
    const uint32_t f10 = scale_pair(s10, 0), f11 = scale_pair(s11, 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t fr0 = kk < 2 ? f00 : f01, fr1 = kk < 2 ? f10 : f11;
      fa[4 * kk + 0] = bmul2(bmul2(raw[4 * kk + 0], pre), fr0);
      fa[4 * kk + 1] = bmul2(bmul2(raw[4 * kk + 1], pre), fr1);
      fa[4 * kk + 2] = bmul2(bmul2(raw[4 * kk + 2], pre), fr0);
      fa[4 * kk + 3] = bmul2(bmul2(raw[4 * kk + 3], pre), fr1);
    }
  }
}

/* MXFP4: NVFP4's stage layout and code reads (32-byte rows, 32-byte swizzle) */
template <>
__device__ __forceinline__ void code_offsets<kMx4>(int r, int t, uint32_t (&o)[4]) {
  code_offsets<HQ_E2M1X2>(r, t, o);
}
template <>
__device__ __forceinline__ void codes<kMx4>(uint32_t sa, const uint32_t (&o)[4],
                                            uint32_t (&w)[kCW]) {
  codes<HQ_E2M1X2>(sa, o, w);
}
template <>
__device__ __forceinline__ void fragment<kMx4>(const uint32_t (&w)[kCW], int t, uint32_t e0,
                                               uint32_t e1, uint32_t (&fa)[16]) {
  const uint32_t *w0 = w, *w1 = w + 8;
  const uint32_t sel = (uint32_t)t | (uint32_t)(t + 8) << 4 | (uint32_t)(t + 4) << 8 |
                       (uint32_t)(t + 12) << 12;
  uint32_t raw[16];
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    raw[4 * kk + 0] = e2m1_pair(w0[2 * kk], sel);
    raw[4 * kk + 1] = e2m1_pair(w1[2 * kk], sel);
    raw[4 * kk + 2] = e2m1_pair(w0[2 * kk + 1], sel);
    raw[4 * kk + 3] = e2m1_pair(w1[2 * kk + 1], sel);
  }
  mx_scale<kMx4>(raw, e0, e1, fa);
}

/* MXFP6: a stage holds 48-byte rows (64 codes, the little-endian bit stream of the storage, code
   n at bit 6n), unswizzled; a thread reads its two rows whole (three 16-byte loads each: the 8
   rows of a warp fall on distinct banks, 48 bytes apart) and takes its code pairs 16 kk + 2t, +1
   and 16 kk + 8 + 2t, +1 at bits 96 kk (+ 48) + 12 t by a 64-bit funnel of two words. */
template <int F> __device__ __forceinline__ void code_offsets6(int r, uint32_t (&o)[4]) {
  o[0] = r * 48;
  o[1] = (r + 8) * 48;
  o[2] = o[3] = 0;
}
template <>
__device__ __forceinline__ void code_offsets<HQ_E3M2X4>(int r, int t, uint32_t (&o)[4]) {
  (void)t;
  code_offsets6<HQ_E3M2X4>(r, o);
}
template <>
__device__ __forceinline__ void code_offsets<HQ_E2M3X4>(int r, int t, uint32_t (&o)[4]) {
  (void)t;
  code_offsets6<HQ_E2M3X4>(r, o);
}
__device__ __forceinline__ void codes6(uint32_t sa, const uint32_t (&o)[4], uint32_t (&w)[kCW]) {
#pragma unroll
  for (int rr = 0; rr < 2; rr++)
#pragma unroll
    for (int h = 0; h < 3; h++) {
      const uint4 a = lds_v4(sa + o[rr] + 16 * h);
      w[12 * rr + 4 * h + 0] = a.x, w[12 * rr + 4 * h + 1] = a.y;
      w[12 * rr + 4 * h + 2] = a.z, w[12 * rr + 4 * h + 3] = a.w;
    }
}
template <>
__device__ __forceinline__ void codes<HQ_E3M2X4>(uint32_t sa, const uint32_t (&o)[4],
                                                 uint32_t (&w)[kCW]) {
  codes6(sa, o, w);
}
template <>
__device__ __forceinline__ void codes<HQ_E2M3X4>(uint32_t sa, const uint32_t (&o)[4],
                                                 uint32_t (&w)[kCW]) {
  codes6(sa, o, w);
}
template <int F>
__device__ __forceinline__ void fragment6(const uint32_t (&w)[kCW], int t, uint32_t e0,
                                          uint32_t e1, uint32_t (&fa)[16]) {
  uint32_t raw[16];
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int b = 96 * kk + 48 * h, i = b >> 5;
      const uint32_t o = (uint32_t)(b & 31) + 12u * (uint32_t)t; /* <= 52: bits within w[i..i+1] */
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const uint64_t v = ((uint64_t)w[12 * rr + i + 1] << 32 | w[12 * rr + i]) >> o;
        const uint32_t c = (uint32_t)v & 0xfffu;
        raw[4 * kk + 2 * h + rr] = hq_mx_bf16_raw2(c | c << 10, mx_kind(F)); /* lo, hi at 0, 16 */
      }
    }
  mx_scale<F>(raw, e0, e1, fa);
}
template <>
__device__ __forceinline__ void fragment<HQ_E3M2X4>(const uint32_t (&w)[kCW], int t, uint32_t e0,
                                                    uint32_t e1, uint32_t (&fa)[16]) {
  fragment6<HQ_E3M2X4>(w, t, e0, e1, fa);
}
template <>
__device__ __forceinline__ void fragment<HQ_E2M3X4>(const uint32_t (&w)[kCW], int t, uint32_t e0,
                                                    uint32_t e1, uint32_t (&fa)[16]) {
  fragment6<HQ_E2M3X4>(w, t, e0, e1, fa);
}

#endif /* HQ_FUSED_SM90A */

/* The byte offset of row r's scales in the scale buffer (compact row-major [rows][ld], or the
   128x4-tile swizzle of hq_swizzle_offset); k-step kt's are kt * 2 (MXFP8) / kt * 4 (NVFP4) bytes
   further in the compact layout, and in the swizzled one (kt >> 1) * 512 + (kt & 1) * 2 (MXFP8)
   / kt * 512 (NVFP4): the consumer loop steps through them by those differences. */
__device__ __forceinline__ int64_t scale_row(const Params &p, int r) {
  return p.xs_swz ? (int64_t)(r >> 7) * (p.xs_ld >> 2) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4
                  : (int64_t)r * p.xs_ld;
}

/* RN_bf16 of two FP32 values, packed (lo in the low half): the convert instruction, as cuBLASLt
   rounds the emulated path's BF16 D (hq_f32_to_bf16's bits for every value but NaN, which comes
   out as the canonical NaN). */
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

/* 8 consecutive outputs along D's contiguous dimension: v (alpha already applied) + beta * D +
   bias[m], rounded once; `n` of them valid, m0 the first one's m index. */
__device__ __forceinline__ void write8(const Params &p, const float *v, int64_t off, int64_t m0,
                                       int n) {
  float o[8];
  for (int q = 0; q < 8; q++) o[q] = v[q];
  const bool vec = p.vec_ok && n == 8;
  if (p.beta != 0.0f) {
    if (p.d_f32) {
      const float *d = static_cast<const float *>(p.d) + off;
      for (int q = 0; q < n; q++) o[q] = o[q] + p.beta * d[q];
    } else {
      const uint16_t *d = static_cast<const uint16_t *>(p.d) + off;
      for (int q = 0; q < n; q++) o[q] = o[q] + p.beta * hq_bf16_to_f32(d[q]);
    }
  }
  if (p.bias) {
    for (int q = 0; q < n; q++)
      o[q] += p.bias_f32 ? static_cast<const float *>(p.bias)[m0 + q]
                         : hq_bf16_to_f32(static_cast<const uint16_t *>(p.bias)[m0 + q]);
  }
  if (p.d_f32) {
    float *d = static_cast<float *>(p.d) + off;
    if (vec) {
      reinterpret_cast<float4 *>(d)[0] = make_float4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<float4 *>(d)[1] = make_float4(o[4], o[5], o[6], o[7]);
    } else {
      for (int q = 0; q < n; q++) d[q] = o[q];
    }
  } else {
    uint16_t *d = static_cast<uint16_t *>(p.d) + off;
    if (vec) {
      uint32_t w[4];
      for (int q = 0; q < 4; q++) w[q] = bf16x2_rn(o[2 * q], o[2 * q + 1]);
      *reinterpret_cast<uint4 *>(d) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int q = 0; q < n; q++) d[q] = (uint16_t)bf16x2_rn(o[q], 0.0f);
    }
  }
}

template <int ELEM>
__global__ void __launch_bounds__(384, 1)
fused_kernel(const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmw,
             const Params p) {
#if HQ_FUSED_SM90A
  constexpr int kStages = Fmt<ELEM>::stages, kABytes = a_bytes<ELEM>();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024u - (su32(smem_raw) & 1023u)) & 1023u);
  uint8_t *sB = smem;
  uint8_t *sA = smem + kStages * kBBytes;
  uint64_t *full = reinterpret_cast<uint64_t *>(sA + kStages * kABytes);
  uint64_t *empty = full + kStages;
  const int nt_count = (p.nw + kBN - 1) / kBN;
  const int m0 = (int)(blockIdx.x / nt_count) * kBM, n0 = (int)(blockIdx.x % nt_count) * kBN;
  const int KT = (p.k + kBK - 1) / kBK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      hq_mbar_init(su32(&full[s]), 1);
      hq_mbar_init(su32(&empty[s]), 8); /* one arrive per consumer warp */
    }
    hq_mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) { /* the producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < KT; kt++) {
        const int s = kt % kStages;
        hq_mbar_wait(su32(&empty[s]), ((kt / kStages) & 1) ^ 1);
        hq_mbar_expect_tx(su32(&full[s]), kABytes + kBBytes);
        hq_tma_load_2d(su32(sA + s * kABytes), &tmx, su32(&full[s]), kt * Fmt<ELEM>::row, m0);
        hq_tma_load_2d(su32(sB + s * kBBytes), &tmw, su32(&full[s]), kt * kBK, n0);
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = cw * 64 + warp * 16 + g; /* the thread's rows in the tile: r0, r0 + 8 */
  /* the rows' scales of the next k-step to load (scales() loads steps 0, 1, 2, ... in order) */
  /* MXFP4 / MXFP6: the storage's scales cover its rows alone (rows past mx, whose codes the TMA
     fills with zeros and whose results are never stored, read row mx - 1's) */
  constexpr bool kMxs = mx_kind(ELEM) != 0;
  const uint8_t *xs0 = p.xs + scale_row(p, kMxs ? min(m0 + r0, p.mx - 1) : m0 + r0);
  const uint8_t *xs1 = p.xs + scale_row(p, kMxs ? min(m0 + r0 + 8, p.mx - 1) : m0 + r0 + 8);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; i++) acc[i] = 0.0f;
  uint32_t fa0[16], fa1[16];
  /* The scales of k-step b (two bytes per row: two 32-blocks, MXFP8; four: 16-blocks, NVFP4) in
     slot b & 1, loaded two steps before the fragment that uses them. The loop below runs steps in
     pairs, so every slot index is a constant and no register is copied. */
  uint32_t sc[2][2];
  auto scales = [&](int b, uint32_t(&d)[2]) {
    if (kMxs) {
      /* byte loads (a row's k / 32 scales, any alignment); a half k-step's second scale, past
         the row, is 127 (its codes are the TMA's zeros) */
      const bool two = 2 * b + 1 < p.k / 32;
      d[0] = __ldg(xs0) | (two ? (uint32_t)__ldg(xs0 + 1) : 127u) << 8;
      d[1] = __ldg(xs1) | (two ? (uint32_t)__ldg(xs1 + 1) : 127u) << 8;
    } else if (Fmt<ELEM>::sbytes == 4) {
      d[0] = __ldg(reinterpret_cast<const uint32_t *>(xs0));
      d[1] = __ldg(reinterpret_cast<const uint32_t *>(xs1));
    } else {
      d[0] = __ldg(reinterpret_cast<const uint16_t *>(xs0));
      d[1] = __ldg(reinterpret_cast<const uint16_t *>(xs1));
    }
    /* to step b + 1 (scale_row's comment; swizzled MXFP8: the two steps of a 4-byte column, then
       the next 512-byte column group) */
    const int adv = Fmt<ELEM>::sbytes == 4 ? (p.xs_swz ? 512 : 4)
                                           : (p.xs_swz && (b & 1) ? 510 : 2);
    xs0 += adv;
    xs1 += adv;
  };
  /* Ring positions advance by one stage per step, without a division: cs / cph the stage (and its
     full barrier's parity) of the next codes to read, ms the stage the next wgmmas read, ps the
     one they read before. */
  int cs = 0, ms = 0, ps = 0;
  uint32_t cph = 0;
  /* shared-window addresses, computed once: the full and empty barriers, the codes of stage 0 */
  uint32_t full_s = su32(full), empty_s = su32(empty), sa_s = su32(sA); /* (pinned: not
     recomputed from the shared window, an S2R and four more instructions, at each use) */
  uint32_t co[4]; /* the thread's code offsets in a stage, held in registers (pinned per step) */
  code_offsets<ELEM>(r0, t, co);
  uint32_t hc[kCW]; /* the codes of the next fragment to build, read one step early */
  auto read_codes = [&](uint32_t(&h)[kCW]) {
#pragma unroll
    for (int i = 0; i < 4; i++) pin(co[i]);
    pin(full_s);
    pin(sa_s);
    hq_mbar_wait(full_s + 8 * cs, cph);
    codes<ELEM>(sa_s + cs * kABytes, co, h);
    if (++cs == kStages) {
      cs = 0;
      cph ^= 1;
    }
  };
  /* fragment b into f, from its codes (read a step early, hc) and the scales e of slot b & 1 */
  auto build = [&](int b, uint32_t(&f)[16], uint32_t(&e)[2]) {
    fragment<ELEM>(hc, t, e[0], e[1], f);
    if (b + 1 < KT) read_codes(hc);
    if (b + 2 < KT) scales(b + 2, e);
  };
  scales(0, sc[0]);
  if (KT > 1) scales(1, sc[1]);
  read_codes(hc);
  build(0, fa0, sc[0]);
  uint64_t desc0 = desc_sw128(su32(sB));
  auto step = [&](int kt, uint32_t(&cur)[16], uint32_t(&nxt)[16], uint32_t(&e)[2]) {
#pragma unroll
    for (int i = 0; i < 128; i++) pin(acc[i]);
#pragma unroll
    for (int i = 0; i < 16; i++) pin(cur[i]);
    wg_fence();
    /* W's stage ms; each 16-wide k-slice is 32 bytes further (2 in the descriptor's address) */
    pin(desc0); /* kept in registers, not recomputed from the shared window every step */
    const uint64_t d = desc0 + (uint64_t)(ms * (kBBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const uint32_t a4[4] = {cur[4 * kk], cur[4 * kk + 1], cur[4 * kk + 2], cur[4 * kk + 3]};
      hq_wgmma_m64n256k16(acc, a4, d + 2 * kk);
    }
    wg_commit();
    wg_wait<1>(); /* step kt - 1 has finished: its stage and its fragment registers are free */
#pragma unroll
    for (int i = 0; i < 16; i++) pin(nxt[i]);
    if (kt > 0) {
      __syncwarp();
      pin(empty_s);
      if (lane == 0) hq_mbar_arrive(empty_s + 8 * ps);
    }
    ps = ms;
    ms = ms + 1 == kStages ? 0 : ms + 1;
    if (kt + 1 < KT) build(kt + 1, nxt, e);
  };
  for (int kt = 0; kt < KT; kt += 2) {
    step(kt, fa0, fa1, sc[1]);
    if (kt + 1 < KT) step(kt + 1, fa1, fa0, sc[0]);
  }
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < 128; i++) pin(acc[i]);

  /* epilogue: both consumer warpgroups are done with every stage before the staging overwrites
     the ring (the producer issued nothing after the last stage) */
  asm volatile("bar.sync 1, 256;" ::: "memory");
  float alpha = p.alpha;
  if (p.f0) alpha = alpha * *p.f0;
  if (p.f1) alpha = alpha * *p.f1;
  if (ELEM == HQ_E2M1X2) alpha = alpha * 0x1p9f; /* the fragment's 2^-9 */
  float *stg = reinterpret_cast<float *>(smem) + cw * (p.x_is_m ? kBN * kLdI : 64 * kLdJ);
  const int il = warp * 16 + g;
#pragma unroll
  for (int jb = 0; jb < 32; jb++) {
    const int j = jb * 8 + 2 * t;
    if (p.x_is_m) {
      stg[j * kLdI + il] = alpha * acc[4 * jb + 0];
      stg[(j + 1) * kLdI + il] = alpha * acc[4 * jb + 1];
      stg[j * kLdI + il + 8] = alpha * acc[4 * jb + 2];
      stg[(j + 1) * kLdI + il + 8] = alpha * acc[4 * jb + 3];
    } else {
      stg[il * kLdJ + j] = alpha * acc[4 * jb + 0];
      stg[il * kLdJ + j + 1] = alpha * acc[4 * jb + 1];
      stg[(il + 8) * kLdJ + j] = alpha * acc[4 * jb + 2];
      stg[(il + 8) * kLdJ + j + 1] = alpha * acc[4 * jb + 3];
    }
  }
  asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
  const int tid = threadIdx.x & 127;
  const int ib = m0 + cw * 64;
  if (p.x_is_m) { /* lines: j; along a line 64 consecutive i (= m) */
    const int ic = (tid & 7) * 8;
    for (int jr = tid >> 3; jr < kBN; jr += 16) {
      const int j = n0 + jr;
      if (j >= p.nw) break;
      const int n = min(8, p.mx - (ib + ic));
      if (n > 0) write8(p, stg + jr * kLdI + ic, (int64_t)j * p.ldd + ib + ic, ib + ic, n);
    }
  } else { /* lines: i; along a line 256 consecutive j (= m) */
    const int jc = (tid & 31) * 8;
    for (int ir = tid >> 5; ir < 64; ir += 4) {
      const int i = ib + ir;
      if (i >= p.mx) break;
      const int n = min(8, p.nw - (n0 + jc));
      if (n > 0) write8(p, stg + ir * kLdJ + jc, (int64_t)i * p.ldd + n0 + jc, n0 + jc, n);
    }
  }
#else
  (void)tmx;
  (void)tmw;
  (void)p;
#endif
}

template <int ELEM>
int launch(const hqi_fused_gemm_args *a, const CUtensorMap &tx, const CUtensorMap &tw,
           const Params &p, unsigned tiles) {
  /* per device: the dynamic shared memory opt-in is made once (a race repeats it harmlessly),
     and made again after a failed launch (e.g. after a device reset) */
  static std::atomic<int> attr_set[64];
  std::atomic<int> *slot = a->device >= 0 && a->device < 64 ? &attr_set[a->device] : nullptr;
  cudaError_t e = cudaSuccess;
  if (!slot || !slot->load()) {
    e = cudaFuncSetAttribute(fused_kernel<ELEM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem_bytes<ELEM>());
    if (e == cudaSuccess && slot) slot->store(1);
  }
  if (e == cudaSuccess) {
    fused_kernel<ELEM><<<tiles, 384, smem_bytes<ELEM>(), (cudaStream_t)a->stream>>>(tx, tw, p);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess && slot) slot->store(0);
  if (e != cudaSuccess)
    return a->error(HQ_EDEVICE, "%s: fused %s GEMM (m=%lld n=%lld k=%lld): %s", a->what,
                     ELEM == HQ_E2M1X2 ? "NVFP4" : ELEM == kMx4 ? "MXFP4"
                     : mx_kind(ELEM)   ? "MXFP6" : "MXFP8",
                     (long long)(a->x_is_m ? a->mx : a->nw), (long long)(a->x_is_m ? a->nw : a->mx),
                     (long long)a->k, cudaGetErrorString(e));
  return HQ_OK;
}

bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The kernel's storage kind of the arguments (Fmt), or 0 where it has none */
int kind_of(const hqi_fused_gemm_args *a) {
  if (a->elem == HQ_E2M1X2) return a->e8m0 ? kMx4 : HQ_E2M1X2;
  if (a->elem == HQ_E3M2X4 || a->elem == HQ_E2M3X4) return a->e8m0 ? a->elem : 0;
  return a->elem == HQ_E4M3 || a->elem == HQ_E5M2 ? a->elem : 0;
}

} // namespace

extern "C" int hqi_fused_gemm_supported(const hqi_fused_gemm_args *a) {
  const int f = kind_of(a);
  if (!f) return 0;
  if (mx_kind(f)) {
    /* MXFP4 / MXFP6: compact scales of any alignment, k / 32 a row; the TMA's row pitch (k / 2
       or 3k / 4 bytes) a multiple of 16 */
    return a->arch == 90 && a->k > 0 && a->k % (f == kMx4 ? 32 : 64) == 0 && a->mx > 0 &&
           a->nw > 0 && a->mx < (1ll << 31) && a->nw < (1ll << 31) && a->k < (1ll << 31) &&
           !a->xs_swizzled && a->xs_ld >= a->k / 32 && al16(a->x) && al16(a->w) &&
           ((uintptr_t)a->d & 3) == 0;
  }
  const int nv = a->elem == HQ_E2M1X2;
  if (!nv && a->elem != HQ_E4M3 && a->elem != HQ_E5M2) return 0;
  /* scale columns the kernel reads: whole k-steps (2 E8M0 / 4 E4M3 per row), in tiles of 4
     columns when swizzled */
  const int64_t cols = nv ? (a->k / 16 + 3) / 4 * 4 : (a->k / 32 + 1) / 2 * 2;
  return a->arch == 90 && a->k > 0 && a->k % 32 == 0 && a->mx > 0 && a->nw > 0 &&
         a->mx < (1ll << 31) && a->nw < (1ll << 31) && a->k < (1ll << 31) && a->xs_ld >= cols &&
         a->xs_ld % (nv || a->xs_swizzled ? 4 : 2) == 0 && al16(a->x) && al16(a->w) &&
         al16(a->xs) && ((uintptr_t)a->d & 3) == 0;
}

extern "C" int hqi_fused_gemm(const hqi_fused_gemm_args *a) {
  if (!hqi_fused_gemm_supported(a))
    return a->error(HQ_ENOTSUP, "%s: the fused GEMM does not take this problem", a->what);
  if (!hq_cuda_tensor_map_encoder())
    return a->error(HQ_ENOTSUP, "%s: the driver has no cuTensorMapEncodeTiled", a->what);
  CUtensorMap tx, tw;
  {
    /* X's bytes: [mx, k] codes, [mx, k / 2] for two E2M1 codes per byte, [mx, 3k / 4] for
       four FP6 codes in three bytes */
    const int f = kind_of(a), fp4 = a->elem == HQ_E2M1X2, fp6 = mx_kind(f) && !fp4;
    const uint64_t row = (uint64_t)(fp4 ? a->k / 2 : fp6 ? a->k / 4 * 3 : a->k);
    CUresult r = hq_tensor_map_2d(&tx, CU_TENSOR_MAP_DATA_TYPE_UINT8, a->x, row, (uint64_t)a->mx,
                                  row, fp4 ? Fmt<HQ_E2M1X2>::row : fp6 ? Fmt<HQ_E3M2X4>::row
                                                                   : Fmt<HQ_E4M3>::row,
                                  kBM, fp4 ? CU_TENSOR_MAP_SWIZZLE_32B
                                       : fp6 ? CU_TENSOR_MAP_SWIZZLE_NONE
                                             : CU_TENSOR_MAP_SWIZZLE_64B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    if (r != CUDA_SUCCESS)
      return a->error(HQ_EDEVICE, "%s: fused GEMM: cuTensorMapEncodeTiled (X, %lld x %lld codes) "
                       "failed with %d", a->what, (long long)a->mx, (long long)a->k, (int)r);
  }
  {
    CUresult r = hq_tensor_map_2d(&tw, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a->w, (uint64_t)a->k,
                                  (uint64_t)a->nw, (uint64_t)a->k * 2, kBK, kBN,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    if (r != CUDA_SUCCESS)
      return a->error(HQ_EDEVICE, "%s: fused GEMM: cuTensorMapEncodeTiled (W, %lld x %lld BF16) "
                       "failed with %d", a->what, (long long)a->nw, (long long)a->k, (int)r);
  }
  Params p;
  p.xs = a->xs;
  p.xs_ld = a->xs_ld;
  p.xs_swz = a->xs_swizzled;
  p.mx = (int)a->mx;
  p.nw = (int)a->nw;
  p.k = (int)a->k;
  p.x_is_m = a->x_is_m;
  p.d = a->d;
  p.ldd = a->ldd;
  p.d_f32 = a->d_dtype == HQ_F32;
  p.vec_ok = al16(a->d) && a->ldd % 8 == 0;
  p.alpha = a->alpha;
  p.beta = a->beta;
  p.f0 = a->factor[0];
  p.f1 = a->factor[1];
  p.bias = a->bias;
  p.bias_f32 = a->bias_dtype == HQ_F32;
  const unsigned tiles = (unsigned)hqi_fused_tiles(a->mx, a->nw);
  switch (kind_of(a)) {
  case HQ_E2M1X2: return launch<HQ_E2M1X2>(a, tx, tw, p, tiles);
  case kMx4: return launch<kMx4>(a, tx, tw, p, tiles);
  case HQ_E3M2X4: return launch<HQ_E3M2X4>(a, tx, tw, p, tiles);
  case HQ_E2M3X4: return launch<HQ_E2M3X4>(a, tx, tw, p, tiles);
  case HQ_E5M2: return launch<HQ_E5M2>(a, tx, tw, p, tiles);
  default: return launch<HQ_E4M3>(a, tx, tw, p, tiles);
  }
}
