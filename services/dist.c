/*
** dist.c -- the FSDP gather across ranks, backend-neutral part (hq/dist.h): the shared amax,
** the delayed-scaling reduction, the plan (every rank's shard described, checked against every
** other's, one packed message laid out) and the gather itself (extract, pack, one all-gather,
** unpack in rank order, assign). The backends (dist_mpi.c, dist_nccl.c) move bytes only.
*/
#include "config.h"
#include "dist_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_TIMEOUT_S 300.0
#define MAX_ENTRIES (2 * HQ_MAX_BUFFERS)
/* Entries start at multiples of this in a rank's message, so that every entry's bytes are as
   aligned as a fresh allocation's first 16 bytes (the widest element is 4 bytes). */
#define ENTRY_ALIGN 16

uint32_t hq_dist_backends(void) {
  uint32_t b = 0;
#ifdef HQ_HAVE_MPI
  b |= HQ_DIST_MPI;
#endif
#ifdef HQ_HAVE_NCCL
  b |= HQ_DIST_NCCL;
#endif
  return b;
}

int hqt_dist_init(hq_dist *d, const hqt_dist_ops *ops, const hq_dist_opts *opts, int rank,
                  int size) {
  d->ops = ops;
  d->rank = rank;
  d->size = size;
  d->timeout_s = DEFAULT_TIMEOUT_S;
  if (opts) {
    if (opts->struct_size < sizeof(hq_dist_opts))
      return hq_set_error(HQ_EINVAL, "hq_dist: opts->struct_size %u is smaller than %zu",
                          opts->struct_size, sizeof(hq_dist_opts));
    if (!(opts->timeout_s >= 0))
      return hq_set_error(HQ_EINVAL, "hq_dist: timeout_s %g is not a time", opts->timeout_s);
    if (opts->timeout_s > 0) d->timeout_s = opts->timeout_s;
  }
  return HQ_OK;
}

int hqt_dist_fail(hq_dist *d, int code) {
  d->broken = 1;
  return code;
}

static int dist_usable(const hq_dist *d, const char *what) {
  if (!d) return hq_set_error(HQ_EINVAL, "%s: hq_dist is NULL", what);
  if (d->broken)
    return hq_set_error(HQ_ESTATE, "%s: an earlier %s collective of this communicator failed or "
                        "timed out; the ranks no longer agree (end the job)", what, d->ops->name);
  return HQ_OK;
}

void hq_dist_free(hq_dist *d) {
  if (!d) return;
  if (d->pending && d->ops && d->ops->settle) d->ops->settle(d);
  for (size_t i = 0; i < sizeof d->orphan / sizeof d->orphan[0] && !d->pending; i++)
    free(d->orphan[i]);
  if (d->ops && d->ops->release) d->ops->release(d);
  free(d);
}

int hq_dist_rank(const hq_dist *d) { return d ? d->rank : -1; }
int hq_dist_size(const hq_dist *d) { return d ? d->size : 0; }

static int check_ctx(const hq_dist *d, hq_ctx *ctx, const char *what) {
  if (!ctx) return hq_set_error(HQ_EINVAL, "%s: ctx is NULL", what);
  const int dev = hq_ctx_device(ctx);
  if (d->ops->device_memory && dev < 0)
    return hq_set_error(HQ_EINVAL, "%s: the %s backend gathers GPU memory; ctx is a host context",
                        what, d->ops->name);
  if (!d->ops->device_memory && dev >= 0)
    return hq_set_error(HQ_EINVAL, "%s: the %s backend gathers host memory; ctx is on device %d",
                        what, d->ops->name, dev);
  return HQ_OK;
}

int hq_dist_amax(hq_dist *d, hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, float *amax) {
  int rc = dist_usable(d, "hq_dist_amax");
  if (rc) return rc;
  if ((rc = check_ctx(d, ctx, "hq_dist_amax"))) return rc;
  if (!q || !src || !amax) return hq_set_error(HQ_EINVAL, "hq_dist_amax: NULL argument");
  if ((rc = hq_quantizer_amax(q, ctx, src, amax))) return rc;
  /* Formats without a per-tensor amax (mxfp8, fp8_block, delayed scaling) need no agreement:
     every rank knows that from the same recipe, so every rank skips the collective. */
  if (hq_quantizer_amax_kind(q, HQ_ROWWISE) == HQ_AMAX_NONE &&
      hq_quantizer_amax_kind(q, HQ_COLWISE) == HQ_AMAX_NONE)
    return HQ_OK;
  return d->ops->allreduce_max(d, ctx, amax, 2);
}

