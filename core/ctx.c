/*
** ctx.c -- execution contexts: device, stream, allocator hooks, logger, RNG stream.
*/
#include "config.h"
#include "hq_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hq/numerics.h"

/* One role's count of calls in the current step; key 0 marks a free slot (hqi_role_key never
   returns 0). */
struct hqi_rng_slot {
  uint64_t key, count;
};

int hq_ctx_create(const hq_ctx_desc *desc, hq_ctx **out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_ctx_create: out is NULL");
  *out = NULL;
  hq_ctx_desc d = {0};
  d.struct_size = sizeof d;
  d.device = HQ_DEVICE_HOST;
  if (desc) {
    /* an older caller's smaller struct: read only its bytes, the rest stays zero */
    int rc = hqi_struct_in(&d, sizeof d, desc, desc->struct_size, HQ_CTX_DESC_SIZE_0_1,
                           "hq_ctx_desc");
    if (rc) return rc;
  }
  if (d.device < HQ_DEVICE_HOST)
    return hqi_error(HQ_EINVAL, "hq_ctx_create: device %d is not a CUDA ordinal or host", d.device);
  if (d.device >= 0) {
    int n = hq_device_count();
    if (!hq_built_with_cuda())
      return hqi_error(HQ_ENOTSUP, "hq_ctx_create: device %d asked for, but this libhqcore was "
                       "built without CUDA", d.device);
    if (d.device >= n)
      return hqi_error(HQ_EINVAL, "hq_ctx_create: CUDA device %d does not exist (%d found)",
                       d.device, n);
  }
  hq_allocator alloc;
  if (d.allocator) {
    int rc = hqi_struct_in(&alloc, sizeof alloc, d.allocator, d.allocator->struct_size,
                           HQ_ALLOCATOR_SIZE_0_3, "hq_allocator");
    if (rc) return hqi_error_prefix(rc, "hq_ctx_create");
    if (!alloc.alloc || !alloc.free)
      return hqi_error(HQ_EINVAL, "hq_ctx_create: the allocator needs both alloc and free");
  }
  hq_ctx *ctx = hqi_calloc(1, sizeof *ctx);
  if (!ctx) return hqi_error(HQ_ENOMEM, "out of memory");
  ctx->refs = 1;
  ctx->device = d.device;
  ctx->arch = d.device >= 0 ? hqi_cuda_arch(d.device) : 0;
  ctx->stream = d.stream;
  if (d.allocator) {
    ctx->allocator = alloc;
    ctx->has_allocator = 1;
  }
  ctx->log = d.log;
  ctx->log_user = d.log_user;
  ctx->seed = d.seed;
  *out = ctx;
  return HQ_OK;
}

/* The contexts keeping device memory between calls (a cuBLASLt workspace, call scratch), so
   that hq_device_trim can release them all; ws_mu also guards their workspace and scratch
   against that release. */
static pthread_mutex_t ws_mu = PTHREAD_MUTEX_INITIALIZER;
static hq_ctx *ws_list;

static void ws_unlink(hq_ctx *ctx) {
  for (hq_ctx **pp = &ws_list; *pp; pp = &(*pp)->ws_next)
    if (*pp == ctx) {
      *pp = ctx->ws_next;
      break;
    }
  ctx->ws_next = NULL;
  ctx->kept = 0;
}

/* Under ws_mu: ctx on the list. */
static void ws_link(hq_ctx *ctx) {
  if (ctx->kept) return;
  ctx->ws_next = ws_list;
  ws_list = ctx;
  ctx->kept = 1;
}

/* Under ws_mu: the workspace and the scratch not handed out (all of it: the context's end)
   freed, stream-ordered (after the work that uses them), on ctx's device, which the caller made
   current; whether scratch is left. */
static int kept_free(hq_ctx *ctx, int all) {
  hqi_ctx_free_raw(ctx, ctx->workspace);
  ctx->workspace = NULL;
  ctx->workspace_bytes = 0;
  int left = 0;
  for (int i = 0; i < HQI_SCRATCH_SLOTS; i++) {
    struct hqi_scratch *e = &ctx->scratch[i];
    if (e->busy && !all) left = 1;
    if (!e->p || (e->busy && !all)) continue;
    hqi_ctx_free_raw(ctx, e->p);
    memset(e, 0, sizeof *e);
  }
  return left;
}

