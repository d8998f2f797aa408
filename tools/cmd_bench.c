/*
** cmd_bench.c -- `hq bench`: quantize throughput of each format, both directions in one call and
** each direction alone, on the CPU (MB/s of input on one core: the CPU reference is single
** threaded) or on a CUDA device (GB/s and % of the device-to-device copy bandwidth measured in
** the same run, counting (a) the bytes the algorithm moves -- the input once per plugin call and
** once more per per-tensor amax computed inside, every output buffer once -- and (b) the minimal
** bytes -- input once, outputs once). Formats with a per-tensor amax are also timed with the
** amax computed beforehand and passed in (hq_qtensor_update_ex). The context's allocator counts
** bytes, so the peak memory beyond input and outputs (the workspace) is reported too.
** Medians over --iters samples after warm-up; a sample is --batch calls back to back between two
** timer reads, its time divided by the batch (default 10 on a GPU, as `hq bench --gemm`: the
** time per call of a trainer that keeps the GPU's queue full; --batch 1 times each call alone,
** the host's launch latency included). A benchmark, never a test.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_spec.h"
#include "bench_timer.h"
#include "cli.h"
#include "commands.h"
#include "json.h"
#include "hq/numerics.h"

static const char usage[] =
    "usage: hq bench [--device cpu|cuda[:N]] [--shape RxC] [--dtype bf16|f16|f32]\n"
    "                [--iters N] [--batch N] [--format 'PLUGIN[ key=value...]']...\n"
    "                [--all] [--recipe FILE --role M:T:N] [--plugin-dir DIR]... [--json]\n"
    "\n"
    "Time quantize (both directions in one call, rowwise alone, columnwise alone) for each\n"
    "format configuration: by default every stock configuration whose plugin is installed\n"
    "(identity, fp8_tensor, mxfp8, nvfp4 [+rht, +stochastic_rounding, +block_2d],\n"
    "fp8_block [1d, 2d], mxfp4, mxfp6); --all times every option of the stock formats that\n"
    "changes a kernel or a layout, one at a time (and nvfp4's rht with stochastic rounding,\n"
    "block_2d with swizzle); --format replaces either list. --recipe/--role times one recipe\n"
    "role's (hybrid) quantizer and reports both / (rowwise + columnwise), against the\n"
    "<= 1.1x target for a hybrid of two formats (a relative --recipe FILE that is not here\n"
    "names the shipped recipe of that name).\n"
    "Formats with a per-tensor amax are timed twice: computing it inside the call (amax own)\n"
    "and with it computed once beforehand by hq_quantizer_amax and passed in (amax given).\n"
    "ws: the peak memory the context's (counting) allocator held during the updates beyond\n"
    "the input and the quantized tensor's buffers (scratch and temporaries).\n"
    "CPU: MB/s of input on one core (default 2048x2048 bf16, 5 iterations).\n"
    "CUDA: time, GB/s and % of the copy bandwidth measured in the same run, counting (a) the\n"
    "bytes the algorithm moves (input read once per plugin call and once more per amax\n"
    "computed inside, outputs written once) and (b) the minimal bytes (input once + outputs)\n"
    "(default 8192x8192 bf16, 50 iterations).\n"
    "Medians over --iters samples; a sample is --batch calls issued back to back, its time\n"
    "divided by the batch (default 10 on a GPU: the time per call of a trainer that keeps the\n"
    "GPU's queue full; --batch 1 times each call alone, the GPU idle while the host launches\n"
    "it; 1 on the CPU). The calls alternate between two copies of the input (the same\n"
    "values), so that no call finds in the GPU's L2 cache what the call before it left there.\n"
    "Exit status 1 when a timing fails (a format refusing the shape: its rows say failed);\n"
    "a format without a path on the device is listed as skipped, a stock one whose plugin is\n"
    "not installed left out, and neither changes it.\n"
    "\n"
    "hq bench --gemm [--device cpu|cuda[:N]] ...: GEMM throughput instead (hq's paths against\n"
    "direct BLAS / cuBLASLt calls; --format and --recipe/--role as here): its own help is\n"
    "`hq bench --gemm -h`.\n"
    "mpirun -np N hq bench --dist ...: the FSDP gather's bandwidth against the raw all-gather\n"
    "of the same bytes (Open MPI, or NCCL with --device cuda): `hq bench --dist -h`.\n";

#define CMD "bench"

static const char *default_formats[] = {
    "identity dtype=bf16", "fp8_tensor", "mxfp8", "nvfp4", "nvfp4 rht=true",
    "nvfp4 stochastic_rounding=true", "nvfp4 block_2d=true", "fp8_block block=1d",
    "fp8_block block=2d", "mxfp4", "mxfp6",
};
/* --all: every option that selects another kernel, store pattern or layout, one at a time */
static const char *all_formats[] = {
    "identity dtype=bf16",
    "identity dtype=f16",
    "identity dtype=f32",
    "fp8_tensor",
    "fp8_tensor dtype=e5m2",
    "fp8_tensor power_2_scales=true",
    "fp8_tensor scaling=delayed",
    "mxfp8",
    "mxfp8 dtype=e5m2",
    "mxfp8 swizzle=true",
    "mxfp8 block_2d=true",
    "mxfp8 block_2d=true swizzle=true",
    "nvfp4",
    "nvfp4 swizzle=true",
    "nvfp4 rht=true",
    "nvfp4 stochastic_rounding=true",
    "nvfp4 rht=true stochastic_rounding=true",
    "nvfp4 block_2d=true",
    "nvfp4 block_2d=true swizzle=true",
    "fp8_block block=1d",
    "fp8_block block=1d dtype=e5m2",
    "fp8_block block=1d power_2_scales=false",
    "fp8_block block=2d",
    "fp8_block block=2d power_2_scales=false",
    "mxfp4",
    "mxfp4 scale=rceil",
    "mxfp4 stochastic_rounding=true",
    "mxfp6",
    "mxfp6 elem=e3m2",
    "mxfp6 stochastic_rounding=true",
};

