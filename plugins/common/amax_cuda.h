/*
** amax_cuda.h -- the per-tensor amax pass of the stock plugins' kernels (fp8_tensor's current
** scaling, nvfp4's global scales): max |x| over a whole tensor, NaN ignored, Inf counted -- the
** CPU reference's rule (hq_fmax_nan_ignoring) -- written into one or two device floats.
** Private to the stock plugins (not installed).
**
** hq_cuda_amax<DT>(x, n, vec, t0, t1, stream): n elements, taken 8 at a time (the last n % 8
** by the first CTA, one each); vec: x 16-byte aligned (16-byte loads), else element loads. The
** targets need no zeroing by the caller. A tensor of at most kHqAmaxClusterElems elements is
** reduced by one cluster of kHqAmaxCluster CTAs, which gather their maxima in the first CTA's
** shared memory and store the result: one kernel and nothing else, because in a captured step a
** memset node costs about twice a small kernel's node (docs/performance.md), and a small
** model's step is a chain of such nodes. A larger tensor takes a zeroing of the targets (one
** kernel: launch_cuda.h's hq_cuda_zero_words) and as many CTAs as are resident (launch_cuda.h,
** counted once per device), each thread with 4 independent 8-element loads in flight per step
** and each CTA's maximum going out in one atomicMax per target (bits of a non-negative float
** order like the values, so the result does not depend on the atomics' order). The max is
** fmaxf(m, |v|) from 0 (IEEE maxNum drops a NaN operand: one instruction per element, never
** NaN).
** The pass walks the tensor backwards (8-element vector g of a thread's walk is vector n8 - 1 - g;
** a warp still reads 512 contiguous bytes), so that when it ends the L2 cache holds the head of
** the tensor, which the cast kernel after it in the same call reads first (the caches keep what
** was read last). HQ_AMAX_FORWARD=1 walks it forwards (for measuring).
**
** The cluster form's maxima go through a mailbox, HqClusterBox (tma_cuda.h's st.async into
** the receivers' shared memory, counted on their mbarrier): each receiver waits on its own
** mbarrier, and no cluster barrier with release semantics is left in them (it compiles to a
** GPU-wide memory barrier that waits for all the thread's memory operations in flight, a large
** share of a small kernel that exchanges a few words).
** hq_cuda_cluster_open(box, receives) at the kernel's start; hq_cuda_cluster_max_first(m0, m1,
** box): two maxima over the cluster to the first CTA's thread 0 (nvfp4's one-cluster RHT pass,
** the cluster form here); hq_cuda_cluster_max2_all(m0, m1, box): to every thread of every CTA,
** for a kernel that goes on to use them (nvfp4's small quantize, which makes its own global
** amaxes). hq_cuda_cta_atomic_max(u, t0, t1): the atomic form's ending, shared the same way
** (nvfp4's pass, fp8_tensor's delayed cast, adam_cuda.h's write-back amax).
*/
#ifndef HQ_AMAX_CUDA_H
#define HQ_AMAX_CUDA_H

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "hp_load_cuda.h"
#include "launch_cuda.h"
#include "smem_cuda.h"
#include "tma_cuda.h"

constexpr int kHqAmaxThreads = 256;
/* 8 CTAs: the portable cluster size; 2^17 elements are 8 vectors per thread of such a cluster,
   two rounds of its four loads in flight, about what the atomic form's kernel and memset cost */
constexpr int kHqAmaxCluster = 8;
constexpr int64_t kHqAmaxClusterElems = (int64_t)1 << 17;
#ifndef HQ_AMAX_FORWARD
#define HQ_AMAX_FORWARD 0
#endif

/* One step of an amax: CUDA's fmaxf is IEEE maxNum (a NaN operand gives the other one), so a
   chain started at 0 is max |x| with NaN ignored and Inf counted -- hq_fmax_nan_ignoring's rule,
   the CPU's amax (docs/formats.md) -- in one instruction per element. A partial maximum of a
   chain not started at 0 is NaN only when every element behind it is; every final chain must
   start at 0. The stock plugins' block and tensor amaxes all take it. */
