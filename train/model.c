/*
** model.c -- the model of `hq train`, a makemore-style MLP language model over characters:
**
**   tokens [B, C] -> embedding (27 x E, FP32) -> concat x1 [B, C*E]
**   -> fc1 .. fcL: y = x W^T + b, x_next = act(y)       (W [H, in], act = tanh or GELU)
**   -> lm_head: logits [B, Vpad] = x W^T + b             (27 real outputs, the rest masked)
**   (the GEMMs compute x W^T alone; the activation and the loss add b as they read it)
**   -> softmax cross-entropy over the 27 real logits, mean over the batch
**
** Every linear layer runs its three GEMMs through libhqcore (hq_linear_fprop / dgrad / wgrad),
** each operand quantized by the quantizer the recipe gives its role:
**   (linear, input, NAME)        x: quantized every step, both directions in training (rowwise
**                                for fprop, columnwise for wgrad), rowwise only in eval
**   (linear, weight, NAME)       W: quantized once when the model is built, then written back
**                                in place from the FP32 master after every optimizer step
**                                (hq_adam_step does hq_qtensor_update); both directions
**                                (rowwise fprop, columnwise dgrad)
**   (linear, grad_output, NAME)  dy: quantized every step, both directions (rowwise dgrad,
**                                columnwise wgrad)
** The optimizer is libhqtrain's hq_adam_step (hq/train.h: AdamW on the FP32 masters, the
** quantized weight written back in the same call; CPU and CUDA). Everything else that is not a
** GEMM -- embedding, bias gradients, activations, softmax cross-entropy -- is plain FP32 in the
** device table of the context's device (device.h: ops_cpu.c, ops_cuda.cu); nothing else differs
** between the CPU and a GPU: every buffer comes from hq_ctx_alloc on the model's context, every
** copy goes through hq_ctx_memcpy, and the table's kernels run on the context's stream.
**
** The bf16-direct run (cfg.direct, direct.h) is the same model and step with the three GEMMs of
** every layer called on cuBLASLt directly from BF16 copies that its own cast kernel makes (the
** input, the output gradient, the weight after every AdamW step): no quantizer, no scaling state,
** no libhqcore GEMM. It measures what hq costs a trainer against the identity BF16 recipe.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

// --- helpers ------------------------------------------------------------------------------------

int train_fail(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return -1;
}

/* An error of libhqcore in layer `l`: "layer fc1: what: <hq_last_error>" (what may be NULL
   when libhqcore's message already names the role) */
static int hq_fail(char *err, size_t err_len, const train_linear *l, const char *what) {
  if (!l) return train_fail(err, err_len, "%s: %s", what, hq_last_error());
  if (!what) return train_fail(err, err_len, "layer %s: %s", l->name, hq_last_error());
  return train_fail(err, err_len, "layer %s: %s: %s", l->name, what, hq_last_error());
}

static int dev_alloc(train_model *m, size_t bytes, void *out) {
  void *p = NULL;
  if (hq_ctx_alloc(m->ctx, bytes, &p)) return -1;
  if (hq_ctx_memset(m->ctx, p, 0, bytes)) {
    hq_ctx_free(m->ctx, p);
    return -1;
  }
  *(void **)out = p;
  return 0;
}

static void dev_free(train_model *m, void *p) {
  if (p) hq_ctx_free(m->ctx, p);
}

static hq_tensor f32(const train_model *m, float *p, int64_t rows, int64_t cols) {
  return hq_tensor_2d(p, HQ_F32, hq_ctx_device(m->ctx), rows, cols);
}

static const char *const role_tensor[3] = {"input", "weight", "grad_output"};

