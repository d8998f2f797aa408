/*
** ckpt_load.c -- loading a checkpoint's tensors into the caller's: a plain tensor into an
** hq_tensor, a quantized one into a qtensor made for the same formats. Every check -- the
** metadata against the qtensor (shape, directions, columnwise source, formats, every buffer's
** name, dtype and shape) and the metadata against the file's entries -- is made before a byte
** is written; then the buffers are read (pread, staged through the host for a device). Also
** what an entry is (hq_ckpt_entry), for a file another tool wrote.
*/
#include "config.h"
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dirs_text(uint32_t d) {
  return d == HQ_BOTH      ? "rowwise+columnwise"
         : d == HQ_ROWWISE ? "rowwise"
         : d == HQ_COLWISE ? "columnwise"
                           : "none";
}

/* Whether a validated shape loads into [rows, cols]: its own two dimensions, else all but the
   last multiplied and the last (a scalar: [1, 1]). The product cannot overflow: the entry's
   element count was checked against its bytes at open. */
static int shape_loads_as(json_t *shape, const int64_t dims[2]) {
  const size_t nd = json_array_size(shape);
  if (nd == 2) return ck_shape_equal(shape, 2, dims);
  int64_t rows = 1, cols = nd ? (int64_t)json_integer_value(json_array_get(shape, nd - 1)) : 1;
  for (size_t k = 0; k + 1 < nd; k++)
    rows *= (int64_t)json_integer_value(json_array_get(shape, k));
  return rows == dims[0] && cols == dims[1];
}

int hq_ckpt_entry(const hq_ckpt *c, const char *name, hq_ckpt_entry_info *out) {
  if (!c || !name || !out) return hq_set_error(HQ_EINVAL, "hq_ckpt_entry: NULL argument");
  if (out->struct_size < HQ_CKPT_ENTRY_INFO_SIZE_0_3)
    return hq_set_error(HQ_EINVAL, "hq_ckpt_entry: hq_ckpt_entry_info.struct_size is %u, at "
                        "least %zu expected (set it to sizeof(hq_ckpt_entry_info))",
                        out->struct_size, (size_t)HQ_CKPT_ENTRY_INFO_SIZE_0_3);
  ck_entry e;
  int rc = ck_find_entry(c, name, &e);
  if (rc == HQ_ENOENT) {
    char *key = hqt_join(name, "/", "hq");
    if (!key) return hq_set_error(HQ_ENOMEM, "hq_ckpt_entry: out of memory");
    const int quant = hq_ckpt_meta(c, key) != NULL;
    free(key);
    return ck_error(HQ_ENOENT, c->path, "hq_ckpt_entry '%.200s': no such entry%s", name,
                    quant ? " (a quantized tensor: its buffers are the entries '<name>/...')"
                          : "");
  }
  if (rc) return rc;
  if (e.ndim > HQ_CKPT_MAX_DIMS)
    return ck_error(HQ_ENOTSUP, c->path, "hq_ckpt_entry '%.200s': %zu dimensions, more than the "
                    "%d hq_ckpt_entry_info holds", name, e.ndim, HQ_CKPT_MAX_DIMS);
  hq_ckpt_entry_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = out->struct_size < sizeof v ? out->struct_size : (uint32_t)sizeof v;
  v.st_dtype = e.st_name;
  v.dtype = e.hq;
  v.ndim = (int)e.ndim;
  for (size_t k = 0; k < e.ndim; k++)
    v.shape[k] = (int64_t)json_integer_value(json_array_get(e.shape, k));
  v.bytes = e.end - e.begin;
  memcpy(out, &v, v.struct_size);
  return HQ_OK;
}

