/*
** quantizer.c -- the hybrid quantizer (one format per direction, usage flags) and quantized
** tensors (one storage per direction): make, quantize, update, dequantize, drop, save/restore.
**
** One plugin call makes both directions when they use the same format instance and the
** columnwise source is the original tensor, so "hybrid with equal formats" is the single-format
** quantize, bit for bit, by construction. Buffers a columnwise storage marks HQ_BUF_SHARED are the
** rowwise storage's memory while both directions come from one call; before a direction is
** refreshed or dropped on its own, the other gets private copies so it never goes inconsistent.
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct hq_quantizer {
  hqi_format *fmt[2];     /* [0] ROWWISE, [1] COLWISE; never NULL */
  uint32_t usage;
  int source;
  char *role;             /* "module_type:tensor_type:name", for messages */
};

typedef struct qdir {
  int present;
  hq_storage st;
  uint8_t owned[HQ_MAX_BUFFERS];   /* 1: this storage owns buf[i].ptr; 0: it aliases rowwise */
} qdir;

struct hq_qtensor {
  hq_ctx *ctx;
  hqi_format *fmt[2];
  uint32_t usage;
  int source;
  char *role;
  int64_t rows, cols;
  hq_dtype nominal;
  qdir d[2];
  int saved;
  uint64_t offset;        /* random stream of the operation in progress */
};

static int di(uint32_t dir) { return dir == HQ_COLWISE ? 1 : 0; }
static const char *dname(uint32_t dir) { return dir == HQ_COLWISE ? "columnwise" : "rowwise"; }

// --- quantizers -------------------------------------------------------------------------------

