/*
** hq/hq.h -- the public API of libhqcore, for trainers that embed it.
**
** This is the header an embedder starts from (it pulls in hq/plugin.h for the shared types:
** hq_status, hq_dtype, hq_tensor, hq_storage); hq/train.h adds the trainer services built on it
** (AdamW with the quantized write-back, safetensors checkpoints: libhqtrain). Link with
** `pkg-config --libs hqcore`, which gives both libraries.
**
** The objects, in the order a trainer meets them:
**   hq_ctx        where work runs: host or a CUDA device + stream, allocator hooks, logger.
**   hq_plugins    the loaded format modules (found on the plugin search path).
**   hq_recipe     a parsed recipe .ini: [format] instances and [role] sections.
**   hq_quantizer  what a role resolves to: one format per direction + usage flags.
**   hq_qtensor    a quantized tensor: up to two storages (ROWWISE, COLWISE).
**   hq_state      the scaling state of a recipe's quantizers (delayed scaling): one buffer.
**
** Conventions
**   - Every function that can fail returns an hq_status (0 = HQ_OK). The message of the last
**     failure on this thread is hq_last_error(); it names the object and the cause (and
**     file:line for recipes). Nothing in libhqcore aborts or exits the process.
**   - Objects are not thread-safe; distinct objects may be used from distinct threads. Objects
**     that only hand out what they hold -- a plugin set, a recipe once parsed, the format
**     instances behind quantizers -- may be shared between threads (their counts are atomic,
**     and their queries write nothing).
**   - A context lives until hq_ctx_destroy AND the last quantized tensor and scaling state made
**     on it are freed (their memory goes back through its allocator): destroying it first is
**     allowed, logs a warning, and keeps its allocator in use until then.
**   - Host arithmetic is IEEE (subnormals, round to nearest) whatever the caller's mode: a
**     computing call clears the thread's flush-to-zero and rounding bits (x86 MXCSR FTZ, DAZ,
**     RC; AArch64 FPCR.FZ, RMode) for its duration and restores them (docs/embedding.md,
**     section 13).
**   - Lifetimes: a quantizer and a qtensor keep the formats they use alive (the recipe may be
**     freed first).
**   - Versioned structs: every struct the caller fills starts with struct_size (set it to
**     sizeof(the struct); older, smaller sizes down to the documented floor are accepted and
**     their missing fields read as zero). Arrays of structs are passed with their element size.
**
** Contexts, streams and devices (the per-call contract)
**   - The context passed to a call is authoritative for that call: its device must be the
**     tensor's, all device work of the call is queued on its stream in order, and its allocator
**     provides the call's scratch and temporaries. No call synchronizes the stream unless its
**     documentation says so (hq_ctx_sync, hq_ctx_memcpy to or from host memory). One
**     exception to "on its stream": an emulated GEMM may dequantize its two operands side by
**     side, one of them on a second, non-blocking stream the context makes for itself at its
**     first such GEMM outside a capture (and destroys with the context); that stream waits for
**     the context's stream first and the context's stream waits for it before the call
**     returns, so to the caller the call is ordered on the context's stream as any other (and a
**     captured graph holds the two as parallel branches). Its scratch from the allocator is
**     requested with that stream.
**   - The buffers of a qtensor belong to the context that made it (hq_quantize, hq_make_empty):
**     they are allocated and freed through its allocator, on its stream. Using a qtensor on
**     another stream of the same device is allowed; order that stream's work before freeing the
**     qtensor (as with any stream-ordered memory).
**   - Device memory comes, by default, from hq's own stream-ordered memory pool of the device
**     (cudaMallocFromPoolAsync / cudaFreeAsync on the context's stream), which keeps what hq
**     frees for hq's next allocations (hq_device_trim hands it back; the process's default pool
**     is left alone); an hq_allocator replaces it and receives the stream with every request
**     and release. A call's scratch on a CUDA context's own stream (an emulated GEMM's
**     dequantized operands, a format module's scratch) comes from up to 8 buffers the context
**     keeps between calls, so that a step captured into a CUDA graph after an eager one holds
**     no allocation nodes (they hold the GEMMs back from other streams' work); as with the GEMM
**     workspace, a graph captured on the context's stream uses them when replayed: replay it
**     while the context lives and before hq_device_trim, which frees them with the workspaces.
**   - A call that touches a CUDA device makes the context's device current for its duration and
**     restores the caller's current device before it returns.
**   - hq_qtensor_update queues no allocation and no synchronization (its scratch was reserved
**     when the qtensor was made): it can be captured in a CUDA graph. Two exceptions allocate
**     (stream-ordered): a quantizer with columnwise_source = rowwise_dequantized (a temporary
**     of the source's size for the dequantized copy), and the first update of one direction
**     alone of a tensor whose two directions share a buffer (the direction left alone receives
**     its own copy, once). A captured stochastic rounding draws from the step the context holds
**     at each replay: set it (hq_ctx_set_rng_offset) before the capture and before every
**     replay, outside the graph, or write its device word yourself (hq_ctx_rng_offset_device;
**     docs/embedding.md, section 11).
**
** Example
**     hq_ctx *ctx;       hq_ctx_create(NULL, &ctx);                     // host
**     hq_recipe *r;      if (hq_recipe_load("recipe.ini", NULL, &r)) die(hq_last_error());
**     hq_role role = hq_role_of("linear", "weight", "layers.3.fc2");
**     hq_quantizer *q;   hq_quantizer_create(r, &role, &q);
**     hq_tensor w = hq_tensor_2d(ptr, HQ_BF16, HQ_DEVICE_HOST, 4096, 1024);
**     hq_qtensor *qw;    hq_quantize(q, ctx, &w, &qw);                  // both directions
**     ...                hq_qtensor_update(qw, ctx, &w);                // optimizer write-back
**     hq_qtensor_free(qw); hq_quantizer_free(q); hq_recipe_free(r); hq_ctx_destroy(ctx);
*/
#ifndef HQ_HQ_H
#define HQ_HQ_H

#include <stddef.h>
#include <stdint.h>
#include "hq/plugin.h"
#include "hq/gemm_provider.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HQ_API __attribute__((visibility("default")))
#else
#define HQ_API
#endif

/* A struct the caller fills (every one starts with struct_size), declared with struct_size set
   and every other field zero -- the form that stays warning-free under -Wall -Wextra, where the
   positional `hq_gemm_info info = {sizeof info};` warns (-Wmissing-field-initializers):
       hq_gemm_info info = HQ_STRUCT_INIT(hq_gemm_info);    (or HQ_GEMM_INFO_INIT)
   C99 designated initializers (C++20 in C++). The named forms are the same for each struct. */
#define HQ_STRUCT_INIT(type) {.struct_size = (uint32_t)sizeof(type)}
#define HQ_CTX_DESC_INIT HQ_STRUCT_INIT(hq_ctx_desc)
#define HQ_RECIPE_OPTS_INIT HQ_STRUCT_INIT(hq_recipe_opts)
#define HQ_FORMAT_INFO_INIT HQ_STRUCT_INIT(hq_format_info)
#define HQ_ROLE_INFO_INIT HQ_STRUCT_INIT(hq_role_info)
#define HQ_GEMM_PROVIDER_INFO_INIT HQ_STRUCT_INIT(hq_gemm_provider_info)
#define HQ_FORMAT_SPEC_INIT HQ_STRUCT_INIT(hq_format_spec)
#define HQ_QUANTIZE_ARGS_INIT HQ_STRUCT_INIT(hq_quantize_args)
#define HQ_FORMAT_DESC_INIT HQ_STRUCT_INIT(hq_format_desc)
#define HQ_GEMM_ARGS_INIT HQ_STRUCT_INIT(hq_gemm_args)
#define HQ_GEMM_INFO_INIT HQ_STRUCT_INIT(hq_gemm_info)

