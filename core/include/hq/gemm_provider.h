/*
** hq/gemm_provider.h -- the GEMM provider ABI of libhqcore, version 1.3.
**
** A GEMM provider multiplies two operands -- quantized storages described by their operand
** descriptors (hq/plugin.h, hq_operand_desc) or high-precision tensors -- in one way: cuBLASLt's
** native low-precision GEMMs, a kernel that reads one operand's codes and scales itself, the
** emulated dequantize-then-multiply path. hq_gemm (hq/hq.h) only dispatches: it asks the
** providers, highest priority first, and the first that takes the problem runs it.
**
** libhqcore carries three providers, each in its own folder of the source tree and each written
** against this header alone: "cublaslt" (gemm/cublaslt/: the native FP8 per-tensor and FP8-block
** GEMMs of Hopper, the block-scaled MXFP8 / NVFP4 GEMMs of Blackwell), "fused_hopper"
** (gemm/fused_hopper/: the emulated BF16 product with an MXFP8 or NVFP4 operand decoded inside a
** Hopper wgmma kernel) and "emulated" (gemm/emulated/: the raw values of both operands, then one
** BF16 or F32 cuBLASLt GEMM, or an F32 sgemm on the host; it takes every problem, so hq_gemm
** always has a path). A third party ships another provider as a shared object exactly as it ships
** a format: a module on the plugin search path that exports one function,
**     HQ_GEMM_EXPORT const hq_gemm_provider *hq_gemm_provider_v1(const hq_gemm_host *host);
** (HQ_GEMM_PROVIDER_DEFINE writes it) and hides everything else. The loader takes a module that
** exports it as a GEMM provider of the set (hq_plugins_open), checks it like a format (ABI
** major and minor, table size, name, required operations) and rejects it with the reason
** otherwise. A provider is consulted for GEMMs whose quantized operands come from formats of a
** set that loaded it; the built-in ones for every GEMM.
**
** How a GEMM is dispatched
**   1. hq_gemm resolves each operand to the direction its transpose flag needs, checks shapes,
**      D and the transforms (both operands must carry the same one along k), then builds an
**      hq_gemm_kind: the two operands' descriptors and dtypes, the flags, D's dtype and the
**      device's architecture -- no pointer, no shape.
**   2. accepts(kind) of every provider is a PURE predicate: HQ_OK when the provider can multiply
**      operands of these kinds on this architecture, HQ_ENOTSUP with the reason otherwise. The
**      core caches the answers per context, keyed on the two format instances and their
**      directions, the transpose flags, the high-precision dtypes, D's dtype and the caller's
**      flags: an answer must depend on nothing else (not on shapes, pointers or time).
**   3. run() of the accepting providers, in order of priority: a provider may still decline a
**      particular problem (a shape or an alignment its kernels do not take) with HQ_ENOTSUP
**      before it runs anything; the next provider is asked. With HQ_GEMM_QUERY in r->flags
**      (hq_gemm_plan) run() only answers. hq_gemm_info reports the provider that ran, the path
**      it took, and the reason the most preferred one declined.
**
** Contract of run(): everything on call->device (current during the call) and call->stream, no
** synchronization, no allocation but host->api->alloc (stream-ordered scratch); D = alpha * op(A) * op(B) + beta * D (+ bias), cuBLAS's column-major convention
** (hq/hq.h, "GEMMs"), D row-major [n, m]; r->path and r->fused say what ran. A provider never
** prints, aborts or exits; it reports failures through host->api->error() as a format does.
**
** Compatibility rules are the format ABI's (hq/plugin.h): structs start with their size, fields
** are only appended, a provider states the minor it requires, the core refuses another major or
** a newer minor, reads only struct_size bytes of the table and takes absent fields as NULL.
*/
#ifndef HQ_GEMM_PROVIDER_H
#define HQ_GEMM_PROVIDER_H

#include "hq/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HQ_GEMM_ABI_MAJOR 1
#define HQ_GEMM_ABI_MINOR 4

/* The one symbol a GEMM provider module exports. */
#define HQ_GEMM_ENTRY_NAME "hq_gemm_provider_v1"

