/*
** train.h -- `hq train`: a character-level language model (makemore-style MLP) trained through
** libhqcore. The trainer uses only the public API (hq/hq.h, hq/train.h, hq/dist.h); an
** embedder can copy train/ as a starting point:
**   data.c   the corpus: words -> (context of C previous characters, next character) examples,
**            a seeded train / held-out split, seeded batch sampling
**   model.c  embedding -> L hidden linear layers -> lm_head -> softmax cross-entropy; every
**            linear layer's fprop, dgrad and wgrad through hq_linear_*; AdamW on FP32 masters
**            with the quantized weights written back (hq_adam_step); every buffer and every
**            elementwise op behind a small device table (device.h: ops_cpu.c, ops_cuda.cu)
**   loop.c   one training run per recipe: schedule, progress, periodic and final eval, timing
**   dist.c   `mpirun -np N hq train`: linear layers sharded by rows across the ranks (dist.h)
** The command line, the table, --json and --plot are in tools/cmd_train.c.
*/
#ifndef HQ_TRAIN_H
#define HQ_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "hq/hq.h"
#include "hq/train.h"
#include "device.h"   /* the device table: TRAIN_ACT_*, train_device_ops */
#include "profile.h"  /* --profile: train_profile, train_prof_result */
#include "hq/dist.h"
#include "dist.h"     /* across ranks: train_dist */
#include "direct.h"   /* the bf16-direct run: train_direct */

/* ---------------------------------------------------------------------------------------------
** Random numbers: one small generator (splitmix64), the same on every machine, so that two runs
** from the same seed see the same data order and the same initial weights.
*/
uint64_t train_rng_next(uint64_t *state);
double train_rng_uniform(uint64_t *state);   /* [0, 1) */
float train_rng_normal(uint64_t *state);     /* N(0, 1), Box-Muller */
/* A stream for one purpose ("init", "data", ...) derived from the run's seed. */
uint64_t train_rng_stream(uint64_t seed, uint64_t purpose);

/* ---------------------------------------------------------------------------------------------
** Data (data.c)
*/
#define TRAIN_VOCAB 27                       /* '.' (start/end) + 'a'..'z' */
#define TRAIN_DEFAULT_DATA "/usr/share/dict/words"
#define TRAIN_DEFAULT_DATA_PACKAGE "wamerican"

typedef struct train_data {
  int context;                               /* C: characters of context per example */
  int64_t n_words, n_train_words, n_eval_words;
  int64_t n_train, n_eval;                   /* examples */
  uint8_t *train_x, *eval_x;                 /* [n][C] token ids (0 = '.', 1..26 = 'a'..'z') */
  uint8_t *train_y, *eval_y;                 /* [n] the next token */
} train_data;

/* Read a text file: every whitespace-separated token made only of the letters a-z is a word
   (others -- capitalized names, possessives, digits -- are skipped); split the words 90/10 into
   train / held-out by a shuffle from `seed`; make one example per character and one for the end
   of each word. `is_default` words the missing-file error for the system word list. Returns 0,
   or -1 with a message in err. */
int train_data_load(train_data *d, const char *path, int is_default, int context, uint64_t seed,
                    char *err, size_t err_len);
void train_data_free(train_data *d);
/* B training examples drawn uniformly (with replacement) with `rng`: x [B][C], y [B]. */
void train_data_sample(const train_data *d, uint64_t *rng, int64_t batch, int32_t *x, int32_t *y);
/* Held-out examples [first, first + count) into x, y; rows past the end of the set are padding
   (context of '.', target '.'); returns how many rows are real. */
int64_t train_data_eval_batch(const train_data *d, int64_t first, int64_t batch, int32_t *x,
                              int32_t *y);

/* ---------------------------------------------------------------------------------------------
** Model (model.c)
*/
#define TRAIN_MAX_LINEAR 16                 /* hidden layers + lm_head */

