/*
** dist.c -- `hq train` across ranks (dist.h): the communicator, the shards, the gathers of the
** quantized weights and the reductions of the gradients, through Open MPI on the host.
*/
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HQ_HAVE_MPI
#include <mpi.h>
#endif
/* GPUs across ranks: NCCL (bootstrapped over MPI) for every collective on device memory */
#if defined(HQ_HAVE_MPI) && defined(HQ_HAVE_NCCL)
#define TRAIN_DIST_NCCL 1
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>   /* before hq/dist.h: it declares hq_dist_nccl_create when NCCL's is seen */
#include "cast_cuda.h"   /* the BF16 gradient's conversions on the GPU */
#endif
#include "hq/dist.h"
#include "hq/numerics.h"   /* hq_f32_to_bf16: the BF16 gradients' rounding (RNE) */
#include "train.h"
#include "dist.h"

#ifdef TRAIN_DIST_NCCL
/* The NCCL calls the trainer makes itself, from the process's libnccl.so.2 (loaded at run time
   as services/dist_nccl.c does, so both use the same library). */
typedef struct train_nccl {
  void *lib;
  ncclResult_t (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                             ncclComm_t, cudaStream_t);
  const char *(*get_error_string)(ncclResult_t);
} train_nccl;
#endif

struct train_dist {
  int rank, size;
  hq_dist *hd;                    /* the gathers and the amaxes */
#ifdef HQ_HAVE_MPI
  MPI_Comm comm;                  /* the reductions: a duplicate that returns its errors */
#endif
#ifdef TRAIN_DIST_NCCL
  int gpu;                        /* 1: one GPU per rank, the model's collectives through NCCL
                                     (comm then serves the host sums, the agreements and the
                                     checkpoints' gathers through host memory) */
  train_nccl api;
  ncclComm_t nccl;
#endif
  int failed;                     /* a collective of hd failed: its communicator may be aborted
                                     (hq_dist aborts NCCL's on an error or timeout) */
  /* --grad-dtype bf16 through MPI (train_model_cfg.grad_bf16): host scratch for a layer's whole
     gradient and its shard as BF16, sized for the largest layer, grown on every rank at once
     (the ranks train the same shapes); on GPUs the kernels of cast_cuda.cu use device memory */
  uint16_t *h16;
  size_t h16_n;
#ifdef HQ_HAVE_MPI
  int have_bf16_sum;
  MPI_Op bf16_sum;                /* the BF16 sum of the host reduce-scatter (bf16_sum_fn) */
#endif
};

/* 1 when the model's collectives run on GPUs (NCCL) */
static inline int on_gpu(const train_dist *d) {
#ifdef TRAIN_DIST_NCCL
  return d->gpu;
#else
  (void)d;
  return 0;
#endif
}

int train_dist_rank(const train_dist *d) { return d ? d->rank : 0; }
int train_dist_size(const train_dist *d) { return d ? d->size : 1; }

/* rank r's rows of `rows` over n ranks */
static void shard_of(int64_t rows, int64_t n, int64_t r, int64_t *first, int64_t *count) {
  const int64_t base = rows / n, rem = rows % n;
  *count = base + (r < rem);
  *first = r * base + (r < rem ? r : rem);
}

void train_dist_shard(const train_dist *d, int64_t rows, int64_t *first, int64_t *count) {
  shard_of(rows, train_dist_size(d), train_dist_rank(d), first, count);
}

#ifdef HQ_HAVE_MPI

static int mpi_fail(char *err, size_t err_len, int rc, const char *what) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
  return train_fail(err, err_len, "%s: %s", what, s);
}

static int all_ok(train_dist *d, int ok);

#ifdef TRAIN_DIST_NCCL
static int nccl_fail(train_dist *d, char *err, size_t err_len, ncclResult_t r, const char *what) {
  return train_fail(err, err_len, "rank %d: %s: %s", d->rank, what,
                    d->api.get_error_string ? d->api.get_error_string(r) : "NCCL error");
}

