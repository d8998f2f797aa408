/*
** bench_timer.h -- timing for `hq bench`: host clock on the CPU, CUDA events on a device, and the
** device-to-device copy bandwidth measured in the same run (the memory-bound ceiling).
*/
#ifndef HQ_BENCH_TIMER_H
#define HQ_BENCH_TIMER_H

#include <stddef.h>

typedef struct bench_timer bench_timer;
/* device < 0: host clock. Returns NULL (with a message in err) on failure. */
bench_timer *bench_timer_create(int device, char *err, size_t err_len);
void bench_timer_destroy(bench_timer *t);
int bench_timer_start(bench_timer *t);
/* Milliseconds since start (waits for the device). Negative on failure. */
double bench_timer_stop(bench_timer *t);
/* Median bandwidth (bytes read + written per second) of cudaMemcpy device-to-device of
   `bytes` bytes, over `iters` runs; 0 on failure or without CUDA. */
double bench_copy_bandwidth(int device, size_t bytes, int iters);

#endif
