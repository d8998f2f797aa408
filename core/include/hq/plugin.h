/*
** hq/plugin.h -- the format plugin ABI of libhqcore, version HQ_ABI_MAJOR.HQ_ABI_MINOR (below).
**
** This is the only header a format author needs (hq/numerics.h, optional, adds the element
** codecs: FP8/FP4/E8M0 encode and decode, bf16/f16 loads and stores, usable from C and CUDA;
** hq/adamw.h the AdamW element rule a fused optimizer write-back applies).
** A format is a shared object (a libtool module) that exports exactly one function,
** hq_format_module_v2(), and hides every other symbol; HQ_FORMAT_DEFINE(ops) writes that
** function. It does not link against libhqcore: everything it needs from the core arrives
** through the const host table passed to that function and through the hq_call passed to every
** operation.
**
** Build and install a format next to the stock ones:
**     cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags hqcore) myfmt.c -o myfmt.so
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
** Each direction is one hq_storage: a list of named buffers the plugin *describes* (name, role,
** dtype, shape, FSDP gather rule) plus a public operand descriptor (element dtype, data order,
** scale mode and layout, block shape, transform, shard-row multiple). The core *allocates*,
** checks, moves, saves, offloads and gathers storages without knowing the format, and a GEMM
** or another instance of the same plugin reads a storage from its description alone:
**
**     core                              plugin
**     ----                              ------
**     parse [format] options  ------->  configure(cfg, vals)      cfg: config_size bytes
**     make a storage          ------->  layout(cfg, M, K, dir)    describe buffers + desc
**     allocate every buffer             make_empty(cfg, s)        optional: initialise them
**     per-tensor amax         ------->  amax(cfg, call, src)      optional (amax_kind)
**     quantize                ------->  quantize(cfg, call, src, dirs, row, col)
**     optimizer write-back    ------->  update(...)               NULL: quantize again
**     dequantize              ------->  dequantize(cfg, call, s, dst)
**     end of a step (state)   ------->  update_state(cfg, call, dirs, n, amax, state)  optional
**     FSDP gather, save       ------->  buffer_form, fsdp_extract / fsdp_assign, save /
**                                       restore   optional (2.4): a buffer the format moves itself
**
** When both directions of a tensor use the *same* format instance, the core makes ONE quantize
** call with dirs = HQ_ROWWISE|HQ_COLWISE (one read of the input). Otherwise it makes one call per
** direction with the other storage pointer NULL.
**
** Layout facts live in the storage, never only in the configuration: quantize() writes a storage
** that layout() of the same instance described, but dequantize() (and later a GEMM) may be
** handed a storage made by a *differently configured* instance of the plugin, and must read
** element dtype, order, scale layout, transform and its parameter from s->desc and the buffers.
**
** ---------------------------------------------------------------------------------------------
** Compatibility rules
** ---------------------------------------------------------------------------------------------
** - Every struct crossing the boundary starts with uint32_t struct_size (after abi_major and
**   abi_minor for the two tables). Fields are only appended; enum values never renumbered.
**   Whoever reads a struct it did not fill reads at most struct_size bytes and takes absent
**   trailing fields as zero / NULL. Structs embedded in arrays are reached through their stride:
**   hq_storage.buf[] through hq_storage_buf() (stride hq_storage.buf_size), never buf[i].
** - A module states in abi_minor the minor version it REQUIRES (the oldest core it works with),
**   not the header it was compiled with. The core refuses a different abi_major (a module that
**   exports only the ABI 1 entry hq_format_module_v1 is refused with that reason) and a required
**   minor newer than its own; it reads only struct_size bytes of the ops table, which must be
**   at least HQ_FORMAT_OPS_SIZE_2_1 bytes for a module requiring 2.1 to 2.3 and
**   HQ_FORMAT_OPS_SIZE_2_4 for one requiring 2.4.
** - A module must check host->abi_major (HQ_FORMAT_DEFINE does), and host->abi_minor /
**   host->struct_size before using a host field added after 2.0, and call->struct_size (or the
**   helper named at the field) before reading an hq_call field added after 2.0. It may return
**   NULL from its entry function to refuse a core.
** - What the core uses of a module is decided by what its table holds (struct_size, non-NULL
**   operations, caps), never by the minor it requires: a module whose table ends before the 2.1
**   fields gets its storages multiplied on the emulated GEMM path, dequantized completely into
**   F32.
** - Fields added after 2.0 sit under a one-line marker naming the version that added them
**   ("--- 2.1 ---"); flags and capability bits name it in their comment. What each version
**   added or removed, and how these rules came about: docs/abi.md.
**
** ---------------------------------------------------------------------------------------------
** State (2.1): formats whose scale depends on earlier steps (delayed scaling)
** ---------------------------------------------------------------------------------------------
** An instance may keep state across quantizations: state_floats(cfg, dirs) FP32 values per
** *slice*. The embedder creates one hq_state per recipe (hq.h); every quantizer bound to it gets
** one slice per stateful direction (one slice for both directions of a fused quantizer:
** dirs = HQ_BOTH), and the core keeps ALL slices in ONE buffer on the state's device:
**
**     [ amax[0] amax[1] ... amax[n-1] | state of slice 0 | state of slice 1 | ... ]
**
** Each slice owns one float of the contiguous amax array -- its amax accumulator, "history row
** 0" -- plus its state_floats() floats. The amaxes are contiguous so that a trainer reduces all
** of them with ONE all-reduce(MAX) before the update. The core groups the slices by (instance,
** dirs): within a group the amaxes are contiguous and the states follow each other with stride
** state_floats(cfg, dirs).
**   - init_state() writes one slice's initial state (host memory); its amax starts at 0.
**   - quantize()/update() of a stateful instance receive the slice in call->state (its
**     state_floats() floats) and call->state_amax (its amax), in memory of call->device, and
**     max-accumulate the input's amax into *call->state_amax (on call->stream). The core
**     refuses (HQ_ESTATE, naming the role) a stateful quantize whose quantizer is not bound;
**     a plugin seeing call->state == NULL refuses too.
**   - update_state() runs once per group at the end of a step (hq_state_update, after the
**     caller's reduction): it turns every amax of the group into the new state (for delayed
**     scaling: roll the history, compute the scale) and sets each amax back to 0 (the next
**     step's accumulator). One kernel per group on a device.
** A stateful instance is not HQ_CAP_REQUANT_SAFE (its bytes depend on the state).
**
** ---------------------------------------------------------------------------------------------
** Buffer forms (2.4): buffers a format moves itself, for FSDP and save/restore
** ---------------------------------------------------------------------------------------------
** By default the core moves a storage's buffers by their descriptions: an FSDP gather by each
** buffer's rule (hq_buffer.gather, m_div), hq_qtensor_save by handing every buffer out as it is.
** Where that cannot do the job -- a swizzled scale buffer interleaves the rows of 128-row tiles,
** so a shard's buffer is no piece of the whole tensor's -- a format may move a buffer itself as a
** FORM: bytes of the format's choosing (dtype, shape) that stand for the buffer while it travels.
** For each buffer the core asks buffer_form(purpose); one left with ndim 0 has no form and
** travels by the default. The purposes:
**   HQ_FORM_FSDP  a byte matrix [shape[0], shape[1]] of dtype that an all-gather concatenates
**                 along dim 0: row r covers rows [r*m_div, (r+1)*m_div) of M, so shape[0] =
**                 s->rows / m_div, with m_div dividing desc.shard_rows (e.g. a swizzled scale
**                 buffer's compact rows). fsdp_extract() writes a shard's form into staging the
**                 core allocated (form->ptr); the core lists it under the buffer's name, in the
**                 buffer's place. fsdp_assign() rebuilds the full tensor's buffer -- every byte,
**                 padding included -- from the gathered form (form->ptr, shape[0] = full M /
**                 m_div). The buffer's own gather rule is not used then: leave it
**                 HQ_GATHER_NEVER when only the form can gather it, so that a core older than
**                 2.4 (which ignores the ops) refuses it as before.
**   HQ_FORM_SAVE  what hq_qtensor_save hands out instead of the buffer (e.g. compact scales for
**                 a host offload): save() writes the form into memory the core allocated
**                 (form->ptr), the core frees the buffer and hands the form out under the
**                 buffer's name with the form's dtype and shape; restore() rewrites the buffer,
**                 allocated again by the core, from the form handed back, which the core then
**                 frees.
** The ops run on call->device / call->stream like every op (no allocation, no synchronization)
** and write every byte of their destination. buffer_form() is a pure function of the storage's
** description (descriptor, shape, buffers; never the instance configuration): the core asks
** again before an assign or a restore, and a storage made by another instance has the same
** forms. The core checks each form (dtype, shape, an FSDP form 2-D with shape[0] * m_div =
** s->rows) and keeps every check it makes without forms: a refusal before any communication,
** the gathered entries against the full tensor's forms, the entries given back to restore against
** the skeleton's forms.
**
** ---------------------------------------------------------------------------------------------
** Errors
** ---------------------------------------------------------------------------------------------
** Every operation returns an hq_status (0 = HQ_OK). On failure, call host->error(code, fmt, ...)
** to record a message naming the cause ("rows = 100 is not a multiple of 32"); it returns code,
** so `return host->error(HQ_ESHAPE, ...)` is the idiom. The core clears the message before each
** call and prefixes the role, format and plugin name. A plugin never aborts the process, never
** exits, never prints.
**
** ---------------------------------------------------------------------------------------------
** Memory and streams
** ---------------------------------------------------------------------------------------------
** The plugin never allocates tensor memory itself. Buffers described by layout() are allocated
** by the core (through the embedder's allocator) before quantize() runs. A call runs all its
** device work on call->stream, in order, and returns without synchronizing; call->device is the
** current CUDA device during the call. Scratch: call->scratch (scratch_size() bytes on
** call->device, valid for the call, ordered on call->stream), or host->alloc()/host->free()
** outside update. Per-instance configuration is config_size bytes the core allocates, zeroes and
** frees.
**
** ---------------------------------------------------------------------------------------------
** Threads
** ---------------------------------------------------------------------------------------------
** One format instance serves every quantizer and quantized tensor of its recipe, and those may
** be used from several threads at once (each with its own context): the core calls an
** instance's operations concurrently. The configuration is immutable once configure() returns
** -- every operation takes `cfg` as const and must not write through it -- and an operation
** keeps whatever it changes in the call (its scratch, the storages and state it is handed) or
** synchronizes it itself; a module's static data is read-only or guarded. configure(),
** instance_caps() and release() of an instance never run concurrently with anything else on
** it. The entry function is called once per plugin set that loads the module, possibly from
** several threads: it returns the same static table each time.
*/
#ifndef HQ_PLUGIN_H
#define HQ_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version this header describes. */
#define HQ_ABI_MAJOR 2
#define HQ_ABI_MINOR 6

