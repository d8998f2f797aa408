/*
** cmd_train.c -- `hq train`, the main job: train the character-level language model of train/
** with one or more recipes (and a high-precision baseline) from the same seed, and compare them:
** progress lines, a final table (train / held-out loss, the gap to the baseline, time,
** tokens/s), --json, and --plot (gnuplot). The training itself is train/ (public API only).
*/
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../train/train.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "train_report.h"

#define CMD "train"
#define MAX_RECIPES 16
#define MAX_SEEDS 64

static const char usage[] =
    "usage: hq train [--recipe FILE]... [--device cpu|cuda] [--steps N] [--batch B]\n"
    "                [--seed S] [--eval-every N] [--json] [--plot FILE.png] [--data FILE]\n"
    "                [--plugin-dir DIR]... [--lr X] [--hidden H] [--layers L]\n"
    "                [--context C] [--embed E] [--act gelu|tanh] [--log-every N]\n"
    "                [--eval-batches N] [--checkpoint FILE] [--checkpoint-every N]\n"
    "                [--resume FILE [--no-verify]] [--verify-resume]\n"
    "                [--baseline NAME|fp32|bf16-direct|none] [--seeds N] [--profile]\n"
    "                [--preset default|wide|large|gpt2s] [--grad-dtype fp32|bf16]\n"
    "                [--cuda-graph on|off] [--graph-dot FILE]\n"
    "\n"
    "Train a small character-level language model (makemore-style: the previous C\n"
    "characters predict the next one; embedding -> L hidden linear layers -> lm_head) on a\n"
    "word list, once per recipe, every linear layer's fprop, dgrad and wgrad through\n"
    "libhqcore with the quantizers of its roles (linear, input|weight|grad_output,\n"
    "fc1..fcL|lm_head). Every recipe starts from the same seed: the same data order and the\n"
    "same initial weights. A baseline in FP32 (identity everywhere) is trained too unless\n"
    "--baseline names another; the table gives each recipe's held-out loss gap to it.\n"
    "Memory is estimated, output paths are checked and every recipe is tried on the model's\n"
    "shapes (each role's quantizer makes an empty tensor of its shape) before the first step;\n"
    "when a run fails after others finished, their table is printed and the exit status is 1.\n"
    "On the CPU a run repeats bit for bit on one machine; OpenBLAS picks its sgemm kernel by\n"
    "CPU model, which moves a quantized recipe's loss in the third decimal between models\n"
    "(OPENBLAS_CORETYPE=Haswell: the same kernel, and losses, on any x86-64 CPU with AVX2).\n"
    "See docs/training.md.\n"
    "\n"
    "  --recipe FILE     a recipe (repeatable; default: the installed recipe.ini); a relative\n"
    "                    FILE that is not here names the shipped recipe (examples/mxfp8.ini)\n"
    "  --device D        cpu (default) or cuda (under mpirun -np N: one GPU per rank, the\n"
    "                    local rank's, through NCCL; docs/distributed.md)\n"
    "  --steps N         optimizer steps per recipe (default 1000)\n"
    "  --batch B         sequences per step (default 256; a multiple of 128 suits every format)\n"
    "  --seed S          data split, data order, initial weights, stochastic rounding (default 1)\n"
    "  --seeds N         train every recipe N times, from seeds S..S+N-1 (default 1): the table\n"
    "                    gives the mean and spread per recipe and marks the gaps to the\n"
    "                    baseline larger than the seed noise (|mean| > 2 standard errors)\n"
    "  --baseline B      the run the gaps are measured to: fp32 (default: a built-in FP32 run\n"
    "                    added after the recipes), bf16-direct (a built-in run of the same\n"
    "                    model whose GEMMs call cuBLASLt directly on BF16 copies, no hq GEMM\n"
    "                    or quantizer: what hq costs against a plain BF16 trainer; --device\n"
    "                    cuda only, one process, no checkpoints), the name or file of a\n"
    "                    --recipe, or none\n"
    "  --eval-every N    held-out loss at step 0 and every N steps (default steps/5; 0: only\n"
    "                    at the end)\n"
    "  --eval-batches N  batches of the periodic eval (default 8; 0: the whole held-out set;\n"
    "                    the final eval always uses the whole set)\n"
    "  --log-every N     a progress line every N steps (default steps/10)\n"
    "  --grad-dtype T    under mpirun -np N (N >= 2): the weight gradients' reduce-scatter in\n"
    "                    fp32 (default) or bf16 (each rank's gradient rounded to BF16, summed\n"
    "                    in BF16, widened back for AdamW: half the bytes; the result depends\n"
    "                    on N); refused in one process; docs/distributed.md\n"
    "  --cuda-graph on|off\n"
    "                    with --device cuda: capture a step's forward, backward and optimizer\n"
    "                    in a CUDA graph once warm (after 2 steps) and replay it at every later\n"
    "                    step (default on; the same losses and weights, bit for bit; stochastic\n"
    "                    rounding included: each replay draws its step's bits), its small\n"
    "                    wgrads, columnwise copies and weights' write-backs on a second\n"
    "                    stream. A run that cannot be captured (--profile, several ranks,\n"
    "                    columnwise_source = rowwise_dequantized) runs eagerly, with a\n"
    "                    one-line note;\n"
    "                    docs/training.md\n"
    "  --graph-dot FILE  with the graph on: write each run's captured step to FILE as Graphviz\n"
    "                    dot (cudaGraphDebugDotPrint, verbose: every node with its kernel,\n"
    "                    grid and edges), before it is first replayed; several runs: FILE with\n"
    "                    -NAME inserted before the extension, one file per run, as --checkpoint\n"
    "  --data FILE       a text file: its whitespace-separated words of the letters a-z\n"
    "                    (default /usr/share/dict/words, Debian package wamerican)\n"
    "  --json            print the results as one JSON document (progress goes to stderr)\n"
    "  --plot FILE.png   draw every recipe's loss curves and held-out gap with gnuplot (when\n"
    "                    installed; checked before the first step)\n"
    "  --lr X            peak learning rate (default 0.006; warmup, then cosine decay to lr/10),\n"
    "                    in (0, 1] and a normal float32 (at least 1.17549435e-38)\n"
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
    "                    shape, batch, seed and data; refused naming what differs) to --steps,\n"
    "                    with its learning rate: an --lr that differs from it is refused\n"
    "  --no-verify       with --resume: load FILE without verifying checksums (a file written by\n"
    "                    another tool or an older hq has none and is refused without it)\n"
    "  --verify-resume   check the continuation: save mid-run (with --checkpoint-every N, at the\n"
    "                    first multiple of N the run trains, refused when none comes before\n"
    "                    --steps; else halfway), train to the end, reload that checkpoint into a\n"
    "                    fresh context and model and train to the end again: the losses of every\n"
    "                    step after it and the final state must be bit-identical (exit 1 if not)\n"
    "  --preset P        the model's size: default (C 8, E 16, H 256, L 2, batch 256, lr 0.006),\n"
    "                    wide (E 64, H 1024, L 4, batch 4096, lr 0.002), large (E 64,\n"
    "                    H 4096, L 6, batch 32768, lr 0.001: GEMM-bound on a GPU) or gpt2s\n"
    "                    (E 96, H 768, L 8, batch 4096, lr 0.001: GPT-2 small's width and\n"
    "                    4096 tokens a step); --context, --embed, --hidden, --layers, --batch\n"
    "                    and --lr given too override it\n"
    "  --profile         where a step's time goes, per recipe: GEMMs per path, quantize, amax\n"
    "                    passes, the trainer's kernels and their parts, optimizer, copies,\n"
    "                    host overhead or GPU idle, over the last 20 steps (CUDA events on a\n"
    "                    GPU, the host clock on the CPU); a table per recipe, and \"profile\"\n"
    "                    in --json\n"
    "\n"
    "--checkpoint's and --plot's files are written whole or not at all (to a temporary file\n"
    "beside each, renamed over it); a symbolic link is followed to the file it names. Before\n"
    "the first step every file a run will write is checked: a path that is a device, FIFO,\n"
    "socket or directory, longer than PATH_MAX, or in a directory that cannot be written is\n"
    "refused, naming the option and the path.\n";

typedef struct run {
  hq_recipe *recipe;
  char name[128];
  int high_precision;
  int builtin;
  int direct;                                /* the bf16-direct run (train/direct.h) */
  train_result res;                          /* the first seed's run */
  train_result *more;                        /* --seeds N: the runs of seeds 2..N */
  int done;
} run;

/* The result of seed k (0-based) of a run. */
static const train_result *run_seed(const run *rn, int k) { return k ? &rn->more[k - 1] : &rn->res; }

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

/* The installed default recipe: recipe.ini in the shipped recipes' directory (cli_recipe_dir);
   a new string, NULL when out of memory. */
