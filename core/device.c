/*
** device.c -- the core's few CUDA runtime calls (device query, memory, copies, streams).
** Built without CUDA, every device path reports HQ_ENOTSUP and hq_device_count() is 0.
*/
#include "config.h"
#include "hq_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#ifdef HQ_HAVE_CUDA
#include <cuda_runtime.h>

/* A failed call's error is also the runtime's last error until read: it is read here, so that
   the next kernel launch's check does not report it as its own (a caller that clears hq's error,
   as a free does, would leave it behind). */
#define HQ_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      cudaGetLastError();                                                                     \
      return hqi_error(HQ_EDEVICE, "%s:%d: %s failed: %s", __FILE__, __LINE__, #expr,        \
                       cudaGetErrorString(err_));                                             \
    }                                                                                         \
  } while (0)

int hq_built_with_cuda(void) { return 1; }

int hq_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no device" error */
    return 0;
  }
  return n;
}

int hq_device_info(int device, char *name, size_t name_len, int *arch) {
  struct cudaDeviceProp prop;
  HQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (name && name_len) {
    strncpy(name, prop.name, name_len - 1);
    name[name_len - 1] = '\0';
  }
  if (arch) *arch = prop.major * 10 + prop.minor;
  return HQ_OK;
}

int hqi_cuda_arch(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

/* hq's own stream-ordered memory pool per device, made at its first use. It keeps what hq frees
   for reuse (release threshold: unlimited) instead of the default pool's threshold of 0, which
   hands freed memory back at every synchronization and maps it again at the next allocation:
   the emulated GEMM's two operand temporaries cost more to map than to fill. Being hq's own, it
   leaves the process's default pool (and its settings) alone; hq_device_trim releases it. */
#define HQI_MAX_POOLS 64
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaMemPool_t pools[HQI_MAX_POOLS];
/* in_use at the last reset of a pool's peak: the driver's high-water can only be set to zero,
   so until the next allocation it may read below what was in use at the reset, which the peak
   since then includes. */
static uint64_t peak_floor[HQI_MAX_POOLS];

static int pool_of(int device, cudaMemPool_t *out) {
  if (device < 0 || device >= HQI_MAX_POOLS)
    return hqi_error(HQ_EINVAL, "CUDA device %d: hq keeps memory pools for devices 0..%d", device,
                     HQI_MAX_POOLS - 1);
  pthread_mutex_lock(&pool_mu);
  cudaError_t e = cudaSuccess;
  if (!pools[device]) {
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t p = NULL;
    e = cudaMemPoolCreate(&p, &props);
    if (e == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
      if (e == cudaSuccess) pools[device] = p;
      else cudaMemPoolDestroy(p);
    }
  }
  *out = pools[device];
  pthread_mutex_unlock(&pool_mu);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return hqi_error(HQ_EDEVICE, "creating hq's memory pool on CUDA device %d: %s", device,
                     cudaGetErrorString(e));
  }
  return HQ_OK;
}

int hqi_cuda_pool_trim(int device) {
  if (device < 0 || device >= HQI_MAX_POOLS)
    return hqi_error(HQ_EINVAL, "hq_device_trim: CUDA device %d out of range", device);
  pthread_mutex_lock(&pool_mu);
  cudaMemPool_t p = pools[device];
  pthread_mutex_unlock(&pool_mu);
  if (!p) return HQ_OK;
  int saved;
  int rc = hqi_device_enter(device, &saved);
  if (rc) return rc;
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemPoolTrimTo(p, 0);
  hqi_device_leave(saved);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return hqi_error(HQ_EDEVICE, "hq_device_trim: device %d: %s", device, cudaGetErrorString(e));
  }
  return HQ_OK;
}

/* The pool of `device` if hq has made it (NULL: none yet), or HQ_EINVAL for a device past the
   pools hq keeps; *floor its peak_floor. */
