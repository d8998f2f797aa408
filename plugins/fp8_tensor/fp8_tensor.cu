/*
** fp8_tensor.cu -- CUDA kernels of the fp8_tensor plugin: amax reduction, fused cast +
** transpose, dequantize. Element and scale rules come from hq/numerics.h, the same code the CPU
** reference runs, so the bytes agree bit for bit.
**
** quantize: (1) amax kernel: grid-stride max|x| ignoring NaN, atomicMax on the FP32 bits (valid
**           for non-negative floats) into the storage's amax buffer;
**           (2) cast kernel: each block recomputes the scale from that amax (a few flops), then
**           quantizes a 32x32 tile read once from global memory, writes the rowwise bytes and,
**           through shared memory, the transposed columnwise bytes.
*/
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "hq/numerics.h"
#include "fp8_tensor.h"

#define CHECK_LAUNCH(call, what)                                                              \
  do {                                                                                        \
    cudaError_t e_ = cudaGetLastError();                                                      \
    if (e_ != cudaSuccess)                                                                    \
      return (call)->host->error(HQ_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, what,       \
                                 cudaGetErrorString(e_));                                     \
  } while (0)

#define CHECK_CUDA(call, expr)                                                                \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess)                                                                    \
      return (call)->host->error(HQ_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #expr,      \
                                 cudaGetErrorString(e_));                                     \
  } while (0)

namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8; /* block = 32 x 8 threads, 4 rows each */

template <int DT>
__global__ void amax_kernel(const void *__restrict__ x, int64_t n, float *__restrict__ amax) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    m = hq_fmax_nan_ignoring(m, hq_fabs(hq_load_hp(x, i, DT)));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  __shared__ float warp_max[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < (int)(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0 && m > 0.0f) atomicMax(reinterpret_cast<unsigned int *>(amax), __float_as_uint(m));
  }
}

struct CastArgs {
  const void *x;
  int64_t M, K;
  uint8_t *row, *col;
  const float *amax;
  float *scale_inv_out[2], *amax_out[2];
  int kind, pow2;
  float epsilon;
};

template <int DT>
__global__ void cast_transpose_kernel(CastArgs a) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float s_scale;
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float amax = *a.amax;
    float scale = hq_scale_from_amax(amax, hq_fp8_max(a.kind), a.pow2, a.epsilon, FLT_MAX);
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
  const float scale = s_scale;
  const int64_t i0 = (int64_t)blockIdx.x * kTile, j0 = (int64_t)blockIdx.y * kTile;
  const int64_t j = j0 + threadIdx.x;
  for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
    const int64_t i = i0 + r;
    if (i < a.M && j < a.K) {
      uint8_t q = hq_fp8_quantize(hq_load_hp(a.x, i * a.K + j, DT), scale, a.kind);
      if (a.row) a.row[i * a.K + j] = q;
      tile[r][threadIdx.x] = q;
    }
  }
  if (!a.col) return;
  __syncthreads();
  const int64_t ii = i0 + threadIdx.x;
  for (int c = threadIdx.y; c < kTile; c += kRowsPerPass) {
    const int64_t jj = j0 + c;
    if (ii < a.M && jj < a.K) a.col[jj * a.M + ii] = tile[threadIdx.x][c];
  }
}

/* dst[i][j] = q[i][j] * scale_inv (transposed = 0) or q[j][i] * scale_inv (transposed = 1),
   both through a shared tile so that reads and writes are coalesced. */
template <int DT>
__global__ void dequantize_kernel(const uint8_t *__restrict__ q, int transposed,
                                  const float *__restrict__ scale_inv_p, int kind, void *dst,
                                  int64_t M, int64_t K) {
  __shared__ float tile[kTile][kTile + 1];
  const float scale_inv = *scale_inv_p;
  const int64_t i0 = (int64_t)blockIdx.x * kTile, j0 = (int64_t)blockIdx.y * kTile;
  if (!transposed) {
    const int64_t j = j0 + threadIdx.x;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t i = i0 + r;
      if (i < M && j < K) hq_store_hp(dst, i * K + j, DT, hq_fp8_dequantize(q[i * K + j], scale_inv, kind));
    }
    return;
  }
  const int64_t ii = i0 + threadIdx.x;
  for (int c = threadIdx.y; c < kTile; c += kRowsPerPass) {
    const int64_t jj = j0 + c;
    if (ii < M && jj < K) tile[threadIdx.x][c] = hq_fp8_dequantize(q[jj * M + ii], scale_inv, kind);
  }
  __syncthreads();
  const int64_t j = j0 + threadIdx.x;
  for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
    const int64_t i = i0 + r;
    if (i < M && j < K) hq_store_hp(dst, i * K + j, DT, tile[r][threadIdx.x]);
  }
}

