/*
** hq/train.h -- the trainer services of hq (libhqtrain): AdamW on FP32 master weights with the
** quantized weight written back, and safetensors checkpoints of quantized and high-precision
** tensors.
**
** They are built on libhqcore's public API alone (hq/hq.h, which this header includes) and
** live in a library of their own, so that the format runtime knows no optimizer and no file
** format. `pkg-config --cflags --libs hqcore` gives both libraries (-lhqtrain -lhqcore). The
** conventions of hq/hq.h hold here too: every function that can fail returns an hq_status with
** its message in hq_last_error(), nothing aborts, versioned structs start with struct_size, a
** call runs on the context's device and stream and restores the caller's current device.
*/
#ifndef HQ_HQ_TRAIN_H
#define HQ_HQ_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include "hq/hq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
** Optimizer: AdamW on FP32 master weights, with the quantized weight written back.
**
** hq_adam_step updates, element by element, the FP32 master weights, first and second moments
** (all [rows, cols] F32 arrays on the context's device, the gradient's shape) from the gradient
** (F32, F16 or BF16; cast to FP32), then -- when qw is given -- writes every direction qw holds
** in its usage back from the new master (hq_qtensor_update: the bytes equal a fresh quantize of
** the master). The element rule is one shared definition (CPU and CUDA give the same bits):
**   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
**   w -= lr * ((m c1) / (sqrt(v c2) + eps) + weight_decay * w)
** every step an FP32 operation in this order, with c1 = 1/(1-b1^t) and c2 = 1/(1-b2^t) computed
** once per step in double and rounded to float (decoupled weight decay: AdamW). A quantized
** parameter without master weights, a gradient or qtensor on another device than the context's,
** a step < 1 (HQ_EINVAL), a gradient or qtensor of another shape (HQ_ESHAPE) or a saved qtensor
** (HQ_ESTATE) is refused before anything changes (the rule is hq_adam_elem in hq/adamw.h).
** On a GPU, in as few passes as the weight's format allows:
**   - one kernel: when one module instance makes every direction qw refreshes, in one update
**     call that reads each element once, needs no per-tensor amax, and declares
**     HQ_CAP_FUSED_ADAM (mxfp8, fp8_block, identity, fp8_tensor with delayed scaling), the
**     step runs inside that write-back kernel (hq_qtensor_update_adam: grad, master, m, v read
**     once; master, m, v and every direction written once; logged at debug level);
**   - two kernels otherwise: the step, then the format's write-back. When the write-back needs
**     the per-tensor amax of the new master (fp8_tensor current scaling, nvfp4's global scales)
**     the step's kernel computes it in the same pass and hands it to the write-back, so the
**     master is not read a third time.
** The bytes are the same on every path.
**
** CUDA graphs: the step's constants (lr, the betas, eps, weight_decay, c1, c2) reach its kernels
** as kernel arguments, which a graph captures once and replays unchanged. To capture
** hq_adam_step, give consts_dev: device memory of the context's device (HQ_ADAM_CONSTS_BYTES
** bytes, 16-byte aligned) that every kernel of the step reads the constants from when it runs;
** fill it before each replay with what hq_adam_consts_write makes for that step (e.g. from
** page-locked host memory by a cudaMemcpyAsync recorded in the same graph ahead of the step).
** hq_adam_step writes nothing there, and reads it on the stream in order: a slot must keep its
** constants until the steps that read them have run (one slot per set of constants in flight).
** With consts_dev the fields of hq_adam still go through every check above, and an eager step
** gives the same bits as without it when the slot holds its constants. A step queued on a stream
** being captured without consts_dev is refused (HQ_ESTATE, nothing captured): its replays would
** all apply the constants of the capture.
**
** The two-kernel path's per-tensor amax (above) lives in 8 bytes of device memory between the
** step's kernel and the write-back: by default a stream-ordered allocation per call, which a
** capture records as the graph's own allocation and free nodes. amax_dev gives those bytes
** instead (device memory of the context's device, 4-byte aligned, HQ_ADAM_AMAX_BYTES): the step
** zeroes and fills them and the write-back reads them, in stream order, so one slot serves
** every parameter whose steps run on one stream, one after the other. The bytes are the same
** with and without it; a host context ignores it. With HQ_ADAM_AMAX_ZEROED in flags the caller
** promises that the slot's bytes are zero when the step's kernel runs (in stream order), and the
** step does not zero them itself: a trainer that gives each parameter a slot of its own and
** zeroes them all with one hq_ctx_memset a step saves a launch per parameter (in a graph, a
** node). The step leaves the amax there; a slot that is not zero gives a larger amax (the
** write-back's scale then differs from a fresh quantize's). The flag without amax_dev, and any
** other bit of flags, is HQ_EINVAL. With qw NULL and amax_dev given, the step's kernel still
** leaves max |x| of the new master there, for a write-back the caller queues itself -- e.g. on
** another stream, after an event -- as hq_qtensor_update_ex with hq_quantize_args.amax =
** amax_dev: the bytes hq_adam_step's own write-back makes (its two-kernel path passes the slot
** the same way).
*/
typedef struct hq_adam {
  uint32_t struct_size;          /* sizeof(hq_adam); at least HQ_ADAM_SIZE_0_1 */
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;                  /* 1 for the first step (bias correction) */
  const void *consts_dev;        /* NULL, or the step's constants in device memory (above) */
  void *amax_dev;                /* NULL, or the write-back amax's device memory (above) */
  uint32_t flags;                /* 0, or HQ_ADAM_AMAX_ZEROED (above) */
} hq_adam;
/* hq_adam.flags: amax_dev is zero when the step runs; the step does not zero it (above). */
#define HQ_ADAM_AMAX_ZEROED 1u
#define HQ_ADAM_INIT HQ_STRUCT_INIT(hq_adam) /* hq.h: struct_size set, the rest zero */
/* Size of an hq_adam without consts_dev (the constants then always come from its fields). */
#define HQ_ADAM_SIZE_0_1 (offsetof(hq_adam, step) + sizeof(int64_t))
/* Bytes of the constants hq_adam_consts_write makes and hq_adam.consts_dev holds. */
#define HQ_ADAM_CONSTS_BYTES 36
/* Bytes of hq_adam.amax_dev. */
#define HQ_ADAM_AMAX_BYTES 8
HQ_API int hq_adam_step(hq_ctx *ctx, const hq_adam *adam, const hq_tensor *grad, float *master,
                        float *m, float *v, hq_qtensor *qw);