static int nccl_load(train_dist *d, char *err, size_t err_len) {
  train_nccl *a = &d->api;
  a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!a->lib) a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!a->lib)
    return train_fail(err, err_len,
                      "rank %d: --device cuda across ranks needs NCCL: libnccl.so.2 "
                      "cannot be loaded: %s",
                      d->rank, dlerror());
  const struct {
    const char *name;
    void **slot;
  } sym[] = {{"ncclGetUniqueId", (void **)&a->get_unique_id},
             {"ncclCommInitRank", (void **)&a->comm_init_rank},
             {"ncclCommDestroy", (void **)&a->comm_destroy},
             {"ncclCommAbort", (void **)&a->comm_abort},
             {"ncclCommGetAsyncError", (void **)&a->comm_get_async_error},
             {"ncclReduceScatter", (void **)&a->reduce_scatter},
             {"ncclAllReduce", (void **)&a->all_reduce},
             {"ncclGetErrorString", (void **)&a->get_error_string}};
  /* the slots have NCCL's own prototypes: compared unevaluated, so checked by the compiler
     without a link-time reference to libnccl */
  (void)sizeof(a->get_unique_id == ncclGetUniqueId);
  (void)sizeof(a->comm_init_rank == ncclCommInitRank);
  (void)sizeof(a->comm_destroy == ncclCommDestroy);
  (void)sizeof(a->comm_abort == ncclCommAbort);
  (void)sizeof(a->comm_get_async_error == ncclCommGetAsyncError);
  (void)sizeof(a->reduce_scatter == ncclReduceScatter);
  (void)sizeof(a->all_reduce == ncclAllReduce);
  (void)sizeof(a->get_error_string == ncclGetErrorString);
  for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++)
    if (!(*sym[i].slot = dlsym(a->lib, sym[i].name)))
      return train_fail(err, err_len, "rank %d: the process's libnccl.so.2 has no %s", d->rank,
                        sym[i].name);
  return 0;
}

/* One GPU per rank: the ranks on this host (MPI's shared-memory split) take the GPUs in order,
   local rank k using GPU k. Checked on every rank, then agreed: a host with fewer GPUs than
   ranks fails the job on every rank before any NCCL call. Returns 0 with *device set. */
static int gpu_pick(train_dist *d, int *device, char *err, size_t err_len) {
  MPI_Comm local;
  int lrank = 0, lsize = 1, n = 0;
  if (MPI_Comm_split_type(d->comm, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local) !=
      MPI_SUCCESS)
    return train_fail(err, err_len, "rank %d: MPI_Comm_split_type (the ranks of this host) failed",
                      d->rank);
  MPI_Comm_rank(local, &lrank);
  MPI_Comm_size(local, &lsize);
  MPI_Comm_free(&local);
  int rc = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    rc = train_fail(err, err_len, "rank %d: --device cuda: no usable GPU (cudaGetDeviceCount: %s)",
                    d->rank, cudaGetErrorString(e));
  } else if (n < lsize) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    rc = train_fail(
        err, err_len,
        "rank %d: --device cuda across ranks takes one GPU per rank: this "
        "host runs %d ranks but sees %d GPU%s (CUDA_VISIBLE_DEVICES=%s); start at most %d "
        "ranks per host",
        d->rank, lsize, n, n == 1 ? "" : "s", vis ? vis : "(unset)", n);
  } else {
    const cudaError_t e2 = cudaSetDevice(lrank);
    if (e2 != cudaSuccess)
      rc = train_fail(err, err_len, "rank %d: cudaSetDevice(%d): %s", d->rank, lrank,
                      cudaGetErrorString(e2));
  }
  if (!all_ok(d, rc == 0)) {
    if (!rc)
      rc = train_fail(err, err_len,
                      "rank %d: another rank has no GPU of its own (its message "
                      "says why)",
                      d->rank);
    return rc;
  }
  *device = lrank;
  return 0;
}

/* The NCCL communicator of all ranks: rank 0's unique id sent over MPI (ncclGetUniqueId,
   MPI_Bcast, ncclCommInitRank on the GPU picked), then the gather helper on it. */
static int nccl_start(train_dist *d, char *err, size_t err_len) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  int rc = 0;
  if (d->rank == 0) {
    const ncclResult_t r = d->api.get_unique_id(&id);
    if (r != ncclSuccess) rc = nccl_fail(d, err, err_len, r, "ncclGetUniqueId");
  }
  const int mr = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, d->comm);
  if (!rc && mr != MPI_SUCCESS) rc = mpi_fail(err, err_len, mr, "MPI_Bcast of the NCCL id");
  if (!all_ok(d, rc == 0)) {
    if (!rc)
      rc = train_fail(err, err_len,
                      "rank %d: rank 0 could not make the NCCL id (its message "
                      "says why)",
                      d->rank);
    return rc;
  }
  const ncclResult_t r = d->api.comm_init_rank(&d->nccl, d->size, id, d->rank);
  if (r != ncclSuccess) {
    d->nccl = NULL;
    rc = nccl_fail(d, err, err_len, r, "ncclCommInitRank");
  }
  if (!rc && hq_dist_nccl_create(d->nccl, NULL, &d->hd))
    rc = train_fail(err, err_len, "rank %d: the communicator: %s", d->rank, hq_last_error());
  if (!all_ok(d, rc == 0) && !rc)
    rc = train_fail(err, err_len,
                    "rank %d: another rank could not join the NCCL communicator (its "
                    "message says why)",
                    d->rank);
  return rc;
}
#endif