/* The one symbol a format module exports. */
#define HQ_FORMAT_ENTRY_NAME "hq_format_module_v2"

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
** Data types. HQ_E2M1X2 is one byte holding two FP4 E2M1 elements, HQ_I4X2 one byte holding
** two signed 4-bit integers (two's complement, -8..7); in both element 2i is the low nibble and
** 2i+1 the high nibble (hq/numerics.h: hq_i4x2_pack, hq_i4x2_get). HQ_E3M2X4 / HQ_E2M3X4 are
** FP6 codes packed four in three bytes (element n at bits 6n .. 6n+5 of the row's little-endian
** bit stream, hq/numerics.h hq_fp6_pack4). Shapes of all packed buffers count bytes. The FP8
** element kind of a format is its hq_dtype (HQ_E4M3 or HQ_E5M2): there is no second FP8 enum.
** Values are only appended (HQ_E3M2X4, HQ_E2M3X4, HQ_I4X2: ABI 2.5; a module storing one of
** them requires abi_minor 5).
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
  HQ_I32 = 9,
  HQ_I8 = 10,      /* signed 8-bit integer codes */
  HQ_E3M2X4 = 11,  /* four FP6 E3M2 in three bytes (MXFP6; ABI 2.5) */
  HQ_E2M3X4 = 12,  /* four FP6 E2M3 in three bytes (MXFP6; ABI 2.5) */
  HQ_I4X2 = 13     /* two signed 4-bit integer codes per byte (ABI 2.5) */
} hq_dtype;

/* Directions (a bit mask). */
#define HQ_ROWWISE 1u
#define HQ_COLWISE 2u
#define HQ_BOTH (HQ_ROWWISE | HQ_COLWISE)

/* Device ordinal of host memory; values >= 0 are CUDA device ordinals. */
#define HQ_DEVICE_HOST (-1)

/* ---------------------------------------------------------------------------------------------
** hq_tensor: a non-owning view of a contiguous row-major 2-D high-precision tensor [rows, cols].
** Fill it with hq_tensor_2d() (or set struct_size = sizeof(hq_tensor) yourself).
** Alignment rule: data is aligned to its element size (2 bytes for bf16/f16, 4 for f32); the core
** refuses any other address (HQ_EINVAL) before a plugin sees it. A plugin must accept every
** element-aligned address (a view into the middle of a larger tensor): wider (vector) accesses
** only after checking the address, as the stock kernels do (16-byte loads at 16-byte alignment).
*/
typedef struct hq_tensor {
  uint32_t struct_size;    /* sizeof(hq_tensor) as the filler saw it (>= HQ_TENSOR_SIZE_2_0) */
  hq_dtype dtype;          /* HQ_F32, HQ_F16 or HQ_BF16 */
  void *data;
  int32_t device;          /* HQ_DEVICE_HOST or a CUDA ordinal */
  int32_t reserved0;       /* zero */
  int64_t rows;            /* M: the product of all leading dimensions */
  int64_t cols;            /* K: the last (contiguous) dimension */
} hq_tensor;

#define HQ_TENSOR_SIZE_2_0 (offsetof(hq_tensor, cols) + sizeof(int64_t))

static inline hq_tensor hq_tensor_2d(void *data, hq_dtype dtype, int32_t device, int64_t rows,
                                     int64_t cols) {
  hq_tensor t;
  t.struct_size = (uint32_t)sizeof(hq_tensor);
  t.dtype = dtype;
  t.data = data;
  t.device = device;
  t.reserved0 = 0;
  t.rows = rows;
  t.cols = cols;
  return t;
}

/* ---------------------------------------------------------------------------------------------
** The operand descriptor: how one direction's storage is laid out, in terms a GEMM (cuBLASLt)
** and the core understand. Filled by layout(); the core checks it against the buffers.
*/

/* hq_operand_desc.order: how the data buffer stores the logical [M, K] tensor. */
#define HQ_ORDER_MK 0u   /* [M, K] row-major: K contiguous (a packed dtype packs along K) */
#define HQ_ORDER_KM 1u   /* transposed, [K, M] row-major: M contiguous (packed along M) */

/* hq_operand_desc.scale_mode: what the scale buffer holds. The values mirror cuBLASLt's
   cublasLtMatmulMatrixScale_t where one exists (+1: 0 means "no scale"). */
#define HQ_SCALE_NONE 0u          /* no scale (high precision, or integer codes) */
#define HQ_SCALE_TENSOR_F32 1u    /* one FP32 scale_inv for the whole tensor (SCALAR_32F) */
#define HQ_SCALE_VEC16_UE4M3 2u   /* one E4M3 scale per 16 elements along the contraction dim,
                                     times a per-tensor global scale from the AMAX buffer */
#define HQ_SCALE_VEC32_UE8M0 3u   /* one E8M0 scale per 32 elements along the contraction dim */
#define HQ_SCALE_OUTER_VEC_F32 4u /* one FP32 scale per row of the non-contracted dim */
#define HQ_SCALE_VEC128_F32 5u    /* one FP32 scale per 128 elements (1x128 blocks) */
#define HQ_SCALE_BLK128X128_F32 6u /* one FP32 scale per 128x128 tile */
#define HQ_SCALE_OTHER 255u       /* a plugin-specific scheme; no native GEMM can read it */

/* hq_operand_desc.scale_layout: how the scale buffer is arranged. "outer" is the dimension the
   GEMM does not contract (M for the rowwise direction, K for the columnwise one), "block" the
   index of a scale block along the contracted dimension. Padding is whatever the buffer's shape
   adds beyond the logical extents; it is written as zero. */
#define HQ_SCALE_LAYOUT_NONE 0u         /* no scale buffer, or a single value */
#define HQ_SCALE_LAYOUT_OUTER_MAJOR 1u  /* [outer][block] row-major (for 128x128 tiles:
                                           [outer/128][block]) */
#define HQ_SCALE_LAYOUT_BLOCK_MAJOR 2u  /* [block][outer] row-major (cuBLASLt's M-major 1x128
                                           "GEMM-ready" layout; MXFP8's compact columnwise) */
