/*
** loop.c -- one training run of `hq train`: a model built for one recipe, trained for a fixed
** number of steps from the run's seed (the same data order and initial weights for every recipe),
** Adam with linear warmup and cosine decay, a progress report every few steps, a periodic
** held-out eval and a final one over the whole held-out set.
**
** Checkpoints (checkpoint.c) are saved between two steps, after --checkpoint-every steps and the
** last; --resume loads one before the first step; --verify-resume saves one mid-run, trains on,
** then reloads it into a fresh context and model and checks the continuation is bit-identical.
** The step is forward / backward / update, so offload or recompute slot in around
** train_model_backward.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train.h"

double train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Learning rate of step s (0-based): linear warmup to lr, then cosine decay to min_lr. */
static float schedule(const train_config *c, int64_t s) {
  if (s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
  const int64_t span = c->steps - c->warmup;
  const double p = span > 1 ? (double)(s - c->warmup) / (double)(span - 1) : 1.0;
  return (float)(c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(3.141592653589793 * p)));
}

/* Mean loss over the held-out set (the first `batches` batches of it; 0: all of it). What the
   evaluation's quantizations draw or accumulate is put back afterwards, so that how often a run
   evaluates never changes its training. */
static int evaluate(train_model *m, const train_data *d, int64_t batches, int32_t *x, int32_t *y,
                    double *out, char *err, size_t err_len) {
  /* across ranks, each global batch is split as in training: this rank's rows start at mine */
  const int64_t Bl = m->cfg.batch, B = Bl * train_dist_size(m->cfg.dist);
  if (train_model_eval_begin(m, err, err_len)) return -1;
  int64_t total = d->n_eval;
  if (batches > 0 && batches * B < total) total = batches * B;
  double sum = 0;
  for (int64_t first = 0; first < total; first += B) {
    const int64_t mine = first + train_dist_rank(m->cfg.dist) * Bl;
    int64_t n = train_data_eval_batch(d, mine, Bl, x, y);
    if (mine + n > total) n = total > mine ? total - mine : 0;
    double loss;
    if (train_model_forward(m, x, y, n, 0, &loss, err, err_len)) return -1;
    sum += loss * (double)n;
  }
  if (train_dist_sum(m->cfg.dist, &sum, 1, err, err_len)) return -1;
  *out = sum / (double)total;
  return train_model_eval_end(m, err, err_len);
}

/* The step keys stochastic rounding's random stream (with each role's name): a resumed run and
   one with evaluations in between draw the same bits at every step. */
static int set_rng(train_model *m, int64_t step, char *e, size_t n) {
  return train_model_set_rng(m, (uint64_t)step, e, n);
}

/* A train loss that is not finite fails the run. */
static int check_loss(const train_config *cfg, int64_t step, double loss, char *e, size_t n) {
  if (isfinite(loss)) return 0;
  snprintf(e, n, "the train loss is %s (lr %.3g)", isnan(loss) ? "NaN" : "infinite",
           (double)schedule(cfg, step));
  return -1;
}

/* One optimizer step (step: 0-based) on the batch in x, y. */
static int train_step(train_model *m, const train_config *cfg, int64_t step, const int32_t *x,
                      const int32_t *y, double *loss, char *e, size_t n) {
  if (set_rng(m, step, e, n) || train_model_forward(m, x, y, m->cfg.batch, 1, loss, e, n))
    return -1;
  /* across ranks: the mean of the ranks' means, which is the global batch's (equal parts) */
  const double ranks = train_dist_size(m->cfg.dist);
  if (train_dist_sum(m->cfg.dist, loss, 1, e, n)) return -1;
  *loss /= ranks;
  if (check_loss(cfg, step, *loss, e, n)) return -1;
  return train_model_backward(m, e, n) || train_model_update(m, &cfg->adam, schedule(cfg, step),
                                                             e, n)
             ? -1
             : 0;
}

/* --cuda-graph: the device work of a step (the batch's copy to the device from a page-locked
   staging buffer, the forward, the backward, the optimizer: some hundred launches at the
   default size) captured once the run is warm and replayed at every later step. The optimizer's
   learning rate and bias corrections change every step: its kernels read them from device slots
   (hq_adam.consts_dev) that a copy recorded in the graph fills from a page-locked host buffer,
   which the host writes before each launch. The loss's read-back and its check run after the
   replay, as in an eager step. */