/* Write the constants of step `adam` (HQ_ADAM_CONSTS_BYTES bytes, the bits hq_adam_step applies:
   c1 and c2 from adam->step) into host memory at host_dst, for hq_adam.consts_dev. The fields
   are checked as hq_adam_step checks them (HQ_EINVAL, nothing written); consts_dev is not read. */
HQ_API int hq_adam_consts_write(const hq_adam *adam, void *host_dst);

/* ---------------------------------------------------------------------------------------------
** Checkpoints: safetensors files (https://github.com/huggingface/safetensors: an 8-byte
** little-endian header length, a JSON header, then the tensors' bytes) that standard tooling
** reads. A quantized tensor is stored as one safetensors entry per buffer, named
** "<name>/<buffer name>" ("fc1.weight/data", "fc1.weight/columnwise_scale_inv", ...), with
** "__metadata__" keys "<name>/hq" describing it (JSON text: format instance, plugin name and
** version, the format's layout version, options, role, rows, cols, nominal dtype, directions,
** buffer list). High-precision tensors (optimizer state, master weights) are plain entries;
** free-form metadata is allowed. Adding a tensor copies it to the host (device buffers through
** the context's stream, which it synchronizes); the writer holds these copies until close.
** Loading checks the plugin name, its layout version, the options (by name: an option the file
** lacks -- one the plugin gained since -- must hold its default) and every buffer's dtype and
** size against the qtensor it loads into (a mismatch is HQ_EINVAL naming the file, the tensor,
** the buffer or option and both values; a name the file lacks is HQ_ENOENT), and refuses a
** truncated, corrupt or hostile file with HQ_EIO / HQ_EPARSE
** naming the file and the entry (never reading outside the file). docs/checkpoints.md has the
** file format, the metadata schema and every check. Built without jansson (Debian:
** libjansson-dev) these calls return HQ_ENOTSUP.
*/
typedef struct hq_ckpt_writer hq_ckpt_writer;
HQ_API int hq_ckpt_writer_open(const char *path, hq_ckpt_writer **out);
/* Where a write to `path` lands, by the rule every file hq writes follows (a checkpoint here;
   the hq command's .npy and plot files): the end of path's chain of symbolic links, into *target
   (a new string: free() it), so that a temporary file beside it renamed over it replaces that
   file and the links stay; a name that does not exist yet is its own target. What exists there
   must be a regular file -- a rename would replace a device, a FIFO, a socket or a directory --
   else HQ_EIO, hq_last_error() saying what it is ("not a regular file (a FIFO, the link's target
   T): ..."), as for more than 40 links or one that cannot be read. Built with or without
   jansson. */