/* Paths a provider reports (hq_gemm_run.path); hq/hq.h repeats them for embedders. */
#define HQ_GEMM_PATH_NONE 0u
#define HQ_GEMM_PATH_NATIVE 1u         /* low-precision tensor cores read the stored codes */
#define HQ_GEMM_PATH_EMULATED_BF16 2u  /* raw values in BF16, one BF16 GEMM */
#define HQ_GEMM_PATH_EMULATED_F32 3u   /* raw values in F32, one F32 GEMM (no TF32) */
#define HQ_GEMM_PATH_CPU 4u            /* on the host, an F32 sgemm */
#define HQ_GEMM_PATH_FUSED_BF16 5u     /* the emulated BF16 product, one operand decoded in-kernel */

/* The caller's flags (hq_gemm_args.flags), as providers see them in hq_gemm_kind.flags. */
#define HQ_GEMM_FORCE_EMULATED 1u /* only the plain emulated path may run */
#define HQ_GEMM_FUSED_ALWAYS 2u   /* a fused path runs wherever it can, whatever the shape */
#define HQ_GEMM_NO_FUSED 4u       /* no fused path */
#define HQ_GEMM_FAST_ACCUM 8u     /* per-tensor FP8 on the native path: cuBLASLt's fast
                                     accumulation (partial sums kept in the tensor cores' narrower
                                     accumulator between promotions), faster and less exact; the
                                     default is the split FP32 accumulator. Other paths ignore it */

/* hq_gemm_operand_kind.flags: what the storage's format module offers (decided by the module's
   table size and operations, never by the minor it requires). */
#define HQ_GEMM_OP_RAW 1u     /* its dequantize writes raw values (HQ_CALL_DEQ_RAW): elements times
                                 block scales, without the per-tensor factor and any transform */
#define HQ_GEMM_OP_FACTOR 2u  /* it has a per-tensor factor (tensor_factor()) that multiplies the
                                 raw values; host->factor() gives it */
#define HQ_GEMM_OP_FOLDS 4u   /* its raw dequantize can write that factor itself
                                 (HQ_CAP_DEQ_FACTOR; hq_gemm_fold) */
#define HQ_GEMM_OP_RAWCOPY 8u /* the storage carries its raw values in BF16 (a HQ_ROLE_RAW
                                 buffer of the tensor's shape): host->raw() in BF16 returns them
                                 in place, no dequantize runs */
#define HQ_GEMM_OP_ROWF 16u   /* its raw values split into BF16-exact values times one FP32
                                 factor per stored row (HQ_CAP_DEQ_ROW_FACTOR): host->raw_rows()
                                 gives both (1.2) */

/* One operand as accepts() sees it. */
typedef struct hq_gemm_operand_kind {
  uint32_t dir;                 /* HQ_ROWWISE / HQ_COLWISE (the direction the flag selected), 0
                                   for a high-precision tensor */
  int32_t trans;                /* the caller's transpose flag of this operand (0 or 1) */
  hq_dtype dtype;               /* high precision: the tensor's dtype; quantized: desc->elem */
  uint32_t flags;               /* HQ_GEMM_OP_* (0 for high precision) */
  const hq_operand_desc *desc;  /* quantized: the storage's descriptor; NULL: high precision */
  const char *format;           /* the module's name, or the dtype's, for messages */
} hq_gemm_operand_kind;

/* What a provider's predicate is asked: everything that decides whether it can multiply, and
   nothing that changes from call to call. */
typedef struct hq_gemm_kind {
  uint32_t struct_size;
  uint32_t flags;               /* the caller's HQ_GEMM_FORCE_EMULATED | FUSED_ALWAYS | NO_FUSED |
                                   FAST_ACCUM */
  int32_t device;               /* HQ_DEVICE_HOST or a CUDA ordinal */
  int32_t arch;                 /* compute capability major*10+minor; 0 on the host */
  hq_gemm_operand_kind a, b;
  hq_dtype d_dtype;             /* HQ_F32 or HQ_BF16 */
  uint32_t reserved;            /* zero */
} hq_gemm_kind;