typedef struct train_model_cfg {
  int context;                               /* C */
  int embed;                                 /* E: embedding width; fc1's input is C*E */
  int hidden;                                /* H: width of the hidden layers */
  int layers;                                /* L: hidden linear layers fc1..fcL */
  int64_t batch;                             /* B: rows of every activation */
  int vocab_pad;                             /* lm_head's outputs: 27 padded up (masked) */
  int act;                                   /* TRAIN_ACT_* */
  train_dist *dist;                          /* the ranks (dist.h; NULL: one process); batch
                                                is then this rank's part of the global batch */
  int grad_bf16;                             /* --grad-dtype bf16: the weight gradients
                                                reduce-scattered in BF16 (dist.c; ranks > 1) */
  int direct;                                /* 1: the bf16-direct run (direct.h): every GEMM
                                                on cuBLASLt, no quantizer, no scaling state;
                                                a CUDA context, one process */
} train_model_cfg;

typedef struct train_adam_cfg {
  float beta1, beta2, eps, weight_decay;     /* decoupled weight decay on weight matrices */
} train_adam_cfg;

/* GEMMs of a layer: what ran, from the first training step (hq_gemm_info). */
#define TRAIN_FPROP 0
#define TRAIN_DGRAD 1
#define TRAIN_WGRAD 2


typedef struct train_linear {
  char name[16];                             /* "fc1", ..., "lm_head": the role's name */
  int64_t in, out;                           /* W is [out, in] */
  float *w, *b;                              /* FP32 masters (device) */
  float *gw, *gb;                            /* their gradients */
  float *mw, *vw, *mb, *vb;                  /* Adam moments */
  hq_quantizer *q_in, *q_w, *q_grad;         /* (linear, input|weight|grad_output, name) */
  hq_qtensor *qw;                            /* the quantized weight, both directions, written
                                                back after every optimizer step */
  hq_qtensor *qx;                            /* this step's quantized input (kept for wgrad) */
  float *x;                                  /* input activations [B, in] */
  float *y;                                  /* output x W^T [B, out], without b (device.h) */
  hq_gemm_info info[3];                      /* TRAIN_FPROP/DGRAD/WGRAD, first step */
  int have_info;
  /* the input's (0) and the output gradient's (1) quantizer takes the amax that the kernel
     writing the tensor computes (device.h): its per-tensor amax is max |x| (HQ_AMAX_INPUT) in
     one direction at least and format-specific in none; one process */
  int fuse_amax[2];
  /* ... or would in the direction(s) of kind HQ_AMAX_INPUT alone, the other's amax being the
     format's own (nvfp4's RHT columnwise copy): set by train_model_create where the quantizer
     allows it, kept by train_model_side only where the two directions are made apart
     (split_in, split_grad), the rowwise copy then skipping its amax pass */
  int part_amax[2];
  /* across ranks (dist.h): w, mw, vw hold this rank's rows [r0, r0 + rows) of W (one process:
     all of them); gw the whole gradient of this rank's part of the batch, gws its shard summed
     over the ranks; qw_shard the shard quantized, gathered into qw by `gather` */
  int64_t r0, rows;
  float *gws;
  hq_qtensor *qw_shard;
  hq_gather *gather;
  /* train_model.keep_q: the input and the output gradient of a training step quantized into
     qtensors made at the first one and refreshed in place (hq_qtensor_update) at every later
     one, so that a step allocates nothing and can be captured in a CUDA graph; *_alias: the
     qtensor borrows its source (HQ_QUANTIZE_ALIAS), a buffer every step rewrites in place, so
     there is nothing to refresh */
  hq_qtensor *kx, *kdy;
  const float *kdy_src;
  int kx_alias, kdy_alias;
  /* train_model_side: the input's and the output gradient's columnwise copies (wgrad's
     operands) kept apart, made on the side lane while the main one makes the rowwise copy and
     runs the GEMMs that read it (kx, kdy then hold the rowwise copy alone); split_*: the
     role's two directions are storages of their own (a shared one is left whole) */
  hq_qtensor *kxc, *kdyc;
  int split_in, split_grad;
  int wgrad_side;   /* its wgrad on the side lane (a small one), else before dgrad on ctx */
  int wb_side;      /* its weight's write-back on the side lane (after AdamW on ctx) */
} train_linear;