static int same(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* fc1 .. fcL, then lm_head: the N of the layer's roles */
static void layer_name(const train_model_cfg *cfg, int i, char *out, size_t n) {
  if (i == cfg->layers) snprintf(out, n, "lm_head");
  else snprintf(out, n, "fc%d", i + 1);
}

/* Linear layer i's input and output features: fc1 reads the context's embeddings, the hidden
   layers H, lm_head writes the padded vocabulary. */
static void layer_dims(const train_model_cfg *cfg, int i, int64_t *in, int64_t *out) {
  *in = i == 0 ? (int64_t)cfg->context * cfg->embed : cfg->hidden;
  *out = i == cfg->layers ? cfg->vocab_pad : cfg->hidden;
}

/* Whether the kernel that writes a tensor of quantizer q can hand it its amax: a per-tensor amax
   of kind HQ_AMAX_INPUT (max |x|, NaN ignored: what device.h's kernels compute) in one direction
   at least, and none format-specific (HQ_AMAX_OWN: only the format's own pass makes it). */
static int amax_fusable(const hq_quantizer *q) {
  const uint32_t r = hq_quantizer_amax_kind(q, HQ_ROWWISE);
  const uint32_t c = hq_quantizer_amax_kind(q, HQ_COLWISE);
  return (r == HQ_AMAX_INPUT || c == HQ_AMAX_INPUT) && r != HQ_AMAX_OWN && c != HQ_AMAX_OWN;
}

/* Whether q takes such an amax in one direction while the other makes its own: the writing kernel
   can hand it to the direction that takes it, where the two are quantized by separate calls. */
static int amax_part_fusable(const hq_quantizer *q) {
  const uint32_t r = hq_quantizer_amax_kind(q, HQ_ROWWISE);
  const uint32_t c = hq_quantizer_amax_kind(q, HQ_COLWISE);
  return (r == HQ_AMAX_INPUT && c == HQ_AMAX_OWN) || (c == HQ_AMAX_INPUT && r == HQ_AMAX_OWN);
}

/* The input qtensor of the last training forward given up: freed, unless it is the kept one
   (train_model.keep_q). */
static void drop_qx(train_linear *l) {
  if (l->qx && l->qx != l->kx) hq_qtensor_free(l->qx);
  l->qx = NULL;
}

// --- build / free -------------------------------------------------------------------------------

/* The bf16-direct run's GEMMs (direct.h), the weights' first BF16 copies, and the GEMMs' info as
   the report shows it. On failure m is freed. */
static int direct_create(train_model *m, char *err, size_t err_len) {
  int64_t in[TRAIN_MAX_LINEAR], out[TRAIN_MAX_LINEAR];
  const int64_t B = m->cfg.batch;
  int rc = 0;
  if (m->cfg.dist)
    rc = train_fail(err, err_len, "bf16-direct runs in one process, not across ranks");
  for (int i = 0; i < m->n_lin; i++) {
    in[i] = m->lin[i].in;
    out[i] = m->lin[i].out;
  }
  if (!rc) rc = train_direct_create(m->ctx, m->n_lin, in, out, B, &m->direct, err, err_len);
  for (int i = 0; i < m->n_lin && !rc; i++) {
    train_linear *l = &m->lin[i];
    if (train_direct_weight(m->direct, i, l->w))
      rc = train_fail(err, err_len, "layer %s: %s", l->name, train_direct_error(m->direct));
    /* m, n, k of each GEMM as libhqcore reports them (column-major, core/gemm.c) */
    const int64_t mnk[3][3] = {{l->out, B, l->in}, {l->in, B, l->out}, {l->in, l->out, B}};
    for (int g = 0; g < 3; g++) {
      hq_gemm_info *gi = &l->info[g];
      memset(gi, 0, sizeof *gi);
      gi->struct_size = sizeof *gi;
      gi->path = HQ_GEMM_PATH_NATIVE;
      gi->m = mnk[g][0];
      gi->n = mnk[g][1];
      gi->k = mnk[g][2];
      snprintf(gi->format_a, sizeof gi->format_a, "bf16");
      snprintf(gi->format_b, sizeof gi->format_b, "bf16");
      snprintf(gi->provider, sizeof gi->provider, "cublaslt-direct");
    }
    l->have_info = 1;
  }
  if (rc) train_model_free(m);
  return rc;
}

int train_model_create(train_model *m, const train_model_cfg *cfg, hq_recipe *recipe,
                       hq_ctx *ctx, uint64_t seed, char *err, size_t err_len) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  m->ctx = ctx;
  m->ops = hq_ctx_device(ctx) == HQ_DEVICE_HOST ? train_cpu_ops() : train_cuda_ops();
  if (!m->ops) {
    m->ctx = NULL;
    return train_fail(err, err_len, "device %d: this hq was built without CUDA",
                      hq_ctx_device(ctx));
  }
  const int64_t B = cfg->batch, C = cfg->context, E = cfg->embed, H = cfg->hidden;
  if (cfg->layers < 1 || cfg->layers >= TRAIN_MAX_LINEAR)
    return train_fail(err, err_len, "layers = %d: must be 1..%d", cfg->layers,
                      TRAIN_MAX_LINEAR - 1);
  if (B < 1 || C < 1 || E < 1 || H < 1 || cfg->vocab_pad < TRAIN_VOCAB)
    return train_fail(err, err_len, "bad model dimensions");

  m->n_lin = cfg->layers + 1;
  m->lin = calloc((size_t)m->n_lin, sizeof *m->lin);
  if (!m->lin) return train_fail(err, err_len, "out of memory");
  int64_t widest = C * E;
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    layer_name(cfg, i, l->name, sizeof l->name);
    layer_dims(cfg, i, &l->in, &l->out);
    train_dist_shard(cfg->dist, l->out, &l->r0, &l->rows);
    if (l->out > widest) widest = l->out;
  }

  /* buffers */
  const size_t fs = sizeof(float);
  int bad = dev_alloc(m, (size_t)(TRAIN_VOCAB * E) * fs, &m->emb) ||
            dev_alloc(m, (size_t)(TRAIN_VOCAB * E) * fs, &m->gemb) ||
            dev_alloc(m, (size_t)(TRAIN_VOCAB * E) * fs, &m->memb) ||
            dev_alloc(m, (size_t)(TRAIN_VOCAB * E) * fs, &m->vemb) ||
            dev_alloc(m, (size_t)(B * C) * sizeof(int32_t), &m->tok) ||
            dev_alloc(m, (size_t)B * sizeof(int32_t), &m->tgt) ||
            dev_alloc(m, (size_t)(B * cfg->vocab_pad) * fs, &m->dlogits) ||
            dev_alloc(m, (size_t)(B * widest) * fs, &m->dbuf[0]) ||
            dev_alloc(m, (size_t)(B * widest) * fs, &m->dbuf[1]) || dev_alloc(m, fs, &m->loss);
  m->n_params = TRAIN_VOCAB * E;
  for (int i = 0; i < m->n_lin && !bad; i++) {
    train_linear *l = &m->lin[i];
    const size_t nw = (size_t)(l->out * l->in) * fs, nb = (size_t)l->out * fs;
    const size_t ns = (size_t)(l->rows * l->in) * fs;   /* this rank's shard */
    bad = dev_alloc(m, ns, &l->w) || dev_alloc(m, nw, &l->gw) || dev_alloc(m, ns, &l->mw) ||
          dev_alloc(m, ns, &l->vw) || (cfg->dist && dev_alloc(m, ns, &l->gws)) ||
          dev_alloc(m, nb, &l->b) || dev_alloc(m, nb, &l->gb) ||
          dev_alloc(m, nb, &l->mb) || dev_alloc(m, nb, &l->vb) ||
          dev_alloc(m, (size_t)(B * l->out) * fs, &l->y);
    m->n_params += l->out * l->in + l->out;
  }
  const size_t scratch = m->ops->scratch_bytes(B, (int)C, (int)E, widest);
  if (!bad && scratch) bad = dev_alloc(m, scratch, &m->kscratch);
  if (bad) {
    train_model_free(m);
    return train_fail(err, err_len, "out of memory for the model: %s", hq_last_error());
  }
  /* layer i's input: the embedding concat (i = 0) or layer i-1's activations */
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    if (dev_alloc(m, (size_t)(B * l->in) * fs, &l->x)) {
      train_model_free(m);
      return train_fail(err, err_len, "out of memory for the model: %s", hq_last_error());
    }
  }

  /* initial values, from the seed alone (every recipe starts from the same weights):
     embedding N(0, 1); W N(0, 1/in) (lm_head N(0, 0.01/in): near-uniform first predictions);
     biases 0; lm_head's padded rows 0 (masked outputs: they never receive a gradient) */
  uint64_t rng = train_rng_stream(seed, 2);
  size_t host_n = (size_t)(TRAIN_VOCAB * E);
  for (int i = 0; i < m->n_lin; i++) {
    const size_t n = (size_t)(m->lin[i].out * m->lin[i].in);
    if (n > host_n) host_n = n;
  }
  float *h = malloc(host_n * fs);
  if (!h) {
    train_model_free(m);
    return train_fail(err, err_len, "out of memory");
  }
  for (size_t k = 0; k < (size_t)(TRAIN_VOCAB * E); k++) h[k] = train_rng_normal(&rng);
  bad = hq_ctx_memcpy(ctx, m->emb, hq_ctx_device(ctx), h, HQ_DEVICE_HOST,
                      (size_t)(TRAIN_VOCAB * E) * fs);
  for (int i = 0; i < m->n_lin && !bad; i++) {
    train_linear *l = &m->lin[i];
    const int last = i == m->n_lin - 1;
    const float sd = (last ? 0.1f : 1.0f) / sqrtf((float)l->in);
    for (int64_t r = 0; r < l->out; r++)
      for (int64_t c = 0; c < l->in; c++)
        h[r * l->in + c] = last && r >= TRAIN_VOCAB ? 0.0f : sd * train_rng_normal(&rng);
    bad = hq_ctx_memcpy(ctx, l->w, hq_ctx_device(ctx), h + l->r0 * l->in, HQ_DEVICE_HOST,
                        (size_t)(l->rows * l->in) * fs);
  }
  free(h);
  if (bad) {
    train_model_free(m);
    return train_fail(err, err_len, "copying the initial weights: %s", hq_last_error());
  }

  if (cfg->direct) return direct_create(m, err, err_len);
  /* quantizers of the three roles of every layer, bound to one scaling state for the recipe;
     the weights quantized once, both directions; the input and gradient shapes tried now (an
     empty tensor of each) so that a format that rejects one fails here, before any training */
  if (hq_state_create(recipe, ctx, &m->state)) {
    train_fail(err, err_len, "the recipe's scaling state: %s", hq_last_error());
    train_model_free(m);
    return -1;
  }
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    hq_quantizer **q[3] = {&l->q_in, &l->q_w, &l->q_grad};
    const int64_t rows[3] = {B, l->out, B}, cols[3] = {l->in, l->in, l->out};
    for (int t = 0; t < 3; t++) {
      hq_role role = hq_role_of("linear", role_tensor[t], l->name);
      /* a role left to high precision by accident (a mistyped section) trains without a word
         otherwise; a recipe that means it says `unmatched = identity` */
      if (hq_recipe_unmatched(recipe) == HQ_UNMATCHED_UNSET && hq_recipe_match(recipe, &role) < 0)
        fprintf(stderr, "hq train: warning: recipe %s: role linear:%s:%s matches no [role] "
                "section: both directions stay in high precision (say `unmatched = identity` "
                "in [recipe] if that is meant)\n", hq_recipe_path(recipe), role_tensor[t],
                l->name);
      if (hq_quantizer_create_ex(recipe, &role, m->state, q[t])) {
        train_fail(err, err_len, "layer %s: role linear:%s:%s: %s", l->name, role_tensor[t],
                   l->name, hq_last_error());
        train_model_free(m);
        return -1;
      }
      hq_quantizer_set_usage(*q[t], HQ_BOTH);
      if (t == 1) continue;
      hq_qtensor *probe;
      if (hq_make_empty(*q[t], ctx, rows[t], cols[t], HQ_F32, &probe)) {
        hq_fail(err, err_len, l, NULL);   /* names the role, the format and the shape */
        train_model_free(m);
        return -1;
      }
      hq_qtensor_free(probe);
      l->fuse_amax[t / 2] = !cfg->dist && amax_fusable(*q[t]);
      l->part_amax[t / 2] = !cfg->dist && amax_part_fusable(*q[t]);
    }
    if (train_dist_weight(m, l, 1, err, err_len)) {
      train_model_free(m);
      return -1;
    }
  }
  /* the amaxes cleared every step, in one buffer zeroed by one kernel each forward: the fused
     ones, then one slot per weight for the optimizer's write-back amax (hq_adam.amax_dev with
     HQ_ADAM_AMAX_ZEROED: no zeroing launch per weight), which the step's kernel computes when
     the weight's directions take the new master's amax (the rule of amax_fusable; a host
     step has no such kernel). The one-direction amaxes (part_amax) are in use, and so zeroed,
     only once a side lane splits their tensors (train_model_side). */
  int need_f = 0, need_a = 0, part = 0;
  for (int i = 0; i < m->n_lin; i++) {
    need_f |= m->lin[i].fuse_amax[0] || m->lin[i].fuse_amax[1];
    part |= m->lin[i].part_amax[0] || m->lin[i].part_amax[1];
    need_a |= !cfg->dist && hq_ctx_device(ctx) >= 0 && amax_fusable(m->lin[i].q_w);
  }
  const int live = need_f || need_a;
  need_f |= part;
  const size_t nf = need_f ? (size_t)m->n_lin * 4 : 0, na = need_a ? (size_t)m->n_lin * 2 : 0;
  if (nf + na && dev_alloc(m, (nf + na) * sizeof(float), &m->zbuf)) {
    train_fail(err, err_len, "out of memory for the model: %s", hq_last_error());
    train_model_free(m);
    return -1;
  }
  m->zalloc = (nf + na) * sizeof(float);
  m->zbytes = live ? m->zalloc : 0;
  m->famax = nf ? m->zbuf : NULL;
  m->aslot = na ? m->zbuf + nf : NULL;
  return 0;
}