/* ---------------------------------------------------------------------------------------------
** Version, errors, dtypes, devices
*/
HQ_API const char *hq_version(void);                  /* "0.3.0" */
HQ_API const char *hq_last_error(void);               /* "" when none; per thread */
HQ_API void hq_clear_error(void);
HQ_API const char *hq_strerror(int status);           /* static text for a status code */
/* Record a formatted message as the thread's last error, as libhqcore's own failures do (an
   HQ_ENOMEM message that does not say "memory" gets "out of memory: " in front); returns code.
   For libraries and embedders layered on hq, so that hq_last_error() reports their failures
   too. */
HQ_API int hq_set_error(int code, const char *fmt, ...) HQ_PRINTF(2, 3);
HQ_API const char *hq_dtype_name(hq_dtype dtype);     /* "f32", "bf16", "e4m3", ... */
HQ_API hq_dtype hq_dtype_from_name(const char *name); /* HQ_DTYPE_INVALID if unknown */
HQ_API size_t hq_dtype_size(hq_dtype dtype);          /* bytes per stored element, 0 if invalid */
HQ_API const char *hq_dir_name(uint32_t dir);         /* "rowwise", "columnwise"; "invalid" */
/* Number of usable CUDA devices; 0 when built without CUDA or when none is present. */
HQ_API int hq_device_count(void);
/* Name and compute capability (major*10+minor) of a CUDA device. */
HQ_API int hq_device_info(int device, char *name, size_t name_len, int *arch);
/* Hand the memory hq's pool of `device` keeps for reuse back to the driver (waits for the
   device first), with the GEMM workspaces and call scratch its contexts keep. Memory still
   allocated is not touched. */
HQ_API int hq_device_trim(int device);
/* The memory of hq's pool of a CUDA device: what hq allocated there itself (contexts without an
   hq_allocator), apart from other processes and from the rest of this one -- unlike the
   driver's device-wide free memory. Counts only; nothing waits for the device. */
typedef struct hq_mem_stats {
  uint32_t struct_size;          /* sizeof(hq_mem_stats); at least HQ_MEM_STATS_SIZE_0_3 */
  uint64_t in_use;               /* bytes allocated from the pool and not freed */
  uint64_t peak;                 /* the highest in_use since the pool was made or the last
                                    hq_device_mem_reset_peak (never below in_use then) */
  uint64_t reserved;             /* bytes the pool holds from the driver: in use and kept for
                                    reuse (hq_device_trim hands the kept part back) */
} hq_mem_stats;
#define HQ_MEM_STATS_SIZE_0_3 (offsetof(hq_mem_stats, reserved) + sizeof(uint64_t))
#define HQ_MEM_STATS_INIT HQ_STRUCT_INIT(hq_mem_stats)
/* Fill *out (set out->struct_size first). All zero before hq's first allocation on the device.
   HQ_EINVAL: out NULL, struct_size too small, a device that does not exist (the message names
   it); HQ_ENOTSUP: a libhqcore built without CUDA; HQ_EDEVICE: the CUDA runtime failed. */
HQ_API int hq_device_mem_stats(int device, hq_mem_stats *out);
/* Restart the peak of hq_device_mem_stats from the bytes in use now (a run's own high-water:
   reset, run, read). Errors as hq_device_mem_stats. */
HQ_API int hq_device_mem_reset_peak(int device);
HQ_API int hq_built_with_cuda(void);
/* hq's host arithmetic mode (IEEE subnormals and rounding to nearest: the conventions above),
   for code outside libhqcore that must give libhqcore's bits on the host (a loop over
   hq/numerics.h or hq/adamw.h): hq_fpenv_enter clears the calling thread's flush-to-zero and
   rounding bits where they are set and returns its mode; hq_fpenv_leave(mode) puts that mode
   back. */
typedef unsigned long long hq_fpenv;
HQ_API hq_fpenv hq_fpenv_enter(void);
HQ_API void hq_fpenv_leave(hq_fpenv mode);

/* ---------------------------------------------------------------------------------------------
** Contexts
*/
/* Bring-your-own allocator (e.g. a trainer's caching allocator). device is HQ_DEVICE_HOST or a
   CUDA ordinal; stream is the context's stream. alloc returns NULL on failure. */
typedef struct hq_allocator {
  uint32_t struct_size;          /* sizeof(hq_allocator) */
  void *(*alloc)(void *user, int device, size_t bytes, void *stream);
  void (*free)(void *user, int device, void *ptr, void *stream);
  void *user;
} hq_allocator;
#define HQ_ALLOCATOR_SIZE_0_3 (offsetof(hq_allocator, user) + sizeof(void *))

typedef struct hq_ctx_desc {
  uint32_t struct_size;          /* sizeof(hq_ctx_desc); at least HQ_CTX_DESC_SIZE_0_1 */
  int32_t device;                /* HQ_DEVICE_HOST or a CUDA ordinal */
  void *stream;                  /* cudaStream_t to run on (NULL: the default stream) */
  const hq_allocator *allocator; /* NULL: malloc / cudaMalloc */
  /* Log sink; NULL: warnings and errors go to stderr, the rest is dropped. */
  void (*log)(void *user, int level, const char *msg);
  void *log_user;
  uint64_t seed;                 /* random stream for stochastic rounding */
} hq_ctx_desc;

/* The smallest hq_ctx_desc accepted (the fields up to `seed`). */
#define HQ_CTX_DESC_SIZE_0_1 (offsetof(hq_ctx_desc, seed) + sizeof(uint64_t))

typedef struct hq_ctx hq_ctx;
HQ_API int hq_ctx_create(const hq_ctx_desc *desc /* NULL: host */, hq_ctx **out);
HQ_API void hq_ctx_destroy(hq_ctx *ctx);
HQ_API int hq_ctx_device(const hq_ctx *ctx);
/* The context's stream (the cudaStream_t of its desc; NULL: the default stream, and always NULL
   on the host): an embedder launches its own kernels there to order them with hq's work. */
HQ_API void *hq_ctx_stream(const hq_ctx *ctx);
/* Memory on the context's device through its allocator. */
HQ_API int hq_ctx_alloc(hq_ctx *ctx, size_t bytes, void **out);
HQ_API void hq_ctx_free(hq_ctx *ctx, void *ptr);
/* Copy bytes between host and/or the context's device (ordered on its stream). */
HQ_API int hq_ctx_memcpy(hq_ctx *ctx, void *dst, int dst_device, const void *src, int src_device,
                         size_t bytes);
/* Set `bytes` bytes at dst (host memory for a host context, else memory of the context's
   device) to `value` (a byte, 0 to 255), ordered on the context's stream like hq's own work.
   Nothing allocates or synchronizes, so a step captured into a CUDA graph may hold it: a small
   zeroing (up to 16 KiB of 4-byte aligned words, e.g. the amax slots a trainer clears every step)
   is one kernel, which a replayed graph runs for about half a memset node's cost; anything else
   is cudaMemsetAsync. HQ_EINVAL for a NULL ctx, a NULL dst with bytes > 0 or a value that is not
   a byte; HQ_EDEVICE with CUDA's message when the launch fails. */
HQ_API int hq_ctx_memset(hq_ctx *ctx, void *dst, int value, size_t bytes);
/* Wait until all work queued on the context's stream has finished. */
HQ_API int hq_ctx_sync(hq_ctx *ctx);
/* Whether the context's stream is being captured into a CUDA graph, by this thread or any
   other, in *capturing: 1 while a capture is active, and also once it has been invalidated (an
   error inside it) until cudaStreamEndCapture ends it, since the stream refuses the same work
   until then; 0 for a host context, in a build without CUDA, and when nothing captures. A
   trainer asks before a call that would synchronize or allocate outside stream order
   (hq_ctx_sync, hq_ctx_memcpy to or from host memory, reading a loss, cudaMalloc): inside a
   capture such a call breaks the capture instead of running, so it belongs before the capture
   or after the replay. HQ_EINVAL for a NULL argument; HQ_EDEVICE with CUDA's message when CUDA
   cannot tell (the legacy default stream, a NULL stream, while another stream of the device is
   being captured). On any failure *capturing is 0: check the status before the flag. */