static int pool_made(int device, const char *fn, cudaMemPool_t *out, uint64_t *floor) {
  *out = NULL;
  if (device < 0 || device >= HQI_MAX_POOLS)
    return hqi_error(HQ_EINVAL, "%s: CUDA device %d: hq keeps memory pools for devices 0..%d", fn,
                     device, HQI_MAX_POOLS - 1);
  pthread_mutex_lock(&pool_mu);
  *out = pools[device];
  if (floor) *floor = peak_floor[device];
  pthread_mutex_unlock(&pool_mu);
  return HQ_OK;
}

static int pool_attr_failed(const char *fn, int device, const char *call, cudaError_t e) {
  cudaGetLastError();
  return hqi_error(HQ_EDEVICE, "%s: device %d: %s of hq's memory pool: %s", fn, device, call,
                   cudaGetErrorString(e));
}

int hqi_cuda_pool_stats(int device, uint64_t *in_use, uint64_t *peak, uint64_t *reserved) {
  static const char fn[] = "hq_device_mem_stats";
  *in_use = *peak = *reserved = 0;
  cudaMemPool_t p;
  uint64_t floor = 0;
  int rc = pool_made(device, fn, &p, &floor);
  if (rc || !p) return rc;
  int saved;
  if ((rc = hqi_device_enter(device, &saved))) return rc;
  uint64_t used = 0, high = 0, res = 0;
  cudaError_t e = cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemCurrent, &used);
  if (e == cudaSuccess) e = cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemHigh, &high);
  if (e == cudaSuccess) e = cudaMemPoolGetAttribute(p, cudaMemPoolAttrReservedMemCurrent, &res);
  hqi_device_leave(saved);
  if (e != cudaSuccess) return pool_attr_failed(fn, device, "cudaMemPoolGetAttribute", e);
  if (high < floor) high = floor;
  if (high < used) high = used;
  *in_use = used;
  *peak = high;
  *reserved = res;
  return HQ_OK;
}

int hqi_cuda_pool_reset_peak(int device) {
  static const char fn[] = "hq_device_mem_reset_peak";
  cudaMemPool_t p;
  int rc = pool_made(device, fn, &p, NULL);
  if (rc || !p) return rc; /* a pool made later starts with a high-water of zero */
  int saved;
  if ((rc = hqi_device_enter(device, &saved))) return rc;
  uint64_t used = 0, zero = 0;
  cudaError_t e = cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemCurrent, &used);
  const char *call = "cudaMemPoolGetAttribute";
  if (e == cudaSuccess) {
    e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrUsedMemHigh, &zero);
    call = "cudaMemPoolSetAttribute";
  }
  hqi_device_leave(saved);
  if (e != cudaSuccess) return pool_attr_failed(fn, device, call, e);
  pthread_mutex_lock(&pool_mu);
  peak_floor[device] = used;
  pthread_mutex_unlock(&pool_mu);
  return HQ_OK;
}

/* *ev made at its first use: an event that only orders (no timing) */
static int event_made(void **ev) {
  if (!*ev) {
    cudaEvent_t e = NULL;
    HQ_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = e;
  }
  return HQ_OK;
}

int hqi_cuda_event_record(void **ev, void *stream) {
  const int rc = event_made(ev);
  if (rc) return rc;
  HQ_CUDA_CHECK(cudaEventRecord((cudaEvent_t)*ev, (cudaStream_t)stream));
  return HQ_OK;
}

int hqi_cuda_stream_wait_event(void *stream, void *ev) {
  HQ_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0));
  return HQ_OK;
}

int hqi_cuda_stream_create(int device, void **out) {
  *out = NULL;
  int saved;
  int rc = hqi_device_enter(device, &saved);
  if (rc) return rc;
  cudaStream_t st = NULL;
  const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  hqi_device_leave(saved);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return hqi_error(HQ_EDEVICE, "cudaStreamCreateWithFlags on device %d failed: %s", device,
                     cudaGetErrorString(e));
  }
  *out = st;
  return HQ_OK;
}

void hqi_cuda_stream_destroy(void *stream) {
  if (stream && cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess) cudaGetLastError();
}

int hqi_cuda_stream_after(void *waiter, void *signaler) {
  if (waiter == signaler) return HQ_OK;
  void *ev = NULL;
  int rc = hqi_cuda_event_record(&ev, signaler);
  if (!rc) rc = hqi_cuda_stream_wait_event(waiter, ev);
  hqi_cuda_event_destroy(ev); /* released once the wait has been satisfied */
  return rc;
}