int hq_dist_state_update(hq_dist *d, hq_state *st, hq_ctx *ctx) {
  int rc = dist_usable(d, "hq_dist_state_update");
  if (rc) return rc;
  if ((rc = check_ctx(d, ctx, "hq_dist_state_update"))) return rc;
  if (!st) return hq_set_error(HQ_EINVAL, "hq_dist_state_update: st is NULL");
  float *amax = NULL;
  size_t n = 0;
  if ((rc = hq_state_amaxes(st, &amax, &n))) return rc;
  if (n && (rc = d->ops->allreduce_max(d, ctx, amax, n))) return rc;
  return hq_state_update(st, ctx);
}

/* ------------------------------------------------------------------------------------------
** The plan: what each rank says about its shard. Fixed size, zero-filled, compared field by
** field, so that every rank reaches the same verdict from the same bytes.
*/
#define SIG_MAGIC 0x68714731u /* "hqG1" */

typedef struct sig_entry {
  char name[48];
  uint32_t dir, dtype;
  int64_t rows, row_bytes;
} sig_entry;

typedef struct sig_dir {
  char format[64];               /* instance name */
  char plugin[32];
  char options[256];             /* "name=value name=value ..." as configured */
  int64_t shard_rows;
  int32_t block_m, block_k;
} sig_dir;

typedef struct sig {
  uint32_t magic, dirs;
  int32_t status;                /* this rank's own refusal (its message in why) */
  int32_t rebuild;               /* 1: the columnwise entry equals the rowwise one here */
  int64_t rows, cols;
  uint32_t nominal, n;
  int32_t colsrc, reserved;
  char role[128];
  sig_dir dir[2];
  sig_entry e[MAX_ENTRIES];
  char why[384];
} sig;

struct hq_gather {
  hq_dist *d;
  int device;                    /* the staging memory's device (-1: host) */
  int64_t rows, cols;            /* the full tensor */
  size_t n;                      /* entries of the extracted list */
  int rebuild;                   /* entry `rebuild_of[e]` stands in for entry e when >= 0 */
  int rebuild_of[MAX_ENTRIES];
  hq_fsdp_buffer ent[MAX_ENTRIES]; /* name, dir, dtype, row_bytes of every entry */
  int64_t *rows_of;              /* [size][n]: entry rows of each rank */
  size_t *off;                   /* [size][n]: entry offset in each rank's message */
  size_t *counts, *displs;       /* [size]: message bytes and place in recv */
  size_t send_bytes, recv_bytes;
  void *send, *recv, *full[MAX_ENTRIES];
  hq_ctx *ctx;                   /* owns the staging memory */
  /* host memory, per-rank counts (MPI): each entry is unpacked straight into its place in the
     full tensor named by `key` (its address and its buffers'): a buffer of the full tensor
     itself where hq_fsdp_extract of it lists that buffer in place, else full[e] */
  int direct;
  size_t sent;                   /* entries that travel (not rebuilt) */
  void *dest[MAX_ENTRIES];
  const void *key[1 + 2 * HQ_MAX_BUFFERS];
  int have_dest;
  char rebuilt_name[48];         /* the rebuilt entry's buffer (not extracted by a run) */
  int pending;                   /* a collective into the staging memory may still be running */
  uint64_t rebuilt_bytes;
};

static void copy_str(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
}

static const char *dir_name(uint32_t dir) {
  return dir == HQ_ROWWISE ? "rowwise" : "columnwise";
}

/* Whether the columnwise copy of qt is, byte for byte, the rowwise copy transposed: one
   per-tensor FP32 scale in one buffer for both directions (one quantize call), the same 1-byte
   element,
   no transform. Then the columnwise entry of the extracted list (sent M-major) IS the rowwise
   data entry, and the gather sends it once. */
static int rebuildable(const hq_qtensor *qt) {
  if (hq_qtensor_dirs(qt) != HQ_BOTH) return 0;
  const hq_storage *r = hq_qtensor_storage(qt, HQ_ROWWISE), *c = hq_qtensor_storage(qt, HQ_COLWISE);
  if (!r || !c) return 0;
  if (r->desc.scale_mode != HQ_SCALE_TENSOR_F32 || c->desc.scale_mode != HQ_SCALE_TENSOR_F32 ||
      r->desc.order != HQ_ORDER_MK || c->desc.order != HQ_ORDER_KM ||
      r->desc.transform != HQ_TRANSFORM_NONE || c->desc.transform != HQ_TRANSFORM_NONE ||
      r->desc.elem != c->desc.elem || hq_dtype_size(r->desc.elem) != 1)
    return 0;
  /* one scale: the columnwise scale is the rowwise scale's memory (made by one call; a
     direction updated alone since has a copy of its own, and is then sent) */
  const void *rs = NULL, *cs = NULL;
  for (uint32_t i = 0; i < r->nbuf; i++)
    if (HQ_STORAGE_BUF((hq_storage *)r, i)->role == HQ_ROLE_SCALE)
      rs = HQ_STORAGE_BUF((hq_storage *)r, i)->ptr;
  for (uint32_t i = 0; i < c->nbuf; i++)
    if (HQ_STORAGE_BUF((hq_storage *)c, i)->role == HQ_ROLE_SCALE)
      cs = HQ_STORAGE_BUF((hq_storage *)c, i)->ptr;
  return rs && rs == cs;
}