int grid_for(const hq_call *call, int64_t M, int64_t K, dim3 *grid) {
  int64_t gx = (M + kTile - 1) / kTile, gy = (K + kTile - 1) / kTile;
  if (gx > 0x7fffffff || gy > 65535)
    return call->host->error(HQ_ESHAPE, "fp8_tensor CUDA: shape [%lld, %lld] exceeds the grid "
                             "limits (cols <= %d)", (long long)M, (long long)K, 65535 * kTile);
  *grid = dim3((unsigned)gx, (unsigned)gy);
  return HQ_OK;
}

template <int DT>
int quantize_t(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src, uint8_t *row,
               uint8_t *col, float *scale_inv, float *amax, float *col_scale_inv,
               float *col_amax) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  float *acc = amax ? amax : col_amax;
  const int64_t n = src->rows * src->cols;
  dim3 grid;
  int rc = grid_for(call, src->rows, src->cols, &grid);
  if (rc) return rc;
  CHECK_CUDA(call, cudaMemsetAsync(acc, 0, sizeof(float), stream));
  int blocks = (int)((n + 1023) / 1024);
  if (blocks > 4096) blocks = 4096;
  amax_kernel<DT><<<blocks, 256, 0, stream>>>(src->data, n, acc);
  CHECK_LAUNCH(call, "amax kernel");
  CastArgs a;
  a.x = src->data;
  a.M = src->rows;
  a.K = src->cols;
  a.row = row;
  a.col = col;
  a.amax = acc;
  a.scale_inv_out[0] = scale_inv;
  a.scale_inv_out[1] = col_scale_inv != scale_inv ? col_scale_inv : NULL;
  a.amax_out[0] = amax != acc ? amax : NULL;
  a.amax_out[1] = col_amax != acc && col_amax != amax ? col_amax : NULL;
  a.kind = cfg->kind;
  a.pow2 = cfg->pow2;
  a.epsilon = cfg->epsilon;
  cast_transpose_kernel<DT><<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(a);
  CHECK_LAUNCH(call, "cast-transpose kernel");
  return HQ_OK;
}

} // namespace

extern "C" int fp8t_cuda_quantize(const fp8t_cfg *cfg, const hq_call *call, const hq_tensor *src,
                                  uint8_t *row, uint8_t *col, float *scale_inv, float *amax,
                                  float *col_scale_inv, float *col_amax) {
  switch (src->dtype) {
  case HQ_F32: return quantize_t<HQ_F32>(cfg, call, src, row, col, scale_inv, amax, col_scale_inv, col_amax);
  case HQ_F16: return quantize_t<HQ_F16>(cfg, call, src, row, col, scale_inv, amax, col_scale_inv, col_amax);
  case HQ_BF16: return quantize_t<HQ_BF16>(cfg, call, src, row, col, scale_inv, amax, col_scale_inv, col_amax);
  default: return call->host->error(HQ_EINVAL, "fp8_tensor CUDA: source dtype %d", (int)src->dtype);
  }
}

extern "C" int fp8t_cuda_dequantize(const fp8t_cfg *cfg, const hq_call *call, const uint8_t *q,
                                    int transposed, const float *scale_inv, hq_tensor *dst) {
  cudaStream_t stream = (cudaStream_t)call->stream;
  dim3 grid;
  int rc = grid_for(call, dst->rows, dst->cols, &grid);
  if (rc) return rc;
  dim3 block(kTile, kRowsPerPass);
  switch (dst->dtype) {
  case HQ_F32: dequantize_kernel<HQ_F32><<<grid, block, 0, stream>>>(q, transposed, scale_inv, cfg->kind, dst->data, dst->rows, dst->cols); break;
  case HQ_F16: dequantize_kernel<HQ_F16><<<grid, block, 0, stream>>>(q, transposed, scale_inv, cfg->kind, dst->data, dst->rows, dst->cols); break;
  case HQ_BF16: dequantize_kernel<HQ_BF16><<<grid, block, 0, stream>>>(q, transposed, scale_inv, cfg->kind, dst->data, dst->rows, dst->cols); break;
  default: return call->host->error(HQ_EINVAL, "fp8_tensor CUDA: destination dtype %d", (int)dst->dtype);
  }
  CHECK_LAUNCH(call, "dequantize kernel");
  return HQ_OK;
}
