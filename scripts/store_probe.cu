// store_probe.cu -- how fast the GPU's memory system takes the loads and stores of a quantize
// kernel's layout when nothing is computed: the ceiling a real kernel of that layout works under.
//
// Built and run on the device by `scripts/gpu-check.sh --on-device --probe` (nvcc, sm_90a; the
// TMA helpers of plugins/common/tma_cuda.h). Not part of the library or its tests.
//
// The model is nvfp4's both-directions quantize of an 8192 x 8192 BF16 input: per element the
// input's 2 bytes read once, the rowwise data (K / 2 bytes per row) and scales (K / 16), the
// columnwise data (M / 2 bytes per column) and scales (M / 16) written once; the bytes counted
// are those, as `hq bench` counts (a) with a given amax. Each variant is a persistent kernel (as
// many CTAs as fit, at most `occ` per SM) that walks groups of G tiles of TM x TK stacked along
// M, the groups in row-major order over the CTAs, the tiles of a group top to bottom, as the
// quantize kernels walk them. Each tile comes in by the TMA (TK / 64 boxes of TM rows x 64
// elements, 128-byte swizzle, NS buffers, an mbarrier each, one CTA barrier per tile). Then the
// threads store, from registers, with 16-byte stores where the pieces allow:
//   - the tile's rowwise pieces: a row's TK / 2 data bytes and TK / 16 scale bytes;
//   - the columnwise lines of a group (a column's G * TM / 2 data bytes and G * TM / 16 scale
//     bytes): "end" stores a group's lines after its last tile, "parts" stores part j (TK / G
//     columns) of the CTA's previous group with tile j, as nvfp4's kernel does.
// The values stored are a word of the tile and a running XOR, so no store goes before its tile
// has landed; no output is meaningful. Each figure is the median of 31 samples of 10 launches
// back to back (as `hq bench` times), as % of a 1 GiB device-to-device copy in the same run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tma_cuda.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      printf("store_probe.cu:%d: %s\n", __LINE__, cudaGetErrorString(e_));                      \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 10;   // launches per sample
constexpr int kSamples = 31; // after 3 warm-up samples

struct Out {
  uint8_t *rd, *rs, *cd, *cs; // rowwise data, scales; columnwise data, scales
  int M, K;
};

__device__ __forceinline__ void st16(uint8_t *p, uint4 v) { *reinterpret_cast<uint4 *>(p) = v; }