/* train_model.side_ev: the main stream's work so far (fork), the side's (join), the side's
   reads of a layer's output gradient (read). */
enum { TRAIN_SIDE_FORK, TRAIN_SIDE_JOIN, TRAIN_SIDE_READ, TRAIN_SIDE_EVENTS };

typedef struct train_model {
  train_model_cfg cfg;
  hq_ctx *ctx;                               /* the device and stream everything runs on */
  const train_device_ops *ops;
  int n_lin;                                 /* layers + 1 (lm_head last) */
  train_linear *lin;
  float *emb, *gemb, *memb, *vemb;           /* [VOCAB, E] embedding, FP32, not a GEMM */
  int32_t *tok, *tgt;                        /* this batch on the device: [B][C], [B] */
  float *dlogits;                            /* [B, vocab_pad] */
  float *dbuf[2];                            /* [B, max width]: gradients flowing down */
  float *loss;                               /* device scalar: summed loss of the batch */
  int64_t n_valid;                           /* rows of the batch that count */
  int64_t step;                              /* optimizer steps taken */
  int64_t n_params;
  hq_state *state;                           /* the recipe's scaling state (delayed scaling:
                                                amax histories); no slice for other formats */
  float *amax_stash;                         /* host copy of the state's amaxes during an eval */
  size_t n_amax_stash;
  train_profile *prof;                       /* --profile (NULL: off; not owned) */
  float *prof_amax;                          /* --profile: the split amax pass's 2 floats */
  float *famax;                              /* fused amaxes: 2 floats per layer and tensor
                                                (input, output gradient), zeroed every forward;
                                                NULL when no layer takes one */
  float *aslot;                              /* each weight's write-back amax (hq_adam.amax_dev:
                                                2 floats per layer), zeroed with famax; NULL
                                                when no weight's write-back takes one */
  float *zbuf;                               /* the one allocation of famax and aslot (zalloc
                                                bytes), zeroed once a step while any slot is in
                                                use (zbytes: 0 or zalloc): by the upload kernel
                                                of a batch read in place, else by a kernel of
                                                the forward */
  size_t zalloc, zbytes;
  void *kscratch;                            /* the device table's scratch (NULL: none) */
  train_direct *direct;                      /* cfg.direct: the GEMMs and BF16 copies */
  int keep_q;                                /* the step's qtensors kept (train_linear.kx) */
  int batch_mapped;                          /* the last upload read the batch in place
                                                (train_model_upload) */
  /* train_model_rng_upload: each context's device word of the random stream's step (main,
     side; NULL: none), which the upload kernel of a batch read in place writes from kc_host, so
     that train_model_set_rng queues nothing: every step of a captured run uploads its batch in
     place, and a kernel per context between replays sat on the critical path */
  uint64_t *rng_dev[2];
  float lr;                                  /* the learning rate of the step under way */
  /* train_model_graph_consts: the optimizer's constants of the step under way (two slots: no
     weight decay, weight decay), written by the host into page-locked kc_host and brought to
     kc_dev ahead of the kernels that read them (hq_adam.consts_dev): by the upload kernel with
     a batch read in place (batch_mapped), else by a copy on the stream; NULL: the constants go
     to the kernels as arguments */
  void *kc_host, *kc_dev;
  /* train_model_side: a second context on a stream of its own (the same device and seed),
     where the small wgrads and the split layers' columnwise copies run; side_ev: the events that
     order the two streams (TRAIN_SIDE_*); side_queued: side work not yet joined into the main
     stream; side_read: a layer's output gradient still read there (the next layer's dgrad
     overwrites its buffer). NULL: every call on ctx. */
  hq_ctx *side;
  void *side_ev[TRAIN_SIDE_EVENTS];
  int side_queued, side_read;
} train_model;