static void describe_dir(const hq_qtensor *qt, uint32_t dir, sig_dir *out) {
  const hq_storage *s = hq_qtensor_storage(qt, dir);
  if (s) {
    out->shard_rows = s->desc.shard_rows;
    out->block_m = s->desc.block_m;
    out->block_k = s->desc.block_k;
  }
  hq_format_desc fd;
  memset(&fd, 0, sizeof fd);
  fd.struct_size = sizeof fd;
  if (hq_qtensor_format_desc(qt, dir, &fd) != HQ_OK) return; /* compared empty */
  copy_str(out->format, sizeof out->format, fd.name);
  copy_str(out->plugin, sizeof out->plugin, fd.plugin);
  size_t used = 0;
  for (size_t i = 0; i < fd.n_options && used < sizeof out->options; i++) {
    int k = snprintf(out->options + used, sizeof out->options - used, "%s%s=%s", i ? " " : "",
                     fd.option_names[i], fd.option_values[i]);
    if (k < 0) break;
    used += (size_t)k;
  }
}

/* This rank's description; on a local refusal, status and why say it (the rank still takes part
   in the exchange, so that every rank learns of it). */
static void describe(hq_qtensor *shard, hq_ctx *ctx, sig *s, hq_fsdp_buffer *ext, size_t *n) {
  memset(s, 0, sizeof *s);
  s->magic = SIG_MAGIC;
  s->dirs = hq_qtensor_dirs(shard);
  s->rows = hq_qtensor_rows(shard);
  s->cols = hq_qtensor_cols(shard);
  s->nominal = (uint32_t)hq_qtensor_nominal_dtype(shard);
  s->colsrc = hq_qtensor_columnwise_source(shard);
  copy_str(s->role, sizeof s->role, hq_qtensor_role(shard));
  for (int i = 0; i < 2; i++)
    if (s->dirs & (1u << i)) describe_dir(shard, 1u << i, &s->dir[i]);
  /* a shard splitting a scaling block: refused by every rank with the global row range (the
     message is made after the exchange, from shard_rows and the blocks) */
  for (int i = 0; i < 2; i++)
    if ((s->dirs & (1u << i)) && s->dir[i].shard_rows > 0 && s->rows % s->dir[i].shard_rows) {
      s->status = HQ_ESHAPE;
      return;
    }
  int rc = hq_fsdp_extract(shard, ctx, ext, MAX_ENTRIES, sizeof(hq_fsdp_buffer), n);
  if (rc) {
    s->status = rc;
    copy_str(s->why, sizeof s->why, hq_last_error());
    *n = 0;
    return;
  }
  s->n = (uint32_t)*n;
  for (size_t e = 0; e < *n; e++) {
    copy_str(s->e[e].name, sizeof s->e[e].name, ext[e].name);
    s->e[e].dir = ext[e].dir;
    s->e[e].dtype = (uint32_t)ext[e].dtype;
    s->e[e].rows = ext[e].rows;
    s->e[e].row_bytes = ext[e].row_bytes;
  }
  /* rebuild only what is provably equal here; every rank must say so for the plan to use it */
  if (rebuildable(shard) && *n == 2 && ext[0].dir == HQ_ROWWISE && ext[1].dir == HQ_COLWISE &&
      ext[0].rows == ext[1].rows && ext[0].row_bytes == ext[1].row_bytes) {
    s->rebuild = 1;
    if (hq_ctx_device(ctx) < 0)
      s->rebuild = !memcmp(ext[0].ptr, ext[1].ptr, (size_t)(ext[0].rows * ext[0].row_bytes));
  }
}

/* The verdict on all ranks' descriptions: the first refusal or disagreement, in rank order, as
   one message (the same on every rank). */