#define HQ_SCALE_LAYOUT_SWIZZLED 3u     /* cuBLAS 128x4-tile swizzle with r = outer, c = block
                                           (hq_swizzle_offset() in hq/numerics.h): GEMM-ready,
                                           cannot be FSDP-gathered */

/* hq_operand_desc.transform: a transform applied to the values along this direction's
   contraction dimension before quantization (a GEMM of two operands is correct only when both
   carry the same transform along K). */
#define HQ_TRANSFORM_NONE 0u
#define HQ_TRANSFORM_RHT16 1u  /* 16-point random Hadamard transform; transform_param = the sign
                                  mask (bit i set: s_i = -1) */

typedef struct hq_operand_desc {
  uint32_t struct_size;     /* set by the core */
  hq_dtype elem;            /* element dtype of the data buffer */
  uint32_t order;           /* HQ_ORDER_* */
  uint32_t scale_mode;      /* HQ_SCALE_* */
  uint32_t scale_layout;    /* HQ_SCALE_LAYOUT_* */
  int32_t block_m, block_k; /* the quantization block in logical [M, K] terms: rows x cols that
                               share one scale (1x32, 32x1, 32x32, 16x16, 1x128, ...); 0 x 0
                               for a per-tensor scale or none */
  uint32_t transform;       /* HQ_TRANSFORM_* */
  uint64_t transform_param; /* the transform's parameter (RHT16: sign mask) */
  int64_t shard_rows;       /* FSDP: every shard's M must be a multiple of this for the shards'
                               storages to concatenate into the full tensor's, byte for byte;
                               0: this storage cannot be sharded (the core refuses) */
  /* --- 2.1 (zero from a 2.0 plugin) --- */
  hq_dtype emul_dtype;      /* the narrowest of HQ_BF16 / HQ_F32 that holds every value of the
                               storage's raw dequantization (HQ_CALL_DEQ_RAW) exactly: the
                               emulated GEMM multiplies in it. 0 reads as HQ_F32. */
  uint32_t reserved32;      /* zero */
  uint64_t reserved[7];     /* zero: room for 2.x fields */
} hq_operand_desc;

/* ---------------------------------------------------------------------------------------------
** Buffers and storages.
*/
#define HQ_MAX_BUFFERS 8
#define HQ_MAX_BUFFER_DIMS 4
#define HQ_META_BYTES 64 /* size of the reserved hq_storage.meta */

/* hq_buffer.role */
#define HQ_ROLE_OTHER 0u  /* plugin-specific */
#define HQ_ROLE_DATA 1u   /* the quantized elements (exactly one per storage) */
#define HQ_ROLE_SCALE 2u  /* the scale the data is multiplied by (scale_inv): at most one */
#define HQ_ROLE_AMAX 3u   /* the per-tensor amax the scales came from (FP32 [1]) */
#define HQ_ROLE_RAW 4u    /* (2.6) the storage's raw values, exactly what dequantize() with
                             HQ_CALL_DEQ_RAW writes into a tensor of the buffer's dtype (HQ_BF16
                             or HQ_F32), [rows, cols] row-major whichever the direction: written
                             by every quantize and update together with the data (at most one per
                             storage). The emulated GEMM reads it in place instead of
                             dequantizing the operand, so a format whose GEMM is emulated on the
                             device can trade its memory for the dequantize (e.g. mxfp8's
                             raw_copy = bf16). It moves, saves and gathers like any buffer. */

/* hq_buffer.flags */
#define HQ_BUF_SHARED 1u  /* COLWISE storage only: when the ROWWISE storage of the same tensor is
                             made by the same call, this buffer IS rowwise buffer `shared_with`
                             (same memory; e.g. per-tensor FP8's single scale_inv). It then keeps
                             the rowwise buffer's name. The core allocates it on its own when no
                             rowwise storage exists. */

/* hq_buffer.gather: how FSDP concatenates the shards' copies of this buffer (shards split M). */
#define HQ_GATHER_NEVER 0u /* cannot be gathered (e.g. swizzled scales): the core refuses,
                              unless the format gives the buffer an FSDP form (2.4) */
#define HQ_GATHER_ROWS 1u  /* dim 0 runs along M: entry r covers rows [r*m_div, (r+1)*m_div);
                              the shards' first ceil(M_shard/m_div) rows are concatenated and any
                              further (padding) rows are zero in the full buffer */
#define HQ_GATHER_COLS 2u  /* dim 1 runs along M (a transposed copy): the core transports the
                              first ceil(M_shard/m_div) columns transposed (M-major), gathers them
                              along dim 0 and transposes them back; padding columns are zero */
#define HQ_GATHER_SAME 3u  /* not gathered: equal on every shard once they share the amax (a
                              per-tensor scale or amax); the full tensor takes the local copy */

/* Buffer names (they are what checkpoints and `hq quantize --json` show) follow one convention,
   which the core enforces: a rowwise storage's buffers are named "data", "scale_inv", "amax",
   ...; a columnwise storage's own buffers carry the prefix "columnwise_" ("columnwise_data",
   "columnwise_scale_inv", ...); a columnwise buffer marked HQ_BUF_SHARED keeps the name of the
   rowwise buffer it is. Names are unique within a quantized tensor. */

typedef struct hq_buffer {
  uint32_t struct_size;      /* set by the core */
  hq_dtype dtype;
  const char *name;          /* static string, see the convention above */
  uint32_t role;             /* HQ_ROLE_* */
  uint32_t flags;            /* HQ_BUF_* */
  int32_t ndim;              /* 1..HQ_MAX_BUFFER_DIMS */
  int32_t shared_with;       /* with HQ_BUF_SHARED: index into the rowwise storage's buffers */
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  uint32_t gather;           /* HQ_GATHER_* */
  int32_t m_div;             /* HQ_GATHER_ROWS / COLS: rows of M per entry along the M dim (1 for
                                one per row; 32 for one per 32-row block; 2 for packed FP4 whose
                                bytes hold two rows) */
  uint64_t reserved[4];      /* zero: room for 2.x fields */
  size_t bytes;              /* set by the core from dtype and shape */
  void *ptr;                 /* set by the core: device memory when the storage's device >= 0 */
} hq_buffer;

typedef struct hq_storage {
  uint32_t struct_size;      /* set by the core */
  uint32_t buf_size;         /* set by the core: the stride of buf[] (use hq_storage_buf()) */
  uint32_t dir;              /* HQ_ROWWISE or HQ_COLWISE */
  uint32_t nbuf;             /* number of buffers described, <= HQ_MAX_BUFFERS */
  int64_t rows, cols;        /* the logical [M, K] of the quantized tensor */
  int32_t device;            /* where the buffers live */
  hq_dtype nominal;          /* dtype of the high-precision tensor it stands for (f32, f16,
                                bf16): the source dtype of a quantize, the caller's for
                                make_empty */
  hq_operand_desc desc;      /* filled by layout(), checked by the core */
  uint8_t meta[HQ_META_BYTES]; /* reserved, zero: kept for the layout of this struct only.
                                Nothing reads it, and a storage made again (checkpoint load,
                                hq_make_empty, the full tensor of an FSDP gather) comes from a
                                fresh layout() without it: the descriptor and the buffers are
                                the whole storage. */
  uint64_t reserved[4];      /* zero */
  hq_buffer buf[HQ_MAX_BUFFERS]; /* last; fixed order per format (= save order). Reach element i
                                through hq_storage_buf(s, i): the stride is buf_size. */
} hq_storage;

#define HQ_STORAGE_BUF(s, i) ((hq_buffer *)((char *)(s)->buf + (size_t)(i) * (s)->buf_size))
static inline hq_buffer *hq_storage_buf(hq_storage *s, uint32_t i) {
  return HQ_STORAGE_BUF(s, i);
}
static inline const hq_buffer *hq_storage_cbuf(const hq_storage *s, uint32_t i) {
  return (const hq_buffer *)((const char *)s->buf + (size_t)i * s->buf_size);
}

/* Describe buffer i of storage s in layout(): name, role, dtype, 1-D [d0] (ndim = 1, d1 ignored)
   or 2-D [d0, d1]; gather rule HQ_GATHER_NEVER until hq_buffer_gather() says otherwise. Returns
   the buffer for further settings. */
