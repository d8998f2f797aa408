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

#include "hq/numerics.h"

struct hq_quantizer {
  hqi_format *fmt[2];     /* [0] ROWWISE, [1] COLWISE; never NULL */
  uint32_t usage;
  int source;
  char *role;             /* "module_type:tensor_type:name", for messages */
  uint64_t role_key;      /* hqi_role_key(role): its random streams' key */
  hq_state *state;        /* bound scaling state (retained), or NULL */
  int32_t slice[2];       /* its slice per direction (the same one for a fused quantizer), -1 */
};

typedef hqi_qdir qdir;

static int di(uint32_t dir) { return dir == HQ_COLWISE ? 1 : 0; }
static const char *dname(uint32_t dir) { return hq_dir_name(dir); }
static uint32_t fmt_amax_kind(const hqi_format *f, uint32_t dir);
#define BUF(st, i) HQ_STORAGE_BUF(st, i)

/* Whether one plugin call makes both directions (a "fused" quantizer or tensor): one format
   instance for both, and the columnwise source is the original tensor -- with
   "rowwise_dequantized" the columnwise call reads the rowwise result, so the calls are two.
   Such directions share one state slice (one scale) and may share buffers. The one definition
   of "fused": every path that decides between one call and two asks it. */
static int fused_call(hqi_format *const fmt[2], int source) {
  return fmt[0] == fmt[1] && source == HQ_SOURCE_ORIGINAL;
}

// --- quantizers -------------------------------------------------------------------------------

