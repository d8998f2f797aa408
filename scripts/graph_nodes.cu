// graph_nodes.cu -- what a replayed CUDA graph pays per node of each kind a captured training step
// holds: kernels, stream-ordered allocations and frees, memsets, and work forked onto a second
// stream and joined back by events.
//
// Built and run on the device by `scripts/gpu-check.sh --on-device --graph-probe` (nvcc, sm_90).
// Not part of the library or its tests.
//
// Each configuration captures a chain of K tiny kernels (64 CTAs of 256 threads, each thread one
// multiply-add on a 64 KiB buffer: about as small as a kernel gets, so the figure is the node's
// own cost) on one non-blocking stream; A of them are preceded by an allocation of 256 KiB from a
// memory pool and followed by its free, with one more kernel writing the buffer in between (on
// the capturing stream, or with `side` on a second stream forked and joined by events); S
// memsets of 4 bytes are spread over the chain. The graph is instantiated once, replayed 20
// times to warm, then timed as the median of 30 samples of 20 replays back to back.
//
// The second table asks what programmatic dependent launch (PDL) would save between kernels: a
// chain of K kernels of one size (tiny as above, or a pass over 4 MiB read and written, a
// small-tensor kernel's size) launched plainly, or with the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization and each kernel waiting for the one before
// it (griddepcontrol.wait) before it touches memory, having let the next launch early
// (griddepcontrol.launch_dependents) -- the form every kernel of a step would take.
//
// The third asks what a replay costs when it starts on an idle GPU, as `hq train`'s do (it reads
// each step's loss before it launches the next): a chain of K tiny kernels with P pairs of two
// more spread over it, each pair's first kernel forked onto a second stream and joined back (an
// emulated GEMM's two dequantizes) or both on the capturing stream (chained); per configuration
// the replay's time back to back (as above) and its wall time launched and synchronized one at a
// time (the host's clock, median of 30 after 20 to warm).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

__global__ void tiny(float *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 0.5f + 1.0f;
}

static void launch_tiny(float *p, cudaStream_t s) {
  tiny<<<64, 256, 0, s>>>(p, 16384);
  CK(cudaGetLastError());
}

/* Microseconds per replay of g on s (median of 30 samples of 20 replays back to back, after 20
   to warm); g is destroyed. */
static float replay_us(cudaGraph_t g, cudaStream_t s) {
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 20; w++) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> v;
  for (int r = 0; r < 30; r++) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms * 1000.0f / 20);
  }
  std::sort(v.begin(), v.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return v[v.size() / 2];
}

/* What a configuration captures on: two non-blocking streams, a fork and a join event, and a
   zeroed buffer of `bytes` (probe_free releases them). */
struct Probe {
  cudaStream_t s, s2;
  cudaEvent_t fork, join;
  float *base;
};
static Probe probe_make(size_t bytes) {
  Probe p;
  CK(cudaStreamCreateWithFlags(&p.s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&p.s2, cudaStreamNonBlocking));
  CK(cudaMalloc(&p.base, bytes));
  CK(cudaMemset(p.base, 0, bytes));
  CK(cudaEventCreateWithFlags(&p.fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&p.join, cudaEventDisableTiming));
  return p;
}
static void probe_free(Probe &p) {
  CK(cudaEventDestroy(p.fork));
  CK(cudaEventDestroy(p.join));
  CK(cudaFree(p.base));
  CK(cudaStreamDestroy(p.s));
  CK(cudaStreamDestroy(p.s2));
}
/* A tiny kernel on buf forked onto s2 and joined back to s; with main_buf, one on s beside it. */
static void forked_tiny(const Probe &p, float *buf, float *main_buf) {
  CK(cudaEventRecord(p.fork, p.s));
  CK(cudaStreamWaitEvent(p.s2, p.fork, 0));
  launch_tiny(buf, p.s2);
  if (main_buf) launch_tiny(main_buf, p.s);
  CK(cudaEventRecord(p.join, p.s2));
  CK(cudaStreamWaitEvent(p.s, p.join, 0));
}

/* The back-to-back time of g on s (replay_us's) and the wall time of one replay launched and
   synchronized at a time, in *synced (us, median of 30 after 20 to warm); g is destroyed. */
static float replay_both_us(cudaGraph_t g, cudaStream_t s, float *synced) {
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> v;
  for (int r = 0; r < 50; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    const auto t1 = std::chrono::steady_clock::now();
    if (r >= 20) v.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
  }
  std::sort(v.begin(), v.end());
  *synced = v[v.size() / 2];
  CK(cudaGraphExecDestroy(ge));
  return replay_us(g, s);
}

/* The graph of K tiny kernels with P pairs (forked or chained) on fresh streams: its two times
   (replay_both_us). */
static float run_pairs(int K, int P, bool fork, float *synced) {
  Probe pr = probe_make(3 << 20);
  float *ta = pr.base + (1 << 18), *tb = pr.base + (2 << 18);
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(pr.s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0, p = 0; k < K; k++) {
    launch_tiny(pr.base, pr.s);
    if (p < P && k % std::max(1, K / std::max(1, P)) == 0) {
      if (fork) {
        forked_tiny(pr, ta, tb);
      } else {
        launch_tiny(ta, pr.s);
        launch_tiny(tb, pr.s);
      }
      p++;
    }
  }
  CK(cudaStreamEndCapture(pr.s, &g));
  const float us = replay_both_us(g, pr.s, synced);
  probe_free(pr);
  return us;
}