static inline hq_buffer *hq_buffer_describe(hq_storage *s, uint32_t i, const char *name,
                                            uint32_t role, hq_dtype dtype, int ndim, int64_t d0,
                                            int64_t d1) {
  hq_buffer *b = hq_storage_buf(s, i);
  b->name = name;
  b->role = role;
  b->dtype = dtype;
  b->ndim = ndim;
  b->shape[0] = d0;
  b->shape[1] = ndim > 1 ? d1 : 0;
  b->flags = 0;
  b->shared_with = 0;
  b->gather = HQ_GATHER_NEVER;
  b->m_div = 1;
  if (s->nbuf < i + 1) s->nbuf = i + 1;
  return b;
}
/* Set a buffer's FSDP gather rule (HQ_GATHER_*) and its rows of M per entry. */
static inline void hq_buffer_gather(hq_buffer *b, uint32_t rule, int32_t m_div) {
  b->gather = rule;
  b->m_div = m_div > 0 ? m_div : 1;
}
/* Mark a columnwise buffer as being rowwise buffer `index` when both are made together. */
static inline void hq_buffer_share(hq_buffer *b, int32_t index) {
  b->flags |= HQ_BUF_SHARED;
  b->shared_with = index;
}

/* --- 2.4: buffer forms (see "Buffer forms" above) --- */
/* buffer_form()'s purpose */
#define HQ_FORM_FSDP 1u /* the matrix an FSDP all-gather moves (fsdp_extract / fsdp_assign) */
#define HQ_FORM_SAVE 2u /* what hq_qtensor_save hands out (save / restore) */

/* The form of one buffer. The core zeroes it and sets struct_size before buffer_form(); a
   module writes no field beyond struct_size. */
typedef struct hq_buffer_form {
  uint32_t struct_size;      /* set by the core */
  hq_dtype dtype;            /* element dtype of the form */
  int32_t ndim;              /* 0: no form (the buffer travels by the default); else 1..4
                                (HQ_FORM_FSDP: 2) */
  int32_t m_div;             /* HQ_FORM_FSDP: rows of M per row of the form; divides
                                desc.shard_rows, and shape[0] * m_div = s->rows */
  int64_t shape[HQ_MAX_BUFFER_DIMS];
  uint64_t reserved[2];      /* zero: room for 2.x fields */
  size_t bytes;              /* set by the core from dtype and shape */
  void *ptr;                 /* set by the core: the form's memory on the call's device (the op
                                writes it: fsdp_extract, save; or reads it: fsdp_assign,
                                restore) */
} hq_buffer_form;

/* Describe a form in buffer_form(): dtype, 1-D [d0] (ndim = 1, d1 ignored) or 2-D [d0, d1], and
   (HQ_FORM_FSDP) its rows of M per row. */
static inline void hq_buffer_form_describe(hq_buffer_form *f, hq_dtype dtype, int ndim,
                                           int64_t d0, int64_t d1, int32_t m_div) {
  f->dtype = dtype;
  f->ndim = ndim;
  f->shape[0] = d0;
  f->shape[1] = ndim > 1 ? d1 : 0;
  f->m_div = m_div;
}

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

/* The size of an hq_option entry in ABI 2.0 - 2.3 (hq_format_ops.option_size 0 reads as it). */
#define HQ_OPTION_SIZE_2_0 (offsetof(hq_option, max) + sizeof(double))

typedef struct hq_optval {
  int64_t i;            /* BOOL, INT, ENUM index */
  double f;             /* FLOAT */
  const char *s;        /* STRING: valid for the lifetime of the format instance */
} hq_optval;

/* ---------------------------------------------------------------------------------------------
** GEMMs (ABI 2.1). The core's hq_gemm() computes, in cuBLAS's column-major convention,
**     D = alpha * op(A) * op(B) + beta * D  (+ bias),   op(A): m x k, op(B): k x n, D: m x n,
** where A is a tensor [A0, A1] (row-major, i.e. a column-major A1 x A0 matrix), m = transa ? A0 :
** A1, k = transa ? A1 : A0, n = transb ? B1 : B0, and D is row-major [n, m]. Each quantized
** operand is taken in the direction whose blocks run along k: A transposed -> its ROWWISE storage,
** A not transposed -> COLWISE; B not transposed -> ROWWISE, B transposed -> COLWISE.
**
** Dispatch. When both storages come from one module that has a gemm() op, the core asks it
** (HQ_GEMM_QUERY) whether it runs this pair natively on this device; HQ_OK runs it there.
** A module's op may instead multiply the raw values in its own kernel -- an emulated product --
** and say so through emul_out (2.6). HQ_ENOTSUP (with its reason, which hq_gemm_info reports,
** or without one: the providers' reasons then stand) and every other pair -- two modules,
** a module without gemm() -- take the EMULATED path: each storage is dequantized RAW
** (HQ_CALL_DEQ_RAW) into its desc.emul_dtype, the per-tensor factors of both (tensor_factor())
** are folded into alpha, and the core multiplies the two (cuBLASLt BF16 or F32 GEMM with FP32
** accumulation on a GPU, an F32 sgemm on the host). Both paths need the two storages to carry
** the same desc.transform and transform_param (a product is only right when both were
** transformed alike along k): otherwise the core refuses with HQ_EINVAL naming both.
*/
#define HQ_GEMM_QUERY 1u   /* hq_gemm_problem.flags: answer HQ_OK / HQ_ENOTSUP, run nothing */

typedef struct hq_gemm_problem {
  uint32_t struct_size;         /* set by the core */
  uint32_t flags;               /* HQ_GEMM_* */
  const hq_storage *a;          /* A's storage in the direction transa selected */
  const hq_storage *b;          /* B's storage in the direction transb selected */
  const void *cfg_b;            /* B's instance configuration (same module as A's, cfg) */
  int32_t transa, transb;       /* 1 = T, 0 = N */
  int64_t m, n, k;
  hq_tensor *d;                 /* row-major [n, m], HQ_F32 or HQ_BF16, on call->device */
  const void *bias;             /* NULL, or [m] of bias_dtype on call->device: D[j][i] += bias[i] */
  hq_dtype bias_dtype;
  float alpha, beta;            /* beta != 0 accumulates into D */
  /* --- 2.6 (read through hq_gemm_problem_emul_out()) --- */
  hq_dtype *emul_out;           /* gemm() that answers HQ_OK writes here the dtype its kernel
                                   multiplied the operands' raw values in (HQ_BF16 / HQ_F32:
                                   the module's own emulated product, which hq_gemm_info then
                                   reports as emulated-bf16 / -f32), or leaves it 0: native */
} hq_gemm_problem;

/* Where a gemm() op says its product was emulated (2.6): p->emul_out of a core that passes it,
   else NULL (an older core, which reports every module GEMM as native). */
#define HQ_GEMM_PROBLEM_SIZE_2_6 (offsetof(hq_gemm_problem, emul_out) + sizeof(hq_dtype *))
static inline hq_dtype *hq_gemm_problem_emul_out(const hq_gemm_problem *p) {
  return p->struct_size >= HQ_GEMM_PROBLEM_SIZE_2_6 ? p->emul_out : NULL;
}

/* One cuBLASLt matmul, as the core runs it for a plugin (host->lt_matmul). Column-major, as in
   cuBLASLt: operand X is a stored rows x cols column-major matrix with leading dimension ld,
   used as op(X) = trans ? X^T : X. */
typedef struct hq_lt_operand {
  const void *data;
  hq_dtype elem;                /* HQ_E4M3, HQ_E5M2, HQ_E2M1X2, HQ_BF16, HQ_F16, HQ_F32 */
  int32_t trans;
  int64_t rows, cols, ld;       /* of the stored matrix (E2M1X2: in elements, not bytes) */
  uint32_t scale_mode;          /* HQ_SCALE_*: NONE, TENSOR_F32, VEC16_UE4M3, VEC32_UE8M0,
                                   VEC128_F32, BLK128X128_F32 */
  const void *scale;            /* the scale buffer cuBLASLt reads for that mode */
} hq_lt_operand;