int hq_quantizer_create(hq_recipe *r, const hq_role *rolep, hq_quantizer **out) {
  if (!r || !rolep || !out) return hqi_error(HQ_EINVAL, "hq_quantizer_create: NULL argument");
  *out = NULL;
  hq_role rolev;
  const hq_role *role = &rolev;
  int rc0 = hqi_role_in(rolep, "hq_quantizer_create", &rolev);
  if (rc0) return rc0;
  if (hq_recipe_error_count(r))
    return hqi_error(HQ_EPARSE, "recipe %s has errors: %s", hq_recipe_path(r),
                     hq_recipe_error(r, 0));
  hq_quantizer *q = hqi_calloc(1, sizeof *q);
  if (q)
    q->role = hqi_asprintf("%s:%s:%s", role->module_type ? role->module_type : "",
                           role->tensor_type ? role->tensor_type : "", role->name ? role->name : "");
  if (!q || !q->role) {
    hq_quantizer_free(q);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  long idx = hq_recipe_match(r, role);
  const uint32_t policy = hq_recipe_unmatched(r);
  if (idx < 0 && policy == HQ_UNMATCHED_ERROR) {
    hqi_error(HQ_ENOENT, "role %s matches no [role] section of recipe %s (unmatched = error)",
              q->role, hq_recipe_path(r));
    hq_quantizer_free(q);
    return HQ_ENOENT;
  }
  if (idx < 0 && policy == HQ_UNMATCHED_WARN)
    hqi_log(NULL, 1, "role %s matches no [role] section of recipe %s: both directions stay in "
            "high precision (unmatched = warn)", q->role, hq_recipe_path(r));
  q->usage = HQ_BOTH;
  q->slice[0] = q->slice[1] = -1;
  for (int d = 0; d < 2; d++) {
    hqi_format *f = hqi_recipe_format_of(r, idx, d ? HQ_COLWISE : HQ_ROWWISE, &q->source);
    if (!f) {
      hq_quantizer_free(q);
      return hqi_error(HQ_ENOENT, "role %s: its %s direction stays in high precision, but the "
                       "identity plugin is not available (see `hq info`)", q->role,
                       hq_dir_name(d ? HQ_COLWISE : HQ_ROWWISE));
    }
    q->fmt[d] = hqi_format_retain(f);
  }
  q->role_key = hqi_role_key(q->role);
  *out = q;
  return HQ_OK;
}

/* One direction's format of a direct quantizer. */
static int direct_format(hq_plugins *set, const hq_format_spec *specp, const char *dir,
                         hqi_format **out) {
  hq_format_spec spec;
  memset(&spec, 0, sizeof spec);
  if (specp) {
    int rc = hqi_struct_in(&spec, sizeof spec, specp, specp->struct_size,
                           offsetof(hq_format_spec, n_options) + sizeof(size_t), "hq_format_spec");
    if (rc) return rc;
  }
  const char *name = spec.plugin ? spec.plugin : "identity";
  const hq_plugin *p = hq_plugins_find(set, name);
  if (!p)
    return hqi_error(HQ_ENOENT, "hq_quantizer_create_direct: %s plugin '%s' was not found (see "
                     "`hq info`)", dir, name);
  const hq_option *opt = hq_plugin_options(p);
  size_t n = 0;
  while (opt[n].name) n++;
  const char **texts = hqi_calloc(n + 1, sizeof *texts);
  char **keys = hqi_calloc(spec.n_options + 1, sizeof *keys);
  int rc = texts && keys ? HQ_OK : hqi_error(HQ_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < spec.n_options; i++) {
    const char *kv = spec.options ? spec.options[i] : NULL;
    const char *eq = kv ? strchr(kv, '=') : NULL;
    if (!eq) {
      rc = hqi_error(HQ_EPARSE, "hq_quantizer_create_direct: %s option %zu ('%s') is not "
                     "key=value", dir, i, kv ? kv : "(NULL)");
      break;
    }
    keys[i] = hqi_strndup(kv, (size_t)(eq - kv));
    if (!keys[i]) {
      rc = hqi_error(HQ_ENOMEM, "out of memory");
      break;
    }
    size_t j = 0;
    while (j < n && strcmp(opt[j].name, keys[i]) != 0) j++;
    if (j == n)
      rc = hqi_error(HQ_EPARSE, "hq_quantizer_create_direct: %s plugin '%s' has no option '%s' "
                     "(see `hq info`)", dir, name, keys[i]);
    else if (texts[j])
      rc = hqi_error(HQ_EPARSE, "hq_quantizer_create_direct: %s option '%s' given twice", dir,
                     keys[i]);
    else
      texts[j] = eq + 1;
  }
  if (!rc) {
    rc = hqi_format_create(name, p, set, texts, out);
    if (rc) hqi_error_prefix(rc, "hq_quantizer_create_direct: %s format '%s'", dir, name);
  }
  for (size_t i = 0; keys && i < spec.n_options; i++) free(keys[i]);
  free(keys);
  free(texts);
  return rc;
}

static int same_spec(const hq_format_spec *a, const hq_format_spec *b) {
  const char *pa = a && a->plugin ? a->plugin : "identity";
  const char *pb = b && b->plugin ? b->plugin : "identity";
  size_t na = a ? a->n_options : 0, nb = b ? b->n_options : 0;
  if (strcmp(pa, pb) != 0 || na != nb) return 0;
  for (size_t i = 0; i < na; i++)
    if (!a->options[i] || !b->options[i] || strcmp(a->options[i], b->options[i]) != 0) return 0;
  return 1;
}

int hq_quantizer_create_direct(hq_plugins *plugins, const hq_format_spec *rowwise,
                               const hq_format_spec *columnwise, int columnwise_source,
                               hq_quantizer **out) {
  if (!plugins || !out) return hqi_error(HQ_EINVAL, "hq_quantizer_create_direct: NULL argument");
  *out = NULL;
  if (columnwise_source != HQ_SOURCE_ORIGINAL && columnwise_source != HQ_SOURCE_ROWWISE_DEQUANTIZED)
    return hqi_error(HQ_EINVAL, "hq_quantizer_create_direct: columnwise_source %d is not "
                     "HQ_SOURCE_*", columnwise_source);
  hq_quantizer *q = hqi_calloc(1, sizeof *q);
  if (!q) return hqi_error(HQ_ENOMEM, "out of memory");
  q->usage = HQ_BOTH;
  q->source = columnwise_source;
  q->slice[0] = q->slice[1] = -1;
  q->role = hqi_strdup("(direct)");
  int rc = q->role ? direct_format(plugins, rowwise, "rowwise", &q->fmt[0])
                   : hqi_error(HQ_ENOMEM, "out of memory");
  if (!rc && same_spec(rowwise, columnwise)) q->fmt[1] = hqi_format_retain(q->fmt[0]);
  else if (!rc) rc = direct_format(plugins, columnwise, "columnwise", &q->fmt[1]);
  if (rc) {
    hq_quantizer_free(q);
    return rc;
  }
  q->role_key = hqi_role_key(q->role);
  *out = q;
  return HQ_OK;
}

void hq_quantizer_free(hq_quantizer *q) {
  if (!q) return;
  hqi_format_release(q->fmt[0]);
  hqi_format_release(q->fmt[1]);
  hqi_state_release(q->state);
  free(q->role);
  free(q);
}

// --- scaling state ----------------------------------------------------------------------------

int hq_quantizer_create_ex(hq_recipe *r, const hq_role *role, hq_state *st, hq_quantizer **out) {
  int rc = hq_quantizer_create(r, role, out);
  if (rc || !st) return rc;
  rc = hq_quantizer_bind_state(*out, st);
  if (rc) {
    hq_quantizer_free(*out);
    *out = NULL;
  }
  return rc;
}

int hq_quantizer_bind_state(hq_quantizer *q, hq_state *st) {
  if (!q || !st) return hqi_error(HQ_EINVAL, "hq_quantizer_bind_state: NULL argument");
  if (q->state == st) return HQ_OK;
  if (q->state)
    return hqi_error(HQ_ESTATE, "hq_quantizer_bind_state: role %s is already bound to another "
                     "hq_state", q->role);
  const int fused = fused_call(q->fmt, q->source);
  int32_t id[2] = {-1, -1};
  for (int d = 0; d < 2; d++) {
    if (d == 1 && fused) {
      id[1] = id[0];
      break;
    }
    int rc = hqi_state_reserve(st, q->fmt[d], fused ? HQ_BOTH : d ? HQ_COLWISE : HQ_ROWWISE,
                               q->role, &id[d]);
    if (rc) return hqi_error_prefix(rc, "hq_quantizer_bind_state");
  }
  q->state = hqi_state_retain(st);
  q->slice[0] = id[0];
  q->slice[1] = id[1];
  return HQ_OK;
}

int hq_quantizer_state_slice(const hq_quantizer *q, uint32_t dir, hq_state_slice *out) {
  if (!q || !out || (dir != HQ_ROWWISE && dir != HQ_COLWISE))
    return hqi_error(HQ_EINVAL, "hq_quantizer_state_slice: NULL argument or bad direction");
  if (out->struct_size < sizeof(uint32_t))
    return hqi_error(HQ_EINVAL, "hq_quantizer_state_slice: out->struct_size is not set");
  const int32_t id = q->slice[di(dir)];
  if (!q->state || id < 0)
    return hqi_error(HQ_ENOENT, "hq_quantizer_state_slice: role %s keeps no %s state (%s)",
                     q->role, dname(dir), q->state ? "its format is stateless" : "not bound");
  hq_state_slice s;
  memset(&s, 0, sizeof s);
  s.struct_size = (uint32_t)(out->struct_size < sizeof s ? out->struct_size : sizeof s);
  hqi_state_slice_info(q->state, id, &s);
  hqi_elem_put(out, 0, s.struct_size, &s, sizeof s);
  return HQ_OK;
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
int hq_quantizer_fused(const hq_quantizer *q) { return q && fused_call(q->fmt, q->source); }

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
    if (q->owned[i] && BUF(&q->st, i)->ptr) hqi_ctx_free_raw(ctx, BUF(&q->st, i)->ptr);
  memset(q, 0, sizeof *q);
}

/* Buffers have one owner -- the context that made the qtensor, whose allocator and stream
   allocate and free them -- and may be used by a call on another context's stream. Such a call
   waits for the owner's stream after the owner allocates something for it
   (hqi_qtensor_foreign_alloc) and leaves an event behind (hqi_qtensor_mark_use); the owner's
   stream waits for that event before it frees anything (hqi_qtensor_owner_frees), so that the stream-ordered pool never hands out memory another stream
   still reads or writes. (hq_internal.h declares the three for fsdp.c.) */
static int foreign(const hq_qtensor *qt, const hq_ctx *ctx) {
  return ctx->device >= 0 && ctx->stream != qt->ctx->stream;
}
int hqi_qtensor_foreign_alloc(const hq_qtensor *qt, const hq_ctx *ctx) {
  return foreign(qt, ctx) ? hqi_cuda_stream_after(ctx->stream, qt->ctx->stream) : HQ_OK;
}
int hqi_qtensor_mark_use(hq_qtensor *qt, const hq_ctx *ctx) {
  return foreign(qt, ctx) ? hqi_cuda_event_record_use(&qt->last_use, ctx->stream) : HQ_OK;
}
int hqi_qtensor_owner_frees(const hq_qtensor *qt) {
  return qt->last_use ? hqi_cuda_stream_wait_event(qt->ctx->stream, qt->last_use) : HQ_OK;
}

/* A call on qt through ctx: the devices must agree. */
static int same_device(const hq_qtensor *qt, const hq_ctx *ctx, const char *what) {
  if (ctx->device != qt->ctx->device)
    return hqi_error(HQ_EINVAL, "%s: role %s: the context runs on device %d, the tensor lives on "
                     "%d", what, qt->role, ctx->device, qt->ctx->device);
  return HQ_OK;
}

/* An empty storage as layout() receives it. */
static void storage_init(hq_storage *st, uint32_t dir, int64_t rows, int64_t cols, int device,
                         hq_dtype nominal) {
  memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  st->buf_size = sizeof(hq_buffer);
  st->dir = dir;
  st->rows = rows;
  st->cols = cols;
  st->device = device;
  st->nominal = nominal;
  st->desc.struct_size = sizeof st->desc;
  for (int i = 0; i < HQ_MAX_BUFFERS; i++) st->buf[i].struct_size = sizeof(hq_buffer);
}

static size_t scale_dtype_ok(uint32_t mode, hq_dtype t) {
  switch (mode) {
  case HQ_SCALE_TENSOR_F32:
  case HQ_SCALE_OUTER_VEC_F32:
  case HQ_SCALE_VEC128_F32:
  case HQ_SCALE_BLK128X128_F32: return t == HQ_F32;
  case HQ_SCALE_VEC16_UE4M3: return t == HQ_E4M3;
  case HQ_SCALE_VEC32_UE8M0: return t == HQ_E8M0;
  case HQ_SCALE_OTHER: return 1;
  default: return 0;
  }
}

/* Check what layout() described -- buffers, names, descriptor -- and compute byte sizes. `row`
   is the rowwise storage made by the same call, or NULL. A failure is a plugin bug (HQ_EABI). */
static int check_layout(const hqi_format *f, hq_storage *st, const hq_storage *row) {
  const char *pn = f->plugin->ops.name;
  const hq_operand_desc *d = &st->desc;
  const int col = st->dir == HQ_COLWISE;
  int ndata = 0, nscale = 0, namax = 0, nraw = 0;
  if (st->nbuf < 1 || st->nbuf > HQ_MAX_BUFFERS)
    return hqi_error(HQ_EABI, "layout() of '%s' described %u buffers (1 to %d)", pn, st->nbuf,
                     HQ_MAX_BUFFERS);
  for (uint32_t i = 0; i < st->nbuf; i++) {
    hq_buffer *b = BUF(st, i);
    if (!b->name || !b->name[0] || !hq_dtype_size(b->dtype) || b->ndim < 1 ||
        b->ndim > HQ_MAX_BUFFER_DIMS)
      return hqi_error(HQ_EABI, "layout() of '%s' described an invalid buffer %u (name, dtype or "
                       "ndim)", pn, i);
    if (!hqi_shape_bytes(b->dtype, b->ndim, b->shape, &b->bytes))
      return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' has an invalid shape", pn,
                       b->name);
    b->ptr = NULL;
    int shared = (b->flags & HQ_BUF_SHARED) != 0;
    int prefixed = strncmp(b->name, "columnwise_", 11) == 0;
    if (shared && !col)
      return hqi_error(HQ_EABI, "layout() of '%s': rowwise buffer '%s' is marked shared", pn,
                       b->name);
    if (shared && row) {
      if (b->shared_with < 0 || (uint32_t)b->shared_with >= row->nbuf ||
          HQ_STORAGE_BUF(row, b->shared_with)->bytes != b->bytes)
        return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' is shared with a rowwise buffer "
                         "that does not exist or differs in size", pn, b->name);
      if (strcmp(HQ_STORAGE_BUF(row, b->shared_with)->name, b->name) != 0)
        return hqi_error(HQ_EABI, "layout() of '%s': shared columnwise buffer '%s' must keep the "
                         "name of the rowwise buffer it is ('%s')", pn, b->name,
                         HQ_STORAGE_BUF(row, b->shared_with)->name);
    } else if (col && !prefixed) {
      return hqi_error(HQ_EABI, "layout() of '%s': columnwise buffer '%s' must be named "
                       "'columnwise_%s' (a columnwise storage's own buffers carry that prefix)",
                       pn, b->name, b->name);
    } else if (!col && prefixed) {
      return hqi_error(HQ_EABI, "layout() of '%s': rowwise buffer '%s' must not carry the "
                       "'columnwise_' prefix", pn, b->name);
    }
    for (uint32_t k = 0; k < i; k++)
      if (strcmp(BUF(st, k)->name, b->name) == 0)
        return hqi_error(HQ_EABI, "layout() of '%s': two buffers are named '%s'", pn, b->name);
    if (b->role > HQ_ROLE_RAW)
      return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' has an unknown role %u", pn,
                       b->name, b->role);
    ndata += b->role == HQ_ROLE_DATA;
    nscale += b->role == HQ_ROLE_SCALE;
    namax += b->role == HQ_ROLE_AMAX;
    nraw += b->role == HQ_ROLE_RAW;
    if (b->role == HQ_ROLE_RAW &&
        ((b->dtype != HQ_BF16 && b->dtype != HQ_F32) || b->ndim != 2 ||
         b->shape[0] != st->rows || b->shape[1] != st->cols || (b->flags & HQ_BUF_SHARED)))
      return hqi_error(HQ_EABI, "layout() of '%s': raw-values buffer '%s' must be bf16 or f32 "
                       "[%lld, %lld] (the tensor's rows and columns), not shared", pn, b->name,
                       (long long)st->rows, (long long)st->cols);
    if (b->gather > HQ_GATHER_SAME || (b->gather == HQ_GATHER_COLS && b->ndim != 2) ||
        ((b->gather == HQ_GATHER_ROWS || b->gather == HQ_GATHER_COLS) &&
         (b->m_div < 1 || (d->shard_rows > 0 && d->shard_rows % b->m_div))))
      return hqi_error(HQ_EABI, "layout() of '%s': buffer '%s' has an invalid gather rule (rule "
                       "%u, m_div %d, ndim %d, shard_rows %lld)", pn, b->name, b->gather,
                       b->m_div, b->ndim, (long long)d->shard_rows);
    if (b->role == HQ_ROLE_DATA) {
      const int64_t M = st->rows, K = st->cols;
      int64_t d0 = d->order == HQ_ORDER_KM ? K : M, d1 = d->order == HQ_ORDER_KM ? M : K;
      if (b->dtype == HQ_E2M1X2 || b->dtype == HQ_I4X2) d1 = d1 % 2 ? -1 : d1 / 2;
      if (b->dtype == HQ_E3M2X4 || b->dtype == HQ_E2M3X4) d1 = d1 % 4 ? -1 : d1 / 4 * 3;
      if (b->dtype != d->elem || b->ndim != 2 || b->shape[0] != d0 || b->shape[1] != d1)
        return hqi_error(HQ_EABI, "layout() of '%s': data buffer '%s' (%s [%lld, %lld]) does not "
                         "match the descriptor (elem %s, order %s of [%lld, %lld])", pn, b->name,
                         hq_dtype_name(b->dtype), (long long)b->shape[0],
                         (long long)(b->ndim > 1 ? b->shape[1] : 0), hq_dtype_name(d->elem),
                         d->order == HQ_ORDER_KM ? "KM" : "MK", (long long)M, (long long)K);
    }
    if (b->role == HQ_ROLE_SCALE) {
      if (!scale_dtype_ok(d->scale_mode, b->dtype))
        return hqi_error(HQ_EABI, "layout() of '%s': scale buffer '%s' of dtype %s does not fit "
                         "scale mode %u", pn, b->name, hq_dtype_name(b->dtype), d->scale_mode);
      if (d->scale_layout == HQ_SCALE_LAYOUT_SWIZZLED && b->gather != HQ_GATHER_NEVER)
        return hqi_error(HQ_EABI, "layout() of '%s': swizzled scale buffer '%s' cannot be "
                         "gathered by rows or columns (use HQ_GATHER_NEVER)", pn, b->name);
    }
    if (b->role == HQ_ROLE_AMAX && (b->dtype != HQ_F32 || b->bytes != sizeof(float)))
      return hqi_error(HQ_EABI, "layout() of '%s': amax buffer '%s' must be f32 [1]", pn,
                       b->name);
  }
  if (d->order > HQ_ORDER_KM || d->transform > HQ_TRANSFORM_RHT16 ||
      d->scale_layout > HQ_SCALE_LAYOUT_SWIZZLED ||
      (d->scale_mode > HQ_SCALE_BLK128X128_F32 && d->scale_mode != HQ_SCALE_OTHER) ||
      d->block_m < 0 || d->block_k < 0 || d->shard_rows < 0)
    return hqi_error(HQ_EABI, "layout() of '%s': the operand descriptor has an out-of-range "
                     "field (order %u, scale mode %u, scale layout %u, transform %u, block "
                     "%dx%d, shard_rows %lld)", pn, d->order, d->scale_mode, d->scale_layout,
                     d->transform, d->block_m, d->block_k, (long long)d->shard_rows);
  if (ndata != 1)
    return hqi_error(HQ_EABI, "layout() of '%s': %d buffers have the data role (exactly one "
                     "must)", pn, ndata);
  if (nraw > 1)
    return hqi_error(HQ_EABI, "layout() of '%s': %d buffers have the raw-values role (at most "
                     "one may)", pn, nraw);
  if ((d->scale_mode == HQ_SCALE_NONE) != (nscale == 0) || nscale > 1)
    return hqi_error(HQ_EABI, "layout() of '%s': scale mode %u with %d scale buffers", pn,
                     d->scale_mode, nscale);
  if (d->scale_mode == HQ_SCALE_VEC16_UE4M3 && namax != 1)
    return hqi_error(HQ_EABI, "layout() of '%s': VEC16_UE4M3 scales need one amax buffer (the "
                     "global scale)", pn);
  st->desc.struct_size = sizeof st->desc;
  return HQ_OK;
}