/* The message into err (err_len bytes), and -1: how every train_* function that takes err
   reports a failure. */
int train_fail(char *err, size_t err_len, const char *fmt, ...) HQ_PRINTF(3, 4);

/* Build the model on ctx's device: parameters initialised from `seed` (the same for every
   recipe), quantizers of every layer's three roles from the recipe, the weights quantized once
   (both directions). On failure returns -1 with a message naming the layer and role in err. */
int train_model_create(train_model *m, const train_model_cfg *cfg, hq_recipe *recipe,
                       hq_ctx *ctx, uint64_t seed, char *err, size_t err_len);
void train_model_free(train_model *m);
/* Forward pass over a batch (x [B][C], y [B] host arrays; the first n_valid rows count), loss =
   mean cross-entropy of those rows. training = 1 quantizes inputs in both directions (wgrad needs
   the columnwise copy) and keeps them for train_model_backward; 0 (eval) only rowwise. */
int train_model_forward(train_model *m, const int32_t *x, const int32_t *y, int64_t n_valid,
                        int training, double *loss, char *err, size_t err_len);
/* train_model_forward in three parts, for a step captured in a CUDA graph (loop.c): the batch
   uploaded (host copies; with `mapped`, x and y page-locked, read in place by one kernel where
   the device table has one: m->batch_mapped, the kernel then bringing the optimizer's constants
   too), the forward on the device (the loss left in m->loss), the loss read back (synchronizes
   the stream; after the replay). */
/* Whether train_model_upload with `mapped` reads the batch in place (the device table has the
   kernel): what m->batch_mapped says after it. */
int train_model_maps_batch(const train_model *m, int mapped);
int train_model_upload(train_model *m, const int32_t *x, const int32_t *y, int mapped, char *err,
                       size_t err_len);
int train_model_forward_dev(train_model *m, int64_t n_valid, int training, char *err,
                            size_t err_len);
int train_model_read_loss(train_model *m, double *loss, char *err, size_t err_len);
/* Why m's training step (forward, backward, optimizer) cannot be captured in a CUDA graph (a
   fixed string), or NULL when it can once warm; then train_model_keep_q(m) makes the training
   step keep its qtensors and train_model_graph_consts(m) gives the optimizer its constants in
   device memory. */
const char *train_model_graph_refusal(train_model *m);
void train_model_keep_q(train_model *m);
/* Give a model that keeps its qtensors (train_model_keep_q) a side lane: `side`, a context on
   m's device and seed with a stream of its own, and TRAIN_SIDE_EVENTS ordering events (device.h,
   train_cuda_order_event). A layer's wgrad of at most 2^26 multiply-adds then runs on the side
   stream, which only the optimizer waits for, and a layer whose input or output gradient
   quantizes its two directions into storages of their own (by two calls, or a small tensor)
   makes the columnwise copy (read by wgrad alone) there too, beside the rowwise copy and the
   GEMMs that read it on the main stream; so does each weight's write-back after its AdamW on
   the main stream (a weight whose quantized copy is not the master borrowed, with no scaling
   state). The same calls make the same bytes (a direction's random bits depend on its role,
   step and direction, not on the context). Returns 1 when m takes it, 0 when it does not (a
   model that keeps no qtensors, the bf16-direct run, a run across ranks: m keeps no reference
   to side), -1 with the message in err. */
int train_model_side(train_model *m, hq_ctx *side, void *const *events, char *err,
                     size_t err_len);
/* The step keying stochastic rounding's random stream set on m's contexts (the side lane's too,
   its write ordered before the main stream's next work). Returns 0, or -1 with the message. */