/* PDL: the next kernel may launch now; this one waits for the one before it to complete (its
   memory visible) before any access. Without the launch attribute both are no-ops. */
template <bool PDL> __device__ __forceinline__ void pdl_enter() {
  if (PDL) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
}
/* n floats a grid-stride, 4 a thread a step: y = x * 0.5 + 1 from one half into the other */
template <bool PDL> __global__ void pass(float *p, int n) {
  pdl_enter<PDL>();
  const float4 *x = reinterpret_cast<const float4 *>(p);
  float4 *y = reinterpret_cast<float4 *>(p + n);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += gridDim.x * blockDim.x) {
    const float4 v = x[i];
    y[i] = make_float4(v.x * 0.5f + 1.0f, v.y * 0.5f + 1.0f, v.z * 0.5f + 1.0f, v.w * 0.5f + 1.0f);
  }
}

/* Microseconds per replay of a chain of K kernels of n floats each (grid blocks of 256
   threads), with PDL or without. */
static float run_chain(int K, int n, int blocks, bool pdl) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *buf;
  CK(cudaMalloc(&buf, 2 * (size_t)n * sizeof(float)));
  CK(cudaMemset(buf, 0, 2 * (size_t)n * sizeof(float)));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < K; k++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, pdl ? pass<true> : pass<false>, buf, n));
  }
  CK(cudaStreamEndCapture(s, &g));
  const float us = replay_us(g, s);
  CK(cudaFree(buf));
  CK(cudaStreamDestroy(s));
  return us;
}

/* Microseconds per replay of the graph of one configuration. */
static float run(int K, int A, int S, int side, cudaMemPool_t pool) {
  Probe pr = probe_make(1 << 20);
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(pr.s, cudaStreamCaptureModeThreadLocal));
  int a = 0, m = 0;
  for (int k = 0; k < K; k++) {
    if (a < A && k % std::max(1, K / std::max(1, A)) == 0) {
      void *t;
      CK(cudaMallocFromPoolAsync(&t, 256 << 10, pool, pr.s));
      if (side)
        forked_tiny(pr, (float *)t, nullptr);
      else
        launch_tiny((float *)t, pr.s);
      CK(cudaFreeAsync(t, pr.s));
      a++;
    }
    if (m < S && k % std::max(1, K / std::max(1, S)) == 0) {
      CK(cudaMemsetAsync(pr.base + 1024 * m, 0, 4, pr.s));
      m++;
    }
    launch_tiny(pr.base, pr.s);
  }
  CK(cudaStreamEndCapture(pr.s, &g));
  const float us = replay_us(g, pr.s);
  probe_free(pr);
  return us;
}

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  cudaMemPool_t pool;
  cudaMemPoolProps pp = {};
  pp.allocType = cudaMemAllocationTypePinned;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = 0;
  CK(cudaMemPoolCreate(&pool, &pp));
  /* the pool keeps what was freed, as hq's context pool does: no allocation reaches the driver
     once warm */
  uint64_t keep = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  printf("%s: us per replay (median of 30 x 20) of K kernels, A allocation/free pairs (each with\n"
         "a kernel writing it, on the stream or forked onto a side stream), S memsets\n", p.name);
  const int cfg[][4] = {{40, 0, 0, 0},  {58, 0, 0, 0},   {80, 0, 0, 0}, {40, 18, 0, 0},
                        {40, 18, 0, 1}, {40, 0, 10, 0},  {40, 18, 10, 1}};
  for (const auto &c : cfg)
    printf("K %2d  A %2d  S %2d  side %d: %7.2f us\n", c[0], c[1], c[2], c[3],
           run(c[0], c[1], c[2], c[3], pool));
  printf("\nus per replay of a chain of K kernels, plain / with PDL (the saving per kernel):\n");
  const int chain[][3] = {{40, 16384, 16}, {80, 16384, 16}, {40, 1 << 18, 264},
                          {40, 1 << 20, 528}, {80, 1 << 20, 528}};
  for (const auto &c : chain) {
    const float a = run_chain(c[0], c[1], c[2], false), b = run_chain(c[0], c[1], c[2], true);
    printf("K %2d  %8d floats (%4d CTAs): %8.2f / %8.2f us  (%.2f us a kernel)\n", c[0], c[1],
           c[2], a, b, (a - b) / c[0]);
  }
  printf("\nus per replay of K kernels with P pairs, forked / chained: back to back, and one\n"
         "replay launched and synchronized at a time (the host's wall clock)\n");
  const int pairs[][2] = {{40, 0}, {40, 6}, {40, 12}, {60, 12}};
  for (const auto &c : pairs) {
    float sf = 0.0f, sc = 0.0f;
    const float bf = run_pairs(c[0], c[1], true, &sf), bc = run_pairs(c[0], c[1], false, &sc);
    printf("K %2d  P %2d: back to back %7.2f / %7.2f us, synced %7.2f / %7.2f us\n", c[0],
           c[1], bf, bc, sf, sc);
  }
  CK(cudaMemPoolDestroy(pool));
  return 0;
}