typedef struct step_graph {
  int split;                     /* the step as graph_step runs it (kept qtensors; the CPU too) */
  int on;                        /* capture at the next step past the warm ones, then replay */
  int device;
  void *stream;                  /* the context's stream: the trainer's own (device.h) */
  train_graph *g;                /* NULL until captured */
  int32_t *sx, *sy;              /* the batch's staging buffers (page-locked on a GPU) */
  int pinned;
  int64_t eager;                 /* steps run eagerly in this mode so far */
  int64_t replays;
  /* a replay launched ahead (graph_step): up_ev, marked in the graph once the upload has read
     the staging buffers; done_ev[k] and loss_pin[k] (page-locked), the end of a replay of
     parity k and its loss copied out before the next replay's loss overwrites it; ahead, the
     step launched ahead of its turn (-1: none); NULL events: no replay is launched ahead */
  void *up_ev, *done_ev[2];
  float *loss_pin;
  int64_t ahead, n_ahead;
  /* the model's side lane (train_model_side): a context on a stream of its own and the
     events that order it against the main one; NULL when the model does not take it */
  hq_ctx *side;
  void *side_stream, *side_ev[TRAIN_SIDE_EVENTS];
} step_graph;

static void side_free(step_graph *sg) {
  if (sg->side) hq_ctx_destroy(sg->side);
  /* after the context, whose last work is queued on the stream */
  train_cuda_stream_destroy(sg->side_stream);
  for (int k = 0; k < TRAIN_SIDE_EVENTS; k++) {
    train_cuda_order_event_free(sg->side_ev[k]);
    sg->side_ev[k] = NULL;
  }
  sg->side = NULL;
  sg->side_stream = NULL;
}

/* A side lane for m (train_model_side) on the device of desc: its context is desc's on a stream
   of its own. Freed again when m does not take it; 0, or -1 with the message in e. */
static int side_make(train_model *m, step_graph *sg, const hq_ctx_desc *desc, char *e,
                     size_t n) {
  char ce[200];
  hq_ctx_desc sd = *desc;
  int rc = train_cuda_stream_create(sg->device, &sg->side_stream, ce, sizeof ce);
  for (int k = 0; !rc && k < TRAIN_SIDE_EVENTS; k++)
    rc = train_cuda_order_event(sg->device, &sg->side_ev[k], ce, sizeof ce);
  if (rc) {
    snprintf(e, n, "the side lane: %s", ce);
    side_free(sg);
    return -1;
  }
  sd.stream = sg->side_stream;
  if (hq_ctx_create(&sd, &sg->side)) {
    snprintf(e, n, "the side lane's context: %s", hq_last_error());
    side_free(sg);
    return -1;
  }
  rc = train_model_side(m, sg->side, sg->side_ev, e, n);
  if (rc <= 0) side_free(sg);
  return rc < 0 ? -1 : 0;
}
/* The eager steps before the capture: the first makes the kept qtensors, the scaling state's
   buffer, the GEMM plans and the context's workspace; the second runs the in-place refresh of
   every kept qtensor once before it is recorded. */
#define TRAIN_GRAPH_WARM 2

/* The batch's copy from the staging buffers, the forward, the backward and the optimizer's
   device work (its constants written by train_model_update_begin) */
static int device_step(train_model *m, const train_config *cfg, const step_graph *sg,
                       int capturing, char *e, size_t n) {
  /* in the graph, the upload's end marked for the host (graph_step's replays launched ahead) */
  return train_model_upload(m, sg->sx, sg->sy, sg->pinned, e, n) ||
                 (capturing && sg->up_ev &&
                  train_cuda_order_mark_external(sg->up_ev, sg->stream, e, n)) ||
                 train_model_forward_dev(m, m->cfg.batch, 1, e, n) ||
                 train_model_backward(m, e, n) || train_model_update_dev(m, &cfg->adam, e, n)
             ? -1
             : 0;
}

/* note = prefix + msg, cut to note_len: a note is one line of the report, and a long CUDA
   message loses its tail there rather than the line its neighbours */
static void note_set(char *note, size_t note_len, const char *prefix, const char *msg) {
  if (snprintf(note, note_len, "%s%s", prefix, msg) >= (int)note_len && note_len > 4)
    memcpy(note + note_len - 4, "...", 4);
}

/* device_step of this step: the graph's replay, or eagerly (capturing it first when the run is
   warm). A capture that fails leaves a note, turns the graph off and runs the step eagerly. */
static int graph_device_step(train_model *m, const train_config *cfg, step_graph *sg,
                             int64_t step, char *note, size_t note_len, char *e, size_t n) {
  if (sg->on && !sg->g && sg->eager >= TRAIN_GRAPH_WARM) {
    char ge[512] = "";
    if (train_graph_begin(sg->device, sg->stream, ge, sizeof ge)) {
      note_set(note, note_len, "", ge);
    } else {
      const int rc = device_step(m, cfg, sg, 1, e, n);
      if (train_graph_end(sg->device, sg->stream, !rc, cfg->graph_dot, &sg->g, ge, sizeof ge))
        note_set(note, note_len, "", ge);
      else if (rc)
        note_set(note, note_len, "capturing the step: ", e);
    }
    if (!sg->g) {
      sg->on = 0;
      /* the capture ran nothing, but it counted its quantizations in the random stream */
      if (set_rng(m, step, e, n)) return -1;
    }
  }
  if (sg->g) {
    if (train_graph_launch(sg->device, sg->g, sg->stream, e, n)) return -1;
    sg->replays++;
    return 0;
  }
  sg->eager++;
  return device_step(m, cfg, sg, 0, e, n);
}