HQ_API int hq_ctx_capturing(const hq_ctx *ctx, int *capturing);
/* The random stream of stochastic rounding. A quantize or update operation draws from the
   context's seed and an offset mixed from three things: its quantizer's role
   ("module_type:tensor_type:name"), the context's step (this offset: 0 at creation, set by
   hq_ctx_set_rng_offset) and how many operations of that role the context has made since the
   step was set. So a role's random bits depend on nothing another role does (an identity copy
   elsewhere changes no NVFP4 gradient's rounding), and a trainer that sets the step at the start
   of every step (hq_ctx_set_rng_offset(ctx, step)) reproduces a run exactly from a checkpoint
   of its step; one that never sets it still gets fresh bits at every operation. Setting the
   step also restarts every role's count. On a CUDA context the step is also kept in device
   memory (allocated at the first set) and rewritten in stream order, so that operations
   captured into a CUDA graph draw from the step set before each replay (HQ_ENOMEM,
   HQ_EDEVICE when it cannot be written; HQ_ESTATE while the context's stream is being
   captured: set it outside the graph). */
HQ_API uint64_t hq_ctx_seed(const hq_ctx *ctx);
HQ_API uint64_t hq_ctx_rng_offset(const hq_ctx *ctx);
HQ_API int hq_ctx_set_rng_offset(hq_ctx *ctx, uint64_t offset);
/* The device word a CUDA context's captured operations read the step from at each replay
   (allocated here when no step was set yet). A caller that writes the step there itself, in
   stream order ahead of the work that draws from it -- a kernel at the head of a captured step
   that brings the step in with the batch, as hq train's does -- sets the context's own copy with
   hq_ctx_set_rng_offset_ex(ctx, step, HQ_RNG_OFFSET_HOST_ONLY) and saves the launch that would
   write it. HQ_EINVAL for a host context or a NULL argument, HQ_ENOMEM when it cannot be made. */
HQ_API int hq_ctx_rng_offset_device(hq_ctx *ctx, uint64_t **out);
/* hq_ctx_set_rng_offset with flags. HQ_RNG_OFFSET_HOST_ONLY: the step set and every role's
   count restarted as hq_ctx_set_rng_offset does, the device word left to the caller
   (hq_ctx_rng_offset_device); nothing is queued, so it may be called while the context's stream
   is being captured. Unknown flags: HQ_EINVAL. */
#define HQ_RNG_OFFSET_HOST_ONLY 1u
HQ_API int hq_ctx_set_rng_offset_ex(hq_ctx *ctx, uint64_t offset, uint32_t flags);

/* ---------------------------------------------------------------------------------------------
** Plugins
**
** Search path, in order: each directory of $HQ_PLUGIN_PATH (colon-separated; empty entries are
** ignored -- the current directory is never searched implicitly), then the caller's extra
** directories (a recipe's plugin_dirs), then the installed plugin directory. Every "*.so" file
** found is loaded; a module that fails a check is rejected with a message naming the file and
** the reason, and loading goes on with the rest. The first module of a name wins; a later
** module with the same name is rejected as a duplicate.
*/
typedef struct hq_plugins hq_plugins;
typedef struct hq_plugin hq_plugin;

#define HQ_PLUGINS_NO_ENV 1u       /* ignore $HQ_PLUGIN_PATH */
#define HQ_PLUGINS_NO_DEFAULT 2u   /* do not search the installed plugin directory */

HQ_API int hq_plugins_open(const char *const *dirs, size_t ndirs, unsigned flags,
                           hq_plugins **out);
HQ_API void hq_plugins_close(hq_plugins *set);
HQ_API const char *hq_plugins_default_dir(void);
HQ_API size_t hq_plugins_dir_count(const hq_plugins *set);
HQ_API const char *hq_plugins_dir(const hq_plugins *set, size_t i);
HQ_API size_t hq_plugins_count(const hq_plugins *set);
HQ_API const hq_plugin *hq_plugins_get(const hq_plugins *set, size_t i);
HQ_API const hq_plugin *hq_plugins_find(const hq_plugins *set, const char *name);
/* Rejected modules: file path and the reason. */
HQ_API size_t hq_plugins_rejected_count(const hq_plugins *set);
HQ_API const char *hq_plugins_rejected_file(const hq_plugins *set, size_t i);
HQ_API const char *hq_plugins_rejected_reason(const hq_plugins *set, size_t i);

HQ_API const char *hq_plugin_name(const hq_plugin *p);
HQ_API const char *hq_plugin_version(const hq_plugin *p);
HQ_API const char *hq_plugin_description(const hq_plugin *p);
HQ_API const char *hq_plugin_file(const hq_plugin *p);
HQ_API uint64_t hq_plugin_caps(const hq_plugin *p);
HQ_API unsigned hq_plugin_abi_minor(const hq_plugin *p);
/* The option table (ended by an entry whose name is NULL). */
HQ_API const hq_option *hq_plugin_options(const hq_plugin *p);

/* GEMM providers (hq/gemm_provider.h) a GEMM on formats of this set may use: the built-in ones
   and those the set loaded from modules, in the order hq_gemm asks them (highest priority
   first; `set` may be NULL: the built-in ones). */
typedef struct hq_gemm_provider_info {
  uint32_t struct_size;          /* sizeof(hq_gemm_provider_info), set by the caller */
  int32_t priority;
  const char *name, *version, *description;
  const char *file;              /* the module, or "(built into libhqcore)" */
} hq_gemm_provider_info;
HQ_API size_t hq_plugins_gemm_count(const hq_plugins *set);
HQ_API int hq_plugins_gemm_info(const hq_plugins *set, size_t i, hq_gemm_provider_info *out);
HQ_API const char *hq_opt_type_name(hq_opt_type t);

/* ---------------------------------------------------------------------------------------------
** Recipes
**
**   [recipe]
**   name = my-recipe                  ; optional
**   plugin_dirs = plugins:/opt/fmts   ; optional, colon-separated, relative to the recipe's dir
**
**   [format mx]                       ; a named format instance
**   plugin = mxfp8                    ; the module providing it
**   dtype = e4m3                      ; options, validated against the module's option table
**
**   [role linear:weight:*]            ; module_type:tensor_type:name, each part a glob
**   rowwise = mx                      ; a [format] name, or a plugin name (its defaults)
**   columnwise = nv                   ; "identity" is always available
**   columnwise_source = original      ; or rowwise_dequantized
**
** Each part of a role pattern is a glob of literal characters, '*' (any run) and '?' (any one
** character). The most specific matching [role] wins: fewer '*', then more literal characters,
** then fewer '?'; ties go to the later section. A direction a section does not set, and every
** role no section matches, stays in high precision (the identity format, built into libhqcore).
** columnwise_source = rowwise_dequantized quantizes the columnwise copy from the dequantized
** rowwise copy, held in the SOURCE tensor's dtype: a bf16 input's dequantized copy is rounded to
** bf16 before the columnwise quantize (f32 input: exact f32 values).
*/
typedef struct hq_recipe hq_recipe;

/* What a role that matches no [role] section gets (hq_recipe_opts.unmatched, or the recipe's
   [recipe] key `unmatched = identity | warn | error`): UNSET (neither says) and IDENTITY keep
   both directions in high precision silently; WARN does so and logs a warning naming the role
   at every hq_quantizer_create; ERROR makes hq_quantizer_create fail with HQ_ENOENT naming the
   role and the recipe. hq recipe check and hq train warn about unmatched roles unless the
   recipe chose. */
#define HQ_UNMATCHED_UNSET 0u
#define HQ_UNMATCHED_IDENTITY 1u
#define HQ_UNMATCHED_WARN 2u
#define HQ_UNMATCHED_ERROR 3u