// ROW: store the rowwise pieces; COL: 0 no columnwise stores, 1 a group's lines at its end, 2 by
// parts during the next group
template <int TM, int TK, int G, int NS, int ROW, int COL>
__global__ void __launch_bounds__(kThreads) probe(Out p, const __grid_constant__ CUtensorMap tmx) {
  extern __shared__ uint8_t smem[];
  __shared__ __align__(8) uint64_t bar[NS];
  constexpr int kTileBytes = TM * TK * 2;
  const int t = threadIdx.x;
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t base = (raw + 1023u) & ~1023u; // the swizzle's alignment
  const uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(bar);
  if (t < NS) hq_mbar_init(bar_s + 8 * t, 1);
  hq_mbar_init_fence();
  __syncthreads();
  const int ntk = p.K / TK, ngm = p.M / (TM * G);
  // the CTA's n-th tile: slot n % G of its (n / G)-th group
  auto tile = [&](int n, int &i0, int &k0) {
    const int g = blockIdx.x + (n / G) * gridDim.x, j = n % G;
    if (g >= ntk * ngm) return false;
    i0 = ((g / ntk) * G + j) * TM, k0 = (g % ntk) * TK;
    return true;
  };
  auto issue = [&](int n) {
    int i0, k0;
    if (t == 0 && tile(n, i0, k0)) {
      const int s = n % NS;
      hq_mbar_expect_tx(bar_s + 8 * s, kTileBytes);
#pragma unroll
      for (int b = 0; b < TK / 64; b++)
        hq_tma_load_2d(base + s * kTileBytes + b * TM * 128, &tmx, bar_s + 8 * s, k0 + 64 * b, i0);
    }
  };
  for (int n = 0; n < NS - 1; n++) issue(n);
  uint32_t acc = 0;
  for (int n = 0;; n++) {
    int i0, k0;
    if (!tile(n, i0, k0)) break;
    __syncthreads(); // buffer (n - 1) % NS is free
    issue(n + NS - 1);
    const int s = n % NS;
    hq_mbar_wait(bar_s + 8 * s, (n / NS) & 1);
    const uint32_t w =
        *reinterpret_cast<const volatile uint32_t *>(smem + (base - raw) + s * kTileBytes + 4 * t);
    acc ^= w;
    if (ROW) {
      constexpr int kCh = TK / 32; // 16-byte chunks of a row's data piece
#pragma unroll
      for (int q = 0; q < (TM * kCh + kThreads - 1) / kThreads; q++) {
        const int idx = t + kThreads * q;
        if (idx < TM * kCh)
          st16(p.rd + (size_t)(i0 + idx / kCh) * (p.K / 2) + k0 / 2 + 16 * (idx % kCh),
               make_uint4(w, acc, q, idx));
      }
      if constexpr (TK / 16 >= 16) {
        constexpr int kS = TK / 256;
        for (int idx = t; idx < TM * kS; idx += kThreads)
          st16(p.rs + (size_t)(i0 + idx / kS) * (p.K / 16) + k0 / 16 + 16 * (idx % kS),
               make_uint4(w, acc, 1, idx));
      } else if (t < TM) {
        *reinterpret_cast<uint2 *>(p.rs + (size_t)(i0 + t) * (p.K / 16) + k0 / 16) =
            make_uint2(w, acc);
      }
    }
    const int j = n % G;
    // columns c0 .. c0 + nc - 1 of the group whose first row is g0 and first column kk0
    auto store_cols = [&](int g0, int kk0, int c0, int nc) {
      constexpr int kCh = G * TM / 32; // 16-byte chunks of a column line
      for (int idx = t; idx < nc * kCh; idx += kThreads)
        st16(p.cd + (size_t)(kk0 + c0 + idx / kCh) * (p.M / 2) + g0 / 2 + 16 * (idx % kCh),
             make_uint4(w, acc, 2, idx));
      constexpr int kSB = G * TM / 16; // a column's scale bytes
      if constexpr (kSB >= 16) {
        constexpr int kS = kSB / 16;
        for (int idx = t; idx < nc * kS; idx += kThreads)
          st16(p.cs + (size_t)(kk0 + c0 + idx / kS) * (p.M / 16) + g0 / 16 + 16 * (idx % kS),
               make_uint4(w, acc, 3, idx));
      } else if constexpr (kSB == 8) {
        if (t < nc)
          *reinterpret_cast<uint2 *>(p.cs + (size_t)(kk0 + c0 + t) * (p.M / 16) + g0 / 16) =
              make_uint2(w, acc);
      } else if (t < nc) {
        *reinterpret_cast<uint32_t *>(p.cs + (size_t)(kk0 + c0 + t) * (p.M / 16) + g0 / 16) = w;
      }
    };
    const int g0 = i0 - j * TM;
    if (COL == 1 && j == G - 1) store_cols(g0, k0, 0, TK);
    if (COL == 2) {
      if (n >= G) { // part j of the CTA's previous group
        const int pg = blockIdx.x + (n / G - 1) * gridDim.x;
        store_cols((pg / ntk) * G * TM, (pg % ntk) * TK, j * (TK / G), TK / G);
      }
      int ni0, nk0;
      if (j == G - 1 && !tile(n + 1, ni0, nk0)) store_cols(g0, k0, 0, TK); // the CTA's last
    }
  }
  if (acc == 0x12345679u && t == kThreads) smem[0] = 1; // never: keeps acc alive
}

template <class F> float median_ms(F launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> v;
  for (int i = 0; i < kSamples + 3; i++) {
    CK(cudaEventRecord(e0));
    for (int b = 0; b < kBatch; b++) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) v.push_back(ms / kBatch);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Ctx {
  Out p;
  int sms;
  double copy; // bytes/s of the 1 GiB device-to-device copy
};

void report(const Ctx &c, const char *name, double bytes, float ms) {
  printf("  %-44s %8.4f ms %6.0f GB/s %5.1f%%\n", name, ms, bytes / (ms * 1e-3) * 1e-9,
         100 * bytes / (ms * 1e-3) / c.copy);
}

template <int TM, int TK, int G, int NS, int ROW, int COL>
void run(const Ctx &c, const CUtensorMap &tmx, int occ, const char *what) {
  auto k = probe<TM, TK, G, NS, ROW, COL>;
  constexpr int kMax = 220 * 1024;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
  // shared memory padded so that at most occ CTAs fit on an SM
  const int dyn = std::min(kMax, std::max(NS * TM * TK * 2 + 1024, kMax / occ - 2048));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, dyn));
  const int grid = std::min(c.sms * per_sm, (c.p.M / (TM * G)) * (c.p.K / TK));
  const double in = 2.0 * c.p.M * c.p.K, dir = c.p.M * (double)c.p.K * (0.5 + 1.0 / 16);
  const double bytes = in + (ROW ? dir : 0) + (COL ? dir : 0);
  const float ms = median_ms([&] { k<<<grid, kThreads, dyn>>>(c.p, tmx); });
  char name[128];
  snprintf(name, sizeof name, "%s %dx%d G%d NS%d %d/SM", what, TM, TK, G, NS, per_sm);
  report(c, name, bytes, ms);
}