static int judge(const sig *all, int size, const char *what) {
  int64_t r0 = 0;
  for (int r = 0; r < size; r++) {
    const sig *s = &all[r];
    if (s->magic != SIG_MAGIC)
      return hq_set_error(HQ_EINVAL, "%s: rank %d sent no shard description (a rank made "
                          "another collective call)", what, r);
    if (s->status == HQ_ESHAPE && !s->why[0]) {
      for (int i = 0; i < 2; i++) {
        const sig_dir *sd = &s->dir[i];
        if (!(s->dirs & (1u << i)) || sd->shard_rows <= 0 || s->rows % sd->shard_rows == 0)
          continue;
        return hq_set_error(HQ_ESHAPE, "%s: the shard of rank %d, rows [%" PRId64 ", %" PRId64
                            ") (%" PRId64 " rows), would split a %" PRId64 "-row scaling block "
                            "of %s (%s, %s, %dx%d blocks): every shard's rows must be a multiple of "
                            "%" PRId64, what, r, r0, r0 + s->rows, s->rows, sd->shard_rows,
                            sd->format, sd->plugin, dir_name(1u << i), sd->block_m, sd->block_k,
                            sd->shard_rows);
      }
    }
    if (s->status)
      return hq_set_error(s->status, "%s: rank %d refuses its shard, rows [%" PRId64 ", %" PRId64
                          "): %s", what, r, r0, r0 + s->rows, s->why);
    r0 += s->rows;
  }
  const sig *a = &all[0];
  for (int r = 1; r < size; r++) {
    const sig *b = &all[r];
#define DIFFER(fmt, field, name)                                                               \
  return hq_set_error(HQ_EINVAL, "%s: ranks disagree on the %s: rank 0 has " fmt              \
                      ", rank %d has " fmt, what, name, a->field, r, b->field)
    if (strcmp(a->role, b->role)) DIFFER("%s", role, "role");
    if (a->cols != b->cols) DIFFER("%" PRId64, cols, "columns");
    if (a->dirs != b->dirs) DIFFER("directions %u", dirs, "directions present");
    if (a->nominal != b->nominal) DIFFER("dtype %u", nominal, "nominal dtype");
    if (a->colsrc != b->colsrc) DIFFER("%d", colsrc, "columnwise_source");
    for (int i = 0; i < 2; i++) {
      char name[64];
      snprintf(name, sizeof name, "%s format", dir_name(1u << i));
      if (strcmp(a->dir[i].format, b->dir[i].format)) DIFFER("'%s'", dir[i].format, name);
      if (strcmp(a->dir[i].plugin, b->dir[i].plugin)) DIFFER("'%s'", dir[i].plugin, name);
      snprintf(name, sizeof name, "%s format's options", dir_name(1u << i));
      if (strcmp(a->dir[i].options, b->dir[i].options)) DIFFER("'%s'", dir[i].options, name);
    }
    if (a->n != b->n) DIFFER("%u", n, "number of gathered buffers");
    for (uint32_t e = 0; e < a->n; e++) {
      char name[96];
      snprintf(name, sizeof name, "gathered buffer %u", e);
      if (strcmp(a->e[e].name, b->e[e].name)) DIFFER("'%s'", e[e].name, name);
      snprintf(name, sizeof name, "row size of gathered buffer '%s'", a->e[e].name);
      if (a->e[e].row_bytes != b->e[e].row_bytes) DIFFER("%" PRId64, e[e].row_bytes, name);
      if (a->e[e].dtype != b->e[e].dtype || a->e[e].dir != b->e[e].dir)
        DIFFER("dtype %u", e[e].dtype, name);
    }
#undef DIFFER
  }
  return HQ_OK;
}

static size_t align_up(size_t x) { return (x + ENTRY_ALIGN - 1) / ENTRY_ALIGN * ENTRY_ALIGN; }

static void gather_release(hq_gather *g) {
  if (!g->ctx) return;
  hq_ctx_free(g->ctx, g->send);
  hq_ctx_free(g->ctx, g->recv);
  for (size_t e = 0; e < g->n; e++)
    if (g->rebuild_of[e] < 0 && g->full[e]) hq_ctx_free(g->ctx, g->full[e]);
}

void hq_gather_free(hq_gather *g) {
  if (!g) return;
  /* a collective that timed out may still write into the staging memory: it stays allocated */
  if (!g->pending) gather_release(g);
  free(g->rows_of);
  free(g->off);
  free(g->counts);
  free(g->displs);
  free(g);
}