typedef struct hq_lt_matmul {
  uint32_t struct_size;         /* sizeof(hq_lt_matmul) */
  uint32_t flags;               /* HQ_GEMM_QUERY: check that cuBLASLt has an algorithm, run none */
  hq_lt_operand a, b;           /* op(a): m x k, op(b): k x n */
  int64_t m, n, k;
  float alpha, beta;
  const float *alpha_factor[2]; /* NULL, or device FP32 values multiplied into alpha (e.g. the
                                   per-tensor factors of both operands) */
  void *d;                      /* column-major m x n, leading dimension ldd */
  hq_dtype d_dtype;             /* HQ_F32 or HQ_BF16 */
  int64_t ldd;
  const void *bias;             /* NULL or [m] of bias_dtype (BIAS epilogue) */
  hq_dtype bias_dtype;
  int32_t fast_accum;           /* FP8: 1 = cuBLASLt fast accumulation; 0 = split accumulator */
  const char *what;             /* for messages: "fp8_tensor e4m3 x e5m2" */
  /* --- 2.3 --- */
  const float *alpha_device;    /* NULL, or the whole alpha as one device FP32 value (alpha and
                                   alpha_factor are then ignored) */
  /* --- no minor of their own: a runner that predates them ignores both and leaves *amax_done
     0, which the caller has to handle anyway (cuBLASLt may refuse the epilogue) --- */
  float *amax_d;                /* NULL, or one device FP32 value: max |D| of the stored result
                                   from cuBLASLt's AMAX_D epilogue, when it offers one for the
                                   problem (it is then written and *amax_done set to 1) */
  int32_t *amax_done;           /* with amax_d: set to 1 when *amax_d was written, else left */
  /* --- 2.6: a runner that predates it reads struct_size and refuses nothing, so check
     hq_host_api.abi_minor >= 6 before setting it --- */
  const float *row_factor[2];   /* NULL, or device FP32 factors: [0] one per row of op(A) (m),
                                   [1] one per column of op(B) (n). Element (i, j) of
                                   alpha * op(A) op(B) is multiplied by row_factor[0][i], then by
                                   row_factor[1][j], before beta * D and the bias are added: a
                                   matmul into an F32 temporary and one epilogue kernel (no
                                   AMAX_D epilogue: *amax_done stays 0) */
} hq_lt_matmul;

/* For a format's gemm(): an hq_lt_matmul with the fields every native GEMM takes from the problem
   -- struct_size, flags (HQ_GEMM_QUERY), m, n, k, alpha, beta, d and d_dtype (NULL and HQ_F32 when
   p->d is NULL, as it may be in a query), ldd = m (D is row-major [n, m]), bias, bias_dtype --
   and `what` (kept as a pointer: it must outlive the lt_matmul call). Everything else is zero:
   the caller sets a, b, and where it needs them alpha_factor and fast_accum, then calls
   host->lt_matmul(call, &mm). */
static inline hq_lt_matmul hq_lt_matmul_from(const hq_gemm_problem *p, const char *what) {
  hq_lt_matmul mm;
  unsigned char *z = (unsigned char *)&mm;
  for (size_t i = 0; i < sizeof mm; i++) z[i] = 0; /* no <string.h> in this header */
  mm.struct_size = sizeof mm;
  mm.flags = p->flags & HQ_GEMM_QUERY;
  mm.m = p->m;
  mm.n = p->n;
  mm.k = p->k;
  mm.alpha = p->alpha;
  mm.beta = p->beta;
  mm.d = p->d ? p->d->data : NULL;
  mm.d_dtype = p->d ? p->d->dtype : HQ_F32;
  mm.ldd = p->m;
  mm.bias = p->bias;
  mm.bias_dtype = p->bias_dtype;
  mm.what = what;
  return mm;
}

/* ---------------------------------------------------------------------------------------------
** The host table: services the core offers a plugin. Const, valid for the life of the process.
*/
struct hq_call;

typedef struct hq_host_api {
  uint32_t abi_major, abi_minor, struct_size;
  const char *core_version;        /* "0.3.0" */
  /* Record the message of the current failure (per thread); returns `code`. */
  int (*error)(int code, const char *fmt, ...) HQ_PRINTF(2, 3);
  /* Log through the logger of the call's context (call may be NULL outside a call: then the
     process default, stderr for errors and warnings). level 0 = error, 1 = warning, 2 = info,
     3 = debug. */
  void (*log)(const struct hq_call *call, int level, const char *fmt, ...) HQ_PRINTF(3, 4);
  /* Scratch memory for the duration of one call, on call->device, ordered on call->stream.
     Returns NULL (with an error recorded) on failure, and always during update (HQ_CALL_UPDATE):
     use call->scratch there. */
  void *(*alloc)(const struct hq_call *call, size_t bytes);
  void (*free)(const struct hq_call *call, void *ptr);
  /* Compute capability of a CUDA device as major*10+minor (90 = Hopper), 0 for the host or when
     it cannot be read. */
  int (*device_arch)(int device);
  /* --- 2.1 (check host->abi_minor >= 1) --- */
  /* Run (or with HQ_GEMM_QUERY, check) one cuBLASLt matmul on call->device / call->stream. The
     core owns the cuBLASLt handle, the workspace and a cache of descriptors and plans (the
     heuristic query runs once per shape and kind). HQ_ENOTSUP when built without CUDA, on the
     host, or when cuBLASLt offers no algorithm (the message names m, n, k and the kinds);
     HQ_EDEVICE when a cuBLASLt call fails. */
  int (*lt_matmul)(const struct hq_call *call, const hq_lt_matmul *mm);
  /* --- 2.4 (check host->struct_size >= HQ_HOST_API_SIZE_2_4) --- */
  /* Convert n elements of src (dtype st) into dst (dtype dt), both HQ_F32, HQ_F16 or HQ_BF16,
     in memory of call->device, on call->stream (no synchronization): a byte copy when the dtypes
     match (NaN payloads and signed zeros pass through), otherwise each element through
     hq_load_hp / hq_store_hp (hq/numerics.h: round to nearest even), the same bytes on the host
     and on a GPU. dst and src do not overlap. HQ_EINVAL for another dtype or n < 0. The core's
     own conversions (the emulated GEMM's operands) run the same code. */
  int (*convert)(const struct hq_call *call, void *dst, hq_dtype dt, const void *src,
                 hq_dtype st, int64_t n);
} hq_host_api;

/* Size of a host table that carries convert. */
#define HQ_HOST_API_SIZE_2_4 (offsetof(hq_host_api, convert) + sizeof(void (*)(void)))

/* ---------------------------------------------------------------------------------------------
** hq_call: where and how one operation runs. Built by the core for every call.
*/
#define HQ_CALL_UPDATE 1u  /* an in-place update: no allocation (host->alloc refuses), no sync */
#define HQ_CALL_DEQ_RAW 2u /* (2.1) dequantize(): write the storage's RAW values -- the elements
                              times their block scales, in the storage's own domain: without the
                              per-tensor factor (tensor_factor()) and without undoing a transform
                              (an RHT16 storage stays in the transformed domain). This is the
                              operand a GEMM multiplies. Set only for modules whose ops table
                              has the 2.1 layout, whatever minor they require. */