static int call_prefix(int rc, const hq_qtensor *qt, const hqi_format *f, uint32_t dirs,
                       const char *what) {
  return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), %s", qt->role,
                          dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs), f->name,
                          f->plugin->ops.name, what);
}

/* Describe and allocate the storages of `dirs` made by one call of format f. */
static int make_storages(hq_qtensor *qt, hqi_format *f, uint32_t dirs) {
  hq_ctx *ctx = qt->ctx;
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    if (!(dirs & dir)) continue;
    qdir *q = &qt->d[d];
    memset(q, 0, sizeof *q);
    storage_init(&q->st, dir, qt->rows, qt->cols, ctx->device, qt->nominal);
    hq_clear_error();
    int rc = hqi_plugin_rc(
        f->plugin->ops.layout(f->cfg, &hqi_host_api, qt->rows, qt->cols, dir, dirs, &q->st),
        f->plugin->ops.name, "layout");
    if (!rc) rc = check_layout(f, &q->st, (dirs & HQ_ROWWISE) && d ? &qt->d[0].st : NULL);
    if (rc) {
      memset(q, 0, sizeof *q);
      return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), shape [%lld, %lld]",
                              qt->role, dname(dir), f->name, f->plugin->ops.name,
                              (long long)qt->rows, (long long)qt->cols);
    }
    q->present = 1;
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      hq_buffer *b = BUF(&q->st, i);
      if ((b->flags & HQ_BUF_SHARED) && d == 1 && (dirs & HQ_ROWWISE)) {
        b->ptr = BUF(&qt->d[0].st, b->shared_with)->ptr;
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
      hqi_call_init(ctx, &call, 0, qt->offset);
      hq_clear_error();
      rc = hqi_plugin_rc(f->plugin->ops.make_empty(f->cfg, &call, &q->st), f->plugin->ops.name,
                         "make_empty");
      if (rc) return call_prefix(rc, qt, f, dir, "make_empty");
    }
  }
  return HQ_OK;
}

/* HQ_QUANTIZE_ALIAS: the storages of `dirs` (every direction qt makes) laid out by format f with
   the source itself as their data, when f is the identity format and each storage is exactly
   the source (one buffer of its dtype and shape); qt->aliased then says which. 0 when they
   are, HQ_ENOTSUP (no message, nothing kept) when not: the caller copies instead. */
static int alias_storages(hq_qtensor *qt, hqi_format *f, uint32_t dirs, const hq_tensor *src) {
  if (strcmp(f->plugin->ops.name, "identity") != 0 || f->plugin->ops.make_empty)
    return HQ_ENOTSUP;
  const size_t bytes = (size_t)src->rows * (size_t)src->cols * hq_dtype_size(src->dtype);
  for (int d = 0; d < 2; d++) {
    const uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    if (!(dirs & dir)) continue;
    qdir *q = &qt->d[d];
    memset(q, 0, sizeof *q);
    storage_init(&q->st, dir, qt->rows, qt->cols, qt->ctx->device, qt->nominal);
    int rc = f->plugin->ops.layout(f->cfg, &hqi_host_api, qt->rows, qt->cols, dir, dirs, &q->st);
    if (!rc) rc = check_layout(f, &q->st, (dirs & HQ_ROWWISE) && d ? &qt->d[0].st : NULL);
    hq_buffer *b = BUF(&q->st, 0);
    if (rc || q->st.nbuf != 1 || b->dtype != src->dtype || b->bytes != bytes) {
      hq_clear_error();
      memset(&qt->d[0], 0, sizeof qt->d[0]);
      memset(&qt->d[1], 0, sizeof qt->d[1]);
      return HQ_ENOTSUP;
    }
    q->present = 1;
    b->ptr = (b->flags & HQ_BUF_SHARED) && d == 1 && (dirs & HQ_ROWWISE)
                 ? BUF(&qt->d[0].st, b->shared_with)->ptr
                 : src->data;   /* borrowed: owned[0] stays 0, so nothing frees it */
  }
  qt->aliased = dirs;
  return HQ_OK;
}

/* Refuse a call that would write, move or keep the bytes of an aliased qtensor. */
static int not_aliased(const hq_qtensor *qt, const char *what) {
  if (!qt->aliased) return HQ_OK;
  return hqi_error(HQ_ESTATE, "%s: role %s borrows its source's memory (made with "
                   "HQ_QUANTIZE_ALIAS): quantize the new source instead", what, qt->role);
}

/* Reserve the plugin scratch every quantize/update of qt will need (owner's memory). */
static int reserve_scratch(hq_qtensor *qt) {
  size_t need = 0;
  const int64_t M = qt->rows, K = qt->cols;
  const int dev = qt->ctx->device;
#define SCRATCH(f, dirs)                                                                      \
  ((f)->plugin->ops.scratch_size ? (f)->plugin->ops.scratch_size((f)->cfg, M, K, dirs, dev) : 0)
  if (fused_call(qt->fmt, qt->source)) {
    size_t s = SCRATCH(qt->fmt[0], HQ_BOTH);
    need = s > need ? s : need;
  }
  for (int d = 0; d < 2; d++) {
    size_t s = SCRATCH(qt->fmt[d], d ? HQ_COLWISE : HQ_ROWWISE);
    need = s > need ? s : need;
  }
#undef SCRATCH
  if (need <= qt->scratch_bytes) return HQ_OK;
  void *p = hqi_ctx_alloc_raw(qt->ctx, need);
  if (!p)
    return hqi_error(HQ_ENOMEM, "role %s: %zu bytes of plugin scratch on device %d failed",
                     qt->role, need, dev);
  if (qt->scratch) hqi_ctx_free_raw(qt->ctx, qt->scratch);
  qt->scratch = p;
  qt->scratch_bytes = need;
  return HQ_OK;
}

/* Give the columnwise storage private copies of the buffers it shares with the rowwise one:
   every allocation first, so that a failure leaves every buffer shared (hq_qtensor_unshare's
   all-or-none). */
static int unshare(hq_qtensor *qt, hq_ctx *ctx) {
  qdir *c = &qt->d[1];
  void *p[HQ_MAX_BUFFERS] = {0};
  if (!c->present) return HQ_OK;
  for (uint32_t i = 0; i < c->st.nbuf; i++) {
    hq_buffer *b = BUF(&c->st, i);
    if (c->owned[i] || !b->ptr) continue;
    p[i] = hqi_ctx_alloc_raw(qt->ctx, b->bytes ? b->bytes : 1);
    if (!p[i]) {
      for (uint32_t j = 0; j < i; j++) hqi_ctx_free_raw(qt->ctx, p[j]);
      return hqi_error(HQ_ENOMEM, "role %s: copying shared buffer '%s' failed", qt->role,
                       b->name);
    }
  }
  int rc = hqi_qtensor_foreign_alloc(qt, ctx); /* the copies are made on ctx's stream */
  for (uint32_t i = 0; i < c->st.nbuf; i++) {
    hq_buffer *b = BUF(&c->st, i);
    if (!p[i]) continue;
    if (!rc) rc = hq_ctx_memcpy(ctx, p[i], ctx->device, b->ptr, ctx->device, b->bytes);
    if (rc) { /* the copies not linked yet go; the linked ones are whole */
      hqi_ctx_free_raw(qt->ctx, p[i]);
      continue;
    }
    b->ptr = p[i];
    c->owned[i] = 1;
    /* a private copy is the columnwise storage's own buffer: it takes the columnwise name */
    snprintf(c->own_name[i], sizeof c->own_name[i], "columnwise_%s", b->name);
    b->name = c->own_name[i];
  }
  return rc;
}

int hq_qtensor_unshare(hq_qtensor *qt, hq_ctx *ctx) {
  if (!qt || !ctx) return hqi_error(HQ_EINVAL, "hq_qtensor_unshare: NULL argument");
  int rc = same_device(qt, ctx, "hq_qtensor_unshare");
  if (rc) return rc;
  if (qt->saved)
    return hqi_error(HQ_ESTATE, "hq_qtensor_unshare: role %s is saved (restore it first)",
                     qt->role);
  int saved;
  rc = hqi_device_enter(ctx->device, &saved);
  if (rc) return rc;
  rc = unshare(qt, ctx);
  hqi_device_leave(saved);
  return rc;
}