static char *default_recipe(void) {
  char *dir = cli_recipe_dir();
  const size_t n = dir ? strlen(dir) + sizeof "/recipe.ini" : 0;
  char *out = dir ? malloc(n) : NULL;
  if (out) snprintf(out, n, "%s/recipe.ini", dir);
  free(dir);
  return out;
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

/* What the bf16-direct run computes, as a recipe: every role identity in BF16 (the run itself
   uses no quantizer; the recipe names it and its formats in the report and the JSON). */
static const char builtin_direct[] =
    "; the bf16-direct run of hq train: the GEMMs on cuBLASLt from BF16 copies, no hq GEMM\n"
    "[recipe]\n"
    "name = bf16-direct\n"
    "[format bf16]\n"
    "plugin = identity\n"
    "dtype = bf16\n"
    "[role *:*:*]\n"
    "rowwise = bf16\n"
    "columnwise = bf16\n";

static int is_direct(const char *baseline) { return baseline && !strcmp(baseline, "bf16-direct"); }

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
  /* which provider, or which format module's own kernel, ran it */
  json_kstr(j, "provider", g->struct_size ? g->provider : "");
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

typedef struct train_args {
  cli_list recipes;
  const char *data_path, *plot_file, *device_s, *act_s, *ckpt_path, *resume_path, *baseline_s;
  const char *graph_dot;
  const char *preset, *grad_dtype_s, *cuda_graph_s;
  int json, verify_resume, no_verify, profile;
  int lr_given;                              /* --lr on the command line (not --preset's) */
  int64_t steps, batch, seed, eval_every, eval_batches, log_every, ckpt_every, seeds;
  int64_t context, embed, hidden, layers;
  double lr;
  cli_list dirs;
  int device, act, grad_bf16, cuda_graph;
} train_args;

static int set_lr(const char *cmd, const cli_option *o, const char *v) {
  char *end;
  double *lr = o->dest;
  errno = 0;
  *lr = strtod(v, &end);
  const int tiny = errno == ERANGE && fabs(*lr) < 1;   /* an underflow, not an overflow */
  if (!*v || *end || (errno && !tiny) || !(*lr >= 0) || signbit(*lr) || *lr > 1 ||
      (*lr == 0 && !tiny))
    return cli_fail(2, cmd, "--lr '%s' is not a number in (0, 1]", v);
  /* the trainer holds lr in a float: one that rounds to 0 or to a subnormal never trains */
  if (!isnormal((float)*lr))
    return cli_fail(2, cmd, "--lr '%s' is %s as a float32, the trainer's precision: give at "
                    "least %.9g", v, (float)*lr == 0 ? "0" : "subnormal", (double)FLT_MIN);
  return 0;
}

/* The model sizes of --preset; an option given on the command line (non-zero) wins. large is
   GEMM-bound on a GPU: four of its six linear layers are 4096 x 4096, and 32768 tokens a step
   make a BF16 step some 17 TFLOP, tens of milliseconds on an H200. gpt2s has GPT-2 small's
   width (768; C*E = 768 too, so every hidden GEMM is 768 x 768) and 4096 tokens a step, the size
   of a small trainer's micro-batch, with as many linear layers as fit a plain MLP that still
   trains (no residuals or normalization here). */
static int apply_preset(train_args *a) {
  static const struct {
    const char *name;
    int64_t context, embed, hidden, layers, batch;
    double lr;
  } presets[] = {{"default", 8, 16, 256, 2, 256, 6e-3},
                 {"wide", 8, 64, 1024, 4, 4096, 2e-3},
                 {"large", 8, 64, 4096, 6, 32768, 1e-3},
                 {"gpt2s", 8, 96, 768, 8, 4096, 1e-3}};
  if (!a->preset) a->preset = "default";
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
    if (strcmp(a->preset, presets[i].name)) continue;
    if (!a->context) a->context = presets[i].context;
    if (!a->embed) a->embed = presets[i].embed;
    if (!a->hidden) a->hidden = presets[i].hidden;
    if (!a->layers) a->layers = presets[i].layers;
    if (!a->batch) a->batch = presets[i].batch;
    if (!(a->lr > 0)) a->lr = presets[i].lr;
    return 0;
  }
  return cli_fail(2, CMD, "--preset '%s' is not default, wide, large or gpt2s", a->preset);
}

/* An output FILE option refused at parsing, where a run would train and fail only when it writes
   (an empty name; one that names a directory; for gnuplot, a leading '|', which it runs as a
   command): 0, or 2 after the message. */
static int check_out_arg(const char *opt, const char *path, int gnuplot) {
  if (!path) return 0;
  if (!*path) return cli_fail(2, CMD, "%s '' is empty: give the FILE to write", opt);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return cli_fail(2, CMD, "%s '%s' names a directory: give a FILE", opt, path);
  if (gnuplot && *path == '|')
    return cli_fail(2, CMD, "%s '%s' starts with '|', which gnuplot runs as a command: give a "
                    "FILE", opt, path);
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
      {.name = "--no-verify", .kind = CLI_FLAG, .dest = &a->no_verify},
      {.name = "--baseline", .kind = CLI_STR, .dest = &a->baseline_s},
      {.name = "--seeds", .kind = CLI_INT, .dest = &a->seeds, .min = 1, .max = MAX_SEEDS},
      {.name = "--profile", .kind = CLI_FLAG, .dest = &a->profile},
      {.name = "--preset", .kind = CLI_STR, .dest = &a->preset},
      {.name = "--grad-dtype", .kind = CLI_STR, .dest = &a->grad_dtype_s},
      {.name = "--cuda-graph", .kind = CLI_STR, .dest = &a->cuda_graph_s},
      {.name = "--graph-dot", .kind = CLI_STR, .dest = &a->graph_dot},
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (cli_device_arg(CMD, a->device_s, &a->device)) return 2;
  if (check_out_arg("--checkpoint", a->ckpt_path, 0) || check_out_arg("--plot", a->plot_file, 1))
    return 2;
  a->lr_given = a->lr > 0;   /* before --preset fills it */
  if (apply_preset(a)) return 2;
  if (a->ckpt_every && !a->ckpt_path && !a->verify_resume)
    return cli_fail(2, CMD, "--checkpoint-every needs --checkpoint FILE (or --verify-resume)");
  if (a->no_verify && !a->resume_path) return cli_fail(2, CMD, "--no-verify needs --resume FILE");
  if (a->resume_path && a->recipes.n > 1)
    return cli_fail(2, CMD, "--resume continues one run: give at most one --recipe");
  if (a->verify_resume && a->steps < 2)
    return cli_fail(2, CMD, "--verify-resume needs --steps 2 or more");
  if (a->verify_resume && a->ckpt_every >= a->steps)
    return cli_fail(2, CMD, "--verify-resume saves at the first --checkpoint-every step, and "
                    "--checkpoint-every %lld saves none before --steps %lld: give a smaller one, "
                    "or leave it out to verify halfway", (long long)a->ckpt_every,
                    (long long)a->steps);
  if (a->resume_path && a->seeds > 1)
    return cli_fail(2, CMD, "--resume continues one run: --seeds must be 1");
  if (a->seed > INT64_MAX - (a->seeds - 1))
    return cli_fail(2, CMD, "--seed %lld with --seeds %lld goes past %lld", (long long)a->seed,
                    (long long)a->seeds, (long long)INT64_MAX);
  if (is_direct(a->baseline_s) && a->device == HQ_DEVICE_HOST)
    return cli_fail(2, CMD, "--baseline bf16-direct calls cuBLASLt directly: it needs --device "
                    "cuda (on the CPU, compare with --baseline fp32)");
  if (is_direct(a->baseline_s) && (a->ckpt_path || a->resume_path || a->verify_resume))
    return cli_fail(2, CMD, "--baseline bf16-direct saves no checkpoint: give it without "
                    "--checkpoint, --resume and --verify-resume");
  if (!strcmp(a->act_s, "gelu")) a->act = TRAIN_ACT_GELU;
  else if (!strcmp(a->act_s, "tanh")) a->act = TRAIN_ACT_TANH;
  else return cli_fail(2, CMD, "--act '%s' is not gelu or tanh", a->act_s);
  if (!strcmp(a->grad_dtype_s, "bf16")) a->grad_bf16 = 1;
  else if (strcmp(a->grad_dtype_s, "fp32"))
    return cli_fail(2, CMD, "--grad-dtype '%s' is not fp32 or bf16", a->grad_dtype_s);
  if (!strcmp(a->cuda_graph_s, "on")) a->cuda_graph = 1;
  else if (strcmp(a->cuda_graph_s, "off"))
    return cli_fail(2, CMD, "--cuda-graph '%s' is not on or off", a->cuda_graph_s);
  if (check_out_arg("--graph-dot", a->graph_dot, 0)) return 2;
  if (a->graph_dot && (a->device == HQ_DEVICE_HOST || !a->cuda_graph || a->profile))
    return cli_fail(2, CMD, "--graph-dot %s writes the step's CUDA graph: it needs --device "
                    "cuda and --cuda-graph on, without --profile (which runs eagerly)",
                    a->graph_dot);
  return CLI_RUN;
}