typedef struct hq_recipe_opts {
  uint32_t struct_size;          /* sizeof(hq_recipe_opts); at least HQ_RECIPE_OPTS_SIZE_0_1 */
  unsigned plugin_flags;         /* HQ_PLUGINS_* for the plugin search */
  const char *const *extra_dirs; /* searched before the recipe's own plugin_dirs */
  size_t n_extra_dirs;
  /* --- 0.3 --- */
  hq_plugins *plugins;           /* NULL, or a plugin set to resolve the recipe against (retained
                                    by the recipe): several recipes then share one set -- one
                                    load of every module, and their formats' storages count as
                                    one module's for a GEMM. The search options above are then
                                    unused, and a [recipe] plugin_dirs is an error. */
  uint32_t unmatched;            /* HQ_UNMATCHED_*: overrides the recipe's key when not UNSET */
  uint32_t reserved0;            /* zero */
} hq_recipe_opts;

/* The smallest hq_recipe_opts accepted (the fields up to n_extra_dirs). */
#define HQ_RECIPE_OPTS_SIZE_0_1 (offsetof(hq_recipe_opts, n_extra_dirs) + sizeof(size_t))

/* Parse and resolve a recipe. hq_recipe_parse() returns a recipe object even when the file has
   errors (only ENOMEM/EIO fail), so that every error can be listed; hq_recipe_load() fails with
   HQ_EPARSE (first error in hq_last_error()) when there is any. */
HQ_API int hq_recipe_parse(const char *path, const hq_recipe_opts *opts, hq_recipe **out);
HQ_API int hq_recipe_load(const char *path, const hq_recipe_opts *opts, hq_recipe **out);
/* The same for a recipe held in memory; `name` is used in messages in place of a file name
   and plugin_dirs are relative to the current directory. Both parse functions also leave the
   first error of a recipe with errors in hq_last_error() (while returning HQ_OK). */
HQ_API int hq_recipe_parse_string(const char *text, const char *name, const hq_recipe_opts *opts,
                                  hq_recipe **out);
HQ_API int hq_recipe_load_string(const char *text, const char *name, const hq_recipe_opts *opts,
                                 hq_recipe **out);
HQ_API void hq_recipe_free(hq_recipe *r);

HQ_API size_t hq_recipe_error_count(const hq_recipe *r);
HQ_API const char *hq_recipe_error(const hq_recipe *r, size_t i);   /* "file:line: message" */
HQ_API const char *hq_recipe_path(const hq_recipe *r);
/* HQ_UNMATCHED_*: what a role matching no section gets (the options' choice, else the recipe's). */
HQ_API uint32_t hq_recipe_unmatched(const hq_recipe *r);
HQ_API const char *hq_recipe_name(const hq_recipe *r);
HQ_API const hq_plugins *hq_recipe_plugins(const hq_recipe *r);

/* Format instances: the [format] sections plus the implicit ones (plugin names used directly,
   and "identity"). */
typedef struct hq_format_info {
  uint32_t struct_size;          /* sizeof(hq_format_info), set by the caller */
  int32_t line;                  /* line of its [format] header; 0 if implicit */
  const char *name;              /* instance name */
  const char *plugin;            /* module name */
  size_t n_options;              /* the module's options, with resolved values */
  const char *const *option_names;
  const char *const *option_values;
} hq_format_info;
#define HQ_FORMAT_INFO_SIZE_0_3 (offsetof(hq_format_info, option_values) + sizeof(void *))
HQ_API size_t hq_recipe_format_count(const hq_recipe *r);
HQ_API int hq_recipe_format_info(const hq_recipe *r, size_t i, hq_format_info *out);

/* Role sections, in file order. */
#define HQ_SOURCE_ORIGINAL 0
#define HQ_SOURCE_ROWWISE_DEQUANTIZED 1
typedef struct hq_role_info {
  uint32_t struct_size;          /* sizeof(hq_role_info), set by the caller */
  int32_t line;                  /* line of its [role] header */
  const char *pattern;           /* "linear:weight:*" */
  const char *rowwise;           /* format instance name ("identity" when unset) */
  const char *columnwise;
  int32_t columnwise_source;     /* HQ_SOURCE_* */
  int32_t reserved0;             /* zero */
  long shadowed_by;              /* index of a section that wins for every role this one matches,
                                    or -1 */
} hq_role_info;
#define HQ_ROLE_INFO_SIZE_0_3 (offsetof(hq_role_info, shadowed_by) + sizeof(long))
HQ_API size_t hq_recipe_role_count(const hq_recipe *r);
HQ_API int hq_recipe_role_info(const hq_recipe *r, size_t i, hq_role_info *out);

/* A role: three strings; NULL means "". Fill it with hq_role_of() (which sets struct_size). */
typedef struct hq_role {
  uint32_t struct_size;          /* sizeof(hq_role) */
  const char *module_type;       /* "linear", "grouped_linear", "dpa", ... */
  const char *tensor_type;       /* "input", "weight", "grad_output", ... */
  const char *name;              /* "layers.3.fc2" */
} hq_role;
#define HQ_ROLE_SIZE_0_3 (offsetof(hq_role, name) + sizeof(const char *))
static inline hq_role hq_role_of(const char *module_type, const char *tensor_type,
                                 const char *name) {
  hq_role r;
  r.struct_size = (uint32_t)sizeof r;
  r.module_type = module_type;
  r.tensor_type = tensor_type;
  r.name = name;
  return r;
}
/* Parse "module_type:tensor_type:name" into a role whose strings point into buf. */
HQ_API int hq_role_parse(const char *text, char *buf, size_t buf_len, hq_role *out);
/* Index of the [role] section that resolves `role`, or -1 when none matches (or the role is
   malformed: then hq_last_error() says how). */
HQ_API long hq_recipe_match(const hq_recipe *r, const hq_role *role);

/* ---------------------------------------------------------------------------------------------
** Quantizers
*/
typedef struct hq_quantizer hq_quantizer;

HQ_API int hq_quantizer_create(hq_recipe *r, const hq_role *role, hq_quantizer **out);

/* A quantizer without recipe text ("format X with these options"), for trainers and tests: one
   format per direction, each a plugin of `plugins` and its options as "key=value" strings,
   validated as a recipe's would be (unknown key, wrong type, out of range: HQ_EPARSE naming
   them). A NULL spec, or plugin NULL / "identity", is high precision. Two equal specs (same
   plugin, same options in the same order) are one format instance: with HQ_SOURCE_ORIGINAL both
   directions come from one plugin call, as with a recipe. columnwise_source is HQ_SOURCE_*. */
typedef struct hq_format_spec {
  uint32_t struct_size;          /* sizeof(hq_format_spec) */
  const char *plugin;
  const char *const *options;    /* n_options strings "key=value" */
  size_t n_options;
} hq_format_spec;
HQ_API int hq_quantizer_create_direct(hq_plugins *plugins, const hq_format_spec *rowwise,
                                      const hq_format_spec *columnwise, int columnwise_source,
                                      hq_quantizer **out);
HQ_API void hq_quantizer_free(hq_quantizer *q);
/* Usage flags: which directions hq_quantize() makes (default HQ_BOTH). */
HQ_API int hq_quantizer_set_usage(hq_quantizer *q, uint32_t dirs);
HQ_API uint32_t hq_quantizer_usage(const hq_quantizer *q);
HQ_API const char *hq_quantizer_format(const hq_quantizer *q, uint32_t dir);   /* instance name */
HQ_API const char *hq_quantizer_plugin(const hq_quantizer *q, uint32_t dir);   /* module name */
HQ_API int hq_quantizer_columnwise_source(const hq_quantizer *q);
/* Whether one plugin call makes both directions: one format instance for both and
   columnwise_source HQ_SOURCE_ORIGINAL (with HQ_SOURCE_ROWWISE_DEQUANTIZED the columnwise call
   reads the rowwise result, so there are two calls even for one instance). */
HQ_API int hq_quantizer_fused(const hq_quantizer *q);
/* Quantizing the same input again reproduces the same bytes (see HQ_CAP_REQUANT_SAFE). */
HQ_API int hq_quantizer_requant_safe(const hq_quantizer *q);

