/*
** test_mx_cols_host.cu -- the MX COLS kernels' body (cols_tile in plugins/mx/mx.cu: the columnwise
** copy alone, a warp per 32 x 32 tile) run on the host against the CPU reference (mx.c, the
** oracle), byte for byte, with no GPU: 32 host threads run the body as the 32 lanes of a warp,
** its shuffles and ballots exchanged through a barrier (an exchange that not every lane makes
** at once fails the test, as divergence would on the device).
** Cases: BF16 and F16, every element kind, both scale rules, K % 256 of 0-224 (a last CTA of
** 1-8 warps), inputs with NaN, Inf, all-zero, subnormal and RCEIL-boundary blocks, every scale
** code, codes about the packed FP6 form's minimum, and an output 4 bytes off its alignment
** (byte stores); plus the multiplier words the kernel makes from pairs of scale codes against
** mx_rules.h's, every pair.
** What the host cannot stand in for is the device's NaN-propagating packed maximum (a host form
** here) and its FP8 convert instructions; tests/test_gpu_mx runs the kernels themselves.
** Exit 0 pass, 1 fail.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <vector>
#include <atomic>

/* the simulated warp */
static pthread_barrier_t g_bar;
static uint32_t g_slot[32];
static int g_kind[32], g_arg[32];
static thread_local int t_lane;
static std::atomic<long> g_ops{0};
static std::atomic<int> g_bad{0};
static uint32_t exch(uint32_t v, int kind, int arg, int src) {
  g_slot[t_lane] = v;
  g_kind[t_lane] = kind;
  g_arg[t_lane] = arg;
  pthread_barrier_wait(&g_bar);
  for (int l = 0; l < 32; l++)
    if (g_kind[l] != kind || g_arg[l] != arg) {
      if (!g_bad.exchange(1))
        fprintf(stderr, "divergent exchange: lane %d op %d/%d, lane %d op %d/%d\n", t_lane, kind,
                arg, l, g_kind[l], g_arg[l]);
    }
  uint32_t r;
  if (kind == 3) { /* ballot */
    r = 0;
    for (int l = 0; l < 32; l++) r |= (g_slot[l] ? 1u : 0u) << l;
  } else {
    r = g_slot[src];
  }
  if (t_lane == 0) g_ops++;
  pthread_barrier_wait(&g_bar);
  return r;
}
/* the body's instantiation with these exchanges is host code only: the device forms never run */
#if defined(__CUDA_ARCH__)
#define SIM(x) return 0
#else
#define SIM(x) return x
#endif
struct SimLanes {
  static __host__ __device__ uint32_t shfl(uint32_t v, int src) { SIM(exch(v, 0, 0, src & 31)); }
  static __host__ __device__ uint32_t shfl_xor(uint32_t v, int m) {
    SIM(exch(v, 1, m, (t_lane ^ m) & 31));
  }
  static __host__ __device__ uint32_t shfl_down(uint32_t v, int d) {
    SIM(exch(v, 2, d, t_lane + d < 32 ? t_lane + d : t_lane));
  }
  static __host__ __device__ uint32_t ballot(bool p) { SIM(exch(p, 3, 0, 0)); }
};

#include "../plugins/mx/mx.cu"

extern "C" void mx_cols_ref_quantize(const mx_job *q, const void *x, hq_dtype dt);

struct Job {
  QArgs a;
  int dt, kind;
  uint32_t gx, gc; /* row blocks, CTA column blocks */
};
static Job g_job;

