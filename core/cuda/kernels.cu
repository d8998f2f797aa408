/*
** kernels.cu -- the core's few CUDA kernels: the element conversion (host->convert, which the
** identity format uses, and the emulated GEMM's operands: a device-to-device copy when the
** dtypes match, otherwise hq/numerics.h's integer rounding, the same code as the CPU path, so the
** bytes agree) and the 2-D transpose the FSDP protocol uses to move transposed copies M-major
** and back; max |x| of a GEMM's output (hq_gemm_args.amax_d, where the GEMM's own epilogue did
** not make it). Everything runs on the caller's stream.
*/
#include <cuda_runtime.h>
#include <stdint.h>

#include "hq/numerics.h"
#include "hq/plugin.h"
#include "hqi_cuda.h"

namespace {

/* Elements 8g..8g+7 of a 16-byte aligned src of dtype ST: their raw bytes (one 16-byte load, or
   two for FP32), then as FP32 */
struct Raw8 {
  uint4 a, b;
};
template <int ST> __device__ __forceinline__ Raw8 load8_raw(const void *src, int64_t g) {
  Raw8 r;
  if (ST == HQ_F32) {
    r.a = ((const uint4 *)src)[2 * g], r.b = ((const uint4 *)src)[2 * g + 1];
  } else {
    r.a = ((const uint4 *)src)[g], r.b = make_uint4(0u, 0u, 0u, 0u);
  }
  return r;
}
template <int ST> __device__ __forceinline__ void raw8_f32(const Raw8 &r, float v[8]) {
  const uint32_t u[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
  for (int k = 0; k < 8; k++) {
    if (ST == HQ_F32) {
      v[k] = hq_bits_f32(u[k]);
    } else {
      const uint16_t h = (uint16_t)(u[k / 2] >> (16 * (k % 2)));
      v[k] = ST == HQ_F16 ? hq_f16_to_f32(h) : hq_bf16_to_f32(h);
    }
  }
}

/* ... and stored into a 16-byte aligned dst of dtype DT, rounded as hq_store_hp rounds */
template <int DT> __device__ __forceinline__ void store8(void *dst, int64_t g, const float v[8]) {
  if (DT == HQ_F32) {
    ((float4 *)dst)[2 * g] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)dst)[2 * g + 1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t u[4];
    for (int k = 0; k < 4; k++) u[k] = hq_pack2_hp16(v[2 * k], v[2 * k + 1], DT);
    ((uint4 *)dst)[g] = make_uint4(u[0], u[1], u[2], u[3]);
  }
}

/* n elements of src (dtype ST) into dst (dtype DT): with vec (both 16-byte aligned) by groups of
   8 elements and 16-byte accesses, the n % 8 last ones (every one without vec) one by one, since
   element-wise accesses leave a conversion far below the copy bandwidth. A thread takes
   kConvertGroups groups a grid stride apart, every group's load issued before any conversion:
   two between 16-bit dtypes, whose one 16-byte load per thread leaves too few bytes in flight,
   one where either side is F32 (its loads or stores are already twice as wide, and a second
   group slowed f16 -> f32 down). A step with fewer groups left (the end) takes them one by one:
   with guarded loads in the one loop the compiler puts a conversion between the loads. The
   measurements behind each choice are in docs/performance.md. */
template <int ST, int DT>
constexpr int kConvertGroups = ST != HQ_F32 && DT != HQ_F32 ? 2 : 1;
template <int ST, int DT>
__global__ void convert_kernel(void *__restrict__ dst, const void *__restrict__ src, int64_t n,
                               int vec) {
  constexpr int G = kConvertGroups<ST, DT>;
  const int64_t t0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t done = 0;
  if (vec) {
    const int64_t ng = n / 8;
    for (int64_t g = t0; g < ng; g += G * stride) {
      Raw8 r[G];
      float v[8];
      const int nj = g + (G - 1) * stride < ng ? G : (int)((ng - 1 - g) / stride) + 1;
      if (nj == G) {
#pragma unroll
        for (int j = 0; j < G; j++) r[j] = load8_raw<ST>(src, g + j * stride);
#pragma unroll
        for (int j = 0; j < G; j++) {
          raw8_f32<ST>(r[j], v);
          store8<DT>(dst, g + j * stride, v);
        }
      } else {
        for (int j = 0; j < nj; j++) {
          raw8_f32<ST>(load8_raw<ST>(src, g + j * stride), v);
          store8<DT>(dst, g + j * stride, v);
        }
      }
    }
    done = ng * 8;
  }
  for (int64_t i = done + t0; i < n; i += stride) hq_store_hp(dst, i, DT, hq_load_hp(src, i, ST));
}

template <int ST, int DT>
void launch_convert(void *dst, const void *src, int64_t n, cudaStream_t stream) {
  const int vec = ((uintptr_t)dst % 16 == 0) && ((uintptr_t)src % 16 == 0);
  int64_t blocks = ((vec ? n / (8 * kConvertGroups<ST, DT>) : n) + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  convert_kernel<ST, DT><<<(unsigned)blocks, 256, 0, stream>>>(dst, src, n, vec);
}

template <int ST>
void launch(void *dst, int dt, const void *src, int64_t n, cudaStream_t stream) {
  if (dt == HQ_F32) launch_convert<ST, HQ_F32>(dst, src, n, stream);
  else if (dt == HQ_F16) launch_convert<ST, HQ_F16>(dst, src, n, stream);
  else launch_convert<ST, HQ_BF16>(dst, src, n, stream);
}

/* dst[c * dld + r] = src[r * sld + c] for r < rows, c < cols, 32x32 tiles through shared memory. */
template <typename T>
__global__ void transpose_kernel(T *__restrict__ dst, int64_t dld, const T *__restrict__ src,
                                 int64_t sld, int64_t rows, int64_t cols) {
  __shared__ T tile[32][33];
  const int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = src[r * sld + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * dld + r] = tile[threadIdx.x][k];
  }
}

template <typename T>
void launch_transpose(void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows,
                      int64_t cols, cudaStream_t s) {
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), block(32, 8);
  transpose_kernel<T><<<grid, block, 0, s>>>((T *)dst, dld, (const T *)src, sld, rows, cols);
}

