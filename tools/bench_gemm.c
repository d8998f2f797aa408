/* bench_gemm.c -- `hq bench --gemm`: placeholder */
#include "cli.h"
int hq_bench_gemm(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return cli_fail(1, "bench", "--gemm is not written yet");
}
