/*
** hq_internal.h -- declarations shared by the files of libhqcore (never installed).
** Every core .c file includes "config.h" and then this header first.
*/
#ifndef HQ_INTERNAL_H
#define HQ_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include "hq/hq.h"
#include "hqi_cuda.h"

/* Internal cross-file functions are hqi_*; file-local ones are static. */

// --- errors (error.c; hqi_error in hqi_cuda.h) --------------------------------------------
int hqi_verror(int code, const char *fmt, va_list ap);
/* Prepend "<prefix>: " to the thread's last error; returns code. */
int hqi_error_prefix(int code, const char *fmt, ...) HQ_PRINTF(2, 3);
/* Every status a module (a format plugin or a GEMM provider) returns passes here, where the core
   receives it: an hq_status comes back as it is; any other value (a broken module: -7, 12345) is
   HQ_EINTERNAL with a message naming the module, the op and the value (and keeping the module's
   own message), so that it can pass neither for success nor for another status's meaning. */
int hqi_plugin_rc(int rc, const char *module, const char *op);
void hqi_log(const hq_ctx *ctx, int level, const char *fmt, ...) HQ_PRINTF(3, 4);
extern const hq_host_api hqi_host_api;

// --- small utilities (util.c) --------------------------------------------------------------
/* malloc / calloc that count failures (hqi_oom_events): every helper here counts its own. */
void *hqi_malloc(size_t bytes);
void *hqi_calloc(size_t n, size_t size);
uint64_t hqi_oom_events(void);
void hqi_oom_note(void);
char *hqi_strdup(const char *s);
char *hqi_strndup(const char *s, size_t n);
char *hqi_asprintf(const char *fmt, ...) HQ_PRINTF(1, 2);
/* Growable array of pointers. */
typedef struct hqi_vec { void **v; size_t n, cap; } hqi_vec;
int hqi_vec_push(hqi_vec *a, void *p);
void hqi_vec_free(hqi_vec *a);
/* 64-byte aligned host memory. */
void *hqi_host_alloc(size_t bytes);
void hqi_host_free(void *p);
/* The module name rule (1-31 of [a-z0-9_]): 1, or 0 with the reason in why. */
int hqi_name_ok(const char *kind, const char *name, char *why, size_t len);
/* The module version rule (same major, minor no newer): 1, or 0 with the reason in why. */
int hqi_abi_compatible(const char *abi, unsigned major, unsigned minor, unsigned core_major,
                       unsigned core_minor, char *why, size_t len);
/* The bytes of a buffer of `dtype` and shape[0..ndim): 1 with *bytes set, 0 for an unknown dtype,
   an ndim outside 1..HQ_MAX_BUFFER_DIMS, a negative extent or a size past SIZE_MAX. */
int hqi_shape_bytes(hq_dtype dtype, int ndim, const int64_t *shape, size_t *bytes);
/* Copy a caller's versioned struct (struct_size bytes, at least `floor`) into a zeroed `dst` of
   dst_size bytes: an older, smaller struct leaves the newer fields zero; a newer, larger one
   contributes the fields this core knows. */
int hqi_struct_in(void *dst, size_t dst_size, const void *src, size_t src_size, size_t floor,
                  const char *what);
/* Write src (src_size bytes, struct_size first) into a caller's versioned struct dst: at most
   the dst->struct_size bytes the caller set (at least floor), and struct_size set to what was
   written. */
int hqi_struct_out(void *dst, const void *src, size_t src_size, size_t floor, const char *what);
/* A caller's hq_role, checked (struct_size) and copied into *out. */
int hqi_role_in(const hq_role *role, const char *what, hq_role *out);
/* Element i of a caller's array of versioned structs with stride elem_size: get copies at most
   dst_size bytes into a zeroed dst (an older, smaller element leaves the newer fields zero); put
   writes at most elem_size bytes of src. */