template <int DT, int KIND> static void run_lane() {
  const Job &J = g_job;
  for (uint32_t bi = 0; bi < J.gx; bi++)
    for (uint32_t bj = 0; bj < J.gc; bj++)
      for (int wp = 0; wp < kColsWarps; wp++) {
        cols_tile<DT, KIND, SimLanes>(J.a, bi, bj * kColsCols + wp * kBlk, t_lane);
        exch(0, 9, 0, 0); /* every lane ends the tile at the same exchange */
      }
}
static void *lane_main(void *p) {
  t_lane = (int)(intptr_t)p;
  const int dt = g_job.dt, kind = g_job.kind;
  if (dt == HQ_BF16 && kind == HQ_E2M1X2) run_lane<HQ_BF16, HQ_E2M1X2>();
  if (dt == HQ_BF16 && kind == HQ_E3M2X4) run_lane<HQ_BF16, HQ_E3M2X4>();
  if (dt == HQ_BF16 && kind == HQ_E2M3X4) run_lane<HQ_BF16, HQ_E2M3X4>();
  if (dt == HQ_F16 && kind == HQ_E2M1X2) run_lane<HQ_F16, HQ_E2M1X2>();
  if (dt == HQ_F16 && kind == HQ_E3M2X4) run_lane<HQ_F16, HQ_E3M2X4>();
  if (dt == HQ_F16 && kind == HQ_E2M3X4) run_lane<HQ_F16, HQ_E2M3X4>();
  return nullptr;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static float gauss() {
  float s = 0;
  for (int k = 0; k < 4; k++) s += (float)(rnd() % 20001) / 10000.0f - 1.0f;
  return s;
}

/* An input with special columnwise blocks: per-block magnitudes from 2^-140 to 2^20, NaN, Inf,
   zeros, subnormals, values past the maximum, all-zero blocks, blocks of tiny values. */
static std::vector<float> make_input(int64_t M, int64_t K, int variant) {
  std::vector<float> x((size_t)(M * K));
  for (int64_t i0 = 0; i0 < M; i0 += 32)
    for (int64_t j = 0; j < K; j++) {
      const int r = (int)(rnd() % 16);
      int ex = (int)(rnd() % 40) - 20;
      if (variant == 1 && r < 6) ex = -100 - (int)(rnd() % 40); /* tiny blocks: low codes */
      if (variant == 2 && r < 10) ex = 0;                          /* mostly plain */
      if (variant == 3) ex = (int)(rnd() % 258) - 130;   /* every scale code, no specials */
      if (variant == 4) ex = (int)(rnd() % 10) - 122;    /* about the packed FP6 form's emin */
      for (int r2 = 0; r2 < 32; r2++) x[(size_t)((i0 + r2) * K + j)] = ldexpf(gauss(), ex);
      const uint32_t what = rnd() % 64;
      const int64_t at = (i0 + (int64_t)(rnd() % 32)) * K + j;
      if (variant < 2) {
        if (what == 0) x[at] = NAN;
        if (what == 1) x[at] = INFINITY;
        if (what == 2) x[at] = -INFINITY;
        if (what == 3) /* an all-zero block */
          for (int r2 = 0; r2 < 32; r2++) x[(size_t)((i0 + r2) * K + j)] = (r2 & 1) ? -0.0f : 0.0f;
        if (what == 4) /* values near 2^-133 (BF16 subnormals) */
          for (int r2 = 0; r2 < 32; r2++)
            x[(size_t)((i0 + r2) * K + j)] = ldexpf((float)(r2 - 16) * 3.0f + 0.5f, -133);
        if (what == 5) x[at] = 1e30f;
        if (what == 6) x[at] = 1e-40f;
        if (what == 7) x[at] = 100.0f;
        if (what == 8) x[at] = -7.6f;
        if (what == 9) /* an RCEIL boundary: the element maximum times a power of two */
          x[at] = ldexpf(6.0f, (int)(rnd() % 30) - 15);
        if (what == 10) x[at] = ldexpf(7.5f, (int)(rnd() % 30) - 15);
        if (what == 11) x[at] = ldexpf(28.0f, (int)(rnd() % 30) - 15);
      }
    }
  return x;
}

/* the bytes of one output against the reference's; pad: guard bytes before and after buf */
static int cmp(const char *what, const std::vector<uint8_t> &ref, const uint8_t *got,
               const std::vector<uint8_t> &buf, int pad, int64_t rowb, const char *tag) {
  for (size_t n = 0; n < ref.size(); n++)
    if (got[n] != ref[n]) {
      printf("FAIL %s %s: byte %zu (row %lld, byte %lld) ref %02x sim %02x\n", what, tag, n,
             (long long)(n / rowb), (long long)(n % rowb), ref[n], got[n]);
      return 1;
    }
  for (int b = 0; b < pad; b++)
    if (buf[b] != 0x55) { printf("FAIL %s %s: byte before written\n", what, tag); return 1; }
  for (size_t b = ref.size() + pad; b < buf.size(); b++)
    if (buf[b] != 0x55) { printf("FAIL %s %s: byte after written\n", what, tag); return 1; }
  return 0;
}

static int one(int dt, int kind, int rule, int64_t M, int64_t K, int variant, int misalign) {
  std::vector<float> xf = make_input(M, K, variant);
  std::vector<uint16_t> xh((size_t)(M * K));
  for (size_t n = 0; n < xh.size(); n++) hq_store_hp(xh.data(), (int64_t)n, (hq_dtype)dt, xf[n]);
  const int64_t rowb = hq_mx_row_bytes(K, kind);
  std::vector<uint8_t> cd_ref((size_t)(M * rowb), 0xAA), cs_ref((size_t)(M / 32 * K), 0xAA);
  std::vector<uint8_t> cd_buf((size_t)(M * rowb) + 16, 0x55), cs((size_t)(M / 32 * K), 0x55);
  const int pad = misalign ? 4 : 0;
  uint8_t *cd = cd_buf.data() + pad;
  mx_job q;
  memset(&q, 0, sizeof q);
  q.kind = (hq_dtype)kind;
  q.rule = rule;
  q.M = M;
  q.K = K;
  q.cd = cd_ref.data();
  q.cs = cs_ref.data();
  mx_cols_ref_quantize(&q, xh.data(), (hq_dtype)dt);
  QArgs a;
  memset(&a, 0, sizeof a);
  a.x = xh.data();
  a.M = M;
  a.K = K;
  a.rowb = rowb;
  a.kb = K / 32;
  a.cd = cd;
  a.cs = cs.data();
  a.rule = rule;
  a.vec = 1;
  a.st8 = ((uintptr_t)cd & 7) == 0;
  a.row_major = 1;
  a.tiles = 1;
  g_job.a = a;
  g_job.dt = dt;
  g_job.kind = kind;
  g_job.gx = (uint32_t)(M / 32);
  g_job.gc = (uint32_t)((K + kColsCols - 1) / kColsCols);
  pthread_t th[32];
  for (int l = 0; l < 32; l++) pthread_create(&th[l], nullptr, lane_main, (void *)(intptr_t)l);
  for (int l = 0; l < 32; l++) pthread_join(th[l], nullptr);
  char tag[128];
  snprintf(tag, sizeof tag, "dt %d kind %d rule %d [%lld, %lld] v%d mis %d", dt, kind, rule,
           (long long)M, (long long)K, variant, misalign);
  int bad = g_bad.load();
  if (!bad) bad = cmp("col scale", cs_ref, cs.data(), cs, 0, K, tag);
  if (!bad) bad = cmp("col data", cd_ref, cd, cd_buf, pad, rowb, tag);
  return bad;
}

/* the multiplier words made from pairs of scale codes against mx_rules.h's, every pair */
static int check_words() {
  int bad = 0;
  for (uint32_t e0 = 0; e0 < 256; e0++)
    for (uint32_t e1 = 0; e1 < 256; e1++) {
      const uint32_t ew = e0 | e1 << 16;
      for (int rule = 0; rule < 2; rule++)
        if (hq_mx_e2m1_bf16_ok((uint8_t)e0, rule) && hq_mx_e2m1_bf16_ok((uint8_t)e1, rule)) {
          uint32_t m1, m2;
          cols_bf16_mult2(ew, &m1, &m2);
          const uint32_t w1 = (hq_mx_bf16_mult2((uint8_t)e0, 0) & 0xffffu) |
                              (hq_mx_bf16_mult2((uint8_t)e1, 0) & 0xffff0000u);
          const uint32_t w2 = (hq_mx_bf16_mult2((uint8_t)e0, 1) & 0xffffu) |
                              (hq_mx_bf16_mult2((uint8_t)e1, 1) & 0xffff0000u);
          if (m1 != w1 || m2 != w2) {
            if (bad++ < 5)
              printf("FAIL mult2 e %u %u: %08x %08x vs %08x %08x\n", e0, e1, m1, m2, w1, w2);
          }
        }
      const int kinds[2] = {HQ_E3M2X4, HQ_E2M3X4};
      for (int k = 0; k < 2; k++)
        if (hq_mx_fp6_bf16_ok((uint8_t)e0, kinds[k]) && hq_mx_fp6_bf16_ok((uint8_t)e1, kinds[k])) {
          const uint32_t nd = cols_fp6_nd2(ew, kinds[k]);
          const uint32_t want = hq_mx_fp6_bf16_nd((uint8_t)e0, kinds[k]) |
                                hq_mx_fp6_bf16_nd((uint8_t)e1, kinds[k]) << 16;
          if (nd != want) {
            if (bad++ < 10)
              printf("FAIL nd e %u %u kind %d: %08x vs %08x\n", e0, e1, kinds[k], nd, want);
          }
        }
    }
  printf("multiplier words: %d failures\n", bad);
  return bad;
}

int main(void) {
  pthread_barrier_init(&g_bar, nullptr, 32);
  if (check_words()) return 1;
  /* K % 256 of 0, 32, 96, 160, 224; HQ_TEST_FULL adds 32 x 32, a second 224 and a wide tensor of
     several row blocks */
  const int64_t quick[][2] = {{32, 256}, {64, 288}, {32, 352}, {96, 416}, {32, 480}};
  const int64_t full[][2] = {{32, 32}, {64, 736}, {128, 1056}};
  const int dts[2] = {HQ_BF16, HQ_F16}, kinds[3] = {HQ_E2M1X2, HQ_E3M2X4, HQ_E2M3X4};
  const int n_shapes = 5 + (getenv("HQ_TEST_FULL") ? 3 : 0);
  int fails = 0, runs = 0;
  for (int s = 0; s < n_shapes; s++) {
    const int64_t *sh = s < 5 ? quick[s] : full[s - 5];
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < 3; k++)
        for (int rule = 0; rule < 2; rule++)
          for (int variant = 0; variant < 5; variant++) {
            const int mis = (variant == 0 && (sh[1] & 32)) ? 1 : 0;
            fails += one(dts[d], kinds[k], rule, sh[0], sh[1], variant, mis);
            runs++;
          }
  }
  printf("%d runs, %d failures, %ld warp exchanges\n", runs, fails, g_ops.load());
  return fails != 0;
}