/* Lay out the messages and allocate the staging memory from every rank's description. */
static int plan(hq_gather *g, const sig *all, hq_ctx *ctx, const char *what) {
  hq_dist *d = g->d;
  const int size = d->size;
  g->n = all[0].n;
  g->rebuild = 1;
  for (int r = 0; r < size; r++) g->rebuild &= all[r].rebuild;
  g->rows_of = calloc((size_t)size * MAX_ENTRIES, sizeof *g->rows_of);
  g->off = calloc((size_t)size * MAX_ENTRIES, sizeof *g->off);
  g->counts = calloc((size_t)size, sizeof *g->counts);
  g->displs = calloc((size_t)size, sizeof *g->displs);
  if (!g->rows_of || !g->off || !g->counts || !g->displs)
    return hq_set_error(HQ_ENOMEM, "%s: out of memory for the plan", what);
  for (size_t e = 0; e < g->n; e++) g->rebuild_of[e] = -1;
  if (g->rebuild) {
    g->rebuild_of[1] = 0;
    copy_str(g->rebuilt_name, sizeof g->rebuilt_name, all[0].e[1].name);
  }
  /* Host memory with a count per rank: no padding between entries (they are copied, never
     read in place), and an entry's rank parts lie in rank order in its full buffer exactly as
     the all-gather lays out the messages, so a single sent entry is gathered in place. */
  g->direct = !d->ops->uniform_slots && !d->ops->device_memory;
  g->sent = g->n - (g->rebuild ? 1u : 0u);
  size_t slot = 0;
  for (int r = 0; r < size; r++) {
    size_t o = 0;
    for (size_t e = 0; e < g->n; e++) {
      g->rows_of[(size_t)r * MAX_ENTRIES + e] = all[r].e[e].rows;
      if (g->rebuild_of[e] >= 0) continue;
      g->off[(size_t)r * MAX_ENTRIES + e] = o;
      o += (size_t)(all[r].e[e].rows * all[r].e[e].row_bytes);
      if (!g->direct) o = align_up(o);
    }
    g->counts[r] = o;
    if (o > slot) slot = o;
  }
  size_t at = 0;
  for (int r = 0; r < size; r++) {
    if (d->ops->uniform_slots) g->counts[r] = slot;
    g->displs[r] = at;
    at += g->counts[r];
  }
  g->send_bytes = g->counts[d->rank];
  g->recv_bytes = at;
  for (size_t e = 0; e < g->n; e++) {
    g->ent[e].struct_size = sizeof(hq_fsdp_buffer);
    g->ent[e].dir = all[0].e[e].dir;
    g->ent[e].dtype = (hq_dtype)all[0].e[e].dtype;
    g->ent[e].device = hq_ctx_device(ctx);
    g->ent[e].row_bytes = all[0].e[e].row_bytes;
    int64_t rows = 0;
    for (int r = 0; r < size; r++) rows += all[r].e[e].rows;
    g->ent[e].rows = rows;
    if (g->rebuild_of[e] >= 0) g->rebuilt_bytes += (uint64_t)(rows * g->ent[e].row_bytes);
  }
  g->ctx = ctx;
  if (g->direct && g->sent == 1) return HQ_OK; /* no staging: sent and received in place */
  /* direct: packed into this rank's place in recv, no send buffer */
  int rc = g->direct ? HQ_OK : hq_ctx_alloc(ctx, g->send_bytes ? g->send_bytes : 1, &g->send);
  if (!rc) rc = hq_ctx_alloc(ctx, g->recv_bytes ? g->recv_bytes : 1, &g->recv);
  for (size_t e = 0; e < g->n && !rc && !g->direct; e++) /* direct: found at the first run */
    if (g->rebuild_of[e] < 0)
      rc = hq_ctx_alloc(ctx, (size_t)(g->ent[e].rows * g->ent[e].row_bytes) + 1, &g->full[e]);
  if (rc) return hqt_error_prefix(rc, "%s: staging memory", what);
  if (g->direct) return HQ_OK; /* no padding to clear */
  /* the alignment padding goes out too: zero it once, so that no stale bytes travel */
  void *zero = calloc(1, g->send_bytes ? g->send_bytes : 1);
  if (!zero) return hq_set_error(HQ_ENOMEM, "%s: out of memory", what);
  rc = hq_ctx_memcpy(ctx, g->send, g->device, zero, -1, g->send_bytes);
  if (!rc) rc = hq_ctx_sync(ctx);
  free(zero);
  return rc;
}

