/*
** cmd_train.c -- `hq train`, the main job: train the character-level language model of train/
** with one or more recipes (and a high-precision baseline) from the same seed, and compare them:
** progress lines, a final table (train / held-out loss, the gap to the baseline, time,
** tokens/s), --json, and --plot (gnuplot). The training itself is train/ (public API only).
*/
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../train/train.h"
#include "cli.h"
#include "commands.h"
#include "json.h"

#define CMD "train"
#define MAX_RECIPES 16

static const char usage[] =
    "usage: hq train [--recipe FILE]... [--device cpu|cuda] [--steps N] [--batch B]\n"
    "                [--seed S] [--eval-every N] [--json] [--plot FILE.png] [--data FILE]\n"
    "                [--plugin-dir DIR]... [--lr X] [--hidden H] [--layers L]\n"
    "                [--context C] [--embed E] [--act gelu|tanh] [--log-every N]\n"
    "                [--eval-batches N] [--checkpoint FILE] [--checkpoint-every N]\n"
    "                [--resume FILE] [--verify-resume]\n"
    "\n"
    "Train a small character-level language model (makemore-style: the previous C\n"
    "characters predict the next one; embedding -> L hidden linear layers -> lm_head) on a\n"
    "word list, once per recipe, every linear layer's fprop, dgrad and wgrad through\n"
    "libhqcore with the quantizers of its roles (linear, input|weight|grad_output,\n"
    "fc1..fcL|lm_head). Every recipe starts from the same seed: the same data order and the\n"
    "same initial weights. A high-precision baseline (FP32, identity everywhere) is trained\n"
    "too unless a recipe already is one; the table gives each recipe's held-out loss gap to\n"
    "it. See docs/training.md.\n"
    "\n"
    "  --recipe FILE     a recipe (repeatable; default: the installed recipe.ini)\n"
    "  --device D        cpu (default) or cuda\n"
    "  --steps N         optimizer steps per recipe (default 1000)\n"
    "  --batch B         sequences per step (default 256; a multiple of 128 suits every format)\n"
    "  --seed S          data split, data order, initial weights, stochastic rounding (default 1)\n"
    "  --eval-every N    held-out loss at step 0 and every N steps (default steps/5; 0: only\n"
    "                    at the end)\n"
    "  --eval-batches N  batches of the periodic eval (default 8; 0: the whole held-out set;\n"
    "                    the final eval always uses the whole set)\n"
    "  --log-every N     a progress line every N steps (default steps/10)\n"
    "  --data FILE       a text file: its whitespace-separated words of the letters a-z\n"
    "                    (default /usr/share/dict/words, Debian package wamerican)\n"
    "  --json            print the results as one JSON document (progress goes to stderr)\n"
    "  --plot FILE.png   draw every recipe's loss curves with gnuplot (when installed)\n"
    "  --lr X            peak learning rate (default 0.006; warmup, then cosine decay to lr/10)\n"
    "  --context C       characters of context (default 8)\n"
    "  --embed E         embedding width (default 16; fc1's input is C*E)\n"
    "  --hidden H        width of the hidden layers (default 256)\n"
    "  --layers L        hidden layers (default 2)\n"
    "  --act A           gelu (default) or tanh\n"
    "  --checkpoint FILE save the run to FILE (safetensors): masters, Adam moments and step,\n"
    "                    every quantized weight, the scaling state, the random-stream offset,\n"
    "                    the data position, the recipe and the shape; several runs: FILE with\n"
    "                    -NAME inserted before the extension, one file per run; {step} in\n"
    "                    FILE is replaced by the step (keep every save)\n"
    "  --checkpoint-every N\n"
    "                    save after steps N, 2N, ... and the last (default 0: only after the\n"
    "                    last step; each save replaces the file unless FILE has {step})\n"
    "  --resume FILE     continue the run saved in FILE (one --recipe: the same recipe, model\n"
    "                    shape, batch, seed and data; refused naming what differs) to --steps\n"
    "  --verify-resume   check the continuation: save mid-run (at --checkpoint-every when given,\n"
    "                    else halfway), train to the end, reload that checkpoint into a fresh\n"
    "                    context and model and train to the end again: the losses of every step\n"
    "                    after it and the final state must be bit-identical (exit 1 if not)\n";

typedef struct run {
  hq_recipe *recipe;
  char name[128];
  int high_precision;
  int builtin;
  train_result res;
  int done;
} run;

