/*
** profile.h -- `hq train --profile`: where a training step's time goes, per phase.
**
** The model (model.c) brackets every call of a step with train_prof_begin / train_prof_end and
** names its phase: a GEMM by the path it took (hq_gemm_info), a quantize, its amax pass (split
** from the cast with hq_quantizer_amax, which gives the same bytes, unless the kernel that wrote
** the tensor computed it), the trainer's own kernels (device.h, by part: TRAIN_PK_*), the
** optimizer, the scaling-state update and the host<->device copies. The loop
** brackets the whole step with train_prof_step_begin / _end.
**
** On the host every phase is timed with clock_gettime (CLOCK_MONOTONIC); what the step spends
** outside every phase is the host overhead (the trainer's own code, qtensor frees).
** On a CUDA device each bracket records two CUDA events on the context's stream (cudaEventRecord,
** no synchronization); the events are read once, after the last profiled step, so profiling adds
** no synchronization to a step. A phase's time is the GPU time between its two events, launch
** gaps inside the call included; the step's GPU span runs from its first event to its last, and
** what the span holds outside every phase is idle time (the GPU waiting for the host).
** The events live in one pool made before the first profiled step: the window of profiled steps
** (the last TRAIN_PROF_STEPS of the run, never the first step, which builds plans and pools) is
** fixed when the profile is made.
*/
#ifndef HQ_TRAIN_PROFILE_H
#define HQ_TRAIN_PROFILE_H

#include <stdint.h>

#include "hq/hq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The phases of a step. */
enum {
  TRAIN_PH_GEMM_NATIVE,     /* hq GEMMs on the native path (low-precision tensor cores) */
  TRAIN_PH_GEMM_EMULATED,   /* emulated paths: the raw values multiplied in BF16/F32 (both
                               dequantized first, or in a module's own kernel) */
  TRAIN_PH_GEMM_FUSED,      /* the fused path: one operand decoded inside the GEMM kernel */
  TRAIN_PH_GEMM_CPU,        /* the host's F32 GEMM (a CPU context) */
  TRAIN_PH_AMAX,            /* per-tensor amax passes (hq_quantizer_amax) */
  TRAIN_PH_QUANTIZE,        /* hq_quantize of inputs and output gradients (the cast) */
  TRAIN_PH_KERNELS,         /* the trainer's own kernels: embedding, activations, loss, bias
                               gradients */
  TRAIN_PH_OPTIMIZER,       /* hq_adam_step, the quantized weights' write-back included */
  TRAIN_PH_STATE,           /* hq_state_update (delayed scaling's histories) */
  TRAIN_PH_COPY,            /* host<->device copies: the batch up, the loss down */
  TRAIN_PH_N
};

/* The trainer's kernels (TRAIN_PH_KERNELS) split by what they compute: a kernel bracket names
   its part, and the phase's total is the sum of its parts. */
enum {
  TRAIN_PK_EMBED,           /* the embedding and its gradient */
  TRAIN_PK_ACT_FWD,         /* activations (with the next layer's input amax, when fused) */
  TRAIN_PK_ACT_BWD,         /* activation gradients (with the output gradient's amax) */
  TRAIN_PK_BIAS,            /* bias gradients (column sums) */
  TRAIN_PK_LOSS,            /* softmax cross-entropy and its gradient */
  TRAIN_PK_N
};

/* Quantize calls of a step, per tensor (TRAIN_QT_*): what the step quantized afresh. The weight's
   write-back by hq_adam_step is counted apart (TRAIN_QT_WRITEBACK). */
enum { TRAIN_QT_INPUT, TRAIN_QT_WEIGHT, TRAIN_QT_GRAD, TRAIN_QT_WRITEBACK, TRAIN_QT_N };

#define TRAIN_PROF_STEPS 20       /* profiled steps: the last ones of a run, never step 1 */

/* "gemm native", ... */
const char *train_prof_phase_name(int phase);
/* "embedding", "activation fwd", ... */
const char *train_prof_kernel_name(int part);
/* "input", "weight", "grad_output", "weight write-back" */
const char *train_prof_qt_name(int kind);