/* f as the shortest decimal text that reads back as f (0.01, not 0.00999999978). */
static const char *float_text(float f, char *buf, size_t n) {
  for (int p = 1; p <= 9; p++) {
    snprintf(buf, n, "%.*g", p, (double)f);
    if (strtof(buf, NULL) == f) break;
  }
  return buf;
}

/* --resume continues the saved run, so the learning rate, the one hyper-parameter the checkpoint
   records that a resume takes rather than checks, is the checkpoint's: an --lr that differs is
   refused (1 after the message naming both), none given takes it, and a file that cannot be read
   is left to the run's load to report (0). */
static int resume_lr(train_args *a) {
  if (!a->resume_path) return 0;
  hq_ckpt_open_opts oo = {.struct_size = sizeof oo, .flags = a->no_verify ? HQ_CKPT_NO_VERIFY : 0};
  hq_ckpt *c;
  if (hq_ckpt_open_ex(a->resume_path, &oo, &c)) return 0;
  const char *v = hq_ckpt_meta(c, "lr");
  char *end;
  const float saved = v ? strtof(v, &end) : 0;
  int rc = 0;
  if (v && *v && !*end && isnormal(saved) && saved > 0) {
    char sv[32], given[32];
    float_text(saved, sv, sizeof sv);
    if (!a->lr_given) a->lr = strtod(sv, NULL);
    else if ((float)a->lr != saved)
      rc = cli_fail(1, CMD, "--lr %s differs from the learning rate of the run saved in %s "
                    "(lr = %s): --resume continues that run; leave --lr out or give --lr %s",
                    float_text((float)a->lr, given, sizeof given), a->resume_path, sv, sv);
  }
  hq_ckpt_close(c);
  return rc;
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
  cfg->model.grad_bf16 = a->grad_bf16;
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
  cfg->resume_no_verify = a->no_verify;
  cfg->verify_at = a->ckpt_every;
  cfg->profile = a->profile;
  cfg->cuda_graph = a->cuda_graph;
}

/* Every run of one invocation: a run per recipe, then the built-in baseline unless a recipe is
   high precision; the data they all train on. */
typedef struct session {
  run runs[MAX_RECIPES + 1];
  int n_runs, baseline;                      /* baseline -1: none */
  int n_seeds, seed_k;                       /* --seeds, the one training now (0-based) */
  int n_done;                                /* the runs of seed seed_k that finished */
  uint64_t seed0;                            /* --seed: the first seed */
  train_data data;                           /* the data of seed seed_k */
} session;

/* Each recipe loaded (every error of a bad one listed): 0, or 1 after the messages. */
static int load_recipes(const train_args *a, const hq_recipe_opts *ro, session *s) {
  for (size_t i = 0; i < a->recipes.n; i++) {
    struct stat st;
    char path[CLI_PATH_MAX];
    const char *file = cli_recipe_path(CMD, a->recipes.v[i], path);
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
    cli_warn_role_traps(r, "train", file);
  }
  return 0;
}

/* --baseline NAME: the run of that name or of that --recipe file: its index, or -1 after the
   message naming the choices. */
static int find_baseline(const train_args *a, const session *s) {
  for (int i = 0; i < s->n_runs; i++)
    if (!strcmp(s->runs[i].name, a->baseline_s) || !strcmp(a->recipes.v[i], a->baseline_s))
      return i;
  char names[2048] = "";
  size_t k = 0;
  for (int i = 0; i < s->n_runs && k < sizeof names; i++) {
    int w = snprintf(names + k, sizeof names - k, "%s'%s'", i ? ", " : "", s->runs[i].name);
    if (w > 0) k += (size_t)w;
  }
  cli_fail(2, CMD, "--baseline '%s' is not fp32, bf16-direct, none, nor a recipe given (%s)",
           a->baseline_s, names);
  return -1;
}

/* Name each run (the recipe's name, else its file's; the same one again: name#2), pick the
   baseline (--baseline: the built-in FP32 run, added here, by default; a recipe; none): 0, or
   the exit status after the message. */
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
  }
  if (a->baseline_s && !strcmp(a->baseline_s, "none")) return 0;
  if (is_direct(a->baseline_s)) {
    run *rn = &s->runs[s->n_runs];
    if (hq_recipe_load_string(builtin_direct, "bf16-direct (cuBLASLt, built in)", ro,
                              &rn->recipe))
      return cli_fail(1, CMD, "the built-in bf16-direct run: %s", hq_last_error());
    s->baseline = s->n_runs++;
    rn->high_precision = 1;
    rn->builtin = 1;
    rn->direct = 1;
    snprintf(rn->name, sizeof rn->name, "bf16-direct");
    for (int i = 0; i < s->baseline; i++)   /* a recipe of that name keeps it */
      if (!strcmp(s->runs[i].name, "bf16-direct"))
        snprintf(rn->name, sizeof rn->name, "bf16-direct-builtin");
    return 0;
  }
  if (a->baseline_s && strcmp(a->baseline_s, "fp32")) {
    s->baseline = find_baseline(a, s);
    return s->baseline < 0 ? 2 : 0;
  }
  run *rn = &s->runs[s->n_runs];
  if (hq_recipe_load_string(builtin_baseline, "fp32 baseline (built in)", ro, &rn->recipe))
    return cli_fail(1, CMD, "the built-in baseline: %s", hq_last_error());
  s->baseline = s->n_runs++;
  rn->high_precision = 1;
  rn->builtin = 1;
  snprintf(rn->name, sizeof rn->name, "fp32");
  for (int i = 0; i < s->baseline; i++)   /* a recipe of that name keeps it */
    if (!strcmp(s->runs[i].name, "fp32")) snprintf(rn->name, sizeof rn->name, "fp32-builtin");
  return 0;
}

/* An output FILE (--checkpoint, --graph-dot) with several runs: one file per run,
   FILE-NAME.ext (a new string, NULL when out of memory). */
static char *named_path(const char *file, const char *name) {
  const size_t len = strlen(file) + strlen(name) + 2;
  char *path = malloc(len), *nm = strdup(name);
  if (path && nm) {
    for (char *p = nm; *p; p++)
      if (*p == '/' || *p == ' ') *p = '_';
    const char *slash = strrchr(file, '/'), *dot = strrchr(file, '.');
    if (dot && (!slash || dot > slash + 1))
      snprintf(path, len, "%.*s-%s%s", (int)(dot - file), file, nm, dot);
    else snprintf(path, len, "%s-%s", file, nm);
  } else {
    free(path);
    path = NULL;
  }
  free(nm);
  return path;
}

/* The file run i writes with `seed` for an option's FILE `path` (--checkpoint, --graph-dot; a
   new string, NULL when out of memory): FILE for one run, else one file per run, and per seed
   with --seeds. */
static char *run_file(const char *path, const session *s, int i, uint64_t seed) {
  if (s->n_runs * s->n_seeds <= 1) return strdup(path);
  char run_name[160]; /* a run's name is under 128 bytes: never cut */
  if (s->n_seeds > 1)
    snprintf(run_name, sizeof run_name, "%s-seed%llu", s->runs[i].name, (unsigned long long)seed);
  else snprintf(run_name, sizeof run_name, "%s", s->runs[i].name);
  return named_path(path, run_name);
}

/* What a run says after it trained: resumed, saved, verified. 1 when the verification failed. */
static int run_said(const train_args *a, const train_config *cfg, const run *rn,
                    const train_result *r, FILE *po) {
  if (cfg->resume_path)
    fprintf(po, "hq train: %s: resumed at step %lld (checkpoint loaded in %.1f ms)\n", rn->name,
            (long long)r->resumed_from, 1e3 * r->ckpt_load_s);
  if (cfg->graph_dot && r->graph_replays > 0)
    fprintf(po, "hq train: %s: the captured step's graph written to %s (Graphviz dot)\n",
            rn->name, cfg->graph_dot);
  if (cfg->ckpt_path)
    fprintf(po, "hq train: %s: checkpoint %s: %lld save%s, the last at step %lld (%lld bytes, "
                "saved in %.1f ms)\n",
            rn->name, cfg->ckpt_path, (long long)r->ckpt_saves, r->ckpt_saves == 1 ? "" : "s",
            (long long)a->steps, (long long)r->ckpt_bytes, 1e3 * r->ckpt_save_s);
  if (r->ranks > 1 && train_dist_rank(cfg->model.dist) == 0)   /* docs/distributed.md */
    fprintf(po, "hq train: %s: %d ranks: per step and rank, quantized weights gathered %llu "
                "bytes (a BF16 all-gather: %llu, %.3fx), %s weight gradients reduce-scattered "
                "%llu bytes\n",
            rn->name, r->ranks, (unsigned long long)r->wire_gathered,
            (unsigned long long)r->wire_bf16,
            r->wire_bf16 ? (double)r->wire_gathered / (double)r->wire_bf16 : 0.0,
            cfg->model.grad_bf16 ? "BF16" : "FP32", (unsigned long long)r->wire_reduced);
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
  char err[2048];
  int verify_failed = 0;
  s->n_done = 0;
  for (int i = 0; i < s->n_runs; i++) {
    run *rn = &s->runs[i];
    progress_state ps = {po, s->seed_k * s->n_runs + i + 1, s->n_runs * s->n_seeds};
    char *cpath = NULL, *dpath = NULL;
    if ((a->ckpt_path && !(cpath = run_file(a->ckpt_path, s, i, cfg->seed))) ||
        (a->graph_dot && !(dpath = run_file(a->graph_dot, s, i, cfg->seed)))) {
      free(cpath);
      return cli_fail(-1, CMD, "out of memory");
    }
    cfg->ckpt_path = cpath;
    cfg->graph_dot = dpath;
    /* --resume: the recipe's run (the first; the baseline added after it trains from scratch) */
    cfg->resume_path = i == 0 ? a->resume_path : NULL;
    if (cfg->resume_path)
      fprintf(po, "hq train: %s: resuming from %s\n", rn->name, cfg->resume_path);
    train_result *r = s->seed_k ? &rn->more[s->seed_k - 1] : &rn->res;
    cfg->model.direct = rn->direct;
    const int failed =
        train_run(cfg, &s->data, rn->recipe, rn->name, on_progress, &ps, r, err, sizeof err);
    if (!failed) {
      r->high_precision = rn->high_precision;
      rn->done = 1;
      s->n_done = i + 1;
      verify_failed |= run_said(a, cfg, rn, r, po);
    }
    cfg->ckpt_path = a->ckpt_path;
    cfg->graph_dot = NULL;
    free(cpath);
    free(dpath);
    if (failed) return cli_fail(-1, CMD, "%s", err);
  }
  return verify_failed;
}

