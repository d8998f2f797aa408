/*
** mx.cu -- the MXFP4 / MXFP6 CUDA kernels (sm_90 and Blackwell; any element kind), bit-identical
** to the CPU reference in mx.c: every byte comes from the same functions of mx_rules.h and
** hq/numerics.h (scale code, encode multiplier, element casts, Philox stream, packing).
**   quantize: one kernel per direction asked for. Rowwise, one thread per 32-element block of a
**     row: 32 loads (16-byte vector loads of an aligned f32 / 16-bit source), the amax, 32 casts,
**     16 or 24 bytes stored as whole words. Columnwise, one thread per four adjacent columns of a
**     32-row block (the columns one packed FP6 group or two FP4 bytes hold), so that neighbouring
**     threads read neighbouring columns (coalesced) and each writes whole bytes.
**   dequantize: one thread per 32-element block of a row, 32 outputs.
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
  uint8_t *data, *scale;
};

/* Element i of the source as FP32: hq_load_hp's value (a NaN stays a NaN, which is all the
   rules read of one). */
__device__ __forceinline__ float load(const void *p, int64_t i, int dtype) {
  if (dtype == HQ_F32) return static_cast<const float *>(p)[i];
  const uint16_t h = static_cast<const uint16_t *>(p)[i];
  return dtype == HQ_BF16 ? hq_bf16_to_f32(h) : hq_f16_to_f32_anynan(h);
}

/* 32 consecutive source elements from element i (i a multiple of 32): vector loads where the
   address allows. */
__device__ __forceinline__ void load32(float (&x)[32], const void *p, int64_t i, int dtype) {
  if (dtype == HQ_F32 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const float4 *v = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const float4 f = v[k];
      x[4 * k] = f.x, x[4 * k + 1] = f.y, x[4 * k + 2] = f.z, x[4 * k + 3] = f.w;
    }
    return;
  }
  if (dtype != HQ_F32 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 *v = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + i);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const uint4 w = v[k];
      const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int h = 0; h < 8; h++) {
        const uint16_t b = (uint16_t)(u[h / 2] >> (16 * (h & 1)));
        x[8 * k + h] = dtype == HQ_BF16 ? hq_bf16_to_f32(b) : hq_f16_to_f32_anynan(b);
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 32; k++) x[k] = load(p, i + k, dtype);
}

/* 32 values into 32 codes with scale code e: the CPU reference's cast32. */
__device__ __forceinline__ void cast32(uint32_t (&c)[32], const float (&x)[32], uint8_t e,
                                       const QArgs &a, const uint32_t *bits) {
  const float mult = hq_mx_encode_mult(e, a.rule);
#pragma unroll
  for (int k = 0; k < 32; k++) {
    const float v = hq_mul_rn(x[k], mult);
    c[k] = bits ? hq_mx_cast_sr(v, a.kind, hq_mx_sr_byte(bits, k)) : hq_mx_cast(v, a.kind);
  }
}

__device__ __forceinline__ uint32_t amax_bits(const float (&x)[32]) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 32; k++) m = max(m, hq_f32_bits(x[k]) & 0x7fffffffu);
  return m;
}

__global__ void quantize_rows(QArgs a) {
  const int64_t nb = a.K / HQ_MX_BLOCK;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.M * nb) return;
  const int64_t i = t / nb, kb = t % nb;
  float x[32];
  load32(x, a.src, i * a.K + kb * HQ_MX_BLOCK, a.dtype);
  const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax_bits(x)), a.kind, a.rule);
  uint32_t bits[8], c[32];
  if (a.sr) {
    uint32_t rk[20];
    hq_nvfp4_sr_keys(a.seed, rk);
    hq_mx_sr_bits(rk, a.offset, 0, (uint64_t)t, bits);
  }
  cast32(c, x, e, a, a.sr ? bits : nullptr);
  a.scale[t] = e; /* hq_mx_scale_idx(0, i, 32 kb, K) = t */
  uint8_t out[24];
  hq_mx_pack32(out, c, a.kind);
  const int64_t bb = hq_mx_row_bytes(HQ_MX_BLOCK, a.kind);
  uint8_t *dst = a.data + i * hq_mx_row_bytes(a.K, a.kind) + kb * bb;
  /* 16 or 24 bytes at an 8-byte multiple of the row start (rows of K/2 or 3K/4 bytes, K % 32 ==
     0, keep that alignment when data is 8-byte aligned, as the core's allocations are) */
  for (int w = 0; w < bb / 8; w++) {
    uint64_t v = 0;
    for (int b = 0; b < 8; b++) v |= (uint64_t)out[8 * w + b] << (8 * b);
    reinterpret_cast<uint64_t *>(dst)[w] = v;
  }
}