hq_ctx *hqi_ctx_retain(hq_ctx *ctx) {
  __atomic_add_fetch(&ctx->refs, 1, __ATOMIC_RELAXED);
  return ctx;
}

/* The end of a context, once nothing uses it. */
static void ctx_end(hq_ctx *ctx) {
  if (ctx->kept) {
    pthread_mutex_lock(&ws_mu);
    ws_unlink(ctx);
    int saved;
    if (hqi_device_enter(ctx->device, &saved) == HQ_OK) {
      (void)kept_free(ctx, 1);
      hqi_device_leave(saved);
    }
    pthread_mutex_unlock(&ws_mu);
  }
  if (ctx->offset_dev) {
    int saved;
    if (hqi_device_enter(ctx->device, &saved) == HQ_OK) {
      hqi_ctx_free_raw(ctx, ctx->offset_dev); /* stream-ordered: after the work that reads it */
      hqi_device_leave(saved);
    }
  }
  /* the side stream's work is ordered before the context's later work, which the frees above
     follow: destroying it (and its events) now releases them once that work is done */
  hqi_cuda_stream_destroy(ctx->side);
  hqi_cuda_event_destroy(ctx->side_ev[0]);
  hqi_cuda_event_destroy(ctx->side_ev[1]);
  free(ctx->gemm_cache);
  free(ctx->rng);
  free(ctx);
}

void hqi_ctx_release(hq_ctx *ctx) {
  if (ctx && __atomic_sub_fetch(&ctx->refs, 1, __ATOMIC_ACQ_REL) == 0) ctx_end(ctx);
}

/* A quantized tensor or a scaling state made on the context holds a reference: destroying the
   context before them ends it only when the last of them is freed (their memory is freed
   through its allocator and stream, which must stay valid until then), instead of leaving them
   a dangling owner. */
void hq_ctx_destroy(hq_ctx *ctx) {
  if (!ctx) return;
  const int users = __atomic_load_n(&ctx->refs, __ATOMIC_ACQUIRE) - 1;
  if (users > 0)
    hqi_log(ctx, 1, "hq_ctx_destroy: %d quantized tensor%s or scaling state%s still use%s this "
            "context (device %d); it ends when the last of them is freed", users,
            users == 1 ? "" : "s", users == 1 ? "" : "s", users == 1 ? "s" : "", ctx->device);
  hqi_ctx_release(ctx);
}

int hqi_call_workspace(const hq_call *call, size_t bytes, void **out) {
  *out = NULL;
  hq_ctx *ctx = call ? call->core_private : NULL;
  if (!ctx || ctx->device < 0) return HQ_OK;
  if (ctx->workspace && ctx->workspace_bytes >= bytes) {
    *out = ctx->workspace;
    return HQ_OK;
  }
  /* an allocation on a stream being captured would belong to the graph: run without one (the
     first GEMM on a context, outside a capture, gives it its workspace) */
  if (hqi_cuda_capturing(ctx->stream)) return HQ_OK;
  void *p = hqi_ctx_alloc_raw(ctx, bytes);
  if (!p) {
    hq_clear_error(); /* the GEMM runs with algorithms that need no workspace */
    return HQ_OK;
  }
  pthread_mutex_lock(&ws_mu);
  if (ctx->workspace) hqi_ctx_free_raw(ctx, ctx->workspace);
  ws_link(ctx);
  ctx->workspace = p;
  ctx->workspace_bytes = bytes;
  pthread_mutex_unlock(&ws_mu);
  *out = p;
  return HQ_OK;
}

/* The device refusal of the calls on hq's memory pool (fn names the call): HQ_EINVAL for a
   device that does not exist, HQ_ENOTSUP for any without CUDA; HQ_OK otherwise. */
static int pool_device_refused(const char *fn, int device) {
  if (device >= 0 && device < hq_device_count()) return HQ_OK;
  return hqi_error(hq_built_with_cuda() ? HQ_EINVAL : HQ_ENOTSUP, "%s: CUDA device %d %s", fn,
                   device, hq_built_with_cuda() ? "does not exist" : "asked for, but this "
                                                                     "libhqcore was built "
                                                                     "without CUDA");
}

