/*
** checkpoint.c -- save and resume a run of `hq train` through libhqtrain's safetensors
** checkpoints (hq_ckpt_*, hq/train.h): everything the next step reads, so that a resumed run
** continues bit-identically.
**
**   embedding, embedding.adam_m, embedding.adam_v           F32 [27, E]
**   NAME.weight                                              the quantized weight: every
**                                                            direction, every buffer (NAME/hq
**                                                            holds its formats and options)
**   NAME.weight.master, NAME.weight.adam_m, .adam_v          F32 [out, in]
**   NAME.bias, NAME.bias.adam_m, NAME.bias.adam_v            F32 [1, out]
**   scaling_state                                            F32 [1, n]: hq_state_data (delayed
**                                                            scaling's amax histories and scales;
**                                                            absent when the recipe has none)
**   loss_curve                                               F32 [1, step]: every step's loss
** and metadata (strings): hq_train (this layout's version), step, steps, seed, rng_offset (the
** context's random stream: stochastic rounding), data_rng (the data order's generator), recipe,
** recipe_file, recipe_spec (the recipe's formats with resolved options and its role sections),
** model.* (the shape), lr, data, train_examples, eval_curve.
**
** Every tensor is whole, whatever the count of ranks (dist.h): across ranks rank 0 gathers the
** sharded masters and moments and writes the file alone; on a resume every rank reads the file
** (one machine, or a filesystem every rank sees) and keeps its rows. A file written by N ranks
** resumes with any other count.
*/
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define CKPT_LAYOUT "1"

