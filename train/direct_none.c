/*
** direct_none.c -- direct.h in a build without CUDA: the bf16-direct run calls cuBLASLt on a
** CUDA device, so creating one says so and nothing else is ever reached.
*/
#include <stdio.h>

#include "direct.h"

int train_direct_create(hq_ctx *ctx, int n_lin, const int64_t *in, const int64_t *out,
                        int64_t batch, train_direct **d, char *err, size_t err_len) {
  (void)ctx;
  (void)n_lin;
  (void)in;
  (void)out;
  (void)batch;
  *d = NULL;
  snprintf(err, err_len, "bf16-direct calls cuBLASLt on a CUDA device: this hq was built "
           "without CUDA");
  return -1;
}
void train_direct_free(train_direct *d) { (void)d; }
int train_direct_weight(train_direct *d, int i, const float *w) {
  (void)d, (void)i, (void)w;
  return -1;
}
int train_direct_input(train_direct *d, int i, const float *x) {
  (void)d, (void)i, (void)x;
  return -1;
}
int train_direct_grad(train_direct *d, int i, const float *dy) {
  (void)d, (void)i, (void)dy;
  return -1;
}
int train_direct_fprop(train_direct *d, int i, float *y) {
  (void)d, (void)i, (void)y;
  return -1;
}
int train_direct_wgrad(train_direct *d, int i, float *gw) {
  (void)d, (void)i, (void)gw;
  return -1;
}
int train_direct_dgrad(train_direct *d, int i, float *dx) {
  (void)d, (void)i, (void)dx;
  return -1;
}
const char *train_direct_error(const train_direct *d) {
  (void)d;
  return "bf16-direct: this hq was built without CUDA";
}