/* --seeds: a run's statistics over its seeds. sd: the sample standard deviation across seeds;
   the gap is paired (each seed's eval loss minus the baseline's of the same seed: the same split,
   data order and initial weights), its standard error sd/sqrt(n); a gap exceeds the seed noise
   when |mean| > 2 standard errors (about a 95% two-sided test for many seeds; with 2 or 3 the
   standard error is itself rough, and a tiny gap that every seed shares is marked too). NaN
   where undefined. */
typedef struct seed_stats {
  int n;
  double train_mean, train_sd, eval_mean, eval_sd, gap_mean, gap_se, time_mean, rate_mean;
  int exceeds;                               /* 1, 0, or -1: undefined (no baseline, 1 seed) */
} seed_stats;

static void mean_sd(const double *v, int n, double *mean, double *sd) {
  double m = 0, q = 0;
  for (int k = 0; k < n; k++) m += v[k];
  m /= n;
  for (int k = 0; k < n; k++) q += (v[k] - m) * (v[k] - m);
  *mean = m;
  *sd = n > 1 ? sqrt(q / (n - 1)) : NAN;
}

static void run_stats(const session *s, int i, seed_stats *st) {
  double tr[MAX_SEEDS], ev[MAX_SEEDS], gap[MAX_SEEDS], t[MAX_SEEDS], rate[MAX_SEEDS], sd;
  const int n = s->n_seeds;
  for (int k = 0; k < n; k++) {
    const train_result *r = run_seed(&s->runs[i], k);
    tr[k] = r->train_loss;
    ev[k] = r->eval_loss;
    t[k] = r->total_s;
    rate[k] = r->tokens_per_s;
    gap[k] = s->baseline >= 0 ? r->eval_loss - run_seed(&s->runs[s->baseline], k)->eval_loss : NAN;
  }
  st->n = n;
  mean_sd(tr, n, &st->train_mean, &st->train_sd);
  mean_sd(ev, n, &st->eval_mean, &st->eval_sd);
  mean_sd(t, n, &st->time_mean, &sd);
  mean_sd(rate, n, &st->rate_mean, &sd);
  mean_sd(gap, n, &st->gap_mean, &sd);
  st->gap_se = sd / sqrt((double)n);
  st->exceeds = s->baseline < 0 || i == s->baseline || n < 2
                    ? -1
                    : fabs(st->gap_mean) > 2 * st->gap_se;
}

/* The host CPU's model name: the first "model name" line of /proc/cpuinfo, "" where there is none
   (another OS, or an architecture whose cpuinfo names no model). */
static void host_cpu_model(char *out, size_t n) {
  out[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10)) continue;
    const char *v = strchr(line, ':');
    if (v) {
      v += strspn(v + 1, " \t") + 1;
      snprintf(out, n, "%s", v);
      size_t e = strlen(out); /* without the line's end and trailing blanks */
      while (e > 0 && (out[e - 1] == '\n' || out[e - 1] == ' ' || out[e - 1] == '\t')) e--;
      out[e] = '\0';
    }
    break;
  }
  fclose(f);
}

/* The machine the run's throughput was measured on: a default-size step is paced partly by the
   host, so runs on two machines of one GPU kind may differ by the host alone. */
