/*
** state.c -- the scaling state of a recipe's quantizers (delayed scaling): ONE buffer on the
** state's device holding, for every slice, one amax ("history row 0") and the format's state
** floats (plugin.h, "State"):
**
**     [ amax of every slice | state of every slice ]
**
** Slices are grouped by (format instance, directions). Within a group the amaxes are contiguous
** and the states follow each other with the group's stride, so the core makes one update_state
** call per group and a plugin runs one kernel for it. Groups appear in the order of their first
** slice, slices within a group in the order they were reserved: the layout depends only on the
** order of the binds, so every rank that binds the same quantizers in the same order has the
** same layout (its all-reduce lines up).
**
** The buffer is laid out and allocated at its first use; a bind after that moves the contents
** through the host into a buffer of the new layout (old slices keep their values, new ones get
** their initial state).
*/
#include "config.h"
#include "hq_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most floats of state one slice may ask for (2^20: 4 MiB). */
#define MAX_SLICE_FLOATS (1u << 20)

typedef struct slice {
  hqi_format *fmt; /* retained */
  uint32_t dirs;
  uint32_t floats;
  char *role;
  uint64_t hash;
  size_t group;
  size_t amax_index, offset;   /* in the current layout */
  int in_buf;                  /* present in the allocated buffer ... */
  size_t buf_amax, buf_offset; /* ... at these positions */
} slice;

typedef struct group {
  hqi_format *fmt; /* not retained: its slices retain it */
  uint32_t dirs, floats;
  size_t n;             /* slices */
  size_t amax0, state0; /* layout: first amax index, first state offset */
  size_t fill;          /* layout's counter */
} group;

struct hq_state {
  int refs;
  hq_ctx *ctx;
  char *name; /* for messages */
  slice *sl;
  size_t n, cap;
  group *gr;
  size_t ng, capg;
  int32_t *table; /* open addressing over slices: index, -1 empty */
  size_t tcap;
  int dirty;  /* a slice was added since the last layout */
  float *buf; /* on ctx's device; NULL until the first use */
  size_t buf_floats;
  size_t total; /* floats of the current layout */
};

static const char *dirs_name(uint32_t dirs) {
  return dirs == HQ_BOTH ? "rowwise+columnwise" : hq_dir_name(dirs);
}

uint32_t hqi_format_state_floats(const hqi_format *f, uint32_t dirs) {
  const hq_format_ops *ops = &f->plugin->ops;
  return ops->state_floats && ops->update_state ? ops->state_floats(f->cfg, dirs) : 0;
}

int hq_state_create(const hq_recipe *r, hq_ctx *ctx, hq_state **out) {
  if (!ctx || !out) return hqi_error(HQ_EINVAL, "hq_state_create: NULL argument");
  *out = NULL;
  if (r && hq_recipe_error_count(r))
    return hqi_error(HQ_EPARSE, "recipe %s has errors: %s", hq_recipe_path(r),
                     hq_recipe_error(r, 0));
  hq_state *st = hqi_calloc(1, sizeof *st);
  if (!st) return hqi_error(HQ_ENOMEM, "out of memory");
  st->refs = 1;
  st->ctx = hqi_ctx_retain(ctx);
  if (r) {
    const char *nm = hq_recipe_name(r);
    st->name = hqi_asprintf("the scaling state of recipe %s", nm[0] ? nm : hq_recipe_path(r));
  } else {
    st->name = hqi_strdup("a scaling state");
  }
  if (!st->name) {
    hqi_ctx_release(st->ctx);
    free(st);
    return hqi_error(HQ_ENOMEM, "out of memory");
  }
  *out = st;
  return HQ_OK;
}

/* Atomic like the formats' counts: qtensors bound to one state may live on several threads. */
hq_state *hqi_state_retain(hq_state *st) {
  if (st) __atomic_add_fetch(&st->refs, 1, __ATOMIC_RELAXED);
  return st;
}