__global__ void quantize_cols(QArgs a) {
  const int64_t ng = a.K / 4; /* groups of four columns */
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (a.M / HQ_MX_BLOCK) * ng) return;
  const int64_t mb = t / ng, j0 = (t % ng) * 4;
  uint32_t c[4][32];
  for (int g = 0; g < 4; g++) {
    float x[32];
#pragma unroll
    for (int r = 0; r < 32; r++) x[r] = load(a.src, (mb * HQ_MX_BLOCK + r) * a.K + j0 + g, a.dtype);
    const uint8_t e = hq_mx_scale_code(hq_bits_f32(amax_bits(x)), a.kind, a.rule);
    const int64_t si = hq_mx_scale_idx(1, mb * HQ_MX_BLOCK, j0 + g, a.K);
    uint32_t bits[8];
    if (a.sr) {
      uint32_t rk[20];
      hq_nvfp4_sr_keys(a.seed, rk);
      hq_mx_sr_bits(rk, a.offset, 1, (uint64_t)si, bits);
    }
    cast32(c[g], x, e, a, a.sr ? bits : nullptr);
    a.scale[si] = e;
  }
  const int64_t rb = hq_mx_row_bytes(a.K, a.kind);
  for (int r = 0; r < 32; r++) {
    uint8_t *row = a.data + (mb * HQ_MX_BLOCK + r) * rb;
    if (a.kind == HQ_E2M1X2) {
      row[j0 / 2] = (uint8_t)((c[0][r] & 15u) | (c[1][r] & 15u) << 4);
      row[j0 / 2 + 1] = (uint8_t)((c[2][r] & 15u) | (c[3][r] & 15u) << 4);
    } else {
      const uint32_t w = hq_fp6_pack4(c[0][r], c[1][r], c[2][r], c[3][r]);
      uint8_t *g = row + j0 / 4 * 3;
      g[0] = (uint8_t)w, g[1] = (uint8_t)(w >> 8), g[2] = (uint8_t)(w >> 16);
    }
  }
}

__global__ void dequantize_rows(const uint8_t *data, const uint8_t *scale, int kind, int colwise,
                                void *dst, int dtype, int64_t M, int64_t K) {
  const int64_t nb = K / HQ_MX_BLOCK;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= M * nb) return;
  const int64_t i = t / nb, k0 = (t % nb) * HQ_MX_BLOCK;
  const uint8_t *row = data + i * hq_mx_row_bytes(K, kind);
  for (int k = 0; k < HQ_MX_BLOCK; k++) {
    const float y = hq_mul_rn(hq_mx_elem_to_f32(hq_mx_code(row, k0 + k, kind), kind),
                              hq_e8m0_to_f32(scale[hq_mx_scale_idx(colwise, i, k0 + k, K)]));
    hq_store_hp(dst, i * K + k0 + k, dtype, y);
  }
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }

} // namespace

extern "C" int mx_cuda_quantize(const mx_job *q, const hq_call *call, const hq_tensor *src) {
  if (q->M * q->K == 0) return HQ_OK;
  cudaStream_t stream = (cudaStream_t)call->stream;
  QArgs a = {src->data, (int)src->dtype, (int)q->kind, q->rule, q->sr, q->seed, q->offset,
             q->M, q->K, nullptr, nullptr};
  if (q->rd) {
    a.data = q->rd, a.scale = q->rs;
    quantize_rows<<<blocks_for(q->M * (q->K / HQ_MX_BLOCK)), 256, 0, stream>>>(a);
    CHECK_LAUNCH(call, "mx quantize (rowwise)");
  }
  if (q->cd) {
    a.data = q->cd, a.scale = q->cs;
    quantize_cols<<<blocks_for((q->M / HQ_MX_BLOCK) * (q->K / 4)), 256, 0, stream>>>(a);
    CHECK_LAUNCH(call, "mx quantize (columnwise)");
  }
  return HQ_OK;
}

extern "C" int mx_cuda_dequantize(const hq_call *call, const uint8_t *data, const uint8_t *scale,
                                  hq_dtype kind, int colwise, hq_tensor *dst) {
  const int64_t M = dst->rows, K = dst->cols;
  if (M * K == 0) return HQ_OK;
  dequantize_rows<<<blocks_for(M * (K / HQ_MX_BLOCK)), 256, 0, (cudaStream_t)call->stream>>>(
      data, scale, (int)kind, colwise, dst->data, (int)dst->dtype, M, K);
  CHECK_LAUNCH(call, "mx dequantize");
  return HQ_OK;
}