typedef struct progress_state {
  FILE *out;
  int index, count;                          /* this run (1-based) of count */
} progress_state;

static void fmt_duration(double s, char *buf, size_t n) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(double r, char *buf, size_t n) {
  if (r >= 1e6) snprintf(buf, n, "%.2fM", r / 1e6);
  else if (r >= 1e3) snprintf(buf, n, "%.1fk", r / 1e3);
  else snprintf(buf, n, "%.0f", r);
}

static void on_progress(void *user, const train_progress *p) {
  const progress_state *s = user;
  /* ETA: this run's pace for what is left of it and of the runs after it */
  const double per_step = p->elapsed_s / (double)p->step;
  const double left = per_step * (double)(p->steps - p->step + p->steps * (s->count - s->index));
  char eta[32], rate[32];
  fmt_duration(left, eta, sizeof eta);
  fmt_rate(p->tokens_per_s, rate, sizeof rate);
  fprintf(s->out, "[%d/%d] %-28s step %5lld/%-5lld loss %.4f", s->index, s->count, p->recipe,
          (long long)p->step, (long long)p->steps, p->loss);
  if (isfinite(p->eval_loss)) fprintf(s->out, "  eval %.4f", p->eval_loss);
  else fprintf(s->out, "              ");
  fprintf(s->out, "  %7s tok/s  ETA %s\n", rate, eta);
  fflush(s->out);
}

/* The installed default recipe: $HQ_CONF_DIR/recipe.ini when set, else $(datadir)/hq/recipe.ini
   (compiled in as HQ_RECIPEDIR, or found beside the installed plugin directory
   $(libdir)/hq/formats: the prefix before its lib* component, then share/hq). */
static void default_recipe(char *out, size_t n) {
  const char *conf = getenv("HQ_CONF_DIR");
  if (conf && *conf) {
    snprintf(out, n, "%s/recipe.ini", conf);
    return;
  }
#ifdef HQ_RECIPEDIR
  snprintf(out, n, "%s/recipe.ini", HQ_RECIPEDIR);
#else
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", hq_plugins_default_dir());
  char *cut = NULL;
  for (char *p = strstr(dir, "/lib"); p; p = strstr(p + 1, "/lib")) cut = p;
  if (cut) *cut = '\0';
  else snprintf(dir, sizeof dir, "/usr/local");
  snprintf(out, n, "%s/share/hq/recipe.ini", dir);
#endif
}

static const char builtin_baseline[] =
    "; the built-in baseline of hq train: every role in high precision, f32 (the trainer's dtype)\n"
    "[recipe]\n"
    "name = fp32\n"
    "[format f32]\n"
    "plugin = identity\n"
    "dtype = f32\n"
    "[role *:*:*]\n"
    "rowwise = f32\n"
    "columnwise = f32\n";

static void gemm_text(const hq_gemm_info *g, char *buf, size_t n) {
  if (!g->struct_size) snprintf(buf, n, "-");
  else snprintf(buf, n, "%s x %s (%s)", g->format_a, g->format_b, hq_gemm_path_name(g->path));
}

static const char *const gemm_names[3] = {"fprop", "dgrad", "wgrad"};

static void json_gemm(json *j, const hq_gemm_info *g) {
  json_obj(j);
  json_kstr(j, "a", g->struct_size ? g->format_a : "");
  json_kstr(j, "b", g->struct_size ? g->format_b : "");
  json_kstr(j, "path", g->struct_size ? hq_gemm_path_name(g->path) : "");
  json_kint(j, "m", g->m);
  json_kint(j, "n", g->n);
  json_kint(j, "k", g->k);
  json_close_obj(j);
}

/* The train loss curve for the plot and the JSON: the first batch's loss at step 0, then the mean
   over each window of `w` steps at the window's end. out has room for n_train_curve + 1. */
static int64_t window_means(const train_result *r, int64_t w, train_point *out) {
  int64_t n = 0;
  if (r->n_train_curve) out[n++] = (train_point){0, r->step0_loss};
  for (int64_t s = 0; s < r->n_train_curve; s += w) {
    int64_t e = s + w < r->n_train_curve ? s + w : r->n_train_curve;
    double sum = 0;
    for (int64_t k = s; k < e; k++) sum += r->train_curve[k].loss;
    out[n++] = (train_point){e, sum / (double)(e - s)};
  }
  return n;
}