static void machine_json(json *j, const train_args *a) {
  char gpu[256] = "", cpu[256];
  int arch = 0;
  if (a->device != HQ_DEVICE_HOST && hq_device_info(a->device, gpu, sizeof gpu, &arch) != HQ_OK)
    gpu[0] = '\0';
  host_cpu_model(cpu, sizeof cpu);
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  json_key(j, "machine");
  json_obj(j);
  json_kstr_or_null(j, "gpu", gpu);
  json_key(j, "sm");
  if (gpu[0]) json_int(j, arch);
  else json_null(j);
  json_kstr_or_null(j, "host_cpu", cpu);
  json_kint(j, "host_cpus", ncpu > 0 ? ncpu : 0);
  json_close_obj(j);
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
  json_kint(j, "seeds", s->n_seeds);
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
  json_kstr(j, "preset", a->preset);
  json_kstr(j, "cuda_graph", a->cuda_graph_s);
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

/* --seeds: every seed's losses and the statistics of the table (the keys above are the first
   seed's run). */
static void seeds_json(json *j, const session *s, int i) {
  seed_stats st;
  run_stats(s, i, &st);
  json_key(j, "per_seed");
  json_arr(j);
  for (int k = 0; k < s->n_seeds; k++) {
    const train_result *r = run_seed(&s->runs[i], k);
    json_obj(j);
    json_kint(j, "seed", (int64_t)(s->seed0 + (uint64_t)k));
    json_knum(j, "train_loss", r->train_loss);
    json_knum(j, "eval_loss", r->eval_loss);
    json_knum(j, "gap", s->baseline >= 0
                            ? r->eval_loss - run_seed(&s->runs[s->baseline], k)->eval_loss
                            : NAN);
    json_knum(j, "total_seconds", r->total_s);
    json_close_obj(j);
  }
  json_close_arr(j);
  json_key(j, "stats");
  json_obj(j);
  json_kint(j, "seeds", st.n);
  json_knum(j, "train_loss_mean", st.train_mean);
  json_knum(j, "train_loss_sd", st.train_sd);
  json_knum(j, "eval_loss_mean", st.eval_mean);
  json_knum(j, "eval_loss_sd", st.eval_sd);
  json_knum(j, "gap_mean", i == s->baseline ? NAN : st.gap_mean);
  json_knum(j, "gap_se", i == s->baseline ? NAN : st.gap_se);
  json_key(j, "gap_exceeds_noise");
  if (st.exceeds < 0) json_null(j);
  else json_bool(j, st.exceeds);
  json_close_obj(j);
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
  json_kbool(j, "direct", rn->direct);
  json_knum(j, "step0_loss", r->step0_loss);
  json_knum(j, "train_loss", r->train_loss);
  json_knum(j, "eval_loss", r->eval_loss);
  json_knum(j, "gap", s->baseline >= 0 ? r->eval_loss - s->runs[s->baseline].res.eval_loss : NAN);
  json_knum(j, "train_seconds", r->train_s);
  json_knum(j, "total_seconds", r->total_s);
  json_kint(j, "tokens", r->tokens);
  json_knum(j, "tokens_per_second", r->tokens_per_s);
  json_knum(j, "speed_vs_baseline",
            s->baseline >= 0 ? r->tokens_per_s / s->runs[s->baseline].res.tokens_per_s : NAN);
  json_kint(j, "resumed_from", r->resumed_from);
  /* --cuda-graph: the steps replayed from the captured graph, and why none were (null: it
     captured, or it was off, or the CPU) */
  json_kint(j, "graph_replays", r->graph_replays);
  json_kint(j, "graph_replays_ahead", r->graph_ahead);
  json_kint(j, "graph_kernels", r->graph_nodes[TRAIN_GRAPH_KERNELS]);
  json_kint(j, "graph_copies", r->graph_nodes[TRAIN_GRAPH_COPIES]);
  json_kint(j, "graph_memsets", r->graph_nodes[TRAIN_GRAPH_MEMSETS]);
  json_kint(j, "graph_allocs", r->graph_nodes[TRAIN_GRAPH_ALLOCS]);
  json_kint(j, "graph_other", r->graph_nodes[TRAIN_GRAPH_OTHER]);
  json_kbool(j, "graph_batch_mapped", r->batch_mapped);
  json_kbool(j, "graph_side_stream", r->side_lane);
  json_kint(j, "graph_side_splits", r->side_splits);
  json_kint(j, "graph_side_amaxes", r->side_amaxes);
  json_kint(j, "graph_side_wgrads", r->side_wgrads);
  json_kint(j, "graph_side_writebacks", r->side_writebacks);
  json_kstr_or_null(j, "graph_note", r->graph_note);
  json_key(j, "resume_verified");
  if (!a->verify_resume) json_null(j);
  else json_bool(j, r->verified == 1);
  /* the train curve: step 0, then the mean of each log interval */
  train_point *pts = malloc(((size_t)r->n_train_curve + 2) * sizeof *pts);
  curve_json(j, "train_curve", pts, pts ? window_means(r, cfg->log_every, pts) : 0);
  free(pts);
  curve_json(j, "eval_curve", r->eval_curve, r->n_eval_curve);
  seeds_json(j, s, i);
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
  train_report_profile_json(j, r);
  json_close_obj(j);
}

static void report_json(const train_args *a, const train_config *cfg, const session *s) {
  json j;
  json_begin(&j, stdout);
  json_obj(&j);
  config_json(&j, a, cfg, s);
  machine_json(&j, a);
  json_key(&j, "baseline");
  if (s->baseline >= 0) json_str(&j, s->runs[s->baseline].name);
  else json_null(&j);
  json_key(&j, "recipes");
  json_arr(&j);
  for (int i = 0; i < s->n_runs; i++) run_json(&j, a, cfg, s, i);
  json_close_arr(&j);
  json_close_obj(&j);
  json_end(&j);
}

/* The table of --seeds N > 1: means, spreads and which gaps exceed the seed noise. */
static void report_seeds_text(const train_config *cfg, const session *s) {
  printf("\n%-30s %10s %10s %7s %12s %7s %8s %10s\n", "recipe", "train loss", "eval loss", "sd",
         "gap vs base", "se", "time", "tokens/s");
  for (int i = 0; i < s->n_runs; i++) {
    seed_stats st;
    run_stats(s, i, &st);
    char gap[32] = "-", se[32] = "-", t[32], rate[32];
    if (i == s->baseline) snprintf(gap, sizeof gap, "(baseline)");
    else if (s->baseline >= 0) {
      snprintf(gap, sizeof gap, "%+.4f%s", st.gap_mean, st.exceeds == 1 ? " *" : "  ");
      snprintf(se, sizeof se, "%.4f", st.gap_se);
    }
    snprintf(t, sizeof t, "%.1fs", st.time_mean);
    fmt_rate(st.rate_mean, rate, sizeof rate);
    printf("%-30s %10.4f %10.4f %7.4f %12s %7s %8s %10s\n", s->runs[i].name, st.train_mean,
           st.eval_mean, st.eval_sd, gap, se, t, rate);
  }
  const long long s0 = (long long)s->seed0;
  printf("\n%d seeds (%lld..%lld), each its own split, data order and initial weights; train and "
         "eval loss: the mean over the seeds (train: of the last %lld steps; eval: the whole "
         "held-out set), sd: the eval loss's standard deviation across seeds; ",
         s->n_seeds, s0, s0 + s->n_seeds - 1, (long long)cfg->log_every);
  if (s->baseline >= 0)
    printf("gap: the mean of each seed's eval loss minus the baseline's (%s) of the same seed, "
           "se: its standard error; * : |gap| > 2 se, a difference larger than the seed noise; ",
           s->runs[s->baseline].name);
  else printf("no baseline (--baseline none); ");
  printf("time, tokens/s: the mean per seed; ln(27) = 3.2958 is a uniform guess\n");
}

static void report_text(const train_config *cfg, const session *s) {
  if (s->n_seeds > 1) report_seeds_text(cfg, s);
  else {
    const double base_eval = s->baseline >= 0 ? s->runs[s->baseline].res.eval_loss : NAN;
    printf("\n%-30s %10s %10s %12s %8s %10s\n", "recipe", "train loss", "eval loss",
           "gap vs base", "time", "tokens/s");
    for (int i = 0; i < s->n_runs; i++) {
      const train_result *r = &s->runs[i].res;
      char gap[32], t[32], rate[32], nm[160];
      if (i == s->baseline) snprintf(gap, sizeof gap, "(baseline)");
      else if (s->baseline < 0) snprintf(gap, sizeof gap, "-");
      else snprintf(gap, sizeof gap, "%+.4f", r->eval_loss - base_eval);
      snprintf(t, sizeof t, "%.1fs", r->total_s);
      fmt_rate(r->tokens_per_s, rate, sizeof rate);
      snprintf(nm, sizeof nm, "%s", s->runs[i].name);
      printf("%-30s %10.4f %10.4f %12s %8s %10s\n", nm, r->train_loss, r->eval_loss, gap, t,
             rate);
    }
    printf("\ntrain loss: mean of the last %lld steps; eval loss: the whole held-out set (%lld "
           "examples) after the last step; ",
           (long long)cfg->log_every, (long long)s->data.n_eval);
    if (s->baseline >= 0)
      printf("gap: eval loss minus the baseline's (%s); ", s->runs[s->baseline].name);
    else printf("no baseline (--baseline none); ");
    printf("ln(27) = 3.2958 is a uniform guess\n");
  }
  if (s->baseline >= 0 && s->runs[s->baseline].direct) {
    /* issue 48's measure: hq's step against the same step calling cuBLASLt directly */
    printf("\ntokens/s against %s (the same model and step, its GEMMs on cuBLASLt directly):\n",
           s->runs[s->baseline].name);
    for (int i = 0; i < s->n_runs; i++) {
      seed_stats st, sb;
      run_stats(s, i, &st);
      run_stats(s, s->baseline, &sb);
      printf("  %-30s %.3fx\n", s->runs[i].name, st.rate_mean / sb.rate_mean);
    }
  }
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
  if (s->runs[0].res.peak_bytes >= 0) {
    printf("\npeak device memory (this process's: hq's pool high-water over the run, above its "
           "level before the run, plus CUDA graphs'):\n");
    for (int i = 0; i < s->n_runs; i++) {
      char b[32];
      train_report_bytes(s->runs[i].res.peak_bytes, b, sizeof b);
      printf("  %-30s %s\n", s->runs[i].name, b);
    }
  }
  int graphs = 0;
  for (int i = 0; i < s->n_runs; i++) graphs += s->runs[i].res.graph_replays > 0;
  if (graphs) {
    printf("\nthe step's CUDA graph (--cuda-graph on; each node is one launch every replay "
           "runs):\n");
    for (int i = 0; i < s->n_runs; i++) {
      const train_result *r = &s->runs[i].res;
      const int *g = r->graph_nodes;
      if (r->graph_replays > 0) {
        printf("  %-30s %d kernels, %d copies, %d memsets, %d allocations and frees, %d other\n",
               s->runs[i].name, g[TRAIN_GRAPH_KERNELS], g[TRAIN_GRAPH_COPIES],
               g[TRAIN_GRAPH_MEMSETS], g[TRAIN_GRAPH_ALLOCS], g[TRAIN_GRAPH_OTHER]);
        if (r->side_lane)
          printf("  %-30s on a second stream: %d wgrad%s, %d columnwise cop%s, %d weight "
                 "write-back%s\n", "", r->side_wgrads, r->side_wgrads == 1 ? "" : "s",
                 r->side_splits, r->side_splits == 1 ? "y" : "ies", r->side_writebacks,
                 r->side_writebacks == 1 ? "" : "s");
      }
      else printf("  %-30s (not captured)\n", s->runs[i].name);
    }
  }
  for (int i = 0; i < s->n_runs; i++)
    train_report_profile_text(stdout, s->runs[i].name, &s->runs[i].res);
}

/* s quoted for gnuplot's single-quoted strings ('' inside) */
static void gp_quoted(FILE *g, const char *s) {
  fputc('\'', g);
  for (const char *p = s; *p; p++) {
    if (*p == '\'') fputc('\'', g);
    fputc(*p, g);
  }
  fputc('\'', g);
}

/* "dir/name" (a new string, NULL when out of memory). */
static char *path_join(const char *dir, const char *name) {
  const size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* The directory of path (a new string: "." for a bare name, "/" for the root), NULL when out
   of memory. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  const size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = '\0';
  }
  return d;
}

/* gnuplot reading a script on a pipe, its stderr into a temporary file (*errpath, a new string)
   so that a failure can say what gnuplot said. NULL after the message. */