/* Per-tensor amax, split from the cast. Formats with a per-tensor scale (fp8_tensor, nvfp4's
   global scale) read their input twice when they compute the amax themselves; a trainer that
   knows it (the producing kernel computed it, an FSDP group reduced it) passes it in and the
   quantize reads the input once.
   hq_quantizer_amax_kind: what the amax of direction `dir` is (HQ_AMAX_NONE: unused;
   HQ_AMAX_INPUT: max |x| of the input, NaN ignored, so a producer's amax fits; HQ_AMAX_OWN: a
   format-specific amax, e.g. of nvfp4's RHT-transformed columnwise values).
   hq_quantizer_amax: compute amax[0] (rowwise) and amax[1] (columnwise) of src as the
   quantizer's formats define them, into 2 floats of memory on the context's device (a direction
   whose amax kind is NONE gets 0). Reduce them with max across shards or ranks and pass them to
   hq_quantize_ex / hq_qtensor_update_ex: the result is then bit-identical to quantizing the
   whole tensor. */
HQ_API uint32_t hq_quantizer_amax_kind(const hq_quantizer *q, uint32_t dir);
HQ_API int hq_quantizer_amax(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, float *amax);

/* ---------------------------------------------------------------------------------------------
** Scaling state (delayed scaling)
**
** A format instance may take its scale from earlier steps instead of the tensor at hand:
** fp8_tensor with `scaling = delayed` scales by a value computed from an amax history
** (docs/formats.md, 3.5). That state lives in ONE buffer per recipe, an hq_state, on the device
** of the context it was created with:
**
**     [ amax[0] ... amax[n-1] | each slice's format state (fp8_tensor: scale, history 1..L-1) ]
**
** Binding a quantizer (hq_quantizer_create_ex, or hq_quantizer_bind_state) reserves one slice
** per direction whose format keeps state (ONE slice for both directions of a fused quantizer,
** whose two copies share one scale). The same role bound again with the same format instance
** (a quantizer rebuilt every step) gets the same slice back. A quantize or update through a
** bound quantizer -- or a qtensor it made, which keeps the binding -- uses the slice's scale as
** it stands and max-accumulates the tensor's amax into the slice's amax ("history row 0"). A
** quantizer whose format keeps state but that is bound to no hq_state fails there with
** HQ_ESTATE naming the role.
**
** One training step:
**     hq_quantize / hq_qtensor_update ...       // forward and backward, bound quantizers
**     hq_state_amaxes(st, &amax, &n);            // n contiguous floats on the state's device
**     all-reduce(MAX) of amax[0..n)             // the caller's (NCCL, MPI; nothing on 1 rank)
**     hq_state_update(st, ctx);                  // roll + new scale of every slice; amaxes -> 0
** (The upstream system updates forward tensors when the forward pass ends and backward tensors
** at the end of backward; calling hq_state_update once per step after both gives the same
** scales at the next step.)
**
** The buffer is laid out and allocated at its first use (a quantize, hq_state_amaxes,
** hq_state_data or hq_state_update), through the state's context's allocator, and initialised
** from the host (this synchronizes the state's stream once): call hq_state_amaxes after binding
** every quantizer, before a CUDA graph capture. A bind after that grows the buffer by
** reallocation (the contents move through the host, synchronizing; pointers from
** hq_state_amaxes / hq_state_data are then stale: ask again). Slices are grouped by format
** instance (amaxes and states of one instance contiguous); a slice's place can change only when
** a quantizer is bound. Slices are never released. The state lives until hq_state_free and the
** last quantizer and qtensor bound to it are freed (it keeps its context alive). Bind,
** update and lay out the buffer from one thread; once it exists, quantizations through it may
** run on several threads and streams of its device (a GPU maxes each amax atomically; on the
** host, use one slice from one thread at a time), ordered before hq_state_update by the caller.
*/
typedef struct hq_state hq_state;
/* A state for the quantizers of recipe r (r may be NULL: direct quantizers; it only names the
   state in messages) on ctx's device. */
HQ_API int hq_state_create(const hq_recipe *r, hq_ctx *ctx, hq_state **out);
HQ_API void hq_state_free(hq_state *st);
/* hq_quantizer_create, then hq_quantizer_bind_state(q, st) when st is not NULL. */
HQ_API int hq_quantizer_create_ex(hq_recipe *r, const hq_role *role, hq_state *st,
                                  hq_quantizer **out);
/* Reserve q's slices in st (HQ_OK with no slice for a stateless quantizer). Binding to the state
   q is already bound to is a no-op; to another state it is HQ_ESTATE. */
HQ_API int hq_quantizer_bind_state(hq_quantizer *q, hq_state *st);
/* The contiguous amaxes of every slice (*n floats on the state's device): the one buffer a
   trainer all-reduces with MAX before hq_state_update. */
HQ_API int hq_state_amaxes(hq_state *st, float **amax, size_t *n);
/* The whole buffer (*n floats: the amaxes first, then the slices' states, on the state's
   device), e.g. to checkpoint it as one F32 tensor; it is writable: on resume, load the saved
   floats into it (hq_ckpt_load_tensor of hq/train.h, or a copy on the state's stream) before
   the next quantize, with the same quantizers bound in the same order. */
HQ_API int hq_state_data(hq_state *st, float **data, size_t *n);
/* Update every slice from its amax (after the caller's reduction), on ctx (the state's device)
   and its stream: one format call -- one kernel on a GPU -- per group of slices. */
HQ_API int hq_state_update(hq_state *st, hq_ctx *ctx);
HQ_API size_t hq_state_slice_count(const hq_state *st);
/* Where direction dir of a bound quantizer keeps its state; HQ_ENOENT when it has none. */
typedef struct hq_state_slice {
  uint32_t struct_size;          /* sizeof(hq_state_slice), set by the caller */
  uint32_t dirs;                 /* the directions it serves (HQ_BOTH: a fused quantizer's) */
  size_t amax_index;             /* its amax: hq_state_amaxes()[amax_index] */
  size_t offset;                 /* its format state: hq_state_data()[offset, offset + floats) */
  size_t floats;
} hq_state_slice;
HQ_API int hq_quantizer_state_slice(const hq_quantizer *q, uint32_t dir, hq_state_slice *out);

/* Optional arguments of hq_quantize_ex / hq_qtensor_update_ex. */
#define HQ_QUANTIZE_FINITE_ONLY 1u /* refuse a source holding NaN or +-Inf: HQ_EINVAL with their
                                      count and the first position, nothing written. Reads the
                                      source once more and synchronizes the context's stream (not
                                      for a CUDA graph capture). Without it, each format's rule
                                      for non-finite values applies (docs/formats.md). */
/* HQ_QUANTIZE_ALIAS (hq_quantize_ex only; an update ignores it): when every direction the call
   makes is one identity format instance storing the source's own dtype (one buffer, no scale:
   the bytes would be the source's, unchanged), the qtensor borrows the source instead of
   copying it -- no allocation, no kernel. Without the flag hq always copies, so a qtensor never
   changes behind its owner's back. With it the caller promises, for the qtensor's whole life:
   the source is neither written nor freed (a write to it shows through in the qtensor; a free
   leaves it dangling). An aliased qtensor is read-only: hq_qtensor_update(_ex), the optimizer's
   write-back (hq_qtensor_update_adam, hq_adam_step), hq_qtensor_save and the FSDP moves refuse
   it with HQ_ESTATE; GEMMs, hq_dequantize and hq_qtensor_free work as for any qtensor (the free
   leaves the source alone). Any other recipe -- a format that is not identity, a storage dtype
   that differs from the source's, a rowwise_dequantized source, two directions in two
   formats -- copies as without the flag (docs/performance.md, "hq's own cost per call"). */
#define HQ_QUANTIZE_ALIAS 2u
typedef struct hq_quantize_args {
  uint32_t struct_size;          /* sizeof(hq_quantize_args) */
  uint32_t flags;                /* HQ_QUANTIZE_* (0 before 0.3: was reserved, zero) */
  const float *amax;             /* NULL, or amax[0] rowwise, amax[1] columnwise, as
                                    hq_quantizer_amax computes them, on the context's device:
                                    used as given (directions of kind NONE ignore theirs) */
  /* --- 0.3 --- */
  uint32_t dirs;                 /* 0: the quantizer's usage (hq_quantize) or the qtensor's
                                    (hq_qtensor_update); else the directions this call makes
                                    (hq_quantize: the new qtensor's usage) or refreshes (an
                                    update: each must be present, HQ_ESTATE otherwise) */
  uint32_t reserved0;            /* zero */
} hq_quantize_args;