int hq_ckpt_load_tensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_tensor *tp) {
  if (!c || !ctx || !name) return hq_set_error(HQ_EINVAL, "hq_ckpt_load_tensor: NULL argument");
  hq_tensor t;
  char what[300];
  snprintf(what, sizeof what, "hq_ckpt_load_tensor '%.200s'", name);
  int rc = hq_tensor_check(tp, what, &t);
  if (rc) return rc;
  if (t.device != hq_ctx_device(ctx) && t.device != HQ_DEVICE_HOST)
    return ck_error(HQ_EINVAL, c->path, "%s: the tensor is on device %d, the context runs on %d "
                    "(a tensor is on the context's device or on the host)", what, t.device,
                    hq_ctx_device(ctx));
  ck_entry e;
  rc = ck_find_entry(c, name, &e);
  if (rc == HQ_ENOENT) {
    char *key = hqt_join(name, "/", "hq");
    if (!key) return hq_set_error(HQ_ENOMEM, "hq_ckpt_load_tensor: out of memory");
    int quant = hq_ckpt_meta(c, key) != NULL;
    free(key);
    return ck_error(quant ? HQ_EINVAL : HQ_ENOENT, c->path, "%s: %s", what,
                    quant ? "it is a quantized tensor (load it with hq_ckpt_load_qtensor)"
                          : "no such tensor");
  }
  if (rc) return rc;
  const int64_t dims[2] = {t.rows, t.cols};
  char a[200], b[200];
  if (e.hq != t.dtype || !shape_loads_as(e.shape, dims))
    return ck_error(HQ_EINVAL, c->path, "%s: the checkpoint holds %s %s, the destination is %s "
                    "%s", what, e.st_name, ck_shape_text(e.shape, a, sizeof a),
                    ck_st_name_of(t.dtype), ck_dims_text(2, dims, b, sizeof b));
  XXH3_state_t *sum;
  if ((rc = ck_sum_state(c, t.device, &sum))) return rc;
  rc = ck_read_entry(c, ctx, t.data, t.device, name, &e, sum);
  if (sum) XXH3_freeState(sum);
  if (rc) return hqt_error_prefix(rc, "%s", what);
  return HQ_OK;
}

// --- loading a quantized tensor ---------------------------------------------------------------

/* The records of the file's buffers, per direction in the storage's order. */
typedef struct records {
  const ck_mbuf *r[2][HQ_MAX_BUFFERS];
  uint32_t n[2];
} records;

/* No "<name>/hq": a plain entry (or one buffer of a quantized tensor), or nothing at all. */
static int not_quantized(hq_ckpt *c, const char *name) {
  ck_entry e;
  int plain = ck_find_entry(c, name, &e) == HQ_OK;
  return ck_error(plain ? HQ_EINVAL : HQ_ENOENT, c->path, "hq_ckpt_load_qtensor '%.200s': %s",
                  name,
                  plain ? "an entry of the file, but not a quantized tensor (no \"<name>/hq\" "
                          "metadata): a plain tensor (hq_ckpt_load_tensor loads it) or one "
                          "buffer of a quantized tensor"
                        : "no quantized tensor of that name (no \"<name>/hq\" metadata)");
}

/* The metadata's shape, directions and columnwise source against qt's. */
static int check_tensor(const ck_load *L, const ck_meta *m, const hq_qtensor *qt) {
  const char *path = L->c->path, *name = L->name;
  const int64_t rows = hq_qtensor_rows(qt), cols = hq_qtensor_cols(qt);
  if (m->rows != rows || m->cols != cols)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': shape differs: checkpoint [%lld, %lld], "
                    "qtensor [%lld, %lld]", name, (long long)m->rows, (long long)m->cols,
                    (long long)rows, (long long)cols);
  const uint32_t have = hq_qtensor_dirs(qt);
  if (m->dirs != have)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': directions differ: checkpoint %s, qtensor "
                    "%s (make the qtensor with the saved usage)", name, dirs_text(m->dirs),
                    dirs_text(have));
  if (m->nominal != hq_qtensor_nominal_dtype(qt))
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': nominal dtype differs: checkpoint %s, "
                    "qtensor %s", name, hq_dtype_name(m->nominal),
                    hq_dtype_name(hq_qtensor_nominal_dtype(qt)));
  const char *mine = ck_source_name(qt);
  if ((m->dirs & HQ_COLWISE) && strcmp(m->source, mine) != 0)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': columnwise_source differs: checkpoint "
                    "'%.40s', qtensor '%s'", name, m->source, mine);
  return HQ_OK;
}