void hqi_elem_get(void *dst, size_t dst_size, const void *base, size_t i, size_t elem_size);
void hqi_elem_put(void *base, size_t i, size_t elem_size, const void *src, size_t src_size);
/* Check a caller's hq_tensor (struct_size, dtype, shape, data) and copy it into *out. */
int hqi_tensor_in(const hq_tensor *t, const char *what, hq_tensor *out);
int hqi_check_tensor(const hq_tensor *t, const char *what);
/* The largest tensor the core hands a format: 2^48 elements, so that every size and round-up a
   format computes from its dimensions stays far from int64_t / size_t overflow. */
#define HQI_MAX_ELEMENTS_LOG2 48
#define HQI_MAX_ELEMENTS ((int64_t)1 << HQI_MAX_ELEMENTS_LOG2)
int hqi_check_shape(int64_t rows, int64_t cols, const char *what);
/* Element-wise convert n high-precision values (F32/F16/BF16) on `device` (the host, or a CUDA
   device on `stream`). Equal dtypes copy bytes, so NaN payloads and signed zeros pass through;
   otherwise hq/numerics.h's rounding, the same on both. */
int hqi_convert(int device, void *stream, void *dst, int dt, const void *src, int st, int64_t n);

// --- the host's floating-point mode ---------------------------------------------------------
/* hq's host arithmetic is IEEE binary32 with subnormals and rounding to nearest: the formats'
   rules (and the bytes the CPU path must share with the GPU's) need both. A process may flush
   subnormals -- x86's MXCSR FTZ and DAZ bits, which code linked with -ffast-math or -Ofast sets
   at start-up, or a framework's "flush denormal" switch; AArch64's FPCR.FZ -- or round another
   way (fesetround), and would then change hq's CPU results silently. Every host computation of
   the core (the plugins' operations on a host context, their configure, init_state and
   update_state, the CPU GEMM, AdamW and its constants, the conversions) runs between
   hqi_fp_enter(), which clears those bits (HQI_FP_BITS: MXCSR FTZ, DAZ and RC; FPCR FZ and
   RMode) where they are set and returns the caller's mode, and hqi_fp_leave(), which puts it
   back. */
typedef unsigned long long hqi_fpenv; /* the caller's MXCSR / FPCR */
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#define HQI_FP_BITS 0xe040ull /* FTZ (bit 15), RC (bits 13-14), DAZ (bit 6) */
static inline hqi_fpenv hqi_fp_get(void) { return _mm_getcsr(); }
static inline void hqi_fp_set(hqi_fpenv m) { _mm_setcsr((unsigned)m); }
#elif defined(__aarch64__)
#define HQI_FP_BITS ((1ull << 24) | (3ull << 22)) /* FZ, RMode */
static inline hqi_fpenv hqi_fp_get(void) {
  hqi_fpenv m;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(m));
  return m;
}
static inline void hqi_fp_set(hqi_fpenv m) {
  __asm__ __volatile__("msr fpcr, %0" : : "r"(m) : "memory");
}
#else
#define HQI_FP_BITS 0ull
static inline hqi_fpenv hqi_fp_get(void) { return 0; }
static inline void hqi_fp_set(hqi_fpenv m) { (void)m; }
#endif
static inline hqi_fpenv hqi_fp_enter(void) {
  const hqi_fpenv m = hqi_fp_get();
  if (m & HQI_FP_BITS) hqi_fp_set(m & ~HQI_FP_BITS);
  return m;
}
static inline void hqi_fp_leave(hqi_fpenv m) {
  if (m & HQI_FP_BITS) hqi_fp_set(m);
}

// --- devices (device.c) --------------------------------------------------------------------
int hqi_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                    void *stream);
int hqi_cuda_sync(void *stream);
int hqi_cuda_arch(int device);
/* Wait for the device, then hand what hq's memory pool of it keeps back to the driver. */
int hqi_cuda_pool_trim(int device);
/* hq's memory pool of `device` (an existing device): bytes in use, their peak since the last
   hqi_cuda_pool_reset_peak, bytes reserved; all zero while the pool has not been made. */
int hqi_cuda_pool_stats(int device, uint64_t *in_use, uint64_t *peak, uint64_t *reserved);
int hqi_cuda_pool_reset_peak(int device);
/* Whether work queued on `stream` is being captured into a CUDA graph (an invalidated capture
   counts). hqi_cuda_capturing answers 0 when CUDA cannot tell; hqi_cuda_capture_query returns
   that failure (HQ_EDEVICE, CUDA's message), e.g. for the legacy default stream while another
   stream of the device is being captured. */