static FILE *gnuplot_open(const char *file, char **errpath) {
  const char *td = getenv("TMPDIR");
  char *ep = path_join(td && *td ? td : "/tmp", "hq-train-gnuplot.XXXXXX");
  char *cmd = ep ? malloc(4 * strlen(ep) + 16) : NULL;   /* each ' quoted as 4 bytes */
  *errpath = NULL;
  if (!cmd) {
    free(ep);
    cli_fail(1, CMD, "--plot %s: out of memory", file);
    return NULL;
  }
  const int fd = mkstemp(ep);
  if (fd < 0) {
    cli_fail(1, CMD, "--plot %s: a temporary file %s: %s", file, ep, strerror(errno));
    free(ep);
    free(cmd);
    return NULL;
  }
  close(fd);
  size_t k = (size_t)sprintf(cmd, "gnuplot 2>'");
  for (const char *p = ep; *p; p++) {
    if (*p == '\'') {   /* ' as '\'' in a single-quoted shell word */
      memcpy(cmd + k, "'\\''", 4);
      k += 4;
    } else cmd[k++] = *p;
  }
  memcpy(cmd + k, "'", 2);
  FILE *g = popen(cmd, "w");
  free(cmd);
  if (!g) {
    cli_fail(1, CMD, "--plot %s: cannot run gnuplot: %s", file, strerror(errno));
    remove(ep);
    free(ep);
    return NULL;
  }
  *errpath = ep;
  return g;
}

/* Wait for gnuplot: 0, or 1 after a message with what gnuplot wrote on stderr (warnings of a
   successful run are passed on). errpath (gnuplot_open's) is removed and freed. */
static int gnuplot_close(FILE *g, char *errpath, const char *file, const char *what) {
  const int st = pclose(g);
  char msg[2048] = "";
  FILE *e = fopen(errpath, "r");
  if (e) {
    size_t n = fread(msg, 1, sizeof msg - 1, e);
    msg[n] = '\0';
    fclose(e);
  }
  remove(errpath);
  free(errpath);
  for (size_t n = strlen(msg); n && (msg[n - 1] == '\n' || msg[n - 1] == ' '); n--)
    msg[n - 1] = '\0';
  if (st == 0) {
    if (*msg) fprintf(stderr, "%s\n", msg);
    return 0;
  }
  char how[64];
  if (st > 0 && WIFEXITED(st)) snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(st));
  else snprintf(how, sizeof how, "status %d", st);
  return cli_fail(1, CMD, "--plot %s: gnuplot failed %s (%s)%s%s", file, what, how,
                  *msg ? ": " : "", msg);
}

/* The held-out gap of run i to the baseline at every eval step, the mean over the seeds and
   mean +- 2 standard errors (the table's rule): rows "step mean low high" into g. */
static void gap_points(FILE *g, const session *s, int i) {
  const train_result *r0 = &s->runs[i].res;
  for (int64_t p = 0; p < r0->n_eval_curve; p++) {
    const int64_t step = r0->eval_curve[p].step;
    double v[MAX_SEEDS];
    int n = 0;
    for (int k = 0; k < s->n_seeds; k++) {
      const train_result *r = run_seed(&s->runs[i], k), *b = run_seed(&s->runs[s->baseline], k);
      for (int64_t q = 0; q < b->n_eval_curve && p < r->n_eval_curve; q++)
        if (b->eval_curve[q].step == step) {
          v[n++] = r->eval_curve[p].loss - b->eval_curve[q].loss;
          break;
        }
    }
    if (n < s->n_seeds) continue;   /* the baseline has no eval at that step */
    double mean, sd;
    mean_sd(v, n, &mean, &sd);
    const double half = n > 1 ? 2 * sd / sqrt((double)n) : 0;
    fprintf(g, "%lld %.6f %.6f %.6f\n", (long long)step, mean, mean - half, mean + half);
  }
}

/* --plot: two panels drawn by gnuplot (fed on a pipe, data inline), the legend in a column of
   its own to the right so that it covers no curve. Above: every recipe's train loss (the mean
   of each `window` steps, solid) and held-out loss (dashed, points), the mean over the seeds.
   Below: each recipe's held-out loss minus the baseline's at every eval, the number the table
   reports at the last step (the same data, batches and initial weights: the difference is the
   recipe's effect), with --seeds a band of +- 2 standard errors over the seeds. Without a
   baseline only the upper panel. */
static int plot(const char *file, const session *s, int64_t window, int64_t eval_batches,
                const char *title) {
  static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                       "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
                                       "#000000", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78",
                                       "#c5b0d5", "#c49c94"};
  const int nc = (int)(sizeof colors / sizeof *colors);
  const int n_runs = s->n_runs, baseline = s->baseline;
  const size_t cap = (size_t)s->runs[0].res.n_train_curve + 2;
  train_point *pts = malloc(cap * sizeof *pts), *sum = calloc(cap, sizeof *sum);
  if (!pts || !sum) {
    free(pts);
    free(sum);
    return cli_fail(1, CMD, "--plot: out of memory");
  }
  /* gnuplot draws into a temporary file beside the plot, renamed over it once it succeeded */
  cli_out o;
  char *errpath = NULL;
  FILE *g = NULL;
  if (!cli_out_open(CMD, "--plot", file, &o)) {
    fclose(o.f);
    o.f = NULL;
    if (!(g = gnuplot_open(file, &errpath))) cli_out_abort(&o);
  }
  if (!g) {
    free(pts);
    free(sum);
    return 1;
  }
  /* pngcairo draws dashes and antialiases; gnuplot without cairo has only png */
  fputs("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1500,1000 "
        "font ',11' } else { set terminal png size 1500,1000 }\nset output ", g);
  gp_quoted(g, o.tmp);
  fputs("\n", g);
  for (int i = 0; i < n_runs; i++) {
    int64_t n = 0;
    for (int k = 0; k < s->n_seeds; k++) {   /* the mean curve over the seeds */
      n = window_means(run_seed(&s->runs[i], k), window, pts);
      for (int64_t q = 0; q < n; q++) sum[q] = (train_point){pts[q].step, (k ? sum[q].loss : 0) +
                                                                             pts[q].loss};
    }
    fprintf(g, "$train%d << EOD\n", i);
    for (int64_t q = 0; q < n; q++)
      fprintf(g, "%lld %.6f\n", (long long)sum[q].step, sum[q].loss / s->n_seeds);
    fprintf(g, "EOD\n$eval%d << EOD\n", i);
    const train_result *r0 = &s->runs[i].res;
    for (int64_t q = 0; q < r0->n_eval_curve; q++) {
      double e = 0;
      for (int k = 0; k < s->n_seeds; k++) {
        const train_result *r = run_seed(&s->runs[i], k);
        e += q < r->n_eval_curve ? r->eval_curve[q].loss : NAN;
      }
      fprintf(g, "%lld %.6f\n", (long long)r0->eval_curve[q].step, e / s->n_seeds);
    }
    fprintf(g, "EOD\n");
    if (baseline >= 0 && i != baseline) {
      fprintf(g, "$gap%d << EOD\n", i);
      gap_points(g, s, i);
      fprintf(g, "EOD\n");
    }
  }
  free(pts);
  free(sum);
  const int panels = baseline >= 0 && n_runs > 1;
  fprintf(g, "set multiplot\nset grid\nset lmargin at screen 0.07\nset rmargin at screen 0.74\n"
             "set key at screen 0.755, screen 0.95 left top Left reverse noenhanced samplen 3 "
             "spacing 1.3 box opaque title 'recipes'\n"
             "set title \"%s\" noenhanced\n",
          title);
  if (panels) fprintf(g, "set tmargin at screen 0.95\nset bmargin at screen 0.45\n");
  else fprintf(g, "set tmargin at screen 0.95\nset bmargin at screen 0.08\nset xlabel 'step'\n");
  fprintf(g, "set ylabel 'loss (nats): train, mean of %lld steps (solid); held-out (dashed)'\nplot ",
          (long long)window);
  for (int i = 0; i < n_runs; i++) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", s->runs[i].name, i == baseline ? " (baseline)" : "");
    for (char *p = name; *p; p++)
      if (*p == '"' || *p == '\\') *p = '_';
    fprintf(g, "%s$train%d with lines lw 1.5 lc rgb '%s' title \"%s\", "
               "$eval%d with linespoints lw 2 dt 2 pt 7 ps 1.1 lc rgb '%s' notitle",
            i ? ", " : "", i, colors[i % nc], name, i, colors[i % nc]);
  }
  if (panels) {
    char band[128] = "", before[64] = "the whole set";
    if (eval_batches > 0)
      snprintf(before, sizeof before, "its first %lld batches", (long long)eval_batches);
    if (s->n_seeds > 1)
      snprintf(band, sizeof band, "; band: +-2 standard errors over %d seeds", s->n_seeds);
    fprintf(g, "\nunset key\nset tmargin at screen 0.38\nset bmargin at screen 0.06\n"
               "set title \"held-out loss minus %s's: the table's gap at the last step "
               "(before it: %s)%s\" noenhanced\n"
               "set xlabel 'step'\nset ylabel 'held-out gap (nats)'\n"
               "set style fill transparent solid 0.15 noborder\n"
               "plot 0 with lines lc rgb '#444444' lw 1 notitle",
            s->runs[baseline].name, before, band);
    for (int i = 0; i < n_runs; i++) {
      if (i == baseline) continue;
      if (s->n_seeds > 1)
        fprintf(g, ", $gap%d using 1:3:4 with filledcurves lc rgb '%s' notitle", i,
                colors[i % nc]);
      fprintf(g, ", $gap%d using 1:2 with linespoints lw 2 pt 7 ps 1.1 lc rgb '%s' notitle", i,
              colors[i % nc]);
    }
  }
  fprintf(g, "\nunset multiplot\n");
  if (gnuplot_close(g, errpath, file, "drawing the plot")) {
    cli_out_abort(&o);
    return 1;
  }
  if (cli_out_commit(&o, 1)) return 1;
  fprintf(stderr, "hq train: loss curves drawn in %s\n", file);
  return 0;
}