void train_model_free(train_model *m) {
  if (!m->ctx) {
    free(m->lin);
    memset(m, 0, sizeof *m);
    return;
  }
  train_dist_model_free(m);
  train_direct_free(m->direct);
  for (int i = 0; m->lin && i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    drop_qx(l);
    if (l->kx) hq_qtensor_free(l->kx);
    if (l->kdy) hq_qtensor_free(l->kdy);
    if (l->kxc) hq_qtensor_free(l->kxc);
    if (l->kdyc) hq_qtensor_free(l->kdyc);
    if (l->qw) hq_qtensor_free(l->qw);
    hq_quantizer_free(l->q_in);
    hq_quantizer_free(l->q_w);
    hq_quantizer_free(l->q_grad);
    float *bufs[] = {l->w, l->b, l->gw, l->gb, l->mw, l->vw, l->mb, l->vb, l->x, l->y};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) dev_free(m, bufs[k]);
  }
  void *bufs[] = {m->emb, m->gemb, m->memb, m->vemb, m->tok, m->tgt, m->dlogits,
                  m->dbuf[0], m->dbuf[1], m->loss, m->prof_amax, m->zbuf, m->kscratch,
                  m->kc_dev};
  for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) dev_free(m, bufs[k]);
  if (m->state) hq_state_free(m->state);   /* after every quantizer and qtensor bound to it */
  if (m->kc_host) {
    hq_ctx_sync(m->ctx); /* a queued copy may still read it */
    train_cuda_host_free(m->kc_host);
  }
  free(m->amax_stash);
  free(m->lin);
  memset(m, 0, sizeof *m);
}

int train_recipe_check(hq_recipe *recipe, const train_model_cfg *cfg, hq_ctx *ctx, char *err,
                       size_t err_len) {
  const int ranks = train_dist_size(cfg->dist);
  if (cfg->direct || cfg->batch % ranks) return 0;   /* no quantizer; a batch the run refuses */
  hq_state *st = NULL;
  int rc = 0;
  if (hq_state_create(recipe, ctx, &st))
    rc = train_fail(err, err_len, "the recipe's scaling state: %s", hq_last_error());
  const int64_t B = cfg->batch / ranks;
  for (int i = 0; i <= cfg->layers && !rc; i++) {
    char name[16];
    layer_name(cfg, i, name, sizeof name);
    int64_t in, out, r0, rows;
    layer_dims(cfg, i, &in, &out);
    train_dist_shard(cfg->dist, out, &r0, &rows);
    /* the input, the weight, the output gradient as train_model_create makes them; across
       ranks this rank's shard of the weight too */
    const int64_t shape[4][2] = {{B, in}, {out, in}, {B, out}, {rows, in}};
    for (int t = 0; t < (rows < out ? 4 : 3) && !rc; t++) {
      const char *tensor = role_tensor[t == 3 ? 1 : t];
      hq_role role = hq_role_of("linear", tensor, name);
      hq_quantizer *q = NULL;
      hq_qtensor *probe = NULL;
      if (hq_quantizer_create_ex(recipe, &role, st, &q))
        rc = train_fail(err, err_len, "layer %s: role linear:%s:%s: %s", name, tensor, name,
                        hq_last_error());
      else if (hq_quantizer_set_usage(q, HQ_BOTH) ||
               hq_make_empty(q, ctx, shape[t][0], shape[t][1], HQ_F32, &probe))
        rc = train_fail(err, err_len, "layer %s: %s%s", name,
                        t == 3 ? "this rank's shard of the weight: " : "", hq_last_error());
      if (probe) hq_qtensor_free(probe);
      hq_quantizer_free(q);
    }
  }
  if (st) hq_state_free(st);
  return rc;
}

int train_recipe_is_high_precision(hq_recipe *recipe, const train_model_cfg *cfg, char *err,
                                   size_t err_len) {
  for (int i = 0; i <= cfg->layers; i++) {
    char name[16];
    layer_name(cfg, i, name, sizeof name);
    for (int t = 0; t < 3; t++) {
      hq_role role = hq_role_of("linear", role_tensor[t], name);
      hq_quantizer *q;
      if (hq_quantizer_create(recipe, &role, &q))
        return train_fail(err, err_len, "role linear:%s:%s: %s", role_tensor[t], name,
                          hq_last_error());
      int hp = same(hq_quantizer_plugin(q, HQ_ROWWISE), "identity") &&
               same(hq_quantizer_plugin(q, HQ_COLWISE), "identity");
      hq_quantizer_free(q);
      if (!hp) return 0;
    }
  }
  return 1;
}

// --- forward / backward / update ---------------------------------------------------------------

static hq_gemm_info *info_slot(train_linear *l, int which) {
  if (l->have_info) return NULL;
  l->info[which].struct_size = sizeof(hq_gemm_info);
  return &l->info[which];
}

/* --profile (profile.h): `call` as one bracket of phase ph; returns the call's status */
#define PROF(m, ph, call) (train_prof_begin((m)->prof), prof_done((m)->prof, (ph), (call)))
static int prof_done(train_profile *p, int ph, int rc) {
  train_prof_end(p, ph);
  return rc;
}
/* the same for a trainer kernel: phase TRAIN_PH_KERNELS, part pk (TRAIN_PK_*) */
#define PROFK(m, pk, call) (train_prof_begin((m)->prof), kernel_done((m)->prof, (pk), (call)))
static int kernel_done(train_profile *p, int pk, int rc) {
  train_prof_end_kernel(p, pk);
  return rc;
}