/* Count the NaN and +-Inf values of t (on the context's device); *first receives the row-major
   index of the first one (-1 when there is none). Synchronizes the context's stream. */
HQ_API int hq_tensor_nonfinite(hq_ctx *ctx, const hq_tensor *t, int64_t *count, int64_t *first);
/* The checks every call makes on a caller's tensor: struct_size at least HQ_TENSOR_SIZE_2_0,
   dtype F32, F16 or BF16, rows and cols positive with at most 2^48 elements, data not NULL and
   aligned to its element size. HQ_EINVAL (HQ_ESHAPE for the shape) with a message starting with
   `what`; *out receives the tensor as this header's hq_tensor (an older, smaller struct's
   missing fields zero). */
HQ_API int hq_tensor_check(const hq_tensor *t, const char *what, hq_tensor *out);

/* ---------------------------------------------------------------------------------------------
** Quantized tensors
*/
typedef struct hq_qtensor hq_qtensor;

/* Quantize src into a new qtensor holding the directions of the quantizer's usage. The qtensor
   snapshots the quantizer (later changes to q do not affect it). */
HQ_API int hq_quantize(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, hq_qtensor **out);
/* hq_quantize with optional arguments (args may be NULL). */
HQ_API int hq_quantize_ex(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src,
                          const hq_quantize_args *args, hq_qtensor **out);
/* Allocate a qtensor of [rows, cols] for the quantizer's usage without quantizing. */
HQ_API int hq_make_empty(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols,
                         hq_dtype nominal, hq_qtensor **out);
/* Re-quantize src into the existing buffers of qt (the optimizer's write-back): a direction is
   refreshed only if it is present and in qt's usage; nothing is created. */
HQ_API int hq_qtensor_update(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src);
HQ_API int hq_qtensor_update_ex(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src,
                                const hq_quantize_args *args);
/* qt's usage flags (which present directions hq_qtensor_update refreshes). */
HQ_API int hq_qtensor_set_usage(hq_qtensor *qt, uint32_t dirs);
HQ_API uint32_t hq_qtensor_usage(const hq_qtensor *qt);
/* Drop directions (frees their buffers). Never creates one. */
HQ_API int hq_qtensor_drop(hq_qtensor *qt, uint32_t dirs);
/* Dequantize direction `dir` into dst ([rows, cols] F32/F16/BF16 on the context's device). */
HQ_API int hq_dequantize(const hq_qtensor *qt, hq_ctx *ctx, uint32_t dir, hq_tensor *dst);
HQ_API uint32_t hq_qtensor_dirs(const hq_qtensor *qt);          /* directions present */
HQ_API int64_t hq_qtensor_rows(const hq_qtensor *qt);
HQ_API int64_t hq_qtensor_cols(const hq_qtensor *qt);
HQ_API hq_dtype hq_qtensor_nominal_dtype(const hq_qtensor *qt);
HQ_API const hq_storage *hq_qtensor_storage(const hq_qtensor *qt, uint32_t dir);
/* Bytes held by a direction (buffers shared with the other direction count once, in ROWWISE). */
HQ_API size_t hq_qtensor_bytes(const hq_qtensor *qt, uint32_t dir);
HQ_API const char *hq_qtensor_format(const hq_qtensor *qt, uint32_t dir);
/* The role of the quantizer that made qt ("linear:weight:fc1"; "(direct)" for
   hq_quantizer_create_direct), its columnwise_source (HQ_SOURCE_*), and the device its buffers
   live on (its context's). */
HQ_API const char *hq_qtensor_role(const hq_qtensor *qt);
HQ_API int hq_qtensor_columnwise_source(const hq_qtensor *qt);
HQ_API int hq_qtensor_device(const hq_qtensor *qt);
/* What per-tensor amax direction `dir` of qt depends on (HQ_AMAX_*, as hq_quantizer_amax_kind:
   the columnwise copy of a rowwise_dequantized tensor sees the dequantized values, so an INPUT
   kind becomes OWN there). */
HQ_API uint32_t hq_qtensor_amax_kind(const hq_qtensor *qt, uint32_t dir);

/* The format instance a direction of qt uses (whether that direction is present or not), as a
   checkpoint records it. The strings and arrays stay valid while qt lives. */
typedef struct hq_format_desc {
  uint32_t struct_size;              /* sizeof(hq_format_desc), set by the caller */
  uint32_t layout_version;           /* the module's hq_format_ops.layout_version (0 reads as 1) */
  const char *name;                  /* the instance: a [format] name, or the plugin's name */
  const char *plugin;                /* the module's name */
  const char *plugin_version;        /* the module's version string ("" when it has none) */
  size_t n_options;                  /* the module's options, in its table's order: */
  const char *const *option_names;   /*   their names, */
  const char *const *option_values;  /*   this instance's values as written (defaults filled), */
  const char *const *option_defaults;/*   and the table's defaults as written */
} hq_format_desc;
/* The smallest struct_size accepted (every field above). */
#define HQ_FORMAT_DESC_SIZE_0_2 (offsetof(hq_format_desc, option_defaults) + sizeof(void *))
HQ_API int hq_qtensor_format_desc(const hq_qtensor *qt, uint32_t dir, hq_format_desc *out);

/* Give every columnwise buffer that is a rowwise buffer of qt (HQ_BUF_SHARED, both directions
   made by one call) memory of its own holding a copy of its bytes, named "columnwise_<name>" --
   what the first update of one direction alone does -- all of them or, when an allocation
   fails, none (HQ_ENOMEM, qt unchanged). Allocated through qt's context, copied on ctx's stream
   (ctx on qt's device). A later update of both directions by one call shares them again. For a
   loader that fills the columnwise copies from elsewhere (a checkpoint that holds them). */
HQ_API int hq_qtensor_unshare(hq_qtensor *qt, hq_ctx *ctx);

/* The fused optimizer write-back (hq/plugin.h, "Fused optimizer write-back"): one update() call
   of qt's format that applies the AdamW step `adam` to every element of the FP32 master [rows,
   cols] (on ctx's device) as it reads it, stores master and moments back and writes every
   direction qt refreshes from the new master -- the bytes of the step followed by
   hq_qtensor_update(qt, ctx, master), in one pass. HQ_ENOTSUP, with nothing run, where that one
   call cannot be made: on the host, for a saved qtensor, a rowwise_dequantized source, two
   format instances for the directions refreshed, a format without HQ_CAP_FUSED_ADAM or one that
   needs a per-tensor amax, constants in device memory (adam->k_dev, ABI 2.6) for a format
   without HQ_CAP_ADAM_KDEV; the caller then runs the step itself and updates (as hq_adam_step
   does). A wrong device, shape or master dtype is HQ_EINVAL (HQ_ESHAPE), as is a k_dev not
   16-byte aligned. The call
   is logged at debug level ("AdamW fused into the ... write-back"). */
HQ_API int hq_qtensor_update_adam(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *master,
                                  const hq_adam_pass *adam);
HQ_API void hq_qtensor_free(hq_qtensor *qt);

/* Save / restore (activation recompute, offload, checkpoints): hand every buffer out -- the
   rowwise storage's own buffers, then the columnwise storage's, each in its format's buffer
   order; a buffer the columnwise storage shares with the rowwise one travels once, with the
   rowwise storage -- leaving the qtensor an empty skeleton; restore takes the list back.
   Each entry describes its buffer (name, direction, dtype, shape, bytes, device) beside the
   pointer, so that an embedder can move it (device -> pinned host -> device) and hand back a
   different pointer: restore checks name, direction and size of every entry against the
   skeleton. The caller owns the saved memory until restore; memory handed back must come from
   the qtensor's context's allocator (hq_ctx_alloc), since the qtensor frees it there. A format
   may hand a buffer out in a form of its own (plugin ABI 2.4): the entry then describes the
   form, and restore expects it back.
   Arrays are passed with elem_size = sizeof(hq_saved_buffer) (older, smaller sizes down to
   HQ_SAVED_BUFFER_SIZE_0_2 are accepted). */