void hqi_cuda_event_destroy(void *ev) {
  if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) cudaGetLastError();
}

/* cudaStreamIsCapturing of `stream`, the runtime's last error cleared when it fails (a kernel
   launch checked after it would otherwise report it). An invalidated capture counts: the stream
   stays in capture mode, refusing what a capture refuses, until cudaStreamEndCapture. */
static cudaError_t capture_status(void *stream, int *capturing) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &st);
  if (e != cudaSuccess) cudaGetLastError();
  *capturing = e == cudaSuccess && st != cudaStreamCaptureStatusNone;
  return e;
}

int hqi_cuda_capturing(void *stream) {
  int capturing;
  capture_status(stream, &capturing);
  return capturing;
}

int hqi_cuda_capture_query(void *stream, int *capturing) {
  const cudaError_t e = capture_status(stream, capturing);
  if (e != cudaSuccess)
    return hqi_error(HQ_EDEVICE, "cudaStreamIsCapturing failed: %s", cudaGetErrorString(e));
  return HQ_OK;
}

int hqi_cuda_event_record_use(void **ev, void *stream) {
  int capturing;
  capture_status(stream, &capturing);
  if (!capturing) return hqi_cuda_event_record(ev, stream);
  const int rc = event_made(ev);
  if (rc) return rc;
  HQ_CUDA_CHECK(cudaEventRecordWithFlags((cudaEvent_t)*ev, (cudaStream_t)stream,
                                         cudaEventRecordExternal));
  return HQ_OK;
}

/* Stream-ordered allocation from hq's pool of `device` on `stream`, with the caller's current
   device restored. */
int hqi_cuda_malloc(int device, size_t bytes, void *stream, void **out) {
  *out = NULL;
  int saved;
  int rc = hqi_device_enter(device, &saved);
  if (rc) return rc;
  cudaMemPool_t pool = NULL;
  if ((rc = pool_of(device, &pool))) {
    hqi_device_leave(saved);
    return rc;
  }
  cudaError_t e = cudaMallocFromPoolAsync(out, bytes ? bytes : 1, pool, (cudaStream_t)stream);
  hqi_device_leave(saved);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *out = NULL;
    return hqi_error(e == cudaErrorMemoryAllocation ? HQ_ENOMEM : HQ_EDEVICE,
                     "cudaMallocFromPoolAsync of %zu bytes on device %d: %s", bytes, device,
                     cudaGetErrorString(e));
  }
  return HQ_OK;
}

void hqi_cuda_free(int device, void *ptr, void *stream) {
  if (!ptr) return;
  int saved;
  if (hqi_device_enter(device, &saved)) return;
  if (cudaFreeAsync(ptr, (cudaStream_t)stream) != cudaSuccess) cudaGetLastError();
  hqi_device_leave(saved);
}

int hqi_device_enter(int device, int *saved) {
  *saved = -1;
  if (device < 0) return HQ_OK;
  int cur = -1;
  HQ_CUDA_CHECK(cudaGetDevice(&cur));
  *saved = cur;
  if (cur != device) HQ_CUDA_CHECK(cudaSetDevice(device));
  return HQ_OK;
}

void hqi_device_leave(int saved) {
  int cur = -1;
  if (saved < 0) return;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != saved) cudaSetDevice(saved);
}

int hqi_cuda_memset(void *dst, int value, size_t bytes, void *stream) {
  if (!bytes) return HQ_OK;
  HQ_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream));
  return HQ_OK;
}

int hqi_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                    void *stream) {
  if (bytes == 0) return HQ_OK;
  enum cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_device < 0 && src_device < 0) kind = cudaMemcpyHostToHost;
  HQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)stream));
  return HQ_OK;
}

int hqi_cuda_sync(void *stream) {
  HQ_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return HQ_OK;
}

#else /* !HQ_HAVE_CUDA */

static int no_cuda(void) {
  return hqi_error(HQ_ENOTSUP, "this libhqcore was built without CUDA (configure --with-cuda)");
}