/* One direction set of one configuration, timed. */
typedef struct meas {
  int ok;
  double ms;              /* median of hq_qtensor_update (the quantizer computes any amax) */
  double bytes_out;       /* the qtensor's buffers (every output written once) */
  int calls;              /* plugin calls per update: 2 for both directions of two formats */
  int amax_passes;        /* reads of the input for a per-tensor amax computed inside */
  int64_t ws;             /* peak through the ctx allocator beyond input and outputs, bytes
                             (-1: not measurable) */
  int64_t held;           /* peak through the ctx allocator beyond the input (outputs + ws) */
  int given_ok;           /* caller-supplied amax timed (some direction in use has an amax) */
  double given_ms;        /* median of hq_qtensor_update_ex with args.amax set */
  double amax_ms;         /* median of hq_quantizer_amax alone (the pass the caller saves) */
  int64_t given_ws, given_held;
} meas;

/* One of three operations on a quantizer, as a timed call. The calls alternate between two
   copies of the input (x[0], x[1]: the same values in two buffers; on the CPU the same
   buffer), so that no call finds in the GPU's L2 cache what the call before it left there
   (the stock amax pass reads the input backwards so that the cast after it in the same call
   finds the input's head there: plugins/common/amax_cuda.h); a trainer quantizes a tensor
   once. */
enum { OP_UPDATE, OP_UPDATE_AMAX, OP_AMAX };
typedef struct op_call {
  int op;
  hq_quantizer *q;
  hq_qtensor *qt;
  hq_ctx *ctx;
  const hq_tensor *const *x;
  const hq_quantize_args *args;
  float *amax;
  unsigned n; /* calls made: the next takes x[n & 1] */
} op_call;

static int op_run(void *arg) {
  op_call *c = arg;
  const hq_tensor *x = c->x[c->n++ & 1u];
  if (c->op == OP_UPDATE) return hq_qtensor_update(c->qt, c->ctx, x);
  if (c->op == OP_UPDATE_AMAX) return hq_qtensor_update_ex(c->qt, c->ctx, x, c->args);
  return hq_quantizer_amax(c->q, c->ctx, x, c->amax);
}

/* Median ms per call of the operation: `iters` samples of `batch` calls back to back (after two
   warm-up samples), each sample's time divided by the batch (bench_time_calls). */
static int median_ms(int op, hq_quantizer *q, hq_qtensor *qt, hq_ctx *ctx,
                     const hq_tensor *const *x, const hq_quantize_args *args, float *amax,
                     int iters, int batch, bench_timer *t, double *ms) {
  op_call c = {op, q, qt, ctx, x, args, amax, 0};
  const bench_timed f = {op_run, &c};
  return bench_time_calls(t, iters, 2, batch, &f, ms, NULL, NULL);
}

/* Peak bytes held beyond `base` (the input) minus the qtensor's own buffers: the workspace.
   -1 when the allocator did not even see the qtensor's buffers (it cannot be measured). */
static int64_t beyond(const bench_mem *mem, size_t base, double qbytes, int64_t *held) {
  *held = (int64_t)(bench_mem_peak(mem) - base);
  double w = (double)*held - qbytes;
  return w >= 0 ? (int64_t)w : -1;
}

/* Time quantize of `usage` directions: hq_qtensor_update as is, then (when a direction in use
   has a per-tensor amax) with the amax computed once beforehand and passed in. `amax` is 2
   floats on the context's device. */