typedef struct hq_saved_buffer {
  uint32_t struct_size;          /* set by hq_qtensor_save */
  uint32_t dir;                  /* HQ_ROWWISE or HQ_COLWISE: the storage it belongs to */
  const char *name;              /* "data", "scale_inv", "columnwise_data", ... (unique) */
  hq_dtype dtype;
  int32_t ndim;
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  size_t bytes;
  int32_t device;                /* where ptr lives: the qtensor's device */
  int32_t reserved0;
  void *ptr;
} hq_saved_buffer;
#define HQ_SAVED_BUFFER_SIZE_0_2 (offsetof(hq_saved_buffer, ptr) + sizeof(void *))
HQ_API size_t hq_qtensor_saved_count(const hq_qtensor *qt);
HQ_API int hq_qtensor_save(hq_qtensor *qt, hq_saved_buffer *out, size_t cap, size_t elem_size,
                           size_t *n);
HQ_API int hq_qtensor_restore(hq_qtensor *qt, const hq_saved_buffer *in, size_t n,
                              size_t elem_size);
HQ_API int hq_qtensor_is_saved(const hq_qtensor *qt);

/* ---------------------------------------------------------------------------------------------
** GEMMs
**
** hq_gemm computes, in cuBLAS's column-major convention (the upstream system's),
**     D = alpha * op(A) * op(B) + beta * D  (+ bias)
** A is a tensor [A0, A1] (a qtensor's [rows, cols], or a high-precision hq_tensor), B is [B0, B1];
** m = transa ? A0 : A1, k = transa ? A1 : A0, n = transb ? B1 : B0 (B0 when transb is 0), and D
** is a row-major [n, m] tensor (F32 or BF16) on the context's device. In row-major terms:
** D = B' * A'^T with A' = transa ? A : A^T ([m, k]) and B' = transb ? B^T : B ([n, k]).
**
** A quantized operand is read in the direction whose blocks run along k: A transposed -> its
** rowwise copy, A not transposed -> its columnwise copy; B not transposed -> rowwise, B
** transposed -> columnwise. A missing direction is HQ_ESTATE naming the role and direction
** (never a silent requantize).
**
** Who multiplies: GEMM providers (hq/gemm_provider.h), asked highest priority first; the first
** that takes the problem runs it and hq_gemm_info names it. A format module's own gemm op (ABI
** 2.1), when both operands come from that module, is asked before them. libhqcore carries three:
**   cublaslt        NATIVE: the low-precision tensor cores read the stored codes and scales, by
**                   the storages' descriptors: per-tensor FP8 (fp8_tensor) from sm_89, FP8 blocks
**                   of 1x128 / 128x128 (fp8_block) on Hopper, 1x32 E8M0 (mxfp8) and 1x16 E4M3
**                   (nvfp4) block scales on Blackwell, swizzled.
**   fused_hopper    FUSED_BF16: the emulated BF16 product with one operand's dequantize fused
**                   into the GEMM (Hopper, compute capability 9.0): a rowwise storage of 1x32
**                   E8M0-scaled FP8 codes (MXFP8) or 1x16 E4M3-scaled E2M1 codes (NVFP4; its
**                   per-tensor factor folded into alpha), order MK, compact or swizzled scales,
**                   is read as codes and scales and turned into the same BF16 values inside the
**                   GEMM kernel; the other operand (K contiguous in the orientation the flags
**                   give) is dequantized as on the emulated path. Taken when the other operand
**                   has at most 2048 rows along m or n (where writing and rereading a BF16 copy
**                   of the large operand costs more than the fused kernel gives up to cuBLASLt)
**                   and the problem is not small (the fused operand at least 2^20 elements, its
**                   output at least 96 tiles of 128 x 256, with an F32 D k at least 2048: the
**                   unfused path is faster below; docs/gemm.md), or always with
**                   HQ_GEMM_FUSED_ALWAYS; never with HQ_GEMM_NO_FUSED or
**                   HQ_GEMM_FORCE_EMULATED.
**   emulated        every other problem (it takes them all). EMULATED_BF16 / EMULATED_F32 on a
**                   GPU: each operand dequantized to its raw values (elements times block
**                   scales; the per-tensor factors -- FP8 scale_inv, NVFP4 global scale -- kept
**                   out and folded into alpha; an RHT stays in the transformed domain), then one
**                   cuBLASLt GEMM with FP32 accumulation, BF16 inputs or F32 inputs (no TF32)
**                   when a raw value needs more than BF16's 8 bits (fp8_block with
**                   non-power-of-two scales, F32 or F16 operands). CPU on the host: the raw
**                   values in F32 and an F32 sgemm (OpenBLAS when built with it, else a blocked
**                   loop).
** The emulated, fused and CPU paths equal the exact product of the dequantized operands up to the
** order of FP32 accumulation. A product of two storages with different transforms (an RHT copy times
** a plain one) is refused (HQ_EINVAL naming both): its value would be meaningless.
*/
typedef struct hq_operand {
  const hq_qtensor *qt;          /* a quantized tensor, or NULL */
  const hq_tensor *hp;           /* a high-precision tensor when qt is NULL */
} hq_operand;
static inline hq_operand hq_operand_q(const hq_qtensor *qt) {
  hq_operand o;
  o.qt = qt;
  o.hp = NULL;
  return o;
}
static inline hq_operand hq_operand_hp(const hq_tensor *t) {
  hq_operand o;
  o.qt = NULL;
  o.hp = t;
  return o;
}

/* The paths (HQ_GEMM_PATH_*) and the flags below (HQ_GEMM_FORCE_EMULATED: only the plain
   emulated path, for tests and comparisons; HQ_GEMM_FUSED_ALWAYS: a fused path wherever it can
   run, whatever the shape, still after a native one; HQ_GEMM_NO_FUSED: never a fused path;
   HQ_GEMM_FAST_ACCUM: cuBLASLt's fast accumulation for a native per-tensor FP8 GEMM, faster and
   less exact than the default split FP32 accumulator) are defined in hq/gemm_provider.h, which
   providers see too. */
HQ_API const char *hq_gemm_path_name(uint32_t path);   /* "native", "emulated-bf16", ...,
                                                          "fused-bf16" */

/* Optional arguments of hq_gemm. */
typedef struct hq_gemm_args {
  uint32_t struct_size;          /* sizeof(hq_gemm_args) */
  uint32_t flags;                /* HQ_GEMM_FORCE_EMULATED, HQ_GEMM_FUSED_ALWAYS, ... */
  const void *bias;              /* NULL, or [m] values of bias_dtype on the context's device,
                                    added to every row of D (D[j][i] += bias[i]) */
  hq_dtype bias_dtype;           /* HQ_F32 or HQ_BF16 */
  int32_t reserved0;
  const char *what;              /* a name for messages and the log ("fprop fc1"), or NULL */
  /* --- a struct_size that covers it (older callers: none) --- */
  float *amax_d;                 /* NULL, or one FP32 value in the context's device memory (host
                                    memory for a host context) that receives, in stream order,
                                    max |D| over the stored result (after its rounding to D's
                                    dtype; NaN elements ignored by hq's own pass), on every
                                    path: from the GEMM's epilogue where cuBLASLt offers one
                                    (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER; hq_gemm_info.amax_fused
                                    says so), else from one pass over D after it. Current
                                    scaling of D then needs no amax pass of its own
                                    (hq_quantize_args.amax) */
} hq_gemm_args;