int hq_device_mem_stats(int device, hq_mem_stats *out) {
  if (!out) return hqi_error(HQ_EINVAL, "hq_device_mem_stats: out is NULL");
  hq_mem_stats v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  /* zeroed first, so that a refusal leaves no stale counts */
  int rc = hqi_struct_out(out, &v, sizeof v, HQ_MEM_STATS_SIZE_0_3, "hq_mem_stats");
  if (!rc) rc = pool_device_refused("hq_device_mem_stats", device);
  if (!rc) rc = hqi_cuda_pool_stats(device, &v.in_use, &v.peak, &v.reserved);
  if (!rc) rc = hqi_struct_out(out, &v, sizeof v, HQ_MEM_STATS_SIZE_0_3, "hq_mem_stats");
  return rc;
}

int hq_device_mem_reset_peak(int device) {
  int rc = pool_device_refused("hq_device_mem_reset_peak", device);
  return rc ? rc : hqi_cuda_pool_reset_peak(device);
}

int hq_device_trim(int device) {
  int rc = pool_device_refused("hq_device_trim", device);
  if (rc) return rc;
  /* the workspaces' frees are stream-ordered: the pool trim below waits for the device first */
  hqi_workspaces_release(device);
  return hqi_cuda_pool_trim(device);
}

void hqi_workspaces_release(int device) {
  pthread_mutex_lock(&ws_mu);
  for (hq_ctx **pp = &ws_list; *pp;) {
    hq_ctx *c = *pp;
    if (c->device != device) {
      pp = &c->ws_next;
      continue;
    }
    /* scratch handed out now (a call of another thread) stays kept, and c on the list */
    if (kept_free(c, 0)) {
      pp = &c->ws_next;
      continue;
    }
    *pp = c->ws_next;
    c->ws_next = NULL;
    c->kept = 0;
  }
  pthread_mutex_unlock(&ws_mu);
}

int hq_ctx_device(const hq_ctx *ctx) { return ctx ? ctx->device : HQ_DEVICE_HOST; }
void *hq_ctx_stream(const hq_ctx *ctx) { return ctx ? ctx->stream : NULL; }

void *hqi_ctx_alloc_on(hq_ctx *ctx, size_t bytes, void *stream) {
  if (ctx->has_allocator)
    return ctx->allocator.alloc(ctx->allocator.user, ctx->device, bytes, stream);
  if (ctx->device < 0) return hqi_host_alloc(bytes);
  void *p = NULL;
  if (hqi_cuda_malloc(ctx->device, bytes, stream, &p)) return NULL;
  return p;
}

void hqi_ctx_free_on(hq_ctx *ctx, void *ptr, void *stream) {
  if (!ptr) return;
  if (ctx->has_allocator) ctx->allocator.free(ctx->allocator.user, ctx->device, ptr, stream);
  else if (ctx->device < 0) hqi_host_free(ptr);
  else hqi_cuda_free(ctx->device, ptr, stream);
}

void *hqi_ctx_alloc_raw(hq_ctx *ctx, size_t bytes) {
  return hqi_ctx_alloc_on(ctx, bytes, ctx->stream);
}

void hqi_ctx_free_raw(hq_ctx *ctx, void *ptr) { hqi_ctx_free_on(ctx, ptr, ctx->stream); }

/* Every use of a kept buffer is ordered on the context's stream (a call's side-stream work is
   joined back before it returns), so a buffer given back may be handed out again at once, as
   stream-ordered memory is. One handed out inside a capture is pinned: the graph writes it at
   every replay, so it is never evicted for a larger one (hq_ctx_destroy and hq_device_trim
   free it, as they do the workspace such a graph uses). A buffer allocated inside a capture is
   not kept: its allocation and free nodes belong to that graph. */
