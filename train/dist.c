/*
** dist.c -- `hq train` across ranks (dist.h): the communicator, the shards, the gathers of the
** quantized weights and the reductions of the gradients, through Open MPI on the host.
*/
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HQ_HAVE_MPI
#include <mpi.h>
#endif
#include "hq/dist.h"
#include "train.h"
#include "dist.h"

struct train_dist {
  int rank, size;
  hq_dist *hd;                    /* the gathers and the amaxes */
#ifdef HQ_HAVE_MPI
  MPI_Comm comm;                  /* the reductions: a duplicate that returns its errors */
#endif
};

static int fail(char *err, size_t err_len, const char *fmt, ...) HQ_PRINTF(3, 4);
static int fail(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return -1;
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
  return fail(err, err_len, "%s: %s", what, s);
}

int train_dist_init(train_dist **out, char *err, size_t err_len) {
  *out = NULL;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (!ws || atoi(ws) < 2) return 0;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited && MPI_Init(NULL, NULL) != MPI_SUCCESS)
    return fail(err, err_len, "MPI_Init failed under mpirun (OMPI_COMM_WORLD_SIZE=%s)", ws);
  train_dist *d = calloc(1, sizeof *d);
  if (!d) return fail(err, err_len, "out of memory");
  MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &d->size);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &d->comm) != MPI_SUCCESS) {
    free(d);
    MPI_Finalize();
    return fail(err, err_len, "MPI_Comm_dup failed");
  }
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
  if (hq_dist_mpi_create(MPI_COMM_WORLD, NULL, &d->hd)) {
    fail(err, err_len, "rank %d: the communicator: %s", d->rank, hq_last_error());
    MPI_Comm_free(&d->comm);
    free(d);
    MPI_Finalize();
    return -1;
  }
  /* rank 0 speaks for the job: the others' progress, table and JSON would repeat it */
  const int rank = d->rank;
  if (rank != 0 && !freopen("/dev/null", "w", stdout)) {
    train_dist_end(d);
    return fail(err, err_len, "rank %d: /dev/null for stdout", rank);
  }
  *out = d;
  return 0;
}

