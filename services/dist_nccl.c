/*
** dist_nccl.c -- the NCCL backend of the FSDP gather (hq/dist.h): GPU memory, the caller's
** communicator, every collective on the stream of the context given to the call. NCCL has no
** all-gatherv, so every rank sends a slot of the largest rank's size (ncclAllGather). Waiting
** follows NCCL's documented pattern for a bounded wait: poll the stream and
** ncclCommGetAsyncError, and ncclCommAbort the communicator when the time is up. Every NCCL
** and CUDA return code is checked.
**
** NCCL is found at run time (dlopen), not linked: a process that already holds an NCCL -- the one
** that made the caller's communicator, PyTorch's own -- must not get a second copy of another
** version beside it, where one library's symbols would bind to the other's (an older system NCCL
** linked into libhqtrain broke `import torch` after `import hq`). The library that made `comm`
** is loaded already, so RTLD_NOLOAD finds it by its soname; failing that, it is loaded.
*/
#include "config.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include "dist_impl.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The NCCL entry points this backend calls, resolved from the process's libnccl.so.2. */
typedef struct nccl_api {
  void *lib;
  ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                             ncclComm_t, cudaStream_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_count)(const ncclComm_t, int *);
  ncclResult_t (*comm_cu_device)(const ncclComm_t, int *);
  ncclResult_t (*comm_user_rank)(const ncclComm_t, int *);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
  const char *(*get_error_string)(ncclResult_t);
  const char *(*get_last_error)(ncclComm_t);
} nccl_api;

typedef struct nccl_impl {
  ncclComm_t comm;               /* the caller's */
  int device;                    /* the communicator's CUDA device */
  nccl_api api;
} nccl_impl;

static int nccl_load(nccl_api *a) {
  a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!a->lib) a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!a->lib)
    return hq_set_error(HQ_ENOTSUP, "hq_dist_nccl_create: libnccl.so.2 cannot be loaded: %s",
                        dlerror());
  const struct {
    const char *name;
    void **slot;
  } sym[] = {{"ncclAllGather", (void **)&a->all_gather},
             {"ncclAllReduce", (void **)&a->all_reduce},
             {"ncclCommAbort", (void **)&a->comm_abort},
             {"ncclCommCount", (void **)&a->comm_count},
             {"ncclCommCuDevice", (void **)&a->comm_cu_device},
             {"ncclCommUserRank", (void **)&a->comm_user_rank},
             {"ncclCommGetAsyncError", (void **)&a->comm_get_async_error},
             {"ncclGetErrorString", (void **)&a->get_error_string},
             {"ncclGetLastError", (void **)&a->get_last_error}};
  for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++)
    if (!(*sym[i].slot = dlsym(a->lib, sym[i].name)))
      return hq_set_error(HQ_ENOTSUP, "hq_dist_nccl_create: the process's libnccl.so.2 has no "
                          "%s (NCCL 2.13 or newer is needed)", sym[i].name);
  return HQ_OK;
}

static int cuda_fail(hq_dist *d, cudaError_t e, const char *what) {
  hq_set_error(HQ_EDEVICE, "%s: CUDA error %d: %s", what, (int)e, cudaGetErrorString(e));
  return hqt_dist_fail(d, HQ_EDEVICE);
}

static int nccl_fail(hq_dist *d, ncclResult_t r, const char *what) {
  nccl_impl *n = d->impl;
  const char *last = n && n->api.get_last_error ? n->api.get_last_error(n->comm) : NULL;
  hq_set_error(HQ_EIO, "%s: NCCL error %d: %s%s%s", what, (int)r,
               n && n->api.get_error_string ? n->api.get_error_string(r) : "(no NCCL)",
               last && last[0] ? ": " : "", last ? last : "");
  return hqt_dist_fail(d, HQ_EIO);
}

/* Make the communicator's device current for a call; *saved receives the caller's. */
static int enter(hq_dist *d, hq_ctx *ctx, int *saved, const char *what) {
  nccl_impl *n = d->impl;
  if (hq_ctx_device(ctx) != n->device)
    return hq_set_error(HQ_EINVAL, "%s: ctx is on device %d, the NCCL communicator on %d", what,
                        hq_ctx_device(ctx), n->device);
  cudaError_t e = cudaGetDevice(saved);
  if (e == cudaSuccess) e = cudaSetDevice(n->device);
  return e == cudaSuccess ? HQ_OK : cuda_fail(d, e, what);
}

static void leave(int saved) { (void)cudaSetDevice(saved); }

/* Wait until the stream's work (the collective) is done, at most the timeout. */
static int nccl_wait(hq_dist *d, cudaStream_t stream, const char *what) {
  nccl_impl *n = d->impl;
  struct timespec t0, now;
  const struct timespec nap = {0, 20000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return HQ_OK;
    if (e != cudaErrorNotReady) {
      d->pending = 1;
      return cuda_fail(d, e, what);
    }
    ncclResult_t async = ncclSuccess, r = n->api.comm_get_async_error(n->comm, &async);
    if (r != ncclSuccess) {
      d->pending = 1;
      return nccl_fail(d, r, what);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      d->pending = 1;
      (void)n->api.comm_abort(n->comm);
      return nccl_fail(d, async, what);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) >
        d->timeout_s) {
      d->pending = 1;
      (void)n->api.comm_abort(n->comm);
      hq_set_error(HQ_EIO, "%s: not finished within %g s (a rank died, hangs or makes other "
                   "collective calls); the NCCL communicator was aborted", what, d->timeout_s);
      return hqt_dist_fail(d, HQ_EIO);
    }
    nanosleep(&nap, NULL);
  }
}

