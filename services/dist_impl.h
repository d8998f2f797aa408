/*
** dist_impl.h -- what the backend-neutral FSDP gather (services/dist.c) needs from a backend
** (services/dist_mpi.c: Open MPI; services/dist_nccl.c: NCCL). Never installed.
*/
#ifndef HQ_DIST_IMPL_H
#define HQ_DIST_IMPL_H

#include "svc.h"
#include "hq/dist.h"

typedef struct hqt_dist_ops {
  const char *name;              /* "MPI", "NCCL": for messages */
  /* 1: the all-gather gives every rank a slot of the same size (NCCL has no all-gatherv):
     rank r's message lands at r * slot and every rank sends slot bytes */
  int uniform_slots;
  /* the staging memory lives on the context's device (NCCL) or the host (MPI) */
  int device_memory;
  /* Small host-memory all-gather (every rank sends `bytes`, recv holds size * bytes in rank
     order): the plan's descriptors. */
  int (*allgather_host)(hq_dist *d, hq_ctx *ctx, const void *send, void *recv, size_t bytes);
  /* The gather: rank r's counts[r] bytes land at recv + displs[r]; send holds this rank's
     message (for uniform slots, counts[r] is the slot for every r). send may be this rank's
     place in recv (in place: the message is already where it lands). */
  int (*allgatherv)(hq_dist *d, hq_ctx *ctx, const void *send, void *recv, const size_t *counts,
                    const size_t *displs);
  /* In-place MAX all-reduce of n floats in the staging memory's place (device or host). */
  int (*allreduce_max)(hq_dist *d, hq_ctx *ctx, float *buf, size_t n);
  /* Whether the collective that was pending when a wait gave up has completed since (then
     d->pending is cleared); NULL: never known. */
  void (*settle)(hq_dist *d);
  void (*release)(hq_dist *d);
} hqt_dist_ops;

struct hq_dist {
  const hqt_dist_ops *ops;
  int rank, size;
  double timeout_s;
  int broken;                    /* a collective failed or timed out: every later call refuses */
  int pending;                   /* a collective may still write into staging memory */
  void *impl;                    /* the backend's own state */
  void *orphan[4];               /* host memory a pending collective may still write into:
                                    freed by hq_dist_free once the collective has settled */
};

/* Fill the neutral part of a new hq_dist (opts may be NULL); HQ_EINVAL for bad options. */
int hqt_dist_init(hq_dist *d, const hqt_dist_ops *ops, const hq_dist_opts *opts, int rank,
                  int size);
/* A collective of d failed (code, message already set): mark d unusable and return code. */
int hqt_dist_fail(hq_dist *d, int code);

#endif /* HQ_DIST_IMPL_H */