int hqi_cuda_capturing(void *stream);
int hqi_cuda_capture_query(void *stream, int *capturing);
/* Ordering between streams, without host synchronization: hqi_cuda_stream_after makes the work
   queued on `waiter` from now on wait for what is queued on `signaler` so far; an event recorded
   with hqi_cuda_event_record (created at its first use) can be waited on later, even after the
   stream it was recorded on is gone. */
int hqi_cuda_stream_after(void *waiter, void *signaler);
int hqi_cuda_event_record(void **ev, void *stream);
int hqi_cuda_stream_wait_event(void *stream, void *ev);
/* hqi_cuda_event_record for a use of a qtensor's buffers on a foreign stream, which its owner's
   stream waits for before a free: inside a capture it is an external event node (recorded at
   each replay), since an event last recorded by a capture cannot be waited on outside it. */
int hqi_cuda_event_record_use(void **ev, void *stream);
void hqi_cuda_event_destroy(void *ev);
/* A stream of its own on `device` (non-blocking: it orders only with what it waits for), and its
   end (after the work queued on it). */
int hqi_cuda_stream_create(int device, void **out);
void hqi_cuda_stream_destroy(void *stream);
/* Make `device` current (a no-op for the host), remembering the caller's current device in
   *saved; hqi_device_leave(saved) restores it. */
int hqi_device_enter(int device, int *saved);
void hqi_device_leave(int saved);
int hqi_cuda_memset(void *dst, int value, size_t bytes, void *stream);
/* The kernels of core/cuda/kernels.cu: hqi_cuda.h. */

// --- GEMMs ----------------------------------------------------------------------------------
/* hqi_lt_matmul and hqi_call_workspace: hqi_cuda.h. */
/* Free the workspaces of every context of `device` (hq_device_trim). */
void hqi_workspaces_release(int device);

/* A GEMM provider (hq/gemm_provider.h): a zero-extended copy of its table, where it came from. */
typedef struct hqi_provider {
  hq_gemm_provider ops;
  char *file;                     /* the module, or HQI_BUILTIN_FILE */
  void *handle;                   /* dlopen handle; NULL for a built-in provider */
} hqi_provider;
/* The services providers get (gemm_host.c). */
extern const hq_gemm_host hqi_gemm_host;
/* The built-in providers (gemm/cublaslt, gemm/fused_hopper, gemm/emulated), checked once. */
size_t hqi_providers_builtin(const hqi_provider *const **out);
/* Check a provider table (ABI, size, name, required operations) into *out; on failure write the
   reason into why and return 0. */
int hqi_provider_check(const hq_gemm_provider *t, hqi_provider *out, char *why, size_t len);
/* The GEMM providers hq_gemm asks for operands of sets a and b (either may be NULL), in its
   order: highest priority first, ties in the order found (a's modules, b's, then the built-in
   ones), each once, at most cap; hq_plugins_gemm_info lists the same. Returns the count. */
size_t hqi_providers_ordered(const hq_plugins *a, const hq_plugins *b, const hqi_provider **out,
                             size_t cap);

/* One operand of a GEMM as the core resolved it; pub.handle points back at it, so that the
   services (gemm_host.c) find its format. */
typedef struct hqi_gop {
  hq_gemm_operand pub;
  hq_gemm_operand_kind kind;
  const hq_qtensor *qt;           /* quantized, or NULL */
  const struct hqi_format *fmt;   /* that direction's format */
  hq_tensor hp;                   /* a high-precision operand's checked copy */
  const char *label;              /* "A" / "B" */
  const char *what;               /* the call, for messages */
} hqi_gop;

/* The most GEMM providers one GEMM asks (a choice's accepted bits fit a uint32_t). */
#define HQI_GEMM_CANDIDATES 12

// --- contexts (ctx.c) ----------------------------------------------------------------------
#include "scratch.h"
/* Scratch buffers a context keeps: an emulated GEMM holds up to five at once (two operands, their
   row factors, the alpha slot); the rest hold the step's other sizes. */