static int time_usage(hq_quantizer *q, hq_ctx *ctx, bench_mem *mem, const hq_tensor *const *x,
                      uint32_t usage, int iters, int batch, bench_timer *t, float *amax,
                      meas *m) {
  if (hq_quantizer_set_usage(q, usage)) return -1;
  int kr = (usage & HQ_ROWWISE) && hq_quantizer_amax_kind(q, HQ_ROWWISE) != HQ_AMAX_NONE;
  int kc = (usage & HQ_COLWISE) && hq_quantizer_amax_kind(q, HQ_COLWISE) != HQ_AMAX_NONE;
  /* one plugin call per direction, but one for both of a fused quantizer; a columnwise copy made
     from the dequantized rowwise one quantizes a transient rowwise copy first */
  const int from_rowwise = usage == HQ_COLWISE &&
                           hq_quantizer_columnwise_source(q) == HQ_SOURCE_ROWWISE_DEQUANTIZED;
  int fused = (usage != HQ_BOTH || hq_quantizer_fused(q)) && !from_rowwise;
  m->calls = fused ? 1 : 2;
  m->amax_passes = fused ? (kr || kc) : kr + kc;
  size_t base = bench_mem_current(mem);
  bench_mem_reset_peak(mem);
  hq_qtensor *qt = NULL;
  if (hq_make_empty(q, ctx, x[0]->rows, x[0]->cols, x[0]->dtype, &qt)) return -1;
  m->bytes_out = (double)(hq_qtensor_bytes(qt, HQ_ROWWISE) + hq_qtensor_bytes(qt, HQ_COLWISE));
  int rc = median_ms(OP_UPDATE, q, qt, ctx, x, NULL, NULL, iters, batch, t, &m->ms);
  m->ok = !rc;
  m->ws = beyond(mem, base, m->bytes_out, &m->held);
  if (!rc && (kr || kc)) {
    hq_quantize_args args = {.struct_size = sizeof args, .amax = amax};
    rc = median_ms(OP_AMAX, q, qt, ctx, x, NULL, amax, iters, batch, t, &m->amax_ms);
    bench_mem_reset_peak(mem);
    if (!rc) rc = median_ms(OP_UPDATE_AMAX, q, qt, ctx, x, &args, NULL, iters, batch, t,
                                    &m->given_ms);
    m->given_ok = !rc;
    m->given_ws = beyond(mem, base, m->bytes_out, &m->given_held);
  }
  hq_qtensor_free(qt);
  return rc;
}

typedef struct bench_args {
  const char *device_s, *shape_s, *dtype_s, *recipe, *role_s;
  cli_list formats; /* --format's, else the stock list (`stock`) */
  int64_t iters, batch;
  int json, all, stock;
  cli_list dirs;
  int device;
  hq_dtype dtype;
  int64_t rows, cols;
} bench_args;

static int parse_args(int argc, char **argv, bench_args *a) {
  const cli_option opts[] = {
      {.name = "--device", .kind = CLI_STR, .dest = &a->device_s},
      {.name = "--shape", .kind = CLI_STR, .dest = &a->shape_s},
      {.name = "--dtype", .kind = CLI_STR, .dest = &a->dtype_s},
      {.name = "--iters", .kind = CLI_INT, .dest = &a->iters, .min = 1, .max = 100000},
      {.name = "--batch", .kind = CLI_INT, .dest = &a->batch, .min = 1, .max = 1000},
      {.name = "--format", .kind = CLI_LIST, .dest = &a->formats, .max = 64},
      {.name = "--all", .kind = CLI_FLAG, .dest = &a->all},
      {.name = "--recipe", .kind = CLI_STR, .dest = &a->recipe},
      {.name = "--role", .kind = CLI_STR, .dest = &a->role_s},
      CLI_PLUGIN_DIRS(&a->dirs),
      {.name = "--json", .kind = CLI_FLAG, .dest = &a->json},
  };
  const cli_command c = {CMD, usage, opts, CLI_NOPTS(opts), NULL, NULL};
  const int st = cli_parse(&c, argc, argv);
  if (st != CLI_RUN) return st;
  if (cli_device_arg(CMD, a->device_s, &a->device) || cli_dtype_arg(CMD, a->dtype_s, &a->dtype))
    return 2;
  if (!!a->recipe != !!a->role_s) return cli_fail(2, CMD, "--recipe and --role go together");
  static char recipe_path[CLI_PATH_MAX];
  if (a->recipe) a->recipe = cli_recipe_path(CMD, a->recipe, recipe_path);
  a->rows = a->cols = a->device >= 0 ? 8192 : 2048;
  if (a->shape_s && cli_shape_arg(CMD, "--shape", a->shape_s, &a->rows, &a->cols)) return 2;
  if (!a->iters) a->iters = a->device >= 0 ? 50 : 5;
  if (!a->batch) a->batch = a->device >= 0 ? 10 : 1;
  for (size_t i = 0; !a->recipe && i < a->formats.n; i++) {
    char text[1024];
    if (bench_recipe_text(a->formats.v[i], "b", text, sizeof text, NULL, 0))
      return cli_fail(2, CMD, "--format '%s' is not 'PLUGIN[ key=value...]'", a->formats.v[i]);
  }
  /* the stock list (a plugin that is not installed is skipped), unless --format gave one */
  a->stock = !a->formats.n && !a->recipe;
  if (a->stock) {
    const char *const *list = a->all ? all_formats : default_formats;
    const size_t n = a->all ? sizeof all_formats / sizeof all_formats[0]
                            : sizeof default_formats / sizeof default_formats[0];
    for (size_t i = 0; i < n; i++) a->formats.v[a->formats.n++] = list[i];
  }
  return CLI_RUN;
}