int train_dist_init(train_dist **out, int *device, char *err, size_t err_len) {
  *out = NULL;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  const int gpu = *device != HQ_DEVICE_HOST;
  /* on the CPU one rank is one process (no MPI call); on GPUs one rank too goes through NCCL (a
     communicator of one rank is valid), so that the path runs on a machine with one GPU */
  if (!ws || atoi(ws) < (gpu ? 1 : 2)) return 0;
  if (gpu && *device != 0)
    return train_fail(err, err_len,
                      "under mpirun each rank uses the GPU of its local rank: give "
                      "--device cuda, not cuda:%d",
                      *device);
#ifndef TRAIN_DIST_NCCL
  if (gpu && atoi(ws) < 2) return 0;   /* one process, as without mpirun */
  if (gpu)
    return train_fail(
        err, err_len,
        "run by mpirun with %s ranks and --device cuda, but this hq was "
        "built without NCCL (configure found no CUDA with nccl.h and libnccl): rebuild "
        "with them, or train across ranks on the CPU",
        ws);
#endif
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
    return train_fail(err, err_len, "MPI_Init failed under mpirun (OMPI_COMM_WORLD_SIZE=%s)", ws);
  train_dist *d = calloc(1, sizeof *d);
  if (!d) return train_fail(err, err_len, "out of memory");
  MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &d->size);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &d->comm) != MPI_SUCCESS) {
    free(d);
    MPI_Finalize();
    return train_fail(err, err_len, "MPI_Comm_dup failed");
  }
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
#ifdef TRAIN_DIST_NCCL
  if (gpu) {
    d->gpu = 1;
    int rc = nccl_load(d, err, err_len);
    if (!all_ok(d, rc == 0) && !rc)
      rc = train_fail(err, err_len,
                      "rank %d: another rank could not load NCCL (its message says why)", d->rank);
    if (rc || gpu_pick(d, device, err, err_len) || nccl_start(d, err, err_len)) {
      train_dist_end(d);
      return -1;
    }
    if (d->rank == 0)   /* says which path runs: one rank too goes through NCCL */
      fprintf(stderr, "hq train: %d rank%s on GPUs through NCCL, one GPU each (the host's local "
              "rank k on GPU k)\n", d->size, d->size == 1 ? "" : "s");
  }
#endif
  if (!gpu && hq_dist_mpi_create(MPI_COMM_WORLD, NULL, &d->hd)) {
    train_fail(err, err_len, "rank %d: the communicator: %s", d->rank, hq_last_error());
    MPI_Comm_free(&d->comm);
    free(d);
    MPI_Finalize();
    return -1;
  }
  /* rank 0 speaks for the job: the others' progress, table and JSON would repeat it */
  const int rank = d->rank;
  if (rank != 0 && !freopen("/dev/null", "w", stdout)) {
    train_dist_end(d);
    return train_fail(err, err_len, "rank %d: /dev/null for stdout", rank);
  }
  *out = d;
  return 0;
}

void train_dist_end(train_dist *d) {
  if (!d) return;
  hq_dist_free(d->hd);
#ifdef TRAIN_DIST_NCCL
  /* after the helper that used it; never an aborted one (the process ends anyway) */
  if (d->nccl && !d->failed) (void)d->api.comm_destroy(d->nccl);
#endif
  if (d->have_bf16_sum) MPI_Op_free(&d->bf16_sum);
  free(d->h16);
  MPI_Comm_free(&d->comm);
  free(d);
  MPI_Finalize();
}

int train_dist_sum(train_dist *d, double *v, size_t n, char *err, size_t err_len) {
  if (!d) return 0;
  int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_SUM, d->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(err, err_len, rc, "MPI_Allreduce");
}

/* In place, over the ranks: the sum of n floats. */
static int sum_f32(train_dist *d, float *v, int64_t n, const char *what, char *err,
                   size_t err_len) {
  int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_FLOAT, MPI_SUM, d->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(err, err_len, rc, what);
}