/* One operand of a problem. */
typedef struct hq_gemm_operand {
  const hq_storage *st;         /* quantized: the storage of the kind's direction; else NULL */
  const hq_tensor *hp;          /* high precision: the tensor (on call->device); else NULL */
  int64_t rows, cols;           /* the logical [X0, X1] (a qtensor's [rows, cols]) */
  const char *role;             /* for messages: the role, or "high-precision tensor" */
  const void *handle;           /* the core's: identifies the operand to host services */
} hq_gemm_operand;

/* One GEMM, as run() gets it. */
typedef struct hq_gemm_run {
  uint32_t struct_size;
  uint32_t flags;               /* HQ_GEMM_QUERY (hq/plugin.h): answer only, run nothing */
  const hq_gemm_kind *kind;     /* the kind accepts() was asked */
  hq_gemm_operand a, b;
  int64_t m, n, k;              /* op(A): m x k, op(B): k x n */
  const hq_tensor *d;           /* row-major [n, m], HQ_F32 or HQ_BF16; its data is NULL in a
                                   query without D */
  const void *bias;             /* NULL, or [m] of bias_dtype: D[j][i] += bias[i] */
  hq_dtype bias_dtype;
  float alpha, beta;
  const char *what;             /* for messages: "hq_gemm (fprop: weight fc1, ...)" */
  /* --- written by run() --- */
  uint32_t path;                /* HQ_GEMM_PATH_* it took (or, in a query, would take) */
  uint32_t fused;               /* HQ_GEMM_PATH_FUSED_BF16: 1 = A read as codes, 2 = B; else 0 */
  /* --- present when struct_size covers them (an older core: absent, check first) --- */
  float *amax_d;                /* NULL, or where max |D| of the stored result goes (call->device
                                   memory, hq_gemm_args.amax_d): a provider whose GEMM produces
                                   it (an epilogue) writes it there and sets amax_done; otherwise
                                   the core makes it with one pass over D after run() */
  uint32_t amax_done;           /* written by run(): 1 when it wrote *amax_d */
} hq_gemm_run;

/* host->raw(): fold an operand's per-tensor factor into a running product while dequantizing
   (HQ_GEMM_OP_FOLDS), so that no kernel runs for it: the dequantize writes
   hq_mul_rn(m, factor) into *out, m = *in when `in` is not NULL, else `mul`. */
typedef struct hq_gemm_fold {
  float *out;                   /* one FP32 value in call->device memory */
  const float *in;              /* NULL, or the product so far (call->device memory) */
  float mul;                    /* the product so far when `in` is NULL */
  int32_t done;                 /* set by raw(): 1 when the dequantize wrote *out */
} hq_gemm_fold;