/* The host's half of a step before its device work: its random stream's step, its batch and the
   optimizer's constants into the host buffers the step reads. */
static int step_host(train_model *m, const train_config *cfg, step_graph *sg, int64_t step,
                     const int32_t *x, const int32_t *y, char *e, size_t n) {
  if (set_rng(m, step, e, n)) return -1;
  memcpy(sg->sx, x, (size_t)(m->cfg.batch * m->cfg.context) * sizeof *x);
  memcpy(sg->sy, y, (size_t)m->cfg.batch * sizeof *y);
  return train_model_update_begin(m, &cfg->adam, schedule(cfg, step), e, n);
}

/* After a replay of `step` is queued: its loss copied to the page-locked slot of its parity and
   its end marked, so that the host reads it while the next replay runs. */
static int replay_tail(train_model *m, step_graph *sg, int64_t step, char *e, size_t n) {
  const int k = (int)(step & 1);
  if (hq_ctx_memcpy(m->ctx, &sg->loss_pin[k], HQ_DEVICE_HOST, m->loss, hq_ctx_device(m->ctx),
                    sizeof *sg->loss_pin))
    return train_fail(e, n, "reading the loss: %s", hq_last_error());
  return train_cuda_order_mark(sg->done_ev[k], sg->stream, e, n);
}

/* train_step with the graph (sg->split; on the CPU without one): the same calls in the same
   order on the device. The batch and the optimizer's constants are written into their host
   buffers, which the last step's work no longer reads. Once the step is captured, a step whose
   successor follows it with nothing between them (nx, ny: that successor's batch; NULL when an
   evaluation, a checkpoint or the run's end comes first) launches the successor's replay before
   it reads its own loss: the host writes the successor's buffers once the replay under way has
   uploaded them (up_ev), so the GPU finds the next replay queued when a step ends, instead of
   waiting for the host to read the loss and launch it. The optimizer runs before the loss is
   read back; a loss that is not finite then fails the run as in train_step, with the update
   applied but never used (and, launched ahead, the next step's replay run). */
static int graph_step(train_model *m, const train_config *cfg, step_graph *sg, int64_t step,
                      const int32_t *x, const int32_t *y, const int32_t *nx, const int32_t *ny,
                      double *loss, char *note, size_t note_len, char *e, size_t n) {
  int replayed = sg->ahead == step;
  if (!replayed) {
    if (step_host(m, cfg, sg, step, x, y, e, n) ||
        graph_device_step(m, cfg, sg, step, note, note_len, e, n))
      return -1;
    replayed = sg->g && sg->up_ev;
    if (replayed && replay_tail(m, sg, step, e, n)) return -1;
  }
  sg->ahead = -1;
  if (replayed && nx) {
    if (train_cuda_order_sync(sg->up_ev, e, n) || step_host(m, cfg, sg, step + 1, nx, ny, e, n) ||
        graph_device_step(m, cfg, sg, step + 1, note, note_len, e, n) ||
        replay_tail(m, sg, step + 1, e, n))
      return -1;
    sg->ahead = step + 1;
    sg->n_ahead++;
  }
  if (replayed) {
    if (train_cuda_order_sync(sg->done_ev[step & 1], e, n)) return -1;
    *loss = sg->loss_pin[step & 1];
  } else if (train_model_read_loss(m, loss, e, n)) {
    return -1;
  }
  return check_loss(cfg, step, *loss, e, n);
}

static int64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *b = NULL;
  int64_t sz = file_size(path);
  if (sz >= 0 && (b = malloc((size_t)sz + 1)) && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return b;
}

char *train_step_path(const char *pat, int64_t step) {
  char num[24];
  const size_t nd = (size_t)snprintf(num, sizeof num, "%lld", (long long)step);
  size_t n = 1;
  for (const char *p = pat; *p;) {
    const int tag = !strncmp(p, "{step}", 6);
    n += tag ? nd : 1;
    p += tag ? 6 : 1;
  }
  char *out = malloc(n), *o = out;
  if (!out) return NULL;
  for (const char *p = pat; *p;) {
    if (!strncmp(p, "{step}", 6)) {
      memcpy(o, num, nd);
      o += nd;
      p += 6;
    } else {
      *o++ = *p++;
    }
  }
  *o = '\0';
  return out;
}

