/*
** bench_timer.c -- see bench_timer.h.
*/
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_timer.h"

#ifdef HQ_HAVE_CUDA
#include <cuda_runtime.h>
#endif

struct bench_timer {
  int device;
  struct timespec t0;
#ifdef HQ_HAVE_CUDA
  cudaEvent_t e0, e1;
#endif
};

bench_timer *bench_timer_create(int device, char *err, size_t err_len) {
  bench_timer *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, err_len, "out of memory");
    return NULL;
  }
  t->device = device;
  if (device < 0) return t;
#ifdef HQ_HAVE_CUDA
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaEventCreate(&t->e0);
  if (e == cudaSuccess) e = cudaEventCreate(&t->e1);
  if (e != cudaSuccess) {
    snprintf(err, err_len, "CUDA events on device %d: %s", device, cudaGetErrorString(e));
    free(t);
    return NULL;
  }
  return t;
#else
  snprintf(err, err_len, "this hq was built without CUDA");
  free(t);
  return NULL;
#endif
}

void bench_timer_destroy(bench_timer *t) {
  if (!t) return;
#ifdef HQ_HAVE_CUDA
  if (t->device >= 0) {
    cudaEventDestroy(t->e0);
    cudaEventDestroy(t->e1);
  }
#endif
  free(t);
}

int bench_timer_start(bench_timer *t) {
#ifdef HQ_HAVE_CUDA
  if (t->device >= 0) return cudaEventRecord(t->e0, 0) == cudaSuccess ? 0 : -1;
#endif
  clock_gettime(CLOCK_MONOTONIC, &t->t0);
  return 0;
}

double bench_timer_stop(bench_timer *t) {
#ifdef HQ_HAVE_CUDA
  if (t->device >= 0) {
    float ms = 0;
    if (cudaEventRecord(t->e1, 0) != cudaSuccess || cudaEventSynchronize(t->e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, t->e0, t->e1) != cudaSuccess)
      return -1;
    return ms;
  }
#endif
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t->t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t->t0.tv_nsec) * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int bench_time_calls(bench_timer *t, int iters, int warm, int batch, const bench_timed *f,
                     double *ms, const bench_timed *base, double *base_ms) {
  double *v = calloc(2 * (size_t)iters, sizeof *v);
  if (!v) return -1;
  double *vb = v + iters;
  int rc = 0;
  for (int i = 0; i < iters + warm && !rc; i++) {
    for (int w = base ? 0 : 1; w < 2 && !rc; w++) {
      const bench_timed *c = w ? f : base;
      double *out = w ? v : vb;
      if (i >= warm && bench_timer_start(t)) rc = -1;
      for (int j = 0; j < batch && !rc; j++) rc = c->run(c->arg);
      if (i >= warm && !rc && (out[i - warm] = bench_timer_stop(t) / batch) < 0) rc = -1;
    }
  }
  if (!rc) {
    qsort(v, (size_t)iters, sizeof *v, cmp_double);
    *ms = v[iters / 2];
    if (base) {
      qsort(vb, (size_t)iters, sizeof *vb, cmp_double);
      *base_ms = vb[iters / 2];
    }
  }
  free(v);
  return rc;
}

double bench_copy_bandwidth(int device, size_t bytes, int iters) {
#ifdef HQ_HAVE_CUDA
  void *a = NULL, *b = NULL;
  char err[128];
  bench_timer *t = bench_timer_create(device, err, sizeof err);
  double *ms = calloc((size_t)iters, sizeof *ms), bw = 0;
  if (!t || !ms || cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess)
    goto out;
  cudaMemset(a, 1, bytes);
  for (int i = 0; i < 3; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
  for (int i = 0; i < iters; i++) {
    bench_timer_start(t);
    if (cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) goto out;
    ms[i] = bench_timer_stop(t);
    if (ms[i] <= 0) goto out;
  }
  qsort(ms, (size_t)iters, sizeof *ms, cmp_double);
  bw = 2.0 * (double)bytes / (ms[iters / 2] * 1e-3);
out:
  cudaFree(a);
  cudaFree(b);
  free(ms);
  bench_timer_destroy(t);
  return bw;
#else
  (void)device; (void)bytes; (void)iters;
  return 0;
#endif
}

// --- the counting allocator ----------------------------------------------------------------------

typedef struct mem_block {
  void *ptr;
  size_t bytes;
} mem_block;

struct bench_mem {
  hq_allocator a;
  mem_block *v;
  size_t n, cap;
  size_t current, peak;
  int failed;
};

static void *mem_alloc(void *user, int device, size_t bytes, void *stream) {
  bench_mem *m = user;
  void *p = NULL;
  if (m->n == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    mem_block *v = realloc(m->v, cap * sizeof *v);
    if (!v) {
      m->failed = 1;
      return NULL;
    }
    m->v = v, m->cap = cap;
  }
  if (device < 0) {
    p = malloc(bytes ? bytes : 1);
  } else {
#ifdef HQ_HAVE_CUDA
    if (cudaMallocAsync(&p, bytes ? bytes : 1, (cudaStream_t)stream) != cudaSuccess) p = NULL;
#else
    (void)stream;
#endif
  }
  if (!p) {
    m->failed = 1;
    return NULL;
  }
  m->v[m->n].ptr = p, m->v[m->n].bytes = bytes;
  m->n++;
  m->current += bytes;
  if (m->current > m->peak) m->peak = m->current;
  return p;
}

static void mem_free(void *user, int device, void *ptr, void *stream) {
  bench_mem *m = user;
  if (!ptr) return;
  size_t i = m->n;
  while (i > 0 && m->v[i - 1].ptr != ptr) i--;
  if (i == 0) {
    m->failed = 1; /* not ours: release it all the same */
  } else {
    m->current -= m->v[i - 1].bytes;
    m->v[i - 1] = m->v[--m->n];
  }
  if (device < 0) {
    free(ptr);
  } else {
#ifdef HQ_HAVE_CUDA
    cudaFreeAsync(ptr, (cudaStream_t)stream);
#else
    (void)stream;
#endif
  }
}

bench_mem *bench_mem_create(void) {
  bench_mem *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->a.struct_size = sizeof m->a;
  m->a.alloc = mem_alloc;
  m->a.free = mem_free;
  m->a.user = m;
  return m;
}

void bench_mem_destroy(bench_mem *m) {
  if (!m) return;
  free(m->v);
  free(m);
}

const hq_allocator *bench_mem_allocator(bench_mem *m) { return &m->a; }
size_t bench_mem_current(const bench_mem *m) { return m->current; }
size_t bench_mem_peak(const bench_mem *m) { return m->peak; }
void bench_mem_reset_peak(bench_mem *m) { m->peak = m->current; }
int bench_mem_failed(const bench_mem *m) { return m->failed; }