__device__ __forceinline__ float hq_cuda_amax_step(float m, float x) { return fmaxf(m, fabsf(x)); }

/* The maximum of every thread's m over the CTA, on thread 0 (the others return 0): warp
   shuffles, then the warps' maxima through shared memory. */
template <int THREADS> __device__ __forceinline__ float hq_cuda_cta_max(float m) {
  __shared__ float warp_max[THREADS / 32];
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  m = 0.0f;
  if (warp == 0) {
    m = lane < THREADS / 32 ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }
  return threadIdx.x == 0 ? m : 0.0f;
}

/* The maximum of every thread's u over the CTA (u: the bits of a non-negative float, which order
   like the values), atomically maxed by one thread into each non-NULL target, none when it is 0:
   a grid's CTAs make the whole maximum in any order, one atomic per CTA and target (the stock
   plugins' amax passes, delayed scaling's cast, AdamW's write-back amax). Every thread of the
   CTA (blockDim.x * blockDim.y threads, a multiple of 32) calls it; a second call in the same
   kernel comes after a __syncthreads() (the warps' maxima share one array). */
__device__ __forceinline__ void hq_cuda_cta_atomic_max(uint32_t u, float *t0, float *t1) {
  __shared__ uint32_t warp_max[32];
  const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x, lane = tid & 31, warp = tid >> 5;
  u = __reduce_max_sync(0xffffffffu, u);
  if (lane == 0) warp_max[warp] = u;
  __syncthreads();
  if (warp == 0) {
    const unsigned nwarps = (blockDim.x * blockDim.y) >> 5;
    u = __reduce_max_sync(0xffffffffu, lane < nwarps ? warp_max[lane] : 0u);
    if (lane == 0 && u) {
      if (t0) atomicMax(reinterpret_cast<unsigned int *>(t0), u);
      if (t1) atomicMax(reinterpret_cast<unsigned int *>(t1), u);
    }
  }
}

/* A cluster's mailbox: slot c receives CTA c's pair of maxima, the mbarrier counts their
   bytes. Every CTA's box is at the same shared-memory offset (one kernel's static layout). */
struct HqClusterBox {
  float2 v[kHqAmaxCluster];
  uint64_t bar;
};

/* Every thread, at the kernel's start: a receiving CTA's box made ready for every CTA's pair,
   then this CTA's relaxed arrival (the barrier's wait, before the first push, proves the
   receivers have started and made their mbarriers). A cluster of one CTA (nvfp4's one-cluster
   quantize of a one-tile tensor) needs no mbarrier: st.async is undefined there (PTX ISA), so
   its pair is stored and read back in place. */
__device__ __forceinline__ void hq_cuda_cluster_open(HqClusterBox *box, bool receives) {
  const unsigned n = cooperative_groups::this_cluster().num_blocks();
  hq_cluster_open(hq_smem_addr(&box->bar), receives && n > 1, 8u * n);
}

/* Every thread's (m0, m1) maxed over the CTA, pushed into slot `rank` of the boxes of CTAs 0 ..
   receivers - 1 (thread c to CTA c); every thread calls it once, after hq_cuda_cluster_open. */
template <int THREADS>
__device__ __forceinline__ void hq_cuda_cluster_push_max(float m0, float m1, HqClusterBox *box,
                                                         unsigned receivers) {
  __shared__ float2 warp_max[THREADS / 32];
  for (int off = 16; off > 0; off >>= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, off));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, off));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = make_float2(m0, m1);
  __syncthreads();
  hq_cluster_wait();
  if (threadIdx.x < receivers) {
    float2 r = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++)
      r = make_float2(fmaxf(r.x, warp_max[w].x), fmaxf(r.y, warp_max[w].y));
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    if (cl.num_blocks() == 1)
      box->v[0] = r; /* thread 0, to itself (hq_cuda_cluster_open) */
    else
      hq_cluster_push(hq_smem_addr(&box->v[cl.block_rank()]), threadIdx.x, __float_as_uint(r.x),
                      __float_as_uint(r.y), hq_smem_addr(&box->bar));
  }
}