/* MPI_User_function on BF16 bit patterns (MPI_UINT16_T): inout[i] = in[i] + inout[i], the sum
   of the two values taken in FP32 and rounded to BF16 (RNE). FP32's 24 significant bits are
   more than twice BF16's 8 plus two, so that second rounding gives the correctly rounded BF16
   sum: the result depends on the order MPI's reduce-scatter adds the ranks' parts in (fixed for
   a given count of ranks), never on timing. */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
  const uint16_t *a = in;
  uint16_t *b = inout;
  (void)type;
  for (int i = 0; i < *len; i++)
    b[i] = hq_f32_to_bf16(hq_bf16_to_f32(a[i]) + hq_bf16_to_f32(b[i]));
}

/* --grad-dtype bf16 on the host: the scratch for m's largest layer (its whole gradient and its
   shard) and the MPI op, made or grown on every rank at once and agreed, so that a rank without the
   memory fails the step on every rank instead of leaving the others in the reduce-scatter. */
static int bf16_ready(train_dist *d, const train_model *m, char *err, size_t err_len) {
  size_t need = 0;
  for (int i = 0; i < m->n_lin; i++) {
    const train_linear *l = &m->lin[i];
    const size_t n = (size_t)(l->out * l->in) + (size_t)(l->rows * l->in);
    if (n > need) need = n;
  }
  if (need <= d->h16_n && d->have_bf16_sum) return 0;
  int ok = 1;
  if (need > d->h16_n) {
    uint16_t *p = realloc(d->h16, need * sizeof *p);
    if (p) d->h16 = p, d->h16_n = need;
    else ok = 0;
  }
  if (ok && !d->have_bf16_sum) {
    if (MPI_Op_create(bf16_sum_fn, 1, &d->bf16_sum) == MPI_SUCCESS) d->have_bf16_sum = 1;
    else ok = 0;
  }
  if (!all_ok(d, ok)) {
    if (ok)
      return train_fail(err, err_len,
                        "rank %d: another rank could not prepare the BF16 "
                        "gradient reduce-scatter (its message says why)",
                        d->rank);
    return train_fail(err, err_len,
                      "rank %d: the BF16 gradient reduce-scatter: out of memory (%zu "
                      "BF16 values)",
                      d->rank, need);
  }
  return 0;
}

/* --grad-dtype bf16 on the host: layer l's gradient rounded to BF16, reduce-scattered (summed
   in BF16 by bf16_sum_fn) with counts[r] values to rank r, and this rank's shard widened back
   to FP32 into l->gws for AdamW. */
static int grads_bf16_mpi(train_dist *d, train_linear *l, const int *counts, char *err,
                          size_t err_len) {
  const int64_t full = l->out * l->in, mine = l->rows * l->in;
  uint16_t *g = d->h16, *s = d->h16 + full;
  for (int64_t k = 0; k < full; k++) g[k] = hq_f32_to_bf16(l->gw[k]);
  const int rc = MPI_Reduce_scatter(g, s, counts, MPI_UINT16_T, d->bf16_sum, d->comm);
  if (rc != MPI_SUCCESS) {
    char what[80];
    snprintf(what, sizeof what, "layer %s: MPI_Reduce_scatter (BF16)", l->name);
    return mpi_fail(err, err_len, rc, what);
  }
  for (int64_t k = 0; k < mine; k++) l->gws[k] = hq_bf16_to_f32(s[k]);
  return 0;
}

int train_dist_loss_grad(train_model *m, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  if (!d || d->size == 1) return 0;
  const float inv = 1.0f / (float)d->size;
  const int64_t n = m->cfg.batch * m->cfg.vocab_pad;
  const int dev = hq_ctx_device(m->ctx);
  if (dev == HQ_DEVICE_HOST) {
    for (int64_t k = 0; k < n; k++) m->dlogits[k] *= inv;
    return 0;
  }
  /* on a GPU through the host: one [B, vocab_pad] tensor per step, and the device table has no
     scale op to do it in place */
  float *h = malloc((size_t)n * sizeof *h);
  if (!h) return train_fail(err, err_len, "out of memory");
  int rc = hq_ctx_memcpy(m->ctx, h, HQ_DEVICE_HOST, m->dlogits, dev, (size_t)n * sizeof *h);
  for (int64_t k = 0; !rc && k < n; k++) h[k] *= inv;
  if (!rc) rc = hq_ctx_memcpy(m->ctx, m->dlogits, dev, h, HQ_DEVICE_HOST, (size_t)n * sizeof *h);
  free(h);
  return rc ? train_fail(err, err_len, "the loss gradient across ranks: %s", hq_last_error()) : 0;
}

