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
    "fp8_block [1d, 2d]); --all times every option of the stock formats that changes a\n"
    "kernel or a layout, one at a time (and nvfp4's rht with stochastic rounding, block_2d\n"
    "with swizzle); --format replaces either list. --recipe/--role times one recipe\n"
    "role's (hybrid) quantizer and reports both / (rowwise + columnwise), against the\n"
    "<= 1.1x target for a hybrid of two formats.\n"
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
    "values), so that no call finds in the GPU's L2 cache what the call before it left there.\n";

#define CMD "bench"

static const char *default_formats[] = {
    "identity dtype=bf16", "fp8_tensor", "mxfp8", "nvfp4", "nvfp4 rht=true",
    "nvfp4 stochastic_rounding=true", "nvfp4 block_2d=true", "fp8_block block=1d",
    "fp8_block block=2d",
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
  int fused = usage != HQ_BOTH || hq_quantizer_fused(q);
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
    hq_quantize_args args = {sizeof args, 0, amax};
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

/* "nvfp4 rht=true" -> a recipe with one format b used for both directions. */
static int recipe_for(const char *spec, char *out, size_t len, char *label, size_t label_len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL, *tok = strtok_r(buf, " ,", &save);
  if (!tok) return -1;
  size_t n = (size_t)snprintf(out, len, "[format b]\nplugin = %s\n", tok);
  snprintf(label, label_len, "%s", tok);
  while ((tok = strtok_r(NULL, " ,", &save)) != NULL) {
    char *eq = strchr(tok, '=');
    if (!eq) return -1;
    *eq = '\0';
    n += (size_t)snprintf(out + n, len - n, "%s = %s\n", tok, eq + 1);
    size_t l = strlen(label);
    snprintf(label + l, label_len - l, " %s=%s", tok, eq + 1);
  }
  snprintf(out + n, len - n, "[role *:*:*]\nrowwise = b\ncolumnwise = b\n");
  return 0;
}

int hq_cmd_bench(int argc, char **argv) {
  const char *device_s = "cpu", *shape_s = NULL, *dtype_s = "bf16", *recipe = NULL, *role_s = NULL;
  const char *formats[64];
  size_t nformats = 0;
  uint64_t iters_u = 0, batch_u = 0;
  int as_json = 0, all = 0;
  cli_dirs dirs = {{NULL}, 0};
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r = 0;
    if (!strcmp(argv[i], "--gemm")) return hq_bench_gemm(argc, argv);
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      as_json = 1;
      continue;
    }
    if (!strcmp(argv[i], "--all")) {
      all = 1;
      continue;
    }
    if ((r = cli_plugin_dir(argc, argv, &i, &dirs, CMD)) != 0) {
      if (r < 0) return 2;
      continue;
    }
    const char *names[] = {"--device", "--shape", "--dtype", "--iters", "--format", "--recipe",
                           "--role", "--batch"};
    size_t k = 0;
    for (; k < sizeof names / sizeof names[0]; k++)
      if ((r = cli_opt(argc, argv, &i, names[k], &v)) != 0) break;
    if (k == sizeof names / sizeof names[0])
      return cli_fail(2, CMD, "unknown argument '%s' (see `hq bench --help`)", argv[i]);
    if (r < 0) return cli_fail(2, CMD, "%s needs a value", names[k]);
    if (k == 0) device_s = v;
    else if (k == 1) shape_s = v;
    else if (k == 2) dtype_s = v;
    else if (k == 3 && (cli_u64(v, &iters_u) || iters_u < 1 || iters_u > 100000))
      return cli_fail(2, CMD, "--iters '%s' is not an integer in [1, 100000]", v);
    else if (k == 4) {
      if (nformats == 64) return cli_fail(2, CMD, "too many --format options");
      formats[nformats++] = v;
    } else if (k == 5) recipe = v;
    else if (k == 6) role_s = v;
    else if (k == 7 && (cli_u64(v, &batch_u) || batch_u < 1 || batch_u > 1000))
      return cli_fail(2, CMD, "--batch '%s' is not an integer in [1, 1000]", v);
  }
  int device;
  if (cli_device(device_s, &device))
    return cli_fail(2, CMD, "--device '%s' is not cpu, cuda or cuda:N", device_s);
  hq_dtype dtype = hq_dtype_from_name(dtype_s);
  if (dtype != HQ_F32 && dtype != HQ_BF16 && dtype != HQ_F16)
    return cli_fail(2, CMD, "--dtype '%s' is not f32, bf16 or f16", dtype_s);
  if (!!recipe != !!role_s) return cli_fail(2, CMD, "--recipe and --role go together");
  int64_t rows = device >= 0 ? 8192 : 2048, cols = rows;
  if (shape_s && cli_shape(shape_s, &rows, &cols))
    return cli_fail(2, CMD, "--shape '%s' is not RxC with positive R and C", shape_s);
  int iters = iters_u ? (int)iters_u : (device >= 0 ? 50 : 5);
  int batch = batch_u ? (int)batch_u : (device >= 0 ? 10 : 1);
  /* the stock list (a plugin that is not installed is skipped), unless --format gave one */
  const int stock = !nformats && !recipe;
  if (stock) {
    const char *const *list = all ? all_formats : default_formats;
    const size_t n = all ? sizeof all_formats / sizeof all_formats[0]
                         : sizeof default_formats / sizeof default_formats[0];
    for (size_t i = 0; i < n; i++) formats[nformats++] = list[i];
  }

  char err[256];
  bench_timer *timer = bench_timer_create(device, err, sizeof err);
  if (!timer) return cli_fail(1, CMD, "%s", err);
  bench_mem *mem = bench_mem_create();
  if (!mem) {
    bench_timer_destroy(timer);
    return cli_fail(1, CMD, "out of memory");
  }
  hq_ctx_desc desc = {sizeof desc, device, NULL, bench_mem_allocator(mem), NULL, NULL, 1};
  hq_ctx *ctx = NULL;
  if (hq_ctx_create(&desc, &ctx)) {
    bench_timer_destroy(timer);
    bench_mem_destroy(mem);
    return cli_fail(1, CMD, "%s", hq_last_error());
  }
  size_t in_bytes = (size_t)(rows * cols) * hq_dtype_size(dtype);
  hq_tensor x = hq_tensor_2d(NULL, dtype, device, rows, cols), x2 = x;
  const hq_tensor *const xs[2] = {&x, &x2}; /* the two copies the timed calls alternate on */
  void *host = malloc(in_bytes);
  float *amax = NULL; /* 2 floats on the context's device: the caller-supplied amax */
  int status = 1;
  if (!host) {
    cli_fail(1, CMD, "out of memory for the %lldx%lld input", (long long)rows, (long long)cols);
    goto out;
  }
  uint64_t s = 88172645463325252ull;
  for (int64_t i = 0; i < rows * cols; i++) {
    double acc = 0;
    for (int k = 0; k < 4; k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      acc += (double)(s >> 11) * (1.0 / 9007199254740992.0);
    }
    hq_store_hp(host, i, dtype, (float)((acc - 2.0) * 1.7320508));
  }
  if (device >= 0) {
    if (hq_ctx_alloc(ctx, in_bytes, &x.data) || hq_ctx_alloc(ctx, in_bytes, &x2.data) ||
        hq_ctx_memcpy(ctx, x.data, device, host, HQ_DEVICE_HOST, in_bytes) ||
        hq_ctx_memcpy(ctx, x2.data, device, host, HQ_DEVICE_HOST, in_bytes) || hq_ctx_sync(ctx)) {
      cli_fail(1, CMD, "%s", hq_last_error());
      goto out;
    }
  } else {
    x.data = x2.data = host;
  }
  if (hq_ctx_alloc(ctx, 2 * sizeof(float), (void **)&amax)) {
    cli_fail(1, CMD, "%s", hq_last_error());
    goto out;
  }
  double copy_bw = device >= 0 ? bench_copy_bandwidth(device, (size_t)1 << 30, 20) : 0;
  json j;
  if (as_json) {
    json_begin(&j, stdout);
    json_obj(&j);
    json_kstr(&j, "device", device_s);
    json_key(&j, "shape");
    json_arr(&j);
    json_int(&j, rows);
    json_int(&j, cols);
    json_close_arr(&j);
    json_kstr(&j, "dtype", dtype_s);
    json_kint(&j, "iters", iters);
    json_kint(&j, "batch", batch);
    json_kint(&j, "input_bytes", (int64_t)in_bytes);
    if (device >= 0) json_knum(&j, "copy_bandwidth_gbs", copy_bw * 1e-9);
    json_key(&j, "results");
    json_arr(&j);
  } else {
    char name[256] = "cpu, one core";
    int arch = 0;
    if (device >= 0 && hq_device_info(device, name, sizeof name, &arch) == HQ_OK)
      snprintf(name + strlen(name), sizeof name - strlen(name), " (sm_%d)", arch);
    printf("hq bench: %s, input %lldx%lld %s (%.1f MiB), median of %d samples of %d call%s "
           "back to back\n", name, (long long)rows, (long long)cols, dtype_s,
           (double)in_bytes / 1048576.0, iters, batch, batch > 1 ? "s" : "");
    if (device >= 0) {
      printf("device-to-device copy (1 GiB, read+write): %.0f GB/s = the 100%% mark\n",
             copy_bw * 1e-9);
      printf("(a) bytes the algorithm moves: input read `reads` times (once per plugin call, once\n"
             "    more per per-tensor amax computed inside), every output buffer written once\n"
             "(b) minimal bytes: input read once + outputs.  amax: own = computed inside the call,\n"
             "    given = computed once beforehand (hq_quantizer_amax) and passed in, the trainer's\n"
             "    one-read path.  ws: peak device memory through the context's allocator during\n"
             "    the updates beyond the input and the quantized tensor's buffers\n");
      printf("%-40s %-10s %-5s %9s | %8s %5s %7s %6s | %8s %7s %6s | %8s\n", "format", "dirs",
             "amax", "median_ms", "(a) MiB", "reads", "GB/s", "%copy", "(b) MiB", "GB/s",
             "%copy", "ws KiB");
    } else {
      printf("%-40s %-10s %-5s %10s %12s %8s\n", "format", "dirs", "amax", "median_ms",
             "input_MB/s", "ws_KiB");
    }
  }
  /* issue 7's targets: >= 85% of copy on (a), and on (b) with a caller-supplied amax */
  int n_a = 0, met_a = 0, n_given = 0, met_given = 0;
  double worst_a = INFINITY, worst_given = INFINITY;
  size_t nruns = recipe ? 1 : nformats;
  hq_recipe_opts ropts = {sizeof ropts, 0, dirs.v, dirs.n};
  for (size_t f = 0; f < nruns; f++) {
    char text[1024], label[256];
    hq_recipe *r = NULL;
    hq_role role = {"bench", "tensor", "x"};
    char rbuf[512];
    int rc;
    if (recipe) {
      snprintf(label, sizeof label, "%s %s", recipe, role_s);
      rc = hq_role_parse(role_s, rbuf, sizeof rbuf, &role);
      if (!rc) rc = hq_recipe_load(recipe, &ropts, &r);
    } else {
      if (recipe_for(formats[f], text, sizeof text, label, sizeof label)) {
        cli_fail(2, CMD, "--format '%s' is not 'PLUGIN[ key=value...]'", formats[f]);
        goto out;
      }
      rc = hq_recipe_parse_string(text, "bench", &ropts, &r);
      if (!rc && hq_recipe_error_count(r)) {
        const char *e = hq_recipe_error(r, 0);
        if (strstr(e, "was not found") && stock) {
          hq_recipe_free(r); /* a stock plugin that is not installed: skip it */
          continue;
        }
        cli_fail(1, CMD, "%s: %s", label, e);
        hq_recipe_free(r);
        goto out;
      }
    }
    hq_quantizer *q = NULL;
    hq_state *st = NULL; /* delayed scaling: the recipe's state (the scale stays 1: no update) */
    if (rc || hq_state_create(r, ctx, &st) || hq_quantizer_create_ex(r, &role, st, &q)) {
      cli_fail(1, CMD, "%s: %s", label, hq_last_error());
      hq_state_free(st);
      hq_recipe_free(r);
      goto out;
    }
    /* a format without a path on this device is listed, not timed */
    uint64_t need = device >= 0 ? HQ_CAP_CUDA : HQ_CAP_CPU;
    const char *missing = NULL;
    for (uint32_t d = HQ_ROWWISE; d <= HQ_COLWISE; d++) {
      const hq_plugin *p = hq_plugins_find(hq_recipe_plugins(r), hq_quantizer_plugin(q, d));
      if (p && !(hq_plugin_caps(p) & need)) missing = hq_plugin_name(p);
    }
    if (missing) {
      if (as_json) {
        json_obj(&j);
        json_kstr(&j, "format", label);
        json_kstr(&j, "skipped", device >= 0 ? "no CUDA path" : "no CPU path");
        json_close_obj(&j);
      } else {
        printf("%-40s (%s has no %s path: skipped)\n", label, missing,
               device >= 0 ? "CUDA" : "CPU");
      }
      hq_quantizer_free(q);
      hq_state_free(st);
      hq_recipe_free(r);
      continue;
    }
    /* a hybrid: two different format instances, one plugin call per direction */
    const char *frow = hq_quantizer_format(q, HQ_ROWWISE), *fcol = hq_quantizer_format(q, HQ_COLWISE);
    int hybrid = !hq_quantizer_fused(q) && frow && fcol && strcmp(frow, fcol) != 0;
    meas res[3];
    memset(res, 0, sizeof res);
    const uint32_t usages[3] = {HQ_BOTH, HQ_ROWWISE, HQ_COLWISE};
    const char *unames[3] = {"both", "rowwise", "columnwise"};
    for (int u = 0; u < 3; u++) {
      int trc = time_usage(q, ctx, mem, xs, usages[u], iters, batch, timer, amax, &res[u]);
      if (!res[u].ok)
        fprintf(stderr, "hq bench: %s %s: %s\n", label, unames[u], hq_last_error());
      else if (trc)
        fprintf(stderr, "hq bench: %s %s with a given amax: %s\n", label, unames[u],
                hq_last_error());
    }
    int all = res[0].ok && res[1].ok && res[2].ok;
    double ratio = all ? res[0].ms / (res[1].ms + res[2].ms) : NAN;
    int all_given = res[0].given_ok && res[1].given_ok && res[2].given_ok;
    double ratio_given = all_given ? res[0].given_ms / (res[1].given_ms + res[2].given_ms) : NAN;
    for (int u = 0; u < 3; u++) {
      const meas *m = &res[u];
      if (!m->ok) continue;
      double in = (double)in_bytes;
      double bytes_a = in * (m->calls + m->amax_passes) + m->bytes_out;
      double bytes_b = in + m->bytes_out;
      double bytes_ga = in * m->calls + m->bytes_out; /* a given amax: no amax pass */
      double gbs_a = bytes_a / (m->ms * 1e-3) * 1e-9, gbs_b = bytes_b / (m->ms * 1e-3) * 1e-9;
      double ggbs_a = m->given_ok ? bytes_ga / (m->given_ms * 1e-3) * 1e-9 : NAN;
      double ggbs_b = m->given_ok ? bytes_b / (m->given_ms * 1e-3) * 1e-9 : NAN;
#define PCT(g) (copy_bw > 0 ? 100.0 * (g) * 1e9 / copy_bw : NAN)
      double mbs = in / (m->ms * 1e-3) * 1e-6;
      if (device >= 0 && copy_bw > 0) {
        n_a++, met_a += PCT(gbs_a) >= 85.0, worst_a = fmin(worst_a, PCT(gbs_a));
        if (m->given_ok)
          n_given++, met_given += PCT(ggbs_b) >= 85.0, worst_given = fmin(worst_given, PCT(ggbs_b));
      }
      char ws[32] = "n/a", gws[32] = "n/a"; /* KiB */
      if (m->ws >= 0) snprintf(ws, sizeof ws, "%.1f", (double)m->ws / 1024.0);
      if (m->given_ws >= 0) snprintf(gws, sizeof gws, "%.1f", (double)m->given_ws / 1024.0);
      if (as_json) {
        json_obj(&j);
        json_kstr(&j, "format", label);
        json_kstr(&j, "dirs", unames[u]);
        json_kstr(&j, "amax", m->amax_passes ? "own" : "none");
        json_knum(&j, "median_ms", m->ms);
        json_knum(&j, "input_mb_per_s", mbs);
        json_knum(&j, "bytes_written", m->bytes_out);
        json_kint(&j, "plugin_calls", m->calls);
        json_kint(&j, "input_reads_a", m->calls + m->amax_passes);
        json_knum(&j, "bytes_a", bytes_a);
        json_knum(&j, "bytes_b", bytes_b);
        if (m->ws >= 0) json_kint(&j, "workspace_bytes", m->ws);
        else { json_key(&j, "workspace_bytes"); json_null(&j); }
        json_kint(&j, "peak_bytes_beyond_input", m->held);
        if (device >= 0) {
          json_knum(&j, "gb_per_s", gbs_b); /* (b), as before */
          json_knum(&j, "percent_of_copy", PCT(gbs_b));
          json_knum(&j, "gb_per_s_a", gbs_a);
          json_knum(&j, "percent_of_copy_a", PCT(gbs_a));
          json_knum(&j, "gb_per_s_b", gbs_b);
          json_knum(&j, "percent_of_copy_b", PCT(gbs_b));
        }
        if (u == 0 && all) {
          json_knum(&j, "both_over_parts", ratio);
          json_kbool(&j, "hybrid", hybrid);
          if (hybrid) {
            json_knum(&j, "hybrid_target_max", 1.1);
            json_kbool(&j, "hybrid_target_met", ratio <= 1.1);
          }
        }
        if (m->given_ok) {
          json_key(&j, "caller_amax");
          json_obj(&j);
          json_knum(&j, "median_ms", m->given_ms);
          json_knum(&j, "amax_pass_ms", m->amax_ms);
          json_knum(&j, "input_mb_per_s", in / (m->given_ms * 1e-3) * 1e-6);
          json_kint(&j, "input_reads_a", m->calls);
          json_knum(&j, "bytes_a", bytes_ga);
          json_knum(&j, "bytes_b", bytes_b);
          if (m->given_ws >= 0) json_kint(&j, "workspace_bytes", m->given_ws);
          else { json_key(&j, "workspace_bytes"); json_null(&j); }
          json_kint(&j, "peak_bytes_beyond_input", m->given_held);
          if (device >= 0) {
            json_knum(&j, "gb_per_s_a", ggbs_a);
            json_knum(&j, "percent_of_copy_a", PCT(ggbs_a));
            json_knum(&j, "gb_per_s_b", ggbs_b);
            json_knum(&j, "percent_of_copy_b", PCT(ggbs_b));
          }
          if (u == 0 && all_given) json_knum(&j, "both_over_parts", ratio_given);
          json_close_obj(&j);
        }
        json_close_obj(&j);
      } else if (device >= 0) {
        printf("%-40s %-10s %-5s %9.4f | %8.1f %5d %7.1f %5.1f%% | %8.1f %7.1f %5.1f%% | %8s\n",
               u ? "" : label, unames[u], m->amax_passes ? "own" : "-", m->ms,
               bytes_a / 1048576.0, m->calls + m->amax_passes, gbs_a, PCT(gbs_a),
               bytes_b / 1048576.0, gbs_b, PCT(gbs_b), ws);
        if (m->given_ok)
          printf("%-40s %-10s %-5s %9.4f | %8.1f %5d %7.1f %5.1f%% | %8.1f %7.1f %5.1f%% | %8s"
                 "  (amax pass alone %.4f ms)\n",
                 "", unames[u], "given", m->given_ms, bytes_ga / 1048576.0, m->calls, ggbs_a,
                 PCT(ggbs_a), bytes_b / 1048576.0, ggbs_b, PCT(ggbs_b), gws, m->amax_ms);
      } else {
        printf("%-40s %-10s %-5s %10.2f %12.1f %8s\n", u ? "" : label, unames[u],
               m->amax_passes ? "own" : "-", m->ms, mbs, ws);
        if (m->given_ok)
          printf("%-40s %-10s %-5s %10.2f %12.1f %8s\n", "", unames[u], "given", m->given_ms,
                 in / (m->given_ms * 1e-3) * 1e-6, gws);
      }
#undef PCT
    }
    if (all && !as_json) {
      printf("%-40s %-10s %10.3f x (rowwise + columnwise alone)", "", "ratio", ratio);
      if (all_given) printf("; given amax %.3f x", ratio_given);
      if (hybrid)
        printf("; hybrid of %s + %s, target <= 1.1 x: %s", hq_quantizer_plugin(q, HQ_ROWWISE),
               hq_quantizer_plugin(q, HQ_COLWISE),
               ratio <= 1.1 ? "met" : "MISSED");
      else if (hq_quantizer_fused(q))
        printf("; one fused call");
      printf("\n");
    }
    hq_quantizer_free(q);
    hq_state_free(st);
    hq_recipe_free(r);
  }
  if (as_json) {
    json_close_arr(&j);
    if (device >= 0 && n_a) {
      json_key(&j, "targets");
      json_obj(&j);
      json_knum(&j, "percent_of_copy_min", 85.0);
      json_kint(&j, "rows_a", n_a);
      json_kint(&j, "rows_a_met", met_a);
      json_knum(&j, "worst_percent_of_copy_a", worst_a);
      json_kint(&j, "rows_caller_amax_b", n_given);
      json_kint(&j, "rows_caller_amax_b_met", met_given);
      json_knum(&j, "worst_percent_of_copy_caller_amax_b", n_given ? worst_given : NAN);
      json_close_obj(&j);
    }
    if (bench_mem_failed(mem)) json_kbool(&j, "allocator_accounting_failed", 1);
    json_close_obj(&j);
    json_end(&j);
  } else {
    if (device >= 0 && n_a)
      printf("targets (>= 85%% of copy): (a) met by %d of %d rows (worst %.1f%%); (b) with a "
             "given amax met by %d of %d rows (worst %.1f%%)\n",
             met_a, n_a, worst_a, met_given, n_given, n_given ? worst_given : NAN);
  }
  if (!as_json && bench_mem_failed(mem)) {
    printf("note: the counting allocator saw a failed allocation or an unknown free: ws figures "
           "may be off\n");
  }
  status = 0;
out:
  if (amax) hq_ctx_free(ctx, amax);
  if (device >= 0 && x.data) hq_ctx_free(ctx, x.data);
  if (device >= 0 && x2.data) hq_ctx_free(ctx, x2.data);
  free(host);
  hq_ctx_destroy(ctx);
  bench_mem_destroy(mem);
  bench_timer_destroy(timer);
  return status;
}