/* issue 7's targets: >= 85% of copy on (a), and on (b) with a caller-supplied amax */
typedef struct targets {
  int n_a, met_a, n_given, met_given;
  double worst_a, worst_given;
} targets;

/* What every configuration is timed with: the plugin set of the format configurations, the
   timer, the counting allocator, the context, the input (two copies on a device), the
   caller-supplied amax, the copy bandwidth. */
typedef struct bench_run {
  hq_plugins *set; /* every module loaded once for all configurations (not for --recipe) */
  bench_timer *timer;
  bench_mem *mem;
  hq_ctx *ctx;
  hq_tensor x, x2;
  void *host;
  float *amax; /* 2 floats on the context's device */
  size_t in_bytes;
  double copy_bw;
  targets t;
  json j;
  size_t failed; /* direction sets (or their given-amax timings) that failed: exit status 1 */
} bench_run;

/* 0, or 1 after the message. */
static int bench_setup(const bench_args *a, bench_run *b) {
  char err[256];
  if (!a->recipe && hq_plugins_open(a->dirs.v, a->dirs.n, 0, &b->set))
    return cli_fail(1, CMD, "%s", hq_last_error());
  b->timer = bench_timer_create(a->device, err, sizeof err);
  if (!b->timer) return cli_fail(1, CMD, "%s", err);
  b->mem = bench_mem_create();
  if (!b->mem) return cli_fail(1, CMD, "out of memory");
  hq_ctx_desc desc = {sizeof desc, a->device, NULL, bench_mem_allocator(b->mem), NULL, NULL, 1};
  if (hq_ctx_create(&desc, &b->ctx)) return cli_fail(1, CMD, "%s", hq_last_error());
  b->in_bytes = (size_t)(a->rows * a->cols) * hq_dtype_size(a->dtype);
  b->x = hq_tensor_2d(NULL, a->dtype, a->device, a->rows, a->cols);
  b->x2 = b->x;
  b->host = malloc(b->in_bytes);
  if (!b->host)
    return cli_fail(1, CMD, "out of memory for the %lldx%lld input", (long long)a->rows,
                    (long long)a->cols);
  uint64_t s = 88172645463325252ull;
  for (int64_t i = 0; i < a->rows * a->cols; i++) {
    double acc = 0;
    for (int k = 0; k < 4; k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      acc += (double)(s >> 11) * (1.0 / 9007199254740992.0);
    }
    hq_store_hp(b->host, i, a->dtype, (float)((acc - 2.0) * 1.7320508));
  }
  if (a->device >= 0) {
    if (hq_ctx_alloc(b->ctx, b->in_bytes, &b->x.data) ||
        hq_ctx_alloc(b->ctx, b->in_bytes, &b->x2.data) ||
        hq_ctx_memcpy(b->ctx, b->x.data, a->device, b->host, HQ_DEVICE_HOST, b->in_bytes) ||
        hq_ctx_memcpy(b->ctx, b->x2.data, a->device, b->host, HQ_DEVICE_HOST, b->in_bytes) ||
        hq_ctx_sync(b->ctx))
      return cli_fail(1, CMD, "%s", hq_last_error());
  } else {
    b->x.data = b->x2.data = b->host;
  }
  if (hq_ctx_alloc(b->ctx, 2 * sizeof(float), (void **)&b->amax))
    return cli_fail(1, CMD, "%s", hq_last_error());
  b->copy_bw = a->device >= 0 ? bench_copy_bandwidth(a->device, (size_t)1 << 30, 20) : 0;
  b->t.worst_a = b->t.worst_given = INFINITY;
  return 0;
}

static void bench_free(const bench_args *a, bench_run *b) {
  if (b->amax) hq_ctx_free(b->ctx, b->amax);
  if (a->device >= 0 && b->x.data) hq_ctx_free(b->ctx, b->x.data);
  if (a->device >= 0 && b->x2.data) hq_ctx_free(b->ctx, b->x2.data);
  free(b->host);
  hq_ctx_destroy(b->ctx);
  bench_mem_destroy(b->mem);
  bench_timer_destroy(b->timer);
  hq_plugins_close(b->set);
}

