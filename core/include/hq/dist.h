/*
** hq/dist.h -- FSDP gathers across ranks (libhqtrain): a quantized parameter sharded by rows is
** gathered into the full qtensor in ONE collective of the embedder's communicator, through Open
** MPI (host memory) or NCCL (GPU memory, the context's stream). hq writes no transport of its
** own: each backend is a few calls into the real library, compiled when configure finds it.
**
** The protocol underneath is libhqcore's (hq_fsdp_extract / hq_fsdp_assign, docs/embedding.md
** section 12); this header adds the communication:
**   - hq_dist_amax: each rank's shard amax (hq_quantizer_amax), all-reduced with MAX when a
**     direction of the quantizer depends on a per-tensor amax (current scaling: fp8_tensor,
**     nvfp4's global scale); no collective otherwise. Quantizing each shard with it
**     (hq_quantize_ex / hq_qtensor_update_ex) makes the gathered tensor equal, byte for byte,
**     the whole tensor quantized on one rank.
**   - hq_dist_state_update: the delayed-scaling amaxes of a whole recipe (hq_state_amaxes)
**     all-reduced with MAX in one collective, then hq_state_update: once per step.
**   - hq_gather_create (collective, once per parameter): every rank's shard is described and
**     exchanged, and what does not agree across ranks -- columns, directions, formats, options,
**     role, buffer list, a shard whose rows would split a scaling block, a shard that cannot be
**     gathered at all -- is refused on EVERY rank with the same message naming the rank, its
**     shard rows and the rule, before any quantized byte moves. It then lays out one packed
**     message per rank: every buffer of every present direction at a fixed offset.
**   - hq_gather_run: extract, pack, one all-gather, unpack in rank order, assign. A direction
**     that can be rebuilt exactly from the other is not sent: per-tensor FP8 made by one call
**     (both directions share the scale and the columnwise codes are the byte transpose of the
**     rowwise ones) sends the rowwise codes only, and the columnwise copy is rebuilt from them.
**
** Every collective is bounded by the communicator's timeout: MPI runs nonblocking collectives
** on a duplicate of the caller's communicator with MPI_ERRORS_RETURN; NCCL polls
** ncclCommGetAsyncError and aborts the communicator when the time is up. A failed or timed-out
** collective returns HQ_EIO naming the operation (a dead rank never hangs the others for longer
** than the timeout); the hq_dist is then unusable (HQ_ESTATE) and the embedder ends the job.
**
** Rules as elsewhere in hq: every call returns an hq_status with its message in
** hq_last_error(); versioned structs start with struct_size. Every rank must make the same
** collective calls in the same order (hq_dist_amax, hq_dist_state_update, hq_gather_create,
** hq_gather_run), as with any collective.
**
** The backend constructors take the library's own types: include <mpi.h> or <nccl.h> before
** this header to declare them.
*/
#ifndef HQ_HQ_DIST_H
#define HQ_HQ_DIST_H

#include <stddef.h>
#include <stdint.h>
#include "hq/hq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* hq_dist_backends(): the backends this libhqtrain was built with. */
#define HQ_DIST_MPI 1u
#define HQ_DIST_NCCL 2u
HQ_API uint32_t hq_dist_backends(void);

/* Options of a communicator (NULL: defaults). */
typedef struct hq_dist_opts {
  uint32_t struct_size;          /* sizeof(hq_dist_opts) */
  uint32_t reserved0;            /* zero */
  double timeout_s;              /* longest wait for one collective; 0: 300 seconds */
} hq_dist_opts;

typedef struct hq_dist hq_dist;  /* a communicator: rank, size, backend, timeout */

#if defined(MPI_VERSION)
/* Host memory through MPI: comm is duplicated (the caller's stays as it is, its error handler
   included); the duplicate returns errors (MPI_ERRORS_RETURN). Collective over comm. Contexts
   used with it must be host contexts. MPI must be initialized (MPI_THREAD_SINGLE is enough when
   one thread makes the calls). */
HQ_API int hq_dist_mpi_create(MPI_Comm comm, const hq_dist_opts *opts, hq_dist **out);
#endif
#if defined(NCCL_MAJOR)
/* GPU memory through NCCL: comm is the caller's (not freed by hq_dist_free; aborted on a
   timeout), every collective runs on the stream of the context passed to the call, whose
   device must be the communicator's. */
HQ_API int hq_dist_nccl_create(ncclComm_t comm, const hq_dist_opts *opts, hq_dist **out);
#endif
HQ_API void hq_dist_free(hq_dist *d);
HQ_API int hq_dist_rank(const hq_dist *d);
HQ_API int hq_dist_size(const hq_dist *d);

/* amax[0] (rowwise), amax[1] (columnwise) of this rank's shard src as hq_quantizer_amax defines
   them, max-reduced over the ranks when q has a direction of amax kind other than HQ_AMAX_NONE
   (one collective of 2 floats; none otherwise). amax is 2 floats on ctx's device. */
HQ_API int hq_dist_amax(hq_dist *d, hq_quantizer *q, hq_ctx *ctx, const hq_tensor *src,
                        float *amax);
/* All-reduce (MAX) every amax of st in one collective, then hq_state_update(st, ctx). */
HQ_API int hq_dist_state_update(hq_dist *d, hq_state *st, hq_ctx *ctx);

typedef struct hq_gather hq_gather;  /* the plan of one parameter's gather */
/* Collective. shard: this rank's shard (rows in rank order make the full tensor), quantized
   with the shared amax. The plan holds the staging memory of the gather (allocated through ctx)
   and stays valid while every rank's shard keeps its shape, quantizer and directions. Every
   run uses d: run a plan only while d lives (freeing it after d is allowed). */
HQ_API int hq_gather_create(hq_dist *d, hq_ctx *ctx, hq_qtensor *shard, hq_gather **out);
/* Collective: gather every rank's shard into full (made with hq_make_empty by the shard's
   quantizer at the full rows, or the previous result). The bytes equal the whole tensor
   quantized with the shared amax. full's buffers are written only after the collective
   succeeded. */
HQ_API int hq_gather_run(hq_gather *g, hq_ctx *ctx, hq_qtensor *shard, hq_qtensor *full);
HQ_API void hq_gather_free(hq_gather *g);

/* What one gather of this plan moves. */
typedef struct hq_gather_info {
  uint32_t struct_size;          /* sizeof(hq_gather_info), set by the caller */
  uint32_t collectives;          /* collectives per hq_gather_run: 1 */
  int64_t rows;                  /* the full tensor's rows (sum over the ranks) */
  int64_t cols;
  uint64_t send_bytes;           /* this rank's packed message */
  uint64_t wire_bytes;           /* the gathered message: what every rank receives, its own
                                    part included (for NCCL, every rank's slot is the largest
                                    rank's message) */
  uint64_t bf16_bytes;           /* the same rows and columns as BF16: rows * cols * 2 */
  uint64_t rebuilt_bytes;        /* bytes not sent because a direction is rebuilt from the
                                    other (whole tensor) */
  uint32_t rebuilt_dir;          /* the direction rebuilt (HQ_COLWISE), or 0 */
  uint32_t entries;              /* buffers gathered (hq_fsdp_extract's list) */
} hq_gather_info;
HQ_API int hq_gather_get_info(const hq_gather *g, hq_gather_info *out);

#ifdef __cplusplus
}
#endif
#endif /* HQ_HQ_DIST_H */