int hq_gather_create(hq_dist *d, hq_ctx *ctx, hq_qtensor *shard, hq_gather **out) {
  static const char what[] = "hq_gather_create";
  if (out) *out = NULL;
  int rc = dist_usable(d, what);
  if (rc) return rc;
  if ((rc = check_ctx(d, ctx, what))) return rc;
  if (!shard || !out) return hq_set_error(HQ_EINVAL, "%s: NULL argument", what);
  /* the names of the messages: "hq_gather_create of linear:weight:fc1" */
  char name[192];
  snprintf(name, sizeof name, "%s of %s", what, hq_qtensor_role(shard));
  sig *mine = calloc(1, sizeof *mine), *all = calloc((size_t)d->size, sizeof *all);
  hq_fsdp_buffer ext[MAX_ENTRIES];
  size_t n = 0;
  if (!mine || !all) {
    free(mine);
    free(all);
    return hq_set_error(HQ_ENOMEM, "%s: out of memory", name);
  }
  describe(shard, ctx, mine, ext, &n);
  hq_fsdp_release(shard);
  rc = d->ops->allgather_host(d, ctx, mine, all, sizeof *mine);
  if (!rc) rc = judge(all, d->size, name);
  hq_gather *g = NULL;
  if (!rc) {
    g = calloc(1, sizeof *g);
    if (!g) rc = hq_set_error(HQ_ENOMEM, "%s: out of memory", name);
  }
  if (!rc) {
    g->d = d;
    g->device = hq_ctx_device(ctx);
    g->cols = all[0].cols;
    for (int r = 0; r < d->size; r++) g->rows += all[r].rows;
    rc = plan(g, all, ctx, name);
    for (size_t e = 0; e < g->n; e++) g->ent[e].name = NULL; /* set from each run's extract */
  }
  if (d->pending) { /* a collective that timed out may still write into them: kept */
    d->orphan[0] = mine;
    d->orphan[1] = all;
  } else {
    free(mine);
    free(all);
  }
  if (rc) {
    hq_gather_free(g);
    return rc;
  }
  *out = g;
  return HQ_OK;
}

/* The full tensor's own address and its buffers' (what the entries' places depend on). */
static void full_key(const hq_qtensor *full, const void **key) {
  memset(key, 0, (1 + 2 * HQ_MAX_BUFFERS) * sizeof *key);
  key[0] = full;
  for (int i = 0; i < 2; i++) {
    const hq_storage *s = hq_qtensor_dirs(full) & (1u << i)
                              ? hq_qtensor_storage(full, 1u << i) : NULL;
    for (uint32_t b = 0; s && b < s->nbuf && b < HQ_MAX_BUFFERS; b++)
      key[1 + i * HQ_MAX_BUFFERS + b] = HQ_STORAGE_BUF((hq_storage *)s, b)->ptr;
  }
}

/* Where every sent entry lands in full. hq_fsdp_extract of the full tensor lists a buffer that
   is gathered by rows as the buffer itself (its first rows), and hq_fsdp_assign copies nothing
   for an entry that is that buffer; every other entry (transposed, or in a format's own form)
   lands in full[e] and is assigned from there. Found once per full tensor. */
static int find_dest(hq_gather *g, hq_ctx *ctx, hq_qtensor *full, const char *what) {
  const void *key[1 + 2 * HQ_MAX_BUFFERS];
  full_key(full, key);
  if (g->have_dest && !memcmp(key, g->key, sizeof key)) return HQ_OK;
  g->have_dest = 0;
  hq_fsdp_buffer fe[MAX_ENTRIES];
  size_t n = 0;
  int rc = hq_fsdp_extract(full, ctx, fe, MAX_ENTRIES, sizeof(hq_fsdp_buffer), &n);
  if (!rc && n != g->n)
    rc = hq_set_error(HQ_EINVAL, "%s of %s: the full tensor has %zu buffers to gather, the "
                      "shards %zu", what, hq_qtensor_role(full), n, g->n);
  for (size_t e = 0; e < g->n && !rc; e++) {
    g->dest[e] = NULL;
    if (g->rebuild_of[e] >= 0) continue;
    if (fe[e].rows != g->ent[e].rows || fe[e].row_bytes != g->ent[e].row_bytes ||
        fe[e].dir != g->ent[e].dir) {
      rc = hq_set_error(HQ_EINVAL, "%s of %s: buffer '%s' of the full tensor is %" PRId64 " x %"
                        PRId64 " bytes, the shards make %" PRId64 " x %" PRId64, what,
                        hq_qtensor_role(full), fe[e].name, fe[e].rows, fe[e].row_bytes,
                        g->ent[e].rows, g->ent[e].row_bytes);
      break;
    }
    const hq_storage *s = hq_qtensor_storage(full, fe[e].dir);
    for (uint32_t b = 0; s && b < s->nbuf; b++)
      if (HQ_STORAGE_BUF((hq_storage *)s, b)->ptr == fe[e].ptr) g->dest[e] = fe[e].ptr;
    if (!g->dest[e] && !g->full[e])
      rc = hq_ctx_alloc(ctx, (size_t)(g->ent[e].rows * g->ent[e].row_bytes) + 1, &g->full[e]);
    if (!g->dest[e]) g->dest[e] = g->full[e];
  }
  hq_fsdp_release(full);
  if (rc) return rc;
  memcpy(g->key, key, sizeof key);
  g->have_dest = 1;
  return HQ_OK;
}