typedef struct hq_call {
  uint32_t struct_size;
  uint32_t flags;                  /* HQ_CALL_* */
  int32_t device;                  /* HQ_DEVICE_HOST or the CUDA ordinal (already current) */
  int32_t reserved0;
  void *stream;                    /* cudaStream_t (NULL = legacy default stream) */
  void *scratch;                   /* scratch_size() bytes on `device` (quantize, update, amax),
                                      or NULL when the format declares none */
  size_t scratch_bytes;
  uint64_t seed;                   /* random stream for stochastic rounding: the context's seed */
  uint64_t offset;                 /* ... and the operation's offset, mixed from its role, the
                                      context's step and the role's count of operations in it
                                      (hq_rng_offset; docs/embedding.md, section 11): the calls
                                      that make the two directions of one tensor share it, so
                                      derive each direction's stream from (seed, offset,
                                      direction, element position). Under a CUDA graph capture
                                      the step comes from offset_dev (2.6) instead */
  const float *amax;               /* quantize/update: NULL (compute the per-tensor amax from
                                      src) or amax[0] for the rowwise, amax[1] for the columnwise
                                      direction, as amax() would compute them, in memory of
                                      `device`. Use the value; do not recompute it. */
  const hq_host_api *host;
  void *core_private;              /* owned by the core; do not touch */
  /* --- 2.1 (check call->struct_size) --- */
  float *state;                    /* quantize/update of an instance with state_floats() > 0: the
                                      slice's state (state_floats() floats) in memory of `device`;
                                      NULL when the quantizer is bound to no hq_state (refuse
                                      with HQ_ESTATE). NULL for a stateless instance. */
  float *state_amax;               /* ... and the slice's amax accumulator (one float of the
                                      state's contiguous amax array): max-accumulate into it */
  /* --- 2.2 (check call->struct_size >= HQ_CALL_SIZE_2_2) --- */
  const struct hq_adam_pass *adam; /* update() on a CUDA device of an instance with
                                      HQ_CAP_FUSED_ADAM: the optimizer step to apply while
                                      reading src (see "Fused optimizer write-back"); else NULL */
  /* --- 2.3 (read through hq_call_factor_out()) --- */
  float *factor_out;               /* dequantize() with HQ_CALL_DEQ_RAW of an instance with
                                      HQ_CAP_DEQ_FACTOR: NULL, or where to write, besides the raw
                                      values, hq_mul_rn(m, f): f the value tensor_factor() would
                                      write for the storage, m = *factor_in when factor_in is not
                                      NULL, else factor_mul. Memory of call->device, written on
                                      call->stream (no launch of its own: the dequantize kernel
                                      does it), also when dst has no elements. */
  const float *factor_in;          /* ... NULL or one FP32 value in memory of call->device */
  float factor_mul;                /* ... m when factor_in is NULL */
  /* --- 2.6 (read offset_dev through hq_call_offset_dev()) --- */
  const uint64_t *offset_dev;      /* quantize/update of an instance with HQ_CAP_RNG_DEV on a
                                      stream being captured into a CUDA graph: the context's
                                      step (what hq_ctx_set_rng_offset set, one uint64 in memory
                                      of `device`, rewritten in stream order before a replay);
                                      the operation's offset is then hq_rng_offset(*offset_dev,
                                      role_key, role_count) (hq/numerics.h), computed by the
                                      kernel, and `offset` (the capture's value) must not be
                                      used. NULL otherwise: use `offset` */
  uint64_t role_key;               /* quantize/update: the role's key and its count of
                                      operations in the step, the inputs of `offset` besides the
                                      step: offset = hq_rng_offset(step, role_key, role_count) */
  uint64_t role_count;
  float *row_factor_out;           /* dequantize() with HQ_CALL_DEQ_RAW of an instance with
                                      HQ_CAP_DEQ_ROW_FACTOR: NULL, or where to write one FP32
                                      factor per stored row of the storage (its rows when
                                      rowwise, its columns when columnwise: the operand's outer
                                      index in a GEMM), on call->stream in memory of
                                      call->device; the raw values written are then those
                                      without that factor, exactly representable in BF16
                                      whatever desc.emul_dtype says. Read it through
                                      hq_call_row_factor_out() */
  void *copy_out;                  /* quantize/update of an instance with HQ_CAP_COPY_OUT: NULL,
                                      or where to write, besides the storages, every element of
                                      src converted to copy_dtype, row-major [rows, cols], each
                                      as the host's convert service converts it (hq_f32_to_bf16
                                      / hq_f32_to_f16 of hq/numerics.h), in memory of
                                      call->device on call->stream. The core sets it only for an
                                      F32 src, copy_dtype HQ_BF16 or HQ_F16, and no call->adam:
                                      the other direction's plain copy (HQ_CAP_PLAIN_COPY) made
                                      from this call's one read of src. Read it through
                                      hq_call_copy_out() */
  int32_t copy_dtype;
  int32_t reserved1;
} hq_call;

/* Size of an hq_call that carries the state fields. */
#define HQ_CALL_SIZE_2_1 (offsetof(hq_call, state_amax) + sizeof(float *))
/* Size of an hq_call that carries the fused optimizer step. */
#define HQ_CALL_SIZE_2_2 (offsetof(hq_call, adam) + sizeof(void *))
/* Size of an hq_call that carries the factor fields. */
#define HQ_CALL_SIZE_2_3 (offsetof(hq_call, factor_mul) + sizeof(float))

/* Size of an hq_call that carries the 2.6 fields (the device step of the random stream, the
   per-row factors, the plain copy written beside). */
#define HQ_CALL_SIZE_2_6 (offsetof(hq_call, reserved1) + sizeof(int32_t))

/* The device step a graph-captured quantize/update draws from (2.6): call->offset_dev of a call
   that carries it, else NULL (the call's stream is call->offset). */
static inline const uint64_t *hq_call_offset_dev(const hq_call *call) {
  return call->struct_size >= HQ_CALL_SIZE_2_6 ? call->offset_dev : NULL;
}

/* Where a raw dequantize writes the storage's factor (2.3): call->factor_out of a call that
   carries it with HQ_CALL_DEQ_RAW, else NULL (nothing to write). */
static inline float *hq_call_factor_out(const hq_call *call) {
  return call->struct_size >= HQ_CALL_SIZE_2_3 && (call->flags & HQ_CALL_DEQ_RAW)
             ? call->factor_out
             : NULL;
}

/* Where a raw dequantize writes the storage's per-row factors (2.6): call->row_factor_out of a
   call that carries it with HQ_CALL_DEQ_RAW, else NULL (the raw values keep their factors). */
static inline float *hq_call_row_factor_out(const hq_call *call) {
  return call->struct_size >= HQ_CALL_SIZE_2_6 && (call->flags & HQ_CALL_DEQ_RAW)
             ? call->row_factor_out
             : NULL;
}

/* Where a quantize/update writes the plain copy of its source (2.6), and *dtype its dtype:
   call->copy_out of a call that carries it, else NULL (no copy). */
static inline void *hq_call_copy_out(const hq_call *call, int32_t *dtype) {
  void *p = call->struct_size >= HQ_CALL_SIZE_2_6 ? call->copy_out : NULL;
  *dtype = p ? call->copy_dtype : 0;
  return p;
}

/* ---------------------------------------------------------------------------------------------
** Fused optimizer write-back (2.2)
**
** hq_adam_step (hq/train.h) updates FP32 master weights with AdamW and writes the quantized
** weight back from them, through hq_qtensor_update_adam (hq.h) where it can. For an instance
** whose caps include HQ_CAP_FUSED_ADAM, on a CUDA device, when one update() call makes every
** direction the weight holds and the instance needs no per-tensor amax (amax_kind() NONE for
** those directions), the core makes that call with call->adam set:
** src is then the FP32 master [M, K], and for every element the kernel reads, it must
**   1. apply hq_adam_elem(&adam->k, g, &w, &m, &v) (hq/adamw.h) with w = master, g =
**      adam->grad (dtype adam->grad_dtype), m = adam->m, v = adam->v at the same index,
**   2. store w, m and v back, and
**   3. quantize the new w exactly as update() quantizes a source holding it,
** reading each element exactly once in the call (a kernel that reads its input twice cannot
** declare the capability). The bytes written -- master, moments, every buffer of the storages --
** are then those of the unfused sequence (the step, then update() of the new master) by
** construction. call->adam is never set on the host, nor for a module compiled against 2.1.
**
** Constants in device memory (2.6): a caller that captures the step in a CUDA graph gives its
** constants in device memory (hq_adam.consts_dev, hq/train.h), which the replays read as they
** run; a kernel argument would be frozen at its capture value. The core then passes
** adam->k_dev (read it through hq_adam_pass_k_dev) to an instance whose caps include
** HQ_CAP_ADAM_KDEV, and the kernel applies *k_dev instead of adam->k, read when it runs (once per
** thread or CTA: the values are the same for the whole call). An instance without the cap never
** sees k_dev: the core takes the unfused path for it.
*/
typedef struct hq_adam_consts {
  float lr, b1, b2, eps, wd;       /* learning rate, betas, epsilon, decoupled weight decay */
  float one_minus_b1, one_minus_b2;/* 1 - b1, 1 - b2, rounded once */
  float c1, c2;                    /* bias corrections 1 / (1 - b1^t), 1 / (1 - b2^t) */
} hq_adam_consts;

typedef struct hq_adam_pass {
  uint32_t struct_size;            /* sizeof(hq_adam_pass) */
  uint32_t grad_dtype;             /* hq_dtype of grad: HQ_F32, HQ_F16 or HQ_BF16 */
  const void *grad;                /* [M, K] row-major, on the call's device */
  float *m, *v;                    /* Adam moments [M, K], FP32, updated in place */
  hq_adam_consts k;
  /* --- 2.6 (read through hq_adam_pass_k_dev) --- */
  const hq_adam_consts *k_dev;     /* NULL, or the step's constants in memory of the call's
                                      device (16-byte aligned), to be used instead of k: set only
                                      for an instance with HQ_CAP_ADAM_KDEV */
} hq_adam_pass;

/* Size of an hq_adam_pass of ABI 2.2 (the constants by value only). */
#define HQ_ADAM_PASS_SIZE_2_2 (offsetof(hq_adam_pass, k) + sizeof(hq_adam_consts))
/* Size of an hq_adam_pass that carries k_dev. */
#define HQ_ADAM_PASS_SIZE_2_6 (offsetof(hq_adam_pass, k_dev) + sizeof(void *))