/* Point the columnwise storage's shared buffers back at the rowwise ones (fused calls); the
   private copies are freed on the owner's stream once their last user is done with them. */
static int reshare(hq_qtensor *qt) {
  qdir *c = &qt->d[1], *r = &qt->d[0];
  if (!c->present || !r->present) return HQ_OK;
  int waited = 0;
  for (uint32_t i = 0; i < c->st.nbuf; i++) {
    hq_buffer *b = BUF(&c->st, i);
    if (!(b->flags & HQ_BUF_SHARED) || !c->owned[i]) continue;
    if (!waited++) { /* one wait orders every free after the last user */
      int rc = hqi_qtensor_owner_frees(qt);
      if (rc) return rc;
    }
    hqi_ctx_free_raw(qt->ctx, b->ptr);
    b->ptr = BUF(&r->st, b->shared_with)->ptr;
    b->name = BUF(&r->st, b->shared_with)->name;
    c->owned[i] = 0;
  }
  return HQ_OK;
}

/* The slice of a stateful format for a call making `dirs` of qt: call->state, state_amax. */
static int call_state(hq_qtensor *qt, hq_ctx *ctx, hqi_format *f, uint32_t dirs, hq_call *call) {
  const int fused = fused_call(qt->fmt, qt->source);
  const uint32_t sdirs = fused ? HQ_BOTH : dirs;
  if (!hqi_format_state_floats(f, sdirs)) return HQ_OK;
  const int32_t id = qt->slice[dirs == HQ_COLWISE ? 1 : 0];
  if (!qt->state || id < 0)
    return hqi_error(HQ_ESTATE, "role %s, %s format '%s' (plugin %s) keeps state across steps "
                     "(delayed scaling), but the quantizer is bound to no hq_state: create it "
                     "with hq_quantizer_create_ex or bind it with hq_quantizer_bind_state",
                     qt->role, dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs), f->name,
                     f->plugin->ops.name);
  int rc = hqi_state_slice_ptrs(qt->state, ctx, id, &call->state, &call->state_amax);
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s)", qt->role,
                            dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs), f->name,
                            f->plugin->ops.name);
  return HQ_OK;
}

/* Under a CUDA graph capture, the random stream of a quantize/update comes from the context's
   step on the device (call->offset_dev, ABI 2.6), which hq_ctx_set_rng_offset rewrites before
   each replay: a module with HQ_CAP_RNG_DEV gets it; one without it that draws random numbers
   (not requant-safe and no scaling state, the trainer's test too: stochastic rounding) is
   refused, since the offset baked into the graph would repeat its noise at every replay. A
   requant-safe instance draws nothing, and the eager path asks the stream nothing. */
static int capture_rng(const hq_qtensor *qt, hq_ctx *ctx, const hqi_format *f, uint32_t dirs,
                       hq_call *call) {
  if (ctx->device < 0 || (f->caps & HQ_CAP_REQUANT_SAFE)) return HQ_OK;
  const int rng_dev = (f->caps & HQ_CAP_RNG_DEV) != 0;
  const int fused = fused_call(qt->fmt, qt->source);
  if (!rng_dev && hqi_format_state_floats(f, fused ? HQ_BOTH : dirs)) return HQ_OK;
  if (!hqi_cuda_capturing(ctx->stream)) return HQ_OK;
  const char *dn = dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs);
  if (!rng_dev)
    return hqi_error(HQ_ESTATE, "role %s, %s format '%s' (plugin %s) draws random numbers "
                     "(stochastic rounding) from an offset the host sets, which every replay of "
                     "a CUDA graph would repeat, and does not declare HQ_CAP_RNG_DEV (ABI 2.6): "
                     "quantize it outside the capture", qt->role, dn, f->name,
                     f->plugin->ops.name);
  if (!ctx->offset_dev)
    return hqi_error(HQ_ESTATE, "role %s, %s format '%s' (plugin %s): a quantization captured "
                     "into a CUDA graph draws its random stream from the context's step on the "
                     "device, which hq_ctx_set_rng_offset sets: call it before the capture",
                     qt->role, dn, f->name, f->plugin->ops.name);
  call->offset_dev = ctx->offset_dev;
  return HQ_OK;
}

/* One plugin quantize/update call on ctx (the call's context: stream; scratch is qt's); adam: the
   fused optimizer step of hq_adam_step (an update only), else NULL; copy: the other direction's
   plain-copy buffer the call writes besides its own (HQ_CAP_COPY_OUT), else NULL. */
static int call_quantize_copy(hq_qtensor *qt, hq_ctx *ctx, hqi_format *f, const hq_tensor *src,
                              uint32_t dirs, hq_storage *row, hq_storage *col, int update,
                              const float *amax, const hq_adam_pass *adam, hq_buffer *copy) {
  hq_call call;
  hqi_call_init(ctx, &call, update ? HQ_CALL_UPDATE : 0, qt->offset);
  if (copy) {
    call.copy_out = copy->ptr;
    call.copy_dtype = copy->dtype;
  }
  call.scratch = qt->scratch;
  call.scratch_bytes = qt->scratch_bytes;
  call.amax = amax;
  call.adam = adam;
  call.role_key = qt->role_key;
  call.role_count = qt->role_count;
  const hq_format_ops *ops = &f->plugin->ops;
  if (dirs == HQ_COLWISE && !(f->caps & HQ_CAP_COLWISE_ONLY))
    return hqi_error(HQ_ENOTSUP, "role %s, columnwise format '%s' (plugin %s) cannot make a "
                     "columnwise storage without a rowwise one", qt->role, f->name, ops->name);
  int rc = call_state(qt, ctx, f, dirs, &call);
  if (rc) return rc;
  if ((rc = capture_rng(qt, ctx, f, dirs, &call))) return rc;
  hq_clear_error();
  const hqi_fpenv fe = hqi_fp_enter();
  rc = update && ops->update ? ops->update(f->cfg, &call, src, dirs, row, col)
                             : ops->quantize(f->cfg, &call, src, dirs, row, col);
  hqi_fp_leave(fe);
  rc = hqi_plugin_rc(rc, ops->name, update && ops->update ? "update" : "quantize");
  if (rc)
    return hqi_error_prefix(rc, "role %s, %s format '%s' (plugin %s), %s of [%lld, %lld] %s%s",
                            qt->role, dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs),
                            f->name, ops->name, update ? "update" : "quantize",
                            (long long)src->rows, (long long)src->cols, hq_dtype_name(src->dtype),
                            copy ? " with the columnwise copy" : "");
  return HQ_OK;
}

static int call_quantize(hq_qtensor *qt, hq_ctx *ctx, hqi_format *f, const hq_tensor *src,
                         uint32_t dirs, hq_storage *row, hq_storage *col, int update,
                         const float *amax, const hq_adam_pass *adam) {
  return call_quantize_copy(qt, ctx, f, src, dirs, row, col, update, amax, adam, NULL);
}

/* Whether the rowwise call may write the columnwise storage too: that storage is a plain copy
   (HQ_CAP_PLAIN_COPY, e.g. identity) of an F32 original, which the rowwise module can store from
   its own read (HQ_CAP_COPY_OUT), so the source is read once for both directions. */
static int copy_beside_ok(const hq_qtensor *qt, const hq_tensor *src, uint32_t dirs,
                          const hq_adam_pass *adam) {
  return dirs == HQ_BOTH && !adam && qt->source == HQ_SOURCE_ORIGINAL && src->dtype == HQ_F32 &&
         (qt->fmt[0]->caps & HQ_CAP_COPY_OUT) && (qt->fmt[1]->caps & HQ_CAP_PLAIN_COPY);
}

/* The columnwise storage's one buffer when it is what copy_out writes (BF16 or F16, [rows,
   cols], its own memory), else NULL: the columnwise call makes it. */
static hq_buffer *plain_copy(hq_qtensor *qt) {
  qdir *c = &qt->d[1];
  if (!c->present || c->st.nbuf != 1) return NULL;
  hq_buffer *b = BUF(&c->st, 0);
  const size_t n = (size_t)qt->rows * (size_t)qt->cols;
  if ((b->dtype != HQ_BF16 && b->dtype != HQ_F16) || (b->flags & HQ_BUF_SHARED) ||
      b->bytes != n * 2 || (n && !b->ptr))
    return NULL;
  return b;
}

static int call_dequantize(const hq_qtensor *qt, hq_ctx *ctx, uint32_t dir, const hq_storage *st,
                           hq_tensor *dst) {
  hqi_format *f = qt->fmt[di(dir)];
  hq_call call;
  hqi_call_init(ctx, &call, 0, qt->offset);
  hq_clear_error();
  const hqi_fpenv fe = hqi_fp_enter();
  int rc = f->plugin->ops.dequantize(f->cfg, &call, st, dst);
  hqi_fp_leave(fe);
  rc = hqi_plugin_rc(rc, f->plugin->ops.name, "dequantize");
  if (rc) return call_prefix(rc, qt, f, dir, "dequantize");
  return HQ_OK;
}

/* Columnwise input for the "rowwise_dequantized" source: dequantize a rowwise storage (the
   tensor's own if `row` is given, else a transient quantization) into a temporary of src's
   dtype, allocated from ctx. *tmp receives the temporary (free with hqi_ctx_free_raw(ctx)). */
static int rowwise_source(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src,
                          const hq_storage *row, const float *amax, hq_tensor *out, void **tmp) {
  hq_qtensor t;
  int rc = HQ_OK;
  memset(&t, 0, sizeof t);
  *tmp = NULL;
  if (!row) {
    t.ctx = ctx;
    t.fmt[0] = t.fmt[1] = qt->fmt[0];
    t.source = qt->source; /* not a fused call: the rowwise slice, not a shared one */
    t.state = qt->state;
    t.slice[0] = qt->slice[0];
    t.slice[1] = -1;
    t.role = qt->role;
    t.rows = qt->rows;
    t.cols = qt->cols;
    t.nominal = src->dtype;
    t.offset = qt->offset;
    t.role_count = qt->role_count;
    t.role_key = qt->role_key;
    t.scratch = qt->scratch;
    t.scratch_bytes = qt->scratch_bytes;
    rc = make_storages(&t, qt->fmt[0], HQ_ROWWISE);
    if (!rc)
      rc = call_quantize(&t, ctx, qt->fmt[0], src, HQ_ROWWISE, &t.d[0].st, NULL, 0, amax, NULL);
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
    rc = call_dequantize(qt, ctx, HQ_ROWWISE, row, out);
  }
  free_dir(ctx, &t.d[0]); /* stream-ordered: the frees follow the work that reads them */
  if (rc && *tmp) {
    hqi_ctx_free_raw(ctx, *tmp);
    *tmp = NULL;
  }
  return rc;
}

