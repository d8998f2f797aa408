/*
** dist.h -- `hq train` across ranks (dist.c): `mpirun -np N hq train ...` trains the same model
** as one process, FSDP style (ZeRO-3): every linear layer's FP32 master weights and AdamW moments
** are sharded by rows, each rank quantizes its shard (the per-tensor amax shared through
** hq_dist_amax), the quantized weight is all-gathered (hq_gather_run, one collective per layer),
** the weight gradients are reduce-scattered (FP32, or BF16 with train_model_cfg.grad_bf16:
** rounded, summed in BF16, widened back) and the global batch is split across the ranks
** (data parallel). On the CPU through Open MPI (hq/dist.h's MPI backend); on GPUs, one per
** rank, through NCCL (its backend, and NCCL's reduce-scatter and all-reduce), bootstrapped by
** MPI.
**
** A NULL train_dist is one process: every function below then does what one rank alone does
** (nothing, or the local operation), so model.c and loop.c call them unconditionally.
*/
#ifndef HQ_TRAIN_DIST_H
#define HQ_TRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "hq/hq.h"

typedef struct train_dist train_dist;
struct train_model;
struct train_linear;

/* Under Open MPI's mpirun (OMPI_COMM_WORLD_SIZE set and above 1; with *device a GPU, 1 or
   more): MPI_Init, the communicator into *out, and on every rank but 0 stdout sent to /dev/null
   (rank 0 alone prints the progress, the table and --json). On the CPU the gathers go through
   hq_dist_mpi_create on MPI_COMM_WORLD. With *device a GPU (--device cuda), each rank takes the
   GPU of its local rank on its host (*device set to it; refused when the host has fewer GPUs
   than ranks), and every collective on device memory goes through one NCCL communicator
   bootstrapped over MPI (hq_dist_nccl_create for the gathers). Otherwise *out = NULL.
   Returns 0, or -1 with a message in err. */
int train_dist_init(train_dist **out, int *device, char *err, size_t err_len);
/* hq_dist_free and MPI_Finalize (NULL: nothing). */
void train_dist_end(train_dist *d);
int train_dist_rank(const train_dist *d);   /* 0 for NULL */
int train_dist_size(const train_dist *d);   /* 1 for NULL */
/* This rank's rows [*first, *first + *count) of a weight of `rows` rows: equal shards, the
   first rows % size ranks one row more. */
void train_dist_shard(const train_dist *d, int64_t rows, int64_t *first, int64_t *count);
/* In place, over the ranks: the sum of n doubles (host). */
int train_dist_sum(train_dist *d, double *v, size_t n, char *err, size_t err_len);

/* The model's hooks (model.c). Quantize src with q (hq_quantize_ex with the caller's args;
   across ranks with the amax max-reduced over the ranks first and passed in a->amax, so that
   every rank's part equals the whole batch's quantization). */
int train_dist_quantize(struct train_model *m, hq_quantizer *q, const hq_tensor *src,
                        hq_quantize_args *a, hq_qtensor **out);
/* The quantized weight of layer l from its master shard: made (first call: the shard quantized,
   the gather planned, the full qtensor allocated) or refreshed, then gathered into l->qw. One
   process: l->qw quantized from the master (first call only: hq_adam_step writes it back). */
int train_dist_weight(struct train_model *m, struct train_linear *l, int first, char *err,
                      size_t err_len);
/* Before the backward pass: the loss gradient (the mean over this rank's part of the batch)
   divided by the ranks (0, or -1 with a message in err), so that every gradient is the global batch's mean's part, the values
   one process computes for these rows (exact for a power-of-two count of ranks): a delayed
   scale or a format's rounding then sees the same values. */
int train_dist_loss_grad(struct train_model *m, char *err, size_t err_len);
/* Before the optimizer step: every layer's weight gradient reduce-scattered (summed) into its
   shard (l->gws), the bias and embedding gradients all-reduced (summed). With m->cfg.grad_bf16
   the weight gradients are rounded to BF16 (RNE) first, summed in BF16 (on the host a
   user-defined MPI_Op: each pair added in FP32 and rounded back; on GPUs NCCL's ncclBfloat16
   sum) and the shard widened back to FP32; the bits then depend on the count of ranks. */
int train_dist_grads(struct train_model *m, char *err, size_t err_len);
/* What one step moves per rank (bytes): the quantized weights gathered, the same weights as a
   BF16 all-gather, the weight gradients reduce-scattered (each rank's full gradient, 4 bytes an
   element, 2 with grad_bf16). */
void train_dist_wire(const struct train_model *m, uint64_t *gathered, uint64_t *bf16,
                     uint64_t *reduced);
/* hq_state_update of the scaling state, its amaxes max-reduced over the ranks first
   (hq_dist_state_update). */
int train_dist_state_update(train_dist *d, hq_state *st, hq_ctx *ctx);
/* Checkpoints (checkpoint.c) hold whole tensors, whatever the count of ranks that writes or
   reads them. Collective: every rank's shard (its `rows` rows of a [total, cols] FP32 tensor, as
   train_dist_shard splits it, in the model's device memory) lands in rank 0's host buffer full
   (total * cols floats; ignored and may be NULL on the other ranks). One process: the whole
   tensor copied to full. 0, or -1 with a message in err. */
int train_dist_gather_rows(const struct train_model *m, const float *shard, int64_t rows,
                           int64_t total, int64_t cols, float *full, char *err, size_t err_len);
/* Collective: rank 0's string s (a buffer of n bytes on every rank) copied to every rank (NULL d:
   nothing). 0, or -1 with a message in err. */
int train_dist_bcast_str(train_dist *d, char *s, size_t n, char *err, size_t err_len);
/* Collective: 1 when ok is 1 on every rank (NULL d: ok). A rank that fails says why and the
   others learn of it here, instead of waiting in the next collective. */
int train_dist_all_ok(train_dist *d, int ok);
/* The model's distributed state (shards' quantized weights, plans) freed. */
void train_dist_model_free(struct train_model *m);

#endif