#ifdef TRAIN_DIST_NCCL
/* Wait for the stream's NCCL work, bounded: NCCL's documented pattern (poll the stream and
   ncclCommGetAsyncError, ncclCommAbort when the time is up), so that a dead rank ends the job
   instead of hanging it. */
static int nccl_wait(train_dist *d, cudaStream_t stream, const char *what, char *err,
                     size_t err_len) {
  const double timeout_s = 300.0;   /* hq_dist's default: a step never waits that long */
  const struct timespec nap = {0, 20000};
  const double t0 = train_now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady)
      return train_fail(err, err_len, "rank %d: %s: %s", d->rank, what, cudaGetErrorString(e));
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = d->api.comm_get_async_error(d->nccl, &async);
    if (r != ncclSuccess) return nccl_fail(d, err, err_len, r, what);
    if (async != ncclSuccess && async != ncclInProgress) {
      (void)d->api.comm_abort(d->nccl);
      d->nccl = NULL;
      d->failed = 1;
      return nccl_fail(d, err, err_len, async, what);
    }
    if (train_now() - t0 > timeout_s) {
      (void)d->api.comm_abort(d->nccl);
      d->nccl = NULL;
      d->failed = 1;
      return train_fail(err, err_len,
                        "rank %d: %s: not finished within %g s (a rank died or hangs); "
                        "the NCCL communicator was aborted",
                        d->rank, what, timeout_s);
    }
    nanosleep(&nap, NULL);
  }
}

/* --grad-dtype bf16 on GPUs (unverified, as the rest of this path): layer l's gradient rounded
   to BF16 on the GPU (cast_cuda.cu: the CPU path's rule, hq_f32_to_bf16), reduce-scattered by
   NCCL as ncclBfloat16 with ncclSum (all-reduced where the rows do not split evenly), and this
   rank's summed shard widened back to FP32 into l->gws, all on the stream: no host copy. */
static int nccl_grad_bf16(train_dist *d, train_model *m, train_linear *l, cudaStream_t stream,
                          char *err, size_t err_len) {
  const int64_t full = l->out * l->in, mine = l->rows * l->in;
  void *p = NULL;
  if (hq_ctx_alloc(m->ctx, (size_t)(full + mine) * sizeof(uint16_t), &p))
    return train_fail(err, err_len, "rank %d: layer %s: device memory for the BF16 gradient: %s",
                      d->rank, l->name, hq_last_error());
  uint16_t *g = p, *shard = g + full;
  char why[256];
  int rc = 0;
  if (train_cuda_f32_to_bf16(stream, g, l->gw, full, "rounding the gradient to BF16 on the GPU",
                             why, sizeof why))
    rc = train_fail(err, err_len, "rank %d: layer %s: %s", d->rank, l->name, why);
  if (!rc) {
    ncclResult_t r;
    if (l->out % d->size == 0) {
      r = d->api.reduce_scatter(g, shard, (size_t)mine, ncclBfloat16, ncclSum, d->nccl, stream);
    } else {
      r = d->api.all_reduce(g, g, (size_t)full, ncclBfloat16, ncclSum, d->nccl, stream);
      shard = g + l->r0 * l->in;
    }
    if (r != ncclSuccess) rc = nccl_fail(d, err, err_len, r, "the BF16 gradient's NCCL reduction");
  }
  if (!rc &&
      train_cuda_bf16_to_f32(stream, l->gws, shard, mine,
                             "widening the BF16 gradient to FP32 on the GPU", why, sizeof why))
    rc = train_fail(err, err_len, "rank %d: layer %s: %s", d->rank, l->name, why);
  /* the scratch is freed only once the stream is done with it; after a failed launch the
     reduction already enqueued may still read it, so it is then left to the ending process */
  if (!rc) rc = nccl_wait(d, stream, "the BF16 gradient's NCCL reduction", err, err_len);
  if (!rc) hq_ctx_free(m->ctx, p);
  return rc;
}

/* train_dist_grads on GPUs: NCCL on the context's stream. A weight whose rows split evenly
   (every shard the same size, as ncclReduceScatter requires) is reduce-scattered; otherwise it
   is all-reduced and this rank's rows copied out (twice the traffic, the same sums). */