/* run() without the bookkeeping of another context's stream. */
static int run_dirs(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src, uint32_t dirs, int update,
                    const float *amax, const hq_adam_pass *adam) {
  hqi_format *fr = qt->fmt[0], *fc = qt->fmt[1];
  int rc = hqi_ctx_rng_next(ctx, qt->role_key, &qt->offset, &qt->role_count);
  if (rc) return rc;
  if (!update && (rc = reserve_scratch(qt))) return rc;
  if (dirs == HQ_BOTH && fused_call(qt->fmt, qt->source)) {
    if (!update) rc = make_storages(qt, fr, HQ_BOTH);
    else
      rc = reshare(qt);
    return rc ? rc
              : call_quantize(qt, ctx, fr, src, HQ_BOTH, &qt->d[0].st, &qt->d[1].st, update,
                              amax, adam);
  }
  if (update && dirs != HQ_BOTH) {
    rc = unshare(qt, ctx); /* the direction left alone must not see the other's new scales */
    if (rc) return rc;
  }
  const int beside = copy_beside_ok(qt, src, dirs, adam);
  if (dirs & HQ_ROWWISE) {
    if (!update && (rc = make_storages(qt, fr, HQ_ROWWISE))) return rc;
    if (beside && !update && (rc = make_storages(qt, fc, HQ_COLWISE))) return rc;
    hq_buffer *copy = beside ? plain_copy(qt) : NULL;
    rc = call_quantize_copy(qt, ctx, fr, src, HQ_ROWWISE, &qt->d[0].st, NULL, update, amax, adam,
                            copy);
    if (rc) return rc;
    if (copy) {
      hqi_log(ctx, 3, "role %s: the columnwise %s copy (format '%s') written by the rowwise "
              "call (format '%s', plugin %s)", qt->role, hq_dtype_name(copy->dtype), fc->name,
              fr->name, fr->plugin->ops.name);
      return HQ_OK;
    }
  }
  if (dirs & HQ_COLWISE) {
    hq_tensor csrc = *src;
    void *tmp = NULL;
    if (qt->source == HQ_SOURCE_ROWWISE_DEQUANTIZED) {
      rc = rowwise_source(qt, ctx, src, (dirs & HQ_ROWWISE) ? &qt->d[0].st : NULL, amax, &csrc,
                          &tmp);
      if (rc) return rc;
    }
    rc = update || beside ? HQ_OK : make_storages(qt, fc, HQ_COLWISE);
    if (!rc)
      rc = call_quantize(qt, ctx, fc, &csrc, HQ_COLWISE, NULL, &qt->d[1].st, update, amax, adam);
    if (tmp) hqi_ctx_free_raw(ctx, tmp); /* stream-ordered free: no synchronization */
    if (rc) return rc;
  }
  return HQ_OK;
}

/* Quantize (update = 0) or refresh (update = 1) the directions `dirs` of qt from src, on ctx.
   For a fresh quantize the storages are made here; for an update they exist. adam (an update
   whose directions one call makes: hqi_qtensor_update_adam) rides on that call. */
static int run(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src, uint32_t dirs, int update,
               const float *amax, const hq_adam_pass *adam) {
  int rc = run_dirs(qt, ctx, src, dirs, update, amax, adam);
  const int mk = hqi_qtensor_mark_use(qt, ctx); /* also after a failure: work may have been queued */
  return rc ? rc : mk;
}

static int check_src(const hq_ctx *ctx, const hq_tensor *src, const char *what, hq_tensor *out) {
  int rc = hqi_tensor_in(src, what, out);
  if (rc) return rc;
  if (out->device != ctx->device)
    return hqi_error(HQ_EINVAL, "%s: tensor is on device %d but the context runs on %d", what,
                     out->device, ctx->device);
  return HQ_OK;
}

static hq_qtensor *new_qtensor(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols,
                               hq_dtype nominal) {
  hq_qtensor *qt = hqi_calloc(1, sizeof *qt);
  if (!qt) return NULL;
  qt->role = hqi_strdup(q->role);
  if (!qt->role) {
    free(qt);
    return NULL;
  }
  qt->ctx = hqi_ctx_retain(ctx);
  qt->role_key = q->role_key;
  qt->fmt[0] = hqi_format_retain(q->fmt[0]);
  qt->fmt[1] = hqi_format_retain(q->fmt[1]);
  qt->usage = q->usage;
  qt->source = q->source;
  qt->state = hqi_state_retain(q->state);
  qt->slice[0] = q->slice[0];
  qt->slice[1] = q->slice[1];
  qt->rows = rows;
  qt->cols = cols;
  qt->nominal = nominal;
  return qt;
}

/* Directions given to a call: no bits beyond rowwise and columnwise. */
static int known_dirs(uint32_t dirs, const char *what) {
  if (dirs & ~HQ_BOTH)
    return hqi_error(HQ_EINVAL, "%s: directions 0x%x have unknown bits", what, dirs);
  return HQ_OK;
}

/* Check that q can make `dirs` on ctx's device. */
static int prepare(const hq_quantizer *q, hq_ctx *ctx, uint32_t dirs, const char *what) {
  if (!q || !ctx) return hqi_error(HQ_EINVAL, "%s: NULL argument", what);
  int rc = known_dirs(dirs, what);
  if (rc) return rc;
  if (!dirs)
    return hqi_error(HQ_EINVAL, "%s: role %s has no usage (set rowwise and/or columnwise)", what,
                     q->role);
  for (int d = 0; d < 2; d++) {
    uint32_t dir = d ? HQ_COLWISE : HQ_ROWWISE;
    rc = (dirs & dir) ? check_device(q->fmt[d], ctx, q->role, dir) : HQ_OK;
    if (!rc && d == 1 && (dirs & dir) && q->source == HQ_SOURCE_ROWWISE_DEQUANTIZED)
      rc = check_device(q->fmt[0], ctx, q->role, HQ_ROWWISE);
    if (rc) return rc;
  }
  return HQ_OK;
}

int hq_tensor_nonfinite(hq_ctx *ctx, const hq_tensor *tp, int64_t *count, int64_t *first) {
  if (!ctx || !count || !first) return hqi_error(HQ_EINVAL, "hq_tensor_nonfinite: NULL argument");
  hq_tensor t;
  int rc = hqi_tensor_in(tp, "hq_tensor_nonfinite", &t);
  if (rc) return rc;
  if (t.device != ctx->device)
    return hqi_error(HQ_EINVAL, "hq_tensor_nonfinite: the tensor is on device %d, the context "
                     "runs on %d", t.device, ctx->device);
  const int64_t n = t.rows * t.cols;
  *count = 0;
  *first = -1;
  if (ctx->device < 0) {
    for (int64_t i = 0; i < n; i++) {
      float v = hq_load_hp(t.data, i, t.dtype);
      if (!(v - v == 0.0f)) {
        if (*first < 0) *first = i;
        ++*count;
      }
    }
    return HQ_OK;
  }
  unsigned long long host[2] = {0, ~0ull};
  unsigned long long *dev = hqi_ctx_alloc_raw(ctx, sizeof host);
  if (!dev) return hqi_error(HQ_ENOMEM, "hq_tensor_nonfinite: 16 bytes on device %d", ctx->device);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) {
    hqi_ctx_free_raw(ctx, dev);
    return rc;
  }
  rc = hq_ctx_memcpy(ctx, dev, ctx->device, host, HQ_DEVICE_HOST, sizeof host);
  if (!rc) rc = hqi_cuda_nonfinite(ctx->stream, t.data, t.dtype, n, dev);
  if (!rc) rc = hq_ctx_memcpy(ctx, host, HQ_DEVICE_HOST, dev, ctx->device, sizeof host);
  if (!rc) rc = hq_ctx_sync(ctx);
  hqi_ctx_free_raw(ctx, dev);
  hqi_device_leave(saved);
  if (rc) return rc;
  *count = (int64_t)host[0];
  *first = host[0] ? (int64_t)host[1] : -1;
  return HQ_OK;
}

/* HQ_QUANTIZE_FINITE_ONLY: refuse a source with NaN or Inf before anything is written. */
static int finite_only(hq_ctx *ctx, const hq_tensor *src, const char *what) {
  int64_t count, first;
  int rc = hq_tensor_nonfinite(ctx, src, &count, &first);
  if (rc) return rc;
  if (count)
    return hqi_error(HQ_EINVAL, "%s: the source holds %lld NaN/Inf value%s, the first at [%lld, "
                     "%lld] (HQ_QUANTIZE_FINITE_ONLY)", what, (long long)count,
                     count == 1 ? "" : "s", (long long)(first / src->cols),
                     (long long)(first % src->cols));
  return HQ_OK;
}

static int args_in(const hq_quantize_args *args, hq_quantize_args *out) {
  if (!args) {
    memset(out, 0, sizeof *out);
    return HQ_OK;
  }
  return hqi_struct_in(out, sizeof *out, args, args->struct_size,
                       offsetof(hq_quantize_args, amax) + sizeof(void *), "hq_quantize_args");
}

int hq_quantize_ex(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *srcp,
                   const hq_quantize_args *argsp, hq_qtensor **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_quantize: out is NULL");
  *out = NULL;
  hq_tensor src;
  hq_quantize_args args;
  int rc = args_in(argsp, &args);
  const uint32_t dirs = args.dirs ? args.dirs : q ? q->usage : 0;
  if (!rc) rc = prepare(q, ctx, dirs, "hq_quantize");
  if (!rc) rc = check_src(ctx, srcp, "hq_quantize: source", &src);
  if (!rc && (args.flags & HQ_QUANTIZE_FINITE_ONLY)) rc = finite_only(ctx, &src, "hq_quantize");
  if (rc) return rc;
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  hq_qtensor *qt = new_qtensor(q, ctx, src.rows, src.cols, src.dtype);
  if (!qt) rc = hqi_error(HQ_ENOMEM, "out of memory");
  else {
    qt->usage = dirs;
    /* HQ_QUANTIZE_ALIAS: every direction one identity instance of the source's dtype (one
       call, one buffer): the source itself, no copy; else the copy as without the flag */
    const int alias = (args.flags & HQ_QUANTIZE_ALIAS) && qt->source == HQ_SOURCE_ORIGINAL &&
                      (dirs != HQ_BOTH || fused_call(qt->fmt, qt->source)) &&
                      alias_storages(qt, qt->fmt[dirs == HQ_COLWISE ? 1 : 0], dirs, &src) == 0;
    if (alias) {
      /* as run() keeps the stream */
      rc = hqi_ctx_rng_next(ctx, qt->role_key, &qt->offset, &qt->role_count);
      const int mk = hqi_qtensor_mark_use(qt, ctx);
      rc = rc ? rc : mk;
    } else {
      rc = run(qt, ctx, &src, dirs, 0, args.amax, NULL);
    }
  }
  hqi_device_leave(saved);
  if (rc) {
    hq_qtensor_free(qt);
    return rc;
  }
  *out = qt;
  return HQ_OK;
}

