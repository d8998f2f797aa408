/* test_gpu_gemm.c -- placeholder */
int main(void) { return 77; }