int hq_quantizer_create(hq_recipe *r, const hq_role *role, hq_quantizer **out) {
  if (!r || !role || !out) return hqi_error(HQ_EINVAL, "hq_quantizer_create: NULL argument");
  *out = NULL;
  if (hq_recipe_error_count(r))
    return hqi_error(HQ_EPARSE, "recipe %s has errors: %s", hq_recipe_path(r),
                     hq_recipe_error(r, 0));
  long idx = hq_recipe_match(r, role);
  hq_quantizer *q = calloc(1, sizeof *q);
  if (!q) return hqi_error(HQ_ENOMEM, "out of memory");
  q->role = hqi_asprintf("%s:%s:%s", role->module_type ? role->module_type : "",
                         role->tensor_type ? role->tensor_type : "", role->name ? role->name : "");
  q->usage = HQ_BOTH;
  for (int d = 0; d < 2; d++) {
    hqi_format *f = hqi_recipe_format_of(r, idx, d ? HQ_COLWISE : HQ_ROWWISE, &q->source);
    if (!f) {
      hq_quantizer_free(q);
      return hqi_error(HQ_ENOENT, "role %s: its %s direction stays in high precision, but the "
                       "identity plugin is not available (see `hq info`)",
                       q->role ? q->role : "?", d ? "columnwise" : "rowwise");
    }
    q->fmt[d] = hqi_format_retain(f);
  }
  if (!q->role) {
    hq_quantizer_free(q);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  *out = q;
  return HQ_OK;
}

void hq_quantizer_free(hq_quantizer *q) {
  if (!q) return;
  hqi_format_release(q->fmt[0]);
  hqi_format_release(q->fmt[1]);
  free(q->role);
  free(q);
}

int hq_quantizer_set_usage(hq_quantizer *q, uint32_t dirs) {
  if (!q) return hqi_error(HQ_EINVAL, "hq_quantizer_set_usage: q is NULL");
  if (dirs & ~HQ_BOTH) return hqi_error(HQ_EINVAL, "usage 0x%x has unknown bits", dirs);
  q->usage = dirs;
  return HQ_OK;
}

uint32_t hq_quantizer_usage(const hq_quantizer *q) { return q ? q->usage : 0; }
const char *hq_quantizer_format(const hq_quantizer *q, uint32_t dir) {
  return q ? q->fmt[di(dir)]->name : NULL;
}
const char *hq_quantizer_plugin(const hq_quantizer *q, uint32_t dir) {
  return q ? q->fmt[di(dir)]->plugin->ops.name : NULL;
}
int hq_quantizer_columnwise_source(const hq_quantizer *q) { return q ? q->source : 0; }
int hq_quantizer_fused(const hq_quantizer *q) { return q && q->fmt[0] == q->fmt[1]; }

int hq_quantizer_requant_safe(const hq_quantizer *q) {
  if (!q) return 0;
  int row_safe = (q->fmt[0]->caps & HQ_CAP_REQUANT_SAFE) != 0;
  int col_safe = (q->fmt[1]->caps & HQ_CAP_REQUANT_SAFE) != 0;
  if ((q->usage & HQ_ROWWISE) && !row_safe) return 0;
  if (q->usage & HQ_COLWISE) {
    if (!col_safe) return 0;
    if (q->source == HQ_SOURCE_ROWWISE_DEQUANTIZED && !row_safe) return 0;
  }
  return 1;
}

// --- storages ---------------------------------------------------------------------------------

static int ctx_ready(hq_ctx *ctx) {
  return ctx->device >= 0 ? hqi_cuda_set_device(ctx->device) : HQ_OK;
}

static int check_device(const hqi_format *f, const hq_ctx *ctx, const char *role, uint32_t dir) {
  uint64_t need = ctx->device >= 0 ? HQ_CAP_CUDA : HQ_CAP_CPU;
  if (!(f->caps & need))
    return hqi_error(HQ_ENOTSUP, "role %s, %s format '%s' (plugin %s): no %s path", role,
                     dname(dir), f->name, f->plugin->ops.name, ctx->device >= 0 ? "CUDA" : "CPU");
  return HQ_OK;
}

static void free_dir(hq_ctx *ctx, qdir *q) {
  if (!q->present) return;
  for (uint32_t i = 0; i < q->st.nbuf; i++)
    if (q->owned[i] && q->st.buf[i].ptr) hqi_ctx_free_raw(ctx, q->st.buf[i].ptr);
  memset(q, 0, sizeof *q);
}

/* Check what layout() described and compute byte sizes. */
static int check_layout(const hqi_format *f, hq_storage *st, const hq_storage *row) {
  if (st->nbuf > HQ_MAX_BUFFERS)
    return hqi_error(HQ_EABI, "layout() described %u buffers (at most %d)", st->nbuf,
                     HQ_MAX_BUFFERS);
  for (uint32_t i = 0; i < st->nbuf; i++) {
    hq_buffer *b = &st->buf[i];
    size_t es = hq_dtype_size(b->dtype);
    if (!b->name || !es || b->ndim < 1 || b->ndim > HQ_MAX_BUFFER_DIMS)
      return hqi_error(HQ_EABI, "layout() of '%s' described an invalid buffer %u (name, dtype or "
                       "ndim)", f->plugin->ops.name, i);
    size_t n = es;
    for (int k = 0; k < b->ndim; k++) {
      if (b->shape[k] < 0 || (b->shape[k] && n > SIZE_MAX / (size_t)b->shape[k]))
        return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' has an invalid shape",
                         f->plugin->ops.name, b->name);
      n *= (size_t)b->shape[k];
    }
    b->bytes = n;
    b->ptr = NULL;
    if (b->flags & HQ_BUF_SHARED) {
      if (st->dir != HQ_COLWISE)
        return hqi_error(HQ_EABI, "layout() of '%s': rowwise buffer '%s' is marked shared",
                         f->plugin->ops.name, b->name);
      if (row && (b->shared_with < 0 || (uint32_t)b->shared_with >= row->nbuf ||
                  row->buf[b->shared_with].bytes != b->bytes))
        return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' is shared with a rowwise buffer "
                         "that does not exist or differs in size", f->plugin->ops.name, b->name);
    }
  }
  return HQ_OK;
}

