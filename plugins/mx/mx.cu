/*
** mx.cu -- the MXFP4 / MXFP6 CUDA kernels (sm_90 and Blackwell; any element kind), bit-identical
** to the CPU reference in mx.c: every byte comes from the same functions of mx_rules.h and
** hq/numerics.h (scale code, encode multiplier, element casts, Philox stream, packing).
**   quantize: one kernel for both directions, the input read once (quantize_tile, below: a
**     32 x 128 tile per CTA through shared memory, coalesced vector loads and word stores).
**   dequantize: one thread per 8 elements of a row, vector loads and stores (dequantize8).
** Everything on call->stream; nothing allocated, nothing synchronized.
*/
#include <stdint.h>

#include "cuda_check.h"
#include "hq/numerics.h"
#include "mx.h"
#include "mx_rules.h"

namespace {

struct QArgs {
  const void *src;
  int dtype;          /* HQ_F32 / HQ_BF16 / HQ_F16 */
  int kind, rule, sr;
  uint64_t seed, offset;
  int64_t M, K;
};

/* Element i of the source as FP32: hq_load_hp's value (a NaN stays a NaN, which is all the
   rules read of one). */
__device__ __forceinline__ float load(const void *p, int64_t i, int dtype) {
  if (dtype == HQ_F32) return static_cast<const float *>(p)[i];
  const uint16_t h = static_cast<const uint16_t *>(p)[i];
  return dtype == HQ_BF16 ? hq_bf16_to_f32(h) : hq_f16_to_f32_anynan(h);
}

/* One quantize kernel for both directions: a CTA takes a tile of 32 rows x up to 128 columns
   (kTileW; a narrower last tile where K % 128 != 0), reads it once into shared memory (16-byte
   vector loads where the source is 16-byte aligned and the tile is whole, else element by
   element, coalesced either way), and makes from it
     rowwise:    one thread per 32-element block of a row (32 rows x w/32 blocks), the packed
                 16 or 24 bytes stored as 8-byte words, neighbouring threads neighbouring blocks;
     columnwise: one thread per column (its 32-row block), the scale byte stored coalesced, the
                 codes staged in shared memory, then packed eight columns per thread (FP4: one
                 4-byte store, FP6: three 2-byte stores) row by row.
   The input is read once whatever the directions. */
constexpr int kTileW = 128;
constexpr int kThreads = 128;

__device__ __forceinline__ void cast32(uint32_t (&c)[32], const float *x, int stride, uint8_t e,
                                       const QArgs &a, const uint32_t *bits) {
  const float mult = hq_mx_encode_mult(e, a.rule);
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const float v = hq_mul_rn(x[k * stride], mult);
    c[k] = bits ? hq_mx_cast_sr(v, a.kind, hq_mx_sr_byte(bits, k)) : hq_mx_cast(v, a.kind);
  }
}

/* A's bits over 32 values: the integer max of |x|'s patterns, a NaN one when any is NaN (the
   CPU reference's amax32). */
__device__ __forceinline__ uint32_t amax_bits(const float *x, int stride) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 32; k++) m = max(m, hq_f32_bits(x[k * stride]) & 0x7fffffffu);
  return m;
}