HQ_API int hq_output_target(const char *path, char **target);
/* Every present direction and every buffer of qt, under `name`. Names: 1 to 1024 bytes of UTF-8
   without control characters, no '/' at either end, no "//", not "__metadata__"; unique in the
   file, and no name or metadata key may lie under another name + "/" (HQ_EINVAL). A saved
   qtensor (hq_qtensor_save) is HQ_ESTATE. A failed add leaves the writer as it was. */
HQ_API int hq_ckpt_add_qtensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name,
                               const hq_qtensor *qt);
/* A high-precision tensor (F32, F16, BF16) on ctx's device or on the host (a host tensor is
   copied directly; a device one through ctx's stream, which this synchronizes). */
HQ_API int hq_ckpt_add_tensor(hq_ckpt_writer *w, hq_ctx *ctx, const char *name,
                              const hq_tensor *t);
/* A free-form "__metadata__" string, UTF-8 (key not lying under a tensor name + "/", whether the
   tensor is added before or after; "hq_version" is written by hq). */
HQ_API int hq_ckpt_add_meta(hq_ckpt_writer *w, const char *key, const char *value);
/* Write the file and free the writer, also on failure. The file is written to a temporary file
   of a unique name ("<path>.tmp.<pid>.<random>.<host>", created exclusively), fsynced, renamed
   over <path> and the directory fsynced: a crash, a full disk or another writer of the same
   path never leaves half a checkpoint at <path>, and a failed close leaves <path> as it was.
   Every entry's checksum and the header's (XXH3_64bits) are written into "__metadata__".
   hq_ckpt_writer_open removes the temporary files of earlier saves to <path> whose process
   (on this host) no longer exists. A symbolic link at <path> is followed: the file it names is
   written (the temporary file beside it) and the link stays; a <path> (or link target) that
   exists and is not a regular file -- a device, FIFO, socket or directory -- is refused with
   HQ_EIO at open, and at close if one was put there since. */
HQ_API int hq_ckpt_writer_close(hq_ckpt_writer *w);
/* Free the writer without writing anything. */
HQ_API void hq_ckpt_writer_abort(hq_ckpt_writer *w);

typedef struct hq_ckpt hq_ckpt;
/* Open and validate a checkpoint: header length within the file (and at most 100,000,000
   bytes), JSON well formed, every entry's dtype known, shape consistent with its byte range,
   ranges inside the data section, not overlapping and covering it without a hole (the
   safetensors rule); and its checksums, verified as hq_ckpt_open_ex describes (a file without
   any is HQ_ENOTSUP). */
HQ_API int hq_ckpt_open(const char *path, hq_ckpt **out);
/* Load without verifying checksums: for a file another tool (or an hq without checksums) wrote,
   which has none. Without it, such a file is HQ_ENOTSUP at open, saying so. */
#define HQ_CKPT_NO_VERIFY 1u
typedef struct hq_ckpt_open_opts {
  uint32_t struct_size;          /* sizeof(hq_ckpt_open_opts); at least
                                    HQ_CKPT_OPEN_OPTS_SIZE_0_3 */
  uint32_t flags;                /* HQ_CKPT_NO_VERIFY, or 0 */
} hq_ckpt_open_opts;
#define HQ_CKPT_OPEN_OPTS_SIZE_0_3 (offsetof(hq_ckpt_open_opts, flags) + sizeof(uint32_t))
/* hq_ckpt_open with options (opts NULL: hq_ckpt_open). By default the file's checksums are
   verified: the header's at open (a mismatch is HQ_EPARSE, "the header is corrupt"), each
   entry's as it is loaded (HQ_EPARSE naming the entry, "is corrupt"; the destination then holds
   the corrupt bytes), and a file without checksums is refused (HQ_ENOTSUP). */