#define HQI_SCRATCH_SLOTS 8
struct hq_ctx {
  int refs;                 /* the caller's (until hq_ctx_destroy) + one per live qtensor and
                               hq_state made on it: the context ends when the last one goes */
  int device;
  int arch;                 /* compute capability of the device (0 on the host), read once */
  void *stream;
  hq_allocator allocator;
  int has_allocator;
  void (*log)(void *user, int level, const char *msg);
  void *log_user;
  uint64_t seed;
  uint64_t offset;          /* the step of the random stream (hq_ctx_set_rng_offset) */
  uint64_t *offset_dev;     /* its copy on the device (hq_call.offset_dev), from the first set
                               on a CUDA context; NULL before */
  struct hqi_rng_slot *rng; /* calls per role key since the step was set (hqi_ctx_rng_next) */
  size_t rng_cap, rng_n;
  void *workspace;          /* the cuBLASLt runner's (hqi_call_workspace), or NULL */
  size_t workspace_bytes;
  struct hq_ctx *ws_next;   /* the list of contexts holding a workspace (ctx.c) */
  struct hqi_gemm_choice *gemm_cache; /* the GEMM providers' answers (gemm.c), or NULL */
  void *side;               /* a second stream of the device for work that may run beside the
                               context's (hqi_ctx_side_stream), or NULL before its first use */
  void *side_ev[2];         /* the fork and join events between the two, or NULL */
  int side_failed;          /* making the side stream failed once: not asked again */
  int kept;                 /* on ctx.c's list of contexts keeping device memory between calls
                               (a workspace or scratch), which hq_device_trim releases */
  struct hqi_scratch scratch[HQI_SCRATCH_SLOTS]; /* call scratch kept between calls
                                                   (hqi_ctx_scratch_alloc, scratch.h) */
};
/* The random stream (hq_call.offset) of the next quantize or update of the role whose key is
   `role_key` (hqi_role_key) on ctx: a mix of the key, the context's step and how many calls of
   that role the step has seen, so that a role's draws depend on nothing another role does;
   *count: that count (hq_call.role_count). HQ_ENOMEM when the count cannot be kept. */
int hqi_ctx_rng_next(hq_ctx *ctx, uint64_t role_key, uint64_t *offset, uint64_t *count);
uint64_t hqi_role_key(const char *role);
/* A qtensor or an hq_state keeps the context that owns its memory alive. */
hq_ctx *hqi_ctx_retain(hq_ctx *ctx);
void hqi_ctx_release(hq_ctx *ctx);
void *hqi_ctx_alloc_raw(hq_ctx *ctx, size_t bytes);
void hqi_ctx_free_raw(hq_ctx *ctx, void *ptr);
/* The same, ordered on `stream` (a plugin call's, which may be the side stream) instead of the
   context's. */
void *hqi_ctx_alloc_on(hq_ctx *ctx, size_t bytes, void *stream);
void hqi_ctx_free_on(hq_ctx *ctx, void *ptr, void *stream);
/* Scratch for the duration of one call (host->alloc, an emulated GEMM's dequantized operands):
   on a CUDA context's own stream, from buffers the context keeps between calls, so that a step
   captured after an eager one holds no allocation nodes (a graph's memory nodes hold its GEMMs
   back from the other streams' work); elsewhere, or when none fits, hqi_ctx_alloc_on. Given back by
   hqi_ctx_scratch_free, which frees what was not kept. */
void *hqi_ctx_scratch_alloc(hq_ctx *ctx, size_t bytes, void *stream);
void hqi_ctx_scratch_free(hq_ctx *ctx, void *ptr, void *stream);
/* The context's side stream (made at the first ask, never during a capture of the context's
   stream, so that the capture does not hold it), or NULL on the host, during a capture before
   one exists, or when it cannot be made (no error recorded: the caller runs on one stream). */
void *hqi_ctx_side_stream(hq_ctx *ctx);
/* Fill an hq_call for one plugin operation on ctx. `offset` selects the random stream: every
   plugin call of one quantize/update operation gets the same offset (the directions of a
   tensor draw the same numbers whether they are made by one call or by two). */
