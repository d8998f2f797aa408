/*
** hq/plugin.h -- the format plugin ABI of libhqcore.
**
** This is the only header a format author needs. A format is a shared object (a libtool module)
** that exports exactly one function, hq_format_module_v1(), and hides every other symbol. It does
** not link against libhqcore: everything it needs from the core arrives through the const host
** table passed to that function and through the hq_call passed to every operation.
**
** Install a format next to the stock ones:
**     cc -shared -fPIC -fvisibility=hidden myfmt.c -o myfmt.so
**     install myfmt.so "$(pkg-config --variable=plugindir hqcore)"
** or put its directory in HQ_PLUGIN_PATH, or in a recipe's [recipe] plugin_dirs.
**
** ---------------------------------------------------------------------------------------------
** The model
** ---------------------------------------------------------------------------------------------
** A high-precision tensor is a 2-D row-major matrix [M, K] (leading dimensions flattened into
** M). A quantized tensor has up to two *directions*:
**   - ROWWISE: read by a GEMM that contracts along K (blocks run along K);
**   - COLWISE: read by a GEMM that contracts along M (blocks run down the columns).
** Each direction is one hq_storage: a list of named buffers the plugin *describes* (name, dtype,
** shape) and the core *allocates*, moves, saves, offloads and gathers without knowing the format.
** The plugin writes numerics and layout rules, nothing else:
**
**     core                              plugin
**     ----                              ------
**     parse [format] options  ------->  configure(cfg, vals)      cfg: config_size bytes,
*core-owned
**     make a storage          ------->  layout(cfg, M, K, dir)    describe buffers
**     allocate every buffer             (make_empty(cfg, s))      optional: initialise them
**     quantize                ------->  quantize(cfg, call, src, dirs, row, col)
**     optimizer write-back    ------->  update(...)               NULL: quantize again
**     dequantize              ------->  dequantize(cfg, call, s, dst)
**
** When both directions of a tensor use the *same* format instance, the core makes ONE quantize
** call with dirs = HQ_ROWWISE|HQ_COLWISE (one read of the input). Otherwise it makes one call per
** direction with the other storage pointer NULL.
**
** ---------------------------------------------------------------------------------------------
** Compatibility rules (append-only ABI)
** ---------------------------------------------------------------------------------------------
** - Every struct crossing the boundary in a versioned way starts with abi_major, abi_minor,
**   struct_size (hq_format_ops, hq_host_api) or struct_size (hq_call).
** - The core refuses a module whose abi_major differs from HQ_ABI_MAJOR, or whose abi_minor is
**   newer than the core's. It reads only struct_size bytes of the ops table and treats absent
**   trailing fields as NULL ("not supported" / "use the core default").
** - Fields are only ever appended; enum values are never renumbered.
** - A plugin must check host->abi_major (and host->struct_size before using a host field added
**   after 1.0) and may return NULL from its entry function to refuse a core it cannot use.
**
** ---------------------------------------------------------------------------------------------
** Errors
** ---------------------------------------------------------------------------------------------
** Every operation returns an hq_status (0 = HQ_OK). On failure, call host->error(code, fmt, ...)
** to record a message naming the cause ("rows = 100 is not a multiple of 32"); it returns code,
** so `return host->error(HQ_ESHAPE, ...)` is the idiom. The core prefixes the role, format and
** plugin name. A plugin never aborts the process, never exits, never prints.
**
** ---------------------------------------------------------------------------------------------
** Memory
** ---------------------------------------------------------------------------------------------
** The plugin never allocates tensor memory itself. Buffers described by layout() are allocated by
** the core (through the embedder's allocator) before quantize() runs. Scratch memory for one call
** comes from host->alloc()/host->free() on the call's device and stream. Per-instance
** configuration is config_size bytes the core allocates, zeroes and frees.
*/
#ifndef HQ_PLUGIN_H
#define HQ_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version this header describes. */
#define HQ_ABI_MAJOR 1
#define HQ_ABI_MINOR 0

/* The one symbol a format module exports. */
#define HQ_FORMAT_ENTRY_NAME "hq_format_module_v1"

#if defined(__GNUC__)
#define HQ_FORMAT_EXPORT __attribute__((visibility("default")))
#define HQ_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define HQ_FORMAT_EXPORT
#define HQ_PRINTF(f, a)
#endif

