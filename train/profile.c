/*
** profile.c -- `hq train --profile` (profile.h): per-phase times of a step, from the host clock
** on a CPU context and from CUDA events on the context's stream on a GPU, and the device memory
** high-water of a run (this process's own).
*/
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "train.h"

/* Brackets a profiled step can hold: per linear layer at most an amax pass and a quantize of
   the input and of the gradient, three GEMMs, an activation, its gradient, a bias gradient and
   two optimizer calls (14), plus the embedding and its gradient, the loss, the copies, the
   fused amaxes' zeroing, the embedding's optimizer call and the state update; with room to
   spare. */
#define BRACKETS_PER_LAYER 16
#define BRACKETS_FIXED 16

typedef struct bracket {
  int phase;
  int part;                       /* TRAIN_PK_* of a kernel bracket, else -1 */
  int64_t ev;                     /* its first event (GPU): ev, ev + 1 */
  double s;                       /* host: its seconds */
} bracket;

struct train_profile {
  hq_ctx *ctx;
  int gpu;
  int64_t first, last;            /* the window: steps [first, last] (1-based) */
  int on;                         /* a window step is running */
  double t_step, t_begin;         /* host clock at the step's and the bracket's begin */
  int64_t cap;                    /* brackets the pool holds */
  bracket *br;
  int64_t n_br;
  void **ev;                      /* GPU: 2 * cap bracket events, then 2 per step */
  int64_t n_steps;                /* window steps recorded */
  int overflow;                   /* a step held more brackets than planned */
  train_prof_result r;
};

static const char *const phase_names[TRAIN_PH_N] = {
    "gemm native", "gemm emulated", "gemm fused", "gemm cpu", "amax", "quantize",
    "trainer kernels", "optimizer", "scaling state", "copies"};

const char *train_prof_phase_name(int phase) {
  return phase >= 0 && phase < TRAIN_PH_N ? phase_names[phase] : "?";
}

const char *train_prof_kernel_name(int part) {
  static const char *const n[TRAIN_PK_N] = {"embedding", "activation fwd", "activation bwd",
                                            "bias gradient", "loss"};
  return part >= 0 && part < TRAIN_PK_N ? n[part] : "?";
}

const char *train_prof_qt_name(int kind) {
  static const char *const n[TRAIN_QT_N] = {"input", "weight", "grad_output",
                                            "weight write-back"};
  return kind >= 0 && kind < TRAIN_QT_N ? n[kind] : "?";
}

int train_prof_gemm_phase(uint32_t path) {
  switch (path) {
  case HQ_GEMM_PATH_NATIVE: return TRAIN_PH_GEMM_NATIVE;
  case HQ_GEMM_PATH_FUSED_BF16: return TRAIN_PH_GEMM_FUSED;
  case HQ_GEMM_PATH_CPU: return TRAIN_PH_GEMM_CPU;
  default: return TRAIN_PH_GEMM_EMULATED;
  }
}

int train_prof_create(hq_ctx *ctx, int64_t first_step, int64_t steps, int n_linear,
                      train_profile **out, char *err, size_t err_len) {
  *out = NULL;
  train_profile *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, err_len, "--profile: out of memory");
    return -1;
  }
  p->ctx = ctx;
  p->gpu = hq_ctx_device(ctx) != HQ_DEVICE_HOST;
  p->first = first_step;
  p->last = first_step + steps - 1;
  p->cap = steps * ((int64_t)n_linear * BRACKETS_PER_LAYER + BRACKETS_FIXED);
  p->br = calloc((size_t)p->cap, sizeof *p->br);
  if (!p->br) {
    free(p);
    snprintf(err, err_len, "--profile: out of memory");
    return -1;
  }
  if (p->gpu) {
    const int64_t n_ev = 2 * p->cap + 2 * steps;
    p->ev = calloc((size_t)n_ev, sizeof *p->ev);
    if (!p->ev || train_cuda_events_create(p->ev, n_ev, hq_ctx_device(ctx))) {
      snprintf(err, err_len, "--profile: %lld CUDA events could not be made",
               (long long)n_ev);
      free(p->ev);
      free(p->br);
      free(p);
      return -1;
    }
  }
  p->r.gpu = p->gpu;
  p->r.first_step = first_step;
  p->r.peak_bytes = -1;
  *out = p;
  return 0;
}

void train_prof_free(train_profile *p) {
  if (!p) return;
  if (p->ev) train_cuda_events_destroy(p->ev, 2 * p->cap + 2 * (p->last - p->first + 1));
  free(p->ev);
  free(p->br);
  free(p);
}

/* The events of window step k: after the brackets' */
static void **step_ev(train_profile *p, int64_t k) { return &p->ev[2 * p->cap + 2 * k]; }

void train_prof_step_begin(train_profile *p, int64_t step) {
  if (!p) return;
  p->on = step >= p->first && step <= p->last;
  if (!p->on) return;
  if (p->gpu) train_cuda_event_record(step_ev(p, p->n_steps)[0], hq_ctx_stream(p->ctx));
  p->t_step = train_now();
}

void train_prof_step_end(train_profile *p) {
  if (!p || !p->on) return;
  p->r.step_s += train_now() - p->t_step;
  if (p->gpu) train_cuda_event_record(step_ev(p, p->n_steps)[1], hq_ctx_stream(p->ctx));
  p->n_steps++;
  p->on = 0;
}