/* The device copy of the constants a fused step must read when its kernel runs (2.6), or NULL
   (use a->k): a pass of an older core has no k_dev. */
static inline const hq_adam_consts *hq_adam_pass_k_dev(const hq_adam_pass *a) {
  return a && a->struct_size >= HQ_ADAM_PASS_SIZE_2_6 ? a->k_dev : NULL;
}

/* The fused optimizer step a quantize/update call carries (NULL: none, or a call of a 2.1 core).
   *ok is 0 when it cannot be honoured as the rules above state it -- not an update on a CUDA
   device, src not the FP32 master, a short hq_adam_pass or a gradient dtype other than F32, F16
   or BF16 -- and the module then refuses the call with HQ_EINVAL. */
static inline const hq_adam_pass *hq_call_adam(const hq_call *call, const hq_tensor *src,
                                               int *ok) {
  const hq_adam_pass *a = call->struct_size >= HQ_CALL_SIZE_2_2 ? call->adam : NULL;
  *ok = !a || (call->device != HQ_DEVICE_HOST && (call->flags & HQ_CALL_UPDATE) &&
               src->dtype == HQ_F32 && a->struct_size >= HQ_ADAM_PASS_SIZE_2_2 &&
               (a->grad_dtype == HQ_F32 || a->grad_dtype == HQ_F16 ||
                a->grad_dtype == HQ_BF16));
  return a;
}

/* ---------------------------------------------------------------------------------------------
** Capability flags (hq_format_ops.caps, instance_caps()).
*/
#define HQ_CAP_CPU (1ull << 0)            /* quantize/dequantize run on host memory */
#define HQ_CAP_CUDA (1ull << 1)           /* quantize/dequantize run on CUDA device memory */
#define HQ_CAP_REQUANT_SAFE (1ull << 2)   /* quantizing the same input again gives the same bytes
                                             (no RNG, no state): an activation may be dropped and
                                             rebuilt from the original */
#define HQ_CAP_COLWISE_ONLY (1ull << 3)   /* a COLWISE storage can be made without a ROWWISE one */
/* bit 4 (HQ_CAP_STATEFUL of ABI 1.0) is retired */
#define HQ_CAP_FUSED_ADAM (1ull << 5)     /* 2.2: update() honours call->adam on a CUDA device
                                             (see "Fused optimizer write-back") */
#define HQ_CAP_DEQ_FACTOR (1ull << 6)     /* 2.3: dequantize() with HQ_CALL_DEQ_RAW honours
                                             call->factor_out (needs tensor_factor()) */
