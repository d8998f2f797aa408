/*
** direct.h -- the bf16-direct run of `hq train` (--baseline bf16-direct): the same model and step
** with every linear layer's three GEMMs called on cuBLASLt directly, no libhqcore GEMM and no
** quantizer, so that hq's own cost in a trainer can be measured against it (issue 48). The BF16
** operands are made by this file's cast kernel (FP32 -> BF16, round to nearest even: the
** identity format's conversion, hq/numerics.h's hq_f32_to_bf16): each layer's input in the
** forward, the output gradient in the backward, the weight after every optimizer step. The
** GEMMs are cublasLtMatmul with BF16 A and B, an FP32 D, FP32 accumulation and no bias (the
** trainer's kernels add it as they read the output, as they do after libhqcore's fprop), set up
** as libhqcore's cuBLASLt runner sets up the identity recipe's GEMMs (the same layouts,
** transposes, workspace, alignments and reduction schemes offered to the heuristic) so that a
** run takes the same algorithms and its losses equal those of the high-precision (identity
** BF16) recipe's run. CUDA only: without CUDA create fails with a message.
**
** Everything runs on the context's stream. One cuBLASLt handle and one 32 MiB workspace per run,
** made by create; a plan (the heuristic's algorithm) per distinct problem (GEMM, shape and the
** buffers' alignments: layers of one shape share it), chosen at its first call and kept. Every
** call returns 0, or -1 with train_direct_error() saying what failed.
*/
#ifndef HQ_TRAIN_DIRECT_H
#define HQ_TRAIN_DIRECT_H

#include <stddef.h>
#include <stdint.h>

#include "hq/hq.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct train_direct train_direct;

/* The GEMMs of n_lin layers (layer i: W [out[i], in[i]]) on batches of `batch` rows, on ctx's
   device and stream: the BF16 copies of every weight and input, one output-gradient buffer of
   the widest layer, the handle and the workspace, allocated now (hq_ctx_alloc). Returns 0, or
   -1 with a message in err (no CUDA device, no CUDA in this build, out of memory). */
int train_direct_create(hq_ctx *ctx, int n_lin, const int64_t *in, const int64_t *out,
                        int64_t batch, train_direct **d, char *err, size_t err_len);
void train_direct_free(train_direct *d);

/* The BF16 copy of layer i's weight from its FP32 master w [out, in]. */
int train_direct_weight(train_direct *d, int i, const float *w);
/* The BF16 copy of layer i's input x [batch, in] (kept for its wgrad). */
int train_direct_input(train_direct *d, int i, const float *x);
/* The BF16 copy of layer i's output gradient dy [batch, out] (used by its wgrad and dgrad). */
int train_direct_grad(train_direct *d, int i, const float *dy);
/* y [batch, out] = x W^T (FP32, no bias) from the BF16 copies. */
int train_direct_fprop(train_direct *d, int i, float *y);
/* gw [out, in] = dy^T x (FP32, overwritten) from the BF16 copies. */
int train_direct_wgrad(train_direct *d, int i, float *gw);
/* dx [batch, in] = dy W (FP32) from the BF16 copies. */
int train_direct_dgrad(train_direct *d, int i, float *dx);

/* What the last failing call said. */
const char *train_direct_error(const train_direct *d);

#ifdef __cplusplus
}
#endif
#endif