/* Save what the loop holds; times and sizes into res. */
static int save(const train_model *m, hq_recipe *recipe, const train_config *cfg,
                const train_data *d, uint64_t rng, const train_result *curves, const char *path,
                train_result *res, char *e, size_t n) {
  const double t0 = train_now();
  if (train_checkpoint_save(m, recipe, cfg, d, rng, curves, path, e, n)) return -1;
  res->ckpt_save_s = train_now() - t0;
  res->ckpt_bytes = file_size(path);
  return 0;
}

/* --verify-resume, second half: a fresh context and model from the checkpoint at_k, trained to
   the end; every step's loss must equal the uninterrupted run's (res->train_curve) and the final
   checkpoint (written without the eval curve, which the two runs do not share) must be the same
   bytes as final_a. Across ranks every rank runs it with its part of the batch (mc) and reads
   the files rank 0 wrote. */
static int verify(const train_config *cfg, const train_model_cfg *mc, const train_data *data,
                  hq_recipe *recipe, const char *at_k, const char *final_a, const char *final_b,
                  train_result *res, int32_t *x, int32_t *y, char *e, size_t n) {
  const int64_t part = train_dist_rank(mc->dist) * mc->batch;   /* this rank's first row */
  hq_ctx *ctx = NULL;
  hq_ctx_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.device = cfg->device;
  desc.seed = cfg->seed;
  train_model m;
  memset(&m, 0, sizeof m);
  train_result r2;
  memset(&r2, 0, sizeof r2);
  int rc = -1;
  unsigned char *a = NULL, *b = NULL;
  r2.train_curve = calloc((size_t)cfg->steps, sizeof *r2.train_curve);
  if (!r2.train_curve) {
    snprintf(e, n, "out of memory");
    goto out;
  }
  if (hq_ctx_create(&desc, &ctx)) {
    snprintf(e, n, "creating the context: %s", hq_last_error());
    goto out;
  }
  if (train_model_create(&m, mc, recipe, ctx, cfg->seed, e, n)) goto out;
  uint64_t rng;
  if (train_checkpoint_load(&m, recipe, cfg, data, at_k, &rng, &r2, e, n)) goto out;
  res->verified = 1;
  res->verify_at = m.step;
  for (int64_t step = m.step; step < cfg->steps; step++) {
    train_data_sample(data, &rng, cfg->model.batch, x, y);
    double loss;
    if (train_step(&m, cfg, step, x + part * cfg->model.context, y + part, &loss, e, n))
      goto out;
    r2.train_curve[r2.n_train_curve++] = (train_point){step, loss};
    const double want = res->train_curve[step].loss;
    if (res->verified == 1 && memcmp(&loss, &want, sizeof loss) != 0) {
      res->verified = -1;
      snprintf(res->verify_msg, sizeof res->verify_msg,
               "step %lld: loss %.9g after the reload, %.9g in the uninterrupted run",
               (long long)step + 1, loss, want);
    }
  }
  res->verify_steps = cfg->steps - res->verify_at;
  r2.n_eval_curve = 0;
  if (train_checkpoint_save(&m, recipe, cfg, data, rng, &r2, final_b, e, n)) goto out;
  size_t na, nb;
  a = read_all(final_a, &na);
  b = read_all(final_b, &nb);
  if (!a || !b) {
    snprintf(e, n, "--verify-resume: reading back %s: %s", !a ? final_a : final_b,
             strerror(errno));
    goto out;
  }
  if (res->verified == 1 && (na != nb || memcmp(a, b, na) != 0)) {
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    uint64_t hl = 0;   /* the safetensors header's length: where the tensors' bytes start */
    for (int i = 7; na >= 8 && i >= 0; i--) hl = hl << 8 | a[i];
    res->verified = -1;
    snprintf(res->verify_msg, sizeof res->verify_msg,
             "the final state differs: the checkpoints of the two runs (%zu and %zu bytes) differ "
             "from byte %zu, %s",
             na, nb, k,
             k < 8 + hl ? "in the header (the metadata: step, random-stream offset, data "
                          "position, ...)"
                        : "in the tensors (masters, moments, quantized weights, scaling state)");
  }
  /* across ranks: every rank has read the files before rank 0 removes them */
  if (!train_dist_all_ok(mc->dist, 1)) {
    snprintf(e, n, "--verify-resume: another rank failed (its message says why)");
    goto out;
  }
  rc = 0;
out:
  free(a);
  free(b);
  train_model_free(&m);
  if (ctx) hq_ctx_destroy(ctx);
  train_result_free(&r2);
  return rc;
}