static void report_head(const bench_args *a, bench_run *b) {
  if (a->json) {
    json *j = &b->j;
    json_begin(j, stdout);
    json_obj(j);
    json_kstr(j, "device", a->device_s);
    const int64_t shape[2] = {a->rows, a->cols};
    json_kints(j, "shape", shape, 2);
    json_kstr(j, "dtype", a->dtype_s);
    json_kint(j, "iters", a->iters);
    json_kint(j, "batch", a->batch);
    json_kint(j, "input_bytes", (int64_t)b->in_bytes);
    if (a->device >= 0) json_knum(j, "copy_bandwidth_gbs", b->copy_bw * 1e-9);
    json_key(j, "results");
    json_arr(j);
    return;
  }
  char name[256] = "cpu, one core";
  int arch = 0;
  if (a->device >= 0 && hq_device_info(a->device, name, sizeof name, &arch) == HQ_OK)
    snprintf(name + strlen(name), sizeof name - strlen(name), " (sm_%d)", arch);
  printf("hq bench: %s, input %lldx%lld %s (%.1f MiB), median of %d samples of %d call%s "
         "back to back\n", name, (long long)a->rows, (long long)a->cols, a->dtype_s,
         (double)b->in_bytes / 1048576.0, (int)a->iters, (int)a->batch, a->batch > 1 ? "s" : "");
  if (a->device < 0) {
    printf("%-40s %-10s %-5s %10s %12s %8s\n", "format", "dirs", "amax", "median_ms",
           "input_MB/s", "ws_KiB");
    return;
  }
  printf("device-to-device copy (1 GiB, read+write): %.0f GB/s = the 100%% mark\n",
         b->copy_bw * 1e-9);
  printf("(a) bytes the algorithm moves: input read `reads` times (once per plugin call, once\n"
         "    more per per-tensor amax computed inside), every output buffer written once\n"
         "(b) minimal bytes: input read once + outputs.  amax: own = computed inside the call,\n"
         "    given = computed once beforehand (hq_quantizer_amax) and passed in, the trainer's\n"
         "    one-read path.  ws: peak device memory through the context's allocator during\n"
         "    the updates beyond the input and the quantized tensor's buffers\n");
  printf("%-40s %-10s %-5s %9s | %8s %5s %7s %6s | %8s %7s %6s | %8s\n", "format", "dirs",
         "amax", "median_ms", "(a) MiB", "reads", "GB/s", "%copy", "(b) MiB", "GB/s", "%copy",
         "ws KiB");
}

/* One configuration: its recipe and quantizer. */
typedef struct config {
  char label[256];
  hq_recipe *r;
  hq_state *st; /* delayed scaling: the recipe's state (the scale stays 1: no update) */
  hq_quantizer *q;
} config;

static void config_free(config *c) {
  hq_quantizer_free(c->q);
  hq_state_free(c->st);
  hq_recipe_free(c->r);
}

/* The f-th configuration (--recipe/--role, or formats.v[f]): 0 made, 1 a stock plugin that is not
   installed (skip it), -1 after the message. */
static int config_make(const bench_args *a, bench_run *b, size_t f, config *c) {
  hq_role role = hq_role_of("bench", "tensor", "x");
  char text[1024], rbuf[512];
  int rc;
  if (a->recipe) { /* its own plugin set: a shared one would refuse its plugin_dirs */
    const hq_recipe_opts ropts = cli_recipe_opts(&a->dirs);
    snprintf(c->label, sizeof c->label, "%s %s", a->recipe, a->role_s);
    rc = hq_role_parse(a->role_s, rbuf, sizeof rbuf, &role);
    if (!rc) rc = hq_recipe_load(a->recipe, &ropts, &c->r);
  } else {
    const hq_recipe_opts ropts = {.struct_size = sizeof ropts, .plugins = b->set};
    /* parse_args checked the spec */
    bench_recipe_text(a->formats.v[f], "b", text, sizeof text, c->label, sizeof c->label);
    rc = hq_recipe_parse_string(text, "bench", &ropts, &c->r);
    if (!rc && hq_recipe_error_count(c->r)) {
      const char *e = hq_recipe_error(c->r, 0);
      if (a->stock && bench_spec_missing(b->set, a->formats.v[f])) return 1;
      return cli_fail(-1, CMD, "%s: %s", c->label, e);
    }
  }
  if (rc || hq_state_create(c->r, b->ctx, &c->st) ||
      hq_quantizer_create_ex(c->r, &role, c->st, &c->q))
    return cli_fail(-1, CMD, "%s: %s", c->label, hq_last_error());
  return 0;
}

/* A format without a path on this device is listed, not timed: 1 when it was listed. */
static int config_skipped(const bench_args *a, bench_run *b, const config *c) {
  uint64_t need = a->device >= 0 ? HQ_CAP_CUDA : HQ_CAP_CPU;
  const char *missing = NULL;
  for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
    const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(c->r), hq_quantizer_plugin(c->q, d));
    if (p && !(hq_plugin_caps(p) & need)) missing = hq_plugin_name(p);
  }
  if (!missing) return 0;
  if (a->json) {
    json_obj(&b->j);
    json_kstr(&b->j, "format", c->label);
    json_kstr(&b->j, "skipped", a->device >= 0 ? "no CUDA path" : "no CPU path");
    json_close_obj(&b->j);
  } else {
    printf("%-40s (%s has no %s path: skipped)\n", c->label, missing,
           a->device >= 0 ? "CUDA" : "CPU");
  }
  return 1;
}