/* --plot: two panels drawn by gnuplot (fed on a pipe, data inline): every recipe's train loss
   (mean per log interval, solid) and held-out loss (dashed, points); below, each recipe's train
   loss minus the baseline's over the same intervals (the same batches: the difference is the
   recipe's effect, not data noise). A missing gnuplot is a message, not a failure. */
static int plot(const char *file, run *runs, int n_runs, int baseline, int64_t window,
                const char *title) {
  static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
                                       "#000000", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78",
                                       "#c5b0d5", "#c49c94"};
  const int nc = (int)(sizeof colors / sizeof *colors);
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr,
            "hq train: --plot %s: gnuplot is not installed (Debian: apt-get install gnuplot-nox); "
            "no plot drawn\n",
            file);
    return 0;
  }
  const size_t cap = (size_t)runs[baseline].res.n_train_curve + 2;
  train_point *base = malloc(cap * sizeof *base), *pts = malloc(cap * sizeof *pts);
  if (!base || !pts) {
    free(base);
    free(pts);
    return cli_fail(1, CMD, "--plot: out of memory");
  }
  const int64_t nb = window_means(&runs[baseline].res, window, base);
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    free(base);
    free(pts);
    return cli_fail(1, CMD, "--plot: cannot run gnuplot: %s", strerror(errno));
  }
  fputs("set terminal png size 1100,900\nset output '", g);
  for (const char *p = file; *p; p++) {
    if (*p == '\'') fputc('\'', g);   /* '' inside a single-quoted gnuplot string */
    fputc(*p, g);
  }
  fputs("'\n", g);
  for (int i = 0; i < n_runs; i++) {
    int64_t n = window_means(&runs[i].res, window, pts);
    fprintf(g, "$train%d << EOD\n", i);
    for (int64_t k = 0; k < n; k++) fprintf(g, "%lld %.6f\n", (long long)pts[k].step, pts[k].loss);
    fprintf(g, "EOD\n$eval%d << EOD\n", i);
    for (int64_t k = 0; k < runs[i].res.n_eval_curve; k++)
      fprintf(g, "%lld %.6f\n", (long long)runs[i].res.eval_curve[k].step,
              runs[i].res.eval_curve[k].loss);
    fprintf(g, "EOD\n$diff%d << EOD\n", i);
    for (int64_t k = 1; k < n && k < nb; k++)
      fprintf(g, "%lld %.6f\n", (long long)pts[k].step, pts[k].loss - base[k].loss);
    fprintf(g, "EOD\n");
  }
  free(base);
  free(pts);
  fprintf(g, "set multiplot\nset grid\nset key top right noenhanced\n"
             "set lmargin 12\nset rmargin 3\n"
             "set size 1,0.64\nset origin 0,0.36\nset title \"%s\" noenhanced\n"
             "set ylabel 'loss (nats): train solid, held-out dashed'\nplot ",
          title);
  for (int i = 0; i < n_runs; i++) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", runs[i].name, i == baseline ? " (baseline)" : "");
    for (char *p = name; *p; p++)
      if (*p == '"' || *p == '\\') *p = '_';
    fprintf(g, "%s$train%d with lines lw 2 lc rgb '%s' title \"%s\", "
               "$eval%d with linespoints lw 1.5 dt 2 pt 7 ps 0.8 lc rgb '%s' notitle",
            i ? ", " : "", i, colors[i % nc], name, i, colors[i % nc]);
  }
  fprintf(g, "\nset size 1,0.36\nset origin 0,0\nset title 'train loss minus the baseline''s "
             "(same batches)'\nset xlabel 'step'\nset ylabel 'difference (nats)'\n"
             "set key off\nplot 0 with lines lc rgb '#444444' lw 1 notitle");
  for (int i = 0; i < n_runs; i++)
    if (i != baseline)
      fprintf(g, ", $diff%d with lines lw 2 lc rgb '%s' notitle", i, colors[i % nc]);
  fprintf(g, "\nunset multiplot\n");
  int st = pclose(g);
  if (st != 0) return cli_fail(1, CMD, "--plot %s: gnuplot failed (status %d)", file, st);
  fprintf(stderr, "hq train: loss curves drawn in %s\n", file);
  return 0;
}

typedef struct train_args {
  cli_list recipes;
  const char *data_path, *plot_file, *device_s, *act_s, *ckpt_path, *resume_path;
  int json, verify_resume;
  int64_t steps, batch, seed, eval_every, eval_batches, log_every, ckpt_every;
  int64_t context, embed, hidden, layers;
  double lr;
  cli_list dirs;
  int device, act;
} train_args;