/* max |x| of n elements, NaN ignored (fmaxf is IEEE maxNum: a chain from 0 drops NaN operands),
   one atomicMax per CTA on the bits (non-negative floats order like their bits); *out was
   zeroed on the stream (zero_words_kernel). */
template <int DT>
__global__ void __launch_bounds__(256) amax_kernel(const void *__restrict__ x, int64_t n,
                                                   unsigned int *__restrict__ out) {
  __shared__ float warp_max[8];
  float m = 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(hq_load_hp(x, i, DT)));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < 8 ? warp_max[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (threadIdx.x == 0 && m > 0.0f) atomicMax(out, __float_as_uint(m));
  }
}

template <int DT>
__global__ void nonfinite_kernel(const void *__restrict__ x, int64_t n,
                                 unsigned long long *__restrict__ out) {
  unsigned long long cnt = 0, first = ~0ull;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = hq_load_hp(x, i, DT);
    if (!(v - v == 0.0f)) { /* NaN or +-Inf (IEEE: x - x is NaN for both) */
      cnt++;
      if ((unsigned long long)i < first) first = (unsigned long long)i;
    }
  }
  if (cnt) {
    atomicAdd(&out[0], cnt);
    atomicMin(&out[1], first);
  }
}

/* words written on the stream: a kernel node, where a memset node would cost a replayed graph
   about twice as much */
template <typename T> __global__ void set_kernel(T *dst, T value) { *dst = value; }
__global__ void zero_words_kernel(uint32_t *dst, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = 0;
}

} // namespace

extern "C" int hqi_cuda_nonfinite(void *stream, const void *data, int dtype, int64_t n,
                                  unsigned long long *out) {
  cudaStream_t s = (cudaStream_t)stream;
  if (n <= 0) return HQ_OK;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  if (dtype == HQ_F32) nonfinite_kernel<HQ_F32><<<(unsigned)blocks, 256, 0, s>>>(data, n, out);
  else if (dtype == HQ_F16) nonfinite_kernel<HQ_F16><<<(unsigned)blocks, 256, 0, s>>>(data, n, out);
  else nonfinite_kernel<HQ_BF16><<<(unsigned)blocks, 256, 0, s>>>(data, n, out);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "%s:%d: non-finite count: %s", __FILE__, __LINE__,
                     cudaGetErrorString(e));
  return HQ_OK;
}