__global__ void __launch_bounds__(kThreads) quantize_tile(QArgs a, uint8_t *rd, uint8_t *rs,
                                                          uint8_t *cd, uint8_t *cs) {
  __shared__ float tile[32][kTileW + 1]; /* +1: a column read hits 32 different banks */
  __shared__ uint8_t codes[32][kTileW];  /* columnwise codes, [row][column] */
  const int t = threadIdx.x;
  const int64_t i0 = (int64_t)blockIdx.x * 32, j0 = (int64_t)blockIdx.y * kTileW;
  const int w = (int)min((int64_t)kTileW, a.K - j0); /* a multiple of 32 */
  const uintptr_t base = reinterpret_cast<uintptr_t>(a.src);
  if (w == kTileW && (base & 15u) == 0 && a.dtype == HQ_F32) {
    /* 4 rows of 128 floats per pass: thread t loads float4 t % 32 of row t / 32 */
    for (int r = t / 32; r < 32; r += kThreads / 32) {
      const float4 v = reinterpret_cast<const float4 *>(
          static_cast<const float *>(a.src) + (i0 + r) * a.K + j0)[t % 32];
      const int c = 4 * (t % 32);
      tile[r][c] = v.x, tile[r][c + 1] = v.y, tile[r][c + 2] = v.z, tile[r][c + 3] = v.w;
    }
  } else if (w == kTileW && (base & 15u) == 0) {
    /* 8 rows of 128 16-bit values per pass: 8 values (16 bytes) per thread */
    for (int r = t / 16; r < 32; r += kThreads / 16) {
      const uint4 v = reinterpret_cast<const uint4 *>(
          static_cast<const uint16_t *>(a.src) + (i0 + r) * a.K + j0)[t % 16];
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
      const int c = 8 * (t % 16);
#pragma unroll
      for (int h = 0; h < 8; h++) {
        const uint16_t b = (uint16_t)(u[h / 2] >> (16 * (h & 1)));
        tile[r][c + h] = a.dtype == HQ_BF16 ? hq_bf16_to_f32(b) : hq_f16_to_f32_anynan(b);
      }
    }
  } else {
    for (int r = 0; r < 32; r++)
      for (int c = t; c < w; c += kThreads) tile[r][c] = load(a.src, (i0 + r) * a.K + j0 + c, a.dtype);
  }
  __syncthreads();
  uint32_t rk[20];
  hq_nvfp4_sr_keys(a.seed, rk);
  const int nb = w / 32;
  if (rd && t < 32 * nb) {
    const int r = t / nb, b = t % nb;
    const float *x = &tile[r][32 * b];
    const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax_bits(x, 1)), a.kind, a.rule);
    const int64_t si = hq_mx_scale_idx(0, i0 + r, j0 + 32 * b, a.K);
    uint32_t bits[8], c[32];
    if (a.sr) hq_mx_sr_bits(rk, a.offset, 0, (uint64_t)si, bits);
    cast32(c, x, 1, e, a, a.sr ? bits : nullptr);
    rs[si] = e;
    uint8_t out[24];
    hq_mx_pack32(out, c, a.kind);
    /* 16 or 24 bytes at an 8-byte multiple of the row start (rows of K/2 or 3K/4 bytes with
       K % 32 == 0); the core's buffers are at least 8-byte aligned */
    const int64_t bb = hq_mx_row_bytes(HQ_MX_BLOCK, a.kind);
    uint64_t *dst = reinterpret_cast<uint64_t *>(
        rd + (i0 + r) * hq_mx_row_bytes(a.K, a.kind) + (j0 / 32 + b) * bb);
    for (int q = 0; q < bb / 8; q++) {
      uint64_t v = 0;
#pragma unroll
      for (int k = 0; k < 8; k++) v |= (uint64_t)out[8 * q + k] << (8 * k);
      dst[q] = v;
    }
  }
  if (!cd) return;
  if (t < w) {
    const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax_bits(&tile[0][t], kTileW + 1)), a.kind,
                                       a.rule);
    const int64_t si = hq_mx_scale_idx(1, i0, j0 + t, a.K);
    uint32_t bits[8], c[32];
    if (a.sr) hq_mx_sr_bits(rk, a.offset, 1, (uint64_t)si, bits);
    cast32(c, &tile[0][t], kTileW + 1, e, a, a.sr ? bits : nullptr);
    cs[si] = e;
#pragma unroll
    for (int r = 0; r < 32; r++) codes[r][t] = (uint8_t)c[r];
  }
  __syncthreads();
  /* eight columns per thread, w / 8 threads per row, kThreads / (w / 8) rows at a time */
  const int per_row = w / 8, rows_at_once = kThreads / per_row;
  const int64_t rb = hq_mx_row_bytes(a.K, a.kind);
  for (int r = t / per_row; r < 32 && t < per_row * rows_at_once; r += rows_at_once) {
    const int g = t % per_row;
    const uint8_t *c = &codes[r][8 * g];
    uint8_t *row = cd + (i0 + r) * rb;
    if (a.kind == HQ_E2M1X2) {
      uint32_t v = 0;
#pragma unroll
      for (int k = 0; k < 8; k++) v |= (uint32_t)(c[k] & 15u) << (4 * k);
      reinterpret_cast<uint32_t *>(row + (j0 + 8 * g) / 2)[0] = v;
    } else {
      const uint32_t lo = hq_fp6_pack4(c[0], c[1], c[2], c[3]);
      const uint32_t hi = hq_fp6_pack4(c[4], c[5], c[6], c[7]);
      const uint64_t v = (uint64_t)lo | (uint64_t)hi << 24; /* 48 bits */
      uint16_t *p = reinterpret_cast<uint16_t *>(row + (j0 + 8 * g) / 4 * 3);
      p[0] = (uint16_t)v, p[1] = (uint16_t)(v >> 16), p[2] = (uint16_t)(v >> 32);
    }
  }
}

