/*
** hq/hq.h -- the public API of libhqcore, for trainers that embed it.
**
** This is the only header an embedder includes (it pulls in hq/plugin.h for the shared types:
** hq_status, hq_dtype, hq_tensor, hq_storage). Link with `pkg-config --libs hqcore`.
**
** The objects, in the order a trainer meets them:
**   hq_ctx        where work runs: host or a CUDA device + stream, allocator hooks, logger.
**   hq_plugins    the loaded format modules (found on the plugin search path).
**   hq_recipe     a parsed recipe .ini: [format] instances and [role] sections.
**   hq_quantizer  what a role resolves to: one format per direction + usage flags.
**   hq_qtensor    a quantized tensor: up to two storages (ROWWISE, COLWISE).
**
** Conventions
**   - Every function that can fail returns an hq_status (0 = HQ_OK). The message of the last
**     failure on this thread is hq_last_error(); it names the object and the cause (and
**     file:line for recipes). Nothing in libhqcore aborts or exits the process.
**   - Objects are not thread-safe; distinct objects may be used from distinct threads.
**   - Lifetimes: a quantizer and a qtensor keep the formats they use alive (the recipe may be
**     freed first); a qtensor must be freed before the hq_ctx it was made with.
**
** Example
**     hq_ctx *ctx;       hq_ctx_create(NULL, &ctx);                     // host
**     hq_recipe *r;      if (hq_recipe_load("recipe.ini", NULL, &r)) die(hq_last_error());
**     hq_role role = { "linear", "weight", "layers.3.fc2" };
**     hq_quantizer *q;   hq_quantizer_create(r, &role, &q);
**     hq_tensor w = { ptr, HQ_BF16, HQ_DEVICE_HOST, 4096, 1024 };
**     hq_qtensor *qw;    hq_quantize(q, ctx, &w, &qw);                  // both directions
**     ...                hq_qtensor_update(qw, ctx, &w);                // optimizer write-back
**     hq_qtensor_free(qw); hq_quantizer_free(q); hq_recipe_free(r); hq_ctx_destroy(ctx);
*/
#ifndef HQ_HQ_H
#define HQ_HQ_H

#include <stddef.h>
#include <stdint.h>
#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HQ_API __attribute__((visibility("default")))
#else
#define HQ_API
#endif

/* ---------------------------------------------------------------------------------------------
** Version, errors, dtypes, devices
*/
HQ_API const char *hq_version(void);                  /* "0.1.0" */
HQ_API const char *hq_last_error(void);               /* "" when none; per thread */
HQ_API void hq_clear_error(void);
HQ_API const char *hq_strerror(int status);           /* static text for a status code */
HQ_API const char *hq_dtype_name(hq_dtype dtype);     /* "f32", "bf16", "e4m3", ... */
HQ_API hq_dtype hq_dtype_from_name(const char *name); /* HQ_DTYPE_INVALID if unknown */
HQ_API size_t hq_dtype_size(hq_dtype dtype);          /* bytes per stored element, 0 if invalid */
/* Number of usable CUDA devices; 0 when built without CUDA or when none is present. */
HQ_API int hq_device_count(void);
/* Name and compute capability (major*10+minor) of a CUDA device. */
HQ_API int hq_device_info(int device, char *name, size_t name_len, int *arch);
HQ_API int hq_built_with_cuda(void);

/* ---------------------------------------------------------------------------------------------
** Contexts
*/
/* Bring-your-own allocator (e.g. a trainer's caching allocator). device is HQ_DEVICE_HOST or a
   CUDA ordinal; stream is the context's stream. alloc returns NULL on failure. */
typedef struct hq_allocator {
  void *(*alloc)(void *user, int device, size_t bytes, void *stream);
  void (*free)(void *user, int device, void *ptr, void *stream);
  void *user;
} hq_allocator;