/* Describe and allocate the storages of `dirs` made by one call of format f. */
static int make_storages(hq_qtensor *qt, hqi_format *f, uint32_t dirs) {
  hq_ctx *ctx = qt->ctx;
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    if (!(dirs & dir)) continue;
    qdir *q = &qt->d[d];
    memset(q, 0, sizeof *q);
    q->st.dir = dir;
    q->st.rows = qt->rows;
    q->st.cols = qt->cols;
    q->st.device = ctx->device;
    q->st.nominal = qt->nominal;
    int rc = f->plugin->ops.layout(f->cfg, &hqi_host_api, qt->rows, qt->cols, dir, dirs, &q->st);
    if (!rc) rc = check_layout(f, &q->st, (dirs & HQ_ROWWISE) && d ? &qt->d[0].st : NULL);
    if (rc) {
      memset(q, 0, sizeof *q);
      return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), shape [%lld, %lld]",
                              qt->role, dname(dir), f->name, f->plugin->ops.name,
                              (long long)qt->rows, (long long)qt->cols);
    }
    q->present = 1;
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      hq_buffer *b = &q->st.buf[i];
      if ((b->flags & HQ_BUF_SHARED) && d == 1 && (dirs & HQ_ROWWISE)) {
        b->ptr = qt->d[0].st.buf[b->shared_with].ptr;
        continue;
      }
      b->ptr = hqi_ctx_alloc_raw(ctx, b->bytes ? b->bytes : 1);
      if (!b->ptr)
        return hqi_error(HQ_ENOMEM, "role %s: allocating %s buffer '%s' (%zu bytes) on device "
                         "%d failed", qt->role, dname(dir), b->name, b->bytes, ctx->device);
      q->owned[i] = 1;
    }
    if (f->plugin->ops.make_empty) {
      hq_call call;
      hqi_call_init(ctx, &call, NULL, qt->offset);
      rc = f->plugin->ops.make_empty(f->cfg, &call, &q->st);
      if (rc)
        return hqi_error_prefix(rc, "role %s, %s format '%s': make_empty", qt->role, dname(dir),
                                f->name);
    }
  }
  return HQ_OK;
}

/* Give the columnwise storage private copies of the buffers it shares with the rowwise one. */
static int unshare(hq_qtensor *qt) {
  qdir *c = &qt->d[1];
  if (!c->present) return HQ_OK;
  for (uint32_t i = 0; i < c->st.nbuf; i++) {
    hq_buffer *b = &c->st.buf[i];
    if (c->owned[i] || !b->ptr) continue;
    void *p = hqi_ctx_alloc_raw(qt->ctx, b->bytes ? b->bytes : 1);
    if (!p) return hqi_error(HQ_ENOMEM, "role %s: copying shared buffer '%s' failed", qt->role,
                             b->name);
    int rc = hq_ctx_memcpy(qt->ctx, p, qt->ctx->device, b->ptr, qt->ctx->device, b->bytes);
    if (rc) {
      hqi_ctx_free_raw(qt->ctx, p);
      return rc;
    }
    b->ptr = p;
    c->owned[i] = 1;
  }
  return HQ_OK;
}

/* Point the columnwise storage's shared buffers back at the rowwise ones (fused calls). */
static void reshare(hq_qtensor *qt) {
  qdir *c = &qt->d[1], *r = &qt->d[0];
  if (!c->present || !r->present) return;
  for (uint32_t i = 0; i < c->st.nbuf; i++) {
    hq_buffer *b = &c->st.buf[i];
    if (!(b->flags & HQ_BUF_SHARED) || !c->owned[i]) continue;
    hqi_ctx_free_raw(qt->ctx, b->ptr);
    b->ptr = r->st.buf[b->shared_with].ptr;
    c->owned[i] = 0;
  }
}

static int call_quantize(hq_qtensor *qt, hqi_format *f, const hq_tensor *src, uint32_t dirs,
                         hq_storage *row, hq_storage *col, int update) {
  hq_call call;
  hqi_call_init(qt->ctx, &call, NULL, qt->offset);
  const hq_format_ops *ops = &f->plugin->ops;
  if (dirs == HQ_COLWISE && !(f->caps & HQ_CAP_COLWISE_ONLY))
    return hqi_error(HQ_ENOTSUP, "role %s, columnwise format '%s' (plugin %s) cannot make a "
                     "columnwise storage without a rowwise one", qt->role, f->name, ops->name);
  hq_clear_error();
  int rc = update && ops->update ? ops->update(f->cfg, &call, src, dirs, row, col)
                                 : ops->quantize(f->cfg, &call, src, dirs, row, col);
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), %s of [%lld, %lld] %s",
                            qt->role, dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs),
                            f->name, ops->name, update ? "update" : "quantize",
                            (long long)src->rows, (long long)src->cols, hq_dtype_name(src->dtype));
  return HQ_OK;
}

