/*
** test_dist_nccl.c -- the FSDP gather across GPUs through NCCL (hq/dist.h), one GPU per rank,
** NCCL bootstrapped over MPI (rank 0's ncclUniqueId broadcast); run by tests/test_dist_mpi.sh
** under `mpirun -np 2` when built with NCCL. Every rank exits 77 (skip) unless the host has a
** GPU per rank.
**
** For per-tensor FP8 (both directions: the columnwise copy rebuilt), MXFP8, NVFP4 2-D, 2-D FP8
** block scaling and the MXFP8 / NVFP4 RHT hybrid: every rank quantizes its shard (unequal rows)
** on its GPU with the amax all-reduced by hq_dist_amax, gathers it with hq_gather_run, and the
** gathered device qtensor equals, byte for byte, the whole tensor quantized on the host (the CPU
** reference, which the GPU kernels equal byte for byte) with the whole tensor's amax.
*/
#include <mpi.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include "hq_test.h"
#include "hq_gpu_test.h"
#include "hq/dist.h"

#define K 256
#define UNIT 128

static int g_rank, g_size;
static hq_dist *g_dist;
static hq_ctx *g_cpu, *g_gpu;

static int64_t shard_rows_of(int r) { return UNIT * (1 + r % 2); }
static int64_t first_row_of(int r) {
  int64_t a = 0;
  for (int i = 0; i < r; i++) a += shard_rows_of(i);
  return a;
}

#define ONE(body) "[format f]\n" body "[role linear:weight:*]\nrowwise = f\ncolumnwise = f\n"
static const char *const recipes[] = {
    ONE("plugin = fp8_tensor\n"),
    ONE("plugin = mxfp8\n"),
    ONE("plugin = nvfp4\nblock_2d = true\n"),
    ONE("plugin = fp8_block\nblock = 2d\n"),
    "[format r]\nplugin = mxfp8\n[format c]\nplugin = nvfp4\nrht = true\n"
    "[role linear:weight:*]\nrowwise = r\ncolumnwise = c\n",
};

static void test_gather(void **state) {
  (void)state;
  const int64_t M = first_row_of(g_size);
  for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++) {
    hq_tensor x = hq_test_tensor(HQ_BF16, M, K, 11, 3.0f);
    hq_tensor xs = hq_tensor_2d((char *)x.data + (size_t)(first_row_of(g_rank) * K) * 2, HQ_BF16,
                                HQ_DEVICE_HOST, shard_rows_of(g_rank), K);
    hq_tensor dxs = hq_gpu_tensor_at(g_gpu, &xs, 0);
    hq_recipe *r = hq_test_recipe(recipes[i]);
    hq_quantizer *q = hq_test_quantizer(r, "linear:weight:w");
    float *damax = hq_gpu_amax_to_dev(g_gpu, (const float[2]){0, 0}), whole[2], amax[2];
    HQ_OK_OR_FAIL(hq_dist_amax(g_dist, q, g_gpu, &dxs, damax));
    hq_gpu_amax_to_host(g_gpu, damax, amax);
    HQ_OK_OR_FAIL(hq_quantizer_amax(q, g_cpu, &x, whole));
    assert_memory_equal(amax, whole, sizeof amax);
    hq_qtensor *shard = hq_test_quantize_ex(q, g_gpu, &dxs, damax);
    hq_qtensor *ref = hq_test_quantize_ex(q, g_cpu, &x, whole);
    hq_gather *g = NULL;
    hq_qtensor *full = NULL;
    if (hq_gather_create(g_dist, g_gpu, shard, &g)) fail_msg("%s", hq_last_error());
    HQ_OK_OR_FAIL(hq_make_empty(q, g_gpu, M, K, HQ_BF16, &full));
    if (hq_gather_run(g, g_gpu, shard, full)) fail_msg("%s", hq_last_error());
    hq_gpu_compare_usage(g_gpu, ref, full, HQ_BOTH, recipes[i]);
    hq_gather_free(g);
    hq_qtensor_free(full);
    hq_qtensor_free(ref);
    hq_qtensor_free(shard);
    hq_ctx_free(g_gpu, damax);
    hq_ctx_free(g_gpu, dxs.data);
    hq_quantizer_free(q);
    hq_recipe_free(r);
    free(x.data);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (n < g_size) {
    if (g_rank == 0) printf("%d CUDA devices for %d ranks: skipped\n", n, g_size);
    MPI_Finalize();
    return HQ_TEST_SKIP;
  }
  ncclUniqueId id;
  if (g_rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  if (cudaSetDevice(g_rank) != cudaSuccess ||
      ncclCommInitRank(&comm, g_size, id, g_rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: NCCL initialization failed\n", g_rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  hq_ctx_desc h = {0}, d = {0};
  h.struct_size = d.struct_size = sizeof d;
  h.device = HQ_DEVICE_HOST;
  d.device = g_rank;
  hq_dist_opts o = {.struct_size = sizeof o, .timeout_s = 60};
  if (hq_ctx_create(&h, &g_cpu) || hq_ctx_create(&d, &g_gpu) ||
      hq_dist_nccl_create(comm, &o, &g_dist)) {
    fprintf(stderr, "rank %d: %s\n", g_rank, hq_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_gather)};
  int failed = cmocka_run_group_tests(tests, NULL, NULL), any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  hq_dist_free(g_dist);
  ncclCommDestroy(comm);
  hq_ctx_destroy(g_gpu);
  hq_ctx_destroy(g_cpu);
  MPI_Finalize();
  return any ? 1 : 0;
}