/* ---------------------------------------------------------------------------------------------
** Status codes. 0 is success. Values are never renumbered; retired ones stay reserved.
*/
typedef enum hq_status {
  HQ_OK = 0,
  HQ_EINVAL = 1,     /* an argument is invalid (NULL, wrong dtype, wrong device, ...) */
  HQ_ENOMEM = 2,     /* an allocation failed */
  HQ_ENOTSUP = 3,    /* not supported here (device, option combination, missing op) */
  HQ_ESHAPE = 4,     /* a shape violates a format's rule (e.g. rows % 32 != 0) */
  HQ_EPARSE = 5,     /* a recipe is malformed; the message has file:line */
  HQ_ENOENT = 6,     /* a file, plugin, format or representation does not exist */
  HQ_EABI = 7,       /* a plugin is incompatible or broken */
  HQ_EDEVICE = 8,    /* a CUDA / cuBLASLt call failed; the message has file:line */
  HQ_EIO = 9,        /* reading or writing a file failed */
  HQ_ESTATE = 10,    /* an object is in the wrong state (saved, direction dropped, ...) */
  HQ_EINTERNAL = 11  /* a bug in hq: please report the message */
} hq_status;

/* ---------------------------------------------------------------------------------------------
** Data types. HQ_E2M1X2 is one byte holding two FP4 E2M1 elements (element 2i in the low
** nibble, 2i+1 in the high nibble); shapes of such buffers count bytes.
*/
typedef enum hq_dtype {
  HQ_DTYPE_INVALID = 0,
  HQ_F32 = 1,
  HQ_F16 = 2,
  HQ_BF16 = 3,
  HQ_U8 = 4,
  HQ_E4M3 = 5,     /* FP8 E4M3 (OCP "fn": no Inf, NaN = 0x7F/0xFF), max 448 */
  HQ_E5M2 = 6,     /* FP8 E5M2, max 57344 */
  HQ_E8M0 = 7,     /* unsigned power-of-two scale 2^(e-127), 0xFF = NaN */
  HQ_E2M1X2 = 8,   /* two FP4 E2M1 per byte */
  HQ_I32 = 9
} hq_dtype;

/* Directions (a bit mask). */
#define HQ_ROWWISE 1u
#define HQ_COLWISE 2u
#define HQ_BOTH (HQ_ROWWISE | HQ_COLWISE)

/* Device ordinal of host memory; values >= 0 are CUDA device ordinals. */
#define HQ_DEVICE_HOST (-1)

/* A non-owning view of a contiguous row-major 2-D high-precision tensor [rows, cols]. */
typedef struct hq_tensor {
  void *data;
  hq_dtype dtype;    /* HQ_F32, HQ_F16 or HQ_BF16 */
  int32_t device;    /* HQ_DEVICE_HOST or a CUDA ordinal */
  int64_t rows;      /* M: the product of all leading dimensions */
  int64_t cols;      /* K: the last (contiguous) dimension */
} hq_tensor;

/* ---------------------------------------------------------------------------------------------
** Storages: one direction of one quantized tensor, as a list of named buffers.
*/
#define HQ_MAX_BUFFERS 8
#define HQ_MAX_BUFFER_DIMS 4
#define HQ_META_BYTES 64

/* hq_buffer.flags */
#define HQ_BUF_SHARDED 1u  /* dim 0 runs along the tensor's rows (M): the default FSDP protocol
                              gathers this buffer along dim 0 */