void hqi_call_init(hq_ctx *ctx, hq_call *call, uint32_t flags, uint64_t offset);
int hqi_ctx_memset(hq_ctx *ctx, void *dst, int value, size_t bytes);

// --- plugins (loader.c) --------------------------------------------------------------------
struct hq_plugin {
  char *file;
  void *handle;
  hq_format_ops ops;        /* a zero-extended copy of the module's table (struct_size bytes);
                               ops.options points at `opts` */
  hq_option *opts;          /* the module's option table read at its option_size stride, each
                               entry zero-extended to this header's hq_option, NULL-ended */
  const char **opt_text;    /* the option names [0, n) and defaults [n, 2n), in opts' block */
  size_t n_options;
};
void hqi_plugins_retain(hq_plugins *set);
#define HQI_BUILTIN_FILE "(built into libhqcore)"
int hqi_builtin_register(hq_plugins *set);
/* The built-in identity format's entry function: plugins/identity/identity.c compiled with
   HQ_FORMAT_BUILTIN=hqi_identity_module (hq/plugin.h's HQ_FORMAT_DEFINE). */
const hq_format_ops *hqi_identity_module(const hq_host_api *host);

// --- options (options.c) -------------------------------------------------------------------
/* Parse `text` as a value of option `opt`; on failure write a message into err. */
int hqi_option_parse(const hq_option *opt, const char *text, hq_optval *out, char *err,
                     size_t err_len);
/* Validate an option table entry (used when loading a module). */
int hqi_option_check(const hq_option *opt, char *err, size_t err_len);

// --- format instances (format.c) --------------------------------------------------------------
/* A configured format instance: one [format] section (or an implicit one). Refcounted; it keeps
   its plugin set alive. */
typedef struct hqi_format {
  int refs;
  uint64_t id;               /* unique in the process (never reused): a cache key */
  char *name;
  const hq_plugin *plugin;
  hq_plugins *set;
  void *cfg;
  hq_optval *vals;
  char **val_text;           /* resolved value text per option (for hq recipe check / info) */
  uint64_t caps;
} hqi_format;
/* Build an instance: texts[i] is the recipe value for options[i] or NULL for its default.
   On error the message names the option; the caller adds file:line. */
int hqi_format_create(const char *name, const hq_plugin *plugin, hq_plugins *set,
                      const char *const *texts, hqi_format **out);
hqi_format *hqi_format_retain(hqi_format *f);
void hqi_format_release(hqi_format *f);

// --- glob roles (role.c) -------------------------------------------------------------------
typedef struct hqi_pattern {
  char *part[3];
  int stars;                /* '*' wildcards, over the three parts */
  int qmarks;               /* '?' wildcards */
  int literals;             /* literal characters */
} hqi_pattern;
int hqi_pattern_parse(const char *text, hqi_pattern *out, char *err, size_t err_len);
void hqi_pattern_free(hqi_pattern *p);
int hqi_pattern_match(const hqi_pattern *p, const hq_role *role);
/* >0 when a is more specific than b, <0 when less, 0 when equal. */
int hqi_pattern_compare(const hqi_pattern *a, const hqi_pattern *b);
/* Whether every role matched by `inner` is matched by `outer` (decided conservatively: a "no"
   may be a missed containment, a "yes" is always right). */
int hqi_pattern_contains(const hqi_pattern *outer, const hqi_pattern *inner);

// --- quantized tensors (quantizer.c; fsdp.c reads them) -------------------------------------
typedef struct hqi_qdir {
  int present;
  hq_storage st;
  uint8_t owned[HQ_MAX_BUFFERS];   /* 1: this storage owns its buffer i; 0: it aliases rowwise */
  char own_name[HQ_MAX_BUFFERS][48]; /* "columnwise_<name>" of a shared buffer made private */
} hqi_qdir;