/* The directory of `target` (the file `path` names: cli_output_path) is one a file can be
   created in: 0, or 1 after the message. Tried by creating a file there: access() says yes to
   root on a read-only directory and knows nothing of a full quota. The file is removed, or with
   `keep` handed over in *keep (a new string) for the caller to use and remove. */
static int check_dir(const char *opt, const char *path, const char *target, char **keep) {
  char *dir = dir_of(target), *probe = dir ? path_join(dir, ".hq-train-probe.XXXXXX") : NULL;
  struct stat st;
  int rc = 0, fd;
  if (keep) *keep = NULL;
  if (!probe) rc = cli_fail(1, CMD, "out of memory");
  else if (stat(dir, &st) != 0)
    rc = cli_fail(1, CMD, "%s %s: the directory %s: %s", opt, path, dir, strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    rc = cli_fail(1, CMD, "%s %s: %s is not a directory", opt, path, dir);
  else if ((fd = mkstemp(probe)) < 0)
    rc = cli_fail(1, CMD, "%s %s: cannot create a file in %s: %s", opt, path, dir,
                  strerror(errno));
  else {
    close(fd);
    if (keep) *keep = probe, probe = NULL;
    else remove(probe);
  }
  free(dir);
  free(probe);
  return rc;
}

/* gnuplot draws a small PNG into `probe` (check_dir's file in the directory --plot writes to):
   0, or 1 after the message with gnuplot's own words. */
static int check_gnuplot(const char *file, const char *probe) {
  char *errpath;
  FILE *g = gnuplot_open(file, &errpath);
  if (!g) return 1;
  fputs("set terminal png size 320,240\nset output ", g);
  gp_quoted(g, probe);
  fputs("\nplot x notitle\nunset output\n", g);
  int rc = gnuplot_close(g, errpath, file, "on a test plot before the first step");
  struct stat st;
  if (!rc && (stat(probe, &st) != 0 || st.st_size == 0)) {
    char *dir = dir_of(probe);
    rc = cli_fail(1, CMD, "--plot %s: gnuplot wrote nothing to a test plot in %s", file,
                  dir ? dir : probe);
    free(dir);
  }
  return rc;
}

/* A file a save will write: the output rule (cli_output_path), its directory, and the
   checkpoint writer's own open (its temporary file, of the name a save makes, created and
   removed): 0, or 1 after the message. */
static int check_ckpt(const char *file) {
  char *target = NULL;
  hq_ckpt_writer *w = NULL;
  int rc = cli_output_path(CMD, "--checkpoint", file, &target) ||
           check_dir("--checkpoint", file, target, NULL);
  if (!rc && hq_ckpt_writer_open(file, &w))
    rc = cli_fail(1, CMD, "--checkpoint: %s", hq_last_error());
  hq_ckpt_writer_abort(w);
  free(target);
  return rc;
}

/* Every output path checked before the first step (a run must not train for an hour and then
   fail to save): every file the runs save to (with {step}: the last step's, the longest name)
   and --graph-dot's and --plot's are files hq may write (cli_output_path) in directories that
   can be written, gnuplot can draw a PNG there. Without gnuplot --plot is a message (now) and
   no plot: 0, or 1 after the message. */
static int check_outputs(train_args *a, const session *s) {
  /* the path as given first where the runs write beside it (several runs, or {step}: it must
     not name a device either), and its directory: {step} and -NAME change only the files'
     names; one run without {step} writes that very file, which check_ckpt checks below */
  const int beside = s->n_runs * s->n_seeds > 1 || (a->ckpt_path && strstr(a->ckpt_path, "{step}"));
  if (a->ckpt_path && beside &&
      (cli_output_path(CMD, "--checkpoint", a->ckpt_path, NULL) ||
       check_dir("--checkpoint", a->ckpt_path, a->ckpt_path, NULL)))
    return 1;
  for (int k = 0; a->ckpt_path && k < s->n_seeds; k++)
    for (int i = 0; i < s->n_runs; i++) {
      char *file = run_file(a->ckpt_path, s, i, s->seed0 + (uint64_t)k);
      char *last = file ? train_step_path(file, a->steps) : NULL;
      const int rc = last ? check_ckpt(last) : cli_fail(1, CMD, "out of memory");
      free(file);
      free(last);
      if (rc) return 1;
    }
  if (a->graph_dot && (cli_output_path(CMD, "--graph-dot", a->graph_dot, NULL) ||
                       check_dir("--graph-dot", a->graph_dot, a->graph_dot, NULL)))
    return 1;
  if (!a->plot_file) return 0;
  char *target = NULL, *probe = NULL; /* check_dir's file, which gnuplot's test draws into */
  int rc = cli_output_path(CMD, "--plot", a->plot_file, &target) ||
           check_dir("--plot", a->plot_file, target, &probe);
  if (!rc && system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr,
            "hq train: --plot %s: gnuplot is not installed (Debian: apt-get install gnuplot-nox); "
            "no plot will be drawn\n",
            a->plot_file);
    a->plot_file = NULL;
  } else if (!rc) {
    rc = check_gnuplot(a->plot_file, probe);
  }
  if (probe) remove(probe);
  free(probe);
  free(target);
  return rc;
}

/* 12345678 -> "11.8 MiB" */
static const char *fmt_bytes(uint64_t b, char *buf, size_t n) {
  if (b >= (uint64_t)1 << 30) snprintf(buf, n, "%.1f GiB", (double)b / 1073741824.0);
  else snprintf(buf, n, "%.1f MiB", (double)b / 1048576.0);
  return buf;
}

/* The memory a run needs, estimated and printed before anything is allocated; a run that
   cannot fit is refused with both numbers: 0, or 1 after the message. */
static int check_memory(const train_args *a, const train_config *cfg, const session *s,
                        FILE *po) {
  train_memory m;
  train_memory_estimate(cfg, s->n_runs * s->n_seeds, &m);
  uint64_t host = 0, dev = 0;
  char hsrc[256] = "", dsrc[256] = "", b1[32], b2[32], b3[32], b4[32];
  const int host_known = train_memory_available(HQ_DEVICE_HOST, &host, hsrc, sizeof hsrc) == 0;
  const int dev_known = cfg->device != HQ_DEVICE_HOST &&
                        train_memory_available(cfg->device, &dev, dsrc, sizeof dsrc) == 0;
  fprintf(po, "hq train: memory: about %s per run on the host", fmt_bytes(m.host, b1, sizeof b1));
  if (host_known) fprintf(po, " (%s available: %s)", fmt_bytes(host, b2, sizeof b2), hsrc);
  if (cfg->device != HQ_DEVICE_HOST) {
    fprintf(po, ", %s on %s", fmt_bytes(m.device, b1, sizeof b1), a->device_s);
    if (dev_known) fprintf(po, " (%s available: %s)", fmt_bytes(dev, b2, sizeof b2), dsrc);
  }
  fprintf(po, "\n");
  fflush(po);
  const char *where = NULL;
  uint64_t need = 0, have = 0;
  const char *src = NULL;
  if (host_known && m.host > host) where = "host", need = m.host, have = host, src = hsrc;
  else if (dev_known && m.device > dev)
    where = a->device_s, need = m.device, have = dev, src = dsrc;
  if (!where) return 0;
  return cli_fail(1, CMD,
                  "the run needs about %s of %s memory (the model %s: parameters, gradients, "
                  "Adam moments, quantized weights and activations of C=%lld E=%lld H=%lld "
                  "L=%lld, batch %lld; GEMM and quantize temporaries %s), more than the %s "
                  "available (%s): refused before allocating; use a smaller --hidden, --layers "
                  "or --batch",
                  fmt_bytes(need, b1, sizeof b1), where, fmt_bytes(m.model, b2, sizeof b2),
                  (long long)a->context, (long long)a->embed, (long long)a->hidden,
                  (long long)a->layers, (long long)a->batch, fmt_bytes(m.work, b3, sizeof b3),
                  fmt_bytes(have, b4, sizeof b4), src);
}

/* Every run's recipe tried on the model's shapes before the first step, on one context of the
   runs' device, so that a format that refuses one does so now and not after the runs before it
   trained: 0 -- also when no context can be made, which the first run then reports -- or 1 after
   the message naming the recipe, its file, the layer, the role, the format and the shape. */