static int call_dequantize(const hq_qtensor *qt, uint32_t dir, const hq_storage *st,
                           hq_tensor *dst) {
  hqi_format *f = qt->fmt[di(dir)];
  hq_call call;
  hqi_call_init(qt->ctx, &call, NULL, qt->offset);
  hq_clear_error();
  int rc = f->plugin->ops.dequantize(f->cfg, &call, st, dst);
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), dequantize", qt->role,
                            dname(dir), f->name, f->plugin->ops.name);
  return HQ_OK;
}

/* Columnwise input for the "rowwise_dequantized" source: dequantize a rowwise storage (the
   tensor's own if `row` is given, else a transient quantization) into a temporary of src's
   dtype. *tmp receives the temporary (free with hqi_ctx_free_raw). */
static int rowwise_source(hq_qtensor *qt, const hq_tensor *src, const hq_storage *row,
                          hq_tensor *out, void **tmp) {
  hq_ctx *ctx = qt->ctx;
  hq_qtensor t = {0};
  int rc = HQ_OK;
  *tmp = NULL;
  if (!row) {
    t.ctx = ctx;
    t.fmt[0] = t.fmt[1] = qt->fmt[0];
    t.role = qt->role;
    t.rows = qt->rows;
    t.cols = qt->cols;
    t.nominal = src->dtype;
    t.offset = qt->offset;
    rc = make_storages(&t, qt->fmt[0], HQ_ROWWISE);
    if (!rc) rc = call_quantize(&t, qt->fmt[0], src, HQ_ROWWISE, &t.d[0].st, NULL, 0);
    row = &t.d[0].st;
  }
  size_t bytes = (size_t)qt->rows * (size_t)qt->cols * hq_dtype_size(src->dtype);
  if (!rc) {
    *tmp = hqi_ctx_alloc_raw(ctx, bytes);
    if (!*tmp) rc = hqi_error(HQ_ENOMEM, "role %s: %zu bytes for the dequantized rowwise source",
                              qt->role, bytes);
  }
  if (!rc) {
    *out = *src;
    out->data = *tmp;
    rc = call_dequantize(qt, HQ_ROWWISE, row, out);
  }
  free_dir(ctx, &t.d[0]);
  if (rc && *tmp) {
    hqi_ctx_free_raw(ctx, *tmp);
    *tmp = NULL;
  }
  return rc;
}

/* Quantize (update = 0) or refresh (update = 1) the directions `dirs` of qt from src. For a
   fresh quantize the storages are made here; for an update they exist. */
static int run(hq_qtensor *qt, const hq_tensor *src, uint32_t dirs, int update) {
  hqi_format *fr = qt->fmt[0], *fc = qt->fmt[1];
  int rc;
  qt->offset = qt->ctx->offset++;
  if (dirs == HQ_BOTH && fr == fc && qt->source == HQ_SOURCE_ORIGINAL) {
    if (!update) rc = make_storages(qt, fr, HQ_BOTH);
    else {
      reshare(qt);
      rc = HQ_OK;
    }
    return rc ? rc : call_quantize(qt, fr, src, HQ_BOTH, &qt->d[0].st, &qt->d[1].st, update);
  }
  if (update && dirs != HQ_BOTH) {
    rc = unshare(qt); /* the direction left alone must not see the other's new scales */
    if (rc) return rc;
  }
  if (dirs & HQ_ROWWISE) {
    if (!update && (rc = make_storages(qt, fr, HQ_ROWWISE))) return rc;
    if ((rc = call_quantize(qt, fr, src, HQ_ROWWISE, &qt->d[0].st, NULL, update))) return rc;
  }
  if (dirs & HQ_COLWISE) {
    hq_tensor csrc = *src;
    void *tmp = NULL;
    if (qt->source == HQ_SOURCE_ROWWISE_DEQUANTIZED) {
      rc = rowwise_source(qt, src, (dirs & HQ_ROWWISE) ? &qt->d[0].st : NULL, &csrc, &tmp);
      if (rc) return rc;
    }
    rc = update ? HQ_OK : make_storages(qt, fc, HQ_COLWISE);
    if (!rc) rc = call_quantize(qt, fc, &csrc, HQ_COLWISE, NULL, &qt->d[1].st, update);
    if (tmp) {
      /* the plugin may still be reading tmp on the stream */
      int s = hq_ctx_sync(qt->ctx);
      if (!rc) rc = s;
      hqi_ctx_free_raw(qt->ctx, tmp);
    }
    if (rc) return rc;
  }
  return HQ_OK;
}