/* The fused amax pair of layer i's input (kind TRAIN_QT_INPUT) or output gradient
   (TRAIN_QT_GRAD) in m->famax, or NULL when its quantizer does not take one: in one direction
   alone (part_amax) it does once the side lane makes the two directions apart. The writing
   kernel and the quantize of one step ask under the same lanes, so they agree. */
static float *fused_amax(const train_model *m, int i, int kind) {
  const int t = kind == TRAIN_QT_GRAD;
  const train_linear *l = &m->lin[i];
  const int takes = l->fuse_amax[t] || (l->part_amax[t] && m->side);
  return m->famax && takes ? m->famax + 4 * i + 2 * t : NULL;
}

/* A GEMM's info: the layer's slot on the first training step, else, in a profiled step, `local`
   (its path names the bracket's phase), else NULL. */
static hq_gemm_info *gemm_info(const train_model *m, train_linear *l, int which,
                               hq_gemm_info *local) {
  hq_gemm_info *g = info_slot(l, which);
  if (g || !train_prof_on(m->prof)) return g;
  memset(local, 0, sizeof *local);
  local->struct_size = sizeof *local;
  return local;
}

/* the bracket of a GEMM: its phase is the path it took */
static int gemm_done(train_profile *p, const hq_gemm_info *g, int rc) {
  train_prof_end(p, train_prof_gemm_phase(g ? g->path : HQ_GEMM_PATH_NONE));
  return rc;
}
#define PROF_GEMM(m, g, call) (train_prof_begin((m)->prof), gemm_done((m)->prof, (g), (call)))

/* hq_quantize of a `kind` tensor (TRAIN_QT_*: an input or an output gradient). An identity
   direction of the source's dtype borrows the source (HQ_QUANTIZE_ALIAS): no copy. That is safe
   here because nothing writes a source while its qtensor lives: a layer's input x is written by
   the previous layer's activation in the next forward, after the backward freed qx; the output
   gradient's buffer (dlogits or dbuf[k]) is not the one its dgrad writes (dbuf[k ^ 1]), and qdy
   is freed before the next layer down writes it. `fused` (or NULL) is the amax pair the kernel
   that wrote src computed (fused_amax): the quantize takes it and skips its own amax pass, with
   the same bytes. Without it, in a profiled step, the per-tensor amax pass runs apart
   (hq_quantizer_amax, then hq_quantize_ex with it: the same bytes) so that the profile times it
   on its own. */
static int quantize(train_model *m, hq_quantizer *q, const hq_tensor *src, int kind,
                    const float *fused, hq_qtensor **out) {
  train_profile *p = m->prof;
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.flags = HQ_QUANTIZE_ALIAS;
  if (m->cfg.dist) return train_dist_quantize(m, q, src, &args, out);   /* the ranks' amax */
  args.amax = fused;
  if (!train_prof_on(p)) return hq_quantize_ex(q, m->ctx, src, &args, out);
  train_prof_quantized(p, kind, 1);
  if (!fused && (hq_quantizer_amax_kind(q, HQ_ROWWISE) != HQ_AMAX_NONE ||
                 hq_quantizer_amax_kind(q, HQ_COLWISE) != HQ_AMAX_NONE)) {
    if (PROF(m, TRAIN_PH_AMAX, hq_quantizer_amax(q, m->ctx, src, m->prof_amax))) return -1;
    args.amax = m->prof_amax;
  }
  return PROF(m, TRAIN_PH_QUANTIZE, hq_quantize_ex(q, m->ctx, src, &args, out));
}

/* Whether every direction qt holds is one buffer at src: qt borrows it (HQ_QUANTIZE_ALIAS). */
static int borrows(const hq_qtensor *qt, const void *src) {
  const uint32_t dirs = hq_qtensor_dirs(qt);
  for (uint32_t dir = HQ_ROWWISE; dir <= HQ_COLWISE; dir <<= 1) {
    const hq_storage *st = (dirs & dir) ? hq_qtensor_storage(qt, dir) : NULL;
    if ((dirs & dir) && (!st || st->nbuf != 1 || hq_storage_cbuf(st, 0)->ptr != src)) return 0;
  }
  return dirs != 0;
}

/* Direction(s) `dir` of src (0: the quantizer's usage, or the qtensor's) into its kept qtensor
   *slot on ctx: made at the first step, refreshed in place at every later one. */
static int kept_dir(hq_ctx *ctx, hq_quantizer *q, const hq_tensor *src, const float *fused,
                    uint32_t dir, hq_qtensor **slot) {
  hq_quantize_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.amax = fused;
  args.dirs = dir;
  return *slot ? hq_qtensor_update_ex(*slot, ctx, src, &args)
               : hq_quantize_ex(q, ctx, src, &args, slot);
}

/* quantize() into a qtensor kept across steps (train_model.keep_q): made at the first call,
   refreshed in place at every later one (hq_qtensor_update_ex: the bytes of a fresh quantize,
   the same fused amax taken, nothing allocated). A qtensor that borrows its source already
   holds the source's new bytes: nothing to do. */
static int quantize_kept(train_model *m, hq_quantizer *q, const hq_tensor *src, int kind,
                         const float *fused, hq_qtensor **slot, int *alias) {
  if (!*slot) {
    if (quantize(m, q, src, kind, fused, slot)) return -1;
    *alias = borrows(*slot, src->data);
    return 0;
  }
  return *alias ? 0 : kept_dir(m->ctx, q, src, fused, 0, slot);
}

/* Side lane event ev (TRAIN_SIDE_*) marked on the stream of context `on` (mark), or waited for
   there; a failure's message names layer l (NULL: none) and `what`. */
static int side_event(train_model *m, int ev, int mark, hq_ctx *on, const train_linear *l,
                      const char *what, char *err, size_t err_len) {
  static const char *const names[TRAIN_SIDE_EVENTS] = {"fork", "join", "reads"};
  char ce[200];
  if (!(mark ? train_cuda_order_mark(m->side_ev[ev], hq_ctx_stream(on), ce, sizeof ce)
             : train_cuda_order_wait(m->side_ev[ev], hq_ctx_stream(on), ce, sizeof ce)))
    return 0;
  if (l)
    return train_fail(err, err_len, "layer %s: %s: the side lane's %s: %s", l->name, what,
                      names[ev], ce);
  return train_fail(err, err_len, "%s: the side lane's %s: %s", what, names[ev], ce);
}

/* The side stream made to wait for the main one's work so far (fork), or the main stream for the
   side's (join). */
static int side_order(train_model *m, int fork, const train_linear *l, const char *what,
                      char *err, size_t err_len) {
  const int ev = fork ? TRAIN_SIDE_FORK : TRAIN_SIDE_JOIN;
  if (side_event(m, ev, 1, fork ? m->ctx : m->side, l, what, err, err_len) ||
      side_event(m, ev, 0, fork ? m->side : m->ctx, l, what, err, err_len))
    return -1;
  m->side_queued = fork;
  if (!fork) m->side_read = 0;
  return 0;
}

/* The side lane's reads of a layer's output gradient: marked once queued (mark), waited for by
   the main stream before it writes that buffer (wait; nothing when none is pending). */
static int side_read(train_model *m, int mark, const train_linear *l, char *err,
                     size_t err_len) {
  if (!mark && !m->side_read) return 0;
  if (side_event(m, TRAIN_SIDE_READ, mark, mark ? m->side : m->ctx, l, mark ? "wgrad" : "dgrad",
                 err, err_len))
    return -1;
  m->side_read = mark;
  return 0;
}