#define HQ_CAP_ADAM_KDEV (1ull << 7)      /* 2.6: update() with call->adam reads the constants
                                             from adam->k_dev when it is not NULL (see "Constants
                                             in device memory") */
#define HQ_CAP_RNG_DEV (1ull << 8)        /* 2.6: quantize/update draws its stochastic rounding
                                             from call->offset_dev when it is not NULL (a CUDA
                                             graph capture: see hq_call.offset_dev) */
#define HQ_CAP_DEQ_ROW_FACTOR (1ull << 9) /* 2.6: dequantize() with HQ_CALL_DEQ_RAW honours
                                             call->row_factor_out: the raw values split into
                                             BF16-exact values times one FP32 factor per stored
                                             row (e.g. NVFP4's per-row global scale) */
#define HQ_CAP_COPY_OUT (1ull << 10)      /* 2.6: quantize/update honours call->copy_out: a
                                             plain BF16 / F16 copy of an F32 src written from
                                             the same read (see hq_call.copy_out) */
#define HQ_CAP_PLAIN_COPY (1ull << 11)    /* 2.6: every storage of the instance is one buffer
                                             holding src converted to the buffer's dtype by the
                                             host's convert service, row-major [rows, cols], in
                                             either direction: another direction's module with
                                             HQ_CAP_COPY_OUT may write it in place of this
                                             module's call (the core then makes none) */

/* amax_kind(): what per-tensor amax a direction's quantization depends on. */
#define HQ_AMAX_NONE 0u   /* none (block scales only, or no scaling) */
#define HQ_AMAX_INPUT 1u  /* max |x| over the input, NaN ignored: a producer's amax fits */
#define HQ_AMAX_OWN 2u    /* a format-specific amax (e.g. of the RHT-transformed values):
                             only the format's amax() computes it */

/* ---------------------------------------------------------------------------------------------
** The ops table a module returns. Fields marked (required) must be non-NULL; the core rejects
** the module otherwise, naming the missing field. Every other op is optional: NULL selects the
** core's default, described at the field.
*/
typedef struct hq_format_ops {
  /* --- identification ----------------------------------------------------------------------- */
  uint32_t abi_major;          /* = HQ_ABI_MAJOR */
  uint32_t abi_minor;          /* the minor version of ABI 2 this module REQUIRES of the core */
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
     (e.g. "stochastic_rounding needs dtype e2m1") with HQ_EINVAL. The status returned reaches
     the caller as it is; one outside hq_status becomes HQ_EINTERNAL naming the module. */
  int (*configure)(void *cfg, const hq_optval *vals, const hq_host_api *host);
  /* Free whatever configure() acquired. NULL: nothing to free. */
  void (*release)(void *cfg);
  /* Capabilities of this instance (e.g. REQUANT_SAFE only without stochastic rounding).
     NULL: `caps`. */
  uint64_t (*instance_caps)(const void *cfg);

  /* --- storages ----------------------------------------------------------------------------- */
  /* (required) Describe direction `dir` of a [rows, cols] tensor into *out: its buffers (with
     hq_buffer_describe(): name, role, dtype, shape; hq_buffer_gather(): FSDP rule;
     hq_buffer_share()) and out->desc (every field but struct_size). `dirs` is the set of
     directions made together in this tensor. Check the shape rules here and fail with HQ_ESHAPE
     naming the dimension and the required multiple. out->dir, rows, cols, device, nominal,
     struct_size and buf_size are set, nbuf, desc, meta and the buffers zeroed by the core. */
  int (*layout)(const void *cfg, const hq_host_api *host, int64_t rows, int64_t cols,
                uint32_t dir, uint32_t dirs, hq_storage *out);
  /* Bytes of scratch a quantize / update / amax of a [rows, cols] tensor making `dirs` on
     `device` needs (handed over as call->scratch). NULL: 0. */
  size_t (*scratch_size)(const void *cfg, int64_t rows, int64_t cols, uint32_t dirs,
                         int32_t device);
  /* Initialise freshly allocated buffers (e.g. zero scale padding). NULL: buffers are left
     uninitialised. */
  int (*make_empty)(const void *cfg, const hq_call *call, hq_storage *s);

  /* --- numerics ----------------------------------------------------------------------------- */
  /* Which per-tensor amax direction `dir` of this instance depends on (HQ_AMAX_*). NULL: none. */
  uint32_t (*amax_kind)(const void *cfg, uint32_t dir);
  /* Compute the amaxes of `src` for the directions in `dirs` (those whose amax_kind is not
     NONE): out[0] rowwise, out[1] columnwise, in memory of call->device, on call->stream;
     write the float of every direction in dirs (with dirs = HQ_BOTH, out may be the trainer's
     own buffer, written by nothing else). Required when amax_kind() can return anything but
     NONE. */
  int (*amax)(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
              float *out);
  /* (required) Quantize `src` into the allocated storages of the directions in `dirs`; `row` is
     NULL unless dirs has HQ_ROWWISE, `col` NULL unless it has HQ_COLWISE. src->device equals
     call->device. With call->amax, use those amaxes (one read of the input). */
  int (*quantize)(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                  hq_storage *row, hq_storage *col);
  /* Re-quantize into existing storages in place (the optimizer's write-back). Same contract as
     quantize(), with call->flags & HQ_CALL_UPDATE: no allocation, no synchronization.
     NULL: the core calls quantize() with the same flags. */
  int (*update)(const void *cfg, const hq_call *call, const hq_tensor *src, uint32_t dirs,
                hq_storage *row, hq_storage *col);
  /* (required) Write the values a storage represents into dst ([rows, cols], any of F32, F16,
     BF16, on call->device). The storage may come from a differently configured instance of this
     plugin: read its layout from s->desc and its buffers. A storage that cannot be dequantized
     alone returns HQ_ENOTSUP. With call->flags & HQ_CALL_DEQ_RAW (2.1): the raw values (see
     HQ_CALL_DEQ_RAW), exactly representable in s->desc.emul_dtype. */
  int (*dequantize)(const void *cfg, const hq_call *call, const hq_storage *s, hq_tensor *dst);

  /* --- 2.1 (absent from a 2.0 module: NULL) ------------------------------------------------- */
  /* The per-tensor factor of a storage: one FP32 value, written to *out in memory of
     call->device on call->stream, that multiplies every raw value (HQ_CALL_DEQ_RAW) to give the
     dequantized value (per-tensor FP8: scale_inv; NVFP4: the global decode scale). NULL: the
     storage has none (1). */
  int (*tensor_factor)(const void *cfg, const hq_call *call, const hq_storage *s, float *out);
  /* The module's own GEMM of two of its storages (see "GEMMs" above): with HQ_GEMM_QUERY in
     p->flags answer HQ_OK (would run here) or HQ_ENOTSUP with the reason (host->error; or none,
     to leave the reason to the providers); without it, run. cfg is A's instance, p->cfg_b B's.
     Native ones are usually built on host->lt_matmul; a kernel of the module's that multiplies
     the raw values writes their dtype to hq_gemm_problem_emul_out(p) (2.6). NULL: the core's
     paths take every pair of this module. */
  int (*gemm)(const void *cfg, const hq_call *call, const hq_gemm_problem *p);
  /* --- state (2.1; see "State" above) ----------------------------------------------------- */
  /* Floats of state one slice of this instance keeps when it serves `dirs` (HQ_ROWWISE,
     HQ_COLWISE, or HQ_BOTH for the one slice of a fused quantizer); at most 2^20. 0 (or NULL):
     stateless. Required with update_state. */
  uint32_t (*state_floats)(const void *cfg, uint32_t dirs);
  /* Write the initial state of one slice (state_floats() floats of host memory). NULL: zeros. */
  void (*init_state)(const void *cfg, uint32_t dirs, float *state);
  /* End of a step: update the n slices of one group (same instance, same dirs): amax[i] (n
     contiguous floats, already reduced by the caller) and state + i * state_floats(cfg, dirs),
     all in memory of call->device, on call->stream, no allocation, no synchronization. Leave
     every amax[i] at 0. Required with state_floats. */
  int (*update_state)(const void *cfg, const hq_call *call, uint32_t dirs, int64_t n,
                      float *amax, float *state);
  /* --- 2.4 (absent from an older table: 0) ------------------------------------------------ */
  /* Version of the bytes this module stores (buffers, their layout and meaning); 0 reads as 1.
     Raise it when a storage written by an older version of the module would be read wrongly
     by this one: a checkpoint records it per direction and refuses a mismatch. */
  uint32_t layout_version;
  /* sizeof(hq_option) as the module saw it: the stride of `options` (0 reads as
     HQ_OPTION_SIZE_2_0), so that an option entry may grow by appended fields */
  uint32_t option_size;

  /* 2.4: buffer forms (see "Buffer forms" above; absent from an older table: NULL) */
  /* Whether buffer `buffer` of s travels as a form for `purpose` (HQ_FORM_FSDP, HQ_FORM_SAVE):
     describe it into *form (hq_buffer_form_describe()), or leave *form as the core handed it
     (ndim 0: the default). A pure function of s's description. Required with fsdp_extract or
     save; asked only for a purpose whose ops the module has. */
  int (*buffer_form)(const void *cfg, const hq_host_api *host, const hq_storage *s,
                     uint32_t buffer, uint32_t purpose, hq_buffer_form *form);
  /* Write the HQ_FORM_FSDP form of buffer `buffer` of a shard's storage s into form->ptr
     (form->bytes on call->device). NULL: the core gathers every buffer by its rule. Comes with
     fsdp_assign. */
  int (*fsdp_extract)(const void *cfg, const hq_call *call, const hq_storage *s, uint32_t buffer,
                      const hq_buffer_form *form);
  /* Write every byte of buffer `buffer` of the full tensor's storage s from the gathered form at
     form->ptr (read only; shape[0] = s->rows / m_div rows, the shards' forms in rank order).
     Comes with fsdp_extract. */
  int (*fsdp_assign)(const void *cfg, const hq_call *call, hq_storage *s, uint32_t buffer,
                     const hq_buffer_form *form);
  /* Write the HQ_FORM_SAVE form of buffer `buffer` of s into form->ptr (form->bytes on
     call->device). NULL: hq_qtensor_save hands every buffer out as it is. Comes with restore. */
  int (*save)(const void *cfg, const hq_call *call, const hq_storage *s, uint32_t buffer,
              const hq_buffer_form *form);
  /* Write every byte of buffer `buffer` of s (freshly allocated) from its saved form at
     form->ptr (read only). Comes with save. */
  int (*restore)(const void *cfg, const hq_call *call, hq_storage *s, uint32_t buffer,
                 const hq_buffer_form *form);

  /* --- 2.6 (absent from an older table: NULL) ------------------------------------------------ */
  /* Two raw dequantizes as one request, so that a GEMM's two operands cost one launch (one
     node of a captured graph): the effect of dequantize(cfg, call, s, dst) and then
     dequantize(cfg_b, call_b, s_b, dst_b), in that order. Both calls have HQ_CALL_DEQ_RAW and
     the same device and stream; s_b may come from another instance of this module (cfg_b).
     The second's fold may read the first's product (call_b->factor_in == call->factor_out): it
     then sees the product the first writes. Return HQ_ENOTSUP, having queued nothing, to
     decline a pair (the core then makes the two dequantize() calls; no message is needed).
     NULL: every pair is two calls. */
  int (*dequantize_pair)(const void *cfg, const hq_call *call, const hq_storage *s,
                         hq_tensor *dst, const void *cfg_b, const hq_call *call_b,
                         const hq_storage *s_b, hq_tensor *dst_b);
} hq_format_ops;

/* The entry point every format module exports (and nothing else). Called once per load with the
   core's host table; returns the module's static ops table, or NULL (after host->error()) to
   refuse this core. */
typedef const hq_format_ops *(*hq_format_entry_fn)(const hq_host_api *host);
HQ_FORMAT_EXPORT const hq_format_ops *hq_format_module_v2(const hq_host_api *host);

/* HQ_FORMAT_DEFINE(ops); -- at file scope, after the module's static ops table: defines the
   entry function, which returns &ops after the one check every module owes the core: a NULL
   host table, or one of another ABI major (laid out differently, so not even its error() may be
   called), is refused with NULL. A module with more to do at load time (check host->abi_minor,
   pick one of two tables) writes the function itself, with that check first.

   HQ_FORMAT_BUILTIN, as SQLite's SQLITE_CORE: a format compiled into libhqcore itself (the
   built-in identity) is compiled with HQ_FORMAT_BUILTIN defined to the name of an internal entry
   function, and the same source then defines that function -- which the loader calls -- instead
   of exporting hq_format_module_v2. A module never defines it. */
#ifdef HQ_FORMAT_BUILTIN
const hq_format_ops *HQ_FORMAT_BUILTIN(const hq_host_api *host);
#define HQ_FORMAT_DEFINE(ops) HQ_FORMAT_DEFINE_AS_(HQ_FORMAT_BUILTIN, ops, )
#else
#define HQ_FORMAT_DEFINE(ops) HQ_FORMAT_DEFINE_AS_(hq_format_module_v2, ops, HQ_FORMAT_EXPORT)
#endif
/* (the trailing declaration takes the caller's semicolon) */
#define HQ_FORMAT_DEFINE_AS_(fn, ops, vis)                                                    \
  vis const hq_format_ops *fn(const hq_host_api *host) {                                     \
    if (!host || host->abi_major != HQ_ABI_MAJOR) return NULL;                                \
    return &(ops);                                                                            \
  }                                                                                           \
  vis const hq_format_ops *fn(const hq_host_api *host)

/* Size of the ABI 2.0 ops table: the smallest struct_size the core accepts. */
#define HQ_FORMAT_OPS_SIZE_2_0 (offsetof(hq_format_ops, dequantize) + sizeof(void (*)(void)))
/* Size of the ABI 2.1 ops table (required of a module whose abi_minor is 1). */
#define HQ_FORMAT_OPS_SIZE_2_1 (offsetof(hq_format_ops, update_state) + sizeof(void (*)(void)))
/* Size of the ABI 2.4 ops table (required of a module whose abi_minor is 4 or more; 2.2 and 2.3
   added no ops: their table is 2.1's). */
#define HQ_FORMAT_OPS_SIZE_2_4 (offsetof(hq_format_ops, restore) + sizeof(void (*)(void)))

#ifdef __cplusplus
}
#endif
#endif /* HQ_PLUGIN_H */