static int check_src(const hq_ctx *ctx, const hq_tensor *src, const char *what) {
  int rc = hqi_check_tensor(src, what);
  if (rc) return rc;
  if (src->device != ctx->device)
    return hqi_error(HQ_EINVAL, "%s: tensor is on device %d but the context runs on %d", what,
                     src->device, ctx->device);
  return HQ_OK;
}

static hq_qtensor *new_qtensor(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols,
                               hq_dtype nominal) {
  hq_qtensor *qt = calloc(1, sizeof *qt);
  if (!qt) return NULL;
  qt->role = hqi_strdup(q->role);
  if (!qt->role) {
    free(qt);
    return NULL;
  }
  qt->ctx = ctx;
  qt->fmt[0] = hqi_format_retain(q->fmt[0]);
  qt->fmt[1] = hqi_format_retain(q->fmt[1]);
  qt->usage = q->usage;
  qt->source = q->source;
  qt->rows = rows;
  qt->cols = cols;
  qt->nominal = nominal;
  return qt;
}

static int prepare(hq_quantizer *q, hq_ctx *ctx, const char *what) {
  if (!q || !ctx) return hqi_error(HQ_EINVAL, "%s: NULL argument", what);
  if (!q->usage)
    return hqi_error(HQ_EINVAL, "%s: role %s has no usage (set rowwise and/or columnwise)", what,
                     q->role);
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    int rc = (q->usage & dir) ? check_device(q->fmt[d], ctx, q->role, dir) : HQ_OK;
    if (!rc && d == 1 && (q->usage & dir) && q->source == HQ_SOURCE_ROWWISE_DEQUANTIZED)
      rc = check_device(q->fmt[0], ctx, q->role, HQ_ROWWISE);
    if (rc) return rc;
  }
  return ctx_ready(ctx);
}

int hq_quantize(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, hq_qtensor **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_quantize: out is NULL");
  *out = NULL;
  int rc = prepare(q, ctx, "hq_quantize");
  if (!rc) rc = check_src(ctx, src, "hq_quantize: source");
  if (rc) return rc;
  hq_qtensor *qt = new_qtensor(q, ctx, src->rows, src->cols, src->dtype);
  if (!qt) return hqi_error(HQ_ENOMEM, "out of memory");
  rc = run(qt, src, q->usage, 0);
  if (rc) {
    hq_qtensor_free(qt);
    return rc;
  }
  *out = qt;
  return HQ_OK;
}

int hq_make_empty(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols, hq_dtype nominal,
                  hq_qtensor **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_make_empty: out is NULL");
  *out = NULL;
  int rc = prepare(q, ctx, "hq_make_empty");
  if (rc) return rc;
  if (rows <= 0 || cols <= 0)
    return hqi_error(HQ_ESHAPE, "hq_make_empty: shape [%lld, %lld] must be positive",
                     (long long)rows, (long long)cols);
  if (nominal != HQ_F32 && nominal != HQ_F16 && nominal != HQ_BF16)
    return hqi_error(HQ_EINVAL, "hq_make_empty: nominal dtype %s is not f32, f16 or bf16",
                     hq_dtype_name(nominal));
  hq_qtensor *qt = new_qtensor(q, ctx, rows, cols, nominal);
  if (!qt) return hqi_error(HQ_ENOMEM, "out of memory");
  if (q->fmt[0] == q->fmt[1] && q->usage == HQ_BOTH) rc = make_storages(qt, q->fmt[0], HQ_BOTH);
  else {
    if (q->usage & HQ_ROWWISE) rc = make_storages(qt, q->fmt[0], HQ_ROWWISE);
    if (!rc && (q->usage & HQ_COLWISE)) rc = make_storages(qt, q->fmt[1], HQ_COLWISE);
  }
  if (rc) {
    hq_qtensor_free(qt);
    return rc;
  }
  *out = qt;
  return HQ_OK;
}