/* Layer l's src (`what`: its name in a message) in two directions on the two lanes: the
   columnwise copy into *col on the side stream, once src is ready there, and the rowwise one into
   *row on the main stream. A direction whose amax is the format's own makes it (fused not
   passed): the fused pair then holds the other direction's alone (part_amax). */
static int quantize_lanes(train_model *m, const train_linear *l, hq_quantizer *q,
                          const hq_tensor *src, const float *fused, hq_qtensor **row,
                          hq_qtensor **col, const char *what, char *err, size_t err_len) {
  const int own_r = hq_quantizer_amax_kind(q, HQ_ROWWISE) == HQ_AMAX_OWN;
  const int own_c = hq_quantizer_amax_kind(q, HQ_COLWISE) == HQ_AMAX_OWN;
  if (side_order(m, 1, l, what, err, err_len)) return -1;
  if (kept_dir(m->side, q, src, own_c ? NULL : fused, HQ_COLWISE, col) ||
      kept_dir(m->ctx, q, src, own_r ? NULL : fused, HQ_ROWWISE, row))
    return hq_fail(err, err_len, l, what);
  return 0;
}

int train_model_profile(train_model *m, train_profile *p, char *err, size_t err_len) {
  if (!m->prof_amax && dev_alloc(m, 2 * sizeof(float), &m->prof_amax))
    return train_fail(err, err_len, "--profile: the amax buffer: %s", hq_last_error());
  m->prof = p;
  return 0;
}

/* Layer l's input quantized (both directions in training, kept in l->qx for its wgrad) and its
   fprop through libhqcore. */
static int linear_fprop(train_model *m, train_linear *l, int training, char *err, size_t err_len) {
  const int64_t B = m->cfg.batch;
  const int i = (int)(l - m->lin);
  hq_tensor xt = f32(m, l->x, B, l->in), yt = f32(m, l->y, B, l->out);
  hq_quantizer_set_usage(l->q_in, training ? HQ_BOTH : HQ_ROWWISE);
  const float *fa = fused_amax(m, i, TRAIN_QT_INPUT);
  if (training && m->side && l->split_in) {
    if (quantize_lanes(m, l, l->q_in, &xt, fa, &l->kx, &l->kxc, "quantizing the input", err,
                       err_len))
      return -1;
    l->qx = l->kx;
  } else if (training && m->keep_q) {
    if (quantize_kept(m, l->q_in, &xt, TRAIN_QT_INPUT, fa, &l->kx, &l->kx_alias))
      return hq_fail(err, err_len, l, "quantizing the input");
    l->qx = l->kx;
  } else if (quantize(m, l->q_in, &xt, TRAIN_QT_INPUT, fa, &l->qx)) {
    return hq_fail(err, err_len, l, "quantizing the input");
  }
  hq_gemm_info local, *gi = training ? gemm_info(m, l, TRAIN_FPROP, &local) : NULL;
  /* no bias: the kernels that read y add it (device.h) */
  if (PROF_GEMM(m, gi, hq_linear_fprop(m->ctx, hq_operand_q(l->qx), hq_operand_q(l->qw), NULL,
                                       HQ_F32, &yt, gi)))
    return hq_fail(err, err_len, l, "fprop");
  return 0;
}

/* The two sets of constants a step applies: AdamW without weight decay (the embedding, the
   biases) and with it (the weights). */
#define TRAIN_KC_PLAIN 0
#define TRAIN_KC_DECAY 1
/* A slot's bytes: HQ_ADAM_CONSTS_BYTES rounded up to hq_adam.consts_dev's 16-byte alignment. */
#define TRAIN_KC_STRIDE ((HQ_ADAM_CONSTS_BYTES + 15) / 16 * 16)
/* After the two slots in the page-locked buffer: the step of the random stream, 8 bytes, which
   the upload kernel writes into each context's device word (train_model_rng_upload). */
#define TRAIN_KC_STEP (2 * TRAIN_KC_STRIDE)

/* Whether the last upload brought the optimizer's constants: a captured step's constants come
   in with its batch, by the upload kernel at the step's head, since a copy node at the
   optimizer's head left the stream idle before the kernel after it (docs/performance.md, "The
   batch read in place"). */
static int consts_mapped(const train_model *m) {
  return m->batch_mapped && m->kc_dev;
}

int train_model_maps_batch(const train_model *m, int mapped) {
  return mapped && m->ops->upload_mapped;
}

int train_model_upload(train_model *m, const int32_t *x, const int32_t *y, int mapped, char *err,
                       size_t err_len) {
  const train_model_cfg *c = &m->cfg;
  const int64_t B = c->batch;
  const int dev = hq_ctx_device(m->ctx);
  /* a captured step's batch read in place by one kernel: the two copy nodes it replaces each
     left the replay idle before its first kernel (docs/performance.md, "The batch read in
     place") */
  m->batch_mapped = train_model_maps_batch(m, mapped);
  if (m->batch_mapped) {
    const int32_t *step_words = m->kc_host ? (const int32_t *)((char *)m->kc_host + TRAIN_KC_STEP)
                                           : NULL;
    const train_span span[TRAIN_UPLOAD_SPANS] = {
        {m->tok, x, B * c->context},
        {m->tgt, y, B},
        {m->kc_dev, m->kc_host, consts_mapped(m) ? 2 * TRAIN_KC_STRIDE / 4 : 0},
        {(int32_t *)m->rng_dev[0], step_words, m->rng_dev[0] ? 2 : 0},
        {(int32_t *)m->rng_dev[1], step_words, m->rng_dev[1] ? 2 : 0},
        {(int32_t *)m->zbuf, NULL, (int64_t)(m->zbytes / 4)}};
    if (PROF(m, TRAIN_PH_COPY, m->ops->upload_mapped(m->ctx, span, TRAIN_UPLOAD_SPANS)))
      return train_fail(err, err_len, "uploading the batch: %s", m->ops->error());
    return 0;
  }
  if (PROF(m, TRAIN_PH_COPY,
           hq_ctx_memcpy(m->ctx, m->tok, dev, x, HQ_DEVICE_HOST, (size_t)(B * c->context) * 4) ||
               hq_ctx_memcpy(m->ctx, m->tgt, dev, y, HQ_DEVICE_HOST, (size_t)B * 4)))
    return hq_fail(err, err_len, NULL, "uploading the batch");
  return 0;
}