int hq_built_with_cuda(void) { return 0; }
int hq_device_count(void) { return 0; }
int hq_device_info(int device, char *name, size_t name_len, int *arch) {
  (void)device; (void)name; (void)name_len; (void)arch;
  return no_cuda();
}
int hqi_cuda_arch(int device) { (void)device; return 0; }
int hqi_cuda_pool_trim(int device) {
  (void)device;
  return no_cuda();
}
int hqi_cuda_pool_stats(int device, uint64_t *in_use, uint64_t *peak, uint64_t *reserved) {
  (void)device;
  *in_use = *peak = *reserved = 0;
  return no_cuda();
}
int hqi_cuda_pool_reset_peak(int device) {
  (void)device;
  return no_cuda();
}
int hqi_cuda_capturing(void *stream) {
  (void)stream;
  return 0;
}
int hqi_cuda_capture_query(void *stream, int *capturing) {
  (void)stream;
  *capturing = 0;
  return no_cuda();
}
int hqi_cuda_event_record(void **ev, void *stream) {
  (void)ev; (void)stream;
  return no_cuda();
}
int hqi_cuda_stream_wait_event(void *stream, void *ev) {
  (void)stream; (void)ev;
  return no_cuda();
}
int hqi_cuda_event_record_use(void **ev, void *stream) {
  (void)ev; (void)stream;
  return no_cuda();
}
int hqi_cuda_stream_after(void *waiter, void *signaler) {
  (void)waiter; (void)signaler;
  return no_cuda();
}
void hqi_cuda_event_destroy(void *ev) { (void)ev; }
int hqi_cuda_stream_create(int device, void **out) {
  (void)device;
  *out = NULL;
  return no_cuda();
}
void hqi_cuda_stream_destroy(void *stream) { (void)stream; }
int hqi_cuda_malloc(int device, size_t bytes, void *stream, void **out) {
  (void)device; (void)bytes; (void)stream;
  *out = NULL;
  return no_cuda();
}
void hqi_cuda_free(int device, void *ptr, void *stream) { (void)device; (void)ptr; (void)stream; }
int hqi_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                    void *stream) {
  (void)dst; (void)dst_device; (void)src; (void)src_device; (void)bytes; (void)stream;
  return no_cuda();
}
int hqi_cuda_sync(void *stream) { (void)stream; return no_cuda(); }
int hqi_device_enter(int device, int *saved) {
  *saved = -1;
  return device < 0 ? HQ_OK : no_cuda();
}
void hqi_device_leave(int saved) { (void)saved; }
int hqi_cuda_memset(void *dst, int value, size_t bytes, void *stream) {
  (void)dst; (void)value; (void)bytes; (void)stream;
  return no_cuda();
}
int hqi_cuda_convert(void *stream, void *dst, int dt, const void *src, int st, int64_t n) {
  (void)stream; (void)dst; (void)dt; (void)src; (void)st; (void)n;
  return no_cuda();
}
int hqi_cuda_nonfinite(void *stream, const void *data, int dtype, int64_t n,
                       unsigned long long *out) {
  (void)stream; (void)data; (void)dtype; (void)n; (void)out;
  return no_cuda();
}
int hqi_cuda_amax(void *stream, const void *data, int dtype, int64_t n, float *out) {
  (void)stream; (void)data; (void)dtype; (void)n; (void)out;
  return no_cuda();
}
int hqi_cuda_transpose(void *stream, void *dst, int64_t dld, const void *src, int64_t sld,
                       int64_t rows, int64_t cols, int elem_bytes) {
  (void)stream; (void)dst; (void)dld; (void)src; (void)sld; (void)rows; (void)cols;
  (void)elem_bytes;
  return no_cuda();
}
int hqi_cuda_set_u64(void *stream, uint64_t *dst, uint64_t value) {
  (void)stream; (void)dst; (void)value;
  return no_cuda();
}
int hqi_cuda_zero_words(void *stream, void *dst, int64_t n) {
  (void)stream; (void)dst; (void)n;
  return no_cuda();
}

#endif