int hq_qtensor_update(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src) {
  if (!qt || !ctx) return hqi_error(HQ_EINVAL, "hq_qtensor_update: NULL argument");
  if (ctx != qt->ctx && ctx->device != qt->ctx->device)
    return hqi_error(HQ_EINVAL, "hq_qtensor_update: context device %d differs from the "
                     "tensor's %d", ctx->device, qt->ctx->device);
  if (qt->saved)
    return hqi_error(HQ_ESTATE, "hq_qtensor_update: role %s is saved (restore it first)",
                     qt->role);
  int rc = check_src(qt->ctx, src, "hq_qtensor_update: source");
  if (rc) return rc;
  if (src->rows != qt->rows || src->cols != qt->cols)
    return hqi_error(HQ_ESHAPE, "hq_qtensor_update: role %s: source [%lld, %lld] does not match "
                     "the quantized tensor's [%lld, %lld]", qt->role, (long long)src->rows,
                     (long long)src->cols, (long long)qt->rows, (long long)qt->cols);
  uint32_t dirs = qt->usage & hq_qtensor_dirs(qt);
  if (!dirs) return HQ_OK;
  if ((rc = ctx_ready(qt->ctx))) return rc;
  return run(qt, src, dirs, 1);
}

int hq_qtensor_set_usage(hq_qtensor *qt, uint32_t dirs) {
  if (!qt) return hqi_error(HQ_EINVAL, "hq_qtensor_set_usage: qt is NULL");
  if (dirs & ~HQ_BOTH) return hqi_error(HQ_EINVAL, "usage 0x%x has unknown bits", dirs);
  qt->usage = dirs;
  return HQ_OK;
}

uint32_t hq_qtensor_usage(const hq_qtensor *qt) { return qt ? qt->usage : 0; }

int hq_qtensor_drop(hq_qtensor *qt, uint32_t dirs) {
  if (!qt) return hqi_error(HQ_EINVAL, "hq_qtensor_drop: qt is NULL");
  if (qt->saved) return hqi_error(HQ_ESTATE, "hq_qtensor_drop: role %s is saved", qt->role);
  if ((dirs & HQ_ROWWISE) && qt->d[0].present && !(dirs & HQ_COLWISE)) {
    int rc = unshare(qt);
    if (rc) return rc;
  }
  if (dirs & HQ_COLWISE) free_dir(qt->ctx, &qt->d[1]);
  if (dirs & HQ_ROWWISE) free_dir(qt->ctx, &qt->d[0]);
  return HQ_OK;
}

int hq_dequantize(const hq_qtensor *qt, hq_ctx *ctx, uint32_t dir, hq_tensor *dst) {
  if (!qt || !ctx) return hqi_error(HQ_EINVAL, "hq_dequantize: NULL argument");
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return hqi_error(HQ_EINVAL, "hq_dequantize: dir must be HQ_ROWWISE or HQ_COLWISE");
  if (ctx->device != qt->ctx->device)
    return hqi_error(HQ_EINVAL, "hq_dequantize: context device %d differs from the tensor's %d",
                     ctx->device, qt->ctx->device);
  if (qt->saved) return hqi_error(HQ_ESTATE, "hq_dequantize: role %s is saved", qt->role);
  if (!qt->d[di(dir)].present)
    return hqi_error(HQ_ENOENT, "hq_dequantize: role %s has no %s representation (not in its "
                     "usage, or dropped)", qt->role, dname(dir));
  int rc = check_src(ctx, dst, "hq_dequantize: destination");
  if (rc) return rc;
  if (dst->rows != qt->rows || dst->cols != qt->cols)
    return hqi_error(HQ_ESHAPE, "hq_dequantize: destination [%lld, %lld] does not match [%lld, "
                     "%lld]", (long long)dst->rows, (long long)dst->cols, (long long)qt->rows,
                     (long long)qt->cols);
  if ((rc = ctx_ready(ctx))) return rc;
  return call_dequantize(qt, dir, &qt->d[di(dir)].st, dst);
}