static int preflight(const train_config *cfg, const session *s) {
  hq_ctx_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.device = cfg->device;
  hq_ctx *ctx;
  if (hq_ctx_create(&desc, &ctx)) return 0;
  char err[2048];
  int rc = 0;
  for (int i = 0; i < s->n_runs && !rc; i++) {
    train_model_cfg mc = cfg->model;
    mc.direct = s->runs[i].direct;
    if (train_recipe_check(s->runs[i].recipe, &mc, ctx, err, sizeof err)) {
      const char *file = hq_recipe_path(s->runs[i].recipe);
      rc = cli_fail(1, CMD, "recipe '%s' (%s): %s (checked before the first step: nothing "
                    "trained)", s->runs[i].name, file ? file : "built in", err);
    }
  }
  hq_ctx_destroy(ctx);
  return rc;
}

/* After a failed run (its message printed), *v is the view of s its report shows: the runs that
   finished -- every run of the seeds before the failed one's, else the runs before it (the
   baseline only if among them). A copy, so that s still owns and frees every run's results.
   Returns 0 when none finished. */
static int finished_view(const session *s, session *v) {
  *v = *s;
  const char *failed = s->runs[s->n_done < s->n_runs ? s->n_done : 0].name;
  if (s->seed_k > 0) v->n_seeds = s->seed_k;
  else {
    v->n_seeds = 1;
    v->n_runs = s->n_done;
    if (v->baseline >= v->n_runs) v->baseline = -1;
  }
  if (v->n_runs > 0)
    fprintf(stderr, "hq train: run '%s' failed (above); the report covers the %d run%s that "
            "finished before it%s\n", failed, v->n_runs * v->n_seeds,
            v->n_runs * v->n_seeds == 1 ? "" : "s",
            s->baseline >= 0 && v->baseline < 0 ? ", without the baseline" : "");
  return v->n_runs > 0;
}

/* "seed S", or with --seeds N "seeds S..S+N-1" */
static const char *seeds_text(const session *s, char *buf, size_t n) {
  if (s->n_seeds > 1)
    snprintf(buf, n, "seeds %llu..%llu", (unsigned long long)s->seed0,
             (unsigned long long)(s->seed0 + (uint64_t)s->n_seeds - 1));
  else snprintf(buf, n, "seed %llu", (unsigned long long)s->seed0);
  return buf;
}

/* Room for the results of seeds 2..N of every run: 0, or 1 after the message. */
static int alloc_seeds(session *s) {
  for (int i = 0; i < s->n_runs && s->n_seeds > 1; i++)
    if (!(s->runs[i].more = calloc((size_t)s->n_seeds - 1, sizeof *s->runs[i].more)))
      return cli_fail(1, CMD, "out of memory");
  return 0;
}

/* --seeds: every run again from seed S+k, on that seed's split of the data: as train_all. */
static int train_next_seed(const train_args *a, train_config *cfg, session *s, int k, FILE *po) {
  char err[2048];
  cfg->seed = s->seed0 + (uint64_t)k;
  s->seed_k = k;
  s->n_done = 0;
  train_data_free(&s->data);
  if (train_data_load(&s->data, a->data_path, 0, (int)a->context, cfg->seed, err, sizeof err))
    return cli_fail(-1, CMD, "%s", err);
  fprintf(po, "hq train: seed %llu: %lld train, %lld held out: %lld / %lld examples\n",
          (unsigned long long)cfg->seed, (long long)s->data.n_train_words,
          (long long)s->data.n_eval_words, (long long)s->data.n_train, (long long)s->data.n_eval);
  return train_all(a, cfg, s, po);
}

static void session_free(session *s) {
  for (int i = 0; i < s->n_runs; i++) {
    for (int k = 1; s->runs[i].more && k < s->n_seeds; k++)
      train_result_free(&s->runs[i].more[k - 1]);
    free(s->runs[i].more);
    train_result_free(&s->runs[i].res);
    hq_recipe_free(s->runs[i].recipe);
  }
  train_data_free(&s->data);
}

int hq_cmd_train(int argc, char **argv) {
  /* the model's size and lr: 0 until --preset fills what no option gave */
  train_args a = {.device_s = "cpu", .act_s = "gelu", .grad_dtype_s = "fp32",
                  .cuda_graph_s = "on", .steps = 1000,
                  .seed = 1, .eval_every = -1, .eval_batches = 8, .log_every = -1, .seeds = 1};
  int status = parse_args(argc, argv, &a);
  if (status != CLI_RUN) return status;
  if (resume_lr(&a)) return 1;
  train_config cfg;
  make_config(&a, &cfg);
  /* the default recipe when none is given */
  char *default_path = NULL;
  if (a.recipes.n == 0) {
    if (!(default_path = default_recipe())) return cli_fail(1, CMD, "out of memory");
    if (access(default_path, R_OK) != 0) {
      cli_fail(1, CMD,
               "no --recipe given and the default recipe %s cannot be read (%s): install hq "
               "(make install), set HQ_CONF_DIR to the directory holding recipe.ini, or give "
               "--recipe FILE",
               default_path, strerror(errno));
      free(default_path);
      return 1;
    }
    a.recipes.v[a.recipes.n++] = default_path;
  }
  char err[2048];
  train_dist *dist;   /* under mpirun: the ranks (docs/distributed.md) */
  if (train_dist_init(&dist, &cfg.device, err, sizeof err)) {
    free(default_path);
    return cli_fail(1, CMD, "%s", err);
  }
  cfg.model.dist = dist;
  session s;
  memset(&s, 0, sizeof s);
  const hq_recipe_opts ro = cli_recipe_opts(&a.dirs);
  status = 1;
  if (is_direct(a.baseline_s) && dist) {   /* its GEMMs are not sharded across ranks */
    status = cli_fail(2, CMD, "--baseline bf16-direct runs in one process, not under mpirun");
    goto out;
  }
  if (a.grad_bf16 && train_dist_size(dist) < 2) {   /* nothing to reduce: refused, not ignored */
    status = cli_fail(2, CMD, "--grad-dtype bf16 rounds the weight gradients for the "
                      "reduce-scatter across ranks, and this run has one rank: run it under "
                      "mpirun -np 2 or more, or leave --grad-dtype out");
    goto out;
  }
  if (load_recipes(&a, &ro, &s)) goto out;
  if ((status = name_runs(&a, &cfg, &ro, &s)) != 0) goto out;
  status = 1;
  s.n_seeds = (int)a.seeds;
  s.seed0 = cfg.seed;
  if (alloc_seeds(&s) || check_outputs(&a, &s)) goto out;
  const int is_default = a.data_path == NULL;
  if (!a.data_path) a.data_path = TRAIN_DEFAULT_DATA;
  if (train_data_load(&s.data, a.data_path, is_default, (int)a.context, cfg.seed, err,
                      sizeof err)) {
    cli_fail(1, CMD, "%s", err);
    goto out;
  }
  FILE *po = a.json && train_dist_rank(dist) == 0 ? stderr : stdout;   /* ranks > 0: none */
  char seeds[64];
  fprintf(po,
          "hq train: %lld words from %s (%lld train, %lld held out: %lld / %lld examples); "
          "model C=%lld E=%lld H=%lld L=%lld %s, batch %lld, %lld steps, lr %g, %s, %s\n",
          (long long)s.data.n_words, a.data_path, (long long)s.data.n_train_words,
          (long long)s.data.n_eval_words, (long long)s.data.n_train, (long long)s.data.n_eval,
          (long long)a.context, (long long)a.embed, (long long)a.hidden, (long long)a.layers,
          a.act_s, (long long)a.batch, (long long)a.steps, a.lr, seeds_text(&s, seeds, sizeof seeds),
          a.device_s);
  if (check_memory(&a, &cfg, &s, po) || preflight(&cfg, &s)) goto out;
  int trained = train_all(&a, &cfg, &s, po);
  for (int k = 1; trained >= 0 && k < s.n_seeds; k++) {
    const int t = train_next_seed(&a, &cfg, &s, k, po);
    trained = t < 0 ? t : trained | t;
  }
  /* a failed run does not lose the ones that finished: their report, and exit 1 */
  session view;
  const session *shown = &s;
  if (trained < 0) {
    if (!finished_view(&s, &view)) goto out;
    shown = &view;
  }
  if (a.json) report_json(&a, &cfg, shown);
  else report_text(&cfg, shown);
  status = trained < 0 ? 1 : trained;
  if (a.plot_file && train_dist_rank(dist) == 0) {
    char title[256];
    snprintf(title, sizeof title, "hq train: %lld steps, batch %lld, %s", (long long)a.steps,
             (long long)a.batch, seeds_text(shown, seeds, sizeof seeds));
    int ps = plot(a.plot_file, shown, a.steps >= 200 ? a.steps / 100 : 1, cfg.eval_batches,
                  title);
    if (ps) status = ps;
  }
out:
  session_free(&s);
  train_dist_end(dist);
  free(default_path);
  return status;
}