int hq_quantize(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, hq_qtensor **out) {
  return hq_quantize_ex(q, ctx, src, NULL, out);
}

int hq_make_empty(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols, hq_dtype nominal,
                  hq_qtensor **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_make_empty: out is NULL");
  *out = NULL;
  int rc = prepare(q, ctx, q ? q->usage : 0, "hq_make_empty");
  if (rc) return rc;
  if ((rc = hqi_check_shape(rows, cols, "hq_make_empty"))) return rc;
  if (nominal != HQ_F32 && nominal != HQ_F16 && nominal != HQ_BF16)
    return hqi_error(HQ_EINVAL, "hq_make_empty: nominal dtype %s is not f32, f16 or bf16",
                     hq_dtype_name(nominal));
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  hq_qtensor *qt = new_qtensor(q, ctx, rows, cols, nominal);
  if (!qt) rc = hqi_error(HQ_ENOMEM, "out of memory");
  else rc = reserve_scratch(qt);
  if (!rc && q->usage == HQ_BOTH && fused_call(q->fmt, q->source))
    rc = make_storages(qt, q->fmt[0], HQ_BOTH);
  else if (!rc) {
    if (q->usage & HQ_ROWWISE) rc = make_storages(qt, q->fmt[0], HQ_ROWWISE);
    if (!rc && (q->usage & HQ_COLWISE)) rc = make_storages(qt, q->fmt[1], HQ_COLWISE);
  }
  hqi_device_leave(saved);
  if (rc) {
    hq_qtensor_free(qt);
    return rc;
  }
  *out = qt;
  return HQ_OK;
}

int hq_qtensor_update_ex(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *srcp,
                         const hq_quantize_args *argsp) {
  if (!qt || !ctx) return hqi_error(HQ_EINVAL, "hq_qtensor_update: NULL argument");
  int rc = same_device(qt, ctx, "hq_qtensor_update");
  if (rc) return rc;
  if (qt->saved)
    return hqi_error(HQ_ESTATE, "hq_qtensor_update: role %s is saved (restore it first)",
                     qt->role);
  if ((rc = not_aliased(qt, "hq_qtensor_update"))) return rc;
  hq_tensor src;
  hq_quantize_args args;
  rc = check_src(ctx, srcp, "hq_qtensor_update: source", &src);
  if (!rc) rc = args_in(argsp, &args);
  if (rc) return rc;
  if (src.rows != qt->rows || src.cols != qt->cols)
    return hqi_error(HQ_ESHAPE, "hq_qtensor_update: role %s: source [%lld, %lld] does not match "
                     "the quantized tensor's [%lld, %lld]", qt->role, (long long)src.rows,
                     (long long)src.cols, (long long)qt->rows, (long long)qt->cols);
  if (args.flags & HQ_QUANTIZE_FINITE_ONLY) {
    char what[160];
    snprintf(what, sizeof what, "hq_qtensor_update: role %s", qt->role);
    if ((rc = finite_only(ctx, &src, what))) return rc;
  }
  const uint32_t have = hq_qtensor_dirs(qt), miss = args.dirs & ~have;
  uint32_t dirs = qt->usage & have;
  if (args.dirs) {
    if ((rc = known_dirs(args.dirs, "hq_qtensor_update"))) return rc;
    if (miss) {
      char held[32];
      snprintf(held, sizeof held, "the %s one only", hq_dir_name(have));
      return hqi_error(HQ_ESTATE, "hq_qtensor_update: role %s has no %s copy to refresh (it "
                       "holds %s)", qt->role,
                       miss == HQ_BOTH ? "rowwise or columnwise" : hq_dir_name(miss),
                       have ? held : "none");
    }
    dirs = args.dirs;
  }
  if (!dirs) return HQ_OK;
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  rc = run(qt, ctx, &src, dirs, 1, args.amax, NULL);
  hqi_device_leave(saved);
  return rc;
}

int hq_qtensor_update(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src) {
  return hq_qtensor_update_ex(qt, ctx, src, NULL);
}

/* The format instance whose one update() call makes every direction qt refreshes, when that call
   may carry the optimizer step (HQ_CAP_FUSED_ADAM, no per-tensor amax, a CUDA device; with the
   constants in device memory, HQ_CAP_ADAM_KDEV too); else NULL. *dirs receives the
   directions. */
static hqi_format *fused_adam_format(const hq_qtensor *qt, const hq_ctx *ctx,
                                     const hq_adam_pass *adam, uint32_t *dirs) {
  *dirs = qt->usage & hq_qtensor_dirs(qt);
  if (ctx->device < 0 || qt->saved || !*dirs || qt->source != HQ_SOURCE_ORIGINAL) return NULL;
  hqi_format *f = *dirs == HQ_COLWISE ? qt->fmt[1] : qt->fmt[0];
  if (*dirs == HQ_BOTH && !fused_call(qt->fmt, qt->source)) return NULL; /* two calls, two reads */
  if (!(f->caps & HQ_CAP_FUSED_ADAM)) return NULL;
  /* a module without the cap would apply adam->k, the constants of the capture */
  if (hq_adam_pass_k_dev(adam) && !(f->caps & HQ_CAP_ADAM_KDEV)) return NULL;
  for (int d = 0; d < 2; d++)
    if ((*dirs & (d ? HQ_COLWISE : HQ_ROWWISE)) &&
        fmt_amax_kind(f, d ? HQ_COLWISE : HQ_ROWWISE) != HQ_AMAX_NONE)
      return NULL;
  return f;
}

int hq_qtensor_update_adam(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *masterp,
                           const hq_adam_pass *adam) {
  if (!qt || !ctx || !adam) return hqi_error(HQ_EINVAL, "hq_qtensor_update_adam: NULL argument");
  int rc = same_device(qt, ctx, "hq_qtensor_update_adam");
  if (!rc) rc = not_aliased(qt, "hq_qtensor_update_adam");
  hq_tensor master;
  if (!rc) rc = check_src(ctx, masterp, "hq_qtensor_update_adam: master", &master);
  if (rc) return rc;
  if (master.dtype != HQ_F32 || master.rows != qt->rows || master.cols != qt->cols)
    return hqi_error(master.dtype != HQ_F32 ? HQ_EINVAL : HQ_ESHAPE, "hq_qtensor_update_adam: "
                     "role %s: the master is %s [%lld, %lld], the quantized tensor [%lld, %lld] "
                     "(an FP32 master of its shape)", qt->role, hq_dtype_name(master.dtype),
                     (long long)master.rows, (long long)master.cols, (long long)qt->rows,
                     (long long)qt->cols);
  if ((uintptr_t)hq_adam_pass_k_dev(adam) % 16)
    return hqi_error(HQ_EINVAL, "hq_qtensor_update_adam: role %s: adam->k_dev %p is not 16-byte "
                     "aligned", qt->role, (const void *)hq_adam_pass_k_dev(adam));
  uint32_t dirs;
  hqi_format *f = fused_adam_format(qt, ctx, adam, &dirs);
  if (!f) /* nothing ran */
    return hqi_error(HQ_ENOTSUP, "hq_qtensor_update_adam: role %s: no one update() call of its "
                     "format can carry the optimizer step (host, saved, rowwise_dequantized, "
                     "two formats, no HQ_CAP_FUSED_ADAM, a per-tensor amax, or constants in "
                     "device memory without HQ_CAP_ADAM_KDEV)", qt->role);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  rc = run(qt, ctx, &master, dirs, 1, NULL, adam); /* one call: fused_adam_format's conditions */
  hqi_device_leave(saved);
  if (!rc)
    hqi_log(ctx, 3, "hq_qtensor_update_adam: role %s: AdamW fused into the %s write-back "
            "(format '%s', plugin %s)", qt->role,
            dirs == HQ_BOTH ? "rowwise+columnwise" : dname(dirs), f->name, f->plugin->ops.name);
  return rc;
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
  int saved, rc = hqi_device_enter(qt->ctx->device, &saved);
  if (rc) return rc;
  if ((dirs & HQ_ROWWISE) && qt->d[0].present && !(dirs & HQ_COLWISE)) rc = unshare(qt, qt->ctx);
  if (!rc) rc = hqi_qtensor_owner_frees(qt);
  if (!rc && (dirs & HQ_COLWISE)) free_dir(qt->ctx, &qt->d[1]);
  if (!rc && (dirs & HQ_ROWWISE)) free_dir(qt->ctx, &qt->d[0]);
  hqi_device_leave(saved);
  return rc;
}

int hq_dequantize(const hq_qtensor *qt, hq_ctx *ctx, uint32_t dir, hq_tensor *dstp) {
  if (!qt || !ctx) return hqi_error(HQ_EINVAL, "hq_dequantize: NULL argument");
  if (dir != HQ_ROWWISE && dir != HQ_COLWISE)
    return hqi_error(HQ_EINVAL, "hq_dequantize: dir must be HQ_ROWWISE or HQ_COLWISE");
  int rc = same_device(qt, ctx, "hq_dequantize");
  if (rc) return rc;
  if (qt->saved) return hqi_error(HQ_ESTATE, "hq_dequantize: role %s is saved", qt->role);
  if (!qt->d[di(dir)].present)
    return hqi_error(HQ_ENOENT, "hq_dequantize: role %s has no %s representation (not in its "
                     "usage, or dropped)", qt->role, dname(dir));
  hq_tensor dst;
  rc = check_src(ctx, dstp, "hq_dequantize: destination", &dst);
  if (rc) return rc;
  if (dst.rows != qt->rows || dst.cols != qt->cols)
    return hqi_error(HQ_ESHAPE, "hq_dequantize: destination [%lld, %lld] does not match [%lld, "
                     "%lld]", (long long)dst.rows, (long long)dst.cols, (long long)qt->rows,
                     (long long)qt->cols);
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  rc = call_dequantize(qt, ctx, dir, &qt->d[di(dir)].st, &dst);
  hqi_device_leave(saved);
  return rc;
}