/* Every sent entry of every rank from the received message into dest[e] (memory of device dev,
   as the message's): entry e of rank r goes after the rows of ranks 0..r-1. */
static int unpack(const hq_gather *g, hq_ctx *ctx, void *const *dest, int dev) {
  int rc = HQ_OK;
  for (size_t e = 0; e < g->n && !rc; e++) {
    if (g->rebuild_of[e] >= 0) continue;
    size_t at = 0;
    for (int r = 0; r < g->d->size && !rc; r++) {
      const size_t k = (size_t)r * MAX_ENTRIES + e;
      const size_t bytes = (size_t)(g->rows_of[k] * g->ent[e].row_bytes);
      rc = hq_ctx_memcpy(ctx, (char *)dest[e] + at, dev,
                         (const char *)g->recv + g->displs[r] + g->off[k], dev, bytes);
      at += bytes;
    }
  }
  return rc;
}

/* The gather in host memory with a count per rank: the entries land in their places in full
   (find_dest). A single sent entry goes from the shard's buffer straight to its place; several
   are packed into one message (one collective) and each rank's part copied to its place. */
static int run_direct(hq_gather *g, hq_ctx *ctx, hq_qtensor *shard, hq_qtensor *full,
                      const hq_fsdp_buffer *ext) {
  static const char what[] = "hq_gather_run";
  hq_dist *d = g->d;
  const size_t me = (size_t)d->rank * MAX_ENTRIES;
  int rc = find_dest(g, ctx, full, what);
  size_t one = 0;
  while (one < g->n && g->rebuild_of[one] >= 0) one++;
  if (!rc && g->sent == 1) {
    rc = d->ops->allgatherv(d, ctx, ext[one].ptr, g->dest[one], g->counts, g->displs);
  } else if (!rc) {
    /* packed straight into this rank's place in the received message and gathered in place,
       so that the collective does not copy this rank's part once more */
    char *mine = (char *)g->recv + g->displs[d->rank];
    for (size_t e = 0; e < g->n; e++)
      if (g->rebuild_of[e] < 0)
        memcpy(mine + g->off[me + e], ext[e].ptr,
               (size_t)(g->rows_of[me + e] * g->ent[e].row_bytes));
    rc = d->ops->allgatherv(d, ctx, mine, g->recv, g->counts, g->displs);
    if (!rc) rc = unpack(g, ctx, g->dest, HQ_DEVICE_HOST);
  }
  g->pending = d->pending;
  hq_fsdp_buffer gathered[MAX_ENTRIES];
  for (size_t e = 0; e < g->n; e++) {
    gathered[e] = g->ent[e];
    gathered[e].name = ext[e].name;
    gathered[e].ptr = g->dest[g->rebuild_of[e] >= 0 ? (size_t)g->rebuild_of[e] : e];
  }
  /* a collective still pending may read the shard's staging: it is kept then */
  if (!g->pending) hq_fsdp_release(shard);
  if (rc) return rc;
  return hq_fsdp_assign(full, ctx, shard, gathered, g->n, sizeof(hq_fsdp_buffer));
}