void hqi_state_release(hq_state *st) {
  if (!st || __atomic_sub_fetch(&st->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (st->buf) {
    int saved;
    int entered = hqi_device_enter(st->ctx->device, &saved) == HQ_OK;
    hqi_ctx_free_raw(st->ctx, st->buf);
    if (entered) hqi_device_leave(saved);
  }
  for (size_t i = 0; i < st->n; i++) {
    hqi_format_release(st->sl[i].fmt);
    free(st->sl[i].role);
  }
  free(st->sl);
  free(st->gr);
  free(st->table);
  free(st->name);
  hqi_ctx_release(st->ctx);
  free(st);
}

void hq_state_free(hq_state *st) { hqi_state_release(st); }

size_t hq_state_slice_count(const hq_state *st) { return st ? st->n : 0; }

// --- slices -----------------------------------------------------------------------------------

static uint64_t slice_hash(const char *role, const hqi_format *f, uint32_t dirs) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the role, then the instance and dirs */
  for (const char *p = role; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ (uint64_t)(uintptr_t)f) * 1099511628211ull;
  h = (h ^ dirs) * 1099511628211ull;
  return h ^ (h >> 29);
}

static int32_t table_find(const hq_state *st, const char *role, const hqi_format *f, uint32_t dirs,
                          uint64_t h) {
  if (!st->tcap) return -1;
  for (size_t k = h & (st->tcap - 1);; k = (k + 1) & (st->tcap - 1)) {
    int32_t i = st->table[k];
    if (i < 0) return -1;
    const slice *s = &st->sl[i];
    if (s->hash == h && s->fmt == f && s->dirs == dirs && strcmp(s->role, role) == 0) return i;
  }
}

static void table_put(hq_state *st, int32_t i) {
  for (size_t k = st->sl[i].hash & (st->tcap - 1);; k = (k + 1) & (st->tcap - 1))
    if (st->table[k] < 0) {
      st->table[k] = i;
      return;
    }
}

/* Room for one more slice (and its table entry, load <= 1/2). */
static int grow(hq_state *st) {
  if (st->n == st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 16;
    slice *p = realloc(st->sl, cap * sizeof *p);
    if (!p) {
      hqi_oom_note();
      return hqi_error(HQ_ENOMEM, "out of memory");
    }
    st->sl = p;
    st->cap = cap;
  }
  if (2 * (st->n + 1) > st->tcap) {
    size_t cap = st->tcap ? 2 * st->tcap : 32;
    int32_t *t = hqi_malloc(cap * sizeof *t);
    if (!t) return hqi_error(HQ_ENOMEM, "out of memory");
    free(st->table);
    st->table = t;
    st->tcap = cap;
    for (size_t k = 0; k < cap; k++) t[k] = -1;
    for (size_t i = 0; i < st->n; i++) table_put(st, (int32_t)i);
  }
  return HQ_OK;
}

static int find_group(hq_state *st, hqi_format *f, uint32_t dirs, uint32_t floats, size_t *g) {
  for (size_t i = 0; i < st->ng; i++)
    if (st->gr[i].fmt == f && st->gr[i].dirs == dirs) {
      *g = i;
      return HQ_OK;
    }
  if (st->ng == st->capg) {
    size_t cap = st->capg ? 2 * st->capg : 8;
    group *p = realloc(st->gr, cap * sizeof *p);
    if (!p) {
      hqi_oom_note();
      return hqi_error(HQ_ENOMEM, "out of memory");
    }
    st->gr = p;
    st->capg = cap;
  }
  memset(&st->gr[st->ng], 0, sizeof st->gr[st->ng]);
  st->gr[st->ng].fmt = f;
  st->gr[st->ng].dirs = dirs;
  st->gr[st->ng].floats = floats;
  *g = st->ng++;
  return HQ_OK;
}

int hqi_state_reserve(hq_state *st, hqi_format *f, uint32_t dirs, const char *role, int32_t *id) {
  *id = -1;
  const uint32_t floats = hqi_format_state_floats(f, dirs);
  if (!floats) return HQ_OK;
  if (floats > MAX_SLICE_FLOATS)
    return hqi_error(HQ_EABI,
                     "role %s, %s format '%s' (plugin %s): state_floats() asks for %u "
                     "floats per slice (at most %u)",
                     role, dirs_name(dirs), f->name, f->plugin->ops.name, floats, MAX_SLICE_FLOATS);
  const uint64_t h = slice_hash(role, f, dirs);
  int32_t i = table_find(st, role, f, dirs, h);
  if (i >= 0) {
    *id = i;
    return HQ_OK;
  }
  if (st->n >= INT32_MAX - 1) return hqi_error(HQ_ENOMEM, "%s: too many slices", st->name);
  size_t g = 0;
  char *name = hqi_strdup(role);
  int rc = name ? grow(st) : hqi_error(HQ_ENOMEM, "out of memory");
  if (!rc) rc = find_group(st, f, dirs, floats, &g);
  if (rc) {
    free(name);
    return rc;
  }
  slice *s = &st->sl[st->n];
  memset(s, 0, sizeof *s);
  s->role = name;
  s->fmt = hqi_format_retain(f);
  s->dirs = dirs;
  s->floats = floats;
  s->hash = h;
  s->group = g;
  st->gr[g].n++;
  *id = (int32_t)st->n++;
  table_put(st, *id);
  st->dirty = 1;
  return HQ_OK;
}

/* Compute every group's and slice's position (host only). */
static void layout(hq_state *st) {
  if (!st->dirty) return;
  size_t amax = 0, state = 0;
  for (size_t g = 0; g < st->ng; g++) {
    st->gr[g].amax0 = amax;
    amax += st->gr[g].n;
  }
  for (size_t g = 0; g < st->ng; g++) {
    st->gr[g].state0 = amax + state;
    state += st->gr[g].n * st->gr[g].floats;
  }
  for (size_t g = 0; g < st->ng; g++) st->gr[g].fill = 0;
  for (size_t i = 0; i < st->n; i++) {
    slice *s = &st->sl[i];
    group *g = &st->gr[s->group];
    const size_t r = g->fill++;
    s->amax_index = g->amax0 + r;
    s->offset = g->state0 + r * g->floats;
  }
  st->total = amax + state;
  st->dirty = 0;
}

/* Lay the buffer out and (re)allocate it for the current slices: the old contents move through
   the host, new slices get amax 0 and their initial state. */
static int materialize(hq_state *st) {
  layout(st);
  if (st->buf && st->buf_floats == st->total) return HQ_OK;
  hq_ctx *ctx = st->ctx;
  const size_t bytes = (st->total ? st->total : 1) * sizeof(float);
  float *img = hqi_calloc(st->total ? st->total : 1, sizeof *img);
  float *old = st->buf ? hqi_calloc(st->buf_floats ? st->buf_floats : 1, sizeof *old) : NULL;
  float *dev = NULL;
  int rc = img && (!st->buf || old) ? HQ_OK : hqi_error(HQ_ENOMEM, "out of memory");
  int saved, entered = 0;
  if (!rc && !(rc = hqi_device_enter(ctx->device, &saved))) entered = 1;
  if (!rc && st->buf) {
    rc = hq_ctx_memcpy(ctx, old, HQ_DEVICE_HOST, st->buf, ctx->device,
                       st->buf_floats * sizeof(float));
    if (!rc) rc = hq_ctx_sync(ctx);
  }
  if (!rc) {
    for (size_t i = 0; i < st->n; i++) {
      const slice *s = &st->sl[i];
      if (s->in_buf) {
        img[s->amax_index] = old[s->buf_amax];
        memcpy(img + s->offset, old + s->buf_offset, s->floats * sizeof(float));
      } else if (s->fmt->plugin->ops.init_state) {
        const hqi_fpenv fe = hqi_fp_enter();
        s->fmt->plugin->ops.init_state(s->fmt->cfg, s->dirs, img + s->offset);
        hqi_fp_leave(fe);
      }
    }
    dev = hqi_ctx_alloc_raw(ctx, bytes);
    if (!dev)
      rc = hqi_error(HQ_ENOMEM, "%s: allocating %zu bytes on device %d failed", st->name, bytes,
                     ctx->device);
  }
  if (!rc) rc = hq_ctx_memcpy(ctx, dev, ctx->device, img, HQ_DEVICE_HOST, bytes);
  if (!rc) rc = hq_ctx_sync(ctx); /* img is freed below */
  if (!rc) {
    if (st->buf) hqi_ctx_free_raw(ctx, st->buf);
    st->buf = dev;
    st->buf_floats = st->total;
    for (size_t i = 0; i < st->n; i++) {
      slice *s = &st->sl[i];
      s->in_buf = 1;
      s->buf_amax = s->amax_index;
      s->buf_offset = s->offset;
    }
  } else if (dev) {
    hqi_ctx_free_raw(ctx, dev);
  }
  if (entered) hqi_device_leave(saved);
  free(img);
  free(old);
  return rc;
}

static int same_device(const hq_state *st, const hq_ctx *ctx, const char *what) {
  if (ctx->device != st->ctx->device)
    return hqi_error(HQ_EINVAL, "%s: %s lives on device %d, the context runs on %d", what, st->name,
                     st->ctx->device, ctx->device);
  return HQ_OK;
}

int hqi_state_slice_ptrs(hq_state *st, const hq_ctx *ctx, int32_t id, float **state, float **amax) {
  int rc = same_device(st, ctx, "quantize");
  if (!rc) rc = materialize(st);
  if (rc) return rc;
  const slice *s = &st->sl[id];
  *state = st->buf + s->offset;
  *amax = st->buf + s->amax_index;
  return HQ_OK;
}

void hqi_state_slice_info(hq_state *st, int32_t id, hq_state_slice *out) {
  layout(st);
  const slice *s = &st->sl[id];
  out->dirs = s->dirs;
  out->amax_index = s->amax_index;
  out->offset = s->offset;
  out->floats = s->floats;
}

// --- the public calls ---------------------------------------------------------------------------

int hq_state_amaxes(hq_state *st, float **amax, size_t *n) {
  if (!st || !amax || !n) return hqi_error(HQ_EINVAL, "hq_state_amaxes: NULL argument");
  int rc = materialize(st);
  if (rc) return rc;
  *amax = st->buf;
  *n = st->n;
  return HQ_OK;
}

int hq_state_data(hq_state *st, float **data, size_t *n) {
  if (!st || !data || !n) return hqi_error(HQ_EINVAL, "hq_state_data: NULL argument");
  int rc = materialize(st);
  if (rc) return rc;
  *data = st->buf;
  *n = st->total;
  return HQ_OK;
}

int hq_state_update(hq_state *st, hq_ctx *ctx) {
  if (!st || !ctx) return hqi_error(HQ_EINVAL, "hq_state_update: NULL argument");
  int rc = same_device(st, ctx, "hq_state_update");
  if (!rc) rc = materialize(st);
  if (rc || !st->ng) return rc;
  int saved;
  if ((rc = hqi_device_enter(ctx->device, &saved))) return rc;
  for (size_t g = 0; g < st->ng && !rc; g++) {
    const group *gr = &st->gr[g];
    hqi_format *f = gr->fmt;
    hq_call call;
    hqi_call_init(ctx, &call, HQ_CALL_UPDATE, ctx->offset);
    hq_clear_error();
    const hqi_fpenv fe = hqi_fp_enter();
    rc = f->plugin->ops.update_state(f->cfg, &call, gr->dirs, (int64_t)gr->n, st->buf + gr->amax0,
                                     st->buf + gr->state0);
    hqi_fp_leave(fe);
    rc = hqi_plugin_rc(rc, f->plugin->ops.name, "update_state");
    if (rc)
      hqi_error_prefix(rc, "hq_state_update: %s format '%s' (plugin %s), %zu slice%s",
                       dirs_name(gr->dirs), f->name, f->plugin->ops.name, gr->n,
                       gr->n == 1 ? "" : "s");
  }
  hqi_device_leave(saved);
  return rc;
}