/* Dequantize: one thread per 8 consecutive elements of a row, so that neighbouring threads
   read neighbouring code bytes (FP4: one 4-byte load, FP6: three 2-byte loads) and write
   neighbouring outputs (one or two 16-byte stores where the destination is 16-byte aligned). */
__global__ void dequantize8(const uint8_t *data, const uint8_t *scale, int kind, int colwise,
                            void *dst, int dtype, int64_t M, int64_t K) {
  const int64_t n8 = K / 8;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= M * n8) return;
  const int64_t i = t / n8, k0 = (t % n8) * 8;
  const uint8_t *row = data + i * hq_mx_row_bytes(K, kind);
  uint64_t w;
  if (kind == HQ_E2M1X2) {
    w = *reinterpret_cast<const uint32_t *>(row + k0 / 2);
  } else {
    const uint16_t *p = reinterpret_cast<const uint16_t *>(row + k0 / 4 * 3);
    w = (uint64_t)p[0] | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 32;
  }
  const int bits = hq_mx_bits(kind);
  float y[8];
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const uint32_t c = (uint32_t)(w >> (bits * k)) & ((1u << bits) - 1u);
    const uint8_t e = scale[hq_mx_scale_idx(colwise, i, k0 + k, K)];
    y[k] = hq_mx_dequantize(c, e, kind);
  }
  const int64_t o = i * K + k0;
  const bool al = (reinterpret_cast<uintptr_t>(dst) & 15u) == 0;
  if (dtype == HQ_F32 && al) {
    float4 *q = reinterpret_cast<float4 *>(static_cast<float *>(dst) + o);
    q[0] = make_float4(y[0], y[1], y[2], y[3]);
    q[1] = make_float4(y[4], y[5], y[6], y[7]);
  } else if (dtype != HQ_F32 && al) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const uint32_t lo = dtype == HQ_BF16 ? hq_f32_to_bf16(y[2 * k]) : hq_f32_to_f16(y[2 * k]);
      const uint32_t hi =
          dtype == HQ_BF16 ? hq_f32_to_bf16(y[2 * k + 1]) : hq_f32_to_f16(y[2 * k + 1]);
      h[k] = lo | hi << 16;
    }
    *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(dst) + o) = make_uint4(h[0], h[1], h[2], h[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++) hq_store_hp(dst, o + k, dtype, y[k]);
  }
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }

} // namespace

extern "C" int mx_cuda_quantize(const mx_job *q, const hq_call *call, const hq_tensor *src) {
  if (q->M * q->K == 0) return HQ_OK;
  const QArgs a = {src->data, (int)src->dtype, (int)q->kind, q->rule, q->sr, q->seed, q->offset,
                   q->M, q->K};
  /* x: 32-row blocks (up to 2^31 - 1), y: column tiles (K up to 8M) */
  const dim3 grid((unsigned)(q->M / HQ_MX_BLOCK), (unsigned)((q->K + kTileW - 1) / kTileW));
  quantize_tile<<<grid, kThreads, 0, (cudaStream_t)call->stream>>>(a, q->rd, q->rs, q->cd, q->cs);
  CHECK_LAUNCH(call, "mx quantize");
  return HQ_OK;
}

extern "C" int mx_cuda_dequantize(const hq_call *call, const uint8_t *data, const uint8_t *scale,
                                  hq_dtype kind, int colwise, hq_tensor *dst) {
  const int64_t M = dst->rows, K = dst->cols;
  if (M * K == 0) return HQ_OK;
  dequantize8<<<blocks_for(M * (K / 8)), 256, 0, (cudaStream_t)call->stream>>>(
      data, scale, (int)kind, colwise, dst->data, (int)dst->dtype, M, K);
  CHECK_LAUNCH(call, "mx dequantize");
  return HQ_OK;
}
