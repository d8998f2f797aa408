/*
** bench_timer.h -- what both benches of `hq bench` share: timing (host clock on the CPU, CUDA
** events on a device), the device-to-device copy bandwidth measured in the same run (the
** memory-bound ceiling), a counting allocator (current and peak bytes) given to the bench's
** hq_ctx.
*/
#ifndef HQ_BENCH_TIMER_H
#define HQ_BENCH_TIMER_H

#include <stddef.h>

#include "hq/hq.h"

typedef struct bench_timer bench_timer;
/* device < 0: host clock. Returns NULL (with a message in err) on failure. */
bench_timer *bench_timer_create(int device, char *err, size_t err_len);
void bench_timer_destroy(bench_timer *t);
int bench_timer_start(bench_timer *t);
/* Milliseconds since start (waits for the device). Negative on failure. */
double bench_timer_stop(bench_timer *t);
/* A call to time: run(arg) issues one (0, or -1 on failure). */
typedef struct bench_timed {
  int (*run)(void *arg);
  void *arg;
} bench_timed;

/* Median ms per call of f over `iters` samples (after `warm` warm-up samples), a sample being
   `batch` calls issued back to back between two timer reads (its time / batch). With a
   baseline, each sample of f is preceded by one of base, whose median goes to *base_ms: the two
   see the same clocks and neighbours (a shared GPU's rate drifts by several percent between
   rows timed one after the other). 0, or -1 when a call or the timer failed. */
int bench_time_calls(bench_timer *t, int iters, int warm, int batch, const bench_timed *f,
                     double *ms, const bench_timed *base, double *base_ms);

/* Median bandwidth (bytes read + written per second) of cudaMemcpy device-to-device of
   `bytes` bytes, over `iters` runs; 0 on failure or without CUDA. */
double bench_copy_bandwidth(int device, size_t bytes, int iters);

/* A counting allocator: malloc/free on the host, cudaMallocAsync/cudaFreeAsync on the stream it
   is handed on a CUDA device. It records every live block's size, so that the bench can report
   the current and the peak bytes held through the context (inputs, outputs, scratch and
   temporaries alike). Not thread-safe (one bench context). */
typedef struct bench_mem bench_mem;
bench_mem *bench_mem_create(void);
void bench_mem_destroy(bench_mem *m);       /* after the hq_ctx using it is destroyed */
const hq_allocator *bench_mem_allocator(bench_mem *m);
size_t bench_mem_current(const bench_mem *m);
size_t bench_mem_peak(const bench_mem *m);  /* the most held since the last reset */
void bench_mem_reset_peak(bench_mem *m);    /* peak := current */
int bench_mem_failed(const bench_mem *m);   /* an allocation failed or a free was unknown */

#endif