/* Services the core offers a provider. Const, valid for the life of the process. */
typedef struct hq_gemm_host {
  uint32_t abi_major, abi_minor, struct_size;
  const hq_host_api *api;       /* the format host table: error, log, alloc and free (scratch
                                   ordered on call->stream), device_arch, lt_matmul (the core's
                                   cuBLASLt runner, with its plan cache and the context's
                                   workspace) */
  /* The raw values of operand o as a row-major [o->rows, o->cols] array of dtype dt (HQ_F32
     or HQ_BF16) on call->device. *data is the operand's own memory when it already holds
     exactly that -- a high-precision tensor of dtype dt, a storage whose descriptor says its
     data buffer is its raw values (no scale, no transform, no per-tensor factor, elements of dt
     in [M, K] order), or a storage with a raw-values buffer (HQ_ROLE_RAW) of dtype dt -- and
     *tmp is then NULL; otherwise a temporary the service allocates
     through the call's context and fills on call->stream (*tmp = *data), to be freed with
     host->api->free(call, *tmp) after the work that reads it (stream order). A storage is
     dequantized through its format with HQ_CALL_DEQ_RAW (completely, factor 1, when the module
     lacks HQ_GEMM_OP_RAW); a high-precision tensor is converted (rounding to nearest). fold:
     NULL, or a factor to fold while dequantizing (hq_gemm_fold; taken only with
     HQ_GEMM_OP_FOLDS: fold->done says whether it was). */
  int (*raw)(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt, const void **data,
             void **tmp, hq_gemm_fold *fold);
  /* The per-tensor factor of a storage with HQ_GEMM_OP_FACTOR: one FP32 value written to *out
     (call->device memory) on call->stream. */
  int (*factor)(const hq_call *call, const hq_gemm_operand *o, float *out);
  /* --- 1.1 (check hq_gemm_host_has_raw_pair) ---
     raw(call, a, dta, ...) and raw(call, b, dtb, ...) without folds, in one request: the same
     results, but the two dequantizations may run side by side (b's on call->stream, a's on a
     second stream of the context that waits for call->stream first and that call->stream waits
     for before this returns), so that a GEMM of two small quantized operands waits for one
     dequantize's latency, not two. On failure the temporaries that were allocated are still the
     caller's to free. */
  int (*raw_pair)(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
                  const void **data_a, void **tmp_a, const hq_gemm_operand *b, hq_dtype dtb,
                  const void **data_b, void **tmp_b);
  /* --- 1.2 (check hq_gemm_host_has_raw_rows) ---
     The raw values of a storage operand with HQ_GEMM_OP_ROWF split in two: *data a row-major
     [o->rows, o->cols] temporary of dtype dt (HQ_BF16 or HQ_F32) holding the raw values without
     their per-row factors (exact in BF16), and *factors a temporary of one FP32 factor per
     stored row -- o->rows of them for a rowwise storage, o->cols for a columnwise one: the
     operand's outer index in the GEMM -- so that raw value (r, c) of the storage's rows is
     data times factors. Both allocated through the call's context and filled on call->stream,
     to be freed with host->api->free() after the work that reads them; on failure the ones
     allocated are still the caller's to free. fold: as raw() takes it (the per-tensor factor
     folded by the same dequantize, HQ_GEMM_OP_FOLDS; fold->done says whether it was). */
  int (*raw_rows)(const hq_call *call, const hq_gemm_operand *o, hq_dtype dt, void **data,
                  float **factors, hq_gemm_fold *fold);
  /* --- 1.3 (check hq_gemm_host_has_raw_pair_fold) ---
     raw_pair() with a fold for each operand (fa, fb: NULL or as raw() takes them), the two
     dequantizations still side by side: each folds its own factor into its own product, so
     neither may read the other's (fb->in == fa->out or fa->in == fb->out is refused with
     HQ_EINVAL); the caller multiplies the two products (e.g. as hq_lt_matmul.alpha_factor).
     fa->done and fb->done say which were folded, as after raw().
     1.4: B's fold may read A's product (fb->in == fa->out, a chain): the two dequantizations
     then run as one request to their format (see joint()) or in turn, never side by side, and
     B's is folded only when A's was (fb->done 0 otherwise). fa->in == fb->out is still
     refused. */
  int (*raw_pair_fold)(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
                       const void **data_a, void **tmp_a, hq_gemm_fold *fa,
                       const hq_gemm_operand *b, hq_dtype dtb, const void **data_b, void **tmp_b,
                       hq_gemm_fold *fb);
  /* (1.3; hq_gemm_host_capturing) 1 while call->stream is being captured into a CUDA graph,
     else 0 (also on the host and when CUDA cannot tell): a replayed graph launches its kernels
     without the host, so work that costs host time per call (forks, joins, one more launch)
     can pay in a graph and not eagerly. Outside a capture the core then readies what a later
     capture's raw_pair / raw_pair_fold needs to fork (the context's side stream). */
  int (*capturing)(const hq_call *call);
  /* --- 1.4 (hq_gemm_host_joint) ---
     1 when raw_pair / raw_pair_fold of a (in dta) and b (in dtb) would hand both
     dequantizations to their format module as one request (format ABI 2.6's
     dequantize_pair: both need one, one module offers it), which may then run them as one
     launch, a chain included; else 0. Queues nothing. */
  int (*joint)(const hq_call *call, const hq_gemm_operand *a, hq_dtype dta,
               const hq_gemm_operand *b, hq_dtype dtb);
} hq_gemm_host;

/* Whether the core offers raw_pair (a 1.0 core does not). */
#define HQ_GEMM_HOST_SIZE_1_1 (offsetof(hq_gemm_host, raw_pair) + sizeof(void *))
static inline int hq_gemm_host_has_raw_pair(const hq_gemm_host *h) {
  return h->abi_minor >= 1 && h->struct_size >= HQ_GEMM_HOST_SIZE_1_1 && h->raw_pair != NULL;
}