typedef struct hq_ctx_desc {
  uint32_t struct_size;          /* sizeof(hq_ctx_desc) */
  int32_t device;                /* HQ_DEVICE_HOST or a CUDA ordinal */
  void *stream;                  /* cudaStream_t to run on (NULL: the default stream) */
  const hq_allocator *allocator; /* NULL: malloc / cudaMalloc */
  /* Log sink; NULL: warnings and errors go to stderr, the rest is dropped. */
  void (*log)(void *user, int level, const char *msg);
  void *log_user;
  uint64_t seed;                 /* random stream for stochastic rounding */
} hq_ctx_desc;

typedef struct hq_ctx hq_ctx;
HQ_API int hq_ctx_create(const hq_ctx_desc *desc /* NULL: host */, hq_ctx **out);
HQ_API void hq_ctx_destroy(hq_ctx *ctx);
HQ_API int hq_ctx_device(const hq_ctx *ctx);
/* Memory on the context's device through its allocator. */
HQ_API int hq_ctx_alloc(hq_ctx *ctx, size_t bytes, void **out);
HQ_API void hq_ctx_free(hq_ctx *ctx, void *ptr);
/* Copy bytes between host and/or the context's device (ordered on its stream). */
HQ_API int hq_ctx_memcpy(hq_ctx *ctx, void *dst, int dst_device, const void *src, int src_device,
                         size_t bytes);
/* Wait until all work queued on the context's stream has finished. */
HQ_API int hq_ctx_sync(hq_ctx *ctx);

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
** then fewer '?'; ties go to the later section. A direction a section does not set, and every role
*no section
** matches, stays in high precision (the identity format).
*/
typedef struct hq_recipe hq_recipe;

typedef struct hq_recipe_opts {
  uint32_t struct_size;          /* sizeof(hq_recipe_opts) */
  unsigned plugin_flags;         /* HQ_PLUGINS_* for the plugin search */
  const char *const *extra_dirs; /* searched before the recipe's own plugin_dirs */
  size_t n_extra_dirs;
} hq_recipe_opts;

/* Parse and resolve a recipe. hq_recipe_parse() returns a recipe object even when the file has
   errors (only ENOMEM/EIO fail), so that every error can be listed; hq_recipe_load() fails with
   HQ_EPARSE (first error in hq_last_error()) when there is any. */
HQ_API int hq_recipe_parse(const char *path, const hq_recipe_opts *opts, hq_recipe **out);
HQ_API int hq_recipe_load(const char *path, const hq_recipe_opts *opts, hq_recipe **out);
/* Parse a recipe held in memory; `name` is used in messages in place of a file name and
   plugin_dirs are relative to the current directory. */
HQ_API int hq_recipe_parse_string(const char *text, const char *name, const hq_recipe_opts *opts,
                                  hq_recipe **out);
HQ_API void hq_recipe_free(hq_recipe *r);

HQ_API size_t hq_recipe_error_count(const hq_recipe *r);
HQ_API const char *hq_recipe_error(const hq_recipe *r, size_t i);   /* "file:line: message" */
HQ_API const char *hq_recipe_path(const hq_recipe *r);
HQ_API const char *hq_recipe_name(const hq_recipe *r);
HQ_API const hq_plugins *hq_recipe_plugins(const hq_recipe *r);

/* Format instances: the [format] sections plus the implicit ones (plugin names used directly,
   and "identity"). */
typedef struct hq_format_info {
  const char *name;              /* instance name */
  const char *plugin;            /* module name */
  int line;                      /* line of its [format] header; 0 if implicit */
  size_t n_options;              /* the module's options, with resolved values */
  const char *const *option_names;
  const char *const *option_values;
} hq_format_info;
HQ_API size_t hq_recipe_format_count(const hq_recipe *r);
HQ_API int hq_recipe_format_info(const hq_recipe *r, size_t i, hq_format_info *out);