/* "columnwise_<x>" for a columnwise buffer named x (a shared one keeps the rowwise name): the
   name the buffer has when the columnwise storage owns it. */
static void own_name(uint32_t dir, const char *name, char *buf, size_t len) {
  if (dir == HQ_COLWISE && strncmp(name, "columnwise_", 11) != 0)
    snprintf(buf, len, "columnwise_%s", name);
  else
    snprintf(buf, len, "%s", name);
}

/* Record r against buffer i of qt's storage st: the name (up to shared/private naming), the
   dtype and the shape, hence the byte size. */
static int check_buffer(const ck_load *L, const hq_storage *st, uint32_t i, const ck_mbuf *r) {
  const hq_buffer *b = hq_storage_cbuf(st, i);
  const char *path = L->c->path, *name = L->name, *dn = hq_dir_name(st->dir);
  char na[64], nb[64], sa[200], sb[200];
  own_name(st->dir, r->name, na, sizeof na);
  own_name(st->dir, b->name, nb, sizeof nb);
  size_t bytes = hq_dtype_size(r->dtype);
  for (int k = 0; k < r->ndim; k++) {
    size_t x = (size_t)r->shape[k];
    bytes = x && bytes > SIZE_MAX / x ? SIZE_MAX : bytes * x;
  }
  if (strcmp(na, nb) != 0)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': %s buffer %u differs: checkpoint "
                    "'%.60s', qtensor '%s'", name, dn, i, r->name, b->name);
  if (r->dtype != b->dtype)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': buffer '%s' (%s) dtype differs: "
                    "checkpoint %s, qtensor %s", name, b->name, dn, hq_dtype_name(r->dtype),
                    hq_dtype_name(b->dtype));
  if (r->ndim != b->ndim || memcmp(r->shape, b->shape, (size_t)b->ndim * sizeof(int64_t)) ||
      bytes != b->bytes)
    return ck_error(HQ_EINVAL, path, "tensor '%.200s': buffer '%s' (%s) differs in size: "
                    "checkpoint %s %s (%zu bytes), qtensor %s %s (%zu bytes)", name, b->name, dn,
                    hq_dtype_name(r->dtype), ck_dims_text(r->ndim, r->shape, sa, sizeof sa),
                    bytes, hq_dtype_name(b->dtype), ck_dims_text(b->ndim, b->shape, sb, sizeof sb),
                    b->bytes);
  return HQ_OK;
}

/* Match the records, per direction in order, with qt's buffers, and check each pair. */
static int match_buffers(const ck_load *L, const hq_qtensor *qt, const ck_mbuf *bufs, size_t n,
                         records *rec) {
  const char *path = L->c->path, *name = L->name;
  rec->n[0] = rec->n[1] = 0;
  for (size_t i = 0; i < n; i++) {
    const int d = bufs[i].dir == HQ_COLWISE;
    const hq_storage *st = hq_qtensor_storage(qt, bufs[i].dir);
    if (!st || rec->n[d] >= st->nbuf)
      return ck_error(HQ_EINVAL, path, "tensor '%.200s': the checkpoint has more %s buffers than "
                      "the qtensor's %u (at '%.60s')", name, hq_dir_name(bufs[i].dir),
                      st ? st->nbuf : 0u, bufs[i].name);
    rec->r[d][rec->n[d]++] = &bufs[i];
  }
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    const int d = dir == HQ_COLWISE;
    if (!st) continue;
    if (rec->n[d] != st->nbuf)
      return ck_error(HQ_EINVAL, path, "tensor '%.200s': the checkpoint has %u %s buffers, the "
                      "qtensor %u (first missing: '%s')", name, rec->n[d], hq_dir_name(dir),
                      st->nbuf, hq_storage_cbuf(st, rec->n[d])->name);
    for (uint32_t i = 0; i < st->nbuf; i++) {
      int rc = check_buffer(L, st, i, rec->r[d][i]);
      if (rc) return rc;
    }
  }
  return HQ_OK;
}

