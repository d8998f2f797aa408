/*
** test_gpu_static_rt.c -- review bug 12: a trainer linked with the STATIC CUDA runtime
** (-lcudart_static, nvcc's default) passes its own stream and device memory to libhqcore, which
** is linked with the shared runtime. This program is such a trainer: its stream, its cudaMalloc
** and its copies come from the static runtime linked into it; hq quantizes on that stream and a
** GEMM runs there, and the bytes equal the CPU's. Exits 77 (skipped) without a CUDA device.
*/
#include <cuda_runtime.h>
#include <math.h>

#include "hq_test.h"

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #expr, cudaGetErrorString(e_));                 \
  } while (0)

static void test_static_runtime_stream(void **state) {
  (void)state;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = 0;
  d.stream = stream;
  hq_ctx *gpu = NULL, *cpu = NULL;
  HQ_OK_OR_FAIL(hq_ctx_create(&d, &gpu));
  HQ_OK_OR_FAIL(hq_ctx_create(NULL, &cpu));
  const int64_t R = 64, C = 128;
  hq_tensor x = hq_test_tensor(HQ_BF16, R, C, 5, 1.0f);
  void *dx = NULL;
  CK(cudaMalloc(&dx, (size_t)(R * C) * 2));
  CK(cudaMemcpyAsync(dx, x.data, (size_t)(R * C) * 2, cudaMemcpyHostToDevice, stream));
  hq_tensor xd = hq_tensor_2d(dx, HQ_BF16, 0, R, C);
  hq_recipe *r = hq_test_recipe("[format f]\nplugin = fp8_tensor\n[role *:*:*]\n"
                                "rowwise = f\ncolumnwise = f\n");
  hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
  hq_qtensor *h = NULL, *g = NULL;
  HQ_OK_OR_FAIL(hq_quantize(q, cpu, &x, &h));
  HQ_OK_OR_FAIL(hq_quantize(q, gpu, &xd, &g));
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *sh = hq_qtensor_storage(h, dir), *sg = hq_qtensor_storage(g, dir);
    for (uint32_t i = 0; i < sh->nbuf; i++) {
      const hq_buffer *bh = hq_storage_cbuf(sh, i), *bg = hq_storage_cbuf(sg, i);
      uint8_t *tmp = malloc(bh->bytes);
      CK(cudaMemcpyAsync(tmp, bg->ptr, bh->bytes, cudaMemcpyDeviceToHost, stream));
      CK(cudaStreamSynchronize(stream));
      if (memcmp(tmp, bh->ptr, bh->bytes) != 0)
        fail_msg("%s buffer '%s' differs from the CPU's", dir == HQ_ROWWISE ? "rowwise" : "columnwise",
                 bh->name);
      free(tmp);
    }
  }
  /* a GEMM on the trainer's stream into the trainer's memory: x * x^T through hq, against the
     CPU path's F32 product */
  float *dd = NULL, *hd = malloc((size_t)(R * R) * sizeof(float)), *gd = malloc((size_t)(R * R) * 4);
  CK(cudaMalloc((void **)&dd, (size_t)(R * R) * sizeof(float)));
  hq_tensor D = hq_tensor_2d(dd, HQ_F32, 0, R, R), Dh = hq_tensor_2d(hd, HQ_F32, HQ_DEVICE_HOST, R, R);
  HQ_OK_OR_FAIL(hq_gemm(gpu, hq_operand_q(g), 1, hq_operand_q(g), 0, &D, 1.0f, 0.0f, NULL, NULL));
  HQ_OK_OR_FAIL(hq_gemm(cpu, hq_operand_q(h), 1, hq_operand_q(h), 0, &Dh, 1.0f, 0.0f, NULL, NULL));
  CK(cudaMemcpyAsync(gd, dd, (size_t)(R * R) * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  /* the device takes cuBLASLt's native FP8 GEMM, whose fast accumulation may lose up to 2^-10
     of sum |a b| (tests/hq_gpu_test.h's native tolerance); the E4M3 values are within 2^-4 of
     x's, so 2^-9 of x's sum |x_ik x_jk| bounds it with room to spare */
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < R; j++) {
      double sa = 0;
      for (int64_t k = 0; k < C; k++)
        sa += fabs((double)hq_load_hp(x.data, i * C + k, HQ_BF16) *
                   hq_load_hp(x.data, j * C + k, HQ_BF16));
      const int64_t e = j * R + i;
      if (fabs((double)gd[e] - hd[e]) > 0x1p-9 * sa + 1e-6 * fabs((double)hd[e]))
        fail_msg("D[%lld][%lld] = %.9g on the device, %.9g on the host (sum |x x| %.6g)",
                 (long long)j, (long long)i, (double)gd[e], (double)hd[e], sa);
    }
  hq_qtensor_free(g);
  hq_qtensor_free(h);
  CK(cudaStreamSynchronize(stream));
  hq_ctx_destroy(gpu);
  hq_ctx_destroy(cpu);
  CK(cudaFree(dd));
  CK(cudaFree(dx));
  CK(cudaStreamDestroy(stream));
  free(hd);
  free(gd);
  free(x.data);
  hq_quantizer_free(q);
  hq_recipe_free(r);
}

int main(void) {
  int n = 0;
  if (!hq_built_with_cuda() || cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("no CUDA device: skipped\n");
    return HQ_TEST_SKIP;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_static_runtime_stream)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