void train_dist_end(train_dist *d) {
  if (!d) return;
  hq_dist_free(d->hd);
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

void train_dist_loss_grad(train_model *m) {
  train_dist *d = m->cfg.dist;
  if (!d) return;
  const float inv = 1.0f / (float)d->size;
  const int64_t n = m->cfg.batch * m->cfg.vocab_pad;
  for (int64_t k = 0; k < n; k++) m->dlogits[k] *= inv;
}

int train_dist_grads(train_model *m, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  if (!d) return 0;
  int counts[64];
  if (d->size > (int)(sizeof counts / sizeof *counts))
    return fail(err, err_len, "%d ranks: at most %d", d->size, (int)(sizeof counts / sizeof *counts));
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    for (int r = 0; r < d->size; r++) {
      int64_t first, rows;
      shard_of(l->out, d->size, r, &first, &rows);
      counts[r] = (int)(rows * l->in);
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

int train_dist_gather_rows(train_model *m, const float *shard, int64_t rows,
                           int64_t total, int64_t cols, float *full, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  const size_t fs = sizeof(float);
  if (!d) {   /* one process holds every row */
    if (hq_ctx_memcpy(m->ctx, full, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                      (size_t)(total * cols) * fs))
      return fail(err, err_len, "copying to the host: %s", hq_last_error());
    return 0;
  }
  /* MPI counts are ints: the checkpoint of a larger tensor needs a gather in pieces */
  if (total * cols > INT32_MAX)
    return fail(err, err_len, "a [%lld, %lld] tensor: more than %d elements cannot be gathered "
                "in one MPI call", (long long)total, (long long)cols, INT32_MAX);
  int counts[64], displs[64];
  if (d->size > (int)(sizeof counts / sizeof *counts))
    return fail(err, err_len, "%d ranks: at most %d", d->size, (int)(sizeof counts / sizeof *counts));
  for (int r = 0; r < d->size; r++) {
    int64_t f, n;
    shard_of(total, d->size, r, &f, &n);
    counts[r] = (int)(n * cols);
    displs[r] = (int)(f * cols);
  }
  /* host staging: the shard may be device memory, MPI is given host buffers only */
  float *h = malloc((size_t)(rows * cols) * fs + fs);
  if (!h) return fail(err, err_len, "out of memory");
  int rc = 0;
  if (rows > 0 && hq_ctx_memcpy(m->ctx, h, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                                (size_t)(rows * cols) * fs))
    rc = fail(err, err_len, "copying the shard to the host: %s", hq_last_error());
  /* the gather runs even after a failed copy: the other ranks are in it */
  const int mr = MPI_Gatherv(h, (int)(rows * cols), MPI_FLOAT, full, counts, displs, MPI_FLOAT, 0,
                             d->comm);
  free(h);
  if (!rc && mr != MPI_SUCCESS) rc = mpi_fail(err, err_len, mr, "MPI_Gatherv");
  return rc;
}

int train_dist_all_ok(train_dist *d, int ok) { return d ? all_ok(d, ok) : ok; }

#else /* !HQ_HAVE_MPI */

int train_dist_init(train_dist **out, char *err, size_t err_len) {
  *out = NULL;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (ws && atoi(ws) > 1)
    return fail(err, err_len, "run by mpirun with %s ranks, but this hq was built without MPI "
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
void train_dist_loss_grad(train_model *m) { (void)m; }
static int all_ok(train_dist *d, int ok) {
  (void)d;
  return ok;
}
int train_dist_all_ok(train_dist *d, int ok) { return all_ok(d, ok); }
int train_dist_gather_rows(train_model *m, const float *shard, int64_t rows,
                           int64_t total, int64_t cols, float *full, char *err, size_t err_len) {
  (void)rows;
  if (hq_ctx_memcpy(m->ctx, full, HQ_DEVICE_HOST, shard, hq_ctx_device(m->ctx),
                    (size_t)(total * cols) * sizeof(float)))
    return fail(err, err_len, "copying to the host: %s", hq_last_error());
  return 0;
}

#endif

int train_dist_quantize(train_model *m, hq_quantizer *q, const hq_tensor *src,
                        hq_quantize_args *a, hq_qtensor **out) {
  train_dist *d = m->cfg.dist;
  float amax[2];
  if (d) {
    const int rc = hq_dist_amax(d->hd, q, m->ctx, src, amax);
    if (rc) return rc;
    a->amax = amax;
  }
  return hq_quantize_ex(q, m->ctx, src, a, out);
}

int train_dist_weight(train_model *m, train_linear *l, int first, char *err, size_t err_len) {
  train_dist *d = m->cfg.dist;
  hq_tensor w = hq_tensor_2d(l->w, HQ_F32, hq_ctx_device(m->ctx), l->rows, l->in);
  if (!d) {
    if (first && hq_quantize(l->q_w, m->ctx, &w, &l->qw))
      return fail(err, err_len, "layer %s: quantizing the weight: %s", l->name, hq_last_error());
    return 0;
  }
  float amax[2];
  hq_quantize_args a = {.struct_size = sizeof a, .amax = amax};
  int rc = hq_dist_amax(d->hd, l->q_w, m->ctx, &w, amax);
  if (!rc) rc = first ? hq_quantize_ex(l->q_w, m->ctx, &w, &a, &l->qw_shard)
                      : hq_qtensor_update_ex(l->qw_shard, m->ctx, &w, &a);
  if (first) {
    /* a shard a format refuses (rows not a multiple of its blocks) fails on this rank only */
    if (!all_ok(d, rc == 0)) {
      if (rc)
        return fail(err, err_len, "layer %s: quantizing rank %d's shard of the weight, rows "
                    "[%lld, %lld) of %lld: %s", l->name, d->rank, (long long)l->r0,
                    (long long)(l->r0 + l->rows), (long long)l->out, hq_last_error());
      return fail(err, err_len, "layer %s: another rank could not quantize its shard of the "
                  "weight (its message says why)", l->name);
    }
    /* collective: refuses, on every rank with the same message, shards that split a block */
    if (hq_gather_create(d->hd, m->ctx, l->qw_shard, &l->gather) ||
        hq_make_empty(l->q_w, m->ctx, l->out, l->in, HQ_F32, &l->qw))
      return fail(err, err_len, "layer %s: the weight's gather: %s", l->name, hq_last_error());
  } else if (rc) {
    return fail(err, err_len, "layer %s: quantizing the weight's shard: %s", l->name,
                hq_last_error());
  }
  if (hq_gather_run(l->gather, m->ctx, l->qw_shard, l->qw))
    return fail(err, err_len, "layer %s: gathering the weight: %s", l->name, hq_last_error());
  return 0;
}

int train_dist_state_update(train_dist *d, hq_state *st, hq_ctx *ctx) {
  return d ? hq_dist_state_update(d->hd, st, ctx) : hq_state_update(st, ctx);
}

void train_dist_wire(const train_model *m, uint64_t *gathered, uint64_t *bf16, uint64_t *reduced) {
  *gathered = *bf16 = *reduced = 0;
  for (int i = 0; i < m->n_lin; i++) {
    const train_linear *l = &m->lin[i];
    hq_gather_info gi = {.struct_size = sizeof gi};
    if (!l->gather || hq_gather_get_info(l->gather, &gi)) continue;
    *gathered += gi.wire_bytes;
    *bf16 += gi.bf16_bytes;
    *reduced += (uint64_t)(l->out * l->in) * sizeof(float);
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