static int nccl_grads(train_dist *d, train_model *m, char *err, size_t err_len) {
  cudaStream_t stream = (cudaStream_t)hq_ctx_stream(m->ctx);
  if (!d->nccl)
    return train_fail(err, err_len, "rank %d: the NCCL communicator was aborted", d->rank);
  ncclResult_t r = ncclSuccess;
  for (int i = 0; r == ncclSuccess && i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    if (m->cfg.grad_bf16) {
      if (nccl_grad_bf16(d, m, l, stream, err, err_len)) return -1;
    } else if (l->out % d->size == 0) {
      r = d->api.reduce_scatter(l->gw, l->gws, (size_t)(l->rows * l->in), ncclFloat32, ncclSum,
                                d->nccl, stream);
    } else {
      r = d->api.all_reduce(l->gw, l->gw, (size_t)(l->out * l->in), ncclFloat32, ncclSum,
                            d->nccl, stream);
      if (r == ncclSuccess && l->rows > 0) {
        const cudaError_t e = cudaMemcpyAsync(l->gws, l->gw + l->r0 * l->in,
                                              (size_t)(l->rows * l->in) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess)
          return train_fail(err, err_len, "rank %d: layer %s: copying the gradient's rows: %s",
                            d->rank, l->name, cudaGetErrorString(e));
      }
    }
    if (r == ncclSuccess)
      r = d->api.all_reduce(l->gb, l->gb, (size_t)l->out, ncclFloat32, ncclSum, d->nccl, stream);
  }
  if (r == ncclSuccess)
    r = d->api.all_reduce(m->gemb, m->gemb, (size_t)TRAIN_VOCAB * (size_t)m->cfg.embed,
                          ncclFloat32, ncclSum, d->nccl, stream);
  if (r != ncclSuccess) return nccl_fail(d, err, err_len, r, "the gradients' NCCL reductions");
  return nccl_wait(d, stream, "the gradients' NCCL reductions", err, err_len);
}
#endif

int train_dist_grads(train_model *m, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  if (!d) return 0;
#ifdef TRAIN_DIST_NCCL
  if (d->gpu) return nccl_grads(d, m, err, err_len);
#endif
  int counts[64];
  if (d->size > (int)(sizeof counts / sizeof *counts))
    return train_fail(err, err_len, "%d ranks: at most %d", d->size,
                      (int)(sizeof counts / sizeof *counts));
  if (m->cfg.grad_bf16 && bf16_ready(d, m, err, err_len)) return -1;
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    for (int r = 0; r < d->size; r++) {
      int64_t first, rows;
      shard_of(l->out, d->size, r, &first, &rows);
      counts[r] = (int)(rows * l->in);
    }
    if (m->cfg.grad_bf16) {
      if (grads_bf16_mpi(d, l, counts, err, err_len)) return -1;
      if (sum_f32(d, l->gb, l->out, "MPI_Allreduce (bias gradient)", err, err_len)) return -1;
      continue;
    }
    int rc = MPI_Reduce_scatter(l->gw, l->gws, counts, MPI_FLOAT, MPI_SUM, d->comm);
    if (rc != MPI_SUCCESS) {
      char what[64];
      snprintf(what, sizeof what, "layer %s: MPI_Reduce_scatter", l->name);
      return mpi_fail(err, err_len, rc, what);
    }
    if (sum_f32(d, l->gb, l->out, "MPI_Allreduce (bias gradient)", err, err_len)) return -1;
  }
  return sum_f32(d, m->gemb, (int64_t)TRAIN_VOCAB * m->cfg.embed,
                  "MPI_Allreduce (embedding gradient)", err, err_len);
}

/* 1 when every rank's ok is 1: a failure on one rank ends the job on all of them instead of
   leaving the others in the next collective. */
static int all_ok(train_dist *d, int ok) {
  int all = ok;
  if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, d->comm) != MPI_SUCCESS) return 0;
  return all;
}