extern "C" int hqi_cuda_amax(void *stream, const void *data, int dtype, int64_t n, float *out) {
  cudaStream_t s = (cudaStream_t)stream;
  int rc = hqi_cuda_zero_words(stream, out, 1);
  if (rc) return rc;
  cudaError_t e = cudaSuccess;
  if (n > 0) {
    /* a grid-stride pass over at most 2048 CTAs: a few per SM, one atomic each */
    int64_t blocks = (n + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    unsigned int *o = reinterpret_cast<unsigned int *>(out);
    if (dtype == HQ_F32) amax_kernel<HQ_F32><<<(unsigned)blocks, 256, 0, s>>>(data, n, o);
    else if (dtype == HQ_F16) amax_kernel<HQ_F16><<<(unsigned)blocks, 256, 0, s>>>(data, n, o);
    else amax_kernel<HQ_BF16><<<(unsigned)blocks, 256, 0, s>>>(data, n, o);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return hqi_error(HQ_EDEVICE, "%s:%d: amax of a GEMM's output: %s", __FILE__, __LINE__,
                     cudaGetErrorString(e));
  }
  return HQ_OK;
}

extern "C" int hqi_cuda_convert(void *stream, void *dst, int dt, const void *src, int st,
                                int64_t n) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e;
  if (n <= 0) return HQ_OK;
  if (dt == st) {
    e = cudaMemcpyAsync(dst, src, (size_t)n * (dt == HQ_F32 ? 4u : 2u), cudaMemcpyDeviceToDevice,
                        s);
  } else {
    if (st == HQ_F32) launch<HQ_F32>(dst, dt, src, n, s);
    else if (st == HQ_F16) launch<HQ_F16>(dst, dt, src, n, s);
    else launch<HQ_BF16>(dst, dt, src, n, s);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "%s:%d: identity conversion: %s", __FILE__, __LINE__,
                     cudaGetErrorString(e));
  return HQ_OK;
}

extern "C" int hqi_cuda_transpose(void *stream, void *dst, int64_t dld, const void *src,
                                  int64_t sld, int64_t rows, int64_t cols, int elem_bytes) {
  cudaStream_t s = (cudaStream_t)stream;
  if (rows <= 0 || cols <= 0) return HQ_OK;
  if ((cols + 31) / 32 > 2147483647 || (rows + 31) / 32 > 65535)
    return hqi_error(HQ_ESHAPE, "transpose of [%lld, %lld]: too many rows for one grid",
                     (long long)rows, (long long)cols);
  switch (elem_bytes) {
  case 1: launch_transpose<uint8_t>(dst, dld, src, sld, rows, cols, s); break;
  case 2: launch_transpose<uint16_t>(dst, dld, src, sld, rows, cols, s); break;
  case 4: launch_transpose<uint32_t>(dst, dld, src, sld, rows, cols, s); break;
  default:
    return hqi_error(HQ_EINTERNAL, "transpose of %d-byte elements", elem_bytes);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "%s:%d: transpose: %s", __FILE__, __LINE__, cudaGetErrorString(e));
  return HQ_OK;
}

extern "C" int hqi_cuda_zero_words(void *stream, void *dst, int64_t n) {
  if (n <= 0) return HQ_OK;
  zero_words_kernel<<<1, 256, 0, (cudaStream_t)stream>>>((uint32_t *)dst, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "%s:%d: zeroing %lld words: %s", __FILE__, __LINE__,
                     (long long)n, cudaGetErrorString(e));
  return HQ_OK;
}

extern "C" int hqi_cuda_set_u64(void *stream, uint64_t *dst, uint64_t value) {
  set_kernel<uint64_t><<<1, 1, 0, (cudaStream_t)stream>>>(dst, value);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "%s:%d: writing the random stream's step: %s", __FILE__,
                     __LINE__, cudaGetErrorString(e));
  return HQ_OK;
}