static const char *const usage_names[3] = {"both", "rowwise", "columnwise"};

/* The figures of one timed direction set: bytes and rates, (a) and (b), own and given amax. */
typedef struct figures {
  double bytes_a, bytes_b, bytes_ga; /* bytes_ga: (a) with a given amax, no amax pass */
  double gbs_a, gbs_b, ggbs_a, ggbs_b, mbs;
  char ws[32], gws[32]; /* KiB, or n/a */
} figures;

static figures figures_of(const meas *m, double in) {
  figures f;
  f.bytes_a = in * (m->calls + m->amax_passes) + m->bytes_out;
  f.bytes_b = in + m->bytes_out;
  f.bytes_ga = in * m->calls + m->bytes_out;
  f.gbs_a = f.bytes_a / (m->ms * 1e-3) * 1e-9;
  f.gbs_b = f.bytes_b / (m->ms * 1e-3) * 1e-9;
  f.ggbs_a = m->given_ok ? f.bytes_ga / (m->given_ms * 1e-3) * 1e-9 : NAN;
  f.ggbs_b = m->given_ok ? f.bytes_b / (m->given_ms * 1e-3) * 1e-9 : NAN;
  f.mbs = in / (m->ms * 1e-3) * 1e-6;
  snprintf(f.ws, sizeof f.ws, "n/a");
  snprintf(f.gws, sizeof f.gws, "n/a");
  if (m->ws >= 0) snprintf(f.ws, sizeof f.ws, "%.1f", (double)m->ws / 1024.0);
  if (m->given_ws >= 0) snprintf(f.gws, sizeof f.gws, "%.1f", (double)m->given_ws / 1024.0);
  return f;
}

/* GB/s in % of the copy bandwidth (NAN without one). */
static double pct(double gbs, double copy_bw) {
  return copy_bw > 0 ? 100.0 * gbs * 1e9 / copy_bw : NAN;
}

/* What a row and its "caller_amax" object both say: the input reads and bytes of (a) and (b),
   the workspace (null when it could not be measured) and the peak beyond the input. */
static void bytes_json(json *j, int reads_a, double bytes_a, double bytes_b, int64_t ws,
                       int64_t held) {
  json_kint(j, "input_reads_a", reads_a);
  json_knum(j, "bytes_a", bytes_a);
  json_knum(j, "bytes_b", bytes_b);
  if (ws >= 0) json_kint(j, "workspace_bytes", ws);
  else {
    json_key(j, "workspace_bytes");
    json_null(j);
  }
  json_kint(j, "peak_bytes_beyond_input", held);
}

/* GB/s and % of the copy bandwidth of (a) and (b). */
static void rates_json(json *j, double gbs_a, double gbs_b, double copy_bw) {
  json_knum(j, "gb_per_s_a", gbs_a);
  json_knum(j, "percent_of_copy_a", pct(gbs_a, copy_bw));
  json_knum(j, "gb_per_s_b", gbs_b);
  json_knum(j, "percent_of_copy_b", pct(gbs_b, copy_bw));
}

/* The "caller_amax" object of a row with a given amax. */
static void given_json(json *j, const bench_args *a, const bench_run *b, const meas *m,
                       const figures *f) {
  const double in = (double)b->in_bytes;
  json_key(j, "caller_amax");
  json_obj(j);
  json_knum(j, "median_ms", m->given_ms);
  json_knum(j, "amax_pass_ms", m->amax_ms);
  json_knum(j, "input_mb_per_s", in / (m->given_ms * 1e-3) * 1e-6);
  bytes_json(j, m->calls, f->bytes_ga, f->bytes_b, m->given_ws, m->given_held);
  if (a->device >= 0) rates_json(j, f->ggbs_a, f->ggbs_b, b->copy_bw);
}

/* What the "both" row adds: both / (rowwise + columnwise), when all three direction sets ran
   (with a given amax: when all three were timed with one), and whether it is a hybrid. */
typedef struct ratios {
  int all, all_given, hybrid;
  double ratio, ratio_given;
} ratios;

