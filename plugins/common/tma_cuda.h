/*
** tma_cuda.h -- the tensor-memory accelerator (TMA) of sm_90 and later, and the mbarriers its
** copies complete on, for the kernels of the core and of the stock plugins. Private (not
** installed); .cu files only.
**
** Host: hq_cuda_tensor_map_encoder() returns the driver's cuTensorMapEncodeTiled, looked up
** once (the runtime hands out driver entry points, so nothing links libcuda), or NULL where the
** driver has none; a caller without it takes its kernel's path without the TMA.
** hq_tensor_map_2d(map, type, base, inner, outer, pitch, box_inner, box_outer, swizzle, l2)
** encodes a 2-D map with it (no interleave, element strides 1, zeros outside the tensor): a
** tensor of `outer` rows of `inner` elements, `pitch` bytes apart, copied in boxes of
** box_outer x box_inner; CUDA_ERROR_NOT_FOUND without an encoder.
**
** Device (shared-window addresses, as smem_cuda.h takes them). The instructions exist from
** sm_90 on: in an older device's pass (HQ_TMA_ARCH 0) these compile to a trap, and
** hq_tma_on(flag) is false there, so a kernel that tests its launcher's flags through it
** takes its other paths without guards of its own:
**   hq_mbar_init(bar, n)            a barrier that completes a phase after n arrivals
**   hq_mbar_init_fence()            makes the inits visible to the TMA (then a CTA barrier)
**   hq_mbar_expect_tx(bar, bytes)   arrive, and expect `bytes` more from copies this phase
**   hq_mbar_arrive(bar)             arrive
**   hq_mbar_wait(bar, parity)       wait until the phase of that parity has completed
**   hq_tma_load_1d(dst, src, bytes, bar)    `bytes` contiguous bytes (a multiple of 16; both
**                                   addresses 16-byte aligned) of global src into dst; they
**                                   count on bar
**   hq_tma_load_2d(dst, map, bar, c0, c1)   box (c0 innermost, c1) of map into dst; its bytes
**                                   count on bar
**   hq_tma_store_2d(map, c0, c1, src)       src into box (c0, c1) of map, clipped at the
**                                   tensor's edges; in this thread's current bulk group
**   hq_tma_store_commit()           closes the bulk group
**   hq_tma_store_wait_read<N>()     waits until at most N groups still read shared memory
**   hq_tma_store_wait<N>()          ... until at most N groups are not yet done writing
**   hq_fence_proxy_async()          this thread's shared-memory writes become visible to the
**                                   TMA's later reads (a bulk store issued after a barrier)
**   hq_swz128(box, row, chunk, inner)   the address of byte `inner` of 16-byte chunk `chunk`
**                                   of a row of the box at `box` (CU_TENSOR_MAP_SWIZZLE_128B)
**
** A cluster's small exchanges (one-cluster kernels) through the same mbarriers, without the
** GPU-scope memory barrier that a cluster barrier with release semantics compiles to (what
** cooperative groups' barrier_arrive() and sync() issue: MEMBAR.ALL.GPU, then ERRBAR, which
** waits for every memory operation the thread has in flight):
**   hq_cluster_arrive_relaxed()     the cluster barrier's arrival, no memory ordering: it says
**                                   this CTA has started (after hq_mbar_init_fence(), its
**                                   mbarriers are ready for other CTAs' st.async)
**   hq_cluster_wait()               waits for every CTA's arrival (acquire)
**   hq_cluster_open(bar, make, bytes)   every thread at a kernel's start: where `make`, thread
**                                   0 makes the mbarrier at bar to receive `bytes` from other
**                                   CTAs' pushes; then the relaxed arrival
**   hq_cluster_push(dst, rank, lo, hi, bar)   two words into shared-window address dst of CTA
**                                   `rank` of the cluster (st.async), 8 bytes counted on the
**                                   mbarrier at address bar of that CTA
**   hq_cluster_push1(dst, rank, w, bar)   one word, 4 bytes counted
**   hq_mbar_wait_cluster(bar, parity)   hq_mbar_wait acquiring at cluster scope: what other
**                                   CTAs pushed is visible after it
*/
#ifndef HQ_TMA_CUDA_H
#define HQ_TMA_CUDA_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define HQ_TMA_ARCH 0
#define HQ_TMA_ASM(...) __trap()
#else
#define HQ_TMA_ARCH 1
#define HQ_TMA_ASM(...) asm volatile(__VA_ARGS__)
#endif