int train_prof_on(const train_profile *p) { return p && p->on; }

void train_prof_begin(train_profile *p) {
  if (!p || !p->on) return;
  if (p->n_br >= p->cap) {
    p->overflow = 1;
    return;
  }
  if (p->gpu) train_cuda_event_record(p->ev[2 * p->n_br], hq_ctx_stream(p->ctx));
  else p->t_begin = train_now();
}

/* the bracket begun last: phase, and part (-1: none) */
static void end_bracket(train_profile *p, int phase, int part) {
  if (!p || !p->on || p->n_br >= p->cap) return;
  bracket *b = &p->br[p->n_br];
  b->phase = phase;
  b->part = part;
  if (part >= 0) p->r.kernel_calls[part]++;
  b->ev = 2 * p->n_br;
  if (p->gpu) train_cuda_event_record(p->ev[b->ev + 1], hq_ctx_stream(p->ctx));
  else b->s = train_now() - p->t_begin;
  p->r.calls[phase]++;
  p->n_br++;
}

void train_prof_end(train_profile *p, int phase) { end_bracket(p, phase, -1); }

void train_prof_end_kernel(train_profile *p, int part) {
  end_bracket(p, TRAIN_PH_KERNELS, part);
}

void train_prof_quantized(train_profile *p, int kind, int64_t n) {
  if (p && p->on) p->r.quantize_calls[kind] += n;
}

int train_prof_collect(train_profile *p, train_prof_result *out, char *err, size_t err_len) {
  train_prof_result *r = &p->r;
  r->steps = p->n_steps;
  if (p->overflow) {
    snprintf(err, err_len, "--profile: a step made more calls than the profile has room for");
    return -1;
  }
  if (p->gpu && p->n_steps) {
    if (train_cuda_event_sync(step_ev(p, p->n_steps - 1)[1])) {
      snprintf(err, err_len, "--profile: waiting for the last step's events failed");
      return -1;
    }
    for (int64_t k = 0; k < p->n_steps; k++) {
      float ms;
      if (train_cuda_event_ms(step_ev(p, k)[0], step_ev(p, k)[1], &ms)) goto bad;
      r->span_s += 1e-3 * ms;
    }
    for (int64_t i = 0; i < p->n_br; i++) {
      float ms;
      if (train_cuda_event_ms(p->ev[p->br[i].ev], p->ev[p->br[i].ev + 1], &ms)) goto bad;
      p->br[i].s = 1e-3 * ms;
    }
  } else {
    r->span_s = r->step_s;
  }
  double sum = 0;
  for (int64_t i = 0; i < p->n_br; i++) {
    r->phase_s[p->br[i].phase] += p->br[i].s;
    if (p->br[i].part >= 0) r->kernel_s[p->br[i].part] += p->br[i].s;
    sum += p->br[i].s;
  }
  r->other_s = r->span_s - sum;
  *out = *r;
  return 0;
bad:
  snprintf(err, err_len, "--profile: reading the CUDA events failed");
  return -1;
}

void train_memwatch_begin(train_memwatch *w, int device) {
  w->device = device;
  w->ok = 0;
  w->pool_base = w->graph_base = 0;
  if (device == HQ_DEVICE_HOST) return;
  /* the trim waits for the device (the previous run's frees are done) and empties hq's pool, so
     that every run pays the same cost of mapping its memory */
  hq_mem_stats s = HQ_MEM_STATS_INIT;
  uint64_t high;
  w->ok = hq_device_trim(device) == HQ_OK && hq_device_mem_reset_peak(device) == HQ_OK &&
          hq_device_mem_stats(device, &s) == HQ_OK &&
          train_cuda_graph_mem(device, 1, &w->graph_base, &high) == 0;
  w->pool_base = s.in_use;
}

int64_t train_memwatch_peak(const train_memwatch *w) {
  if (!w->ok) return -1;
  hq_mem_stats s = HQ_MEM_STATS_INIT;
  uint64_t used, high;
  if (hq_device_mem_stats(w->device, &s) || train_cuda_graph_mem(w->device, 0, &used, &high))
    return -1;
  /* the graphs' high-water restarted from zero: what was in use at the begin bounds it below */
  if (high < w->graph_base) high = w->graph_base;
  const uint64_t pool = s.peak > w->pool_base ? s.peak - w->pool_base : 0;
  return (int64_t)(pool + (high - w->graph_base));
}

#ifndef HQ_HAVE_CUDA
int train_cuda_events_create(void **ev, int64_t n, int device) {
  (void)ev;
  (void)n;
  (void)device;
  return -1;
}
void train_cuda_events_destroy(void **ev, int64_t n) {
  (void)ev;
  (void)n;
}
int train_cuda_event_record(void *ev, void *stream) {
  (void)ev;
  (void)stream;
  return -1;
}
int train_cuda_event_ms(void *a, void *b, float *ms) {
  (void)a;
  (void)b;
  *ms = 0;
  return -1;
}
int train_cuda_event_sync(void *ev) {
  (void)ev;
  return -1;
}
int train_cuda_graph_mem(int device, int reset, uint64_t *used, uint64_t *high) {
  (void)device;
  (void)reset;
  *used = *high = 0;
  return -1;
}
#endif