static int nccl_allgather_host(hq_dist *d, hq_ctx *ctx, const void *send, void *recv,
                               size_t bytes) {
  static const char what[] = "ncclAllGather of the shard descriptions";
  nccl_impl *n = d->impl;
  int saved, rc = enter(d, ctx, &saved, what);
  if (rc) return rc;
  cudaStream_t stream = (cudaStream_t)hq_ctx_stream(ctx);
  void *buf = NULL;
  const size_t total = bytes * (size_t)d->size;
  cudaError_t e = cudaMalloc(&buf, total);
  if (e != cudaSuccess) {
    leave(saved);
    return cuda_fail(d, e, what);
  }
  /* in place: this rank's description at its own slot */
  char *mine = (char *)buf + bytes * (size_t)d->rank;
  e = cudaMemcpyAsync(mine, send, bytes, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) rc = cuda_fail(d, e, what);
  if (!rc) {
    ncclResult_t r = n->api.all_gather(mine, buf, bytes, ncclUint8, n->comm, stream);
    if (r != ncclSuccess) rc = nccl_fail(d, r, what);
  }
  if (!rc) rc = nccl_wait(d, stream, what);
  if (!rc) {
    e = cudaMemcpyAsync(recv, buf, total, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) rc = cuda_fail(d, e, what);
  }
  if (!d->pending) (void)cudaFree(buf);
  leave(saved);
  return rc;
}

static int nccl_allgatherv(hq_dist *d, hq_ctx *ctx, const void *send, void *recv,
                           const size_t *counts, const size_t *displs) {
  static const char what[] = "ncclAllGather of a quantized parameter";
  nccl_impl *n = d->impl;
  (void)displs; /* uniform slots: rank r's at r * counts[0] */
  int saved, rc = enter(d, ctx, &saved, what);
  if (rc) return rc;
  cudaStream_t stream = (cudaStream_t)hq_ctx_stream(ctx);
  ncclResult_t r = n->api.all_gather(send, recv, counts[0], ncclUint8, n->comm, stream);
  rc = r == ncclSuccess ? nccl_wait(d, stream, what) : nccl_fail(d, r, what);
  leave(saved);
  return rc;
}

static int nccl_allreduce_max(hq_dist *d, hq_ctx *ctx, float *buf, size_t count) {
  static const char what[] = "ncclAllReduce (max) of amaxes";
  nccl_impl *n = d->impl;
  int saved, rc = enter(d, ctx, &saved, what);
  if (rc) return rc;
  cudaStream_t stream = (cudaStream_t)hq_ctx_stream(ctx);
  ncclResult_t r = n->api.all_reduce(buf, buf, count, ncclFloat32, ncclMax, n->comm, stream);
  rc = r == ncclSuccess ? nccl_wait(d, stream, what) : nccl_fail(d, r, what);
  leave(saved);
  return rc;
}

static void nccl_release(hq_dist *d) {
  nccl_impl *n = d->impl;
  if (n && n->api.lib) dlclose(n->api.lib);
  free(n);
}

static const hqt_dist_ops nccl_ops = {
    .name = "NCCL",
    .uniform_slots = 1,
    .device_memory = 1,
    .allgather_host = nccl_allgather_host,
    .allgatherv = nccl_allgatherv,
    .allreduce_max = nccl_allreduce_max,
    .release = nccl_release,
};

int hq_dist_nccl_create(ncclComm_t comm, const hq_dist_opts *opts, hq_dist **out) {
  if (!out) return hq_set_error(HQ_EINVAL, "hq_dist_nccl_create: out is NULL");
  *out = NULL;
  if (!comm) return hq_set_error(HQ_EINVAL, "hq_dist_nccl_create: comm is NULL");
  hq_dist *d = calloc(1, sizeof *d);
  nccl_impl *n = calloc(1, sizeof *n);
  if (!d || !n) {
    free(d);
    free(n);
    return hq_set_error(HQ_ENOMEM, "hq_dist_nccl_create: out of memory");
  }
  n->comm = comm;
  d->ops = &nccl_ops;
  d->impl = n;
  int rank = 0, size = 0, rc = nccl_load(&n->api);
  if (!rc) {
    ncclResult_t r = n->api.comm_user_rank(comm, &rank);
    if (r == ncclSuccess) r = n->api.comm_count(comm, &size);
    if (r == ncclSuccess) r = n->api.comm_cu_device(comm, &n->device);
    if (r != ncclSuccess) rc = nccl_fail(d, r, "hq_dist_nccl_create");
  }
  if (!rc) rc = hqt_dist_init(d, &nccl_ops, opts, rank, size);
  if (rc) {
    hq_dist_free(d);
    return rc;
  }
  *out = d;
  return HQ_OK;
}