typedef CUresult (*hq_tensor_map_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                            const cuuint64_t *, const cuuint64_t *,
                                            const cuuint32_t *, const cuuint32_t *,
                                            CUtensorMapInterleave, CUtensorMapSwizzle,
                                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* the lookup itself; hq_cuda_tensor_map_encoder() makes it once per module (a function-local
   static is initialized once, whatever the threads) */
inline hq_tensor_map_encode_fn hq_cuda_tensor_map_lookup(void) {
  void *p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e =
      cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError(); /* the failed query leaves no error behind for the caller's next check */
    return nullptr;
  }
  return reinterpret_cast<hq_tensor_map_encode_fn>(p);
}
inline hq_tensor_map_encode_fn hq_cuda_tensor_map_encoder(void) {
  static const hq_tensor_map_encode_fn fn = hq_cuda_tensor_map_lookup();
  return fn;
}
inline CUresult hq_tensor_map_2d(CUtensorMap *map, CUtensorMapDataType type, const void *base,
                                 uint64_t inner, uint64_t outer, uint64_t pitch, uint32_t box_inner,
                                 uint32_t box_outer, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion l2) {
  const hq_tensor_map_encode_fn enc = hq_cuda_tensor_map_encoder();
  if (!enc) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[2] = {inner, outer}, strides[1] = {pitch};
  const cuuint32_t box[2] = {box_inner, box_outer}, es[2] = {1, 1};
  return enc(map, type, 2, const_cast<void *>(base), dims, strides, box, es,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* whether a launcher's flag that a TMA path may be taken holds in this pass */
__device__ __forceinline__ bool hq_tma_on(int flag) { return HQ_TMA_ARCH && flag != 0; }

__device__ __forceinline__ void hq_mbar_init(uint32_t bar, uint32_t n) {
  HQ_TMA_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(n) : "memory");
}
__device__ __forceinline__ void hq_mbar_init_fence() {
  HQ_TMA_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void hq_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  HQ_TMA_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
             : "memory");
}
__device__ __forceinline__ void hq_mbar_arrive(uint32_t bar) {
  HQ_TMA_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* kCluster: acquire at cluster scope (hq_mbar_wait_cluster), else at the CTA's (the default) */
#define HQ_MBAR_TRY_WAIT(SEM)                                                                  \
  "{\n.reg .pred P;\nmbarrier.try_wait.parity" SEM ".shared::cta.b64 P, [%1], %2;\n"           \
  "selp.u32 %0, 1, 0, P;\n}\n"
template <bool kCluster = false>
__device__ __forceinline__ void hq_mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 1; /* the wait's result (1 where the wait is a trap) */
  do {
    if constexpr (kCluster)
      HQ_TMA_ASM(HQ_MBAR_TRY_WAIT(".acquire.cluster") : "=r"(done) : "r"(bar), "r"(parity)
                 : "memory");
    else
      HQ_TMA_ASM(HQ_MBAR_TRY_WAIT("") : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void hq_tma_load_1d(uint32_t dst, const void *src, uint32_t bytes,
                                               uint32_t bar) {
  HQ_TMA_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
             "[%3];" ::"r"(dst),
             "l"(src), "r"(bytes), "r"(bar)
             : "memory");
}
__device__ __forceinline__ void hq_tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                               int c0, int c1) {
  HQ_TMA_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
             "[%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
             "l"(map), "r"(bar), "r"(c0), "r"(c1)
             : "memory");
}
__device__ __forceinline__ void hq_tma_store_2d(const CUtensorMap *map, int c0, int c1,
                                                uint32_t src) {
  HQ_TMA_ASM(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}
__device__ __forceinline__ void hq_tma_store_commit() {
  HQ_TMA_ASM("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void hq_tma_store_wait_read() {
  HQ_TMA_ASM("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void hq_tma_store_wait() {
  HQ_TMA_ASM("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void hq_fence_proxy_async() {
  HQ_TMA_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void hq_cluster_arrive_relaxed() {
  HQ_TMA_ASM("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void hq_cluster_wait() {
  HQ_TMA_ASM("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void hq_cluster_open(uint32_t bar, bool make, uint32_t bytes) {
  if (make && threadIdx.x == 0) {
    hq_mbar_init(bar, 1);
    hq_mbar_expect_tx(bar, bytes);
    hq_mbar_init_fence();
  }
  hq_cluster_arrive_relaxed();
}
__device__ __forceinline__ void hq_cluster_push(uint32_t dst, uint32_t rank, uint32_t lo,
                                                uint32_t hi, uint32_t bar) {
  HQ_TMA_ASM("{\n.reg .b32 D, B;\n"
             "mapa.shared::cluster.u32 D, %0, %4;\n"
             "mapa.shared::cluster.u32 B, %3, %4;\n"
             "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [D], {%1, %2}, [B];\n}"
             ::"r"(dst), "r"(lo), "r"(hi), "r"(bar), "r"(rank)
             : "memory");
}
__device__ __forceinline__ void hq_cluster_push1(uint32_t dst, uint32_t rank, uint32_t w,
                                                 uint32_t bar) {
  HQ_TMA_ASM("{\n.reg .b32 D, B;\n"
             "mapa.shared::cluster.u32 D, %0, %3;\n"
             "mapa.shared::cluster.u32 B, %2, %3;\n"
             "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [D], %1, [B];\n}"
             ::"r"(dst), "r"(w), "r"(bar), "r"(rank)
             : "memory");
}
__device__ __forceinline__ void hq_mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  hq_mbar_wait<true>(bar, parity);
}

/* The 128-byte swizzle (the box 1024-byte aligned): rows of 128 bytes, row r's 16-byte chunk
   (0-7) at chunk ^ (r & 7), so that 8 consecutive rows' same chunk falls on distinct banks; the
   address of byte `inner` (0-15) of that chunk in the box at `box`. */
__device__ __forceinline__ uint32_t hq_swz128(uint32_t box, int row, int chunk, int inner) {
  return box + (uint32_t)row * 128u + ((uint32_t)(chunk ^ (row & 7)) << 4) + (uint32_t)inner;
}

#endif