int train_model_forward_dev(train_model *m, int64_t n_valid, int training, char *err,
                            size_t err_len) {
  const train_model_cfg *c = &m->cfg;
  const int64_t B = c->batch;
  /* the fused amaxes are max-accumulated by the kernels: zeroed once a step, each then written
     by one kernel of this forward or of the backward that follows it; the weights' write-back
     slots with them, for the optimizer that follows every training step's backward. The upload
     before every forward zeroed them already when it read the batch in place (its kernel's last
     span): a kernel of its own here sat between the upload and the embedding on the step's
     critical path. */
  if (m->zbytes && !m->batch_mapped &&
      PROF(m, TRAIN_PH_AMAX, hq_ctx_memset(m->ctx, m->zbuf, 0, m->zbytes)))
    return train_fail(err, err_len, "zeroing the fused amaxes: %s", hq_last_error());
  if (PROFK(m, TRAIN_PK_EMBED,
            m->ops->embed_fwd(m->ctx, m->emb, m->tok, m->lin[0].x, B, c->context, c->embed,
                              fused_amax(m, 0, TRAIN_QT_INPUT))))
    return train_fail(err, err_len, "embedding: %s", m->ops->error());
  m->n_valid = n_valid;
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    drop_qx(l);
    if (m->direct) {
      train_prof_quantized(m->prof, TRAIN_QT_INPUT, 1);
      if (PROF(m, TRAIN_PH_QUANTIZE, train_direct_input(m->direct, i, l->x)) ||
          PROF(m, TRAIN_PH_GEMM_NATIVE, train_direct_fprop(m->direct, i, l->y)))
        return train_fail(err, err_len, "layer %s: %s", l->name, train_direct_error(m->direct));
    } else if (linear_fprop(m, l, training, err, err_len)) {
      return -1;
    }
    if (!training) drop_qx(l);
    if (i + 1 < m->n_lin &&
        PROFK(m, TRAIN_PK_ACT_FWD,
              m->ops->act_fwd(m->ctx, c->act, l->y, l->b, l->out, m->lin[i + 1].x, B * l->out,
                              fused_amax(m, i + 1, TRAIN_QT_INPUT))))
      return train_fail(err, err_len, "layer %s: activation: %s", l->name, m->ops->error());
  }
  if (PROFK(m, TRAIN_PK_LOSS,
            m->ops->xent(m->ctx, m->lin[m->n_lin - 1].y, m->lin[m->n_lin - 1].b, m->tgt, B,
                         n_valid, TRAIN_VOCAB, c->vocab_pad, m->loss,
                         training ? m->dlogits : NULL,
                         training ? fused_amax(m, m->n_lin - 1, TRAIN_QT_GRAD) : NULL,
                         m->kscratch)))
    return train_fail(err, err_len, "loss: %s", m->ops->error());
  return 0;
}

int train_model_read_loss(train_model *m, double *loss, char *err, size_t err_len) {
  float lv;
  if (PROF(m, TRAIN_PH_COPY, hq_ctx_memcpy(m->ctx, &lv, HQ_DEVICE_HOST, m->loss,
                                           hq_ctx_device(m->ctx), sizeof lv)))
    return train_fail(err, err_len, "reading the loss: %s", hq_last_error());
  *loss = lv;
  return 0;
}

int train_model_forward(train_model *m, const int32_t *x, const int32_t *y, int64_t n_valid,
                        int training, double *loss, char *err, size_t err_len) {
  return train_model_upload(m, x, y, 0, err, err_len) ||
                 train_model_forward_dev(m, n_valid, training, err, err_len) ||
                 train_model_read_loss(m, loss, err, err_len)
             ? -1
             : 0;
}

const char *train_model_graph_refusal(train_model *m) {
  if (m->cfg.dist)
    return "a run across ranks is not captured (its reductions run between the kernels)";
  if (m->prof) return "--profile times each phase with events between the kernels";
  for (int i = 0; i < m->n_lin && !m->direct; i++) {
    hq_quantizer *q[2] = {m->lin[i].q_in, m->lin[i].q_grad};
    for (int t = 0; t < 2; t++) {
      if (hq_quantizer_columnwise_source(q[t]) == HQ_SOURCE_ROWWISE_DEQUANTIZED)
        return "a quantizer with columnwise_source = rowwise_dequantized allocates a temporary "
               "at every step";
    }
  }
  return NULL;
}

void train_model_keep_q(train_model *m) { m->keep_q = 1; }

/* A tensor of at most this many elements is small enough for a quantize of both directions in
   one call to be bound by latency rather than bandwidth: splitting that call reads the source
   twice at no cost and takes half its time off the main stream. A larger one is read once. The
   limit lies between the default model's tensors (2^15-2^16) and the wide preset's hidden ones
   (2^21-2^22); docs/performance.md, "A second stream for wgrad and the columnwise copies". */
#define TRAIN_SIDE_SPLIT_MAX ((int64_t)1 << 20)
/* A wgrad of at most this many multiply-adds cannot fill the GPU: it runs on the side lane beside
   the main stream's work. A larger one fills it alone, where running beside dgrad only slows
   both, and stays on the main stream. Between the default model's (2^23-2^24) and the wide
   preset's (2^29-2^32), as above. */
#define TRAIN_SIDE_WGRAD_MAX ((int64_t)1 << 26)

/* Whether a scaling state serves q (in either direction). */
static int has_state(const hq_quantizer *q) {
  hq_state_slice sl = {.struct_size = sizeof sl};
  return hq_quantizer_state_slice(q, HQ_ROWWISE, &sl) != HQ_ENOENT ||
         hq_quantizer_state_slice(q, HQ_COLWISE, &sl) != HQ_ENOENT;
}

/* Whether q's two directions of a [rows, cols] tensor go to the two lanes: storages of their own
   (a direction that shares the other's buffer, as an identity copy does, would be made twice),
   no scaling state (a fused quantizer's state serves both directions at once), and either two
   calls already (two formats, or one that cannot make both at once) or a small tensor
   (TRAIN_SIDE_SPLIT_MAX). Probed on an empty qtensor. */
static int splits(train_model *m, hq_quantizer *q, int64_t rows, int64_t cols, int *out) {
  *out = 0;
  if (has_state(q) || hq_quantizer_columnwise_source(q) != HQ_SOURCE_ORIGINAL ||
      (hq_quantizer_fused(q) && rows * cols > TRAIN_SIDE_SPLIT_MAX))
    return 0;
  const uint32_t usage = hq_quantizer_usage(q);
  hq_qtensor *probe = NULL;
  int rc = hq_quantizer_set_usage(q, HQ_BOTH) ||
           hq_make_empty(q, m->ctx, rows, cols, HQ_F32, &probe);
  if (!rc) *out = hq_qtensor_bytes(probe, HQ_COLWISE) > 0;
  hq_qtensor_free(probe);
  hq_quantizer_set_usage(q, usage);
  return rc ? -1 : 0;
}

int train_model_side(train_model *m, hq_ctx *side, void *const *events, char *err,
                     size_t err_len) {
  if (!m->keep_q || m->direct || m->cfg.dist) return 0;
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    if (splits(m, l->q_in, m->cfg.batch, l->in, &l->split_in) ||
        splits(m, l->q_grad, m->cfg.batch, l->out, &l->split_grad))
      return hq_fail(err, err_len, l, "the side lane's probe");
    l->wgrad_side = m->cfg.batch * l->in * l->out <= TRAIN_SIDE_WGRAD_MAX;
    /* a weight's write-back on the side lane: a qtensor of its own storage (not the master
       borrowed); a scaling state's scales and amaxes change only at its update, which follows
       the optimizer's end, where the lanes join */
    l->wb_side = l->qw && !borrows(l->qw, l->w);
    /* a one-direction amax is taken only where the directions are made apart */
    l->part_amax[0] &= l->split_in;
    l->part_amax[1] &= l->split_grad;
    if (l->part_amax[0] || l->part_amax[1]) m->zbytes = m->zalloc;
  }
  m->side = side;
  for (int k = 0; k < TRAIN_SIDE_EVENTS; k++) m->side_ev[k] = events[k];
  return 1;
}

int train_model_rng_upload(train_model *m, char *err, size_t err_len) {
  if (!m->kc_host || !m->ops->upload_mapped) return 0;
  hq_ctx *c[2] = {m->ctx, m->side};
  for (int k = 0; k < 2; k++)
    if (c[k] && hq_ctx_rng_offset_device(c[k], &m->rng_dev[k]))
      return train_fail(err, err_len, "the random stream's device step: %s", hq_last_error());
  return 0;
}