int train_dist_gather_rows(const train_model *m, const float *shard, int64_t rows,
                           int64_t total, int64_t cols, float *full, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  const size_t fs = sizeof(float);
  if (!d) {   /* one process holds every row */
    if (hq_ctx_memcpy(m->ctx, full, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                      (size_t)(total * cols) * fs))
      return train_fail(err, err_len, "copying to the host: %s", hq_last_error());
    return 0;
  }
  /* MPI counts are ints: the checkpoint of a larger tensor needs a gather in pieces */
  if (total * cols > INT32_MAX)
    return train_fail(err, err_len,
                      "a [%lld, %lld] tensor: more than %d elements cannot be gathered "
                      "in one MPI call",
                      (long long)total, (long long)cols, INT32_MAX);
  int counts[64], displs[64];
  if (d->size > (int)(sizeof counts / sizeof *counts))
    return train_fail(err, err_len, "%d ranks: at most %d", d->size,
                      (int)(sizeof counts / sizeof *counts));
  for (int r = 0; r < d->size; r++) {
    int64_t f, n;
    shard_of(total, d->size, r, &f, &n);
    counts[r] = (int)(n * cols);
    displs[r] = (int)(f * cols);
  }
  /* host staging: the shard may be device memory, MPI is given host buffers only */
  float *h = malloc((size_t)(rows * cols) * fs + fs);
  if (!h) return train_fail(err, err_len, "out of memory");
  int rc = 0;
  if (rows > 0 && hq_ctx_memcpy(m->ctx, h, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                                (size_t)(rows * cols) * fs))
    rc = train_fail(err, err_len, "copying the shard to the host: %s", hq_last_error());
  /* the gather runs even after a failed copy: the other ranks are in it */
  const int mr = MPI_Gatherv(h, (int)(rows * cols), MPI_FLOAT, full, counts, displs, MPI_FLOAT, 0,
                             d->comm);
  free(h);
  if (!rc && mr != MPI_SUCCESS) rc = mpi_fail(err, err_len, mr, "MPI_Gatherv");
  return rc;
}

int train_dist_all_ok(train_dist *d, int ok) { return d ? all_ok(d, ok) : ok; }

int train_dist_bcast_str(train_dist *d, char *s, size_t n, char *err, size_t err_len) {
  if (!d) return 0;
  if (n > INT32_MAX) return train_fail(err, err_len, "a string of %zu bytes to broadcast", n);
  const int rc = MPI_Bcast(s, (int)n, MPI_CHAR, 0, d->comm);
  s[n - 1] = '\0';
  return rc == MPI_SUCCESS ? 0 : mpi_fail(err, err_len, rc, "MPI_Bcast");
}

#else /* !HQ_HAVE_MPI */

int train_dist_init(train_dist **out, int *device, char *err, size_t err_len) {
  *out = NULL;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  (void)device;
  if (ws && atoi(ws) > 1)
    return train_fail(
        err, err_len,
        "run by mpirun with %s ranks, but this hq was built without MPI "
        "(configure found no Open MPI: install openmpi-bin libopenmpi-dev and rebuild)",
        ws);
  return 0;
}
void train_dist_end(train_dist *d) { (void)d; }
int train_dist_sum(train_dist *d, double *v, size_t n, char *err, size_t err_len) {
  (void)d, (void)v, (void)n, (void)err, (void)err_len;
  return 0;
}
int train_dist_grads(train_model *m, char *err, size_t err_len) {
  (void)m, (void)err, (void)err_len;
  return 0;
}
int train_dist_loss_grad(train_model *m, char *err, size_t err_len) {
  (void)m, (void)err, (void)err_len;
  return 0;
}
static int all_ok(train_dist *d, int ok) {
  (void)d;
  return ok;
}
int train_dist_all_ok(train_dist *d, int ok) { return all_ok(d, ok); }
int train_dist_bcast_str(train_dist *d, char *s, size_t n, char *err, size_t err_len) {
  (void)d, (void)s, (void)n, (void)err, (void)err_len;
  return 0;
}
int train_dist_gather_rows(const train_model *m, const float *shard, int64_t rows,
                           int64_t total, int64_t cols, float *full, char *err, size_t err_len) {
  (void)rows;
  if (hq_ctx_memcpy(m->ctx, full, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                    (size_t)(total * cols) * sizeof(float)))
    return train_fail(err, err_len, "copying to the host: %s", hq_last_error());
  return 0;
}

#endif

/* The two amaxes hq_dist_amax writes live on the context's device (hq_quantize_args.amax): the
   caller's host array on the CPU, two floats from the context's stream-ordered pool on a GPU
   (freed by amax_end after the quantize that reads them, in stream order). */
static float *amax_begin(train_model *m, float *host) {
  if (hq_ctx_device(m->ctx) < 0) return host;
  void *p = NULL;
  return hq_ctx_alloc(m->ctx, 2 * sizeof(float), &p) ? NULL : p;
}

static void amax_end(train_model *m, float *amax, float *host) {
  if (amax && amax != host) hq_ctx_free(m->ctx, amax);
}