void *hqi_ctx_scratch_alloc(hq_ctx *ctx, size_t bytes, void *stream) {
  if (ctx->device < 0 || stream != ctx->stream) return hqi_ctx_alloc_on(ctx, bytes, stream);
  const int capturing = hqi_cuda_capturing(ctx->stream);
  pthread_mutex_lock(&ws_mu);
  const int f = hqi_scratch_fit(ctx->scratch, HQI_SCRATCH_SLOTS, bytes);
  if (f >= 0) {
    struct hqi_scratch *fit = &ctx->scratch[f];
    fit->busy = 1;
    fit->pinned |= capturing;
    pthread_mutex_unlock(&ws_mu);
    return fit->p;
  }
  pthread_mutex_unlock(&ws_mu);
  void *p = hqi_ctx_alloc_on(ctx, bytes, stream);
  if (!p || capturing) return p;
  pthread_mutex_lock(&ws_mu);
  const int k = hqi_scratch_slot(ctx->scratch, HQI_SCRATCH_SLOTS, bytes);
  if (k >= 0) {
    struct hqi_scratch *slot = &ctx->scratch[k];
    hqi_ctx_free_raw(ctx, slot->p);
    slot->p = p;
    slot->bytes = bytes;
    slot->busy = 1;
    slot->pinned = 0;
    ws_link(ctx);
  }
  pthread_mutex_unlock(&ws_mu);
  return p;
}

void hqi_ctx_scratch_free(hq_ctx *ctx, void *ptr, void *stream) {
  if (!ptr) return;
  pthread_mutex_lock(&ws_mu);
  for (int i = 0; ctx->device >= 0 && i < HQI_SCRATCH_SLOTS; i++) {
    struct hqi_scratch *e = &ctx->scratch[i];
    if (e->p != ptr) continue;
    if (stream == ctx->stream) {
      e->busy = 0;
      pthread_mutex_unlock(&ws_mu);
      return;
    }
    memset(e, 0, sizeof *e); /* given back on another stream: freed in that stream's order */
    break;
  }
  pthread_mutex_unlock(&ws_mu);
  hqi_ctx_free_on(ctx, ptr, stream);
}

void *hqi_ctx_side_stream(hq_ctx *ctx) {
  if (ctx->side || ctx->device < 0 || ctx->side_failed) return ctx->side;
  if (hqi_cuda_capturing(ctx->stream)) return NULL;
  if (hqi_cuda_stream_create(ctx->device, &ctx->side)) {
    hq_clear_error(); /* one stream does the same work */
    ctx->side_failed = 1;
    ctx->side = NULL;
  }
  return ctx->side;
}

int hq_ctx_alloc(hq_ctx *ctx, size_t bytes, void **out) {
  if (!ctx || !out) return hqi_error(HQ_EINVAL, "hq_ctx_alloc: NULL argument");
  *out = hqi_ctx_alloc_raw(ctx, bytes ? bytes : 1);
  if (!*out)
    return hqi_error(HQ_ENOMEM, "hq_ctx_alloc: %zu bytes on device %d failed", bytes, ctx->device);
  return HQ_OK;
}

void hq_ctx_free(hq_ctx *ctx, void *ptr) {
  if (ctx) hqi_ctx_free_raw(ctx, ptr);
}

/* the largest zeroing hqi_ctx_memset gives a kernel: one CTA of 256 threads, 16 words each */
#define HQI_ZERO_KERNEL_BYTES 16384

int hqi_ctx_memset(hq_ctx *ctx, void *dst, int value, size_t bytes) {
  if (ctx->device < 0) {
    if (bytes) memset(dst, value, bytes);
    return HQ_OK;
  }
  /* a few zero words (an amax's slots) by a kernel, which a captured step replays for about
     half a memset node's cost; larger or unaligned buffers by the memset */
  if (value == 0 && bytes && bytes <= HQI_ZERO_KERNEL_BYTES && bytes % 4 == 0 &&
      (uintptr_t)dst % 4 == 0)
    return hqi_cuda_zero_words(ctx->stream, dst, (int64_t)(bytes / 4));
  return hqi_cuda_memset(dst, value, bytes, ctx->stream);
}

int hq_ctx_memset(hq_ctx *ctx, void *dst, int value, size_t bytes) {
  if (!ctx) return hqi_error(HQ_EINVAL, "hq_ctx_memset: ctx is NULL");
  if (!dst && bytes) return hqi_error(HQ_EINVAL, "hq_ctx_memset: dst is NULL (%zu bytes)", bytes);
  if (value < 0 || value > 255)
    return hqi_error(HQ_EINVAL, "hq_ctx_memset: value %d is not a byte (0 to 255)", value);
  if (!bytes) return HQ_OK;
  if (ctx->device < 0) return hqi_ctx_memset(ctx, dst, value, bytes);
  int saved, rc = hqi_device_enter(ctx->device, &saved);
  if (rc) return rc;
  rc = hqi_ctx_memset(ctx, dst, value, bytes);
  hqi_device_leave(saved);
  if (rc) return hqi_error_prefix(rc, "hq_ctx_memset: %zu bytes on device %d", bytes, ctx->device);
  return HQ_OK;
}