/* Role sections, in file order. */
#define HQ_SOURCE_ORIGINAL 0
#define HQ_SOURCE_ROWWISE_DEQUANTIZED 1
typedef struct hq_role_info {
  const char *pattern;           /* "linear:weight:*" */
  int line;                      /* line of its [role] header */
  const char *rowwise;           /* format instance name ("identity" when unset) */
  const char *columnwise;
  int columnwise_source;         /* HQ_SOURCE_* */
  long shadowed_by;              /* index of a section that wins for every role this one matches,
                                    or -1 */
} hq_role_info;
HQ_API size_t hq_recipe_role_count(const hq_recipe *r);
HQ_API int hq_recipe_role_info(const hq_recipe *r, size_t i, hq_role_info *out);

/* A role: three strings; NULL means "". */
typedef struct hq_role {
  const char *module_type;       /* "linear", "grouped_linear", "dpa", ... */
  const char *tensor_type;       /* "input", "weight", "grad_output", ... */
  const char *name;              /* "layers.3.fc2" */
} hq_role;
/* Parse "module_type:tensor_type:name" into a role whose strings point into buf. */
HQ_API int hq_role_parse(const char *text, char *buf, size_t buf_len, hq_role *out);
/* Index of the [role] section that resolves `role`, or -1 when none matches. */
HQ_API long hq_recipe_match(const hq_recipe *r, const hq_role *role);

/* ---------------------------------------------------------------------------------------------
** Quantizers
*/
typedef struct hq_quantizer hq_quantizer;

HQ_API int hq_quantizer_create(hq_recipe *r, const hq_role *role, hq_quantizer **out);
HQ_API void hq_quantizer_free(hq_quantizer *q);
/* Usage flags: which directions hq_quantize() makes (default HQ_BOTH). */
HQ_API int hq_quantizer_set_usage(hq_quantizer *q, uint32_t dirs);
HQ_API uint32_t hq_quantizer_usage(const hq_quantizer *q);
HQ_API const char *hq_quantizer_format(const hq_quantizer *q, uint32_t dir);   /* instance name */
HQ_API const char *hq_quantizer_plugin(const hq_quantizer *q, uint32_t dir);   /* module name */
HQ_API int hq_quantizer_columnwise_source(const hq_quantizer *q);
/* Whether both directions are one format instance (one fused plugin call). */
HQ_API int hq_quantizer_fused(const hq_quantizer *q);
/* Quantizing the same input again reproduces the same bytes (see HQ_CAP_REQUANT_SAFE). */
HQ_API int hq_quantizer_requant_safe(const hq_quantizer *q);

/* ---------------------------------------------------------------------------------------------
** Quantized tensors
*/
typedef struct hq_qtensor hq_qtensor;

/* Quantize src into a new qtensor holding the directions of the quantizer's usage. The qtensor
   snapshots the quantizer (later changes to q do not affect it). */
HQ_API int hq_quantize(hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src, hq_qtensor **out);
/* Allocate a qtensor of [rows, cols] for the quantizer's usage without quantizing. */
HQ_API int hq_make_empty(hq_quantizer *q, hq_ctx *ctx, int64_t rows, int64_t cols,
                         hq_dtype nominal, hq_qtensor **out);
/* Re-quantize src into the existing buffers of qt (the optimizer's write-back): a direction is
   refreshed only if it is present and in qt's usage; nothing is created. */
HQ_API int hq_qtensor_update(hq_qtensor *qt, hq_ctx *ctx, const hq_tensor *src);
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
HQ_API void hq_qtensor_free(hq_qtensor *qt);

/* Save / restore (activation recompute, offload): hand every buffer out -- the rowwise
   storage's list, then the columnwise storage's, each in its format's documented order --
   leaving the qtensor an empty skeleton; restore takes exactly that list back. The caller owns
   the saved pointers until restore (they were allocated by the context's allocator). */
HQ_API size_t hq_qtensor_saved_count(const hq_qtensor *qt);
HQ_API int hq_qtensor_save(hq_qtensor *qt, void **out, size_t cap, size_t *n);
HQ_API int hq_qtensor_restore(hq_qtensor *qt, void *const *in, size_t n);
HQ_API int hq_qtensor_is_saved(const hq_qtensor *qt);

#ifdef __cplusplus
}
#endif
#endif /* HQ_HQ_H */