int train_dist_quantize(train_model *m, hq_quantizer *q, const hq_tensor *src,
                        hq_quantize_args *a, hq_qtensor **out) {
  train_dist *d = m->cfg.dist;
  if (!d) return hq_quantize_ex(q, m->ctx, src, a, out);
  float host[2], *amax = amax_begin(m, host);
  if (!amax) return -1;
  int rc = hq_dist_amax(d->hd, q, m->ctx, src, amax);
  if (rc) {
    d->failed = 1;
  } else {
    a->amax = amax;
    rc = hq_quantize_ex(q, m->ctx, src, a, out);
    a->amax = NULL;
  }
  amax_end(m, amax, host);
  return rc;
}

int train_dist_weight(train_model *m, train_linear *l, int first, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  hq_tensor w = hq_tensor_2d(l->w, HQ_F32, hq_ctx_device(m->ctx), l->rows, l->in);
  if (!d) {
    if (first && hq_quantize(l->q_w, m->ctx, &w, &l->qw))
      return train_fail(err, err_len, "layer %s: quantizing the weight: %s", l->name,
                        hq_last_error());
    return 0;
  }
  float host[2], *amax = amax_begin(m, host);
  hq_quantize_args a = {.struct_size = sizeof a, .amax = amax};
  int rc = amax ? hq_dist_amax(d->hd, l->q_w, m->ctx, &w, amax) : -1;
  if (rc && amax) d->failed = 1;
  if (!rc) rc = first ? hq_quantize_ex(l->q_w, m->ctx, &w, &a, &l->qw_shard)
                      : hq_qtensor_update_ex(l->qw_shard, m->ctx, &w, &a);
  amax_end(m, amax, host);
  if (first) {
    /* a shard a format refuses (rows not a multiple of its blocks) fails on this rank only */
    if (!all_ok(d, rc == 0)) {
      if (rc)
        return train_fail(err, err_len,
                          "layer %s: quantizing rank %d's shard of the weight, rows "
                          "[%lld, %lld) of %lld: %s",
                          l->name, d->rank, (long long)l->r0, (long long)(l->r0 + l->rows),
                          (long long)l->out, hq_last_error());
      return train_fail(err, err_len,
                        "layer %s: another rank could not quantize its shard of the "
                        "weight (its message says why)",
                        l->name);
    }
    /* collective: refuses, on every rank with the same message, shards that split a block */
    if (hq_gather_create(d->hd, m->ctx, l->qw_shard, &l->gather) ||
        hq_make_empty(l->q_w, m->ctx, l->out, l->in, HQ_F32, &l->qw)) {
      d->failed = 1;
      return train_fail(err, err_len, "layer %s: the weight's gather: %s", l->name,
                        hq_last_error());
    }
  } else if (rc) {
    return train_fail(err, err_len, "layer %s: quantizing the weight's shard: %s", l->name,
                      hq_last_error());
  }
  if (hq_gather_run(l->gather, m->ctx, l->qw_shard, l->qw)) {
    d->failed = 1;
    return train_fail(err, err_len, "layer %s: gathering the weight: %s", l->name, hq_last_error());
  }
  return 0;
}

int train_dist_state_update(train_dist *d, hq_state *st, hq_ctx *ctx) {
  if (!d) return hq_state_update(st, ctx);
  const int rc = hq_dist_state_update(d->hd, st, ctx);
  if (rc) d->failed = 1;
  return rc;
}

void train_dist_wire(const train_model *m, uint64_t *gathered, uint64_t *bf16, uint64_t *reduced) {
  *gathered = *bf16 = *reduced = 0;
  for (int i = 0; i < m->n_lin; i++) {
    const train_linear *l = &m->lin[i];
    hq_gather_info gi = {.struct_size = sizeof gi};
    if (!l->gather || hq_gather_get_info(l->gather, &gi)) continue;
    *gathered += gi.wire_bytes;
    *bf16 += gi.bf16_bytes;
    *reduced += (uint64_t)(l->out * l->in) * (m->cfg.grad_bf16 ? sizeof(uint16_t)
                                                                : sizeof(float));
  }
}

void train_dist_model_free(train_model *m) {
  for (int i = 0; m->lin && i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    if (l->gather) hq_gather_free(l->gather);
    if (l->qw_shard) hq_qtensor_free(l->qw_shard);
    if (l->gws) hq_ctx_free(m->ctx, l->gws);
    l->gather = NULL;
    l->qw_shard = NULL;
    l->gws = NULL;
  }
}