int hq_ctx_memcpy(hq_ctx *ctx, void *dst, int dst_device, const void *src, int src_device,
                  size_t bytes) {
  if (!ctx || (!dst && bytes) || (!src && bytes))
    return hqi_error(HQ_EINVAL, "hq_ctx_memcpy: NULL argument");
  if ((dst_device >= 0 && dst_device != ctx->device) ||
      (src_device >= 0 && src_device != ctx->device))
    return hqi_error(HQ_EINVAL, "hq_ctx_memcpy: device %d/%d is not the context's device %d",
                     dst_device, src_device, ctx->device);
  if (dst_device < 0 && src_device < 0) {
    memmove(dst, src, bytes);
    return HQ_OK;
  }
  int saved, rc = hqi_device_enter(ctx->device, &saved);
  if (rc) return rc;
  rc = hqi_cuda_memcpy(dst, dst_device, src, src_device, bytes, ctx->stream);
  hqi_device_leave(saved);
  return rc;
}

int hq_ctx_sync(hq_ctx *ctx) {
  if (!ctx) return hqi_error(HQ_EINVAL, "hq_ctx_sync: ctx is NULL");
  if (ctx->device < 0) return HQ_OK;
  int saved, rc = hqi_device_enter(ctx->device, &saved);
  if (rc) return rc;
  rc = hqi_cuda_sync(ctx->stream);
  hqi_device_leave(saved);
  return rc;
}

int hq_ctx_capturing(const hq_ctx *ctx, int *capturing) {
  if (capturing) *capturing = 0;
  if (!ctx) return hqi_error(HQ_EINVAL, "hq_ctx_capturing: ctx is NULL");
  if (!capturing) return hqi_error(HQ_EINVAL, "hq_ctx_capturing: capturing is NULL");
  if (ctx->device < 0) return HQ_OK;
  /* the legacy default stream (a NULL stream) is the current device's */
  int saved, rc = hqi_device_enter(ctx->device, &saved);
  if (!rc) rc = hqi_cuda_capture_query(ctx->stream, capturing);
  hqi_device_leave(saved);
  if (rc) return hqi_error_prefix(rc, "hq_ctx_capturing: CUDA device %d", ctx->device);
  return HQ_OK;
}

uint64_t hq_ctx_seed(const hq_ctx *ctx) { return ctx ? ctx->seed : 0; }
uint64_t hq_ctx_rng_offset(const hq_ctx *ctx) { return ctx ? ctx->offset : 0; }

/* The step on the host: every role's count restarts with it. */
static void set_offset_host(hq_ctx *ctx, uint64_t offset) {
  ctx->offset = offset;
  if (ctx->rng) memset(ctx->rng, 0, ctx->rng_cap * sizeof *ctx->rng);
  ctx->rng_n = 0;
}

/* The step's copy on the device (ctx->offset_dev), allocated at the first set or ask, then
   rewritten in stream order: a graph replay that follows on the stream reads the step set
   before it. `write`: queue the write of offset there. */
static int set_offset_dev(hq_ctx *ctx, uint64_t offset, int write, const char *fn) {
  int saved, rc = hqi_device_enter(ctx->device, &saved);
  if (rc) return rc;
  if (!ctx->offset_dev) {
    ctx->offset_dev = hqi_ctx_alloc_raw(ctx, sizeof *ctx->offset_dev);
    if (!ctx->offset_dev)
      rc = hqi_error(HQ_ENOMEM, "%s: 8 bytes for the step on CUDA device %d", fn, ctx->device);
  }
  if (!rc && write) rc = hqi_cuda_set_u64(ctx->stream, ctx->offset_dev, offset);
  hqi_device_leave(saved);
  return rc;
}

int hq_ctx_rng_offset_device(hq_ctx *ctx, uint64_t **out) {
  if (out) *out = NULL;
  if (!ctx || !out) return hqi_error(HQ_EINVAL, "hq_ctx_rng_offset_device: NULL argument");
  if (ctx->device < 0)
    return hqi_error(HQ_EINVAL, "hq_ctx_rng_offset_device: a host context keeps no device step");
  const int rc = set_offset_dev(ctx, 0, 0, "hq_ctx_rng_offset_device");
  if (rc) return rc;
  *out = ctx->offset_dev;
  return HQ_OK;
}