// --- per-tensor amax --------------------------------------------------------------------------

static uint32_t fmt_amax_kind(const hqi_format *f, uint32_t dir) {
  const hq_format_ops *ops = &f->plugin->ops;
  return ops->amax_kind ? ops->amax_kind(f->cfg, dir) : HQ_AMAX_NONE;
}

/* The amax kind of direction dir made by format f from a source of kind `source`: the columnwise
   copy of a rowwise_dequantized quantizer sees the dequantized values, not the input. */
static uint32_t dir_amax_kind(const hqi_format *f, uint32_t dir, int source) {
  uint32_t k = fmt_amax_kind(f, dir);
  if (dir == HQ_COLWISE && k == HQ_AMAX_INPUT && source == HQ_SOURCE_ROWWISE_DEQUANTIZED)
    k = HQ_AMAX_OWN;
  return k;
}

uint32_t hq_quantizer_amax_kind(const hq_quantizer *q, uint32_t dir) {
  if (!q || (dir != HQ_ROWWISE && dir != HQ_COLWISE)) return HQ_AMAX_NONE;
  return dir_amax_kind(q->fmt[di(dir)], dir, q->source);
}

/* One plugin amax call into a private 2-float buffer tmp, out[d] <- its result for each
   direction d of dirs; with tmp NULL (dirs = HQ_BOTH) the plugin writes both floats of out. */
static int amax_one(hq_qtensor *qt, hq_ctx *ctx, hqi_format *f, const hq_tensor *src,
                    uint32_t dirs, float *tmp, float *out) {
  hq_call call;
  hqi_call_init(ctx, &call, 0, qt->offset);
  call.scratch = qt->scratch;
  call.scratch_bytes = qt->scratch_bytes;
  hq_clear_error();
  const hqi_fpenv fe = hqi_fp_enter();
  int rc = f->plugin->ops.amax(f->cfg, &call, src, dirs, tmp ? tmp : out);
  hqi_fp_leave(fe);
  rc = hqi_plugin_rc(rc, f->plugin->ops.name, "amax");
  if (rc) return call_prefix(rc, qt, f, dirs, "amax");
  for (int d = 0; d < 2 && tmp; d++)
    if (dirs & (d ? HQ_COLWISE : HQ_ROWWISE)) {
      rc = hq_ctx_memcpy(ctx, out + d, ctx->device, tmp + d, ctx->device, sizeof(float));
      if (rc) return rc;
    }
  return HQ_OK;
}

uint32_t hq_qtensor_amax_kind(const hq_qtensor *qt, uint32_t dir) {
  if (!qt || (dir != HQ_ROWWISE && dir != HQ_COLWISE)) return HQ_AMAX_NONE;
  return dir_amax_kind(qt->fmt[di(dir)], dir, qt->source);
}

int hq_quantizer_amax(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *srcp, float *amax) {
  if (!amax) return hqi_error(HQ_EINVAL, "hq_quantizer_amax: amax is NULL");
  hq_tensor src;
  int rc = prepare(q, ctx, q ? q->usage : 0, "hq_quantizer_amax");
  if (!rc) rc = check_src(ctx, srcp, "hq_quantizer_amax: source", &src);
  if (rc) return rc;
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  hq_qtensor *qt = new_qtensor(q, ctx, src.rows, src.cols, src.dtype);
  float *tmp = NULL;
  uint32_t kr = fmt_amax_kind(q->fmt[0], HQ_ROWWISE), kc = fmt_amax_kind(q->fmt[1], HQ_COLWISE);
  uint32_t need = ((q->usage & HQ_ROWWISE) && kr ? HQ_ROWWISE : 0) |
                  ((q->usage & HQ_COLWISE) && kc ? HQ_COLWISE : 0);
  /* one plugin call for both directions writes both of the caller's floats itself: no
     temporary, no memset, no copies on the stream (the plugin's own operations alone) */
  const int one_call = need == HQ_BOTH && fused_call(q->fmt, q->source);
  if (!qt) rc = hqi_error(HQ_ENOMEM, "out of memory");
  if (!rc) rc = reserve_scratch(qt);
  if (!rc && !one_call) {
    tmp = hqi_ctx_alloc_raw(ctx, 2 * sizeof(float));
    if (!tmp) rc = hqi_error(HQ_ENOMEM, "hq_quantizer_amax: 8 bytes on device %d", ctx->device);
  }
  if (!rc && !one_call) rc = hqi_ctx_memset(ctx, amax, 0, 2 * sizeof(float));
  if (qt) qt->offset = 0; /* an amax draws no random numbers */
  if (!rc && one_call) {
    rc = amax_one(qt, ctx, q->fmt[0], &src, HQ_BOTH, NULL, amax);
  } else if (!rc) {
    if (need & HQ_ROWWISE) rc = amax_one(qt, ctx, q->fmt[0], &src, HQ_ROWWISE, tmp, amax);
    if (!rc && (need & HQ_COLWISE)) {
      hq_tensor csrc = src;
      void *deq = NULL;
      if (q->source == HQ_SOURCE_ROWWISE_DEQUANTIZED)
        rc = rowwise_source(qt, ctx, &src, NULL, NULL, &csrc, &deq);
      if (!rc) rc = amax_one(qt, ctx, q->fmt[1], &csrc, HQ_COLWISE, tmp, amax);
      if (deq) hqi_ctx_free_raw(ctx, deq);
    }
  }
  if (tmp) hqi_ctx_free_raw(ctx, tmp);
  hq_qtensor_free(qt);
  hqi_device_leave(saved);
  return rc;
}

// --- queries ----------------------------------------------------------------------------------

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
    if (q->owned[i]) n += hq_storage_cbuf(&q->st, i)->bytes;
  return n;
}

const char *hq_qtensor_format(const hq_qtensor *qt, uint32_t dir) {
  return qt && (dir == HQ_ROWWISE || dir == HQ_COLWISE) ? qt->fmt[di(dir)]->name : NULL;
}
const char *hq_qtensor_role(const hq_qtensor *qt) { return qt ? qt->role : NULL; }
int hq_qtensor_columnwise_source(const hq_qtensor *qt) { return qt ? qt->source : 0; }
int hq_qtensor_device(const hq_qtensor *qt) { return qt ? qt->ctx->device : HQ_DEVICE_HOST; }

int hq_qtensor_format_desc(const hq_qtensor *qt, uint32_t dir, hq_format_desc *out) {
  if (!qt || !out || (dir != HQ_ROWWISE && dir != HQ_COLWISE))
    return hqi_error(HQ_EINVAL, "hq_qtensor_format_desc: NULL argument or direction 0x%x", dir);
  const hqi_format *f = qt->fmt[di(dir)];
  const hq_format_ops *ops = &f->plugin->ops;
  const size_t n = f->plugin->n_options;
  hq_format_desc d;
  memset(&d, 0, sizeof d);
  d.layout_version = ops->layout_version ? ops->layout_version : 1;
  d.name = f->name;
  d.plugin = ops->name;
  d.plugin_version = ops->version ? ops->version : "";
  d.n_options = n;
  d.option_names = f->plugin->opt_text;
  d.option_values = (const char *const *)f->val_text;
  d.option_defaults = f->plugin->opt_text + n;
  /* a newer caller's fields beyond ours are left alone */
  return hqi_struct_out(out, &d, sizeof d, HQ_FORMAT_DESC_SIZE_0_2, "hq_format_desc");
}

void hq_qtensor_free(hq_qtensor *qt) {
  if (!qt) return;
  int saved;
  int entered = hqi_device_enter(qt->ctx->device, &saved) == HQ_OK;
  if (entered && hqi_qtensor_owner_frees(qt)) hq_clear_error(); /* a dead device: the frees fail alike */
  if (!qt->saved) {
    free_dir(qt->ctx, &qt->d[1]);
    free_dir(qt->ctx, &qt->d[0]);
  }
  if (qt->scratch) hqi_ctx_free_raw(qt->ctx, qt->scratch);
  /* the FSDP staging is a raw allocation of the owner, like the scratch */
  if (qt->fsdp_staging) hqi_ctx_free_raw(qt->ctx, qt->fsdp_staging);
  hqi_cuda_event_destroy(qt->last_use);
  if (entered) hqi_device_leave(saved);
  hqi_format_release(qt->fmt[0]);
  hqi_format_release(qt->fmt[1]);
  hqi_state_release(qt->state);
  hqi_ctx_release(qt->ctx);
  free(qt->role);
  free(qt);
}

// --- save / restore ---------------------------------------------------------------------------
/* The saved list: the buffers the rowwise storage owns, in its buffer order, then those the
   columnwise storage owns. Shared buffers are not listed (they travel with the rowwise storage)
   and are re-linked on restore. A buffer its format saves itself (plugin ABI 2.4, forms.c)
   travels as its form: written by the format's save() into memory of the owner, the buffer
   freed; restore() rebuilds it in fresh memory from the form, which is then freed. */

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

/* The save forms of qt's owned buffers (ndim 0: saved as it is). */
static int save_forms(const hq_qtensor *qt, hq_buffer_form form[2][HQ_MAX_BUFFERS], int *any) {
  *any = 0;
  for (int d = 0; d < 2; d++)
    for (uint32_t i = 0; i < HQ_MAX_BUFFERS; i++) {
      const qdir *q = &qt->d[d];
      memset(&form[d][i], 0, sizeof form[d][i]);
      if (!q->present || i >= q->st.nbuf || !q->owned[i]) continue;
      int rc = hqi_buffer_form(qt->fmt[d], &q->st, i, HQ_FORM_SAVE, qt->role, &form[d][i]);
      if (rc) return rc;
      *any |= form[d][i].ndim != 0;
    }
  return HQ_OK;
}