int train_model_set_rng(train_model *m, uint64_t step, char *err, size_t err_len);
/* After train_model_graph_consts and train_model_side: the random stream's step brought to each
   context by the upload kernel from then on (train_model.rng_dev), where the device table has
   one. */
int train_model_rng_upload(train_model *m, char *err, size_t err_len);
/* Backward pass of the last training forward: every gradient (no accumulation). */
int train_model_backward(train_model *m, char *err, size_t err_len);
/* Evaluation must not change training: train_model_eval_begin stashes what a quantize
   accumulates or draws (the context's random stream, the scaling state's amaxes) and
   train_model_eval_end puts it back. */
int train_model_eval_begin(train_model *m, char *err, size_t err_len);
int train_model_eval_end(train_model *m, char *err, size_t err_len);
/* One AdamW step (hq_adam_step) with learning rate lr on every parameter, the quantized weights
   written back from the updated masters in the same call, then the scaling state updated (delayed scaling: the amaxes
   of this step rolled into the histories and the next step's scales computed; a trainer on
   several ranks all-reduces hq_state_amaxes with MAX first). */
int train_model_update(train_model *m, const train_adam_cfg *adam, float lr, char *err,
                       size_t err_len);
/* train_model_update in two parts, for a step whose optimizer a CUDA graph replays (loop.c):
   the host's part (the step counted, its constants written for the device slots; outside the
   graph, before every launch) and the device's (the slots filled, every AdamW step, the
   scaling state's update: what the graph records). */
int train_model_update_begin(train_model *m, const train_adam_cfg *adam, float lr, char *err,
                             size_t err_len);
int train_model_update_dev(train_model *m, const train_adam_cfg *adam, char *err,
                           size_t err_len);
/* Give m's optimizer its constants in device memory (kc_dev, filled from page-locked kc_host),
   so that a captured update reads each step's. Returns 0, or -1 with the message in err (m
   unchanged). The host buffer is rewritten by train_model_update_begin: the caller must have
   synchronized the stream since the last update (the loss's read-back does). */
int train_model_graph_consts(train_model *m, char *err, size_t err_len);
/* 1 when the recipe gives every role of every layer of this model identity (high precision) in
   both directions, 0 when not, -1 on error (message in err). */
int train_recipe_is_high_precision(hq_recipe *recipe, const train_model_cfg *cfg, char *err,
                                   size_t err_len);
/* Try recipe on cfg's shapes before a run trains, so that a format refuses one here and not
   after other runs trained: on ctx (one of the runs' device, shared by every recipe's check),
   each layer's three roles made into quantizers as train_model_create makes them and an empty
   qtensor of each role's shape (the input [B, in] and the output gradient [B, out] of this
   rank's batch, the weight [out, in] and this rank's shard of it). Returns 0, or -1 with a
   message naming the layer, the role, the format and the shape. */
int train_recipe_check(hq_recipe *recipe, const train_model_cfg *cfg, hq_ctx *ctx, char *err,
                       size_t err_len);
/* Profile m's steps into p (profile.h; p outlives m's use of it). Returns 0, or -1 with a message
   in err. */
int train_model_profile(train_model *m, train_profile *p, char *err, size_t err_len);