/* Whether the core offers raw_rows (a 1.0 or 1.1 core does not). */
#define HQ_GEMM_HOST_SIZE_1_2 (offsetof(hq_gemm_host, raw_rows) + sizeof(void *))
static inline int hq_gemm_host_has_raw_rows(const hq_gemm_host *h) {
  return h->abi_minor >= 2 && h->struct_size >= HQ_GEMM_HOST_SIZE_1_2 && h->raw_rows != NULL;
}

/* Whether the core offers raw_pair_fold (a core before 1.3 does not). */
#define HQ_GEMM_HOST_SIZE_1_3 (offsetof(hq_gemm_host, capturing) + sizeof(void *))
static inline int hq_gemm_host_has_raw_pair_fold(const hq_gemm_host *h) {
  return h->abi_minor >= 3 && h->struct_size >= HQ_GEMM_HOST_SIZE_1_3 &&
         h->raw_pair_fold != NULL;
}

/* Whether call's stream is being captured into a CUDA graph (0 from a core before 1.3). */
static inline int hq_gemm_host_capturing(const hq_gemm_host *h, const hq_call *call) {
  return h->abi_minor >= 3 && h->struct_size >= HQ_GEMM_HOST_SIZE_1_3 && h->capturing &&
         h->capturing(call);
}

/* Whether raw_pair_fold of a and b would be one request to their format module, which then
   accepts a chained fold at one launch's cost (0 from a core before 1.4). */
#define HQ_GEMM_HOST_SIZE_1_4 (offsetof(hq_gemm_host, joint) + sizeof(void *))
static inline int hq_gemm_host_joint(const hq_gemm_host *h, const hq_call *call,
                                     const hq_gemm_operand *a, hq_dtype dta,
                                     const hq_gemm_operand *b, hq_dtype dtb) {
  return h->abi_minor >= 4 && h->struct_size >= HQ_GEMM_HOST_SIZE_1_4 && h->joint &&
         h->joint(call, a, dta, b, dtb);
}

/* The table a provider returns. */
typedef struct hq_gemm_provider {
  uint32_t abi_major;           /* = HQ_GEMM_ABI_MAJOR */
  uint32_t abi_minor;           /* the minor this provider REQUIRES of the core */
  uint32_t struct_size;         /* = sizeof(hq_gemm_provider) as the provider saw it */
  int32_t priority;             /* higher is asked first; ties in load order. The built-in ones:
                                   cublaslt 100, fused_hopper 50, emulated 0 (always last) */
  const char *name;             /* (required) unique, [a-z0-9_]{1,31} */
  const char *version;          /* (required) */
  const char *description;      /* one line for `hq info` */
  /* (required) The pure predicate (see the header comment): HQ_OK or HQ_ENOTSUP with the
     reason recorded through host->api->error(). */
  int (*accepts)(const hq_gemm_host *host, const hq_gemm_kind *kind);
  /* (required) Run (or with HQ_GEMM_QUERY, check) a problem of an accepted kind: HQ_OK, or
     HQ_ENOTSUP with the reason and nothing run, or another status on failure. */
  int (*run)(const hq_gemm_host *host, const hq_call *call, hq_gemm_run *r);
} hq_gemm_provider;

typedef const hq_gemm_provider *(*hq_gemm_entry_fn)(const hq_gemm_host *host);

#if defined(__GNUC__)
#define HQ_GEMM_EXPORT __attribute__((visibility("default")))
#else
#define HQ_GEMM_EXPORT
#endif

/* Writes a provider module's entry function: it refuses a core of another provider ABI major
   (returning NULL) and otherwise returns &table. */
#define HQ_GEMM_PROVIDER_DEFINE(table)                                                          \
  HQ_GEMM_DEFINE_AS_(hq_gemm_provider_v1, table, HQ_GEMM_EXPORT)
/* The same entry function under the name fn with visibility vis: also how libhqcore's own
   providers (entered by an internal name, not exported) define theirs, as HQ_FORMAT_DEFINE_AS_
   does for the built-in format. */