/* Free the memory of the forms in form[][] (those with ndim and a pointer). */
static void free_forms(hq_ctx *ctx, hq_buffer_form form[2][HQ_MAX_BUFFERS]) {
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < HQ_MAX_BUFFERS; i++)
      if (form[d][i].ndim && form[d][i].ptr) {
        hqi_ctx_free_raw(ctx, form[d][i].ptr);
        form[d][i].ptr = NULL;
      }
}

/* Write every save form of qt (memory of the owner); on failure none is left. */
static int write_forms(hq_qtensor *qt, hq_buffer_form form[2][HQ_MAX_BUFFERS]) {
  int rc = HQ_OK;
  for (int d = 0; d < 2 && !rc; d++)
    for (uint32_t i = 0; i < HQ_MAX_BUFFERS && !rc; i++) {
      hq_buffer_form *fm = &form[d][i];
      if (!fm->ndim) continue;
      fm->ptr = hqi_ctx_alloc_raw(qt->ctx, fm->bytes ? fm->bytes : 1);
      if (!fm->ptr)
        rc = hqi_error(HQ_ENOMEM, "hq_qtensor_save: role %s: %zu bytes for the saved form of "
                       "buffer '%s' on device %d", qt->role, fm->bytes,
                       BUF(&qt->d[d].st, i)->name, qt->ctx->device);
      else
        rc = hqi_form_write(qt->fmt[d], qt->ctx, &qt->d[d].st, i, fm, HQ_FORM_SAVE, qt->role);
    }
  if (rc) free_forms(qt->ctx, form);
  return rc;
}

int hq_qtensor_save(hq_qtensor *qt, hq_saved_buffer *out, size_t cap, size_t elem_size,
                    size_t *n) {
  if (!qt || !n || (!out && cap)) return hqi_error(HQ_EINVAL, "hq_qtensor_save: NULL argument");
  if (cap && elem_size < HQ_SAVED_BUFFER_SIZE_0_2)
    return hqi_error(HQ_EINVAL, "hq_qtensor_save: elem_size %zu is smaller than the oldest "
                     "hq_saved_buffer (%zu bytes)", elem_size, (size_t)HQ_SAVED_BUFFER_SIZE_0_2);
  if (qt->saved) return hqi_error(HQ_ESTATE, "hq_qtensor_save: role %s is already saved", qt->role);
  int arc = not_aliased(qt, "hq_qtensor_save");
  if (arc) return arc;
  size_t need = hq_qtensor_saved_count(qt);
  *n = need;
  if (cap < need)
    return hqi_error(HQ_EINVAL, "hq_qtensor_save: role %s needs %zu entries, %zu given", qt->role,
                     need, cap);
  hq_buffer_form form[2][HQ_MAX_BUFFERS];
  int any, rc = save_forms(qt, form, &any);
  if (rc) return rc;
  if (any) { /* the format writes its forms before anything changes */
    int saved;
    if ((rc = hqi_device_enter(qt->ctx->device, &saved))) return rc;
    rc = write_forms(qt, form);
    if (!rc) rc = hqi_qtensor_owner_frees(qt);
    if (rc) free_forms(qt->ctx, form);
    for (int d = 0; d < 2 && !rc; d++) /* the buffers a form replaces */
      for (uint32_t i = 0; i < HQ_MAX_BUFFERS; i++)
        if (form[d][i].ndim) hqi_ctx_free_raw(qt->ctx, BUF(&qt->d[d].st, i)->ptr);
    hqi_device_leave(saved);
    if (rc) return rc;
  }
  size_t k = 0;
  for (int d = 0; d < 2; d++) {
    qdir *q = &qt->d[d];
    if (!q->present) continue;
    for (uint32_t i = 0; i < q->st.nbuf; i++) {
      hq_buffer *b = BUF(&q->st, i);
      if (!q->owned[i]) continue;
      const hq_buffer_form *fm = &form[d][i];
      hq_saved_buffer e;
      memset(&e, 0, sizeof e);
      e.struct_size = (uint32_t)(elem_size < sizeof e ? elem_size : sizeof e);
      e.dir = q->st.dir;
      e.name = b->name;
      e.dtype = fm->ndim ? fm->dtype : b->dtype;
      e.ndim = fm->ndim ? fm->ndim : b->ndim;
      memcpy(e.shape, fm->ndim ? fm->shape : b->shape, sizeof e.shape);
      e.bytes = fm->ndim ? fm->bytes : b->bytes;
      e.device = q->st.device;
      e.ptr = fm->ndim ? fm->ptr : b->ptr;
      hqi_elem_put(out, k++, elem_size, &e, sizeof e);
    }
  }
  for (int d = 0; d < 2; d++)
    for (uint32_t i = 0; qt->d[d].present && i < qt->d[d].st.nbuf; i++)
      BUF(&qt->d[d].st, i)->ptr = NULL;
  qt->saved = 1;
  return HQ_OK;
}

/* Rebuild the buffers saved as forms (restore, plugin ABI 2.4): each in fresh memory of the
   owner from the form handed back (form[d][i].ptr), which is freed once it is read. On failure
   the fresh memory is freed and the buffers' pointers are left NULL (the caller keeps the
   entries). */
static int read_forms(hq_qtensor *qt, hq_buffer_form form[2][HQ_MAX_BUFFERS]) {
  int saved, rc = hqi_device_enter(qt->ctx->device, &saved);
  for (int d = 0; d < 2 && !rc; d++)
    for (uint32_t i = 0; i < HQ_MAX_BUFFERS && !rc; i++) {
      if (!form[d][i].ndim) continue;
      hq_buffer *b = BUF(&qt->d[d].st, i);
      b->ptr = hqi_ctx_alloc_raw(qt->ctx, b->bytes ? b->bytes : 1);
      if (!b->ptr)
        rc = hqi_error(HQ_ENOMEM, "hq_qtensor_restore: role %s: allocating %s buffer '%s' (%zu "
                       "bytes) on device %d failed", qt->role, dname(qt->d[d].st.dir), b->name,
                       b->bytes, qt->ctx->device);
      else
        rc = hqi_form_read(qt->fmt[d], qt->ctx, &qt->d[d].st, i, &form[d][i], HQ_FORM_SAVE,
                           qt->role);
    }
  for (int d = 0; d < 2; d++)
    for (uint32_t i = 0; i < HQ_MAX_BUFFERS; i++) {
      if (!form[d][i].ndim) continue;
      hq_buffer *b = BUF(&qt->d[d].st, i);
      if (rc) {
        hqi_ctx_free_raw(qt->ctx, b->ptr);
        b->ptr = NULL;
      } else {
        hqi_ctx_free_raw(qt->ctx, form[d][i].ptr); /* stream-ordered: after restore() read it */
      }
    }
  hqi_device_leave(saved);
  return rc;
}

int hq_qtensor_restore(hq_qtensor *qt, const hq_saved_buffer *in, size_t n, size_t elem_size) {
  if (!qt || (!in && n)) return hqi_error(HQ_EINVAL, "hq_qtensor_restore: NULL argument");
  if (n && elem_size < HQ_SAVED_BUFFER_SIZE_0_2)
    return hqi_error(HQ_EINVAL, "hq_qtensor_restore: elem_size %zu is smaller than the oldest "
                     "hq_saved_buffer (%zu bytes)", elem_size, (size_t)HQ_SAVED_BUFFER_SIZE_0_2);
  if (!qt->saved) return hqi_error(HQ_ESTATE, "hq_qtensor_restore: role %s is not saved", qt->role);
  size_t need = hq_qtensor_saved_count(qt);
  if (n != need)
    return hqi_error(HQ_EINVAL, "hq_qtensor_restore: role %s saved %zu buffers, %zu given back",
                     qt->role, need, n);
  /* the skeleton's forms: what each entry must be */
  hq_buffer_form form[2][HQ_MAX_BUFFERS];
  int any, rc = save_forms(qt, form, &any);
  if (rc) return rc;
  /* check every entry against the skeleton before anything changes */
  size_t k = 0;
  for (int pass = 0; pass < 2; pass++) {
    k = 0;
    for (int d = 0; d < 2; d++) {
      qdir *q = &qt->d[d];
      if (!q->present) continue;
      for (uint32_t i = 0; i < q->st.nbuf; i++) {
        if (!q->owned[i]) continue;
        hq_buffer *b = BUF(&q->st, i);
        const size_t bytes = form[d][i].ndim ? form[d][i].bytes : b->bytes;
        hq_saved_buffer e;
        hqi_elem_get(&e, sizeof e, in, k, elem_size);
        if (pass == 0) {
          for (size_t j = 0; j < k && e.ptr; j++) {
            hq_saved_buffer f;
            hqi_elem_get(&f, sizeof f, in, j, elem_size);
            if (f.ptr == e.ptr)
              return hqi_error(HQ_EINVAL, "hq_qtensor_restore: role %s: entries %zu and %zu hand "
                               "back the same memory", qt->role, j, k);
          }
          if (!e.ptr || e.dir != q->st.dir || !e.name || strcmp(e.name, b->name) != 0 ||
              e.bytes != bytes || e.device != q->st.device)
            return hqi_error(HQ_EINVAL, "hq_qtensor_restore: role %s: entry %zu (%s %s, %zu "
                             "bytes, device %d%s) is not the saved %s buffer '%s' (%zu bytes%s, "
                             "device %d)", qt->role, k, dname(e.dir), e.name ? e.name : "?",
                             e.bytes, e.device, e.ptr ? "" : ", NULL pointer", dname(q->st.dir),
                             b->name, bytes, form[d][i].ndim ? " as its format saves it" : "",
                             q->st.device);
        } else if (form[d][i].ndim) {
          form[d][i].ptr = e.ptr;
        } else {
          b->ptr = e.ptr;
        }
        k++;
      }
    }
  }
  if (any && (rc = read_forms(qt, form))) {
    for (int d = 0; d < 2; d++) /* still saved: the caller keeps every entry */
      for (uint32_t i = 0; qt->d[d].present && i < qt->d[d].st.nbuf; i++)
        BUF(&qt->d[d].st, i)->ptr = NULL;
    return rc;
  }
  for (uint32_t i = 0; qt->d[1].present && i < qt->d[1].st.nbuf; i++)
    if (!qt->d[1].owned[i])
      BUF(&qt->d[1].st, i)->ptr = BUF(&qt->d[0].st, BUF(&qt->d[1].st, i)->shared_with)->ptr;
  qt->saved = 0;
  return HQ_OK;
}

int hq_qtensor_is_saved(const hq_qtensor *qt) { return qt ? qt->saved : 0; }