#define HQ_BUF_SHARED 2u   /* COLWISE storage only: when the ROWWISE storage of the same tensor is
                              made by the same call, this buffer IS rowwise buffer `shared_with`
                              (same memory; e.g. per-tensor FP8's single scale_inv). The core
                              allocates it on its own when no rowwise storage exists. */

typedef struct hq_buffer {
  const char *name;        /* static string: "data", "scale_inv", "amax", ... */
  hq_dtype dtype;
  uint32_t flags;          /* HQ_BUF_* */
  int32_t ndim;            /* 1..HQ_MAX_BUFFER_DIMS */
  int32_t shared_with;     /* with HQ_BUF_SHARED: index into the rowwise storage's buf[] */
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  size_t bytes;            /* set by the core from dtype and shape */
  void *ptr;               /* set by the core: device memory when the storage's device >= 0 */
} hq_buffer;

/* Describe one buffer in layout(): name, dtype, 1-D [d0] (ndim = 1, d1 ignored) or 2-D [d0, d1],
   HQ_BUF_* flags. */
static inline void hq_buffer_describe(hq_buffer *b, const char *name, hq_dtype dtype, int ndim,
                                      int64_t d0, int64_t d1, uint32_t flags) {
  b->name = name;
  b->dtype = dtype;
  b->ndim = ndim;
  b->shape[0] = d0;
  b->shape[1] = ndim > 1 ? d1 : 0;
  b->flags = flags;
}

typedef struct hq_storage {
  uint32_t dir;            /* HQ_ROWWISE or HQ_COLWISE */
  uint32_t nbuf;           /* number of buffers described, <= HQ_MAX_BUFFERS */
  int64_t rows, cols;      /* the logical [M, K] of the quantized tensor */
  int32_t device;          /* where the buffers live */
  int32_t nominal;         /* hq_dtype of the high-precision tensor it stands for (f32, f16,
                              bf16): the source dtype of a quantize, the caller's for make_empty */
  hq_buffer buf[HQ_MAX_BUFFERS];   /* fixed, documented order per format (= save order) */
  uint8_t meta[HQ_META_BYTES];     /* plugin-private metadata, zeroed by the core before layout(),
                                      travels with the storage (copy, save, checkpoint) */
} hq_storage;

/* ---------------------------------------------------------------------------------------------
** Options: each plugin declares the recipe keys it accepts. The core validates every key of a
** [format NAME] section against this table (unknown key, wrong type, out of range, bad choice:
** an error with file:line), fills defaults and hands configure() the parsed values.
*/
typedef enum hq_opt_type {
  HQ_OPT_BOOL = 1,   /* true/false, yes/no, on/off, 1/0           -> hq_optval.i (0 or 1)  */
  HQ_OPT_INT = 2,    /* decimal or 0x hex integer, within [min,max] -> hq_optval.i            */
  HQ_OPT_FLOAT = 3,  /* a finite decimal number, within [min,max]   -> hq_optval.f            */
  HQ_OPT_ENUM = 4,   /* one of `choices` ("e4m3|e5m2")             -> hq_optval.i (its index) */
  HQ_OPT_STRING = 5  /* any text                                    -> hq_optval.s            */
} hq_opt_type;

typedef struct hq_option {
  const char *name;     /* recipe key: [a-z0-9_]+; NULL ends the table */
  hq_opt_type type;
  const char *def;      /* default, written as in a recipe; must itself be valid */
  const char *help;     /* one line, printed by `hq info` */
  const char *choices;  /* HQ_OPT_ENUM: '|'-separated choices, else NULL */
  double min, max;      /* HQ_OPT_INT / HQ_OPT_FLOAT: inclusive range; min > max = unbounded */
} hq_option;

typedef struct hq_optval {
  int64_t i;            /* BOOL, INT, ENUM index */
  double f;             /* FLOAT */
  const char *s;        /* STRING: valid for the lifetime of the format instance */
} hq_optval;

/* ---------------------------------------------------------------------------------------------
** The host table: services the core offers a plugin. Const, valid for the life of the process.
*/
struct hq_call;

typedef struct hq_host_api {
  uint32_t abi_major, abi_minor, struct_size;
  const char *core_version;        /* "0.1.0" */
  /* Record the message of the current failure (per thread); returns `code`. */
  int (*error)(int code, const char *fmt, ...) HQ_PRINTF(2, 3);
  /* Log through the embedder's logger: level 0 = error, 1 = warning, 2 = info, 3 = debug. */
  void (*log)(int level, const char *fmt, ...) HQ_PRINTF(2, 3);
  /* Scratch memory for the duration of one call, on call->device, ordered on call->stream.
     Returns NULL (with an error recorded) on failure. */
  void *(*alloc)(const struct hq_call *call, size_t bytes);
  void (*free)(const struct hq_call *call, void *ptr);
  /* Compute capability of a CUDA device as major*10+minor (90 = Hopper), 0 for the host or when
     it cannot be read. */
  int (*device_arch)(int device);
} hq_host_api;

/* ---------------------------------------------------------------------------------------------
** hq_call: where and how one operation runs. Built by the core for every call.
*/
typedef struct hq_call {
  uint32_t struct_size;
  int32_t device;                  /* HQ_DEVICE_HOST or the CUDA ordinal (already current) */
  void *stream;                    /* cudaStream_t (NULL = legacy default stream) */
  void *blas;                      /* cublasLtHandle_t, or NULL */
  void *workspace;                 /* GEMM workspace on `device`, or NULL */
  size_t workspace_bytes;
  uint64_t seed;                   /* random stream for stochastic rounding: the context's seed */
  uint64_t offset;                 /* ... and an offset the core advances once per quantize or
                                      update operation: the calls that make the two directions
                                      of one tensor share it, so derive each direction's stream
                                      from (seed, offset, direction, element position) */
  float *state;                    /* this quantizer's slice of the shared scaling state
                                      (state_floats() floats, on `device`), or NULL */
  const hq_host_api *host;
  void *core_private;              /* owned by the core; do not touch */
} hq_call;

/* ---------------------------------------------------------------------------------------------
** Capability flags (hq_format_ops.caps, instance_caps()).
*/
#define HQ_CAP_CPU (1ull << 0)            /* quantize/dequantize run on host memory */
#define HQ_CAP_CUDA (1ull << 1)           /* quantize/dequantize run on CUDA device memory */
#define HQ_CAP_REQUANT_SAFE (1ull << 2)   /* quantizing the same input again gives the same bytes
                                             (no RNG, no state): an activation may be dropped and
                                             rebuilt from the original */
#define HQ_CAP_COLWISE_ONLY (1ull << 3)   /* a COLWISE storage can be made without a ROWWISE one */
#define HQ_CAP_STATEFUL (1ull << 4)       /* uses the shared scaling state (delayed scaling) */

/* ---------------------------------------------------------------------------------------------
** The ops table a module returns. Fields marked (required) must be non-NULL; the core rejects
** the module otherwise, naming the missing field. Every other op is optional: NULL selects the
** core's default, described at the field.
*/
typedef struct hq_format_ops {
  /* --- identification (ABI 1.0) ------------------------------------------------------------ */
  uint32_t abi_major;          /* = HQ_ABI_MAJOR the module was built with */
  uint32_t abi_minor;          /* = HQ_ABI_MINOR the module was built with */
  uint32_t struct_size;        /* = sizeof(hq_format_ops) as the module saw it */
  uint32_t config_size;        /* bytes of per-instance configuration (0 allowed) */
  const char *name;            /* (required) unique format name, [a-z0-9_]{1,31} */
  const char *version;         /* (required) the module's own version string */
  const char *description;     /* one line for `hq info` */
  uint64_t caps;               /* HQ_CAP_* of the module */
  const hq_option *options;    /* (required) option table, ended by {NULL}; may be empty */

  /* --- configuration ------------------------------------------------------------------------ */
  /* (required) Turn validated option values (vals[i] belongs to options[i]) into the instance
     configuration `cfg` (config_size zeroed bytes). Reject combinations the table cannot express
     (e.g. "stochastic_rounding needs dtype e2m1") with HQ_EINVAL. */
  int (*configure)(void *cfg, const hq_optval *vals, const hq_host_api *host);
  /* Free whatever configure() acquired. NULL: nothing to free. */
  void (*release)(void *cfg);
  /* Capabilities of this instance (e.g. REQUANT_SAFE only without stochastic rounding).
     NULL: `caps`. */
  uint64_t (*instance_caps)(const void *cfg);
  /* Floats of shared scaling state per quantizer (delayed scaling). NULL: 0. Reserved: this
     core version refuses an instance that asks for state (the recipe reports it). */
  uint32_t (*state_floats)(const void *cfg);
  /* Initialise a fresh state slice (host memory). NULL: zeroes. */
  int (*init_state)(const void *cfg, float *state);

  /* --- storages ----------------------------------------------------------------------------- */
  /* (required) Describe the buffers of direction `dir` of a [rows, cols] tensor into *out: set
     nbuf and for each buffer name, dtype, ndim, shape, flags (and shared_with). `dirs` is the set
     of directions made together in this tensor. Check the shape rules here and fail with
     HQ_ESHAPE naming the dimension and the required multiple. out->dir, rows, cols, device and
     nominal are set and meta is zeroed by the core; the plugin may write meta. */
  int (*layout)(const void *cfg, const hq_host_api *host, int64_t rows, int64_t cols,
                uint32_t dir, uint32_t dirs, hq_storage *out);
  /* Initialise freshly allocated buffers (e.g. zero scale padding). NULL: buffers are left
     uninitialised. */
  int (*make_empty)(const void *cfg, const hq_call *call, hq_storage *s);

  /* --- numerics ----------------------------------------------------------------------------- */
  /* (required) Quantize `src` into the allocated storages of the directions in `dirs`; `row` is
     NULL unless dirs has HQ_ROWWISE, `col` NULL unless it has HQ_COLWISE. src->device equals
     call->device. Run on call->stream; a CUDA path may return before the stream finishes. */
  int (*quantize)(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                  hq_storage *row, hq_storage *col);
  /* Re-quantize into existing storages in place (the optimizer's write-back). Same contract as
     quantize(). NULL: the core calls quantize(). */
  int (*update)(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                hq_storage *row, hq_storage *col);
  /* (required) Write the values a storage represents into dst ([rows, cols], any of F32, F16,
     BF16, on call->device). A storage that cannot be dequantized alone returns HQ_ENOTSUP. */
  int (*dequantize)(const void *cfg, const hq_call *call, const hq_storage *s, hq_tensor *dst);

  /* --- lifecycle ---------------------------------------------------------------------------- */
  /* Hand the storage's buffers out (activation recompute, offload, checkpoints): write the
     pointers of every buffer the storage owns into out[0..*n) in the format's save order and set
     their buf[i].ptr to NULL; ownership moves to the caller. Buffers the storage shares with the
     rowwise storage (HQ_BUF_SHARED) arrive with ptr == NULL and are not listed. The core checks
     that exactly the owned buffers were handed out, each once. NULL: the owned buffers in buf[]
     order. */
  int (*save)(const void *cfg, hq_storage *s, void **out, uint32_t *n);
  /* Take back exactly what save() handed out, in the same order (n pointers), setting buf[i].ptr.
     NULL: the inverse of the default save. */
  int (*restore)(const void *cfg, hq_storage *s, void *const *in, uint32_t n);

  /* --- FSDP buffer protocol ------------------------------------------------------------------
     Reserved in ABI 1.0 for the core's FSDP all-gather (it gathers each listed buffer along
     dim 0 across ranks). This core version does not call them yet; a format may leave them
     NULL, which selects the defaults described here. */
  /* Which buffers are gathered along dim 0 (bit i = buf[i]). NULL: those with HQ_BUF_SHARDED. */
  int (*fsdp_buffer_fields)(const void *cfg, const hq_storage *s, uint32_t *mask);
  /* Make a shard's buffers concatenable along dim 0 (undo padding, undo transposes): describe
     them into out[0..*n) (ptr may alias the shard or come from host->alloc()).
     NULL: the fields of fsdp_buffer_fields() as they are. */
  int (*fsdp_extract)(const void *cfg, const hq_call *call, const hq_storage *shard,
                      hq_buffer *out, uint32_t *n);
  /* Put gathered buffers back into a full-size storage (redo padding and transposes).
     NULL: copy each gathered buffer into the same-index field. */
  int (*fsdp_assign)(const void *cfg, const hq_call *call, const hq_buffer *gathered, uint32_t n,
                     hq_storage *full);

  /* --- GEMM -------------------------------------------------------------------------------- */
  /* D = alpha * op(A) * op(B) + beta * D in the cuBLAS column-major convention: A's rowwise
     storage is used when transa, its columnwise one otherwise; B's rowwise one when !transb.
     Return HQ_ENOTSUP when this pair, layout or device is not handled natively: the core then
     dequantizes both operands and runs its emulated GEMM. NULL: always emulated. Reserved in
     ABI 1.0 for the core's GEMM dispatch, which does not call it yet. */
  int (*gemm)(const void *cfg_a, const hq_storage *a, int transa, const void *cfg_b,
              const hq_storage *b, int transb, hq_tensor *d, float alpha, float beta,
              const hq_call *call);
} hq_format_ops;

/* The entry point every format module exports (and nothing else). Called once per load with the
   core's host table; returns the module's static ops table, or NULL (after host->error()) to
   refuse this core. */
typedef const hq_format_ops *(*hq_format_entry_fn)(const hq_host_api *host);
HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v1(const hq_host_api *host);

/* Size of the ABI 1.0 ops table: the smallest struct_size the core accepts. */
#define HQ_FORMAT_OPS_V1_0_SIZE (offsetof(hq_format_ops, gemm) + sizeof(void (*)(void)))

#ifdef __cplusplus
}
#endif
#endif /* HQ_PLUGIN_H */