/* One result object: direction set u of configuration c. */
static void row_json(const bench_args *a, bench_run *b, const config *c, int u, const meas *m,
                     const figures *f, const ratios *q) {
  json *j = &b->j;
  json_obj(j);
  json_kstr(j, "format", c->label);
  json_kstr(j, "dirs", usage_names[u]);
  json_kstr(j, "amax", m->amax_passes ? "own" : "none");
  json_knum(j, "median_ms", m->ms);
  json_knum(j, "input_mb_per_s", f->mbs);
  json_knum(j, "bytes_written", m->bytes_out);
  json_kint(j, "plugin_calls", m->calls);
  bytes_json(j, m->calls + m->amax_passes, f->bytes_a, f->bytes_b, m->ws, m->held);
  if (a->device >= 0) {
    json_knum(j, "gb_per_s", f->gbs_b); /* (b), as before */
    json_knum(j, "percent_of_copy", pct(f->gbs_b, b->copy_bw));
    rates_json(j, f->gbs_a, f->gbs_b, b->copy_bw);
  }
  if (u == 0 && q->all) {
    json_knum(j, "both_over_parts", q->ratio);
    json_kbool(j, "hybrid", q->hybrid);
    if (q->hybrid) {
      json_knum(j, "hybrid_target_max", 1.1);
      json_kbool(j, "hybrid_target_met", q->ratio <= 1.1);
    }
  }
  if (m->given_ok) {
    given_json(j, a, b, m, f);
    if (u == 0 && q->all_given) json_knum(j, "both_over_parts", q->ratio_given);
    json_close_obj(j);
  }
  json_close_obj(j);
}

/* One direction set's lines of the table: own amax, then a given one when timed. */
static void row_text(const bench_args *a, const bench_run *b, const config *c, int u,
                     const meas *m, const figures *f) {
  const double copy_bw = b->copy_bw;
  if (a->device < 0) {
    printf("%-40s %-10s %-5s %10.2f %12.1f %8s\n", u ? "" : c->label, usage_names[u],
           m->amax_passes ? "own" : "-", m->ms, f->mbs, f->ws);
    if (m->given_ok)
      printf("%-40s %-10s %-5s %10.2f %12.1f %8s\n", "", usage_names[u], "given", m->given_ms,
             (double)b->in_bytes / (m->given_ms * 1e-3) * 1e-6, f->gws);
    return;
  }
  printf("%-40s %-10s %-5s %9.4f | %8.1f %5d %7.1f %5.1f%% | %8.1f %7.1f %5.1f%% | %8s\n",
         u ? "" : c->label, usage_names[u], m->amax_passes ? "own" : "-", m->ms,
         f->bytes_a / 1048576.0, m->calls + m->amax_passes, f->gbs_a, pct(f->gbs_a, copy_bw),
         f->bytes_b / 1048576.0, f->gbs_b, pct(f->gbs_b, copy_bw), f->ws);
  if (m->given_ok)
    printf("%-40s %-10s %-5s %9.4f | %8.1f %5d %7.1f %5.1f%% | %8.1f %7.1f %5.1f%% | %8s"
           "  (amax pass alone %.4f ms)\n",
           "", usage_names[u], "given", m->given_ms, f->bytes_ga / 1048576.0, m->calls, f->ggbs_a,
           pct(f->ggbs_a, copy_bw), f->bytes_b / 1048576.0, f->ggbs_b, pct(f->ggbs_b, copy_bw),
           f->gws, m->amax_ms);
}

/* Time one configuration (both directions, rowwise alone, columnwise alone) and report it. */
static void bench_config(const bench_args *a, bench_run *b, const config *c) {
  /* a hybrid: two different format instances, one plugin call per direction */
  const char *frow = hq_quantizer_format(c->q, HQ_ROWWISE);
  const char *fcol = hq_quantizer_format(c->q, HQ_COLWISE);
  const hq_tensor *const xs[2] = {&b->x, &b->x2}; /* the two copies the timed calls alternate on */
  const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
  meas res[3];
  char why[3][512];
  memset(res, 0, sizeof res);
  for (int u = 0; u < 3; u++) {
    int trc = time_usage(c->q, b->ctx, b->mem, xs, usages[u], (int)a->iters, (int)a->batch,
                         b->timer, b->amax, &res[u]);
    snprintf(why[u], sizeof why[u], "%s", hq_last_error());
    if (!res[u].ok)
      fprintf(stderr, "hq bench: %s %s: %s\n", c->label, usage_names[u], why[u]);
    else if (trc)
      fprintf(stderr, "hq bench: %s %s with a given amax: %s\n", c->label, usage_names[u],
              why[u]);
    b->failed += !res[u].ok || trc;
  }
  ratios q = {.hybrid = !hq_quantizer_fused(c->q) && frow && fcol && strcmp(frow, fcol) != 0};
  q.all = res[0].ok && res[1].ok && res[2].ok;
  q.ratio = q.all ? res[0].ms / (res[1].ms + res[2].ms) : NAN;
  q.all_given = res[0].given_ok && res[1].given_ok && res[2].given_ok;
  q.ratio_given = q.all_given ? res[0].given_ms / (res[1].given_ms + res[2].given_ms) : NAN;
  for (int u = 0; u < 3; u++) {
    const meas *m = &res[u];
    if (!m->ok) { /* in the table too: a run whose every row failed printed an empty one */
      if (a->json) {
        json_obj(&b->j);
        json_kstr(&b->j, "format", c->label);
        json_kstr(&b->j, "dirs", usage_names[u]);
        json_kstr(&b->j, "error", why[u]);
        json_close_obj(&b->j);
      } else {
        printf("%-40s %-10s failed: %s\n", u ? "" : c->label, usage_names[u], why[u]);
      }
      continue;
    }
    const figures f = figures_of(m, (double)b->in_bytes);
    if (a->device >= 0 && b->copy_bw > 0) {
      targets *t = &b->t;
      const double pa = pct(f.gbs_a, b->copy_bw), pg = pct(f.ggbs_b, b->copy_bw);
      t->n_a++, t->met_a += pa >= 85.0, t->worst_a = fmin(t->worst_a, pa);
      if (m->given_ok)
        t->n_given++, t->met_given += pg >= 85.0, t->worst_given = fmin(t->worst_given, pg);
    }
    if (a->json) row_json(a, b, c, u, m, &f, &q);
    else row_text(a, b, c, u, m, &f);
  }
  if (q.all && !a->json) {
    printf("%-40s %-10s %10.3f x (rowwise + columnwise alone)", "", "ratio", q.ratio);
    if (q.all_given) printf("; given amax %.3f x", q.ratio_given);
    if (q.hybrid)
      printf("; hybrid of %s + %s, target <= 1.1 x: %s", hq_quantizer_plugin(c->q, HQ_ROWWISE),
             hq_quantizer_plugin(c->q, HQ_COLWISE), q.ratio <= 1.1 ? "met" : "MISSED");
    else if (hq_quantizer_fused(c->q))
      printf("; one fused call");
    printf("\n");
  }
}