static int set_lr(const char *cmd, const cli_option *o, const char *v) {
  char *end;
  double *lr = o->dest;
  errno = 0;
  *lr = strtod(v, &end);
  if (!*v || *end || errno || !(*lr > 0) || *lr > 1)
    return cli_fail(2, cmd, "--lr '%s' is not a number in (0, 1]", v);
  return 0;
}

static int parse_args(int argc, char **argv, train_args *a) {
  const cli_option opts[] = {
      {.name = "--recipe", .kind = CLI_LIST, .dest = &a->recipes, .max = MAX_RECIPES},
      {.name = "--device", .kind = CLI_STR, .dest = &a->device_s},
      {.name = "--steps", .kind = CLI_INT, .dest = &a->steps, .min = 1, .max = 10000000},
      {.name = "--batch", .kind = CLI_INT, .dest = &a->batch, .min = 1, .max = 1 << 20},
      {.name = "--seed", .kind = CLI_INT, .dest = &a->seed, .min = 0, .max = INT64_MAX},
      {.name = "--eval-every", .kind = CLI_INT, .dest = &a->eval_every, .min = 0, .max = INT64_MAX},
      {.name = "--eval-batches", .kind = CLI_INT, .dest = &a->eval_batches, .min = 0,
       .max = 1000000000},
      {.name = "--log-every", .kind = CLI_INT, .dest = &a->log_every, .min = 1, .max = INT64_MAX},
      {.name = "--data", .kind = CLI_STR, .dest = &a->data_path},
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
      {.name = "--plot", .kind = CLI_STR, .dest = &a->plot_file},
      CLI_PLUGIN_DIRS(&a->dirs),
      {.name = "--lr", .kind = CLI_CALL, .dest = &a->lr, .call = set_lr},
      {.name = "--context", .kind = CLI_INT, .dest = &a->context, .min = 1, .max = 256},
      {.name = "--embed", .kind = CLI_INT, .dest = &a->embed, .min = 1, .max = 4096},
      {.name = "--hidden", .kind = CLI_INT, .dest = &a->hidden, .min = 1, .max = 16384},
      {.name = "--layers", .kind = CLI_INT, .dest = &a->layers, .min = 1,
       .max = TRAIN_MAX_LINEAR - 1},
      {.name = "--act", .kind = CLI_STR, .dest = &a->act_s},
      {.name = "--checkpoint", .kind = CLI_STR, .dest = &a->ckpt_path},
      {.name = "--checkpoint-every", .kind = CLI_INT, .dest = &a->ckpt_every, .min = 1,
       .max = INT64_MAX},
      {.name = "--resume", .kind = CLI_STR, .dest = &a->resume_path},
      {.name = "--verify-resume", .kind = CLI_FLAG, .dest = &a->verify_resume},
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (cli_device_arg(CMD, a->device_s, &a->device)) return 2;
  if (a->ckpt_every && !a->ckpt_path && !a->verify_resume)
    return cli_fail(2, CMD, "--checkpoint-every needs --checkpoint FILE (or --verify-resume)");
  if (a->resume_path && a->recipes.n > 1)
    return cli_fail(2, CMD, "--resume continues one run: give at most one --recipe");
  if (a->verify_resume && a->steps < 2)
    return cli_fail(2, CMD, "--verify-resume needs --steps 2 or more");
  if (!strcmp(a->act_s, "gelu")) a->act = TRAIN_ACT_GELU;
  else if (!strcmp(a->act_s, "tanh")) a->act = TRAIN_ACT_TANH;
  else return cli_fail(2, CMD, "--act '%s' is not gelu or tanh", a->act_s);
  return CLI_RUN;
}

static void make_config(const train_args *a, train_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->model.context = (int)a->context;
  cfg->model.embed = (int)a->embed;
  cfg->model.hidden = (int)a->hidden;
  cfg->model.layers = (int)a->layers;
  cfg->model.batch = a->batch;
  cfg->model.vocab_pad = 128;   /* 27 padded to a multiple every stock format accepts */
  cfg->model.act = a->act;
  cfg->adam = (train_adam_cfg){0.9f, 0.95f, 1e-8f, 0.0f};
  cfg->steps = a->steps;
  cfg->lr = (float)a->lr;
  cfg->min_lr = (float)a->lr / 10;
  cfg->warmup = a->steps / 20;
  cfg->log_every = a->log_every > 0 ? a->log_every : (a->steps >= 10 ? a->steps / 10 : 1);
  cfg->eval_every = a->eval_every >= 0 ? a->eval_every : a->steps / 5;
  cfg->eval_batches = a->eval_batches;
  cfg->seed = (uint64_t)a->seed;
  cfg->device = a->device;
  cfg->ckpt_every = a->ckpt_every;
  cfg->verify_resume = a->verify_resume;
  cfg->verify_at = a->ckpt_every;
}

/* Every run of one invocation: a run per recipe, then the built-in baseline unless a recipe is
   high precision; the data they all train on. */
typedef struct session {
  run runs[MAX_RECIPES + 1];
  int n_runs, baseline;
  train_data data;
} session;

/* Each recipe loaded (every error of a bad one listed): 0, or 1 after the messages. */
static int load_recipes(const train_args *a, const hq_recipe_opts *ro, session *s) {
  for (size_t i = 0; i < a->recipes.n; i++) {
    struct stat st;
    const char *file = a->recipes.v[i];
    if (stat(file, &st) != 0) return cli_fail(1, CMD, "recipe %s: %s", file, strerror(errno));
    hq_recipe *r;
    if (hq_recipe_parse(file, ro, &r))
      return cli_fail(1, CMD, "recipe %s: %s", file, hq_last_error());
    s->runs[s->n_runs++].recipe = r;
    if (hq_recipe_error_count(r)) {
      for (size_t k = 0; k < hq_recipe_error_count(r); k++)
        fprintf(stderr, "hq train: %s\n", hq_recipe_error(r, k));
      return 1;
    }
  }
  return 0;
}

/* Name each run (the recipe's name, else its file's; the same one again: name#2), find the
   baseline among them or add the built-in one: 0, or 1 after the message. */
static int name_runs(const train_args *a, const train_config *cfg, const hq_recipe_opts *ro,
                     session *s) {
  char err[2048];
  s->baseline = -1;
  for (int i = 0; i < s->n_runs; i++) {
    run *rn = &s->runs[i];
    const char *file = a->recipes.v[i], *nm = hq_recipe_name(rn->recipe);
    if (nm && *nm) snprintf(rn->name, sizeof rn->name, "%s", nm);
    else {
      const char *b = strrchr(file, '/');
      snprintf(rn->name, sizeof rn->name, "%s", b ? b + 1 : file);
      char *dot = strrchr(rn->name, '.');
      if (dot && dot != rn->name) *dot = '\0';
    }
    char base[128];
    snprintf(base, sizeof base, "%s", rn->name);
    for (int dup = 2;; dup++) {
      int clash = 0;
      for (int k = 0; k < i; k++) clash |= !strcmp(s->runs[k].name, rn->name);
      if (!clash) break;
      snprintf(rn->name, sizeof rn->name, "%.110s#%d", base, dup);
    }
    int hp = train_recipe_is_high_precision(rn->recipe, &cfg->model, err, sizeof err);
    if (hp < 0) return cli_fail(1, CMD, "recipe '%s' (%s): %s", rn->name, file, err);
    rn->high_precision = hp;
    if (hp && s->baseline < 0) s->baseline = i;
  }
  if (s->baseline >= 0) return 0;
  run *rn = &s->runs[s->n_runs];
  if (hq_recipe_load_string(builtin_baseline, "fp32 baseline (built in)", ro, &rn->recipe))
    return cli_fail(1, CMD, "the built-in baseline: %s", hq_last_error());
  s->baseline = s->n_runs++;
  rn->high_precision = 1;
  rn->builtin = 1;
  snprintf(rn->name, sizeof rn->name, "fp32");
  return 0;
}

/* --checkpoint with several runs: one file per run, FILE-NAME.ext. */
static const char *run_ckpt_path(const char *ckpt_path, const char *name, char *path, size_t len) {
  char nm[160];
  snprintf(nm, sizeof nm, "%s", name);
  for (char *p = nm; *p; p++)
    if (*p == '/' || *p == ' ') *p = '_';
  const char *slash = strrchr(ckpt_path, '/'), *dot = strrchr(ckpt_path, '.');
  if (dot && (!slash || dot > slash + 1))
    snprintf(path, len, "%.*s-%s%s", (int)(dot - ckpt_path), ckpt_path, nm, dot);
  else snprintf(path, len, "%s-%s", ckpt_path, nm);
  return path;
}

/* What a run says after it trained: resumed, saved, verified. 1 when the verification failed. */
static int run_said(const train_args *a, const train_config *cfg, const run *rn, FILE *po) {
  const train_result *r = &rn->res;
  if (cfg->resume_path)
    fprintf(po, "hq train: %s: resumed at step %lld (checkpoint loaded in %.1f ms)\n", rn->name,
            (long long)r->resumed_from, 1e3 * r->ckpt_load_s);
  if (cfg->ckpt_path)
    fprintf(po, "hq train: %s: checkpoint %s: %lld save%s, the last at step %lld (%lld bytes, "
                "saved in %.1f ms)\n",
            rn->name, cfg->ckpt_path, (long long)r->ckpt_saves, r->ckpt_saves == 1 ? "" : "s",
            (long long)a->steps, (long long)r->ckpt_bytes, 1e3 * r->ckpt_save_s);
  if (r->ranks > 1 && train_dist_rank(cfg->model.dist) == 0)   /* docs/distributed.md */
    fprintf(po, "hq train: %s: %d ranks: per step and rank, quantized weights gathered %llu "
                "bytes (a BF16 all-gather: %llu, %.3fx), FP32 weight gradients reduce-scattered "
                "%llu bytes\n",
            rn->name, r->ranks, (unsigned long long)r->wire_gathered,
            (unsigned long long)r->wire_bf16,
            r->wire_bf16 ? (double)r->wire_gathered / (double)r->wire_bf16 : 0.0,
            (unsigned long long)r->wire_reduced);
  if (!a->verify_resume) return 0;
  if (r->verified == 1) {
    fprintf(po, "hq train: %s: resume verified: the checkpoint of step %lld reloaded into a "
                "fresh model gives bit-identical losses for steps %lld..%lld and a "
                "bit-identical final state\n",
            rn->name, (long long)r->verify_at, (long long)r->verify_at + 1, (long long)a->steps);
    return 0;
  }
  fprintf(stderr, "hq train: %s: resume NOT identical after reloading the checkpoint of step "
                  "%lld: %s\n",
          rn->name, (long long)r->verify_at, r->verify_msg);
  return 1;
}

/* Train every run in turn, progress on po: 0, 1 when a resume verification failed (the runs
   are reported), -1 after the message of a failed run. */
static int train_all(const train_args *a, train_config *cfg, session *s, FILE *po) {
  char err[2048], cpath[1400];
  int verify_failed = 0;
  for (int i = 0; i < s->n_runs; i++) {
    run *rn = &s->runs[i];
    progress_state ps = {po, i + 1, s->n_runs};
    cfg->ckpt_path = a->ckpt_path && s->n_runs > 1
                         ? run_ckpt_path(a->ckpt_path, rn->name, cpath, sizeof cpath)
                         : a->ckpt_path;
    /* --resume: the recipe's run (the first; the baseline added after it trains from scratch) */
    cfg->resume_path = i == 0 ? a->resume_path : NULL;
    if (cfg->resume_path)
      fprintf(po, "hq train: %s: resuming from %s\n", rn->name, cfg->resume_path);
    if (train_run(cfg, &s->data, rn->recipe, rn->name, on_progress, &ps, &rn->res, err,
                  sizeof err))
      return cli_fail(-1, CMD, "%s", err);
    rn->res.high_precision = rn->high_precision;
    rn->done = 1;
    verify_failed |= run_said(a, cfg, rn, po);
  }
  return verify_failed;
}

static void config_json(json *j, const train_args *a, const train_config *cfg, const session *s) {
  json_key(j, "data");
  json_obj(j);
  json_kstr(j, "path", a->data_path);
  json_kint(j, "words", s->data.n_words);
  json_kint(j, "train_words", s->data.n_train_words);
  json_kint(j, "eval_words", s->data.n_eval_words);
  json_kint(j, "train_examples", s->data.n_train);
  json_kint(j, "eval_examples", s->data.n_eval);
  json_close_obj(j);
  json_key(j, "config");
  json_obj(j);
  json_kstr(j, "device", a->device_s);
  json_kint(j, "steps", a->steps);
  json_kint(j, "batch", a->batch);
  json_kint(j, "seed", a->seed);
  json_kint(j, "context", a->context);
  json_kint(j, "embed", a->embed);
  json_kint(j, "hidden", a->hidden);
  json_kint(j, "layers", a->layers);
  json_kint(j, "vocab", TRAIN_VOCAB);
  json_kint(j, "vocab_padded", cfg->model.vocab_pad);
  json_kstr(j, "activation", a->act_s);
  json_knum(j, "lr", a->lr);
  json_knum(j, "min_lr", cfg->min_lr);
  json_kint(j, "warmup", cfg->warmup);
  json_kint(j, "eval_every", cfg->eval_every);
  json_kint(j, "parameters", s->runs[0].res.n_params);
  json_close_obj(j);
}

/* [[step, loss], ...] */
static void curve_json(json *j, const char *key, const train_point *pts, int64_t n) {
  json_key(j, key);
  json_arr(j);
  for (int64_t k = 0; k < n; k++) {
    json_arr(j);
    json_int(j, pts[k].step);
    json_num(j, pts[k].loss);
    json_close_arr(j);
  }
  json_close_arr(j);
}

static void run_json(json *j, const train_args *a, const train_config *cfg, const session *s,
                     int i) {
  const run *rn = &s->runs[i];
  const train_result *r = &rn->res;
  json_obj(j);
  json_kstr(j, "name", rn->name);
  json_key(j, "path");
  if (rn->builtin) json_null(j);
  else json_str(j, r->path);
  json_kbool(j, "baseline", i == s->baseline);
  json_kbool(j, "high_precision", rn->high_precision);
  json_knum(j, "step0_loss", r->step0_loss);
  json_knum(j, "train_loss", r->train_loss);
  json_knum(j, "eval_loss", r->eval_loss);
  json_knum(j, "gap", r->eval_loss - s->runs[s->baseline].res.eval_loss);
  json_knum(j, "train_seconds", r->train_s);
  json_knum(j, "total_seconds", r->total_s);
  json_kint(j, "tokens", r->tokens);
  json_knum(j, "tokens_per_second", r->tokens_per_s);
  json_kint(j, "resumed_from", r->resumed_from);
  json_key(j, "resume_verified");
  if (!a->verify_resume) json_null(j);
  else json_bool(j, r->verified == 1);
  /* the train curve: step 0, then the mean of each log interval */
  train_point *pts = malloc(((size_t)r->n_train_curve + 2) * sizeof *pts);
  curve_json(j, "train_curve", pts, pts ? window_means(r, cfg->log_every, pts) : 0);
  free(pts);
  curve_json(j, "eval_curve", r->eval_curve, r->n_eval_curve);
  json_key(j, "gemms");
  json_arr(j);
  for (int l = 0; l < r->n_layers; l++) {
    json_obj(j);
    json_kstr(j, "layer", r->layer_name[l]);
    for (int g = 0; g < 3; g++) {
      json_key(j, gemm_names[g]);
      json_gemm(j, &r->layer_info[l][g]);
    }
    json_close_obj(j);
  }
  json_close_arr(j);
  json_close_obj(j);
}

static void report_json(const train_args *a, const train_config *cfg, const session *s) {
  json j;
  json_begin(&j, stdout);
  json_obj(&j);
  config_json(&j, a, cfg, s);
  json_kstr(&j, "baseline", s->runs[s->baseline].name);
  json_key(&j, "recipes");
  json_arr(&j);
  for (int i = 0; i < s->n_runs; i++) run_json(&j, a, cfg, s, i);
  json_close_arr(&j);
  json_close_obj(&j);
  json_end(&j);
}

static void report_text(const train_config *cfg, const session *s) {
  const double base_eval = s->runs[s->baseline].res.eval_loss;
  printf("\n%-30s %10s %10s %12s %8s %10s\n", "recipe", "train loss", "eval loss",
         "gap vs base", "time", "tokens/s");
  for (int i = 0; i < s->n_runs; i++) {
    const train_result *r = &s->runs[i].res;
    char gap[32], t[32], rate[32], nm[160];
    if (i == s->baseline) snprintf(gap, sizeof gap, "(baseline)");
    else snprintf(gap, sizeof gap, "%+.4f", r->eval_loss - base_eval);
    snprintf(t, sizeof t, "%.1fs", r->total_s);
    fmt_rate(r->tokens_per_s, rate, sizeof rate);
    snprintf(nm, sizeof nm, "%s", s->runs[i].name);
    printf("%-30s %10.4f %10.4f %12s %8s %10s\n", nm, r->train_loss, r->eval_loss, gap, t, rate);
  }
  printf("\ntrain loss: mean of the last %lld steps; eval loss: the whole held-out set (%lld "
         "examples) after the last step; gap: eval loss minus the baseline's (%s); "
         "ln(27) = 3.2958 is a uniform guess\n",
         (long long)cfg->log_every, (long long)s->data.n_eval, s->runs[s->baseline].name);
  printf("\nGEMMs of each layer (operand formats A x B, path):\n");
  for (int i = 0; i < s->n_runs; i++) {
    const train_result *r = &s->runs[i].res;
    printf("  %s\n", s->runs[i].name);
    for (int l = 0; l < r->n_layers; l++) {
      char g[3][96];
      for (int k = 0; k < 3; k++) gemm_text(&r->layer_info[l][k], g[k], sizeof g[k]);
      printf("    %-8s fprop %-28s dgrad %-28s wgrad %s\n", r->layer_name[l], g[0], g[1], g[2]);
    }
  }
}

static void session_free(session *s) {
  for (int i = 0; i < s->n_runs; i++) {
    train_result_free(&s->runs[i].res);
    hq_recipe_free(s->runs[i].recipe);
  }
  train_data_free(&s->data);
}

int hq_cmd_train(int argc, char **argv) {
  train_args a = {.device_s = "cpu", .act_s = "gelu", .steps = 1000, .batch = 256, .seed = 1,
                  .eval_every = -1, .eval_batches = 8, .log_every = -1, .context = 8,
                  .embed = 16, .hidden = 256, .layers = 2, .lr = 6e-3};
  int status = parse_args(argc, argv, &a);
  if (status != CLI_RUN) return status;
  train_config cfg;
  make_config(&a, &cfg);
  /* the default recipe when none is given */
  char default_path[1100];
  if (a.recipes.n == 0) {
    default_recipe(default_path, sizeof default_path);
    if (access(default_path, R_OK) != 0)
      return cli_fail(1, CMD,
                      "no --recipe given and the default recipe %s cannot be read (%s): install "
                      "hq (make install), set HQ_CONF_DIR to the directory holding recipe.ini, or "
                      "give --recipe FILE",
                      default_path, strerror(errno));
    a.recipes.v[a.recipes.n++] = default_path;
  }
  char err[2048];
  train_dist *dist;   /* under mpirun: the ranks (docs/distributed.md) */
  if (train_dist_init(&dist, err, sizeof err)) return cli_fail(1, CMD, "%s", err);
  cfg.model.dist = dist;
  session s;
  memset(&s, 0, sizeof s);
  const hq_recipe_opts ro = cli_recipe_opts(&a.dirs);
  status = 1;
  if (load_recipes(&a, &ro, &s) || name_runs(&a, &cfg, &ro, &s)) goto out;
  const int is_default = a.data_path == NULL;
  if (!a.data_path) a.data_path = TRAIN_DEFAULT_DATA;
  if (train_data_load(&s.data, a.data_path, is_default, (int)a.context, cfg.seed, err,
                      sizeof err)) {
    cli_fail(1, CMD, "%s", err);
    goto out;
  }
  FILE *po = a.json && train_dist_rank(dist) == 0 ? stderr : stdout;   /* ranks > 0: none */
  fprintf(po,
          "hq train: %lld words from %s (%lld train, %lld held out: %lld / %lld examples); "
          "model C=%lld E=%lld H=%lld L=%lld %s, batch %lld, %lld steps, lr %g, seed %lld, %s\n",
          (long long)s.data.n_words, a.data_path, (long long)s.data.n_train_words,
          (long long)s.data.n_eval_words, (long long)s.data.n_train, (long long)s.data.n_eval,
          (long long)a.context, (long long)a.embed, (long long)a.hidden, (long long)a.layers,
          a.act_s, (long long)a.batch, (long long)a.steps, a.lr, (long long)a.seed, a.device_s);
  const int trained = train_all(&a, &cfg, &s, po);
  if (trained < 0) goto out;
  if (a.json) report_json(&a, &cfg, &s);
  else report_text(&cfg, &s);
  status = trained;
  if (a.plot_file && train_dist_rank(dist) == 0) {
    char title[256];
    snprintf(title, sizeof title, "hq train: %lld steps, batch %lld, seed %lld", (long long)a.steps,
             (long long)a.batch, (long long)a.seed);
    int ps = plot(a.plot_file, s.runs, s.n_runs, s.baseline, cfg.log_every, title);
    if (ps) status = ps;
  }
out:
  session_free(&s);
  train_dist_end(dist);
  return status;
}