/* A columnwise buffer qt shares with its rowwise storage but the file holds as a copy of its own
   (the saved tensor had refreshed one direction alone): qt's columnwise storage gets private
   buffers, before anything is read (as hq_qtensor_update would make them). */
static int make_private(const ck_load *L, hq_ctx *ctx, hq_qtensor *qt, const records *rec) {
  const hq_storage *col = hq_qtensor_storage(qt, HQ_COLWISE);
  for (uint32_t i = 0; col && i < col->nbuf; i++) {
    if (!ck_buffer_aliased(qt, HQ_COLWISE, i)) continue;
    const uint32_t row = (uint32_t)hq_storage_cbuf(col, i)->shared_with;
    if (strcmp(rec->r[1][i]->entry, rec->r[0][row]->entry) == 0) continue;
    int rc = hq_qtensor_unshare(qt, ctx);
    if (rc)
      return hqt_error_prefix(rc, "checkpoint %.200s: tensor '%.200s': private columnwise "
                              "copies", L->c->path, L->name);
    return HQ_OK;
  }
  return HQ_OK;
}

/* Every buffer a storage of qt owns, from its record's entry. */
static int read_buffers(const ck_load *L, hq_ctx *ctx, const hq_qtensor *qt, const records *rec,
                        XXH3_state_t *sum) {
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = hq_qtensor_storage(qt, dir);
    for (uint32_t i = 0; st && i < st->nbuf; i++) {
      if (ck_buffer_aliased(qt, dir, i)) continue;
      const hq_buffer *b = hq_storage_cbuf(st, i);
      const ck_mbuf *r = rec->r[dir == HQ_COLWISE][i];
      int rc = ck_read_entry(L->c, ctx, b->ptr, st->device, r->entry, &r->ce, sum);
      if (rc)
        return hqt_error_prefix(rc, "hq_ckpt_load_qtensor '%.200s': buffer '%s' (the qtensor's "
                                "contents are now undefined)", L->name, b->name);
    }
  }
  return HQ_OK;
}

int hq_ckpt_load_qtensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_qtensor *qt) {
  if (!c || !ctx || !name || !qt)
    return hq_set_error(HQ_EINVAL, "hq_ckpt_load_qtensor: NULL argument");
  int rc = ck_qtensor_usable(c->path, "hq_ckpt_load_qtensor", name, ctx, qt);
  if (rc) return rc;
  char *mkey = hqt_join(name, "/", "hq");
  if (!mkey) return hq_set_error(HQ_ENOMEM, "hq_ckpt_load_qtensor: out of memory");
  const ck_load L = {c, name, mkey};
  ck_meta m = {0};
  ck_mbuf *bufs = NULL;
  size_t nbufs = 0;
  records rec;
  const char *text = hq_ckpt_meta(c, mkey);
  rc = text ? ck_meta_parse(&L, text, &m) : not_quantized(c, name);
  if (!rc) rc = check_tensor(&L, &m, qt);
  if (!rc) rc = ck_meta_check_formats(&L, &m, qt);
  if (!rc) rc = ck_meta_buffers(&L, &m, &bufs, &nbufs);
  if (!rc) rc = match_buffers(&L, qt, bufs, nbufs, &rec);
  XXH3_state_t *sum = NULL;
  if (!rc) rc = ck_sum_state(c, hq_qtensor_device(qt), &sum);
  /* every check passed: the private copies, then the reads */
  if (!rc) rc = make_private(&L, ctx, qt, &rec);
  if (!rc) rc = read_buffers(&L, ctx, qt, &rec, sum);
  if (sum) XXH3_freeState(sum);
  free(bufs);
  ck_meta_free(&m);
  free(mkey);
  return rc;
}
