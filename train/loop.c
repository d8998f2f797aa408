/*
** loop.c -- one training run of `hq train`: a model built for one recipe, trained for a fixed
** number of steps from the run's seed (the same data order and initial weights for every recipe),
** Adam with linear warmup and cosine decay, a progress report every few steps, a periodic
** held-out eval and a final one over the whole held-out set.
**
** Seams for later work: the model's state (masters, moments, quantized weights, step) is all in
** train_model, so a checkpoint saves and reloads it between two steps; the step below is
** forward / backward / update, so offload or recompute slot in around train_model_backward.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  const int64_t B = m->cfg.batch;
  if (train_model_eval_begin(m, err, err_len)) return -1;
  int64_t total = d->n_eval;
  if (batches > 0 && batches * B < total) total = batches * B;
  double sum = 0;
  for (int64_t first = 0; first < total; first += B) {
    int64_t n = train_data_eval_batch(d, first, B, x, y);
    if (first + n > total) n = total - first;
    double loss;
    if (train_model_forward(m, x, y, n, 0, &loss, err, err_len)) return -1;
    sum += loss * (double)n;
  }
  *out = sum / (double)total;
  return train_model_eval_end(m, err, err_len);
}

int train_run(const train_config *cfg, const train_data *data, hq_recipe *recipe,
              const char *recipe_name, train_progress_fn progress, void *user,
              train_result *res, char *err, size_t err_len) {
  const double t_start = train_now();
  memset(res, 0, sizeof *res);
  snprintf(res->recipe, sizeof res->recipe, "%s", recipe_name);
  const char *path = hq_recipe_path(recipe);
  snprintf(res->path, sizeof res->path, "%s", path ? path : "");
  char e[1024] = "";
  int64_t step = 0;
  int rc = -1;

  hq_ctx *ctx = NULL;
  hq_ctx_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.device = cfg->device;
  desc.seed = cfg->seed;   /* stochastic rounding draws from (seed, offset): same for every run */
  train_model m;
  memset(&m, 0, sizeof m);
  const int64_t B = cfg->model.batch, C = cfg->model.context;
  int32_t *x = malloc((size_t)(B * C) * sizeof *x), *y = malloc((size_t)B * sizeof *y);
  res->train_curve = calloc((size_t)cfg->steps, sizeof *res->train_curve);
  const int64_t n_evals = (cfg->eval_every > 0 ? cfg->steps / cfg->eval_every : 0) + 3;
  res->eval_curve = calloc((size_t)n_evals, sizeof *res->eval_curve);
  if (!x || !y || !res->train_curve || !res->eval_curve) {
    snprintf(e, sizeof e, "out of memory");
    goto out;
  }
  if (hq_ctx_create(&desc, &ctx)) {
    snprintf(e, sizeof e, "creating the context: %s", hq_last_error());
    goto out;
  }
  if (train_model_create(&m, &cfg->model, recipe, ctx, cfg->seed, e, sizeof e)) goto out;
  res->n_params = m.n_params;

  if (cfg->eval_every > 0) {   /* the starting point of the eval curve */
    double l0;
    if (evaluate(&m, data, cfg->eval_batches, x, y, &l0, e, sizeof e)) goto out;
    res->eval_curve[res->n_eval_curve++] = (train_point){0, l0};
  }
  uint64_t rng = train_rng_stream(cfg->seed, 3);   /* the data order */
  double interval_sum = 0, last_interval = NAN;
  int64_t interval_n = 0;
  for (step = 0; step < cfg->steps; step++) {
    train_data_sample(data, &rng, B, x, y);
    const double t0 = train_now();
    double loss;
    if (train_model_forward(&m, x, y, B, 1, &loss, e, sizeof e)) goto out;
    if (!isfinite(loss)) {
      snprintf(e, sizeof e, "the train loss is %s (lr %.3g)", isnan(loss) ? "NaN" : "infinite",
               (double)schedule(cfg, step));
      goto out;
    }
    if (train_model_backward(&m, e, sizeof e) ||
        train_model_update(&m, &cfg->adam, schedule(cfg, step), e, sizeof e))
      goto out;
    res->train_s += train_now() - t0;
    res->tokens += B;
    res->train_curve[res->n_train_curve++] = (train_point){step, loss};
    if (step == 0) res->step0_loss = loss;
    interval_sum += loss;
    interval_n++;

    const int64_t done = step + 1;
    double eval_loss = NAN;
    if (cfg->eval_every > 0 && done % cfg->eval_every == 0 && done < cfg->steps) {
      if (evaluate(&m, data, cfg->eval_batches, x, y, &eval_loss, e, sizeof e)) goto out;
      res->eval_curve[res->n_eval_curve++] = (train_point){done, eval_loss};
    }
    if (done % cfg->log_every == 0 || done == cfg->steps || !isnan(eval_loss)) {
      last_interval = interval_sum / (double)interval_n;
      if (progress) {
        train_progress p = {recipe_name, done, cfg->steps, last_interval, eval_loss,
                            (double)res->tokens / res->train_s, train_now() - t_start};
        progress(user, &p);
      }
      interval_sum = 0;
      interval_n = 0;
    }
  }
  res->train_loss = last_interval;
  if (evaluate(&m, data, 0, x, y, &res->eval_loss, e, sizeof e)) goto out;
  res->eval_curve[res->n_eval_curve++] = (train_point){cfg->steps, res->eval_loss};
  if (!isfinite(res->eval_loss)) {
    snprintf(e, sizeof e, "the held-out loss is %s", isnan(res->eval_loss) ? "NaN" : "infinite");
    goto out;
  }
  res->tokens_per_s = (double)res->tokens / res->train_s;
  res->n_layers = m.n_lin;
  for (int i = 0; i < m.n_lin; i++) {
    snprintf(res->layer_name[i], sizeof res->layer_name[i], "%s", m.lin[i].name);
    memcpy(res->layer_info[i], m.lin[i].info, sizeof m.lin[i].info);
  }
  rc = 0;
out:
  if (rc)
    snprintf(err, err_len, "recipe '%s'%s%s%s, step %lld: %s", recipe_name,
             res->path[0] ? " (" : "", res->path, res->path[0] ? ")" : "", (long long)step, e);
  train_model_free(&m);
  if (ctx) hq_ctx_destroy(ctx);
  free(x);
  free(y);
  res->total_s = train_now() - t_start;
  return rc;
}

void train_result_free(train_result *res) {
  free(res->train_curve);
  free(res->eval_curve);
  res->train_curve = res->eval_curve = NULL;
}