/* The pairs this CTA's box received (it waits for all of them), maxed. In a cluster of one
   CTA the caller orders thread 0's store before the reads. */
__device__ __forceinline__ float2 hq_cuda_cluster_box_max(HqClusterBox *box) {
  const unsigned n = cooperative_groups::this_cluster().num_blocks();
  if (n > 1) hq_mbar_wait_cluster(hq_smem_addr(&box->bar), 0);
  float2 r = make_float2(0.0f, 0.0f);
  for (unsigned c = 0; c < n; c++)
    r = make_float2(fmaxf(r.x, box->v[c].x), fmaxf(r.y, box->v[c].y));
  return r;
}

/* The cluster form's ending: every thread's m0 and m1 maxed over the cluster, returned to the
   first CTA's thread 0 (true there, false elsewhere; only the first CTA opened its box to
   receive; in a cluster of one that thread stored its pair itself). No CTA waits for another
   after its push. */
template <int THREADS>
__device__ __forceinline__ bool hq_cuda_cluster_max_first(float &m0, float &m1,
                                                          HqClusterBox *box) {
  hq_cuda_cluster_push_max<THREADS>(m0, m1, box, 1);
  if (cooperative_groups::this_cluster().block_rank() != 0 || threadIdx.x != 0) return false;
  const float2 r = hq_cuda_cluster_box_max(box);
  m0 = r.x, m1 = r.y;
  return true;
}

/* Every thread's m0 and m1 maxed over the whole cluster and returned to every thread of every
   CTA (every CTA opened its box to receive): each CTA's pair goes to every box, and each
   thread reduces its own CTA's, so no CTA reads another's memory and none waits for the others
   to exit. The maxima are of non-negative values from 0 (fmaxf would drop a NaN, so a NaN may
   not stand for one). */
template <int THREADS>
__device__ __forceinline__ void hq_cuda_cluster_max2_all(float &m0, float &m1, HqClusterBox *box) {
  const unsigned n = cooperative_groups::this_cluster().num_blocks();
  hq_cuda_cluster_push_max<THREADS>(m0, m1, box, n);
  if (n == 1) __syncthreads(); /* thread 0's pair, stored in place */
  const float2 r = hq_cuda_cluster_box_max(box);
  m0 = r.x, m1 = r.y;
}

/* CL: launched as one cluster of kHqAmaxCluster CTAs (the first CTA stores the result),
   else any grid (atomicMax into targets the launcher zeroed). */
template <int DT, bool VEC, bool CL>
__global__ void __launch_bounds__(kHqAmaxThreads)
    hq_cuda_amax_kernel(const void *__restrict__ x, int64_t n, float *t0, float *t1) {
  __shared__ HqClusterBox box;
  if (CL) hq_cuda_cluster_open(&box, cooperative_groups::this_cluster().block_rank() == 0);
  const int64_t n8 = n / 8;
  float m = 0.0f;
  if (blockIdx.x == 0 && threadIdx.x < n % 8) m = fabsf(hq_load_hp(x, n8 * 8 + threadIdx.x, DT));
  const int64_t stride = (int64_t)gridDim.x * kHqAmaxThreads;
  int64_t g = (int64_t)blockIdx.x * kHqAmaxThreads + threadIdx.x;
  /* vector g of the walk: the tensor's vector n8 - 1 - g (backwards) */
  const int64_t last = HQ_AMAX_FORWARD ? 0 : n8 - 1, dir = HQ_AMAX_FORWARD ? 1 : -1;
  for (; g + 3 * stride < n8; g += 4 * stride) {
    float v[4][8];
#pragma unroll
    for (int u = 0; u < 4; u++)
      hq_cuda_load8<DT>(x, (last + dir * (g + u * stride)) * 8, VEC, v[u]);
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int e = 0; e < 8; e++) m = hq_cuda_amax_step(m, v[u][e]);
  }
  for (; g < n8; g += stride) {
    float v[8];
    hq_cuda_load8<DT>(x, (last + dir * g) * 8, VEC, v);
#pragma unroll
    for (int e = 0; e < 8; e++) m = hq_cuda_amax_step(m, v[e]);
  }
  if (CL) { /* the first CTA's thread 0 stores the maximum */
    float unused = 0.0f;
    if (hq_cuda_cluster_max_first<kHqAmaxThreads>(m, unused, &box)) {
      if (t0) *t0 = m;
      if (t1) *t1 = m;
    }
    return;
  }
  hq_cuda_cta_atomic_max(__float_as_uint(m), t0, t1);
}