int hq_ctx_set_rng_offset_ex(hq_ctx *ctx, uint64_t offset, uint32_t flags) {
  if (!ctx) return hqi_error(HQ_EINVAL, "hq_ctx_set_rng_offset_ex: ctx is NULL");
  if (flags & ~HQ_RNG_OFFSET_HOST_ONLY)
    return hqi_error(HQ_EINVAL, "hq_ctx_set_rng_offset_ex: unknown flags 0x%x",
                     (unsigned)(flags & ~HQ_RNG_OFFSET_HOST_ONLY));
  if (!(flags & HQ_RNG_OFFSET_HOST_ONLY)) return hq_ctx_set_rng_offset(ctx, offset);
  set_offset_host(ctx, offset);
  return HQ_OK;
}

int hq_ctx_set_rng_offset(hq_ctx *ctx, uint64_t offset) {
  if (!ctx) return hqi_error(HQ_EINVAL, "hq_ctx_set_rng_offset: ctx is NULL");
  if (ctx->device >= 0) {
    /* a write captured into a graph would set the step of every replay to this one
       (hq_ctx_capturing asks with the context's device current: a NULL stream is that
       device's legacy stream, not the caller's current device's) */
    int capturing = 0, rc = hq_ctx_capturing(ctx, &capturing);
    if (rc) return hqi_error_prefix(rc, "hq_ctx_set_rng_offset");
    if (capturing)
      return hqi_error(HQ_ESTATE, "hq_ctx_set_rng_offset: the context's stream is being "
                       "captured into a CUDA graph: set the step before the capture and before "
                       "each replay, outside the graph");
    rc = set_offset_dev(ctx, offset, 1, "hq_ctx_set_rng_offset");
    if (rc) return rc;
  }
  set_offset_host(ctx, offset);
  return HQ_OK;
}

uint64_t hqi_role_key(const char *role) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a-64: offset basis, then the prime 0x100000001b3 */
  for (const unsigned char *c = (const unsigned char *)(role ? role : ""); *c; c++)
    h = (h ^ *c) * 0x100000001b3ull;
  return h ? h : 1;
}

static struct hqi_rng_slot *rng_slot(struct hqi_rng_slot *t, size_t cap, uint64_t key) {
  size_t i = (size_t)hq_splitmix64(key) & (cap - 1);
  while (t[i].key && t[i].key != key) i = (i + 1) & (cap - 1);
  return &t[i];
}

int hqi_ctx_rng_next(hq_ctx *ctx, uint64_t role_key, uint64_t *offset, uint64_t *count) {
  if (2 * (ctx->rng_n + 1) > ctx->rng_cap) { /* at most half full: short probe chains */
    const size_t cap = ctx->rng_cap ? 2 * ctx->rng_cap : 64;
    struct hqi_rng_slot *t = hqi_calloc(cap, sizeof *t);
    if (!t) return hqi_error(HQ_ENOMEM, "the random stream's count of %zu roles", ctx->rng_n + 1);
    for (size_t i = 0; i < ctx->rng_cap; i++)
      if (ctx->rng[i].key) *rng_slot(t, cap, ctx->rng[i].key) = ctx->rng[i];
    free(ctx->rng);
    ctx->rng = t;
    ctx->rng_cap = cap;
  }
  struct hqi_rng_slot *s = rng_slot(ctx->rng, ctx->rng_cap, role_key);
  if (!s->key) {
    s->key = role_key;
    ctx->rng_n++;
  }
  *offset = hq_rng_offset(ctx->offset, role_key, s->count);
  *count = s->count++;
  return HQ_OK;
}

void hqi_call_init(hq_ctx *ctx, hq_call *call, uint32_t flags, uint64_t offset) {
  memset(call, 0, sizeof *call);
  call->struct_size = sizeof *call;
  call->flags = flags;
  call->device = ctx->device;
  call->stream = ctx->stream;
  call->seed = ctx->seed;
  call->offset = offset;
  call->host = &hqi_host_api;
  call->core_private = ctx;
}