uint32_t hq_qtensor_dirs(const hq_qtensor *qt) {
  if (!qt) return 0;
  return (qt->d[0].present ? HQ_ROWWISE : 0) | (qt->d[1].present ? HQ_COLWISE : 0);
}
int64_t hq_qtensor_rows(const hq_qtensor *qt) { return qt ? qt->rows : 0; }
int64_t hq_qtensor_cols(const hq_qtensor *qt) { return qt ? qt->cols : 0; }
hq_dtype hq_qtensor_nominal_dtype(const hq_qtensor *qt) {
  return qt ? qt->nominal : HQ_DTYPE_INVALID;
}

const hq_storage *hq_qtensor_storage(const hq_qtensor *qt, uint32_t dir) {
  if (!qt || (dir != HQ_ROWWISE && dir != HQ_COLWISE) || !qt->d[di(dir)].present) return NULL;
  return &qt->d[di(dir)].st;
}

size_t hq_qtensor_bytes(const hq_qtensor *qt, uint32_t dir) {
  if (!qt || (dir != HQ_ROWWISE && dir != HQ_COLWISE)) return 0;
  const qdir *q = &qt->d[di(dir)];
  size_t n = 0;
  if (!q->present) return 0;
  for (uint32_t i = 0; i < q->st.nbuf; i++)
    if (q->owned[i]) n += q->st.buf[i].bytes;
  return n;
}

const char *hq_qtensor_format(const hq_qtensor *qt, uint32_t dir) {
  return qt && (dir == HQ_ROWWISE || dir == HQ_COLWISE) ? qt->fmt[di(dir)]->name : NULL;
}

void hq_qtensor_free(hq_qtensor *qt) {
  if (!qt) return;
  if (!qt->saved) {
    free_dir(qt->ctx, &qt->d[1]);
    free_dir(qt->ctx, &qt->d[0]);
  }
  hqi_format_release(qt->fmt[0]);
  hqi_format_release(qt->fmt[1]);
  free(qt->role);
  free(qt);
}

// --- save / restore ---------------------------------------------------------------------------
/* The saved list: the buffers the rowwise storage owns, in its format's save order (buf[] order
   unless the format defines save()), then those the columnwise storage owns. Shared buffers are
   not listed (they travel with the rowwise storage) and are re-linked on restore. */

static uint32_t owned_count(const qdir *q) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < q->st.nbuf; i++) n += q->owned[i];
  return n;
}

size_t hq_qtensor_saved_count(const hq_qtensor *qt) {
  size_t n = 0;
  if (!qt) return 0;
  for (int d = 0; d < 2; d++)
    if (qt->d[d].present) n += owned_count(&qt->d[d]);
  return n;
}

/* Hand out one storage's owned buffers into out (room for HQ_MAX_BUFFERS). */
static int save_dir(hq_qtensor *qt, int d, void **out, uint32_t *n) {
  qdir *q = &qt->d[d];
  const hqi_format *f = qt->fmt[d];
  *n = 0;
  if (!f->plugin->ops.save) {
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      if (q->owned[i]) out[(*n)++] = q->st.buf[i].ptr;
      q->st.buf[i].ptr = NULL;
    }
    return HQ_OK;
  }
  hq_storage tmp = q->st;
  for (uint32_t i = 0; i < tmp.nbuf; i++)
    if (!q->owned[i]) tmp.buf[i].ptr = NULL;
  hq_clear_error();
  int rc = f->plugin->ops.save(f->cfg, &tmp, out, n);
  if (rc) return hqi_error_prefix(rc, "role %s, %s format '%s': save", qt->role, dname(d + 1u),
                                  f->name);
  /* exactly the owned buffers, each once, and the storage emptied */
  uint32_t want = owned_count(q);
  int ok = *n == want;
  for (uint32_t i = 0; ok && i < q->st.nbuf; i++) {
    if (!q->owned[i]) continue;
    int seen = 0;
    for (uint32_t k = 0; k < *n; k++) seen += out[k] == q->st.buf[i].ptr;
    ok = seen == 1 && tmp.buf[i].ptr == NULL;
  }
  if (!ok)
    return hqi_error(HQ_EABI, "role %s, format '%s' (plugin %s): save() did not hand out exactly "
                     "the %u buffers the storage owns", qt->role, f->name, f->plugin->ops.name,
                     want);
  for (uint32_t i = 0; i < q->st.nbuf; i++) q->st.buf[i].ptr = NULL;
  return HQ_OK;
}