__global__ void __launch_bounds__(256) plain_read(const uint4 *x, size_t n, uint32_t *out) {
  uint32_t a = 0;
  const size_t stride = (size_t)gridDim.x * 256 * 8;
  for (size_t i = blockIdx.x * 256 * 8 + threadIdx.x; i < n; i += stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = __ldcs(x + i + 256 * u);
#pragma unroll
    for (int u = 0; u < 8; u++) a ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (a == 0x12345679u) *out = a;
}

} // namespace

int main() {
  const int M = 8192, K = 8192;
  Ctx c{};
  CK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  printf("# store_probe: %s, %d SMs; %dx%d bf16 input; %% of a 1 GiB device-to-device copy\n",
         pr.name, c.sms, M, K);
  uint8_t *x, *big0, *big1;
  CK(cudaMalloc(&x, (size_t)M * K * 2));
  CK(cudaMalloc(&c.p.rd, (size_t)M * K / 2));
  CK(cudaMalloc(&c.p.rs, (size_t)M * K / 16));
  CK(cudaMalloc(&c.p.cd, (size_t)M * K / 2));
  CK(cudaMalloc(&c.p.cs, (size_t)M * K / 16));
  CK(cudaMalloc(&big0, 1u << 30));
  CK(cudaMalloc(&big1, 1u << 30));
  CK(cudaMemset(x, 0x3c, (size_t)M * K * 2));
  CK(cudaMemset(big0, 1, 1u << 30));
  c.p.M = M, c.p.K = K;
  CUtensorMap m32{}, m64{}, m128{};
  const CUtensorMapDataType bf16 = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_128B;
  const CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  if (hq_tensor_map_2d(&m32, bf16, x, K, M, (uint64_t)K * 2, 64, 32, sw, l2) != CUDA_SUCCESS ||
      hq_tensor_map_2d(&m64, bf16, x, K, M, (uint64_t)K * 2, 64, 64, sw, l2) != CUDA_SUCCESS ||
      hq_tensor_map_2d(&m128, bf16, x, K, M, (uint64_t)K * 2, 64, 128, sw, l2) != CUDA_SUCCESS) {
    printf("store_probe: no tensor map (driver without cuTensorMapEncodeTiled?)\n");
    return 1;
  }
  for (int rep = 0; rep < 2; rep++) {
    const float mc = median_ms([&] {
      CK(cudaMemcpyAsync(big1, big0, 1u << 30, cudaMemcpyDeviceToDevice));
    });
    c.copy = 2.0 * (1u << 30) / (mc * 1e-3);
    printf("round %d: copy %.0f GB/s = 100%%\n", rep + 1, c.copy * 1e-9);
    const size_t n16 = (size_t)M * K * 2 / 16;
    report(c, "read, plain 16-byte loads", 2.0 * M * K, median_ms([&] {
             plain_read<<<c.sms * 8, 256>>>((const uint4 *)x, n16, (uint32_t *)big1);
           }));
    run<64, 128, 1, 4, 0, 0>(c, m64, 2, "read, TMA tiles");
    run<32, 256, 1, 3, 1, 0>(c, m32, 3, "rowwise only");
    run<64, 128, 1, 3, 1, 0>(c, m64, 2, "rowwise only");
    run<128, 64, 1, 3, 0, 1>(c, m128, 3, "columnwise only");
    run<64, 128, 1, 3, 1, 1>(c, m64, 2, "both, lines at the end");
    run<64, 128, 2, 3, 1, 1>(c, m64, 2, "both, lines at the end");
    run<64, 128, 4, 3, 1, 1>(c, m64, 2, "both, lines at the end");
    run<64, 128, 4, 3, 1, 2>(c, m64, 2, "both, lines by parts (nvfp4's layout)");
    run<64, 128, 8, 3, 1, 2>(c, m64, 2, "both, lines by parts");
    run<64, 128, 16, 3, 1, 2>(c, m64, 2, "both, lines by parts");
    run<128, 128, 4, 3, 1, 2>(c, m128, 2, "both, lines by parts");
    run<32, 256, 8, 3, 1, 2>(c, m32, 2, "both, lines by parts");
    run<32, 256, 16, 3, 1, 2>(c, m32, 2, "both, lines by parts");
    run<32, 256, 32, 3, 1, 2>(c, m32, 2, "both, lines by parts");
    run<64, 256, 4, 3, 1, 2>(c, m64, 2, "both, lines by parts");
    run<64, 256, 8, 3, 1, 2>(c, m64, 2, "both, lines by parts");
    run<128, 256, 4, 2, 1, 2>(c, m128, 1, "both, lines by parts");
  }
  return 0;
}