/* ---------------------------------------------------------------------------------------------
** Loop (loop.c)
*/
typedef struct train_config {
  train_model_cfg model;
  train_adam_cfg adam;
  int64_t steps;
  float lr, min_lr;                          /* peak and final learning rate */
  int64_t warmup;                            /* linear warmup steps, then cosine to min_lr */
  int64_t log_every;                         /* a progress line every N steps */
  int64_t eval_every;                        /* held-out eval every N steps (0: only at the end) */
  int64_t eval_batches;                      /* batches of the periodic eval (0: whole set) */
  uint64_t seed;
  int device;                                /* HQ_DEVICE_HOST or a CUDA ordinal */
  /* checkpoints (checkpoint.c) */
  const char *ckpt_path;                     /* save here (NULL: never) ... */
  int64_t ckpt_every;                        /* ... after steps N, 2N, ... and the last (0: only
                                                after the last) */
  const char *resume_path;                   /* start from this checkpoint (NULL: from scratch) */
  int verify_resume;                         /* save at step verify_at, train on, then reload that
                                                checkpoint into a fresh context and model, train
                                                the same steps again and compare bitwise */
  int64_t verify_at;                         /* N: the first multiple of N after the starting
                                                step (refused when none comes before steps);
                                                0: halfway through the steps left */
  int resume_no_verify;                      /* --no-verify: resume_path's checksums unchecked */
  int profile;                               /* --profile: per-phase times of the last steps */
  int cuda_graph;                            /* --cuda-graph on: the steady-state forward and
                                                backward captured once and replayed (loop.c) */
  const char *graph_dot;                     /* --graph-dot: the captured step written there as
                                                Graphviz dot, or NULL */
} train_config;

/* What the loop reports while it runs. */
typedef struct train_progress {
  const char *recipe;
  int64_t step, steps;                       /* steps done, of */
  double loss;                               /* mean train loss since the last line */
  double eval_loss;                          /* NaN when this line has no eval */
  double tokens_per_s;                       /* training throughput so far */
  double elapsed_s;                          /* of this run */
} train_progress;
typedef void (*train_progress_fn)(void *user, const train_progress *p);

typedef struct train_point {
  int64_t step;
  double loss;
} train_point;

typedef struct train_result {
  char recipe[128];                          /* the recipe's name */
  char path[512];                            /* its file ("" for the built-in baseline) */
  int high_precision;                        /* every role identity */
  double step0_loss;                         /* train loss of the first batch, before any step */
  double train_loss;                         /* mean train loss of the last log interval */
  double eval_loss;                          /* whole held-out set, after the last step */
  double train_s;                            /* forward + backward + update, no eval, of the
                                                steps after the warm-up (loop.c) */
  double total_s;                            /* the whole run, evals and setup included */
  double tokens_per_s;                       /* examples (one predicted character each) / train_s */
  int64_t tokens;                            /* the examples of those steps */
  int64_t n_params;
  train_point *train_curve;                  /* every step's train loss */
  int64_t n_train_curve;
  train_point *eval_curve;                   /* every eval */
  int64_t n_eval_curve, cap_eval_curve;
  int64_t resumed_from;                      /* the checkpoint's step (0: from scratch) */
  int64_t ckpt_saves;                        /* checkpoints written (--checkpoint) */
  double ckpt_save_s, ckpt_load_s;           /* time of the last save, of the resume's load */
  int64_t ckpt_bytes;                        /* size of the last checkpoint written */
  int verified;                              /* --verify-resume: 1 identical, -1 not, 0 not run */
  int64_t verify_at, verify_steps;           /* the step reloaded, steps compared */
  char verify_msg[512];                      /* what differed */
  int n_layers;                              /* the GEMMs that ran, per layer */
  char layer_name[TRAIN_MAX_LINEAR][16];
  hq_gemm_info layer_info[TRAIN_MAX_LINEAR][3];
  train_prof_result prof;                    /* --profile (prof.steps 0: not profiled) */
  int64_t peak_bytes;                        /* device memory high-water (-1: the host) */
  int ranks;                                 /* mpirun -np N (dist.h): N, else 1 */
  uint64_t wire_gathered, wire_bf16, wire_reduced;   /* bytes per step and rank (train_dist_wire) */
  int64_t graph_replays;                     /* --cuda-graph: steps replayed from the graph */
  int64_t graph_ahead;                       /* of them, launched before the step before them
                                                had its loss read back */
  int graph_nodes[TRAIN_GRAPH_NODE_KINDS];    /* its nodes per kind (train_graph_nodes) */
  int batch_mapped;                          /* the captured step read its batch in place
                                                from page-locked staging (no copy nodes) */
  int side_lane;                             /* the captured step's side stream (model.c,
                                                train_model_side): 1 when it has one */
  int side_splits;                           /* the layers' inputs and output gradients whose
                                                columnwise copies it makes */
  int side_amaxes;                           /* of those, the ones whose rowwise copy takes
                                                the writing kernel's amax only there
                                                (train_linear.part_amax) */
  int side_wgrads;                           /* the layers whose wgrad it runs */
  int side_writebacks;                       /* the weights whose write-back it runs */
  char graph_note[256];                      /* why the run did not capture ("": it did, or
                                                --cuda-graph off, or the CPU) */
} train_result;