struct hq_qtensor {
  hq_ctx *ctx;               /* the owner: its allocator made (and frees) the buffers */
  hqi_format *fmt[2];
  uint32_t usage;
  int source;
  char *role;
  int64_t rows, cols;
  hq_dtype nominal;
  hqi_qdir d[2];
  int saved;
  uint64_t offset;           /* random stream of the operation in progress */
  uint64_t role_count;       /* ... its role's count of operations in the step (hq_call) */
  uint64_t role_key;         /* hqi_role_key(role): its random streams' key */
  void *scratch;             /* plugin scratch reserved for quantize/update (owner's memory) */
  size_t scratch_bytes;
  void *fsdp_staging;        /* hq_fsdp_extract's transposed copies (owner's memory) */
  void *last_use;            /* cudaEvent_t recorded on the stream of the last call that touched
                                the buffers from another context's stream, or NULL: what the
                                owner's stream waits for before it frees any of them */
  hq_state *state;           /* the quantizer's scaling state (retained), or NULL */
  int32_t slice[2];          /* its slice per direction (state.c), -1: none */
  uint32_t aliased;          /* directions whose data buffer is the caller's source, borrowed
                                (HQ_QUANTIZE_ALIAS): never written, freed, moved or saved */
};
/* A qtensor's buffers belong to its owner context (qt->ctx); a call on another context's stream
   orders itself after what the owner allocated for it, leaves an event (last_use) that the
   owner's stream waits for before it frees any buffer (quantizer.c). */
int hqi_qtensor_foreign_alloc(const hq_qtensor *qt, const hq_ctx *ctx);
int hqi_qtensor_mark_use(hq_qtensor *qt, const hq_ctx *ctx);
int hqi_qtensor_owner_frees(const hq_qtensor *qt);

// --- buffer forms (forms.c, plugin ABI 2.4) --------------------------------------------------
/* Whether format f moves buffers itself for `purpose` (HQ_FORM_FSDP: it has fsdp_extract and
   fsdp_assign; HQ_FORM_SAVE: save and restore; buffer_form comes with either). */
int hqi_format_has_forms(const hqi_format *f, uint32_t purpose);
/* The form of buffer i of storage st for `purpose`, checked (HQ_EABI naming role and buffer when
   invalid), its bytes computed, ptr NULL; ndim 0 when the buffer has none (always, when f has
   no ops for the purpose). */
int hqi_buffer_form(const hqi_format *f, const hq_storage *st, uint32_t i, uint32_t purpose,
                    const char *role, hq_buffer_form *out);
/* Run the module's op on ctx's stream: write form->ptr from buffer i (fsdp_extract, save) or
   buffer i from form->ptr (fsdp_assign, restore). The caller has entered ctx's device. */
int hqi_form_write(const hqi_format *f, hq_ctx *ctx, const hq_storage *st, uint32_t i,
                   const hq_buffer_form *form, uint32_t purpose, const char *role);
int hqi_form_read(const hqi_format *f, hq_ctx *ctx, hq_storage *st, uint32_t i,
                  const hq_buffer_form *form, uint32_t purpose, const char *role);

// --- scaling state (state.c) ----------------------------------------------------------------
hq_state *hqi_state_retain(hq_state *st);
void hqi_state_release(hq_state *st);
/* Floats of state format f keeps for a slice serving dirs (0: stateless). */
uint32_t hqi_format_state_floats(const hqi_format *f, uint32_t dirs);
/* Reserve (or find again) the slice of (role, f, dirs); *id = -1 when f keeps no state. */
int hqi_state_reserve(hq_state *st, hqi_format *f, uint32_t dirs, const char *role, int32_t *id);
/* The slice's state and amax for a call on ctx (lays out and allocates the buffer on first use;
   ctx must run on the state's device). */
int hqi_state_slice_ptrs(hq_state *st, const hq_ctx *ctx, int32_t id, float **state,
                         float **amax);
/* Position of slice id in the current layout. */
void hqi_state_slice_info(hq_state *st, int32_t id, hq_state_slice *out);

// --- recipes (recipe.c) --------------------------------------------------------------------
hqi_format *hqi_recipe_format_of(hq_recipe *r, long role_index, uint32_t dir, int *source);

#endif /* HQ_INTERNAL_H */