typedef struct train_prof_result {
  int64_t steps;                  /* steps profiled (0: none) */
  int64_t first_step;             /* the first of them (1-based) */
  int gpu;                        /* 1: phase times from CUDA events; 0: the host clock */
  double phase_s[TRAIN_PH_N];     /* seconds, summed over the profiled steps */
  int64_t calls[TRAIN_PH_N];      /* calls, summed over the profiled steps */
  int64_t quantize_calls[TRAIN_QT_N]; /* summed over the profiled steps */
  double kernel_s[TRAIN_PK_N];    /* TRAIN_PH_KERNELS by part: seconds, summed */
  int64_t kernel_calls[TRAIN_PK_N];
  double step_s;                  /* host wall time of the profiled steps (the loop's clock) */
  double span_s;                  /* GPU: the steps' spans (first event to last); host: step_s */
  double other_s;                 /* span_s minus every phase: GPU idle gaps, or the host's
                                     overhead outside every phase */
  int64_t peak_bytes;             /* device memory high-water of the run (-1: not measured) */
} train_prof_result;

typedef struct train_profile train_profile;

/* A profile of the steps [first_step, first_step + steps) (1-based) of a run on ctx (events made
   now on a CUDA context). Returns 0, or -1 with a message in err. */
int train_prof_create(hq_ctx *ctx, int64_t first_step, int64_t steps, int n_linear,
                      train_profile **out, char *err, size_t err_len);
void train_prof_free(train_profile *p);
/* A step begins / ends (step: 1-based); only the window's steps are recorded. */
void train_prof_step_begin(train_profile *p, int64_t step);
void train_prof_step_end(train_profile *p);
/* 1 while a profiled step runs (p may be NULL) */
int train_prof_on(const train_profile *p);
/* Bracket one call (p may be NULL: nothing). */
void train_prof_begin(train_profile *p);
void train_prof_end(train_profile *p, int phase);
/* End a bracket of phase TRAIN_PH_KERNELS, part `part` (TRAIN_PK_*). */
void train_prof_end_kernel(train_profile *p, int part);
/* One quantize of a tensor kind (TRAIN_QT_*) in a profiled step. */
void train_prof_quantized(train_profile *p, int kind, int64_t n);
/* The phase of a GEMM that took `path` (HQ_GEMM_PATH_*). */
int train_prof_gemm_phase(uint32_t path);
/* After the run: read the events (synchronizes once) and total up. Returns 0, or -1 with a
   message in err. */
int train_prof_collect(train_profile *p, train_prof_result *out, char *err, size_t err_len);

/* This process's device memory high-water of a run on a CUDA device, apart from --profile and
   from other processes: begin before the run's context is made, read at the end. Every buffer
   of the run comes from hq's memory pool (hq_ctx_alloc, hq's own allocations), whose peak
   (hq_device_mem_stats) counts it; what a captured step allocates is its CUDA graph's own memory
   instead, counted by the graph memory's high-water; the peak is the sum of both above their
   levels at the begin. -1 on the host, or when the counts cannot be read. */
typedef struct train_memwatch {
  int device;
  int ok;                         /* the counts were read and reset at the begin */
  uint64_t pool_base, graph_base; /* bytes in use at the begin: hq's pool, CUDA graphs */
} train_memwatch;
void train_memwatch_begin(train_memwatch *w, int device);
int64_t train_memwatch_peak(const train_memwatch *w);

/* CUDA helpers (ops_cuda.cu; -1 without CUDA). */
/* n events with timing on CUDA device `device` (where the stream they are recorded on lives) */
int train_cuda_events_create(void **ev, int64_t n, int device);
void train_cuda_events_destroy(void **ev, int64_t n);
int train_cuda_event_record(void *ev, void *stream);
/* milliseconds from a to b; both recorded and complete */
int train_cuda_event_ms(void *a, void *b, float *ms);
int train_cuda_event_sync(void *ev);
/* The memory of this process's CUDA graphs on `device` (cudaGraphMemAttr*): bytes in use now and
   the high-water since its last reset; reset != 0 resets the high-water first (to zero: the
   only value CUDA takes, so it may read below *used until the next allocation). */
int train_cuda_graph_mem(int device, int reset, uint64_t *used, uint64_t *high);

#ifdef __cplusplus
}
#endif
#endif