int hq_gather_run(hq_gather *g, hq_ctx *ctx, hq_qtensor *shard, hq_qtensor *full) {
  static const char what[] = "hq_gather_run";
  if (!g) return hq_set_error(HQ_EINVAL, "%s: plan is NULL", what);
  hq_dist *d = g->d;
  int rc = dist_usable(d, what);
  if (rc) return rc;
  if (!ctx || !shard || !full) return hq_set_error(HQ_EINVAL, "%s: NULL argument", what);
  if (ctx != g->ctx && hq_ctx_device(ctx) != g->device)
    return hq_set_error(HQ_EINVAL, "%s: ctx is on device %d, the plan's memory on %d", what,
                        hq_ctx_device(ctx), g->device);
  if (hq_qtensor_rows(full) != g->rows || hq_qtensor_cols(full) != g->cols)
    return hq_set_error(HQ_ESHAPE, "%s of %s: the full tensor is [%" PRId64 ", %" PRId64 "], the "
                        "ranks' shards make [%" PRId64 ", %" PRId64 "]", what,
                        hq_qtensor_role(shard), hq_qtensor_rows(full), hq_qtensor_cols(full),
                        g->rows, g->cols);
  hq_fsdp_buffer ext[MAX_ENTRIES];
  size_t n = 0;
  /* a rebuilt direction (the columnwise one, the last entry) is neither extracted nor sent */
  if ((rc = hq_fsdp_extract_dirs(shard, ctx, g->rebuild ? HQ_ROWWISE : HQ_BOTH, ext,
                                 MAX_ENTRIES, sizeof(hq_fsdp_buffer), &n)))
    return rc;
  const size_t me = (size_t)d->rank * MAX_ENTRIES;
  /* the plan was made for this shard: a shard that changed since would desynchronize the
     ranks, so it is refused here (the other ranks then time out in the collective) */
  if (n != g->sent) rc = hq_set_error(HQ_EINVAL, "%s: the shard has %zu buffers to gather, the "
                                      "plan %zu (make a new plan)", what, n, g->sent);
  for (size_t e = 0; e < n && !rc; e++)
    if (ext[e].rows != g->rows_of[me + e] || ext[e].row_bytes != g->ent[e].row_bytes ||
        ext[e].dir != g->ent[e].dir)
      rc = hq_set_error(HQ_EINVAL, "%s: buffer '%s' of the shard is %" PRId64 " x %" PRId64
                        " bytes, the plan's %" PRId64 " x %" PRId64 " (make a new plan)", what,
                        ext[e].name, ext[e].rows, ext[e].row_bytes, g->rows_of[me + e],
                        g->ent[e].row_bytes);
  if (!rc && g->rebuild && hq_qtensor_dirs(shard) != HQ_BOTH)
    rc = hq_set_error(HQ_EINVAL, "%s: the plan rebuilds the columnwise copy of a shard with both "
                      "directions; this shard has directions 0x%x (make a new plan)", what,
                      hq_qtensor_dirs(shard));
  for (size_t e = n; e < g->n && !rc; e++) { /* the rebuilt entry, as the plan describes it */
    ext[e] = g->ent[e];
    ext[e].name = g->rebuilt_name;
    ext[e].rows = g->rows_of[me + e];
    ext[e].ptr = NULL;
  }
  n = g->n;
  if (!rc && g->direct) return run_direct(g, ctx, shard, full, ext);
  /* pack: every sent entry at its offset in this rank's message */
  for (size_t e = 0; e < n && !rc; e++) {
    if (g->rebuild_of[e] >= 0) continue;
    rc = hq_ctx_memcpy(ctx, (char *)g->send + g->off[me + e], g->device, ext[e].ptr, g->device,
                       (size_t)(ext[e].rows * ext[e].row_bytes));
  }
  hq_fsdp_buffer gathered[MAX_ENTRIES];
  for (size_t e = 0; e < n; e++) {
    gathered[e] = g->ent[e];
    gathered[e].name = ext[e].name;
  }
  hq_fsdp_release(shard);
  if (rc) return rc;
  if ((rc = d->ops->allgatherv(d, ctx, g->send, g->recv, g->counts, g->displs))) {
    g->pending = d->pending;
    return rc;
  }
  rc = unpack(g, ctx, g->full, g->device);
  for (size_t e = 0; e < g->n; e++)
    gathered[e].ptr = g->full[g->rebuild_of[e] >= 0 ? (size_t)g->rebuild_of[e] : e];
  if (!rc) rc = hq_fsdp_assign(full, ctx, shard, gathered, g->n, sizeof(hq_fsdp_buffer));
  return rc;
}

int hq_gather_get_info(const hq_gather *g, hq_gather_info *out) {
  if (!g || !out) return hq_set_error(HQ_EINVAL, "hq_gather_get_info: NULL argument");
  if (out->struct_size < sizeof *out)
    return hq_set_error(HQ_EINVAL, "hq_gather_get_info: struct_size %u is smaller than %zu",
                        out->struct_size, sizeof *out);
  const uint32_t ss = out->struct_size;
  memset(out, 0, sizeof *out);
  out->struct_size = ss;
  out->collectives = 1;
  out->rows = g->rows;
  out->cols = g->cols;
  out->send_bytes = g->send_bytes;
  out->wire_bytes = g->recv_bytes;
  out->bf16_bytes = (uint64_t)(g->rows * g->cols) * 2u;
  out->rebuilt_bytes = g->rebuilt_bytes;
  out->rebuilt_dir = g->rebuild ? HQ_COLWISE : 0;
  out->entries = (uint32_t)g->n;
  return HQ_OK;
}