int train_model_set_rng(train_model *m, uint64_t step, char *err, size_t err_len) {
  /* brought by the step's upload kernel: the host's copies here, the device words there */
  if (m->rng_dev[0]) {
    memcpy((char *)m->kc_host + TRAIN_KC_STEP, &step, sizeof step);
    if (hq_ctx_set_rng_offset_ex(m->ctx, step, HQ_RNG_OFFSET_HOST_ONLY) ||
        (m->side && hq_ctx_set_rng_offset_ex(m->side, step, HQ_RNG_OFFSET_HOST_ONLY)))
      return train_fail(err, err_len, "the random stream: %s", hq_last_error());
    return 0;
  }
  /* the side stream writes its context's step once the main stream's work so far has run: a
     replay launched ahead of this call (loop.c) may still read the last step there */
  if (m->side && side_order(m, 1, NULL, "the random stream", err, err_len)) return -1;
  if (hq_ctx_set_rng_offset(m->ctx, step) || (m->side && hq_ctx_set_rng_offset(m->side, step)))
    return train_fail(err, err_len, "the random stream: %s", hq_last_error());
  /* the side context's step is written on its stream; the main stream's next work (a replay of
     the step, whose side branch reads it) waits for it */
  return m->side ? side_order(m, 0, NULL, "the random stream", err, err_len) : 0;
}

/* Layer l's output gradient dy quantized, its wgrad (into l->gw) and dgrad (into dx) through
   libhqcore; the input kept by its training forward freed. With a side lane (train_model_side)
   a small wgrad runs there, and the split layers' columnwise copies are made there. */
static int linear_backward(train_model *m, train_linear *l, const float *dy, float *dx, char *err,
                           size_t err_len) {
  const int64_t B = m->cfg.batch;
  const int i = (int)(l - m->lin);
  if (!l->qx)
    return train_fail(err, err_len, "layer %s: backward without a training forward", l->name);
  hq_tensor dyt = f32(m, (float *)dy, B, l->out), gwt = f32(m, l->gw, l->out, l->in);
  hq_tensor dxt = f32(m, dx, B, l->in);
  hq_qtensor *qdy = NULL;
  const float *fa = fused_amax(m, i, TRAIN_QT_GRAD);
  const int side_wgrad = m->side && l->wgrad_side;
  if (m->side && l->split_grad) {
    if (quantize_lanes(m, l, l->q_grad, &dyt, fa, &l->kdy, &l->kdyc,
                       "quantizing the output gradient", err, err_len))
      return -1;
    qdy = l->kdy;
  } else if (m->keep_q) {
    /* a borrowed source must stay the buffer it borrowed: the backward's order fixes it */
    if (l->kdy && l->kdy_alias && l->kdy_src != dy)
      return train_fail(err, err_len,
                        "layer %s: the output gradient moved to another buffer while "
                        "its kept qtensor borrows the first one",
                        l->name);
    if (quantize_kept(m, l->q_grad, &dyt, TRAIN_QT_GRAD, fa, &l->kdy, &l->kdy_alias))
      return hq_fail(err, err_len, l, "quantizing the output gradient");
    l->kdy_src = dy;
    qdy = l->kdy;
    /* the side lane's wgrad reads both operands as made so far */
    if (side_wgrad && side_order(m, 1, l, "wgrad", err, err_len)) return -1;
  } else if (quantize(m, l->q_grad, &dyt, TRAIN_QT_GRAD, fa, &qdy)) {
    return hq_fail(err, err_len, l, "quantizing the output gradient");
  }
  hq_qtensor *qx_col = m->side && l->split_in ? l->kxc : l->qx;
  hq_qtensor *qdy_col = m->side && l->split_grad ? l->kdyc : qdy;
  /* a large wgrad stays on the main stream, in its place before dgrad, once the side lane's
     columnwise copies are made */
  int rc = !side_wgrad && m->side_queued ? side_order(m, 0, l, "wgrad", err, err_len) : 0;
  hq_gemm_info local, *gi = gemm_info(m, l, TRAIN_WGRAD, &local);
  if (!rc) {
    rc = PROF_GEMM(m, gi, hq_linear_wgrad(side_wgrad ? m->side : m->ctx, hq_operand_q(qx_col),
                                          hq_operand_q(qdy_col), &gwt, 0, gi));
    if (rc) hq_fail(err, err_len, l, "wgrad");
  }
  /* dy's buffer is the next layer's dx: the previous layer's reads of this dx (its columnwise
     copy, a qtensor that borrows it) end before dgrad writes it, and this layer's are marked
     for the next */
  if (!rc && m->side) rc = side_read(m, 0, l, err, err_len);
  if (!rc && side_wgrad) rc = side_read(m, 1, l, err, err_len);
  if (!rc) {
    gi = gemm_info(m, l, TRAIN_DGRAD, &local);
    rc = PROF_GEMM(m, gi, hq_linear_dgrad(m->ctx, hq_operand_q(qdy), hq_operand_q(l->qw), &dxt,
                                          gi));
    if (rc) hq_fail(err, err_len, l, "dgrad");
  }
  if (qdy != l->kdy) hq_qtensor_free(qdy);
  drop_qx(l);
  if (rc) return -1;
  l->have_info = 1;
  return 0;
}

int train_model_backward(train_model *m, char *err, size_t err_len) {
  const train_model_cfg *c = &m->cfg;
  const int64_t B = c->batch;
  float *dy = m->dlogits;
  int next = 0;
  if (train_dist_loss_grad(m, err, err_len)) return -1;
  for (int i = m->n_lin - 1; i >= 0; i--) {
    train_linear *l = &m->lin[i];
    float *dx = m->dbuf[next];
    if (m->direct) {   /* the same two GEMMs, in the same order, from the BF16 copies */
      train_prof_quantized(m->prof, TRAIN_QT_GRAD, 1);
      if (PROF(m, TRAIN_PH_QUANTIZE, train_direct_grad(m->direct, i, dy)) ||
          PROF(m, TRAIN_PH_GEMM_NATIVE, train_direct_wgrad(m->direct, i, l->gw)) ||
          PROF(m, TRAIN_PH_GEMM_NATIVE, train_direct_dgrad(m->direct, i, dx)))
        return train_fail(err, err_len, "layer %s: %s", l->name, train_direct_error(m->direct));
    } else if (linear_backward(m, l, dy, dx, err, err_len)) {
      return -1;
    }
    if (PROFK(m, TRAIN_PK_BIAS, m->ops->colsum(m->ctx, dy, B, l->out, l->gb, m->kscratch)))
      return train_fail(err, err_len, "layer %s: bias gradient: %s", l->name, m->ops->error());
    if (i > 0) {
      if (PROFK(m, TRAIN_PK_ACT_BWD,
                m->ops->act_bwd(m->ctx, c->act, m->lin[i - 1].y, m->lin[i - 1].b, l->in, dx,
                                B * l->in, fused_amax(m, i - 1, TRAIN_QT_GRAD))))
        return train_fail(err, err_len, "layer %s: activation gradient: %s", m->lin[i - 1].name,
                          m->ops->error());
    } else if (PROFK(m, TRAIN_PK_EMBED,
                     m->ops->embed_bwd(m->ctx, dx, m->tok, m->gemb, B, c->context, c->embed,
                                       m->kscratch))) {
      return train_fail(err, err_len, "embedding gradient: %s", m->ops->error());
    }
    dy = dx;
    next ^= 1;
  }
  /* the optimizer reads the side lane's wgrads and the next step overwrites what it read: the
     main stream waits for it here (a capture must also end with the side stream joined) */
  return m->side_queued ? side_order(m, 0, NULL, "the backward's end", err, err_len) : 0;
}

static hq_adam adam_of(const train_model *m, const train_adam_cfg *a, int slot) {
  hq_adam adam = {sizeof adam, m->lr, a->beta1, a->beta2, a->eps,
                  slot == TRAIN_KC_DECAY ? a->weight_decay : 0.0f, m->step, NULL, NULL, 0};
  if (m->kc_dev) adam.consts_dev = (const char *)m->kc_dev + slot * TRAIN_KC_STRIDE;
  return adam;
}

