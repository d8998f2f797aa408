/*
** launch_cuda.h -- sizing the stock plugins' persistent kernels (resident CTAs, each looping
** over tiles or a grid stride). Private to the stock plugins and libhqtrain's AdamW kernel
** (not installed); host code of .cu files.
**
** hq_cuda_resident<Kernel>(threads, dyn, &n): how many CTAs of `Kernel` (threads per CTA, dyn
** bytes of dynamic shared memory) the current device holds at once (SMs x CTAs per SM, at least
** one per SM), counted once per device and kernel and cached (a race only repeats the same
** work): the occupancy query costs microseconds of host time, which a call that launches a
** 0.1 ms kernel should not pay every time. With dyn > 0 the kernel's dynamic shared memory limit
** is raised to dyn and its carveout set to the most shared memory first (needed above 48 KiB).
** hq_cuda_resident_forget<Kernel>() after a failed launch: the next call sets up again (e.g.
** after a device reset). hq_cuda_device_sms(device): the device's SM count, cached the same way;
** hq_cuda_stride_grid(device, blocks): a grid-stride kernel's grid. hq_cuda_zero_words(a, b, c,
** stream): up to three 4-byte words zeroed by one kernel.
*/
#ifndef HQ_LAUNCH_CUDA_H
#define HQ_LAUNCH_CUDA_H

#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>

constexpr int kHqMaxDevices = 64; /* counts cached per device index below this */

template <auto Kernel> struct hq_cuda_launch_cache {
  static inline std::atomic<int64_t> resident[kHqMaxDevices];
};

/* The SMs of `device` (0 when the runtime cannot tell), asked once per device: a small
   tensor's call is mostly host time. */
inline int hq_cuda_device_sms(int device) {
  static std::atomic<int> cache[kHqMaxDevices]; /* 0: not asked yet */
  std::atomic<int> *slot = device >= 0 && device < kHqMaxDevices ? &cache[device] : nullptr;
  int sms = slot ? slot->load(std::memory_order_relaxed) : 0;
  if (sms > 0) return sms;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (slot) slot->store(sms, std::memory_order_relaxed);
  return sms;
}

/* The grid of a grid-stride kernel of `blocks` CTAs of work on `device`: at most 64 CTAs per SM
   (8 waves of the 8 CTAs of 256 threads an SM holds, enough to even out the tail; more only
   adds launch work). A device whose SMs the runtime cannot count gets 64 CTAs (its launch
   reports the error). */
inline int64_t hq_cuda_stride_grid(int device, int64_t blocks) {
  const int sms = hq_cuda_device_sms(device);
  const int64_t cap = (int64_t)(sms > 0 ? sms : 1) * 64;
  return blocks < cap ? blocks : cap;
}

/* One thread a word; NULL words are skipped. */
template <typename W> __global__ void hq_cuda_zero_kernel(W *a, W *b, W *c) {
  W *const w[3] = {a, b, c};
  if (threadIdx.x < 3 && w[threadIdx.x]) *w[threadIdx.x] = 0;
}

/* Zero the non-NULL 4-byte words a, b and c on the stream, as one kernel: the zeroing before an
   atomic pass sits in every step a trainer captures, and there a memset node costs about twice
   a small kernel's node (scripts/graph_nodes.cu). */
inline cudaError_t hq_cuda_zero_words(void *a, void *b, void *c, cudaStream_t stream) {
  if (!a && !b && !c) return cudaSuccess;
  hq_cuda_zero_kernel<uint32_t><<<1, 32, 0, stream>>>(
      static_cast<uint32_t *>(a), static_cast<uint32_t *>(b), static_cast<uint32_t *>(c));
  return cudaGetLastError();
}

template <auto Kernel> inline cudaError_t hq_cuda_resident(int threads, int dyn, int64_t *n) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::atomic<int64_t> *slot =
      dev >= 0 && dev < kHqMaxDevices ? &hq_cuda_launch_cache<Kernel>::resident[dev] : nullptr;
  int64_t r = slot ? slot->load() : 0;
  if (r <= 0) {
    int sms = 0, per_sm = 0;
    if (dyn > 0 &&
        ((e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn)) !=
             cudaSuccess ||
         (e = cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared)) != cudaSuccess))
      return e;
    if ((sms = hq_cuda_device_sms(dev)) <= 0) return cudaErrorInvalidDevice;
    if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, dyn)) !=
        cudaSuccess)
      return e;
    r = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
    if (slot) slot->store(r);
  }
  *n = r;
  return cudaSuccess;
}

template <auto Kernel> inline void hq_cuda_resident_forget() {
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kHqMaxDevices)
    hq_cuda_launch_cache<Kernel>::resident[dev].store(0);
}

#endif /* HQ_LAUNCH_CUDA_H */