static int meta(hq_ckpt_writer *w, const char *key, const char *fmt, ...) HQ_PRINTF(3, 4);
static int meta(hq_ckpt_writer *w, const char *key, const char *fmt, ...) {
  char v[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  return hq_ckpt_add_meta(w, key, v);
}

static const char *act_name(int act) { return act == TRAIN_ACT_TANH ? "tanh" : "gelu"; }
/* the weight gradients' reduce dtype as --grad-dtype spells it */
static const char *grad_dtype_name(const train_model *m) {
  return m->cfg.grad_bf16 ? "bf16" : "fp32";
}

/* The recipe as it resolves: its formats (plugin, every option with defaults resolved) and its
   role sections, one per line -- insensitive to comments and layout, sensitive to anything that
   changes a quantization. Returns a malloc'd string or NULL. */
char *train_recipe_spec(hq_recipe *r) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  for (size_t i = 0; i < hq_recipe_format_count(r); i++) {
    hq_format_info fi = {.struct_size = sizeof fi};
    if (hq_recipe_format_info(r, i, &fi)) continue;
    fprintf(f, "format %s plugin=%s", fi.name, fi.plugin);
    for (size_t k = 0; k < fi.n_options; k++)
      fprintf(f, " %s=%s", fi.option_names[k], fi.option_values[k]);
    fputc('\n', f);
  }
  for (size_t i = 0; i < hq_recipe_role_count(r); i++) {
    hq_role_info ri = {.struct_size = sizeof ri};
    if (hq_recipe_role_info(r, i, &ri)) continue;
    fprintf(f, "role %s rowwise=%s columnwise=%s source=%s\n", ri.pattern, ri.rowwise,
            ri.columnwise,
            ri.columnwise_source == HQ_SOURCE_ROWWISE_DEQUANTIZED ? "rowwise_dequantized"
                                                                  : "original");
  }
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* The plain tensors of the model, in file order: name, pointer, rows, cols. The file holds every
   tensor whole; across ranks (dist.h) a weight's master and moments are sharded: p holds rows
   [r0, r0 + held) of them (one process: all of them). full: a host copy of the whole tensor
   (across ranks, rank 0's, gathered for the save), written instead of p. */
typedef struct plain {
  char name[40];
  float *p;
  int64_t rows, cols;
  int64_t r0, held;
  int sharded;                               /* a weight's master or moment */
  float *full;
} plain;

static int plain_list(const train_model *m, plain **out) {
  const int n = 3 + 6 * m->n_lin;
  plain *v = calloc((size_t)n, sizeof *v);
  if (!v) return -1;
  int k = 0;
  const int64_t E = m->cfg.embed;
  v[k++] = (plain){"embedding", m->emb, TRAIN_VOCAB, E, 0, TRAIN_VOCAB, 0, NULL};
  v[k++] = (plain){"embedding.adam_m", m->memb, TRAIN_VOCAB, E, 0, TRAIN_VOCAB, 0, NULL};
  v[k++] = (plain){"embedding.adam_v", m->vemb, TRAIN_VOCAB, E, 0, TRAIN_VOCAB, 0, NULL};
  for (int i = 0; i < m->n_lin; i++) {
    const train_linear *l = &m->lin[i];
    struct {
      const char *suffix;
      float *p;
      int64_t rows, cols;
    } t[6] = {{"weight.master", l->w, l->out, l->in}, {"weight.adam_m", l->mw, l->out, l->in},
              {"weight.adam_v", l->vw, l->out, l->in}, {"bias", l->b, 1, l->out},
              {"bias.adam_m", l->mb, 1, l->out},       {"bias.adam_v", l->vb, 1, l->out}};
    for (int j = 0; j < 6; j++) {
      snprintf(v[k].name, sizeof v[k].name, "%s.%s", l->name, t[j].suffix);
      v[k].p = t[j].p;
      v[k].rows = t[j].rows;
      v[k].cols = t[j].cols;
      v[k].r0 = j < 3 ? l->r0 : 0;   /* the weight's rows are sharded, the bias is whole */
      v[k].held = j < 3 ? l->rows : t[j].rows;
      v[k].sharded = j < 3;
      k++;
    }
  }
  *out = v;
  return n;
}

/* The file, from the tensors in pl (the model's, or host copies of whole tensors). */
static int write_file(const train_model *m, const plain *pl, hq_recipe *recipe,
                      const train_config *cfg, const train_data *d, uint64_t data_rng,
                      const train_result *res, const char *path, char *err, size_t err_len) {
  hq_ckpt_writer *w = NULL;
  char *spec = NULL, *curve_txt = NULL;
  float *curve = NULL;
  const int dev = hq_ctx_device(m->ctx);
  if (hq_ckpt_writer_open(path, &w)) return train_fail(err, err_len, "%s", hq_last_error());
  int rc = 0;
  int k = 0;
  for (; !rc && k < 3; k++) {   /* the embedding first, then each layer: quantized weight,
                                   master, moments, bias */
    hq_tensor t = hq_tensor_2d(pl[k].full ? pl[k].full : pl[k].p, HQ_F32,
                               pl[k].full ? HQ_DEVICE_HOST : dev, pl[k].rows, pl[k].cols);
    rc = hq_ckpt_add_tensor(w, m->ctx, pl[k].name, &t);
  }
  for (int i = 0; !rc && i < m->n_lin; i++) {
    char name[40];
    snprintf(name, sizeof name, "%s.weight", m->lin[i].name);
    rc = hq_ckpt_add_qtensor(w, m->ctx, name, m->lin[i].qw);
    for (int j = 0; !rc && j < 6; j++, k++) {
      hq_tensor t = hq_tensor_2d(pl[k].full ? pl[k].full : pl[k].p, HQ_F32,
                                 pl[k].full ? HQ_DEVICE_HOST : dev, pl[k].rows, pl[k].cols);
      rc = hq_ckpt_add_tensor(w, m->ctx, pl[k].name, &t);
    }
  }
  float *sdata = NULL;
  size_t sn = 0;
  if (!rc) rc = hq_state_data(m->state, &sdata, &sn);
  if (!rc && sn > 0) {
    hq_tensor t = hq_tensor_2d(sdata, HQ_F32, dev, 1, (int64_t)sn);
    rc = hq_ckpt_add_tensor(w, m->ctx, "scaling_state", &t);
  }
  if (!rc && res->n_train_curve > 0) {
    curve = malloc((size_t)res->n_train_curve * sizeof *curve);
    if (!curve) {
      hq_ckpt_writer_abort(w);
      return train_fail(err, err_len, "checkpoint %s: out of memory", path);
    }
    for (int64_t s = 0; s < res->n_train_curve; s++) curve[s] = (float)res->train_curve[s].loss;
    /* a host tensor: the trainer's context is the host's (a CUDA trainer passes a host context
       for this one) */
    hq_tensor t = hq_tensor_2d(curve, HQ_F32, HQ_DEVICE_HOST, 1, res->n_train_curve);
    rc = hq_ckpt_add_tensor(w, m->ctx, "loss_curve", &t);
  }
  /* metadata */
  const char *rname = hq_recipe_name(recipe), *rpath = hq_recipe_path(recipe);
  spec = train_recipe_spec(recipe);
  {
    size_t cap = 32 + (size_t)res->n_eval_curve * 48, len = 0;
    curve_txt = malloc(cap);
    if (curve_txt) {
      curve_txt[0] = '\0';
      for (int64_t s = 0; s < res->n_eval_curve; s++)
        len += (size_t)snprintf(curve_txt + len, cap - len, "%s%lld:%.17g", s ? "," : "",
                                (long long)res->eval_curve[s].step, res->eval_curve[s].loss);
    }
  }
  if (!rc && (!spec || !curve_txt)) {
    hq_ckpt_writer_abort(w);
    free(curve);
    free(spec);
    free(curve_txt);
    return train_fail(err, err_len, "checkpoint %s: out of memory", path);
  }
  if (!rc) rc = hq_ckpt_add_meta(w, "hq_train", CKPT_LAYOUT);
  if (!rc) rc = meta(w, "step", "%lld", (long long)m->step);
  if (!rc) rc = meta(w, "steps", "%lld", (long long)cfg->steps);
  if (!rc) rc = meta(w, "seed", "%" PRIu64, cfg->seed);
  if (!rc) rc = meta(w, "rng_offset", "%" PRIu64, hq_ctx_rng_offset(m->ctx));
  if (!rc) rc = meta(w, "data_rng", "%" PRIu64, data_rng);
  if (!rc) rc = hq_ckpt_add_meta(w, "recipe", rname ? rname : "");
  if (!rc) rc = hq_ckpt_add_meta(w, "recipe_file", rpath ? rpath : "");
  if (!rc) rc = hq_ckpt_add_meta(w, "recipe_spec", spec);
  if (!rc) rc = meta(w, "model.context", "%d", m->cfg.context);
  if (!rc) rc = meta(w, "model.embed", "%d", m->cfg.embed);
  if (!rc) rc = meta(w, "model.hidden", "%d", m->cfg.hidden);
  if (!rc) rc = meta(w, "model.layers", "%d", m->cfg.layers);
  if (!rc) rc = meta(w, "model.act", "%s", act_name(m->cfg.act));
  /* the global batch: across ranks, m's is this rank's part of it */
  if (!rc) rc = meta(w, "model.batch", "%lld", (long long)cfg->model.batch);
  if (!rc) rc = meta(w, "model.vocab_pad", "%d", m->cfg.vocab_pad);
  if (!rc) rc = meta(w, "lr", "%.9g", (double)cfg->lr);
  /* the dtype the weight gradients are summed across ranks in (one process: FP32 throughout) */
  if (!rc) rc = hq_ckpt_add_meta(w, "grad_dtype", grad_dtype_name(m));
  if (!rc) rc = meta(w, "train_examples", "%lld", (long long)d->n_train);
  if (!rc) rc = meta(w, "eval_examples", "%lld", (long long)d->n_eval);
  if (!rc) rc = hq_ckpt_add_meta(w, "eval_curve", curve_txt);
  free(curve);
  free(spec);
  free(curve_txt);
  if (rc) {
    train_fail(err, err_len, "%s", hq_last_error());
    hq_ckpt_writer_abort(w);
    return -1;
  }
  if (hq_ckpt_writer_close(w)) return train_fail(err, err_len, "%s", hq_last_error());
  return 0;
}

int train_checkpoint_save(const train_model *m, hq_recipe *recipe, const train_config *cfg,
                          const train_data *d, uint64_t data_rng, const train_result *res,
                          const char *path, char *err, size_t err_len) {
  train_dist *dd = m->cfg.dist;
  plain *pl = NULL;
  const int n_pl = plain_list(m, &pl);
  if (!dd) {
    if (n_pl < 0) return train_fail(err, err_len, "checkpoint %s: out of memory", path);
    const int rc = write_file(m, pl, recipe, cfg, d, data_rng, res, path, err, err_len);
    free(pl);
    return rc;
  }
  /* across ranks: every sharded tensor gathered whole into rank 0's host memory, then rank 0
     writes the file alone (through the same safe save), in the layout one process writes; the
     rest (embedding, biases, quantized weights, scaling state, curves) is the same on every
     rank */
  const int rank = train_dist_rank(dd);
  int ok = n_pl >= 0;
  if (!ok) train_fail(err, err_len, "checkpoint %s: out of memory", path);
  for (int k = 0; ok && rank == 0 && k < n_pl; k++) {
    if (!pl[k].sharded) continue;   /* a whole tensor: the same on every rank */
    if (!(pl[k].full = malloc((size_t)(pl[k].rows * pl[k].cols) * sizeof(float)))) {
      ok = 0;
      train_fail(err, err_len, "checkpoint %s: out of memory for the gathered %s", path,
                 pl[k].name);
    }
  }
  if (!train_dist_all_ok(dd, ok)) {
    if (ok)
      train_fail(err, err_len,
                 "checkpoint %s: another rank ran out of memory (its message says "
                 "which)",
                 path);
    ok = 0;
    goto out;
  }
  /* every rank sees the same shapes, so every rank makes the same gathers in the same order */
  for (int k = 0; k < n_pl; k++) {
    if (!pl[k].sharded) continue;
    char e[512];
    if (train_dist_gather_rows(m, pl[k].p, pl[k].held, pl[k].rows, pl[k].cols,
                               pl[k].full, e, sizeof e) && ok) {
      ok = 0;
      train_fail(err, err_len, "checkpoint %s: gathering %s: %s", path, pl[k].name, e);
    }
  }
  if (ok && rank == 0 &&
      write_file(m, pl, recipe, cfg, d, data_rng, res, path, err, err_len))
    ok = 0;
  if (!train_dist_all_ok(dd, ok) && ok)
    train_fail(err, err_len,
               "checkpoint %s: rank 0 could not write it, or another rank could not send "
               "its rows (that rank's message says why)",
               path);
out:
  for (int k = 0; pl && k < n_pl; k++) free(pl[k].full);
  free(pl);
  return ok ? 0 : -1;
}

/* A metadata value that must be present. */
static const char *need(hq_ckpt *c, const char *path, const char *key, char *err, size_t n) {
  const char *v = hq_ckpt_meta(c, key);
  if (!v) train_fail(err, n, "--resume %s: no '%s' in the checkpoint's metadata", path, key);
  return v;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!*s || *end || errno || *s == '-') return -1;
  *out = v;
  return 0;
}

/* The first line where two specs differ, into a and b (each "(none)" when one ends first). */
static void first_diff(const char *x, const char *y, char *a, size_t na, char *b, size_t nb) {
  for (;;) {
    const char *ex = strchr(x, '\n'), *ey = strchr(y, '\n');
    size_t lx = ex ? (size_t)(ex - x) : strlen(x), ly = ey ? (size_t)(ey - y) : strlen(y);
    if (lx != ly || memcmp(x, y, lx) != 0 || !ex || !ey) {
      snprintf(a, na, "%.*s", (int)lx, lx ? x : "(none)");
      snprintf(b, nb, "%.*s", (int)ly, ly ? y : "(none)");
      if (!lx) snprintf(a, na, "(none)");
      if (!ly) snprintf(b, nb, "(none)");
      return;
    }
    x = ex + 1;
    y = ey + 1;
  }
}

int train_checkpoint_load(train_model *m, hq_recipe *recipe, const train_config *cfg,
                          const train_data *d, const char *path, uint64_t *data_rng,
                          train_result *res, char *err, size_t err_len) {
  hq_ckpt *c = NULL;
  plain *pl = NULL;
  char *spec = NULL;
  float *curve = NULL;
  int rc = -1;
  const int dev = hq_ctx_device(m->ctx);
  /* --no-verify only for the file the user named (the mid-run file of --verify-resume is ours) */
  hq_ckpt_open_opts oo = {.struct_size = sizeof oo,
                          .flags = cfg->resume_no_verify && cfg->resume_path &&
                                           strcmp(path, cfg->resume_path) == 0
                                       ? HQ_CKPT_NO_VERIFY
                                       : 0};
  if (hq_ckpt_open_ex(path, &oo, &c)) {
    train_fail(err, err_len, "--resume: %s", hq_last_error());
    goto out;
  }
  const char *v;
  if (!hq_ckpt_meta(c, "hq_train")) {
    train_fail(err, err_len, "--resume %s: not a checkpoint of hq train (no 'hq_train' metadata)",
               path);
    goto out;
  }
  if (strcmp(hq_ckpt_meta(c, "hq_train"), CKPT_LAYOUT) != 0) {
    train_fail(err, err_len, "--resume %s: checkpoint layout %s, this hq train reads %s", path,
               hq_ckpt_meta(c, "hq_train"), CKPT_LAYOUT);
    goto out;
  }
  /* the recipe */
  const char *rname = hq_recipe_name(recipe), *rpath = hq_recipe_path(recipe);
  if (!rname) rname = "";
  if (!rpath) rpath = "";
  if (!(v = need(c, path, "recipe", err, err_len))) goto out;
  const char *cfile = hq_ckpt_meta(c, "recipe_file");
  if (strcmp(v, rname) != 0) {
    train_fail(
        err, err_len,
        "--resume %s: the checkpoint was written with recipe '%s' (%s); this run's recipe is "
        "'%s' (%s)",
        path, v, cfile ? cfile : "?", rname, rpath);
    goto out;
  }
  if (!(v = need(c, path, "recipe_spec", err, err_len))) goto out;
  spec = train_recipe_spec(recipe);
  if (!spec) {
    train_fail(err, err_len, "out of memory");
    goto out;
  }
  if (strcmp(v, spec) != 0) {
    char a[512], b[512];
    first_diff(v, spec, a, sizeof a, b, sizeof b);
    train_fail(err, err_len,
               "--resume %s: recipe '%s' (%s) differs from the one the checkpoint was written with "
               "(%s): checkpoint '%s', this recipe '%s'",
               path, rname, rpath, cfile ? cfile : "?", a, b);
    goto out;
  }
  /* the shape and the run */
  struct {
    const char *key, *opt;
    long long want;
  } ints[] = {{"model.context", "--context", m->cfg.context},
              {"model.embed", "--embed", m->cfg.embed},
              {"model.hidden", "--hidden", m->cfg.hidden},
              {"model.layers", "--layers", m->cfg.layers},
              {"model.batch", "--batch", (long long)cfg->model.batch},
              {"model.vocab_pad", "(the padded vocabulary)", m->cfg.vocab_pad},
              {"seed", "--seed", (long long)cfg->seed},
              {"train_examples", "--data (training examples)", (long long)d->n_train},
              {"eval_examples", "--data (held-out examples)", (long long)d->n_eval}};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    uint64_t got;
    if (!(v = need(c, path, ints[i].key, err, err_len))) goto out;
    if (parse_u64(v, &got)) {
      train_fail(err, err_len, "--resume %s: metadata '%s' = '%s' is not a count", path,
                 ints[i].key, v);
      goto out;
    }
    if ((long long)got != ints[i].want) {
      train_fail(err, err_len,
                 "--resume %s: %s differs: the checkpoint has %s = %s, this run %lld (%s)", path,
                 ints[i].key, ints[i].key, v, ints[i].want, ints[i].opt);
      goto out;
    }
  }
  if (!(v = need(c, path, "model.act", err, err_len))) goto out;
  if (strcmp(v, act_name(m->cfg.act)) != 0) {
    train_fail(
        err, err_len,
        "--resume %s: model.act differs: the checkpoint has model.act = %s, this run %s (--act)",
        path, v, act_name(m->cfg.act));
    goto out;
  }
  /* a resume continues the saved run's learning rate (the schedule's peak), never another */
  if (!(v = need(c, path, "lr", err, err_len))) goto out;
  char *end;
  const float lr = strtof(v, &end);
  if (!*v || *end || !(lr > 0)) {
    train_fail(err, err_len, "--resume %s: metadata 'lr' = '%s' is not a learning rate", path, v);
    goto out;
  }
  if (lr != cfg->lr) {
    train_fail(err, err_len, "--resume %s: lr differs: the checkpoint has lr = %s, this run %.9g "
               "(--lr)", path, v, (double)cfg->lr);
    goto out;
  }
  /* The reduce's dtype changes the numbers a step computes (BF16 sums round), so a resume that
     reduces gradients continues only in the checkpoint's dtype; one process reduces nothing.
     A checkpoint from before grad_dtype was recorded says nothing and is not checked. */
  if ((v = hq_ckpt_meta(c, "grad_dtype")) && m->cfg.dist && strcmp(v, grad_dtype_name(m)) != 0) {
    train_fail(
        err, err_len,
        "--resume %s: the checkpoint's weight gradients were reduced across ranks in %s, this "
        "run's in %s: another reduce dtype is another training; give --grad-dtype %s to "
        "continue it",
        path, v, grad_dtype_name(m), v);
    goto out;
  }
  uint64_t step, rng_off, drng;
  if (!(v = need(c, path, "step", err, err_len))) goto out;
  if (parse_u64(v, &step) || step < 1) {
    train_fail(err, err_len, "--resume %s: metadata 'step' = '%s' is not a step", path, v);
    goto out;
  }
  if ((int64_t)step >= cfg->steps) {
    train_fail(
        err, err_len,
        "--resume %s: the checkpoint is at step %llu: --steps %lld leaves nothing to train (give "
        "more steps)",
        path, (unsigned long long)step, (long long)cfg->steps);
    goto out;
  }
  if (!(v = need(c, path, "rng_offset", err, err_len))) goto out;
  if (parse_u64(v, &rng_off)) {
    train_fail(err, err_len, "--resume %s: metadata 'rng_offset' = '%s' is not a count", path, v);
    goto out;
  }
  if (!(v = need(c, path, "data_rng", err, err_len))) goto out;
  if (parse_u64(v, &drng)) {
    train_fail(err, err_len, "--resume %s: metadata 'data_rng' = '%s' is not a count", path, v);
    goto out;
  }

  /* the tensors: every check of libhqcore is made before a tensor is written */
  const int n_pl = plain_list(m, &pl);
  if (n_pl < 0) {
    train_fail(err, err_len, "out of memory");
    goto out;
  }
  for (int k = 0; k < n_pl; k++) {
    if (pl[k].held == pl[k].rows) {
      hq_tensor t = hq_tensor_2d(pl[k].p, HQ_F32, dev, pl[k].rows, pl[k].cols);
      if (hq_ckpt_load_tensor(c, m->ctx, pl[k].name, &t)) {
        train_fail(err, err_len, "--resume: %s", hq_last_error());
        goto out;
      }
      continue;
    }
    /* across ranks: the whole tensor read on the host, this rank's rows kept (the file does not
       depend on the count of ranks that wrote it) */
    const size_t fs = sizeof(float);
    float *h = malloc((size_t)(pl[k].rows * pl[k].cols) * fs);
    if (!h) {
      train_fail(err, err_len, "--resume %s: out of memory for %s", path, pl[k].name);
      goto out;
    }
    hq_tensor t = hq_tensor_2d(h, HQ_F32, HQ_DEVICE_HOST, pl[k].rows, pl[k].cols);
    int bad = hq_ckpt_load_tensor(c, m->ctx, pl[k].name, &t) ||
              (pl[k].held > 0 &&
               hq_ctx_memcpy(m->ctx, pl[k].p, dev, h + pl[k].r0 * pl[k].cols, HQ_DEVICE_HOST,
                             (size_t)(pl[k].held * pl[k].cols) * fs));
    free(h);
    if (bad) {
      train_fail(err, err_len, "--resume: %s", hq_last_error());
      goto out;
    }
  }
  for (int i = 0; i < m->n_lin; i++) {
    char name[40];
    snprintf(name, sizeof name, "%s.weight", m->lin[i].name);
    if (hq_ckpt_load_qtensor(c, m->ctx, name, m->lin[i].qw)) {
      train_fail(err, err_len, "--resume: %s", hq_last_error());
      goto out;
    }
  }
  float *sdata;
  size_t sn;
  if (hq_state_data(m->state, &sdata, &sn)) {
    train_fail(err, err_len, "--resume %s: the scaling state: %s", path, hq_last_error());
    goto out;
  }
  if (sn > 0) {   /* the state is written back through the buffer hq_state_data hands out (memory
                     of the state's device), as hq.h documents */
    hq_tensor t = hq_tensor_2d(sdata, HQ_F32, dev, 1, (int64_t)sn);
    if (hq_ckpt_load_tensor(c, m->ctx, "scaling_state", &t)) {
      train_fail(err, err_len, "--resume: the scaling state (%zu floats for this recipe): %s", sn,
                 hq_last_error());
      goto out;
    }
  }
  /* the loss curve of the steps before */
  curve = malloc((size_t)step * sizeof *curve);
  if (!curve) {
    train_fail(err, err_len, "out of memory");
    goto out;
  }
  {
    hq_tensor t = hq_tensor_2d(curve, HQ_F32, HQ_DEVICE_HOST, 1, (int64_t)step);
    if (hq_ckpt_load_tensor(c, m->ctx, "loss_curve", &t)) {
      train_fail(err, err_len, "--resume: %s", hq_last_error());
      goto out;
    }
  }
  for (uint64_t s = 0; s < step; s++) res->train_curve[s] = (train_point){(int64_t)s, curve[s]};
  res->n_train_curve = (int64_t)step;
  res->step0_loss = curve[0];
  if ((v = hq_ckpt_meta(c, "eval_curve")) && *v) {
    int64_t n = 1;
    for (const char *p = v; *p; p++) n += *p == ',';
    train_point *e = realloc(res->eval_curve, (size_t)(n + res->cap_eval_curve) * sizeof *e);
    if (!e) {
      train_fail(err, err_len, "out of memory");
      goto out;
    }
    res->eval_curve = e;
    res->cap_eval_curve += n;
    res->n_eval_curve = 0;
    const char *p = v;
    while (*p) {
      char *end;
      long long s = strtoll(p, &end, 10);
      if (*end != ':') break;
      double l = strtod(end + 1, &end);
      res->eval_curve[res->n_eval_curve++] = (train_point){s, l};
      if (*end != ',') break;
      p = end + 1;
    }
  }
  if (hq_ctx_set_rng_offset(m->ctx, rng_off)) {
    train_fail(err, err_len, "--resume %s: the random stream: %s", path, hq_last_error());
    goto out;
  }
  *data_rng = drng;
  m->step = (int64_t)step;
  rc = 0;
out:
  free(pl);
  free(spec);
  free(curve);
  hq_ckpt_close(c);
  /* across ranks every rank reads the file: all of them go on, or none (a rank that went on
     alone would wait in the first step's collectives for the others) */
  if (!train_dist_all_ok(m->cfg.dist, rc == 0) && rc == 0) {
    rc = train_fail(err, err_len,
                    "--resume %s: another rank could not load the checkpoint (its "
                    "message says why)",
                    path);
  }
  return rc;
}