int train_model_graph_consts(train_model *m, char *err, size_t err_len) {
  const size_t bytes = 2 * TRAIN_KC_STRIDE;
  if (train_cuda_host_alloc(hq_ctx_device(m->ctx), TRAIN_KC_STEP + sizeof(uint64_t), &m->kc_host,
                            err, err_len))
    return -1;
  if (dev_alloc(m, bytes, &m->kc_dev)) {
    train_cuda_host_free(m->kc_host);
    m->kc_host = NULL;
    return train_fail(err, err_len, "the optimizer's constants on the device: %s", hq_last_error());
  }
  return 0;
}

int train_model_update_begin(train_model *m, const train_adam_cfg *a, float lr, char *err,
                             size_t err_len) {
  m->step++;
  m->lr = lr;
  for (int slot = 0; m->kc_host && slot < 2; slot++) {
    const hq_adam adam = adam_of(m, a, slot);
    if (hq_adam_consts_write(&adam, (char *)m->kc_host + slot * TRAIN_KC_STRIDE))
      return train_fail(err, err_len, "the optimizer's constants: %s", hq_last_error());
  }
  return 0;
}

int train_model_update_dev(train_model *m, const train_adam_cfg *a, char *err, size_t err_len) {
  if (train_dist_grads(m, err, err_len)) return -1;
  const int dev = hq_ctx_device(m->ctx);
  /* the step's constants into the slots, queued ahead of the kernels that read them (in a
     graph, a copy node that reads the host buffer at every replay), unless the step's upload
     brought them */
  if (m->kc_dev && !consts_mapped(m) &&
      hq_ctx_memcpy(m->ctx, m->kc_dev, dev, m->kc_host, HQ_DEVICE_HOST, 2 * TRAIN_KC_STRIDE))
    return train_fail(err, err_len, "the optimizer's constants: %s", hq_last_error());
  /* the weights first, the embedding and the biases after them: each weight's write-back on the
     side lane then starts as early as it can and runs beside the main stream's later steps, where
     behind them it ended the step after the main stream (each parameter's step is independent of
     the others', so the order changes no bit) */
  hq_adam adam;
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    /* the weight: AdamW on the FP32 master, then every direction the quantized weight holds
       written back from it (the bytes of a fresh quantize of the new master) */
    hq_qtensor *qw = m->cfg.dist || m->direct ? NULL : l->qw;
    /* with a side lane the write-back runs there (hq_qtensor_update: the bytes of the same
       step's write-back), beside the main stream's next parameters */
    const int side_wb = qw && m->side && l->wb_side;
    /* the side lane's write-back takes the new master's amax from the step's kernel, as
       hq_adam_step's own write-back does, where its directions take one (amax_fusable) */
    const int wb_amax = side_wb && m->aslot && amax_fusable(l->q_w);
    adam = adam_of(m, a, TRAIN_KC_DECAY);
    if (m->aslot && (!side_wb || wb_amax)) { /* the weight's own slot, zeroed by the forward */
      adam.amax_dev = m->aslot + 2 * i;
      adam.flags = HQ_ADAM_AMAX_ZEROED;
    }
    hq_tensor gw = f32(m, l->gws ? l->gws : l->gw, l->rows, l->in);
    if (!m->cfg.dist) train_prof_quantized(m->prof, TRAIN_QT_WRITEBACK, 1);
    if (PROF(m, TRAIN_PH_OPTIMIZER, hq_adam_step(m->ctx, &adam, &gw, l->w, l->mw, l->vw,
                                                 side_wb ? NULL : qw)))
      return hq_fail(err, err_len, l, "Adam and the quantized weight's write-back");
    if (side_wb) {
      hq_tensor wt = f32(m, l->w, l->rows, l->in);
      const hq_quantize_args wa = {.struct_size = sizeof wa, .amax = adam.amax_dev};
      if (side_order(m, 1, l, "the weight's write-back", err, err_len)) return -1;
      if (hq_qtensor_update_ex(qw, m->side, &wt, wb_amax ? &wa : NULL))
        return hq_fail(err, err_len, l, "the quantized weight's write-back");
    }
    /* bf16-direct: the weight's BF16 copy from the new master, in the optimizer's phase as the
       write-back above is */
    if (m->direct && PROF(m, TRAIN_PH_OPTIMIZER, train_direct_weight(m->direct, i, l->w)))
      return train_fail(err, err_len, "layer %s: %s", l->name, train_direct_error(m->direct));
    /* across ranks: the shard quantized with the shared amax, then gathered into qw */
    if (m->cfg.dist && train_dist_weight(m, l, 0, err, err_len)) return -1;
  }
  adam = adam_of(m, a, TRAIN_KC_PLAIN);
  hq_tensor g = hq_tensor_2d(m->gemb, HQ_F32, dev, TRAIN_VOCAB, m->cfg.embed);
  if (PROF(m, TRAIN_PH_OPTIMIZER, hq_adam_step(m->ctx, &adam, &g, m->emb, m->memb, m->vemb, NULL)))
    return train_fail(err, err_len, "Adam (embedding): %s", hq_last_error());
  for (int i = 0; i < m->n_lin; i++) {
    train_linear *l = &m->lin[i];
    hq_tensor gb = f32(m, l->gb, 1, l->out);
    if (PROF(m, TRAIN_PH_OPTIMIZER, hq_adam_step(m->ctx, &adam, &gb, l->b, l->mb, l->vb, NULL)))
      return hq_fail(err, err_len, l, "Adam (bias)");
  }
  /* the next forward reads the weights the side lane wrote back, the scaling state's update
     their amaxes */
  if (m->side_queued && side_order(m, 0, NULL, "the optimizer's end", err, err_len)) return -1;
  if (m->state && PROF(m, TRAIN_PH_STATE, train_dist_state_update(m->cfg.dist, m->state, m->ctx)))
    return train_fail(err, err_len, "updating the scaling state: %s", hq_last_error());
  return 0;
}

int train_model_update(train_model *m, const train_adam_cfg *a, float lr, char *err,
                       size_t err_len) {
  return train_model_update_begin(m, a, lr, err, err_len) ||
                 train_model_update_dev(m, a, err, err_len)
             ? -1
             : 0;
}

int train_model_eval_begin(train_model *m, char *err, size_t err_len) {
  float *amax;
  size_t n;
  if (!m->state) return 0;   /* bf16-direct: nothing an evaluation could change */
  if (hq_state_amaxes(m->state, &amax, &n))
    return train_fail(err, err_len, "the scaling state's amaxes: %s", hq_last_error());
  if (n > m->n_amax_stash) {
    float *p = realloc(m->amax_stash, n * sizeof *p);
    if (!p) return train_fail(err, err_len, "out of memory");
    m->amax_stash = p;
  }
  m->n_amax_stash = n;
  if (n && hq_ctx_memcpy(m->ctx, m->amax_stash, HQ_DEVICE_HOST, amax, hq_ctx_device(m->ctx),
                         n * sizeof *amax))
    return train_fail(err, err_len, "the scaling state's amaxes: %s", hq_last_error());
  return 0;
}

int train_model_eval_end(train_model *m, char *err, size_t err_len) {
  float *amax;
  size_t n;
  if (!m->state) return 0;
  if (hq_state_amaxes(m->state, &amax, &n))
    return train_fail(err, err_len, "the scaling state's amaxes: %s", hq_last_error());
  if (n != m->n_amax_stash)
    return train_fail(err, err_len, "the scaling state changed size during an evaluation");
  if (n && hq_ctx_memcpy(m->ctx, amax, hq_ctx_device(m->ctx), m->amax_stash, HQ_DEVICE_HOST,
                         n * sizeof *amax))
    return train_fail(err, err_len, "the scaling state's amaxes: %s", hq_last_error());
  return 0;
}