#define HQ_GEMM_DEFINE_AS_(fn, table, vis)                                                      \
  vis const hq_gemm_provider *fn(const hq_gemm_host *host);                                     \
  vis const hq_gemm_provider *fn(const hq_gemm_host *host) {                                    \
    return host && host->abi_major == HQ_GEMM_ABI_MAJOR ? &(table) : NULL;                      \
  }

/* Whether operand kind o keeps its contraction dimension k contiguous in its data buffer: a
   rowwise storage in [M, K] order or a columnwise one in [K, M] order. */
static inline int hq_gemm_k_contiguous(const hq_gemm_operand_kind *o) {
  return o->desc && ((o->dir == HQ_ROWWISE && o->desc->order == HQ_ORDER_MK) ||
                     (o->dir == HQ_COLWISE && o->desc->order == HQ_ORDER_KM));
}

/* The dtype an operand's raw values are exact in, which the emulated paths multiply in: BF16
   for a BF16 tensor or a storage whose module says its raw values fit (desc->emul_dtype), F32
   for everything else (F16 is exact in F32, not in BF16). */
static inline hq_dtype hq_gemm_emul_dtype(const hq_gemm_operand_kind *o) {
  if (!o->desc) return o->dtype == HQ_BF16 ? HQ_BF16 : HQ_F32;
  return (o->flags & HQ_GEMM_OP_RAW) && o->desc->emul_dtype == HQ_BF16 ? HQ_BF16 : HQ_F32;
}

/* Where operand o's per-tensor factor lies once its raw values were asked for without a fold
   (raw() without fd, or raw_pair()): host->factor()'s value written to *factor_slot for a storage
   whose kind k has HQ_GEMM_OP_FACTOR, else NULL (a factor of 1). */
static inline int hq_gemm_factor_of(const hq_gemm_host *host, const hq_call *call,
                                    const hq_gemm_operand *o, const hq_gemm_operand_kind *k,
                                    float *factor_slot, const float **factor) {
  *factor = NULL;
  if (!o->st || !(k->flags & HQ_GEMM_OP_FACTOR)) return HQ_OK;
  int rc = host->factor(call, o, factor_slot);
  if (!rc) *factor = factor_slot;
  return rc;
}

/* Where operand o's per-tensor factor lies once its raw values were asked for with fold fd
   (NULL: none; raw(), raw_rows() or raw_pair_fold()): fd->out when the dequantize folded it,
   else as hq_gemm_factor_of finds it. */
static inline int hq_gemm_folded_factor(const hq_gemm_host *host, const hq_call *call,
                                        const hq_gemm_operand *o, const hq_gemm_operand_kind *k,
                                        const hq_gemm_fold *fd, float *factor_slot,
                                        const float **factor) {
  if (fd && fd->done && o->st && (k->flags & HQ_GEMM_OP_FACTOR)) {
    *factor = fd->out;
    return HQ_OK;
  }
  return hq_gemm_factor_of(host, call, o, k, factor_slot, factor);
}

/* Operand o's raw values in dtype dt through host->raw() (*data, *tmp as raw() sets them; fd:
   NULL or the factor to fold, as raw() takes it), and where its per-tensor factor lies
   (*factor, hq_gemm_folded_factor). On failure *factor is NULL and *tmp, if set, is still the
   caller's to free. */
static inline int hq_gemm_raw_factor(const hq_gemm_host *host, const hq_call *call,
                                     const hq_gemm_operand *o, const hq_gemm_operand_kind *k,
                                     hq_dtype dt, const void **data, void **tmp,
                                     float *factor_slot, const float **factor, hq_gemm_fold *fd) {
  *factor = NULL;
  int rc = host->raw(call, o, dt, data, tmp, fd);
  return rc ? rc : hq_gemm_folded_factor(host, call, o, k, fd, factor_slot, factor);
}

/* The buffer of storage s with role `role` (hq_buffer.role), or NULL. */
static inline const hq_buffer *hq_storage_role(const hq_storage *s, uint32_t role) {
  for (uint32_t i = 0; s && i < s->nbuf; i++)
    if (hq_storage_cbuf(s, i)->role == role) return hq_storage_cbuf(s, i);
  return NULL;
}

#ifdef __cplusplus
}
#endif
#endif /* HQ_GEMM_PROVIDER_H */