int train_run(const train_config *cfg, const train_data *data, hq_recipe *recipe,
              const char *recipe_name, train_progress_fn progress, void *user,
              train_result *res, char *err, size_t err_len) {
  const double t_start = train_now();
  memset(res, 0, sizeof *res);
  snprintf(res->recipe, sizeof res->recipe, "%s", recipe_name);
  const char *path = hq_recipe_path(recipe);
  snprintf(res->path, sizeof res->path, "%s", path ? path : "");
  char e[2048] = "";
  int64_t step = 0;
  int rc = -1;
  char vdir[PATH_MAX] = "", v_k[PATH_MAX + 64] = "", v_a[PATH_MAX + 64] = "",
       v_b[PATH_MAX + 64] = "";

  hq_ctx *ctx = NULL;
  hq_ctx_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.device = cfg->device;
  desc.seed = cfg->seed;   /* stochastic rounding draws from (seed, offset): same for every run */
  train_model m;
  memset(&m, 0, sizeof m);
  train_profile *prof = NULL;
  step_graph sg;
  memset(&sg, 0, sizeof sg);
  sg.device = cfg->device;
  sg.ahead = -1;
  train_memwatch mem;
  train_memwatch_begin(&mem, cfg->device);   /* before the context: the level without this run */
  const int64_t B = cfg->model.batch, C = cfg->model.context;
  int32_t *x = malloc((size_t)(B * C) * sizeof *x), *y = malloc((size_t)B * sizeof *y);
  /* the next step's batch, sampled before this step's loss is read (graph_step) */
  int32_t *nx = malloc((size_t)(B * C) * sizeof *nx), *ny = malloc((size_t)B * sizeof *ny);
  res->train_curve = calloc((size_t)cfg->steps, sizeof *res->train_curve);
  res->cap_eval_curve = (cfg->eval_every > 0 ? cfg->steps / cfg->eval_every : 0) + 3;
  res->eval_curve = calloc((size_t)res->cap_eval_curve, sizeof *res->eval_curve);
  if (!x || !y || !nx || !ny || !res->train_curve || !res->eval_curve) {
    snprintf(e, sizeof e, "out of memory");
    goto out;
  }
  /* a graph is captured on a stream of the trainer's own, the context's; when none can be
     made, the context's creation says what is wrong with the device (or the run notes it). A
     run that is never captured (across ranks, --profile) keeps the default stream it always
     had. */
  if (cfg->cuda_graph && cfg->device != HQ_DEVICE_HOST && hq_built_with_cuda() &&
      !cfg->model.dist && !cfg->profile) {
    char se[200];
    if (train_cuda_stream_create(cfg->device, &sg.stream, se, sizeof se))
      snprintf(res->graph_note, sizeof res->graph_note, "a stream of its own: %s", se);
    desc.stream = sg.stream;
  }
  if (hq_ctx_create(&desc, &ctx)) {
    snprintf(e, sizeof e, "creating the context: %s", hq_last_error());
    goto out;
  }
  /* across ranks (dist.h): every rank's model trains on its part of the global batch */
  const int ranks = train_dist_size(cfg->model.dist), rank = train_dist_rank(cfg->model.dist);
  train_model_cfg mc = cfg->model;
  mc.batch = B / ranks;
  res->ranks = ranks;
  if (ranks > 1) {
    if (B % ranks) {
      snprintf(e, sizeof e, "--batch %lld does not split across %d ranks: give a multiple of %d",
               (long long)B, ranks, ranks);
      goto out;
    }
  }
  /* bf16-direct keeps no quantized weight or scaling state: nothing a checkpoint could hold */
  if (mc.direct && (cfg->ckpt_path || cfg->resume_path || cfg->verify_resume)) {
    snprintf(e, sizeof e, "bf16-direct saves no checkpoint (--checkpoint, --resume and "
             "--verify-resume take the recipes' runs)");
    goto out;
  }
  if (train_model_create(&m, &mc, recipe, ctx, cfg->seed, e, sizeof e)) goto out;
  res->n_params = m.n_params;
  if (cfg->profile) {   /* the last TRAIN_PROF_STEPS steps, after the first (plans, pools) */
    const int64_t first = cfg->steps > TRAIN_PROF_STEPS ? cfg->steps - TRAIN_PROF_STEPS + 1
                          : cfg->steps > 1            ? 2
                                                      : 1;
    if (train_prof_create(ctx, first, cfg->steps - first + 1, m.n_lin, &prof, e, sizeof e) ||
        train_model_profile(&m, prof, e, sizeof e))
      goto out;
  }
  train_dist_wire(&m, &res->wire_gathered, &res->wire_bf16, &res->wire_reduced);
  if (cfg->cuda_graph) {
    const char *why = train_model_graph_refusal(&m);
    if (cfg->device == HQ_DEVICE_HOST) {
      /* the host captures nothing, but takes the graph's kept qtensors (no allocation a step;
         the same bytes), which --cuda-graph off against on then checks on the CPU too */
      sg.split = !m.cfg.dist && !m.prof;
    } else if (why) {
      snprintf(res->graph_note, sizeof res->graph_note, "%s", why);
    } else if (sg.stream) {   /* else the note says why there is none */
      sg.split = sg.on = 1;
    }
    /* the batch's staging buffers: page-locked where a capture copies from them */
    const size_t bx = (size_t)(mc.batch * C) * sizeof *x, by = (size_t)mc.batch * sizeof *y;
    if (sg.split && sg.on) {
      char pe[200];
      void *px = NULL, *py = NULL;
      if (train_cuda_host_alloc(cfg->device, bx, &px, pe, sizeof pe) ||
          train_cuda_host_alloc(cfg->device, by, &py, pe, sizeof pe) ||
          train_model_graph_consts(&m, pe, sizeof pe)) {
        train_cuda_host_free(px);
        train_cuda_host_free(py);
        snprintf(res->graph_note, sizeof res->graph_note, "page-locked staging: %s", pe);
        sg.split = sg.on = 0;
      } else {
        sg.sx = px;
        sg.sy = py;
        sg.pinned = 1;
      }
    } else if (sg.split && (!(sg.sx = malloc(bx)) || !(sg.sy = malloc(by)))) {
      snprintf(e, sizeof e, "out of memory");
      goto out;
    }
    if (sg.split) train_model_keep_q(&m);
    if (sg.split && sg.on) {
      /* a captured step runs its wgrads and columnwise copies on a side lane (model.c); the
         random stream's step comes in with each batch; replays are launched ahead of their
         turn (graph_step) */
      void *lp = NULL;
      if (side_make(&m, &sg, &desc, e, sizeof e) || train_model_rng_upload(&m, e, sizeof e) ||
          train_cuda_order_event(cfg->device, &sg.up_ev, e, sizeof e) ||
          train_cuda_order_event(cfg->device, &sg.done_ev[0], e, sizeof e) ||
          train_cuda_order_event(cfg->device, &sg.done_ev[1], e, sizeof e) ||
          train_cuda_host_alloc(cfg->device, 2 * sizeof *sg.loss_pin, &lp, e, sizeof e))
        goto out;
      sg.loss_pin = lp;
    }
  }

  uint64_t rng = train_rng_stream(cfg->seed, 3);   /* the data order */
  if (cfg->resume_path) {
    const double t0 = train_now();
    if (train_checkpoint_load(&m, recipe, cfg, data, cfg->resume_path, &rng, res, e, sizeof e)) {
      snprintf(err, err_len, "recipe '%s'%s%s%s: %s", recipe_name, res->path[0] ? " (" : "",
               res->path, res->path[0] ? ")" : "", e);
      rc = -2;
      goto out;
    }
    res->ckpt_load_s = train_now() - t0;
    res->resumed_from = step = m.step;
  } else if (cfg->eval_every > 0) {   /* the starting point of the eval curve */
    double l0;
    if (evaluate(&m, data, cfg->eval_batches, x, y, &l0, e, sizeof e)) goto out;
    res->eval_curve[res->n_eval_curve++] = (train_point){0, l0};
  }
  int64_t verify_at = 0;
  if (cfg->verify_resume) {
    /* the first --checkpoint-every step this run trains: where a user resumes from */
    verify_at = cfg->verify_at > 0 ? (step / cfg->verify_at + 1) * cfg->verify_at
                                   : step + (cfg->steps - step) / 2;
    if (cfg->verify_at > 0 && verify_at >= cfg->steps) {
      snprintf(e, sizeof e, "--verify-resume: --checkpoint-every %lld saves no checkpoint after "
               "step %lld before --steps %lld: give a smaller one, or leave it out to verify "
               "halfway", (long long)cfg->verify_at, (long long)step, (long long)cfg->steps);
      goto out;
    }
    if (verify_at <= step) {
      snprintf(e, sizeof e, "--verify-resume: at least two steps to train are needed");
      goto out;
    }
    /* across ranks rank 0 makes the directory and writes the files in it; every rank reads
       them (one machine, or a filesystem every rank sees) */
    const char *td = getenv("TMPDIR");
    int made = 1;
    if (rank == 0) {
      const int len = snprintf(vdir, sizeof vdir, "%s/hq-train-verify.XXXXXX",
                               td && *td ? td : "/tmp");
      if (len < 0 || (size_t)len >= sizeof vdir) {   /* never a directory of a cut name */
        snprintf(e, sizeof e, "--verify-resume: TMPDIR is %zu bytes long, too long for a "
                 "temporary directory in it (PATH_MAX %d)", strlen(td), PATH_MAX);
        vdir[0] = '\0';
        made = 0;
      } else if (!mkdtemp(vdir)) {
        snprintf(e, sizeof e, "--verify-resume: a temporary directory %s: %s", vdir,
                 strerror(errno));
        vdir[0] = '\0';
        made = 0;
      }
    }
    if (train_dist_bcast_str(cfg->model.dist, vdir, sizeof vdir, e, sizeof e)) goto out;
    if (!vdir[0]) {
      if (made)
        snprintf(e, sizeof e, "--verify-resume: rank 0 could not make a temporary directory "
                 "(its message says why)");
      goto out;
    }
    /* vdir is shorter than PATH_MAX, each name under 64 bytes: none is cut */
    snprintf(v_k, sizeof v_k, "%s/step%lld.safetensors", vdir, (long long)verify_at);
    snprintf(v_a, sizeof v_a, "%s/final-uninterrupted.safetensors", vdir);
    snprintf(v_b, sizeof v_b, "%s/final-resumed.safetensors", vdir);
  }
  /* the interval of the progress line in course (a resumed run: from the last multiple of
     log_every) */
  double interval_sum = 0, last_interval = NAN;
  int64_t interval_n = 0;
  for (int64_t s = step - step % cfg->log_every; s < step; s++, interval_n++)
    interval_sum += res->train_curve[s].loss;
  /* tokens/s is the steady state: a run's first steps pay one-time costs (the lazy loading of
     each module's kernels, GEMM plans, the memory pool's growth) that a long run amortises and
     that fell on whichever recipe ran first; a tenth of the steps, at most 10, is left out */
  const int64_t warm = cfg->steps >= 20 ? (cfg->steps / 10 < 10 ? cfg->steps / 10 : 10) : 0;
  double all_s = 0;
  int64_t all_tokens = 0;
  int sampled = 0;   /* x, y hold this step's batch already (sampled ahead) */
  for (; step < cfg->steps; step++) {
    if (!sampled) train_data_sample(data, &rng, B, x, y);
    sampled = 0;
    train_prof_step_begin(prof, step + 1);
    const double t0 = train_now();
    double loss;
    const int32_t *xs = x + rank * mc.batch * C, *ys = y + rank * mc.batch;
    /* what runs after this step: the resume check's save, an evaluation, a checkpoint */
    const int64_t done = step + 1;
    const int at_verify = done == verify_at;
    const int at_eval = cfg->eval_every > 0 && done % cfg->eval_every == 0 && done < cfg->steps;
    const int at_ckpt = cfg->ckpt_path && ((cfg->ckpt_every > 0 && done % cfg->ckpt_every == 0) ||
                                           done == cfg->steps);
    /* the next step follows this one with nothing between them: its batch now, so that its
       replay can be launched before this step's loss is read (graph_step); the data order is
       the same, nothing between the two draws the random stream */
    const int next = done < cfg->steps && !at_verify && !at_eval && !at_ckpt;
    if (next) train_data_sample(data, &rng, B, nx, ny);
    if (sg.split ? graph_step(&m, cfg, &sg, step, xs, ys, next ? nx + rank * mc.batch * C : NULL,
                              next ? ny + rank * mc.batch : NULL, &loss, res->graph_note,
                              sizeof res->graph_note, e, sizeof e)
                 : train_step(&m, cfg, step, xs, ys, &loss, e, sizeof e))
      goto out;
    if (next) {   /* the next step's batch where the loop looks for it */
      int32_t *t = x;
      x = nx, nx = t;
      t = y, y = ny, ny = t;
      sampled = 1;
    }
    const double dt = train_now() - t0;
    all_s += dt;
    all_tokens += B;
    if (step >= warm) {
      res->train_s += dt;
      res->tokens += B;
    }
    train_prof_step_end(prof);
    res->train_curve[res->n_train_curve++] = (train_point){step, loss};
    if (step == 0) res->step0_loss = loss;
    interval_sum += loss;
    interval_n++;

    if (at_verify && save(&m, recipe, cfg, data, rng, res, v_k, res, e, sizeof e)) goto out;
    double eval_loss = NAN;
    if (at_eval) {
      if (evaluate(&m, data, cfg->eval_batches, x, y, &eval_loss, e, sizeof e)) goto out;
      res->eval_curve[res->n_eval_curve++] = (train_point){done, eval_loss};
    }
    /* after this step's eval (which changes nothing the training reads), so that the saved eval
       curve is the one a resumed run continues */
    if (at_ckpt) {
      char *cp = train_step_path(cfg->ckpt_path, done);
      if (!cp) {
        snprintf(e, sizeof e, "--checkpoint: out of memory");
        goto out;
      }
      const int failed = save(&m, recipe, cfg, data, rng, res, cp, res, e, sizeof e);
      free(cp);
      if (failed) goto out;
      res->ckpt_saves++;
    }
    if (done % cfg->log_every == 0 || done == cfg->steps || !isnan(eval_loss)) {
      last_interval = interval_sum / (double)interval_n;
      if (progress && rank == 0) {
        train_progress p = {recipe_name, done, cfg->steps, last_interval, eval_loss,
                            res->train_s > 0 ? (double)res->tokens / res->train_s
                                             : (double)all_tokens / all_s,
                            train_now() - t_start};
        progress(user, &p);
      }
      interval_sum = 0;
      interval_n = 0;
    }
  }
  if (cfg->verify_resume) {   /* the final state, without the eval curve the reload lacks */
    train_result noeval = *res;
    noeval.n_eval_curve = 0;
    if (train_checkpoint_save(&m, recipe, cfg, data, rng, &noeval, v_a, e, sizeof e)) goto out;
  }
  res->train_loss = last_interval;
  if (evaluate(&m, data, 0, x, y, &res->eval_loss, e, sizeof e)) goto out;
  res->eval_curve[res->n_eval_curve++] = (train_point){cfg->steps, res->eval_loss};
  if (!isfinite(res->eval_loss)) {
    snprintf(e, sizeof e, "the held-out loss is %s", isnan(res->eval_loss) ? "NaN" : "infinite");
    goto out;
  }
  res->tokens_per_s = res->train_s > 0 ? (double)res->tokens / res->train_s
                                        : (double)all_tokens / all_s;
  res->graph_replays = sg.replays;
  res->graph_ahead = sg.n_ahead;
  res->side_lane = m.side != NULL;
  /* as device_step uploads (the final evaluation's upload copies, so m.batch_mapped, which says
     what the last upload did, no longer tells) */
  res->batch_mapped = sg.replays > 0 && train_model_maps_batch(&m, sg.pinned);
  for (int i = 0; m.side && i < m.n_lin; i++) {
    res->side_splits += m.lin[i].split_in + m.lin[i].split_grad;
    res->side_amaxes += m.lin[i].part_amax[0] + m.lin[i].part_amax[1];
    res->side_wgrads += m.lin[i].wgrad_side;
    res->side_writebacks += m.lin[i].wb_side;
  }
  if (sg.g) train_graph_nodes(sg.g, res->graph_nodes);
  if (res->graph_note[0] && rank == 0)
    fprintf(stderr, "hq train: recipe '%s': --cuda-graph: %s; its steps ran eagerly\n",
            recipe_name, res->graph_note);
  res->peak_bytes = train_memwatch_peak(&mem);
  if (prof && train_prof_collect(prof, &res->prof, e, sizeof e)) goto out;
  res->n_layers = m.n_lin;
  for (int i = 0; i < m.n_lin; i++) {
    snprintf(res->layer_name[i], sizeof res->layer_name[i], "%s", m.lin[i].name);
    memcpy(res->layer_info[i], m.lin[i].info, sizeof m.lin[i].info);
  }
  if (cfg->verify_resume) {
    train_model_free(&m);   /* the second model needs no room beside the first */
    hq_ctx_destroy(ctx);
    ctx = NULL;
    if (verify(cfg, &mc, data, recipe, v_k, v_a, v_b, res, x, y, e, sizeof e)) {
      snprintf(err, err_len, "recipe '%s', --verify-resume: %s", recipe_name, e);
      e[0] = '\0';
      rc = -2;
      goto out;
    }
  }
  rc = 0;
out:
  if (rc == -1)
    snprintf(err, err_len, "recipe '%s'%s%s%s, step %lld: %s", recipe_name,
             res->path[0] ? " (" : "", res->path, res->path[0] ? ")" : "", (long long)step, e);
  if (rc == -2) rc = -1;
  if (vdir[0] && train_dist_rank(cfg->model.dist) == 0) {
    remove(v_k);
    remove(v_a);
    remove(v_b);
    rmdir(vdir);
  }
  train_prof_free(prof);
  /* work still queued after a failed step (its replay, or the next one's launched ahead) may
     read the buffers freed below */
  if (ctx) hq_ctx_sync(ctx);
  train_graph_free(sg.g);
  train_cuda_order_event_free(sg.up_ev);
  train_cuda_order_event_free(sg.done_ev[0]);
  train_cuda_order_event_free(sg.done_ev[1]);
  if (sg.loss_pin) train_cuda_host_free(sg.loss_pin);
  if (sg.pinned) {
    train_cuda_host_free(sg.sx);
    train_cuda_host_free(sg.sy);
  } else {
    free(sg.sx);
    free(sg.sy);
  }
  train_model_free(&m);
  side_free(&sg);   /* after the model, whose kept columnwise copies it made */
  if (ctx) hq_ctx_destroy(ctx);
  /* after the context, whose last work (its frees) is queued on it: destroying a stream lets
     that work finish */
  train_cuda_stream_destroy(sg.stream);
  free(x);
  free(y);
  free(nx);
  free(ny);
  res->total_s = train_now() - t_start;
  return rc;
}

void train_result_free(train_result *res) {
  free(res->train_curve);
  free(res->eval_curve);
  res->train_curve = res->eval_curve = NULL;
}