HQ_API int hq_ckpt_open_ex(const char *path, const hq_ckpt_open_opts *opts, hq_ckpt **out);
HQ_API void hq_ckpt_close(hq_ckpt *c);
/* A "__metadata__" value (valid until hq_ckpt_close), or NULL. */
HQ_API const char *hq_ckpt_meta(const hq_ckpt *c, const char *key);
/* The "__metadata__" keys in the file's order: the i-th (0-based), or NULL past the last. */
HQ_API const char *hq_ckpt_meta_key(const hq_ckpt *c, size_t i);
/* Load quantized tensor `name` into qt (made by hq_make_empty or hq_quantize with a quantizer of
   the same formats and options; its shape, directions and columnwise_source must be the saved
   ones). Every check is made before anything is written. A columnwise buffer qt shares with its
   rowwise storage but the file holds as a copy of its own (saved after a one-direction update)
   gets a private buffer, as hq_qtensor_update would give it. qt's usage flags are not changed.
   A device qtensor is filled through host staging (synchronizes ctx's stream). */
HQ_API int hq_ckpt_load_qtensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_qtensor *qt);
/* Load high-precision tensor `name` into t (same dtype and shape; on ctx's device or the host).
   An entry of other than two dimensions (another tool's: a stack of experts, a vector) loads
   into [the product of all its dimensions but the last, its last] -- its C-order bytes as they
   are, numpy's reshape -- and a scalar into [1, 1]. */
HQ_API int hq_ckpt_load_tensor(hq_ckpt *c, hq_ctx *ctx, const char *name, hq_tensor *t);
/* What entry `name` of the file is -- a plain tensor's name, or "<name>/<buffer>" for a buffer
   of a quantized tensor -- without reading its bytes: how a caller sizes hq_ckpt_load_tensor's
   destination from a file it did not write. HQ_ENOENT when the file has no such entry. */
#define HQ_CKPT_MAX_DIMS 8
typedef struct hq_ckpt_entry_info {
  uint32_t struct_size;          /* sizeof(hq_ckpt_entry_info); at least
                                    HQ_CKPT_ENTRY_INFO_SIZE_0_3 */
  const char *st_dtype;          /* the safetensors dtype ("BF16", "F8_E4M3", "U8", ...; valid
                                    until hq_ckpt_close) */
  hq_dtype dtype;                /* the hq dtype of its elements (HQ_DTYPE_INVALID: none of hq's) */
  int ndim;                      /* dimensions, at most HQ_CKPT_MAX_DIMS (more: HQ_ENOTSUP) */
  int64_t shape[HQ_CKPT_MAX_DIMS];
  uint64_t bytes;                /* its bytes in the file */
} hq_ckpt_entry_info;
#define HQ_CKPT_ENTRY_INFO_SIZE_0_3 (offsetof(hq_ckpt_entry_info, bytes) + sizeof(uint64_t))
HQ_API int hq_ckpt_entry(const hq_ckpt *c, const char *name, hq_ckpt_entry_info *out);
/* The file's entry names in the header's order ("__metadata__" is none): the i-th (0-based), or
   NULL past the last; valid until hq_ckpt_close. */
HQ_API const char *hq_ckpt_entry_name(const hq_ckpt *c, size_t i);
/* Read every entry and check it against its checksum without loading anything (a bounded
   staging buffer): whether a file on disk is still what hq wrote. HQ_OK, or HQ_EPARSE naming the
   first corrupt entry, HQ_EIO when a read fails; HQ_ENOTSUP for a file opened with
   HQ_CKPT_NO_VERIFY (it may have no checksums). *bytes (may be NULL) receives the bytes read. */
HQ_API int hq_ckpt_verify(hq_ckpt *c, uint64_t *bytes);

#ifdef __cplusplus
}
#endif
#endif /* HQ_HQ_TRAIN_H */