int hq_qtensor_save(hq_qtensor *qt, void **out, size_t cap, size_t *n) {
  if (!qt || !n || (!out && cap)) return hqi_error(HQ_EINVAL, "hq_qtensor_save: NULL argument");
  if (qt->saved) return hqi_error(HQ_ESTATE, "hq_qtensor_save: role %s is already saved", qt->role);
  size_t need = hq_qtensor_saved_count(qt);
  *n = need;
  if (cap < need)
    return hqi_error(HQ_EINVAL, "hq_qtensor_save: role %s needs %zu slots, %zu given", qt->role,
                     need, cap);
  void *list[2][HQ_MAX_BUFFERS];
  uint32_t cnt[2] = {0, 0};
  hq_storage keep[2];
  for (int d = 0; d < 2; d++) keep[d] = qt->d[d].st;
  for (int d = 0; d < 2; d++) {
    if (!qt->d[d].present) continue;
    int rc = save_dir(qt, d, list[d], &cnt[d]);
    if (rc) {
      for (int e = 0; e < 2; e++) qt->d[e].st = keep[e]; /* nothing moved */
      return rc;
    }
  }
  size_t k = 0;
  for (int d = 0; d < 2; d++)
    for (uint32_t i = 0; i < cnt[d]; i++) out[k++] = list[d][i];
  qt->saved = 1;
  return HQ_OK;
}

int hq_qtensor_restore(hq_qtensor *qt, void *const *in, size_t n) {
  if (!qt || (!in && n)) return hqi_error(HQ_EINVAL, "hq_qtensor_restore: NULL argument");
  if (!qt->saved) return hqi_error(HQ_ESTATE, "hq_qtensor_restore: role %s is not saved", qt->role);
  size_t need = hq_qtensor_saved_count(qt);
  if (n != need)
    return hqi_error(HQ_EINVAL, "hq_qtensor_restore: role %s saved %zu buffers, %zu given back",
                     qt->role, need, n);
  for (size_t i = 0; i < n; i++)
    if (!in[i]) return hqi_error(HQ_EINVAL, "hq_qtensor_restore: buffer %zu is NULL", i);
  size_t k = 0;
  for (int d = 0; d < 2; d++) {
    qdir *q = &qt->d[d];
    if (!q->present) continue;
    uint32_t m = owned_count(q);
    const hqi_format *f = qt->fmt[d];
    if (f->plugin->ops.restore) {
      int rc = f->plugin->ops.restore(f->cfg, &q->st, in + k, m);
      if (rc) return hqi_error_prefix(rc, "role %s, format '%s': restore", qt->role, f->name);
      for (uint32_t i = 0; i < q->st.nbuf; i++)
        if (q->owned[i] && !q->st.buf[i].ptr)
          return hqi_error(HQ_EABI, "role %s, format '%s': restore() left buffer '%s' empty",
                           qt->role, f->name, q->st.buf[i].name);
    } else {
      uint32_t j = 0;
      for (uint32_t i = 0; i < q->st.nbuf; i++)
        if (q->owned[i]) q->st.buf[i].ptr = in[k + j++];
    }
    k += m;
  }
  for (uint32_t i = 0; qt->d[1].present && i < qt->d[1].st.nbuf; i++)
    if (!qt->d[1].owned[i])
      qt->d[1].st.buf[i].ptr = qt->d[0].st.buf[qt->d[1].st.buf[i].shared_with].ptr;
  qt->saved = 0;
  return HQ_OK;
}

int hq_qtensor_is_saved(const hq_qtensor *qt) { return qt ? qt->saved : 0; }