/* Launch `kernel` as `grid` CTAs of `threads` threads (and dyn bytes of dynamic shared memory)
   in clusters of `cluster` (grid a multiple of it); hq_cuda_launch_cluster: one cluster of
   kHqAmaxCluster. */
template <typename... P, typename... A>
inline cudaError_t hq_cuda_launch_clusters_dyn(void (*kernel)(P...), unsigned grid,
                                               unsigned cluster, int threads, size_t dyn,
                                               cudaStream_t stream, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = dyn;
  cfg.stream = stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = cluster;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}
template <typename... P, typename... A>
inline cudaError_t hq_cuda_launch_clusters(void (*kernel)(P...), unsigned grid, unsigned cluster,
                                           int threads, cudaStream_t stream, A... args) {
  return hq_cuda_launch_clusters_dyn(kernel, grid, cluster, threads, 0, stream, args...);
}
template <typename... P, typename... A>
inline cudaError_t hq_cuda_launch_cluster(void (*kernel)(P...), int threads, cudaStream_t stream,
                                          A... args) {
  return hq_cuda_launch_clusters(kernel, kHqAmaxCluster, kHqAmaxCluster, threads, stream, args...);
}

template <int DT, bool VEC>
inline cudaError_t hq_cuda_amax_v(const void *x, int64_t n, float *t0, float *t1,
                                  cudaStream_t stream) {
  if (n <= kHqAmaxClusterElems)
    return hq_cuda_launch_cluster(hq_cuda_amax_kernel<DT, VEC, true>, kHqAmaxThreads, stream, x,
                                  n, t0, t1);
  cudaError_t e = hq_cuda_zero_words(t0, t1, nullptr, stream);
  if (e != cudaSuccess) return e;
  int64_t resident = 0;
  e = hq_cuda_resident<hq_cuda_amax_kernel<DT, VEC, false>>(kHqAmaxThreads, 0, &resident);
  if (e != cudaSuccess) return e;
  int64_t blocks = (n / 8 + kHqAmaxThreads - 1) / kHqAmaxThreads;
  if (blocks > resident) blocks = resident;
  hq_cuda_amax_kernel<DT, VEC, false>
      <<<(unsigned)blocks, kHqAmaxThreads, 0, stream>>>(x, n, t0, t1);
  const cudaError_t l = cudaGetLastError();
  if (l != cudaSuccess) hq_cuda_resident_forget<hq_cuda_amax_kernel<DT, VEC, false>>();
  return l;
}

template <int DT>
inline cudaError_t hq_cuda_amax(const void *x, int64_t n, bool vec, float *t0, float *t1,
                                cudaStream_t stream) {
  return vec ? hq_cuda_amax_v<DT, true>(x, n, t0, t1, stream)
             : hq_cuda_amax_v<DT, false>(x, n, t0, t1, stream);
}

#endif /* HQ_AMAX_CUDA_H */
