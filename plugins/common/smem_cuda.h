/*
** smem_cuda.h -- shared-memory accesses at 32-bit shared-window addresses, for the stock
** plugins' kernels. Private to the stock plugins (not installed); device code only.
**
** On sm_90 a generic pointer into shared memory carries the CTA's place in its cluster, so
** every conversion of one back to a shared-window address (what ld.shared, st.shared and
** cp.async take) costs an S2R of SR_CgaCtaId and a few integer instructions; in a loop that
** rebuilds such pointers per tile the compiler repeats it every iteration. A kernel that takes
** hq_smem_addr() of its buffers once and addresses them by adding offsets to that 32-bit value
** pays it once (hq_pin keeps it there). The loads and stores are `asm volatile` with a memory
** clobber, so the compiler keeps their order against each other, the barriers and every other
** memory access.
*/
#ifndef HQ_SMEM_CUDA_H
#define HQ_SMEM_CUDA_H

#include <stdint.h>

__device__ __forceinline__ uint32_t hq_smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Keeps v in a register as it is: the compiler would rather rebuild a shared-window address
   from the CTA's id (an S2R and a few instructions) than hold it across a long loop body; an
   empty asm that "changes" the value at the top of each iteration stops that. */
__device__ __forceinline__ void hq_pin(uint32_t &v) { asm volatile("" : "+r"(v)::"memory"); }

__device__ __forceinline__ uint32_t hq_lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint2 hq_lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 hq_lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void hq_sts8(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u8 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void hq_sts16(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(a), "h"((unsigned short)v) : "memory");
}
__device__ __forceinline__ void hq_sts32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void hq_sts64(uint32_t a, uint2 v) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(a), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void hq_sts128(uint32_t a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
/* cp.async (sm_80 and later) of 16 bytes global -> shared, to a shared-window address: all of
   them, or n of them and zeros after (n = 0: 16 zero bytes, nothing read); grouped by
   hq_cuda_cp_async_commit(); hq_cuda_cp_async_wait<N>() waits for every group of this thread
   but the newest N -- the multiple buffering of the quantize kernels (the next tiles copied in
   while the current one is encoded). A __syncthreads() after the wait makes every thread's
   copies visible.
   Each copy asks the L2 to fetch the whole 128-byte line it lies in (.L2::128B): the 8 copies
   of a line come from 8 lanes of one warp anyway, so the line is wanted whole, and the hint
   makes the nvfp4 kernels faster (docs/performance.md, section 4). */
__device__ __forceinline__ void hq_cp_async16_at(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src)
               : "memory");
}
__device__ __forceinline__ void hq_cp_async16_n_at(uint32_t dst, const void *src, int n) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(n)
               : "memory");
}
__device__ __forceinline__ void hq_cuda_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void hq_cuda_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices from shared memory (ldmatrix .x4), the MMA fragment loads of the
   modules' own GEMM kernels: lane l gives row address p of matrix l / 8, and register i holds
   the lane's share of matrix i. 8-bit codes load as b16 byte pairs. */
__device__ __forceinline__ void hq_ldmatrix_x4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(hq_smem_addr(p))
               : "memory");
}

#endif /* HQ_SMEM_CUDA_H */
