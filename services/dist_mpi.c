/*
** dist_mpi.c -- the Open MPI backend of the FSDP gather (hq/dist.h): host memory, a duplicate
** of the caller's communicator with MPI_ERRORS_RETURN, nonblocking collectives polled against
** the timeout, so that a rank that died or never comes returns an error instead of a hang.
*/
#include "config.h"
#include <mpi.h>
#include "dist_impl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct mpi_impl {
  MPI_Comm comm;                 /* our duplicate */
  MPI_Request stuck;             /* the request a wait gave up on (MPI_REQUEST_NULL: none) */
  int *counts, *displs;          /* [size], MPI's int arguments */
} mpi_impl;

static int mpi_fail(hq_dist *d, int err, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  hq_set_error(HQ_EIO, "%s: MPI error %d: %s", what, err, text);
  return hqt_dist_fail(d, HQ_EIO);
}

/* Wait for req, polling, at most the timeout. A request that never completes is left behind
   (MPI cannot cancel a collective): d->pending keeps its buffers allocated. */
static int mpi_wait(hq_dist *d, MPI_Request *req, const char *what) {
  const double t0 = MPI_Wtime();
  /* a short sleep between polls: ranks oversubscribed on few cores leave the core to the
     rank that still computes, at a latency far below a collective's */
  const struct timespec nap = {0, 20000};
  for (;;) {
    int done = 0, err = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) {
      d->pending = 1;
      return mpi_fail(d, err, what);
    }
    if (done) return HQ_OK;
    if (MPI_Wtime() - t0 > d->timeout_s) {
      d->pending = 1;
      ((mpi_impl *)d->impl)->stuck = *req;
      hq_set_error(HQ_EIO, "%s: no answer from every rank within %g s (a rank died, hangs or "
                   "makes other collective calls); end the job", what, d->timeout_s);
      return hqt_dist_fail(d, HQ_EIO);
    }
    nanosleep(&nap, NULL);
  }
}

static int mpi_allgather_host(hq_dist *d, hq_ctx *ctx, const void *send, void *recv,
                              size_t bytes) {
  (void)ctx;
  mpi_impl *m = d->impl;
  MPI_Request req;
  int err = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, m->comm, &req);
  if (err != MPI_SUCCESS) return mpi_fail(d, err, "MPI_Iallgather of the shard descriptions");
  return mpi_wait(d, &req, "MPI_Iallgather of the shard descriptions");
}

static int mpi_allgatherv(hq_dist *d, hq_ctx *ctx, const void *send, void *recv,
                          const size_t *counts, const size_t *displs) {
  (void)ctx;
  mpi_impl *m = d->impl;
  for (int r = 0; r < d->size; r++) {
    if (counts[r] > INT_MAX || displs[r] > INT_MAX)
      return hq_set_error(HQ_ENOTSUP, "MPI_Iallgatherv: the gathered message is %zu bytes, more "
                          "than MPI's int counts hold", displs[d->size - 1] + counts[d->size - 1]);
    m->counts[r] = (int)counts[r];
    m->displs[r] = (int)displs[r];
  }
  MPI_Request req;
  /* a message already in its place is gathered in place: MPI copies nothing onto itself */
  if (send == (const char *)recv + displs[d->rank]) send = MPI_IN_PLACE;
  int err = MPI_Iallgatherv(send, m->counts[d->rank], MPI_BYTE, recv, m->counts, m->displs,
                            MPI_BYTE, m->comm, &req);
  if (err != MPI_SUCCESS) return mpi_fail(d, err, "MPI_Iallgatherv of a quantized parameter");
  return mpi_wait(d, &req, "MPI_Iallgatherv of a quantized parameter");
}

static int mpi_allreduce_max(hq_dist *d, hq_ctx *ctx, float *buf, size_t n) {
  (void)ctx;
  mpi_impl *m = d->impl;
  if (n > INT_MAX) return hq_set_error(HQ_ENOTSUP, "MPI_Iallreduce: %zu floats", n);
  MPI_Request req;
  int err = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_MAX, m->comm, &req);
  if (err != MPI_SUCCESS) return mpi_fail(d, err, "MPI_Iallreduce (MAX) of amaxes");
  return mpi_wait(d, &req, "MPI_Iallreduce (MAX) of amaxes");
}

static void mpi_settle(hq_dist *d) {
  mpi_impl *m = d->impl;
  int done = 0;
  if (m && m->stuck != MPI_REQUEST_NULL && MPI_Test(&m->stuck, &done, MPI_STATUS_IGNORE) ==
      MPI_SUCCESS && done)
    d->pending = 0;
}

static void mpi_release(hq_dist *d) {
  mpi_impl *m = d->impl;
  if (!m) return;
  /* freeing a communicator with a collective in flight is erroneous: a broken one is left */
  if (!d->pending && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  free(m->counts);
  free(m->displs);
  free(m);
}

static const hqt_dist_ops mpi_ops = {
    .name = "MPI",
    .uniform_slots = 0,
    .device_memory = 0,
    .allgather_host = mpi_allgather_host,
    .allgatherv = mpi_allgatherv,
    .allreduce_max = mpi_allreduce_max,
    .settle = mpi_settle,
    .release = mpi_release,
};

int hq_dist_mpi_create(MPI_Comm comm, const hq_dist_opts *opts, hq_dist **out) {
  if (!out) return hq_set_error(HQ_EINVAL, "hq_dist_mpi_create: out is NULL");
  *out = NULL;
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return hq_set_error(HQ_ESTATE, "hq_dist_mpi_create: MPI is not initialized");
  if (comm == MPI_COMM_NULL) return hq_set_error(HQ_EINVAL, "hq_dist_mpi_create: MPI_COMM_NULL");
  hq_dist *d = calloc(1, sizeof *d);
  mpi_impl *m = calloc(1, sizeof *m);
  if (!d || !m) {
    free(d);
    free(m);
    return hq_set_error(HQ_ENOMEM, "hq_dist_mpi_create: out of memory");
  }
  m->comm = MPI_COMM_NULL;
  m->stuck = MPI_REQUEST_NULL;
  d->ops = &mpi_ops;
  d->impl = m;
  int rank = 0, size = 0, err = MPI_Comm_dup(comm, &m->comm);
  if (err == MPI_SUCCESS) err = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  if (err == MPI_SUCCESS) err = MPI_Comm_rank(m->comm, &rank);
  if (err == MPI_SUCCESS) err = MPI_Comm_size(m->comm, &size);
  int rc = err == MPI_SUCCESS ? HQ_OK : mpi_fail(d, err, "hq_dist_mpi_create: MPI_Comm_dup");
  if (!rc) rc = hqt_dist_init(d, &mpi_ops, opts, rank, size);
  if (!rc) {
    m->counts = calloc((size_t)size, sizeof *m->counts);
    m->displs = calloc((size_t)size, sizeof *m->displs);
    if (!m->counts || !m->displs) rc = hq_set_error(HQ_ENOMEM, "hq_dist_mpi_create: out of memory");
  }
  if (rc) {
    d->pending = 0;
    hq_dist_free(d);
    return rc;
  }
  *out = d;
  return HQ_OK;
}