/* ---------------------------------------------------------------------------------------------
** Checkpoints (checkpoint.c): the model's masters, Adam moments and step, every quantized weight
** (all directions and buffers), the scaling state, the context's random-stream offset, the data
** order's generator, the loss curves so far, the recipe (name, file, resolved formats and roles)
** and the model's shape, in one safetensors file (docs/training.md, 8).
*/
/* The recipe as it resolves, one line per format (plugin, options) and role section (malloc'd). */
char *train_recipe_spec(hq_recipe *r);
/* Write m (after m->step steps; data_rng: the data order's generator now; res: the curves so far)
   to path. Returns 0, or -1 with a message in err. */
int train_checkpoint_save(const train_model *m, hq_recipe *recipe, const train_config *cfg,
                          const train_data *d, uint64_t data_rng, const train_result *res,
                          const char *path, char *err, size_t err_len);
/* Load path into m (built with cfg->model and recipe, not trained): refused with a message naming
   the difference when the recipe, the shape, the seed, the data or the learning rate differ.
   Sets m->step, the context's random-stream offset, *data_rng and res's curves
   (res->train_curve has room for cfg->steps points). */
int train_checkpoint_load(train_model *m, hq_recipe *recipe, const train_config *cfg,
                          const train_data *d, const char *path, uint64_t *data_rng,
                          train_result *res, char *err, size_t err_len);

/* ---------------------------------------------------------------------------------------------
** Memory (memory.c): what a run allocates, estimated before it does, and what is available.
*/
typedef struct train_memory {
  uint64_t host, device;                     /* the peak of one run (device: 0 on the CPU) */
  uint64_t model, work, checkpoint;          /* of which: the model's buffers, GEMM and quantize
                                                temporaries, checkpoint copies */
} train_memory;
/* The estimate for cfg (runs train one after the other: the peak of one, plus the curves of
   n_results runs kept for the report). */
void train_memory_estimate(const train_config *cfg, int n_results, train_memory *out);
/* Bytes available on the host (HQ_DEVICE_HOST: /proc/meminfo's MemAvailable, or the cgroup's
   limit less its use when lower) or on a CUDA device (cudaMemGetInfo); the environment variable
   HQ_TRAIN_HOST_MEMORY or HQ_TRAIN_DEVICE_MEMORY (bytes, or with a K, M, G or T suffix) overrides
   it. source says where the number comes from. Returns 0, or -1 when it cannot be known. */
int train_memory_available(int device, uint64_t *bytes, char *source, size_t source_len);

/* Train one model with one recipe from cfg->seed. recipe_name names it in messages. Returns 0,
   or -1 with a message naming the recipe, the step and the layer in err. */
int train_run(const train_config *cfg, const train_data *data, hq_recipe *recipe,
              const char *recipe_name, train_progress_fn progress, void *user,
              train_result *res, char *err, size_t err_len);
void train_result_free(train_result *res);
/* The file a save at `step` writes: pat with every "{step}" replaced by the step (a new string,
   NULL when out of memory). */
char *train_step_path(const char *pat, int64_t step);

/* Seconds of a monotonic clock. */
double train_now(void);

#endif