static void report_tail(const bench_args *a, bench_run *b) {
  const targets *t = &b->t;
  if (!a->json) {
    if (a->device >= 0 && t->n_a)
      printf("targets (>= 85%% of copy): (a) met by %d of %d rows (worst %.1f%%); (b) with a "
             "given amax met by %d of %d rows (worst %.1f%%)\n",
             t->met_a, t->n_a, t->worst_a, t->met_given, t->n_given,
             t->n_given ? t->worst_given : NAN);
    if (bench_mem_failed(b->mem))
      printf("note: the counting allocator saw a failed allocation or an unknown free: ws "
             "figures may be off\n");
    return;
  }
  json *j = &b->j;
  json_close_arr(j);
  if (a->device >= 0 && t->n_a) {
    json_key(j, "targets");
    json_obj(j);
    json_knum(j, "percent_of_copy_min", 85.0);
    json_kint(j, "rows_a", t->n_a);
    json_kint(j, "rows_a_met", t->met_a);
    json_knum(j, "worst_percent_of_copy_a", t->worst_a);
    json_kint(j, "rows_caller_amax_b", t->n_given);
    json_kint(j, "rows_caller_amax_b_met", t->met_given);
    json_knum(j, "worst_percent_of_copy_caller_amax_b", t->n_given ? t->worst_given : NAN);
    json_close_obj(j);
  }
  if (bench_mem_failed(b->mem)) json_kbool(j, "allocator_accounting_failed", 1);
  json_close_obj(j);
  json_end(j);
}

/* hq bench --gemm and --dist are other commands (tools/bench_gemm.c, tools/bench_dist.c); the
   option before any --help selects it */
static int wants(int argc, char **argv, const char *opt) {
  const size_t n = strlen(opt);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 0;
    if (!strncmp(argv[i], opt, n) && (!argv[i][n] || argv[i][n] == '=')) return 1;
  }
  return 0;
}

int hq_cmd_bench(int argc, char **argv) {
  if (wants(argc, argv, "--gemm")) return hq_bench_gemm(argc, argv);
  if (wants(argc, argv, "--dist")) return hq_bench_dist(argc, argv);
  bench_args a = {.device_s = "cpu", .dtype_s = "bf16"};
  const int st = parse_args(argc, argv, &a);
  if (st != CLI_RUN) return st;
  bench_run b;
  memset(&b, 0, sizeof b);
  int status = 1;
  if (bench_setup(&a, &b)) goto out;
  report_head(&a, &b);
  const size_t nruns = a.recipe ? 1 : a.formats.n;
  for (size_t f = 0; f < nruns; f++) {
    config c;
    memset(&c, 0, sizeof c);
    const int made = config_make(&a, &b, f, &c);
    if (made < 0) {
      config_free(&c);
      goto out;
    }
    if (made == 0 && !config_skipped(&a, &b, &c)) bench_config(&a, &b, &c);
    config_free(&c);
  }
  report_tail(&a, &b);
  status = b.failed ? cli_fail(1, CMD, "%zu timing%s failed (see above)", b.failed,
                               b.failed == 1 ? "" : "s")
                    : 0;
out:
  bench_free(&a, &b);
  return status;
}