/* What ran (or, from hq_gemm_plan, what would run). */
typedef struct hq_gemm_info {
  uint32_t struct_size;          /* sizeof(hq_gemm_info), set by the caller */
  uint32_t path;                 /* HQ_GEMM_PATH_* */
  int64_t m, n, k;
  uint32_t dir_a, dir_b;         /* the direction used (0 for a high-precision tensor) */
  char format_a[32], format_b[32]; /* module names ("fp8_tensor"), or the tensor dtype */
  char reason[192];              /* why the native path was not taken ("" when it was) */
  uint32_t fused;                /* HQ_GEMM_PATH_FUSED_BF16: the operand read as codes and
                                    scales inside the GEMM kernel, 1 = A, 2 = B (the other one is
                                    dequantized to BF16 first); else 0 */
  char provider[32];             /* the GEMM provider that ran ("cublaslt", "emulated", ...,
                                    a module's name for its own gemm op) */
  uint32_t amax_fused;           /* hq_gemm_args.amax_d came from the GEMM's own epilogue (1), or
                                    from a pass over D after it, or none was asked (0) */
} hq_gemm_info;

/* Run the GEMM on ctx (its device and stream). info (may be NULL) receives the path; the path
   is also logged at debug level (3) through the context's logger. */
HQ_API int hq_gemm(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb, hq_tensor *D,
                   float alpha, float beta, const hq_gemm_args *args, hq_gemm_info *info);
/* Check shapes, directions and transforms and say which path hq_gemm would take; runs nothing
   (D may be NULL; then its dtype is taken as F32). */
HQ_API int hq_gemm_plan(hq_ctx *ctx, hq_operand A, int transa, hq_operand B, int transb,
                        const hq_tensor *D, const hq_gemm_args *args, hq_gemm_info *info);

/* Linear layer y = x * W^T + bias, W of shape [out, in], x [tokens, in], with the operands of its
   three roles (linear, input|weight|grad_output, name); each GEMM takes every operand in the
   direction it needs, so a trainer writes no transpose flag:
     fprop  y[tokens, out]  = x * W^T (+ bias[out])     W rowwise,    x rowwise
     dgrad  dx[tokens, in]  = dy * W                    W columnwise, dy rowwise
     wgrad  dW[out, in]     = dy^T * x (+ dW if accumulate)  x columnwise, dy columnwise
   Outputs are F32 or BF16 tensors on the context's device; bias is NULL or [out] of bias_dtype. */
HQ_API int hq_linear_fprop(hq_ctx *ctx, hq_operand x, hq_operand w, const void *bias,
                           hq_dtype bias_dtype, hq_tensor *y, hq_gemm_info *info);
HQ_API int hq_linear_dgrad(hq_ctx *ctx, hq_operand dy, hq_operand w, hq_tensor *dx,
                           hq_gemm_info *info);
HQ_API int hq_linear_wgrad(hq_ctx *ctx, hq_operand x, hq_operand dy, hq_tensor *dw,
                           int accumulate, hq_gemm_info *info);

/* Mixture of experts. hq_quantize_split quantizes the row blocks of src -- rows [0, m_splits[0]),
   then the next m_splits[1] rows, ... (the m_splits sum to src->rows) -- each with its own
   quantizer qs[i] (one per expert; hybrid and single-format quantizers may be mixed), into
   out[i]. An expert with 0 rows gets out[i] = NULL. On failure every out[i] is NULL and nothing
   is leaked. hq_grouped_gemm runs n GEMMs with the same flags, alpha and beta, A[i] x B[i] ->
   D[i]; a group whose A or B is an empty operand (a NULL qtensor and no tensor) has no work, and
   its D (if not NULL) must be [0, m] or [n, 0]. It runs them one after another on the context's
   stream (each through hq_gemm's dispatch); infos (may be NULL) receives one hq_gemm_info per
   group. hq_qtensors_free frees n qtensors (NULL entries allowed). */
HQ_API int hq_quantize_split(hq_quantizer *const *qs, size_t n, hq_ctx *ctx, const hq_tensor *src,
                             const int64_t *m_splits, hq_qtensor **out);
HQ_API int hq_grouped_gemm(hq_ctx *ctx, size_t n, const hq_operand *A, int transa,
                           const hq_operand *B, int transb, hq_tensor *const *D, float alpha,
                           float beta, const hq_gemm_args *args, hq_gemm_info *infos);
HQ_API void hq_qtensors_free(hq_qtensor **qts, size_t n);

/* ---------------------------------------------------------------------------------------------
** FSDP buffer protocol (no communication here: the caller gathers along dim 0, with NCCL, MPI or
** memcpy).
**
** A fully sharded tensor is split along M; rank i quantizes its shard [M_i, K] with the amax
** shared by all ranks (hq_quantizer_amax on every shard, max-reduced, passed to
** hq_quantize_ex). hq_fsdp_extract lists, for the shard's present directions (rowwise first),
** every buffer the gather must move, each as a row-major [rows, row_bytes] byte matrix whose
** dim 0 runs along M (scale padding trimmed, transposed copies turned M-major). The caller
** concatenates each entry along dim 0 in rank order and hq_fsdp_assign writes the result into a
** full-size qtensor of the same quantizer (made with hq_make_empty, or the previous result),
** redoing padding and transposes, and copying the buffers that are equal on every shard (a
** per-tensor scale or amax) from the local shard. The result equals, byte for byte, quantizing
** the whole tensor with that amax. A buffer its format moves itself (plugin ABI 2.4: mxfp8's
** swizzled scales, sent as their compact rows) is listed in its place like any other. What
** cannot be gathered (swizzled scales of another format, stochastic rounding, a shard whose M is
** not a multiple of hq_qtensor_shard_rows) is refused by hq_fsdp_extract, before any
** communication, naming the buffer and the rule.
** The extracted buffers stay valid until hq_fsdp_release(shard), the next hq_fsdp_extract of the
** shard, or its free; they may alias the shard's own buffers (do not modify them). So the list
** hq_fsdp_extract gives for the FULL tensor tells a gather where each entry can land in place:
** an entry listed as one of the full tensor's own buffers may be received straight into it, and
** hq_fsdp_assign copies nothing for a gathered entry that is the buffer it would fill.
*/
typedef struct hq_fsdp_buffer {
  uint32_t struct_size;          /* set by hq_fsdp_extract; the caller sets it in the gathered
                                    list given to hq_fsdp_assign */
  uint32_t dir;                  /* HQ_ROWWISE or HQ_COLWISE */
  const char *name;              /* the storage buffer it carries */
  hq_dtype dtype;                /* element dtype (row_bytes is a whole number of elements) */
  int32_t device;
  int64_t rows;                  /* extract: this shard's rows; assign: the gathered rows */
  int64_t row_bytes;             /* bytes per row, equal on every shard */
  void *ptr;
} hq_fsdp_buffer;
#define HQ_FSDP_BUFFER_SIZE_0_2 (offsetof(hq_fsdp_buffer, ptr) + sizeof(void *))
/* The multiple every shard's M must be for qt's directions (the least common multiple of its
   storages'); 0 when one of them cannot be sharded at all. */
HQ_API int64_t hq_qtensor_shard_rows(const hq_qtensor *qt);
HQ_API int hq_fsdp_extract(hq_qtensor *shard, hq_ctx *ctx, hq_fsdp_buffer *out, size_t cap,
                           size_t elem_size, size_t *n);
/* hq_fsdp_extract listing only the entries of the directions in `dirs` (HQ_ROWWISE, HQ_COLWISE
   or HQ_BOTH; a direction that is not present lists nothing): a gather that sends one direction
   and rebuilds the other (per-tensor FP8's columnwise codes from the rowwise ones) extracts, and
   for a transposed buffer transposes, only what it sends. Every present direction is still
   checked, so it refuses what hq_fsdp_extract refuses. hq_fsdp_extract is dirs = HQ_BOTH. */
HQ_API int hq_fsdp_extract_dirs(hq_qtensor *shard, hq_ctx *ctx, uint32_t dirs,
                                hq_fsdp_buffer *out, size_t cap, size_t elem_size, size_t *n);
HQ_API int hq_fsdp_assign(hq_qtensor *full, hq_ctx *ctx, const hq_qtensor *shard,
                          const hq_fsdp_buffer *gathered, size_t n, size_t elem_size);
HQ_API void hq_fsdp_release(hq_qtensor *shard);

#ifdef __cplusplus
}
#endif
#endif /* HQ_HQ_H */
